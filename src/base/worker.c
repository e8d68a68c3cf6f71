/*-------------------------------------------------------------------------
 *
 * base/worker.c
 *		The start-up every outbox background worker that talks to Kafka
 *		shares (the relay, the subscription worker), once connected to its
 *		database: the settings its statements run with, its event pipe and
 *		its wait set.
 *
 * Invariants:
 *	- A worker's statements name every object: its search_path is
 *	  pg_catalog, so nothing else resolves.
 *	- A worker gives way to DDL on the extension's tables in a deadlock
 *	  (deadlock_timeout below the sessions' default).
 *	- The event pipe is non-blocking at both ends: librdkafka writes a
 *	  byte to it when its queue gets something and must never block; the
 *	  worker drains it when the wait set reports it readable.
 *	- The wait set is the worker's one wait: its latch, postmaster death
 *	  (exit), and the pipe.
 *	- Nothing here knows which worker calls it.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <fcntl.h>
#include <unistd.h>

#include "miscadmin.h"
#include "storage/latch.h"
#include "utils/guc.h"

#include "base/compat.h"
#include "base/base.h"

/*
 * OutboxWorkerStart
 *		Set the worker's settings, make its event pipe (event_pipe[0] to
 *		read, [1] for librdkafka) and return its wait set (in cxt where
 *		the server version allows: compat.h).  what names the worker in
 *		the error when the pipe cannot be made.  Call it once, connected
 *		to the database.
 */
WaitEventSet *
OutboxWorkerStart(MemoryContext cxt, int event_pipe[2], const char *what)
{
	WaitEventSet *wait_set;

	SetConfigOption("search_path", "pg_catalog", PGC_SUSET, PGC_S_OVERRIDE);

	/*
	 * A statement planned with plain scans disabled (the relay's batch
	 * bounds) has its cost estimate inflated far past jit_above_cost:
	 * compiling it would add milliseconds to every wake-up for a query that
	 * runs in microseconds.  No worker statement gains from JIT.
	 */
	SetConfigOption("jit", "off", PGC_SUSET, PGC_S_OVERRIDE);

	/*
	 * DDL on the extension's tables (DROP EXTENSION outbox) can lock them
	 * in the order opposite to a worker's statement.  Checking for a
	 * deadlock sooner than the sessions' default makes this worker the one
	 * that gives way (it errors out, is started again and finds the
	 * extension gone), not the user's command.
	 */
	SetConfigOption("deadlock_timeout", "100ms", PGC_SUSET, PGC_S_OVERRIDE);

	if (pipe(event_pipe) != 0 ||
		fcntl(event_pipe[0], F_SETFL, O_NONBLOCK) != 0 ||
		fcntl(event_pipe[1], F_SETFL, O_NONBLOCK) != 0)
		ereport(ERROR,
				(errcode_for_file_access(),
				 errmsg("could not create the %s's event pipe: %m", what)));
	wait_set = OutboxCreateWaitEventSet(cxt, 3);
	AddWaitEventToSet(wait_set, WL_LATCH_SET, PGINVALID_SOCKET, MyLatch, NULL);
	AddWaitEventToSet(wait_set, WL_EXIT_ON_PM_DEATH, PGINVALID_SOCKET, NULL, NULL);
	AddWaitEventToSet(wait_set, WL_SOCKET_READABLE, event_pipe[0], NULL, NULL);
	return wait_set;
}
