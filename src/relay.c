/*-------------------------------------------------------------------------
 *
 * relay.c
 *		The relay: one background worker per database, publishing committed
 *		events to Kafka in snapshot batches.
 *
 * Invariants:
 *	- No transaction or snapshot is held while waiting on the network: a
 *	  page is read in one short transaction, published with none open, and
 *	  its progress saved in another short transaction.
 *	- A page counts as published only when every message of it has a
 *	  successful delivery report (or is quarantined or parked); only then
 *	  is the progress row written, once per page, and only then is the next
 *	  page sent, so a crash re-sends at most one page.  What of a page
 *	  failed is sent again, in id order; a round not acknowledged within
 *	  outbox.delivery_timeout is withdrawn whole first.
 *	- The next page is read while the current one's acknowledgements
 *	  travel: the database and the network work at the same time.  So at
 *	  most two pages are in memory, each bounded by outbox.batch_size
 *	  events and outbox.batch_max_bytes bytes.
 *	- Shutdown is looked at between any two messages handed to librdkafka,
 *	  whose only blocking call is bounded (kafka.c): a stopping relay is
 *	  gone within about outbox.shutdown_timeout, whatever the brokers do.
 *	- What a reload or a producer rebuild allocates lives in contexts reset
 *	  at the next one: reloads do not make the relay grow.
 *	- The relay sleeps on its latch (set at commit by emitting backends, or
 *	  by signals) and on the producer's event descriptor; the safety poll
 *	  outbox.poll_interval only catches what woke nobody.
 *	- It exits 0 only when told to stop or when its database has no outbox;
 *	  the launcher restarts it otherwise.  External failures are retried
 *	  with backoff, never raised as errors.
 *
 * This file holds no SQL text (store.c) and no librdkafka call (kafka.c).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "tcop/tcopprot.h"
#include "commands/dbcommands.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"
#include "common/pg_prng.h"

#include "compat.h"
#include "outbox.h"

#define RELAY_LOG_INTERVAL_MS	10000
#define RELAY_CLEANUP_INTERVAL_MS 60000
#define RELAY_CLEANUP_BATCH		10000
#define RELAY_PAGE_MEMORY		(4 * 1024 * 1024)
#define RELAY_MALLOC_KEEP		(64 * 1024 * 1024)
#define RELAY_ACK_POLL_MS		1000
#define RELAY_STALL_REPORT_MS	2000	/* acks this late are reported */
#define RELAY_RELOAD_GRACE_MS	2000	/* in flight at a settings change */

/*
 * What pg_stat_activity.wait_event shows while the relay waits (named from
 * PostgreSQL 17 on, "Extension" before: see compat.h).
 */
static uint32 wait_idle_event;
static uint32 wait_acks_event;
static uint32 wait_backoff_event;

#define WAIT_IDLE		OutboxWaitEvent(&wait_idle_event, "OutboxRelayIdle")
#define WAIT_ACKS		OutboxWaitEvent(&wait_acks_event, "OutboxRelayAcks")
#define WAIT_BACKOFF	OutboxWaitEvent(&wait_backoff_event, "OutboxRelayBackoff")

typedef enum PageResult
{
	PAGE_EMPTY,					/* nothing to publish */
	PAGE_SETTLED,				/* every event delivered, quarantined or parked */
	PAGE_ABANDONED				/* stopping before that */
} PageResult;

/*
 * A page of events on its way: read, then sent, then settled, then
 * recorded.  Two pages take turns: the one in hand and the one read ahead.
 */
typedef struct RelayPage
{
	MemoryContext cxt;
	OutboxEvent *events;
	int			n;
	char	   *cur;			/* snapshot of the batch the page belongs to */
	int64		last_id;		/* its last event id */
	bool		done;			/* the last page of its batch */
	int			sent;			/* events in its round under way */
	int			retried;		/* of those, sent before */
} RelayPage;

static RelayPage pages[2];
static RelayPage *in_hand = NULL;	/* sent, not yet settled */
static RelayPage *ahead = NULL;	/* read, not yet sent */

static OutboxSlot *relay_slot = NULL;
static char *relay_dbname = NULL;
static MemoryContext relay_cxt = NULL;
static MemoryContext page_cxt = NULL;	/* replay pages */
static OutboxBatch batch;
static bool batch_open = false;

/*
 * The producer and the settings it was built with (in producer_cxt, reset
 * when it is dropped); the secrets file as last read (in secrets_cxt, reset
 * at each read).  What building or reading leaves behind goes into
 * scratch_cxt, reset after each use: reloads and rebuilds never add up.
 */
static OutboxProducer *producer = NULL;
static MemoryContext producer_cxt = NULL;
static char *producer_brokers = NULL;
static char *producer_config = NULL;
static char *producer_secrets = NULL;	/* as used by the producer */
static MemoryContext secrets_cxt = NULL;
static char *current_secrets = NULL;	/* the secrets file as last read */
static char *secrets_error = NULL;	/* why it could not be read */
static MemoryContext scratch_cxt = NULL;

static int	backoff_ms = 0;
static TimestampTz last_error_log = 0;
static int	errors_since_log = 0;

/* aggregates whose events wait behind a quarantined one (OutboxBlocked) */
static List *blocked = NIL;
static MemoryContext blocked_cxt = NULL;
static bool blocked_stale = true;
static bool replays_due = true;

/* restored events wait for their progress row since (0: none wait) */
#define RELAY_RESTORE_WAIT_MS		60000
static TimestampTz restore_waiting_since = 0;

