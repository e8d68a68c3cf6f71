/*-------------------------------------------------------------------------
 *
 * relay/relay_page.c
 *		The relay's database side: read pages and replays, record settled
 *		pages, read the blocked aggregates, adopt restored events, delete
 *		what is past retention.
 *
 * Invariants:
 *	- Each of these runs in one short transaction of its own, through
 *	  store_batch.c, and none is open while the relay waits on the network
 *	  (the brackets are relay_state.c's).  After each the relay is back in
 *	  its loop memory context.
 *	- The reader moves on at once (the batch in Relay); the progress row
 *	  moves only when a page is settled, once per page
 *	  (OutboxRelayRecordPage).
 *	- A page holds at most outbox.batch_size events and
 *	  outbox.batch_max_bytes of them, so the page in hand and the one read
 *	  ahead together stay within twice that.
 *	- Where the extension is looked for (reading a page, a check asked by
 *	  DROP EXTENSION, start-up), its absence ends the relay with exit 0 and
 *	  the launcher told not to restart it.
 *
 * No SQL text here (store_batch.c), no librdkafka call (producer.c).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "commands/dbcommands.h"
#include "lib/stringinfo.h"
#include "storage/ipc.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "relay/relay.h"
#include "relay/relay_state.h"
#include "base/base.h"
#include "shmem/shmem.h"
#include "kafka/kafka.h"
#include "store/store.h"

#define RELAY_CLEANUP_INTERVAL_MS 60000
/* the longest the cleanup leaves the events out while none can be due */
#define RELAY_EVENTS_LOOK_MAX_MS 3600000
#define RELAY_CLEANUP_BATCH		10000
#define RELAY_RESTORE_WAIT_MS	60000	/* restored events wait for their
										 * progress row at most */

/* The extension is gone: nothing left to publish in this database. */
static void
exit_without_extension(Relay *r)
{
	ereport(LOG,
			(errmsg("outbox relay for database \"%s\" stops: the extension is not installed",
					r->dbname)));
	OutboxSlotMarkNoExtension(r->slot);
	proc_exit(0);
}

/* Exit, as exit_without_extension does, if the extension was dropped. */
void
OutboxRelayCheckExtension(Relay *r)
{
	OutboxRelayBeginTxn("checking the extension");
	if (!OutboxStoreExtensionPresent())
		exit_without_extension(r);
	OutboxRelayEndTxn(r);
}

/* status(): the backlog as the relay knows it now */
static void
report_backlog(Relay *r, bool opened, int64 remaining, TimestampTz oldest,
			   int page_size, int pages)
{
	OutboxRoundReport report;

	OutboxRelayReportInit(&report);
	report.pages = pages;
	report.set_backlog = true;
	report.batch_opened = opened;
	report.batch_remaining = remaining;
	report.oldest_pending = oldest;
	report.page_size = page_size;
	OutboxSlotReportRound(r->slot, &report);
}

/*
 * pages_pending
 *		Events of the batch's pages in hand and read ahead, but except, not
 *		settled yet: read out of the batch's remainder, still in the backlog
 *		until a settled round reports them delivered (OutboxRelaySettleRound
 *		marks them and reports them at once, and they leave it then).
 */
static int64
pages_pending(Relay *r, const RelayPage *except)
{
	RelayPage  *pages[2] = {r->in_hand, r->ahead};
	int64		n = 0;

	for (int i = 0; i < 2; i++)
	{
		RelayPage  *p = pages[i];

		if (p == NULL || p == except || p->replay || p->drain != NULL)
			continue;
		for (int j = 0; j < p->n; j++)
			if (p->events[j].disposition == OUTBOX_EVENT_PENDING)
				n++;
	}
	return n;
}

/*
 * count_backlog_at_start
 *		A starting relay's slot knows no backlog (shared memory starts
 *		empty, a new relay's slot is zeroed) until the relay reads a page,
 *		which a paused relay, or one that cannot reach Kafka, does not do:
 *		emit()'s backpressure and status() would see none.  With a limit
 *		set, count it once in the log.  Commits between the count and the
 *		report are counted twice: the figure errs high until the first page.
 */
static void
count_backlog_at_start(Relay *r)
{
	int64		backlog;
	TimestampTz oldest;

	if (outbox_max_backlog <= 0 && outbox_max_backlog_age <= 0)
		return;
	OutboxRelayCountBacklog(&backlog, &oldest);
	report_backlog(r, true, backlog, oldest, 0, 0);
}

/*
 * OutboxRelayLoadProgress
 *		Start-up: the database's name and the relay's position, in the
 *		relay's long-lived context.
 */
