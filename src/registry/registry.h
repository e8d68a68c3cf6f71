/*-------------------------------------------------------------------------
 *
 * registry/registry.h
 *		Avro through a schema registry: a topic's latest schema fetched from
 *		the registry's Confluent-compatible API and cached, and an event's
 *		jsonb payload encoded with it into the registries' wire format.
 *
 * What the registry room offers to the rooms above it; a file includes
 * only the headers of rooms below its own (docs/design.md).
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_REGISTRY_H
#define OUTBOX_REGISTRY_H

#include "postgres.h"

#include "utils/jsonb.h"

#include "base/base.h"

/* a schema parsed once, by its registry id (opaque: registry_avro.c) */
typedef struct OutboxAvroSchema OutboxAvroSchema;

/* the longest error a lookup or an encoding writes */
#define OUTBOX_REGISTRY_ERROR_LEN 512

/* registry_avro.c */
extern OutboxAvroSchema *OutboxAvroParse(int32 id, const char *json, size_t len,
										 char *err, size_t errlen);
extern void OutboxAvroFree(OutboxAvroSchema *schema);
extern int32 OutboxAvroSchemaId(const OutboxAvroSchema *schema);
extern char *OutboxAvroEncode(OutboxAvroSchema *schema, Jsonb *payload,
							  size_t *len, char *err, size_t errlen);

/* registry_client.c: what the registry said */
typedef enum OutboxRegistryAnswer
{
	OUTBOX_REGISTRY_SCHEMA,		/* the latest schema's id and text */
	OUTBOX_REGISTRY_NO_ANSWER,	/* nothing usable, for now: no answer, an
								 * error status, a login refused */
	OUTBOX_REGISTRY_REFUSED		/* the subject is not there, or not Avro */
} OutboxRegistryAnswer;

extern OutboxRegistryAnswer OutboxRegistryFetchLatest(const char *subject, int32 *id,
													  char **schema, char *err,
													  size_t errlen);
extern void OutboxRegistryReadSecrets(const char *secrets_text);
extern bool OutboxRegistryUrlIsValid(const char *url, const char **why);

/* registry_cache.c */
typedef enum OutboxSchemaLookup
{
	OUTBOX_SCHEMA_FOUND,		/* cached, fresh or not refreshable now */
	OUTBOX_SCHEMA_FETCHED,		/* fetched now: a new id for the topic */
	OUTBOX_SCHEMA_UNAVAILABLE,	/* none: the registry did not say */
	OUTBOX_SCHEMA_REFUSED		/* none: the registry's answer rules it out */
} OutboxSchemaLookup;

extern void OutboxRegistryUseContext(MemoryContext parent);
extern bool OutboxTopicIsAvro(const char *topic);
extern OutboxSchemaLookup OutboxRegistryTopicSchema(const char *topic, bool *may_ask,
													OutboxAvroSchema **schema,
													const char **json,
													char *err, size_t errlen);
extern OutboxAvroSchema *OutboxRegistrySchemaById(int32 id, const char *json,
												  char *err, size_t errlen);
extern void OutboxRegistryForget(void);

#endif							/* OUTBOX_REGISTRY_H */
