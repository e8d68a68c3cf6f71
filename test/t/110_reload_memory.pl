# test/t/110_reload_memory.pl: reloads do not make the relay grow.  The
# relay is reloaded 500 times; each time outbox.kafka_config alternates and
# the secrets file is rewritten (60 kB of properties), so each reload reads
# the file and rebuilds the producer.  What a reload and a rebuild allocate
# (the secrets text, copies of the settings, error strings) lives in memory
# contexts that are reset, so the relay's anonymous resident memory
# (RssAnon of /proc/<pid>/status) after 500 reloads stays within
# $GROWTH_LIMIT_MB of what it was after 50 (the first ones warm up
# librdkafka and the allocator).

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

my $GROWTH_LIMIT_MB = 8;
my $reloads = 500;
my $warmup = 50;

my $kafka = OutboxTest::Broker->start(brokers => 1);
my $node = outbox_node('reloadmem', $kafka);
my $include = $node->data_dir . '/relay_reload.conf';
my $secrets = $node->data_dir . '/kafka_secrets.conf';

# a settings file the test rewrites, and a large secrets file: librdkafka
# accepts sasl.password on a plaintext connection and does not use it
sub write_settings
{
	my ($i) = @_;
	my $linger = 1 + $i % 2;
	PostgreSQL::Test::Utils::append_to_file("$include.tmp",
		"outbox.kafka_config = '$OutboxTest::TEST_KAFKA_CONFIG;linger.ms=$linger'\n"
		  . "outbox.kafka_secrets_file = '$secrets'\n");
	rename("$include.tmp", $include) or die "rename: $!";
	my $text = "# rewritten for reload $i\n";
	$text .= "sasl.password=$i-" . ('s' x 4000) . "\n" foreach 1 .. 15;
	PostgreSQL::Test::Utils::append_to_file("$secrets.tmp", $text);
	rename("$secrets.tmp", $secrets) or die "rename: $!";
}

write_settings(0);
$node->append_conf('postgresql.conf', "include '$include'\n");
$node->restart;
$node->safe_psql('postgres', 'CREATE EXTENSION outbox');
my $pid = wait_for_relay($node, 'postgres', 30);
ok(defined $pid, 'the relay runs');
# it builds its producer when it has something to do
$node->safe_psql('postgres', "SELECT outbox.emit('mem', '1', 'mem.made', '{}')");
wait_for_messages($kafka, 'outbox.event.mem', 1);

sub rss_anon_kb { return proc_status_kb($pid, 'RssAnon'); }

# the server log, read as it grows
open(my $log, '<', $node->logfile) or die "log: $!";
seek($log, 0, 2);
my $partial = '';

sub rebuilt
{
	my $deadline = time() + 30;
	while (time() < $deadline)
	{
		while (my $line = <$log>)
		{
			$partial .= $line;
			next unless $partial =~ /\n\z/;
			my $whole = $partial;
			$partial = '';
			return 1 if $whole =~ /Kafka settings changed, rebuilding the producer/;
		}
		seek($log, 0, 1);    # clear EOF
		usleep(5_000);
	}
	return 0;
}

my ($after_warmup, $missed) = (undef, 0);
foreach my $i (1 .. $reloads)
{
	write_settings($i);
	kill 'HUP', $node->{_pid};
	$missed++ unless rebuilt();
	$after_warmup = rss_anon_kb() if $i == $warmup;
}
my $after_all = rss_anon_kb();
is($missed, 0, "each of the $reloads reloads rebuilt the producer");
is(relay_pid($node, 'postgres'), $pid, 'the same relay lived through them');
diag(sprintf('relay RssAnon after %d reloads: %.1f MB, after %d: %.1f MB',
		$warmup, $after_warmup / 1024, $reloads, $after_all / 1024));
cmp_ok(($after_all - $after_warmup) / 1024, '<', $GROWTH_LIMIT_MB,
	"from reload $warmup to $reloads the relay grows by less than $GROWTH_LIMIT_MB MB");

# and it still publishes
$node->safe_psql('postgres', "SELECT outbox.emit('mem', '1', 'mem.made', '{}')");
wait_for_messages($kafka, 'outbox.event.mem', 2);
pass('the relay publishes after the reloads');

done_testing();
