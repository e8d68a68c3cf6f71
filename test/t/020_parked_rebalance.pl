# test/t/020_parked_rebalance.pl: a consumer group's parked keys follow its
# partitions.  Two subscriptions of one group share a topic's two
# partitions; the one that owns key K's partition dead-letters K's message
# (block policy) and is unsubscribed; its partition moves to the other,
# whose worker started before that dead letter was written.  K's next
# message must be parked behind the dead one, not applied.  A worker also
# reads the parked keys at its start and then every 10 s (at the first
# turn of its loop 10 s after the last read, within 1 s): the steps run
# between 11.5 and 20 s after the second worker's start, between two such
# reads (a short session timeout makes the test broker's rebalances
# quick), so only the read on assignment can park it.
# Then the same within one batch: a worker whose batch outlives
# max.poll.interval.ms is put out of the group while its transaction, which
# dead-letters K, still holds the partition's offsets row.  The other
# subscription, assigned the partition meanwhile, read the parked keys
# before that commit; its batch waits for the row, and must read them
# again once it has it.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run qw(run);
use Time::HiRes ();

use FindBin;
use lib "$FindBin::RealBin/../perl";
use OutboxTest;

my $kafka = OutboxTest::Broker->start(brokers => 1);
$kafka->command('create parked 2');
my $node = outbox_node('parked_rebalance', $kafka,
	kafka_config => "$OutboxTest::TEST_KAFKA_CONFIG;session.timeout.ms=3000;heartbeat.interval.ms=500;max.poll.interval.ms=3000");
$node->safe_psql(
	'postgres', q{
CREATE EXTENSION outbox;
CREATE TABLE applied (n bigserial PRIMARY KEY, sub text, part int, key text, payload jsonb);
CREATE FUNCTION apply(m outbox.inbound_message) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
	IF (m.payload->>'poison')::boolean THEN
		RAISE EXCEPTION 'poison for key %', m.key;
	END IF;
	IF m.payload ? 'sleep' THEN
		PERFORM pg_catalog.pg_sleep((m.payload->>'sleep')::float8);
	END IF;
	INSERT INTO public.applied (sub, part, key, payload) VALUES (m.subscription, m.kafka_partition, m.key, m.payload);
END $$;
SELECT outbox.subscribe('first', ARRAY['parked'], 'public.apply(outbox.inbound_message)', group_id => 'g', max_attempts => 1);
});

