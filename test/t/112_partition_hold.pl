# test/t/112_partition_hold.pl: failure drill.  One broker of three goes
# down, so the partitions it leads have no leader, while the others keep
# acknowledging.  The relay holds those partitions only (outbox.held,
# outbox.holds(), metrics() and health() say so, status() counts the held
# events in its backlog, one log line when each hold starts and one when
# it ends) and the rest of the topic
# keeps flowing: a consumer sees events of the live partitions within a
# second while the outage lasts.  When the broker returns the held events
# arrive, nothing is lost, every aggregate stays in order and at most one
# page is duplicated.  A kill -9 of the relay in the middle of a hold
# loses nothing either, and a hold of 200,000 events costs the relay
# bounded memory, on the way in and on the way out.

use strict;
use warnings;

use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep time);

# found without -I: PGXS resets PROVE_FLAGS after the Makefile sets it
use FindBin;
use lib "$FindBin::RealBin/../perl";
use OutboxTest;
use OutboxDrill;

my $batch_size = 500;
my $outage = 60;          # seconds, drill (a)
my $partitions = 6;       # of the drill topic
my $bulk_topic = 'outbox.event.bulk';
my $bulk_partitions = 90; # many: the mock keeps only ~5 MB per partition
my $bulk_events = 200_000;
# the relay's RssAnon bound for (c), the README's: a hold adds one probe
# event per held partition to the relay's memory, whatever its size, so
# what it holds is its two pages (small here) and librdkafka (about 8 MB
# measured, printed by diag for the README)
my $rss_bound_kb = 64 * 1024;

my $kafka = OutboxTest::Broker->start(brokers => 3);

# Created before the relay meets them: the relay counts a topic's
# partitions when it first meets it, and the mock would auto-create 4.
$kafka->command("create $DRILL_TOPIC $partitions");
$kafka->command("create $bulk_topic $bulk_partitions");

# partition => leader, as kcat (not the relay's librdkafka) reads it
sub mock_leaders
{
	my ($topic) = @_;
	my $meta = `kcat -L -b ${\ $kafka->bootstrap } -t $topic 2>&1`;
	my %l = $meta =~ /partition (\d+), leader (\d+),/g;
	return \%l;
}

# The broker to stop: one that leads some of the drill topic's partitions
# but not all (the mock spreads leaders over the brokers; broker 1 first).
my $leaders = mock_leaders($DRILL_TOPIC);
is(scalar(keys %$leaders), $partitions, "kcat sees the $partitions partitions of $DRILL_TOPIC");
my ($victim) = grep {
	my $b = $_;
	my $n = grep { $_ == $b } values %$leaders;
	$n > 0 && $n < $partitions
} 1 .. 3;
ok(defined $victim, 'a broker leads some partitions of the drill topic, not all')
  or BAIL_OUT('no broker leads part of the drill topic');
my @sick = sort { $a <=> $b } grep { $leaders->{$_} == $victim } keys %$leaders;
my %sick = map { $_ => 1 } @sick;
my $bulk_leaders = mock_leaders($bulk_topic);
my @bulk_sick = sort { $a <=> $b }
  grep { $bulk_leaders->{$_} == $victim } keys %$bulk_leaders;
note "broker $victim leads partitions @sick of $DRILL_TOPIC and "
  . scalar(@bulk_sick) . " of the $bulk_partitions of $bulk_topic";
ok(@bulk_sick > 0 && @bulk_sick < $bulk_partitions,
	"broker $victim leads part of $bulk_topic too");

my $node = outbox_node(
	'hold', $kafka, conf => qq{
outbox.batch_size = $batch_size
outbox.hold_after = 1000
outbox.retry_backoff_min = '100ms'
outbox.retry_backoff_max = '2s'
restart_after_crash = on
});
drill_setup($node, 'postgres');
my ($pid) = wait_for_relay($node, 'postgres', 10);
ok(defined $pid, 'the relay runs');

# the held topic-partitions as one line, "topic/partition,..."
my $held_list_sql = q{SELECT coalesce(string_agg(topic || '/' || kafka_partition, ','
  ORDER BY topic, kafka_partition), '') FROM outbox.holds()};

sub held_list
{
	return $node->safe_psql('postgres', $held_list_sql);
}

sub held_count
{
	return $node->safe_psql('postgres', 'SELECT count(*) FROM outbox.held');
}

