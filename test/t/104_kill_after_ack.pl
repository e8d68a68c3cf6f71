# test/t/104_kill_after_ack.pl: failure drill.  The relay is killed with
# SIGKILL at random moments while it drains a backlog of small pages under
# steady load, several times; each time the server does a crash restart.
# A kill between the brokers' acknowledgement and the progress write makes
# the relay send that page again: the copies keep their event ids (no new
# id ever appears), at most one page (outbox.batch_size) is duplicated per
# kill, nothing is lost and every aggregate stays in order.

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
use OutboxDrill;

my $batch_size = 200;
my $kills = 4;
my $backlog = 3000;    # events committed at once before each kill

my $kafka = OutboxTest::Broker->start(brokers => 3);
my $node = outbox_node(
	'killack', $kafka, conf => qq{
outbox.batch_size = $batch_size
restart_after_crash = on
});
drill_setup($node, 'postgres');
my ($pid) = wait_for_relay($node, 'postgres', 10);
ok(defined $pid, 'the relay runs');

my $load = OutboxDrill::Load->start($node, 'postgres', seconds => 25, rate => 50);
usleep(1_000_000);

my $dups = 0;
my $seed = $ENV{OUTBOX_DRILL_SEED} // int(rand(1_000_000));
srand($seed);
note "random seed $seed (set OUTBOX_DRILL_SEED to repeat)";
my $msgs;
for my $k (1 .. $kills)
{
	# every page waits a round trip for its acknowledgements, so that the
	# backlog takes a while and most moments fall inside a page (kcat
	# reads faster without it)
	$kafka->command('rtt all 30');
	$node->safe_psql('postgres',
		    "INSERT INTO drill_committed (event_id, aggregate_id)"
		  . " SELECT outbox.emit('drill', 'k-' || (i % 50), 'drill.metered',"
		  . " jsonb_build_object('kill', $k, 'i', i)), 'k-' || (i % 50)"
		  . " FROM generate_series(1, $backlog) i");
	my $delay = 0.1 + rand(0.9);
	usleep($delay * 1_000_000);
	my $relay = relay_pid($node, 'postgres');
	my $log_offset = -s $node->logfile;
	ok(defined $relay && kill('KILL', $relay),
		sprintf('kill %d: SIGKILL to the relay %.2f s after a backlog of %d', $k, $delay, $backlog));
	$kafka->command('rtt all 0');
	ok( defined wait_for_log_match(
			$node, qr/all server processes terminated; reinitializing/,
			$log_offset, 60),
		"kill $k: the server does a crash restart");
	ok(poll_until($node, 'postgres', 'SELECT 1', '1', 60),
		"kill $k: the server accepts connections again");
	my ($again) = wait_for_relay($node, 'postgres', 60, $relay);
	ok(defined $again, "kill $k: a new relay runs");

	# everything committed until now arrives; the kill added at most one page
	my $ids = committed_ids($node, 'postgres');
	$msgs = wait_for_events($kafka, $DRILL_TOPIC, [ keys %$ids ], 60);
	my $f = drill_figures($msgs, $ids);
	my $added = $f->{duplicates} - $dups;
	cmp_ok($added, '<=', $batch_size,
		"kill $k re-sent at most one page ($added duplicates)");
	$dups = $f->{duplicates};
}

$load->finish;
my $all = committed_ids($node, 'postgres');
$msgs = wait_for_events($kafka, $DRILL_TOPIC, [ keys %$all ], 60);
my $fig = drill_figures($msgs, $all);
report_figures('kill -9 after ack', $fig,
	"$kills kills, batch_size $batch_size");

is(scalar(@{ $fig->{missing} }), 0, 'zero loss: every committed event is in Kafka');
is(scalar(@{ $fig->{strangers} }), 0,
	'no new ids: every id in Kafka is one emit() returned');
cmp_ok($fig->{duplicates}, '<=', $kills * $batch_size,
	"at most one page per kill in all ($fig->{duplicates} duplicates, $kills kills)");
cmp_ok($fig->{duplicates}, '>', 0,
	'some kill landed between the acknowledgement and the progress write (pages were re-sent)');
is($fig->{order_violations}, 0,
	'a consumer dropping duplicates sees each aggregate\'s seq increase');
is($fig->{gaps}, 0, 'without gaps');

# a copy is the same event: same key, value and headers
my (%first, $differ);
foreach my $m (@$msgs)
{
	my $id = $m->{headers}{id} // next;
	my $sig = join "\0", $m->{key} // '', $m->{value} // '',
	  map { "$_->[0]=" . ($_->[1] // '') } @{ $m->{header_list} };
	if (defined $first{$id})
	{
		$differ++ if $first{$id}{sig} ne $sig;
		$differ++ if $first{$id}{partition} != $m->{partition};
	}
	else
	{
		$first{$id} = { sig => $sig, partition => $m->{partition} };
	}
}
is($differ // 0, 0,
	're-sent copies are identical to the first: key, value, headers, partition');

$node->stop;
done_testing();
