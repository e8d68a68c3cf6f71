/*-------------------------------------------------------------------------
 *
 * store/store_event.c
 *		An event row as the relay reads it: the columns every event query
 *		selects (EVENT_COLUMNS, store_sql.h), decoded into an OutboxEvent,
 *		and its weight for outbox.batch_max_bytes.
 *
 * Invariants:
 *	- The relay's statements run against whichever version of the
 *	  extension the database has installed (store_batch.c): a database
 *	  before 1.8 has no payload_bytes or content_type, and its event
 *	  queries select NULLs in their place (OutboxStoreEventSql).  Which
 *	  applies is judged with outbox.events locked: a table that gained the
 *	  columns after the lock cannot have rows using them, as adding them
 *	  waits for the lock.
 *	- A value is JSON text, bytes, or none (a tombstone): exactly one kind
 *	  per event, from which of payload and payload_bytes is set.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/namespace.h"
#include "storage/lmgr.h"
#include "utils/builtins.h"
#include "utils/datetime.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/timestamp.h"
#include "utils/uuid.h"

#include "base/base.h"
#include "kafka/kafka.h"
#include "store/store.h"
#include "store/store_sql.h"

/* what a database before 1.8 selects instead of EVENT_BYTES_COLUMNS */
#define EVENT_BYTES_NULLS " NULL::pg_catalog.bytea, NULL::pg_catalog.text"

/*
 * OutboxStoreLockFirst
 *		Lock outbox.<relname> as a statement reading it would, before
 *		OutboxStoreEventsHaveBytes locks outbox.events: a statement that
 *		reads relname joined to the events then takes its locks in the order
 *		its parse would, not the other way round, which could meet an
 *		upgrade script's in a deadlock.  Inside a transaction.
 */
void
OutboxStoreLockFirst(const char *relname)
{
	Oid			nsp = get_namespace_oid("outbox", true);
	Oid			relid = OidIsValid(nsp) ? get_relname_relid(relname, nsp) : InvalidOid;

	if (OidIsValid(relid))
		LockRelationOid(relid, AccessShareLock);
}

/*
 * OutboxStoreEventsHaveBytes
 *		Whether outbox.events has payload_bytes (1.8 on), judged with the
 *		table locked as the event queries lock it, for this transaction.
 *		Inside a transaction.
 */
bool
OutboxStoreEventsHaveBytes(void)
{
	Oid			nsp = get_namespace_oid("outbox", true);
	Oid			relid = OidIsValid(nsp) ? get_relname_relid("events", nsp) : InvalidOid;

	if (!OidIsValid(relid))
		return true;			/* the query will say what is missing */
	LockRelationOid(relid, AccessShareLock);
	return get_attnum(relid, "payload_bytes") != InvalidAttrNumber;
}

/*
 * OutboxStoreEventSql
 *		sql, a statement selecting EVENT_COLUMNS, as this database's events
 *		table can run it: unchanged from 1.8 on, the new columns as NULLs
 *		before.  palloc'd when changed.
 */
const char *
OutboxStoreEventSql(const char *sql, bool have_bytes)
{
	const char *at;
	StringInfoData out;

	if (have_bytes || (at = strstr(sql, EVENT_BYTES_COLUMNS)) == NULL)
		return sql;
	initStringInfo(&out);
	appendBinaryStringInfo(&out, sql, at - sql);
	appendStringInfoString(&out, EVENT_BYTES_NULLS);
	appendStringInfoString(&out, at + strlen(EVENT_BYTES_COLUMNS));
	return out.data;
}

/*
 * decode_headers
 *		The caller's headers, a JSON object of strings (emit() checked it),
 *		into ev's name and value arrays: one allocation, names first.
 */
static void
decode_headers(OutboxEvent *ev, Jsonb *jb)
{
	int			n = JB_ROOT_COUNT(jb);
	char	  **strings = palloc(sizeof(char *) * 2 * Max(n, 1));
	JsonbIterator *it = JsonbIteratorInit(&jb->root);
	JsonbValue	v;
	JsonbIteratorToken tok;
	int			keys = 0;
	int			values = 0;

	ev->header_names = strings;
	ev->header_values = strings + Max(n, 1);
	while ((tok = JsonbIteratorNext(&it, &v, true)) != WJB_DONE)
	{
		if (tok == WJB_KEY && keys < n)
			ev->header_names[keys++] = pnstrdup(v.val.string.val, v.val.string.len);
		else if (tok == WJB_VALUE && values < n)
			ev->header_values[values++] = (v.type == jbvString) ?
				pnstrdup(v.val.string.val, v.val.string.len) : pstrdup("");
	}
	ev->nheaders = values;
}

