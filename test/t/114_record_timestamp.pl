# test/t/114_record_timestamp.pl: every message's record timestamp (Kafka's
# CreateTime) is its event's occurred_at, to the millisecond, whether
# occurred_at was the emitting transaction's start or given by the caller,
# in a drained backlog as well as one by one; an occurred_at before 1970,
# which Kafka cannot carry, gets the time the relay sent it.  Read back by
# kcat, whose %T is the record timestamp.  A broker that refuses a record's
# timestamp (INVALID_TIMESTAMP: its message.timestamp.*.max.ms) gets it
# again with the send time; refused with that too, the event is
# quarantined, saying why.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);

use FindBin;
use lib "$FindBin::RealBin/../perl";
use OutboxTest;

my $topic = 'outbox.event.clock';
my $kafka = OutboxTest::Broker->start(brokers => 3);
my $node = outbox_node(
	'timestamp', $kafka, conf => qq{
outbox.max_attempts = 2
outbox.retry_backoff_min = '50ms'
outbox.retry_backoff_max = '200ms'
outbox.poison_policy = 'skip'
});
$node->safe_psql('postgres', 'CREATE EXTENSION outbox');
ok(defined wait_for_relay($node, 'postgres', 30), 'the relay runs');

# a backlog with the relay paused: occurred_at given, spread over years with
# every millisecond and microsecond digit in play, and left to emit()
$node->append_conf('postgresql.conf', 'outbox.enabled = off');
$node->reload;
$node->safe_psql('postgres', q{
SELECT count(outbox.emit('clock', 'c-' || (i % 40), 'clock.ticked',
	jsonb_build_object('i', i),
	occurred_at => CASE WHEN i % 3 = 0 THEN NULL
		ELSE timestamptz '2031-05-06 07:08:09.123456+00' - i * interval '4 days 1.234567 s' END))
  FROM generate_series(1, 3000) i});
$node->append_conf('postgresql.conf', 'outbox.enabled = on');
$node->reload;

# then a few one by one, and two that Kafka's timestamps cannot hold
$node->safe_psql('postgres',
	"SELECT outbox.emit('clock', 'late', 'clock.ticked', '{}', occurred_at => now() - interval '2 hours')")
  foreach 1 .. 3;
my $before_old = time();
my @old = map {
	$node->safe_psql('postgres',
		"SELECT outbox.emit('clock', 'old', 'clock.ticked', '{}', occurred_at => '$_')")
} ('1969-07-20 20:17:40+00', '1970-01-01 00:00:00.000500+00');

my %want = map { split /\|/ } split /\n/, $node->safe_psql('postgres', q{
SELECT event_id || '|' || floor(extract(epoch FROM occurred_at) * 1000)::bigint
  FROM outbox.events});
my @ids = keys %want;
cmp_ok(scalar(@ids), '==', 3005, 'the events are in the log');
my $msgs = wait_for_events($kafka, $topic, \@ids, 60) // [];
my $after_old = time();

my (@wrong, %seen);
foreach my $m (@$msgs)
{
	my $id = $m->{headers}{id} // '';
	next if !exists $want{$id} || $seen{$id}++;
	next if grep { $_ eq $id } @old;
	push @wrong, "$id: $m->{timestamp} for $want{$id}"
	  if $m->{timestamp} != $want{$id};
}
is(scalar(keys %seen), 3005, 'every event reached Kafka');
is(scalar(@wrong), 0, 'each record timestamp is its occurred_at to the millisecond')
  or diag(join("\n", @wrong[ 0 .. ($#wrong < 9 ? $#wrong : 9) ]));

# before 1970: the time of sending, which falls between the emit and the read
foreach my $id (@old)
{
	my ($m) = grep { ($_->{headers}{id} // '') eq $id } @$msgs;
	my $ts = defined $m ? $m->{timestamp} / 1000 : -1;
	ok($ts >= int($before_old) && $ts <= $after_old + 1,
		"an occurred_at before 1970 is sent with the time of sending ($ts)");
	like($m->{headers}{occurred_at} // '', qr/^19(69|70)-/,
		'and its occurred_at header still says when it happened');
}

# a broker that refuses occurred_at as the timestamp: sent with the send time
$kafka->command('errors produce 1 INVALID_TIMESTAMP');
my $before_resend = time();
my $resent = $node->safe_psql('postgres',
	"SELECT outbox.emit('clock', 'resent', 'clock.ticked', '{}', occurred_at => '2001-01-01+00')");
my ($r) = grep { ($_->{headers}{id} // '') eq $resent }
  @{ wait_for_events($kafka, $topic, [$resent], 30) // [] };
my $resent_ts = defined $r ? $r->{timestamp} / 1000 : -1;
ok($resent_ts >= int($before_resend) && $resent_ts <= time() + 1,
	"an occurred_at the broker refuses as a timestamp is sent again with the send time ($resent_ts)");
is($r->{headers}{occurred_at} // '', '2001-01-01T00:00:00.000000Z', 'its header still says when it happened');

# refused with the send time too (and on the attempt after): quarantined
$kafka->command('errors produce 3 INVALID_TIMESTAMP');
my $refused = $node->safe_psql('postgres',
	"SELECT outbox.emit('clock', 'refused', 'clock.ticked', '{}', occurred_at => '2001-01-01+00')");
ok( poll_until(
		$node, 'postgres',
		"SELECT state FROM outbox.dead_letters WHERE event_id = '$refused'",
		'quarantined', 30),
	'an event whose every timestamp the broker refuses is quarantined, not retried without end');
like(
	$node->safe_psql('postgres',
		"SELECT last_error FROM outbox.dead_letters WHERE event_id = '$refused'"),
	qr/^INVALID_TIMESTAMP: refused by the broker: the record timestamp is further from its clock/,
	'and its dead letter says why');

$node->stop;
done_testing();
