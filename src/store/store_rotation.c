/*-------------------------------------------------------------------------
 *
 * store/store_rotation.c
 *		The log's ring of generations (outbox.generations): the relay opens
 *		the next generation and empties the oldest closed one with TRUNCATE,
 *		never with DELETE.
 *
 * Invariants:
 *	- Called inside a transaction the relay opened (READ COMMITTED) and
 *	  will commit; never commits itself.  A statement that must see what
 *	  committed after a lock was taken runs read-write, so that SPI takes
 *	  a new snapshot for it.
 *	- A closed generation is emptied only when its partition's ACCESS
 *	  EXCLUSIVE lock is had without waiting (no transaction that wrote
 *	  there is still open, none reads it) and then, in a snapshot taken
 *	  after that lock, every row in it is delivered by the relay's
 *	  progress, created before now minus outbox.retention, not a restored
 *	  event still to be judged, and not needed by a dead letter, a hold or
 *	  the replay queue.  The whole generation is checked before the lock;
 *	  under it, only the rows of transactions that could have been open
 *	  then (txid at or past that snapshot's xmin, through the txid index).
 *	- Rows still needed are moved into the current generation with their
 *	  ids and txids (an UPDATE of the generation: a delete and an insert,
 *	  which snapshots older than the move do not see), and the generation
 *	  is emptied at a later step, once no snapshot older than the move's
 *	  end remains (moved_by).  So no snapshot ever misses them: one that
 *	  reads the partition after the TRUNCATE saw the move.
 *	- The next generation opens only when it is empty, with no page on
 *	  disk, and the current one has been open a quarter of the retention
 *	  (at least a second).  A generation that cannot be emptied stops the
 *	  ring: the current one grows, as a backlog must.  Rows found in a
 *	  generation marked empty (a restore's, or a late writer's) make it
 *	  closed as of now.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "storage/lmgr.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/timestamp.h"
#include "utils/xid8.h"

#include "base/base.h"
#include "store/store.h"
#include "store/store_sql.h"

/* how soon a generation kept from being emptied is looked at again */
#define ROTATE_RECHECK_MS		10000
/* the longest between two steps: a reload of the retention shows by then */
#define ROTATE_LOOK_MAX_MS		60000
/* the shortest a generation stays current */
#define ROTATE_MIN_OPEN_MS		1000
/*
 * How long after it closes a generation may still take rows: a session
 * trusts the generation it read for a second (emit_generation.c).  A
 * generation is due this long after the retention, so that its last rows
 * are past the retention too.
 */
#define ROTATE_LATE_ROWS_MS		1000

/* what a generation waits for once its needed rows moved out: looked at each second */
#define OLDER_SNAPSHOT			"an older snapshot"
#define USING_IT				"a transaction using it"

typedef enum GenerationState
{
	GEN_CURRENT, GEN_CLOSED, GEN_EMPTY
} GenerationState;

typedef struct Generation
{
	GenerationState state;
	TimestampTz opened_at;
	TimestampTz closed_at;
	bool		moved;			/* moved_by is set */
	Datum		moved_by;		/* xid8, by value */
	bool		has_pages;		/* its partition is not empty on disk */
} Generation;

/* the relay's delivered snapshot; '1:1:' (nothing) before its first batch */
#define PREV_SNAPSHOT \
	"COALESCE((SELECT p.prev_snapshot FROM outbox.relay_progress p" \
	" WHERE p.relay OPERATOR(pg_catalog.=) 'default'), '1:1:')"

/*
 * What keeps partition events_<n> from being emptied, if anything, with $1
 * the retention's cutoff: [0] among all its rows, the second column then
 * the xmin of the statement's snapshot; [1] among the rows of transactions
 * from xid8 $2 on (the first check's xmin), through the txid index.
 */
#define RESTORED_CASE \
	" WHEN EXISTS (SELECT 1 FROM outbox.restored_events r, outbox.%s e" \
	"  WHERE e.id OPERATOR(pg_catalog.=) r.id) THEN 'restored events to judge'"
#define UNDELIVERED(from) \
	" WHEN EXISTS (SELECT 1 FROM outbox.%s e WHERE e.txid OPERATOR(pg_catalog.>=) " from \
	"  AND NOT pg_catalog.pg_visible_in_snapshot(e.txid, " PREV_SNAPSHOT "))" \
	"  THEN 'undelivered events'"

