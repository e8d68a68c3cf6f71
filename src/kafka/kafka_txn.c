/*-------------------------------------------------------------------------
 *
 * kafka/kafka_txn.c
 *		Kafka transactions for outbox.delivery = 'exactly_once': the
 *		transactional producer's calls, the progress record each
 *		transaction carries, the progress topic checked or created, and
 *		the last committed progress record read back.
 *
 * Invariants:
 *	- Every librdkafka call that blocks is given a bound by the caller
 *	  (init, commit and abort are resumable: called again after a timeout
 *	  they go on where they were), so the relay looks at shutdown between
 *	  two slices.
 *	- An outcome is one of OutboxTxnResult, from librdkafka's own flags on
 *	  the error: fenced (another producer with the same transactional.id
 *	  took over: stop, never rebuild in a loop), fatal (rebuild), abortable
 *	  (abort, send the page again), retriable (call again).
 *	- The progress record is read with isolation.level=read_committed by
 *	  a consumer of its own that assigns itself the partitions (so joins
 *	  no group) and commits nothing; what
 *	  it returns is the text of the last record with the relay's key, which
 *	  the relay parses as hostile input (relay_txn.c).
 *	- The progress record is produced like an event (a delivery report in
 *	  its OutboxEvent, counted among the producer's pending messages).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <librdkafka/rdkafka.h>

#include "postmaster/interrupt.h"
#include "utils/timestamp.h"

#include "kafka/kafka_client.h"
#include "base/base.h"
#include "kafka/kafka.h"

#define MARKER_READ_BACK	256		/* records read back from the end first */
#define MARKER_READ_MAX_BACK 65536	/* the furthest back a key is looked for */
#define ADMIN_TIMEOUT_MS	2000

/* outcome of a transactional call, from the flags librdkafka gives its error */
static OutboxTxnResult
txn_result(rd_kafka_error_t *error, char *buf, size_t len)
{
	OutboxTxnResult result;
	rd_kafka_resp_err_t code;

	if (error == NULL)
		return OUTBOX_TXN_OK;
	code = rd_kafka_error_code(error);
	snprintf(buf, len, "%s: %s", rd_kafka_err2name(code), rd_kafka_error_string(error));
	if (code == RD_KAFKA_RESP_ERR__FENCED || code == RD_KAFKA_RESP_ERR_PRODUCER_FENCED ||
		code == RD_KAFKA_RESP_ERR_INVALID_PRODUCER_EPOCH)
		result = OUTBOX_TXN_FENCED;
	else if (rd_kafka_error_is_fatal(error))
		result = OUTBOX_TXN_FATAL;
	else if (rd_kafka_error_txn_requires_abort(error))
		result = OUTBOX_TXN_ABORT;
	else if (rd_kafka_error_is_retriable(error))
		result = OUTBOX_TXN_RETRY;
	else
		result = OUTBOX_TXN_FATAL;
	rd_kafka_error_destroy(error);
	return result;
}

/*
 * OutboxProducerFenced
 *		Whether the producer's fatal error is a fence: a newer producer
 *		with its transactional.id exists (or took over after this one's
 *		transaction timed out at the coordinator).
 */
bool
OutboxProducerFenced(OutboxProducer *producer)
{
	char		buf[256];
	rd_kafka_resp_err_t code;

	if (producer->built_txn_id == NULL)
		return false;
	code = rd_kafka_fatal_error(producer->rk, buf, sizeof(buf));
	return code == RD_KAFKA_RESP_ERR__FENCED || code == RD_KAFKA_RESP_ERR_PRODUCER_FENCED ||
		code == RD_KAFKA_RESP_ERR_INVALID_PRODUCER_EPOCH;
}

/*
 * OutboxProducerInitTxn
 *		init_transactions(): fences every earlier producer with the same
 *		transactional.id and finishes or aborts its open transaction.
 *		RETRY on timeout: call it again.
 */
