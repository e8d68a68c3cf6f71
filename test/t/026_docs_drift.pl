# test/t/026_docs_drift.pl: the reference pages say what the server says.
#
# On a server started with shared_preload_libraries = 'outbox' and no other
# outbox setting, with the extension created:
#  - docs/configuration.md has one row per outbox.* setting of pg_settings,
#      | `outbox.NAME` | `DEFAULT` | CONTEXT | meaning |
#    DEFAULT as SHOW prints it (`` when empty), CONTEXT as pg_settings has
#    it, and no row for a setting the library does not register;
#  - docs/reference.md has a heading per function of schema outbox,
#      ### `outbox.NAME(arguments)`
#    its arguments as pg_get_function_arguments() gives them (names, modes
#    and types, defaults of equal value: the server compares them), and no
#    heading for a function that does not exist;
#  - and a heading per table and view of schema outbox,
#      ### `outbox.RELNAME`
#    followed by a table with a row per column, in any order,
#      | `column` | type | meaning |
#    of the column's type, and no row for a column that does not exist (a
#    composite type of the schema may be documented the same way); the
#    partitions of outbox.events, which have its columns, under the one
#    heading
#      ### `outbox.events_0` … `outbox.events_<last>`
# The internal schema outbox_internal is not documented there.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use FindBin;

my $docs = "$FindBin::RealBin/../../docs";

my $node = PostgreSQL::Test::Cluster->new('docs');
$node->init;
$node->append_conf('postgresql.conf', "shared_preload_libraries = 'outbox'\n");
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION outbox');

# rows of a query, each split at tabs
sub rows
{
	my ($sql) = @_;
	return map { [ split /\t/, $_, -1 ] } grep { $_ ne '' } split /\n/,
	  $node->safe_psql('postgres', $sql);
}

# a string as an SQL literal, whatever it holds
sub literal
{
	my ($s) = @_;
	$s =~ s/'/''/g;
	return "'$s'";
}

sub read_doc
{
	my ($file) = @_;
	ok(-f "$docs/$file", "docs/$file exists") or return ();
	return split /\n/, slurp_file("$docs/$file");
}

# ---- settings: docs/configuration.md

my %setting;
for (rows(q{SELECT name || E'\t' || current_setting(name) || E'\t' || context
			  FROM pg_settings WHERE name LIKE 'outbox.%' ORDER BY name}))
{
	$setting{ $_->[0] } = { default => $_->[1], context => $_->[2] };
}
ok(exists $setting{'outbox.allow_drop_undelivered'} && exists $setting{'outbox.max_databases'},
	'pg_settings lists the library\'s settings, the preloaded ones too: ' . scalar(keys %setting));

