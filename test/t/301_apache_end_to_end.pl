# test/t/301_apache_end_to_end.pl: the relay against a real Apache Kafka
# cluster (3 KRaft brokers, replication factor 3, min.insync.replicas 2),
# under load.  Read back with Kafka's own Java client: every committed event
# once (duplicates at most a page), nothing else, each aggregate in order
# and in one partition, keys, headers and values as emitted, and every key
# on the partition Java's default partitioner picks (the relay's
# partitioner is murmur2_random: a Java consumer or Kafka Streams
# co-partitioned by key agrees with it).

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep time);
use JSON::PP;

use FindBin;
use lib "$FindBin::RealBin/../perl";
use OutboxTest;
use OutboxDrill;
use OutboxKafka;

my $kafka = OutboxKafka::Cluster->start(brokers => 3);
my $node = outbox_node('apache301', $kafka);
drill_setup($node, 'postgres');
ok(defined wait_for_relay($node, 'postgres', 30), 'the relay runs');

my $load = OutboxDrill::Load->start($node, 'postgres', seconds => 15, rate => 50);

# a few events with every header set, and a value with awkward characters
my $shop_ids = $node->safe_psql('postgres', q{
SET outbox.tenant = 'acme';
SET outbox.traceparent = '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01';
SELECT outbox.emit('shop', 'order-' || g, 'order.placed',
	jsonb_build_object('n', g, 'note', 'é "quoted" \ back'))
FROM generate_series(1, 20) g;
});
my @shop = split /\n/, $shop_ids;

$load->finish;
my $ids = committed_ids($node, 'postgres');
$kafka->wait_for_events($DRILL_TOPIC, [ keys %$ids ], 90);
$kafka->wait_for_events('outbox.event.shop', \@shop, 30);

my $msgs = $kafka->read_java($DRILL_TOPIC);
ok(defined $msgs, 'the Java client reads the topic back');
$_->{topic} = $DRILL_TOPIC foreach @$msgs;
my $fig = drill_figures($msgs, $ids);
report_figures('Apache Kafka end to end', $fig);
cmp_ok($fig->{committed}, '>', 500, "the load committed $fig->{committed} events");
is(scalar(@{ $fig->{missing} }), 0, 'no loss: every committed event is in Kafka');
is(scalar(@{ $fig->{strangers} }), 0, 'no phantom: Kafka holds only committed events');
is($fig->{order_violations}, 0, 'each aggregate in seq order');
is($fig->{gaps}, 0, 'without gaps');
is($fig->{split}, 0, 'each aggregate in one partition');
cmp_ok($fig->{duplicates}, '<=', 5000, "duplicates at most a page ($fig->{duplicates})");

my %parts = map { $_->{partition} => 1 } @$msgs;
is(scalar(keys %parts), 3, 'the auto-created topic has its 3 partitions in use');
my @wrong = grep { $_->{java_partition} != $_->{partition} } @$msgs;
is(scalar(@wrong), 0,
	'every key sits on the partition Java\'s default partitioner picks ('
	  . scalar(@$msgs) . ' messages)');
my @badkey = grep { ($_->{key} // '') ne ($_->{headers}{aggregate_id} // '') } @$msgs;
is(scalar(@badkey), 0, 'the key is the aggregate id');

# the shop events: key, headers, value, as a consumer sees them
my $shopmsgs = $kafka->read_java('outbox.event.shop');
my %byid = map { $_->{headers}{id} => $_ } @$shopmsgs;
is(scalar(keys %byid), 20, 'the 20 shop events are there');
my $m = $byid{ $shop[4] };
is($m->{key}, 'order-5', 'key');
is($m->{java_partition}, $m->{partition}, 'partition by Java\'s murmur2');
is($m->{headers}{event_type}, 'order.placed', 'event_type header');
is($m->{headers}{aggregate_type}, 'shop', 'aggregate_type header');
is($m->{headers}{aggregate_id}, 'order-5', 'aggregate_id header');
is($m->{headers}{seq}, '1', 'seq header');
is($m->{headers}{tenant}, 'acme', 'tenant header');
like($m->{headers}{traceparent} // '', qr/^00-0af7651916cd43dd/, 'traceparent header');
my $value = JSON::PP->new->decode($m->{value});
is_deeply($value, { n => 5, note => "\x{e9} \"quoted\" \\ back" }, 'value: the payload as emitted');
note 'headers: ' . join(', ', map { $_->[0] } @{ $m->{header_list} });

# kcat (librdkafka) and Java agree on what the topic holds
my $kc = read_topic($kafka, $DRILL_TOPIC);
is(scalar(@$kc), scalar(@$msgs), 'kcat reads as many messages as the Java client');

$node->stop;
$kafka->down;
done_testing();
