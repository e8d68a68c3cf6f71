/*-------------------------------------------------------------------------
 *
 * store/store_held.c
 *		The relay's SQL for held partitions (outbox.held): record the events
 *		of a held partition, read them back in id order, delete them once
 *		delivered.
 *
 * Invariants:
 *	- Each function runs inside the caller's transaction; a page's held
 *	  rows are written in the transaction that records its progress
 *	  (relay_page.c), so an event leaves the batch only as delivered, as a
 *	  dead letter, or as a held row.
 *	- A held row names its event in outbox.events by id; the event's row
 *	  stays until its held row is gone (delivered_events() leaves it out).
 *	- Held rows are read back by partition, in id order: a partition's
 *	  events leave in the order they were emitted.
 *	- A held row records the topic's partition count its partition was
 *	  computed among (partition_count, 1.8 on: relay_hold.c keeps it while
 *	  the topic has holds).  Statements name that column only when the
 *	  caller found it (OutboxStoreHeldPresent), so that a database not yet
 *	  updated to 1.8 still holds.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "kafka/kafka.h"
#include "store/store.h"
#include "store/store_sql.h"

/*
 * OutboxStoreHeldPresent
 *		Whether outbox.held exists: a database still on 1.3 or older has
 *		none until ALTER EXTENSION outbox UPDATE, and then nothing is held.
 *		*counted: whether it has partition_count (1.8 on).
 */
bool
OutboxStoreHeldPresent(bool *counted)
{
	HeapTuple	tup;
	bool		isnull;
	bool		present;

	SPI_connect();
	tup = OutboxStoreRow("SELECT pg_catalog.to_regclass('outbox.held') IS NOT NULL,"
						 " EXISTS (SELECT 1 FROM pg_catalog.pg_attribute a"
						 "  WHERE a.attrelid OPERATOR(pg_catalog.=) pg_catalog.to_regclass('outbox.held')"
						 "  AND a.attname OPERATOR(pg_catalog.=) 'partition_count'"
						 "  AND NOT a.attisdropped)",
						 "look for outbox.held");
	present = DatumGetBool(SPI_getbinval(tup, SPI_tuptable->tupdesc, 1, &isnull));
	*counted = DatumGetBool(SPI_getbinval(tup, SPI_tuptable->tupdesc, 2, &isnull));
	SPI_finish();
	return present;
}

/*
 * OutboxStoreLoadHolds
 *		Every held partition with its count of events, the oldest row's
 *		time and (when counted) the partition count of its rows, into an
 *		array in cxt; returns how many.
 */
int
OutboxStoreLoadHolds(OutboxHeldPartition **holds, bool counted, MemoryContext cxt)
{
	uint64		i;
	int			n;

	SPI_connect();
	OutboxStoreRun(counted ?
				   "SELECT h.topic, h.kafka_partition, pg_catalog.count(*), pg_catalog.min(h.held_at),"
				   " pg_catalog.max(h.partition_count)"
				   " FROM outbox.held h GROUP BY h.topic, h.kafka_partition" :
				   "SELECT h.topic, h.kafka_partition, pg_catalog.count(*), pg_catalog.min(h.held_at),"
				   " NULL::pg_catalog.int4"
				   " FROM outbox.held h GROUP BY h.topic, h.kafka_partition",
				   true, 0, SPI_OK_SELECT, "read held partitions");
	n = (int) SPI_processed;
	*holds = MemoryContextAllocZero(cxt, sizeof(OutboxHeldPartition) * Max(n, 1));
	for (i = 0; i < SPI_processed; i++)
	{
		HeapTuple	tup = SPI_tuptable->vals[i];
		TupleDesc	desc = SPI_tuptable->tupdesc;
		bool		isnull;
		char	   *topic = SPI_getvalue(tup, desc, 1);
		Datum		partitions;

		(*holds)[i].topic = MemoryContextStrdup(cxt, topic);
		(*holds)[i].partition = DatumGetInt32(SPI_getbinval(tup, desc, 2, &isnull));
		(*holds)[i].events = DatumGetInt64(SPI_getbinval(tup, desc, 3, &isnull));
		(*holds)[i].since = DatumGetTimestampTz(SPI_getbinval(tup, desc, 4, &isnull));
		partitions = SPI_getbinval(tup, desc, 5, &isnull);
		(*holds)[i].partitions = isnull ? 0 : DatumGetInt32(partitions);
	}
	SPI_finish();
	return n;
}

