# test/t/022_failover_sync.pl: failover to a synchronous standby under load.
# A committing transaction stays in the proc array, invisible to the
# relay's snapshots, until the synchronous standby confirmed its commit
# (RecordTransactionCommit waits in SyncRepWaitForLSN before
# ProcArrayEndTransaction): with the standby's WAL receiver stopped the
# relay publishes nothing new, and after every process of the primary is
# killed and the standby promoted, Kafka and the promoted database agree,
# without outbox.synchronized_standby_slots.  The relay's own progress
# commits wait for the standby too, so at most one page is sent twice.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

# found without -I: PGXS resets PROVE_FLAGS after the Makefile sets it
use FindBin;
use lib "$FindBin::RealBin/../perl";
use OutboxTest;
use OutboxFailover;

my $kafka = OutboxTest::Broker->start(brokers => 3);

my $r = failover_drill(
	kafka => $kafka,
	name => 'sync',
	aggregate => 'acct_sync',
	synchronous => 1,
	stall => 5);
note sprintf(
	'synchronous standby: %d events in the promoted database, %d in Kafka: %d phantoms, '
	  . '%d lost, %d duplicates; promotion to publishing again: %s s',
	$r->{events} // 0, $r->{kafka_ids} // 0, $r->{phantoms} // -1, $r->{lost} // -1,
	$r->{duplicates} // -1,
	defined $r->{publish_after_promote}
	? sprintf('%.2f', $r->{publish_after_promote})
	: 'never');
is($r->{phantoms}, 0, 'no phantom event: Kafka has only what the promoted database has');
is($r->{lost}, 0, 'nothing lost: every event of the promoted database reaches Kafka');
is($r->{seq_reused}, 0, 'no seq number is handed out twice');
is($r->{seq_disorder}, 0, 'every key\'s seq increases in Kafka order');
cmp_ok($r->{duplicates}, '<=', $OutboxFailover::BATCH_SIZE,
	'at most one page is sent again');
ok(defined $r->{publish_after_promote}, 'the promoted relay publishes');

done_testing();
