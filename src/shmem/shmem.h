/*-------------------------------------------------------------------------
 *
 * shmem/shmem.h
 *		Shared memory: the relay slots, the subscription slots and the
 *		small tables through which processes without a shared slot talk.
 *
 * What the shmem room offers to the rooms above it; a file includes only
 * the headers of rooms below its own (docs/design.md).
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_SHMEM_H
#define OUTBOX_SHMEM_H

#include "postgres.h"

#include "base/base.h"

/* relay_slots.c: the relay slots; their layout and locks are private to it */
typedef enum OutboxRelayState
{
	OUTBOX_RELAY_STARTING = 0,
	OUTBOX_RELAY_IDLE,
	OUTBOX_RELAY_PUBLISHING,
	OUTBOX_RELAY_PAUSED,
	OUTBOX_RELAY_BACKING_OFF,
	OUTBOX_RELAY_NOT_CONFIGURED,
	OUTBOX_RELAY_WAITING_STANDBY,	/* outbox.synchronized_standby_slots */
	OUTBOX_RELAY_FENCED,		/* exactly_once: a newer producer has its
								 * transactional.id */
	OUTBOX_RELAY_STOPPED
} OutboxRelayState;
#define OUTBOX_RELAY_NSTATES (OUTBOX_RELAY_STOPPED + 1)

/* publish latency histogram: upper bounds in microseconds, then +Inf */
#define OUTBOX_LAT_NBUCKETS 19
extern const int64 OutboxLatencyBounds[OUTBOX_LAT_NBUCKETS - 1];

#define OUTBOX_LAST_ERROR_LEN		256

/* one relay's slot: only the relay attached to it holds a pointer */
typedef struct OutboxSlot OutboxSlot;

/*
 * A reader's copy of one database's slot (OutboxSlotRead).  Without a
 * slot: pid 0, state stopped, brokers_up -1, every figure 0.
 */
typedef struct OutboxSlotView
{
	int			pid;			/* the relay attached, 0 when none */
	OutboxRelayState state;
	bool		no_extension;	/* the last relay found no extension */
	TimestampTz started_at;
	int			brokers_up;		/* -1: unknown */
	int64		backlog;		/* committed, not yet acknowledged */
	TimestampTz oldest_pending; /* created_at of the oldest undelivered, or 0 */
	int			page_size;		/* events in the page in hand */
	uint64		published;
	uint64		published_bytes;
	uint64		retries;		/* events sent again after a failure */
	uint64		failures[5];	/* by OutboxErrorClass */
	TimestampTz last_delivery;
	TimestampTz last_error_at;
	char		last_error[OUTBOX_LAST_ERROR_LEN];
	char		standby_wait[OUTBOX_LAST_ERROR_LEN];	/* why the page waits for
														 * a standby, "" when not */
	uint64		latency[OUTBOX_LAT_NBUCKETS];	/* since the relay started */
	double		latency_sum;	/* seconds */
	uint64		minute_events;	/* the last minute's deliveries */
	uint64		minute_bytes;
	uint64		minute_latency[OUTBOX_LAT_NBUCKETS];
	uint64		emit_refused;	/* emits refused for the backlog's limits */
	bool		refusing;		/* emit() refused since the relay last found
								 * the backlog under the limits: the log
								 * says when refusing starts and ends */
	bool		slots_full;		/* every slot belongs to a database */
	TimestampTz no_worker_since;	/* the launcher lacks a worker, or 0 */
} OutboxSlotView;

/* what a relay adds to its slot after a settled round */
typedef struct OutboxDeliveryTally
{
	uint64		events;
	uint64		bytes;
	double		latency_sum;
	uint64		latency[OUTBOX_LAT_NBUCKETS];
} OutboxDeliveryTally;

/*
 * What a relay reports after a round: OutboxSlotReportRound adds it to its
 * slot in one critical section.  Zero fields change nothing, except where
 * said otherwise.
 */
#define OUTBOX_BROKERS_UNCHANGED (-2)
typedef struct OutboxRoundReport
{
	int			pages;			/* pages read */
	OutboxDeliveryTally delivered;	/* acknowledged, with their latency */
	bool		batch_events;	/* delivered were the open batch's: they
								 * leave the backlog now, not when the page
								 * settles */
	int			retries;		/* events sent again */
	uint64		failures[5];	/* by OutboxErrorClass */
	int			brokers_up;		/* -1 unknown; OUTBOX_BROKERS_UNCHANGED */
	bool		set_backlog;	/* the four below replace the slot's */
	bool		batch_opened;	/* backlog is now remaining + later commits */
	int64		batch_remaining;
	TimestampTz oldest_pending; /* 0 none, -1 keep the last one */
	int			page_size;
} OutboxRoundReport;

extern void OutboxShmemInstallHooks(void (*request) (void), void (*init) (void));
extern bool OutboxShmemAvailable(void);
extern const char *OutboxRelayStateName(OutboxRelayState state);

