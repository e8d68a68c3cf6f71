/*-------------------------------------------------------------------------
 *
 * emit/emit_backlog.c
 *		Backpressure: emit() refuses new events while the database's
 *		backlog is at outbox.max_backlog or its oldest unpublished event is
 *		outbox.max_backlog_age old, so that an application learns of a Kafka
 *		outage from its own writes, not from a full disk.
 *
 * Invariants:
 *	- The decision reads shared memory only, the figures the relay keeps
 *	  in its slot (OutboxSlotRefuses): no query per emit.  With both
 *	  limits 0 (the default) it reads nothing.
 *	- The backlog is the relay's: committed events Kafka has not
 *	  acknowledged.  Held events (they left the batch) and quarantined
 *	  ones are not in it; events of transactions still open are not.
 *	  Without a relay slot nothing is known and nothing is refused.
 *	- Refusing starts at the first refusal (logged here, once) and ends
 *	  under 90% of both limits (logged by the relay, relay_slots.c, or
 *	  here when the relay reports nothing).  Every refusal is counted.
 *	- The limits are sighup settings: emit(), the relay and metrics()
 *	  judge by the same values.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "miscadmin.h"
#include "utils/timestamp.h"

#include "base/base.h"
#include "shmem/shmem.h"
#include "kafka/kafka.h"
#include "emit/emit.h"

/*
 * OutboxEmitCheckBacklog
 *		Refuse the event (53400) while this database's backlog is past a
 *		limit.
 */
void
OutboxEmitCheckBacklog(void)
{
	int64		backlog;
	TimestampTz oldest;
	TimestampTz now;
	double		age;
	bool		first;
	bool		ended;

	if (outbox_max_backlog <= 0 && outbox_max_backlog_age <= 0)
		return;
	now = GetCurrentTimestamp();
	if (!OutboxSlotRefuses(MyDatabaseId, now, &backlog, &oldest, &first, &ended))
	{
		if (ended)
			ereport(LOG,
					(errmsg("outbox: emit() accepts events again: the backlog is " INT64_FORMAT
							" events, under 90%% of outbox.max_backlog and outbox.max_backlog_age",
							backlog)));
		return;
	}
	age = oldest > 0 ? (double) (now - oldest) / USECS_PER_SEC : 0;
	if (first)
		ereport(LOG,
				(errmsg("outbox: emit() refuses events: the backlog is " INT64_FORMAT
						" events, the oldest %.0f s old (outbox.max_backlog %d, "
						"outbox.max_backlog_age %d s)",
						backlog, age, outbox_max_backlog, outbox_max_backlog_age)));
	if (outbox_max_backlog > 0 && backlog >= outbox_max_backlog)
		ereport(ERROR,
				(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
				 errmsg("outbox backlog is " INT64_FORMAT " events, at outbox.max_backlog (%d)",
						backlog, outbox_max_backlog),
				 errdetail("The relay has not published that many committed events."),
				 errhint("Retry later. outbox.status() says why events wait (Kafka unreachable, "
						 "publishing paused); outbox.max_backlog sets the limit.")));
	ereport(ERROR,
			(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
			 errmsg("oldest unpublished outbox event is %.0f s old, at outbox.max_backlog_age (%d s)",
					age, outbox_max_backlog_age),
			 errdetail("The backlog is " INT64_FORMAT " events.", backlog),
			 errhint("Retry later. outbox.status() says why events wait (Kafka unreachable, "
					 "publishing paused); outbox.max_backlog_age sets the limit.")));
}
