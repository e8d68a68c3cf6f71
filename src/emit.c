/*-------------------------------------------------------------------------
 *
 * emit.c
 *		outbox.emit(): validate an event and insert it into outbox.events.
 *
 * One event goes through three steps, in this order: validate the
 * arguments (check_content, then check_envelope), resolve its topic
 * (OutboxTopicResolve, topic.c, between the two: the order of the checks
 * is the order of the errors a user sees), insert the row (insert_event),
 * numbered by the per-aggregate sequence (sequence.c).
 *
 * Invariants:
 *	- emit() never talks to Kafka.  It inserts one row in the caller's
 *	  transaction, so commit makes the event durable with the business data
 *	  and rollback removes both.
 *	- The event row is written without an INSERT statement (insert_direct:
 *	  the heap tuple and its index entries, as the INSERT would write them)
 *	  while outbox.events is the table emit() knows; one a superuser has
 *	  changed (a trigger, constraint, column, type or default) gets the
 *	  INSERT (direct_table).
 *	- With outbox.aggregate_sequence on, the transaction's first event of
 *	  an aggregate takes its seq from its counter row, which locks the row
 *	  before the event row's id is drawn; later ones take the seq
 *	  sequence.c gives out from memory.  sequence.c's header says why that
 *	  keeps seq gapless and in commit order.  The row is looked for where
 *	  counter.c last saw it before the primary key is descended; either
 *	  way it is the version the statement's snapshot sees, with the
 *	  aggregate's key (counter_find).
 *	- Everything a relay needs is resolved here, once: event id (UUIDv7),
 *	  topic (validated as a legal Kafka name), key, tenant, traceparent.
 *	- Every argument is hostile input: an event emit() accepts cannot
 *	  forge the relay's own headers, write to a topic outbox.allowed_topics
 *	  does not allow, carry an occurred_at that is not RFC 3339, or be
 *	  larger than librdkafka accepts (message.max.bytes, counted as
 *	  librdkafka counts it, with every header the relay will send).
 *	- The payload is turned to JSON text once, for its size; the row gets
 *	  the jsonb value and the wire size reuses that length.
 *	- A transaction that emitted wakes its database's relay when it commits
 *	  (a latch in shared memory); an aborted or prepared one wakes nobody
 *	  (COMMIT PREPARED does, utility.c).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/pg_am.h"
#include "catalog/pg_collation.h"
#include "catalog/pg_index.h"
#include "catalog/pg_proc.h"
#include "catalog/pg_trigger.h"
#include "catalog/pg_type.h"
#include "commands/defrem.h"
#include "commands/sequence.h"
#include "executor/spi.h"
#include "executor/tuptable.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "nodes/makefuncs.h"
#include "nodes/primnodes.h"
#include "rewrite/rewriteHandler.h"
#include "tcop/utility.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/guc.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/relcache.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
#include "utils/datetime.h"
#include "utils/jsonb.h"
#include "utils/timestamp.h"
#include "utils/uuid.h"
#include "utils/xid8.h"

#include "compat.h"
#include "outbox.h"

PG_FUNCTION_INFO_V1(outbox_emit);
PG_FUNCTION_INFO_V1(outbox_uuid_v7);
PG_FUNCTION_INFO_V1(outbox_notify_relay);

/*
 * emit()'s statements.  The event insert's parameters $1..$12 are the
 * event's, $13 its seq (NULL with the sequence off); the direct insert
 * takes the same array.  Operators are schema-qualified because emit()
 * runs as the extension owner.
 */
#define EMIT_NARGS 13

/* the event row when the direct insert cannot take it (direct_table) */
static const char *const event_insert_sql =
	"INSERT INTO outbox.events (event_id, aggregate_type, aggregate_id, seq,"
	" event_type, schema_version, topic, key, payload, headers, tenant,"
	" traceparent, occurred_at)"
	" VALUES ($1, $2, $3, $13, $4, $5, $6, $7, $8, $9, $10, $11, $12)";

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

static SPIPlanPtr event_insert_plan;
static SPIPlanPtr counter_update_plan;

/*
 * One event on its way into outbox.events: the arguments as checked, and
 * event, what the relay will send, as far as the size check counts it.
 * Everything is palloc'd in the caller's context or points into its
 * arguments.
 */
typedef struct EmitRow
{
	text	   *aggregate_type;
	text	   *aggregate_id;
	text	   *event_type;
	Jsonb	   *payload;
	Jsonb	   *headers;		/* NULL: none */
	char	   *topic;
	text	   *key;			/* the aggregate id when none was given */
	pg_uuid_t  *event_id;
	TimestampTz occurred_at;
	OutboxEvent event;
} EmitRow;

