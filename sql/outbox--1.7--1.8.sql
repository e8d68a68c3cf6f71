/* outbox--1.7--1.8.sql: from 1.7 to 1.8.  Must leave a database equal to a fresh 1.8 install. */

\echo Use "ALTER EXTENSION outbox UPDATE TO '1.8'" to load this file. \quit

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
