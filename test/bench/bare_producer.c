/*-------------------------------------------------------------------------
 *
 * bare_producer.c
 *		The benchmark's floor: a librdkafka producer that sends from memory,
 *		with no database, using the producer settings the relay uses.  What it
 *		measures is what Kafka and librdkafka cost on their own, so the
 *		benchmark can say how much of the relay's figure is the protocol.
 *		Benchmark tool only, never part of the extension.
 *
 * usage:
 *	bare_producer BROKERS TOPIC tick RATE SECONDS MODE [MARKER_TOPIC]
 *		Messages {"t": <microseconds since 1970>} at RATE per second for
 *		SECONDS, t being when the message was due (a consumer's arrival time
 *		minus t is the latency a late producer adds too).  MODE idempotent
 *		sends each at once; MODE transactional sends, in one transaction,
 *		every message due when the transaction begins, as the relay sends a
 *		page, plus one record to MARKER_TOPIC when given (the relay's progress
 *		record), and commits before the next.
 *	bare_producer BROKERS TOPIC drain COUNT BYTES KEYS
 *		COUNT messages of BYTES bytes over KEYS keys, idempotent, as fast as
 *		the cluster takes them; prints "produced N in S s".
 *
 *-------------------------------------------------------------------------
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include <librdkafka/rdkafka.h>

static long pending = 0;
static long failed = 0;

static double
mono_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static long long
wall_us(void)
{
	struct timeval tv;

	gettimeofday(&tv, NULL);
	return (long long) tv.tv_sec * 1000000 + tv.tv_usec;
}

static void
die(const char *what, const char *detail)
{
	fprintf(stderr, "bare_producer: %s: %s\n", what, detail);
	exit(1);
}

static void
on_delivery(rd_kafka_t *rk, const rd_kafka_message_t *msg, void *opaque)
{
	if (msg->err)
		failed++;
	pending--;
}

static void
check_txn(const char *what, rd_kafka_error_t *error)
{
	if (error != NULL)
		die(what, rd_kafka_error_string(error));
}

/* a producer with the relay's settings (src/kafka/producer.c) */
static rd_kafka_t *
make_producer(const char *brokers, const char *txn_id)
{
	char		err[512];
	rd_kafka_conf_t *conf = rd_kafka_conf_new();
	const char *const settings[][2] = {
		{"bootstrap.servers", brokers},
		{"enable.idempotence", "true"},
		{"acks", "all"},
		{"linger.ms", "1"},
		{"batch.num.messages", "10000"},
		{"queue.buffering.max.messages", "1000000"},
		{"queue.buffering.max.kbytes", "1048576"},
		{"retry.backoff.ms", txn_id ? "10" : "100"},
	};
	rd_kafka_t *rk;

	for (size_t i = 0; i < sizeof(settings) / sizeof(settings[0]); i++)
		if (rd_kafka_conf_set(conf, settings[i][0], settings[i][1], err, sizeof(err)) != RD_KAFKA_CONF_OK)
			die(settings[i][0], err);
	if (txn_id && rd_kafka_conf_set(conf, "transactional.id", txn_id, err, sizeof(err)) != RD_KAFKA_CONF_OK)
		die("transactional.id", err);
	rd_kafka_conf_set_dr_msg_cb(conf, on_delivery);
	rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof(err));
	if (rk == NULL)
		die("rd_kafka_new", err);
	if (txn_id)
		check_txn("init_transactions", rd_kafka_init_transactions(rk, 60000));
	return rk;
}

static void
produce(rd_kafka_t *rk, const char *topic, const char *key, size_t keylen,
		const char *value, size_t len)
{
	rd_kafka_resp_err_t err;

	for (;;)
	{
		err = rd_kafka_producev(rk, RD_KAFKA_V_TOPIC(topic),
								RD_KAFKA_V_KEY(key, keylen),
								RD_KAFKA_V_VALUE((void *) value, len),
								RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
								RD_KAFKA_V_END);
		if (err != RD_KAFKA_RESP_ERR__QUEUE_FULL)
			break;
		rd_kafka_poll(rk, 10);
	}
	if (err)
		die("produce", rd_kafka_err2str(err));
	pending++;
}

