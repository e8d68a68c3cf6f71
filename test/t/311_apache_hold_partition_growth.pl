# test/t/311_apache_hold_partition_growth.pl: a topic gains partitions
# while one of its partitions is held, on a real Apache Kafka cluster (the
# test broker cannot add partitions to a topic).  The topic has 3
# partitions, each on one broker with no other replica; the broker of
# partition 2 is stopped, so the relay holds that partition.  The topic is
# then grown to 6 partitions, and the relay learns the new count twice
# while the hold lasts: once when a reload rebuilds its producer, once when
# the server restarts.  Keys keep being emitted all along.  After the
# broker returns, a consumer reading the topic with kcat finds every event,
# each key's seq increasing in every partition, and no key's later event
# written (log append time) before an earlier one in another partition:
# the keys of the held partition did not jump to a new partition ahead of
# their held events.  Once the hold ended, the topic's events are spread
# over its 6 partitions as Java's partitioner spreads them.

use strict;
use warnings;

use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep time);

use FindBin;
use lib "$FindBin::RealBin/../perl";
use OutboxTest;
use OutboxDrill;
use OutboxKafka;

my $topic = 'outbox.event.grow';
my $victim = 3;    # leads partition 2, the one held
my $keys = 60;

my $kafka = OutboxKafka::Cluster->start(brokers => 3);

# log append time: the order in which the brokers wrote the messages,
# which is what a consumer of several partitions can rely on
$kafka->tool('org.apache.kafka.tools.TopicCommand',
	'--bootstrap-server', $kafka->bootstrap, '--create', '--topic', $topic,
	'--replica-assignment', '1,2,3',
	'--config', 'min.insync.replicas=1',
	'--config', 'message.timestamp.type=LogAppendTime');

