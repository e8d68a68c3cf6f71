/*-------------------------------------------------------------------------
 *
 * shmem/subscription_slots.c
 *		The subscription slots: one per subscription with a consumer worker
 *		(outbox.max_subscriptions of them), in an area of their own.  Only
 *		this file knows a slot's layout.
 *
 * Locking protocol:
 *	- inbox->lock, the LWLock of the "outbox inbox" tranche, protects which
 *	  subscription each slot belongs to (in_use, dboid, name) and the
 *	  claim of a worker (pid).  Held exclusively to change them, shared to
 *	  find a slot or copy one.
 *	- slot->mutex, a spinlock, protects every other field; it is taken
 *	  with the LWLock held in either mode, except by the worker attached to
 *	  the slot, which owns it until it detaches.  Nothing is done under it
 *	  but assignments and copies.
 *	- Lock order: handoff.c's lock and the relays' lock are never taken
 *	  while this one is held.  Latches are set after the locks are released.
 *	- Who writes what: committing backends ask for a slot (a subscription
 *	  was written: changed) and wake its worker (replays); commands that
 *	  need a database to themselves set hold_until; the launcher frees
 *	  slots marked gone with no worker, and says why a slot has no worker
 *	  (v.wait, v.wait_since: only while none is attached, so it never
 *	  writes beside a worker); the attached worker writes the rest.
 *	- Workers are signalled only under the exclusive lock, which a worker
 *	  needs to detach: the pid read is still the worker's.
 *	- A slot is the launcher's cue, not the truth: the worker reads its
 *	  subscription's row when it starts, and marks the slot gone when the
 *	  row is not there.  A crash of any backend resets shared memory; the
 *	  probes of the restarted launcher ask for the slots again.
 *
 * Nothing here runs SQL or talks to Kafka.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <signal.h>

#include "miscadmin.h"
#include "storage/lwlock.h"
#include "storage/proc.h"
#include "storage/shmem.h"
#include "storage/spin.h"
#include "utils/timestamp.h"

#include "shmem/shmem.h"
#include "shmem/shmem_area.h"

struct OutboxInboxSlot
{
	bool		in_use;			/* under the LWLock */
	slock_t		mutex;
	bool		gone;			/* the worker found no subscription row */
	bool		changed;		/* the row was written since the worker read it */
	bool		wake;			/* replays or discards to look at */
	TimestampTz hold_until;		/* no worker before (DROP DATABASE and such) */
	Latch	   *latch;			/* the worker's, NULL when none */
	OutboxInboxView v;
};

typedef struct OutboxInboxShared
{
	LWLock	   *lock;
	int			nslots;
	OutboxInboxSlot slots[FLEXIBLE_ARRAY_MEMBER];
} OutboxInboxShared;

static OutboxInboxShared *inbox = NULL;

#define INBOX_STATE_NAME(value, name) [value] = name,

/* by OutboxInboxState: the names its list in outbox.h gives */
static const char *const inbox_state_names[] = {
	OUTBOX_INBOX_STATES(INBOX_STATE_NAME)
};

const char *
OutboxInboxStateName(OutboxInboxState state)
{
	if (state < 0 || state >= OUTBOX_INBOX_NSTATES)
		return "unknown";
	return inbox_state_names[state];
}

/* the subscription slots' area: relay_slots.c's hooks ask for it and attach it */
const OutboxShmemArea OutboxInboxArea = {
	"outbox inbox", offsetof(OutboxInboxShared, slots), sizeof(OutboxInboxSlot),
	&outbox_max_subscriptions, offsetof(OutboxInboxShared, lock),
	offsetof(OutboxInboxShared, nslots), offsetof(OutboxInboxSlot, mutex),
	(void **) &inbox
};

static OutboxInboxSlot *
find_locked(Oid dboid, const char *name)
{
	int			i;

	for (i = 0; i < inbox->nslots; i++)
	{
		OutboxInboxSlot *s = &inbox->slots[i];

		if (s->in_use && s->v.dboid == dboid && strcmp(s->v.name, name) == 0)
			return s;
	}
	return NULL;
}

/*
 * ---- Committing backends, probes ----
 */

/*
 * tell_locked
 *		Under the LWLock, news for the worker of slot s: it is no longer
 *		gone (revive), its row was written (changed), replays wait (wake).
 *		Returns its latch, for the caller to set once the locks are
 *		released.
 */
static Latch *
tell_locked(OutboxInboxSlot *s, bool revive, bool changed, bool wake)
{
	Latch	   *latch;

	SpinLockAcquire(&s->mutex);
	if (revive)
		s->gone = false;
	s->changed |= changed;
	s->wake |= wake;
	latch = s->latch;
	SpinLockRelease(&s->mutex);
	return latch;
}

