/*-------------------------------------------------------------------------
 *
 * kafka/kafka_consumer.c
 *		The subscription worker's librdkafka consumer: a member of the
 *		subscription's consumer group whose partitions start where the
 *		database says, and whose messages are copied out for consumer.c.
 *
 * Invariants:
 *	- The database's offsets are the truth.  On assignment the worker's
 *	  callback reads them (OutboxAssignFn) and each partition starts at an
 *	  explicit offset: the stored one, else the log's beginning (or the
 *	  end the worker recorded, for start_from latest).  Offsets are
 *	  committed to Kafka only after the database committed them,
 *	  asynchronously and only for people watching the group's lag, so
 *	  Kafka's committed offset is never ahead of the database's.
 *	- librdkafka never moves a partition by itself: auto.offset.reset is
 *	  error, so a position outside the partition's log (a rebuilt
 *	  cluster, a re-created topic, retention past it) comes back as an
 *	  offset reset for the worker to take (OutboxConsumerTakeResets), and
 *	  the partition stops fetching.  A partition the worker stops on
 *	  assignment is assigned paused.
 *	- Nothing here ERRORs while librdkafka is on the stack: callbacks run in
 *	  the worker's thread from inside rd_kafka_consumer_poll and use
 *	  malloc; the assignment callback catches its own errors.  Broker
 *	  errors are recorded for status, never raised.
 *	- enable.auto.commit and enable.auto.offset.store are off whatever
 *	  outbox.kafka_config says: they are set after it.
 *	- A message is copied into the caller's memory context and librdkafka's
 *	  copy destroyed at once, so nothing of librdkafka's outlives a poll.
 *	- Closing is bounded: the group is left within the time given, then
 *	  the handle is destroyed without a second close.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <librdkafka/rdkafka.h>

#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "kafka/kafka_client.h"
#include "base/base.h"
#include "kafka/kafka.h"

struct OutboxConsumer
{
	rd_kafka_t *rk;
	rd_kafka_queue_t *queue;	/* the consumer queue, everything forwarded to it */
	OutboxAssignFn assign;
	void	   *arg;
	bool		failed;			/* an assignment could not be looked up */
	bool		joined;			/* the group assigned it partitions (maybe
								 * none), and has not taken them all back */
	char		error[256];
	int			error_count;
	rd_kafka_topic_partition_list_t *to_commit;
	rd_kafka_topic_partition_list_t *resets;	/* offset resets not yet taken */
	char	   *built_brokers;	/* malloc'd: the settings it was built from */
	char	   *built_config;
	char	   *built_secrets;
};

static void
record_error(OutboxConsumer *c, const char *fac, const char *text)
{
	snprintf(c->error, sizeof(c->error), "%s: %s", fac, text);
	c->error_count++;
}

static void
error_report(rd_kafka_t *rk, int err, const char *reason, void *opaque)
{
	record_error((OutboxConsumer *) opaque, rd_kafka_err2name(err), reason);
}

static void
log_report(const rd_kafka_t *rk, int level, const char *fac, const char *buf)
{
	OutboxConsumer *c = (OutboxConsumer *) rd_kafka_opaque(rk);

	if (c != NULL && level <= 3)
		record_error(c, fac, buf);
}

/*
 * hand_over
 *		Assign (assigned) or revoke partitions, eagerly or incrementally as
 *		the group's protocol wants.  On assignment the worker fills in each
 *		partition's start; when it cannot, nothing is assigned and the
 *		consumer is marked failed: the worker restarts and joins again.
 */
