# test/t/210_open_transaction.pl: a transaction writing many events while
# nothing else commits does not make the relay's next look walk its rows.
# The safety poll sees that transactions have begun and none has ended, and
# moves its previous snapshot past them; the look after the next commit
# elsewhere then leaves the open transaction's rows alone (outbox.events'
# indexes' tuples read stay far below their number), what commits meanwhile is
# published, and the open transaction's events are all published once it
# commits.  Nor does the relay's once-a-minute upkeep walk them while
# nothing can be past the retention.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);

use FindBin;
use lib "$FindBin::RealBin/../perl";
use OutboxTest;

my $n = 30000;    # events of the open transaction
# the log's partitions (generations), whose figures add up to the log's
my $LOG = "relid IN (SELECT relid FROM pg_partition_tree('outbox.events') WHERE isleaf)";

my $kafka = OutboxTest::Broker->start(brokers => 1);
my $node = outbox_node('opentx', $kafka,
	conf => "outbox.poll_interval = '50ms'\nautovacuum = off");
$node->safe_psql('postgres', 'CREATE EXTENSION outbox; CREATE TABLE ticks (n int)');
my ($pid) = wait_for_relay($node, 'postgres', 10);
ok(defined $pid, 'a relay runs');
my $relay_started = time();

my $first = $node->safe_psql('postgres',
	"SELECT outbox.emit('opentx', 'before', 'opentx.before', '{}')");
wait_for_events($kafka, 'outbox.event.opentx', [$first]);
# gone, as past retention: the open transaction's rows will come first in
# id order
$node->safe_psql('postgres', 'DELETE FROM outbox.events');

# what the relay has read of outbox.events: index scans, index tuples read
# and heap blocks visited (a walk over the open transaction's rows shows in
# the tuples by an index, in the blocks by any path); and the scans of
# outbox.inbox, which only the cleanup's inbox probe reads here.  The relay's
# statistics reach the shared ones at the end of one of its transactions,
# at most once a second: commit elsewhere (which makes it look) until its
# index scans show more than scans
sub read_stats
{
	return split /\|/,
	  $node->safe_psql('postgres',
		"SELECT (SELECT sum(idx_scan) FROM pg_stat_user_indexes WHERE $LOG),"
		  . " (SELECT sum(idx_tup_read) FROM pg_stat_user_indexes WHERE $LOG),"
		  . " (SELECT sum(heap_blks_read + heap_blks_hit) FROM pg_statio_user_tables WHERE $LOG),"
		  . " (SELECT seq_scan + coalesce(idx_scan, 0) FROM pg_stat_user_tables WHERE relid = 'outbox.inbox'::regclass)"
	  );
}

sub flushed_after
{
	my ($scans) = @_;
	my @st;
	foreach (1 .. 5)
	{
		$node->safe_psql('postgres', 'INSERT INTO ticks VALUES (1)');
		usleep(1_200_000);
		@st = read_stats();
		note "outbox.events: index scans $st[0], index tuples read $st[1], heap blocks $st[2]";
		return @st if $st[0] > $scans;
	}
	return @st;
}

# from stats a to b: fewer index tuples than a tenth of the open rows, and
# fewer heap blocks than a tenth of theirs
sub no_walk
{
	my ($a, $b, $blocks, $what) = @_;
	my ($t, $h) = ($b->[1] - $a->[1], $b->[2] - $a->[2]);
	ok($t < $n / 10 && $h < $blocks / 10,
		"$what (index tuples read $t, heap blocks visited $h; the open rows: $n in $blocks blocks)");
}

my @st0 = flushed_after(0);
cmp_ok($st0[0], '>', 0, "the relay's looks scan outbox.events' indexes (scans: $st0[0])");
@st0 = flushed_after($st0[0]);

# the open transaction, and nothing else commits while it writes
my $writer = $node->background_psql('postgres');
$writer->query_safe('BEGIN');
is( $writer->query_safe(
		"SELECT count(outbox.emit('opentx', (g % 100)::text, 'opentx.open', jsonb_build_object('n', g))) FROM generate_series(1, $n) g"
	),
	$n,
	"an open transaction has written $n events");
my $blocks = $node->safe_psql('postgres',
	"SELECT sum(pg_relation_size(relid)) / current_setting('block_size')::int"
	  . " FROM pg_partition_tree('outbox.events') WHERE isleaf");
usleep(500_000);    # ten safety polls

# now something commits: the relay looks (and publishes it)
my $during = $node->safe_psql('postgres',
	"SELECT outbox.emit('opentx', 'during', 'opentx.during', '{}')");
wait_for_events($kafka, 'outbox.event.opentx', [$during]);
pass('an event committed while the transaction is open is published');
my @st1 = flushed_after($st0[0] + 1);
cmp_ok($st1[0], '>', $st0[0], "the relay looked since (index scans $st0[0] -> $st1[0])");
no_walk(\@st0, \@st1, $blocks, "its looks did not walk the open transaction's rows");

# the relay's upkeep, once a minute while idle, turns the log's generations:
# none is due before a week (outbox.retention), so it reads no row of the
# log, and the open transaction's rows are left alone
my $wait = $relay_started + 63 - time();
sleep($wait) if $wait > 0;
my @st2 = flushed_after($st1[0]);
cmp_ok($st2[3], '>', $st1[3], "a cleanup ran meanwhile (outbox.inbox scans $st1[3] -> $st2[3])");
no_walk(\@st1, \@st2, $blocks, 'the cleanup a minute on did not walk them either');

# the open transaction commits: every one of its events is published
$writer->query_safe('COMMIT');
$writer->quit;
my $msgs = wait_for_messages($kafka, 'outbox.event.opentx', $n + 2, 120);
my $ids = event_ids_of($msgs);
is(scalar(grep { $ids->{$_} == 1 } keys %$ids), $n + 2,
	"all $n events of the transaction, and the two others, published once each");
is($node->safe_psql('postgres', 'SELECT backlog FROM outbox.status()'),
	'0', 'status(): no backlog');

$node->stop;
$kafka->stop;
done_testing();
