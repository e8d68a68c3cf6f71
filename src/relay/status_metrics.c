/*-------------------------------------------------------------------------
 *
 * relay/status_metrics.c
 *		SQL outbox.metrics(): the relay's and the subscriptions' figures in
 *		Prometheus text format.
 *
 * Invariants: the relay's figures are one OutboxStatusSnapshot (status.c),
 * the subscriptions' a copy of their slots (OutboxInboxList); nothing here
 * reads a table or shared memory itself.  Every sample carries the
 * database's label, its value escaped as the text format wants; topic and
 * subscription names need no escaping.  Each metric's HELP and TYPE lines
 * come before its samples, also when it has none.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "commands/dbcommands.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

#include "base/base.h"
#include "shmem/shmem.h"
#include "kafka/kafka.h"
#include "relay/relay.h"

PG_FUNCTION_INFO_V1(outbox_metrics);

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

/* a counter's or a gauge's value as a sample writes it */
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
 * metric_backpressure
 *		emit()'s limits on the backlog, the headroom left under them (as
 *		emit() judges it: the relay's figures), and the refusals.
 */
static void
metric_backpressure(StringInfo buf, const char *labels, const OutboxSlotView *s)
{
	double		age = s->oldest_pending > 0 ?
		(double) (GetCurrentTimestamp() - s->oldest_pending) / USECS_PER_SEC : 0;

	metric(buf, labels, "outbox_backlog_limit_events", "gauge",
		   "outbox.max_backlog: the backlog at which emit() refuses (0: none).",
		   psprintf("%d", outbox_max_backlog));
	metric(buf, labels, "outbox_backlog_headroom_events", "gauge",
		   "Events emit() accepts before outbox.max_backlog (no sample without a limit).",
		   outbox_max_backlog > 0 ? i64(Max(outbox_max_backlog - s->backlog, 0)) : NULL);
	metric(buf, labels, "outbox_backlog_age_limit_seconds", "gauge",
		   "outbox.max_backlog_age: the oldest event's age at which emit() refuses (0: none).",
		   psprintf("%d", outbox_max_backlog_age));
	metric(buf, labels, "outbox_backlog_age_headroom_seconds", "gauge",
		   "Seconds before the oldest event reaches outbox.max_backlog_age (no sample without a limit).",
		   outbox_max_backlog_age > 0 ? psprintf("%.3f", Max(outbox_max_backlog_age - age, 0)) : NULL);
	metric(buf, labels, "outbox_emit_refused_total", "counter",
		   "Events emit() refused for the backlog's limits since the relay's slot was assigned.",
		   u64(s->emit_refused));
	metric(buf, labels, "outbox_emit_refusing", "gauge",
		   "1 while emit() refuses events for the backlog's limits.",
		   OutboxBacklogOverLimits(s->backlog, s->oldest_pending,
								   GetCurrentTimestamp()) ? "1" : "0");
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
metric_states(StringInfo buf, const char *labels, const OutboxStatusSnapshot *snap)
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
						 strcmp(name, OutboxStatusStateName(snap)) == 0 ? 1 : 0);
	}
}

/* outbox_delivery_errors_total, by error class */
static void
metric_errors(StringInfo buf, const char *labels, const OutboxSlotView *s)
{
	static const OutboxErrorClass classes[] = {OUTBOX_ERROR_TRANSIENT, OUTBOX_ERROR_PERMANENT,
	OUTBOX_ERROR_FATAL, OUTBOX_ERROR_SCHEMA};
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
 *		The subscription workers of this database (subscription_slots.c): what
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
	OutboxStatusSnapshot snap;
	const OutboxSlotView *s = &snap.slot;
	StringInfoData buf;
	char		labels[NAMEDATALEN * 2 + 32];
	double		last_delivery = 0.0;

	OutboxStatusTake(&snap);
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
	metric_backpressure(&buf, labels, s);
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
