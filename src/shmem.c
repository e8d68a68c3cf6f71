/*-------------------------------------------------------------------------
 *
 * shmem.c
 *		Shared state of the outbox: relay slots, latches, counters.
 *
 * Locking protocol:
 *	- The "outbox" LWLock tranche has one lock.  Held exclusively to assign
 *	  or free a slot (change slot->dboid) and to change the launcher's
 *	  fields or its request list; held shared to find a slot by database.
 *	- Every other field of a slot is read and written under the slot's
 *	  spinlock, with nothing else done while it is held.
 *	- A committing backend finds its database's slot under the shared lock
 *	  and sets the relay's latch; it never waits for anything else.
 *	- At most one relay per database: a relay claims its slot (sets pid)
 *	  under the exclusive lock and only if no other relay holds it; a relay
 *	  clears pid when it exits (before_shmem_exit, so also on ERROR).  A
 *	  non-zero pid therefore always names a live relay, whoever started it,
 *	  and a restarted launcher adopts it instead of starting another.  A
 *	  crash of any backend resets shared memory, so no pid survives one.
 *	- Probe results and prepared transactions' event counts are small
 *	  tables under the LWLock, held exclusively to change them.
 *
 * Nothing here runs SQL or talks to Kafka.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <signal.h>

#include "access/twophase.h"
#include "access/xact.h"
#include "miscadmin.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/proc.h"
#include "storage/shmem.h"
#include "utils/timestamp.h"

#include "outbox.h"

#define OUTBOX_MAX_REQUESTS 64

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

typedef struct OutboxShared
{
	LWLock	   *lock;
	int			launcher_pid;
	Latch	   *launcher_latch;
	TimestampTz no_worker_since;	/* launcher lacks a worker slot, or 0 */
	int			nrequests;
	Oid			requests[OUTBOX_MAX_REQUESTS];
	OutboxProbe probes[OUTBOX_MAX_PROBES];
	int			nprepared;		/* entries after the slots: PREPARED_ENTRIES */
	int			nslots;
	OutboxSlot	slots[FLEXIBLE_ARRAY_MEMBER];
} OutboxShared;

static OutboxShared *outbox_shared = NULL;

#define PREPARED_ENTRIES() \
	((OutboxPrepared *) ((char *) outbox_shared + MAXALIGN(outbox_slots_size())))
static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

static Size
outbox_slots_size(void)
{
	return add_size(offsetof(OutboxShared, slots),
					mul_size(outbox_max_databases, sizeof(OutboxSlot)));
}

static Size
outbox_shmem_size(void)
{
	return add_size(MAXALIGN(outbox_slots_size()),
					mul_size(max_prepared_xacts, sizeof(OutboxPrepared)));
}

static void
outbox_shmem_request(void)
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
	RequestAddinShmemSpace(outbox_shmem_size());
	RequestNamedLWLockTranche("outbox", 1);
}

static void
outbox_shmem_startup(void)
{
	bool		found;
	int			i;

	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();

	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	outbox_shared = ShmemInitStruct("outbox", outbox_shmem_size(), &found);
	if (!found)
	{
		memset(outbox_shared, 0, outbox_shmem_size());
		outbox_shared->lock = &(GetNamedLWLockTranche("outbox"))->lock;
		outbox_shared->nslots = outbox_max_databases;
		for (i = 0; i < outbox_shared->nslots; i++)
			SpinLockInit(&outbox_shared->slots[i].mutex);
		outbox_shared->nprepared = max_prepared_xacts;
	}
	LWLockRelease(AddinShmemInitLock);
}

/*
 * OutboxShmemInstallHooks
 *		Ask for shared memory; called from _PG_init under preload only.
 */
void
OutboxShmemInstallHooks(void)
{
	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = outbox_shmem_request;
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = outbox_shmem_startup;
}

/*
 * OutboxShmemAvailable
 *		Whether the library was preloaded, so that relays can exist.
 */
bool
OutboxShmemAvailable(void)
{
	return outbox_shared != NULL;
}

