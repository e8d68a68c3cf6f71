/*-------------------------------------------------------------------------
 *
 * consumer/subscription_status.c
 *		What outbox.subscription_status() and outbox.subscription_lag()
 *		show: each subscription of this database with what its worker's
 *		slot says.
 *
 * Invariants:
 *	- The table is read with the extension owner's rights and a pinned
 *	  search_path (OutboxAsOwnerBegin); the callers need only EXECUTE.
 *	- The slots are cues read from shared memory, never the truth: a
 *	  subscription with no slot is shown stopped.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "executor/spi.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

#include "base/compat.h"
#include "shmem/shmem.h"
#include "consumer/consumer.h"

PG_FUNCTION_INFO_V1(outbox_subscription_status);
PG_FUNCTION_INFO_V1(outbox_subscription_lag);

static Datum
tz_or_null(TimestampTz t, bool *isnull)
{
	*isnull = (t == 0);
	return TimestampTzGetDatum(t);
}

/*
 * outbox_subscription_status
 *		SQL outbox.subscription_status(): every subscription of this
 *		database (read from the table with the extension owner's rights),
 *		with what its worker's slot says and its current dead letters.
 */
Datum
outbox_subscription_status(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	OutboxInboxView *views;
	int			nviews;
	OutboxAsOwner save;
	uint64		i;

	OutboxMaterializedSRF(fcinfo);
	nviews = OutboxInboxList(MyDatabaseId, &views);
	OutboxAsOwnerBegin(&save);
	SPI_connect();
	if (SPI_execute("SELECT s.name,"
					" (SELECT pg_catalog.count(*) FROM outbox.inbox_dead_letters d"
					"   WHERE d.consumer_group OPERATOR(pg_catalog.=) s.group_id"
					"     AND d.state OPERATOR(pg_catalog.<>) 'parked'),"
					" (SELECT pg_catalog.count(*) FROM outbox.inbox_dead_letters d"
					"   WHERE d.consumer_group OPERATOR(pg_catalog.=) s.group_id"
					"     AND d.state OPERATOR(pg_catalog.=) 'parked')"
					" FROM outbox.subscriptions s ORDER BY s.name", true, 0) != SPI_OK_SELECT)
		elog(ERROR, "reading the subscriptions failed");
	for (i = 0; i < SPI_processed; i++)
	{
		Datum		values[13];
		bool		nulls[13];
		bool		isnull;
		HeapTuple	t = SPI_tuptable->vals[i];
		char	   *name = TextDatumGetCString(SPI_getbinval(t, SPI_tuptable->tupdesc, 1, &isnull));
		OutboxInboxView *v = NULL;
		int			k;
		int64		lag = 0;
		bool		lag_known = false;

		for (k = 0; k < nviews; k++)
			if (strcmp(views[k].name, name) == 0)
				v = &views[k];
		memset(nulls, 0, sizeof(nulls));
		values[0] = CStringGetTextDatum(name);
		values[1] = CStringGetTextDatum(v ? OutboxInboxStateName(v->pid ? v->state : OUTBOX_INBOX_STOPPED)
										: OutboxInboxStateName(OUTBOX_INBOX_STOPPED));
		values[2] = Int32GetDatum(v ? v->pid : 0);
		nulls[2] = (v == NULL || v->pid == 0);
		values[3] = tz_or_null(v && v->pid ? v->started_at : 0, &nulls[3]);
		values[4] = Int64GetDatum(v ? (int64) v->processed : 0);
		values[5] = Int64GetDatum(v ? (int64) v->deduplicated : 0);
		values[6] = Int64GetDatum(v ? (int64) v->failed : 0);
		values[7] = SPI_getbinval(t, SPI_tuptable->tupdesc, 2, &isnull);
		values[8] = SPI_getbinval(t, SPI_tuptable->tupdesc, 3, &isnull);
		if (v != NULL)
			for (k = 0; k < v->nparts; k++)
				if (v->parts[k].high >= 0 && v->parts[k].next_offset >= 0)
				{
					lag += Max(0, v->parts[k].high - v->parts[k].next_offset);
					lag_known = true;
				}
		values[9] = Int64GetDatum(lag);
		nulls[9] = !lag_known;
		values[10] = tz_or_null(v ? v->last_applied_at : 0, &nulls[10]);
		values[11] = v && v->last_error[0] ? CStringGetTextDatum(v->last_error) : (Datum) 0;
		nulls[11] = !(v && v->last_error[0]);
		values[12] = tz_or_null(v ? v->last_error_at : 0, &nulls[12]);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	SPI_finish();
	OutboxAsOwnerEnd(&save);
	return (Datum) 0;
}

/*
 * outbox_subscription_lag
 *		SQL outbox.subscription_lag(): per running subscription and assigned
 *		partition, from its worker's slot.
 */
Datum
outbox_subscription_lag(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	OutboxInboxView *views;
	int			nviews;
	int			i;
	int			k;

	OutboxMaterializedSRF(fcinfo);
	nviews = OutboxInboxList(MyDatabaseId, &views);
	for (i = 0; i < nviews; i++)
	{
		if (views[i].pid == 0)
			continue;
		for (k = 0; k < views[i].nparts; k++)
		{
			OutboxInboxPart *p = &views[i].parts[k];
			Datum		values[6];
			bool		nulls[6];

			memset(nulls, 0, sizeof(nulls));
			values[0] = CStringGetTextDatum(views[i].name);
			values[1] = CStringGetTextDatum(p->topic);
			values[2] = Int32GetDatum(p->partition);
			values[3] = Int64GetDatum(p->next_offset);
			nulls[3] = p->next_offset < 0;
			values[4] = Int64GetDatum(p->high);
			nulls[4] = p->high < 0;
			values[5] = Int64GetDatum(Max(0, p->high - p->next_offset));
			nulls[5] = nulls[3] || nulls[4];
			tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
		}
	}
	return (Datum) 0;
}
