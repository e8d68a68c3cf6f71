/*-------------------------------------------------------------------------
 *
 * shmem/shmem_area.h
 *		What the files that own an area of shared memory (relay_slots.c,
 *		handoff.c, subscription_slots.c) do alike: an area described as
 *		data, asked for with an LWLock tranche of its own and made; a slot's
 *		field set, a flag taken, a text stamped, a hold set, each under the
 *		slot's spinlock.  Only they include it.
 *
 * Invariants: these helpers take no lock but the spinlock they are given,
 * and release it before they return, so each file's locking protocol
 * (written in its header) is kept as it is written there.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_SHMEM_AREA_H
#define OUTBOX_SHMEM_AREA_H

#include <signal.h>

#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "storage/spin.h"
#include "utils/timestamp.h"

/*
 * An area of shared memory one file owns, described as data: its name
 * (also its LWLock tranche's); its size, a fixed head then count elements;
 * where in the head its lock and its element count go; where in an element
 * its spinlock is, if elements have one; and the owner's pointer to it.
 */
typedef struct OutboxShmemArea
{
	const char *name;
	Size		head;			/* offsetof the flexible array */
	Size		element;		/* sizeof one element of it */
	const int  *count;			/* the setting that counts them */
	Size		lock_at;		/* offsetof the head's LWLock pointer */
	Size		count_at;		/* offsetof the head's int count */
	int			mutex_at;		/* offsetof an element's slock_t, or -1 */
	void	  **at;				/* the owner's pointer, set at attach */
} OutboxShmemArea;

/* the areas of handoff.c and subscription_slots.c; relay_slots.c makes them */
extern const OutboxShmemArea OutboxHandoffArea;
extern const OutboxShmemArea OutboxInboxArea;

static inline Size
OutboxShmemAreaSize(const OutboxShmemArea *a)
{
	return add_size(a->head, mul_size(*a->count, a->element));
}

/*
 * OutboxShmemAreaRequest
 *		From the shared-memory request hook: the area's bytes, and one
 *		LWLock in a tranche of its name.
 */
static inline void
OutboxShmemAreaRequest(const OutboxShmemArea *a)
{
	RequestAddinShmemSpace(OutboxShmemAreaSize(a));
	RequestNamedLWLockTranche(a->name, 1);
}

/*
 * OutboxShmemAreaAttach
 *		From the shared-memory startup hook, AddinShmemInitLock held: find
 *		the area and point its owner at it; when it did not exist, make it
 *		zeroed with its lock, its count and its elements' spinlocks set.
 */
static inline void
OutboxShmemAreaAttach(const OutboxShmemArea *a)
{
	bool		found;
	Size		size = OutboxShmemAreaSize(a);
	char	   *area = ShmemInitStruct(a->name, size, &found);

	*a->at = area;
	if (found)
		return;
	memset(area, 0, size);
	*(LWLock **) (area + a->lock_at) = &(GetNamedLWLockTranche(a->name))->lock;
	*(int *) (area + a->count_at) = *a->count;
	if (a->mutex_at >= 0)
		for (int i = 0; i < *a->count; i++)
			SpinLockInit((slock_t *) (area + a->head + i * a->element + a->mutex_at));
}

/*
 * OutboxShmemTakeFlag
 *		Read a slot's flag and clear it, under the slot's spinlock mutex:
 *		whether it was set since the last call.
 */
static inline bool
OutboxShmemTakeFlag(slock_t *mutex, bool *flag)
{
	bool		value;

	SpinLockAcquire(mutex);
	value = *flag;
	*flag = false;
	SpinLockRelease(mutex);
	return value;
}

/*
 * OutboxShmemSet
 *		Copy len bytes of value into a slot's field, under the slot's
 *		spinlock mutex.
 */
static inline void
OutboxShmemSet(slock_t *mutex, void *field, const void *value, Size len)
{
	SpinLockAcquire(mutex);
	memcpy(field, value, len);
	SpinLockRelease(mutex);
}

/*
 * OutboxShmemSetFlag
 *		Set a slot's flag, under the slot's spinlock mutex.
 */
static inline void
OutboxShmemSetFlag(slock_t *mutex, bool *flag)
{
	SpinLockAcquire(mutex);
	*flag = true;
	SpinLockRelease(mutex);
}

/*
 * OutboxShmemBefore
 *		Whether the slot's time *until is still to come, read under the
 *		slot's spinlock mutex.
 */
static inline bool
OutboxShmemBefore(slock_t *mutex, const TimestampTz *until)
{
	TimestampTz now = GetCurrentTimestamp();
	TimestampTz value;

	SpinLockAcquire(mutex);
	value = *until;
	SpinLockRelease(mutex);
	return value > now;
}

/*
 * OutboxShmemHoldAndStop
 *		Hold a slot's worker off until until, and stop the worker attached
 *		to it (its pid read under the slot's spinlock mutex).  The caller
 *		holds the area's lock exclusively, which a worker needs to detach:
 *		the pid is still the worker's when signalled.
 */
static inline void
OutboxShmemHoldAndStop(slock_t *mutex, TimestampTz *hold_until,
					   const int *pid_field, TimestampTz until)
{
	int			pid;

	SpinLockAcquire(mutex);
	*hold_until = until;
	pid = *pid_field;
	SpinLockRelease(mutex);
	if (pid != 0)
		kill(pid, SIGTERM);
}

/*
 * OutboxShmemSetText
 *		Copy text into a slot's buffer of len bytes, and stamp *at with the
 *		time (when at is not NULL), under the slot's spinlock mutex.
 */
static inline void
OutboxShmemSetText(slock_t *mutex, char *buf, Size len, const char *text,
				   TimestampTz *at)
{
	TimestampTz now = at != NULL ? GetCurrentTimestamp() : 0;

	SpinLockAcquire(mutex);
	strlcpy(buf, text, len);
	if (at != NULL)
		*at = now;
	SpinLockRelease(mutex);
}

#endif							/* OUTBOX_SHMEM_AREA_H */
