# test/t/206_monitoring_role.pl: with the grants the README gives, a
# login role that is not a superuser reads status(), its view, metrics()
# and health() of a running relay, and cannot read the events' payloads,
# the dead letters or the Kafka settings; without them it reads nothing.

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

my $kafka = OutboxTest::Broker->start(brokers => 1);
my $node = outbox_node('monitor', $kafka);
$node->safe_psql('postgres', 'CREATE EXTENSION outbox');
my ($pid) = wait_for_relay($node, 'postgres', 30);
ok(defined $pid, 'the relay runs');

my $secret_payload = 'card-4111-1111';
my $id = $node->safe_psql('postgres',
	qq{SELECT outbox.emit('payment', 'p-1', 'payment.taken', '{"card": "$secret_payload"}')});
ok(poll_until($node, 'postgres', 'SELECT published FROM outbox.status()', '1', 30),
	'one event is published');

$node->safe_psql(
	'postgres', q{
CREATE ROLE watcher LOGIN;
CREATE ROLE stranger LOGIN;
});

# run a query as a role; returns (ok, stdout, stderr)
sub as_role
{
	my ($role, $sql) = @_;
	my ($ret, $out, $err) =
	  $node->psql('postgres', $sql, extra_params => [ '-U', $role ]);
	return ($ret == 0, $out, $err);
}

my @reads = (
	[ 'status()', 'SELECT published FROM outbox.status()', '1' ],
	[ 'the view outbox.status', 'SELECT published FROM outbox.status', '1' ],
	[ 'metrics()', q{SELECT outbox.metrics() ~ 'outbox_published_total\{database="postgres"\} 1'}, 't' ],
	[ 'health()', 'SELECT status FROM outbox.health()', 'ok' ],
	[ "health(max_age => '5 min')", q{SELECT status FROM outbox.health(max_age => '5 min')}, 'ok' ],
	[ 'holds()', 'SELECT count(*) FROM outbox.holds()', '0' ],
	[ "the view's held partitions", q{SELECT held_events || coalesce(holds::text, '-') FROM outbox.status}, '0-' ],
	[ 'subscription_status()', 'SELECT count(*) FROM outbox.subscription_status()', '0' ],
	[ 'subscription_lag()', 'SELECT count(*) FROM outbox.subscription_lag()', '0' ],);

# like poll_until, as a role, against a pattern
sub poll_until_as
{
	my ($role, $sql, $re) = @_;
	my $last = '';
	foreach (1 .. 100)
	{
		my ($k, $o) = as_role($role, $sql);
		return 1 if $k && $o =~ $re;
		$last = $o;
		usleep(100_000);
	}
	note "last: $last";
	return 0;
}

# --- no grants: nothing
foreach my $r (@reads)
{
	my ($ok, $out, $err) = as_role('stranger', $r->[1]);
	ok(!$ok && $err =~ /permission denied/,
		"a role without grants cannot read $r->[0]");
}

# --- the README's grants
$node->safe_psql(
	'postgres', q{
GRANT USAGE ON SCHEMA outbox TO watcher;
GRANT EXECUTE ON FUNCTION outbox.status(), outbox.metrics(), outbox.health(interval), outbox.holds() TO watcher;
GRANT EXECUTE ON FUNCTION outbox.subscription_status(), outbox.subscription_lag() TO watcher;
GRANT SELECT ON outbox.status TO watcher;
});
foreach my $r (@reads)
{
	my ($ok, $out, $err) = as_role('watcher', $r->[1]);
	ok($ok, "the monitoring role reads $r->[0]") or diag $err;
	is($out, $r->[2], "... and sees the relay's figure");
}
my ($ok, $out, $err) = as_role('watcher', 'SELECT outbox.metrics()');
unlike($out, qr/\Q$secret_payload\E|\Q$id\E/,
	'metrics() shows no payload and no event id');

foreach my $q (
	[ 'outbox.events payloads', 'SELECT payload FROM outbox.events' ],
	[ 'outbox.events at all', 'SELECT count(*) FROM outbox.events' ],
	[ 'outbox.dead_letters', 'SELECT count(*) FROM outbox.dead_letters' ],
	[ 'outbox.held', 'SELECT count(*) FROM outbox.held' ],
	[ 'outbox.subscriptions', 'SELECT count(*) FROM outbox.subscriptions' ],
	[ 'outbox.inbox_dead_letters', 'SELECT count(*) FROM outbox.inbox_dead_letters' ],)
{
	($ok, $out, $err) = as_role('watcher', $q->[1]);
	ok(!$ok && $err =~ /permission denied for table/,
		"the monitoring role cannot read $q->[0]");
}
($ok, $out, $err) = as_role('watcher',
	q{SELECT outbox.emit('payment', 'p-2', 'payment.taken', '{}')});
ok(!$ok && $err =~ /permission denied for function emit/,
	'the monitoring role cannot emit');
($ok, $out, $err) = as_role('watcher',
	q{SELECT outbox.subscribe('w', ARRAY['t'], 'pg_catalog.pg_backend_pid()')});
ok(!$ok && $err =~ /permission denied for function subscribe/,
	'the monitoring role cannot subscribe');
($ok, $out, $err) = as_role('watcher', 'SHOW outbox.kafka_config');
ok(!$ok && $err =~ /must be superuser|permission denied|pg_read_all_settings/,
	'the monitoring role cannot read outbox.kafka_config');

# the view alone is not enough: its function is checked for the caller
$node->safe_psql('postgres',
	'REVOKE EXECUTE ON FUNCTION outbox.status() FROM watcher');
($ok, $out, $err) = as_role('watcher', 'SELECT * FROM outbox.status');
ok(!$ok && $err =~ /permission denied for function status/,
	'SELECT on the view without EXECUTE on status() is refused');
$node->safe_psql('postgres',
	'GRANT EXECUTE ON FUNCTION outbox.status() TO watcher');

# --- the relay's row in pg_stat_activity needs pg_read_all_stats
my $act = "SELECT coalesce(query, '(null)') || '|' || coalesce(wait_event_type, '(null)')"
  . " || '|' || coalesce(backend_type, '(null)') FROM pg_stat_activity WHERE pid = $pid";
($ok, $out, $err) = as_role('watcher', $act);
is($out, '<insufficient privilege>|(null)|(null)',
	'without pg_read_all_stats the relay\'s activity is hidden');
$node->safe_psql('postgres', 'GRANT pg_monitor TO watcher');
ok( poll_until_as('watcher', $act, qr/^[^<]*\|Extension\|outbox relay$/),
	'with pg_monitor the monitoring role sees the relay wait on an Extension event');

$node->stop;
done_testing();
