# test/t/119_rotation_hold.pl: failure drill.  A held partition across the
# log's rotation.  One broker of three goes down under load with a 4 s
# outbox.retention, so the partitions it leads are held (outbox.held) while
# the ring goes on turning: the generations holding held events are moved
# out of, not emptied with them; every held event stays in the log.  When
# the broker returns the held events are published: nothing is lost and
# every aggregate stays in order.

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

my $partitions = 6;
my $kafka = OutboxTest::Broker->start(brokers => 3);
$kafka->command("create $DRILL_TOPIC $partitions");

# a broker that leads some of the drill topic's partitions, not all
my $meta = `kcat -L -b ${\ $kafka->bootstrap } -t $DRILL_TOPIC 2>&1`;
my %leaders = $meta =~ /partition (\d+), leader (\d+),/g;
my ($victim) = grep {
	my $b = $_;
	my $n = grep { $_ == $b } values %leaders;
	$n > 0 && $n < $partitions
} 1 .. 3;
ok(defined $victim, 'a broker leads some partitions of the drill topic, not all')
  or BAIL_OUT('no broker leads part of the drill topic');

my $node = outbox_node(
	'rotation_hold', $kafka, conf => q{
outbox.hold_after = 1000
outbox.retry_backoff_min = '100ms'
outbox.retry_backoff_max = '1s'
outbox.poll_interval = '200ms'
outbox.retention = '4s'
});
drill_setup($node, 'postgres');
ok(defined((wait_for_relay($node, 'postgres', 10))[0]), 'the relay runs');

sub q1 { return $node->safe_psql('postgres', $_[0]); }

my $load = OutboxDrill::Load->start($node, 'postgres', seconds => 40, rate => 50,
	aggregates => 100);
ok(poll_until($node, 'postgres', 'SELECT published > 200 FROM outbox.status()', 't', 30),
	'the load is published');

$kafka->command("down $victim");
ok(poll_until($node, 'postgres', 'SELECT count(*) > 50 FROM outbox.held', 't', 30),
	"broker $victim down: its partitions are held, events pile up in outbox.held");
my ($first_held, $first_gen) = split /\|/,
  q1('SELECT e.id, e.generation FROM outbox.held h JOIN outbox.events e ON e.id = h.id'
	  . ' ORDER BY e.id LIMIT 1');
ok( poll_until(
		$node, 'postgres',
		"SELECT generation <> $first_gen FROM outbox.events WHERE id = $first_held", 't', 40),
	"the first held event moved out of generation $first_gen as the ring turned");
is( q1('SELECT count(*) FROM outbox.held h WHERE NOT EXISTS'
		  . ' (SELECT 1 FROM outbox.events e WHERE e.id = h.id)'),
	'0', 'every held event is still in the log');
ok( poll_until(
		$node, 'postgres',
		"SELECT count(*) > 0 FROM outbox.generations WHERE generation = $first_gen"
		  . " AND (state <> 'closed' OR emptied_at IS NOT NULL)",
		't', 40),
	"generation $first_gen is emptied or turned, without the held events");

$kafka->command("up $victim");
$load->finish;
ok(poll_until($node, 'postgres', 'SELECT count(*) FROM outbox.held', '0', 60),
	'the broker is back: the hold ends');
my $all = committed_ids($node, 'postgres');
my $msgs = wait_for_events($kafka, $DRILL_TOPIC, [ keys %$all ], 60);
my $fig = drill_figures($msgs, $all);
report_figures('hold across the rotation', $fig);
is(scalar(@{ $fig->{missing} }), 0, 'every committed event is in Kafka');
is($fig->{order_violations}, 0, 'per-aggregate order kept');
is(scalar(@{ $fig->{strangers} }), 0, 'no phantom');
ok( poll_until(
		$node, 'postgres',
		"SELECT sum(n_tup_ins) - sum(n_tup_del) = pg_sequence_last_value('outbox.events_id_seq')"
		  . " FROM pg_stat_user_tables WHERE schemaname = 'outbox' AND relname LIKE 'events%'",
		't', 30),
	'no row of the log was deleted but by a move');

$node->stop;
done_testing();
