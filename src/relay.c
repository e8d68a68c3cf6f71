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
 *	  successful delivery report; only then is the progress row written,
 *	  once per page.  A page that fails is sent again whole, so a crash or
 *	  failure re-sends at most one page.
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

#include "outbox.h"

#define RELAY_BACKOFF_MIN_MS	100
#define RELAY_BACKOFF_MAX_MS	10000
#define RELAY_LOG_INTERVAL_MS	10000
#define RELAY_ACK_POLL_MS		1000

typedef enum PageResult
{
	PAGE_EMPTY,					/* nothing to publish */
	PAGE_ACKED,					/* published and recorded */
	PAGE_FAILED,				/* some message failed: back off, retry */
	PAGE_ABANDONED				/* stopping before every ack arrived */
} PageResult;

static OutboxSlot *relay_slot = NULL;
static char *relay_dbname = NULL;
static MemoryContext relay_cxt = NULL;
static MemoryContext page_cxt = NULL;
static OutboxBatch batch;
static bool batch_open = false;

static OutboxProducer *producer = NULL;
static char *producer_brokers = NULL;
static char *producer_config = NULL;

static int	backoff_ms = 0;
static TimestampTz last_error_log = 0;
static int	errors_since_log = 0;

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

static void
set_state(OutboxRelayState state)
{
	OutboxSlotSetState(relay_slot, state);
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

/*
 * report_error
 *		Count an external failure and log it at most every
 *		RELAY_LOG_INTERVAL_MS, with how many happened since the last line.
 */
static void
report_error(const char *what, const char *detail)
{
	TimestampTz now = GetCurrentTimestamp();
	char		line[256];

	snprintf(line, sizeof(line), "%s: %s", what, detail);
	OutboxSlotCountError(relay_slot, line);
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

	if (producer != NULL && OutboxProducerTakeError(producer, buf, sizeof(buf), &count))
		report_error("Kafka client error", buf);
}

static bool
producer_settings_changed(void)
{
	return producer != NULL &&
		(strcmp(producer_brokers, outbox_kafka_brokers) != 0 ||
		 strcmp(producer_config, outbox_kafka_config) != 0);
}

static void
drop_producer(void)
{
	OutboxProducerDestroy(producer);
	producer = NULL;
	pfree(producer_brokers);
	pfree(producer_config);
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

	producer = OutboxProducerCreate(outbox_kafka_brokers, outbox_kafka_config, &message);
	if (producer == NULL)
	{
		report_error("could not create the Kafka producer", message);
		return false;
	}
	producer_brokers = MemoryContextStrdup(relay_cxt, outbox_kafka_brokers);
	producer_config = MemoryContextStrdup(relay_cxt, outbox_kafka_config);
	return true;
}

static void
process_reload(void)
{
	if (ConfigReloadPending)
	{
		ConfigReloadPending = false;
		ProcessConfigFile(PGC_SIGHUP);
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

	while (OutboxProducerServe(producer) > 0)
	{
		long		timeout = RELAY_ACK_POLL_MS;

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
											 PG_WAIT_EXTENSION);
				return false;
			}
			timeout = Min(timeout, TimestampDifferenceMilliseconds(now, deadline));
		}

		(void) WaitLatchOrSocket(MyLatch,
								 WL_LATCH_SET | WL_SOCKET_READABLE | WL_TIMEOUT |
								 WL_EXIT_ON_PM_DEATH,
								 OutboxProducerEventFd(producer), timeout,
								 PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
		CHECK_FOR_INTERRUPTS();
		process_reload();
		/* new Kafka settings: give up on the old producer, resend on the new */
		if (producer_settings_changed())
			OutboxProducerPurge(producer);
	}
	return true;
}

/*
 * publish_page
 *		Read the next page of the batch, publish it, and record it once
 *		every message is acknowledged.
 */
static PageResult
publish_page(void)
{
	OutboxEvent *events;
	int			n;
	int			i;
	int			failed = 0;
	int			first_err = 0;
	bool		done;
	char		activity[64];

	MemoryContextReset(page_cxt);

	begin_txn("reading events");
	if (!OutboxStoreExtensionPresent())
		exit_without_extension();
	if (!batch_open)
	{
		if (!OutboxStoreOpenBatch(&batch, relay_cxt))
		{
			end_txn();
			return PAGE_EMPTY;
		}
		batch_open = true;
	}
	n = OutboxStoreReadPage(&batch, outbox_batch_size, &events, page_cxt);
	end_txn();

	set_state(OUTBOX_RELAY_PUBLISHING);
	snprintf(activity, sizeof(activity), "publishing %d events", n);
	pgstat_report_activity(STATE_RUNNING, activity);
	for (i = 0; i < n; i++)
		OutboxProducerSend(producer, &events[i]);
	snprintf(activity, sizeof(activity), "waiting for acknowledgement of %d events", n);
	pgstat_report_activity(STATE_RUNNING, activity);
	if (!wait_for_acks())
		return PAGE_ABANDONED;
	pgstat_report_activity(STATE_IDLE, NULL);
	drain_producer_errors();

	for (i = 0; i < n; i++)
		if (events[i].delivery_err != 0)
		{
			if (failed++ == 0)
				first_err = events[i].delivery_err;
		}
	if (failed > 0)
	{
		char		detail[200];

		snprintf(detail, sizeof(detail), "%d of %d events failed, first with %s",
				 failed, n, OutboxDeliveryErrorName(first_err));
		report_error("could not publish a page of events", detail);
		return PAGE_FAILED;
	}

	done = (n < outbox_batch_size) || events[n - 1].id >= batch.max_id;
	begin_txn("recording progress");
	OutboxStoreSavePage(&batch, n > 0 ? events[n - 1].id : batch.last_id, n, done);
	end_txn();

	OutboxSlotCountPage(relay_slot, n);
	if (done)
	{
		if (batch.prev != NULL)
			pfree(batch.prev);
		batch.prev = batch.cur;
		batch.cur = NULL;
		batch.last_id = 0;
		batch_open = false;
	}
	else
		batch.last_id = events[n - 1].id;
	return PAGE_ACKED;
}

