# test/t/103_poison.pl: failure drill.  Under steady load, events Kafka
# refuses for good: one larger than the producer's message.max.bytes, one
# for a topic the brokers refuse.  Each is quarantined after
# outbox.max_attempts, the later events of its aggregate are parked and
# stay out of Kafka, every other aggregate keeps flowing.  After the cause
# is fixed, outbox.replay() publishes the head and then its parked
# successors, in order, with their original ids; outbox.discard() releases
# the parked ones without the head; with outbox.poison_policy = 'skip' the
# successors are not held back at all.

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

my $max_attempts = 3;
my $denied = 'drill.denied';

# librdkafka refuses, on its own, messages above message.max.bytes (the
# mock broker has no limit of its own): the load's events are ~150 bytes,
# a big one 20 kB.
my $kafka = OutboxTest::Broker->start(brokers => 3);
my $node = outbox_node(
	'poison', $kafka,
	kafka_config => "$OutboxTest::TEST_KAFKA_CONFIG;message.max.bytes=10000",
	conf => qq{
outbox.max_attempts = $max_attempts
outbox.retry_backoff_min = '50ms'
outbox.retry_backoff_max = '200ms'
outbox.poison_policy = 'block'
});
drill_setup($node, 'postgres');
my ($pid) = wait_for_relay($node, 'postgres', 10);
ok(defined $pid, 'the relay runs');
my $log_start = -s $node->logfile;

my $load = OutboxDrill::Load->start($node, 'postgres', seconds => 30, rate => 60);
usleep(2_000_000);

# Emits, in one transaction, one event per [aggregate, payload bytes,
# topic or undef]; returns their ids.  emit() refuses an event larger than
# message.max.bytes, so a big one is written as a row without emit(), as
# if emitted before the limit was lowered.
sub emit
{
	my @ids;
	my $sql = join ";\n", map {
		my ($agg, $bytes, $topic) = @$_;
		my $payload = "jsonb_build_object('agg', '$agg', 'blob', repeat('z', $bytes))";
		$bytes > 5000
		  ? insert_event_sql('drill', $agg, 'drill.poked', $payload, $topic)
		  : "SELECT outbox.emit('drill', '$agg', 'drill.poked', $payload"
		  . (defined $topic ? ", topic => '$topic'" : '') . ')'
	} @_;
	my $out = $node->safe_psql('postgres', "BEGIN;\n$sql;\nCOMMIT;");
	@ids = grep { /^[0-9a-f-]{36}$/ } split /\n/, $out;
	die "expected " . scalar(@_) . " ids, got: $out" unless @ids == @_;
	return @ids;
}

sub dead_letter
{
	my ($id) = @_;
	my $row = query_json($node, 'postgres',
		"SELECT row_to_json(d) FROM outbox.dead_letters d WHERE event_id = '$id'");
	return $row // {};
}

sub wait_for_state
{
	my ($id, $state) = @_;
	return poll_until($node, 'postgres',
		"SELECT state FROM outbox.dead_letters WHERE event_id = '$id'",
		$state, 30);
}

