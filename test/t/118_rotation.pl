# test/t/118_rotation.pl: retention by rotation.  The log is a ring of
# generations that the relay empties with TRUNCATE.  Under steady load with
# a 4 s retention: the ring turns, generations are emptied, the log stays
# bounded and no row is ever deleted, and every committed event is in
# Kafka.  A quarantined event and the one parked behind it, and a replayed
# window of delivered events, are moved out of their generation, not lost, and a REPEATABLE READ snapshot taken before
# the move still sees them until it ends (the generation waits for it).  A
# transaction that wrote into a generation keeps it until it ends.  A given
# event_id is refused while a closed generation holds it.  With the relay
# paused, no undelivered event is dropped: the ring stops and status says
# why; once resumed, everything is published.

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

# a big event is refused by librdkafka itself (message.max.bytes) and
# quarantined after two attempts
my $kafka = OutboxTest::Broker->start(brokers => 3);
my $node = outbox_node(
	'rotation', $kafka,
	kafka_config => "$OutboxTest::TEST_KAFKA_CONFIG;message.max.bytes=10000",
	conf => q{
outbox.max_attempts = 2
outbox.retry_backoff_min = '50ms'
outbox.retry_backoff_max = '200ms'
outbox.poll_interval = '200ms'
});
drill_setup($node, 'postgres');
my ($pid) = wait_for_relay($node, 'postgres', 10);
ok(defined $pid, 'the relay runs');

sub q1 { return $node->safe_psql('postgres', $_[0]); }

