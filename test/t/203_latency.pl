# test/t/203_latency.pl: the publish latency percentiles of status() and
# the histogram of metrics() are plausible: small at light load, and at
# least the brokers' round trip when the brokers are slow (where the
# relay's first events also wait for librdkafka's topic lookup).

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

# found without -I: PGXS resets PROVE_FLAGS after the Makefile sets it
use FindBin;
use lib "$FindBin::RealBin/../perl";
use OutboxTest;

my $kafka = OutboxTest::Broker->start(brokers => 3);
my $node = outbox_node('latency', $kafka);

# created beforehand: the first produce to a new topic waits for its
# creation and metadata, which is no publish latency of the relay
$kafka->command('create outbox.event.ping 4');

# one database per load, so that each has its own relay and figures
foreach my $db (qw(light slow))
{
	$node->safe_psql('postgres', "CREATE DATABASE $db");
	$node->safe_psql($db, 'CREATE EXTENSION outbox');
	my ($pid) = wait_for_relay($node, $db, 30);
	ok(defined $pid, "the relay of database $db runs");
}

# a new producer's first messages wait for its connections; measure once
# it has them (brokers_up comes with librdkafka's statistics, every 5 s)
foreach my $db (qw(light slow))
{
	ok( poll_until(
			$node, $db, 'SELECT brokers_up >= 1 FROM outbox.status()', 't', 30),
		"the relay of database $db is connected to a broker");
}

# count single-event transactions, pause_s apart, from one session
sub emit_spaced
{
	my ($db, $count, $pause_s) = @_;
	$node->safe_psql(
		$db, qq{
DO \$\$
BEGIN
	FOR i IN 1..$count LOOP
		PERFORM outbox.emit('ping', 'p-' || i, 'ping.sent', jsonb_build_object('i', i));
		COMMIT;
		PERFORM pg_sleep($pause_s);
	END LOOP;
END
\$\$});
	my $ids = $node->safe_psql($db, 'SELECT event_id FROM outbox.events');
	return [ split /\n/, $ids ];
}

sub status_row
{
	my ($db) = @_;
	return query_json($node, $db, 'SELECT row_to_json(s) FROM outbox.status() s');
}

# le => cumulative count, plus _sum and _count, of the latency histogram
sub histogram
{
	my ($db) = @_;
	my %h;
	foreach my $line (split /\n/, $node->safe_psql($db, 'SELECT outbox.metrics()'))
	{
		if ($line =~ /^outbox_publish_latency_seconds_bucket\{.*le="([^"]+)"\} (\S+)$/)
		{
			$h{le}{$1} = $2;
		}
		elsif ($line =~ /^outbox_publish_latency_seconds_(sum|count)\{.*\} (\S+)$/)
		{
			$h{$1} = $2;
		}
	}
	return \%h;
}

# --- light load: 100 transactions 20 ms apart
#
# librdkafka 2.0 looks a topic it does not know yet up on a one-second
# timer, so a relay's first event of each topic waits about a second (and
# holds its page back).  One warm-up event takes that wait; the 100 events
# after it keep it above the 99th percentile of the 101 in the window.
my $warm = emit_spaced('light', 1, 0);
wait_for_events($kafka, 'outbox.event.ping', $warm);
ok(poll_until($node, 'light', 'SELECT published FROM outbox.status()', '1', 30),
	'the warm-up event is published');
my $ids = emit_spaced('light', 100, 0.02);
is(scalar(@$ids), 101, '100 more events emitted in database light');
wait_for_events($kafka, 'outbox.event.ping', $ids);
ok( poll_until(
		$node, 'light', 'SELECT published, backlog FROM outbox.status()', '101|0', 30),
	'all 101 are published');

my $s = status_row('light');
note sprintf('light load: p50 %.3f ms, p95 %.3f ms, p99 %.3f ms',
	map { $_ // -1 } @$s{qw(latency_p50_ms latency_p95_ms latency_p99_ms)});
cmp_ok($s->{latency_p50_ms} // 0, '>', 0, 'latency_p50_ms > 0');
cmp_ok($s->{latency_p50_ms} // 1e9, '<=', $s->{latency_p95_ms} // -1, 'p50 <= p95');
cmp_ok($s->{latency_p95_ms} // 1e9, '<=', $s->{latency_p99_ms} // -1, 'p95 <= p99');
cmp_ok($s->{latency_p99_ms} // 1e9, '<', 1000, 'latency_p99_ms < 1000');

my $h = histogram('light');
note 'light load histogram: ' . join(' ',
	map { "le=$_:$h->{le}{$_}" } sort { $a <=> $b } grep { $_ ne '+Inf' } keys %{ $h->{le} });
is($h->{count}, 101, 'metrics(): the latency histogram counts 101 events');
cmp_ok($h->{le}{1}, '>=', 100, 'metrics(): at least 100 of them under a second');
cmp_ok($h->{le}{'0.0001'}, '<', 101, 'metrics(): not all under 0.1 ms');
cmp_ok($h->{sum}, '>', 0, 'metrics(): the latency sum is positive');
cmp_ok($h->{sum} / 101, '<', 1, 'metrics(): the mean latency is under a second');

# --- slow brokers: every request takes 200 ms more
$kafka->command('rtt all 200');
$ids = emit_spaced('slow', 20, 0.02);
wait_for_events($kafka, 'outbox.event.ping', $ids);
ok( poll_until(
		$node, 'slow', 'SELECT published, backlog FROM outbox.status()', '20|0', 30),
	'with a 200 ms round trip, all 20 events of database slow are published');
my $slow = status_row('slow');
note sprintf('200 ms round trip: p50 %.3f ms, p95 %.3f ms, p99 %.3f ms',
	map { $_ // -1 } @$slow{qw(latency_p50_ms latency_p95_ms latency_p99_ms)});
cmp_ok($slow->{latency_p50_ms} // 0, '>=', 100,
	'latency_p50_ms reflects the round trip (>= 100 ms)');
cmp_ok($slow->{latency_p99_ms} // 1e9, '<', 5000, 'latency_p99_ms stays under 5 s');
$h = histogram('slow');
note 'slow histogram: ' . join(' ',
	map { "le=$_:$h->{le}{$_}" } sort { $a <=> $b } grep { $_ ne '+Inf' } keys %{ $h->{le} });
is($h->{count}, 20, 'metrics(): the slow histogram counts 20 events');
is($h->{le}{'0.1'}, 0, 'metrics(): none of them under 100 ms');
cmp_ok($h->{sum} / 20, '>=', 0.2, 'metrics(): their mean latency is at least 200 ms');

is_deeply(
	[ @{ status_row('light') }{qw(latency_p50_ms latency_p99_ms)} ],
	[ @$s{qw(latency_p50_ms latency_p99_ms)} ],
	'database light\'s percentiles are its own: unchanged by database slow');

$node->stop;
done_testing();