/* set by emit(), consumed by the transaction callback */
static bool wake_at_commit = false;
static bool replay_at_commit = false;
static int	events_this_xact = 0;

/* last UUIDv7 timestamp of this backend, in 1/4096 ms since 1970 */
static int64 uuid_last_tick = 0;

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

static bool
is_lower_hex(const char *s, int n, bool *all_zero)
{
	int			i;

	*all_zero = true;
	for (i = 0; i < n; i++)
	{
		if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
			return false;
		if (s[i] != '0')
			*all_zero = false;
	}
	return true;
}

/*
 * OutboxTraceparentIsValid
 *		Whether value is a W3C Trace Context traceparent header.
 *
 * Version 00 is exactly "vv-<32 hex>-<16 hex>-<2 hex>"; a later version may
 * append "-..." fields.  Version ff and all-zero ids are invalid.
 */
bool
OutboxTraceparentIsValid(const char *value)
{
	size_t		len = strlen(value);
	bool		zero;

	if (len < 55)
		return false;
	if (!is_lower_hex(value, 2, &zero) || strncmp(value, "ff", 2) == 0)
		return false;
	if (value[2] != '-' || value[35] != '-' || value[52] != '-')
		return false;
	if (!is_lower_hex(value + 3, 32, &zero) || zero)
		return false;
	if (!is_lower_hex(value + 36, 16, &zero) || zero)
		return false;
	if (!is_lower_hex(value + 53, 2, &zero))
		return false;
	if (strncmp(value, "00", 2) == 0)
		return len == 55;
	return len == 55 || value[55] == '-';
}

/*
 * uuid_random_bytes
 *		8 bytes from pg_strong_random() into out, drawn UUID_RANDOM_BATCH
 *		ids at a time: each call of pg_strong_random() takes OpenSSL's
 *		locks and checks, which cost an emit() more than the bytes (0.8
 *		points of the backends' samples in the Debezium section's emit
 *		workload, 2026-12-04).  The batch lives in this backend only, is
 *		handed out once and dropped when the process is not the one that
 *		drew it (a fork), so no two processes share bytes.
 */
#define UUID_RANDOM_BATCH 64

static uint8 uuid_random[UUID_RANDOM_BATCH * 8];
static int	uuid_random_used = UUID_RANDOM_BATCH;
static int	uuid_random_pid = 0;

static void
uuid_random_bytes(uint8 *out)
{
	if (uuid_random_used >= UUID_RANDOM_BATCH || uuid_random_pid != MyProcPid)
	{
		if (!pg_strong_random(uuid_random, sizeof(uuid_random)))
			ereport(ERROR,
					(errcode(ERRCODE_INTERNAL_ERROR),
					 errmsg("could not generate random values for an event id")));
		uuid_random_used = 0;
		uuid_random_pid = MyProcPid;
	}
	memcpy(out, &uuid_random[uuid_random_used * 8], 8);
	explicit_bzero(&uuid_random[uuid_random_used * 8], 8);
	uuid_random_used++;
}

/*
 * generate_uuid_v7
 *		Fill *uuid with an RFC 9562 version 7 UUID.
 *
 * 48 bits of Unix milliseconds, then the sub-millisecond fraction in the
 * 12 bits of rand_a (RFC 9562 method 3), kept strictly increasing within
 * this backend, then the variant and 62 random bits.
 */
static void
generate_uuid_v7(pg_uuid_t *uuid)
{
	int64		unix_us;
	int64		tick;
	uint64		ms;
	int			sub;
	int			i;

	unix_us = GetCurrentTimestamp() +
		((int64) (POSTGRES_EPOCH_JDATE - UNIX_EPOCH_JDATE)) * USECS_PER_DAY;
	tick = (unix_us / 1000) * 4096 + ((unix_us % 1000) * 4096) / 1000;
	if (tick <= uuid_last_tick)
		tick = uuid_last_tick + 1;
	uuid_last_tick = tick;

	ms = (uint64) (tick >> 12);
	sub = (int) (tick & 0xFFF);
	for (i = 0; i < 6; i++)
		uuid->data[i] = (unsigned char) (ms >> (40 - 8 * i));
	uuid->data[6] = (unsigned char) (0x70 | (sub >> 8));
	uuid->data[7] = (unsigned char) (sub & 0xFF);
	uuid_random_bytes(&uuid->data[8]);
	uuid->data[8] = (uuid->data[8] & 0x3F) | 0x80;
}

/*
 * required_text
 *		Argument argno, which must be neither null nor empty.
 */
