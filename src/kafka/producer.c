/*-------------------------------------------------------------------------
 *
 * kafka/producer.c
 *		The librdkafka producer: its settings and the secrets file, lifecycle,
 *		produce with headers, delivery reports and their error classes.
 *
 * Invariants:
 *	- This file, kafka_topic.c (the topics met, partitions), kafka_txn.c
 *	  (transactions) and kafka_consumer.c are the only ones that include
 *	  rdkafka.h.
 *	- librdkafka's own threads never call back into PostgreSQL: logs go to
 *	  a queue (log.queue=true), and every callback (delivery report, error,
 *	  log) is served by rd_kafka_poll() in the relay's thread, where it only
 *	  records into memory that the relay inspects afterwards.  No callback
 *	  ereports.  A delivery report is classified where it arrives: the
 *	  event gets its outcome, error, error class and failure times.
 *	- A producer remembers the settings it was built from (brokers,
 *	  outbox.kafka_config, the secrets file), so that the relay can tell
 *	  when a reload makes it outdated.  The relay's secrets file is read
 *	  here, at start and at each reload, into a context reset at each read;
 *	  its text is never shown or logged.
 *	- The producer is idempotent, so retries inside librdkafka neither
 *	  duplicate nor reorder a partition's messages.
 *	- Messages are produced with RD_KAFKA_MSG_F_COPY: the relay may free its
 *	  page memory once every delivery report of the page has been served.
 *	- While the relay works, its blocking librdkafka calls are bounded: a
 *	  new topic's metadata fetch (kafka_topic.c), between two of which the
 *	  relay checks for shutdown, and OutboxProducerSendNow's SEND_NOW_MS;
 *	  the topics a producer remembers are bounded too.  rd_kafka_destroy (a rebuild, the exit) waits for librdkafka's
 *	  threads to end; it comes after a purge, so it waits on no broker's
 *	  answer, but librdkafka sets it no bound of its own.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <librdkafka/rdkafka.h>

#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "base/compat.h"
#include "kafka/kafka_client.h"
#include "base/base.h"
#include "kafka/kafka.h"


/*
 * The relay's memo of outbox.kafka_secrets_file, as last read (empty text
 * and a message when it could not be), in secrets_cxt, reset at each read.
 */
static MemoryContext secrets_cxt = NULL;
static char *secrets_text = NULL;
static char *secrets_error = NULL;

/*
 * apply_property
 *		Judge one name=value and set it in conf.  With where NULL it comes
 *		from outbox.kafka_config: *detail may name the property (never a
 *		secret property's value) and *hint, when not NULL, gets why outbox
 *		refuses it.  Otherwise it comes from the secrets file, where says
 *		where ("line 3 of \"path\""), and *detail names nothing but that
 *		place and why: any part of a secrets line may be a secret.
 */
static bool
apply_property(rd_kafka_conf_t *conf, const char *name, const char *value,
			   const char *where, char **detail, char **hint)
{
	bool		by_value;
	const char *why = OutboxKafkaPropertyRefusal(name, value, where != NULL, &by_value);
	char		errstr[512];

	if (why == NULL && strcmp(name, OUTBOX_REGISTRY_AUTH_PROPERTY) == 0)
		return true;			/* outbox's own entry: not librdkafka's */
	if (why != NULL)
	{
		if (where != NULL && by_value)
			*detail = psprintf("The value on %s is refused. %s", where, why);
		else if (where != NULL)
			*detail = psprintf("The property on %s cannot be set in the secrets file. %s",
							   where, why);
		else if (by_value)
			*detail = psprintf("Property \"%s\" cannot be \"%s\".", name, value);
		else
			*detail = psprintf("Property \"%s\" cannot be set here.", name);
		if (where == NULL && hint != NULL)
			*hint = pstrdup(why);
		else if (where == NULL)
			*detail = psprintf("%s %s", *detail, why);
		return false;
	}
	if (rd_kafka_conf_set(conf, name, value, errstr, sizeof(errstr)) != RD_KAFKA_CONF_OK)
	{
		if (where != NULL)
			*detail = psprintf("librdkafka rejects the property on %s.", where);
		else if (OutboxKafkaPropertyIsSecret(name))
			*detail = psprintf("librdkafka rejects the value of property \"%s\".", name);
		else
			*detail = psprintf("librdkafka rejects property \"%s\": %s.", name, errstr);
		return false;
	}
	return true;
}

