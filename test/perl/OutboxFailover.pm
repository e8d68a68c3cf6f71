# test/perl/OutboxFailover.pm: the failover drill shared by the TAP tests
# 019 and 020 (test tool only, never installed).

=pod

=head1 NAME

OutboxFailover - a primary under load with a streaming standby on a
physical slot, the standby's WAL receiver stopped, every process of the
primary killed at once, the standby promoted; then Kafka compared with the
promoted database

=head1 SYNOPSIS

  use OutboxFailover;

  my $kafka = OutboxTest::Broker->start(brokers => 3);
  my $r = failover_drill(kafka => $kafka, name => 'a', aggregate => 'acct_a',
	standby_slots => 1);
  is($r->{phantoms}, 0, 'no phantom events');

=head1 DESCRIPTION

Kafka is read back with kcat, as in OutboxTest; the events of record are
those of the promoted database's outbox.events.  The drill runs on Unix
sockets (PostgreSQL::Test::Cluster's default here): a stopped WAL
receiver then holds a few hundred kB of WAL in its socket, and the WAL the
primary commits after that never reaches the standby.

=cut

package OutboxFailover;

use strict;
use warnings;

use Exporter 'import';
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep time);

use OutboxTest;

our @EXPORT = qw(failover_drill kill_all_processes);

# the relay's page in the drills: bounds what a promoted relay sends again
our $BATCH_SIZE = 100;
# keys the load spreads its events over
our $KEYS = 30;

=pod

=head1 FUNCTIONS

=over

=item kill_all_processes(node)

SIGKILL to the node's postmaster and every child of it, in one kill call,
so that none of them does anything after the others are gone (no
walsender flushes a last message, no backend finishes a commit); returns
once the postmaster is gone (at most 30 s), so that the node can be
started again.  The node is then known as stopped.

=cut

sub kill_all_processes
{
	my ($node) = @_;
	my ($pm) = split /\n/,
	  PostgreSQL::Test::Utils::slurp_file($node->data_dir . '/postmaster.pid');
	my @children;

	opendir(my $proc, '/proc') or die "cannot read /proc: $!";
	foreach my $pid (grep { /^\d+$/ } readdir $proc)
	{
		open(my $fh, '<', "/proc/$pid/stat") or next;
		my $stat = <$fh> // '';
		close $fh;
		# pid (comm) state ppid ...: comm may hold spaces and parentheses
		my ($ppid) = $stat =~ /\) \S+ (\d+) /;
		push @children, $pid if defined $ppid && $ppid == $pm;
	}
	closedir $proc;
	note "killing postmaster $pm and its " . scalar(@children) . " children at once";
	kill 'KILL', $pm, @children;
	my $gone = time() + 30;
	usleep(50_000) while kill(0, $pm) && time() < $gone;
	# the framework's own record of the postmaster: kill9 clears it
	$node->kill9;
	return;
}

# a node's outbox.status() column
sub status_of
{
	my ($node, $column) = @_;
	return $node->safe_psql('postgres', "SELECT $column FROM outbox.status()");
}

# the primary, its extension and its slot, and a standby streaming from it
sub start_pair
{
	my (%p) = @_;
	my $slot = "$p{name}_standby";
	my $conf = "outbox.batch_size = $BATCH_SIZE\n";

	$conf .= "outbox.synchronized_standby_slots = '$slot'\n"
	  if $p{standby_slots};
	my $primary = outbox_node("$p{name}_primary", $p{kafka},
		allows_streaming => 1, conf => $conf);
	$primary->safe_psql('postgres', 'CREATE EXTENSION outbox');
	$primary->safe_psql('postgres',
		"SELECT pg_create_physical_replication_slot('$slot', true)");
	$primary->backup('base');

	# the standby's postgresql.conf is the primary's, setting included
	my $standby = PostgreSQL::Test::Cluster->new($slot);
	$standby->init_from_backup($primary, 'base', has_streaming => 1);
	$standby->append_conf('postgresql.conf', "primary_slot_name = '$slot'");
	$standby->start;
	$primary->wait_for_catchup($standby, 'flush');
	if ($p{synchronous})
	{
		# after the standby is there: commits would wait for it before
		$primary->append_conf('postgresql.conf',
			"synchronous_standby_names = '$slot'");
		$primary->reload;
		ok( poll_until(
				$primary, 'postgres',
				"SELECT sync_state FROM pg_stat_replication WHERE application_name = '$slot'",
				'sync', 30),
			"$p{name}: the standby is synchronous");
	}
	return ($primary, $standby);
}

# emit $n events on the node's keys k-1 .. k-$KEYS, in one transaction
sub emit_events
{
	my ($node, $aggregate, $n, $tag) = @_;
	$node->safe_psql('postgres',
		"SELECT outbox.emit('$aggregate', 'k-' || (g % $KEYS + 1), '$aggregate.$tag', '{}') FROM generate_series(1, $n) g"
	);
	return;
}

