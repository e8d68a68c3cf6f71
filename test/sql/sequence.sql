-- outbox.aggregate_sequence: many events of one aggregate in one
-- transaction.  The transaction's first emit of an aggregate locks its
-- counter row; later ones number from memory and the row is written once
-- before commit.  Every number stays gapless and rollback-proof.

CREATE FUNCTION t.seqs(agg text) RETURNS TABLE (events bigint, gapless boolean, last_seq bigint)
LANGUAGE sql AS $$
	SELECT count(*),
		   coalesce(bool_and(seq = n), true),
		   (SELECT a.last_seq FROM outbox.aggregates a
			 WHERE a.aggregate_type = 'seqtest' AND a.aggregate_id = agg)
	  FROM (SELECT seq, row_number() OVER (ORDER BY id) AS n
			  FROM outbox.events
			 WHERE aggregate_type = 'seqtest' AND aggregate_id = agg) s
$$;

-- a run of emits in one transaction: 1..n in id order, the row says n
BEGIN;
SELECT count(outbox.emit('seqtest', 'a', 'e', '{}')) FROM generate_series(1, 5000);
SELECT count(outbox.emit('seqtest', 'b', 'e', '{}')) FROM generate_series(1, 3);
COMMIT;
SELECT * FROM t.seqs('a');
SELECT * FROM t.seqs('b');
-- the next transaction goes on from there
SELECT count(outbox.emit('seqtest', 'a', 'e', '{}')) FROM generate_series(1, 2);
SELECT * FROM t.seqs('a');

-- a savepoint rolled back in the middle of a run gives its numbers back
BEGIN;
SELECT count(outbox.emit('seqtest', 'c', 'e', '{}')) FROM generate_series(1, 3);
SAVEPOINT s1;
SELECT count(outbox.emit('seqtest', 'c', 'e', '{}')) FROM generate_series(1, 4);
SAVEPOINT s2;
SELECT count(outbox.emit('seqtest', 'c', 'e', '{}')) FROM generate_series(1, 5);
RELEASE SAVEPOINT s2;
ROLLBACK TO SAVEPOINT s1;
SELECT count(outbox.emit('seqtest', 'c', 'e', '{}')) FROM generate_series(1, 2);
COMMIT;
SELECT * FROM t.seqs('c');

-- an aggregate first emitted inside a rolled-back savepoint: its row and
-- its lock went with it, the next emit upserts again
BEGIN;
SAVEPOINT s1;
SELECT count(outbox.emit('seqtest', 'd', 'e', '{}')) FROM generate_series(1, 4);
ROLLBACK TO SAVEPOINT s1;
SELECT count(*) AS counter_rows FROM outbox.aggregates
 WHERE aggregate_type = 'seqtest' AND aggregate_id = 'd';
SELECT count(outbox.emit('seqtest', 'd', 'e', '{}')) FROM generate_series(1, 2);
SAVEPOINT s2;
SELECT count(outbox.emit('seqtest', 'd', 'e', '{}')) FROM generate_series(1, 2);
RELEASE SAVEPOINT s2;
COMMIT;
SELECT * FROM t.seqs('d');

-- plpgsql exception blocks: a failed block gives back what it emitted,
-- a successful one keeps it
DO $$
DECLARE
	i int;
BEGIN
	FOR i IN 1..6 LOOP
		BEGIN
			PERFORM outbox.emit('seqtest', 'e', 'e', '{}');
			PERFORM outbox.emit('seqtest', 'f' || (i % 2), 'e', '{}');
			IF i % 3 = 0 THEN
				RAISE EXCEPTION 'undo %', i;
			END IF;
		EXCEPTION WHEN raise_exception THEN
			NULL;
		END;
	END LOOP;
END
$$;
SELECT * FROM t.seqs('e');
SELECT * FROM t.seqs('f0');
SELECT * FROM t.seqs('f1');

-- an emit refused after its insert (too large for the producer) inside a
-- block numbers nothing
BEGIN;
SELECT outbox.emit('seqtest', 'g', 'e', '{}') IS NOT NULL AS emitted;
SELECT t.err($$SELECT outbox.emit('seqtest', 'g', 'e', jsonb_build_object('x', repeat('x', 999990)))$$) LIKE '54000%' AS refused;
SELECT outbox.emit('seqtest', 'g', 'e', '{}') IS NOT NULL AS emitted;
COMMIT;
SELECT * FROM t.seqs('g');

