/*-------------------------------------------------------------------------
 *
 * consumer/consumer_worker.c
 *		What every step of the subscription worker stands on: the
 *		partitions it knows, the statements each batch runs (prepared
 *		once), the one transaction bracket and the one subtransaction
 *		bracket its statements run in.
 *
 * Invariants:
 *	- The worker never holds a transaction while it waits: a transaction
 *	  is opened by OutboxSubscriberBeginTxn and committed by
 *	  OutboxSubscriberEndTxn within one step of the loop, never across a
 *	  poll or a wait.
 *	- A handler error costs only what its subtransaction did
 *	  (OutboxSubscriberTry): the subtransaction is rolled back and the
 *	  transaction goes on.  An error because the owner lost the right to
 *	  run the handler (w->refused) is not caught: it ends the transaction
 *	  and the worker, and costs no message an attempt.
 *	- A partition's state is palloc'd once in w->cxt and stays at its
 *	  address until the partition is revoked (or the consumer made
 *	  again): a batch may hold pointers to it.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"

#include "consumer/consumer_worker.h"
#include "store/store_sql.h"
#include "base/base.h"

#define PLAN_MAX_ARGS		14

/* one of the statements each batch runs */
typedef struct PlanSpec
{
	const char *what;			/* "<what> failed" */
	int			expected;		/* SPI_OK_* */
	int			nargs;
	Oid			types[PLAN_MAX_ARGS];	/* InvalidOid: outbox.inbound_message */
	const char *sql;
} PlanSpec;

static const PlanSpec plan_specs[PLAN_COUNT] = {
	[PLAN_LOCK_OFFSET] = {
		"locking the offsets", SPI_OK_SELECT, 3, {TEXTOID, TEXTOID, INT4OID},
		"SELECT o.next_offset FROM outbox.inbox_offsets o"
		" WHERE o.consumer_group OPERATOR(pg_catalog.=) $1"
		" AND o.topic OPERATOR(pg_catalog.=) $2"
		" AND o.kafka_partition OPERATOR(pg_catalog.=) $3 FOR UPDATE"
	},
	[PLAN_INSERT_OFFSET] = {
		"making the offsets row", SPI_OK_INSERT, 4, {TEXTOID, TEXTOID, INT4OID, INT8OID},
		"INSERT INTO outbox.inbox_offsets (consumer_group, topic, kafka_partition, next_offset)"
		" VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING"
	},
	[PLAN_UPDATE_OFFSET] = {
		"saving the offsets", SPI_OK_UPDATE, 4, {TEXTOID, TEXTOID, INT4OID, INT8OID},
		"UPDATE outbox.inbox_offsets SET next_offset = $4, updated_at = pg_catalog.now()"
		" WHERE consumer_group OPERATOR(pg_catalog.=) $1"
		" AND topic OPERATOR(pg_catalog.=) $2"
		" AND kafka_partition OPERATOR(pg_catalog.=) $3"
	},
	[PLAN_DEDUPE] = {
		"inserting the dedupe row", SPI_OK_INSERT, 2, {TEXTOID, UUIDOID},
		"INSERT INTO outbox.inbox (consumer, event_id) VALUES ($1, $2)"
		" ON CONFLICT DO NOTHING"
	},
	[PLAN_LEGACY] = {
		"reading the dedupe rows", SPI_OK_SELECT, 2, {TEXTOID, UUIDOID},
		"SELECT 1 FROM outbox.inbox i WHERE i.consumer OPERATOR(pg_catalog.=) $1"
		" AND i.event_id OPERATOR(pg_catalog.=) $2"
	},
	[PLAN_DEAD] = {
		"inserting a dead letter", SPI_OK_INSERT, 14,
		{TEXTOID, TEXTOID, INT4OID, INT8OID, TEXTOID, UUIDOID, TEXTOID, INT8OID,
		INT4OID, TEXTOID, TEXTOID, InvalidOid, TIMESTAMPTZOID, TEXTOID},
		"INSERT INTO outbox.inbox_dead_letters (consumer_group, topic, kafka_partition,"
		" kafka_offset, key, event_id, state, blocked_by, attempts, last_error,"
		" last_sqlstate, message, first_failed_at, subscription)"
		" VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)"
		" ON CONFLICT (consumer_group, topic, kafka_partition, kafka_offset) DO NOTHING"
	},
};

/* the memory context current when the transaction began */
static MemoryContext txn_caller_cxt = NULL;

/*
 * OutboxSubscriberBeginTxn
 *		Open a transaction with a snapshot, connected to SPI.  Inside it
 *		SPI's memory context is current.
 */
void
OutboxSubscriberBeginTxn(void)
{
	txn_caller_cxt = CurrentMemoryContext;
	/* now() in the worker's SQL: nobody else sets it in a background worker */
	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	SPI_connect();
	PushActiveSnapshot(GetTransactionSnapshot());
}

/*
 * OutboxSubscriberEndTxn
 *		Commit the transaction OutboxSubscriberBeginTxn opened, and return
 *		to the memory context current before it: committing leaves
 *		TopMemoryContext current.
 */
void
OutboxSubscriberEndTxn(void)
{
	PopActiveSnapshot();
	SPI_finish();
	CommitTransactionCommand();
	MemoryContextSwitchTo(txn_caller_cxt);
}

/*
 * OutboxSubscriberPreparePlans
 *		Prepare the statements each batch runs (inside SPI, once the
 *		subscription's row and w->typid are read), for the worker's life.
 */
