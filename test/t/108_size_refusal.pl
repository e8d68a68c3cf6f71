# test/t/108_size_refusal.pl: an event quarantined for its size says who
# refused it.  librdkafka refuses, at produce time, a message larger than
# the producer's message.max.bytes (rd_kafka_producev returns the error);
# a broker refuses one larger than its own limit in its answer, which the
# relay reads in the delivery report.  The fix differs (the relay's
# outbox.kafka_config or the broker's and topic's settings), so
# outbox.dead_letters.last_error and the quarantine's log line tell them
# apart.  The mock broker has no size limit of its own: it is made to
# answer produce requests with MSG_SIZE_TOO_LARGE (its error injection),
# which is what a broker's size check sends.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

# found without -I: PGXS resets PROVE_FLAGS after the Makefile sets it
use FindBin;
use lib "$FindBin::RealBin/../perl";
use OutboxTest;

my $max_attempts = 2;
my $kafka = OutboxTest::Broker->start(brokers => 1);
my $node = outbox_node(
	'sizerefusal', $kafka,
	kafka_config => "$OutboxTest::TEST_KAFKA_CONFIG;message.max.bytes=10000",
	conf => qq{
outbox.max_attempts = $max_attempts
outbox.retry_backoff_min = '50ms'
outbox.retry_backoff_max = '200ms'
outbox.poison_policy = 'skip'
});
$node->safe_psql('postgres', 'CREATE EXTENSION outbox');
ok(defined wait_for_relay($node, 'postgres', 30), 'the relay runs');

sub emit
{
	my ($agg, $bytes) = @_;
	return $node->safe_psql('postgres',
		"SELECT outbox.emit('sized', '$agg', 'sized.made',"
		  . " jsonb_build_object('blob', repeat('z', $bytes)))");
}

sub last_error_of
{
	my ($id) = @_;
	return undef
	  unless poll_until($node, 'postgres',
		"SELECT state FROM outbox.dead_letters WHERE event_id = '$id'",
		'quarantined', 30);
	return $node->safe_psql('postgres',
		"SELECT last_error FROM outbox.dead_letters WHERE event_id = '$id'");
}

# --- the client: larger than the producer's message.max.bytes.  A row
# written without emit(), which refuses such an event itself.
my $offset = -s $node->logfile;
my $big = $node->safe_psql(
	'postgres', q{INSERT INTO outbox.events (event_id, aggregate_type, aggregate_id,
 event_type, topic, key, payload, occurred_at)
VALUES (outbox.uuid_v7(), 'sized', 'big', 'sized.made', 'outbox.event.sized', 'big',
 jsonb_build_object('blob', repeat('z', 20000)), now())
RETURNING event_id});
my $err = last_error_of($big);
is( $err,
	'MSG_SIZE_TOO_LARGE: refused by the client: message larger than message.max.bytes',
	'an event larger than message.max.bytes: last_error says the client refused it');
ok( defined wait_for_log_match(
		$node,
		qr/quarantined event \Q$big\E.*\n.*DETAIL:  Kafka refused it with MSG_SIZE_TOO_LARGE: refused by the client: /,
		$offset, 30),
	'and so does the quarantine log line');

# --- the broker: it answers produce requests with MSG_SIZE_TOO_LARGE
my $first = emit('ok', 10);
wait_for_events($kafka, 'outbox.event.sized', [$first]);
$offset = -s $node->logfile;
$kafka->command("errors produce $max_attempts MSG_SIZE_TOO_LARGE");
my $refused = emit('small', 10);
$err = last_error_of($refused);
like(
	$err,
	qr/^MSG_SIZE_TOO_LARGE: refused by the broker: /,
	'an event the broker refuses for size: last_error says the broker refused it');
ok( defined wait_for_log_match(
		$node,
		qr/quarantined event \Q$refused\E.*\n.*DETAIL:  Kafka refused it with MSG_SIZE_TOO_LARGE: refused by the broker: /,
		$offset, 30),
	'and so does the quarantine log line');
is($node->safe_psql('postgres',
	"SELECT error_class FROM outbox.dead_letters WHERE event_id = '$refused'"),
	'permanent', 'a refusal for size is permanent either way');

# the relay goes on
my $after = emit('ok', 10);
wait_for_events($kafka, 'outbox.event.sized', [$after]);
pass('later events are published');

done_testing();
