-- PUBLIC can neither emit nor read the log; writers and readers get grants.
CREATE ROLE outbox_nobody;
CREATE ROLE outbox_writer;
CREATE ROLE outbox_reader;

-- the grants the README shows
GRANT USAGE ON SCHEMA outbox TO outbox_writer;
GRANT EXECUTE ON FUNCTION outbox.emit(text, text, text, jsonb, jsonb, text, text, uuid, integer, timestamptz)
  TO outbox_writer;
GRANT USAGE ON SCHEMA outbox TO outbox_reader;
GRANT SELECT ON outbox.events TO outbox_reader;

SET ROLE outbox_nobody;
SELECT t.err($$SELECT outbox.emit('order', '900', 'order.confirmed', '{}')$$);
SELECT t.err($$SELECT count(*) FROM outbox.events$$);
SELECT t.err($$SELECT count(*) FROM outbox.aggregates$$);
RESET ROLE;

-- a writer emits through the function only: it cannot touch the tables
SET ROLE outbox_writer;
SELECT outbox.emit('order', '900', 'order.confirmed', '{}') IS NOT NULL AS writer_emits;
SELECT t.err($$SELECT count(*) FROM outbox.events$$);
SELECT t.err($$INSERT INTO outbox.events (event_id, aggregate_type, aggregate_id, event_type, topic, key, payload, occurred_at)
               VALUES (gen_random_uuid(), 'order', '900', 'forged', 't', 'k', '{}', now())$$);
SELECT t.err($$UPDATE outbox.aggregates SET last_seq = 0$$);
RESET ROLE;

-- a reader reads the log but cannot emit or change it
SET ROLE outbox_reader;
SELECT event_type, seq FROM outbox.events WHERE aggregate_id = '900';
SELECT t.err($$SELECT outbox.emit('order', '900', 'order.paid', '{}')$$);
SELECT t.err($$DELETE FROM outbox.events$$);
RESET ROLE;

-- a writer's trigger: capture() runs emit() as the modifying user
CREATE TABLE shop.notes (id int PRIMARY KEY, body text);
CREATE TRIGGER notes_outbox AFTER INSERT ON shop.notes
  FOR EACH ROW EXECUTE FUNCTION outbox.capture('note', 'id');
GRANT USAGE ON SCHEMA shop TO outbox_writer, outbox_nobody;
GRANT INSERT ON shop.notes TO outbox_writer, outbox_nobody;
SET ROLE outbox_nobody;
SELECT t.err($$INSERT INTO shop.notes VALUES (1, 'x')$$);
RESET ROLE;
SET ROLE outbox_writer;
INSERT INTO shop.notes VALUES (2, 'y');
RESET ROLE;
SELECT aggregate_id, event_type FROM outbox.events WHERE aggregate_type = 'note';

DROP TABLE shop.notes;
REVOKE ALL ON SCHEMA shop FROM outbox_writer, outbox_nobody;
REVOKE ALL ON SCHEMA outbox FROM outbox_writer, outbox_reader;
REVOKE ALL ON FUNCTION outbox.emit(text, text, text, jsonb, jsonb, text, text, uuid, integer, timestamptz) FROM outbox_writer;
REVOKE ALL ON outbox.events FROM outbox_reader;
DROP ROLE outbox_nobody, outbox_writer, outbox_reader;

