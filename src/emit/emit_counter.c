/*-------------------------------------------------------------------------
 *
 * emit/emit_counter.c
 *		The seq of the transaction's first event of an aggregate: taken
 *		from the aggregate's counter row in outbox.aggregates, whose update
 *		locks the row until the transaction ends.
 *
 * Invariants:
 *	- With outbox.aggregate_sequence on, the transaction's first event of
 *	  an aggregate takes its seq from its counter row, which locks the row
 *	  before the event row's id is drawn; later ones take the seq
 *	  sequence.c gives out from memory.  sequence.c's header says why that
 *	  keeps seq gapless and in commit order.
 *	- The row is updated without an UPDATE statement (take_seq_direct)
 *	  while outbox.aggregates is the table this knows (counter_table_check),
 *	  and by the statement otherwise, or whenever the row changed since the
 *	  snapshot: the statement waits, rechecks and raises what UPDATE does.
 *	- The row is looked for where counter.c last saw it before the primary
 *	  key is descended; either way it is the version the statement's
 *	  snapshot sees, with the aggregate's key (counter_find).
 *	- The statement runs with search_path pinned (OutboxPinSearchPath),
 *	  its operators schema-qualified: emit() runs as the extension owner.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/heapam.h"
#include "access/relscan.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/pg_am.h"
#include "catalog/pg_collation.h"
#include "catalog/pg_type.h"
#include "executor/executor.h"
#include "executor/spi.h"
#include "executor/tuptable.h"
#include "nodes/execnodes.h"
#include "storage/bufmgr.h"
#include "utils/fmgroids.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"

#include "base/compat.h"
#include "base/base.h"
#include "emit/emit.h"

/*
 * The transaction's first event of an aggregate: the counter row's update
 * locks the row before the event id is drawn.  No row: the aggregate has
 * none yet, and sequence.c's upsert makes one.
 */
static const char *const counter_update_sql =
	"UPDATE outbox.aggregates AS a SET last_seq = a.last_seq OPERATOR(pg_catalog.+) 1"
	" WHERE a.aggregate_type OPERATOR(pg_catalog.=) $1"
	" AND a.aggregate_id OPERATOR(pg_catalog.=) $2"
	" RETURNING a.last_seq";

static SPIPlanPtr counter_update_plan;

/* what take_seq_direct() found outbox.aggregates to be, for its relcache state */
typedef struct CounterTable
{
	const char *why_not;		/* NULL: take_seq_direct() can update it */
	Oid			pk;
	AttrNumber	att_type;
	AttrNumber	att_id;
	AttrNumber	att_seq;
} CounterTable;

static CounterTable counter_cache;

/*
 * whether index, one OutboxEmitPlainIndexes() passed (a valid btree on
 * columns, no predicate), is on exactly (att_type, att_id), text, "C"
 */
static bool
counter_key_index(Relation index, AttrNumber att_type, AttrNumber att_id)
{
	return index->rd_index->indnkeyatts == 2 &&
		index->rd_index->indnatts == 2 &&
		index->rd_index->indkey.values[0] == att_type &&
		index->rd_index->indkey.values[1] == att_id &&
		index->rd_opcintype[0] == TEXTOID && index->rd_opcintype[1] == TEXTOID &&
		index->rd_indcollation[0] == C_COLLATION_OID &&
		index->rd_indcollation[1] == C_COLLATION_OID;
}

/*
 * counter_table_check
 *		Into c: whether rel, outbox.aggregates, is the table
 *		take_seq_direct() knows, its primary key and its columns; NULL, or
 *		why not.  Only the relcache (and the key's index) is read.
 */
