/*-------------------------------------------------------------------------
 *
 * relay/relay_marker.c
 *		outbox.delivery = 'exactly_once': the progress record each Kafka
 *		transaction carries, written and read back (relay_txn.c applies it).
 *
 * Invariants:
 *	- A record is JSON in one fixed form, written here and parsed here
 *	  strictly: anything else is not a record (it is hostile input: the
 *	  progress topic is anyone's that may write to it).
 *	- A record is applied only where it fits this database: written by a
 *	  relay of this cluster, its snapshot sane for it, its WAL position in
 *	  this database's history, its position after the database's own.
 *
 * No SQL here and no librdkafka call.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/timeline.h"
#include "access/transam.h"
#include "access/xlog.h"
#include "lib/stringinfo.h"
#include "utils/json.h"

#include "relay/relay_state.h"
#include "base/base.h"
#include "kafka/kafka.h"

#define MARKER_SNAPSHOT_MAX		65536

/* a decimal int64 at *p, moving p past it; false when there is none */
static bool
parse_int64(const char **p, int64 *out)
{
	char	   *end;

	if (**p < '0' || **p > '9')
		return false;
	errno = 0;
	*out = strtoi64(*p, &end, 10);
	if (errno != 0)
		return false;
	*p = end;
	return true;
}

/* the text after "key": in the record, or NULL */
static const char *
field(const char *value, const char *key)
{
	char		quoted[64];
	const char *p;

	snprintf(quoted, sizeof(quoted), "\"%s\":", key);
	p = strstr(value, quoted);
	return p ? p + strlen(quoted) : NULL;
}

/* the record was written by a relay of this cluster (or its standby's) */
static bool
same_system(const char *value)
{
	char		mine[48];
	const char *p = field(value, "system_identifier");

	snprintf(mine, sizeof(mine), "\"" UINT64_FORMAT "\"", GetSystemIdentifier());
	return p != NULL && strncmp(p, mine, strlen(mine)) == 0;
}

/* the record's "timeline" and "lsn" ("X/X", as pg_lsn writes it) */
static bool
parse_position(const char *value, RelayMarker *m)
{
	const char *p;
	int64		tli;
	unsigned int hi,
				lo;
	int			used = 0;

	if ((p = field(value, "timeline")) == NULL || !parse_int64(&p, &tli) ||
		tli <= 0 || tli > PG_UINT32_MAX ||
		(p = field(value, "lsn")) == NULL ||
		sscanf(p, "\"%8X/%8X\"%n", &hi, &lo, &used) != 2 || used == 0)
		return false;
	m->timeline = (TimeLineID) tli;
	m->lsn = ((uint64) hi << 32) | lo;
	return true;
}

/*
 * OutboxRelayParseMarker
 *		A progress record as OutboxRelayMarkerValue writes it, strictly:
 *		false for anything else.
 */
bool
OutboxRelayParseMarker(const char *value, RelayMarker *m)
{
	const char *p;
	int64		events;
	size_t		len;

	memset(m, 0, sizeof(*m));
	if (strncmp(value, "{\"version\":1,", 13) != 0 ||
		(p = field(value, "transaction")) == NULL || !parse_int64(&p, &m->transaction) ||
		(p = field(value, "events")) == NULL || !parse_int64(&p, &events) ||
		events > INT_MAX || m->transaction > PG_INT64_MAX / 2 ||
		(p = field(value, "kind")) == NULL || !same_system(value))
		return false;
	m->events = (int) events;
	if (!parse_position(value, m))
		return false;
	if (strncmp(p, "\"replay\"", 8) == 0)
	{
		m->replay = true;
		return (p = field(value, "first_position")) != NULL && parse_int64(&p, &m->first_id) &&
			(p = field(value, "last_position")) != NULL && parse_int64(&p, &m->last_id);
	}
	if (strncmp(p, "\"batch\"", 7) != 0 ||
		(p = field(value, "last_id")) == NULL || !parse_int64(&p, &m->last_id) ||
		(p = field(value, "done")) == NULL)
		return false;
	m->done = strncmp(p, "true", 4) == 0;
	if (!m->done && strncmp(p, "false", 5) != 0)
		return false;
	if ((p = field(value, "snapshot")) == NULL || *p++ != '"')
		return false;
	len = strspn(p, "0123456789:,");
	if (len == 0 || len > MARKER_SNAPSHOT_MAX || p[len] != '"')
		return false;
	m->snapshot = pnstrdup(p, len);
	return true;
}

