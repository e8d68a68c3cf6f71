/*-------------------------------------------------------------------------
 *
 * kafka/kafka_topic.c
 *		The topics a producer met: their handles, partition counts, and the
 *		partition of each event, computed by the relay itself with the
 *		configured partitioner so that it knows an event's partition before
 *		sending it (a held partition's events are not sent: relay_hold.c);
 *		and what the relay says of a delivery error.
 *
 * Invariants:
 *	- An event's partition is what librdkafka would choose for its key:
 *	  the same partitioner function (the configured one, murmur2_random by
 *	  default, Java's), over the partition count of the topic's metadata,
 *	  or over the count the caller gives (a topic with held partitions
 *	  keeps the count it had: relay_hold.c).  The event records the count.
 *	  Every key is non-empty (emit() refuses an empty one), so the *_random
 *	  partitioners never draw at random here.
 *	- A topic's partitions are learnt from one bounded metadata fetch when
 *	  the producer first meets it, and again when it is met after
 *	  OutboxProducerRecountTopics found it counted TOPIC_RECOUNT_MS ago
 *	  (topics gain partitions).  The relay calls that only before a page's
 *	  first round, so the events of one topic in one page share one count.
 *	  Unknown (the fetch failed, or the topic does not exist yet) gives
 *	  OUTBOX_PARTITION_UNKNOWN, and librdkafka chooses.
 *	- After a fetch fails (brokers down or slow) none is tried for
 *	  TOPIC_METADATA_PAUSE_MS, so that a page of thousands of new topics
 *	  costs at most one timeout, not one per topic; the relay checks for
 *	  shutdown between events.  At most TOPIC_CACHE_MAX topics are
 *	  remembered; a full cache is emptied and starts over.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "utils/timestamp.h"

#include "base/compat.h"
#include "kafka/kafka_client.h"
#include "kafka/kafka.h"

#define TOPIC_METADATA_TIMEOUT_MS 250
#define TOPIC_METADATA_PAUSE_MS 5000
#define TOPIC_RECOUNT_MS		(5 * 60 * 1000)
#define TOPIC_RETRY_MS			5000	/* partitions still unknown */
#define TOPIC_CACHE_MAX 1024

/*
 * OutboxKafkaChoosePartitioner
 *		Remember the function of conf's partitioner (before rd_kafka_new
 *		takes conf).  "random" is refused by outbox.kafka_config; anything
 *		else unknown leaves partitions to librdkafka.
 */
void
OutboxKafkaChoosePartitioner(OutboxProducer *producer, rd_kafka_conf_t *conf)
{
	static const struct
	{
		const char *name;
		OutboxPartitioner fn;
	}			known[] = {
		{"murmur2_random", rd_kafka_msg_partitioner_murmur2_random},
		{"murmur2", rd_kafka_msg_partitioner_murmur2},
		{"consistent_random", rd_kafka_msg_partitioner_consistent_random},
		{"consistent", rd_kafka_msg_partitioner_consistent},
		{"fnv1a_random", rd_kafka_msg_partitioner_fnv1a_random},
		{"fnv1a", rd_kafka_msg_partitioner_fnv1a},
	};
	char		name[64];
	size_t		size = sizeof(name);
	int			i;

	producer->partitioner = NULL;
	if (rd_kafka_conf_get(conf, "partitioner", name, &size) != RD_KAFKA_CONF_OK)
		return;
	for (i = 0; i < lengthof(known); i++)
		if (strcmp(name, known[i].name) == 0)
			producer->partitioner = known[i].fn;
}

void
OutboxKafkaForgetTopics(OutboxProducer *producer)
{
	int			i;

	/* librdkafka keeps a topic its queued messages still need */
	for (i = 0; i < producer->ntopics; i++)
		rd_kafka_topic_destroy(producer->topics[i].rkt);
	producer->ntopics = 0;
}

/*
 * count_partitions
 *		Learn memo's partition count from one bounded metadata fetch, unless
 *		fetches are paused.  librdkafka 2.0 otherwise finds a new topic's
 *		partitions only at its next periodic scan, up to a second later, and
 *		every message for it waits.
 */
static void
count_partitions(OutboxProducer *producer, OutboxTopicMemo *memo)
{
	const struct rd_kafka_metadata *md;
	TimestampTz now = GetCurrentTimestamp();

	if (now < producer->metadata_paused_until)
		return;
	memo->counted_at = now;
	if (rd_kafka_metadata(producer->rk, 0, memo->rkt, &md, TOPIC_METADATA_TIMEOUT_MS) !=
		RD_KAFKA_RESP_ERR_NO_ERROR)
	{
		/* harmless: librdkafka's periodic scan finds the topic later */
		producer->metadata_paused_until =
			TimestampTzPlusMilliseconds(GetCurrentTimestamp(), TOPIC_METADATA_PAUSE_MS);
		return;
	}
	if (md->topic_cnt == 1 && md->topics[0].err == RD_KAFKA_RESP_ERR_NO_ERROR &&
		md->topics[0].partition_cnt > 0)
		memo->partitions = md->topics[0].partition_cnt;
	rd_kafka_metadata_destroy(md);
}

