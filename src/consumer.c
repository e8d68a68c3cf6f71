/*-------------------------------------------------------------------------
 *
 * consumer.c
 *		The subscription worker: consumes a subscription's topics from Kafka
 *		and applies each message once to the database, through the
 *		subscription's handler, as the subscription's owner.
 *
 * Invariants:
 *	- Exactly-once effect.  A batch of messages is applied in one
 *	  transaction that also locks and advances each partition's row in
 *	  outbox.inbox_offsets and inserts each message's dedupe row
 *	  (outbox.inbox, consumer = the consumer group, when the message has an
 *	  id header).  Offsets, dedupe rows and dead letters belong to the
 *	  group, so the subscriptions of one group hand partitions over
 *	  exactly.  A message whose offset is below its partition's
 *	  stored next offset is never applied: that is the dedupe of messages
 *	  without an id, and the fence between two workers that both think
 *	  they own a partition during a rebalance (the row lock orders them).
 *	  A crash anywhere rolls the handler's effects, the dedupe rows and
 *	  the offsets back together.
 *	- A handler error costs only its message.  A batch is first tried in
 *	  one subtransaction; when anything in it fails, it is rolled back and
 *	  done again with a subtransaction per message.  The failed message's
 *	  partition stops there: its offset is kept, the consumer rewinds and
 *	  pauses it, and it is tried again after a backoff with jitter.  After
 *	  max_attempts failures in a row it goes to outbox.inbox_dead_letters,
 *	  and, with the block policy, later messages of its topic and key are
 *	  parked there behind it until it is replayed or discarded.
 *	- The handler runs as the subscription's owner, with
 *	  SECURITY_LOCAL_USERID_CHANGE and SECURITY_RESTRICTED_OPERATION (no
 *	  SET ROLE, no SET SESSION AUTHORIZATION back to the worker's
 *	  superuser), an empty search_path, and every setting it changes
 *	  undone after it.  The worker's own statements name every object.
 *	- Broker trouble never becomes an ERROR: librdkafka's errors go to the
 *	  slot's last error.  An ERROR in the worker's own SQL ends the worker;
 *	  the launcher starts it again and it resumes from the database.
 *	- The worker never holds a transaction while it waits.
 *	- A partition whose log does not hold the group's next offset is
 *	  stopped, never read as applied (consumer_range.c): nothing of it is
 *	  applied until outbox.subscription_seek() moves the offset.
 *	- The parked keys are read again in every transaction that may see a
 *	  partition another worker of the group had: on assignment, and in a
 *	  batch whose stored offset moved since this worker last knew it.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <fcntl.h>
#include <unistd.h>

#include "access/htup_details.h"
#include "access/xlog.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_authid.h"
#include "catalog/pg_type.h"
#include "common/cryptohash.h"
#include "common/hashfn.h"
#include "common/pg_prng.h"
#include "common/sha2.h"
#include "executor/spi.h"
#include "funcapi.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "tcop/tcopprot.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/hsearch.h"
#include "utils/json.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/regproc.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"
#include "utils/typcache.h"
#include "utils/uuid.h"

#include "compat.h"
#include "outbox.h"
#include "store.h"

#define WAIT_IDLE_MS		1000	/* lag and replays are looked at this often */
#define REPLAY_CHECK_MS		10000
#define REPLAY_PAGE			500
#define CLOSE_TIMEOUT_MS	5000
#define ASSIGN_CHECK_MS		5000	/* for all of an assignment's log bounds */
#define RESET_CHECK_MS		2000	/* for a reset partition's log bounds */
#define RESET_RETRY_MS		10000	/* a logical offset not looked up: again */
#define ATTRS				14		/* outbox.inbound_message */
#define PARKED_TAG_LEN		16

/* what became of one message of a batch */
typedef enum Outcome
{
	OUTCOME_NONE = 0,
	OUTCOME_OLD,				/* below the stored offset: applied before */
	OUTCOME_DROPPED,			/* after a failure in its partition: comes again */
	OUTCOME_APPLIED,
	OUTCOME_DUPLICATE,			/* its id was in the inbox */
	OUTCOME_PARKED,
	OUTCOME_FAILED,				/* tried again after a backoff */
	OUTCOME_DEAD
} Outcome;

/* a partition this worker was assigned */
typedef struct Part
{
	char		topic[OUTBOX_TOPIC_MAX_LEN + 1];
	int32		partition;
	int64		next_offset;	/* applied up to here (-1: not known yet) */
	int64		retry_offset;	/* the message that failed, -1 none */
	int			attempts;		/* failures of it in a row */
	TimestampTz retry_at;		/* paused until */
	char	   *last_error;		/* of the failed message (the worker's context) */
	char		last_sqlstate[6];
	bool		assigned;		/* by the group (not only met in a batch) */
	bool		stopped;		/* its log does not hold its next offset */
} Part;

/* within a batch: a partition's row, locked */
typedef struct BatchPart
{
	Part	   *part;
	int64		stored;			/* next_offset in the table, -1 no row */
	int64		next;			/* after this batch */
	bool		stopped;
	bool		waiting;		/* for the failed message (part->retry_offset)
								 * to come again: nothing after it before */
} BatchPart;

typedef struct Subscription
{
	char		name[OUTBOX_SUBSCRIPTION_NAME_MAX];
	char	  **topics;
	int			ntopics;
	char	   *handler_text;	/* regprocedure text, schema-qualified */
	Oid			handler;		/* what it names now: see handler_problem */
	Oid			handler_owner;	/* its owner at subscribe(): must not change */
	Oid			owner;
	char	   *group_id;
	char	   *kafka_group;	/* the Kafka group.id: see load_subscription */
	char	   *dedupe_name;	/* its consumer in outbox.inbox: see dedupe_key */
	char	   *legacy_name;	/* the consumer of 1.7's unscoped rows */
	bool		legacy_rows;	/* the group had some when the worker started */
	bool		earliest;
	int			max_attempts;	/* 0: outbox.max_attempts */
	bool		block;
	int			batch_size;
} Subscription;

typedef struct Worker
{
	OutboxInboxSlot *slot;
	Subscription sub;
	MemoryContext cxt;			/* the worker's life */
	MemoryContext batch_cxt;	/* reset per batch */
	OutboxConsumer *consumer;
	TimestampTz consumer_retry_at;
	int			event_pipe[2];
	WaitEventSet *wait_set;
	FmgrInfo	handler;		/* made again in each transaction (batch_cxt) */
	bool		refused;		/* the owner may no longer run the handler */
	TupleDesc	tupdesc;		/* outbox.inbound_message */
	Oid			typid;
	Part	  **parts;			/* partitions assigned or met (each palloc'd) */
	int			nparts;
	int			maxparts;
	HTAB	   *parked;			/* topic/key with dead letters: block policy */
	bool		parked_stale;
	bool		rejoin;			/* leave the group and join again */
	TimestampTz last_replay_check;
	TimestampTz last_report;
	SPIPlanPtr	plan_lock;
	SPIPlanPtr	plan_insert_offset;
	SPIPlanPtr	plan_update_offset;
	SPIPlanPtr	plan_dedupe;
	SPIPlanPtr	plan_legacy;
	SPIPlanPtr	plan_dead;
} Worker;

typedef struct ParkedKey
{
	char		key[PARKED_TAG_LEN];	/* hash of topic and key: see parked_tag */
	int64		head;			/* the oldest dead letter of the key */
} ParkedKey;

static Worker worker;

static void load_parked(Worker *w);

/* a Kafka timestamp (ms since the Unix epoch) as a timestamptz */
static TimestampTz
timestamp_from_unix_ms(int64 ms)
{
	return (TimestampTz) (ms * 1000) -
		(TimestampTz) (POSTGRES_EPOCH_JDATE - UNIX_EPOCH_JDATE) * USECS_PER_DAY;
}
static uint32 wait_main_event;

/*
 * ---- Setup ----
 */

/*
 * parked_tag
 *		The hash key of topic/key: two independent 64-bit hashes of both,
 *		so any length fits in a fixed key.
 */
static void
parked_tag(const char *topic, const char *key, char *tag)
{
	StringInfoData buf;
	uint64		h[2];

	initStringInfo(&buf);
	appendStringInfoString(&buf, topic);
	appendStringInfoChar(&buf, '\0');
	appendStringInfoString(&buf, key);
	h[0] = hash_bytes_extended((const unsigned char *) buf.data, buf.len, 0);
	h[1] = hash_bytes_extended((const unsigned char *) buf.data, buf.len, 0x9e3779b97f4a7c15);
	memcpy(tag, h, sizeof(h));
	pfree(buf.data);
}

