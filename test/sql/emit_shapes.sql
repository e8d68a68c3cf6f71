-- emit_binary() and emit_tombstone(): the value as bytes, framed for a
-- schema registry, or none; their refusals.

-- bytes are stored as given, with their content type; the aggregate's
-- sequence runs through every kind of event
SELECT outbox.emit('shape', 's1', 'shape.created', '{"n": 1}') IS NOT NULL AS emitted;
SELECT outbox.emit_binary('shape', 's1', 'shape.resized', '\x00ff10'::bytea,
                          content_type => 'application/octet-stream') AS bin_id \gset
SELECT outbox.emit_tombstone('shape', 's1', 'shape.deleted') AS tomb_id \gset
SELECT event_type, seq, key, payload, payload_bytes, content_type
  FROM outbox.events WHERE aggregate_id = 's1' ORDER BY id;

-- every option of emit() reaches the row, numbered as emit() numbers them
SELECT outbox.emit_tombstone('shape', 's2', 'shape.deleted',
         headers => '{"reason": "gdpr"}', topic => 'shapes.compacted', key => 's2-key',
         event_id => '018f0000-0000-7000-8000-000000000001', schema_version => 3,
         occurred_at => '2026-01-02 03:04:05+00') IS NOT NULL AS emitted;
SELECT outbox.emit_binary('shape', 's2', 'shape.drawn', 'abc'::bytea,
         headers => '{"h": "v"}', topic => 'shapes.binary', key => 's2-key',
         event_id => '018f0000-0000-7000-8000-000000000002', schema_version => 2,
         occurred_at => '2026-01-02 03:04:06+00', content_type => 'text/plain; charset=utf-8')
       IS NOT NULL AS emitted;
SELECT event_id, event_type, topic, key, schema_version, headers, occurred_at, payload,
       payload_bytes, content_type
  FROM outbox.events WHERE aggregate_id = 's2' ORDER BY id;

-- the schema registry's frame: magic 0, the id big-endian, then the bytes
SELECT outbox.emit_binary('shape', 's3', 'shape.avro', '\x0a0b'::bytea, schema_id => 258) AS id \gset
SELECT payload_bytes FROM outbox.events WHERE event_id = :'id';
SELECT outbox.emit_binary('shape', 's3', 'shape.avro', '\x'::bytea, schema_id => 2147483647) AS id \gset
SELECT payload_bytes FROM outbox.events WHERE event_id = :'id';
-- Protobuf's message indexes: [0] is the single byte 0; others their count then each, zig-zag varints
SELECT outbox.emit_binary('shape', 's3', 'shape.proto', '\x08'::bytea, schema_id => 7,
                          message_indexes => '{0}') AS id \gset
SELECT payload_bytes FROM outbox.events WHERE event_id = :'id';
SELECT outbox.emit_binary('shape', 's3', 'shape.proto', '\x08'::bytea, schema_id => 7,
                          message_indexes => '{1,0,70}') AS id \gset
SELECT payload_bytes FROM outbox.events WHERE event_id = :'id';

-- refusals, each with its SQLSTATE
SELECT t.err($$SELECT outbox.emit('shape', 's9', 'x', NULL)$$);
SELECT t.err($$SELECT outbox.emit_binary('shape', 's9', 'x', NULL)$$);
SELECT t.err($$SELECT outbox.emit_binary('shape', 's9', 'x', '\x01', schema_id => -1)$$);
SELECT t.err($$SELECT outbox.emit_binary('shape', 's9', 'x', '\x01', message_indexes => '{0}')$$);
SELECT t.err($$SELECT outbox.emit_binary('shape', 's9', 'x', '\x01', schema_id => 1, message_indexes => '{}')$$);
SELECT t.err($$SELECT outbox.emit_binary('shape', 's9', 'x', '\x01', schema_id => 1, message_indexes => '{1,NULL}')$$);
SELECT t.err($$SELECT outbox.emit_binary('shape', 's9', 'x', '\x01', schema_id => 1, message_indexes => '{-1}')$$);
SELECT t.err($$SELECT outbox.emit_binary('shape', 's9', 'x', '\x01', schema_id => 1, message_indexes => '{{1},{2}}')$$);
SELECT t.err(format($$SELECT outbox.emit_binary('shape', 's9', 'x', '\x01', schema_id => 1, message_indexes => %L)$$,
                    array_fill(1, ARRAY[65])));
