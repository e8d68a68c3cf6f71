/*-------------------------------------------------------------------------
 *
 * relay/relay_standby.c
 *		Publishing only what the standbys have: with
 *		outbox.synchronized_standby_slots set, a page goes to Kafka only
 *		once every named physical replication slot's standby has flushed
 *		the WAL of every commit the page can see.  A failover to such a
 *		standby then finds every published event in the promoted database.
 *
 * Invariants:
 *	- A page's standby position (RelayPage.standby_lsn) is the end of the
 *	  inserted WAL (OutboxRelayWalEnd) read after its snapshot: for a batch
 *	  page the batch's, read right after the batch snapshot in the same
 *	  transaction (relay_page.c); for replay and held-event pages, right
 *	  after their read.  A transaction leaves the proc array, and so
 *	  becomes visible to a new snapshot, only after its commit record is
 *	  inserted, so every commit the snapshot sees ends at or before that
 *	  position.
 *	- A page also waits for the position read after the page before the
 *	  previous one was recorded (Relay.recorded_lsn[0]): a promoted standby
 *	  has the progress of every page but the last two sent, and so sends
 *	  again at most two pages.  Not the previous page's: the page read
 *	  ahead would then wait a standby round trip after every record; the
 *	  one before it was recorded a page earlier, and is there already.
 *	- A physical slot's restart_lsn is where its standby reported having
 *	  flushed WAL (the walsender moves it at each reply).  A page goes once
 *	  every named slot's restart_lsn is at or past the page's position.  A
 *	  slot that does not exist, is logical, or is inactive and behind holds
 *	  the page back: nothing is published that a promotion could lose.
 *	- Slots are read from shared memory as pg_get_replication_slots reads
 *	  them (ReplicationSlotControlLock shared, each slot's spinlock): no
 *	  SQL, no transaction per page.
 *	- The wait is the relay's one wait (relay.c), with a short timeout
 *	  while the standbys keep up and a longer one while a slot cannot
 *	  catch up as it is (OutboxRelayStandbyPollMs); the relay's latch
 *	  (commits, SIGHUP) cuts it short.  A relay with no page waiting does
 *	  not look at the slots at all.
 *	- A wait past RELAY_STANDBY_REPORT_MS, or one a slot blocks, is shown:
 *	  state "waiting for standby", the reason in status()'s last_error and
 *	  in health(), and one LOG line each time the reason changes.
 *	- An empty setting changes nothing: the relay publishes as it did.
 *
 * No SQL here, no librdkafka call.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xlog.h"
#include "access/xlog_internal.h"
#include "pgstat.h"
#include "replication/slot.h"
#include "storage/lwlock.h"
#include "storage/spin.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"
#include "utils/varlena.h"

#include "base/compat.h"
#include "relay/relay_state.h"
#include "base/base.h"
#include "shmem/shmem.h"
#include "relay/relay.h"

/* waits while the standbys keep up, after a while, and while blocked */
#define RELAY_STANDBY_POLL_MS		1
#define RELAY_STANDBY_SLOW_POLL_MS	20
#define RELAY_STANDBY_BLOCKED_POLL_MS 100
/* a page waiting this long for a standby that streams is shown */
#define RELAY_STANDBY_REPORT_MS		1000

/* what the named slots say about a page's position */
typedef enum StandbyVerdict
{
	STANDBY_READY,				/* every slot is at or past it */
	STANDBY_BEHIND,				/* a streaming standby has not flushed it yet */
	STANDBY_BLOCKED				/* a slot cannot get there as it is */
} StandbyVerdict;

/* one named slot, copied from shared memory */
typedef struct StandbySlotCopy
{
	bool		found;
	bool		physical;
	bool		active;			/* a walsender streams from it */
	XLogRecPtr	restart_lsn;
} StandbySlotCopy;

/* the verdict on a page, and the slot it names when not ready */
typedef struct StandbyLook
{
	StandbyVerdict verdict;
	char		key[64 + NAMEDATALEN];	/* kind and slot: what is logged once */
	char		why[OUTBOX_LAST_ERROR_LEN];
	const char *hint;
} StandbyLook;

/*
 * OutboxRelayWalEnd
 *		The end of the WAL inserted so far: GetXLogInsertRecPtr(), except
 *		where that is just past a page header, because the last record ended
 *		at the end of the page before.  There nothing has been inserted past
 *		the header yet: no standby can have flushed it, and XLogFlush()
 *		refuses it with an ERROR.
 */
XLogRecPtr
OutboxRelayWalEnd(void)
{
	XLogRecPtr	pos = GetXLogInsertRecPtr();

	if (XLogSegmentOffset(pos, wal_segment_size) == SizeOfXLogLongPHD)
		return pos - SizeOfXLogLongPHD;
	if (pos % XLOG_BLCKSZ == SizeOfXLogShortPHD)
		return pos - SizeOfXLogShortPHD;
	return pos;
}