static const char *const blocking_sql[2] = {
	"SELECT CASE" RESTORED_CASE
	UNDELIVERED("pg_catalog.pg_snapshot_xmin(" PREV_SNAPSHOT ")")
	" WHEN EXISTS (SELECT 1 FROM outbox.%s e WHERE $2 IS NOT NULL"
	"  AND e.created_at OPERATOR(pg_catalog.>=) $1) THEN 'events within the retention'"
	" END, pg_catalog.pg_snapshot_xmin(pg_catalog.pg_current_snapshot())",
	"SELECT CASE" RESTORED_CASE
	UNDELIVERED("$2")
	" WHEN EXISTS (SELECT 1 FROM outbox.%s e WHERE e.txid OPERATOR(pg_catalog.>=) $2"
	"  AND e.created_at OPERATOR(pg_catalog.>=) $1) THEN 'events within the retention'"
	" END, NULL::pg_catalog.xid8",
};

/* the rows of generation $1 something still needs, moved into $2 */
#define MOVE_SQL \
	"UPDATE outbox.events e SET generation = $2" \
	" WHERE e.generation OPERATOR(pg_catalog.=) $1 AND e.id OPERATOR(pg_catalog.=) ANY (ARRAY(" \
	"  SELECT d.event_pk FROM outbox.dead_letters d" \
	"   WHERE d.state OPERATOR(pg_catalog.=) ANY (ARRAY['quarantined', 'parked', 'replaying'])" \
	"  UNION SELECT h.id FROM outbox.held h" \
	"  UNION SELECT q.event_pk FROM outbox.replay_queue q))"

/*
 * whether a snapshot older than the end of transaction $1 may remain that
 * can read this database: one of its backends', a physical walsender's (a
 * standby's queries), or a physical slot's
 */
#define OLDER_SNAPSHOT_SQL \
	"SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_stat_activity a" \
	"  WHERE a.pid OPERATOR(pg_catalog.<>) pg_catalog.pg_backend_pid()" \
	"  AND (a.datid IS NULL OR a.datname OPERATOR(pg_catalog.=) pg_catalog.current_database())" \
	"  AND a.backend_xmin IS NOT NULL" \
	"  AND pg_catalog.age(a.backend_xmin) OPERATOR(pg_catalog.>=) pg_catalog.age(pg_catalog.xid($1)))" \
	" OR EXISTS (SELECT 1 FROM pg_catalog.pg_replication_slots s" \
	"  WHERE s.xmin IS NOT NULL" \
	"  AND pg_catalog.age(s.xmin) OPERATOR(pg_catalog.>=) pg_catalog.age(pg_catalog.xid($1)))"

/*
 * OutboxStoreLogRotates
 *		Whether this database's log is a ring of generations (1.8 on).
 */
bool
OutboxStoreLogRotates(void)
{
	Oid			nsp = get_namespace_oid("outbox", true);

	return OidIsValid(nsp) && OidIsValid(get_relname_relid("generations", nsp));
}

/* run sql with the given int2 arguments; an UPDATE or a utility statement */
static void
exec_gen(const char *sql, int nargs, int16 a, int16 b, int expected)
{
	Oid			types[2] = {INT2OID, INT2OID};
	Datum		values[2] = {Int16GetDatum(a), Int16GetDatum(b)};

	OutboxSpiExec(sql, nargs, types, values, NULL, false, 0, expected,
				  "the log's rotation");
}

