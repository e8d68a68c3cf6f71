# test/t/007_upgrade.pl: every released version upgrades, through the
# upgrade scripts, to a database equal to a fresh install of the current
# version, and a relay that publishes across the upgrade sends nothing twice.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use FindBin;
use lib "$FindBin::RealBin/../perl";
use OutboxTest;

my ($current) = slurp_file('outbox.control') =~ /^default_version\s*=\s*'([^']+)'/m;
# every released version: the install scripts but the current one
my @released = sort grep { $_ ne $current }
  map { m{sql/outbox--(\d+\.\d+)\.sql$} ? $1 : () } glob('sql/outbox--*.sql');
ok(scalar(@released) >= 1, "released versions to upgrade from: @released");

my $kafka = OutboxTest::Broker->start(brokers => 1);
my $node = outbox_node('upgrade', $kafka);

# What a user of the extension's objects can observe, one line per fact:
# functions with their attributes, settings and grants; tables, columns,
# defaults, constraints, indexes; views; comments; dump configuration;
# the rows the install scripts write.
my $fingerprint_sql = q{
WITH ext AS (SELECT oid, extconfig, extcondition FROM pg_extension WHERE extname = 'outbox'),
members AS (
	SELECT d.classid, d.objid FROM pg_depend d, ext
	 WHERE d.refclassid = 'pg_extension'::regclass AND d.refobjid = ext.oid AND d.deptype = 'e'
),
facts AS (
	SELECT 'function ' || p.oid::regprocedure || ' returns ' || pg_get_function_result(p.oid)
		|| ' lang ' || l.lanname || ' vol ' || p.provolatile::text || ' strict ' || p.proisstrict
		|| ' secdef ' || p.prosecdef || ' parallel ' || p.proparallel::text
		|| ' config ' || coalesce(array_to_string(p.proconfig, '|'), '-')
		|| ' acl ' || coalesce(p.proacl::text, '-')
		|| ' src ' || md5(p.prosrc)
		|| ' args ' || pg_get_function_arguments(p.oid)
		|| ' comment ' || coalesce(obj_description(p.oid, 'pg_proc'), '-') AS fact
	  FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
	 WHERE p.pronamespace = 'outbox'::regnamespace
	UNION ALL
	SELECT 'relation ' || c.oid::regclass || ' kind ' || c.relkind::text
		|| ' acl ' || coalesce(c.relacl::text, '-')
		|| ' comment ' || coalesce(obj_description(c.oid, 'pg_class'), '-')
		|| ' member ' || EXISTS (SELECT 1 FROM members m WHERE m.classid = 'pg_class'::regclass AND m.objid = c.oid)
		|| ' view ' || CASE WHEN c.relkind = 'v' THEN pg_get_viewdef(c.oid) ELSE '-' END
		|| ' index ' || CASE WHEN c.relkind = 'i' THEN pg_get_indexdef(c.oid) ELSE '-' END
	  FROM pg_class c WHERE c.relnamespace = 'outbox'::regnamespace
	UNION ALL
	SELECT 'column ' || a.attrelid::regclass || '.' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod)
		|| ' notnull ' || a.attnotnull || ' identity ' || a.attidentity::text
		|| ' default ' || coalesce(pg_get_expr(ad.adbin, ad.adrelid), '-')
		|| ' comment ' || coalesce(col_description(a.attrelid, a.attnum), '-')
	  FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
	  LEFT JOIN pg_attrdef ad ON ad.adrelid = a.attrelid AND ad.adnum = a.attnum
	 WHERE c.relnamespace = 'outbox'::regnamespace AND a.attnum > 0 AND NOT a.attisdropped
	UNION ALL
	SELECT 'constraint ' || co.conrelid::regclass || ' ' || co.conname || ' ' || pg_get_constraintdef(co.oid)
	  FROM pg_constraint co WHERE co.connamespace = 'outbox'::regnamespace
	UNION ALL
	SELECT 'type ' || t.oid::regtype || ' comment ' || coalesce(obj_description(t.oid, 'pg_type'), '-')
	  FROM pg_type t WHERE t.typnamespace = 'outbox'::regnamespace AND t.typrelid = 0
	  AND t.typelem = 0
	UNION ALL
	SELECT 'trigger ' || tg.tgrelid::regclass || ' ' || pg_get_triggerdef(tg.oid)
	  FROM pg_trigger tg JOIN pg_class c ON c.oid = tg.tgrelid
	 WHERE c.relnamespace = 'outbox'::regnamespace AND NOT tg.tgisinternal
	UNION ALL
	SELECT 'dumped ' || u.cfg::regclass || ' where ' || coalesce(nullif(u.cond, ''), '-')
	  FROM ext, unnest(ext.extconfig, ext.extcondition) AS u(cfg, cond)
	UNION ALL
	SELECT 'member ' || pg_describe_object(m.classid, m.objid, 0) FROM members m
	UNION ALL
	SELECT 'schema acl ' || coalesce(n.nspacl::text, '-') || ' owner super '
		|| (SELECT rolsuper FROM pg_roles WHERE oid = n.nspowner)
	  FROM pg_namespace n WHERE n.nspname = 'outbox'
)
SELECT fact FROM facts ORDER BY fact COLLATE "C"
};

