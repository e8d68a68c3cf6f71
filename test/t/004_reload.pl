# test/t/004_reload.pl: the relay follows configuration reloads without a
# restart: a new outbox.kafka_brokers moves publishing to another cluster,
# outbox.enabled = off pauses it, and an invalid outbox.kafka_config is
# refused while the old one stays in force: one librdkafka rejects, and
# one it accepts but the relay's idempotent producer or a subscription's
# consumer could not be made with.  A producer that cannot be made is
# reported once, by the relay's message.

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

my $topic = 'outbox.event.cart';
my $kafka1 = OutboxTest::Broker->start(brokers => 3);
my $kafka2 = OutboxTest::Broker->start(brokers => 1);
my $node = outbox_node('reload', $kafka1);

$node->safe_psql('postgres', 'CREATE EXTENSION outbox');
my ($pid) = wait_for_relay($node, 'postgres', 10);
ok(defined $pid, 'the relay runs');

my $n = 0;

sub emit
{
	$n++;
	return $node->safe_psql('postgres',
		"SELECT outbox.emit('cart', 'c-$n', 'cart.changed', '{\"n\": $n}')");
}

# ALTER SYSTEM and reload, then wait until the relay has read the file: it
# logs each change of the Kafka settings as it rebuilds its producer.
sub set_and_reload
{
	my ($setting, $value, $log_re) = @_;
	my $offset = -s $node->logfile;

	$node->safe_psql('postgres', "ALTER SYSTEM SET $setting = '$value'");
	$node->safe_psql('postgres', 'SELECT pg_reload_conf()');
	return defined wait_for_log_match($node, $log_re, $offset, 15);
}

my $first = emit();
wait_for_events($kafka1, $topic, [$first]);
pass('an event is published to the first cluster');

# --- switch clusters
ok( set_and_reload(
		'outbox.kafka_brokers', $kafka2->bootstrap,
		qr/Kafka settings changed, rebuilding the producer/),
	'after ALTER SYSTEM and a reload the relay logs that it switches brokers');
my @moved = (emit(), emit());
my $msgs = wait_for_events($kafka2, $topic, \@moved);
is(scalar(@$msgs), 2,
	'after the reload, new events are published to the second cluster');
$msgs = read_topic($kafka1, $topic);
is_deeply([ map { $_->{headers}{id} } @$msgs ],
	[$first], 'the first cluster got none of them');
is(relay_pid($node, 'postgres'), $pid,
	'the same relay process publishes: no restart');

# --- pause and resume
$node->safe_psql('postgres',
	'ALTER SYSTEM SET outbox.enabled = off; SELECT pg_reload_conf()');
ok(relay_state_is($node, 'postgres', 'paused'),
	'with outbox.enabled = off the relay reports itself paused');
