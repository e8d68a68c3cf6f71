/*-------------------------------------------------------------------------
 *
 * kafka/kafka_client.h
 *		The producer as producer.c (its lifecycle, sends and callbacks) and
 *		kafka_topic.c (the topics it met: partitions and partitioner) share
 *		it; kafka_consumer.c (the subscription workers' consumer) builds on
 *		producer.c's settings; kafka_txn.c (exactly_once) makes the
 *		producer's transactions.  Only these four files include rdkafka.h.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_KAFKA_CLIENT_H
#define OUTBOX_KAFKA_CLIENT_H

#include <librdkafka/rdkafka.h>

#include "kafka/kafka.h"

/* a key's partition, as librdkafka's partitioners compute it */
typedef int32_t (*OutboxPartitioner) (const rd_kafka_topic_t *rkt,
									  const void *key, size_t keylen,
									  int32_t partition_cnt,
									  void *rkt_opaque, void *msg_opaque);

/* a topic the producer met: its handle and partition count */
typedef struct OutboxTopicMemo
{
	rd_kafka_topic_t *rkt;
	int32		partitions;		/* -1: not known (no metadata yet) */
	TimestampTz counted_at;		/* when partitions was last learnt */
	bool		recount;		/* learn partitions again when next met */
} OutboxTopicMemo;

struct OutboxProducer
{
	rd_kafka_t *rk;
	int			pending;		/* produced, delivery report not yet served
								 * (probes left out) */
	char		error[256];		/* last error/log line worth reporting */
	int			error_count;	/* errors since the relay last took one */
	int			fatal_count;	/* of which of the fatal class (authentication, SSL) */
	int			brokers_up;		/* from the last statistics, -1 unknown */
	bool		all_down;		/* librdkafka said every broker is down, and
								 * nothing was acknowledged since */
	int			ntopics;		/* topics met, at most TOPIC_CACHE_MAX */
	OutboxTopicMemo *topics;
	TimestampTz metadata_paused_until;	/* no metadata fetch before */
	OutboxPartitioner partitioner;	/* the configured one; NULL: unknown */
	char	   *built_brokers;	/* the settings it was built from (malloc'd) */
	char	   *built_config;
	char	   *built_secrets;
	char	   *built_txn_id;	/* transactional.id; NULL: not transactional */
	bool		txn_failed;		/* librdkafka failed the open transaction: it
								 * must be aborted (kafka_txn.c) */
};

/* producer.c, for kafka_consumer.c */
extern rd_kafka_conf_t *OutboxKafkaClientConf(const char *const (*defaults)[2],
											   int ndefaults, char **errmsg);

/* kafka_topic.c */
extern void OutboxKafkaChoosePartitioner(OutboxProducer *producer,
										 rd_kafka_conf_t *conf);
extern void OutboxKafkaForgetTopics(OutboxProducer *producer);

#endif							/* OUTBOX_KAFKA_CLIENT_H */