const char *
OutboxRelayStateName(OutboxRelayState state)
{
	switch (state)
	{
		case OUTBOX_RELAY_STARTING:
			return "starting";
		case OUTBOX_RELAY_IDLE:
			return "running";
		case OUTBOX_RELAY_PUBLISHING:
			return "running";
		case OUTBOX_RELAY_PAUSED:
			return "paused";
		case OUTBOX_RELAY_BACKING_OFF:
			return "backing off";
		case OUTBOX_RELAY_NOT_CONFIGURED:
			return "not configured";
		case OUTBOX_RELAY_STOPPED:
			return "stopped";
	}
	return "unknown";
}

/* caller holds the LWLock in any mode */
static OutboxSlot *
find_slot_locked(Oid dboid)
{
	int			i;

	for (i = 0; i < outbox_shared->nslots; i++)
		if (outbox_shared->slots[i].dboid == dboid)
			return &outbox_shared->slots[i];
	return NULL;
}

/*
 * OutboxWakeRelay
 *		Set the latch of dboid's relay, if one runs.  Called at commit;
 *		replay says the commit queued replays for it.
 */
void
OutboxWakeRelay(Oid dboid, bool replay, int events)
{
	OutboxSlot *slot;
	TimestampTz committed_at = GetCurrentTransactionStopTimestamp();

	if (outbox_shared == NULL)
		return;
	LWLockAcquire(outbox_shared->lock, LW_SHARED);
	slot = find_slot_locked(dboid);
	if (slot != NULL)
	{
		Latch	   *latch;

		SpinLockAcquire(&slot->mutex);
		/* a paused relay reads everything when it resumes: let it sleep */
		latch = (slot->state == OUTBOX_RELAY_PAUSED ||
				 slot->state == OUTBOX_RELAY_NOT_CONFIGURED) ? NULL : slot->latch;
		if (replay)
			slot->replay_pending = true;
		slot->committed_events += events;

		/*
		 * The relay learns the oldest pending event's age when it reads a
		 * page, which a paused, unconfigured or busy relay does not do: until
		 * then, the first commit since the backlog was empty stands for it,
		 * so that status() and health() see events waiting.
		 */
		if (events > 0 && slot->oldest_pending == 0)
			slot->oldest_pending = committed_at;
		SpinLockRelease(&slot->mutex);
		if (latch != NULL)
			SetLatch(latch);
	}
	LWLockRelease(outbox_shared->lock);
}

/*
 * OutboxRequestProbe
 *		Ask the launcher to look at dboid now (the extension was created).
 */
void
OutboxRequestProbe(Oid dboid)
{
	Latch	   *latch = NULL;

	if (outbox_shared == NULL)
		return;
	LWLockAcquire(outbox_shared->lock, LW_EXCLUSIVE);
	if (outbox_shared->nrequests < OUTBOX_MAX_REQUESTS)
		outbox_shared->requests[outbox_shared->nrequests++] = dboid;
	latch = outbox_shared->launcher_latch;
	LWLockRelease(outbox_shared->lock);
	if (latch != NULL)
		SetLatch(latch);
}

static void
launcher_detach(int code, Datum arg)
{
	LWLockAcquire(outbox_shared->lock, LW_EXCLUSIVE);
	if (outbox_shared->launcher_pid == MyProcPid)
	{
		outbox_shared->launcher_pid = 0;
		outbox_shared->launcher_latch = NULL;
	}
	LWLockRelease(outbox_shared->lock);
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

	LWLockAcquire(outbox_shared->lock, LW_EXCLUSIVE);
	if (outbox_shared->launcher_pid != 0 &&
		outbox_shared->launcher_pid != MyProcPid)
		ok = false;
	else
	{
		outbox_shared->launcher_pid = MyProcPid;
		outbox_shared->launcher_latch = MyLatch;
	}
	LWLockRelease(outbox_shared->lock);
	if (ok)
		before_shmem_exit(launcher_detach, (Datum) 0);
	return ok;
}

