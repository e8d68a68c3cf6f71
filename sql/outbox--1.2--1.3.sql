/* outbox--1.2--1.3.sql: from 1.2 to 1.3, the inbox.  Must leave a database equal to a fresh 1.3 install. */

\echo Use "ALTER EXTENSION outbox UPDATE TO '1.3'" to load this file. \quit

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