/*
 * apply_config
 *		Parse "k=v;k=v" into conf.  On failure *detail is a sentence naming
 *		the property (and *hint, when not NULL, may say why outbox refuses
 *		it); a secret property's value never appears in them.  With
 *		from_secrets, the text is the secrets file's, joined: a failure
 *		names only the entry's number.
 */
static bool
apply_config(rd_kafka_conf_t *conf, const char *text, bool from_secrets,
			 char **detail, char **hint)
{
	char	   *copy = pstrdup(text ? text : "");
	char	   *item;
	char	   *save = NULL;
	int			n = 0;

	for (item = strtok_r(copy, ";", &save); item != NULL;
		 item = strtok_r(NULL, ";", &save))
	{
		char	   *name;
		char	   *value;

		while (*item == ' ' || *item == '\t' || *item == '\n')
			item++;
		if (*item == '\0')
			continue;
		n++;
		if (!OutboxKafkaSplitProperty(item, &name, &value))
		{
			if (from_secrets)
				*detail = psprintf("Entry %d of outbox.kafka_secrets_file is not of the form key=value.", n);
			else
				*detail = psprintf("Entry \"%.64s\" is not of the form key=value.",
								   OutboxKafkaPropertyIsSecret(item) ? "(hidden)" : item);
			return false;
		}
		if (!apply_property(conf, name, value,
							from_secrets ? psprintf("entry %d of outbox.kafka_secrets_file", n) : NULL,
							detail, hint))
			return false;
	}
	return true;
}

/*
 * OutboxKafkaCheckConfig
 *		Check hook body for outbox.kafka_config: outbox's rules, then
 *		librdkafka's judgement of each property set in a configuration
 *		object (no client is made).  False with *detail, and *hint when
 *		outbox says why.  Never throws.
 */
bool
OutboxKafkaCheckConfig(const char *text, char **detail, char **hint)
{
	rd_kafka_conf_t *conf = rd_kafka_conf_new();
	bool		ok = apply_config(conf, text, false, detail, hint);

	rd_kafka_conf_destroy(conf);
	return ok;
}

/*
 * OutboxKafkaMessageMaxBytes
 *		The producer's effective message.max.bytes under outbox.kafka_config
 *		text, as librdkafka reports it (its default when unset), or -1 when
 *		the text is not a valid configuration.  Called when the setting
 *		changes, not per event.  Never throws.
 */
int
OutboxKafkaMessageMaxBytes(const char *text)
{
	rd_kafka_conf_t *conf = rd_kafka_conf_new();
	char	   *detail = NULL;
	char		buf[32];
	size_t		size = sizeof(buf);
	int			result = -1;

	if (apply_config(conf, text, false, &detail, NULL) &&
		rd_kafka_conf_get(conf, "message.max.bytes", buf, &size) == RD_KAFKA_CONF_OK)
		result = atoi(buf);
	rd_kafka_conf_destroy(conf);
	return result;
}

static void
record_error(OutboxProducer *producer, const char *fmt, const char *a, const char *b)
{
	snprintf(producer->error, sizeof(producer->error), fmt, a, b);
	producer->error_count++;
}

/*
 * delivery_error_class
 *		Design section 5: what a delivery error means for the event.
 */
static OutboxErrorClass
delivery_error_class(int err)
{
	switch ((rd_kafka_resp_err_t) err)
	{
		case RD_KAFKA_RESP_ERR_NO_ERROR:
			return OUTBOX_ERROR_NONE;

			/* the event itself can never be written as it is */
		case RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE:
		case RD_KAFKA_RESP_ERR_INVALID_MSG_SIZE:
		case RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED:
		case RD_KAFKA_RESP_ERR_TOPIC_EXCEPTION:
		case RD_KAFKA_RESP_ERR__INVALID_ARG:
		case RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC:
		case RD_KAFKA_RESP_ERR_INVALID_RECORD:
		case RD_KAFKA_RESP_ERR_INVALID_MSG:
		case RD_KAFKA_RESP_ERR_INVALID_REQUIRED_ACKS:
		case RD_KAFKA_RESP_ERR_POLICY_VIOLATION:
		case RD_KAFKA_RESP_ERR_INVALID_TIMESTAMP:
			return OUTBOX_ERROR_PERMANENT;

			/* the producer cannot go on; rebuild it */
		case RD_KAFKA_RESP_ERR__FATAL:
		case RD_KAFKA_RESP_ERR_CLUSTER_AUTHORIZATION_FAILED:
		case RD_KAFKA_RESP_ERR_OUT_OF_ORDER_SEQUENCE_NUMBER:
		case RD_KAFKA_RESP_ERR_UNSUPPORTED_FOR_MESSAGE_FORMAT:
		case RD_KAFKA_RESP_ERR_UNSUPPORTED_VERSION:
		case RD_KAFKA_RESP_ERR_INVALID_PRODUCER_EPOCH:
		case RD_KAFKA_RESP_ERR_PRODUCER_FENCED:
		case RD_KAFKA_RESP_ERR_SASL_AUTHENTICATION_FAILED:
		case RD_KAFKA_RESP_ERR__AUTHENTICATION:
		case RD_KAFKA_RESP_ERR__SSL:
			return OUTBOX_ERROR_FATAL;

		default:
			/* timeouts, broker down, leader moves, throttling, purges */
			return OUTBOX_ERROR_TRANSIENT;
	}
}

