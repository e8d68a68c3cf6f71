# test/t/102_request_errors.pl: failure drill.  Under steady load the
# brokers answer produce requests with retriable errors: NOT_LEADER_FOR_
# PARTITION, LEADER_NOT_AVAILABLE and REQUEST_TIMED_OUT, 50 requests in a
# row each.  Nothing committed is lost, nothing is duplicated, every
# aggregate stays in order, and a librdkafka setting that would let such
# errors reorder an aggregate (a retry limit) is refused.  Holds are off:
# this drill is about librdkafka's own retries.  (With them on, a
# partition whose requests fail for over outbox.hold_after while another
# answers is held, and the withdrawn round sends copies: 112 and 309 test
# that, duplicates included; one CI run here saw 46.)

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

my $errors = 50;    # failed produce requests per injection

my $kafka = OutboxTest::Broker->start(brokers => 3);
my $node = outbox_node(
	'reqerr', $kafka, conf => q{
outbox.retry_backoff_min = '100ms'
outbox.retry_backoff_max = '1s'
outbox.hold_after = 0
});
drill_setup($node, 'postgres');
my ($pid) = wait_for_relay($node, 'postgres', 10);
ok(defined $pid, 'the relay runs');
my $log_start = -s $node->logfile;

my $load = OutboxDrill::Load->start($node, 'postgres', seconds => 20, rate => 100);
usleep(2_000_000);

# The mock answers the next $errors produce requests, whoever sends them,
# with the error; only the relay produces.  So once an event committed
# after the injection is in Kafka, all of them were answered to the relay
# (a request gets through only when none is left).
my $probe_n = 0;

# Emits a probe event and returns how long it took to show up in Kafka.
# librdkafka from 2.3 on backs a retried request off exponentially
# (retry.backoff.ms 100 ms up to retry.backoff.max.ms, 1 s), and
# REQUEST_TIMED_OUT is retried that way: 50 of them take about 46 s there
# (about 5 s on 2.0), so the probe may take that long.
sub probe
{
	my $t = time();
	$probe_n++;
	my $probe = $node->safe_psql('postgres',
		"SELECT outbox.emit('drill', 'probe', 'drill.probed', '{\"n\": $probe_n}')");
	my $msgs = wait_for_events($kafka, $DRILL_TOPIC, [$probe], 90);
	return event_ids_of($msgs)->{$probe} ? time() - $t : undef;
}

my $baseline = probe();
foreach my $err (qw(NOT_LEADER_FOR_PARTITION LEADER_NOT_AVAILABLE REQUEST_TIMED_OUT))
{
	$kafka->command("errors produce $errors $err");
	my $took = probe();
	ok(defined $took,
		"after $errors produce requests failed with $err, an event committed meanwhile is delivered");
	diag(sprintf('request errors: with %d x %s an event took %.2f s to reach Kafka (%.2f s without errors)',
			$errors, $err, $took // -1, $baseline // -1));
	usleep(2_000_000);
}

$load->finish;
my $all = committed_ids($node, 'postgres');
my $msgs = wait_for_events($kafka, $DRILL_TOPIC, [ keys %$all ], 60);
my $fig = drill_figures([ grep { ($_->{headers}{aggregate_id} // '') ne 'probe' } @$msgs ], $all);
report_figures('request errors', $fig);

is(scalar(@{ $fig->{missing} }), 0, 'zero loss: every committed event is in Kafka');
is(scalar(@{ $fig->{strangers} }), 0, 'Kafka holds no event that was not committed');
is($fig->{duplicates}, 0,
	'no duplicates: the idempotent producer retried the failed requests itself');
is($fig->{order_violations}, 0,
	'per-aggregate order: each aggregate\'s seq increases');
is($fig->{gaps}, 0, 'and without gaps');
is($fig->{split}, 0, 'each aggregate stays in one partition');
my $status = relay_status($node, 'postgres');
is($status->{quarantined}, 0, 'retriable errors quarantine nothing');
is(relay_pid($node, 'postgres'), $pid, 'the same relay process runs throughout');
is(server_crashed_since($node, $log_start), '', 'no process crashed');

# With a retry limit, librdkafka fails a batch that runs out of retries
# while later batches of the same partition go through; the relay's resend
# would then land behind them (this drill showed hundreds of order
# violations with message.send.max.retries=1).  Such settings are refused.
foreach my $bad ('message.send.max.retries=1', 'retries=3')
{
	my ($ret, $out, $err) = $node->psql('postgres',
		"ALTER SYSTEM SET outbox.kafka_config = 'linger.ms=5;$bad'");
	my $property = (split /=/, $bad)[0];
	isnt($ret, 0, "outbox.kafka_config '$bad' is refused");
	like($err,
		qr/DETAIL:  Property "\Q$property\E" cannot be set here\.\nHINT:  The relay's ordering promise needs librdkafka to retry until the relay gives up on the round\./,
		"and the error says why ($property)");
}

$node->stop;
done_testing();
