/*-------------------------------------------------------------------------
 *
 * consumer/consumer_batch.c
 *		A batch of messages applied by the subscription worker in one
 *		transaction, with each partition's offset and each message's
 *		dedupe row; then Kafka and the slot are told.
 *
 * Invariants:
 *	- Exactly-once effect.  A batch is applied in one transaction that
 *	  also locks and advances each partition's row in
 *	  outbox.inbox_offsets and inserts each message's dedupe row.  A crash
 *	  anywhere rolls the handler's effects, the dedupe rows and the
 *	  offsets back together.  Kafka hears of an offset only after the
 *	  database committed it.
 *	- A handler error costs only its message.  A batch is first tried in
 *	  one subtransaction; when anything in it fails, it is rolled back and
 *	  done again with a subtransaction per message.  The failed message's
 *	  partition stops there: its offset is kept, the consumer rewinds and
 *	  pauses it, and it is tried again after a backoff with jitter.  After
 *	  max_attempts failures in a row it goes to outbox.inbox_dead_letters,
 *	  and, with the block policy, later messages of its topic and key are
 *	  parked there behind it until it is replayed or discarded.
 *	- The handler is checked (and the subscription's row locked) at the
 *	  start of every batch's transaction (OutboxSubscriberCheckHandler).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "common/pg_prng.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "consumer/consumer_worker.h"
#include "base/base.h"
#include "shmem/shmem.h"
#include "kafka/kafka.h"

/* what became of one message of a batch */
typedef enum Outcome
{
	OUTCOME_NONE = 0,			/* nothing yet: to be applied */
	OUTCOME_OLD,				/* below the stored offset: applied before */
	OUTCOME_DROPPED,			/* after a failure in its partition: comes again */
	OUTCOME_APPLIED,
	OUTCOME_DUPLICATE,			/* its id was in the inbox */
	OUTCOME_PARKED,
	OUTCOME_FAILED,				/* tried again after a backoff */
	OUTCOME_DEAD
} Outcome;

/* within a batch: a partition's row, locked */
typedef struct BatchPart
{
	Part	   *part;
	int64		stored;			/* next_offset in the table */
	int64		next;			/* after this batch */
	bool		stopped;
	bool		waiting;		/* for the failed message (part->retry_offset)
								 * to come again: nothing after it before */
} BatchPart;

/* a batch on its way, as apply_all's subtransaction and try_each see it */
typedef struct Batch
{
	OutboxInbound *msgs;
	int			n;
	Outcome    *out;			/* of each message */
	BatchPart  *bps;			/* of each partition met */
	int			nbps;
} Batch;

static int
effective_max_attempts(Worker *w)
{
	return w->sub.max_attempts > 0 ? w->sub.max_attempts : outbox_max_attempts;
}

/* backoff before attempt n+1, with full jitter over its upper half */
static int
backoff_ms(int attempts)
{
	double		ms = outbox_retry_backoff_min;
	int			i;

	for (i = 1; i < attempts && ms < outbox_retry_backoff_max; i++)
		ms *= 2;
	ms = Min(ms, (double) outbox_retry_backoff_max);
	return (int) (ms / 2 + (ms / 2) * pg_prng_double(&pg_global_prng_state));
}

/* the partition of m among those of the batch met so far, NULL none */
static BatchPart *
batch_part(Batch *b, const OutboxInbound *m)
{
	int			i;

	for (i = 0; i < b->nbps; i++)
		if (b->bps[i].part->partition == m->partition &&
			strcmp(b->bps[i].part->topic, m->topic) == 0)
			return &b->bps[i];
	return NULL;
}

/*
 * lock_partitions
 *		Lock the offset row of each partition of the batch (making it when
 *		missing) and read its next offset.  A row another worker of the
 *		group moved since this one last knew it makes the parked keys read
 *		again, now that the lock orders the two (see consumer_dead.c).  A
 *		row moved back (outbox.subscription_seek()) is not for this batch:
 *		the worker's position is past it.
 */
