/*-------------------------------------------------------------------------
 *
 * relay/relay_txn.c
 *		outbox.delivery = 'exactly_once': each page goes out in one Kafka
 *		transaction that ends with a progress record, and a relay that
 *		starts reconciles the database's progress with the last record
 *		Kafka committed.
 *
 * Invariants:
 *	- Transactions are numbered: relay_progress.kafka_transaction is the
 *	  number of the last one whose page the database recorded (N), and
 *	  the page in hand goes out in N + 1, whose progress record (key: the
 *	  transactional.id) carries the number and the page's position.  The
 *	  database records the page only after Kafka committed it.
 *	- So when a relay starts, after init_transactions() (which fences any
 *	  earlier producer with the same transactional.id and ends its
 *	  transaction), the last committed record says M = N (nothing is
 *	  committed that the database lacks: the page is sent again) or
 *	  M = N + 1 (Kafka committed the page, the database did not record it:
 *	  it is recorded now, from the record, and not sent again).  Anything
 *	  else (a database restored from a backup, a topic recreated) is
 *	  logged, and the numbers go on from the larger.
 *	- A transaction with any failed message is aborted whole: its
 *	  delivered events are pending again and the page is sent again in a
 *	  new one.  Events quarantined or parked are written to the database
 *	  before that new transaction (dead_recorded), so a crash between its
 *	  commit and the page's record cannot lose them; a relay that starts
 *	  skips those whose page it has not recorded (the unsettled list).
 *	- The transactional.id is outbox-<system identifier>-<database OID>
 *	  [-outbox.transactional_id_suffix]: a promoted standby has the same,
 *	  so its relay fences the old primary's, which stops publishing
 *	  (fenced) until its settings change; it never rebuilds in a loop.
 *	- No partition is held in this mode: a transaction spans every
 *	  partition of its page, so one partition that does not answer stops
 *	  the page, as an outage of the whole cluster does.
 *	- A progress record is hostile input: it is parsed strictly and used
 *	  only when it fits the database's own position.
 *
 * No SQL here (store_batch.c) and no librdkafka call (kafka_txn.c).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/timeline.h"
#include "access/transam.h"
#include "access/xlog.h"
#include "miscadmin.h"
#include "postmaster/interrupt.h"
#include "lib/stringinfo.h"
#include "utils/json.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "relay/relay_state.h"
#include "base/base.h"
#include "shmem/shmem.h"
#include "kafka/kafka.h"
#include "store/store.h"

#define TXN_SLICE_MS			250 /* a blocking call's slice */
#define TXN_CALL_MAX_MS			30000	/* then the relay backs off */
/* past another relay's transaction timeout (OUTBOX_TXN_TIMEOUT_MS) */
#define MARKER_READ_TIMEOUT_MS	(OUTBOX_TXN_TIMEOUT_MS + 10000)

/* bsearch's order of int64 */
static int
compare_int64(const void *a, const void *b)
{
	int64		x = *(const int64 *) a;
	int64		y = *(const int64 *) b;

	return (x > y) - (x < y);
}

/*
 * OutboxRelayTxnIdWanted
 *		The transactional.id the relay publishes with under the current
 *		settings; NULL with outbox.delivery = 'at_least_once'.
 */
const char *
OutboxRelayTxnIdWanted(Relay *r)
{
	char		id[128];

	if (outbox_delivery != OUTBOX_DELIVERY_EXACTLY_ONCE)
		return NULL;
	snprintf(id, sizeof(id), "outbox-" UINT64_FORMAT "-%u%s%s",
			 GetSystemIdentifier(), MyDatabaseId,
			 outbox_transactional_id_suffix[0] ? "-" : "",
			 outbox_transactional_id_suffix);
	if (r->txn_id == NULL || strcmp(r->txn_id, id) != 0)
	{
		if (r->txn_id != NULL)
			pfree(r->txn_id);
		r->txn_id = MemoryContextStrdup(r->cxt, id);
	}
	return r->txn_id;
}

/*
 * OutboxRelayTxnRevert
 *		The page's transaction was aborted: what it delivered is pending
 *		again.  (Only a page sent in a transaction: page_in_txn.)
 */
void
OutboxRelayTxnRevert(Relay *r, RelayPage *pg)
{
	int			i;

	r->page_in_txn = false;
	for (i = 0; i < pg->n; i++)
		if (pg->events[i].disposition == OUTBOX_EVENT_DELIVERED)
		{
			pg->events[i].disposition = OUTBOX_EVENT_PENDING;
			pg->events[i].delivery_err = OUTBOX_DELIVERY_PENDING;
			pg->events[i].in_flight = false;
		}
}

