# test/drills/312_apache_exactly_once.pl: outbox.delivery = exactly_once on a
# real Apache Kafka cluster, under load, read back by the Java client with
# isolation.level=read_committed.  Faults: kill -9 of the relay five times
# mid-drain, a postmaster crash, kill -9 of a partition leader, a rolling
# restart of the brokers.  After each: nothing lost, nothing twice, each
# aggregate in seq order, no phantom.  The aborted transactions' copies
# that a read_uncommitted reader sees are counted.  A control run of the
# kills under at_least_once shows the duplicates this mode removes.  The
# promoted standby that fences its old primary is t/313.  A drill of about
# five minutes: run on demand (docs/development.md), not in CI.

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
use OutboxFailover;

my $batch_size = 500;
my $backlog = 5000;
my $kafka = OutboxKafka::Cluster->start(brokers => 3);
my $node = outbox_node(
	'apache312', $kafka,
	conf => qq{
outbox.delivery = exactly_once
outbox.batch_size = $batch_size
outbox.transaction_events = $batch_size
outbox.delivery_timeout = '10s'
outbox.retry_backoff_min = '100ms'
outbox.retry_backoff_max = '1s'
restart_after_crash = on
});
drill_setup($node, 'postgres');
ok(defined wait_for_relay($node, 'postgres', 30), 'the relay runs');

sub published
{
	return $node->safe_psql('postgres', 'SELECT published FROM outbox.relay_progress');
}

# a backlog on top of the load, recorded as the load's events are
sub add_backlog
{
	$node->safe_psql('postgres',
		"INSERT INTO drill_committed (event_id, aggregate_id)"
		  . " SELECT outbox.emit('drill', 'b-' || (i % 50), 'drill.ticked', jsonb_build_object('i', i)),"
		  . " 'b-' || (i % 50) FROM generate_series(1, $backlog) i");
	return;
}

# kill -9 of the relay once a page of the backlog is recorded; the server
# restarts; returns how much of the backlog was recorded at the kill
sub kill_relay_mid_drain
{
	poll_until($node, 'postgres', 'SELECT backlog < 1000 FROM outbox.status()', 't', 120);
	my $before = published();
	add_backlog();
	return kill_relay_when($node, 'postgres', sub { published() - $before },
		$batch_size, 10, 60);
}

# what a read_committed consumer sees of every committed event
sub check
{
	my ($what) = @_;
	poll_until($node, 'postgres', 'SELECT backlog FROM outbox.status()', '0', 180);
	my $all = committed_ids($node, 'postgres');
	$kafka->wait_for_events($DRILL_TOPIC, [ keys %$all ], 120, isolation => 'read_committed');
	my $msgs = $kafka->read_java($DRILL_TOPIC, isolation => 'read_committed') // [];
	$_->{topic} = $DRILL_TOPIC foreach @$msgs;
	my $fig = drill_figures($msgs, $all);
	# the load goes on: a phantom is in Kafka and not committed, as read after
	my $after = committed_ids($node, 'postgres');
	$fig->{strangers} = [ grep { !exists $after->{$_} } @{ $fig->{strangers} } ];
	my $raw = $kafka->read_java($DRILL_TOPIC) // [];
	$_->{topic} = $DRILL_TOPIC foreach @$raw;
	my $aborted = drill_figures($raw, $all)->{duplicates} - $fig->{duplicates};
	report_figures("exactly_once, $what, read_committed", $fig,
		"$aborted copies of aborted transactions in the log");
	explain_missing($node, 'postgres', $fig->{missing});
	if (@{ $fig->{strangers} })
	{
		my @some = @{ $fig->{strangers} }[ 0 .. 2 ];
		diag("strangers, e.g. @some: in outbox.events as "
			  . $node->safe_psql('postgres',
				"SELECT string_agg(e.id || ' ' || e.aggregate_id || ' ' || e.txid, '; ') FROM outbox.events e"
				  . " WHERE e.event_id IN ('" . join("','", grep { defined } @some) . "')"));
	}
	is(scalar(@{ $fig->{missing} }), 0, "$what: nothing lost");
	is($fig->{duplicates}, 0, "$what: nothing twice");
	is($fig->{order_violations}, 0, "$what: each aggregate in seq order");
	is(scalar(@{ $fig->{strangers} }), 0, "$what: no phantom");
	return $fig;
}

my $load = OutboxDrill::Load->start($node, 'postgres', seconds => 150, rate => 100);

my @drained = map { kill_relay_mid_drain() } 1 .. 5;
cmp_ok(scalar(grep { $_ < $backlog } @drained), '==', 5,
	'each kill -9 came mid-drain (' . join(', ', @drained) . " of $backlog recorded)");
check('five kill -9 of the relay mid-drain');

# a postmaster crash: every process killed at once, then a start
add_backlog();
usleep(300_000);
kill_all_processes($node);
$node->start;
wait_for_relay($node, 'postgres', 60);
check('a postmaster crash mid-drain');

# kill -9 of the leader of the busiest partition, started again
add_backlog();
my $leaders = $kafka->leaders($DRILL_TOPIC);
my ($victim) = map { $leaders->{$_}{leader} } sort keys %$leaders;
$kafka->kill($victim);
usleep(5_000_000);
$kafka->start_broker($victim);
check("kill -9 of broker $victim, a partition leader");

# a rolling restart of the brokers
add_backlog();
foreach my $i (1 .. 3)
{
	$kafka->stop_broker($i);
	$kafka->start_broker($i);
}
check('a rolling restart of the brokers');
$load->finish;

# the control: the same kills under at_least_once leave duplicates
set_and_reload($node, 'postgres', 'outbox.delivery', 'at_least_once',
	qr/Kafka settings changed, rebuilding the producer/);
my $dups = 0;
foreach my $i (1 .. 5)
{
	kill_relay_mid_drain();
	poll_until($node, 'postgres', 'SELECT backlog FROM outbox.status()', '0', 180);
	my $all = committed_ids($node, 'postgres');
	my $msgs = $kafka->wait_for_events($DRILL_TOPIC, [ keys %$all ], 120,
		isolation => 'read_committed');
	$_->{topic} = $DRILL_TOPIC foreach @$msgs;
	$dups = drill_figures($msgs, $all)->{duplicates};
	last if $dups > 0;
}
cmp_ok($dups, '>', 0,
	"the control under at_least_once: kill -9 mid-drain leaves duplicates ($dups)");

$node->stop;
$kafka->down;
done_testing();
