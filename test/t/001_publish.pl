# test/t/001_publish.pl: events from many concurrent transactions reach
# Kafka, exactly the committed ones, each aggregate in order in one
# partition, with the documented key, value and headers.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::Local qw(timegm);

# found without -I: PGXS resets PROVE_FLAGS after the Makefile sets it
use FindBin;
use lib "$FindBin::RealBin/../perl";
use OutboxTest;

my $kafka = OutboxTest::Broker->start(brokers => 3);
my $node = outbox_node('publish', $kafka, conf => 'max_connections = 30');

$node->safe_psql('postgres', 'CREATE DATABASE shop');
$node->safe_psql('shop', 'CREATE EXTENSION outbox');

# the relay is an ordinary, visible server process
my ($pid) = wait_for_relay($node, 'shop', 10);
ok(defined $pid, 'pg_stat_activity shows an "outbox relay" for database shop');
is( $node->safe_psql(
		'postgres',
		"SELECT backend_type || ' ' || datname FROM pg_stat_activity WHERE pid = "
		  . ($pid // 0)),
	'outbox relay shop',
	'the relay is listed with backend_type "outbox relay" and its database');

# what an idle relay waits for: named from PostgreSQL 17 on (custom wait
# events), the generic "Extension" before
my $version_num = $node->safe_psql('postgres', 'SHOW server_version_num');
my $idle_wait =
  $version_num >= 170000 ? 'Extension/OutboxRelayIdle' : 'Extension/Extension';
ok( $node->poll_query_until(
		'postgres',
		"SELECT wait_event_type || '/' || wait_event FROM pg_stat_activity WHERE pid = "
		  . ($pid // 0),
		$idle_wait),
	"the idle relay's wait event is $idle_wait");

# 8 clients x 100 transactions, each emitting for two aggregates (in a fixed
# order, so the counter row locks cannot deadlock); one in five rolls back,
# after marking its payloads "doomed" so that Kafka can tell them apart.
my $script = q{
\set a random(1, 40)
\set b random(1, 40)
\set lo least(:a, :b)
\set hi greatest(:a, :b)
\set doomed random(1, 5)
BEGIN;
SELECT outbox.emit('order', 'o-' || :lo, 'order.confirmed', jsonb_build_object('total', :a * 10, 'doomed', :doomed = 1, 'note', 'a "quoted", text'));
SELECT outbox.emit('order', 'o-' || :hi, 'order.shipped', jsonb_build_object('total', :b * 10, 'doomed', :doomed = 1));
\if :doomed = 1
ROLLBACK;
\else
COMMIT;
\endif
};
$node->pgbench(
	'--no-vacuum --client=8 --jobs=4 --transactions=100',
	0,
	[qr{processed: 800/800}],
	[qr{^$}],
	'800 concurrent transactions emit events, some roll back',
	{ '001_emit' => $script },
	'shop');

my $rows = query_json(
	$node, 'shop', q{
SELECT coalesce(json_agg(json_build_object(
	'event_id', event_id, 'aggregate_type', aggregate_type,
	'aggregate_id', aggregate_id, 'seq', seq::text, 'event_type', event_type,
	'schema_version', schema_version::text, 'key', key, 'topic', topic,
	'payload', payload::text,
	'occurred_at', extract(epoch FROM occurred_at)::numeric::text) ORDER BY id), '[]')
FROM outbox.events});
my %committed = map { $_->{event_id} => $_ } @$rows;

cmp_ok(scalar(@$rows), '>', 0, 'committed transactions left events');
cmp_ok(scalar(@$rows), '<', 1600,
	'rolled-back transactions left no events in outbox.events');
is(scalar(grep { $_->{payload} =~ /"doomed": true/ } @$rows),
	0, 'no doomed event is in outbox.events');

my $msgs = wait_for_events($kafka, 'outbox.event.order', [ keys %committed ]);
my $seen = event_ids_of($msgs);

is(scalar(grep { !$seen->{$_} } keys %committed),
	0, 'every committed event is in Kafka');
my @strangers = grep { !$committed{$_} } keys %$seen;
is(scalar(@strangers), 0,
	'Kafka holds no event that is not committed in outbox.events')
  or diag "e.g. @strangers[0 .. ($#strangers < 4 ? $#strangers : 4)]";
is(scalar(grep { defined $_->{value} && $_->{value} =~ /"doomed": true/ } @$msgs),
	0, 'no event of a rolled-back transaction was published');
is(scalar(grep { $seen->{$_} > 1 } keys %$seen),
	0, 'no event was published twice in a run without failures');

# the envelope: key, value and headers of every message
my @required = qw(id event_type aggregate_type aggregate_id seq
  schema_version occurred_at origin);
my ($missing_hdr, $bad_key, $bad_value, $bad_hdr, $bad_time) = (0) x 5;
foreach my $m (@$msgs)
{
	my $h = $m->{headers};
	my $row = $committed{ $h->{id} // '' } or next;

	$missing_hdr++ if grep { !defined $h->{$_} } @required;
	$bad_key++ unless defined $m->{key} && $m->{key} eq $row->{aggregate_id};
	$bad_value++ unless defined $m->{value} && $m->{value} eq $row->{payload};
	$bad_hdr++
	  if grep { ($h->{$_} // '') ne $row->{$_} }
	  qw(event_type aggregate_type aggregate_id seq schema_version);

	# occurred_at is ISO 8601 in UTC, to the microsecond
	my @t = ($h->{occurred_at} // '') =~
	  /^(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)\.(\d{6})Z$/;
	if (!@t)
	{
		$bad_time++;
		next;
	}
	my $epoch = timegm($t[5], $t[4], $t[3], $t[2], $t[1] - 1, $t[0]) +
	  $t[6] / 1e6;
	$bad_time++ if abs($epoch - $row->{occurred_at}) > 1e-5;
}
is($missing_hdr, 0,
	'every message has headers id, event_type, aggregate_type, aggregate_id, seq, schema_version, occurred_at'
);
is($bad_key,   0, 'every message key is the aggregate id');
is($bad_value, 0, 'every message value is the payload JSON text');
is($bad_hdr, 0,
	'event_type, aggregate_type, aggregate_id, seq and schema_version headers match the event row'
);
is($bad_time, 0,
	'occurred_at header is the event time in UTC, ISO 8601 with microseconds');

# per-aggregate order: one partition, seq never goes back, none missing
my (%partitions, %last_seq, %seqs);
my $backwards = 0;
foreach my $m (@$msgs)    # sorted by partition, then offset
{
	my $agg = $m->{headers}{aggregate_id} // next;
	my $seq = $m->{headers}{seq} // next;

	$partitions{$agg}{ $m->{partition} } = 1;
	my $k = "$agg/$m->{partition}";
	$backwards++ if defined $last_seq{$k} && $seq < $last_seq{$k};
	$last_seq{$k} = $seq;
	$seqs{$agg}{$seq} = 1;
}
my %db_count;
$db_count{ $_->{aggregate_id} }++ foreach @$rows;
is(scalar(grep { keys %{ $partitions{$_} } > 1 } keys %partitions),
	0, 'all events of an aggregate are in one partition');
is($backwards, 0,
	'within its partition, every aggregate\'s seq header never decreases');
is( scalar(
		grep {
			my $agg = $_;
			scalar(keys %{ $seqs{$agg} // {} }) != $db_count{$agg}
			  || grep { !$seqs{$agg}{$_} } 1 .. $db_count{$agg}
		} keys %db_count),
	0,
	'every aggregate\'s seq headers run 1..n without gaps');
cmp_ok(scalar(keys %partitions), '>', 1,
	'the aggregates are spread over several partitions');

$node->stop;
done_testing();
