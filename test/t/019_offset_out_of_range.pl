# test/t/019_offset_out_of_range.pl: a partition whose log does not hold
# the consumer group's next offset is stopped, never taken as applied.
#   - outbox.kafka_brokers pointed at a rebuilt cluster (the same topic,
#     offsets starting over, as after a re-created topic or on a
#     disaster-recovery cluster): the stored next offset (10) lies above
#     the new log's end (5).  Nothing is applied nor counted as
#     deduplicated; subscription_status() and the log say why and how to
#     resume; outbox.subscription_seek() to 0 applies the 5 messages once
#     each.  A seek back applies messages again; one that commits while a
#     batch waits for the partition's row makes that batch give way.
#   - messages deleted before they were applied (the test broker keeps
#     5 MB per partition): the worker, waiting to try a failing message
#     again, finds its position below the log's start when it fetches,
#     stops the partition, and a seek to the log's start resumes it.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run qw(run);

use FindBin;
use lib "$FindBin::RealBin/../perl";
use OutboxTest;

my $kafka = OutboxTest::Broker->start(brokers => 1);
$kafka->command('create gone 1');
my $node = outbox_node('offset_range', $kafka,
	conf => "outbox.retry_backoff_min = '4s'\noutbox.retry_backoff_max = '4s'");
$node->safe_psql(
	'postgres', q{
CREATE EXTENSION outbox;
CREATE TABLE applied (n bigserial PRIMARY KEY, topic text, off bigint, payload jsonb);
CREATE FUNCTION apply(m outbox.inbound_message) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
	IF (m.payload->>'poison')::boolean THEN
		RAISE EXCEPTION 'poison at offset %', m.kafka_offset;
	END IF;
	INSERT INTO public.applied (topic, off, payload) VALUES (m.topic, m.kafka_offset, m.payload - 'pad');
END $$;
CREATE ROLE app LOGIN;
GRANT USAGE ON SCHEMA outbox TO app;
GRANT EXECUTE ON FUNCTION outbox.subscribe(text, text[], regprocedure, text, text, integer, text, integer),
	outbox.subscription_status(), outbox.subscription_lag() TO app;
GRANT ALL ON applied, applied_n_seq TO app;
SET ROLE app;
SELECT outbox.subscribe('gone', ARRAY['gone'], 'public.apply(outbox.inbound_message)');
});

# one message per value, to partition 0 of topic
sub produce
{
	my ($broker, $topic, @values) = @_;
	my $input = join("\n", @values) . "\n";
	run([ 'kcat', '-P', '-b', $broker->bootstrap, '-t', $topic, '-p', '0' ], '<', \$input)
	  or die 'kcat failed';
	return;
}

sub status_of
{
	my ($name, $columns) = @_;
	return $node->safe_psql('postgres',
		"SELECT $columns FROM outbox.subscription_status() WHERE name = '$name'");
}

# 1. a rebuilt cluster
produce($kafka, 'gone', map { qq({"first": $_}) } 1 .. 10);
ok(poll_until($node, 'postgres', "SELECT count(*) FROM applied WHERE payload ? 'first'", '10', 60),
	'the 10 messages of the first cluster are applied');
ok(poll_until($node, 'postgres',
	"SELECT next_offset FROM outbox.inbox_offsets WHERE consumer_group = 'gone'", '10', 10),
	'the group stored next offset 10');

$kafka->stop;
my $rebuilt = OutboxTest::Broker->start(brokers => 1);
$rebuilt->command('create gone 1');
produce($rebuilt, 'gone', map { qq({"again": $_}) } 1 .. 5);
$node->safe_psql('postgres',
	"ALTER SYSTEM SET outbox.kafka_brokers = '" . $rebuilt->bootstrap . "'");
$node->safe_psql('postgres', 'SELECT pg_reload_conf()');

ok(poll_until($node, 'postgres',
	"SELECT state FROM outbox.subscription_status() WHERE name = 'gone'", 'partition stopped', 60),
	'on the rebuilt cluster the subscription says a partition is stopped');
