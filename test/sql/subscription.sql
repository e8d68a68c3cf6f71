-- Subscriptions: what subscribe() refuses, with its SQLSTATE; who may
-- subscribe, unsubscribe and look; what a hostile role cannot reach.
-- (The worker itself is tested by test/t/015_subscription.pl.)
CREATE ROLE outbox_sub_app;
CREATE ROLE outbox_sub_other;
CREATE ROLE outbox_sub_nobody;
CREATE SCHEMA subs;
GRANT USAGE ON SCHEMA outbox, subs TO outbox_sub_app, outbox_sub_other, outbox_sub_nobody;
GRANT EXECUTE ON FUNCTION outbox.subscribe(text, text[], regprocedure, text, text, integer, text, integer),
	outbox.unsubscribe(text), outbox.unsubscribe(text, boolean), outbox.subscription_status(),
	outbox.subscription_seek(text, text, integer, bigint) TO outbox_sub_app, outbox_sub_other;
CREATE FUNCTION subs.apply(m outbox.inbound_message) RETURNS void LANGUAGE sql AS $$ SELECT $$;
CREATE FUNCTION subs.secret(m outbox.inbound_message) RETURNS void LANGUAGE sql AS $$ SELECT $$;
REVOKE ALL ON FUNCTION subs.secret(outbox.inbound_message) FROM PUBLIC;
CREATE FUNCTION subs.wrong(m text) RETURNS void LANGUAGE sql AS $$ SELECT $$;
CREATE FUNCTION subs.many(m outbox.inbound_message) RETURNS SETOF int LANGUAGE sql AS $$ SELECT 1 $$;
CREATE PROCEDURE subs.proc(m outbox.inbound_message) LANGUAGE sql AS $$ SELECT $$;

-- refused arguments
SET ROLE outbox_sub_app;
SELECT t.err($$SELECT outbox.subscribe(NULL, ARRAY['t'], 'subs.apply(outbox.inbound_message)')$$);
SELECT t.err($$SELECT outbox.subscribe('s', NULL, 'subs.apply(outbox.inbound_message)')$$);
SELECT t.err($$SELECT outbox.subscribe('s', ARRAY['t'], NULL)$$);
SELECT t.err($$SELECT outbox.subscribe('Bad Name', ARRAY['t'], 'subs.apply(outbox.inbound_message)')$$);
SELECT t.err($$SELECT outbox.subscribe(repeat('s', 64), ARRAY['t'], 'subs.apply(outbox.inbound_message)')$$);
SELECT t.err($$SELECT outbox.subscribe('-s', ARRAY['t'], 'subs.apply(outbox.inbound_message)')$$);
SELECT t.err($$SELECT outbox.subscribe('s', ARRAY[]::text[], 'subs.apply(outbox.inbound_message)')$$);
SELECT t.err($$SELECT outbox.subscribe('s', ARRAY['t', NULL], 'subs.apply(outbox.inbound_message)')$$);
SELECT t.err($$SELECT outbox.subscribe('s', ARRAY['a b'], 'subs.apply(outbox.inbound_message)')$$);
SELECT t.err($$SELECT outbox.subscribe('s', ARRAY['..'], 'subs.apply(outbox.inbound_message)')$$);
SELECT t.err($$SELECT outbox.subscribe('s', ARRAY['^orders.*'], 'subs.apply(outbox.inbound_message)')$$);
SELECT t.err($$SELECT outbox.subscribe('s', ARRAY['t', 't'], 'subs.apply(outbox.inbound_message)')$$);
SELECT t.err($$SELECT outbox.subscribe('s', ARRAY[repeat('t', 250)], 'subs.apply(outbox.inbound_message)')$$);
SELECT t.err($$SELECT outbox.subscribe('s', ARRAY['t'], 'subs.wrong(text)')$$);
SELECT t.err($$SELECT outbox.subscribe('s', ARRAY['t'], 'subs.many(outbox.inbound_message)')$$);
SELECT t.err($$SELECT outbox.subscribe('s', ARRAY['t'], 'subs.proc(outbox.inbound_message)')$$);
SELECT t.err($$SELECT outbox.subscribe('s', ARRAY['t'], 'subs.apply(outbox.inbound_message)', start_from => 'middle')$$);
SELECT t.err($$SELECT outbox.subscribe('s', ARRAY['t'], 'subs.apply(outbox.inbound_message)', max_attempts => 0)$$);
SELECT t.err($$SELECT outbox.subscribe('s', ARRAY['t'], 'subs.apply(outbox.inbound_message)', poison_policy => 'drop')$$);
SELECT t.err($$SELECT outbox.subscribe('s', ARRAY['t'], 'subs.apply(outbox.inbound_message)', batch_size => 0)$$);
SELECT t.err($$SELECT outbox.subscribe('s', ARRAY['t'], 'subs.apply(outbox.inbound_message)', group_id => '')$$);
SELECT t.err($$SELECT outbox.subscribe('s', ARRAY['t'], 'subs.apply(outbox.inbound_message)', group_id => repeat('g', 194))$$);
-- the handler runs as the subscriber, who must be allowed to run it
SELECT t.err($$SELECT outbox.subscribe('s', ARRAY['t'], 'subs.secret(outbox.inbound_message)')$$);

