/*-------------------------------------------------------------------------
 *
 * status.c
 *		SQL-visible state of the relays: status(), metrics(), health().
 *
 * Invariants: figures come from shared memory (the relay's slot) and the
 * small dead-letter table while a relay runs.  When none runs, nobody keeps
 * the slot's figures, so the backlog and the oldest event's age are
 * counted from outbox.events against the relay's recorded progress, and
 * health() names why no relay runs.  Nothing here writes a table.  What
 * needs the library preloaded says so with a clear error.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "commands/dbcommands.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

#include "outbox.h"

PG_FUNCTION_INFO_V1(outbox_status);
PG_FUNCTION_INFO_V1(outbox_metrics);
PG_FUNCTION_INFO_V1(outbox_health);

/* Everything status(), metrics() and health() report, in one place. */
typedef struct StatusSnapshot
{
	OutboxSlot	slot;			/* a copy, taken under the slot's lock */
	bool		running;		/* a relay process is attached */
	int64		backlog;
	double		oldest_age;		/* seconds, < 0 when nothing is pending */
	uint64		last_minute_events;
	uint64		last_minute_bytes;
	uint64		window_latency[OUTBOX_LAT_NBUCKETS];
	int64		quarantined;
	int64		parked;
	int64		queued;			/* replay queue and unjudged restored events */
	char	   *no_relay;		/* why no relay runs, when none does */
} StatusSnapshot;

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

static void
count_dead_letters(StatusSnapshot *snap)
{
	bool		isnull;

	SPI_connect();
	if (SPI_execute("SELECT pg_catalog.count(*) FILTER (WHERE state OPERATOR(pg_catalog.=) 'quarantined'),"
					" pg_catalog.count(*) FILTER (WHERE state OPERATOR(pg_catalog.<>) 'quarantined'),"
					" (SELECT pg_catalog.count(*) FROM outbox.replay_queue)"
					" FROM outbox.dead_letters WHERE state OPERATOR(pg_catalog.=) ANY ('{quarantined,parked,replaying}'::pg_catalog.text[])",
					true, 1) != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "could not count dead letters");
	snap->quarantined = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0],
													SPI_tuptable->tupdesc, 1, &isnull));
	snap->parked = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0],
											   SPI_tuptable->tupdesc, 2, &isnull));
	snap->queued = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0],
											   SPI_tuptable->tupdesc, 3, &isnull));
	/* restored events the relay has not judged yet (none before 1.1) */
	if (SPI_execute("SELECT pg_catalog.to_regclass('outbox.restored_events') IS NOT NULL",
					true, 1) == SPI_OK_SELECT && SPI_processed == 1 &&
		DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull)) &&
		SPI_execute("SELECT pg_catalog.count(*) FROM outbox.restored_events",
					true, 1) == SPI_OK_SELECT && SPI_processed == 1)
		snap->queued += DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0],
													SPI_tuptable->tupdesc, 1, &isnull));
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
 * count_backlog_from_log
 *		No relay runs: the backlog and oldest age from outbox.events.
 */
static void
count_backlog_from_log(StatusSnapshot *snap, TimestampTz now)
{
	bool		isnull;
	Datum		d;

	SPI_connect();
	if (SPI_execute(backlog_sql, true, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not count the backlog");
	if (SPI_processed == 1)
	{
		snap->backlog = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0],
													SPI_tuptable->tupdesc, 1, &isnull));
		d = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2, &isnull);
		snap->oldest_age = isnull ? -1 :
			(double) (now - DatumGetTimestampTz(d)) / USECS_PER_SEC;
	}
	SPI_finish();
}

/*
 * no_relay_reason
 *		Why this database has no relay, as far as shared memory tells.
 */
static char *
no_relay_reason(bool has_slot)
{
	if (!has_slot && OutboxSlotsInUse() >= outbox_max_databases)
		return psprintf("no relay: outbox.max_databases (%d) reached",
						outbox_max_databases);
	if (OutboxNoWorkerSince() != 0)
		return pstrdup("no relay: no free background worker slot (max_worker_processes)");
	return pstrdup("the relay of this database is not running");
}

/*
 * take_snapshot
 *		Copy this database's slot and derive the figures.
 */
