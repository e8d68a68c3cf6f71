/*-------------------------------------------------------------------------
 *
 * shmem/relay_slots.c
 *		The outbox's shared memory: the hooks that create it, and the relay
 *		slots, one per database with a relay.  Only this file knows a
 *		slot's layout; others call the functions below.  The small tables
 *		through which the launcher, probes and backends pass word to each
 *		other are handoff.c's, in an area of their own under a lock of their
 *		own; this file only asks for their space.
 *
 * Locking protocol (written as pg_stat_statements writes its own):
 *	- outbox_shared->lock, the LWLock of the "outbox" tranche, protects
 *	  which database each slot belongs to (slot->dboid) and
 *	  no_worker_since.  Held exclusively to change them (assign or free a
 *	  slot, attach a relay to its slot, record a lack of workers) and to
 *	  signal a relay; shared to find a slot by database or read them.
 *	- slot->mutex, the slot's spinlock, protects every other field of the
 *	  slot.  It is taken with the LWLock held in either mode, so that the
 *	  slot still belongs to the database it was found for; the one
 *	  exception is the relay attached to the slot (below).  While it is
 *	  held nothing is done but a few assignments or a copy.
 *	- Lock order: the LWLock, then one slot's spinlock.  handoff.c's lock
 *	  is never taken while either is held.  No slot pointer leaves this
 *	  file except the relay's own: readers get a copy (OutboxSlotRead),
 *	  everyone else names the database.
 *	- A relay owns its slot from OutboxSlotAttach to OutboxSlotDetach: a
 *	  slot with a relay attached (pid != 0) is never freed or handed to
 *	  another database, so the relay keeps the pointer and takes only the
 *	  spinlock.  At most one relay per database: the claim (setting pid) is
 *	  made under the exclusive LWLock and only when no other relay holds
 *	  the slot.
 *	- Who writes what: committing backends add to committed_events and
 *	  set replay_pending, check_extension and, at the first commit into an
 *	  empty backlog, oldest_pending; emitters, with a backlog limit set,
 *	  count refusals and set or clear refusing; commands needing a
 *	  database to themselves set hold_until; the launcher assigns, resets
 *	  and frees slots; the attached relay writes everything else.
 *	- Liveness is never judged by kill(pid, 0), which a reused pid fools.
 *	  A relay clears its pid when it exits (before_shmem_exit, so also on
 *	  ERROR), so a non-zero pid names a live relay; a crash of any backend
 *	  resets shared memory, so no pid survives one.  A relay is signalled
 *	  only under the exclusive LWLock, which it needs to clear its pid, so
 *	  the signal cannot reach a process that has reused the pid.
 *	- A committing backend (and, with a backlog limit set, an emitting
 *	  one) takes the LWLock shared and one spinlock, sets the relay's
 *	  latch after releasing both, and waits for nothing else.
 *
 * Nothing here runs SQL or talks to Kafka.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <signal.h>

#include "access/xact.h"
#include "miscadmin.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/proc.h"
#include "storage/shmem.h"
#include "storage/spin.h"
#include "utils/timestamp.h"

#include "base/base.h"
#include "shmem/shmem.h"
#include "shmem/shmem_area.h"

/* the recent window: OUTBOX_WINDOWS periods of OUTBOX_WINDOW_SECS */
#define OUTBOX_WINDOWS		6
#define OUTBOX_WINDOW_SECS	10

typedef struct OutboxWindow
{
	int64		period;			/* which period this entry holds */
	uint64		events;
	uint64		bytes;
	uint64		latency[OUTBOX_LAT_NBUCKETS];
} OutboxWindow;

/*
 * One relay's slot; see the locking protocol above.  v holds what readers
 * get a copy of; its derived fields (backlog, minute_*, slots_full,
 * no_worker_since) are filled in by OutboxSlotRead, not kept here.
 */
struct OutboxSlot
{
	Oid			dboid;			/* InvalidOid: slot free; under the LWLock */
	slock_t		mutex;
	/* OutboxSlotAcquire zeroes everything from here on */
	Latch	   *latch;			/* the relay's latch, NULL when none */
	bool		replay_pending; /* a commit queued replays */
	bool		check_extension;	/* DROP EXTENSION committed */
	TimestampTz hold_until;		/* launcher must not start a relay before */