sub health
{
	my ($max_age) = @_;
	my $arg = defined $max_age ? "max_age => '$max_age'" : '';
	return query_json($node, 'postgres',
		"SELECT row_to_json(h) FROM outbox.health($arg) h");
}

my $want_drill = join ',', map { "$DRILL_TOPIC/$_" } @sick;

# ---------------------------------------------------------------------------
# (a) one broker down for a minute under 400 events/s

# the load outlasts the outage by ~10 s, so that the drain runs under it
my $tail = OutboxDrill::Tail->start($kafka, $DRILL_TOPIC);
my $load = OutboxDrill::Load->start(
	$node, 'postgres',
	seconds => $outage + 14,
	rate => 200,
	aggregates => 200);
ok(poll_until($node, 'postgres', 'SELECT published > 1000 FROM outbox.status()', 't', 30),
	'the load is published before the outage');
usleep(2_000_000);    # a baseline for the latency before the outage

my $log_down = -s $node->logfile;
$kafka->command("down $victim");
my $t_down = time();

# the hold takes outbox.hold_after (1 s) plus a round; then it must name
# exactly the stopped broker's partitions
ok(poll_until($node, 'postgres', $held_list_sql, $want_drill, 20),
	"outbox.holds() lists the partitions of broker $victim ($want_drill)");
my $t_held = time();
note sprintf('the hold was in place %.1f s after the broker went down', $t_held - $t_down);
is( $node->safe_psql(
		'postgres', q{
SELECT coalesce(string_agg((x->>'topic') || '/' || (x->>'partition'), ','
  ORDER BY x->>'topic', (x->>'partition')::int), '')
  FROM outbox.status, jsonb_array_elements(holds) x
 WHERE (x->>'events')::int > 0 AND x->>'since' IS NOT NULL}),
	$want_drill,
	'the view outbox.status names the same partitions in holds, with events and since');

# wait for events to pile up before reading the figures
usleep(3_000_000);
my $holds = holds_of($node, 'postgres');
is(join(',', map { "$_->{topic}/$_->{kafka_partition}" } @$holds),
	$want_drill, 'holds() lists exactly those partitions');
ok(!(grep { $_->{events} <= 0 || !defined $_->{held_since} } @$holds),
	'each with events and a held_since');
# status() keeps its 1.3 columns: held events count in its backlog and
# the age of the oldest undelivered event, so that it never says 0 or
# NULL while events wait (read after holds(): the rows only grow now)
my $held_sum = 0;
$held_sum += $_->{events} foreach @$holds;
my $st = relay_status($node, 'postgres');
cmp_ok($st->{backlog}, '>=', $held_sum,
	"status().backlog ($st->{backlog}) counts the $held_sum held events");
