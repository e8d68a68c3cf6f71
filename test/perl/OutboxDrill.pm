# test/perl/OutboxDrill.pm: what the failure drills (test/t/1NN_*.pl) share
# on top of OutboxTest: a steady background load whose committed events the
# application records itself, and the figures a consumer would check in
# what kcat reads back (test tool only, never installed).

=pod

=head1 NAME

OutboxDrill - steady load and consumer-side figures for the failure drills

=head1 SYNOPSIS

  use OutboxTest;
  use OutboxDrill;

  drill_setup($node, 'postgres');
  my $load = OutboxDrill::Load->start($node, 'postgres', seconds => 30);
  ...
  $load->finish;
  my $ids = committed_ids($node, 'postgres');
  my $msgs = wait_for_events($kafka, $DRILL_TOPIC, [ keys %$ids ]);
  my $fig = drill_figures($msgs, $ids);
  report_figures('broker outage', $fig);

=head1 DESCRIPTION

The load is pgbench, re-launched by a shell loop until its deadline, so it
survives a crash restart of the server; it is bounded in time (seconds)
and in count (rate x seconds).  Every transaction records the event ids
emit() returned in the table drill_committed, in the same transaction: the
application's own record of what committed, independent of outbox.events
(which cleanup may shrink) and of the relay.

=cut

package OutboxDrill;

use strict;
use warnings;

use Carp;
use Exporter 'import';
use IPC::Run;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep time);
use JSON::PP ();

use OutboxTest;

our @EXPORT = qw(
  $DRILL_TOPIC
  drill_setup
  committed_ids
  read_topics
  drill_figures
  report_figures
  set_and_reload
  relay_status
  server_crashed_since
  explain_missing
  diag_outbox_log
  kill_relay_when
);

# the load's aggregate type, hence its topic under the default template
our $DRILL_TOPIC = 'outbox.event.drill';

=pod

=head1 FUNCTIONS

=over

=item drill_setup(node, dbname)

Creates the extension (if missing) and the application's record of
committed events, drill_committed.

=cut

sub drill_setup
{
	my ($node, $dbname) = @_;

	$node->safe_psql(
		$dbname, q{
CREATE EXTENSION IF NOT EXISTS outbox;
CREATE TABLE drill_committed (
	event_id		uuid PRIMARY KEY,
	aggregate_id	text NOT NULL,
	committed_at	timestamptz NOT NULL DEFAULT clock_timestamp());
});
	return;
}

=pod

=item committed_ids(node, dbname [, where])

A hash reference: event id => aggregate id of every row of
drill_committed (matching the SQL condition where, when given).

=cut

sub committed_ids
{
	my ($node, $dbname, $where) = @_;
	my $out = $node->safe_psql($dbname,
		    'SELECT event_id, aggregate_id FROM drill_committed'
		  . (defined $where ? " WHERE $where" : ''));
	my %ids;

	foreach my $line (split /\n/, $out)
	{
		my ($id, $agg) = split /\|/, $line;
		$ids{$id} = $agg;
	}
	return \%ids;
}

=pod

=item read_topics(broker, topic, ...)

The messages of several topics, each tagged with its topic, or undef when
kcat fails on one of them.

=cut

sub read_topics
{
	my ($broker, @topics) = @_;
	my @all;

	foreach my $topic (@topics)
	{
		my $msgs = read_topic($broker, $topic) // return undef;
		$_->{topic} = $topic foreach @$msgs;
		push @all, @$msgs;
	}
	return \@all;
}

=pod

=item drill_figures(messages, expected)