static void
hand_over(OutboxConsumer *c, rd_kafka_topic_partition_list_t *partitions,
		  bool assigned)
{
	rd_kafka_t *rk = c->rk;
	bool		cooperative = strcmp(rd_kafka_rebalance_protocol(rk), "COOPERATIVE") == 0;
	OutboxAssigned *parts = NULL;
	bool		ok = true;
	int			i;

	if (partitions->cnt > 0)
	{
		parts = malloc(sizeof(OutboxAssigned) * partitions->cnt);
		if (parts == NULL)
			ok = false;
	}
	if (ok && partitions->cnt > 0)
	{
		for (i = 0; i < partitions->cnt; i++)
		{
			parts[i].topic = partitions->elems[i].topic;
			parts[i].partition = partitions->elems[i].partition;
			parts[i].offset = -1;
			parts[i].stop = false;
		}
		ok = c->assign(parts, partitions->cnt, assigned, c->arg);
	}
	if (assigned && ok)
	{
		rd_kafka_topic_partition_list_t *stopped = rd_kafka_topic_partition_list_new(1);

		for (i = 0; i < partitions->cnt; i++)
		{
			partitions->elems[i].offset = parts[i].offset >= 0 ?
				parts[i].offset : RD_KAFKA_OFFSET_BEGINNING;
			if (parts[i].stop)
				rd_kafka_topic_partition_list_add(stopped, parts[i].topic,
												  parts[i].partition);
		}
		if (cooperative)
		{
			rd_kafka_error_t *e = rd_kafka_incremental_assign(rk, partitions);

			if (e != NULL)
			{
				record_error(c, "assign", rd_kafka_error_string(e));
				rd_kafka_error_destroy(e);
				c->failed = true;
			}
		}
		else
			(void) rd_kafka_assign(rk, partitions);
		/* a partition paused for a retry before the rebalance fetches again */
		(void) rd_kafka_resume_partitions(rk, partitions);
		if (stopped->cnt > 0)
			(void) rd_kafka_pause_partitions(rk, stopped);
		rd_kafka_topic_partition_list_destroy(stopped);
	}
	else if (assigned)
	{
		c->failed = true;
		if (!cooperative)
			(void) rd_kafka_assign(rk, NULL);
	}
	else if (cooperative)
	{
		rd_kafka_error_t *e = rd_kafka_incremental_unassign(rk, partitions);

		if (e != NULL)
			rd_kafka_error_destroy(e);
	}
	else
		(void) rd_kafka_assign(rk, NULL);
	free(parts);
}

static void
rebalance_report(rd_kafka_t *rk, rd_kafka_resp_err_t err,
				 rd_kafka_topic_partition_list_t *partitions, void *opaque)
{
	OutboxConsumer *c = (OutboxConsumer *) opaque;

	bool		cooperative = strcmp(rd_kafka_rebalance_protocol(rk), "COOPERATIVE") == 0;

	if (err == RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS)
	{
		hand_over(c, partitions, true);
		c->joined = true;
	}
	else if (err == RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS)
	{
		hand_over(c, partitions, false);
		/* an eager rebalance takes everything back until the next join */
		c->joined = cooperative && !rd_kafka_assignment_lost(rk);
	}
	else
	{
		record_error(c, "rebalance", rd_kafka_err2str(err));
		hand_over(c, partitions, false);
		c->joined = false;
	}
}

static void
free_memo(OutboxConsumer *c)
{
	if (c == NULL)
		return;
	if (c->to_commit != NULL)
		rd_kafka_topic_partition_list_destroy(c->to_commit);
	if (c->resets != NULL)
		rd_kafka_topic_partition_list_destroy(c->resets);
	free(c->built_brokers);
	free(c->built_config);
	free(c->built_secrets);
	free(c);
}

/*
 * consumer_conf
 *		The consumer's configuration: outbox's client settings with the
 *		defaults below, then the settings outbox.kafka_config may not
 *		change.  NULL and a message in *errmsg on failure.
 */
static rd_kafka_conf_t *
consumer_conf(const char *group_id, const char *client_id, char **errmsg)
{
	rd_kafka_conf_t *conf;
	char		errstr[512];
	int			i;
	/*
	 * outbox.kafka_config may change these.  A worker that crashed is still
	 * a member of its group until its session times out, and the group's
	 * partitions wait for that: 10 s rather than librdkafka's 45.
	 */
	static const char *const defaults[][2] = {
		{"session.timeout.ms", CppAsString2(OUTBOX_KAFKA_SESSION_TIMEOUT_MS)},
		{"heartbeat.interval.ms", "2000"},
	};
	/* these it may not */
	const char *const settings[][2] = {
		{"group.id", group_id},
		{"client.id", client_id},
		/*
		 * A position outside the log is the worker's to judge, never taken
		 * as read: see the invariants.  Where a new subscription starts is
		 * decided on assignment (consumer_offsets.c), not here.
		 */
		{"auto.offset.reset", "error"},
		{"enable.auto.commit", "false"},
		{"enable.auto.offset.store", "false"},
		{"enable.partition.eof", "false"},
		/* the relay's events are committed Kafka transactions or plain */
		{"isolation.level", "read_committed"},
		{"log.queue", "true"},
	};

	if ((conf = OutboxKafkaClientConf(defaults, lengthof(defaults), errmsg)) == NULL)
		return NULL;
	for (i = 0; i < lengthof(settings); i++)
		if (rd_kafka_conf_set(conf, settings[i][0], settings[i][1],
							  errstr, sizeof(errstr)) != RD_KAFKA_CONF_OK)
		{
			rd_kafka_conf_destroy(conf);
			*errmsg = psprintf("librdkafka refuses %s for the subscription: %s",
							   settings[i][0], errstr);
			return NULL;
		}
	return conf;
}