like(status_of('gone', 'last_error'),
	qr/^partition 0 of topic "gone" is stopped: the next offset 10 is outside its log \(its log ends at 5\); resume with outbox.subscription_seek\(\)$/,
	'its last error names the partition, the stored offset and the log\'s end');
sleep 2;
is($node->safe_psql('postgres', "SELECT count(*) FROM applied WHERE payload ? 'again'"), '0',
	'nothing of the new log is applied');
is(status_of('gone', 'deduplicated'), '0', 'nor counted as deduplicated');
is($node->safe_psql('postgres',
	"SELECT next_offset, high_watermark IS NULL, lag IS NULL FROM outbox.subscription_lag() WHERE subscription = 'gone'"),
	'10|t|t', 'subscription_lag() shows no lag for the stopped partition, not 0');
is($node->safe_psql('postgres',
	"SELECT next_offset FROM outbox.inbox_offsets WHERE consumer_group = 'gone'"),
	'10', 'the stored offset is left as it was');
like($node->safe_psql('postgres', 'SELECT status, reason FROM outbox.health()'),
	qr/^critical\|subscription "gone" has a partition stopped: its log does not hold the group's next offset/,
	'health() is critical and says why');
my $log = slurp_file($node->logfile);
my @warnings = $log =~ /WARNING:  outbox subscription "gone" stopped partition 0 of topic "gone": its next offset 10 is outside the partition's log\n/g;
is(scalar @warnings, 1, 'the log says so once, as a WARNING');
like($log,
	qr/DETAIL:  The consumer group's next offset is 10, but the partition's log starts at 0 and ends at 5: it is not the log the offset was stored for/,
	'with the offsets in its detail');
like($log, qr/HINT:  .*call outbox.subscription_seek\('gone', 'gone', 0, N\)/,
	'and the way to resume in its hint');

# the new log grows past the stored offset, and the worker starts again:
# the partition stays stopped (it is still not the group's log)
produce($rebuilt, 'gone', map { qq({"grown": $_}) } 1 .. 8);
is($node->safe_psql('postgres', "SELECT stopped_at IS NOT NULL FROM outbox.inbox_offsets WHERE consumer_group = 'gone'"),
	't', 'the stop is recorded with the offsets');
$node->safe_psql('postgres', "UPDATE outbox.subscriptions SET batch_size = batch_size + 1 WHERE name = 'gone'");
sleep 3;
ok(poll_until($node, 'postgres',
	"SELECT state FROM outbox.subscription_status() WHERE name = 'gone' AND pid IS NOT NULL", 'partition stopped', 60),
	'after the log grew past the stored offset and the worker started again, the partition is still stopped');
sleep 2;
is($node->safe_psql('postgres', "SELECT count(*) FROM applied WHERE payload ? 'again' OR payload ? 'grown'"), '0',
	'and nothing of the new log is applied');

# resuming on purpose: the owner moves the group's offset
$node->safe_psql('postgres',
	'GRANT EXECUTE ON FUNCTION outbox.subscription_seek(text, text, integer, bigint) TO app');
$node->safe_psql('postgres', "SET ROLE app; SELECT outbox.subscription_seek('gone', 'gone', 0, 0)");
ok(poll_until($node, 'postgres',
	"SELECT string_agg(payload->>'again', ',' ORDER BY n) FROM applied WHERE payload ? 'again'", '1,2,3,4,5', 30),
	'after subscription_seek() to 0 the 5 messages of the new log are applied, in order');
ok(poll_until($node, 'postgres',
	"SELECT state FROM outbox.subscription_status() WHERE name = 'gone'", 'running', 30),
	'the subscription runs again');
unlike($node->safe_psql('postgres', 'SELECT status, reason FROM outbox.health()'),
	qr/subscription/, 'health() no longer speaks of it');
is($node->safe_psql('postgres',
	"SELECT next_offset FROM outbox.inbox_offsets WHERE consumer_group = 'gone'"),
	'13', 'its next offset is the new log\'s end (5 messages, then the 8 it grew by)');
sleep 1;
is($node->safe_psql('postgres', "SELECT count(*) FROM applied WHERE payload ? 'again'"), '5',
	'each once');
