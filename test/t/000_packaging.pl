# The version is written once, in outbox.control; META.json must agree, and
# the install script for it must exist.
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
ok(-f "sql/outbox--$version.sql", "install script sql/outbox--$version.sql exists");

done_testing();
