/*-------------------------------------------------------------------------
 *
 * shmem/shmem_area.h
 *		What the files that own an area of shared memory (relay_slots.c,
 *		handoff.c, subscription_slots.c) do alike: ask for an area with an LWLock
 *		tranche of its own, create it, and take a slot's flag.  Only they
 *		include it.
 *
 * Invariants: these helpers take no lock but the spinlock they are given,
 * and release it before they return, so each file's locking protocol
 * (written in its header) is kept as it is written there.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_SHMEM_AREA_H
#define OUTBOX_SHMEM_AREA_H

#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "storage/spin.h"

/*
 * OutboxShmemAreaRequest
 *		From the shared-memory request hook: size bytes for the area name,
 *		and one LWLock in a tranche of the same name.
 */
static inline void
OutboxShmemAreaRequest(const char *name, Size size)
{
	RequestAddinShmemSpace(size);
	RequestNamedLWLockTranche(name, 1);
}

/*
 * OutboxShmemAreaInit
 *		From the shared-memory startup hook, AddinShmemInitLock held: the
 *		area name, made zeroed if it did not exist.  *made_lock is its
 *		tranche's LWLock when it was just made (the caller then fills it
 *		in), NULL when it existed already.
 */
static inline void *
OutboxShmemAreaInit(const char *name, Size size, LWLock **made_lock)
{
	bool		found;
	void	   *area = ShmemInitStruct(name, size, &found);

	*made_lock = NULL;
	if (!found)
	{
		memset(area, 0, size);
		*made_lock = &(GetNamedLWLockTranche(name))->lock;
	}
	return area;
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

#endif							/* OUTBOX_SHMEM_AREA_H */
