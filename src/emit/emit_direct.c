/*-------------------------------------------------------------------------
 *
 * emit/emit_direct.c
 *		The event row: written into outbox.events as the INSERT would write
 *		it, without the statement, or by the INSERT when the table is not
 *		the one this knows.
 *
 * Invariants:
 *	- The event row is written without an INSERT statement (insert_direct:
 *	  the heap tuple and its index entries, as the INSERT would write them)
 *	  into the current generation's partition while outbox.events and that
 *	  partition are the tables emit() knows; one a superuser has changed (a
 *	  trigger, constraint, column, type, default or bound) gets the INSERT
 *	  (direct_table, direct_partition).  Both write the generation
 *	  emit_generation.c names, and it then checks a given event id.
 *	- The statement's parameters ($1..$16) are numbered here only: the
 *	  INSERT's text, the direct insert's columns (event_columns) and the
 *	  row's values (row_values) agree on them in this file.
 *	- The INSERT runs with search_path pinned (OutboxPinSearchPath); the
 *	  direct insert resolves no name.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/partition.h"
#include "catalog/pg_class.h"
#include "catalog/pg_trigger.h"
#include "catalog/pg_type.h"
#include "commands/sequence.h"
#include "executor/executor.h"
#include "executor/spi.h"
#include "executor/tuptable.h"
#include "rewrite/rewriteHandler.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/lsyscache.h"
#include "utils/partcache.h"
#include "utils/rel.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"
#include "utils/uuid.h"
#include "utils/xid8.h"

#include "base/compat.h"
#include "base/base.h"
#include "kafka/kafka.h"
#include "emit/emit.h"

/*
 * The event insert's parameters: $1..$12 and $14..$15 are the event's, $13
 * its seq (NULL with the sequence off), $16 its generation (NULL for a log
 * before 1.8, not partitioned); the direct insert takes the same array.
 */
#define EMIT_NARGS 16
#define EMIT_PARAM_SEQ 12
#define EMIT_PARAM_GENERATION 15

/*
 * The event row when the direct insert cannot take it (direct_table); [1]
 * for a table before 1.8, without payload_bytes, content_type and
 * generation, where only emit() exists to call this ($14 to $16 stay
 * unused and null).
 */
static const char *const event_insert_sql[2] = {
	"INSERT INTO outbox.events (event_id, aggregate_type, aggregate_id, seq,"
	" event_type, schema_version, topic, key, payload, headers, tenant,"
	" traceparent, occurred_at, payload_bytes, content_type, generation)"
	" VALUES ($1, $2, $3, $13, $4, $5, $6, $7, $8, $9, $10, $11, $12, $14, $15,"
	" COALESCE($16, 0))",
	"INSERT INTO outbox.events (event_id, aggregate_type, aggregate_id, seq,"
	" event_type, schema_version, topic, key, payload, headers, tenant,"
	" traceparent, occurred_at)"
	" SELECT $1, $2, $3, $13, $4, $5, $6, $7, $8, $9, $10, $11, $12"
	" WHERE $14::pg_catalog.bytea IS NULL AND $15::pg_catalog.text IS NULL"
	" AND $16::pg_catalog.int2 IS NULL",
};

static SPIPlanPtr event_insert_plan[2];

/* a session setting as a text parameter: null, and NULL, when unset or empty */
static char *
setting_param(char *setting, Datum *value, char *null)
{
	if (setting == NULL || setting[0] == '\0')
	{
		*null = 'n';
		return NULL;
	}
	*value = CStringGetTextDatum(setting);
	return setting;
}

/*
 * row_values
 *		The insert's parameters $1..$15 from row; tenant and traceparent,
 *		from the session's settings, go to row->event too.
 */
