/*
 * outbox.sql: the current version's full install script (make copies it to
 * outbox--<default_version>.sql): the event log, emit(), capture(), the
 * relay's progress, the consumers' inbox and subscriptions.  A change here
 * comes with the upgrade script to the version it makes, which must leave a
 * database equal to a fresh install of this one.
 */

\echo Use "CREATE EXTENSION outbox" to load this file. \quit

/*
 * The schema comes from outbox.control.  CREATE EXTENSION makes it when it
 * is missing, but would adopt one that exists: refuse a schema that holds
 * anything or that a role other than a superuser owns, so nobody can plant
 * objects where the extension's owner-rights functions look.
 */
DO $$
DECLARE
	owner_super	boolean;
	nsp			oid;
BEGIN
	SELECT n.oid, r.rolsuper INTO nsp, owner_super
	  FROM pg_catalog.pg_namespace n
	  JOIN pg_catalog.pg_roles r ON r.oid OPERATOR(pg_catalog.=) n.nspowner
	 WHERE n.nspname OPERATOR(pg_catalog.=) 'outbox';
	IF NOT owner_super THEN
		RAISE EXCEPTION 'schema "outbox" already exists and is not owned by a superuser'
			USING ERRCODE = 'insufficient_privilege',
				  HINT = 'Drop or rename that schema, then run CREATE EXTENSION outbox again.';
	END IF;
	IF EXISTS (SELECT 1 FROM pg_catalog.pg_namespace n,
				   pg_catalog.aclexplode(n.nspacl) a
				   LEFT JOIN pg_catalog.pg_roles r ON r.oid OPERATOR(pg_catalog.=) a.grantee
			    WHERE n.oid OPERATOR(pg_catalog.=) nsp AND NOT coalesce(r.rolsuper, false)) THEN
		RAISE EXCEPTION 'schema "outbox" already exists and grants privileges to a role that is not a superuser'
			USING ERRCODE = 'insufficient_privilege',
				  HINT = 'Drop or rename that schema, then run CREATE EXTENSION outbox again.';
	END IF;
	IF EXISTS (SELECT 1 FROM pg_catalog.pg_depend d
				WHERE d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_namespace'::pg_catalog.regclass
				  AND d.refobjid OPERATOR(pg_catalog.=) nsp
				  AND d.classid OPERATOR(pg_catalog.<>) 'pg_catalog.pg_extension'::pg_catalog.regclass) THEN
		RAISE EXCEPTION 'schema "outbox" already exists and is not empty'
			USING ERRCODE = 'duplicate_schema',
				  HINT = 'Drop or rename that schema, then run CREATE EXTENSION outbox again.';
	END IF;
END
$$;

/*
 * What users must not call lives in a schema of its own, so that schema
 * outbox holds only the API: the triggers and the event trigger, the
 * helpers replay(), discard() and cleanup() share, and the calls that
 * wake a worker at commit.  Only the extension's owner (a superuser: the
 * relay's role too) uses it.  A trigger fires for any writer without
 * EXECUTE on its function; the restore triggers call notify_relay() with
 * the writer's rights, so restores run as the owner, as they must to
 * write the tables at all.  A schema of this name that exists already
 * stops CREATE EXTENSION.
 */
CREATE SCHEMA outbox_internal;
REVOKE ALL ON SCHEMA outbox_internal FROM PUBLIC;
COMMENT ON SCHEMA outbox_internal IS
	'Internal functions of the outbox extension: triggers and helpers, not for users to call';

/*
 * The log.  Rows are never updated (but for the txid of restored rows,
 * once, see outbox_internal.event_restored()); delivery state lives in
 * outbox.relay_progress.  Every index is paid by every emit: id (paging),
 * event_id (identity), txid (the relay's snapshot batches).
 *
 * The log is a ring of six generations, one partition each (events_0 to
 * events_5; docs/design.md, "The log's generations").  emit() writes into
 * the current one; the relay opens the next when the current one is old
 * enough, and empties a closed one with TRUNCATE once every row in it is
 * delivered and past outbox.retention, never with DELETE.  The keys hold
 * within a partition; id is drawn from one sequence, and emit() checks a
 * given event_id against every generation (emit/emit_generation.c).
 */
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
CREATE TABLE outbox.events_0 PARTITION OF outbox.events FOR VALUES IN (0);
CREATE TABLE outbox.events_1 PARTITION OF outbox.events FOR VALUES IN (1);
CREATE TABLE outbox.events_2 PARTITION OF outbox.events FOR VALUES IN (2);
CREATE TABLE outbox.events_3 PARTITION OF outbox.events FOR VALUES IN (3);
CREATE TABLE outbox.events_4 PARTITION OF outbox.events FOR VALUES IN (4);
CREATE TABLE outbox.events_5 PARTITION OF outbox.events FOR VALUES IN (5);

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

/*
 * The ring's state, kept by the relay.  current: the generation emit()
 * writes into; closed: written no more, emptied once every row in it is
 * delivered and past outbox.retention; empty: ready to be opened.  Not
 * dumped: a restore starts a fresh ring, and the relay counts any restored
 * rows in a generation marked empty as closed now.
 */
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
 * Per-aggregate counters behind seq; the row lock orders emitters.  The
 * key compares bytes (COLLATE "C"): emit() looks a row up once per
 * transaction, and equality is the same under any deterministic collation.
 */