/* the ids of events[0..n) that keep is true of, as an int8[] (NULL: none) */
static Datum
event_ids(const OutboxEvent *events, int n, bool (*keep) (const OutboxEvent *),
		  int *count)
{
	Datum	   *ids = palloc(sizeof(Datum) * Max(n, 1));
	int			i;

	*count = 0;
	for (i = 0; i < n; i++)
		if (keep(&events[i]))
			ids[(*count)++] = Int64GetDatum(events[i].id);
	if (*count == 0)
		return (Datum) 0;
	return PointerGetDatum(construct_array(ids, *count, INT8OID, 8, FLOAT8PASSBYVAL,
										   TYPALIGN_DOUBLE));
}

/* held now, and not yet a row */
static bool
newly_held(const OutboxEvent *ev)
{
	return ev->disposition == OUTBOX_EVENT_HELD && !ev->was_held;
}

/*
 * OutboxStoreHoldEvents
 *		Record the events of a page newly held (disposition HELD, not read
 *		from outbox.held) with their topic, partition and, when counted,
 *		partition count.  Returns how many.
 */
int64
OutboxStoreHoldEvents(const OutboxEvent *events, int n, bool counted)
{
	Datum		values[4];
	Oid			types[4] = {INT8ARRAYOID, TEXTARRAYOID, INT4ARRAYOID, INT4ARRAYOID};
	Datum	   *topics;
	Datum	   *parts;
	Datum	   *counts;
	int			count;
	int			i;
	int			j = 0;
	int64		held;

	values[0] = event_ids(events, n, newly_held, &count);
	if (count == 0)
		return 0;
	topics = palloc(sizeof(Datum) * count);
	parts = palloc(sizeof(Datum) * count);
	counts = palloc(sizeof(Datum) * count);
	for (i = 0; i < n; i++)
		if (newly_held(&events[i]))
		{
			topics[j] = CStringGetTextDatum(events[i].topic);
			counts[j] = Int32GetDatum(events[i].partition_count);
			parts[j++] = Int32GetDatum(events[i].partition);
		}
	values[1] = PointerGetDatum(construct_array(topics, count, TEXTOID, -1, false, TYPALIGN_INT));
	values[2] = PointerGetDatum(construct_array(parts, count, INT4OID, 4, true, TYPALIGN_INT));
	values[3] = PointerGetDatum(construct_array(counts, count, INT4OID, 4, true, TYPALIGN_INT));

	SPI_connect();
	held = OutboxStoreRunArgs(counted ?
							  "INSERT INTO outbox.held (id, topic, kafka_partition, partition_count)"
							  " SELECT i, t, p, CASE WHEN c OPERATOR(pg_catalog.>) 0 THEN c END"
							  " FROM ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2),"
							  "  pg_catalog.unnest($3), pg_catalog.unnest($4)) AS r (i, t, p, c)"
							  " ON CONFLICT (id) DO NOTHING" :
							  "INSERT INTO outbox.held (id, topic, kafka_partition)"
							  " SELECT * FROM ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2), pg_catalog.unnest($3))"
							  " ON CONFLICT (id) DO NOTHING",
							  counted ? 4 : 3, types, values, SPI_OK_INSERT,
							  "record held events");
	SPI_finish();
	return held;
}

/* read from outbox.held, and settled otherwise than by being held again */
static bool
released(const OutboxEvent *ev)
{
	return ev->was_held && ev->disposition != OUTBOX_EVENT_HELD &&
		ev->disposition != OUTBOX_EVENT_PENDING;
}

