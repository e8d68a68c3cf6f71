/*-------------------------------------------------------------------------
 *
 * relay/relay_state.h
 *		The relay's state and what its files offer each other; only the
 *		files of the relay include it.  They stand in floors, each calling
 *		only the files below it:
 *		  relay.c          the loop, its steps and its one wait
 *		  relay_round.c    rounds of a page: send, settle, quarantine
 *		  relay_producer.c the producer: built, served, closed when idle
 *		  relay_txn.c      exactly_once: Kafka transactions, reconciling
 *		                   with the progress record
 *		  relay_marker.c   the progress record written, parsed, judged
 *		  relay_page.c     the database side: short transactions (store_batch.c)
 *		  relay_hold.c     held partitions: probes and drains
 *		  relay_standby.c  a page waits for the standbys named in
 *		                   outbox.synchronized_standby_slots
 *		  relay_avro.c     Avro topics: events encoded, schemas fetched
 *		  relay_state.c    shared by all: the state shown, errors, and the
 *		                   transaction brackets
 *
 * Invariants: a relay process has one Relay, owned by relay.c and passed
 * by pointer; no relay file keeps state of its own in file-level statics.
 * Every memory context below is made at start-up under the relay's own
 * context; after start-up nothing is allocated in TopMemoryContext (the
 * wait set, there from PostgreSQL 17 on, is made at start-up: relay.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_RELAY_STATE_H
#define OUTBOX_RELAY_STATE_H

#include "access/transam.h"
#include "access/xlogdefs.h"

#include "shmem/shmem.h"
#include "kafka/kafka.h"
#include "store/store.h"

/*
 * The steps of the loop (relay.c).  A page goes READ -> SEND -> AWAIT ->
 * RECORD; AWAIT goes back to SEND while events of the page are pending
 * (after a clean round, for held-back events), or to BACK_OFF and then
 * SEND after a failed one.  Before its first round a page goes from SEND
 * to STANDBY and back until the standbys have it (relay_standby.c).  No
 * work: IDLE; disabled or no brokers: PAUSED.
 */
typedef enum RelayStep
{
	RELAY_STEP_READ,			/* choose work: a replay page or a batch page */
	RELAY_STEP_SEND,			/* hand the page's pending events to Kafka */
	RELAY_STEP_AWAIT,			/* wait for the round's delivery reports */
	RELAY_STEP_COMMIT,			/* exactly_once: progress record, then the
								 * Kafka transaction's commit */
	RELAY_STEP_RECORD,			/* a settled page: write its progress */
	RELAY_STEP_BACK_OFF,		/* wait before trying again */
	RELAY_STEP_STANDBY,			/* wait for the standbys to have the page */
	RELAY_STEP_IDLE,			/* nothing to publish: wait for a commit */
	RELAY_STEP_PAUSED,			/* outbox.enabled off or no brokers */
	RELAY_STEP_STOP				/* leave the loop: shutdown */
} RelayStep;

/*
 * A page of events on its way: read, then sent in rounds until each event
 * is delivered, quarantined or parked, then recorded.  Two batch pages take
 * turns (the one in hand and the one read ahead); replay pages have their
 * own.
 */
struct RelayHold;

typedef struct RelayPage
{
	MemoryContext cxt;			/* the events; reset when the page is read */
	OutboxEvent *events;
	int			n;
	bool		replay;			/* a page of the replay queue */
	struct RelayHold *drain;	/* a page of this hold's events (relay_hold.c) */
	char	   *cur;			/* snapshot of the batch the page belongs to */
	int64		last_id;		/* its last event id */
	bool		done;			/* the last page of its batch */
	int			rounds;			/* rounds sent so far */
	int			sent;			/* events in the round under way */
	int			retried;		/* of those, sent before */
	bool		cut;			/* shutdown cut the round short */
	XLogRecPtr	standby_lsn;	/* end of the WAL inserted, read after
								 * the page's snapshot (relay_standby.c) */
} RelayPage;

/*
 * A held topic-partition (relay_hold.c): its events wait in outbox.held.
 * Its oldest event goes alone as a probe; once that is acknowledged the
 * hold drains, a page of its held events at a time, and ends when none is
 * left.
 */
typedef struct RelayHold
{
	char	   *topic;			/* in Relay.holds_cxt */
	int32		partition;
	int32		partitions;		/* the topic's partition count its partition
								 * was computed among; 0: unknown yet (rows
								 * held before 1.8) */
	bool		told_grown;		/* the log said the topic has more now */
	int64		events;			/* its rows in outbox.held, as counted */
	TimestampTz since;
	MemoryContext probe_cxt;	/* the probe; reset for each new one */
	OutboxEvent *probe;			/* in librdkafka, or NULL */
	TimestampTz next_probe;		/* no probe before */
	bool		answered;		/* the partition answered: drain it */
	int64		answered_id;	/* the probe delivered, its row still there */
} RelayHold;