/*
 * record_outcome
 *		Write a delivery outcome into event: err 0 is an acknowledgement;
 *		any other error is classified here, with local telling whether
 *		librdkafka refused the event itself at produce time.
 */
static void
record_outcome(OutboxEvent *event, int err, bool local)
{
	TimestampTz now;

	event->delivery_err = err;
	event->in_flight = false;
	if (err == 0)
		return;
	now = GetCurrentTimestamp();
	event->last_err = err;
	event->last_err_local = local;
	event->last_class = delivery_error_class(err);
	/*
	 * A broker's bound on record timestamps refused occurred_at (or its
	 * batch's, before librdkafka 2.4 told them apart): sent again with the
	 * send time, a permanent refusal only if that is refused too.
	 */
	if (err == RD_KAFKA_RESP_ERR_INVALID_TIMESTAMP && event->timestamp_ms != 0)
	{
		event->timestamp_ms = 0;
		event->last_class = OUTBOX_ERROR_TRANSIENT;
	}
	if (event->first_failed_at == 0)
		event->first_failed_at = now;
	event->last_failed_at = now;
}

/* Served by rd_kafka_poll in the relay's thread: records the outcome only. */
static void
delivery_report(rd_kafka_t *rk, const rd_kafka_message_t *msg, void *opaque)
{
	OutboxProducer *producer = (OutboxProducer *) opaque;
	OutboxEvent *event = (OutboxEvent *) msg->_private;

	if (event != NULL)
		record_outcome(event, (int) msg->err, false);
	if (msg->err == RD_KAFKA_RESP_ERR_NO_ERROR)
		producer->all_down = false;
	if (event == NULL || !event->probe)
		producer->pending--;
}

static void
error_report(rd_kafka_t *rk, int err, const char *reason, void *opaque)
{
	OutboxProducer *producer = (OutboxProducer *) opaque;

	record_error(producer, "%s: %s", rd_kafka_err2name(err), reason);
	if (err == RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN)
		producer->all_down = true;
	if (delivery_error_class(err) == OUTBOX_ERROR_FATAL)
		producer->fatal_count++;
}

static void
log_report(const rd_kafka_t *rk, int level, const char *fac, const char *buf)
{
	OutboxProducer *producer = (OutboxProducer *) rd_kafka_opaque(rk);

	/* level 3 and below are errors; the rest is librdkafka chatter */
	if (producer != NULL && level <= 3)
		record_error(producer, "%s: %s", fac, buf);
	/* the error that fails a transaction, once a transaction (kafka_txn.c) */
	if (producer != NULL && level <= 3 && strcmp(fac, "TXNERR") == 0)
		producer->txn_failed = true;
}

/*
 * stats_report
 *		Served by rd_kafka_poll: count the brokers librdkafka has a working
 *		connection to.  Each broker object of the statistics JSON has
 *		"nodeid" (-1 for a bootstrap entry) before its "state"; nothing else
 *		has a "nodeid".
 */
