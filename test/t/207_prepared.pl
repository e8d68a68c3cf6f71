# test/t/207_prepared.pl: two-phase commit.  COMMIT PREPARED wakes the relay
# as a plain commit does (even with a 10 s safety poll the events reach
# Kafka within milliseconds), and the backlog counts the prepared
# transaction's events from COMMIT PREPARED on.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run;
use Time::HiRes qw(usleep time);

# found without -I: PGXS resets PROVE_FLAGS after the Makefile sets it
use FindBin;
use lib "$FindBin::RealBin/../perl";
use OutboxTest;

my $topic = 'outbox.event.ledger';
my $kafka = OutboxTest::Broker->start(brokers => 1);
my $node = outbox_node('twophase', $kafka, conf => q{
max_prepared_transactions = 30
});
# after outbox_node's 100 ms: the last setting wins
$node->append_conf('postgresql.conf', "outbox.poll_interval = '10s'");
$node->restart;
$node->safe_psql('postgres', 'CREATE EXTENSION outbox');
ok(defined wait_for_relay($node, 'postgres', 30), 'the relay runs');
is($node->safe_psql('postgres', 'SHOW outbox.poll_interval'), '10s',
	'the safety poll is 10 s');

# event id => Kafka message timestamp (ms since 1970, set at produce time)
sub kafka_times
{
	my ($out, $err) = ('', '');
	IPC::Run::run([ 'kcat', '-C', '-b', $kafka->bootstrap, '-t', $topic,
			'-o', 'beginning', '-e', '-q', '-f', '%T|%h\n' ],
		'<', \undef, '>', \$out, '2>', \$err, IPC::Run::timeout(30));
	my %t;
	foreach my $line (split /\n/, $out)
	{
		my ($ts, $h) = split /\|/, $line, 2;
		$t{$1} = $ts if defined $h && $h =~ /(?:^|,)id=([0-9a-f-]{36})/;
	}
	return \%t;
}

sub wait_for_ids
{
	my ($ids) = @_;
	my $deadline = time() + 30;
	my $t;
	while (1)
	{
		$t = kafka_times();
		last if !grep { !defined $t->{$_} } @$ids;
		last if time() > $deadline;
		usleep(100_000);
	}
	return $t;
}

sub median
{
	my @s = sort { $a <=> $b } @_;
	return $s[ int($#s / 2) ];
}

# latency of one transaction: Kafka timestamp of its event minus the
# moment its commit (plain or prepared) was issued, both ms since 1970
sub one_round
{
	my ($i, $prepared) = @_;
	my $emit = "SELECT outbox.emit('ledger', 'l-$i', 'ledger.posted', '{\"i\": $i}');";
	my ($id, $t0);
	if ($prepared)
	{
		$id = $node->safe_psql('postgres', "BEGIN;\n$emit\nPREPARE TRANSACTION 'g$i';");
		my $out = $node->safe_psql('postgres',
			"SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint;\nCOMMIT PREPARED 'g$i';");
		($t0) = $out =~ /^(\d+)/;
	}
	else
	{
		my $out = $node->safe_psql('postgres',
			"BEGIN;\n$emit\nSELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint;\nCOMMIT;");
		($id, $t0) = split /\n/, $out;
	}
	return ($id, $t0);
}

# let the relay settle into its idle wait first
my ($warm) = one_round(0, 0);
wait_for_ids([$warm]);
usleep(500_000);

# plain commits first, then prepared ones: a plain commit would wake the
# relay for a prepared transaction committed just before it
my (%t0, @plain, @prep);
foreach my $i (1 .. 20)
{
	my ($id, $t0) = one_round($i, 0);
	push @plain, $id;
	$t0{$id} = $t0;
	usleep(50_000);
}
foreach my $i (1 .. 20)
{
	my ($id, $t0) = one_round(100 + $i, 1);
	push @prep, $id;
	$t0{$id} = $t0;
	usleep(50_000);
}
my $t = wait_for_ids([ @plain, @prep ]);
my @lat_plain = map { defined $t->{$_} ? $t->{$_} - $t0{$_} : 99999 } @plain;
my @lat_prep = map { defined $t->{$_} ? $t->{$_} - $t0{$_} : 99999 } @prep;
my ($p50_plain, $p50_prep) = (median(@lat_plain), median(@lat_prep));
my $max_prep = (sort { $b <=> $a } @lat_prep)[0];
diag("commit to Kafka timestamp, ms: plain p50 $p50_plain; prepared p50 $p50_prep, max $max_prep");
is(scalar(grep { !defined $t->{$_} } @prep), 0, 'every prepared event reached Kafka');
cmp_ok($max_prep, '<', 1000, 'each within 1 s of COMMIT PREPARED (the poll is 10 s)');
cmp_ok($p50_prep, '<', 200, 'p50 after COMMIT PREPARED under 200 ms');

# --- the backlog counts a prepared transaction's events from COMMIT
# PREPARED on; a paused relay publishes nothing meanwhile
$node->safe_psql('postgres', 'ALTER SYSTEM SET outbox.enabled = off');
$node->safe_psql('postgres', 'SELECT pg_reload_conf()');
ok(relay_state_is($node, 'postgres', 'paused'), 'publishing paused');
is($node->safe_psql('postgres', 'SELECT backlog FROM outbox.status()'), '0',
	'nothing is pending');
$node->safe_psql('postgres', q{
BEGIN;
SELECT outbox.emit('ledger', 'l-x', 'ledger.posted', ('{"x": ' || g || '}')::jsonb) FROM generate_series(1, 3) g;
PREPARE TRANSACTION 'gx';
});
is($node->safe_psql('postgres', 'SELECT backlog FROM outbox.status()'), '0',
	'prepared, not committed: not in the backlog');
$node->safe_psql('postgres', "COMMIT PREPARED 'gx'");
is($node->safe_psql('postgres', 'SELECT backlog FROM outbox.status()'), '3',
	'after COMMIT PREPARED the backlog counts its 3 events');
ok(defined $node->safe_psql('postgres', 'SELECT oldest_pending_seconds FROM outbox.status()'),
	'and the oldest pending age is set');

# a rolled back prepared transaction counts nothing
$node->safe_psql('postgres', q{
BEGIN;
SELECT outbox.emit('ledger', 'l-y', 'ledger.posted', '{}');
PREPARE TRANSACTION 'gy';
});
$node->safe_psql('postgres', "ROLLBACK PREPARED 'gy'");
is($node->safe_psql('postgres', 'SELECT backlog FROM outbox.status()'), '3',
	'ROLLBACK PREPARED adds nothing');

$node->safe_psql('postgres', 'ALTER SYSTEM RESET outbox.enabled');
$node->safe_psql('postgres', 'SELECT pg_reload_conf()');
ok(poll_until($node, 'postgres', 'SELECT backlog FROM outbox.status()', '0', 30),
	'once resumed, the backlog drains to 0');
my $all = kafka_times();
is(scalar(keys %$all), 41 + 3, 'Kafka holds the 44 committed events, not the rolled back one');

$node->stop;
$kafka->stop;
done_testing();
