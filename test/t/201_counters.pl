# test/t/201_counters.pl: after N events, status(), its view and metrics()
# count exactly N, their bytes are the payloads' JSON text, the backlog
# drains to 0; the relay logs one start line (hiding outbox.kafka_config)
# and nothing per event.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

# found without -I: PGXS resets PROVE_FLAGS after the Makefile sets it
use FindBin;
use lib "$FindBin::RealBin/../perl";
use OutboxTest;

my $topic = 'outbox.event.invoice';

# a secret librdkafka accepts on a plaintext connection (it is not used
# there), so the relay still publishes while we look for it in the log
my $secret = 'Hunter2-s3cret-value';
my $kafka = OutboxTest::Broker->start(brokers => 1);
my $node = outbox_node('counters', $kafka,
	kafka_config => "$OutboxTest::TEST_KAFKA_CONFIG;sasl.password=$secret");

$node->safe_psql('postgres', 'CREATE DATABASE billing');
$node->safe_psql('billing', 'CREATE EXTENSION outbox');
my ($pid) = wait_for_relay($node, 'billing', 30);
ok(defined $pid, 'the relay of database billing runs');

# the status row as a hash (numbers as Perl numbers, NULL as undef)
sub status_row
{
	my ($view) = @_;
	my $from = $view ? 'outbox.status s' : 'outbox.status() s';
	return query_json($node, 'billing', "SELECT row_to_json(s) FROM $from");
}

# metric name{labels} => value, from one call of outbox.metrics()
sub metric_values
{
	my %v;
	foreach my $line (split /\n/,
		$node->safe_psql('billing', 'SELECT outbox.metrics()'))
	{
		next if $line =~ /^#/;
		my ($key, $value) = $line =~ /^(\S+(?:\{.*\})?) (\S+)$/ or next;
		$v{$key} = $value;
	}
	return \%v;
}

my $before = status_row(0);
is($before->{state}, 'running', 'a fresh relay is running');
is($before->{published}, 0, 'nothing is published before the first emit');
ok(!defined $before->{oldest_pending_seconds},
	'oldest_pending_seconds is NULL when nothing is pending');

# 500 events in 5 transactions; payloads of varied length with non-ASCII
# text, so that bytes and characters differ
my $log_offset = -s $node->logfile;
foreach my $t (1 .. 5)
{
	$node->safe_psql(
		'billing', qq{
BEGIN;
SELECT count(outbox.emit('invoice', 'inv-' || (i % 17), 'invoice.issued',
	jsonb_build_object('n', i, 'memo', repeat('é-€', i % 23), 'txn', $t)))
  FROM generate_series(1, 100) i;
COMMIT;});
}
my $n = 500;
my $facts = query_json(
	$node, 'billing', q{
SELECT json_build_object('n', count(*),
	'bytes', sum(octet_length(payload::text)),
	'chars', sum(length(payload::text))) FROM outbox.events});
is($facts->{n}, $n, "$n events are in outbox.events");
isnt($facts->{bytes}, $facts->{chars},
	'the payloads have multibyte characters');