	/* backlog: the open batch's remainder plus what committed since */
	uint64		committed_events;	/* added by emitters at commit */
	uint64		committed_at_open;
	int64		batch_remaining;

	uint64		pages;
	OutboxWindow window[OUTBOX_WINDOWS];
	OutboxSlotView v;
};

typedef struct OutboxShared
{
	LWLock	   *lock;
	TimestampTz no_worker_since;	/* launcher lacks a worker slot, or 0 */
	int			nslots;
	OutboxSlot	slots[FLEXIBLE_ARRAY_MEMBER];
} OutboxShared;

static OutboxShared *outbox_shared = NULL;

static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

/* the area of a room above this one (emit's counter rows), asked for and
 * made in the same hooks */
static void (*upper_request) (void) = NULL;
static void (*upper_init) (void) = NULL;

/*
 * What operators see, by OutboxRelayState; the one spelling of each.  States
 * sharing a name are adjacent: metrics() lists each name once.
 */
static const char *const relay_state_names[] = {
	[OUTBOX_RELAY_STARTING] = "starting",
	[OUTBOX_RELAY_IDLE] = "running",
	[OUTBOX_RELAY_PUBLISHING] = "running",	/* operators see one state */
	[OUTBOX_RELAY_PAUSED] = "paused",
	[OUTBOX_RELAY_BACKING_OFF] = "backing off",
	[OUTBOX_RELAY_NOT_CONFIGURED] = "not configured",
	[OUTBOX_RELAY_WAITING_STANDBY] = "waiting for standby",
	[OUTBOX_RELAY_FENCED] = "fenced",
	[OUTBOX_RELAY_STOPPED] = "stopped",
};

StaticAssertDecl(lengthof(relay_state_names) == OUTBOX_RELAY_NSTATES,
				 "a relay state has no name");

static const OutboxShmemArea relay_slots_area = {
	"outbox", offsetof(OutboxShared, slots), sizeof(OutboxSlot),
	&outbox_max_databases, offsetof(OutboxShared, lock),
	offsetof(OutboxShared, nslots), offsetof(OutboxSlot, mutex),
	(void **) &outbox_shared
};

/* every area of this room, asked for and made in this order */
static const OutboxShmemArea *const areas[] = {
	&relay_slots_area, &OutboxHandoffArea, &OutboxInboxArea
};

static void
outbox_shmem_request(void)
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
	for (int i = 0; i < lengthof(areas); i++)
		OutboxShmemAreaRequest(areas[i]);
	upper_request();
}

static void
outbox_shmem_startup(void)
{
	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();

	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	for (int i = 0; i < lengthof(areas); i++)
		OutboxShmemAreaAttach(areas[i]);
	upper_init();
	LWLockRelease(AddinShmemInitLock);
}

/*
 * OutboxShmemInstallHooks
 *		Ask for shared memory; called from _PG_init under preload only.
 *		request and init ask for and make one more area, of a room above
 *		this one, in the same hooks (init under AddinShmemInitLock).
 */
