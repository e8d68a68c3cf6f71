/*-------------------------------------------------------------------------
 *
 * relay/relay.c
 *		The relay: one background worker per database, publishing committed
 *		events to Kafka in snapshot batches.  This file holds its loop, the
 *		loop's steps and its one wait; it stands on the relay's other files
 *		(relay_state.h lists them), none of which calls back into it.
 *
 * Invariants:
 *	- The relay's state is one Relay (relay_state.h); the loop steps it
 *	  from one explicit step to the next: a page goes read -> send ->
 *	  await -> record, or backs off between rounds; no work is idle, no
 *	  settings paused.  relay_round.c sends and settles rounds,
 *	  relay_page.c reads and records pages.
 *	- No transaction or snapshot is held while waiting on the network: a
 *	  page is read in one short transaction, published with none open, and
 *	  its progress saved in another short transaction.
 *	- A page counts as published only when every message of it has a
 *	  successful delivery report (or is quarantined, parked, or held for a
 *	  partition that does not answer: relay_hold.c); only then
 *	  is the progress row written, once per page, and only then is the next
 *	  page sent, so a crash re-sends at most one page.  What of a page
 *	  failed is sent again, in id order; a round not acknowledged within
 *	  outbox.delivery_timeout is withdrawn whole first.
 *	- The next page is read while the current one's acknowledgements
 *	  travel: the database and the network work at the same time.  So at
 *	  most two pages are in memory, each bounded by outbox.batch_size
 *	  events and outbox.batch_max_bytes bytes.  Under exactly_once the page
 *	  after a batch's last is read after the commit: its snapshot then sees
 *	  what committed during the transaction, not the page after.
 *	- The relay waits in one place, relay_wait, on one WaitEventSet
 *	  kept for its life: its latch (set at commit by emitting backends, and
 *	  by signals), postmaster death, and the relay's event pipe, which every
 *	  producer it builds writes to.  relay_wait also empties the pipe
 *	  and serves the producer when its descriptor wakes it, and is where a
 *	  reload (SIGHUP) is processed.  The safety poll outbox.poll_interval
 *	  only catches what woke nobody.
 *	- The producer is built, and rebuilt after a reload changed its
 *	  settings or a fatal error, in one place (OutboxRelayEnsureProducer,
 *	  relay_producer.c); it is closed after outbox.kafka_idle_timeout with
 *	  nothing to publish, which also hands back the memory the drains left
 *	  mapped, and built again for the next page to send.
 *	- Shutdown: once it is asked, the loop takes no new page in hand; the
 *	  page in hand is finished only as far as its delivery reports arrive
 *	  within outbox.shutdown_timeout (none while the database is being
 *	  dropped), which relay_wait enforces; a round being handed to
 *	  librdkafka stops between two messages, the only blocking librdkafka
 *	  call being bounded (producer.c).  So a stopping relay is gone within
 *	  about outbox.shutdown_timeout plus librdkafka's own teardown after a
 *	  purge (rd_kafka_destroy, unbounded: producer.c; t/109 measures it).
 *	- Memory: the loop's context is reset at each step; pages, the blocked
 *	  list and the secrets memo (producer.c) live in contexts of their own,
 *	  reset when they are replaced, so reloads and rebuilds do not make the
 *	  relay grow; nothing is allocated in TopMemoryContext after start-up
 *	  (the wait set, which PostgreSQL 17 on puts there, is made once).
 *	- It exits 0 only when told to stop (SIGTERM), when its database has no
 *	  outbox extension (at start, when reading a page, or when DROP
 *	  EXTENSION asks it to look: the launcher is told not to restart it),
 *	  when another relay already serves its database, or when no relay slot
 *	  is free for it; the launcher restarts it otherwise.  External
 *	  failures are retried with backoff, never raised as errors.
 *
 * This file holds no SQL text (store_batch.c) and no librdkafka call (producer.c).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <fcntl.h>
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
#include "common/pg_prng.h"

#include "base/compat.h"
#include "relay/relay_state.h"
#include "base/base.h"
#include "shmem/shmem.h"
#include "kafka/kafka.h"
#include "relay/relay.h"

#define RELAY_PAGE_MEMORY		(4 * 1024 * 1024)
#define RELAY_PAGE_SIZES	RELAY_PAGE_MEMORY, RELAY_PAGE_MEMORY, ALLOCSET_DEFAULT_MAXSIZE
#define RELAY_MALLOC_KEEP		(64 * 1024 * 1024)
#define RELAY_ACK_POLL_MS		1000
#define RELAY_RELOAD_GRACE_MS	2000	/* in flight at a settings change */
#define RELAY_STOP_POLL_MS		100 /* serving a purge before exiting */

