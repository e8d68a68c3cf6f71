# test/soak/soak.pl: the soak.  A throwaway server with two databases, one
# emitting (emit() under a steady load with bursts, a trigger on an
# application table, a topic whose partitions have one replica each) and
# one consuming the main topic through a subscription, on a 3-broker
# Apache Kafka cluster, for OUTBOX_SOAK_MINUTES.  A seeded schedule injects
# a fault every few minutes, the next once the last has recovered: kill -9
# of the relay, of the subscription worker and of a broker, a postmaster
# crash, a fast restart, a reload of the batch size and the brokers, a
# partition held by its only broker's stop, a poison event quarantined and
# replayed, a long open transaction.  Each must recover (the relay and the
# worker running, the backlog back to a few seconds of load) within
# $RECOVER_S.  Samples every 10 s; kcat tails the topics for arrival times.
# At the end Kafka is read back by the Java client: every committed event
# there, none that did not commit, each aggregate in seq order, every event
# of the main topic applied once in the consuming database; memory and the
# log's size flat after the warm-up.  It writes samples.csv, latency.csv,
# faults.csv, charts and summary.md under OUTBOX_SOAK_OUT.
# Run through test/soak/run-soak (docs/development.md), never in CI.

use strict;
use warnings;

use IPC::Run;
use List::Util qw(shuffle max);
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep time);

use FindBin;
use lib "$FindBin::RealBin/../perl";
use OutboxTest;
use OutboxDrill;
use OutboxKafka;
use OutboxFailover;
use OutboxSoak;

my $MINUTES = $ENV{OUTBOX_SOAK_MINUTES} // 5;
my $SEED = $ENV{OUTBOX_SOAK_SEED} // int(time()) % 1_000_000;
my $OUT = $ENV{OUTBOX_SOAK_OUT} // PostgreSQL::Test::Utils::tempdir('soak');
my $SHORT = $MINUTES <= 5;      # the harness's own proof: each fault once
my $RECOVER_S = 120;            # the bound a fault must recover within
my $RATE = 50;                  # emit() transactions/s, two events each
my %LOAD = (trigger => 20, single => 10, burst => 250, burst_s => 15);
my $DOWN_S = $SHORT ? 10 : 60;  # a held partition, a long transaction
my $KILLED_S = $SHORT ? 10 : 20; # a broker killed
my $WARMUP_S = $SHORT ? 20 : 120;
my $COOLDOWN_S = $SHORT ? 30 : 120;
# between a fault's recovery and the next: every few minutes in an hour
my @GAP_S = $SHORT ? (3, 6) : $MINUTES >= 45 ? (60, 180) : (20, 60);
my $TOTAL_S = $MINUTES * 60;
srand($SEED);
note "soak: $MINUTES minutes, seed $SEED, figures in $OUT";

my $kafka = OutboxKafka::Cluster->start(brokers => 3);
my $boot = $kafka->bootstrap;
$kafka->create_topic($DRILL_TOPIC, 6);
$kafka->create_topic('outbox.event.order', 3);
$kafka->create_topic('outbox.event.small', 3, 'max.message.bytes' => 2000);
# one replica per partition: stopping its broker holds the partition
$kafka->tool('org.apache.kafka.tools.TopicCommand', '--bootstrap-server', $boot,
	'--create', '--topic', 'outbox.event.single', '--replica-assignment', '1,2,3',
	'--config', 'min.insync.replicas=1');

