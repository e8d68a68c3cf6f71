# test/t/016_counter_map.pl: where counter rows were last seen, in shared
# memory (src/emit/emit_counter.c).  With the library preloaded, one backend's lookup
# of an aggregate's counter row serves the next backend, which finds the row
# without scanning the primary key.  Under load, with the table rewritten
# and vacuumed underneath (rows moved, buffers and line pointers reused),
# every aggregate's seq stays gapless in id order and its counter row says
# how many events it has; and every counter row update is HOT.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run;

use FindBin;
use lib "$FindBin::RealBin/../perl";
use OutboxTest;

# no relay: only emit() is under test
my $node = outbox_node('counters', '127.0.0.1:9', conf => q{
outbox.enabled = off
autovacuum = off
max_connections = 30
log_statement = none
});
$node->safe_psql('postgres', 'CREATE EXTENSION outbox');

# the index scans of outbox.aggregates' key in one transaction that emits
# once for aggregate id, in a backend of its own
sub key_scans
{
	my ($id) = @_;
	return $node->safe_psql('postgres', qq{
BEGIN;
SELECT outbox.emit('map', '$id', 'e', '{}') IS NULL;
SELECT idx_scan FROM pg_stat_xact_user_tables
 WHERE relid = 'outbox.aggregates'::regclass;
COMMIT;
}) =~ s/^f\n//r;
}

# 1. shared: made by one backend, found by the key in a second, found
#    where it was seen in a third (and a fourth)
$node->safe_psql('postgres', q{SELECT outbox.emit('map', 'a', 'e', '{}')});
is(key_scans('a'), '1', 'a new backend finds the counter row by its key');
is(key_scans('a'), '0', 'the next backend finds it where the last one saw it');
is(key_scans('a'), '0', 'and so does the one after');
is($node->safe_psql('postgres', q{
SELECT string_agg(seq::text, ',' ORDER BY id) FROM outbox.events
 WHERE aggregate_type = 'map' AND aggregate_id = 'a'}),
	'1,2,3,4', 'its events are numbered 1..4');

# 2. a drill: 6 clients for 8 s over 40 aggregates, one in ten transactions
#    rolled back, while another session rewrites the table (VACUUM FULL:
#    new file, rows packed so that the next updates leave their pages) and
#    vacuums it (line pointers freed for reuse)
my $script = $node->basedir . '/drill.sql';
PostgreSQL::Test::Utils::append_to_file($script, q{
\set agg random(1, 40)
\set doomed random(1, 10)
BEGIN;
SELECT outbox.emit('drill', 'd' || :agg, 'e', '{}');
SELECT outbox.emit('drill', 'd' || :agg, 'e', '{}') WHERE :doomed = 2;
\if :doomed = 1
ROLLBACK;
\else
COMMIT;
\endif
});
my $churn = q{
SELECT pg_sleep(0.3);
VACUUM FULL outbox.aggregates;
SELECT pg_sleep(0.3);
VACUUM outbox.aggregates;
} x 12;
my ($cout, $cerr) = ('', '');
my $churner = IPC::Run::start(
	[ 'psql', '-X', '-q', '-v', 'ON_ERROR_STOP=1', '-d', $node->connstr('postgres') ],
	'<', \$churn, '>', \$cout, '2>', \$cerr);
my ($pout, $perr) = ('', '');
IPC::Run::run(
	[ 'pgbench', '--no-vacuum', '--client=6', '--jobs=2', '--time=8',
		'-f', $script, $node->connstr('postgres') ],
	'>', \$pout, '2>', \$perr);
like($pout, qr/number of failed transactions: 0 /,
	'the clients ran') or diag($perr);
unlike($perr, qr/ERROR|aborted/, 'no client failed') or diag($perr);
ok($churner->finish, 'the table was rewritten and vacuumed meanwhile')
  or diag($cerr);

is($node->safe_psql('postgres', q{
SELECT count(*) FROM outbox.aggregates WHERE aggregate_type = 'drill'}),
	'40', 'every aggregate has its counter row');
is($node->safe_psql('postgres', q{
WITH e AS (
	SELECT aggregate_id, seq,
		   row_number() OVER (PARTITION BY aggregate_id ORDER BY id) AS n
	  FROM outbox.events WHERE aggregate_type = 'drill')
SELECT count(*) FROM (
	SELECT aggregate_id, bool_and(seq = n) AS gapless, max(n) AS events
	  FROM e GROUP BY aggregate_id) s
  JOIN outbox.aggregates a
	ON a.aggregate_type = 'drill' AND a.aggregate_id = s.aggregate_id
 WHERE NOT s.gapless OR a.last_seq <> s.events}),
	'0', 'each aggregate: seq 1..n in id order, its counter row says n');
cmp_ok($node->safe_psql('postgres', q{
SELECT count(*) FROM outbox.events WHERE aggregate_type = 'drill'}),
	'>', 1000, 'over a thousand events were emitted');

# the counter row updates of outbox.aggregates so far, and how many were HOT
sub updates
{
	return split /\|/, $node->safe_psql('postgres', q{
SELECT n_tup_upd, n_tup_hot_upd
  FROM pg_stat_user_tables WHERE relid = 'outbox.aggregates'::regclass});
}
my ($upd, $hot) = updates();
note("drill: counter row updates $upd, HOT $hot");

# 3. the counter page is pruned only once nearly full (counter_make_room),
#    and that still leaves room for every new version on the page.  One
#    client, nothing else running: each version is dead to everyone once
#    its transaction commits, so a pruning always frees what it can and
#    every update is HOT.  Unpruned, the page of 40 rows is full of
#    versions every hundred or so updates and the row leaves it.  (Under
#    many clients a descheduled one holds its snapshot and the versions
#    after it, so that count follows the machine's load, not the code.)
my $one = $node->basedir . '/one.sql';
PostgreSQL::Test::Utils::append_to_file($one, q{
\set agg random(1, 40)
SELECT outbox.emit('drill', 'd' || :agg, 'e', '{}');
});
IPC::Run::run(
	[ 'pgbench', '--no-vacuum', '--client=1', '--transactions=4000',
		'-f', $one, $node->connstr('postgres') ],
	'>', \$pout, '2>', \$perr);
like($pout, qr/number of transactions actually processed: 4000\/4000/,
	'one client emitted 4000 times') or diag($perr);
my ($upd1, $hot1) = updates();
note("one client: counter row updates ", $upd1 - $upd, ", HOT ", $hot1 - $hot);
cmp_ok($upd1 - $upd, '>=', 4000, 'each emit updated its counter row');
is(($upd1 - $upd) - ($hot1 - $hot), 0,
	'every counter row update stayed on its page (HOT)');

$node->stop;
done_testing();