/*
 * What pg_stat_activity.wait_event shows while the relay waits (named from
 * PostgreSQL 17 on, "Extension" before: see compat.h).
 */
#define WAIT_IDLE(r)	OutboxWaitEvent(&(r)->wait_idle, "OutboxRelayIdle")
#define WAIT_ACKS(r)	OutboxWaitEvent(&(r)->wait_acks, "OutboxRelayAcks")
#define WAIT_BACKOFF(r) OutboxWaitEvent(&(r)->wait_backoff, "OutboxRelayBackoff")
#define WAIT_STANDBY(r) OutboxWaitEvent(&(r)->wait_standby, "OutboxRelayStandby")

/* what woke relay_wait */
#define RELAY_WAKE_TIMEOUT	0x01
#define RELAY_WAKE_LATCH	0x02
#define RELAY_WAKE_PRODUCER 0x04
#define RELAY_WAKE_STOP		0x08	/* the relay must stop now */

static Relay relay;

/* before_shmem_exit: the producer goes, and the slot is left (relay_slots.c) */
static void
relay_detach(int code, Datum arg)
{
	Relay	   *r = (Relay *) DatumGetPointer(arg);

	if (r->producer != NULL)
	{
		OutboxProducerDestroy(r->producer);
		r->producer = NULL;
	}
	if (r->slot != NULL)
		OutboxSlotDetach(r->slot);
}

/*
 * relay_wait
 *		The relay's one wait: until timeout_ms pass, the latch is set, or the
 *		producer has something to serve (it is served here).  A reload is
 *		processed here.  Returns RELAY_WAKE_* bits.
 *
 *		Once shutdown is asked, RELAY_WAKE_STOP comes at once, except while
 *		a round is awaited: then only when outbox.shutdown_timeout has passed
 *		(at once while the database is being dropped), and the waits go on,
 *		short, while the withdrawn round's reports are served.
 */
static int
relay_wait(Relay *r, long timeout_ms, uint32 wait_event)
{
	WaitEvent	events[3];
	int			n;
	int			i;
	int			wake = 0;

	if (ShutdownRequestPending)
	{
		TimestampTz now = GetCurrentTimestamp();
		long		left;

		if (r->stop_deadline == 0)
			r->stop_deadline = TimestampTzPlusMilliseconds(now,
														   OutboxSlotIsHeld(r->slot) ? 0 : outbox_shutdown_timeout);
		left = TimestampDifferenceMilliseconds(now, r->stop_deadline);
		if (r->step != RELAY_STEP_AWAIT || (left <= 0 && !r->round_abandoned))
			return RELAY_WAKE_STOP;
		if (left <= 0)
		{
			wake |= RELAY_WAKE_STOP;
			timeout_ms = Min(timeout_ms, RELAY_STOP_POLL_MS);
		}
		else
			timeout_ms = Min(timeout_ms, left);
	}

	n = WaitEventSetWait(r->wait_set, timeout_ms, events, lengthof(events), wait_event);
	if (n == 0)
		wake |= RELAY_WAKE_TIMEOUT;
	for (i = 0; i < n; i++)
	{
		if (events[i].events & WL_LATCH_SET)
		{
			ResetLatch(MyLatch);
			wake |= RELAY_WAKE_LATCH;
		}
		if (events[i].events & WL_SOCKET_READABLE)
		{
			char		drain[64];

			/* also what a producer destroyed since wrote */
			while (read(r->event_pipe[0], drain, sizeof(drain)) > 0)
				;
			wake |= RELAY_WAKE_PRODUCER;
		}
	}
	CHECK_FOR_INTERRUPTS();

	if (ConfigReloadPending)
	{
		ConfigReloadPending = false;
		ProcessConfigFile(PGC_SIGHUP);
		/* a rewritten secrets file counts as changed settings */
		OutboxRelayReadSecrets(r);
	}

	/*
	 * librdkafka's statistics, errors and logs run no query, and unserved
	 * they would pile up: serve them whatever the relay waits for.
	 */
	if ((wake & RELAY_WAKE_PRODUCER) && r->producer != NULL)
	{
		(void) OutboxRelayServeProducer(r);
		OutboxRelayReportProducer(r);
	}
	return wake;
}

