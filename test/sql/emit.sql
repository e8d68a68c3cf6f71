-- outbox.emit(): rows, identity, topics, sequence, validation.

-- the happy path: one row per call, returned id is the row's event_id
BEGIN;
SELECT outbox.emit('order', '42', 'order.confirmed', '{"total": 250}') AS id \gset
SELECT event_id = :'id' AS same_id, aggregate_type, aggregate_id, seq, event_type,
       schema_version, topic, key, payload, headers, tenant, traceparent,
       txid = pg_current_xact_id() AS own_txid,
       occurred_at = now() AS occurred_now, created_at >= now() AS created_later
  FROM outbox.events WHERE event_id = :'id';
COMMIT;

-- UUIDv7: version 7, RFC variant, time-ordered, timestamp is now
SELECT substr(outbox.emit('order', '42', 'order.shipped', '{}')::text, 15, 1) AS version_nibble;
SELECT substr(outbox.uuid_v7()::text, 20, 1) IN ('8', '9', 'a', 'b') AS rfc_variant;
SELECT bool_and(a < b) AS strictly_increasing
  FROM (SELECT outbox.uuid_v7() AS a, outbox.uuid_v7() AS b FROM generate_series(1, 1000)) s;
SELECT abs(extract(epoch FROM clock_timestamp()) * 1000
           - ('x' || translate(left(outbox.uuid_v7()::text, 13), '-', ''))::bit(48)::bigint) < 5000
       AS timestamp_is_now;
-- the random tail (62 bits, drawn 64 ids at a time) is never handed out twice
SELECT count(DISTINCT right(u::text, 17)) AS distinct_random_tails
  FROM (SELECT outbox.uuid_v7() AS u FROM generate_series(1, 1000)) s;

-- seq: per aggregate, gapless; a rollback consumes no number
SELECT outbox.emit('order', '42', 'order.paid', '{}') IS NOT NULL AS emitted;
BEGIN;
SELECT outbox.emit('order', '42', 'order.cancelled', '{}') IS NOT NULL AS emitted;
ROLLBACK;
SELECT outbox.emit('order', '42', 'order.delivered', '{}') IS NOT NULL AS emitted;
SELECT outbox.emit('order', '43', 'order.confirmed', '{}') IS NOT NULL AS emitted;
SELECT outbox.emit('invoice', '42', 'invoice.issued', '{}') IS NOT NULL AS emitted;
SELECT aggregate_type, aggregate_id, event_type, seq FROM outbox.events ORDER BY id;
SELECT * FROM outbox.aggregates ORDER BY 1, 2;

-- two events of one aggregate in one transaction
BEGIN;
SELECT outbox.emit('cart', 'c1', 'cart.item_added', '{"sku": "a"}') IS NOT NULL AS emitted;
SELECT outbox.emit('cart', 'c1', 'cart.item_added', '{"sku": "b"}') IS NOT NULL AS emitted;
COMMIT;
SELECT seq, payload FROM outbox.events WHERE aggregate_type = 'cart' ORDER BY id;

-- with outbox.aggregate_sequence off there is no seq and no counter row
SET outbox.aggregate_sequence = off;
SELECT outbox.emit('cart', 'c2', 'cart.opened', '{}') IS NOT NULL AS emitted;
SELECT seq IS NULL AS no_seq FROM outbox.events WHERE aggregate_id = 'c2';
SELECT count(*) AS counter_rows FROM outbox.aggregates WHERE aggregate_id = 'c2';
RESET outbox.aggregate_sequence;

-- caller-given event id; reusing it is a unique violation
SELECT outbox.emit('order', '44', 'order.confirmed', '{}',
                   event_id => '0190a6f2-0000-7000-8000-000000000001');
SELECT t.err($$SELECT outbox.emit('order', '44', 'order.confirmed', '{}',
                   event_id => '0190a6f2-0000-7000-8000-000000000001')$$);

-- key, schema_version, occurred_at, headers, explicit topic
SELECT outbox.emit('order', '45', 'order.confirmed', '{"a": [1, 2]}',
                   headers => '{"source": "checkout", "lang": "en"}',
                   topic => 'orders.v2', key => 'customer-7', schema_version => 3,
                   occurred_at => '2026-01-02 03:04:05+00') AS id \gset
