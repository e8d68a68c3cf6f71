# test/t/007_upgrade.pl: every released version upgrades, through the
# upgrade scripts, to a database equal to a fresh install of the current
# version, and a relay that publishes across the upgrade sends nothing twice.
# Both ways: ALTER EXTENSION UPDATE straight to the current version (the
# chain of scripts in one go), and one version at a time, each step equal
# to a fresh install of the version it reaches.
#
# Only 1.0 and the current version have a full install script: an older
# version installs as 1.0 and the upgrade scripts.  "Equal to a fresh
# install" of a released version means equal to the catalog fingerprint
# saved from that version's own full script (test/t/fingerprints/, which
# says how to regenerate the current version's).

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use FindBin;
use lib "$FindBin::RealBin/../perl";
use OutboxTest;

my ($current) = slurp_file('outbox.control') =~ /^default_version\s*=\s*'([^']+)'/m;
# every version, oldest first: 1.0, then where each upgrade script leads;
# the released ones are all but the current one
my %next = map { m{^sql/outbox--([\d.]+)--([\d.]+)\.sql$} ? ($1 => $2) : () } glob('sql/outbox--*--*.sql');
my @versions = ('1.0');
push @versions, $next{ $versions[-1] } while exists $next{ $versions[-1] } && @versions <= keys %next;
is($versions[-1], $current, "the upgrade scripts lead from 1.0 to the default version: @versions");
my @released = grep { $_ ne $current } @versions;
ok(scalar(@released) >= 1, "released versions to upgrade from: @released");

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

# the fingerprints saved for this PostgreSQL major, one per version
my $major = int($node->safe_psql('postgres', 'SHOW server_version_num') / 10000);
my $saved_dir = "$FindBin::RealBin/fingerprints/pg$major";
my %saved;
for my $v (@versions)
{
	my $file = "$saved_dir/outbox-$v.txt";
	ok(-f $file, "a fingerprint of $v is saved for PostgreSQL $major")
	  or diag("test/t/fingerprints/catalog.sql says how to make $file");
	$saved{$v} = -f $file ? [ split /\n/, slurp_file($file) ] : [];
}

# older versions install as 1.0 and the upgrade scripts: no stale full
# script of theirs (from an earlier make install) is in the way
my $extdir = $node->config_data('--sharedir') . '/extension';
for my $v (@versions[ 1 .. $#versions - 1 ])
{
	ok(!-e "$extdir/outbox--$v.sql", "no full install script of $v is installed")
	  or diag("remove $extdir/outbox--$v.sql, left by an older make install");
}

sub emit_n
{
	my ($db, $prefix, $n) = @_;
	return split /\n/, $node->safe_psql($db,
		"SELECT outbox.emit('up', '$prefix-' || (g % 5), 'up.happened', jsonb_build_object('g', g)) "
		  . "FROM generate_series(1, $n) g");
}

# same_catalog(got, want, name [, got_is, want_is]): the facts of got equal
# those of want; when not, each fact only one of them has is reported as
# "only <got_is>" or "only <want_is>" ("upgraded" and "fresh" by default)
sub same_catalog
{
	my ($got, $want, $name, $got_is, $want_is) = @_;
	is_deeply($got, $want, $name)
	  or do {
		my %w = map { $_ => 1 } @$want;
		my %g = map { $_ => 1 } @$got;
		diag('only ' . ($got_is // 'upgraded') . ": $_") for grep { !$w{$_} } @$got;
		diag('only ' . ($want_is // 'fresh') . ": $_") for grep { !$g{$_} } @$want;
		return 0;
	  };
	return 1;
}

# as_saved(db, version, name): db's catalog equals the fingerprint saved for
# version; when not, db's is written beside the TAP log for review
sub as_saved
{
	my ($db, $v, $name) = @_;
	my $got = fingerprint($db);
	return 1
	  if same_catalog($got, $saved{$v}, $name, "in $db", "in pg$major/outbox-$v.txt");
	my $file = "$PostgreSQL::Test::Utils::log_path/fingerprint-pg$major-outbox-$v-$db.txt";
	open(my $fh, '>', $file) or die "could not write $file: $!";
	print $fh map { "$_\n" } @$got;
	close($fh);
	diag("the fingerprint of $db is in $file");
	return 0;
}

# a fresh install of each version, older ones through 1.0's script and the
# upgrade scripts, equals the fingerprint saved from its own full script
$node->safe_psql('postgres', 'CREATE DATABASE fresh');
for my $v (@released)
{
	$node->safe_psql('fresh', "CREATE EXTENSION outbox VERSION '$v'");
	as_saved('fresh', $v, "CREATE EXTENSION outbox VERSION '$v' equals the fingerprint saved for $v");
	$node->safe_psql('fresh', 'DROP EXTENSION outbox');
}
$node->safe_psql('fresh', 'CREATE EXTENSION outbox');
is($node->safe_psql('fresh', "SELECT extversion FROM pg_extension WHERE extname = 'outbox'"),
	$current, "CREATE EXTENSION installs $current");
as_saved('fresh', $current, "a fresh $current install equals the fingerprint saved for $current");
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
		as_saved($db, $to, "$from step by step: at $to the catalog equals a fresh $to install");
		push @ids, emit_n($db, "s$from-$to", 100);
	}

	my $msgs = wait_for_events($kafka, 'outbox.event.up', \@ids);
	my $seen = event_ids_of($msgs);
	is(scalar(grep { $seen->{$_} != 1 } @ids), 0,
		"$from step by step: each of the " . scalar(@ids) . ' events is published exactly once');
	is(relay_pid($node, $db), $pid, "$from step by step: the same relay kept running");
}

done_testing();