static text *
required_text(FunctionCallInfo fcinfo, int argno, const char *name)
{
	text	   *t;

	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not be null", name)));
	t = PG_GETARG_TEXT_PP(argno);
	if (VARSIZE_ANY_EXHDR(t) == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must not be empty", name)));
	return t;
}

/*
 * check_headers
 *		Headers must be a JSON object of string values: each becomes a Kafka
 *		header whose value is that string, sent after the relay's own.  Each
 *		name is an RFC 9110 token and none of the relay's in any letter case
 *		(OutboxCheckHeaderName, message.c, says why).  At most
 *		OUTBOX_CALLER_HEADERS_MAX headers of OUTBOX_CALLER_HEADER_BYTES_MAX
 *		bytes (names and values).  The names and values, palloc'd, go to
 *		event for the size check.
 */
static void
check_headers(Jsonb *headers, OutboxEvent *event)
{
	JsonbIterator *it;
	JsonbValue	v;
	JsonbIteratorToken tok;
	char	   *key = NULL;
	int			count;
	size_t		bytes = 0;
	int			n = 0;

	if (!JB_ROOT_IS_OBJECT(headers))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("headers must be a JSON object of string values"),
				 errdetail("The headers argument is a JSON %s.",
						   JB_ROOT_IS_SCALAR(headers) ? "scalar" : "array")));

	count = JB_ROOT_COUNT(headers);
	if (count > OUTBOX_CALLER_HEADERS_MAX)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("an event can have at most %d headers, not %d",
						OUTBOX_CALLER_HEADERS_MAX, count)));
	event->header_names = palloc(sizeof(char *) * Max(count, 1));
	event->header_values = palloc(sizeof(char *) * Max(count, 1));

	it = JsonbIteratorInit(&headers->root);
	while ((tok = JsonbIteratorNext(&it, &v, true)) != WJB_DONE)
	{
		if (tok == WJB_KEY)
		{
			key = pnstrdup(v.val.string.val, v.val.string.len);
			OutboxCheckHeaderName(key);
			bytes += v.val.string.len;
		}
		else if (tok == WJB_VALUE)
		{
			if (v.type != jbvString)
				ereport(ERROR,
						(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
						 errmsg("headers must be a JSON object of string values"),
						 errdetail("Header \"%s\" is not a JSON string.", key)));
			bytes += v.val.string.len;
			event->header_names[n] = key;
			event->header_values[n++] = pnstrdup(v.val.string.val, v.val.string.len);
		}
	}
	if (bytes > OUTBOX_CALLER_HEADER_BYTES_MAX)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("event headers are %zu bytes, more than %d",
						bytes, OUTBOX_CALLER_HEADER_BYTES_MAX),
				 errdetail("Header names and values count.")));
	event->nheaders = n;
}

/*
 * format_occurred_at
 *		occurred_at as the relay sends it (RFC 3339 in UTC, microseconds,
 *		the form store.c's format_timestamp writes), or an error when it
 *		has no such form: infinite, before year 1 or after year 9999.
 */
static char *
format_occurred_at(TimestampTz ts)
{
	struct pg_tm tm;
	fsec_t		fsec;

	if (TIMESTAMP_NOT_FINITE(ts) ||
		timestamp2tm(ts, NULL, &tm, &fsec, NULL, NULL) != 0 ||
		tm.tm_year < 1 || tm.tm_year > 9999)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("occurred_at must be between years 1 and 9999 in UTC"),
				 errdetail("The relay sends it as an RFC 3339 timestamp, which has four-digit years.")));
	return psprintf("%04d-%02d-%02dT%02d:%02d:%02d.%06dZ",
					tm.tm_year, tm.tm_mon, tm.tm_mday, tm.tm_hour, tm.tm_min,
					tm.tm_sec, (int) fsec);
}

/*
 * check_message_size
 *		Refuse an event librdkafka would refuse as larger than the
 *		producer's message.max.bytes: the same sum, the same limit, so what
 *		emit() accepts the relay can produce.
 */
static void
check_message_size(const OutboxEvent *event)
{
	size_t		headers_size;
	size_t		total = OutboxEventWireSize(event, &headers_size);

	if (total > (size_t) outbox_kafka_message_max_bytes)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("event is %zu bytes as a Kafka message, more than the producer's limit of %d bytes",
						total, outbox_kafka_message_max_bytes),
				 errdetail("Payload %d bytes, key %zu bytes, headers %zu bytes (the relay's and the caller's), record overhead %zu bytes.",
						   event->payload_len, strlen(event->key), headers_size,
						   total - headers_size - strlen(event->key) - (size_t) event->payload_len),
				 errhint("The limit is librdkafka's message.max.bytes, set in outbox.kafka_config.")));
}

/*
 * check_payload
 *		The payload's size as JSON text, the size the relay sends, refused
 *		over outbox.max_payload_bytes.  The text is made once, here, and
 *		freed: the row stores the jsonb value, the wire size takes this
 *		length.
 */
