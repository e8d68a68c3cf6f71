/*-------------------------------------------------------------------------
 *
 * launcher/launcher.c
 *		The launcher: one background worker for the cluster, which in each
 *		pass takes the probe requests of CREATE EXTENSION, reads
 *		pg_database again now and then, and supervises the relays
 *		(launcher_relays.c), then the subscription workers
 *		(launcher_consumers.c).  (The utility hook, which runs in user
 *		backends and keeps relays out of the way of commands needing a
 *		database to themselves, is in utility.c.)
 *
 * Invariants:
 *	- The launcher connects to no database and never runs SQL in one
 *	  (launcher_relays.c says how it learns what it needs).
 *	- It starts only when recovery is finished: relays never run on a
 *	  standby, and a promoted standby starts them.
 *	- At most one launcher: it signs on in shared memory at start
 *	  (OutboxLauncherAttach) and off when it exits, so a launcher restarted
 *	  by the postmaster finds the place free; one that finds it taken exits.
 *	- Relays come first: in each pass the relays and probes are started
 *	  before the subscription workers, which give up their background
 *	  worker slots to a relay or probe refused one.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "utils/timestamp.h"

#include "base/compat.h"
#include "shmem/shmem.h"
#include "launcher/launcher.h"

/* pg_stat_activity.wait_event of the idle launcher (see compat.h) */
static uint32 wait_main_event;

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

	OutboxRelaysRescan();
	last_scan = GetCurrentTimestamp();

	while (!ShutdownRequestPending)
	{
		Oid			requests[OUTBOX_MAX_REQUESTS];
		int			n;
		int			i;
		long		sleep;
		TimestampTz retry_at;
		bool		relays_wait;
		bool		refused;

		CHECK_FOR_INTERRUPTS();
		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
		}

		n = OutboxLauncherTakeRequests(requests);
		for (i = 0; i < n; i++)
			OutboxRelaysRequested(requests[i]);
		if (TimestampDifferenceExceeds(last_scan, GetCurrentTimestamp(),
									   OUTBOX_RESCAN_INTERVAL_MS))
		{
			OutboxRelaysRescan();
			last_scan = GetCurrentTimestamp();
		}

		/* relays first: they take the worker slots subscriptions free */
		if (OutboxConsumersReap(GetCurrentTimestamp(), &retry_at))
			OutboxRelaysRetry(retry_at);
		sleep = OutboxRelaysSupervise(&relays_wait, &refused);
		sleep = OutboxConsumersSupervise(sleep, relays_wait, refused);
		pgstat_report_activity(STATE_IDLE, NULL);
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 sleep, OutboxWaitEvent(&wait_main_event, "OutboxLauncherMain"));
		ResetLatch(MyLatch);
	}

	/* relays get SIGTERM from the postmaster themselves */
	proc_exit(1);
}
