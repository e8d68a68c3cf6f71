/*-------------------------------------------------------------------------
 *
 * emit/emit_table.c
 *		The tables emit() writes without a statement, outbox.events and
 *		outbox.aggregates: found by name, opened, and judged once per
 *		relcache state by the files that write them (emit_direct.c,
 *		emit_counter.c).
 *
 * Invariants:
 *	- A table is opened by the OID last found for its name while that is
 *	  still the table of the name, else by the name.  The lock taken by OID
 *	  accepts the invalidations that came before it, so a table renamed,
 *	  dropped or replaced meanwhile (or a schema renamed) has cleared the
 *	  OID by the time it is checked again, and the lock on the table it no
 *	  longer is is let go.  A table this transaction has locked already can
 *	  only have been renamed or replaced by this transaction, whose own
 *	  invalidations are accepted at its next command.  A schema's rename
 *	  takes no lock on its tables: a rename by another session after this
 *	  transaction locked the table shows at its next lock or transaction,
 *	  as it would to a lookup by name.
 *	- A writer's judgement of a table (is it still the table it knows?)
 *	  stands until the next invalidation of that table, or of every
 *	  relation; one that arrives while the writer judges leaves nothing
 *	  standing (OutboxEmitTableStamp, OutboxEmitTableJudged).
 *	- One relcache and one syscache callback serve both tables, registered
 *	  once per backend: PostgreSQL has room for few relcache callbacks.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "catalog/pg_am.h"
#include "catalog/pg_index.h"
#include "commands/defrem.h"
#include "nodes/makefuncs.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/syscache.h"

#include "emit/emit.h"

/* what is known of one table */
typedef struct EmitTable
{
	const char *name;			/* outbox.<name> */
	Oid			relid;			/* as last found by name; InvalidOid: look
								 * again */
	Oid			judged;			/* the table the writer's judgement is of;
								 * InvalidOid: none stands */
} EmitTable;

static EmitTable emit_tables[OUTBOX_EMIT_NTABLES] = {
	[OUTBOX_EMIT_EVENTS] = {"events", InvalidOid, InvalidOid},
	[OUTBOX_EMIT_AGGREGATES] = {"aggregates", InvalidOid, InvalidOid},
	[OUTBOX_EMIT_GENERATION_0] = {"events_0", InvalidOid, InvalidOid},
	[OUTBOX_EMIT_GENERATION_0 + 1] = {"events_1", InvalidOid, InvalidOid},
	[OUTBOX_EMIT_GENERATION_0 + 2] = {"events_2", InvalidOid, InvalidOid},
	[OUTBOX_EMIT_GENERATION_0 + 3] = {"events_3", InvalidOid, InvalidOid},
	[OUTBOX_EMIT_GENERATION_0 + 4] = {"events_4", InvalidOid, InvalidOid},
	[OUTBOX_EMIT_GENERATION_0 + 5] = {"events_5", InvalidOid, InvalidOid},
};

static uint64 invalidations = 0;
static bool callbacks_registered = false;

/* a relation's definition changed, or every relation's may have */
static void
table_invalidate(Datum arg, Oid relid)
{
	invalidations++;
	for (int i = 0; i < OUTBOX_EMIT_NTABLES; i++)
	{
		if (relid == InvalidOid || relid == emit_tables[i].judged)
			emit_tables[i].judged = InvalidOid;
		if (relid == InvalidOid || relid == emit_tables[i].relid)
			emit_tables[i].relid = InvalidOid;
	}
}

/* a schema renamed or dropped: outbox.<name> may be another table now */
static void
names_invalidate(Datum arg, int cacheid, uint32 hashvalue)
{
	for (int i = 0; i < OUTBOX_EMIT_NTABLES; i++)
		emit_tables[i].relid = InvalidOid;
}

static void
register_callbacks(void)
{
	if (!callbacks_registered)
	{
		CacheRegisterRelcacheCallback(table_invalidate, (Datum) 0);
		CacheRegisterSyscacheCallback(NAMESPACEOID, names_invalidate, (Datum) 0);
		callbacks_registered = true;
	}
}

/*
 * OutboxEmitOpenTable
 *		outbox.<name> of which, with RowExclusiveLock, by the OID last
 *		found for the name while that is still its table, else by the name
 *		(a lookup of the schema and of the table in the catalog caches),
 *		remembered for the next call.  The caller closes it, keeping the
 *		lock.
 */
Relation
OutboxEmitOpenTable(OutboxEmitTable which)
{
	EmitTable  *t = &emit_tables[which];
	Relation	rel;

	register_callbacks();
	if (OidIsValid(t->relid))
	{
		Oid			known = t->relid;

		rel = try_table_open(known, RowExclusiveLock);
		if (rel != NULL && t->relid == known)
			return rel;
		if (rel != NULL)
			table_close(rel, RowExclusiveLock);
	}
	rel = table_openrv(makeRangeVar("outbox", (char *) t->name, -1),
					   RowExclusiveLock);
	t->relid = RelationGetRelid(rel);
	return rel;
}

/*
 * OutboxEmitTableKnown
 *		Whether the writer's last judgement of which (OutboxEmitTableJudged)
 *		is of rel and still stands.
 */
bool
OutboxEmitTableKnown(OutboxEmitTable which, Relation rel)
{
	return emit_tables[which].judged == RelationGetRelid(rel);
}

/*
 * OutboxEmitTableStamp
 *		The invalidations so far: taken before a writer judges a table, and
 *		given back to OutboxEmitTableJudged after.
 */
uint64
OutboxEmitTableStamp(void)
{
	register_callbacks();
	return invalidations;
}

/*
 * OutboxEmitTableJudged
 *		The writer has judged rel, as which, since stamp, and keeps its
 *		judgement: it stands until the next invalidation of rel, unless one
 *		arrived since stamp, when none stands.
 */
void
OutboxEmitTableJudged(OutboxEmitTable which, Relation rel, uint64 stamp)
{
	emit_tables[which].judged = stamp == invalidations ?
		RelationGetRelid(rel) : InvalidOid;
}

/*
 * OutboxEmitPlainIndexes
 *		Whether every index of rel is a valid btree on plain columns with
 *		their types' default operator classes: no expression, predicate or
 *		exclusion.  The direct paths write index entries without emit()'s
 *		search_path pinned (outbox_emit), so nothing there may call a
 *		function a caller's search_path could reach.
 */
bool
OutboxEmitPlainIndexes(Relation rel)
{
	List	   *indexes = RelationGetIndexList(rel);
	ListCell   *lc;
	bool		plain = true;

	foreach(lc, indexes)
	{
		Relation	index = index_open(lfirst_oid(lc), AccessShareLock);
		Form_pg_index ind = index->rd_index;

		plain = index->rd_rel->relam == BTREE_AM_OID &&
			ind->indisvalid && ind->indisready && !ind->indisexclusion &&
			heap_attisnull(index->rd_indextuple, Anum_pg_index_indpred, NULL) &&
			heap_attisnull(index->rd_indextuple, Anum_pg_index_indexprs, NULL);
		for (int k = 0; plain && k < ind->indnkeyatts; k++)
		{
			Oid			opclass = GetDefaultOpClass(index->rd_opcintype[k], BTREE_AM_OID);

			plain = ind->indkey.values[k] != 0 && OidIsValid(opclass) &&
				get_opclass_family(opclass) == index->rd_opfamily[k];
		}
		index_close(index, AccessShareLock);
		if (!plain)
			break;
	}
	list_free(indexes);
	return plain;
}
