/*-------------------------------------------------------------------------
 *
 * kafka/message.c
 *		The Kafka message an event becomes: the headers the relay writes,
 *		the size librdkafka counts for it, and the names of the error
 *		classes its delivery can end in.
 *
 * Invariants:
 *	- The relay's headers are named here once, for the relay (producer.c)
 *	  and for emit(), which refuses caller headers of these names.
 *	- A caller header's name is an RFC 9110 token (ASCII letters, digits
 *	  and !#$%&'*+-.^_`|~) of 1 to OUTBOX_HEADER_NAME_MAX_LEN characters,
 *	  and none of the relay's names in any ASCII letter case, nor
 *	  CloudEvents' (ce_..., content-type: message_ce.c) (OutboxCheckHeaderName,
 *	  the one check every caller header passes).
 *	  Being ASCII, no such name folds to a relay header's name under
 *	  Unicode case rules either (U+017F, U+0131 and U+212A, which fold to
 *	  s, i and k, are not in it).
 *	- OutboxEventWireSize counts as librdkafka does when it compares a
 *	  message with message.max.bytes, so that emit() refuses what the relay
 *	  could never publish; it calls no librdkafka function.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "mb/pg_wchar.h"
#include "miscadmin.h"

#include "base/base.h"
#include "kafka/kafka.h"

/*
 * The relay's own Kafka headers, named once for the relay (OutboxProducerSend)
 * and for emit(), which refuses caller headers of these names; in the order
 * of OutboxHeader, which the compiler holds to the count of its members.
 */
#define RELAY_HEADERS(X) \
	X("id") X("event_type") X("aggregate_type") X("aggregate_id") X("seq") \
	X("schema_version") X("occurred_at") X("traceparent") X("tenant") X("origin")
#define HEADER_NAME(s) s,
#define HEADER_NAME_LENGTH(s) (int) sizeof(s) - 1,

const char *const OutboxHeaderNames[] = {RELAY_HEADERS(HEADER_NAME)};

/* their lengths, so that librdkafka need not count them for each message */
const int	OutboxHeaderNameLengths[] = {RELAY_HEADERS(HEADER_NAME_LENGTH)};

StaticAssertDecl(lengthof(OutboxHeaderNames) == OUTBOX_NUM_HEADERS,
				 "a relay header has no name, or a name no header");

/*
 * Per-record overhead librdkafka adds before comparing a message with
 * message.max.bytes (rd_kafka_msg_new0() in rdkafka_msg.c,
 * RD_KAFKAP_MESSAGE_V2_MAX_OVERHEAD in rdkafka_proto.h): the worst-case
 * varint sizes of Length (5), Attributes (1), TimestampDelta (10),
 * OffsetDelta (5), KeyLen (5), ValueLen (5), HeaderCnt (5).
 */
#define LIBRDKAFKA_RECORD_OVERHEAD (5 + 1 + 10 + 5 + 5 + 5 + 5)

/* bytes of a zig-zag varint of a non-negative n (rd_uvarint_enc_i64) */
static size_t
varint_size(size_t n)
{
	uint64		v = (uint64) n << 1;
	size_t		bytes = 1;

	while (v > 0x7f)
	{
		v >>= 7;
		bytes++;
	}
	return bytes;
}

/* a header as librdkafka counts it (rd_kafka_header_add0 in rdkafka_header.c) */
static size_t
header_wire_size(const char *name, const char *value)
{
	size_t		nlen = strlen(name);
	size_t		vlen = strlen(value);

	return nlen + vlen + varint_size(nlen) + varint_size(vlen);
}

/*
 * OutboxEventHeaderValues
 *		The values of the relay's own headers for event, NULL for those it
 *		does not send.  num must hold two numbers (seq, schema_version).
 *		lens, when not NULL, gets each value's length where it is known
 *		without counting (the numbers, and the text read with the event:
 *		OutboxEvent.lens_known), -1 elsewhere.
 */
