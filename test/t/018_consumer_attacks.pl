# test/t/018_consumer_attacks.pl: the subscription worker under attack.
# Database b subscribes; databases a and c write events.  Each part is an
# attack a hostile role (or an unlucky operator) can mount, and what the
# worker must do instead of what it did in 1.7:
#   1. a handler dropped and a same-named function planted by another role:
#      the worker holds the handler by OID and runs nothing;
#   2. a handler changed from SECURITY DEFINER to INVOKER: the next
#      message runs as the subscriber, not as the former definer; a change
#      of its owner stops the worker;
#   3. EXECUTE revoked from the subscriber, then inbox_discard() of a
#      poison message: its parked successors are not applied;
#   4. a writer choosing another topic's or database's event id: both
#      events are applied (dedupe is scoped by topic and origin), and a
#      real resend is still deduplicated;
#   5. a handler naming an unqualified table: the error recorded says why.
# Messages are produced by the relays of a and c, or by kcat.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run qw(run);

use FindBin;
use lib "$FindBin::RealBin/../perl";
use OutboxTest;

my $kafka = OutboxTest::Broker->start(brokers => 1);
$kafka->command("create $_ 1")
  for qw(attacks.h attacks.d attacks.r attacks.q outbox.event.ta outbox.event.tb outbox.event.tc);
my $node = outbox_node('attacks', $kafka,
	conf => "outbox.retry_backoff_min = '50ms'\noutbox.retry_backoff_max = '200ms'");
$node->safe_psql('postgres', "CREATE DATABASE $_") for qw(a b c);
$node->safe_psql($_, 'CREATE EXTENSION outbox') for qw(a b c);

$node->safe_psql(
	'b', q{
CREATE ROLE app;
CREATE ROLE mallory;
CREATE ROLE alice;
CREATE ROLE bob;
GRANT USAGE ON SCHEMA outbox TO app, mallory, alice, bob;
GRANT EXECUTE ON FUNCTION outbox.subscribe(text, text[], regprocedure, text, text, integer, text, integer),
	outbox.subscription_status() TO app;
CREATE TABLE sink (n bigserial PRIMARY KEY, sub text, key text, payload jsonb, who text);
GRANT ALL ON sink, sink_n_seq TO app, alice, bob;
-- what app keeps private
CREATE TABLE secret (s text);
INSERT INTO secret VALUES ('the subscriber''s secret');
GRANT SELECT ON secret TO app;
-- a schema where others may create functions too
CREATE SCHEMA shared;
GRANT USAGE, CREATE ON SCHEMA shared TO app, mallory, alice;
CREATE TABLE shared.loot (s text);
GRANT ALL ON shared.loot TO PUBLIC;
});

sub produce
{
	my ($topic, $key, $value) = @_;
	run([ 'kcat', '-P', '-b', $kafka->bootstrap, '-t', $topic, '-k', $key ], '<', \$value)
	  or die "kcat failed";
}

sub worker_count
{
	return $node->safe_psql('postgres',
		"SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'outbox subscription' AND datname = 'b'");
}

sub status_of
{
	my ($sub, $cols) = @_;
	return $node->safe_psql('b', "SELECT $cols FROM outbox.subscription_status() WHERE name = '$sub'");
}

# 1. the handler is held by OID: a planted function of the same name is
# never run
$node->safe_psql(
	'b', q{
SET ROLE app;
CREATE FUNCTION shared.handle(m outbox.inbound_message) RETURNS void LANGUAGE sql
AS $$ INSERT INTO public.sink (sub, key, payload, who) VALUES ('h', m.key, m.payload, current_user) $$;
SELECT outbox.subscribe('h', ARRAY['attacks.h'], 'shared.handle(outbox.inbound_message)');
});
produce('attacks.h', 'k', '{"n": 1}');
ok(poll_until($node, 'b', "SELECT count(*) FROM sink WHERE sub = 'h'", '1', 30), 'the handler applies a message');
# the drop is refused while the subscription holds it; a superuser gets
# past the event trigger as a replica session would
like(
	($node->psql('b', 'DROP FUNCTION shared.handle(outbox.inbound_message)'))[2],
	qr/because subscription "h" uses it as its handler/,
	'dropping the handler is refused');
$node->safe_psql('b',
	'SET session_replication_role = replica; DROP FUNCTION IF EXISTS shared.handle(outbox.inbound_message)');
$node->safe_psql(
	'b', q{
SET ROLE mallory;
CREATE FUNCTION shared.handle(m outbox.inbound_message) RETURNS void LANGUAGE sql
AS $$ INSERT INTO shared.loot SELECT s FROM public.secret $$;
GRANT EXECUTE ON FUNCTION shared.handle(outbox.inbound_message) TO PUBLIC;
});
# a change of the row starts the worker again, which looks the handler up
$node->safe_psql('b', "UPDATE outbox.subscriptions SET batch_size = 10 WHERE name = 'h'");
produce('attacks.h', 'k', '{"n": 2}');
ok(poll_until($node, 'b', q{SELECT last_error LIKE '%is owned by role "mallory", not by role "app"%' FROM outbox.subscription_status() WHERE name = 'h'},
	't', 30), 'the worker says whose function the name finds now');
