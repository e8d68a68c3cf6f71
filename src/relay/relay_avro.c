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
 *	  (class schema) and nothing of it is sent.  A schema the registry does
 *	  not give is nobody's fault: the page waits, backing off, and nothing
 *	  is lost or reordered.
 *	- The registry's calls are bounded (registry_client.c), and made with
 *	  no transaction open.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "utils/builtins.h"
#include "utils/jsonb.h"
#include "utils/memutils.h"

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

	OutboxRegistryUseContext(r->cxt);
	OutboxKafkaReadSecretsFile(r->cxt);
	auth = OutboxKafkaSecretValue(OUTBOX_REGISTRY_AUTH_PROPERTY);
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
 *		topic's schema, fetched when due and recorded when new; NULL when
 *		the registry gives none, the error noted for status().
 */
static OutboxAvroSchema *
topic_schema(Relay *r, const char *topic)
{
	OutboxAvroSchema *schema = NULL;
	const char *json = NULL;
	char		err[OUTBOX_REGISTRY_ERROR_LEN];

	switch (OutboxRegistryTopicSchema(topic, &schema, &json, err, sizeof(err)))
	{
		case OUTBOX_SCHEMA_FETCHED:
			record_schema(r, topic, schema, json);
			return schema;
		case OUTBOX_SCHEMA_FOUND:
			if (err[0] != '\0')
				OutboxRelayReportError(r, "could not refresh a topic's Avro schema, using the one in hand", err);
			return schema;
		case OUTBOX_SCHEMA_UNAVAILABLE:
			break;
	}
	OutboxRelayReportError(r, "no Avro schema for a topic, waiting", err);
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

	if (outbox_avro_topics[0] == '\0' || outbox_schema_registry_url[0] == '\0')
		return;
	copy = pstrdup(outbox_avro_topics);
	for (item = strtok_r(copy, ", ", &save); item != NULL; item = strtok_r(NULL, ", ", &save))
		if (strcmp(item, "*") != 0)
			(void) topic_schema(r, item);
	pfree(copy);
}

/* whether ev's value is JSON for an Avro topic, to be encoded */
bool
OutboxRelayIsAvro(const OutboxEvent *ev)
{
	return ev->payload_kind == OUTBOX_PAYLOAD_JSON && OutboxTopicIsAvro(ev->topic);
}

/*
 * OutboxRelayEncodeAvro
 *		ev as its topic's Avro record, in cxt (the event's memory), when its
 *		topic is an Avro one and its value JSON.  UNFIT: err says why;
 *		UNAVAILABLE: its topic has no schema now (reported here; err stays
 *		empty).  No transaction is open.
 */
RelayAvro
OutboxRelayEncodeAvro(Relay *r, MemoryContext cxt, OutboxEvent *ev, char *err, size_t errlen)
{
	OutboxAvroSchema *schema;
	MemoryContext old;
	Jsonb	   *payload;
	char	   *value;
	size_t		len;

	err[0] = '\0';
	if (!OutboxRelayIsAvro(ev))
		return RELAY_AVRO_NONE;
	if ((schema = topic_schema(r, ev->topic)) == NULL)
		return RELAY_AVRO_UNAVAILABLE;
	old = MemoryContextSwitchTo(cxt);
	payload = DatumGetJsonbP(DirectFunctionCall1(jsonb_in,
												 CStringGetDatum(pnstrdup(ev->payload, ev->payload_len))));
	value = OutboxAvroEncode(schema, payload, &len, err, errlen);
	MemoryContextSwitchTo(old);
	if (value == NULL)
		return RELAY_AVRO_UNFIT;
	ev->payload = value;
	ev->payload_len = (int) len;
	ev->payload_kind = OUTBOX_PAYLOAD_BYTES;
	return RELAY_AVRO_ENCODED;
}
