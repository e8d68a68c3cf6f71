/*-------------------------------------------------------------------------
 *
 * consumer/consumer.h
 *		Subscriptions: subscribe() and its kin in user backends, and the
 *		subscription worker that applies Kafka to the database once.
 *
 * What the consumer room offers to the rooms above it; a file includes only
 * the headers of rooms below its own (docs/design.md).
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_CONSUMER_H
#define OUTBOX_CONSUMER_H

#include "postgres.h"

#include "base/base.h"
#include "shmem/shmem.h"
#include "kafka/kafka.h"

/* consumer_range.c: a partition whose log does not hold the group's next offset */
typedef struct OutboxLogRange
{
	int64		low;			/* the first offset the log holds */
	int64		high;			/* the offset its next message gets */
} OutboxLogRange;

extern bool OutboxOffsetOutsideLog(OutboxConsumer *consumer, const char *topic,
								   int32 partition, int64 next_offset,
								   int timeout_ms, OutboxLogRange *range);
extern void OutboxReportStoppedPartition(OutboxInboxSlot *slot,
										 const char *subscription,
										 const char *topic, int32 partition,
										 int64 next_offset,
										 const OutboxLogRange *range);

/* subscribe_handler.c: what makes a function a handler, for subscribe() and the worker */
extern Oid	OutboxHandlerByName(const char *text);
extern bool OutboxCheckHandler(Oid func, Oid typid, Oid *owner, char **problem);
extern bool OutboxRoleMayExecute(Oid role, Oid func);
extern Oid	OutboxInboundType(void);

/* subscribe.c: SQL run with the extension owner's rights, search_path pinned */
typedef struct OutboxAsOwner
{
	Oid			user;
	int			sec;
	int			nestlevel;
} OutboxAsOwner;

extern void OutboxAsOwnerBegin(OutboxAsOwner *save);
extern void OutboxAsOwnerEnd(OutboxAsOwner *save);
extern void OutboxSubscriptionsAnnounce(void);

/* consumer.c: the subscription worker (its other files share consumer_worker.h) */
PGDLLEXPORT void OutboxConsumerMain(Datum main_arg);

#endif							/* OUTBOX_CONSUMER_H */
