/*-------------------------------------------------------------------------
 *
 * outbox.h
 *		Declarations shared by the files of the outbox extension.
 *
 * Invariants: only kafka.c includes rdkafka.h, so nothing here mentions a
 * librdkafka type; the producer is an opaque OutboxProducer.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_H
#define OUTBOX_H

#include "postgres.h"

#include "datatype/timestamp.h"
#include "lib/stringinfo.h"
#include "nodes/pg_list.h"
#include "storage/latch.h"
#include "storage/spin.h"
#include "utils/snapshot.h"

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
#define OUTBOX_MAX_DATABASES_DEFAULT 16
#define OUTBOX_MAX_DATABASES_MAX	1024

#define OUTBOX_BACKOFF_MIN_DEFAULT	100
#define OUTBOX_BACKOFF_MAX_DEFAULT	30000
#define OUTBOX_BACKOFF_LIMIT		3600000
#define OUTBOX_MAX_ATTEMPTS_DEFAULT 5
#define OUTBOX_DELIVERY_TIMEOUT_DEFAULT 30000
#define OUTBOX_MAX_ATTEMPTS_LIMIT	1000
#define OUTBOX_RETENTION_DEFAULT	(7 * 24 * 3600)

#define OUTBOX_TOPIC_MAX_LEN		249

/* caller headers of one event (emit.c): how many, and bytes of names+values */
#define OUTBOX_CALLER_HEADERS_MAX	64
#define OUTBOX_CALLER_HEADER_BYTES_MAX (16 * 1024)

/* librdkafka's message.max.bytes when outbox.kafka_config leaves it unset */
#define OUTBOX_KAFKA_MESSAGE_MAX_DEFAULT 1000000

/*
 * The Kafka headers the relay writes itself, in the order it writes them
 * (kafka.c), before the caller's.  emit() refuses caller headers of these
 * names (emit.c): a reader taking the last header of a name would see the
 * caller's.  Names are in OutboxHeaderNames; add a new one here and there.
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
extern int	outbox_max_databases;
extern int	outbox_retry_backoff_min;
extern int	outbox_retry_backoff_max;
extern int	outbox_max_attempts;
extern int	outbox_poison_policy;
extern int	outbox_retention;
extern int	outbox_delivery_timeout;

/* emit.c */
extern bool OutboxTopicNameIsLegal(const char *name, int len);
extern bool OutboxTraceparentIsValid(const char *value);
extern bool OutboxTopicTemplateIsValid(const char *tmpl, char **bad);
extern bool OutboxTopicPatternsAreValid(const char *patterns, char **bad);
extern void OutboxEmitInit(void);

/* shmem.c */
typedef enum OutboxRelayState
{
	OUTBOX_RELAY_STARTING = 0,
	OUTBOX_RELAY_IDLE,
	OUTBOX_RELAY_PUBLISHING,
	OUTBOX_RELAY_PAUSED,
	OUTBOX_RELAY_BACKING_OFF,
	OUTBOX_RELAY_NOT_CONFIGURED,
	OUTBOX_RELAY_STOPPED
} OutboxRelayState;

/* publish latency histogram: upper bounds in microseconds, then +Inf */
#define OUTBOX_LAT_NBUCKETS 19
extern const int64 OutboxLatencyBounds[OUTBOX_LAT_NBUCKETS - 1];

/* the recent window: OUTBOX_WINDOWS periods of OUTBOX_WINDOW_SECS */
#define OUTBOX_WINDOWS		6
#define OUTBOX_WINDOW_SECS	10

typedef struct OutboxWindow
{
	int64		period;			/* which period this entry holds */
	uint64		events;
	uint64		bytes;
	uint64		latency[OUTBOX_LAT_NBUCKETS];
} OutboxWindow;

/*
 * One relay's slot.  dboid changes only under the outbox LWLock held
 * exclusively; every other field is read and written under mutex.
 */