/* user backends: commits and the utility hook */
extern void OutboxWakeRelay(Oid dboid, bool replay, int events);
extern void OutboxRequestExtensionCheck(Oid dboid);
extern void OutboxHoldDatabase(Oid dboid, int hold_ms);
extern bool OutboxSlotRefuses(Oid dboid, TimestampTz now, int64 *backlog,
							  TimestampTz *oldest, bool *first, bool *ended);

/* the launcher */
extern void OutboxSetNoWorker(bool short_of_workers);
extern bool OutboxSlotAcquire(Oid dboid, bool *held);
extern void OutboxSlotRelease(Oid dboid);

/* readers: the launcher, status(), metrics(), health() */
extern bool OutboxSlotRead(Oid dboid, OutboxSlotView *out);

/* the relay, on the slot it attached to */
extern OutboxSlot *OutboxSlotAttach(Oid dboid, int *other_pid);
extern void OutboxSlotDetach(OutboxSlot *slot);
extern void OutboxSlotSetState(OutboxSlot *slot, OutboxRelayState state);
extern bool OutboxSlotIsHeld(OutboxSlot *slot);
extern void OutboxSlotMarkNoExtension(OutboxSlot *slot);
extern void OutboxSlotCountError(OutboxSlot *slot, const char *message);
extern void OutboxSlotSetStandbyWait(OutboxSlot *slot, const char *why);
extern bool OutboxSlotTakeReplayPending(OutboxSlot *slot);
extern bool OutboxSlotTakeExtensionCheck(OutboxSlot *slot);
extern void OutboxTallyAdd(OutboxDeliveryTally *tally, int64 latency_us, int bytes);
extern void OutboxSlotReportRound(OutboxSlot *slot, const OutboxRoundReport *report);

/*
 * status.c, status_metrics.c, status_health.c: everything status(),
 * metrics() and health() report, in one place (OutboxStatusTake)
 */
typedef struct OutboxStatusSnapshot
{
	OutboxSlotView slot;		/* a copy of the relay's slot */
	bool		running;		/* a relay process is attached */
	int64		backlog;
	double		oldest_age;		/* seconds, < 0 when nothing is pending */
	int64		quarantined;
	int64		parked;
	int64		queued;			/* replay queue and unjudged restored events */
	int64		held_events;	/* rows of outbox.held */
	int			held_partitions;
	double		held_age;		/* seconds since the oldest hold began, < 0 none */
	double		held_oldest_age;	/* age of the oldest held event, < 0 none */
	char	   *held_metrics;	/* their outbox_held_events samples (labels
								 * after the database's) */
	char	   *oldest_hold;	/* "topic[partition]" of the oldest hold */
	char	   *no_relay;		/* why no relay runs, when none does */
} OutboxStatusSnapshot;

extern void OutboxStatusTake(OutboxStatusSnapshot *snap);
extern const char *OutboxStatusStateName(const OutboxStatusSnapshot *snap);

/* handoff.c: the launcher's sign-on, probe requests and answers, prepared counts */
#define OUTBOX_MAX_REQUESTS			64	/* probe requests waiting */
/* probe workers: does a database have the extension? */
#define OUTBOX_MAX_PROBES			64
#define OUTBOX_PROBE_UNKNOWN		0
#define OUTBOX_PROBE_EXTENSION		1
#define OUTBOX_PROBE_NO_EXTENSION	2

extern bool OutboxLauncherAttach(void);
extern void OutboxWakeLauncher(void);
extern int	OutboxLauncherTakeRequests(Oid *out);
extern void OutboxRequestProbe(Oid dboid);
extern bool OutboxProbeBegin(Oid dboid);
extern void OutboxProbeReport(Oid dboid, bool has_extension);
extern int	OutboxProbeTake(Oid dboid);
extern void OutboxPreparedRemember(const char *gid, Oid dboid, int events,
								   bool replay);
extern bool OutboxPreparedTake(const char *gid, Oid dboid, int *events,
							   bool *replay);
extern void OutboxPreparingGid(const char *gid);
extern void OutboxNotePrepared(int events, bool replay);

/* subscription_slots.c: the subscription slots; their layout is private to it */
#define OUTBOX_SUBSCRIPTION_NAME_MAX	64	/* 63 characters and the NUL */

/* subscriptions need the SQL objects of the library's version (1.8 on) */
#define OUTBOX_OLD_SQL_PROBLEM \
	"the extension's SQL objects in this database are older than its library: run ALTER EXTENSION outbox UPDATE"
#define OUTBOX_INBOX_PARTS_MAX			64	/* partitions a slot shows */

/*
 * A subscription's states in order, each with the one spelling status()
 * shows of it (OutboxInboxStateName), so that none lacks a name.
 * JOINING: the worker's consumer waits for its group to assign it
 * partitions (a join takes seconds; no message arrives before).  RUNNING:
 * assigned, it applies what comes.  RETRYING: a handler failed, its
 * partition waits.  PARTITION_STOPPED: a partition's log does not hold its
 * next offset (consumer_range.c).
 */
