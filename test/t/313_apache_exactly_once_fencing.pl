# test/t/313_apache_exactly_once_fencing.pl: with outbox.delivery =
# exactly_once, a promoted streaming standby's relay has its old primary's
# transactional id and fences it.  The old primary keeps running and
# emitting (a zombie after a failover): its relay can no longer commit a
# Kafka transaction, says so in status() ("fenced"), health() (critical)
# and the log, and nothing it emits after the fence reaches a
# read_committed consumer; the promoted database's events all do, once.
# On Apache Kafka, read back with the Java client.

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

my $topic = 'outbox.event.fence';
my $kafka = OutboxKafka::Cluster->start(brokers => 3);
my $primary = outbox_node(
	'fence_primary', $kafka,
	allows_streaming => 1,
	conf => q{
outbox.delivery = exactly_once
outbox.retry_backoff_min = '100ms'
outbox.retry_backoff_max = '1s'
});
$primary->safe_psql('postgres', 'CREATE EXTENSION outbox');
ok(defined wait_for_relay($primary, 'postgres', 30), 'the primary\'s relay runs');

sub emit_n
{
	my ($node, $tag, $n) = @_;
	return [ split /\n/, $node->safe_psql('postgres',
		"SELECT outbox.emit('fence', 'k-' || (g % 20), 'fence.$tag', '{}') FROM generate_series(1, $n) g") ];
}

my $before = emit_n($primary, 'before', 200);
$kafka->wait_for_events($topic, $before, 60, isolation => 'read_committed');

$primary->backup('base');
my $standby = PostgreSQL::Test::Cluster->new('fence_standby');
$standby->init_from_backup($primary, 'base', has_streaming => 1);
$standby->start;
emit_n($primary, 'streamed', 100);
$primary->wait_for_catchup($standby, 'replay');

# the failover: the standby is promoted, the old primary keeps running
$standby->promote;
ok(defined wait_for_relay($standby, 'postgres', 60), 'the promoted standby runs a relay');
my $promoted = emit_n($standby, 'promoted', 100);
$kafka->wait_for_events($topic, $promoted, 60, isolation => 'read_committed');
is( $standby->safe_psql('postgres',
		"SELECT kafka_transaction > 0 FROM outbox.relay_progress"), 't',
	'the promoted relay publishes in Kafka transactions');

# the zombie emits; its relay's next transaction is fenced
my $zombie = emit_n($primary, 'zombie', 100);
ok( poll_until($primary, 'postgres', 'SELECT state FROM outbox.status()', 'fenced', 60),
	'the old primary\'s relay is fenced');
ok( defined wait_for_log_match($primary, qr/WARNING:  outbox relay for database "postgres" is fenced/, 0, 10),
	'and says so in the log');
like($primary->safe_psql('postgres', 'SELECT status || \': \' || reason FROM outbox.health()'),
	qr/^critical: the relay is fenced/, 'health() is critical');
my $more = emit_n($primary, 'zombie', 50);
sleep 5;
is($primary->safe_psql('postgres', 'SELECT state FROM outbox.status()'), 'fenced',
	'it stays fenced: no rebuild in a loop');

my $emitted_new = emit_n($standby, 'after', 100);
my $all = $standby->safe_psql('postgres', 'SELECT event_id FROM outbox.events');
my @ids = split /\n/, $all;
my $msgs = $kafka->wait_for_events($topic, \@ids, 60, isolation => 'read_committed');
my %seen;
$seen{ $_->{headers}{id} // '' }++ foreach @$msgs;
is(scalar(grep { !$seen{$_} } @ids), 0, 'every event of the promoted database is in Kafka');
my @twice = grep { $seen{$_} > 1 } sort keys %seen;
is(scalar(@twice), 0, 'once');
diag('twice: ' . join(', ', map {
	my $id = $_;
	my ($m) = grep { ($_->{headers}{id} // '') eq $id } @$msgs;
	"$id ($m->{headers}{event_type}, offsets "
	  . join('/', map { "$_->{partition}:$_->{offset}" } grep { ($_->{headers}{id} // '') eq $id } @$msgs) . ')'
} @twice[ 0 .. ($#twice < 4 ? $#twice : 4) ])) if @twice;
if (@twice)
{
	diag("progress records: " . join("\n", map { "$_->{partition}:$_->{offset} $_->{value}" }
		  @{ $kafka->read_java('outbox.progress', isolation => 'read_committed') // [] }));
	diag("promoted: " . $standby->safe_psql('postgres', 'SELECT * FROM outbox.relay_progress'));
	diag("old: " . $primary->safe_psql('postgres', 'SELECT * FROM outbox.relay_progress'));
	diag("streamed in the promoted database: " . $standby->safe_psql('postgres',
		"SELECT min(id), max(id), min(txid::text), max(txid::text) FROM outbox.events WHERE event_type = 'fence.streamed'"));
}
is(scalar(grep { $seen{$_} } @$zombie, @$more), 0,
	'nothing the fenced old primary emitted reached a read_committed consumer');

$standby->stop;
$primary->stop;
$kafka->down;
done_testing();
