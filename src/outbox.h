/*-------------------------------------------------------------------------
 *
 * outbox.h
 *		Declarations shared by the files of the outbox extension.
 *
 * Invariants: only kafka.c, kafka_topic.c and kafka_consumer.c include
 * rdkafka.h (through kafka.h), so nothing here mentions a librdkafka type;
 * the producer and the subscriptions' consumer are opaque (OutboxProducer,
 * OutboxConsumer).
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_H
#define OUTBOX_H

#include "postgres.h"

#include "datatype/timestamp.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "lib/stringinfo.h"
#include "nodes/pg_list.h"
#include "storage/buf.h"
#include "storage/itemptr.h"
#include "storage/latch.h"
#include "utils/jsonb.h"
#include "utils/relcache.h"
#include "utils/snapshot.h"
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
 * (kafka.c), before the caller's.  emit() refuses caller headers of these
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

/* Where a delivery or producer error belongs (design section 5) */
typedef enum OutboxErrorClass
{
	OUTBOX_ERROR_NONE = 0,
	OUTBOX_ERROR_TRANSIENT,
	OUTBOX_ERROR_PERMANENT,
	OUTBOX_ERROR_FATAL
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

/* common_spi.c: the extension's own statements, search_path pinned */
extern int	OutboxPinSearchPath(void);
extern void OutboxUnpinSearchPath(int level);
extern SPIPlanPtr OutboxSpiPrepare(const char *sql, int nargs, Oid *types,
								   const char *what);
extern Datum OutboxSpiValue(int col, bool *isnull);

/* relay_standby.c */
extern OutboxStandbySlotList *OutboxStandbySlotsParse(const char *value, char **bad);

/* emit.c: outbox.emit(), and the relay woken at commit */
extern void OutboxEmitInit(void);

/* topic.c: topic names, template and allowed patterns, for emit() */
extern bool OutboxTopicTemplateIsValid(const char *tmpl, char **bad);
extern bool OutboxTopicPatternsAreValid(const char *patterns, char **bad);
extern char *OutboxTopicResolve(char *topic, const char *aggregate_type,
								const char *event_type);
extern bool OutboxTopicNameIsLegal(const char *name);

/* sequence.c: the per-aggregate sequence of one transaction, for emit() */
typedef struct OutboxSequenceEntry OutboxSequenceEntry;

extern void OutboxSequenceInit(void);
extern OutboxSequenceEntry *OutboxSequenceHeld(text *aggregate_type,
											   text *aggregate_id);
extern int64 OutboxSequenceNext(const OutboxSequenceEntry *entry);
extern void OutboxSequenceGiven(OutboxSequenceEntry *entry, int64 seq);
extern void OutboxSequenceEnter(text *aggregate_type, text *aggregate_id,
								int64 seq);
extern int64 OutboxSequenceCreate(text *aggregate_type, text *aggregate_id);

/* emit_counter.c: a transaction's first seq of an aggregate, from its row */
extern bool OutboxEmitTakeSeq(text *aggregate_type, text *aggregate_id,
							  int64 *seq);

/* emit_table.c: the tables emit() writes without a statement */
typedef enum OutboxEmitTable
{
	OUTBOX_EMIT_EVENTS,			/* outbox.events */
	OUTBOX_EMIT_AGGREGATES,		/* outbox.aggregates */
	OUTBOX_EMIT_NTABLES
} OutboxEmitTable;

extern Relation OutboxEmitOpenTable(OutboxEmitTable which);
extern bool OutboxEmitTableKnown(OutboxEmitTable which, Relation rel);
extern uint64 OutboxEmitTableStamp(void);
extern void OutboxEmitTableJudged(OutboxEmitTable which, Relation rel,
								  uint64 stamp);
extern bool OutboxEmitPlainIndexes(Relation rel);

/* emit_uuid.c: event ids */
extern void OutboxGenerateUuidV7(pg_uuid_t *uuid);

/* counter.c: where counter rows were last seen, for emit() */
extern void OutboxCounterShmemRequest(void);
extern void OutboxCounterShmemInit(void);
extern uint64 OutboxCounterHash(Oid relid, text *aggregate_type,
								text *aggregate_id);
extern bool OutboxCounterRecall(Relation rel, uint64 hash, ItemPointer root,
								Buffer *buffer);
extern void OutboxCounterRemember(uint64 hash, ItemPointer root, Buffer buffer);
extern void OutboxCounterForget(uint64 hash);

/* shmem.c: the relay slots; their layout and locks are private to it */
typedef enum OutboxRelayState
{
	OUTBOX_RELAY_STARTING = 0,
	OUTBOX_RELAY_IDLE,
	OUTBOX_RELAY_PUBLISHING,
	OUTBOX_RELAY_PAUSED,
	OUTBOX_RELAY_BACKING_OFF,
	OUTBOX_RELAY_NOT_CONFIGURED,
	OUTBOX_RELAY_WAITING_STANDBY,	/* outbox.synchronized_standby_slots */
	OUTBOX_RELAY_STOPPED
} OutboxRelayState;
#define OUTBOX_RELAY_NSTATES (OUTBOX_RELAY_STOPPED + 1)

/* publish latency histogram: upper bounds in microseconds, then +Inf */
#define OUTBOX_LAT_NBUCKETS 19
extern const int64 OutboxLatencyBounds[OUTBOX_LAT_NBUCKETS - 1];

#define OUTBOX_LAST_ERROR_LEN		256

/* one relay's slot: only the relay attached to it holds a pointer */
typedef struct OutboxSlot OutboxSlot;

/*
 * A reader's copy of one database's slot (OutboxSlotRead).  Without a
 * slot: pid 0, state stopped, brokers_up -1, every figure 0.
 */
typedef struct OutboxSlotView
{
	int			pid;			/* the relay attached, 0 when none */
	OutboxRelayState state;
	bool		no_extension;	/* the last relay found no extension */
	TimestampTz started_at;
	int			brokers_up;		/* -1: unknown */
	int64		backlog;		/* committed, not yet acknowledged */
	TimestampTz oldest_pending; /* created_at of the oldest undelivered, or 0 */
	int			page_size;		/* events in the page in hand */
	uint64		published;
	uint64		published_bytes;
	uint64		retries;		/* events sent again after a failure */
	uint64		failures[4];	/* by OutboxErrorClass */
	TimestampTz last_delivery;
	TimestampTz last_error_at;
	char		last_error[OUTBOX_LAST_ERROR_LEN];
	char		standby_wait[OUTBOX_LAST_ERROR_LEN];	/* why the page waits for
														 * a standby, "" when not */
	uint64		latency[OUTBOX_LAT_NBUCKETS];	/* since the relay started */
	double		latency_sum;	/* seconds */
	uint64		minute_events;	/* the last minute's deliveries */
	uint64		minute_bytes;
	uint64		minute_latency[OUTBOX_LAT_NBUCKETS];
	bool		slots_full;		/* every slot belongs to a database */
	TimestampTz no_worker_since;	/* the launcher lacks a worker, or 0 */
} OutboxSlotView;

/* what a relay adds to its slot after a settled round */
typedef struct OutboxDeliveryTally
{
	uint64		events;
	uint64		bytes;
	double		latency_sum;
	uint64		latency[OUTBOX_LAT_NBUCKETS];
} OutboxDeliveryTally;

/*
 * What a relay reports after a round: OutboxSlotReportRound adds it to its
 * slot in one critical section.  Zero fields change nothing, except where
 * said otherwise.
 */
#define OUTBOX_BROKERS_UNCHANGED (-2)
typedef struct OutboxRoundReport
{
	int			pages;			/* pages read */
	OutboxDeliveryTally delivered;	/* acknowledged, with their latency */
	bool		batch_events;	/* delivered were the open batch's: they
								 * leave the backlog now, not when the page
								 * settles */
	int			retries;		/* events sent again */
	uint64		failures[4];	/* by OutboxErrorClass */
	int			brokers_up;		/* -1 unknown; OUTBOX_BROKERS_UNCHANGED */
	bool		set_backlog;	/* the four below replace the slot's */
	bool		batch_opened;	/* backlog is now remaining + later commits */
	int64		batch_remaining;
	TimestampTz oldest_pending; /* 0 none, -1 keep the last one */
	int			page_size;
} OutboxRoundReport;

extern void OutboxShmemInstallHooks(void);
extern bool OutboxShmemAvailable(void);
extern const char *OutboxRelayStateName(OutboxRelayState state);

/* user backends: commits and the utility hook */
extern void OutboxWakeRelay(Oid dboid, bool replay, int events);
extern void OutboxRequestExtensionCheck(Oid dboid);
extern void OutboxHoldDatabase(Oid dboid, int hold_ms);

/* the launcher */
extern void OutboxSetNoWorker(bool short_of_workers);
extern bool OutboxSlotAcquire(Oid dboid, bool *held);
extern void OutboxSlotRelease(Oid dboid);

/* readers: the launcher, status(), metrics(), health() */
extern bool OutboxSlotRead(Oid dboid, OutboxSlotView *out);

/* the relay, on the slot it attached to */
extern OutboxSlot *OutboxSlotAttach(Oid dboid, int *other_pid);
extern void OutboxSlotDetach(OutboxSlot *slot);
extern void OutboxSlotSetState(OutboxSlot *slot, OutboxRelayState state);
extern bool OutboxSlotIsHeld(OutboxSlot *slot);
extern void OutboxSlotMarkNoExtension(OutboxSlot *slot);
extern void OutboxSlotCountError(OutboxSlot *slot, const char *message);
extern void OutboxSlotSetStandbyWait(OutboxSlot *slot, const char *why);
extern bool OutboxSlotTakeReplayPending(OutboxSlot *slot);
extern bool OutboxSlotTakeExtensionCheck(OutboxSlot *slot);
extern void OutboxTallyAdd(OutboxDeliveryTally *tally, int64 latency_us, int bytes);
extern void OutboxSlotReportRound(OutboxSlot *slot, const OutboxRoundReport *report);

/*
 * status.c, status_metrics.c, status_health.c: everything status(),
 * metrics() and health() report, in one place (OutboxStatusTake)
 */
typedef struct OutboxStatusSnapshot
{
	OutboxSlotView slot;		/* a copy of the relay's slot */
	bool		running;		/* a relay process is attached */
	int64		backlog;
	double		oldest_age;		/* seconds, < 0 when nothing is pending */
	int64		quarantined;
	int64		parked;
	int64		queued;			/* replay queue and unjudged restored events */
	int64		held_events;	/* rows of outbox.held */
	int			held_partitions;
	double		held_age;		/* seconds since the oldest hold began, < 0 none */
	double		held_oldest_age;	/* age of the oldest held event, < 0 none */
	char	   *held_metrics;	/* their outbox_held_events samples (labels
								 * after the database's) */
	char	   *oldest_hold;	/* "topic[partition]" of the oldest hold */
	char	   *no_relay;		/* why no relay runs, when none does */
} OutboxStatusSnapshot;

extern void OutboxStatusTake(OutboxStatusSnapshot *snap);
extern const char *OutboxStatusStateName(const OutboxStatusSnapshot *snap);

/* handoff.c: the launcher's sign-on, probe requests and answers, prepared counts */
#define OUTBOX_MAX_REQUESTS			64	/* probe requests waiting */
/* probe workers: does a database have the extension? */
#define OUTBOX_MAX_PROBES			64
#define OUTBOX_PROBE_UNKNOWN		0
#define OUTBOX_PROBE_EXTENSION		1
#define OUTBOX_PROBE_NO_EXTENSION	2

extern void OutboxHandoffShmemRequest(void);
extern void OutboxHandoffShmemInit(void);
extern bool OutboxLauncherAttach(void);
extern void OutboxWakeLauncher(void);
extern int	OutboxLauncherTakeRequests(Oid *out);
extern void OutboxRequestProbe(Oid dboid);
extern bool OutboxProbeBegin(Oid dboid);
extern void OutboxProbeReport(Oid dboid, bool has_extension);
extern int	OutboxProbeTake(Oid dboid);
extern void OutboxPreparedRemember(const char *gid, Oid dboid, int events,
								   bool replay);
extern bool OutboxPreparedTake(const char *gid, Oid dboid, int *events,
							   bool *replay);

/* kafka.c */
typedef struct OutboxProducer OutboxProducer;

#define OUTBOX_DELIVERY_PENDING (-100000)

/*
 * One event as the relay publishes it.  Strings are NUL-terminated and
 * owned by the relay's page memory context.  kafka.c writes the outcome
 * where it arrives (the delivery report, or librdkafka's refusal at produce
 * time): delivery_err (0: acknowledged) and, for a failure, last_err,
 * last_err_local, last_class and the failure times.
 */
typedef struct OutboxEvent
{
	int64		id;
	char	   *event_id;
	char	   *aggregate_type;
	char	   *aggregate_id;
	char	   *event_type;
	char	   *topic;
	char	   *key;
	char	   *payload;
	int			payload_len;
	bool		has_seq;
	int64		seq;
	int32		schema_version;
	char	   *occurred_at;
	char	   *tenant;			/* NULL when unset */
	char	   *traceparent;	/* NULL when unset */
	int			nheaders;
	char	  **header_names;
	char	  **header_values;
	TimestampTz created_at;
	int			delivery_err;

	/* delivery state, kept by the relay while the page is in hand */
	int			disposition;	/* OUTBOX_EVENT_* */
	int			attempts;		/* permanent failures so far */
	int			last_err;
	bool		last_err_local; /* last_err is librdkafka's own refusal at
								 * produce time, not a delivery report's */
	OutboxErrorClass last_class;
	TimestampTz first_failed_at;
	TimestampTz last_failed_at;
	char	   *blocked_by;		/* parked: event id of the quarantined head */

	/* replay pages only */
	int64		queue_position;

	/*
	 * The Kafka partition the relay sends it to (OutboxProducerPartition),
	 * OUTBOX_PARTITION_UNSET before it is asked, OUTBOX_PARTITION_UNKNOWN
	 * when the topic's partitions are unknown (librdkafka then chooses).
	 */
	int32		partition;
	int32		partition_count;	/* the topic's partitions it was computed
									 * among; 0: none */
	bool		probe;			/* sent alone for a held partition: kafka.c
								 * leaves it out of the pending count */
	bool		was_held;		/* read from outbox.held */
	bool		in_flight;		/* produced, its delivery report not served */
} OutboxEvent;

#define OUTBOX_PARTITION_UNSET		(-2)
#define OUTBOX_PARTITION_UNKNOWN	(-1)

#define OUTBOX_EVENT_PENDING		0
#define OUTBOX_EVENT_DELIVERED		1
#define OUTBOX_EVENT_QUARANTINED	2
#define OUTBOX_EVENT_PARKED			3
#define OUTBOX_EVENT_HELD			4	/* its partition is held: recorded in
										 * outbox.held, not sent */

/* message.c */
extern void OutboxEventHeaderValues(const OutboxEvent *event, const char **values,
									char num[2][32]);
extern size_t OutboxEventWireSize(const OutboxEvent *event, size_t *headers_size);
extern const char *OutboxOrigin(void);
extern void OutboxSetOrigin(const char *value);

/* the origin header's value: a UUID's text (message.c) */
#define OUTBOX_ORIGIN_MAX 36
extern void OutboxCheckHeaderName(const char *name);

/*
 * One event on its way into outbox.events (emit.c): the arguments as
 * checked, and event, what the relay will send, as far as the size check
 * counts it.  Everything is palloc'd in the caller's context or points into
 * its arguments.
 */
typedef struct OutboxEmitRow
{
	text	   *aggregate_type;
	text	   *aggregate_id;
	text	   *event_type;
	Jsonb	   *payload;
	Jsonb	   *headers;		/* NULL: none */
	char	   *topic;
	text	   *key;			/* the aggregate id when none was given */
	pg_uuid_t  *event_id;
	TimestampTz occurred_at;
	OutboxEvent event;
} OutboxEmitRow;

/* emit_check.c: emit()'s arguments, each hostile input */
extern bool OutboxTraceparentIsValid(const char *value);
extern void OutboxEmitCheckContent(FunctionCallInfo fcinfo, OutboxEmitRow *row);
extern void OutboxEmitCheckEnvelope(FunctionCallInfo fcinfo, OutboxEmitRow *row);
extern void OutboxEmitCheckSize(const OutboxEvent *event);

/* emit_direct.c: the event row, written as the INSERT would write it */
extern void OutboxEmitInsert(OutboxEmitRow *row);

/* kafka_settings.c: the rules kafka.c applies to librdkafka's settings */
typedef bool (*OutboxKafkaJudge) (const char *name, const char *value,
								  const char *where, char **detail, void *arg);
extern bool OutboxKafkaPropertyIsSecret(const char *name);
extern const char *OutboxKafkaPropertyRefusal(const char *name, const char *value,
											  bool from_secrets, bool *by_value);
extern bool OutboxKafkaSplitProperty(char *item, char **name, char **value);
extern char *OutboxKafkaReadSecretsText(const char *path, OutboxKafkaJudge judge,
										void *arg, char **errmsg);

/* kafka.c */
extern bool OutboxKafkaCheckConfig(const char *conf, char **detail);
extern int	OutboxKafkaMessageMaxBytes(const char *conf);
extern bool OutboxKafkaCheckSecretsFile(const char *path, char **detail);
extern void OutboxKafkaReadSecretsFile(MemoryContext parent);
extern OutboxProducer *OutboxProducerCreate(int event_fd, char **errmsg);
extern bool OutboxProducerOutdated(const OutboxProducer *producer);
extern void OutboxProducerDestroy(OutboxProducer *producer);
extern void OutboxProducerRecountTopics(OutboxProducer *producer);
extern int32 OutboxProducerTopicPartitions(OutboxProducer *producer, const char *topic);
extern int32 OutboxProducerPartition(OutboxProducer *producer, OutboxEvent *event,
									 int32 partitions);
extern void OutboxProducerSend(OutboxProducer *producer, OutboxEvent *event);
extern int	OutboxProducerServe(OutboxProducer *producer);
extern int	OutboxProducerBrokersUp(OutboxProducer *producer);
extern bool OutboxProducerAllBrokersDown(OutboxProducer *producer);
extern void OutboxProducerPurge(OutboxProducer *producer);
extern bool OutboxProducerTakeError(OutboxProducer *producer, char *buf,
									size_t len, int *count, int *fatal);
extern bool OutboxProducerIsFatal(OutboxProducer *producer, char *buf, size_t len);
extern const char *OutboxKafkaKnownCrash(void);
extern const char *OutboxDeliveryErrorName(int err);
extern const char *OutboxDeliveryErrorText(int err, bool local);
extern const char *OutboxErrorClassName(OutboxErrorClass c);

/* store.c, store_dead.c, store_upkeep.c: the relay's SQL */

/*
 * The relay's position.  prev: snapshot in which every committed event is
 * delivered (NULL: none yet).  cur: snapshot of the batch under way (NULL:
 * none); the batch is every event visible in cur and not in prev, and
 * last_id is the last id of it acknowledged.  Strings live in the relay's
 * long-lived context.
 */
typedef struct OutboxBatch
{
	char	   *prev;
	char	   *cur;
	int64		last_id;
	int64		max_id;
	int64		remaining;
	/*
	 * The last OpenBatch() found nothing in a snapshot it took then, which
	 * prev now is; false after a resumed batch's (taken before a restart)
	 * or once prev is anything else.
	 */
	bool		fresh;
} OutboxBatch;

extern bool OutboxStoreExtensionPresent(void);
extern void OutboxStoreLoadProgress(OutboxBatch *batch, MemoryContext cxt);
extern void OutboxStoreLoadOrigin(bool force);
extern int64 OutboxStoreAdoptRestored(bool force);
extern bool OutboxStoreOpenBatch(OutboxBatch *batch, MemoryContext cxt);
extern int	OutboxStoreReadPage(OutboxBatch *batch, int limit, int max_bytes,
								OutboxEvent **events, MemoryContext cxt,
								bool *cut);
extern void OutboxStoreSavePage(const char *cur, int64 last_id,
								int count, bool batch_done);

/*
 * How a dead letter's last_error words its event's last delivery error:
 * the caller's (OutboxDeliveryErrorText), as the SQL files know no Kafka.
 */
typedef const char *(*OutboxErrorWording) (int err, bool local);

extern int	OutboxStoreRecordDeadLetters(OutboxEvent *events, int n,
										 OutboxErrorWording wording);
extern List *OutboxStoreLoadBlocked(MemoryContext cxt);
extern int	OutboxStoreReadReplays(int limit, OutboxEvent **events,
								   MemoryContext cxt);
extern void OutboxStoreFinishReplays(OutboxEvent *events, int n,
									 OutboxErrorWording wording);
extern int64 OutboxStoreCleanup(int max_events, TimestampTz *oldest);
extern int64 OutboxStoreInboxCleanup(int max_rows);

/* store_held.c: held partitions */
typedef struct OutboxHeldPartition
{
	char	   *topic;
	int32		partition;
	int32		partitions;		/* the count it was computed among; 0: unknown */
	int64		events;
	TimestampTz since;
} OutboxHeldPartition;

extern bool OutboxStoreHeldPresent(bool *counted);
extern int	OutboxStoreLoadHolds(OutboxHeldPartition **holds, bool counted,
								 MemoryContext cxt);
extern int64 OutboxStoreHoldEvents(const OutboxEvent *events, int n, bool counted);
extern int64 OutboxStoreReleaseHeld(const OutboxEvent *events, int n);
extern int	OutboxStoreReadHeld(const char *topic, int32 partition, int limit,
								OutboxEvent **events, MemoryContext cxt);
extern void OutboxStoreDeleteHeld(int64 id);
extern int64 OutboxStoreEndHold(const char *topic, int32 partition);

/* an aggregate whose events wait behind a quarantined one */
typedef struct OutboxBlocked
{
	char	   *aggregate_type;
	char	   *aggregate_id;
	char	   *head;			/* event id of the quarantined event */
} OutboxBlocked;

/* inbox_shmem.c: the subscription slots; their layout is private to it */
#define OUTBOX_SUBSCRIPTION_NAME_MAX	64	/* 63 characters and the NUL */

/* subscriptions need the SQL objects of the library's version (1.8 on) */
#define OUTBOX_OLD_SQL_PROBLEM \
	"the extension's SQL objects in this database are older than its library: run ALTER EXTENSION outbox UPDATE"
#define OUTBOX_INBOX_PARTS_MAX			64	/* partitions a slot shows */

/*
 * A subscription's states in order, each with the one spelling status()
 * shows of it (OutboxInboxStateName), so that none lacks a name.
 * RETRYING: a handler failed, its partition waits.  PARTITION_STOPPED: a
 * partition's log does not hold its next offset (consumer_range.c).
 */
#define OUTBOX_INBOX_STATES(state) \
	state(OUTBOX_INBOX_STARTING, "starting") \
	state(OUTBOX_INBOX_RUNNING, "running") \
	state(OUTBOX_INBOX_RETRYING, "retrying") \
	state(OUTBOX_INBOX_PARTITION_STOPPED, "partition stopped") \
	state(OUTBOX_INBOX_NOT_CONFIGURED, "not configured") \
	state(OUTBOX_INBOX_STOPPED, "stopped")

#define OUTBOX_INBOX_STATE_VALUE(value, name) value,

typedef enum OutboxInboxState
{
	OUTBOX_INBOX_STATES(OUTBOX_INBOX_STATE_VALUE)
	OUTBOX_INBOX_NSTATES
} OutboxInboxState;

/* why the launcher left a subscription without a worker (none: it did not) */
typedef enum OutboxInboxWait
{
	OUTBOX_INBOX_WAIT_NONE = 0,
	OUTBOX_INBOX_WAIT_WORKER,	/* no background worker slot was free */
	OUTBOX_INBOX_WAIT_RELAY,	/* a relay waits for one: relays come first */
	OUTBOX_INBOX_WAIT_DATABASE_LIMIT	/* outbox.max_subscriptions_per_database */
} OutboxInboxWait;

/* one assigned partition, as the worker last reported it */
typedef struct OutboxInboxPart
{
	char		topic[OUTBOX_TOPIC_MAX_LEN + 1];
	int32		partition;
	int64		next_offset;	/* -1: nothing applied yet */
	int64		high;			/* high watermark, -1: unknown */
} OutboxInboxPart;

typedef struct OutboxInboxView
{
	Oid			dboid;
	char		name[OUTBOX_SUBSCRIPTION_NAME_MAX];
	int			pid;
	OutboxInboxState state;
	TimestampTz started_at;
	uint64		processed;		/* handler calls committed */
	uint64		deduplicated;	/* messages seen before: not applied */
	uint64		failed;			/* handler errors */
	uint64		dead_lettered;
	uint64		parked;
	TimestampTz last_applied_at;
	TimestampTz last_error_at;
	char		last_error[OUTBOX_LAST_ERROR_LEN];
	OutboxInboxWait wait;		/* no worker, and why (the launcher's) */
	TimestampTz wait_since;		/* since when, 0 when wait is none */
	int			nparts;
	OutboxInboxPart parts[OUTBOX_INBOX_PARTS_MAX];
} OutboxInboxView;

/* what a worker adds to its slot after a batch commits */
typedef struct OutboxInboxTally
{
	uint64		processed;
	uint64		deduplicated;
	uint64		failed;
	uint64		dead_lettered;
	uint64		parked;
} OutboxInboxTally;

typedef struct OutboxInboxSlot OutboxInboxSlot;

/* what the launcher reads of a subscription slot in use */
typedef struct OutboxInboxPeek
{
	Oid			dboid;
	char		name[OUTBOX_SUBSCRIPTION_NAME_MAX];
	int			pid;			/* its worker's, 0: none */
	bool		gone;			/* the worker found no subscription row */
	TimestampTz hold_until;		/* no worker before */
} OutboxInboxPeek;

extern int	outbox_max_subscriptions;
extern int	outbox_max_subscriptions_per_database;
extern const char *OutboxInboxStateName(OutboxInboxState state);
extern void OutboxInboxShmemRequest(void);
extern void OutboxInboxShmemInit(void);
extern bool OutboxInboxHasRoom(Oid dboid, const char *name);
extern bool OutboxInboxRequest(Oid dboid, const char *name, bool changed);
extern void OutboxInboxWake(Oid dboid, const char *name);
extern void OutboxInboxHoldDatabase(Oid dboid, TimestampTz until);
extern int	OutboxInboxSlotCount(void);
extern bool OutboxInboxSlotPeek(int i, OutboxInboxPeek *out);
extern void OutboxInboxSlotFree(int i);
extern void OutboxInboxSlotForget(int i);
extern void OutboxInboxSetWait(int i, Oid dboid, const char *name,
							   OutboxInboxWait wait);
extern int	OutboxInboxStopNewest(Oid dboid, int *pid);
extern int	OutboxInboxList(Oid dboid, OutboxInboxView **views);
extern OutboxInboxSlot *OutboxInboxAttach(int i, Oid dboid, const char *name);
extern void OutboxInboxDetach(OutboxInboxSlot *slot);
extern void OutboxInboxMarkGone(OutboxInboxSlot *slot);
extern bool OutboxInboxTakeChanged(OutboxInboxSlot *slot);
extern bool OutboxInboxTakeWake(OutboxInboxSlot *slot);
extern bool OutboxInboxIsHeld(OutboxInboxSlot *slot);
extern void OutboxInboxSetState(OutboxInboxSlot *slot, OutboxInboxState state);
extern void OutboxInboxSetError(OutboxInboxSlot *slot, const char *message);
extern void OutboxInboxReport(OutboxInboxSlot *slot, const OutboxInboxTally *t,
							  const OutboxInboxPart *parts, int nparts);

/* kafka_consumer.c: the subscription worker's librdkafka consumer */
typedef struct OutboxConsumer OutboxConsumer;

/* one message as the consumer hands it over; memory in the caller's context */
typedef struct OutboxInbound
{
	char	   *topic;
	int32		partition;
	int64		offset;
	int64		timestamp_ms;	/* -1: none */
	char	   *key;			/* NULL: no key */
	int			key_len;
	char	   *value;			/* NULL: no value (a tombstone) */
	int			value_len;
	int			nheaders;
	char	  **header_names;
	char	  **header_values;	/* NULL: a header without a value */
	int		   *header_lens;
} OutboxInbound;

/* a partition handed to the worker: offset is what it asks to start at */
typedef struct OutboxAssigned
{
	const char *topic;
	int32		partition;
	int64		offset;			/* -1: the partition's beginning */
	bool		stop;			/* the worker stopped it: assigned paused */
} OutboxAssigned;

/*
 * The worker's answer to an assignment: fill in each partition's offset
 * from the database (false: the lookup failed, assign nothing).  A
 * revocation (assigned false) only tells.  Called from inside
 * OutboxConsumerPoll, in the worker's thread, outside any transaction.
 */
typedef bool (*OutboxAssignFn) (OutboxAssigned *parts, int n, bool assigned,
								void *arg);

extern OutboxConsumer *OutboxConsumerCreate(const char *group_id,
											const char *client_id,
											char **topics, int ntopics,
											int event_fd, OutboxAssignFn assign,
											void *arg, char **errmsg);
extern int	OutboxConsumerPoll(OutboxConsumer *consumer, OutboxInbound *out,
							   int max, MemoryContext cxt);
extern bool OutboxConsumerFailed(OutboxConsumer *consumer);
extern void OutboxConsumerRewind(OutboxConsumer *consumer, const char *topic,
								 int32 partition, int64 offset);
extern void OutboxConsumerResume(OutboxConsumer *consumer, const char *topic,
								 int32 partition);
extern void OutboxConsumerCommit(OutboxConsumer *consumer, const char *topic,
								 int32 partition, int64 next_offset);
extern bool OutboxConsumerQueryLog(OutboxConsumer *consumer, const char *topic,
								   int32 partition, int timeout_ms,
								   int64 *low, int64 *high);
extern int64 OutboxConsumerQueryEnd(OutboxConsumer *consumer, const char *topic,
									int32 partition, int timeout_ms);
extern int	OutboxConsumerTakeResets(OutboxConsumer *consumer, OutboxAssigned **resets);
extern void OutboxConsumerPause(OutboxConsumer *consumer, const char *topic,
								int32 partition);
extern int64 OutboxConsumerHighWatermark(OutboxConsumer *consumer,
										 const char *topic, int32 partition);
extern bool OutboxConsumerTakeError(OutboxConsumer *consumer, char *buf, size_t len);
extern bool OutboxConsumerOutdated(const OutboxConsumer *consumer);
extern void OutboxConsumerDestroy(OutboxConsumer *consumer, int timeout_ms);

/* consumer_range.c: a partition whose log does not hold the group's next offset */
typedef struct OutboxLogRange
{
	int64		low;			/* the first offset the log holds */
	int64		high;			/* the offset its next message gets */
} OutboxLogRange;

extern bool OutboxOffsetOutsideLog(OutboxConsumer *consumer, const char *topic,
								   int32 partition, int64 next_offset,
								   int timeout_ms, OutboxLogRange *range);
extern void OutboxReportStoppedPartition(OutboxInboxSlot *slot,
										 const char *subscription,
										 const char *topic, int32 partition,
										 int64 next_offset,
										 const OutboxLogRange *range);

/* subscribe_handler.c: what makes a function a handler, for subscribe() and the worker */
extern Oid	OutboxHandlerByName(const char *text);
extern bool OutboxCheckHandler(Oid func, Oid typid, Oid *owner, char **problem);
extern bool OutboxRoleMayExecute(Oid role, Oid func);
extern Oid	OutboxInboundType(void);

/* subscribe.c: SQL run with the extension owner's rights, search_path pinned */
typedef struct OutboxAsOwner
{
	Oid			user;
	int			sec;
	int			nestlevel;
} OutboxAsOwner;

extern void OutboxAsOwnerBegin(OutboxAsOwner *save);
extern void OutboxAsOwnerEnd(OutboxAsOwner *save);
extern void OutboxSubscriptionsAnnounce(void);

/* consumer.c: the subscription worker (its other files share consumer_worker.h) */
PGDLLEXPORT void OutboxConsumerMain(Datum main_arg);

/* spi_exec.c: one of the extension's own statements, its result checked */
extern void OutboxSpiExec(const char *sql, int nargs, Oid *types, Datum *values,
						  const char *nulls, bool read_only, long count,
						  int expected, const char *what);
extern void OutboxSpiExecText(const char *sql, const char *arg, bool read_only,
							  long count, int expected, const char *what);

/* worker.c: the start-up the relay and the subscription worker share */
extern WaitEventSet *OutboxWorkerStart(MemoryContext cxt, int event_pipe[2],
									   const char *what);

/* launcher.c: the launcher, over launcher_relays.c and launcher_consumers.c */
#define OUTBOX_RESTART_DELAY_MS		1000	/* before a stopped worker starts again */
#define OUTBOX_NO_WORKER_RETRY_MS	5000	/* after no background worker slot was free */
#define OUTBOX_RESCAN_INTERVAL_MS	10000	/* pg_database is read again after */

extern void OutboxLauncherRegisterStatic(void);
PGDLLEXPORT void OutboxLauncherMain(Datum main_arg);

/* launcher_consumers.c: the launcher's subscription workers */
extern bool OutboxConsumersReap(TimestampTz now, TimestampTz *retry_at);
extern long OutboxConsumersSupervise(long sleep, bool relays_wait, bool relay_refused);

/* launcher_relays.c: the launcher's relays and probes, by database */
extern bool OutboxLauncherKnowsDatabase(Oid dboid);
extern void OutboxLauncherDatabaseName(Oid dboid, char *buf, size_t len);
extern void OutboxRelaysRescan(void);
extern void OutboxRelaysRequested(Oid dboid);
extern long OutboxRelaysSupervise(bool *relays_wait, bool *refused);
extern void OutboxRelaysRetry(TimestampTz when);

/* utility.c: runs in user backends */
extern void OutboxUtilityHookInstall(void);
extern void OutboxNotePrepared(int events, bool replay);

/* probe.c */
PGDLLEXPORT void OutboxProbeMain(Datum main_arg);

/* relay.c */
PGDLLEXPORT void OutboxRelayMain(Datum main_arg);

#endif							/* OUTBOX_H */
