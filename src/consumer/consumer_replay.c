/*-------------------------------------------------------------------------
 *
 * consumer/consumer_replay.c
 *		Dead letters applied again by the subscription worker: those
 *		queued by outbox.inbox_replay(), and the parked ones whose key has
 *		no dead message left.
 *
 * Invariants:
 *	- Replays keep their key's order: rows are taken in id order, and a
 *	  row waits while an older row of its key is dead.  A replay that
 *	  fails goes back to dead and becomes the head of its key; the later
 *	  rows of its key in the same pass are parked behind it.
 *	- A replay is applied as a batch's message is (consumer_apply.c): in
 *	  a subtransaction of its own, deduplicated, with the handler checked
 *	  first, in the transaction that deletes its row.
 *	- The rows are locked FOR UPDATE: inbox_discard() and another worker
 *	  of the group wait for the pass.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "utils/builtins.h"

#include "consumer/consumer_worker.h"
#include "base/base.h"
#include "shmem/shmem.h"

#define REPLAY_PAGE			500

/* row id parked behind head, the row of its key that failed in this pass */
static void
park_replay(Datum id, int64 head)
{
	Oid			types[2] = {INT8OID, INT8OID};
	Datum		args[2];

	args[0] = id;
	args[1] = Int64GetDatum(head);
	OutboxSpiExec("UPDATE outbox.inbox_dead_letters SET state = 'parked', blocked_by = $2"
				  " WHERE id OPERATOR(pg_catalog.=) $1",
				  2, types, args, NULL, false, 0, SPI_OK_UPDATE, "parking a replay");
}

/* row id back to dead after another failure f: attempts is its new count */
static void
fail_replay(Datum id, int attempts, const Failure *f)
{
	Oid			types[5] = {INT8OID, INT4OID, INT8OID, TEXTOID, TEXTOID};
	Datum		args[5];
	char		nulls[5] = {' ', ' ', 'n', ' ', ' '};

	args[0] = id;
	args[1] = Int32GetDatum(attempts);
	args[2] = (Datum) 0;
	args[3] = CStringGetTextDatum(f->message);
	args[4] = CStringGetTextDatum(f->sqlstate);
	OutboxSpiExec("UPDATE outbox.inbox_dead_letters SET state = 'dead', blocked_by = $3,"
				  " attempts = $2, last_error = $4, last_sqlstate = $5,"
				  " last_failed_at = pg_catalog.now()"
				  " WHERE id OPERATOR(pg_catalog.=) $1",
				  5, types, args, nulls, false, 0, SPI_OK_UPDATE, "recording a failed replay");
}

/* row id applied: it goes */
static void
delete_replayed(Datum id)
{
	Oid			types[1] = {INT8OID};

	OutboxSpiExec("DELETE FROM outbox.inbox_dead_letters WHERE id OPERATOR(pg_catalog.=) $1",
				  1, types, &id, NULL, false, 0, SPI_OK_DELETE, "deleting a replayed dead letter");
}

/*
 * replay_row
 *		Apply row i of the replays (id, topic, key, message, attempts), or
 *		park it behind its key's row that failed in this pass; a failure
 *		sends it back to dead and makes it the head of its key.
 */
