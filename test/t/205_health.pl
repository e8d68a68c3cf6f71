# test/t/205_health.pl: outbox.health() judges the relay as an operator
# would: ok when publishing, warning when paused or an event is
# quarantined, critical when nothing can be published or the oldest
# undelivered event is older than max_age (paused or not).

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);

# found without -I: PGXS resets PROVE_FLAGS after the Makefile sets it
use FindBin;
use lib "$FindBin::RealBin/../perl";
use OutboxTest;

my $kafka = OutboxTest::Broker->start(brokers => 1);

# room for three background workers: the logical replication launcher, the
# outbox launcher and one relay, so a second database gets no relay
my $node = outbox_node('health', $kafka, conf => 'max_worker_processes = 3');
$node->safe_psql('postgres', 'CREATE EXTENSION outbox');
my ($pid) = wait_for_relay($node, 'postgres', 30);
ok(defined $pid, 'the relay runs');

sub health
{
	my ($db, $max_age) = @_;
	my $arg = defined $max_age ? "max_age => '$max_age'" : '';
	return query_json($node, $db // 'postgres',
		"SELECT row_to_json(h) FROM outbox.health($arg) h");
}

sub status_row
{
	return query_json($node, 'postgres',
		'SELECT row_to_json(s) FROM outbox.status() s');
}

# ALTER SYSTEM (or RESET with undef) and reload
sub set_and_reload
{
	my ($setting, $value) = @_;
	$node->safe_psql('postgres',
		defined $value
		? "ALTER SYSTEM SET $setting = '$value'"
		: "ALTER SYSTEM RESET $setting");
	$node->safe_psql('postgres', 'SELECT pg_reload_conf()');
}

sub wait_state
{
	my ($state, $what) = @_;
	ok(poll_until($node, 'postgres', 'SELECT state FROM outbox.status()', $state, 30),
		$what);
}

is_deeply(health(), { status => 'ok', reason => undef },
	'a running relay with nothing pending is ok, with no reason');

# --- paused
set_and_reload('outbox.enabled', 'off');
wait_state('paused', 'outbox.enabled = off pauses the relay');
my $h = health();
is($h->{status}, 'warning', 'paused: health() is a warning');
like($h->{reason}, qr/paused.*outbox\.enabled = off/, 'the reason says it is paused');

$node->safe_psql('postgres',
	q{SELECT outbox.emit('ticket', 't-1', 'ticket.opened', '{"n": 1}')});
my $s1 = status_row();
is($s1->{backlog}, 1, 'paused: the emitted event is in the backlog');
ok(defined $s1->{oldest_pending_seconds},
	'paused: oldest_pending_seconds shows the waiting event');
ok( poll_until(
		$node, 'postgres',
		"SELECT oldest_pending_seconds > $s1->{oldest_pending_seconds} FROM outbox.status()",
		't', 10),
	'paused: oldest_pending_seconds grows');
ok( poll_until(
		$node, 'postgres', "SELECT status FROM outbox.health(max_age => '2 s')",
		'critical', 30),
	'paused with an event waiting longer than max_age: critical');
like(
	health(undef, '2 s')->{reason},
	qr/oldest undelivered event is \d+ s old, over 2 s.*paused/,
	'the reason gives the age and says publishing is paused');
is(health()->{status}, 'warning',
	'with the default max_age of 1 min it is still a warning');

set_and_reload('outbox.enabled', undef);
ok( poll_until(
		$node, 'postgres',
		'SELECT state, backlog, oldest_pending_seconds IS NULL FROM outbox.status()',
		'running|0|t', 30),
	'resumed: the event is published, nothing is pending');
wait_for_messages($kafka, 'outbox.event.ticket', 1);
is_deeply(health(undef, '2 s'), { status => 'ok', reason => undef },
	'resumed: health() is ok again');

# --- not configured
set_and_reload('outbox.kafka_brokers', '');
wait_state('not configured', 'an empty outbox.kafka_brokers leaves the relay not configured');
$h = health();
is($h->{status}, 'critical', 'not configured: health() is critical');
like($h->{reason}, qr/outbox\.kafka_brokers is empty/,
	'the reason names outbox.kafka_brokers');
