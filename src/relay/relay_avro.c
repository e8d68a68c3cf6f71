/*-------------------------------------------------------------------------
 *
 * relay/relay_avro.c
 *		Avro topics (outbox.avro_topics): each JSON event's value encoded
 *		with its topic's latest schema from the registry before it is sent;
 *		the schemas fetched and recorded (outbox.schemas) for validate();
 *		the secrets read, Kafka's and the registry's.
 *
 * Invariants:
 *	- An event is encoded once, before its first send: its value becomes
 *	  the framed record (OUTBOX_PAYLOAD_BYTES), which every later round and
 *	  every message format carries unchanged.
 *	- A payload that does not fit is the event's fault: it is quarantined
 *	  (class schema) and nothing of it is sent; so is an event whose
 *	  subject the registry rules out (not there, not Avro, not usable), so
 *	  that one topic cannot stop the others.  A registry that does not
 *	  answer is nobody's fault: the page waits, backing off, and nothing is
 *	  lost or reordered.
 *	- The registry's calls are bounded (registry_client.c), and made with
 *	  no transaction open.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "utils/builtins.h"
#include "utils/jsonb.h"
#include "utils/memutils.h"
#include "postmaster/interrupt.h"

#include "registry/registry.h"
#include "relay/relay_state.h"

/*
 * OutboxRelayReadSecrets
 *		Read outbox.kafka_secrets_file, at start and at each reload: the
 *		producer's properties (producer.c) and the registry's credentials.
 */
void
OutboxRelayReadSecrets(Relay *r)
{
	char	   *auth;

	if (r->avro_cxt == NULL)
		r->avro_cxt = AllocSetContextCreate(r->cxt, "outbox relay avro",
											ALLOCSET_DEFAULT_SIZES);
	OutboxRegistryUseContext(r->cxt);
	OutboxKafkaReadSecretsFile(r->cxt);
	auth = OutboxKafkaSecretValue(OutboxKafkaSecretsText(), OUTBOX_REGISTRY_AUTH_PROPERTY);
	OutboxRegistryReadSecrets(auth);
	if (auth != NULL)
	{
		explicit_bzero(auth, strlen(auth));
		pfree(auth);
	}
}

/* a schema new for its topic: recorded for validate() */
static void
record_schema(Relay *r, const char *topic, OutboxAvroSchema *schema, const char *json)
{
	OutboxRelayBeginTxn("recording a topic's Avro schema");
	OutboxStoreRecordSchema(topic, OutboxAvroSchemaId(schema), json);
	OutboxRelayEndTxn(r);
	ereport(LOG,
			(errmsg("outbox relay encodes topic \"%s\" with Avro schema %d",
					topic, OutboxAvroSchemaId(schema))));
}

/*
 * topic_schema
 *		topic's schema (the registry asked as *may_ask allows), recorded
 *		when new.  NULL when there is none: *why is UNAVAILABLE (noted for
 *		status()) or UNFIT (the registry ruled the subject out: err says
 *		how, and the event is the one to quarantine).
 */
static OutboxAvroSchema *
topic_schema(Relay *r, const char *topic, bool *may_ask, RelayAvro *why,
			 char *err, size_t errlen)
{
	OutboxAvroSchema *schema = NULL;
	const char *json = NULL;

	switch (OutboxRegistryTopicSchema(topic, may_ask, &schema, &json, err, errlen))
	{
		case OUTBOX_SCHEMA_FETCHED:
			record_schema(r, topic, schema, json);
			return schema;
		case OUTBOX_SCHEMA_FOUND:
			if (err[0] != '\0')
				OutboxRelayReportError(r, "could not refresh a topic's Avro schema, using the one in hand", err);
			err[0] = '\0';
			return schema;
		case OUTBOX_SCHEMA_REFUSED:
			*why = RELAY_AVRO_UNFIT;
			return NULL;
		case OUTBOX_SCHEMA_UNAVAILABLE:
			break;
	}
	OutboxRelayReportError(r, "no Avro schema for a topic, waiting", err);
	err[0] = '\0';
	*why = RELAY_AVRO_UNAVAILABLE;
	return NULL;
}