/* what a round does with one event (OutboxRelayHoldOrSend) */
typedef enum RelayHoldChoice
{
	RELAY_EVENT_SEND,			/* hand it to librdkafka */
	RELAY_EVENT_HOLD,			/* its partition is held: now HELD */
	RELAY_EVENT_WAIT			/* its partition is not known yet, and its
								 * topic has a hold: not this round */
} RelayHoldChoice;

typedef struct Relay
{
	OutboxSlot *slot;			/* opaque: only passed to relay_slots.c */
	char	   *dbname;
	MemoryContext cxt;			/* long-lived: batch strings, the contexts */
	MemoryContext loop_cxt;		/* reset at each step of the loop */
	MemoryContext avro_cxt;		/* one event's Avro encoding; reset after it
								 * (relay_avro.c) */
	RelayStep	step;
	RelayStep	after_backoff;	/* where BACK_OFF goes when it ends */

	/* pages */
	RelayPage	pages[2];
	RelayPage	replay_page;
	RelayPage  *in_hand;		/* being sent, awaited or recorded */
	RelayPage  *ahead;			/* read, not yet sent */
	OutboxBatch batch;
	bool		batch_open;

	/* Kafka, and the one wait: latch, postmaster death, producer's fd */
	OutboxProducer *producer;
	WaitEventSet *wait_set;		/* made at start-up, kept for life */
	int			event_pipe[2];	/* every producer writes to [1] when it has news */
	const char *fatal_reason;	/* a fatal delivery error: rebuild */
	bool		producer_closed;	/* closed for idleness (outbox.kafka_idle_timeout) */
	TimestampTz idle_since;		/* nothing to publish since; 0: busy */
	uint32		wait_idle;		/* wait events (compat.h) */
	uint32		wait_acks;
	uint32		wait_backoff;

	/* the round under way (SEND to AWAIT) */
	TimestampTz round_started;
	TimestampTz round_give_up;	/* outbox.delivery_timeout */
	TimestampTz last_stall_report;
	bool		round_abandoned;	/* purged for shutdown */

	/* waits and failures */
	TimestampTz wait_until;		/* end of the IDLE/PAUSED/BACK_OFF wait */
	TimestampTz stop_deadline;	/* shutdown asked: acks waited for until */
	int			backoff_ms;		/* 0: not backing off */
	TimestampTz last_error_log;
	int			errors_since_log;
	const char *logged_state;	/* state name last logged */

	/* aggregates whose events wait behind a quarantined one */
	List	   *blocked;		/* of OutboxBlocked, in blocked_cxt */
	MemoryContext blocked_cxt;
	bool		blocked_stale;

	/* held partitions (relay_hold.c) */
	List	   *holds;			/* of RelayHold, in holds_cxt */
	MemoryContext holds_cxt;
	RelayPage	drain_page;
	bool		drain_turn;		/* a drain page goes before the next batch page */
	TimestampTz last_ack_at;	/* the last acknowledgement of any event */
	TimestampTz last_hold_at;	/* when the last hold started */
	bool		can_hold;		/* the database has outbox.held (1.4 on) */
	bool		held_counted;	/* and outbox.held.partition_count (1.8 on) */
	TimestampTz held_checked_at;	/* when can_hold was last found false */

	/* what the database side has to do */
	bool		replays_due;
	TimestampTz restore_waiting_since;	/* 0: no restored events wait */
	TimestampTz next_cleanup;
	/*
	 * The oldest event the last cleanup saw (or the time it looked, if
	 * older or when it saw none): no event is past the retention before
	 * this is, but those of transactions open then, whose deletion may so
	 * wait as long as they stayed open.  0: look at the next cleanup.
	 * events_looked_at: when it last looked (it looks at least hourly).
	 */
	TimestampTz events_oldest;
	TimestampTz events_looked_at;

	/*
	 * The log's ring (relay_rotation.c): whether this database's log is
	 * one (1; -1: not; 0: not looked yet), when the next step is due, and what kept
	 * the oldest closed generation at the last step ("" for nothing).
	 */
	int			log_rotates;
	TimestampTz next_rotate;
	int			rotation_retention;	/* outbox.retention at the last step */
	char		rotation_waits_for[64];

	/*
	 * The cluster's transaction completion count (compat.h) read just
	 * before the last look that found no new batch, and before the last
	 * replay read that found the queue empty.  While it has not moved, no
	 * transaction has ended since, so a new look would find the same
	 * nothing: an idle relay's safety poll opens no transaction.
	 */
	uint64		batch_seen_completions;
	bool		batch_seen_valid;

	/*
	 * The next transaction id, read with batch_seen_completions.  When it
	 * has moved but the completion count has not, transactions have begun
	 * writing and none has ended: the poll moves the previous snapshot past
	 * them (OutboxRelayPassStarted), so that the look after the next end
	 * does not visit the rows they have written meanwhile.
	 */
	FullTransactionId batch_seen_next_xid;
	uint64		replay_seen_completions;
	bool		replay_seen_valid;

	/* the kernel refused to unmap the shared buffers (release_idle_memory) */
	bool		unmap_refused;

	/* publishing only what the standbys have (relay_standby.c) */
	XLogRecPtr	batch_lsn;		/* end of the WAL after the batch's snapshot */
	XLogRecPtr	recorded_lsn[2];	/* ... after the page before the last
									 * and the last were recorded */
	TimestampTz standby_wait_since; /* the page in hand waits since, or 0 */
	bool		standby_blocked;	/* a named slot cannot catch up as it is */
	bool		standby_reported;	/* the wait is in status() and the log */
	char		standby_said[128];	/* the reason last logged, "" none */
	uint32		wait_standby;	/* wait event (compat.h) */
	/* outbox.delivery = exactly_once (relay_txn.c) */
	char	   *txn_id;			/* the transactional.id wanted, in cxt */
	bool		txn_inited;		/* init_transactions() done on this producer */
	bool		txn_ready;		/* and the progress topic reconciled */
	bool		txn_open;		/* a Kafka transaction is open */
	bool		txn_committing; /* its commit was asked for */
	bool		in_hand_committed;	/* the page in hand's transaction turned
									 * out committed: record it */
	bool		marker_sent;	/* the transaction's progress record is out */
	bool		page_in_txn;	/* the page in hand has events delivered in
								 * the transaction */
	OutboxEvent marker;			/* its delivery outcome */
	int64		kafka_txn;		/* the last transaction recorded in the
								 * database (relay_progress.kafka_transaction) */
	int64		txn_to_record;	/* the page being recorded committed in this
								 * transaction; 0: none */
	int64	   *unsettled;		/* events dead-lettered before their page's
								 * transaction committed, in cxt */
	int			nunsettled;
	bool		fenced;			/* another producer has the transactional.id */
	char	   *topic_checked;	/* the progress topic checked (or found
								 * uncheckable), in cxt */
	char		txn_error[256];
} Relay;