void
OutboxShmemInstallHooks(void (*request) (void), void (*init) (void))
{
	upper_request = request;
	upper_init = init;
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

/*
 * OutboxRelayStateName
 *		The name operators see for state (status(), metrics(), log lines).
 */
const char *
OutboxRelayStateName(OutboxRelayState state)
{
	if ((int) state < 0 || state >= OUTBOX_RELAY_NSTATES)
		return "unknown";
	return relay_state_names[state];
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
 * ---- Called by user backends: commits, the utility hook ----
 */

/*
 * tell_relay
 *		A commit's news for dboid's relay, if it has a slot: events emitted
 *		(replay: replays queued), or check_extension: DROP EXTENSION outbox
 *		committed.  Its latch is set after the locks are released.
 */
static void
tell_relay(Oid dboid, bool replay, int events, bool check_extension)
{
	OutboxSlot *slot;
	Latch	   *latch = NULL;
	TimestampTz committed_at = GetCurrentTransactionStopTimestamp();

	if (outbox_shared == NULL)
		return;
	LWLockAcquire(outbox_shared->lock, LW_SHARED);
	slot = find_slot_locked(dboid);
	if (slot != NULL)
	{
		SpinLockAcquire(&slot->mutex);
		/* a paused relay reads everything when it resumes: let it sleep */
		if (check_extension || (slot->v.state != OUTBOX_RELAY_PAUSED &&
								slot->v.state != OUTBOX_RELAY_NOT_CONFIGURED))
			latch = slot->latch;
		slot->check_extension |= check_extension;
		slot->replay_pending |= replay;
		slot->committed_events += events;

		/*
		 * The relay learns the oldest pending event's age when it reads a
		 * page, which a paused, unconfigured or busy relay does not do: until
		 * then, the first commit since the backlog was empty stands for it,
		 * so that status() and health() see events waiting.
		 */
		if (events > 0 && slot->v.oldest_pending == 0)
			slot->v.oldest_pending = committed_at;
		SpinLockRelease(&slot->mutex);
	}
	LWLockRelease(outbox_shared->lock);
	if (latch != NULL)
		SetLatch(latch);
}

/*
 * OutboxWakeRelay
 *		At commit: the transaction emitted events into dboid (and queued
 *		replays); wake its relay unless it is paused.
 */
void
OutboxWakeRelay(Oid dboid, bool replay, int events)
{
	tell_relay(dboid, replay, events, false);
}

/* the backlog as of now: the batch's remainder and what committed since (under slot->mutex) */
static int64
slot_backlog(const OutboxSlot *slot)
{
	return Max(slot->batch_remaining +
			   (int64) (slot->committed_events - slot->committed_at_open), 0);
}

/*
 * OutboxSlotRefuses
 *		emit(): whether dboid's backlog, as its relay last said (*backlog,
 *		*oldest), is past the limits at now; a refusal is counted, *first if
 *		refusing starts.  It ends under 90% of them (OutboxBacklogRelieved),
 *		found by the relay's report or here (*ended).  False without a slot.
 */
bool
OutboxSlotRefuses(Oid dboid, TimestampTz now, int64 *backlog, TimestampTz *oldest,
				  bool *first, bool *ended)
{
	OutboxSlot *slot;
	bool		refuse = false;

	*first = false;
	*ended = false;
	if (outbox_shared == NULL)
		return false;
	LWLockAcquire(outbox_shared->lock, LW_SHARED);
	slot = find_slot_locked(dboid);
	if (slot != NULL)
	{
		SpinLockAcquire(&slot->mutex);
		*backlog = slot_backlog(slot);
		*oldest = slot->v.oldest_pending;
		refuse = OutboxBacklogOverLimits(*backlog, *oldest, now);
		if (refuse)
		{
			slot->v.emit_refused++;
			*first = !slot->v.refusing;
			slot->v.refusing = true;
		}
		else if (slot->v.refusing && OutboxBacklogRelieved(*backlog, *oldest, now))
		{
			/* the relay reports nothing while paused or unable to read */
			slot->v.refusing = false;
			*ended = true;
		}
		SpinLockRelease(&slot->mutex);
	}
	LWLockRelease(outbox_shared->lock);
	return refuse;
}

/*
 * OutboxRequestExtensionCheck
 *		DROP EXTENSION outbox committed: have dboid's relay look whether its
 *		extension is still there, even while it is paused.
 */
void
OutboxRequestExtensionCheck(Oid dboid)
{
	tell_relay(dboid, false, 0, true);
}

/*
 * OutboxHoldDatabase
 *		Stop dboid's relay and keep the launcher from restarting it for
 *		hold_ms, so that a command needing the database to itself (DROP
 *		DATABASE, ALTER DATABASE ... RENAME, CREATE DATABASE ... TEMPLATE)
 *		does not find the relay connected.  The relay is signalled under the
 *		exclusive lock: it cannot detach meanwhile, so its pid is its own.
 */
void
OutboxHoldDatabase(Oid dboid, int hold_ms)
{
	OutboxSlot *slot;
	TimestampTz until = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), hold_ms);

	if (outbox_shared == NULL)
		return;
	LWLockAcquire(outbox_shared->lock, LW_EXCLUSIVE);
	slot = find_slot_locked(dboid);
	if (slot != NULL)
		OutboxShmemHoldAndStop(&slot->mutex, &slot->hold_until, &slot->v.pid, until);
	LWLockRelease(outbox_shared->lock);
	OutboxInboxHoldDatabase(dboid, until);
}

/*
 * ---- Called by the launcher ----
 */

