# test/t/204_metrics_format.pl: outbox.metrics() is valid Prometheus text
# exposition format (checked by a parser written here, which is itself
# shown to reject broken input), has the documented metric families, and
# escapes a database name that needs it.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

# found without -I: PGXS resets PROVE_FLAGS after the Makefile sets it
use FindBin;
use lib "$FindBin::RealBin/../perl";
use OutboxTest;

my $NAME = qr/[a-zA-Z_:][a-zA-Z0-9_:]*/;
my $LABEL = qr/[a-zA-Z_][a-zA-Z0-9_]*/;
my $FLOAT = qr/[-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?|Inf|NaN)/;

# the value of a sample as a number; +Inf and -Inf as +/-9**9**9
sub number
{
	my ($text) = @_;
	return 9**9**9 if $text eq '+Inf' || $text eq 'Inf';
	return -9**9**9 if $text eq '-Inf';
	return $text + 0;
}

# "a=\"x\",b=\"y\"" => ({a => 'x', b => 'y'}, undef) or (undef, error)
sub parse_labels
{
	my ($text) = @_;
	my %labels;
	my $pos = 0;

	while ($pos < length($text))
	{
		substr($text, $pos) =~ /^($LABEL)="/
		  or return (undef, "bad label at \"" . substr($text, $pos) . '"');
		my $name = $1;
		$pos += length($name) + 2;
		my $value = '';
		while (1)
		{
			return (undef, "unterminated value of label $name")
			  if $pos >= length($text);
			my $c = substr($text, $pos++, 1);
			last if $c eq '"';
			if ($c eq '\\')
			{
				my $e = substr($text, $pos++, 1);
				if    ($e eq '\\') { $value .= '\\' }
				elsif ($e eq '"')  { $value .= '"' }
				elsif ($e eq 'n')  { $value .= "\n" }
				else { return (undef, "bad escape \\$e in label $name") }
			}
			else
			{
				$value .= $c;
			}
		}
		return (undef, "label name $name is reserved") if $name =~ /^__/;
		return (undef, "label $name repeated") if exists $labels{$name};
		$labels{$name} = $value;
		last if $pos >= length($text);
		substr($text, $pos++, 1) eq ','
		  or return (undef, "labels not separated by a comma in \"$text\"");
	}
	return (\%labels, undef);
}

# the family a sample name belongs to, given the TYPE lines seen so far
sub family_of
{
	my ($name, $types) = @_;

	return $name if exists $types->{$name};
	foreach my $suffix (qw(_bucket _sum _count))
	{
		next unless $name =~ /^(.*)\Q$suffix\E$/;
		my $base = $1;
		next unless exists $types->{$base};
		next if $suffix eq '_bucket' && $types->{$base} ne 'histogram';
		return $base if $types->{$base} =~ /^(histogram|summary)$/;
	}
	return undef;
}