/* load the ring into gens; returns the current generation */
static int
load_generations(Generation *gens)
{
	int			current = -1;

	OutboxStoreRun("SELECT g.generation, g.state, g.opened_at, g.closed_at, g.moved_by,"
				   " pg_catalog.pg_relation_size(pg_catalog.format('outbox.%I',"
				   "  'events_' OPERATOR(pg_catalog.||) g.generation)::pg_catalog.regclass)"
				   "  OPERATOR(pg_catalog.>) 0"
				   " FROM outbox.generations g ORDER BY g.generation",
				   true, 0, SPI_OK_SELECT, "load outbox.generations");
	if (SPI_processed != OUTBOX_GENERATIONS)
		elog(ERROR, "outbox.generations has %d rows, not %d",
			 (int) SPI_processed, OUTBOX_GENERATIONS);
	for (int g = 0; g < OUTBOX_GENERATIONS; g++)
	{
		HeapTuple	tup = SPI_tuptable->vals[g];
		TupleDesc	desc = SPI_tuptable->tupdesc;
		char	   *state = SPI_getvalue(tup, desc, 2);
		bool		isnull;
		Datum		d;

		gens[g].state = strcmp(state, "current") == 0 ? GEN_CURRENT :
			strcmp(state, "closed") == 0 ? GEN_CLOSED : GEN_EMPTY;
		if (gens[g].state == GEN_CURRENT)
			current = g;
		d = SPI_getbinval(tup, desc, 3, &isnull);
		gens[g].opened_at = isnull ? 0 : DatumGetTimestampTz(d);
		d = SPI_getbinval(tup, desc, 4, &isnull);
		gens[g].closed_at = isnull ? 0 : DatumGetTimestampTz(d);
		gens[g].moved_by = SPI_getbinval(tup, desc, 5, &gens[g].moved);
		gens[g].moved = !gens[g].moved;
		gens[g].has_pages = DatumGetBool(SPI_getbinval(tup, desc, 6, &isnull));
	}
	if (current < 0)
		elog(ERROR, "outbox.generations has no current generation");
	return current;
}

/*
 * blocking
 *		What keeps generation g from being emptied, cutoff the retention's;
 *		NULL: nothing.  Without xmin, among the rows of transactions from
 *		from_xid on only; with it, among all, and into *xmin the xmin of the
 *		snapshot it looked in.  A new snapshot each time (READ COMMITTED,
 *		read-write).
 */
static const char *
blocking(int g, TimestampTz cutoff, Datum from_xid, Datum *xmin)
{
	char		name[OUTBOX_GENERATION_NAME_LEN];
	Oid			types[2] = {TIMESTAMPTZOID, XID8OID};
	Datum		values[2];
	bool		isnull;
	Datum		reason;

	snprintf(name, sizeof(name), OUTBOX_GENERATION_NAME_FMT, g);
	values[0] = TimestampTzGetDatum(cutoff);
	values[1] = from_xid;
	if (xmin == NULL)
		OutboxSpiExecText("SELECT pg_catalog.set_config('enable_seqscan', $1, true)",
						  "off", false, 1, SPI_OK_SELECT, "the log's rotation");
	OutboxSpiExec(psprintf(blocking_sql[xmin == NULL], name, name, name), 2, types,
				  values, NULL, false, 1, SPI_OK_SELECT, "the log's rotation check");
	if (xmin != NULL)
		*xmin = OutboxSpiValue(2, &isnull);
	reason = OutboxSpiValue(1, &isnull);
	return isnull ? NULL : TextDatumGetCString(reason);
}

/* whether a snapshot older than the end of transaction moved_by remains */
static bool
older_snapshot(Datum moved_by)
{
	Oid			types[1] = {XID8OID};
	bool		isnull;

	OutboxSpiExec(OLDER_SNAPSHOT_SQL, 1, types, &moved_by, NULL, false, 1,
				  SPI_OK_SELECT, "the log's snapshot check");
	return DatumGetBool(OutboxSpiValue(1, &isnull));
}

/*
 * move_needed
 *		Move the rows of generation g that a dead letter, a hold or the
 *		replay queue needs into generation current, as they are (the
 *		restore trigger stays out: their txids are their own); returns how
 *		many moved.
 */
static uint64
move_needed(int g, int current)
{
	uint64		moved;

	OutboxSpiExecText("SELECT pg_catalog.set_config('session_replication_role', $1, true)",
					  "replica", false, 1, SPI_OK_SELECT, "the log's rotation");
	exec_gen(MOVE_SQL, 2, g, current, SPI_OK_UPDATE);
	moved = SPI_processed;
	OutboxSpiExecText("SELECT pg_catalog.set_config('session_replication_role', $1, true)",
					  "origin", false, 1, SPI_OK_SELECT, "the log's rotation");
	if (moved > 0)
		exec_gen("UPDATE outbox.generations SET moved_by = pg_catalog.pg_current_xact_id()"
				 " WHERE generation OPERATOR(pg_catalog.=) $1", 1, g, 0, SPI_OK_UPDATE);
	return moved;
}