/*
 * The cluster's transaction completion count (compat.h) read just before
 * the last look that found no new batch, and before the last replay read
 * that found the queue empty.  While it has not moved, no transaction has
 * ended since those snapshots, so a new look would find the same nothing:
 * an idle relay's safety poll opens no transaction.
 */
static uint64 batch_seen_completions = 0;
static bool batch_seen_valid = false;
static uint64 replay_seen_completions = 0;
static bool replay_seen_valid = false;

static TimestampTz next_cleanup = 0;

static void
relay_detach(int code, Datum arg)
{
	if (producer != NULL)
	{
		OutboxProducerDestroy(producer);
		producer = NULL;
	}
	if (relay_slot != NULL)
		OutboxSlotDetach(relay_slot);
}

/*
 * set_state
 *		Publish the relay's state; a change of the state name operators see
 *		(running, paused, backing off, not configured) gets one LOG line.
 */
static void
set_state(OutboxRelayState state)
{
	static const char *logged = NULL;
	const char *name = OutboxRelayStateName(state);

	OutboxSlotSetState(relay_slot, state);
	if (logged != NULL && strcmp(logged, name) != 0 && state != OUTBOX_RELAY_STOPPED)
		ereport(LOG,
				(errmsg("outbox relay for database \"%s\" is now %s (was %s)",
						relay_dbname, name, logged)));
	logged = name;
}

static void
begin_txn(const char *activity)
{
	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	PushActiveSnapshot(GetTransactionSnapshot());
	pgstat_report_activity(STATE_RUNNING, activity);
}

static void
end_txn(void)
{
	PopActiveSnapshot();
	CommitTransactionCommand();
	pgstat_report_stat(false);
	pgstat_report_activity(STATE_IDLE, NULL);
}

/* The extension is gone: nothing left to publish in this database. */
static void
exit_without_extension(void)
{
	ereport(LOG,
			(errmsg("outbox relay for database \"%s\" stops: the extension is not installed",
					relay_dbname)));
	OutboxSlotMarkNoExtension(relay_slot);
	proc_exit(0);
}

/* Exit, as exit_without_extension does, if the extension was dropped. */
static void
check_extension(void)
{
	begin_txn("checking the extension");
	if (!OutboxStoreExtensionPresent())
		exit_without_extension();
	end_txn();
}

/*
 * note_error
 *		Show a condition in status() without a log line: the failures it
 *		leads to are logged by report_error.
 */
static void
note_error(const char *what, const char *detail)
{
	char		line[256];

	snprintf(line, sizeof(line), "%s: %s", what, detail);
	OutboxSlotCountError(relay_slot, line);
}

/*
 * report_error
 *		Count an external failure and log it at most every
 *		RELAY_LOG_INTERVAL_MS, with how many happened since the last line.
 */
static void
report_error(const char *what, const char *detail)
{
	TimestampTz now = GetCurrentTimestamp();

	note_error(what, detail);
	errors_since_log++;
	if (TimestampDifferenceExceeds(last_error_log, now, RELAY_LOG_INTERVAL_MS))
	{
		ereport(LOG,
				(errmsg("outbox relay: %s", what),
				 errdetail("%s (%d failures since the last report)", detail,
						   errors_since_log)));
		errors_since_log = 0;
		last_error_log = now;
	}
}

static void
drain_producer_errors(void)
{
	char		buf[256];
	int			count;
	int			fatal;

	if (producer != NULL && OutboxProducerTakeError(producer, buf, sizeof(buf), &count, &fatal))
	{
		report_error("Kafka client error", buf);
		/* a refused login or TLS handshake: counted, librdkafka retries it */
		while (fatal-- > 0)
			OutboxSlotCountFailure(relay_slot, OUTBOX_ERROR_FATAL);
	}
}

/*
 * read_secrets
 *		Read outbox.kafka_secrets_file (at start and after each reload) into
 *		current_secrets; its contents stay in this process's memory only.
 */
static void
read_secrets(void)
{
	char	   *message = NULL;
	char	   *text = NULL;
	MemoryContext old;

	MemoryContextReset(secrets_cxt);
	old = MemoryContextSwitchTo(secrets_cxt);
	if (outbox_kafka_secrets_file[0] != '\0')
		text = OutboxKafkaReadSecrets(outbox_kafka_secrets_file, &message);
	current_secrets = text ? text : pstrdup("");
	secrets_error = message;
	MemoryContextSwitchTo(old);
}

static bool
producer_settings_changed(void)
{
	return producer != NULL &&
		(strcmp(producer_brokers, outbox_kafka_brokers) != 0 ||
		 strcmp(producer_config, outbox_kafka_config) != 0 ||
		 strcmp(producer_secrets, current_secrets) != 0);
}

static void
drop_producer(void)
{
	OutboxProducerDestroy(producer);
	producer = NULL;
	MemoryContextReset(producer_cxt);
	producer_brokers = producer_config = producer_secrets = NULL;
}

/*
 * ensure_producer
 *		Have a producer for the current settings, rebuilding it after a
 *		reload changed them or a fatal error.  False when none can be built
 *		now (the caller backs off).
 */
