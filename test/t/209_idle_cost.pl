# test/t/209_idle_cost.pl: an idle relay costs little CPU (its safety poll
# opens no transaction while no transaction has ended), and the safety poll
# still finds an event row inserted without emit(), which wakes nobody.
# After outbox.kafka_idle_timeout the relay closes its producer (librdkafka's
# threads end); the next commit, or the safety poll, opens it again.

use strict;
use warnings;

use POSIX ();
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);

use FindBin;
use lib "$FindBin::RealBin/../perl";
use OutboxTest;

# threads of the relay process: 1 without a producer
sub threads
{
	my ($pid) = @_;
	opendir(my $dh, "/proc/$pid/task") or die "no /proc/$pid/task: $!";
	my $n = grep { /^\d+$/ } readdir($dh);
	closedir $dh;
	return $n;
}

# shared memory the relay maps, in kB: small pages (RssShmem) and huge
# pages (HugetlbPages, when the server got huge_pages)
sub shared_kb
{
	my ($pid) = @_;
	return proc_status_kb($pid, 'RssShmem') + (proc_status_kb($pid, 'HugetlbPages') // 0);
}

# CPU of the relay process, all its threads (librdkafka's too), in ms
sub cpu_ms
{
	my ($pid) = @_;
	open(my $fh, '<', "/proc/$pid/stat") or die "no /proc/$pid/stat: $!";
	my $stat = <$fh>;
	close $fh;
	my @f = split ' ', substr($stat, rindex($stat, ')') + 2);
	return ($f[11] + $f[12]) * 1000 / POSIX::sysconf(POSIX::_SC_CLK_TCK);
}

my $kafka = OutboxTest::Broker->start(brokers => 1);
# a 20 ms safety poll: 1,000 polls in the idle window below
# OUTBOX_TEST_HUGE_PAGES=on runs it on huge pages (the kernel must have
# them reserved: vm.nr_hugepages); otherwise the server's default, try
my $node = outbox_node('idle', $kafka,
	conf => "outbox.poll_interval = '20ms'"
	  . ($ENV{OUTBOX_TEST_HUGE_PAGES} ? "\nhuge_pages = $ENV{OUTBOX_TEST_HUGE_PAGES}" : ''));
$node->safe_psql('postgres', 'CREATE EXTENSION outbox');
my ($pid) = wait_for_relay($node, 'postgres', 10);
ok(defined $pid, 'a relay runs');

# one event first, so the producer is built and connected
my $id = $node->safe_psql('postgres',
	"SELECT outbox.emit('idle', '1', 'idle.first', '{}')");
wait_for_events($kafka, 'outbox.event.idle', [$id]);
sleep 2;

# 20 idle seconds, 1,000 safety polls.  Before, each poll ran its
# statements in a transaction: 540 ms of CPU over these 20 s on the
# project's machine; now 40 to 80 ms, mostly librdkafka's threads.  The
# machine is shared: the bound is generous.
my $idle_secs = 20;
my $cpu0 = cpu_ms($pid);
sleep $idle_secs;
my $used = cpu_ms($pid) - $cpu0;
note "relay CPU over $idle_secs idle seconds: $used ms";
cmp_ok($used, '<', 300,
	"an idle relay uses under 300 ms of CPU in $idle_secs s (used $used ms)");

# a row inserted without emit() wakes nobody: the safety poll finds it
my $quiet = $node->safe_psql('postgres',
	insert_event_sql('idle', '2', 'idle.quiet', "'{}'"));
wait_for_events($kafka, 'outbox.event.idle', [$quiet], 30);
pass('the safety poll publishes a row inserted without emit()');

# a drain maps shared buffers into the relay: 20,000 events of 1 kB
$node->safe_psql('postgres',
	"SELECT outbox.emit('bulk', (i % 100)::text, 'idle.bulk', jsonb_build_object('pad', repeat('x', 1000))) "
	  . "FROM generate_series(1, 20000) i");
$node->poll_query_until('postgres', "SELECT backlog = 0 FROM outbox.status()")
  or die "the bulk events were not published";
my $mapped = shared_kb($pid);
note "relay's shared memory mapped after the drain: $mapped kB (HugetlbPages "
  . (proc_status_kb($pid, 'HugetlbPages') // 'none') . ")";

# an idle producer is closed after outbox.kafka_idle_timeout
cmp_ok(threads($pid), '>', 1, 'the relay has librdkafka threads while its producer is open');
$node->safe_psql('postgres',
	"ALTER SYSTEM SET outbox.kafka_idle_timeout = '2s'; SELECT pg_reload_conf()");
my $closed = 0;
foreach (1 .. 100)
{
	last if ($closed = threads($pid) == 1);
	usleep(100_000);
}
ok($closed, 'after 2 s with nothing to publish the producer is closed: one thread left');
# and the relay hands back its mapping of the shared buffers: an idle
# wake-up costs more the more a process maps (virtual machines most).  It
# does so just after its producer's threads end, so give it a moment.
my $kept;
foreach (1 .. 50)
{
	last if ($kept = shared_kb($pid)) < $mapped - 15_000;
	usleep(100_000);
}
note "relay's shared memory mapped once closed: $kept kB (HugetlbPages "
  . (proc_status_kb($pid, 'HugetlbPages') // 'none') . ")";
cmp_ok($kept, '<', $mapped - 15_000,
	"closed for idleness, the relay unmaps the shared buffers it read ($mapped kB mapped, $kept kB left)");
is($node->safe_psql('postgres', 'SELECT state, brokers_up IS NULL FROM outbox.status()'),
	'running|t', 'status(): still running, brokers_up unknown without a producer');
is($node->safe_psql('postgres', "SELECT status FROM outbox.health()"),
	'ok', 'health(): ok');

# the next commit opens it again, and its event reaches Kafka
$id = $node->safe_psql('postgres',
	"SELECT outbox.emit('idle', '3', 'idle.after_close', '{}')");
wait_for_events($kafka, 'outbox.event.idle', [$id]);
pass('an event emitted after the producer closed is published');
cmp_ok(threads($pid), '>', 1, 'the producer is open again');

# closed again, a row that wakes nobody is still found by the safety poll
$closed = 0;
foreach (1 .. 100)
{
	last if ($closed = threads($pid) == 1);
	usleep(100_000);
}
ok($closed, 'closed again after 2 s idle');
$quiet = $node->safe_psql('postgres',
	insert_event_sql('idle', '4', 'idle.quiet_closed', "'{}'"));
wait_for_events($kafka, 'outbox.event.idle', [$quiet], 30);
pass('the safety poll publishes a quiet row while the producer is closed');

# 0 keeps it open: set while it is closed, it opens it again at once
$closed = 0;
foreach (1 .. 100)
{
	last if ($closed = threads($pid) == 1);
	usleep(100_000);
}
ok($closed, 'closed once more');
$node->safe_psql('postgres',
	"ALTER SYSTEM SET outbox.kafka_idle_timeout = 0; SELECT pg_reload_conf()");
my $open = 0;
foreach (1 .. 50)
{
	last if ($open = threads($pid) > 1);
	usleep(100_000);
}
ok($open, 'outbox.kafka_idle_timeout = 0 by reload opens the closed producer');
sleep 4;
cmp_ok(threads($pid), '>', 1, 'and keeps it open');

$node->stop;
$kafka->stop;
done_testing();
