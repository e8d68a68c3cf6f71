# test/t/304_apache_isr_unmet.pl: failure drill on a real Apache Kafka
# cluster.  Under load, two of the three brokers go down (kill -9): with
# min.insync.replicas = 2 no write can be acknowledged (and the KRaft
# controller quorum is lost too).  The relay sees transient errors only
# (or holds the partitions that stopped answering), keeps the backlog
# (nothing quarantined), health() degrades; once the brokers are back
# everything arrives, in order.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep time);

use FindBin;
use lib "$FindBin::RealBin/../perl";
use OutboxTest;
use OutboxDrill;
use OutboxKafka;

my $kafka = OutboxKafka::Cluster->start(brokers => 3);
my $node = outbox_node(
	'apache304', $kafka,
	conf => q{
outbox.delivery_timeout = '3s'
outbox.retry_backoff_min = '100ms'
outbox.retry_backoff_max = '1s'
});
drill_setup($node, 'postgres');
ok(defined wait_for_relay($node, 'postgres', 30), 'the relay runs');

my $load = OutboxDrill::Load->start($node, 'postgres', seconds => 40, rate => 50);
usleep(4_000_000);
my $before = committed_ids($node, 'postgres');
$kafka->wait_for_events($DRILL_TOPIC, [ keys %$before ], 60);

$kafka->kill(2);
$kafka->kill(3);
my $t_down = time();
my (%health, $st);
while (time() < $t_down + 15)
{
	$st = relay_status($node, 'postgres');
	my $h = $node->safe_psql('postgres',
		"SELECT status || ' ' || coalesce(reason, '') FROM outbox.health(max_age => '10 s')");
	$health{$h}++;
	usleep(500_000);
}
note 'health seen: ' . join('; ', map { "$_ x$health{$_}" } sort keys %health);
ok((grep { /^(warning|critical)/ } keys %health), 'health() degrades while the ISR is unmet');
# the survivor answered just before, so the partitions that stop
# answering may be held (outbox.held) rather than resent after
# outbox.delivery_timeout: either way the outage is counted or shown
my $held = $node->safe_psql('postgres', 'SELECT count(*) FROM outbox.holds()');
ok($st->{transient_failures} > 0 || $held > 0,
	"the outage shows: transient failures ($st->{transient_failures}) or held partitions ($held)");
is($st->{permanent_failures}, 0, 'no permanent failure');
is($st->{quarantined}, 0, 'nothing quarantined');
cmp_ok($st->{backlog}, '>', 0, "the backlog is held ($st->{backlog} events)");
note 'last error: ' . ($st->{last_error} // 'none');

$kafka->start_broker(2);
$kafka->start_broker(3);
my $t_up = time();
my $at_up = committed_ids($node, 'postgres');
$kafka->wait_for_events($DRILL_TOPIC, [ keys %$at_up ], 120);
diag(sprintf('two brokers down %.0f s: backlog delivered %.1f s after they were started again',
	$t_up - $t_down, time() - $t_up));
ok(poll_until($node, 'postgres',
	"SELECT status FROM outbox.health(max_age => '10 s')", 'ok', 60),
	'health() is ok again');

$load->finish;
my $all = committed_ids($node, 'postgres');
$kafka->wait_for_events($DRILL_TOPIC, [ keys %$all ], 90);
my $msgs = $kafka->read_java($DRILL_TOPIC);
$_->{topic} = $DRILL_TOPIC foreach @$msgs;
my $fig = drill_figures($msgs, $all);
report_figures('min.insync.replicas unmet', $fig);
is(scalar(@{ $fig->{missing} }), 0, 'no loss');
is(scalar(@{ $fig->{strangers} }), 0, 'no phantom');
is($fig->{order_violations}, 0, 'each aggregate in order');
is($fig->{gaps}, 0, 'without gaps');
cmp_ok($fig->{duplicates}, '<=', 5000, "duplicates at most a page ($fig->{duplicates})");

$node->stop;
$kafka->down;
done_testing();