# Parse the text exposition format and check what Prometheus relies on.
# Returns (families: name => { type, help, samples => [ { name, labels,
# value } ] }, errors: [ strings ]).
sub parse_exposition
{
	my ($text) = @_;
	my (%types, %families, @errors, %seen_sample, %closed);
	my $current = '';
	my $n = 0;

	push @errors, 'the text does not end with a newline' unless $text =~ /\n\z/;
	foreach my $line (split /\n/, $text)
	{
		$n++;
		next if $line eq '';
		if ($line =~ /^#\s*HELP\s+($NAME)\s+(.*)$/)
		{
			my ($name, $help) = ($1, $2);
			push @errors, "line $n: bad escape in HELP of $name"
			  if $help =~ /\\[^\\n]/ || $help =~ /\\$/;
			push @errors, "line $n: second HELP for $name"
			  if defined $families{$name}{help};
			$families{$name}{help} = $help;
			next;
		}
		if ($line =~ /^#\s*TYPE\s+($NAME)\s+(\S+)\s*$/)
		{
			my ($name, $type) = ($1, $2);
			push @errors, "line $n: unknown type $type for $name"
			  unless $type =~ /^(counter|gauge|histogram|summary|untyped)$/;
			push @errors, "line $n: second TYPE for $name" if exists $types{$name};
			push @errors, "line $n: TYPE for $name after its samples"
			  if $families{$name}{samples};
			$types{$name} = $type;
			$families{$name}{type} = $type;
			next;
		}
		if ($line =~ /^#/)
		{
			push @errors, "line $n: malformed HELP or TYPE line"
			  if $line =~ /^#\s*(HELP|TYPE)\b/;
			next;
		}
		my ($name, $labeltext, $value, $ts) =
		  $line =~ /^($NAME)(?:\{(.*)\})?[ \t]+($FLOAT)(?:[ \t]+(-?\d+))?[ \t]*$/
		  or do { push @errors, "line $n: not a sample: $line"; next };
		my ($labels, $err) = parse_labels($labeltext // '');
		if (!defined $labels)
		{
			push @errors, "line $n: $err";
			next;
		}
		my $family = family_of($name, \%types);
		if (!defined $family)
		{
			push @errors, "line $n: $name has no TYPE line before it";
			next;
		}
		# a family's lines form one group
		push @errors, "line $n: samples of $family are not grouped together"
		  if $family ne $current && $closed{$family};
		$closed{$current} = 1 if $current ne '' && $family ne $current;
		$current = $family;

		my $key = $name . '{'
		  . join(',', map { "$_=$labels->{$_}" } sort keys %$labels) . '}';
		push @errors, "line $n: duplicate sample $key" if $seen_sample{$key}++;
		push @{ $families{$family}{samples} },
		  { name => $name, labels => $labels, value => $value };
	}

	foreach my $family (sort keys %families)
	{
		my $f = $families{$family};
		next unless defined $f->{type};
		if ($f->{type} eq 'counter')
		{
			foreach my $s (@{ $f->{samples} // [] })
			{
				push @errors, "counter $s->{name} is negative or NaN: $s->{value}"
				  unless $s->{value} ne 'NaN' && number($s->{value}) >= 0;
			}
			push @errors, "counter $family does not end in _total"
			  unless $family =~ /_total$/;
		}
		push @errors, check_histogram($family, $f->{samples} // [])
		  if $f->{type} eq 'histogram';
	}
	return (\%families, \@errors);
}

# buckets by label set (without le): le increasing, counts cumulative,
# ending in +Inf equal to _count, with a _sum
sub check_histogram
{
	my ($family, $samples) = @_;
	my (%series, @errors);

	foreach my $s (@$samples)
	{
		my %l = %{ $s->{labels} };
		my $le = delete $l{le};
		my $key = join(',', map { "$_=$l{$_}" } sort keys %l);
		if ($s->{name} eq "${family}_bucket")
		{
			if (!defined $le || $le !~ /^$FLOAT$/)
			{
				push @errors, "$family bucket without a numeric le";
				next;
			}
			push @{ $series{$key}{buckets} }, [ $le, $s->{value} ];
		}
		elsif ($s->{name} eq "${family}_sum")
		{
			$series{$key}{sum} = $s->{value};
		}
		elsif ($s->{name} eq "${family}_count")
		{
			$series{$key}{count} = $s->{value};
		}
		else
		{
			push @errors, "$s->{name} does not belong to histogram $family";
		}
	}
	push @errors, "histogram $family has no series" unless %series;
	foreach my $key (sort keys %series)
	{
		my $b = $series{$key}{buckets} // [];
		push @errors, "$family\{$key\}: no buckets" unless @$b;
		for my $i (1 .. $#$b)
		{
			push @errors, "$family\{$key\}: le $b->[$i][0] after $b->[$i-1][0]"
			  unless number($b->[$i][0]) > number($b->[ $i - 1 ][0]);
			push @errors, "$family\{$key\}: count falls at le $b->[$i][0]"
			  unless $b->[$i][1] >= $b->[ $i - 1 ][1];
		}
		push @errors, "$family\{$key\}: the last bucket is not +Inf"
		  unless @$b && $b->[-1][0] eq '+Inf';
		push @errors, "$family\{$key\}: no _count"
		  unless defined $series{$key}{count};
		push @errors, "$family\{$key\}: no _sum" unless defined $series{$key}{sum};
		push @errors, "$family\{$key\}: +Inf bucket differs from _count"
		  if @$b && defined $series{$key}{count}
		  && $b->[-1][1] != $series{$key}{count};
	}
	return @errors;
}

# --- the parser itself rejects what it must
my $good = <<'EOT';
# HELP x_total A counter.
# TYPE x_total counter
x_total{a="q\"uo\\te\nnl",b="2"} 3
# TYPE h histogram
h_bucket{le="0.5"} 1
h_bucket{le="1"} 2
h_bucket{le="+Inf"} 2
h_sum 0.7
h_count 2
EOT
my ($fam, $errs) = parse_exposition($good);
is_deeply($errs, [], 'the parser accepts a valid exposition');
is($fam->{x_total}{samples}[0]{labels}{a},
	"q\"uo\\te\nnl", 'the parser unescapes label values');

my %bad = (
	'a sample without TYPE' => "x 1\n",
	'a TYPE after its sample' => "# TYPE x gauge\nx 1\n# TYPE y gauge\ny 1\nz 2\n",
	'a bad label escape' => "# TYPE x gauge\nx{a=\"\\q\"} 1\n",
	'an unquoted label value' => "# TYPE x gauge\nx{a=1} 1\n",
	'a negative counter' => "# TYPE x_total counter\nx_total -1\n",
	'decreasing buckets' =>
	  "# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"2\"} 1\nh_bucket{le=\"+Inf\"} 2\nh_sum 1\nh_count 2\n",
	'les out of order' =>
	  "# TYPE h histogram\nh_bucket{le=\"2\"} 1\nh_bucket{le=\"1\"} 1\nh_bucket{le=\"+Inf\"} 1\nh_sum 1\nh_count 1\n",
	'+Inf bucket != _count' =>
	  "# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_bucket{le=\"+Inf\"} 1\nh_sum 1\nh_count 2\n",
	'no +Inf bucket' =>
	  "# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_sum 1\nh_count 1\n",
	'a family split in two groups' =>
	  "# TYPE x gauge\n# TYPE y gauge\nx{a=\"1\"} 1\ny 1\nx{a=\"2\"} 1\n",
	'a duplicate sample' => "# TYPE x gauge\nx{a=\"1\"} 1\nx{a=\"1\"} 2\n",
	'a value that is no number' => "# TYPE x gauge\nx one\n",
	'no final newline' => "# TYPE x gauge\nx 1",
	'a second TYPE' => "# TYPE x gauge\n# TYPE x counter\nx 1\n",);
foreach my $what (sort keys %bad)
{
	my (undef, $e) = parse_exposition($bad{$what});
	ok(scalar(@$e), "the parser rejects $what")
	  or diag "accepted: $bad{$what}";
}

# --- outbox.metrics()
my $kafka = OutboxTest::Broker->start(brokers => 1);
my $node = outbox_node('metrics', $kafka);

# quote, backslash and a space: each must be escaped or kept in the label
my $dbname = 'shop "north\\east"';
(my $dbident = $dbname) =~ s/"/""/g;
$node->safe_psql('postgres', qq{CREATE DATABASE "$dbident"});
$node->safe_psql($dbname, 'CREATE EXTENSION outbox');
my ($pid) = wait_for_relay($node, $dbname, 30);
ok(defined $pid, 'the relay of a database with an awkward name runs');

my %required = (
	outbox_backlog_events => 'gauge',
	outbox_oldest_pending_seconds => 'gauge',
	outbox_published_total => 'counter',
	outbox_published_bytes_total => 'counter',
	outbox_publish_latency_seconds => 'histogram',
	outbox_delivery_errors_total => 'counter',
	outbox_relay_up => 'gauge',
	outbox_relay_state => 'gauge',
	outbox_quarantined_events => 'gauge',);

# parse metrics() now and check the documented families
sub check_metrics
{
	my ($when) = @_;
	my $text = $node->safe_psql($dbname, 'SELECT outbox.metrics()');
	# safe_psql drops the final newline: read it back as text psql won't trim
	my $last = $node->safe_psql($dbname, q{SELECT right(outbox.metrics(), 1) = E'\n'});
	is($last, 't', "$when: metrics() ends with a newline");
	my ($f, $e) = parse_exposition("$text\n");
	is_deeply($e, [], "$when: metrics() parses as Prometheus text format")
	  or diag join("\n", @$e);
	foreach my $name (sort keys %required)
	{
		is($f->{$name}{type} // '(none)',
			$required{$name}, "$when: $name is a $required{$name}");
		ok(defined $f->{$name}{help}, "$when: $name has a HELP line");
		my @wrong = grep { ($_->{labels}{database} // '') ne $dbname }
		  @{ $f->{$name}{samples} // [] };
		ok(@{ $f->{$name}{samples} // [] } && !@wrong,
			"$when: every $name sample has database=\"$dbname\" after unescaping");
	}
	my %classes = map { ($_->{labels}{class} // '') => $_->{value} }
	  @{ $f->{outbox_delivery_errors_total}{samples} // [] };
	is_deeply([ sort keys %classes ], [qw(fatal permanent schema transient)],
		"$when: outbox_delivery_errors_total has class transient, permanent, fatal and schema");
	return $f;
}

sub value_of
{
	my ($f, $name, $pred) = @_;
	my @s = grep { $_->{name} eq $name && (!$pred || $pred->($_->{labels})) }
	  map { @{ $_->{samples} // [] } } values %$f;
	return @s == 1 ? $s[0]{value} : undef;
}

my $f = check_metrics('before any event');
is(value_of($f, 'outbox_publish_latency_seconds_count'), 0,
	'an empty histogram counts 0');

$node->safe_psql(
	$dbname, q{
SELECT count(outbox.emit('order', 'o-' || i, 'order.placed', jsonb_build_object('i', i)))
  FROM generate_series(1, 30) i});
ok( poll_until(
		$node, $dbname, 'SELECT published, backlog FROM outbox.status()', '30|0', 60),
	'30 events are published');

$f = check_metrics('after 30 events');
my $s = query_json($node, $dbname, 'SELECT row_to_json(s) FROM outbox.status() s');
is(value_of($f, 'outbox_published_total'), 30, 'outbox_published_total = 30');
is(value_of($f, 'outbox_published_bytes_total'), $s->{published_bytes},
	'outbox_published_bytes_total = status().published_bytes');
is(value_of($f, 'outbox_backlog_events'), 0, 'outbox_backlog_events = 0');
is(value_of($f, 'outbox_oldest_pending_seconds') + 0,
	0, 'outbox_oldest_pending_seconds = 0');
is(value_of($f, 'outbox_publish_latency_seconds_count'), 30,
	'the latency histogram counts 30');
is(value_of($f, 'outbox_relay_up'), 1, 'outbox_relay_up = 1');
is(value_of($f, 'outbox_relay_state', sub { $_[0]{state} eq 'running' }),
	1, 'outbox_relay_state{state="running"} = 1');
is(value_of($f, 'outbox_delivery_errors_total', sub { $_[0]{class} eq 'transient' }),
	0, 'no transient delivery errors');
my $sum = value_of($f, 'outbox_publish_latency_seconds_sum');
ok($sum > 0 && $sum < 30, "the latency sum is plausible ($sum s for 30 events)");
my $ones = grep { $_->{value} == 1 }
  @{ $f->{outbox_relay_state}{samples} // [] };
is($ones, 1, 'exactly one outbox_relay_state sample is 1');

# paused: still valid, and the state moves
$node->safe_psql('postgres', 'ALTER SYSTEM SET outbox.enabled = off');
$node->safe_psql('postgres', 'SELECT pg_reload_conf()');
ok(poll_until($node, $dbname, 'SELECT state FROM outbox.status()', 'paused', 30),
	'the relay is paused');
$f = check_metrics('paused');
is(value_of($f, 'outbox_relay_state', sub { $_[0]{state} eq 'paused' }),
	1, 'outbox_relay_state{state="paused"} = 1');
is(value_of($f, 'outbox_published_total'), 30,
	'outbox_published_total is kept while paused');

$node->stop;
done_testing();