-- a subscription, recorded with its owner and its handler's full name
SELECT outbox.subscribe('s', ARRAY['orders', 'refunds'], 'subs.apply(outbox.inbound_message)', batch_size => 50);
SELECT t.err($$SELECT outbox.subscribe('s', ARRAY['t'], 'subs.apply(outbox.inbound_message)')$$);
-- subscription_seek(): what it refuses; the owner sets a partition's next offset
SELECT t.err($$SELECT outbox.subscription_seek(NULL, 'orders', 0, 0)$$);
SELECT t.err($$SELECT outbox.subscription_seek('s', NULL, 0, 0)$$);
SELECT t.err($$SELECT outbox.subscription_seek('s', 'orders', NULL, 0)$$);
SELECT t.err($$SELECT outbox.subscription_seek('s', 'orders', 0, NULL)$$);
SELECT t.err($$SELECT outbox.subscription_seek('nope', 'orders', 0, 0)$$);
SELECT t.err($$SELECT outbox.subscription_seek('s', 'payments', 0, 0)$$);
SELECT t.err($$SELECT outbox.subscription_seek('s', 'orders', -1, 0)$$);
SELECT t.err($$SELECT outbox.subscription_seek('s', 'orders', 0, -1)$$);
SELECT outbox.subscription_seek('s', 'orders', 2, 0);
SELECT outbox.subscription_seek('s', 'refunds', 0, 7);
SELECT outbox.subscription_seek('s', 'refunds', 0, 3);
RESET ROLE;
-- the offsets are the group's: moving them takes the rights of every owner in it
SELECT outbox.subscribe('su', ARRAY['orders'], 'subs.apply(outbox.inbound_message)', group_id => 's');
SET ROLE outbox_sub_app;
SELECT t.err($$SELECT outbox.subscription_seek('s', 'orders', 1, 0)$$);
RESET ROLE;
SELECT outbox.subscription_seek('su', 'orders', 1, 5);
SELECT outbox.unsubscribe('su');
SELECT consumer_group, topic, kafka_partition, next_offset FROM outbox.inbox_offsets ORDER BY 1, 2, 3;
SELECT name, topics, handler, owner, group_id, start_from, max_attempts, poison_policy, batch_size
  FROM outbox.subscriptions;

-- a hostile role: no right on the tables, cannot take another's subscription
SET ROLE outbox_sub_other;
SELECT t.err($$SELECT outbox.unsubscribe('s')$$);
SELECT t.err($$SELECT outbox.subscription_seek('s', 'orders', 0, 0)$$);
SELECT t.err($$UPDATE outbox.subscriptions SET owner = 'outbox_sub_other' WHERE name = 's'$$);
SELECT t.err($$INSERT INTO outbox.subscriptions (name, topics, handler, owner, group_id) VALUES ('x', ARRAY['t'], 'subs.secret(outbox.inbound_message)', 'postgres', 'x')$$);
SELECT t.err($$SELECT * FROM outbox.inbox_offsets$$);
SELECT t.err($$SELECT * FROM outbox.inbox_dead_letters$$);
SELECT t.err($$SELECT outbox.inbox_replay('s')$$);
SELECT t.err($$SELECT outbox.inbox_discard('s', 1)$$);
SELECT t.err($$SELECT outbox_internal.subscriptions_changed()$$);
SELECT t.err($$SELECT outbox_internal.inbox_wake('s')$$);
SELECT t.err($$SELECT * FROM outbox.subscription_lag()$$);
-- another role's group is not for joining: its members share offsets and dedupe
SELECT t.err($$SELECT outbox.subscribe('s2', ARRAY['orders'], 'subs.apply(outbox.inbound_message)', group_id => 's')$$);
SELECT outbox.subscribe('s2', ARRAY['orders'], 'subs.apply(outbox.inbound_message)');
SELECT name, state, pid, processed FROM outbox.subscription_status() ORDER BY name;
RESET ROLE;
SET ROLE outbox_sub_nobody;
SELECT t.err($$SELECT outbox.subscribe('n', ARRAY['t'], 'subs.apply(outbox.inbound_message)')$$);
SELECT t.err($$SELECT outbox.subscription_seek('s', 'orders', 0, 0)$$);
SELECT t.err($$SELECT * FROM outbox.subscription_status()$$);
RESET ROLE;

