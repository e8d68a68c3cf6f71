/*-------------------------------------------------------------------------
 *
 * status.c
 *		SQL-visible state of the relays, read from shared memory.
 *
 * Invariants: reads shared memory and never writes a table; what needs the
 * library preloaded says so with a clear error.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

#include "outbox.h"

PG_FUNCTION_INFO_V1(outbox_relay_status);

/*
 * outbox_relay_status
 *		SQL outbox.relay_status(): this database's relay, one row.
 */
Datum
outbox_relay_status(PG_FUNCTION_ARGS)
{
	TupleDesc	tupdesc;
	OutboxSlot *slot;
	OutboxSlot	copy;
	Datum		values[8];
	bool		nulls[8] = {0};

	if (!OutboxShmemAvailable())
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("outbox relays are not running"),
				 errdetail("The outbox library was not loaded at server start."),
				 errhint("Add outbox to shared_preload_libraries and restart the server.")));

	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "return type must be a row type");

	memset(&copy, 0, sizeof(copy));
	copy.state = OUTBOX_RELAY_STOPPED;
	slot = OutboxSlotFind(MyDatabaseId);
	if (slot != NULL)
	{
		SpinLockAcquire(&slot->mutex);
		memcpy(&copy, slot, sizeof(copy));
		SpinLockRelease(&slot->mutex);
	}

	values[0] = CStringGetTextDatum(OutboxRelayStateName(copy.state));
	if (copy.pid != 0)
		values[1] = Int32GetDatum(copy.pid);
	else
		nulls[1] = true;
	values[2] = Int64GetDatum((int64) copy.published);
	values[3] = Int64GetDatum((int64) copy.pages);
	values[4] = Int64GetDatum((int64) copy.delivery_errors);
	if (copy.last_delivery != 0)
		values[5] = TimestampTzGetDatum(copy.last_delivery);
	else
		nulls[5] = true;
	if (copy.last_error_at != 0)
	{
		values[6] = CStringGetTextDatum(copy.last_error);
		values[7] = TimestampTzGetDatum(copy.last_error_at);
	}
	else
		nulls[6] = nulls[7] = true;

	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(tupdesc, values, nulls)));
}
