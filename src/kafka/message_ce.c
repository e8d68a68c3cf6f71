/*-------------------------------------------------------------------------
 *
 * kafka/message_ce.c
 *		The shape of an event's message under outbox.message_format: its
 *		value and the headers the format adds to the relay's own.  native
 *		adds none; cloudevents_binary and cloudevents_structured are
 *		CloudEvents 1.0.2 in Kafka's protocol binding (binary: ce_ attribute
 *		headers beside the payload; structured: a JSON envelope holding the
 *		payload as data).
 *
 * Invariants:
 *	- One place builds the shape (OutboxEventShape), for the relay
 *	  (producer.c) and for emit()'s size check (OutboxEventWireSize), so
 *	  that what emit() accepts under the current format is what the relay
 *	  sends.
 *	- The relay's own headers stay in every format: subscribers dedupe by
 *	  id and origin whatever the format.  The key stays the message key.
 *	- The attributes: id the event id, source outbox.cloudevents_source or
 *	  urn:uuid:<origin>, type the event type, time occurred_at (when it is
 *	  RFC 3339: a row emit() did not write may be infinite), subject the
 *	  aggregate id, sequence the aggregate's seq as a wrapping int32 (sequencetype Integer)
 *	  when there is one, traceparent when set, partitionkey the key,
 *	  datacontenttype application/json (emit_binary()'s content type, or
 *	  none, for bytes).  Every value is text the relay read from the
 *	  database; the envelope escapes each as a JSON string, and its data is
 *	  the payload's JSON text as PostgreSQL printed it, or data_base64 the
 *	  bytes'.
 *	- A tombstone's value stays null in every format: in the CloudEvents
 *	  formats it has the attribute headers (binary mode), as no envelope
 *	  can be null.
 *	- Caller headers cannot forge them: emit() reserves the ce_ prefix and
 *	  content-type in any letter case (message.c).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "lib/stringinfo.h"
#include "utils/memutils.h"
#include "utils/json.h"

#include "base/base.h"
#include "kafka/kafka.h"

#define CE_SPECVERSION		"1.0"
#define CE_DATA_TYPE		"application/json"
#define CE_STRUCTURED_TYPE	"application/cloudevents+json; charset=UTF-8"

/* the source when outbox.cloudevents_source is empty: the database's UUID */
static const char *
ce_source(char *buf, size_t len)
{
	if (outbox_cloudevents_source != NULL && outbox_cloudevents_source[0] != '\0')
		return outbox_cloudevents_source;
	snprintf(buf, len, "urn:uuid:%s", OutboxOrigin());
	return buf;
}

/*
 * The sequence attribute of seq: sequencetype Integer is a signed 32-bit
 * count from 1 that wraps from 2^31 - 1 to -2^31, as seq past 2^31 does.
 */
static int32
ce_sequence(int64 seq)
{
	return (int32) (uint32) (uint64) seq;
}

/*
 * Whether occurred_at, as the relay formats it, is an RFC 3339 timestamp:
 * emit() writes only those, but a row written otherwise may be infinite or
 * outside the years 0 to 9999, and then the event has no time attribute.
 */
static bool
ce_time_ok(const char *occurred_at)
{
	return strlen(occurred_at) == 27 && isdigit((unsigned char) occurred_at[0]) &&
		occurred_at[4] == '-';
}

static void
add_header(OutboxMessageShape *shape, const char *name, const char *value)
{
	Assert(shape->nextra < OUTBOX_SHAPE_MAX_HEADERS);
	shape->extra_names[shape->nextra] = name;
	shape->extra_values[shape->nextra] = value;
	shape->nextra++;
}

/* one "name": "value" member of the envelope, after the first */
static void
member(StringInfo out, const char *name, const char *value)
{
	appendStringInfo(out, ",\"%s\":", name);
	escape_json(out, value);
}

/* bytes of src in base64 (RFC 4648, padded), appended to out */
static void
append_base64(StringInfo out, const unsigned char *src, int len)
{
	static const char digits[] =
		"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
	int			i;

	for (i = 0; i < len; i += 3)
	{
		uint32		w = (uint32) src[i] << 16;

		if (i + 1 < len)
			w |= (uint32) src[i + 1] << 8;
		if (i + 2 < len)
			w |= src[i + 2];
		appendStringInfoChar(out, digits[(w >> 18) & 63]);
		appendStringInfoChar(out, digits[(w >> 12) & 63]);
		appendStringInfoChar(out, i + 1 < len ? digits[(w >> 6) & 63] : '=');
		appendStringInfoChar(out, i + 2 < len ? digits[w & 63] : '=');
	}
}

/*
 * envelope
 *		The structured mode's value: the attributes, then data (JSON) or
 *		data_base64 (bytes).  Without with_data (emit()'s size check, where
 *		the payload may not be text yet) the data is left out: the caller
 *		counts its length.
 */