/*
 * subscribe_topics
 *		Subscribe c to topics; its queue, with logs, errors and rebalances
 *		forwarded to it, writes to event_fd.  False and a message in
 *		*errmsg on failure.
 */
static bool
subscribe_topics(OutboxConsumer *c, char **topics, int ntopics, int event_fd,
				 char **errmsg)
{
	rd_kafka_topic_partition_list_t *subscription;
	rd_kafka_resp_err_t err;
	int			i;

	/* logs, errors and rebalances all arrive through the consumer queue */
	rd_kafka_set_log_queue(c->rk, NULL);
	rd_kafka_poll_set_consumer(c->rk);
	c->queue = rd_kafka_queue_get_consumer(c->rk);
	rd_kafka_queue_io_event_enable(c->queue, event_fd, "1", 1);

	subscription = rd_kafka_topic_partition_list_new(ntopics);
	for (i = 0; i < ntopics; i++)
		rd_kafka_topic_partition_list_add(subscription, topics[i], RD_KAFKA_PARTITION_UA);
	err = rd_kafka_subscribe(c->rk, subscription);
	rd_kafka_topic_partition_list_destroy(subscription);
	if (err != RD_KAFKA_RESP_ERR_NO_ERROR)
	{
		*errmsg = psprintf("could not subscribe: %s", rd_kafka_err2str(err));
		return false;
	}
	return true;
}

/*
 * OutboxConsumerCreate
 *		A consumer in group_id subscribed to topics.  It writes a byte to
 *		event_fd (non-blocking) when its queue gets something; the worker
 *		waits on the other end.  NULL and a message in *errmsg on failure.
 */
OutboxConsumer *
OutboxConsumerCreate(const char *group_id, const char *client_id,
					 char **topics, int ntopics, int event_fd,
					 OutboxAssignFn assign, void *arg, char **errmsg)
{
	rd_kafka_conf_t *conf;
	OutboxConsumer *c;
	char		errstr[512];

	if ((conf = consumer_conf(group_id, client_id, errmsg)) == NULL)
		return NULL;
	c = calloc(1, sizeof(OutboxConsumer));
	if (c == NULL ||
		(c->built_brokers = strdup(outbox_kafka_brokers)) == NULL ||
		(c->built_config = strdup(outbox_kafka_config)) == NULL ||
		(c->built_secrets = strdup(OutboxKafkaSecretsText())) == NULL)
	{
		rd_kafka_conf_destroy(conf);
		free_memo(c);
		*errmsg = pstrdup("out of memory");
		return NULL;
	}
	c->assign = assign;
	c->arg = arg;
	rd_kafka_conf_set_opaque(conf, c);
	rd_kafka_conf_set_error_cb(conf, error_report);
	rd_kafka_conf_set_log_cb(conf, log_report);
	rd_kafka_conf_set_rebalance_cb(conf, rebalance_report);

	c->rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, errstr, sizeof(errstr));
	if (c->rk == NULL)
	{
		rd_kafka_conf_destroy(conf);
		free_memo(c);
		*errmsg = psprintf("could not create the Kafka consumer: %s", errstr);
		return NULL;
	}
	if (!subscribe_topics(c, topics, ntopics, event_fd, errmsg))
	{
		OutboxConsumerDestroy(c, 0);
		return NULL;
	}
	return c;
}

