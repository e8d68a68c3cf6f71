# test/t/117_backpressure.pl: outbox.max_backlog and outbox.max_backlog_age.
# With publishing paused the backlog grows; once it reaches the limit,
# emit() (and emit_binary(), emit_tombstone(), capture()) refuses with
# 53400, naming the limit and the backlog, and the log says refusing
# started; metrics() and health() show the limits, the headroom and the
# refusals.  Publishing resumed, the relay drains, says refusing ended, and
# emit() accepts again.  The age limit does the same by the oldest
# event's age.  A relay restarted with a backlog counts it before it reads.
# No session sets either limit (sighup).

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use FindBin;
use lib "$FindBin::RealBin/../perl";
use OutboxTest;

my $topic = 'outbox.event.order';
my $kafka = OutboxTest::Broker->start(brokers => 1);
my $node = outbox_node('backpressure', $kafka, conf => "outbox.max_backlog = 20\n");
$node->safe_psql('postgres', 'CREATE EXTENSION outbox');
ok(defined wait_for_relay($node, 'postgres', 30), 'the relay runs');

sub emit
{
	my ($fn) = @_;
	$fn //= q{outbox.emit('order', 'o1', 'order.placed', '{}')};
	return $node->psql('postgres', "SELECT $fn", extra_params => [ '-v', 'VERBOSITY=verbose' ]);
}

sub metric
{
	my ($name) = @_;
	my $m = $node->safe_psql('postgres', 'SELECT outbox.metrics()');
	return $m =~ /^\Q$name\E\{[^}]*\} (\S+)$/m ? $1 : undef;
}

sub set_conf
{
	my ($sql) = @_;
	$node->safe_psql('postgres', "$sql; SELECT pg_reload_conf()");
	sleep 1;
}

# --- under the limit nothing changes
my @ok = map { (emit())[1] } 1 .. 5;
ok(defined wait_for_events($kafka, $topic, \@ok), 'under the limit, events are emitted and published');
is(metric('outbox_backlog_limit_events'), '20', 'metrics() shows the limit');
is(metric('outbox_emit_refused_total'), '0', 'and no refusal');

# --- paused, the backlog fills to the limit
set_conf('ALTER SYSTEM SET outbox.enabled = off');
ok(relay_state_is($node, 'postgres', 'paused'), 'publishing paused');
my $accepted = 0;
$accepted++ for grep { $_ == 0 } map { (emit())[0] } 1 .. 20;
is($accepted, 20, 'twenty events are accepted while the backlog is under 20');
is(metric('outbox_backlog_headroom_events'), '0', 'metrics() shows no headroom left');
my $log_at = -s $node->logfile;
my ($ret, $out, $err) = emit();
isnt($ret, 0, 'the next emit() is refused');
like($err, qr/ERROR:  53400: outbox backlog is 20 events, at outbox.max_backlog \(20\)/,
	'with 53400, naming the backlog and the limit');
like($err, qr/HINT:  Retry later\. outbox\.status\(\) says why/, 'and a hint');
($ret, $out, $err) = emit(q{outbox.emit_binary('order', 'o1', 'order.placed', '\x01')});
like($err, qr/53400/, 'emit_binary() is refused too');
($ret, $out, $err) = emit(q{outbox.emit_tombstone('order', 'o1', 'order.deleted')});
like($err, qr/53400/, 'and emit_tombstone()');
$node->safe_psql('postgres', q{
CREATE TABLE orders (id int PRIMARY KEY);
CREATE TRIGGER orders_outbox AFTER INSERT ON orders
	FOR EACH ROW EXECUTE FUNCTION outbox.capture('order', 'id')});
($ret, $out, $err) = $node->psql('postgres', 'INSERT INTO orders VALUES (1)');
like($err, qr/outbox backlog is 20 events/, "and a capture() trigger's insert");
is($node->safe_psql('postgres', 'SELECT count(*) FROM orders'), '0', 'which rolls back');
ok(defined wait_for_log_match($node, qr/outbox: emit\(\) refuses events: the backlog is 20 events/, $log_at, 10),
	'the log says refusing started');
