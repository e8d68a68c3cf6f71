# test/t/316_apache_avro.pl: Avro through a schema registry on Apache
# Kafka, under load.  The relay encodes the JSON payloads of the topics in
# outbox.avro_topics with each topic's latest schema (subject
# <topic>-value), logging in with the secrets file's credentials; the Java
# client reads every message back, fetches its schema from the registry by
# the frame's id and decodes it with Apache Avro, field for field equal to
# the jsonb emitted.  A payload that does not fit is quarantined (class
# schema) with its aggregate's later events parked, and replay() after the
# schema is fixed publishes all three in order.  A registry that stops
# answering for 20 s, with a relay that has lost its schemas, loses
# nothing.
#
# The registry is the test tool's stand-in (test/perl/OutboxRegistry.pm),
# not a registry: Apicurio Registry's runner is not on Maven Central.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use JSON::PP;
use Time::HiRes qw(time);

use FindBin;
use lib "$FindBin::RealBin/../perl";
use OutboxTest;
use OutboxDrill;
use OutboxKafka;
use OutboxRegistry;

my $password = 'registry-hunter2';
my $kafka = OutboxKafka::Cluster->start(brokers => 1);
my $registry = OutboxRegistry->start(auth => "outbox:$password");

my $order_schema = encode_json({
	type => 'record', name => 'Order', namespace => 'shop', fields => [
		{ name => 'id', type => 'long' },
		{ name => 'total', type => 'double' },
		{ name => 'status', type => { type => 'enum', name => 'Status', symbols => [ 'NEW', 'PAID' ] } },
		{ name => 'note', type => [ 'null', 'string' ], default => undef },
		{ name => 'items', type => { type => 'array', items => {
			type => 'record', name => 'Item', fields => [
				{ name => 'sku', type => 'string' }, { name => 'n', type => 'int' } ] } } } ] });
my $tick_schema = encode_json({
	type => 'record', name => 'Tick', fields => [
		{ name => 'client', type => 'int' }, { name => 'n', type => 'long' },
		{ name => 'filler', type => 'string' } ] });
my $order_id = $registry->register('shop.orders-value', $order_schema);
my $tick_id = $registry->register("$DRILL_TOPIC-value", $tick_schema);

my $secrets = PostgreSQL::Test::Utils::tempdir() . '/outbox.secrets';
open(my $fh, '>', $secrets) or die $!;
print $fh "schema.registry.basic.auth.user.info=outbox:$password\n";
close $fh;
chmod 0600, $secrets;

my $url = $registry->url;
my $node = outbox_node('apache316', $kafka, conf => qq{
outbox.schema_registry_url = '$url'
outbox.avro_topics = 'shop.orders, $DRILL_TOPIC, shop.unregistered'
outbox.kafka_secrets_file = '$secrets'
outbox.schema_registry_refresh = '2s'
outbox.schema_registry_timeout = '1s'
outbox.retry_backoff_max = '1s'
});
drill_setup($node, 'postgres');
ok(defined wait_for_relay($node, 'postgres', 30), 'the relay runs');

# --- the relay fetches the named topics' schemas while idle, for validate()
ok($node->poll_query_until('postgres',
	"SELECT count(*) = 2 FROM outbox.schemas WHERE (topic, schema_id) IN (('shop.orders', $order_id), ('$DRILL_TOPIC', $tick_id))"),
	'the relay records both topics\' schemas, logging in to the registry');
is($node->safe_psql('postgres', q{SELECT outbox.validate('shop.orders',
	'{"id": 1, "total": 2, "status": "NEW", "items": []}') IS NULL}), 't',
	'validate() accepts a payload that fits');
like($node->safe_psql('postgres', q{SELECT outbox.validate('shop.orders',
	'{"id": 1, "total": 2, "status": "LOST", "items": []}')}),
	qr/schema $order_id: at \$\.status, the string is not a symbol of enum "Status"/,
	'and names the field and the schema of one that does not');

# --- under load (the load's own topic is an Avro one too): 200 orders
my $load = OutboxDrill::Load->start($node, 'postgres', seconds => 15, rate => 40);
$node->safe_psql('postgres', q{
CREATE TABLE orders_emitted (event_id uuid PRIMARY KEY, payload jsonb NOT NULL);
INSERT INTO orders_emitted
SELECT outbox.emit('order', 'o-' || (g % 20), 'order.placed', p, topic => 'shop.orders'), p
  FROM (SELECT g, CASE WHEN g % 3 = 0 THEN p - 'note' ELSE p END AS p
		  FROM (SELECT g, jsonb_build_object('id', g, 'total', g * 1.25,
					'status', CASE WHEN g % 2 = 0 THEN 'PAID' ELSE 'NEW' END,
					'note', CASE WHEN g % 3 = 1 THEN NULL ELSE 'note ' || g END,
					'items', jsonb_build_array(jsonb_build_object('sku', 's-' || g, 'n', g % 7),
											   jsonb_build_object('sku', 't', 'n', 1))) AS p
				  FROM generate_series(1, 200) g) s) t
 ORDER BY g;
});
# a payload that does not fit, then two of its aggregate that do
my @poison = split /\n/, $node->safe_psql('postgres', q{
SELECT outbox.emit('order', 'o-poison', 'order.placed', p, topic => 'shop.orders')
  FROM (VALUES (1, '{"id": 1, "total": 1, "status": "LOST", "items": []}'::jsonb),
			   (2, '{"id": 2, "total": 2, "status": "NEW", "items": []}'),
			   (3, '{"id": 3, "total": 3, "status": "PAID", "items": []}')) v(n, p)
 ORDER BY n});
