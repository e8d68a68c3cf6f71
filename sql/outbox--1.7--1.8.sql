/* outbox--1.7--1.8.sql: from 1.7 to 1.8.  Must leave a database equal to a fresh 1.8 install. */

\echo Use "ALTER EXTENSION outbox UPDATE TO '1.8'" to load this file. \quit

/*
 * What users must not call moves to a schema of its own, so that schema
 * outbox holds only the API: the triggers and the event trigger, the
 * helpers replay(), discard() and cleanup() share, and the calls that
 * wake a worker at commit (see outbox.sql).  Only the extension's owner
 * uses it.  The helpers that PUBLIC could execute lose that, and the
 * functions that call them by name follow.
 */
CREATE SCHEMA outbox_internal;
REVOKE ALL ON SCHEMA outbox_internal FROM PUBLIC;
COMMENT ON SCHEMA outbox_internal IS
	'Internal functions of the outbox extension: triggers and helpers, not for users to call';
ALTER FUNCTION outbox.event_restored() SET SCHEMA outbox_internal;
ALTER FUNCTION outbox.progress_restored() SET SCHEMA outbox_internal;
ALTER FUNCTION outbox.notify_relay() SET SCHEMA outbox_internal;
ALTER FUNCTION outbox.delivered_events() SET SCHEMA outbox_internal;
ALTER FUNCTION outbox.removable_events(timestamptz) SET SCHEMA outbox_internal;
ALTER FUNCTION outbox.lock_dead_letter(uuid) SET SCHEMA outbox_internal;
ALTER FUNCTION outbox.queue_released(uuid) SET SCHEMA outbox_internal;
ALTER FUNCTION outbox.subscriptions_changed() SET SCHEMA outbox_internal;
ALTER FUNCTION outbox.inbox_wake(text) SET SCHEMA outbox_internal;
REVOKE ALL ON FUNCTION outbox_internal.delivered_events() FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox_internal.removable_events(timestamptz) FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox_internal.lock_dead_letter(uuid) FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox_internal.queue_released(uuid) FROM PUBLIC;

CREATE OR REPLACE FUNCTION outbox_internal.event_restored()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	INSERT INTO outbox.restored_events (id, txid) VALUES (NEW.id, NEW.txid)
		ON CONFLICT (id) DO NOTHING;
	NEW.txid := '3';
	PERFORM outbox_internal.notify_relay();
	RETURN NEW;
END
$$;

CREATE OR REPLACE FUNCTION outbox_internal.progress_restored()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	IF EXISTS (SELECT 1 FROM outbox.relay_progress p WHERE p.relay OPERATOR(pg_catalog.=) NEW.relay) THEN
		NEW.relay := 'restored ' || outbox.uuid_v7()::text;
	END IF;
	PERFORM outbox_internal.notify_relay();
	RETURN NEW;
END
$$;

CREATE OR REPLACE FUNCTION outbox_internal.removable_events(cutoff timestamptz)
RETURNS SETOF outbox.events
LANGUAGE sql STABLE
AS $$
	SELECT e.*
	  FROM outbox_internal.delivered_events() e
	 WHERE e.created_at OPERATOR(pg_catalog.<) cutoff
	   AND NOT EXISTS (SELECT 1 FROM outbox.replay_queue q WHERE q.event_pk OPERATOR(pg_catalog.=) e.id)
	   AND NOT EXISTS (SELECT 1 FROM outbox.restored_events r WHERE r.id OPERATOR(pg_catalog.=) e.id)
$$;

CREATE OR REPLACE FUNCTION outbox.replay(event_id uuid)
RETURNS TABLE (queued_event_id uuid, aggregate_type text, aggregate_id text,
			   seq bigint, was text)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	head	outbox.dead_letters;
BEGIN
	head := outbox_internal.lock_dead_letter(replay.event_id);
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
	  FROM outbox_internal.queue_released(head.event_id) c ORDER BY c.event_pk;
	PERFORM outbox_internal.notify_relay();
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
	head := outbox_internal.lock_dead_letter(discard.event_id);
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
	  FROM outbox_internal.queue_released(head.event_id) r ORDER BY r.event_pk;
	PERFORM outbox_internal.notify_relay();
END
$$;

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
	  FROM outbox_internal.delivered_events() e
	 WHERE e.created_at >= since AND e.created_at < until
	   AND (replay.aggregate_type IS NULL OR e.aggregate_type = replay.aggregate_type)
	   AND NOT EXISTS (SELECT 1 FROM outbox.dead_letters d
					    WHERE d.event_id = e.event_id AND d.state = 'discarded')
	 ORDER BY e.id;
	GET DIAGNOSTICS queued = ROW_COUNT;
	PERFORM outbox_internal.notify_relay();
	RETURN queued;
END
$$;

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
		  FROM outbox_internal.removable_events(cutoff) e;
		RETURN;
	END IF;

	RETURN QUERY
	WITH doomed AS (
		SELECT e.id FROM outbox_internal.removable_events(cutoff) e
		 ORDER BY e.id LIMIT max_events
	), gone AS (
		DELETE FROM outbox.events e USING doomed WHERE e.id = doomed.id
		RETURNING e.created_at
	)
	SELECT count(*), min(g.created_at), max(g.created_at), true FROM gone g;
