/*-------------------------------------------------------------------------
 *
 * kafka/message_origin.c
 *		The database an event comes from, as its messages say it: the origin
 *		header and the CloudEvents source made from it.
 *
 * Invariants:
 *	- The relay sets it (OutboxSetOrigin) before it sends anything; until
 *	  then it is a UUID of zeros, whose length emit()'s size check counts.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xlog.h"
#include "miscadmin.h"

#include "base/base.h"
#include "kafka/kafka.h"

/*
 * The origin header's value: the database's outbox.origin (a UUID), which
 * the relay loads (OutboxSetOrigin) before it sends anything.  Elsewhere
 * (emit()'s size check) only its length counts, which is a UUID's.
 */
static char origin[OUTBOX_ORIGIN_MAX + 1] = "00000000-0000-0000-0000-000000000000";

/*
 * OutboxOrigin
 *		The database an event comes from.  Subscribers scope their dedupe
 *		by it, so that a writer of one database cannot suppress another's
 *		events by choosing their ids.
 */
const char *
OutboxOrigin(void)
{
	return origin;
}

/*
 * OutboxSetOrigin
 *		The relay's origin from now on: outbox.origin, or, on SQL objects
 *		older than 1.8, "<system identifier>/<database OID>" (value NULL),
 *		never longer than a UUID, so emit()'s size check stays an upper
 *		bound.
 */
void
OutboxSetOrigin(const char *value)
{
	if (value != NULL)
		strlcpy(origin, value, sizeof(origin));
	else
		snprintf(origin, sizeof(origin), UINT64_FORMAT "/%u",
				 GetSystemIdentifier(), MyDatabaseId);
}
