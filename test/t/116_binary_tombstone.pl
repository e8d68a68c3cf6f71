# test/t/116_binary_tombstone.pl: emit_binary() and emit_tombstone(), read
# back by kcat.  Bytes reach Kafka unchanged (every byte value, the ones
# kcat's framing uses included), with their content type as content-type;
# schema_id puts the registries' frame before them; a tombstone is the key
# with a null value, in order with the aggregate's other events.  In the
# CloudEvents formats: binary mode's datacontenttype is the content type;
# structured mode carries bytes as data_base64; a tombstone keeps its null
# value and carries the attributes as ce_ headers.  The size check counts
# the base64 of an envelope.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use JSON::PP;
use MIME::Base64 qw(decode_base64);

use FindBin;
use lib "$FindBin::RealBin/../perl";
use OutboxTest;

my $topic = 'outbox.event.doc';
my $kafka = OutboxTest::Broker->start(brokers => 1);
my $node = outbox_node('binary', $kafka);
$node->safe_psql('postgres', 'CREATE EXTENSION outbox');
ok(defined wait_for_relay($node, 'postgres', 30), 'the relay runs');

# every byte value, twice, and kcat's own separators among them
my $all_hex = join('', map { sprintf('%02x', $_) } (0 .. 255, reverse 0 .. 255)) . '7c0a7c';
my $all_bytes = pack('H*', $all_hex);

sub one
{
	my ($sql) = @_;
	return $node->safe_psql('postgres', $sql);
}

