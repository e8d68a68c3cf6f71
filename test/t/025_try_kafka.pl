# test/t/025_try_kafka.pl: test/try-kafka, the Kafka for trying outbox by
# hand, does what its usage says: start prints the bootstrap address and
# the postgresql.conf line, a server given that line publishes to it, a
# second broker on the same port is refused with a way out, status tells,
# and stop ends the process by the pid it recorded.

use strict;
use warnings;

use IO::Socket::INET;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use FindBin;
use lib "$FindBin::RealBin/../perl";
use OutboxTest;

my $try = "$FindBin::RealBin/../try-kafka";
my $dir = PostgreSQL::Test::Utils::tempdir();

# a loopback port nobody listens on now
my $probe = IO::Socket::INET->new(Listen => 1, LocalAddr => '127.0.0.1:0')
  or die "no free port: $!";
my $port = $probe->sockport;
close $probe;

sub try_kafka
{
	my ($state_dir, @args) = @_;
	local $ENV{OUTBOX_TRY_KAFKA_DIR} = $state_dir;
	my ($out, $err) = ('', '');
	IPC::Run::run([ $try, @args ], '<', \undef, '>', \$out, '2>', \$err);
	return ($? >> 8, $out, $err);
}

my ($rc, $out, $err) = try_kafka($dir, 'status');
is($rc, 3, 'status before start: not running (exit 3)');

($rc, $out, $err) = try_kafka($dir, 'start', '--port', $port);
is($rc, 0, 'start succeeds') or diag $err;
my $address = "127.0.0.1:$port";
like($out, qr/^bootstrap address: \Q$address\E$/m, 'start prints the bootstrap address');
like($out, qr/^outbox\.kafka_brokers = '\Q$address\E'$/m, 'and the postgresql.conf line');
chomp(my $pid = slurp_file("$dir/pid"));
sub broker_runs
{
	my $cmdline = -r "/proc/$pid/cmdline" ? slurp_file("/proc/$pid/cmdline") : '';
	return $cmdline =~ /outbox_test_broker/;
}
ok(broker_runs(), "the broker runs, its pid ($pid) recorded");

($rc, $out, $err) = try_kafka("$dir/other", 'start', '--port', $port);
is($rc, 1, 'a second broker on the same port is refused');
like($err, qr/Address already in use.*\n.*--port N/s, 'saying why, and how to choose another port');

($rc, $out) = try_kafka($dir, 'status');
is($rc, 0, 'status: running');
like($out, qr/\Q$address\E/, 'status names the address');

# a server set up with the printed line publishes to it
my $node = outbox_node('try', $address);
$node->safe_psql('postgres', 'CREATE EXTENSION outbox');
my $id = $node->safe_psql('postgres',
	q{SELECT outbox.emit('order', '42', 'order.confirmed', '{"total": 250}')});
my $msgs = wait_for_events($address, 'outbox.event.order', [$id]);
is($msgs->[0]{key}, '42', 'an event emitted is read back from it with kcat');
$node->stop;

($rc, $out) = try_kafka($dir, 'stop');
is($rc, 0, 'stop succeeds');
like($out, qr/stopped \(pid $pid\)/, 'stop names the pid it ended');
ok(!broker_runs(), 'the broker process is gone');
($rc) = try_kafka($dir, 'status');
is($rc, 3, 'status after stop: not running');
($rc, $out) = try_kafka($dir, 'stop');
is($rc, 0, 'stop when not running says so and succeeds');

done_testing();
