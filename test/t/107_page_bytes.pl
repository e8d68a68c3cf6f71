# test/t/107_page_bytes.pl: a page is bounded by bytes as well as by
# events.  2,000 events of ~900 kB each (1.8 GB of payload, under the
# default outbox.batch_size of 5,000) drain completely and in order, in
# pages cut at outbox.batch_max_bytes (default 64MB), while the relay's
# anonymous memory stays under a fixed figure.
#
# The figure: RssAnon of /proc/<relay pid>/status (resident anonymous
# memory: the process heap, librdkafka's buffers and thread arenas; not
# shared_buffers, which is shared memory, nor mapped files), sampled every
# 20 ms during the drain.  Two pages (the one in hand and the one read
# ahead) of 64 MB each, librdkafka's copy of the page in hand and what the
# allocator keeps come to well under 512 MB; a page of all 2,000
# events would hold 1.8 GB of payload text alone.
#
# The mock broker keeps only ~5 MB per partition: the payload is one repeated
# character and the producer compresses with zstd, so every message stays
# on the broker to be read back (the relay still holds the 900 kB text).

use strict;
use warnings;

use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep time);

# found without -I: PGXS resets PROVE_FLAGS after the Makefile sets it
use FindBin;
use lib "$FindBin::RealBin/../perl";
use OutboxTest;

my $RSS_LIMIT_MB = 512;
my $events = 2000;
my $aggregates = 8;
my $pad = 900_000;
my $topic = 'outbox.event.blob';

my $kafka = OutboxTest::Broker->start(brokers => 1);
my $node = outbox_node(
	'pagebytes', $kafka,
	kafka_config =>
	  "$OutboxTest::TEST_KAFKA_CONFIG;message.max.bytes=2000000;compression.type=zstd",
	conf => qq{
outbox.max_payload_bytes = '2MB'
outbox.enabled = off
});
$node->safe_psql('postgres', 'CREATE EXTENSION outbox');
my $pid = wait_for_relay($node, 'postgres', 30);
ok(defined $pid, 'the relay runs');
my (undef, $bound) = $node->psql('postgres', 'SHOW outbox.batch_max_bytes');
is($bound, '64MB', 'outbox.batch_max_bytes defaults to 64MB');

# the relay is paused: the whole backlog waits, then drains in full pages
for (my $from = 1; $from <= $events; $from += 100)
{
	my $to = $from + 99;
	$node->safe_psql('postgres',
		"SELECT count(outbox.emit('blob', (i % $aggregates)::text, 'blob.made',"
		  . " jsonb_build_object('n', i, 'pad', repeat('x', $pad))))"
		  . " FROM generate_series($from, $to) i");
}
is($node->safe_psql('postgres', 'SELECT count(*) FROM outbox.events'),
	$events, "$events events of ~900 kB are waiting");

sub rss_anon_kb { return proc_status_kb($pid, 'RssAnon'); }

my $idle_kb = rss_anon_kb();
ok(defined $idle_kb, "the relay's anonymous memory can be read");

$node->safe_psql('postgres',
	'ALTER SYSTEM SET outbox.enabled = on; SELECT pg_reload_conf()');
my $peak_kb = 0;
my $deadline = time() + 300;
my $next_check = 0;
my $drained = 0;
while (time() < $deadline)
{
	my $kb = rss_anon_kb();
	$peak_kb = $kb if defined $kb && $kb > $peak_kb;
	if (time() >= $next_check)
	{
		$drained = $node->safe_psql('postgres',
			'SELECT published FROM outbox.status()') >= $events;
		last if $drained;
		$next_check = time() + 0.5;
	}
	usleep(20_000);
}
ok($drained, "the relay publishes all $events events");
is(relay_pid($node, 'postgres'), $pid, 'the same relay did it all');
diag(sprintf('relay RssAnon: %.0f MB idle, %.0f MB at the peak of the drain',
		$idle_kb / 1024, $peak_kb / 1024));
cmp_ok($peak_kb / 1024, '<', $RSS_LIMIT_MB,
	"the relay's anonymous memory stays under $RSS_LIMIT_MB MB while it drains 1.8 GB");

# an event larger than the bound goes alone, it does not stop the relay
$node->safe_psql('postgres',
	"ALTER SYSTEM SET outbox.batch_max_bytes = '512kB'; SELECT pg_reload_conf()");
$node->safe_psql('postgres',
	"SELECT count(outbox.emit('blob', 'solo', 'blob.made',"
	  . " jsonb_build_object('n', i, 'pad', repeat('x', $pad))))"
	  . " FROM generate_series(1, 3) i");
ok( poll_until(
		$node, 'postgres', 'SELECT published FROM outbox.status()',
		$events + 3, 60),
	'with outbox.batch_max_bytes below one event, events go out one by one');

# read back ids and headers only, with kcat
my ($out, $err) = ('', '');
IPC::Run::run(
	[
		'kcat', '-C', '-b', $kafka->bootstrap, '-t', $topic,
		'-o', 'beginning', '-e', '-q', '-f', '%p %o|%k|%h\n'
	],
	'<', \undef, '>', \$out, '2>', \$err, IPC::Run::timeout(120))
  or note "kcat: $err";
my (%ids, %seqs);
my $count = 0;
foreach my $line (split /\n/, $out)
{
	my ($p, $o, $key, $hdrs) = $line =~ /^(\d+) (\d+)\|([^|]*)\|(.*)$/ or next;
	my ($id) = $hdrs =~ /(?:^|,)id=([0-9a-f-]{36})/;
	my ($seq) = $hdrs =~ /(?:^|,)seq=(\d+)/;
	$count++;
	$ids{$id}++ if defined $id;
	push @{ $seqs{$key} }, $seq;
}
is($count, $events + 3, 'kcat reads back every message');
is(scalar(keys %ids), $events + 3, 'with as many distinct event ids');
my $ordered = 1;
foreach my $agg (0 .. $aggregates - 1)
{
	my @got = @{ $seqs{$agg} // [] };
	my @want = (1 .. $events / $aggregates);
	$ordered = 0 unless "@got" eq "@want";
}
$ordered = 0 unless "@{ $seqs{solo} // [] }" eq '1 2 3';
ok($ordered, 'each aggregate arrives complete and in seq order');

done_testing();
