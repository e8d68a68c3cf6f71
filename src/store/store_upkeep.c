/*-------------------------------------------------------------------------
 *
 * store/store_upkeep.c
 *		The relay's SQL that keeps the log: deleting published events past
 *		the retention and inbox rows past the inbox's, and adopting the
 *		events a restore brought in.
 *
 * Invariants:
 *	- Called inside a transaction the relay opened; never starts, commits
 *	  or aborts one.  Each function connects to SPI and disconnects.
 *	- Events are deleted only through outbox.cleanup(), which never takes
 *	  one that is undelivered, held by a dead letter, queued for replay or
 *	  restored and not yet judged.
 *	- A restored event's txid is written once: re-stamped with the adopting
 *	  transaction's id (so the next batch publishes it) when it has no dead
 *	  letter and the restored progress does not count it delivered (with
 *	  force, when no restored progress came at all); otherwise left as the
 *	  restore stamped it, in every snapshot: delivered.  Then
 *	  outbox.restored_events and the restored progress rows are deleted;
 *	  the relay's own progress row ('default') is never touched here.
 *	- Inbox rows are deleted only through outbox.inbox_cleanup().
 *	- Works on a 1.0 database too, which has no outbox.restored_events,
 *	  and on a 1.2 one, which has no outbox.inbox.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "utils/timestamp.h"

#include "base/base.h"
#include "store/store.h"
#include "store/store_sql.h"

/*
 * Whether restored event e (original txid r.txid) was delivered according
 * to restored progress row f: in its delivered snapshot, or in the
 * acknowledged part of its batch.
 */
#define DELIVERED_BY(f) \
	"(coalesce(pg_catalog.pg_visible_in_snapshot(r.txid, " f ".prev_snapshot), false)" \
	" OR coalesce(e.id OPERATOR(pg_catalog.<=) " f ".batch_last_id" \
	"  AND pg_catalog.pg_visible_in_snapshot(r.txid, " f ".batch_snapshot), false))"

/*
 * OutboxStoreAdoptRestored
 *		Publish what a restore brought in and had not delivered.
 *
 * A restore's event rows arrive re-stamped out of every batch, their
 * original txids in outbox.restored_events, and its progress row under a
 * name other than 'default' (see outbox--1.0--1.1.sql).  When both are in, each
 * restored event not delivered according to the restored progress (or to
 * any of them, if several) and not a dead letter gets the current
 * transaction's id, so the batch after this commit publishes it, in id
 * order; the rest stay delivered.  Then both go.  With force, events
 * without any restored progress row (a dump taken without it) are all
 * published.  Runs in the caller's transaction, which holds a lock on the
 * log that waits out a restore's COPY still in progress.  Returns how many
 * events were re-stamped, -1 when there is nothing to adopt, -2 when
 * restored events wait for their progress row.
 */
int64
OutboxStoreAdoptRestored(bool force)
{
	HeapTuple	tup;
	bool		isnull;
	bool		have_events;
	bool		have_progress;
	int64		published;

	SPI_connect();
	tup = OutboxStoreRow("SELECT pg_catalog.to_regclass('outbox.restored_events') IS NOT NULL",
						 "look for restored events");
	if (!DatumGetBool(SPI_getbinval(tup, SPI_tuptable->tupdesc, 1, &isnull)))
	{
		/* a 1.0 database on this library, before ALTER EXTENSION UPDATE */
		SPI_finish();
		return -1;
	}
	tup = OutboxStoreRow("SELECT EXISTS (SELECT 1 FROM outbox.restored_events),"
						 " EXISTS (SELECT 1 FROM outbox.relay_progress p"
						 "  WHERE p.relay OPERATOR(pg_catalog.<>) 'default')",
						 "look for restored events");
	have_events = DatumGetBool(SPI_getbinval(tup, SPI_tuptable->tupdesc, 1, &isnull));
	have_progress = DatumGetBool(SPI_getbinval(tup, SPI_tuptable->tupdesc, 2, &isnull));
	if (!have_events || (!have_progress && !force))
	{
		SPI_finish();
		return have_events ? -2 : -1;
	}

	/* a COPY still loading events or dead letters finishes first */
	OutboxStoreRun("LOCK TABLE outbox.events, outbox.dead_letters, outbox.relay_progress"
				   " IN SHARE MODE", false, 0, SPI_OK_UTILITY, "lock the log");
	OutboxStoreRun("UPDATE outbox.events e SET txid = pg_catalog.pg_current_xact_id()"
				   " FROM outbox.restored_events r"
				   " WHERE r.id OPERATOR(pg_catalog.=) e.id"
				   " AND NOT EXISTS (SELECT 1 FROM outbox.dead_letters d"
				   "  WHERE d.event_pk OPERATOR(pg_catalog.=) e.id)"
				   " AND (NOT EXISTS (SELECT 1 FROM outbox.relay_progress f"
				   "   WHERE f.relay OPERATOR(pg_catalog.<>) 'default')"
				   "  OR EXISTS (SELECT 1 FROM outbox.relay_progress f"
				   "   WHERE f.relay OPERATOR(pg_catalog.<>) 'default'"
				   "   AND NOT " DELIVERED_BY("f") "))",
				   false, 0, SPI_OK_UPDATE, "publish restored events");
	published = (int64) SPI_processed;
	OutboxStoreRun("DELETE FROM outbox.restored_events",
				   false, 0, SPI_OK_DELETE, "forget restored events");
	OutboxStoreRun("DELETE FROM outbox.relay_progress p"
				   " WHERE p.relay OPERATOR(pg_catalog.<>) 'default'",
				   false, 0, SPI_OK_DELETE, "drop restored progress");
	SPI_finish();
	return published;
}