/* a UUID's text: 32 hex digits and 4 dashes */
#define UUID_TEXT_LEN	(UUID_LEN * 2 + 4)

/* 8-4-4-4-12 lower-case hex, as uuid_out writes it */
static char *
format_uuid(const pg_uuid_t *uuid)
{
	static const char hex[] = "0123456789abcdef";
	char	   *out = palloc(UUID_TEXT_LEN + 1);
	char	   *p = out;
	int			i;

	for (i = 0; i < UUID_LEN; i++)
	{
		if (i == 4 || i == 6 || i == 8 || i == 10)
			*p++ = '-';
		*p++ = hex[uuid->data[i] >> 4];
		*p++ = hex[uuid->data[i] & 0x0F];
	}
	*p = '\0';
	return out;
}

/* RFC 3339 in UTC with microseconds: 2026-01-02T03:04:05.000000Z */
static char *
format_timestamp(TimestampTz ts)
{
	struct pg_tm tm;
	fsec_t		fsec;

	if (TIMESTAMP_NOT_FINITE(ts) || timestamp2tm(ts, NULL, &tm, &fsec, NULL, NULL) != 0)
		return pstrdup(TIMESTAMP_IS_NOBEGIN(ts) ? "-infinity" : "infinity");
	return psprintf("%04d-%02d-%02dT%02d:%02d:%02d.%06dZ",
					tm.tm_year, tm.tm_mon, tm.tm_mday, tm.tm_hour, tm.tm_min,
					tm.tm_sec, (int) fsec);
}

/*
 * record_timestamp
 *		occurred_at as the record's timestamp (CreateTime, ms since 1970).
 *		Kafka has none before 1970-01-01 00:00:00.001 UTC: 0 there, which
 *		librdkafka replaces with the time it sends the message.
 */
static int64
record_timestamp(TimestampTz ts)
{
	int64		us;

	if (TIMESTAMP_NOT_FINITE(ts))
		return 0;
	us = ts + (int64) (POSTGRES_EPOCH_JDATE - UNIX_EPOCH_JDATE) * USECS_PER_DAY;
	return us < 1000 ? 0 : us / 1000;
}

/*
 * decode_payload
 *		The value of an event row (columns 9, 15 and 16 of EVENT_COLUMNS):
 *		the payload's JSON text, or payload_bytes with its content type, or
 *		none (a tombstone).
 */
static void
decode_payload(OutboxEvent *ev, Datum *v, bool *isnull)
{
	if (!isnull[9])
	{
		Jsonb	   *payload = DatumGetJsonbP(v[9]);
		StringInfoData json;

		initStringInfo(&json);
		ev->payload = JsonbToCString(&json, &payload->root, VARSIZE(payload));
		ev->payload_len = json.len;
		ev->payload_kind = OUTBOX_PAYLOAD_JSON;
		/* a large payload arrives toasted: keep its text, not also its jsonb */
		if ((Pointer) payload != DatumGetPointer(v[9]))
			pfree(payload);
	}
	else if (!isnull[15])
	{
		bytea	   *bytes = DatumGetByteaPP(v[15]);

		ev->payload_len = VARSIZE_ANY_EXHDR(bytes);
		ev->payload = palloc(ev->payload_len + 1);
		memcpy(ev->payload, VARDATA_ANY(bytes), ev->payload_len);
		ev->payload[ev->payload_len] = '\0';
		ev->payload_kind = OUTBOX_PAYLOAD_BYTES;
		if ((Pointer) bytes != DatumGetPointer(v[15]))
			pfree(bytes);
	}
	else
	{
		ev->payload = NULL;
		ev->payload_len = 0;
		ev->payload_kind = OUTBOX_PAYLOAD_NONE;
	}
	ev->content_type = isnull[16] ? NULL : TextDatumGetCString(v[16]);
}

/* a text column's value as a C string, its length in *len */
static char *
text_value(Datum d, int *len)
{
	text	   *t = DatumGetTextPP(d);
	char	   *out;

	*len = VARSIZE_ANY_EXHDR(t);
	out = palloc(*len + 1);
	memcpy(out, VARDATA_ANY(t), *len);
	out[*len] = '\0';
	if ((Pointer) t != DatumGetPointer(d))
		pfree(t);
	return out;
}

/*
 * OutboxStoreDecodeEvent
 *		Copy one row of EVENT_COLUMNS (and a replay's queue position) into
 *		*ev.  The caller has switched to the page's memory context, where
 *		everything is allocated.
 */
