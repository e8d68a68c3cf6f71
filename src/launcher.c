/*-------------------------------------------------------------------------
 *
 * launcher.c
 *		The launcher: decides which databases get a relay, starts them and
 *		restarts them.  (The utility hook, which runs in user backends and
 *		keeps relays out of the way of commands needing a database to
 *		themselves, is in utility.c.)
 *
 * Invariants:
 *	- The launcher connects to no database: it reads only the shared
 *	  catalog pg_database and never runs SQL in a user database.  Whether a
 *	  database has the extension is found out by a probe worker (probe.c),
 *	  which takes no relay slot, or by its relay, which exits saying so
 *	  when the extension was dropped.
 *	- Every connectable, non-template database is probed once at start and
 *	  whenever it first appears; CREATE EXTENSION outbox asks for a probe at
 *	  commit, so its relay starts at once.
 *	- At most one relay per database: a relay already attached to its slot
 *	  (started by a launcher that has since exited) is adopted and watched
 *	  through its slot, never doubled; shmem.c makes the claim atomic.
 *	- A relay that stops for any other reason is restarted after
 *	  OUTBOX_RESTART_DELAY_MS, unless a command holds its database.
 *	- It starts only when recovery is finished: relays never run on a
 *	  standby, and a promoted standby starts them.
 *	- At most one launcher: it signs on in shared memory at start
 *	  (OutboxLauncherAttach) and off when it exits, so a launcher restarted
 *	  by the postmaster finds the place free; one that finds it taken exits.
 *	- It keeps no pointer into shared memory: it names the database and
 *	  reads a copy of its slot (OutboxSlotRead).
 *	- Relays come first: in each pass the relays and probes are started
 *	  before the subscription workers (launcher_consumers.c), which give
 *	  up their background worker slots to a relay or probe refused one.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/pg_database.h"
#include "commands/dbcommands.h"
#include "utils/syscache.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "compat.h"
#include "outbox.h"

/* pg_stat_activity.wait_event of the idle launcher (see compat.h) */
static uint32 wait_main_event;

#define OUTBOX_RESCAN_INTERVAL_MS	10000
#define OUTBOX_PROBES_AT_ONCE		2
#define OUTBOX_PROBE_WAIT_MS		100

typedef struct RelayEntry
{
	Oid			dboid;
	bool		wanted;			/* to probe, or known to have the extension */
	bool		has_extension;	/* a probe or a relay found it */
	bool		seen;			/* present in the last pg_database scan */
	bool		reprobe;		/* CREATE EXTENSION came while a worker ran */
	bool		probing;		/* handle is a probe, not a relay */
	bool		adopted;		/* a relay runs that another launcher started */
	bool		no_worker;		/* its last relay or probe found no
								 * background worker slot */
	BackgroundWorkerHandle *handle;
	TimestampTz next_start;
} RelayEntry;

static List *entries = NIL;

static TimestampTz last_no_slot_log = 0;
static int	probes_running = 0;

/*
 * Relays come first (launcher_consumers.c): relays and probes waiting for
 * a background worker slot, and whether one was refused in this pass.
 */
static int	relays_waiting = 0;
static bool relay_refused = false;

/*
 * OutboxLauncherRegisterStatic
 *		Register the launcher with the postmaster (preload only).
 */
void
OutboxLauncherRegisterStatic(void)
{
	BackgroundWorker worker;

	memset(&worker, 0, sizeof(worker));
	worker.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
	worker.bgw_start_time = BgWorkerStart_RecoveryFinished;
	worker.bgw_restart_time = 1;
	strlcpy(worker.bgw_library_name, "outbox", BGW_MAXLEN);
	strlcpy(worker.bgw_function_name, "OutboxLauncherMain", BGW_MAXLEN);
	strlcpy(worker.bgw_name, "outbox launcher", BGW_MAXLEN);
	strlcpy(worker.bgw_type, "outbox launcher", BGW_MAXLEN);
	RegisterBackgroundWorker(&worker);
}

static RelayEntry *
find_entry(Oid dboid, bool create)
{
	ListCell   *lc;
	RelayEntry *entry;
	MemoryContext old;

	foreach(lc, entries)
	{
		entry = (RelayEntry *) lfirst(lc);
		if (entry->dboid == dboid)
			return entry;
	}
	if (!create)
		return NULL;
	old = MemoryContextSwitchTo(TopMemoryContext);
	entry = palloc0(sizeof(RelayEntry));
	entry->dboid = dboid;
	entries = lappend(entries, entry);
	MemoryContextSwitchTo(old);
	return entry;
}