/* wait of IDLE, PAUSED and BACK_OFF: until r->wait_until */
static int
wait_until(Relay *r, uint32 wait_event)
{
	long		left = TimestampDifferenceMilliseconds(GetCurrentTimestamp(),
													   r->wait_until);

	if (left <= 0)
		return RELAY_WAKE_TIMEOUT;
	return relay_wait(r, left, wait_event);
}

/*
 * enter_back_off
 *		Wait before trying again (then go to next): exponential between
 *		outbox.retry_backoff_min and _max, full jitter; shutdown cuts it short.
 */
static RelayStep
enter_back_off(Relay *r, RelayStep next)
{
	long		floor_ms = outbox_retry_backoff_min;
	long		ceiling_ms = Max(outbox_retry_backoff_max, floor_ms);
	long		wait_ms;

	r->backoff_ms = r->backoff_ms == 0 ? floor_ms :
		Min((long) r->backoff_ms * 2, ceiling_ms);
	wait_ms = floor_ms + (long) pg_prng_uint64_range(&pg_global_prng_state, 0,
													 Max(r->backoff_ms - floor_ms, 0));
	OutboxRelaySetState(r, r->fenced ? OUTBOX_RELAY_FENCED : OUTBOX_RELAY_BACKING_OFF);
	pgstat_report_activity(STATE_RUNNING, r->fenced ? "fenced" : "backing off");
	r->wait_until = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), wait_ms);
	r->after_backoff = next;
	return RELAY_STEP_BACK_OFF;
}

/*
 * enter_idle
 *		Nothing to publish: look for restored events still waiting, delete
 *		what is past retention, then wait for a commit or the safety poll.
 */
static RelayStep
enter_idle(Relay *r)
{
	if (r->idle_since == 0)
		r->idle_since = GetCurrentTimestamp();
	if (r->restore_waiting_since != 0)
		OutboxRelayAdoptRestored(r);
	OutboxRelaySetState(r, OUTBOX_RELAY_IDLE);
	if (r->producer != NULL)
		OutboxRelayReportProducer(r);
	OutboxRelayCleanup(r);
	OutboxRelayCloseIdleProducer(r);
	r->wait_until = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
												outbox_poll_interval);
	/* wake to close it on time, whatever the safety poll */
	if (r->producer != NULL && outbox_kafka_idle_timeout > 0 && r->holds == NIL)
		r->wait_until = Min(r->wait_until,
							TimestampTzPlusMilliseconds(r->idle_since,
														outbox_kafka_idle_timeout));
	return RELAY_STEP_IDLE;
}

/*
 * enter_paused
 *		outbox.enabled is off, or there are no brokers.  A paused relay keeps
 *		its producer, to resume at once; without brokers it drops it.
 */
static RelayStep
enter_paused(Relay *r)
{
	OutboxRelaySetState(r, outbox_enabled ? OUTBOX_RELAY_NOT_CONFIGURED : OUTBOX_RELAY_PAUSED);
	if (r->producer != NULL && outbox_kafka_brokers[0] == '\0')
		OutboxRelaySetProducer(r, NULL);
	r->wait_until = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
												outbox_poll_interval);
	return RELAY_STEP_PAUSED;
}

