/*-------------------------------------------------------------------------
 *
 * relay/relay_state.c
 *		What every file of the relay uses: the state operators see, its
 *		errors (in status() and, at a rate limit, in the log), and the
 *		brackets of its short transactions.
 *
 * Invariants:
 *	- This is the relay's ground floor: it calls no other relay file, so
 *	  that each of them can call it (relay_state.h lists the floors).
 *	- A change of the state name operators see gets one LOG line; an
 *	  external failure is counted at once and logged at most every
 *	  RELAY_LOG_INTERVAL_MS, with how many happened since the last line.
 *	- A relay transaction is short and holds one snapshot; committing it
 *	  returns to the loop's memory context (Relay.loop_cxt).
 *
 * No SQL here (store_batch.c) and no librdkafka call (producer.c).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "pgstat.h"
#include "tcop/tcopprot.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "relay/relay_state.h"
#include "shmem/shmem.h"

#define RELAY_LOG_INTERVAL_MS	10000

/*
 * OutboxRelaySetState
 *		Publish the relay's state; a change of the state name operators see
 *		(running, paused, backing off, not configured) gets one LOG line.
 */
void
OutboxRelaySetState(Relay *r, OutboxRelayState state)
{
	const char *name = OutboxRelayStateName(state);

	OutboxSlotSetState(r->slot, state);
	if (r->logged_state != NULL && strcmp(r->logged_state, name) != 0 &&
		state != OUTBOX_RELAY_STOPPED)
		ereport(LOG,
				(errmsg("outbox relay for database \"%s\" is now %s (was %s)",
						r->dbname, name, r->logged_state)));
	r->logged_state = name;
}

/*
 * OutboxRelayNoteError
 *		Show a condition in status() without a log line: the failures it
 *		leads to are logged by OutboxRelayReportError.
 */
void
OutboxRelayNoteError(Relay *r, const char *what, const char *detail)
{
	char		line[256];

	snprintf(line, sizeof(line), "%s: %s", what, detail);
	OutboxSlotCountError(r->slot, line);
}

/*
 * OutboxRelayReportError
 *		Count an external failure and log it at most every
 *		RELAY_LOG_INTERVAL_MS, with how many happened since the last line.
 */
void
OutboxRelayReportError(Relay *r, const char *what, const char *detail)
{
	TimestampTz now = GetCurrentTimestamp();

	OutboxRelayNoteError(r, what, detail);
	r->errors_since_log++;
	if (TimestampDifferenceExceeds(r->last_error_log, now, RELAY_LOG_INTERVAL_MS))
	{
		ereport(LOG,
				(errmsg("outbox relay: %s", what),
				 errdetail("%s (%d failures since the last report)", detail,
						   r->errors_since_log)));
		r->errors_since_log = 0;
		r->last_error_log = now;
	}
}

/*
 * OutboxRelayBeginTxn
 *		Open a short transaction with a snapshot; activity is what
 *		pg_stat_activity shows meanwhile.
 */
void
OutboxRelayBeginTxn(const char *activity)
{
	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	PushActiveSnapshot(GetTransactionSnapshot());
	pgstat_report_activity(STATE_RUNNING, activity);
}

/*
 * OutboxRelayEndTxn
 *		Commit it, and return to the loop's memory context: committing
 *		leaves TopMemoryContext current.
 */
void
OutboxRelayEndTxn(Relay *r)
{
	PopActiveSnapshot();
	CommitTransactionCommand();
	MemoryContextSwitchTo(r->loop_cxt);
	pgstat_report_stat(false);
	pgstat_report_activity(STATE_IDLE, NULL);
}