static void
row_values(OutboxEmitRow *row, Datum *values, char *nulls)
{
	memset(nulls, ' ', EMIT_NARGS);
	values[0] = UUIDPGetDatum(row->event_id);
	values[1] = PointerGetDatum(row->aggregate_type);
	values[2] = PointerGetDatum(row->aggregate_id);
	values[3] = PointerGetDatum(row->event_type);
	values[4] = Int32GetDatum(row->event.schema_version);
	values[5] = CStringGetTextDatum(row->topic);
	values[6] = PointerGetDatum(row->key);
	values[7] = PointerGetDatum(row->payload);
	if (row->payload == NULL)
		nulls[7] = 'n';
	values[8] = PointerGetDatum(row->headers);
	if (row->headers == NULL)
		nulls[8] = 'n';
	row->event.tenant = setting_param(outbox_tenant, &values[9], &nulls[9]);
	row->event.traceparent = setting_param(outbox_traceparent, &values[10],
										   &nulls[10]);
	values[11] = TimestampTzGetDatum(row->occurred_at);
	if (row->event.has_seq)
		values[EMIT_PARAM_SEQ] = Int64GetDatum(row->event.seq);
	else
		nulls[EMIT_PARAM_SEQ] = 'n';
	values[13] = PointerGetDatum(row->payload_bytes);
	if (row->payload_bytes == NULL)
		nulls[13] = 'n';
	values[14] = PointerGetDatum(row->content_type);
	if (row->content_type == NULL)
		nulls[14] = 'n';
}

/*
 * The direct insert: emit() writes the event row with table_tuple_insert()
 * and the index entries with the executor's own routine, skipping the
 * planner's and the executor's set-up for a statement per event, which was
 * most of emit()'s cost.  It writes what the INSERT would have:
 *	- every column of outbox.events, of its own type; the defaults computed
 *	  here as the column defaults compute them (id from the identity
 *	  sequence, drawn after the counter row is locked; txid,
 *	  pg_current_xact_id(); created_at, clock_timestamp());
 *	- every index entry, unique ones checked (a duplicate event id is
 *	  23505, as from the INSERT);
 *	- no trigger: the table's one INSERT trigger, event_restored, fires
 *	  only for a txid that is not the current transaction's, never emit()'s.
 * It skips what the INSERT statement would add on top: the ACL check of
 * the table (emit() runs as its owner), ExecutorCheckPerms_hook and
 * statement hooks (pg_stat_statements sees no statement inside emit()).
 * direct_table() decides, once per relcache state of the table, whether
 * the table is still the one this knows: exactly the columns below (a
 * table before 1.8, under a newer library before ALTER EXTENSION UPDATE,
 * without the two 1.8 added and with payload NOT NULL), of these types,
 * no NOT NULL where emit() may write a null, those defaults, no other
 * INSERT trigger, no CHECK constraint, no generated column, no
 * forced row security.  A table that is not (a superuser changed it) gets
 * the INSERT statement, which honours whatever was changed.  An upgrade
 * script that adds a column to outbox.events adds it here too, or emit()
 * falls back to the INSERT (regress test emit checks which path runs).
 */
typedef enum EventColumn
{
	COL_ID, COL_TXID, COL_EVENT_ID, COL_AGGREGATE_TYPE, COL_AGGREGATE_ID,
	COL_SEQ, COL_EVENT_TYPE, COL_SCHEMA_VERSION, COL_TOPIC, COL_KEY,
	COL_PAYLOAD, COL_HEADERS, COL_TENANT, COL_TRACEPARENT, COL_OCCURRED_AT,
	COL_CREATED_AT, COL_PAYLOAD_BYTES, COL_CONTENT_TYPE, COL_GENERATION,
	EVENT_COLUMN_COUNT
} EventColumn;

typedef struct EventColumnSpec
{
	const char *name;
	Oid			type;
	int			param;			/* its insert parameter ($n, 0-based); -1:
								 * computed here */
	bool		nullable;		/* emit() may write a null */
	bool		since_1_8;		/* a table before 1.8 lacks it, and there
								 * payload is NOT NULL */
} EventColumnSpec;