OutboxTxnResult
OutboxProducerInitTxn(OutboxProducer *producer, int timeout_ms, char *buf, size_t len)
{
	return txn_result(rd_kafka_init_transactions(producer->rk, timeout_ms), buf, len);
}

OutboxTxnResult
OutboxProducerBeginTxn(OutboxProducer *producer, char *buf, size_t len)
{
	producer->txn_failed = false;
	return txn_result(rd_kafka_begin_transaction(producer->rk), buf, len);
}

/*
 * OutboxProducerTxnFailed
 *		Whether librdkafka failed the open transaction (an abortable error).
 *		librdkafka logs that error under TXNERR, once per transaction (later
 *		ones are debug lines), which producer.c's log callback notes.  Its
 *		messages not acknowledged yet may then wait for the abort (a
 *		partition drained for an epoch bump), so the relay must abort rather
 *		than wait for their reports.
 */
bool
OutboxProducerTxnFailed(OutboxProducer *producer)
{
	return producer->txn_failed;
}

/*
 * OutboxProducerCommitTxn
 *		Commit the transaction; every message of it has its delivery
 *		report already (the relay sends the progress record last and waits
 *		for it), so this is the coordinator's round trip.  RETRY on
 *		timeout: the commit goes on, call it again.
 */
OutboxTxnResult
OutboxProducerCommitTxn(OutboxProducer *producer, int timeout_ms, char *buf, size_t len)
{
	return txn_result(rd_kafka_commit_transaction(producer->rk, timeout_ms), buf, len);
}

/*
 * OutboxProducerAbortTxn
 *		Abort the transaction: what it produced is purged or marked aborted,
 *		and read_committed consumers never see it.
 */
OutboxTxnResult
OutboxProducerAbortTxn(OutboxProducer *producer, int timeout_ms, char *buf, size_t len)
{
	return txn_result(rd_kafka_abort_transaction(producer->rk, timeout_ms), buf, len);
}

/*
 * OutboxProducerSendMarker
 *		Produce the progress record (key: the transactional id) in the open
 *		transaction; its outcome arrives in track->delivery_err.
 */
void
OutboxProducerSendMarker(OutboxProducer *producer, const char *topic,
						 const char *key, const char *value, OutboxEvent *track)
{
	rd_kafka_resp_err_t err;

	track->delivery_err = OUTBOX_DELIVERY_PENDING;
	err = rd_kafka_producev(producer->rk,
							RD_KAFKA_V_TOPIC(topic),
							RD_KAFKA_V_KEY(key, strlen(key)),
							RD_KAFKA_V_VALUE(unconstify(char *, value), strlen(value)),
							RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
							RD_KAFKA_V_HEADER("content-type", "application/json", -1),
							RD_KAFKA_V_OPAQUE(track),
							RD_KAFKA_V_END);
	if (err != RD_KAFKA_RESP_ERR_NO_ERROR)
	{
		track->delivery_err = (int) err;
		track->last_err = (int) err;
		track->last_err_local = true;
		return;
	}
	track->in_flight = true;
	producer->pending++;
}

/* one admin request's result event, or NULL after timeout_ms */
static rd_kafka_event_t *
admin_wait(rd_kafka_queue_t *q, int timeout_ms)
{
	return rd_kafka_queue_poll(q, timeout_ms);
}

/*
 * progress_topic_policy
 *		The topic's cleanup.policy into policy (empty: the topic does not
 *		exist); false with *errmsg when the cluster did not say.
 */
