# test/t/003_crash.pl: interrupting the relay while it drains a backlog
# loses nothing and re-sends at most one page (outbox.batch_size events) per
# interruption: kill -9 of the relay (a crash restart of the server), a fast
# restart and an immediate stop.

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

my $topic = 'outbox.event.meter';
my $batch_size = 500;
my $backlog = 7000;    # per interruption; three of them: 21,000 events
my $kafka = OutboxTest::Broker->start(brokers => 3);
my $node = outbox_node(
	'crash', $kafka, conf => qq{
outbox.batch_size = $batch_size
restart_after_crash = on
});

$node->safe_psql('postgres', 'CREATE EXTENSION outbox');
my ($pid) = wait_for_relay($node, 'postgres', 10);
ok(defined $pid, 'the relay runs');

# A slow network makes each page take a round trip, so that the backlog
# drains over seconds and the interruptions land in the middle of it.
$kafka->command('rtt all 100');

sub published
{
	return $node->safe_psql('postgres',
		"SELECT published FROM outbox.relay_progress WHERE relay = 'default'");
}

# Emit a backlog of small events over 50 aggregates in one transaction, so
# that it is one batch of many pages; interrupt the relay once two pages of
# it are recorded, or after a second if progress is not recorded that soon.
sub backlog_then
{
	my ($what, $interrupt) = @_;
	my $before = published();

	$node->safe_psql('postgres',
		"SELECT count(outbox.emit('meter', 'm-' || (i % 50), 'meter.read', jsonb_build_object('i', i)))"
		  . " FROM generate_series(1, $backlog) i");
	my $deadline = time() + 1;
	my $done;
	while (1)
	{
		$done = published() - $before;
		last if $done >= 2 * $batch_size || time() > $deadline;
		usleep(20_000);
	}
	$interrupt->();
	note "$what after $done of $backlog events were recorded as published";
	cmp_ok($done, '<', $backlog,
		"$what happened while the backlog was draining ($done of $backlog published)");
}

sub check_all_published
{
	my ($what, $dups_before) = @_;
	my @ids = split /\n/,
	  $node->safe_psql('postgres', 'SELECT event_id FROM outbox.events');
	my $msgs = wait_for_events($kafka, $topic, \@ids);
	my $seen = event_ids_of($msgs);
	my $dups = grep { $_ > 1 } values %$seen;

	is(scalar(grep { !$seen->{$_} } @ids),
		0, "after $what every committed event is in Kafka");
	cmp_ok($dups - $dups_before, '<=', $batch_size,
		"$what re-sent at most one page ("
		  . ($dups - $dups_before)
		  . " duplicate event ids)");
	return ($dups, $msgs);
}

my $dups = 0;

# 1. kill -9: the postmaster treats it as a crash and restarts everything
my $log_offset = -s $node->logfile;
backlog_then(
	'kill -9 of the relay',
	sub {
		my $relay = relay_pid($node, 'postgres');
		ok(defined $relay && kill('KILL', $relay), 'the relay is killed with SIGKILL');
	});
ok( defined wait_for_log_match(
		$node, qr/all server processes terminated; reinitializing/,
		$log_offset, 30),
	'the server restarts after the crash');
ok(poll_until($node, 'postgres', 'SELECT 1', '1', 30),
	'and accepts connections again');
ok(defined((wait_for_relay($node, 'postgres', 30))[0]),
	'the relay runs again after the crash restart');
($dups) = check_all_published('kill -9 of the relay', $dups);

# 2. fast restart: the relay is told to stop and may finish its page
backlog_then('a fast restart', sub { $node->restart; });
ok(defined((wait_for_relay($node, 'postgres', 30))[0]),
	'the relay runs again after the restart');
($dups) = check_all_published('a fast restart', $dups);

# 3. immediate stop: no chance to finish anything
backlog_then(
	'an immediate stop',
	sub {
		$node->stop('immediate');
		$node->start;
	});
ok(defined((wait_for_relay($node, 'postgres', 30))[0]),
	'the relay runs again after the immediate stop');
my $msgs;
($dups, $msgs) = check_all_published('an immediate stop', $dups);

# A consumer that drops ids it has already seen gets each aggregate's
# events in seq order, all of them.
my (%first, %last_seq, %count);
my $out_of_order = 0;
foreach my $m (@$msgs)    # sorted by partition, then offset
{
	my $h = $m->{headers};
	next if $first{ $h->{id} }++;
	$out_of_order++
	  if defined $last_seq{ $h->{aggregate_id} }
	  && $h->{seq} != $last_seq{ $h->{aggregate_id} } + 1;
	$last_seq{ $h->{aggregate_id} } = $h->{seq};
	$count{ $h->{aggregate_id} }++;
}
is($out_of_order, 0,
	'after dropping duplicates every aggregate\'s seq headers follow each other');
is(scalar(keys %count), 50, 'all 50 aggregates arrived');
is(scalar(grep { $count{$_} != $last_seq{$_} } keys %count),
	0, 'each aggregate\'s last seq equals its number of events');

$node->stop;
done_testing();
