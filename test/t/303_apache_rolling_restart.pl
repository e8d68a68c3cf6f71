# test/t/303_apache_rolling_restart.pl: failure drill on a real Apache
# Kafka cluster.  Under steady load, each of the three brokers in turn is
# stopped gracefully (its leaderships move first) and started again, the
# next one only once the restarted broker is back in every partition's ISR,
# as an operator's rolling upgrade does.  Nothing committed is lost,
# nothing out of order, duplicates at most a page; the restart's length and
# the longest wait of an event are printed.

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
	'apache303', $kafka,
	conf => q{
outbox.delivery_timeout = '10s'
outbox.retry_backoff_min = '100ms'
outbox.retry_backoff_max = '1s'
});
drill_setup($node, 'postgres');
ok(defined wait_for_relay($node, 'postgres', 30), 'the relay runs');

my $load = OutboxDrill::Load->start($node, 'postgres', seconds => 45, rate => 100);
usleep(4_000_000);
my $t0 = time();
foreach my $i (1 .. 3)
{
	my $t = time();
	$kafka->stop_broker($i);
	$kafka->start_broker($i);
	my $back;
	while (!$back && time() < $t + 90)
	{
		my $l = $kafka->leaders($DRILL_TOPIC);
		$back = !grep { @{ $l->{$_}{isr} } < 3 } keys %$l;
		usleep(500_000) unless $back;
	}
	ok($back, sprintf('broker %d restarted and back in every ISR after %.1f s', $i, time() - $t));
}
my $rolling = time() - $t0;
my $st = relay_status($node, 'postgres');
is($st->{quarantined}, 0, 'a rolling restart quarantines nothing');

$load->finish;
my $all = committed_ids($node, 'postgres');
$kafka->wait_for_events($DRILL_TOPIC, [ keys %$all ], 90);
my $msgs = $kafka->read_java($DRILL_TOPIC);
$_->{topic} = $DRILL_TOPIC foreach @$msgs;
my $fig = drill_figures($msgs, $all);
report_figures('rolling restart', $fig, sprintf('restart of 3 brokers took %.1f s', $rolling));
is(scalar(@{ $fig->{missing} }), 0, 'no loss');
is(scalar(@{ $fig->{strangers} }), 0, 'no phantom');
is($fig->{order_violations}, 0, 'each aggregate in order');
is($fig->{gaps}, 0, 'without gaps');
is($fig->{split}, 0, 'each aggregate in one partition');
cmp_ok($fig->{duplicates}, '<=', 5000, "duplicates at most a page ($fig->{duplicates})");

$node->stop;
$kafka->down;
done_testing();
