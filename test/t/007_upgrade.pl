# test/t/007_upgrade.pl: every released version upgrades, through the
# upgrade scripts, to a database equal to a fresh install of the current
# version, and a relay that publishes across the upgrade sends nothing twice.
# Both ways: ALTER EXTENSION UPDATE straight to the current version (the
# chain of scripts in one go), and one version at a time, each step equal
# to a fresh install of the version it reaches.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use FindBin;
use lib "$FindBin::RealBin/../perl";
use OutboxTest;

my ($current) = slurp_file('outbox.control') =~ /^default_version\s*=\s*'([^']+)'/m;
# every version with an install script, oldest first; the released ones are
# all but the current one
sub version_cmp
{
	my @a = split /\./, $a;
	my @b = split /\./, $b;
	return $a[0] <=> $b[0] || $a[1] <=> $b[1];
}
my @versions = sort version_cmp
  map { m{sql/outbox--(\d+\.\d+)\.sql$} ? $1 : () } glob('sql/outbox--*.sql');
is($versions[-1], $current, "the newest install script is the default version, $current");
my @released = grep { $_ ne $current } @versions;
ok(scalar(@released) >= 1, "released versions to upgrade from: @released");
# each step has its upgrade script
for my $i (1 .. $#versions)
{
	ok(-f "sql/outbox--$versions[$i - 1]--$versions[$i].sql",
		"an upgrade script from $versions[$i - 1] to $versions[$i]");
}

my $kafka = OutboxTest::Broker->start(brokers => 1);
# a relay per database: one per released version upgraded at once and one
# per version upgraded step by step, plus the fresh and the grants' ones
my $node = outbox_node('upgrade', $kafka,
	conf => "max_worker_processes = 40\noutbox.max_databases = 32");

# What a user of the extension's objects can observe, one line per fact
# (test/t/fingerprints/catalog.sql says which)
my $fingerprint_sql = slurp_file("$FindBin::RealBin/fingerprints/catalog.sql");

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

sub same_catalog
{
	my ($got, $want, $name) = @_;
	is_deeply($got, $want, $name)
	  or do {
		my %w = map { $_ => 1 } @$want;
		my %g = map { $_ => 1 } @$got;
		diag("only upgraded: $_") for grep { !$w{$_} } @$got;
		diag("only fresh: $_") for grep { !$g{$_} } @$want;
	  };
}

# the fingerprint of a fresh install of every version but the oldest
$node->safe_psql('postgres', 'CREATE DATABASE fresh');
my %fresh_of;
for my $v (@versions[ 1 .. $#versions - 1 ])
{
	$node->safe_psql('fresh', "CREATE EXTENSION outbox VERSION '$v'");
	$fresh_of{$v} = fingerprint('fresh');
	$node->safe_psql('fresh', 'DROP EXTENSION outbox');
}
$node->safe_psql('fresh', 'CREATE EXTENSION outbox');
is($node->safe_psql('fresh', "SELECT extversion FROM pg_extension WHERE extname = 'outbox'"),
	$current, "CREATE EXTENSION installs $current");
my $fresh = $fresh_of{$current} = fingerprint('fresh');
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

	same_catalog(fingerprint($db), $fresh, "$from: the upgraded catalog equals a fresh $current install");

	my @after = emit_n($db, "a$from", 200);
	my $msgs = wait_for_events($kafka, 'outbox.event.up', [ @before, @after ]);
	my $seen = event_ids_of($msgs);
	is(scalar(grep { $seen->{$_} != 1 } @before, @after), 0,
		"$from: after the upgrade the relay publishes the new events, and each of the 400 exactly once");
	is(relay_pid($node, $db), $pid, "$from: the same relay kept running across the upgrade");
}

# grants a site gave a monitoring role on status() and its view survive
# the update to the current version (status() is never dropped by one),
# and grants nobody gave are not invented
$node->safe_psql('postgres', 'CREATE ROLE watcher LOGIN');
$node->safe_psql('postgres', 'CREATE ROLE bystander LOGIN');
$node->safe_psql('postgres', 'CREATE DATABASE grants_kept');
$node->safe_psql(
	'grants_kept', qq{
CREATE EXTENSION outbox VERSION '$released[0]';
GRANT USAGE ON SCHEMA outbox TO watcher, bystander;
GRANT EXECUTE ON FUNCTION outbox.status() TO watcher;
GRANT SELECT ON outbox.status TO watcher;
ALTER EXTENSION outbox UPDATE;
});
is( $node->safe_psql(
		'grants_kept', q{
SELECT has_function_privilege('watcher', 'outbox.status()', 'EXECUTE'),
       has_table_privilege('watcher', 'outbox.status', 'SELECT'),
       has_function_privilege('bystander', 'outbox.status()', 'EXECUTE'),
       has_table_privilege('bystander', 'outbox.status', 'SELECT'),
       has_function_privilege('public', 'outbox.status()', 'EXECUTE')}),
	't|t|f|f|f',
	"$released[0] to $current: the grants on status() and its view are kept, and only those");
my ($ret, $out, $err) = $node->psql('grants_kept', 'SELECT count(*) FROM outbox.status',
	extra_params => [ '-U', 'watcher' ]);
is($out, '1', "$released[0] to $current: the monitoring role still reads status")
  or diag $err;

# subscriptions across the update to 1.8: the handler recorded by name
# becomes the function's OID (0 when it no longer resolves), with its
# owner; each consumer group with state gets its owner (the oldest
# subscription's, else the role that updates); 1.7's dedupe rows stay as
# they are, under their old consumer name
if (grep { $_ eq '1.7' } @released)
{
	$node->safe_psql('postgres', 'CREATE DATABASE subs_kept');
	$node->safe_psql(
		'subs_kept', q{
CREATE EXTENSION outbox VERSION '1.7';
CREATE ROLE subscriber;
CREATE ROLE planter;
CREATE FUNCTION public.keep(m outbox.inbound_message) RETURNS void LANGUAGE sql AS $$ SELECT $$;
CREATE FUNCTION public.planted(m outbox.inbound_message) RETURNS void LANGUAGE sql AS $$ SELECT $$;
ALTER FUNCTION public.planted(outbox.inbound_message) OWNER TO planter;
-- the rows 1.7's subscribe() wrote (this library's refuses to run on 1.7's objects)
INSERT INTO outbox.subscriptions (name, topics, handler, owner, group_id, created_at) VALUES
	('kept', ARRAY['t1'], 'public.keep(outbox.inbound_message)', 'subscriber', 'kept', now() - interval '2 s'),
	('lost', ARRAY['t2'], 'public.gone(outbox.inbound_message)', 'subscriber', 'lost', now() - interval '1 s'),
	('planted', ARRAY['t2'], 'public.planted(outbox.inbound_message)', 'subscriber', 'planted', now());
INSERT INTO outbox.inbox_offsets (consumer_group, topic, kafka_partition, next_offset) VALUES ('orphan', 't3', 0, 5);
INSERT INTO outbox.inbox (consumer, event_id) VALUES ('outbox:kept', 'f3000000-0000-7000-8000-000000000001');
});
	my (undef, undef, $err17) = $node->psql('subs_kept',
		q{SELECT outbox.subscribe('new', ARRAY['t1'], 'public.keep(outbox.inbound_message)')});
	like($err17, qr/ERROR:  the extension's SQL objects in this database are older than its library.*\n.*HINT:  Run ALTER EXTENSION outbox UPDATE/,
		'1.7 objects, this library: subscribe() asks for the update');
	$node->safe_psql('subs_kept', "ALTER EXTENSION outbox UPDATE TO '1.8'");
	is( $node->safe_psql(
			'subs_kept', q{
SELECT string_agg(s.name || ' ' || s.handler || ' ' || s.handler_owner::text, ', ' ORDER BY s.name)
  FROM outbox.subscriptions s}),
		'kept public.keep(outbox.inbound_message) ' . $node->safe_psql('subs_kept', 'SELECT current_user')
		  . ', lost public.gone(outbox.inbound_message) subscriber'
		  . ', planted public.planted(outbox.inbound_message) subscriber',
		'1.7 to 1.8: a handler owned by a superuser keeps its owner; one missing, or owned by a role the subscriber has no privileges of, is recorded as the subscriber\'s (refused until subscribed again)');
	is($node->safe_psql('subs_kept',
		q{SELECT string_agg(group_id || ' ' || owner::text, ', ' ORDER BY group_id) FROM outbox.inbox_groups}),
		'kept subscriber, lost subscriber, orphan ' . $node->safe_psql('subs_kept', 'SELECT current_user')
		  . ', planted subscriber',
		'1.7 to 1.8: each consumer group with state has its owner');
	is($node->safe_psql('subs_kept', q{SELECT count(*) FROM outbox.inbox WHERE consumer = 'outbox:kept'}), '1',
		'1.7 to 1.8: the unscoped dedupe rows are kept');
}

# one version at a time, from every released version more than one step
# behind, the relay publishing throughout
for my $i (0 .. $#versions - 2)
{
	my $from = $versions[$i];
	my $db = 'steps_' . ($from =~ tr/./_/r);
	$node->safe_psql('postgres', "CREATE DATABASE $db");
	$node->safe_psql($db, "CREATE EXTENSION outbox VERSION '$from'");
	my ($pid) = wait_for_relay($node, $db, 10);
	ok(defined $pid, "$from step by step: a relay runs");
	my @ids = emit_n($db, "s$from", 100);

	for my $to (@versions[ $i + 1 .. $#versions ])
	{
		$node->safe_psql($db, "ALTER EXTENSION outbox UPDATE TO '$to'");
		is($node->safe_psql($db, "SELECT extversion FROM pg_extension WHERE extname = 'outbox'"),
			$to, "$from step by step: ALTER EXTENSION outbox UPDATE TO '$to'");
		same_catalog(fingerprint($db), $fresh_of{$to},
			"$from step by step: at $to the catalog equals a fresh $to install");
		push @ids, emit_n($db, "s$from-$to", 100);
	}

	my $msgs = wait_for_events($kafka, 'outbox.event.up', \@ids);
	my $seen = event_ids_of($msgs);
	is(scalar(grep { $seen->{$_} != 1 } @ids), 0,
		"$from step by step: each of the " . scalar(@ids) . ' events is published exactly once');
	is(relay_pid($node, $db), $pid, "$from step by step: the same relay kept running");
}

done_testing();
