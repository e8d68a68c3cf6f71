# The version is written once, in outbox.control; META.json must agree, and
# sql/ holds the 1.0 script, the upgrade chain to that version and the
# current install script.  META.json states the supported PostgreSQL
# versions; the lowest is the runtime prerequisite and the floor compat.h
# enforces, the README names them all, and no source file but src/compat.h
# tests a version.
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;

my $control = slurp_file('outbox.control');
my ($version) = $control =~ /^default_version\s*=\s*'([^']+)'/m;
ok(defined $version, 'outbox.control has a default_version');

my $meta = slurp_file('META.json');
my ($meta_version) = $meta =~ /"version"\s*:\s*"([^"]+)"/;
my ($provides_version) = $meta =~ /"provides".*?"version"\s*:\s*"([^"]+)"/s;
# PGXN wants semantic versions: 1.0 in the control file is 1.0.0 there
my $semver = $version =~ /^\d+\.\d+$/ ? "$version.0" : $version;
is($meta_version, $semver, 'META.json version matches outbox.control');
is($provides_version, $semver, 'META.json provides version matches outbox.control');

# sql/: the frozen 1.0 script, the upgrade chain from it to the current
# version, and the current version's script, sql/outbox.sql, that make
# copies to sql/outbox--$version.sql; no other version has a full script
ok(-f 'sql/outbox.sql', 'the current install script sql/outbox.sql exists');
my ($provides_file) = $meta =~ /"provides".*?"file"\s*:\s*"([^"]+)"/s;
is($provides_file, 'sql/outbox.sql', 'META.json provides the current install script');
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
my ($tested) = $meta =~ /"x_tested_postgresql"\s*:\s*\[([^\]]*)\]/;
my @majors = sort { $a <=> $b } ($tested // '') =~ /"(\d+)"/g;
is(join(' ', @majors), '15 17 18',
	'META.json x_tested_postgresql lists PostgreSQL 15, 17 and 18');
my ($requires) = $meta =~ /"PostgreSQL"\s*:\s*"([^"]+)"/;
is($requires, "$majors[0].0.0",
	'META.json requires the lowest tested PostgreSQL at runtime');
my $compat = slurp_file('src/compat.h');
like($compat, qr/#if PG_VERSION_NUM < ${\($majors[0] * 10000)}\n#error/,
	'compat.h refuses PostgreSQL older than the lowest tested');
my ($supported) = slurp_file('README.md') =~ /^### Supported versions\n(.*?)^#/ms;
like($supported // '', qr/PostgreSQL \Q${\join(', ', @majors[0 .. $#majors - 1])} and $majors[-1]\E/,
	'the README names the tested versions');

# version branches live in compat.h only
my @branching;
for my $file (glob('src/*.c src/*.h'))
{
	next if $file eq 'src/compat.h';
	push @branching, $file
	  if slurp_file($file) =~ /PG_VERSION_NUM|RD_KAFKA_VERSION|rd_kafka_version|__GLIBC__|\bmallopt\b/;
}
is(join(' ', @branching), '', 'no source file but src/compat.h tests a version');

done_testing();