static const char *
counter_table_check(Relation rel, CounterTable *c)
{
	TupleDesc	desc = RelationGetDescr(rel);
	Relation	index;
	bool		key_ok;

	memset(c, 0, sizeof(*c));
	if (rel->rd_rel->relkind != RELKIND_RELATION ||
		rel->rd_rel->relam != HEAP_TABLE_AM_OID)
		return "it is not a plain heap table";
	if (rel->rd_rel->relrowsecurity && rel->rd_rel->relforcerowsecurity)
		return "it forces row security";
	if (rel->trigdesc != NULL || rel->rd_rules != NULL)
		return "it has a trigger or a rule";
	if (desc->constr != NULL &&
		(desc->constr->num_check > 0 || desc->constr->has_generated_stored))
		return "it has a CHECK constraint or a generated column";
	for (int a = 0; a < desc->natts; a++)
	{
		Form_pg_attribute att = TupleDescAttr(desc, a);
		const char *name = NameStr(att->attname);

		if (att->attisdropped)
			continue;
		if (strcmp(name, "aggregate_type") == 0 && att->atttypid == TEXTOID)
			c->att_type = att->attnum;
		else if (strcmp(name, "aggregate_id") == 0 && att->atttypid == TEXTOID)
			c->att_id = att->attnum;
		else if (strcmp(name, "last_seq") == 0 && att->atttypid == INT8OID)
			c->att_seq = att->attnum;
	}
	if (c->att_type == InvalidAttrNumber || c->att_id == InvalidAttrNumber ||
		c->att_seq == InvalidAttrNumber)
		return "a column is missing or of another type";
	/* also makes rd_pkindex valid */
	if (!OutboxEmitPlainIndexes(rel))
		return "an index is not a plain btree on columns";
	c->pk = rel->rd_pkindex;
	if (!OidIsValid(c->pk))
		return "it has no primary key";
	index = index_open(c->pk, AccessShareLock);
	key_ok = counter_key_index(index, c->att_type, c->att_id);
	index_close(index, AccessShareLock);
	if (!key_ok)
		return "its primary key is not emit()'s";
	return NULL;
}

/*
 * counter_table
 *		Into out: what counter_table_check() says of rel, kept until the
 *		next invalidation of rel (OutboxEmitTableJudged).
 */
static void
counter_table(Relation rel, CounterTable *out)
{
	CounterTable c;
	uint64		stamp;

	if (OutboxEmitTableKnown(OUTBOX_EMIT_AGGREGATES, rel))
	{
		*out = counter_cache;
		return;
	}
	stamp = OutboxEmitTableStamp();
	c.why_not = counter_table_check(rel, &c);
	if (c.why_not == NULL)
		elog(DEBUG1, "outbox.emit() updates outbox.aggregates directly");
	else
		elog(DEBUG1, "outbox.emit() updates outbox.aggregates through an UPDATE statement: %s",
			 c.why_not);
	counter_cache = c;
	OutboxEmitTableJudged(OUTBOX_EMIT_AGGREGATES, rel, stamp);
	*out = c;
}

/* what take_seq_direct() did: took the seq, found no row, or leaves it */
typedef enum TakeResult
{
	TAKE_DONE, TAKE_NO_ROW, TAKE_STATEMENT
} TakeResult;

/*
 * counter_make_room
 *		Prune buf's page, a counter page, only once it is nearly full: room
 *		for a few more versions of a row of need bytes.  A counter row gets
 *		a new version in every transaction that emits for its aggregate;
 *		pruning at each access, as an index fetch does once a page is 90%
 *		full, rewrites the whole page (about a hundred rows) for each dead
 *		version.  Pruned this late, the page still has room for the new
 *		version (HOT) and each pruning frees several.  Free space is read
 *		without the lock, as heap_page_prune_opt() reads it.
 */
static void
counter_make_room(Relation rel, Buffer buf, Size need)
{
	if (PageGetHeapFreeSpace(BufferGetPage(buf)) < 4 * need)
		heap_page_prune_opt(rel, buf);
}

/*
 * counter_visible
 *		Into slot: the version snapshot sees of the row whose HOT chain
 *		starts at root, on buf (pinned by the caller), as an index fetch
 *		finds it; false when there is none (*all_dead: no one sees any).
 */