static const EventColumnSpec event_columns[EVENT_COLUMN_COUNT] = {
	[COL_ID] = {"id", INT8OID, -1, false},
	[COL_TXID] = {"txid", XID8OID, -1, false},
	[COL_EVENT_ID] = {"event_id", UUIDOID, 0, false},
	[COL_AGGREGATE_TYPE] = {"aggregate_type", TEXTOID, 1, false},
	[COL_AGGREGATE_ID] = {"aggregate_id", TEXTOID, 2, false},
	[COL_SEQ] = {"seq", INT8OID, EMIT_PARAM_SEQ, true},
	[COL_EVENT_TYPE] = {"event_type", TEXTOID, 3, false},
	[COL_SCHEMA_VERSION] = {"schema_version", INT4OID, 4, false},
	[COL_TOPIC] = {"topic", TEXTOID, 5, false},
	[COL_KEY] = {"key", TEXTOID, 6, false},
	[COL_PAYLOAD] = {"payload", JSONBOID, 7, true, true},
	[COL_HEADERS] = {"headers", JSONBOID, 8, true},
	[COL_TENANT] = {"tenant", TEXTOID, 9, true},
	[COL_TRACEPARENT] = {"traceparent", TEXTOID, 10, true},
	[COL_OCCURRED_AT] = {"occurred_at", TIMESTAMPTZOID, 11, false},
	[COL_CREATED_AT] = {"created_at", TIMESTAMPTZOID, -1, false},
	[COL_PAYLOAD_BYTES] = {"payload_bytes", BYTEAOID, 13, true, true},
	[COL_CONTENT_TYPE] = {"content_type", TEXTOID, 14, true, true},
	[COL_GENERATION] = {"generation", INT2OID, EMIT_PARAM_GENERATION, false, true},
};

/* what direct_table() found outbox.events to be, for its relcache state */
typedef struct DirectTable
{
	bool		direct;			/* the direct insert can take it */
	bool		before_1_8;		/* no payload_bytes, content_type (only
								 * emit() exists to write it) */
	bool		partitioned;	/* by generation: rows go into a partition,
								 * judged apart (direct_partition) */
	Oid			id_seq;			/* the identity sequence of id */
	AttrNumber	attnum[EVENT_COLUMN_COUNT];
} DirectTable;

static DirectTable direct_cache;

/* whether column attnum of rel defaults to a call of funcid, no arguments */
static bool
default_calls(Relation rel, AttrNumber attnum, Oid funcid)
{
	Node	   *def = build_column_default(rel, attnum);

	return def != NULL && IsA(def, FuncExpr) &&
		((FuncExpr *) def)->funcid == funcid &&
		((FuncExpr *) def)->args == NIL;
}

/*
 * shape_check
 *		Into t: whether rel, outbox.events or one of its partitions, has the
 *		columns, constraints, triggers and indexes the direct insert knows,
 *		and where its columns are; NULL, or why not.
 */
static const char *
shape_check(Relation rel, DirectTable *t)
{
	TupleDesc	desc = RelationGetDescr(rel);

	memset(t, 0, sizeof(*t));
	if (rel->rd_rel->relrowsecurity && rel->rd_rel->relforcerowsecurity)
		return "it forces row security";
	if (desc->constr != NULL && desc->constr->num_check > 0)
		return "it has a CHECK constraint";
	if (rel->trigdesc != NULL)
	{
		for (int i = 0; i < rel->trigdesc->numtriggers; i++)
		{
			Trigger    *trig = &rel->trigdesc->triggers[i];

			if (TRIGGER_FOR_INSERT(trig->tgtype) &&
				strcmp(trig->tgname, "event_restored") != 0)
				return "it has an INSERT trigger of its own";
		}
	}
	/* before 1.8 (the library updated, the extension not yet): only emit() */
	t->before_1_8 = (get_attnum(RelationGetRelid(rel), "payload_bytes") == InvalidAttrNumber);
	for (int a = 0; a < desc->natts; a++)
	{
		Form_pg_attribute att = TupleDescAttr(desc, a);
		int			c;

		if (att->attisdropped)
			continue;
		for (c = 0; c < EVENT_COLUMN_COUNT; c++)
			if (strcmp(NameStr(att->attname), event_columns[c].name) == 0)
				break;
		if (c == EVENT_COLUMN_COUNT)
			return "it has a column emit() does not know";
		if (att->atttypid != event_columns[c].type || att->atttypmod != -1)
			return "a column's type is not emit()'s";
		if (att->attgenerated != '\0')
			return "it has a generated column";
		if (att->attnotnull && event_columns[c].nullable &&
			!(t->before_1_8 && event_columns[c].since_1_8))
			return "a column emit() may leave null is NOT NULL";
		t->attnum[c] = att->attnum;
	}
	for (int c = 0; c < EVENT_COLUMN_COUNT; c++)
		if (t->attnum[c] == InvalidAttrNumber &&
			!(t->before_1_8 && event_columns[c].since_1_8))
			return "a column is missing";
	if (!OutboxEmitPlainIndexes(rel))
		return "an index is not a plain btree on columns";
	return NULL;
}