static int
check_payload(Jsonb *payload)
{
	StringInfoData json;
	size_t		payload_len;

	initStringInfo(&json);
	(void) JsonbToCString(&json, &payload->root, VARSIZE(payload));
	payload_len = (size_t) json.len;
	pfree(json.data);
	if (payload_len > (size_t) outbox_max_payload_bytes)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("event payload is %zu bytes, more than outbox.max_payload_bytes (%d bytes)",
						payload_len, outbox_max_payload_bytes)));
	return (int) payload_len;
}

/*
 * check_content
 *		Validate what the event says: aggregate type and id, event type,
 *		payload (arguments 0..3) and caller headers (4).  Fills row with
 *		them, and row->event with what the topic and the size check need.
 */
static void
check_content(FunctionCallInfo fcinfo, EmitRow *row)
{
	row->aggregate_type = required_text(fcinfo, 0, "aggregate_type");
	row->aggregate_id = required_text(fcinfo, 1, "aggregate_id");
	row->event_type = required_text(fcinfo, 2, "event_type");
	if (PG_ARGISNULL(3))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("payload must not be null"),
				 errhint("Use the JSON value 'null'::jsonb for an event without a payload.")));
	row->payload = PG_GETARG_JSONB_P(3);
	row->event.payload_len = check_payload(row->payload);

	if (!PG_ARGISNULL(4))
	{
		row->headers = PG_GETARG_JSONB_P(4);
		check_headers(row->headers, &row->event);
	}
	row->event.aggregate_type = text_to_cstring(row->aggregate_type);
	row->event.aggregate_id = text_to_cstring(row->aggregate_id);
	row->event.event_type = text_to_cstring(row->event_type);
}

/*
 * check_envelope
 *		Validate how the event travels: key (argument 6), occurred_at (9),
 *		schema_version (8), and take or make its event id (7).  Runs after
 *		the topic is resolved: its errors come after the topic's.
 */
static void
check_envelope(FunctionCallInfo fcinfo, EmitRow *row)
{
	/* an empty key would be partitioned at random by consistent_random */
	row->key = PG_ARGISNULL(6) ? row->aggregate_id : PG_GETARG_TEXT_PP(6);
	if (VARSIZE_ANY_EXHDR(row->key) == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("key must not be empty"),
				 errhint("Pass NULL to use the aggregate id as the key.")));

	row->occurred_at = PG_ARGISNULL(9) ? GetCurrentTransactionStartTimestamp() :
		PG_GETARG_TIMESTAMPTZ(9);
	row->event.occurred_at = format_occurred_at(row->occurred_at);

	if (PG_ARGISNULL(8))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("schema_version must not be null")));
	row->event.schema_version = PG_GETARG_INT32(8);
	if (row->event.schema_version < 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("schema_version must be at least 1, not %d",
						row->event.schema_version)));

	if (!PG_ARGISNULL(7))
		row->event_id = PG_GETARG_UUID_P(7);
	else
	{
		row->event_id = palloc(sizeof(pg_uuid_t));
		generate_uuid_v7(row->event_id);
	}
}


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
 * insert_values
 *		The insert's parameters $1..$12 from row; tenant and traceparent,
 *		from the session's settings, go to row->event too.
 */
static void
insert_values(EmitRow *row, Datum *values, char *nulls)
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
	values[8] = PointerGetDatum(row->headers);
	if (row->headers == NULL)
		nulls[8] = 'n';
	row->event.tenant = setting_param(outbox_tenant, &values[9], &nulls[9]);
	row->event.traceparent = setting_param(outbox_traceparent, &values[10],
										   &nulls[10]);
	values[11] = TimestampTzGetDatum(row->occurred_at);
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
 * the table is still the one this knows: exactly the columns below, of
 * these types, no NOT NULL where emit() may write a null, those defaults,
 * no other INSERT trigger, no CHECK constraint, no generated column, no
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
	COL_CREATED_AT, EVENT_COLUMN_COUNT
} EventColumn;

typedef struct EventColumnSpec
{
	const char *name;
	Oid			type;
	int			param;			/* its insert parameter ($n, 0-based); -1:
								 * computed here */
	bool		nullable;		/* emit() may write a null */
} EventColumnSpec;

