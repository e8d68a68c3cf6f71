/*-------------------------------------------------------------------------
 *
 * status.c
 *		SQL-visible state of the relays: status(), metrics(), health().
 *
 * Invariants: figures come from a copy of the relay's slot (OutboxSlotRead,
 * which takes it under the slot's locks: nothing here touches shared memory
 * itself) and the small dead-letter table while a relay runs.  When none
 * runs, nobody keeps the slot's figures, so the backlog and the oldest
 * event's age are counted from outbox.events against the relay's recorded
 * progress, and health() names why no relay runs.  The three functions
 * read one StatusSnapshot each and only format it; health() also reads
 * the subscriptions' slots (OutboxInboxList) against outbox.subscriptions,
 * to name one left without a worker.  Nothing here writes a table.  What
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
	OutboxSlotView slot;		/* a copy of the relay's slot */
	bool		running;		/* a relay process is attached */
	int64		backlog;
	double		oldest_age;		/* seconds, < 0 when nothing is pending */
	int64		quarantined;
	int64		parked;
	int64		queued;			/* replay queue and unjudged restored events */
	int64		held_events;	/* rows of outbox.held */
	int			held_partitions;
	double		held_age;		/* seconds since the oldest hold began, < 0 none */
	double		held_oldest_age;	/* age of the oldest held event, < 0 none */
	char	   *held_metrics;	/* their outbox_held_events samples (labels
								 * after the database's) */
	char	   *oldest_hold;	/* "topic[partition]" of the oldest hold */
	char	   *no_relay;		/* why no relay runs, when none does */
} StatusSnapshot;

/* status()'s columns, in its OUT order */
#define STATUS_NATTS 25

/* a row being filled column by column */
typedef struct StatusRow
{
	Datum		values[STATUS_NATTS];
	bool		nulls[STATUS_NATTS];
	int			n;
} StatusRow;

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

/* column col of the first row the last SPI query returned */
static Datum
spi_value(int col, bool *isnull)
{
	return SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, col, isnull);
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
	snap->quarantined = DatumGetInt64(spi_value(1, &isnull));
	snap->parked = DatumGetInt64(spi_value(2, &isnull));
	snap->queued = DatumGetInt64(spi_value(3, &isnull));
	/* restored events the relay has not judged yet (none before 1.1) */
	if (SPI_execute("SELECT pg_catalog.to_regclass('outbox.restored_events') IS NOT NULL",
					true, 1) == SPI_OK_SELECT && SPI_processed == 1 &&
		DatumGetBool(spi_value(1, &isnull)) &&
		SPI_execute("SELECT pg_catalog.count(*) FROM outbox.restored_events",
					true, 1) == SPI_OK_SELECT && SPI_processed == 1)
		snap->queued += DatumGetInt64(spi_value(1, &isnull));
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
count_held(StatusSnapshot *snap)
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
		!DatumGetBool(spi_value(1, &isnull)))
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
		snap->backlog = DatumGetInt64(spi_value(1, &isnull));
		d = spi_value(2, &isnull);
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
 * take_snapshot
 *		Copy this database's slot and derive the figures.
 */
static void
take_snapshot(StatusSnapshot *snap)
{
	TimestampTz now = GetCurrentTimestamp();
	bool		has_slot;

	require_preload();
	memset(snap, 0, sizeof(StatusSnapshot));
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

static const char *
state_name(const StatusSnapshot *snap)
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
	StatusSnapshot snap;
	const OutboxSlotView *s = &snap.slot;
	TupleDesc	tupdesc;
	StatusRow	row;
	double		p50;

	take_snapshot(&snap);
	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "return type must be a row type");

	memset(&row, 0, sizeof(row));
	put(&row, true, CStringGetTextDatum(get_database_name(MyDatabaseId)));
	put(&row, true, CStringGetTextDatum(state_name(&snap)));
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

/*
 * metric
 *		A metric's HELP and TYPE lines, then its one sample when value is
 *		not NULL (a metric of several samples appends them itself).
 */
