# test/t/012_pg_upgrade.pl: pg_upgrade from the lowest supported PostgreSQL
# to the one under test, with the extension and a backlog.  Afterwards the
# relay publishes the backlog exactly once and resends nothing it had
# delivered before (read back with kcat).
#
# pg_upgrade carries the transaction counter over, so the relay's progress
# row (snapshots of transaction ids) stays valid: nothing is adopted.
#
# Needs the older version's binaries, with outbox installed for it, beside
# the newer ones: OUTBOX_UPGRADE_FROM names that installation's directory
# (its bin/ and lib/, as /usr/lib/postgresql/15).  test/run-tests provides it
# where the target version runs (17: Debian's 18.6 cannot restore 15.20's
# "pg_attver" column options, see test/run-tests), and skips this test in the
# other runs.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep time);

use FindBin;
use lib "$FindBin::RealBin/../perl";
use OutboxTest;

my $from = $ENV{OUTBOX_UPGRADE_FROM};
plan skip_all => 'OUTBOX_UPGRADE_FROM is not set (test/run-tests sets it in its pg_upgrade step)'
  unless $from;
die "OUTBOX_UPGRADE_FROM=$from has no bin/postgres" unless -x "$from/bin/postgres";

my $kafka = OutboxTest::Broker->start(brokers => 1);
my $topic = 'outbox.event.crate';

sub outbox_conf
{
	my ($node) = @_;
	my $boot = $kafka->bootstrap;
	$node->append_conf(
		'postgresql.conf', qq{
shared_preload_libraries = 'outbox'
outbox.kafka_brokers = '$boot'
outbox.kafka_config = '$OutboxTest::TEST_KAFKA_CONFIG'
outbox.poll_interval = '100ms'
max_worker_processes = 16
});
}

sub emit_n
{
	my ($node, $prefix, $n) = @_;
	my @ids;
	for my $i (1 .. $n)
	{
		push @ids, $node->safe_psql('shop',
			"SELECT outbox.emit('crate', '$prefix-" . ($i % 5) . "', 'crate.packed', '{\"i\": $i}')");
	}
	return @ids;
}

sub counts
{
	return event_ids_of(read_topic($kafka, $topic) // []);
}

# data checksums on both: 18's initdb turns them on by default, 15's not
my $old = PostgreSQL::Test::Cluster->new('old', install_path => $from);
$old->init(extra => ['--data-checksums']);
outbox_conf($old);
$old->start;
my $old_version = $old->safe_psql('postgres', 'SHOW server_version_num');

$old->safe_psql('postgres', 'CREATE DATABASE shop');
$old->safe_psql('shop', 'CREATE EXTENSION outbox');
ok(defined(wait_for_relay($old, 'shop', 10)), "the old server ($old_version) runs a relay");
my @delivered = emit_n($old, 'd', 40);
wait_for_events($kafka, $topic, \@delivered);
pass('40 events are delivered before the upgrade');

$old->safe_psql('postgres', 'ALTER SYSTEM SET outbox.enabled = off');
$old->safe_psql('postgres', 'SELECT pg_reload_conf()');
ok(relay_state_is($old, 'shop', 'paused'), 'the relay is paused');
my @backlog = emit_n($old, 'b', 60);
is($old->safe_psql('shop', 'SELECT backlog >= 60 FROM outbox.status()'), 't',
	'60 events wait undelivered when the old server stops');
$old->stop;
# pg_upgrade starts the old server itself: no relay there meanwhile
$old->append_conf('postgresql.conf', "shared_preload_libraries = ''");

my $new = PostgreSQL::Test::Cluster->new('new');
$new->init(extra => ['--data-checksums']);
my $new_version = $new->config_data('--version');

my $workdir = PostgreSQL::Test::Utils::tempdir('upgrade');
{
	# the old binaries find the libraries their release had and this one
	# lacks in their own lib/ (test/run-tests copies them there)
	local $ENV{LD_LIBRARY_PATH} = join(':', "$from/lib", $ENV{LD_LIBRARY_PATH} // ());
	chdir $workdir or die "chdir $workdir: $!";
	$new->command_ok(
		[
			'pg_upgrade', '--no-sync',
			'-d', $old->data_dir, '-D', $new->data_dir,
			'-b', "$from/bin", '-B', $new->config_data('--bindir'),
			'-s', $new->host, '-p', $old->port, '-P', $new->port,
		],
		"pg_upgrade from $old_version to $new_version")
	  or diag(join('', map { "=== $_\n" . slurp_file($_) }
		  glob($new->data_dir . '/pg_upgrade_output.d/*/log/pg_upgrade_dump_*.log')));
	chdir $FindBin::RealBin;
}

# the new server runs the relay, with outbox.enabled back to its default
outbox_conf($new);
$new->start;
my ($version) = slurp_file("$FindBin::RealBin/../../outbox.control") =~ /^default_version\s*=\s*'([^']+)'/m;
is($new->safe_psql('shop', "SELECT extversion FROM pg_extension WHERE extname = 'outbox'"),
	$version, "the upgraded database has outbox $version");
is($new->safe_psql('shop', 'SELECT count(*) FROM outbox.events'), '100',
	'the 100 events are in the upgraded cluster');
ok(defined(wait_for_relay($new, 'shop', 10)), 'the upgraded server runs a relay');

my %want = map { $_ => 1 } @delivered, @backlog;
my $deadline = time() + 60;
my $c = {};
while (time() < $deadline)
{
	$c = counts();
	last unless grep { ($c->{$_} // 0) < 1 } @backlog;
	usleep(300_000);
}
is(scalar(grep { ($c->{$_} // 0) >= 1 } @backlog), 60,
	'the 60 backlog events are published after the upgrade');
# a wrong resend would show up in this time
ok(poll_until($new, 'shop', 'SELECT backlog FROM outbox.status()', '0', 10),
	'status() shows no backlog');
usleep(1_500_000);
$c = counts();
my @wrong = grep { ($c->{$_} // 0) != 1 } keys %want;
is(scalar(@wrong), 0,
	'each of the 100 events is in Kafka exactly once: backlog once, nothing delivered before resent')
  or diag(join("\n", map { "$_: " . ($c->{$_} // 0) . ' times' } @wrong[ 0 .. ($#wrong < 9 ? $#wrong : 9) ]));
unlike(slurp_file($new->logfile), qr/adopted restored events/,
	'the relay adopted nothing: its progress row is still valid');

# and it goes on with new events
my @after = emit_n($new, 'a', 10);
wait_for_events($kafka, $topic, \@after);
pass('new events after the upgrade are published');

$new->stop;
done_testing();
