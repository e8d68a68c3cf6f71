# test/t/015_subscription.pl: the consumer side, inside the server.
# Database a's outbox publishes through the relay; database b subscribes
# and its handler inserts one row per message applied.  Everything is read
# back from b's tables: each event applied exactly once, in each
# aggregate's order, through
#   - the same id produced twice with kcat, and the relay's own resend
#     (replay of retained events);
#   - kill -9 of the subscription worker in the middle of a batch (the
#     crash restart takes the relay down too, which resends what it had
#     not recorded);
#   - the whole broker cluster down while events keep coming;
#   - a poison message: retried, dead-lettered, its key's later messages
#     parked while other keys flow, then replayed (and another discarded);
#   - a rebalance between two subscriptions of one consumer group under
#     load.
# Messages without an id header are kept apart by their offsets.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run qw(run);
use Time::HiRes qw(time usleep);

use FindBin;
use lib "$FindBin::RealBin/../perl";
use OutboxTest;

my $kafka = OutboxTest::Broker->start(brokers => 3);
my $topic = 'outbox.event.order';
$kafka->command("create $topic 4");
my $node = outbox_node('subscription', $kafka,
	conf => "outbox.retry_backoff_min = '50ms'\noutbox.retry_backoff_max = '400ms'\nrestart_after_crash = on");
$node->safe_psql('postgres', 'CREATE DATABASE a');
$node->safe_psql('postgres', 'CREATE DATABASE b');
$node->safe_psql('a', 'CREATE EXTENSION outbox');
$node->safe_psql('b', 'CREATE EXTENSION outbox');

# the handler: one row per application; a poison payload fails until the
# cure table says otherwise; slow payloads sleep (to kill mid-batch)
$node->safe_psql(
	'b', q{
CREATE TABLE applied (n bigserial PRIMARY KEY, event_id uuid, topic text, part int, off bigint,
	key text, seq bigint, payload jsonb, value bytea, who text, worker int);
CREATE TABLE cure (key text PRIMARY KEY);
CREATE FUNCTION apply(m outbox.inbound_message) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
	IF (m.payload->>'poison')::boolean AND NOT EXISTS (SELECT 1 FROM public.cure c WHERE c.key = m.key) THEN
		RAISE EXCEPTION 'poison for key %', m.key USING ERRCODE = 'check_violation';
	END IF;
	IF m.payload ? 'sleep' THEN
		PERFORM pg_catalog.pg_sleep((m.payload->>'sleep')::float8);
	END IF;
	INSERT INTO public.applied (event_id, topic, part, off, key, seq, payload, value, who, worker)
	VALUES (m.event_id, m.topic, m.kafka_partition, m.kafka_offset, m.key, m.seq, m.payload, m.value,
			current_user, pg_catalog.pg_backend_pid());
END $$;
CREATE ROLE app LOGIN;
GRANT USAGE ON SCHEMA outbox TO app;
GRANT EXECUTE ON FUNCTION outbox.subscribe(text, text[], regprocedure, text, text, integer, text, integer) TO app;
GRANT EXECUTE ON FUNCTION outbox.subscription_status() TO app;
GRANT EXECUTE ON FUNCTION outbox.subscription_lag() TO app;
GRANT ALL ON applied, applied_n_seq, cure TO app;
});
$node->safe_psql(
	'b', q{
SET ROLE app;
SELECT outbox.subscribe('orders', ARRAY['outbox.event.order'], 'public.apply(outbox.inbound_message)', max_attempts => 3);
});

sub worker_pids
{
	my ($db) = @_;
	return split /\n/,
	  $node->safe_psql('postgres',
		"SELECT pid FROM pg_stat_activity WHERE backend_type = 'outbox subscription' AND datname = '$db' ORDER BY pid"
	  );
}

my $emitted = 0;
# events that are not to be applied (discarded below)
my $not_applied = 'false';

sub emit
{
	my ($count, $aggregates, $extra) = @_;
	$extra //= "'{}'::jsonb";
	$node->safe_psql('a',
		"SELECT outbox.emit('order', 'o-' || (i % $aggregates), 'order.confirmed', jsonb_build_object('i', i) || $extra) FROM generate_series(1, $count) i"
	);
	$emitted += $count;
}