static bool
counter_visible(Relation rel, Buffer buf, ItemPointer root, Snapshot snapshot,
				Size need, TupleTableSlot *slot, bool *all_dead)
{
	BufferHeapTupleTableSlot *bslot = (BufferHeapTupleTableSlot *) slot;
	ItemPointerData tid = *root;
	bool		found;

	counter_make_room(rel, buf, need);
	LockBuffer(buf, BUFFER_LOCK_SHARE);
	found = heap_hot_search_buffer(&tid, rel, buf, snapshot,
								   &bslot->base.tupdata, all_dead, true);
	bslot->base.tupdata.t_self = tid;
	LockBuffer(buf, BUFFER_LOCK_UNLOCK);
	if (found)
	{
		slot->tts_tableOid = RelationGetRelid(rel);
		ExecStoreBufferHeapTuple(&bslot->base.tupdata, slot, buf);
	}
	return found;
}

/* whether slot's row is the counter row of (type, id): "C" is bytewise */
static bool
counter_is(TupleTableSlot *slot, const CounterTable *c, text *type, text *id)
{
	bool		isnull;
	text	   *t;
	text	   *i;

	t = DatumGetTextPP(slot_getattr(slot, c->att_type, &isnull));
	if (isnull)
		return false;
	i = DatumGetTextPP(slot_getattr(slot, c->att_id, &isnull));
	if (isnull)
		return false;
	return VARSIZE_ANY_EXHDR(t) == VARSIZE_ANY_EXHDR(type) &&
		VARSIZE_ANY_EXHDR(i) == VARSIZE_ANY_EXHDR(id) &&
		memcmp(VARDATA_ANY(t), VARDATA_ANY(type), VARSIZE_ANY_EXHDR(type)) == 0 &&
		memcmp(VARDATA_ANY(i), VARDATA_ANY(id), VARSIZE_ANY_EXHDR(id)) == 0;
}

/*
 * counter_find
 *		Into slot: the aggregate's counter row as snapshot sees it, found
 *		where counter.c last saw it or, failing that, through the primary
 *		key (which counter.c is then told of); false when there is none.
 */
static bool
counter_find(Relation rel, const CounterTable *c, Snapshot snapshot,
			 text *aggregate_type, text *aggregate_id, uint64 hash,
			 TupleTableSlot *slot)
{
	Relation	index;
	ScanKeyData keys[2];
	IndexScanDesc scan;
	ItemPointerData root;
	ItemPointer tid;
	Buffer		buf = InvalidBuffer;
	bool		all_dead;
	bool		found = false;
	Size		need;

	/* a new version of the row, with its line pointer: about this much */
	need = MAXALIGN(SizeofHeapTupleHeader + VARSIZE_ANY(aggregate_type) +
					VARSIZE_ANY(aggregate_id) + 2 * sizeof(int64)) +
		sizeof(ItemIdData);

	if (OutboxCounterRecall(rel, hash, &root, &buf))
	{
		if (counter_visible(rel, buf, &root, snapshot, need, slot, &all_dead) &&
			counter_is(slot, c, aggregate_type, aggregate_id))
			found = true;
		else
			ExecClearTuple(slot);
		ReleaseBuffer(buf);
		if (found)
			return true;
		buf = InvalidBuffer;
	}

	index = index_open(c->pk, RowExclusiveLock);
	ScanKeyInit(&keys[0], 1, BTEqualStrategyNumber, F_TEXTEQ,
				PointerGetDatum(aggregate_type));
	ScanKeyInit(&keys[1], 2, BTEqualStrategyNumber, F_TEXTEQ,
				PointerGetDatum(aggregate_id));
	/* ScanKeyInit gives "C", the key's collation */
	scan = OutboxIndexBeginScan(rel, index, snapshot, 2);
	index_rescan(scan, keys, 2, NULL, 0);
	while ((tid = index_getnext_tid(scan, ForwardScanDirection)) != NULL)
	{
		buf = ReleaseAndReadBuffer(buf, rel, ItemPointerGetBlockNumber(tid));
		root = *tid;
		if (counter_visible(rel, buf, &root, snapshot, need, slot, &all_dead))
		{
			OutboxCounterRemember(hash, &root, buf);
			found = true;
			break;
		}
		/* as an index fetch: no one sees this chain, so mark its entry */
		if (!scan->xactStartedInRecovery)
			scan->kill_prior_tuple = all_dead;
	}
	index_endscan(scan);
	if (BufferIsValid(buf))
		ReleaseBuffer(buf);
	index_close(index, NoLock);
	return found;
}

