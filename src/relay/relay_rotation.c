/*-------------------------------------------------------------------------
 *
 * relay/relay_rotation.c
 *		The relay turns the log's ring of generations (store_rotation.c):
 *		a step when one is due, between pages or when idle.
 *
 * Invariants:
 *	- A step runs in a READ COMMITTED transaction of its own (whatever
 *	  default_transaction_isolation says), never while a Kafka
 *	  transaction is open (exactly_once): its checks may scan a whole
 *	  generation, which must not outlast the Kafka transaction's timeout.
 *	- A step that fails (a lock timeout, a concurrent change) is rolled
 *	  back in its subtransaction, logged as a warning and tried again a
 *	  minute later; the relay goes on publishing.
 *	- A database whose log is not a ring (before 1.8) is looked at again
 *	  every minute, so that ALTER EXTENSION UPDATE shows; until then its
 *	  events are deleted past the retention by OutboxRelayCleanup.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "pgstat.h"
#include "utils/elog.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/resowner.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "relay/relay.h"
#include "relay/relay_state.h"
#include "base/base.h"
#include "store/store.h"

#define ROTATE_RETRY_MS	60000

/*
 * try_step
 *		One step of the ring in a subtransaction; false, with the error's
 *		message in *message (palloc'd in the caller's context), when it
 *		failed and was rolled back.
 */
static bool
try_step(OutboxRotation *step, char **message)
{
	MemoryContext old = CurrentMemoryContext;
	ResourceOwner owner = CurrentResourceOwner;
	volatile bool ok = true;

	BeginInternalSubTransaction(NULL);
	MemoryContextSwitchTo(old);
	PG_TRY();
	{
		OutboxStoreRotate(outbox_retention, step);
		ReleaseCurrentSubTransaction();
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		MemoryContextSwitchTo(old);
		edata = CopyErrorData();
		FlushErrorState();
		RollbackAndReleaseCurrentSubTransaction();
		*message = pstrdup(edata->message);
		FreeErrorData(edata);
		ok = false;
	}
	PG_END_TRY();
	MemoryContextSwitchTo(old);
	CurrentResourceOwner = owner;
	return ok;
}

/*
 * begin_txn
 *		As OutboxRelayBeginTxn, READ COMMITTED whatever the defaults say: the
 *		step's checks after a lock must see what committed before it.
 */
static void
begin_txn(void)
{
	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	(void) set_config_option("transaction_isolation", "read committed",
							 PGC_SUSET, PGC_S_SESSION, GUC_ACTION_SET,
							 true, 0, false);
	PushActiveSnapshot(GetTransactionSnapshot());
	pgstat_report_activity(STATE_RUNNING, "turning the log's generations");
}

/* say what the step did, and when what keeps the oldest generation changes */
static void
report_step(Relay *r, const OutboxRotation *step)
{
	const char *waits_for = step->waits_for != NULL ? step->waits_for : "";

	if (step->emptied_any)
		ereport(DEBUG1,
				(errmsg_internal("outbox relay emptied generation %d of the log",
								 step->emptied)));
	if (step->opened)
		ereport(DEBUG1,
				(errmsg_internal("outbox relay opened generation %d of the log",
								 step->current)));
	if (strcmp(waits_for, r->rotation_waits_for) == 0)
		return;
	if (waits_for[0] != '\0')
		ereport(LOG,
				(errmsg("outbox relay for database \"%s\" keeps the log's oldest generation: it waits for %s",
						r->dbname, waits_for),
				 errdetail("outbox.status shows it in log_waits_for; the log grows until it is emptied.")));
	strlcpy(r->rotation_waits_for, waits_for, sizeof(r->rotation_waits_for));
}

/*
 * OutboxRelayRotate
 *		A step of the log's ring when one is due and no Kafka transaction is
 *		open; opens and commits its own transaction.
 */
void
OutboxRelayRotate(Relay *r)
{
	TimestampTz now = GetCurrentTimestamp();
	OutboxRotation step;
	char	   *message = NULL;
	bool		ok = true;

	/* a reload that changes the retention may make a step due at once */
	if (r->txn_open ||
		(now < r->next_rotate && outbox_retention == r->rotation_retention))
		return;
	r->rotation_retention = outbox_retention;
	begin_txn();
	r->log_rotates = OutboxStoreLogRotates() ? 1 : -1;
	if (r->log_rotates > 0)
		ok = try_step(&step, &message);
	OutboxRelayEndTxn(r);

	if (r->log_rotates < 0)
		r->next_rotate = TimestampTzPlusMilliseconds(now, ROTATE_RETRY_MS);
	else if (!ok)
	{
		ereport(WARNING,
				(errmsg("outbox relay for database \"%s\" could not turn the log's generations: %s",
						r->dbname, message),
				 errdetail("It tries again in a minute.")));
		r->next_rotate = TimestampTzPlusMilliseconds(now, ROTATE_RETRY_MS);
	}
	else
	{
		report_step(r, &step);
		r->next_rotate = step.next_look;
	}
}