# a seek back on a running partition applies again on purpose (these
# messages have no id to deduplicate them)
$node->safe_psql('postgres', "SET ROLE app; SELECT outbox.subscription_seek('gone', 'gone', 0, 3)");
ok(poll_until($node, 'postgres',
	"SELECT string_agg(payload->>'again', ',' ORDER BY n) FROM applied WHERE payload ? 'again'", '1,2,3,4,5,4,5', 30),
	'a seek back to 3 applies offsets 3 and 4 again');

# a seek back that commits while a batch waits for the partition's row:
# the batch, whose position is past the new offset, applies nothing, and
# the worker starts again from there
my $seeker = $node->background_psql('postgres');
$seeker->query_safe('BEGIN');
$seeker->query_safe("SET LOCAL ROLE app; SELECT outbox.subscription_seek('gone', 'gone', 0, 4)");
produce($rebuilt, 'gone', '{"again": 6}');
ok(poll_until($node, 'postgres',
	"SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'outbox subscription' AND wait_event_type = 'Lock'", '1', 30),
	'a batch waits for the row the seek holds');
$seeker->query_safe('COMMIT');
$seeker->quit;
ok(poll_until($node, 'postgres',
	"SELECT string_agg(payload->>'again', ',' ORDER BY n) FROM applied WHERE payload ? 'again'", '1,2,3,4,5,4,5,5,6', 30),
	'the worker starts again from the sought offset 4: nothing between it and the batch is skipped');
like(slurp_file($node->logfile),
	qr/ERROR:  outbox subscription "gone": the next offset of partition 0 of topic "gone" was moved back from 13 to 4/,
	'the waiting batch gave way with an error');

# 2. messages deleted before they were applied: a message fails, and while
# its partition waits to try it again 7 MB more push it out of the log
$rebuilt->command('create lost 1');
$node->safe_psql('postgres', q{SET ROLE app;
SELECT outbox.subscribe('lost', ARRAY['lost'], 'public.apply(outbox.inbound_message)', max_attempts => 1000)});
ok(poll_until($node, 'postgres', "SELECT count(*) FROM outbox.subscription_lag() WHERE subscription = 'lost'", '1', 30),
	'the second subscription has its partition');
produce($rebuilt, 'lost', '{"poison": true}');
ok(poll_until($node, 'postgres', "SELECT failed > 0 FROM outbox.subscription_status() WHERE name = 'lost'", 't', 30),
	'its first message fails');
my $pad = 'x' x 100_000;
produce($rebuilt, 'lost', map { qq({"later": $_, "pad": "$pad"}) } 1 .. 70);
ok(poll_until($node, 'postgres',
	"SELECT state FROM outbox.subscription_status() WHERE name = 'lost'", 'partition stopped', 60),
	'the partition is stopped when its position is found below the log\'s start');
my $error = status_of('lost', 'last_error');
my ($start) = $error =~ /^partition 0 of topic "lost" is stopped: the next offset 0 is outside its log \(its log starts at (\d+)\)/;
ok(defined $start && $start > 0, "its last error names where the log starts now ($error)");
$start //= 1;
like(slurp_file($node->logfile),
	qr/DETAIL:  The consumer group's next offset is 0, but the partition's log starts at $start and ends at 71: the messages from 0 to @{[$start - 1]} were deleted before they were applied\./,
	'the log names the messages deleted before they were applied');
is($node->safe_psql('postgres', "SELECT count(*) FROM applied WHERE topic = 'lost'"), '0',
	'nothing after them was applied');

$node->safe_psql('postgres', "SET ROLE app; SELECT outbox.subscription_seek('lost', 'lost', 0, $start)");
ok(poll_until($node, 'postgres', "SELECT count(*), min(off), max(off) FROM applied WHERE topic = 'lost'",
	(71 - $start) . "|$start|70", 30),
	'a seek to the log\'s start applies what the log holds');
ok(poll_until($node, 'postgres',
	"SELECT string_agg(state, ',' ORDER BY name) FROM outbox.subscription_status()", 'running,running', 30),
	'both subscriptions run');

done_testing();
