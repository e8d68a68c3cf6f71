# test/t/106_retention.pl: failure drill.  Under steady load, with events
# aged past outbox.retention (a test fixture: their created_at is moved two
# hours back), some delivered, some not yet (the relay is paused), one
# quarantined and one parked behind it: outbox.cleanup(true) reports and
# changes nothing; outbox.cleanup(false) deletes, in bounded batches,
# exactly the old delivered ones and nothing undelivered, quarantined,
# parked or young; the relay itself deletes nothing (its log is a ring of
# generations it empties whole, t/118); nothing committed is lost.

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

# a big event is refused by librdkafka itself (message.max.bytes) and
# quarantined after two attempts
my $kafka = OutboxTest::Broker->start(brokers => 3);
my $node = outbox_node(
	'retention', $kafka,
	kafka_config => "$OutboxTest::TEST_KAFKA_CONFIG;message.max.bytes=10000",
	conf => q{
outbox.max_attempts = 2
outbox.retry_backoff_min = '50ms'
outbox.retry_backoff_max = '200ms'
});
drill_setup($node, 'postgres');
my ($pid) = wait_for_relay($node, 'postgres', 10);
ok(defined $pid, 'the relay runs');

sub ids
{
	my ($where) = @_;
	return [ split /\n/,
		  $node->safe_psql('postgres',
			'SELECT event_id FROM outbox.events'
			  . (defined $where ? " WHERE $where" : '')
			  . ' ORDER BY id') ];
}

sub cleanup
{
	my ($dry, $max) = @_;
	my $row = query_json($node, 'postgres',
		"SELECT row_to_json(c) FROM outbox.cleanup($dry, $max) c");
	return $row;
}

