/*-------------------------------------------------------------------------
 *
 * store/store_batch.c
 *		The relay's batch path in SQL: its progress row, batch bounds, pages
 *		of events and pages of the replay queue.
 *
 * The relay's other statements are in store_dead.c (dead letters and the
 * replay queue) and store_upkeep.c (cleanup, restored events).
 *
 * Invariants:
 *	- Called inside a transaction the relay opened; never starts, commits
 *	  or aborts one.  Each function connects to SPI and disconnects.
 *	- Here event rows, dead letters and the replay queue are only read.
 *	  The one write is the relay's progress row: created when missing
 *	  (OutboxStoreLoadProgress) and moved once per acknowledged page
 *	  (OutboxStoreSavePage).
 *	- A batch is the set of events whose txid is visible in snapshot cur
 *	  and not in prev.  An event invisible in prev has its txid in prev's
 *	  in-progress list or at or above prev's xmax, which is what lets the
 *	  txid index find the batch without scanning from an old xmin.
 *	- Pages go out in id order; for one aggregate id order is commit order.
 *	  Replay pages go out in queue order.
 *	- A page is bounded by outbox.batch_size events and, past its first
 *	  event, by outbox.batch_max_bytes of payload, keys and headers; rows
 *	  come through a cursor a chunk at a time, so neither SPI nor the page
 *	  ever holds more than that.
 *	- Statements name only objects every installed version has (1.0 on),
 *	  so a database not yet updated to the library's version still relays.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/stratnum.h"
#include "access/table.h"
#include "catalog/pg_extension.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/datetime.h"
#include "utils/fmgroids.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"
#include "utils/uuid.h"

#include "base/base.h"
#include "kafka/kafka.h"
#include "store/store.h"
#include "store/store_sql.h"

/* $2: cur, $3: prev; before the first batch (no prev) it is all of cur */
#define BATCH_OF(prev) \
	" pg_catalog.pg_visible_in_snapshot(e.txid, $2)" \
	" AND (" prev ")"

/*
 * Of prev's in-progress transactions only those that have ended visibly in
 * cur are looked up: the rows of one still open (a large transaction, say)
 * are not in the batch, and visiting them through the txid index at every
 * poll would cost as much as the transaction is large.
 */
#define AFTER_PREV \
	"e.txid OPERATOR(pg_catalog.>=) pg_catalog.pg_snapshot_xmax($3)" \
	" OR e.txid OPERATOR(pg_catalog.=) ANY (ARRAY(SELECT x" \
	" FROM pg_catalog.pg_snapshot_xip($3) AS x" \
	" WHERE pg_catalog.pg_visible_in_snapshot(x, $2)))"

/*
 * The extent of a batch.  Run with plain index and sequential scans off,
 * and, after the first batch, with the id condition written so that no
 * index can take it: the only path left is a bitmap scan of the txid
 * index, which touches just the batch.  Left to itself the planner may
 * walk the id index from the oldest retained event, since it cannot tell
 * that "txid >= xmax" matches only the newest rows; and a bitmap scan of
 * the id index (its choice while the table is small) visits the rows of a
 * transaction still open, however many, at every look.
 */
#define BOUNDS_SQL(id, prev) \
	"SELECT pg_catalog.min(e.id), pg_catalog.max(e.id), pg_catalog.count(*)" \
	" FROM outbox.events e" \
	" WHERE " id " OPERATOR(pg_catalog.>) $1 AND" BATCH_OF(prev)


/* rows fetched from a page's cursor at a time: SPI holds no more at once */
#define PAGE_FETCH_ROWS 1000

#define PAGE_SQL(prev) \
	"SELECT " EVENT_COLUMNS \
	" FROM outbox.events e" \
	" WHERE e.id OPERATOR(pg_catalog.>) $1 AND e.id OPERATOR(pg_catalog.<=) $4 AND" BATCH_OF(prev) \
	" ORDER BY e.id LIMIT $5"

enum
{
	Q_BOUNDS_FIRST,
	Q_BOUNDS,
	Q_PAGE_FIRST,
	Q_PAGE,
	Q_COUNT
};

static const char *const query_text[Q_COUNT] = {
	/* the first batch (no prev) has no txid bound: the id index it is */
	BOUNDS_SQL("e.id", "true"),
	BOUNDS_SQL("(e.id OPERATOR(pg_catalog.+) 0)", AFTER_PREV),
	PAGE_SQL("true"),
	PAGE_SQL(AFTER_PREV),
};

