# test/t/115_message_formats.pl: outbox.message_format, read back by kcat.
# cloudevents_binary adds the CloudEvents attributes as ce_ headers, and
# content-type, to the payload and outbox's own headers; every attribute is
# what was emitted.  cloudevents_structured sends the JSON envelope whose
# data is the payload; hostile strings (quotes, backslashes, control and
# non-ASCII characters in the aggregate id, the event type and the source)
# stay JSON strings that decode to what was emitted; control characters,
# which no CloudEvents string may hold, are refused at emit (22023).  A reload switches
# the format between events.  emit()'s size check counts the format: an
# event that fits natively but not in its envelope is refused (54000).

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use JSON::PP;
use Encode qw(encode_utf8 decode_utf8);

use FindBin;
use lib "$FindBin::RealBin/../perl";
use OutboxTest;

my $topic = 'outbox.event.shape';
my $kafka = OutboxTest::Broker->start(brokers => 1);
my $node = outbox_node('formats', $kafka,
	conf => "outbox.message_format = cloudevents_binary\n");
$node->safe_psql('postgres', 'CREATE EXTENSION outbox');
ok(defined wait_for_relay($node, 'postgres', 30), 'the relay runs');

sub emit
{
	my ($id, $type, $payload, $tp) = @_;
	my $set = defined $tp ? "SET LOCAL outbox.traceparent = '$tp';" : '';
	return $node->safe_psql('postgres', qq{BEGIN; $set
SELECT outbox.emit('shape', \$a\$$id\$a\$, \$t\$$type\$t\$, \$p\$$payload\$p\$); COMMIT;});
}

