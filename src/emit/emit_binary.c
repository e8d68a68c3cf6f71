/*-------------------------------------------------------------------------
 *
 * emit/emit_binary.c
 *		emit_binary()'s own arguments, each hostile input: the bytes, their
 *		content type, and the schema registry's frame put before them.
 *
 * Invariants:
 *	- The bytes reach Kafka as the row stores them: framed here, once,
 *	  when schema_id is given, and never touched by the relay.
 *	- The frame is the wire format Confluent's, Apicurio's and Karapace's
 *	  deserializers read: magic byte 0, the schema id as 4 bytes big-endian,
 *	  and for Protobuf the message indexes (their count, then each, as
 *	  zig-zag varints; the common [0] as the single byte 0).
 *	- outbox.max_payload_bytes counts the framed bytes, which are the value.
 *	- content_type is a media type (RFC 6838 names, printable ASCII
 *	  parameters), and not application/cloudevents...: it travels as a
 *	  Kafka header and, in the CloudEvents formats, as datacontenttype,
 *	  and a CloudEvents content type would have readers take the bytes for
 *	  an envelope whose attributes the writer chose.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "fmgr.h"
#include "utils/array.h"
#include "utils/builtins.h"

#include "base/base.h"
#include "kafka/kafka.h"
#include "emit/emit.h"

/* emit_binary()'s arguments after emit()'s */
#define ARG_CONTENT_TYPE	10
#define ARG_SCHEMA_ID		11
#define ARG_MESSAGE_INDEXES	12

#define CONTENT_TYPE_MAX	255
#define MESSAGE_INDEXES_MAX	64
#define FRAME_MAX			(5 + 5 * (MESSAGE_INDEXES_MAX + 1))

/* a character RFC 6838 allows in a type or subtype name after the first */
static bool
is_name_char(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
		(c >= '0' && c <= '9') || strchr("!#$&-^_.+", c) != NULL;
}

/* the length of the RFC 6838 name at s, 0 when there is none */
static int
name_length(const char *s)
{
	int			n = 0;

	if (!((s[0] >= 'a' && s[0] <= 'z') || (s[0] >= 'A' && s[0] <= 'Z') ||
		  (s[0] >= '0' && s[0] <= '9')))
		return 0;
	while (s[n] != '\0' && is_name_char(s[n]) && n < 127)
		n++;
	return n;
}

/*
 * content_type_is_valid
 *		Whether value is type/subtype, then nothing or parameters (";" after
 *		optional spaces, then printable ASCII), at most CONTENT_TYPE_MAX
 *		bytes, and not CloudEvents' own: a message whose content type is
 *		application/cloudevents... is read as a whole CloudEvent (or a
 *		batch of them) taken from the value, so a writer's bytes could
 *		forge the attributes outbox sets.
 */
static bool
content_type_is_valid(const char *value)
{
	const char *p = value;
	int			n;

	if (strlen(value) > CONTENT_TYPE_MAX ||
		pg_strncasecmp(value, "application/cloudevents", 23) == 0)
		return false;
	if ((n = name_length(p)) == 0 || p[n] != '/')
		return false;
	p += n + 1;
	if ((n = name_length(p)) == 0)
		return false;
	p += n;
	if (*p == '\0')
		return true;
	while (*p == ' ')
		p++;
	if (*p != ';')
		return false;			/* nor trailing spaces */
	for (; *p != '\0'; p++)
		if (*p < 0x20 || *p > 0x7e)
			return false;
	return true;
}

/* n as a zig-zag varint (Kafka's, and the registries'), at out; its length */
static int
put_varint(unsigned char *out, int32 n)
{
	uint32		v = ((uint32) n << 1) ^ (uint32) (n >> 31);
	int			len = 0;

	while (v > 0x7f)
	{
		out[len++] = (unsigned char) ((v & 0x7f) | 0x80);
		v >>= 7;
	}
	out[len++] = (unsigned char) v;
	return len;
}

/*
 * message_indexes
 *		The Protobuf message indexes of argument ARG_MESSAGE_INDEXES as the
 *		frame carries them, at out; their length.
 */
