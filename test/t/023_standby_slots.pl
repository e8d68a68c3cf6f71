# test/t/023_standby_slots.pl: outbox.synchronized_standby_slots.  A page
# is published only once every named physical slot's standby has flushed
# its commits; a slot that does not exist, is logical, or has no standby
# streaming from it holds publishing back, and status(), health() and the
# log (once per reason) say why.  A reload that takes a slot out of the
# list takes effect at once; a standby that comes back releases the page by
# itself; an empty setting publishes at once.

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

my $topic = 'outbox.event.slotted';
my $kafka = OutboxTest::Broker->start(brokers => 1);
my $node = outbox_node(
	'main', $kafka,
	allows_streaming => 'logical',
	conf => "outbox.synchronized_standby_slots = 'standby1'");
$node->safe_psql('postgres', 'CREATE EXTENSION outbox');
my ($pid) = wait_for_relay($node, 'postgres', 30);
ok(defined $pid, 'the relay runs');

sub emit_one
{
	my ($tag) = @_;
	return $node->safe_psql('postgres',
		"SELECT outbox.emit('slotted', 'a-1', 'slotted.$tag', '{}')");
}

sub in_kafka
{
	my ($id) = @_;
	my $msgs = read_topic($kafka, $topic) // [];
	return scalar grep { ($_->{headers}{id} // '') eq $id } @$msgs;
}

sub status_of
{
	my ($column) = @_;
	return $node->safe_psql('postgres', "SELECT $column FROM outbox.status()");
}

sub set_slots
{
	my ($value) = @_;
	$node->safe_psql('postgres',
		"ALTER SYSTEM SET outbox.synchronized_standby_slots = '$value'");
	$node->reload;
	return;
}

# the relay waits, and status(), health() and the log say why
sub waits_because
{
	my ($re, $what) = @_;
	ok( poll_until(
			$node, 'postgres',
			"SELECT state, last_error ~ '$re' FROM outbox.status()",
			'waiting for standby|t', 30),
		"$what: the relay waits for the standby, and status() says why");
	my ($health, $reason) = split /\|/,
	  $node->safe_psql('postgres', q{SELECT * FROM outbox.health('1 hour')});
	is($health, 'warning', "$what: health() warns");
	like($reason, qr/^publishing waits for a standby: .*$re/,
		"$what: health() says why");
	return;
}

sub log_count
{
	my @lines = slurp_file($node->logfile) =~
	  /waits for a standby before publishing/g;
	return scalar @lines;
}

# --- a slot that does not exist
my $e1 = emit_one('first');
waits_because('replication slot "standby1" does not exist', 'no such slot');
ok(!in_kafka($e1), 'the event is not published');
like(
	slurp_file($node->logfile),
	qr/waits for a standby before publishing\n.*DETAIL:  .*replication slot "standby1" does not exist\.\n.*HINT:  Create the physical slot/,
	'the log says why, with a hint');

# waiting costs wake-ups of a tenth of a second, not a busy loop
sub switches
{
	open(my $fh, '<', "/proc/$pid/status") or return 0;
	my ($n) = join('', <$fh>) =~ /^voluntary_ctxt_switches:\s+(\d+)/m;
	return $n // 0;
}
my $before = switches();
sleep 2;
my $woke = switches() - $before;
note "a blocked relay woke $woke times in 2 s";
cmp_ok($woke, '<', 100, 'a blocked relay does not spin');
is(log_count(), 1, 'and logs its reason once');

# --- a logical slot of that name
$node->safe_psql('postgres',
	"SELECT pg_create_logical_replication_slot('standby1', 'pgoutput')");
waits_because('replication slot "standby1" is a logical slot', 'a logical slot');
is(log_count(), 2, 'a new reason is logged once more');

# --- a physical slot no standby streams from
$node->safe_psql('postgres', "SELECT pg_drop_replication_slot('standby1')");
$node->safe_psql('postgres',
	"SELECT pg_create_physical_replication_slot('standby1', true)");
waits_because('no standby streams from replication slot "standby1"',
	'a slot without its standby');
ok(!in_kafka($e1), 'the event is still not published');

# --- a standby streaming from another slot; both named, then only its own
$node->safe_psql('postgres',
	"SELECT pg_create_physical_replication_slot('standby2', true)");
$node->backup('base');
my $standby = PostgreSQL::Test::Cluster->new('standby2');
$standby->init_from_backup($node, 'base', has_streaming => 1);
$standby->append_conf('postgresql.conf', "primary_slot_name = 'standby2'");
$standby->start;
set_slots('standby2, standby1');
waits_because('no standby streams from replication slot "standby1"',
	'one of two slots without its standby');
my $t0 = time();
set_slots('standby2');
my $msgs = wait_for_events($kafka, $topic, [$e1], 30);
note sprintf('published %.2f s after the reload', time() - $t0);
ok(in_kafka($e1), 'a reload that takes the slot out of the list releases the page');
ok(relay_state_is($node, 'postgres', 'running'), 'the relay runs again');
is($node->safe_psql('postgres', q{SELECT status FROM outbox.health('1 hour')}),
	'ok', 'health() is ok');

# --- the standby streams: events go out
my @ids = map { emit_one("streamed$_") } 1 .. 20;
$t0 = time();
wait_for_events($kafka, $topic, \@ids, 30);
note sprintf('20 events published within %.2f s with the standby streaming',
	time() - $t0);
is( $node->safe_psql(
		'postgres',
		"SELECT restart_lsn >= pg_current_wal_insert_lsn() - 1000000 FROM pg_replication_slots WHERE slot_name = 'standby2'"
	),
	't',
	'the standby\'s slot follows');

# --- the standby stops: the page waits; it comes back: the page goes
$standby->stop;
my $e2 = emit_one('while_down');
waits_because('no standby streams from replication slot "standby2"',
	'the standby stopped');
ok(!in_kafka($e2), 'an event committed while the standby is down waits');
$standby->start;
wait_for_events($kafka, $topic, [$e2], 30);
ok(in_kafka($e2), 'and goes out once the standby is back, without a reload');

# --- an empty setting: published at once, standby or not
set_slots('');
$standby->stop;
my $e3 = emit_one('no_setting');
wait_for_events($kafka, $topic, [$e3], 30);
ok(in_kafka($e3), 'with the setting empty the relay publishes without the standby');

done_testing();