static bool
progress_topic_policy(rd_kafka_t *rk, rd_kafka_queue_t *q, const char *topic,
					  char *policy, size_t len, char **errmsg)
{
	rd_kafka_ConfigResource_t *res = rd_kafka_ConfigResource_new(RD_KAFKA_RESOURCE_TOPIC, topic);
	rd_kafka_event_t *ev;
	const rd_kafka_DescribeConfigs_result_t *result;
	const rd_kafka_ConfigResource_t **resources;
	const rd_kafka_ConfigEntry_t **entries;
	size_t		nres = 0,
				nentries = 0;
	bool		ok = false;

	policy[0] = '\0';
	rd_kafka_DescribeConfigs(rk, &res, 1, NULL, q);
	rd_kafka_ConfigResource_destroy(res);
	ev = admin_wait(q, ADMIN_TIMEOUT_MS);
	if (ev == NULL)
	{
		*errmsg = pstrdup("the cluster did not describe the topic in time");
		return false;
	}
	if (rd_kafka_event_error(ev))
		*errmsg = psprintf("%s", rd_kafka_event_error_string(ev));
	else if ((result = rd_kafka_event_DescribeConfigs_result(ev)) != NULL &&
			 (resources = rd_kafka_DescribeConfigs_result_resources(result, &nres)) != NULL &&
			 nres == 1)
	{
		rd_kafka_resp_err_t err = rd_kafka_ConfigResource_error(resources[0]);

		if (err == RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART)
			ok = true;
		else if (err != RD_KAFKA_RESP_ERR_NO_ERROR)
			*errmsg = psprintf("%s", rd_kafka_ConfigResource_error_string(resources[0]));
		else
		{
			entries = rd_kafka_ConfigResource_configs(resources[0], &nentries);
			for (size_t i = 0; i < nentries; i++)
				if (strcmp(rd_kafka_ConfigEntry_name(entries[i]), "cleanup.policy") == 0 &&
					rd_kafka_ConfigEntry_value(entries[i]) != NULL)
					strlcpy(policy, rd_kafka_ConfigEntry_value(entries[i]), len);
			ok = true;
		}
	}
	else
		*errmsg = pstrdup("the cluster's answer had no topic");
	rd_kafka_event_destroy(ev);
	return ok;
}

/* create the progress topic: one partition, compacted, the cluster's replication */
static bool
create_progress_topic(rd_kafka_t *rk, rd_kafka_queue_t *q, const char *topic,
					  char **errmsg)
{
	char		errstr[256];
	rd_kafka_NewTopic_t *nt = rd_kafka_NewTopic_new(topic, 1, -1, errstr, sizeof(errstr));
	rd_kafka_event_t *ev;
	const rd_kafka_topic_result_t **results;
	size_t		n = 0;
	bool		ok = false;

	if (nt == NULL)
	{
		*errmsg = psprintf("%s", errstr);
		return false;
	}
	rd_kafka_NewTopic_set_config(nt, "cleanup.policy", "compact");
	rd_kafka_CreateTopics(rk, &nt, 1, NULL, q);
	rd_kafka_NewTopic_destroy(nt);
	ev = admin_wait(q, ADMIN_TIMEOUT_MS);
	if (ev == NULL)
	{
		*errmsg = pstrdup("the cluster did not create the topic in time");
		return false;
	}
	if (rd_kafka_event_error(ev))
		*errmsg = psprintf("%s", rd_kafka_event_error_string(ev));
	else
	{
		results = rd_kafka_CreateTopics_result_topics(rd_kafka_event_CreateTopics_result(ev), &n);
		if (n == 1 && (rd_kafka_topic_result_error(results[0]) == RD_KAFKA_RESP_ERR_NO_ERROR ||
					   rd_kafka_topic_result_error(results[0]) == RD_KAFKA_RESP_ERR_TOPIC_ALREADY_EXISTS))
			ok = true;
		else if (n == 1)
			*errmsg = psprintf("%s: %s",
							   rd_kafka_err2name(rd_kafka_topic_result_error(results[0])),
							   rd_kafka_topic_result_error_string(results[0]) ?
							   rd_kafka_topic_result_error_string(results[0]) : "");
		else
			*errmsg = pstrdup("the cluster's answer had no topic");
	}
	rd_kafka_event_destroy(ev);
	return ok;
}

/*
 * OutboxProducerEnsureProgressTopic
 *		The progress topic exists and is compacted: created so when missing,
 *		refused (false, *errmsg, *refused true) when it exists with another
 *		cleanup.policy.  A cluster that cannot describe topic settings (no
 *		DescribeConfigs) is taken at its word: false with *refused false
 *		and *errmsg saying why, which the relay logs and goes on from.
 */