sub in_kafka
{
	return event_ids_of(read_topic($kafka, $DRILL_TOPIC) // []);
}

sub generation_of
{
	my ($event_id) = @_;
	return q1("SELECT generation FROM outbox.events WHERE event_id = '$event_id'");
}

is(q1("SELECT string_agg(state, ',' ORDER BY generation) FROM outbox.generations"),
	'current,empty,empty,empty,empty,empty', 'a fresh ring: generation 0 is current');

# a poison event and its successor, in generation 0
my $out = q1("BEGIN;\n"
	  . insert_event_sql('drill', 'big-r', 'drill.poked',
		"jsonb_build_object('blob', repeat('z', 20000))")
	  . ";\nSELECT outbox.emit('drill', 'big-r', 'drill.poked', '{}');\nCOMMIT;");
my ($head, $parked) = grep { /^[0-9a-f-]{36}$/ } split /\n/, $out;
ok( poll_until(
		$node, 'postgres',
		"SELECT string_agg(state, ',' ORDER BY seq) FROM outbox.dead_letters",
		'quarantined,parked', 30),
	'an event is quarantined and its successor parked');
is(generation_of($head) . generation_of($parked), '00', 'both in generation 0');

# a snapshot older than anything the relay will do
my $reader = $node->background_psql('postgres');
$reader->query_safe('BEGIN ISOLATION LEVEL REPEATABLE READ');
$reader->query_safe('SELECT count(*) FROM outbox.dead_letters');

# a short retention: the ring turns every second
ok(set_and_reload($node, 'postgres', 'outbox.retention', '4s'), 'outbox.retention = 4s');

ok( poll_until(
		$node, 'postgres',
		"SELECT generation <> 0 FROM outbox.events WHERE event_id = '$head'", 't', 30),
	'the quarantined event moved out of generation 0');
isnt(generation_of($parked), '0', 'and so did the parked one');
ok( poll_until(
		$node, 'postgres',
		'SELECT waits_for FROM outbox.generations WHERE generation = 0',
		'an older snapshot', 30),
	'generation 0 waits for the older snapshot');
is( $reader->query_safe(
		"SELECT count(*) FROM outbox.events WHERE event_id IN ('$head', '$parked')"),
	'2', 'which still sees both events');
$reader->query_safe('COMMIT');
$reader->quit;
ok( poll_until(
		$node, 'postgres',
		'SELECT emptied_at IS NOT NULL OR state = \'current\' FROM outbox.generations WHERE generation = 0',
		't', 30),
	'once it ended, generation 0 is emptied');
is(q1("SELECT count(*) FROM outbox.events WHERE event_id IN ('$head', '$parked')"),
	'2', 'the quarantined and the parked event are still in the log');

# steady load: the log stays bounded
my $load = OutboxDrill::Load->start($node, 'postgres', seconds => 30, rate => 100);
my ($most, $turns) = (0, 0);
my $last_current = q1("SELECT generation FROM outbox.generations WHERE state = 'current'");
while (time() < $load->{started} + $load->{seconds})
{
	my ($rows, $current) = split /\|/,
	  q1("SELECT (SELECT count(*) FROM outbox.events), "
		  . "(SELECT generation FROM outbox.generations WHERE state = 'current')");
	$most = $rows if $rows > $most;
	$turns++ if $current != $last_current;
	$last_current = $current;
	usleep(250_000);
}
$load->finish;
note "most rows in the log: $most; turns seen: $turns";
cmp_ok($turns, '>=', 6, "the ring turned all the way round ($turns turns seen)");
cmp_ok($most, '<=', 2000,
	"the log held at most $most rows at 200 events/s with a 4 s retention");
# a move of the rows still needed is a delete and an insert; nothing else
# deletes: every row deleted was inserted again
ok( poll_until(
		$node, 'postgres',
		"SELECT sum(n_tup_ins) - sum(n_tup_del) = pg_sequence_last_value('outbox.events_id_seq')"
		  . " FROM pg_stat_user_tables WHERE schemaname = 'outbox' AND relname LIKE 'events%'",
		't', 30),
	'no row of the log was deleted but by a move');

# a given event_id, in a generation that closes
my $given = '0190a6f2-0000-7000-8000-00000000c0de';
q1("SELECT outbox.emit('drill', 'given', 'drill.given', '{}', event_id => '$given')");
my $given_gen = generation_of($given);
ok( poll_until(
		$node, 'postgres',
		"SELECT generation <> $given_gen FROM outbox.generations WHERE state = 'current'",
		't', 30),
	'the generation of an event with a given id closes');
usleep(1_200_000);
my ($rc, $stdout, $stderr) = $node->psql('postgres',
	"SELECT outbox.emit('drill', 'given', 'drill.given', '{}', event_id => '$given')",
	extra_params => [ '-v', 'VERBOSITY=verbose' ]);
like($stderr, qr/23505: an event with event_id $given exists already/,
	'the same id in the current generation is refused (23505)');

# a transaction that wrote into a generation keeps it
my $writer = $node->background_psql('postgres');
$writer->query_safe('BEGIN');
$writer->query_safe("SELECT outbox.emit('drill', 'open', 'drill.open', '{}')");
ok( poll_until(
		$node, 'postgres', 'SELECT log_waits_for FROM outbox.status',
		'a transaction using it', 30),
	'status: the oldest generation waits for a transaction using it');
$writer->query_safe('COMMIT');
$writer->quit;
ok( poll_until(
		$node, 'postgres',
		"SELECT coalesce(log_waits_for, '') <> 'a transaction using it' FROM outbox.status",
		't', 30),
	'once it committed, the ring turns on');

my $all = committed_ids($node, 'postgres');
my $msgs = wait_for_events($kafka, $DRILL_TOPIC, [ keys %$all ], 60);
my $fig = drill_figures($msgs, $all);
report_figures('rotation', $fig, "most rows in the log $most, $turns turns");
is(scalar(@{ $fig->{missing} }), 0, 'every committed event is in Kafka');
is($fig->{order_violations}, 0, 'per-aggregate order kept');

# a window of delivered events, to replay while the relay is paused
my @window = split /\n/, q1("SELECT outbox.emit('drill', 'window-' || g, 'drill.window', '{}')"
	  . " FROM generate_series(1, 50) g");
wait_for_events($kafka, $DRILL_TOPIC, \@window, 30);
my $window_gen = generation_of($window[0]);

# paused: nothing undelivered is dropped, the ring stops and says why
ok(set_and_reload($node, 'postgres', 'outbox.enabled', 'off'), 'pause the relay');
ok(poll_until($node, 'postgres', 'SELECT state FROM outbox.status()', 'paused', 30),
	'the relay is paused');
is( q1("SELECT outbox.replay(min(created_at), max(created_at) + interval '1 microsecond', 'drill')"
		  . " FROM outbox.events WHERE event_type = 'drill.window'"),
	'50', 'replay() queues the window of 50 delivered events');
ok( poll_until(
		$node, 'postgres',
		"SELECT count(*) FILTER (WHERE generation <> $window_gen) FROM outbox.events"
		  . " WHERE event_type = 'drill.window'",
		'50', 30),
	'their generation is emptied, the queued events moved out of it first');
my $t0 = time();
my $n = 0;
while (time() - $t0 < 8)
{
	q1("INSERT INTO drill_committed (event_id, aggregate_id) SELECT outbox.emit('drill',"
		  . " 'paused-' || (g % 10), 'drill.paused', '{}'), 'paused-' || (g % 10)"
		  . " FROM generate_series(1, 129) g");
	$n += 129;
	usleep(500_000);
}
ok( poll_until(
		$node, 'postgres', 'SELECT log_waits_for, kept_generations FROM outbox.status',
		'undelivered events|5', 30),
	"status: five generations kept, for undelivered events ($n emitted paused)");
is( q1("SELECT count(*) FROM outbox.events WHERE event_type = 'drill.paused'"),
	$n, "all $n undelivered events are still in the log");
ok(set_and_reload($node, 'postgres', 'outbox.enabled', 'on'), 'resume the relay');
$all = committed_ids($node, 'postgres');
$msgs = wait_for_events($kafka, $DRILL_TOPIC, [ keys %$all ], 60);
$fig = drill_figures($msgs, $all);
is(scalar(@{ $fig->{missing} }), 0, 'after the pause, every committed event is in Kafka');
ok( poll_until(
		$node, 'postgres', "SELECT count(*) FROM outbox.events WHERE event_type = 'drill.paused'",
		'0', 60),
	'and their generations are emptied once they are delivered');

ok( poll_until(
		$node, 'postgres', 'SELECT count(*) FROM outbox.replay_queue', '0', 30),
	'the replay queue is done');
my $copies = in_kafka();
is(scalar(grep { ($copies->{$_} // 0) >= 2 } @window), 50,
	'the replayed window, moved out of its generation, is published again');

# the parked event, moved, is published once its head is discarded
q1("SELECT outbox.discard('$head')");
wait_for_events($kafka, $DRILL_TOPIC, [$parked], 30);
ok(in_kafka()->{$parked}, 'discard(): the parked event, moved out of its generation, is published');

$node->stop;
done_testing();
