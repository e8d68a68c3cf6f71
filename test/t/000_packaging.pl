# The version is written once, in outbox.control (META.json is made from
# META.json.in with it; test/t/027_dist.pl checks the release files), and
# sql/ holds the 1.0 script, the upgrade chain to that version and the
# current install script.  META.json.in states the supported PostgreSQL
# versions; the lowest is the runtime prerequisite and the floor compat.h
# enforces, the README names them all, and no source file but src/base/compat.h
# tests a version.
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use JSON::PP;

my $control = slurp_file('outbox.control');
my ($version) = $control =~ /^default_version\s*=\s*'([^']+)'/m;
ok(defined $version, 'outbox.control has a default_version');

my $template = JSON::PP::decode_json(slurp_file('META.json.in'));
is(join(' ', $template->{version}, $template->{provides}{outbox}{version}), '@VERSION@ @VERSION@',
	'META.json.in leaves its versions to make (@VERSION@)');

# sql/: the frozen 1.0 script, the upgrade chain from it to the current
# version, and the current version's script, sql/outbox.sql, that make
# copies to sql/outbox--$version.sql; no other version has a full script
ok(-f 'sql/outbox.sql', 'the current install script sql/outbox.sql exists');
is($template->{provides}{outbox}{file}, 'sql/outbox.sql', 'META.json.in provides the current install script');
my @full = sort map { m{^sql/outbox--(\d+\.\d+)\.sql$} ? $1 : () } glob('sql/outbox--*.sql');
is(join(' ', grep { $_ ne $version } @full), '1.0', 'the only full install script but the built one is 1.0\'s');
ok(!-f "sql/outbox--$version.sql" || slurp_file("sql/outbox--$version.sql") eq slurp_file('sql/outbox.sql'),
	"sql/outbox--$version.sql, when built, is sql/outbox.sql");
my %next = map { m{^sql/outbox--([\d.]+)--([\d.]+)\.sql$} ? ($1 => $2) : () } glob('sql/outbox--*--*.sql');
my @chain = ('1.0');
push @chain, $next{ $chain[-1] } while exists $next{ $chain[-1] } && @chain <= keys %next;
is($chain[-1], $version, "the upgrade scripts lead from 1.0 to $version: @chain");
is(scalar(@chain) - 1, scalar(keys %next), 'every upgrade script is a step of that chain');

# supported PostgreSQL versions
my @majors = sort { $a <=> $b } @{ $template->{x_tested_postgresql} // [] };
is(join(' ', @majors), '15 17 18',
	'META.json.in x_tested_postgresql lists PostgreSQL 15, 17 and 18');
is($template->{prereqs}{runtime}{requires}{PostgreSQL}, "$majors[0].0.0",
	'META.json.in requires the lowest tested PostgreSQL at runtime');
my $compat = slurp_file('src/base/compat.h');
like($compat, qr/#if PG_VERSION_NUM < ${\($majors[0] * 10000)}\n#error/,
	'compat.h refuses PostgreSQL older than the lowest tested');
my ($supported) = slurp_file('README.md') =~ /^### Supported versions\n(.*?)^#/ms;
like($supported // '', qr/PostgreSQL \Q${\join(', ', @majors[0 .. $#majors - 1])} and $majors[-1]\E/,
	'the README names the tested versions');

my @sources = sort(glob('src/*.c src/*.h src/*/*.c src/*/*.h'));

# the rooms of src/, floor by floor: a file includes the headers of its own
# room and of rooms on lower floors only (docs/design.md draws them)
my %floor = (base => 1, shmem => 2, kafka => 2, registry => 2, store => 3, emit => 3,
	relay => 4, consumer => 4, launcher => 5);
my (@outside, @headless, @unfound, @upward);
for my $file (@sources)
{
	my ($room) = $file =~ m{^src/(\w+)/};
	push @outside, $file
	  unless $file eq 'src/outbox.c' || (defined $room && $floor{$room});
	for my $inc (slurp_file($file) =~ /^#include "([^"]+)"/mg)
	{
		my ($to) = $inc =~ m{^(\w+)/};
		next unless defined $to && $floor{$to};
		push @unfound, "$file: $inc" unless -f "src/$inc";
		push @upward, "$file: $inc"
		  if defined $room && $to ne $room && $floor{$to} >= $floor{$room};
	}
}
for my $room (sort keys %floor)
{
	push @headless, $room unless -f "src/$room/$room.h";
}
is(join(' ', @outside), '', 'every source file but src/outbox.c is in a room of src/');
is(join(' ', @headless), '', 'each room has its header, src/<room>/<room>.h');
is(join('; ', @unfound), '', 'every header a source file includes of ours is found');
is(join('; ', @upward), '', 'no file includes the header of a room on its floor or above');

# the house rules: no file over 800 lines, no function over 80
my (@long_files, @long_functions);
for my $file (@sources)
{
	my @lines = split /\n/, slurp_file($file);
	push @long_files, "$file (" . scalar(@lines) . ')' if @lines > 800;
	my ($name, $start);
	for my $i (0 .. $#lines)
	{
		($name, $start) = ($1, $i) if $lines[$i] =~ /^(\w+)\(/;
		if ($lines[$i] eq '}' && defined $name)
		{
			my $n = $i - $start + 1;
			push @long_functions, "$file: $name ($n)" if $n > 80;
			undef $start;
			undef $name;
		}
	}
}
is(join(' ', @long_files), '', 'no source file over 800 lines');
is(join('; ', @long_functions), '', 'no function over 80 lines');

# docs/design.md's map names every source file, and no other
my $design = slurp_file('docs/design.md');
# (by path: a bare file name in its prose is not an entry)
my %mapped = map { ("src/$_" => 1) } $design =~ /`(\w+\/\w+\.[ch]|outbox\.c)`/g;
is(join(' ', grep { !$mapped{$_} } @sources), '', 'docs/design.md maps every file of src/');
is(join(' ', grep { !-f $_ } sort keys %mapped), '', 'docs/design.md maps no file src/ lacks');

# version branches live in compat.h only
my @branching;
for my $file (@sources)
{
	next if $file eq 'src/base/compat.h';
	push @branching, $file
	  if slurp_file($file) =~ /PG_VERSION_NUM|RD_KAFKA_VERSION|rd_kafka_version|__GLIBC__|\bmallopt\b/;
}
is(join(' ', @branching), '', 'no source file but src/base/compat.h tests a version');

done_testing();
