/*-------------------------------------------------------------------------
 *
 * relay/status.c
 *		SQL-visible state of the relays: the snapshot status(), metrics()
 *		(status_metrics.c) and health() (status_health.c) report, and
 *		status() itself.
 *
 * Invariants: figures come from a copy of the relay's slot (OutboxSlotRead,
 * which takes it under the slot's locks: nothing here touches shared memory
 * itself) and the small dead-letter table while a relay runs.  When none
 * runs, nobody keeps the slot's figures, so the backlog and the oldest
 * event's age are counted from outbox.events against the relay's recorded
 * progress, and the snapshot says why no relay runs.  The three functions
 * read one OutboxStatusSnapshot each (OutboxStatusTake) and only format
 * it.  Nothing here writes a table.  What needs the library preloaded says
 * so with a clear error.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "commands/dbcommands.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

#include "base/base.h"
#include "shmem/shmem.h"
#include "relay/relay.h"

PG_FUNCTION_INFO_V1(outbox_status);

/* status()'s columns, in its OUT order */
#define STATUS_NATTS 25

/* a row being filled column by column */
typedef struct StatusRow
{
	Datum		values[STATUS_NATTS];
	bool		nulls[STATUS_NATTS];
	int			n;
} StatusRow;

/* the figures live in shared memory, which only the preload sets up */
static void
require_preload(void)
{
	if (!OutboxShmemAvailable())
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("outbox relays are not running"),
				 errdetail("The outbox library was not loaded at server start."),
				 errhint("Add outbox to shared_preload_libraries and restart the server.")));
}

/* quarantined and parked events, and those queued for a replay */
static void
count_dead_letters(OutboxStatusSnapshot *snap)
{
	bool		isnull;

	SPI_connect();
	if (SPI_execute("SELECT pg_catalog.count(*) FILTER (WHERE state OPERATOR(pg_catalog.=) 'quarantined'),"
					" pg_catalog.count(*) FILTER (WHERE state OPERATOR(pg_catalog.<>) 'quarantined'),"
					" (SELECT pg_catalog.count(*) FROM outbox.replay_queue)"
					" FROM outbox.dead_letters WHERE state OPERATOR(pg_catalog.=) ANY ('{quarantined,parked,replaying}'::pg_catalog.text[])",
					true, 1) != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "could not count dead letters");
	snap->quarantined = DatumGetInt64(OutboxSpiValue(1, &isnull));
	snap->parked = DatumGetInt64(OutboxSpiValue(2, &isnull));
	snap->queued = DatumGetInt64(OutboxSpiValue(3, &isnull));
	/* restored events the relay has not judged yet (none before 1.1) */
	if (SPI_execute("SELECT pg_catalog.to_regclass('outbox.restored_events') IS NOT NULL",
					true, 1) == SPI_OK_SELECT && SPI_processed == 1 &&
		DatumGetBool(OutboxSpiValue(1, &isnull)) &&
		SPI_execute("SELECT pg_catalog.count(*) FROM outbox.restored_events",
					true, 1) == SPI_OK_SELECT && SPI_processed == 1)
		snap->queued += DatumGetInt64(OutboxSpiValue(1, &isnull));
	SPI_finish();
}

/*
 * Held partitions, from outbox.held (none before 1.4): how many events and
 * the oldest one's age, which join the backlog and its age; the samples of
 * metrics(); the oldest hold for health().  The table holds rows only while
 * a partition is held, so this reads nothing in the usual case.
 */
static const char *const held_sql =
"SELECT s.topic, s.kafka_partition, s.events,"
" pg_catalog.date_part('epoch', pg_catalog.now() OPERATOR(pg_catalog.-) s.since),"
" pg_catalog.date_part('epoch', pg_catalog.now() OPERATOR(pg_catalog.-) e.created_at)"
" FROM (SELECT h.topic, h.kafka_partition, pg_catalog.count(*) AS events,"
"  pg_catalog.min(h.held_at) AS since, pg_catalog.min(h.id) AS first"
"  FROM outbox.held h GROUP BY h.topic, h.kafka_partition) s"
" LEFT JOIN outbox.events e ON e.id OPERATOR(pg_catalog.=) s.first"
" ORDER BY s.since, s.topic, s.kafka_partition";