static int
stats_report(rd_kafka_t *rk, char *json, size_t len, void *opaque)
{
	OutboxProducer *producer = (OutboxProducer *) opaque;
	const char *p = json;
	int			up = 0;

	while ((p = strstr(p, "\"nodeid\":")) != NULL)
	{
		int			nodeid = atoi(p + strlen("\"nodeid\":"));
		const char *state = strstr(p, "\"state\":\"");

		p += strlen("\"nodeid\":");
		if (state == NULL)
			break;
		if (nodeid >= 0 && strncmp(state + strlen("\"state\":\""), "UP\"", 3) == 0)
			up++;
	}
	producer->brokers_up = up;
	if (up > 0)
		producer->all_down = false;
	return 0;					/* librdkafka frees json */
}

/*
 * OutboxProducerBrokersUp
 *		Brokers reachable at the last statistics (every 5 s), -1 if none yet.
 */
int
OutboxProducerBrokersUp(OutboxProducer *producer)
{
	return producer->brokers_up;
}

/*
 * OutboxProducerAllBrokersDown
 *		Whether librdkafka reported every broker down (_ALL_BROKERS_DOWN)
 *		and no acknowledgement or working connection came since.
 */
bool
OutboxProducerAllBrokersDown(OutboxProducer *producer)
{
	return producer->all_down;
}

/* librdkafka judges one property of the secrets file (conf: its rd_kafka_conf_t) */
static bool
judge_secret(const char *name, const char *value, const char *where,
			 char **errmsg, void *conf)
{
	return apply_property((rd_kafka_conf_t *) conf, name, value, where, errmsg, NULL);
}

/*
 * read_secrets
 *		The secrets file at path, judged by outbox and librdkafka, as
 *		"k=v;k=v" (palloc'd), or NULL with *errmsg set
 *		(OutboxKafkaReadSecretsText).
 */
static char *
read_secrets(const char *path, char **errmsg)
{
	rd_kafka_conf_t *conf = rd_kafka_conf_new();
	char	   *text = OutboxKafkaReadSecretsText(path, judge_secret, conf, errmsg);

	rd_kafka_conf_destroy(conf);
	return text;
}

/*
 * OutboxKafkaCheckSecretsFile
 *		Check hook body for outbox.kafka_secrets_file: readable, and every
 *		property in it accepted by outbox and librdkafka.  Never throws.
 */
bool
OutboxKafkaCheckSecretsFile(const char *path, char **detail)
{
	if (path == NULL || path[0] == '\0')
		return true;
	return read_secrets(path, detail) != NULL;
}

/*
 * OutboxKafkaReadSecretsFile
 *		Relay, at start and after each reload: read outbox.kafka_secrets_file
 *		again into the memo the next OutboxProducerCreate uses.  The first
 *		call makes the memo's context under parent; each call resets it, so
 *		reloads do not add up.  A file that cannot be read is remembered as
 *		such: no producer can be built until a reload fixes it.
 */
void
OutboxKafkaReadSecretsFile(MemoryContext parent)
{
	MemoryContext old;

	if (secrets_cxt == NULL)
		secrets_cxt = AllocSetContextCreate(parent, "outbox secrets",
											ALLOCSET_SMALL_SIZES);
	MemoryContextReset(secrets_cxt);
	old = MemoryContextSwitchTo(secrets_cxt);
	secrets_text = secrets_error = NULL;
	if (outbox_kafka_secrets_file[0] != '\0')
		secrets_text = read_secrets(outbox_kafka_secrets_file, &secrets_error);
	if (secrets_text == NULL)
		secrets_text = pstrdup("");
	MemoryContextSwitchTo(old);
}

/* free a producer's own memory, what librdkafka does not own (NULL: none) */
static void
free_producer_memo(OutboxProducer *producer)
{
	if (producer == NULL)
		return;
	free(producer->built_brokers);
	free(producer->built_config);
	free(producer->built_secrets);
	free(producer->built_txn_id);
	free(producer);
}

/*
 * producer_conf
 *		The configuration of a producer for the current settings: outbox's
 *		defaults, outbox.kafka_brokers, outbox.kafka_config, then the secrets
 *		file as last read.  NULL and a message in *errmsg when one is refused.
 */
