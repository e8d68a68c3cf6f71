/*-------------------------------------------------------------------------
 *
 * consumer/consumer_offsets.c
 *		The consumer group's offsets rows (outbox.inbox_offsets) as the
 *		subscription worker keeps them: where an assigned partition starts,
 *		the lock a batch takes on each of its partitions, the offset it
 *		saves, and the partitions stopped because their log does not hold
 *		the group's next offset.
 *
 * Invariants:
 *	- The database's offsets are the truth.  A message whose offset is
 *	  below its partition's stored next offset is never applied: that is
 *	  the dedupe of messages without an id, and the fence between two
 *	  workers that both think they own a partition during a rebalance (the
 *	  row lock orders them).
 *	- An offset is saved in the transaction that applied the messages
 *	  below it, and only moves forward there; moved back by
 *	  subscription_seek() it restarts the group's workers.
 *	- A partition whose log does not hold the group's next offset is
 *	  stopped, never read as applied (consumer_range.c), and stays stopped
 *	  across restarts and rebalances (stopped_at) until
 *	  outbox.subscription_seek() moves the offset.
 *	- The assignment callback runs inside librdkafka's poll: it catches
 *	  every error and answers false (nothing is assigned, the worker
 *	  restarts), never lets one through librdkafka's stack.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "utils/builtins.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "consumer/consumer_worker.h"
#include "base/base.h"
#include "shmem/shmem.h"
#include "kafka/kafka.h"
#include "consumer/consumer.h"

#define ASSIGN_CHECK_MS		5000	/* for all of an assignment's log bounds */
#define RESET_CHECK_MS		2000	/* for a reset partition's log bounds */
#define RESET_RETRY_MS		10000	/* a logical offset not looked up: again */

/* the group, topic, partition and offset, as the statements here take them */
static void
row_args(Worker *w, const char *topic, int32 partition, int64 offset, Datum *args)
{
	args[0] = CStringGetTextDatum(w->sub.group_id);
	args[1] = CStringGetTextDatum(topic);
	args[2] = Int32GetDatum(partition);
	args[3] = Int64GetDatum(offset);
}

/*
 * OutboxSubscriberLockOffset
 *		Lock the group's offsets row of topic/partition FOR UPDATE (inside
 *		SPI), making it at first when there is none, and return its next
 *		offset.
 */
int64
OutboxSubscriberLockOffset(Worker *w, const char *topic, int32 partition, int64 first)
{
	Datum		args[4];
	bool		isnull;

	row_args(w, topic, partition, first, args);
	OutboxSubscriberRunPlan(w, PLAN_LOCK_OFFSET, args, NULL, 1);
	if (SPI_processed == 0)
	{
		/* a first message: the row starts at it, then is locked */
		OutboxSubscriberRunPlan(w, PLAN_INSERT_OFFSET, args, NULL, 0);
		OutboxSubscriberRunPlan(w, PLAN_LOCK_OFFSET, args, NULL, 1);
		if (SPI_processed == 0)
			elog(ERROR, "making the offsets row failed");
	}
	return DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0],
									   SPI_tuptable->tupdesc, 1, &isnull));
}

/*
 * OutboxSubscriberSaveOffset
 *		Move the group's next offset of topic/partition to next (inside
 *		SPI, the row locked by OutboxSubscriberLockOffset).
 */
void
OutboxSubscriberSaveOffset(Worker *w, const char *topic, int32 partition, int64 next)
{
	Datum		args[4];

	row_args(w, topic, partition, next, args);
	OutboxSubscriberRunPlan(w, PLAN_UPDATE_OFFSET, args, NULL, 0);
}

/*
 * record_stop
 *		Mark the group's offsets row of topic/partition stopped (inside SPI,
 *		in the caller's transaction), making one at offset when there is
 *		none: a stopped partition stays stopped across restarts and
 *		rebalances until subscription_seek() clears the mark.
 */