/*
 * step_wait
 *		BACK_OFF, IDLE and PAUSED: wait until r->wait_until (a commit cuts
 *		an idle or paused wait short), serving the producer's events
 *		(relay_wait); then a step of the log's ring when one is due.
 */
static RelayStep
step_wait(Relay *r)
{
	bool		backing_off = (r->step == RELAY_STEP_BACK_OFF);
	int			wake = wait_until(r, backing_off ? WAIT_BACKOFF(r) : WAIT_IDLE(r));

	if (wake & RELAY_WAKE_STOP)
		return RELAY_STEP_STOP;
	OutboxRelayRotate(r);
	/* a held partition answered its probe: drain it now */
	if (r->step == RELAY_STEP_IDLE && OutboxRelayDrainDue(r))
		return RELAY_STEP_READ;
	if (!(wake & (backing_off ? RELAY_WAKE_TIMEOUT :
				  RELAY_WAKE_LATCH | RELAY_WAKE_TIMEOUT)))
		return r->step;
	if (backing_off)
	{
		pgstat_report_activity(STATE_IDLE, NULL);
		return r->after_backoff;
	}

	/*
	 * A paused relay reads no page, which is where it would notice DROP
	 * EXTENSION; that commit asks it to look (every emitting commit sets
	 * the latch too, and must not cost a transaction).
	 */
	if (r->step == RELAY_STEP_PAUSED)
	{
		if (OutboxSlotTakeExtensionCheck(r->slot))
			OutboxRelayCheckExtension(r);
	}

	/*
	 * Replays queued by a transaction that woke nobody (a prepared one) are
	 * found at the safety poll, if any transaction ended since the queue
	 * was last seen empty.
	 */
	else if (!(wake & RELAY_WAKE_LATCH) &&
			 !(r->replay_seen_valid &&
			   r->replay_seen_completions == OutboxXactCompletionCount()))
		r->replays_due = true;
	return RELAY_STEP_READ;
}

/*
 * step_read
 *		Choose the next page: the replay queue first, then the page read
 *		ahead, or the next page of the batch.  A look that finds nothing
 *		opens no transaction while no transaction has ended since the last
 *		look that found nothing.
 */
static RelayStep
step_read(Relay *r)
{
	RelayPage  *pg;
	uint64		completions;
	FullTransactionId next_xid;

	if (!outbox_enabled || outbox_kafka_brokers[0] == '\0')
		return enter_paused(r);
	/*
	 * Closed for idleness, it is opened when there is something to send,
	 * or at once when outbox.kafka_idle_timeout became 0 (keep it open).
	 */
	if ((!r->producer_closed || outbox_kafka_idle_timeout <= 0) && !OutboxRelayEnsureProducer(r))
		return enter_back_off(r, RELAY_STEP_READ);
	if (OutboxSlotTakeReplayPending(r->slot))
	{
		r->replays_due = true;
		r->batch_seen_valid = false;
		r->blocked_stale = true;
		/* a restore's rows wake the relay the same way, held ones too */
		OutboxRelayAdoptRestored(r);
		OutboxRelayBeginTxn("reading held partitions");
		OutboxRelayLoadHolds(r);
		OutboxRelayEndTxn(r);
	}
	if (r->replays_due)
	{
		completions = OutboxXactCompletionCount();
		pg = &r->replay_page;
		if (OutboxRelayReadReplays(r, pg))
		{
			r->in_hand = pg;
			return RELAY_STEP_SEND;
		}
		r->replays_due = false;
		r->replay_seen_completions = completions;
		r->replay_seen_valid = true;
	}

	/* held partitions: probes out, and drains taking turns with the batch */
	if (r->holds != NIL && RELAY_TRANSACTIONAL(r))
	{
		OutboxRelayReportError(r, "outbox.delivery = exactly_once waits for the held partitions",
							   "Events held for unavailable partitions are sent under at_least_once: "
							   "set it until outbox.held is empty.");
		return enter_back_off(r, RELAY_STEP_READ);
	}
	if (r->holds != NIL)
	{
		if (!OutboxRelayEnsureProducer(r))
			return enter_back_off(r, RELAY_STEP_READ);
		OutboxRelaySendProbes(r);
	}
	if (r->drain_turn && OutboxRelayTakeDrain(r))
		return RELAY_STEP_SEND;

	if (r->ahead == NULL && !r->batch_open && r->batch_seen_valid &&
		r->batch_seen_completions == OutboxXactCompletionCount())
	{
		next_xid = ReadNextFullTransactionId();
		if (!FullTransactionIdEquals(r->batch_seen_next_xid, next_xid))
			OutboxRelayPassStarted(r, next_xid);
		return OutboxRelayTakeDrain(r) ? RELAY_STEP_SEND : enter_idle(r);
	}
	completions = OutboxXactCompletionCount();
	next_xid = ReadNextFullTransactionId();
	pg = r->ahead;
	if (pg == NULL && OutboxRelayReadPage(r, &r->pages[0]))
		pg = &r->pages[0];
	r->batch_seen_completions = completions;
	r->batch_seen_next_xid = next_xid;
	/* a resumed batch's snapshot is older than completions: look again */
	r->batch_seen_valid = (pg == NULL && r->batch.fresh);
	if (pg == NULL)
		return OutboxRelayTakeDrain(r) ? RELAY_STEP_SEND : enter_idle(r);
	r->ahead = NULL;
	r->in_hand = pg;
	r->drain_turn = true;
	return RELAY_STEP_SEND;
}