/*
 * counter_update_indexes
 *		The index entries of new_slot, the counter row's new version, after
 *		an update that left the row's page (update_indexes says which
 *		indexes want one); hash names the row in counter.c's map.
 */
static void
counter_update_indexes(Relation rel, const CounterTable *c, uint64 hash,
					   TupleTableSlot *new_slot,
					   OutboxUpdateIndexes update_indexes)
{
	EState	   *estate = CreateExecutorState();
	ResultRelInfo *rri = makeNode(ResultRelInfo);

	/* the row left its page: its chain has a new root */
	OutboxCounterForget(hash);
	InitResultRelInfo(rri, rel, 0, NULL, 0);
	ExecOpenIndices(rri, false);

	/*
	 * Tell each index whether this update changed its key, as the
	 * statement's updated columns would (only last_seq changes): btree then
	 * removes the row's older duplicates before it splits a page (bottom-up
	 * deletion).
	 */
	for (int i = 0; i < rri->ri_NumIndices; i++)
	{
		IndexInfo  *ii = rri->ri_IndexRelationInfo[i];
		bool		unchanged = (ii->ii_Expressions == NIL &&
								 ii->ii_Predicate == NIL);

		for (int k = 0; k < ii->ii_NumIndexAttrs; k++)
			if (ii->ii_IndexAttrNumbers[k] == c->att_seq)
				unchanged = false;
		ii->ii_CheckedUnchanged = true;
		ii->ii_IndexUnchanged = unchanged;
	}
	list_free(OutboxUpdateIndexTuples(rri, new_slot, estate, update_indexes));
	ExecCloseIndices(rri);
	FreeExecutorState(estate);
}

/*
 * counter_update
 *		Update old_slot, the aggregate's counter row as snapshot sees it
 *		(counter_find), to last_seq + 1, which locks it: TAKE_DONE with
 *		*seq, or TAKE_STATEMENT when the row changed since the snapshot.
 */
static TakeResult
counter_update(Relation rel, const CounterTable *c, Snapshot snapshot,
			   uint64 hash, TupleTableSlot *old_slot, int64 *seq)
{
	TupleTableSlot *new_slot;
	TM_FailureData tmfd;
	LockTupleMode lockmode;
	OutboxUpdateIndexes update_indexes;
	TM_Result	tm;
	bool		isnull;
	int64		next;

	slot_getallattrs(old_slot);
	next = DatumGetInt64(slot_getattr(old_slot, c->att_seq, &isnull));
	if (isnull)
		ereport(ERROR,
				(errcode(ERRCODE_DATA_CORRUPTED),
				 errmsg("outbox.aggregates has a null last_seq")));
	if (next == PG_INT64_MAX)
		ereport(ERROR,
				(errcode(ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE),
				 errmsg("bigint out of range")));
	next++;
	new_slot = MakeSingleTupleTableSlot(RelationGetDescr(rel), &TTSOpsVirtual);
	memcpy(new_slot->tts_values, old_slot->tts_values,
		   old_slot->tts_nvalid * sizeof(Datum));
	memcpy(new_slot->tts_isnull, old_slot->tts_isnull,
		   old_slot->tts_nvalid * sizeof(bool));
	new_slot->tts_values[c->att_seq - 1] = Int64GetDatum(next);
	ExecStoreVirtualTuple(new_slot);

	tm = table_tuple_update(rel, &old_slot->tts_tid, new_slot,
							GetCurrentCommandId(true), snapshot,
							InvalidSnapshot, true, &tmfd, &lockmode,
							&update_indexes);
	if (tm == TM_Ok && OutboxUpdateNeedsIndexes(update_indexes))
		counter_update_indexes(rel, c, hash, new_slot, update_indexes);
	ExecDropSingleTupleTableSlot(new_slot);
	if (tm != TM_Ok)
		/* it waited for the other updater, if any: now the statement */
		return TAKE_STATEMENT;
	*seq = next;
	return TAKE_DONE;
}

