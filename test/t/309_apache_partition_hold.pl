# test/t/309_apache_partition_hold.pl: failure drill on a real Apache
# Kafka cluster.  Two topics under one relay: "sick", replication factor
# 1, with partitions on every broker, and "well", replicated on two
# brokers only.  The third broker is stopped for a minute under load, so
# the sick topic's partitions on it have no leader at all (no replica to
# elect).  The relay holds exactly those partitions and nothing else: a
# consumer of the well topic keeps seeing events within a second.  After
# the broker is started again the held events arrive, nothing is lost,
# nothing out of order, outbox.held ends empty.

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

my $batch_size = 500;
my $outage = 60;    # seconds
my $victim = 3;     # the broker stopped
my $sick = 'outbox.event.sick';
my $well = 'outbox.event.well';

my $kafka = OutboxKafka::Cluster->start(brokers => 3);

# Placed by hand rather than by the brokers' choice, so that the drill
# does not depend on where Kafka happens to put replicas: the sick topic
# has one replica per partition, round the brokers (min.insync.replicas 1:
# the only replica is all the ISR there is); the well topic never touches
# the victim, so its writes need nothing from it.
$kafka->tool('org.apache.kafka.tools.TopicCommand',
	'--bootstrap-server', $kafka->bootstrap, '--create', '--topic', $sick,
	'--replica-assignment', '1,2,3,1,2,3',
	'--config', 'min.insync.replicas=1');
$kafka->tool('org.apache.kafka.tools.TopicCommand',
	'--bootstrap-server', $kafka->bootstrap, '--create', '--topic', $well,
	'--replica-assignment', '1:2,2:1,1:2,2:1,1:2,2:1');

# the relay learns a topic's partitions when it meets it: only once the
# brokers know both topics
my ($sick_leaders, $well_leaders);
my $deadline = time() + 60;
while (time() < $deadline)
{
	$sick_leaders = eval { $kafka->leaders($sick) } // {};
	$well_leaders = eval { $kafka->leaders($well) } // {};
	last if keys %$sick_leaders == 6 && keys %$well_leaders == 6;
	usleep(500_000);
}
is(scalar(keys %$sick_leaders), 6, "$sick has 6 partitions");
is(scalar(keys %$well_leaders), 6, "$well has 6 partitions");
my @held_parts = sort { $a <=> $b }
  grep { $sick_leaders->{$_}{leader} == $victim } keys %$sick_leaders;
my %held_part = map { $_ => 1 } @held_parts;
is(join(',', @held_parts), '2,5', "broker $victim leads partitions 2 and 5 of $sick");
ok(!(grep { $_->{leader} == $victim || grep { $_ == $victim } @{ $_->{isr} } } values %$well_leaders),
	"broker $victim holds no replica of $well");
my $want = join ',', map { "$sick/$_" } @held_parts;

my $node = outbox_node(
	'apache309', $kafka,
	conf => qq{
outbox.batch_size = $batch_size
outbox.hold_after = 1000
outbox.retry_backoff_min = '100ms'
outbox.retry_backoff_max = '1s'
});
drill_setup($node, 'postgres');
ok(defined wait_for_relay($node, 'postgres', 30), 'the relay runs');

my $held_list_sql = q{SELECT coalesce(string_agg(topic || '/' || kafka_partition, ','
  ORDER BY topic, kafka_partition), '') FROM outbox.holds()};

my %tail = map { $_ => OutboxDrill::Tail->start($kafka, $_) } ($sick, $well);
my $load = OutboxDrill::Load->start(
	$node, 'postgres',
	types => [ 'sick', 'well' ],
	seconds => $outage + 25,
	rate => 100);
ok(poll_until($node, 'postgres', 'SELECT published > 500 FROM outbox.status()', 't', 60),
	'the load is published before the outage');
usleep(3_000_000);

my $log_stop = -s $node->logfile;
my $t_stop = time();
$kafka->stop_broker($victim);
note sprintf('broker %d stopped in %.1f s', $victim, time() - $t_stop);

ok(poll_until($node, 'postgres', $held_list_sql, $want, 60),
	"outbox.holds() lists the partitions of broker $victim ($want)");
my $t_held = time();
note sprintf('the hold was in place %.1f s after the stop began', $t_held - $t_stop);
usleep(3_000_000);
# held events count in status()'s backlog (read after the table: the rows
# only grow while the broker is away)
my $held_now = $node->safe_psql('postgres', 'SELECT count(*) FROM outbox.held');
my $st = relay_status($node, 'postgres');
cmp_ok($held_now, '>', 0, "outbox.held holds events ($held_now)");
cmp_ok($st->{backlog}, '>=', $held_now, "status().backlog counts them ($st->{backlog})");
my $h = query_json($node, 'postgres',
	"SELECT row_to_json(h) FROM outbox.health(max_age => '10 min') h");
