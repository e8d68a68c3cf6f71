/*-------------------------------------------------------------------------
 *
 * consumer/consumer_worker.h
 *		The subscription worker's state, shared by the files of the worker
 *		only: consumer.c (start-up and the loop), consumer_subscription.c
 *		(its row and its handler), consumer_offsets.c (the group's offsets
 *		rows, assignment, stopped partitions), consumer_message.c (a
 *		message as outbox.inbound_message), consumer_apply.c (dedupe and
 *		the handler's call), consumer_dead.c (dead letters and parked
 *		keys), consumer_batch.c (a batch in one transaction),
 *		consumer_replay.c (replays of dead letters) and consumer_worker.c
 *		(the partitions, the prepared statements, the transaction and
 *		subtransaction brackets).
 *
 * Invariants: a worker process has one Worker, owned by consumer.c and
 * passed by pointer; no file of the worker keeps state of its own in
 * file-level statics but consumer_worker.c's transaction bracket.  What
 * lives as long as the worker is allocated in w->cxt; what lives for one
 * batch, in w->batch_cxt.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_CONSUMER_WORKER_H
#define OUTBOX_CONSUMER_WORKER_H

#include "access/tupdesc.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "storage/latch.h"
#include "utils/hsearch.h"

#include "base/base.h"
#include "shmem/shmem.h"
#include "kafka/kafka.h"

#define OUTBOX_PARKED_TAG_LEN	16

/* attributes of outbox.inbound_message read back from its composite */
#define OUTBOX_MESSAGE_TOPIC		2
#define OUTBOX_MESSAGE_HEADERS		7
#define OUTBOX_MESSAGE_EVENT_ID		10

/* the statements each batch runs, prepared at start-up (consumer_worker.c) */
typedef enum WorkerPlan
{
	PLAN_LOCK_OFFSET,			/* lock the group's offsets row of a partition */
	PLAN_INSERT_OFFSET,			/* make that row */
	PLAN_UPDATE_OFFSET,			/* save its next offset */
	PLAN_DEDUPE,				/* insert a message's dedupe row */
	PLAN_LEGACY,				/* look up a dedupe row of before 1.8 */
	PLAN_DEAD,					/* insert a dead letter */
	PLAN_COUNT
} WorkerPlan;

/* a partition this worker was assigned */
typedef struct Part
{
	char		topic[OUTBOX_TOPIC_MAX_LEN + 1];
	int32		partition;
	int64		next_offset;	/* applied up to here (-1: not known yet) */
	int64		retry_offset;	/* the message that failed, -1 none */
	int			attempts;		/* failures of it in a row */
	TimestampTz retry_at;		/* paused until */
	char	   *last_error;		/* of the failed message (the worker's context) */
	char		last_sqlstate[6];
	bool		assigned;		/* by the group (not only met in a batch) */
	bool		stopped;		/* its log does not hold its next offset */
} Part;

typedef struct Subscription
{
	char		name[OUTBOX_SUBSCRIPTION_NAME_MAX];
	char	  **topics;
	int			ntopics;
	char	   *handler_text;	/* regprocedure text, schema-qualified */
	Oid			handler;		/* what it names now: see
								 * OutboxSubscriberHandlerProblem */
	Oid			handler_owner;	/* its owner at subscribe(): must not change */
	Oid			owner;
	char	   *group_id;
	char	   *kafka_group;	/* the Kafka group.id: see read_row */
	char	   *dedupe_name;	/* its consumer in outbox.inbox: see dedupe_key */
	char	   *legacy_name;	/* the consumer of 1.7's unscoped rows */
	bool		legacy_rows;	/* the group had some when the worker started */
	bool		earliest;
	int			max_attempts;	/* 0: outbox.max_attempts */
	bool		block;
	int			batch_size;
} Subscription;