static void
metric(StringInfo buf, const char *labels, const char *name, const char *type,
	   const char *help, const char *value)
{
	appendStringInfo(buf, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
	if (value != NULL)
		appendStringInfo(buf, "%s{%s} %s\n", name, labels, value);
}

static char *
u64(uint64 value)
{
	return psprintf(UINT64_FORMAT, value);
}

static char *
i64(int64 value)
{
	return psprintf(INT64_FORMAT, value);
}

/*
 * database_label
 *		database="name" into labels, which has room for NAMEDATALEN * 2 +
 *		32 bytes; label values escape backslash, quote and newline.
 */
static void
database_label(char *labels, size_t size)
{
	char	   *dbname = get_database_name(MyDatabaseId);
	const char *p;
	char	   *q;

	q = labels + sprintf(labels, "database=\"");
	for (p = dbname; *p && q < labels + size - 4; p++)
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
}

/* outbox_relay_state: one sample per state name, 1 for the current one */
static void
metric_states(StringInfo buf, const char *labels, const StatusSnapshot *snap)
{
	int			st;

	metric(buf, labels, "outbox_relay_state", "gauge", "1 for the relay's current state.", NULL);
	for (st = 0; st < OUTBOX_RELAY_NSTATES; st++)
	{
		const char *name = OutboxRelayStateName((OutboxRelayState) st);

		/* two states share a name ("running"): one sample for both */
		if (st > 0 && strcmp(name, OutboxRelayStateName((OutboxRelayState) (st - 1))) == 0)
			continue;
		appendStringInfo(buf, "outbox_relay_state{%s,state=\"%s\"} %d\n", labels, name,
						 strcmp(name, state_name(snap)) == 0 ? 1 : 0);
	}
}

/* outbox_delivery_errors_total, by error class */
static void
metric_errors(StringInfo buf, const char *labels, const OutboxSlotView *s)
{
	static const OutboxErrorClass classes[] = {OUTBOX_ERROR_TRANSIENT, OUTBOX_ERROR_PERMANENT, OUTBOX_ERROR_FATAL};
	int			c;

	metric(buf, labels, "outbox_delivery_errors_total", "counter", "Failed delivery attempts by error class.", NULL);
	for (c = 0; c < lengthof(classes); c++)
		appendStringInfo(buf, "outbox_delivery_errors_total{%s,class=\"%s\"} " UINT64_FORMAT "\n",
						 labels, OutboxErrorClassName(classes[c]), s->failures[classes[c]]);
}

/* outbox_publish_latency_seconds: the histogram since the relay started */
static void
metric_latency(StringInfo buf, const char *labels, const OutboxSlotView *s)
{
	uint64		cumulative = 0;
	int			b;

	metric(buf, labels, "outbox_publish_latency_seconds", "histogram",
		   "From the event's insert to Kafka's acknowledgement.", NULL);
	for (b = 0; b < OUTBOX_LAT_NBUCKETS; b++)
	{
		cumulative += s->latency[b];
		if (b < OUTBOX_LAT_NBUCKETS - 1)
			appendStringInfo(buf, "outbox_publish_latency_seconds_bucket{%s,le=\"%g\"} " UINT64_FORMAT "\n",
							 labels, OutboxLatencyBounds[b] / 1000000.0, cumulative);
		else
			appendStringInfo(buf, "outbox_publish_latency_seconds_bucket{%s,le=\"+Inf\"} " UINT64_FORMAT "\n",
							 labels, cumulative);
	}
	appendStringInfo(buf, "outbox_publish_latency_seconds_sum{%s} %.6f\n", labels, s->latency_sum);
	appendStringInfo(buf, "outbox_publish_latency_seconds_count{%s} " UINT64_FORMAT "\n", labels, cumulative);
}

/*
 * metric_subscriptions
 *		The subscription workers of this database (inbox_shmem.c): what
 *		each applied, deduplicated and failed since it started, and its lag
 *		per assigned partition.  Subscription names need no escaping in a
 *		label: [a-z0-9_.-].
 */
static void
metric_subscriptions(StringInfo buf, const char *labels)
{
	OutboxInboxView *views;
	int			n = OutboxInboxList(MyDatabaseId, &views);
	static const char *const counters[][2] = {
		{"outbox_subscription_processed_total", "Messages a subscription's handler applied since its worker started."},
		{"outbox_subscription_deduplicated_total", "Messages a subscription had seen before (id or offset), not applied again."},
		{"outbox_subscription_failed_total", "Handler errors of a subscription since its worker started."},
		{"outbox_subscription_dead_lettered_total", "Messages a subscription's worker moved to outbox.inbox_dead_letters."},
		{"outbox_subscription_parked_total", "Messages a subscription's worker parked behind a dead one."},
	};
	int			c;
	int			i;
	int			k;

	for (c = 0; c < lengthof(counters); c++)
	{
		appendStringInfo(buf, "# HELP %s %s\n# TYPE %s counter\n",
						 counters[c][0], counters[c][1], counters[c][0]);
		for (i = 0; i < n; i++)
		{
			const OutboxInboxView *v = &views[i];
			uint64		value = c == 0 ? v->processed : c == 1 ? v->deduplicated :
				c == 2 ? v->failed : c == 3 ? v->dead_lettered : v->parked;

			appendStringInfo(buf, "%s{%s,subscription=\"%s\"} " UINT64_FORMAT "\n",
							 counters[c][0], labels, v->name, value);
		}
	}
	appendStringInfoString(buf, "# HELP outbox_subscription_up 1 when the subscription's worker runs.\n"
						   "# TYPE outbox_subscription_up gauge\n");
	for (i = 0; i < n; i++)
		appendStringInfo(buf, "outbox_subscription_up{%s,subscription=\"%s\"} %d\n",
						 labels, views[i].name, views[i].pid != 0 ? 1 : 0);
	appendStringInfoString(buf, "# HELP outbox_subscription_lag_messages Messages of an assigned partition not yet applied (high watermark minus next offset).\n"
						   "# TYPE outbox_subscription_lag_messages gauge\n");
	for (i = 0; i < n; i++)
		for (k = 0; k < views[i].nparts; k++)
		{
			const OutboxInboxPart *p = &views[i].parts[k];

			if (views[i].pid == 0 || p->high < 0 || p->next_offset < 0)
				continue;
			appendStringInfo(buf, "outbox_subscription_lag_messages{%s,subscription=\"%s\",topic=\"%s\",partition=\"%d\"} " INT64_FORMAT "\n",
							 labels, views[i].name, p->topic, p->partition,
							 Max(0, p->high - p->next_offset));
		}
}

/*
 * outbox_metrics
 *		SQL outbox.metrics(): the same figures in Prometheus text format.
 */
Datum
outbox_metrics(PG_FUNCTION_ARGS)
{
	StatusSnapshot snap;
	const OutboxSlotView *s = &snap.slot;
	StringInfoData buf;
	char		labels[NAMEDATALEN * 2 + 32];
	double		last_delivery = 0.0;

	take_snapshot(&snap);
	database_label(labels, sizeof(labels));
	if (s->last_delivery != 0)
		last_delivery = (double) s->last_delivery / USECS_PER_SEC +
			(POSTGRES_EPOCH_JDATE - UNIX_EPOCH_JDATE) * (double) SECS_PER_DAY;

	initStringInfo(&buf);
	metric(&buf, labels, "outbox_relay_up", "gauge", "1 when the database's relay process runs.",
		   snap.running ? "1" : "0");
	metric_states(&buf, labels, &snap);
	metric(&buf, labels, "outbox_brokers_up", "gauge", "Kafka brokers the relay is connected to (-1 unknown).",
		   psprintf("%d", snap.running ? s->brokers_up : -1));
	metric(&buf, labels, "outbox_backlog_events", "gauge", "Committed events not yet published (estimate).",
		   i64(snap.backlog));
	metric(&buf, labels, "outbox_oldest_pending_seconds", "gauge", "Age of the oldest event not yet published (0 when none).",
		   psprintf("%.3f", Max(snap.oldest_age, 0)));
	metric(&buf, labels, "outbox_published_total", "counter", "Events acknowledged by Kafka since the server started.",
		   u64(s->published));
	metric(&buf, labels, "outbox_published_bytes_total", "counter", "Payload bytes acknowledged by Kafka since the server started.",
		   u64(s->published_bytes));
	metric(&buf, labels, "outbox_retries_total", "counter", "Events sent again after a failed attempt.",
		   u64(s->retries));
	metric_errors(&buf, labels, s);
	metric(&buf, labels, "outbox_quarantined_events", "gauge", "Events quarantined in outbox.dead_letters.",
		   i64(snap.quarantined));
	metric(&buf, labels, "outbox_parked_events", "gauge", "Events waiting behind a quarantined one.",
		   i64(snap.parked));
	metric(&buf, labels, "outbox_held_partitions", "gauge", "Kafka partitions whose events the relay holds until they answer again.",
		   psprintf("%d", snap.held_partitions));
	metric(&buf, labels, "outbox_held_events", "gauge", "Events held for an unavailable partition, by topic and partition.",
		   NULL);
	if (snap.held_metrics != NULL)
	{
		char	   *line;
		char	   *save = NULL;

		for (line = strtok_r(snap.held_metrics, "\n", &save); line != NULL;
			 line = strtok_r(NULL, "\n", &save))
			appendStringInfo(&buf, "outbox_held_events{%s%s\n", labels, line);
	}
	metric(&buf, labels, "outbox_held_oldest_seconds", "gauge", "Age of the oldest hold (0 when none).",
		   psprintf("%.3f", Max(snap.held_age, 0)));
	metric(&buf, labels, "outbox_last_delivery_timestamp_seconds", "gauge", "Unix time of the last acknowledged event (0 never).",
		   psprintf("%.3f", last_delivery));
	metric(&buf, labels, "outbox_page_size", "gauge", "Events in the page the relay has in hand.",
		   psprintf("%d", s->page_size));
	metric_latency(&buf, labels, s);
	metric_subscriptions(&buf, labels);

	PG_RETURN_TEXT_P(cstring_to_text(buf.data));
}

/*
 * judge_health
 *		health()'s verdict on snap against limit seconds: sets *status and
 *		returns the reason (NULL when all is well).
 */
static char *
judge_health(const StatusSnapshot *snap, double limit, const char **status)
{
	const OutboxSlotView *s = &snap->slot;

	*status = "critical";
	if (!snap->running)
		return snap->backlog > 0 ?
			psprintf("%s; " INT64_FORMAT " events wait", snap->no_relay, snap->backlog) :
			snap->no_relay;
	if (s->state == OUTBOX_RELAY_NOT_CONFIGURED)
		return pstrdup("outbox.kafka_brokers is empty: nothing is published");
	if (snap->oldest_age > limit && s->state == OUTBOX_RELAY_WAITING_STANDBY)
		return psprintf("the oldest undelivered event is %.0f s old, over %.0f s "
						"(publishing waits for a standby: %s)",
						snap->oldest_age, limit, s->standby_wait);
	if (snap->oldest_age > limit)
		return psprintf("the oldest undelivered event is %.0f s old, over %.0f s%s",
						snap->oldest_age, limit,
						s->state == OUTBOX_RELAY_PAUSED ?
						" (publishing is paused: outbox.enabled = off)" : "");
	if (snap->held_age > limit)
		return psprintf(INT64_FORMAT " events are held for %d unavailable Kafka partitions, "
						"the oldest hold (%s) %.0f s old, over %.0f s",
						snap->held_events, snap->held_partitions, snap->oldest_hold,
						snap->held_age, limit);
	*status = "warning";
	if (snap->held_partitions > 0)
		return psprintf(INT64_FORMAT " events are held for %d unavailable Kafka partitions, "
						"the oldest hold (%s) %.0f s old",
						snap->held_events, snap->held_partitions, snap->oldest_hold,
						snap->held_age);
	if (s->state == OUTBOX_RELAY_PAUSED)
		return pstrdup("publishing is paused (outbox.enabled = off)");
	if (s->state == OUTBOX_RELAY_WAITING_STANDBY)
		return psprintf("publishing waits for a standby: %s", s->standby_wait);
	if (snap->oldest_age > limit / 2)
		return psprintf("the oldest undelivered event is %.0f s old, over half of %.0f s",
						snap->oldest_age, limit);
	if (s->state == OUTBOX_RELAY_BACKING_OFF)
		return psprintf("backing off after delivery errors: %s", s->last_error);
	if (snap->quarantined == 1)
		return pstrdup("1 event is quarantined in outbox.dead_letters");
	if (snap->quarantined > 0)
		return psprintf(INT64_FORMAT " events are quarantined in outbox.dead_letters",
						snap->quarantined);
	*status = "ok";
	return NULL;
}

/* why a subscription has no worker, by OutboxInboxWait */
static char *
wait_reason(OutboxInboxWait wait)
{
	switch (wait)
	{
		case OUTBOX_INBOX_WAIT_WORKER:
			return pstrdup("no free background worker slot (max_worker_processes)");
		case OUTBOX_INBOX_WAIT_RELAY:
			return pstrdup("a relay waits for a background worker slot, and relays come first");
		case OUTBOX_INBOX_WAIT_DATABASE_LIMIT:
			return psprintf("outbox.max_subscriptions_per_database (%d) reached",
							outbox_max_subscriptions_per_database);
		case OUTBOX_INBOX_WAIT_NONE:
			break;
	}
	return NULL;
}

/*
 * subscription_verdict
 *		health()'s word on this database's subscriptions: those the
 *		launcher left without a worker (inbox_shmem.c says why), or that
 *		have no subscription slot at all.  Names the one waiting longest,
 *		with the reason, and counts the others; critical once it has waited
 *		longer than limit seconds, or when it has no slot (only a restart
 *		gives one), warning before.  NULL when none waits: a worker between
 *		two lives is not waiting.
 */
static char *
subscription_verdict(double limit, const char **status)
{
	OutboxInboxView *views;
	int			nviews = OutboxInboxList(MyDatabaseId, &views);
	TimestampTz now = GetCurrentTimestamp();
	MemoryContext outer = CurrentMemoryContext;
	char	   *worst = NULL;
	double		worst_age = -1;
	int			waiting = 0;
	bool		isnull;
	uint64		nrows = 0;
	uint64		i;

	SPI_connect();
	/* none before 1.5 */
	if (SPI_execute("SELECT pg_catalog.to_regclass('outbox.subscriptions') IS NOT NULL",
					true, 1) != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "could not look for the subscriptions");
	if (DatumGetBool(spi_value(1, &isnull)))
	{
		if (SPI_execute("SELECT s.name FROM outbox.subscriptions s ORDER BY s.name",
						true, 0) != SPI_OK_SELECT)
			elog(ERROR, "could not read the subscriptions");
		nrows = SPI_processed;
	}
	for (i = 0; i < nrows; i++)
	{
		char	   *name = SPI_getvalue(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 1);
		const OutboxInboxView *v = NULL;
		char	   *why = NULL;
		double		age = 0;
		int			k;

		for (k = 0; k < nviews; k++)
			if (strcmp(views[k].name, name) == 0)
				v = &views[k];
		if (v == NULL && !OutboxInboxHasRoom(MyDatabaseId, name))
			why = psprintf("all outbox.max_subscriptions (%d) slots are taken",
						   outbox_max_subscriptions);
		else if (v != NULL && v->pid == 0 && v->wait != OUTBOX_INBOX_WAIT_NONE)
		{
			why = wait_reason(v->wait);
			age = (double) (now - v->wait_since) / USECS_PER_SEC;
		}
		if (why == NULL)
			continue;
		waiting++;
		if (worst == NULL || (worst_age >= 0 && (v == NULL || age > worst_age)))
		{
			MemoryContext spi = MemoryContextSwitchTo(outer);

			/* without a slot it waits for a restart: no age to give */
			worst = v == NULL ?
				psprintf("subscription \"%s\" has no worker: %s", name, why) :
				psprintf("subscription \"%s\" has no worker: %s, for %.0f s", name, why, age);
			worst_age = v == NULL ? -1 : age;
			MemoryContextSwitchTo(spi);
		}
	}
	SPI_finish();
	if (worst == NULL)
		return NULL;
	*status = worst_age < 0 || worst_age > limit ? "critical" : "warning";
	if (waiting == 1)
		return worst;
	if (waiting == 2)
		return psprintf("%s; 1 more subscription has none", worst);
	return psprintf("%s; %d more subscriptions have none", worst, waiting - 1);
}

/*
 * stopped_subscription
 *		health()'s reason when a subscription worker of this database has a
 *		partition stopped (consumer_range.c: nothing of it is applied until
 *		someone decides), NULL when none has.
 */
static char *
stopped_subscription(void)
{
	OutboxInboxView *views;
	int			n = OutboxInboxList(MyDatabaseId, &views);
	int			i;

	for (i = 0; i < n; i++)
		if (views[i].pid != 0 && views[i].state == OUTBOX_INBOX_PARTITION_STOPPED)
			return psprintf("subscription \"%s\" has a partition stopped: its log does not hold the group's next offset (see outbox.subscription_status(); outbox.subscription_seek() resumes it)",
							views[i].name);
	return NULL;
}

/*
 * outbox_health
 *		SQL outbox.health(max_age interval): (status, reason), judged by the
 *		oldest undelivered event's age and the relay's state, then by the
 *		subscriptions: a partition stopped is critical; one left without a
 *		worker is judged by subscription_verdict().  The relay's critical
 *		verdicts come first, then the subscriptions' critical ones, then the
 *		relay's warnings, then the subscriptions' warnings.
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
	const char *status;
	char	   *reason;

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
		const char *sub_status;
		char	   *sub_reason;
		char	   *stopped;

		take_snapshot(&snap);
		reason = judge_health(&snap, limit, &status);
		if (strcmp(status, "critical") != 0 && (stopped = stopped_subscription()) != NULL)
		{
			status = "critical";
			reason = stopped;
		}
		else if (strcmp(status, "critical") != 0 &&
				 (sub_reason = subscription_verdict(limit, &sub_status)) != NULL &&
				 (strcmp(sub_status, "critical") == 0 || strcmp(status, "ok") == 0))
		{
			status = sub_status;
			reason = sub_reason;
		}
	}

	values[0] = CStringGetTextDatum(status);
	values[1] = reason != NULL ? CStringGetTextDatum(reason) : (Datum) 0;
	nulls[1] = reason == NULL;
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(tupdesc, values, nulls)));
}
