/*-------------------------------------------------------------------------
 *
 * relay/relay_hold.c
 *		Held partitions: a Kafka partition that acknowledges nothing while
 *		the rest of the cluster does stops only its own events.
 *
 * Invariants:
 *	- A page is recorded only once each of its events is acknowledged,
 *	  dead-lettered, or held: written to outbox.held in the transaction
 *	  that records the page (relay_page.c).  So a crash at any point loses
 *	  nothing: what was not recorded is read and sent again, and held rows
 *	  are loaded again at start-up before any page is read.
 *	- An event of a held partition is never handed to librdkafka from a
 *	  batch page: it is held too (OutboxRelayHoldOrSend), behind the older
 *	  ones.  The relay knows an event's partition before sending it
 *	  (kafka_topic.c), so a held partition costs librdkafka no memory; the
 *	  relay keeps one probe event per hold and the table keeps the rest.
 *	- A hold starts when a round has waited outbox.hold_after and every
 *	  event still unacknowledged is of a known partition, while the cluster
 *	  shows life (an acknowledgement in the round, or within hold_after
 *	  before it, or a hold started within hold_after before it, and
 *	  librdkafka has not said that every broker is down): a whole-cluster
 *	  outage holds nothing and the page waits, as without holds.  A hold
 *	  counts because the round after it may carry only events of the same
 *	  outage's other partitions, sent again after the withdrawal, whose
 *	  acknowledgements came before the withdrawn round's wait.  The round
 *	  is withdrawn (its unacknowledged events are all of the partitions now
 *	  held) and the page recorded.
 *	- A hold's oldest event goes alone, as a probe, which librdkafka
 *	  retries until the partition answers.  Once the probe is acknowledged
 *	  the hold drains: pages of its held events in id order, taking turns
 *	  with batch pages, each page's rows deleted when it is recorded.  A
 *	  drain read that finds nothing ends the hold; that partition's newer
 *	  events are then sent as usual, after every held one.  A drain that
 *	  stalls again puts the hold back to probing.
 *	- Order is kept per topic-partition, which is all a Kafka consumer can
 *	  observe: an aggregate's events share it when they share topic and key
 *	  (the default).  Replays are not held; a replay to a held partition
 *	  waits for it, as before.
 *	- A topic with holds keeps its partition count: every event of it is
 *	  partitioned among the count its held partitions were computed among
 *	  (RelayHold.partitions, outbox.held.partition_count across restarts),
 *	  not among the count the topic has grown to since.  So a key whose
 *	  events are held keeps the held partition, and its new events are held
 *	  behind them; the other keys keep the partitions they had.  The count
 *	  the relay learns changes only between pages (kafka_topic.c) and an
 *	  event's partition is computed in its page's first round
 *	  (relay_round.c), so the events of a topic that start a hold share one
 *	  count.  Once the topic's last hold ends, every held event of it
 *	  acknowledged, its events go where the count it has now puts them.
 *	  Holds loaded from rows held before 1.8, which record no count, take
 *	  the first count the relay uses for the topic after loading them.
 *	- The log says when a hold starts and when it ends, once each.
 *
 * No SQL text here (store_held.c) and no librdkafka call (producer.c).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "relay/relay_state.h"
#include "base/base.h"
#include "shmem/shmem.h"
#include "kafka/kafka.h"
#include "store/store.h"
#include "registry/registry.h"

#define HOLD_PROBE_RETRY_MS	1000	/* after a probe librdkafka refused */
#define HOLD_TABLE_CHECK_MS	10000	/* looking for outbox.held after an update */

#define HOLD_ANY_PARTITION	(-1)	/* find_hold: a hold of the topic's */

/*
 * find_hold
 *		The first hold of topic on partition (HOLD_ANY_PARTITION: on any of
 *		its partitions), or NULL; counted: only a hold that knows the
 *		partition count its partition was computed among.
 */
static RelayHold *
find_hold(const Relay *r, const char *topic, int32 partition, bool counted)
{
	ListCell   *lc;

	foreach(lc, r->holds)
	{
		RelayHold  *h = (RelayHold *) lfirst(lc);

		if ((partition == HOLD_ANY_PARTITION || h->partition == partition) &&
			(!counted || h->partitions > 0) && strcmp(h->topic, topic) == 0)
			return h;
	}
	return NULL;
}