static void
prepare_plans(Worker *w)
{
	Oid			lock_types[3] = {TEXTOID, TEXTOID, INT4OID};
	Oid			offset_types[4] = {TEXTOID, TEXTOID, INT4OID, INT8OID};
	Oid			dedupe_types[2] = {TEXTOID, UUIDOID};
	Oid			dead_types[14] = {TEXTOID, TEXTOID, INT4OID, INT8OID, TEXTOID,
	UUIDOID, TEXTOID, INT8OID, INT4OID, TEXTOID, TEXTOID, w->typid, TIMESTAMPTZOID, TEXTOID};

	w->plan_lock = OutboxStorePrepare(
						   "SELECT o.next_offset FROM outbox.inbox_offsets o"
						   " WHERE o.consumer_group OPERATOR(pg_catalog.=) $1"
						   " AND o.topic OPERATOR(pg_catalog.=) $2"
						   " AND o.kafka_partition OPERATOR(pg_catalog.=) $3 FOR UPDATE",
						   3, lock_types, "the offsets lock");
	w->plan_insert_offset = OutboxStorePrepare(
									"INSERT INTO outbox.inbox_offsets (consumer_group, topic, kafka_partition, next_offset)"
									" VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING",
									4, offset_types, "the offsets insert");
	w->plan_update_offset = OutboxStorePrepare(
									"UPDATE outbox.inbox_offsets SET next_offset = $4, updated_at = pg_catalog.now()"
									" WHERE consumer_group OPERATOR(pg_catalog.=) $1"
									" AND topic OPERATOR(pg_catalog.=) $2"
									" AND kafka_partition OPERATOR(pg_catalog.=) $3",
									4, offset_types, "the offsets update");
	w->plan_dedupe = OutboxStorePrepare(
							 "INSERT INTO outbox.inbox (consumer, event_id) VALUES ($1, $2)"
							 " ON CONFLICT DO NOTHING",
							 2, dedupe_types, "the dedupe insert");
	w->plan_legacy = OutboxStorePrepare(
							 "SELECT 1 FROM outbox.inbox i WHERE i.consumer OPERATOR(pg_catalog.=) $1"
							 " AND i.event_id OPERATOR(pg_catalog.=) $2",
							 2, dedupe_types, "the dedupe look-up");
	w->plan_dead = OutboxStorePrepare(
						   "INSERT INTO outbox.inbox_dead_letters (consumer_group, topic, kafka_partition,"
						   " kafka_offset, key, event_id, state, blocked_by, attempts, last_error,"
						   " last_sqlstate, message, first_failed_at, subscription)"
						   " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)"
						   " ON CONFLICT (consumer_group, topic, kafka_partition, kafka_offset) DO NOTHING",
						   14, dead_types, "the dead letter insert");
}

/*
 * handler_problem
 *		Why the subscription's owner may not run its handler now, or NULL:
 *		the owner is gone, no function has the handler's name, it is no
 *		longer a handler, it is owned by another role than at subscribe()
 *		(a function planted under a dropped handler's name, or an ALTER
 *		FUNCTION ... OWNER TO), or the owner lost EXECUTE on it.  Sets
 *		s->handler to the function the name finds now.  Reads the catalogs
 *		as they are in the caller's transaction.
 */
static char *
handler_problem(Worker *w)
{
	Subscription *s = &w->sub;
	char	   *problem;
	Oid			proowner = InvalidOid;

	if (!SearchSysCacheExists1(AUTHOID, ObjectIdGetDatum(s->owner)))
		return psprintf("the role that owns the subscription (OID %u) no longer exists", s->owner);
	s->handler = OutboxHandlerByName(s->handler_text);
	if (!OidIsValid(s->handler))
		return psprintf("handler %s does not exist", s->handler_text);
	if (!OutboxCheckHandler(s->handler, w->typid, &proowner, &problem))
		return problem;
	if (proowner != s->handler_owner)
	{
		char	   *now = GetUserNameFromId(proowner, true);
		char	   *then = GetUserNameFromId(s->handler_owner, true);

		return psprintf("handler %s is owned by role \"%s\", not by role \"%s\" as at subscribe(): subscribe again to run it",
						s->handler_text, now ? now : "?", then ? then : "?");
	}
	if (!OutboxRoleMayExecute(s->owner, s->handler))
	{
		char	   *role = GetUserNameFromId(s->owner, true);

		return psprintf("role \"%s\" may not execute handler %s", role ? role : "?",
						s->handler_text);
	}
	return NULL;
}

/*
 * check_handler
 *		At the start of each transaction that calls the handler (inside
 *		SPI): the subscription's row is locked FOR KEY SHARE, so that
 *		unsubscribe() waits for this transaction and the next one finds the
 *		row gone (the worker then stops, and writes nothing more into a
 *		group that may have been purged).  ERROR (the worker stops, and
 *		waits for the subscription to change) when handler_problem() finds
 *		one; else the call info is made again, so that a change of the
 *		function (SECURITY DEFINER or INVOKER, its body) is seen by the
 *		next transaction, not at the worker's next start.  It lives in
 *		batch_cxt, reset before the next one.
 */
static void
check_handler(Worker *w)
{
	Oid			types[1] = {TEXTOID};
	Datum		args[1];
	char	   *problem;

	args[0] = CStringGetTextDatum(w->sub.name);
	if (SPI_execute_with_args("SELECT 1 FROM outbox.subscriptions s"
							  " WHERE s.name OPERATOR(pg_catalog.=) $1 FOR KEY SHARE",
							  1, types, args, NULL, false, 1) != SPI_OK_SELECT)
		elog(ERROR, "locking the subscription failed");
	if (SPI_processed == 0)
	{
		OutboxInboxMarkGone(w->slot);
		ereport(LOG, (errmsg("outbox subscription \"%s\" is gone: its worker stops", w->sub.name)));
		proc_exit(0);
	}
	problem = handler_problem(w);

	if (problem != NULL)
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("outbox subscription \"%s\" may not run its handler: %s",
						w->sub.name, problem),
				 errdetail("The worker stops; it waits for the subscription to change.")));
	w->refused = false;
	fmgr_info_cxt(w->sub.handler, &w->handler, w->batch_cxt);
}

/* whether the group has dedupe rows of before 1.8, not scoped (see dedupe_key) */
static bool
has_legacy_rows(Worker *w)
{
	Oid			types[1] = {TEXTOID};
	Datum		args[1];

	args[0] = CStringGetTextDatum(w->sub.legacy_name);
	if (SPI_execute_with_args("SELECT 1 FROM outbox.inbox i WHERE i.consumer OPERATOR(pg_catalog.=) $1 LIMIT 1",
							  1, types, args, NULL, true, 1) != SPI_OK_SELECT)
		elog(ERROR, "reading the dedupe rows failed");
	return SPI_processed > 0;
}

/*
 * load_subscription
 *		Read the worker's row (in a transaction of the caller's).  False
 *		when the extension or the row is not there.  A handler that no
 *		longer resolves, or that the owner may not run, is an error the
 *		worker reports and waits out.
 */
static bool
load_subscription(Worker *w, const char *name, char **problem)
{
	Subscription *s = &w->sub;
	Oid			argtypes[1] = {TEXTOID};
	Datum		args[1];
	bool		isnull;
	int			ret;
	HeapTuple	tup;
	TupleDesc	desc;
	Datum		d;
	ArrayType  *arr;
	Datum	   *elems;
	int			i;
	Oid			relid;
	MemoryContext old;

	*problem = NULL;
	if (!OutboxStoreExtensionPresent())
		return false;
	relid = get_relname_relid("subscriptions", get_namespace_oid("outbox", true));
	if (!OidIsValid(relid))
		return false;
	if (get_attnum(relid, "handler_owner") == InvalidAttrNumber)
	{
		/* the library is newer than the SQL objects: the update restarts us */
		*problem = MemoryContextStrdup(w->cxt, OUTBOX_OLD_SQL_PROBLEM);
		return true;
	}
	args[0] = CStringGetTextDatum(name);
	ret = SPI_execute_with_args(
								"SELECT s.topics, s.handler, s.owner::pg_catalog.oid, s.group_id,"
								" s.start_from, s.max_attempts, s.poison_policy, s.batch_size,"
								" s.handler_owner::pg_catalog.oid"
								" FROM outbox.subscriptions s WHERE s.name OPERATOR(pg_catalog.=) $1",
								1, argtypes, args, NULL, true, 1);
	if (ret != SPI_OK_SELECT)
		elog(ERROR, "reading subscription \"%s\" failed: %s", name, SPI_result_code_string(ret));
	if (SPI_processed == 0)
		return false;
	tup = SPI_tuptable->vals[0];
	desc = SPI_tuptable->tupdesc;

	old = MemoryContextSwitchTo(w->cxt);
	strlcpy(s->name, name, sizeof(s->name));
	d = SPI_getbinval(tup, desc, 1, &isnull);
	arr = DatumGetArrayTypeP(d);
	deconstruct_array(arr, TEXTOID, -1, false, TYPALIGN_INT, &elems, NULL, &s->ntopics);
	s->topics = palloc(sizeof(char *) * s->ntopics);
	for (i = 0; i < s->ntopics; i++)
		s->topics[i] = TextDatumGetCString(elems[i]);
	s->handler_text = TextDatumGetCString(SPI_getbinval(tup, desc, 2, &isnull));
	s->handler_owner = DatumGetObjectId(SPI_getbinval(tup, desc, 9, &isnull));
	s->owner = DatumGetObjectId(SPI_getbinval(tup, desc, 3, &isnull));
	s->group_id = TextDatumGetCString(SPI_getbinval(tup, desc, 4, &isnull));

	/*
	 * Kafka's group names are global to the cluster, the database's offsets
	 * are not: two databases (or two servers) with a group of one name would
	 * split its partitions and each skip the other's share.  The Kafka group
	 * is this database's own; its committed offsets are only for people.
	 */
	s->kafka_group = psprintf("outbox.%llu.%u.%s",
							  (unsigned long long) GetSystemIdentifier(),
							  MyDatabaseId, s->group_id);
	/* consume_once() refuses names starting with "outbox:" or "outbox;" */
	s->dedupe_name = psprintf("outbox;%s", s->group_id);
	s->legacy_name = psprintf("outbox:%s", s->group_id);
	s->earliest = strcmp(TextDatumGetCString(SPI_getbinval(tup, desc, 5, &isnull)), "earliest") == 0;
	d = SPI_getbinval(tup, desc, 6, &isnull);
	s->max_attempts = isnull ? 0 : DatumGetInt32(d);
	s->block = strcmp(TextDatumGetCString(SPI_getbinval(tup, desc, 7, &isnull)), "block") == 0;
	s->batch_size = DatumGetInt32(SPI_getbinval(tup, desc, 8, &isnull));

	w->typid = GetSysCacheOid2(TYPENAMENSP, Anum_pg_type_oid,
							   CStringGetDatum("inbound_message"),
							   ObjectIdGetDatum(get_namespace_oid("outbox", false)));
	w->tupdesc = lookup_rowtype_tupdesc_copy(w->typid, -1);
	MemoryContextSwitchTo(old);

	*problem = handler_problem(w);
	if (*problem != NULL)
		*problem = MemoryContextStrdup(w->cxt, *problem);
	s->legacy_rows = *problem == NULL && has_legacy_rows(w);
	return true;
}