/*
 * OutboxSetNoWorker
 *		Launcher: whether it failed to get a background worker slot (since
 *		when: OutboxSlotView.no_worker_since), so that status() and health()
 *		can name the cause.
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

/*
 * OutboxSlotAcquire
 *		Launcher: make sure dboid has a slot, assigning a free one (reset)
 *		if needed.  Returns false when every slot is taken; else *held says
 *		whether a command holds the database (no relay may start yet).
 */
bool
OutboxSlotAcquire(Oid dboid, bool *held)
{
	OutboxSlot *slot;
	TimestampTz now = GetCurrentTimestamp();

	*held = false;
	LWLockAcquire(outbox_shared->lock, LW_EXCLUSIVE);
	slot = find_slot_locked(dboid);
	if (slot == NULL && (slot = find_slot_locked(InvalidOid)) != NULL)
	{
		SpinLockAcquire(&slot->mutex);
		memset((char *) slot + offsetof(OutboxSlot, latch), 0,
			   sizeof(OutboxSlot) - offsetof(OutboxSlot, latch));
		slot->v.state = OUTBOX_RELAY_STOPPED;
		SpinLockRelease(&slot->mutex);
		slot->dboid = dboid;
	}
	if (slot != NULL)
	{
		SpinLockAcquire(&slot->mutex);
		*held = slot->hold_until > now;
		SpinLockRelease(&slot->mutex);
	}
	LWLockRelease(outbox_shared->lock);
	return slot != NULL;
}

/*
 * OutboxSlotRelease
 *		Launcher: free dboid's slot (its database is gone or has no
 *		extension), unless a relay is still attached to it.
 */
void
OutboxSlotRelease(Oid dboid)
{
	OutboxSlot *slot;
	int			pid = 0;

	LWLockAcquire(outbox_shared->lock, LW_EXCLUSIVE);
	slot = find_slot_locked(dboid);
	if (slot != NULL)
	{
		SpinLockAcquire(&slot->mutex);
		pid = slot->v.pid;
		SpinLockRelease(&slot->mutex);
		if (pid == 0)
			slot->dboid = InvalidOid;
	}
	LWLockRelease(outbox_shared->lock);
}

/*
 * ---- Readers: the launcher, status(), metrics(), health() ----
 */

/*
 * view_from_copy
 *		Fill out from a private copy of a slot (no lock needed): its figures,
 *		and the backlog and the last minute's, derived as of now.
 */
static void
view_from_copy(const OutboxSlot *s, OutboxSlotView *out)
{
	int64		period = GetCurrentTimestamp() / (OUTBOX_WINDOW_SECS * USECS_PER_SEC);
	int			w;
	int			b;

	*out = s->v;
	out->backlog = slot_backlog(s);
	for (w = 0; w < OUTBOX_WINDOWS; w++)
	{
		const OutboxWindow *win = &s->window[w];

		if (win->period <= period - OUTBOX_WINDOWS || win->period > period)
			continue;
		/* the last minute: whole periods, plus the one under way */
		out->minute_events += win->events;
		out->minute_bytes += win->bytes;
		for (b = 0; b < OUTBOX_LAT_NBUCKETS; b++)
			out->minute_latency[b] += win->latency[b];
	}
}

/*
 * OutboxSlotRead
 *		Copy what readers need of dboid's slot into out.  The slot is found,
 *		and copied, under the LWLock, so it is dboid's own; the launcher's
 *		shortage of slots and workers is read under the same lock.  Returns
 *		false when dboid has no slot: out then says no relay runs (pid 0,
 *		state stopped, brokers_up -1, figures 0).
 */
bool
OutboxSlotRead(Oid dboid, OutboxSlotView *out)
{
	OutboxSlot	copy;
	OutboxSlot *slot = NULL;
	int			in_use = 0;
	int			i;

	memset(&copy, 0, sizeof(copy));
	copy.v.state = OUTBOX_RELAY_STOPPED;
	copy.v.brokers_up = -1;
	if (outbox_shared != NULL)
	{
		LWLockAcquire(outbox_shared->lock, LW_SHARED);
		for (i = 0; i < outbox_shared->nslots; i++)
		{
			if (OidIsValid(outbox_shared->slots[i].dboid))
				in_use++;
			if (outbox_shared->slots[i].dboid == dboid)
				slot = &outbox_shared->slots[i];
		}
		if (slot != NULL)
		{
			SpinLockAcquire(&slot->mutex);
			memcpy(&copy, slot, sizeof(OutboxSlot));
			SpinLockRelease(&slot->mutex);
		}
		copy.v.slots_full = in_use >= outbox_shared->nslots;
		copy.v.no_worker_since = outbox_shared->no_worker_since;
		LWLockRelease(outbox_shared->lock);
	}
	view_from_copy(&copy, out);
	return slot != NULL;
}

