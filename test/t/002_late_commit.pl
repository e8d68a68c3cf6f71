# test/t/002_late_commit.pl: an event whose transaction commits after later
# transactions' events were published is still published (design section 4),
# and so is one committed with two-phase commit.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);

# found without -I: PGXS resets PROVE_FLAGS after the Makefile sets it
use FindBin;
use lib "$FindBin::RealBin/../perl";
use OutboxTest;

my $topic = 'outbox.event.account';
my $kafka = OutboxTest::Broker->start(brokers => 1);
my $node = outbox_node('late', $kafka, conf => 'max_prepared_transactions = 5');

$node->safe_psql('postgres', 'CREATE EXTENSION outbox');
ok(defined((wait_for_relay($node, 'postgres', 10))[0]), 'the relay runs');

sub emit_committed
{
	my ($agg, $n) = @_;
	my @ids;

	push @ids,
	  $node->safe_psql('postgres',
		"SELECT outbox.emit('account', '$agg', 'account.credited', '{\"n\": $_}')")
	  foreach 1 .. $n;
	return @ids;
}

# Session "late" emits first, so its event has the lowest id, and stays open.
my $late = $node->background_psql('postgres');
$late->query_safe('BEGIN');
my $late_id = $late->query_safe(
	"SELECT outbox.emit('account', 'slow', 'account.opened', '{\"late\": true}')");
like($late_id, qr/^[0-9a-f-]{36}$/, 'an open transaction emitted an event');

# Later transactions commit and are published meanwhile, in two rounds so
# the relay completes more than one batch while the early one is open.
my @early = emit_committed('fast-1', 3);
my $msgs = wait_for_events($kafka, $topic, \@early);
ok(!event_ids_of($msgs)->{$late_id},
	'the uncommitted event is not published while later commits are');
my @more = emit_committed('fast-2', 3);
$msgs = wait_for_events($kafka, $topic, [ @early, @more ]);
ok(!event_ids_of($msgs)->{$late_id},
	'it is still not published after a second round of later commits');

# The open transaction commits last: its event must not be skipped.
$late->query_safe('COMMIT');
$msgs = wait_for_events($kafka, $topic, [$late_id], 30);
is(event_ids_of($msgs)->{$late_id}, 1,
	'the event of the transaction that committed late is published, once');

# Another open transaction that rolls back in the end publishes nothing.
$late->query_safe('BEGIN');
my $doomed_id = $late->query_safe(
	"SELECT outbox.emit('account', 'slow', 'account.closed', '{\"doomed\": true}')");
my @after = emit_committed('fast-3', 2);
$late->query_safe('ROLLBACK');
my @after2 = emit_committed('fast-3', 1);
$msgs = wait_for_events($kafka, $topic, [ @after, @after2 ]);
ok(!event_ids_of($msgs)->{$doomed_id},
	'the event of a transaction that stayed open and rolled back is not published');

# Two-phase commit: prepared while later events go out, committed by
# another session, which wakes no relay (the safety poll finds it).
$late->query_safe('BEGIN');
my $prepared_id = $late->query_safe(
	"SELECT outbox.emit('account', 'twophase', 'account.frozen', '{\"2pc\": true}')");
$late->query_safe("PREPARE TRANSACTION 'outbox_2pc'");
my @during = emit_committed('fast-4', 2);
$msgs = wait_for_events($kafka, $topic, \@during);
ok(!event_ids_of($msgs)->{$prepared_id},
	'a prepared but uncommitted event is not published');
$node->safe_psql('postgres', "COMMIT PREPARED 'outbox_2pc'");
$msgs = wait_for_events($kafka, $topic, [$prepared_id], 30);
ok(event_ids_of($msgs)->{$prepared_id},
	'the prepared event is published after COMMIT PREPARED');
$late->quit;

# In the end Kafka holds exactly the committed events, each once.
my $committed = $node->safe_psql('postgres',
	'SELECT event_id FROM outbox.events ORDER BY id');
my %want = map { $_ => 1 } split /\n/, $committed;
my $seen = event_ids_of(read_topic($kafka, $topic) // []);
is_deeply([ sort keys %$seen ], [ sort keys %want ],
	'Kafka holds exactly the committed events');
is(scalar(grep { $_ > 1 } values %$seen), 0, 'none of them twice');

$node->stop;
done_testing();