#define QUERY_NARGS 5

/* [1]: as a database before 1.8 runs them (OutboxStoreEventSql) */
static SPIPlanPtr plans[2][Q_COUNT];

/*
 * OutboxStoreRun
 *		Run one of the relay's statements, without parameters, inside SPI;
 *		anything but the expected SPI_OK_* code is a bug, hence elog: "could
 *		not <what>".  The result is in SPI_tuptable and SPI_processed.
 */
void
OutboxStoreRun(const char *sql, bool read_only, long count, int expected,
			   const char *what)
{
	int			rc = SPI_execute(sql, read_only, count);

	if (rc != expected)
		elog(ERROR, "could not %s: %s", what, SPI_result_code_string(rc));
}

/*
 * OutboxStoreRunArgs
 *		OutboxStoreRun for a statement that writes, with nargs parameters
 *		(types and values as SPI_execute_with_args takes them, none null).
 *		Returns how many rows it processed.
 */
int64
OutboxStoreRunArgs(const char *sql, int nargs, Oid *types, Datum *values,
				   int expected, const char *what)
{
	int			rc = SPI_execute_with_args(sql, nargs, types, values, NULL, false, 0);

	if (rc != expected)
		elog(ERROR, "could not %s: %s", what, SPI_result_code_string(rc));
	return (int64) SPI_processed;
}

/*
 * OutboxStoreRow
 *		Run a read-only statement that returns exactly one row, inside SPI,
 *		and return that row (SPI_tuptable->tupdesc describes it).
 */
HeapTuple
OutboxStoreRow(const char *sql, const char *what)
{
	OutboxStoreRun(sql, true, 1, SPI_OK_SELECT, what);
	if (SPI_processed != 1)
		elog(ERROR, "could not %s: %d rows", what, (int) SPI_processed);
	return SPI_tuptable->vals[0];
}

static SPIPlanPtr
get_plan(int q)
{
	bool		have_bytes = (q == Q_PAGE_FIRST || q == Q_PAGE) ?
		OutboxStoreEventsHaveBytes() : true;
	SPIPlanPtr *plan = &plans[have_bytes ? 0 : 1][q];

	if (*plan == NULL)
	{
		Oid			types[QUERY_NARGS] = {INT8OID, PG_SNAPSHOTOID, PG_SNAPSHOTOID,
		INT8OID, INT4OID};

		*plan = OutboxSpiPrepareGeneric(OutboxStoreEventSql(query_text[q], have_bytes),
										QUERY_NARGS, types, "relay query");
	}
	return *plan;
}

static Datum
snapshot_datum(const char *text)
{
	static Oid	input = InvalidOid;
	static Oid	ioparam;

	if (!OidIsValid(input))
		getTypeInputInfo(PG_SNAPSHOTOID, &input, &ioparam);
	return OidInputFunctionCall(input, (char *) text, ioparam, -1);
}

static void
set_args(Datum *values, char *nulls, const OutboxBatch *batch, int64 after)
{
	values[0] = Int64GetDatum(after);
	nulls[0] = ' ';
	/* typed parameters: parsed once here, not once per row */
	values[1] = snapshot_datum(batch->cur);
	nulls[1] = ' ';
	if (batch->prev != NULL)
	{
		values[2] = snapshot_datum(batch->prev);
		nulls[2] = ' ';
	}
	else
	{
		values[2] = (Datum) 0;
		nulls[2] = 'n';
	}
	values[3] = (Datum) 0;
	nulls[3] = 'n';
	values[4] = (Datum) 0;
	nulls[4] = 'n';
}

/*
 * OutboxStoreExtensionPresent
 *		Whether this database still has the extension.
 *
 * Read from pg_extension with a fresh snapshot, not through the catalog
 * caches: DROP EXTENSION wakes the relay from its commit callback, which
 * runs before the transaction's cache invalidations are sent, so a cached
 * entry (PostgreSQL 18 caches extensions by name) could still say present.
 * A scan of the name index, not a statement: the relay asks before every
 * page, and a statement's parse and executor cost about 0.1 ms of the
 * latency of a page of one event.
 */
