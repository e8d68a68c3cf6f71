# test/t/011_hold_privileges.pl: the commands that need a database to
# themselves (DROP DATABASE, ALTER DATABASE ... RENAME or SET TABLESPACE,
# CREATE DATABASE ... TEMPLATE) stop its relay only when they will proceed.  A login role
# that may not run them, or a command inside a transaction block, leaves
# the relay alone: same pid all along, nothing sent twice, under load.

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
my $node = outbox_node('hold', $kafka);

$node->safe_psql('postgres', 'CREATE DATABASE shop');
drill_setup($node, 'shop');
# mallory may log in and nothing more; carol may create databases but
# neither owns shop nor may copy it (it is no template)
$node->safe_psql('postgres', q{
CREATE ROLE mallory LOGIN;
CREATE ROLE carol LOGIN CREATEDB;
});
my ($pid) = wait_for_relay($node, 'shop', 30);
ok(defined $pid, 'shop has a relay');

my $load = OutboxDrill::Load->start($node, 'shop', seconds => 25, rate => 100);
usleep(2_000_000);

my %pids = ($pid => 1);
my @refused;
my $check_pid = sub {
	my $p = relay_pid($node, 'shop');
	$pids{ $p // 'none' } = 1;
};

foreach my $round (1 .. 5)
{
	foreach my $cmd (
		[ 'mallory', 'DROP DATABASE shop' ],
		[ 'mallory', 'ALTER DATABASE shop RENAME TO x' ],
		[ 'mallory', 'CREATE DATABASE x TEMPLATE shop' ],
		[ 'mallory', 'ALTER DATABASE shop SET TABLESPACE pg_default' ],
		[ 'carol', 'CREATE DATABASE x TEMPLATE shop' ],
		[ 'carol', 'DROP DATABASE shop' ],
		# a superuser, but in a transaction block: refused as well
		[ undef, "BEGIN;\nDROP DATABASE shop;\nCOMMIT;" ],
		[ undef, "BEGIN;\nCREATE DATABASE x TEMPLATE shop;\nCOMMIT;" ])
	{
		my ($role, $sql) = @$cmd;
		my ($ret, $out, $err) =
		  $node->psql('postgres', $sql,
			defined $role ? (extra_params => [ '-U', $role ]) : ());
		push @refused, $err if $err =~ /ERROR/;
		$check_pid->();
	}
	# the hold lasted 10 s and the launcher restarts after 1 s: look for a
	# while between rounds
	my $until = time() + 1.5;
	while (time() < $until)
	{
		$check_pid->();
		usleep(100_000);
	}
}
is(scalar(@refused), 40, 'every one of the 40 commands was refused');
like(join('', @refused), qr/must be owner of database shop/, 'DROP: must be owner');
like(join('', @refused), qr/permission denied to create database/,
	'CREATE DATABASE without CREATEDB: permission denied');
like(join('', @refused), qr/permission denied to copy database "shop"/,
	'CREATE DATABASE with CREATEDB from a database one does not own: refused');
like(join('', @refused), qr/cannot run inside a transaction block/,
	'in a transaction block: refused');

$load->finish;
$check_pid->();
is_deeply([ sort keys %pids ], [$pid],
	'shop\'s relay kept its pid through all of it (never stopped, never missing)');

my $ids = committed_ids($node, 'shop');
my $msgs = wait_for_events($kafka, $DRILL_TOPIC, [ keys %$ids ]);
my $fig = drill_figures($msgs, $ids);
report_figures('refused commands', $fig);
cmp_ok($fig->{committed}, '>', 1000, 'the load committed events');
is(scalar(@{ $fig->{missing} }), 0, 'every committed event reached Kafka');
is($fig->{duplicates}, 0, 'nothing was sent twice');

# --- the owner's commands still proceed without waiting for the relay
$node->safe_psql('postgres', 'ALTER DATABASE shop OWNER TO carol');
my $t0 = time();
my ($ret, $out, $err) = $node->psql('postgres', 'ALTER DATABASE shop RENAME TO shop2',
	extra_params => [ '-U', 'carol' ]);
is($ret, 0, 'the owner (with CREATEDB) renames shop despite its relay') or diag $err;
($ret, $out, $err) = $node->psql('postgres', 'DROP DATABASE shop2',
	extra_params => [ '-U', 'carol' ]);
is($ret, 0, 'and drops it') or diag $err;
cmp_ok(time() - $t0, '<', 5, 'without waiting out the 5 s other sessions get');

$node->stop;
$kafka->stop;
done_testing();
