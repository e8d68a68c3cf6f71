# test/t/307_apache_topic_size.pl: a topic whose max.message.bytes is
# smaller than an event, on a real Apache Kafka cluster.  librdkafka sends
# the event (it fits the producer's message.max.bytes); the broker refuses
# it (MSG_SIZE_TOO_LARGE in the produce answer).  The relay retries it
# outbox.max_attempts times, quarantines it with a last_error that says the
# broker refused it, and the load on another topic flows meanwhile.

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

my $kafka = OutboxKafka::Cluster->start(brokers => 3);
$kafka->create_topic('outbox.event.small', 3, 'max.message.bytes' => 2000);
my $node = outbox_node(
	'apache307', $kafka,
	conf => q{
outbox.max_attempts = 2
outbox.retry_backoff_min = '100ms'
outbox.retry_backoff_max = '500ms'
});
drill_setup($node, 'postgres');
ok(defined wait_for_relay($node, 'postgres', 30), 'the relay runs');

my $load = OutboxDrill::Load->start($node, 'postgres', seconds => 15, rate => 50);

my $ok1 = $node->safe_psql('postgres',
	"SELECT outbox.emit('small', 'fits', 'small.made', '{\"n\": 1}')");
$kafka->wait_for_events('outbox.event.small', [$ok1], 60);
my $big = $node->safe_psql('postgres',
	"SELECT outbox.emit('small', 'huge', 'small.made', jsonb_build_object('blob', repeat('z', 5000)))");
ok( poll_until(
		$node, 'postgres',
		"SELECT state FROM outbox.dead_letters WHERE event_id = '$big'",
		'quarantined', 60),
	'the event larger than the topic\'s max.message.bytes is quarantined');
my ($class, $err, $attempts) = split /\|/,
  $node->safe_psql('postgres',
	"SELECT error_class, last_error, attempts FROM outbox.dead_letters WHERE event_id = '$big'");
is($class, 'permanent', 'as a permanent refusal');
like($err, qr/^MSG_SIZE_TOO_LARGE: refused by the broker: /,
	"last_error says the broker refused it: $err");
is($attempts, 2, 'after outbox.max_attempts attempts');

my $ok2 = $node->safe_psql('postgres',
	"SELECT outbox.emit('small', 'fits', 'small.made', '{\"n\": 2}')");
my $small = $kafka->wait_for_events('outbox.event.small', [$ok2], 60);
ok(!(grep { ($_->{headers}{id} // '') eq $big } @$small),
	'the topic holds the events that fit, not the refused one');

$load->finish;
my $all = committed_ids($node, 'postgres');
$kafka->wait_for_events($DRILL_TOPIC, [ keys %$all ], 90);
my $msgs = $kafka->read_java($DRILL_TOPIC);
$_->{topic} = $DRILL_TOPIC foreach @$msgs;
my $fig = drill_figures($msgs, $all);
report_figures('topic max.message.bytes refusal', $fig);
explain_missing($node, 'postgres', $fig->{missing});
is(scalar(@{ $fig->{missing} }), 0, 'the load on another topic lost nothing');
is(scalar(@{ $fig->{strangers} }), 0, 'no phantom');
is($fig->{order_violations}, 0, 'each aggregate in order');

$node->stop;
$kafka->down;
done_testing();
