/*-------------------------------------------------------------------------
 *
 * store/store_sql.h
 *		What the relay's SQL files (store_batch.c, store_dead.c, store_upkeep.c,
 *		store_held.c) share among themselves; only they include it.  The
 *		rest of the extension sees only the OutboxStore functions declared
 *		in outbox.h.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_STORE_SQL_H
#define OUTBOX_STORE_SQL_H

#include "executor/spi.h"

#include "kafka/kafka.h"

extern void OutboxStoreRun(const char *sql, bool read_only, long count,
						   int expected, const char *what);
extern int64 OutboxStoreRunArgs(const char *sql, int nargs, Oid *types,
								Datum *values, int expected, const char *what);
extern HeapTuple OutboxStoreRow(const char *sql, const char *what);
extern int	OutboxStoreFetchEvents(Portal portal, int limit, int64 max_bytes,
								   OutboxEvent **events, MemoryContext cxt,
								   bool *cut);
extern int	OutboxStoreQueryEvents(const char *sql, int nargs, Oid *types,
								   Datum *values, bool read_only, int limit,
								   OutboxEvent **events, MemoryContext cxt,
								   const char *what);

/* store_event.c */
extern void OutboxStoreLockFirst(const char *relname);
extern bool OutboxStoreEventsHaveBytes(void);
extern const char *OutboxStoreEventSql(const char *sql, bool have_bytes);
extern void OutboxStoreDecodeEvent(HeapTuple tup, TupleDesc desc, OutboxEvent *ev);
extern int64 OutboxStoreEventBytes(const OutboxEvent *ev);

/*
 * The columns store_event.c's OutboxStoreDecodeEvent() reads, in its
 * order.  Values come back binary and are formatted in C: the payload's
 * JSON text straight into the page, the event id and occurred_at without
 * output functions.  EVENT_BYTES_COLUMNS, 1.8's, a database before 1.8
 * selects as NULLs (OutboxStoreEventSql).
 */
#define EVENT_BYTES_COLUMNS " e.payload_bytes, e.content_type"
#define EVENT_COLUMNS \
	"e.id, e.event_id, e.aggregate_type, e.aggregate_id, e.seq," \
	" e.event_type, e.schema_version, e.topic, e.key, e.payload, e.headers," \
	" e.tenant, e.traceparent, e.occurred_at, e.created_at," EVENT_BYTES_COLUMNS
#define EVENT_NCOLUMNS 17


#endif							/* OUTBOX_STORE_SQL_H */