my %row;
for my $line (read_doc('configuration.md'))
{
	next unless $line =~ /^\|\s*`(outbox\.[^`]*)`\s*\|/;
	my $name = $1;
	my (undef, undef, $default, $context) = map { s/^\s+|\s+$//gr } split /\|/, $line;
	if (exists $row{$name})
	{
		fail("docs/configuration.md has one row for $name, not two");
		next;
	}
	$row{$name} = { default => $default // '', context => $context // '', line => $line };
}
for my $name (sort keys %setting)
{
	my $doc = $row{$name};
	ok(defined $doc, "docs/configuration.md has a row for $name") or next;
	my ($shown) = $doc->{default} =~ /^`(.*)`$/;
	is($shown, $setting{$name}{default},
		"docs/configuration.md: $name defaults to `$setting{$name}{default}` (SHOW)");
	is($doc->{context}, $setting{$name}{context},
		"docs/configuration.md: $name has context $setting{$name}{context}");
}
for my $name (sort keys %row)
{
	ok(exists $setting{$name}, "docs/configuration.md: $name is a setting the library registers");
}

# ---- functions: docs/reference.md

# an argument list split at its top-level commas
sub split_args
{
	my ($list) = @_;
	my @args;
	my ($cur, $depth, $quoted) = ('', 0, 0);
	for my $c (split //, $list)
	{
		if ($quoted) { $quoted = 0 if $c eq "'"; }
		elsif ($c eq "'") { $quoted = 1; }
		elsif ($c eq '(' || $c eq '[') { $depth++; }
		elsif ($c eq ')' || $c eq ']') { $depth--; }
		elsif ($c eq ',' && $depth == 0)
		{
			push @args, $cur;
			$cur = '';
			next;
		}
		$cur .= $c;
	}
	push @args, $cur if $cur =~ /\S/;
	return map { s/^\s+|\s+$//gr } @args;
}

# one argument: mode, name, type and default (undef: none)
sub parse_arg
{
	my ($arg) = @_;
	my $mode = $arg =~ s/^(IN|OUT|INOUT|VARIADIC)\s+//i ? uc $1 : 'IN';
	my $default = $arg =~ s/\s+DEFAULT\s+(.*)$//is ? $1 : undef;
	my ($name, $type) = $arg =~ /^("(?:[^"]|"")+"|\w+)\s+(.+)$/ ? ($1, $2) : ('', $arg);
	return { mode => $mode, name => $name, type => $type, default => $default };
}

# why the documented arguments are not the function's, or '' when they are:
# modes and names equal, types the same for the server, defaults of equal value
sub args_differ
{
	my ($doc_list, $cat_list) = @_;
	my @doc = map { parse_arg($_) } split_args($doc_list);
	my @cat = map { parse_arg($_) } split_args($cat_list);
	return sprintf('%d arguments, not %d', scalar(@doc), scalar(@cat)) if @doc != @cat;
	my @checks;
	for my $i (0 .. $#cat)
	{
		my ($d, $c) = ($doc[$i], $cat[$i]);
		return "argument $c->{name} is $d->{mode} $d->{name}"
		  if $d->{mode} ne $c->{mode} || $d->{name} ne $c->{name};
		return "argument $c->{name} has " . (defined $c->{default} ? 'a' : 'no') . ' default'
		  if (defined $d->{default} ? 1 : 0) != (defined $c->{default} ? 1 : 0);
		push @checks, sprintf('pg_catalog.to_regtype(%s) IS NOT DISTINCT FROM pg_catalog.to_regtype(%s)',
			literal($d->{type}), literal($c->{type}));
		push @checks, sprintf('((%s)::%s IS NOT DISTINCT FROM (%s)::%s)',
			$d->{default}, $c->{type}, $c->{default}, $c->{type})
		  if defined $c->{default};
	}
	return '' unless @checks;
	my ($ret, $out) = $node->psql('postgres',
		'SELECT ' . join(' AND ', map { "coalesce($_, false)" } @checks));
	return $ret == 0 && $out eq 't' ? '' : 'types or default values differ';
}

my %functions;    # name => [ argument lists ]
for (rows(q{SELECT p.proname || E'\t' || pg_get_function_arguments(p.oid)
			  FROM pg_proc p WHERE p.pronamespace = 'outbox'::regnamespace ORDER BY 1}))
{
	push @{ $functions{ $_->[0] } }, $_->[1];
}

my %columns;    # relation => { column => type }, of tables, views and composite types
my %kind;
for (rows(q{SELECT c.relname || E'\t' || c.relkind::text || E'\t' || a.attname || E'\t' || a.atttypid::regtype::text
			  FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid
			 WHERE c.relnamespace = 'outbox'::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm', 'c')
			   AND NOT c.relispartition AND a.attnum > 0 AND NOT a.attisdropped}))
{
	my ($rel, $kind, $col, $type) = @$_;
	$kind{$rel} = $kind;
	$columns{$rel}{$col} = $type;
}

my $last_partition = $node->safe_psql('postgres',
	q{SELECT max(c.relname COLLATE "C") FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
	   WHERE i.inhparent = 'outbox.events'::regclass});
my $partitions_heading = 0;
my (@fheadings, %rheadings, $section);
for my $line (read_doc('reference.md'))
{
	if ($line =~ /^#/)
	{
		undef $section;
		$partitions_heading++
		  if $line =~ /^###\s+`outbox\.events_0`\s+…\s+`outbox\.\Q$last_partition\E`\s*$/;
		if ($line =~ /^###\s+`outbox\.(\w+)\((.*)\)`\s*$/)
		{
			push @fheadings, { name => $1, args => $2 };
		}
		elsif ($line =~ /^###\s+`outbox\.(\w+)`\s*$/)
		{
			fail("docs/reference.md has one heading for outbox.$1, not two")
			  if exists $rheadings{$1};
			$section = $rheadings{$1} = {};
		}
		next;
	}
	next unless $section && $line =~ /^\|\s*`(\w+)`\s*\|\s*([^|]*?)\s*\|[^|]*\|/;
	fail("docs/reference.md has one row for column $1, not two") if exists $section->{$1};
	$section->{$1} = $2 =~ s/`//gr;
}

my %documented;
for my $h (@fheadings)
{
	my ($found, @why);
	for my $args (@{ $functions{ $h->{name} } // [] })
	{
		my $why = args_differ($h->{args}, $args);
		if ($why eq '')
		{
			$found = $args;
			last;
		}
		push @why, "outbox.$h->{name}($args): $why";
	}
	ok(defined $found, "docs/reference.md: outbox.$h->{name}($h->{args}) is a function of schema outbox")
	  or diag(@why ? join("\n", @why) : "schema outbox has no function $h->{name}");
	fail("docs/reference.md has one heading for outbox.$h->{name}($found), not two")
	  if defined $found && $documented{"$h->{name}($found)"}++;
}
for my $name (sort keys %functions)
{
	ok($documented{"$name($_)"}, "docs/reference.md has a heading for outbox.$name($_)")
	  for @{ $functions{$name} };
}

# ---- tables and views: docs/reference.md

is($partitions_heading, 1,
	"docs/reference.md has one heading for the partitions of outbox.events, outbox.events_0 to outbox.$last_partition");

for my $rel (sort keys %columns)
{
	my $doc = $rheadings{$rel};
	if (!$doc)
	{
		ok(0, "docs/reference.md has a heading for outbox.$rel") unless $kind{$rel} eq 'c';
		next;
	}
	pass("docs/reference.md has a heading for outbox.$rel") unless $kind{$rel} eq 'c';
	for my $col (sort keys %{ $columns{$rel} })
	{
		ok(defined $doc->{$col}, "docs/reference.md: outbox.$rel has a row for column $col")
		  or next;
		my $same = $node->safe_psql('postgres',
			sprintf('SELECT pg_catalog.to_regtype(%s) IS NOT DISTINCT FROM %s::pg_catalog.regtype',
				literal($doc->{$col}), literal($columns{$rel}{$col})));
		is($same, 't', "docs/reference.md: outbox.$rel.$col is of type $columns{$rel}{$col}")
		  or diag("the row says: $doc->{$col}");
	}
	ok(exists $columns{$rel}{$_}, "docs/reference.md: outbox.$rel has a column $_")
	  for sort keys %$doc;
}
ok(exists $columns{$_}, "docs/reference.md: outbox.$_ is a table, view or type of schema outbox")
  for sort keys %rheadings;

$node->stop;
done_testing();