static bool
ensure_producer(void)
{
	char	   *message = NULL;
	char		fatal[256];
	MemoryContext old;

	if (producer != NULL && OutboxProducerIsFatal(producer, fatal, sizeof(fatal)))
	{
		report_error("Kafka producer failed fatally, rebuilding it", fatal);
		drop_producer();
	}
	if (producer_settings_changed())
	{
		ereport(LOG,
				(errmsg("outbox relay: Kafka settings changed, rebuilding the producer")));
		drop_producer();
	}
	if (producer != NULL)
		return true;

	if (secrets_error != NULL)
	{
		report_error("could not create the Kafka producer", secrets_error);
		return false;
	}
	old = MemoryContextSwitchTo(scratch_cxt);
	producer = OutboxProducerCreate(outbox_kafka_brokers, outbox_kafka_config,
									current_secrets, &message);
	MemoryContextSwitchTo(old);
	if (producer == NULL)
	{
		report_error("could not create the Kafka producer", message);
		MemoryContextReset(scratch_cxt);
		return false;
	}
	MemoryContextReset(scratch_cxt);
	producer_brokers = MemoryContextStrdup(producer_cxt, outbox_kafka_brokers);
	producer_config = MemoryContextStrdup(producer_cxt, outbox_kafka_config);
	producer_secrets = MemoryContextStrdup(producer_cxt, current_secrets);
	return true;
}

static void
process_reload(void)
{
	if (ConfigReloadPending)
	{
		ConfigReloadPending = false;
		ProcessConfigFile(PGC_SIGHUP);
		/* a rewritten secrets file counts as changed settings */
		read_secrets();
	}
}

/*
 * wait_for_acks
 *		Serve the producer until every message produced has its delivery
 *		report.  Returns false if the relay must stop first: on shutdown it
 *		waits at most outbox.shutdown_timeout (nothing when its database is
 *		being dropped) and then purges.
 */
static bool
wait_for_acks(void)
{
	TimestampTz deadline = 0;
	TimestampTz started = GetCurrentTimestamp();
	TimestampTz give_up = TimestampTzPlusMilliseconds(started, outbox_delivery_timeout);
	TimestampTz last_stall_report = 0;

	while (OutboxProducerServe(producer) > 0)
	{
		long		timeout = RELAY_ACK_POLL_MS;

		/*
		 * The round's deadline is the relay's, not librdkafka's: a message
		 * timeout could fail part of a partition's queue and let the rest
		 * through, out of order.  Purging fails everything not yet
		 * acknowledged at once, and the resend goes out in id order.
		 */
		if (GetCurrentTimestamp() >= give_up)
		{
			char		detail[128];

			snprintf(detail, sizeof(detail),
					 "outbox.delivery_timeout (%d ms) passed with %d brokers up",
					 outbox_delivery_timeout, OutboxProducerBrokersUp(producer));
			note_error("Kafka did not acknowledge in time, resending", detail);
			OutboxProducerPurge(producer);
			give_up = PG_INT64_MAX;
		}
		else if (TimestampDifferenceExceeds(last_stall_report, GetCurrentTimestamp(),
											RELAY_STALL_REPORT_MS) &&
				 TimestampDifferenceExceeds(started, GetCurrentTimestamp(),
											RELAY_STALL_REPORT_MS))
		{
			/*
			 * librdkafka retries an outage quietly; say that acknowledgements
			 * are overdue well before the round is given up.
			 */
			char		detail[128];

			snprintf(detail, sizeof(detail), "%d messages unacknowledged for %ld ms, %d brokers up",
					 OutboxProducerServe(producer),
					 (long) TimestampDifferenceMilliseconds(started, GetCurrentTimestamp()),
					 OutboxProducerBrokersUp(producer));
			note_error("waiting for Kafka", detail);
			last_stall_report = GetCurrentTimestamp();
		}

		if (ShutdownRequestPending)
		{
			TimestampTz now = GetCurrentTimestamp();

			if (deadline == 0)
				deadline = TimestampTzPlusMilliseconds(now,
													   OutboxSlotIsHeld(relay_slot) ? 0 : outbox_shutdown_timeout);
			if (now >= deadline)
			{
				OutboxProducerPurge(producer);
				while (OutboxProducerServe(producer) > 0)
					(void) WaitLatchOrSocket(MyLatch, WL_SOCKET_READABLE | WL_TIMEOUT |
											 WL_EXIT_ON_PM_DEATH,
											 OutboxProducerEventFd(producer), 100,
											 WAIT_ACKS);
				return false;
			}
			timeout = Min(timeout, TimestampDifferenceMilliseconds(now, deadline));
		}

		(void) WaitLatchOrSocket(MyLatch,
								 WL_LATCH_SET | WL_SOCKET_READABLE | WL_TIMEOUT |
								 WL_EXIT_ON_PM_DEATH,
								 OutboxProducerEventFd(producer), timeout,
								 WAIT_ACKS);
		ResetLatch(MyLatch);
		CHECK_FOR_INTERRUPTS();
		process_reload();

		/*
		 * librdkafka retries an outage by itself, and no delivery report
		 * arrives until the round is withdrawn: report its errors and the
		 * brokers it reaches while that lasts, not only once the page is
		 * settled.
		 */
		drain_producer_errors();
		OutboxSlotSetBrokersUp(relay_slot, OutboxProducerBrokersUp(producer));
		/*
		 * New Kafka settings: what is in flight gets a short grace to be
		 * acknowledged by the old producer (purging it at once would resend
		 * messages the brokers already have); then the round is withdrawn
		 * and resent on the new one.
		 */
		if (producer_settings_changed())
			give_up = Min(give_up,
						  TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
													  RELAY_RELOAD_GRACE_MS));
	}
	return true;
}

/*
 * sleep_ms
 *		Wait on the latch for up to ms; commits and signals cut it short.
 *		wait_event is what pg_stat_activity shows meanwhile.  Returns
 *		whether the latch was set.
 */
static bool
sleep_ms(long ms, uint32 wait_event)
{
	int			rc;

	rc = WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
				   ms, wait_event);
	ResetLatch(MyLatch);
	CHECK_FOR_INTERRUPTS();
	return (rc & WL_LATCH_SET) != 0;
}