# every event of a, applied once in b, each aggregate in seq order (the
# messages kcat produces carry ids a never emitted: left out)
my $from_a = "event_id IS NOT NULL AND event_id::text NOT LIKE 'f1000000-%'";

sub check_exactly_once
{
	my ($what) = @_;
	my $events = $node->safe_psql('a', "SELECT count(*) FROM outbox.events WHERE NOT ($not_applied)");
	ok(poll_until($node, 'b', "SELECT count(DISTINCT event_id) FROM applied WHERE $from_a", $events, 60),
		"$what: all $events events applied");
	is($node->safe_psql('b',
		"SELECT count(*) FROM (SELECT event_id FROM applied WHERE $from_a GROUP BY event_id HAVING count(*) > 1) d"),
		'0', "$what: no event applied twice");
	my $ids_a = $node->safe_psql('a',
		"SELECT md5(string_agg(event_id::text, ',' ORDER BY event_id::text)) FROM outbox.events WHERE NOT ($not_applied)");
	my $ids_b = $node->safe_psql('b',
		"SELECT md5(string_agg(DISTINCT event_id::text, ',' ORDER BY event_id::text)) FROM applied WHERE $from_a");
	is($ids_b, $ids_a, "$what: the events applied are the events emitted");
	is($node->safe_psql('b', qq{
		SELECT count(*) FROM (SELECT seq < lag(seq) OVER (PARTITION BY key ORDER BY n) AS back
		  FROM applied WHERE $from_a AND seq IS NOT NULL) s WHERE back}),
		'0', "$what: each aggregate's events applied in seq order");
}

# 1. the loop, with envelope fields and the owner's identity
ok(defined wait_for_relay($node, 'a', 10), 'database a has its relay');
ok(poll_until($node, 'postgres',
	"SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'outbox subscription' AND datname = 'b'", '1', 20),
	'subscribe() started a worker in database b');
emit(400, 20);
check_exactly_once('the loop');
my $row = $node->safe_psql('b', q{
	SELECT a.topic, a.key ~ '^o-', a.seq >= 1, a.payload ? 'i', convert_from(a.value, 'UTF8')::jsonb = a.payload, a.who
	  FROM applied a ORDER BY n LIMIT 1});
is($row, "$topic|t|t|t|t|app", 'the handler sees topic, key, seq, payload and value, and runs as the subscribing role');
is($node->safe_psql('a', q{SELECT count(*) FROM outbox.events}), $node->safe_psql('b', q{
	SELECT count(*) FROM outbox.inbox WHERE consumer = 'outbox;orders'}), 'each applied event left its dedupe row');
my $status = $node->safe_psql('b',
	"SET ROLE app; SELECT state, processed >= 400, failed, dead_letters, last_applied_at IS NOT NULL FROM outbox.subscription_status()");
is($status, 'running|t|0|0|t', 'subscription_status(): running, 400 processed, nothing failed');
ok(poll_until($node, 'b', 'SELECT sum(lag), count(*) FROM outbox.subscription_lag()', '0|4', 10),
	'subscription_lag(): 4 partitions, none behind');
like($node->safe_psql('b', 'SELECT outbox.metrics()'),
	qr/outbox_subscription_processed_total\{database="b",subscription="orders"\} \d+/,
	'metrics() counts what the subscription applied');

# 2. duplicates: the same id produced twice, a message without id twice
my $dup_id = 'f1000000-0000-7000-8000-000000000001';
for (1 .. 2)
{
	run([ 'kcat', '-P', '-b', $kafka->bootstrap, '-t', $topic, '-p', '0', '-k', 'dup',
		  '-H', "id=$dup_id", '-H', 'event_type=dup.sent' ],
		'<', \'{"dup": true}') or die 'kcat failed';
	run([ 'kcat', '-P', '-b', $kafka->bootstrap, '-t', $topic, '-p', '1', '-k', 'plain' ],
		'<', \'not json at all') or die 'kcat failed';
}
ok(poll_until($node, 'b', "SELECT count(*) FROM applied WHERE key = 'plain'", '2', 20),
	'two messages without an id are two messages');
