# test/t/101_broker_outage.pl: failure drill.  The whole Kafka cluster goes
# down for 20 seconds under steady load, then comes back.  Nothing
# committed is lost, every aggregate stays in order, the relay backs off
# and says so in a few rate-limited log lines with failure counts, no
# process crashes, and the backlog drains (its rate is measured).

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep time);

# found without -I: PGXS resets PROVE_FLAGS after the Makefile sets it
use FindBin;
use lib "$FindBin::RealBin/../perl";
use OutboxTest;
use OutboxDrill;

my $outage = 20;    # seconds

# outbox.delivery_timeout: the relay withdraws an unacknowledged round
# after 3 s, so it sees the outage (delivery failures) and backs off.
my $kafka = OutboxTest::Broker->start(brokers => 3);
my $node = outbox_node(
	'outage', $kafka,
	conf => q{
outbox.delivery_timeout = '3s'
outbox.retry_backoff_min = '100ms'
outbox.retry_backoff_max = '2s'
});
drill_setup($node, 'postgres');
my ($pid) = wait_for_relay($node, 'postgres', 10);
ok(defined $pid, 'the relay runs');
my $started = $node->safe_psql('postgres', 'SELECT pg_postmaster_start_time()');
my $log_start = -s $node->logfile;

my $load = OutboxDrill::Load->start($node, 'postgres', seconds => 40, rate => 100);

# normal flow first
usleep(4_000_000);
my $before = committed_ids($node, 'postgres');
wait_for_events($kafka, $DRILL_TOPIC, [ keys %$before ], 30);
my $seen_before = event_ids_of(read_topic($kafka, $DRILL_TOPIC) // []);
cmp_ok(scalar(keys %$before), '>', 100, 'the load commits events ('
	  . scalar(keys %$before) . ' before the outage) and they are published');

# --- the outage
my $log_down = -s $node->logfile;
$kafka->command('down all');
my $t_down = time();
my (%states, $status);
while (time() < $t_down + $outage)
{
	$status = relay_status($node, 'postgres');
	$states{ $status->{state} }++;
	usleep(500_000);
}
note 'relay states seen during the outage: '
  . join(', ', map { "$_ x$states{$_}" } sort keys %states);
ok($states{'backing off'}, 'during the outage the relay reports that it is backing off');
cmp_ok($status->{transient_failures}, '>', 0,
	"status counts transient failures ($status->{transient_failures})");
like($status->{last_error} // '', qr/could not publish|Kafka client error|waiting for Kafka|did not acknowledge/,
	'status shows the last error: ' . ($status->{last_error} // 'none'));
is($status->{quarantined}, 0, 'a broker outage quarantines nothing');

# --- recovery.  The backlog: what committed by "up" and was not in Kafka
# at the last read before "down" (what was delivered during that read
# counts too: the drain rate is over-estimated by a percent or two).
$kafka->command('up all');
my $t_up = time();
my $at_up = committed_ids($node, 'postgres');
my $backlog = grep { !$seen_before->{$_} } keys %$at_up;
my $t_drained;
while (time() < $t_up + 60)
{
	my $seen = event_ids_of(read_topic($kafka, $DRILL_TOPIC) // []);
	if (!grep { !$seen->{$_} } keys %$at_up)
	{
		$t_drained = time();
		last;
	}
	usleep(200_000);
}
ok(defined $t_drained, 'the backlog of the outage drains after the brokers are back');
my $drain = defined $t_drained ? $t_drained - $t_up : -1;
my $rate = $drain > 0 ? $backlog / $drain : 0;
diag(sprintf(
		'broker outage: %d s down; backlog at "up" %d events, delivered %.1f s later: %.0f events/s during recovery',
		$outage, $backlog, $drain, $rate));

# --- a second, short outage (6 s) with the default outbox.delivery_timeout
# (30 s): no delivery report comes back meanwhile, yet the operator must see
# the outage while it lasts.
ok( set_and_reload(
		$node, 'postgres', 'outbox.delivery_timeout', '30s',
		qr/parameter "outbox.delivery_timeout" changed/),
	'the delivery timeout goes back to the default (reload)');
usleep(1_000_000);
$kafka->command('down all');
my $t_down2 = time();
my $down2_at = $node->safe_psql('postgres', 'SELECT clock_timestamp()');
my ($seen_error, $min_up) = (0, undef);
while (time() < $t_down2 + 6)
{
	my $s = relay_status($node, 'postgres');
	$seen_error ||= $node->safe_psql('postgres',
		"SELECT coalesce(last_error_at > '$down2_at', false) FROM outbox.status()") eq 't';
	$min_up = $s->{brokers_up}
	  if defined $s->{brokers_up} && (!defined $min_up || $s->{brokers_up} < $min_up);
	usleep(500_000);
}
$kafka->command('up all');
ok($seen_error,
	'during an outage that librdkafka retries by itself, status() shows fresh errors');
note 'fewest brokers up seen during it: ' . ($min_up // 'unknown');

$load->finish;
my $all = committed_ids($node, 'postgres');
my $msgs = wait_for_events($kafka, $DRILL_TOPIC, [ keys %$all ], 60);
my $fig = drill_figures($msgs, $all);
report_figures('broker outage', $fig,
	sprintf('drain %.0f events/s', $rate));

is(scalar(@{ $fig->{missing} }), 0, 'zero loss: every committed event is in Kafka');
is(scalar(@{ $fig->{strangers} }), 0, 'Kafka holds no event that was not committed');
is($fig->{order_violations}, 0,
	'per-aggregate order: a consumer dropping duplicates sees each aggregate\'s seq increase');
is($fig->{gaps}, 0, 'and without gaps');
is($fig->{split}, 0, 'each aggregate stays in one partition');

# --- the log: rate-limited lines with failure counts
my $log = slurp_file($node->logfile, $log_down);
my @reports;
while ($log =~ /^(\S+ \S+) .*LOG:  outbox relay: (could not publish events, retrying|Kafka client error)\n.*DETAIL:  .*\((\d+) failures since the last report\)/mg)
{
	push @reports, [ $1, $2, $3 ];
}
note "log: $_->[0] $_->[1] ($_->[2])" foreach @reports;
cmp_ok(scalar(@reports), '>=', 2, 'the outage is reported in the log more than once');
cmp_ok(scalar(@reports), '<=', $outage / 10 + 4,
	'but at a rate limit (' . scalar(@reports) . ' lines)');
ok((grep { $_->[1] =~ /could not publish/ } @reports),
	'a line says the relay could not publish and retries');
ok((grep { $_->[2] > 1 } @reports),
	'a line counts several failures since the previous one');

# --- no crash
is(relay_pid($node, 'postgres'), $pid, 'the same relay process runs throughout');
is($node->safe_psql('postgres', 'SELECT pg_postmaster_start_time()'),
	$started, 'the server did not restart');
is(server_crashed_since($node, $log_start), '', 'no process crashed');

$node->stop;
done_testing();