sleep 2;
is($node->safe_psql('b', 'SELECT count(*) FROM shared.loot'), '0',
	'the planted function of the same name was not run as the subscriber');
is($node->safe_psql('b', "SELECT count(*) FROM sink WHERE sub = 'h'"), '1', 'and nothing else was applied');
$node->safe_psql('b', "DELETE FROM outbox.subscriptions WHERE name = 'h'");

# 2. SECURITY DEFINER turned INVOKER: the next message runs as the
# subscriber; then a change of owner stops the worker
$node->safe_psql(
	'b', q{
SET ROLE alice;
CREATE FUNCTION shared.definer(m outbox.inbound_message) RETURNS void LANGUAGE sql SECURITY DEFINER
AS $$ INSERT INTO public.sink (sub, key, payload, who) VALUES ('d', m.key, m.payload, current_user) $$;
RESET ROLE;
SET ROLE app;
SELECT outbox.subscribe('d', ARRAY['attacks.d'], 'shared.definer(outbox.inbound_message)');
});
produce('attacks.d', 'k', '{"n": 1}');
ok(poll_until($node, 'b', "SELECT string_agg(who, ',' ORDER BY n) FROM sink WHERE sub = 'd'", 'alice', 30),
	'a SECURITY DEFINER handler runs as its owner');
$node->safe_psql('b', 'ALTER FUNCTION shared.definer(outbox.inbound_message) SECURITY INVOKER');
produce('attacks.d', 'k', '{"n": 2}');
ok(poll_until($node, 'b', "SELECT string_agg(who, ',' ORDER BY n) FROM sink WHERE sub = 'd'", 'alice,app', 30),
	'made SECURITY INVOKER, the next message runs as the subscriber');
$node->safe_psql('b', 'ALTER FUNCTION shared.definer(outbox.inbound_message) OWNER TO bob');
produce('attacks.d', 'k', '{"n": 3}');
ok(poll_until($node, 'b', q{SELECT last_error LIKE '%handler shared.definer(outbox.inbound_message) is owned by role "bob", not by role "alice"%'
	FROM outbox.subscription_status() WHERE name = 'd'}, 't', 30),
	'a change of the handler\'s owner stops the worker, which says why');
is($node->safe_psql('b', "SELECT count(*) FROM sink WHERE sub = 'd'"), '2', 'the message after it is not applied');
$node->safe_psql('b', "DELETE FROM outbox.subscriptions WHERE name = 'd'");

# 3. EXECUTE revoked, then a discard: the parked successors wait
$node->safe_psql(
	'b', q{
CREATE FUNCTION shared.picky(m outbox.inbound_message) RETURNS void LANGUAGE plpgsql SECURITY DEFINER
AS $$
BEGIN
	IF (m.payload->>'poison')::boolean THEN
		RAISE EXCEPTION 'poison' USING ERRCODE = 'check_violation';
	END IF;
	INSERT INTO public.sink (sub, key, payload, who) VALUES ('r', m.key, m.payload, current_user);
END $$;
REVOKE ALL ON FUNCTION shared.picky(outbox.inbound_message) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION shared.picky(outbox.inbound_message) TO app;
SET ROLE app;
SELECT outbox.subscribe('r', ARRAY['attacks.r'], 'shared.picky(outbox.inbound_message)', max_attempts => 1);
});
produce('attacks.r', 'sick', '{"poison": true}');
produce('attacks.r', 'sick', qq({"after": $_})) for 1 .. 2;
produce('attacks.r', 'well', '{"fine": true}');
ok(poll_until($node, 'b', "SELECT count(*) FROM sink WHERE sub = 'r' AND key = 'well'", '1', 30),
	'the other key is applied');
ok(poll_until($node, 'b', "SELECT string_agg(state, ',' ORDER BY id) FROM outbox.inbox_dead_letters WHERE subscription = 'r'",
	'dead,parked,parked', 30), 'the poison message is dead and its successors parked');
$node->safe_psql('b', 'REVOKE EXECUTE ON FUNCTION shared.picky(outbox.inbound_message) FROM app');
$node->safe_psql('b',
	"SELECT outbox.inbox_discard('r', id) FROM outbox.inbox_dead_letters WHERE subscription = 'r' AND state = 'dead'");
ok(poll_until($node, 'b', q{SELECT last_error LIKE '%may not execute%' FROM outbox.subscription_status() WHERE name = 'r'},
	't', 30), 'the worker finds its owner may no longer run the handler');