/*
 * sleep_ms
 *		Wait on the latch for up to ms; commits and signals cut it short.
 */
static void
sleep_ms(long ms)
{
	(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
					 ms, PG_WAIT_EXTENSION);
	ResetLatch(MyLatch);
	CHECK_FOR_INTERRUPTS();
}

/* Exponential backoff with full jitter between the bounds. */
static void
back_off(void)
{
	long		ceiling;

	backoff_ms = backoff_ms == 0 ? RELAY_BACKOFF_MIN_MS :
		Min(backoff_ms * 2, RELAY_BACKOFF_MAX_MS);
	ceiling = backoff_ms;
	set_state(OUTBOX_RELAY_BACKING_OFF);
	pgstat_report_activity(STATE_RUNNING, "backing off");
	/* a commit sets the latch, but backing off must not end early */
	{
		TimestampTz until = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
														RELAY_BACKOFF_MIN_MS / 2 +
														(long) pg_prng_uint64_range(&pg_global_prng_state, 0, ceiling));

		while (!ShutdownRequestPending)
		{
			long		left = TimestampDifferenceMilliseconds(GetCurrentTimestamp(), until);

			if (left <= 0)
				break;
			sleep_ms(left);
			process_reload();
		}
	}
	pgstat_report_activity(STATE_IDLE, NULL);
}

/*
 * OutboxRelayMain
 *		Entry point of a relay; main_arg is its database's OID.
 */
void
OutboxRelayMain(Datum main_arg)
{
	Oid			dboid = DatumGetObjectId(main_arg);

	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, SignalHandlerForShutdownRequest);
	BackgroundWorkerUnblockSignals();

	BackgroundWorkerInitializeConnectionByOid(dboid, InvalidOid, 0);

	relay_slot = OutboxSlotAttach(dboid);
	if (relay_slot == NULL)
	{
		ereport(LOG,
				(errmsg("outbox relay for database %u has no slot and stops", dboid)));
		proc_exit(0);
	}
	before_shmem_exit(relay_detach, (Datum) 0);

	/* the relay's statements name every object; nothing else may resolve */
	SetConfigOption("search_path", "pg_catalog", PGC_SUSET, PGC_S_OVERRIDE);

	relay_cxt = AllocSetContextCreate(TopMemoryContext, "outbox relay",
									  ALLOCSET_DEFAULT_SIZES);
	page_cxt = AllocSetContextCreate(relay_cxt, "outbox page",
									 ALLOCSET_DEFAULT_SIZES);

	begin_txn("loading progress");
	relay_dbname = MemoryContextStrdup(relay_cxt, get_database_name(dboid));
	if (!OutboxStoreExtensionPresent())
		exit_without_extension();
	OutboxStoreLoadProgress(&batch, relay_cxt);
	end_txn();

	ereport(LOG,
			(errmsg("outbox relay started for database \"%s\"", relay_dbname),
			 errdetail("brokers \"%s\", batch_size %d, poll_interval %d ms, enabled %s",
					   outbox_kafka_brokers, outbox_batch_size,
					   outbox_poll_interval, outbox_enabled ? "on" : "off")));

	while (!ShutdownRequestPending)
	{
		PageResult	result;

		CHECK_FOR_INTERRUPTS();
		process_reload();

		if (!outbox_enabled || outbox_kafka_brokers[0] == '\0')
		{
			set_state(outbox_enabled ? OUTBOX_RELAY_NOT_CONFIGURED : OUTBOX_RELAY_PAUSED);
			if (producer != NULL)
				drop_producer();
			sleep_ms(outbox_poll_interval);
			continue;
		}
		if (!ensure_producer())
		{
			back_off();
			continue;
		}

		result = publish_page();
		switch (result)
		{
			case PAGE_ACKED:
				backoff_ms = 0;
				/* the batch may have more pages: go on without waiting */
				break;
			case PAGE_EMPTY:
				backoff_ms = 0;
				set_state(OUTBOX_RELAY_IDLE);
				drain_producer_errors();
				(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
								 outbox_poll_interval, PG_WAIT_EXTENSION);
				ResetLatch(MyLatch);
				break;
			case PAGE_FAILED:
				back_off();
				break;
			case PAGE_ABANDONED:
				break;
		}
	}

	set_state(OUTBOX_RELAY_STOPPED);
	ereport(LOG,
			(errmsg("outbox relay for database \"%s\" stopped", relay_dbname)));
	proc_exit(0);
}
