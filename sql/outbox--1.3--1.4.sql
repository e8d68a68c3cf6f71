/* outbox--1.3--1.4.sql: from 1.3 to 1.4, held partitions.  Must leave a database equal to a fresh 1.4 install. */

\echo Use "ALTER EXTENSION outbox UPDATE TO '1.4'" to load this file. \quit

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

/* held events are not delivered: cleanup and replay(since, until) skip them */
CREATE OR REPLACE FUNCTION outbox.delivered_events()
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
COMMENT ON FUNCTION outbox.delivered_events() IS
	'Internal: the events the relay has delivered that no quarantined, parked or replaying dead letter and no hold keeps';

/*
 * status() gains held_events and holds.  A function's result type cannot
 * change in place, so it is made again; the grants a site gave on it and on
 * its view (a monitoring role's EXECUTE, SELECT) are carried over.
 */
CREATE TEMPORARY TABLE outbox_status_grants AS
SELECT 'FUNCTION' AS kind, a.grantee, a.privilege_type
  FROM pg_catalog.pg_proc p, pg_catalog.aclexplode(p.proacl) a
 WHERE p.oid OPERATOR(pg_catalog.=) 'outbox.status()'::pg_catalog.regprocedure
   AND a.grantee OPERATOR(pg_catalog.<>) p.proowner
UNION ALL
SELECT 'TABLE', a.grantee, a.privilege_type
  FROM pg_catalog.pg_class c, pg_catalog.aclexplode(c.relacl) a
 WHERE c.oid OPERATOR(pg_catalog.=) 'outbox.status'::pg_catalog.regclass
   AND a.grantee OPERATOR(pg_catalog.<>) c.relowner;

DROP VIEW outbox.status;
DROP FUNCTION outbox.status();
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
	OUT started_at				timestamptz,
	OUT held_events				bigint,
	OUT holds					jsonb)
RETURNS record
AS 'MODULE_PATHNAME', 'outbox_status'
LANGUAGE C VOLATILE STRICT SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION outbox.status() IS
	'State, backlog, age, throughput, errors, publish latency and held partitions of this database''s relay';

CREATE VIEW outbox.status AS SELECT * FROM outbox.status();
COMMENT ON VIEW outbox.status IS 'outbox.status() as a view';
REVOKE ALL ON FUNCTION outbox.status() FROM PUBLIC;
REVOKE ALL ON outbox.status FROM PUBLIC;

DO $$
DECLARE
	g record;
BEGIN
	FOR g IN SELECT * FROM outbox_status_grants LOOP
		EXECUTE pg_catalog.format('GRANT %s ON %s outbox.status%s TO %s',
								  g.privilege_type, g.kind,
								  CASE g.kind WHEN 'FUNCTION' THEN '()' ELSE '' END,
								  CASE g.grantee WHEN 0 THEN 'PUBLIC'
								  ELSE g.grantee::pg_catalog.regrole::text END);
	END LOOP;
END
$$;
DROP TABLE outbox_status_grants;
