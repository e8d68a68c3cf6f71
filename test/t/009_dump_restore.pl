# test/t/009_dump_restore.pl: pg_dump and restore, into the same cluster and
# into a fresh one, and CREATE DATABASE ... TEMPLATE: every restore succeeds
# without an error, and the copy publishes exactly the events that were not
# delivered when the dump was taken, never one that was.
#
# The source cluster has burnt a few thousand transaction ids first, so its
# events carry txids that a fresh cluster has not reached: read as this
# cluster's, they would be "in the future" and never published.

use strict;
use warnings;

use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep time);

use FindBin;
use lib "$FindBin::RealBin/../perl";
use OutboxTest;

my $kafka = OutboxTest::Broker->start(brokers => 1);
# holds off: this test counts every copy of every event, and a hold
# withdraws a round's unacknowledged events and sends them again, which
# duplicates those the broker had already written (CI, PG 18: the machine
# stalled for seconds as the template copy's two relays started, and 28 of
# the 40 events arrived three times)
my $no_holds = "outbox.hold_after = 0\n";
my $src = outbox_node('dumpsrc', $kafka, conf => $no_holds);
my $topic = 'outbox.event.parcel';
my $dir = PostgreSQL::Test::Utils::tempdir('dumps');

sub set_enabled
{
	my ($node, $on) = @_;
	$node->safe_psql('postgres', "ALTER SYSTEM SET outbox.enabled = $on");
	$node->safe_psql('postgres', 'SELECT pg_reload_conf()');
}

sub emit_n
{
	my ($node, $db, $prefix, $n) = @_;
	my @ids;
	# one transaction each, as applications emit
	for my $i (1 .. $n)
	{
		push @ids, $node->safe_psql($db,
			"SELECT outbox.emit('parcel', '$prefix-" . ($i % 7) . "', 'parcel.sent', '{\"i\": $i}')");
	}
	return @ids;
}

# how many times each event id is in the topic now
sub counts
{
	my $msgs = read_topic($kafka, $topic) // [];
	return event_ids_of($msgs);
}

