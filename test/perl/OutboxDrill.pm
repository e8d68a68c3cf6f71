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
("a-"), payload_bytes (filler per payload, 50).

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
	my $script = "$dir/load.sql";
	my $one = sub {
		my ($var) = @_;
		return
		    "INSERT INTO drill_committed (event_id, aggregate_id)"
		  . " SELECT outbox.emit('drill', '$prefix' || :$var, 'drill.ticked',"
		  . " jsonb_build_object('client', :client_id, 'n', :$var, 'filler', '$filler')),"
		  . " '$prefix' || :$var;\n";
	};

	open my $fh, '>', $script or croak "could not write $script: $!";
	print $fh "\\set a random(1, $naggs)\n\\set b random(1, $naggs)\n"
	  . "\\set lo least(:a, :b)\n\\set hi greatest(:a, :b)\n"
	  . "BEGIN;\n"
	  . $one->('lo')
	  . $one->('hi')
	  . "COMMIT;\n";
	close $fh;

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
	  . " $naggs aggregates $prefix*";
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
