/*-------------------------------------------------------------------------
 *
 * emit/emit_generation.c
 *		Which generation of the log emit() writes into, and a given
 *		event_id checked against every generation.
 *
 * Invariants:
 *	- The current generation is read from outbox.generations at most once a
 *	  second per session, and never changes within a transaction: every
 *	  event of a transaction lands in the generation current at its start
 *	  (or within a second before).  A generation the relay closed meanwhile
 *	  still takes them; it is emptied only once every row in it is
 *	  delivered and past retention, under a lock no writer holds.
 *	- The log's keys hold within a partition only: its unique index stops a
 *	  second row of an id in the generation the row went into.  An event_id
 *	  the caller gives is then, after the insert, looked for in every other
 *	  partition with a dirty snapshot, which sees rows of transactions still
 *	  open: a committed one refuses the event; an open one is waited for,
 *	  and the look starts again.  Of two writers of one id, whichever looks
 *	  second sees the other's row (each inserts before it looks), so both
 *	  cannot commit; two that wait for each other end in a deadlock error
 *	  for one.  Nothing is locked but while waiting, so writers of different
 *	  ids never wait for each other.  Drawn ids (UUIDv7) are not looked for.
 *	- A partition's lock taken for the look is let go at once, so a
 *	  transaction that gave an id does not keep another generation from
 *	  being emptied.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/pg_index.h"
#include "executor/spi.h"
#include "executor/tuptable.h"
#include "miscadmin.h"
#include "storage/lmgr.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"
#include "utils/uuid.h"

#include "base/compat.h"
#include "base/base.h"
#include "kafka/kafka.h"
#include "emit/emit.h"

/* how long a session trusts the generation it read */
#define GENERATION_RECHECK_MS	1000

static int	cached_generation = -1;
static TimestampTz cached_at = 0;

/*
 * OutboxEmitGeneration
 *		The generation the current transaction's events go into, read from
 *		outbox.generations when the session's reading is a second older than
 *		the transaction's start.  The caller is connected to SPI, with
 *		search_path pinned or not: the query names everything.
 */
int
OutboxEmitGeneration(void)
{
	TimestampTz start = GetCurrentTransactionStartTimestamp();
	bool		isnull;
	Datum		value;

	if (cached_generation >= 0 && start >= cached_at &&
		start < TimestampTzPlusMilliseconds(cached_at, GENERATION_RECHECK_MS))
		return cached_generation;
	if (SPI_execute("SELECT g.generation FROM outbox.generations g"
					" WHERE g.state OPERATOR(pg_catalog.=) 'current'",
					true, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not read outbox.generations");
	if (SPI_processed != 1)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("outbox.generations has no current generation"),
				 errhint("The relay keeps that table; do not change it by hand.")));
	value = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
	cached_generation = DatumGetInt16(value);
	if (cached_generation < 0 || cached_generation >= OUTBOX_GENERATIONS)
		elog(ERROR, "outbox.generations names generation %d", cached_generation);
	cached_at = start;
	return cached_generation;
}

/* the unique index of partition rel whose first column is event_id */
static Oid
event_id_index(Relation rel, AttrNumber event_id_att)
{
	List	   *indexes = RelationGetIndexList(rel);
	ListCell   *lc;
	Oid			found = InvalidOid;

	foreach(lc, indexes)
	{
		HeapTuple	tup = SearchSysCache1(INDEXRELID, ObjectIdGetDatum(lfirst_oid(lc)));
		Form_pg_index ind;

		if (!HeapTupleIsValid(tup))
			continue;
		ind = (Form_pg_index) GETSTRUCT(tup);
		if (ind->indisunique && ind->indisvalid && ind->indnkeyatts >= 1 &&
			ind->indkey.values[0] == event_id_att)
			found = ind->indexrelid;
		ReleaseSysCache(tup);
		if (OidIsValid(found))
			break;
	}
	list_free(indexes);
	return found;
}

/*
 * partition_has_event
 *		Whether partition relid has a row of event id id that a committed
 *		transaction wrote, or the caller's; false, with the transaction in
 *		*wait, when the row is one an open transaction writes or deletes.
 */
static bool
partition_has_event(Oid relid, pg_uuid_t *id, TransactionId *wait)
{
	Relation	rel = table_open(relid, AccessShareLock);
	AttrNumber	att = get_attnum(relid, "event_id");
	Oid			indexid = att == InvalidAttrNumber ? InvalidOid : event_id_index(rel, att);
	Relation	index;
	TupleTableSlot *slot;
	IndexScanDesc scan;
	ScanKeyData key;
	SnapshotData dirty;
	bool		found = false;

	if (!OidIsValid(indexid))
		elog(ERROR, "outbox partition \"%s\" has no unique index on event_id",
			 get_rel_name(relid));
	InitDirtySnapshot(dirty);
	index = index_open(indexid, AccessShareLock);
	slot = table_slot_create(rel, NULL);
	ScanKeyInit(&key, 1, BTEqualStrategyNumber, F_UUID_EQ, UUIDPGetDatum(id));
	scan = OutboxIndexBeginScan(rel, index, &dirty, 1);
	index_rescan(scan, &key, 1, NULL, 0);
	*wait = InvalidTransactionId;
	if (index_getnext_slot(scan, ForwardScanDirection, slot))
	{
		*wait = TransactionIdIsValid(dirty.xmin) ? dirty.xmin : dirty.xmax;
		found = !TransactionIdIsValid(*wait);
	}
	index_endscan(scan);
	ExecDropSingleTupleTableSlot(slot);
	index_close(index, AccessShareLock);
	table_close(rel, AccessShareLock);
	return found;
}

/*
 * OutboxEmitCheckEventId
 *		Refuse (23505) event id id, given by the caller for generation own,
 *		if the log has it, waiting for a transaction that writes it to end:
 *		before the insert (inserted false), in generation own's partition,
 *		where its unique index is the last word; after it, in the other
 *		generations'.  parent is outbox.events, partitioned, locked by the
 *		caller.
 */
void
OutboxEmitCheckEventId(Relation parent, pg_uuid_t *id, int own, bool inserted)
{
	Oid			nsp = RelationGetNamespace(parent);
	int			g = 0;

	while (g < OUTBOX_GENERATIONS)
	{
		char		name[OUTBOX_GENERATION_NAME_LEN];
		Oid			relid;
		TransactionId wait;

		snprintf(name, sizeof(name), OUTBOX_GENERATION_NAME_FMT, g);
		relid = get_relname_relid(name, nsp);
		if ((g == own) == inserted || !OidIsValid(relid))
		{
			g++;
			continue;
		}
		if (partition_has_event(relid, id, &wait))
			ereport(ERROR,
					(errcode(ERRCODE_UNIQUE_VIOLATION),
					 errmsg("an event with event_id %s exists already",
							DatumGetCString(DirectFunctionCall1(uuid_out,
																UUIDPGetDatum(id)))),
					 errhint("Give each event an id of its own, or leave event_id out.")));
		if (TransactionIdIsValid(wait))
		{
			/* its end decides: look at every generation again after it */
			XactLockTableWait(wait, NULL, NULL, XLTW_None);
			g = 0;
			continue;
		}
		g++;
	}
}