/*
 * OutboxLauncherTakeRequests
 *		Move up to max pending probe requests into out; returns how many.
 *		An overflowed request list is reported as a single InvalidOid,
 *		meaning "rescan everything".
 */
int
OutboxLauncherTakeRequests(Oid *out, int max)
{
	int			n;

	LWLockAcquire(outbox_shared->lock, LW_EXCLUSIVE);
	n = Min(outbox_shared->nrequests, max);
	memcpy(out, outbox_shared->requests, n * sizeof(Oid));
	if (outbox_shared->nrequests > max)
		out[0] = InvalidOid;
	outbox_shared->nrequests = 0;
	LWLockRelease(outbox_shared->lock);
	return n;
}

/*
 * OutboxSlotAcquire
 *		Launcher: the slot of dboid, assigning a free one if needed.
 *		Returns NULL when every slot is taken.
 */
OutboxSlot *
OutboxSlotAcquire(Oid dboid)
{
	OutboxSlot *slot;

	LWLockAcquire(outbox_shared->lock, LW_EXCLUSIVE);
	slot = find_slot_locked(dboid);
	if (slot == NULL)
	{
		slot = find_slot_locked(InvalidOid);
		if (slot != NULL)
		{
			SpinLockAcquire(&slot->mutex);
			memset((char *) slot + offsetof(OutboxSlot, pid), 0,
				   sizeof(OutboxSlot) - offsetof(OutboxSlot, pid));
			slot->state = OUTBOX_RELAY_STOPPED;
			SpinLockRelease(&slot->mutex);
			slot->dboid = dboid;
		}
	}
	LWLockRelease(outbox_shared->lock);
	return slot;
}

/*
 * OutboxSlotRelease
 *		Launcher: free dboid's slot (its database is gone or has no
 *		extension).
 */
void
OutboxSlotRelease(Oid dboid)
{
	OutboxSlot *slot;

	LWLockAcquire(outbox_shared->lock, LW_EXCLUSIVE);
	slot = find_slot_locked(dboid);
	/* a slot with a relay attached stays: that relay still uses it */
	if (slot != NULL && OutboxSlotRelayPid(slot) == 0)
		slot->dboid = InvalidOid;
	LWLockRelease(outbox_shared->lock);
}

/*
 * OutboxSlotFind
 *		The slot of dboid or NULL.  The pointer stays valid; whether it still
 *		belongs to dboid is only certain while the launcher keeps it.
 */
OutboxSlot *
OutboxSlotFind(Oid dboid)
{
	OutboxSlot *slot;

	if (outbox_shared == NULL)
		return NULL;
	LWLockAcquire(outbox_shared->lock, LW_SHARED);
	slot = find_slot_locked(dboid);
	LWLockRelease(outbox_shared->lock);
	return slot;
}

/*
 * OutboxSlotAttach
 *		Relay: claim dboid's slot for the calling process.  NULL if the
 *		launcher assigned none, or if another relay holds it (*other_pid is
 *		then its pid, else 0): the caller then exits.  The claim is made
 *		under the exclusive lock, so two relays started for one database
 *		(by a launcher and its restarted successor) cannot both win.
 */
OutboxSlot *
OutboxSlotAttach(Oid dboid, int *other_pid)
{
	OutboxSlot *slot;
	TimestampTz now = GetCurrentTimestamp();

	*other_pid = 0;
	LWLockAcquire(outbox_shared->lock, LW_EXCLUSIVE);
	slot = find_slot_locked(dboid);
	if (slot == NULL)
	{
		LWLockRelease(outbox_shared->lock);
		return NULL;
	}
	SpinLockAcquire(&slot->mutex);
	if (slot->pid != 0 && slot->pid != MyProcPid)
	{
		*other_pid = slot->pid;
		SpinLockRelease(&slot->mutex);
		LWLockRelease(outbox_shared->lock);
		return NULL;
	}
	slot->pid = MyProcPid;
	slot->latch = MyLatch;
	slot->state = OUTBOX_RELAY_STARTING;
	slot->no_extension = false;
	slot->started_at = now;
	slot->brokers_up = -1;
	slot->batch_remaining = 0;
	slot->committed_at_open = slot->committed_events;
	slot->oldest_pending = 0;
	SpinLockRelease(&slot->mutex);
	LWLockRelease(outbox_shared->lock);
	return slot;
}

