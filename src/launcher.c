/*-------------------------------------------------------------------------
 *
 * launcher.c
 *		The launcher: decides which databases get a relay, starts them and
 *		restarts them; plus the utility hook that keeps relays out of the way
 *		of commands needing a database to themselves.
 *
 * Invariants:
 *	- The launcher connects to no database: it reads only the shared
 *	  catalog pg_database and never runs SQL in a user database.  Whether a
 *	  database has the extension is found out by its relay, which exits
 *	  saying so when it has not.
 *	- Every connectable, non-template database is probed once at start and
 *	  whenever it first appears; CREATE EXTENSION outbox asks for a probe at
 *	  commit, so its relay starts at once.
 *	- A relay that stops for any other reason is restarted after
 *	  OUTBOX_RESTART_DELAY_MS, unless a command holds its database.
 *	- It starts only when recovery is finished: relays never run on a
 *	  standby, and a promoted standby starts them.
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
#include "commands/defrem.h"
#include "commands/dbcommands.h"
#include "miscadmin.h"
#include "nodes/parsenodes.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "tcop/utility.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "outbox.h"

#define OUTBOX_RESTART_DELAY_MS		1000
#define OUTBOX_RESCAN_INTERVAL_MS	10000
#define OUTBOX_NO_WORKER_RETRY_MS	5000
#define OUTBOX_HOLD_MS				10000

typedef struct RelayEntry
{
	Oid			dboid;
	bool		wanted;			/* to probe, or known to have the extension */
	bool		seen;			/* present in the last pg_database scan */
	bool		reprobe;		/* CREATE EXTENSION came while a relay ran */
	BackgroundWorkerHandle *handle;
	TimestampTz next_start;
} RelayEntry;

static List *entries = NIL;
static TimestampTz last_no_slot_log = 0;

static ProcessUtility_hook_type prev_utility_hook = NULL;
static bool probe_at_commit = false;
static bool wake_at_commit = false;

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

		if (!entry->seen && entry->handle == NULL)
		{
			OutboxSlotRelease(entry->dboid);
			entries = foreach_delete_current(entries, lc);
			pfree(entry);
		}
	}
}

static void
start_relay(RelayEntry *entry, TimestampTz now)
{
	BackgroundWorker worker;
	OutboxSlot *slot = OutboxSlotAcquire(entry->dboid);

	if (slot == NULL)
	{
		if (TimestampDifferenceExceeds(last_no_slot_log, now, 60000))
		{
			ereport(WARNING,
					(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
					 errmsg("outbox cannot start a relay for database %u: all %d relay slots are in use",
							entry->dboid, outbox_max_databases),
					 errhint("Raise outbox.max_databases.")));
			last_no_slot_log = now;
		}
		entry->next_start = TimestampTzPlusMilliseconds(now, OUTBOX_RESCAN_INTERVAL_MS);
		return;
	}
	if (OutboxSlotIsHeld(slot))
	{
		entry->next_start = TimestampTzPlusMilliseconds(now, OUTBOX_RESTART_DELAY_MS);
		return;
	}

	memset(&worker, 0, sizeof(worker));
	worker.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
	worker.bgw_start_time = BgWorkerStart_RecoveryFinished;
	worker.bgw_restart_time = BGW_NEVER_RESTART;
	strlcpy(worker.bgw_library_name, "outbox", BGW_MAXLEN);
	strlcpy(worker.bgw_function_name, "OutboxRelayMain", BGW_MAXLEN);
	snprintf(worker.bgw_name, BGW_MAXLEN, "outbox relay for database %u", entry->dboid);
	strlcpy(worker.bgw_type, "outbox relay", BGW_MAXLEN);
	worker.bgw_main_arg = ObjectIdGetDatum(entry->dboid);
	worker.bgw_notify_pid = MyProcPid;

	if (!RegisterDynamicBackgroundWorker(&worker, &entry->handle))
	{
		entry->handle = NULL;
		if (TimestampDifferenceExceeds(last_no_slot_log, now, 60000))
		{
			ereport(WARNING,
					(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
					 errmsg("outbox cannot start a relay for database %u: no background worker slot is free",
							entry->dboid),
					 errhint("Raise max_worker_processes.")));
			last_no_slot_log = now;
		}
		entry->next_start = TimestampTzPlusMilliseconds(now, OUTBOX_NO_WORKER_RETRY_MS);
	}
}

/*
 * supervise
 *		Reap stopped relays and start the ones due.  Returns how long the
 *		launcher may sleep before something is due.
 */