/*
 * direct_table_check
 *		Into t: whether rel is the table the direct insert knows (a plain
 *		table before 1.8; partitioned by generation since), and where its
 *		columns are; NULL, or why not.
 */
static const char *
direct_table_check(Relation rel, DirectTable *t)
{
	const char *why_not = shape_check(rel, t);
	Node	   *def;

	if (why_not != NULL)
		return why_not;
	t->partitioned = (rel->rd_rel->relkind == RELKIND_PARTITIONED_TABLE);
	if (t->partitioned)
	{
		PartitionKey key = RelationGetPartitionKey(rel);

		if (key->strategy != PARTITION_STRATEGY_LIST || key->partnatts != 1 ||
			key->partattrs[0] != t->attnum[COL_GENERATION])
			return "it is not partitioned by generation";
	}
	else if (rel->rd_rel->relkind != RELKIND_RELATION)
		return "it is not a plain table";
	else if (t->attnum[COL_GENERATION] != InvalidAttrNumber)
		return "it is not partitioned";
	def = build_column_default(rel, t->attnum[COL_ID]);
	if (def == NULL || !IsA(def, NextValueExpr))
		return "id is not an identity column";
	t->id_seq = ((NextValueExpr *) def)->seqid;
	if (!default_calls(rel, t->attnum[COL_TXID], F_PG_CURRENT_XACT_ID) ||
		!default_calls(rel, t->attnum[COL_CREATED_AT], F_CLOCK_TIMESTAMP))
		return "a default is not emit()'s";
	t->direct = true;
	return NULL;
}

/*
 * direct_table
 *		Whether rel, outbox.events, is the table the direct insert knows,
 *		and into out its columns; cached until the next invalidation of rel
 *		(one that arrives while this looks leaves nothing cached).  The
 *		caller uses out, not the cache, which an invalidation may clear
 *		while the caller opens the indexes.
 */
static bool
direct_table(Relation rel, DirectTable *out)
{
	DirectTable t;
	uint64		stamp;
	const char *why_not;

	if (OutboxEmitTableKnown(OUTBOX_EMIT_EVENTS, rel))
	{
		*out = direct_cache;
		return out->direct;
	}
	stamp = OutboxEmitTableStamp();
	why_not = direct_table_check(rel, &t);
	if (why_not == NULL)
		elog(DEBUG1, "outbox.emit() writes outbox.events directly");
	else
		elog(DEBUG1, "outbox.emit() writes outbox.events through an INSERT statement: %s",
			 why_not);
	direct_cache = t;
	OutboxEmitTableJudged(OUTBOX_EMIT_EVENTS, rel, stamp);
	*out = t;
	return t.direct;
}