/*
 * OutboxSlotDetach
 *		Relay, on exit: nobody is behind this slot's latch any more.  The
 *		launcher is woken: it may be watching a relay it adopted.
 */
void
OutboxSlotDetach(OutboxSlot *slot)
{
	Latch	   *launcher = NULL;

	LWLockAcquire(outbox_shared->lock, LW_SHARED);
	SpinLockAcquire(&slot->mutex);
	if (slot->pid == MyProcPid)
	{
		slot->pid = 0;
		slot->latch = NULL;
		slot->state = OUTBOX_RELAY_STOPPED;
		launcher = outbox_shared->launcher_latch;
	}
	SpinLockRelease(&slot->mutex);
	LWLockRelease(outbox_shared->lock);
	if (launcher != NULL)
		SetLatch(launcher);
}

/*
 * OutboxSlotRelayPid
 *		The pid of the relay attached to slot, 0 when none.
 */
int
OutboxSlotRelayPid(OutboxSlot *slot)
{
	int			pid;

	SpinLockAcquire(&slot->mutex);
	pid = slot->pid;
	SpinLockRelease(&slot->mutex);
	return pid;
}

/*
 * OutboxSlotsInUse
 *		How many relay slots are assigned to a database.
 */
int
OutboxSlotsInUse(void)
{
	int			n = 0;
	int			i;

	LWLockAcquire(outbox_shared->lock, LW_SHARED);
	for (i = 0; i < outbox_shared->nslots; i++)
		if (OidIsValid(outbox_shared->slots[i].dboid))
			n++;
	LWLockRelease(outbox_shared->lock);
	return n;
}

/*
 * OutboxSetNoWorker / OutboxNoWorkerSince
 *		Launcher: whether it failed to get a background worker slot (since
 *		when), so that status() and health() can name the cause.
 */
void
OutboxSetNoWorker(bool short_of_workers)
{
	TimestampTz now = GetCurrentTimestamp();

	LWLockAcquire(outbox_shared->lock, LW_EXCLUSIVE);
	if (!short_of_workers)
		outbox_shared->no_worker_since = 0;
	else if (outbox_shared->no_worker_since == 0)
		outbox_shared->no_worker_since = now;
	LWLockRelease(outbox_shared->lock);
}