static void
record_stop(Worker *w, const char *topic, int32 partition, int64 offset)
{
	Oid			types[4] = {TEXTOID, TEXTOID, INT4OID, INT8OID};
	Datum		args[4];

	row_args(w, topic, partition, Max(offset, 0), args);
	OutboxSpiExec("INSERT INTO outbox.inbox_offsets AS o (consumer_group, topic, kafka_partition,"
				  " next_offset, stopped_at) VALUES ($1, $2, $3, $4, pg_catalog.now())"
				  " ON CONFLICT (consumer_group, topic, kafka_partition)"
				  " DO UPDATE SET stopped_at = pg_catalog.now()",
				  4, types, args, NULL, false, 0, SPI_OK_INSERT, "recording a stopped partition");
}

/*
 * stopped_start
 *		Whether the assigned partition a, whose row holds next offset
 *		a->offset, is stopped: it was (stopped once, stopped until
 *		subscription_seek(): a log that has grown past the offset since is
 *		still not the group's log), or its log, asked until deadline, does
 *		not hold the offset (recorded).  Reports a stop.
 */
static bool
stopped_start(Worker *w, OutboxAssigned *a, bool was_stopped, TimestampTz deadline)
{
	OutboxLogRange range;

	if (was_stopped)
	{
		OutboxReportStoppedPartition(w->slot, w->sub.name, a->topic,
									 a->partition, a->offset, NULL);
		return true;
	}
	if (OutboxOffsetOutsideLog(w->consumer, a->topic, a->partition, a->offset,
							   (int) TimestampDifferenceMilliseconds(GetCurrentTimestamp(),
																	 deadline),
							   &range))
	{
		record_stop(w, a->topic, a->partition, a->offset);
		OutboxReportStoppedPartition(w->slot, w->sub.name, a->topic,
									 a->partition, a->offset, &range);
		return true;
	}
	return false;
}

/*
 * assigned_start
 *		Where the assigned partition a starts, in the assignment's
 *		transaction: its stored next offset, stopped (a->stop) when the
 *		partition's log does not hold it; with no row, the beginning (-1),
 *		or for start_from latest the partition's end, recorded, so that a
 *		restart before the first message starts there too and loses
 *		nothing produced meanwhile.  The log's bounds are asked for until
 *		deadline; after it the fetch's own answer judges.
 */
static void
assigned_start(Worker *w, OutboxAssigned *a, TimestampTz deadline)
{
	Oid			types[4] = {TEXTOID, TEXTOID, INT4OID, INT8OID};
	Datum		args[4];
	bool		isnull;

	row_args(w, a->topic, a->partition, 0, args);
	OutboxSpiExec("SELECT o.next_offset, o.stopped_at IS NOT NULL FROM outbox.inbox_offsets o"
				  " WHERE o.consumer_group OPERATOR(pg_catalog.=) $1"
				  " AND o.topic OPERATOR(pg_catalog.=) $2"
				  " AND o.kafka_partition OPERATOR(pg_catalog.=) $3",
				  3, types, args, NULL, false, 1, SPI_OK_SELECT, "reading the offsets");
	a->offset = -1;
	a->stop = false;
	if (SPI_processed > 0)
	{
		bool		was_stopped = DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0],
															 SPI_tuptable->tupdesc, 2, &isnull));

		a->offset = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0],
												SPI_tuptable->tupdesc, 1, &isnull));
		a->stop = stopped_start(w, a, was_stopped, deadline);
	}
	else if (!w->sub.earliest)
	{
		int64		end = OutboxConsumerQueryEnd(w->consumer, a->topic, a->partition, 5000);

		if (end < 0)
			elog(ERROR, "the end of partition %d of topic \"%s\" is not known",
				 a->partition, a->topic);
		args[3] = Int64GetDatum(end);
		OutboxSubscriberRunPlan(w, PLAN_INSERT_OFFSET, args, NULL, 0);
		a->offset = end;
	}
}

/*
 * start_assigned
 *		In a transaction of its own: where each assigned partition starts,
 *		and the parked keys read again (a partition may come from another
 *		subscription of the group, which dead-lettered some of its keys
 *		since this worker last read them).
 */