/*
 * step_send
 *		Send a round of the page in hand.  Before its first round a batch
 *		page parks the events of blocked aggregates; after it, the next page
 *		is read while the acknowledgements travel.
 */
static RelayStep
step_send(Relay *r)
{
	RelayPage  *pg = r->in_hand;
	bool		first = (pg->rounds == 0);
	char		activity[64];

	r->idle_since = 0;
	if (!OutboxRelayEnsureProducer(r))
		return enter_back_off(r, RELAY_STEP_SEND);
	if (r->in_hand_committed)
		return RELAY_STEP_RECORD;
	if (first && !OutboxRelayStandbysHave(r, pg))
		return RELAY_STEP_STANDBY;
	if (first && !OutboxRelayPreparePage(r, pg))
		return enter_back_off(r, RELAY_STEP_SEND);
	if (first && RELAY_TRANSACTIONAL(r))
	{
		OutboxRelayTxnSkipSettled(r, pg);
		OutboxRelayTxnPrerecord(r, pg);
	}
	/* exactly_once: every round of the page goes out in its transaction */
	if (RELAY_TRANSACTIONAL(r) && OutboxRelayPagePending(pg))
	{
		if (!OutboxRelayTxnBegin(r))
			return enter_back_off(r, RELAY_STEP_SEND);
		r->page_in_txn = true;
	}
	OutboxRelaySendRound(r, pg);
	/* its progress record goes with the first round: one registration */
	if (r->txn_open && !r->marker_sent)
		OutboxRelayTxnSendMarker(r, pg);
	/* exactly_once: a batch's last page is followed after its commit */
	if (first && !pg->replay && pg->drain == NULL && r->ahead == NULL &&
		!(RELAY_TRANSACTIONAL(r) && pg->done))
	{
		RelayPage  *next = (pg == &r->pages[0]) ? &r->pages[1] : &r->pages[0];

		if (OutboxRelayReadPage(r, next))
			r->ahead = next;
	}

	r->round_started = GetCurrentTimestamp();
	r->round_give_up = TimestampTzPlusMilliseconds(r->round_started,
												   outbox_delivery_timeout);
	r->last_stall_report = 0;
	r->round_abandoned = false;
	if (pg->sent > 0)
	{
		snprintf(activity, sizeof(activity),
				 "waiting for acknowledgement of %d events", pg->sent);
		pgstat_report_activity(STATE_RUNNING, activity);
	}
	return RELAY_STEP_AWAIT;
}

/*
 * step_await
 *		Serve the producer until the round has every delivery report, then
 *		settle it: clean, the page goes on to its next round (held-back
 *		events) or is recorded; failed, the relay backs off first.  A round
 *		withdrawn for shutdown stops the relay once its reports are served.
 */