static rd_kafka_conf_t *
producer_conf(bool transactional, char **errmsg)
{
	static const char *const defaults[][2] = {
		/*
		 * Transactional: a transaction begun just after the last one's
		 * commit meets CONCURRENT_TRANSACTIONS while the coordinator writes
		 * the commit markers, and librdkafka retries after this backoff
		 * (100 ms by default: a floor under every transaction).  First, so
		 * that outbox.kafka_config may change it.
		 */
		{"retry.backoff.ms", "10"},
		{"enable.idempotence", "true"},
		{"linger.ms", "1"},
		{"batch.num.messages", "10000"},
		{"queue.buffering.max.messages", "1000000"},
		{"queue.buffering.max.kbytes", "1048576"},
		{"partitioner", "murmur2_random"},
		{"log.queue", "true"},
		{"client.id", "outbox-relay"},
		{"statistics.interval.ms", "5000"},
		/* the relay bounds each round itself (relay.c), and purges */
		{"message.timeout.ms", "0"},
	};

	if (transactional)
		return OutboxKafkaClientConf(defaults, lengthof(defaults), errmsg);
	return OutboxKafkaClientConf(defaults + 1, lengthof(defaults) - 1, errmsg);
}

/*
 * OutboxKafkaClientConf
 *		A client's configuration, the relay's producer's (producer_conf) or
 *		a subscription's consumer's (kafka_consumer.c): the caller's
 *		ndefaults defaults, then outbox.kafka_brokers, outbox.kafka_config
 *		and the secrets file as last read, so that both reach the cluster
 *		alike.  NULL and a
 *		message in *errmsg when one is refused.
 */
rd_kafka_conf_t *
OutboxKafkaClientConf(const char *const (*defaults)[2], int ndefaults, char **errmsg)
{
	rd_kafka_conf_t *conf;
	char		errstr[512];
	char	   *detail = NULL;
	int			i;

	if (secrets_error != NULL)
	{
		*errmsg = pstrdup(secrets_error);
		return NULL;
	}
	conf = rd_kafka_conf_new();
	/* the caller's defaults come first: outbox.kafka_config may change them */
	for (i = 0; i < ndefaults; i++)
		if (rd_kafka_conf_set(conf, defaults[i][0], defaults[i][1],
							  errstr, sizeof(errstr)) != RD_KAFKA_CONF_OK)
			elog(ERROR, "librdkafka refused default %s: %s", defaults[i][0], errstr);
	if (rd_kafka_conf_set(conf, "bootstrap.servers", outbox_kafka_brokers,
						  errstr, sizeof(errstr)) != RD_KAFKA_CONF_OK)
	{
		rd_kafka_conf_destroy(conf);
		*errmsg = psprintf("invalid outbox.kafka_brokers: %s", errstr);
		return NULL;
	}
	if (!apply_config(conf, outbox_kafka_config, false, &detail, NULL) ||
		!apply_config(conf, secrets_text ? secrets_text : "", true, &detail, NULL))
	{
		rd_kafka_conf_destroy(conf);
		*errmsg = detail;
		return NULL;
	}
	return conf;
}

/*
 * OutboxKafkaSecretsText
 *		The secrets file's text as last read ("" when none), to tell a
 *		client built from it is outdated; never shown.
 */
const char *
OutboxKafkaSecretsText(void)
{
	return secrets_text ? secrets_text : "";
}

/*
 * OutboxProducerCreate
 *		Relay: build an idempotent producer for the current settings and
 *		the secrets file as OutboxKafkaReadSecretsFile last read it.  It
 *		writes a byte to event_fd (non-blocking) whenever it has something
 *		for OutboxProducerServe; the caller waits on the other end.
 *		Returns NULL and a message in *errmsg (in the caller's memory
 *		context) on failure.  The result is malloc'd: it outlives memory
 *		contexts and is freed only by OutboxProducerDestroy.
 */
