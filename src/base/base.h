/*-------------------------------------------------------------------------
 *
 * base/base.h
 *		What every room shares: the settings, the limits, the extension's own
 *		SQL through SPI with search_path pinned, and a worker's start-up.
 *
 * What the base room offers to the rooms above it; a file includes only
 * the headers of rooms below its own (docs/design.md).
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_BASE_H
#define OUTBOX_BASE_H

#include "postgres.h"

#include "datatype/timestamp.h"
#include "lib/stringinfo.h"
#include "nodes/pg_list.h"
#include "storage/buf.h"
#include "storage/itemptr.h"
#include "storage/latch.h"
#include "utils/jsonb.h"
#include "utils/relcache.h"
#include "utils/snapshot.h"
#include "utils/uuid.h"
#include "executor/spi.h"

#include "utils/uuid.h"

/* Bounds of the integer settings, named so the check hooks and docs agree */
#define OUTBOX_MAX_PAYLOAD_DEFAULT	(1024 * 1024)
#define OUTBOX_BATCH_SIZE_DEFAULT	5000
#define OUTBOX_BATCH_SIZE_MAX		100000
#define OUTBOX_BATCH_MAX_BYTES_DEFAULT (64 * 1024 * 1024)
#define OUTBOX_BATCH_MAX_BYTES_MIN	1024
#define OUTBOX_BATCH_MAX_BYTES_MAX	(1024 * 1024 * 1024)
#define OUTBOX_POLL_INTERVAL_DEFAULT 1000
#define OUTBOX_POLL_INTERVAL_MAX	3600000
#define OUTBOX_SHUTDOWN_TIMEOUT_DEFAULT 5000
#define OUTBOX_SHUTDOWN_TIMEOUT_MAX 600000
#define OUTBOX_KAFKA_IDLE_TIMEOUT_DEFAULT 60000
#define OUTBOX_MAX_DATABASES_DEFAULT 16
#define OUTBOX_MAX_DATABASES_MAX	1024
#define OUTBOX_MAX_SUBSCRIPTIONS_DEFAULT 8
#define OUTBOX_MAX_SUBSCRIPTIONS_MAX 256
#define OUTBOX_MAX_SUBSCRIPTIONS_PER_DATABASE_DEFAULT 4	/* half the slots: one database cannot take them all */

#define OUTBOX_BACKOFF_MIN_DEFAULT	100
#define OUTBOX_BACKOFF_MAX_DEFAULT	30000
#define OUTBOX_BACKOFF_LIMIT		3600000
#define OUTBOX_MAX_ATTEMPTS_DEFAULT 5
#define OUTBOX_DELIVERY_TIMEOUT_DEFAULT 30000
#define OUTBOX_HOLD_AFTER_DEFAULT	1000
#define OUTBOX_MAX_ATTEMPTS_LIMIT	1000
#define OUTBOX_RETENTION_DEFAULT	(7 * 24 * 3600)

/*
 * The log's generations: outbox.events_0 .. events_<N-1>, a ring (see
 * outbox.sql, "The log"); the name of generation g's partition is
 * "events_<g>".
 */
#define OUTBOX_GENERATIONS			6
#define OUTBOX_GENERATION_NAME_FMT	"events_%d"
#define OUTBOX_GENERATION_NAME_LEN	16
/* the inbox's dedupe window: under a minute, duplicates still in flight would be consumed again */
#define OUTBOX_INBOX_RETENTION_DEFAULT (30 * 24 * 3600)
#define OUTBOX_INBOX_RETENTION_MIN	60

#define OUTBOX_TOPIC_MAX_LEN		249

/* caller headers of an event (emit_check.c): how many, bytes of names+values */
#define OUTBOX_CALLER_HEADERS_MAX	64
#define OUTBOX_CALLER_HEADER_BYTES_MAX (16 * 1024)
/* characters of one caller header's name (message.c) */
#define OUTBOX_HEADER_NAME_MAX_LEN	255

/* librdkafka's message.max.bytes when outbox.kafka_config leaves it unset */
#define OUTBOX_KAFKA_MESSAGE_MAX_DEFAULT 1000000

/*
 * The Kafka headers the relay writes itself, in the order it writes them
 * (producer.c), before the caller's.  emit() refuses caller headers of these
 * names (OutboxCheckHeaderName, message.c): a reader taking the last header
 * of a name would see the caller's.  Names are in OutboxHeaderNames, in
 * this order; add a new one here and there, at the same place.
 */
typedef enum OutboxHeader
{
	OUTBOX_HEADER_ID = 0,
	OUTBOX_HEADER_EVENT_TYPE,
	OUTBOX_HEADER_AGGREGATE_TYPE,
	OUTBOX_HEADER_AGGREGATE_ID,
	OUTBOX_HEADER_SEQ,
	OUTBOX_HEADER_SCHEMA_VERSION,
	OUTBOX_HEADER_OCCURRED_AT,
	OUTBOX_HEADER_TRACEPARENT,
	OUTBOX_HEADER_TENANT,
	OUTBOX_HEADER_ORIGIN,
	OUTBOX_NUM_HEADERS
} OutboxHeader;

extern const char *const OutboxHeaderNames[OUTBOX_NUM_HEADERS];

typedef enum OutboxPoisonPolicy
{
	OUTBOX_POISON_BLOCK,
	OUTBOX_POISON_SKIP
} OutboxPoisonPolicy;

