/*-------------------------------------------------------------------------
 *
 * launcher/probe.c
 *		The probe: a short-lived worker that tells the launcher whether one
 *		database has the outbox extension, then exits.
 *
 * Invariants:
 *	- A probe takes no relay slot: databases without the extension never
 *	  hold one, so they cannot keep a database that has it waiting for a
 *	  slot (outbox.max_databases).
 *	- It runs one catalog lookup in a transaction of its own, writes its
 *	  answer into shared memory (OutboxProbeReport) and exits 0; a probe
 *	  that fails reports nothing and the launcher probes again.
 *	- Where the extension is, it also asks for a slot for each of the
 *	  database's subscriptions, so that their workers start with the
 *	  server.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "postmaster/bgworker.h"
#include "storage/ipc.h"
#include "utils/snapmgr.h"

#include "shmem/shmem.h"
#include "store/store.h"
#include "consumer/consumer.h"
#include "launcher/launcher.h"

/*
 * OutboxProbeMain
 *		Entry point of a probe; main_arg is the database's OID.
 */
void
OutboxProbeMain(Datum main_arg)
{
	Oid			dboid = DatumGetObjectId(main_arg);
	bool		present;

	BackgroundWorkerUnblockSignals();
	BackgroundWorkerInitializeConnectionByOid(dboid, InvalidOid, 0);

	StartTransactionCommand();
	PushActiveSnapshot(GetTransactionSnapshot());
	present = OutboxStoreExtensionPresent();
	if (present)
		OutboxSubscriptionsAnnounce();
	PopActiveSnapshot();
	CommitTransactionCommand();

	OutboxProbeReport(dboid, present);
	proc_exit(0);
}