my @paused = (emit(), emit());
my $deadline = time() + 3;
my $leaked = 0;
while (time() < $deadline)
{
	my $seen = event_ids_of(read_topic($kafka2, $topic) // []);
	$leaked += grep { $seen->{$_} } @paused;
	usleep(300_000);
}
is($leaked, 0, 'events emitted while paused stay unpublished for 3 seconds');
$node->safe_psql('postgres',
	'ALTER SYSTEM SET outbox.enabled = on; SELECT pg_reload_conf()');
$msgs = wait_for_events($kafka2, $topic, \@paused, 30);
is(scalar(grep { my $id = $_->{headers}{id}; grep { $_ eq $id } @paused } @$msgs),
	2, 'after outbox.enabled = on they are published, once each');
is(relay_pid($node, 'postgres'), $pid,
	'pausing and resuming kept the relay process');

# --- invalid librdkafka settings are refused up front
my $good = $node->safe_psql('postgres', 'SHOW outbox.kafka_config');
foreach my $bad ('acks=banana', 'nonexistent.prop=1', 'linger.ms')
{
	my ($ret, $out, $err) = $node->psql('postgres',
		"ALTER SYSTEM SET outbox.kafka_config = 'batch.size=100000;$bad'");
	my $property = (split /=/, $bad)[0];

	isnt($ret, 0, "ALTER SYSTEM refuses outbox.kafka_config '$bad'");
	like(
		$err,
		qr/ERROR:  invalid value for parameter "outbox.kafka_config".*\nDETAIL:  .*"\Q$property\E"/,
		"the error for '$bad' names the parameter and, in its detail, the property"
	);
}
my ($ret, $out, $err) = $node->psql('postgres',
	"ALTER SYSTEM SET outbox.kafka_config = 'bootstrap.servers=127.0.0.1:1'");
like(
	$err,
	qr/DETAIL:  Property "bootstrap.servers" cannot be set here\.\nHINT:  Set outbox.kafka_brokers instead\./,
	'bootstrap.servers in outbox.kafka_config is refused, pointing to outbox.kafka_brokers'
);
unlike(slurp_file($node->data_dir . '/postgresql.auto.conf'),
	qr/banana|nonexistent|bootstrap\.servers/,
	'none of the refused values reached postgresql.auto.conf');
$node->reload;
is($node->safe_psql('postgres', 'SHOW outbox.kafka_config'),
	$good, 'after a reload outbox.kafka_config keeps its old value');

# A bad value written straight into postgresql.conf is refused at reload.
my $offset = -s $node->logfile;
$node->append_conf('postgresql.conf', "outbox.kafka_config = 'acks=banana'");
$node->reload;
ok( defined wait_for_log_match(
		$node, qr/invalid value for parameter "outbox.kafka_config"/,
		$offset, 15),
	'a bad outbox.kafka_config in postgresql.conf is reported at reload');
is($node->safe_psql('postgres', 'SHOW outbox.kafka_config'),
	$good, 'and the old value stays in force');
my $last = emit();
wait_for_events($kafka2, $topic, [$last]);
pass('the relay goes on publishing with the old settings');
is(relay_pid($node, 'postgres'), $pid, 'still the same relay process');

# Values librdkafka takes one by one, but with which the relay's idempotent
# producer or a subscription's consumer could not be made: refused at
# reload, logged with the property, and the relay publishes on.
foreach my $refused (
	[ 'acks=1',                    qr/Property "acks" cannot be "1"/ ],
	[ 'max.in.flight=10',          qr/Property "max.in.flight" cannot be "10"/ ],
	[ 'transactional.id=outbox',   qr/Property "transactional.id" cannot be set here/ ],
	[ 'enable.auto.commit=true',   qr/Property "enable.auto.commit" cannot be set here/ ],
	[ 'max.poll.interval.ms=5000', qr/Property "session.timeout.ms" \(10000\) is greater than "max.poll.interval.ms" \(5000\)/ ])
{
	my ($value, $detail) = @$refused;

	$offset = -s $node->logfile;
	$node->append_conf('postgresql.conf', "outbox.kafka_config = '$value'");
	$node->reload;
	ok( defined wait_for_log_match(
			$node,
			qr/invalid value for parameter "outbox.kafka_config"\n.*DETAIL:  $detail.*\n.*HINT:  \S/,
			$offset, 15),
		"a reload with outbox.kafka_config '$value' is refused, its reason logged");
	is($node->safe_psql('postgres', 'SHOW outbox.kafka_config'),
		$good, "after '$value' the old value stays in force");
	$last = emit();
	wait_for_events($kafka2, $topic, [$last]);
	pass("after '$value' the relay goes on publishing");
	unlike(slurp_file($node->logfile, $offset), qr/could not create the Kafka producer/,
		"after '$value' the relay never failed to make its producer");
}
is(relay_pid($node, 'postgres'), $pid, 'still the same relay process');

# A producer that cannot be made (a keystore and no password: that may be
# in the secrets file, so only the relay can tell) is reported once.
ok( set_and_reload(
		'outbox.kafka_config', 'ssl.keystore.location=/nonexistent.p12',
		qr/outbox relay: could not create the Kafka producer\n.*DETAIL:  \S/),
	'a producer librdkafka refuses to make is reported by the relay');
unlike(slurp_file($node->logfile), qr/could not create the Kafka producer: could not create/,
	'the report says "could not create the Kafka producer" once');
$node->safe_psql('postgres',
	"ALTER SYSTEM SET outbox.kafka_config = '$good'; SELECT pg_reload_conf()");
$last = emit();
wait_for_events($kafka2, $topic, [$last]);
pass('with the old value back, the relay publishes again');

$node->stop;
done_testing();
