/*-------------------------------------------------------------------------
 *
 * registry/registry_cache.c
 *		Which topics are Avro (outbox.avro_topics), and a process's cache of
 *		schemas: each topic's latest schema id as the registry last said it
 *		(TopicNameStrategy: subject "<topic>-value"), and the schemas parsed,
 *		by id.
 *
 * Invariants:
 *	- Both caches are bounded (REGISTRY_TOPICS_MAX, REGISTRY_SCHEMAS_MAX);
 *	  the least recently used schema goes first, and a topic whose schema
 *	  went is fetched again on its next use (a miss).
 *	- A topic's schema is fetched on a miss and again once
 *	  outbox.schema_registry_refresh has passed.  A refresh that fails keeps
 *	  the schema in hand (the registry's outage does not stop a topic that
 *	  has one), and is tried again at most every REGISTRY_RETRY_MS.
 *	- A change of outbox.schema_registry_url forgets everything.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "registry/registry.h"

#define REGISTRY_TOPICS_MAX 256
#define REGISTRY_SCHEMAS_MAX 64
#define REGISTRY_RETRY_MS 5000

typedef struct TopicEntry
{
	char	   *topic;
	int32		id;				/* 0: none yet */
	TimestampTz fetched_at;
	TimestampTz tried_at;
	char	   *last_error;		/* why the last try failed, or NULL */
	uint64		used;
} TopicEntry;

typedef struct SchemaEntry
{
	OutboxAvroSchema *schema;
	char	   *json;
	uint64		used;
} SchemaEntry;

static MemoryContext registry_cxt = NULL;
static TopicEntry topics[REGISTRY_TOPICS_MAX];
static int	ntopics = 0;
static SchemaEntry schemas[REGISTRY_SCHEMAS_MAX];
static int	nschemas = 0;
static uint64 use_clock = 0;
static char *cached_url = NULL;

/* outbox.avro_topics as last split */
static char *split_from = NULL;
static List *avro_topics = NIL;
static bool all_topics = false;

/*
 * OutboxRegistryUseContext
 *		Keep the caches under parent (a worker's own context, at start-up);
 *		a backend that never calls it keeps them under TopMemoryContext.
 */
void
OutboxRegistryUseContext(MemoryContext parent)
{
	if (registry_cxt == NULL)
		registry_cxt = AllocSetContextCreate(parent, "outbox registry",
											 ALLOCSET_SMALL_SIZES);
}

/*
 * OutboxTopicIsAvro
 *		Whether outbox.avro_topics names topic (or is "*").
 */
bool
OutboxTopicIsAvro(const char *topic)
{
	ListCell   *lc;

	if (outbox_avro_topics == NULL || outbox_avro_topics[0] == '\0')
		return false;
	OutboxRegistryUseContext(TopMemoryContext);
	if (split_from == NULL || strcmp(split_from, outbox_avro_topics) != 0)
	{
		MemoryContext old = MemoryContextSwitchTo(registry_cxt);
		char	   *copy = pstrdup(outbox_avro_topics);
		char	   *item;
		char	   *save = NULL;

		list_free_deep(avro_topics);
		avro_topics = NIL;
		all_topics = false;
		for (item = strtok_r(copy, ",", &save); item != NULL; item = strtok_r(NULL, ",", &save))
		{
			char	   *end = item + strlen(item);

			while (*item == ' ')
				item++;
			while (end > item && end[-1] == ' ')
				*--end = '\0';
			if (strcmp(item, "*") == 0)
				all_topics = true;
			else if (*item != '\0')
				avro_topics = lappend(avro_topics, pstrdup(item));
		}
		if (split_from != NULL)
			pfree(split_from);
		split_from = pstrdup(outbox_avro_topics);
		MemoryContextSwitchTo(old);
	}
	if (all_topics)
		return true;
	foreach(lc, avro_topics)
		if (strcmp((char *) lfirst(lc), topic) == 0)
			return true;
	return false;
}

/* everything forgotten: another registry */
void
OutboxRegistryForget(void)
{
	int			i;

	for (i = 0; i < nschemas; i++)
		OutboxAvroFree(schemas[i].schema);
	nschemas = ntopics = 0;
	if (registry_cxt != NULL)
		MemoryContextReset(registry_cxt);
	split_from = NULL;
	avro_topics = NIL;
	cached_url = NULL;
}

static void
forget_if_moved(void)
{
	OutboxRegistryUseContext(TopMemoryContext);
	if (cached_url != NULL && strcmp(cached_url, outbox_schema_registry_url) == 0)
		return;
	OutboxRegistryForget();
	cached_url = MemoryContextStrdup(registry_cxt, outbox_schema_registry_url);
}

static SchemaEntry *
find_schema(int32 id)
{
	int			i;

	for (i = 0; i < nschemas; i++)
		if (OutboxAvroSchemaId(schemas[i].schema) == id)
		{
			schemas[i].used = ++use_clock;
			return &schemas[i];
		}
	return NULL;
}

