/*-------------------------------------------------------------------------
 *
 * relay/relay.h
 *		The relay worker, and the SQL-visible state of the relays
 *		(status(), metrics(), health()).
 *
 * What the relay room offers to the rooms above it; a file includes only
 * the headers of rooms below its own (docs/design.md).
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_RELAY_H
#define OUTBOX_RELAY_H

#include "postgres.h"

#include "base/base.h"

/* relay_standby.c */
extern OutboxStandbySlotList *OutboxStandbySlotsParse(const char *value, char **bad);

/* relay.c */
PGDLLEXPORT void OutboxRelayMain(Datum main_arg);

/* status.c: the backlog counted in the log (a starting relay, status()) */
extern void OutboxRelayCountBacklog(int64 *backlog, TimestampTz *oldest);

#endif							/* OUTBOX_RELAY_H */
