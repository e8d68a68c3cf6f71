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
 *	bare_producer BROKERS - messages FILE
 *		The relay's messages, from memory: FILE (COPY's text format, as
 *		test/bench/bench_drain.py writes it from outbox.events) holds per
 *		line the topic, key, value and the relay's ten header values in
 *		the order of src/kafka/message.c (\N: not sent).  Every line is
 *		read into memory first; then each is produced, idempotent, with
 *		its key and headers, as fast as the cluster takes them, and
 *		"produced N in S s" is printed once every one is acknowledged.
 *
 *-------------------------------------------------------------------------
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include <malloc.h>

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
		{"partitioner", "murmur2_random"},
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
produce_headers(rd_kafka_t *rk, const char *topic, const char *key, size_t keylen,
				const char *value, size_t len, rd_kafka_headers_t *hdrs)
{
	rd_kafka_resp_err_t err;

	for (;;)
	{
		err = hdrs == NULL ?
			rd_kafka_producev(rk, RD_KAFKA_V_TOPIC(topic),
							  RD_KAFKA_V_KEY(key, keylen),
							  RD_KAFKA_V_VALUE((void *) value, len),
							  RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
							  RD_KAFKA_V_END) :
			rd_kafka_producev(rk, RD_KAFKA_V_TOPIC(topic),
							  RD_KAFKA_V_KEY(key, keylen),
							  RD_KAFKA_V_VALUE((void *) value, len),
							  RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
							  RD_KAFKA_V_HEADERS(hdrs),
							  RD_KAFKA_V_END);
		if (err != RD_KAFKA_RESP_ERR__QUEUE_FULL)
			break;
		rd_kafka_poll(rk, 10);
	}
	if (err)
		die("produce", rd_kafka_err2str(err));
	pending++;
}

static void
produce(rd_kafka_t *rk, const char *topic, const char *key, size_t keylen,
		const char *value, size_t len)
{
	produce_headers(rk, topic, key, keylen, value, len, NULL);
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

/* wait for every delivery report, say how long count took, and close */
static void
finish(rd_kafka_t *rk, long count, double start)
{
	while (pending > 0)
		rd_kafka_poll(rk, 100);
	printf("produced %ld in %.3f s, %ld failed\n", count, mono_s() - start, failed);
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
	finish(rk, count, start);
	free(value);
}

/* the relay's own headers, in the order of src/kafka/message.c */
static const char *const header_names[] = {
	"id", "event_type", "aggregate_type", "aggregate_id", "seq",
	"schema_version", "occurred_at", "traceparent", "tenant", "origin",
};
#define NHEADERS (sizeof(header_names) / sizeof(header_names[0]))
#define NFIELDS (3 + NHEADERS)

/* one line of the message file: its fields, unescaped in place */
typedef struct Line
{
	char	   *field[NFIELDS];
	size_t		len[NFIELDS];
} Line;

/* undo COPY's text escapes (\\, \t, \n, \r) in s[0..len); returns the new length */
static size_t
unescape(char *s, size_t len)
{
	size_t		in,
				out = 0;

	for (in = 0; in < len; in++)
	{
		char		c = s[in];

		if (c == '\\' && in + 1 < len)
		{
			c = s[++in];
			c = c == 't' ? '\t' : c == 'n' ? '\n' : c == 'r' ? '\r' : c;
		}
		s[out++] = c;
	}
	return out;
}

/* every line of path, split into fields; *count gets how many */
static Line *
read_lines(const char *path, long *count)
{
	FILE	   *f = fopen(path, "r");
	char	   *buf = NULL;
	size_t		cap = 0;
	ssize_t		n;
	long		size = 1024;
	Line	   *lines = malloc(sizeof(Line) * size);

	if (f == NULL || lines == NULL)
		die(path, "cannot open, or out of memory");
	*count = 0;
	while ((n = getline(&buf, &cap, f)) > 0)
	{
		char	   *p = strndup(buf, (size_t) (buf[n - 1] == '\n' ? n - 1 : n));
		Line	   *l;

		if (*count == size && (lines = realloc(lines, sizeof(Line) * (size *= 2))) == NULL)
			die("realloc", "out of memory");
		l = &lines[(*count)++];
		for (size_t i = 0; i < NFIELDS; i++)
		{
			char	   *tab = strchr(p, '\t');

			if (tab == NULL && i + 1 < NFIELDS)
				die(path, "a line has fewer fields than topic, key, value and ten headers");
			if (tab)
				*tab = '\0';
			l->field[i] = strcmp(p, "\\N") == 0 ? NULL : p;
			l->len[i] = l->field[i] ? unescape(p, strlen(p)) : 0;
			p = tab ? tab + 1 : p + strlen(p);
		}
	}
	free(buf);
	fclose(f);
	return lines;
}

/* every message of path, from memory, as fast as the cluster takes them */
static void
messages(const char *brokers, const char *path)
{
	long		count;
	Line	   *lines = read_lines(path, &count);
	rd_kafka_t *rk = make_producer(brokers, NULL);
	double		start;

	/* warm up: the topics' metadata and leaders, as the relay has them */
	produce(rk, lines[0].field[0], "warm", 4, "{}", 2);
	rd_kafka_flush(rk, 60000);
	pending = 0;
	start = mono_s();
	for (long i = 0; i < count; i++)
	{
		Line	   *l = &lines[i];
		rd_kafka_headers_t *hdrs = rd_kafka_headers_new(NHEADERS);

		for (size_t h = 0; h < NHEADERS; h++)
			if (l->field[3 + h])
				rd_kafka_header_add(hdrs, header_names[h], -1, l->field[3 + h],
									(ssize_t) l->len[3 + h]);
		produce_headers(rk, l->field[0], l->field[1], l->len[1], l->field[2], l->len[2], hdrs);
		if (i % 1000 == 0)
			rd_kafka_poll(rk, 0);
	}
	finish(rk, count, start);
}

int
main(int argc, char **argv)
{
	/* malloc tuned as the relay's (OutboxMallocKeep, src/base/compat.h) */
	mallopt(M_TRIM_THRESHOLD, 64 * 1024 * 1024);
	mallopt(M_MMAP_THRESHOLD, 64 * 1024 * 1024);
	mallopt(M_MXFAST, 0);

	if ((argc == 7 || argc == 8) && strcmp(argv[3], "tick") == 0)
		tick(argv[1], argv[2], atof(argv[4]), atof(argv[5]), argv[6],
			 argc == 8 ? argv[7] : NULL);
	else if (argc == 7 && strcmp(argv[3], "drain") == 0)
		drain(argv[1], argv[2], atol(argv[4]), atol(argv[5]), atol(argv[6]));
	else if (argc == 5 && strcmp(argv[3], "messages") == 0)
		messages(argv[1], argv[4]);
	else
	{
		fprintf(stderr, "usage: bare_producer BROKERS TOPIC tick RATE SECONDS idempotent|transactional [MARKER_TOPIC]\n"
				"       bare_producer BROKERS TOPIC drain COUNT BYTES KEYS\n"
				"       bare_producer BROKERS - messages FILE\n");
		return 2;
	}
	return failed ? 1 : 0;
}