# the load: $rate transactions a second, each emitting one event
sub start_load
{
	my ($primary, $aggregate, $rate, $seconds) = @_;
	my $script = PostgreSQL::Test::Utils::tempdir() . '/load.sql';

	PostgreSQL::Test::Utils::append_to_file(
		$script, qq{\\set k random(1, $KEYS)
SELECT outbox.emit('$aggregate', 'k-' || :k, '$aggregate.changed', '{"load": true}');
});
	return IPC::Run::start(
		[
			'pgbench', '--no-vacuum', '--client=4', "--time=$seconds",
			"--rate=$rate", '-f', $script, '-h', $primary->host,
			'-p', $primary->port, 'postgres'
		],
		'>', \my $out, '2>', \my $err);
}

# promote the standby (clearing the setting first, as an operator does)
# and time it until its relay has published again
sub promote_and_time
{
	my ($standby, $aggregate, $clear) = @_;

	if ($clear)
	{
		$standby->append_conf('postgresql.conf',
			"outbox.synchronized_standby_slots = ''");
		$standby->reload;
	}
	my $t0 = time();
	$standby->promote;
	emit_events($standby, $aggregate, 1, 'marker');
	my $ok = poll_until($standby, 'postgres',
		'SELECT published > 0 FROM outbox.status()', 't', 60);
	return $ok ? time() - $t0 : undef;
}

=pod

=item failover_drill(kafka => broker, name => prefix, aggregate => type, standby_slots => 0|1, synchronous => 0|1, rate => tps, stall => seconds)

Runs the drill and returns a hash reference of what it found: events
(in the promoted database), kafka_ids (distinct ids in Kafka), phantoms
(ids in Kafka the promoted database does not have), lost (the reverse),
duplicates (messages beyond the first of an id), seq_reused (aggregate
seq numbers carried by two different events), seq_disorder (first
arrivals of a key, in Kafka order, whose seq does not exceed the one
before), waited (the primary's relay said it waits for the standby
during the stall) and publish_after_promote (seconds from promotion to
the promoted relay's first acknowledged event, undef if never).

=cut

sub failover_drill
{
	my (%p) = @_;
	my $aggregate = $p{aggregate};
	my $topic = "outbox.event.$aggregate";
	my ($primary, $standby) = start_pair(%p);
	my %r;

	# the pair works: these reach Kafka before anything fails
	emit_events($primary, $aggregate, 20, 'warmup');
	wait_for_messages($p{kafka}, $topic, 20, 30);

	my $load = start_load($primary, $aggregate, $p{rate} // 300, 60);
	sleep 3;
	my $receiver = $standby->safe_psql('postgres',
		"SELECT pid FROM pg_stat_activity WHERE backend_type = 'walreceiver'");
	ok($receiver =~ /^\d+$/, "$p{name}: the standby's WAL receiver runs")
	  or return \%r;
	kill 'STOP', $receiver;
	note "$p{name}: WAL receiver $receiver stopped for $p{stall} s";
	sleep $p{stall};
	$r{waited} = status_of($primary, 'state') eq 'waiting for standby';
	$r{primary_published} = status_of($primary, 'published');
	kill_all_processes($primary);
	kill 'CONT', $receiver;
	$load->finish;

	$r{publish_after_promote} =
	  promote_and_time($standby, $aggregate, $p{standby_slots});
	# new events on every key: a counter behind Kafka hands out seqs again
	emit_events($standby, $aggregate, 2 * $KEYS, 'after');
	compare_with_kafka($standby, $p{kafka}, $topic, \%r);
	$standby->stop;
	return \%r;
}

# fill r with how Kafka's topic compares with the node's outbox.events
sub compare_with_kafka
{
	my ($node, $kafka, $topic, $r) = @_;
	my @ids = split /\n/,
	  $node->safe_psql('postgres', 'SELECT event_id FROM outbox.events');
	my %in_db = map { $_ => 1 } @ids;
	my $msgs = wait_for_events($kafka, $topic, \@ids, 60);
	my $count = event_ids_of($msgs);

	$r->{events} = scalar @ids;
	$r->{kafka_ids} = scalar keys %$count;
	$r->{phantoms} = scalar grep { !$in_db{$_} } keys %$count;
	$r->{lost} = scalar grep { !$count->{$_} } @ids;
	$r->{duplicates} = 0;
	$r->{duplicates} += $_ - 1 foreach values %$count;
	seq_order($msgs, $r);
	return;
}

# seq_reused and seq_disorder of r, from the messages in Kafka order
sub seq_order
{
	my ($msgs, $r) = @_;
	my (%seen, %ids_of_seq, %last);

	$r->{seq_disorder} = 0;
	foreach my $m (@$msgs)
	{
		my ($id, $seq) = ($m->{headers}{id}, $m->{headers}{seq});
		my $key = "$m->{partition}/$m->{key}";
		next if $seen{$id}++;
		$ids_of_seq{"$m->{key}/$seq"}{$id} = 1;
		$r->{seq_disorder}++
		  if defined $last{$key} && $seq <= $last{$key};
		$last{$key} = $seq;
	}
	$r->{seq_reused} = scalar grep { keys %$_ > 1 } values %ids_of_seq;
	return;
}

=pod

=back

=cut

1;
