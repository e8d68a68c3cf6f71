/*-------------------------------------------------------------------------
 *
 * store/store_undelivered.c
 *		What dropping the extension would lose: the committed events not
 *		delivered to Kafka, counted for the utility hook in a user backend.
 *
 * Invariants:
 *	- Runs in the caller's transaction, never starts, commits or aborts
 *	  one; connects to SPI and disconnects; search_path is pinned around
 *	  the statement and every name in it is qualified.
 *	- The log is locked against writers (SHARE) before it is counted, with
 *	  a snapshot taken after the lock, so no event committed between the
 *	  count and the drop goes uncounted (at READ COMMITTED; a transaction
 *	  snapshot taken earlier sees what it saw).
 *	- Undelivered: an event whose transaction the relay's progress does not
 *	  count delivered (neither in its delivered snapshot nor in the
 *	  acknowledged part of its batch), a restored event the relay has not
 *	  judged yet, a held event, and a dead letter neither replayed nor
 *	  discarded.  Events of the caller's own transaction never committed:
 *	  they go with it.
 *	- The tables are looked for in the extension's schema, whatever its
 *	  name now; one that is not there (a version before it) counts nothing.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/namespace.h"
#include "executor/spi.h"
#include "lib/stringinfo.h"
#include "storage/lmgr.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"

#include "base/base.h"
#include "store/store.h"
#include "store/store_sql.h"

/*
 * Whether event e is delivered according to the relay's progress row:
 * NULL (counted undelivered) when there is no row or no delivered snapshot.
 */
#define DELIVERED_SQL \
	"(SELECT pg_catalog.pg_visible_in_snapshot(e.txid, p.prev_snapshot)" \
	"     OR coalesce(e.id OPERATOR(pg_catalog.<=) p.batch_last_id" \
	"        AND pg_catalog.pg_visible_in_snapshot(e.txid, p.batch_snapshot), false)" \
	"   FROM %s.relay_progress p WHERE p.relay OPERATOR(pg_catalog.=) 'default')"

/* below its delivered snapshot's xmin every transaction is delivered */
#define DELIVERED_BELOW_SQL \
	"(SELECT pg_catalog.pg_snapshot_xmin(p.prev_snapshot)" \
	"   FROM %s.relay_progress p WHERE p.relay OPERATOR(pg_catalog.=) 'default')"

static bool
has_table(Oid nsp, const char *name)
{
	return OidIsValid(get_relname_relid(name, nsp));
}

/*
 * append_waiting
 *		The count of events the relay has not delivered, as a scalar
 *		subquery: through the txid index from the delivered snapshot's xmin.
 */
static void
append_waiting(StringInfo sql, Oid nsp, const char *schema)
{
	if (!has_table(nsp, "events"))
	{
		appendStringInfoString(sql, "0::pg_catalog.int8");
		return;
	}
	appendStringInfo(sql,
					 "(SELECT pg_catalog.count(*) FROM %s.events e"
					 " WHERE e.txid IS DISTINCT FROM pg_catalog.pg_current_xact_id_if_assigned()",
					 schema);
	if (has_table(nsp, "relay_progress"))
	{
		appendStringInfoString(sql, " AND e.txid OPERATOR(pg_catalog.>=) coalesce(");
		appendStringInfo(sql, DELIVERED_BELOW_SQL, schema);
		appendStringInfoString(sql, ", '0'::pg_catalog.xid8) AND NOT coalesce(");
		appendStringInfo(sql, DELIVERED_SQL, schema);
		appendStringInfoString(sql, ", false)");
	}
	appendStringInfoChar(sql, ')');
	if (has_table(nsp, "restored_events"))
		appendStringInfo(sql,
						 " OPERATOR(pg_catalog.+) (SELECT pg_catalog.count(*) FROM %s.restored_events)",
						 schema);
}

/*
 * OutboxStoreCountUndelivered
 *		Count what dropping the extension, whose schema is nsp, would delete
 *		undelivered: into *counts.  The caller may drop the extension.
 */
void
OutboxStoreCountUndelivered(Oid nsp, OutboxUndelivered *counts)
{
	const char *schema = quote_identifier(get_namespace_name(nsp));
	Oid			events = get_relname_relid("events", nsp);
	StringInfoData sql;
	HeapTuple	tup;
	bool		isnull;
	int			level;

	if (OidIsValid(events))
		LockRelationOid(events, ShareLock);

	initStringInfo(&sql);
	appendStringInfoString(&sql, "SELECT ");
	append_waiting(&sql, nsp, schema);
	if (has_table(nsp, "held"))
		appendStringInfo(&sql, ", (SELECT pg_catalog.count(*) FROM %s.held)", schema);
	else
		appendStringInfoString(&sql, ", 0::pg_catalog.int8");
	if (has_table(nsp, "dead_letters"))
		appendStringInfo(&sql,
						 ", (SELECT pg_catalog.count(*) FROM %s.dead_letters d"
						 " WHERE d.state OPERATOR(pg_catalog.=) ANY (ARRAY['quarantined', 'parked', 'replaying']))",
						 schema);
	else
		appendStringInfoString(&sql, ", 0::pg_catalog.int8");

	level = OutboxPinSearchPath();
	SPI_connect();
	/* not read-only: a snapshot taken now, after the lock */
	OutboxStoreRun(sql.data, false, 1, SPI_OK_SELECT, "count the undelivered events");
	if (SPI_processed != 1)
		elog(ERROR, "could not count the undelivered events: %d rows", (int) SPI_processed);
	tup = SPI_tuptable->vals[0];
	counts->waiting = DatumGetInt64(SPI_getbinval(tup, SPI_tuptable->tupdesc, 1, &isnull));
	counts->held = DatumGetInt64(SPI_getbinval(tup, SPI_tuptable->tupdesc, 2, &isnull));
	counts->dead = DatumGetInt64(SPI_getbinval(tup, SPI_tuptable->tupdesc, 3, &isnull));
	SPI_finish();
	OutboxUnpinSearchPath(level);
	pfree(sql.data);
}