bool
OutboxProducerEnsureProgressTopic(OutboxProducer *producer, const char *topic,
								  bool *refused, char **errmsg)
{
	rd_kafka_queue_t *q = rd_kafka_queue_new(producer->rk);
	char		policy[64];
	bool		ok;

	*refused = false;
	ok = progress_topic_policy(producer->rk, q, topic, policy, sizeof(policy), errmsg);
	if (ok && policy[0] == '\0')
	{
		ok = create_progress_topic(producer->rk, q, topic, errmsg);
		*refused = !ok;
	}
	else if (ok && strstr(policy, "compact") == NULL)
	{
		*errmsg = psprintf("its cleanup.policy is \"%s\", not compact", policy);
		*refused = true;
		ok = false;
	}
	rd_kafka_queue_destroy(q);
	return ok;
}

/*
 * read_range
 *		Read [start, end) of one partition of the progress topic with
 *		consumer rk (read_committed: aborted transactions are left out, and
 *		nothing is read past the last stable offset); the value of the last
 *		record with key into *value (palloc'd).  The range is read through
 *		only once the last stable offset has reached end: another
 *		producer's open transaction below it hides what was committed
 *		after it, and it ends within that producer's transaction timeout.
 *		False when that did not happen by deadline, or shutdown was asked.
 */
static bool
read_range(rd_kafka_t *rk, const char *topic, int32 partition, int64 start,
		   int64 end, const char *key, char **value, TimestampTz deadline)
{
	rd_kafka_topic_partition_list_t *parts = rd_kafka_topic_partition_list_new(1);
	size_t		keylen = strlen(key);
	bool		reached = false;

	rd_kafka_topic_partition_list_add(parts, topic, partition)->offset = start;
	rd_kafka_assign(rk, parts);
	rd_kafka_topic_partition_list_destroy(parts);
	while (!reached && !ShutdownRequestPending && GetCurrentTimestamp() < deadline)
	{
		rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 100);

		if (m == NULL)
			continue;
		if (m->err == RD_KAFKA_RESP_ERR__PARTITION_EOF)
			reached = (m->offset >= end);
		else if (m->err == RD_KAFKA_RESP_ERR_NO_ERROR)
		{
			if (m->offset < end && m->key_len == keylen &&
				memcmp(m->key, key, keylen) == 0 && m->payload != NULL)
				*value = pnstrdup(m->payload, m->len);
			reached = (m->offset >= end - 1);
		}
		rd_kafka_message_destroy(m);
	}
	rd_kafka_assign(rk, NULL);
	return reached;
}

/*
 * read_partition
 *		The last committed record with key in one partition of topic: the
 *		last MARKER_READ_BACK offsets first, then four times as many further
 *		back each time, at most MARKER_READ_MAX_BACK: a record further back
 *		(busy relays sharing the partition) reads as none, and the page in
 *		hand is sent again.  The partition's end is
 *		its high watermark, asked of hw (a read_uncommitted handle).  -1 on
 *		failure (*errmsg), else whether found.
 */
static int
read_partition(rd_kafka_t *rk, rd_kafka_t *hw, const char *topic, int32 partition,
			   const char *key, char **value, TimestampTz deadline, char **errmsg)
{
	int64_t		low,
				high;
	int64		start,
				end,
				width = MARKER_READ_BACK;
	rd_kafka_resp_err_t err;

	err = rd_kafka_query_watermark_offsets(hw, topic, partition, &low, &high,
										   ADMIN_TIMEOUT_MS);
	if (err != RD_KAFKA_RESP_ERR_NO_ERROR)
	{
		*errmsg = psprintf("%s", rd_kafka_err2str(err));
		return -1;
	}
	end = high;
	start = Max(low, end - width);
	while (end > low)
	{
		if (!read_range(rk, topic, partition, start, end, key, value, deadline))
		{
			*errmsg = pstrdup(ShutdownRequestPending ? "the relay is stopping" :
							  "the progress topic's committed records did not reach its end in time "
							  "(another producer's transaction is open)");
			return -1;
		}
		if (*value != NULL || start == low || high - start >= MARKER_READ_MAX_BACK)
			break;
		end = start;
		width *= 4;
		start = Max(low, end - width);
	}
	return *value != NULL;
}

