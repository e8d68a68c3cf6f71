# test/t/008_search_path_attack.pl: the extension's SECURITY DEFINER
# functions, and emit(), which switches to its owner itself, cannot be
# turned against it through the caller's search_path,
# and CREATE EXTENSION does not adopt a schema somebody prepared.
#
# The attack: a role with the README's grants and CREATE on a schema of its
# own defines operators there that, when run with a superuser's rights, make
# the role a superuser; it puts that schema first in its search_path and
# calls the function.  The role must stay unprivileged.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use FindBin;
use lib "$FindBin::RealBin/../perl";
use OutboxTest;

my $kafka = OutboxTest::Broker->start(brokers => 1);
my $node = outbox_node('attack', $kafka);

$node->safe_psql('postgres', 'CREATE DATABASE shop');
$node->safe_psql('shop', 'CREATE EXTENSION outbox');
ok(defined(wait_for_relay($node, 'shop', 10)), 'shop has a relay');

# the README's grants: a monitoring role, a writer role and a consumer role
$node->safe_psql(
	'shop', q{
CREATE ROLE monitoring LOGIN;
GRANT USAGE ON SCHEMA outbox TO monitoring;
GRANT EXECUTE ON FUNCTION outbox.status(), outbox.metrics(), outbox.health(interval), outbox.holds() TO monitoring;
GRANT EXECUTE ON FUNCTION outbox.subscription_status(), outbox.subscription_lag() TO monitoring;
GRANT SELECT ON outbox.status TO monitoring;
GRANT pg_monitor TO monitoring;
CREATE ROLE writer LOGIN;
GRANT USAGE ON SCHEMA outbox TO writer;
GRANT EXECUTE ON FUNCTION outbox.emit(text, text, text, jsonb, jsonb, text, text, uuid, integer, timestamptz) TO writer;
CREATE SCHEMA trap_monitoring AUTHORIZATION monitoring;
CREATE SCHEMA trap_writer AUTHORIZATION writer;
CREATE ROLE consumer LOGIN;
GRANT USAGE ON SCHEMA outbox TO consumer;
GRANT EXECUTE ON FUNCTION outbox.consume_once(text, uuid) TO consumer;
CREATE SCHEMA trap_consumer AUTHORIZATION consumer;
CREATE ROLE subscriber LOGIN;
GRANT USAGE ON SCHEMA outbox TO subscriber;
GRANT EXECUTE ON FUNCTION outbox.subscribe(text, text[], regprocedure, text, text, integer, text, integer),
	outbox.unsubscribe(text) TO subscriber;
CREATE SCHEMA trap_subscriber AUTHORIZATION subscriber;
CREATE FUNCTION trap_subscriber.apply(m outbox.inbound_message) RETURNS void LANGUAGE sql AS 'SELECT';
ALTER FUNCTION trap_subscriber.apply(outbox.inbound_message) OWNER TO subscriber;
});

