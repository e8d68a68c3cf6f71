# test/t/310_apache_inbox_loop.pl: the full loop on a real Apache Kafka
# cluster (3 KRaft brokers, replication factor 3).  Database a's outbox
# publishes a load; database b's subscription applies it through its
# handler.  Meanwhile one broker is killed -9 and started again, and the
# subscription worker is killed -9 (the server restarts every process,
# the relay too).  Read back from the databases: every event committed in
# a is applied in b exactly once, each aggregate in seq order.

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
$kafka->create_topic($DRILL_TOPIC, 6, 'min.insync.replicas' => 2);
my $node = outbox_node('apache310', $kafka, conf => 'restart_after_crash = on');
$node->safe_psql('postgres', 'CREATE DATABASE a');
$node->safe_psql('postgres', 'CREATE DATABASE b');
drill_setup($node, 'a');
$node->safe_psql(
	'b', q{
CREATE EXTENSION outbox;
CREATE TABLE applied (n bigserial PRIMARY KEY, event_id uuid, key text, seq bigint,
	occurred_at timestamptz, applied_at timestamptz DEFAULT clock_timestamp());
CREATE FUNCTION apply(m outbox.inbound_message) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO public.applied (event_id, key, seq) VALUES (m.event_id, m.key, m.seq);
END $$;
SELECT outbox.subscribe('drill', ARRAY['outbox.event.drill'], 'public.apply(outbox.inbound_message)');
});
ok(defined wait_for_relay($node, 'a', 30), 'database a has its relay');
ok(poll_until($node, 'postgres',
	"SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'outbox subscription'", '1', 30),
	'database b has its subscription worker');

my $load = OutboxDrill::Load->start($node, 'a', seconds => 30, rate => 50, aggregates => 100);
sleep 6;
$kafka->kill(2);
note 'broker 2 killed';
sleep 6;
$kafka->start_broker(2);
note 'broker 2 started again';
sleep 4;
my ($worker) = split /\n/, $node->safe_psql('postgres',
	"SELECT pid FROM pg_stat_activity WHERE backend_type = 'outbox subscription'");
kill 'KILL', $worker;
note "subscription worker $worker killed";
$load->finish;

my $ids = committed_ids($node, 'a');
my $committed = scalar(keys %$ids);
cmp_ok($committed, '>', 1000, "the load committed $committed events");
ok(poll_until($node, 'b', 'SELECT count(DISTINCT event_id) FROM applied', $committed, 120),
	"all $committed events applied in b");
my $applied = $node->safe_psql('b', 'SELECT string_agg(event_id::text, \',\') FROM applied');
my %seen;
my ($dups, $strangers) = (0, 0);
for my $id (split /,/, $applied)
{
	$dups++ if $seen{$id}++;
	$strangers++ unless exists $ids->{$id};
}
my $missing = grep { !$seen{$_} } keys %$ids;
is($missing, 0, 'none lost');
is($dups, 0, 'none applied twice');
is($strangers, 0, 'nothing applied that a did not commit');
is($node->safe_psql('b', q{
	SELECT count(*) FROM (SELECT seq < lag(seq) OVER (PARTITION BY key ORDER BY n) AS back FROM applied) s WHERE back}),
	'0', "each aggregate's events applied in seq order");
note sprintf('Apache Kafka inbox loop: committed %d, applied %d, missing %d, applied twice %d, strangers %d',
	$committed, scalar(keys %seen), $missing, $dups, $strangers);
is($node->safe_psql('b', 'SELECT state FROM outbox.subscription_status()'), 'running', 'the subscription runs');

# a worker that leaves the group hands its partitions over at once: an
# unsubscribe and a subscribe again, timed until the partitions are back
$node->safe_psql('b', "SELECT outbox.unsubscribe('drill')");
$node->safe_psql('b', "SELECT outbox.subscribe('drill', ARRAY['outbox.event.drill'], 'public.apply(outbox.inbound_message)')");
my $t0 = time();
ok(poll_until($node, 'b', 'SELECT count(*) FROM outbox.subscription_lag()', '6', 60),
	'subscribed again, the worker has the 6 partitions');
note sprintf('Apache Kafka inbox loop: partitions assigned again %.1f s after the subscribe', time() - $t0);

done_testing();