/* the memo of topic, made (and its partitions counted) at the first meeting */
static OutboxTopicMemo *
find_topic(OutboxProducer *producer, const char *topic)
{
	OutboxTopicMemo *memo;
	rd_kafka_topic_t *rkt;
	int			i;

	/* a page is mostly one topic: the last one met is looked at first */
	for (i = producer->ntopics - 1; i >= 0; i--)
		if (strcmp(rd_kafka_topic_name(producer->topics[i].rkt), topic) == 0)
			return &producer->topics[i];
	if (producer->topics == NULL)
	{
		producer->topics = malloc(sizeof(OutboxTopicMemo) * TOPIC_CACHE_MAX);
		if (producer->topics == NULL)
			return NULL;
	}
	if (producer->ntopics >= TOPIC_CACHE_MAX)
		OutboxKafkaForgetTopics(producer);
	rkt = rd_kafka_topic_new(producer->rk, topic, NULL);
	if (rkt == NULL)
		return NULL;
	memo = &producer->topics[producer->ntopics++];
	memo->rkt = rkt;
	memo->partitions = -1;
	memo->counted_at = 0;
	memo->recount = false;
	count_partitions(producer, memo);
	return memo;
}

/*
 * OutboxProducerRecountTopics
 *		A page is about to have its partitions computed: the topics counted
 *		TOPIC_RECOUNT_MS ago are counted again when next met.
 */
void
OutboxProducerRecountTopics(OutboxProducer *producer)
{
	TimestampTz now = GetCurrentTimestamp();
	int			i;

	for (i = 0; i < producer->ntopics; i++)
		if (producer->topics[i].partitions > 0 &&
			TimestampDifferenceExceeds(producer->topics[i].counted_at, now, TOPIC_RECOUNT_MS))
			producer->topics[i].recount = true;
}

/*
 * OutboxProducerTopicPartitions
 *		The partition count the producer learnt for topic, -1 when unknown.
 */
int32
OutboxProducerTopicPartitions(OutboxProducer *producer, const char *topic)
{
	OutboxTopicMemo *memo = find_topic(producer, topic);

	return memo == NULL ? -1 : memo->partitions;
}

/*
 * OutboxProducerPartition
 *		The partition event goes to, among partitions when it is positive,
 *		else among the topic's partitions as learnt; also set in
 *		event->partition, and the count in event->partition_count.
 *		OUTBOX_PARTITION_UNKNOWN (count 0) when the count or the
 *		partitioner is unknown.
 */
int32
OutboxProducerPartition(OutboxProducer *producer, OutboxEvent *event, int32 partitions)
{
	OutboxTopicMemo *memo = find_topic(producer, event->topic);

	event->partition = OUTBOX_PARTITION_UNKNOWN;
	event->partition_count = 0;
	if (memo == NULL || producer->partitioner == NULL)
		return event->partition;
	if (memo->recount)
	{
		/* at the topic's first event of a page, or at the next page */
		memo->recount = false;
		count_partitions(producer, memo);
	}
	else if (memo->partitions < 0 &&
			 TimestampDifferenceExceeds(memo->counted_at, GetCurrentTimestamp(), TOPIC_RETRY_MS))
		count_partitions(producer, memo);
	if (partitions <= 0)
		partitions = memo->partitions;
	if (partitions > 0)
	{
		event->partition = producer->partitioner(memo->rkt, event->key,
												 OutboxEventKeyLength(event),
												 partitions, NULL, NULL);
		event->partition_count = partitions;
	}
	return event->partition;
}

/*
 * OutboxKafkaKnownCrash
 *		The loaded librdkafka's version when it is one known to crash on
 *		some brokers' topic errors (compat.h, 2.1), else NULL.
 */
const char *
OutboxKafkaKnownCrash(void)
{
	return OutboxRdkafkaKnownCrash();
}

const char *
OutboxDeliveryErrorName(int err)
{
	return rd_kafka_err2name((rd_kafka_resp_err_t) err);
}

/*
 * OutboxDeliveryErrorText
 *		What a quarantine records and logs of err: its name; for a refusal
 *		by timestamp, why; for a refusal by size, who refused: librdkafka
 *		itself when producev returned the error (local), else a broker,
 *		whose answer came in the delivery report.  The fix differs: the producer's message.max.bytes
 *		or the broker's and topic's limits.  Returns a static buffer.
 */
const char *
OutboxDeliveryErrorText(int err, bool local)
{
	static char text[200];
	const char *name = rd_kafka_err2name((rd_kafka_resp_err_t) err);

	switch ((rd_kafka_resp_err_t) err)
	{
		case RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE:
		case RD_KAFKA_RESP_ERR_INVALID_MSG_SIZE:
			if (local)
				snprintf(text, sizeof(text),
						 "%s: refused by the client: message larger than message.max.bytes",
						 name);
			else
				snprintf(text, sizeof(text),
						 "%s: refused by the broker: message larger than its message.max.bytes "
						 "or the topic's max.message.bytes", name);
			return text;
		case RD_KAFKA_RESP_ERR_INVALID_TIMESTAMP:
			snprintf(text, sizeof(text),
					 "%s: refused by the broker: the record timestamp is further from its clock "
					 "than its message.timestamp.before.max.ms or after.max.ms, even the send time", name);
			return text;
		default:
			return name;
	}
}