static void
envelope(StringInfo out, const OutboxMessageShape *shape, const OutboxEvent *ev,
		 bool with_data)
{
	bool		bytes = (ev->payload_kind == OUTBOX_PAYLOAD_BYTES);

	appendStringInfoString(out, "{\"specversion\":\"" CE_SPECVERSION "\"");
	member(out, "id", ev->event_id);
	member(out, "source", shape->source);
	member(out, "type", ev->event_type);
	if (ce_time_ok(ev->occurred_at))
		member(out, "time", ev->occurred_at);
	member(out, "subject", ev->aggregate_id);
	if (ev->has_seq)
		appendStringInfo(out, ",\"sequence\":\"%s\",\"sequencetype\":\"Integer\"",
						 shape->seq);
	if (ev->traceparent != NULL)
		member(out, "traceparent", ev->traceparent);
	member(out, "partitionkey", ev->key);
	if (!bytes)
		member(out, "datacontenttype", CE_DATA_TYPE);
	else if (ev->content_type != NULL)
		member(out, "datacontenttype", ev->content_type);
	appendStringInfoString(out, bytes ? ",\"data_base64\":\"" : ",\"data\":");
	if (with_data && bytes)
		append_base64(out, (const unsigned char *) ev->payload, ev->payload_len);
	else if (with_data)
		appendBinaryStringInfo(out, ev->payload, ev->payload_len);
	appendStringInfoString(out, bytes ? "\"}" : "}");
}

/* the size of the payload as the envelope carries it */
static size_t
envelope_data_size(const OutboxEvent *ev)
{
	if (ev->payload_kind == OUTBOX_PAYLOAD_BYTES)
		return 4 * (((size_t) ev->payload_len + 2) / 3);
	return (size_t) ev->payload_len;
}

/* binary mode's attribute headers, content-type aside */
static void
attribute_headers(OutboxMessageShape *shape, const OutboxEvent *ev)
{
	add_header(shape, "ce_specversion", CE_SPECVERSION);
	add_header(shape, "ce_id", ev->event_id);
	add_header(shape, "ce_source", shape->source);
	add_header(shape, "ce_type", ev->event_type);
	if (ce_time_ok(ev->occurred_at))
		add_header(shape, "ce_time", ev->occurred_at);
	add_header(shape, "ce_subject", ev->aggregate_id);
	if (ev->has_seq)
	{
		add_header(shape, "ce_sequence", shape->seq);
		add_header(shape, "ce_sequencetype", "Integer");
	}
	if (ev->traceparent != NULL)
		add_header(shape, "ce_traceparent", ev->traceparent);
	add_header(shape, "ce_partitionkey", ev->key);
}

/*
 * OutboxEventShape
 *		The value and the added headers of ev's message under the current
 *		outbox.message_format.  The value is the payload (JSON text or
 *		emit_binary()'s bytes), or none for a tombstone.  native adds only
 *		emit_binary()'s content-type.  cloudevents_binary adds the attribute
 *		headers and content-type (the datacontenttype: application/json, or
 *		emit_binary()'s when it gave one).  cloudevents_structured sends the
 *		envelope, bytes as data_base64; a tombstone, whose null value cannot
 *		be an envelope, goes in binary mode.  with_data false (emit()'s size
 *		check) leaves the data out of an envelope and counts it in value_len.
 *		Free with OutboxEventShapeFree.
 */
void
OutboxEventShape(const OutboxEvent *ev, OutboxMessageShape *shape, bool with_data)
{
	const char *content_type = NULL;

	memset(shape, 0, sizeof(*shape));
	shape->value = ev->payload;
	shape->value_len = (size_t) ev->payload_len;
	if (ev->payload_kind == OUTBOX_PAYLOAD_BYTES)
		content_type = ev->content_type;
	else if (ev->payload_kind == OUTBOX_PAYLOAD_JSON &&
			 outbox_message_format != OUTBOX_FORMAT_NATIVE)
		content_type = CE_DATA_TYPE;
	if (outbox_message_format != OUTBOX_FORMAT_NATIVE)
	{
		shape->source = ce_source(shape->source_buf, sizeof(shape->source_buf));
		if (ev->has_seq)
			snprintf(shape->seq, sizeof(shape->seq), "%d", ce_sequence(ev->seq));
	}
	if (outbox_message_format == OUTBOX_FORMAT_CE_STRUCTURED &&
		ev->payload_kind != OUTBOX_PAYLOAD_NONE)
	{
		StringInfoData out;

		initStringInfo(&out);
		envelope(&out, shape, ev, with_data);
		shape->envelope = out.data;
		shape->value = out.data;
		shape->value_len = (size_t) out.len + (with_data ? 0 : envelope_data_size(ev));
		add_header(shape, "content-type", CE_STRUCTURED_TYPE);
		return;
	}
	if (outbox_message_format != OUTBOX_FORMAT_NATIVE)
		attribute_headers(shape, ev);
	if (content_type != NULL)
		add_header(shape, "content-type", content_type);
}

/*
 * OutboxEventShapeFits
 *		Whether ev's message can be built in memory under the current format:
 *		an envelope (base64 a third larger than the bytes) must stay under
 *		palloc's 1 GB.  emit() accepts nothing that large in the format it
 *		emits under; an event emitted under another format can be.
 */
bool
OutboxEventShapeFits(const OutboxEvent *ev)
{
	return outbox_message_format != OUTBOX_FORMAT_CE_STRUCTURED ||
		ev->payload_kind == OUTBOX_PAYLOAD_NONE ||
		envelope_data_size(ev) < MaxAllocSize - 1024 * 1024;
}

void
OutboxEventShapeFree(OutboxMessageShape *shape)
{
	if (shape->envelope != NULL)
		pfree(shape->envelope);
	shape->envelope = NULL;
}