/*
 * set_offset
 *		Set topic/partition's offset in *list, adding the partition when it
 *		is not there, and making the list (room for size) when there is
 *		none.
 */
static void
set_offset(rd_kafka_topic_partition_list_t **list, int size, const char *topic,
		   int32 partition, int64 offset)
{
	rd_kafka_topic_partition_t *p;

	if (*list == NULL)
		*list = rd_kafka_topic_partition_list_new(size);
	p = rd_kafka_topic_partition_list_find(*list, topic, partition);
	if (p == NULL)
		p = rd_kafka_topic_partition_list_add(*list, topic, partition);
	p->offset = offset;
}

static char *
copy_bytes(const void *data, size_t len, MemoryContext cxt)
{
	char	   *copy = MemoryContextAlloc(cxt, len + 1);

	memcpy(copy, data, len);
	copy[len] = '\0';
	return copy;
}

/*
 * OutboxConsumerPoll
 *		Serve the consumer queue without waiting and copy up to max
 *		messages into out (cxt); returns how many.  Errors and rebalances met
 *		on the way are served too.  Offsets queued by OutboxConsumerCommit
 *		go to Kafka first.
 */
int
OutboxConsumerPoll(OutboxConsumer *c, OutboxInbound *out, int max, MemoryContext cxt)
{
	int			n = 0;

	if (c->to_commit != NULL)
	{
		(void) rd_kafka_commit(c->rk, c->to_commit, 1);
		rd_kafka_topic_partition_list_destroy(c->to_commit);
		c->to_commit = NULL;
	}
	while (n < max)
	{
		rd_kafka_message_t *m = rd_kafka_consumer_poll(c->rk, 0);
		OutboxInbound *in;
		rd_kafka_headers_t *hdrs = NULL;
		rd_kafka_timestamp_type_t tstype;

		if (m == NULL)
			break;
		if (m->err != RD_KAFKA_RESP_ERR_NO_ERROR)
		{
			/* a reset the worker reports itself, with the log's bounds */
			if (m->err == RD_KAFKA_RESP_ERR__AUTO_OFFSET_RESET && m->rkt != NULL)
				set_offset(&c->resets, 4, rd_kafka_topic_name(m->rkt), m->partition,
						   m->offset);
			else
				record_error(c, rd_kafka_err2name(m->err), rd_kafka_message_errstr(m));
			rd_kafka_message_destroy(m);
			continue;
		}
		in = &out[n++];
		memset(in, 0, sizeof(*in));
		in->topic = MemoryContextStrdup(cxt, rd_kafka_topic_name(m->rkt));
		in->partition = m->partition;
		in->offset = m->offset;
		in->timestamp_ms = rd_kafka_message_timestamp(m, &tstype);
		if (tstype == RD_KAFKA_TIMESTAMP_NOT_AVAILABLE)
			in->timestamp_ms = -1;
		if (m->key != NULL)
		{
			in->key = copy_bytes(m->key, m->key_len, cxt);
			in->key_len = (int) m->key_len;
		}
		if (m->payload != NULL)
		{
			in->value = copy_bytes(m->payload, m->len, cxt);
			in->value_len = (int) m->len;
		}
		if (rd_kafka_message_headers(m, &hdrs) == RD_KAFKA_RESP_ERR_NO_ERROR &&
			hdrs != NULL)
		{
			int			count = (int) rd_kafka_header_cnt(hdrs);
			int			i;

			in->header_names = MemoryContextAlloc(cxt, sizeof(char *) * Max(1, count));
			in->header_values = MemoryContextAlloc(cxt, sizeof(char *) * Max(1, count));
			in->header_lens = MemoryContextAlloc(cxt, sizeof(int) * Max(1, count));
			for (i = 0; i < count; i++)
			{
				const char *name;
				const void *value;
				size_t		size;

				if (rd_kafka_header_get_all(hdrs, i, &name, &value, &size) !=
					RD_KAFKA_RESP_ERR_NO_ERROR)
					break;
				in->header_names[i] = MemoryContextStrdup(cxt, name);
				in->header_values[i] = value ? copy_bytes(value, size, cxt) : NULL;
				in->header_lens[i] = value ? (int) size : 0;
				in->nheaders = i + 1;
			}
		}
		rd_kafka_message_destroy(m);
	}
	return n;
}

