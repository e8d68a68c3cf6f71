/*-------------------------------------------------------------------------
 *
 * kafka/kafka.h
 *		Kafka as the rest of the extension sees it: the producer and the
 *		consumer (opaque), the message an event becomes, the settings rules.
 *
 * What the kafka room offers to the rooms above it; a file includes only
 * the headers of rooms below its own (docs/design.md).
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_KAFKA_H
#define OUTBOX_KAFKA_H

#include "postgres.h"

#include "base/base.h"

/* producer.c */
typedef struct OutboxProducer OutboxProducer;

#define OUTBOX_DELIVERY_PENDING (-100000)

/*
 * One event as the relay publishes it.  Strings are NUL-terminated and
 * owned by the relay's page memory context.  producer.c writes the outcome
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
	char	   *payload;		/* the value: JSON text or bytes; NULL for a
								 * tombstone */
	int			payload_len;
	int			payload_kind;	/* OUTBOX_PAYLOAD_* */
	char	   *content_type;	/* emit_binary()'s; NULL when none */
	bool		has_seq;
	int64		seq;
	int32		schema_version;
	char	   *occurred_at;
	int64		timestamp_ms;	/* the record's CreateTime: occurred_at in ms
								 * since 1970; 0 (before it): the send time */
	char	   *tenant;			/* NULL when unset */
	char	   *traceparent;	/* NULL when unset */
	int			nheaders;
	char	  **header_names;
	char	  **header_values;
	TimestampTz created_at;
	int			delivery_err;

	/*
	 * The lengths of key and of the relay's header values taken from the
	 * row (OUTBOX_HEADER_*; -1 for the others: seq, schema_version,
	 * origin), as the row that was read had them, so that sending and
	 * weighing the event need not count them.  Only when lens_known: an
	 * event built otherwise (zeroed) has them counted where needed.
	 */
	bool		lens_known;
	int			key_len;
	int			text_lens[OUTBOX_NUM_HEADERS];

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
	char	   *error_text;		/* the refusal when no delivery error says it
								 * (class schema); NULL otherwise */

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
	bool		probe;			/* sent alone for a held partition: producer.c
								 * leaves it out of the pending count */
	bool		was_held;		/* read from outbox.held */
	bool		in_flight;		/* produced, its delivery report not served */
	bool		dead_recorded;	/* exactly_once: its dead letter is written
								 * already, before the page's transaction */
} OutboxEvent;

/* the length of ev's key, counted only when not known */
#define OutboxEventKeyLength(ev) \
	((ev)->lens_known ? (size_t) (ev)->key_len : strlen((ev)->key))

/* what an event's value is (OutboxEvent.payload_kind) */
#define OUTBOX_PAYLOAD_JSON			0	/* emit(): JSON text */
#define OUTBOX_PAYLOAD_BYTES		1	/* emit_binary(): bytes, sent unchanged */
#define OUTBOX_PAYLOAD_NONE			2	/* emit_tombstone(): a null value */

#define OUTBOX_PARTITION_UNSET		(-2)
#define OUTBOX_PARTITION_UNKNOWN	(-1)

#define OUTBOX_EVENT_PENDING		0
#define OUTBOX_EVENT_DELIVERED		1
#define OUTBOX_EVENT_QUARANTINED	2
#define OUTBOX_EVENT_PARKED			3
#define OUTBOX_EVENT_HELD			4	/* its partition is held: recorded in
										 * outbox.held, not sent */

/*
 * An event's message under outbox.message_format (message_ce.c): its value,
 * and the headers the format adds after the relay's own
 */
#define OUTBOX_SHAPE_MAX_HEADERS 12
typedef struct OutboxMessageShape
{
	const char *value;
	size_t		value_len;
	int			nextra;
	const char *extra_names[OUTBOX_SHAPE_MAX_HEADERS];
	const char *extra_values[OUTBOX_SHAPE_MAX_HEADERS];
	const char *source;			/* the CloudEvents source */
	char		source_buf[64];
	char		seq[32];
	char	   *envelope;		/* structured mode's value (palloc'd) */
} OutboxMessageShape;

extern void OutboxEventShape(const OutboxEvent *ev, OutboxMessageShape *shape,
							 bool with_data);
extern bool OutboxEventShapeFits(const OutboxEvent *ev);
extern void OutboxEventShapeFree(OutboxMessageShape *shape);

/* message.c */
extern const int OutboxHeaderNameLengths[OUTBOX_NUM_HEADERS];
extern void OutboxEventHeaderValues(const OutboxEvent *event, const char **values,
									int *lens, char num[2][32]);
extern size_t OutboxEventWireSize(const OutboxEvent *event, size_t *headers_size,
								  size_t *value_size);
extern const char *OutboxOrigin(void);
extern void OutboxSetOrigin(const char *value);