sleep 2;
is($node->safe_psql('b', "SELECT count(*) FROM sink WHERE sub = 'r' AND key = 'sick'"), '0',
	'the parked successors were not applied through the revoked handler');
is($node->safe_psql('b', "SELECT count(*) FROM outbox.inbox_dead_letters WHERE subscription = 'r' AND state = 'parked'"),
	'2', 'they are still parked');
# the right given back: they are applied, in order
$node->safe_psql('b', 'GRANT EXECUTE ON FUNCTION shared.picky(outbox.inbound_message) TO app');
$node->safe_psql('b', "UPDATE outbox.subscriptions SET batch_size = 10 WHERE name = 'r'");
ok(poll_until($node, 'b', "SELECT string_agg(payload->>'after', ',' ORDER BY n) FROM sink WHERE sub = 'r' AND key = 'sick'",
	'1,2', 30), 'with the right back, the parked successors are applied in order');
$node->safe_psql('b', "DELETE FROM outbox.subscriptions WHERE name = 'r'");

# 4. dedupe scoped by topic and origin: a writer in a chooses the ids of
# c's events, on another topic and on the same topic
$node->safe_psql(
	'b', q{
CREATE FUNCTION shared.collect(m outbox.inbound_message) RETURNS void LANGUAGE sql
AS $$ INSERT INTO public.sink (sub, key, payload, who) VALUES ('s', m.topic || '/' || (m.payload->>'from'), m.payload, m.headers->>'origin') $$;
GRANT EXECUTE ON FUNCTION shared.collect(outbox.inbound_message) TO app;
SET ROLE app;
SELECT outbox.subscribe('s', ARRAY['outbox.event.ta', 'outbox.event.tb', 'outbox.event.tc'],
	'shared.collect(outbox.inbound_message)');
});
my $x = 'f2000000-0000-7000-8000-000000000001';
my $y = 'f2000000-0000-7000-8000-000000000002';
ok(defined wait_for_relay($node, $_, 30), "database $_ has its relay") for qw(a c);
$node->safe_psql('a', qq{SELECT outbox.emit('ta', 'k', 'forged', '{"from": "a"}', event_id => '$x')});
$node->safe_psql('a', qq{SELECT outbox.emit('tc', 'k', 'forged', '{"from": "a"}', event_id => '$y')});
$node->safe_psql('c', qq{SELECT outbox.emit('tb', 'k', 'real', '{"from": "c"}', event_id => '$x')});
$node->safe_psql('c', qq{SELECT outbox.emit('tc', 'k', 'real', '{"from": "c"}', event_id => '$y')});
ok(poll_until($node, 'b', "SELECT string_agg(key, ',' ORDER BY key) FROM sink WHERE sub = 's'",
	'outbox.event.ta/a,outbox.event.tb/c,outbox.event.tc/a,outbox.event.tc/c', 30),
	'events sharing an id on two topics, and from two databases on one topic, are all applied');
is($node->safe_psql('b', "SELECT string_agg(DISTINCT who, ',' ORDER BY who) FROM sink WHERE sub = 's'"),
	join(',', sort map { $node->safe_psql($_, 'SELECT origin FROM outbox.origin') } qw(a c)),
	'each message carries the origin of its database (outbox.origin)');
# the relays' own resend of the same events: the same topic, origin and id
$node->safe_psql($_, "SELECT outbox.replay(now() - interval '1 hour', now())") for qw(a c);
ok(poll_until($node, 'b', "SELECT deduplicated >= 4 FROM outbox.subscription_status() WHERE name = 's'", 't', 30),
	'a resend of the same events is deduplicated');
is($node->safe_psql('b', "SELECT count(*) FROM sink WHERE sub = 's'"), '4', 'and applied once each');

# 5. an unqualified name in a handler: the recorded error says why
$node->safe_psql(
	'b', q{
CREATE FUNCTION shared.careless(m outbox.inbound_message) RETURNS void LANGUAGE plpgsql
AS $$ BEGIN INSERT INTO sink (sub, key) VALUES ('q', m.key); END $$;
GRANT EXECUTE ON FUNCTION shared.careless(outbox.inbound_message) TO app;
SET ROLE app;
SELECT outbox.subscribe('q', ARRAY['attacks.q'], 'shared.careless(outbox.inbound_message)', max_attempts => 1);
});
produce('attacks.q', 'k', '{}');
ok(poll_until($node, 'b', "SELECT count(*) FROM outbox.inbox_dead_letters WHERE subscription = 'q'", '1', 30),
	'the message is dead-lettered');
like($node->safe_psql('b', "SELECT last_error FROM outbox.inbox_dead_letters WHERE subscription = 'q'"),
	qr/relation "sink" does not exist \(hint: a handler runs with an empty search_path: qualify every table/,
	'the dead letter\'s error says the handler runs with an empty search_path');
like(status_of('q', 'last_error'), qr/empty search_path/, 'so does subscription_status()');

done_testing();