-- a monitoring role sees health and status, never payloads
CREATE ROLE outbox_monitor;
GRANT USAGE ON SCHEMA outbox TO outbox_monitor;
GRANT EXECUTE ON FUNCTION outbox.status(), outbox.metrics(), outbox.health(interval), outbox.holds() TO outbox_monitor;
GRANT SELECT ON outbox.status TO outbox_monitor;
SET ROLE outbox_monitor;
SELECT * FROM outbox.health();
SELECT * FROM outbox.holds();
SELECT t.err($$SELECT payload FROM outbox.events$$);
SELECT t.err($$SELECT envelope FROM outbox.dead_letters$$);
-- the held table is the relay's: a monitoring role neither reads nor writes it
SELECT t.err($$SELECT * FROM outbox.held$$);
SELECT t.err($$INSERT INTO outbox.held (id, topic, kafka_partition) VALUES (1, 't', 0)$$);
RESET ROLE;
REVOKE ALL ON FUNCTION outbox.status(), outbox.metrics(), outbox.health(interval), outbox.holds() FROM outbox_monitor;
REVOKE ALL ON outbox.status FROM outbox_monitor;
REVOKE ALL ON SCHEMA outbox FROM outbox_monitor;
DROP ROLE outbox_monitor;
-- without the grants, PUBLIC cannot call them
CREATE ROLE outbox_stranger;
SET ROLE outbox_stranger;
SELECT t.err($$SELECT * FROM outbox.health()$$);
RESET ROLE;
-- USAGE on the schema alone is not enough: holds() needs its EXECUTE
GRANT USAGE ON SCHEMA outbox TO outbox_stranger;
SET ROLE outbox_stranger;
SELECT t.err($$SELECT * FROM outbox.holds()$$);
RESET ROLE;
REVOKE USAGE ON SCHEMA outbox FROM outbox_stranger;
DROP ROLE outbox_stranger;

-- The internals live in schema outbox_internal: schema outbox lists only
-- what users may call, and no role but the owner runs the internals.
SELECT count(*) AS internals_in_outbox
  FROM pg_proc p
 WHERE p.pronamespace = 'outbox'::regnamespace
   AND p.proname IN ('delivered_events', 'removable_events', 'lock_dead_letter', 'queue_released',
					 'notify_relay', 'inbox_wake', 'event_restored', 'origin_restored',
					 'progress_restored', 'subscriptions_changed', 'refuse_handler_drop');
-- a call of each internal function, every argument NULL (from a subquery,
-- or the planner would fold a strict function's call without a check)
CREATE VIEW t.internal_calls AS
SELECT p.oid::regprocedure AS internal,
	   format('SELECT %s.%I(%s)', n.nspname, p.proname,
			  (SELECT coalesce(string_agg('(SELECT NULL::' || format_type(a.t, NULL) || ')', ', '), '')
				 FROM unnest(p.proargtypes::oid[]) a(t))) AS call
  FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
 WHERE n.nspname = 'outbox_internal';
GRANT SELECT ON t.internal_calls TO PUBLIC;
-- a hostile role with the writer's grants: the schema is closed to it
CREATE ROLE outbox_hostile;
GRANT USAGE ON SCHEMA outbox TO outbox_hostile;
GRANT EXECUTE ON FUNCTION outbox.emit(text, text, text, jsonb, jsonb, text, text, uuid, integer, timestamptz)
  TO outbox_hostile;
SET ROLE outbox_hostile;
SELECT c.internal, t.err(c.call) AS refused FROM t.internal_calls c ORDER BY c.internal::text;
RESET ROLE;
-- USAGE on the schema given by mistake still runs none of them
GRANT USAGE ON SCHEMA outbox_internal TO outbox_hostile;
SET ROLE outbox_hostile;
SELECT c.internal, t.err(c.call) AS refused FROM t.internal_calls c ORDER BY c.internal::text;
-- nor may it plant a function there
SELECT t.err($$CREATE FUNCTION outbox_internal.notify_relay(x int) RETURNS void LANGUAGE sql AS ''$$);
RESET ROLE;
REVOKE ALL ON SCHEMA outbox_internal FROM outbox_hostile;
REVOKE ALL ON SCHEMA outbox FROM outbox_hostile;
REVOKE ALL ON FUNCTION outbox.emit(text, text, text, jsonb, jsonb, text, text, uuid, integer, timestamptz)
  FROM outbox_hostile;
DROP ROLE outbox_hostile;
DROP VIEW t.internal_calls;