/* whether the launcher watches dboid (it exists, takes connections, is no template) */
bool
OutboxLauncherKnowsDatabase(Oid dboid)
{
	return find_entry(dboid, false) != NULL;
}

/*
 * OutboxLauncherDatabaseName
 *		dboid's name for a log line, copied into buf (its OID if it is gone).
 */
void
OutboxLauncherDatabaseName(Oid dboid, char *buf, size_t len)
{
	char	   *name;

	StartTransactionCommand();
	name = get_database_name(dboid);
	if (name != NULL)
		strlcpy(buf, name, len);
	else
		snprintf(buf, len, "%u", dboid);
	CommitTransactionCommand();
}

/* whether dboid is still in pg_database */
static bool
database_exists(Oid dboid)
{
	bool		exists;

	StartTransactionCommand();
	exists = SearchSysCacheExists1(DATABASEOID, ObjectIdGetDatum(dboid));
	CommitTransactionCommand();
	return exists;
}

/*
 * rescan_databases
 *		Read pg_database: new databases get probed, vanished ones forgotten.
 */
static void
rescan_databases(void)
{
	Relation	rel;
	TableScanDesc scan;
	HeapTuple	tup;
	ListCell   *lc;

	foreach(lc, entries)
		((RelayEntry *) lfirst(lc))->seen = false;

	StartTransactionCommand();
	PushActiveSnapshot(GetTransactionSnapshot());
	rel = table_open(DatabaseRelationId, AccessShareLock);
	scan = table_beginscan_catalog(rel, 0, NULL);
	while ((tup = heap_getnext(scan, ForwardScanDirection)) != NULL)
	{
		Form_pg_database db = (Form_pg_database) GETSTRUCT(tup);
		RelayEntry *entry;

		/* a relay in a template would block CREATE DATABASE from it */
		if (!db->datallowconn || db->datistemplate || database_is_invalid_form(db))
			continue;
		entry = find_entry(db->oid, false);
		if (entry == NULL)
		{
			entry = find_entry(db->oid, true);
			entry->wanted = true;
		}
		entry->seen = true;
	}
	table_endscan(scan);
	table_close(rel, AccessShareLock);
	PopActiveSnapshot();
	CommitTransactionCommand();

	foreach(lc, entries)
	{
		RelayEntry *entry = (RelayEntry *) lfirst(lc);

		if (!entry->seen && entry->handle == NULL && !entry->adopted)
		{
			OutboxSlotRelease(entry->dboid);
			entries = foreach_delete_current(entries, lc);
			pfree(entry);
		}
	}
}

/*
 * register_worker
 *		Start a relay or a probe for entry's database.  On failure (no free
 *		background worker slot) log at a rate limit and retry later.
 */
static bool
register_worker(RelayEntry *entry, bool probe, TimestampTz now)
{
	BackgroundWorker worker;

	memset(&worker, 0, sizeof(worker));
	worker.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
	worker.bgw_start_time = BgWorkerStart_RecoveryFinished;
	worker.bgw_restart_time = BGW_NEVER_RESTART;
	strlcpy(worker.bgw_library_name, "outbox", BGW_MAXLEN);
	strlcpy(worker.bgw_function_name, probe ? "OutboxProbeMain" : "OutboxRelayMain",
			BGW_MAXLEN);
	snprintf(worker.bgw_name, BGW_MAXLEN, "outbox %s for database %u",
			 probe ? "probe" : "relay", entry->dboid);
	strlcpy(worker.bgw_type, probe ? "outbox probe" : "outbox relay", BGW_MAXLEN);
	worker.bgw_main_arg = ObjectIdGetDatum(entry->dboid);
	worker.bgw_notify_pid = MyProcPid;

	if (RegisterDynamicBackgroundWorker(&worker, &entry->handle))
	{
		entry->probing = probe;
		return true;
	}
	entry->handle = NULL;
	entry->no_worker = true;
	relay_refused = true;
	if (TimestampDifferenceExceeds(last_no_slot_log, now, 60000))
	{
		char		name[NAMEDATALEN];

		OutboxLauncherDatabaseName(entry->dboid, name, sizeof(name));
		ereport(WARNING,
				(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
				 probe ?
				 errmsg("outbox cannot look for the extension in database \"%s\": no background worker slot is free",
						name) :
				 errmsg("outbox cannot start a relay for database \"%s\": no background worker slot is free",
						name),
				 errhint("Raise max_worker_processes.")));
		last_no_slot_log = now;
	}
	entry->next_start = TimestampTzPlusMilliseconds(now, OUTBOX_NO_WORKER_RETRY_MS);
	return false;
}