static void
count_held(OutboxStatusSnapshot *snap)
{
	bool		isnull;
	uint64		i;
	StringInfoData samples;
	MemoryContext outer = CurrentMemoryContext;
	MemoryContext spi;

	snap->held_age = -1;
	snap->held_oldest_age = -1;
	initStringInfo(&samples);
	SPI_connect();
	if (SPI_execute("SELECT pg_catalog.to_regclass('outbox.held') IS NOT NULL",
					true, 1) != SPI_OK_SELECT || SPI_processed != 1 ||
		!DatumGetBool(OutboxSpiValue(1, &isnull)))
	{
		SPI_finish();
		return;
	}
	if (SPI_execute(held_sql, true, 0) != SPI_OK_SELECT)
		elog(ERROR, "could not count held events");
	/* what is kept outlives SPI's memory */
	spi = MemoryContextSwitchTo(outer);
	for (i = 0; i < SPI_processed; i++)
	{
		HeapTuple	tup = SPI_tuptable->vals[i];
		TupleDesc	desc = SPI_tuptable->tupdesc;
		char	   *topic = SPI_getvalue(tup, desc, 1);
		char	   *part = SPI_getvalue(tup, desc, 2);
		char	   *events = SPI_getvalue(tup, desc, 3);

		Datum		oldest = SPI_getbinval(tup, desc, 5, &isnull);

		if (!isnull)
			snap->held_oldest_age = Max(snap->held_oldest_age, DatumGetFloat8(oldest));
		snap->held_events += DatumGetInt64(SPI_getbinval(tup, desc, 3, &isnull));
		snap->held_partitions++;
		/* Kafka topic names need no escaping in a label: [a-zA-Z0-9._-] */
		appendStringInfo(&samples, ",topic=\"%s\",partition=\"%s\"} %s\n", topic, part, events);
		if (i == 0)
		{
			snap->held_age = DatumGetFloat8(SPI_getbinval(tup, desc, 4, &isnull));
			snap->oldest_hold = psprintf("%s[%s]", topic, part);
		}
	}
	if (SPI_processed > 0)
		snap->held_metrics = samples.data;
	MemoryContextSwitchTo(spi);
	SPI_finish();
}

/*
 * The events not yet delivered, from the log, for when no relay runs: those
 * committed now (visible in the current snapshot) that are not in the
 * delivered snapshot prev, less the part of the open batch (visible in
 * batch_snapshot) acknowledged up to batch_last_id.  "Not in prev" is
 * written as the relay writes it (txid >= xmax or in xip) so the txid
 * index serves it.  Run by SECURITY DEFINER functions: every operator is
 * qualified.
 */
static const char *const backlog_sql =
"SELECT pg_catalog.count(*), pg_catalog.min(e.created_at)"
" FROM outbox.events e, outbox.relay_progress p"
" WHERE p.relay OPERATOR(pg_catalog.=) 'default'"
" AND pg_catalog.pg_visible_in_snapshot(e.txid, pg_catalog.pg_current_snapshot())"
" AND (p.prev_snapshot IS NULL"
"  OR e.txid OPERATOR(pg_catalog.>=) pg_catalog.pg_snapshot_xmax(p.prev_snapshot)"
"  OR e.txid OPERATOR(pg_catalog.=) ANY (ARRAY(SELECT pg_catalog.pg_snapshot_xip(p.prev_snapshot))))"
" AND NOT (p.batch_snapshot IS NOT NULL"
"  AND pg_catalog.pg_visible_in_snapshot(e.txid, p.batch_snapshot)"
"  AND e.id OPERATOR(pg_catalog.<=) COALESCE(p.batch_last_id, 0))";

/*
 * OutboxRelayCountBacklog
 *		The backlog and its oldest event's creation time (0: none) counted
 *		in outbox.events, for status() when no relay runs and for a relay
 *		starting, which knows nothing else before it reads a page.  Inside
 *		a transaction.
 */