SELECT topic, key, schema_version, occurred_at AT TIME ZONE 'UTC' AS occurred_utc, headers, payload
  FROM outbox.events WHERE event_id = :'id';

-- topic from outbox.topic_template
SET outbox.topic_template = 'shop.{aggregate_type}.{event_type}';
SELECT outbox.emit('order', '46', 'order.confirmed', '{}') AS id \gset
SELECT topic FROM outbox.events WHERE event_id = :'id';
SET outbox.topic_template = 'all-events';
SELECT outbox.emit('order', '46', 'order.paid', '{}') AS id \gset
SELECT topic FROM outbox.events WHERE event_id = :'id';
RESET outbox.topic_template;
SHOW outbox.topic_template;
SELECT t.err($$SET outbox.topic_template = 'shop.{aggregate}'$$);
SELECT t.err($$SET outbox.topic_template = 'shop/{aggregate_type}'$$);
SELECT t.err($$SET outbox.topic_template = ''$$);
-- a template that expands to an illegal name is caught at emit
SELECT t.err($$SELECT outbox.emit('order line', '1', 'x', '{}')$$);

-- topic names Kafka would refuse
SELECT t.err($$SELECT outbox.emit('order', '1', 'x', '{}', topic => 'bad topic')$$);
SELECT t.err($$SELECT outbox.emit('order', '1', 'x', '{}', topic => '.')$$);
SELECT t.err($$SELECT outbox.emit('order', '1', 'x', '{}', topic => '..')$$);
SELECT t.err($$SELECT outbox.emit('order', '1', 'x', '{}', topic => '')$$);
SELECT t.err(format($$SELECT outbox.emit('order', '1', 'x', '{}', topic => %L)$$, repeat('a', 250)));
SELECT outbox.emit('order', '1', 'x', '{}', topic => repeat('a', 249)) IS NOT NULL AS longest_topic_ok;
SELECT outbox.emit('order', '1', 'x', '{}', topic => '...') IS NOT NULL AS three_dots_ok;

-- outbox.allowed_topics: patterns, checked for explicit and template topics
SET outbox.allowed_topics = 'orders.*, *.audit, exact-one';
SHOW outbox.allowed_topics;
SELECT outbox.emit('order', '1', 'x', '{}', topic => 'orders.v2') IS NOT NULL AS prefix_ok;
SELECT outbox.emit('order', '1', 'x', '{}', topic => 'billing.audit') IS NOT NULL AS suffix_ok;
SELECT outbox.emit('order', '1', 'x', '{}', topic => 'exact-one') IS NOT NULL AS exact_ok;
SELECT t.err($$SELECT outbox.emit('order', '1', 'x', '{}', topic => 'exact-one-more')$$);
SELECT t.err($$SELECT outbox.emit('order', '1', 'x', '{}', topic => 'orders')$$);
SELECT t.err($$SELECT outbox.emit('order', '1', 'x', '{}', topic => 'payments.v1')$$);
SELECT t.err($$SELECT outbox.emit('order', '1', 'x', '{}')$$);
SET outbox.allowed_topics = 'outbox.event.*';
SELECT outbox.emit('order', '1', 'x', '{}') IS NOT NULL AS template_topic_ok;
SET outbox.allowed_topics = '*a*b*c';
SELECT outbox.emit('order', '1', 'x', '{}', topic => 'xaxbxbxc') IS NOT NULL AS wildcards_backtrack_ok;
SELECT t.err($$SELECT outbox.emit('order', '1', 'x', '{}', topic => 'xaxbxcx')$$);
SELECT t.err($$SET outbox.allowed_topics = 'orders/*'$$);
SELECT t.err($$SET outbox.allowed_topics = 'orders.*,,billing.*'$$);
RESET outbox.allowed_topics;
SELECT outbox.emit('order', '1', 'x', '{}', topic => 'payments.v1') IS NOT NULL AS empty_list_allows_all;

