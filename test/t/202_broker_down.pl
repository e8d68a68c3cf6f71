# test/t/202_broker_down.pl: with every broker down, status() shows the
# backlog and the oldest event's age growing, transient failures counted
# and the relay backing off; health() turns critical, pg_stat_activity says
# what the relay waits for, and each state change is logged once.  After
# the brokers return, everything recovers.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep time);

# found without -I: PGXS resets PROVE_FLAGS after the Makefile sets it
use FindBin;
use lib "$FindBin::RealBin/../perl";
use OutboxTest;

my $topic = 'outbox.event.parcel';
my $kafka = OutboxTest::Broker->start(brokers => 3);

# the relay withdraws a round after 2 s instead of 30, so that a delivery
# fails (and is counted) while the brokers are down
my $node = outbox_node('down', $kafka, conf => "outbox.delivery_timeout = '2s'");
$node->safe_psql('postgres', 'CREATE EXTENSION outbox');
my ($pid) = wait_for_relay($node, 'postgres', 30);
ok(defined $pid, 'the relay runs');

my $n = 0;
my @ids;

sub emit
{
	my ($count) = @_;
	my $out = $node->safe_psql(
		'postgres', qq{
SELECT outbox.emit('parcel', 'p-' || i, 'parcel.sent', jsonb_build_object('n', i))
  FROM generate_series(${\ ($n + 1)}, ${\ ($n + $count)}) i});
	$n += $count;
	push @ids, split /\n/, $out;
}

sub status_row
{
	return query_json($node, 'postgres',
		'SELECT row_to_json(s) FROM outbox.status() s');
}

sub health
{
	my ($max_age) = @_;
	my $arg = defined $max_age ? "max_age => '$max_age'" : '';
	return query_json($node, 'postgres',
		"SELECT row_to_json(h) FROM outbox.health($arg) h");
}

# what pg_stat_activity shows of the relay
sub activity
{
	return query_json(
		$node, 'postgres', qq{
SELECT row_to_json(a) FROM (SELECT state, query, wait_event_type, wait_event
  FROM pg_stat_activity WHERE pid = $pid) a});
}

# --- healthy and idle
emit(1);
wait_for_events($kafka, $topic, [@ids]);
ok( poll_until(
		$node, 'postgres',
		"SELECT wait_event_type || '/' || state FROM pg_stat_activity WHERE pid = $pid",
		'Extension/idle', 30),
	'an idle relay is "idle" in pg_stat_activity, waiting on an Extension wait event'
);
is(health()->{status}, 'ok', 'health() is ok before the outage');
my $s0 = status_row();
is($s0->{transient_failures}, 0, 'no transient failures yet');

# --- every broker down while events are emitted
my $log_offset = -s $node->logfile;
my $down_at = time();
$kafka->command('down all');
emit(5);
ok(poll_until($node, 'postgres', 'SELECT state FROM outbox.status()',
		'backing off', 30),
	'with every broker down, the relay is soon "backing off"');
my $s1 = status_row();
is($s1->{backlog}, 5, 'backlog counts the 5 undelivered events');
cmp_ok($s1->{transient_failures}, '>=', 5,
	'each of the 5 events failed at least once, counted as transient');
is($s1->{permanent_failures} + $s1->{fatal_failures},
	0, 'a broker outage counts no permanent or fatal failure');
ok(defined $s1->{oldest_pending_seconds}, 'oldest_pending_seconds is set');
like($s1->{last_error} // '', qr/_MSG_TIMED_OUT|broker|down/i,
	'last_error says what went wrong');

emit(5);
ok( poll_until(
		$node, 'postgres',
		"SELECT transient_failures > $s1->{transient_failures} FROM outbox.status()",
		't', 30),
	'transient_failures keeps growing while the brokers are down');
my $s2 = status_row();
is($s2->{backlog}, 10, 'backlog grows to the 10 undelivered events');
cmp_ok(
	$s2->{oldest_pending_seconds}, '>',
	$s1->{oldest_pending_seconds},
	'oldest_pending_seconds grows over time');
cmp_ok($s2->{oldest_pending_seconds}, '<=', time() - $down_at + 1,
	'oldest_pending_seconds is no older than the outage');
is($s2->{state}, 'backing off', 'the relay is still backing off');
is($s2->{published}, $s0->{published}, 'nothing more was published');