/*
 * OutboxRelayMarkerValue
 *		The progress record of pg's transaction: its number and the page's
 *		position in the relay's own terms, with the WAL it was read from
 *		(palloc'd JSON).
 */
char *
OutboxRelayMarkerValue(Relay *r, RelayPage *pg, int64 transaction)
{
	StringInfoData buf;
	int			delivered = 0;
	int			i;

	/* what the transaction delivers once it commits: all but the dead */
	for (i = 0; i < pg->n; i++)
		if (pg->events[i].disposition == OUTBOX_EVENT_DELIVERED ||
			pg->events[i].disposition == OUTBOX_EVENT_PENDING)
			delivered++;
	initStringInfo(&buf);
	appendStringInfo(&buf, "{\"version\":1,\"transaction\":" INT64_FORMAT ",\"events\":%d,",
					 transaction, delivered);
	if (pg->replay)
		appendStringInfo(&buf, "\"kind\":\"replay\",\"first_position\":" INT64_FORMAT
						 ",\"last_position\":" INT64_FORMAT ",",
						 pg->n > 0 ? pg->events[0].queue_position : 0,
						 pg->n > 0 ? pg->events[pg->n - 1].queue_position : 0);
	else
		appendStringInfo(&buf, "\"kind\":\"batch\",\"last_id\":" INT64_FORMAT ",\"done\":%s,"
						 "\"snapshot\":\"%s\",",
						 pg->last_id, pg->done ? "true" : "false", pg->cur);
	appendStringInfo(&buf, "\"timeline\":%u,\"lsn\":\"%X/%X\",\"system_identifier\":\""
					 UINT64_FORMAT "\",\"database\":",
					 GetWALInsertionTimeLine(), LSN_FORMAT_ARGS(pg->standby_lsn),
					 GetSystemIdentifier());
	escape_json(&buf, r->dbname);
	appendStringInfoChar(&buf, '}');
	return buf.data;
}

/*
 * snapshot_sane
 *		A snapshot's text that pg_snapshot takes, and that names no
 *		transaction this database has not begun: xmin <= xip < xmax <= the
 *		next transaction id.
 */
static bool
snapshot_sane(const char *text)
{
	uint64		next = U64FromFullTransactionId(ReadNextFullTransactionId());
	uint64		xmin,
				xmax,
				x = 0;
	char	   *p;

	errno = 0;
	xmin = strtou64(text, &p, 10);
	if (*p != ':' || errno != 0)
		return false;
	xmax = strtou64(p + 1, &p, 10);
	if (*p != ':' || errno != 0 || xmin > xmax || xmax > next || xmin == 0)
		return false;
	p++;
	while (*p != '\0')
	{
		uint64		last = x;

		x = strtou64(p, &p, 10);
		/* ascending, as pg_snapshot's input wants them */
		if (errno != 0 || x < xmin || x >= xmax || (*p != ',' && *p != '\0') ||
			(last != 0 && x <= last))
			return false;
		if (*p == ',')
			p++;
	}
	return true;
}

/*
 * marker_in_history
 *		Whether this database has every commit the record's page saw: the
 *		page was read on its own timeline, or on an earlier one of its
 *		history before this one branched off.  A promoted standby that had
 *		not replayed that far lacks those transactions, and its own may
 *		reuse their transaction ids: a record from that WAL is not applied.
 */
static bool
marker_in_history(const RelayMarker *m)
{
	TimeLineID	tli = GetWALInsertionTimeLine();
	List	   *history;

	if (m->timeline == tli)
		return true;
	if (m->timeline > tli)
		return false;
	history = readTimeLineHistory(tli);
	return tliInHistory(m->timeline, history) &&
		m->lsn <= tliSwitchPoint(m->timeline, history, NULL);
}

/*
 * OutboxRelayMarkerFits
 *		Whether a batch record can describe the page after the database's
 *		position: the batch under way, further on; or, between batches, a
 *		snapshot no older than the last batch's.  A record that does not
 *		fit is not applied.
 */
bool
OutboxRelayMarkerFits(Relay *r, const RelayMarker *m)
{
	uint64		xmin_new,
				xmin_old;

	if (!marker_in_history(m))
		return false;
	if (m->replay)
		return true;
	if (!snapshot_sane(m->snapshot))
		return false;
	if (r->batch.cur != NULL)
		return strcmp(m->snapshot, r->batch.cur) == 0 && m->last_id > r->batch.last_id;
	if (r->batch.prev == NULL)
		return true;
	xmin_new = strtou64(m->snapshot, NULL, 10);
	xmin_old = strtou64(r->batch.prev, NULL, 10);
	return xmin_new >= xmin_old;
}