static const EventColumnSpec event_columns[EVENT_COLUMN_COUNT] = {
	[COL_ID] = {"id", INT8OID, -1, false},
	[COL_TXID] = {"txid", XID8OID, -1, false},
	[COL_EVENT_ID] = {"event_id", UUIDOID, 0, false},
	[COL_AGGREGATE_TYPE] = {"aggregate_type", TEXTOID, 1, false},
	[COL_AGGREGATE_ID] = {"aggregate_id", TEXTOID, 2, false},
	[COL_SEQ] = {"seq", INT8OID, EMIT_NARGS - 1, true},
	[COL_EVENT_TYPE] = {"event_type", TEXTOID, 3, false},
	[COL_SCHEMA_VERSION] = {"schema_version", INT4OID, 4, false},
	[COL_TOPIC] = {"topic", TEXTOID, 5, false},
	[COL_KEY] = {"key", TEXTOID, 6, false},
	[COL_PAYLOAD] = {"payload", JSONBOID, 7, false},
	[COL_HEADERS] = {"headers", JSONBOID, 8, true},
	[COL_TENANT] = {"tenant", TEXTOID, 9, true},
	[COL_TRACEPARENT] = {"traceparent", TEXTOID, 10, true},
	[COL_OCCURRED_AT] = {"occurred_at", TIMESTAMPTZOID, 11, false},
	[COL_CREATED_AT] = {"created_at", TIMESTAMPTZOID, -1, false},
};

typedef struct DirectTable
{
	Oid			relid;			/* InvalidOid: not known (yet, or any more) */
	bool		direct;			/* the direct insert can take it */
	Oid			id_seq;			/* the identity sequence of id */
	AttrNumber	attnum[EVENT_COLUMN_COUNT];
} DirectTable;

static DirectTable direct_cache;
static uint64 direct_invalidations = 0;
static bool direct_callback_registered = false;

/* what take_seq_direct() found outbox.aggregates to be, for its relcache state */
typedef struct CounterTable
{
	Oid			relid;			/* InvalidOid: not known (yet, or any more) */
	const char *why_not;		/* NULL: take_seq_direct() can update it */
	Oid			pk;
	AttrNumber	att_type;
	AttrNumber	att_id;
	AttrNumber	att_seq;
} CounterTable;

static CounterTable counter_cache;

/*
 * The OIDs of outbox.events and outbox.aggregates as open_outbox_table()
 * last found them by name; InvalidOid once an invalidation of the table
 * (a change of its definition, a rename, a drop) or of any schema arrives.
 */
static Oid	events_relid = InvalidOid;
static Oid	aggregates_relid = InvalidOid;

static void
direct_invalidate(Datum arg, Oid relid)
{
	direct_invalidations++;
	if (relid == InvalidOid || relid == direct_cache.relid)
		direct_cache.relid = InvalidOid;
	if (relid == InvalidOid || relid == counter_cache.relid)
		counter_cache.relid = InvalidOid;
	if (relid == InvalidOid || relid == events_relid)
		events_relid = InvalidOid;
	if (relid == InvalidOid || relid == aggregates_relid)
		aggregates_relid = InvalidOid;
}

/* a schema renamed or dropped: outbox.<name> may be another table now */
static void
names_invalidate(Datum arg, int cacheid, uint32 hashvalue)
{
	events_relid = InvalidOid;
	aggregates_relid = InvalidOid;
}

static void
direct_register_callback(void)
{
	if (!direct_callback_registered)
	{
		CacheRegisterRelcacheCallback(direct_invalidate, (Datum) 0);
		CacheRegisterSyscacheCallback(NAMESPACEOID, names_invalidate, (Datum) 0);
		direct_callback_registered = true;
	}
}

/*
 * open_outbox_table
 *		outbox.<name> with RowExclusiveLock, by the OID *relid remembers
 *		while that is still the table of the name, else by the name (a
 *		lookup of the schema and of the table in the catalog caches),
 *		remembered for the next call.  The
 *		lock taken by OID accepts the invalidations that came before it, so
 *		a table renamed, dropped or replaced meanwhile (or a schema renamed)
 *		has cleared *relid by the time this checks it again, and the lock
 *		on the table it no longer is is let go; a table this transaction
 *		has locked already can only have been renamed or replaced by this
 *		transaction, whose own invalidations are accepted at its next
 *		command.  A schema's rename takes no lock on its tables: a rename by
 *		another session after this transaction locked the table shows at
 *		its next lock or transaction, as it would to a lookup by name.
 */
static Relation
open_outbox_table(const char *name, Oid *relid)
{
	Relation	rel;

	direct_register_callback();
	if (OidIsValid(*relid))
	{
		Oid			known = *relid;

		rel = try_table_open(known, RowExclusiveLock);
		if (rel != NULL && *relid == known)
			return rel;
		if (rel != NULL)
			table_close(rel, RowExclusiveLock);
	}
	rel = table_openrv(makeRangeVar("outbox", (char *) name, -1), RowExclusiveLock);
	*relid = RelationGetRelid(rel);
	return rel;
}

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
 * plain_indexes
 *		Whether every index of rel is a valid btree on plain columns with
 *		their types' default operator classes: no expression, predicate or
 *		exclusion.  The direct paths write index entries without emit()'s
 *		search_path pinned (outbox_emit), so nothing there may call a
 *		function a caller's search_path could reach.
 */
