/* outbox--1.4--1.5.sql: from 1.4 to 1.5, subscriptions: the consumer worker.  Must leave a database equal to a fresh 1.5 install. */

\echo Use "ALTER EXTENSION outbox UPDATE TO '1.5'" to load this file. \quit

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
 * of a group are those of consumer 'outbox:<group>', a name consume_once()
 * refuses (below), so no consume_once() caller can forge or share them.
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
	created_at		timestamptz NOT NULL DEFAULT pg_catalog.now()
);
COMMENT ON TABLE outbox.subscriptions IS
	'Kafka topics a background worker applies to this database through a handler; written by subscribe() and unsubscribe()';
COMMENT ON COLUMN outbox.subscriptions.handler IS
	'The function called once per message, as regprocedure text: it takes one outbox.inbound_message';
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

CREATE FUNCTION outbox.subscriptions_changed()
RETURNS trigger
LANGUAGE c
AS 'MODULE_PATHNAME', 'outbox_subscriptions_changed';
REVOKE ALL ON FUNCTION outbox.subscriptions_changed() FROM PUBLIC;
CREATE TRIGGER subscriptions_inserted AFTER INSERT ON outbox.subscriptions
	REFERENCING NEW TABLE AS changed
	FOR EACH STATEMENT EXECUTE FUNCTION outbox.subscriptions_changed();
CREATE TRIGGER subscriptions_updated AFTER UPDATE ON outbox.subscriptions
	REFERENCING NEW TABLE AS changed
	FOR EACH STATEMENT EXECUTE FUNCTION outbox.subscriptions_changed();
CREATE TRIGGER subscriptions_deleted AFTER DELETE ON outbox.subscriptions
	REFERENCING OLD TABLE AS changed
	FOR EACH STATEMENT EXECUTE FUNCTION outbox.subscriptions_changed();

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
	PERFORM outbox.inbox_wake(s.name) FROM outbox.subscriptions s
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
	PERFORM outbox.inbox_wake(s.name) FROM outbox.subscriptions s
	  WHERE s.group_id OPERATOR(pg_catalog.=) grp;
	RETURN true;
END
$$;
COMMENT ON FUNCTION outbox.inbox_discard(text, bigint) IS
	'Forgets a dead or parked message of a subscription; messages parked behind a discarded one are applied';

/* at commit, wake the subscription's worker (its replays, its parked keys) */
CREATE FUNCTION outbox.inbox_wake(subscription text)
RETURNS void
LANGUAGE c VOLATILE STRICT
AS 'MODULE_PATHNAME', 'outbox_inbox_wake';
REVOKE ALL ON FUNCTION outbox.inbox_wake(text) FROM PUBLIC;

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

/* consumer names starting with 'outbox:' belong to the subscriptions */
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
	IF pg_catalog.left(consume_once.consumer, 7) OPERATOR(pg_catalog.=) 'outbox:' THEN
		RAISE EXCEPTION 'consumer names starting with "outbox:" belong to subscriptions'
			USING ERRCODE = 'invalid_parameter_value';
	END IF;
	INSERT INTO outbox.inbox (consumer, event_id)
	VALUES (consume_once.consumer, consume_once.event_id)
	ON CONFLICT DO NOTHING;
	RETURN FOUND;
END
$$;
