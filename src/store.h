/*-------------------------------------------------------------------------
 *
 * store.h
 *		What the relay's SQL files (store.c, store_dead.c, store_upkeep.c)
 *		share among themselves; the rest of the extension sees only the
 *		OutboxStore functions declared in outbox.h.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_STORE_H
#define OUTBOX_STORE_H

#include "executor/spi.h"

extern SPIPlanPtr OutboxStorePrepare(const char *sql, int nargs, Oid *types,
									 const char *what);
extern void OutboxStoreRun(const char *sql, bool read_only, long count,
						   int expected, const char *what);
extern HeapTuple OutboxStoreRow(const char *sql, const char *what);

#endif							/* OUTBOX_STORE_H */
