-- DROP EXTENSION outbox deletes the log: it is refused while committed
-- events are not delivered to Kafka, unless outbox.allow_drop_undelivered
-- is on.  In a database of its own.  Nothing preloads the library here:
-- CREATE EXTENSION loads it, and the session that loaded it is guarded.
CREATE DATABASE outbox_drop;
\c outbox_drop
CREATE EXTENSION outbox;
CREATE SCHEMA t;
CREATE FUNCTION t.err(q text) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
	st text; msg text; det text; hin text;
BEGIN
	EXECUTE q;
	RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
	GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, msg = MESSAGE_TEXT,
		det = PG_EXCEPTION_DETAIL, hin = PG_EXCEPTION_HINT;
	RETURN st || ' ' || msg
		|| coalesce(' | DETAIL: ' || nullif(det, ''), '')
		|| coalesce(' | HINT: ' || nullif(hin, ''), '');
END
$$;
-- the error's parts a line each
CREATE FUNCTION t.refusal(q text) RETURNS SETOF text
LANGUAGE sql AS $$ SELECT regexp_split_to_table(t.err(q), ' \| ') $$;
GRANT USAGE ON SCHEMA t TO PUBLIC;
SELECT name, setting, context, boot_val FROM pg_settings WHERE name = 'outbox.allow_drop_undelivered';

-- nothing emitted: the drop goes through
DROP EXTENSION outbox;
CREATE EXTENSION outbox;

-- a committed event the relay has not delivered
SELECT outbox.emit('order', '1', 'order.placed', '{}') IS NOT NULL AS emitted;
SELECT t.refusal($$DROP EXTENSION outbox$$);
-- DROP SCHEMA outbox CASCADE would drop the extension too
SELECT t.refusal($$DROP SCHEMA outbox CASCADE$$);
SELECT t.refusal($$DROP SCHEMA outbox$$);
-- a role that may not drop it is told so, as before
CREATE ROLE outbox_dropper;
SET ROLE outbox_dropper;
SELECT t.refusal($$DROP EXTENSION outbox$$);
RESET ROLE;
DROP ROLE outbox_dropper;

-- delivered (the relay's progress passes it): the drop would go through
UPDATE outbox.relay_progress SET prev_snapshot = pg_current_snapshot() WHERE relay = 'default';
BEGIN;
DROP EXTENSION outbox;
ROLLBACK;
-- but not while it is held
INSERT INTO outbox.held (id, topic, kafka_partition) SELECT e.id, e.topic, 0 FROM outbox.events e;
SELECT t.refusal($$DROP EXTENSION outbox$$);
DELETE FROM outbox.held;
-- nor while it is a dead letter neither replayed nor discarded
INSERT INTO outbox.dead_letters (event_id, event_pk, aggregate_type, aggregate_id, event_type, topic, state, envelope)
SELECT e.event_id, e.id, e.aggregate_type, e.aggregate_id, e.event_type, e.topic, 'quarantined', '{}'
  FROM outbox.events e;
SELECT t.refusal($$DROP EXTENSION outbox$$);
UPDATE outbox.dead_letters SET state = 'replaying';
SELECT t.refusal($$DROP EXTENSION outbox$$);
UPDATE outbox.dead_letters SET state = 'discarded';
-- nor while it is a restored event the relay has not judged
INSERT INTO outbox.restored_events (id, txid) SELECT e.id, '5' FROM outbox.events e;
SELECT t.refusal($$DROP EXTENSION outbox$$);
DELETE FROM outbox.restored_events;

-- events of the dropping transaction never committed: they go with it
BEGIN;
SELECT outbox.emit('order', '2', 'order.placed', '{}') IS NOT NULL AS emitted;
DROP EXTENSION outbox;
ROLLBACK;

-- on purpose: the setting lets it go
SELECT outbox.emit('order', '3', 'order.placed', '{}') IS NOT NULL AS emitted;
SELECT outbox.emit('order', '4', 'order.placed', '{}') IS NOT NULL AS emitted;
SELECT t.refusal($$DROP EXTENSION outbox$$);
SET outbox.allow_drop_undelivered = on;
BEGIN;
DROP SCHEMA outbox CASCADE;
ROLLBACK;
DROP EXTENSION outbox;
RESET outbox.allow_drop_undelivered;
-- the internal schema goes with it; schema outbox stays, as it came
SELECT nspname FROM pg_namespace WHERE nspname IN ('outbox', 'outbox_internal');

-- dropping the database stays allowed
CREATE EXTENSION outbox;
SELECT outbox.emit('order', '5', 'order.placed', '{}') IS NOT NULL AS emitted;
\c contrib_regression
DROP DATABASE outbox_drop;
