# PgxnMeta: checks a decoded META.json against the PGXN Meta Spec 1.0.0
# (https://pgxn.org/spec/), the format PGXN and its clients read.  Written
# for outbox's tests from the spec's rules; validate() returns the list of
# what breaks them, empty when the document is valid.
package PgxnMeta;

use strict;
use warnings;
use Exporter 'import';
use B;

our @EXPORT_OK = qw(validate);

my %LICENSES = map { $_ => 1 } qw(agpl_3 apache_1_1 apache_2_0 artistic_1
  artistic_2 bsd freebsd gfdl_1_2 gfdl_1_3 gpl_1 gpl_2 gpl_3 lgpl_2_1 lgpl_3_0
  mit mozilla_1_0 mozilla_1_1 openssl perl_5 postgresql qpl_1_0 ssleay sun
  zlib open_source restricted unrestricted unknown);
my %TOP = map { $_ => 1 } qw(name abstract description version maintainer
  license provides meta-spec prereqs release_status resources no_index tags
  generated_by);
my @REQUIRED = qw(name abstract maintainer license provides meta-spec version);
my $PRE = qr/(?:0|[1-9]\d*|\d*[A-Za-z-][0-9A-Za-z-]*)/;
my $SEMVER = qr/^(?:0|[1-9]\d*)\.(?:0|[1-9]\d*)\.(?:0|[1-9]\d*)
	(?:-$PRE(?:\.$PRE)*)?(?:\+[0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*)?$/x;
my %SPEC_URL = map { $_ => 1 } qw(https://pgxn.org/meta/spec.txt http://pgxn.org/meta/spec.txt);

sub is_custom { return $_[0] =~ /^x_./i; }

# a JSON string: defined, not a reference, not a number, not empty
sub is_string
{
	my ($v) = @_;
	return 0 unless defined $v && !ref $v;
	# before anything reads it as text, which would cache a string form
	my $flags = B::svref_2object(\$_[0])->FLAGS;
	return 0 if ($flags & (B::SVp_IOK | B::SVp_NOK)) && !($flags & B::SVp_POK);
	return length $v;
}
sub is_term { return is_string($_[0]) && $_[0] =~ m{^[^/\\\s\p{Cntrl}]{2,}$}; }
sub is_semver { return is_string($_[0]) && $_[0] =~ $SEMVER; }

sub is_range
{
	my ($r) = @_;
	return 0 unless defined $r && !ref $r && length $r;
	return 1 if $r eq '0';
	foreach my $part (split /\s*,\s*/, $r, -1)
	{
		my ($op, $v) = $part =~ /^\s*(==|!=|>=|<=|>|<)?\s*(\S+)\s*$/;
		return 0 unless defined $v && ($v eq '0' || is_semver($v));
	}
	return 1;
}

# object(errors, where, value, allowed keys): a hash of at least one key,
# each allowed or custom (x_...)
sub object
{
	my ($err, $where, $v, @allowed) = @_;
	if (ref $v ne 'HASH' || !%$v)
	{
		push @$err, "$where must be an object of at least one key";
		return 0;
	}
	my %ok = map { $_ => 1 } @allowed;
	push @$err, map { "$where has the unknown key \"$_\"" }
	  grep { !$ok{$_} && !is_custom($_) } sort keys %$v;
	return 1;
}

sub check_license
{
	my ($err, $l) = @_;
	if (ref $l eq 'HASH')
	{
		push @$err, 'license: an object needs at least one name => URL' unless %$l;
		push @$err, map { "license \"$_\" has no URL" } grep { !is_string($l->{$_}) } sort keys %$l;
		return;
	}
	my @names = ref $l eq 'ARRAY' ? @$l : ($l);
	push @$err, 'license: an empty list' unless @names;
	push @$err, map { 'license "' . ($_ // 'null') . '" is not a license the spec names' }
	  grep { !defined $_ || ref $_ || !$LICENSES{$_} } @names;
}

sub check_provides
{
	my ($err, $p) = @_;
	return unless object($err, 'provides', $p, keys %{ ref $p eq 'HASH' ? $p : {} });
	push @$err, 'provides names no extension' unless %$p;
	foreach my $ext (sort keys %$p)
	{
		my $e = $p->{$ext};
		push @$err, "provides: \"$ext\" is not a term" unless is_term($ext);
		next unless object($err, "provides.$ext", $e, qw(file version abstract docfile));
		push @$err, "provides.$ext.file is missing" unless is_string($e->{file});
		push @$err, "provides.$ext.version is not a semantic version" unless is_semver($e->{version});
		foreach my $k (qw(abstract docfile))
		{
			push @$err, "provides.$ext.$k must be a string"
			  if exists $e->{$k} && !is_string($e->{$k});
		}
	}
}

sub check_prereqs
{
	my ($err, $p) = @_;
	my @phases = qw(configure build test runtime develop);
	return unless object($err, 'prereqs', $p, @phases);
	foreach my $phase (grep { exists $p->{$_} } @phases)
	{
		my $rel = $p->{$phase};
		next unless object($err, "prereqs.$phase", $rel, qw(requires recommends suggests conflicts));
		foreach my $kind (sort keys %$rel)
		{
			next if is_custom($kind);
			my $list = $rel->{$kind};
			next unless object($err, "prereqs.$phase.$kind", $list, keys %{ ref $list eq 'HASH' ? $list : {} });
			push @$err, map { "prereqs.$phase.$kind: \"$_\" is not a term" } grep { !is_term($_) } sort keys %$list;
			push @$err, map { "prereqs.$phase.$kind.$_: \"" . ($list->{$_} // 'null') . '" is not a version range' }
			  grep { !is_range($list->{$_}) } sort keys %$list;
		}
	}
}

sub check_resources
{
	my ($err, $r) = @_;
	return unless object($err, 'resources', $r, qw(homepage bugtracker repository));
	push @$err, 'resources.homepage must be a URI'
	  if exists $r->{homepage} && !(is_string($r->{homepage}) && $r->{homepage} =~ m{^\w[\w+.-]*:});
	my ($bt, $repo) = @$r{qw(bugtracker repository)};
	push @$err, 'resources.bugtracker needs web or mailto'
	  if exists $r->{bugtracker} && object($err, 'resources.bugtracker', $bt, qw(web mailto))
	  && !exists $bt->{web} && !exists $bt->{mailto};
	if (exists $r->{repository} && object($err, 'resources.repository', $repo, qw(url web type)))
	{
		push @$err, 'resources.repository needs url or web' unless exists $repo->{url} || exists $repo->{web};
		push @$err, 'resources.repository: a url needs its type' if exists $repo->{url} && !is_string($repo->{type});
	}
}

sub check_tags
{
	my ($err, $t) = @_;
	if (ref $t ne 'ARRAY' || !@$t)
	{
		push @$err, 'tags must be a list of at least one tag';
		return;
	}
	push @$err, map { 'tag "' . ($_ // 'null') . '" must be 1 to 255 characters with no slash, backslash or control character' }
	  grep { !is_string($_) || length($_) > 255 || m{[/\\\p{Cntrl}]} } @$t;
}

sub validate
{
	my ($m) = @_;
	my @err;
	return ('the document is not a JSON object') unless ref $m eq 'HASH';
	push @err, map { "the mandatory field \"$_\" is missing" } grep { !exists $m->{$_} } @REQUIRED;
	push @err, map { "the field \"$_\" is not in the spec (custom fields start with x_)" }
	  grep { !$TOP{$_} && !is_custom($_) } sort keys %$m;

	push @err, 'name is not a term (two or more characters, no space, slash, backslash or control character)'
	  if exists $m->{name} && !is_term($m->{name});
	push @err, 'version is not a semantic version (like 1.8.0)'
	  if exists $m->{version} && !is_semver($m->{version});
	foreach my $k (qw(abstract description generated_by))
	{
		push @err, "$k must be a non-empty string" if exists $m->{$k} && !is_string($m->{$k});
	}
	if (exists $m->{maintainer})
	{
		my $mt = $m->{maintainer};
		my @names = ref $mt eq 'ARRAY' ? @$mt : ($mt);
		push @err, 'maintainer must be a name or a non-empty list of names'
		  if !@names || grep { !is_string($_) } @names;
	}
	check_license(\@err, $m->{license}) if exists $m->{license};
	check_provides(\@err, $m->{provides}) if exists $m->{provides};
	if (exists $m->{'meta-spec'} && object(\@err, 'meta-spec', $m->{'meta-spec'}, qw(version url)))
	{
		push @err, 'meta-spec.version must be 1.0.x'
		  unless ($m->{'meta-spec'}{version} // '') =~ /^1\.0\.\d+$/;
		push @err, 'meta-spec.url must be the spec\'s, https://pgxn.org/meta/spec.txt'
		  if exists $m->{'meta-spec'}{url} && !$SPEC_URL{ $m->{'meta-spec'}{url} // '' };
	}
	check_prereqs(\@err, $m->{prereqs}) if exists $m->{prereqs};
	push @err, 'release_status must be stable, testing or unstable'
	  if exists $m->{release_status} && ($m->{release_status} // '') !~ /^(?:stable|testing|unstable)$/;
	check_resources(\@err, $m->{resources}) if exists $m->{resources};
	object(\@err, 'no_index', $m->{no_index}, qw(file directory)) if exists $m->{no_index};
	check_tags(\@err, $m->{tags}) if exists $m->{tags};
	return @err;
}

1;
