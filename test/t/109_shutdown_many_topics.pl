# test/t/109_shutdown_many_topics.pl: with the brokers down, a page of
# 2,000 events over 2,000 distinct topics does not hold shutdown hostage.
# Each new topic used to cost a blocking metadata call of up to 1 s with no
# look at signals in between: over half an hour deaf to SIGTERM.  Now DROP
# DATABASE (which stops the database's relay at once) and a fast server
# stop complete within outbox.shutdown_timeout + 2 s: the relay leaves its
# loop by the timeout, then librdkafka's teardown takes its share (about
# 0.1 s on librdkafka 2.0; on Debian 13's 2.8 with the brokers down, up to
# 1.1 s on a loaded machine).

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

my $topics = 2000;
my $shutdown_timeout = 1;              # seconds
my $budget = $shutdown_timeout + 2;    # seconds

my $kafka = OutboxTest::Broker->start(brokers => 3);
my $node = outbox_node('manytopics', $kafka,
	conf => "outbox.shutdown_timeout = '${shutdown_timeout}s'\n");
$node->safe_psql('postgres', 'CREATE DATABASE shop');
foreach my $db ('postgres', 'shop')
{
	$node->safe_psql($db, 'CREATE EXTENSION outbox');
	ok(defined wait_for_relay($node, $db, 30), "the relay of $db runs");
}

$kafka->command('down all');

# One transaction of $topics events, each to its own topic; then wait
# until the relay holds them as its page, and a little longer, so that it
# is busy with them (sending, or waiting for acknowledgements).
sub stuck_page
{
	my ($db) = @_;
	$node->safe_psql($db,
		"SELECT count(outbox.emit('spread', i::text, 'spread.made', '{}',"
		  . " topic => 'spread.$db.' || i)) FROM generate_series(1, $topics) i");
	ok( poll_until(
			$node, $db, 'SELECT page_size FROM outbox.status()', $topics, 30),
		"$db: the relay has read the page of $topics events for $topics topics");
	usleep(1_500_000);
	$node->safe_psql('postgres', 'CHECKPOINT');
}

# --- DROP DATABASE stops the relay at once
stuck_page('shop');
my $t0 = time();
my ($rc, $out, $err) = $node->psql('postgres', 'DROP DATABASE shop');
my $took = time() - $t0;
is($rc, 0, 'DROP DATABASE succeeds while the brokers are down')
  or diag($err);
cmp_ok($took, '<', $budget,
	sprintf('DROP DATABASE takes %.2f s: less than outbox.shutdown_timeout + 2 s', $took));

# Stops the server fast; returns (pg_ctl's status, seconds taken).
sub timed_stop
{
	my $t0 = time();
	my $rc = PostgreSQL::Test::Utils::system_log('pg_ctl', '-D', $node->data_dir,
		'-m', 'fast', '-t', '30', 'stop');
	my $took = time() - $t0;

	if ($rc == 0)
	{
		$node->_update_pid(0);
	}
	else
	{
		$node->stop('immediate');
	}
	return ($rc, $took);
}

# --- a fast stop of the server
stuck_page('postgres');
($rc, $took) = timed_stop();
is($rc, 0, 'pg_ctl stop -m fast succeeds while the brokers are down');
cmp_ok($took, '<', $budget,
	sprintf('the fast stop takes %.2f s: less than outbox.shutdown_timeout + 2 s', $took));

# --- slow brokers: each metadata answer takes 200 ms and arrives; the
# page of 2,000 topics, unrecorded, is sent again after the restart
$kafka->command('up all');
$kafka->command('rtt all 200');
$node->start;
ok(defined wait_for_relay($node, 'postgres', 30), 'the relay runs again');
ok( poll_until(
		$node, 'postgres', 'SELECT page_size FROM outbox.status()', $topics, 30),
	'it has read the page again');
usleep(1_500_000);
$node->safe_psql('postgres', 'CHECKPOINT');
($rc, $took) = timed_stop();
is($rc, 0, 'pg_ctl stop -m fast succeeds while the brokers are slow');
cmp_ok($took, '<', $budget,
	sprintf('the fast stop takes %.2f s: less than outbox.shutdown_timeout + 2 s', $took));

done_testing();