# Operators shadowing the built-in ones a query could resolve through the
# search_path.  Each one tries to make its owner a superuser, which only
# works while it runs with the extension owner's rights; the attempt is
# recorded either way, so the test also sees whether a trap ran at all.
sub plant_traps
{
	my ($role) = @_;
	my $schema = "trap_$role";
	my $sql = "SET ROLE $role;\n";
	my @ops = (
		[ '=', 'text', 'text', 'boolean', 'a OPERATOR(pg_catalog.=) b' ],
		[ '<>', 'text', 'text', 'boolean', 'a OPERATOR(pg_catalog.<>) b' ],
		[ '=', 'uuid', 'uuid', 'boolean', 'a OPERATOR(pg_catalog.=) b' ],
		[ '=', 'bigint', 'bigint', 'boolean', 'a OPERATOR(pg_catalog.=) b' ],
		[ '=', 'oid', 'oid', 'boolean', 'a OPERATOR(pg_catalog.=) b' ],
		[ '+', 'bigint', 'integer', 'bigint', 'a OPERATOR(pg_catalog.+) b' ],
		[ '<', 'timestamptz', 'timestamptz', 'boolean', 'a OPERATOR(pg_catalog.<) b' ],
		[ '-', 'timestamptz', 'interval', 'timestamptz', 'a OPERATOR(pg_catalog.-) b' ],
		[ '-', 'timestamptz', 'timestamptz', 'interval', 'a OPERATOR(pg_catalog.-) b' ],
		[ '=', 'integer', 'integer', 'boolean', 'a OPERATOR(pg_catalog.=) b' ]);
	my $n = 0;
	for my $op (@ops)
	{
		my ($name, $l, $r, $ret, $body) = @$op;
		$n++;
		$sql .= qq{
CREATE FUNCTION $schema.trap$n(a $l, b $r) RETURNS $ret LANGUAGE plpgsql AS \$\$
BEGIN
	BEGIN
		EXECUTE 'ALTER ROLE $role SUPERUSER';
		RAISE WARNING 'trap $n ran as superuser';
	EXCEPTION WHEN insufficient_privilege THEN
		NULL;
	END;
	RETURN $body;
END
\$\$;
CREATE OPERATOR $schema.$name (LEFTARG = $l, RIGHTARG = $r, FUNCTION = $schema.trap$n);
};
	}
	$sql .= "RESET ROLE;\n";
	$node->safe_psql('shop', $sql);
}

# status() counts dead letters and held events: give its queries rows to compare
$node->safe_psql(
	'shop', q{
INSERT INTO outbox.held (id, topic, kafka_partition) VALUES (1, 'outbox.event.order', 0), (2, 'outbox.event.order', 1);
INSERT INTO outbox.dead_letters (event_id, event_pk, aggregate_type, aggregate_id, event_type, topic, state, envelope)
VALUES (outbox.uuid_v7(), 1, 'order', 'o-9', 'order.confirmed', 'outbox.event.order', 'quarantined', '{}'),
       (outbox.uuid_v7(), 2, 'order', 'o-9', 'order.confirmed', 'outbox.event.order', 'parked', '{}');
});

plant_traps('monitoring');
plant_traps('writer');
plant_traps('consumer');
plant_traps('subscriber');

sub is_superuser
{
	my ($role) = @_;
	return $node->safe_psql('shop', "SELECT rolsuper FROM pg_roles WHERE rolname = '$role'");
}

my @calls = (
	[ 'monitoring', 'outbox.status()', 'SELECT count(*) FROM outbox.status()' ],
	[ 'monitoring', 'the outbox.status view', 'SELECT count(*) FROM outbox.status' ],
	[ 'monitoring', 'outbox.metrics()', 'SELECT length(outbox.metrics()) > 0' ],
	[ 'monitoring', 'outbox.health()', "SELECT status FROM outbox.health('1 min')" ],
	[ 'monitoring', 'outbox.holds()', 'SELECT count(*) FROM outbox.holds()' ],
	[ 'monitoring', 'outbox.subscription_status()', 'SELECT count(*) FROM outbox.subscription_status()' ],
	[
		'writer', 'outbox.emit()',
		"SELECT outbox.emit('order', 'o-1', 'order.confirmed', '{\"total\": 1}') IS NOT NULL"
	],
	# the aggregate's counter row exists now: the direct update, then the
	# transaction's own count
	[
		'writer', 'outbox.emit() twice in a transaction',
		"BEGIN; SELECT outbox.emit('order', 'o-1', 'order.shipped', '{}') IS NOT NULL;"
		  . " SELECT outbox.emit('order', 'o-1', 'order.delivered', '{}') IS NOT NULL; COMMIT"
	],
	[ 'consumer', 'outbox.consume_once()', "SELECT outbox.consume_once('billing', gen_random_uuid())" ],
	[
		'subscriber', 'outbox.subscribe()',
		"SELECT outbox.subscribe('trap', ARRAY['t'], 'trap_subscriber.apply(outbox.inbound_message)') IS NULL"
	],
	[ 'subscriber', 'outbox.unsubscribe()', "SELECT outbox.unsubscribe('trap')" ]);

