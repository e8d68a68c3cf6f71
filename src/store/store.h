/*-------------------------------------------------------------------------
 *
 * store/store.h
 *		The relay's SQL: progress, pages of events and of the replay queue,
 *		dead letters, held partitions, retention and restored events; and
 *		what dropping the extension would lose.
 *
 * What the store room offers to the rooms above it; a file includes only
 * the headers of rooms below its own (docs/design.md).
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_STORE_H
#define OUTBOX_STORE_H

#include "postgres.h"

#include "base/base.h"
#include "kafka/kafka.h"

/* store_batch.c, store_dead.c, store_upkeep.c: the relay's SQL */

/*
 * The relay's position.  prev: snapshot in which every committed event is
 * delivered (NULL: none yet).  cur: snapshot of the batch under way (NULL:
 * none); the batch is every event visible in cur and not in prev, and
 * last_id is the last id of it acknowledged.  Strings live in the relay's
 * long-lived context.
 */
typedef struct OutboxBatch
{
	char	   *prev;
	char	   *cur;
	int64		last_id;
	int64		max_id;
	int64		remaining;
	/*
	 * The last OpenBatch() found nothing in a snapshot it took then, which
	 * prev now is; false after a resumed batch's (taken before a restart)
	 * or once prev is anything else.
	 */
	bool		fresh;
} OutboxBatch;

extern bool OutboxStoreExtensionPresent(void);

/* store_schema.c */
extern void OutboxStoreRecordSchema(const char *topic, int32 id, const char *json);

extern void OutboxStoreLoadProgress(OutboxBatch *batch, MemoryContext cxt);
extern void OutboxStoreLoadOrigin(bool force);
extern int64 OutboxStoreAdoptRestored(bool force);
extern bool OutboxStoreOpenBatch(OutboxBatch *batch, MemoryContext cxt);
extern int	OutboxStoreReadPage(OutboxBatch *batch, int limit, int max_bytes,
								OutboxEvent **events, MemoryContext cxt,
								bool *cut);
extern void OutboxStoreSavePage(const char *cur, int64 last_id,
								int count, bool batch_done);
extern int64 OutboxStoreLoadKafkaTransaction(void);
extern void OutboxStoreSaveKafkaTransaction(int64 n);

/*
 * How a dead letter's last_error words its event's last delivery error:
 * the caller's (OutboxDeliveryErrorText), as the SQL files know no Kafka.
 */
typedef const char *(*OutboxErrorWording) (int err, bool local);

extern int	OutboxStoreRecordDeadLetters(OutboxEvent *events, int n,
										 OutboxErrorWording wording);
extern List *OutboxStoreLoadBlocked(MemoryContext cxt);
extern int	OutboxStoreLoadUnsettledDeadLetters(int64 **ids, MemoryContext cxt);
extern int	OutboxStoreReadReplays(int limit, OutboxEvent **events,
								   MemoryContext cxt);
extern void OutboxStoreFinishReplays(OutboxEvent *events, int n,
									 OutboxErrorWording wording);
extern int64 OutboxStoreCleanup(int max_events, TimestampTz *oldest);
extern int64 OutboxStoreInboxCleanup(int max_rows);

/* store_rotation.c: the log's ring of generations */
typedef struct OutboxRotation
{
	TimestampTz next_look;		/* when a step may do something next */
	int			current;		/* the current generation after the step */
	bool		opened;			/* the step opened it */
	bool		emptied_any;	/* the step emptied generation emptied */
	int			emptied;
	const char *waits_for;		/* what keeps the oldest closed generation
								 * past its retention; NULL: nothing */
} OutboxRotation;

extern bool OutboxStoreLogRotates(void);
extern void OutboxStoreRotate(int retention, OutboxRotation *out);

/* store_held.c: held partitions */
typedef struct OutboxHeldPartition
{
	char	   *topic;
	int32		partition;
	int32		partitions;		/* the count it was computed among; 0: unknown */
	int64		events;
	TimestampTz since;
} OutboxHeldPartition;

extern bool OutboxStoreHeldPresent(bool *counted);
extern int	OutboxStoreLoadHolds(OutboxHeldPartition **holds, bool counted,
								 MemoryContext cxt);
extern int64 OutboxStoreHoldEvents(const OutboxEvent *events, int n, bool counted);
extern int64 OutboxStoreReleaseHeld(const OutboxEvent *events, int n);
extern int	OutboxStoreReadHeld(const char *topic, int32 partition, int limit,
								OutboxEvent **events, MemoryContext cxt);
extern void OutboxStoreDeleteHeld(int64 id);
extern int64 OutboxStoreEndHold(const char *topic, int32 partition);

/*
 * store_undelivered.c: what dropping the extension would delete undelivered
 * (for the utility hook, in a user backend)
 */
typedef struct OutboxUndelivered
{
	int64		waiting;		/* not delivered by the relay's progress, or restored and not judged */
	int64		held;			/* in outbox.held */
	int64		dead;			/* dead letters neither replayed nor discarded */
} OutboxUndelivered;

extern void OutboxStoreCountUndelivered(Oid nsp, OutboxUndelivered *counts);

/* an aggregate whose events wait behind a quarantined one */
typedef struct OutboxBlocked
{
	char	   *aggregate_type;
	char	   *aggregate_id;
	char	   *head;			/* event id of the quarantined event */
} OutboxBlocked;

#endif							/* OUTBOX_STORE_H */