/*
 * txn_failed
 *		A transactional call failed for good (result is not OK): fenced
 *		stops the relay's publishing, fatal has the producer rebuilt, the
 *		rest is counted as an error.  Returns false.
 */
static bool
txn_failed(Relay *r, OutboxTxnResult result, const char *what, const char *err)
{
	r->txn_open = false;
	if (result == OUTBOX_TXN_FENCED)
	{
		if (!r->fenced)
			ereport(WARNING,
					(errmsg("outbox relay for database \"%s\" is fenced: another producer publishes with transactional.id \"%s\"",
							r->dbname, r->txn_id),
					 errdetail("%s: %s", what, err),
					 errhint("A promoted standby fences its old primary this way; this relay publishes nothing "
							 "until outbox.delivery, outbox.transactional_id_suffix or the brokers change.")));
		r->fenced = true;
		OutboxRelaySetState(r, OUTBOX_RELAY_FENCED);
		OutboxRelayNoteError(r, "fenced by another producer", err);
		return false;
	}
	if (result == OUTBOX_TXN_FATAL)
	{
		strlcpy(r->txn_error, err, sizeof(r->txn_error));
		r->fatal_reason = r->txn_error;
	}
	OutboxRelayReportError(r, what, err);
	return false;
}

/* the producer turned out fenced: stop publishing (txn_failed) */
void
OutboxRelayTxnFence(Relay *r, const char *err)
{
	(void) txn_failed(r, OUTBOX_TXN_FENCED, "the Kafka producer is fenced", err);
}

/* call a resumable transactional call in slices, looking at shutdown */
static OutboxTxnResult
sliced(Relay *r, OutboxTxnResult (*call) (OutboxProducer *, int, char *, size_t),
	   char *err, size_t len)
{
	TimestampTz started = GetCurrentTimestamp();
	OutboxTxnResult result;

	for (;;)
	{
		TimestampTz called = GetCurrentTimestamp();

		result = call(r->producer, TXN_SLICE_MS, err, len);
		if (result != OUTBOX_TXN_RETRY || ShutdownRequestPending ||
			TimestampDifferenceExceeds(started, GetCurrentTimestamp(), TXN_CALL_MAX_MS))
			return result;
		/* a retriable refusal that did not wait (another call pending) */
		if (!TimestampDifferenceExceeds(called, GetCurrentTimestamp(), TXN_SLICE_MS / 2))
			pg_usleep(TXN_SLICE_MS * 1000L);
		CHECK_FOR_INTERRUPTS();
	}
}

/*
 * apply_replay_marker
 *		Kafka committed a replay page the database did not record: read the
 *		queue's head again and record, as delivered, its entries up to the
 *		record's last position.
 */
static bool
apply_replay_marker(Relay *r, const RelayMarker *m)
{
	RelayPage  *pg = &r->replay_page;
	int			i;
	int			n = 0;

	(void) OutboxRelayReadReplays(r, pg);
	for (i = 0; i < pg->n; i++)
		if (pg->events[i].queue_position >= m->first_id &&
			pg->events[i].queue_position <= m->last_id)
		{
			pg->events[n] = pg->events[i];
			pg->events[n++].disposition = OUTBOX_EVENT_DELIVERED;
		}
	/* every entry the transaction had, and no other (see OutboxRelayMarkerFits) */
	if (n != m->events)
		return false;
	pg->n = n;
	r->txn_to_record = m->transaction;
	OutboxRelayRecordPage(r, pg);
	return true;
}

/*
 * not_applied
 *		A committed record the database did not record, which does not fit
 *		its position: say so, and go on numbering from it.  The page is sent
 *		again (at least once, for that page).
 */
static void
not_applied(Relay *r, const RelayMarker *m)
{
	ereport(WARNING,
			(errmsg("outbox relay for database \"%s\": the progress record of Kafka transaction " INT64_FORMAT " does not fit the database's position",
					r->dbname, m->transaction),
			 errdetail("The record was written on timeline %u at %X/%X (%s \"%.64s\", last " INT64_FORMAT "); it is not applied, and its events may be published again.",
					   m->timeline, LSN_FORMAT_ARGS(m->lsn),
					   m->replay ? "replay of" : "snapshot",
					   m->replay ? "the queue" : m->snapshot, m->last_id)));
	OutboxRelayBeginTxn("recording the Kafka transaction");
	OutboxStoreSaveKafkaTransaction(m->transaction);
	OutboxRelayEndTxn(r);
	r->kafka_txn = m->transaction;
}