/*
 * cleanup_if_due
 *		Inside SPI: run probe_sql, which returns from one index probe the
 *		time of its oldest row and, with $1 the retention in seconds,
 *		whether that is past it; only then run run_sql, with $1 = max, which
 *		returns how many rows it deleted.  An idle relay with nothing to
 *		delete so runs no cleanup query, only the probe.  Into *oldest (when
 *		not NULL) the oldest row's time, or DT_NOEND when the probe saw none.
 */
static int64
cleanup_if_due(const char *probe_sql, int retention, const char *run_sql,
			   int max, const char *what, TimestampTz *oldest)
{
	Datum		values[1];
	Oid			types[1] = {INT4OID};
	bool		isnull;
	int			rc;

	values[0] = Int32GetDatum(retention);
	rc = SPI_execute_with_args(probe_sql, 1, types, values, NULL, true, 1);
	if (rc != SPI_OK_SELECT)
		elog(ERROR, "could not look for expired %s: %s", what, SPI_result_code_string(rc));
	if (oldest != NULL)
		*oldest = SPI_processed == 0 ? DT_NOEND :
			DatumGetTimestampTz(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
	if (SPI_processed == 0 ||
		!DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2, &isnull)))
		return 0;
	values[0] = Int32GetDatum(max);
	rc = SPI_execute_with_args(run_sql, 1, types, values, NULL, false, 0);
	if (rc != SPI_OK_SELECT)
		elog(ERROR, "could not clean up %s: %s", what, SPI_result_code_string(rc));
	if (SPI_processed != 1)
		return 0;
	return DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
}

/*
 * OutboxStoreCleanup
 *		Delete up to max_events published events older than the retention;
 *		returns how many went.  Into *oldest the creation time of the oldest
 *		event the probe saw, DT_NOEND when it saw none: until that is past
 *		the retention there is nothing to delete but events of transactions
 *		still open now.
 */
int64
OutboxStoreCleanup(int max_events, TimestampTz *oldest)
{
	int64		deleted;

	SPI_connect();

	/*
	 * The oldest event by id is about the oldest by age: when it is within
	 * the retention there is nothing to delete, and one index probe saves
	 * cleanup() a scan of the whole log.
	 */
	deleted = cleanup_if_due("SELECT e.created_at, e.created_at OPERATOR(pg_catalog.<)"
							 " (pg_catalog.now() OPERATOR(pg_catalog.-) pg_catalog.make_interval(secs => $1))"
							 " FROM outbox.events e ORDER BY e.id LIMIT 1",
							 outbox_retention,
							 "SELECT events FROM outbox.cleanup(false, $1)",
							 max_events, "events", oldest);
	SPI_finish();
	return deleted;
}

/*
 * OutboxStoreInboxCleanup
 *		Delete up to max_rows inbox rows older than outbox.inbox_retention;
 *		returns how many went.
 */
int64
OutboxStoreInboxCleanup(int max_rows)
{
	HeapTuple	tup;
	bool		isnull;
	int64		deleted = 0;

	SPI_connect();
	tup = OutboxStoreRow("SELECT pg_catalog.to_regclass('outbox.inbox') IS NOT NULL",
						 "look for the inbox");
	/* a database before 1.3 on this library has no inbox */
	if (DatumGetBool(SPI_getbinval(tup, SPI_tuptable->tupdesc, 1, &isnull)))
		deleted = cleanup_if_due("SELECT i.consumed_at, i.consumed_at OPERATOR(pg_catalog.<)"
								 " (pg_catalog.now() OPERATOR(pg_catalog.-) pg_catalog.make_interval(secs => $1))"
								 " FROM outbox.inbox i ORDER BY i.consumed_at LIMIT 1",
								 outbox_inbox_retention,
								 "SELECT outbox.inbox_cleanup($1)",
								 max_rows, "inbox rows", NULL);
	SPI_finish();
	return deleted;
}