/* RATE messages a second for SECONDS; see the header */
static void
tick(const char *brokers, const char *topic, double rate, double secs,
	 const char *mode, const char *marker_topic)
{
	int			txn = strcmp(mode, "transactional") == 0;
	char		txn_id[64];
	rd_kafka_t *rk;
	double		start,
				end;
	long		due = 0,
				sent = 0,
				txns = 0;
	long long	start_us;

	if (!txn && strcmp(mode, "idempotent") != 0)
		die("mode", "idempotent or transactional");
	snprintf(txn_id, sizeof(txn_id), "bare-producer-%d", (int) getpid());
	rk = make_producer(brokers, txn ? txn_id : NULL);

	/*
	 * Warm up as the relay is before a measure: one message (no "t", which
	 * the consumer skips) fetches the topics' metadata and connects to
	 * their leaders and, transactional, finds the coordinator.
	 */
	if (txn)
		check_txn("begin_transaction", rd_kafka_begin_transaction(rk));
	produce(rk, topic, "warm", 4, "{}", 2);
	if (txn && marker_topic)
		produce(rk, marker_topic, txn_id, strlen(txn_id), "{}", 2);
	if (txn)
		check_txn("commit_transaction", rd_kafka_commit_transaction(rk, 60000));
	rd_kafka_flush(rk, 60000);
	start = mono_s();
	start_us = wall_us();
	end = start + secs;
	while (mono_s() < end)
	{
		char		value[64],
					key[32];
		double		now = mono_s();

		due = (long) ((now - start) * rate) + 1;
		if (sent >= due)
		{
			rd_kafka_poll(rk, 0);
			usleep((useconds_t) (((sent) / rate - (now - start)) * 1e6) + 1);
			continue;
		}
		if (txn)
			check_txn("begin_transaction", rd_kafka_begin_transaction(rk));
		for (; sent < due; sent++)
		{
			int			n = snprintf(value, sizeof(value), "{\"t\": %lld}",
									 start_us + (long long) (sent / rate * 1e6));
			int			k = snprintf(key, sizeof(key), "k-%ld", sent % 100);

			produce(rk, topic, key, (size_t) k, value, (size_t) n);
		}
		if (txn)
		{
			if (marker_topic)
				produce(rk, marker_topic, txn_id, strlen(txn_id), "{}", 2);
			check_txn("commit_transaction", rd_kafka_commit_transaction(rk, 60000));
			txns++;
		}
		else
			rd_kafka_poll(rk, 0);
	}
	rd_kafka_flush(rk, 60000);
	printf("sent %ld in %ld transactions, %ld failed\n", sent, txns, failed);
	rd_kafka_destroy(rk);
}

/* COUNT messages of BYTES bytes over KEYS keys, as fast as they go */
static void
drain(const char *brokers, const char *topic, long count, long bytes, long keys)
{
	rd_kafka_t *rk = make_producer(brokers, NULL);
	char	   *value = malloc((size_t) bytes);
	double		start;

	if (value == NULL)
		die("malloc", "out of memory");
	memset(value, 'x', (size_t) bytes);
	start = mono_s();
	for (long i = 0; i < count; i++)
	{
		char		key[32];
		int			k = snprintf(key, sizeof(key), "agg-%ld", i % keys);

		produce(rk, topic, key, (size_t) k, value, (size_t) bytes);
		if (i % 1000 == 0)
			rd_kafka_poll(rk, 0);
	}
	while (pending > 0)
		rd_kafka_poll(rk, 100);
	printf("produced %ld in %.3f s, %ld failed\n", count, mono_s() - start, failed);
	free(value);
	rd_kafka_destroy(rk);
}

int
main(int argc, char **argv)
{
	if ((argc == 7 || argc == 8) && strcmp(argv[3], "tick") == 0)
		tick(argv[1], argv[2], atof(argv[4]), atof(argv[5]), argv[6],
			 argc == 8 ? argv[7] : NULL);
	else if (argc == 7 && strcmp(argv[3], "drain") == 0)
		drain(argv[1], argv[2], atol(argv[4]), atol(argv[5]), atol(argv[6]));
	else
	{
		fprintf(stderr, "usage: bare_producer BROKERS TOPIC tick RATE SECONDS idempotent|transactional [MARKER_TOPIC]\n"
				"       bare_producer BROKERS TOPIC drain COUNT BYTES KEYS\n");
		return 2;
	}
	return failed ? 1 : 0;
}