/*
 * back_off
 *		Wait before trying again: exponential between outbox.retry_backoff_min
 *		and outbox.retry_backoff_max, with full jitter.  Commits do not cut
 *		it short; shutdown does.
 */
static void
back_off(void)
{
	long		floor_ms = outbox_retry_backoff_min;
	long		ceiling_ms = Max(outbox_retry_backoff_max, floor_ms);
	long		wait_ms;
	TimestampTz until;

	backoff_ms = backoff_ms == 0 ? floor_ms : Min((long) backoff_ms * 2, ceiling_ms);
	wait_ms = floor_ms + (long) pg_prng_uint64_range(&pg_global_prng_state, 0,
													 Max(backoff_ms - floor_ms, 0));
	set_state(OUTBOX_RELAY_BACKING_OFF);
	pgstat_report_activity(STATE_RUNNING, "backing off");
	until = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), wait_ms);
	while (!ShutdownRequestPending)
	{
		long		left = TimestampDifferenceMilliseconds(GetCurrentTimestamp(), until);

		if (left <= 0)
			break;
		sleep_ms(left, WAIT_BACKOFF);
		process_reload();
	}
	pgstat_report_activity(STATE_IDLE, NULL);
}

static OutboxBlocked *
find_blocked(const OutboxEvent *ev)
{
	ListCell   *lc;

	foreach(lc, blocked)
	{
		OutboxBlocked *b = (OutboxBlocked *) lfirst(lc);

		if (strcmp(b->aggregate_id, ev->aggregate_id) == 0 &&
			strcmp(b->aggregate_type, ev->aggregate_type) == 0)
			return b;
	}
	return NULL;
}

/* caller is in a transaction */
static void
reload_blocked(void)
{
	MemoryContextReset(blocked_cxt);
	blocked = OutboxStoreLoadBlocked(blocked_cxt);
	blocked_stale = false;
}

static void
block_aggregate(const OutboxEvent *head)
{
	MemoryContext old = MemoryContextSwitchTo(blocked_cxt);
	OutboxBlocked *b = palloc(sizeof(OutboxBlocked));

	b->aggregate_type = pstrdup(head->aggregate_type);
	b->aggregate_id = pstrdup(head->aggregate_id);
	b->head = pstrdup(head->event_id);
	blocked = lappend(blocked, b);
	MemoryContextSwitchTo(old);
}

static bool
same_aggregate(const OutboxEvent *a, const OutboxEvent *b)
{
	return strcmp(a->aggregate_id, b->aggregate_id) == 0 &&
		strcmp(a->aggregate_type, b->aggregate_type) == 0;
}

/*
 * quarantine
 *		events[i] was refused outbox.max_attempts times.  With the block
 *		policy, the later events of its aggregate in this page park behind
 *		it, and so will those of later pages (send_page).  The blocked list
 *		learns of it whatever the policy, so that it stays true if the
 *		policy changes; a replay page's quarantines are learnt by reloading
 *		the list.
 */
static void
quarantine(OutboxEvent *events, int n, int i, bool replay)
{
	OutboxEvent *head = &events[i];
	int			j;

	head->disposition = OUTBOX_EVENT_QUARANTINED;
	ereport(LOG,
			(errmsg("outbox relay quarantined event %s after %d attempts",
					head->event_id, head->attempts),
			 errdetail("Kafka refused it with %s (aggregate %s/%s, topic \"%s\").",
					   OutboxDeliveryErrorText(head->last_err, head->last_err_local),
					   head->aggregate_type,
					   head->aggregate_id, head->topic),
			 errhint("outbox.replay('%s') publishes it again; outbox.discard('%s') drops it.",
					 head->event_id, head->event_id)));
	if (!replay && find_blocked(head) == NULL)
		block_aggregate(head);
	if (outbox_poison_policy != OUTBOX_POISON_BLOCK)
		return;
	for (j = i + 1; j < n; j++)
		if (events[j].disposition == OUTBOX_EVENT_PENDING &&
			same_aggregate(&events[j], head))
		{
			events[j].disposition = OUTBOX_EVENT_PARKED;
			events[j].blocked_by = head->event_id;
		}
}

/* librdkafka refused the event at once, without a delivery report */
static bool
refused_now(const OutboxEvent *ev)
{
	return ev->delivery_err != OUTBOX_DELIVERY_PENDING && ev->delivery_err != 0;
}

/*
 * held_back
 *		Whether events[i] must wait this round: an earlier event of its
 *		aggregate in the page was refused (in an earlier round, or just now
 *		by librdkafka itself) and is being retried, so sending this one now
 *		would put it ahead.
 */
static bool
held_back(OutboxEvent *events, int i, bool any_refused)
{
	int			j;

	if (!any_refused)
		return false;
	for (j = 0; j < i; j++)
		if (events[j].disposition == OUTBOX_EVENT_PENDING &&
			(events[j].attempts > 0 || refused_now(&events[j])) &&
			same_aggregate(&events[j], &events[i]))
			return true;
	return false;
}

/*
 * send_round
 *		Hand librdkafka every event still pending, in id order, except those
 *		held back behind a refused one of their aggregate.  Returns how many
 *		went out; *retried counts those sent before.
 */