-- required arguments
SELECT t.err($$SELECT outbox.emit(NULL, '1', 'x', '{}')$$);
SELECT t.err($$SELECT outbox.emit('order', NULL, 'x', '{}')$$);
SELECT t.err($$SELECT outbox.emit('order', '1', NULL, '{}')$$);
SELECT t.err($$SELECT outbox.emit('order', '1', 'x', NULL)$$);
SELECT t.err($$SELECT outbox.emit('', '1', 'x', '{}')$$);
SELECT t.err($$SELECT outbox.emit('order', '', 'x', '{}')$$);
SELECT t.err($$SELECT outbox.emit('order', '1', '', '{}')$$);
SELECT t.err($$SELECT outbox.emit('order', '1', 'x', '{}', schema_version => 0)$$);
SELECT t.err($$SELECT outbox.emit('order', '1', 'x', '{}', schema_version => NULL)$$);
SELECT outbox.emit('order', '1', 'x', 'null') IS NOT NULL AS json_null_payload_ok;
-- an empty key would be partitioned at random by the consistent_random partitioner
SELECT t.err($$SELECT outbox.emit('order', '1', 'x', '{}', key => '')$$);

-- occurred_at is sent as an RFC 3339 header: four-digit years, finite
SELECT t.err($$SELECT outbox.emit('order', '1', 'x', '{}', occurred_at => 'infinity')$$);
SELECT t.err($$SELECT outbox.emit('order', '1', 'x', '{}', occurred_at => '-infinity')$$);
SELECT t.err($$SELECT outbox.emit('order', '1', 'x', '{}', occurred_at => '0044-03-15 12:00:00+00 BC')$$);
SELECT t.err($$SELECT outbox.emit('order', '1', 'x', '{}', occurred_at => '10000-01-01 00:00:00+00')$$);
SELECT t.err($$SELECT outbox.emit('order', '1', 'x', '{}', occurred_at => '9999-12-31 23:00:00-05')$$);
SELECT outbox.emit('order', '1', 'x', '{}', occurred_at => '0001-01-01 00:00:00+00') IS NOT NULL AS year_1_ok;
SELECT outbox.emit('order', '1', 'x', '{}', occurred_at => '9999-12-31 23:59:59.999999+00') IS NOT NULL AS year_9999_ok;

-- headers: a JSON object of strings
SELECT t.err($$SELECT outbox.emit('order', '1', 'x', '{}', headers => '["a"]')$$);
SELECT t.err($$SELECT outbox.emit('order', '1', 'x', '{}', headers => '"a"')$$);
SELECT t.err($$SELECT outbox.emit('order', '1', 'x', '{}', headers => '{"retries": 3}')$$);
SELECT t.err($$SELECT outbox.emit('order', '1', 'x', '{}', headers => '{"a": "b", "n": null}')$$);
SELECT outbox.emit('order', '1', 'x', '{}', headers => '{}') IS NOT NULL AS empty_headers_ok;
-- the relay's own header names cannot be forged, in any letter case
SELECT t.err($$SELECT outbox.emit('order', '1', 'x', '{}', headers => '{"id": "forged", "seq": "999"}')$$);
SELECT h, t.err(format($$SELECT outbox.emit('order', '1', 'x', '{}', headers => %L)$$,
                       jsonb_build_object(h, 'forged')))
  FROM unnest(ARRAY['id', 'event_type', 'aggregate_type', 'aggregate_id', 'seq',
                    'schema_version', 'occurred_at', 'traceparent', 'tenant',
                    'ID', 'Event_Type', 'TENANT']) AS h;
-- CloudEvents' names are reserved too, whatever outbox.message_format is
SELECT h, t.err(format($$SELECT outbox.emit('order', '1', 'x', '{}', headers => %L)$$,
                       jsonb_build_object(h, 'forged')))
  FROM unnest(ARRAY['ce_id', 'CE_Type', 'ce_', 'ce-source', 'Ce-Id', 'content-type', 'Content-Type']) AS h;
-- and names that only begin like them are not
SELECT outbox.emit('order', '1', 'x', '{}',
                   headers => '{"ce": "1", "cex_id": "2", "content-typed": "3"}') IS NOT NULL AS accepted;