void
OutboxRelayLoadProgress(Relay *r, Oid dboid)
{
	OutboxRelayBeginTxn("loading progress");
	r->dbname = MemoryContextStrdup(r->cxt, get_database_name(dboid));
	if (!OutboxStoreExtensionPresent())
		exit_without_extension(r);
	OutboxStoreLoadProgress(&r->batch, r->cxt);
	OutboxStoreLoadOrigin(true);
	OutboxRelayLoadHolds(r);
	count_backlog_at_start(r);
	OutboxRelayEndTxn(r);
}

/*
 * OutboxRelayReloadBlocked
 *		Read the list of blocked aggregates again (outbox.poison_policy =
 *		'block').  The caller is in a transaction.
 */
void
OutboxRelayReloadBlocked(Relay *r)
{
	MemoryContextReset(r->blocked_cxt);
	r->blocked = OutboxStoreLoadBlocked(r->blocked_cxt);
	r->blocked_stale = false;
}


/*
 * move_reader
 *		The reader moves past pg, just read (cut: it ended at
 *		outbox.batch_max_bytes); if pg is the last page of its batch, the
 *		next batch starts where this one ends, whatever is acknowledged yet.
 */
static void
move_reader(Relay *r, RelayPage *pg, int limit, bool cut)
{
	OutboxBatch *batch = &r->batch;

	pg->done = (pg->n < limit && !cut) ||
		pg->last_id >= batch->max_id;
	batch->remaining -= pg->n;
	if (!pg->done)
	{
		batch->last_id = pg->last_id;
		return;
	}
	if (batch->prev != NULL)
		pfree(batch->prev);
	batch->prev = batch->cur;
	batch->fresh = false;
	batch->cur = NULL;
	batch->last_id = 0;
	r->batch_open = false;
}

/*
 * OutboxRelayReadPage
 *		Read the next page of the open batch (opening one if none is) into
 *		pg.  The figures of status() follow: the backlog, and the oldest
 *		pending event when pg is to be the page in hand.  Returns false when
 *		there is nothing to read.
 */
bool
OutboxRelayReadPage(Relay *r, RelayPage *pg)
{
	bool		opened = false;
	bool		cut = false;
	/* exactly_once: a page is a Kafka transaction, whose cost is per page */
	int			limit = RELAY_TRANSACTIONAL(r) ? outbox_transaction_events : outbox_batch_size;

	MemoryContextReset(pg->cxt);
	pg->n = 0;
	pg->replay = false;
	pg->drain = NULL;
	pg->rounds = 0;

	OutboxRelayRotate(r);
	OutboxRelayBeginTxn("reading events");
	if (!OutboxStoreExtensionPresent())
		exit_without_extension(r);
	if (r->blocked_stale)
		OutboxRelayReloadBlocked(r);
	if (!r->batch_open)
	{
		/* until an update to 1.8 makes the origin, look once a batch */
		OutboxStoreLoadOrigin(false);
		if (!OutboxStoreOpenBatch(&r->batch, r->cxt))
		{
			OutboxRelayEndTxn(r);
			if (r->in_hand == NULL)
				report_backlog(r, true, 0, 0, 0, 0);
			return false;
		}
		/* every commit the batch's snapshot sees ends before this */
		r->batch_lsn = OutboxRelayWalEnd();
		r->batch_open = true;
		opened = true;
	}
	pg->n = OutboxStoreReadPage(&r->batch, limit, outbox_batch_max_bytes,
								&pg->events, pg->cxt, &cut);
	OutboxRelayEndTxn(r);

	report_backlog(r, opened, r->batch.remaining + pages_pending(r, pg),
				   pg->n > 0 && r->in_hand == NULL ? pg->events[0].created_at : -1,
				   pg->n, 0);
	pg->cur = MemoryContextStrdup(pg->cxt, r->batch.cur);
	pg->standby_lsn = r->batch_lsn;
	pg->last_id = pg->n > 0 ? pg->events[pg->n - 1].id : r->batch.last_id;
	move_reader(r, pg, limit, cut);
	return true;
}

/* the longest in-progress list a pass leaves prev with */
#define PASS_MAX_XIP 1000

/*
 * OutboxRelayPassStarted
 *		Called when no transaction has ended since the last look found
 *		nothing (its snapshot is prev) but the next xid has moved to
 *		next_xid: in
 *		memory, prev's xmax moves to the next xid, and every xid from its
 *		old xmax on joins its in-progress list.  A snapshot's xmax is one
 *		past the latest xid to end, so transactions begun since were at or
 *		past prev's xmax, and the first look after the next end elsewhere
 *		would walk every row they had written by then (a bulk load in a
 *		quiet database: all of them) to find none visible.  prev sees no
 *		more than before: it only lists more transactions as in progress,
 *		each looked up once it is visible in a later snapshot, so nothing is
 *		passed over whatever ends meanwhile.  No transaction is opened.  A
 *		list that would grow past PASS_MAX_XIP (subtransactions have xids of
 *		their own) is left to the next look.
 */