# the topic's leaders once it has n partitions, each with a leader but
# those of the stopped broker
sub wait_partitions
{
	my ($n, $stopped) = @_;
	my $leaders = {};
	my $deadline = time() + 60;
	while (time() < $deadline)
	{
		$leaders = eval { $kafka->leaders($topic) } // {};
		last if keys %$leaders == $n
		  && !grep { $_ != ($stopped // -1) && $leaders->{$_}{leader} < 0 } keys %$leaders;
		usleep(500_000);
	}
	return $leaders;
}
my $leaders = wait_partitions(3);
is(scalar(keys %$leaders), 3, "$topic has 3 partitions");
is($leaders->{2}{leader}, $victim, "broker $victim leads partition 2");

my $node = outbox_node(
	'apache311', $kafka,
	conf => q{
outbox.batch_size = 100
outbox.hold_after = 1000
outbox.retry_backoff_min = '100ms'
outbox.retry_backoff_max = '1s'
});
$node->safe_psql('postgres', q{
CREATE EXTENSION outbox;
CREATE TABLE committed (event_id uuid PRIMARY KEY, phase text NOT NULL);
});
ok(defined wait_for_relay($node, 'postgres', 30), 'the relay runs');

# one event for every key, in one transaction, recorded as of phase
my $round = 0;
sub emit_round
{
	my ($phase) = @_;
	$round++;
	$node->safe_psql('postgres', qq{
INSERT INTO committed
SELECT outbox.emit('grow', 'key-' || g, 'tick', jsonb_build_object('round', $round)), '$phase'
  FROM generate_series(1, $keys) g});
	return;
}

sub emit_rounds
{
	my ($phase, $n) = @_;
	for (1 .. $n)
	{
		emit_round($phase);
		usleep(300_000);
	}
	return;
}

my $held_list_sql = q{SELECT coalesce(string_agg(topic || '/' || kafka_partition, ','
  ORDER BY topic, kafka_partition), '') FROM outbox.holds()};

emit_rounds('before', 3);
ok(poll_until($node, 'postgres', 'SELECT backlog FROM outbox.status()', '0', 60),
	'the first events are published');

# ---------------------------------------------------------------------------
# partition 2 held

my $log_stop = -s $node->logfile;
$kafka->stop_broker($victim);
my $deadline = time() + 60;
while (time() < $deadline && $node->safe_psql('postgres', $held_list_sql) ne "$topic/2")
{
	emit_round('hold');
	usleep(200_000);
}
is($node->safe_psql('postgres', $held_list_sql), "$topic/2", "the relay holds $topic/2");
emit_rounds('hold', 3);

# ---------------------------------------------------------------------------
# the topic grows; the new partitions are on the live brokers

$kafka->tool('org.apache.kafka.tools.TopicCommand',
	'--bootstrap-server', $kafka->bootstrap, '--alter', '--topic', $topic,
	'--partitions', 6, '--replica-assignment', '1,2,3,1,2,1');
$leaders = wait_partitions(6, 2);
is(scalar(keys %$leaders), 6, "$topic has 6 partitions");
is(scalar(grep { $leaders->{$_}{leader} > 0 } 3 .. 5), 3, 'the new ones have leaders');

# a reload that rebuilds the producer: the new one counts the partitions
my $log_grown = -s $node->logfile;
ok( set_and_reload(
		$node, 'postgres', 'outbox.kafka_config',
		$OutboxTest::TEST_KAFKA_CONFIG . ';client.id=outbox-relay-311',
		qr/Kafka settings changed, rebuilding the producer/),
	'a reload rebuilds the producer');
emit_rounds('grown', 6);

# a restart: the relay starts with the held rows in outbox.held only
$node->restart;
ok(defined wait_for_relay($node, 'postgres', 30), 'the relay runs again after a restart');
emit_rounds('restarted', 6);
is($node->safe_psql('postgres', $held_list_sql), "$topic/2",
	"$topic/2 is still held after the restart");
ok( defined wait_for_log_match(
		$node, qr/topic "\Q$topic\E" has 6 partitions now; its events keep going to the 3 it had/,
		$log_grown, 30),
	'the log says the topic keeps its 3 partitions while it has held events');

# ---------------------------------------------------------------------------
# released

$kafka->start_broker($victim);
ok(poll_until($node, 'postgres', 'SELECT count(*) FROM outbox.held', '0', 120),
	'after the broker is back, outbox.held empties');
emit_rounds('after', 4);
ok(poll_until($node, 'postgres', 'SELECT backlog FROM outbox.status()', '0', 60),
	'and the backlog drains');
ok( defined wait_for_log_match(
		$node, qr/released topic "\Q$topic\E" partition 2\b/, $log_stop, 30),
	'the end of the hold is logged');

# ---------------------------------------------------------------------------
# what a consumer reads: kcat, with each message's log append time

my %phase = map { split /\|/ } split /\n/,
  $node->safe_psql('postgres', 'SELECT event_id, phase FROM committed');
is(scalar(keys %phase), $round * $keys, "$round rounds of $keys events committed");

sub read_with_times
{
	my ($out, $err) = ('', '');
	IPC::Run::run(
		[ 'kcat', '-C', '-b', $kafka->bootstrap, '-t', $topic,
		  '-o', 'beginning', '-e', '-q', '-f', '%p %o %T %k %h\n' ],
		'<', \undef, '>', \$out, '2>', \$err, IPC::Run::timeout(60))
	  or return [];
	my @m;
	foreach my $line (split /\n/, $out)
	{
		my ($p, $o, $t, $k, $h) = split / /, $line, 5;
		my ($id) = $h =~ /(?:^|,)id=([^,]+)/;
		my ($seq) = $h =~ /(?:^|,)seq=(\d+)/;
		push @m, { partition => $p, offset => $o, ts => $t, key => $k, id => $id, seq => $seq };
	}
	return [ sort { $a->{partition} <=> $b->{partition} or $a->{offset} <=> $b->{offset} } @m ];
}

my ($msgs, @missing);
$deadline = time() + 60;
while (1)
{
	$msgs = read_with_times();
	my %seen = map { ($_->{id} // '') => 1 } @$msgs;
	@missing = grep { !$seen{$_} } keys %phase;
	last if !@missing || time() > $deadline;
	usleep(500_000);
}
is(scalar(@missing), 0, 'every committed event is in Kafka (0 lost)');

# a consumer drops the ids it has seen; the first copy of each counts
my (%first, @firsts);
foreach my $m (@$msgs)
{
	next if $first{ $m->{id} }++;
	push @firsts, $m;
}
my $strangers = grep { !$phase{ $_->{id} } } @firsts;
is($strangers, 0, 'nothing that was not committed');

# within each partition, each key's seq only goes up
my (%last, $backwards);
foreach my $m (@firsts)
{
	my $at = "$m->{partition}/$m->{key}";
	$backwards++ if defined $last{$at} && $m->{seq} <= $last{$at};
	$last{$at} = $m->{seq};
}
is($backwards // 0, 0, "each key's seq increases within each partition");

# across partitions: no event of a key written after a later one of it
my (%by_key, @overtaken);
push @{ $by_key{ $_->{key} } }, $_ foreach @firsts;
foreach my $key (sort keys %by_key)
{
	my @e = sort { $a->{seq} <=> $b->{seq} } @{ $by_key{$key} };
	foreach my $i (0 .. $#e)
	{
		foreach my $j ($i + 1 .. $#e)
		{
			next if $e[$i]{partition} == $e[$j]{partition} || $e[$i]{ts} <= $e[$j]{ts};
			push @overtaken, sprintf('%s: seq %d (partition %d) written %d ms after seq %d (partition %d)',
				$key, $e[$i]{seq}, $e[$i]{partition}, $e[$i]{ts} - $e[$j]{ts},
				$e[$j]{seq}, $e[$j]{partition});
			last;
		}
	}
}
is(scalar(@overtaken), 0, 'no key\'s event was written after a later event of the key in another partition')
  or diag(join("\n", @overtaken[ 0 .. ($#overtaken < 9 ? $#overtaken : 9) ]));

# the growth reached the keys of the held partition: some of them are on
# a new partition now
my %parts_of;
$parts_of{ $_->{key} }{ $_->{partition} } = 1 foreach @firsts;
my @moved = grep { $parts_of{$_}{2} && grep { $_ >= 3 } keys %{ $parts_of{$_} } } keys %parts_of;
cmp_ok(scalar(@moved), '>', 0,
	'some keys of the held partition moved to a new partition (' . scalar(@moved) . ')');

# after the release the relay spreads the topic over its 6 partitions, as
# Java's default partitioner does
my $java = $kafka->read_java($topic) // [];
my %after_seen;
my @after = grep { ($phase{ $_->{headers}{id} // '' } // '') eq 'after' } @$java;
$after_seen{ $_->{headers}{id} } = 1 foreach @after;
is(scalar(keys %after_seen), 4 * $keys, 'the Java client reads the events emitted after the release');
my @astray = grep { $_->{partition} != $_->{java_partition} } @after;
is(scalar(@astray), 0, 'each is on the partition Java\'s partitioner picks among 6');
cmp_ok(scalar(grep { $_->{partition} >= 3 } @after), '>', 0, 'the new partitions receive events');
is(relay_status($node, 'postgres')->{quarantined}, 0, 'nothing was quarantined');

$node->stop;
$kafka->down;
done_testing();