SELECT t.err($$SELECT outbox.emit('order', '1', 'x', '{}', headers => '{"": "v"}')$$);
SELECT outbox.emit('order', '1', 'x', '{}', headers => '{"idempotency_id": "a", "x-seq": "b"}') IS NOT NULL AS similar_names_ok;
-- names are RFC 9110 tokens of 1 to 255 characters: no look-alike of a
-- reserved name that a reader folding Unicode case (Python's upper(),
-- Java's equalsIgnoreCase) or normalizing it (NFKC) reads as the relay's,
-- no other non-ASCII letter, no space or separator.  The output shows each
-- name by its code points only: it is the same in a UTF8 and an SQL_ASCII
-- database.
SELECT what, split_part(e, ' ', 1) AS sqlstate,
       strpos(e, format('invalid header name "%s"', h)) > 0 AS names_it,
       substring(e FROM 'Character [0-9]+, U\+[0-9A-F]+') AS offending
  FROM (VALUES ('U+017F long s + eq, upper-cased SEQ', 'ſeq'),
               ('U+0131 dotless i + d, upper-cased ID', 'ıd'),
               ('aggregate_ + U+0131 + d', 'aggregate_ıd'),
               ('U+212A Kelvin sign + afka, lower-cased kafka', 'Kafka'),
               ('U+FF49 U+FF44 fullwidth id, NFKC id', 'ｉｄ'),
               ('caf + U+00E9', 'café'),
               ('h + U+200B zero width space + x', 'h​x'),
               ('a + tab + b', E'a\tb')) AS c(what, h),
       LATERAL t.err(format($$SELECT outbox.emit('order', '1', 'x', '{}', headers => %L)$$,
                            jsonb_build_object(h, 'forged'))) AS e;
SELECT h, t.err(format($$SELECT outbox.emit('order', '1', 'x', '{}', headers => %L)$$,
                       jsonb_build_object(h, 'v')))
  FROM unnest(ARRAY['trace id', 'x:y', 'a/b', '(x)', 'a=b']) AS h;
SELECT t.err(format($$SELECT outbox.emit('order', '1', 'x', '{}', headers => %L)$$,
                    jsonb_build_object(repeat('h', 256), 'v')));
SELECT outbox.emit('order', '1', 'x', '{}', headers => jsonb_build_object(repeat('h', 255), 'v'))
       IS NOT NULL AS name_of_255_ok;
SELECT outbox.emit('order', '1', 'x', '{}',
                   headers => $${"x-trace": "a", "Tenant_ID": "b", "!#$%&'*+-.^_`|~09AZaz": "c"}$$)
       IS NOT NULL AS token_names_ok;
-- at most 64 headers, at most 16 kB of names and values
SELECT outbox.emit('order', '1', 'x', '{}',
                   headers => (SELECT jsonb_object_agg('h' || i, 'v') FROM generate_series(1, 64) i))
       IS NOT NULL AS sixty_four_headers_ok;
SELECT t.err($$SELECT outbox.emit('order', '1', 'x', '{}',
                   headers => (SELECT jsonb_object_agg('h' || i, 'v') FROM generate_series(1, 65) i))$$);
SELECT outbox.emit('order', '1', 'x', '{}', headers => jsonb_build_object('big', repeat('v', 16381)))
       IS NOT NULL AS sixteen_kb_ok;
SELECT t.err($$SELECT outbox.emit('order', '1', 'x', '{}', headers => jsonb_build_object('big', repeat('v', 16382)))$$);

-- payload size limit, in bytes of JSON text, settable per session with units
SHOW outbox.max_payload_bytes;
SET outbox.max_payload_bytes = '1kB';
SHOW outbox.max_payload_bytes;
SELECT outbox.emit('order', '1', 'x', jsonb_build_object('s', repeat('a', 1015))) IS NOT NULL AS at_limit_ok;
SELECT t.err($$SELECT outbox.emit('order', '1', 'x', jsonb_build_object('s', repeat('a', 1016)))$$);
SET outbox.max_payload_bytes = 100;
SELECT t.err($$SELECT outbox.emit('order', '1', 'x', jsonb_build_object('s', repeat('a', 200)))$$);
RESET outbox.max_payload_bytes;
SELECT t.err($$SET outbox.max_payload_bytes = 0$$);

-- the whole message must fit librdkafka's message.max.bytes (default
-- 1000000 here: outbox.kafka_config is empty), counted as librdkafka
-- counts it: 36 bytes of record overhead, key, value, and each header's
-- name, value and their varint lengths.  This event: key "k" (1), value
-- {"s": "..."} (9 + n), headers id 40, event_type "x" 13, aggregate_type
-- "order" 21, aggregate_id "1" 15, seq (3 + digits + 2), schema_version
-- "1" 17, occurred_at 40, origin (a UUID) 44,
-- caller header "h": "v" 4.
SET outbox.aggregate_sequence = off;
SELECT outbox.emit('order', '1', 'x', jsonb_build_object('s', repeat('a', 999760)), key => 'k',
                   headers => '{"h": "v"}') IS NOT NULL AS message_at_limit_ok;