void
OutboxStoreDecodeEvent(HeapTuple tup, TupleDesc desc, OutboxEvent *ev)
{
	/* a replay row has one more column: its queue position */
	Datum		v[EVENT_NCOLUMNS + 1];
	bool		isnull[EVENT_NCOLUMNS + 1];
	int		   *lens = ev->text_lens;
	int			i;

	Assert(desc->natts <= EVENT_NCOLUMNS + 1);
	heap_deform_tuple(tup, desc, v, isnull);
	for (i = 0; i < OUTBOX_NUM_HEADERS; i++)
		lens[i] = -1;
	ev->id = DatumGetInt64(v[0]);
	ev->event_id = format_uuid(DatumGetUUIDP(v[1]));
	lens[OUTBOX_HEADER_ID] = UUID_TEXT_LEN;
	ev->aggregate_type = text_value(v[2], &lens[OUTBOX_HEADER_AGGREGATE_TYPE]);
	ev->aggregate_id = text_value(v[3], &lens[OUTBOX_HEADER_AGGREGATE_ID]);
	ev->has_seq = !isnull[4];
	ev->seq = isnull[4] ? 0 : DatumGetInt64(v[4]);
	ev->event_type = text_value(v[5], &lens[OUTBOX_HEADER_EVENT_TYPE]);
	ev->schema_version = DatumGetInt32(v[6]);
	ev->topic = TextDatumGetCString(v[7]);
	ev->key = text_value(v[8], &ev->key_len);
	decode_payload(ev, v, isnull);
	if (!isnull[10])
		decode_headers(ev, DatumGetJsonbP(v[10]));
	ev->tenant = isnull[11] ? NULL : text_value(v[11], &lens[OUTBOX_HEADER_TENANT]);
	ev->traceparent = isnull[12] ? NULL :
		text_value(v[12], &lens[OUTBOX_HEADER_TRACEPARENT]);
	ev->occurred_at = format_timestamp(DatumGetTimestampTz(v[13]));
	lens[OUTBOX_HEADER_OCCURRED_AT] = strlen(ev->occurred_at);
	ev->lens_known = true;
	ev->timestamp_ms = record_timestamp(DatumGetTimestampTz(v[13]));
	ev->created_at = DatumGetTimestampTz(v[14]);
	if (desc->natts > EVENT_NCOLUMNS)
		ev->queue_position = DatumGetInt64(v[EVENT_NCOLUMNS]);
	ev->disposition = OUTBOX_EVENT_PENDING;
	ev->delivery_err = OUTBOX_DELIVERY_PENDING;
	ev->partition = OUTBOX_PARTITION_UNSET;
	ev->partition_count = 0;
}

/* the length of ev's text value for header h, counted only if not known */
static int64
text_len(const OutboxEvent *ev, OutboxHeader h, const char *value)
{
	return ev->lens_known && ev->text_lens[h] >= 0 ? ev->text_lens[h] : strlen(value);
}

/*
 * OutboxStoreEventBytes
 *		What an event weighs on the wire, as outbox.batch_max_bytes counts
 *		it: payload, key, and every header's name and value; in the
 *		CloudEvents formats the attributes, which repeat the event's names,
 *		and the growth of bytes in base64.
 */
int64
OutboxStoreEventBytes(const OutboxEvent *ev)
{
	/* names of the fixed headers, and generous room for seq and version */
	int64		bytes = 64 + 2 * 20;
	/* what the CloudEvents attributes repeat */
	int64		repeated = OutboxEventKeyLength(ev) +
		text_len(ev, OUTBOX_HEADER_ID, ev->event_id) +
		text_len(ev, OUTBOX_HEADER_EVENT_TYPE, ev->event_type) +
		text_len(ev, OUTBOX_HEADER_AGGREGATE_ID, ev->aggregate_id) +
		text_len(ev, OUTBOX_HEADER_OCCURRED_AT, ev->occurred_at);
	int64		traceparent = ev->traceparent == NULL ? 0 :
		text_len(ev, OUTBOX_HEADER_TRACEPARENT, ev->traceparent);
	int			i;

	bytes += ev->payload_len + repeated +
		text_len(ev, OUTBOX_HEADER_AGGREGATE_TYPE, ev->aggregate_type);
	if (ev->tenant != NULL)
		bytes += text_len(ev, OUTBOX_HEADER_TENANT, ev->tenant) + 6;
	if (ev->traceparent != NULL)
		bytes += traceparent + 11;
	for (i = 0; i < ev->nheaders; i++)
		bytes += strlen(ev->header_names[i]) + strlen(ev->header_values[i]);
	if (outbox_message_format != OUTBOX_FORMAT_NATIVE)
	{
		/* the attributes' names, source and sequence, generously */
		bytes += 256 + repeated + traceparent;
		if (outbox_message_format == OUTBOX_FORMAT_CE_STRUCTURED &&
			ev->payload_kind == OUTBOX_PAYLOAD_BYTES)
			bytes += ev->payload_len / 3 + 4;
	}
	return bytes;
}
