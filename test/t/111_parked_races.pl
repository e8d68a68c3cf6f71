# test/t/111_parked_races.pl: events parked behind a quarantined head are
# never stranded, whatever commits while a page is in flight.  A slow
# broker (rtt) holds a page in flight while replay() or discard() of the
# head commits: the parked successors in that page, or in the page read
# ahead, still go out after the head, in order.  poison_policy = 'skip'
# holds nothing back even after the relay reloads its blocked list.  An
# event that replay(since, until) queued behind a head quarantined again
# during the replay is parked behind it, not published ahead of it.  A
# replay committed with COMMIT PREPARED is found at the safety poll.

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

my $topic = 'outbox.event.race';
my $window_topic = 'race.window';
my $slow_ms = 4000;
# librdkafka itself refuses messages above message.max.bytes: events of
# 20 kB are quarantined while it is set, and go through once it is not
my $small_config = "$OutboxTest::TEST_KAFKA_CONFIG;message.max.bytes=10000";

my $kafka = OutboxTest::Broker->start(brokers => 1);
my $node = outbox_node(
	'races', $kafka,
	kafka_config => $small_config,
	conf => q{
outbox.max_attempts = 2
outbox.retry_backoff_min = '20ms'
outbox.retry_backoff_max = '100ms'
outbox.poison_policy = 'block'
outbox.batch_size = 3
outbox.delivery_timeout = '30s'
max_prepared_transactions = 2
});
$node->safe_psql('postgres', 'CREATE EXTENSION outbox');
my ($pid) = wait_for_relay($node, 'postgres', 10);
ok(defined $pid, 'the relay runs');
my $log_start = -s $node->logfile;

# Emits, in one transaction, one event per [aggregate, payload bytes,
# aggregate type (default race), topic (default by type)]; returns their ids.
sub emit
{
	my $sql = join ";\n", map {
		my ($agg, $bytes, $type, $t) = @$_;
		$type //= 'race';
		# as emit() writes them, without its size check (the poison events
		# are larger than message.max.bytes, which emit() refuses)
		OutboxTest::insert_event_sql($type, $agg, "$type.poked",
			"jsonb_build_object('blob', repeat('z', $bytes))", $t)
	} @_;
	my $out = $node->safe_psql('postgres', "BEGIN;\n$sql;\nCOMMIT;");
	my @ids = grep { /^[0-9a-f-]{36}$/ } split /\n/, $out;
	die "expected " . scalar(@_) . " ids, got: $out" unless @ids == @_;
	return @ids;
}

sub wait_for_state
{
	my ($id, $state) = @_;
	return poll_until($node, 'postgres',
		"SELECT state FROM outbox.dead_letters WHERE event_id = '$id'",
		$state, 30);
}