# wait until every id in want has reached its count (id => n)
sub wait_for_counts
{
	my ($want, $what) = @_;
	my $deadline = time() + 60;
	my $ok = 0;
	while (time() < $deadline)
	{
		my $c = counts();
		if (!grep { ($c->{$_} // 0) < $want->{$_} } keys %$want)
		{
			$ok = 1;
			last;
		}
		usleep(300_000);
	}
	ok($ok, $what);
	# give a wrong resend time to show up
	usleep(1_500_000);
	my $c = counts();
	my @wrong = grep { ($c->{$_} // 0) != $want->{$_} } keys %$want;
	is(scalar(@wrong), 0, "$what, and each exactly as often as expected")
	  or diag(join("\n", map { "$_: " . ($c->{$_} // 0) . " times, want $want->{$_}" } @wrong[ 0 .. ($#wrong < 9 ? $#wrong : 9) ]));
}

sub run_tool
{
	my (@cmd) = @_;
	my ($out, $err) = ('', '');
	my $ok = IPC::Run::run(\@cmd, '>', \$out, '2>', \$err);
	return ($ok ? 0 : ($? >> 8), $out, $err);
}

# --- the source: burn xids, publish some events, pause, leave some undelivered
$src->safe_psql('postgres', 'CREATE DATABASE shop');
$src->safe_psql('shop', 'CREATE EXTENSION outbox');
ok(defined(wait_for_relay($src, 'shop', 10)), 'the source database has a relay');
$src->pgbench('--no-vacuum --client=2 --transactions=2000', 0, [qr{processed: 4000/4000}], [qr{^$}],
	'the source cluster uses up 4,000 transaction ids',
	{ '009_xids' => 'SELECT pg_current_xact_id();' }, 'postgres');

my @delivered = emit_n($src, 'shop', 'd', 150);
wait_for_events($kafka, $topic, \@delivered);
pass('150 events are delivered before the dump');

set_enabled($src, 'off');
ok(relay_state_is($src, 'shop', 'paused'), 'the relay is paused');
my @pending = emit_n($src, 'shop', 'p', 80);
my $src_txid = $src->safe_psql('shop', 'SELECT max(txid::text::bigint) FROM outbox.events');
is($src->safe_psql('shop', 'SELECT backlog >= 80 FROM outbox.status()'), 't',
	'80 events wait undelivered when the dump is taken');

my ($rc, $out, $err) = run_tool('pg_dump', '-Fc', '-f', "$dir/shop.dump", '-d', $src->connstr('shop'));
my $src_origin = $src->safe_psql('shop', 'SELECT origin FROM outbox.origin');
is($rc, 0, 'pg_dump -Fc succeeds') or diag($err);
($rc, $out, $err) = run_tool('pg_dump', '-f', "$dir/shop.sql", '-d', $src->connstr('shop'));
is($rc, 0, 'pg_dump (plain) succeeds') or diag($err);

# --- the same cluster: the source goes, its dump comes back under another name
$src->safe_psql('postgres', 'DROP DATABASE shop');
$src->safe_psql('postgres', 'CREATE DATABASE shop2');
# in parallel: the small progress table may be loaded while the events
# are still being copied
($rc, $out, $err) = run_tool('pg_restore', '-j', '2', '-d', $src->connstr('shop2'), "$dir/shop.dump");
is($rc, 0, 'pg_restore -j 2 into the same cluster exits 0');
is($err, '', 'and reports no error') or diag($err);
set_enabled($src, 'on');
ok(defined(wait_for_relay($src, 'shop2', 10)), 'the restored database has a relay');
my %want = map { $_ => 1 } @delivered, @pending;
wait_for_counts(\%want,
	'restored into the same cluster: the 80 undelivered events are published, the 150 delivered ones not again');
ok(wait_for_log_match($src, qr/adopted restored events.*\n.*80 events not delivered before the dump/, 0, 10),
	'the relay logs that it adopted the restored events, with the count');
is($src->safe_psql('shop2', 'SELECT count(*) FROM outbox.restored_events'), '0',
	'no restored event is left unjudged');
is($src->safe_psql('shop2', 'SELECT count(*) FROM outbox.relay_progress'), '1',
	'one progress row is left, the database\'s own');
is($src->safe_psql('shop2', 'SELECT count(*), min(origin::text) FROM outbox.origin'),
	"1|$src_origin",
	'the restored database keeps the origin of the dumped one (subscribers dedupe its resent events)');

# --- a fresh cluster, from the plain dump through psql with ON_ERROR_STOP
my $fresh = outbox_node('dumpdst', $kafka, conf => $no_holds);
$fresh->safe_psql('postgres', 'CREATE DATABASE shop');
($rc, $out, $err) = run_tool('psql', '-X', '-q', '-v', 'ON_ERROR_STOP=1', '-d', $fresh->connstr('shop'),
	'-f', "$dir/shop.sql");
is($rc, 0, 'pg_dump | psql with ON_ERROR_STOP into a fresh cluster succeeds') or diag($err);
is($fresh->safe_psql('shop', 'SELECT origin FROM outbox.origin'), $src_origin,
	'so does a plain dump restored into a fresh cluster');
unlike($err, qr/ERROR/, 'and reports no error');
ok( $fresh->safe_psql('shop', 'SELECT pg_current_xact_id()::text::bigint') < $src_txid,
	'the fresh cluster has not reached the restored events\' transaction ids');
ok(defined(wait_for_relay($fresh, 'shop', 10)), 'the fresh cluster\'s database has a relay');
$want{$_}++ foreach @pending;
wait_for_counts(\%want,
	'restored into a fresh cluster: the 80 undelivered events are published once more (from the copy), the delivered ones not');
ok(poll_until($fresh, 'shop', 'SELECT backlog FROM outbox.status()', '0', 10),
	'the fresh cluster\'s status() shows no backlog once they are out');
# the copy goes on publishing its own new events, and the restored ones
# are not sent again when the new cluster's counter passes their txids
my @later = emit_n($fresh, 'shop', 'l', 20);
$fresh->pgbench('--no-vacuum --client=2 --transactions=2500', 0, [qr{processed: 5000/5000}], [qr{^$}],
	'the fresh cluster uses up transaction ids past the restored ones',
	{ '009_xids2' => 'SELECT pg_current_xact_id();' }, 'postgres');
my @later2 = emit_n($fresh, 'shop', 'm', 20);
$want{$_} = 1 foreach @later, @later2;
wait_for_counts(\%want,
	'new events in the restored database are published, and the restored ones are not sent again');

# --- events emitted in the transaction that creates the extension are
# published, also when a later transaction id completed before it
$src->safe_psql('postgres', 'CREATE DATABASE birth');
$src->safe_psql('birth', 'CREATE EXTENSION dblink');
my $conn = $src->connstr('postgres');
my ($born) = grep { /^[0-9a-f-]{36}$/ } split /\n/, $src->safe_psql('birth', qq{
BEGIN;
SELECT pg_current_xact_id();
SELECT dblink_exec(\$c\$$conn\$c\$, 'CREATE TABLE birth_tick ()');
CREATE EXTENSION outbox;
SELECT outbox.emit('parcel', 'b-1', 'parcel.sent', '{}');
COMMIT;});
ok(defined $born, 'an event is emitted in the CREATE EXTENSION transaction');
$want{$born} = 1;
wait_for_counts(\%want, 'it is published');

# --- CREATE DATABASE ... TEMPLATE: the copy publishes what its template had
# not delivered, once, and nothing else
set_enabled($src, 'off');
ok(relay_state_is($src, 'shop2', 'paused'), 'shop2\'s relay is paused');
my @tpending = emit_n($src, 'shop2', 't', 40);
$src->safe_psql('postgres', 'CREATE DATABASE shop3 TEMPLATE shop2');
set_enabled($src, 'on');
ok(defined(wait_for_relay($src, 'shop3', 15)), 'the copied database has a relay');
$want{$_} = 2 foreach @tpending;
wait_for_counts(\%want,
	'a template copy publishes the 40 events its template had not delivered (each once per database), nothing older');

$fresh->stop;
$src->stop;
done_testing();