typedef struct OutboxSlot
{
	Oid			dboid;			/* InvalidOid: slot free */
	slock_t		mutex;
	int			pid;			/* 0 when no relay runs */
	Latch	   *latch;			/* the relay's latch, NULL when none */
	OutboxRelayState state;
	bool		no_extension;	/* last relay found no extension */
	bool		replay_pending; /* a commit queued replays */
	bool		check_extension;	/* DROP EXTENSION committed */
	TimestampTz hold_until;		/* launcher must not start a relay before */
	TimestampTz started_at;

	/* backlog: the open batch's remainder plus what committed since */
	uint64		committed_events;	/* added by emitters at commit */
	uint64		committed_at_open;
	int64		batch_remaining;
	TimestampTz oldest_pending; /* created_at of the oldest undelivered, or 0 */
	int			page_size;		/* events in the page in hand */
	int			brokers_up;		/* -1: unknown */

	uint64		published;
	uint64		published_bytes;
	uint64		pages;
	uint64		batches;
	uint64		retries;		/* events sent again after a failure */
	uint64		failures[4];	/* by OutboxErrorClass */
	TimestampTz last_delivery;
	TimestampTz last_error_at;
	char		last_error[256];
	uint64		latency[OUTBOX_LAT_NBUCKETS];	/* since the relay started */
	double		latency_sum;	/* seconds */
	OutboxWindow window[OUTBOX_WINDOWS];
} OutboxSlot;

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

extern void OutboxSlotReportRound(OutboxSlot *slot, const OutboxRoundReport *report);

extern void OutboxShmemInstallHooks(void);
extern bool OutboxShmemAvailable(void);
extern void OutboxWakeRelay(Oid dboid, bool replay, int events);
extern bool OutboxSlotTakeReplayPending(OutboxSlot *slot);
extern void OutboxRequestExtensionCheck(Oid dboid);
extern bool OutboxSlotTakeExtensionCheck(OutboxSlot *slot);
extern void OutboxRequestProbe(Oid dboid);
extern bool OutboxLauncherAttach(void);
extern int	OutboxLauncherTakeRequests(Oid *out, int max);
extern OutboxSlot *OutboxSlotAcquire(Oid dboid);
extern void OutboxSlotRelease(Oid dboid);
extern OutboxSlot *OutboxSlotFind(Oid dboid);
extern OutboxSlot *OutboxSlotAttach(Oid dboid, int *other_pid);
extern void OutboxSlotDetach(OutboxSlot *slot);
extern int	OutboxSlotRelayPid(OutboxSlot *slot);
extern int	OutboxSlotsInUse(void);
extern void OutboxSetNoWorker(bool short_of_workers);
extern TimestampTz OutboxNoWorkerSince(void);

/* probe workers: does a database have the extension? */
#define OUTBOX_MAX_PROBES			64
#define OUTBOX_PROBE_UNKNOWN		0
#define OUTBOX_PROBE_EXTENSION		1
#define OUTBOX_PROBE_NO_EXTENSION	2
extern bool OutboxProbeBegin(Oid dboid);
extern void OutboxProbeReport(Oid dboid, bool has_extension);
extern int	OutboxProbeTake(Oid dboid);

/* prepared transactions that emitted events */
extern void OutboxPreparedRemember(const char *gid, Oid dboid, int events,
								   bool replay);
extern bool OutboxPreparedTake(const char *gid, Oid dboid, int *events,
							   bool *replay);
extern void OutboxSlotSetState(OutboxSlot *slot, OutboxRelayState state);
extern void OutboxHoldDatabase(Oid dboid, int hold_ms);
extern bool OutboxSlotIsHeld(OutboxSlot *slot);
extern void OutboxSlotMarkNoExtension(OutboxSlot *slot);
extern void OutboxSlotCountPage(OutboxSlot *slot);
extern void OutboxTallyAdd(OutboxDeliveryTally *tally, int64 latency_us, int bytes);
extern void OutboxSlotCountDelivered(OutboxSlot *slot, const OutboxDeliveryTally *tally);
extern void OutboxSlotSetBacklog(OutboxSlot *slot, bool batch_opened, int64 remaining,
								 TimestampTz oldest, int page_size);