/*
 * OutboxRelayFetchSchemas
 *		When idle: the schemas of the topics outbox.avro_topics names, so
 *		that validate() has them before their first event, and refreshed
 *		on time.  ("*" names no topic here: those are met as they come.)
 */
void
OutboxRelayFetchSchemas(Relay *r)
{
	char	   *copy;
	char	   *item;
	char	   *save = NULL;
	char		err[OUTBOX_REGISTRY_ERROR_LEN];
	RelayAvro	why;

	if (outbox_avro_topics[0] == '\0' || outbox_schema_registry_url[0] == '\0')
		return;
	copy = pstrdup(outbox_avro_topics);
	for (item = strtok_r(copy, ", ", &save); item != NULL && !ShutdownRequestPending;
		 item = strtok_r(NULL, ", ", &save))
	{
		bool		may_ask = true;

		if (strcmp(item, "*") != 0)
			(void) topic_schema(r, item, &may_ask, &why, err, sizeof(err));
	}
	pfree(copy);
}

/* whether ev's value is JSON for an Avro topic, to be encoded */
bool
OutboxRelayIsAvro(const OutboxEvent *ev)
{
	return ev->payload_kind == OUTBOX_PAYLOAD_JSON && OutboxTopicIsAvro(ev->topic);
}

/*
 * encode
 *		ev's payload as schema's record, in r->avro_cxt, or NULL with err
 *		set.  The payload is hostile: an ERROR on the way (a conversion, the
 *		memory it asks for) refuses it instead of stopping the relay.
 */
static char *
encode(Relay *r, OutboxAvroSchema *schema, OutboxEvent *ev, size_t *len,
	   char *err, size_t errlen)
{
	MemoryContext old = MemoryContextSwitchTo(r->avro_cxt);
	char	   *value = NULL;

	PG_TRY();
	{
		Jsonb	   *payload = DatumGetJsonbP(DirectFunctionCall1(jsonb_in,
																 CStringGetDatum(pnstrdup(ev->payload, ev->payload_len))));

		value = OutboxAvroEncode(schema, payload, len, err, errlen);
	}
	PG_CATCH();
	{
		ErrorData  *e;

		MemoryContextSwitchTo(r->avro_cxt);
		e = CopyErrorData();
		FlushErrorState();
		snprintf(err, errlen, "the payload could not be encoded with schema %d: %s",
				 OutboxAvroSchemaId(schema), e->message);
		value = NULL;
	}
	PG_END_TRY();
	MemoryContextSwitchTo(old);
	return value;
}

/*
 * OutboxRelayEncodeAvro
 *		ev as its topic's Avro record, its value copied into cxt (the
 *		event's memory), when its topic is an Avro one and its value JSON;
 *		the registry asked as *may_ask allows (topic_schema).  UNFIT: err
 *		says why; UNAVAILABLE: its topic has no schema now (reported here;
 *		err stays empty).  No transaction is open.
 */
RelayAvro
OutboxRelayEncodeAvro(Relay *r, MemoryContext cxt, OutboxEvent *ev, bool *may_ask,
					  char *err, size_t errlen)
{
	OutboxAvroSchema *schema;
	RelayAvro	why = RELAY_AVRO_UNAVAILABLE;
	char	   *value;
	size_t		len = 0;

	err[0] = '\0';
	if (!OutboxRelayIsAvro(ev))
		return RELAY_AVRO_NONE;
	if ((schema = topic_schema(r, ev->topic, may_ask, &why, err, errlen)) == NULL)
		return why;
	value = encode(r, schema, ev, &len, err, errlen);
	if (value != NULL)
	{
		ev->payload = MemoryContextAlloc(cxt, len);
		memcpy(ev->payload, value, len);
		ev->payload_len = (int) len;
		ev->payload_kind = OUTBOX_PAYLOAD_BYTES;
	}
	MemoryContextReset(r->avro_cxt);
	return value != NULL ? RELAY_AVRO_ENCODED : RELAY_AVRO_UNFIT;
}