for my $call (@calls)
{
	my ($role, $what, $query) = @$call;
	my ($ret, $out, $err) = $node->psql(
		'shop',
		"SET search_path = trap_$role, pg_catalog, public; $query",
		extra_params => [ '-U', $role ]);
	is($ret, 0, "$role can call $what with a hostile search_path")
	  or diag($err);
	unlike($err, qr/ran as superuser/, "no operator of $role\'s ran with the owner's rights in $what");
	is(is_superuser($role), 'f', "$role is still not a superuser after calling $what");
	# put things back for the next call if the attack worked
	$node->safe_psql('shop', "ALTER ROLE $role NOSUPERUSER");
}

# emit() is not SECURITY DEFINER: it runs as its owner by itself, and pins
# search_path only for the statements it runs.  A superuser's index whose
# expression calls a function that resolves an operator through the
# search_path sends emit() to those statements, and the trap must not run
# there either; nor in the statements a trigger sends it to
$node->safe_psql(
	'shop', q{
CREATE FUNCTION public.is_x(t text) RETURNS boolean LANGUAGE sql IMMUTABLE AS $$ SELECT t = 'x' $$;
CREATE INDEX events_is_x ON outbox.events (public.is_x(aggregate_id));
CREATE INDEX aggregates_is_x ON outbox.aggregates (public.is_x(aggregate_id));
});
for my $agg ('o-2', 'o-2', 'o-3')
{
	my ($ret, $out, $err) = $node->psql(
		'shop',
		"SET search_path = trap_writer, pg_catalog, public;"
		  . " SELECT outbox.emit('order', '$agg', 'order.confirmed', '{}') IS NOT NULL",
		extra_params => [ '-U', 'writer' ]);
	is($ret, 0, "writer emits for $agg past an expression index, hostile search_path") or diag($err);
	unlike($err, qr/ran as superuser/, "no operator of writer's ran in the index expression ($agg)");
	is(is_superuser('writer'), 'f', "writer is still not a superuser ($agg)");
	$node->safe_psql('shop', "ALTER ROLE writer NOSUPERUSER");
}
$node->safe_psql(
	'shop', q{
DROP INDEX outbox.events_is_x, outbox.aggregates_is_x;
CREATE FUNCTION public.noop() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NEW; END $$;
CREATE TRIGGER noop BEFORE INSERT ON outbox.events FOR EACH ROW EXECUTE FUNCTION public.noop();
CREATE TRIGGER noop BEFORE UPDATE ON outbox.aggregates FOR EACH ROW EXECUTE FUNCTION public.noop();
});
for my $agg ('o-4', 'o-4')
{
	my ($ret, $out, $err) = $node->psql(
		'shop',
		"SET search_path = trap_writer, pg_catalog, public;"
		  . " SELECT outbox.emit('order', '$agg', 'order.confirmed', '{}') IS NOT NULL",
		extra_params => [ '-U', 'writer' ]);
	is($ret, 0, "writer emits for $agg through the statements a trigger sends emit() to") or diag($err);
	unlike($err, qr/ran as superuser/, "no operator of writer's ran in those statements ($agg)");
	is(is_superuser('writer'), 'f', "writer is still not a superuser ($agg)");
	$node->safe_psql('shop', "ALTER ROLE writer NOSUPERUSER");
}
# an emit() inside a trigger that emit()'s own INSERT fires: the inner
# call's pinned search_path is its own, and the caller's is back after both
$node->safe_psql(
	'shop', q{
CREATE FUNCTION public.echo() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF NEW.event_type = 'order.nested' THEN
		PERFORM outbox.emit('echo', NEW.aggregate_id, 'echo.of', '{}');
	END IF;
	RETURN NEW;
END $$;
CREATE TRIGGER echo AFTER INSERT ON outbox.events FOR EACH ROW EXECUTE FUNCTION public.echo();
});
{
	my ($ret, $out, $err) = $node->psql(
		'shop',
		"SET search_path = trap_writer, pg_catalog, public;"
		  . " BEGIN; SELECT outbox.emit('order', 'o-5', 'order.nested', '{}') IS NOT NULL;"
		  . " SHOW search_path; COMMIT",
		extra_params => [ '-U', 'writer' ]);
	is($ret, 0, 'writer emits through a trigger that emits in turn') or diag($err);
	is((split /\n/, $out)[-1], 'trap_writer, pg_catalog, public',
		"and the caller's search_path is its own again after both calls, in the same transaction");
	unlike($err, qr/ran as superuser/, "no operator of writer's ran in the nested calls");
	is(is_superuser('writer'), 'f', 'writer is still not a superuser (nested)');
	$node->safe_psql('shop', "ALTER ROLE writer NOSUPERUSER");
}
is($node->safe_psql('shop', "SELECT count(*) FROM outbox.events WHERE aggregate_type = 'echo' AND aggregate_id = 'o-5'"),
	'1', 'the trigger\'s own event is written');
