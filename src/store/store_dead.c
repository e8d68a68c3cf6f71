/*-------------------------------------------------------------------------
 *
 * store/store_dead.c
 *		The relay's SQL for dead letters and the replay queue: recording
 *		the quarantined and parked events of a page, the aggregates they
 *		hold back, and settling a replay page.
 *
 * Invariants:
 *	- Called inside a transaction the relay opened (the one that saves a
 *	  page or settles a replay page; the blocked list is read in the read
 *	  transaction, replays are finished in their own); never starts,
 *	  commits or aborts one.  Each function connects
 *	  to SPI and disconnects.
 *	- Event rows are only read.  Writes: outbox.dead_letters rows (inserted
 *	  or moved between states, each with a copy of its event's envelope)
 *	  and outbox.replay_queue rows (queued and dequeued).
 *	- An event is recorded as parked only if its head's dead letter, read
 *	  and locked in the recording transaction, still holds it back
 *	  (quarantined or parked); otherwise it joins the replay queue.  So a
 *	  replay() or discard() of the head, however it races with the relay,
 *	  leaves no event parked behind a head that is gone.
 *	- The replay queue is read in position order; under poison policy
 *	  'block' nothing of an aggregate leaves the queue ahead of an event of
 *	  it that was refused again.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "utils/builtins.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "base/base.h"
#include "kafka/kafka.h"
#include "store/store.h"
#include "store/store_sql.h"

/* the columns a recorded dead letter takes from its event, and the rest */
#define DEAD_LETTER_NARGS 8
#define DEAD_LETTER_SQL \
	"INSERT INTO outbox.dead_letters AS d (event_id, event_pk, aggregate_type," \
	" aggregate_id, seq, event_type, topic, state, blocked_by, error_class," \
	" last_error, attempts, first_failed_at, last_failed_at, envelope)" \
	" SELECT e.event_id, e.id, e.aggregate_type, e.aggregate_id, e.seq," \
	" e.event_type, e.topic, $2, $3::uuid, $4, $5, $6, $7, $8, pg_catalog.to_jsonb(e)" \
	" FROM outbox.events e WHERE e.id OPERATOR(pg_catalog.=) $1" \
	" ON CONFLICT (event_id) DO UPDATE SET state = excluded.state," \
	" event_pk = excluded.event_pk," \
	" blocked_by = excluded.blocked_by," \
	" error_class = COALESCE(excluded.error_class, d.error_class)," \
	" last_error = COALESCE(excluded.last_error, d.last_error)," \
	" attempts = d.attempts OPERATOR(pg_catalog.+) excluded.attempts," \
	" last_failed_at = COALESCE(excluded.last_failed_at, d.last_failed_at)," \
	" quarantined_at = pg_catalog.now(), resolved_at = NULL"

/* $1: queue position; $2: event id (pk); $3: its event_id */
#define REPLAY_ARG_TYPES {INT8OID, INT8OID, TEXTOID}

/*
 * Under poison policy 'block', what of the aggregate of a refused replay
 * ($2) is queued behind it ($1) leaves the queue and is parked behind it
 * ($3).
 */
#define PARK_BEHIND_REPLAY_SQL \
	"WITH gone AS (DELETE FROM outbox.replay_queue q USING outbox.events e" \
	" WHERE e.id OPERATOR(pg_catalog.=) q.event_pk" \
	" AND q.position OPERATOR(pg_catalog.>) $1" \
	" AND (e.aggregate_type, e.aggregate_id) OPERATOR(pg_catalog.=)" \
	" (SELECT aggregate_type, aggregate_id" \
	"  FROM outbox.events WHERE id OPERATOR(pg_catalog.=) $2)" \
	" RETURNING q.event_pk)" \
	" INSERT INTO outbox.dead_letters AS d (event_id, event_pk, aggregate_type," \
	" aggregate_id, seq, event_type, topic, state, blocked_by, envelope)" \
	" SELECT e.event_id, e.id, e.aggregate_type, e.aggregate_id, e.seq," \
	" e.event_type, e.topic, 'parked', $3::uuid, pg_catalog.to_jsonb(e)" \
	" FROM gone JOIN outbox.events e ON e.id OPERATOR(pg_catalog.=) gone.event_pk" \
	" ON CONFLICT (event_id) DO UPDATE SET state = 'parked', event_pk = excluded.event_pk," \
	" blocked_by = excluded.blocked_by, resolved_at = NULL"