-- two-phase commit: the row is written before PREPARE
BEGIN;
SELECT count(outbox.emit('seqtest', 'h', 'e', '{}')) FROM generate_series(1, 7);
PREPARE TRANSACTION 'outbox_seq';
COMMIT PREPARED 'outbox_seq';
SELECT * FROM t.seqs('h');
BEGIN;
SELECT count(outbox.emit('seqtest', 'h', 'e', '{}')) FROM generate_series(1, 7);
PREPARE TRANSACTION 'outbox_seq';
ROLLBACK PREPARED 'outbox_seq';
SELECT count(outbox.emit('seqtest', 'h', 'e', '{}')) FROM generate_series(1, 2);
SELECT * FROM t.seqs('h');

-- a caller with no right on the counter table: the row is still written
CREATE ROLE outbox_seq_writer;
GRANT USAGE ON SCHEMA outbox TO outbox_seq_writer;
GRANT EXECUTE ON FUNCTION outbox.emit TO outbox_seq_writer;
SET ROLE outbox_seq_writer;
BEGIN;
SELECT count(outbox.emit('seqtest', 'i', 'e', '{}')) FROM generate_series(1, 3);
COMMIT;
RESET ROLE;
SELECT * FROM t.seqs('i');
DROP OWNED BY outbox_seq_writer;
DROP ROLE outbox_seq_writer;

-- cost: 16,000 events of one aggregate in one transaction take about as
-- long as with the sequence off (numbering each from the row was
-- quadratic: about 8 times as long)
CREATE FUNCTION t.emit_run(n int) RETURNS float8
LANGUAGE plpgsql AS $$
DECLARE
	t0 timestamptz := clock_timestamp();
BEGIN
	PERFORM outbox.emit('seqtime', 'one', 'e', '{}') FROM generate_series(1, n);
	RETURN extract(epoch FROM clock_timestamp() - t0);
END
$$;
SET outbox.aggregate_sequence = off;
SELECT t.emit_run(16000) AS off_secs \gset
RESET outbox.aggregate_sequence;
SELECT t.emit_run(16000) AS on_secs \gset
SELECT :on_secs < 3 * :off_secs AS within_3x;
SELECT last_seq FROM outbox.aggregates WHERE aggregate_type = 'seqtime';

-- the counter row is updated without an UPDATE statement while
-- outbox.aggregates is the table emit() knows (DEBUG1 says which way, when
-- it looks again after the table changed); a trigger a superuser puts on it
-- is honoured all the same, through the UPDATE
SELECT count(outbox.emit('seqtest', 'dir', 'e', '{}')) FROM generate_series(1, 2);
CREATE FUNCTION pg_temp.seen() RETURNS trigger LANGUAGE plpgsql AS
  $$BEGIN RAISE NOTICE 'counter row of % goes to %', NEW.aggregate_id, NEW.last_seq; RETURN NEW; END$$;
CREATE TRIGGER seen BEFORE UPDATE ON outbox.aggregates
  FOR EACH ROW EXECUTE FUNCTION pg_temp.seen();
SET client_min_messages = debug1;
SELECT outbox.emit('seqtest', 'dir', 'e', '{}') IS NOT NULL AS through_update;
RESET client_min_messages;
DROP TRIGGER seen ON outbox.aggregates;
SET client_min_messages = debug1;
SELECT outbox.emit('seqtest', 'dir', 'e', '{}') IS NOT NULL AS direct_again;
RESET client_min_messages;
-- a run, then a savepoint rolled back and a plpgsql exception block, on
-- the direct path: still gapless
SELECT outbox.emit('seqtest', 'dir2', 'e', '{}') IS NOT NULL AS dir2_exists;
BEGIN;
SELECT count(outbox.emit('seqtest', 'dir', 'e', '{}')) FROM generate_series(1, 3);
SAVEPOINT b;
SELECT outbox.emit('seqtest', 'dir', 'e', '{}') IS NOT NULL AS given_back;
ROLLBACK TO SAVEPOINT b;
DO $$BEGIN
	PERFORM outbox.emit('seqtest', 'dir2', 'e', '{}');
	RAISE EXCEPTION 'undo';