/*
 * ---- Partitions ----
 */

static Part *
find_part(Worker *w, const char *topic, int32 partition)
{
	int			i;

	for (i = 0; i < w->nparts; i++)
		if (w->parts[i]->partition == partition && strcmp(w->parts[i]->topic, topic) == 0)
			return w->parts[i];
	return NULL;
}

static void
forget_part(Worker *w, const char *topic, int32 partition)
{
	int			i;

	for (i = 0; i < w->nparts; i++)
		if (w->parts[i]->partition == partition && strcmp(w->parts[i]->topic, topic) == 0)
		{
			if (w->parts[i]->last_error)
				pfree(w->parts[i]->last_error);
			pfree(w->parts[i]);
			w->parts[i] = w->parts[--w->nparts];
			return;
		}
}

/* the partition's state, made when it is met first (each palloc'd: stable) */
static Part *
add_part(Worker *w, const char *topic, int32 partition)
{
	Part	   *p = find_part(w, topic, partition);

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

/*
 * record_stop
 *		Mark the group's offsets row of topic/partition stopped (inside SPI,
 *		in the caller's transaction), making one at offset when there is
 *		none: a stopped partition stays stopped across restarts and
 *		rebalances until subscription_seek() clears the mark.
 */
static void
record_stop(Worker *w, const char *topic, int32 partition, int64 offset)
{
	Oid			types[4] = {TEXTOID, TEXTOID, INT4OID, INT8OID};
	Datum		args[4];

	args[0] = CStringGetTextDatum(w->sub.group_id);
	args[1] = CStringGetTextDatum(topic);
	args[2] = Int32GetDatum(partition);
	args[3] = Int64GetDatum(Max(offset, 0));
	if (SPI_execute_with_args("INSERT INTO outbox.inbox_offsets AS o (consumer_group, topic, kafka_partition,"
							  " next_offset, stopped_at) VALUES ($1, $2, $3, $4, pg_catalog.now())"
							  " ON CONFLICT (consumer_group, topic, kafka_partition)"
							  " DO UPDATE SET stopped_at = pg_catalog.now()",
							  4, types, args, NULL, false, 0) != SPI_OK_INSERT)
		elog(ERROR, "recording a stopped partition failed");
}

/* record_stop() in a transaction of its own, from the worker's loop */
static void
record_stop_now(Worker *w, const char *topic, int32 partition, int64 offset)
{
	MemoryContext old = CurrentMemoryContext;

	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	SPI_connect();
	PushActiveSnapshot(GetTransactionSnapshot());
	record_stop(w, topic, partition, offset);
	PopActiveSnapshot();
	SPI_finish();
	CommitTransactionCommand();
	MemoryContextSwitchTo(old);
}

/*
 * assigned_start
 *		Where the assigned partition a starts, in on_assignment's
 *		transaction: its stored next offset, stopped (a->stop) when the
 *		partition's log does not hold it; with no row, the beginning (-1),
 *		or for start_from latest the partition's end, recorded, so that a
 *		restart before the first message starts there too and loses
 *		nothing produced meanwhile.  The log's bounds are asked for until
 *		deadline; after it the fetch's own answer judges.
 */
static void
assigned_start(Worker *w, OutboxAssigned *a, TimestampTz deadline)
{
	Oid			types[4] = {TEXTOID, TEXTOID, INT4OID, INT8OID};
	Datum		args[4];
	bool		isnull;
	OutboxLogRange range;

	args[0] = CStringGetTextDatum(w->sub.group_id);
	args[1] = CStringGetTextDatum(a->topic);
	args[2] = Int32GetDatum(a->partition);
	if (SPI_execute_with_args("SELECT o.next_offset, o.stopped_at IS NOT NULL FROM outbox.inbox_offsets o"
							  " WHERE o.consumer_group OPERATOR(pg_catalog.=) $1"
							  " AND o.topic OPERATOR(pg_catalog.=) $2"
							  " AND o.kafka_partition OPERATOR(pg_catalog.=) $3",
							  3, types, args, NULL, false, 1) != SPI_OK_SELECT)
		elog(ERROR, "reading the offsets failed");
	a->offset = -1;
	a->stop = false;
	if (SPI_processed > 0)
	{
		bool		was_stopped = DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0],
															 SPI_tuptable->tupdesc, 2, &isnull));

		a->offset = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0],
												SPI_tuptable->tupdesc, 1, &isnull));

		/*
		 * Stopped once, stopped until subscription_seek(): a log that has
		 * grown past the offset since is still not the group's log.
		 */
		if (was_stopped)
		{
			a->stop = true;
			OutboxReportStoppedPartition(w->slot, w->sub.name, a->topic,
										 a->partition, a->offset, NULL);
		}
		else if (OutboxOffsetOutsideLog(w->consumer, a->topic, a->partition, a->offset,
										(int) TimestampDifferenceMilliseconds(GetCurrentTimestamp(),
																			  deadline),
										&range))
		{
			a->stop = true;
			record_stop(w, a->topic, a->partition, a->offset);
			OutboxReportStoppedPartition(w->slot, w->sub.name, a->topic,
										 a->partition, a->offset, &range);
		}
	}
	else if (!w->sub.earliest)
	{
		int64		end = OutboxConsumerQueryEnd(w->consumer, a->topic, a->partition, 5000);

		if (end < 0)
			elog(ERROR, "the end of partition %d of topic \"%s\" is not known",
				 a->partition, a->topic);
		args[3] = Int64GetDatum(end);
		if (SPI_execute_with_args("INSERT INTO outbox.inbox_offsets (consumer_group, topic, kafka_partition, next_offset)"
								  " VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING",
								  4, types, args, NULL, false, 0) != SPI_OK_INSERT)
			elog(ERROR, "recording where the partition starts failed");
		a->offset = end;
	}
}

/*
 * on_assignment
 *		The consumer's callback: partitions assigned start at the offsets
 *		the database holds (assigned_start); revoked ones are forgotten.
 *		The parked keys are read again: a partition may come from another
 *		subscription of the group, which dead-lettered some of its keys
 *		since this worker last read them.  Runs inside librdkafka's poll,
 *		so every error is caught here and answered with false (nothing is
 *		assigned, and the worker restarts).
 */
static bool
on_assignment(OutboxAssigned *assigned, int n, bool is_assign, void *arg)
{
	Worker	   *w = (Worker *) arg;
	MemoryContext old = CurrentMemoryContext;
	volatile bool ok = true;
	int			i;

	if (!is_assign)
	{
		for (i = 0; i < n; i++)
			forget_part(w, assigned[i].topic, assigned[i].partition);
		return true;
	}
	PG_TRY();
	{
		TimestampTz deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
														   ASSIGN_CHECK_MS);

		SetCurrentStatementStartTimestamp();
		StartTransactionCommand();
		SPI_connect();
		PushActiveSnapshot(GetTransactionSnapshot());
		for (i = 0; i < n; i++)
		{
			Part	   *p;

			assigned_start(w, &assigned[i], deadline);
			p = add_part(w, assigned[i].topic, assigned[i].partition);
			p->next_offset = assigned[i].offset;
			p->retry_offset = -1;
			p->retry_at = 0;
			p->attempts = 0;
			p->assigned = true;
			p->stopped = assigned[i].stop;
		}
		load_parked(w);
		PopActiveSnapshot();
		SPI_finish();
		CommitTransactionCommand();
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		MemoryContextSwitchTo(old);
		edata = CopyErrorData();
		FlushErrorState();
		AbortCurrentTransaction();
		OutboxInboxSetError(w->slot, edata->message);
		FreeErrorData(edata);
		ok = false;
	}
	PG_END_TRY();
	MemoryContextSwitchTo(old);
	return ok;
}

/*
 * ---- One message ----
 */

/* whether len bytes at s are text of the database's encoding (no NUL) */
static bool
is_text(const char *s, int len)
{
	return s != NULL && pg_verify_mbstr(GetDatabaseEncoding(), s, len, true);
}

/* whether name is one of the relay's own headers */
static bool
relay_header(const char *name)
{
	int			i;

	for (i = 0; i < OUTBOX_NUM_HEADERS; i++)
		if (strcmp(name, OutboxHeaderNames[i]) == 0)
			return true;
	return false;
}

/*
 * header
 *		The value of header name, NULL when absent or not text.  The relay
 *		writes its own headers first, then the caller's: for a relay name
 *		the first wins (a caller header of that name, which emit() refuses
 *		since 1.8, cannot override it); for any other the last wins.
 */