#define OUTBOX_INBOX_STATES(state) \
	state(OUTBOX_INBOX_STARTING, "starting") \
	state(OUTBOX_INBOX_JOINING, "joining") \
	state(OUTBOX_INBOX_RUNNING, "running") \
	state(OUTBOX_INBOX_RETRYING, "retrying") \
	state(OUTBOX_INBOX_PARTITION_STOPPED, "partition stopped") \
	state(OUTBOX_INBOX_NOT_CONFIGURED, "not configured") \
	state(OUTBOX_INBOX_STOPPED, "stopped")

#define OUTBOX_INBOX_STATE_VALUE(value, name) value,

typedef enum OutboxInboxState
{
	OUTBOX_INBOX_STATES(OUTBOX_INBOX_STATE_VALUE)
	OUTBOX_INBOX_NSTATES
} OutboxInboxState;

/* why the launcher left a subscription without a worker (none: it did not) */
typedef enum OutboxInboxWait
{
	OUTBOX_INBOX_WAIT_NONE = 0,
	OUTBOX_INBOX_WAIT_WORKER,	/* no background worker slot was free */
	OUTBOX_INBOX_WAIT_RELAY,	/* a relay waits for one: relays come first */
	OUTBOX_INBOX_WAIT_DATABASE_LIMIT	/* outbox.max_subscriptions_per_database */
} OutboxInboxWait;

/* one assigned partition, as the worker last reported it */
typedef struct OutboxInboxPart
{
	char		topic[OUTBOX_TOPIC_MAX_LEN + 1];
	int32		partition;
	int64		next_offset;	/* -1: nothing applied yet */
	int64		high;			/* high watermark, -1: unknown */
} OutboxInboxPart;

typedef struct OutboxInboxView
{
	Oid			dboid;
	char		name[OUTBOX_SUBSCRIPTION_NAME_MAX];
	int			pid;
	OutboxInboxState state;
	TimestampTz started_at;
	uint64		processed;		/* handler calls committed */
	uint64		deduplicated;	/* messages seen before: not applied */
	uint64		failed;			/* handler errors */
	uint64		dead_lettered;
	uint64		parked;
	TimestampTz last_applied_at;
	TimestampTz last_error_at;
	char		last_error[OUTBOX_LAST_ERROR_LEN];
	OutboxInboxWait wait;		/* no worker, and why (the launcher's) */
	TimestampTz wait_since;		/* since when, 0 when wait is none */
	int			nparts;
	OutboxInboxPart parts[OUTBOX_INBOX_PARTS_MAX];
} OutboxInboxView;

/* what a worker adds to its slot after a batch commits */
typedef struct OutboxInboxTally
{
	uint64		processed;
	uint64		deduplicated;
	uint64		failed;
	uint64		dead_lettered;
	uint64		parked;
} OutboxInboxTally;

typedef struct OutboxInboxSlot OutboxInboxSlot;

/* what the launcher reads of a subscription slot in use */
typedef struct OutboxInboxPeek
{
	Oid			dboid;
	char		name[OUTBOX_SUBSCRIPTION_NAME_MAX];
	int			pid;			/* its worker's, 0: none */
	bool		gone;			/* the worker found no subscription row */
	TimestampTz hold_until;		/* no worker before */
} OutboxInboxPeek;

extern int	outbox_max_subscriptions;
extern int	outbox_max_subscriptions_per_database;
extern const char *OutboxInboxStateName(OutboxInboxState state);
extern bool OutboxInboxHasRoom(Oid dboid, const char *name);
extern bool OutboxInboxRequest(Oid dboid, const char *name, bool changed);
extern void OutboxInboxWake(Oid dboid, const char *name);
extern void OutboxInboxHoldDatabase(Oid dboid, TimestampTz until);
extern int	OutboxInboxSlotCount(void);
extern bool OutboxInboxSlotPeek(int i, OutboxInboxPeek *out);
extern void OutboxInboxSlotFree(int i);
extern void OutboxInboxSlotForget(int i);
extern void OutboxInboxSetWait(int i, Oid dboid, const char *name,
							   OutboxInboxWait wait);
extern int	OutboxInboxStopNewest(Oid dboid, int *pid);
extern int	OutboxInboxList(Oid dboid, OutboxInboxView **views);
extern OutboxInboxSlot *OutboxInboxAttach(int i, Oid dboid, const char *name);
extern void OutboxInboxDetach(OutboxInboxSlot *slot);
extern void OutboxInboxMarkGone(OutboxInboxSlot *slot);
extern bool OutboxInboxTakeChanged(OutboxInboxSlot *slot);
extern bool OutboxInboxTakeWake(OutboxInboxSlot *slot);
extern bool OutboxInboxIsHeld(OutboxInboxSlot *slot);
extern void OutboxInboxSetState(OutboxInboxSlot *slot, OutboxInboxState state);
extern void OutboxInboxSetError(OutboxInboxSlot *slot, const char *message);
extern void OutboxInboxReport(OutboxInboxSlot *slot, const OutboxInboxTally *t,
							  const OutboxInboxPart *parts, int nparts);

#endif							/* OUTBOX_SHMEM_H */