/*
 * OutboxInboxHasRoom
 *		Whether a subscription of dboid named name has a slot or could get
 *		one (subscribe() refuses one that could not).
 */
bool
OutboxInboxHasRoom(Oid dboid, const char *name)
{
	bool		room = false;
	int			i;

	if (inbox == NULL)
		return false;
	LWLockAcquire(inbox->lock, LW_SHARED);
	for (i = 0; i < inbox->nslots && !room; i++)
		room = !inbox->slots[i].in_use ||
			(inbox->slots[i].v.dboid == dboid && strcmp(inbox->slots[i].v.name, name) == 0);
	LWLockRelease(inbox->lock);
	return room;
}

/*
 * OutboxInboxRequest
 *		The subscription dboid/name was written (or found by a probe, with
 *		changed false): give it a slot if it has none and tell its worker,
 *		which restarts to read the row again.  Returns false when every
 *		slot is taken.  Wakes the launcher.
 */
bool
OutboxInboxRequest(Oid dboid, const char *name, bool changed)
{
	OutboxInboxSlot *s;
	Latch	   *latch = NULL;
	int			i;

	if (inbox == NULL)
		return false;
	LWLockAcquire(inbox->lock, LW_EXCLUSIVE);
	s = find_locked(dboid, name);
	if (s == NULL)
	{
		for (i = 0; i < inbox->nslots; i++)
			if (!inbox->slots[i].in_use)
			{
				s = &inbox->slots[i];
				SpinLockAcquire(&s->mutex);
				s->gone = s->changed = s->wake = false;
				s->hold_until = 0;
				s->latch = NULL;
				memset(&s->v, 0, sizeof(s->v));
				s->v.dboid = dboid;
				strlcpy(s->v.name, name, sizeof(s->v.name));
				s->v.state = OUTBOX_INBOX_STOPPED;
				SpinLockRelease(&s->mutex);
				s->in_use = true;
				break;
			}
	}
	else
		latch = tell_locked(s, true, changed, false);
	LWLockRelease(inbox->lock);
	if (latch != NULL)
		SetLatch(latch);
	if (s != NULL)
		OutboxWakeLauncher();
	return s != NULL;
}

/*
 * OutboxInboxWake
 *		Ask the worker of dboid/name to look at its replays and parked keys.
 */
void
OutboxInboxWake(Oid dboid, const char *name)
{
	OutboxInboxSlot *s;
	Latch	   *latch = NULL;

	if (inbox == NULL)
		return;
	LWLockAcquire(inbox->lock, LW_SHARED);
	s = find_locked(dboid, name);
	if (s != NULL)
		latch = tell_locked(s, false, false, true);
	LWLockRelease(inbox->lock);
	if (latch != NULL)
		SetLatch(latch);
}

/*
 * OutboxInboxHoldDatabase
 *		Stop dboid's workers and keep them stopped until until (see
 *		OutboxHoldDatabase).  Signalled under the exclusive lock, which a
 *		worker needs to detach: the pid is still the worker's.
 */
void
OutboxInboxHoldDatabase(Oid dboid, TimestampTz until)
{
	int			i;

	if (inbox == NULL)
		return;
	LWLockAcquire(inbox->lock, LW_EXCLUSIVE);
	for (i = 0; i < inbox->nslots; i++)
	{
		OutboxInboxSlot *s = &inbox->slots[i];

		if (s->in_use && s->v.dboid == dboid)
			OutboxShmemHoldAndStop(&s->mutex, &s->hold_until, &s->v.pid, until);
	}
	LWLockRelease(inbox->lock);
}

/*
 * ---- The launcher ----
 */

int
OutboxInboxSlotCount(void)
{
	return inbox == NULL ? 0 : inbox->nslots;
}

/*
 * OutboxInboxSlotPeek
 *		Launcher: what slot i wants.  False when it is free; otherwise out
 *		says (OutboxInboxPeek).
 */
bool
OutboxInboxSlotPeek(int i, OutboxInboxPeek *out)
{
	OutboxInboxSlot *s = &inbox->slots[i];
	bool		in_use;

	LWLockAcquire(inbox->lock, LW_SHARED);
	in_use = s->in_use;
	if (in_use)
	{
		SpinLockAcquire(&s->mutex);
		out->dboid = s->v.dboid;
		strlcpy(out->name, s->v.name, sizeof(out->name));
		out->pid = s->v.pid;
		out->gone = s->gone;
		out->hold_until = s->hold_until;
		SpinLockRelease(&s->mutex);
	}
	LWLockRelease(inbox->lock);
	return in_use;
}