/* whether an assignment could not be looked up: the worker restarts */
bool
OutboxConsumerFailed(OutboxConsumer *c)
{
	return c->failed;
}

/*
 * OutboxConsumerJoined
 *		Whether the group has assigned this member its partitions (none,
 *		maybe, when others hold them all): false from its creation until
 *		the first assignment, and again while an eager rebalance or a lost
 *		membership has taken them back.  No message arrives meanwhile.
 */
bool
OutboxConsumerJoined(const OutboxConsumer *c)
{
	return c->joined;
}

/* a list of topic/partition at offset; the caller destroys it */
static rd_kafka_topic_partition_list_t *
one_partition(const char *topic, int32 partition, int64 offset)
{
	rd_kafka_topic_partition_list_t *list = rd_kafka_topic_partition_list_new(1);

	rd_kafka_topic_partition_list_add(list, topic, partition)->offset = offset;
	return list;
}

/* pause or resume fetching topic/partition */
static void
pause_one(OutboxConsumer *c, const char *topic, int32 partition, bool pause)
{
	rd_kafka_topic_partition_list_t *list = one_partition(topic, partition, 0);

	if (pause)
		(void) rd_kafka_pause_partitions(c->rk, list);
	else
		(void) rd_kafka_resume_partitions(c->rk, list);
	rd_kafka_topic_partition_list_destroy(list);
}

/*
 * OutboxConsumerRewind
 *		Pause topic/partition and move its position back to offset: the
 *		message the handler failed on comes again after the resume, and
 *		what was fetched beyond it is dropped.
 */
void
OutboxConsumerRewind(OutboxConsumer *c, const char *topic, int32 partition,
					 int64 offset)
{
	rd_kafka_topic_partition_list_t *list = one_partition(topic, partition, offset);
	rd_kafka_error_t *e;

	(void) rd_kafka_pause_partitions(c->rk, list);
	e = rd_kafka_seek_partitions(c->rk, list, 0);
	if (e != NULL)
	{
		record_error(c, "seek", rd_kafka_error_string(e));
		rd_kafka_error_destroy(e);
	}
	rd_kafka_topic_partition_list_destroy(list);
}

/* fetch topic/partition again, from where it is */
void
OutboxConsumerResume(OutboxConsumer *c, const char *topic, int32 partition)
{
	pause_one(c, topic, partition, false);
}

/*
 * OutboxConsumerCommit
 *		Queue next_offset of topic/partition for Kafka (sent at the next
 *		poll), after the database committed it.
 */
void
OutboxConsumerCommit(OutboxConsumer *c, const char *topic, int32 partition,
					 int64 next_offset)
{
	set_offset(&c->to_commit, 8, topic, partition, next_offset);
}

/*
 * OutboxConsumerQueryLog
 *		Ask the partition's leader where its log starts (*low) and ends
 *		(*high, the offset the next message gets), waiting at most
 *		timeout_ms.  False when it does not answer.
 */
bool
OutboxConsumerQueryLog(OutboxConsumer *c, const char *topic, int32 partition,
					   int timeout_ms, int64 *low, int64 *high)
{
	int64_t		lo;
	int64_t		hi;

	if (timeout_ms <= 0 ||
		rd_kafka_query_watermark_offsets(c->rk, topic, partition, &lo, &hi,
										 timeout_ms) != RD_KAFKA_RESP_ERR_NO_ERROR ||
		lo < 0 || hi < lo)
		return false;
	*low = lo;
	*high = hi;
	return true;
}

/*
 * OutboxConsumerQueryEnd
 *		The partition's end offset (at most timeout_ms); -1 when its
 *		leader does not answer.  Called from the assignment callback.
 */
int64
OutboxConsumerQueryEnd(OutboxConsumer *c, const char *topic, int32 partition,
					   int timeout_ms)
{
	int64		low;
	int64		high;

	if (!OutboxConsumerQueryLog(c, topic, partition, timeout_ms, &low, &high))
		return -1;
	return high;
}