static int
send_round(OutboxEvent *events, int n, int *retried)
{
	int			i;
	int			sent = 0;
	bool		any_refused = false;

	*retried = 0;
	for (i = 0; i < n; i++)
		if (events[i].disposition == OUTBOX_EVENT_PENDING && events[i].attempts > 0)
			any_refused = true;

	/* a resend after a failure is still part of backing off */
	if (backoff_ms == 0)
		set_state(OUTBOX_RELAY_PUBLISHING);
	for (i = 0; i < n; i++)
	{
		/*
		 * A new topic may cost librdkafka a bounded metadata round trip:
		 * between events, look whether the relay must stop, so that a page
		 * of many topics does not outlast outbox.shutdown_timeout.
		 */
		if (ShutdownRequestPending)
			break;
		if (events[i].disposition != OUTBOX_EVENT_PENDING ||
			held_back(events, i, any_refused))
			continue;
		OutboxProducerSend(producer, &events[i]);
		sent++;
		if (events[i].first_failed_at != 0)
			(*retried)++;
		if (refused_now(&events[i]))
			any_refused = true;
	}
	return sent;
}

static bool
any_pending(const OutboxEvent *events, int n)
{
	int			i;

	for (i = 0; i < n; i++)
		if (events[i].disposition == OUTBOX_EVENT_PENDING)
			return true;
	return false;
}

/*
 * settle
 *		Given a round already sent (sent events, retried of them resent),
 *		collect its outcome, and send further rounds until each event is
 *		delivered, quarantined or parked.  Transient failures resend what is
 *		not delivered, in id order, after a backoff, as often as it takes;
 *		permanent failures count towards outbox.max_attempts; fatal ones
 *		rebuild the producer.  Returns PAGE_ABANDONED when the relay must
 *		stop first.
 */
static PageResult
settle(OutboxEvent *events, int n, bool replay, int sent, int retried)
{
	for (;;)
	{
		int			i;
		int			failed = 0;
		OutboxDeliveryTally tally;
		TimestampTz acked_at;
		int			first_err = 0;
		bool		rebuild = false;
		char		activity[64];

		if (sent == 0)
		{
			/* a round cut short by shutdown left events unsent */
			if (ShutdownRequestPending && any_pending(events, n))
				return PAGE_ABANDONED;
			/* settled, if only by quarantine: no longer backing off */
			backoff_ms = 0;
			return PAGE_SETTLED;
		}
		snprintf(activity, sizeof(activity), "waiting for acknowledgement of %d events", sent);
		pgstat_report_activity(STATE_RUNNING, activity);
		if (!wait_for_acks())
			return PAGE_ABANDONED;
		pgstat_report_activity(STATE_IDLE, NULL);
		drain_producer_errors();
		OutboxSlotSetBrokersUp(relay_slot, OutboxProducerBrokersUp(producer));
		if (retried > 0)
			OutboxSlotCountRetries(relay_slot, retried);
		memset(&tally, 0, sizeof(tally));
		acked_at = GetCurrentTimestamp();
		for (i = 0; i < n; i++)
		{
			OutboxEvent *ev = &events[i];
			TimestampTz now;

			if (ev->disposition != OUTBOX_EVENT_PENDING ||
				ev->delivery_err == OUTBOX_DELIVERY_PENDING)
				continue;
			if (ev->delivery_err == 0)
			{
				ev->disposition = OUTBOX_EVENT_DELIVERED;
				/* a replay's age is no publish latency */
				OutboxTallyAdd(&tally, replay ? -1 : acked_at - ev->created_at,
							   ev->payload_len);
				continue;
			}
			if (failed++ == 0)
				first_err = ev->delivery_err;
			now = GetCurrentTimestamp();
			ev->last_err = ev->delivery_err;
			ev->last_err_local = ev->delivery_local;
			ev->last_class = OutboxDeliveryErrorClass(ev->delivery_err);
			ev->delivery_err = OUTBOX_DELIVERY_PENDING;
			if (ev->first_failed_at == 0)
				ev->first_failed_at = now;
			ev->last_failed_at = now;
			OutboxSlotCountFailure(relay_slot, ev->last_class);
			if (ev->last_class == OUTBOX_ERROR_FATAL)
				rebuild = true;
			else if (ev->last_class == OUTBOX_ERROR_PERMANENT &&
					 ++ev->attempts >= outbox_max_attempts)
				quarantine(events, n, i, replay);
		}

		OutboxSlotCountDelivered(relay_slot, &tally);
		/* replays are not part of the batch, so not of its backlog */
		if (!replay)
			OutboxSlotCountBatchDelivered(relay_slot, (int64) tally.events);
		if (failed == 0)
		{
			backoff_ms = 0;
			/* held-back events may remain */
			sent = send_round(events, n, &retried);
			continue;
		}
		{
			char		detail[200];

			snprintf(detail, sizeof(detail), "%d of %d events failed, first with %s (%s); %d brokers up",
					 failed, sent, OutboxDeliveryErrorName(first_err),
					 OutboxErrorClassName(OutboxDeliveryErrorClass(first_err)),
					 OutboxProducerBrokersUp(producer));
			report_error("could not publish events, retrying", detail);
		}
		if (rebuild && producer != NULL)
		{
			report_error("Kafka producer failed fatally, rebuilding it",
						 OutboxDeliveryErrorName(first_err));
			drop_producer();
		}
		back_off();
		if (ShutdownRequestPending)
			return PAGE_ABANDONED;
		while (!ensure_producer())
		{
			back_off();
			if (ShutdownRequestPending)
				return PAGE_ABANDONED;
		}
		sent = send_round(events, n, &retried);
	}
}

/* deliver: send and settle events[0..n-1] (see settle) */
static PageResult
deliver(OutboxEvent *events, int n, bool replay)
{
	int			retried;
	int			sent = send_round(events, n, &retried);

	return settle(events, n, replay, sent, retried);
}