TimestampTz
OutboxNoWorkerSince(void)
{
	TimestampTz since;

	LWLockAcquire(outbox_shared->lock, LW_SHARED);
	since = outbox_shared->no_worker_since;
	LWLockRelease(outbox_shared->lock);
	return since;
}

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

	LWLockAcquire(outbox_shared->lock, LW_EXCLUSIVE);
	for (i = 0; i < OUTBOX_MAX_PROBES; i++)
	{
		if (outbox_shared->probes[i].dboid == dboid)
		{
			free_entry = i;
			break;
		}
		if (!OidIsValid(outbox_shared->probes[i].dboid) && free_entry < 0)
			free_entry = i;
	}
	if (free_entry >= 0)
	{
		outbox_shared->probes[free_entry].dboid = dboid;
		outbox_shared->probes[free_entry].result = OUTBOX_PROBE_UNKNOWN;
	}
	LWLockRelease(outbox_shared->lock);
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

	LWLockAcquire(outbox_shared->lock, LW_EXCLUSIVE);
	for (i = 0; i < OUTBOX_MAX_PROBES; i++)
		if (outbox_shared->probes[i].dboid == dboid)
			outbox_shared->probes[i].result = has_extension ?
				OUTBOX_PROBE_EXTENSION : OUTBOX_PROBE_NO_EXTENSION;
	LWLockRelease(outbox_shared->lock);
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

	LWLockAcquire(outbox_shared->lock, LW_EXCLUSIVE);
	for (i = 0; i < OUTBOX_MAX_PROBES; i++)
		if (outbox_shared->probes[i].dboid == dboid)
		{
			result = outbox_shared->probes[i].result;
			outbox_shared->probes[i].dboid = InvalidOid;
		}
	LWLockRelease(outbox_shared->lock);
	return result;
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

	if (outbox_shared == NULL || outbox_shared->nprepared == 0)
		return;
	entries = PREPARED_ENTRIES();
	LWLockAcquire(outbox_shared->lock, LW_EXCLUSIVE);
	for (i = 0; i < outbox_shared->nprepared; i++)
	{
		if (OidIsValid(entries[i].dboid))
			continue;
		entries[i].dboid = dboid;
		entries[i].events = events;
		entries[i].replay = replay;
		strlcpy(entries[i].gid, gid, GIDSIZE);
		break;
	}
	LWLockRelease(outbox_shared->lock);
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
	if (outbox_shared == NULL || outbox_shared->nprepared == 0)
		return false;
	entries = PREPARED_ENTRIES();
	LWLockAcquire(outbox_shared->lock, LW_EXCLUSIVE);
	for (i = 0; i < outbox_shared->nprepared; i++)
	{
		if (entries[i].dboid != dboid || strcmp(entries[i].gid, gid) != 0)
			continue;
		*events = entries[i].events;
		*replay = entries[i].replay;
		entries[i].dboid = InvalidOid;
		found = true;
		break;
	}
	LWLockRelease(outbox_shared->lock);
	return found;
}

void
OutboxSlotSetState(OutboxSlot *slot, OutboxRelayState state)
{
	SpinLockAcquire(&slot->mutex);
	slot->state = state;
	SpinLockRelease(&slot->mutex);
}

/*
 * OutboxHoldDatabase
 *		Stop dboid's relay and keep the launcher from restarting it for
 *		hold_ms, so that a command needing the database to itself (DROP
 *		DATABASE, ALTER DATABASE ... RENAME, CREATE DATABASE ... TEMPLATE)
 *		does not find the relay connected.
 */
void
OutboxHoldDatabase(Oid dboid, int hold_ms)
{
	OutboxSlot *slot;
	int			pid = 0;
	TimestampTz until = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), hold_ms);

	if (outbox_shared == NULL)
		return;
	LWLockAcquire(outbox_shared->lock, LW_SHARED);
	slot = find_slot_locked(dboid);
	if (slot != NULL)
	{
		SpinLockAcquire(&slot->mutex);
		slot->hold_until = until;
		pid = slot->pid;
		SpinLockRelease(&slot->mutex);
	}
	LWLockRelease(outbox_shared->lock);
	if (pid != 0)
		kill(pid, SIGTERM);
}

/*
 * OutboxSlotIsHeld
 *		Whether a command is waiting for this relay's database to be free.
 */
bool
OutboxSlotIsHeld(OutboxSlot *slot)
{
	TimestampTz now = GetCurrentTimestamp();
	bool		held;

	SpinLockAcquire(&slot->mutex);
	held = slot->hold_until > now;
	SpinLockRelease(&slot->mutex);
	return held;
}

/*
 * OutboxSlotCountPage
 *		Relay: a page was settled and recorded.
 */
void
OutboxSlotCountPage(OutboxSlot *slot)
{
	SpinLockAcquire(&slot->mutex);
	slot->pages++;
	SpinLockRelease(&slot->mutex);
}

const int64 OutboxLatencyBounds[OUTBOX_LAT_NBUCKETS - 1] = {
	100, 250, 500, 1000, 2500, 5000, 10000, 25000, 50000, 100000,
	250000, 500000, 1000000, 2500000, 5000000, 10000000, 30000000, 60000000
};

/*
 * OutboxTallyAdd
 *		Relay, in local memory: one event delivered after latency_us; a
 *		negative latency (a replay) counts the event but not its latency.
 */
