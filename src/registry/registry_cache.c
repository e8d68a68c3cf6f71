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
 *	- A topic's schema is fetched on a miss and, when the caller allows it
 *	  (once per page), again once outbox.schema_registry_refresh has passed.
 *	  A refresh that fails keeps the schema in hand (the registry's outage
 *	  does not stop a topic that has one); a topic's failure is remembered
 *	  for REGISTRY_RETRY_MS, and a registry that did not answer is left
 *	  alone by every topic for a while (the breaker).
 *	- A change of outbox.schema_registry_url forgets everything.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "registry/registry.h"

#define REGISTRY_TOPICS_MAX 256
#define REGISTRY_SCHEMAS_MAX 256
#define REGISTRY_RETRY_MS 5000
#define REGISTRY_QUIET_MAX_MS 60000

typedef struct TopicEntry
{
	char	   *topic;
	int32		id;				/* 0: none yet */
	TimestampTz fetched_at;
	TimestampTz tried_at;
	char	   *last_error;		/* why the last try failed, or NULL */
	bool		refused;		/* and the registry ruled it out */
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

/* the breaker: after a registry did not answer, nobody asks it until */
static TimestampTz quiet_until = 0;
static int	quiet_ms = 0;
static char *quiet_why = NULL;

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
	quiet_why = NULL;
	quiet_until = 0;
	quiet_ms = 0;
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
 * ask_registry
 *		Fetch topic's latest schema into t (and the schema cache).  A
 *		registry that did not answer keeps every topic from asking it again
 *		for a while (the breaker: 5 s, doubling to a minute), so that a silent
 *		one costs a timeout now and then, not per topic or page.  Returns
 *		FETCHED (t->id is the latest), UNAVAILABLE or REFUSED, err set.
 */
static OutboxSchemaLookup
ask_registry(TopicEntry *t, char *err, size_t errlen)
{
	char	   *subject = psprintf("%s-value", t->topic);
	char	   *text = NULL;
	int32		id = 0;
	OutboxRegistryAnswer answer;

	if (GetCurrentTimestamp() < quiet_until)
	{
		strlcpy(err, quiet_why ? quiet_why : "the schema registry did not answer", errlen);
		return OUTBOX_SCHEMA_UNAVAILABLE;
	}
	answer = OutboxRegistryFetchLatest(subject, &id, &text, err, errlen);
	if (answer == OUTBOX_REGISTRY_NO_ANSWER)
	{
		quiet_ms = quiet_ms == 0 ? REGISTRY_RETRY_MS : Min(quiet_ms * 2, REGISTRY_QUIET_MAX_MS);
		quiet_until = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), quiet_ms);
		if (quiet_why)
			pfree(quiet_why);
		quiet_why = MemoryContextStrdup(registry_cxt, err);
		return OUTBOX_SCHEMA_UNAVAILABLE;
	}
	quiet_ms = 0;
	if (answer == OUTBOX_REGISTRY_REFUSED)
		return OUTBOX_SCHEMA_REFUSED;
	/* a schema avro-c cannot use is the registry's final word too */
	if (find_schema(id) == NULL && keep_schema(id, text, err, errlen) == NULL)
		return OUTBOX_SCHEMA_REFUSED;
	t->id = id;
	t->fetched_at = GetCurrentTimestamp();
	return OUTBOX_SCHEMA_FETCHED;
}

/*
 * OutboxRegistryTopicSchema
 *		topic's schema.  The registry is asked when the cache has none, and,
 *		when *may_ask allows it, once it is due for a refresh; having asked
 *		(answered or not) clears *may_ask, so a caller asks once per pass.
 *		FETCHED: an id new for the topic, whose text *json gives; FOUND: the
 *		one in hand (err says why a refresh failed, or is empty);
 *		UNAVAILABLE: none, the registry did not say; REFUSED: the registry's
 *		answer rules it out (no such subject, not Avro, not usable).  A
 *		topic's failure is remembered for REGISTRY_RETRY_MS.
 */
OutboxSchemaLookup
OutboxRegistryTopicSchema(const char *topic, bool *may_ask, OutboxAvroSchema **schema,
						  const char **json, char *err, size_t errlen)
{
	TopicEntry *t;
	SchemaEntry *s;
	TimestampTz now = GetCurrentTimestamp();
	int32		had;
	OutboxSchemaLookup r;

	err[0] = '\0';
	forget_if_moved();
	t = topic_entry(topic);
	s = t->id != 0 ? find_schema(t->id) : NULL;
	*schema = s ? s->schema : NULL;
	if (s != NULL && (!*may_ask ||
					  !TimestampDifferenceExceeds(t->fetched_at, now,
												  outbox_schema_registry_refresh * 1000)))
		return OUTBOX_SCHEMA_FOUND;
	if (t->last_error != NULL && !TimestampDifferenceExceeds(t->tried_at, now, REGISTRY_RETRY_MS))
	{
		if (s != NULL)
			return OUTBOX_SCHEMA_FOUND;	/* said when it failed */
		strlcpy(err, t->last_error, errlen);
		return t->refused ? OUTBOX_SCHEMA_REFUSED : OUTBOX_SCHEMA_UNAVAILABLE;
	}
	*may_ask = false;
	had = t->id;
	r = ask_registry(t, err, errlen);
	t->tried_at = GetCurrentTimestamp();
	if (t->last_error != NULL)
		pfree(t->last_error);
	t->last_error = r == OUTBOX_SCHEMA_FETCHED ? NULL : MemoryContextStrdup(registry_cxt, err);
	t->refused = (r == OUTBOX_SCHEMA_REFUSED);
	if (r != OUTBOX_SCHEMA_FETCHED)
		return s != NULL ? OUTBOX_SCHEMA_FOUND : r;
	s = find_schema(t->id);
	*schema = s->schema;
	if (t->id == had)
		return OUTBOX_SCHEMA_FOUND;
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