/*
 * apply_marker
 *		Kafka committed transaction N + 1 and the database did not record
 *		its page: record it now from the progress record.
 */
static void
apply_marker(Relay *r, const RelayMarker *m)
{
	if (!OutboxRelayMarkerFits(r, m))
	{
		not_applied(r, m);
		return;
	}
	if (m->replay)
	{
		if (!apply_replay_marker(r, m))
		{
			not_applied(r, m);
			return;
		}
	}
	else
	{
		OutboxRelayBeginTxn("recording a committed Kafka transaction");
		OutboxStoreSavePage(m->snapshot, m->last_id, m->events, m->done);
		OutboxStoreSaveKafkaTransaction(m->transaction);
		OutboxRelayEndTxn(r);
		/* read back in a snapshot that sees it */
		OutboxRelayBeginTxn("loading progress");
		OutboxStoreLoadProgress(&r->batch, r->cxt);
		OutboxRelayEndTxn(r);
		/* reading goes on from the position recorded now */
		r->batch_open = false;
		r->ahead = NULL;
	}
	r->kafka_txn = m->transaction;
	ereport(LOG,
			(errmsg("outbox relay for database \"%s\": Kafka committed transaction " INT64_FORMAT " (%d events) before the relay recorded it; recorded it now",
					r->dbname, m->transaction, m->events)));
}

/* numbers that do not follow: say so, and go on from the larger */
static void
numbers_jump(Relay *r, int64 committed)
{
	ereport(WARNING,
			(errmsg("outbox relay for database \"%s\": Kafka's last committed transaction is " INT64_FORMAT ", the database's " INT64_FORMAT,
					r->dbname, committed, r->kafka_txn),
			 errdetail(committed > r->kafka_txn ?
					   "The database is behind Kafka (restored from a backup?): what it had not recorded may be published again." :
					   "The progress topic lacks the database's last transactions (recreated, or another cluster?)."),
			 errhint("Numbering goes on from the larger.")));
	if (committed > r->kafka_txn)
	{
		r->kafka_txn = committed;
		OutboxRelayBeginTxn("recording the Kafka transaction");
		OutboxStoreSaveKafkaTransaction(committed);
		OutboxRelayEndTxn(r);
	}
}

/*
 * reconcile
 *		Read the last committed progress record and settle the database's
 *		progress and the page in hand with it.  False (with the error
 *		counted) when it cannot be read.
 */
static bool
reconcile(Relay *r)
{
	char	   *value = NULL;
	char	   *msg = NULL;
	RelayMarker m;
	int			found;

	found = OutboxKafkaReadMarker(outbox_progress_topic, r->txn_id, &value,
								  MARKER_READ_TIMEOUT_MS, &msg);
	if (found < 0)
	{
		OutboxRelayReportError(r, "could not read the progress topic", msg);
		return false;
	}
	if (found == 0)
		memset(&m, 0, sizeof(m));
	else if (!OutboxRelayParseMarker(value, &m))
	{
		ereport(WARNING,
				(errmsg("outbox relay for database \"%s\": the last progress record in \"%s\" is not one a relay writes",
						r->dbname, outbox_progress_topic),
				 errhint("Only the relay's principal should be able to write to the progress topic.")));
		m.transaction = r->kafka_txn;
	}

	if (m.transaction == r->kafka_txn + 1 && r->in_hand != NULL && r->txn_committing)
	{
		r->in_hand_committed = true;
		r->txn_to_record = m.transaction;
	}
	else if (m.transaction == r->kafka_txn + 1 && r->in_hand == NULL)
		apply_marker(r, &m);
	else if (m.transaction != r->kafka_txn)
		numbers_jump(r, m.transaction);
	if (r->in_hand != NULL && !r->in_hand_committed && r->page_in_txn)
		OutboxRelayTxnRevert(r, r->in_hand);
	return true;
}

/* the progress topic exists and is compacted, or cannot be checked */
static bool
progress_topic_ok(Relay *r)
{
	bool		refused;
	char	   *msg = NULL;

	/* once a relay's life, for the topic's name as it was then */
	if (r->topic_checked != NULL && strcmp(r->topic_checked, outbox_progress_topic) == 0)
		return true;
	if (OutboxProducerEnsureProgressTopic(r->producer, outbox_progress_topic, &refused, &msg))
	{
		r->topic_checked = MemoryContextStrdup(r->cxt, outbox_progress_topic);
		return true;
	}
	if (refused)
	{
		OutboxRelayReportError(r, psprintf("the progress topic \"%s\" cannot be used",
										   outbox_progress_topic), msg);
		return false;
	}
	ereport(LOG,
			(errmsg("outbox relay: could not check the progress topic \"%s\"", outbox_progress_topic),
			 errdetail("%s", msg),
			 errhint("It must be compacted (cleanup.policy=compact).")));
	r->topic_checked = MemoryContextStrdup(r->cxt, outbox_progress_topic);
	return true;
}