void
OutboxEventHeaderValues(const OutboxEvent *event, const char **values, int *lens,
						char num[2][32])
{
	int			seq_len = -1;
	int			version_len;

	values[OUTBOX_HEADER_ID] = event->event_id;
	values[OUTBOX_HEADER_EVENT_TYPE] = event->event_type;
	values[OUTBOX_HEADER_AGGREGATE_TYPE] = event->aggregate_type;
	values[OUTBOX_HEADER_AGGREGATE_ID] = event->aggregate_id;
	values[OUTBOX_HEADER_SEQ] = NULL;
	if (event->has_seq)
	{
		seq_len = snprintf(num[0], sizeof(num[0]), INT64_FORMAT, event->seq);
		values[OUTBOX_HEADER_SEQ] = num[0];
	}
	version_len = snprintf(num[1], sizeof(num[1]), "%d", event->schema_version);
	values[OUTBOX_HEADER_SCHEMA_VERSION] = num[1];
	if (lens != NULL)
	{
		int			i;

		/* the text values' lengths as read, when the event was read */
		for (i = 0; i < OUTBOX_NUM_HEADERS; i++)
			lens[i] = event->lens_known ? event->text_lens[i] : -1;
		lens[OUTBOX_HEADER_SEQ] = seq_len;
		lens[OUTBOX_HEADER_SCHEMA_VERSION] = version_len;
	}
	values[OUTBOX_HEADER_OCCURRED_AT] = event->occurred_at;
	values[OUTBOX_HEADER_TRACEPARENT] = event->traceparent;
	values[OUTBOX_HEADER_TENANT] = event->tenant;
	values[OUTBOX_HEADER_ORIGIN] = OutboxOrigin();
}

/*
 * OutboxEventWireSize
 *		The size librdkafka compares with message.max.bytes when the relay
 *		produces event (OutboxProducerSend) under the current
 *		outbox.message_format: overhead, key, value, and every header, the
 *		relay's, the format's and the caller's.  *headers_size and
 *		*value_size get the headers' and the value's shares.
 */
size_t
OutboxEventWireSize(const OutboxEvent *event, size_t *headers_size, size_t *value_size)
{
	const char *values[OUTBOX_NUM_HEADERS];
	char		num[2][32];
	OutboxMessageShape shape;
	size_t		hdrs = 0;
	int			i;

	OutboxEventHeaderValues(event, values, NULL, num);
	for (i = 0; i < OUTBOX_NUM_HEADERS; i++)
		if (values[i] != NULL)
			hdrs += header_wire_size(OutboxHeaderNames[i], values[i]);
	OutboxEventShape(event, &shape, false);
	for (i = 0; i < shape.nextra; i++)
		hdrs += header_wire_size(shape.extra_names[i], shape.extra_values[i]);
	*value_size = shape.value_len;
	OutboxEventShapeFree(&shape);
	for (i = 0; i < event->nheaders; i++)
		hdrs += header_wire_size(event->header_names[i], event->header_values[i]);
	*headers_size = hdrs;
	return LIBRDKAFKA_RECORD_OVERHEAD + strlen(event->key) + *value_size + hdrs;
}

/* the punctuation of an RFC 9110 token, besides ASCII letters and digits */
#define HEADER_NAME_PUNCTUATION "!#$%&'*+-.^_`|~"

/* the rule every name error states, with %d the length and %s the punctuation */
#define HEADER_NAME_RULE \
	"Header names are 1 to %d characters, each an ASCII letter, digit or one of %s (an RFC 9110 token)."

/* whether c may appear in a caller header's name */
static bool
is_token_char(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
		(c >= '0' && c <= '9') ||
		(c != '\0' && strchr(HEADER_NAME_PUNCTUATION, c) != NULL);
}

/*
 * code_point
 *		The Unicode code point of the character at s, or -1 when the server
 *		encoding does not tell it: neither UTF8 nor SQL_ASCII, or SQL_ASCII
 *		bytes that are not UTF-8.  For errors only, so that a look-alike
 *		(U+212A KELVIN SIGN for K) shows what it is.
 */
static int
code_point(const char *s)
{
	const unsigned char *u = (const unsigned char *) s;
	int			enc = GetDatabaseEncoding();
	int			len;

	if (*u < 0x80)
		return *u;
	if (enc != PG_UTF8 && enc != PG_SQL_ASCII)
		return -1;
	len = pg_utf_mblen(u);
	if (strnlen(s, len) < (size_t) len || !pg_utf8_islegal(u, len))
		return -1;
	return (int) utf8_to_unicode(u);
}