void
OutboxTallyAdd(OutboxDeliveryTally *tally, int64 latency_us, int bytes)
{
	int			b = 0;

	if (latency_us >= 0)
	{
		while (b < OUTBOX_LAT_NBUCKETS - 1 && latency_us > OutboxLatencyBounds[b])
			b++;
		tally->latency[b]++;
		tally->latency_sum += (double) latency_us / 1000000.0;
	}
	tally->events++;
	tally->bytes += bytes;
}

/*
 * OutboxSlotCountDelivered
 *		Relay: add a round's deliveries to the totals and the recent window.
 */
void
OutboxSlotCountDelivered(OutboxSlot *slot, const OutboxDeliveryTally *tally)
{
	TimestampTz now = GetCurrentTimestamp();
	int64		period = now / (OUTBOX_WINDOW_SECS * USECS_PER_SEC);
	OutboxWindow *w = &slot->window[period % OUTBOX_WINDOWS];
	int			b;

	if (tally->events == 0)
		return;
	SpinLockAcquire(&slot->mutex);
	if (w->period != period)
	{
		memset(w, 0, sizeof(OutboxWindow));
		w->period = period;
	}
	for (b = 0; b < OUTBOX_LAT_NBUCKETS; b++)
	{
		slot->latency[b] += tally->latency[b];
		w->latency[b] += tally->latency[b];
	}
	slot->latency_sum += tally->latency_sum;
	slot->published += tally->events;
	slot->published_bytes += tally->bytes;
	w->events += tally->events;
	w->bytes += tally->bytes;
	slot->last_delivery = now;
	SpinLockRelease(&slot->mutex);
}

/*
 * OutboxSlotReportRound
 *		Relay: one round's figures, added to its slot at once (see
 *		OutboxRoundReport for what each field means).
 */
void
OutboxSlotReportRound(OutboxSlot *slot, const OutboxRoundReport *r)
{
	const OutboxDeliveryTally *t = &r->delivered;
	TimestampTz now = GetCurrentTimestamp();
	int64		period = now / (OUTBOX_WINDOW_SECS * USECS_PER_SEC);
	OutboxWindow *w = &slot->window[period % OUTBOX_WINDOWS];
	int			b;

	SpinLockAcquire(&slot->mutex);
	slot->pages += r->pages;
	slot->retries += r->retries;
	for (b = 0; b < lengthof(slot->failures); b++)
		slot->failures[b] += r->failures[b];
	if (r->brokers_up != OUTBOX_BROKERS_UNCHANGED)
		slot->brokers_up = r->brokers_up;
	if (t->events > 0)
	{
		if (w->period != period)
		{
			memset(w, 0, sizeof(OutboxWindow));
			w->period = period;
		}
		for (b = 0; b < OUTBOX_LAT_NBUCKETS; b++)
		{
			slot->latency[b] += t->latency[b];
			w->latency[b] += t->latency[b];
		}
		slot->latency_sum += t->latency_sum;
		slot->published += t->events;
		slot->published_bytes += t->bytes;
		w->events += t->events;
		w->bytes += t->bytes;
		slot->last_delivery = now;
		if (r->batch_events)
			slot->batch_remaining = Max(slot->batch_remaining - (int64) t->events, 0);
	}
	if (r->set_backlog)
	{
		if (r->batch_opened)
			slot->committed_at_open = slot->committed_events;
		slot->batch_remaining = Max(r->batch_remaining, 0);
		if (r->oldest_pending >= 0)
			slot->oldest_pending = r->oldest_pending;
		slot->page_size = r->page_size;
	}
	SpinLockRelease(&slot->mutex);
}

/*
 * OutboxSlotSetBacklog
 *		Relay: where it stands.  remaining: events of the open batch not yet
 *		settled; batch_opened: the batch was just opened (or found empty), so
 *		from now on the backlog is remaining plus what commits later.
 *		oldest: created_at of the oldest event not yet delivered, 0 when
 *		none, -1 to keep the last one.
 */