static int
message_indexes(FunctionCallInfo fcinfo, unsigned char *out)
{
	ArrayType  *arr = PG_GETARG_ARRAYTYPE_P(ARG_MESSAGE_INDEXES);
	Datum	   *elems;
	bool	   *nulls;
	int			n;
	int			len;

	if (ARR_NDIM(arr) > 1)
		ereport(ERROR,
				(errcode(ERRCODE_ARRAY_SUBSCRIPT_ERROR),
				 errmsg("message_indexes must be a one-dimensional array")));
	deconstruct_array(arr, INT4OID, sizeof(int32), true, TYPALIGN_INT,
					  &elems, &nulls, &n);
	if (n == 0 || n > MESSAGE_INDEXES_MAX)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("message_indexes must have between 1 and %d elements, not %d",
						MESSAGE_INDEXES_MAX, n),
				 errhint("'{0}' names the first message type of the schema.")));
	for (int i = 0; i < n; i++)
	{
		if (nulls[i])
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("message_indexes must not contain nulls")));
		if (DatumGetInt32(elems[i]) < 0)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("message_indexes must not be negative, not %d",
							DatumGetInt32(elems[i]))));
	}
	/* the registries' short form of the most common list */
	if (n == 1 && DatumGetInt32(elems[0]) == 0)
		return put_varint(out, 0);
	len = put_varint(out, n);
	for (int i = 0; i < n; i++)
		len += put_varint(out + len, DatumGetInt32(elems[i]));
	return len;
}

/*
 * frame
 *		The schema registry's frame for schema_id (argument ARG_SCHEMA_ID),
 *		with the Protobuf message indexes when given, at out; its length.
 *		0 without schema_id.
 */
static int
frame(FunctionCallInfo fcinfo, unsigned char *out)
{
	int32		id;

	if (PG_ARGISNULL(ARG_SCHEMA_ID))
	{
		if (!PG_ARGISNULL(ARG_MESSAGE_INDEXES))
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("schema_id must not be null when message_indexes is given"),
					 errhint("The message indexes are part of a schema registry's frame, which needs the schema id.")));
		return 0;
	}
	id = PG_GETARG_INT32(ARG_SCHEMA_ID);
	if (id < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("schema_id must not be negative, not %d", id),
				 errhint("It is the id the schema registry gave the schema.")));
	out[0] = 0;					/* the wire format's magic byte */
	out[1] = (unsigned char) ((uint32) id >> 24);
	out[2] = (unsigned char) ((uint32) id >> 16);
	out[3] = (unsigned char) ((uint32) id >> 8);
	out[4] = (unsigned char) id;
	if (PG_ARGISNULL(ARG_MESSAGE_INDEXES))
		return 5;
	return 5 + message_indexes(fcinfo, out + 5);
}

/*
 * OutboxEmitCheckBinary
 *		emit_binary()'s payload (argument 3), content type and frame: the
 *		bytes the relay will send, framed, into row->payload_bytes and
 *		row->event.
 */
void
OutboxEmitCheckBinary(FunctionCallInfo fcinfo, OutboxEmitRow *row)
{
	bytea	   *payload;
	unsigned char head[FRAME_MAX];
	int			head_len;
	size_t		len;

	if (PG_ARGISNULL(3))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("payload must not be null"),
				 errhint("Use outbox.emit_tombstone() for a message with a null value.")));
	payload = PG_GETARG_BYTEA_PP(3);
	if (!PG_ARGISNULL(ARG_CONTENT_TYPE))
	{
		row->content_type = PG_GETARG_TEXT_PP(ARG_CONTENT_TYPE);
		row->event.content_type = text_to_cstring(row->content_type);
		if (!content_type_is_valid(row->event.content_type))
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("content_type must be a media type such as application/avro, not CloudEvents' own"),
					 errdetail("It is type/subtype (RFC 6838 names), then optional \";\" parameters in printable ASCII, at most %d bytes; application/cloudevents... would have readers take the bytes for a CloudEvent.",
							   CONTENT_TYPE_MAX)));
	}
	head_len = frame(fcinfo, head);
	len = (size_t) head_len + VARSIZE_ANY_EXHDR(payload);
	row->event.payload_len = OutboxEmitCheckPayloadSize(len);
	if (head_len == 0)
		row->payload_bytes = payload;
	else
	{
		row->payload_bytes = palloc(VARHDRSZ + len);
		SET_VARSIZE(row->payload_bytes, VARHDRSZ + len);
		memcpy(VARDATA(row->payload_bytes), head, head_len);
		memcpy(VARDATA(row->payload_bytes) + head_len, VARDATA_ANY(payload),
			   VARSIZE_ANY_EXHDR(payload));
	}
	row->event.payload = VARDATA_ANY(row->payload_bytes);
}
