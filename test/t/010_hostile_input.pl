# test/t/010_hostile_input.pl: what emit() accepts, the relay can send.
# emit() counts an event's size as librdkafka does against the producer's
# message.max.bytes (from outbox.kafka_config): an event exactly at the
# limit is delivered, one byte more is refused by emit(), and the same
# one-byte-larger row written without emit() is refused by librdkafka
# itself, so the two agree to the byte.  Caller headers arrive after the
# relay's and cannot forge them, not even by a name that a reader folding
# Unicode case takes for one of the relay's.  Errors about the secrets
# file, in the server log, show line numbers and no secret; a pg_monitor
# role reads outbox.kafka_config but not the secrets file.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Encode qw(decode);

# found without -I: PGXS resets PROVE_FLAGS after the Makefile sets it
use FindBin;
use lib "$FindBin::RealBin/../perl";
use OutboxTest;

my $limit = 2000;
my $kafka = OutboxTest::Broker->start(brokers => 1);
my $node = outbox_node(
	'hostile', $kafka,
	kafka_config => "$OutboxTest::TEST_KAFKA_CONFIG;message.max.bytes=$limit",
	conf => q{
outbox.max_attempts = 1
outbox.retry_backoff_min = '50ms'
outbox.retry_backoff_max = '200ms'
});
$node->safe_psql('postgres', 'CREATE EXTENSION outbox');
my ($pid) = wait_for_relay($node, 'postgres', 30);
ok(defined $pid, 'the relay runs');

# An event of topic "sized", key "k", no seq, payload {"s": "a...a"} of
# n + 9 bytes and one caller header h=v: 36 bytes of record overhead, 1 of
# key, 150 of headers (the relay's seven that are not origin, and h=v:
# names, values and their varint lengths), plus the origin header (the
# database's outbox.origin, a UUID: its name, value and two varints), so
# it is 196 + 44 + n bytes as librdkafka counts it.
my $origin = $node->safe_psql('postgres', 'SELECT origin FROM outbox.origin');
my $n_at_limit = $limit - 196 - (length('origin') + length($origin) + 2);
sub emit_sized
{
	my ($n) = @_;
	return $node->psql(
		'postgres', qq{SET outbox.aggregate_sequence = off;
SELECT outbox.emit('order', '1', 'x', jsonb_build_object('s', repeat('a', $n)),
  topic => 'sized', key => 'k', headers => '{"h": "v"}')});
}

my ($ret, $at_limit, $err) = emit_sized($n_at_limit);
is($ret, 0, "emit() accepts an event of exactly message.max.bytes ($limit)");
($ret, my $out, $err) = emit_sized($n_at_limit + 1);
isnt($ret, 0, 'emit() refuses one a byte larger');
like(
	$err,
	qr/event is 2001 bytes as a Kafka message, more than the producer's limit of 2000 bytes/,
	'saying its size and the limit');
like($err, qr/HINT:  The limit is librdkafka's message.max.bytes/,
	'and naming message.max.bytes');
unlike($err, qr/reconnect|retry\.backoff/, 'without showing other Kafka settings');

# the same larger event as a row written without emit(): librdkafka refuses it
my $over = $node->safe_psql(
	'postgres', qq{INSERT INTO outbox.events (event_id, aggregate_type, aggregate_id,
 event_type, topic, key, payload, headers, occurred_at)
VALUES (outbox.uuid_v7(), 'order', '1', 'x', 'sized', 'k',
 jsonb_build_object('s', repeat('a', @{[ $n_at_limit + 1 ]})), '{"h": "v"}', now())
RETURNING event_id});
ok( poll_until(
		$node, 'postgres',
		"SELECT last_error FROM outbox.dead_letters WHERE event_id = '$over'",
		'MSG_SIZE_TOO_LARGE: refused by the client: message larger than message.max.bytes', 30),
	'librdkafka itself refuses that event (MSG_SIZE_TOO_LARGE, before sending): the limits agree');

