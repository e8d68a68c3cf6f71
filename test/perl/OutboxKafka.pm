# test/perl/OutboxKafka.pm: the TAP tests' Apache Kafka cluster (test tool
# only, never installed), started and stopped with test/kafka/apache, and
# read back with Kafka's own Java client (test/kafka/src/OutboxKafkaTool.java).

=pod

=head1 NAME

OutboxKafka - a real Apache Kafka cluster (KRaft, 3 brokers) for the 3xx tests

=head1 SYNOPSIS

  use OutboxKafka;

  my $kafka = OutboxKafka::Cluster->start(brokers => 3);
  my $node = outbox_node('x', $kafka);          # OutboxTest, PLAINTEXT
  $kafka->kill(2); $kafka->start_broker(2);
  my $msgs = $kafka->read_java('outbox.event.drill');

=head1 DESCRIPTION

An OutboxKafka::Cluster has a bootstrap method, so OutboxTest's kcat
helpers (read_topic, wait_for_events) take it as they take the mock
broker.  read_java reads with the Java client instead and adds, to each
message, java_partition: the partition Java's default partitioner picks
for its key.  Every cluster is brought down at END, and when the test
dies.

=cut

package OutboxKafka::Cluster;

use strict;
use warnings;

use Carp;
use File::Basename qw(dirname);
use IPC::Run;
use JSON::PP;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);

my $APACHE = dirname(__FILE__) . '/../kafka/apache';
my @running;

sub run_apache
{
	my (@args) = @_;
	my ($out, $err) = ('', '');
	my $ok = IPC::Run::run([ $APACHE, @args ], '<', \undef, '>', \$out,
		'2>', \$err, IPC::Run::timeout(300));
	return ($ok, $out, $err);
}

=pod

=over

=item OutboxKafka::Cluster->start(brokers => N, config => { k => v })

Formats and starts N brokers (default 3), with broker properties config
added to the defaults of test/kafka/apache, in a fresh temporary directory
and waits until they accept writes; BAIL_OUT when they do not.

=cut