/*
 * start_worker
 *		What entry's database needs now: adopt the relay already running
 *		for it (started by a launcher that exited), probe it if nobody knows
 *		whether it has the extension, or start its relay.
 */
static void
start_worker(RelayEntry *entry, TimestampTz now)
{
	OutboxSlotView view;
	bool		has_slot = OutboxSlotRead(entry->dboid, &view);
	bool		held;

	/* set again below if it is still refused a background worker slot */
	entry->no_worker = false;

	/*
	 * The database may have been dropped since the last rescan (DROP
	 * DATABASE holds it for as long as the rescan interval, so its end can
	 * come first): a worker would only fail to connect.  The next rescan
	 * forgets the entry.
	 */
	if (view.pid == 0 && !database_exists(entry->dboid))
	{
		entry->wanted = false;
		return;
	}

	if (view.pid != 0)
	{
		entry->adopted = true;
		entry->has_extension = true;
		return;
	}

	/*
	 * A slot assigned to the database means a relay found the extension
	 * there; otherwise a probe finds out first, without taking a slot.
	 */
	if (!has_slot && !entry->has_extension)
	{
		/*
		 * A few probes at a time: a server with many databases must not
		 * run out of background workers for the relays.
		 */
		if (probes_running >= OUTBOX_PROBES_AT_ONCE ||
			!OutboxProbeBegin(entry->dboid))
		{
			entry->next_start = TimestampTzPlusMilliseconds(now, OUTBOX_PROBE_WAIT_MS);
			return;
		}
		if (register_worker(entry, true, now))
			probes_running++;
		else
			(void) OutboxProbeTake(entry->dboid);
		return;
	}

	if (!OutboxSlotAcquire(entry->dboid, &held))
	{
		if (TimestampDifferenceExceeds(last_no_slot_log, now, 60000))
		{
			char		name[NAMEDATALEN];

			OutboxLauncherDatabaseName(entry->dboid, name, sizeof(name));
			ereport(WARNING,
					(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
					 errmsg("outbox cannot start a relay for database \"%s\": all %d relay slots are in use",
							name, outbox_max_databases),
					 errhint("Raise outbox.max_databases.")));
			last_no_slot_log = now;
		}
		entry->next_start = TimestampTzPlusMilliseconds(now, OUTBOX_RESCAN_INTERVAL_MS);
		return;
	}
	if (held)
	{
		entry->next_start = TimestampTzPlusMilliseconds(now, OUTBOX_RESTART_DELAY_MS);
		return;
	}
	(void) register_worker(entry, false, now);
}

/*
 * worker_stopped
 *		entry's probe or relay has exited: decide what comes next.
 */
static void
worker_stopped(RelayEntry *entry, TimestampTz now)
{
	bool		no_extension = false;
	bool		was_probe = entry->probing;

	pfree(entry->handle);
	entry->handle = NULL;

	if (was_probe)
	{
		int			result = OutboxProbeTake(entry->dboid);

		entry->probing = false;
		probes_running--;
		if (result == OUTBOX_PROBE_UNKNOWN)
		{
			/* the probe failed (the database is being dropped?): later */
			entry->next_start = TimestampTzPlusMilliseconds(now, OUTBOX_RESTART_DELAY_MS);
			return;
		}
		entry->has_extension = result == OUTBOX_PROBE_EXTENSION;
		no_extension = !entry->has_extension;
	}
	else
	{
		OutboxSlotView view;

		if (OutboxSlotRead(entry->dboid, &view))
			no_extension = view.no_extension;
		if (no_extension)
		{
			entry->has_extension = false;
			OutboxSlotRelease(entry->dboid);
		}
	}

	if (!no_extension)
	{
		/* a probe that found the extension: start the relay at once */
		entry->next_start = was_probe ? now :
			TimestampTzPlusMilliseconds(now, OUTBOX_RESTART_DELAY_MS);
		entry->reprobe = false;
		return;
	}

	/*
	 * A worker that found no extension may have looked just before a
	 * CREATE EXTENSION committed: then probe again.
	 */
	if (entry->reprobe)
	{
		entry->reprobe = false;
		entry->next_start = now;
	}
	else
		entry->wanted = false;
}

