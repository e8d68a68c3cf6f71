/*-------------------------------------------------------------------------
 *
 * launcher/launcher_consumers.c
 *		The launcher's side of the subscription workers: one per
 *		subscription slot in use (subscription_slots.c), started, restarted, and
 *		kept to their share of the background workers.  launcher.c calls
 *		this in each pass, after the relays' turn (launcher_relays.c).
 *
 * Invariants:
 *	- A worker is restarted OUTBOX_RESTART_DELAY_MS after it stops unless
 *	  its slot is gone (then the slot is freed), its database is held or
 *	  dropped, or a rule below keeps it waiting.  A worker already
 *	  attached to its slot (started by a launcher that has since exited)
 *	  is left alone, and counts.
 *	- Relays come first.  While a relay or probe waits for a background
 *	  worker slot no subscription worker starts; each time one is refused
 *	  a slot, the newest worker of the database running the most is
 *	  stopped to make room, and no other until it is gone, so that the
 *	  relay gets the slot it frees.  With the default max_worker_processes
 *	  the subscriptions of one database could otherwise keep the relays of
 *	  the others from ever starting.
 *	- At most outbox.max_subscriptions_per_database workers run in one
 *	  database (subscribe() refuses more subscriptions than that): over
 *	  it, after a reload lowered it, the newest are stopped, one a pass.
 *	- A subscription left without a worker says why in its slot
 *	  (OutboxInboxSetWait), for health(); the log says so at a rate limit.
 *	- Choices are deterministic: the victim is chosen in shared memory
 *	  under the slots' lock (OutboxInboxStopNewest).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "miscadmin.h"
#include "postmaster/bgworker.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "shmem/shmem.h"
#include "consumer/consumer.h"
#include "launcher/launcher.h"

/* how long the postmaster may take to free an exited worker's slot */
#define OUTBOX_SLOT_FREED_WAIT_MS	100

/* the subscription workers, by subscription slot (launcher memory) */
typedef struct ConsumerEntry
{
	BackgroundWorkerHandle *handle; /* the worker this launcher started */
	Oid			dboid;			/* whose worker it started, or adopted */
	char		name[OUTBOX_SUBSCRIPTION_NAME_MAX];
	TimestampTz next_start;
	bool		running;		/* a worker holds the slot, or will */
} ConsumerEntry;

static ConsumerEntry *consumers = NULL;
static TimestampTz last_consumer_log = 0;
static TimestampTz last_room_log = 0;

/* the worker stopped to make room or keep a share, until it is gone */
static int	stopping = -1;
static int	stopping_pid = 0;
static bool stopping_adopted = false;

/*
 * start_consumer
 *		Register the worker of subscription slot i.  On failure (no free
 *		background worker) retry later.  The slot says which it was.
 */
static void
start_consumer(int i, Oid dboid, const char *name, TimestampTz now)
{
	BackgroundWorker worker;
	ConsumerEntry *c = &consumers[i];

	memset(&worker, 0, sizeof(worker));
	worker.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
	worker.bgw_start_time = BgWorkerStart_RecoveryFinished;
	worker.bgw_restart_time = BGW_NEVER_RESTART;
	strlcpy(worker.bgw_library_name, "outbox", BGW_MAXLEN);
	strlcpy(worker.bgw_function_name, "OutboxConsumerMain", BGW_MAXLEN);
	snprintf(worker.bgw_name, BGW_MAXLEN, "outbox subscription %s", name);
	strlcpy(worker.bgw_type, "outbox subscription", BGW_MAXLEN);
	worker.bgw_main_arg = Int32GetDatum(i);
	StaticAssertStmt(sizeof(Oid) + OUTBOX_SUBSCRIPTION_NAME_MAX <= BGW_EXTRALEN,
					 "a subscription's name does not fit in bgw_extra");
	memcpy(worker.bgw_extra, &dboid, sizeof(Oid));
	strlcpy(worker.bgw_extra + sizeof(Oid), name, OUTBOX_SUBSCRIPTION_NAME_MAX);
	worker.bgw_notify_pid = MyProcPid;

	c->dboid = dboid;
	strlcpy(c->name, name, sizeof(c->name));
	c->running = RegisterDynamicBackgroundWorker(&worker, &c->handle);
	OutboxInboxSetWait(i, dboid, name,
					   c->running ? OUTBOX_INBOX_WAIT_NONE : OUTBOX_INBOX_WAIT_WORKER);
	if (c->running)
		return;
	c->handle = NULL;
	if (TimestampDifferenceExceeds(last_consumer_log, now, 60000))
	{
		ereport(WARNING,
				(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
				 errmsg("outbox cannot start the worker of subscription \"%s\": no background worker slot is free",
						name),
				 errhint("Raise max_worker_processes.")));
		last_consumer_log = now;
	}
	c->next_start = TimestampTzPlusMilliseconds(now, OUTBOX_NO_WORKER_RETRY_MS);
}