sub fingerprint
{
	my ($db) = @_;
	return [ split /\n/, $node->safe_psql($db, $fingerprint_sql) ];
}

sub emit_n
{
	my ($db, $prefix, $n) = @_;
	return split /\n/, $node->safe_psql($db,
		"SELECT outbox.emit('up', '$prefix-' || (g % 5), 'up.happened', jsonb_build_object('g', g)) "
		  . "FROM generate_series(1, $n) g");
}

$node->safe_psql('postgres', 'CREATE DATABASE fresh');
$node->safe_psql('fresh', 'CREATE EXTENSION outbox');
is($node->safe_psql('fresh', "SELECT extversion FROM pg_extension WHERE extname = 'outbox'"),
	$current, "CREATE EXTENSION installs $current");
my $fresh = fingerprint('fresh');
ok(scalar(@$fresh) > 50, 'the fingerprint of a fresh install has ' . scalar(@$fresh) . ' facts');

for my $from (@released)
{
	my $db = 'from_' . ($from =~ tr/./_/r);
	$node->safe_psql('postgres', "CREATE DATABASE $db");
	$node->safe_psql($db, "CREATE EXTENSION outbox VERSION '$from'");
	my ($pid) = wait_for_relay($node, $db, 10);
	ok(defined $pid, "$from: a relay runs");

	my @before = emit_n($db, "b$from", 200);
	wait_for_events($kafka, 'outbox.event.up', \@before);
	pass("$from: events emitted before the upgrade are published");

	$node->safe_psql($db, 'ALTER EXTENSION outbox UPDATE');
	is($node->safe_psql($db, "SELECT extversion FROM pg_extension WHERE extname = 'outbox'"),
		$current, "$from: ALTER EXTENSION outbox UPDATE reaches $current");

	my $upgraded = fingerprint($db);
	is_deeply($upgraded, $fresh, "$from: the upgraded catalog equals a fresh $current install")
	  or do {
		my %f = map { $_ => 1 } @$fresh;
		my %u = map { $_ => 1 } @$upgraded;
		diag("only upgraded: $_") for grep { !$f{$_} } @$upgraded;
		diag("only fresh: $_") for grep { !$u{$_} } @$fresh;
	  };

	my @after = emit_n($db, "a$from", 200);
	my $msgs = wait_for_events($kafka, 'outbox.event.up', [ @before, @after ]);
	my $seen = event_ids_of($msgs);
	is(scalar(grep { $seen->{$_} != 1 } @before, @after), 0,
		"$from: after the upgrade the relay publishes the new events, and each of the 400 exactly once");
	is(relay_pid($node, $db), $pid, "$from: the same relay kept running across the upgrade");
}

done_testing();
