# test/perl/OutboxRegistry.pm: a schema registry for the tests, on
# loopback, with the Confluent-compatible REST API the relay calls.
#
# OutboxRegistry->start([auth => 'user:password']) starts the registry
# stand-in of the test tool (test/kafka/src/OutboxKafkaTool.java,
# registry-stand-in): a STAND-IN written for these tests, not a registry,
# serving the three calls the relay and the tests make, in memory.
# pause() and resume() freeze and thaw its process (SIGSTOP, SIGCONT), so a
# registry that stops answering without closing its port can be drilled.
#
# With OUTBOX_TEST_REGISTRY_URL set, start() uses that registry instead
# (e.g. Apicurio Registry's http://127.0.0.1:8080/apis/ccompat/v7, without
# a login), and OUTBOX_TEST_REGISTRY_PID names its process for pause() and
# resume(); the test leaves it running.

package OutboxRegistry;

use strict;
use warnings;

use File::Basename qw(dirname);
use HTTP::Tiny;
use IPC::Run;
use JSON::PP;
use MIME::Base64;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);

my $APACHE = dirname(__FILE__) . '/../kafka/apache';

sub free_port
{
	my $s = IO::Socket::INET->new(LocalAddr => '127.0.0.1', LocalPort => 0,
		Listen => 1, ReuseAddr => 1) or die "no free port: $!";
	my $port = $s->sockport;
	close $s;
	return $port;
}

sub start
{
	my ($class, %p) = @_;
	if (my $external = $ENV{OUTBOX_TEST_REGISTRY_URL})
	{
		note "registry: $external (OUTBOX_TEST_REGISTRY_URL), no login";
		return bless { url => $external, pid => $ENV{OUTBOX_TEST_REGISTRY_PID} }, $class;
	}
	require IO::Socket::INET;
	my $port = free_port();
	my ($out, $err) = ('', '');
	my $h = IPC::Run::start(
		[ $APACHE, 'client', 'registry-stand-in', $port, ($p{auth} // ()) ],
		'<', \undef, '>', \$out, '2>', \$err);
	my $deadline = time() + 120;
	while ($out !~ /listening/ && time() < $deadline)
	{
		$h->pump_nb;
		select(undef, undef, undef, 0.1);
	}
	BAIL_OUT("the registry stand-in did not start: $err") unless $out =~ /listening/;
	my $self = bless {
		h => $h, port => $port, auth => $p{auth},
		url => "http://127.0.0.1:$port/apis/ccompat/v7",
	}, $class;
	return $self;
}

sub url { return $_[0]{url}; }

# the URL with the credentials in it, for the Java reader
sub url_with_auth
{
	my ($self) = @_;
	return $self->{url} unless $self->{auth};
	(my $u = $self->{url}) =~ s{^http://}{http://$self->{auth}@};
	return $u;
}

sub http
{
	my ($self, $method, $path, $body) = @_;
	my %headers = ('Content-Type' => 'application/vnd.schemaregistry.v1+json');
	$headers{Authorization} = 'Basic ' . encode_base64($self->{auth}, '')
	  if $self->{auth};
	my $r = HTTP::Tiny->new(timeout => 10)->request($method, $self->{url} . $path,
		{ headers => \%headers, (defined $body ? (content => $body) : ()) });
	return $r;
}

# register(subject, schema): registers the Avro schema (JSON text) under
# subject; returns its id
sub register
{
	my ($self, $subject, $schema) = @_;
	my $r = $self->http('POST', "/subjects/$subject/versions",
		encode_json({ schema => $schema }));
	die "registering $subject: $r->{status} $r->{content}" unless $r->{success};
	return decode_json($r->{content})->{id};
}

# the java process under the tool's shell
sub java_pid
{
	my ($self) = @_;
	return $self->{pid} if $self->{pid};
	my $shell = $self->{h}{KIDS}[0]{PID};
	my $pid = `pgrep -P $shell java` || `pgrep -P $shell`;
	chomp $pid;
	($pid) = split /\n/, $pid;
	return $pid;
}

sub pause { my ($self) = @_; kill 'STOP', $self->java_pid; }
sub resume { my ($self) = @_; kill 'CONT', $self->java_pid; }

sub stop
{
	my ($self) = @_;
	return unless $self->{h};
	my $pid = $self->java_pid;
	kill 'CONT', $pid if $pid;
	kill 'TERM', $pid if $pid;
	$self->{h}->kill_kill;
	delete $self->{h};
}

sub DESTROY { $_[0]->stop; }

1;