is($node->safe_psql('b', "SELECT count(*) FROM applied WHERE event_id = '$dup_id'"), '1',
	'the same id produced twice is applied once');
is($node->safe_psql('b', "SELECT payload IS NULL, convert_from(value, 'UTF8') FROM applied WHERE key = 'plain' LIMIT 1"),
	't|not json at all', 'a value that is not JSON arrives as value, payload NULL');

# hostile values: JSON that jsonb refuses arrives with payload NULL; a
# poison message with a key longer than any index entry is dead-lettered
# like any other, and its partition goes on
run([ 'kcat', '-P', '-b', $kafka->bootstrap, '-t', $topic, '-p', '2', '-k', 'nul' ],
	'<', \'{"a": "\u0000"}') or die 'kcat failed';
my $long_key = join('', map { ('a' .. 'z', 'A' .. 'Z', 0 .. 9)[ rand 62 ] } 1 .. 3000);
run([ 'kcat', '-P', '-b', $kafka->bootstrap, '-t', $topic, '-p', '3', '-k', $long_key ],
	'<', \'{"poison": true}') or die 'kcat failed';
run([ 'kcat', '-P', '-b', $kafka->bootstrap, '-t', $topic, '-p', '3', '-k', 'after-long' ],
	'<', \'{"fine": true}') or die 'kcat failed';
ok(poll_until($node, 'b', "SELECT count(*) FROM applied WHERE key = 'after-long'", '1', 30),
	'the partition of a poison message with a 3,000-byte key goes on');
is($node->safe_psql('b', "SELECT payload IS NULL, convert_from(value, 'UTF8') FROM applied WHERE key = 'nul'"),
	't|{"a": "\u0000"}', 'a value jsonb refuses is applied with payload NULL');
is($node->safe_psql('b', "SELECT length(key), attempts FROM outbox.inbox_dead_letters WHERE length(key) > 2000"),
	'3000|3', 'the long-keyed poison message is dead after 3 attempts');
$node->safe_psql('b', "SELECT outbox.inbox_discard('orders', id) FROM outbox.inbox_dead_letters WHERE length(key) > 2000");

# the relay's own resend: replay of retained events, with their ids
my $before = $node->safe_psql('b', 'SELECT count(*) FROM applied');
$node->safe_psql('a', "SELECT outbox.replay(now() - interval '1 hour', now())");
ok(poll_until($node, 'b',
	"SELECT deduplicated >= 400 FROM outbox.subscription_status()", 't', 30),
	'the resent events are counted as deduplicated');
is($node->safe_psql('b', 'SELECT count(*) FROM applied'), $before, 'and none is applied again');

# 3. kill -9 of the worker in the middle of a batch, under load
my ($worker) = worker_pids('b');
emit(200, 20, q{'{"sleep": 0.01}'::jsonb});
ok(poll_until($node, 'b', "SELECT count(*) > 20 FROM applied WHERE payload ? 'sleep'", 't', 30),
	'the slow batch is being applied');
kill 'KILL', $worker;
# the postmaster restarts every process after a crash
ok(poll_until($node, 'postgres',
	"SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'outbox subscription' AND datname = 'b' AND pid <> $worker", '1', 60),
	'after the crash the worker runs again');
emit(100, 20);
check_exactly_once('kill -9 of the worker mid-batch');
is($node->safe_psql('b', "SELECT count(*) FROM applied WHERE key = 'plain'"), '2',
	'messages without an id are not applied again after the crash');