/* a report that changes nothing until filled in (OutboxSlotReportRound) */
static inline void
OutboxRelayReportInit(OutboxRoundReport *report)
{
	memset(report, 0, sizeof(*report));
	report->brokers_up = OUTBOX_BROKERS_UNCHANGED;
}

/* relay_state.c */
extern void OutboxRelaySetState(Relay *r, OutboxRelayState state);
extern void OutboxRelayNoteError(Relay *r, const char *what, const char *detail);
extern void OutboxRelayReportError(Relay *r, const char *what, const char *detail);
extern void OutboxRelayBeginTxn(const char *activity);
extern void OutboxRelayEndTxn(Relay *r);

/* relay_avro.c: Avro topics' events encoded, their schemas fetched */
typedef enum RelayAvro
{
	RELAY_AVRO_NONE,			/* not an Avro topic's JSON event */
	RELAY_AVRO_ENCODED,
	RELAY_AVRO_UNFIT,			/* the payload does not fit the schema */
	RELAY_AVRO_UNAVAILABLE		/* the topic has no schema now */
} RelayAvro;

extern void OutboxRelayReadSecrets(Relay *r);
extern void OutboxRelayFetchSchemas(Relay *r);
extern bool OutboxRelayIsAvro(const OutboxEvent *ev);
extern RelayAvro OutboxRelayEncodeAvro(Relay *r, MemoryContext cxt, OutboxEvent *ev,
									   bool *may_ask, char *err, size_t errlen);

/* relay_standby.c */
extern XLogRecPtr OutboxRelayWalEnd(void);
extern bool OutboxRelayStandbysHave(Relay *r, RelayPage *pg);
extern long OutboxRelayStandbyPollMs(const Relay *r);