/* whether partition rel's bound is the one value generation */
static bool
bound_is(Relation rel, int generation)
{
	HeapTuple	tup = SearchSysCache1(RELOID, ObjectIdGetDatum(RelationGetRelid(rel)));
	PartitionBoundSpec *spec = NULL;
	bool		isnull;
	Datum		bound;
	Const	   *value;

	if (!HeapTupleIsValid(tup))
		return false;
	bound = SysCacheGetAttr(RELOID, tup, Anum_pg_class_relpartbound, &isnull);
	if (!isnull)
		spec = (PartitionBoundSpec *) stringToNode(TextDatumGetCString(bound));
	ReleaseSysCache(tup);
	if (spec == NULL || spec->strategy != PARTITION_STRATEGY_LIST ||
		spec->is_default || list_length(spec->listdatums) != 1)
		return false;
	value = linitial_node(Const, spec->listdatums);
	return !value->constisnull && value->consttype == INT2OID &&
		DatumGetInt16(value->constvalue) == generation;
}

/*
 * direct_partition_check
 *		Into t: whether rel is generation's partition of parent (judged as
 *		pt) as the direct insert knows it, and where its columns are; NULL,
 *		or why not.  Its defaults do not matter: the row comes with every
 *		value, as parent's defaults make them.
 */
static const char *
direct_partition_check(Relation rel, int generation, Relation parent,
					   const DirectTable *pt, DirectTable *t)
{
	const char *why_not;

	if (rel->rd_rel->relkind != RELKIND_RELATION || !rel->rd_rel->relispartition ||
		get_partition_parent(RelationGetRelid(rel), true) != RelationGetRelid(parent))
		return "it is not a plain partition of outbox.events";
	if (!bound_is(rel, generation))
		return "it does not hold its generation";
	why_not = shape_check(rel, t);
	if (why_not != NULL)
		return why_not;
	if (t->before_1_8 || t->attnum[COL_GENERATION] == InvalidAttrNumber)
		return "a column is missing";
	t->id_seq = pt->id_seq;
	t->direct = true;
	return NULL;
}

static DirectTable partition_cache[OUTBOX_GENERATIONS];

/*
 * direct_partition
 *		As direct_table(), for rel, generation's partition of parent.
 */
static bool
direct_partition(Relation rel, int generation, Relation parent,
				 const DirectTable *pt, DirectTable *out)
{
	OutboxEmitTable which = OUTBOX_EMIT_GENERATION_0 + generation;
	DirectTable t;
	uint64		stamp;
	const char *why_not;

	if (OutboxEmitTableKnown(which, rel))
	{
		*out = partition_cache[generation];
		return out->direct;
	}
	stamp = OutboxEmitTableStamp();
	why_not = direct_partition_check(rel, generation, parent, pt, &t);
	if (why_not != NULL)
		elog(DEBUG1, "outbox.emit() writes outbox.events_%d through an INSERT statement: %s",
			 generation, why_not);
	partition_cache[generation] = t;
	OutboxEmitTableJudged(which, rel, stamp);
	*out = t;
	return t.direct;
}

/*
 * insert_direct
 *		Insert the event row of parameters values/nulls (the INSERT's $1..$16)
 *		into rel as the INSERT would; t is rel's direct_table().
 */
static void
insert_direct(Relation rel, const DirectTable *t, Datum *values, char *nulls)
{
	EState	   *estate = CreateExecutorState();
	ResultRelInfo *rri = makeNode(ResultRelInfo);
	TupleTableSlot *slot = table_slot_create(rel, NULL);

	InitResultRelInfo(rri, rel, 0, NULL, 0);
	ExecOpenIndices(rri, false);

	ExecClearTuple(slot);
	memset(slot->tts_isnull, true, slot->tts_tupleDescriptor->natts * sizeof(bool));
	for (int c = 0; c < EVENT_COLUMN_COUNT; c++)
	{
		int			att = t->attnum[c] - 1;
		int			param = event_columns[c].param;

		if (t->attnum[c] == InvalidAttrNumber)
		{
			/* a column before 1.8 lacks: only emit() writes there */
			if (nulls[param] != 'n')
				elog(ERROR, "outbox.events has no column %s", event_columns[c].name);
			continue;
		}

		slot->tts_isnull[att] = false;
		if (param >= 0)
		{
			slot->tts_values[att] = values[param];
			slot->tts_isnull[att] = (nulls[param] == 'n');
		}
		else if (c == COL_ID)
			slot->tts_values[att] = Int64GetDatum(nextval_internal(t->id_seq, false));
		else if (c == COL_TXID)
			slot->tts_values[att] = FullTransactionIdGetDatum(GetTopFullTransactionId());
		else
			slot->tts_values[att] = TimestampTzGetDatum(GetCurrentTimestamp());
	}
	ExecStoreVirtualTuple(slot);

	table_tuple_insert(rel, slot, GetCurrentCommandId(true), 0, NULL);
	if (rri->ri_NumIndices > 0)
		list_free(OutboxInsertIndexTuples(rri, slot, estate));

	ExecCloseIndices(rri);
	ExecDropSingleTupleTableSlot(slot);
	FreeExecutorState(estate);
}