like(
	$node->safe_psql('postgres', 'SELECT outbox.metrics()'),
	qr/^outbox_relay_state\{database="postgres",state="not configured"\} 1$/m,
	'metrics(): outbox_relay_state{state="not configured"} = 1');
set_and_reload('outbox.kafka_brokers', $kafka->bootstrap);
wait_state('running', 'with brokers again the relay runs');
is(health()->{status}, 'ok', 'and health() is ok');

# --- a quarantined event
# max_attempts first: the reload that brings kafka_config brings both
set_and_reload('outbox.max_attempts', '2');
set_and_reload('outbox.kafka_config',
	"$OutboxTest::TEST_KAFKA_CONFIG;message.max.bytes=2000");
ok(defined wait_for_log_match($node, qr/Kafka settings changed/, 0, 30),
	'the relay rebuilds its producer with message.max.bytes=2000');
# emit() refuses an event over message.max.bytes: this one is a row
# written without it, as if emitted before the limit was lowered
my $big = $node->safe_psql('postgres',
	insert_event_sql('blob', 'b-1', 'blob.stored', "jsonb_build_object('data', repeat('x', 5000))"));
my $small = $node->safe_psql('postgres',
	q{SELECT outbox.emit('note', 'n-1', 'note.added', '{"n": 1}')});
ok( poll_until(
		$node, 'postgres', 'SELECT quarantined FROM outbox.status()', '1', 30),
	'a 5000-byte event over message.max.bytes is quarantined: quarantined = 1');
wait_for_events($kafka, 'outbox.event.note', [$small]);
pass('the small event of another aggregate is still published');
my $s = status_row();
is($s->{permanent_failures}, 2,
	'permanent_failures = 2: refused at each of outbox.max_attempts = 2');
is($s->{transient_failures}, 0, 'transient_failures = 0');
is($s->{backlog}, 0, 'backlog = 0: the quarantined event is no longer pending');
like($s->{last_error} // '', qr/MSG_SIZE_TOO_LARGE/, 'last_error names the refusal');
is( $node->safe_psql('postgres',
		"SELECT state FROM outbox.dead_letters WHERE event_id = '$big'"),
	'quarantined',
	'outbox.dead_letters holds it');
ok(poll_until($node, 'postgres', 'SELECT state FROM outbox.status()', 'running', 30),
	'the relay runs on');
$h = health();
is($h->{status}, 'warning', 'a quarantined event: health() is a warning');
is($h->{reason}, '1 event is quarantined in outbox.dead_letters',
	'the reason says one event is quarantined');
like(
	$node->safe_psql('postgres', 'SELECT outbox.metrics()'),
	qr/^outbox_delivery_errors_total\{database="postgres",class="permanent"\} 2$/m,
	'metrics(): outbox_delivery_errors_total{class="permanent"} = 2');

$node->safe_psql('postgres', "SELECT outbox.discard('$big')");
is(health()->{status}, 'ok', 'once it is discarded, health() is ok again');

# --- a database whose relay cannot start (no background worker slot)
$node->safe_psql('postgres', 'CREATE DATABASE spare');
$node->safe_psql('spare', 'CREATE EXTENSION outbox');
ok( defined wait_for_log_match(
		$node, qr/cannot (?:start a relay for|look for the extension in) database "spare": no background worker slot is free/,
		0, 30),
	'the launcher cannot start a relay for the second database');
ok(!defined relay_pid($node, 'spare'), 'the second database has no relay');
$h = health('spare');
is($h->{status}, 'critical', 'without its relay: health() is critical');
like($h->{reason}, qr/^no relay: no free background worker slot \(max_worker_processes\)/,
	'the reason says why no relay runs');
is( $node->safe_psql('spare', 'SELECT state, pid IS NULL FROM outbox.status()'),
	'stopped|t', 'status(): stopped, no pid');
like(
	$node->safe_psql('spare', 'SELECT outbox.metrics()'),
	qr/^outbox_relay_up\{database="spare"\} 0$/m,
	'metrics(): outbox_relay_up = 0');

$node->stop;
done_testing();