static RelayStep
step_await(Relay *r)
{
	RelayPage  *pg = r->in_hand;
	int			pending;
	int			wake;

	if (pg->sent == 0)
	{
		/* a round cut short, or waiting for a held topic's partitions */
		if (OutboxRelayPagePending(pg))
			return pg->cut ? RELAY_STEP_STOP : enter_back_off(r, RELAY_STEP_SEND);
		/* settled, if only by quarantine: no longer backing off */
		r->backoff_ms = 0;
		return r->txn_open ? RELAY_STEP_COMMIT : RELAY_STEP_RECORD;
	}
	pending = OutboxRelayServeProducer(r);
	if (pending == 0)
	{
		if (r->round_abandoned)
			return RELAY_STEP_STOP;
		pgstat_report_activity(STATE_IDLE, NULL);
		if (!OutboxRelaySettleRound(r, pg))
		{
			/* exactly_once: the transaction goes whole, and the page again */
			if (RELAY_TRANSACTIONAL(r))
				OutboxRelayTxnAbort(r, pg);
			return enter_back_off(r, RELAY_STEP_SEND);
		}
		r->backoff_ms = 0;
		return RELAY_STEP_SEND;
	}

	/*
	 * A partition that answers nothing while others do is held; not in a
	 * Kafka transaction, which spans them all (relay_txn.c).
	 */
	if (!r->txn_open && OutboxRelayHoldStalled(r, pg))
		return RELAY_STEP_AWAIT;
	OutboxRelayWatchRound(r, pending);
	wake = relay_wait(r, outbox_hold_after > 0 ? Min(RELAY_ACK_POLL_MS, outbox_hold_after) :
						   RELAY_ACK_POLL_MS, WAIT_ACKS(r));
	if ((wake & RELAY_WAKE_STOP) && !r->round_abandoned)
	{
		OutboxProducerPurge(r->producer);
		r->round_abandoned = true;
	}

	/*
	 * librdkafka retries an outage by itself, and no delivery report
	 * arrives until the round is withdrawn: report its errors and the
	 * brokers it reaches while that lasts (relay_wait did if it served).
	 */
	if (!(wake & RELAY_WAKE_PRODUCER))
		OutboxRelayReportProducer(r);

	/*
	 * New Kafka settings: what is in flight gets a short grace to be
	 * acknowledged by the old producer (purging it at once would resend
	 * messages the brokers already have); then the round is withdrawn and
	 * resent on the new one.
	 */
	if (OutboxProducerOutdated(r->producer))
		r->round_give_up = Min(r->round_give_up,
							   TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
														   RELAY_RELOAD_GRACE_MS));
	return RELAY_STEP_AWAIT;
}

/*
 * step_standby
 *		STANDBY: wait a little (as long as relay_standby.c says), then look
 *		again (SEND).  A reload, a commit or a signal cuts the wait short;
 *		shutdown ends it (the page is read again at the next start).
 */
static RelayStep
step_standby(Relay *r)
{
	if (relay_wait(r, OutboxRelayStandbyPollMs(r), WAIT_STANDBY(r)) & RELAY_WAKE_STOP)
		return RELAY_STEP_STOP;
	return RELAY_STEP_SEND;
}

/*
 * step_commit
 *		exactly_once, every event of the page in hand settled in the open
 *		transaction: send the progress record, wait for it, commit, in
 *		slices (relay_txn.c); then RECORD.  A failure aborts the
 *		transaction and the page is sent again after a backoff; a rebuilt
 *		producer finds out from the progress topic whether the commit went
 *		through (in_hand_committed).  Shutdown leaves the transaction open:
 *		the next relay's init_transactions ends it.
 */