/* outbox.delivery: what a read_committed consumer of the topics gets */
typedef enum OutboxDelivery
{
	OUTBOX_DELIVERY_AT_LEAST_ONCE,
	OUTBOX_DELIVERY_EXACTLY_ONCE
} OutboxDelivery;

/* outbox.message_format: the shape of each message (kafka/message_ce.c) */
typedef enum OutboxMessageFormat
{
	OUTBOX_FORMAT_NATIVE,
	OUTBOX_FORMAT_CE_BINARY,
	OUTBOX_FORMAT_CE_STRUCTURED
} OutboxMessageFormat;

/* Where a delivery or producer error belongs (design section 5) */
typedef enum OutboxErrorClass
{
	OUTBOX_ERROR_NONE = 0,
	OUTBOX_ERROR_TRANSIENT,
	OUTBOX_ERROR_PERMANENT,
	OUTBOX_ERROR_FATAL,
	OUTBOX_ERROR_SCHEMA			/* an Avro topic's payload does not fit its
								 * schema: quarantined before any send */
} OutboxErrorClass;

/* settings (outbox.c) */
extern char *outbox_topic_template;
extern bool outbox_aggregate_sequence;
extern int	outbox_max_payload_bytes;
extern char *outbox_traceparent;
extern char *outbox_tenant;
extern char *outbox_kafka_brokers;
extern char *outbox_kafka_config;
extern char *outbox_kafka_secrets_file;
extern char *outbox_schema_registry_url;
extern char *outbox_avro_topics;
extern int	outbox_schema_registry_refresh;
extern int	outbox_schema_registry_timeout;
extern int	outbox_kafka_message_max_bytes;
extern char *outbox_allowed_topics;
extern int	outbox_batch_size;
extern int	outbox_batch_max_bytes;
extern int	outbox_poll_interval;
extern bool outbox_enabled;
extern int	outbox_shutdown_timeout;
extern int	outbox_kafka_idle_timeout;
extern int	outbox_max_databases;
extern int	outbox_retry_backoff_min;
extern int	outbox_retry_backoff_max;
extern int	outbox_max_attempts;
extern int	outbox_poison_policy;
extern int	outbox_retention;
extern int	outbox_inbox_retention;
extern int	outbox_delivery_timeout;
extern int	outbox_hold_after;
extern char *outbox_synchronized_standby_slots;
extern bool outbox_allow_drop_undelivered;
extern int	outbox_delivery;
extern int	outbox_transaction_events;
extern char *outbox_progress_topic;
extern char *outbox_transactional_id_suffix;
extern int	outbox_message_format;
extern char *outbox_cloudevents_source;
extern int	outbox_max_backlog;
extern int	outbox_max_backlog_age;

/*
 * Whether a backlog of backlog events, the oldest created at oldest (0:
 * none), is at outbox.max_backlog or its oldest at outbox.max_backlog_age
 * (seconds) at now: emit() refuses then, and the relay says when it stops.
 * Arithmetic only: callers hold a spinlock.
 */
static inline bool
OutboxBacklogOverLimits(int64 backlog, TimestampTz oldest, TimestampTz now)
{
	if (outbox_max_backlog > 0 && backlog >= outbox_max_backlog)
		return true;
	return outbox_max_backlog_age > 0 && oldest > 0 &&
		now - oldest >= (int64) outbox_max_backlog_age * USECS_PER_SEC;
}

/*
 * Whether refusing may end: the backlog under 90% of each limit set, so
 * that a backlog hovering at a limit does not start and end refusing at
 * every page.  Arithmetic only: callers hold a spinlock.
 */
static inline bool
OutboxBacklogRelieved(int64 backlog, TimestampTz oldest, TimestampTz now)
{
	if (outbox_max_backlog > 0 && backlog >= (int64) outbox_max_backlog * 9 / 10)
		return false;
	return !(outbox_max_backlog_age > 0 && oldest > 0 &&
			 now - oldest >= (int64) outbox_max_backlog_age * USECS_PER_SEC * 9 / 10);
}

/*
 * outbox.synchronized_standby_slots as the relay reads it: the slot names,
 * parsed once by the setting's check hook (relay_standby.c).  NULL or no
 * names: the relay waits for no standby.
 */
typedef struct OutboxStandbySlotList
{
	int			n;
	NameData	names[FLEXIBLE_ARRAY_MEMBER];
} OutboxStandbySlotList;

extern const OutboxStandbySlotList *outbox_standby_slot_list;

/* spi.c: the extension's own statements, search_path pinned, results checked */
extern int	OutboxPinSearchPath(void);
extern void OutboxUnpinSearchPath(int level);
extern SPIPlanPtr OutboxSpiPrepare(const char *sql, int nargs, Oid *types,
								   const char *what);
extern SPIPlanPtr OutboxSpiPrepareGeneric(const char *sql, int nargs,
										  Oid *types, const char *what);
extern Datum OutboxSpiValue(int col, bool *isnull);
extern void OutboxSpiExec(const char *sql, int nargs, Oid *types, Datum *values,
						  const char *nulls, bool read_only, long count,
						  int expected, const char *what);
extern void OutboxSpiExecText(const char *sql, const char *arg, bool read_only,
							  long count, int expected, const char *what);

/* worker.c: the start-up the relay and the subscription worker share */
extern WaitEventSet *OutboxWorkerStart(MemoryContext cxt, int event_pipe[2],
									   const char *what);

#endif							/* OUTBOX_BASE_H */