/*
 * ---- Called by the relay attached to the slot ----
 */

/*
 * OutboxSlotAttach
 *		Relay: claim dboid's slot for the calling process.  NULL if the
 *		launcher assigned none, or if another relay holds it (*other_pid is
 *		then its pid, else 0): the caller then exits.  The claim is made
 *		under the exclusive lock, so two relays started for one database
 *		(by a launcher and its restarted successor) cannot both win.  The
 *		slot is the caller's until OutboxSlotDetach.
 */
OutboxSlot *
OutboxSlotAttach(Oid dboid, int *other_pid)
{
	OutboxSlot *slot;
	TimestampTz now = GetCurrentTimestamp();

	*other_pid = 0;
	LWLockAcquire(outbox_shared->lock, LW_EXCLUSIVE);
	slot = find_slot_locked(dboid);
	if (slot != NULL)
	{
		SpinLockAcquire(&slot->mutex);
		if (slot->v.pid != 0 && slot->v.pid != MyProcPid)
			*other_pid = slot->v.pid;
		else
		{
			slot->v.pid = MyProcPid;
			slot->latch = MyLatch;
			slot->v.state = OUTBOX_RELAY_STARTING;
			slot->v.no_extension = false;
			slot->v.started_at = now;
			slot->v.brokers_up = -1;
			slot->batch_remaining = 0;
			slot->committed_at_open = slot->committed_events;
			slot->v.oldest_pending = 0;
			slot->v.standby_wait[0] = '\0';
		}
		SpinLockRelease(&slot->mutex);
	}
	LWLockRelease(outbox_shared->lock);
	return *other_pid != 0 ? NULL : slot;
}

/*
 * OutboxSlotDetach
 *		Relay, on exit: nobody is behind this slot's latch any more.  The
 *		launcher is woken: it may be watching a relay it adopted.
 */
void
OutboxSlotDetach(OutboxSlot *slot)
{
	bool		detached = false;

	LWLockAcquire(outbox_shared->lock, LW_SHARED);
	SpinLockAcquire(&slot->mutex);
	if (slot->v.pid == MyProcPid)
	{
		slot->v.pid = 0;
		slot->latch = NULL;
		slot->v.state = OUTBOX_RELAY_STOPPED;
		detached = true;
	}
	SpinLockRelease(&slot->mutex);
	LWLockRelease(outbox_shared->lock);
	if (detached)
		OutboxWakeLauncher();
}

/*
 * OutboxSlotSetState
 *		Relay: what it is doing now, for status() and health().
 */
void
OutboxSlotSetState(OutboxSlot *slot, OutboxRelayState state)
{
	OutboxShmemSet(&slot->mutex, &slot->v.state, &state, sizeof(state));
}

/*
 * OutboxSlotIsHeld
 *		Whether a command is waiting for this relay's database to be free.
 */
bool
OutboxSlotIsHeld(OutboxSlot *slot)
{
	return OutboxShmemBefore(&slot->mutex, &slot->hold_until);
}

/*
 * OutboxSlotMarkNoExtension
 *		Relay, before exiting: its database has no outbox extension, so the
 *		launcher should not restart it.
 */
void
OutboxSlotMarkNoExtension(OutboxSlot *slot)
{
	OutboxShmemSetFlag(&slot->mutex, &slot->v.no_extension);
}

/*
 * OutboxSlotTakeExtensionCheck
 *		Relay: whether a DROP EXTENSION committed since the last call, so
 *		that it looks for its extension again.
 */
bool
OutboxSlotTakeExtensionCheck(OutboxSlot *slot)
{
	return OutboxShmemTakeFlag(&slot->mutex, &slot->check_extension);
}

/*
 * OutboxSlotCountError
 *		Relay: record the last error for status().
 */
void
OutboxSlotCountError(OutboxSlot *slot, const char *message)
{
	OutboxShmemSetText(&slot->mutex, slot->v.last_error, sizeof(slot->v.last_error),
					   message, &slot->v.last_error_at);
}