extern void OutboxSlotCountBatchDelivered(OutboxSlot *slot, int64 events);
extern void OutboxSlotCountRetries(OutboxSlot *slot, int events);
extern void OutboxSlotSetBrokersUp(OutboxSlot *slot, int up);
extern void OutboxSlotCountError(OutboxSlot *slot, const char *message);
extern void OutboxSlotCountFailure(OutboxSlot *slot, OutboxErrorClass c);
extern const char *OutboxRelayStateName(OutboxRelayState state);

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
	bool		dead_letter;
} OutboxEvent;

#define OUTBOX_EVENT_PENDING		0
#define OUTBOX_EVENT_DELIVERED		1
#define OUTBOX_EVENT_QUARANTINED	2
#define OUTBOX_EVENT_PARKED			3

/* message.c */
extern void OutboxEventHeaderValues(const OutboxEvent *event, const char **values,
									char num[2][32]);
extern size_t OutboxEventWireSize(const OutboxEvent *event, size_t *headers_size);

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
extern OutboxProducer *OutboxProducerCreate(char **errmsg);
extern bool OutboxProducerOutdated(const OutboxProducer *producer);
extern void OutboxProducerDestroy(OutboxProducer *producer);
extern int	OutboxProducerEventFd(OutboxProducer *producer);
extern void OutboxProducerSend(OutboxProducer *producer, OutboxEvent *event);
extern int	OutboxProducerServe(OutboxProducer *producer);
extern int	OutboxProducerBrokersUp(OutboxProducer *producer);
extern void OutboxProducerPurge(OutboxProducer *producer);
extern bool OutboxProducerTakeError(OutboxProducer *producer, char *buf,
									size_t len, int *count, int *fatal);
extern bool OutboxProducerIsFatal(OutboxProducer *producer, char *buf, size_t len);
extern const char *OutboxDeliveryErrorName(int err);
extern const char *OutboxDeliveryErrorText(int err, bool local);
extern const char *OutboxErrorClassName(OutboxErrorClass c);

/* store.c */

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
} OutboxBatch;

extern bool OutboxStoreExtensionPresent(void);
extern void OutboxStoreLoadProgress(OutboxBatch *batch, MemoryContext cxt);
extern int64 OutboxStoreAdoptRestored(bool force);
extern bool OutboxStoreOpenBatch(OutboxBatch *batch, MemoryContext cxt);
extern int	OutboxStoreReadPage(OutboxBatch *batch, int limit, int max_bytes,
								OutboxEvent **events, MemoryContext cxt,
								bool *cut);
extern void OutboxStoreSavePage(const char *cur, int64 last_id,
								int count, bool batch_done);
extern int	OutboxStoreRecordDeadLetters(OutboxEvent *events, int n);
extern List *OutboxStoreLoadBlocked(MemoryContext cxt);
extern int	OutboxStoreReadReplays(int limit, OutboxEvent **events,
								   MemoryContext cxt);
extern void OutboxStoreFinishReplays(OutboxEvent *events, int n);
extern int64 OutboxStoreCleanup(int max_events);

/* an aggregate whose events wait behind a quarantined one */
typedef struct OutboxBlocked
{
	char	   *aggregate_type;
	char	   *aggregate_id;
	char	   *head;			/* event id of the quarantined event */
} OutboxBlocked;

/* launcher.c */
extern void OutboxLauncherRegisterStatic(void);
extern void OutboxUtilityHookInstall(void);
extern void OutboxNotePrepared(int events, bool replay);
PGDLLEXPORT void OutboxLauncherMain(Datum main_arg);

/* probe.c */
PGDLLEXPORT void OutboxProbeMain(Datum main_arg);

/* relay.c */
PGDLLEXPORT void OutboxRelayMain(Datum main_arg);

#endif							/* OUTBOX_H */