/*
 * OutboxStandbySlotsParse
 *		outbox.synchronized_standby_slots' check hook: the names in value,
 *		in memory guc.c frees (compat.h), or NULL with *bad saying why (NULL
 *		too when out of memory).  Names are split and down-cased as
 *		identifiers, as PostgreSQL's own synchronized_standby_slots does,
 *		and must be legal slot names.  Never raises an error.
 */
OutboxStandbySlotList *
OutboxStandbySlotsParse(const char *value, char **bad)
{
	char	   *raw = pstrdup(value != NULL ? value : "");
	List	   *names = NIL;
	ListCell   *lc;
	OutboxStandbySlotList *list;

	*bad = NULL;
	if (!SplitIdentifierString(raw, ',', &names))
	{
		*bad = pstrdup("The value is not a comma-separated list of replication slot names.");
		return NULL;
	}
	foreach(lc, names)
	{
		const char *name = (const char *) lfirst(lc);

		if (strspn(name, "abcdefghijklmnopqrstuvwxyz0123456789_") != strlen(name))
		{
			*bad = psprintf("Replication slot name \"%s\" has a character other than "
							"lower-case letters, digits and underscores.", name);
			return NULL;
		}
	}
	list = OutboxGucMalloc(offsetof(OutboxStandbySlotList, names) +
						   sizeof(NameData) * Max(list_length(names), 1));
	if (list == NULL)
		return NULL;
	list->n = 0;
	foreach(lc, names)
		namestrcpy(&list->names[list->n++], (const char *) lfirst(lc));
	return list;
}

/*
 * copy_slots
 *		Copy what the relay needs of each named slot into out (list->n
 *		entries), as pg_get_replication_slots reads slots: in_use under
 *		ReplicationSlotControlLock, the rest under the slot's spinlock.
 */
static void
copy_slots(const OutboxStandbySlotList *list, StandbySlotCopy *out)
{
	int			i;
	int			k;

	memset(out, 0, sizeof(StandbySlotCopy) * list->n);
	/* no slots at all: shared memory holds no array (max_replication_slots 0) */
	if (max_replication_slots <= 0 || ReplicationSlotCtl == NULL)
		return;
	LWLockAcquire(ReplicationSlotControlLock, LW_SHARED);
	for (i = 0; i < max_replication_slots; i++)
	{
		ReplicationSlot *s = &ReplicationSlotCtl->replication_slots[i];

		if (!s->in_use)
			continue;
		SpinLockAcquire(&s->mutex);
		for (k = 0; k < list->n; k++)
			if (strcmp(NameStr(s->data.name), NameStr(list->names[k])) == 0)
			{
				out[k].found = true;
				out[k].physical = SlotIsPhysical(s);
				out[k].active = (s->active_pid != 0);
				out[k].restart_lsn = s->data.restart_lsn;
			}
		SpinLockRelease(&s->mutex);
	}
	LWLockRelease(ReplicationSlotControlLock);
}

/*
 * take_reason
 *		Whether a slot's reason of this verdict replaces the one in look (a
 *		blocking one outranks a lag; the first of each kind wins); if so the
 *		verdict, key and hint are set, and the caller writes look->why.
 */
static bool
take_reason(StandbyLook *look, StandbyVerdict verdict, const char *kind,
			const char *slot, const char *hint)
{
	if (look->verdict == STANDBY_BLOCKED ||
		(look->verdict == STANDBY_BEHIND && verdict == STANDBY_BEHIND))
		return false;
	look->verdict = verdict;
	snprintf(look->key, sizeof(look->key), "%s \"%s\"", kind, slot);
	look->hint = hint;
	return true;
}

/*
 * judge_slots
 *		Whether every slot of list is at or past target; the first slot
 *		that blocks, or else the first that lags, says why.
 */
static void
judge_slots(const OutboxStandbySlotList *list, XLogRecPtr target, StandbyLook *look)
{
	StandbySlotCopy *slots = palloc(sizeof(StandbySlotCopy) * list->n);
	int			k;

	look->verdict = STANDBY_READY;
	copy_slots(list, slots);
	for (k = 0; k < list->n; k++)
	{
		const char *name = NameStr(list->names[k]);
		const StandbySlotCopy *s = &slots[k];

		if (!s->found)
		{
			if (take_reason(look, STANDBY_BLOCKED, "missing", name,
							"Create the physical slot the standby streams from, or take its name out of outbox.synchronized_standby_slots; on a promoted standby, name the new standbys' slots or set it to ''."))
				snprintf(look->why, sizeof(look->why),
						 "replication slot \"%s\" does not exist", name);
		}
		else if (!s->physical)
		{
			if (take_reason(look, STANDBY_BLOCKED, "logical", name,
							"Name the physical slots that streaming standbys use."))
				snprintf(look->why, sizeof(look->why),
						 "replication slot \"%s\" is a logical slot, not a standby's physical slot", name);
		}
		else if (s->restart_lsn != InvalidXLogRecPtr && s->restart_lsn >= target)
			continue;
		else if (!s->active)
		{
			if (take_reason(look, STANDBY_BLOCKED, "inactive", name,
							"Start the standby that streams from this slot, or take its name out of outbox.synchronized_standby_slots."))
				snprintf(look->why, sizeof(look->why),
						 "no standby streams from replication slot \"%s\", whose standby flushed WAL up to %X/%X; the page needs %X/%X",
						 name, LSN_FORMAT_ARGS(s->restart_lsn), LSN_FORMAT_ARGS(target));
		}
		else if (take_reason(look, STANDBY_BEHIND, "behind", name, NULL))
			snprintf(look->why, sizeof(look->why),
					 "the standby of replication slot \"%s\" has flushed WAL up to %X/%X; the page needs %X/%X",
					 name, LSN_FORMAT_ARGS(s->restart_lsn), LSN_FORMAT_ARGS(target));
	}
	pfree(slots);
}

