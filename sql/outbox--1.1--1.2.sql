/* outbox--1.1--1.2.sql: from 1.1 to 1.2.  Must leave a database equal to a fresh 1.2 install. */

\echo Use "ALTER EXTENSION outbox UPDATE TO '1.2'" to load this file. \quit

/*
 * 1.2 writes once what replay(), discard() and cleanup() shared: the
 * "delivered and not held" predicate, the opening lock of replay(event_id)
 * and discard(event_id), and the release of parked events; cleanup() takes
 * outbox.retention's default from the library instead of repeating it.
 * Their results and error messages are unchanged.  One difference: in a
 * session that has not loaded the library (no shared_preload_libraries),
 * cleanup() used 7 days whatever outbox.retention said; it now loads the
 * library and uses the setting.
 */

/*
 * Internal helpers of replay(), discard() and cleanup(), so that what they
 * share is written once.  Not SECURITY DEFINER: they run with the caller's
 * rights, so they keep the default EXECUTE for PUBLIC (a role granted
 * replay() or cleanup() can run what those call), and PUBLIC has no USAGE
 * on the schema.  delivered_events() and removable_events() are SQL without
 * a SET clause so that the planner inlines them into the caller's query
 * (an index walk with a LIMIT stays one); their names and operators are
 * therefore all qualified.
 */
CREATE FUNCTION outbox.delivered_events()
RETURNS SETOF outbox.events
LANGUAGE sql STABLE
AS $$
	SELECT e.*
	  FROM outbox.events e, outbox.relay_progress p
	 WHERE p.relay OPERATOR(pg_catalog.=) 'default'
	   AND pg_catalog.pg_visible_in_snapshot(e.txid, p.prev_snapshot)
	   AND NOT EXISTS (SELECT 1 FROM outbox.dead_letters d
					    WHERE d.event_id OPERATOR(pg_catalog.=) e.event_id
						  AND d.state OPERATOR(pg_catalog.=) ANY (ARRAY['quarantined', 'parked', 'replaying']))
$$;
COMMENT ON FUNCTION outbox.delivered_events() IS
	'Internal: the events the relay has delivered that no quarantined, parked or replaying dead letter holds';

CREATE FUNCTION outbox.removable_events(cutoff timestamptz)
RETURNS SETOF outbox.events
LANGUAGE sql STABLE
AS $$
	SELECT e.*
	  FROM outbox.delivered_events() e
	 WHERE e.created_at OPERATOR(pg_catalog.<) cutoff
	   AND NOT EXISTS (SELECT 1 FROM outbox.replay_queue q WHERE q.event_pk OPERATOR(pg_catalog.=) e.id)
	   AND NOT EXISTS (SELECT 1 FROM outbox.restored_events r WHERE r.id OPERATOR(pg_catalog.=) e.id)
$$;
COMMENT ON FUNCTION outbox.removable_events(timestamptz) IS
	'Internal: the delivered events created before cutoff that nothing needs any more: not held, not queued for replay, not a restored event the relay has not judged';

/*
 * The dead letter of event_id, locked until the transaction ends; a row of
 * NULLs when there is none.
 */
CREATE FUNCTION outbox.lock_dead_letter(event_id uuid)
RETURNS outbox.dead_letters
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	letter	outbox.dead_letters;
BEGIN
	IF lock_dead_letter.event_id IS NULL THEN
		RAISE EXCEPTION 'event_id must not be null' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	SELECT * INTO letter FROM outbox.dead_letters d
	 WHERE d.event_id = lock_dead_letter.event_id FOR UPDATE;
	RETURN letter;
END
$$;
COMMENT ON FUNCTION outbox.lock_dead_letter(uuid) IS
	'Internal: the dead letter of an event, locked (replay and discard start here)';

/*
 * Queues for replay, in event order, the head if it is still quarantined
 * (replay) and every event parked behind it or behind any head that no
 * longer holds it back (replayed, discarded, queued): such an event has no
 * other way out.  Returns their dead letters, now replaying.
 */
CREATE FUNCTION outbox.queue_released(head uuid)
RETURNS SETOF outbox.dead_letters
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
AS $$
	WITH chosen AS (
		UPDATE outbox.dead_letters d SET state = 'replaying'
		 WHERE (d.event_id = head AND d.state = 'quarantined')
			OR (d.state = 'parked'
				AND (d.blocked_by = head
					 OR NOT EXISTS (SELECT 1 FROM outbox.dead_letters h
									 WHERE h.event_id = d.blocked_by
									   AND h.state IN ('quarantined', 'parked'))))
		RETURNING d.*
	), queued AS (
		INSERT INTO outbox.replay_queue (event_pk, dead_letter)
		SELECT c.event_pk, true FROM chosen c ORDER BY c.event_pk
	)
	SELECT * FROM chosen c ORDER BY c.event_pk
