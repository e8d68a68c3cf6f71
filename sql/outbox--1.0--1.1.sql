/* outbox--1.0--1.1.sql: from 1.0 to 1.1.  Must leave a database equal to a fresh 1.1 install. */

\echo Use "ALTER EXTENSION outbox UPDATE TO '1.1'" to load this file. \quit

/*
 * 1.0 adopted whatever schema "outbox" existed.  The owner-rights
 * functions resolve their tables there: a schema that a non-superuser owns
 * (who can rename it and put another in its place) or where one may create
 * objects must be fixed before 1.1 is installed over it.
 */
DO $$
BEGIN
	IF NOT (SELECT r.rolsuper FROM pg_catalog.pg_namespace n
			  JOIN pg_catalog.pg_roles r ON r.oid OPERATOR(pg_catalog.=) n.nspowner
			 WHERE n.nspname OPERATOR(pg_catalog.=) 'outbox') THEN
		RAISE EXCEPTION 'schema "outbox" is not owned by a superuser'
			USING ERRCODE = 'insufficient_privilege',
				  HINT = 'ALTER SCHEMA outbox OWNER TO a superuser, then update the extension.';
	END IF;
	IF EXISTS (SELECT 1 FROM pg_catalog.pg_namespace n,
				   pg_catalog.aclexplode(n.nspacl) a
				   LEFT JOIN pg_catalog.pg_roles r ON r.oid OPERATOR(pg_catalog.=) a.grantee
			    WHERE n.nspname OPERATOR(pg_catalog.=) 'outbox'
				  AND a.privilege_type OPERATOR(pg_catalog.=) 'CREATE'
				  AND NOT coalesce(r.rolsuper, false)) THEN
		RAISE EXCEPTION 'a role that is not a superuser may create objects in schema "outbox"'
			USING ERRCODE = 'insufficient_privilege',
				  HINT = 'REVOKE CREATE ON SCHEMA outbox FROM those roles, then update the extension.';
	END IF;
END
$$;

/*
 * SECURITY DEFINER functions run with a pinned search_path: under the
 * caller's path, an operator or function the caller created could run with
 * the extension owner's rights.
 */
ALTER FUNCTION outbox.emit(text, text, text, jsonb, jsonb, text, text, uuid, integer, timestamptz)
	SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION outbox.status() SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION outbox.metrics() SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION outbox.health(interval) SET search_path = pg_catalog, pg_temp;

/*
 * Dump and restore.  Events keep the transaction id of the cluster that
 * wrote them, which means nothing, or something else, where they are
 * restored.  A row that arrives with a txid other than its inserting
 * transaction's (COPY from a dump; emit() always writes its own) is
 * re-stamped as committed long ago (FirstNormalTransactionId, visible in
 * every snapshot), so no batch takes it, and its original txid is kept
 * here.  The restored progress row is kept beside the own one under
 * another name.  Once both are in, the relay judges each restored event
 * against the restored progress and re-stamps the ones it had not
 * delivered with the current transaction's id, which publishes them.
 */
CREATE TABLE outbox.restored_events (
	id				bigint PRIMARY KEY,
	txid			pg_catalog.xid8 NOT NULL
);
REVOKE ALL ON outbox.restored_events FROM PUBLIC;
COMMENT ON TABLE outbox.restored_events IS
	'Events a restore brought in, with their original txid, until the relay has published those not delivered before the dump';

CREATE FUNCTION outbox.event_restored()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	INSERT INTO outbox.restored_events (id, txid) VALUES (NEW.id, NEW.txid)
		ON CONFLICT (id) DO NOTHING;
	NEW.txid := '3';
	PERFORM outbox.notify_relay();
	RETURN NEW;
END
$$;
COMMENT ON FUNCTION outbox.event_restored() IS
	'Trigger: an event row inserted with a txid not its transaction''s (a restore) is kept out of the batches until the relay has judged it';
REVOKE ALL ON FUNCTION outbox.event_restored() FROM PUBLIC;
CREATE TRIGGER event_restored BEFORE INSERT ON outbox.events
	FOR EACH ROW WHEN (NEW.txid OPERATOR(pg_catalog.<>) pg_catalog.pg_current_xact_id())
	EXECUTE FUNCTION outbox.event_restored();

