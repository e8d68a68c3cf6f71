# test/t/113_exactly_once.pl: outbox.delivery = exactly_once on the mock
# cluster.  Each page goes out in a Kafka transaction that ends with a
# progress record keyed by the relay's transactional.id; the database
# records the transaction's number with the page.  After kill -9 of the
# relay mid-drain five times, a produce failure that aborts a transaction,
# and an event quarantined and replayed, every committed event is in Kafka,
# in order, and nothing else.  librdkafka's mock cluster keeps no
# transaction markers, so its readers see aborted messages too: that
# read_committed consumers see each event once, and the at_least_once
# control, are proven on Apache Kafka (test/drills/312, on demand) and t/313.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep time);

use FindBin;
use lib "$FindBin::RealBin/../perl";
use OutboxTest;
use OutboxDrill;
use JSON::PP ();

my $topic = 'outbox.event.meter';
my $batch_size = 500;
my $backlog = 5000;
my $kafka = OutboxTest::Broker->start(brokers => 3);
my $node = outbox_node(
	'eos', $kafka, conf => qq{
outbox.batch_size = $batch_size
outbox.transaction_events = $batch_size
outbox.delivery = exactly_once
outbox.max_attempts = 2
outbox.retry_backoff_min = '50ms'
outbox.retry_backoff_max = '200ms'
restart_after_crash = on
});
$node->safe_psql('postgres', 'CREATE EXTENSION outbox');
ok(defined((wait_for_relay($node, 'postgres', 10))[0]), 'the relay runs');

# the first event, and the progress record of its transaction
my $first = $node->safe_psql('postgres',
	"SELECT outbox.emit('meter', 'm-0', 'meter.read', '{\"i\": 0}')");
wait_for_events($kafka, $topic, [$first]);
my $sysid = $node->safe_psql('postgres',
	'SELECT system_identifier FROM pg_control_system()');
my $dboid = $node->safe_psql('postgres',
	"SELECT oid FROM pg_database WHERE datname = 'postgres'");
my $txn_id = "outbox-$sysid-$dboid";
ok( poll_until(
		$node, 'postgres',
		"SELECT kafka_transaction > 0 FROM outbox.relay_progress", 't', 10),
	'the database records the Kafka transaction of the page');