/*
 * OutboxConsumersReap
 *		First half of the launcher's pass over the subscription slots: reap
 *		the workers that stopped and note which slots have one (started
 *		here, or by a launcher that exited).  Returns true when the worker
 *		stopped to make room is gone: the relays waiting for a worker slot
 *		may try again at *retry_at, at once when the postmaster has freed
 *		its slot (it tells us after), a moment later for a worker known
 *		only through its subscription slot.
 */
bool
OutboxConsumersReap(TimestampTz now, TimestampTz *retry_at)
{
	int			n = OutboxInboxSlotCount();
	bool		made_room = false;
	int			i;

	if (n > 0 && consumers == NULL)
		consumers = MemoryContextAllocZero(TopMemoryContext, sizeof(ConsumerEntry) * n);
	for (i = 0; i < n; i++)
	{
		ConsumerEntry *c = &consumers[i];
		OutboxInboxPeek seen;
		bool		in_use;
		pid_t		wpid;

		if (c->handle != NULL && GetBackgroundWorkerPid(c->handle, &wpid) == BGWH_STOPPED)
		{
			pfree(c->handle);
			c->handle = NULL;
			c->next_start = TimestampTzPlusMilliseconds(now, OUTBOX_RESTART_DELAY_MS);
		}
		in_use = OutboxInboxSlotPeek(i, &seen);
		c->running = c->handle != NULL || (in_use && seen.pid != 0);
		if (c->handle == NULL && in_use && seen.pid != 0)
		{
			/* another launcher's worker counts in its database too */
			c->dboid = seen.dboid;
			strlcpy(c->name, seen.name, sizeof(c->name));
		}
		if (i == stopping && c->handle == NULL && (!in_use || seen.pid != stopping_pid))
		{
			stopping = -1;
			made_room = true;
			*retry_at = stopping_adopted ?
				TimestampTzPlusMilliseconds(now, OUTBOX_SLOT_FREED_WAIT_MS) : now;
		}
	}
	return made_room;
}

/* subscription workers running, or registered, in dboid */
static int
consumers_in(Oid dboid)
{
	int			n = 0;
	int			i;

	for (i = 0; i < OutboxInboxSlotCount(); i++)
		if (consumers[i].running && consumers[i].dboid == dboid)
			n++;
	return n;
}

/*
 * stop_one
 *		Unless a worker stopped earlier is still on its way out: when a
 *		relay or probe was refused a worker slot in this pass, stop the
 *		newest subscription worker of the database running the most;
 *		otherwise stop the newest of a database running more than
 *		outbox.max_subscriptions_per_database (lowered at reload).
 */
