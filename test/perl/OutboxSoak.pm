# test/perl/OutboxSoak.pm: what the soak (test/soak/soak.pl) records while
# it runs and writes when it ends: samples of the server every few seconds,
# latency per minute, duplicates per fault, a CSV of each, gnuplot charts
# with the faults marked, and the summary (test tool only, never installed).

=pod

=head1 NAME

OutboxSoak - the soak's figures over time, its files and its charts

=head1 SYNOPSIS

  my $s = OutboxSoak::Sampler->new($node, 'postgres', $t0, every => 10);
  $s->sample while ...;          # takes one when due
  my $arr = tail_copies(\%state, @tails); # every copy's arrival, by event id
  my $lat = latency_by_minute($committed_at, $arr->{first}, $t0);
  write_csv("$out/samples.csv", [qw(t backlog ...)], $s->rows);
  charts($out, $faults);

=cut

package OutboxSoak;

use strict;
use warnings;

use Carp;
use Exporter 'import';
use POSIX ();
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);

use OutboxTest;

our @EXPORT = qw(
  tail_copies
  latency_by_minute
  duplicates_by_fault
  write_csv
  charts
  percentile_of
);

our @SAMPLE_COLUMNS = qw(t_min backlog oldest_s relay_rss_mb worker_rss_mb
  relay_cpu_pct worker_cpu_pct events_mb wal_mb_per_min);

=pod

=head1 FUNCTIONS

=over

=item percentile_of(sorted, p)

The p-th percentile (nearest rank) of a sorted array reference; undef
when it is empty.

=cut