/*
 * OutboxSlotSetStandbyWait
 *		Relay: why the page in hand waits for a standby (relay_standby.c),
 *		for health(); NULL when it no longer does.
 */
void
OutboxSlotSetStandbyWait(OutboxSlot *slot, const char *why)
{
	OutboxShmemSetText(&slot->mutex, slot->v.standby_wait, sizeof(slot->v.standby_wait),
					   why != NULL ? why : "", NULL);
}

/*
 * OutboxSlotTakeReplayPending
 *		Relay: whether replays were queued since the last call.
 */
bool
OutboxSlotTakeReplayPending(OutboxSlot *slot)
{
	return OutboxShmemTakeFlag(&slot->mutex, &slot->replay_pending);
}

/* the publish latency histogram's bucket bounds, microseconds */
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
 * add_delivered, leave_batch, set_backlog
 *		The parts of a round's report; the caller holds slot->mutex.
 */
static void
add_delivered(OutboxSlot *slot, const OutboxDeliveryTally *t, TimestampTz now)
{
	int64		period = now / (OUTBOX_WINDOW_SECS * USECS_PER_SEC);
	OutboxWindow *w = &slot->window[period % OUTBOX_WINDOWS];
	int			b;

	if (w->period != period)
	{
		memset(w, 0, sizeof(OutboxWindow));
		w->period = period;
	}
	for (b = 0; b < OUTBOX_LAT_NBUCKETS; b++)
	{
		slot->v.latency[b] += t->latency[b];
		w->latency[b] += t->latency[b];
	}
	slot->v.latency_sum += t->latency_sum;
	slot->v.published += t->events;
	slot->v.published_bytes += t->bytes;
	w->events += t->events;
	w->bytes += t->bytes;
	slot->v.last_delivery = now;
}

/*
 * Events of the open batch were acknowledged.  They leave the backlog now
 * rather than when their whole page settles, so that the part of a page
 * delivered before an outage is not counted as pending for as long as the
 * outage lasts; the next set_backlog sets the figure from the relay's count.
 */
static void
leave_batch(OutboxSlot *slot, int64 events)
{
	slot->batch_remaining = Max(slot->batch_remaining - events, 0);
}

/* OutboxRoundReport's set_backlog: see its fields */
static void
set_backlog(OutboxSlot *slot, bool batch_opened, int64 remaining,
			TimestampTz oldest, int page_size)
{
	if (batch_opened)
		slot->committed_at_open = slot->committed_events;
	slot->batch_remaining = Max(remaining, 0);
	if (oldest >= 0)
		slot->v.oldest_pending = oldest;
	slot->v.page_size = page_size;
}

/*
 * OutboxSlotReportRound
 *		Relay: one round's figures, added to its slot at once (see
 *		OutboxRoundReport for what each field means).
 */
void
OutboxSlotReportRound(OutboxSlot *slot, const OutboxRoundReport *r)
{
	TimestampTz now = GetCurrentTimestamp();
	int			c;
	int64		relieved = -1;

	SpinLockAcquire(&slot->mutex);
	slot->pages += r->pages;
	slot->v.retries += r->retries;
	for (c = 0; c < lengthof(slot->v.failures); c++)
		slot->v.failures[c] += r->failures[c];
	if (r->brokers_up != OUTBOX_BROKERS_UNCHANGED)
		slot->v.brokers_up = r->brokers_up;
	if (r->delivered.events > 0)
	{
		add_delivered(slot, &r->delivered, now);
		if (r->batch_events)
			leave_batch(slot, (int64) r->delivered.events);
	}
	if (r->set_backlog)
		set_backlog(slot, r->batch_opened, r->batch_remaining,
					r->oldest_pending, r->page_size);
	if (slot->v.refusing && OutboxBacklogRelieved(slot_backlog(slot),
												  slot->v.oldest_pending, now))
	{
		slot->v.refusing = false;
		relieved = slot_backlog(slot);
	}
	SpinLockRelease(&slot->mutex);
	if (relieved >= 0)
		ereport(LOG,
				(errmsg("outbox: emit() accepts events again: the backlog is " INT64_FORMAT
						" events, under 90%% of outbox.max_backlog and outbox.max_backlog_age",
						relieved)));
}