CREATE TABLE outbox.aggregates (
	aggregate_type	text COLLATE "C" NOT NULL,
	aggregate_id	text COLLATE "C" NOT NULL,
	last_seq		bigint NOT NULL,
	PRIMARY KEY (aggregate_type, aggregate_id)
);
COMMENT ON TABLE outbox.aggregates IS
	'Per-aggregate sequence counters behind outbox.events.seq';

/*
 * One row per relay.  prev_snapshot: every event committed in it is
 * delivered (NULL before the first batch: nothing is).  batch_snapshot and
 * batch_last_id: the batch under way and the last id acknowledged in it.
 */
CREATE TABLE outbox.relay_progress (
	relay			text PRIMARY KEY,
	prev_snapshot	pg_catalog.pg_snapshot,
	batch_snapshot	pg_catalog.pg_snapshot,
	batch_last_id	bigint,
	published		bigint NOT NULL DEFAULT 0,
	batches			bigint NOT NULL DEFAULT 0,
	updated_at		timestamptz NOT NULL DEFAULT pg_catalog.now(),
	kafka_transaction bigint
);
COMMENT ON TABLE outbox.relay_progress IS
	'Delivery progress of each relay, written once per acknowledged page';
COMMENT ON COLUMN outbox.relay_progress.kafka_transaction IS
	'with outbox.delivery = exactly_once, the number of the Kafka transaction whose page was recorded last; the progress topic says which the cluster committed';

/*
 * The relay's own row: nothing is delivered, and nothing committed before
 * this install can be in the log, so the install's snapshot is where the
 * relay starts; this transaction's own id is added to its in-progress list,
 * since events emitted in it are still to be published.  (A NULL snapshot
 * would take every event visible at the first batch, which would include a
 * restore's; see outbox_internal.event_restored().)
 */
INSERT INTO outbox.relay_progress (relay, prev_snapshot)
SELECT 'default',
	   (least(pg_catalog.pg_snapshot_xmin(c.s)::text::numeric, c.x)::text || ':'
		|| greatest(pg_catalog.pg_snapshot_xmax(c.s)::text::numeric,
							   c.x OPERATOR(pg_catalog.+) 1)::text || ':'
		|| coalesce((SELECT pg_catalog.string_agg(u.v::text, ',' ORDER BY u.v)
					   FROM (SELECT pg_catalog.pg_snapshot_xip(c.s)::text::numeric AS v
							 UNION SELECT c.x) u), '')
	   )::pg_catalog.pg_snapshot
  FROM (SELECT pg_catalog.pg_current_snapshot() AS s,
			   pg_catalog.pg_current_xact_id()::text::numeric AS x) c;

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
COMMENT ON TABLE outbox.restored_events IS
	'Events a restore brought in, with their original txid, until the relay has published those not delivered before the dump';

CREATE FUNCTION outbox_internal.event_restored()
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
COMMENT ON FUNCTION outbox_internal.event_restored() IS
	'Trigger: an event row inserted with a txid not its transaction''s (a restore) is kept out of the batches until the relay has judged it';
REVOKE ALL ON FUNCTION outbox_internal.event_restored() FROM PUBLIC;
CREATE TRIGGER event_restored BEFORE INSERT ON outbox.events
	FOR EACH ROW WHEN (NEW.txid OPERATOR(pg_catalog.<>) pg_catalog.pg_current_xact_id())
	EXECUTE FUNCTION outbox_internal.event_restored();

CREATE FUNCTION outbox_internal.progress_restored()
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
COMMENT ON FUNCTION outbox_internal.progress_restored() IS
	'Trigger: keeps a restored progress row beside this database''s own and wakes the relay';
REVOKE ALL ON FUNCTION outbox_internal.progress_restored() FROM PUBLIC;
CREATE TRIGGER progress_restored BEFORE INSERT ON outbox.relay_progress
	FOR EACH ROW EXECUTE FUNCTION outbox_internal.progress_restored();

/*
 * Events Kafka refused for good, and the events parked behind them.  The
 * event rows stay in outbox.events; this is their delivery state.
 */
CREATE TABLE outbox.dead_letters (
	event_id		uuid PRIMARY KEY,
	event_pk		bigint NOT NULL,
	aggregate_type	text NOT NULL,
	aggregate_id	text NOT NULL,
	seq				bigint,
	event_type		text NOT NULL,
	topic			text NOT NULL,
	state			text NOT NULL
		CHECK (state IN ('quarantined', 'parked', 'replaying', 'replayed', 'discarded')),
	blocked_by		uuid,
	error_class		text,
	last_error		text,
	attempts		integer NOT NULL DEFAULT 0,
	first_failed_at	timestamptz,
	last_failed_at	timestamptz,
	quarantined_at	timestamptz NOT NULL DEFAULT pg_catalog.now(),
	resolved_at		timestamptz,
	envelope		jsonb NOT NULL
);
CREATE INDEX dead_letters_active_idx ON outbox.dead_letters (aggregate_type, aggregate_id)
	WHERE state IN ('quarantined', 'parked', 'replaying');
COMMENT ON TABLE outbox.dead_letters IS
	'Quarantined events (refused by Kafka after outbox.max_attempts) and the events parked behind them';