/*
 * read_page
 *		Read the next page of the open batch (opening one if none is) into
 *		pg: at most outbox.batch_size events and outbox.batch_max_bytes of
 *		them, so the page in hand and the one read ahead together stay
 *		within twice that.  The reader moves on at once; the progress row
 *		moves only when the page is settled (record_page).  Returns false
 *		when there is nothing to read.
 */
static bool
read_page(RelayPage *pg)
{
	bool		opened = false;
	bool		cut = false;

	MemoryContextReset(pg->cxt);
	pg->n = 0;

	begin_txn("reading events");
	if (!OutboxStoreExtensionPresent())
		exit_without_extension();
	if (blocked_stale)
		reload_blocked();
	if (!batch_open)
	{
		if (!OutboxStoreOpenBatch(&batch, relay_cxt))
		{
			end_txn();
			if (in_hand == NULL)
				OutboxSlotSetBacklog(relay_slot, true, 0, 0, 0);
			return false;
		}
		batch_open = true;
		opened = true;
	}
	pg->n = OutboxStoreReadPage(&batch, outbox_batch_size, outbox_batch_max_bytes,
								&pg->events, pg->cxt, &cut);
	end_txn();

	OutboxSlotSetBacklog(relay_slot, opened, batch.remaining,
						 pg->n > 0 && in_hand == NULL ? pg->events[0].created_at : -1,
						 pg->n);
	pg->cur = MemoryContextStrdup(pg->cxt, batch.cur);
	pg->last_id = pg->n > 0 ? pg->events[pg->n - 1].id : batch.last_id;
	pg->done = (pg->n < outbox_batch_size && !cut) || pg->last_id >= batch.max_id;
	batch.remaining -= pg->n;
	if (pg->done)
	{
		/* the next batch starts where this one ends, whatever is acked yet */
		if (batch.prev != NULL)
			pfree(batch.prev);
		batch.prev = batch.cur;
		batch.cur = NULL;
		batch.last_id = 0;
		batch_open = false;
	}
	else
		batch.last_id = pg->last_id;
	return true;
}

/*
 * send_page
 *		With outbox.poison_policy = 'block', park the events of blocked
 *		aggregates; then send the first round of the rest.  Decided now
 *		rather than when read, and against a blocked list reloaded if a
 *		replay, discard or replay page made it stale since: the page read
 *		ahead was read before those.  Whether a parked event stays parked
 *		is decided again when it is recorded (OutboxStoreRecordDeadLetters),
 *		as a replay() or discard() may commit while the page is in flight.
 */
static void
send_page(RelayPage *pg)
{
	int			i;

	if (outbox_poison_policy == OUTBOX_POISON_BLOCK)
	{
		if (blocked_stale)
		{
			begin_txn("reading dead letters");
			reload_blocked();
			end_txn();
		}
		for (i = 0; i < pg->n; i++)
		{
			OutboxBlocked *b = find_blocked(&pg->events[i]);

			if (b != NULL)
			{
				pg->events[i].disposition = OUTBOX_EVENT_PARKED;
				pg->events[i].blocked_by = b->head;
			}
		}
	}
	pg->sent = send_round(pg->events, pg->n, &pg->retried);
	in_hand = pg;
}

/*
 * record_page
 *		A settled page: record its quarantined and parked events and the
 *		relay's progress, in one transaction.  Parked events whose head was
 *		replayed or discarded meanwhile join the replay queue, which is
 *		published before the next page.
 */
static void
record_page(RelayPage *pg)
{
	int			i;
	int			delivered = 0;
	bool		has_dead = false;

	for (i = 0; i < pg->n; i++)
	{
		if (pg->events[i].disposition == OUTBOX_EVENT_DELIVERED)
			delivered++;
		else
			has_dead = true;
	}

	begin_txn("recording progress");
	if (has_dead && OutboxStoreRecordDeadLetters(pg->events, pg->n) > 0)
		replays_due = true;
	OutboxStoreSavePage(pg->cur, pg->last_id, delivered, pg->done);
	end_txn();
	OutboxSlotCountPage(relay_slot);
}

/*
 * publish_page
 *		Settle the page in hand (reading one first if there is none), and
 *		record it.  While its acknowledgements travel the next page is read,
 *		so the database and the network work at the same time; the next page
 *		is sent only after this one is recorded, so that a crash re-sends at
 *		most one page.
 */
static PageResult
publish_page(void)
{
	RelayPage  *pg;
	PageResult	result;

	if (in_hand == NULL)
	{
		pg = ahead != NULL ? ahead : &pages[0];
		if (ahead == NULL && !read_page(pg))
			return PAGE_EMPTY;
		ahead = NULL;
		send_page(pg);
	}
	pg = in_hand;

	if (ahead == NULL)
	{
		RelayPage  *next = (pg == &pages[0]) ? &pages[1] : &pages[0];

		if (read_page(next))
			ahead = next;
	}

	/* on shutdown, settle waits at most outbox.shutdown_timeout */
	result = settle(pg->events, pg->n, false, pg->sent, pg->retried);
	in_hand = NULL;
	if (result != PAGE_SETTLED)
		return result;
	record_page(pg);
	OutboxSlotSetBacklog(relay_slot, false, batch.remaining,
						 ahead != NULL && ahead->n > 0 ? ahead->events[0].created_at : 0, 0);
	return PAGE_SETTLED;
}

/*
 * publish_replays
 *		Publish the replay queue, a page at a time, until it is empty.
 */
