/*-------------------------------------------------------------------------
 *
 * emit/emit_check.c
 *		emit()'s arguments, each hostile input: what the event says and how
 *		it travels, checked in the order of the errors a user sees.
 *
 * Invariants:
 *	- An event emit() accepts cannot forge the relay's own headers, carry
 *	  an occurred_at that is not RFC 3339, or be larger than librdkafka
 *	  accepts (message.max.bytes, counted as librdkafka counts it, with
 *	  every header the relay will send: OutboxEmitCheckSize).  Its topic
 *	  is topic.c's to check (OutboxTopicResolve), between the content and
 *	  the envelope.
 *	- The payload is turned to JSON text once, for its size; the row gets
 *	  the jsonb value and the wire size reuses that length.
 *	- What the check hook of outbox.traceparent calls
 *	  (OutboxTraceparentIsValid) never ereports.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "fmgr.h"
#include "mb/pg_wchar.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"
#include "utils/timestamp.h"
#include "utils/uuid.h"

#include "base/base.h"
#include "kafka/kafka.h"
#include "emit/emit.h"

/* emit()'s argument n, as emit_binary() and emit_tombstone() number it */
static inline int
emit_arg(const OutboxEmitRow *row, int n)
{
	return n >= 4 ? n + row->arg_shift : n;
}

/* whether the n characters at s are lower-case hex digits; *all_zero: all 0 */
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
 * refuse_control
 *		Refuse t, argument name, when it holds a control character (C0, DEL,
 *		or in a UTF-8 database C1): it names the event in headers, in the
 *		key and in CloudEvents attributes, whose strings must not have any.
 */
static void
refuse_control(text *t, const char *name)
{
	const unsigned char *p = (const unsigned char *) VARDATA_ANY(t);
	int			len = VARSIZE_ANY_EXHDR(t);
	bool		utf8 = (GetDatabaseEncoding() == PG_UTF8);

	for (int i = 0; i < len; i++)
	{
		unsigned int c = p[i];

		if (utf8 && c == 0xC2 && i + 1 < len && p[i + 1] >= 0x80 && p[i + 1] <= 0x9F)
			c = p[i + 1];
		else if (c >= 0x20 && c != 0x7F)
			continue;
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must not contain control characters", name),
				 errdetail("Character U+%04X is at byte %d.", c, i + 1),
				 errhint("It names the event in Kafka headers and in CloudEvents attributes, which hold no control characters.")));
	}
}

/*
 * required_text
 *		Argument argno, which must be neither null nor empty, nor hold a
 *		control character.
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
	refuse_control(t, name);
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
 *		the form store_batch.c's format_timestamp writes), or an error when it
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
 * OutboxEmitCheckSize
 *		Refuse an event librdkafka would refuse as larger than the
 *		producer's message.max.bytes: the same sum, the same limit, so what
 *		emit() accepts the relay can produce.
 */
void
OutboxEmitCheckSize(const OutboxEvent *event)
{
	size_t		headers_size;
	size_t		value_size;
	size_t		total = OutboxEventWireSize(event, &headers_size, &value_size);

	if (total > (size_t) outbox_kafka_message_max_bytes)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("event is %zu bytes as a Kafka message, more than the producer's limit of %d bytes",
						total, outbox_kafka_message_max_bytes),
				 value_size == (size_t) event->payload_len ?
				 errdetail("Payload %d bytes, key %zu bytes, headers %zu bytes (the relay's%s and the caller's), record overhead %zu bytes.",
						   event->payload_len, strlen(event->key), headers_size,
						   outbox_message_format == OUTBOX_FORMAT_NATIVE ? "" : ", CloudEvents'",
						   total - headers_size - strlen(event->key) - value_size) :
				 errdetail("Value %zu bytes (the payload's %d in a CloudEvents envelope), key %zu bytes, headers %zu bytes (the relay's, the format's and the caller's), record overhead %zu bytes.",
						   value_size, event->payload_len, strlen(event->key), headers_size,
						   total - headers_size - strlen(event->key) - value_size),
				 errhint("The limit is librdkafka's message.max.bytes, set in outbox.kafka_config.")));
}

