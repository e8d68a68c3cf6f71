# test/t/209_idle_cost.pl: an idle relay costs little CPU (its safety poll
# opens no transaction while no transaction has ended), and the safety poll
# still finds an event row inserted without emit(), which wakes nobody.

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
my $node = outbox_node('idle', $kafka, conf => "outbox.poll_interval = '20ms'");
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

$node->stop;
$kafka->stop;
done_testing();