my $msgs = wait_for_events($kafka, 'sized', [$at_limit]);
my ($m) = grep { ($_->{headers}{id} // '') eq $at_limit } @$msgs;
is(length($m->{value} // ''), $n_at_limit + 9, 'the event at the limit is delivered whole');
is_deeply(
	[ map { $_->[0] } @{ $m->{header_list} } ],
	[qw(id event_type aggregate_type aggregate_id schema_version occurred_at origin h)],
	'with the relay\'s headers, then the caller\'s');
is(scalar(grep { $_->{headers}{id} eq $over } @$msgs), 0,
	'and the refused one is not in Kafka');

# forged headers never leave the database
my ($fret, $fout, $ferr) = $node->psql('postgres',
	q{SELECT outbox.emit('order', '2', 'x', '{}', topic => 'sized', headers => '{"id": "forged", "seq": "999"}')});
like($ferr, qr/header "id" is reserved/, 'emit() refuses a forged id header');

# nor look-alikes that a reader folding Unicode case (Python's upper(),
# Java's equalsIgnoreCase) takes for the relay's: U+017F LATIN SMALL LETTER
# LONG S + "eq" upper-cases to SEQ, U+0131 LATIN SMALL LETTER DOTLESS I +
# "d" to ID.  A later event of the same key shows whether any arrived.
my @relay_headers =
  qw(id event_type aggregate_type aggregate_id seq schema_version occurred_at traceparent tenant origin);
my ($lret, $lout, $lerr) = $node->psql('postgres',
	qq{SELECT outbox.emit('order', '3', 'x', '{}', topic => 'sized', key => 'look',
  headers => '{"\xC5\xBFeq": "999", "\xC4\xB1d": "forged"}')});
like($lerr, qr/invalid header name/, 'emit() refuses look-alikes of reserved header names');
my $after = $node->safe_psql('postgres',
	q{SELECT outbox.emit('order', '3', 'x', '{}', topic => 'sized', key => 'look')});
$msgs = wait_for_events($kafka, 'sized', [$after]);
my @lookalikes;
for my $h (map { @{ $_->{header_list} } } @$msgs)
{
	my $name = decode('UTF-8', $h->[0]);
	push @lookalikes, $name
	  if grep { $name ne $_ && uc($name) eq uc($_) } @relay_headers;
}
is(scalar(@lookalikes), 0,
	'no message in Kafka carries a header a Unicode upper() reads as the relay\'s');

# --- the secrets file: errors in the log name the line, never its text
my $secret = 'S3cr3t-h0rse-battery';
my @bad = (
	[ "sasl.username=outbox\n$secret\n", qr/Line 2 of "[^"]*" is not of the form key=value/ ],
	[ "sasl.password=$secret" . ('x' x 4096) . "\n", qr/Line 1 of "[^"]*" is longer than 4096 bytes/ ],
	[ "# c\n\nacks=$secret\n", qr/librdkafka rejects the property on line 3 of/ ],
	[ "$secret.property=1\n", qr/librdkafka rejects the property on line 1 of/ ],
	[ "plugin.library.paths=/tmp/$secret.so\n", qr/property on line 1 of "[^"]*" cannot be set in the secrets file/ ],
);
my $log_start = -s $node->logfile;
my $i = 0;
foreach my $case (@bad)
{
	my ($text, $expect) = @$case;
	my $file = $node->data_dir . "/secrets_$i.conf";
	$i++;
	my $offset = -s $node->logfile;
	PostgreSQL::Test::Utils::append_to_file($file, $text);
	$node->append_conf('postgresql.conf', "outbox.kafka_secrets_file = '$file'");
	$node->reload;
	ok(defined wait_for_log_match($node, $expect, $offset, 30),
		"a bad secrets file (case $i) is refused at reload, by line number");
}
my $log = slurp_file($node->logfile, $log_start);
unlike($log, qr/\Q$secret\E/, 'no log line shows any part of a secrets line');
unlike($log, qr/xxxxxxxx/, 'not even of an over-long one');

# --- what a pg_monitor role reads
my $good = $node->data_dir . '/secrets_good.conf';
PostgreSQL::Test::Utils::append_to_file($good, "sasl.username=outbox\nsasl.password=$secret\n");
$node->append_conf('postgresql.conf', "outbox.kafka_secrets_file = '$good'");
$node->reload;
ok(poll_until($node, 'postgres', 'SHOW outbox.kafka_secrets_file', $good, 30),
	'a good secrets file is taken');
$node->safe_psql('postgres', 'CREATE ROLE watcher LOGIN IN ROLE pg_monitor');
my ($r, $o, $e) = $node->psql('postgres', 'SHOW outbox.kafka_config',
	extra_params => [ '-U', 'watcher' ]);
like($o, qr/message\.max\.bytes=2000/,
	'pg_monitor (pg_read_all_settings) reads outbox.kafka_config');
($r, $o, $e) = $node->psql('postgres', 'SHOW outbox.kafka_secrets_file',
	extra_params => [ '-U', 'watcher' ]);
is($o, $good, 'and the secrets file\'s name');
($r, $o, $e) = $node->psql('postgres', "SELECT pg_read_file('$good')",
	extra_params => [ '-U', 'watcher' ]);
like($e, qr/permission denied for function pg_read_file/,
	'but not the secrets file\'s contents');
# the statement is logged: spell the secret backwards in it
my $terces = reverse $secret;
($r, $o, $e) = $node->psql('postgres',
	"SELECT count(*) FROM pg_settings WHERE strpos(setting, reverse('$terces')) > 0",
	extra_params => [ '-U', 'watcher' ]);
is($o, '0', 'nor the secret through any setting');
unlike(slurp_file($node->logfile, $log_start), qr/\Q$secret\E/,
	'and the secret is logged nowhere');

$node->stop;
done_testing();