/*
 * OutboxStoreReleaseHeld
 *		Delete the held rows of a drained page's events that are settled
 *		(delivered, quarantined, parked).  Returns how many.
 */
int64
OutboxStoreReleaseHeld(const OutboxEvent *events, int n)
{
	Datum		values[1];
	Oid			types[1] = {INT8ARRAYOID};
	int			count;
	int64		gone;

	values[0] = event_ids(events, n, released, &count);
	if (count == 0)
		return 0;
	SPI_connect();
	gone = OutboxStoreRunArgs("DELETE FROM outbox.held WHERE id OPERATOR(pg_catalog.=) ANY ($1)",
							  1, types, values, SPI_OK_DELETE, "delete held events");
	SPI_finish();
	return gone;
}

/*
 * OutboxStoreReadHeld
 *		The oldest up to limit held events of one partition, in id order,
 *		and at most outbox.batch_max_bytes of them past the first, into cxt;
 *		each is sent to that partition.  Returns how many.  Not read-only:
 *		the cursor must see the probe's row deleted just before in the same
 *		transaction (a read-only one keeps the older command's view).
 */
int
OutboxStoreReadHeld(const char *topic, int32 partition, int limit,
					OutboxEvent **events, MemoryContext cxt)
{
	Datum		values[3];
	Oid			types[3] = {TEXTOID, INT4OID, INT4OID};
	int			n;
	int			i;

	values[0] = CStringGetTextDatum(topic);
	values[1] = Int32GetDatum(partition);
	values[2] = Int32GetDatum(limit);
	SPI_connect();
	OutboxStoreLockFirst("held");
	n = OutboxStoreQueryEvents("SELECT " EVENT_COLUMNS
							   " FROM outbox.held h"
							   " JOIN outbox.events e ON e.id OPERATOR(pg_catalog.=) h.id"
							   " WHERE h.topic OPERATOR(pg_catalog.=) $1"
							   " AND h.kafka_partition OPERATOR(pg_catalog.=) $2"
							   " ORDER BY h.id LIMIT $3",
							   3, types, values, false, limit, events, cxt,
							   "held events");
	SPI_finish();
	for (i = 0; i < n; i++)
	{
		(*events)[i].was_held = true;
		(*events)[i].partition = partition;
	}
	return n;
}

/* OutboxStoreDeleteHeld: a probe was acknowledged; its row goes */
void
OutboxStoreDeleteHeld(int64 id)
{
	Datum		values[1];
	Oid			types[1] = {INT8OID};

	values[0] = Int64GetDatum(id);
	SPI_connect();
	(void) OutboxStoreRunArgs("DELETE FROM outbox.held WHERE id OPERATOR(pg_catalog.=) $1",
							  1, types, values, SPI_OK_DELETE, "delete a held event");
	SPI_finish();
}

/*
 * OutboxStoreEndHold
 *		A partition's drain read nothing more: delete its rows whose event
 *		is gone (deleted by hand), and only those, so that a row committed
 *		meanwhile (a restore) stays.  Returns how many.
 */
int64
OutboxStoreEndHold(const char *topic, int32 partition)
{
	Datum		values[2];
	Oid			types[2] = {TEXTOID, INT4OID};
	int			rc;
	int64		gone;

	values[0] = CStringGetTextDatum(topic);
	values[1] = Int32GetDatum(partition);
	SPI_connect();
	rc = SPI_execute_with_args("DELETE FROM outbox.held h"
							   " WHERE h.topic OPERATOR(pg_catalog.=) $1"
							   " AND h.kafka_partition OPERATOR(pg_catalog.=) $2"
							   " AND NOT EXISTS (SELECT 1 FROM outbox.events e"
							   "  WHERE e.id OPERATOR(pg_catalog.=) h.id)",
							   2, types, values, NULL, false, 0);
	if (rc != SPI_OK_DELETE)
		elog(ERROR, "could not end a hold: %s", SPI_result_code_string(rc));
	gone = (int64) SPI_processed;
	SPI_finish();
	return gone;
}