sub message_of
{
	my ($msgs, $id) = @_;
	my ($m) = grep { ($_->{headers}{id} // '') eq $id } @$msgs;
	return $m // {};
}

# --- native
my @ids = (
	one(q{SELECT outbox.emit('doc', 'd1', 'doc.created', '{"v": 1}')}),
	one(qq{SELECT outbox.emit_binary('doc', 'd1', 'doc.raw', '\\x$all_hex'::bytea,
		content_type => 'application/octet-stream')}),
	one(q{SELECT outbox.emit_binary('doc', 'd1', 'doc.avro', '\x0a0b0c'::bytea, schema_id => 300,
		content_type => 'application/vnd.apache.avro+binary')}),
	one(q{SELECT outbox.emit_binary('doc', 'd1', 'doc.proto', '\x08'::bytea, schema_id => 7,
		message_indexes => '{1,0,70}')}),
	one(q{SELECT outbox.emit_tombstone('doc', 'd1', 'doc.deleted')}));
my @native = @ids;
my $msgs = wait_for_events($kafka, $topic, \@ids) // [];
my @m = map { message_of($msgs, $_) } @ids;
is($m[0]{value}, '{"v": 1}', 'native: emit() is JSON as before');
ok(!exists $m[0]{headers}{'content-type'}, 'native: a JSON event has no content-type');
is(unpack('H*', $m[1]{value} // ''), $all_hex, 'native: every byte arrives unchanged');
is($m[1]{headers}{'content-type'}, 'application/octet-stream', 'native: the content type is content-type');
is(unpack('H*', $m[2]{value} // ''), '000000012c0a0b0c',
	'native: schema_id 300 is framed: magic 0, the id big-endian, the bytes');
is(unpack('H*', $m[3]{value} // ''), '00000000070602008c0108',
	'native: Protobuf message indexes [1,0,70] follow the id as zig-zag varints');
ok(!exists $m[3]{headers}{'content-type'}, 'native: no content type given, no content-type');
ok(!defined $m[4]{value}, 'native: the tombstone has a null value');
is($m[4]{key}, 'd1', 'native: the tombstone has the aggregate key');
is($m[4]{headers}{event_type}, 'doc.deleted', "native: the tombstone has outbox's headers");
is(join(',', map { $_->{headers}{seq} // '?' } @m), '1,2,3,4,5',
	'every kind of event takes its place in the aggregate sequence');
my %parts = map { ($_->{partition} // -1) => 1 } @m;
is(scalar(keys %parts), 1, "the aggregate's events share a partition");
is_deeply([ map { $_->{offset} } @m ], [ sort { $a <=> $b } map { $_->{offset} } @m ],
	'and reach it in emit order, the tombstone last');

# --- cloudevents_binary
$node->append_conf('postgresql.conf', "outbox.message_format = cloudevents_binary\n");
$node->reload;
sleep 1;
@ids = (
	one(q{SELECT outbox.emit_binary('doc', 'd2', 'doc.avro', '\x0102'::bytea, schema_id => 5,
		content_type => 'application/avro')}),
	one(q{SELECT outbox.emit_binary('doc', 'd2', 'doc.raw', '\xff'::bytea)}),
	one(q{SELECT outbox.emit_tombstone('doc', 'd2', 'doc.deleted')}));
$msgs = wait_for_events($kafka, $topic, \@ids) // [];
@m = map { message_of($msgs, $_) } @ids;
is(unpack('H*', $m[0]{value} // ''), '00000000050102', 'cloudevents_binary: the framed bytes are the value');
is($m[0]{headers}{'content-type'}, 'application/avro',
	'cloudevents_binary: the content type is content-type (the datacontenttype)');
is($m[0]{headers}{ce_id}, $ids[0], 'cloudevents_binary: with the attributes');
ok(!exists $m[1]{headers}{'content-type'}, 'cloudevents_binary: no content type, no content-type');
ok(!defined $m[2]{value}, 'cloudevents_binary: the tombstone has a null value');
is($m[2]{headers}{ce_type}, 'doc.deleted', 'cloudevents_binary: the tombstone has the attributes');
ok(!exists $m[2]{headers}{'content-type'}, 'cloudevents_binary: and no content-type');

# --- cloudevents_structured
$node->append_conf('postgresql.conf', "outbox.message_format = cloudevents_structured\n");
$node->reload;
sleep 1;
@ids = (
	one(qq{SELECT outbox.emit_binary('doc', 'd3', 'doc.raw', '\\x$all_hex'::bytea,
		content_type => 'application/octet-stream')}),
	one(q{SELECT outbox.emit_binary('doc', 'd3', 'doc.untyped', '\x41'::bytea)}),
	one(q{SELECT outbox.emit_tombstone('doc', 'd3', 'doc.deleted')}));
$msgs = wait_for_events($kafka, $topic, \@ids) // [];
@m = map { message_of($msgs, $_) } @ids;
my $env = eval { decode_json($m[0]{value} // '') } // {};
is($m[0]{headers}{'content-type'}, 'application/cloudevents+json; charset=UTF-8',
	'cloudevents_structured: bytes travel in an envelope');
ok(!exists $env->{data}, 'cloudevents_structured: not as data');
is(unpack('H*', decode_base64($env->{data_base64} // '')), $all_hex,
	'cloudevents_structured: data_base64 decodes to every byte');
is($env->{datacontenttype}, 'application/octet-stream', 'cloudevents_structured: the content type is datacontenttype');
is($env->{id}, $ids[0], 'cloudevents_structured: with the attributes');
$env = eval { decode_json($m[1]{value} // '') } // {};
is($env->{data_base64}, 'QQ==', 'cloudevents_structured: base64 is padded');
ok(!exists $env->{datacontenttype}, 'cloudevents_structured: no content type, no datacontenttype');
ok(!defined $m[2]{value}, 'cloudevents_structured: the tombstone keeps its null value');
is($m[2]{headers}{ce_type}, 'doc.deleted',
	'cloudevents_structured: the tombstone carries the attributes as ce_ headers');
ok(!exists $m[2]{headers}{'content-type'}, 'cloudevents_structured: and no content-type');

# --- the size check counts base64 in an envelope
$node->append_conf('postgresql.conf',
	"outbox.kafka_config = '$OutboxTest::TEST_KAFKA_CONFIG;message.max.bytes=3000'\n");
$node->reload;
sleep 1;
my $big = q{decode(repeat('ab', 2000), 'hex')};
my ($ret, $out, $err) = $node->psql('postgres', "SELECT outbox.emit_binary('doc', 'd4', 'doc.big', $big)");
like($err, qr/event is \d+ bytes as a Kafka message/, 'bytes that do not fit as base64 in the envelope are refused');
$node->append_conf('postgresql.conf', "outbox.message_format = native\n");
$node->reload;
sleep 1;
($ret, $out, $err) = $node->psql('postgres', "SELECT outbox.emit_binary('doc', 'd4', 'doc.big', $big)");
is($ret, 0, 'the same bytes fit natively') or diag($err);

# --- a subscription hands its handler bytes as value, a tombstone as nulls
$node->safe_psql('postgres', 'CREATE DATABASE b');
$node->safe_psql('b', q{
CREATE EXTENSION outbox;
CREATE TABLE applied (event_id uuid, event_type text, key text, payload jsonb, value bytea,
	value_null boolean);
CREATE FUNCTION apply(m outbox.inbound_message) RETURNS void
LANGUAGE sql AS $$
	INSERT INTO public.applied VALUES (m.event_id, m.event_type, m.key, m.payload, m.value,
		m.value IS NULL)
$$;
SELECT outbox.subscribe('docs', ARRAY['outbox.event.doc'], 'public.apply(outbox.inbound_message)');
});
my $in = join(',', map { "'$_'" } @native);
ok(poll_until($node, 'b', "SELECT count(*) FROM applied WHERE event_id IN ($in)", '5', 60),
	'the subscription applies the native events');
is($node->safe_psql('b', qq{SELECT string_agg(format('%s:%s:%s', event_type, payload IS NULL, value_null), ' ')
	FROM (SELECT * FROM applied WHERE event_id IN ($in) ORDER BY event_type) a}),
	'doc.avro:t:f doc.created:f:f doc.deleted:t:t doc.proto:t:f doc.raw:t:f',
	'JSON arrives as payload; bytes as value alone; the tombstone as two nulls');
is($node->safe_psql('b', "SELECT encode(value, 'hex') FROM applied WHERE event_id = '$native[1]'"),
	$all_hex, 'the handler gets every byte');

# --- nothing was dead-lettered on the way
is(one('SELECT count(*) FROM outbox.dead_letters'), '0', 'no event was refused on the way');

$node->stop;
done_testing();
