/*-------------------------------------------------------------------------
 *
 * consumer/consumer.c
 *		The subscription worker: consumes a subscription's topics from Kafka
 *		and applies each message once to the database, through the
 *		subscription's handler, as the subscription's owner.  Here: its
 *		start-up and its loop; each step is in the files consumer_worker.h
 *		names.
 *
 * Invariants:
 *	- Exactly-once effect: a batch is applied in one transaction with its
 *	  partitions' offsets and its dedupe rows (consumer_batch.c); the
 *	  database's offsets, dedupe rows and dead letters belong to the
 *	  consumer group, so the subscriptions of one group hand partitions
 *	  over exactly (consumer_offsets.c).
 *	- Broker trouble never becomes an ERROR: librdkafka's errors go to the
 *	  slot's last error.  An ERROR in the worker's own SQL ends the worker;
 *	  the launcher starts it again and it resumes from the database.
 *	- The worker never holds a transaction while it waits.
 *	- A worker that may not run its handler (consumer_subscription.c)
 *	  says why and waits for its row to change, then exits for the
 *	  launcher to start it again; one whose row is gone stops.
 *	- librdkafka is on the stack in its callbacks: interrupts are held
 *	  while the consumer is polled, so no exit happens from there.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <unistd.h>

#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "tcop/tcopprot.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "base/compat.h"
#include "consumer/consumer_worker.h"
#include "base/base.h"
#include "shmem/shmem.h"
#include "kafka/kafka.h"
#include "consumer/consumer.h"

#define WAIT_IDLE_MS		1000	/* lag and replays are looked at this often */
#define REPLAY_CHECK_MS		10000
#define CLOSE_TIMEOUT_MS	5000
#define CONSUMER_RETRY_MS	10000	/* after the consumer could not be made */

static Worker worker;

static uint32 wait_main_event;

/* the messages of the batch minus those of stopped partitions; how many */
static int
drop_stopped(Worker *w, OutboxInbound *msgs, int n)
{
	bool		any = false;
	int			kept = 0;
	int			i;

	for (i = 0; i < w->nparts; i++)
		any |= w->parts[i]->stopped;
	if (!any)
		return n;
	for (i = 0; i < n; i++)
	{
		Part	   *p = OutboxSubscriberFindPart(w, msgs[i].topic, msgs[i].partition);

		if (p != NULL && p->stopped)
			continue;
		if (kept != i)
			msgs[kept] = msgs[i];
		kept++;
	}
	return kept;
}

/* the slot's view of the assigned partitions: next offsets and lag */
static void
report_parts(Worker *w)
{
	OutboxInboxPart *parts = palloc0(sizeof(OutboxInboxPart) * Max(1, w->nparts));
	OutboxInboxTally none;
	int			n;
	int			i;

	memset(&none, 0, sizeof(none));
	n = 0;
	for (i = 0; i < w->nparts && n < OUTBOX_INBOX_PARTS_MAX; i++)
	{
		Part	   *p = w->parts[i];

		if (!p->assigned)
			continue;
		strlcpy(parts[n].topic, p->topic, sizeof(parts[n].topic));
		parts[n].partition = p->partition;
		parts[n].next_offset = p->next_offset;
		/* a stopped partition's lag is not known: its log is another */
		parts[n].high = w->consumer && !p->stopped ?
			OutboxConsumerHighWatermark(w->consumer, p->topic, p->partition) : -1;
		n++;
	}
	OutboxInboxReport(w->slot, &none, parts, n);
	pfree(parts);
}

/* resume partitions whose backoff is over; returns ms to the next one */
static long
resume_due(Worker *w)
{
	TimestampTz now = GetCurrentTimestamp();
	long		next = WAIT_IDLE_MS;
	int			i;

	for (i = 0; i < w->nparts; i++)
	{
		Part	   *p = w->parts[i];

		if (p->retry_at == 0)
			continue;
		if (p->retry_at <= now)
		{
			p->retry_at = 0;
			OutboxConsumerResume(w->consumer, p->topic, p->partition);
		}
		else
			next = Min(next, Max(1, TimestampDifferenceMilliseconds(now, p->retry_at)));
	}
	return next;
}

/*
 * show_state
 *		The slot's state for a worker with a consumer: a stopped partition,
 *		one waiting to retry, a group not joined yet, or running.
 */
static void
show_state(Worker *w)
{
	bool		retrying = false;
	bool		stopped = false;
	int			i;

	for (i = 0; i < w->nparts; i++)
	{
		stopped |= w->parts[i]->stopped && w->parts[i]->assigned;
		retrying |= w->parts[i]->retry_at != 0;
	}
	OutboxInboxSetState(w->slot, stopped ? OUTBOX_INBOX_PARTITION_STOPPED :
						retrying ? OUTBOX_INBOX_RETRYING :
						!OutboxConsumerJoined(w->consumer) ? OUTBOX_INBOX_JOINING :
						OUTBOX_INBOX_RUNNING);
}

