/* outbox--1.7--1.8.sql: from 1.7 to 1.8.  Must leave a database equal to a fresh 1.8 install. */

\echo Use "ALTER EXTENSION outbox UPDATE TO '1.8'" to load this file. \quit

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