static void
lock_partitions(Worker *w, Batch *b)
{
	bool		moved = false;
	int			i;

	b->nbps = 0;
	for (i = 0; i < b->n; i++)
	{
		OutboxInbound *m = &b->msgs[i];
		BatchPart  *bp = batch_part(b, m);

		if (bp != NULL)
			continue;
		bp = &b->bps[b->nbps++];
		bp->part = OutboxSubscriberAddPart(w, m->topic, m->partition);
		bp->stopped = false;
		bp->waiting = bp->part->retry_offset >= 0;
		bp->stored = OutboxSubscriberLockOffset(w, m->topic, m->partition, m->offset);
		bp->next = bp->stored;
		if (bp->part->next_offset >= 0 && bp->stored < bp->part->next_offset)
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("outbox subscription \"%s\": the next offset of partition %d of topic \"%s\" was moved back from " INT64_FORMAT " to " INT64_FORMAT,
							w->sub.name, bp->part->partition, bp->part->topic,
							bp->part->next_offset, bp->stored),
					 errdetail("The worker stops and starts again from the stored offset.")));
		if (bp->stored != bp->part->next_offset)
			moved = true;
	}
	if (moved)
		OutboxSubscriberLoadParked(w);
}

/*
 * held_back
 *		Whether m must wait: its partition backs off after a failure, or m
 *		comes after the failed message, which must come again first (a
 *		message fetched before the rewind).
 */
static bool
held_back(BatchPart *bp, const OutboxInbound *m)
{
	Part	   *p = bp->part;

	if (bp->stopped || p->retry_at != 0)
		return true;
	if (bp->waiting)
	{
		if (m->offset > p->retry_offset)
		{
			/* the failed message was skipped: rewind again, at once */
			bp->stopped = true;
			p->retry_at = GetCurrentTimestamp();
			return true;
		}
		bp->waiting = false;
	}
	return false;
}

/*
 * fate_before
 *		What becomes of m before its handler is tried: old (below the
 *		stored offset), dropped (held back), or parked behind its key's
 *		dead letter (inserted as parked); OUTCOME_NONE when it is to be
 *		applied.
 */
static Outcome
fate_before(Worker *w, BatchPart *bp, const OutboxInbound *m)
{
	ParkedKey  *pk;

	if (m->offset < bp->next)
		return OUTCOME_OLD;
	if (held_back(bp, m))
		return OUTCOME_DROPPED;
	if ((pk = OutboxSubscriberParkedHead(w, m)) == NULL)
		return OUTCOME_NONE;
	(void) OutboxSubscriberDeadLetter(w, m, "parked", pk->head, 0, NULL);
	bp->next = m->offset + 1;
	return OUTCOME_PARKED;
}

/* try_all's subtransaction: every applicable message, errors propagate */
static void
apply_all(Worker *w, void *arg)
{
	Batch	   *b = (Batch *) arg;
	int			i;

	for (i = 0; i < b->n; i++)
	{
		OutboxInbound *m = &b->msgs[i];
		BatchPart  *bp = batch_part(b, m);

		b->out[i] = fate_before(w, bp, m);
		if (b->out[i] != OUTCOME_NONE)
			continue;
		b->out[i] = OutboxSubscriberApplyMessage(w, OutboxSubscriberMessage(w, m, true)) ?
			OUTCOME_APPLIED : OUTCOME_DUPLICATE;
		bp->next = m->offset + 1;
	}
}

/*
 * try_all
 *		Apply every applicable message in one subtransaction.  False (and
 *		everything rolled back, the partitions as locked) when anything
 *		failed.
 */
static bool
try_all(Worker *w, Batch *b)
{
	int			i;

	if (OutboxSubscriberTry(w, apply_all, b, NULL))
		return true;
	for (i = 0; i < b->nbps; i++)
	{
		b->bps[i].next = b->bps[i].stored;
		b->bps[i].stopped = false;
		b->bps[i].waiting = b->bps[i].part->retry_offset >= 0;
	}
	memset(b->out, 0, sizeof(Outcome) * b->n);
	return false;
}

/*
 * failed
 *		m failed in its own subtransaction (f).  Counts the attempt; at
 *		max_attempts m goes to the dead letters (its key parked behind it
 *		under the block policy) and its partition goes on, else the
 *		partition stops there and backs off.  Returns m's outcome.
 */