static bool
plain_indexes(Relation rel)
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

/*
 * direct_table_check
 *		Into t: whether rel is the table the direct insert knows, and where
 *		its columns are; NULL, or why not.
 */
static const char *
direct_table_check(Relation rel, DirectTable *t)
{
	TupleDesc	desc = RelationGetDescr(rel);
	Node	   *def;

	memset(t, 0, sizeof(*t));
	if (rel->rd_rel->relkind != RELKIND_RELATION)
		return "it is not a plain table";
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
		if (att->attnotnull && event_columns[c].nullable)
			return "a column emit() may leave null is NOT NULL";
		t->attnum[c] = att->attnum;
	}
	for (int c = 0; c < EVENT_COLUMN_COUNT; c++)
		if (t->attnum[c] == InvalidAttrNumber)
			return "a column is missing";
	if (!plain_indexes(rel))
		return "an index is not a plain btree on columns";
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
	uint64		invalidations = direct_invalidations;
	const char *why_not;

	if (direct_cache.relid == RelationGetRelid(rel))
	{
		*out = direct_cache;
		return out->direct;
	}
	direct_register_callback();

	why_not = direct_table_check(rel, &t);
	if (why_not == NULL)
		elog(DEBUG1, "outbox.emit() writes outbox.events directly");
	else
		elog(DEBUG1, "outbox.emit() writes outbox.events through an INSERT statement: %s",
			 why_not);
	t.relid = RelationGetRelid(rel);
	if (invalidations == direct_invalidations)
		direct_cache = t;
	*out = t;
	return t.direct;
}

/*
 * insert_direct
 *		Insert the event row of parameters values/nulls (the INSERT's $1..$13)
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
 * insert_row
 *		The event row of values/nulls, directly or, when the table is not
 *		the one the direct insert knows, by the INSERT statement.
 */
static void
insert_row(Datum *values, char *nulls)
{
	Relation	rel;
	DirectTable t;
	int			rc;
	int			level;

	rel = open_outbox_table("events", &events_relid);
	if (direct_table(rel, &t))
	{
		insert_direct(rel, &t, values, nulls);
		table_close(rel, NoLock);
		return;
	}
	table_close(rel, NoLock);

	level = OutboxPinSearchPath();
	if (event_insert_plan == NULL)
	{
		Oid			argtypes[EMIT_NARGS] = {UUIDOID, TEXTOID, TEXTOID, TEXTOID,
			INT4OID, TEXTOID, TEXTOID, JSONBOID, JSONBOID, TEXTOID, TEXTOID,
		TIMESTAMPTZOID, INT8OID};

		event_insert_plan = OutboxSpiPrepare(event_insert_sql, EMIT_NARGS,
											   argtypes, "the outbox insert");
	}
	rc = SPI_execute_plan(event_insert_plan, values, nulls, false, 0);
	if (rc != SPI_OK_INSERT || SPI_processed != 1)
		elog(ERROR, "outbox insert returned %s with %llu rows",
			 SPI_result_code_string(rc), (unsigned long long) SPI_processed);
	OutboxUnpinSearchPath(level);
}

/*
 * whether index, one plain_indexes() passed (a valid btree on columns, no
 * predicate), is on exactly (att_type, att_id), text, "C"
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
	if (!plain_indexes(rel))
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
 *		Into out: what counter_table_check() says of rel, cached until the
 *		next invalidation of rel, as direct_table() caches.
 */
static void
counter_table(Relation rel, CounterTable *out)
{
	CounterTable c;
	uint64		invalidations = direct_invalidations;

	if (counter_cache.relid == RelationGetRelid(rel))
	{
		*out = counter_cache;
		return;
	}
	direct_register_callback();
	c.why_not = counter_table_check(rel, &c);
	if (c.why_not == NULL)
		elog(DEBUG1, "outbox.emit() updates outbox.aggregates directly");
	else
		elog(DEBUG1, "outbox.emit() updates outbox.aggregates through an UPDATE statement: %s",
			 c.why_not);
	c.relid = RelationGetRelid(rel);
	if (invalidations == direct_invalidations)
		counter_cache = c;
	*out = c;
}

