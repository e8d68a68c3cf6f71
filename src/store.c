/*-------------------------------------------------------------------------
 *
 * store.c
 *		Every SQL statement a relay runs: progress, batch bounds, pages.
 *
 * Invariants:
 *	- Called inside a transaction the relay opened; never starts, commits
 *	  or aborts one.  Each function connects to SPI and disconnects.
 *	- Event rows are only read.  The only write is the relay's progress
 *	  row, once per acknowledged page.
 *	- A batch is the set of events whose txid is visible in snapshot cur
 *	  and not in prev.  An event invisible in prev has its txid in prev's
 *	  in-progress list or at or above prev's xmax, which is what lets the
 *	  txid index find the batch without scanning from an old xmin.
 *	- Pages go out in id order; for one aggregate id order is commit order.
 *	- A page is bounded by outbox.batch_size events and, past its first
 *	  event, by outbox.batch_max_bytes of payload, keys and headers; rows
 *	  come through a cursor a chunk at a time, so neither SPI nor the page
 *	  ever holds more than that.
 *	- An event is recorded as parked only if its head's dead letter, read
 *	  and locked in the recording transaction, still holds it back
 *	  (quarantined or parked); otherwise it joins the replay queue.  So a
 *	  replay() or discard() of the head, however it races with the relay,
 *	  leaves no event parked behind a head that is gone.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/datetime.h"
#include "utils/timestamp.h"
#include "utils/uuid.h"

#include "outbox.h"

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
 * The extent of a batch.  Run with plain index and sequential scans off:
 * the only path left is a bitmap scan of the txid index, which touches just
 * the batch.  Left to itself the planner may walk the id index from the
 * oldest retained event, since it cannot tell that "txid >= xmax" matches
 * only the newest rows.
 */
#define BOUNDS_SQL(prev) \
	"SELECT pg_catalog.min(e.id), pg_catalog.max(e.id), pg_catalog.count(*)" \
	" FROM outbox.events e" \
	" WHERE e.id OPERATOR(pg_catalog.>) $1 AND" BATCH_OF(prev)

/*
 * The columns decode_event() reads, in its order.  Values come back binary
 * and are formatted in C: the payload's JSON text straight into the page,
 * the event id and occurred_at without output functions.
 */
#define EVENT_COLUMNS \
	"e.id, e.event_id, e.aggregate_type, e.aggregate_id, e.seq," \
	" e.event_type, e.schema_version, e.topic, e.key, e.payload, e.headers," \
	" e.tenant, e.traceparent, e.occurred_at, e.created_at"
#define EVENT_NCOLUMNS 15

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
	BOUNDS_SQL("true"),
	BOUNDS_SQL(AFTER_PREV),
	PAGE_SQL("true"),
	PAGE_SQL(AFTER_PREV),
};

#define QUERY_NARGS 5

static SPIPlanPtr plans[Q_COUNT];