$load->finish;

my %emitted = map { split /\|/ } split /\n/,
  $node->safe_psql('postgres', 'SELECT event_id, payload FROM orders_emitted');
$kafka->wait_for_events('shop.orders', [ keys %emitted ], 90);
my $msgs = $kafka->read_java('shop.orders', registry => $registry->url_with_auth) // [];

# the same values, numbers compared as numbers (jsonb writes 5.00 where
# Avro's double reads 5.0), a note left out being null
sub plain
{
	my ($v) = @_;
	return { map { ($_ => plain($v->{$_})) } keys %$v } if ref $v eq 'HASH';
	return [ map { plain($_) } @$v ] if ref $v eq 'ARRAY';
	return $v if !defined $v || ref $v;
	return $v =~ /^-?[0-9.]+(?:[eE][-+]?[0-9]+)?$/ ? 0 + $v : "$v";
}

sub same_record
{
	my ($emitted, $decoded) = @_;
	my %want = %$emitted;
	$want{note} //= undef;
	my $json = JSON::PP->new->canonical;
	return $json->encode(plain(\%want)) eq $json->encode(plain($decoded));
}
my ($framed, $equal) = (0, 0);
my %seen;
foreach my $m (@$msgs)
{
	my $id = $m->{headers}{id} // '';
	next unless exists $emitted{$id};
	$seen{$id}++;
	my $f = $m->{frame} // {};
	$framed++ if ($f->{magic} // -1) == 0 && ($f->{schema_id} // -1) == $order_id;
	my $rec = eval { decode_json($f->{avro} // '') };
	if ($rec && same_record(decode_json($emitted{$id}), $rec))
	{
		$equal++;
	}
	else
	{
		note("event $id: emitted $emitted{$id}, read " . encode_json($f));
	}
}
is(scalar(keys %seen), 200, 'every order arrives');
is($framed, scalar(grep { exists $emitted{ $_->{headers}{id} // '' } } @$msgs),
	"each in the registries' wire format, with the topic's schema id ($order_id)");
is($equal, $framed, 'and Apache Avro decodes each, with the schema fetched by its id, equal to the jsonb emitted');
my $fig = drill_figures($msgs, \%emitted);
is($fig->{order_violations}, 0, 'in order per aggregate');
is(scalar(grep { my $id = $_->{headers}{id} // ''; grep { $_ eq $id } @poison } @$msgs), 0,
	'nothing of the aggregate whose payload did not fit');

my $ids = committed_ids($node, 'postgres');
my $ticks = $kafka->wait_for_events($DRILL_TOPIC, [ keys %$ids ], 90);
$ticks = $kafka->read_java($DRILL_TOPIC, registry => $registry->url_with_auth) // [];
$fig = drill_figures($ticks, $ids);
is($fig->{delivered}, $fig->{committed}, "the load's $fig->{committed} events arrive");
is(scalar(grep { ($_->{frame}{schema_id} // -1) == $tick_id && ($_->{frame}{avro} // '') =~ /"filler"/ } @$ticks),
	scalar(@$ticks), 'each an Avro record of its own topic\'s schema');

# --- the quarantined head, and the two parked behind it
is($node->safe_psql('postgres', qq{
SELECT string_agg(state || ' ' || coalesce(error_class, '-'), ', ' ORDER BY event_pk)
  FROM outbox.dead_letters WHERE aggregate_id = 'o-poison'}),
	'quarantined schema, parked -, parked -',
	'the payload that does not fit is quarantined with class schema, its successors parked');
like($node->safe_psql('postgres',
	"SELECT last_error FROM outbox.dead_letters WHERE event_id = '$poison[0]'"),
	qr/schema $order_id: at \$\.status, the string is not a symbol/,
	'its last_error names the field and the schema id');

# --- the schema fixed: replay() publishes the three, in order, with it
my $fixed = $order_schema;
$fixed =~ s/"PAID"\]/"PAID","LOST"]/ or die 'no enum to widen';
my $fixed_id = $registry->register('shop.orders-value', $fixed);
ok($node->poll_query_until('postgres',
	"SELECT schema_id = $fixed_id FROM outbox.schemas WHERE topic = 'shop.orders'"),
	'the relay takes the new version within outbox.schema_registry_refresh');
$node->safe_psql('postgres', "SELECT outbox.replay('$poison[0]')");
$msgs = $kafka->wait_for_events('shop.orders', \@poison, 60);
my @three = grep { my $id = $_->{headers}{id} // ''; grep { $_ eq $id } @poison }
  @{ $kafka->read_java('shop.orders', registry => $registry->url_with_auth) // [] };
is(join(',', map { $_->{headers}{seq} } @three), '1,2,3', 'replay() publishes the three in order');
is(scalar(grep { ($_->{frame}{schema_id} // -1) == $fixed_id } @three), 3,
	"with the fixed schema ($fixed_id)");
like(($three[0]{frame}{avro} // ''), qr/"LOST"/, 'the head decoded as emitted');

# --- a topic whose subject the registry does not have: its events are
# quarantined (class schema), the other topics flow
my @unregistered = split /\n/, $node->safe_psql('postgres', q{
SELECT outbox.emit('order', 'u-1', 'order.placed', '{"id": 1}', topic => 'shop.unregistered')
  FROM generate_series(1, 2)});
my @after = split /\n/, $node->safe_psql('postgres', q{
SELECT outbox.emit('order', 'o-after', 'order.placed',
	'{"id": 9, "total": 9, "status": "NEW", "items": []}', topic => 'shop.orders')});
$kafka->wait_for_events('shop.orders', \@after, 60);
ok($node->poll_query_until('postgres', qq{
SELECT string_agg(state || ' ' || coalesce(error_class, '-'), ', ' ORDER BY event_pk) = 'quarantined schema, parked -'
  FROM outbox.dead_letters WHERE aggregate_id = 'u-1'}),
	'an event of a subject the registry lacks is quarantined (class schema), its successor parked; other topics flow');
like($node->safe_psql('postgres',
	"SELECT last_error FROM outbox.dead_letters WHERE event_id = '$unregistered[0]'"),
	qr/subject "shop\.unregistered-value" is not in the schema registry \(HTTP 404\)/,
	'its last_error says the subject is not in the registry');

# --- the registry silent, the schemas in hand: events flow
$registry->pause;
my @silent = split /\n/, $node->safe_psql('postgres', q{
SELECT outbox.emit('order', 'o-silent-' || (g % 5), 'order.placed',
	jsonb_build_object('id', g, 'total', g, 'status', 'NEW', 'items', '[]'::jsonb), topic => 'shop.orders')
  FROM generate_series(1, 50) g});
my $silent_msgs = $kafka->wait_for_events('shop.orders', \@silent, 60);
my %silent = map { ($_ => 1) } @silent;
my $prefix = sprintf('00%08x', $fixed_id);
is(scalar(grep { $silent{ $_->{headers}{id} // '' } && ($_->{value_hex} // '') =~ /^$prefix/ } @$silent_msgs),
	50, 'with the registry silent, a topic whose schema the relay holds keeps flowing, framed');
$registry->resume;

# --- the registry silent for 20 s, the relay restarted meanwhile (its
# schemas gone): events wait, nothing is lost
$load = OutboxDrill::Load->start($node, 'postgres', seconds => 30, rate => 40, prefix => 'r-');
sleep 3;
$registry->pause;
my $t0 = time();
my $old_pid = $node->safe_psql('postgres', 'SELECT pid FROM outbox.status()');
$node->safe_psql('postgres', "SELECT pg_terminate_backend($old_pid)");
ok($node->poll_query_until('postgres', qq{
SELECT pid <> $old_pid AND state = 'backing off'
   AND last_error LIKE 'no Avro schema for a topic, waiting: the schema registry did not answer%'
  FROM outbox.status()}),
	'the restarted relay, without its schemas, waits; status() says the registry does not answer');
like($node->safe_psql('postgres', 'SELECT status || \' \' || coalesce(reason, \'\') FROM outbox.health()'),
	qr/^(warning|critical) .*schema registry did not answer/, 'and so does health()');
sleep(20 - (time() - $t0)) if time() - $t0 < 20;
$registry->resume;
$load->finish;
$ids = committed_ids($node, 'postgres');
$kafka->wait_for_events($DRILL_TOPIC, [ keys %$ids ], 120);
$fig = drill_figures($kafka->read_java($DRILL_TOPIC) // [], $ids);
is($fig->{delivered}, $fig->{committed}, "registry silent 20 s: all $fig->{committed} events of the load arrive");
is(scalar(@{ $fig->{strangers} }), 0, 'nothing that was not committed');
is($fig->{order_violations}, 0, 'in order');

# --- the registry's password is in no log line
unlike(slurp_file($node->logfile), qr/\Q$password\E/, 'the registry password appears in no log line');

$node->stop;
$registry->stop;
$kafka->down;
done_testing();
