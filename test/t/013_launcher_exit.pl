# test/t/013_launcher_exit.pl: the launcher signs off in shared memory when
# it exits, however it exits, so that the launcher the postmaster starts
# next takes over instead of finding the place taken and exiting for good:
# after pg_terminate_backend (exit 1, restarted after 1 s) and after kill -9
# (a crash restart), a new launcher runs, no launcher says another one is
# running, the relay runs on, and a database that gets the extension later
# gets its relay at once (the new launcher's latch is the one woken).

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

my $kafka = OutboxTest::Broker->start(brokers => 1);
my $node = outbox_node('launcherexit', $kafka, conf => 'restart_after_crash = on');

sub launcher_pid
{
	return $node->safe_psql('postgres',
		"SELECT pid FROM pg_stat_activity WHERE backend_type = 'outbox launcher'");
}

# the pid of a launcher other than $old, waited for up to $timeout seconds
sub wait_for_new_launcher
{
	my ($old, $timeout) = @_;
	my $deadline = time() + $timeout;

	while (time() < $deadline)
	{
		my ($ret, $pid) = $node->psql('postgres',
			"SELECT pid FROM pg_stat_activity WHERE backend_type = 'outbox launcher'");
		return $pid if $ret == 0 && $pid ne '' && $pid ne $old;
		usleep(100_000);
	}
	return undef;
}

$node->safe_psql('postgres', 'CREATE DATABASE db1');
$node->safe_psql('db1', 'CREATE EXTENSION outbox');
my ($relay) = wait_for_relay($node, 'db1', 15);
ok(defined $relay, 'db1 has a relay');
my $start_offset = -s $node->logfile;

# --- pg_terminate_backend: the launcher exits 1; the postmaster restarts it
foreach my $round (1 .. 3)
{
	my $old = launcher_pid();
	my $offset = -s $node->logfile;
	last unless ok($old ne '', "terminate $round: a launcher runs");
	$node->safe_psql('postgres', "SELECT pg_terminate_backend($old)");
	my $new = wait_for_new_launcher($old, 10);
	ok(defined $new, "terminate $round: a new launcher runs");
	ok(defined wait_for_log_match($node, qr/outbox launcher started/, $offset, 10),
		"terminate $round: the new launcher signed on");
	is(relay_pid($node, 'db1'), $relay, "terminate $round: the relay runs on, adopted");
}

# --- kill -9: the postmaster restarts everything, shared memory included
my $old = launcher_pid();
my $offset = -s $node->logfile;
ok($old ne '' && kill('KILL', $old), 'the launcher is killed with SIGKILL');
ok(defined wait_for_log_match($node, qr/all server processes terminated; reinitializing/, $offset, 30),
	'the server does a crash restart');
my $new = wait_for_new_launcher($old, 30);
ok(defined $new, 'after the crash restart a new launcher runs');
my ($again) = wait_for_relay($node, 'db1', 30, $relay);
ok(defined $again, 'and db1 has a relay again');
ok(relay_state_is($node, 'db1', 'running'), 'which is running');

# --- the new launcher is the one probe requests wake
$node->safe_psql('postgres', 'CREATE DATABASE db2');
usleep(200_000);
my $t0 = time();
$node->safe_psql('db2', 'CREATE EXTENSION outbox');
my ($relay2, $waited) = wait_for_relay($node, 'db2', 15);
ok(defined $relay2, 'a database given the extension afterwards gets a relay');
cmp_ok(time() - $t0, '<', 5, 'at once: CREATE EXTENSION woke the new launcher');

unlike(slurp_file($node->logfile, $start_offset), qr/outbox launcher already running/,
	'no launcher ever found the place taken');

$node->stop;
$kafka->stop;
done_testing();
