# test/t/014_inbox.pl: consume_once() is true the first time a consumer
# sees an event and false afterwards, whichever session asks; a consumer
# transaction that rolls back consumed nothing.  The idle relay deletes the
# inbox rows older than outbox.inbox_retention and keeps the newer ones; an
# event it forgot is consumed again.  A 1.2 database, which has no inbox,
# keeps its relay.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use FindBin;
use lib "$FindBin::RealBin/../perl";
use OutboxTest;

my $kafka = OutboxTest::Broker->start(brokers => 1);
my $node = outbox_node('inbox', $kafka, conf => "outbox.inbox_retention = '1h'");
$node->safe_psql('postgres', 'CREATE EXTENSION outbox');
$node->safe_psql('postgres', 'CREATE DATABASE old');
$node->safe_psql('old', "CREATE EXTENSION outbox VERSION '1.2'");
ok(defined wait_for_relay($node, 'postgres', 10), 'the relay runs');
ok(defined wait_for_relay($node, 'old', 10), 'a 1.2 database has a relay');

my @old = map { sprintf('f0000000-0000-7000-8000-%012d', $_) } 1 .. 3;
my @young = map { sprintf('f0000000-0000-7000-8000-%012d', $_) } 4 .. 5;

sub consume
{
	my ($consumer, $event_id) = @_;
	return $node->safe_psql('postgres',
		"SELECT outbox.consume_once('$consumer', '$event_id')");
}

# each safe_psql is a session of its own
is(join(',', map { consume('billing', $_) } @old, @young), 't,t,t,t,t',
	'a first session consumes five events');
is(join(',', map { consume('billing', $_) } @old, @young), 'f,f,f,f,f',
	'a second session gets false for each of them');
is(consume('shipping', $old[0]), 't', 'another consumer of the same event gets true');

# the consumer's business change and the dedupe commit or roll back together
$node->safe_psql('postgres', 'CREATE TABLE ledger (event_id uuid PRIMARY KEY)');
my $apply = qq{
DO \$\$
BEGIN
	IF outbox.consume_once('ledger', '$old[0]') THEN
		INSERT INTO ledger VALUES ('$old[0]');
	END IF;
END
\$\$;
};
$node->safe_psql('postgres', "BEGIN; $apply ROLLBACK;");
is($node->safe_psql('postgres', 'SELECT count(*) FROM outbox.inbox WHERE consumer = \'ledger\''),
	'0', 'a rolled-back consumer transaction leaves no inbox row');
$node->safe_psql('postgres', $apply) for 1 .. 3;
is($node->safe_psql('postgres', 'SELECT count(*) FROM ledger'), '1',
	'applied three times in three sessions, the event changed the ledger once');

# the fixture: three events consumed two hours ago, two half an hour ago
$node->safe_psql('postgres',
	"UPDATE outbox.inbox SET consumed_at = now() - interval '2 hours'"
	  . " WHERE consumer = 'billing' AND event_id IN ('" . join("','", @old) . "')");
$node->safe_psql('postgres',
	"UPDATE outbox.inbox SET consumed_at = now() - interval '30 minutes'"
	  . " WHERE consumer = 'billing' AND event_id IN ('" . join("','", @young) . "')");

# the relay cleans up when idle, first right after it starts
$node->restart;
ok(defined wait_for_relay($node, 'postgres', 30), 'the relay runs after a restart');
ok( poll_until(
		$node, 'postgres',
		"SELECT count(*) FROM outbox.inbox WHERE consumed_at < now() - interval '1 hour'",
		'0', 30),
	'the idle relay deleted the inbox rows older than outbox.inbox_retention');
is( $node->safe_psql('postgres',
		"SELECT string_agg(consumer || ' ' || event_id, ',' ORDER BY consumer, event_id)"
		  . " FROM outbox.inbox"),
	join(',', map { "billing $_" } @young) . ",ledger $old[0],shipping $old[0]",
	'it kept the newer ones');
is(join(',', map { consume('billing', $_) } @old, @young), 't,t,t,f,f',
	'a forgotten event is consumed again; a remembered one is not');

# by now both relays have been idle once since the restart
my $old_pid = wait_for_relay($node, 'old', 30);
ok(defined $old_pid, 'the 1.2 database has a relay after the restart');
sleep 2;
is(relay_pid($node, 'old'), $old_pid, 'the same relay still runs there');
unlike(slurp_file($node->logfile), qr/"outbox\.inbox" does not exist|inbox rows|clean up the inbox/,
	'no relay failed on the inbox');

done_testing();