bool
OutboxStoreExtensionPresent(void)
{
	Relation	rel;
	ScanKeyData key;
	SysScanDesc scan;
	Snapshot	snap = RegisterSnapshot(GetLatestSnapshot());
	bool		present;

	rel = table_open(ExtensionRelationId, AccessShareLock);
	ScanKeyInit(&key, Anum_pg_extension_extname, BTEqualStrategyNumber, F_NAMEEQ,
				CStringGetDatum("outbox"));
	scan = systable_beginscan(rel, ExtensionNameIndexId, true, snap, 1, &key);
	present = HeapTupleIsValid(systable_getnext(scan));
	systable_endscan(scan);
	table_close(rel, AccessShareLock);
	UnregisterSnapshot(snap);
	return present;
}

static char *
getstr(HeapTuple tup, TupleDesc desc, int col, MemoryContext cxt)
{
	bool		isnull;
	Datum		d = SPI_getbinval(tup, desc, col, &isnull);
	MemoryContext old;
	char	   *s;

	if (isnull)
		return NULL;
	old = MemoryContextSwitchTo(cxt);
	s = TextDatumGetCString(d);
	MemoryContextSwitchTo(old);
	return s;
}

/*
 * OutboxStoreLoadOrigin
 *		Make this database's outbox.origin the origin the relay sends (in
 *		the caller's transaction).  SQL objects older than 1.8 have none:
 *		until the table is found, every call looks again; once it is, only
 *		a forced call reads it (at start, and after a restore brought its
 *		own).
 */
void
OutboxStoreLoadOrigin(bool force)
{
	static bool found = false;
	HeapTuple	tup;
	bool		isnull;

	if (found && !force)
		return;
	SPI_connect();
	tup = OutboxStoreRow("SELECT pg_catalog.to_regclass('outbox.origin') IS NOT NULL",
						 "look for the origin");
	if (!DatumGetBool(SPI_getbinval(tup, SPI_tuptable->tupdesc, 1, &isnull)))
		OutboxSetOrigin(NULL);
	else
	{
		tup = OutboxStoreRow("SELECT o.origin::pg_catalog.text FROM outbox.origin o",
							 "read the origin");
		OutboxSetOrigin(getstr(tup, SPI_tuptable->tupdesc, 1, CurrentMemoryContext));
		found = true;
	}
	SPI_finish();
}

/*
 * OutboxStoreLoadProgress
 *		Read the progress row into *batch (strings allocated in cxt).
 */
void
OutboxStoreLoadProgress(OutboxBatch *batch, MemoryContext cxt)
{
	HeapTuple	tup;
	TupleDesc	desc;
	bool		isnull;
	Datum		d;

	memset(batch, 0, sizeof(OutboxBatch));
	SPI_connect();
	/* a deleted progress row resets the relay: it re-sends what is kept */
	OutboxStoreRun("INSERT INTO outbox.relay_progress (relay) SELECT 'default' WHERE NOT EXISTS"
				   " (SELECT 1 FROM outbox.relay_progress p"
				   "  WHERE p.relay OPERATOR(pg_catalog.=) 'default')",
				   false, 0, SPI_OK_INSERT, "create relay progress");
	tup = OutboxStoreRow("SELECT p.prev_snapshot::text, p.batch_snapshot::text, p.batch_last_id"
						 " FROM outbox.relay_progress p"
						 " WHERE p.relay OPERATOR(pg_catalog.=) 'default'",
						 "read relay progress");
	desc = SPI_tuptable->tupdesc;
	batch->prev = getstr(tup, desc, 1, cxt);
	batch->fresh = false;
	batch->cur = getstr(tup, desc, 2, cxt);
	d = SPI_getbinval(tup, desc, 3, &isnull);
	batch->last_id = isnull ? 0 : DatumGetInt64(d);
	SPI_finish();
}

/*
 * OutboxStoreOpenBatch
 *		Find the extent of the batch: a new one (cur := current snapshot) if
 *		none is under way, else the rest of the resumed one.  Sets max_id and
 *		remaining; returns false when the batch has nothing left, in which
 *		case no batch is open.
 */