/*
 * take_seq_direct
 *		take_seq() without the UPDATE statement, while outbox.aggregates is
 *		the table this knows (counter_table_check): find the aggregate's row
 *		(counter_find: where it was last seen, else through the primary key)
 *		with a new snapshot, as the statement would (READ COMMITTED: the
 *		latest; otherwise the transaction's), and
 *		update it, which locks it.  TAKE_DONE with *seq; TAKE_NO_ROW: there
 *		is none (the upsert makes it); TAKE_STATEMENT: leave it to the
 *		statement, which waits for, rechecks and raises what UPDATE does:
 *		the table is not this one, or the row changed since the snapshot
 *		(a concurrent update, or this transaction's own in this command).
 *		Not under SERIALIZABLE (insert_event).
 */
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

static TakeResult
take_seq_direct(text *aggregate_type, text *aggregate_id, int64 *seq)
{
	Relation	rel;
	CounterTable c;
	TupleTableSlot *old_slot;
	TupleTableSlot *new_slot;
	Snapshot	snapshot;
	TakeResult	result = TAKE_NO_ROW;
	uint64		hash;

	rel = open_outbox_table("aggregates", &aggregates_relid);
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
	new_slot = MakeSingleTupleTableSlot(RelationGetDescr(rel), &TTSOpsVirtual);
	hash = OutboxCounterHash(RelationGetRelid(rel), aggregate_type, aggregate_id);
	if (counter_find(rel, &c, snapshot, aggregate_type, aggregate_id, hash,
					 old_slot))
	{
		TM_FailureData tmfd;
		LockTupleMode lockmode;
		OutboxUpdateIndexes update_indexes;
		TM_Result	tm;
		bool		isnull;
		int64		next;

		slot_getallattrs(old_slot);
		next = DatumGetInt64(slot_getattr(old_slot, c.att_seq, &isnull));
		if (isnull)
			ereport(ERROR,
					(errcode(ERRCODE_DATA_CORRUPTED),
					 errmsg("outbox.aggregates has a null last_seq")));
		if (next == PG_INT64_MAX)
			ereport(ERROR,
					(errcode(ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE),
					 errmsg("bigint out of range")));
		next++;
		ExecClearTuple(new_slot);
		memcpy(new_slot->tts_values, old_slot->tts_values,
			   old_slot->tts_nvalid * sizeof(Datum));
		memcpy(new_slot->tts_isnull, old_slot->tts_isnull,
			   old_slot->tts_nvalid * sizeof(bool));
		new_slot->tts_values[c.att_seq - 1] = Int64GetDatum(next);
		ExecStoreVirtualTuple(new_slot);

		tm = table_tuple_update(rel, &old_slot->tts_tid, new_slot,
								GetCurrentCommandId(true), snapshot,
								InvalidSnapshot, true, &tmfd, &lockmode,
								&update_indexes);
		if (tm == TM_Ok)
		{
			if (OutboxUpdateNeedsIndexes(update_indexes))
			{
				EState	   *estate = CreateExecutorState();
				ResultRelInfo *rri = makeNode(ResultRelInfo);

				/* the row left its page: its chain has a new root */
				OutboxCounterForget(hash);
				InitResultRelInfo(rri, rel, 0, NULL, 0);
				ExecOpenIndices(rri, false);

				/*
				 * Tell each index whether this update changed its key, as
				 * the statement's updated columns would (only last_seq
				 * changes): btree then removes the row's older duplicates
				 * before it splits a page (bottom-up deletion).
				 */
				for (int i = 0; i < rri->ri_NumIndices; i++)
				{
					IndexInfo  *ii = rri->ri_IndexRelationInfo[i];
					bool		unchanged = (ii->ii_Expressions == NIL &&
											 ii->ii_Predicate == NIL);

					for (int k = 0; k < ii->ii_NumIndexAttrs; k++)
						if (ii->ii_IndexAttrNumbers[k] == c.att_seq)
							unchanged = false;
					ii->ii_CheckedUnchanged = true;
					ii->ii_IndexUnchanged = unchanged;
				}
				list_free(OutboxUpdateIndexTuples(rri, new_slot, estate, update_indexes));
				ExecCloseIndices(rri);
				FreeExecutorState(estate);
			}
			*seq = next;
			result = TAKE_DONE;
		}
		else
			/* it waited for the other updater, if any: now the statement */
			result = TAKE_STATEMENT;
	}
	ExecDropSingleTupleTableSlot(new_slot);
	ExecDropSingleTupleTableSlot(old_slot);
	PopActiveSnapshot();
	table_close(rel, NoLock);
	return result;
}

/*
 * take_seq
 *		The aggregate's next seq from its counter row, which the update
 *		locks until the transaction ends; false when it has no counter row.
 *		Directly when it can (take_seq_direct), else by the statement.
 */
static bool
take_seq(text *aggregate_type, text *aggregate_id, int64 *seq)
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