my $msgs = wait_for_messages($kafka, $topic, $n);
is(scalar(@$msgs), $n, "Kafka has the $n events");
my $kafka_bytes = 0;
$kafka_bytes += length($_->{value} // '') foreach @$msgs;
is($kafka_bytes, $facts->{bytes},
	'the bytes kcat read are the payloads\' JSON text');

ok( poll_until(
		$node, 'billing',
		'SELECT published, backlog FROM outbox.status()', "$n|0", 30),
	"status(): published reaches $n and backlog returns to 0");

my $s = status_row(0);
is($s->{published}, $n, "published = $n");
is($s->{published_bytes}, $facts->{bytes},
	'published_bytes = sum of the payloads\' JSON text lengths in bytes');
is($s->{published_last_minute}, $n, "published_last_minute = $n");
is($s->{bytes_last_minute}, $facts->{bytes},
	'bytes_last_minute = published_bytes: all of it in the last minute');
is($s->{backlog}, 0, 'backlog is 0 once drained');
ok(!defined $s->{oldest_pending_seconds},
	'oldest_pending_seconds is NULL once drained');
is($s->{state}, 'running', 'state is running');
is($s->{pid}, $pid, 'pid is the relay\'s pg_stat_activity pid');
is($s->{relay}, 'billing', 'relay names the database');
is($s->{brokers}, $kafka->bootstrap, 'brokers is outbox.kafka_brokers');
ok(defined $s->{last_delivery_at}, 'last_delivery_at is set');
is($s->{transient_failures} + $s->{permanent_failures} + $s->{fatal_failures},
	0, 'no delivery failures were counted');
is($s->{retries}, 0, 'no retries were counted');
is($s->{quarantined}, 0, 'nothing is quarantined');
ok(!defined $s->{last_error}, 'no last_error');
cmp_ok($s->{latency_p50_ms}, '>', 0, 'latency_p50_ms is positive');
cmp_ok($s->{latency_p50_ms}, '<=', $s->{latency_p95_ms}, 'p50 <= p95');
cmp_ok($s->{latency_p95_ms}, '<=', $s->{latency_p99_ms}, 'p95 <= p99');
is($s->{page_size}, 0, 'no page is in hand when idle');
ok(defined $s->{started_at}, 'started_at is set');

my $v = status_row(1);
delete $_->{oldest_pending_seconds} foreach ($s, $v);
is_deeply(
	[ map { $v->{$_} } qw(relay state pid published published_bytes backlog) ],
	[ map { $s->{$_} } qw(relay state pid published published_bytes backlog) ],
	'the view outbox.status shows the same figures');

my $m = metric_values();
is($m->{'outbox_published_total{database="billing"}'},
	$n, "metrics(): outbox_published_total = $n");
is($m->{'outbox_published_bytes_total{database="billing"}'},
	$facts->{bytes}, 'metrics(): outbox_published_bytes_total = the bytes');
is($m->{'outbox_backlog_events{database="billing"}'},
	0, 'metrics(): outbox_backlog_events = 0');
is($m->{'outbox_oldest_pending_seconds{database="billing"}'} + 0,
	0, 'metrics(): outbox_oldest_pending_seconds = 0 when drained');
is($m->{'outbox_publish_latency_seconds_count{database="billing"}'},
	$n, "metrics(): the latency histogram counts $n events");
is($m->{'outbox_relay_state{database="billing",state="running"}'},
	1, 'metrics(): outbox_relay_state is 1 for running');

# the other database has no relay: its own figures, not billing's
$node->safe_psql('postgres', 'CREATE EXTENSION outbox');
wait_for_relay($node, 'postgres', 30);
is( $node->safe_psql('postgres', 'SELECT published FROM outbox.status()'),
	'0', 'another database\'s status() does not count billing\'s events');

# --- the log
my $log = slurp_file($node->logfile);
my @started = $log =~ /(LOG:  outbox relay started for database "billing".*\n.*\n)/g;
is(scalar(@started), 1, 'exactly one "outbox relay started" line for billing');
like(
	$started[0] // '',
	qr/DETAIL:  brokers "\Q${\ $kafka->bootstrap }\E", batch_size \d+, poll_interval 100 ms, enabled on, .*kafka_config \(set, not shown\)/,
	'the start line shows the settings, and kafka_config as "(set, not shown)"'
);
unlike($log, qr/\Q$secret\E/,
	'the kafka_config secret appears nowhere in the server log');
unlike($s->{brokers} . ($s->{last_error} // ''),
	qr/\Q$secret\E/, 'nor in status()');

# nothing per event: the relay wrote (almost) nothing while publishing 500
my $segment = slurp_file($node->logfile, $log_offset);
my @relay_lines = grep { /\[$pid\]/ } split /\n/, $segment;
cmp_ok(scalar(@relay_lines), '<', 10,
	"the relay logged fewer than 10 lines while publishing $n events")
  or diag join("\n", @relay_lines[ 0 .. 9 ]);
my $ids = $node->safe_psql('billing',
	'SELECT event_id FROM outbox.events ORDER BY id LIMIT 20');
is(scalar(grep { index($segment, $_) >= 0 } split /\n/, $ids),
	0, 'no event id appears in the log');

# credentials live in outbox.kafka_secrets_file: a rewritten file and a
# reload make the relay rebuild its producer, and the secret is logged
# nowhere (PostgreSQL logs a changed setting's value, so kafka_config
# itself is no place for one)
my $secret2 = 'Hunter3-n3w-s3cret';
my $secrets_file = $node->data_dir . '/kafka_secrets.conf';
my $reload_offset = -s $node->logfile;
PostgreSQL::Test::Utils::append_to_file($secrets_file,
	"# test credentials\nsasl.username=outbox\nsasl.password=$secret2\n");
$node->append_conf('postgresql.conf',
	"outbox.kafka_secrets_file = '$secrets_file'");
$node->reload;
ok( defined wait_for_log_match(
		$node, qr/Kafka settings changed, rebuilding the producer/,
		$reload_offset, 30),
	'after a reload with a secrets file the relay rebuilds its producer');
my $rewrite_offset = -s $node->logfile;
PostgreSQL::Test::Utils::append_to_file($secrets_file, "sasl.password=${secret2}-2\n");
$node->reload;
ok( defined wait_for_log_match(
		$node, qr/Kafka settings changed, rebuilding the producer/,
		$rewrite_offset, 30),
	'a rewritten secrets file, reloaded, rebuilds the producer');
unlike(slurp_file($node->logfile, $reload_offset),
	qr/\Q$secret2\E/, 'the secret from the file is not logged');
is($node->safe_psql('billing', "SELECT count(*) FROM pg_settings WHERE setting LIKE '%$secret2%'"),
	'0', 'nor shown by any setting');

$node->stop;
done_testing();
