# test/t/024_subscription_joining.pl: after subscribe(), the first messages
# arrive only once the consumer group has assigned the worker its
# partitions, and outbox.subscription_status() says so: 'joining' (and
# nothing applied) until then, 'running' after, with subscription_lag()
# listing the partitions assigned.  A worker that joins again (new Kafka
# settings at reload) says 'joining' again.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

use FindBin;
use lib "$FindBin::RealBin/../perl";
use OutboxTest;

my $kafka = OutboxTest::Broker->start(brokers => 1);
my $topic = 'outbox.event.order';
$kafka->command("create $topic 4");
my $node = outbox_node('joining', $kafka);
$node->safe_psql('postgres', 'CREATE DATABASE a');
$node->safe_psql('postgres', 'CREATE DATABASE b');
$node->safe_psql('a', 'CREATE EXTENSION outbox');
$node->safe_psql('b', 'CREATE EXTENSION outbox');

$node->safe_psql('a',
	"SELECT outbox.emit('order', 'o-' || i, 'order.confirmed', jsonb_build_object('i', i)) FROM generate_series(1, 3) i"
);
wait_for_messages($kafka, $topic, 3);
pass('the three events are in Kafka before anyone subscribes');

$node->safe_psql(
	'b', q{
CREATE TABLE ledger (event_id uuid PRIMARY KEY);
CREATE FUNCTION apply(m outbox.inbound_message) RETURNS void
LANGUAGE sql AS $$ INSERT INTO public.ledger VALUES (m.event_id) $$;
});

# One row per look: the state, what is applied, the partitions listed.
# The ledger is read in the statement's snapshot, taken before the state:
# a subscription said to be joining had applied nothing then.
my $look = q{SELECT s.state, (SELECT count(*) FROM public.ledger),
	(SELECT count(*) FROM outbox.subscription_lag() l WHERE l.subscription = s.name)
	FROM outbox.subscription_status() s WHERE s.name = 'orders'};

# watch from subscribe() until the three are applied (at most 60 s)
sub watch
{
	my ($until) = @_;
	my @seen;
	my $deadline = time() + 60;

	while (time() < $deadline)
	{
		my ($ret, $out) = $node->psql('b', $look);
		if ($ret == 0 && $out ne '')
		{
			push @seen, [ split /\|/, $out ];
			last if $until->($seen[-1]);
		}
		usleep(20_000);
	}
	return @seen;
}

$node->safe_psql('b',
	"SELECT outbox.subscribe('orders', ARRAY['$topic'], 'public.apply(outbox.inbound_message)')");
my $t0 = time();
my @seen = watch(sub { $_[0][0] eq 'running' && $_[0][1] == 3 && $_[0][2] == 4 });
my %states = map { $_->[0] => 1 } @seen;
note sprintf('%d looks in %.1f s; states seen: %s', scalar(@seen), time() - $t0,
	join(', ', sort keys %states));

ok($states{joining}, "after subscribe(), subscription_status() says 'joining' while the group assigns partitions");
is(scalar(grep { $_->[0] =~ /^(starting|joining)$/ && $_->[1] != 0 } @seen), 0,
	'nothing is applied while it is starting or joining');
my ($first_applied) = grep { $_->[1] > 0 } @seen;
is($first_applied && $first_applied->[0], 'running',
	'the first look that finds a message applied finds the subscription running');
is_deeply($seen[-1], [ 'running', 3, 4 ],
	'then running: the three events applied, the four partitions listed by subscription_lag()');
my @order = map { $_->[0] } @seen;
my $after = join ',', @order;
unlike($after, qr/running.*joining/, 'once running, it did not say joining again');

# new Kafka settings at reload: the worker leaves the group and joins again
$node->safe_psql('postgres',
	"ALTER SYSTEM SET outbox.kafka_config = '$OutboxTest::TEST_KAFKA_CONFIG;client.rack=r1'");
$node->safe_psql('postgres', 'SELECT pg_reload_conf()');
@seen = watch(sub { $_[0][0] eq 'joining' });
is($seen[-1][0], 'joining', "after a reload that changes the Kafka settings it says 'joining' again");
@seen = watch(sub { $_[0][0] eq 'running' && $_[0][2] == 4 });
is_deeply([ @{ $seen[-1] }[ 0, 2 ] ], [ 'running', 4 ],
	'and running again once its partitions are assigned');

$node->safe_psql('a',
	"SELECT outbox.emit('order', 'o-9', 'order.confirmed', '{\"i\": 9}')");
ok(poll_until($node, 'b', 'SELECT count(*) FROM ledger', '4', 30),
	'an event emitted then is applied');

$node->stop;
$kafka->stop;
done_testing();
