# test/t/308_apache_no_auto_create.pl: a real Apache Kafka cluster with
# auto.create.topics.enable=false, and an event for a topic that does not
# exist.  librdkafka asks for the topic's metadata, the brokers answer
# UNKNOWN_TOPIC_OR_PARTITION, and after topic.metadata.propagation.max.ms
# librdkafka fails the message with _UNKNOWN_TOPIC: a permanent refusal
# for the event.  The relay retries it outbox.max_attempts times and
# quarantines it (its aggregate's successors parked), other topics flow
# under load; once the topic is created, replay() delivers them in order.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep time);

use FindBin;
use lib "$FindBin::RealBin/../perl";
use OutboxTest;
use OutboxDrill;
use OutboxKafka;

my $kafka = OutboxKafka::Cluster->start(
	brokers => 3,
	config => { 'auto.create.topics.enable' => 'false' });
$kafka->create_topic($DRILL_TOPIC, 3);
my $node = outbox_node(
	'apache308', $kafka,
	kafka_config => "$OutboxTest::TEST_KAFKA_CONFIG;topic.metadata.propagation.max.ms=2000",
	conf => q{
outbox.max_attempts = 2
outbox.retry_backoff_min = '100ms'
outbox.retry_backoff_max = '500ms'
});
drill_setup($node, 'postgres');
ok(defined wait_for_relay($node, 'postgres', 30), 'the relay runs');

my $load = OutboxDrill::Load->start($node, 'postgres', seconds => 15, rate => 50);
my @missing = map {
	$node->safe_psql('postgres',
		"SELECT outbox.emit('absent', 'm-1', 'absent.made', '{\"n\": $_}')")
} 1 .. 2;
ok( poll_until(
		$node, 'postgres',
		"SELECT state FROM outbox.dead_letters WHERE event_id = '$missing[0]'",
		'quarantined', 90),
	'the event for a missing topic is quarantined');
my ($class, $err) = split /\|/,
  $node->safe_psql('postgres',
	"SELECT error_class, last_error FROM outbox.dead_letters WHERE event_id = '$missing[0]'");
is($class, 'permanent', 'as a permanent refusal');
like($err, qr/UNKNOWN_TOPIC/, "last_error: $err");
ok( poll_until(
		$node, 'postgres',
		"SELECT state FROM outbox.dead_letters WHERE event_id = '$missing[1]'",
		'parked', 30),
	'its successor is parked');

$load->finish;
my $all = committed_ids($node, 'postgres');
$kafka->wait_for_events($DRILL_TOPIC, [ keys %$all ], 90);
my $msgs = $kafka->read_java($DRILL_TOPIC);
$_->{topic} = $DRILL_TOPIC foreach @$msgs;
my $fig = drill_figures($msgs, $all);
report_figures('missing topic, no auto-creation', $fig);
is(scalar(@{ $fig->{missing} }), 0, 'the existing topic lost nothing');
is($fig->{order_violations}, 0, 'each aggregate in order');
is($kafka->read_java('outbox.event.absent'), undef, 'the relay did not create the topic');

$kafka->create_topic('outbox.event.absent', 3);
usleep(1_000_000) until defined $kafka->read_java('outbox.event.absent');
is($node->safe_psql('postgres', "SELECT count(*) FROM outbox.replay('$missing[0]')"),
	2, 'after the topic is created, replay() queues the event and its successor');
my $got = $kafka->wait_for_events('outbox.event.absent', \@missing, 60);
is_deeply([ map { $_->{headers}{seq} } @$got ], [ 1, 2 ], 'they arrive in order');

$node->stop;
$kafka->down;
done_testing();