SELECT t.err($$SELECT outbox.emit_binary('shape', 's9', 'x', '\x01', content_type => '')$$);
SELECT t.err($$SELECT outbox.emit_binary('shape', 's9', 'x', '\x01', content_type => 'avro')$$);
SELECT t.err($$SELECT outbox.emit_binary('shape', 's9', 'x', '\x01', content_type => 'application/')$$);
SELECT t.err($$SELECT outbox.emit_binary('shape', 's9', 'x', '\x01', content_type => E'text/plain\r\nx-evil: 1')$$);
SELECT t.err($$SELECT outbox.emit_binary('shape', 's9', 'x', '\x01', content_type => 'text/plain; charset=é')$$);
SELECT t.err(format($$SELECT outbox.emit_binary('shape', 's9', 'x', '\x01', content_type => %L)$$,
                    'application/' || repeat('a', 250)));
SELECT t.err($$SELECT outbox.emit_binary('shape', 's9', 'x', '\x01', content_type => E'text/plain\t')$$);
SELECT t.err($$SELECT outbox.emit_binary('shape', 's9', 'x', '\x01', content_type => 'text/plain ')$$);
-- CloudEvents' own content types would have readers take the bytes for an
-- envelope (or a batch of them) whose attributes the writer chose
SELECT t.err($$SELECT outbox.emit_binary('shape', 's9', 'x', '{"specversion":"1.0"}'::bytea,
                                          content_type => 'application/cloudevents+json')$$);
SELECT t.err($$SELECT outbox.emit_binary('shape', 's9', 'x', '[]'::bytea,
                                          content_type => 'Application/CloudEvents-Batch+JSON')$$);
SELECT outbox.emit_binary('shape', 's10', 'x', '\x01', content_type => 'text/plain ; charset=us-ascii')
       IS NOT NULL AS parameters_pass;
SELECT t.err($$SELECT outbox.emit_tombstone('shape', '', 'x')$$);
SELECT t.err($$SELECT outbox.emit_tombstone('shape', 's9', 'x', key => '')$$);
SELECT t.err($$SELECT outbox.emit_tombstone('shape', 's9', 'x', schema_version => 0)$$);
SELECT t.err($$SELECT outbox.emit_tombstone('shape', 's9', 'x', headers => '{"content-type": "a/b"}')$$);
SELECT t.err($$SELECT outbox.emit_binary('shape', 's9', 'x', '\x01', headers => '{"id": "forged"}')$$);
SELECT t.err($$SELECT outbox.emit_binary('shape', 's9', 'x', '\x01', topic => 'bad topic')$$);
-- names of the event hold no control character (C0, DEL; C1 in a UTF-8
-- database, TAP 115)
SELECT t.err($$SELECT outbox.emit('shape', E's\t9', 'x', '{}')$$);
SELECT t.err($$SELECT outbox.emit_tombstone('shape', 's9', E'x\n')$$);
SELECT t.err($$SELECT outbox.emit_binary(E'\x7fshape', 's9', 'x', '\x01')$$);
SELECT t.err($$SELECT outbox.emit('shape', 's9', 'x', '{}', key => E'k\x1f')$$);
SELECT outbox.emit('shape', 's10', 'x', '{}', key => 'k "é" \\ ✓') IS NOT NULL AS other_unicode_passes;
-- the frame counts against outbox.max_payload_bytes
SET outbox.max_payload_bytes = 8;
SELECT outbox.emit_binary('shape', 's9', 'x', '\x0102030405060708'::bytea) IS NOT NULL AS eight_bytes_pass;
SELECT t.err($$SELECT outbox.emit_binary('shape', 's9', 'x', '\x010203040506070809')$$);
SELECT t.err($$SELECT outbox.emit_binary('shape', 's9', 'x', '\x01020304', schema_id => 1)$$);
RESET outbox.max_payload_bytes;
-- the Kafka size check (message.max.bytes, 1000000 here) counts the bytes
-- as they are and the content type's header: as emit.sql counts, less the
-- JSON object around the value and the caller's header
SET outbox.aggregate_sequence = off;
SELECT outbox.emit_binary('shape', '1', 'x', decode(repeat('ab', 999773), 'hex'), key => 'k')
       IS NOT NULL AS bytes_at_limit_ok;
