/*-------------------------------------------------------------------------
 *
 * relay/status_health.c
 *		SQL outbox.health(max_age): one verdict, ok, warning or critical,
 *		on the relay and the subscriptions of this database, with the
 *		reason.
 *
 * Invariants: the relay is judged on one OutboxStatusSnapshot (status.c);
 * the subscriptions on a copy of their slots (OutboxInboxList) against
 * outbox.subscriptions, to name one left without a worker or with a
 * partition stopped.  Nothing here writes a table.  Without the library
 * preloaded the verdict is critical, not an error: a health check must
 * answer.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "executor/spi.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

#include "base/base.h"
#include "shmem/shmem.h"
#include "relay/relay.h"

PG_FUNCTION_INFO_V1(outbox_health);

/*
 * backlog_verdict
 *		Backpressure's part of the verdict: critical when emit() would
 *		refuse an event now (outbox.max_backlog, outbox.max_backlog_age),
 *		warning once the backlog or its oldest event is past 80% of a limit;
 *		NULL below.  The figures are those emit() judges: the relay's slot.
 */
static char *
backlog_verdict(const OutboxSlotView *s, bool *critical)
{
	TimestampTz now = GetCurrentTimestamp();
	double		age = s->oldest_pending > 0 ?
		(double) (now - s->oldest_pending) / USECS_PER_SEC : 0;

	*critical = OutboxBacklogOverLimits(s->backlog, s->oldest_pending, now);
	if (*critical)
		return psprintf("emit() refuses new events: the backlog is " INT64_FORMAT
						" events (outbox.max_backlog %d), the oldest %.0f s old "
						"(outbox.max_backlog_age %d s)",
						s->backlog, outbox_max_backlog, age, outbox_max_backlog_age);
	if (outbox_max_backlog > 0 && s->backlog >= 0.8 * outbox_max_backlog)
		return psprintf("the backlog is " INT64_FORMAT " events, over 80%% of "
						"outbox.max_backlog (%d), where emit() refuses",
						s->backlog, outbox_max_backlog);
	if (outbox_max_backlog_age > 0 && age >= 0.8 * outbox_max_backlog_age)
		return psprintf("the oldest undelivered event is %.0f s old, over 80%% of "
						"outbox.max_backlog_age (%d s), where emit() refuses",
						age, outbox_max_backlog_age);
	return NULL;
}

/*
 * judge_health
 *		health()'s verdict on snap against limit seconds: sets *status and
 *		returns the reason (NULL when all is well).
 */
static char *
judge_health(const OutboxStatusSnapshot *snap, double limit, const char **status)
{
	const OutboxSlotView *s = &snap->slot;
	bool		pressure_critical;
	char	   *pressure;

	*status = "critical";
	if (!snap->running)
		return snap->backlog > 0 ?
			psprintf("%s; " INT64_FORMAT " events wait", snap->no_relay, snap->backlog) :
			snap->no_relay;
	if (s->state == OUTBOX_RELAY_NOT_CONFIGURED)
		return pstrdup("outbox.kafka_brokers is empty: nothing is published");
	if (s->state == OUTBOX_RELAY_FENCED)
		return psprintf("the relay is fenced: another producer publishes with its Kafka "
						"transactional.id (a promoted standby?), so it publishes nothing: %s",
						s->last_error);
	pressure = backlog_verdict(s, &pressure_critical);
	if (pressure != NULL && pressure_critical)
		return pressure;
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
	if (pressure != NULL)
		return pressure;
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
 *		launcher left without a worker (subscription_slots.c says why), or that
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
	if (DatumGetBool(OutboxSpiValue(1, &isnull)))
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
	OutboxStatusSnapshot snap;
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

		OutboxStatusTake(&snap);
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