static const char *
header(const OutboxInbound *m, const char *name)
{
	int			i;
	const char *found = NULL;
	bool		first_wins = relay_header(name);

	for (i = 0; i < m->nheaders; i++)
		if (strcmp(m->header_names[i], name) == 0)
		{
			found = (m->header_values[i] != NULL &&
					 is_text(m->header_values[i], m->header_lens[i])) ?
				m->header_values[i] : NULL;
			if (first_wins)
				break;
		}
	return found;
}

/* whether header i repeats a relay header met before it (see header()) */
static bool
repeated_relay_header(const OutboxInbound *m, int i)
{
	int			j;

	if (!relay_header(m->header_names[i]))
		return false;
	for (j = 0; j < i; j++)
		if (strcmp(m->header_names[j], m->header_names[i]) == 0)
			return true;
	return false;
}

/* the id header as a uuid, when it is one */
static bool
event_id_of(const OutboxInbound *m, pg_uuid_t *out)
{
	const char *s = header(m, "id");
	int			i;
	int			j = 0;

	if (s == NULL || strlen(s) != 36)
		return false;
	for (i = 0; i < 36; i++)
	{
		char		c = s[i];

		if (i == 8 || i == 13 || i == 18 || i == 23)
		{
			if (c != '-')
				return false;
			continue;
		}
		if (!isxdigit((unsigned char) c))
			return false;
		{
			int			v = isdigit((unsigned char) c) ? c - '0' : (tolower((unsigned char) c) - 'a' + 10);

			if (j % 2 == 0)
				out->data[j / 2] = (unsigned char) (v << 4);
			else
				out->data[j / 2] |= (unsigned char) v;
			j++;
		}
	}
	return true;
}

static char *
headers_json(const OutboxInbound *m)
{
	StringInfoData buf;
	int			i;
	bool		first = true;

	initStringInfo(&buf);
	appendStringInfoChar(&buf, '{');
	for (i = 0; i < m->nheaders; i++)
	{
		const char *name = m->header_names[i];

		if (!is_text(name, strlen(name)) || repeated_relay_header(m, i))
			continue;
		if (!first)
			appendStringInfoString(&buf, ", ");
		first = false;
		escape_json(&buf, name);
		appendStringInfoString(&buf, ": ");
		if (m->header_values[i] != NULL && is_text(m->header_values[i], m->header_lens[i]))
			escape_json(&buf, m->header_values[i]);
		else
			appendStringInfoString(&buf, "null");
	}
	appendStringInfoChar(&buf, '}');
	return buf.data;
}

/*
 * message_datum
 *		The outbox.inbound_message of m.  With payload, the value is parsed
 *		as JSON (NULL when it is not JSON); may ERROR on a hostile value, so
 *		it is built inside the message's subtransaction.
 */
static Datum
message_datum(Worker *w, const OutboxInbound *m, bool payload)
{
	Datum		values[ATTRS];
	bool		nulls[ATTRS];
	pg_uuid_t  *id = palloc(sizeof(pg_uuid_t));
	const char *s;
	HeapTuple	tup;

	memset(nulls, 0, sizeof(nulls));
	values[0] = CStringGetTextDatum(w->sub.name);
	values[1] = CStringGetTextDatum(m->topic);
	values[2] = Int32GetDatum(m->partition);
	values[3] = Int64GetDatum(m->offset);
	/* a producer's CreateTime is anything: years 1970 to 5000 only */
	if (m->timestamp_ms >= 0 && m->timestamp_ms < INT64CONST(95617584000000))
		values[4] = TimestampTzGetDatum(timestamp_from_unix_ms(m->timestamp_ms));
	else
		nulls[4] = true;
	if (m->key != NULL && is_text(m->key, m->key_len))
		values[5] = CStringGetTextDatum(m->key);
	else
		nulls[5] = true;
	values[6] = DirectFunctionCall1(jsonb_in, CStringGetDatum(headers_json(m)));
	nulls[7] = true;
	if (payload && m->value != NULL && is_text(m->value, m->value_len) &&
		OutboxJsonIsValid(m->value, m->value_len))
	{
		values[7] = DirectFunctionCall1(jsonb_in, CStringGetDatum(m->value));
		nulls[7] = false;
	}
	if (m->value != NULL)
	{
		bytea	   *b = palloc(VARHDRSZ + m->value_len);

		SET_VARSIZE(b, VARHDRSZ + m->value_len);
		memcpy(VARDATA(b), m->value, m->value_len);
		values[8] = PointerGetDatum(b);
	}
	else
		nulls[8] = true;
	if (event_id_of(m, id))
		values[9] = UUIDPGetDatum(id);
	else
		nulls[9] = true;
	if ((s = header(m, "event_type")) != NULL)
		values[10] = CStringGetTextDatum(s);
	else
		nulls[10] = true;
	if ((s = header(m, "aggregate_type")) != NULL)
		values[11] = CStringGetTextDatum(s);
	else
		nulls[11] = true;
	if ((s = header(m, "aggregate_id")) != NULL)
		values[12] = CStringGetTextDatum(s);
	else
		nulls[12] = true;
	nulls[13] = true;
	if ((s = header(m, "seq")) != NULL)
	{
		char	   *end;
		long long	v;

		errno = 0;
		v = strtoll(s, &end, 10);
		if (errno == 0 && end != s && *end == '\0')
		{
			values[13] = Int64GetDatum((int64) v);
			nulls[13] = false;
		}
	}
	tup = heap_form_tuple(w->tupdesc, values, nulls);
	return HeapTupleGetDatum(tup);
}

/*
 * ---- Subtransactions ----
 */

typedef struct Failure
{
	char	   *message;
	char		sqlstate[6];
} Failure;

typedef void (*SubxactBody) (Worker *w, void *arg);

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
 * in_subxact
 *		Run body in a subtransaction of its own.  True when it ended
 *		without an error; else it is rolled back and f, when given, gets
 *		the error.  An error because the owner lost the right to run the
 *		handler (w->refused) is raised again: it ends the transaction and
 *		the worker, and costs no message an attempt.
 */
static bool
in_subxact(Worker *w, SubxactBody body, void *arg, Failure *f)
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

/*
 * dead_letter_datum
 *		The composite a dead letter keeps, payload parsed when that works:
 *		a value that makes the JSON parser ERROR is kept with payload NULL.
 */
typedef struct DatumBuild
{
	const OutboxInbound *m;
	Datum		result;
} DatumBuild;

static void
build_with_payload(Worker *w, void *arg)
{
	DatumBuild *b = (DatumBuild *) arg;

	b->result = message_datum(w, b->m, true);
}

static Datum
dead_letter_datum(Worker *w, const OutboxInbound *m)
{
	DatumBuild	b;

	b.m = m;
	if (in_subxact(w, build_with_payload, &b, NULL))
		return b.result;
	return message_datum(w, m, false);
}

/* attribute attno of a composite datum (an outbox.inbound_message) */
static Datum
message_attr(Worker *w, Datum message, int attno, bool *isnull)
{
	HeapTupleHeader th = DatumGetHeapTupleHeader(message);
	HeapTupleData tmp;

	tmp.t_len = HeapTupleHeaderGetDatumLength(th);
	ItemPointerSetInvalid(&(tmp.t_self));
	tmp.t_tableOid = InvalidOid;
	tmp.t_data = th;
	return heap_getattr(&tmp, attno, w->tupdesc, isnull);
}

/* the message's uuid field from its composite, or NULL */
static Datum
message_event_id(Worker *w, Datum message, bool *isnull)
{
	return message_attr(w, message, 10, isnull);
}

/*
 * dedupe_key
 *		The key of a message's dedupe row: its event id, scoped by its
 *		topic and its origin header (the database the relay sent it from),
 *		as a SHA-256 of the three cut to a UUID (version 8).  A writer that
 *		chooses the id of another topic's or database's event does not
 *		suppress it.  Read from the composite, so that a replayed dead
 *		letter gets the key its first try would have.
 */
static Datum
dedupe_key(Worker *w, Datum message, Datum id)
{
	pg_cryptohash_ctx *ctx = pg_cryptohash_create(PG_SHA256);
	bool		isnull;
	char	   *topic = TextDatumGetCString(message_attr(w, message, 2, &isnull));
	Datum		headers = message_attr(w, message, 7, &isnull);
	JsonbValue *origin = NULL;
	uint8		digest[PG_SHA256_DIGEST_LENGTH];
	pg_uuid_t  *key = palloc(sizeof(pg_uuid_t));

	if (!isnull)
		origin = getKeyJsonValueFromContainer(&DatumGetJsonbP(headers)->root,
											  "origin", 6, NULL);
	if (origin != NULL && origin->type != jbvString)
		origin = NULL;
	if (ctx == NULL || pg_cryptohash_init(ctx) < 0 ||
		pg_cryptohash_update(ctx, (const uint8 *) topic, strlen(topic) + 1) < 0 ||
		(origin != NULL &&
		 pg_cryptohash_update(ctx, (const uint8 *) origin->val.string.val,
							  origin->val.string.len) < 0) ||
		pg_cryptohash_update(ctx, (const uint8 *) "", 1) < 0 ||
		pg_cryptohash_update(ctx, DatumGetUUIDP(id)->data, UUID_LEN) < 0 ||
		pg_cryptohash_final(ctx, digest, sizeof(digest)) < 0)
		elog(ERROR, "could not compute a dedupe key");
	pg_cryptohash_free(ctx);
	memcpy(key->data, digest, UUID_LEN);
	key->data[6] = (key->data[6] & 0x0f) | 0x80;
	key->data[8] = (key->data[8] & 0x3f) | 0x80;
	return UUIDPGetDatum(key);
}