END
$$;

CREATE OR REPLACE FUNCTION outbox.inbox_replay(subscription text, id bigint DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	queued bigint;
	grp text;
BEGIN
	IF inbox_replay.subscription IS NULL THEN
		RAISE EXCEPTION 'subscription must not be null' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	grp := coalesce((SELECT s.group_id FROM outbox.subscriptions s
					  WHERE s.name OPERATOR(pg_catalog.=) inbox_replay.subscription),
					inbox_replay.subscription);
	IF inbox_replay.id IS NOT NULL AND NOT EXISTS (
		SELECT 1 FROM outbox.inbox_dead_letters d
		 WHERE d.consumer_group OPERATOR(pg_catalog.=) grp
		   AND d.id OPERATOR(pg_catalog.=) inbox_replay.id
		   AND d.state OPERATOR(pg_catalog.=) 'dead') THEN
		RAISE EXCEPTION 'subscription "%" has no dead message %', inbox_replay.subscription, inbox_replay.id
			USING ERRCODE = 'no_data_found';
	END IF;
	UPDATE outbox.inbox_dead_letters d SET state = 'replay'
	 WHERE d.consumer_group OPERATOR(pg_catalog.=) grp
	   AND d.state OPERATOR(pg_catalog.=) ANY (ARRAY['dead', 'parked'])
	   AND (inbox_replay.id IS NULL
			OR d.id OPERATOR(pg_catalog.=) inbox_replay.id
			OR d.blocked_by OPERATOR(pg_catalog.=) inbox_replay.id);
	GET DIAGNOSTICS queued = ROW_COUNT;
	PERFORM outbox_internal.inbox_wake(s.name) FROM outbox.subscriptions s
	  WHERE s.group_id OPERATOR(pg_catalog.=) grp;
	RETURN queued;
END
$$;

CREATE OR REPLACE FUNCTION outbox.inbox_discard(subscription text, id bigint)
RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	grp text;
BEGIN
	IF inbox_discard.subscription IS NULL OR inbox_discard.id IS NULL THEN
		RAISE EXCEPTION 'subscription and id must not be null' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	grp := coalesce((SELECT s.group_id FROM outbox.subscriptions s
					  WHERE s.name OPERATOR(pg_catalog.=) inbox_discard.subscription),
					inbox_discard.subscription);
	DELETE FROM outbox.inbox_dead_letters d
	 WHERE d.consumer_group OPERATOR(pg_catalog.=) grp
	   AND d.id OPERATOR(pg_catalog.=) inbox_discard.id
	   AND d.state OPERATOR(pg_catalog.<>) 'replay';
	IF NOT FOUND THEN
		RETURN false;
	END IF;
	PERFORM outbox_internal.inbox_wake(s.name) FROM outbox.subscriptions s
	  WHERE s.group_id OPERATOR(pg_catalog.=) grp;
	RETURN true;
END
$$;

/*
 * Subscriptions record their handler's owner: the worker runs no function
 * of the handler's name owned by another role (a dropped handler's name,
 * taken by a role that may create functions in its schema, ran as the
 * subscriber).  Today's owner of each handler is trusted when it is a
 * superuser or a role whose privileges the subscriber has; any other (or
 * a handler that no longer resolves) is recorded as the subscriber itself,
 * which the worker then refuses until the owner subscribes again.
 */
ALTER TABLE outbox.subscriptions ADD COLUMN handler_owner regrole;
UPDATE outbox.subscriptions s
   SET handler_owner = coalesce(
		(SELECT p.proowner FROM pg_catalog.pg_proc p
		  WHERE p.oid OPERATOR(pg_catalog.=) pg_catalog.to_regprocedure(s.handler)::pg_catalog.oid
			AND (pg_catalog.pg_has_role(s.owner::pg_catalog.oid, p.proowner, 'USAGE')
				 OR (SELECT a.rolsuper FROM pg_catalog.pg_authid a
					  WHERE a.oid OPERATOR(pg_catalog.=) p.proowner))),
		s.owner::pg_catalog.oid)::pg_catalog.regrole;
DO $$
DECLARE
	r record;
BEGIN
	FOR r IN SELECT s.name, s.handler FROM outbox.subscriptions s
			  WHERE pg_catalog.to_regprocedure(s.handler) IS NULL
				 OR (SELECT p.proowner FROM pg_catalog.pg_proc p
					  WHERE p.oid OPERATOR(pg_catalog.=) pg_catalog.to_regprocedure(s.handler)::pg_catalog.oid)
					OPERATOR(pg_catalog.<>) s.handler_owner::pg_catalog.oid
	LOOP
		RAISE WARNING 'outbox subscription "%" will not run its handler %', r.name, r.handler
			USING DETAIL = 'The function does not exist, or its owner is neither a superuser nor a role whose privileges the subscriber has.',
				  HINT = 'Check the function, then unsubscribe and subscribe again as its intended subscriber.';
	END LOOP;
END
$$;
ALTER TABLE outbox.subscriptions ALTER COLUMN handler_owner SET NOT NULL;
COMMENT ON COLUMN outbox.subscriptions.handler_owner IS
	'The handler''s owner when subscribe() ran: the worker runs no function of that name owned by another role';

/*
 * In 1.7 consume_once() accepted consumer names starting with 'outbox;',
 * the scoped dedupe rows of 1.8's subscriptions: rows a caller wrote there
 * could suppress a group's events.  No subscription wrote any yet.
 */
DELETE FROM outbox.inbox i WHERE pg_catalog.left(i.consumer, 7) OPERATOR(pg_catalog.=) 'outbox;';

/*
 * Dedupe rows scoped by topic and origin go under consumer 'outbox;<group>';
 * consume_once() refuses that prefix too.
 */
CREATE OR REPLACE FUNCTION outbox.consume_once(consumer text, event_id uuid)
RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	IF consume_once.consumer IS NULL THEN
		RAISE EXCEPTION 'consumer must not be null' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	IF consume_once.event_id IS NULL THEN
		RAISE EXCEPTION 'event_id must not be null' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	IF pg_catalog.char_length(consume_once.consumer) OPERATOR(pg_catalog.=) 0 THEN
		RAISE EXCEPTION 'consumer must not be empty' USING ERRCODE = 'invalid_parameter_value';
	END IF;
	IF pg_catalog.char_length(consume_once.consumer) OPERATOR(pg_catalog.>) 200 THEN
		RAISE EXCEPTION 'consumer must be at most 200 characters'
			USING ERRCODE = 'invalid_parameter_value';
	END IF;
	IF pg_catalog.left(consume_once.consumer, 7) OPERATOR(pg_catalog.=) ANY (ARRAY['outbox:', 'outbox;']) THEN
		RAISE EXCEPTION 'consumer names starting with "outbox:" or "outbox;" belong to subscriptions'
			USING ERRCODE = 'invalid_parameter_value';
	END IF;
	INSERT INTO outbox.inbox (consumer, event_id)
	VALUES (consume_once.consumer, consume_once.event_id)
	ON CONFLICT DO NOTHING;
	RETURN FOUND;
END
$$;

/*
 * Consumer groups and who owns them (1.8).  A group's offsets, dedupe rows
 * and dead letters outlive its subscriptions (subscribing again resumes),
 * so the group stays its first subscriber's for as long as that state may
 * exist: subscribe() in a group is for the roles whose privileges include
 * its owner's, whether or not a subscription of it is left.
 * unsubscribe(name, purge => true) of a group's last subscription removes
 * the group and all its state, which frees its name.
 */
CREATE TABLE outbox.inbox_groups (
	group_id		text PRIMARY KEY,
	owner			regrole NOT NULL,
	created_at		timestamptz NOT NULL DEFAULT pg_catalog.now()
);
COMMENT ON TABLE outbox.inbox_groups IS
	'Each consumer group with state in this database and the role that owns it; only roles with its owner''s privileges may subscribe in it';
SELECT pg_catalog.pg_extension_config_dump('outbox.inbox_groups', '');
REVOKE ALL ON outbox.inbox_groups FROM PUBLIC;

CREATE FUNCTION outbox.unsubscribe(name text, purge boolean)
RETURNS boolean
LANGUAGE c VOLATILE STRICT
AS 'MODULE_PATHNAME', 'outbox_unsubscribe';
COMMENT ON FUNCTION outbox.unsubscribe(text, boolean) IS
	'Removes a subscription; with purge, also its consumer group''s offsets, dedupe rows and dead letters, when no other subscription uses the group';
REVOKE ALL ON FUNCTION outbox.unsubscribe(text, boolean) FROM PUBLIC;

/*
 * A subscription's handler is found by name and runs only while its owner
 * is the one recorded at subscribe(), so a function planted under a
 * dropped handler's name by another role never runs.  Dropping a handler
 * whose owner is the subscriber's own (or one whose privileges the
 * subscriber has) is refused as well, so a redeploy does not stop the
 * subscription by surprise: CREATE OR REPLACE is the way.  A subscriber
 * cannot pin another role's function this way.  SECURITY DEFINER: the
 * dropping role need not see outbox.subscriptions.
 */
CREATE FUNCTION outbox_internal.refuse_handler_drop()
RETURNS event_trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	d record;
BEGIN
	IF pg_catalog.to_regclass('outbox.subscriptions') IS NULL THEN
		RETURN;
	END IF;
	FOR d IN
		SELECT o.object_identity, s.name
		  FROM pg_catalog.pg_event_trigger_dropped_objects() o
		  JOIN outbox.subscriptions s ON s.handler OPERATOR(pg_catalog.=) o.object_identity
		 WHERE o.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_proc'::pg_catalog.regclass
		   AND pg_catalog.pg_has_role(s.owner::pg_catalog.oid, s.handler_owner::pg_catalog.oid, 'USAGE')
		 ORDER BY s.name LIMIT 1
	LOOP
		RAISE EXCEPTION 'cannot drop function % because subscription "%" uses it as its handler',
			d.object_identity, d.name
			USING ERRCODE = 'dependent_objects_still_exist',
				  HINT = pg_catalog.format('Call outbox.unsubscribe(%L) first, or change the function with CREATE OR REPLACE FUNCTION, which the subscription keeps.', d.name);
	END LOOP;
END
$$;
COMMENT ON FUNCTION outbox_internal.refuse_handler_drop() IS
	'Event trigger: refuses to drop a function that a subscription uses as its handler';
REVOKE ALL ON FUNCTION outbox_internal.refuse_handler_drop() FROM PUBLIC;
CREATE EVENT TRIGGER outbox_refuse_handler_drop ON sql_drop
	EXECUTE FUNCTION outbox_internal.refuse_handler_drop();

/*
 * The groups that have state today: a group with subscriptions belongs to
 * the owner of its oldest one; a group left with offsets, dedupe rows or
 * dead letters but no subscription belongs to the role running this
 * update (a superuser), which may hand it over with UPDATE.
 */
INSERT INTO outbox.inbox_groups (group_id, owner)
SELECT DISTINCT ON (s.group_id) s.group_id, s.owner
  FROM outbox.subscriptions s
 ORDER BY s.group_id, s.created_at, s.name;
INSERT INTO outbox.inbox_groups (group_id, owner)
SELECT g.group_id, (SELECT a.oid FROM pg_catalog.pg_authid a
					 WHERE a.rolname OPERATOR(pg_catalog.=) CURRENT_USER)::pg_catalog.regrole
  FROM (SELECT o.consumer_group AS group_id FROM outbox.inbox_offsets o
		UNION SELECT d.consumer_group FROM outbox.inbox_dead_letters d
		UNION SELECT pg_catalog.substr(i.consumer, 8) FROM outbox.inbox i
		 WHERE pg_catalog.left(i.consumer, 7) OPERATOR(pg_catalog.=) 'outbox:') g
ON CONFLICT (group_id) DO NOTHING;

/* health() also judges the subscriptions: one left without a worker */
COMMENT ON FUNCTION outbox.health(interval) IS
	'ok, warning or critical, judged by the oldest undelivered event''s age, the relay''s state and the subscriptions left without a worker';

/*
 * Holds and a topic that gains partitions: each held row records the
 * partition count its partition was computed among.  While a topic has held
 * rows the relay keeps computing its events' partitions among that count,
 * also after a restart, so that a key's new events join its held ones in
 * their partition instead of going ahead of them to a new partition.  NULL
 * in rows held by a relay older than 1.8.
 */
ALTER TABLE outbox.held ADD COLUMN partition_count integer
	CONSTRAINT held_partition_count_positive
	CHECK (partition_count OPERATOR(pg_catalog.>) 0);
COMMENT ON COLUMN outbox.held.partition_count IS
	'partition count of the topic that kafka_partition was computed among; the relay keeps it for the topic while the topic has held rows (NULL: held before 1.8)';

/*
 * outbox.delivery = exactly_once: each page goes out in a Kafka transaction
 * numbered here, and a progress record in the same transaction carries the
 * number, so that a relay starting after a crash tells a committed page
 * the database did not record from one Kafka aborted.
 */
ALTER TABLE outbox.relay_progress ADD COLUMN kafka_transaction bigint;
COMMENT ON COLUMN outbox.relay_progress.kafka_transaction IS
	'with outbox.delivery = exactly_once, the number of the Kafka transaction whose page was recorded last; the progress topic says which the cluster committed';

/*
 * subscription_seek(subscription, topic, kafka_partition, next_offset): set
 * the next offset the subscription's consumer group applies of one
 * partition, on purpose.  The way to resume a partition a worker stopped
 * because its log does not hold the group's next offset (a rebuilt cluster,
 * a re-created topic, messages deleted before they were applied).  At
 * commit the group's workers start again and the partition resumes there.
 * For the members of the roles that own the group's subscriptions.
 */
CREATE FUNCTION outbox.subscription_seek(subscription text, topic text,
	kafka_partition integer, next_offset bigint)
RETURNS void
LANGUAGE c VOLATILE
AS 'MODULE_PATHNAME', 'outbox_subscription_seek';
REVOKE ALL ON FUNCTION outbox.subscription_seek(text, text, integer, bigint) FROM PUBLIC;
COMMENT ON FUNCTION outbox.subscription_seek(text, text, integer, bigint) IS
	'Sets the offset of the first message of a partition the subscription''s consumer group applies next (0: a log that starts over) and restarts the group''s workers';

/*
 * The database's origin (1.8): a UUID made at install, sent by the relay
 * as every message's origin header, by which subscribers scope their
 * dedupe.  Kept by pg_dump (a restored row replaces the install's own, so
 * events sent again after a restore keep their origin), by pg_upgrade and
 * by a copy of the database, so an event keeps one origin wherever its
 * row goes and whichever relay sends it.
 */
CREATE TABLE outbox.origin (
	origin			uuid NOT NULL DEFAULT pg_catalog.gen_random_uuid(),
	one_row			boolean PRIMARY KEY DEFAULT true
		CONSTRAINT origin_one_row CHECK (one_row)
);
COMMENT ON TABLE outbox.origin IS
	'The origin header the relay sends with every message of this database: subscribers scope their dedupe by it';
SELECT pg_catalog.pg_extension_config_dump('outbox.origin', '');
REVOKE ALL ON outbox.origin FROM PUBLIC;

CREATE FUNCTION outbox_internal.origin_restored()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	DELETE FROM outbox.origin;
	RETURN NEW;
END
$$;
COMMENT ON FUNCTION outbox_internal.origin_restored() IS
	'Trigger: a restored origin replaces the one the install made';
REVOKE ALL ON FUNCTION outbox_internal.origin_restored() FROM PUBLIC;
CREATE TRIGGER origin_restored BEFORE INSERT ON outbox.origin
	FOR EACH ROW EXECUTE FUNCTION outbox_internal.origin_restored();
INSERT INTO outbox.origin DEFAULT VALUES;

/*
 * A partition a subscription worker stopped because its log does not hold
 * the group's next offset stays stopped, across restarts and rebalances,
 * until outbox.subscription_seek() sets the offset on purpose (a log that
 * has grown past the offset since is still not the group's log).
 */
ALTER TABLE outbox.inbox_offsets ADD COLUMN stopped_at timestamptz;
COMMENT ON COLUMN outbox.inbox_offsets.stopped_at IS
	'When a worker stopped this partition because its log does not hold next_offset; NULL while it runs; outbox.subscription_seek() clears it';

/*
 * Binary payloads and tombstones: an event's value is JSON (payload), bytes
 * (payload_bytes, with their content_type) or nothing (a tombstone).
 */
ALTER TABLE outbox.events ALTER COLUMN payload DROP NOT NULL;
ALTER TABLE outbox.events ADD COLUMN payload_bytes bytea;
ALTER TABLE outbox.events ADD COLUMN content_type text;
COMMENT ON COLUMN outbox.events.payload IS 'the value as JSON (emit()); NULL for emit_binary() and emit_tombstone()';
COMMENT ON COLUMN outbox.events.payload_bytes IS 'the value as bytes, schema-registry frame included (emit_binary()); NULL otherwise';
COMMENT ON COLUMN outbox.events.content_type IS 'emit_binary()''s content type, sent as the content-type header';

/*
 * emit_binary(): an event whose value is bytes the application serialized
 * (Avro, Protobuf, anything), sent unchanged; with schema_id, behind the
 * schema registries' wire-format frame.  emit_tombstone(): the key with a
 * null value, for log-compacted topics.  Both take emit()'s options, run
 * as emit() does, and number their events in the aggregate's sequence.
 */
CREATE FUNCTION outbox.emit_binary(
	aggregate_type	text,
	aggregate_id	text,
	event_type		text,
	payload			bytea,
	headers			jsonb DEFAULT NULL,
	topic			text DEFAULT NULL,
	key				text DEFAULT NULL,
	event_id		uuid DEFAULT NULL,
	schema_version	integer DEFAULT 1,
	occurred_at		timestamptz DEFAULT NULL,
	content_type	text DEFAULT NULL,
	schema_id		integer DEFAULT NULL,
	message_indexes	integer[] DEFAULT NULL)
RETURNS uuid
AS 'MODULE_PATHNAME', 'outbox_emit_binary'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION outbox.emit_binary(text, text, text, bytea, jsonb, text, text, uuid, integer, timestamptz, text, integer, integer[]) IS
	'Records an event whose value is the given bytes (framed for a schema registry with schema_id); published after commit';

CREATE FUNCTION outbox.emit_tombstone(
	aggregate_type	text,
	aggregate_id	text,
	event_type		text,
	headers			jsonb DEFAULT NULL,
	topic			text DEFAULT NULL,
	key				text DEFAULT NULL,
	event_id		uuid DEFAULT NULL,
	schema_version	integer DEFAULT 1,
	occurred_at		timestamptz DEFAULT NULL)
RETURNS uuid
AS 'MODULE_PATHNAME', 'outbox_emit_tombstone'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION outbox.emit_tombstone(text, text, text, jsonb, text, text, uuid, integer, timestamptz) IS
	'Records a tombstone: the key with a null value, for log-compacted topics; published after commit';

REVOKE ALL ON FUNCTION outbox.emit_binary(text, text, text, bytea, jsonb, text, text, uuid, integer, timestamptz, text, integer, integer[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox.emit_tombstone(text, text, text, jsonb, text, text, uuid, integer, timestamptz) FROM PUBLIC;

/*
 * Retention by rotation: the log becomes a ring of six generations, one
 * partition each (outbox.sql, "The log").  The table as it is, backlog and
 * all, becomes generation 0 in place: no row moves, nothing is published
 * again, and ids go on from where they were.  A partition cannot have an
 * identity of its own, so the new parent takes over the sequence's
 * position.  Grants and row security policies on the old table stay on
 * generation 0 only: they are not copied, since an extension script's
 * grants would become the extension's initial privileges (say so).
 */
DO $$
BEGIN
	IF EXISTS (SELECT 1 FROM pg_catalog.pg_class c
				WHERE c.oid OPERATOR(pg_catalog.=) 'outbox.events'::pg_catalog.regclass
				  AND (c.relrowsecurity
					   OR EXISTS (SELECT 1 FROM pg_catalog.aclexplode(c.relacl) a
								   WHERE a.grantee OPERATOR(pg_catalog.<>) c.relowner)))
	   OR EXISTS (SELECT 1 FROM pg_catalog.pg_policy p
				   WHERE p.polrelid OPERATOR(pg_catalog.=) 'outbox.events'::pg_catalog.regclass) THEN
		RAISE WARNING 'grants and row security on outbox.events were not carried over to the partitioned log'
			USING HINT = 'Grant them again on outbox.events (docs/upgrading.md).';
	END IF;
	IF EXISTS (SELECT 1 FROM pg_catalog.pg_depend d, pg_catalog.pg_rewrite w
				WHERE d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_rewrite'::pg_catalog.regclass
				  AND d.objid OPERATOR(pg_catalog.=) w.oid
				  AND d.refobjid OPERATOR(pg_catalog.=) 'outbox.events'::pg_catalog.regclass
				  AND w.ev_class OPERATOR(pg_catalog.<>) 'outbox.events'::pg_catalog.regclass)
	   OR EXISTS (SELECT 1 FROM pg_catalog.pg_publication_rel p
				   WHERE p.prrelid OPERATOR(pg_catalog.=) 'outbox.events'::pg_catalog.regclass) THEN
		RAISE WARNING 'views and publications on outbox.events now follow outbox.events_0, the first generation only'
			USING HINT = 'Make them again on outbox.events (docs/upgrading.md).';
	END IF;
END
$$;

DROP FUNCTION outbox_internal.removable_events(timestamptz);
DROP FUNCTION outbox_internal.delivered_events();
DROP TRIGGER event_restored ON outbox.events;
COMMENT ON TABLE outbox.events IS NULL;
COMMENT ON COLUMN outbox.events.id IS NULL;
COMMENT ON COLUMN outbox.events.txid IS NULL;
COMMENT ON COLUMN outbox.events.event_id IS NULL;
COMMENT ON COLUMN outbox.events.seq IS NULL;
COMMENT ON COLUMN outbox.events.topic IS NULL;
COMMENT ON COLUMN outbox.events.key IS NULL;
COMMENT ON COLUMN outbox.events.payload IS NULL;
COMMENT ON COLUMN outbox.events.payload_bytes IS NULL;
COMMENT ON COLUMN outbox.events.content_type IS NULL;

ALTER TABLE outbox.events RENAME TO events_0;
ALTER SEQUENCE outbox.events_id_seq RENAME TO events_0_id_seq;
ALTER TABLE outbox.events_0 ADD COLUMN generation smallint NOT NULL DEFAULT 0;
ALTER TABLE outbox.events_0 DROP CONSTRAINT events_pkey;
ALTER TABLE outbox.events_0 DROP CONSTRAINT events_event_id_key;
ALTER TABLE outbox.events_0 ADD CONSTRAINT events_0_pkey PRIMARY KEY (id, generation);
ALTER TABLE outbox.events_0 ADD CONSTRAINT events_0_event_id_generation_key UNIQUE (event_id, generation);
ALTER INDEX outbox.events_txid_idx RENAME TO events_0_txid_idx;

/*
 * From PostgreSQL 18 NOT NULL constraints have names, which a new table
 * draws so as not to repeat one of the schema: the old table's move aside
 * while the parent takes the names a fresh install gives it, then take
 * the names its partitions have in a fresh install.  (Before 18 there are
 * none, and both loops do nothing.)
 */
DO $$
DECLARE
	c	record;
BEGIN
	FOR c IN SELECT co.conname, a.attname
			   FROM pg_catalog.pg_constraint co
			   JOIN pg_catalog.pg_attribute a
				 ON a.attrelid OPERATOR(pg_catalog.=) co.conrelid
				AND a.attnum OPERATOR(pg_catalog.=) co.conkey[1]
			  WHERE co.conrelid OPERATOR(pg_catalog.=) 'outbox.events_0'::pg_catalog.regclass
				AND co.contype OPERATOR(pg_catalog.=) 'n'
	LOOP
		EXECUTE pg_catalog.format('ALTER TABLE outbox.events_0 RENAME CONSTRAINT %I TO %I',
								  c.conname, 'outbox_1_7_' || c.attname);
	END LOOP;
END
$$;

CREATE TABLE outbox.events (
	id				bigint GENERATED ALWAYS AS IDENTITY,
	txid			pg_catalog.xid8 NOT NULL DEFAULT pg_catalog.pg_current_xact_id(),
	event_id		uuid NOT NULL,
	aggregate_type	text NOT NULL,
	aggregate_id	text NOT NULL,
	seq				bigint,
	event_type		text NOT NULL,
	schema_version	integer NOT NULL DEFAULT 1,
	topic			text NOT NULL,
	key				text NOT NULL,
	payload			jsonb,
	headers			jsonb,
	tenant			text,
	traceparent		text,
	occurred_at		timestamptz NOT NULL,
	created_at		timestamptz NOT NULL DEFAULT pg_catalog.clock_timestamp(),
	payload_bytes	bytea,
	content_type	text,
	generation		smallint NOT NULL DEFAULT 0,
	PRIMARY KEY (id, generation),
	UNIQUE (event_id, generation)
) PARTITION BY LIST (generation);
CREATE INDEX events_txid_idx ON outbox.events (txid);
SELECT pg_catalog.setval('outbox.events_id_seq', s.last_value, s.is_called)
  FROM outbox.events_0_id_seq s;
ALTER EXTENSION outbox DROP SEQUENCE outbox.events_0_id_seq;
ALTER TABLE outbox.events_0 ALTER COLUMN id DROP IDENTITY;
DO $$
DECLARE
	c	record;
BEGIN
	FOR c IN SELECT co.conname, a.attname
			   FROM pg_catalog.pg_constraint co
			   JOIN pg_catalog.pg_attribute a
				 ON a.attrelid OPERATOR(pg_catalog.=) co.conrelid
				AND a.attnum OPERATOR(pg_catalog.=) co.conkey[1]
			  WHERE co.conrelid OPERATOR(pg_catalog.=) 'outbox.events_0'::pg_catalog.regclass
				AND co.contype OPERATOR(pg_catalog.=) 'n'
	LOOP
		EXECUTE pg_catalog.format('ALTER TABLE outbox.events_0 RENAME CONSTRAINT %I TO %I',
								  c.conname, 'events_' || c.attname || '_not_null');
	END LOOP;
END
$$;
ALTER TABLE outbox.events ATTACH PARTITION outbox.events_0 FOR VALUES IN (0);
CREATE TABLE outbox.events_1 PARTITION OF outbox.events FOR VALUES IN (1);
CREATE TABLE outbox.events_2 PARTITION OF outbox.events FOR VALUES IN (2);
CREATE TABLE outbox.events_3 PARTITION OF outbox.events FOR VALUES IN (3);
CREATE TABLE outbox.events_4 PARTITION OF outbox.events FOR VALUES IN (4);
CREATE TABLE outbox.events_5 PARTITION OF outbox.events FOR VALUES IN (5);
CREATE TRIGGER event_restored BEFORE INSERT ON outbox.events
	FOR EACH ROW WHEN (NEW.txid OPERATOR(pg_catalog.<>) pg_catalog.pg_current_xact_id())
	EXECUTE FUNCTION outbox_internal.event_restored();
REVOKE ALL ON outbox.events, outbox.events_1, outbox.events_2, outbox.events_3,
	outbox.events_4, outbox.events_5 FROM PUBLIC;

COMMENT ON TABLE outbox.events IS
	'Append-only event log: one row per emitted event, published to Kafka after commit';
COMMENT ON COLUMN outbox.events.id IS 'insertion order; for one aggregate also commit order';
COMMENT ON COLUMN outbox.events.txid IS 'top-level transaction that emitted the event';
COMMENT ON COLUMN outbox.events.event_id IS 'stable identity (UUIDv7 unless given); consumers dedupe on it';
COMMENT ON COLUMN outbox.events.seq IS 'gapless per-aggregate number in commit order (NULL when outbox.aggregate_sequence is off)';
COMMENT ON COLUMN outbox.events.topic IS 'Kafka topic, resolved at emit';
COMMENT ON COLUMN outbox.events.key IS 'Kafka message key (default aggregate_id)';
COMMENT ON COLUMN outbox.events.payload IS 'the value as JSON (emit()); NULL for emit_binary() and emit_tombstone()';
COMMENT ON COLUMN outbox.events.payload_bytes IS 'the value as bytes, schema-registry frame included (emit_binary()); NULL otherwise';
COMMENT ON COLUMN outbox.events.content_type IS 'emit_binary()''s content type, sent as the content-type header';
COMMENT ON COLUMN outbox.events.generation IS 'the generation (partition events_<n>) the row was written in; see outbox.generations';

SELECT pg_catalog.pg_extension_config_dump('outbox.events', '');
SELECT pg_catalog.pg_extension_config_dump('outbox.events_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('outbox.events_0', '');
SELECT pg_catalog.pg_extension_config_dump('outbox.events_1', '');
SELECT pg_catalog.pg_extension_config_dump('outbox.events_2', '');
SELECT pg_catalog.pg_extension_config_dump('outbox.events_3', '');
SELECT pg_catalog.pg_extension_config_dump('outbox.events_4', '');
SELECT pg_catalog.pg_extension_config_dump('outbox.events_5', '');

CREATE TABLE outbox.generations (
	generation		smallint PRIMARY KEY CHECK (generation BETWEEN 0 AND 5),
	state			text NOT NULL CHECK (state IN ('current', 'closed', 'empty')),
	opened_at		timestamptz,
	closed_at		timestamptz,
	emptied_at		timestamptz,
	waits_for		text,
	moved_by		pg_catalog.xid8
);
CREATE UNIQUE INDEX generations_current_idx ON outbox.generations (state)
	WHERE state OPERATOR(pg_catalog.=) 'current';
INSERT INTO outbox.generations (generation, state, opened_at)
SELECT g, CASE WHEN g OPERATOR(pg_catalog.=) 0 THEN 'current' ELSE 'empty' END,
	   CASE WHEN g OPERATOR(pg_catalog.=) 0 THEN pg_catalog.now() END
  FROM pg_catalog.generate_series(0, 5) g;
COMMENT ON TABLE outbox.generations IS
	'The generations of outbox.events (partitions events_0 to events_5): which one emit() writes into, and why a closed one is not emptied yet';
COMMENT ON COLUMN outbox.generations.waits_for IS
	'what keeps a closed generation from being emptied, as the relay last found it; NULL: nothing';
COMMENT ON COLUMN outbox.generations.moved_by IS
	'the transaction that moved the rows still needed (dead letters, holds, replays) out of a closed generation into the current one; the generation is emptied once no snapshot older than its end remains';
REVOKE ALL ON outbox.generations FROM PUBLIC;

/*
 * The functions of the log's row type follow it to the new table; the
 * view shows the ring.
 */
CREATE FUNCTION outbox_internal.delivered_events()
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
	   AND NOT EXISTS (SELECT 1 FROM outbox.held h WHERE h.id OPERATOR(pg_catalog.=) e.id)
$$;
COMMENT ON FUNCTION outbox_internal.delivered_events() IS
	'Internal: the events the relay has delivered that no quarantined, parked or replaying dead letter and no hold keeps';

CREATE FUNCTION outbox_internal.removable_events(cutoff timestamptz)
RETURNS SETOF outbox.events
LANGUAGE sql STABLE
AS $$
	SELECT e.*
	  FROM outbox_internal.delivered_events() e
	 WHERE e.created_at OPERATOR(pg_catalog.<) cutoff
	   AND NOT EXISTS (SELECT 1 FROM outbox.replay_queue q WHERE q.event_pk OPERATOR(pg_catalog.=) e.id)
	   AND NOT EXISTS (SELECT 1 FROM outbox.restored_events r WHERE r.id OPERATOR(pg_catalog.=) e.id)
$$;
COMMENT ON FUNCTION outbox_internal.removable_events(timestamptz) IS
	'Internal: the delivered events created before cutoff that nothing needs any more: not held, not queued for replay, not a restored event the relay has not judged';
REVOKE ALL ON FUNCTION outbox_internal.delivered_events() FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox_internal.removable_events(timestamptz) FROM PUBLIC;

CREATE OR REPLACE VIEW outbox.status AS
SELECT s.*,
	   COALESCE(h.held_events, 0) AS held_events,
	   h.holds,
	   r.kept_generations,
	   r.log_waits_for
  FROM outbox.status() s
 CROSS JOIN (SELECT pg_catalog.sum(g.events)::bigint AS held_events,
					pg_catalog.jsonb_agg(pg_catalog.jsonb_build_object(
						'topic', g.topic, 'partition', g.kafka_partition,
						'events', g.events, 'since', g.since)
						ORDER BY g.since, g.topic, g.kafka_partition) AS holds
			   FROM (SELECT hp.topic, hp.kafka_partition, pg_catalog.count(*) AS events,
							pg_catalog.min(hp.held_at) AS since
					   FROM outbox.held hp
					  GROUP BY hp.topic, hp.kafka_partition) g) h
 CROSS JOIN (SELECT pg_catalog.count(*) FILTER (WHERE k.state OPERATOR(pg_catalog.=) 'closed') AS kept_generations,
					(pg_catalog.array_agg(k.waits_for ORDER BY k.closed_at)
					   FILTER (WHERE k.waits_for IS NOT NULL))[1] AS log_waits_for
			   FROM outbox.generations k) r;
COMMENT ON VIEW outbox.status IS
	'outbox.status() as a view, with the partitions whose events are held and the log''s closed generations';
COMMENT ON COLUMN outbox.status.kept_generations IS
	'closed generations of the log not emptied yet (outbox.generations)';
COMMENT ON COLUMN outbox.status.log_waits_for IS
	'what keeps the oldest kept generation from being emptied; NULL: nothing';

/*
 * Avro through a schema registry: the latest schema of each topic of
 * outbox.avro_topics, as the relay last fetched it from
 * outbox.schema_registry_url (subject <topic>-value), so that validate()
 * checks a payload without the network.  Written by the relay only; not
 * dumped: the relay fetches it again.
 */
CREATE TABLE outbox.schemas (
	topic			text PRIMARY KEY,
	schema_id		integer NOT NULL,
	schema			text NOT NULL,
	fetched_at		timestamptz NOT NULL DEFAULT pg_catalog.now()
);
COMMENT ON TABLE outbox.schemas IS
	'The latest Avro schema of each topic in outbox.avro_topics, as the relay last fetched it from the schema registry';
REVOKE ALL ON outbox.schemas FROM PUBLIC;

CREATE FUNCTION outbox.validate(topic text, payload jsonb)
RETURNS text
AS 'MODULE_PATHNAME', 'outbox_validate'
LANGUAGE C STABLE STRICT PARALLEL SAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION outbox.validate(text, jsonb) IS
	'Whether payload fits the Avro schema the relay would encode it with on topic: NULL when it does, else the reason; no network';
REVOKE ALL ON FUNCTION outbox.validate(text, jsonb) FROM PUBLIC;
