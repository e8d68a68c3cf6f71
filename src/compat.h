/*-------------------------------------------------------------------------
 *
 * compat.h
 *		Shims over differences between PostgreSQL major versions.  The only
 *		file that tests PG_VERSION_NUM.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_COMPAT_H
#define OUTBOX_COMPAT_H

#include "access/transam.h"
#include "port/atomics.h"

/*
 * OutboxXactCompletionCount
 *		How many transactions with an xid have ended (committed, aborted,
 *		or committed/rolled back prepared) in the cluster since start: the
 *		counter PostgreSQL bumps under ProcArrayLock at each such end, to
 *		reuse snapshots.  Unchanged since before a snapshot was taken means
 *		a new snapshot would see the same transactions as done.  PostgreSQL
 *		17 renamed ShmemVariableCache to TransamVariables.
 */
static inline uint64
OutboxXactCompletionCount(void)
{
	pg_read_barrier();
#if PG_VERSION_NUM >= 170000
	return ((volatile TransamVariablesData *) TransamVariables)->xactCompletionCount;
#else
	return ((volatile VariableCacheData *) ShmemVariableCache)->xactCompletionCount;
#endif
}

#endif							/* OUTBOX_COMPAT_H */