/*
 * is_duplicate
 *		Insert the message's dedupe row; true when it was there already.
 *		The group's rows of before 1.8 hold bare ids: while the group has
 *		any (they age out with outbox.inbox_retention), one of them counts
 *		too.
 */
static bool
is_duplicate(Worker *w, Datum message, Datum id)
{
	Datum		args[2];

	args[0] = CStringGetTextDatum(w->sub.dedupe_name);
	args[1] = dedupe_key(w, message, id);
	if (SPI_execute_plan(w->plan_dedupe, args, NULL, false, 0) != SPI_OK_INSERT)
		elog(ERROR, "inserting the dedupe row failed");
	if (SPI_processed == 0)
		return true;
	if (!w->sub.legacy_rows)
		return false;
	args[0] = CStringGetTextDatum(w->sub.legacy_name);
	args[1] = id;
	if (SPI_execute_plan(w->plan_legacy, args, NULL, false, 1) != SPI_OK_SELECT)
		elog(ERROR, "reading the dedupe rows failed");
	return SPI_processed > 0;
}

/*
 * apply_message
 *		Dedupe and hand one message to the handler, in the current
 *		(sub)transaction.  Returns false for a duplicate.  Errors propagate.
 *		Right before the call,
 *		the owner's right to run the handler is checked again: losing it
 *		stops the worker (w->refused), it is not the message's failure.
 */
static bool
apply_message(Worker *w, Datum message)
{
	bool		isnull;
	Datum		id = message_event_id(w, message, &isnull);
	Oid			save_user;
	int			save_sec;
	int			save_nestlevel;

	if (!isnull && is_duplicate(w, message, id))
		return false;
	if (!SearchSysCacheExists1(AUTHOID, ObjectIdGetDatum(w->sub.owner)) ||
		!OutboxRoleMayExecute(w->sub.owner, w->sub.handler))
	{
		w->refused = true;
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("outbox subscription \"%s\": its owner may no longer execute its handler",
						w->sub.name),
				 errdetail("The worker stops; it waits for the subscription to change.")));
	}

	CommandCounterIncrement();
	GetUserIdAndSecContext(&save_user, &save_sec);
	SetUserIdAndSecContext(w->sub.owner,
						   save_sec | SECURITY_LOCAL_USERID_CHANGE |
						   SECURITY_RESTRICTED_OPERATION);
	save_nestlevel = NewGUCNestLevel();
	(void) set_config_option("search_path", "", PGC_USERSET, PGC_S_SESSION,
							 GUC_ACTION_SAVE, true, 0, false);
	{
		LOCAL_FCINFO(fcinfo, 1);

		InitFunctionCallInfoData(*fcinfo, &w->handler, 1, InvalidOid, NULL, NULL);
		fcinfo->args[0].value = message;
		fcinfo->args[0].isnull = false;
		(void) FunctionCallInvoke(fcinfo);
	}
	AtEOXact_GUC(false, save_nestlevel);
	SetUserIdAndSecContext(save_user, save_sec);
	CommandCounterIncrement();
	return true;
}

/*
 * ---- Batches ----
 */

static int
effective_max_attempts(Worker *w)
{
	return w->sub.max_attempts > 0 ? w->sub.max_attempts : outbox_max_attempts;
}

/* backoff before attempt n+1, with full jitter over its upper half */
static int
backoff_ms(int attempts)
{
	double		ms = outbox_retry_backoff_min;
	int			i;

	for (i = 1; i < attempts && ms < outbox_retry_backoff_max; i++)
		ms *= 2;
	ms = Min(ms, (double) outbox_retry_backoff_max);
	return (int) (ms / 2 + (ms / 2) * pg_prng_double(&pg_global_prng_state));
}

static ParkedKey *
parked_head(Worker *w, const OutboxInbound *m)
{
	char		tag[PARKED_TAG_LEN];

	if (!w->sub.block || m->key == NULL || !is_text(m->key, m->key_len) ||
		hash_get_num_entries(w->parked) == 0)
		return NULL;
	parked_tag(m->topic, m->key, tag);
	return (ParkedKey *) hash_search(w->parked, tag, HASH_FIND, NULL);
}

static void
park_key(Worker *w, const char *topic, const char *key, int64 head)
{
	char		tag[PARKED_TAG_LEN];
	ParkedKey  *pk;
	bool		found;

	parked_tag(topic, key, tag);
	pk = (ParkedKey *) hash_search(w->parked, tag, HASH_ENTER, &found);
	if (!found)
		pk->head = head;
}

/*
 * dead_letter
 *		Insert m into outbox.inbox_dead_letters as state (dead or parked);
 *		returns the row's id (0 when it was there already).
 */
static int64
dead_letter(Worker *w, const OutboxInbound *m, Datum message, const char *state,
			int64 blocked_by, int attempts, const char *error,
			const char *sqlstate, TimestampTz first_failed)
{
	Datum		args[14];
	char		nulls[14];
	bool		isnull;
	Datum		id;

	memset(nulls, ' ', sizeof(nulls));
	args[0] = CStringGetTextDatum(w->sub.group_id);
	args[13] = CStringGetTextDatum(w->sub.name);
	args[1] = CStringGetTextDatum(m->topic);
	args[2] = Int32GetDatum(m->partition);
	args[3] = Int64GetDatum(m->offset);
	if (m->key != NULL && is_text(m->key, m->key_len))
		args[4] = CStringGetTextDatum(m->key);
	else
		nulls[4] = 'n';
	id = message_event_id(w, message, &isnull);
	args[5] = id;
	if (isnull)
		nulls[5] = 'n';
	args[6] = CStringGetTextDatum(state);
	args[7] = Int64GetDatum(blocked_by);
	if (blocked_by <= 0)
		nulls[7] = 'n';
	args[8] = Int32GetDatum(attempts);
	args[9] = error ? CStringGetTextDatum(error) : (Datum) 0;
	if (error == NULL)
		nulls[9] = 'n';
	args[10] = sqlstate ? CStringGetTextDatum(sqlstate) : (Datum) 0;
	if (sqlstate == NULL)
		nulls[10] = 'n';
	args[11] = message;
	args[12] = TimestampTzGetDatum(first_failed ? first_failed : GetCurrentTimestamp());
	if (SPI_execute_plan(w->plan_dead, args, nulls, false, 0) != SPI_OK_INSERT)
		elog(ERROR, "inserting a dead letter failed");
	if (SPI_processed == 0)
		return 0;
	/* the id of the row just inserted */
	if (SPI_execute("SELECT pg_catalog.currval('outbox.inbox_dead_letters_id_seq')", false, 1) != SPI_OK_SELECT)
		elog(ERROR, "reading the dead letter's id failed");
	return DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
}

static BatchPart *
batch_part(BatchPart *bps, int nbps, const OutboxInbound *m)
{
	int			i;

	for (i = 0; i < nbps; i++)
		if (bps[i].part->partition == m->partition &&
			strcmp(bps[i].part->topic, m->topic) == 0)
			return &bps[i];
	return NULL;
}

/*
 * lock_partitions
 *		Lock the offset row of each partition of the batch (making it when
 *		missing) and read its next offset.  A row another worker of the
 *		group moved since this one last knew it makes the parked keys read
 *		again, now that the lock orders the two (see on_assignment).  A row
 *		moved back (outbox.subscription_seek()) is not for this batch: the
 *		worker's position is past it.
 */
static int
lock_partitions(Worker *w, OutboxInbound *msgs, int n, BatchPart *bps)
{
	int			nbps = 0;
	bool		moved = false;
	int			i;

	for (i = 0; i < n; i++)
	{
		BatchPart  *bp = batch_part(bps, nbps, &msgs[i]);
		Datum		args[4];
		bool		isnull;

		if (bp != NULL)
			continue;
		bp = &bps[nbps++];
		bp->part = add_part(w, msgs[i].topic, msgs[i].partition);
		bp->stopped = false;
		bp->waiting = bp->part->retry_offset >= 0;
		args[0] = CStringGetTextDatum(w->sub.group_id);
		args[1] = CStringGetTextDatum(msgs[i].topic);
		args[2] = Int32GetDatum(msgs[i].partition);
		args[3] = Int64GetDatum(msgs[i].offset);
		if (SPI_execute_plan(w->plan_lock, args, NULL, false, 1) != SPI_OK_SELECT)
			elog(ERROR, "locking the offsets failed");
		if (SPI_processed == 0)
		{
			/* a first message: the row starts at it, then is locked */
			if (SPI_execute_plan(w->plan_insert_offset, args, NULL, false, 0) != SPI_OK_INSERT ||
				SPI_execute_plan(w->plan_lock, args, NULL, false, 1) != SPI_OK_SELECT ||
				SPI_processed == 0)
				elog(ERROR, "making the offsets row failed");
		}
		bp->stored = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0],
												 SPI_tuptable->tupdesc, 1, &isnull));
		bp->next = bp->stored;
		if (bp->part->next_offset >= 0 && bp->stored < bp->part->next_offset)
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("outbox subscription \"%s\": the next offset of partition %d of topic \"%s\" was moved back from " INT64_FORMAT " to " INT64_FORMAT,
							w->sub.name, bp->part->partition, bp->part->topic,
							bp->part->next_offset, bp->stored),
					 errdetail("The worker stops and starts again from the stored offset.")));
		if (bp->stored != bp->part->next_offset)
			moved = true;
	}
	if (moved)
		load_parked(w);
	return nbps;
}

