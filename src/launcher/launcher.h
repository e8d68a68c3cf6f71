/*-------------------------------------------------------------------------
 *
 * launcher/launcher.h
 *		The launcher, its probes, and the utility hook that keeps relays out
 *		of the way of commands needing their database.
 *
 * What the launcher room offers to the rooms above it; a file includes only
 * the headers of rooms below its own (docs/design.md).
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_LAUNCHER_H
#define OUTBOX_LAUNCHER_H

#include "postgres.h"

#include "base/base.h"

/* launcher.c: the launcher, over launcher_relays.c and launcher_consumers.c */
#define OUTBOX_RESTART_DELAY_MS		1000	/* before a stopped worker starts again */
#define OUTBOX_NO_WORKER_RETRY_MS	5000	/* after no background worker slot was free */
#define OUTBOX_RESCAN_INTERVAL_MS	10000	/* pg_database is read again after */

extern void OutboxLauncherRegisterStatic(void);
PGDLLEXPORT void OutboxLauncherMain(Datum main_arg);

/* launcher_consumers.c: the launcher's subscription workers */
extern bool OutboxConsumersReap(TimestampTz now, TimestampTz *retry_at);
extern long OutboxConsumersSupervise(long sleep, bool relays_wait, bool relay_refused);

/* launcher_relays.c: the launcher's relays and probes, by database */
extern bool OutboxLauncherKnowsDatabase(Oid dboid);
extern void OutboxLauncherDatabaseName(Oid dboid, char *buf, size_t len);
extern void OutboxRelaysRescan(void);
extern void OutboxRelaysRequested(Oid dboid);
extern long OutboxRelaysSupervise(bool *relays_wait, bool *refused);
extern void OutboxRelaysRetry(TimestampTz when);

/* utility.c: runs in user backends */
extern void OutboxUtilityHookInstall(void);

/* probe.c */
PGDLLEXPORT void OutboxProbeMain(Datum main_arg);

#endif							/* OUTBOX_LAUNCHER_H */