void
OutboxRelayCountBacklog(int64 *backlog, TimestampTz *oldest)
{
	bool		isnull;
	Datum		d;

	*backlog = 0;
	*oldest = 0;
	SPI_connect();
	if (SPI_execute(backlog_sql, true, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not count the backlog");
	if (SPI_processed == 1)
	{
		*backlog = DatumGetInt64(OutboxSpiValue(1, &isnull));
		d = OutboxSpiValue(2, &isnull);
		*oldest = isnull ? 0 : DatumGetTimestampTz(d);
	}
	SPI_finish();
}

/*
 * count_backlog_from_log
 *		No relay runs: the backlog and oldest age from outbox.events.
 */
static void
count_backlog_from_log(OutboxStatusSnapshot *snap, TimestampTz now)
{
	TimestampTz oldest;

	OutboxRelayCountBacklog(&snap->backlog, &oldest);
	snap->oldest_age = oldest == 0 ? -1 : (double) (now - oldest) / USECS_PER_SEC;
}

/*
 * no_relay_reason
 *		Why this database has no relay, as far as shared memory tells.
 */
static char *
no_relay_reason(bool has_slot, const OutboxSlotView *view)
{
	if (!has_slot && view->slots_full)
		return psprintf("no relay: outbox.max_databases (%d) reached",
						outbox_max_databases);
	if (view->no_worker_since != 0)
		return pstrdup("no relay: no free background worker slot (max_worker_processes)");
	return pstrdup("the relay of this database is not running");
}

/*
 * OutboxStatusTake
 *		Copy this database's slot and derive the figures; an error when the
 *		library was not preloaded.  Strings are palloc'd in the caller's
 *		context.
 */
void
OutboxStatusTake(OutboxStatusSnapshot *snap)
{
	TimestampTz now = GetCurrentTimestamp();
	bool		has_slot;

	require_preload();
	memset(snap, 0, sizeof(OutboxStatusSnapshot));
	has_slot = OutboxSlotRead(MyDatabaseId, &snap->slot);
	snap->running = snap->slot.pid != 0;
	snap->backlog = snap->slot.backlog;
	snap->oldest_age = snap->slot.oldest_pending != 0 ?
		(double) (now - snap->slot.oldest_pending) / USECS_PER_SEC : -1;
	if (!snap->running)
	{
		snap->no_relay = no_relay_reason(has_slot, &snap->slot);
		count_backlog_from_log(snap, now);
	}
	count_dead_letters(snap);
	count_held(snap);
	/* held events wait too: they count in the backlog and its age */
	snap->backlog += snap->queued + snap->held_events;
	snap->oldest_age = Max(snap->oldest_age, snap->held_oldest_age);
}

/*
 * percentile
 *		The q-quantile of a bucketed latency distribution, in seconds, by
 *		linear interpolation inside its bucket; NaN-free: -1 when empty.
 */
static double
percentile(const uint64 *buckets, double q)
{
	uint64		total = 0;
	uint64		seen = 0;
	double		rank;
	int			b;

	for (b = 0; b < OUTBOX_LAT_NBUCKETS; b++)
		total += buckets[b];
	if (total == 0)
		return -1;
	rank = q * total;
	for (b = 0; b < OUTBOX_LAT_NBUCKETS; b++)
	{
		double		lo = b == 0 ? 0 : OutboxLatencyBounds[b - 1];
		double		hi = b < OUTBOX_LAT_NBUCKETS - 1 ? OutboxLatencyBounds[b] : lo * 2;

		if (buckets[b] > 0 && seen + buckets[b] >= rank)
			return (lo + (hi - lo) * (rank - seen) / buckets[b]) / 1000000.0;
		seen += buckets[b];
	}
	return OutboxLatencyBounds[OUTBOX_LAT_NBUCKETS - 2] / 1000000.0;
}

/*
 * OutboxStatusStateName
 *		The state operators see: the relay's, or stopped when none runs.
 */
const char *
OutboxStatusStateName(const OutboxStatusSnapshot *snap)
{
	return OutboxRelayStateName(snap->running ? snap->slot.state : OUTBOX_RELAY_STOPPED);
}

/* the next column: value, or NULL when !present */
static void
put(StatusRow *row, bool present, Datum value)
{
	Assert(row->n < STATUS_NATTS);
	row->values[row->n] = present ? value : (Datum) 0;
	row->nulls[row->n] = !present;
	row->n++;
}

/*
 * outbox_status
 *		SQL outbox.status(): this database's relay, one row.
 */
Datum
outbox_status(PG_FUNCTION_ARGS)
{
	OutboxStatusSnapshot snap;
	const OutboxSlotView *s = &snap.slot;
	TupleDesc	tupdesc;
	StatusRow	row;
	double		p50;

	OutboxStatusTake(&snap);
	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "return type must be a row type");

	memset(&row, 0, sizeof(row));
	put(&row, true, CStringGetTextDatum(get_database_name(MyDatabaseId)));
	put(&row, true, CStringGetTextDatum(OutboxStatusStateName(&snap)));
	put(&row, snap.running, Int32GetDatum(s->pid));
	put(&row, true, CStringGetTextDatum(outbox_kafka_brokers));
	put(&row, snap.running && s->brokers_up >= 0, Int32GetDatum(s->brokers_up));
	put(&row, true, Int64GetDatum(snap.backlog));
	put(&row, snap.oldest_age >= 0, Float8GetDatum(snap.oldest_age));
	put(&row, true, Int64GetDatum((int64) s->published));
	put(&row, true, Int64GetDatum((int64) s->published_bytes));
	put(&row, true, Int64GetDatum((int64) s->minute_events));
	put(&row, true, Int64GetDatum((int64) s->minute_bytes));
	put(&row, true, Int64GetDatum(snap.quarantined));
	put(&row, true, Int64GetDatum(snap.parked));
	put(&row, true, Int64GetDatum((int64) s->retries));
	put(&row, true, Int64GetDatum((int64) s->failures[OUTBOX_ERROR_TRANSIENT]));
	put(&row, true, Int64GetDatum((int64) s->failures[OUTBOX_ERROR_PERMANENT]));
	put(&row, true, Int64GetDatum((int64) s->failures[OUTBOX_ERROR_FATAL]));
	put(&row, s->last_error_at != 0, CStringGetTextDatum(s->last_error));
	put(&row, s->last_error_at != 0, TimestampTzGetDatum(s->last_error_at));
	put(&row, s->last_delivery != 0, TimestampTzGetDatum(s->last_delivery));
	p50 = percentile(s->minute_latency, 0.50);
	put(&row, p50 >= 0, Float8GetDatum(p50 * 1000));
	put(&row, p50 >= 0, Float8GetDatum(percentile(s->minute_latency, 0.95) * 1000));
	put(&row, p50 >= 0, Float8GetDatum(percentile(s->minute_latency, 0.99) * 1000));
	put(&row, true, Int32GetDatum(s->page_size));
	put(&row, snap.running, TimestampTzGetDatum(s->started_at));
	Assert(row.n == tupdesc->natts);

	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(tupdesc, row.values, row.nulls)));
}