static PageResult
publish_replays(void)
{
	for (;;)
	{
		OutboxEvent *events;
		int			n;
		int			i;
		int			delivered = 0;
		PageResult	result;

		MemoryContextReset(page_cxt);
		begin_txn("reading replays");
		n = OutboxStoreReadReplays(outbox_batch_size, &events, page_cxt);
		end_txn();
		if (n == 0)
			return PAGE_EMPTY;

		result = deliver(events, n, true);
		if (result != PAGE_SETTLED)
			return result;

		/* parked events it releases are read in the next round */
		begin_txn("recording replays");
		OutboxStoreFinishReplays(events, n);
		end_txn();
		/* read the settled dead letters in a transaction that sees them */
		blocked_stale = true;
		for (i = 0; i < n; i++)
			if (events[i].disposition == OUTBOX_EVENT_DELIVERED)
				delivered++;
		OutboxSlotCountPage(relay_slot);
		ereport(LOG,
				(errmsg("outbox relay replayed %d of %d queued events", delivered, n)));
	}
}

/*
 * adopt_restored
 *		Publish what a restore brought in and had not delivered, once its
 *		events and its progress row are both in (OutboxStoreAdoptRestored).
 *		Restored events whose progress row has not come after
 *		RELAY_RESTORE_WAIT_MS (a dump taken without it) are all published:
 *		their delivery is unknown, so at least once wins.
 */
static void
adopt_restored(void)
{
	TimestampTz now = GetCurrentTimestamp();
	bool		force;
	int64		published;

	force = restore_waiting_since != 0 &&
		TimestampDifferenceExceeds(restore_waiting_since, now, RELAY_RESTORE_WAIT_MS);
	begin_txn("adopting restored events");
	published = OutboxStoreAdoptRestored(force);
	end_txn();
	if (published == -2)
	{
		if (restore_waiting_since == 0)
			restore_waiting_since = now;
		return;
	}
	restore_waiting_since = 0;
	if (published >= 0)
		ereport(LOG,
				(errmsg("outbox relay for database \"%s\" adopted restored events",
						relay_dbname),
				 errdetail("%lld events not delivered before the dump will be published; "
						   "the events delivered before it are not sent again.",
						   (long long) published)));
}

/*
 * idle_cleanup
 *		When idle, delete published events past outbox.retention, a bounded
 *		batch at a time; a full batch means more may follow at the next idle
 *		moment.
 */
static void
idle_cleanup(void)
{
	TimestampTz now = GetCurrentTimestamp();
	int64		deleted;

	if (now < next_cleanup)
		return;
	begin_txn("deleting events past retention");
	deleted = OutboxStoreCleanup(RELAY_CLEANUP_BATCH);
	end_txn();
	next_cleanup = deleted >= RELAY_CLEANUP_BATCH ? now :
		TimestampTzPlusMilliseconds(now, RELAY_CLEANUP_INTERVAL_MS);
	if (deleted > 0)
		ereport(DEBUG1,
				(errmsg_internal("outbox relay deleted " INT64_FORMAT " events past retention", deleted)));
}

/*
 * idle_wait
 *		Sleep until a commit or signal sets the latch or the safety poll is
 *		due; returns whether the latch was set.  librdkafka's statistics,
 *		errors and logs arriving meanwhile are served without ending the
 *		wait: they run no query, and unserved they would pile up.
 */
static bool
idle_wait(void)
{
	TimestampTz until = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
													outbox_poll_interval);
	bool		latched = false;

	if (producer == NULL)
		return sleep_ms(outbox_poll_interval, WAIT_IDLE);
	for (;;)
	{
		long		left = TimestampDifferenceMilliseconds(GetCurrentTimestamp(), until);
		int			rc;

		if (left <= 0)
			break;
		rc = WaitLatchOrSocket(MyLatch,
							   WL_LATCH_SET | WL_SOCKET_READABLE | WL_TIMEOUT |
							   WL_EXIT_ON_PM_DEATH,
							   OutboxProducerEventFd(producer), left,
							   WAIT_IDLE);
		if (rc & WL_SOCKET_READABLE)
		{
			(void) OutboxProducerServe(producer);
			drain_producer_errors();
			OutboxSlotSetBrokersUp(relay_slot, OutboxProducerBrokersUp(producer));
		}
		latched = (rc & WL_LATCH_SET) != 0;
		if (rc & (WL_LATCH_SET | WL_TIMEOUT))
			break;
	}
	ResetLatch(MyLatch);
	CHECK_FOR_INTERRUPTS();
	return latched;
}

/*
 * OutboxRelayMain
 *		Entry point of a relay; main_arg is its database's OID.
 */