What a consumer checks in messages (read_topic output, possibly of
several topics), given expected, a hash reference whose keys are the
event ids that must be there.  Returns a hash reference:

  committed         expected event ids
  delivered         of those, how many are in Kafka
  missing           committed but not in Kafka (array reference)
  messages          messages read
  distinct          distinct event ids read
  duplicates        messages - distinct: copies a consumer must drop
  strangers         ids in Kafka that are not expected (array reference)
  order_violations  a consumer that drops ids it has seen sees an
                    aggregate's seq go back or repeat (seq <= the last
                    seq it saw for that aggregate)
  gaps              the same consumer sees a seq jump by more than one
  raw_backwards     seq going back in partition order counting the
                    duplicates (each re-sent page shows one)
  split             aggregates found in more than one partition
  no_seq            messages without an id, aggregate_id or seq header

Aggregates are told apart by topic, aggregate_type and aggregate_id;
messages are taken in partition, offset order.

=cut

sub drill_figures
{
	my ($msgs, $expected) = @_;
	my (%seen, %last, %raw_last, %parts);
	my %f = (
		committed => scalar(keys %$expected),
		messages => scalar(@$msgs),
		order_violations => 0,
		gaps => 0,
		raw_backwards => 0,
		no_seq => 0);

	my @sorted = sort {
		($a->{topic} // '') cmp($b->{topic} // '')
		  or $a->{partition} <=> $b->{partition}
		  or $a->{offset} <=> $b->{offset}
	} @$msgs;
	foreach my $m (@sorted)
	{
		my $h = $m->{headers};
		my ($id, $seq) = ($h->{id}, $h->{seq});

		if (!defined $id || !defined $seq || !defined $h->{aggregate_id})
		{
			$f{no_seq}++;
			next;
		}
		my $agg = join('/',
			$m->{topic} // '', $h->{aggregate_type} // '', $h->{aggregate_id});
		$parts{$agg}{ $m->{partition} } = 1;
		$f{raw_backwards}++
		  if defined $raw_last{$agg} && $seq < $raw_last{$agg};
		$raw_last{$agg} = $seq;
		next if $seen{$id}++;
		if (defined $last{$agg})
		{
			$f{order_violations}++ if $seq <= $last{$agg};
			$f{gaps}++ if $seq > $last{$agg} + 1;
		}
		$last{$agg} = $seq
		  if !defined $last{$agg} || $seq > $last{$agg};
	}
	$f{distinct} = scalar(keys %seen);
	$f{duplicates} = $f{messages} - $f{no_seq} - $f{distinct};
	$f{missing} = [ grep { !$seen{$_} } sort keys %$expected ];
	$f{delivered} = $f{committed} - scalar(@{ $f{missing} });
	$f{strangers} = [ grep { !exists $expected->{$_} } sort keys %seen ];
	$f{split} = scalar(grep { keys %{ $parts{$_} } > 1 } keys %parts);
	$f{aggregates} = scalar(keys %parts);
	return \%f;
}

=pod

=item report_figures(drill, figures [, extra])

Prints the figures with diag, one line, plus extra text.

=cut

sub report_figures
{
	my ($drill, $f, $extra) = @_;

	diag(
		sprintf(
			"%s: events committed %d, delivered %d, missing %d, messages %d, "
			  . "duplicates %d, order violations %d (gaps %d, raw seq steps back %d), "
			  . "aggregates %d%s",
			$drill, $f->{committed}, $f->{delivered},
			scalar(@{ $f->{missing} }), $f->{messages},
			$f->{duplicates}, $f->{order_violations},
			$f->{gaps}, $f->{raw_backwards},
			$f->{aggregates}, defined $extra ? "; $extra" : ''));
	return;
}

=pod

=item set_and_reload(node, dbname, setting, value [, log_regexp])

ALTER SYSTEM SET setting = 'value' (RESET when value is undef), reload,
and wait until the server log, from before the change, matches
log_regexp (when given).  Returns true unless that wait timed out.

=cut

sub set_and_reload
{
	my ($node, $dbname, $setting, $value, $log_re) = @_;
	my $offset = -s $node->logfile;

	if (defined $value)
	{
		$value =~ s/'/''/g;
		$node->safe_psql($dbname, "ALTER SYSTEM SET $setting = '$value'");
	}
	else
	{
		$node->safe_psql($dbname, "ALTER SYSTEM RESET $setting");
	}
	$node->safe_psql($dbname, 'SELECT pg_reload_conf()');
	return 1 unless defined $log_re;
	return defined wait_for_log_match($node, $log_re, $offset, 30);
}

=pod

=item relay_status(node, dbname)

outbox.status() as a hash reference (column => text value).

=cut

sub relay_status
{
	my ($node, $dbname) = @_;
	my $row = OutboxTest::query_json($node, $dbname,
		'SELECT row_to_json(s) FROM outbox.status() s');

	return $row // {};
}

=pod

=item explain_missing(node, dbname, ids)

When ids (event ids expected in Kafka and not found there) is not empty,
says with diag where the database has them: each of the first five ids'
row of outbox.events and whether it is held or dead-lettered, the relay's
progress row and status(), and the server log's last outbox lines.  A
test calls it before asserting that nothing is missing, so that a failure
in CI says where the events were.

=cut

sub explain_missing
{
	my ($node, $dbname, $ids) = @_;
	return unless @$ids;
	my @some = @$ids[ 0 .. ($#$ids < 4 ? $#$ids : 4) ];
	my $list = join(',', map { "'$_'" } @some);

	diag(scalar(@$ids) . " events missing from Kafka; where the database has the first of them:");
	diag($node->safe_psql(
			$dbname, qq{
SELECT e.event_id, e.id, e.txid, e.topic, e.created_at,
	   EXISTS (SELECT FROM outbox.held h WHERE h.id = e.id) AS held,
	   (SELECT d.state FROM outbox.dead_letters d WHERE d.event_id = e.event_id) AS dead_letter
  FROM outbox.events e WHERE e.event_id IN ($list) ORDER BY e.id}));
	diag($node->safe_psql($dbname,
		'SELECT relay, prev_snapshot, batch_snapshot, batch_last_id, published, batches FROM outbox.relay_progress'));
	my $status = relay_status($node, $dbname);
	diag(JSON::PP->new->canonical->encode($status));
	diag_outbox_log($node, 40);
	return;
}

=pod

=item diag_outbox_log(node, lines)

Says with diag the server log's last lines (at most lines of them) that
come from the relay or report an error.

=cut

sub diag_outbox_log
{
	my ($node, $lines) = @_;
	my @log = grep { /^\d{4}-\d\d-\d\d / && /outbox|ERROR|FATAL|PANIC/ && !/statement:/ }
	  split /\n/,
	  PostgreSQL::Test::Utils::slurp_file($node->logfile);
	diag(join("\n", @log[ ($#log > $lines ? $#log - $lines : 0) .. $#log ]));
	return;
}

=pod

=item kill_relay_when(node, dbname, progress, at, within, timeout)

kill -9 of dbname's relay once progress (a code reference returning a
count) reaches at, or after within seconds; then waits, up to timeout
seconds each, for the crash restart, the server answering and the relay
back.  Returns the count at the kill.

=cut

sub kill_relay_when
{
	my ($node, $dbname, $progress, $at, $within, $timeout) = @_;
	my $deadline = time() + $within;

	usleep(10_000) while $progress->() < $at && time() < $deadline;
	my $offset = -s $node->logfile;
	my $relay = relay_pid($node, $dbname);
	my $done = $progress->();
	kill('KILL', $relay) if defined $relay;
	wait_for_log_match($node, qr/all server processes terminated; reinitializing/,
		$offset, $timeout);
	poll_until($node, $dbname, 'SELECT 1', '1', $timeout);
	wait_for_relay($node, $dbname, $timeout);
	return $done;
}

=pod

=item server_crashed_since(node, offset)

The server log lines from byte offset on that show a backend crash or a
crash restart (empty when none).

=cut

sub server_crashed_since
{
	my ($node, $offset) = @_;
	my $log = slurp_file($node->logfile, $offset);

	return join "\n",
	  grep {
		/terminated by signal|exited with exit code [^01]|was terminated by|
		 all\ server\ processes\ terminated|server\ process.*crash|
		 PANIC:/x
	  } split /\n/, $log;
}

=pod

=back

=cut

package OutboxDrill::Load;

use strict;
use warnings;

use Carp;
use IPC::Run;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep time);

=pod

=head1 OutboxDrill::Load

=over

=item OutboxDrill::Load->start(node, dbname, %params)

Starts the load: pgbench (re-launched until the deadline if it ends
early, e.g. at a crash restart) running clients sessions at a total of
rate transactions per second for seconds.  Each transaction emits two
events of aggregate type drill for aggregates "<prefix><n>", n random in
1..aggregates (locked in a fixed order so emitters cannot deadlock; both
may be the same aggregate) and records their ids in drill_committed.
Params: seconds (30), rate (100), clients (4), aggregates (200), prefix
("a-"), payload_bytes (filler per payload, 50), types (["drill"]: with
several, each transaction draws one aggregate type, so under the default
template one topic, and emits its two events for aggregates of it),
script (a pgbench script of the caller's to run instead, with the same
loop, clients and rate).

=cut

sub start
{
	my ($class, $node, $dbname, %p) = @_;
	my $dir = PostgreSQL::Test::Utils::tempdir('load');
	my $seconds = $p{seconds} // 30;
	my $rate = $p{rate} // 100;
	my $clients = $p{clients} // 4;
	my $naggs = $p{aggregates} // 200;
	my $prefix = $p{prefix} // 'a-';
	my $filler = 'x' x ($p{payload_bytes} // 50);
	my @types = @{ $p{types} // ['drill'] };
	my $type_sql = @types == 1 ? "'$types[0]'"
	  : '(ARRAY[' . join(',', map { "'$_'" } @types) . '])[:t]';
	my $script = "$dir/load.sql";
	my $one = sub {
		my ($var) = @_;
		return
		    "INSERT INTO drill_committed (event_id, aggregate_id)"
		  . " SELECT outbox.emit($type_sql, '$prefix' || :$var, 'drill.ticked',"
		  . " jsonb_build_object('client', :client_id, 'n', :$var, 'filler', '$filler')),"
		  . " '$prefix' || :$var;\n";
	};

	my $draw_type = @types > 1 ? "\\set t random(1, " . scalar(@types) . ")\n" : '';
	open my $fh, '>', $script or croak "could not write $script: $!";
	print $fh $draw_type
	  . "\\set a random(1, $naggs)\n\\set b random(1, $naggs)\n"
	  . "\\set lo least(:a, :b)\n\\set hi greatest(:a, :b)\n"
	  . "BEGIN;\n"
	  . $one->('lo')
	  . $one->('hi')
	  . "COMMIT;\n";
	close $fh;
	if (defined $p{script})
	{
		open $fh, '>', $script or croak "could not write $script: $!";
		print $fh $p{script};
		close $fh;
	}

	# the loop ends at the deadline; each pgbench run gets what is left
	my $loop = sprintf(
		q{end=$(( $(date +%%s) + %d ));
while [ "$(date +%%s)" -lt "$end" ]; do
	left=$(( end - $(date +%%s) ))
	pgbench -n -h '%s' -p %d -c %d -j %d -T "$left" -R %d -f '%s' '%s' >> '%s/pgbench.out' 2>> '%s/pgbench.err'
	echo "exit $?" >> '%s/pgbench.out'
	sleep 0.2
done},
		$seconds, $node->host, $node->port, $clients,
		($clients > 1 ? 2 : 1), $rate, $script, $dbname, $dir, $dir, $dir);

	my $self = bless {
		dir => $dir,
		seconds => $seconds,
		started => time(),
		node => $node,
		dbname => $dbname,
	}, $class;
	$self->{handle} = IPC::Run::start([ 'bash', '-c', $loop ],
		'<', \undef, '>', \$self->{out}, '2>', \$self->{err});
	note "load: $clients clients, $rate transactions/s (2 events each), $seconds s,"
	  . " $naggs aggregates $prefix*" . (@types > 1 ? " of each type (@types)" : '');
	return $self;
}

=pod

=item $load->finish

Waits for the load to end (its deadline plus a margin) and returns the
number of transactions pgbench reports as processed over all its runs.

=cut

sub finish
{
	my ($self) = @_;
	my $margin = $self->{seconds} - (time() - $self->{started}) + 60;

	eval {
		$self->{handle}->finish(IPC::Run::timeout($margin > 60 ? $margin : 60));
		1;
	} or do {
		diag "load did not end in time: $@";
		$self->{handle}->kill_kill;
	};
	my $out = -e "$self->{dir}/pgbench.out" ? slurp_file("$self->{dir}/pgbench.out") : '';
	my $processed = 0;
	$processed += $1 while $out =~ /number of transactions actually processed: (\d+)/g;
	my $runs = () = $out =~ /^exit /mg;
	note "load ended after $runs pgbench run(s), $processed transactions";
	return $processed;
}

=pod

=item $load->errors

What pgbench wrote on stderr (connection failures around a crash
restart land here).

=cut

sub errors
{
	my ($self) = @_;
	my $file = "$self->{dir}/pgbench.err";

	return -e $file ? slurp_file($file) : '';
}

=pod

=back

=cut

1;

# ---------------------------------------------------------------------------
# The partition-hold drills (112, 309): where a key lands, a consumer that
# notes when each event arrives, latency percentiles, and the relay's holds
# as its own functions and its log show them.

package OutboxDrill;

use strict;
use warnings;

# appended after the list above, so that the subs above stay as they were
push @OutboxDrill::EXPORT, qw(
  java_partition
  percentile
  commit_times
  holds_of
  held_metrics
  hold_log_lines
  probe_ids
  note_duplicates
);

=pod

=head1 PARTITION HOLDS

=over

=item java_partition(key, partitions)

The partition Java's default partitioner (and librdkafka's murmur2 and
murmur2_random, for a non-empty key) gives key: murmur2 of its bytes,
made positive, modulo partitions.  Computed here, not asked of a client,
so that a drill can choose keys for a partition before any is sent.

=cut

# (a * b) mod 2^32 without leaving the range where Perl's numbers are exact
sub mul32
{
	my ($a, $b) = @_;

	return (($a * ($b & 0xffff)) + ((($a * ($b >> 16)) & 0xffff) << 16))
	  & 0xffffffff;
}

sub murmur2
{
	my ($data) = @_;
	my $m = 0x5bd1e995;

	utf8::encode($data) if utf8::is_utf8($data);
	my @b = unpack('C*', $data);
	my $h = (0x9747b28c ^ scalar(@b)) & 0xffffffff;
	my $i = 0;
	for (; $i + 4 <= @b; $i += 4)
	{
		my $k = $b[$i] | ($b[ $i + 1 ] << 8) | ($b[ $i + 2 ] << 16)
		  | ($b[ $i + 3 ] << 24);
		$k = mul32($k, $m);
		$k ^= $k >> 24;
		$k = mul32($k, $m);
		$h = mul32($h, $m) ^ $k;
	}
	my $rest = @b - $i;
	$h ^= $b[ $i + 2 ] << 16 if $rest >= 3;
	$h ^= $b[ $i + 1 ] << 8 if $rest >= 2;
	$h = mul32($h ^ $b[$i], $m) if $rest >= 1;
	$h ^= $h >> 13;
	$h = mul32($h, $m);
	$h ^= $h >> 15;
	return $h;
}

sub java_partition
{
	my ($key, $partitions) = @_;

	return (murmur2($key) & 0x7fffffff) % $partitions;
}

=pod

=item percentile(values, p)

The p-th percentile (nearest rank) of the numbers in the array
reference values; undef when it is empty.

=cut

sub percentile
{
	my ($values, $p) = @_;
	my @sorted = sort { $a <=> $b } @$values;

	return undef unless @sorted;
	my $rank = int($p / 100 * @sorted + 0.999999);
	$rank = 1 if $rank < 1;
	return $sorted[ $rank - 1 ];
}

=pod

=item commit_times(node, dbname [, where])

A hash reference: event id => when the application committed it
(drill_committed.committed_at, Unix seconds), for the rows matching the
SQL condition where, when given.

=cut

sub commit_times
{
	my ($node, $dbname, $where) = @_;
	my $out = $node->safe_psql($dbname,
		    'SELECT event_id, extract(epoch FROM committed_at) FROM drill_committed'
		  . (defined $where ? " WHERE $where" : ''));
	my %t;

	foreach my $line (split /\n/, $out)
	{
		my ($id, $at) = split /\|/, $line;
		$t{$id} = $at;
	}
	return \%t;
}

=pod

=item holds_of(node, dbname)

outbox.holds() as an array reference of hashes { topic, kafka_partition,
events, held_since }, in topic and partition order.

=cut

sub holds_of
{
	my ($node, $dbname) = @_;

	return OutboxTest::query_json($node, $dbname,
		q{SELECT coalesce(json_agg(h ORDER BY h.topic, h.kafka_partition), '[]')
  FROM outbox.holds() h});
}

=pod

=item held_metrics(node, dbname)

What outbox.metrics() says of holds: { partitions =>
outbox_held_partitions, oldest => outbox_held_oldest_seconds (each undef
when absent), events => { "topic/partition" => outbox_held_events } }.

=cut

sub held_metrics
{
	my ($node, $dbname) = @_;
	my $text = $node->safe_psql($dbname, 'SELECT outbox.metrics()');
	my %m = (events => {});

	foreach my $line (split /\n/, $text)
	{
		if ($line =~ /^outbox_held_partitions\{[^}]*\} (\S+)$/)
		{
			$m{partitions} = $1;
		}
		elsif ($line =~ /^outbox_held_oldest_seconds\{[^}]*\} (\S+)$/)
		{
			$m{oldest} = $1;
		}
		elsif ($line =~
			/^outbox_held_events\{(?=[^}]*topic="([^"]*)")(?=[^}]*partition="(\d+)")[^}]*\} (\S+)$/
		  )
		{
			$m{events}{"$1/$2"} = $3;
		}
	}
	return \%m;
}

=pod

=item probe_ids(node, dbname)

A hash reference whose keys are the event ids of the oldest held event of
each held partition: the one the relay probes the partition with, and
the first of its drain.

=cut

sub probe_ids
{
	my ($node, $dbname) = @_;
	my $out = $node->safe_psql(
		$dbname, q{
SELECT e.event_id FROM outbox.events e
 WHERE e.id IN (SELECT min(id) FROM outbox.held GROUP BY topic, kafka_partition)});

	return { map { $_ => 1 } split /\n/, $out };
}

=pod

=item note_duplicates(what, messages, probes)

Notes how many events the messages hold more than once, and how many of
those are among the keys of probes (probe_ids taken before the drain):
a duplicate per hold points at the probe being sent again.

=cut

sub note_duplicates
{
	my ($what, $msgs, $probes) = @_;
	my $copies = OutboxTest::event_ids_of($msgs);
	my @dup = grep { $copies->{$_} > 1 } keys %$copies;

	note sprintf('%s: %d events arrived more than once, %d of them a hold\'s probe (%d holds)',
		$what, scalar(@dup), scalar(grep { $probes->{$_} } @dup),
		scalar(keys %$probes));
	return;
}

=pod

=item hold_log_lines(node, offset)

The relay's hold lines in the server log from byte offset on: { holding
=> { "topic/partition" => lines }, released => { ... } }.

=cut

sub hold_log_lines
{
	my ($node, $offset) = @_;
	my $log = PostgreSQL::Test::Utils::slurp_file($node->logfile, $offset);
	my %l = (holding => {}, released => {});

	while ($log =~ /outbox relay: (holding|released) topic "([^"]*)" partition (\d+)/g)
	{
		$l{$1}{"$2/$3"}++;
	}
	return \%l;
}

=pod

=back

=cut

package OutboxDrill::Tail;

use strict;
use warnings;

use Carp;
use IPC::Run;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);

my @tails;

=pod

=head1 OutboxDrill::Tail

=over

=item OutboxDrill::Tail->start(broker, topic)

A kcat consumer of topic from its beginning, left running, whose every
message line is stamped with the time it reached this machine's reader
(a second process reads kcat's unbuffered output and writes the time in
front of each line to a file).  Latency measured on it is what a
consumer sees, not what the producer was told.  Stopped at END.

=cut

sub start
{
	my ($class, $broker, $topic) = @_;
	my $dir = PostgreSQL::Test::Utils::tempdir('tail');
	my $boot = ref $broker ? $broker->bootstrap : $broker;
	my $self = bless { dir => $dir, file => "$dir/arrivals", topic => $topic },
	  $class;

	# short fetch waits and backoffs: an idle partition must not make the
	# next message wait for the consumer's own timers
	my @kcat = (
		'kcat', '-C', '-u', '-q', '-b', $boot, '-t', $topic,
		'-o', 'beginning',
		'-X', 'fetch.wait.max.ms=20',
		'-X', 'fetch.error.backoff.ms=20',
		'-X', 'reconnect.backoff.ms=50',
		'-X', 'reconnect.backoff.max.ms=500',
		'-f', '%p %o %h\n');
	my @stamp = ($^X, '-MTime::HiRes=time', '-ne',
		'BEGIN { $| = 1 } printf "%.6f %s", time, $_');
	$self->{handle} = IPC::Run::start(\@kcat, '<', \undef, '2>', "$dir/kcat.err",
		'|', \@stamp, '>', $self->{file});
	push @tails, $self;
	note "tail consumer on $topic";
	return $self;
}

=pod

=item $tail->arrivals

A hash reference: event id (the "id" header) => { at (first arrival, Unix
seconds), partition, copies }.

=cut

sub arrivals
{
	my ($self) = @_;
	my %a;

	open my $fh, '<', $self->{file} or return {};
	while (my $line = <$fh>)
	{
		# an unfinished last line is read at the next call
		last unless $line =~ /\n\z/;
		my ($at, $part, $offset, $hdrs) = $line =~ /^(\S+) (\d+) (\d+) (.*)$/
		  or next;
		my ($id) = $hdrs =~ /(?:^|,)id=([^,]+)/ or next;
		if ($a{$id})
		{
			$a{$id}{copies}++;
			next;
		}
		$a{$id} = { at => $at, partition => $part + 0, copies => 1 };
	}
	return \%a;
}

=pod

=item $tail->wait_for(ids [, timeout])

Waits until every id of the array reference ids has arrived; returns
arrivals.  On timeout it fails the test and returns what arrived.

=cut

sub wait_for
{
	my ($self, $ids, $timeout) = @_;
	my $deadline = time() + ($timeout // 60);
	my ($a, @missing);

	while (1)
	{
		$a = $self->arrivals;
		@missing = grep { !$a->{$_} } @$ids;
		return $a unless @missing;
		last if time() > $deadline;
		select(undef, undef, undef, 0.2);
	}
	fail("the tail consumer of $self->{topic} sees all " . scalar(@$ids)
		  . " events (missing " . scalar(@missing) . ", e.g. $missing[0])");
	return $a;
}

=pod

=item $tail->stop

Stops kcat and the stamping reader.

=cut

sub stop
{
	my ($self) = @_;

	return unless $self->{handle};
	$self->{handle}->kill_kill(grace => 2);
	delete $self->{handle};
	@tails = grep { $_ != $self } @tails;
	return;
}

END
{
	my $status = $?;
	my @all = @tails;
	$_->stop foreach @all;
	$? = $status;
}

=pod

=back

=cut

1;