/*
 * OutboxRelayTxnStart
 *		A transactional producer was built: initialise its transactions,
 *		check the progress topic and reconcile (once per producer).  At
 *		the relay's first start, learn the events dead-lettered before
 *		their page's transaction.  False: the relay backs off.
 */
bool
OutboxRelayTxnStart(Relay *r)
{
	char		err[256];
	OutboxTxnResult result;

	/* a reloaded progress topic is checked and read again between pages */
	if (r->txn_ready && !r->txn_open && r->topic_checked != NULL &&
		strcmp(r->topic_checked, outbox_progress_topic) != 0)
		r->txn_ready = false;
	if (r->txn_ready)
		return true;
	if (r->holds != NIL)
	{
		OutboxRelayReportError(r, "outbox.delivery = exactly_once waits for the held partitions",
							   "Events held for unavailable partitions are sent under at_least_once: "
							   "set it until outbox.held is empty.");
		return false;
	}
	OutboxRelayBeginTxn("reading the Kafka transaction");
	r->kafka_txn = OutboxStoreLoadKafkaTransaction();
	if (r->kafka_txn >= 0 && r->unsettled == NULL)
		r->nunsettled = OutboxStoreLoadUnsettledDeadLetters(&r->unsettled, r->cxt);
	OutboxRelayEndTxn(r);
	if (r->kafka_txn < 0)
	{
		OutboxRelayReportError(r, "outbox.delivery = exactly_once needs the extension's version 1.8",
							   "outbox.relay_progress has no kafka_transaction column: run ALTER EXTENSION outbox UPDATE.");
		return false;
	}
	if (!r->txn_inited)
	{
		result = sliced(r, OutboxProducerInitTxn, err, sizeof(err));
		if (result != OUTBOX_TXN_OK)
			return txn_failed(r, result, "could not initialise Kafka transactions", err);
		r->txn_inited = true;
	}
	if (!progress_topic_ok(r) || !reconcile(r))
		return false;
	r->txn_open = false;
	r->txn_committing = false;
	r->marker_sent = false;
	r->txn_ready = true;
	return true;
}

/*
 * OutboxRelayTxnBegin
 *		Open the transaction the next round goes out in, unless one is.
 */
bool
OutboxRelayTxnBegin(Relay *r)
{
	char		err[256];
	OutboxTxnResult result;

	if (r->txn_open)
		return true;
	result = OutboxProducerBeginTxn(r->producer, err, sizeof(err));
	/* refused as retriable, another call is pending: a new producer ends it */
	if (result == OUTBOX_TXN_RETRY || result == OUTBOX_TXN_ABORT)
		result = OUTBOX_TXN_FATAL;
	if (result != OUTBOX_TXN_OK)
		return txn_failed(r, result, "could not begin a Kafka transaction", err);
	r->txn_open = true;
	r->txn_committing = false;
	r->marker_sent = false;
	return true;
}

/*
 * OutboxRelayTxnPrerecord
 *		Write the page's new quarantined and parked events to the database
 *		now, before the transaction that leaves them out commits: a crash
 *		after Kafka commits it must not lose them.  Before the page's first
 *		round (events of blocked aggregates) and after an aborted one.
 */
void
OutboxRelayTxnPrerecord(Relay *r, RelayPage *pg)
{
	OutboxEvent *dead = palloc(sizeof(OutboxEvent) * Max(pg->n, 1));
	int			n = 0;
	int			i;

	for (i = 0; i < pg->n; i++)
		if ((pg->events[i].disposition == OUTBOX_EVENT_QUARANTINED ||
			 pg->events[i].disposition == OUTBOX_EVENT_PARKED) &&
			!pg->events[i].dead_recorded)
			dead[n++] = pg->events[i];
	if (n > 0)
	{
		OutboxRelayBeginTxn("recording dead letters");
		if (pg->replay)
			OutboxStoreFinishReplays(dead, n, OutboxDeliveryErrorText);
		else if (OutboxStoreRecordDeadLetters(dead, n, OutboxDeliveryErrorText) > 0)
			r->replays_due = true;
		OutboxRelayEndTxn(r);
		r->blocked_stale = true;
		for (i = 0; i < pg->n; i++)
			if (pg->events[i].disposition == OUTBOX_EVENT_QUARANTINED ||
				pg->events[i].disposition == OUTBOX_EVENT_PARKED)
				pg->events[i].dead_recorded = true;
	}
	pfree(dead);
}