cmp_ok($st->{oldest_pending_seconds} // 0, '>=', 2,
	'status().oldest_pending_seconds counts the oldest held event ('
	  . ($st->{oldest_pending_seconds} // 'NULL') . ' s)');
note "relay state during the hold: $st->{state}";

my $hm = held_metrics($node, 'postgres');
is($hm->{partitions}, scalar(@sick), "metrics(): outbox_held_partitions is " . scalar(@sick));
is(join(',', sort keys %{ $hm->{events} }), $want_drill,
	'metrics(): one outbox_held_events sample per held partition');
ok(!(grep { $_ <= 0 } values %{ $hm->{events} }), 'each counting events');
cmp_ok($hm->{oldest} // 0, '>=', 2,
	'metrics(): outbox_held_oldest_seconds is the age of the hold (' . ($hm->{oldest} // 'absent') . ')');

my $h = health('10 min');
is($h->{status}, 'warning', 'health() is a warning while a partition is held');
like($h->{reason} // '', qr/held/, "its reason says so: " . ($h->{reason} // ''));
$h = health('2 s');
is($h->{status}, 'critical', 'and critical once the hold is older than max_age');
note 'health(2 s) reason: ' . ($h->{reason} // '');

# the rest of the outage: the hold never spreads to a live partition
my %seen_held;
while (time() < $t_down + $outage)
{
	$seen_held{$_}++ foreach split /,/, held_list();
	usleep(1_000_000);
}
is(join(',', sort keys %seen_held), $want_drill,
	'throughout the outage only the stopped broker\'s partitions are held');
my $held_before_up = held_count();
cmp_ok($held_before_up, '>', 1000, "outbox.held holds $held_before_up events before the broker returns");

# the rows themselves: each names the partition murmur2 of its event's key
# gives, one of the stopped broker's, and when it was held
my @rows = map { [ split /\|/ ] } split /\n/, $node->safe_psql(
	'postgres', q{
SELECT e.key IS NOT NULL, e.key, h.topic, h.kafka_partition,
       h.held_at IS NOT NULL AND h.held_at <= clock_timestamp()
  FROM outbox.held h LEFT JOIN outbox.events e ON e.id = h.id});
cmp_ok(scalar(@rows), '>=', $held_before_up, 'outbox.held read (' . scalar(@rows) . ' rows)');
is(scalar(grep { $_->[0] ne 't' } @rows), 0, 'every row of outbox.held names an event of outbox.events');
@rows = map { [ @$_[ 1 .. 4 ] ] } @rows;
my @odd = grep {
	$_->[1] ne $DRILL_TOPIC
	  || !$sick{ $_->[2] }
	  || $_->[2] != java_partition($_->[0], $partitions)
	  || $_->[3] ne 't'
} @rows;
is(scalar(@odd), 0, 'each on a held partition, the one its key maps to, with its held_at')
  or diag 'for instance key, topic, partition, held_at set: '
  . join('; ', map { join ' ', @$_ } @odd[ 0 .. ($#odd < 4 ? $#odd : 4) ]);
my $probes_a = probe_ids($node, 'postgres');

my $t_up = time();
$kafka->command("up $victim");

ok(poll_until($node, 'postgres', 'SELECT count(*) FROM outbox.held', '0', 60),
	'after the broker returns, outbox.held empties');
note sprintf('%d held events drained %.1f s after the broker returned, under load',
	$held_before_up, time() - $t_up);
$load->finish;
ok(poll_until($node, 'postgres', 'SELECT backlog FROM outbox.status()', '0', 60),
	'and the backlog drains');

my $all_a = committed_ids($node, 'postgres');
my $arrived = $tail->wait_for([ keys %$all_a ], 60);
$tail->stop;
my $msgs = wait_for_events($kafka, $DRILL_TOPIC, [ keys %$all_a ], 60);
my $fig = drill_figures([ map { { %$_, topic => $DRILL_TOPIC } } @$msgs ], $all_a);

# latency: a consumer's arrival time minus the application's commit time.
# The bound holds once the hold is in place: events committed while the
# page with the stalled partitions waits outbox.hold_after wait with it,
# by design (reported as "whole outage", not asserted).
my $committed_at = commit_times($node, 'postgres');
my (@live_hold, @live_outage, @live_before, $sick_early, $sick_n);
foreach my $id (keys %$all_a)
{
	my $a = $arrived->{$id} or next;
	my $c = $committed_at->{$id};
	my $lat = $a->{at} - $c;
	if ($sick{ $a->{partition} })
	{
		# committed once the broker was down: it cannot arrive before "up"
		next unless $c > $t_down + 0.5 && $c < $t_up;
		$sick_n++;
		$sick_early++ if $a->{at} < $t_up;
		next;
	}
	push @live_before, $lat if $c < $t_down;
	push @live_outage, $lat if $c >= $t_down && $c < $t_up;
	push @live_hold, $lat if $c >= $t_held + 1 && $c < $t_up;
}
my $p99 = percentile(\@live_hold, 99);
diag(sprintf(
		'partition hold: live partitions\' commit-to-arrival latency p50 %.3f s, p99 %.3f s, max %.3f s (%d events, hold in place); '
		  . 'whole outage p99 %.3f s, max %.3f s (%d events); before the outage p99 %.3f s',
		percentile(\@live_hold, 50) // -1, $p99 // -1, percentile(\@live_hold, 100) // -1,
		scalar(@live_hold), percentile(\@live_outage, 99) // -1,
		percentile(\@live_outage, 100) // -1, scalar(@live_outage),
		percentile(\@live_before, 99) // -1));
# the live partitions keep flowing: every event committed on one while the
# hold lasts (5 s short of the broker's return) reached the consumer before
# the broker returned.  Counted against what was committed, not a rate, so
# that a slow machine's lower load does not fail it.
my %part_of = map { (($_->{headers}{id} // '') => $_->{partition}) } @$msgs;
my ($live_due, @live_late) = (0);
foreach my $id (keys %$all_a)
{
	my $c = $committed_at->{$id};
	next unless $c >= $t_held + 1 && $c < $t_up - 5;
	my $p = $part_of{$id};
	next if !defined $p || $sick{$p};
	$live_due++;
	push @live_late, $id unless $arrived->{$id} && $arrived->{$id}{at} < $t_up;
}
cmp_ok($live_due, '>', 500, "events were committed on the live partitions while the hold lasted ($live_due)");
is(scalar(@live_late), 0,
	'each of them reached the consumer before the stopped broker returned')
  or diag 'for instance ' . join(', ', @live_late[ 0 .. ($#live_late < 4 ? $#live_late : 4) ]);
cmp_ok($p99 // 1e9, '<=', 1.0,
	'their p99 commit-to-arrival latency while the hold lasts is at most 1 s');
cmp_ok($sick_n // 0, '>', 1000, "the stopped broker's partitions had events committed during the outage ($sick_n)");
is($sick_early // 0, 0, 'none of them arrived before the broker returned');

note_duplicates('partition hold', $msgs, $probes_a);
report_figures('partition hold', $fig,
	sprintf('%d held before up, p99 %.3f s', $held_before_up, $p99 // -1));
is(scalar(@{ $fig->{missing} }), 0, 'zero loss: every committed event is in Kafka');
is(scalar(@{ $fig->{strangers} }), 0, 'Kafka holds no event that was not committed');
is($fig->{order_violations}, 0, 'every aggregate in order');
is($fig->{gaps}, 0, 'without gaps');
is($fig->{split}, 0, 'each aggregate stays in one partition');
cmp_ok($fig->{duplicates}, '<=', $batch_size,
	"duplicates at most one page ($fig->{duplicates})");
my $dups_a = $fig->{duplicates};

# the relay chose each partition itself: Java's murmur2 of the key
my @wrong = grep { $_->{partition} != java_partition($_->{key}, $partitions) } @$msgs;
is(scalar(@wrong), 0, 'every event is on the partition murmur2 of its key gives');

# one line per hold when it starts, one when it ends
ok( defined wait_for_log_match(
		$node, qr/released topic "\Q$DRILL_TOPIC\E" partition $sick[-1]\b/,
		$log_down, 30),
	'the end of the hold is logged');
my $lines = hold_log_lines($node, $log_down);
is_deeply($lines->{holding}, { map { ("$DRILL_TOPIC/$_" => 1) } @sick },
	'one "holding topic ... partition N" line per held partition');
is_deeply($lines->{released}, { map { ("$DRILL_TOPIC/$_" => 1) } @sick },
	'one "released topic ... partition N" line per held partition');

is(held_count(), 0, 'outbox.held is empty after the recovery');
ok(poll_until($node, 'postgres', 'SELECT status FROM outbox.health()', 'ok', 30),
	'health() is ok again');
is_deeply(holds_of($node, 'postgres'), [], 'holds() lists nothing');
$st = relay_status($node, 'postgres');
ok(!defined $st->{oldest_pending_seconds}, 'status().oldest_pending_seconds is NULL again');
$hm = held_metrics($node, 'postgres');
is($hm->{partitions}, 0, 'metrics(): outbox_held_partitions is 0');
is(scalar(keys %{ $hm->{events} }), 0, 'metrics(): no outbox_held_events sample is left');
cmp_ok($hm->{oldest} // -1, '==', 0, 'metrics(): outbox_held_oldest_seconds is 0');

# ---------------------------------------------------------------------------
# (b) kill -9 of the relay in the middle of a hold

$load = OutboxDrill::Load->start($node, 'postgres', seconds => 30, rate => 100);
usleep(2_000_000);
$kafka->command("down $victim");
ok( poll_until(
		$node, 'postgres',
		"SELECT coalesce(sum(events), 0) > 200 FROM outbox.holds()", 't', 30),
	'the hold starts again and piles up events');
is(held_list(), $want_drill, 'on the same partitions');
my $held_at_kill = held_count();
my $relay = relay_pid($node, 'postgres');
my $log_kill = -s $node->logfile;
ok(defined $relay && kill('KILL', $relay),
	"SIGKILL to the relay with $held_at_kill events held");
ok( defined wait_for_log_match(
		$node, qr/all server processes terminated; reinitializing/,
		$log_kill, 60),
	'the server does a crash restart');
# from the log rather than by trying: a psql refused while the server
# recovers can exit before its query is written, which IPC::Run dies of
ok( defined wait_for_log_match(
		$node, qr/reinitializing.*database system is ready to accept connections/s,
		$log_kill, 60),
	'the server accepts connections again');
my ($again) = wait_for_relay($node, 'postgres', 60, $relay);
ok(defined $again, 'a new relay runs');
cmp_ok(held_count(), '>=', $held_at_kill, 'the held events survived the crash');
ok( poll_until(
		$node, 'postgres',
		"SELECT count(*) > $held_at_kill FROM outbox.held", 't', 30),
	'the new relay goes on holding the later events');
is(held_list(), $want_drill, 'on the same partitions');
usleep(3_000_000);
my $probes_b = probe_ids($node, 'postgres');
$kafka->command("up $victim");

ok(poll_until($node, 'postgres', 'SELECT count(*) FROM outbox.held', '0', 60),
	'after the broker returns, outbox.held empties');
$load->finish;
ok(poll_until($node, 'postgres', 'SELECT backlog FROM outbox.status()', '0', 60),
	'and the backlog drains');
my $all_b = committed_ids($node, 'postgres');
$msgs = wait_for_events($kafka, $DRILL_TOPIC, [ keys %$all_b ], 60);
$fig = drill_figures([ map { { %$_, topic => $DRILL_TOPIC } } @$msgs ], $all_b);
note_duplicates('kill -9 during a hold (both drills)', $msgs, { %$probes_a, %$probes_b });
report_figures('kill -9 during a hold', $fig);
is(scalar(@{ $fig->{missing} }), 0, 'zero loss across the kill');
is(scalar(@{ $fig->{strangers} }), 0, 'no event that was not committed');
is($fig->{order_violations}, 0, 'every aggregate in order');
is($fig->{gaps}, 0, 'without gaps');
cmp_ok($fig->{duplicates} - $dups_a, '<=', $batch_size,
	'the kill re-sent at most one page (' . ($fig->{duplicates} - $dups_a) . ' duplicates)');

# ---------------------------------------------------------------------------
# (c) the relay's memory while 200,000 events are held, and while they drain

# aggregates whose key lands on a partition of the stopped broker
my %bulk_sick = map { $_ => 1 } @bulk_sick;
my (@keys, %per_part);
for (my $n = 1; @keys < 2000; $n++)
{
	my $k = "m-$n";
	my $p = java_partition($k, $bulk_partitions);
	next unless $bulk_sick{$p};
	push @keys, $k;
	$per_part{$p}++;
}
is(scalar(keys %per_part), scalar(@bulk_sick),
	'2000 aggregates chosen, on every partition of the stopped broker');
my $keys_sql = "ARRAY['" . join("','", @keys) . "']";

$kafka->command("down $victim");

# a first round with an event on every partition: the live ones
# acknowledge, so that the relay holds the others rather than taking the
# round for an outage of the whole cluster
my %first_of;
for (my $n = 1; keys %first_of < $bulk_partitions; $n++)
{
	$first_of{ java_partition("f-$n", $bulk_partitions) } //= "f-$n";
}
$node->safe_psql('postgres',
	    "INSERT INTO drill_committed (event_id, aggregate_id)"
	  . " SELECT outbox.emit('bulk', k, 'bulk.piled', '{}'), k"
	  . " FROM unnest(ARRAY['" . join("','", map { $first_of{$_} } sort { $a <=> $b } keys %first_of) . "']) k");
my $want_bulk = join ',', map { "$bulk_topic/$_" } @bulk_sick;
ok( poll_until(
		$node, 'postgres',
		"SELECT coalesce(string_agg(topic || '/' || kafka_partition, ',' ORDER BY kafka_partition), '')"
		  . " FROM outbox.holds() WHERE topic = '$bulk_topic'",
		$want_bulk, 30),
	"the partitions of broker $victim in $bulk_topic are held");

# RssAnon of the relay every 50 ms, sampled by a process of its own so
# that the blocking emits below do not leave gaps: "time kB" lines
$relay = relay_pid($node, 'postgres');
my $rss_file = PostgreSQL::Test::Utils::tempdir('rss') . '/samples';
my $sampler = IPC::Run::start(
	[
		$^X, '-MTime::HiRes=time,usleep', '-e', q{
my ($pid, $file) = @ARGV;
open my $out, '>', $file or die "$file: $!";
$out->autoflush(1);
while (open my $st, '<', "/proc/$pid/status")
{
	while (<$st>) { printf $out "%.3f %d\n", time, $1 if /^RssAnon:\s+(\d+)/; }
	close $st;
	usleep(50_000);
}
}, $relay, $rss_file
	],
	'<', \undef);
usleep(300_000);
my $t_emit = time();

# four transactions of 50,000 emits: later events of a held partition go
# to outbox.held without being sent
my $per_tx = $bulk_events / 4 / @keys;
foreach my $tx (1 .. 4)
{
	$node->safe_psql('postgres',
		    "INSERT INTO drill_committed (event_id, aggregate_id)"
		  . " SELECT outbox.emit('bulk', k, 'bulk.piled', jsonb_build_object('tx', $tx, 'i', i)), k"
		  . " FROM generate_series(1, $per_tx) i, unnest($keys_sql) k");
}
note sprintf('200,000 events emitted in %.1f s', time() - $t_emit);
ok( poll_until(
		$node, 'postgres', "SELECT count(*) >= $bulk_events FROM outbox.held",
		't', 120),
	'the 200,000 events are held');
my $held_now = held_count();
note sprintf('%d events held %.1f s after the first emit', $held_now, time() - $t_emit);
usleep(2_000_000);
is(relay_pid($node, 'postgres'), $relay, 'the same relay process holds them');

my $probes_c = probe_ids($node, 'postgres');

my $t_up_c = time();
$kafka->command("up $victim");
my $deadline = time() + 180;
usleep(100_000) until held_count() == 0 || time() > $deadline;
my $t_drained_c = time();
my $drain_s = $t_drained_c - $t_up_c;
is(held_count(), 0, 'the held events drain after the broker returns');
usleep(200_000);
$sampler->kill_kill;
my ($rss_start, $max_hold, $max_drain) = (undef, 0, 0);
foreach (split /\n/, slurp_file($rss_file))
{
	my ($t, $kb) = split / /;
	$rss_start //= $kb;
	my $max = $t < $t_up_c ? \$max_hold : \$max_drain;
	$$max = $kb if $kb > $$max && $t <= $t_drained_c;
}
diag(sprintf(
		'relay RssAnon: %.1f MB before the hold, at most %.1f MB while %d events were held, '
		  . 'at most %.1f MB while they drained (%.1f s, %.0f events/s)',
		($rss_start // 0) / 1024, $max_hold / 1024, $held_now, $max_drain / 1024,
		$drain_s, $drain_s > 0 ? $held_now / $drain_s : 0));
cmp_ok($max_hold, '<=', $rss_bound_kb,
	'the relay\'s private memory stays under 64 MB while 200,000 events are held');
cmp_ok($max_drain, '<=', $rss_bound_kb, 'and while they drain');

my $all_c = committed_ids($node, 'postgres', "aggregate_id LIKE 'm-%' OR aggregate_id LIKE 'f-%'");
$msgs = wait_for_events($kafka, $bulk_topic, [ keys %$all_c ], 120);
my %low;
foreach (@$msgs)
{
	$low{ $_->{partition} } = $_->{offset}
	  if !defined $low{ $_->{partition} } || $_->{offset} < $low{ $_->{partition} };
}
is(scalar(grep { $_ != 0 } values %low), 0,
	'the mock kept every partition from offset 0 (nothing aged out before the read)');
$fig = drill_figures([ map { { %$_, topic => $bulk_topic } } @$msgs ], $all_c);
note_duplicates('200,000 held events', $msgs, $probes_c);
report_figures('200,000 held events', $fig,
	sprintf('RssAnon max %.1f MB held, %.1f MB draining', $max_hold / 1024, $max_drain / 1024));
is(scalar(@{ $fig->{missing} }), 0, 'zero loss: every held event is in Kafka');
is(scalar(@{ $fig->{strangers} }), 0, 'no event that was not committed');
is($fig->{order_violations}, 0, 'every aggregate in order');
is($fig->{gaps}, 0, 'without gaps');
cmp_ok($fig->{duplicates}, '<=', $batch_size, "duplicates at most one page ($fig->{duplicates})");
ok(poll_until($node, 'postgres', 'SELECT status FROM outbox.health()', 'ok', 30),
	'health() is ok at the end');

$node->stop;
done_testing();