/* the worker's one wait: its latch, postmaster death, the consumer's pipe */
static void
worker_wait(Worker *w, long timeout)
{
	WaitEvent	events[3];
	int			n;
	int			i;

	pgstat_report_activity(STATE_IDLE, NULL);
	n = WaitEventSetWait(w->wait_set, timeout, events, lengthof(events),
						 OutboxWaitEvent(&wait_main_event, "OutboxSubscription"));
	for (i = 0; i < n; i++)
	{
		if (events[i].events & WL_LATCH_SET)
			ResetLatch(MyLatch);
		if (events[i].events & WL_SOCKET_READABLE)
		{
			char		drain[64];

			while (read(w->event_pipe[0], drain, sizeof(drain)) > 0)
				;
		}
	}
}

/* on exit: leave the group, give the slot back */
static void
worker_detach(int code, Datum arg)
{
	Worker	   *w = (Worker *) DatumGetPointer(arg);

	if (w->consumer != NULL)
	{
		/* leave the group, so that its partitions move at once */
		OutboxConsumerDestroy(w->consumer, CLOSE_TIMEOUT_MS);
		w->consumer = NULL;
	}
	OutboxInboxDetach(w->slot);
}

/* build the consumer when there is none and it is time; false: not now */
static bool
ensure_consumer(Worker *w)
{
	char	   *why = NULL;
	char		client_id[OUTBOX_SUBSCRIPTION_NAME_MAX + 16];

	if (w->consumer != NULL && (OutboxConsumerOutdated(w->consumer) || w->rejoin))
	{
		w->rejoin = false;
		/* new settings: leave the group, join again */
		OutboxConsumerDestroy(w->consumer, CLOSE_TIMEOUT_MS);
		w->consumer = NULL;
		w->nparts = 0;
	}
	if (w->consumer != NULL)
		return true;
	if (outbox_kafka_brokers[0] == '\0')
	{
		OutboxInboxSetState(w->slot, OUTBOX_INBOX_NOT_CONFIGURED);
		return false;
	}
	if (GetCurrentTimestamp() < w->consumer_retry_at)
		return false;
	snprintf(client_id, sizeof(client_id), "outbox-%s", w->sub.name);
	w->consumer = OutboxConsumerCreate(w->sub.kafka_group, client_id,
									   w->sub.topics, w->sub.ntopics,
									   w->event_pipe[1], OutboxSubscriberOnAssignment,
									   w, &why);
	if (w->consumer == NULL)
	{
		OutboxInboxSetError(w->slot, why);
		OutboxInboxSetState(w->slot, OUTBOX_INBOX_NOT_CONFIGURED);
		ereport(WARNING,
				(errmsg("outbox subscription \"%s\" cannot consume: %s", w->sub.name, why)));
		w->consumer_retry_at = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
														   CONSUMER_RETRY_MS);
		return false;
	}
	return true;
}

/* whether the handler's problem is gone now (a grant or owner put back) */
static bool
problem_gone(Worker *w)
{
	bool		gone;

	MemoryContextReset(w->batch_cxt);
	MemoryContextSwitchTo(w->batch_cxt);
	OutboxSubscriberBeginTxn();
	gone = OutboxSubscriberHandlerProblem(w) == NULL;
	OutboxSubscriberEndTxn();
	return gone;
}

/*
 * wait_for_change
 *		The worker cannot run its handler: say why, then wait until the
 *		subscription's row changes, or (every 10 s) the problem is gone,
 *		and exit for the launcher to start it again.  Never returns.
 */
static void
wait_for_change(Worker *w, const char *name, const char *problem)
{
	bool		recheck = w->sub.name[0] != '\0';	/* the row was read */

	OutboxInboxSetError(w->slot, problem);
	OutboxInboxSetState(w->slot, OUTBOX_INBOX_NOT_CONFIGURED);
	ereport(WARNING,
			(errcode(strstr(problem, "ALTER EXTENSION") != NULL ?
					 ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE : ERRCODE_INSUFFICIENT_PRIVILEGE),
			 errmsg("outbox subscription \"%s\" cannot run its handler: %s", name, problem)));
	while (!OutboxInboxTakeChanged(w->slot))
	{
		CHECK_FOR_INTERRUPTS();
		worker_wait(w, 10000);
		if (recheck && problem_gone(w))
			break;
	}
	proc_exit(0);
}

/*
 * start
 *		Start-up, attached to the slot and connected: the worker's memory
 *		contexts, settings and wait set (worker.c), the secrets file, then
 *		its subscription's row, plans and parked keys.  Stops the worker
 *		when the row is gone; waits for it to change when its handler may
 *		not run.
 */
static void
start(Worker *w, const char *name)
{
	char	   *problem = NULL;
	bool		present;

	w->cxt = AllocSetContextCreate(TopMemoryContext, "outbox subscription",
								   ALLOCSET_DEFAULT_SIZES);
	w->batch_cxt = AllocSetContextCreate(w->cxt, "outbox subscription batch",
										 ALLOCSET_DEFAULT_SIZES);
	w->wait_set = OutboxWorkerStart(w->cxt, w->event_pipe, "subscription");
	OutboxKafkaReadSecretsFile(w->cxt);

	OutboxSubscriberBeginTxn();
	present = OutboxSubscriberLoad(w, name, &problem);
	if (present && problem == NULL)
	{
		OutboxSubscriberPreparePlans(w);
		OutboxSubscriberLoadParked(w);
	}
	OutboxSubscriberEndTxn();
	if (!present)
	{
		OutboxInboxMarkGone(w->slot);
		ereport(LOG, (errmsg("outbox subscription \"%s\" is gone: its worker stops", name)));
		proc_exit(0);
	}
	if (problem != NULL)
		wait_for_change(w, name, problem);
}