typedef struct Worker
{
	OutboxInboxSlot *slot;
	Subscription sub;
	MemoryContext cxt;			/* the worker's life */
	MemoryContext batch_cxt;	/* reset per batch */
	OutboxConsumer *consumer;
	TimestampTz consumer_retry_at;
	int			event_pipe[2];
	WaitEventSet *wait_set;
	FmgrInfo	handler;		/* made again in each transaction (batch_cxt) */
	bool		refused;		/* the owner may no longer run the handler */
	TupleDesc	tupdesc;		/* outbox.inbound_message */
	Oid			typid;
	Part	  **parts;			/* partitions assigned or met (each palloc'd) */
	int			nparts;
	int			maxparts;
	HTAB	   *parked;			/* topic/key with dead letters: block policy */
	bool		rejoin;			/* leave the group and join again */
	TimestampTz last_replay_check;
	TimestampTz last_report;
	SPIPlanPtr	plans[PLAN_COUNT];
} Worker;

/* a topic/key with dead letters, in w->parked or a replay's failed keys */
typedef struct ParkedKey
{
	char		key[OUTBOX_PARKED_TAG_LEN]; /* see OutboxSubscriberParkedTag */
	int64		head;			/* the oldest dead letter of the key */
} ParkedKey;

/* an error a subtransaction caught, as a dead letter keeps it */
typedef struct Failure
{
	char	   *message;
	char		sqlstate[6];
} Failure;

/* what OutboxSubscriberTry runs in a subtransaction; errors propagate */
typedef void (*SubxactBody) (Worker *w, void *arg);

/* consumer_worker.c */
extern void OutboxSubscriberBeginTxn(void);
extern void OutboxSubscriberEndTxn(void);
extern bool OutboxSubscriberTry(Worker *w, SubxactBody body, void *arg, Failure *f);
extern void OutboxSubscriberPreparePlans(Worker *w);
extern void OutboxSubscriberRunPlan(Worker *w, WorkerPlan plan, Datum *args,
									const char *nulls, long count);
extern Part *OutboxSubscriberFindPart(Worker *w, const char *topic, int32 partition);
extern Part *OutboxSubscriberAddPart(Worker *w, const char *topic, int32 partition);
extern void OutboxSubscriberForgetPart(Worker *w, const char *topic, int32 partition);

/* consumer_message.c */
extern bool OutboxSubscriberIsText(const char *s, int len);
extern Datum OutboxSubscriberMessage(Worker *w, const OutboxInbound *m, bool payload);
extern Datum OutboxSubscriberKeptMessage(Worker *w, const OutboxInbound *m);
extern Datum OutboxSubscriberMessageAttr(Worker *w, Datum message, int attno,
										 bool *isnull);

/* consumer_subscription.c */
extern bool OutboxSubscriberLoad(Worker *w, const char *name, char **problem);
extern char *OutboxSubscriberHandlerProblem(Worker *w);
extern void OutboxSubscriberCheckHandler(Worker *w);

/* consumer_dead.c */
extern void OutboxSubscriberParkedTag(const char *topic, const char *key, char *tag);
extern HTAB *OutboxSubscriberParkedTable(const char *name, MemoryContext cxt);
extern ParkedKey *OutboxSubscriberParkedHead(Worker *w, const OutboxInbound *m);
extern void OutboxSubscriberParkKey(Worker *w, const char *topic, const char *key,
									int64 head);
extern void OutboxSubscriberLoadParked(Worker *w);
extern int64 OutboxSubscriberDeadLetter(Worker *w, const OutboxInbound *m,
										const char *state, int64 blocked_by,
										int attempts, const Failure *f);

/* consumer_offsets.c */
extern int64 OutboxSubscriberLockOffset(Worker *w, const char *topic,
										int32 partition, int64 first);
extern void OutboxSubscriberSaveOffset(Worker *w, const char *topic,
									   int32 partition, int64 next);
extern bool OutboxSubscriberOnAssignment(OutboxAssigned *assigned, int n,
										 bool is_assign, void *arg);
extern void OutboxSubscriberTakeResets(Worker *w);

/* consumer_apply.c */
extern bool OutboxSubscriberApplyMessage(Worker *w, Datum message);
extern bool OutboxSubscriberTryApply(Worker *w, const OutboxInbound *m,
									 Datum message, bool *applied, Failure *f);

/* consumer_batch.c */
extern void OutboxSubscriberApplyBatch(Worker *w, OutboxInbound *msgs, int n);

/* consumer_replay.c */
extern bool OutboxSubscriberRunReplays(Worker *w);

#endif							/* OUTBOX_CONSUMER_WORKER_H */