static long
supervise(void)
{
	TimestampTz now = GetCurrentTimestamp();
	long		sleep = OUTBOX_RESCAN_INTERVAL_MS;
	ListCell   *lc;

	foreach(lc, entries)
	{
		RelayEntry *entry = (RelayEntry *) lfirst(lc);

		if (entry->handle != NULL)
		{
			pid_t		pid;

			if (GetBackgroundWorkerPid(entry->handle, &pid) != BGWH_STOPPED)
				continue;
			pfree(entry->handle);
			entry->handle = NULL;
			{
				OutboxSlot *slot = OutboxSlotFind(entry->dboid);
				bool		no_extension = false;

				if (slot != NULL)
				{
					SpinLockAcquire(&slot->mutex);
					no_extension = slot->no_extension;
					SpinLockRelease(&slot->mutex);
				}
				/*
				 * A relay that found no extension may have looked just before
				 * a CREATE EXTENSION committed: then probe again.
				 */
				if (no_extension && !entry->reprobe)
				{
					entry->wanted = false;
					OutboxSlotRelease(entry->dboid);
					continue;
				}
				if (no_extension)
				{
					entry->reprobe = false;
					entry->next_start = now;
				}
				else
					entry->next_start = TimestampTzPlusMilliseconds(now, OUTBOX_RESTART_DELAY_MS);
			}
		}
		if (!entry->wanted)
			continue;
		if (entry->next_start <= now)
			start_relay(entry, now);
		if (entry->handle == NULL)
			sleep = Min(sleep, Max(1, TimestampDifferenceMilliseconds(now, entry->next_start)));
	}
	return sleep;
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
		Oid			requests[64];
		int			n;
		int			i;
		long		sleep;

		CHECK_FOR_INTERRUPTS();
		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
		}

		n = OutboxLauncherTakeRequests(requests, lengthof(requests));
		for (i = 0; i < n; i++)
		{
			RelayEntry *entry;

			if (!OidIsValid(requests[i]))
			{
				last_scan = 0;
				continue;
			}
			entry = find_entry(requests[i], true);
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

		sleep = supervise();
		pgstat_report_activity(STATE_IDLE, NULL);
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 sleep, PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
	}

	/* relays get SIGTERM from the postmaster themselves */
	proc_exit(1);
}

/*
 * Utility hook: commands that need a database with no other connection
 * first stop that database's relay and hold it off; CREATE and DROP
 * EXTENSION outbox tell the launcher or relay at commit.
 */
static void
hold_database(const char *name)
{
	Oid			dboid;

	if (name == NULL)
		return;
	dboid = get_database_oid(name, true);
	if (OidIsValid(dboid))
		OutboxHoldDatabase(dboid, OUTBOX_HOLD_MS);
}

static bool
has_option(List *options, const char *name, char **value)
{
	ListCell   *lc;

	foreach(lc, options)
	{
		DefElem    *def = (DefElem *) lfirst(lc);

		if (strcmp(def->defname, name) == 0)
		{
			if (value)
				*value = def->arg ? defGetString(def) : NULL;
			return true;
		}
	}
	return false;
}

static bool
drops_outbox(DropStmt *stmt)
{
	ListCell   *lc;

	if (stmt->removeType != OBJECT_EXTENSION)
		return false;
	foreach(lc, stmt->objects)
		if (strcmp(strVal(lfirst(lc)), "outbox") == 0)
			return true;
	return false;
}

static void
outbox_utility(PlannedStmt *pstmt, const char *queryString, bool readOnlyTree,
			   ProcessUtilityContext context, ParamListInfo params,
			   QueryEnvironment *queryEnv, DestReceiver *dest,
			   QueryCompletion *qc)
{
	Node	   *node = pstmt->utilityStmt;
	char	   *template = NULL;

	switch (nodeTag(node))
	{
		case T_DropdbStmt:
			hold_database(((DropdbStmt *) node)->dbname);
			break;
		case T_RenameStmt:
			if (((RenameStmt *) node)->renameType == OBJECT_DATABASE)
				hold_database(((RenameStmt *) node)->subname);
			break;
		case T_AlterDatabaseStmt:
			if (has_option(((AlterDatabaseStmt *) node)->options, "tablespace", NULL))
				hold_database(((AlterDatabaseStmt *) node)->dbname);
			break;
		case T_CreatedbStmt:
			if (has_option(((CreatedbStmt *) node)->options, "template", &template))
				hold_database(template);
			break;
		case T_CreateExtensionStmt:
			if (strcmp(((CreateExtensionStmt *) node)->extname, "outbox") == 0)
				probe_at_commit = true;
			break;
		case T_DropStmt:
			if (drops_outbox((DropStmt *) node))
				wake_at_commit = true;
			break;
		default:
			break;
	}

	if (prev_utility_hook)
		prev_utility_hook(pstmt, queryString, readOnlyTree, context, params,
						  queryEnv, dest, qc);
	else
		standard_ProcessUtility(pstmt, queryString, readOnlyTree, context,
								params, queryEnv, dest, qc);
}

static void
utility_xact_callback(XactEvent event, void *arg)
{
	if (event == XACT_EVENT_COMMIT)
	{
		if (probe_at_commit)
			OutboxRequestProbe(MyDatabaseId);
		if (wake_at_commit)
			OutboxRequestExtensionCheck(MyDatabaseId);
	}
	if (event == XACT_EVENT_COMMIT || event == XACT_EVENT_ABORT ||
		event == XACT_EVENT_PREPARE)
		probe_at_commit = wake_at_commit = false;
}

/*
 * OutboxUtilityHookInstall
 *		Install the utility hook and its commit callback (preload only).
 */
void
OutboxUtilityHookInstall(void)
{
	prev_utility_hook = ProcessUtility_hook;
	ProcessUtility_hook = outbox_utility;
	RegisterXactCallback(utility_xact_callback, NULL);
}