# pg_stat_activity says what the relay does, as it changes
my %seen;
my $deadline = time() + 20;
while (time() < $deadline && keys %seen < 2)
{
	my $a = activity();
	$seen{wait} = $a if ($a->{query} // '') =~ /^waiting for acknowledgement of 5 events$/;
	$seen{backoff} = $a if ($a->{query} // '') eq 'backing off';
	usleep(20_000);
}
is($seen{wait}{state} // '', 'active',
	'pg_stat_activity shows the relay active, "waiting for acknowledgement of 5 events"');
is($seen{wait}{wait_event_type} // '', 'Extension',
	'... on an Extension wait event');
is($seen{backoff}{state} // '', 'active',
	'pg_stat_activity shows the relay active, "backing off", between attempts');

ok( poll_until(
		$node, 'postgres',
		"SELECT status FROM outbox.health(max_age => '3 s')",
		'critical', 30),
	'health(max_age => 3 s) turns critical');
my $h = health('3 s');
like(
	$h->{reason},
	qr/oldest undelivered event is \d+ s old, over 3 s/,
	'its reason names the age of the oldest undelivered event');
ok( poll_until(
		$node, 'postgres', 'SELECT brokers_up FROM outbox.status()', '0', 30),
	'brokers_up falls to 0');
is(health('1 h')->{status}, 'warning',
	'health(max_age => 1 h) is only a warning: the relay backs off');

my $m = $node->safe_psql('postgres', 'SELECT outbox.metrics()');
like($m, qr/^outbox_relay_state\{database="postgres",state="backing off"\} 1$/m,
	'metrics(): outbox_relay_state is 1 for "backing off"');
my ($transient) =
  $m =~ /^outbox_delivery_errors_total\{database="postgres",class="transient"\} (\d+)$/m;
cmp_ok($transient // 0, '>=', $s2->{transient_failures},
	'metrics(): outbox_delivery_errors_total{class="transient"} counts them');
my ($age) = $m =~ /^outbox_oldest_pending_seconds\{database="postgres"\} (\S+)$/m;
cmp_ok($age // 0, '>=', $s2->{oldest_pending_seconds},
	'metrics(): outbox_oldest_pending_seconds grows');

# --- the brokers return
$kafka->command('up all');
ok( poll_until(
		$node, 'postgres',
		'SELECT backlog, oldest_pending_seconds IS NULL, state FROM outbox.status()',
		'0|t|running', 60),
	'after the brokers return: backlog 0, no pending age, running');
wait_for_events($kafka, $topic, [@ids]);
my $s3 = status_row();
is($s3->{published}, $n, "published counts all $n events");
cmp_ok($s3->{transient_failures}, '>=', $s2->{transient_failures},
	'transient_failures is a counter: it does not go back');
is_deeply(health(), { status => 'ok', reason => undef },
	'health() is ok again, with no reason');
is(health('3 s')->{status}, 'ok', 'health(max_age => 3 s) is ok again');
ok( poll_until(
		$node, 'postgres', 'SELECT brokers_up > 0 FROM outbox.status()', 't', 30),
	'brokers_up is positive again');

# --- the log: one line per state change, errors at a rate limit
my $outage = time() - $down_at;
my $log = slurp_file($node->logfile, $log_offset);
my @to_backoff = $log =~ /(outbox relay for database "postgres" is now backing off \(was running\))/g;
my @to_running = $log =~ /(outbox relay for database "postgres" is now running \(was backing off\))/g;
is(scalar(@to_backoff), 1, 'one LOG line: "is now backing off (was running)"');
is(scalar(@to_running), 1, 'one LOG line: "is now running (was backing off)"');
ok($log =~ /is now backing off.*is now running/s, 'in that order');
# report_error lines: the first failure at once, then one per 10 s at most,
# each with the number of failures it stands for
my @errors = $log =~ /LOG:  outbox relay: (.*)\n.*DETAIL:  (.*)/g;
cmp_ok(scalar(@errors) / 2, '>=', 1, 'the outage is logged');
like(join(' ', @errors), qr/Kafka client error|could not publish events/,
	'the error line is a Kafka client error or a failed delivery');
cmp_ok(scalar(@errors) / 2, '<=', int($outage / 10) + 2,
	sprintf('at most one error line per 10 s (%d in %.0f s)', scalar(@errors) / 2, $outage));

# --- one broker down: part of a page is delivered, the rest is held
#
# The partitions the stopped broker leads are held (outbox.held) while the
# others deliver; the relay does not back off.  The backlog must count
# only the events not yet acknowledged, held ones included, not the whole
# page.  Find a topic whose partitions have more than one leader, and stop
# one of them.
my ($split, $leader);
foreach my $try (1 .. 8)
{
	my $t = "outbox.event.split$try";
	$kafka->command("create $t 4");
	my $meta = `kcat -L -b ${\ $kafka->bootstrap } -t $t 2>&1`;
	my @leaders = $meta =~ /partition \d+, leader (\d+),/g;
	my %count;
	$count{$_}++ foreach @leaders;
	next unless @leaders == 4 && keys %count > 1;
	($split, $leader) = ("split$try", $leaders[0]);
	last;
}
ok(defined $split, 'a topic has partitions on more than one broker')
  or BAIL_OUT('no topic spread over two brokers');
my $published_before = status_row()->{published};
$kafka->command("down $leader");
my $split_ids = $node->safe_psql(
	'postgres', qq{
SELECT outbox.emit('$split', 's-' || i, 'split.sent', jsonb_build_object('i', i))
  FROM generate_series(1, 40) i});
ok(poll_until($node, 'postgres', 'SELECT count(*) > 0 FROM outbox.holds()', 't', 30),
	"with broker $leader down, its partitions are held");
my $s4 = status_row();
is($s4->{state}, 'running', '... and the relay goes on running, not backing off');
my $delivered = $s4->{published} - $published_before;
note "$delivered of 40 events delivered with broker $leader down";
ok($delivered > 0 && $delivered < 40,
	'some events of the page are delivered, some are not');
is($s4->{backlog}, 40 - $delivered,
	'backlog counts only the events not yet acknowledged');
$kafka->command("up $leader");
ok( poll_until(
		$node, 'postgres', 'SELECT backlog, state FROM outbox.status()',
		'0|running', 60),
	"after broker $leader returns, backlog is 0 again");
wait_for_events($kafka, "outbox.event.$split", [ split /\n/, $split_ids ]);
is(status_row()->{published} - $published_before,
	40, 'each of the 40 events is counted once as published');

$node->stop;
done_testing();