sub start
{
	my ($class, %p) = @_;
	my $dir = PostgreSQL::Test::Utils::tempdir('apache');
	my $t0 = time();
	my $self = bless { dir => $dir, n => $p{brokers} // 3 }, $class;

	push @running, $self;
	my $conf = $p{config} // {};
	my ($ok, $out, $err) = run_apache('up', $dir, $self->{n},
		map { "$_=$conf->{$_}" } sort keys %$conf);
	BAIL_OUT("Apache Kafka did not start: $err") unless $ok;
	chomp $out;
	$self->{bootstrap} = $out;
	$self->{bootstrap_sasl} = slurp_file("$dir/bootstrap.sasl");
	chomp $self->{bootstrap_sasl};
	note sprintf('Apache Kafka, %d brokers, up in %.1f s: %s',
		$self->{n}, time() - $t0, $out);
	return $self;
}

=pod

=item $c->bootstrap, $c->bootstrap_sasl, $c->dir

The PLAINTEXT bootstrap (no authentication, principal ANONYMOUS, a super
user), the SASL_PLAINTEXT one (SCRAM-SHA-512), the cluster's directory.

=cut

sub bootstrap { return $_[0]{bootstrap}; }
sub bootstrap_sasl { return $_[0]{bootstrap_sasl}; }
sub dir { return $_[0]{dir}; }

=pod

=item $c->kill(I), $c->stop_broker(I), $c->start_broker(I)

kill -9 of broker I, graceful stop, start again.

=cut

sub broker_cmd
{
	my ($self, $cmd, $i) = @_;
	my ($ok, $out, $err) = run_apache($cmd, $self->{dir}, $i);
	croak "apache $cmd $i failed: $err" unless $ok;
	note "broker $i: $cmd";
	return;
}

sub kill { my ($s, $i) = @_; return $s->broker_cmd('kill', $i); }
sub stop_broker { my ($s, $i) = @_; return $s->broker_cmd('stop', $i); }
sub start_broker { my ($s, $i) = @_; return $s->broker_cmd('start', $i); }

=pod

=item $c->tool(class, args...)

Runs a Kafka admin tool's class on the cluster's classpath; returns its
standard output, dies when it fails.

=cut

sub tool
{
	my ($self, @args) = @_;
	my ($ok, $out, $err) = run_apache('tool', $self->{dir}, @args);
	croak "kafka tool @args[0..1] failed: $err$out" unless $ok;
	return $out;
}

=pod

=item $c->create_topic(name, partitions, config => value, ...)

Creates a topic (replication factor 3 capped at the brokers) with
TopicCommand.

=cut

sub create_topic
{
	my ($self, $topic, $parts, %config) = @_;
	my $rf = $self->{n} < 3 ? $self->{n} : 3;
	return $self->tool('org.apache.kafka.tools.TopicCommand',
		'--bootstrap-server', $self->{bootstrap}, '--create',
		'--topic', $topic, '--partitions', $parts,
		'--replication-factor', $rf,
		map { ('--config', "$_=$config{$_}") } sort keys %config);
}

=pod

=item $c->leaders(topic)

A hash reference: partition => { leader => broker id, isr => [ids] }.

=cut

sub leaders
{
	my ($self, $topic) = @_;
	my ($ok, $out, $err) =
	  run_apache('client', 'leaders', $self->{bootstrap}, $topic);
	croak "leaders of $topic: $err" unless $ok;
	my %l;
	foreach (split /\n/, $out)
	{
		my ($p, $leader, $isr) = split / /;
		$l{$p} = { leader => $leader, isr => [ split /,/, $isr // '' ] };
	}
	return \%l;
}

=pod

=item $c->read_java(topic [, isolation => level])

Every message of topic from the beginning to its end offsets, read with
the Java client (isolation.level read_uncommitted, the Java default, or
isolation => 'read_committed': then aborted transactions' messages are
left out), in partition and offset order: hashes { partition,
offset, key, value, value_hex, headers (name => last value), header_list,
java_partition }, the shape of OutboxTest::read_topic plus
value_hex and java_partition.  With cloudevents => 1, each also has
cloudevent: the message as the CloudEvents SDK's Kafka deserializer
decodes it; with avro_schema => file, frame: the value read as a schema
registry's wire format, its record decoded by Apache Avro with the schema
in file (test/kafka/src/OutboxKafkaTool.java says their fields); with
registry => url, the same with each record's schema fetched by the
frame's id from the schema registry at url (credentials in the URL).  undef
when the read fails or the topic is missing.

=cut

sub read_java
{
	my ($self, $topic, %opt) = @_;
	my @mode =
	    $opt{cloudevents} ? ('cloudevents')
	  : $opt{avro_schema} ? ('frames')
	  : $opt{registry}    ? ('registry')
	  :                     ('read');
	my ($ok, $out, $err) =
	  run_apache('client', @mode, $self->{bootstrap}, $topic,
		($opt{avro_schema} // $opt{registry} // ()),
		'isolation.level=' . ($opt{isolation} // 'read_uncommitted'));
	if (!$ok)
	{
		note "Java read of $topic failed: $err";
		return undef;
	}
	my @msgs;
	foreach my $line (split /\n/, $out)
	{
		my $m = decode_json($line);
		$m->{header_list} = $m->{headers};
		$m->{headers} = { map { ($_->[0] => $_->[1]) } @{ $m->{header_list} } };
		push @msgs, $m;
	}
	@msgs = sort {
		$a->{partition} <=> $b->{partition}
		  or $a->{offset} <=> $b->{offset}
	} @msgs;
	return \@msgs;
}

=pod

=item $c->wait_for_events(topic, ids [, timeout [, isolation => level]])

OutboxTest::wait_for_events with the Java reader: it reads up to the end
offsets of when it starts, so it ends under load too (kcat's end of
partition event may not come while a partition keeps growing).

=cut

sub wait_for_events
{
	my ($self, $topic, $ids, $timeout, %opt) = @_;
	my $deadline = time() + ($timeout // 60);
	my ($msgs, @missing) = ([]);

	while (1)
	{
		$msgs = $self->read_java($topic, %opt) // $msgs;
		my %seen = map { ($_->{headers}{id} // '') => 1 } @$msgs;
		@missing = grep { !$seen{$_} } @$ids;
		return $msgs unless @missing;
		last if time() > $deadline;
		select(undef, undef, undef, 0.2);
	}
	fail("topic $topic receives all " . scalar(@$ids)
		  . " events (missing " . scalar(@missing) . ", e.g. $missing[0])");
	return $msgs;
}

=pod

=item $c->down

Stops every broker (a graceful stop, then kill -9 after 60 s).

=cut

sub down
{
	my ($self) = @_;
	return unless $self->{dir};
	run_apache('down', $self->{dir});
	@running = grep { $_ != $self } @running;
	return;
}

END
{
	my $status = $?;
	my @all = @running;
	$_->down foreach @all;
	$? = $status;
}

=pod

=back

=cut

1;
