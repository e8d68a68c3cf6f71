/* outbox--1.0.sql: the event log, emit(), capture() and the relay's progress */

\echo Use "CREATE EXTENSION outbox" to load this file. \quit

/*
 * The log.  Rows are never updated; delivery state lives in
 * outbox.relay_progress.  Every index is paid by every emit: id (paging),
 * event_id (identity), txid (the relay's snapshot batches).
 */
CREATE TABLE outbox.events (
	id				bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	txid			pg_catalog.xid8 NOT NULL DEFAULT pg_catalog.pg_current_xact_id(),
	event_id		uuid NOT NULL UNIQUE,
	aggregate_type	text NOT NULL,
	aggregate_id	text NOT NULL,
	seq				bigint,
	event_type		text NOT NULL,
	schema_version	integer NOT NULL DEFAULT 1,
	topic			text NOT NULL,
	key				text NOT NULL,
	payload			jsonb NOT NULL,
	headers			jsonb,
	tenant			text,
	traceparent		text,
	occurred_at		timestamptz NOT NULL,
	created_at		timestamptz NOT NULL DEFAULT pg_catalog.clock_timestamp()
);
CREATE INDEX events_txid_idx ON outbox.events (txid);

COMMENT ON TABLE outbox.events IS
	'Append-only event log: one row per emitted event, published to Kafka after commit';
COMMENT ON COLUMN outbox.events.id IS 'insertion order; for one aggregate also commit order';
COMMENT ON COLUMN outbox.events.txid IS 'top-level transaction that emitted the event';
COMMENT ON COLUMN outbox.events.event_id IS 'stable identity (UUIDv7 unless given); consumers dedupe on it';
COMMENT ON COLUMN outbox.events.seq IS 'gapless per-aggregate number in commit order (NULL when outbox.aggregate_sequence is off)';
COMMENT ON COLUMN outbox.events.topic IS 'Kafka topic, resolved at emit';
COMMENT ON COLUMN outbox.events.key IS 'Kafka message key (default aggregate_id)';

/* Per-aggregate counters behind seq; the row lock orders emitters. */
CREATE TABLE outbox.aggregates (
	aggregate_type	text NOT NULL,
	aggregate_id	text NOT NULL,
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
	updated_at		timestamptz NOT NULL DEFAULT pg_catalog.now()
);
COMMENT ON TABLE outbox.relay_progress IS
	'Delivery progress of each relay, written once per acknowledged page';
INSERT INTO outbox.relay_progress (relay) VALUES ('default');

SELECT pg_catalog.pg_extension_config_dump('outbox.events', '');
SELECT pg_catalog.pg_extension_config_dump('outbox.events_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('outbox.aggregates', '');
SELECT pg_catalog.pg_extension_config_dump('outbox.relay_progress', '');

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
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER;
COMMENT ON FUNCTION outbox.emit(text, text, text, jsonb, jsonb, text, text, uuid, integer, timestamptz) IS
	'Records an event in the current transaction; the relay publishes it to Kafka after commit';

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
REVOKE ALL ON FUNCTION outbox.capture() FROM PUBLIC;

CREATE FUNCTION outbox.relay_status(
	OUT state			text,
	OUT pid				integer,
	OUT published		bigint,
	OUT pages			bigint,
	OUT delivery_errors	bigint,
	OUT last_delivery	timestamptz,
	OUT last_error		text,
	OUT last_error_at	timestamptz)
RETURNS record
AS 'MODULE_PATHNAME', 'outbox_relay_status'
LANGUAGE C VOLATILE STRICT;
COMMENT ON FUNCTION outbox.relay_status() IS
	'State and counters of this database''s relay, from shared memory (needs shared_preload_libraries)';
REVOKE ALL ON FUNCTION outbox.relay_status() FROM PUBLIC;