/* the origin header's value: a UUID's text (message.c) */
#define OUTBOX_ORIGIN_MAX 36
extern void OutboxCheckHeaderName(const char *name);
extern bool OutboxHeaderIsCloudEvents(const char *name);

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
	Jsonb	   *payload;		/* emit()'s; NULL for the others */
	bytea	   *payload_bytes;	/* emit_binary()'s, framed; NULL otherwise */
	text	   *content_type;	/* emit_binary()'s; NULL: none */
	int			arg_shift;		/* added to argument numbers from 4 on:
								 * emit_tombstone() has no payload */
	Jsonb	   *headers;		/* NULL: none */
	char	   *topic;
	text	   *key;			/* the aggregate id when none was given */
	pg_uuid_t  *event_id;
	bool		event_id_given;	/* by the caller, not drawn by emit() */
	TimestampTz occurred_at;
	OutboxEvent event;
} OutboxEmitRow;

/*
 * kafka_settings.c: the rules producer.c applies to librdkafka's settings,
 * and those outbox.kafka_config's check hook adds
 */
typedef bool (*OutboxKafkaJudge) (const char *name, const char *value,
								  const char *where, char **detail, void *arg);

/* a subscription's session.timeout.ms unless outbox.kafka_config sets it */
#define OUTBOX_KAFKA_SESSION_TIMEOUT_MS 10000

/* the secrets file's entry of the schema registry's user:password */
#define OUTBOX_REGISTRY_AUTH_PROPERTY "schema.registry.basic.auth.user.info"

extern bool OutboxKafkaPropertyIsSecret(const char *name);
extern char *OutboxKafkaSecretValue(const char *text, const char *name);
extern const char *OutboxKafkaSecretsText(void);
extern const char *OutboxKafkaPropertyRefusal(const char *name, const char *value,
											  bool from_secrets, bool *by_value);
extern bool OutboxKafkaConfigConflict(const char *text, char **detail, char **hint);
extern bool OutboxKafkaSplitProperty(char *item, char **name, char **value);
extern char *OutboxKafkaReadSecretsText(const char *path, OutboxKafkaJudge judge,
										void *arg, char **errmsg);

/* producer.c */
extern bool OutboxKafkaCheckConfig(const char *conf, char **detail, char **hint);
extern int	OutboxKafkaMessageMaxBytes(const char *conf);
extern bool OutboxKafkaCheckSecretsFile(const char *path, char **detail);
extern void OutboxKafkaReadSecretsFile(MemoryContext parent);
extern OutboxProducer *OutboxProducerCreate(int event_fd, const char *transactional_id,
											char **errmsg);
extern const char *OutboxProducerTransactionalId(const OutboxProducer *producer);
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
extern void OutboxProducerSendNow(OutboxProducer *producer);
extern void OutboxProducerPurge(OutboxProducer *producer);
extern bool OutboxProducerTakeError(OutboxProducer *producer, char *buf,
									size_t len, int *count, int *fatal);
extern bool OutboxProducerIsFatal(OutboxProducer *producer, char *buf, size_t len);

/* kafka_topic.c: what the relay says of librdkafka and its delivery errors */
extern const char *OutboxKafkaKnownCrash(void);
extern const char *OutboxDeliveryErrorName(int err);
extern const char *OutboxDeliveryErrorText(int err, bool local);

/* message.c */
extern const char *OutboxErrorClassName(OutboxErrorClass c);

/* kafka_txn.c: Kafka transactions and the progress record (exactly_once) */
/*
 * A transaction's bound at the coordinator (transaction.timeout.ms): 60 s,
 * or four times outbox.delivery_timeout, at most the brokers' default
 * transaction.max.timeout.ms
 */
#define OUTBOX_TXN_TIMEOUT_MS		60000
#define OUTBOX_TXN_TIMEOUT_MAX_MS	900000

typedef enum OutboxTxnResult
{
	OUTBOX_TXN_OK,
	OUTBOX_TXN_RETRY,			/* timed out or retriable: call again */
	OUTBOX_TXN_ABORT,			/* abort the transaction, send again */
	OUTBOX_TXN_FENCED,			/* a newer producer has the transactional.id */
	OUTBOX_TXN_FATAL			/* destroy the producer, build another */
} OutboxTxnResult;

extern bool OutboxProducerFenced(OutboxProducer *producer);
extern OutboxTxnResult OutboxProducerInitTxn(OutboxProducer *producer, int timeout_ms,
											 char *buf, size_t len);
extern OutboxTxnResult OutboxProducerBeginTxn(OutboxProducer *producer, char *buf,
											  size_t len);
extern bool OutboxProducerTxnFailed(OutboxProducer *producer);
extern OutboxTxnResult OutboxProducerCommitTxn(OutboxProducer *producer, int timeout_ms,
											   char *buf, size_t len);
extern OutboxTxnResult OutboxProducerAbortTxn(OutboxProducer *producer, int timeout_ms,
											  char *buf, size_t len);
extern void OutboxProducerSendMarker(OutboxProducer *producer, const char *topic,
									 const char *key, const char *value,
									 OutboxEvent *track);
extern bool OutboxProducerEnsureProgressTopic(OutboxProducer *producer, const char *topic,
											  bool *refused, char **errmsg);
extern int	OutboxKafkaReadMarker(const char *topic, const char *key, char **value,
								  int timeout_ms, char **errmsg);

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
extern bool OutboxConsumerJoined(const OutboxConsumer *consumer);
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

#endif							/* OUTBOX_KAFKA_H */