$$;
COMMENT ON FUNCTION outbox.queue_released(uuid) IS
	'Internal: queues a quarantined head and what waits behind it, or behind a head already gone, for replay';

/*
 * replay(event_id): publish a quarantined event again, then the events
 * parked behind it, in order, with their original ids.
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
	head := outbox.lock_dead_letter(replay.event_id);
	IF head.event_id IS NULL THEN
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

	RETURN QUERY
	SELECT c.event_id, c.aggregate_type, c.aggregate_id, c.seq,
		   CASE WHEN c.event_id = head.event_id THEN 'quarantined' ELSE 'parked' END
	  FROM outbox.queue_released(head.event_id) c ORDER BY c.event_pk;
	PERFORM outbox.notify_relay();
END
$$;
COMMENT ON FUNCTION outbox.replay(uuid) IS
	'Publishes a quarantined event again, then the events parked behind it, with their original ids';

/* discard(event_id): drop a quarantined event and release what waits behind it. */
CREATE OR REPLACE FUNCTION outbox.discard(event_id uuid)
RETURNS TABLE (affected_event_id uuid, aggregate_type text, aggregate_id text,
			   seq bigint, action text)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	head	outbox.dead_letters;
BEGIN
	head := outbox.lock_dead_letter(discard.event_id);
	IF head.event_id IS NULL OR head.state <> 'quarantined' THEN
		RAISE EXCEPTION 'event % is not quarantined', discard.event_id
			USING ERRCODE = CASE WHEN head.event_id IS NULL THEN 'undefined_object'
								 ELSE 'object_not_in_prerequisite_state' END;
	END IF;

	UPDATE outbox.dead_letters d SET state = 'discarded', resolved_at = now()
	 WHERE d.event_id = head.event_id;
	RETURN QUERY
	SELECT head.event_id, head.aggregate_type, head.aggregate_id, head.seq, 'discarded'::text;
	/* as in replay(): also what waits behind a head already gone */
	RETURN QUERY
	SELECT r.event_id, r.aggregate_type, r.aggregate_id, r.seq, 'released'::text
	  FROM outbox.queue_released(head.event_id) r ORDER BY r.event_pk;
	PERFORM outbox.notify_relay();
END
$$;
COMMENT ON FUNCTION outbox.discard(uuid) IS
	'Drops a quarantined event for good and publishes the events parked behind it';

/* replay(since, until): publish again retained events the relay already delivered. */
CREATE OR REPLACE FUNCTION outbox.replay(since timestamptz, until timestamptz,
							  aggregate_type text DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	queued	bigint;
BEGIN
	IF since IS NULL OR until IS NULL THEN
		RAISE EXCEPTION 'since and until must not be null' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	IF since >= until THEN
		RAISE EXCEPTION 'since must be earlier than until'
			USING ERRCODE = 'invalid_parameter_value';
	END IF;
	INSERT INTO outbox.replay_queue (event_pk, dead_letter)
	SELECT e.id, false
	  FROM outbox.delivered_events() e
	 WHERE e.created_at >= since AND e.created_at < until
	   AND (replay.aggregate_type IS NULL OR e.aggregate_type = replay.aggregate_type)
	   AND NOT EXISTS (SELECT 1 FROM outbox.dead_letters d
					    WHERE d.event_id = e.event_id AND d.state = 'discarded')
	 ORDER BY e.id;
	GET DIAGNOSTICS queued = ROW_COUNT;
	PERFORM outbox.notify_relay();
	RETURN queued;
END
$$;
COMMENT ON FUNCTION outbox.replay(timestamptz, timestamptz, text) IS
	'Publishes again, with their original ids, the delivered events created in [since, until); returns how many were queued';

/*
 * cleanup(dry_run, max_events): the published events older than
 * outbox.retention.  Never an undelivered, quarantined, parked or queued one.
 */
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
	/*
	 * outbox.retention and its default belong to the library.  A session
	 * that has not loaded it (no shared_preload_libraries) defines the
	 * setting by calling one of its functions.
	 */
	PERFORM outbox.uuid_v7();
	cutoff := now() - (SELECT s.setting::bigint * interval '1 second'
						 FROM pg_settings s WHERE s.name = 'outbox.retention');

	IF dry_run THEN
		RETURN QUERY
		SELECT count(*), min(e.created_at), max(e.created_at), false
		  FROM outbox.removable_events(cutoff) e;
		RETURN;
	END IF;

	RETURN QUERY
	WITH doomed AS (
		SELECT e.id FROM outbox.removable_events(cutoff) e
		 ORDER BY e.id LIMIT max_events
	), gone AS (
		DELETE FROM outbox.events e USING doomed WHERE e.id = doomed.id
		RETURNING e.created_at
	)
	SELECT count(*), min(g.created_at), max(g.created_at), true FROM gone g;
END
$$;
COMMENT ON FUNCTION outbox.cleanup(boolean, integer) IS
	'Reports (dry_run) or deletes up to max_events published events older than outbox.retention';