SELECT t.err($$SELECT outbox.emit_binary('shape', '1', 'x', decode(repeat('ab', 999774), 'hex'), key => 'k')$$);
SELECT outbox.emit_binary('shape', '1', 'x', decode(repeat('ab', 999756), 'hex'), key => 'k',
                          content_type => 'a/b') IS NOT NULL AS typed_bytes_at_limit_ok;
SELECT t.err($$SELECT outbox.emit_binary('shape', '1', 'x', decode(repeat('ab', 999757), 'hex'), key => 'k',
                          content_type => 'a/b')$$);
RESET outbox.aggregate_sequence;
SELECT count(*) AS one_row_passed FROM outbox.events WHERE aggregate_id = 's9';

-- through the INSERT statement too (a table a superuser changed), each
-- column where the direct insert puts it
BEGIN;
ALTER TABLE outbox.events ADD CONSTRAINT no_forbidden CHECK (event_type <> 'forbidden');
SET client_min_messages = debug1;
SELECT outbox.emit_binary('shape', 's11', 'shape.b', '\x0a0b', content_type => 'a/b', schema_id => 1,
                          key => 'k11', headers => '{"h": "v"}') IS NOT NULL AS insert_binary_ok;
SELECT outbox.emit_tombstone('shape', 's11', 'shape.t', key => 'k11') IS NOT NULL AS insert_tombstone_ok;
RESET client_min_messages;
SELECT event_type, seq, key, headers, payload, payload_bytes, content_type
  FROM outbox.events WHERE aggregate_id = 's11' ORDER BY id;
ROLLBACK;

-- PUBLIC cannot call them; a writer granted emit() alone cannot either
CREATE ROLE shapes_writer;
GRANT USAGE ON SCHEMA outbox TO shapes_writer;
GRANT EXECUTE ON FUNCTION outbox.emit(text, text, text, jsonb, jsonb, text, text, uuid, integer, timestamptz)
  TO shapes_writer;
SET ROLE shapes_writer;
SELECT t.err($$SELECT outbox.emit_binary('shape', 's8', 'x', '\x01')$$);
SELECT t.err($$SELECT outbox.emit_tombstone('shape', 's8', 'x')$$);
RESET ROLE;
GRANT EXECUTE ON FUNCTION
  outbox.emit_binary(text, text, text, bytea, jsonb, text, text, uuid, integer, timestamptz, text, integer, integer[]),
  outbox.emit_tombstone(text, text, text, jsonb, text, text, uuid, integer, timestamptz)
  TO shapes_writer;
SET ROLE shapes_writer;
SELECT outbox.emit_binary('shape', 's8', 'x', '\x01') IS NOT NULL AS writer_emits_bytes;
SELECT outbox.emit_tombstone('shape', 's8', 'x') IS NOT NULL AS writer_emits_tombstone;
SELECT t.err($$SELECT payload_bytes FROM outbox.events$$);
RESET ROLE;
REVOKE ALL ON FUNCTION outbox.emit(text, text, text, jsonb, jsonb, text, text, uuid, integer, timestamptz),
  outbox.emit_binary(text, text, text, bytea, jsonb, text, text, uuid, integer, timestamptz, text, integer, integer[]),
  outbox.emit_tombstone(text, text, text, jsonb, text, text, uuid, integer, timestamptz)
  FROM shapes_writer;
REVOKE ALL ON SCHEMA outbox FROM shapes_writer;
DROP ROLE shapes_writer;

DELETE FROM outbox.events WHERE aggregate_type = 'shape';
DELETE FROM outbox.aggregates WHERE aggregate_type = 'shape';
