/*-------------------------------------------------------------------------
 *
 * baseline_relay.c
 *		The benchmark baseline: a polling outbox publisher as teams write it
 *		by hand.  Benchmark tool only, never part of the extension.
 *
 * Loop: BEGIN; SELECT ... FROM bench.plain_outbox WHERE published_at IS NULL
 * ORDER BY id LIMIT n FOR UPDATE SKIP LOCKED; produce every row with an
 * idempotent librdkafka producer (same key, value and headers as outbox);
 * wait for every delivery report; UPDATE ... SET published_at = now();
 * COMMIT.  When a poll finds nothing it sleeps poll_ms.
 *
 * usage: baseline_relay CONNINFO BROKERS BATCH POLL_MS (drain|SECONDS)
 *	drain: exit once a poll finds nothing; prints "published N in S s".
 *
 *-------------------------------------------------------------------------
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <libpq-fe.h>
#include <librdkafka/rdkafka.h>

static int	pending = 0;
static int	failed = 0;

static double
now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void
on_delivery(rd_kafka_t *rk, const rd_kafka_message_t *msg, void *opaque)
{
	if (msg->err)
		failed++;
	pending--;
}

static void
die(const char *what, const char *detail)
{
	fprintf(stderr, "baseline_relay: %s: %s\n", what, detail);
	exit(1);
}

static PGresult *
exec_ok(PGconn *conn, const char *sql, ExecStatusType want)
{
	PGresult   *res = PQexec(conn, sql);

	if (PQresultStatus(res) != want)
		die(sql, PQerrorMessage(conn));
	return res;
}

int
main(int argc, char **argv)
{
	PGconn	   *conn;
	rd_kafka_conf_t *conf;
	rd_kafka_t *rk;
	char		errstr[512];
	char		select_sql[512];
	int			batch;
	int			poll_ms;
	int			drain;
	double		until;
	double		started;
	long		published = 0;

	if (argc != 6)
	{
		fprintf(stderr, "usage: baseline_relay CONNINFO BROKERS BATCH POLL_MS (drain|SECONDS)\n");
		return 2;
	}
	batch = atoi(argv[3]);
	poll_ms = atoi(argv[4]);
	drain = strcmp(argv[5], "drain") == 0;
	until = drain ? 0 : now_s() + atof(argv[5]);

	conn = PQconnectdb(argv[1]);
	if (PQstatus(conn) != CONNECTION_OK)
		die("connect", PQerrorMessage(conn));

	conf = rd_kafka_conf_new();
	if (rd_kafka_conf_set(conf, "bootstrap.servers", argv[2], errstr, sizeof(errstr)) ||
		rd_kafka_conf_set(conf, "enable.idempotence", "true", errstr, sizeof(errstr)) ||
		rd_kafka_conf_set(conf, "linger.ms", "5", errstr, sizeof(errstr)) ||
		rd_kafka_conf_set(conf, "queue.buffering.max.messages", "1000000", errstr, sizeof(errstr)) ||
		rd_kafka_conf_set(conf, "partitioner", "murmur2_random", errstr, sizeof(errstr)))
		die("config", errstr);
	rd_kafka_conf_set_dr_msg_cb(conf, on_delivery);
	rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, sizeof(errstr));
	if (rk == NULL)
		die("producer", errstr);

	snprintf(select_sql, sizeof(select_sql),
			 "SELECT id, event_id, aggregate_type, aggregate_id, seq, event_type,"
			 " schema_version, topic, key, payload::text, occurred_at"
			 " FROM bench.plain_outbox WHERE published_at IS NULL"
			 " ORDER BY id LIMIT %d FOR UPDATE SKIP LOCKED", batch);

	started = now_s();
	for (;;)
	{
		PGresult   *res;
		int			n;
		int			i;
		char	   *ids;
		size_t		idlen = 0;

		exec_ok(conn, "BEGIN", PGRES_COMMAND_OK);
		res = exec_ok(conn, select_sql, PGRES_TUPLES_OK);
		n = PQntuples(res);
		if (n == 0)
		{
			PQclear(res);
			exec_ok(conn, "COMMIT", PGRES_COMMAND_OK);
			if (drain || now_s() >= until)
				break;
			usleep(poll_ms * 1000);
			continue;
		}
		ids = malloc((size_t) n * 24 + 16);
		ids[idlen++] = '{';
		for (i = 0; i < n; i++)
		{
			rd_kafka_headers_t *h = rd_kafka_headers_new(8);
			const char *payload = PQgetvalue(res, i, 9);
			const char *key = PQgetvalue(res, i, 8);
			rd_kafka_resp_err_t err;

			rd_kafka_header_add(h, "id", -1, PQgetvalue(res, i, 1), -1);
			rd_kafka_header_add(h, "event_type", -1, PQgetvalue(res, i, 5), -1);
			rd_kafka_header_add(h, "aggregate_type", -1, PQgetvalue(res, i, 2), -1);
			rd_kafka_header_add(h, "aggregate_id", -1, PQgetvalue(res, i, 3), -1);
			if (!PQgetisnull(res, i, 4))
				rd_kafka_header_add(h, "seq", -1, PQgetvalue(res, i, 4), -1);
			rd_kafka_header_add(h, "schema_version", -1, PQgetvalue(res, i, 6), -1);
			rd_kafka_header_add(h, "occurred_at", -1, PQgetvalue(res, i, 10), -1);
			do
			{
				err = rd_kafka_producev(rk,
										RD_KAFKA_V_TOPIC(PQgetvalue(res, i, 7)),
										RD_KAFKA_V_KEY(key, strlen(key)),
										RD_KAFKA_V_VALUE((void *) payload, strlen(payload)),
										RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
										RD_KAFKA_V_HEADERS(h),
										RD_KAFKA_V_END);
				if (err == RD_KAFKA_RESP_ERR__QUEUE_FULL)
					rd_kafka_poll(rk, 10);
			} while (err == RD_KAFKA_RESP_ERR__QUEUE_FULL);
			if (err)
				die("produce", rd_kafka_err2str(err));
			pending++;
			idlen += sprintf(ids + idlen, "%s%s", i ? "," : "", PQgetvalue(res, i, 0));
		}
		ids[idlen++] = '}';
		ids[idlen] = '\0';
		PQclear(res);

		/* the page counts as published only when every ack is in */
		while (pending > 0)
			rd_kafka_poll(rk, 100);
		if (failed)
			die("delivery", "a message failed");

		{
			const char *params[1] = {ids};

			res = PQexecParams(conn,
							   "UPDATE bench.plain_outbox SET published_at = now() WHERE id = ANY($1::bigint[])",
							   1, NULL, params, NULL, NULL, 0);
			if (PQresultStatus(res) != PGRES_COMMAND_OK)
				die("update", PQerrorMessage(conn));
			PQclear(res);
		}
		free(ids);
		exec_ok(conn, "COMMIT", PGRES_COMMAND_OK);
		published += n;
	}
	printf("published %ld in %.3f s\n", published, now_s() - started);
	rd_kafka_destroy(rk);
	PQfinish(conn);
	return 0;
}