/*
 * OutboxInboxSlotForget
 *		Launcher: slot i's database is gone; so is the slot.
 */
void
OutboxInboxSlotForget(int i)
{
	OutboxInboxSlot *s = &inbox->slots[i];

	LWLockAcquire(inbox->lock, LW_EXCLUSIVE);
	SpinLockAcquire(&s->mutex);
	s->gone = true;
	SpinLockRelease(&s->mutex);
	if (s->in_use && s->v.pid == 0)
		s->in_use = false;
	LWLockRelease(inbox->lock);
}

/*
 * OutboxInboxSlotFree
 *		Launcher: free slot i if it is still gone and has no worker.
 */
void
OutboxInboxSlotFree(int i)
{
	OutboxInboxSlot *s = &inbox->slots[i];

	LWLockAcquire(inbox->lock, LW_EXCLUSIVE);
	if (s->in_use && s->gone && s->v.pid == 0)
		s->in_use = false;
	LWLockRelease(inbox->lock);
}

/*
 * OutboxInboxSetWait
 *		Launcher: record why slot i, which it read as dboid/name, has no
 *		worker (OUTBOX_INBOX_WAIT_NONE: it started one).  The time it began
 *		to wait is kept while the reason changes.  Nothing is written when
 *		the slot changed hands or a worker is attached.
 */
void
OutboxInboxSetWait(int i, Oid dboid, const char *name, OutboxInboxWait wait)
{
	OutboxInboxSlot *s = &inbox->slots[i];
	TimestampTz now = GetCurrentTimestamp();

	LWLockAcquire(inbox->lock, LW_SHARED);
	if (s->in_use && s->v.dboid == dboid && strcmp(s->v.name, name) == 0)
	{
		SpinLockAcquire(&s->mutex);
		if (s->v.pid == 0)
		{
			if (wait == OUTBOX_INBOX_WAIT_NONE)
				s->v.wait_since = 0;
			else if (s->v.wait == OUTBOX_INBOX_WAIT_NONE)
				s->v.wait_since = now;
			s->v.wait = wait;
		}
		SpinLockRelease(&s->mutex);
	}
	LWLockRelease(inbox->lock);
}

/* workers attached to a slot of dboid, under the lock */
static int
running_locked(Oid dboid)
{
	int			n = 0;
	int			i;

	for (i = 0; i < inbox->nslots; i++)
	{
		OutboxInboxSlot *s = &inbox->slots[i];

		if (s->in_use && s->v.dboid == dboid && s->v.pid != 0)
			n++;
	}
	return n;
}

/*
 * OutboxInboxStopNewest
 *		Launcher: stop the most recently started worker of dboid, or, for
 *		InvalidOid, of the database running the most workers (the lowest
 *		OID of those tied).  Returns its slot, and its pid in *pid; -1 when
 *		no worker runs there.  The worker exits and detaches; the launcher
 *		decides whether to start it again.  pid and started_at change only
 *		under the exclusive lock (attach, detach), held here throughout.
 */
int
OutboxInboxStopNewest(Oid dboid, int *pid)
{
	Oid			target = dboid;
	int			most = 0;
	int			victim = -1;
	int			i;

	*pid = 0;
	LWLockAcquire(inbox->lock, LW_EXCLUSIVE);
	for (i = 0; i < inbox->nslots && !OidIsValid(dboid); i++)
	{
		OutboxInboxSlot *s = &inbox->slots[i];
		int			n;

		if (!s->in_use || s->v.pid == 0)
			continue;
		n = running_locked(s->v.dboid);
		if (n > most || (n == most && s->v.dboid < target))
		{
			most = n;
			target = s->v.dboid;
		}
	}
	for (i = 0; i < inbox->nslots; i++)
	{
		OutboxInboxSlot *s = &inbox->slots[i];

		if (s->in_use && s->v.dboid == target && s->v.pid != 0 &&
			(victim < 0 || s->v.started_at >= inbox->slots[victim].v.started_at))
			victim = i;
	}
	if (victim >= 0)
	{
		*pid = inbox->slots[victim].v.pid;
		kill(*pid, SIGTERM);
	}
	LWLockRelease(inbox->lock);
	return victim;
}

/*
 * ---- Readers ----
 */

/*
 * OutboxInboxList
 *		Copies of dboid's slots, palloc'd in *views; returns how many.
 */