sub percentile_of
{
	my ($sorted, $p) = @_;
	return undef unless @$sorted;
	my $rank = int($p / 100 * @$sorted + 0.999999) - 1;
	$rank = 0 if $rank < 0;
	return $sorted->[ $rank > $#$sorted ? $#$sorted : $rank ];
}

=pod

=item tail_copies(state, tail, ...)

Reads the arrival files of OutboxDrill::Tail consumers from where the last
call with the same state (a hash reference, empty at first) stopped, and
returns that state: { first => { event id => first arrival (Unix seconds)
}, extra => [ [id, arrival] of every copy after the first ] }.

=cut

sub tail_copies
{
	my ($st, @tails) = @_;
	$st->{first} //= {};
	$st->{extra} //= [];
	foreach my $tail (@tails)
	{
		open my $fh, '<', $tail->{file} or next;
		seek($fh, $st->{pos}{ $tail->{file} } // 0, 0);
		while (1)
		{
			my $at_line = tell($fh);
			my $line = <$fh>;
			last unless defined $line;
			# an unfinished last line is read at the next call
			if ($line !~ /\n\z/)
			{
				seek($fh, $at_line, 0);
				last;
			}
			my ($at, $hdrs) = $line =~ /^(\S+) \d+ \d+ (.*)$/ or next;
			my ($id) = $hdrs =~ /(?:^|,)id=([^,]+)/ or next;
			if (exists $st->{first}{$id})
			{
				push @{ $st->{extra} }, [ $id, $at ];
				next;
			}
			$st->{first}{$id} = $at;
		}
		$st->{pos}{ $tail->{file} } = tell($fh);
		close $fh;
	}
	return $st;
}

=pod

=item latency_by_minute(committed_at, first, t0)

Commit to first arrival, per minute of the run (by commit time): an array
reference of [minute, p50 ms, p99 ms, events], for the events of
committed_at (event id => Unix seconds) that arrived.

=cut

sub latency_by_minute
{
	my ($committed, $first, $t0) = @_;
	my %by;

	while (my ($id, $c) = each %$committed)
	{
		my $at = $first->{$id} // next;
		push @{ $by{ int(($c - $t0) / 60) } }, ($at - $c) * 1000;
	}
	my @rows;
	foreach my $m (sort { $a <=> $b } keys %by)
	{
		my @l = sort { $a <=> $b } @{ $by{$m} };
		push @rows, [ $m, sprintf('%.1f', percentile_of(\@l, 50)),
			sprintf('%.1f', percentile_of(\@l, 99)), scalar(@l) ];
	}
	return \@rows;
}

=pod

=item duplicates_by_fault(extra, faults, grace)

Counts the extra copies (tail_copies) by the fault they follow: the last
one begun before their arrival, when that arrival is at most grace
seconds after its recovery (faults in start order).  A hash reference
fault index => copies, with "none" for copies outside every fault.

=cut

sub duplicates_by_fault
{
	my ($extra, $faults, $grace) = @_;
	my %n;

	foreach my $copy (@$extra)
	{
		my $at = $copy->[1];
		my ($i) = grep { $at >= $faults->[$_]{start} } reverse 0 .. $#$faults;
		my $f = defined $i ? $faults->[$i] : undef;
		$i = undef if $f && $at > ($f->{recovered_at} // $f->{end}) + $grace;
		$n{ $i // 'none' }++;
	}
	return \%n;
}

=pod

=item write_csv(file, columns, rows)

Writes rows (array references, or hash references keyed by columns) as
CSV with a header line.

=cut

sub write_csv
{
	my ($file, $columns, $rows) = @_;

	open my $fh, '>', $file or croak "could not write $file: $!";
	print $fh join(',', @$columns), "\n";
	foreach my $r (@$rows)
	{
		my @v = ref $r eq 'HASH' ? map { $r->{$_} } @$columns : @$r;
		print $fh join(',', map { $_ // '' } @v), "\n";
	}
	close $fh;
	return;
}

# gnuplot lines marking each fault: a dashed line at its start, its name
sub fault_marks
{
	my ($faults, $t0) = @_;
	my $s = '';

	foreach my $f (@$faults)
	{
		my $x = sprintf('%.3f', ($f->{start} - $t0) / 60);
		$s .= "set arrow from $x, graph 0 to $x, graph 1 nohead dt 2 lc rgb '#b03030'\n"
		  . "set label '$f->{name}' at $x, graph 0.98 rotate by 90 right offset -0.6, 0"
		  . " font 'sans,8' textcolor rgb '#b03030'\n";
	}
	return $s;
}

=pod

=item charts(dir, faults, t0, title)

Draws dir/backlog.png, latency.png, memory.png and size.png from
dir/samples.csv and dir/latency.csv with gnuplot (pngcairo), each fault
marked where it began.  Returns the files drawn; none without gnuplot.

=cut

sub charts
{
	my ($dir, $faults, $t0, $title) = @_;
	return () if system('sh', '-c', 'command -v gnuplot >/dev/null') != 0;
	my $common = "set terminal pngcairo size 1200,420 font 'sans,10' noenhanced\n"
	  . "set datafile separator ','\nset grid\nset key outside right top\n"
	  . "set xlabel 'minutes since the load began'\nset xrange [0:*]\nset yrange [0:*]\n"
	  . fault_marks($faults, $t0);
	my $s = "$dir/samples.csv";
	my %chart = (
		'backlog.png' => "set title 'Backlog and oldest pending event: $title'\n"
		  . "set ylabel 'events'\nset y2label 'seconds'\nset y2tics\nset y2range [0:*]\n"
		  . "plot '$s' every ::1 using 1:2 with lines lw 2 title 'backlog (events)',"
		  . " '$s' every ::1 using 1:3 axes x1y2 with lines lw 1 title 'oldest pending (s)'\n"
		  . "unset y2tics\nunset y2label\n",
		'latency.png' => "set title 'Commit to arrival on the main topic, per minute: $title'\n"
		  . "set ylabel 'ms'\nset logscale y\nset yrange [1:*]\n"
		  . "plot '$dir/latency.csv' every ::1 using 1:2 with linespoints lw 2 title 'p50',"
		  . " '$dir/latency.csv' every ::1 using 1:3 with linespoints lw 2 title 'p99'\n"
		  . "unset logscale y\nset yrange [0:*]\n",
		'memory.png' => "set title 'Resident memory and CPU: $title'\n"
		  . "set ylabel 'MB'\nset y2label 'CPU %'\nset y2tics\nset y2range [0:*]\n"
		  . "plot '$s' every ::1 using 1:4 with lines lw 2 title 'relay RssAnon (MB)',"
		  . " '$s' every ::1 using 1:5 with lines lw 2 title 'subscription worker RssAnon (MB)',"
		  . " '$s' every ::1 using 1:6 axes x1y2 with lines lw 1 title 'relay CPU %',"
		  . " '$s' every ::1 using 1:7 axes x1y2 with lines lw 1 title 'worker CPU %'\n"
		  . "unset y2tics\nunset y2label\n",
		'size.png' => "set title 'Size of outbox.events and WAL written: $title'\n"
		  . "set ylabel 'MB'\n"
		  . "plot '$s' every ::1 using 1:8 with lines lw 2 title 'outbox.events (MB)',"
		  . " '$s' every ::1 using 1:9 with lines lw 1 title 'WAL (MB per minute)'\n");
	my $script = $common;
	$script .= "set output '$dir/$_'\n$chart{$_}unset output\n" foreach sort keys %chart;
	open my $gp, '|-', 'gnuplot' or return ();
	print $gp $script;
	close $gp or diag "gnuplot failed: $?";
	return map { "$dir/$_" } sort keys %chart;
}

=pod

=back

=cut

package OutboxSoak::Sampler;

use strict;
use warnings;

use POSIX ();
use Time::HiRes qw(time);

use OutboxTest;

# one statement per sample: the relay's figures, the log's size, the WAL
# position and the subscription worker's pid
my $SAMPLE_SQL = q{
SELECT s.backlog, coalesce(s.oldest_pending_seconds, 0), coalesce(s.pid, 0),
	   (SELECT coalesce(sum(pg_catalog.pg_total_relation_size(i.inhrelid)), 0)
		  FROM pg_catalog.pg_inherits i WHERE i.inhparent = 'outbox.events'::regclass),
	   pg_catalog.pg_current_wal_lsn() - '0/0'::pg_lsn,
	   (SELECT coalesce(max(a.pid), 0) FROM pg_catalog.pg_stat_activity a
		 WHERE a.backend_type = 'outbox subscription')
  FROM outbox.status() s};

=pod

=head1 OutboxSoak::Sampler

=over

=item OutboxSoak::Sampler->new(node, dbname, t0, every => seconds)

=item $s->sample

Takes a sample when every seconds have passed since the last: a row of
@OutboxSoak::SAMPLE_COLUMNS (minutes since t0; the relay's backlog and
oldest pending age; the relay's and the subscription worker's anonymous
resident memory (RssAnon: their own, not the shared buffers they touch) and CPU since the last sample; outbox.events with its indexes and
TOAST; WAL per minute).  While the server does not answer, a row of
minutes only.

=item $s->rows

=back

=cut

sub new
{
	my ($class, $node, $dbname, $t0, %p) = @_;
	return bless {
		node => $node, dbname => $dbname, t0 => $t0,
		every => $p{every} // 10, last => 0, rows => [], cpu => {},
		tck => POSIX::sysconf(POSIX::_SC_CLK_TCK()) || 100,
	}, $class;
}

sub rows { return $_[0]{rows}; }

# CPU % of pid since the last look at it (undef at the first)
sub cpu_pct
{
	my ($self, $pid, $now) = @_;
	return undef unless $pid;
	open my $fh, '<', "/proc/$pid/stat" or return undef;
	my $stat = <$fh> // '';
	close $fh;
	my @f = split / /, ($stat =~ /\) (.*)$/)[0] // '';
	my $ticks = ($f[11] // 0) + ($f[12] // 0);
	my $prev = $self->{cpu}{$pid};
	$self->{cpu}{$pid} = [ $ticks, $now ];
	return undef unless $prev && $now > $prev->[1];
	return sprintf('%.1f', ($ticks - $prev->[0]) / $self->{tck} / ($now - $prev->[1]) * 100);
}

sub rss_mb
{
	my ($pid) = @_;
	return undef unless $pid;
	my $kb = proc_status_kb($pid, 'RssAnon');
	return defined $kb ? sprintf('%.1f', $kb / 1024) : undef;
}

sub sample
{
	my ($self) = @_;
	my $now = time();
	return if $now - $self->{last} < $self->{every};
	$self->{last} = $now;
	my %r = (t_min => sprintf('%.3f', ($now - $self->{t0}) / 60));
	my ($ret, $out) = OutboxTest::try_psql($self->{node}, $self->{dbname}, $SAMPLE_SQL);
	if ($ret == 0 && defined $out && $out =~ /\|/)
	{
		my ($backlog, $age, $relay, $events, $wal, $worker) = split /\|/, $out;
		@r{qw(backlog oldest_s events_mb)} =
		  ($backlog, sprintf('%.1f', $age), sprintf('%.2f', $events / 1048576));
		@r{qw(relay_rss_mb relay_cpu_pct)} = (rss_mb($relay), $self->cpu_pct($relay, $now));
		@r{qw(worker_rss_mb worker_cpu_pct)} = (rss_mb($worker), $self->cpu_pct($worker, $now));
		if (defined $self->{wal} && $now > $self->{wal}[1] && $wal >= $self->{wal}[0])
		{
			$r{wal_mb_per_min} = sprintf('%.2f',
				($wal - $self->{wal}[0]) / ($now - $self->{wal}[1]) * 60 / 1048576);
		}
		$self->{wal} = [ $wal, $now ];
	}
	push @{ $self->{rows} }, \%r;
	return \%r;
}

1;
