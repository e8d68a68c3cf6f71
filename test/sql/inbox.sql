-- The inbox: consume_once() is true the first time a consumer sees an
-- event, false afterwards; inbox_cleanup() forgets what is past
-- outbox.inbox_retention.  Then a hostile role's attacks on both.
SELECT outbox.consume_once('billing', 'f0000000-0000-7000-8000-000000000001') AS first;
SELECT outbox.consume_once('billing', 'f0000000-0000-7000-8000-000000000001') AS again;
SELECT outbox.consume_once('shipping', 'f0000000-0000-7000-8000-000000000001') AS other_consumer;

-- a rolled-back consumer transaction consumed nothing
BEGIN;
SELECT outbox.consume_once('billing', 'f0000000-0000-7000-8000-000000000002') AS in_rolled_back;
ROLLBACK;
SELECT outbox.consume_once('billing', 'f0000000-0000-7000-8000-000000000002') AS after_rollback;

-- the consumer's business change and its dedupe commit together
CREATE TABLE shop.ledger (event_id uuid PRIMARY KEY, amount int);
DO $$
BEGIN
	IF outbox.consume_once('ledger', 'f0000000-0000-7000-8000-000000000003') THEN
		INSERT INTO shop.ledger VALUES ('f0000000-0000-7000-8000-000000000003', 10);
	END IF;
	IF outbox.consume_once('ledger', 'f0000000-0000-7000-8000-000000000003') THEN
		INSERT INTO shop.ledger VALUES ('f0000000-0000-7000-8000-000000000003', 10);
	END IF;
END
$$;
SELECT * FROM shop.ledger;

-- refused arguments
SELECT t.err($$SELECT outbox.consume_once(NULL, 'f0000000-0000-7000-8000-000000000001')$$);
SELECT t.err($$SELECT outbox.consume_once('billing', NULL)$$);
SELECT t.err($$SELECT outbox.consume_once('', 'f0000000-0000-7000-8000-000000000001')$$);
SELECT t.err($$SELECT outbox.consume_once(repeat('c', 201), 'f0000000-0000-7000-8000-000000000001')$$);
SELECT outbox.consume_once(repeat('c', 200), 'f0000000-0000-7000-8000-000000000001') AS longest_name;
SELECT t.err($$INSERT INTO outbox.inbox VALUES ('', 'f0000000-0000-7000-8000-000000000001', '2026-01-01 00:00:00+00')$$);
SELECT left(consumer, 10) AS consumer, char_length(consumer) AS length, event_id
  FROM outbox.inbox ORDER BY consumer COLLATE "C", event_id;

-- retention: rows older than outbox.inbox_retention go, oldest first
UPDATE outbox.inbox SET consumed_at = now() - interval '40 days' WHERE consumer = 'billing';
UPDATE outbox.inbox SET consumed_at = now() - interval '31 days' WHERE consumer = 'shipping';
SELECT outbox.inbox_cleanup(1) AS deleted_one;
SELECT consumer, event_id FROM outbox.inbox WHERE consumed_at < now() - interval '30 days'
 ORDER BY consumer COLLATE "C", event_id;
SELECT outbox.inbox_cleanup() AS deleted_rest;
-- the rows within the retention stay
SELECT left(consumer, 10) AS consumer FROM outbox.inbox ORDER BY consumer COLLATE "C";
SELECT t.err($$SELECT outbox.inbox_cleanup(0)$$);
SELECT t.err($$SELECT outbox.inbox_cleanup(NULL)$$);
-- the setting: a minute at least, changed by a reload
SHOW outbox.inbox_retention;
ALTER SYSTEM SET outbox.inbox_retention = '59s';
SELECT t.err($$SET outbox.inbox_retention = '1h'$$);

-- PUBLIC cannot consume; a role with USAGE but no EXECUTE neither
CREATE ROLE outbox_inbox_nobody;
CREATE ROLE outbox_inbox_consumer;
CREATE ROLE outbox_inbox_stranger;
GRANT USAGE ON SCHEMA outbox TO outbox_inbox_consumer, outbox_inbox_stranger;
GRANT EXECUTE ON FUNCTION outbox.consume_once(text, uuid) TO outbox_inbox_consumer;
SET ROLE outbox_inbox_nobody;
SELECT t.err($$SELECT outbox.consume_once('billing', gen_random_uuid())$$);
RESET ROLE;
SET ROLE outbox_inbox_stranger;
SELECT t.err($$SELECT outbox.consume_once('billing', gen_random_uuid())$$);
RESET ROLE;

-- a consumer consumes through the function only: the table is closed to it
SET ROLE outbox_inbox_consumer;
SELECT outbox.consume_once('mailer', 'f0000000-0000-7000-8000-000000000004') AS consumer_consumes;
SELECT t.err($$SELECT count(*) FROM outbox.inbox$$);
SELECT t.err($$INSERT INTO outbox.inbox (consumer, event_id) VALUES ('billing', gen_random_uuid())$$);
SELECT t.err($$DELETE FROM outbox.inbox$$);
SELECT t.err($$UPDATE outbox.inbox SET consumed_at = now()$$);
SELECT t.err($$SELECT outbox.inbox_cleanup()$$);
RESET ROLE;

-- its own schema first in search_path: functions and operators planted
-- there, which would make it a superuser, are never reached with the
-- owner's rights
CREATE SCHEMA trap AUTHORIZATION outbox_inbox_consumer;
SET ROLE outbox_inbox_consumer;
CREATE FUNCTION trap.promote() RETURNS void LANGUAGE plpgsql AS $$
BEGIN
	EXECUTE 'ALTER ROLE outbox_inbox_consumer SUPERUSER';
END
$$;
CREATE FUNCTION trap.char_length(text) RETURNS integer LANGUAGE plpgsql AS $$
BEGIN
	PERFORM trap.promote();
	RETURN 1;
END
$$;
CREATE FUNCTION trap.int_gt(integer, integer) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
	PERFORM trap.promote();
	RETURN false;
END
$$;
CREATE OPERATOR trap.> (LEFTARG = integer, RIGHTARG = integer, FUNCTION = trap.int_gt);
CREATE OPERATOR trap.= (LEFTARG = integer, RIGHTARG = integer, FUNCTION = trap.int_gt);
CREATE FUNCTION trap.text_eq(text, text) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
	PERFORM trap.promote();
	RETURN false;
END
$$;
CREATE OPERATOR trap.= (LEFTARG = text, RIGHTARG = text, FUNCTION = trap.text_eq);
SET search_path = trap, pg_catalog, public;
-- the caller's own query does reach them: the trap is armed
SELECT char_length('x');
SELECT outbox.consume_once('mailer', 'f0000000-0000-7000-8000-000000000005') AS trapped_first;
SELECT outbox.consume_once('mailer', 'f0000000-0000-7000-8000-000000000005') AS trapped_again;
RESET search_path;
RESET ROLE;
SELECT rolsuper AS consumer_became_superuser FROM pg_roles WHERE rolname = 'outbox_inbox_consumer';
SELECT consumer, event_id FROM outbox.inbox WHERE consumer = 'mailer' ORDER BY event_id;

DROP SCHEMA trap CASCADE;
DROP TABLE shop.ledger;
REVOKE ALL ON SCHEMA outbox FROM outbox_inbox_consumer, outbox_inbox_stranger;
REVOKE ALL ON FUNCTION outbox.consume_once(text, uuid) FROM outbox_inbox_consumer;
DROP ROLE outbox_inbox_nobody, outbox_inbox_consumer, outbox_inbox_stranger;
DELETE FROM outbox.inbox;