sub produce
{
	my ($partition, $key, $value, $topic) = @_;
	run([ 'kcat', '-P', '-b', $kafka->bootstrap, '-t', $topic // 'parked', '-p', $partition, '-k', $key ], '<', \$value)
	  or die 'kcat failed';
	return;
}

sub partitions_of
{
	my ($sub) = @_;
	return $node->safe_psql('postgres',
		"SELECT string_agg(kafka_partition::text, ',' ORDER BY kafka_partition) FROM outbox.subscription_lag() WHERE subscription = '$sub'");
}

ok(poll_until($node, 'postgres', "SELECT count(*) FROM outbox.subscription_lag() WHERE subscription = 'first'", '2', 60),
	'the first subscription has both partitions');
produce(0, 'warm', '{"warm": 0}');
produce(1, 'warm', '{"warm": 1}');
ok(poll_until($node, 'postgres', "SELECT count(*) FROM applied WHERE key = 'warm'", '2', 30),
	'it applies messages of both');

# the second worker reads the parked keys when it starts: there are none
$node->safe_psql('postgres',
	"SELECT outbox.subscribe('second', ARRAY['parked'], 'public.apply(outbox.inbound_message)', group_id => 'g', max_attempts => 1)");
ok(poll_until($node, 'postgres',
	"SELECT (SELECT count(*) FROM outbox.subscription_lag() WHERE subscription = 'first') || ',' || (SELECT count(*) FROM outbox.subscription_lag() WHERE subscription = 'second')",
	'1,1', 30),
	'the group shares its partitions between the two');
my $part = partitions_of('first');
note "the first subscription keeps partition $part";
my $wait = $node->safe_psql('postgres',
	"SELECT greatest(0, extract(epoch FROM started_at + interval '11.5 s' - now())) FROM outbox.subscription_status() WHERE name = 'second'");
note "waiting $wait s for the second worker's second read of the parked keys";
Time::HiRes::sleep($wait);

# K dies in the first subscription's partition
produce($part, 'K', '{"poison": true}');
ok(poll_until($node, 'postgres',
	"SELECT state || ':' || subscription FROM outbox.inbox_dead_letters WHERE key = 'K'", 'dead:first', 30),
	'the first subscription dead-letters K');

# its partition moves to the second
is($node->safe_psql('postgres', "SELECT outbox.unsubscribe('first')"), 't', 'the first subscription goes');
ok(poll_until($node, 'postgres', "SELECT count(*) FROM outbox.subscription_lag() WHERE subscription = 'second'", '2', 30),
	'the second subscription has both partitions');
produce($part, 'K', '{"after": 1}');
produce($part, 'other', '{"after": 1}');
ok(poll_until($node, 'postgres', "SELECT count(*) FROM applied WHERE key = 'other'", '1', 30),
	'the second subscription applies the partition\'s other keys');
note 'the second worker handled K\'s next message '
  . $node->safe_psql('postgres', "SELECT round(extract(epoch FROM now() - started_at)::numeric, 1) FROM outbox.subscription_status() WHERE name = 'second'")
  . ' s after it started (between 11.5 and 20 s: between two of its periodic reads)';
is($node->safe_psql('postgres', "SELECT count(*) FROM applied WHERE key = 'K'"), '0',
	'K\'s next message is not applied');
is($node->safe_psql('postgres',
	"SELECT string_agg(state || ':' || subscription, ',' ORDER BY id) FROM outbox.inbox_dead_letters WHERE key = 'K'"),
	'dead:first,parked:second', 'it is parked behind the dead one');

# 2. within a batch: the slow worker's transaction dead-letters K2 while
# the partition is already the other's
$kafka->command('create fence 1');
$node->safe_psql('postgres', q{
SELECT outbox.subscribe('p', ARRAY['fence'], 'public.apply(outbox.inbound_message)', group_id => 'h', max_attempts => 1);
SELECT outbox.subscribe('q', ARRAY['fence'], 'public.apply(outbox.inbound_message)', group_id => 'h', max_attempts => 1);
});
ok(poll_until($node, 'postgres', "SELECT count(*) FROM outbox.subscription_lag() WHERE subscription IN ('p', 'q')", '1', 30),
	'one of two subscriptions of a group has the one partition');
my $slow = $node->safe_psql('postgres', "SELECT subscription FROM outbox.subscription_lag() WHERE subscription IN ('p', 'q')");
my $other = $slow eq 'p' ? 'q' : 'p';
note "$slow has the partition";
# its batch: the sleep, the poison fails, all again one by one: 8 s
my $batch = qq(slow#{"sleep": 4}\nK2#{"poison": true}\n);
run([ 'kcat', '-P', '-b', $kafka->bootstrap, '-t', 'fence', '-p', '0', '-K', '#' ], '<', \$batch)
  or die 'kcat failed';
ok(poll_until($node, 'postgres', "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep' AND backend_type = 'outbox subscription'", '1', 10),
	'the slow batch runs');
produce(0, 'K2', '{"after": 1}', 'fence');
SKIP:
{
	# The group takes the partition away from a member whose poll is late
	# (max.poll.interval.ms) on librdkafka 2.0.2's test broker; later
	# librdkafka (trixie's 2.8) keeps it with the slow member, and then
	# there is nothing to park behind a dead message of another member.
	skip 'the test broker left the partition with the slow member (this librdkafka does not evict it)', 2
	  unless poll_until($node, 'postgres',
		"SELECT subscription FROM outbox.subscription_lag() WHERE subscription IN ('p', 'q')", $other, 30);
	pass('the group gives the partition to the other subscription meanwhile');
	ok(poll_until($node, 'postgres',
		"SELECT string_agg(state || ':' || subscription, ',' ORDER BY id) FROM outbox.inbox_dead_letters WHERE key = 'K2'",
		"dead:$slow,parked:$other", 30),
		'K2\'s next message is parked behind the dead one by the subscription that got the partition');
}
is($node->safe_psql('postgres', "SELECT count(*) FROM applied WHERE key = 'K2'"), '0',
	'and not applied');
is($node->safe_psql('postgres', "SELECT count(*) FROM applied WHERE key = 'slow'"), '1',
	'the slow message is applied once');

done_testing();