OutboxProducer *
OutboxProducerCreate(int event_fd, const char *transactional_id, char **errmsg)
{
	rd_kafka_conf_t *conf;
	OutboxProducer *producer;
	char		errstr[512];
	char		timeout[16];

	if (secrets_error != NULL)
	{
		*errmsg = pstrdup(secrets_error);
		return NULL;
	}
	if ((conf = producer_conf(transactional_id != NULL, errmsg)) == NULL)
		return NULL;
	producer = calloc(1, sizeof(OutboxProducer));
	if (producer == NULL ||
		(producer->built_brokers = strdup(outbox_kafka_brokers)) == NULL ||
		(producer->built_config = strdup(outbox_kafka_config)) == NULL ||
		(producer->built_secrets = strdup(secrets_text)) == NULL ||
		(transactional_id != NULL &&
		 (producer->built_txn_id = strdup(transactional_id)) == NULL))
	{
		rd_kafka_conf_destroy(conf);
		*errmsg = pstrdup("out of memory");
		goto fail;
	}
	/*
	 * The coordinator aborts a transaction older than its timeout and fences
	 * its producer: a page's rounds and commit, each bounded by
	 * outbox.delivery_timeout (relay.c), must end well within it.
	 */
	snprintf(timeout, sizeof(timeout), "%d",
			 Min(Max(OUTBOX_TXN_TIMEOUT_MS, 4 * outbox_delivery_timeout), OUTBOX_TXN_TIMEOUT_MAX_MS));
	if (transactional_id != NULL &&
		(rd_kafka_conf_set(conf, "transactional.id", transactional_id,
						   errstr, sizeof(errstr)) != RD_KAFKA_CONF_OK ||
		 rd_kafka_conf_set(conf, "transaction.timeout.ms", timeout,
						   errstr, sizeof(errstr)) != RD_KAFKA_CONF_OK ||
		 /* librdkafka wants messages to time out within the transaction */
		 rd_kafka_conf_set(conf, "message.timeout.ms", timeout,
						   errstr, sizeof(errstr)) != RD_KAFKA_CONF_OK))
	{
		rd_kafka_conf_destroy(conf);
		*errmsg = pstrdup(errstr);
		goto fail;
	}
	OutboxKafkaChoosePartitioner(producer, conf);
	rd_kafka_conf_set_opaque(conf, producer);
	rd_kafka_conf_set_dr_msg_cb(conf, delivery_report);
	rd_kafka_conf_set_error_cb(conf, error_report);
	rd_kafka_conf_set_log_cb(conf, log_report);
	rd_kafka_conf_set_stats_cb(conf, stats_report);
	producer->brokers_up = -1;

	producer->rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, sizeof(errstr));
	if (producer->rk == NULL)
	{
		/* rd_kafka_new destroys conf only on success */
		rd_kafka_conf_destroy(conf);
		/* the relay's message says what could not be made */
		*errmsg = pstrdup(errstr);
		goto fail;
	}
	rd_kafka_set_log_queue(producer->rk, NULL);
	{
		rd_kafka_queue_t *mainq = rd_kafka_queue_get_main(producer->rk);

		rd_kafka_queue_io_event_enable(mainq, event_fd, "1", 1);
		rd_kafka_queue_destroy(mainq);
	}
	return producer;

fail:
	free_producer_memo(producer);
	return NULL;
}

/*
 * OutboxProducerOutdated
 *		Whether outbox.kafka_brokers, outbox.kafka_config or the secrets file
 *		(as last read) changed since the producer was built.
 */
bool
OutboxProducerOutdated(const OutboxProducer *producer)
{
	return strcmp(producer->built_brokers, outbox_kafka_brokers) != 0 ||
		strcmp(producer->built_config, outbox_kafka_config) != 0 ||
		strcmp(producer->built_secrets, secrets_text) != 0;
}

/* the producer's transactional.id, NULL when it is not transactional */
const char *
OutboxProducerTransactionalId(const OutboxProducer *producer)
{
	return producer->built_txn_id;
}

/*
 * OutboxProducerDestroy
 *		Drop whatever is still queued and destroy the producer.  Events not
 *		acknowledged by now are simply re-sent by the next producer.
 */
