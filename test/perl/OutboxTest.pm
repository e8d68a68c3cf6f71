# test/perl/OutboxTest.pm: helpers shared by the TAP tests (test tool only,
# never installed).

=pod

=head1 NAME

OutboxTest - what the outbox TAP tests share: a mock Kafka cluster, a
server with the relay preloaded, and reading topics back with kcat

=head1 SYNOPSIS

  use OutboxTest;

  my $kafka = OutboxTest::Broker->start(brokers => 3);
  my $node = outbox_node('main', $kafka);
  $node->safe_psql('postgres', 'CREATE EXTENSION outbox');
  my $pid = wait_for_relay($node, 'postgres');
  $kafka->command('rtt all 20');
  my $msgs = wait_for_messages($kafka, 'outbox.event.order', 10);

=head1 DESCRIPTION

The relay is only ever checked from the outside: topics are read back with
kcat, a client that shares no code with the relay.  Every wait has a
timeout and reports what it last saw when it runs out.

=cut

package OutboxTest;

use strict;
use warnings;

use Carp;
use Exporter 'import';
use IPC::Run;
use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep time);

our @EXPORT = qw(
  outbox_node
  read_topic
  wait_for_messages
  wait_for_events
  event_ids_of
  relay_pid
  relay_pids
  wait_for_relay
  wait_for_no_relay
  wait_for_log_match
  poll_until
  proc_status_kb
  relay_state_is
  query_json
  insert_event_sql
  mock_topic_errors_crash
);

# librdkafka settings that make a test notice a broker change quickly
our $TEST_KAFKA_CONFIG =
  'reconnect.backoff.ms=50;reconnect.backoff.max.ms=500;retry.backoff.ms=100';

# how long a wait may take before the test fails
our $WAIT_TIMEOUT = 60;

=pod

=item mock_topic_errors_crash()

The librdkafka version this machine builds against (pkg-config) when it is
one that crashes on a topic-level error in the test broker's metadata
answers, else the empty string.  The mock answers such an error together
with the topic's partitions (a real broker sends none), and librdkafka from
2.8.0 up to 2.10.0 (its issue 4907, fixed in 2.10.0) then dereferences a
partition it has not set up, in its main thread: seen with trixie's 2.8.0,
not with bookworm's 2.0.2 nor sid's 2.14.2.  Tests leave such drills out
there; the same refusals from a real broker are the 3xx files'.

=cut

sub mock_topic_errors_crash
{
	my $v = `pkg-config --modversion rdkafka 2>/dev/null`;
	chomp $v;
	my ($maj, $min) = $v =~ /^(\d+)\.(\d+)/ or return '';
	my $n = $maj * 100 + $min;
	return ($n >= 208 && $n < 210) ? $v : '';
}

# "%p %o %T %K %S|<key>|<payload>|<headers>\n": the lengths make key and payload
# safe to contain any byte; headers run to the end of the line
my $KCAT_FORMAT = '%p %o %T %K %S|%k|%s|%h\n';

=pod

=head1 FUNCTIONS

=over

=item outbox_node(name, broker, %params)

A started server with shared_preload_libraries = 'outbox', publishing to
broker (an OutboxTest::Broker or a bootstrap string), polling every
100 ms.  Params: allows_streaming, conf (more postgresql.conf lines),
kafka_config (replaces the test librdkafka settings), start => 0.  Its
databases are UTF8 with the C locale whatever the environment says (a
fresh machine may have no locale set, and initdb would then pick
SQL_ASCII).

=cut

sub outbox_node
{
	my ($name, $broker, %params) = @_;
	my $node = PostgreSQL::Test::Cluster->new($name);
	my $boot = ref $broker ? $broker->bootstrap : $broker;
	my $kconf = $params{kafka_config} // $TEST_KAFKA_CONFIG;

	$node->init(
		allows_streaming => $params{allows_streaming} // 0,
		extra => [ '--encoding=UTF8', '--locale=C' ]);
	$node->append_conf(
		'postgresql.conf', qq{
shared_preload_libraries = 'outbox'
outbox.kafka_brokers = '$boot'
outbox.kafka_config = '$kconf'
outbox.poll_interval = '100ms'
max_worker_processes = 16
});
	$node->append_conf('postgresql.conf', $params{conf})
	  if defined $params{conf};
	$node->start unless defined $params{start} && !$params{start};
	return $node;
}

=pod

=item read_topic(broker, topic [, isolation => level])