/*
 * empty_generation
 *		Empty closed generation g, or say what keeps it (the invariants);
 *		current is the generation rows still needed move into.
 */
static const char *
empty_generation(int g, const Generation *gen, int current, TimestampTz cutoff)
{
	char		name[OUTBOX_GENERATION_NAME_LEN];
	Oid			relid;
	Datum		xmin;
	const char *why;

	snprintf(name, sizeof(name), OUTBOX_GENERATION_NAME_FMT, g);
	relid = get_relname_relid(name, get_namespace_oid("outbox", false));
	if (!OidIsValid(relid))
		elog(ERROR, "outbox.%s does not exist", name);
	if (gen->moved && older_snapshot(gen->moved_by))
		return OLDER_SNAPSHOT;
	/* no whole-generation check while someone holds it: look first */
	if (!ConditionalLockRelationOid(relid, AccessExclusiveLock))
		return USING_IT;
	UnlockRelationOid(relid, AccessExclusiveLock);
	why = blocking(g, cutoff, FullTransactionIdGetDatum(InvalidFullTransactionId), &xmin);
	if (why != NULL)
		return why;
	if (!ConditionalLockRelationOid(relid, AccessExclusiveLock))
		return USING_IT;
	why = blocking(g, cutoff, xmin, NULL);
	if (why != NULL)
		return why;
	if (move_needed(g, current) > 0)
		return OLDER_SNAPSHOT;
	OutboxSpiExec(psprintf("TRUNCATE outbox.%s", name), 0, NULL, NULL, NULL,
				  false, 0, SPI_OK_UTILITY, "the log's rotation");
	return NULL;
}

/* record what became of closed generation g: emptied (why NULL) or kept */
static void
record(int g, const char *why)
{
	Oid			types[2] = {INT2OID, TEXTOID};
	Datum		values[2] = {Int16GetDatum(g), (Datum) 0};
	char		nulls[2] = {' ', 'n'};

	if (why == NULL)
	{
		exec_gen("UPDATE outbox.generations SET state = 'empty', opened_at = NULL,"
				 " closed_at = NULL, emptied_at = pg_catalog.now(), waits_for = NULL,"
				 " moved_by = NULL WHERE generation OPERATOR(pg_catalog.=) $1",
				 1, g, 0, SPI_OK_UPDATE);
		return;
	}
	values[1] = CStringGetTextDatum(why);
	nulls[1] = ' ';
	OutboxSpiExec("UPDATE outbox.generations SET waits_for = $2"
				  " WHERE generation OPERATOR(pg_catalog.=) $1"
				  " AND waits_for IS DISTINCT FROM $2",
				  2, types, values, nulls, false, 0, SPI_OK_UPDATE, "the log's rotation");
}

/* the closed generation closed first, -1 when none is */
static int
oldest_closed(const Generation *gens)
{
	int			oldest = -1;

	for (int g = 0; g < OUTBOX_GENERATIONS; g++)
		if (gens[g].state == GEN_CLOSED &&
			(oldest < 0 || gens[g].closed_at < gens[oldest].closed_at))
			oldest = g;
	return oldest;
}

/*
 * step_oldest
 *		Empty the oldest closed generation of gens when it is due, or record
 *		why it waits (nothing, when it is not due yet); into out what became
 *		of it and when to look again.
 */
