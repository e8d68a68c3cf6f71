# test/t/314_apache_cloudevents.pl: outbox.message_format's CloudEvents,
# read back on Apache Kafka by the CloudEvents Java SDK's Kafka
# deserializer (io.cloudevents:cloudevents-kafka, with its Jackson JSON
# format for the structured mode), under load.  The format is switched by a
# reload in the middle of the load, so one topic holds both modes: the SDK
# decodes every message of each by its content-type, every attribute as
# emitted (id, source, type, subject, time to the microsecond,
# datacontenttype, and the sequence, sequencetype, partitionkey and
# traceparent extensions), and data is the payload.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use JSON::PP;
use Encode ();

use FindBin;
use lib "$FindBin::RealBin/../perl";
use OutboxTest;
use OutboxDrill;
use OutboxKafka;

my $tp = '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01';
my $kafka = OutboxKafka::Cluster->start(brokers => 3);
my $node = outbox_node('apache314', $kafka,
	conf => "outbox.message_format = cloudevents_binary\n");
drill_setup($node, 'postgres');
ok(defined wait_for_relay($node, 'postgres', 30), 'the relay runs');

sub shop_events
{
	my ($n) = @_;
	return split /\n/, $node->safe_psql('postgres', qq{
SET outbox.traceparent = '$tp';
SELECT outbox.emit('shop', 'order-' || g, 'order.placed',
	jsonb_build_object('n', g, 'note', 'é "quoted" \\ back', 'list', jsonb_build_array(1, 'two', null)))
FROM generate_series(1, $n) g;
});
}

my $load = OutboxDrill::Load->start($node, 'postgres', seconds => 12, rate => 50);
my @binary = shop_events(20);
sleep 4;
$node->append_conf('postgresql.conf', qq{
outbox.message_format = cloudevents_structured
outbox.cloudevents_source = 'https://shop.example/orders'
});
$node->reload;
sleep 2;
my @structured = shop_events(20);
$load->finish;

my $ids = committed_ids($node, 'postgres');
$kafka->wait_for_events($DRILL_TOPIC, [ keys %$ids ], 90);
$kafka->wait_for_events('outbox.event.shop', [ @binary, @structured ], 30);

# the events as the database has them
my %db = map {
	my ($id, $us, $payload) = split /\|/, $_, 3;
	($id => { time_us => $us, payload => decode_json($payload) })
} split /\n/, $node->safe_psql('postgres', q{
SELECT event_id || '|' || (extract(epoch FROM occurred_at) * 1000000)::bigint || '|' || payload::text
  FROM outbox.events WHERE aggregate_type = 'shop'});

my $shop = $kafka->read_java('outbox.event.shop', cloudevents => 1) // [];
my %mode = map { ($_ => 'binary') } @binary;
$mode{$_} = 'structured' foreach @structured;
my (@wrong, %checked);
foreach my $m (@$shop)
{
	my $h = $m->{headers};
	my $id = $h->{id} // '';
	next unless $mode{$id} && !$checked{$id}++;
	my $ce = $m->{cloudevent};
	my $source = $mode{$id} eq 'binary' ? "urn:uuid:$h->{origin}" : 'https://shop.example/orders';
	my %want = (
		specversion => '1.0', id => $id, source => $source,
		type => 'order.placed', subject => $h->{aggregate_id},
		datacontenttype => 'application/json', time_us => $db{$id}{time_us} + 0,
		extensions => {
			sequence => $h->{seq}, sequencetype => 'Integer',
			partitionkey => $m->{key}, traceparent => $tp });
	my %got = map { ($_ => $ce->{$_}) } grep { $_ ne 'data' && $_ ne 'data_hex' } keys %$ce;
	my $data = eval { decode_json(Encode::encode_utf8($ce->{data} // '')) };
	push @wrong, "$mode{$id} $id: " . encode_json($ce)
	  unless eq_deeply_json(\%got, \%want) && eq_deeply_json($data, $db{$id}{payload});
}
is(scalar(keys %checked), 40, 'the SDK read every event, 20 in each mode');
is(scalar(@wrong), 0, 'every attribute as emitted, and data the payload')
  or diag(join("\n", @wrong[ 0 .. ($#wrong < 4 ? $#wrong : 4) ]));

# the load's events, in both modes in one topic: each decoded, none refused
my $load_msgs = $kafka->read_java($DRILL_TOPIC, cloudevents => 1) // [];
my %modes;
my @refused;
foreach my $m (@$load_msgs)
{
	my $ce = $m->{cloudevent} // {};
	if (defined $ce->{error} || ($ce->{id} // '') ne ($m->{headers}{id} // ''))
	{
		push @refused, encode_json($ce);
		next;
	}
	$modes{ ($m->{headers}{'content-type'} // '') =~ /cloudevents/ ? 'structured' : 'binary' }++;
}
cmp_ok(scalar(@$load_msgs), '>=', scalar(keys %$ids), 'the load reached Kafka');
is(scalar(@refused), 0, 'the SDK decodes every message of the load, its id the event id')
  or diag(join("\n", @refused[ 0 .. ($#refused < 4 ? $#refused : 4) ]));
ok($modes{binary} && $modes{structured},
	'the load was sent in both modes (' . join(', ', map { "$_ $modes{$_}" } sort keys %modes) . ')');

# deep equality of decoded JSON values, as canonical JSON text
sub eq_deeply_json
{
	my ($a, $b) = @_;
	my $js = JSON::PP->new->canonical->allow_nonref;
	return defined $a && defined $b && $js->encode($a) eq $js->encode($b);
}

$node->stop;
done_testing();