static RelayStep
step_commit(Relay *r)
{
	RelayPage  *pg = r->in_hand;

	if (!OutboxRelayEnsureProducer(r))
		return enter_back_off(r, RELAY_STEP_SEND);
	if (r->in_hand_committed)
		return RELAY_STEP_RECORD;
	if (!r->txn_open)
		return RELAY_STEP_SEND;
	if (!r->marker_sent)
	{
		OutboxRelayTxnSendMarker(r, pg);
		r->round_started = GetCurrentTimestamp();
		r->round_give_up = TimestampTzPlusMilliseconds(r->round_started,
													   outbox_delivery_timeout);
	}
	if (OutboxRelayServeProducer(r) > 0)
	{
		OutboxRelayWatchRound(r, 1);
		if (relay_wait(r, RELAY_ACK_POLL_MS, WAIT_ACKS(r)) & RELAY_WAKE_STOP)
			return RELAY_STEP_STOP;
		return RELAY_STEP_COMMIT;
	}
	if (r->marker.delivery_err != 0)
	{
		OutboxRelayReportError(r, "could not publish the progress record, sending the page again",
							   OutboxDeliveryErrorText(r->marker.last_err, r->marker.last_err_local));
		OutboxRelayTxnAbort(r, pg);
		return enter_back_off(r, RELAY_STEP_SEND);
	}
	switch (OutboxRelayTxnCommit(r))
	{
		case OUTBOX_TXN_OK:
			return RELAY_STEP_RECORD;
		case OUTBOX_TXN_RETRY:
			/* within outbox.delivery_timeout, like a round; then in doubt */
			if (GetCurrentTimestamp() < r->round_give_up)
				return (relay_wait(r, 10, WAIT_ACKS(r)) & RELAY_WAKE_STOP) ?
					RELAY_STEP_STOP : RELAY_STEP_COMMIT;
			OutboxRelayTxnInDoubt(r);
			break;
		case OUTBOX_TXN_ABORT:
			OutboxRelayTxnAbort(r, pg);
			break;
		case OUTBOX_TXN_FENCED:
		case OUTBOX_TXN_FATAL:
			break;
	}
	return enter_back_off(r, RELAY_STEP_SEND);
}

/* RECORD: write the settled page's progress */
static RelayStep
step_record(Relay *r)
{
	OutboxRelayRecordPage(r, r->in_hand);
	r->in_hand = NULL;
	r->in_hand_committed = false;
	r->page_in_txn = false;
	/* the page after next waits for the standbys to have this progress */
	r->recorded_lsn[0] = r->recorded_lsn[1];
	r->recorded_lsn[1] = OutboxRelayWalEnd();
	return RELAY_STEP_READ;
}

/* one step of the loop: the step it leads to */
static RelayStep
relay_step(Relay *r)
{
	switch (r->step)
	{
		case RELAY_STEP_READ:
			return step_read(r);
		case RELAY_STEP_SEND:
			return step_send(r);
		case RELAY_STEP_AWAIT:
			return step_await(r);
		case RELAY_STEP_COMMIT:
			return step_commit(r);
		case RELAY_STEP_RECORD:
			return step_record(r);
		case RELAY_STEP_STANDBY:
			return step_standby(r);
		case RELAY_STEP_BACK_OFF:
		case RELAY_STEP_IDLE:
		case RELAY_STEP_PAUSED:
			return step_wait(r);
		case RELAY_STEP_STOP:
			break;
	}
	return RELAY_STEP_STOP;
}

/*
 * relay_start
 *		Start-up, once attached to the database's slot: the relay's memory
 *		contexts, settings and wait set (worker.c), the secrets file, the
 *		relay's position.
 */