my $log = slurp_file($node->logfile, $log_at);
my $starts = () = $log =~ /emit\(\) refuses events:/g;
is($starts, 1, 'once, not per refusal');
cmp_ok(metric('outbox_emit_refused_total'), '>=', 4, 'metrics() counts the refusals');
is(metric('outbox_emit_refusing'), '1', 'and says emit() refuses');
like($node->safe_psql('postgres', q{SELECT status || ': ' || reason FROM outbox.health()}),
	qr/^critical: emit\(\) refuses new events: the backlog is 20 events \(outbox.max_backlog 20\)/,
	'health() is critical and says why');

# --- a restart during the outage does not forget the backlog
$node->restart;
ok(relay_state_is($node, 'postgres', 'paused'), 'restarted, still paused');
($ret, $out, $err) = emit();
like($err, qr/outbox backlog is 20 events, at outbox.max_backlog \(20\)/,
	'the restarted relay counted the backlog before reading: emit() is still refused');

# --- resumed, the relay drains and emit() accepts again
$log_at = -s $node->logfile;
set_conf('ALTER SYSTEM SET outbox.enabled = on');
ok(defined wait_for_log_match($node, qr/outbox: emit\(\) accepts events again/, $log_at, 30),
	'publishing resumed, the relay says refusing ended');
($ret, $out, $err) = emit();
is($ret, 0, 'emit() accepts again') or diag($err);
is(metric('outbox_emit_refusing'), '0', 'metrics() says so');
unlike($node->safe_psql('postgres', 'SELECT status FROM outbox.health()'), qr/critical/,
	'health() is no longer critical');

# --- the age limit
set_conf('ALTER SYSTEM SET outbox.max_backlog = 0; ALTER SYSTEM SET outbox.max_backlog_age = 2; '
	  . 'ALTER SYSTEM SET outbox.enabled = off');
ok(relay_state_is($node, 'postgres', 'paused'), 'paused again, with an age limit of 2 s');
($ret) = emit();
is($ret, 0, 'an event is accepted while nothing waits');
sleep 3;
($ret, $out, $err) = emit();
like($err, qr/ERROR:  53400: oldest unpublished outbox event is \d+ s old, at outbox.max_backlog_age \(2 s\)/,
	'once the oldest waits 2 s, emit() is refused (53400), naming the age and the limit');
set_conf('ALTER SYSTEM SET outbox.enabled = on');
ok(poll_until($node, 'postgres', 'SELECT status FROM outbox.health()', 'ok', 30),
	'resumed, the backlog drains');
($ret, $out, $err) = emit();
is($ret, 0, 'and emit() accepts again') or diag($err);

# --- no session lifts the limits: they are postgresql.conf's
$node->safe_psql('postgres', q{
CREATE ROLE writer LOGIN;
GRANT USAGE ON SCHEMA outbox TO writer;
GRANT EXECUTE ON FUNCTION outbox.emit(text, text, text, jsonb, jsonb, text, text, uuid, integer, timestamptz) TO writer});
($ret, $out, $err) = $node->psql('postgres', 'SET outbox.max_backlog = 0', extra_params => [ '-U', 'writer' ]);
like($err, qr/parameter "outbox.max_backlog" cannot be changed now/, 'a writer cannot lift the limit');
($ret, $out, $err) = $node->psql('postgres', 'SET outbox.max_backlog_age = 0', extra_params => [ '-U', 'writer' ]);
like($err, qr/parameter "outbox.max_backlog_age" cannot be changed now/, 'nor the age limit');
($ret, $out, $err) = $node->psql('postgres', 'SET outbox.max_backlog = 0');
like($err, qr/cannot be changed now/, 'nor a superuser session');

$node->stop;
done_testing();