/*
 * OutboxRelayTxnAbortNow
 *		librdkafka failed the open transaction while its round waits: abort
 *		it now.  librdkafka may hold messages back until the abort (a
 *		partition drained for an epoch bump); its abort withdraws what is
 *		queued, waits for what is in flight, and serves their reports, so
 *		the round settles, as failed, and OutboxRelayTxnAbort then only
 *		makes the page pending again.
 */
void
OutboxRelayTxnAbortNow(Relay *r)
{
	char		err[256];
	OutboxTxnResult result;

	if (!r->txn_open)
		return;
	result = sliced(r, OutboxProducerAbortTxn, err, sizeof(err));
	if (result == OUTBOX_TXN_RETRY || result == OUTBOX_TXN_ABORT)
		result = OUTBOX_TXN_FATAL;
	if (result != OUTBOX_TXN_OK)
		(void) txn_failed(r, result, "could not abort a Kafka transaction", err);
	r->txn_open = false;
}

/*
 * OutboxRelayTxnAbort
 *		A round of pg failed: abort its transaction (Kafka drops what it
 *		delivered), make those events pending again, and write the new dead
 *		letters before the next transaction.
 */
void
OutboxRelayTxnAbort(Relay *r, RelayPage *pg)
{
	/* an abort that does not end has the producer rebuilt, which ends it */
	OutboxRelayTxnAbortNow(r);
	r->txn_committing = false;
	r->marker_sent = false;
	OutboxRelayTxnRevert(r, pg);
	OutboxRelayTxnPrerecord(r, pg);
}

/*
 * OutboxRelayTxnSkipSettled
 *		Before a batch page's first round: its events that were dead-lettered
 *		before a crash (the unsettled list) are not sent again, nor
 *		recorded again.
 */
void
OutboxRelayTxnSkipSettled(Relay *r, RelayPage *pg)
{
	int			i;

	if (r->nunsettled == 0 || pg->replay)
		return;
	for (i = 0; i < pg->n; i++)
	{
		int64		id = pg->events[i].id;

		if (bsearch(&id, r->unsettled, r->nunsettled, sizeof(int64), compare_int64) != NULL)
		{
			pg->events[i].disposition = OUTBOX_EVENT_QUARANTINED;
			pg->events[i].dead_recorded = true;
		}
	}
}

/*
 * OutboxRelayTxnSendMarker
 *		Produce pg's progress record in the open transaction, with the
 *		transaction's first round: the transaction commits only once every
 *		event of the page is delivered in it, and aborts otherwise, so the
 *		record's count and position hold for whatever commits.
 */
void
OutboxRelayTxnSendMarker(Relay *r, RelayPage *pg)
{
	memset(&r->marker, 0, sizeof(r->marker));
	OutboxProducerSendMarker(r->producer, outbox_progress_topic, r->txn_id,
							 OutboxRelayMarkerValue(r, pg, r->kafka_txn + 1), &r->marker);
	r->marker_sent = true;
}

/*
 * OutboxRelayTxnInDoubt
 *		The commit did not end within outbox.delivery_timeout: its outcome
 *		is unknown, and librdkafka takes no other call while it is pending.
 *		The producer is rebuilt with the commit still marked as under way:
 *		the new producer's init_transactions has the coordinator finish or
 *		abort it, and the progress record read back says which (reconcile):
 *		the page is recorded, or sent again.
 */
void
OutboxRelayTxnInDoubt(Relay *r)
{
	(void) txn_failed(r, OUTBOX_TXN_FATAL, "a Kafka commit did not end in time",
					  "outbox.delivery_timeout passed; the progress record will say whether it committed");
}

/*
 * OutboxRelayTxnCommit
 *		Commit the open transaction, for at most one slice: RETRY means call
 *		again.  Committed, the page is recorded with its number.
 */
OutboxTxnResult
OutboxRelayTxnCommit(Relay *r)
{
	char		err[256];
	OutboxTxnResult result;

	r->txn_committing = true;
	result = OutboxProducerCommitTxn(r->producer, TXN_SLICE_MS, err, sizeof(err));
	if (result == OUTBOX_TXN_OK)
	{
		r->txn_open = false;
		r->txn_committing = false;
		r->txn_to_record = r->kafka_txn + 1;
	}
	else if (result != OUTBOX_TXN_RETRY && result != OUTBOX_TXN_ABORT)
		(void) txn_failed(r, result, "could not commit a Kafka transaction", err);
	return result;
}