-- a subscription's change cannot be prepared: COMMIT PREPARED would not start its worker
BEGIN;
SELECT outbox.subscribe('p', ARRAY['orders'], 'subs.apply(outbox.inbound_message)');
PREPARE TRANSACTION 'outbox_sub';
SELECT count(*) FROM outbox.subscription_status() WHERE name = 'p';
RESET ROLE;
-- consume_once() cannot write a subscription's dedupe rows
GRANT EXECUTE ON FUNCTION outbox.consume_once(text, uuid) TO outbox_sub_other;
SET ROLE outbox_sub_other;
SELECT t.err($$SELECT outbox.consume_once('outbox:s', 'f0000000-0000-7000-8000-000000000001')$$);
SELECT t.err($$SELECT outbox.consume_once('outbox;s', 'f0000000-0000-7000-8000-000000000001')$$);
SELECT outbox.consume_once('outbox-s', 'f0000000-0000-7000-8000-000000000001') AS other_names_work;
RESET ROLE;

-- a subscription records its handler's owner
SELECT name, handler, handler_owner FROM outbox.subscriptions ORDER BY name;
-- a handler of the subscriber's own cannot be dropped while subscribed
-- (CREATE OR REPLACE is the way to deploy it); another role's
-- subscription of it does not pin it
GRANT CREATE ON SCHEMA subs TO outbox_sub_app;
SET ROLE outbox_sub_app;
CREATE FUNCTION subs.own(m outbox.inbound_message) RETURNS void LANGUAGE sql AS $$ SELECT $$;
SELECT outbox.subscribe('own', ARRAY['t'], 'subs.own(outbox.inbound_message)');
RESET ROLE;
SET ROLE outbox_sub_other;
SELECT outbox.subscribe('pin', ARRAY['t'], 'subs.own(outbox.inbound_message)');
RESET ROLE;
SET ROLE outbox_sub_app;
SELECT t.err($$DROP FUNCTION subs.own(outbox.inbound_message)$$);
CREATE OR REPLACE FUNCTION subs.own(m outbox.inbound_message) RETURNS void LANGUAGE sql AS $$ SELECT 1 $$;
SELECT outbox.unsubscribe('own');
DROP FUNCTION subs.own(outbox.inbound_message);
RESET ROLE;
SELECT outbox.unsubscribe('pin', purge => true);

-- the owner unsubscribes; a second time there is nothing to remove
SET ROLE outbox_sub_app;
SELECT outbox.unsubscribe('s');
SELECT outbox.unsubscribe('s');
RESET ROLE;
SELECT name, owner FROM outbox.subscriptions;
-- the group outlives its subscriptions: still not for another role to take
SELECT group_id, owner FROM outbox.inbox_groups ORDER BY group_id;
SET ROLE outbox_sub_other;
SELECT t.err($$SELECT outbox.subscribe('s4', ARRAY['orders'], 'subs.apply(outbox.inbound_message)', group_id => 's')$$);
RESET ROLE;
-- the owner joins its own group
SET ROLE outbox_sub_other;
SELECT outbox.subscribe('s3', ARRAY['orders'], 'subs.apply(outbox.inbound_message)', group_id => 's2');
SELECT name, owner, group_id FROM outbox.subscriptions ORDER BY name;
-- purging a group another subscription still uses is refused
SELECT t.err($$SELECT outbox.unsubscribe('s3', purge => true)$$);
SELECT outbox.unsubscribe('s3');
RESET ROLE;
-- the first owner purges its group: its state goes, and its name is free
INSERT INTO outbox.inbox_offsets (consumer_group, topic, kafka_partition, next_offset) VALUES ('s', 'orders', 0, 7);
INSERT INTO outbox.inbox (consumer, event_id) VALUES ('outbox;s', 'f0000000-0000-7000-8000-000000000002');
SET ROLE outbox_sub_app;
SELECT outbox.subscribe('s', ARRAY['orders'], 'subs.apply(outbox.inbound_message)');
SELECT outbox.unsubscribe('s', purge => true);
RESET ROLE;
SELECT (SELECT count(*) FROM outbox.inbox_offsets WHERE consumer_group = 's') AS offsets,
	   (SELECT count(*) FROM outbox.inbox WHERE consumer = 'outbox;s') AS dedupe,
	   (SELECT count(*) FROM outbox.inbox_groups WHERE group_id = 's') AS groups;
SET ROLE outbox_sub_other;
SELECT outbox.subscribe('s4', ARRAY['orders'], 'subs.apply(outbox.inbound_message)', group_id => 's');
SELECT outbox.unsubscribe('s4', purge => true);
RESET ROLE;
SELECT t.err($$SELECT outbox.inbox_replay('s2', 42)$$);
SELECT outbox.inbox_replay('s2');
SELECT outbox.inbox_discard('s2', 42);
-- a superuser may unsubscribe anyone's
SELECT outbox.unsubscribe('s2');

DROP SCHEMA subs CASCADE;
DROP OWNED BY outbox_sub_app, outbox_sub_other, outbox_sub_nobody;
DROP ROLE outbox_sub_app, outbox_sub_other, outbox_sub_nobody;