/*
 * kept_partitions
 *		The partition count the events of topic are computed among while it
 *		has holds: that of its holds; 0 when it has none, or none that knows
 *		its count.
 */
static int32
kept_partitions(const Relay *r, const char *topic)
{
	RelayHold  *h = find_hold(r, topic, HOLD_ANY_PARTITION, true);

	return h != NULL ? h->partitions : 0;
}

static RelayHold *
add_hold(Relay *r, const char *topic, int32 partition, int32 partitions, int64 events,
		 TimestampTz since)
{
	MemoryContext old = MemoryContextSwitchTo(r->holds_cxt);
	RelayHold  *h = palloc0(sizeof(RelayHold));

	h->topic = pstrdup(topic);
	h->partition = partition;
	h->partitions = partitions;
	h->events = events;
	h->since = since;
	h->probe_cxt = AllocSetContextCreate(r->holds_cxt, "outbox hold probe",
										 ALLOCSET_SMALL_SIZES);
	r->holds = lappend(r->holds, h);
	MemoryContextSwitchTo(old);
	return h;
}

static void
end_hold(Relay *r, RelayHold *h)
{
	long		secs = (long) ((GetCurrentTimestamp() - h->since) / USECS_PER_SEC);

	ereport(LOG,
			(errmsg("outbox relay: released topic \"%s\" partition %d", h->topic, h->partition),
			 errdetail("Its held events were delivered in order after %ld s; its new events are sent as usual.",
					   secs)));
	r->holds = list_delete_ptr(r->holds, h);
	MemoryContextDelete(h->probe_cxt);
	pfree(h->topic);
	pfree(h);
}

/*
 * OutboxRelayLoadHolds
 *		The holds outbox.held keeps that the relay does not know of: at
 *		start-up, and after a restore may have brought some.  In a
 *		transaction.
 */
void
OutboxRelayLoadHolds(Relay *r)
{
	OutboxHeldPartition *rows;
	int			n;
	int			i;

	r->held_checked_at = GetCurrentTimestamp();
	r->can_hold = OutboxStoreHeldPresent(&r->held_counted);
	if (!r->can_hold)
		return;
	n = OutboxStoreLoadHolds(&rows, r->held_counted, CurrentMemoryContext);
	for (i = 0; i < n; i++)
	{
		if (find_hold(r, rows[i].topic, rows[i].partition, false) != NULL)
			continue;
		(void) add_hold(r, rows[i].topic, rows[i].partition, rows[i].partitions,
						rows[i].events, rows[i].since);
		ereport(LOG,
				(errmsg("outbox relay: holding topic \"%s\" partition %d", rows[i].topic,
						rows[i].partition),
				 errdetail("outbox.held keeps " INT64_FORMAT " of its events; they are sent first once the partition answers.",
						   rows[i].events)));
	}
}

/*
 * keep_count
 *		ev of a topic with holds got a partition among kept partitions (0:
 *		none known): holds of the topic that know no count take ev's, and
 *		the log says once when the topic has more partitions than it keeps.
 */
static void
keep_count(Relay *r, const OutboxEvent *ev, int32 kept)
{
	ListCell   *lc;
	RelayHold  *first = NULL;
	int32		now;

	foreach(lc, r->holds)
	{
		RelayHold  *h = (RelayHold *) lfirst(lc);

		if (strcmp(h->topic, ev->topic) != 0)
			continue;
		if (h->partitions == 0)
			h->partitions = ev->partition_count;
		if (first == NULL)
			first = h;
	}
	/* told on the topic's first hold */
	if (kept == 0 || first == NULL || first->told_grown)
		return;
	now = OutboxProducerTopicPartitions(r->producer, ev->topic);
	if (now <= kept)
		return;
	first->told_grown = true;
	ereport(LOG,
			(errmsg("outbox relay: topic \"%s\" has %d partitions now; its events keep going to the %d it had",
					ev->topic, now, kept),
			 errdetail("Partitions of it are held: each key's new events go to the partition where its held events wait. The new partitions receive events once every held event of the topic is delivered.")));
}

/*
 * OutboxRelayPartition
 *		Compute ev's partition if it has none yet (or it was unknown): while
 *		its topic has holds, among the count they keep.  Called for a page's
 *		pending events in id order, from its first round on.
 */
void
OutboxRelayPartition(Relay *r, OutboxEvent *ev)
{
	int32		kept;

	if (ev->partition >= 0)
		return;
	kept = r->holds == NIL ? 0 : kept_partitions(r, ev->topic);
	(void) OutboxProducerPartition(r->producer, ev, kept);
	if (r->holds != NIL && ev->partition >= 0)
		keep_count(r, ev, kept);
}