void
OutboxSubscriberPreparePlans(Worker *w)
{
	int			i;
	int			j;

	for (i = 0; i < PLAN_COUNT; i++)
	{
		const PlanSpec *spec = &plan_specs[i];
		Oid			types[PLAN_MAX_ARGS];

		for (j = 0; j < spec->nargs; j++)
			types[j] = OidIsValid(spec->types[j]) ? spec->types[j] : w->typid;
		w->plans[i] = OutboxSpiPrepare(spec->sql, spec->nargs, types,
										 psprintf("the statement %s", spec->what));
	}
}

/*
 * OutboxSubscriberRunPlan
 *		Run one of the prepared statements with args and nulls (as
 *		SPI_execute_plan takes them), returning at most count rows (0:
 *		all); anything but its expected result ends in elog.  The result is
 *		in SPI_tuptable and SPI_processed.
 */
void
OutboxSubscriberRunPlan(Worker *w, WorkerPlan plan, Datum *args,
						const char *nulls, long count)
{
	int			rc = SPI_execute_plan(w->plans[plan], args, nulls, false, count);

	if (rc != plan_specs[plan].expected)
		elog(ERROR, "%s failed: %s", plan_specs[plan].what, SPI_result_code_string(rc));
}

/*
 * failure_text
 *		The error as a dead letter and subscription_status() keep it.  A
 *		name the handler did not qualify is not found under its empty
 *		search_path, and the error alone does not say why.
 */
static char *
failure_text(const ErrorData *edata)
{
	if (edata->sqlerrcode == ERRCODE_UNDEFINED_TABLE ||
		edata->sqlerrcode == ERRCODE_UNDEFINED_FUNCTION ||
		edata->sqlerrcode == ERRCODE_UNDEFINED_OBJECT)
		return psprintf("%s (hint: a handler runs with an empty search_path: "
						"qualify every table, function and type it names with its schema, "
						"as in public.my_table)", edata->message);
	return pstrdup(edata->message);
}

/*
 * OutboxSubscriberTry
 *		Run body in a subtransaction of its own, inside the caller's
 *		transaction.  True when it ended without an error; else it is
 *		rolled back and f, when given, gets the error (palloc'd in the
 *		caller's memory context).  An error with w->refused set is raised
 *		again: see the invariants.
 */
bool
OutboxSubscriberTry(Worker *w, SubxactBody body, void *arg, Failure *f)
{
	MemoryContext old = CurrentMemoryContext;
	ResourceOwner owner = CurrentResourceOwner;
	volatile bool ok = true;

	BeginInternalSubTransaction(NULL);
	MemoryContextSwitchTo(old);
	PG_TRY();
	{
		body(w, arg);
		ReleaseCurrentSubTransaction();
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		if (w->refused)
			PG_RE_THROW();
		MemoryContextSwitchTo(old);
		edata = CopyErrorData();
		FlushErrorState();
		RollbackAndReleaseCurrentSubTransaction();
		if (f != NULL)
		{
			f->message = failure_text(edata);
			strlcpy(f->sqlstate, unpack_sql_state(edata->sqlerrcode), sizeof(f->sqlstate));
		}
		FreeErrorData(edata);
		ok = false;
	}
	PG_END_TRY();
	MemoryContextSwitchTo(old);
	CurrentResourceOwner = owner;
	return ok;
}

/* where topic/partition is in w->parts, -1 nowhere */
static int
part_index(Worker *w, const char *topic, int32 partition)
{
	int			i;

	for (i = 0; i < w->nparts; i++)
		if (w->parts[i]->partition == partition && strcmp(w->parts[i]->topic, topic) == 0)
			return i;
	return -1;
}

/* OutboxSubscriberFindPart: the state of topic/partition, NULL unknown */
Part *
OutboxSubscriberFindPart(Worker *w, const char *topic, int32 partition)
{
	int			i = part_index(w, topic, partition);

	return i < 0 ? NULL : w->parts[i];
}

/*
 * OutboxSubscriberAddPart
 *		The state of topic/partition, made when it is met first: next
 *		offset not known, no retry.
 */
Part *
OutboxSubscriberAddPart(Worker *w, const char *topic, int32 partition)
{
	Part	   *p = OutboxSubscriberFindPart(w, topic, partition);

	if (p != NULL)
		return p;
	if (w->nparts == w->maxparts)
	{
		w->maxparts = Max(16, w->maxparts * 2);
		w->parts = w->parts == NULL ?
			MemoryContextAlloc(w->cxt, sizeof(Part *) * w->maxparts) :
			repalloc(w->parts, sizeof(Part *) * w->maxparts);
	}
	p = MemoryContextAllocZero(w->cxt, sizeof(Part));
	w->parts[w->nparts++] = p;
	strlcpy(p->topic, topic, sizeof(p->topic));
	p->partition = partition;
	p->next_offset = -1;
	p->retry_offset = -1;
	return p;
}

/* OutboxSubscriberForgetPart: topic/partition was revoked; its state goes */
void
OutboxSubscriberForgetPart(Worker *w, const char *topic, int32 partition)
{
	int			i = part_index(w, topic, partition);

	if (i < 0)
		return;
	if (w->parts[i]->last_error)
		pfree(w->parts[i]->last_error);
	pfree(w->parts[i]);
	w->parts[i] = w->parts[--w->nparts];
}