bool
OutboxStoreOpenBatch(OutboxBatch *batch, MemoryContext cxt)
{
	Datum		values[QUERY_NARGS];
	char		nulls[QUERY_NARGS];
	bool		isnull;
	int			rc;
	int			nestlevel;
	HeapTuple	tup;
	TupleDesc	desc;
	bool		fresh = (batch->cur == NULL);

	batch->fresh = false;
	SPI_connect();
	if (fresh)
	{
		/* the transaction's snapshot, as pg_current_snapshot() gives it */
		Datum		snap = OidFunctionCall0Coll(F_PG_CURRENT_SNAPSHOT, InvalidOid);

		batch->cur = MemoryContextStrdup(cxt, OidOutputFunctionCall(F_PG_SNAPSHOT_OUT, snap));
		batch->last_id = 0;
	}

	nestlevel = NewGUCNestLevel();
	(void) set_config_option("enable_seqscan", "off", PGC_USERSET, PGC_S_SESSION,
							 GUC_ACTION_SAVE, true, 0, false);
	(void) set_config_option("enable_indexscan", "off", PGC_USERSET, PGC_S_SESSION,
							 GUC_ACTION_SAVE, true, 0, false);
	(void) set_config_option("enable_indexonlyscan", "off", PGC_USERSET, PGC_S_SESSION,
							 GUC_ACTION_SAVE, true, 0, false);
	set_args(values, nulls, batch, batch->last_id);
	rc = SPI_execute_plan(get_plan(batch->prev == NULL ? Q_BOUNDS_FIRST : Q_BOUNDS),
						  values, nulls, true, 1);
	AtEOXact_GUC(true, nestlevel);
	if (rc != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "could not find the batch bounds: %s", SPI_result_code_string(rc));

	tup = SPI_tuptable->vals[0];
	desc = SPI_tuptable->tupdesc;
	batch->remaining = DatumGetInt64(SPI_getbinval(tup, desc, 3, &isnull));
	if (batch->remaining == 0)
	{
		/*
		 * Nothing between prev and cur: in memory, prev moves to cur, so a
		 * transaction still open in cur is in prev's in-progress list from
		 * now on and its rows are not visited again until it ends.  The
		 * stored prev stays where it is: resuming from it after a restart
		 * covers this empty ground again, which is harmless.
		 */
		if (batch->last_id == 0)
		{
			if (batch->prev != NULL)
				pfree(batch->prev);
			batch->prev = batch->cur;
			batch->fresh = fresh;
		}
		else
			pfree(batch->cur);
		batch->cur = NULL;
		SPI_finish();
		return false;
	}
	/* pages walk the id index from just below the batch's lowest id */
	batch->last_id = DatumGetInt64(SPI_getbinval(tup, desc, 1, &isnull)) - 1;
	batch->max_id = DatumGetInt64(SPI_getbinval(tup, desc, 2, &isnull));
	SPI_finish();
	return true;
}

/*
 * OutboxStoreFetchEvents
 *		Decode the rows of portal (EVENT_COLUMNS, then for replays the queue
 *		position) into an array allocated in cxt, a
 *		chunk of rows at a time, until limit events or until the next one
 *		would take the page past max_bytes (OutboxStoreEventBytes); the first event
 *		is always taken, however large.  *cut says the page ended on bytes
 *		while rows remained.  Only a chunk of rows and the page itself are
 *		in memory at once: the decoded page is bounded by max_bytes plus
 *		one event, which is decoded to be weighed, then released.
 */
int
OutboxStoreFetchEvents(Portal portal, int limit, int64 max_bytes,
			 OutboxEvent **events, MemoryContext cxt, bool *cut)
{
	OutboxEvent *evs;
	int			n = 0;
	int			cap = Min(limit, PAGE_FETCH_ROWS);
	int64		bytes = 0;

	*cut = false;
	evs = MemoryContextAllocZero(cxt, sizeof(OutboxEvent) * Max(cap, 1));
	while (n < limit && !*cut)
	{
		uint64		i;
		MemoryContext old;

		SPI_cursor_fetch(portal, true, Min(PAGE_FETCH_ROWS, limit - n));
		if (SPI_processed == 0)
			break;
		if (n + (int) SPI_processed > cap)
		{
			int			grown = Min(Max(cap * 2, n + (int) SPI_processed), limit);

			evs = repalloc(evs, sizeof(OutboxEvent) * grown);
			memset(evs + cap, 0, sizeof(OutboxEvent) * (grown - cap));
			cap = grown;
		}
		old = MemoryContextSwitchTo(cxt);
		for (i = 0; i < SPI_processed; i++)
		{
			HeapTuple	tup = SPI_tuptable->vals[i];
			TupleDesc	desc = SPI_tuptable->tupdesc;
			OutboxEvent *ev = &evs[n];
			int64		size;

			OutboxStoreDecodeEvent(tup, desc, ev);
			size = OutboxStoreEventBytes(ev);
			if (n > 0 && bytes + size > max_bytes)
			{
				/* the next page starts with it; its small strings stay */
				if (ev->payload != NULL)
					pfree(ev->payload);
				memset(ev, 0, sizeof(OutboxEvent));
				*cut = true;
				break;
			}
			bytes += size;
			n++;
		}
		MemoryContextSwitchTo(old);
		SPI_freetuptable(SPI_tuptable);
	}
	*events = evs;
	return n;
}

