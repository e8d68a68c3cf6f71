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
 * The view outbox.status adds the held partitions, read as its owner: a
 * role with SELECT on it and EXECUTE on status() sees them without any
 * right on the table.  Replacing a view keeps its grants; the function
 * status() is left alone, so the grants given on it stay too.
 */
CREATE OR REPLACE VIEW outbox.status AS
SELECT s.*,
	   COALESCE(h.held_events, 0) AS held_events,
	   h.holds
  FROM outbox.status() s
 CROSS JOIN (SELECT pg_catalog.sum(g.events)::bigint AS held_events,
					pg_catalog.jsonb_agg(pg_catalog.jsonb_build_object(
						'topic', g.topic, 'partition', g.kafka_partition,
						'events', g.events, 'since', g.since)
						ORDER BY g.since, g.topic, g.kafka_partition) AS holds
			   FROM (SELECT hp.topic, hp.kafka_partition, pg_catalog.count(*) AS events,
							pg_catalog.min(hp.held_at) AS since
					   FROM outbox.held hp
					  GROUP BY hp.topic, hp.kafka_partition) g) h;
COMMENT ON VIEW outbox.status IS
	'outbox.status() as a view, with the partitions whose events are held';