void
OutboxProducerDestroy(OutboxProducer *producer)
{
	if (producer == NULL)
		return;
	rd_kafka_purge(producer->rk, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
	OutboxKafkaForgetTopics(producer);
	free(producer->topics);
	rd_kafka_destroy(producer->rk);
	free_producer_memo(producer);
}

/*
 * OutboxProducerSend
 *		Hand one event to librdkafka.  Its outcome arrives later in
 *		event->delivery_err through OutboxProducerServe; a message librdkafka
 *		refuses at once gets its error there immediately.
 */
void
OutboxProducerSend(OutboxProducer *producer, OutboxEvent *event)
{
	rd_kafka_headers_t *hdrs;
	rd_kafka_resp_err_t err;
	const char *values[OUTBOX_NUM_HEADERS];
	int			lens[OUTBOX_NUM_HEADERS];
	char		num[2][32];
	OutboxMessageShape shape;
	int			i;

	if (event->partition == OUTBOX_PARTITION_UNSET)
		(void) OutboxProducerPartition(producer, event, 0);

	if (!OutboxEventShapeFits(event))
	{
		/* too large for any broker anyway: quarantined as Kafka would */
		record_outcome(event, (int) RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE, true);
		return;
	}
	OutboxEventHeaderValues(event, values, lens, num);
	OutboxEventShape(event, &shape, true);
	hdrs = rd_kafka_headers_new(OUTBOX_NUM_HEADERS + shape.nextra + event->nheaders);
	for (i = 0; i < OUTBOX_NUM_HEADERS; i++)
		if (values[i] != NULL)
			rd_kafka_header_add(hdrs, OutboxHeaderNames[i], OutboxHeaderNameLengths[i],
								values[i], lens[i]);
	for (i = 0; i < shape.nextra; i++)
		rd_kafka_header_add(hdrs, shape.extra_names[i], -1, shape.extra_values[i], -1);
	for (i = 0; i < event->nheaders; i++)
	{
		/* a row emit() did not write may carry one: it would forge them */
		if (shape.nextra > 0 && OutboxHeaderIsCloudEvents(event->header_names[i]))
			continue;
		rd_kafka_header_add(hdrs, event->header_names[i], -1,
							event->header_values[i], -1);
	}

	event->delivery_err = OUTBOX_DELIVERY_PENDING;
	err = rd_kafka_producev(producer->rk,
							RD_KAFKA_V_TOPIC(event->topic),
							RD_KAFKA_V_PARTITION(event->partition >= 0 ? event->partition :
												 RD_KAFKA_PARTITION_UA),
							RD_KAFKA_V_KEY(event->key, OutboxEventKeyLength(event)),
							RD_KAFKA_V_VALUE((void *) shape.value, shape.value_len),
							RD_KAFKA_V_TIMESTAMP(event->timestamp_ms),
							RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
							RD_KAFKA_V_HEADERS(hdrs),
							RD_KAFKA_V_OPAQUE(event),
							RD_KAFKA_V_END);
	OutboxEventShapeFree(&shape);
	if (err != RD_KAFKA_RESP_ERR_NO_ERROR)
	{
		/* on failure the headers stay ours */
		rd_kafka_headers_destroy(hdrs);
		record_outcome(event, (int) err, true);
		return;
	}
	event->in_flight = true;
	if (!event->probe)
		producer->pending++;
}

/*
 * OutboxProducerServe
 *		Serve delivery reports, errors and logs; returns how many produced
 *		messages still await their report.
 */
int
OutboxProducerServe(OutboxProducer *producer)
{
	rd_kafka_poll(producer->rk, 0);
	return producer->pending;
}

/*
 * OutboxProducerSendNow
 *		Have librdkafka send what is queued now rather than after linger.ms:
 *		for a caller that has queued all it has.  librdkafka's one way is
 *		rd_kafka_flush, which waives linger.ms only while it runs and wakes
 *		the broker threads to see it: it runs for SEND_NOW_MS, which is
 *		linger.ms's default (a message queued that long goes at once
 *		anyway), and returns sooner once every report is in.  It serves the
 *		reports that arrive meanwhile, as OutboxProducerServe does.
 */
#define SEND_NOW_MS 1

void
OutboxProducerSendNow(OutboxProducer *producer)
{
	(void) rd_kafka_flush(producer->rk, SEND_NOW_MS);
}

/*
 * OutboxProducerPurge
 *		Give up on everything queued or in flight: their delivery reports
 *		arrive as purge errors at the next OutboxProducerServe.
 */
void
OutboxProducerPurge(OutboxProducer *producer)
{
	rd_kafka_purge(producer->rk, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
}

/*
 * OutboxProducerTakeError
 *		Copy the last recorded error, how many were recorded since the
 *		previous call and how many of those were of the fatal class (a
 *		refused login or TLS handshake); false when there was none.
 */
bool
OutboxProducerTakeError(OutboxProducer *producer, char *buf, size_t len, int *count,
						int *fatal)
{
	if (producer->error_count == 0)
		return false;
	strlcpy(buf, producer->error, len);
	*count = producer->error_count;
	*fatal = producer->fatal_count;
	producer->error_count = 0;
	producer->fatal_count = 0;
	return true;
}

/*
 * OutboxProducerIsFatal
 *		Whether the producer raised a fatal error (it must be rebuilt).
 */
bool
OutboxProducerIsFatal(OutboxProducer *producer, char *buf, size_t len)
{
	return rd_kafka_fatal_error(producer->rk, buf, len) != RD_KAFKA_RESP_ERR_NO_ERROR;
}