/*
 * OutboxRelayHoldOrSend
 *		What the round does with ev, pending, not held back and partitioned
 *		(OutboxRelayPartition): an event of a held partition is held (unless
 *		pg is that hold's drain); one whose partition is unknown waits while
 *		its topic has a hold, since it may belong to the held partition.
 *		The relay has a producer.
 */
RelayHoldChoice
OutboxRelayHoldOrSend(Relay *r, RelayPage *pg, OutboxEvent *ev)
{
	if (pg->drain != NULL || pg->replay || r->holds == NIL)
		return RELAY_EVENT_SEND;
	if (ev->partition < 0)
		return find_hold(r, ev->topic, HOLD_ANY_PARTITION, false) != NULL ?
			RELAY_EVENT_WAIT : RELAY_EVENT_SEND;
	if (find_hold(r, ev->topic, ev->partition, false) == NULL)
		return RELAY_EVENT_SEND;
	ev->disposition = OUTBOX_EVENT_HELD;
	return RELAY_EVENT_HOLD;
}

/* a hold begins (or, for a stalled drain, begins again) */
static void
hold_partition(Relay *r, const OutboxEvent *ev, TimestampTz now)
{
	RelayHold  *h = find_hold(r, ev->topic, ev->partition, false);

	if (h != NULL)
	{
		/* its drain stalled: probe again */
		h->answered = false;
		return;
	}
	(void) add_hold(r, ev->topic, ev->partition, ev->partition_count, 0, now);
	ereport(LOG,
			(errmsg("outbox relay: holding topic \"%s\" partition %d", ev->topic, ev->partition),
			 errdetail("It acknowledged nothing for %d ms while the cluster answered; its events wait in outbox.held, in order, and the other partitions' events flow on.",
					   outbox_hold_after)));
}

/*
 * OutboxRelayHoldStalled
 *		The round of pg under way: if it has waited outbox.hold_after and
 *		what is unacknowledged can be held (see the file's invariants),
 *		hold those partitions, withdraw the round and mark every pending
 *		event of a held partition HELD.  Returns whether it did; the
 *		withdrawn messages' reports are then served as usual.
 */
bool
OutboxRelayHoldStalled(Relay *r, RelayPage *pg)
{
	TimestampTz now = GetCurrentTimestamp();
	int			stalled = 0;
	int			acked = 0;
	int			i;

	if (outbox_hold_after <= 0 || pg->replay || r->round_abandoned ||
		!TimestampDifferenceExceeds(r->round_started, now, outbox_hold_after))
		return false;
	for (i = 0; i < pg->n; i++)
	{
		OutboxEvent *ev = &pg->events[i];

		/* held already: withdrawn, its purge report not yet served */
		if (ev->in_flight && ev->disposition == OUTBOX_EVENT_PENDING)
		{
			if (ev->partition < 0)
				return false;
			stalled++;
		}
		else if (ev->disposition == OUTBOX_EVENT_PENDING && ev->delivery_err == 0)
			acked++;
	}
	if (stalled == 0)
		return false;
	/* the whole cluster is down: nothing answers, so holding helps nobody */
	if (OutboxProducerAllBrokersDown(r->producer))
		return false;
	if (acked == 0 &&
		Max(r->last_ack_at, r->last_hold_at) <
		TimestampTzPlusMilliseconds(r->round_started, -outbox_hold_after))
		return false;
	if (!r->can_hold)
	{
		/* ALTER EXTENSION outbox UPDATE may have brought outbox.held since */
		if (!TimestampDifferenceExceeds(r->held_checked_at, now, HOLD_TABLE_CHECK_MS))
			return false;
		OutboxRelayBeginTxn("looking for outbox.held");
		OutboxRelayLoadHolds(r);
		OutboxRelayEndTxn(r);
		if (!r->can_hold)
			return false;
	}

	for (i = 0; i < pg->n; i++)
		if (pg->events[i].in_flight && pg->events[i].disposition == OUTBOX_EVENT_PENDING)
			hold_partition(r, &pg->events[i], now);
	r->last_hold_at = now;
	OutboxProducerPurge(r->producer);
	for (i = 0; i < pg->n; i++)
	{
		OutboxEvent *ev = &pg->events[i];

		if (ev->disposition != OUTBOX_EVENT_PENDING || ev->delivery_err == 0)
			continue;
		OutboxRelayPartition(r, ev);
		if (ev->partition >= 0 && find_hold(r, ev->topic, ev->partition, false) != NULL)
			ev->disposition = OUTBOX_EVENT_HELD;
	}
	return true;
}

