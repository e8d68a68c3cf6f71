-- replay(), discard() and cleanup() as SQL: what they queue, what they
-- refuse.  The relay's side (publishing the queue) is in the TAP drills;
-- here a quarantine is staged by hand, as the relay would record it.
CREATE FUNCTION t.quarantine(ev uuid, st text, behind uuid DEFAULT NULL) RETURNS void
LANGUAGE sql AS $$
	INSERT INTO outbox.dead_letters (event_id, event_pk, aggregate_type, aggregate_id, seq,
		event_type, topic, state, blocked_by, error_class, last_error, attempts, envelope)
	SELECT e.event_id, e.id, e.aggregate_type, e.aggregate_id, e.seq, e.event_type, e.topic,
		   st, behind, CASE WHEN st = 'quarantined' THEN 'permanent' END,
		   CASE WHEN st = 'quarantined' THEN 'MSG_SIZE_TOO_LARGE' END,
		   CASE WHEN st = 'quarantined' THEN 5 ELSE 0 END, to_jsonb(e)
	  FROM outbox.events e WHERE e.event_id = ev;
$$;

SELECT outbox.emit('parcel', 'p1', 'parcel.sent', '{}', event_id => '00000000-0000-7000-8000-0000000000a1');
SELECT outbox.emit('parcel', 'p1', 'parcel.lost', '{}', event_id => '00000000-0000-7000-8000-0000000000a2');
SELECT outbox.emit('parcel', 'p1', 'parcel.found', '{}', event_id => '00000000-0000-7000-8000-0000000000a3');
SELECT outbox.emit('parcel', 'p2', 'parcel.sent', '{}', event_id => '00000000-0000-7000-8000-0000000000b1');
SELECT outbox.emit('parcel', 'p2', 'parcel.lost', '{}', event_id => '00000000-0000-7000-8000-0000000000b2');
SELECT t.quarantine('00000000-0000-7000-8000-0000000000a1', 'quarantined');
SELECT t.quarantine('00000000-0000-7000-8000-0000000000a2', 'parked', '00000000-0000-7000-8000-0000000000a1');
SELECT t.quarantine('00000000-0000-7000-8000-0000000000a3', 'parked', '00000000-0000-7000-8000-0000000000a1');
SELECT t.quarantine('00000000-0000-7000-8000-0000000000b1', 'quarantined');
SELECT t.quarantine('00000000-0000-7000-8000-0000000000b2', 'parked', '00000000-0000-7000-8000-0000000000b1');

-- replay queues the quarantined event, then its parked successors, in order
SELECT * FROM outbox.replay('00000000-0000-7000-8000-0000000000a1');
SELECT e.event_id, q.dead_letter FROM outbox.replay_queue q JOIN outbox.events e ON e.id = q.event_pk
 ORDER BY q.position;
SELECT event_id, state FROM outbox.dead_letters ORDER BY event_pk;

-- replaying again, or a parked event, or an unknown one, is refused
SELECT t.err($$SELECT * FROM outbox.replay('00000000-0000-7000-8000-0000000000a1')$$);
SELECT t.err($$SELECT * FROM outbox.replay('00000000-0000-7000-8000-0000000000b2')$$);
SELECT t.err($$SELECT * FROM outbox.replay('00000000-0000-7000-8000-00000000ffff')$$);
SELECT t.err($$SELECT * FROM outbox.replay(NULL::uuid)$$);
-- a delivered-or-pending event that was never quarantined
SELECT t.err($$SELECT * FROM outbox.replay('0190a6f2-0000-7000-8000-000000000001')$$);

-- discard drops the quarantined event and releases what waits behind it
SELECT * FROM outbox.discard('00000000-0000-7000-8000-0000000000b1');
SELECT event_id, state, resolved_at IS NOT NULL AS resolved FROM outbox.dead_letters
 WHERE aggregate_id = 'p2' ORDER BY event_pk;
SELECT t.err($$SELECT * FROM outbox.discard('00000000-0000-7000-8000-0000000000b1')$$);
SELECT t.err($$SELECT * FROM outbox.discard('00000000-0000-7000-8000-00000000ffff')$$);

