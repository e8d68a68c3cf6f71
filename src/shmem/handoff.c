/*-------------------------------------------------------------------------
 *
 * shmem/handoff.c
 *		Small tables in shared memory through which processes that share no
 *		relay slot pass word to each other:
 *		- the launcher's sign-on: its pid and latch (OutboxLauncherAttach);
 *		- probe requests, user backends to the launcher: CREATE EXTENSION
 *		  outbox committed in a database (OutboxRequestProbe);
 *		- probe answers, a probe worker to the launcher: whether its
 *		  database has the extension (OutboxProbeBegin/Report/Take);
 *		- prepared transactions' event counts, PREPARE TRANSACTION to
 *		  COMMIT PREPARED (OutboxPreparedRemember/Take).
 *		Its area is asked for and created by relay_slots.c's hooks.
 *
 * Locking protocol: one LWLock (tranche "outbox handoff") protects every
 * field here.  Held exclusively to change anything, shared to read the
 * launcher's latch; no other lock is taken while it is held, and latches
 * are set after it is released.  The launcher clears its pid when it exits
 * (before_shmem_exit, so also on ERROR), so a non-zero pid names a live
 * launcher: liveness is never judged by kill(pid, 0), which a reused pid
 * fools.  A crash of any backend resets shared memory, so no pid survives
 * one.
 *
 * Nothing here runs SQL or talks to Kafka.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/twophase.h"
#include "miscadmin.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"

#include "shmem/shmem.h"
#include "shmem/shmem_area.h"

/* a probe worker's answer: does this database have the extension? */
typedef struct OutboxProbe
{
	Oid			dboid;			/* InvalidOid: entry free */
	int			result;			/* OUTBOX_PROBE_* */
} OutboxProbe;

/*
 * A prepared transaction that emitted events: COMMIT PREPARED adds them to
 * the backlog and wakes the relay, as a plain commit does.
 */
typedef struct OutboxPrepared
{
	Oid			dboid;			/* InvalidOid: entry free */
	int			events;
	bool		replay;
	char		gid[GIDSIZE];
} OutboxPrepared;

typedef struct OutboxHandoff
{
	LWLock	   *lock;
	int			launcher_pid;	/* 0 when no launcher runs */
	Latch	   *launcher_latch;
	int			nrequests;
	Oid			requests[OUTBOX_MAX_REQUESTS];
	OutboxProbe probes[OUTBOX_MAX_PROBES];
	int			nprepared;		/* max_prepared_xacts */
	OutboxPrepared prepared[FLEXIBLE_ARRAY_MEMBER];
} OutboxHandoff;

static OutboxHandoff *handoff = NULL;

/* handoff's area: relay_slots.c's hooks ask for it and attach it */
const OutboxShmemArea OutboxHandoffArea = {
	"outbox handoff", offsetof(OutboxHandoff, prepared), sizeof(OutboxPrepared),
	&max_prepared_xacts, offsetof(OutboxHandoff, lock),
	offsetof(OutboxHandoff, nprepared), -1, (void **) &handoff
};

/*
 * ---- The launcher's sign-on and its requests ----
 */

static void
launcher_detach(int code, Datum arg)
{
	LWLockAcquire(handoff->lock, LW_EXCLUSIVE);
	if (handoff->launcher_pid == MyProcPid)
	{
		handoff->launcher_pid = 0;
		handoff->launcher_latch = NULL;
	}
	LWLockRelease(handoff->lock);
}

/*
 * OutboxLauncherAttach
 *		Record the calling process as the launcher until it exits.  Returns
 *		false when another launcher is alive (the caller then exits).  The
 *		launcher clears its pid when it exits, so a recorded pid is alive.
 */
bool
OutboxLauncherAttach(void)
{
	bool		ok = true;

	LWLockAcquire(handoff->lock, LW_EXCLUSIVE);
	if (handoff->launcher_pid != 0 &&
		handoff->launcher_pid != MyProcPid)
		ok = false;
	else
	{
		handoff->launcher_pid = MyProcPid;
		handoff->launcher_latch = MyLatch;
	}
	LWLockRelease(handoff->lock);
	if (ok)
		before_shmem_exit(launcher_detach, (Datum) 0);
	return ok;
}

/*
 * OutboxLauncherTakeRequests
 *		Move the pending probe requests into out, which has room for
 *		OUTBOX_MAX_REQUESTS; returns how many.
 */
int
OutboxLauncherTakeRequests(Oid *out)
{
	int			n;

	LWLockAcquire(handoff->lock, LW_EXCLUSIVE);
	n = handoff->nrequests;
	memcpy(out, handoff->requests, n * sizeof(Oid));
	handoff->nrequests = 0;
	LWLockRelease(handoff->lock);
	return n;
}

/*
 * OutboxWakeLauncher
 *		Set the launcher's latch, if one runs.
 */
void
OutboxWakeLauncher(void)
{
	Latch	   *latch;

	if (handoff == NULL)
		return;
	LWLockAcquire(handoff->lock, LW_SHARED);
	latch = handoff->launcher_latch;
	LWLockRelease(handoff->lock);
	if (latch != NULL)
		SetLatch(latch);
}

/*
 * OutboxRequestProbe
 *		Ask the launcher to look at dboid now (the extension was created).
 *		While OUTBOX_MAX_REQUESTS requests wait the request is dropped; the
 *		launcher takes them all each time it wakes.
 */
