/*-------------------------------------------------------------------------
 *
 * outbox.c
 *		Module entry point: settings and worker registration.
 *
 * Invariants: this file holds no logic.  _PG_init defines every outbox.*
 * setting and installs the utility hook, and only when loaded through
 * shared_preload_libraries does it ask for shared memory and register the
 * launcher.  Loaded any other way (CREATE EXTENSION, or the first call of
 * outbox.emit() in a session), emit() still works: it only writes a row;
 * publishing needs the preload.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <limits.h>

#include "fmgr.h"
#include "miscadmin.h"
#include "utils/guc.h"

#include "base/compat.h"
#include "base/base.h"
#include "shmem/shmem.h"
#include "kafka/kafka.h"
#include "emit/emit.h"
#include "registry/registry.h"
#include "relay/relay.h"
#include "launcher/launcher.h"

PG_MODULE_MAGIC;

/*
 * The settings.  Each one's default is written once, as the boot value of
 * its definition below, which sets the variable when _PG_init runs; the
 * variables have no initializer of their own.  Only the two defined while
 * preloading alone, read without the preload too, and what assign hooks
 * derive start from their defaults here.
 */

/* what emit() writes */
char	   *outbox_topic_template;
bool		outbox_aggregate_sequence;
int			outbox_max_payload_bytes;
int			outbox_max_backlog;
int			outbox_max_backlog_age;
char	   *outbox_traceparent;
char	   *outbox_tenant;
char	   *outbox_allowed_topics;

/* Kafka */
char	   *outbox_kafka_brokers;
char	   *outbox_kafka_config;
char	   *outbox_kafka_secrets_file;

/* Avro through a schema registry (registry/) */
char	   *outbox_schema_registry_url;
char	   *outbox_avro_topics;
int			outbox_schema_registry_refresh;
int			outbox_schema_registry_timeout;

/* how the relays read, wait and clean up */
int			outbox_batch_size;
int			outbox_batch_max_bytes;
int			outbox_poll_interval;
bool		outbox_enabled;
int			outbox_shutdown_timeout;
int			outbox_kafka_idle_timeout;
int			outbox_max_subscriptions_per_database;
int			outbox_retention;
int			outbox_inbox_retention;
char	   *outbox_synchronized_standby_slots;

/* what DROP EXTENSION outbox may delete */
bool		outbox_allow_drop_undelivered;

/* sized at start: defined only while preloading */
int			outbox_max_databases = OUTBOX_MAX_DATABASES_DEFAULT;
int			outbox_max_subscriptions = OUTBOX_MAX_SUBSCRIPTIONS_DEFAULT;

/* what the assign hooks derive: librdkafka's limit, the standbys' slots */
int			outbox_kafka_message_max_bytes = OUTBOX_KAFKA_MESSAGE_MAX_DEFAULT;
const OutboxStandbySlotList *outbox_standby_slot_list = NULL;

/* failures, and the values of outbox.poison_policy */
static const struct config_enum_entry poison_policy_options[] = {
	{"block", OUTBOX_POISON_BLOCK, false},
	{"skip", OUTBOX_POISON_SKIP, false},
	{NULL, 0, false}
};

/* outbox.delivery, and what exactly_once names in Kafka */
static const struct config_enum_entry delivery_options[] = {
	{"at_least_once", OUTBOX_DELIVERY_AT_LEAST_ONCE, false},
	{"exactly_once", OUTBOX_DELIVERY_EXACTLY_ONCE, false},
	{NULL, 0, false}
};

/* outbox.message_format */
static const struct config_enum_entry message_format_options[] = {
	{"native", OUTBOX_FORMAT_NATIVE, false},
	{"cloudevents_binary", OUTBOX_FORMAT_CE_BINARY, false},
	{"cloudevents_structured", OUTBOX_FORMAT_CE_STRUCTURED, false},
	{NULL, 0, false}
};

int			outbox_message_format;
char	   *outbox_cloudevents_source;
int			outbox_delivery;
int			outbox_transaction_events;
char	   *outbox_progress_topic;
char	   *outbox_transactional_id_suffix;

int			outbox_retry_backoff_min;
int			outbox_retry_backoff_max;
int			outbox_delivery_timeout;
int			outbox_hold_after;
int			outbox_max_attempts;
int			outbox_poison_policy;

void		_PG_init(void);