static void
take_snapshot(StatusSnapshot *snap)
{
	OutboxSlot *slot;
	TimestampTz now = GetCurrentTimestamp();
	int64		period = now / (OUTBOX_WINDOW_SECS * USECS_PER_SEC);
	int			w;
	int			b;

	require_preload();
	memset(snap, 0, sizeof(StatusSnapshot));
	snap->slot.state = OUTBOX_RELAY_STOPPED;
	snap->slot.brokers_up = -1;
	slot = OutboxSlotFind(MyDatabaseId);
	if (slot != NULL)
	{
		SpinLockAcquire(&slot->mutex);
		memcpy(&snap->slot, slot, sizeof(OutboxSlot));
		SpinLockRelease(&slot->mutex);
		/* the slot may have been handed to another database meanwhile */
		if (snap->slot.dboid != MyDatabaseId)
		{
			memset(&snap->slot, 0, sizeof(OutboxSlot));
			snap->slot.state = OUTBOX_RELAY_STOPPED;
			snap->slot.brokers_up = -1;
		}
	}
	snap->running = snap->slot.pid != 0;
	snap->backlog = snap->slot.batch_remaining +
		(int64) (snap->slot.committed_events - snap->slot.committed_at_open);
	if (snap->backlog < 0)
		snap->backlog = 0;
	snap->oldest_age = snap->slot.oldest_pending != 0 ?
		(double) (now - snap->slot.oldest_pending) / USECS_PER_SEC : -1;
	if (!snap->running)
	{
		snap->no_relay = no_relay_reason(snap->slot.dboid == MyDatabaseId);
		count_backlog_from_log(snap, now);
	}

	for (w = 0; w < OUTBOX_WINDOWS; w++)
	{
		OutboxWindow *win = &snap->slot.window[w];

		if (win->period <= period - OUTBOX_WINDOWS || win->period > period)
			continue;
		/* the last minute: whole periods, plus the one under way */
		snap->last_minute_events += win->events;
		snap->last_minute_bytes += win->bytes;
		for (b = 0; b < OUTBOX_LAT_NBUCKETS; b++)
			snap->window_latency[b] += win->latency[b];
	}
	count_dead_letters(snap);
	snap->backlog += snap->queued;
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

static const char *
state_name(const StatusSnapshot *snap)
{
	return snap->running ? OutboxRelayStateName(snap->slot.state) : "stopped";
}

/*
 * outbox_status
 *		SQL outbox.status(): this database's relay, one row.
 */
Datum
outbox_status(PG_FUNCTION_ARGS)
{
	StatusSnapshot snap;
	TupleDesc	tupdesc;
	Datum		values[25];
	bool		nulls[25] = {0};
	int			i = 0;
	double		p;

	take_snapshot(&snap);
	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "return type must be a row type");

#define PUT(d) (values[i++] = (d))
#define PUT_NULL() (nulls[i++] = true)
	PUT(CStringGetTextDatum(get_database_name(MyDatabaseId)));
	PUT(CStringGetTextDatum(state_name(&snap)));
	if (snap.running)
		PUT(Int32GetDatum(snap.slot.pid));
	else
		PUT_NULL();
	PUT(CStringGetTextDatum(outbox_kafka_brokers));
	if (snap.running && snap.slot.brokers_up >= 0)
		PUT(Int32GetDatum(snap.slot.brokers_up));
	else
		PUT_NULL();
	PUT(Int64GetDatum(snap.backlog));
	if (snap.oldest_age >= 0)
		PUT(Float8GetDatum(snap.oldest_age));
	else
		PUT_NULL();
	PUT(Int64GetDatum((int64) snap.slot.published));
	PUT(Int64GetDatum((int64) snap.slot.published_bytes));
	PUT(Int64GetDatum((int64) snap.last_minute_events));
	PUT(Int64GetDatum((int64) snap.last_minute_bytes));
	PUT(Int64GetDatum(snap.quarantined));
	PUT(Int64GetDatum(snap.parked));
	PUT(Int64GetDatum((int64) snap.slot.retries));
	PUT(Int64GetDatum((int64) snap.slot.failures[OUTBOX_ERROR_TRANSIENT]));
	PUT(Int64GetDatum((int64) snap.slot.failures[OUTBOX_ERROR_PERMANENT]));
	PUT(Int64GetDatum((int64) snap.slot.failures[OUTBOX_ERROR_FATAL]));
	if (snap.slot.last_error_at != 0)
	{
		PUT(CStringGetTextDatum(snap.slot.last_error));
		PUT(TimestampTzGetDatum(snap.slot.last_error_at));
	}
	else
	{
		PUT_NULL();
		PUT_NULL();
	}
	if (snap.slot.last_delivery != 0)
		PUT(TimestampTzGetDatum(snap.slot.last_delivery));
	else
		PUT_NULL();
	p = percentile(snap.window_latency, 0.50);
	if (p >= 0)
	{
		PUT(Float8GetDatum(p * 1000));
		PUT(Float8GetDatum(percentile(snap.window_latency, 0.95) * 1000));
		PUT(Float8GetDatum(percentile(snap.window_latency, 0.99) * 1000));
	}
	else
	{
		PUT_NULL();
		PUT_NULL();
		PUT_NULL();
	}
	PUT(Int32GetDatum(snap.slot.page_size));
	if (snap.running)
		PUT(TimestampTzGetDatum(snap.slot.started_at));
	else
		PUT_NULL();
#undef PUT
#undef PUT_NULL
	Assert(i == tupdesc->natts);

	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(tupdesc, values, nulls)));
}