/*
 * poll_and_apply
 *		One turn of the loop once the consumer exists: resume what is due,
 *		poll up to a batch of messages into msgs, take what the consumer
 *		found on the way, show the state, apply the batch, report (at once
 *		when the group has just assigned partitions).  Returns the number
 *		of messages polled; *timeout is how long the loop may wait after.
 */
static int
poll_and_apply(Worker *w, OutboxInbound *msgs, TimestampTz now, long *timeout)
{
	char		err[OUTBOX_LAST_ERROR_LEN];
	bool		joined = OutboxConsumerJoined(w->consumer);
	int			n;
	int			kept;

	*timeout = resume_due(w);
	/* librdkafka is on the stack in its callbacks: no exit from there */
	HOLD_INTERRUPTS();
	n = OutboxConsumerPoll(w->consumer, msgs, w->sub.batch_size, w->batch_cxt);
	RESUME_INTERRUPTS();
	if (OutboxConsumerFailed(w->consumer))
		ereport(ERROR,
				(errmsg("outbox subscription \"%s\" could not read its offsets for an assignment",
						w->sub.name)));
	if (OutboxConsumerTakeError(w->consumer, err, sizeof(err)))
		OutboxInboxSetError(w->slot, err);
	OutboxSubscriberTakeResets(w);
	show_state(w);
	kept = drop_stopped(w, msgs, n);
	if (kept > 0)
		OutboxSubscriberApplyBatch(w, msgs, kept);
	if (kept > 0 || joined != OutboxConsumerJoined(w->consumer) ||
		TimestampDifferenceExceeds(w->last_report, now, WAIT_IDLE_MS))
	{
		report_parts(w);
		w->last_report = now;
	}
	return n;
}

/*
 * run
 *		The worker's loop, until its row changes or it is held: replays
 *		when woken or due, then batches.  Returns to stop.
 */
static void
run(Worker *w)
{
	OutboxInbound *msgs = MemoryContextAlloc(w->cxt,
											 sizeof(OutboxInbound) * w->sub.batch_size);

	for (;;)
	{
		long		timeout;
		TimestampTz now;

		CHECK_FOR_INTERRUPTS();
		MemoryContextReset(w->batch_cxt);
		MemoryContextSwitchTo(w->batch_cxt);
		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
			OutboxKafkaReadSecretsFile(w->cxt);
		}
		if (OutboxInboxTakeChanged(w->slot) || OutboxInboxIsHeld(w->slot))
			return;				/* the launcher starts a worker that reads the row again */
		now = GetCurrentTimestamp();
		if (OutboxInboxTakeWake(w->slot) ||
			TimestampDifferenceExceeds(w->last_replay_check, now, REPLAY_CHECK_MS))
		{
			w->last_replay_check = now;
			while (OutboxSubscriberRunReplays(w))
				CHECK_FOR_INTERRUPTS();
		}
		if (!ensure_consumer(w))
		{
			worker_wait(w, WAIT_IDLE_MS);
			continue;
		}
		/* a full batch may leave more in the queue, which wakes nobody */
		if (poll_and_apply(w, msgs, now, &timeout) < w->sub.batch_size)
			worker_wait(w, timeout);
	}
}

/*
 * OutboxConsumerMain
 *		Entry point of a subscription worker: main_arg is its slot, and
 *		bgw_extra holds its database's OID and the subscription's name.
 */
void
OutboxConsumerMain(Datum main_arg)
{
	Worker	   *w = &worker;
	Oid			dboid;
	char		name[OUTBOX_SUBSCRIPTION_NAME_MAX];

	memcpy(&dboid, MyBgworkerEntry->bgw_extra, sizeof(Oid));
	strlcpy(name, MyBgworkerEntry->bgw_extra + sizeof(Oid), sizeof(name));
	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	/* die(): a handler that loops or waits is interrupted too */
	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();

	w->slot = OutboxInboxAttach(DatumGetInt32(main_arg), dboid, name);
	if (w->slot == NULL)
		proc_exit(0);
	before_shmem_exit(worker_detach, PointerGetDatum(w));
	BackgroundWorkerInitializeConnectionByOid(dboid, InvalidOid, 0);
	start(w, name);
	ereport(LOG,
			(errmsg("outbox subscription \"%s\" started", name),
			 errdetail("group \"%s\", %d topics, batch_size %d", w->sub.group_id,
					   w->sub.ntopics, w->sub.batch_size)));
	run(w);
	ereport(LOG, (errmsg("outbox subscription \"%s\" stops", name)));
	proc_exit(0);
}