/* a delivered replay leaves the queue; a dead letter among them is resolved */
#define REPLAY_DELIVERED_SQL \
	"WITH gone AS (DELETE FROM outbox.replay_queue" \
	" WHERE position OPERATOR(pg_catalog.=) $1 RETURNING event_pk, dead_letter)" \
	" UPDATE outbox.dead_letters d SET state = 'replayed', resolved_at = pg_catalog.now()" \
	" FROM gone WHERE gone.dead_letter AND d.event_pk OPERATOR(pg_catalog.=) gone.event_pk" \
	" AND d.state IN ('replaying', 'quarantined')"

/*
 * head_holds
 *		Whether the head an event was parked behind still holds it back:
 *		its dead letter is quarantined (or parked itself).  Answered from the
 *		database, not from the relay's blocked list, which may predate a
 *		replay() or discard() that committed while the page was in flight.
 *		The head's row stays locked until the caller's transaction ends, so
 *		a replay() or discard() of it either committed before (and is seen
 *		here) or waits for this transaction, and then finds the parked row.
 *		A head without a dead letter holds nothing back.
 */
static bool
head_holds(const char *head)
{
	static SPIPlanPtr plan = NULL;
	Datum		values[1];
	bool		isnull;
	char	   *state;
	bool		holds;

	if (plan == NULL)
	{
		Oid			types[1] = {TEXTOID};

		plan = OutboxSpiPrepare("SELECT d.state FROM outbox.dead_letters d"
								  " WHERE d.event_id OPERATOR(pg_catalog.=) $1::uuid FOR SHARE",
								  1, types, "head lookup");
	}
	values[0] = CStringGetTextDatum(head);
	if (SPI_execute_plan(plan, values, NULL, false, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not look up dead letter %s", head);
	if (SPI_processed == 0)
		return false;
	state = TextDatumGetCString(SPI_getbinval(SPI_tuptable->vals[0],
											  SPI_tuptable->tupdesc, 1, &isnull));
	holds = strcmp(state, "quarantined") == 0 || strcmp(state, "parked") == 0;
	pfree(state);
	return holds;
}

/*
 * record_dead_letter
 *		Insert or update ev's dead letter in state, with its failure record
 *		when it has one (its error worded by wording).  Inside SPI.
 */
static void
record_dead_letter(const OutboxEvent *ev, const char *state,
				   OutboxErrorWording wording)
{
	static SPIPlanPtr plan = NULL;
	Datum		values[DEAD_LETTER_NARGS];
	char		nulls[DEAD_LETTER_NARGS] = {' ', ' ', ' ', ' ', ' ', ' ', ' ', ' '};
	const char *cls = ev->last_class == OUTBOX_ERROR_NONE ? NULL :
		OutboxErrorClassName(ev->last_class);

	if (plan == NULL)
	{
		Oid			types[DEAD_LETTER_NARGS] = {INT8OID, TEXTOID, TEXTOID, TEXTOID,
		TEXTOID, INT4OID, TIMESTAMPTZOID, TIMESTAMPTZOID};

		plan = OutboxSpiPrepare(DEAD_LETTER_SQL, DEAD_LETTER_NARGS, types,
								  "dead letter insert");
	}
	values[0] = Int64GetDatum(ev->id);
	values[1] = CStringGetTextDatum(state);
	if (ev->blocked_by != NULL)
		values[2] = CStringGetTextDatum(ev->blocked_by);
	else
		nulls[2] = 'n';
	if (cls != NULL && ev->attempts > 0)
	{
		values[3] = CStringGetTextDatum(cls);
		values[4] = CStringGetTextDatum(ev->error_text ? ev->error_text :
										wording(ev->last_err, ev->last_err_local));
		values[6] = TimestampTzGetDatum(ev->first_failed_at);
		values[7] = TimestampTzGetDatum(ev->last_failed_at);
	}
	else
		nulls[3] = nulls[4] = nulls[6] = nulls[7] = 'n';
	values[5] = Int32GetDatum(ev->attempts);

	if (SPI_execute_plan(plan, values, nulls, false, 0) != SPI_OK_INSERT)
		elog(ERROR, "could not record dead letter for event %s", ev->event_id);
}

/*
 * queue_dead_letter
 *		Put ev, whose dead letter is replaying, at the end of the replay
 *		queue.  Inside SPI.
 */
static void
queue_dead_letter(const OutboxEvent *ev)
{
	static SPIPlanPtr plan = NULL;
	Datum		values[1];

	if (plan == NULL)
	{
		Oid			types[1] = {INT8OID};

		plan = OutboxSpiPrepare("INSERT INTO outbox.replay_queue (event_pk, dead_letter)"
								  " VALUES ($1, true)", 1, types, "replay queue insert");
	}
	values[0] = Int64GetDatum(ev->id);
	if (SPI_execute_plan(plan, values, NULL, false, 0) != SPI_OK_INSERT)
		elog(ERROR, "could not queue parked event %s", ev->event_id);
}

/*
 * OutboxStoreRecordDeadLetters
 *		Record the quarantined and parked events of a page (with a copy of
 *		each envelope).  A parked event whose head no longer holds it back
 *		(replayed, discarded, or queued for replay since the page was sent;
 *		see head_holds) joins the replay queue instead, behind its head.
 *		Runs in the transaction that saves the page.  Events come in id
 *		order, so a head quarantined in the same page is recorded before
 *		what parks behind it.  A failure record's error is worded by
 *		wording.  Returns how many were queued.
 */
int
OutboxStoreRecordDeadLetters(OutboxEvent *events, int n, OutboxErrorWording wording)
{
	int			i;
	int			queued = 0;
	const char *last_head = NULL;	/* the head last asked about */
	bool		last_holds = false;

	SPI_connect();
	for (i = 0; i < n; i++)
	{
		OutboxEvent *ev = &events[i];
		bool		requeue;

		/* exactly_once: written before the page's Kafka transaction */
		if (ev->dead_recorded)
			continue;
		if (ev->disposition == OUTBOX_EVENT_QUARANTINED)
		{
			record_dead_letter(ev, "quarantined", wording);
			continue;
		}
		if (ev->disposition != OUTBOX_EVENT_PARKED)
			continue;
		if (ev->blocked_by != NULL &&
			(last_head == NULL || strcmp(last_head, ev->blocked_by) != 0))
		{
			last_head = ev->blocked_by;
			last_holds = head_holds(last_head);
		}
		requeue = ev->blocked_by == NULL || !last_holds;
		record_dead_letter(ev, requeue ? "replaying" : "parked", wording);
		if (requeue)
		{
			queue_dead_letter(ev);
			queued++;
		}
	}
	SPI_finish();
	return queued;
}

/*
 * OutboxStoreLoadBlocked
 *		The aggregates whose events must wait: those with a quarantined,
 *		parked or replaying dead letter.  The head is the earliest.  The
 *		list and its strings are allocated in cxt.
 */
List *
OutboxStoreLoadBlocked(MemoryContext cxt)
{
	List	   *result = NIL;
	uint64		i;

	SPI_connect();
	OutboxStoreRun("SELECT DISTINCT ON (aggregate_type, aggregate_id)"
				   " aggregate_type, aggregate_id,"
				   " COALESCE(blocked_by, event_id)::text"
				   " FROM outbox.dead_letters"
				   " WHERE state IN ('quarantined', 'parked', 'replaying')"
				   " ORDER BY aggregate_type, aggregate_id, event_pk",
				   true, 0, SPI_OK_SELECT, "read dead letters");
	for (i = 0; i < SPI_processed; i++)
	{
		HeapTuple	tup = SPI_tuptable->vals[i];
		TupleDesc	desc = SPI_tuptable->tupdesc;
		MemoryContext old = MemoryContextSwitchTo(cxt);
		OutboxBlocked *b = palloc(sizeof(OutboxBlocked));
		bool		isnull;

		/* none of the three is NULL */
		b->aggregate_type = TextDatumGetCString(SPI_getbinval(tup, desc, 1, &isnull));
		b->aggregate_id = TextDatumGetCString(SPI_getbinval(tup, desc, 2, &isnull));
		b->head = TextDatumGetCString(SPI_getbinval(tup, desc, 3, &isnull));
		result = lappend(result, b);
		MemoryContextSwitchTo(old);
	}
	SPI_finish();
	return result;
}

/*
 * release_parked
 *		Queue for replay, in id order, every parked event whose head no
 *		longer holds it back (replayed, discarded, queued, or gone): such an
 *		event would otherwise wait for a replay() or discard() that already
 *		happened.  outbox.replay() and outbox.discard() do the same.
 */
static void
release_parked(void)
{
	SPI_connect();
	OutboxStoreRun("WITH released AS (UPDATE outbox.dead_letters d SET state = 'replaying'"
				   " WHERE d.state OPERATOR(pg_catalog.=) 'parked'"
				   " AND NOT EXISTS (SELECT 1 FROM outbox.dead_letters h"
				   "  WHERE h.event_id OPERATOR(pg_catalog.=) d.blocked_by"
				   "  AND h.state IN ('quarantined', 'parked'))"
				   " RETURNING d.event_pk)"
				   " INSERT INTO outbox.replay_queue (event_pk, dead_letter)"
				   " SELECT r.event_pk, true FROM released r ORDER BY r.event_pk",
				   false, 0, SPI_OK_INSERT, "release parked events");
	SPI_finish();
}

/*
 * settle_replay
 *		One event of a replay page: delivered, it leaves the queue (a dead
 *		letter is resolved); refused again, it leaves the queue and, under
 *		poison policy 'block', takes with it what of its aggregate is queued
 *		behind it, parked behind it.  Any other disposition leaves it
 *		queued.  Inside SPI.
 */
static void
settle_replay(const OutboxEvent *ev)
{
	Datum		values[3];
	Oid			types[3] = REPLAY_ARG_TYPES;
	int			rc;

	values[0] = Int64GetDatum(ev->queue_position);
	values[1] = Int64GetDatum(ev->id);
	if (ev->disposition == OUTBOX_EVENT_DELIVERED)
	{
		rc = SPI_execute_with_args(REPLAY_DELIVERED_SQL,
								   2, types, values, NULL, false, 0);
		if (rc != SPI_OK_UPDATE)
			elog(ERROR, "could not settle replay: %s", SPI_result_code_string(rc));
		return;
	}
	if (ev->disposition != OUTBOX_EVENT_QUARANTINED)
		return;
	if (outbox_poison_policy == OUTBOX_POISON_BLOCK)
	{
		values[2] = CStringGetTextDatum(ev->event_id);
		rc = SPI_execute_with_args(PARK_BEHIND_REPLAY_SQL,
								   3, types, values, NULL, false, 0);
		if (rc != SPI_OK_INSERT)
			elog(ERROR, "could not park behind a replay: %s", SPI_result_code_string(rc));
	}
	rc = SPI_execute_with_args("DELETE FROM outbox.replay_queue WHERE position OPERATOR(pg_catalog.=) $1",
							   1, types, values, NULL, false, 0);
	if (rc != SPI_OK_DELETE)
		elog(ERROR, "could not dequeue a replay: %s", SPI_result_code_string(rc));
}

/*
 * OutboxStoreFinishReplays
 *		A replay page is settled: delivered events leave the queue (dead
 *		letters among them are resolved).  An event refused again is
 *		quarantined again and, with outbox.poison_policy = 'block', every
 *		event of its aggregate queued behind it (released dead letters and
 *		replay(since, until) rows alike, including those parked in this
 *		page) leaves the queue and is parked behind it, so that nothing of
 *		the aggregate overtakes it.  Last, parked events whose head no
 *		longer holds them back join the queue (release_parked).  wording:
 *		as for OutboxStoreRecordDeadLetters.
 */
void
OutboxStoreFinishReplays(OutboxEvent *events, int n, OutboxErrorWording wording)
{
	int			i;

	SPI_connect();
	for (i = 0; i < n; i++)
		if (!events[i].dead_recorded)
			settle_replay(&events[i]);
	SPI_finish();
	/* the quarantined and parked ones are (re)recorded the usual way */
	(void) OutboxStoreRecordDeadLetters(events, n, wording);
	release_parked();
}

/*
 * OutboxStoreLoadUnsettledDeadLetters
 *		exactly_once, at start: the ids of events dead-lettered before the
 *		Kafka transaction of their page committed, whose page the progress
 *		row has not passed (the relay stopped in between).  Their page,
 *		read again, must not send them.  Ascending, in cxt; how many.
 */
int
OutboxStoreLoadUnsettledDeadLetters(int64 **ids, MemoryContext cxt)
{
	uint64		i;
	int			n;
	bool		isnull;

	SPI_connect();
	OutboxStoreRun("SELECT d.event_pk FROM outbox.dead_letters d"
				   " JOIN outbox.events e ON e.id OPERATOR(pg_catalog.=) d.event_pk"
				   " CROSS JOIN outbox.relay_progress p"
				   " WHERE p.relay OPERATOR(pg_catalog.=) 'default'"
				   " AND NOT COALESCE(pg_catalog.pg_visible_in_snapshot(e.txid, p.prev_snapshot), false)"
				   " AND (p.batch_snapshot IS NULL"
				   "  OR NOT pg_catalog.pg_visible_in_snapshot(e.txid, p.batch_snapshot)"
				   "  OR e.id OPERATOR(pg_catalog.>) p.batch_last_id)"
				   " ORDER BY 1 LIMIT 100000",
				   true, 0, SPI_OK_SELECT, "read unsettled dead letters");
	n = (int) SPI_processed;
	*ids = MemoryContextAlloc(cxt, sizeof(int64) * Max(n, 1));
	for (i = 0; i < SPI_processed; i++)
		(*ids)[i] = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[i],
												 SPI_tuptable->tupdesc, 1, &isnull));
	SPI_finish();
	return n;
}