Every message of topic, from the beginning, read with kcat
(isolation.level read_committed, or isolation => 'read_uncommitted').  Returns an
array reference of hashes { partition, offset, timestamp (the record's,
ms since 1970), key, value, headers (name => value, the last of each
name), header_list ([name, value] pairs in order) } sorted by partition and
offset, or undef when kcat fails.
kcat prints headers bare, as name=value,name=value: a value must not
contain a newline, nor a comma followed by something=.

=cut

sub read_topic
{
	my ($broker, $topic, %opt) = @_;
	my $boot = ref $broker ? $broker->bootstrap : $broker;
	my ($out, $err) = ('', '');
	my @cmd = (
		'kcat', '-C', '-b', $boot, '-t', $topic, '-o', 'beginning',
		'-e', '-q', '-f', $KCAT_FORMAT,
		'-X', 'isolation.level=' . ($opt{isolation} // 'read_committed'));

	my $ok = eval {
		IPC::Run::run(\@cmd, '<', \undef, '>', \$out, '2>', \$err,
			IPC::Run::timeout($WAIT_TIMEOUT));
	};
	if (!$ok)
	{
		note "kcat failed on topic $topic: " . ($@ || $err);
		return undef;
	}
	return parse_kcat($out);
}

# Parse the output of $KCAT_FORMAT; dies on anything else.
sub parse_kcat
{
	my ($out) = @_;
	my @msgs;
	my $pos = 0;

	while ($pos < length($out))
	{
		my ($part, $offset, $ts, $klen, $vlen) =
		  substr($out, $pos, 200) =~ /^(\d+) (\d+) (-?\d+) (-?\d+) (-?\d+)\|/
		  or croak "unexpected kcat output at byte $pos: "
		  . substr($out, $pos, 80);
		my %m = (partition => $part + 0, offset => $offset + 0, timestamp => $ts + 0);

		$pos += length("$part $offset $ts $klen $vlen|");
		$m{key} = $klen < 0 ? undef : substr($out, $pos, $klen);
		$pos += ($klen < 0 ? 0 : $klen);
		substr($out, $pos++, 1) eq '|' or croak "kcat key not followed by |";
		$m{value} = $vlen < 0 ? undef : substr($out, $pos, $vlen);
		$pos += ($vlen < 0 ? 0 : $vlen);
		substr($out, $pos++, 1) eq '|'
		  or croak "kcat value not followed by |";
		my $nl = index($out, "\n", $pos);
		$nl >= 0 or croak "kcat headers not ended by a newline";
		my $hdrs = substr($out, $pos, $nl - $pos);
		$pos = $nl + 1;

		$m{header_list} = [];
		$m{headers} = {};
		# a comma starts the next header only when "name=" follows it
		foreach my $h (split /,(?=[^,=]+=)/, $hdrs)
		{
			my ($name, $value) = split /=/, $h, 2;
			push @{ $m{header_list} }, [ $name, $value ];
			$m{headers}{$name} = $value;
		}
		push @msgs, \%m;
	}
	@msgs = sort {
		$a->{partition} <=> $b->{partition}
		  or $a->{offset} <=> $b->{offset}
	} @msgs;
	return \@msgs;
}

=pod

=item wait_for_messages(broker, topic, n [, timeout])

Reads topic until it holds at least n messages and returns them; on
timeout fails the test and returns what it last read.

=cut

sub wait_for_messages
{
	my ($broker, $topic, $n, $timeout) = @_;
	my $deadline = time() + ($timeout // $WAIT_TIMEOUT);
	my $msgs = [];

	while (1)
	{
		$msgs = read_topic($broker, $topic) // $msgs;
		return $msgs if @$msgs >= $n;
		last if time() > $deadline;
		usleep(200_000);
	}
	fail("topic $topic reaches $n messages (it has " . scalar(@$msgs) . ")");
	return $msgs;
}

=pod

=item wait_for_events(broker, topic, ids [, timeout])

Reads topic until every event id in the array ids appears in an "id"
header and returns all messages; on timeout fails the test, names some
missing ids and returns what it last read.

=cut

sub wait_for_events
{
	my ($broker, $topic, $ids, $timeout) = @_;
	my $deadline = time() + ($timeout // $WAIT_TIMEOUT);
	my $msgs = [];
	my @missing;

	while (1)
	{
		$msgs = read_topic($broker, $topic) // $msgs;
		my %seen = map { ($_->{headers}{id} // '') => 1 } @$msgs;
		@missing = grep { !$seen{$_} } @$ids;
		return $msgs unless @missing;
		last if time() > $deadline;
		usleep(200_000);
	}
	fail(   "topic $topic receives all "
		  . scalar(@$ids)
		  . " events (missing "
		  . scalar(@missing) . ", e.g. "
		  . join(', ', @missing[ 0 .. ($#missing < 4 ? $#missing : 4) ])
		  . ")");
	return $msgs;
}

=pod

=item event_ids_of(messages)

A hash reference: event id (the "id" header) => how many times it appears.

=cut

sub event_ids_of
{
	my ($msgs) = @_;
	my %count;

	$count{ $_->{headers}{id} // '' }++ foreach @$msgs;
	return \%count;
}

=pod

=item query_json(node, dbname, query)

Runs a query whose single result is JSON text and returns it decoded.

=cut

sub query_json
{
	my ($node, $dbname, $query) = @_;
	my $text = $node->safe_psql($dbname, $query);

	return decode_json($text eq '' ? 'null' : $text);
}

=pod

=item relay_pids(node [, dbname])

The pids of 'outbox relay' backends (of dbname only, when given).

=item relay_pid(node, dbname)

The pid of dbname's relay, or undef when none runs.

=cut

sub relay_pids_query
{
	my ($dbname) = @_;
	my $where = "backend_type = 'outbox relay'";

	$where .= " AND datname = '$dbname'" if defined $dbname;
	return "SELECT pid FROM pg_stat_activity WHERE $where ORDER BY pid";
}

# the pids of relay_pids_query's output
sub pid_lines
{
	my ($out) = @_;
	return grep { $_ ne '' } split /\n/, $out;
}

# the one relay of dbname among pids, or undef
sub one_relay
{
	my ($dbname, @pids) = @_;

	croak "more than one relay for database $dbname: @pids" if @pids > 1;
	return $pids[0];
}

sub relay_pids
{
	my ($node, $dbname) = @_;

	return pid_lines($node->safe_psql('postgres', relay_pids_query($dbname)));
}

# the relay's pid for the waits: (1, pid or undef), or (0) while the
# server does not answer (restarting after a crash)
sub try_relay_pid
{
	my ($node, $dbname) = @_;
	my ($ret, $out) = try_psql($node, 'postgres', relay_pids_query($dbname));

	return (0) if $ret != 0;
	return (1, one_relay($dbname, pid_lines($out)));
}

sub relay_pid
{
	my ($node, $dbname) = @_;

	return one_relay($dbname, relay_pids($node, $dbname));
}

=pod

=item wait_for_relay(node, dbname [, timeout [, not_pid]])

Polls pg_stat_activity every 50 ms until dbname has a relay (other than
not_pid).  Returns (pid, seconds waited), or just the pid in scalar
context; pid is undef on timeout.

=cut

sub wait_for_relay
{
	my ($node, $dbname, $timeout, $not_pid) = @_;
	my $start = time();
	my $deadline = $start + ($timeout // $WAIT_TIMEOUT);
	my $pid;

	while (1)
	{
		my $answered;
		($answered, $pid) = try_relay_pid($node, $dbname);
		last if defined $pid && (!defined $not_pid || $pid != $not_pid);
		$pid = undef;
		last if time() > $deadline;
		usleep(50_000);
	}
	return wantarray ? ($pid, time() - $start) : $pid;
}

=pod

=item wait_for_no_relay(node, dbname [, timeout])

Polls until dbname has no relay.  Returns (true if none, seconds waited),
or just the first in scalar context.

=cut

sub wait_for_no_relay
{
	my ($node, $dbname, $timeout) = @_;
	my $start = time();
	my $deadline = $start + ($timeout // $WAIT_TIMEOUT);
	my $gone;

	while (1)
	{
		my ($answered, $pid) = try_relay_pid($node, $dbname);
		$gone = $answered && !defined $pid;
		last if $gone || time() > $deadline;
		usleep(50_000);
	}
	return wantarray ? ($gone ? 1 : 0, time() - $start) : ($gone ? 1 : 0);
}

=pod

=item wait_for_log_match(node, regexp, offset [, timeout])

Waits until the server log, from byte offset on, matches regexp.  Returns
the log's length then, or undef on timeout (shorter than the
PostgreSQL::Test::Cluster one, so that a test fails instead of hanging).

=cut

sub wait_for_log_match
{
	my ($node, $re, $offset, $timeout) = @_;
	my $deadline = time() + ($timeout // $WAIT_TIMEOUT);

	while (1)
	{
		my $log = PostgreSQL::Test::Utils::slurp_file($node->logfile, $offset);
		return $offset + length($log) if $log =~ $re;
		return undef if time() > $deadline;
		usleep(100_000);
	}
}

=pod

=item try_psql(node, dbname, query)

$node->psql() for loops that wait through a restart: returns (exit code,
stdout, stderr), and an attempt IPC::Run gives up on counts as a failed
one.  Cluster::psql writes the query to psql's stdin; a psql that exits
before reading it (the server is restarting after a crash, or refuses the
connection) leaves that write a broken pipe, which IPC::Run raises and
Cluster::psql raises again: the test would die with EPIPE (exit code 32).

=cut

sub try_psql
{
	my ($node, $dbname, $query) = @_;
	my @r = eval { $node->psql($dbname, $query) };

	return @r if @r;
	return (1, '', "psql gave up: $@");
}

=pod

=item proc_status_kb(pid, field)

A field of /proc/pid/status counted in kB (RssAnon, RssShmem,
HugetlbPages, ...); undef if the process or the field is not there.

=cut

sub proc_status_kb
{
	my ($pid, $field) = @_;
	open(my $fh, '<', "/proc/$pid/status") or return undef;
	my ($kb) = join('', <$fh>) =~ /^\Q$field\E:\s+(\d+) kB/m;
	close $fh;
	return $kb;
}

=pod

=item poll_until(node, dbname, query, expected [, timeout])

Runs query every 100 ms until it returns expected (errors count as not
yet).  Returns true if it did before the timeout.

=cut

sub poll_until
{
	my ($node, $dbname, $query, $expected, $timeout) = @_;
	my $deadline = time() + ($timeout // $WAIT_TIMEOUT);
	my $last = '';

	while (1)
	{
		my ($ret, $out, $err) = try_psql($node, $dbname, $query);
		return 1 if $ret == 0 && $out eq $expected;
		$last = $ret == 0 ? $out : $err;
		last if time() > $deadline;
		usleep(100_000);
	}
	note "\"$query\" still returns \"$last\", not \"$expected\"";
	return 0;
}

=pod

=item relay_state_is(node, dbname, state [, timeout])

Waits until outbox.status() in dbname reports the relay in state
("running", "paused", ...).  Returns true if it did.

=cut

sub relay_state_is
{
	my ($node, $dbname, $state, $timeout) = @_;

	return poll_until($node, $dbname, 'SELECT state FROM outbox.status()',
		$state, $timeout // 15);
}

=pod

=item insert_event_sql(aggregate_type, aggregate_id, event_type, payload_sql [, topic])

SQL (a superuser's) that writes an event row the way emit() does (counter
upsert, seq, topic from outbox.topic_template unless given, key = aggregate
id), without emit()'s checks, and returns its event id.  For events emit()
refuses, such as one larger than message.max.bytes, that a relay must still
handle: rows written before a limit was lowered, or inserted without emit()
(the safety poll finds them).  payload_sql is an SQL expression.

=cut

sub insert_event_sql
{
	my ($type, $id, $event_type, $payload_sql, $topic) = @_;
	my $topic_sql =
	  defined $topic
	  ? "'$topic'"
	  : "replace(replace(current_setting('outbox.topic_template'), '{aggregate_type}', '$type'), '{event_type}', '$event_type')";

	return qq{WITH s AS (
 INSERT INTO outbox.aggregates AS a (aggregate_type, aggregate_id, last_seq)
 VALUES ('$type', '$id', 1)
 ON CONFLICT (aggregate_type, aggregate_id) DO UPDATE SET last_seq = a.last_seq + 1
 RETURNING a.last_seq)
INSERT INTO outbox.events (event_id, aggregate_type, aggregate_id, seq, event_type,
 topic, key, payload, occurred_at)
SELECT outbox.uuid_v7(), '$type', '$id', s.last_seq, '$event_type', $topic_sql,
 '$id', $payload_sql, now() FROM s
RETURNING event_id};
}

=pod

=back

=cut

package OutboxTest::Broker;

use strict;
use warnings;

use Carp;
use Fcntl qw(O_WRONLY O_NONBLOCK);
use POSIX qw(WNOHANG);
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep time);

my @running;

=pod

=head1 OutboxTest::Broker

=over

=item OutboxTest::Broker->start(brokers => N, args => [...])

Starts test/broker/outbox_test_broker (or $ENV{OUTBOX_TEST_BROKER}) with N
brokers, its control FIFO and bootstrap file in a fresh temporary
directory, and waits for the bootstrap file.  It is stopped at END.

=cut

sub start
{
	my ($class, %params) = @_;
	my $dir = PostgreSQL::Test::Utils::tempdir('kafka');
	my $prog = $ENV{OUTBOX_TEST_BROKER} // 'test/broker/outbox_test_broker';
	my $self = bless {
		dir => $dir,
		fifo => "$dir/control",
		bootfile => "$dir/bootstrap",
		out => "$dir/broker.out",
		err => "$dir/broker.err",
		acked => 1,    # lines of stdout consumed; the first is the bootstrap
	}, $class;

	-x $prog or BAIL_OUT("$prog is missing: run make -C test/broker");
	my @cmd = (
		$prog, '-b', $params{brokers} // 3,
		'-c', $self->{fifo}, '-f', $self->{bootfile},
		@{ $params{args} // [] });
	my $pid = fork();
	defined $pid or BAIL_OUT("fork failed: $!");
	if ($pid == 0)
	{
		open(STDIN, '<', '/dev/null');
		open(STDOUT, '>', $self->{out});
		open(STDERR, '>', $self->{err});
		exec { $cmd[0] } @cmd or POSIX::_exit(127);
	}
	$self->{pid} = $pid;
	push @running, $self;

	my $deadline = time() + 30;
	until (-s $self->{bootfile})
	{
		BAIL_OUT("test broker did not start: " . slurp_or_empty($self->{err}))
		  if time() > $deadline || !$self->alive;
		usleep(20_000);
	}
	$self->{bootstrap} = slurp_file($self->{bootfile});
	chomp $self->{bootstrap};
	note "test broker $self->{bootstrap}";
	return $self;
}

sub slurp_or_empty
{
	my ($file) = @_;
	return -e $file ? slurp_file($file) : '';
}

=pod

=item $broker->bootstrap

The bootstrap list, "127.0.0.1:port,...".

=cut

sub bootstrap
{
	my ($self) = @_;
	return $self->{bootstrap};
}

=pod

=item $broker->command(line)

Sends one command on the control FIFO and waits for its answer.  Returns
the answer; dies unless it starts with "ok".

=cut

sub command
{
	my ($self, $line) = @_;
	my $deadline = time() + 30;
	my $fh;

	# O_NONBLOCK: fail instead of hanging if the broker is not reading
	until (sysopen($fh, $self->{fifo}, O_WRONLY | O_NONBLOCK))
	{
		croak "test broker control FIFO not open: $!" if time() > $deadline;
		usleep(20_000);
	}
	syswrite($fh, "$line\n") == length("$line\n")
	  or croak "could not write to the test broker: $!";
	close $fh;

	while (1)
	{
		my @lines = split /\n/, slurp_or_empty($self->{out});
		if (@lines > $self->{acked})
		{
			my $answer = $lines[ $self->{acked}++ ];
			note "test broker: $line -> $answer";
			croak "test broker refused \"$line\": $answer"
			  unless $answer =~ /^ok\b/;
			return $answer;
		}
		croak "test broker did not answer \"$line\"" if time() > $deadline;
		usleep(20_000);
	}
}

=pod

=item $broker->stop

SIGTERM, then wait for the process.

=cut

sub stop
{
	my ($self) = @_;
	my $deadline = time() + 10;

	return unless defined $self->{pid};
	kill 'TERM', $self->{pid};
	while ($self->alive)
	{
		if (time() > $deadline)
		{
			kill 'KILL', $self->{pid};
			waitpid($self->{pid}, 0);
			last;
		}
		usleep(20_000);
	}
	delete $self->{pid};
	@running = grep { $_ != $self } @running;
	return;
}

=pod

=item $broker->alive

Whether the broker process still runs (reaps it when it has exited).

=cut

sub alive
{
	my ($self) = @_;

	return 0 unless defined $self->{pid};
	return waitpid($self->{pid}, WNOHANG) == 0;
}

END
{
	# keep the test's exit status: waitpid() sets $?
	my $status = $?;
	# stop() takes each broker off @running: walk a copy
	my @all = @running;
	$_->stop foreach @all;
	$? = $status;
}

=pod

=back

=cut

1;
