# test/t/105_held_xmin.pl: failure drill.  Under steady load, one session
# keeps a transaction open that emitted an event (it has an xid and holds
# back the xmin horizon) and another keeps a REPEATABLE READ snapshot open
# (no xid), both for most of the test.  Other transactions' events keep
# flowing meanwhile; outbox.cleanup(), even with outbox.retention = 0,
# never removes an event that is not delivered, so the held transaction's
# event is delivered after it commits, however late.

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

my $hold = 16;    # seconds both sessions stay open under load

# retention 0: every delivered event may go at once, so that cleanup is
# judged by delivery alone
my $kafka = OutboxTest::Broker->start(brokers => 3);
my $node = outbox_node('heldxmin', $kafka, conf => "outbox.retention = 0");
drill_setup($node, 'postgres');
my ($pid) = wait_for_relay($node, 'postgres', 10);
ok(defined $pid, 'the relay runs');
my $log_start = -s $node->logfile;

my $load = OutboxDrill::Load->start($node, 'postgres', seconds => 28, rate => 80);
usleep(1_000_000);

# the writer: an xid, an uncommitted event, the oldest xmin
my $writer = $node->background_psql('postgres');
$writer->query_safe('BEGIN');
my $held = $writer->query_safe(
	"SELECT outbox.emit('drill', 'held-1', 'drill.held', '{\"held\": true}')");
like($held, qr/^[0-9a-f-]{36}$/, 'a session emits and keeps its transaction open');
my $writer_pid = $writer->query_safe('SELECT pg_backend_pid()');
is( $node->safe_psql(
		'postgres',
		"SELECT backend_xid IS NOT NULL FROM pg_stat_activity WHERE pid = $writer_pid"),
	't',
	'it has an xid');

# the reader: a snapshot, no xid
my $reader = $node->background_psql('postgres');
$reader->query_safe('BEGIN ISOLATION LEVEL REPEATABLE READ');
my $seen_by_reader = $reader->query_safe('SELECT count(*) FROM drill_committed');
is($reader->query_safe('SELECT pg_current_xact_id_if_assigned() IS NULL'),
	't', 'another session holds a REPEATABLE READ snapshot without an xid');

# While both stay open: checkpoints every few seconds; everything
# committed before a checkpoint must arrive, and cleanup runs each time.
my $t_end = time() + $hold;
my ($checks, $late, $deleted, $max_lag) = (0, 0, 0, 0);
while (time() < $t_end)
{
	my $ids = committed_ids($node, 'postgres');
	my $t = time();
	my $msgs = wait_for_events($kafka, $DRILL_TOPIC, [ keys %$ids ], 30);
	my $seen = event_ids_of($msgs);
	my $lag = time() - $t;
	$max_lag = $lag if $lag > $max_lag;
	$late += grep { !$seen->{$_} } keys %$ids;
	$checks++;
	ok(!$seen->{$held}, "checkpoint $checks: the open transaction's event is not published")
	  if $checks == 1;
	$deleted += $node->safe_psql('postgres',
		'SELECT events FROM outbox.cleanup(false)');
	usleep(2_000_000);
}
is($late, 0,
	"while both sessions are open, other transactions' events keep flowing ($checks checkpoints, "
	  . sprintf('all delivered within %.1f s', $max_lag) . ')');
cmp_ok($deleted, '>', 0,
	"cleanup(false) deleted delivered events meanwhile ($deleted)");
ok(!event_ids_of(read_topic($kafka, $DRILL_TOPIC) // [])->{$held},
	'the open transaction\'s event is still not published');
cmp_ok(
	$node->safe_psql(
		'postgres',
		"SELECT age(backend_xid) FROM pg_stat_activity WHERE pid = $writer_pid"),
	'>', 100,
	'the open transaction\'s xid is now hundreds of transactions old');
is($writer->query_safe("SELECT count(*) FROM outbox.events WHERE event_id = '$held'"),
	'1', 'and its row is still there');
is($reader->query_safe('SELECT count(*) FROM drill_committed'),
	$seen_by_reader, 'the reader\'s snapshot is unchanged');

# Commit while the relay is paused, so that the event sits committed and
# undelivered: cleanup must leave it, and the events committed meanwhile.
ok(set_and_reload($node, 'postgres', 'outbox.enabled', 'off'), 'pause the relay');
ok(poll_until($node, 'postgres', 'SELECT state FROM outbox.status()', 'paused', 30),
	'the relay is paused');
$writer->query_safe('COMMIT');
usleep(1_000_000);
# undelivered: in outbox.events and not in Kafka (which stands still now)
my $in_kafka = event_ids_of(read_topic($kafka, $DRILL_TOPIC) // []);
my @undelivered = grep { !$in_kafka->{$_} } split /\n/,
  $node->safe_psql('postgres', 'SELECT event_id FROM outbox.events');
ok((grep { $_ eq $held } @undelivered),
	'the late event is committed and undelivered');
my $gone = 0;
foreach (1 .. 3)
{
	$gone += $node->safe_psql('postgres', 'SELECT events FROM outbox.cleanup(false)');
	usleep(300_000);
}
my %left = map { $_ => 1 } split /\n/,
  $node->safe_psql('postgres', 'SELECT event_id FROM outbox.events');
ok($left{$held}, 'cleanup(false) leaves the late event');
is(scalar(grep { !$left{$_} } @undelivered), 0,
	'and every other undelivered one ('
	  . scalar(@undelivered)
	  . " undelivered; it deleted $gone delivered ones)");
ok(set_and_reload($node, 'postgres', 'outbox.enabled', 'on'), 'resume the relay');
my $msgs = wait_for_events($kafka, $DRILL_TOPIC, [$held], 30);
is(event_ids_of($msgs)->{$held}, 1, 'the late event is delivered, once');
$reader->query_safe('COMMIT');
$reader->quit;
$writer->quit;

$load->finish;
my $all = committed_ids($node, 'postgres');
$all->{$held} = 'held-1';
$msgs = wait_for_events($kafka, $DRILL_TOPIC, [ keys %$all ], 60);
my $fig = drill_figures($msgs, $all);
report_figures('held xmin', $fig,
	sprintf('%d s held, %d deleted by cleanup meanwhile, checkpoint lag max %.1f s',
		$hold, $deleted, $max_lag));
is(scalar(@{ $fig->{missing} }), 0,
	'zero loss: every committed event is in Kafka, none was cleaned up before delivery');
is(scalar(@{ $fig->{strangers} }), 0, 'Kafka holds no event that was not committed');
is($fig->{duplicates}, 0, 'no duplicates');
is($fig->{order_violations}, 0, 'per-aggregate order kept');
is(relay_pid($node, 'postgres'), $pid, 'the same relay process runs throughout');
is(server_crashed_since($node, $log_start), '', 'no process crashed');

$node->stop;
done_testing();