COMMENT ON COLUMN outbox.dead_letters.state IS
	'quarantined: refused; parked: waits behind blocked_by; replaying: queued for the relay; replayed or discarded: resolved';

/* Events the relay is asked to publish again (outbox.replay, outbox.discard). */
CREATE TABLE outbox.replay_queue (
	position		bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	event_pk		bigint NOT NULL,
	dead_letter		boolean NOT NULL,
	requested_at	timestamptz NOT NULL DEFAULT pg_catalog.now()
);
COMMENT ON TABLE outbox.replay_queue IS
	'Events queued for publishing again, in position order, with their original event_id';

SELECT pg_catalog.pg_extension_config_dump('outbox.events', '');
SELECT pg_catalog.pg_extension_config_dump('outbox.events_0', '');
SELECT pg_catalog.pg_extension_config_dump('outbox.events_1', '');
SELECT pg_catalog.pg_extension_config_dump('outbox.events_2', '');
SELECT pg_catalog.pg_extension_config_dump('outbox.events_3', '');
SELECT pg_catalog.pg_extension_config_dump('outbox.events_4', '');
SELECT pg_catalog.pg_extension_config_dump('outbox.events_5', '');
SELECT pg_catalog.pg_extension_config_dump('outbox.events_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('outbox.aggregates', '');
SELECT pg_catalog.pg_extension_config_dump('outbox.relay_progress', '');
SELECT pg_catalog.pg_extension_config_dump('outbox.dead_letters', '');
SELECT pg_catalog.pg_extension_config_dump('outbox.replay_queue', '');
SELECT pg_catalog.pg_extension_config_dump('outbox.replay_queue_position_seq', '');

/*
 * Not SECURITY DEFINER: the C function runs as its owner by itself and
 * pins search_path for the statements it runs (src/emit.c, outbox_emit).
 */
CREATE FUNCTION outbox.emit(
	aggregate_type	text,
	aggregate_id	text,
	event_type		text,
	payload			jsonb,
	headers			jsonb DEFAULT NULL,
	topic			text DEFAULT NULL,
	key				text DEFAULT NULL,
	event_id		uuid DEFAULT NULL,
	schema_version	integer DEFAULT 1,
	occurred_at		timestamptz DEFAULT NULL)
RETURNS uuid
AS 'MODULE_PATHNAME', 'outbox_emit'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION outbox.emit(text, text, text, jsonb, jsonb, text, text, uuid, integer, timestamptz) IS
	'Records an event in the current transaction; the relay publishes it to Kafka after commit';

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

CREATE FUNCTION outbox.uuid_v7()
RETURNS uuid
AS 'MODULE_PATHNAME', 'outbox_uuid_v7'
LANGUAGE C VOLATILE PARALLEL SAFE;
COMMENT ON FUNCTION outbox.uuid_v7() IS
	'A new time-ordered UUID (RFC 9562 version 7), as emit() generates for event ids';

/*
 * capture(aggregate_type, id_column): AFTER ... FOR EACH ROW trigger that
 * emits one event per row change, the row as payload.
 */
CREATE FUNCTION outbox.capture()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	row_json	jsonb;
	agg_id		text;
	verb		text;
BEGIN
	IF TG_WHEN <> 'AFTER' OR TG_LEVEL <> 'ROW' THEN
		RAISE EXCEPTION 'outbox.capture() must be an AFTER ... FOR EACH ROW trigger'
			USING ERRCODE = 'invalid_object_definition',
				  HINT = format('Recreate trigger "%s" on %s as AFTER INSERT OR UPDATE OR DELETE ... FOR EACH ROW.',
								TG_NAME, format('%I.%I', TG_TABLE_SCHEMA, TG_TABLE_NAME));
	END IF;
	IF TG_NARGS <> 2 OR TG_ARGV[0] = '' OR TG_ARGV[1] = '' THEN
		RAISE EXCEPTION 'outbox.capture() takes two arguments: aggregate type and id column'
			USING ERRCODE = 'invalid_parameter_value',
				  HINT = format('Trigger "%s" on %s has %s argument(s); use EXECUTE FUNCTION outbox.capture(''order'', ''id'').',
								TG_NAME, format('%I.%I', TG_TABLE_SCHEMA, TG_TABLE_NAME), TG_NARGS);
	END IF;

	IF TG_OP = 'DELETE' THEN
		row_json := to_jsonb(OLD);
		verb := 'deleted';
	ELSE
		row_json := to_jsonb(NEW);
		verb := CASE TG_OP WHEN 'INSERT' THEN 'inserted' ELSE 'updated' END;
	END IF;

	IF NOT row_json ? TG_ARGV[1] THEN
		RAISE EXCEPTION 'column "%" does not exist in table %.%', TG_ARGV[1], TG_TABLE_SCHEMA, TG_TABLE_NAME
			USING ERRCODE = 'undefined_column',
				  HINT = format('The second argument of outbox.capture() in trigger "%s" names the aggregate id column.', TG_NAME);
	END IF;
	agg_id := row_json ->> TG_ARGV[1];
	IF agg_id IS NULL THEN
		RAISE EXCEPTION 'aggregate id column "%" is null', TG_ARGV[1]
			USING ERRCODE = 'null_value_not_allowed';
	END IF;

	PERFORM outbox.emit(TG_ARGV[0], agg_id, TG_ARGV[0] || '.' || verb, row_json);
	RETURN NULL;
END
$$;
COMMENT ON FUNCTION outbox.capture() IS
	'Trigger: EXECUTE FUNCTION outbox.capture(aggregate_type, id_column) emits <aggregate_type>.inserted|updated|deleted with the row as payload';

/* PUBLIC can neither emit nor read; see the README for writer and reader grants. */
REVOKE ALL ON SCHEMA outbox FROM PUBLIC;
REVOKE ALL ON ALL TABLES IN SCHEMA outbox FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox.emit(text, text, text, jsonb, jsonb, text, text, uuid, integer, timestamptz) FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox.emit_binary(text, text, text, bytea, jsonb, text, text, uuid, integer, timestamptz, text, integer, integer[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox.emit_tombstone(text, text, text, jsonb, text, text, uuid, integer, timestamptz) FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox.capture() FROM PUBLIC;

/*
 * Held partitions.  When a topic-partition acknowledges nothing for
 * outbox.hold_after while the rest of the cluster does, the relay records
 * that partition's unacknowledged events here and moves its progress past
 * them; later events of the partition join them instead of being sent.
 * The invariant that makes a crash during a hold safe: a page's progress is
 * recorded only in the transaction that also records each of its events as
 * acknowledged, dead-lettered, or held here.  The relay sends the oldest
 * held event of each held partition as a probe; once Kafka acknowledges
 * it, the partition's held events are sent in id order, each row deleted
 * as its page is acknowledged, and the hold ends when none is left.  Rows
 * name their event, which cleanup and replay leave alone while held.
 */
CREATE TABLE outbox.held (
	id				bigint PRIMARY KEY,
	topic			text NOT NULL,
	kafka_partition integer NOT NULL
		CONSTRAINT held_partition_not_negative
		CHECK (kafka_partition OPERATOR(pg_catalog.>=) 0),
	held_at			timestamptz NOT NULL DEFAULT pg_catalog.now()
);
CREATE INDEX held_partition_idx ON outbox.held (topic, kafka_partition, id);
COMMENT ON TABLE outbox.held IS
	'Events whose Kafka partition was unavailable, kept until it returns; written by the relay only';
SELECT pg_catalog.pg_extension_config_dump('outbox.held', '');

CREATE FUNCTION outbox.holds(
	OUT topic			text,
	OUT kafka_partition integer,
	OUT events			bigint,
	OUT held_since		timestamptz)
RETURNS SETOF record
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
	SELECT h.topic, h.kafka_partition, count(*), min(h.held_at)
	  FROM outbox.held h
	 GROUP BY h.topic, h.kafka_partition
	 ORDER BY h.topic, h.kafka_partition
$$;
COMMENT ON FUNCTION outbox.holds() IS
	'The topic-partitions whose events the relay holds: how many events each, and since when';
REVOKE ALL ON FUNCTION outbox.holds() FROM PUBLIC;

/*
 * Monitoring.  Figures come from shared memory and the dead-letter table,
 * never from a scan of the log; none shows an event's payload.  They run as
 * the extension owner so a monitoring role needs only EXECUTE.
 */
CREATE FUNCTION outbox.status(
	OUT relay					text,
	OUT state					text,
	OUT pid						integer,
	OUT brokers					text,
	OUT brokers_up				integer,
	OUT backlog					bigint,
	OUT oldest_pending_seconds	double precision,
	OUT published				bigint,
	OUT published_bytes			bigint,
	OUT published_last_minute	bigint,
	OUT bytes_last_minute		bigint,
	OUT quarantined				bigint,
	OUT parked					bigint,
	OUT retries					bigint,
	OUT transient_failures		bigint,
	OUT permanent_failures		bigint,
	OUT fatal_failures			bigint,
	OUT last_error				text,
	OUT last_error_at			timestamptz,
	OUT last_delivery_at		timestamptz,
	OUT latency_p50_ms			double precision,
	OUT latency_p95_ms			double precision,
	OUT latency_p99_ms			double precision,
	OUT page_size				integer,
	OUT started_at				timestamptz)
RETURNS record
AS 'MODULE_PATHNAME', 'outbox_status'
LANGUAGE C VOLATILE STRICT SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION outbox.status() IS
	'State, backlog, age, throughput, errors and publish latency of this database''s relay';

/*
 * The view adds the held partitions, read as its owner: a role with SELECT
 * on it and EXECUTE on status() sees them without any right on the table.
 */
CREATE VIEW outbox.status AS
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

CREATE FUNCTION outbox.metrics()
RETURNS text
AS 'MODULE_PATHNAME', 'outbox_metrics'
LANGUAGE C VOLATILE STRICT SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION outbox.metrics() IS
	'The relay''s figures in Prometheus text exposition format';

CREATE FUNCTION outbox.health(max_age interval DEFAULT '1 min',
							  OUT status text, OUT reason text)
RETURNS record
AS 'MODULE_PATHNAME', 'outbox_health'
LANGUAGE C VOLATILE STRICT SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION outbox.health(interval) IS
	'ok, warning or critical, judged by the oldest undelivered event''s age and the relay''s state';

REVOKE ALL ON FUNCTION outbox.status() FROM PUBLIC;
REVOKE ALL ON outbox.status FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox.metrics() FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox.health(interval) FROM PUBLIC;

CREATE FUNCTION outbox_internal.notify_relay()
RETURNS void
AS 'MODULE_PATHNAME', 'outbox_notify_relay'
LANGUAGE C VOLATILE;
COMMENT ON FUNCTION outbox_internal.notify_relay() IS
	'Wakes this database''s relay when the current transaction commits';
REVOKE ALL ON FUNCTION outbox_internal.notify_relay() FROM PUBLIC;

/*
 * Internal helpers of replay(), discard() and cleanup(), so that what they
 * share is written once.  They run with the caller's own rights, as their
 * callers do: the extension's owner, or a role it granted those and the
 * tables they change, which needs USAGE on outbox_internal and EXECUTE on
 * these as well.  delivered_events() and removable_events() are SQL without
 * a SET clause so that the planner inlines them into the caller's query
 * (an index walk with a LIMIT stays one); their names and operators are
 * therefore all qualified.
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

/*
 * The dead letter of event_id, locked until the transaction ends; a row of
 * NULLs when there is none.
 */
CREATE FUNCTION outbox_internal.lock_dead_letter(event_id uuid)
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
COMMENT ON FUNCTION outbox_internal.lock_dead_letter(uuid) IS
	'Internal: the dead letter of an event, locked (replay and discard start here)';

/*
 * Queues for replay, in event order, the head if it is still quarantined
 * (replay) and every event parked behind it or behind any head that no
 * longer holds it back (replayed, discarded, queued): such an event has no
 * other way out.  Returns their dead letters, now replaying.
 */
CREATE FUNCTION outbox_internal.queue_released(head uuid)
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
COMMENT ON FUNCTION outbox_internal.queue_released(uuid) IS
	'Internal: queues a quarantined head and what waits behind it, or behind a head already gone, for replay';
REVOKE ALL ON FUNCTION outbox_internal.delivered_events() FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox_internal.removable_events(timestamptz) FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox_internal.lock_dead_letter(uuid) FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox_internal.queue_released(uuid) FROM PUBLIC;

/*
 * replay(event_id): publish a quarantined event again, then the events
 * parked behind it, in order, with their original ids.
 */
CREATE FUNCTION outbox.replay(event_id uuid)
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
COMMENT ON FUNCTION outbox.replay(uuid) IS
	'Publishes a quarantined event again, then the events parked behind it, with their original ids';

/* discard(event_id): drop a quarantined event and release what waits behind it. */
CREATE FUNCTION outbox.discard(event_id uuid)
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
COMMENT ON FUNCTION outbox.discard(uuid) IS
	'Drops a quarantined event for good and publishes the events parked behind it';

/* replay(since, until): publish again retained events the relay already delivered. */
CREATE FUNCTION outbox.replay(since timestamptz, until timestamptz,
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
COMMENT ON FUNCTION outbox.replay(timestamptz, timestamptz, text) IS
	'Publishes again, with their original ids, the delivered events created in [since, until); returns how many were queued';

/*
 * cleanup(dry_run, max_events): the published events older than
 * outbox.retention.  Never an undelivered, quarantined, parked or queued one.
 */
CREATE FUNCTION outbox.cleanup(dry_run boolean DEFAULT true, max_events integer DEFAULT 10000)
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
COMMENT ON FUNCTION outbox.cleanup(boolean, integer) IS
	'Reports (dry_run) or deletes up to max_events published events older than outbox.retention';

REVOKE ALL ON FUNCTION outbox.replay(uuid) FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox.discard(uuid) FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox.replay(timestamptz, timestamptz, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox.cleanup(boolean, integer) FROM PUBLIC;

/*
 * The consumer side: outbox.inbox remembers which events each consumer has
 * handled, so that a consumer reading an at-least-once stream applies each
 * event once.  consume_once(consumer, event_id) runs in the consumer's own
 * transaction, beside its business change: the row it inserts commits or
 * rolls back with that change.
 *
 * Concurrent duplicates: INSERT ... ON CONFLICT DO NOTHING waits for a
 * transaction that inserted the same (consumer, event_id) and has not ended;
 * if that one commits the second caller gets false, if it rolls back the
 * second inserts and gets true.  At REPEATABLE READ or SERIALIZABLE, a
 * duplicate committed after the caller's snapshot was taken raises a
 * serialization failure (40001) instead: the caller retries.
 *
 * Rows older than outbox.inbox_retention are deleted by the relay when it
 * is idle (outbox.inbox_cleanup()); a duplicate arriving after that is
 * consumed again, so the retention must outlast any redelivery, replay
 * included.
 */
CREATE TABLE outbox.inbox (
	consumer	text		NOT NULL
		CONSTRAINT inbox_consumer_length
		CHECK (pg_catalog.char_length(consumer) OPERATOR(pg_catalog.>=) 1
			   AND pg_catalog.char_length(consumer) OPERATOR(pg_catalog.<=) 200),
	event_id	uuid		NOT NULL,
	consumed_at timestamptz NOT NULL DEFAULT pg_catalog.now(),
	PRIMARY KEY (consumer, event_id)
);
COMMENT ON TABLE outbox.inbox IS
	'The events each consumer has handled, for consume_once(); rows older than outbox.inbox_retention are deleted';
COMMENT ON COLUMN outbox.inbox.consumer IS 'Who consumed the event: a name the consumer chooses, 1 to 200 characters';
COMMENT ON COLUMN outbox.inbox.event_id IS 'The event''s id (its Kafka header id)';
COMMENT ON COLUMN outbox.inbox.consumed_at IS 'When the consuming transaction ran consume_once()';
/* the retention's deletes walk the oldest rows first */
CREATE INDEX inbox_consumed_at_idx ON outbox.inbox (consumed_at);
/* dedupe state must survive a dump and restore, or events are applied twice */
SELECT pg_catalog.pg_extension_config_dump('outbox.inbox', '');

/* consumer names starting with 'outbox:' or 'outbox;' belong to the subscriptions */
CREATE FUNCTION outbox.consume_once(consumer text, event_id uuid)
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
COMMENT ON FUNCTION outbox.consume_once(text, uuid) IS
	'True the first time consumer sees event_id, false afterwards; call it in the transaction that applies the event';

/*
 * inbox_cleanup(max_rows): the inbox rows older than outbox.inbox_retention,
 * oldest first, at most max_rows of them.  Returns how many went.
 */
CREATE FUNCTION outbox.inbox_cleanup(max_rows integer DEFAULT 10000)
RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	cutoff	timestamptz;
	deleted bigint;
BEGIN
	IF max_rows IS NULL OR max_rows < 1 THEN
		RAISE EXCEPTION 'max_rows must be at least 1'
			USING ERRCODE = 'invalid_parameter_value';
	END IF;
	/* as in cleanup(): the setting and its default belong to the library */
	PERFORM outbox.uuid_v7();
	cutoff := now() - (SELECT s.setting::bigint * interval '1 second'
						 FROM pg_settings s WHERE s.name = 'outbox.inbox_retention');
	WITH doomed AS (
		SELECT i.consumer, i.event_id FROM outbox.inbox i
		 WHERE i.consumed_at < cutoff
		 ORDER BY i.consumed_at LIMIT max_rows
	)
	DELETE FROM outbox.inbox i USING doomed
	 WHERE i.consumer = doomed.consumer AND i.event_id = doomed.event_id;
	GET DIAGNOSTICS deleted = ROW_COUNT;
	RETURN deleted;
END
$$;
COMMENT ON FUNCTION outbox.inbox_cleanup(integer) IS
	'Deletes up to max_rows inbox rows older than outbox.inbox_retention, oldest first; returns how many went';

/*
 * Nobody consumes until granted: a consumer role needs USAGE on the schema
 * and EXECUTE on consume_once(), and no right on outbox.inbox.
 */
REVOKE ALL ON outbox.inbox FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox.consume_once(text, uuid) FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox.inbox_cleanup(integer) FROM PUBLIC;


/*
 * Subscriptions: a background worker per row consumes its topics from
 * Kafka in a consumer group and calls its handler once per message, as the
 * subscription's owner, in a transaction that also records the message's
 * dedupe row (outbox.inbox, consumer = the group) and its partition's next
 * offset (outbox.inbox_offsets, by group).  Subscriptions sharing a group
 * share that state: partitions move between their workers on a
 * rebalance, and whichever worker owns one applies each message once.  Those offsets are the
 * truth: the worker seeks to them, and a message below its partition's
 * next offset is never applied again.  Rows are written by subscribe() and
 * unsubscribe(); the statement trigger tells the launcher at commit, so a
 * restore or a superuser's own INSERT starts workers too.  The dedupe rows
 * of a group are those of consumer 'outbox;<group>', a name consume_once()
 * refuses (below), so no consume_once() caller can forge or share them;
 * their event_id is a hash of the message's topic, origin header and id,
 * so no writer can suppress another topic's or database's events by
 * choosing their ids.  (Rows of consumer 'outbox:<group>' are the unscoped
 * ones written before 1.8, consulted until they age out.)
 */
CREATE TABLE outbox.subscriptions (
	name			text PRIMARY KEY
		CONSTRAINT subscription_name_form
		CHECK (name OPERATOR(pg_catalog.~) '^[a-z0-9_][a-z0-9_.-]{0,62}$'),
	topics			text[] NOT NULL
		CONSTRAINT subscription_topics_present
		CHECK (pg_catalog.cardinality(topics) OPERATOR(pg_catalog.>=) 1),
	handler			text NOT NULL,
	owner			regrole NOT NULL,
	group_id		text NOT NULL,
	start_from		text NOT NULL DEFAULT 'earliest'
		CONSTRAINT subscription_start_from
		CHECK (start_from OPERATOR(pg_catalog.=) ANY (ARRAY['earliest', 'latest'])),
	max_attempts	integer
		CONSTRAINT subscription_max_attempts
		CHECK (max_attempts OPERATOR(pg_catalog.>=) 1 AND max_attempts OPERATOR(pg_catalog.<=) 1000),
	poison_policy	text NOT NULL DEFAULT 'block'
		CONSTRAINT subscription_poison_policy
		CHECK (poison_policy OPERATOR(pg_catalog.=) ANY (ARRAY['block', 'skip'])),
	batch_size		integer NOT NULL DEFAULT 500
		CONSTRAINT subscription_batch_size
		CHECK (batch_size OPERATOR(pg_catalog.>=) 1 AND batch_size OPERATOR(pg_catalog.<=) 10000),
	created_at		timestamptz NOT NULL DEFAULT pg_catalog.now(),
	handler_owner	regrole NOT NULL
);
COMMENT ON TABLE outbox.subscriptions IS
	'Kafka topics a background worker applies to this database through a handler; written by subscribe() and unsubscribe()';
COMMENT ON COLUMN outbox.subscriptions.handler IS
	'The function called once per message, as regprocedure text: it takes one outbox.inbound_message';
COMMENT ON COLUMN outbox.subscriptions.handler_owner IS
	'The handler''s owner when subscribe() ran: the worker runs no function of that name owned by another role';
COMMENT ON COLUMN outbox.subscriptions.owner IS
	'The role the handler runs as: the role that called subscribe()';
COMMENT ON COLUMN outbox.subscriptions.max_attempts IS
	'Handler failures of one message before it is dead-lettered; NULL: outbox.max_attempts';
SELECT pg_catalog.pg_extension_config_dump('outbox.subscriptions', '');

/*
 * The next offset to apply, per consumer group and partition: written in
 * the transaction that applies the messages before it.  Kept after
 * unsubscribe(), so subscribing again in the same group resumes.
 */
CREATE TABLE outbox.inbox_offsets (
	consumer_group	text NOT NULL,
	topic			text NOT NULL,
	kafka_partition integer NOT NULL
		CONSTRAINT inbox_offsets_partition_not_negative
		CHECK (kafka_partition OPERATOR(pg_catalog.>=) 0),
	next_offset		bigint NOT NULL
		CONSTRAINT inbox_offsets_not_negative
		CHECK (next_offset OPERATOR(pg_catalog.>=) 0),
	updated_at		timestamptz NOT NULL DEFAULT pg_catalog.now(),
	PRIMARY KEY (consumer_group, topic, kafka_partition)
);
COMMENT ON TABLE outbox.inbox_offsets IS
	'Per consumer group and Kafka partition, the offset of the next message to apply; the subscription workers'' truth';
SELECT pg_catalog.pg_extension_config_dump('outbox.inbox_offsets', '');

/* What a handler receives: the Kafka message and the relay's envelope headers */
CREATE TYPE outbox.inbound_message AS (
	subscription	text,
	topic			text,
	kafka_partition integer,
	kafka_offset	bigint,
	kafka_timestamp timestamptz,
	key				text,
	headers			jsonb,
	payload			jsonb,
	value			bytea,
	event_id		uuid,
	event_type		text,
	aggregate_type	text,
	aggregate_id	text,
	seq				bigint
);
COMMENT ON TYPE outbox.inbound_message IS
	'One Kafka message for a subscription''s handler: payload is the value as jsonb (NULL when it is not JSON), value the raw bytes; the envelope fields come from the relay''s headers';

/*
 * Messages a handler failed on max_attempts times (state dead), the later
 * messages of the same topic and key parked behind one (state parked,
 * blocked_by its id, when the poison policy is block), and those queued
 * for the worker again by inbox_replay() (state replay); by consumer group,
 * like the offsets, with the subscription whose worker wrote the row.  Parked messages
 * whose key has no dead message left are applied by the worker, in id
 * order, after a replay or a discard.
 */
CREATE TABLE outbox.inbox_dead_letters (
	id				bigserial PRIMARY KEY,
	consumer_group	text NOT NULL,
	subscription	text NOT NULL,
	topic			text NOT NULL,
	kafka_partition integer NOT NULL,
	kafka_offset	bigint NOT NULL,
	key				text,
	event_id		uuid,
	state			text NOT NULL
		CONSTRAINT inbox_dead_letter_state
		CHECK (state OPERATOR(pg_catalog.=) ANY (ARRAY['dead', 'parked', 'replay'])),
	blocked_by		bigint,
	attempts		integer NOT NULL DEFAULT 0,
	last_error		text,
	last_sqlstate	text,
	first_failed_at timestamptz NOT NULL DEFAULT pg_catalog.now(),
	last_failed_at	timestamptz NOT NULL DEFAULT pg_catalog.now(),
	message			outbox.inbound_message NOT NULL,
	UNIQUE (consumer_group, topic, kafka_partition, kafka_offset)
);
/* a key can be longer than a btree entry: its hash is indexed */
CREATE INDEX inbox_dead_letters_key_idx ON outbox.inbox_dead_letters
	(consumer_group, topic, pg_catalog.hashtextextended(key, 0));
COMMENT ON TABLE outbox.inbox_dead_letters IS
	'Messages a subscription''s handler failed on (dead), those parked behind them, and those queued again (replay)';
SELECT pg_catalog.pg_extension_config_dump('outbox.inbox_dead_letters', '');
SELECT pg_catalog.pg_extension_config_dump('outbox.inbox_dead_letters_id_seq', '');

CREATE FUNCTION outbox.subscribe(
	name			text,
	topics			text[],
	handler			regprocedure,
	group_id		text DEFAULT NULL,
	start_from		text DEFAULT 'earliest',
	max_attempts	integer DEFAULT NULL,
	poison_policy	text DEFAULT 'block',
	batch_size		integer DEFAULT 500)
RETURNS void
LANGUAGE c VOLATILE
AS 'MODULE_PATHNAME', 'outbox_subscribe';
COMMENT ON FUNCTION outbox.subscribe(text, text[], regprocedure, text, text, integer, text, integer) IS
	'Starts a worker that applies topics to this database, calling handler(outbox.inbound_message) once per message as the caller';

CREATE FUNCTION outbox.unsubscribe(name text)
RETURNS boolean
LANGUAGE c VOLATILE STRICT
AS 'MODULE_PATHNAME', 'outbox_unsubscribe';
COMMENT ON FUNCTION outbox.unsubscribe(text) IS
	'Stops a subscription''s worker and removes it (its offsets and dead letters stay); false when there was none';

CREATE FUNCTION outbox_internal.subscriptions_changed()
RETURNS trigger
LANGUAGE c
AS 'MODULE_PATHNAME', 'outbox_subscriptions_changed';
REVOKE ALL ON FUNCTION outbox_internal.subscriptions_changed() FROM PUBLIC;
CREATE TRIGGER subscriptions_inserted AFTER INSERT ON outbox.subscriptions
	REFERENCING NEW TABLE AS changed
	FOR EACH STATEMENT EXECUTE FUNCTION outbox_internal.subscriptions_changed();
CREATE TRIGGER subscriptions_updated AFTER UPDATE ON outbox.subscriptions
	REFERENCING NEW TABLE AS changed
	FOR EACH STATEMENT EXECUTE FUNCTION outbox_internal.subscriptions_changed();
CREATE TRIGGER subscriptions_deleted AFTER DELETE ON outbox.subscriptions
	REFERENCING OLD TABLE AS changed
	FOR EACH STATEMENT EXECUTE FUNCTION outbox_internal.subscriptions_changed();

/*
 * inbox_replay(subscription, id): queue a dead message (or, with id NULL,
 * every dead message) of the subscription's consumer group for its workers
 * again, with the messages parked behind it.  Returns how many rows were
 * queued.
 */
CREATE FUNCTION outbox.inbox_replay(subscription text, id bigint DEFAULT NULL)
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
COMMENT ON FUNCTION outbox.inbox_replay(text, bigint) IS
	'Queues a dead message (all of the subscription''s when id is NULL) and those parked behind it for its handler again';

/*
 * inbox_discard(subscription, id): forget a dead message; the messages
 * parked behind it are applied, in order, unless discarded too.
 */
CREATE FUNCTION outbox.inbox_discard(subscription text, id bigint)
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
COMMENT ON FUNCTION outbox.inbox_discard(text, bigint) IS
	'Forgets a dead or parked message of a subscription; messages parked behind a discarded one are applied';

/* at commit, wake the subscription's worker (its replays, its parked keys) */
CREATE FUNCTION outbox_internal.inbox_wake(subscription text)
RETURNS void
LANGUAGE c VOLATILE STRICT
AS 'MODULE_PATHNAME', 'outbox_inbox_wake';
REVOKE ALL ON FUNCTION outbox_internal.inbox_wake(text) FROM PUBLIC;

/* what each subscription's worker is doing: read from shared memory */
CREATE FUNCTION outbox.subscription_status(
	OUT name			text,
	OUT state			text,
	OUT pid				integer,
	OUT started_at		timestamptz,
	OUT processed		bigint,
	OUT deduplicated	bigint,
	OUT failed			bigint,
	OUT dead_letters	bigint,
	OUT parked			bigint,
	OUT lag				bigint,
	OUT last_applied_at timestamptz,
	OUT last_error		text,
	OUT last_error_at	timestamptz)
RETURNS SETOF record
LANGUAGE c STABLE
AS 'MODULE_PATHNAME', 'outbox_subscription_status';
COMMENT ON FUNCTION outbox.subscription_status() IS
	'Each subscription of this database: its worker''s state, messages applied, deduplicated, failed and dead-lettered, lag and last error';

CREATE FUNCTION outbox.subscription_lag(
	OUT subscription	text,
	OUT topic			text,
	OUT kafka_partition integer,
	OUT next_offset		bigint,
	OUT high_watermark	bigint,
	OUT lag				bigint)
RETURNS SETOF record
LANGUAGE c STABLE
AS 'MODULE_PATHNAME', 'outbox_subscription_lag';
COMMENT ON FUNCTION outbox.subscription_lag() IS
	'Per subscription and assigned Kafka partition: the next offset to apply, the partition''s high watermark and the difference';

/*
 * Nobody subscribes until granted: a subscription reads Kafka with the
 * relay's credentials and runs code in the database's background.
 */
REVOKE ALL ON outbox.subscriptions FROM PUBLIC;
REVOKE ALL ON outbox.inbox_offsets FROM PUBLIC;
REVOKE ALL ON outbox.inbox_dead_letters FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox.subscribe(text, text[], regprocedure, text, text, integer, text, integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox.unsubscribe(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox.inbox_replay(text, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox.inbox_discard(text, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox.subscription_status() FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox.subscription_lag() FROM PUBLIC;

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