static void
relay_start(Relay *r, Oid dboid)
{
	const char *crashing;

	r->cxt = AllocSetContextCreate(TopMemoryContext, "outbox relay",
								   ALLOCSET_DEFAULT_SIZES);
	r->loop_cxt = AllocSetContextCreate(r->cxt, "outbox relay loop",
										ALLOCSET_DEFAULT_SIZES);

	/*
	 * A page's events take a few megabytes.  A large keeper block survives
	 * each reset, and malloc keeps freed memory instead of handing it back
	 * to the kernel, so draining a backlog does not fault fresh pages in
	 * for every page (librdkafka's per-message allocations gain too).
	 */
	r->pages[0].cxt = AllocSetContextCreate(r->cxt, "outbox page", RELAY_PAGE_SIZES);
	r->pages[1].cxt = AllocSetContextCreate(r->cxt, "outbox page", RELAY_PAGE_SIZES);
	r->replay_page.cxt = AllocSetContextCreate(r->cxt, "outbox replay page",
											   RELAY_PAGE_SIZES);
	r->drain_page.cxt = AllocSetContextCreate(r->cxt, "outbox held page",
											  RELAY_PAGE_SIZES);
	r->holds_cxt = AllocSetContextCreate(r->cxt, "outbox holds", ALLOCSET_SMALL_SIZES);
	OutboxMallocKeep(RELAY_MALLOC_KEEP);
	r->blocked_cxt = AllocSetContextCreate(r->cxt, "outbox blocked aggregates",
										   ALLOCSET_SMALL_SIZES);
	r->blocked_stale = true;
	r->replays_due = true;
	r->wait_set = OutboxWorkerStart(r->cxt, r->event_pipe, "relay");
	OutboxRelayReadSecrets(r);
	if ((crashing = OutboxKafkaKnownCrash()) != NULL)
		ereport(WARNING,
				(errmsg("librdkafka %s can crash the relay on a topic error in a metadata answer",
						crashing),
				 errdetail("librdkafka 2.8 and 2.9 mishandle a metadata answer that carries a topic error together with the topic's partitions; 2.10.0 fixed it."),
				 errhint("Build outbox against librdkafka 2.10.0 or later.")));

	MemoryContextSwitchTo(r->loop_cxt);
	OutboxRelayLoadProgress(r, dboid);
	OutboxRelayAdoptRestored(r);
}

/*
 * OutboxRelayMain
 *		Entry point of a relay; main_arg is its database's OID.
 */
void
OutboxRelayMain(Datum main_arg)
{
	Relay	   *r = &relay;
	Oid			dboid = DatumGetObjectId(main_arg);
	int			other_pid;

	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, SignalHandlerForShutdownRequest);
	BackgroundWorkerUnblockSignals();

	BackgroundWorkerInitializeConnectionByOid(dboid, InvalidOid, 0);

	r->slot = OutboxSlotAttach(dboid, &other_pid);
	if (r->slot == NULL)
	{
		/* at most one relay per database: the one attached goes on */
		if (other_pid != 0)
			ereport(LOG,
					(errmsg("outbox relay for database %u stops: relay %d already serves it",
							dboid, other_pid)));
		else
			ereport(LOG,
					(errmsg("outbox relay for database %u has no slot and stops", dboid)));
		proc_exit(0);
	}
	before_shmem_exit(relay_detach, PointerGetDatum(r));
	relay_start(r, dboid);

	ereport(LOG,
			(errmsg("outbox relay started for database \"%s\"", r->dbname),
			 errdetail("brokers \"%s\", batch_size %d, poll_interval %d ms, enabled %s, "
					   "max_attempts %d, poison_policy %s, kafka_config %s",
					   outbox_kafka_brokers, outbox_batch_size,
					   outbox_poll_interval, outbox_enabled ? "on" : "off",
					   outbox_max_attempts,
					   outbox_poison_policy == OUTBOX_POISON_BLOCK ? "block" : "skip",
					   outbox_kafka_config[0] ? "(set, not shown)" : "(empty)"),
			 outbox_kafka_secrets_file[0] ?
			 errhint("Kafka secrets are read from \"%s\".", outbox_kafka_secrets_file) : 0));

	r->step = RELAY_STEP_READ;
	for (;;)
	{
		MemoryContextReset(r->loop_cxt);
		MemoryContextSwitchTo(r->loop_cxt);
		CHECK_FOR_INTERRUPTS();
		/* once asked to stop, only the page in hand may be finished */
		if (r->step == RELAY_STEP_STOP ||
			(ShutdownRequestPending && r->in_hand == NULL))
			break;
		r->step = relay_step(r);
	}

	OutboxRelaySetState(r, OUTBOX_RELAY_STOPPED);
	ereport(LOG,
			(errmsg("outbox relay for database \"%s\" stopped", r->dbname)));
	proc_exit(0);
}