$node->safe_psql('shop',
	'DROP TRIGGER noop ON outbox.events; DROP TRIGGER noop ON outbox.aggregates; DROP FUNCTION public.noop();'
	  . ' DROP TRIGGER echo ON outbox.events; DROP FUNCTION public.echo()');
is( $node->safe_psql(
		'shop',
		"SELECT string_agg(aggregate_id || ':' || seq, ',' ORDER BY id) FROM outbox.events WHERE aggregate_type = 'order' AND aggregate_id IN ('o-2', 'o-3', 'o-4', 'o-5')"
	),
	'o-2:1,o-2:2,o-3:1,o-4:1,o-4:2,o-5:1',
	'and every one of those events is written, numbered');

# the pinned setting is there for every SECURITY DEFINER function
is( $node->safe_psql(
		'shop', q{
SELECT string_agg(p.oid::regprocedure::text, ', ' ORDER BY p.oid::regprocedure::text)
  FROM pg_proc p
 WHERE p.pronamespace IN ('outbox'::regnamespace, 'outbox_internal'::regnamespace) AND p.prosecdef
   AND NOT coalesce(p.proconfig @> ARRAY['search_path=pg_catalog, pg_temp'], false)}),
	'',
	'every SECURITY DEFINER function of the extension pins search_path to pg_catalog, pg_temp');
ok( $node->safe_psql(
		'shop', q{
SELECT count(*) FROM pg_proc p
 WHERE p.pronamespace = 'outbox_internal'::regnamespace AND p.prosecdef}) > 0,
	'the check above covers the internal schema\'s SECURITY DEFINER functions');