static void
stop_one(bool relay_refused, TimestampTz now)
{
	Oid			dboid = InvalidOid;
	OutboxInboxPeek seen;
	char		dbname[NAMEDATALEN];
	int			i;

	if (stopping >= 0 || OutboxInboxSlotCount() == 0)
		return;
	for (i = 0; i < OutboxInboxSlotCount() && !relay_refused && !OidIsValid(dboid); i++)
		if (consumers[i].running &&
			consumers_in(consumers[i].dboid) > outbox_max_subscriptions_per_database)
			dboid = consumers[i].dboid;
	if (!relay_refused && !OidIsValid(dboid))
		return;
	stopping = OutboxInboxStopNewest(dboid, &stopping_pid);
	if (stopping < 0 || !OutboxInboxSlotPeek(stopping, &seen))
		return;
	stopping_adopted = consumers[stopping].handle == NULL;
	if (!relay_refused)
	{
		OutboxLauncherDatabaseName(seen.dboid, dbname, sizeof(dbname));
		ereport(LOG,
				(errmsg("outbox stops the worker of subscription \"%s\" of database \"%s\": outbox.max_subscriptions_per_database is %d",
						seen.name, dbname, outbox_max_subscriptions_per_database)));
	}
	else if (TimestampDifferenceExceeds(last_room_log, now, 60000))
	{
		OutboxLauncherDatabaseName(seen.dboid, dbname, sizeof(dbname));
		ereport(WARNING,
				(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
				 errmsg("outbox stops the worker of subscription \"%s\" of database \"%s\": a relay needs its background worker slot",
						seen.name, dbname),
				 errdetail("Relays come first; the subscription's worker starts again when a slot is free."),
				 errhint("Raise max_worker_processes.")));
		last_room_log = now;
	}
}

/*
 * consumer_wait
 *		Why no worker may start for a subscription of dboid now (none: it
 *		may): relays come first, then the database's share.  A database at
 *		its share is logged at a rate limit.
 */
static OutboxInboxWait
consumer_wait(bool relays_wait, Oid dboid, const char *name, TimestampTz now)
{
	char		dbname[NAMEDATALEN];

	if (relays_wait)
		return OUTBOX_INBOX_WAIT_RELAY;
	if (consumers_in(dboid) < outbox_max_subscriptions_per_database)
		return OUTBOX_INBOX_WAIT_NONE;
	if (TimestampDifferenceExceeds(last_consumer_log, now, 60000))
	{
		OutboxLauncherDatabaseName(dboid, dbname, sizeof(dbname));
		ereport(WARNING,
				(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
				 errmsg("outbox cannot start the worker of subscription \"%s\" of database \"%s\": outbox.max_subscriptions_per_database (%d) is reached",
						name, dbname, outbox_max_subscriptions_per_database),
				 errhint("Raise outbox.max_subscriptions_per_database, or unsubscribe.")));
		last_consumer_log = now;
	}
	return OUTBOX_INBOX_WAIT_DATABASE_LIMIT;
}

/*
 * OutboxConsumersSupervise
 *		After OutboxConsumersReap and the relays' turn: free gone slots,
 *		start what is due and may start, stop one worker if the relays
 *		(relays_wait: some wait for a worker slot; relay_refused: one was
 *		refused in this pass) or a database's share need it.  Returns how
 *		long the launcher may sleep.  What lifts a wait (a worker's exit, a
 *		reload, a relay's start) wakes the launcher.
 */
long
OutboxConsumersSupervise(long sleep, bool relays_wait, bool relay_refused)
{
	TimestampTz now = GetCurrentTimestamp();
	int			i;

	for (i = 0; i < OutboxInboxSlotCount(); i++)
	{
		ConsumerEntry *c = &consumers[i];
		OutboxInboxPeek seen;
		OutboxInboxWait wait;

		if (!OutboxInboxSlotPeek(i, &seen))
			continue;
		if (!OutboxLauncherKnowsDatabase(seen.dboid))
		{
			/* its database was dropped (or made a template) */
			OutboxInboxSlotForget(i);
			continue;
		}
		if (seen.gone)
		{
			if (seen.pid == 0)
				OutboxInboxSlotFree(i);
			continue;
		}
		if (c->running || seen.pid != 0)
			continue;
		/* a new subscription in this slot starts at once */
		if (c->dboid != seen.dboid || strcmp(c->name, seen.name) != 0)
			c->next_start = 0;
		if (seen.hold_until > now)
			c->next_start = Max(c->next_start, seen.hold_until);
		if (c->next_start <= now)
		{
			wait = consumer_wait(relays_wait, seen.dboid, seen.name, now);
			if (wait != OUTBOX_INBOX_WAIT_NONE)
			{
				OutboxInboxSetWait(i, seen.dboid, seen.name, wait);
				continue;
			}
			start_consumer(i, seen.dboid, seen.name, now);
		}
		if (c->handle == NULL)
			sleep = Min(sleep, Max(1, TimestampDifferenceMilliseconds(now, c->next_start)));
	}
	stop_one(relay_refused, now);
	return sleep;
}