/*
 * OutboxStoreReadPage
 *		The next events of the open batch, in id order, copied into cxt:
 *		up to limit of them and, past the first, up to max_bytes of them
 *		(OutboxStoreFetchEvents).  Returns how many; *cut says the bytes ended the page
 *		while the batch has more.
 */
int
OutboxStoreReadPage(OutboxBatch *batch, int limit, int max_bytes,
					OutboxEvent **events, MemoryContext cxt, bool *cut)
{
	Datum		values[QUERY_NARGS];
	char		nulls[QUERY_NARGS];
	Portal		portal;
	int			n;

	SPI_connect();
	set_args(values, nulls, batch, batch->last_id);
	values[3] = Int64GetDatum(batch->max_id);
	nulls[3] = ' ';
	values[4] = Int32GetDatum(limit);
	nulls[4] = ' ';
	portal = SPI_cursor_open(NULL, get_plan(batch->prev == NULL ? Q_PAGE_FIRST : Q_PAGE),
							 values, nulls, true);
	if (portal == NULL)
		elog(ERROR, "could not read events: %s", SPI_result_code_string(SPI_result));
	n = OutboxStoreFetchEvents(portal, limit, max_bytes, events, cxt, cut);
	SPI_cursor_close(portal);
	SPI_finish();
	return n;
}

/* $1: the batch's snapshot, $2: events acknowledged, $3: the last id */
#define SAVE_BATCH_SQL \
	"UPDATE outbox.relay_progress SET" \
	" prev_snapshot = $1::pg_catalog.pg_snapshot," \
	" batch_snapshot = NULL, batch_last_id = NULL," \
	" published = published OPERATOR(pg_catalog.+) $2," \
	" batches = batches OPERATOR(pg_catalog.+) 1," \
	" updated_at = pg_catalog.now()" \
	" WHERE relay = 'default'"
#define SAVE_PAGE_SQL \
	"UPDATE outbox.relay_progress SET" \
	" batch_snapshot = $1::pg_catalog.pg_snapshot," \
	" batch_last_id = $3," \
	" published = published OPERATOR(pg_catalog.+) $2," \
	" updated_at = pg_catalog.now()" \
	" WHERE relay = 'default'"

/*
 * OutboxStoreSavePage
 *		Record that every event of the batch up to last_id is acknowledged;
 *		with batch_done, the batch is complete and prev moves to cur.
 */
void
OutboxStoreSavePage(const char *cur, int64 last_id, int count, bool batch_done)
{
	static SPIPlanPtr page_plan = NULL;
	static SPIPlanPtr done_plan = NULL;
	SPIPlanPtr *planp = batch_done ? &done_plan : &page_plan;
	Datum		values[3];
	int			rc;

	SPI_connect();
	if (*planp == NULL)
	{
		Oid			types[3] = {TEXTOID, INT8OID, INT8OID};

		*planp = OutboxSpiPrepare(batch_done ? SAVE_BATCH_SQL : SAVE_PAGE_SQL,
									3, types, "progress update");
	}
	values[0] = CStringGetTextDatum(cur);
	values[1] = Int64GetDatum(count);
	values[2] = Int64GetDatum(last_id);
	rc = SPI_execute_plan(*planp, values, NULL, false, 0);
	if (rc != SPI_OK_UPDATE || SPI_processed != 1)
		elog(ERROR, "could not save relay progress: %s", SPI_result_code_string(rc));
	SPI_finish();
}

