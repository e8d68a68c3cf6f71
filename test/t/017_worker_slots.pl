# test/t/017_worker_slots.pl: subscription workers never keep a relay
# from its background worker slot, and one database cannot take every
# subscription worker.  With room for three outbox workers
# (max_worker_processes = 4, the launcher being one):
#   - a role fills database a with subscriptions; the workers that fit
#     start, health() names a subscription left without one and why;
#   - subscribe() past outbox.max_subscriptions_per_database gets 53400;
#   - database b gets the extension: the launcher stops a subscription
#     worker of a to make room, b's relay starts and publishes (read back
#     with kcat), and the log says so;
#   - with room for all, lowering outbox.max_subscriptions_per_database
#     at reload stops a's newest worker, and health() names the limit.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

# found without -I: PGXS resets PROVE_FLAGS after the Makefile sets it
use FindBin;
use lib "$FindBin::RealBin/../perl";
use OutboxTest;

my $kafka = OutboxTest::Broker->start(brokers => 1);
my $topic = 'outbox.event.order';
$kafka->command("create $topic 1");
# the outbox launcher and three workers: no parallel query, no logical
# replication launcher takes one of them
my $node = outbox_node('workerslots', $kafka, conf => q{
max_worker_processes = 4
max_logical_replication_workers = 0
max_parallel_workers = 0
outbox.max_subscriptions_per_database = 3
});

sub workers
{
	my ($type, $db) = @_;
	return $node->safe_psql('postgres',
		"SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'outbox $type' AND datname = '$db'");
}

$node->safe_psql('postgres', 'CREATE DATABASE a');
$node->safe_psql('a', 'CREATE EXTENSION outbox');
ok(defined wait_for_relay($node, 'a', 30), 'database a has its relay');

# --- a role fills database a
$node->safe_psql('a', q{
CREATE ROLE filler LOGIN;
GRANT USAGE ON SCHEMA outbox TO filler;
GRANT EXECUTE ON FUNCTION outbox.subscribe(text, text[], regprocedure, text, text, integer, text, integer) TO filler;
CREATE FUNCTION public.sink(m outbox.inbound_message) RETURNS void LANGUAGE sql AS 'SELECT';
GRANT EXECUTE ON FUNCTION public.sink(outbox.inbound_message) TO filler;
});
foreach my $s (1 .. 3)
{
	$node->safe_psql('a',
		"SET ROLE filler; SELECT outbox.subscribe('s$s', ARRAY['$topic'], 'public.sink(outbox.inbound_message)')");
}
ok(poll_until($node, 'postgres',
	"SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'outbox subscription' AND datname = 'a'", '2', 30),
	'two of the three subscriptions of a get a worker: the relay and they fill every slot');
ok(poll_until($node, 'a',
	"SELECT reason ~ '^subscription \"s3\" has no worker: no free background worker slot \\(max_worker_processes\\)'"
	  . " FROM outbox.health(max_age => '1 hour')", 't', 30),
	'health() names the subscription without a worker and why');
is($node->safe_psql('a', "SELECT status FROM outbox.health(max_age => '1 hour')"), 'warning',
	'health(): warning while it has waited less than max_age');
sleep(2);
is($node->safe_psql('a', "SELECT status FROM outbox.health(max_age => '1 s')"), 'critical',
	'health(): critical once it has waited longer than max_age');

# --- the per-database limit
my ($ret, $out, $err) = $node->psql('a',
	"SET ROLE filler; SELECT outbox.subscribe('s4', ARRAY['$topic'], 'public.sink(outbox.inbound_message)')",
	extra_params => [ '-v', 'VERBOSITY=verbose' ]);
isnt($ret, 0, 'a fourth subscription in a is refused');
like($err, qr/ERROR:  53400: too many subscriptions in database "a"/, 'with 53400, naming the database');
like($err, qr/DETAIL:  The database has 3 subscriptions and outbox\.max_subscriptions_per_database is 3\./,
	'the detail gives the count and the limit');
like($err, qr/HINT:  .*outbox\.max_subscriptions_per_database/, 'the hint names the setting');
is($node->safe_psql('a', 'SELECT count(*) FROM outbox.subscriptions'), '3', 'and nothing was written');

# --- a relay for database b: the subscription workers make room
my $offset = -s $node->logfile;
$node->safe_psql('postgres', 'CREATE DATABASE b');
$node->safe_psql('b', 'CREATE EXTENSION outbox');
ok(defined wait_for_relay($node, 'b', 60), 'database b gets its relay while a\'s subscriptions fill the slots');
ok(defined wait_for_log_match($node,
		qr/outbox stops the worker of subscription "s\d" of database "a": a relay needs its background worker slot/,
		$offset, 10),
	'the log says which subscription worker made room');
my $ids = $node->safe_psql('b', q{
SELECT string_agg(outbox.emit('order', 'o-' || g, 'order.confirmed', jsonb_build_object('g', g))::text, ',')
  FROM generate_series(1, 5) g});
my $msgs = wait_for_events($kafka, $topic, [ split /,/, $ids ], 30);
is(scalar(grep { $ids =~ /\Q$_->{headers}{id}\E/ } @$msgs), 5, 'b\'s relay publishes its events, read back with kcat');
ok(defined wait_for_relay($node, 'a', 5), 'a keeps its relay');
is(workers('subscription', 'a'), '1', 'one worker of a is left');
ok(poll_until($node, 'a',
	"SELECT reason ~ '^subscription \"s\\d\" has no worker: no free background worker slot \\(max_worker_processes\\), for \\d+ s; 1 more subscription has none'"
	  . " FROM outbox.health(max_age => '1 hour')", 't', 30),
	'health() in a names a subscription without a worker, and counts the others');
is($node->safe_psql('b', "SELECT status FROM outbox.health(max_age => '1 hour')"), 'ok',
	'health() in b: ok');

# --- room for everyone: the limit, lowered at reload, stops a worker
$node->append_conf('postgresql.conf', 'max_worker_processes = 12');
$node->restart;
ok(poll_until($node, 'postgres',
	"SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'outbox subscription' AND datname = 'a'", '3', 30),
	'with room for them, all three subscriptions of a have a worker');
$node->append_conf('postgresql.conf', 'outbox.max_subscriptions_per_database = 2');
$node->reload;
ok(poll_until($node, 'postgres',
	"SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'outbox subscription' AND datname = 'a'", '2', 30),
	'outbox.max_subscriptions_per_database lowered to 2: a runs two workers');
ok(poll_until($node, 'a',
	"SELECT reason ~ '^subscription \"s\\d\" has no worker: outbox\\.max_subscriptions_per_database \\(2\\) reached'"
	  . " FROM outbox.health(max_age => '1 hour')", 't', 30),
	'health() names the limit');
sleep(2);
is(workers('subscription', 'a'), '2', 'and the third is not started again');

$node->stop;
$kafka->stop;
done_testing();