/* a consumer of the progress topic, at the isolation level given */
static rd_kafka_t *
marker_consumer(const char *isolation, char **errmsg)
{
	const char *const defaults[][2] = {
		{"isolation.level", isolation},
		{"enable.partition.eof", "true"},
		{"enable.auto.commit", "false"},
		{"enable.auto.offset.store", "false"},
		/* consumer_poll wants a group; assign() never joins it */
		{"group.id", "outbox-relay-progress"},
		{"client.id", "outbox-relay-progress"},
		{"log.queue", "true"},
	};
	rd_kafka_conf_t *conf = OutboxKafkaClientConf(defaults, lengthof(defaults), errmsg);
	rd_kafka_t *rk;
	char		errstr[512];

	if (conf == NULL)
		return NULL;
	rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, errstr, sizeof(errstr));
	if (rk == NULL)
	{
		rd_kafka_conf_destroy(conf);
		*errmsg = pstrdup(errstr);
		return NULL;
	}
	rd_kafka_set_log_queue(rk, NULL);
	return rk;
}

/*
 * OutboxKafkaReadMarker
 *		The last committed progress record with key in topic, read by
 *		consumers of its own (they assign the partitions themselves, so
 *		join no group, and commit nothing); the value's text in *value.
 *		Returns 1 when found, 0 when the topic has none with key, -1 on
 *		failure with *errmsg.  Blocks for timeout_ms at most, and less when
 *		shutdown is asked; the caller runs it before it publishes anything.
 */
int
OutboxKafkaReadMarker(const char *topic, const char *key, char **value,
					  int timeout_ms, char **errmsg)
{
	TimestampTz deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), timeout_ms);
	const rd_kafka_metadata_t *md = NULL;
	rd_kafka_topic_t *rkt = NULL;
	rd_kafka_t *rk;
	rd_kafka_t *hw;
	int			found = 0;
	int			nparts = 0;

	*value = NULL;
	if ((rk = marker_consumer("read_committed", errmsg)) == NULL)
		return -1;
	if ((hw = marker_consumer("read_uncommitted", errmsg)) == NULL)
	{
		rd_kafka_destroy(rk);
		return -1;
	}
	rkt = rd_kafka_topic_new(rk, topic, NULL);
	if (rd_kafka_metadata(rk, 0, rkt, &md, ADMIN_TIMEOUT_MS) == RD_KAFKA_RESP_ERR_NO_ERROR &&
		md->topic_cnt == 1 && md->topics[0].err == RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART)
	{
		/* no topic (yet: made a moment ago, or on first produce): no record */
		found = 0;
	}
	else if (md == NULL || md->topic_cnt != 1 || md->topics[0].err != RD_KAFKA_RESP_ERR_NO_ERROR)
	{
		*errmsg = psprintf("no metadata for the topic: %s",
						   md && md->topic_cnt == 1 ? rd_kafka_err2str(md->topics[0].err) :
						   "no answer");
		found = -1;
	}
	else
		nparts = md->topics[0].partition_cnt;
	/* the last record with key is in one partition: the producer's key hash */
	for (int i = 0; found == 0 && i < nparts; i++)
		found = read_partition(rk, hw, topic, md->topics[0].partitions[i].id, key, value,
							   deadline, errmsg);
	if (md != NULL)
		rd_kafka_metadata_destroy(md);
	rd_kafka_topic_destroy(rkt);
	rd_kafka_consumer_close(rk);
	rd_kafka_destroy(rk);
	rd_kafka_destroy(hw);
	return found;
}