/* a check hook's body: valid judges the value, or says why not */
static bool
check_with(bool (*valid) (const char *value, char **bad), const char *value)
{
	char	   *bad = NULL;

	if (valid(value, &bad))
		return true;
	GUC_check_errdetail("%s", bad);
	return false;
}

static bool
check_topic_template(char **newval, void **extra, GucSource source)
{
	return check_with(OutboxTopicTemplateIsValid, *newval);
}

static bool
check_traceparent(char **newval, void **extra, GucSource source)
{
	if (*newval == NULL || (*newval)[0] == '\0' ||
		OutboxTraceparentIsValid(*newval))
		return true;
	GUC_check_errdetail("A traceparent has the W3C Trace Context form "
						"\"00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>\" "
						"in lower case, with non-zero ids.");
	return false;
}

/*
 * check_kafka_config
 *		outbox's rules and librdkafka judge each property, then the pairs
 *		librdkafka refuses together (kafka_settings.c), so that a value
 *		the relay or a subscription could not make its client with is
 *		refused here, at SET or reload, and the old one stays.  The
 *		producer's effective message.max.bytes under the value is computed
 *		here, once per change, and installed by assign_kafka_config for
 *		emit()'s size check.  Neither message shows the value: it may carry
 *		a secret, and the default message would quote it whole.
 */
static bool
check_kafka_config(char **newval, void **extra, GucSource source)
{
	char	   *detail = NULL;
	char	   *hint = NULL;
	int			max_bytes;
	int		   *result;

	if (!OutboxKafkaCheckConfig(*newval, &detail, &hint) ||
		!OutboxKafkaConfigConflict(*newval, &detail, &hint))
	{
		GUC_check_errmsg("invalid value for parameter \"outbox.kafka_config\"");
		GUC_check_errdetail("%s", detail);
		if (hint != NULL)
			GUC_check_errhint("%s", hint);
		return false;
	}
	max_bytes = OutboxKafkaMessageMaxBytes(*newval);
	if (max_bytes <= 0)
	{
		GUC_check_errmsg("invalid value for parameter \"outbox.kafka_config\"");
		GUC_check_errdetail("librdkafka reports no usable message.max.bytes.");
		return false;
	}
	/* guc.c frees extra itself: allocate it as it wants (compat.h) */
	result = OutboxGucMalloc(sizeof(int));
	if (result == NULL)
		return false;
	*result = max_bytes;
	*extra = result;
	return true;
}

static void
assign_kafka_config(const char *newval, void *extra)
{
	outbox_kafka_message_max_bytes = *(int *) extra;
}

static bool
check_allowed_topics(char **newval, void **extra, GucSource source)
{
	return check_with(OutboxTopicPatternsAreValid, *newval);
}

/* the secrets file is read and judged by producer.c, as the relay reads it */
static bool
check_kafka_secrets_file(char **newval, void **extra, GucSource source)
{
	return check_with(OutboxKafkaCheckSecretsFile, *newval);
}

/* the schema registry: an http(s) URL without credentials */
static bool
check_schema_registry_url(char **newval, void **extra, GucSource source)
{
	const char *why = NULL;

	if (OutboxRegistryUrlIsValid(*newval, &why))
		return true;
	/* not quoted: a URL refused for its credentials would show them */
	GUC_check_errmsg("invalid value for parameter \"outbox.schema_registry_url\"");
	GUC_check_errdetail("%s", why);
	return false;
}

/* the Avro topics: "*", or legal topic names separated by commas */
static bool
check_avro_topics(char **newval, void **extra, GucSource source)
{
	char	   *copy = pstrdup(*newval ? *newval : "");
	char	   *item;
	char	   *save = NULL;

	for (item = strtok_r(copy, ",", &save); item != NULL; item = strtok_r(NULL, ",", &save))
	{
		char	   *end = item + strlen(item);

		while (*item == ' ')
			item++;
		while (end > item && end[-1] == ' ')
			*--end = '\0';
		if (strcmp(item, "*") != 0 && !OutboxTopicNameIsLegal(item))
		{
			GUC_check_errdetail("\"%.64s\" is not a topic name: a topic name has 1 to 249 characters from [A-Za-z0-9._-] and is not \".\" or \"..\".",
								item);
			return false;
		}
	}
	return true;
}