/*
 * show_wait
 *		The page in hand waits: once it is worth showing (a slot blocks, or
 *		a lag lasted RELAY_STANDBY_REPORT_MS), the state, status() and
 *		health() say why, and the log does when the reason changes.
 */
static void
show_wait(Relay *r, const StandbyLook *look)
{
	if (look->verdict == STANDBY_BEHIND &&
		!TimestampDifferenceExceeds(r->standby_wait_since, GetCurrentTimestamp(),
									RELAY_STANDBY_REPORT_MS))
		return;
	OutboxSlotSetStandbyWait(r->slot, look->why);
	if (!r->standby_reported)
	{
		r->standby_reported = true;
		OutboxRelaySetState(r, OUTBOX_RELAY_WAITING_STANDBY);
		pgstat_report_activity(STATE_RUNNING, "waiting for standby");
	}
	if (strcmp(r->standby_said, look->key) == 0)
		return;
	strlcpy(r->standby_said, look->key, sizeof(r->standby_said));
	OutboxRelayNoteError(r, "waiting for a standby", look->why);
	ereport(LOG,
			(errmsg("outbox relay for database \"%s\" waits for a standby before publishing",
					r->dbname),
			 errdetail("A slot named in outbox.synchronized_standby_slots does not have the page yet: %s.",
					   look->why),
			 look->hint != NULL ? errhint("%s", look->hint) : 0));
}

/* the page in hand waits no more */
static void
end_wait(Relay *r)
{
	if (r->standby_reported)
	{
		OutboxSlotSetStandbyWait(r->slot, NULL);
		OutboxRelaySetState(r, r->backoff_ms != 0 ? OUTBOX_RELAY_BACKING_OFF :
							OUTBOX_RELAY_PUBLISHING);
		pgstat_report_activity(STATE_IDLE, NULL);
	}
	r->standby_wait_since = 0;
	r->standby_reported = false;
	r->standby_blocked = false;
	r->standby_said[0] = '\0';
}

/*
 * OutboxRelayStandbysHave
 *		Before pg's first round: whether every slot named in
 *		outbox.synchronized_standby_slots has pg's position (and that of the
 *		page recorded before the last).  Always true when none is named or pg is empty.
 *		At the first look the WAL is flushed up to that position: walsenders
 *		send only flushed WAL, and what the relay's own reads logged (page
 *		pruning) would otherwise wait for the WAL writer.
 */
bool
OutboxRelayStandbysHave(Relay *r, RelayPage *pg)
{
	const OutboxStandbySlotList *list = outbox_standby_slot_list;
	XLogRecPtr	target = Max(pg->standby_lsn, r->recorded_lsn[0]);
	StandbyLook look;

	if (list == NULL || list->n == 0 || pg->n == 0)
	{
		end_wait(r);
		return true;
	}
	if (r->standby_wait_since == 0)
	{
		XLogFlush(target);
		r->standby_wait_since = GetCurrentTimestamp();
	}
	judge_slots(list, target, &look);
	if (look.verdict == STANDBY_READY)
	{
		end_wait(r);
		return true;
	}
	r->standby_blocked = (look.verdict == STANDBY_BLOCKED);
	show_wait(r, &look);
	return false;
}

/*
 * OutboxRelayStandbyPollMs
 *		How long the STANDBY step waits before looking again (relay.c): a
 *		moment while the standbys keep up, longer once the wait is shown,
 *		longer still while a slot cannot catch up as it is.
 */
long
OutboxRelayStandbyPollMs(const Relay *r)
{
	if (r->standby_blocked)
		return RELAY_STANDBY_BLOCKED_POLL_MS;
	if (TimestampDifferenceExceeds(r->standby_wait_since, GetCurrentTimestamp(),
								   RELAY_STANDBY_REPORT_MS))
		return RELAY_STANDBY_SLOW_POLL_MS;
	return RELAY_STANDBY_POLL_MS;
}
