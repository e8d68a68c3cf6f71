# test/t/315_apache_shapes.pl: emit_binary() and emit_tombstone() on Apache
# Kafka, under load, read back by independent readers.  Framed payloads are
# read as a schema registry's wire format by the Java client and their
# records decoded by Apache Avro with the schema the application used; the
# CloudEvents Java SDK decodes bytes in both modes (binary: the value, with
# content-type as datacontenttype; structured: data_base64) to the bytes
# emitted; on a log-compacted topic a tombstone arrives as a null value and
# the broker's cleaner removes the aggregate's earlier records.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use JSON::PP;

use FindBin;
use lib "$FindBin::RealBin/../perl";
use OutboxTest;
use OutboxDrill;
use OutboxKafka;

my $kafka = OutboxKafka::Cluster->start(brokers => 1,
	config => { 'log.cleaner.enable' => 'true', 'log.cleaner.backoff.ms' => '500' });
my $node = outbox_node('apache315', $kafka);
drill_setup($node, 'postgres');
ok(defined wait_for_relay($node, 'postgres', 30), 'the relay runs');

# the application's Avro schema, and records it serialized by hand: id as
# a zig-zag varint (2g for g < 64), status as length 4 (8) and "paid"
my $schema_file = PostgreSQL::Test::Utils::tempdir() . '/order.avsc';
open(my $fh, '>', $schema_file) or die $!;
print $fh '{"type":"record","name":"Order","fields":[{"name":"id","type":"long"},'
  . '{"name":"status","type":"string"}]}';
close $fh;

my $compacted = 'shop.customers';
$kafka->create_topic($compacted, 1,
	'cleanup.policy' => 'compact', 'segment.ms' => '100',
	'min.cleanable.dirty.ratio' => '0.01', 'delete.retention.ms' => '600000');

sub lines
{
	my ($sql) = @_;
	return split /\n/, $node->safe_psql('postgres', $sql);
}

my $load = OutboxDrill::Load->start($node, 'postgres', seconds => 15, rate => 50);

# --- framed Avro records
my @avro = lines(q{
SELECT outbox.emit_binary('order', 'o-' || g, 'order.paid',
	decode(lpad(to_hex(2 * g), 2, '0') || '0870616964', 'hex'),
	schema_id => 17, content_type => 'application/vnd.apache.avro+binary')
FROM generate_series(1, 20) g});

# --- bytes in CloudEvents, both modes: blobs from..to under format
sub blobs_in
{
	my ($format, $from, $to) = @_;
	$node->append_conf('postgresql.conf', "outbox.message_format = $format\n");
	$node->reload;
	sleep 2;
	return lines(qq{
SELECT outbox.emit_binary('blob', 'b-' || g, 'blob.stored', decode('00ff7c0a' || to_hex(g + 16), 'hex'),
	content_type => 'application/octet-stream')
FROM generate_series($from, $to) g});
}
my @ce_bin = blobs_in('cloudevents_binary', 1, 10);
my @ce_str = blobs_in('cloudevents_structured', 11, 20);
$node->append_conf('postgresql.conf', "outbox.message_format = native\n");
$node->reload;
sleep 2;

# --- a compacted topic: three versions of c1, one of c2, then c1's tombstone
my @compact = lines(qq{
SELECT outbox.emit('customer', 'c1', 'customer.changed', jsonb_build_object('v', g), topic => '$compacted')
FROM generate_series(1, 3) g
UNION ALL
SELECT outbox.emit('customer', 'c2', 'customer.changed', '{"v": 1}', topic => '$compacted')
UNION ALL
SELECT outbox.emit_tombstone('customer', 'c1', 'customer.deleted', topic => '$compacted')});
$load->finish;

my $ids = committed_ids($node, 'postgres');
$kafka->wait_for_events($DRILL_TOPIC, [ keys %$ids ], 90);

$kafka->wait_for_events('outbox.event.order', \@avro, 60);
my $msgs = $kafka->read_java('outbox.event.order', avro_schema => $schema_file) // [];
my %by_id = map { ($_->{headers}{id} // '') => $_ } @$msgs;
my ($framed, $decoded) = (0, 0);
foreach my $i (0 .. $#avro)
{
	my $m = $by_id{ $avro[$i] } // {};
	my $f = $m->{frame} // {};
	$framed++ if ($f->{magic} // -1) == 0 && ($f->{schema_id} // -1) == 17;
	my $rec = eval { decode_json($f->{avro} // '') } // {};
	$decoded++ if ($rec->{id} // 0) == $i + 1 && ($rec->{status} // '') eq 'paid';
	note('event ' . $avro[$i] . ': ' . encode_json($f)) unless ($rec->{id} // 0) == $i + 1;
}
is($framed, 20, 'every framed event reads as the wire format: magic 0, schema id 17');
is($decoded, 20, 'and Apache Avro decodes each record as the application serialized it');
is(scalar(grep { ($_->{headers}{'content-type'} // '') eq 'application/vnd.apache.avro+binary' }
	  map { $by_id{$_} // {} } @avro), 20, 'each with its content-type');

$kafka->wait_for_events('outbox.event.blob', [ @ce_bin, @ce_str ], 60);
$msgs = $kafka->read_java('outbox.event.blob', cloudevents => 1) // [];
%by_id = map { ($_->{headers}{id} // $_->{cloudevent}{id} // '') => $_ } @$msgs;
foreach my $set ([ 'binary', \@ce_bin, 1 ], [ 'structured', \@ce_str, 11 ])
{
	my ($mode, $list, $g) = @$set;
	my $good = 0;
	foreach my $id (@$list)
	{
		my $ce = ($by_id{$id} // {})->{cloudevent} // {};
		my $want = sprintf('00ff7c0a%x', $g++ + 16);
		if (($ce->{id} // '') eq $id && ($ce->{data_hex} // '') eq $want
			&& ($ce->{datacontenttype} // '') eq 'application/octet-stream'
			&& ($ce->{type} // '') eq 'blob.stored')
		{
			$good++;
		}
		else
		{
			note("$mode $id: " . encode_json($ce));
		}
	}
	is($good, scalar(@$list), "cloudevents_$mode: the SDK decodes every byte payload, its content type and attributes");
}

# --- compaction removes c1's earlier records, keeps its tombstone and c2
$kafka->wait_for_events($compacted, \@compact, 60);
my $tomb = (grep { ($_->{headers}{id} // '') eq $compact[-1] }
	  @{ $kafka->read_java($compacted) // [] })[0] // {};
ok(exists $tomb->{value} && !defined $tomb->{value}, 'the tombstone arrives as a null value');
is($tomb->{key}, 'c1', "with the aggregate's key");
# the cleaner leaves the active segment alone: a later record rolls it
my $compacted_ok = 0;
my $deadline = time() + 120;
while (!$compacted_ok && time() < $deadline)
{
	$node->safe_psql('postgres',
		qq{SELECT outbox.emit('customer', 'c3', 'customer.changed', '{}', topic => '$compacted')});
	sleep 2;
	my @c1 = grep { ($_->{key} // '') eq 'c1' } @{ $kafka->read_java($compacted) // [] };
	$compacted_ok = (@c1 == 1 && !defined $c1[0]{value});
}
ok($compacted_ok, "the broker's cleaner removed c1's earlier records, its tombstone left");
my $all = $kafka->read_java($compacted) // [];
is(scalar(grep { ($_->{key} // '') eq 'c2' } @$all), 1, "c2's record stays");

is($node->safe_psql('postgres', 'SELECT count(*) FROM outbox.dead_letters'), '0',
	'no event was refused on the way');

$node->stop;
$kafka->down;
done_testing();