int
OutboxInboxList(Oid dboid, OutboxInboxView **views)
{
	int			n = 0;
	int			i;

	*views = NULL;
	if (inbox == NULL)
		return 0;
	*views = palloc(sizeof(OutboxInboxView) * Max(1, inbox->nslots));
	LWLockAcquire(inbox->lock, LW_SHARED);
	for (i = 0; i < inbox->nslots; i++)
	{
		OutboxInboxSlot *s = &inbox->slots[i];

		if (!s->in_use || s->v.dboid != dboid || s->gone)
			continue;
		SpinLockAcquire(&s->mutex);
		memcpy(&(*views)[n], &s->v, sizeof(OutboxInboxView));
		SpinLockRelease(&s->mutex);
		n++;
	}
	LWLockRelease(inbox->lock);
	return n;
}

/*
 * ---- The worker, on its own slot ----
 */

/*
 * OutboxInboxAttach
 *		Claim slot i for the worker of dboid/name.  NULL when the slot is
 *		free, belongs to another subscription, is gone, or has a worker.
 */
OutboxInboxSlot *
OutboxInboxAttach(int i, Oid dboid, const char *name)
{
	OutboxInboxSlot *s;
	OutboxInboxSlot *result = NULL;

	if (inbox == NULL || i < 0 || i >= inbox->nslots)
		return NULL;
	s = &inbox->slots[i];
	LWLockAcquire(inbox->lock, LW_EXCLUSIVE);
	if (s->in_use && s->v.dboid == dboid && strcmp(s->v.name, name) == 0 &&
		!s->gone && s->v.pid == 0)
	{
		SpinLockAcquire(&s->mutex);
		s->v.pid = MyProcPid;
		s->latch = MyLatch;
		s->changed = false;
		s->wake = true;			/* look at replays once at start */
		s->v.state = OUTBOX_INBOX_STARTING;
		s->v.started_at = GetCurrentTimestamp();
		s->v.nparts = 0;
		/* figures are the worker's: since it started */
		s->v.processed = s->v.deduplicated = s->v.failed = 0;
		s->v.dead_lettered = s->v.parked = 0;
		s->v.last_applied_at = 0;
		s->v.wait = OUTBOX_INBOX_WAIT_NONE;
		s->v.wait_since = 0;
		SpinLockRelease(&s->mutex);
		result = s;
	}
	LWLockRelease(inbox->lock);
	return result;
}

void
OutboxInboxDetach(OutboxInboxSlot *s)
{
	LWLockAcquire(inbox->lock, LW_EXCLUSIVE);
	SpinLockAcquire(&s->mutex);
	s->v.pid = 0;
	s->latch = NULL;
	s->v.state = OUTBOX_INBOX_STOPPED;
	s->v.nparts = 0;
	SpinLockRelease(&s->mutex);
	LWLockRelease(inbox->lock);
	OutboxWakeLauncher();
}

/* the subscription row is gone: the launcher frees the slot */
void
OutboxInboxMarkGone(OutboxInboxSlot *s)
{
	OutboxShmemSetFlag(&s->mutex, &s->gone);
}

bool
OutboxInboxTakeChanged(OutboxInboxSlot *s)
{
	return OutboxShmemTakeFlag(&s->mutex, &s->changed);
}

bool
OutboxInboxTakeWake(OutboxInboxSlot *s)
{
	return OutboxShmemTakeFlag(&s->mutex, &s->wake);
}

bool
OutboxInboxIsHeld(OutboxInboxSlot *s)
{
	return OutboxShmemBefore(&s->mutex, &s->hold_until);
}

void
OutboxInboxSetState(OutboxInboxSlot *s, OutboxInboxState state)
{
	OutboxShmemSet(&s->mutex, &s->v.state, &state, sizeof(state));
}

void
OutboxInboxSetError(OutboxInboxSlot *s, const char *message)
{
	OutboxShmemSetText(&s->mutex, s->v.last_error, sizeof(s->v.last_error),
					   message, &s->v.last_error_at);
}

/*
 * OutboxInboxReport
 *		Add a committed batch's tally to the slot, and replace its
 *		partitions (nparts < 0 keeps them).
 */
void
OutboxInboxReport(OutboxInboxSlot *s, const OutboxInboxTally *t,
				  const OutboxInboxPart *parts, int nparts)
{
	TimestampTz now = GetCurrentTimestamp();

	nparts = Min(nparts, OUTBOX_INBOX_PARTS_MAX);
	SpinLockAcquire(&s->mutex);
	s->v.processed += t->processed;
	s->v.deduplicated += t->deduplicated;
	s->v.failed += t->failed;
	s->v.dead_lettered += t->dead_lettered;
	s->v.parked += t->parked;
	if (t->processed > 0)
		s->v.last_applied_at = now;
	if (nparts >= 0)
	{
		memcpy(s->v.parts, parts, sizeof(OutboxInboxPart) * nparts);
		s->v.nparts = nparts;
	}
	SpinLockRelease(&s->mutex);
}