/*
 * OutboxCheckHeaderName
 *		Refuse a caller header's name unless it is an RFC 9110 token of 1 to
 *		OUTBOX_HEADER_NAME_MAX_LEN characters and none of the relay's
 *		(OutboxHeaderNames) in any letter case.  Kafka header names are
 *		case-sensitive, but a reader that folds case must not see a forged
 *		"ID", nor one that folds Unicode (Python's upper(), Java's
 *		equalsIgnoreCase) U+017F LATIN SMALL LETTER LONG S + "eq" as "SEQ":
 *		a token is ASCII, whose folding is the ASCII folding checked here.
 *		Every caller header's name goes through here (emit()).
 */
void
OutboxCheckHeaderName(const char *name)
{
	const char *p;
	int			i;

	if (name[0] == '\0')
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("header names must not be empty"),
				 errdetail(HEADER_NAME_RULE, OUTBOX_HEADER_NAME_MAX_LEN,
						   HEADER_NAME_PUNCTUATION)));
	for (p = name; is_token_char(*p); p++)
		;
	/* all before p is ASCII: p - name + 1 counts characters in any encoding */
	if (*p != '\0')
	{
		int			cp = code_point(p);

		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid header name \"%s\"", name),
				 cp >= 0 ?
				 errdetail(HEADER_NAME_RULE " Character %d, U+%04X, is not one of these.",
						   OUTBOX_HEADER_NAME_MAX_LEN, HEADER_NAME_PUNCTUATION,
						   (int) (p - name) + 1, cp) :
				 errdetail(HEADER_NAME_RULE " Character %d is not one of these.",
						   OUTBOX_HEADER_NAME_MAX_LEN, HEADER_NAME_PUNCTUATION,
						   (int) (p - name) + 1)));
	}
	if (p - name > OUTBOX_HEADER_NAME_MAX_LEN)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid header name \"%.32s...\"", name),
				 errdetail(HEADER_NAME_RULE " This one has %d.",
						   OUTBOX_HEADER_NAME_MAX_LEN, HEADER_NAME_PUNCTUATION,
						   (int) (p - name))));
	for (i = 0; i < OUTBOX_NUM_HEADERS; i++)
		if (pg_strcasecmp(name, OutboxHeaderNames[i]) == 0)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("header \"%s\" is reserved", name),
					 errdetail("The relay sets headers id, event_type, aggregate_type, "
							   "aggregate_id, seq, schema_version, occurred_at, "
							   "traceparent and tenant itself; their names are "
							   "reserved in any letter case.")));
	/* CloudEvents' (message_ce.c), whatever outbox.message_format is now */
	if (OutboxHeaderIsCloudEvents(name))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("header \"%s\" is reserved", name),
				 errdetail("Names that begin with ce_ or ce-, and content-type, are CloudEvents' "
						   "(outbox.message_format), reserved in any letter case.")));
}

/*
 * OutboxHeaderIsCloudEvents
 *		Whether a header of this name reads as a CloudEvents attribute or
 *		content type to some reader: ce_ (Kafka's binding), ce- (HTTP's,
 *		which Spring folds Kafka's into), content-type, in any letter case.
 */
bool
OutboxHeaderIsCloudEvents(const char *name)
{
	return pg_strncasecmp(name, "ce_", 3) == 0 || pg_strncasecmp(name, "ce-", 3) == 0 ||
		pg_strcasecmp(name, "content-type") == 0;
}

/*
 * OutboxErrorClassName
 *		The name status(), metrics(), the dead letters and the log give an
 *		error class.
 */
const char *
OutboxErrorClassName(OutboxErrorClass c)
{
	switch (c)
	{
		case OUTBOX_ERROR_NONE:
			return "none";
		case OUTBOX_ERROR_TRANSIENT:
			return "transient";
		case OUTBOX_ERROR_PERMANENT:
			return "permanent";
		case OUTBOX_ERROR_FATAL:
			return "fatal";
		case OUTBOX_ERROR_SCHEMA:
			return "schema";
	}
	return "unknown";
}