/* relay_hold.c */
extern void OutboxRelayLoadHolds(Relay *r);
extern void OutboxRelayPartition(Relay *r, OutboxEvent *ev);
extern RelayHoldChoice OutboxRelayHoldOrSend(Relay *r, RelayPage *pg, OutboxEvent *ev);
extern bool OutboxRelayHoldStalled(Relay *r, RelayPage *pg);
extern void OutboxRelayServeProbes(Relay *r);
extern void OutboxRelaySendProbes(Relay *r);
extern void OutboxRelayForgetProbes(Relay *r);
extern bool OutboxRelayDrainDue(const Relay *r);
extern bool OutboxRelayTakeDrain(Relay *r);
extern void OutboxRelayRecordDrain(Relay *r, RelayPage *pg);
extern void OutboxRelayCountHeld(Relay *r, const RelayPage *pg);

/* a progress record, as parsed */
typedef struct RelayMarker
{
	int64		transaction;
	bool		replay;			/* a replay page; else a batch page */
	char	   *snapshot;		/* batch: the batch's snapshot */
	int64		first_id;		/* replay: first queue position */
	int64		last_id;		/* batch: last event id; replay: last queue
								 * position */
	bool		done;			/* batch: the batch's last page */
	int			events;			/* events published in it */
	TimeLineID	timeline;		/* the WAL the page was read from: every */
	XLogRecPtr	lsn;			/* commit it saw ends before lsn */
} RelayMarker;

/* relay_marker.c */
extern bool OutboxRelayParseMarker(const char *value, RelayMarker *m);
extern char *OutboxRelayMarkerValue(Relay *r, RelayPage *pg, int64 transaction);
extern bool OutboxRelayMarkerFits(Relay *r, const RelayMarker *m);

/* relay_txn.c; whether the producer publishes in Kafka transactions */
#define RELAY_TRANSACTIONAL(r) \
	((r)->producer != NULL && OutboxProducerTransactionalId((r)->producer) != NULL)

extern const char *OutboxRelayTxnIdWanted(Relay *r);
extern void OutboxRelayTxnInDoubt(Relay *r);
extern void OutboxRelayTxnAbortNow(Relay *r);
extern bool OutboxRelayTxnStart(Relay *r);
extern void OutboxRelayTxnFence(Relay *r, const char *err);
extern bool OutboxRelayTxnBegin(Relay *r);
extern void OutboxRelayTxnAbort(Relay *r, RelayPage *pg);
extern void OutboxRelayTxnSkipSettled(Relay *r, RelayPage *pg);
extern void OutboxRelayTxnPrerecord(Relay *r, RelayPage *pg);
extern void OutboxRelayTxnSendMarker(Relay *r, RelayPage *pg);
extern OutboxTxnResult OutboxRelayTxnCommit(Relay *r);
extern void OutboxRelayTxnRevert(Relay *r, RelayPage *pg);
/* relay_page.c */
extern void OutboxRelayCheckExtension(Relay *r);
extern void OutboxRelayReloadBlocked(Relay *r);
extern bool OutboxRelayReadPage(Relay *r, RelayPage *pg);
extern void OutboxRelayPassStarted(Relay *r, FullTransactionId next_xid);
extern bool OutboxRelayReadReplays(Relay *r, RelayPage *pg);
extern void OutboxRelayRecordPage(Relay *r, RelayPage *pg);
extern void OutboxRelayAdoptRestored(Relay *r);
extern void OutboxRelayCleanup(Relay *r);
extern void OutboxRelayLoadProgress(Relay *r, Oid dboid);
/* relay_rotation.c */
extern void OutboxRelayRotate(Relay *r);

/* relay_producer.c */
extern void OutboxRelaySetProducer(Relay *r, OutboxProducer *producer);
extern bool OutboxRelayEnsureProducer(Relay *r);
extern void OutboxRelayCloseIdleProducer(Relay *r);
extern int	OutboxRelayServeProducer(Relay *r);
extern void OutboxRelayTakeProducerErrors(Relay *r, OutboxRoundReport *report);
extern void OutboxRelayReportProducer(Relay *r);

/* relay_round.c */
extern void OutboxRelayParkBlocked(Relay *r, RelayPage *pg);
extern bool OutboxRelayPreparePage(Relay *r, RelayPage *pg);
extern void OutboxRelaySendRound(Relay *r, RelayPage *pg);
extern void OutboxRelayWatchRound(Relay *r, int pending);
extern bool OutboxRelaySettleRound(Relay *r, RelayPage *pg);
extern bool OutboxRelayPagePending(const RelayPage *pg);

#endif							/* OUTBOX_RELAY_STATE_H */