/*
 * take_seq_direct
 *		OutboxEmitTakeSeq() without the UPDATE statement, while
 *		outbox.aggregates is the table this knows (counter_table_check):
 *		find the aggregate's row (counter_find: where it was last seen, else
 *		through the primary key) with a new snapshot, as the statement would
 *		(READ COMMITTED: the latest; otherwise the transaction's), and
 *		update it, which locks it.  TAKE_DONE with *seq; TAKE_NO_ROW: there
 *		is none (the upsert makes it); TAKE_STATEMENT: leave it to the
 *		statement, which waits for, rechecks and raises what UPDATE does:
 *		the table is not this one, or the row changed since the snapshot
 *		(a concurrent update, or this transaction's own in this command).
 */
static TakeResult
take_seq_direct(text *aggregate_type, text *aggregate_id, int64 *seq)
{
	Relation	rel;
	CounterTable c;
	TupleTableSlot *old_slot;
	Snapshot	snapshot;
	TakeResult	result = TAKE_NO_ROW;
	uint64		hash;

	rel = OutboxEmitOpenTable(OUTBOX_EMIT_AGGREGATES);
	counter_table(rel, &c);
	if (c.why_not != NULL)
	{
		table_close(rel, NoLock);
		return TAKE_STATEMENT;
	}
	/* as the statement: a published table must be able to replicate it */
	CheckCmdReplicaIdentity(rel, CMD_UPDATE);

	/* what a statement of SPI's would see: this transaction's changes too */
	CommandCounterIncrement();
	PushActiveSnapshot(GetTransactionSnapshot());
	snapshot = GetActiveSnapshot();

	old_slot = table_slot_create(rel, NULL);
	hash = OutboxCounterHash(RelationGetRelid(rel), aggregate_type, aggregate_id);
	if (counter_find(rel, &c, snapshot, aggregate_type, aggregate_id, hash,
					 old_slot))
		result = counter_update(rel, &c, snapshot, hash, old_slot, seq);
	ExecDropSingleTupleTableSlot(old_slot);
	PopActiveSnapshot();
	table_close(rel, NoLock);
	return result;
}

/*
 * OutboxEmitTakeSeq
 *		The aggregate's next seq from its counter row, which the update
 *		locks until the transaction ends; false when it has no counter row.
 *		Directly when it can (take_seq_direct), else by the statement.  The
 *		caller is connected to SPI; not under SERIALIZABLE (emit.c says
 *		why).
 */
bool
OutboxEmitTakeSeq(text *aggregate_type, text *aggregate_id, int64 *seq)
{
	Datum		values[2] = {PointerGetDatum(aggregate_type),
	PointerGetDatum(aggregate_id)};
	bool		isnull;
	int			rc;
	int			level;

	switch (take_seq_direct(aggregate_type, aggregate_id, seq))
	{
		case TAKE_DONE:
			return true;
		case TAKE_NO_ROW:
			return false;
		case TAKE_STATEMENT:
			break;
	}

	level = OutboxPinSearchPath();
	if (counter_update_plan == NULL)
	{
		Oid			argtypes[2] = {TEXTOID, TEXTOID};

		counter_update_plan = OutboxSpiPrepare(counter_update_sql, 2,
											   argtypes, "the counter row's update");
	}
	rc = SPI_execute_plan(counter_update_plan, values, NULL, false, 0);
	if (rc != SPI_OK_UPDATE_RETURNING || SPI_processed > 1)
		elog(ERROR, "outbox counter update returned %s with %llu rows",
			 SPI_result_code_string(rc), (unsigned long long) SPI_processed);
	OutboxUnpinSearchPath(level);
	if (SPI_processed == 0)
		return false;
	*seq = DatumGetInt64(OutboxSpiValue(1, &isnull));
	return true;
}
