/*-------------------------------------------------------------------------
 *
 * launcher/launcher_relays.c
 *		The launcher's side of the relays: which databases get a relay, a
 *		probe first to find out, and starting and restarting them.
 *		launcher.c calls this in each pass, before launcher_consumers.c.
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
 *	  through its slot, never doubled; relay_slots.c makes the claim atomic.
 *	- A relay that stops for any other reason is restarted after
 *	  OUTBOX_RESTART_DELAY_MS, unless a command holds its database.
 *	- It keeps no pointer into shared memory: it names the database and
 *	  reads a copy of its slot (OutboxSlotRead).
 *	- The databases it watches are the ones the subscription workers may
 *	  run in (OutboxLauncherKnowsDatabase).
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
#include "miscadmin.h"
#include "postmaster/bgworker.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"

#include "base/base.h"
#include "shmem/shmem.h"
#include "relay/relay.h"
#include "launcher/launcher.h"

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
 * Relays come first (launcher_consumers.c): whether a relay or probe was
 * refused a background worker slot in this pass.
 */
static bool relay_refused = false;

/*
 * find_entry
 *		dboid's entry; with create, a new one (in TopMemoryContext, the
 *		launcher's for its life) when it has none, else NULL then.
 */
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
 * OutboxRelaysRescan
 *		Read pg_database: new databases get probed, vanished ones forgotten.
 */
void
OutboxRelaysRescan(void)
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
 * OutboxRelaysSupervise
 *		Reap stopped workers, watch adopted relays and start what is due.
 *		*relays_wait: some relay or probe waits for a background worker
 *		slot, *refused: one was refused one in this pass; subscription
 *		workers then give theirs up (launcher_consumers.c).  Returns how
 *		long the launcher may sleep before something is due.
 */
long
OutboxRelaysSupervise(bool *relays_wait, bool *refused)
{
	TimestampTz now = GetCurrentTimestamp();
	long		sleep = OUTBOX_RESCAN_INTERVAL_MS;
	int			relays_waiting = 0;
	ListCell   *lc;

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
	*relays_wait = relays_waiting > 0;
	*refused = relay_refused;
	return sleep;
}

/*
 * OutboxRelaysRetry
 *		A subscription worker stopped to make room has exited: the relays
 *		and probes waiting for a worker slot try again at when.
 */
void
OutboxRelaysRetry(TimestampTz when)
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
 * OutboxRelaysRequested
 *		CREATE EXTENSION outbox committed in dboid: probe it at once, or
 *		again once the worker running there has stopped.
 */
void
OutboxRelaysRequested(Oid dboid)
{
	RelayEntry *entry = find_entry(dboid, true);

	entry->wanted = true;
	entry->seen = true;
	entry->next_start = 0;
	if (entry->handle != NULL)
		entry->reprobe = true;
}