EXCEPTION WHEN raise_exception THEN
	PERFORM outbox.emit('seqtest', 'dir2', 'e', '{}');
END$$;
COMMIT;
SELECT * FROM t.seqs('dir');
SELECT * FROM t.seqs('dir2');

-- where the counter row was seen (counter.c): a transaction's first emit of
-- an aggregate looks for the row where the last one found it, and descends
-- the primary key only when it is not there.  key_scans() is how many
-- times this transaction has scanned the key (its statistics are flushed
-- before).
CREATE FUNCTION t.key_scans() RETURNS bigint LANGUAGE sql AS $$
	SELECT idx_scan FROM pg_stat_xact_user_tables
	 WHERE relid = 'outbox.aggregates'::regclass
$$;
SELECT outbox.emit('seqtest', 'm1', 'e', '{}') IS NOT NULL AS m1_created;
SELECT outbox.emit('seqtest', 'm1', 'e', '{}') IS NOT NULL AS m1_found_by_key;
SELECT pg_stat_force_next_flush();
BEGIN;
SELECT outbox.emit('seqtest', 'm1', 'e', '{}') IS NOT NULL AS m1_found_where_seen;
SELECT t.key_scans();
COMMIT;
SELECT * FROM t.seqs('m1');
-- the table rewritten (new file): the buffer no longer holds its block,
-- and the key finds the row
VACUUM FULL outbox.aggregates;
SELECT pg_stat_force_next_flush();
BEGIN;
SELECT outbox.emit('seqtest', 'm1', 'e', '{}') IS NOT NULL AS m1_after_rewrite;
SELECT t.key_scans();
COMMIT;
SELECT * FROM t.seqs('m1');
-- the row deleted and its line pointer reused by another aggregate's row:
-- the row found there is not this aggregate's, and the key finds none, so
-- m2 starts again at 1 and m3's counter is left alone
SELECT outbox.emit('seqtest', 'm2', 'e', '{}') IS NOT NULL AS m2_created;
SELECT ctid AS m2_at FROM outbox.aggregates
 WHERE aggregate_type = 'seqtest' AND aggregate_id = 'm2' \gset
SELECT outbox.emit('seqtest', 'm2', 'e', '{}') IS NOT NULL AS m2_found_by_key;
DELETE FROM outbox.aggregates WHERE aggregate_type = 'seqtest' AND aggregate_id = 'm2';
VACUUM (INDEX_CLEANUP ON) outbox.aggregates;
INSERT INTO outbox.aggregates VALUES ('seqtest', 'm3', 100);
SELECT ctid = :'m2_at' AS m3_has_m2s_line_pointer FROM outbox.aggregates
 WHERE aggregate_type = 'seqtest' AND aggregate_id = 'm3';
SELECT outbox.emit('seqtest', 'm2', 'e', '{}') IS NOT NULL AS m2_again;
SELECT seq FROM outbox.events WHERE aggregate_type = 'seqtest' AND aggregate_id = 'm2'
 ORDER BY id DESC LIMIT 1;
SELECT * FROM t.seqs('m3');

-- counter pages are pruned late (once nearly full) but pruned: 3,000
-- transactions over 20 aggregates leave the table within a page of its
-- size (no autovacuum meanwhile; without pruning, 3,000 dead versions take
-- about 24 pages)
ALTER TABLE outbox.aggregates SET (autovacuum_enabled = off);
SELECT outbox.emit('seqtest', 'p' || g, 'e', '{}') IS NULL FROM generate_series(0, 19) g
 GROUP BY 1;
SELECT pg_relation_size('outbox.aggregates') AS agg_size \gset
SET synchronous_commit = off;
DO $$BEGIN
	FOR i IN 1..3000 LOOP
		PERFORM outbox.emit('seqtest', 'p' || (i % 20), 'e', '{}');
		COMMIT;
	END LOOP;
END$$;
RESET synchronous_commit;
SELECT pg_relation_size('outbox.aggregates') <= :agg_size + 8192 AS pruned;
SELECT * FROM t.seqs('p7');
ALTER TABLE outbox.aggregates RESET (autovacuum_enabled);