sub message_of
{
	my ($msgs, $id) = @_;
	my ($m) = grep { ($_->{headers}{id} // '') eq $id } @$msgs;
	return $m;
}

# --- binary: the attributes in ce_ headers
my $tp = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01';
my @bin = (emit('42', 'order.confirmed', '{"total": 250}', $tp),
	emit('43', 'order.shipped', '{"carrier": "ups"}'));
my $msgs = wait_for_events($kafka, $topic, \@bin) // [];
my %seq;
foreach my $id (@bin)
{
	my $m = message_of($msgs, $id) // {};
	my $h = $m->{headers} // {};
	my %want = (
		ce_specversion => '1.0',
		ce_id => $id,
		ce_source => 'urn:uuid:' . ($h->{origin} // '?'),
		ce_type => $h->{event_type},
		ce_time => $h->{occurred_at},
		ce_subject => $h->{aggregate_id},
		ce_partitionkey => $m->{key},
		'content-type' => 'application/json');
	$want{ce_traceparent} = $tp if $id eq $bin[0];
	%want = (%want, ce_sequence => $h->{seq}, ce_sequencetype => 'Integer')
	  if defined $h->{seq};
	my @ce = sort grep { /^ce_|^content-type$/ } keys %$h;
	is_deeply([@ce], [ sort keys %want ], "binary: event $id has the attributes, and no other");
	is_deeply({ map { ($_ => $h->{$_}) } @ce }, \%want, "binary: each as emitted");
	like($m->{value} // '', qr/^\{"(total|carrier)"/, 'binary: the value is the payload');
	like($h->{origin} // '', qr/^[0-9a-f-]{36}$/, "binary: outbox's own headers stay");
}

# --- structured, with a source set, and hostile strings
$node->append_conf('postgresql.conf', qq{
outbox.message_format = cloudevents_structured
outbox.cloudevents_source = 'https://shop.example/orders?x=%221%22&y=(a,b)'
});
$node->reload;
sleep 1;
my $hostile_id = "q\"uote\\back/slash-\x{e9}t\x{e9} {\"x\": [1]}";
my @str = (emit(encode_utf8($hostile_id), "odd\"type\\", '{"nested": {"a": [1, "two", null]}, "s": "\\u0001"}'),
	emit('44', 'order.paid', '{"total": 250}', $tp));
$msgs = wait_for_events($kafka, $topic, \@str) // [];
my %payload = (
	$str[0] => decode_json('{"nested": {"a": [1, "two", null]}, "s": "\u0001"}'),
	$str[1] => { total => 250 });
foreach my $id (@str)
{
	my $m = message_of($msgs, $id) // {};
	my $h = $m->{headers} // {};
	is($h->{'content-type'}, 'application/cloudevents+json; charset=UTF-8',
		"structured: event $id says so in content-type");
	is(scalar(grep { /^ce_/ } keys %$h), 0, 'structured: no ce_ header');
	my $env = eval { JSON::PP->new->utf8->decode($m->{value} // '') } // {};
	my %want = (
		specversion => '1.0',
		id => $id,
		source => 'https://shop.example/orders?x=%221%22&y=(a,b)',
		type => decode_utf8($h->{event_type} // ''),
		time => $h->{occurred_at},
		subject => decode_utf8($h->{aggregate_id} // ''),
		partitionkey => decode_utf8($m->{key} // ''),
		datacontenttype => 'application/json',
		data => $payload{$id});
	$want{traceparent} = $tp if $id eq $str[1];
	%want = (%want, sequence => $h->{seq}, sequencetype => 'Integer')
	  if defined $h->{seq};
	is_deeply($env, \%want, "structured: the envelope of event $id decodes to what was emitted");
}
is(decode_utf8((message_of($msgs, $str[0]) // {})->{headers}{aggregate_id} // ''),
	$hostile_id, 'the hostile aggregate id came through whole');
# a row emit() did not write may have an occurred_at RFC 3339 cannot say:
# its event goes without the time attribute, the SDK still reads it
# and one whose aggregate id holds control characters: escaped in the envelope
my $ctl_id = "ctl\tid\x01";
my $ctl = $node->safe_psql('postgres', insert_event_sql('shape', $ctl_id, 'order.raw', q{'{}'::jsonb}));
my $cm = message_of(wait_for_events($kafka, $topic, [$ctl]) // [], $ctl);
my $cenv = eval { JSON::PP->new->utf8->decode($cm->{value} // '') } // {};
is($cenv->{subject}, $ctl_id, 'control characters of a row emit() did not write are escaped in the envelope');
my $inf = $node->safe_psql('postgres',
	insert_event_sql('shape', '46', 'order.timeless', q{'{}'::jsonb}) =~ s/now\(\) FROM s/'infinity' FROM s/r);
my $tm = message_of(wait_for_events($kafka, $topic, [$inf]) // [], $inf);
my $tenv = eval { JSON::PP->new->utf8->decode($tm->{value} // '') } // {};
is($tenv->{id}, $inf, 'an event whose occurred_at is infinite is sent in its envelope');
ok(!exists $tenv->{time}, 'without a time attribute');
my $utf8 = $node->safe_psql('postgres', 'SELECT getdatabaseencoding()') eq 'UTF8';
foreach my $bad ("tab\there", "nl\nthere", "del\x7fthere", "c1\x{85}there")
{
	next if !$utf8 && $bad =~ /^c1/;	# C1 characters are UTF-8's
	my ($ret, $out, $err) = $node->psql('postgres',
		"SELECT outbox.emit('shape', \$a\$" . encode_utf8($bad) . "\$a\$, 'x', '{}')");
	like($err, qr/aggregate_id must not contain control characters/,
		'an aggregate id with a control character is refused: ' . sprintf('U+%04X', ord(($bad =~ /([\x00-\x1f\x7f-\x9f])/)[0])));
}

# --- the size check counts the envelope
$node->append_conf('postgresql.conf',
	"outbox.kafka_config = '$OutboxTest::TEST_KAFKA_CONFIG;message.max.bytes=2000'\n");
$node->reload;
sleep 1;
my $fits = q{jsonb_build_object('blob', repeat('z', 1550))};
my ($ret, $out, $err) = $node->psql('postgres',
	"SELECT outbox.emit('shape', '45', 'order.big', $fits)",
	extra_params => [ '-v', 'VERBOSITY=verbose' ]);
like($err, qr/54000: event is \d+ bytes as a Kafka message.*\n.*in a CloudEvents envelope/,
	'an event too large in its envelope is refused (54000), the detail saying why');
$node->append_conf('postgresql.conf', "outbox.message_format = native\n");
$node->reload;
sleep 1;
($ret, $out, $err) = $node->psql('postgres', "SELECT outbox.emit('shape', '45', 'order.big', $fits)");
is($ret, 0, 'the same event fits natively');

$node->stop;
done_testing();