CREATE FUNCTION outbox.progress_restored()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	IF EXISTS (SELECT 1 FROM outbox.relay_progress p WHERE p.relay OPERATOR(pg_catalog.=) NEW.relay) THEN
		NEW.relay := 'restored ' || outbox.uuid_v7()::text;
	END IF;
	PERFORM outbox.notify_relay();
	RETURN NEW;
END
$$;
COMMENT ON FUNCTION outbox.progress_restored() IS
	'Trigger: keeps a restored progress row beside this database''s own and wakes the relay';
REVOKE ALL ON FUNCTION outbox.progress_restored() FROM PUBLIC;
CREATE TRIGGER progress_restored BEFORE INSERT ON outbox.relay_progress
	FOR EACH ROW EXECUTE FUNCTION outbox.progress_restored();

/* cleanup(): never an event a restore brought in that the relay has not judged yet */
CREATE OR REPLACE FUNCTION outbox.cleanup(dry_run boolean DEFAULT true, max_events integer DEFAULT 10000)
RETURNS TABLE (events bigint, oldest timestamptz, newest timestamptz, deleted boolean)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	cutoff	timestamptz;
BEGIN
	IF dry_run IS NULL OR max_events IS NULL OR max_events < 1 THEN
		RAISE EXCEPTION 'max_events must be at least 1 and dry_run not null'
			USING ERRCODE = 'invalid_parameter_value';
	END IF;
	cutoff := now() - coalesce(
		(SELECT s.setting::bigint * interval '1 second' FROM pg_settings s WHERE s.name = 'outbox.retention'),
		interval '7 days');

	IF dry_run THEN
		RETURN QUERY
		SELECT count(*), min(e.created_at), max(e.created_at), false
		  FROM outbox.events e, outbox.relay_progress p
		 WHERE p.relay = 'default' AND e.created_at < cutoff
		   AND pg_visible_in_snapshot(e.txid, p.prev_snapshot)
		   AND NOT EXISTS (SELECT 1 FROM outbox.dead_letters d
						    WHERE d.event_pk = e.id AND d.state IN ('quarantined', 'parked', 'replaying'))
		   AND NOT EXISTS (SELECT 1 FROM outbox.replay_queue q WHERE q.event_pk = e.id)
		   AND NOT EXISTS (SELECT 1 FROM outbox.restored_events r WHERE r.id = e.id);
		RETURN;
	END IF;

	RETURN QUERY
	WITH doomed AS (
		SELECT e.id FROM outbox.events e, outbox.relay_progress p
		 WHERE p.relay = 'default' AND e.created_at < cutoff
		   AND pg_visible_in_snapshot(e.txid, p.prev_snapshot)
		   AND NOT EXISTS (SELECT 1 FROM outbox.dead_letters d
						    WHERE d.event_pk = e.id AND d.state IN ('quarantined', 'parked', 'replaying'))
		   AND NOT EXISTS (SELECT 1 FROM outbox.replay_queue q WHERE q.event_pk = e.id)
		   AND NOT EXISTS (SELECT 1 FROM outbox.restored_events r WHERE r.id = e.id)
		 ORDER BY e.id LIMIT max_events
	), gone AS (
		DELETE FROM outbox.events e USING doomed WHERE e.id = doomed.id
		RETURNING e.created_at
	)
	SELECT count(*), min(g.created_at), max(g.created_at), true FROM gone g;
END
$$;

/*
 * replay(event_id) and discard(event_id) also release events parked behind
 * a head that no longer holds them back: a 1.0 relay could record a parked
 * event after its head was replayed or discarded, leaving it no way out.
 */
CREATE OR REPLACE FUNCTION outbox.replay(event_id uuid)
RETURNS TABLE (queued_event_id uuid, aggregate_type text, aggregate_id text,
			   seq bigint, was text)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	head	outbox.dead_letters;