/*
 * insert_statement
 *		Insert the event row of parameters values/nulls by the INSERT
 *		statement, into rel's shape: [1] a table before 1.8.
 */
static void
insert_statement(Relation rel, Datum *values, char *nulls)
{
	bool		old_table = (get_attnum(RelationGetRelid(rel), "payload_bytes") == InvalidAttrNumber);
	int			level = OutboxPinSearchPath();
	int			rc;

	if (event_insert_plan[old_table] == NULL)
	{
		Oid			argtypes[EMIT_NARGS] = {UUIDOID, TEXTOID, TEXTOID, TEXTOID,
			INT4OID, TEXTOID, TEXTOID, JSONBOID, JSONBOID, TEXTOID, TEXTOID,
		TIMESTAMPTZOID, INT8OID, BYTEAOID, TEXTOID, INT2OID};

		event_insert_plan[old_table] = OutboxSpiPrepare(event_insert_sql[old_table],
														EMIT_NARGS, argtypes,
														"the outbox insert");
	}
	rc = SPI_execute_plan(event_insert_plan[old_table], values, nulls, false, 0);
	if (rc != SPI_OK_INSERT || SPI_processed != 1)
		elog(ERROR, "outbox insert returned %s with %llu rows",
			 SPI_result_code_string(rc), (unsigned long long) SPI_processed);
	OutboxUnpinSearchPath(level);
}

/*
 * OutboxEmitInsert
 *		Insert row into outbox.events, with its seq when row->event.has_seq,
 *		into the current generation's partition, directly or, when the
 *		table is not the one the direct insert knows, by the INSERT
 *		statement.  A given event id is looked for in its generation before,
 *		and in the others after (emit_generation.c).  The caller is
 *		connected to SPI.
 */
void
OutboxEmitInsert(OutboxEmitRow *row)
{
	Datum		values[EMIT_NARGS];
	char		nulls[EMIT_NARGS];
	Relation	rel;
	DirectTable t;
	bool		direct;
	int			generation = 0;

	row_values(row, values, nulls);
	rel = OutboxEmitOpenTable(OUTBOX_EMIT_EVENTS);
	direct = direct_table(rel, &t);
	if (rel->rd_rel->relkind == RELKIND_PARTITIONED_TABLE)
	{
		generation = OutboxEmitGeneration();
		values[EMIT_PARAM_GENERATION] = Int16GetDatum(generation);
		if (row->event_id_given)
			OutboxEmitCheckEventId(rel, row->event_id, generation, false);
	}
	else
		nulls[EMIT_PARAM_GENERATION] = 'n';

	if (direct && t.partitioned)
	{
		Relation	part = OutboxEmitOpenTable(OUTBOX_EMIT_GENERATION_0 + generation);
		DirectTable pt;

		direct = direct_partition(part, generation, rel, &t, &pt);
		if (direct)
			insert_direct(part, &pt, values, nulls);
		table_close(part, NoLock);
	}
	else if (direct)
		insert_direct(rel, &t, values, nulls);
	if (!direct)
		insert_statement(rel, values, nulls);
	if (row->event_id_given && rel->rd_rel->relkind == RELKIND_PARTITIONED_TABLE)
		OutboxEmitCheckEventId(rel, row->event_id, generation, true);
	table_close(rel, NoLock);
}