/*
 * OutboxConsumerTakeResets
 *		The partitions librdkafka would have moved since the last call
 *		(auto.offset.reset is error: they stopped fetching instead), each
 *		with the offset it was at: palloc'd in the current memory context,
 *		*resets NULL when there are none.  An offset below 0 is a logical
 *		one (the log's beginning or end) that could not be looked up.
 */
int
OutboxConsumerTakeResets(OutboxConsumer *c, OutboxAssigned **resets)
{
	int			n = c->resets != NULL ? c->resets->cnt : 0;
	int			i;

	*resets = NULL;
	if (n == 0)
		return 0;
	*resets = palloc(sizeof(OutboxAssigned) * n);
	for (i = 0; i < n; i++)
	{
		(*resets)[i].topic = pstrdup(c->resets->elems[i].topic);
		(*resets)[i].partition = c->resets->elems[i].partition;
		(*resets)[i].offset = c->resets->elems[i].offset;
		(*resets)[i].stop = false;
	}
	rd_kafka_topic_partition_list_destroy(c->resets);
	c->resets = NULL;
	return n;
}

/* stop fetching topic/partition, where it is, until a resume */
void
OutboxConsumerPause(OutboxConsumer *c, const char *topic, int32 partition)
{
	pause_one(c, topic, partition, true);
}

/* the partition's high watermark as the last fetch told it, -1 unknown */
int64
OutboxConsumerHighWatermark(OutboxConsumer *c, const char *topic, int32 partition)
{
	int64_t		low;
	int64_t		high;

	if (rd_kafka_get_watermark_offsets(c->rk, topic, partition, &low, &high) !=
		RD_KAFKA_RESP_ERR_NO_ERROR || high < 0)
		return -1;
	return high;
}

/* the last error since the last call, if any */
bool
OutboxConsumerTakeError(OutboxConsumer *c, char *buf, size_t len)
{
	if (c->error_count == 0)
		return false;
	strlcpy(buf, c->error, len);
	c->error_count = 0;
	return true;
}

/* whether the Kafka settings changed since the consumer was built */
bool
OutboxConsumerOutdated(const OutboxConsumer *c)
{
	return strcmp(c->built_brokers, outbox_kafka_brokers) != 0 ||
		strcmp(c->built_config, outbox_kafka_config) != 0 ||
		strcmp(c->built_secrets, OutboxKafkaSecretsText()) != 0;
}

/*
 * OutboxConsumerDestroy
 *		Leave the group (revoking the assignment, so that the group hands
 *		the partitions over at once) within timeout_ms, then destroy.
 */
void
OutboxConsumerDestroy(OutboxConsumer *c, int timeout_ms)
{
	rd_kafka_queue_t *q;
	rd_kafka_error_t *e;
	TimestampTz deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), timeout_ms);

	if (c == NULL)
		return;
	rd_kafka_queue_io_event_enable(c->queue, -1, NULL, 0);
	q = rd_kafka_queue_new(c->rk);
	e = timeout_ms > 0 ? rd_kafka_consumer_close_queue(c->rk, q) : NULL;
	if (e != NULL)
		rd_kafka_error_destroy(e);
	else if (timeout_ms > 0)
	{
		while (!rd_kafka_consumer_closed(c->rk) &&
			   GetCurrentTimestamp() < deadline)
		{
			rd_kafka_event_t *ev = rd_kafka_queue_poll(q, 50);

			if (ev == NULL)
				continue;
			if (rd_kafka_event_type(ev) == RD_KAFKA_EVENT_REBALANCE)
			{
				rd_kafka_topic_partition_list_t *parts =
					rd_kafka_event_topic_partition_list(ev);

				if (strcmp(rd_kafka_rebalance_protocol(c->rk), "COOPERATIVE") == 0)
				{
					rd_kafka_error_t *e2 = rd_kafka_incremental_unassign(c->rk, parts);

					if (e2 != NULL)
						rd_kafka_error_destroy(e2);
				}
				else
					(void) rd_kafka_assign(c->rk, NULL);
			}
			rd_kafka_event_destroy(ev);
		}
	}
	rd_kafka_queue_destroy(q);
	rd_kafka_queue_destroy(c->queue);
	rd_kafka_destroy_flags(c->rk, RD_KAFKA_DESTROY_F_NO_CONSUMER_CLOSE);
	free_memo(c);
}