/*
 * OutboxStoreQueryEvents
 *		Run sql, a SELECT of EVENT_COLUMNS first, with nargs parameters
 *		(as OutboxStoreRunArgs), and fetch up to limit of its events, and
 *		at most outbox.batch_max_bytes of them past the first
 *		(OutboxStoreFetchEvents), into cxt.  what names what it reads for
 *		the error message.  Inside SPI.  Returns how many.
 */
int
OutboxStoreQueryEvents(const char *sql, int nargs, Oid *types, Datum *values,
					   bool read_only, int limit, OutboxEvent **events,
					   MemoryContext cxt, const char *what)
{
	Portal		portal;
	bool		cut;
	int			n;

	portal = SPI_cursor_open_with_args(NULL,
									   OutboxStoreEventSql(sql, OutboxStoreEventsHaveBytes()),
									   nargs, types, values, NULL, read_only, 0);
	if (portal == NULL)
		elog(ERROR, "could not read %s: %s", what, SPI_result_code_string(SPI_result));
	n = OutboxStoreFetchEvents(portal, limit, outbox_batch_max_bytes, events, cxt, &cut);
	SPI_cursor_close(portal);
	return n;
}

/*
 * OutboxStoreReadReplays
 *		The next up to limit queued replays, in queue order, and at most
 *		outbox.batch_max_bytes of them past the first (OutboxStoreFetchEvents).
 */
int
OutboxStoreReadReplays(int limit, OutboxEvent **events, MemoryContext cxt)
{
	Datum		values[1];
	Oid			types[1] = {INT4OID};
	int			n;

	SPI_connect();
	values[0] = Int32GetDatum(limit);
	OutboxStoreLockFirst("replay_queue");
	/* what the bytes leave out stays queued for the next page */
	n = OutboxStoreQueryEvents("SELECT " EVENT_COLUMNS ", q.position"
							   " FROM outbox.replay_queue q"
							   " JOIN outbox.events e ON e.id OPERATOR(pg_catalog.=) q.event_pk"
							   " ORDER BY q.position LIMIT $1",
							   1, types, values, true, limit, events, cxt,
							   "the replay queue");
	SPI_finish();
	return n;
}


/*
 * OutboxStoreLoadKafkaTransaction
 *		exactly_once: the number of the last Kafka transaction whose page is
 *		recorded (relay_progress.kafka_transaction; 0 when none).  -1 when
 *		the column is missing: the extension predates 1.8.
 */
int64
OutboxStoreLoadKafkaTransaction(void)
{
	HeapTuple	tup;
	bool		isnull;
	int64		result = -1;

	SPI_connect();
	tup = OutboxStoreRow("SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_attribute a"
						 "  WHERE a.attrelid OPERATOR(pg_catalog.=) 'outbox.relay_progress'::pg_catalog.regclass"
						 "  AND a.attname OPERATOR(pg_catalog.=) 'kafka_transaction'"
						 "  AND NOT a.attisdropped)",
						 "look for relay_progress.kafka_transaction");
	if (DatumGetBool(SPI_getbinval(tup, SPI_tuptable->tupdesc, 1, &isnull)))
	{
		Datum		d;

		tup = OutboxStoreRow("SELECT p.kafka_transaction FROM outbox.relay_progress p"
							 " WHERE p.relay OPERATOR(pg_catalog.=) 'default'",
							 "read relay_progress.kafka_transaction");
		d = SPI_getbinval(tup, SPI_tuptable->tupdesc, 1, &isnull);
		result = isnull ? 0 : DatumGetInt64(d);
	}
	SPI_finish();
	return result;
}

/*
 * OutboxStoreSaveKafkaTransaction
 *		exactly_once: the page recorded in this transaction was published in
 *		Kafka transaction number n.
 */
void
OutboxStoreSaveKafkaTransaction(int64 n)
{
	Datum		values[1] = {Int64GetDatum(n)};
	Oid			types[1] = {INT8OID};

	SPI_connect();
	OutboxSpiExec("UPDATE outbox.relay_progress SET kafka_transaction = $1"
				  " WHERE relay OPERATOR(pg_catalog.=) 'default'",
				  1, types, values, NULL, false, 0, SPI_OK_UPDATE,
				  "record the Kafka transaction");
	SPI_finish();
}
