/*-------------------------------------------------------------------------
 *
 * emit/emit.c
 *		outbox.emit(): validate an event and insert it into outbox.events,
 *		and wake the relay when the transaction commits.
 *
 * One event goes through three steps, in this order: validate the
 * arguments (OutboxEmitCheckContent, then OutboxEmitCheckEnvelope,
 * emit_check.c), resolve its topic (OutboxTopicResolve, topic.c, between
 * the two: the order of the checks is the order of the errors a user
 * sees), insert the row (insert_event: emit_direct.c), numbered by the
 * per-aggregate sequence (emit_counter.c for the transaction's first event
 * of an aggregate, sequence.c for the rest).
 *
 * Invariants:
 *	- emit() never talks to Kafka.  It inserts one row in the caller's
 *	  transaction, so commit makes the event durable with the business data
 *	  and rollback removes both.
 *	- Everything a relay needs is resolved here, once: event id (UUIDv7,
 *	  emit_uuid.c), topic (validated as a legal Kafka name), key, tenant,
 *	  traceparent.
 *	- Every argument is hostile input (emit_check.c): an event emit()
 *	  accepts cannot forge the relay's own headers, write to a topic
 *	  outbox.allowed_topics does not allow, carry an occurred_at that is
 *	  not RFC 3339, or be larger than librdkafka accepts.
 *	- emit() runs as the extension owner, and every statement it runs (the
 *	  fallbacks of its direct paths, the upsert of an aggregate's first
 *	  counter row, the counter rows' final update before commit) runs with
 *	  search_path pinned (OutboxPinSearchPath); the direct paths resolve no
 *	  name.
 *	- A transaction that emitted wakes its database's relay when it commits
 *	  (a latch in shared memory); an aborted or prepared one wakes nobody
 *	  (COMMIT PREPARED does, utility.c).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "access/xact.h"
#include "catalog/pg_proc.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/syscache.h"
#include "utils/uuid.h"

#include "base/base.h"
#include "shmem/shmem.h"
#include "kafka/kafka.h"
#include "emit/emit.h"

PG_FUNCTION_INFO_V1(outbox_emit);
PG_FUNCTION_INFO_V1(outbox_emit_binary);
PG_FUNCTION_INFO_V1(outbox_emit_tombstone);
PG_FUNCTION_INFO_V1(outbox_notify_relay);

/* set by emit(), consumed by the transaction callback */
static bool wake_at_commit = false;
static bool replay_at_commit = false;
static int	events_this_xact = 0;

static void emit_xact_callback(XactEvent event, void *arg);

/*
 * OutboxEmitInit
 *		Register the commit callbacks (emit's and the sequence's), once per
 *		backend.
 */
void
OutboxEmitInit(void)
{
	RegisterXactCallback(emit_xact_callback, NULL);
	OutboxSequenceInit();
}

/* wake the relay at commit; a prepared transaction leaves it to COMMIT PREPARED */
static void
emit_xact_callback(XactEvent event, void *arg)
{
	switch (event)
	{
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_PARALLEL_COMMIT:
			if (wake_at_commit || replay_at_commit)
				OutboxWakeRelay(MyDatabaseId, replay_at_commit, events_this_xact);
			break;
		case XACT_EVENT_PREPARE:
			/* COMMIT PREPARED wakes the relay and counts these events */
			if (wake_at_commit || replay_at_commit)
				OutboxNotePrepared(events_this_xact, replay_at_commit);
			break;
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PARALLEL_ABORT:
			break;
		default:
			return;
	}
	wake_at_commit = replay_at_commit = false;
	events_this_xact = 0;
}

/*
 * insert_event
 *		Insert row into outbox.events in the caller's transaction, numbered
 *		by the per-aggregate sequence when it is on; then refuse it if it is
 *		larger than the relay could produce (the size counts the seq header,
 *		known only now: the error rolls the insert and the counter back with
 *		the caller's transaction); then have the relay woken at commit.
 */
static void
insert_event(OutboxEmitRow *row)
{
	OutboxSequenceEntry *held = NULL;
	bool		taken = false;

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	row->event.has_seq = outbox_aggregate_sequence;
	row->event.seq = 0;
	if (outbox_aggregate_sequence)
	{
		held = OutboxSequenceHeld(row->aggregate_type, row->aggregate_id);
		if (held != NULL)
			/* a later one: the transaction owns the row, the seq is its own */
			row->event.seq = OutboxSequenceNext(held);

		/*
		 * The transaction's first event of the aggregate.  Under
		 * SERIALIZABLE the update's index probe for a missing key would take
		 * a predicate lock on the leaf page, so transactions creating the
		 * counter rows of neighbouring new aggregates would fail each other
		 * (40001); the upsert alone takes none, and is all a serializable
		 * transaction runs.
		 */
		else if (!IsolationIsSerializable() &&
				 OutboxEmitTakeSeq(row->aggregate_type, row->aggregate_id,
								   &row->event.seq))
			taken = true;
		else
			/* the aggregate's first event ever: no counter row to update */
			row->event.seq = OutboxSequenceCreate(row->aggregate_type,
												  row->aggregate_id);
	}

	OutboxEmitInsert(row);

	if (held != NULL)
		OutboxSequenceGiven(held, row->event.seq);
	else if (taken)
		OutboxSequenceEnter(row->aggregate_type, row->aggregate_id,
							row->event.seq);
	row->event.event_id = DatumGetCString(DirectFunctionCall1(uuid_out,
															  UUIDPGetDatum(row->event_id)));
	row->event.key = text_to_cstring(row->key);
	OutboxEmitCheckSize(&row->event);

	SPI_finish();

	wake_at_commit = true;
	events_this_xact++;
}