my $node = outbox_node(
	'soak', $kafka,
	conf => q{
outbox.retention = '1min'
outbox.max_attempts = 2
outbox.retry_backoff_min = '100ms'
outbox.retry_backoff_max = '2s'
restart_after_crash = on
log_min_messages = warning
});
drill_setup($node, 'postgres');
$node->safe_psql('postgres', q{
CREATE TABLE shop_orders (id bigserial PRIMARY KEY, total int NOT NULL);
CREATE TRIGGER shop_orders_outbox AFTER INSERT ON shop_orders
	FOR EACH ROW EXECUTE FUNCTION outbox.capture('order', 'id');
CREATE DATABASE sink;});
$node->safe_psql('sink', q{
CREATE EXTENSION outbox;
CREATE TABLE applied (event_id text NOT NULL, aggregate_id text, seq bigint,
	applied_at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE FUNCTION public.apply(m outbox.inbound_message) RETURNS void LANGUAGE sql
	AS $$ INSERT INTO public.applied (event_id, aggregate_id, seq)
		  VALUES (m.event_id::text, m.aggregate_id, m.seq) $$;
SELECT outbox.subscribe('soak', ARRAY['outbox.event.drill'], 'public.apply(outbox.inbound_message)');});
ok(defined wait_for_relay($node, 'postgres', 60), 'the relay runs');
ok(poll_until($node, 'sink', "SELECT state FROM outbox.subscription_status() WHERE name = 'soak'",
		'running', 90), 'the subscription runs');

my @tails = map { OutboxDrill::Tail->start($kafka, $_) } ($DRILL_TOPIC, 'outbox.event.single');
my $t0 = time();
my $load_s = $TOTAL_S - $COOLDOWN_S;
my @loads = (
	OutboxDrill::Load->start($node, 'postgres', seconds => $load_s, rate => $RATE,
		aggregates => 500),
	OutboxDrill::Load->start($node, 'postgres', seconds => $load_s, rate => $LOAD{single},
		clients => 1, aggregates => 30, prefix => 's-', types => ['single']),
	# one in ten rolls back: its event must never reach Kafka
	OutboxDrill::Load->start($node, 'postgres', seconds => $load_s, rate => $LOAD{trigger},
		clients => 1, script => "\\set r random(1, 10)\nBEGIN;\n"
		  . "INSERT INTO shop_orders (total) VALUES (:r);\n"
		  . "\\if :r = 1\nROLLBACK;\n\\else\nCOMMIT;\n\\endif\n"));
my $sampler = OutboxSoak::Sampler->new($node, 'postgres', $t0, every => 10);

# ---------------------------------------------------------------- waiting

my $next_burst = $t0 + ($SHORT ? 90 : 240);
my $next_check = $t0 + 60;
my @overdue;
my %arrivals;    # tail_copies' state

sub arrived { return tail_copies(\%arrivals, @tails); }

# a burst on top of the steady load, every few minutes
sub maybe_burst
{
	return if time() < $next_burst || time() > $t0 + $load_s - $LOAD{burst_s};
	push @loads, OutboxDrill::Load->start($node, 'postgres', seconds => $LOAD{burst_s},
		rate => $LOAD{burst}, aggregates => 500, prefix => 'b-');
	$next_burst = time() + ($SHORT ? 600 : 180 + rand(120));
	return;
}

# the continuous check: events committed two to three minutes ago that no
# tail has seen yet (held or poisoned ones are let through by the final
# check, not this one: only the main and single topics' are looked at)
sub check_overdue
{
	return if time() < $next_check;
	$next_check = time() + 60;
	my ($ret, $out) = OutboxTest::try_psql($node, 'postgres',
		"SELECT event_id FROM drill_committed WHERE aggregate_id ~ '^[abs]-'"
		  . " AND committed_at >= clock_timestamp() - interval '180 s'"
		  . " AND committed_at < clock_timestamp() - interval '120 s'");
	return if $ret != 0;
	my $first = arrived()->{first};
	my @late = grep { $_ ne '' && !exists $first->{$_} } split /\n/, $out;
	push @overdue, [ sprintf('%.1f', (time() - $t0) / 60), scalar(@late) ];
	note sprintf('minute %.1f: %d events committed 2-3 minutes ago not seen yet',
		(time() - $t0) / 60, scalar(@late)) if @late;
	return;
}

# sleeps, sampling, bursting and checking meanwhile
sub soak_sleep
{
	my ($secs) = @_;
	my $until = time() + $secs;
	while (time() < $until)
	{
		$sampler->sample;
		maybe_burst();
		check_overdue();
		my $left = $until - time();
		usleep(1_000_000 * ($left < 0.5 ? ($left > 0 ? $left : 0) : 0.5));
	}
	return;
}

# polls code every half second (soak_sleep between) until it returns true
# or secs pass; returns its last result
sub soak_until
{
	my ($secs, $code) = @_;
	my $until = time() + $secs;
	my $r;
	until (($r = $code->()) || time() > $until)
	{
		soak_sleep(0.5);
	}
	return $r;
}

# ----------------------------------------------------------------- faults

my $steady = 2 * $RATE + 2 * $LOAD{single} + $LOAD{trigger};

sub answers { return (OutboxTest::try_psql($node, 'postgres', 'SELECT 1'))[0] == 0; }

# recovered: the server answers, the relay runs with no more than a few
# seconds of load pending, the subscription runs
sub recovered
{
	return 0 unless answers();
	my $s = eval { relay_status($node, 'postgres') } // return 0;
	return 0 unless ($s->{state} // '') eq 'running'
	  && defined $s->{backlog} && $s->{backlog} <= 5 * $steady
	  && ($s->{oldest_pending_seconds} // 0) < 10;
	my ($ret, $state) = OutboxTest::try_psql($node, 'sink',
		"SELECT state FROM outbox.subscription_status() WHERE name = 'soak'");
	return $ret == 0 && $state eq 'running';
}

# after kill -9 of a child: the postmaster's crash restart, the relay back
sub crash_restart
{
	my ($offset) = @_;
	wait_for_log_match($node, qr/all server processes terminated; reinitializing/, $offset, 60);
	soak_until(60, \&answers);
	wait_for_relay($node, 'postgres', 60);
	return;
}

sub worker_pid
{
	my ($ret, $pid) = OutboxTest::try_psql($node, 'postgres',
		"SELECT pid FROM pg_stat_activity WHERE backend_type = 'outbox subscription'");
	return $ret == 0 && $pid =~ /^\d+$/ ? $pid : undef;
}

sub kill_child
{
	my ($pid) = @_;
	return 'NOT injected: none running' unless defined $pid;
	my $offset = -s $node->logfile;
	kill 'KILL', $pid;
	crash_restart($offset);
	return "pid $pid";
}

sub broker_out
{
	my ($how, $secs) = @_;
	my $i = 1 + int(rand(3));
	$how eq 'kill' ? $kafka->kill($i) : $kafka->stop_broker($i);
	soak_sleep($secs);
	$kafka->start_broker($i);
	# back in every in-sync set of the main topic before the next fault
	my $in = soak_until($RECOVER_S, sub {
		my $l = eval { $kafka->leaders($DRILL_TOPIC) } // return 0;
		return !grep { !grep { $_ == $i } @{ $l->{$_}{isr} } } keys %$l;
	});
	return "broker $i, $secs s" . ($in ? '' : ', NOT back in sync');
}

my $poisons = 0;

# an event larger than its topic allows, two of its key after it; once it
# is quarantined (the two parked), the topic is fixed and it is replayed
sub poison
{
	my $k = 'k-' . ++$poisons;
	my @ids = map {
		my $bytes = $_ == 1 ? 5000 : 10;
		$node->safe_psql('postgres',
			"INSERT INTO drill_committed (event_id, aggregate_id) SELECT outbox.emit('small', '$k',"
			  . " 'small.made', jsonb_build_object('n', $_, 'blob', repeat('z', $bytes))),"
			  . " '$k' RETURNING event_id")
	} 1 .. 3;
	my $state = sub {
		$node->safe_psql('postgres', "SELECT state FROM outbox.dead_letters WHERE event_id = '$ids[0]'");
	};
	return 'NOT quarantined' unless soak_until(60, sub { $state->() eq 'quarantined' });
	config_small(100000);
	# the brokers take a topic's new settings a moment later: a replay
	# refused again is quarantined again, and replayed again
	foreach my $try (1 .. 3)
	{
		soak_sleep(3);
		$node->safe_psql('postgres', "SELECT count(*) FROM outbox.replay('$ids[0]')");
		soak_until(30, sub { $state->() =~ /^(replayed|quarantined)$/ });
		last if $state->() eq 'replayed';
	}
	my $msgs = $kafka->wait_for_events('outbox.event.small', \@ids, $RECOVER_S);
	my @order = map { $_->{headers}{id} } grep { ($_->{headers}{aggregate_id} // '') eq $k } @$msgs;
	config_small(2000);
	return 'quarantined, replayed: '
	  . (join(',', @order) eq join(',', @ids) ? 'all three in order' : "NOT in order: got @order");
}

sub config_small
{
	my ($bytes) = @_;
	$kafka->tool('kafka.admin.ConfigCommand', '--bootstrap-server', $boot, '--alter',
		'--entity-type', 'topics', '--entity-name', 'outbox.event.small',
		'--add-config', "max.message.bytes=$bytes");
	return;
}

my $long = 0;

# a transaction that emits, then stays open for $DOWN_S; its event must
# arrive after its commit while the rest flows
sub long_transaction
{
	my $k = 'l-' . ++$long;
	my $file = PostgreSQL::Test::Utils::tempdir('long') . '/long.sql';
	open my $fh, '>', $file or die "could not write $file: $!";
	print $fh "BEGIN;\nINSERT INTO drill_committed (event_id, aggregate_id)"
	  . " SELECT outbox.emit('drill', '$k', 'drill.ticked', '{}'), '$k';\n"
	  . "SELECT pg_sleep($DOWN_S);\nCOMMIT;\n";
	close $fh;
	my ($out, $err) = ('', '');
	my $h = IPC::Run::start([ 'psql', '-X', '-q', '-v', 'ON_ERROR_STOP=1', '-h', $node->host,
			'-p', $node->port, '-d', 'postgres', '-f', $file ], '<', \undef, '>', \$out, '2>', \$err);
	soak_sleep($DOWN_S);
	$h->finish;
	my $id = $node->safe_psql('postgres', "SELECT event_id FROM drill_committed WHERE aggregate_id = '$k'");
	return "NOT committed: $err" if $id eq '';
	my $seen = soak_until($RECOVER_S, sub { exists arrived()->{first}{$id} });
	return ($seen ? 'its event arrived' : 'its event did NOT arrive') . " ($DOWN_S s open)";
}

sub reload
{
	my @b = split /,/, $boot;
	my $size = (100, 1000, 5000)[ int(rand(3)) ];
	my $brokers = join(',', (shuffle(@b))[ 0 .. 1 ]);
	$node->safe_psql('postgres', "ALTER SYSTEM SET outbox.batch_size = $size");
	$node->safe_psql('postgres', "ALTER SYSTEM SET outbox.kafka_brokers = '$brokers'");
	$node->safe_psql('postgres', 'SELECT pg_reload_conf()');
	return "batch_size $size, brokers $brokers";
}

my %FAULT = (
	'relay kill -9' => sub { kill_child(relay_pid($node, 'postgres')) },
	'worker kill -9' => sub { kill_child(worker_pid()) },
	'broker kill -9' => sub { broker_out('kill', $KILLED_S) },
	'postmaster crash' => sub {
		kill_all_processes($node);
		$node->start;
		wait_for_relay($node, 'postgres', 60);
		'every process at once';
	},
	'fast restart' => sub { $node->restart; wait_for_relay($node, 'postgres', 60); 'pg_ctl restart -m fast' },
	'reload' => \&reload,
	'held partition' => sub { broker_out('stop', $DOWN_S) },
	'poison event' => \&poison,
	'long transaction' => \&long_transaction,
);

# ------------------------------------------------------------------- run

my (@faults, @bag);
my $next = $t0 + $WARMUP_S;
soak_sleep($next - time());
# the short mode runs each kind once, whenever the load ends
while ($SHORT ? @faults < keys %FAULT : time() < $t0 + $load_s - 30)
{
	@bag = shuffle(sort keys %FAULT) unless @bag;
	my $f = { name => shift @bag, start => time() };
	note sprintf('minute %.1f: %s', ($f->{start} - $t0) / 60, $f->{name});
	$f->{detail} = $FAULT{ $f->{name} }->();
	$f->{end} = time();
	$f->{recovered_at} = time() if soak_until($RECOVER_S, \&recovered);
	note sprintf('  %s; recovered %s', $f->{detail},
		defined $f->{recovered_at} ? sprintf('in %.1f s', $f->{recovered_at} - $f->{end}) : 'NOT');
	push @faults, $f;
	soak_sleep($GAP_S[0] + rand($GAP_S[1] - $GAP_S[0]));
}
soak_sleep($t0 + $load_s - time());
$_->finish foreach @loads;


# ---------------------------------------------------------------- the end

ok(soak_until(300, sub { answers() && (relay_status($node, 'postgres')->{backlog} // -1) eq '0' }),
	'the backlog empties once the load ends');
my $committed = committed_ids($node, 'postgres');
my $fig = kafka_figures();
my $trig = trigger_figures();
my $app = applied_figures();
my $copies = arrived();
$_->stop foreach @tails;
my $dups = duplicates_by_fault($copies->{extra}, \@faults, 60);
my %flat = flatness();
my $lat = latency_by_minute(commit_at(), $copies->{first}, $t0);

is(scalar(@{ $fig->{missing} }), 0, 'lost: every committed event is in Kafka');
is(scalar(@{ $fig->{strangers} }), 0, 'phantom: no event in Kafka that did not commit');
is($fig->{order_violations}, 0, 'each aggregate in seq order');
is("$trig->{lost}/$trig->{phantom}", '0/0', 'the trigger\'s events: none lost, none of a rolled-back row');
is($app->{double}, 0, 'every event applied once at most in the consuming database');
is($app->{missing}, 0, 'every event of the main topic applied');
is($app->{strangers}, 0, 'nothing applied that did not commit');
foreach my $f (@faults)
{
	ok(defined $f->{recovered_at}, sprintf('%s at minute %.1f recovered within %d s',
		$f->{name}, ($f->{start} - $t0) / 60, $RECOVER_S));
	unlike($f->{detail}, qr/NOT/, "$f->{name}: $f->{detail}");
}
my %kinds = map { ($_->{name} => 1) } @faults;
is(join(', ', grep { !$kinds{$_} } sort keys %FAULT), '',
	scalar(@faults) . ' faults injected, every kind at least once');
ok($flat{$_}{ok}, "$_ flat after the warm-up: $flat{$_}{text}") foreach sort keys %flat;

write_files();
$node->stop;
$kafka->down;
done_testing();

# -------------------------------------------------------------- figures

sub topic_of
{
	my ($agg) = @_;
	return $agg =~ /^s-/ ? 'outbox.event.single' : $agg =~ /^k-/ ? 'outbox.event.small' : $DRILL_TOPIC;
}

# the emit() events, read back by the Java client from every topic they went to
sub kafka_figures
{
	my @msgs;
	foreach my $topic ($DRILL_TOPIC, 'outbox.event.single', 'outbox.event.small')
	{
		my @ids = grep { topic_of($committed->{$_}) eq $topic } keys %$committed;
		my $m = $kafka->wait_for_events($topic, \@ids, 180);
		$_->{topic} = $topic foreach @$m;
		push @msgs, @$m;
	}
	my $f = drill_figures(\@msgs, $committed);
	report_figures("soak of $MINUTES minutes", $f);
	explain_missing($node, 'postgres', $f->{missing});
	return $f;
}

# the trigger's events against the rows that committed
sub trigger_figures
{
	my %row = map { $_ => 1 } split /\n/, $node->safe_psql('postgres', 'SELECT id FROM shop_orders');
	my $msgs = $kafka->read_java('outbox.event.order') // [];
	my (%agg, %ev);
	foreach my $m (@$msgs)
	{
		$agg{ $m->{headers}{aggregate_id} // '' }++;
		$ev{ $m->{headers}{id} // '' }++;
	}
	my %t = (rows => scalar(keys %row), messages => scalar(@$msgs),
		lost => scalar(grep { !$agg{$_} } keys %row),
		phantom => scalar(grep { !$row{$_} } keys %agg),
		duplicates => scalar(@$msgs) - scalar(keys %ev));
	diag("trigger: $t{rows} rows committed, $t{messages} messages, lost $t{lost},"
		  . " phantom $t{phantom}, duplicates $t{duplicates}");
	return \%t;
}

# the consuming database against the main topic's committed events
sub applied_figures
{
	my @main = grep { topic_of($committed->{$_}) eq $DRILL_TOPIC } keys %$committed;
	poll_until($node, 'sink', 'SELECT count(DISTINCT event_id) >= ' . scalar(@main) . ' FROM applied',
		't', 300);
	my %n = map { split /\|/ } split /\n/,
	  $node->safe_psql('sink', 'SELECT event_id, count(*) FROM applied GROUP BY 1');
	my %a = (expected => scalar(@main), rows => 0,
		double => scalar(grep { $n{$_} > 1 } keys %n),
		missing => scalar(grep { !$n{$_} } @main),
		strangers => scalar(grep { !exists $committed->{$_} } keys %n));
	$a{rows} += $_ foreach values %n;
	diag("applied: $a{expected} expected, $a{rows} rows, twice or more $a{double},"
		  . " missing $a{missing}, not committed $a{strangers}");
	return \%a;
}

# commit time (the record's insert, in the transaction) of the main
# topic's load (the single topic's partitions wait out their broker's
# faults, by design; the long transactions' events their own sleep)
sub commit_at
{
	my %c = map { split /\|/ } split /\n/, $node->safe_psql('postgres',
		"SELECT event_id, extract(epoch FROM committed_at) FROM drill_committed WHERE aggregate_id ~ '^[ab]-'");
	return \%c;
}

# memory and the log's size: the second half after the warm-up against the first
sub flatness
{
	my @after = grep { ($_->{t_min} // 0) * 60 >= $WARMUP_S } @{ $sampler->rows };
	my $half = int(@after / 2);
	my @h = ([ @after[ 0 .. $half - 1 ] ], [ @after[ $half .. $#after ] ]);
	my %bound = (relay_rss_mb => [ 1.25, 4 ], worker_rss_mb => [ 1.25, 4 ], events_mb => [ 2, 8 ]);
	my %r;
	foreach my $col (keys %bound)
	{
		my ($m1, $m2) = map { my $c = $_; max(0, map { $_->{$col} // 0 } @$c) } @h;
		my $b = $m1 * $bound{$col}[0] + $bound{$col}[1];
		$r{$col} = { ok => $m2 <= $b, m1 => $m1, m2 => $m2,
			text => "$col at most $m1 in the first half, $m2 in the second (bound $b:"
			  . " $bound{$col}[0] x the first + $bound{$col}[1])" };
	}
	return %r;
}

# ------------------------------------------------------------------ files

sub machine
{
	my ($cpu) = slurp_file('/proc/cpuinfo') =~ /^model name\s*:\s*(.*)$/m;
	my $cores = () = slurp_file('/proc/cpuinfo') =~ /^processor\s*:/mg;
	my ($mem) = slurp_file('/proc/meminfo') =~ /^MemTotal:\s*(\d+)/m;
	my $pg = $node->safe_psql('postgres', 'SHOW server_version');
	my $rdk = `pkg-config --modversion rdkafka 2>/dev/null` // '';
	chomp $rdk;
	return sprintf('%d x %s, %.0f GiB; PostgreSQL %s, librdkafka %s, Apache Kafka 3.9.1 (3 brokers)',
		$cores, $cpu // '?', ($mem // 0) / 1048576, $pg, $rdk);
}

sub fault_rows
{
	return [ map {
		my $f = $faults[$_];
		[ sprintf('%.2f', ($f->{start} - $t0) / 60), $f->{name}, $f->{detail} =~ s/\s*\n\s*/ /gr,
		  defined $f->{recovered_at} ? sprintf('%.1f', $f->{recovered_at} - $f->{end}) : 'not',
		  $dups->{$_} // 0 ]
	} 0 .. $#faults ];
}

sub summary_text
{
	my ($rows) = @_;
	my $cmd = "test/soak/run-soak --minutes=$MINUTES --seed=$SEED";
	my $t = "Soak of $MINUTES minutes, seed $SEED: `$cmd` at commit "
	  . ($ENV{OUTBOX_SOAK_COMMIT} // '?') . ', ' . scalar(gmtime($t0)) . " UTC.\n"
	  . 'Machine: ' . machine() . ".\n"
	  . "Load: $RATE emit() transactions/s of two events over 500 aggregates, bursts of"
	  . " $LOAD{burst}/s for $LOAD{burst_s} s, $LOAD{single}/s of two events to a topic of one"
	  . " replica per partition, $LOAD{trigger} trigger inserts/s (one in ten rolled back);"
	  . " outbox.retention 1 minute.\n\n"
	  . "| check | result |\n|---|---|\n"
	  . "| events committed through emit() | $fig->{committed} |\n"
	  . '| lost (committed, not in Kafka) | ' . scalar(@{ $fig->{missing} }) . " |\n"
	  . '| phantom (in Kafka, never committed) | ' . scalar(@{ $fig->{strangers} }) . " |\n"
	  . "| duplicates (copies a consumer drops) | $fig->{duplicates} |\n"
	  . "| order violations (an aggregate's seq going back) | $fig->{order_violations} |\n"
	  . "| trigger rows committed / lost / phantom / duplicates | $trig->{rows} / $trig->{lost}"
	  . " / $trig->{phantom} / $trig->{duplicates} |\n"
	  . "| applied by the subscription / twice or more / missing | $app->{rows} / $app->{double}"
	  . " / $app->{missing} |\n"
	  . '| commit to arrival on the main topic: median of the minutes\' p50 / worst minute\'s p99 | '
	  . (@$lat ? sprintf('%.1f ms / %.1f ms', percentile_of([ sort { $a <=> $b } map { $_->[1] } @$lat ], 50),
		max(map { $_->[2] } @$lat)) : '?') . " |\n";
	$t .= "| $_ | $flat{$_}{text} |\n" foreach sort keys %flat;
	$t .= "\n| minute | fault | what | recovered in (s) | duplicates |\n|--:|---|---|--:|--:|\n";
	$t .= '| ' . join(' | ', @$_) . " |\n" foreach @$rows;
	$t .= "\nDuplicates outside any fault's window: " . ($dups->{none} // 0) . ".\n";
	return $t;
}

sub write_files
{
	write_csv("$OUT/samples.csv", \@OutboxSoak::SAMPLE_COLUMNS, $sampler->rows);
	write_csv("$OUT/latency.csv", [qw(minute p50_ms p99_ms events)], $lat);
	write_csv("$OUT/overdue.csv", [qw(minute overdue)], \@overdue);
	my $rows = fault_rows();
	write_csv("$OUT/faults.csv", [qw(minute fault what recovered_s duplicates)],
		[ map { [ map { my $v = $_; $v =~ s/,/;/g; $v } @$_ ] } @$rows ]);
	my @png = charts($OUT, \@faults, $t0, "soak of $MINUTES minutes, seed $SEED");
	my $text = summary_text($rows);
	open my $fh, '>', "$OUT/summary.md" or die "could not write $OUT/summary.md: $!";
	print $fh $text;
	close $fh;
	diag($text);
	note 'charts: ' . join(' ', @png);
	return;
}
