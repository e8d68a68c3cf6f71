# test/t/302_apache_leader_kill.pl: failure drill on a real Apache Kafka
# cluster.  Under steady load, the leader of the busiest partition of the
# drill topic is killed (kill -9).  Kafka elects another in-sync replica
# leader; the relay, which holds its page on transient errors, resends
# what was not acknowledged.  Nothing committed is lost, nothing out of
# order, duplicates at most a page; the time until every event committed
# before the kill is in Kafka is printed.

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
my $node = outbox_node(
	'apache302', $kafka,
	conf => q{
outbox.delivery_timeout = '10s'
outbox.retry_backoff_min = '100ms'
outbox.retry_backoff_max = '1s'
});
drill_setup($node, 'postgres');
ok(defined wait_for_relay($node, 'postgres', 30), 'the relay runs');

my $load = OutboxDrill::Load->start($node, 'postgres', seconds => 35, rate => 100);
usleep(6_000_000);
my $before = committed_ids($node, 'postgres');
my $msgs = $kafka->wait_for_events($DRILL_TOPIC, [ keys %$before ], 60);

my %count;
$count{ $_->{partition} }++ foreach @$msgs;
my ($busiest) = sort { $count{$b} <=> $count{$a} } keys %count;
my $leaders = $kafka->leaders($DRILL_TOPIC);
my $victim = $leaders->{$busiest}{leader};
note "partition $busiest (of " . join(', ', map { "$_: $count{$_}" } sort keys %count)
  . ") is led by broker $victim, isr @{ $leaders->{$busiest}{isr} }";
is(scalar(@{ $leaders->{$busiest}{isr} }), 3, 'the partition has 3 in-sync replicas');

$kafka->kill($victim);
my $t_kill = time();
my $at_kill = committed_ids($node, 'postgres');
my $t_recovered;
while (time() < $t_kill + 90)
{
	my $seen = event_ids_of($kafka->read_java($DRILL_TOPIC) // []);
	if (!grep { !$seen->{$_} } keys %$at_kill)
	{
		$t_recovered = time();
		last;
	}
	usleep(200_000);
}
ok(defined $t_recovered, 'every event committed before the kill reaches Kafka');
my $recovery = defined $t_recovered ? $t_recovered - $t_kill : -1;
diag(sprintf('leader kill -9: every event committed before it delivered %.1f s after the kill', $recovery));
my $new = $kafka->leaders($DRILL_TOPIC);
isnt($new->{$busiest}{leader}, $victim, "partition $busiest has a new leader (broker $new->{$busiest}{leader})");

$kafka->start_broker($victim);
$load->finish;
my $all = committed_ids($node, 'postgres');
$kafka->wait_for_events($DRILL_TOPIC, [ keys %$all ], 90);
$msgs = $kafka->read_java($DRILL_TOPIC);
$_->{topic} = $DRILL_TOPIC foreach @$msgs;
my $fig = drill_figures($msgs, $all);
report_figures('leader kill -9', $fig, sprintf('recovery %.1f s', $recovery));
is(scalar(@{ $fig->{missing} }), 0, 'no loss');
is(scalar(@{ $fig->{strangers} }), 0, 'no phantom');
is($fig->{order_violations}, 0, 'each aggregate in order');
is($fig->{gaps}, 0, 'without gaps');
is($fig->{split}, 0, 'each aggregate in one partition');
cmp_ok($fig->{duplicates}, '<=', 5000, "duplicates at most a page ($fig->{duplicates})");
my $st = relay_status($node, 'postgres');
is($st->{quarantined}, 0, 'a leader failover quarantines nothing');

$node->stop;
$kafka->down;
done_testing();