# kill -9 of the relay while it drains: a page acknowledged but not yet
# recorded is sent again, with its ids; Kafka holds the copies, b applies
# each event once
for my $k (1 .. 3)
{
	emit(1500, 20);
	usleep(30_000 * $k);
	my $relay = relay_pid($node, 'a') // 0;
	kill 'KILL', $relay if $relay;
	ok(poll_until($node, 'postgres',
		"SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'outbox relay' AND datname = 'a' AND pid <> $relay", '1', 60),
		"kill -9 $k of the relay: it runs again");
}
check_exactly_once('three kill -9 of the relay while it drains');
my $in_kafka = read_topic($kafka, $topic);
my %copies;
$copies{ $_->{headers}{id} // '' }++ for @$in_kafka;
my $resent = grep { $_ > 1 } values %copies;
cmp_ok($resent, '>=', 400, "Kafka holds events sent more than once ($resent), applied once each");

# 4. the whole cluster down while events keep coming
$kafka->command("down $_") for 1 .. 3;
emit(150, 20);
sleep 3;
my $down_status = $node->safe_psql('b', 'SELECT state FROM outbox.subscription_status()');
is($down_status, 'running', 'brokers down: the worker keeps running');
$kafka->command("up $_") for 1 .. 3;
check_exactly_once('every broker down 3 s');
unlike(slurp_file($node->logfile), qr/ERROR:.*subscription/, 'no ERROR from the subscription in the log');

# 5. poison: retried max_attempts times, dead-lettered, its key parked
$node->safe_psql('a', q{SELECT outbox.emit('order', 'sick', 'order.confirmed', '{"poison": true}')});
$node->safe_psql('a', q{SELECT outbox.emit('order', 'sick', 'order.confirmed', jsonb_build_object('after', i)) FROM generate_series(1, 5) i});
$node->safe_psql('a', q{SELECT outbox.emit('order', 'ill', 'order.confirmed', '{"poison": true}')});
$node->safe_psql('a', q{SELECT outbox.emit('order', 'ill', 'order.confirmed', jsonb_build_object('after', i)) FROM generate_series(1, 3) i});
emit(100, 20);
ok(poll_until($node, 'b',
	"SELECT string_agg(key || ':' || state || ':' || attempts, ',' ORDER BY id) FROM outbox.inbox_dead_letters WHERE state = 'dead'",
	'sick:dead:3,ill:dead:3', 30)
	  || poll_until($node, 'b',
		"SELECT string_agg(key || ':' || state || ':' || attempts, ',' ORDER BY key) FROM outbox.inbox_dead_letters WHERE state = 'dead'",
		'ill:dead:3,sick:dead:3', 5),
	'each poison message failed 3 times and is dead');
ok(poll_until($node, 'b',
	"SELECT string_agg(key || '=' || n, ',' ORDER BY key) FROM (SELECT key, count(*) n FROM outbox.inbox_dead_letters WHERE state = 'parked' GROUP BY key) p",
	'ill=3,sick=5', 30), 'the later messages of both keys are parked behind them');
is($node->safe_psql('b', "SELECT last_sqlstate, last_error FROM outbox.inbox_dead_letters WHERE key = 'sick' AND state = 'dead'"),
	'23514|poison for key sick', 'the dead letter keeps the error and its SQLSTATE');
my $healthy = $node->safe_psql('a', "SELECT count(*) FROM outbox.events WHERE aggregate_id NOT IN ('sick', 'ill')");
ok(poll_until($node, 'b',
	"SELECT count(DISTINCT event_id) FROM applied WHERE $from_a AND key NOT IN ('sick', 'ill')", $healthy, 30),
	'the other keys flow meanwhile');
is($node->safe_psql('b', "SELECT count(*) FROM applied WHERE key IN ('sick', 'ill')"), '0',
	'nothing of the parked keys was applied');
my $status5 = $node->safe_psql('b', 'SELECT failed >= 6, dead_letters, parked FROM outbox.subscription_status()');
is($status5, 't|2|8', 'subscription_status() counts the failures, dead letters and parked messages');

# the cure, then a replay: the dead one and its followers, in order
$node->safe_psql('b', "INSERT INTO cure VALUES ('sick')");
my $sick = $node->safe_psql('b', "SELECT id FROM outbox.inbox_dead_letters WHERE key = 'sick' AND state = 'dead'");
is($node->safe_psql('b', "SELECT outbox.inbox_replay('orders', $sick)"), '6', 'inbox_replay() queues the dead message and its 5 parked followers');
ok(poll_until($node, 'b', "SELECT string_agg(coalesce(payload->>'after', 'p'), ',' ORDER BY n) FROM applied WHERE key = 'sick'",
	'p,1,2,3,4,5', 30), 'the replayed key is applied in its order');
# discard: the poison is forgotten, its followers applied
my $ill = $node->safe_psql('b', "SELECT id FROM outbox.inbox_dead_letters WHERE key = 'ill' AND state = 'dead'");
is($node->safe_psql('b', "SELECT outbox.inbox_discard('orders', $ill)"), 't', 'inbox_discard() forgets the dead message');
$not_applied = "aggregate_id = 'ill' AND payload ? 'poison'";
ok(poll_until($node, 'b', "SELECT string_agg(payload->>'after', ',' ORDER BY n) FROM applied WHERE key = 'ill'",
	'1,2,3', 30), 'the messages parked behind it are applied in order');
is($node->safe_psql('b', 'SELECT count(*) FROM outbox.inbox_dead_letters'), '0', 'no dead letter is left');
is($node->safe_psql('b', "SELECT outbox.inbox_discard('orders', $ill)"), 'f', 'discarding it again does nothing');

# 6. a second subscription in the same group, under load: the partitions
# are shared, then handed back when it goes
$node->safe_psql('b', q{
SET ROLE app;
SELECT outbox.subscribe('orders-2', ARRAY['outbox.event.order'], 'public.apply(outbox.inbound_message)', group_id => 'orders');
});
my $script = PostgreSQL::Test::Utils::tempdir() . '/load.sql';
PostgreSQL::Test::Utils::append_to_file($script, q{\set k random(1, 30)
SELECT outbox.emit('order', 'o-' || :k, 'order.confirmed', '{"load": true}');
});
my $load = IPC::Run::start(
	[ 'pgbench', '--no-vacuum', '--client=2', '--time=12', '--rate=150', '-f', $script,
	  '-h', $node->host, '-p', $node->port, 'a' ],
	'>', \my $load_out, '2>', \my $load_err);
ok(poll_until($node, 'b', 'SELECT count(DISTINCT subscription) FROM outbox.subscription_lag()', '2', 30),
	'the group shares its partitions between the two subscriptions');
ok(poll_until($node, 'b', q{SELECT count(DISTINCT worker) >= 2 FROM applied WHERE payload ? 'load'}, 't', 30),
	'both workers apply messages');
sleep 3;
is($node->safe_psql('b', "SELECT outbox.unsubscribe('orders-2')"), 't', 'unsubscribe() ends the second one');
$load->finish;
like($load_out, qr/number of transactions actually processed: \d{3,}/, 'the load ran') or note $load_err;
ok(poll_until($node, 'b', 'SELECT count(*), count(DISTINCT subscription) FROM outbox.subscription_lag()', '4|1', 30),
	'its partitions went back to the first');
check_exactly_once('a rebalance under load');
is($node->safe_psql('b', "SELECT count(*) FROM outbox.subscriptions"), '1', 'one subscription is left');

# an unsubscribe and a subscribe in quick succession: the worker starts
# again with the row as it is now, and resumes from the group's offsets
$node->safe_psql('b', "SELECT outbox.unsubscribe('orders')");
$node->safe_psql('b', q{SET ROLE app;
SELECT outbox.subscribe('orders', ARRAY['outbox.event.order'], 'public.apply(outbox.inbound_message)', max_attempts => 3)});
my $t_resub = time();
ok(poll_until($node, 'b', 'SELECT count(*) FROM outbox.subscription_lag()', '4', 30),
	'the new worker has the 4 partitions again');
note sprintf('resubscribed: partitions assigned again after %.1f s', time() - $t_resub);
emit(50, 20);
check_exactly_once('unsubscribe, then subscribe again');

# start_from latest: what the topic held before is not applied, what comes
# after the worker joined is, across a restart before its first message
$kafka->command("create late 1");
for my $i (1 .. 5)
{
	run([ 'kcat', '-P', '-b', $kafka->bootstrap, '-t', 'late', '-k', 'early' ], '<', \"{\"i\": $i}") or die;
}
$node->safe_psql('b', q{SET ROLE app;
SELECT outbox.subscribe('late', ARRAY['late'], 'public.apply(outbox.inbound_message)', start_from => 'latest')});
ok(poll_until($node, 'b', "SELECT count(*) FROM outbox.subscription_lag() WHERE subscription = 'late'", '1', 30),
	'the latest-starting subscription has its partition');
is($node->safe_psql('b', "SELECT next_offset FROM outbox.inbox_offsets WHERE consumer_group = 'late'"), '5',
	'it recorded where it starts: after the 5 messages already there');
# a change of the row restarts the worker
$node->safe_psql('b', "UPDATE outbox.subscriptions SET batch_size = 100 WHERE name = 'late'");
for my $i (6 .. 8)
{
	run([ 'kcat', '-P', '-b', $kafka->bootstrap, '-t', 'late', '-k', 'later' ], '<', \"{\"i\": $i}") or die;
}
ok(poll_until($node, 'b', "SELECT string_agg(payload->>'i', ',' ORDER BY n) FROM applied WHERE topic = 'late'", '6,7,8', 30),
	'a restart (the row changed) before the first message loses none produced meanwhile');
$node->safe_psql('b', "SELECT outbox.unsubscribe('late')");

# 7. a hostile handler runs as its subscriber and cannot climb out of it
$kafka->command("create hostile 1");
$node->safe_psql('b', q{
CREATE FUNCTION public.climb(m outbox.inbound_message) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
	EXECUTE convert_from(m.value, 'UTF8');
END $$;
ALTER FUNCTION public.climb(outbox.inbound_message) OWNER TO app;
SET ROLE app;
SELECT outbox.subscribe('hostile', ARRAY['hostile'], 'public.climb(outbox.inbound_message)', max_attempts => 1, poison_policy => 'skip');
});
my @attacks = (
	'SET ROLE postgres',
	'SET SESSION AUTHORIZATION postgres',
	'RESET ROLE; ALTER ROLE app SUPERUSER',
	'ALTER ROLE app SUPERUSER',
	'SELECT count(*) FROM outbox.subscriptions',
	'UPDATE outbox.inbox_offsets SET next_offset = 0',
	'CREATE TEMP TABLE t (x int)',
	'SELECT set_config(\'search_path\', \'public\', false); ALTER ROLE app SUPERUSER');
for my $attack (@attacks)
{
	run([ 'kcat', '-P', '-b', $kafka->bootstrap, '-t', 'hostile', '-k', 'k' ], '<', \$attack)
	  or die 'kcat failed';
}
ok(poll_until($node, 'b', "SELECT count(*) FROM outbox.inbox_dead_letters WHERE subscription = 'hostile'",
	scalar(@attacks), 30), 'every attack of the hostile handler failed and was dead-lettered');
is($node->safe_psql('b', "SELECT string_agg(DISTINCT last_sqlstate, ',' ORDER BY last_sqlstate) FROM outbox.inbox_dead_letters WHERE subscription = 'hostile'"),
	'42501', 'each with insufficient_privilege');
is($node->safe_psql('b', "SELECT rolsuper FROM pg_roles WHERE rolname = 'app'"), 'f', 'the subscriber is still no superuser');
is($node->safe_psql('b', "SELECT count(*) FROM pg_roles WHERE rolname = 'app' AND rolsuper"), '0', 'and no role was changed');

# a dump restored into a new database brings the subscription, its offsets
# and dedupe rows, and its worker starts there
$node->safe_psql('b', "SELECT outbox.unsubscribe('hostile')");
$node->safe_psql('postgres', 'CREATE DATABASE c');
my $dump = $node->safe_psql('postgres', 'SELECT 1') && `pg_dump -h ${\$node->host} -p ${\$node->port} -d b`;
$node->safe_psql('c', $dump);
is($node->safe_psql('c', 'SELECT name, group_id FROM outbox.subscriptions'), 'orders|orders', 'the restore has the subscription');
is($node->safe_psql('c', 'SELECT count(*) > 0 FROM outbox.inbox_offsets'), 't', 'and its offsets');
ok(poll_until($node, 'postgres',
	"SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'outbox subscription' AND datname = 'c'", '1', 30),
	'the restored subscription has its worker');

done_testing();
