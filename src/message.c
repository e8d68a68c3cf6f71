/*-------------------------------------------------------------------------
 *
 * message.c
 *		The Kafka message an event becomes: the headers the relay writes,
 *		the size librdkafka counts for it, and the names of the error
 *		classes its delivery can end in.
 *
 * Invariants:
 *	- The relay's headers are named here once, for the relay (kafka.c)
 *	  and for emit(), which refuses caller headers of these names.
 *	- OutboxEventWireSize counts as librdkafka does when it compares a
 *	  message with message.max.bytes, so that emit() refuses what the relay
 *	  could never publish; it calls no librdkafka function.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xlog.h"
#include "miscadmin.h"

#include "outbox.h"

/*
 * The relay's own Kafka headers, named once for the relay (OutboxProducerSend)
 * and for emit(), which refuses caller headers of these names.
 */
const char *const OutboxHeaderNames[OUTBOX_NUM_HEADERS] = {
	[OUTBOX_HEADER_ID] = "id",
	[OUTBOX_HEADER_EVENT_TYPE] = "event_type",
	[OUTBOX_HEADER_AGGREGATE_TYPE] = "aggregate_type",
	[OUTBOX_HEADER_AGGREGATE_ID] = "aggregate_id",
	[OUTBOX_HEADER_SEQ] = "seq",
	[OUTBOX_HEADER_SCHEMA_VERSION] = "schema_version",
	[OUTBOX_HEADER_OCCURRED_AT] = "occurred_at",
	[OUTBOX_HEADER_TRACEPARENT] = "traceparent",
	[OUTBOX_HEADER_TENANT] = "tenant",
	[OUTBOX_HEADER_ORIGIN] = "origin",
};

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
 */
void
OutboxEventHeaderValues(const OutboxEvent *event, const char **values, char num[2][32])
{
	values[OUTBOX_HEADER_ID] = event->event_id;
	values[OUTBOX_HEADER_EVENT_TYPE] = event->event_type;
	values[OUTBOX_HEADER_AGGREGATE_TYPE] = event->aggregate_type;
	values[OUTBOX_HEADER_AGGREGATE_ID] = event->aggregate_id;
	values[OUTBOX_HEADER_SEQ] = NULL;
	if (event->has_seq)
	{
		snprintf(num[0], sizeof(num[0]), INT64_FORMAT, event->seq);
		values[OUTBOX_HEADER_SEQ] = num[0];
	}
	snprintf(num[1], sizeof(num[1]), "%d", event->schema_version);
	values[OUTBOX_HEADER_SCHEMA_VERSION] = num[1];
	values[OUTBOX_HEADER_OCCURRED_AT] = event->occurred_at;
	values[OUTBOX_HEADER_TRACEPARENT] = event->traceparent;
	values[OUTBOX_HEADER_TENANT] = event->tenant;
	values[OUTBOX_HEADER_ORIGIN] = OutboxOrigin();
}

/*
 * OutboxOrigin
 *		The database an event comes from, as "<system identifier>/<database
 *		OID>": the same in the backend that emits it (its size check) and
 *		in the relay that sends it.  Subscribers scope their dedupe by it,
 *		so that a writer of one database cannot suppress another's events
 *		by choosing their ids.  Computed once per process.
 */
const char *
OutboxOrigin(void)
{
	static char origin[48];
	static Oid	origin_db = InvalidOid;

	if (origin_db != MyDatabaseId)
	{
		snprintf(origin, sizeof(origin), UINT64_FORMAT "/%u",
				 GetSystemIdentifier(), MyDatabaseId);
		origin_db = MyDatabaseId;
	}
	return origin;
}

/*
 * OutboxEventWireSize
 *		The size librdkafka compares with message.max.bytes when the relay
 *		produces event (OutboxProducerSend): overhead, key, value, and every
 *		header, the relay's and the caller's.  *headers_size gets the
 *		headers' share.
 */
size_t
OutboxEventWireSize(const OutboxEvent *event, size_t *headers_size)
{
	const char *values[OUTBOX_NUM_HEADERS];
	char		num[2][32];
	size_t		hdrs = 0;
	int			i;

	OutboxEventHeaderValues(event, values, num);
	for (i = 0; i < OUTBOX_NUM_HEADERS; i++)
		if (values[i] != NULL)
			hdrs += header_wire_size(OutboxHeaderNames[i], values[i]);
	for (i = 0; i < event->nheaders; i++)
		hdrs += header_wire_size(event->header_names[i], event->header_values[i]);
	*headers_size = hdrs;
	return LIBRDKAFKA_RECORD_OVERHEAD + strlen(event->key) +
		(size_t) event->payload_len + hdrs;
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
	}
	return "unknown";
}