/*
 * held_back
 *		Whether m must wait: its partition backs off after a failure, or m
 *		comes after the failed message, which must come again first (a
 *		message fetched before the rewind).
 */
static bool
held_back(BatchPart *bp, const OutboxInbound *m)
{
	Part	   *p = bp->part;

	if (bp->stopped || p->retry_at != 0)
		return true;
	if (bp->waiting)
	{
		if (m->offset > p->retry_offset)
		{
			/* the failed message was skipped: rewind again, at once */
			bp->stopped = true;
			p->retry_at = GetCurrentTimestamp();
			return true;
		}
		bp->waiting = false;
	}
	return false;
}

/* what try_all's and try_one's subtransactions work on */
typedef struct BatchWork
{
	OutboxInbound *msgs;
	int			n;
	Outcome    *out;
	int64	   *heads;
	BatchPart  *bps;
	int			nbps;
	const OutboxInbound *one;
	Outcome		one_out;
} BatchWork;

static void
apply_all(Worker *w, void *arg)
{
	BatchWork  *bw = (BatchWork *) arg;
	int			i;

	for (i = 0; i < bw->n; i++)
	{
		OutboxInbound *m = &bw->msgs[i];
		BatchPart  *bp = batch_part(bw->bps, bw->nbps, m);
		ParkedKey  *pk;

		if (m->offset < bp->next)
		{
			bw->out[i] = OUTCOME_OLD;
			continue;
		}
		if (held_back(bp, m))
		{
			bw->out[i] = OUTCOME_DROPPED;
			continue;
		}
		if ((pk = parked_head(w, m)) != NULL)
		{
			bw->heads[i] = pk->head;
			bw->out[i] = OUTCOME_PARKED;
			(void) dead_letter(w, m, dead_letter_datum(w, m),
							   "parked", pk->head, 0, NULL, NULL, 0);
		}
		else
			bw->out[i] = apply_message(w, message_datum(w, m, true)) ?
				OUTCOME_APPLIED : OUTCOME_DUPLICATE;
		bp->next = m->offset + 1;
	}
}

/*
 * try_all
 *		Apply every applicable message in one subtransaction.  False (and
 *		everything rolled back) when anything failed.
 */
static bool
try_all(Worker *w, OutboxInbound *msgs, int n, Outcome *out, int64 *heads,
		BatchPart *bps, int nbps)
{
	BatchWork	bw = {msgs, n, out, heads, bps, nbps, NULL, OUTCOME_NONE};
	int			i;

	if (in_subxact(w, apply_all, &bw, NULL))
		return true;
	for (i = 0; i < nbps; i++)
	{
		bps[i].next = bps[i].stored;
		bps[i].stopped = false;
		bps[i].waiting = bps[i].part->retry_offset >= 0;
	}
	return false;
}

static void
apply_one(Worker *w, void *arg)
{
	BatchWork  *bw = (BatchWork *) arg;

	/* a value jsonb refuses (\u0000) arrives with payload NULL */
	bw->one_out = apply_message(w, dead_letter_datum(w, bw->one)) ?
		OUTCOME_APPLIED : OUTCOME_DUPLICATE;
}

/*
 * try_one
 *		Apply one message in a subtransaction of its own.  On failure the
 *		error's text and SQLSTATE go into *f.
 */
static Outcome
try_one(Worker *w, const OutboxInbound *m, Failure *f)
{
	BatchWork	bw;

	memset(&bw, 0, sizeof(bw));
	bw.one = m;
	return in_subxact(w, apply_one, &bw, f) ? bw.one_out : OUTCOME_FAILED;
}

/* one by one, after try_all failed: failures stop their partition */
static void
try_each(Worker *w, OutboxInbound *msgs, int n, Outcome *out, int64 *heads,
		 BatchPart *bps, int nbps)
{
	int			i;

	for (i = 0; i < n; i++)
	{
		const OutboxInbound *m = &msgs[i];
		BatchPart  *bp = batch_part(bps, nbps, m);
		Part	   *p = bp->part;
		ParkedKey  *pk;
		Failure		f;

		if (m->offset < bp->next)
		{
			out[i] = OUTCOME_OLD;
			continue;
		}
		if (held_back(bp, m))
		{
			out[i] = OUTCOME_DROPPED;
			continue;
		}
		if ((pk = parked_head(w, m)) != NULL)
		{
			heads[i] = pk->head;
			out[i] = OUTCOME_PARKED;
			(void) dead_letter(w, m, dead_letter_datum(w, m), "parked",
							   pk->head, 0, NULL, NULL, 0);
			bp->next = m->offset + 1;
			continue;
		}
		out[i] = try_one(w, m, &f);
		if (out[i] != OUTCOME_FAILED)
		{
			bp->next = m->offset + 1;
			continue;
		}

		/* the same message failing again, or a first failure */
		if (p->retry_offset != m->offset)
		{
			p->retry_offset = m->offset;
			p->attempts = 0;
		}
		p->attempts++;
		if (p->last_error)
			pfree(p->last_error);
		p->last_error = MemoryContextStrdup(w->cxt, f.message);
		strlcpy(p->last_sqlstate, f.sqlstate, sizeof(p->last_sqlstate));
		OutboxInboxSetError(w->slot, f.message);
		if (p->attempts >= effective_max_attempts(w))
		{
			int64		id = dead_letter(w, m, dead_letter_datum(w, m), "dead", 0,
										 p->attempts, f.message, f.sqlstate, 0);

			out[i] = OUTCOME_DEAD;
			if (w->sub.block && m->key != NULL && is_text(m->key, m->key_len) && id > 0)
				park_key(w, m->topic, m->key, id);
			p->retry_offset = -1;
			p->attempts = 0;
			bp->next = m->offset + 1;
			continue;
		}
		bp->stopped = true;
		p->retry_at = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
												  backoff_ms(p->attempts));
	}
}

/*
 * apply_batch
 *		Apply n messages in one transaction: see the invariants.
 */
static void
apply_batch(Worker *w, OutboxInbound *msgs, int n)
{
	BatchPart  *bps = palloc(sizeof(BatchPart) * n);
	Outcome    *out = palloc0(sizeof(Outcome) * n);
	int64	   *heads = palloc0(sizeof(int64) * n);
	OutboxInboxTally tally;
	int			nbps;
	int			i;

	memset(&tally, 0, sizeof(tally));
	/* now() in the worker's SQL: nobody else sets it in a background worker */
	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	SPI_connect();
	PushActiveSnapshot(GetTransactionSnapshot());
	check_handler(w);
	nbps = lock_partitions(w, msgs, n, bps);
	if (!try_all(w, msgs, n, out, heads, bps, nbps))
	{
		memset(out, 0, sizeof(Outcome) * n);
		try_each(w, msgs, n, out, heads, bps, nbps);
	}
	for (i = 0; i < nbps; i++)
	{
		Datum		args[4];

		if (bps[i].next <= bps[i].stored)
			continue;
		args[0] = CStringGetTextDatum(w->sub.group_id);
		args[1] = CStringGetTextDatum(bps[i].part->topic);
		args[2] = Int32GetDatum(bps[i].part->partition);
		args[3] = Int64GetDatum(bps[i].next);
		if (SPI_execute_plan(w->plan_update_offset, args, NULL, false, 0) != SPI_OK_UPDATE)
			elog(ERROR, "saving the offsets failed");
	}
	PopActiveSnapshot();
	SPI_finish();
	CommitTransactionCommand();

	/* committed: tell Kafka and the slot, rewind the stopped partitions */
	for (i = 0; i < n; i++)
	{
		switch (out[i])
		{
			case OUTCOME_APPLIED:
				tally.processed++;
				break;
			case OUTCOME_OLD:
			case OUTCOME_DUPLICATE:
				tally.deduplicated++;
				break;
			case OUTCOME_PARKED:
				tally.parked++;
				break;
			case OUTCOME_DEAD:
				tally.failed++;
				tally.dead_lettered++;
				break;
			case OUTCOME_FAILED:
				tally.failed++;
				break;
			default:
				break;
		}
	}
	for (i = 0; i < nbps; i++)
	{
		Part	   *p = bps[i].part;

		if (bps[i].next > bps[i].stored)
			OutboxConsumerCommit(w->consumer, p->topic, p->partition, bps[i].next);
		p->next_offset = bps[i].next;
		if (bps[i].stopped)
			OutboxConsumerRewind(w->consumer, p->topic, p->partition, p->retry_offset);
		else if (p->retry_offset >= 0 && p->retry_offset < bps[i].next)
		{
			p->retry_offset = -1;
			p->attempts = 0;
		}
	}
	OutboxInboxReport(w->slot, &tally, NULL, -1);
}

/*
 * ---- Replays and parked keys ----
 */

