# test/t/305_apache_sasl.pl: SASL/SCRAM-SHA-512 on a real Apache Kafka
# cluster, the password in outbox.kafka_secrets_file.  Under load, with a
# wrong password: Kafka refuses the login, the relay classes it (fatal for
# the producer: rebuilt after a backoff), status() shows the error without
# the secret, nothing is lost or quarantined.  The file is rewritten with
# the right password and the configuration reloaded: everything arrives, in
# order.  Neither password appears in the server log or in status().
# (librdkafka before 2.6.1 cannot log in with SCRAM to Kafka 4.x brokers,
# see README: the cluster is Kafka 3.9.)

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep time);

use FindBin;
use lib "$FindBin::RealBin/../perl";
use OutboxTest;
use OutboxDrill;
use OutboxKafka;

my ($right, $wrong) = ('Right-Pw-305-x7Q', 'Wrong-Pw-305-k2Z');
my $kafka = OutboxKafka::Cluster->start(brokers => 3);
my $boot = $kafka->bootstrap;
$kafka->tool('kafka.admin.ConfigCommand', '--bootstrap-server', $boot,
	'--alter', '--add-config', "SCRAM-SHA-512=[password=$right]",
	'--entity-type', 'users', '--entity-name', 'relay');
$kafka->create_topic($DRILL_TOPIC, 3);
$kafka->tool('kafka.admin.AclCommand', '--bootstrap-server', $boot, '--add',
	'--allow-principal', 'User:relay', '--operation', 'Write',
	'--operation', 'Describe', '--topic', $DRILL_TOPIC);

my $secrets = PostgreSQL::Test::Utils::tempdir('secrets') . '/kafka.secrets';
sub write_secrets
{
	my ($pw) = @_;
	open my $fh, '>', "$secrets.new" or die $!;
	print $fh "# the relay's SCRAM password\nsasl.password=$pw\n";
	close $fh;
	chmod 0600, "$secrets.new";
	rename "$secrets.new", $secrets or die $!;
}
write_secrets($wrong);
my $node = outbox_node(
	'apache305', $kafka->bootstrap_sasl,
	kafka_config => "$OutboxTest::TEST_KAFKA_CONFIG;security.protocol=SASL_PLAINTEXT;"
	  . 'sasl.mechanisms=SCRAM-SHA-512;sasl.username=relay',
	conf => qq{
outbox.kafka_secrets_file = '$secrets'
outbox.delivery_timeout = '5s'
outbox.retry_backoff_min = '100ms'
outbox.retry_backoff_max = '1s'
});
drill_setup($node, 'postgres');
ok(defined wait_for_relay($node, 'postgres', 30), 'the relay runs');

my $load = OutboxDrill::Load->start($node, 'postgres', seconds => 20, rate => 50);
my $st;
my $deadline = time() + 30;
while (time() < $deadline)
{
	$st = relay_status($node, 'postgres');
	last if ($st->{last_error} // '') =~ /auth/i;
	usleep(300_000);
}
like($st->{last_error} // '', qr/SASL authentication|Authentication failed/i,
	'status() shows the failed login: ' . ($st->{last_error} // 'none'));
# a failed login is a client error (librdkafka's error callback), not a
# delivery failure: no failure counter moves until a delivery times out
is($st->{published}, 0, 'nothing is published with the wrong password');
ok( poll_until($node, 'postgres', 'SELECT fatal_failures > 0 FROM outbox.status()', 't', 30),
	'and counts it as a fatal failure (the class of authentication errors)');
my $all_status = $node->safe_psql('postgres', 'SELECT row_to_json(s) FROM outbox.status() s');
unlike($all_status, qr/\Q$wrong\E/, 'status() does not show the password');

# the fix: rewrite the file, reload
write_secrets($right);
my $t_fix = time();
$node->safe_psql('postgres', 'SELECT pg_reload_conf()');
ok( poll_until($node, 'postgres', 'SELECT published > 0 FROM outbox.status()', 't', 60),
	'after the fix and a reload, the relay publishes');
diag(sprintf('SCRAM: first events published %.1f s after the password fix and reload',
	time() - $t_fix));

$load->finish;
my $all = committed_ids($node, 'postgres');
$kafka->wait_for_events($DRILL_TOPIC, [ keys %$all ], 90);
my $msgs = $kafka->read_java($DRILL_TOPIC);
$_->{topic} = $DRILL_TOPIC foreach @$msgs;
my $fig = drill_figures($msgs, $all);
report_figures('SASL/SCRAM wrong password then reload', $fig);
is(scalar(@{ $fig->{missing} }), 0, 'no loss');
is(scalar(@{ $fig->{strangers} }), 0, 'no phantom');
is($fig->{order_violations}, 0, 'each aggregate in order');
cmp_ok($fig->{duplicates}, '<=', 5000, "duplicates at most a page ($fig->{duplicates})");
$st = relay_status($node, 'postgres');
is($st->{quarantined}, 0, 'a failed login quarantines nothing');

my $log = slurp_file($node->logfile);
unlike($log, qr/\Q$wrong\E/, 'the wrong password appears in no log line');
unlike($log, qr/\Q$right\E/, 'nor the right one');
like($log, qr/outbox relay/, '(the log does have the relay\'s lines)');

$node->stop;
$kafka->down;
done_testing();
