# test/t/306_apache_acl.pl: ACLs on a real Apache Kafka cluster.  The relay
# authenticates with SASL/SCRAM as User:relay (StandardAuthorizer); it may
# write to every outbox.event.* topic but one, outbox.event.locked, where an
# ACL denies it Write.  Under load: the locked topic's events are refused
# (TOPIC_AUTHORIZATION_FAILED), quarantined after outbox.max_attempts, their
# aggregate's successors parked; other topics flow.  After the deny ACL is
# removed, replay() of the head delivers it and its successors, in order.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep time);
use IPC::Run;

use FindBin;
use lib "$FindBin::RealBin/../perl";
use OutboxTest;
use OutboxDrill;
use OutboxKafka;

my $ACL = 'kafka.admin.AclCommand';
my $kafka = OutboxKafka::Cluster->start(brokers => 3);
my $boot = $kafka->bootstrap;
$kafka->tool('kafka.admin.ConfigCommand', '--bootstrap-server', $boot,
	'--alter', '--add-config', 'SCRAM-SHA-512=[password=relay-pw-306]',
	'--entity-type', 'users', '--entity-name', 'relay');
$kafka->create_topic($_, 3) foreach ($DRILL_TOPIC, 'outbox.event.locked');
$kafka->tool($ACL, '--bootstrap-server', $boot, '--add',
	'--allow-principal', 'User:relay', '--operation', 'Write',
	'--operation', 'Describe', '--topic', 'outbox.event.',
	'--resource-pattern-type', 'prefixed');
$kafka->tool($ACL, '--bootstrap-server', $boot, '--add',
	'--deny-principal', 'User:relay', '--operation', 'Write',
	'--topic', 'outbox.event.locked');
note $kafka->tool($ACL, '--bootstrap-server', $boot, '--list');

my $secrets = PostgreSQL::Test::Utils::tempdir('secrets') . '/kafka.secrets';
PostgreSQL::Test::Utils::append_to_file($secrets, "sasl.password=relay-pw-306\n");
chmod 0600, $secrets;
my $node = outbox_node(
	'apache306', $kafka->bootstrap_sasl,
	kafka_config => "$OutboxTest::TEST_KAFKA_CONFIG;security.protocol=SASL_PLAINTEXT;"
	  . 'sasl.mechanisms=SCRAM-SHA-512;sasl.username=relay',
	conf => qq{
outbox.kafka_secrets_file = '$secrets'
outbox.max_attempts = 3
outbox.retry_backoff_min = '100ms'
outbox.retry_backoff_max = '500ms'
});
drill_setup($node, 'postgres');
ok(defined wait_for_relay($node, 'postgres', 30), 'the relay runs');

my $load = OutboxDrill::Load->start($node, 'postgres', seconds => 15, rate => 50);
my @locked = map {
	$node->safe_psql('postgres',
		"SELECT outbox.emit('locked', 'l-1', 'locked.made', '{\"n\": $_}')")
} 1 .. 3;
ok( poll_until(
		$node, 'postgres',
		"SELECT state FROM outbox.dead_letters WHERE event_id = '$locked[0]'",
		'quarantined', 60),
	'the event the relay may not write is quarantined');
my ($class, $err) = split /\|/,
  $node->safe_psql('postgres',
	"SELECT error_class, last_error FROM outbox.dead_letters WHERE event_id = '$locked[0]'");
is($class, 'permanent', 'as a permanent refusal');
like($err, qr/TOPIC_AUTHORIZATION_FAILED/, "last_error names the refusal: $err");
ok( poll_until(
		$node, 'postgres',
		"SELECT count(*) FROM outbox.dead_letters WHERE aggregate_id = 'l-1' AND state = 'parked'",
		'2', 30),
	'its aggregate\'s successors are parked behind it');

$load->finish;
my $all = committed_ids($node, 'postgres');
$kafka->wait_for_events($DRILL_TOPIC, [ keys %$all ], 90);
my $msgs = $kafka->read_java($DRILL_TOPIC);
$_->{topic} = $DRILL_TOPIC foreach @$msgs;
my $fig = drill_figures($msgs, $all);
report_figures('ACL denied on one topic', $fig);
is(scalar(@{ $fig->{missing} }), 0, 'the topic the relay may write to lost nothing');
is(scalar(@{ $fig->{strangers} }), 0, 'no phantom');
is($fig->{order_violations}, 0, 'each aggregate in order');
is(scalar(@{ $kafka->read_java('outbox.event.locked') // [] }), 0,
	'nothing reached the locked topic');

# grant: remove the deny, replay the head
$kafka->tool($ACL, '--bootstrap-server', $boot, '--remove', '--force',
	'--deny-principal', 'User:relay', '--operation', 'Write',
	'--topic', 'outbox.event.locked');
# AclCommand returns once the controller has the change; each broker
# applies it a moment later: wait until the relay's principal can write
# to every partition there, whichever broker leads it (a probe message
# without an id header per partition, written with kcat)
my $t_grant = time();
my $writable;
while (!$writable && time() < $t_grant + 30)
{
	$writable = 1;
	for my $partition (0 .. 2)
	{
		my ($out, $err) = ('', '');
		IPC::Run::run(
			[ 'kcat', '-P', '-b', $kafka->bootstrap_sasl, '-t', 'outbox.event.locked',
			  '-p', $partition,
			  '-X', 'security.protocol=SASL_PLAINTEXT', '-X', 'sasl.mechanisms=SCRAM-SHA-512',
			  '-X', 'sasl.username=relay', '-X', 'sasl.password=relay-pw-306' ],
			'<', \"probe\n", '>', \$out, '2>', \$err, IPC::Run::timeout(30));
		$writable &&= $err !~ /Delivery failed|authorization|Unknown partition/i;
	}
	usleep(200_000) unless $writable;
}
ok($writable, sprintf('the grant reaches the brokers (%.1f s)', time() - $t_grant));
my $queued = $node->safe_psql('postgres',
	"SELECT count(*) FROM outbox.replay('$locked[0]')");
is($queued, 3, 'replay() queues the head and its 2 parked successors');
my $got = $kafka->wait_for_events('outbox.event.locked', \@locked, 60);
my @seqs = map { $_->{headers}{seq} } grep { defined $_->{headers}{id} } @$got;
is_deeply(\@seqs, [ 1, 2, 3 ], 'they arrive, in order, once each');
is($node->safe_psql('postgres',
	"SELECT count(*) FROM outbox.dead_letters WHERE aggregate_id = 'l-1' AND state IN ('quarantined', 'parked')"),
	'0', 'nothing is left in quarantine');

$node->stop;
$kafka->down;
done_testing();