/* the keys with dead letters, parked behind them under the block policy */
static void
load_parked(Worker *w)
{
	HASHCTL		ctl;
	Oid			types[1] = {TEXTOID};
	Datum		args[1];
	uint64		i;

	if (w->parked != NULL)
		hash_destroy(w->parked);
	memset(&ctl, 0, sizeof(ctl));
	ctl.keysize = PARKED_TAG_LEN;
	ctl.entrysize = sizeof(ParkedKey);
	ctl.hcxt = w->cxt;
	w->parked = hash_create("outbox parked keys", 64, &ctl, HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
	if (!w->sub.block)
		return;
	args[0] = CStringGetTextDatum(w->sub.group_id);

	/*
	 * Not read-only: a snapshot of its own, taken now.  A batch calls this
	 * after waiting for a partition's row, and must see the dead letters
	 * the worker it waited for committed.
	 */
	if (SPI_execute_with_args("SELECT d.topic, d.key, pg_catalog.min(d.id) FROM outbox.inbox_dead_letters d"
							  " WHERE d.consumer_group OPERATOR(pg_catalog.=) $1 AND d.key IS NOT NULL"
							  " GROUP BY d.topic, d.key",
							  1, types, args, NULL, false, 0) != SPI_OK_SELECT)
		elog(ERROR, "reading the parked keys failed");
	for (i = 0; i < SPI_processed; i++)
	{
		bool		isnull;
		HeapTuple	t = SPI_tuptable->vals[i];
		char	   *topic = TextDatumGetCString(SPI_getbinval(t, SPI_tuptable->tupdesc, 1, &isnull));
		char	   *key = TextDatumGetCString(SPI_getbinval(t, SPI_tuptable->tupdesc, 2, &isnull));

		park_key(w, topic, key,
				 DatumGetInt64(SPI_getbinval(t, SPI_tuptable->tupdesc, 3, &isnull)));
	}
}

/* what a replay's subtransaction works on */
typedef struct ReplayWork
{
	Datum		message;
	bool		applied;
} ReplayWork;

static void
apply_replay(Worker *w, void *arg)
{
	ReplayWork *rw = (ReplayWork *) arg;

	rw->applied = apply_message(w, rw->message);
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
	char		tag[PARKED_TAG_LEN];
	ParkedKey  *fk = NULL;
	ReplayWork	rw;
	Failure		f;
	Oid			types[5] = {INT8OID, INT4OID, INT8OID, TEXTOID, TEXTOID};
	Datum		upd[5];
	char		nulls[5] = {' ', ' ', ' ', ' ', ' '};

	rw.message = SPI_datumTransfer(SPI_getbinval(t, rows->tupdesc, 4, &isnull), false, -1);
	if (!key_null)
	{
		parked_tag(topic, TextDatumGetCString(keyd), tag);
		fk = (ParkedKey *) hash_search(failed_keys, tag, HASH_FIND, NULL);
	}
	upd[0] = Int64GetDatum(id);
	if (fk != NULL)
	{
		upd[2] = Int64GetDatum(fk->head);
		if (SPI_execute_with_args("UPDATE outbox.inbox_dead_letters SET state = 'parked', blocked_by = $3"
								  " WHERE id OPERATOR(pg_catalog.=) $1",
								  3, types, upd, nulls, false, 0) != SPI_OK_UPDATE)
			elog(ERROR, "parking a replay failed");
		return;
	}
	if (in_subxact(w, apply_replay, &rw, &f))
	{
		if (rw.applied)
			tally->processed++;
		else
			tally->deduplicated++;
		if (SPI_execute_with_args("DELETE FROM outbox.inbox_dead_letters WHERE id OPERATOR(pg_catalog.=) $1",
								  1, types, upd, NULL, false, 0) != SPI_OK_DELETE)
			elog(ERROR, "deleting a replayed dead letter failed");
		return;
	}
	tally->failed++;
	OutboxInboxSetError(w->slot, f.message);
	upd[1] = Int32GetDatum(attempts + 1);
	nulls[2] = 'n';
	upd[3] = CStringGetTextDatum(f.message);
	upd[4] = CStringGetTextDatum(f.sqlstate);
	if (SPI_execute_with_args("UPDATE outbox.inbox_dead_letters SET state = 'dead', blocked_by = $3,"
							  " attempts = $2, last_error = $4, last_sqlstate = $5,"
							  " last_failed_at = pg_catalog.now()"
							  " WHERE id OPERATOR(pg_catalog.=) $1",
							  5, types, upd, nulls, false, 0) != SPI_OK_UPDATE)
		elog(ERROR, "recording a failed replay failed");
	if (!key_null)
	{
		bool		found;

		fk = (ParkedKey *) hash_search(failed_keys, tag, HASH_ENTER, &found);
		fk->head = id;
	}
}

/*
 * run_replays
 *		Apply, in id order, the dead letters queued by inbox_replay() and
 *		the parked ones whose key has no dead message left.  A failure
 *		sends a row back to dead and parks the later rows of its key behind
 *		it.  Then the parked keys are read again.  Returns rows looked at.
 *		The handler is checked as for a batch before the first row.
 */
static int
run_replays(Worker *w)
{
	Oid			types[1] = {TEXTOID};
	Datum		args[1];
	uint64		n;
	uint64		i;
	HTAB	   *failed_keys;
	HASHCTL		ctl;
	OutboxInboxTally tally;

	memset(&tally, 0, sizeof(tally));
	memset(&ctl, 0, sizeof(ctl));
	ctl.keysize = PARKED_TAG_LEN;
	ctl.entrysize = sizeof(ParkedKey);
	ctl.hcxt = CurrentMemoryContext;
	failed_keys = hash_create("outbox replay failures", 16, &ctl,
							  HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);

	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	SPI_connect();
	PushActiveSnapshot(GetTransactionSnapshot());
	args[0] = CStringGetTextDatum(w->sub.group_id);
	if (SPI_execute_with_args("SELECT d.id, d.topic, d.key, d.message, d.attempts FROM outbox.inbox_dead_letters d"
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
							  1, types, args, NULL, false, 0) != SPI_OK_SELECT)
		elog(ERROR, "reading the replays failed");
	n = SPI_processed;
	if (n > 0)
	{
		SPITupleTable *rows = SPI_tuptable;

		check_handler(w);
		for (i = 0; i < n; i++)
			replay_row(w, rows, i, failed_keys, &tally);
	}
	load_parked(w);
	PopActiveSnapshot();
	SPI_finish();
	CommitTransactionCommand();
	OutboxInboxReport(w->slot, &tally, NULL, -1);
	hash_destroy(failed_keys);
	return (int) n;
}

/*
 * ---- The loop ----
 */

/*
 * take_resets
 *		The partitions the consumer found outside their log since the last
 *		poll: stopped, paused and reported.  A logical offset (the log's
 *		beginning) that could not be looked up is tried again later.
 */
static void
take_resets(Worker *w)
{
	OutboxAssigned *resets;
	int			n = OutboxConsumerTakeResets(w->consumer, &resets);
	int			i;

	for (i = 0; i < n; i++)
	{
		OutboxAssigned *r = &resets[i];
		Part	   *p = find_part(w, r->topic, r->partition);
		OutboxLogRange range;
		bool		known;
		int64		next;

		if (p == NULL || !p->assigned || p->stopped)
			continue;
		if (r->offset < 0)
		{
			/*
			 * The log's beginning or end could not be looked up (a topic
			 * still being made): librdkafka stops fetching the partition
			 * and no seek restarts it, so the consumer is made again, and
			 * the assignment starts the partition afresh, after a pause.
			 */
			w->rejoin = true;
			w->consumer_retry_at = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
															   RESET_RETRY_MS);
			continue;
		}
		p->stopped = true;
		OutboxConsumerPause(w->consumer, r->topic, r->partition);
		/* the group's next offset, not the position the fetch reached */
		next = p->next_offset >= 0 ? p->next_offset : r->offset;
		record_stop_now(w, r->topic, r->partition, next);
		known = OutboxConsumerQueryLog(w->consumer, r->topic, r->partition,
									   RESET_CHECK_MS, &range.low, &range.high);
		OutboxReportStoppedPartition(w->slot, w->sub.name, r->topic, r->partition,
									 next, known ? &range : NULL);
	}
}

/* the messages of the batch minus those of stopped partitions; how many */
static int
drop_stopped(Worker *w, OutboxInbound *msgs, int n)
{
	bool		any = false;
	int			kept = 0;
	int			i;

	for (i = 0; i < w->nparts; i++)
		any |= w->parts[i]->stopped;
	if (!any)
		return n;
	for (i = 0; i < n; i++)
	{
		Part	   *p = find_part(w, msgs[i].topic, msgs[i].partition);

		if (p != NULL && p->stopped)
			continue;
		if (kept != i)
			msgs[kept] = msgs[i];
		kept++;
	}
	return kept;
}

static void
report_parts(Worker *w)
{
	OutboxInboxPart *parts = palloc0(sizeof(OutboxInboxPart) * Max(1, w->nparts));
	OutboxInboxTally none;
	int			n;
	int			i;

	memset(&none, 0, sizeof(none));
	n = 0;
	for (i = 0; i < w->nparts && n < OUTBOX_INBOX_PARTS_MAX; i++)
	{
		Part	   *p = w->parts[i];

		if (!p->assigned)
			continue;
		strlcpy(parts[n].topic, p->topic, sizeof(parts[n].topic));
		parts[n].partition = p->partition;
		parts[n].next_offset = p->next_offset;
		/* a stopped partition's lag is not known: its log is another */
		parts[n].high = w->consumer && !p->stopped ?
			OutboxConsumerHighWatermark(w->consumer, p->topic, p->partition) : -1;
		n++;
	}
	OutboxInboxReport(w->slot, &none, parts, n);
	pfree(parts);
}