void
OutboxRequestProbe(Oid dboid)
{
	if (handoff == NULL)
		return;
	LWLockAcquire(handoff->lock, LW_EXCLUSIVE);
	if (handoff->nrequests < OUTBOX_MAX_REQUESTS)
		handoff->requests[handoff->nrequests++] = dboid;
	LWLockRelease(handoff->lock);
	OutboxWakeLauncher();
}

/*
 * ---- Probe answers ----
 */

/*
 * OutboxProbeBegin
 *		Launcher: reserve an entry for a probe of dboid.  False when the
 *		table is full (probe later).
 */
bool
OutboxProbeBegin(Oid dboid)
{
	int			i;
	int			free_entry = -1;

	LWLockAcquire(handoff->lock, LW_EXCLUSIVE);
	for (i = 0; i < OUTBOX_MAX_PROBES; i++)
	{
		if (handoff->probes[i].dboid == dboid)
		{
			free_entry = i;
			break;
		}
		if (!OidIsValid(handoff->probes[i].dboid) && free_entry < 0)
			free_entry = i;
	}
	if (free_entry >= 0)
	{
		handoff->probes[free_entry].dboid = dboid;
		handoff->probes[free_entry].result = OUTBOX_PROBE_UNKNOWN;
	}
	LWLockRelease(handoff->lock);
	return free_entry >= 0;
}

/*
 * OutboxProbeReport
 *		Probe worker: whether its database has the extension.
 */
void
OutboxProbeReport(Oid dboid, bool has_extension)
{
	int			i;

	LWLockAcquire(handoff->lock, LW_EXCLUSIVE);
	for (i = 0; i < OUTBOX_MAX_PROBES; i++)
		if (handoff->probes[i].dboid == dboid)
			handoff->probes[i].result = has_extension ?
				OUTBOX_PROBE_EXTENSION : OUTBOX_PROBE_NO_EXTENSION;
	LWLockRelease(handoff->lock);
}

/*
 * OutboxProbeTake
 *		Launcher, once the probe of dboid stopped: its answer
 *		(OUTBOX_PROBE_UNKNOWN when it reported none); frees the entry.
 */
int
OutboxProbeTake(Oid dboid)
{
	int			result = OUTBOX_PROBE_UNKNOWN;
	int			i;

	LWLockAcquire(handoff->lock, LW_EXCLUSIVE);
	for (i = 0; i < OUTBOX_MAX_PROBES; i++)
		if (handoff->probes[i].dboid == dboid)
		{
			result = handoff->probes[i].result;
			handoff->probes[i].dboid = InvalidOid;
		}
	LWLockRelease(handoff->lock);
	return result;
}

/*
 * ---- Prepared transactions' event counts ----
 */

/* the gid of the PREPARE TRANSACTION this backend is running, or "" */
static char preparing_gid[GIDSIZE];

/*
 * OutboxPreparingGid
 *		The utility hook, at PREPARE TRANSACTION gid (NULL: the transaction
 *		aborted, no PREPARE is running): the gid OutboxNotePrepared files
 *		the transaction's counts under.
 */
void
OutboxPreparingGid(const char *gid)
{
	strlcpy(preparing_gid, gid ? gid : "", sizeof(preparing_gid));
}

/*
 * OutboxNotePrepared
 *		emit()'s callback, at PREPARE TRANSACTION: the transaction emitted
 *		events (queued replays); remember them under its gid for COMMIT
 *		PREPARED.  The utility hook and this callback run in either order.
 */
void
OutboxNotePrepared(int events, bool replay)
{
	if (preparing_gid[0] != '\0')
		OutboxPreparedRemember(preparing_gid, MyDatabaseId, events, replay);
	preparing_gid[0] = '\0';
}

/*
 * OutboxPreparedRemember
 *		At PREPARE TRANSACTION gid: the transaction emitted events (and
 *		queued replays) in dboid.  When the table is full the count is lost
 *		and the backlog catches up when the relay opens its next batch.
 */
void
OutboxPreparedRemember(const char *gid, Oid dboid, int events, bool replay)
{
	OutboxPrepared *entries;
	int			i;

	if (handoff == NULL || handoff->nprepared == 0)
		return;
	entries = handoff->prepared;
	LWLockAcquire(handoff->lock, LW_EXCLUSIVE);
	for (i = 0; i < handoff->nprepared; i++)
	{
		if (OidIsValid(entries[i].dboid))
			continue;
		entries[i].dboid = dboid;
		entries[i].events = events;
		entries[i].replay = replay;
		strlcpy(entries[i].gid, gid, GIDSIZE);
		break;
	}
	LWLockRelease(handoff->lock);
}

/*
 * OutboxPreparedTake
 *		COMMIT or ROLLBACK PREPARED gid finished in dboid: forget it and
 *		return what PREPARE recorded (false when nothing was).
 */
bool
OutboxPreparedTake(const char *gid, Oid dboid, int *events, bool *replay)
{
	OutboxPrepared *entries;
	bool		found = false;
	int			i;

	*events = 0;
	*replay = false;
	if (handoff == NULL || handoff->nprepared == 0)
		return false;
	entries = handoff->prepared;
	LWLockAcquire(handoff->lock, LW_EXCLUSIVE);
	for (i = 0; i < handoff->nprepared; i++)
	{
		if (entries[i].dboid != dboid || strcmp(entries[i].gid, gid) != 0)
			continue;
		*events = entries[i].events;
		*replay = entries[i].replay;
		entries[i].dboid = InvalidOid;
		found = true;
		break;
	}
	LWLockRelease(handoff->lock);
	return found;
}