/* a payload's size on the wire, refused over outbox.max_payload_bytes */
int
OutboxEmitCheckPayloadSize(size_t payload_len)
{
	if (payload_len > (size_t) outbox_max_payload_bytes)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("event payload is %zu bytes, more than outbox.max_payload_bytes (%d bytes)",
						payload_len, outbox_max_payload_bytes)));
	return (int) payload_len;
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
	return OutboxEmitCheckPayloadSize(payload_len);
}

/*
 * OutboxEmitCheckContent
 *		Validate what the event says: aggregate type and id, event type,
 *		payload (arguments 0..3; emit_binary()'s is emit_binary.c's, and
 *		emit_tombstone() has none) and caller headers (4).  Fills row with them, and
 *		row->event with what the topic and the size check need.
 */
void
OutboxEmitCheckContent(FunctionCallInfo fcinfo, OutboxEmitRow *row)
{
	row->aggregate_type = required_text(fcinfo, 0, "aggregate_type");
	row->aggregate_id = required_text(fcinfo, 1, "aggregate_id");
	row->event_type = required_text(fcinfo, 2, "event_type");
	if (row->event.payload_kind == OUTBOX_PAYLOAD_JSON)
	{
		if (PG_ARGISNULL(3))
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("payload must not be null"),
					 errhint("Use outbox.emit_tombstone() for a message with a null value, or the JSON value 'null'::jsonb for an event whose payload is JSON null.")));
		row->payload = PG_GETARG_JSONB_P(3);
		row->event.payload_len = check_payload(row->payload);
	}

	if (!PG_ARGISNULL(emit_arg(row, 4)))
	{
		row->headers = PG_GETARG_JSONB_P(emit_arg(row, 4));
		check_headers(row->headers, &row->event);
	}
	row->event.aggregate_type = text_to_cstring(row->aggregate_type);
	row->event.aggregate_id = text_to_cstring(row->aggregate_id);
	row->event.event_type = text_to_cstring(row->event_type);
}

/* the topic argument (5), NULL when not given */
char *
OutboxEmitTopicArg(FunctionCallInfo fcinfo, OutboxEmitRow *row)
{
	int			arg = emit_arg(row, 5);

	return PG_ARGISNULL(arg) ? NULL : text_to_cstring(PG_GETARG_TEXT_PP(arg));
}

/*
 * OutboxEmitCheckEnvelope
 *		Validate how the event travels: key (argument 6), occurred_at (9),
 *		schema_version (8), and take or make its event id (7).  Runs after
 *		the topic is resolved: its errors come after the topic's.
 */
void
OutboxEmitCheckEnvelope(FunctionCallInfo fcinfo, OutboxEmitRow *row)
{
	/* an empty key would be partitioned at random by consistent_random */
	row->key = PG_ARGISNULL(emit_arg(row, 6)) ? row->aggregate_id :
		PG_GETARG_TEXT_PP(emit_arg(row, 6));
	if (VARSIZE_ANY_EXHDR(row->key) == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("key must not be empty"),
				 errhint("Pass NULL to use the aggregate id as the key.")));
	refuse_control(row->key, "key");

	row->occurred_at = PG_ARGISNULL(emit_arg(row, 9)) ? GetCurrentTransactionStartTimestamp() :
		PG_GETARG_TIMESTAMPTZ(emit_arg(row, 9));
	row->event.occurred_at = format_occurred_at(row->occurred_at);

	if (PG_ARGISNULL(emit_arg(row, 8)))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("schema_version must not be null")));
	row->event.schema_version = PG_GETARG_INT32(emit_arg(row, 8));
	if (row->event.schema_version < 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("schema_version must be at least 1, not %d",
						row->event.schema_version)));

	row->event_id_given = !PG_ARGISNULL(emit_arg(row, 7));
	if (row->event_id_given)
		row->event_id = PG_GETARG_UUID_P(emit_arg(row, 7));
	else
	{
		row->event_id = palloc(sizeof(pg_uuid_t));
		OutboxGenerateUuidV7(row->event_id);
	}
}
