# test/t/021_failover_async.pl: failover to an asynchronous standby under
# load.  The standby (physical slot) falls behind while its WAL receiver is
# stopped, every process of the primary is killed at once, the standby is
# promoted.  Without outbox.synchronized_standby_slots Kafka then holds
# events the promoted database never had (phantoms), and the promoted
# database hands their seq numbers out again; with it naming the standby's
# slot: no phantom, nothing lost, every key's seq increasing in Kafka, and
# at most two pages sent twice.

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

sub report
{
	my ($what, $r) = @_;
	note sprintf(
		'%s: %d events in the promoted database, %d in Kafka: %d phantoms, %d lost, '
		  . '%d duplicates, %d seq numbers reused, %d out of order; the old primary '
		  . 'had published %s; promotion to publishing again: %s s',
		$what, $r->{events} // 0, $r->{kafka_ids} // 0, $r->{phantoms} // -1,
		$r->{lost} // -1, $r->{duplicates} // -1, $r->{seq_reused} // -1,
		$r->{seq_disorder} // -1, $r->{primary_published} // '?',
		defined $r->{publish_after_promote}
		? sprintf('%.2f', $r->{publish_after_promote})
		: 'never');
	return;
}

# --- today's behaviour: the relay publishes what the standby may not have
my $r = failover_drill(
	kafka => $kafka,
	name => 'plain',
	aggregate => 'acct_plain',
	stall => 5);
report('without the setting', $r);
cmp_ok($r->{phantoms} // 0, '>', 0,
	'without the setting, Kafka holds events the promoted database does not have');
cmp_ok($r->{seq_reused} // 0, '>', 0,
	'and the promoted database hands their seq numbers out again');
is($r->{lost}, 0, 'nothing the promoted database has is lost');
ok(defined $r->{publish_after_promote}, 'the promoted relay publishes');

# --- with the standby's slot named: only what the standby has is published
$r = failover_drill(
	kafka => $kafka,
	name => 'safe',
	aggregate => 'acct_safe',
	standby_slots => 1,
	stall => 5);
report('with outbox.synchronized_standby_slots', $r);
ok($r->{waited}, 'while the standby is stopped the relay waits for it');
is($r->{phantoms}, 0, 'no phantom event: Kafka has only what the promoted database has');
is($r->{lost}, 0, 'nothing lost: every event of the promoted database reaches Kafka');
is($r->{seq_reused}, 0, 'no seq number is handed out twice');
is($r->{seq_disorder}, 0, 'every key\'s seq increases in Kafka order');
cmp_ok($r->{duplicates}, '<=', 2 * $OutboxFailover::BATCH_SIZE,
	'at most two pages are sent again');
ok(defined $r->{publish_after_promote}, 'the promoted relay publishes');

done_testing();