/* a schema parsed and kept, the least recently used one making room */
static SchemaEntry *
keep_schema(int32 id, const char *json, char *err, size_t errlen)
{
	MemoryContext old = MemoryContextSwitchTo(registry_cxt);
	OutboxAvroSchema *parsed = OutboxAvroParse(id, json, strlen(json), err, errlen);
	SchemaEntry *e;
	int			i;

	MemoryContextSwitchTo(old);
	if (parsed == NULL)
		return NULL;
	if (nschemas < REGISTRY_SCHEMAS_MAX)
		e = &schemas[nschemas++];
	else
	{
		e = &schemas[0];
		for (i = 1; i < nschemas; i++)
			if (schemas[i].used < e->used)
				e = &schemas[i];
		OutboxAvroFree(e->schema);
		pfree(e->json);
	}
	e->schema = parsed;
	e->json = MemoryContextStrdup(registry_cxt, json);
	e->used = ++use_clock;
	return e;
}

static TopicEntry *
topic_entry(const char *topic)
{
	TopicEntry *e;
	int			i;

	for (i = 0; i < ntopics; i++)
		if (strcmp(topics[i].topic, topic) == 0)
		{
			topics[i].used = ++use_clock;
			return &topics[i];
		}
	if (ntopics < REGISTRY_TOPICS_MAX)
		e = &topics[ntopics++];
	else
	{
		e = &topics[0];
		for (i = 1; i < ntopics; i++)
			if (topics[i].used < e->used)
				e = &topics[i];
		pfree(e->topic);
		if (e->last_error)
			pfree(e->last_error);
	}
	memset(e, 0, sizeof(TopicEntry));
	e->topic = MemoryContextStrdup(registry_cxt, topic);
	e->used = ++use_clock;
	return e;
}

/*
 * OutboxRegistryTopicSchema
 *		topic's schema, the registry asked when the cache has none or it is
 *		due for a refresh.  FETCHED: a schema id new for the topic, whose
 *		text *json gives; FOUND: the one in hand (err says why a due refresh
 *		failed, or is empty); UNAVAILABLE: none, err says why.
 */
OutboxSchemaLookup
OutboxRegistryTopicSchema(const char *topic, OutboxAvroSchema **schema,
						  const char **json, char *err, size_t errlen)
{
	TopicEntry *t;
	SchemaEntry *s;
	TimestampTz now = GetCurrentTimestamp();
	char	   *subject;
	char	   *text;
	int32		id;

	err[0] = '\0';
	forget_if_moved();
	t = topic_entry(topic);
	s = t->id != 0 ? find_schema(t->id) : NULL;
	if (s != NULL && !TimestampDifferenceExceeds(t->fetched_at, now,
												 outbox_schema_registry_refresh * 1000))
	{
		*schema = s->schema;
		return OUTBOX_SCHEMA_FOUND;
	}
	/* a failed try is not repeated at once: a silent registry costs a timeout */
	if (t->last_error != NULL && !TimestampDifferenceExceeds(t->tried_at, now, REGISTRY_RETRY_MS))
	{
		*schema = s ? s->schema : NULL;
		if (s != NULL)
			return OUTBOX_SCHEMA_FOUND;	/* said when it failed */
		strlcpy(err, t->last_error, errlen);
		return OUTBOX_SCHEMA_UNAVAILABLE;
	}
	t->tried_at = now;
	if (t->last_error != NULL)
		pfree(t->last_error);
	t->last_error = NULL;
	subject = psprintf("%s-value", topic);
	if (!OutboxRegistryFetchLatest(subject, &id, &text, err, errlen) ||
		((s == NULL || OutboxAvroSchemaId(s->schema) != id) &&
		 find_schema(id) == NULL && keep_schema(id, text, err, errlen) == NULL))
	{
		t->last_error = MemoryContextStrdup(registry_cxt, err);
		*schema = s ? s->schema : NULL;
		return s ? OUTBOX_SCHEMA_FOUND : OUTBOX_SCHEMA_UNAVAILABLE;
	}
	t->fetched_at = now;
	if (t->id == id && s != NULL)
	{
		*schema = s->schema;
		return OUTBOX_SCHEMA_FOUND;
	}
	t->id = id;
	s = find_schema(id);
	*schema = s->schema;
	*json = s->json;
	return OUTBOX_SCHEMA_FETCHED;
}

/*
 * OutboxRegistrySchemaById
 *		The schema of id, parsed from json unless the cache has it (for
 *		validate(), which reads the text the relay recorded).  NULL with err
 *		set when avro-c refuses the text.
 */
OutboxAvroSchema *
OutboxRegistrySchemaById(int32 id, const char *json, char *err, size_t errlen)
{
	SchemaEntry *s;

	forget_if_moved();
	s = find_schema(id);
	if (s != NULL && strcmp(s->json, json) != 0)
	{
		/* not what the registry said under this id here: judge this text */
		OutboxAvroFree(s->schema);
		pfree(s->json);
		*s = schemas[--nschemas];
		s = NULL;
	}
	if (s == NULL)
		s = keep_schema(id, json, err, errlen);
	return s ? s->schema : NULL;
}
