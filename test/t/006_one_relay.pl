# test/t/006_one_relay.pl: at most one relay per database, always.  The
# launcher is terminated three times while events flow: each time it comes
# back it adopts the relays still running instead of starting a second one
# per database; nothing is lost or sent twice; DROP DATABASE works after.

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

my $kafka = OutboxTest::Broker->start(brokers => 1);
my $node = outbox_node('onerelay', $kafka);

foreach my $db (qw(db1 db2))
{
	$node->safe_psql('postgres', "CREATE DATABASE $db");
	drill_setup($node, $db);
}
my %first;
foreach my $db (qw(db1 db2))
{
	($first{$db}) = wait_for_relay($node, $db, 30);
	ok(defined $first{$db}, "$db has a relay");
}

sub launcher_pid
{
	return $node->safe_psql('postgres',
		"SELECT pid FROM pg_stat_activity WHERE backend_type = 'outbox launcher'");
}

# relays per database as pg_stat_activity shows them: "db1=1,db2=1"
sub relay_census
{
	return $node->safe_psql(
		'postgres', q{
SELECT string_agg(d.datname || '=' || (SELECT count(*) FROM pg_stat_activity a
		WHERE a.backend_type = 'outbox relay' AND a.datid = d.oid), ','
	ORDER BY d.datname)
FROM pg_database d WHERE d.datname IN ('db1', 'db2')});
}

my $load1 = OutboxDrill::Load->start($node, 'db1', seconds => 20, rate => 100,
	prefix => 'one-');
my $load2 = OutboxDrill::Load->start($node, 'db2', seconds => 20, rate => 100,
	prefix => 'two-');
usleep(1_000_000);

my %census;
foreach my $incident (1 .. 3)
{
	my $old = launcher_pid();
	ok($old ne '', "incident $incident: a launcher runs");
	is($node->safe_psql('postgres', "SELECT pg_terminate_backend($old)"),
		't', "incident $incident: the launcher is terminated");

	# the postmaster restarts it after 1 s; watch for 4 s
	my $until = time() + 4;
	my $new = '';
	while (time() < $until)
	{
		$census{ relay_census() }++;
		$new = launcher_pid();
		usleep(50_000);
	}
	ok($new ne '' && $new ne $old, "incident $incident: a new launcher runs");
}
is_deeply([ keys %census ], ['db1=1,db2=1'],
	'exactly one relay per database at every look')
  or diag explain \%census;
foreach my $db (qw(db1 db2))
{
	is(relay_pid($node, $db), $first{$db},
		"$db keeps the relay it had: the new launchers adopted it");
}

$load1->finish;
$load2->finish;
foreach my $db (qw(db1 db2))
{
	my $ids = committed_ids($node, $db);
	my $msgs = wait_for_events($kafka, $DRILL_TOPIC,
		[ keys %$ids ]);
	my $prefix = $db eq 'db1' ? 'one-' : 'two-';
	my $fig = drill_figures(
		[ grep { ($_->{headers}{aggregate_id} // '') =~ /^$prefix/ } @$msgs ],
		$ids);
	report_figures("launcher terminated 3 times, $db", $fig);
	cmp_ok($fig->{committed}, '>', 1000, "$db: the load committed events");
	is(scalar(@{ $fig->{missing} }), 0, "$db: every committed event reached Kafka");
	is($fig->{duplicates}, 0, "$db: nothing was sent twice");
	is($fig->{order_violations}, 0, "$db: per-aggregate order kept");
}

# a relay that exits is restarted by the adopting launcher
my $pid1 = relay_pid($node, 'db1');
$node->safe_psql('postgres', "SELECT pg_terminate_backend($pid1)");
my ($again) = wait_for_relay($node, 'db1', 15, $pid1);
ok(defined $again, 'an adopted relay that stops is restarted');
is(relay_census(), 'db1=1,db2=1', 'still one relay per database');

# DROP DATABASE stops the adopted relay and goes through
my ($ret, $out, $err) = $node->psql('postgres', 'DROP DATABASE db2');
is($ret, 0, 'DROP DATABASE of a database whose relay was adopted succeeds')
  or diag $err;
ok(wait_for_no_relay($node, 'db2', 5), 'no relay is left for it');

$node->stop;
$kafka->stop;
done_testing();
