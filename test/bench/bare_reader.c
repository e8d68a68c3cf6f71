/*-------------------------------------------------------------------------
 *
 * bare_reader.c
 *		The benchmark's read limit: how fast PostgreSQL returns the relay's
 *		rows to a client that does nothing with them.  It reads outbox.events
 *		as the relay pages it (the same columns, in id order, pages of
 *		outbox.batch_size rows after the last id read), in text, and throws
 *		each page away.  Benchmark tool only, never part of the extension.
 *
 * usage:
 *	bare_reader CONNINFO PAGE_ROWS [AFTER_ID]
 *		Reads every row of outbox.events (past AFTER_ID when given); prints
 *		"read N in S s".
 *
 *-------------------------------------------------------------------------
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <libpq-fe.h>

/* the columns the relay reads (src/store/store_sql.h, EVENT_COLUMNS) */
#define PAGE_SQL \
	"SELECT e.id, e.event_id, e.aggregate_type, e.aggregate_id, e.seq," \
	" e.event_type, e.schema_version, e.topic, e.key, e.payload, e.headers," \
	" e.tenant, e.traceparent, e.occurred_at, e.created_at" \
	" FROM outbox.events e WHERE e.id > $1 ORDER BY e.id LIMIT $2"

static double
mono_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void
die(PGconn *conn, const char *what)
{
	fprintf(stderr, "bare_reader: %s: %s", what, PQerrorMessage(conn));
	exit(1);
}

int
main(int argc, char **argv)
{
	PGconn	   *conn;
	PGresult   *res;
	char		last[32] = "0";
	long		rows = 0;
	double		start;

	if (argc != 3 && argc != 4)
	{
		fprintf(stderr, "usage: bare_reader CONNINFO PAGE_ROWS [AFTER_ID]\n");
		return 2;
	}
	if (argc == 4)
		snprintf(last, sizeof(last), "%s", argv[3]);
	conn = PQconnectdb(argv[1]);
	if (PQstatus(conn) != CONNECTION_OK)
		die(conn, "connect");
	res = PQprepare(conn, "page", PAGE_SQL, 2, NULL);
	if (PQresultStatus(res) != PGRES_COMMAND_OK)
		die(conn, "prepare");
	PQclear(res);
	start = mono_s();
	for (;;)
	{
		const char *params[2] = {last, argv[2]};
		int			n;

		res = PQexecPrepared(conn, "page", 2, params, NULL, NULL, 0);
		if (PQresultStatus(res) != PGRES_TUPLES_OK)
			die(conn, "page");
		n = PQntuples(res);
		if (n == 0)
			break;
		rows += n;
		snprintf(last, sizeof(last), "%s", PQgetvalue(res, n - 1, 0));
		PQclear(res);
	}
	PQclear(res);
	printf("read %ld in %.3f s\n", rows, mono_s() - start);
	PQfinish(conn);
	return 0;
}