/* the progress topic: a legal Kafka topic name */
static bool
check_progress_topic(char **newval, void **extra, GucSource source)
{
	if (*newval != NULL && OutboxTopicNameIsLegal(*newval))
		return true;
	GUC_check_errdetail("A topic name has 1 to 249 characters from [A-Za-z0-9._-] and is not \".\" or \"..\".");
	return false;
}

/* the transactional id's suffix: up to 64 of a topic name's characters */
static bool
check_transactional_id_suffix(char **newval, void **extra, GucSource source)
{
	const char *v = *newval ? *newval : "";

	if (v[0] == '\0' ||
		(strlen(v) <= 64 && strspn(v, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") == strlen(v)))
		return true;
	GUC_check_errdetail("The suffix has at most 64 characters from [A-Za-z0-9._-].");
	return false;
}

/*
 * a CloudEvents source: empty (the default), or a URI reference (RFC 3986)
 * of at most 1024 characters: unreserved and delimiter characters, and
 * percent-encoded bytes (no brackets: Java's URI takes them in a host only)
 */
static bool
check_cloudevents_source(char **newval, void **extra, GucSource source)
{
	const char *v = *newval ? *newval : "";
	const char *p;

	for (p = v; *p != '\0'; p++)
	{
		if (*p == '%' && isxdigit((unsigned char) p[1]) && isxdigit((unsigned char) p[2]))
			p += 2;
		else if (!isalnum((unsigned char) *p) || (*p & 0x80))
		{
			if (*p == '\0' || strchr("-._~:/?#@!$&'()*+,;=", *p) == NULL)
				break;
		}
	}
	if (*p == '\0' && p - v <= 1024)
		return true;
	GUC_check_errdetail("The source is a URI reference (RFC 3986) of at most 1024 characters: letters, digits, "
						"-._~:/?#@!$&'()*+,;= and %%HH escapes.");
	return false;
}

/* the slot names are parsed once here, and read by the relay from extra */
static bool
check_standby_slots(char **newval, void **extra, GucSource source)
{
	char	   *bad = NULL;
	OutboxStandbySlotList *list = OutboxStandbySlotsParse(*newval, &bad);

	if (list == NULL)
	{
		if (bad != NULL)
			GUC_check_errdetail("%s", bad);
		return false;
	}
	*extra = list;
	return true;
}

static void
assign_standby_slots(const char *newval, void *extra)
{
	outbox_standby_slot_list = (const OutboxStandbySlotList *) extra;
}

/* the settings of emit(): what an event becomes when it is written */
static void
define_emit_settings(void)
{
	DefineCustomStringVariable("outbox.topic_template",
							   "Topic of an event emitted without an explicit topic.",
							   "Placeholders {aggregate_type} and {event_type} are replaced at emit time.",
							   &outbox_topic_template,
							   "outbox.event.{aggregate_type}",
							   PGC_USERSET, 0,
							   check_topic_template, NULL, NULL);

	DefineCustomBoolVariable("outbox.aggregate_sequence",
							 "Assigns each event a gapless per-aggregate sequence number.",
							 "The counter row lock also serializes emitters of one aggregate, "
							 "so that event order equals commit order.",
							 &outbox_aggregate_sequence,
							 true,
							 PGC_SUSET, 0,
							 NULL, NULL, NULL);

	DefineCustomIntVariable("outbox.max_payload_bytes",
							"Largest event payload, as JSON text or emit_binary()'s bytes, that emit() accepts.",
							NULL,
							&outbox_max_payload_bytes,
							OUTBOX_MAX_PAYLOAD_DEFAULT, 1, INT_MAX,
							PGC_SUSET, GUC_UNIT_BYTE,
							NULL, NULL, NULL);

	DefineCustomIntVariable("outbox.max_backlog",
							"Backlog, in events, at which emit() refuses new events (0: no limit).",
							"The backlog is what the relay has not published: committed events Kafka has "
							"not acknowledged, not held or quarantined ones.",
							&outbox_max_backlog,
							0, 0, INT_MAX,
							PGC_SIGHUP, 0,
							NULL, NULL, NULL);

	DefineCustomIntVariable("outbox.max_backlog_age",
							"Age of the oldest unpublished event at which emit() refuses new events (0: no limit).",
							NULL,
							&outbox_max_backlog_age,
							0, 0, INT_MAX / 1000,
							PGC_SIGHUP, GUC_UNIT_S,
							NULL, NULL, NULL);

	DefineCustomStringVariable("outbox.traceparent",
							   "W3C traceparent stored with events emitted in this session or transaction.",
							   NULL,
							   &outbox_traceparent,
							   "",
							   PGC_USERSET, GUC_NOT_IN_SAMPLE,
							   check_traceparent, NULL, NULL);

	DefineCustomStringVariable("outbox.tenant",
							   "Tenant stored with events emitted in this session or transaction.",
							   NULL,
							   &outbox_tenant,
							   "",
							   PGC_USERSET, GUC_NOT_IN_SAMPLE,
							   NULL, NULL, NULL);

	DefineCustomStringVariable("outbox.allowed_topics",
							   "Topics emit() may write to: comma-separated patterns, * matching any run of characters.",
							   "Empty allows every legal topic name.  EXECUTE on emit() is write access, "
							   "with the relay's Kafka principal, to the topics this allows.",
							   &outbox_allowed_topics,
							   "",
							   PGC_SUSET, GUC_LIST_INPUT,
							   check_allowed_topics, NULL, NULL);
}

/* where the relays publish, and with which librdkafka properties */
static void
define_kafka_settings(void)
{
	DefineCustomStringVariable("outbox.kafka_brokers",
							   "Kafka bootstrap servers the relays publish to (host:port,...).",
							   "Empty means the relays stay idle.",
							   &outbox_kafka_brokers,
							   "",
							   PGC_SIGHUP, GUC_SUPERUSER_ONLY,
							   NULL, NULL, NULL);

	DefineCustomStringVariable("outbox.kafka_secrets_file",
							   "File of librdkafka properties that are secrets, one key=value per line.",
							   "Read by the relays when they build their producer and at reload; "
							   "its contents are never shown or logged.",
							   &outbox_kafka_secrets_file,
							   "",
							   PGC_SIGHUP, GUC_SUPERUSER_ONLY,
							   check_kafka_secrets_file, NULL, NULL);

	DefineCustomStringVariable("outbox.kafka_config",
							   "Extra librdkafka properties of the relays' producers and the subscriptions' consumers, as key=value;key=value.",
							   "Readable by superusers only.  PostgreSQL logs a changed value at reload: "
							   "keep credentials in outbox.kafka_secrets_file.",
							   &outbox_kafka_config,
							   "",
							   PGC_SIGHUP, GUC_SUPERUSER_ONLY,
							   check_kafka_config, assign_kafka_config, NULL);
}

/* Avro through a schema registry */
static void
define_registry_settings(void)
{
	DefineCustomStringVariable("outbox.schema_registry_url",
							   "The schema registry's Confluent-compatible API, as http(s)://host:port/path.",
							   "The relays fetch the Avro topics' schemas from it.  Credentials go in "
							   "outbox.kafka_secrets_file (schema.registry.basic.auth.user.info).",
							   &outbox_schema_registry_url,
							   "",
							   PGC_SIGHUP, GUC_SUPERUSER_ONLY,
							   check_schema_registry_url, NULL, NULL);

	DefineCustomStringVariable("outbox.avro_topics",
							   "Topics whose events' JSON payloads the relays encode as Avro, comma-separated, or *.",
							   "Each with the latest schema of subject <topic>-value in the schema registry, "
							   "framed in the registries' wire format.",
							   &outbox_avro_topics,
							   "",
							   PGC_SIGHUP, 0,
							   check_avro_topics, NULL, NULL);

	DefineCustomIntVariable("outbox.schema_registry_refresh",
							"How long a relay uses a topic's schema before asking the registry for the latest again.",
							NULL,
							&outbox_schema_registry_refresh,
							300, 1, 86400,
							PGC_SIGHUP, GUC_UNIT_S,
							NULL, NULL, NULL);

	DefineCustomIntVariable("outbox.schema_registry_timeout",
							"How long a relay waits for the schema registry's answer.",
							NULL,
							&outbox_schema_registry_timeout,
							5000, 100, 60000,
							PGC_SIGHUP, GUC_UNIT_MS,
							NULL, NULL, NULL);
}

/* how the relays read, publish, retry and wait */
static void
define_relay_settings(void)
{
	DefineCustomIntVariable("outbox.batch_size",
							"Events a relay reads and publishes per page.",
							NULL,
							&outbox_batch_size,
							OUTBOX_BATCH_SIZE_DEFAULT, 1, OUTBOX_BATCH_SIZE_MAX,
							PGC_SIGHUP, 0,
							NULL, NULL, NULL);

	DefineCustomIntVariable("outbox.batch_max_bytes",
							"Bytes of events (payload, key and headers) a relay reads and publishes per page.",
							"A page ends at outbox.batch_size events or at this many bytes, whichever "
							"comes first; an event larger than this goes out alone.",
							&outbox_batch_max_bytes,
							OUTBOX_BATCH_MAX_BYTES_DEFAULT, OUTBOX_BATCH_MAX_BYTES_MIN,
							OUTBOX_BATCH_MAX_BYTES_MAX,
							PGC_SIGHUP, GUC_UNIT_BYTE,
							NULL, NULL, NULL);

	DefineCustomIntVariable("outbox.poll_interval",
							"Safety poll of an idle relay; commits wake it sooner.",
							NULL,
							&outbox_poll_interval,
							OUTBOX_POLL_INTERVAL_DEFAULT, 10, OUTBOX_POLL_INTERVAL_MAX,
							PGC_SIGHUP, GUC_UNIT_MS,
							NULL, NULL, NULL);

	DefineCustomBoolVariable("outbox.enabled",
							 "Lets the relays publish; off pauses them without a restart.",
							 NULL,
							 &outbox_enabled,
							 true,
							 PGC_SIGHUP, 0,
							 NULL, NULL, NULL);

	DefineCustomIntVariable("outbox.shutdown_timeout",
							"How long a stopping relay waits for outstanding acknowledgements.",
							NULL,
							&outbox_shutdown_timeout,
							OUTBOX_SHUTDOWN_TIMEOUT_DEFAULT, 0, OUTBOX_SHUTDOWN_TIMEOUT_MAX,
							PGC_SIGHUP, GUC_UNIT_MS,
							NULL, NULL, NULL);

	DefineCustomIntVariable("outbox.kafka_idle_timeout",
							"How long an idle relay keeps its Kafka producer.",
							"After this long with nothing to publish the relay closes its producer "
							"(its connections and librdkafka's threads) and hands back the memory its "
							"drains left mapped; the next event opens it again. "
							"0 keeps it open.",
							&outbox_kafka_idle_timeout,
							OUTBOX_KAFKA_IDLE_TIMEOUT_DEFAULT, 0, INT_MAX,
							PGC_SIGHUP, GUC_UNIT_MS,
							NULL, NULL, NULL);

	DefineCustomIntVariable("outbox.retention",
							"How long a published event stays in outbox.events at least.",
							"The relay closes a generation of the log every quarter of this and empties it "
							"with TRUNCATE once this long has passed since it closed and every event in it "
							"is delivered; 0 empties a generation as soon as it is closed and delivered.",
							&outbox_retention,
							OUTBOX_RETENTION_DEFAULT, 0, INT_MAX,
							PGC_SIGHUP, GUC_UNIT_S,
							NULL, NULL, NULL);

	DefineCustomIntVariable("outbox.inbox_retention",
							"How long outbox.inbox remembers a consumed event.",
							"Older rows are deleted by the relay when it is idle; a duplicate arriving after that is consumed again.",
							&outbox_inbox_retention,
							OUTBOX_INBOX_RETENTION_DEFAULT, OUTBOX_INBOX_RETENTION_MIN, INT_MAX,
							PGC_SIGHUP, GUC_UNIT_S,
							NULL, NULL, NULL);
}

/* what the relays do when Kafka fails or refuses */
static void
define_failure_settings(void)
{
	DefineCustomIntVariable("outbox.retry_backoff_min",
							"Shortest wait before a failed page is sent again.",
							"Waits grow exponentially, with full jitter, up to outbox.retry_backoff_max.",
							&outbox_retry_backoff_min,
							OUTBOX_BACKOFF_MIN_DEFAULT, 1, OUTBOX_BACKOFF_LIMIT,
							PGC_SIGHUP, GUC_UNIT_MS,
							NULL, NULL, NULL);

	DefineCustomIntVariable("outbox.retry_backoff_max",
							"Longest wait before a failed page is sent again.",
							NULL,
							&outbox_retry_backoff_max,
							OUTBOX_BACKOFF_MAX_DEFAULT, 1, OUTBOX_BACKOFF_LIMIT,
							PGC_SIGHUP, GUC_UNIT_MS,
							NULL, NULL, NULL);

	DefineCustomIntVariable("outbox.delivery_timeout",
							"How long a relay waits for a round of messages to be acknowledged.",
							"Then everything not acknowledged is withdrawn and sent again, in order, "
							"after a backoff.",
							&outbox_delivery_timeout,
							OUTBOX_DELIVERY_TIMEOUT_DEFAULT, 100, OUTBOX_BACKOFF_LIMIT,
							PGC_SIGHUP, GUC_UNIT_MS,
							NULL, NULL, NULL);

	DefineCustomIntVariable("outbox.hold_after",
							"How long a Kafka partition may acknowledge nothing, while others do, before its events are held.",
							"Held events are kept in outbox.held and sent, in order, once the partition answers again; "
							"the other partitions' events flow meanwhile.  0 holds nothing: the page waits.",
							&outbox_hold_after,
							OUTBOX_HOLD_AFTER_DEFAULT, 0, OUTBOX_BACKOFF_LIMIT,
							PGC_SIGHUP, GUC_UNIT_MS,
							NULL, NULL, NULL);

	DefineCustomIntVariable("outbox.max_attempts",
							"Attempts at an event Kafka refuses for good before it is quarantined.",
							NULL,
							&outbox_max_attempts,
							OUTBOX_MAX_ATTEMPTS_DEFAULT, 1, OUTBOX_MAX_ATTEMPTS_LIMIT,
							PGC_SIGHUP, 0,
							NULL, NULL, NULL);

	DefineCustomEnumVariable("outbox.poison_policy",
							 "What happens to later events of an aggregate whose event was quarantined.",
							 "block parks them until the quarantined event is replayed or discarded; skip publishes them.",
							 &outbox_poison_policy,
							 OUTBOX_POISON_BLOCK, poison_policy_options,
							 PGC_SIGHUP, 0,
							 NULL, NULL, NULL);
}

/*
 * exactly-once delivery: Kafka transactions, the progress topic, and the
 * transactional id's suffix (relay/relay_txn.c)
 */
static void
define_delivery_settings(void)
{
	DefineCustomEnumVariable("outbox.delivery",
							 "Whether the relay publishes each page in a Kafka transaction with a progress record.",
							 "at_least_once may publish an event again after a crash; exactly_once publishes each "
							 "event once for read_committed consumers, at the cost of a transaction per page.",
							 &outbox_delivery,
							 OUTBOX_DELIVERY_AT_LEAST_ONCE, delivery_options,
							 PGC_SIGHUP, 0,
							 NULL, NULL, NULL);

	DefineCustomIntVariable("outbox.transaction_events",
							"With outbox.delivery = exactly_once, the most events in one page, which is one Kafka transaction.",
							"A transaction costs a few round trips to the cluster whatever its size; "
							"at_least_once pages hold outbox.batch_size events.",
							&outbox_transaction_events,
							50000, 1, OUTBOX_BATCH_SIZE_MAX,
							PGC_SIGHUP, 0,
							NULL, NULL, NULL);

	DefineCustomStringVariable("outbox.progress_topic",
							   "Compacted Kafka topic where, with outbox.delivery = exactly_once, each relay records how far it has published.",
							   "Created at the relay's start when missing; refused when it exists and is not compacted.",
							   &outbox_progress_topic,
							   "outbox.progress",
							   PGC_SIGHUP, 0,
							   check_progress_topic, NULL, NULL);

	DefineCustomEnumVariable("outbox.message_format",
							 "The shape of each Kafka message: outbox's own headers, or CloudEvents 1.0 in Kafka's protocol binding.",
							 "native sends the payload and outbox's headers; cloudevents_binary adds the ce_ attribute headers; "
							 "cloudevents_structured sends a CloudEvents JSON envelope holding the payload as data.",
							 &outbox_message_format,
							 OUTBOX_FORMAT_NATIVE, message_format_options,
							 PGC_SIGHUP, 0,
							 NULL, NULL, NULL);

	DefineCustomStringVariable("outbox.cloudevents_source",
							   "The CloudEvents source attribute of every event, in the cloudevents formats.",
							   "Empty: urn:uuid:<outbox.origin>, the database's own UUID, which dumps, upgrades and copies keep.",
							   &outbox_cloudevents_source,
							   "",
							   PGC_SIGHUP, 0,
							   check_cloudevents_source, NULL, NULL);

	DefineCustomStringVariable("outbox.transactional_id_suffix",
							   "Appended to the relay's Kafka transactional.id, for copies of one cluster that must not fence each other.",
							   "The transactional.id is outbox-<system identifier>-<database OID>, plus -suffix when set; "
							   "a promoted standby keeps it, so that it fences the old primary.",
							   &outbox_transactional_id_suffix,
							   "",
							   PGC_SIGHUP, 0,
							   check_transactional_id_suffix, NULL, NULL);
}

/*
 * the subscriptions' share of the workers; a reload setting, so defined
 * in every backend: subscribe() applies it too
 */
static void
define_subscription_settings(void)
{
	DefineCustomIntVariable("outbox.max_subscriptions_per_database",
							"Subscriptions one database may have, and workers the launcher runs for them at once.",
							"subscribe() refuses one more; lowered at reload, the launcher stops the newest workers over it.",
							&outbox_max_subscriptions_per_database,
							OUTBOX_MAX_SUBSCRIPTIONS_PER_DATABASE_DEFAULT, 0,
							OUTBOX_MAX_SUBSCRIPTIONS_MAX,
							PGC_SIGHUP, 0,
							NULL, NULL, NULL);
}

/* high availability: what the relays wait for before publishing */
static void
define_standby_settings(void)
{
	DefineCustomStringVariable("outbox.synchronized_standby_slots",
							   "Physical replication slots whose standbys must have an event's commit before the relays publish it.",
							   "Comma-separated slot names.  A page is sent once every named slot's standby has flushed "
							   "the WAL its snapshot saw; a slot that does not exist, is logical, or is inactive "
							   "and behind holds publishing back.  Empty publishes at once.",
							   &outbox_synchronized_standby_slots,
							   "",
							   PGC_SIGHUP, GUC_LIST_INPUT,
							   check_standby_slots, assign_standby_slots, NULL);
}

/*
 * what DROP EXTENSION outbox may delete; read by the utility hook, in the
 * backend that drops
 */
static void
define_drop_settings(void)
{
	DefineCustomBoolVariable("outbox.allow_drop_undelivered",
							 "Lets DROP EXTENSION outbox delete committed events not yet delivered to Kafka.",
							 "Off refuses the drop while events wait for the relay, are held, or are dead "
							 "letters neither replayed nor discarded.",
							 &outbox_allow_drop_undelivered,
							 false,
							 PGC_USERSET, 0,
							 NULL, NULL, NULL);
}

void
_PG_init(void)
{
	define_emit_settings();
	define_kafka_settings();
	define_registry_settings();
	define_relay_settings();
	define_failure_settings();
	define_delivery_settings();
	define_subscription_settings();
	define_standby_settings();
	define_drop_settings();
	OutboxEmitInit();
	/* without the preload too: a session that loaded the library is guarded */
	OutboxUtilityHookInstall();

	/* a PGC_POSTMASTER setting can only be defined while preloading */
	if (!process_shared_preload_libraries_in_progress)
	{
		MarkGUCPrefixReserved("outbox");
		return;
	}

	DefineCustomIntVariable("outbox.max_databases",
							"Databases that can run a relay at the same time.",
							"Each relay is a background worker: max_worker_processes must leave room for them.",
							&outbox_max_databases,
							OUTBOX_MAX_DATABASES_DEFAULT, 1, OUTBOX_MAX_DATABASES_MAX,
							PGC_POSTMASTER, 0,
							NULL, NULL, NULL);

	DefineCustomIntVariable("outbox.max_subscriptions",
							"Subscriptions, over all databases, that can have a consumer worker at the same time.",
							"Each subscription's worker is a background worker: max_worker_processes must leave room for them.",
							&outbox_max_subscriptions,
							OUTBOX_MAX_SUBSCRIPTIONS_DEFAULT, 0, OUTBOX_MAX_SUBSCRIPTIONS_MAX,
							PGC_POSTMASTER, 0,
							NULL, NULL, NULL);

	/* only now: reserving the prefix drops settings not yet defined */
	MarkGUCPrefixReserved("outbox");


	OutboxShmemInstallHooks(OutboxCounterShmemRequest, OutboxCounterShmemInit);
	OutboxLauncherRegisterStatic();
}