/*
 * emit_owner
 *		The owner of the function being called, looked up once per call
 *		site (flinfo->fn_extra lives as long as the expression).
 */
static Oid
emit_owner(FunctionCallInfo fcinfo)
{
	FmgrInfo   *flinfo = fcinfo->flinfo;
	HeapTuple	tup;
	Oid			owner;

	if (flinfo->fn_extra != NULL)
		return *(Oid *) flinfo->fn_extra;
	tup = SearchSysCache1(PROCOID, ObjectIdGetDatum(flinfo->fn_oid));
	if (!HeapTupleIsValid(tup))
		elog(ERROR, "cache lookup failed for function %u", flinfo->fn_oid);
	owner = ((Form_pg_proc) GETSTRUCT(tup))->proowner;
	ReleaseSysCache(tup);
	flinfo->fn_extra = MemoryContextAlloc(flinfo->fn_mcxt, sizeof(Oid));
	*(Oid *) flinfo->fn_extra = owner;
	return owner;
}

/*
 * emit_event
 *		The body of outbox.emit(), emit_binary() and emit_tombstone(): the
 *		event whose value is of kind (OUTBOX_PAYLOAD_*), its arguments
 *		numbered as emit()'s (emit.h).  Returns the event id.
 *
 * Runs as the function's owner, the extension's, so that callers need
 * EXECUTE on it and nothing on the tables: it switches to the owner
 * itself, as SECURITY DEFINER would (through 1.6 it was), and pins
 * search_path only for the statements it runs (OutboxPinSearchPath): a SET
 * clause's setting and resetting of search_path at every call cost more
 * than the rest of a direct call's bookkeeping, and the direct paths
 * resolve no name.  An error leaves the user to the abort of the
 * (sub)transaction, as fmgr_security_definer() does.  Validate, resolve
 * the topic, insert: in that order, which is the order of the errors a
 * user sees.
 */
static Datum
emit_event(FunctionCallInfo fcinfo, int kind)
{
	OutboxEmitRow row;
	Oid			save_userid;
	int			save_sec_context;

	PreventCommandIfReadOnly("outbox.emit()");
	PreventCommandDuringRecovery("outbox.emit()");

	GetUserIdAndSecContext(&save_userid, &save_sec_context);
	SetUserIdAndSecContext(emit_owner(fcinfo),
						   save_sec_context | SECURITY_LOCAL_USERID_CHANGE);

	memset(&row, 0, sizeof(row));
	row.event.payload_kind = kind;
	row.arg_shift = (kind == OUTBOX_PAYLOAD_NONE) ? -1 : 0;
	OutboxEmitCheckContent(fcinfo, &row);
	if (kind == OUTBOX_PAYLOAD_BYTES)
		OutboxEmitCheckBinary(fcinfo, &row);
	row.topic = OutboxTopicResolve(OutboxEmitTopicArg(fcinfo, &row),
								   row.event.aggregate_type,
								   row.event.event_type);
	OutboxEmitCheckEnvelope(fcinfo, &row);
	OutboxEmitCheckBacklog();
	insert_event(&row);

	SetUserIdAndSecContext(save_userid, save_sec_context);
	PG_RETURN_UUID_P(row.event_id);
}

/*
 * outbox_emit
 *		SQL outbox.emit(aggregate_type, aggregate_id, event_type, payload,
 *		headers, topic, key, event_id, schema_version, occurred_at).
 */
Datum
outbox_emit(PG_FUNCTION_ARGS)
{
	return emit_event(fcinfo, OUTBOX_PAYLOAD_JSON);
}

/*
 * outbox_emit_binary
 *		SQL outbox.emit_binary(): emit()'s arguments, payload bytea, then
 *		content_type, schema_id, message_indexes (emit_binary.c).
 */
Datum
outbox_emit_binary(PG_FUNCTION_ARGS)
{
	return emit_event(fcinfo, OUTBOX_PAYLOAD_BYTES);
}

/*
 * outbox_emit_tombstone
 *		SQL outbox.emit_tombstone(): emit()'s arguments without payload.
 */
Datum
outbox_emit_tombstone(PG_FUNCTION_ARGS)
{
	return emit_event(fcinfo, OUTBOX_PAYLOAD_NONE);
}

/*
 * outbox_notify_relay
 *		SQL outbox_internal.notify_relay(): wake the relay when this
 *		transaction commits and have it look at the replay queue (replay
 *		and discard queue work for it).
 */
Datum
outbox_notify_relay(PG_FUNCTION_ARGS)
{
	replay_at_commit = true;
	PG_RETURN_VOID();
}
