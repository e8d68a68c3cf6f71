/*-------------------------------------------------------------------------
 *
 * consumer/consumer_message.c
 *		A message as the subscription worker hands it to the handler and
 *		keeps it in a dead letter: the composite outbox.inbound_message,
 *		built from what the Kafka consumer copied out.
 *
 * Invariants:
 *	- Anything in a message may be hostile.  A key, header or value that
 *	  is not text of the database's encoding (or holds a NUL) is NULL in
 *	  the composite, never an error; the raw value is always kept as
 *	  bytea.
 *	- The relay's own headers cannot be overridden by a caller's header
 *	  of the same name: for those the first wins (see header()).
 *	- Parsing the payload as JSON may ERROR on a hostile value, so the
 *	  composite with the payload is built inside a subtransaction of the
 *	  caller's (OutboxSubscriberKeptMessage) or of the message's own.
 *
 * Nothing here runs SQL.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "funcapi.h"
#include "mb/pg_wchar.h"
#include "utils/builtins.h"
#include "utils/json.h"
#include "utils/jsonb.h"
#include "utils/timestamp.h"
#include "utils/uuid.h"

#include "base/compat.h"
#include "consumer/consumer_worker.h"
#include "base/base.h"
#include "kafka/kafka.h"

#define ATTRS				14		/* outbox.inbound_message */

/* a Kafka timestamp (ms since the Unix epoch) as a timestamptz */
static TimestampTz
timestamp_from_unix_ms(int64 ms)
{
	return (TimestampTz) (ms * 1000) -
		(TimestampTz) (POSTGRES_EPOCH_JDATE - UNIX_EPOCH_JDATE) * USECS_PER_DAY;
}

/*
 * OutboxSubscriberIsText
 *		Whether len bytes at s are text of the database's encoding (no NUL).
 */
bool
OutboxSubscriberIsText(const char *s, int len)
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
					 OutboxSubscriberIsText(m->header_values[i], m->header_lens[i])) ?
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

/* the headers as a JSON object's text, relay headers repeated left out */
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

		if (!OutboxSubscriberIsText(name, strlen(name)) || repeated_relay_header(m, i))
			continue;
		if (!first)
			appendStringInfoString(&buf, ", ");
		first = false;
		escape_json(&buf, name);
		appendStringInfoString(&buf, ": ");
		if (m->header_values[i] != NULL && OutboxSubscriberIsText(m->header_values[i], m->header_lens[i]))
			escape_json(&buf, m->header_values[i]);
		else
			appendStringInfoString(&buf, "null");
	}
	appendStringInfoChar(&buf, '}');
	return buf.data;
}

/* attribute i of the composite: s as text, NULL when s is */
static void
set_text(Datum *values, bool *nulls, int i, const char *s)
{
	nulls[i] = s == NULL;
	values[i] = s != NULL ? CStringGetTextDatum(s) : (Datum) 0;
}

/* the seq header as a bigint, when it is one */
static bool
seq_of(const OutboxInbound *m, int64 *seq)
{
	const char *s = header(m, "seq");
	char	   *end;
	long long	v;

	if (s == NULL)
		return false;
	errno = 0;
	v = strtoll(s, &end, 10);
	if (errno != 0 || end == s || *end != '\0')
		return false;
	*seq = (int64) v;
	return true;
}

/* the value as bytea (m->value not NULL) */
static Datum
value_bytea(const OutboxInbound *m)
{
	bytea	   *b = palloc(VARHDRSZ + m->value_len);

	SET_VARSIZE(b, VARHDRSZ + m->value_len);
	memcpy(VARDATA(b), m->value, m->value_len);
	return PointerGetDatum(b);
}

/*
 * OutboxSubscriberMessage
 *		The outbox.inbound_message of m.  With payload, the value is parsed
 *		as JSON (NULL when it is not JSON); may ERROR on a hostile value, so
 *		it is built inside the message's subtransaction.
 */
Datum
OutboxSubscriberMessage(Worker *w, const OutboxInbound *m, bool payload)
{
	Datum		values[ATTRS];
	bool		nulls[ATTRS];
	pg_uuid_t  *id = palloc(sizeof(pg_uuid_t));
	int64		seq = 0;

	memset(nulls, 0, sizeof(nulls));
	set_text(values, nulls, 0, w->sub.name);
	set_text(values, nulls, 1, m->topic);
	values[2] = Int32GetDatum(m->partition);
	values[3] = Int64GetDatum(m->offset);
	/* a producer's CreateTime is anything: years 1970 to 5000 only */
	if (m->timestamp_ms >= 0 && m->timestamp_ms < INT64CONST(95617584000000))
		values[4] = TimestampTzGetDatum(timestamp_from_unix_ms(m->timestamp_ms));
	else
		nulls[4] = true;
	set_text(values, nulls, 5,
			 m->key != NULL && OutboxSubscriberIsText(m->key, m->key_len) ? m->key : NULL);
	values[6] = DirectFunctionCall1(jsonb_in, CStringGetDatum(headers_json(m)));
	nulls[7] = !(payload && m->value != NULL &&
				 OutboxSubscriberIsText(m->value, m->value_len) &&
				 OutboxJsonIsValid(m->value, m->value_len));
	if (!nulls[7])
		values[7] = DirectFunctionCall1(jsonb_in, CStringGetDatum(m->value));
	nulls[8] = m->value == NULL;
	if (!nulls[8])
		values[8] = value_bytea(m);
	nulls[9] = !event_id_of(m, id);
	values[9] = UUIDPGetDatum(id);
	set_text(values, nulls, 10, header(m, "event_type"));
	set_text(values, nulls, 11, header(m, "aggregate_type"));
	set_text(values, nulls, 12, header(m, "aggregate_id"));
	nulls[13] = !seq_of(m, &seq);
	values[13] = Int64GetDatum(seq);
	return HeapTupleGetDatum(heap_form_tuple(w->tupdesc, values, nulls));
}

/* what OutboxSubscriberKeptMessage's subtransaction works on */
typedef struct DatumBuild
{
	const OutboxInbound *m;
	Datum		result;
} DatumBuild;

/* the subtransaction's body: the composite with the payload parsed */
static void
build_with_payload(Worker *w, void *arg)
{
	DatumBuild *b = (DatumBuild *) arg;

	b->result = OutboxSubscriberMessage(w, b->m, true);
}

/*
 * OutboxSubscriberKeptMessage
 *		The composite a dead letter keeps, payload parsed when that works:
 *		a value that makes the JSON parser ERROR is kept with payload NULL.
 *		Runs inside the caller's transaction.
 */
Datum
OutboxSubscriberKeptMessage(Worker *w, const OutboxInbound *m)
{
	DatumBuild	b;

	b.m = m;
	if (OutboxSubscriberTry(w, build_with_payload, &b, NULL))
		return b.result;
	return OutboxSubscriberMessage(w, m, false);
}

/*
 * OutboxSubscriberMessageAttr
 *		Attribute attno (OUTBOX_MESSAGE_*) of a composite
 *		outbox.inbound_message; *isnull says whether it is NULL.
 */
Datum
OutboxSubscriberMessageAttr(Worker *w, Datum message, int attno, bool *isnull)
{
	HeapTupleHeader th = DatumGetHeapTupleHeader(message);
	HeapTupleData tmp;

	tmp.t_len = HeapTupleHeaderGetDatumLength(th);
	ItemPointerSetInvalid(&(tmp.t_self));
	tmp.t_tableOid = InvalidOid;
	tmp.t_data = th;
	return heap_getattr(&tmp, attno, w->tupdesc, isnull);
}