sub in_kafka
{
	return event_ids_of(read_topic($kafka, $DRILL_TOPIC) // []);
}

my $load = OutboxDrill::Load->start($node, 'postgres', seconds => 26, rate => 60);
usleep(2_000_000);

# emit() refuses an event over message.max.bytes: the big one is a row
# written without it, as if emitted before the limit was lowered
my $out = $node->safe_psql(
	'postgres', "BEGIN;\n"
	  . insert_event_sql('drill', 'big-r', 'drill.poked',
		"jsonb_build_object('blob', repeat('z', 20000))")
	  . ";\nSELECT outbox.emit('drill', 'big-r', 'drill.poked', '{}');\nCOMMIT;");
my ($head, $parked) = grep { /^[0-9a-f-]{36}$/ } split /\n/, $out;
ok( poll_until(
		$node, 'postgres',
		"SELECT string_agg(state, ',' ORDER BY seq) FROM outbox.dead_letters",
		'quarantined,parked', 30),
	'an event is quarantined and its successor parked');
usleep(2_000_000);

# pause: from now on the load's events stay undelivered
ok(set_and_reload($node, 'postgres', 'outbox.enabled', 'off'), 'pause the relay');
ok(poll_until($node, 'postgres', 'SELECT state FROM outbox.status()', 'paused', 30),
	'the relay is paused');
usleep(1_000_000);

# the fixture: every event so far is two hours old
$node->safe_psql('postgres',
	"UPDATE outbox.events SET created_at = created_at - interval '2 hours'");
# (the load goes on: rows committed since are not aged)
my $aged = ids("created_at < now() - interval '1 hour'");
my $kafka_ids = in_kafka();
my @delivered = grep { $kafka_ids->{$_} } @$aged;
my @undelivered = grep { !$kafka_ids->{$_} } @$aged;
note scalar(@$aged) . ' events aged: ' . scalar(@delivered) . ' delivered, '
  . scalar(@undelivered) . ' not';
cmp_ok(scalar(@delivered), '>', 100, 'many aged events are delivered');
cmp_ok(scalar(@undelivered), '>', 20, 'and some are not (paused relay, poison)');
ok((grep { $_ eq $head } @undelivered) && (grep { $_ eq $parked } @undelivered),
	'the quarantined and the parked event are among the undelivered');

# default retention, 7 days: two hours old is young
is(cleanup('true', 10000)->{events}, 0,
	'with the default retention (7 days) nothing two hours old is due');

ok(set_and_reload($node, 'postgres', 'outbox.retention', '1h'), 'outbox.retention = 1h');
ok(poll_until($node, 'postgres', 'SHOW outbox.retention', '1h', 30), 'in force');

# dry run: reports, changes nothing
my $before = ids();
my $dry = cleanup('true', 10000);
is($dry->{events}, scalar(@delivered),
	'cleanup(true) reports exactly the aged delivered events (' . scalar(@delivered) . ')');
is($dry->{deleted}, JSON::PP::false, 'and says it deleted nothing');
my $after = ids("id <= (SELECT max(id) FROM outbox.events WHERE event_id = '$before->[-1]')");
is_deeply($after, $before, 'cleanup(true) changes nothing');

# bounded batches
my $first = cleanup('false', 100);
is($first->{events}, 100, 'cleanup(false, 100) deletes 100 events, no more');
is($first->{deleted}, JSON::PP::true, 'and says so');
my $total = $first->{events};
while (1)
{
	my $n = cleanup('false', 500)->{events};
	last if $n == 0;
	$total += $n;
}
is($total, scalar(@delivered),
	"repeated cleanup(false) deletes the aged delivered events, all of them ($total)");

my %left = map { $_ => 1 } @{ ids() };
is(scalar(grep { $left{$_} } @delivered), 0, 'none of them is left');
is(scalar(grep { !$left{$_} } @undelivered), 0,
	'every aged undelivered event is left (' . scalar(@undelivered) . ')');
ok($left{$head} && $left{$parked}, 'the quarantined and the parked one among them');
my @young = grep { !$kafka_ids->{$_} } @{ ids("created_at > now() - interval '1 hour'") };
cmp_ok(scalar(@young), '>', 0,
	'events committed after the fixture are kept (' . scalar(@young) . ')');

# resume: the aged undelivered events go out, then they are due too
ok(set_and_reload($node, 'postgres', 'outbox.enabled', 'on'), 'resume the relay');
my @flowing = grep { $_ ne $head && $_ ne $parked } @undelivered;
wait_for_events($kafka, $DRILL_TOPIC, [ @flowing, @young ], 30);
# (Kafka has them a moment before the relay records its progress)
my $due = 0;
my $deadline = time() + 30;
while ($due < @flowing && time() < $deadline)
{
	$due += cleanup('false', 10000)->{events};
	usleep(200_000);
}
is($due, scalar(@flowing),
	"once delivered, the aged events are deleted ($due), not the young ones");
%left = map { $_ => 1 } @{ ids() };
is(scalar(grep { !$left{$_} } @young), 0, 'the young ones are all there');
ok($left{$head} && $left{$parked}, 'and so are the quarantined and the parked one');

# the relay deletes nothing itself: its log is a ring of generations,
# emptied whole by TRUNCATE (t/118), and none is past the retention here
$node->safe_psql('postgres',
	"UPDATE outbox.events SET created_at = created_at - interval '2 hours'");
my $aged_rows = $node->safe_psql('postgres',
	"SELECT count(*) FROM outbox.events WHERE created_at < now() - interval '1 hour'");
$node->restart;
ok(defined((wait_for_relay($node, 'postgres', 30))[0]), 'the relay runs after a restart');
usleep(3_000_000);
my $old_delivered = $node->safe_psql('postgres',
	"SELECT count(*) FROM outbox.events WHERE created_at < now() - interval '1 hour'");
is($old_delivered, $aged_rows,
	"the relay deletes none of the $aged_rows aged events: it empties whole generations instead");
$load->finish;
my $all = committed_ids($node, 'postgres');
my $msgs = wait_for_events($kafka, $DRILL_TOPIC, [ keys %$all ], 60);
my $fig = drill_figures($msgs, $all);
report_figures('retention', $fig,
	sprintf('%d aged delivered deleted by cleanup(), %d after delivery, none by the relay',
		$total, $due));
is(scalar(@{ $fig->{missing} }), 0,
	'zero loss: every committed event is in Kafka, none deleted before delivery');
is($fig->{order_violations}, 0, 'per-aggregate order kept');

$node->stop;
done_testing();