# The ids of the messages of one aggregate, in partition order.
sub ids_of
{
	my ($msgs, $agg) = @_;
	return [ map { $_->{headers}{id} }
		  grep { ($_->{headers}{aggregate_id} // '') eq $agg } @$msgs ];
}

my $activity_sql =
  "SELECT query FROM pg_stat_activity WHERE backend_type = 'outbox relay'";

sub relay_activity
{
	return $node->safe_psql('postgres', $activity_sql);
}

# Waits until the relay waits for the acknowledgement of n events: the
# page holding them is in flight.
sub wait_in_flight
{
	my ($n) = @_;
	return poll_until($node, 'postgres', $activity_sql,
		"waiting for acknowledgement of $n events", 20);
}

# Dead letters that are neither resolved nor replaying, as "id state".
sub stranded
{
	return $node->safe_psql('postgres',
		"SELECT string_agg(event_id || ' ' || state, ', ' ORDER BY event_pk)"
		  . " FROM outbox.dead_letters d WHERE state = 'parked' AND NOT EXISTS"
		  . " (SELECT 1 FROM outbox.dead_letters h WHERE h.event_id = d.blocked_by"
		  . " AND h.state IN ('quarantined', 'parked'))");
}

# --- three heads, each of its own aggregate, quarantined
my ($ha) = emit([ 'ra', 20000 ]);
my ($hb) = emit([ 'rb', 20000 ]);
my ($hc) = emit([ 'rc', 20000 ]);
my ($hd) = emit([ 'rd', 20000 ]);
ok(wait_for_state($_, 'quarantined'), "head $_ is quarantined") foreach $ha, $hb, $hc, $hd;

# --- skip: nothing is parked, even after the blocked list is reloaded
ok(set_and_reload($node, 'postgres', 'outbox.poison_policy', 'skip'),
	'poison_policy = skip (reload)');
usleep(500_000);
my ($s1, $s2) = emit([ 'rs', 20000 ], [ 'rs', 10 ]);
ok(wait_for_state($s1, 'quarantined'), 'with skip, the event too large is quarantined');
my $msgs = wait_for_events($kafka, $topic, [$s2], 30);
is_deeply(ids_of($msgs, 'rs'), [$s2], 'and its successor is published');
# replay() of an empty window still has the relay reload its blocked list
is( $node->safe_psql('postgres',
		"SELECT outbox.replay(now() - interval '1 hour', now(), 'nothing')"),
	'0', 'an empty replay makes the relay reload its blocked list');
my ($s3) = emit([ 'rs', 10 ]);
$msgs = wait_for_events($kafka, $topic, [$s3], 20);
is_deeply(ids_of($msgs, 'rs'), [ $s2, $s3 ],
	'with skip, a later event is published after the reload too');
is($node->safe_psql('postgres', "SELECT count(*) FROM outbox.dead_letters WHERE event_id = '$s3'"),
	'0', 'and it is not parked');

# restarting the relay reloads the list as well
$node->safe_psql('postgres',
	"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE backend_type = 'outbox relay'");
my $pid2 = wait_for_relay($node, 'postgres', 30, $pid);
ok(defined $pid2, 'the relay is restarted');
my ($s4) = emit([ 'rs', 10 ]);
$msgs = wait_for_events($kafka, $topic, [$s4], 20);
is_deeply(ids_of($msgs, 'rs'), [ $s2, $s3, $s4 ],
	'with skip, a later event is published after a restart too');

ok(set_and_reload($node, 'postgres', 'outbox.poison_policy', 'block'),
	'poison_policy = block again');
ok( set_and_reload(
		$node, 'postgres', 'outbox.kafka_config',
		$OutboxTest::TEST_KAFKA_CONFIG,
		qr/Kafka settings changed, rebuilding the producer/),
	'message.max.bytes back to its default (reload)');

# five events of one aggregate, delivered, for the replay of a window
# below: two replay pages of outbox.batch_size (3)
my @w = emit([ 'w1', 20000, 'win', $window_topic ],
	map { [ 'w1', 10, 'win', $window_topic ] } 1 .. 4);
my $w1 = $w[0];
wait_for_events($kafka, $window_topic, \@w, 30);

# --- replay() and discard() commit while the page with the parked
# successors is in flight: x goes out slowly, pa and pb wait behind their
# heads
$kafka->command("rtt all $slow_ms");
my ($x, $pa, $pb) = emit([ 'x1', 10 ], [ 'ra', 10 ], [ 'rb', 10 ]);
ok(wait_in_flight(1), 'the page is in flight, its parked events held back');
my $t0 = time();
is( $node->safe_psql('postgres',
		"SELECT string_agg(queued_event_id::text, ',') FROM outbox.replay('$ha')"),
	$ha, 'replay() of the head queues only the head (its successor is not recorded yet)');
is( $node->safe_psql('postgres',
		"SELECT string_agg(affected_event_id || ' ' || action, ',') FROM outbox.discard('$hb')"),
	"$hb discarded", 'discard() of the other head releases nothing yet');
note(sprintf('replay and discard took %.2f s', time() - $t0));
is(relay_activity(), 'waiting for acknowledgement of 1 events',
	'both committed while the page was still in flight');
$kafka->command('rtt all 0');
$msgs = wait_for_events($kafka, $topic, [ $x, $ha, $pa, $pb ], 30);
is_deeply(ids_of($msgs, 'ra'), [ $ha, $pa ],
	'the replayed head, then its successor from the page in flight');
is_deeply(ids_of($msgs, 'rb'), [$pb], 'the discarded head\'s successor is released');
ok( poll_until($node, 'postgres',
		"SELECT string_agg(state, ',' ORDER BY event_pk) FROM outbox.dead_letters"
		  . " WHERE aggregate_id IN ('ra', 'rb')",
		'replayed,discarded,replayed,replayed', 20),
	'their dead letters are resolved');
is(stranded(), '', 'nothing is parked behind a resolved head');

# --- replay() of a head while the page read ahead holds its successor:
# x2..x4 are in flight, pc is read ahead
$kafka->command("rtt all $slow_ms");
my ($x2, $x3, $x4, $pc) = emit([ 'x2', 10 ], [ 'x3', 10 ], [ 'x4', 10 ], [ 'rc', 10 ]);
ok(wait_in_flight(3), 'a full page is in flight, the next one read ahead');
$node->safe_psql('postgres', "SELECT * FROM outbox.replay('$hc')");
is(relay_activity(), 'waiting for acknowledgement of 3 events',
	'replay() committed while the page was still in flight');
$kafka->command('rtt all 0');
$msgs = wait_for_events($kafka, $topic, [ $x2, $x3, $x4, $hc, $pc ], 30);
is_deeply(ids_of($msgs, 'rc'), [ $hc, $pc ],
	'the replayed head, then its successor from the page read ahead');
ok(wait_for_state($hc, 'replayed'), 'the head is resolved');
is($node->safe_psql('postgres',
		"SELECT coalesce(string_agg(state, ','), 'none') FROM outbox.dead_letters WHERE event_id = '$pc'"),
	'none', 'its successor went out without being parked');
is(stranded(), '', 'nothing is parked behind a resolved head');

# --- replay(since, until): the first event is refused again; the events
# queued behind it, in its page and in the next, are parked behind it, not
# published ahead of it
ok( set_and_reload(
		$node, 'postgres', 'outbox.kafka_config', $small_config,
		qr/Kafka settings changed, rebuilding the producer/),
	'message.max.bytes = 10000 again (reload)');
is( $node->safe_psql('postgres',
		"SELECT outbox.replay(now() - interval '1 hour', now() + interval '1 hour', 'win')"),
	'5', 'replay of a window queues the five delivered events');
ok( poll_until($node, 'postgres',
		"SELECT (SELECT count(*) FROM outbox.replay_queue) || ':' ||"
		  . " string_agg(state || coalesce(' behind ' || blocked_by, ''), ',' ORDER BY event_pk)"
		  . " FROM outbox.dead_letters WHERE aggregate_type = 'win'",
		"0:quarantined" . ",parked behind $w1" x 4, 30),
	'the first is quarantined again, the other four are parked behind it, the queue is empty');
$msgs = read_topic($kafka, $window_topic) // [];
is(scalar(@$msgs), 5, 'nothing of the window went out again ahead of its quarantined head');
ok( set_and_reload(
		$node, 'postgres', 'outbox.kafka_config',
		$OutboxTest::TEST_KAFKA_CONFIG,
		qr/Kafka settings changed, rebuilding the producer/),
	'message.max.bytes back to its default (reload)');
is( $node->safe_psql('postgres',
		"SELECT string_agg(queued_event_id::text, ',' ORDER BY seq) FROM outbox.replay('$w1')"),
	join(',', @w), 'replay() of it queues the five, in order');
ok(poll_until($node, 'postgres',
		"SELECT count(*) FROM outbox.replay_queue", '0', 30), 'the queue drains');
$msgs = wait_for_messages($kafka, $window_topic, 10, 30);
is_deeply([ map { $_->{headers}{id} } @$msgs ],
	[ @w, @w ],
	'the window arrives once as delivered and once replayed, each time in order');

# --- a replay committed by COMMIT PREPARED wakes nobody: the relay finds
# it at its safety poll
$node->safe_psql('postgres',
	"BEGIN; SELECT * FROM outbox.replay('$hd'); PREPARE TRANSACTION 'replay_hd';");
$node->safe_psql('postgres', "COMMIT PREPARED 'replay_hd'");
$msgs = wait_for_events($kafka, $topic, [$hd], 20);
is_deeply(ids_of($msgs, 'rd'), [$hd], 'a replay committed in two phases is published');

# --- an event left parked behind a head already replayed (as a 1.0 relay
# could record it) is released when the relay settles a replay page
my ($z) = emit([ 'rz', 10 ]);
wait_for_events($kafka, $topic, [$z], 20);
$node->safe_psql('postgres',
	"INSERT INTO outbox.dead_letters (event_id, event_pk, aggregate_type, aggregate_id, seq,"
	  . " event_type, topic, state, blocked_by, envelope)"
	  . " SELECT event_id, id, aggregate_type, aggregate_id, seq, event_type, topic, 'parked',"
	  . " '$ha', to_jsonb(e) FROM outbox.events e WHERE event_id = '$z'");
is( $node->safe_psql('postgres',
		"SELECT outbox.replay(now() - interval '1 hour', now() + interval '1 hour', 'win')"),
	'5', 'a replay of a window (which releases nothing itself)');
ok(wait_for_state($z, 'replayed'), 'the stranded event is released and published again');
$msgs = wait_for_messages($kafka, $topic, 1, 5);
is(event_ids_of($msgs)->{$z}, 2, 'it is in Kafka twice: delivered, then released');

# --- the end: every dead letter resolved but the one quarantined under skip
ok( poll_until($node, 'postgres',
		"SELECT string_agg(event_id::text, ',') FROM outbox.dead_letters"
		  . " WHERE state NOT IN ('replayed', 'discarded')",
		$s1, 20),
	'every other dead letter is resolved');
is(server_crashed_since($node, $log_start), '', 'no process crashed');

$node->stop;
done_testing();