SELECT t.err($$SELECT outbox.emit('order', '1', 'x', jsonb_build_object('s', repeat('a', 999761)), key => 'k',
                   headers => '{"h": "v"}')$$);
-- a two-byte header name length varint (64 bytes and more) counts too
SELECT t.err($$SELECT outbox.emit('order', '1', 'x', jsonb_build_object('s', repeat('a', 999760 - 63)), key => 'k',
                   headers => jsonb_build_object(repeat('h', 64), 'v'))$$);
SELECT outbox.emit('order', '1', 'x', jsonb_build_object('s', repeat('a', 999760 - 64)), key => 'k',
                   headers => jsonb_build_object(repeat('h', 64), 'v')) IS NOT NULL AS long_name_at_limit_ok;
RESET outbox.aggregate_sequence;

-- traceparent and tenant from the session, typically SET LOCAL per transaction
BEGIN;
SET LOCAL outbox.traceparent = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01';
SET LOCAL outbox.tenant = 'acme';
SELECT outbox.emit('order', '47', 'order.confirmed', '{}') AS id \gset
SELECT tenant, traceparent FROM outbox.events WHERE event_id = :'id';
COMMIT;
SELECT outbox.emit('order', '47', 'order.paid', '{}') AS id \gset
SELECT tenant IS NULL AND traceparent IS NULL AS cleared_after_commit FROM outbox.events WHERE event_id = :'id';
SELECT t.err($$SET outbox.traceparent = 'not-a-traceparent'$$);
SELECT t.err($$SET outbox.traceparent = '00-00000000000000000000000000000000-00f067aa0ba902b7-01'$$);
SELECT t.err($$SET outbox.traceparent = '00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01'$$);
SELECT t.err($$SET outbox.traceparent = 'ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01'$$);
SELECT t.err($$SET outbox.traceparent = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra'$$);
SELECT t.err($$SET outbox.traceparent = '01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra'$$);
RESET outbox.traceparent;

-- read-only transactions cannot emit
BEGIN READ ONLY;
SELECT t.err($$SELECT outbox.emit('order', '1', 'x', '{}')$$);
COMMIT;
SET default_transaction_read_only = on;
SELECT t.err($$SELECT outbox.emit('order', '1', 'x', '{}')$$);
RESET default_transaction_read_only;

-- emit in a subtransaction that rolls back leaves nothing behind
BEGIN;
SAVEPOINT s;
SELECT outbox.emit('order', '48', 'order.confirmed', '{}') IS NOT NULL AS emitted;
ROLLBACK TO SAVEPOINT s;
SELECT outbox.emit('order', '48', 'order.paid', '{}') IS NOT NULL AS emitted;
COMMIT;
SELECT event_type, seq FROM outbox.events WHERE aggregate_id = '48' ORDER BY id;

-- event rows carry the top-level transaction id even from a subtransaction
BEGIN;
SAVEPOINT s;
SELECT outbox.emit('order', '49', 'order.confirmed', '{}') AS id \gset
SELECT txid = pg_current_xact_id() AS top_level_txid FROM outbox.events WHERE event_id = :'id';
RELEASE SAVEPOINT s;
COMMIT;

-- publishing needs the preload; this server has none, and says so
SELECT t.err($$SELECT * FROM outbox.status()$$);
SELECT * FROM outbox.health();
SELECT t.err($$SELECT outbox.metrics()$$);
SELECT t.err($$SELECT * FROM outbox.health('0 s')$$);

-- a writer cannot widen outbox.allowed_topics, not even by setting it before
-- the library is loaded in its session (a placeholder set by a non-superuser
-- is refused when the real setting is defined)
CREATE ROLE outbox_writer LOGIN;
GRANT USAGE ON SCHEMA outbox TO outbox_writer;
GRANT EXECUTE ON FUNCTION outbox.emit(text, text, text, jsonb, jsonb, text, text, uuid, integer, timestamptz)
  TO outbox_writer;
ALTER ROLE outbox_writer SET outbox.allowed_topics = 'orders.*';
SELECT current_user AS su \gset
\c - outbox_writer
SET outbox.allowed_topics = '*';
SELECT t.err($$SELECT outbox.emit('order', '1', 'x', '{}', topic => 'payments.v1')$$);
SHOW outbox.allowed_topics;
SELECT outbox.emit('order', '1', 'x', '{}', topic => 'orders.v1') IS NOT NULL AS allowed_ok;
SELECT t.err($$SET outbox.allowed_topics = '*'$$);
\c - :su
DROP OWNED BY outbox_writer;
DROP ROLE outbox_writer;

-- emit() writes its row without an INSERT statement while outbox.events is
-- the table it knows (DEBUG1 says which way, when it looks again after the
-- table changed); what a superuser changes in the table is honoured all
-- the same, through the INSERT: a CHECK constraint ...
BEGIN;
SELECT outbox.emit('direct', '1', 'direct.a', '{}') IS NOT NULL AS direct_ok;
SELECT id > 0 AS has_id, txid = pg_current_xact_id() AS own_txid,
       created_at >= now() AS has_created_at, schema_version, seq
  FROM outbox.events WHERE aggregate_type = 'direct';
ALTER TABLE outbox.events ADD CONSTRAINT no_forbidden CHECK (event_type <> 'forbidden');
SET client_min_messages = debug1;
SELECT split_part(t.err($$SELECT outbox.emit('direct', '1', 'forbidden', '{}')$$), ' | ', 1) AS err;
SELECT outbox.emit('direct', '1', 'direct.b', '{}') IS NOT NULL AS checked_ok;
RESET client_min_messages;
ALTER TABLE outbox.events DROP CONSTRAINT no_forbidden;
-- ... a trigger of its own ...
CREATE FUNCTION pg_temp.stamp() RETURNS trigger LANGUAGE plpgsql AS
  $$BEGIN NEW.headers := '{"stamped": "yes"}'; RETURN NEW; END$$;
CREATE TRIGGER stamp BEFORE INSERT ON outbox.events
  FOR EACH ROW EXECUTE FUNCTION pg_temp.stamp();
SET client_min_messages = debug1;
SELECT outbox.emit('direct', '1', 'direct.c', '{}') IS NOT NULL AS triggered_ok;
RESET client_min_messages;
DROP TRIGGER stamp ON outbox.events;
-- ... NOT NULL where emit() writes a null ...
UPDATE outbox.events SET tenant = 'someone' WHERE tenant IS NULL;
ALTER TABLE outbox.events ALTER COLUMN tenant SET NOT NULL;
SET client_min_messages = debug1;
SELECT split_part(t.err($$SELECT outbox.emit('direct', '1', 'untenanted', '{}')$$), ' | ', 1) AS err;
RESET client_min_messages;
ALTER TABLE outbox.events ALTER COLUMN tenant DROP NOT NULL;
-- ... another default
ALTER TABLE outbox.events ALTER COLUMN created_at SET DEFAULT '2000-01-01 00:00:00+00';
SET client_min_messages = debug1;
SELECT outbox.emit('direct', '1', 'direct.e', '{}') IS NOT NULL AS defaulted_ok;
RESET client_min_messages;
ALTER TABLE outbox.events ALTER COLUMN created_at SET DEFAULT pg_catalog.clock_timestamp();
-- and once the table is emit()'s again, the direct insert
SET client_min_messages = debug1;
SELECT outbox.emit('direct', '1', 'direct.d', '{}') IS NOT NULL AS direct_again_ok;
RESET client_min_messages;
SELECT event_type, seq, headers, txid = pg_current_xact_id() AS own_txid,
       created_at < '2001-01-01' AS old_created_at, id - min(id) OVER () AS id_step
  FROM outbox.events WHERE aggregate_type = 'direct' ORDER BY id;
ROLLBACK;

-- emit() opens its two tables by the OIDs it found them at, and by name
-- again once a table is renamed, replaced or its schema renamed: after
-- these, its rows and counters go to the new tables of those names, not
-- to the ones it had open (the counter of moved/1 starts again at 1;
-- each block starts with the OIDs of the tables of an emit() that committed)
SELECT outbox.emit('moved', '1', 'moved.a', '{}') IS NOT NULL AS before_ok;
BEGIN;
ALTER TABLE outbox.events RENAME TO events_before;
CREATE TABLE outbox.events (LIKE outbox.events_before INCLUDING ALL);
ALTER TABLE outbox.aggregates RENAME TO aggregates_before;
CREATE TABLE outbox.aggregates (LIKE outbox.aggregates_before INCLUDING ALL);
SELECT outbox.emit('moved', '1', 'moved.b', '{}') IS NOT NULL AS renamed_ok;
SELECT 'new' AS t, event_type, seq FROM outbox.events WHERE aggregate_type = 'moved'
UNION ALL
SELECT 'before', event_type, seq FROM outbox.events_before WHERE aggregate_type = 'moved'
ORDER BY 1, 2;
ROLLBACK;
SELECT outbox.emit('moved', '2', 'moved.again', '{}') IS NOT NULL AS again_ok;
BEGIN;
ALTER SCHEMA outbox RENAME TO outbox_before;
CREATE SCHEMA outbox;
CREATE TABLE outbox.events (LIKE outbox_before.events INCLUDING ALL);
CREATE TABLE outbox.aggregates (LIKE outbox_before.aggregates INCLUDING ALL);
SELECT outbox_before.emit('moved', '1', 'moved.c', '{}') IS NOT NULL AS schema_renamed_ok;
SELECT 'new' AS t, event_type, seq FROM outbox.events WHERE aggregate_type = 'moved'
UNION ALL
SELECT 'before', event_type, seq FROM outbox_before.events WHERE aggregate_type = 'moved'
ORDER BY 1, 2;
ROLLBACK;
SELECT event_type, seq FROM outbox.events WHERE aggregate_type = 'moved' ORDER BY id;

-- the log's generations: emit() writes into the current one's partition,
-- and sees a change of the current one after a second (the relay makes
-- them; here, by hand)
SELECT outbox.emit('gen', '1', 'gen.a', '{}',
                   event_id => '0190a6f2-0000-7000-8000-0000000000a1') IS NOT NULL AS emitted;
SELECT tableoid::regclass AS partition, generation FROM outbox.events WHERE aggregate_type = 'gen';
UPDATE outbox.generations SET state = 'closed', closed_at = now() WHERE generation = 0;
UPDATE outbox.generations SET state = 'current', opened_at = now() WHERE generation = 1;
SELECT pg_sleep(1.1);
SELECT outbox.emit('gen', '1', 'gen.b', '{}') IS NOT NULL AS emitted;
SELECT event_type, tableoid::regclass AS partition, generation, seq
  FROM outbox.events WHERE aggregate_type = 'gen' ORDER BY id;
-- a given event_id is refused whichever generation holds it
SELECT t.err($$SELECT outbox.emit('gen', '2', 'gen.c', '{}',
                   event_id => '0190a6f2-0000-7000-8000-0000000000a1')$$);
-- through the INSERT too (a superuser's trigger on the log)
CREATE FUNCTION t.noop() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN RETURN NEW; END$$;
CREATE TRIGGER noop BEFORE INSERT ON outbox.events FOR EACH ROW EXECUTE FUNCTION t.noop();
SELECT t.err($$SELECT outbox.emit('gen', '2', 'gen.c', '{}',
                   event_id => '0190a6f2-0000-7000-8000-0000000000a1')$$);
SELECT outbox.emit('gen', '2', 'gen.d', '{}') IS NOT NULL AS emitted;
SELECT event_type, tableoid::regclass AS partition FROM outbox.events
 WHERE aggregate_type = 'gen' AND aggregate_id = '2';
DROP TRIGGER noop ON outbox.events;
-- no current generation: a clear error
UPDATE outbox.generations SET state = 'closed' WHERE generation = 1;
SELECT pg_sleep(1.1);
SELECT t.err($$SELECT outbox.emit('gen', '3', 'gen.e', '{}')$$);
UPDATE outbox.generations SET state = 'empty', closed_at = NULL WHERE generation = 0;
UPDATE outbox.generations SET state = 'current' WHERE generation = 1;