# --- CREATE EXTENSION does not adopt a schema somebody else prepared
$node->safe_psql(
	'postgres', q{
CREATE ROLE squatter LOGIN;
CREATE DATABASE squat;
GRANT CREATE ON DATABASE squat TO squatter;
});
$node->safe_psql(
	'squat', q{
SET ROLE squatter;
CREATE SCHEMA outbox;
CREATE FUNCTION outbox.uuid_v7() RETURNS uuid LANGUAGE sql AS 'SELECT NULL::uuid';
RESET ROLE;
});
{
	my ($ret, $out, $err) = $node->psql('squat', 'CREATE EXTENSION outbox',
		extra_params => [ '-v', 'VERBOSITY=verbose' ]);
	isnt($ret, 0, 'CREATE EXTENSION refuses a schema "outbox" made by another role');
	like($err, qr/ERROR:  42501: schema "outbox" already exists and is not owned by a superuser/,
		'with 42501 and a message that says why');
}
$node->safe_psql('squat', 'DROP SCHEMA outbox CASCADE; CREATE SCHEMA outbox; CREATE TABLE outbox.events (x int)');
{
	my ($ret, $out, $err) = $node->psql('squat', 'CREATE EXTENSION outbox',
		extra_params => [ '-v', 'VERBOSITY=verbose' ]);
	isnt($ret, 0, 'CREATE EXTENSION refuses a schema "outbox" that already holds objects');
	like($err, qr/ERROR:  42P06: schema "outbox" already exists and is not empty/,
		'with 42P06');
}
$node->safe_psql('squat', 'DROP SCHEMA outbox CASCADE; CREATE SCHEMA outbox; GRANT CREATE ON SCHEMA outbox TO squatter');
{
	my ($ret, $out, $err) = $node->psql('squat', 'CREATE EXTENSION outbox',
		extra_params => [ '-v', 'VERBOSITY=verbose' ]);
	isnt($ret, 0, 'CREATE EXTENSION refuses an empty schema "outbox" another role may create objects in');
	like($err, qr/ERROR:  42501: schema "outbox" already exists and grants privileges to a role that is not a superuser/,
		'with 42501');
}
# the internal functions' schema is the extension's own, never adopted
$node->safe_psql('squat', q{
DROP SCHEMA outbox CASCADE; CREATE SCHEMA outbox;
SET ROLE squatter;
CREATE SCHEMA outbox_internal;
CREATE FUNCTION outbox_internal.notify_relay() RETURNS void LANGUAGE sql AS 'SELECT';
RESET ROLE;
});
{
	my ($ret, $out, $err) = $node->psql('squat', 'CREATE EXTENSION outbox',
		extra_params => [ '-v', 'VERBOSITY=verbose' ]);
	isnt($ret, 0, 'CREATE EXTENSION refuses a schema "outbox_internal" made beforehand');
	like($err, qr/ERROR:  42P06: schema "outbox_internal" already exists/, 'with 42P06');
}
$node->safe_psql('squat', 'DROP SCHEMA outbox_internal CASCADE');
# 1.0 adopted such a schema: updating to 1.1 refuses until it is fixed
$node->safe_psql('squat', 'DROP SCHEMA outbox CASCADE; CREATE SCHEMA outbox AUTHORIZATION squatter');
$node->safe_psql('squat', "CREATE EXTENSION outbox VERSION '1.0'");
{
	my ($ret, $out, $err) = $node->psql('squat', 'ALTER EXTENSION outbox UPDATE',
		extra_params => [ '-v', 'VERBOSITY=verbose' ]);
	isnt($ret, 0, 'updating a 1.0 install whose schema another role owns is refused');
	like($err, qr/ERROR:  42501: schema "outbox" is not owned by a superuser/, 'with 42501 and the fix in a hint');
}
$node->safe_psql('squat', 'ALTER SCHEMA outbox OWNER TO CURRENT_USER; GRANT CREATE ON SCHEMA outbox TO squatter');
{
	my ($ret, $out, $err) = $node->psql('squat', 'ALTER EXTENSION outbox UPDATE',
		extra_params => [ '-v', 'VERBOSITY=verbose' ]);
	isnt($ret, 0, 'updating a 1.0 install whose schema another role may create objects in is refused');
	like($err, qr/ERROR:  42501: a role that is not a superuser may create objects in schema "outbox"/, 'with 42501');
}
$node->safe_psql('squat', 'REVOKE CREATE ON SCHEMA outbox FROM squatter');
is($node->psql('squat', 'ALTER EXTENSION outbox UPDATE'), 0, 'once fixed, the update goes through');
$node->safe_psql('squat', 'DROP EXTENSION outbox');

# an empty schema a superuser made (pg_restore creates it before the
# extension) is accepted
$node->safe_psql('squat', 'DROP SCHEMA outbox CASCADE; CREATE SCHEMA outbox');
is($node->psql('squat', 'CREATE EXTENSION outbox'), 0,
	'an empty schema owned by a superuser is accepted, as pg_restore needs');

done_testing();