static Outcome
failed(Worker *w, BatchPart *bp, const OutboxInbound *m, const Failure *f)
{
	Part	   *p = bp->part;
	int64		id;

	/* the same message failing again, or a first failure */
	if (p->retry_offset != m->offset)
	{
		p->retry_offset = m->offset;
		p->attempts = 0;
	}
	p->attempts++;
	if (p->last_error)
		pfree(p->last_error);
	p->last_error = MemoryContextStrdup(w->cxt, f->message);
	strlcpy(p->last_sqlstate, f->sqlstate, sizeof(p->last_sqlstate));
	OutboxInboxSetError(w->slot, f->message);
	if (p->attempts < effective_max_attempts(w))
	{
		bp->stopped = true;
		p->retry_at = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
												  backoff_ms(p->attempts));
		return OUTCOME_FAILED;
	}
	id = OutboxSubscriberDeadLetter(w, m, "dead", 0, p->attempts, f);
	if (w->sub.block && m->key != NULL && OutboxSubscriberIsText(m->key, m->key_len) && id > 0)
		OutboxSubscriberParkKey(w, m->topic, m->key, id);
	p->retry_offset = -1;
	p->attempts = 0;
	bp->next = m->offset + 1;
	return OUTCOME_DEAD;
}

/* one by one, after try_all failed: failures stop their partition */
static void
try_each(Worker *w, Batch *b)
{
	int			i;

	for (i = 0; i < b->n; i++)
	{
		const OutboxInbound *m = &b->msgs[i];
		BatchPart  *bp = batch_part(b, m);
		bool		applied;
		Failure		f;

		b->out[i] = fate_before(w, bp, m);
		if (b->out[i] != OUTCOME_NONE)
			continue;
		if (!OutboxSubscriberTryApply(w, m, (Datum) 0, &applied, &f))
		{
			b->out[i] = failed(w, bp, m, &f);
			continue;
		}
		b->out[i] = applied ? OUTCOME_APPLIED : OUTCOME_DUPLICATE;
		bp->next = m->offset + 1;
	}
}

/* the slot's counts of a batch's outcomes */
static void
count_outcomes(const Batch *b, OutboxInboxTally *tally)
{
	int			i;

	memset(tally, 0, sizeof(*tally));
	for (i = 0; i < b->n; i++)
	{
		switch (b->out[i])
		{
			case OUTCOME_APPLIED:
				tally->processed++;
				break;
			case OUTCOME_OLD:
			case OUTCOME_DUPLICATE:
				tally->deduplicated++;
				break;
			case OUTCOME_PARKED:
				tally->parked++;
				break;
			case OUTCOME_DEAD:
				tally->failed++;
				tally->dead_lettered++;
				break;
			case OUTCOME_FAILED:
				tally->failed++;
				break;
			default:
				break;
		}
	}
}

/*
 * settle
 *		The batch committed: tell Kafka and the slot, rewind the stopped
 *		partitions, forget a retry its partition went past.
 */
static void
settle(Worker *w, Batch *b)
{
	OutboxInboxTally tally;
	int			i;

	count_outcomes(b, &tally);
	for (i = 0; i < b->nbps; i++)
	{
		BatchPart  *bp = &b->bps[i];
		Part	   *p = bp->part;

		if (bp->next > bp->stored)
			OutboxConsumerCommit(w->consumer, p->topic, p->partition, bp->next);
		p->next_offset = bp->next;
		if (bp->stopped)
			OutboxConsumerRewind(w->consumer, p->topic, p->partition, p->retry_offset);
		else if (p->retry_offset >= 0 && p->retry_offset < bp->next)
		{
			p->retry_offset = -1;
			p->attempts = 0;
		}
	}
	OutboxInboxReport(w->slot, &tally, NULL, -1);
}

/*
 * OutboxSubscriberApplyBatch
 *		Apply n messages (in batch_cxt) in one transaction of their own:
 *		see the invariants.
 */
void
OutboxSubscriberApplyBatch(Worker *w, OutboxInbound *msgs, int n)
{
	Batch		b;
	int			i;

	b.msgs = msgs;
	b.n = n;
	b.out = palloc0(sizeof(Outcome) * n);
	b.bps = palloc(sizeof(BatchPart) * n);
	OutboxSubscriberBeginTxn();
	OutboxSubscriberCheckHandler(w);
	lock_partitions(w, &b);
	if (!try_all(w, &b))
		try_each(w, &b);
	for (i = 0; i < b.nbps; i++)
		if (b.bps[i].next > b.bps[i].stored)
			OutboxSubscriberSaveOffset(w, b.bps[i].part->topic,
									   b.bps[i].part->partition, b.bps[i].next);
	OutboxSubscriberEndTxn();
	settle(w, &b);
}