is($h->{status}, 'warning', 'health() is a warning while the partitions are held');
like($h->{reason} // '', qr/held/, 'its reason says so: ' . ($h->{reason} // ''));

my %seen_held;
while (time() < $t_stop + $outage)
{
	$seen_held{$_}++ foreach split /,/, $node->safe_psql('postgres', $held_list_sql);
	usleep(1_000_000);
}
is(join(',', sort keys %seen_held), $want,
	'throughout the outage only those partitions are held');
my $held_before = $node->safe_psql('postgres', 'SELECT count(*) FROM outbox.held');
note "$held_before events held when the broker is started again";

my $probes = probe_ids($node, 'postgres');
my $t_start = time();
$kafka->start_broker($victim);
ok(poll_until($node, 'postgres', 'SELECT count(*) FROM outbox.held', '0', 120),
	'after the broker is back, outbox.held empties');
note sprintf('held events drained %.1f s after the broker was started (its start included)',
	time() - $t_start);
$load->finish;
ok(poll_until($node, 'postgres', 'SELECT backlog FROM outbox.status()', '0', 60),
	'and the backlog drains');

my $all = committed_ids($node, 'postgres');
my $committed_at = commit_times($node, 'postgres');
my (%arrived, @missing_tail);
$deadline = time() + 60;
while (1)
{
	foreach my $topic ($sick, $well)
	{
		my $a = $tail{$topic}->arrivals;
		$arrived{$_} //= { %{ $a->{$_} }, topic => $topic } foreach keys %$a;
	}
	@missing_tail = grep { !$arrived{$_} } keys %$all;
	last if !@missing_tail || time() > $deadline;
	usleep(500_000);
}
is(scalar(@missing_tail), 0, 'the tail consumers saw every committed event');
$_->stop foreach values %tail;

# latency: a consumer's arrival time minus the application's commit time
my (@well_lat, @sick_live_lat, $sick_n, $sick_early);
foreach my $id (keys %$all)
{
	my $a = $arrived{$id} or next;
	my $c = $committed_at->{$id};
	next unless $c >= $t_held + 1 && $c < $t_start;
	if ($a->{topic} eq $well)
	{
		push @well_lat, $a->{at} - $c;
	}
	elsif ($held_part{ $a->{partition} })
	{
		$sick_n++;
		$sick_early++ if $a->{at} < $t_start;
	}
	else
	{
		push @sick_live_lat, $a->{at} - $c;
	}
}
my $p99 = percentile(\@well_lat, 99);
diag(sprintf(
		'Apache partition hold: %s commit-to-arrival p50 %.3f s, p99 %.3f s, max %.3f s (%d events); '
		  . 'live partitions of %s p99 %.3f s (%d events); %d events held',
		$well, percentile(\@well_lat, 50) // -1, $p99 // -1,
		percentile(\@well_lat, 100) // -1, scalar(@well_lat),
		$sick, percentile(\@sick_live_lat, 99) // -1, scalar(@sick_live_lat),
		$held_before));
cmp_ok(scalar(@well_lat), '>', 1000, "$well received events during the outage");
cmp_ok($p99 // 1e9, '<=', 1.0, "$well: p99 commit-to-arrival latency at most 1 s during the outage");
cmp_ok($sick_n // 0, '>', 100, "events for the held partitions were committed during the outage ($sick_n)");
is($sick_early // 0, 0, 'none of them arrived before the broker was started again');

# the Java client reads back, independent of librdkafka; each event's
# topic as the application wrote it
my %topic_of = map { split /\|/ } split /\n/, $node->safe_psql('postgres',
	'SELECT e.event_id, e.topic FROM outbox.events e JOIN drill_committed d USING (event_id)');
is(scalar(keys %topic_of), scalar(keys %$all), 'outbox.events still has every committed event');
my @msgs;
foreach my $topic ($sick, $well)
{
	my $ids = [ grep { ($topic_of{$_} // "") eq $topic } keys %$all ];
	$kafka->wait_for_events($topic, $ids, 90);
	my $m = $kafka->read_java($topic) // [];
	$_->{topic} = $topic foreach @$m;
	push @msgs, @$m;
}
my $fig = drill_figures(\@msgs, $all);
note_duplicates('Apache partition hold', \@msgs, $probes);
report_figures('Apache partition hold', $fig, sprintf('%s p99 %.3f s', $well, $p99 // -1));
is(scalar(@{ $fig->{missing} }), 0, 'no loss');
is(scalar(@{ $fig->{strangers} }), 0, 'no phantom');
is($fig->{order_violations}, 0, 'each aggregate in order');
is($fig->{gaps}, 0, 'without gaps');
is($fig->{split}, 0, 'each aggregate in one partition');
cmp_ok($fig->{duplicates}, '<=', $batch_size, "duplicates at most a page ($fig->{duplicates})");
my @wrong = grep { $_->{java_partition} != $_->{partition} } @msgs;
is(scalar(@wrong), 0, 'every event is on the partition Java\'s partitioner picks for its key');

ok( defined wait_for_log_match(
		$node, qr/released topic "\Q$sick\E" partition $held_parts[-1]\b/,
		$log_stop, 30),
	'the end of the hold is logged');
my $lines = hold_log_lines($node, $log_stop);
is_deeply($lines->{holding}, { map { ("$sick/$_" => 1) } @held_parts },
	'one "holding" line per held partition');
is_deeply($lines->{released}, { map { ("$sick/$_" => 1) } @held_parts },
	'one "released" line per held partition');
is($node->safe_psql('postgres', 'SELECT count(*) FROM outbox.held'), '0',
	'outbox.held is empty at the end');
ok(poll_until($node, 'postgres', 'SELECT status FROM outbox.health()', 'ok', 30),
	'health() is ok again');
is(relay_status($node, 'postgres')->{quarantined}, 0, 'nothing was quarantined');

$node->stop;
$kafka->down;
done_testing();