-- an event left parked behind a head already replayed or discarded (as a
-- relay of 1.0 could record it) is released by the next replay or discard
SELECT outbox.emit('crate', 'k1', 'crate.packed', '{}', event_id => '00000000-0000-7000-8000-0000000000c1');
SELECT outbox.emit('crate', 'k1', 'crate.shipped', '{}', event_id => '00000000-0000-7000-8000-0000000000c2');
SELECT outbox.emit('crate', 'k2', 'crate.packed', '{}', event_id => '00000000-0000-7000-8000-0000000000d1');
SELECT outbox.emit('crate', 'k2', 'crate.shipped', '{}', event_id => '00000000-0000-7000-8000-0000000000d2');
SELECT outbox.emit('crate', 'k3', 'crate.packed', '{}', event_id => '00000000-0000-7000-8000-0000000000e1');
SELECT outbox.emit('crate', 'k4', 'crate.packed', '{}', event_id => '00000000-0000-7000-8000-0000000000f1');
SELECT outbox.emit('crate', 'k4', 'crate.shipped', '{}', event_id => '00000000-0000-7000-8000-0000000000f2');
SELECT t.quarantine('00000000-0000-7000-8000-0000000000c1', 'quarantined');
SELECT t.quarantine('00000000-0000-7000-8000-0000000000c2', 'parked', '00000000-0000-7000-8000-0000000000c1');
SELECT t.quarantine('00000000-0000-7000-8000-0000000000d1', 'quarantined');
SELECT t.quarantine('00000000-0000-7000-8000-0000000000d2', 'parked', '00000000-0000-7000-8000-0000000000d1');
SELECT t.quarantine('00000000-0000-7000-8000-0000000000e1', 'quarantined');
UPDATE outbox.dead_letters SET state = 'replayed' WHERE event_id = '00000000-0000-7000-8000-0000000000c1';
SELECT * FROM outbox.replay('00000000-0000-7000-8000-0000000000d1');
SELECT t.quarantine('00000000-0000-7000-8000-0000000000f1', 'quarantined');
SELECT t.quarantine('00000000-0000-7000-8000-0000000000f2', 'parked', '00000000-0000-7000-8000-0000000000f1');
UPDATE outbox.dead_letters SET state = 'discarded' WHERE event_id = '00000000-0000-7000-8000-0000000000f1';
SELECT * FROM outbox.discard('00000000-0000-7000-8000-0000000000e1');
SELECT event_id, state FROM outbox.dead_letters WHERE aggregate_type = 'crate' ORDER BY event_pk;
SELECT e.event_id FROM outbox.replay_queue q JOIN outbox.events e ON e.id = q.event_pk
 WHERE e.aggregate_type = 'crate' ORDER BY q.position;

-- replay of a window: only events the relay delivered, none here yet
SELECT outbox.replay(now() - interval '1 hour', now() + interval '1 hour') AS queued_nothing_delivered;
-- pretend everything so far was delivered
UPDATE outbox.relay_progress SET prev_snapshot = pg_current_snapshot();
SELECT outbox.replay(now() - interval '1 hour', now() + interval '1 hour', 'cart') AS queued_carts;
SELECT t.err($$SELECT outbox.replay(now(), now() - interval '1 second')$$);
SELECT t.err($$SELECT outbox.replay(NULL::timestamptz, now())$$);

-- cleanup: nothing is older than the retention; dry run changes nothing
SELECT events, deleted FROM outbox.cleanup();
SELECT t.err($$SELECT outbox.cleanup(true, 0)$$);
-- age some events past the 7-day retention (a test fixture: the relay never
-- updates event rows)
UPDATE outbox.events SET created_at = now() - interval '8 days'
 WHERE aggregate_type IN ('cart', 'parcel', 'invoice');
-- delivered carts and invoices would go; quarantined, parked and queued parcels stay
SELECT events, deleted FROM outbox.cleanup();
SELECT events, deleted FROM outbox.cleanup(true);
SELECT events, deleted FROM outbox.cleanup(false, 2);
SELECT events, deleted FROM outbox.cleanup(false);
SELECT events, deleted FROM outbox.cleanup(false);
SELECT aggregate_type, count(*) FROM outbox.events
 WHERE created_at < now() - interval '7 days' GROUP BY 1 ORDER BY 1;
-- an event emitted after the delivered snapshot is undelivered: never deleted
SELECT outbox.emit('cart', 'c9', 'cart.opened', '{}') IS NOT NULL AS emitted;
UPDATE outbox.events SET created_at = now() - interval '8 days' WHERE aggregate_id = 'c9';
SELECT events FROM outbox.cleanup(false);
SELECT count(*) AS undelivered_kept FROM outbox.events WHERE aggregate_id = 'c9';

-- the predicates replay(since, until) and cleanup() share are SQL functions
-- the planner inlines into their queries: no function scan, so cleanup's
-- batch stays an index walk with a LIMIT
CREATE FUNCTION t.plan_has(q text, node text) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
	line text;
BEGIN
	FOR line IN EXECUTE 'EXPLAIN (COSTS OFF) ' || q LOOP
		IF line LIKE '%' || node || '%' THEN
			RETURN true;
		END IF;
	END LOOP;
	RETURN false;
END
$$;
SELECT t.plan_has($$SELECT e.id FROM outbox_internal.removable_events(now()) e ORDER BY e.id LIMIT 10$$,
				  'Function Scan') AS removable_not_inlined,
	   t.plan_has($$SELECT e.id FROM outbox_internal.delivered_events() e$$,
				  'Function Scan') AS delivered_not_inlined;

-- outbox.retention and its default live in the library only: in a session
-- that has not loaded it, cleanup() loads it to read the setting (the aged
-- c9, delivered now, is past it)
UPDATE outbox.relay_progress SET prev_snapshot = pg_current_snapshot();
\c
SELECT count(*) AS retention_defined FROM pg_settings WHERE name = 'outbox.retention';
SELECT events, deleted FROM outbox.cleanup();
SELECT setting AS retention FROM pg_settings WHERE name = 'outbox.retention';