void
OutboxRelayMain(Datum main_arg)
{
	Oid			dboid = DatumGetObjectId(main_arg);
	int			other_pid;

	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, SignalHandlerForShutdownRequest);
	BackgroundWorkerUnblockSignals();

	BackgroundWorkerInitializeConnectionByOid(dboid, InvalidOid, 0);

	relay_slot = OutboxSlotAttach(dboid, &other_pid);
	if (relay_slot == NULL)
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
	before_shmem_exit(relay_detach, (Datum) 0);

	/* the relay's statements name every object; nothing else may resolve */
	SetConfigOption("search_path", "pg_catalog", PGC_SUSET, PGC_S_OVERRIDE);

	/*
	 * The batch-bounds query is planned with plain scans disabled, which
	 * inflates its cost estimate far past jit_above_cost: compiling it would
	 * add milliseconds to every wake-up for a query that runs in
	 * microseconds.
	 */
	SetConfigOption("jit", "off", PGC_SUSET, PGC_S_OVERRIDE);

	relay_cxt = AllocSetContextCreate(TopMemoryContext, "outbox relay",
									  ALLOCSET_DEFAULT_SIZES);
	/*
	 * A page's events take a few megabytes.  A large keeper block survives
	 * each reset, and malloc keeps freed memory instead of handing it back
	 * to the kernel, so draining a backlog does not fault fresh pages in
	 * for every page (librdkafka's per-message allocations gain too).
	 */
	page_cxt = AllocSetContextCreate(relay_cxt, "outbox replay page",
									 RELAY_PAGE_MEMORY, RELAY_PAGE_MEMORY,
									 ALLOCSET_DEFAULT_MAXSIZE);
	pages[0].cxt = AllocSetContextCreate(relay_cxt, "outbox page",
										 RELAY_PAGE_MEMORY, RELAY_PAGE_MEMORY,
										 ALLOCSET_DEFAULT_MAXSIZE);
	pages[1].cxt = AllocSetContextCreate(relay_cxt, "outbox page",
										 RELAY_PAGE_MEMORY, RELAY_PAGE_MEMORY,
										 ALLOCSET_DEFAULT_MAXSIZE);
	OutboxMallocKeep(RELAY_MALLOC_KEEP);
	blocked_cxt = AllocSetContextCreate(relay_cxt, "outbox blocked aggregates",
										ALLOCSET_SMALL_SIZES);
	producer_cxt = AllocSetContextCreate(relay_cxt, "outbox producer settings",
										 ALLOCSET_SMALL_SIZES);
	secrets_cxt = AllocSetContextCreate(relay_cxt, "outbox secrets",
										ALLOCSET_SMALL_SIZES);
	scratch_cxt = AllocSetContextCreate(relay_cxt, "outbox scratch",
										ALLOCSET_DEFAULT_SIZES);

	read_secrets();

	begin_txn("loading progress");
	relay_dbname = MemoryContextStrdup(relay_cxt, get_database_name(dboid));
	if (!OutboxStoreExtensionPresent())
		exit_without_extension();
	OutboxStoreLoadProgress(&batch, relay_cxt);
	end_txn();
	adopt_restored();

	ereport(LOG,
			(errmsg("outbox relay started for database \"%s\"", relay_dbname),
			 errdetail("brokers \"%s\", batch_size %d, poll_interval %d ms, enabled %s, "
					   "max_attempts %d, poison_policy %s, kafka_config %s",
					   outbox_kafka_brokers, outbox_batch_size,
					   outbox_poll_interval, outbox_enabled ? "on" : "off",
					   outbox_max_attempts,
					   outbox_poison_policy == OUTBOX_POISON_BLOCK ? "block" : "skip",
					   outbox_kafka_config[0] ? "(set, not shown)" : "(empty)"),
			 outbox_kafka_secrets_file[0] ?
			 errhint("Kafka secrets are read from \"%s\".", outbox_kafka_secrets_file) : 0));

	while (!ShutdownRequestPending)
	{
		PageResult	result;

		CHECK_FOR_INTERRUPTS();
		process_reload();

		if (!outbox_enabled || outbox_kafka_brokers[0] == '\0')
		{
			set_state(outbox_enabled ? OUTBOX_RELAY_NOT_CONFIGURED : OUTBOX_RELAY_PAUSED);
			/* a paused relay keeps its connections, to resume at once */
			if (producer != NULL && outbox_kafka_brokers[0] == '\0')
				drop_producer();
			/*
			 * A paused relay reads no page, which is where it would notice
			 * DROP EXTENSION; that commit asks it to look (every emitting
			 * commit sets the latch too, and must not cost a transaction).
			 */
			(void) idle_wait();
			if (OutboxSlotTakeExtensionCheck(relay_slot))
				check_extension();
			continue;
		}
		if (!ensure_producer())
		{
			back_off();
			continue;
		}

		if (OutboxSlotTakeReplayPending(relay_slot))
		{
			replays_due = true;
			batch_seen_valid = false;
			blocked_stale = true;
			/* a restore's rows wake the relay the same way */
			adopt_restored();
		}
		if (replays_due)
		{
			uint64		completions = OutboxXactCompletionCount();

			result = publish_replays();
			if (result == PAGE_ABANDONED)
				break;
			replays_due = false;
			replay_seen_completions = completions;
			replay_seen_valid = (result == PAGE_EMPTY);
		}

		if (in_hand == NULL && ahead == NULL && !batch_open &&
			batch_seen_valid &&
			batch_seen_completions == OutboxXactCompletionCount())
			result = PAGE_EMPTY;
		else
		{
			uint64		completions = OutboxXactCompletionCount();

			result = publish_page();
			batch_seen_completions = completions;
			batch_seen_valid = (result == PAGE_EMPTY);
		}
		if (result == PAGE_EMPTY && restore_waiting_since != 0)
			adopt_restored();
		if (result == PAGE_EMPTY)
		{
			set_state(OUTBOX_RELAY_IDLE);
			drain_producer_errors();
			idle_cleanup();

			/*
			 * Replays queued by a transaction that woke nobody (a prepared
			 * one) are found at the safety poll, if any transaction ended
			 * since the queue was last seen empty.
			 */
			if (!idle_wait() &&
				!(replay_seen_valid &&
				  replay_seen_completions == OutboxXactCompletionCount()))
				replays_due = true;
		}
		/* after a settled page the batch may have more: go on at once */
	}

	set_state(OUTBOX_RELAY_STOPPED);
	ereport(LOG,
			(errmsg("outbox relay for database \"%s\" stopped", relay_dbname)));
	proc_exit(0);
}