/*
 * OutboxRelayServeProbes
 *		After the producer was served: an acknowledged probe lets its hold
 *		drain, and so does one refused for good (the drain settles it); one
 *		that failed otherwise (a purge withdrew it) is sent again later.
 */
void
OutboxRelayServeProbes(Relay *r)
{
	ListCell   *lc;
	TimestampTz now = 0;

	foreach(lc, r->holds)
	{
		RelayHold  *h = (RelayHold *) lfirst(lc);

		if (h->probe == NULL || h->probe->delivery_err == OUTBOX_DELIVERY_PENDING)
			continue;
		if (now == 0)
			now = GetCurrentTimestamp();
		if (h->probe->delivery_err == 0)
		{
			OutboxRoundReport report;

			h->answered = true;
			h->answered_id = h->probe->id;
			r->last_ack_at = now;
			/* published like any event; held events left the batch's backlog */
			OutboxRelayReportInit(&report);
			OutboxTallyAdd(&report.delivered, now - h->probe->created_at,
						   h->probe->payload_len);
			OutboxSlotReportRound(r->slot, &report);
		}
		else if (h->probe->last_class != OUTBOX_ERROR_TRANSIENT)
		{
			/*
			 * The partition answered, with a refusal of the event itself
			 * (too large, not authorized): the drain sends it again, and
			 * settles it as any page does (attempts, quarantine).
			 */
			h->answered = true;
		}
		else
			h->next_probe = TimestampTzPlusMilliseconds(now, HOLD_PROBE_RETRY_MS);
		h->probe = NULL;
	}
}

/*
 * probe_encoded
 *		An Avro topic's probe encoded like any of its events.  One that fits
 *		its schema no more is drained, and the drain's page quarantines it,
 *		as Kafka's refusal of a probe would; with no schema now, the probe
 *		waits.  False when it is not to be sent now.
 */
static bool
probe_encoded(Relay *r, RelayHold *h, TimestampTz now)
{
	char		err[OUTBOX_REGISTRY_ERROR_LEN];
	bool		may_ask = true;
	RelayAvro	result = OutboxRelayEncodeAvro(r, h->probe_cxt, h->probe, &may_ask,
											   err, sizeof(err));

	if (result != RELAY_AVRO_UNFIT && result != RELAY_AVRO_UNAVAILABLE)
		return true;
	if (result == RELAY_AVRO_UNFIT)
		h->answered = true;
	h->probe = NULL;
	h->next_probe = TimestampTzPlusMilliseconds(now, HOLD_PROBE_RETRY_MS);
	return false;
}

/*
 * OutboxRelaySendProbes
 *		Send a probe for each hold that has none and is not draining: its
 *		oldest held event, alone, to its partition.  Reads them in one
 *		transaction, and only when some hold needs one.
 */
void
OutboxRelaySendProbes(Relay *r)
{
	ListCell   *lc;
	TimestampTz now = GetCurrentTimestamp();
	bool		in_txn = false;

	foreach(lc, r->holds)
	{
		RelayHold  *h = (RelayHold *) lfirst(lc);
		OutboxEvent *events;

		if (h->probe != NULL || h->answered || now < h->next_probe)
			continue;
		if (!in_txn)
		{
			OutboxRelayBeginTxn("reading held events");
			in_txn = true;
		}
		MemoryContextReset(h->probe_cxt);
		if (OutboxStoreReadHeld(h->topic, h->partition, 1, &events, h->probe_cxt) == 0)
		{
			/* nothing left to hold: let the drain end it */
			h->answered = true;
			continue;
		}
		h->probe = &events[0];
		h->probe->probe = true;
		if (OutboxRelayIsAvro(h->probe))
		{
			/* the registry may be asked: with no transaction open */
			OutboxRelayEndTxn(r);
			in_txn = false;
			if (!probe_encoded(r, h, now))
				continue;
		}
		OutboxProducerSend(r->producer, h->probe);
		if (h->probe->delivery_err != OUTBOX_DELIVERY_PENDING)
		{
			h->probe = NULL;
			h->next_probe = TimestampTzPlusMilliseconds(now, HOLD_PROBE_RETRY_MS);
		}
	}
	if (in_txn)
		OutboxRelayEndTxn(r);
}

