/*-------------------------------------------------------------------------
 *
 * consumer/consumer_range.c
 *		A subscription's partition whose log does not hold the consumer
 *		group's next offset: how the worker finds it and how it says so.
 *
 * Invariants:
 *	- A next offset outside the partition's log is never taken as "applied
 *	  up to there".  Above the log's end it means the log is another one
 *	  (a rebuilt cluster, a re-created topic, a disaster-recovery cluster
 *	  with other offsets): every message there would look applied.  Below
 *	  the log's start it means messages were deleted before they were
 *	  applied.  Either way the worker applies nothing more of that
 *	  partition until someone who may decide moves the group's offset with
 *	  outbox.subscription_seek(), which restarts the group's workers.
 *	- A log the leader does not describe in time is not judged here; the
 *	  fetch's own offset-out-of-range answer still stops the partition
 *	  (auto.offset.reset is error: kafka_consumer.c).
 *	- Saying so: the slot's state and last error, and one WARNING per
 *	  partition stopped, with the offsets and the way to resume.
 *
 * Nothing here runs SQL.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "shmem/shmem.h"
#include "kafka/kafka.h"
#include "consumer/consumer.h"

/*
 * OutboxOffsetOutsideLog
 *		Whether next_offset of topic/partition lies outside the partition's
 *		log, as its leader describes it within timeout_ms; the log's bounds
 *		in *range when it does.  False when the log holds it or the leader
 *		does not answer.
 */
bool
OutboxOffsetOutsideLog(OutboxConsumer *consumer, const char *topic,
					   int32 partition, int64 next_offset, int timeout_ms,
					   OutboxLogRange *range)
{
	int64		low;
	int64		high;

	if (next_offset < 0 ||
		!OutboxConsumerQueryLog(consumer, topic, partition, timeout_ms, &low, &high))
		return false;
	range->low = low;
	range->high = high;
	return next_offset < low || next_offset > high;
}

/*
 * OutboxReportStoppedPartition
 *		Tell the slot and the log that the worker stopped topic/partition of
 *		subscription because the group's next_offset is outside its log
 *		(range NULL: the log's bounds are not known).
 */
void
OutboxReportStoppedPartition(OutboxInboxSlot *slot, const char *subscription,
							 const char *topic, int32 partition,
							 int64 next_offset, const OutboxLogRange *range)
{
	char	   *bounds;
	char	   *detail;

	if (range == NULL)
	{
		bounds = pstrdup("its log's bounds are not known");
		detail = psprintf("The consumer group's next offset is " INT64_FORMAT ", which the partition's leader answered is out of range.",
						  next_offset);
	}
	else if (next_offset < range->low)
	{
		bounds = psprintf("its log starts at " INT64_FORMAT, range->low);
		detail = psprintf("The consumer group's next offset is " INT64_FORMAT ", but the partition's log starts at " INT64_FORMAT " and ends at " INT64_FORMAT ": the messages from " INT64_FORMAT " to " INT64_FORMAT " were deleted before they were applied.",
						  next_offset, range->low, range->high,
						  next_offset, range->low - 1);
	}
	else
	{
		bounds = psprintf("its log ends at " INT64_FORMAT, range->high);
		detail = psprintf("The consumer group's next offset is " INT64_FORMAT ", but the partition's log starts at " INT64_FORMAT " and ends at " INT64_FORMAT ": it is not the log the offset was stored for (a rebuilt cluster, a re-created topic or another cluster), and its messages would all look applied.",
						  next_offset, range->low, range->high);
	}
	OutboxInboxSetError(slot,
						psprintf("partition %d of topic \"%s\" is stopped: the next offset " INT64_FORMAT " is outside its log (%s); resume with outbox.subscription_seek()",
								 partition, topic, next_offset, bounds));
	OutboxInboxSetState(slot, OUTBOX_INBOX_PARTITION_STOPPED);
	ereport(WARNING,
			(errcode(ERRCODE_DATA_EXCEPTION),
			 errmsg("outbox subscription \"%s\" stopped partition %d of topic \"%s\": its next offset " INT64_FORMAT " is outside the partition's log",
					subscription, partition, topic, next_offset),
			 errdetail_internal("%s", detail),
			 errhint("Nothing more of this partition is applied until the group's next offset is set on purpose: check what the partition holds, then call outbox.subscription_seek('%s', '%s', %d, N) with N the offset of the first message to apply (0 for a log that starts over).",
					 subscription, topic, partition)));
	pfree(bounds);
	pfree(detail);
}