static void
start_assigned(Worker *w, OutboxAssigned *assigned, int n)
{
	TimestampTz deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
													   ASSIGN_CHECK_MS);
	int			i;

	OutboxSubscriberBeginTxn();
	for (i = 0; i < n; i++)
	{
		Part	   *p;

		assigned_start(w, &assigned[i], deadline);
		p = OutboxSubscriberAddPart(w, assigned[i].topic, assigned[i].partition);
		p->next_offset = assigned[i].offset;
		p->retry_offset = -1;
		p->retry_at = 0;
		p->attempts = 0;
		p->assigned = true;
		p->stopped = assigned[i].stop;
	}
	OutboxSubscriberLoadParked(w);
	OutboxSubscriberEndTxn();
}

/*
 * OutboxSubscriberOnAssignment
 *		The consumer's callback (OutboxAssignFn, arg the Worker): partitions
 *		assigned start at the offsets the database holds (start_assigned);
 *		revoked ones are forgotten.  Every error is caught and answered
 *		with false: see the invariants.
 */
bool
OutboxSubscriberOnAssignment(OutboxAssigned *assigned, int n, bool is_assign, void *arg)
{
	Worker	   *w = (Worker *) arg;
	MemoryContext old = CurrentMemoryContext;
	volatile bool ok = true;
	int			i;

	if (!is_assign)
	{
		for (i = 0; i < n; i++)
			OutboxSubscriberForgetPart(w, assigned[i].topic, assigned[i].partition);
		return true;
	}
	PG_TRY();
	{
		start_assigned(w, assigned, n);
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		MemoryContextSwitchTo(old);
		edata = CopyErrorData();
		FlushErrorState();
		AbortCurrentTransaction();
		OutboxInboxSetError(w->slot, edata->message);
		FreeErrorData(edata);
		ok = false;
	}
	PG_END_TRY();
	MemoryContextSwitchTo(old);
	return ok;
}

/* record_stop() in a transaction of its own, from the worker's loop */
static void
record_stop_now(Worker *w, const char *topic, int32 partition, int64 offset)
{
	OutboxSubscriberBeginTxn();
	record_stop(w, topic, partition, offset);
	OutboxSubscriberEndTxn();
}

/*
 * OutboxSubscriberTakeResets
 *		The partitions the consumer found outside their log since the last
 *		poll: stopped, paused and reported.  A logical offset (the log's
 *		beginning) that could not be looked up is tried again later.
 */
void
OutboxSubscriberTakeResets(Worker *w)
{
	OutboxAssigned *resets;
	int			n = OutboxConsumerTakeResets(w->consumer, &resets);
	int			i;

	for (i = 0; i < n; i++)
	{
		OutboxAssigned *r = &resets[i];
		Part	   *p = OutboxSubscriberFindPart(w, r->topic, r->partition);
		OutboxLogRange range;
		bool		known;
		int64		next;

		if (p == NULL || !p->assigned || p->stopped)
			continue;
		if (r->offset < 0)
		{
			/*
			 * The log's beginning or end could not be looked up (a topic
			 * still being made): librdkafka stops fetching the partition
			 * and no seek restarts it, so the consumer is made again, and
			 * the assignment starts the partition afresh, after a pause.
			 */
			w->rejoin = true;
			w->consumer_retry_at = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
															   RESET_RETRY_MS);
			continue;
		}
		p->stopped = true;
		OutboxConsumerPause(w->consumer, r->topic, r->partition);
		/* the group's next offset, not the position the fetch reached */
		next = p->next_offset >= 0 ? p->next_offset : r->offset;
		record_stop_now(w, r->topic, r->partition, next);
		known = OutboxConsumerQueryLog(w->consumer, r->topic, r->partition,
									   RESET_CHECK_MS, &range.low, &range.high);
		OutboxReportStoppedPartition(w->slot, w->sub.name, r->topic, r->partition,
									 next, known ? &range : NULL);
	}
}