static void
metric(StringInfo buf, const char *name, const char *type, const char *help)
{
	appendStringInfo(buf, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/*
 * outbox_metrics
 *		SQL outbox.metrics(): the same figures in Prometheus text format.
 */
Datum
outbox_metrics(PG_FUNCTION_ARGS)
{
	StatusSnapshot snap;
	StringInfoData buf;
	char		labels[NAMEDATALEN * 2 + 32];
	char	   *dbname;
	const char *p;
	char	   *q;
	uint64		cumulative = 0;
	int			b;
	static const char *const states[] = {"starting", "running", "paused", "backing off", "not configured", "stopped"};
	static const OutboxErrorClass classes[] = {OUTBOX_ERROR_TRANSIENT, OUTBOX_ERROR_PERMANENT, OUTBOX_ERROR_FATAL};

	take_snapshot(&snap);

	/* label values escape backslash, quote and newline */
	dbname = get_database_name(MyDatabaseId);
	q = labels + sprintf(labels, "database=\"");
	for (p = dbname; *p && q < labels + sizeof(labels) - 4; p++)
	{
		if (*p == '\\' || *p == '"')
			*q++ = '\\';
		if (*p == '\n')
		{
			*q++ = '\\';
			*q++ = 'n';
			continue;
		}
		*q++ = *p;
	}
	strcpy(q, "\"");

	initStringInfo(&buf);
	metric(&buf, "outbox_relay_up", "gauge", "1 when the database's relay process runs.");
	appendStringInfo(&buf, "outbox_relay_up{%s} %d\n", labels, snap.running ? 1 : 0);
	metric(&buf, "outbox_relay_state", "gauge", "1 for the relay's current state.");
	for (b = 0; b < lengthof(states); b++)
		appendStringInfo(&buf, "outbox_relay_state{%s,state=\"%s\"} %d\n", labels, states[b],
						 strcmp(states[b], state_name(&snap)) == 0 ? 1 : 0);
	metric(&buf, "outbox_brokers_up", "gauge", "Kafka brokers the relay is connected to (-1 unknown).");
	appendStringInfo(&buf, "outbox_brokers_up{%s} %d\n", labels,
					 snap.running ? snap.slot.brokers_up : -1);
	metric(&buf, "outbox_backlog_events", "gauge", "Committed events not yet published (estimate).");
	appendStringInfo(&buf, "outbox_backlog_events{%s} " INT64_FORMAT "\n", labels, snap.backlog);
	metric(&buf, "outbox_oldest_pending_seconds", "gauge", "Age of the oldest event not yet published (0 when none).");
	appendStringInfo(&buf, "outbox_oldest_pending_seconds{%s} %.3f\n", labels,
					 Max(snap.oldest_age, 0));
	metric(&buf, "outbox_published_total", "counter", "Events acknowledged by Kafka since the server started.");
	appendStringInfo(&buf, "outbox_published_total{%s} " UINT64_FORMAT "\n", labels, snap.slot.published);
	metric(&buf, "outbox_published_bytes_total", "counter", "Payload bytes acknowledged by Kafka since the server started.");
	appendStringInfo(&buf, "outbox_published_bytes_total{%s} " UINT64_FORMAT "\n", labels, snap.slot.published_bytes);
	metric(&buf, "outbox_retries_total", "counter", "Events sent again after a failed attempt.");
	appendStringInfo(&buf, "outbox_retries_total{%s} " UINT64_FORMAT "\n", labels, snap.slot.retries);
	metric(&buf, "outbox_delivery_errors_total", "counter", "Failed delivery attempts by error class.");
	for (b = 0; b < lengthof(classes); b++)
		appendStringInfo(&buf, "outbox_delivery_errors_total{%s,class=\"%s\"} " UINT64_FORMAT "\n",
						 labels, OutboxErrorClassName(classes[b]), snap.slot.failures[classes[b]]);
	metric(&buf, "outbox_quarantined_events", "gauge", "Events quarantined in outbox.dead_letters.");
	appendStringInfo(&buf, "outbox_quarantined_events{%s} " INT64_FORMAT "\n", labels, snap.quarantined);
	metric(&buf, "outbox_parked_events", "gauge", "Events waiting behind a quarantined one.");
	appendStringInfo(&buf, "outbox_parked_events{%s} " INT64_FORMAT "\n", labels, snap.parked);
	metric(&buf, "outbox_last_delivery_timestamp_seconds", "gauge", "Unix time of the last acknowledged event (0 never).");
	appendStringInfo(&buf, "outbox_last_delivery_timestamp_seconds{%s} %.3f\n", labels,
					 snap.slot.last_delivery == 0 ? 0.0 :
					 (double) snap.slot.last_delivery / USECS_PER_SEC +
					 (POSTGRES_EPOCH_JDATE - UNIX_EPOCH_JDATE) * (double) SECS_PER_DAY);
	metric(&buf, "outbox_page_size", "gauge", "Events in the page the relay has in hand.");
	appendStringInfo(&buf, "outbox_page_size{%s} %d\n", labels, snap.slot.page_size);
	metric(&buf, "outbox_publish_latency_seconds", "histogram",
		   "From the event's insert to Kafka's acknowledgement.");
	for (b = 0; b < OUTBOX_LAT_NBUCKETS; b++)
	{
		cumulative += snap.slot.latency[b];
		if (b < OUTBOX_LAT_NBUCKETS - 1)
			appendStringInfo(&buf, "outbox_publish_latency_seconds_bucket{%s,le=\"%g\"} " UINT64_FORMAT "\n",
							 labels, OutboxLatencyBounds[b] / 1000000.0, cumulative);
		else
			appendStringInfo(&buf, "outbox_publish_latency_seconds_bucket{%s,le=\"+Inf\"} " UINT64_FORMAT "\n",
							 labels, cumulative);
	}
	appendStringInfo(&buf, "outbox_publish_latency_seconds_sum{%s} %.6f\n", labels, snap.slot.latency_sum);
	appendStringInfo(&buf, "outbox_publish_latency_seconds_count{%s} " UINT64_FORMAT "\n", labels, cumulative);

	PG_RETURN_TEXT_P(cstring_to_text(buf.data));
}

/*
 * outbox_health
 *		SQL outbox.health(max_age interval): (status, reason), judged by the
 *		oldest undelivered event's age and the relay's state.
 */
Datum
outbox_health(PG_FUNCTION_ARGS)
{
	Interval   *max_age = PG_GETARG_INTERVAL_P(0);
	double		limit;
	StatusSnapshot snap;
	TupleDesc	tupdesc;
	Datum		values[2];
	bool		nulls[2] = {0};
	const char *status = "ok";
	char	   *reason = NULL;

	limit = max_age->time / (double) USECS_PER_SEC +
		(max_age->day + max_age->month * (double) DAYS_PER_MONTH) * SECS_PER_DAY;
	if (limit <= 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("max_age must be positive")));
	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "return type must be a row type");

	if (!OutboxShmemAvailable())
	{
		status = "critical";
		reason = pstrdup("outbox is not in shared_preload_libraries: nothing is published");
	}
	else
	{
		take_snapshot(&snap);
		if (!snap.running)
		{
			status = "critical";
			reason = snap.backlog > 0 ?
				psprintf("%s; " INT64_FORMAT " events wait", snap.no_relay, snap.backlog) :
				snap.no_relay;
		}
		else if (snap.slot.state == OUTBOX_RELAY_NOT_CONFIGURED)
		{
			status = "critical";
			reason = pstrdup("outbox.kafka_brokers is empty: nothing is published");
		}
		else if (snap.oldest_age > limit)
		{
			status = "critical";
			reason = psprintf("the oldest undelivered event is %.0f s old, over %.0f s%s",
							  snap.oldest_age, limit,
							  snap.slot.state == OUTBOX_RELAY_PAUSED ?
							  " (publishing is paused: outbox.enabled = off)" : "");
		}
		else if (snap.slot.state == OUTBOX_RELAY_PAUSED)
		{
			status = "warning";
			reason = pstrdup("publishing is paused (outbox.enabled = off)");
		}
		else if (snap.oldest_age > limit / 2)
		{
			status = "warning";
			reason = psprintf("the oldest undelivered event is %.0f s old, over half of %.0f s",
							  snap.oldest_age, limit);
		}
		else if (snap.slot.state == OUTBOX_RELAY_BACKING_OFF)
		{
			status = "warning";
			reason = psprintf("backing off after delivery errors: %s", snap.slot.last_error);
		}
		else if (snap.quarantined > 0)
		{
			status = "warning";
			reason = snap.quarantined == 1 ?
				pstrdup("1 event is quarantined in outbox.dead_letters") :
				psprintf(INT64_FORMAT " events are quarantined in outbox.dead_letters",
						 snap.quarantined);
		}
	}

	values[0] = CStringGetTextDatum(status);
	if (reason != NULL)
		values[1] = CStringGetTextDatum(reason);
	else
		nulls[1] = true;
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(tupdesc, values, nulls)));
}