/*
 * insert_event
 *		Insert row into outbox.events in the caller's transaction, numbered
 *		by the per-aggregate sequence when it is on; then refuse it if it is
 *		larger than the relay could produce (the size counts the seq header,
 *		known only now: the error rolls the insert and the counter back with
 *		the caller's transaction); then have the relay woken at commit.
 */
static void
insert_event(EmitRow *row)
{
	Datum		values[EMIT_NARGS];
	char		nulls[EMIT_NARGS];
	OutboxSequenceEntry *held = NULL;
	bool		taken = false;

	insert_values(row, values, nulls);
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	row->event.has_seq = outbox_aggregate_sequence;
	row->event.seq = 0;
	if (!outbox_aggregate_sequence)
		nulls[EMIT_NARGS - 1] = 'n';
	else if ((held = OutboxSequenceHeld(row->aggregate_type,
										row->aggregate_id)) != NULL)
		/* a later one: the transaction owns the row, the seq is its own */
		row->event.seq = OutboxSequenceNext(held);

	/*
	 * The transaction's first event of the aggregate.  Under SERIALIZABLE
	 * the update's index probe for a missing key would take a predicate
	 * lock on the leaf page, so transactions creating the counter rows of
	 * neighbouring new aggregates would fail each other (40001); the upsert
	 * alone takes none, and is all a serializable transaction runs.
	 */
	else if (!IsolationIsSerializable() &&
			 take_seq(row->aggregate_type, row->aggregate_id, &row->event.seq))
		taken = true;
	else
		/* the aggregate's first event ever: no counter row to update */
		row->event.seq = OutboxSequenceCreate(row->aggregate_type,
											  row->aggregate_id);
	if (outbox_aggregate_sequence)
		values[EMIT_NARGS - 1] = Int64GetDatum(row->event.seq);

	insert_row(values, nulls);

	if (held != NULL)
		OutboxSequenceGiven(held, row->event.seq);
	else if (taken)
		OutboxSequenceEnter(row->aggregate_type, row->aggregate_id,
							row->event.seq);
	row->event.event_id = DatumGetCString(DirectFunctionCall1(uuid_out,
															  UUIDPGetDatum(row->event_id)));
	row->event.key = text_to_cstring(row->key);
	check_message_size(&row->event);

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
 * outbox_emit
 *		SQL outbox.emit(aggregate_type, aggregate_id, event_type, payload,
 *		headers, topic, key, event_id, schema_version, occurred_at).
 *
 * Returns the event id.  Runs as the function's owner, the extension's,
 * so that callers need EXECUTE on it and nothing on the tables: it switches
 * to the owner itself, as SECURITY DEFINER would (through 1.6 it was), and
 * pins search_path only for the statements it runs (OutboxPinSearchPath):
 * a SET clause's setting and resetting of search_path at every call cost
 * more than the rest of a direct call's bookkeeping, and the direct paths
 * resolve no name.  An error leaves the user to the abort of the
 * (sub)transaction, as fmgr_security_definer() does.  Validate, resolve
 * the topic, insert: in that order, which is the order of the errors a
 * user sees.
 */
Datum
outbox_emit(PG_FUNCTION_ARGS)
{
	EmitRow		row;
	Oid			save_userid;
	int			save_sec_context;

	PreventCommandIfReadOnly("outbox.emit()");
	PreventCommandDuringRecovery("outbox.emit()");

	GetUserIdAndSecContext(&save_userid, &save_sec_context);
	SetUserIdAndSecContext(emit_owner(fcinfo),
						   save_sec_context | SECURITY_LOCAL_USERID_CHANGE);

	memset(&row, 0, sizeof(row));
	check_content(fcinfo, &row);
	row.topic = OutboxTopicResolve(PG_ARGISNULL(5) ? NULL :
								   text_to_cstring(PG_GETARG_TEXT_PP(5)),
								   row.event.aggregate_type,
								   row.event.event_type);
	check_envelope(fcinfo, &row);
	insert_event(&row);

	SetUserIdAndSecContext(save_userid, save_sec_context);
	PG_RETURN_UUID_P(row.event_id);
}

/*
 * outbox_uuid_v7
 *		SQL outbox.uuid_v7(): the event id emit() would generate.
 */
Datum
outbox_uuid_v7(PG_FUNCTION_ARGS)
{
	pg_uuid_t  *uuid = palloc(sizeof(pg_uuid_t));

	generate_uuid_v7(uuid);
	PG_RETURN_UUID_P(uuid);
}

/*
 * outbox_notify_relay
 *		SQL outbox.notify_relay(): wake the relay when this transaction
 *		commits and have it look at the replay queue (replay and discard
 *		queue work for it).
 */
Datum
outbox_notify_relay(PG_FUNCTION_ARGS)
{
	replay_at_commit = true;
	PG_RETURN_VOID();
}
