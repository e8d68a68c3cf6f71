# test/t/208_no_relay.pl: a database left without a relay (here:
# outbox.max_databases reached) shows its real backlog in status(),
# health() names the cause, the log names the database; and databases
# without the extension never take a relay slot, so after a restart the
# one with the extension gets its relay at once.

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

my $kafka = OutboxTest::Broker->start(brokers => 1);
my $node = outbox_node('norelay', $kafka, conf => 'outbox.max_databases = 1');

$node->safe_psql('postgres', 'CREATE DATABASE first');
$node->safe_psql('first', 'CREATE EXTENSION outbox');
ok(defined wait_for_relay($node, 'first', 30), 'the first database gets the one relay slot');

my $offset = -s $node->logfile;
$node->safe_psql('postgres', 'CREATE DATABASE second');
$node->safe_psql('second', 'CREATE EXTENSION outbox');
ok(defined wait_for_log_match($node,
		qr/outbox cannot start a relay for database "second": all 1 relay slots are in use/,
		$offset, 30),
	'the log names the database left without a relay');
is(scalar(relay_pids($node, 'second')), 0, 'second has no relay');

# events pending in second: a committed transaction, one still open (not
# pending yet) and one rolled back
$node->safe_psql('second', q{
SELECT outbox.emit('stock', 's-' || g, 'stock.moved', '{}') FROM generate_series(1, 7) g;
});
$node->safe_psql('second', q{
BEGIN;
SELECT outbox.emit('stock', 'gone', 'stock.moved', '{}');
ROLLBACK;
});
my $st = query_json($node, 'second', 'SELECT row_to_json(s) FROM outbox.status() s');
is($st->{state}, 'stopped', 'status(): stopped');
is($st->{backlog}, 7, 'status(): the real backlog, counted from the log');
ok(defined $st->{oldest_pending_seconds}, 'status(): the oldest event\'s age');
my $m = $node->safe_psql('second', 'SELECT outbox.metrics()');
like($m, qr/^outbox_backlog_events\{database="second"\} 7$/m, 'metrics(): the same backlog');
my ($hs, $hr) = split /\|/, $node->safe_psql('second', 'SELECT * FROM outbox.health()');
is($hs, 'critical', 'health(): critical');
like($hr, qr/^no relay: outbox\.max_databases \(1\) reached; 7 events wait$/,
	'health(): names the cause and what waits');

# the status function is SECURITY DEFINER with a pinned search_path: an
# operator planted in the caller's path changes nothing
$node->safe_psql('second', q{
CREATE FUNCTION public.always(pg_catalog.xid8, pg_catalog.xid8) RETURNS boolean
	LANGUAGE sql AS 'SELECT true';
CREATE OPERATOR public.>= (LEFTARG = pg_catalog.xid8, RIGHTARG = pg_catalog.xid8,
	FUNCTION = public.always);
});
is($node->safe_psql('second', 'SET search_path = public, pg_catalog; SELECT backlog FROM outbox.status()'),
	'7', 'a planted operator does not change the count');

# first publishes some events: they will not count later
$node->safe_psql('first', q{
SELECT outbox.emit('stock', 'f-' || g, 'stock.moved', '{}') FROM generate_series(1, 4) g;
});
wait_for_messages($kafka, 'outbox.event.stock', 4);
ok(poll_until($node, 'first', 'SELECT backlog FROM outbox.status()', '0', 30),
	'first delivered its events');
# --- restart with databases lacking the extension: the one that has it
# must not wait behind them for the single slot
# (second's events were never published: dropping them is on purpose)
$node->safe_psql('second', 'SET outbox.allow_drop_undelivered = on; DROP EXTENSION outbox');
foreach my $i (1 .. 5)
{
	$node->safe_psql('postgres', "CREATE DATABASE plain$i");
}
$node->restart;
my ($pid, $waited) = wait_for_relay($node, 'first', 30);
ok(defined $pid, 'after the restart the database with the extension has its relay');
cmp_ok($waited, '<', 3, sprintf('within a couple of seconds (%.2f s)', $waited));
usleep(1_000_000);
is($node->safe_psql('postgres',
		"SELECT count(*) FROM pg_stat_activity WHERE backend_type IN ('outbox relay', 'outbox probe')"),
	'1', 'no worker lingers in the databases without the extension');

# --- no background worker slot: first's relay cannot start; its backlog
# counts only what its last relay did not deliver
# the outbox launcher is the only background worker there is room for
$node->append_conf('postgresql.conf',
	"max_worker_processes = 1\nmax_logical_replication_workers = 0");
$offset = -s $node->logfile;
$node->restart;
$node->safe_psql('first', q{
SELECT outbox.emit('stock', 'f-' || g, 'stock.moved', '{}') FROM generate_series(5, 6) g;
});
ok(defined wait_for_log_match($node,
		qr/outbox cannot (?:start a relay for|look for the extension in) database "\w+": no background worker slot is free/,
		$offset, 30),
	'the log says no worker is free, naming a database');
is($node->safe_psql('first', 'SELECT backlog FROM outbox.status()'), '2',
	'status(): the 2 events emitted since the last relay delivered the others');
($hs, $hr) = split /\|/, $node->safe_psql('first', 'SELECT * FROM outbox.health()');
is($hs, 'critical', 'health(): critical');
like($hr, qr/^no relay: no free background worker slot \(max_worker_processes\); 2 events wait$/,
	'health(): names the cause');

$node->stop;
$kafka->stop;
done_testing();