static void
replay_row(Worker *w, SPITupleTable *rows, uint64 i, HTAB *failed_keys,
		   OutboxInboxTally *tally)
{
	HeapTuple	t = rows->vals[i];
	bool		isnull;
	bool		key_null;
	int64		id = DatumGetInt64(SPI_getbinval(t, rows->tupdesc, 1, &isnull));
	char	   *topic = TextDatumGetCString(SPI_getbinval(t, rows->tupdesc, 2, &isnull));
	Datum		keyd = SPI_getbinval(t, rows->tupdesc, 3, &key_null);
	int			attempts = DatumGetInt32(SPI_getbinval(t, rows->tupdesc, 5, &isnull));
	Datum		message = SPI_datumTransfer(SPI_getbinval(t, rows->tupdesc, 4, &isnull),
											false, -1);
	char		tag[OUTBOX_PARKED_TAG_LEN];
	ParkedKey  *fk = NULL;
	bool		applied;
	Failure		f;

	if (!key_null)
	{
		OutboxSubscriberParkedTag(topic, TextDatumGetCString(keyd), tag);
		fk = (ParkedKey *) hash_search(failed_keys, tag, HASH_FIND, NULL);
	}
	if (fk != NULL)
	{
		park_replay(Int64GetDatum(id), fk->head);
		return;
	}
	if (OutboxSubscriberTryApply(w, NULL, message, &applied, &f))
	{
		if (applied)
			tally->processed++;
		else
			tally->deduplicated++;
		delete_replayed(Int64GetDatum(id));
		return;
	}
	tally->failed++;
	OutboxInboxSetError(w->slot, f.message);
	fail_replay(Int64GetDatum(id), attempts + 1, &f);
	if (!key_null)
	{
		bool		found;

		fk = (ParkedKey *) hash_search(failed_keys, tag, HASH_ENTER, &found);
		fk->head = id;
	}
}

/*
 * read_replays
 *		Lock and read (inside SPI) the next page of rows to apply, in id
 *		order: the group's dead letters queued for a replay with no older
 *		dead row of their key, and the parked ones whose key has no dead
 *		row left.  They are in SPI_tuptable; returns how many.
 */
static uint64
read_replays(Worker *w)
{

	OutboxSpiExecText("SELECT d.id, d.topic, d.key, d.message, d.attempts FROM outbox.inbox_dead_letters d"
					  " WHERE d.consumer_group OPERATOR(pg_catalog.=) $1"
					  " AND ((d.state OPERATOR(pg_catalog.=) 'replay' AND NOT EXISTS ("
					  "   SELECT 1 FROM outbox.inbox_dead_letters e"
					  "    WHERE e.consumer_group OPERATOR(pg_catalog.=) d.consumer_group"
					  "      AND e.topic OPERATOR(pg_catalog.=) d.topic"
					  "      AND e.key OPERATOR(pg_catalog.=) d.key"
					  "      AND e.state OPERATOR(pg_catalog.=) 'dead'"
					  "      AND e.id OPERATOR(pg_catalog.<) d.id))"
					  "  OR (d.state OPERATOR(pg_catalog.=) 'parked' AND NOT EXISTS ("
					  "   SELECT 1 FROM outbox.inbox_dead_letters h"
					  "    WHERE h.consumer_group OPERATOR(pg_catalog.=) d.consumer_group"
					  "      AND h.topic OPERATOR(pg_catalog.=) d.topic"
					  "      AND h.key OPERATOR(pg_catalog.=) d.key"
					  "      AND h.state OPERATOR(pg_catalog.=) 'dead')))"
					  " ORDER BY d.id LIMIT " CppAsString2(REPLAY_PAGE) " FOR UPDATE",
					  w->sub.group_id, false, 0, SPI_OK_SELECT, "reading the replays");
	return SPI_processed;
}

/*
 * OutboxSubscriberRunReplays
 *		Apply a page of replays (read_replays) in a transaction of its own,
 *		the handler checked as for a batch before the first row; then the
 *		parked keys are read again.  True when the page was full: more may
 *		wait.
 */
bool
OutboxSubscriberRunReplays(Worker *w)
{
	HTAB	   *failed_keys = OutboxSubscriberParkedTable("outbox replay failures",
														  CurrentMemoryContext);
	OutboxInboxTally tally;
	uint64		n;
	uint64		i;

	memset(&tally, 0, sizeof(tally));
	OutboxSubscriberBeginTxn();
	n = read_replays(w);
	if (n > 0)
	{
		SPITupleTable *rows = SPI_tuptable;

		OutboxSubscriberCheckHandler(w);
		for (i = 0; i < n; i++)
			replay_row(w, rows, i, failed_keys, &tally);
	}
	OutboxSubscriberLoadParked(w);
	OutboxSubscriberEndTxn();
	OutboxInboxReport(w->slot, &tally, NULL, -1);
	hash_destroy(failed_keys);
	return n == REPLAY_PAGE;
}
