/* outbox--1.7--1.8.sql: from 1.7 to 1.8.  Must leave a database equal to a fresh 1.8 install. */

\echo Use "ALTER EXTENSION outbox UPDATE TO '1.8'" to load this file. \quit

/*
 * Subscriptions hold their handler by OID, with its owner at subscribe()
 * (issue: a dropped handler's name, taken by another role, was run as the
 * subscriber).  A handler that no longer resolves becomes OID 0: its
 * worker reports it, as before, and runs nothing.
 */
ALTER TABLE outbox.subscriptions
	ALTER COLUMN handler TYPE regprocedure
	USING coalesce(pg_catalog.to_regprocedure(handler), '-'::pg_catalog.regprocedure);
ALTER TABLE outbox.subscriptions ADD COLUMN handler_owner regrole;
UPDATE outbox.subscriptions s
   SET handler_owner = coalesce((SELECT p.proowner FROM pg_catalog.pg_proc p
								  WHERE p.oid OPERATOR(pg_catalog.=) s.handler::pg_catalog.oid),
								s.owner::pg_catalog.oid)::pg_catalog.regrole;
ALTER TABLE outbox.subscriptions ALTER COLUMN handler_owner SET NOT NULL;
COMMENT ON COLUMN outbox.subscriptions.handler IS
	'The function called once per message, bound by OID: it takes one outbox.inbound_message; dropping it is refused while the subscription exists';
COMMENT ON COLUMN outbox.subscriptions.handler_owner IS
	'The handler''s owner when subscribe() ran; the worker refuses to run a handler whose owner has changed since';

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
 * A subscription holds its handler by OID.  Dropping the function would
 * leave the name free for whoever may create functions in its schema, and
 * a look-up by name would then run their code as the subscriber: the drop
 * is refused instead (CREATE OR REPLACE keeps the OID and is allowed).
 * SECURITY DEFINER: the dropping role need not see outbox.subscriptions.
 */
CREATE FUNCTION outbox.refuse_handler_drop()
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
		  JOIN outbox.subscriptions s ON s.handler::pg_catalog.oid OPERATOR(pg_catalog.=) o.objid
		 WHERE o.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_proc'::pg_catalog.regclass
		 ORDER BY s.name LIMIT 1
	LOOP
		RAISE EXCEPTION 'cannot drop function % because subscription "%" uses it as its handler',
			d.object_identity, d.name
			USING ERRCODE = 'dependent_objects_still_exist',
				  HINT = pg_catalog.format('Call outbox.unsubscribe(%L) first, or change the function with CREATE OR REPLACE FUNCTION, which the subscription keeps.', d.name);
	END LOOP;
END
$$;
COMMENT ON FUNCTION outbox.refuse_handler_drop() IS
	'Event trigger: refuses to drop a function that a subscription uses as its handler';
REVOKE ALL ON FUNCTION outbox.refuse_handler_drop() FROM PUBLIC;
CREATE EVENT TRIGGER outbox_refuse_handler_drop ON sql_drop
	EXECUTE FUNCTION outbox.refuse_handler_drop();

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
