# test/t/005_lifecycle.pl: relays live and die with their databases and the
# server: CREATE and DROP EXTENSION, several databases, DROP DATABASE,
# restart, SIGTERM, and a streaming standby that publishes only once
# promoted.

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

my $kafka = OutboxTest::Broker->start(brokers => 3);
my $node = outbox_node('primary', $kafka, allows_streaming => 1);

sub emit
{
	my ($n, $db, $type, $agg) = @_;
	return map {
		$n->safe_psql($db,
			"SELECT outbox.emit('$type', '$agg', '$type.noted', '{\"db\": \"$db\", \"n\": $_}')"
		)
	} 1 .. 3;
}

sub topic_ids
{
	my ($topic) = @_;
	return [ sort keys %{ event_ids_of(read_topic($kafka, $topic) // []) } ];
}

# --- CREATE EXTENSION starts the database's relay at once
$node->safe_psql('postgres', 'CREATE DATABASE db1');
$node->safe_psql('postgres', 'CREATE DATABASE db2');
is(scalar(relay_pids($node)), 0, 'no relay runs while no database has the extension');

$node->safe_psql('db1', 'CREATE EXTENSION outbox');
my ($pid1, $waited) = wait_for_relay($node, 'db1', 10);
ok(defined $pid1, 'CREATE EXTENSION starts a relay for its database');
cmp_ok($waited, '<=', 1.0, sprintf('within a second (%.2f s)', $waited));

# --- DROP EXTENSION stops it; creating it again brings it back
$node->safe_psql('db1', 'DROP EXTENSION outbox');
my ($gone, $took) = wait_for_no_relay($node, 'db1', 10);
ok($gone, sprintf('DROP EXTENSION stops the relay (%.2f s)', $took));
cmp_ok($took, '<=', 5, 'within a few seconds');
my $offset = -s $node->logfile;
$node->safe_psql('db1', 'CREATE EXTENSION outbox');
($pid1) = wait_for_relay($node, 'db1', 10);
ok(defined $pid1, 'CREATE EXTENSION after DROP EXTENSION starts a relay again');

# dropping and creating in quick succession must not lose the new relay
$node->safe_psql('db1', 'DROP EXTENSION outbox; CREATE EXTENSION outbox');
usleep(1_500_000);
my ($again) = wait_for_relay($node, 'db1', 10);
ok(defined $again,
	'DROP EXTENSION immediately followed by CREATE EXTENSION leaves a relay running');
$pid1 = $again;

# a paused relay leaves on DROP EXTENSION too, and CREATE EXTENSION brings
# one back that stays paused until publishing is enabled again
$node->safe_psql('postgres', 'ALTER SYSTEM SET outbox.enabled = off');
$node->safe_psql('postgres', 'SELECT pg_reload_conf()');
ok(relay_state_is($node, 'db1', 'paused'), 'with outbox.enabled = off the relay is paused');
$node->safe_psql('db1', 'DROP EXTENSION outbox');
($gone, $took) = wait_for_no_relay($node, 'db1', 10);
ok($gone, sprintf('DROP EXTENSION stops a paused relay as well (%.2f s)', $took));
$node->safe_psql('db1', 'CREATE EXTENSION outbox');
ok(relay_state_is($node, 'db1', 'paused'),
	'CREATE EXTENSION while paused starts a relay that stays paused');

# DROP EXTENSION would delete an event the paused relay has not published:
# refused, with the way to force it
my ($waiting) = $node->safe_psql('db1',
	"SELECT outbox.emit('gamma', 'g-1', 'gamma.noted', '{}')");
{
	my ($ret, $out, $err) = $node->psql('db1', 'DROP EXTENSION outbox',
		extra_params => [ '-v', 'VERBOSITY=verbose' ]);
	isnt($ret, 0, 'DROP EXTENSION is refused while an event waits for the paused relay');
	like($err,
		qr/ERROR:  55006: cannot drop extension outbox while 1 committed event is not delivered to Kafka/,
		'with 55006 and how many events wait');
	like($err, qr/HINT:  .*SET outbox\.allow_drop_undelivered = on to drop them on purpose/,
		'the hint names the setting that drops them on purpose');
}
$node->safe_psql('postgres', 'ALTER SYSTEM RESET outbox.enabled');
$node->safe_psql('postgres', 'SELECT pg_reload_conf()');
ok(relay_state_is($node, 'db1', 'running'), 'and runs again once publishing is enabled');
$pid1 = relay_pid($node, 'db1');
wait_for_events($kafka, 'outbox.event.gamma', [$waiting]);
ok( $node->poll_query_until(
		'db1', q{
SELECT count(*) = 0 FROM outbox.events e, outbox.relay_progress p
 WHERE p.relay = 'default' AND NOT pg_visible_in_snapshot(e.txid, p.prev_snapshot)}),
	'the relay records the event delivered');
is($node->psql('db1', 'BEGIN; DROP EXTENSION outbox; ROLLBACK'),
	0, 'once it is delivered, DROP EXTENSION goes through');

# --- two databases, two relays, each publishing its own events
$node->safe_psql('db2', 'CREATE EXTENSION outbox');
my ($pid2) = wait_for_relay($node, 'db2', 10);
ok(defined $pid2 && $pid2 != $pid1, 'the second database gets a relay of its own');
my @ev1 = emit($node, 'db1', 'alpha', 'a-1');
my @ev2 = emit($node, 'db2', 'beta', 'b-1');
wait_for_events($kafka, 'outbox.event.alpha', \@ev1);
wait_for_events($kafka, 'outbox.event.beta', \@ev2);
is_deeply(topic_ids('outbox.event.alpha'), [ sort @ev1 ],
	'db1\'s events are published, and only them, to its topic');
is_deeply(topic_ids('outbox.event.beta'), [ sort @ev2 ],
	'db2\'s events are published, and only them, to its topic');

# --- DROP DATABASE does not have to wait for the user to stop the relay
my $t0 = time();
my $drop_offset = -s $node->logfile;
my ($ret, $out, $err) =
  $node->psql('postgres', 'DROP DATABASE db2');
is($ret, 0, 'DROP DATABASE of a database with a running relay succeeds')
  or diag $err;
cmp_ok(time() - $t0, '<', 5, 'without waiting out the 5 s other sessions get');
ok(!grep({ $_ == $pid2 } relay_pids($node)), 'its relay is gone');

# --- SIGTERM: the relay stops cleanly and the launcher starts a new one
$offset = -s $node->logfile;
is($node->safe_psql('postgres', "SELECT pg_terminate_backend($pid1)"),
	't', 'the relay can be sent SIGTERM with pg_terminate_backend()');
ok(defined wait_for_log_match($node, qr/outbox relay for database "db1" stopped/, $offset, 15),
	'on SIGTERM the relay logs that it stopped');
my ($pid1b) = wait_for_relay($node, 'db1', 10, $pid1);
ok(defined $pid1b, 'the launcher starts a new relay for db1');
my $log = slurp_file($node->logfile, $offset);
unlike($log, qr/terminating any other active server processes|exited with exit code [^01]|terminated by signal/,
	'stopping a relay does not make the server restart');
my @ev4 = emit($node, 'db1', 'alpha', 'a-2');
wait_for_events($kafka, 'outbox.event.alpha', [ @ev1, @ev4 ]);
pass('the new relay publishes db1\'s events');

# --- nothing tries to start a relay for the dropped database once the
# launcher's hold on it (10 s) is over
$node->safe_psql('postgres', 'CREATE DATABASE db3');
$node->safe_psql('db3', 'CREATE EXTENSION outbox');
ok(defined((wait_for_relay($node, 'db3', 10))[0]), 'a third database gets a relay');
usleep(1_000_000 * ($t0 + 12 - time())) if time() < $t0 + 12;
unlike(
	slurp_file($node->logfile, $drop_offset),
	qr/outbox relay started for database "db2"|FATAL:  database \d+ does not exist/,
	'no relay is started for the dropped database afterwards');

# --- a restart finds every database with the extension
$node->restart;
my ($r1) = wait_for_relay($node, 'db1', 10);
my ($r3) = wait_for_relay($node, 'db3', 10);
ok(defined $r1 && defined $r3,
	'after a restart, both databases with the extension have a relay');
usleep(500_000);
is( $node->safe_psql(
		'postgres',
		"SELECT string_agg(datname, ',' ORDER BY datname) FROM pg_stat_activity WHERE backend_type = 'outbox relay'"
	),
	'db1,db3',
	'and no other database has one');
my @ev3 = emit($node, 'db3', 'gamma', 'g-1');
wait_for_events($kafka, 'outbox.event.gamma', \@ev3);
pass('db3\'s relay publishes after the restart');

# --- a streaming standby runs no relay, and publishes once promoted
$node->backup('base');
my $standby = PostgreSQL::Test::Cluster->new('standby');
$standby->init_from_backup($node, 'base', has_streaming => 1);
$standby->start;
$node->wait_for_catchup($standby, 'replay');
ok($standby->safe_psql('postgres', 'SELECT pg_is_in_recovery()') eq 't',
	'the standby is in recovery');
usleep(1_500_000);
is( $standby->safe_psql('postgres',
		"SELECT count(*) FROM pg_stat_activity WHERE backend_type IN ('outbox relay', 'outbox launcher')"),
	'0',
	'a standby runs neither launcher nor relay');
{
	my ($ret, $out, $err) = $standby->psql('db1',
		"SELECT outbox.emit('order', 'x', 'order.confirmed', '{}')",
		extra_params => [ '-v', 'VERBOSITY=verbose' ]);
	isnt($ret, 0, 'emit() fails on a standby');
	like($err, qr/ERROR:  25006: cannot execute outbox\.emit\(\) in a read-only transaction/,
		'with the standard read-only error');
}

# events the primary commits but, paused, does not publish
$node->safe_psql('postgres', 'ALTER SYSTEM SET outbox.enabled = off');
$node->safe_psql('postgres', 'SELECT pg_reload_conf()');
ok(relay_state_is($node, 'db1', 'paused'),
	'the primary\'s relay is paused');
my @unsent = emit($node, 'db1', 'alpha', 'a-3');
$node->wait_for_catchup($standby, 'replay');
usleep(500_000);
my $ids = { map { $_ => 1 } @{ topic_ids('outbox.event.alpha') } };
is(scalar(grep { $ids->{$_} } @unsent), 0,
	'the paused primary did not publish its last events');
$node->stop;

$standby->append_conf('postgresql.conf', 'outbox.enabled = on');
$standby->promote;
my ($spid) = wait_for_relay($standby, 'db1', 30);
ok(defined $spid, 'the promoted standby starts a relay for db1');
my $msgs = wait_for_events($kafka, 'outbox.event.alpha', [ @ev1, @ev4, @unsent ]);
my $seen = event_ids_of($msgs);
is(scalar(grep { $seen->{$_} } @unsent),
	3, 'the promoted standby publishes the events the old primary had not');
is(scalar(grep { $seen->{$_} > 1 } @ev1, @ev4),
	0, 'and does not publish again what the old primary had');

$standby->stop;
done_testing();