void
OutboxRelayPassStarted(Relay *r, FullTransactionId next_xid)
{
	OutboxBatch *batch = &r->batch;
	uint64		next = U64FromFullTransactionId(next_xid);
	uint64		xmin;
	uint64		xmax;
	char	   *p;
	char	   *xip;
	int			listed = 0;
	StringInfoData buf;

	Assert(!r->batch_open && batch->cur == NULL && batch->prev != NULL && batch->fresh);
	r->batch_seen_next_xid = next_xid;

	/* "xmin:xmax:xip,..." as pg_snapshot's output writes it */
	xmin = strtou64(batch->prev, &p, 10);
	if (*p != ':')
		elog(ERROR, "unexpected snapshot \"%s\"", batch->prev);
	xmax = strtou64(p + 1, &xip, 10);
	if (*xip != ':' || xmax < xmin)
		elog(ERROR, "unexpected snapshot \"%s\"", batch->prev);
	xip++;
	if (*xip != '\0')
	{
		listed = 1;
		for (p = xip; *p; p++)
			listed += (*p == ',');
	}
	if (next <= xmax || next - xmax + listed > PASS_MAX_XIP)
		return;

	initStringInfo(&buf);
	appendStringInfo(&buf, UINT64_FORMAT ":" UINT64_FORMAT ":%s", xmin, next, xip);
	for (uint64 x = xmax; x < next; x++)
		appendStringInfo(&buf, "%s" UINT64_FORMAT, (x == xmax && listed == 0) ? "" : ",", x);
	pfree(batch->prev);
	batch->prev = MemoryContextStrdup(r->cxt, buf.data);
	pfree(buf.data);
	elog(DEBUG1, "outbox relay: %d transactions begun and none ended since the last look: previous snapshot %s",
		 (int) (next - xmax), batch->prev);
}

/*
 * OutboxRelayReadReplays
 *		Read a page of the replay queue into pg; false when it is empty.
 */
bool
OutboxRelayReadReplays(Relay *r, RelayPage *pg)
{
	MemoryContextReset(pg->cxt);
	pg->replay = true;
	pg->drain = NULL;
	pg->rounds = 0;
	OutboxRelayBeginTxn("reading replays");
	pg->n = OutboxStoreReadReplays(outbox_batch_size, &pg->events, pg->cxt);
	OutboxRelayEndTxn(r);
	pg->standby_lsn = OutboxRelayWalEnd();
	return pg->n > 0;
}

/* exactly_once: the page being recorded went out in Kafka transaction n */
static void
record_kafka_txn(Relay *r)
{
	if (r->txn_to_record > 0)
		OutboxStoreSaveKafkaTransaction(r->txn_to_record);
}

/* a settled replay page: finish its queue entries */
static void
record_replays(Relay *r, RelayPage *pg, int delivered)
{
	OutboxRoundReport report;

	/* parked events it releases are read in the next round */
	OutboxRelayBeginTxn("recording replays");
	OutboxStoreFinishReplays(pg->events, pg->n, OutboxDeliveryErrorText);
	record_kafka_txn(r);
	OutboxRelayEndTxn(r);
	r->kafka_txn = Max(r->kafka_txn, r->txn_to_record);
	r->txn_to_record = 0;
	/* read the settled dead letters in a transaction that sees them */
	r->blocked_stale = true;
	OutboxRelayReportInit(&report);
	report.pages = 1;
	OutboxSlotReportRound(r->slot, &report);
	ereport(LOG,
			(errmsg("outbox relay replayed %d of %d queued events", delivered, pg->n)));
}

/*
 * OutboxRelayRecordPage
 *		A settled page: record its quarantined and parked events and the
 *		relay's progress, in one transaction.  Parked events whose head was
 *		replayed or discarded meanwhile join the replay queue, which is
 *		published before the next page.  A replay page finishes its queue
 *		entries instead.
 */