static void
step_oldest(Generation *gens, int current, TimestampTz now, int64 retention_ms,
			OutboxRotation *out)
{
	int			oldest = oldest_closed(gens);
	int64		due_ms = retention_ms + ROTATE_LATE_ROWS_MS;

	if (oldest >= 0 && now >= TimestampTzPlusMilliseconds(gens[oldest].closed_at, due_ms))
	{
		out->waits_for = empty_generation(oldest, &gens[oldest], current,
										  TimestampTzPlusMilliseconds(now, -retention_ms));
		record(oldest, out->waits_for);
		if (out->waits_for != NULL)
		{
			out->next_look = TimestampTzPlusMilliseconds(now,
														 strcmp(out->waits_for, OLDER_SNAPSHOT) == 0 ?
														 ROTATE_MIN_OPEN_MS : ROTATE_RECHECK_MS);
			return;
		}
		gens[oldest].state = GEN_EMPTY;
		gens[oldest].has_pages = false;
		out->emptied = oldest;
		out->emptied_any = true;
		oldest = oldest_closed(gens);
	}
	else if (oldest >= 0)
		/* not due (the retention may have grown since it waited) */
		exec_gen("UPDATE outbox.generations SET waits_for = NULL"
				 " WHERE generation OPERATOR(pg_catalog.=) $1 AND waits_for IS NOT NULL",
				 1, oldest, 0, SPI_OK_UPDATE);
	if (oldest >= 0)
		out->next_look = Min(out->next_look,
							 TimestampTzPlusMilliseconds(gens[oldest].closed_at, due_ms));
}

/*
 * OutboxStoreRotate
 *		One step of the ring, with the retention in seconds: rows found in a
 *		generation marked empty close it; the oldest closed generation, past
 *		the retention since it closed, is emptied (or its reason to wait
 *		recorded); the next generation opens when due and empty.  Into out,
 *		what the step did and when the next one is due (out->waits_for
 *		lives until the next call).  The caller is in a transaction.
 */
void
OutboxStoreRotate(int retention, OutboxRotation *out)
{
	static char waits_for[64];
	Generation	gens[OUTBOX_GENERATIONS];
	TimestampTz now = GetCurrentTimestamp();
	int64		retention_ms = (int64) retention * 1000;
	int64		open_ms = Max(retention_ms / 4, ROTATE_MIN_OPEN_MS);
	int			current;
	int			next;

	memset(out, 0, sizeof(*out));
	/* the checks after the lock need snapshots taken after it */
	if (IsolationUsesXactSnapshot())
		elog(ERROR, "the log's rotation needs READ COMMITTED");
	SPI_connect();
	OutboxSpiExecText("SELECT pg_catalog.set_config('lock_timeout', $1, true)",
					  "1s", false, 1, SPI_OK_SELECT, "the log's rotation");
	current = load_generations(gens);
	next = (current + 1) % OUTBOX_GENERATIONS;
	out->next_look = TimestampTzPlusMilliseconds(now, ROTATE_LOOK_MAX_MS);
	for (int g = 0; g < OUTBOX_GENERATIONS; g++)
		if (gens[g].state == GEN_EMPTY && gens[g].has_pages)
		{
			exec_gen("UPDATE outbox.generations SET state = 'closed',"
					 " closed_at = pg_catalog.now() WHERE generation OPERATOR(pg_catalog.=) $1",
					 1, g, 0, SPI_OK_UPDATE);
			gens[g].state = GEN_CLOSED;
			gens[g].closed_at = now;
		}

	step_oldest(gens, current, now, retention_ms, out);

	if (gens[next].state == GEN_EMPTY && !gens[next].has_pages &&
		now >= TimestampTzPlusMilliseconds(gens[current].opened_at, open_ms))
	{
		exec_gen("UPDATE outbox.generations SET state = 'closed', closed_at = pg_catalog.now()"
				 " WHERE generation OPERATOR(pg_catalog.=) $1", 1, current, 0, SPI_OK_UPDATE);
		exec_gen("UPDATE outbox.generations SET state = 'current', opened_at = pg_catalog.now(),"
				 " closed_at = NULL, emptied_at = NULL, waits_for = NULL, moved_by = NULL"
				 " WHERE generation OPERATOR(pg_catalog.=) $1", 1, next, 0, SPI_OK_UPDATE);
		out->opened = true;
		current = next;
		gens[current].opened_at = now;
	}
	out->next_look = Min(out->next_look,
						 TimestampTzPlusMilliseconds(gens[current].opened_at, open_ms));
	out->next_look = Max(out->next_look, TimestampTzPlusMilliseconds(now, ROTATE_MIN_OPEN_MS));
	out->current = current;
	if (out->waits_for != NULL)
	{
		strlcpy(waits_for, out->waits_for, sizeof(waits_for));
		out->waits_for = waits_for;
	}
	SPI_finish();
}