/*
 * OutboxRelayForgetProbes
 *		The producer is being replaced: its probes will never report.
 */
void
OutboxRelayForgetProbes(Relay *r)
{
	ListCell   *lc;

	foreach(lc, r->holds)
		((RelayHold *) lfirst(lc))->probe = NULL;
}

/* Whether a hold's partition answered, so that a drain page is due. */
bool
OutboxRelayDrainDue(const Relay *r)
{
	ListCell   *lc;

	foreach(lc, r->holds)
		if (((RelayHold *) lfirst(lc))->answered)
			return true;
	return false;
}

/*
 * read_drain
 *		Read into pg the next page of an answered hold's events, in id
 *		order, deleting first the row of its acknowledged probe; a hold with
 *		nothing left ends.  False when no hold has a page to drain.
 */
static bool
read_drain(Relay *r, RelayPage *pg)
{
	ListCell   *lc;
	RelayHold  *found = NULL;
	List	   *emptied = NIL;
	MemoryContext old;

	MemoryContextReset(pg->cxt);
	pg->n = 0;
	pg->replay = false;
	pg->rounds = 0;
	pg->drain = NULL;
	OutboxRelayBeginTxn("reading held events");
	foreach(lc, r->holds)
	{
		RelayHold  *h = (RelayHold *) lfirst(lc);

		if (!h->answered)
			continue;
		if (h->answered_id != 0)
		{
			OutboxStoreDeleteHeld(h->answered_id);
			h->answered_id = 0;
			h->events = Max(h->events - 1, 0);
		}
		pg->n = OutboxStoreReadHeld(h->topic, h->partition, outbox_batch_size,
									&pg->events, pg->cxt);
		if (pg->n > 0)
		{
			found = h;
			break;
		}
		/* nothing left: the hold ends (rows of events deleted by hand go too) */
		(void) OutboxStoreEndHold(h->topic, h->partition);
		old = MemoryContextSwitchTo(r->loop_cxt);
		emptied = lappend(emptied, h);
		MemoryContextSwitchTo(old);
	}
	OutboxRelayEndTxn(r);

	/* ended once their transaction committed */
	foreach(lc, emptied)
		end_hold(r, (RelayHold *) lfirst(lc));
	list_free(emptied);
	if (found == NULL)
		return false;
	pg->drain = found;
	pg->cur = NULL;
	pg->last_id = pg->events[pg->n - 1].id;
	pg->done = false;
	return true;
}

/*
 * OutboxRelayTakeDrain
 *		Put a drain page in hand, if a hold has one; the batch has the next
 *		turn either way.
 */
bool
OutboxRelayTakeDrain(Relay *r)
{
	r->drain_turn = false;
	if (!OutboxRelayDrainDue(r) || !read_drain(r, &r->drain_page))
		return false;
	r->drain_page.standby_lsn = OutboxRelayWalEnd();
	r->in_hand = &r->drain_page;
	return true;
}

/*
 * OutboxRelayRecordDrain
 *		A settled drain page: its dead letters and the deletion of its
 *		settled rows, in one transaction.  Events held again (the drain
 *		stalled) keep their rows.
 */
void
OutboxRelayRecordDrain(Relay *r, RelayPage *pg)
{
	RelayHold  *h = pg->drain;
	int64		gone;

	OutboxRelayBeginTxn("recording delivered held events");
	if (OutboxStoreRecordDeadLetters(pg->events, pg->n, OutboxDeliveryErrorText) > 0)
		r->replays_due = true;
	gone = OutboxStoreReleaseHeld(pg->events, pg->n);
	OutboxRelayEndTxn(r);
	h->events = Max(h->events - gone, 0);
	pg->drain = NULL;
}

/*
 * OutboxRelayCountHeld
 *		A batch page was recorded: its held events join their holds' counts.
 */
void
OutboxRelayCountHeld(Relay *r, const RelayPage *pg)
{
	int			i;

	for (i = 0; i < pg->n; i++)
		if (pg->events[i].disposition == OUTBOX_EVENT_HELD)
		{
			RelayHold  *h = find_hold(r, pg->events[i].topic, pg->events[i].partition,
									  false);

			if (h != NULL)
				h->events++;
		}
}