# Messages of one aggregate, in partition order.
sub of_aggregate
{
	my ($msgs, $agg) = @_;
	return [ grep { ($_->{headers}{aggregate_id} // '') eq $agg } @$msgs ];
}

# --- block: a message too large
my ($e1) = emit([ 'big-1', 10 ]);
my ($e2, $e3) = emit([ 'big-1', 20000 ], [ 'big-1', 10 ]);
ok(wait_for_state($e2, 'quarantined'), 'the event too large is quarantined');
my $dl = dead_letter($e2);
is($dl->{attempts}, $max_attempts, "after outbox.max_attempts ($max_attempts) attempts");
is($dl->{error_class}, 'permanent', 'its error class is permanent');
like($dl->{last_error}, qr/^MSG_SIZE_TOO_LARGE: refused by the client\b/,
	'its last error is MSG_SIZE_TOO_LARGE, refused by the client');
is($dl->{envelope}{event_id}, $e2, 'the dead letter keeps the envelope');
ok(defined $dl->{first_failed_at} && defined $dl->{last_failed_at},
	'and when it first and last failed');
ok(wait_for_state($e3, 'parked'),
	'the later event of its aggregate in the same transaction is parked');
my ($e4) = emit([ 'big-1', 10 ]);
my ($e5) = emit([ 'big-1', 10 ]);

# --- block: a topic the brokers refuse.  (The mock answers a topic-level
# TOPIC_AUTHORIZATION_FAILED with the topic's partitions, which librdkafka
# takes for leaderless partitions and waits on up to message.timeout.ms,
# holding back every other aggregate meanwhile; an invalid topic it refuses
# at once, as it does a real cluster's unauthorized one.)  Left out where
# librdkafka crashes on the mock's form of that answer (see
# mock_topic_errors_crash); 306 pins the refusal by a real broker.
my $crashing = mock_topic_errors_crash();
my $topic_drill = $crashing eq '';
my $no_drill = "librdkafka $crashing crashes on the test broker's topic errors";
my ($d1, $d2, $d3);
SKIP:
{
	skip $no_drill, 3
	  unless $topic_drill;
	$kafka->command("topic-error $denied TOPIC_EXCEPTION");
	($d1) = emit([ 'deny-1', 10, $denied ]);
	ok(wait_for_state($d1, 'quarantined'), 'the event for the refused topic is quarantined');
	$dl = dead_letter($d1);
	is($dl->{attempts}, $max_attempts, "after $max_attempts attempts too");
	is($dl->{error_class}, 'permanent',
		"its error class is permanent ($dl->{last_error})");
	($d2) = emit([ 'deny-1', 10, $denied ]);
	($d3) = emit([ 'deny-1', 10, $denied ]);
}
my @deny_parked = $topic_drill ? ([ $d2, 'deny-1' ], [ $d3, 'deny-1' ]) : ();
is( slurp_file($node->logfile) =~ /WARNING:  librdkafka \S+ can crash the relay on a topic error/
	? 'warned' : 'silent',
	$topic_drill ? 'silent' : 'warned',
	'the relay warns at start exactly where its librdkafka is known to crash so');

# --- block, to be discarded
my ($b1) = emit([ 'big-2', 20000 ]);
ok(wait_for_state($b1, 'quarantined'), 'a second event too large is quarantined');
my ($b2) = emit([ 'big-2', 10 ]);
my ($b3) = emit([ 'big-2', 10 ]);

ok( wait_for_state($_->[0], 'parked'),
	"a later event of $_->[1], committed after the quarantine, is parked")
  foreach [ $e4, 'big-1' ], [ $e5, 'big-1' ], @deny_parked,
  [ $b2, 'big-2' ], [ $b3, 'big-2' ];
is( $node->safe_psql(
		'postgres',
		"SELECT string_agg(DISTINCT blocked_by::text, ',') FROM outbox.dead_letters"
		  . " WHERE event_id IN ('$e3', '$e4', '$e5')"),
	$e2,
	'each parked event names the quarantined head it waits for');
my $status = relay_status($node, 'postgres');
# big-1 parks 3 behind its head, big-2 2, deny-1 2
my $heads = $topic_drill ? 3 : 2;
my $parked = $topic_drill ? 7 : 5;
is($status->{quarantined}, $heads, "status counts $heads quarantined events");
is($status->{parked}, $parked, "and $parked parked ones");
cmp_ok($status->{permanent_failures}, '>=', $heads * $max_attempts,
	"and at least $heads x $max_attempts permanent failures ($status->{permanent_failures})");

# Other aggregates flow meanwhile: every load event committed so far
# arrives while the three heads are quarantined.
my $so_far = committed_ids($node, 'postgres');
my $msgs = wait_for_events($kafka, $DRILL_TOPIC, [ keys %$so_far ], 30);
is(scalar(grep { !event_ids_of($msgs)->{$_} } keys %$so_far),
	0,
	'while poison is quarantined, every other aggregate\'s events arrive ('
	  . scalar(keys %$so_far) . ')');
is_deeply([ map { $_->{headers}{id} } @{ of_aggregate($msgs, 'big-1') } ],
	[$e1], 'of big-1 only the event before the head is in Kafka');
is(scalar(@{ of_aggregate($msgs, 'big-2') }), 0, 'of big-2 nothing is');

# --- discard: the parked events go out, the head never does
my $discarded = $node->safe_psql('postgres',
	"SELECT affected_event_id || ' ' || action FROM outbox.discard('$b1') ORDER BY seq");
is($discarded, "$b1 discarded\n$b2 released\n$b3 released",
	'discard() drops the head and releases its parked successors');
$msgs = wait_for_events($kafka, $DRILL_TOPIC, [ $b2, $b3 ], 30);
is_deeply([ map { $_->{headers}{id} } @{ of_aggregate($msgs, 'big-2') } ],
	[ $b2, $b3 ], 'they arrive in order, without the head');
ok(wait_for_state($b2, 'replayed') && wait_for_state($b3, 'replayed'),
	'and their dead letters are resolved');

# --- skip: later events of a quarantined aggregate are not held back
ok(set_and_reload($node, 'postgres', 'outbox.poison_policy', 'skip'),
	'poison_policy = skip (reload)');
usleep(1_000_000);
my ($s1, $s2) = emit([ 'big-3', 20000 ], [ 'big-3', 10 ]);
ok(wait_for_state($s1, 'quarantined'), 'with skip, the event too large is quarantined');
my ($s3) = emit([ 'big-3', 10 ]);
$msgs = wait_for_events($kafka, $DRILL_TOPIC, [ $s2, $s3 ], 30);
is_deeply([ map { $_->{headers}{id} } @{ of_aggregate($msgs, 'big-3') } ],
	[ $s2, $s3 ], 'and its aggregate\'s later events are published meanwhile');
is( $node->safe_psql('postgres',
		"SELECT count(*) FROM outbox.dead_letters WHERE aggregate_id = 'big-3'"),
	1,
	'nothing of it is parked');

# --- fix the causes, then replay
$kafka->command("topic-error $denied 0") if $topic_drill;
ok( set_and_reload(
		$node, 'postgres', 'outbox.kafka_config',
		$OutboxTest::TEST_KAFKA_CONFIG,
		qr/Kafka settings changed, rebuilding the producer/),
	'message.max.bytes goes back to its default (reload)');
ok(set_and_reload($node, 'postgres', 'outbox.poison_policy', 'block'),
	'poison_policy = block again');
is( $node->safe_psql(
		'postgres',
		"SELECT string_agg(queued_event_id || ' ' || was, ',' ORDER BY seq) FROM outbox.replay('$e2')"
	),
	"$e2 quarantined,$e3 parked,$e4 parked,$e5 parked",
	'replay() of the head queues it and its parked successors, in order');
SKIP:
{
	skip $no_drill, 1
	  unless $topic_drill;
	is( $node->safe_psql(
			'postgres',
			"SELECT string_agg(queued_event_id::text, ',' ORDER BY seq) FROM outbox.replay('$d1')"
		),
		"$d1,$d2,$d3",
		'and so for the refused topic');
}
$node->safe_psql('postgres', "SELECT * FROM outbox.replay('$s1')");

$msgs = wait_for_events($kafka, $DRILL_TOPIC, [ $e2, $e3, $e4, $e5, $s1 ], 30);
is_deeply([ map { $_->{headers}{id} } @{ of_aggregate($msgs, 'big-1') } ],
	[ $e1, $e2, $e3, $e4, $e5 ],
	'big-1 arrives whole, head then parked successors, in order, once each, with the ids emit() returned'
);
is_deeply([ map { $_->{headers}{seq} } @{ of_aggregate($msgs, 'big-1') } ],
	[ 1 .. 5 ], 'their seq headers run 1..5');
my $dmsgs = [];
SKIP:
{
	skip $no_drill, 1
	  unless $topic_drill;
	$dmsgs = wait_for_events($kafka, $denied, [ $d1, $d2, $d3 ], 30);
	is_deeply([ map { $_->{headers}{id} } @$dmsgs ],
		[ $d1, $d2, $d3 ], 'deny-1 arrives whole, in order, once each');
}
is_deeply([ map { $_->{headers}{id} } @{ of_aggregate($msgs, 'big-3') } ],
	[ $s2, $s3, $s1 ], 'with skip, the replayed head comes after its successors');
ok(poll_until($node, 'postgres',
		"SELECT count(*) FROM outbox.dead_letters WHERE state NOT IN ('replayed', 'discarded')",
		'0', 30),
	'every dead letter is resolved');
$status = relay_status($node, 'postgres');
is($status->{quarantined} . '/' . $status->{parked}, '0/0',
	'status shows nothing quarantined or parked');

# --- the load, start to end
$load->finish;
my $all = committed_ids($node, 'postgres');
$msgs = wait_for_events($kafka, $DRILL_TOPIC, [ keys %$all ], 60);
my $fig = drill_figures([ grep { ($_->{headers}{aggregate_id} // '') =~ /^a-/ } @$msgs ], $all);
report_figures('poison, other aggregates', $fig);
is(scalar(@{ $fig->{missing} }), 0, 'zero loss for the other aggregates');
is($fig->{order_violations}, 0, 'and their order is kept');
is($fig->{duplicates}, 0, 'without duplicates');

my %poison = map { $_ => 1 } ($e1, $e2, $e3, $e4, $e5, $b2, $b3, $s1, $s2, $s3);
my $pfig = drill_figures(
	[ grep { ($_->{headers}{aggregate_id} // '') !~ /^a-/ } @$msgs ], \%poison);
my $dfig = drill_figures($dmsgs, $topic_drill ? { $d1 => 1, $d2 => 1, $d3 => 1 } : {});
diag(sprintf(
		'poison aggregates: events committed %d (1 discarded), delivered %d, duplicates %d, '
		  . 'order violations %d (big-3 under skip: its head after its successors, by design)',
		scalar(keys %poison) + ($topic_drill ? 4 : 1), $pfig->{delivered} + $dfig->{delivered},
		$pfig->{duplicates} + $dfig->{duplicates},
		$pfig->{order_violations} + $dfig->{order_violations}));
ok(!event_ids_of($msgs)->{$b1}, 'the discarded head never reached Kafka');
is(relay_pid($node, 'postgres'), $pid, 'the same relay process runs throughout');
is(server_crashed_since($node, $log_start), '', 'no process crashed');

$node->stop;
done_testing();
