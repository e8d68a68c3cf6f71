/* outbox--1.0--1.1.sql: from 1.0 to 1.1.  Must leave a database equal to a fresh 1.1 install. */

\echo Use "ALTER EXTENSION outbox UPDATE TO '1.1'" to load this file. \quit

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