static SPIPlanPtr
get_plan(int q)
{
	if (plans[q] == NULL)
	{
		Oid			types[QUERY_NARGS] = {INT8OID, PG_SNAPSHOTOID, PG_SNAPSHOTOID,
		INT8OID, INT4OID};
		SPIPlanPtr	plan = SPI_prepare(query_text[q], QUERY_NARGS, types);

		if (plan == NULL)
			elog(ERROR, "could not prepare relay query: %s",
				 SPI_result_code_string(SPI_result));
		SPI_keepplan(plan);
		plans[q] = plan;
	}
	return plans[q];
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
 */
bool
OutboxStoreExtensionPresent(void)
{
	bool		present;
	int			rc;

	SPI_connect();
	rc = SPI_execute("SELECT 1 FROM pg_catalog.pg_extension x"
					 " WHERE x.extname OPERATOR(pg_catalog.=) 'outbox'", true, 1);
	if (rc != SPI_OK_SELECT)
		elog(ERROR, "could not look for the extension: %s", SPI_result_code_string(rc));
	present = SPI_processed == 1;
	SPI_finish();
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
 * OutboxStoreLoadProgress
 *		Read the progress row into *batch (strings allocated in cxt).
 */
void
OutboxStoreLoadProgress(OutboxBatch *batch, MemoryContext cxt)
{
	int			rc;
	HeapTuple	tup;
	TupleDesc	desc;
	bool		isnull;
	Datum		d;

	memset(batch, 0, sizeof(OutboxBatch));
	SPI_connect();
	/* a deleted progress row resets the relay: it re-sends what is kept */
	rc = SPI_execute("INSERT INTO outbox.relay_progress (relay) SELECT 'default' WHERE NOT EXISTS"
					 " (SELECT 1 FROM outbox.relay_progress p"
					 "  WHERE p.relay OPERATOR(pg_catalog.=) 'default')", false, 0);
	if (rc != SPI_OK_INSERT)
		elog(ERROR, "could not create relay progress: %s", SPI_result_code_string(rc));
	rc = SPI_execute("SELECT p.prev_snapshot::text, p.batch_snapshot::text, p.batch_last_id"
					 " FROM outbox.relay_progress p WHERE p.relay OPERATOR(pg_catalog.=) 'default'",
					 true, 1);
	if (rc != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "could not read relay progress: %s", SPI_result_code_string(rc));
	tup = SPI_tuptable->vals[0];
	desc = SPI_tuptable->tupdesc;
	batch->prev = getstr(tup, desc, 1, cxt);
	batch->cur = getstr(tup, desc, 2, cxt);
	d = SPI_getbinval(tup, desc, 3, &isnull);
	batch->last_id = isnull ? 0 : DatumGetInt64(d);
	SPI_finish();
}

/*
 * Whether restored event e (original txid r.txid) was delivered according
 * to restored progress row f: in its delivered snapshot, or in the
 * acknowledged part of its batch.
 */
#define DELIVERED_BY(f) \
	"(coalesce(pg_catalog.pg_visible_in_snapshot(r.txid, " f ".prev_snapshot), false)" \
	" OR coalesce(e.id OPERATOR(pg_catalog.<=) " f ".batch_last_id" \
	"  AND pg_catalog.pg_visible_in_snapshot(r.txid, " f ".batch_snapshot), false))"

/*
 * OutboxStoreAdoptRestored
 *		Publish what a restore brought in and had not delivered.
 *
 * A restore's event rows arrive re-stamped out of every batch, their
 * original txids in outbox.restored_events, and its progress row under a
 * name other than 'default' (see outbox--1.1.sql).  When both are in, each
 * restored event not delivered according to the restored progress (or to
 * any of them, if several) and not a dead letter gets the current
 * transaction's id, so the batch after this commit publishes it, in id
 * order; the rest stay delivered.  Then both go.  With force, events
 * without any restored progress row (a dump taken without it) are all
 * published.  Runs in the caller's transaction, which holds a lock on the
 * log that waits out a restore's COPY still in progress.  Returns how many
 * events were re-stamped, -1 when there is nothing to adopt, -2 when
 * restored events wait for their progress row.
 */
int64
OutboxStoreAdoptRestored(bool force)
{
	int			rc;
	bool		isnull;
	bool		have_events;
	bool		have_progress;
	int64		published;

	SPI_connect();
	rc = SPI_execute("SELECT pg_catalog.to_regclass('outbox.restored_events') IS NOT NULL", true, 1);
	if (rc != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "could not look for restored events: %s", SPI_result_code_string(rc));
	if (!DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull)))
	{
		/* a 1.0 database on this library, before ALTER EXTENSION UPDATE */
		SPI_finish();
		return -1;
	}
	rc = SPI_execute("SELECT EXISTS (SELECT 1 FROM outbox.restored_events),"
					 " EXISTS (SELECT 1 FROM outbox.relay_progress p"
					 "  WHERE p.relay OPERATOR(pg_catalog.<>) 'default')", true, 1);
	if (rc != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "could not look for restored events: %s", SPI_result_code_string(rc));
	have_events = DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0],
											 SPI_tuptable->tupdesc, 1, &isnull));
	have_progress = DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0],
											   SPI_tuptable->tupdesc, 2, &isnull));
	if (!have_events || (!have_progress && !force))
	{
		SPI_finish();
		return have_events ? -2 : -1;
	}

	/* a COPY still loading events or dead letters finishes first */
	rc = SPI_execute("LOCK TABLE outbox.events, outbox.dead_letters, outbox.relay_progress"
					 " IN SHARE MODE", false, 0);
	if (rc != SPI_OK_UTILITY)
		elog(ERROR, "could not lock the log: %s", SPI_result_code_string(rc));
	rc = SPI_execute("UPDATE outbox.events e SET txid = pg_catalog.pg_current_xact_id()"
					 " FROM outbox.restored_events r"
					 " WHERE r.id OPERATOR(pg_catalog.=) e.id"
					 " AND NOT EXISTS (SELECT 1 FROM outbox.dead_letters d"
					 "  WHERE d.event_pk OPERATOR(pg_catalog.=) e.id)"
					 " AND (NOT EXISTS (SELECT 1 FROM outbox.relay_progress f"
					 "   WHERE f.relay OPERATOR(pg_catalog.<>) 'default')"
					 "  OR EXISTS (SELECT 1 FROM outbox.relay_progress f"
					 "   WHERE f.relay OPERATOR(pg_catalog.<>) 'default'"
					 "   AND NOT " DELIVERED_BY("f") "))",
					 false, 0);
	if (rc != SPI_OK_UPDATE)
		elog(ERROR, "could not publish restored events: %s", SPI_result_code_string(rc));
	published = (int64) SPI_processed;
	rc = SPI_execute("DELETE FROM outbox.restored_events", false, 0);
	if (rc != SPI_OK_DELETE)
		elog(ERROR, "could not forget restored events: %s", SPI_result_code_string(rc));
	rc = SPI_execute("DELETE FROM outbox.relay_progress p"
					 " WHERE p.relay OPERATOR(pg_catalog.<>) 'default'", false, 0);
	if (rc != SPI_OK_DELETE)
		elog(ERROR, "could not drop restored progress: %s", SPI_result_code_string(rc));
	SPI_finish();
	return published;
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

	SPI_connect();
	if (batch->cur == NULL)
	{
		rc = SPI_execute("SELECT pg_catalog.pg_current_snapshot()::text", true, 1);
		if (rc != SPI_OK_SELECT || SPI_processed != 1)
			elog(ERROR, "could not take a snapshot: %s", SPI_result_code_string(rc));
		batch->cur = getstr(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, cxt);
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

/* Caller headers: a JSON object of strings, checked by emit(). */
static void
decode_headers(OutboxEvent *ev, Jsonb *jb)
{
	JsonbIterator *it;
	JsonbValue	v;
	JsonbIteratorToken tok;
	int			n = JB_ROOT_COUNT(jb);
	int			i = 0;

	ev->header_names = palloc(sizeof(char *) * Max(n, 1));
	ev->header_values = palloc(sizeof(char *) * Max(n, 1));
	it = JsonbIteratorInit(&jb->root);
	while ((tok = JsonbIteratorNext(&it, &v, true)) != WJB_DONE)
	{
		if (tok == WJB_KEY && i < n)
			ev->header_names[i] = pnstrdup(v.val.string.val, v.val.string.len);
		else if (tok == WJB_VALUE && i < n)
		{
			ev->header_values[i++] = (v.type == jbvString) ?
				pnstrdup(v.val.string.val, v.val.string.len) : pstrdup("");
		}
	}
	ev->nheaders = i;
}

static char *
text_copy(Datum d)
{
	return TextDatumGetCString(d);
}

/* 8-4-4-4-12 lower-case hex, as uuid_out writes it */
static char *
format_uuid(const pg_uuid_t *uuid)
{
	static const char hex[] = "0123456789abcdef";
	char	   *out = palloc(UUID_LEN * 2 + 5);
	char	   *p = out;
	int			i;

	for (i = 0; i < UUID_LEN; i++)
	{
		if (i == 4 || i == 6 || i == 8 || i == 10)
			*p++ = '-';
		*p++ = hex[uuid->data[i] >> 4];
		*p++ = hex[uuid->data[i] & 0x0F];
	}
	*p = '\0';
	return out;
}

/* RFC 3339 in UTC with microseconds: 2026-01-02T03:04:05.000000Z */
static char *
format_timestamp(TimestampTz ts)
{
	struct pg_tm tm;
	fsec_t		fsec;

	if (TIMESTAMP_NOT_FINITE(ts) || timestamp2tm(ts, NULL, &tm, &fsec, NULL, NULL) != 0)
		return pstrdup(TIMESTAMP_IS_NOBEGIN(ts) ? "-infinity" : "infinity");
	return psprintf("%04d-%02d-%02dT%02d:%02d:%02d.%06dZ",
					tm.tm_year, tm.tm_mon, tm.tm_mday, tm.tm_hour, tm.tm_min,
					tm.tm_sec, (int) fsec);
}

/*
 * decode_event
 *		Copy one row of EVENT_COLUMNS into *ev.  The caller has switched to
 *		the page's memory context, where everything is allocated.
 */
static void
decode_event(HeapTuple tup, TupleDesc desc, OutboxEvent *ev)
{
	/* a replay row has two more columns, read by the caller */
	Datum		v[EVENT_NCOLUMNS + 2];
	bool		isnull[EVENT_NCOLUMNS + 2];
	Jsonb	   *payload;
	StringInfoData json;

	Assert(desc->natts <= EVENT_NCOLUMNS + 2);
	heap_deform_tuple(tup, desc, v, isnull);
	ev->id = DatumGetInt64(v[0]);
	ev->event_id = format_uuid(DatumGetUUIDP(v[1]));
	ev->aggregate_type = text_copy(v[2]);
	ev->aggregate_id = text_copy(v[3]);
	ev->has_seq = !isnull[4];
	ev->seq = isnull[4] ? 0 : DatumGetInt64(v[4]);
	ev->event_type = text_copy(v[5]);
	ev->schema_version = DatumGetInt32(v[6]);
	ev->topic = text_copy(v[7]);
	ev->key = text_copy(v[8]);
	payload = DatumGetJsonbP(v[9]);
	initStringInfo(&json);
	ev->payload = JsonbToCString(&json, &payload->root, VARSIZE(payload));
	ev->payload_len = json.len;
	/* a large payload arrives toasted: keep its text, not also its jsonb */
	if ((Pointer) payload != DatumGetPointer(v[9]))
		pfree(payload);
	if (!isnull[10])
		decode_headers(ev, DatumGetJsonbP(v[10]));
	ev->tenant = isnull[11] ? NULL : text_copy(v[11]);
	ev->traceparent = isnull[12] ? NULL : text_copy(v[12]);
	ev->occurred_at = format_timestamp(DatumGetTimestampTz(v[13]));
	ev->created_at = DatumGetTimestampTz(v[14]);
	ev->disposition = OUTBOX_EVENT_PENDING;
	ev->delivery_err = OUTBOX_DELIVERY_PENDING;
}

/*
 * event_bytes
 *		What an event weighs on the wire, as outbox.batch_max_bytes counts
 *		it: payload, key, and every header's name and value.
 */
static int64
event_bytes(const OutboxEvent *ev)
{
	/* names of the fixed headers, and generous room for seq and version */
	int64		bytes = 64 + 2 * 20;
	int			i;

	bytes += ev->payload_len + strlen(ev->key) + strlen(ev->event_id) +
		strlen(ev->event_type) + strlen(ev->aggregate_type) +
		strlen(ev->aggregate_id) + strlen(ev->occurred_at);
	if (ev->tenant != NULL)
		bytes += strlen(ev->tenant) + 6;
	if (ev->traceparent != NULL)
		bytes += strlen(ev->traceparent) + 11;
	for (i = 0; i < ev->nheaders; i++)
		bytes += strlen(ev->header_names[i]) + strlen(ev->header_values[i]);
	return bytes;
}

/*
 * fetch_events
 *		Decode the rows of portal (EVENT_COLUMNS, then for replays the queue
 *		position and dead letter flag) into an array allocated in cxt, a
 *		chunk of rows at a time, until limit events or until the next one
 *		would take the page past max_bytes (event_bytes); the first event
 *		is always taken, however large.  *cut says the page ended on bytes
 *		while rows remained.  Only a chunk of rows and the page itself are
 *		in memory at once: the decoded page is bounded by max_bytes plus
 *		one event, which is decoded to be weighed, then released.
 */
static int
fetch_events(Portal portal, int limit, int64 max_bytes,
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

			decode_event(tup, desc, ev);
			size = event_bytes(ev);
			if (n > 0 && bytes + size > max_bytes)
			{
				/* the next page starts with it; its small strings stay */
				pfree(ev->payload);
				memset(ev, 0, sizeof(OutboxEvent));
				*cut = true;
				break;
			}
			if (desc->natts > EVENT_NCOLUMNS)
			{
				bool		isnull;

				ev->queue_position = DatumGetInt64(SPI_getbinval(tup, desc, EVENT_NCOLUMNS + 1, &isnull));
				ev->dead_letter = DatumGetBool(SPI_getbinval(tup, desc, EVENT_NCOLUMNS + 2, &isnull));
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
 *		(fetch_events).  Returns how many; *cut says the bytes ended the page
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
	n = fetch_events(portal, limit, max_bytes, events, cxt, cut);
	SPI_cursor_close(portal);
	SPI_finish();
	return n;
}

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
		SPIPlanPtr	plan;

		if (batch_done)
			plan = SPI_prepare("UPDATE outbox.relay_progress SET"
							   " prev_snapshot = $1::pg_catalog.pg_snapshot,"
							   " batch_snapshot = NULL, batch_last_id = NULL,"
							   " published = published OPERATOR(pg_catalog.+) $2,"
							   " batches = batches OPERATOR(pg_catalog.+) 1,"
							   " updated_at = pg_catalog.now()"
							   " WHERE relay = 'default'",
							   3, types);
		else
			plan = SPI_prepare("UPDATE outbox.relay_progress SET"
							   " batch_snapshot = $1::pg_catalog.pg_snapshot,"
							   " batch_last_id = $3,"
							   " published = published OPERATOR(pg_catalog.+) $2,"
							   " updated_at = pg_catalog.now()"
							   " WHERE relay = 'default'",
							   3, types);
		if (plan == NULL)
			elog(ERROR, "could not prepare progress update: %s",
				 SPI_result_code_string(SPI_result));
		SPI_keepplan(plan);
		*planp = plan;
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
 * head_holds
 *		Whether the head an event was parked behind still holds it back:
 *		its dead letter is quarantined (or parked itself).  Answered from the
 *		database, not from the relay's blocked list, which may predate a
 *		replay() or discard() that committed while the page was in flight.
 *		The head's row stays locked until the caller's transaction ends, so
 *		a replay() or discard() of it either committed before (and is seen
 *		here) or waits for this transaction, and then finds the parked row.
 *		A head without a dead letter holds nothing back.
 */
static bool
head_holds(const char *head)
{
	static SPIPlanPtr plan = NULL;
	Datum		values[1];
	bool		isnull;
	char	   *state;
	bool		holds;

	if (plan == NULL)
	{
		Oid			types[1] = {TEXTOID};

		plan = SPI_prepare("SELECT d.state FROM outbox.dead_letters d"
						   " WHERE d.event_id OPERATOR(pg_catalog.=) $1::uuid FOR SHARE",
						   1, types);
		if (plan == NULL)
			elog(ERROR, "could not prepare head lookup: %s",
				 SPI_result_code_string(SPI_result));
		SPI_keepplan(plan);
	}
	values[0] = CStringGetTextDatum(head);
	if (SPI_execute_plan(plan, values, NULL, false, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not look up dead letter %s", head);
	if (SPI_processed == 0)
		return false;
	state = TextDatumGetCString(SPI_getbinval(SPI_tuptable->vals[0],
											  SPI_tuptable->tupdesc, 1, &isnull));
	holds = strcmp(state, "quarantined") == 0 || strcmp(state, "parked") == 0;
	pfree(state);
	return holds;
}

/*
 * OutboxStoreRecordDeadLetters
 *		Record the quarantined and parked events of a page (with a copy of
 *		each envelope).  A parked event whose head no longer holds it back
 *		(replayed, discarded, or queued for replay since the page was sent;
 *		see head_holds) joins the replay queue instead, behind its head.
 *		Runs in the transaction that saves the page.  Events come in id
 *		order, so a head quarantined in the same page is recorded before
 *		what parks behind it.  Returns how many were queued.
 */
int
OutboxStoreRecordDeadLetters(OutboxEvent *events, int n)
{
	static SPIPlanPtr insert_plan = NULL;
	static SPIPlanPtr queue_plan = NULL;
	int			i;
	int			queued = 0;
	const char *last_head = NULL;	/* the head last asked about */
	bool		last_holds = false;

	SPI_connect();
	if (insert_plan == NULL)
	{
		Oid			types[8] = {INT8OID, TEXTOID, TEXTOID, TEXTOID, TEXTOID,
		INT4OID, TIMESTAMPTZOID, TIMESTAMPTZOID};

		insert_plan = SPI_prepare(
								  "INSERT INTO outbox.dead_letters AS d (event_id, event_pk, aggregate_type,"
								  " aggregate_id, seq, event_type, topic, state, blocked_by, error_class,"
								  " last_error, attempts, first_failed_at, last_failed_at, envelope)"
								  " SELECT e.event_id, e.id, e.aggregate_type, e.aggregate_id, e.seq,"
								  " e.event_type, e.topic, $2, $3::uuid, $4, $5, $6, $7, $8, pg_catalog.to_jsonb(e)"
								  " FROM outbox.events e WHERE e.id OPERATOR(pg_catalog.=) $1"
								  " ON CONFLICT (event_id) DO UPDATE SET state = excluded.state,"
								  " event_pk = excluded.event_pk,"
								  " blocked_by = excluded.blocked_by,"
								  " error_class = COALESCE(excluded.error_class, d.error_class),"
								  " last_error = COALESCE(excluded.last_error, d.last_error),"
								  " attempts = d.attempts OPERATOR(pg_catalog.+) excluded.attempts,"
								  " last_failed_at = COALESCE(excluded.last_failed_at, d.last_failed_at),"
								  " quarantined_at = pg_catalog.now(), resolved_at = NULL",
								  8, types);
		if (insert_plan == NULL)
			elog(ERROR, "could not prepare dead letter insert: %s",
				 SPI_result_code_string(SPI_result));
		SPI_keepplan(insert_plan);
	}
	if (queue_plan == NULL)
	{
		Oid			types[1] = {INT8OID};

		queue_plan = SPI_prepare("INSERT INTO outbox.replay_queue (event_pk, dead_letter)"
								 " VALUES ($1, true)", 1, types);
		if (queue_plan == NULL)
			elog(ERROR, "could not prepare replay queue insert: %s",
				 SPI_result_code_string(SPI_result));
		SPI_keepplan(queue_plan);
	}

	for (i = 0; i < n; i++)
	{
		OutboxEvent *ev = &events[i];
		Datum		values[8];
		char		nulls[8] = {' ', ' ', ' ', ' ', ' ', ' ', ' ', ' '};
		const char *state;
		const char *cls = ev->last_class == OUTBOX_ERROR_NONE ? NULL :
			OutboxErrorClassName(ev->last_class);
		bool		requeue = false;

		if (ev->disposition == OUTBOX_EVENT_QUARANTINED)
			state = "quarantined";
		else if (ev->disposition == OUTBOX_EVENT_PARKED)
		{
			if (ev->blocked_by != NULL &&
				(last_head == NULL || strcmp(last_head, ev->blocked_by) != 0))
			{
				last_head = ev->blocked_by;
				last_holds = head_holds(last_head);
			}
			requeue = ev->blocked_by == NULL || !last_holds;
			state = requeue ? "replaying" : "parked";
		}
		else
			continue;

		values[0] = Int64GetDatum(ev->id);
		values[1] = CStringGetTextDatum(state);
		if (ev->blocked_by != NULL)
			values[2] = CStringGetTextDatum(ev->blocked_by);
		else
			nulls[2] = 'n';
		if (cls != NULL && ev->attempts > 0)
		{
			values[3] = CStringGetTextDatum(cls);
			values[4] = CStringGetTextDatum(OutboxDeliveryErrorText(ev->last_err, ev->last_err_local));
			values[6] = TimestampTzGetDatum(ev->first_failed_at);
			values[7] = TimestampTzGetDatum(ev->last_failed_at);
		}
		else
			nulls[3] = nulls[4] = nulls[6] = nulls[7] = 'n';
		values[5] = Int32GetDatum(ev->attempts);

		if (SPI_execute_plan(insert_plan, values, nulls, false, 0) != SPI_OK_INSERT)
			elog(ERROR, "could not record dead letter for event %s", ev->event_id);
		if (requeue)
		{
			if (SPI_execute_plan(queue_plan, values, NULL, false, 0) != SPI_OK_INSERT)
				elog(ERROR, "could not queue parked event %s", ev->event_id);
			queued++;
		}
	}
	SPI_finish();
	return queued;
}

/*
 * OutboxStoreLoadBlocked
 *		The aggregates whose events must wait: those with a quarantined,
 *		parked or replaying dead letter.  The head is the earliest.
 */
List *
OutboxStoreLoadBlocked(MemoryContext cxt)
{
	List	   *result = NIL;
	uint64		i;
	int			rc;

	SPI_connect();
	rc = SPI_execute("SELECT DISTINCT ON (aggregate_type, aggregate_id)"
					 " aggregate_type, aggregate_id,"
					 " COALESCE(blocked_by, event_id)::text"
					 " FROM outbox.dead_letters"
					 " WHERE state IN ('quarantined', 'parked', 'replaying')"
					 " ORDER BY aggregate_type, aggregate_id, event_pk",
					 true, 0);
	if (rc != SPI_OK_SELECT)
		elog(ERROR, "could not read dead letters: %s", SPI_result_code_string(rc));
	for (i = 0; i < SPI_processed; i++)
	{
		HeapTuple	tup = SPI_tuptable->vals[i];
		TupleDesc	desc = SPI_tuptable->tupdesc;
		MemoryContext old = MemoryContextSwitchTo(cxt);
		OutboxBlocked *b = palloc(sizeof(OutboxBlocked));

		b->aggregate_type = getstr(tup, desc, 1, cxt);
		b->aggregate_id = getstr(tup, desc, 2, cxt);
		b->head = getstr(tup, desc, 3, cxt);
		result = lappend(result, b);
		MemoryContextSwitchTo(old);
	}
	SPI_finish();
	return result;
}

/*
 * OutboxStoreReadReplays
 *		The next up to limit queued replays, in queue order, and at most
 *		outbox.batch_max_bytes of them past the first (fetch_events).
 */
int
OutboxStoreReadReplays(int limit, OutboxEvent **events, MemoryContext cxt)
{
	Datum		values[1];
	Oid			types[1] = {INT4OID};
	Portal		portal;
	bool		cut;
	int			n;

	SPI_connect();
	values[0] = Int32GetDatum(limit);
	portal = SPI_cursor_open_with_args(NULL,
									   "SELECT " EVENT_COLUMNS ", q.position, q.dead_letter"
									   " FROM outbox.replay_queue q"
									   " JOIN outbox.events e ON e.id OPERATOR(pg_catalog.=) q.event_pk"
									   " ORDER BY q.position LIMIT $1",
									   1, types, values, NULL, true, 0);
	if (portal == NULL)
		elog(ERROR, "could not read the replay queue: %s", SPI_result_code_string(SPI_result));
	/* what the bytes leave out stays queued for the next page */
	n = fetch_events(portal, limit, outbox_batch_max_bytes, events, cxt, &cut);
	SPI_cursor_close(portal);
	SPI_finish();
	return n;
}

/*
 * release_parked
 *		Queue for replay, in id order, every parked event whose head no
 *		longer holds it back (replayed, discarded, queued, or gone): such an
 *		event would otherwise wait for a replay() or discard() that already
 *		happened.  outbox.replay() and outbox.discard() do the same.
 */
static void
release_parked(void)
{
	int			rc;

	SPI_connect();
	rc = SPI_execute("WITH released AS (UPDATE outbox.dead_letters d SET state = 'replaying'"
					 " WHERE d.state OPERATOR(pg_catalog.=) 'parked'"
					 " AND NOT EXISTS (SELECT 1 FROM outbox.dead_letters h"
					 "  WHERE h.event_id OPERATOR(pg_catalog.=) d.blocked_by"
					 "  AND h.state IN ('quarantined', 'parked'))"
					 " RETURNING d.event_pk)"
					 " INSERT INTO outbox.replay_queue (event_pk, dead_letter)"
					 " SELECT r.event_pk, true FROM released r ORDER BY r.event_pk",
					 false, 0);
	if (rc != SPI_OK_INSERT)
		elog(ERROR, "could not release parked events: %s", SPI_result_code_string(rc));
	SPI_finish();
}

/*
 * OutboxStoreFinishReplays
 *		A replay page is settled: delivered events leave the queue (dead
 *		letters among them are resolved).  An event refused again is
 *		quarantined again and, with outbox.poison_policy = 'block', every
 *		event of its aggregate queued behind it (released dead letters and
 *		replay(since, until) rows alike, including those parked in this
 *		page) leaves the queue and is parked behind it, so that nothing of
 *		the aggregate overtakes it.  Last, parked events whose head no
 *		longer holds them back join the queue (release_parked).
 */
void
OutboxStoreFinishReplays(OutboxEvent *events, int n)
{
	int			i;

	SPI_connect();
	for (i = 0; i < n; i++)
	{
		OutboxEvent *ev = &events[i];
		Datum		values[3];
		Oid			types[3] = {INT8OID, INT8OID, TEXTOID};
		int			rc;

		values[0] = Int64GetDatum(ev->queue_position);
		values[1] = Int64GetDatum(ev->id);
		if (ev->disposition == OUTBOX_EVENT_DELIVERED)
		{
			rc = SPI_execute_with_args("WITH gone AS (DELETE FROM outbox.replay_queue"
									   " WHERE position OPERATOR(pg_catalog.=) $1 RETURNING event_pk, dead_letter)"
									   " UPDATE outbox.dead_letters d SET state = 'replayed', resolved_at = pg_catalog.now()"
									   " FROM gone WHERE gone.dead_letter AND d.event_pk OPERATOR(pg_catalog.=) gone.event_pk"
									   " AND d.state IN ('replaying', 'quarantined')",
									   2, types, values, NULL, false, 0);
			if (rc != SPI_OK_UPDATE)
				elog(ERROR, "could not settle replay: %s", SPI_result_code_string(rc));
		}
		else if (ev->disposition == OUTBOX_EVENT_QUARANTINED)
		{
			if (outbox_poison_policy == OUTBOX_POISON_BLOCK)
			{
				values[2] = CStringGetTextDatum(ev->event_id);
				rc = SPI_execute_with_args("WITH gone AS (DELETE FROM outbox.replay_queue q USING outbox.events e"
										   " WHERE e.id OPERATOR(pg_catalog.=) q.event_pk"
										   " AND q.position OPERATOR(pg_catalog.>) $1"
										   " AND (e.aggregate_type, e.aggregate_id) OPERATOR(pg_catalog.=)"
										   " (SELECT aggregate_type, aggregate_id"
										   "  FROM outbox.events WHERE id OPERATOR(pg_catalog.=) $2)"
										   " RETURNING q.event_pk)"
										   " INSERT INTO outbox.dead_letters AS d (event_id, event_pk, aggregate_type,"
										   " aggregate_id, seq, event_type, topic, state, blocked_by, envelope)"
										   " SELECT e.event_id, e.id, e.aggregate_type, e.aggregate_id, e.seq,"
										   " e.event_type, e.topic, 'parked', $3::uuid, pg_catalog.to_jsonb(e)"
										   " FROM gone JOIN outbox.events e ON e.id OPERATOR(pg_catalog.=) gone.event_pk"
										   " ON CONFLICT (event_id) DO UPDATE SET state = 'parked', event_pk = excluded.event_pk,"
										   " blocked_by = excluded.blocked_by, resolved_at = NULL",
										   3, types, values, NULL, false, 0);
				if (rc != SPI_OK_INSERT)
					elog(ERROR, "could not park behind a replay: %s", SPI_result_code_string(rc));
			}
			rc = SPI_execute_with_args("DELETE FROM outbox.replay_queue WHERE position OPERATOR(pg_catalog.=) $1",
									   1, types, values, NULL, false, 0);
			if (rc != SPI_OK_DELETE)
				elog(ERROR, "could not dequeue a replay: %s", SPI_result_code_string(rc));
		}
	}
	SPI_finish();
	/* the quarantined and parked ones are (re)recorded the usual way */
	(void) OutboxStoreRecordDeadLetters(events, n);
	release_parked();
}

/*
 * OutboxStoreCleanup
 *		Delete up to max_events published events older than the retention;
 *		returns how many went.
 */
int64
OutboxStoreCleanup(int max_events)
{
	Datum		values[1];
	Oid			types[1] = {INT4OID};
	bool		isnull;
	int64		deleted = 0;
	int			rc;

	SPI_connect();

	/*
	 * The oldest event by id is about the oldest by age: when it is within
	 * the retention there is nothing to delete, and one index probe saves
	 * cleanup() a scan of the whole log.
	 */
	values[0] = Int32GetDatum(outbox_retention);
	rc = SPI_execute_with_args("SELECT e.created_at OPERATOR(pg_catalog.<)"
							   " (pg_catalog.now() OPERATOR(pg_catalog.-) pg_catalog.make_interval(secs => $1))"
							   " FROM outbox.events e ORDER BY e.id LIMIT 1",
							   1, types, values, NULL, true, 1);
	if (rc != SPI_OK_SELECT)
		elog(ERROR, "could not look for expired events: %s", SPI_result_code_string(rc));
	if (SPI_processed == 0 ||
		!DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull)))
	{
		SPI_finish();
		return 0;
	}

	values[0] = Int32GetDatum(max_events);
	rc = SPI_execute_with_args("SELECT events FROM outbox.cleanup(false, $1)",
							   1, types, values, NULL, false, 0);
	if (rc != SPI_OK_SELECT)
		elog(ERROR, "could not clean up: %s", SPI_result_code_string(rc));
	if (SPI_processed == 1)
		deleted = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
	SPI_finish();
	return deleted;
}