/*
 * supervise
 *		Reap stopped workers, watch adopted relays and start what is due;
 *		count the relays and probes that wait for a background worker slot
 *		(relays_waiting), which subscription workers then give up.
 *		Returns how long the launcher may sleep before something is due.
 */
static long
supervise(void)
{
	TimestampTz now = GetCurrentTimestamp();
	long		sleep = OUTBOX_RESCAN_INTERVAL_MS;
	ListCell   *lc;

	relays_waiting = 0;
	relay_refused = false;

	foreach(lc, entries)
	{
		RelayEntry *entry = (RelayEntry *) lfirst(lc);

		if (entry->handle != NULL)
		{
			pid_t		pid;

			if (GetBackgroundWorkerPid(entry->handle, &pid) != BGWH_STOPPED)
				continue;
			worker_stopped(entry, now);
		}
		if (entry->adopted)
		{
			OutboxSlotView view;

			/* its exit sets our latch; the timeout is only a backstop */
			if (OutboxSlotRead(entry->dboid, &view) && view.pid != 0)
			{
				sleep = Min(sleep, OUTBOX_RESTART_DELAY_MS);
				continue;
			}
			entry->adopted = false;
			entry->next_start = TimestampTzPlusMilliseconds(now, OUTBOX_RESTART_DELAY_MS);
		}
		if (!entry->wanted)
			continue;
		if (entry->next_start <= now)
			start_worker(entry, now);
		if (entry->handle == NULL && !entry->adopted)
		{
			sleep = Min(sleep, Max(1, TimestampDifferenceMilliseconds(now, entry->next_start)));
			if (entry->no_worker)
				relays_waiting++;
		}
	}
	/* for status() and health(): why a relay may not run */
	OutboxSetNoWorker(relays_waiting > 0);
	return sleep;
}

/*
 * relays_retry
 *		A subscription worker stopped to make room has exited: the relays
 *		and probes waiting for a worker slot try again at when.
 */
static void
relays_retry(TimestampTz when)
{
	ListCell   *lc;

	foreach(lc, entries)
	{
		RelayEntry *entry = (RelayEntry *) lfirst(lc);

		if (entry->wanted && entry->no_worker && entry->handle == NULL)
			entry->next_start = Min(entry->next_start, when);
	}
}

/*
 * OutboxLauncherMain
 *		Entry point of the launcher.
 */
void
OutboxLauncherMain(Datum main_arg)
{
	TimestampTz last_scan;

	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, SignalHandlerForShutdownRequest);
	BackgroundWorkerUnblockSignals();

	if (!OutboxLauncherAttach())
	{
		ereport(LOG, (errmsg("outbox launcher already running, this one exits")));
		proc_exit(0);
	}
	BackgroundWorkerInitializeConnection(NULL, NULL, 0);
	ereport(LOG, (errmsg("outbox launcher started")));

	rescan_databases();
	last_scan = GetCurrentTimestamp();

	while (!ShutdownRequestPending)
	{
		Oid			requests[OUTBOX_MAX_REQUESTS];
		int			n;
		int			i;
		long		sleep;
		TimestampTz retry_at;

		CHECK_FOR_INTERRUPTS();
		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
		}

		n = OutboxLauncherTakeRequests(requests);
		for (i = 0; i < n; i++)
		{
			RelayEntry *entry = find_entry(requests[i], true);

			entry->wanted = true;
			entry->seen = true;
			entry->next_start = 0;
			if (entry->handle != NULL)
				entry->reprobe = true;
		}
		if (TimestampDifferenceExceeds(last_scan, GetCurrentTimestamp(),
									   OUTBOX_RESCAN_INTERVAL_MS))
		{
			rescan_databases();
			last_scan = GetCurrentTimestamp();
		}

		/* relays first: they take the worker slots subscriptions free */
		if (OutboxConsumersReap(GetCurrentTimestamp(), &retry_at))
			relays_retry(retry_at);
		sleep = supervise();
		sleep = OutboxConsumersSupervise(sleep, relays_waiting > 0, relay_refused);
		pgstat_report_activity(STATE_IDLE, NULL);
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 sleep, OutboxWaitEvent(&wait_main_event, "OutboxLauncherMain"));
		ResetLatch(MyLatch);
	}

	/* relays get SIGTERM from the postmaster themselves */
	proc_exit(1);
}