/* resume partitions whose backoff is over; returns ms to the next one */
static long
resume_due(Worker *w)
{
	TimestampTz now = GetCurrentTimestamp();
	long		next = WAIT_IDLE_MS;
	bool		retrying = false;
	bool		stopped = false;
	int			i;

	for (i = 0; i < w->nparts; i++)
	{
		Part	   *p = w->parts[i];

		stopped |= p->stopped && p->assigned;
		if (p->retry_at == 0)
			continue;
		if (p->retry_at <= now)
		{
			p->retry_at = 0;
			OutboxConsumerResume(w->consumer, p->topic, p->partition);
		}
		else
		{
			retrying = true;
			next = Min(next, Max(1, TimestampDifferenceMilliseconds(now, p->retry_at)));
		}
	}
	OutboxInboxSetState(w->slot, stopped ? OUTBOX_INBOX_PARTITION_STOPPED :
						retrying ? OUTBOX_INBOX_RETRYING : OUTBOX_INBOX_RUNNING);
	return next;
}

static void
worker_wait(Worker *w, long timeout)
{
	WaitEvent	events[3];
	int			n;
	int			i;

	pgstat_report_activity(STATE_IDLE, NULL);
	n = WaitEventSetWait(w->wait_set, timeout, events, lengthof(events),
						 OutboxWaitEvent(&wait_main_event, "OutboxSubscription"));
	for (i = 0; i < n; i++)
	{
		if (events[i].events & WL_LATCH_SET)
			ResetLatch(MyLatch);
		if (events[i].events & WL_SOCKET_READABLE)
		{
			char		drain[64];

			while (read(w->event_pipe[0], drain, sizeof(drain)) > 0)
				;
		}
	}
}

static void
worker_detach(int code, Datum arg)
{
	Worker	   *w = (Worker *) DatumGetPointer(arg);

	if (w->consumer != NULL)
	{
		/* leave the group, so that its partitions move at once */
		OutboxConsumerDestroy(w->consumer, CLOSE_TIMEOUT_MS);
		w->consumer = NULL;
	}
	OutboxInboxDetach(w->slot);
}

/* build the consumer when there is none and it is time; false: not now */
static bool
ensure_consumer(Worker *w)
{
	char	   *why = NULL;
	char		client_id[OUTBOX_SUBSCRIPTION_NAME_MAX + 16];

	if (w->consumer != NULL && (OutboxConsumerOutdated(w->consumer) || w->rejoin))
	{
		w->rejoin = false;
		/* new settings: leave the group, join again */
		OutboxConsumerDestroy(w->consumer, CLOSE_TIMEOUT_MS);
		w->consumer = NULL;
		w->nparts = 0;
	}
	if (w->consumer != NULL)
		return true;
	if (outbox_kafka_brokers[0] == '\0')
	{
		OutboxInboxSetState(w->slot, OUTBOX_INBOX_NOT_CONFIGURED);
		return false;
	}
	if (GetCurrentTimestamp() < w->consumer_retry_at)
		return false;
	snprintf(client_id, sizeof(client_id), "outbox-%s", w->sub.name);
	w->consumer = OutboxConsumerCreate(w->sub.kafka_group, client_id,
									   w->sub.topics, w->sub.ntopics,
									   w->event_pipe[1], on_assignment, w, &why);
	if (w->consumer == NULL)
	{
		OutboxInboxSetError(w->slot, why);
		OutboxInboxSetState(w->slot, OUTBOX_INBOX_NOT_CONFIGURED);
		ereport(WARNING,
				(errmsg("outbox subscription \"%s\" cannot consume: %s", w->sub.name, why)));
		w->consumer_retry_at = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), 10000);
		return false;
	}
	return true;
}

/* whether handler_problem() finds nothing now (a grant or owner put back) */
static bool
problem_gone(Worker *w)
{
	bool		gone;

	MemoryContextReset(w->batch_cxt);
	MemoryContextSwitchTo(w->batch_cxt);
	StartTransactionCommand();
	PushActiveSnapshot(GetTransactionSnapshot());
	gone = handler_problem(w) == NULL;
	PopActiveSnapshot();
	CommitTransactionCommand();
	MemoryContextSwitchTo(w->batch_cxt);
	return gone;
}

/*
 * wait_for_change
 *		The worker cannot run its handler: say why, then wait until the
 *		subscription's row changes, or (every 10 s) the problem is gone,
 *		and exit for the launcher to start it again.  Never returns.
 */
static void
wait_for_change(Worker *w, const char *name, const char *problem)
{
	bool		recheck = w->sub.name[0] != '\0';	/* the row was read */

	OutboxInboxSetError(w->slot, problem);
	OutboxInboxSetState(w->slot, OUTBOX_INBOX_NOT_CONFIGURED);
	ereport(WARNING,
			(errcode(strstr(problem, "ALTER EXTENSION") != NULL ?
					 ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE : ERRCODE_INSUFFICIENT_PRIVILEGE),
			 errmsg("outbox subscription \"%s\" cannot run its handler: %s", name, problem)));
	while (!OutboxInboxTakeChanged(w->slot))
	{
		CHECK_FOR_INTERRUPTS();
		worker_wait(w, 10000);
		if (recheck && problem_gone(w))
			break;
	}
	proc_exit(0);
}

/*
 * OutboxConsumerMain
 *		Entry point of a subscription worker: main_arg is its slot, and
 *		bgw_extra holds its database's OID and the subscription's name.
 */
void
OutboxConsumerMain(Datum main_arg)
{
	Worker	   *w = &worker;
	Oid			dboid;
	char		name[OUTBOX_SUBSCRIPTION_NAME_MAX];
	char	   *problem = NULL;
	bool		present;
	OutboxInbound *msgs;

	memcpy(&dboid, MyBgworkerEntry->bgw_extra, sizeof(Oid));
	strlcpy(name, MyBgworkerEntry->bgw_extra + sizeof(Oid), sizeof(name));
	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	/* die(): a handler that loops or waits is interrupted too */
	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();

	w->slot = OutboxInboxAttach(DatumGetInt32(main_arg), dboid, name);
	if (w->slot == NULL)
		proc_exit(0);
	before_shmem_exit(worker_detach, PointerGetDatum(w));
	BackgroundWorkerInitializeConnectionByOid(dboid, InvalidOid, 0);
	w->cxt = AllocSetContextCreate(TopMemoryContext, "outbox subscription",
								   ALLOCSET_DEFAULT_SIZES);
	w->batch_cxt = AllocSetContextCreate(w->cxt, "outbox subscription batch",
										 ALLOCSET_DEFAULT_SIZES);
	w->wait_set = OutboxWorkerStart(w->cxt, w->event_pipe, "subscription");
	OutboxKafkaReadSecretsFile(w->cxt);

	StartTransactionCommand();
	SPI_connect();
	PushActiveSnapshot(GetTransactionSnapshot());
	present = load_subscription(w, name, &problem);
	if (present && problem == NULL)
	{
		prepare_plans(w);
		load_parked(w);
	}
	PopActiveSnapshot();
	SPI_finish();
	CommitTransactionCommand();
	if (!present)
	{
		OutboxInboxMarkGone(w->slot);
		ereport(LOG, (errmsg("outbox subscription \"%s\" is gone: its worker stops", name)));
		proc_exit(0);
	}
	if (problem != NULL)
		wait_for_change(w, name, problem);
	ereport(LOG,
			(errmsg("outbox subscription \"%s\" started", name),
			 errdetail("group \"%s\", %d topics, batch_size %d", w->sub.group_id,
					   w->sub.ntopics, w->sub.batch_size)));
	msgs = MemoryContextAlloc(w->cxt, sizeof(OutboxInbound) * w->sub.batch_size);

	for (;;)
	{
		long		timeout;
		int			n = 0;
		int			kept;
		TimestampTz now;

		CHECK_FOR_INTERRUPTS();
		MemoryContextReset(w->batch_cxt);
		MemoryContextSwitchTo(w->batch_cxt);
		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
			OutboxKafkaReadSecretsFile(w->cxt);
		}
		if (OutboxInboxTakeChanged(w->slot) || OutboxInboxIsHeld(w->slot))
			break;				/* the launcher starts a worker that reads the row again */
		now = GetCurrentTimestamp();
		if (OutboxInboxTakeWake(w->slot) ||
			TimestampDifferenceExceeds(w->last_replay_check, now, REPLAY_CHECK_MS))
		{
			w->last_replay_check = now;
			while (run_replays(w) == REPLAY_PAGE)
				CHECK_FOR_INTERRUPTS();
		}
		if (!ensure_consumer(w))
		{
			worker_wait(w, WAIT_IDLE_MS);
			continue;
		}
		timeout = resume_due(w);
		/* librdkafka is on the stack in its callbacks: no exit from there */
		HOLD_INTERRUPTS();
		n = OutboxConsumerPoll(w->consumer, msgs, w->sub.batch_size, w->batch_cxt);
		RESUME_INTERRUPTS();
		if (OutboxConsumerFailed(w->consumer))
			ereport(ERROR,
					(errmsg("outbox subscription \"%s\" could not read its offsets for an assignment",
							name)));
		{
			char		err[OUTBOX_LAST_ERROR_LEN];

			if (OutboxConsumerTakeError(w->consumer, err, sizeof(err)))
				OutboxInboxSetError(w->slot, err);
		}
		take_resets(w);
		kept = drop_stopped(w, msgs, n);
		if (kept > 0)
			apply_batch(w, msgs, kept);
		if (kept > 0 || TimestampDifferenceExceeds(w->last_report, now, WAIT_IDLE_MS))
		{
			report_parts(w);
			w->last_report = now;
		}
		/* a full batch may leave more in the queue, which wakes nobody */
		if (n < w->sub.batch_size)
			worker_wait(w, timeout);
	}
	ereport(LOG, (errmsg("outbox subscription \"%s\" stops", name)));
	proc_exit(0);
}