void
OutboxSlotSetBacklog(OutboxSlot *slot, bool batch_opened, int64 remaining,
					 TimestampTz oldest, int page_size)
{
	SpinLockAcquire(&slot->mutex);
	if (batch_opened)
		slot->committed_at_open = slot->committed_events;
	slot->batch_remaining = Max(remaining, 0);
	if (oldest >= 0)
		slot->oldest_pending = oldest;
	slot->page_size = page_size;
	SpinLockRelease(&slot->mutex);
}

/*
 * OutboxSlotCountBatchDelivered
 *		Relay: events of the open batch were acknowledged.  They leave the
 *		backlog now rather than when their whole page settles, so that the
 *		part of a page delivered before an outage is not counted as pending
 *		for as long as the outage lasts.  The next OutboxSlotSetBacklog
 *		sets the figure again from the relay's own count.
 */
void
OutboxSlotCountBatchDelivered(OutboxSlot *slot, int64 events)
{
	SpinLockAcquire(&slot->mutex);
	slot->batch_remaining = Max(slot->batch_remaining - events, 0);
	SpinLockRelease(&slot->mutex);
}

void
OutboxSlotCountRetries(OutboxSlot *slot, int events)
{
	SpinLockAcquire(&slot->mutex);
	slot->retries += events;
	SpinLockRelease(&slot->mutex);
}

void
OutboxSlotSetBrokersUp(OutboxSlot *slot, int up)
{
	SpinLockAcquire(&slot->mutex);
	slot->brokers_up = up;
	SpinLockRelease(&slot->mutex);
}

/*
 * OutboxSlotCountError
 *		Relay: record the last error for status().
 */
void
OutboxSlotCountError(OutboxSlot *slot, const char *message)
{
	TimestampTz now = GetCurrentTimestamp();

	SpinLockAcquire(&slot->mutex);
	slot->last_error_at = now;
	strlcpy(slot->last_error, message, sizeof(slot->last_error));
	SpinLockRelease(&slot->mutex);
}

/*
 * OutboxSlotMarkNoExtension
 *		Relay, before exiting: its database has no outbox extension, so the
 *		launcher should not restart it.
 */
void
OutboxSlotMarkNoExtension(OutboxSlot *slot)
{
	SpinLockAcquire(&slot->mutex);
	slot->no_extension = true;
	SpinLockRelease(&slot->mutex);
}

/*
 * OutboxSlotTakeReplayPending
 *		Relay: whether replays were queued since the last call.
 */
bool
OutboxSlotTakeReplayPending(OutboxSlot *slot)
{
	bool		pending;

	SpinLockAcquire(&slot->mutex);
	pending = slot->replay_pending;
	slot->replay_pending = false;
	SpinLockRelease(&slot->mutex);
	return pending;
}

/*
 * OutboxSlotCountFailure
 *		Relay: one event's delivery failed with an error of class c.
 */
void
OutboxSlotCountFailure(OutboxSlot *slot, OutboxErrorClass c)
{
	SpinLockAcquire(&slot->mutex);
	slot->failures[c]++;
	SpinLockRelease(&slot->mutex);
}

/*
 * OutboxRequestExtensionCheck
 *		DROP EXTENSION outbox committed: have dboid's relay look whether its
 *		extension is still there, even while it is paused.
 */
void
OutboxRequestExtensionCheck(Oid dboid)
{
	OutboxSlot *slot = OutboxSlotFind(dboid);
	Latch	   *latch = NULL;

	if (slot == NULL)
		return;
	SpinLockAcquire(&slot->mutex);
	slot->check_extension = true;
	latch = slot->latch;
	SpinLockRelease(&slot->mutex);
	if (latch != NULL)
		SetLatch(latch);
}

/*
 * OutboxSlotTakeExtensionCheck
 *		Relay: whether a check was requested since the last call.
 */
bool
OutboxSlotTakeExtensionCheck(OutboxSlot *slot)
{
	bool		check;

	SpinLockAcquire(&slot->mutex);
	check = slot->check_extension;
	slot->check_extension = false;
	SpinLockRelease(&slot->mutex);
	return check;
}