sub last_marker
{
	my $recs = read_topic($kafka, 'outbox.progress') // [];
	my @ours = grep { ($_->{key} // '') eq $txn_id } @$recs;
	return @ours ? $ours[-1] : undef;
}
my $marker = last_marker();
ok(defined $marker, "the progress topic has a record keyed $txn_id");
like($marker->{value} // '', qr/^\{"version":1,"transaction":\d+,"events":1,"kind":"batch",/,
	'it says how far the relay published: ' . ($marker->{value} // 'none'));
my ($marker_txn) = ($marker->{value} // '') =~ /"transaction":(\d+)/;
is($marker_txn,
	$node->safe_psql('postgres', 'SELECT kafka_transaction FROM outbox.relay_progress'),
	'its transaction number is the one the database recorded');

sub published
{
	return $node->safe_psql('postgres', 'SELECT published FROM outbox.relay_progress');
}

# a backlog, and kill -9 of the relay once two pages of it are recorded
sub kill_mid_drain
{
	my ($what) = @_;

	poll_until($node, 'postgres', 'SELECT backlog FROM outbox.status()', '0', 60);
	my $before = published();

	$node->safe_psql('postgres',
		"SELECT count(outbox.emit('meter', 'm-' || (i % 50), 'meter.read', jsonb_build_object('i', i)))"
		  . " FROM generate_series(1, $backlog) i");
	return kill_relay_when($node, 'postgres', sub { published() - $before },
		2 * $batch_size, 5, 30);
}

sub figures
{
	my (%opt) = @_;
	my @ids = split /\n/, $node->safe_psql('postgres',
		"SELECT event_id FROM outbox.events e WHERE NOT EXISTS"
		  . " (SELECT FROM outbox.dead_letters d WHERE d.event_id = e.event_id AND d.state <> 'replayed')");
	wait_for_events($kafka, $topic, \@ids, 60);
	my $msgs = read_topic($kafka, $topic, %opt) // [];
	$_->{topic} = $topic foreach @$msgs;
	return drill_figures($msgs, { map { ($_ => 1) } @ids });
}

# acknowledgements 50 ms late: a drain lasts long enough to be cut
$kafka->command('rtt all 50');
my @drained;
push @drained, kill_mid_drain("kill -9 number $_") foreach 1 .. 5;
$kafka->command('rtt all 0');
cmp_ok(scalar(grep { $_ < $backlog } @drained), '==', 5,
	'each kill -9 came mid-drain (' . join(', ', @drained) . " of $backlog events recorded)");
my $fig = figures();
report_figures('exactly_once, five kill -9 mid-drain', $fig);
is(scalar(@{ $fig->{missing} }), 0, 'every committed event is in Kafka');
is($fig->{order_violations}, 0, 'each aggregate in seq order');
is(scalar(@{ $fig->{strangers} }), 0, 'no phantom');
cmp_ok($fig->{duplicates}, '<=', 5 * $batch_size,
	"the mock's log keeps at most the page each kill aborted ($fig->{duplicates} copies)");
is( $node->safe_psql('postgres', 'SELECT kafka_transaction FROM outbox.relay_progress'),
	(last_marker()->{value} =~ /"transaction":(\d+)/)[0],
	'the database has recorded the last transaction Kafka committed');

# a refused produce request aborts the transaction; the page goes again in
# a new one.  The refusal falls on an event's request (one attempt of
# outbox.max_attempts) or on the progress record's: the two go in one round.
my $copies = $fig->{duplicates};
my $failures = relay_status($node, 'postgres')->{permanent_failures};
my $refusal_offset = -s $node->logfile;
$kafka->command('errors produce 1 MSG_SIZE_TOO_LARGE');
$node->safe_psql('postgres',
	"SELECT count(outbox.emit('meter', 'm-' || (i % 50), 'meter.read', jsonb_build_object('i', i)))"
	  . " FROM generate_series(1, 300) i");
$fig = figures();
is(scalar(@{ $fig->{missing} }), 0, 'a page whose transaction aborted is sent again');
ok( relay_status($node, 'postgres')->{permanent_failures} > $failures
	  || slurp_file($node->logfile, $refusal_offset) =~ /could not publish the progress record|TXNERR.*outbox\.progress/,
	'after the refusal that aborted its transaction: an event failed, or the progress record');
note "the aborted transaction left " . ($fig->{duplicates} - $copies)
  . " copies in the mock's log";

# quarantine: refused twice for good, then replayed
# (the refusals may fall on the progress record's requests too: enough of
# them for two attempts at the event, the rest cleared once it is out)
$kafka->command('errors produce 8 MSG_SIZE_TOO_LARGE');
my $poison = $node->safe_psql('postgres',
	"SELECT outbox.emit('meter', 'poison', 'meter.read', '{\"bad\": true}')");
ok( poll_until(
		$node, 'postgres',
		"SELECT state FROM outbox.dead_letters WHERE event_id = '$poison'",
		'quarantined', 30),
	'an event Kafka refuses for good is quarantined');
$kafka->command('clear-errors produce');
my $replay_offset = -s $node->logfile;
$node->safe_psql('postgres', "SELECT outbox.replay('$poison')");
ok( poll_until(
		$node, 'postgres',
		"SELECT state FROM outbox.dead_letters WHERE event_id = '$poison'",
		'replayed', 30),
	'and replayed')
  or explain_replay();

# what the relay and the database say about a replay that did not end
sub explain_replay
{
	diag($node->safe_psql('postgres',
			"SELECT row_to_json(d) FROM outbox.dead_letters d WHERE event_id = '$poison'"));
	diag($node->safe_psql('postgres',
			'SELECT row_to_json(p) FROM outbox.relay_progress p'));
	diag(JSON::PP->new->canonical->encode(relay_status($node, 'postgres')));
	diag(join("\n", grep { !/statement:/ } split /\n/,
			slurp_file($node->logfile, $replay_offset)));
	return;
}
is(scalar(grep { ($_->{headers}{id} // '') eq $poison } @{ read_topic($kafka, $topic) }),
	1, 'the replayed event is in Kafka once');

$node->stop;
done_testing();
