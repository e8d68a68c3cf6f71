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
 *	- The log's keys hold within a partition only.  An event_id the caller
 *	  gives is checked against every partition before the insert, under a
 *	  transaction lock on the id's bucket that every such check takes, and
 *	  with a snapshot taken after that lock: an earlier giver of the same
 *	  id has ended by then, and its row, if committed, is seen.  Drawn ids
 *	  (UUIDv7) are not checked.  The lock space is the advisory locks'
 *	  with a field SQL's advisory locks never use.
 *	- A partition's lock taken for the check is let go at once, so a
 *	  transaction that gave an id does not keep its generation from being
 *	  emptied.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_index.h"
#include "common/hashfn.h"
#include "executor/spi.h"
#include "executor/tuptable.h"
#include "miscadmin.h"
#include "storage/lmgr.h"
#include "storage/lock.h"
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
/* buckets of given event ids: ids of one bucket check one after another */
#define EVENT_ID_BUCKETS		1024
/* field4 of the bucket's lock tag ("OB"); SQL's advisory locks use 1 and 2 */
#define EVENT_ID_LOCK_FIELD		0x4f42

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

/* whether partition relid has a row of event_id id visible in snapshot */
static bool
partition_has_event(Oid relid, pg_uuid_t *id, Snapshot snapshot)
{
	Relation	rel = table_open(relid, AccessShareLock);
	AttrNumber	att = get_attnum(relid, "event_id");
	Oid			indexid = att == InvalidAttrNumber ? InvalidOid : event_id_index(rel, att);
	bool		found;

	if (OidIsValid(indexid))
	{
		Relation	index = index_open(indexid, AccessShareLock);
		TupleTableSlot *slot = table_slot_create(rel, NULL);
		IndexScanDesc scan;
		ScanKeyData key;

		ScanKeyInit(&key, 1, BTEqualStrategyNumber, F_UUID_EQ, UUIDPGetDatum(id));
		scan = OutboxIndexBeginScan(rel, index, snapshot, 1);
		index_rescan(scan, &key, 1, NULL, 0);
		found = index_getnext_slot(scan, ForwardScanDirection, slot);
		index_endscan(scan);
		ExecDropSingleTupleTableSlot(slot);
		index_close(index, AccessShareLock);
	}
	else
		elog(ERROR, "outbox partition \"%s\" has no unique index on event_id",
			 get_rel_name(relid));
	table_close(rel, AccessShareLock);
	return found;
}

/*
 * OutboxEmitCheckEventId
 *		Refuse (23505) event id id, given by the caller, if any generation of
 *		the log has it; parent is outbox.events, partitioned, locked by the
 *		caller.  Returns holding the id's bucket lock until the transaction
 *		ends, so that a later giver of the id sees this one's row.
 */
void
OutboxEmitCheckEventId(Relation parent, pg_uuid_t *id)
{
	LOCKTAG		tag;
	uint32		bucket = hash_bytes(id->data, UUID_LEN) % EVENT_ID_BUCKETS;
	Oid			nsp = RelationGetNamespace(parent);
	Snapshot	snapshot;

	SET_LOCKTAG_ADVISORY(tag, MyDatabaseId, 0, bucket, EVENT_ID_LOCK_FIELD);
	(void) LockAcquire(&tag, ExclusiveLock, false, false);

	snapshot = RegisterSnapshot(GetLatestSnapshot());
	for (int g = 0; g < OUTBOX_GENERATIONS; g++)
	{
		char		name[OUTBOX_GENERATION_NAME_LEN];
		Oid			relid;

		snprintf(name, sizeof(name), "events_%d", g);
		relid = get_relname_relid(name, nsp);
		if (OidIsValid(relid) && partition_has_event(relid, id, snapshot))
		{
			UnregisterSnapshot(snapshot);
			ereport(ERROR,
					(errcode(ERRCODE_UNIQUE_VIOLATION),
					 errmsg("an event with event_id %s exists already",
							DatumGetCString(DirectFunctionCall1(uuid_out,
																UUIDPGetDatum(id)))),
					 errhint("Give each event an id of its own, or leave event_id out.")));
		}
	}
	UnregisterSnapshot(snapshot);
}
