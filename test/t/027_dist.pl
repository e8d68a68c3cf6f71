# The release files: META.json made from META.json.in is valid PGXN metadata
# (test/perl/PgxnMeta.pm, the spec's rules, shown to refuse what breaks
# them) and carries outbox.control's version; debian/changelog and
# debian/pgversions agree with it; make dist writes outbox-VERSION.zip,
# whose tree builds on its own.
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use JSON::PP;
use File::Temp qw(tempdir);
use IO::Uncompress::Unzip qw($UnzipError);
use FindBin;
use lib "$FindBin::RealBin/../perl";
use PgxnMeta qw(validate);

my ($version) = slurp_file('outbox.control') =~ /^default_version\s*=\s*'([^']+)'/m;
my $semver = $version =~ /^\d+\.\d+$/ ? "$version.0" : $version;

unlink 'META.json';
my ($out, $err) = run_command([ 'make', '-s', 'META.json' ]);
ok(-f 'META.json', 'make META.json makes it') or diag($err);
my $meta = decode_json(slurp_file('META.json'));
my @problems = validate($meta);
is_deeply(\@problems, [], 'META.json is valid PGXN metadata (Meta Spec 1.0.0)');
is($meta->{version}, $semver, "META.json's version is outbox.control's ($version is $semver)");
is($meta->{provides}{outbox}{version}, $semver, 'and so is its extension\'s');

# the checker refuses what the spec refuses
my %broken = (
	'no license' => sub { delete $_[0]{license} },
	'a two-part version' => sub { $_[0]{version} = '1.8' },
	'an unknown license' => sub { $_[0]{license} = 'postgres' },
	'a field outside the spec' => sub { $_[0]{homepage} = 'https://example.org' },
	'an extension without its file' => sub { delete $_[0]{provides}{outbox}{file} },
	'a name with a slash' => sub { $_[0]{name} = 'out/box' },
	'a prerequisite that is no version' => sub { $_[0]{prereqs}{runtime}{requires}{PostgreSQL} = 'fifteen' },
	'meta-spec 2' => sub { $_[0]{'meta-spec'}{version} = '2.0.0' },
	'a tag with a slash' => sub { $_[0]{tags} = ['a/b'] },
	'an unknown release status' => sub { $_[0]{release_status} = 'final' },
	'an empty version range' => sub { $_[0]{prereqs}{runtime}{requires}{PostgreSQL} = '' },
	'a range ending in a comma' => sub { $_[0]{prereqs}{runtime}{requires}{PostgreSQL} = '15.0.0,' },
	'a prerequisite named with a space' => sub { $_[0]{prereqs}{runtime}{requires}{'Post gres'} = '0' },
	'an empty prereqs' => sub { $_[0]{prereqs} = {} },
	'a number for abstract' => sub { $_[0]{abstract} = 42 },
	'a pre-release with a leading zero' => sub { $_[0]{version} = '1.8.0-01' },
	'a repository url without its type' => sub { $_[0]{resources} = { repository => { url => 'git://x/y.git' } } });
foreach my $case (sort keys %broken)
{
	my $copy = decode_json(encode_json($meta));
	$broken{$case}->($copy);
	my @found = validate($copy);
	ok(scalar @found, "the checker refuses $case: @found");
}

# and takes what the spec allows
my %fine = (
	'a list of licenses' => sub { $_[0]{license} = [ 'postgresql', 'mit' ] },
	'a license named by URL' => sub { $_[0]{license} = { 'PostgreSQL' => 'https://www.postgresql.org/about/licence/' } },
	'ranges with operators' => sub { $_[0]{prereqs}{runtime}{requires}{PostgreSQL} = '>= 15.0.0, < 19.0.0, != 16.0.0' },
	'custom keys' => sub { $_[0]{x_anything} = [1]; $_[0]{provides}{outbox}{X_note} = 'y' },
	'a repository with url and type' => sub { $_[0]{resources} = { repository => { url => 'git://x/y.git', type => 'git' } } },
	'a pre-release' => sub { $_[0]{version} = '1.9.0-beta.1' });
foreach my $case (sort keys %fine)
{
	my $copy = decode_json(encode_json($meta));
	$fine{$case}->($copy);
	my @found = validate($copy);
	is_deeply(\@found, [], "the checker takes $case");
}

# Debian: the package's upstream version is outbox.control's, for the
# PostgreSQL versions META.json.in lists
my ($deb) = slurp_file('debian/changelog') =~ /^outbox \(([^)]+)\)/;
like($deb, qr/^\Q$semver\E-\d+$/, "debian/changelog's top version ($deb) is $semver-N");
my @pgversions = sort { $a <=> $b } grep { /\d/ } split /\s+/, slurp_file('debian/pgversions');
is(join(' ', @pgversions), join(' ', sort { $a <=> $b } @{ $meta->{x_tested_postgresql} }),
	'debian/pgversions lists the tested PostgreSQL versions');

SKIP:
{
	skip 'not a git checkout with git: make dist archives a commit', 5
	  unless -d '.git' && system('git --version >/dev/null 2>&1') == 0;
	my $zip = "outbox-$semver.zip";
	unlink $zip;
	($out, $err) = run_command([ 'make', '-s', 'dist' ]);
	ok(-f $zip, "make dist writes $zip") or diag($err);

	my $dir = tempdir(CLEANUP => 1);
	my $u = IO::Uncompress::Unzip->new($zip) or die "unzip $zip: $UnzipError";
	my @names;
	for (my $status = 1; $status > 0; $status = $u->nextStream)
	{
		my $name = $u->getHeaderInfo->{Name};
		push @names, $name;
		next if $name =~ m{/$};
		my $path = "$dir/$name";
		(my $parent = $path) =~ s{/[^/]*$}{};
		system('mkdir', '-p', $parent) == 0 or die "mkdir $parent";
		open my $fh, '>', $path or die "$path: $!";
		my $buf;
		print $fh $buf while $u->read($buf) > 0;
		close $fh;
	}
	my ($head) = run_command([ 'git', 'ls-tree', '-r', '--name-only', 'HEAD' ]);
	my @want = map { "outbox-$semver/$_" } (split(/\n/, $head), 'META.json');
	my %have = map { $_ => 1 } @names;
	is(join(' ', grep { !$have{$_} } @want), '', "the zip holds every file of HEAD and META.json, under outbox-$semver/");
	is(decode_json(slurp_file("$dir/outbox-$semver/META.json"))->{version}, $semver,
		'its META.json carries the version');

	# the tree in the zip builds by itself (PGXS, the pg_config on PATH)
	($out, $err) = run_command([ 'make', '-s', '-j2', '-C', "$dir/outbox-$semver", 'with_llvm=no' ]);
	ok(-f "$dir/outbox-$semver/outbox.so", 'the zip\'s tree builds outbox.so') or diag($err);
	ok(-f "$dir/outbox-$semver/sql/outbox--$version.sql", "and sql/outbox--$version.sql");
	unlink $zip;
}

done_testing();