BEGIN
	IF replay.event_id IS NULL THEN
		RAISE EXCEPTION 'event_id must not be null' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	SELECT * INTO head FROM outbox.dead_letters d WHERE d.event_id = replay.event_id FOR UPDATE;
	IF NOT FOUND THEN
		IF EXISTS (SELECT 1 FROM outbox.events e WHERE e.event_id = replay.event_id) THEN
			RAISE EXCEPTION 'event % is not quarantined', replay.event_id
				USING ERRCODE = 'object_not_in_prerequisite_state',
					  HINT = 'To publish delivered events again, use outbox.replay(since, until).';
		END IF;
		RAISE EXCEPTION 'event % does not exist', replay.event_id
			USING ERRCODE = 'undefined_object';
	END IF;
	IF head.state = 'parked' THEN
		RAISE EXCEPTION 'event % is parked, not quarantined', replay.event_id
			USING ERRCODE = 'object_not_in_prerequisite_state',
				  HINT = format('It waits behind event %s; replay or discard that one.', head.blocked_by);
	ELSIF head.state <> 'quarantined' THEN
		RAISE EXCEPTION 'event % is %, not quarantined', replay.event_id, head.state
			USING ERRCODE = 'object_not_in_prerequisite_state';
	END IF;

	/*
	 * With the head go the events parked behind it, and any event still
	 * parked behind a head that no longer holds it back (replayed,
	 * discarded, queued): such an event has no other way out.
	 */
	RETURN QUERY
	WITH chosen AS (
		UPDATE outbox.dead_letters d SET state = 'replaying'
		 WHERE d.event_id = head.event_id
			OR (d.state = 'parked'
				AND (d.blocked_by = head.event_id
					 OR NOT EXISTS (SELECT 1 FROM outbox.dead_letters h
									 WHERE h.event_id = d.blocked_by
									   AND h.state IN ('quarantined', 'parked'))))
		RETURNING d.*
	), queued AS (
		INSERT INTO outbox.replay_queue (event_pk, dead_letter)
		SELECT c.event_pk, true FROM chosen c ORDER BY c.event_pk
		RETURNING event_pk
	)
	SELECT c.event_id, c.aggregate_type, c.aggregate_id, c.seq,
		   CASE WHEN c.event_id = head.event_id THEN 'quarantined' ELSE 'parked' END
	  FROM chosen c ORDER BY c.event_pk;
	PERFORM outbox.notify_relay();
END
$$;

CREATE OR REPLACE FUNCTION outbox.discard(event_id uuid)
RETURNS TABLE (affected_event_id uuid, aggregate_type text, aggregate_id text,
			   seq bigint, action text)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	head	outbox.dead_letters;
BEGIN
	IF discard.event_id IS NULL THEN
		RAISE EXCEPTION 'event_id must not be null' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	SELECT * INTO head FROM outbox.dead_letters d WHERE d.event_id = discard.event_id FOR UPDATE;
	IF NOT FOUND OR head.state <> 'quarantined' THEN
		RAISE EXCEPTION 'event % is not quarantined', discard.event_id
			USING ERRCODE = CASE WHEN FOUND THEN 'object_not_in_prerequisite_state' ELSE 'undefined_object' END;
	END IF;

	UPDATE outbox.dead_letters d SET state = 'discarded', resolved_at = now()
	 WHERE d.event_id = head.event_id;
	RETURN QUERY
	SELECT head.event_id, head.aggregate_type, head.aggregate_id, head.seq, 'discarded'::text;
	/* as in replay(): also what waits behind a head already gone */
	RETURN QUERY
	WITH released AS (
		UPDATE outbox.dead_letters d SET state = 'replaying'
		 WHERE d.state = 'parked'
		   AND (d.blocked_by = head.event_id
				OR NOT EXISTS (SELECT 1 FROM outbox.dead_letters h
								WHERE h.event_id = d.blocked_by
								  AND h.state IN ('quarantined', 'parked')))
		RETURNING d.*
	), queued AS (
		INSERT INTO outbox.replay_queue (event_pk, dead_letter)
		SELECT r.event_pk, true FROM released r ORDER BY r.event_pk
	)
	SELECT r.event_id, r.aggregate_type, r.aggregate_id, r.seq, 'released'::text
	  FROM released r ORDER BY r.event_pk;
	PERFORM outbox.notify_relay();
END
$$;