void
OutboxRelayRecordPage(Relay *r, RelayPage *pg)
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
	if (pg->replay)
	{
		record_replays(r, pg, delivered);
		return;
	}

	if (pg->drain != NULL)
	{
		OutboxRelayRecordDrain(r, pg);
		return;
	}

	/* the invariant of relay_hold.c: held rows commit with the progress */
	OutboxRelayBeginTxn("recording progress");
	if (has_dead &&
		OutboxStoreRecordDeadLetters(pg->events, pg->n, OutboxDeliveryErrorText) > 0)
		r->replays_due = true;
	(void) OutboxStoreHoldEvents(pg->events, pg->n, r->held_counted);
	OutboxStoreSavePage(pg->cur, pg->last_id, delivered, pg->done);
	record_kafka_txn(r);
	OutboxRelayEndTxn(r);
	r->kafka_txn = Max(r->kafka_txn, r->txn_to_record);
	r->txn_to_record = 0;
	OutboxRelayCountHeld(r, pg);
	report_backlog(r, false, r->batch.remaining + pages_pending(r, pg),
				   r->ahead != NULL && r->ahead->n > 0 ? r->ahead->events[0].created_at : 0,
				   0, 1);
}

/*
 * OutboxRelayAdoptRestored
 *		Publish what a restore brought in and had not delivered, once its
 *		events and its progress row are both in (OutboxStoreAdoptRestored).
 *		Restored events whose progress row has not come after
 *		RELAY_RESTORE_WAIT_MS (a dump taken without it) are all published:
 *		their delivery is unknown, so at least once wins.
 */
void
OutboxRelayAdoptRestored(Relay *r)
{
	TimestampTz now = GetCurrentTimestamp();
	bool		force;
	int64		published;

	force = r->restore_waiting_since != 0 &&
		TimestampDifferenceExceeds(r->restore_waiting_since, now, RELAY_RESTORE_WAIT_MS);
	OutboxRelayBeginTxn("adopting restored events");
	/* a restore brings its origin too */
	OutboxStoreLoadOrigin(true);
	published = OutboxStoreAdoptRestored(force);
	OutboxRelayEndTxn(r);
	if (published == -2)
	{
		if (r->restore_waiting_since == 0)
			r->restore_waiting_since = now;
		return;
	}
	r->restore_waiting_since = 0;
	if (published >= 0)
		ereport(LOG,
				(errmsg("outbox relay for database \"%s\" adopted restored events",
						r->dbname),
				 errdetail("%lld events not delivered before the dump will be published; "
						   "the events delivered before it are not sent again.",
						   (long long) published)));
}

/*
 * OutboxRelayCleanup
 *		When idle, turn the log's generations (relay_rotation.c) or, in a
 *		database before 1.8, delete published events past outbox.retention;
 *		and delete inbox rows past outbox.inbox_retention; a bounded batch
 *		of each at a time, a full batch meaning more may follow at the next
 *		idle moment.
 */
void
OutboxRelayCleanup(Relay *r)
{
	TimestampTz now = GetCurrentTimestamp();
	int64		deleted;
	int64		forgotten;
	TimestampTz oldest = DT_NOEND;
	bool		look;

	OutboxRelayRotate(r);
	OutboxRelayFetchSchemas(r);
	if (now < r->next_cleanup)
		return;

	/*
	 * The events' probe walks the id index from its start, past the rows
	 * of every transaction still open there (a bulk load: all of its rows,
	 * each one a heap visit): it is left out while its last answer says
	 * nothing can be due, for up to an hour (rows made older meanwhile, by
	 * a restore or by hand, are found then).
	 */
	look = r->log_rotates < 0 && (r->events_oldest == 0 ||
		now >= TimestampTzPlusMilliseconds(r->events_oldest, (int64) outbox_retention * 1000) ||
		now >= TimestampTzPlusMilliseconds(r->events_looked_at, RELAY_EVENTS_LOOK_MAX_MS));
	/* one transaction for both: an idle relay costs no more than before */
	OutboxRelayBeginTxn("deleting events and inbox rows past retention");
	deleted = look ? OutboxStoreCleanup(RELAY_CLEANUP_BATCH, &oldest) : 0;
	forgotten = OutboxStoreInboxCleanup(RELAY_CLEANUP_BATCH);
	OutboxRelayEndTxn(r);
	if (look)
	{
		r->events_oldest = deleted > 0 ? 0 : Min(oldest, now);
		r->events_looked_at = now;
	}
	r->next_cleanup =
		deleted >= RELAY_CLEANUP_BATCH || forgotten >= RELAY_CLEANUP_BATCH ? now :
		TimestampTzPlusMilliseconds(now, RELAY_CLEANUP_INTERVAL_MS);
	if (deleted > 0)
		ereport(DEBUG1,
				(errmsg_internal("outbox relay deleted " INT64_FORMAT " events past retention", deleted)));
	if (forgotten > 0)
		ereport(DEBUG1,
				(errmsg_internal("outbox relay deleted " INT64_FORMAT " inbox rows past retention", forgotten)));
}
