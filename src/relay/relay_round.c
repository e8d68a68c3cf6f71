/*-------------------------------------------------------------------------
 *
 * relay/relay_round.c
 *		Rounds of a page: hand its pending events to librdkafka, then settle
 *		what their delivery reports say; quarantine and park.
 *
 * Invariants:
 *	- A round hands librdkafka the page's pending events in id order,
 *	  except those held back behind an earlier event of their aggregate
 *	  that was refused and is being retried: an aggregate's events never
 *	  overtake one another.  Each pending event's partition is computed in
 *	  the page's first round, held back or not (relay_hold.c says why).
 *	  Events of a held partition are held instead of sent (relay_hold.c).
 *	  Sending again what failed is the next round's job (the SEND step);
 *	  settling never sends.
 *	- Shutdown is looked at between any two messages handed to librdkafka,
 *	  whose only blocking call is bounded (producer.c): a round cut short says
 *	  so (RelayPage.cut); what it did send is awaited within
 *	  outbox.shutdown_timeout, and the rest is never sent.
 *	- Delivery reports were classified where they arrived (producer.c); a
 *	  settled round only applies them, in id order: delivered, counted
 *	  towards outbox.max_attempts, quarantined, parked.  Its figures reach
 *	  shared memory in one OutboxSlotReportRound.
 *	- With outbox.poison_policy = 'block', an event of an aggregate with a
 *	  quarantined event is parked, never sent; the blocked list learns of
 *	  every quarantine whatever the policy, so that it stays true if the
 *	  policy changes, and is read again (blocked_stale) after replays.
 *
 * No SQL here (store_batch.c) and no librdkafka call (producer.c).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "postmaster/interrupt.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "relay/relay_state.h"
#include "base/base.h"
#include "shmem/shmem.h"
#include "kafka/kafka.h"
#include "store/store.h"
#include "registry/registry.h"

#define RELAY_STALL_REPORT_MS	2000	/* acks this late are reported */

static OutboxBlocked *
find_blocked(Relay *r, const OutboxEvent *ev)
{
	ListCell   *lc;

	foreach(lc, r->blocked)
	{
		OutboxBlocked *b = (OutboxBlocked *) lfirst(lc);

		if (strcmp(b->aggregate_id, ev->aggregate_id) == 0 &&
			strcmp(b->aggregate_type, ev->aggregate_type) == 0)
			return b;
	}
	return NULL;
}

static void
block_aggregate(Relay *r, const OutboxEvent *head)
{
	MemoryContext old = MemoryContextSwitchTo(r->blocked_cxt);
	OutboxBlocked *b = palloc(sizeof(OutboxBlocked));

	b->aggregate_type = pstrdup(head->aggregate_type);
	b->aggregate_id = pstrdup(head->aggregate_id);
	b->head = pstrdup(head->event_id);
	r->blocked = lappend(r->blocked, b);
	MemoryContextSwitchTo(old);
}

static bool
same_aggregate(const OutboxEvent *a, const OutboxEvent *b)
{
	return strcmp(a->aggregate_id, b->aggregate_id) == 0 &&
		strcmp(a->aggregate_type, b->aggregate_type) == 0;
}

/*
 * OutboxRelayParkBlocked
 *		Before a batch page's first round, with outbox.poison_policy =
 *		'block': park the events of blocked aggregates.  Decided now rather
 *		than when read, and against a blocked list read again if a replay,
 *		discard or replay page made it stale since: the page read ahead was
 *		read before those.  Whether a parked event stays parked is decided
 *		again when it is recorded (OutboxStoreRecordDeadLetters), as a
 *		replay() or discard() may commit while the page is in flight.
 */
void
OutboxRelayParkBlocked(Relay *r, RelayPage *pg)
{
	int			i;

	if (outbox_poison_policy != OUTBOX_POISON_BLOCK)
		return;
	if (r->blocked_stale)
	{
		OutboxRelayBeginTxn("reading dead letters");
		OutboxRelayReloadBlocked(r);
		OutboxRelayEndTxn(r);
	}
	for (i = 0; i < pg->n; i++)
	{
		OutboxBlocked *b = find_blocked(r, &pg->events[i]);

		/* a page prepared again keeps what its last try settled */
		if (b != NULL && pg->events[i].disposition == OUTBOX_EVENT_PENDING)
		{
			pg->events[i].disposition = OUTBOX_EVENT_PARKED;
			pg->events[i].blocked_by = b->head;
		}
	}
}

/*
 * quarantine
 *		events[i] of pg was refused outbox.max_attempts times.  With the
 *		block policy, the later events of its aggregate in this page park
 *		behind it, and so will those of later pages (OutboxRelayParkBlocked).
 *		A replay page's quarantines are learnt by reading the list again.
 */
static void
quarantine(Relay *r, RelayPage *pg, int i)
{
	OutboxEvent *head = &pg->events[i];
	int			j;

	head->disposition = OUTBOX_EVENT_QUARANTINED;
	ereport(LOG,
			(head->error_text ?
			 errmsg("outbox relay quarantined event %s: its payload does not fit its topic's Avro schema",
					head->event_id) :
			 errmsg("outbox relay quarantined event %s after %d attempts",
					head->event_id, head->attempts),
			 head->error_text ?
			 errdetail("Topic \"%s\", aggregate %s/%s: %s.", head->topic,
					   head->aggregate_type, head->aggregate_id, head->error_text) :
			 errdetail("Kafka refused it with %s (aggregate %s/%s, topic \"%s\").",
					   OutboxDeliveryErrorText(head->last_err, head->last_err_local),
					   head->aggregate_type,
					   head->aggregate_id, head->topic),
			 errhint("outbox.replay('%s') publishes it again; outbox.discard('%s') drops it.",
					 head->event_id, head->event_id)));
	if (!pg->replay && find_blocked(r, head) == NULL)
		block_aggregate(r, head);
	if (outbox_poison_policy != OUTBOX_POISON_BLOCK)
		return;
	for (j = i + 1; j < pg->n; j++)
		if (pg->events[j].disposition == OUTBOX_EVENT_PENDING &&
			same_aggregate(&pg->events[j], head))
		{
			pg->events[j].disposition = OUTBOX_EVENT_PARKED;
			pg->events[j].blocked_by = head->event_id;
		}
}

/*
 * OutboxRelayPreparePage
 *		Before a page's first round: the topics' partition counts taken
 *		again, a batch page's events of blocked aggregates parked, and the
 *		Avro topics' events encoded, in id order, one that does not fit its
 *		schema quarantined (its later events park behind it).  False when
 *		an Avro topic has no schema now: the page waits.
 */
bool
OutboxRelayPreparePage(Relay *r, RelayPage *pg)
{
	char		err[OUTBOX_REGISTRY_ERROR_LEN];
	bool		may_ask = true; /* one refresh from the registry a page */
	OutboxRoundReport report;
	int			i;

	/* counts change between pages only (kafka_topic.c) */
	OutboxProducerRecountTopics(r->producer);
	if (!pg->replay)
		OutboxRelayParkBlocked(r, pg);
	OutboxRelayReportInit(&report);
	for (i = 0; i < pg->n && !ShutdownRequestPending; i++)
	{
		OutboxEvent *ev = &pg->events[i];
		RelayAvro	result;

		if (ev->disposition != OUTBOX_EVENT_PENDING)
			continue;
		result = OutboxRelayEncodeAvro(r, pg->cxt, ev, &may_ask, err, sizeof(err));
		if (result == RELAY_AVRO_UNAVAILABLE)
			break;
		if (result != RELAY_AVRO_UNFIT)
			continue;
		ev->error_text = MemoryContextStrdup(pg->cxt, err);
		ev->last_class = OUTBOX_ERROR_SCHEMA;
		ev->attempts = 1;
		ev->first_failed_at = ev->last_failed_at = GetCurrentTimestamp();
		report.failures[OUTBOX_ERROR_SCHEMA]++;
		quarantine(r, pg, i);
	}
	if (report.failures[OUTBOX_ERROR_SCHEMA] > 0)
		OutboxSlotReportRound(r->slot, &report);
	return i == pg->n;
}

/* librdkafka refused the event at once, without a delivery report */
static bool
refused_now(const OutboxEvent *ev)
{
	return ev->delivery_err != OUTBOX_DELIVERY_PENDING && ev->delivery_err != 0;
}

/*
 * held_back
 *		Whether events[i] must wait this round: an earlier event of its
 *		aggregate in the page was refused (in an earlier round, or just now
 *		by librdkafka itself) and is being retried, so sending this one now
 *		would put it ahead.
 */
static bool
held_back(OutboxEvent *events, int i, bool any_refused)
{
	int			j;

	if (!any_refused)
		return false;
	for (j = 0; j < i; j++)
		if (events[j].disposition == OUTBOX_EVENT_PENDING &&
			(events[j].attempts > 0 || refused_now(&events[j])) &&
			same_aggregate(&events[j], &events[i]))
			return true;
	return false;
}

/*
 * OutboxRelayPagePending
 *		Whether an event of the page is neither delivered, quarantined nor
 *		parked.
 */
bool
OutboxRelayPagePending(const RelayPage *pg)
{
	int			i;

	for (i = 0; i < pg->n; i++)
		if (pg->events[i].disposition == OUTBOX_EVENT_PENDING)
			return true;
	return false;
}

/*
 * OutboxRelaySendRound
 *		Hand librdkafka every event of pg still pending, in id order, except
 *		those held back behind a refused one of their aggregate.  Sets
 *		pg->sent (how many went out), pg->retried (of those, sent before)
 *		and pg->cut (shutdown stopped the round).  The relay has a producer.
 */
void
OutboxRelaySendRound(Relay *r, RelayPage *pg)
{
	OutboxEvent *events = pg->events;
	int			i;
	bool		any_refused = false;

	pg->sent = pg->retried = 0;
	pg->cut = false;
	for (i = 0; i < pg->n; i++)
		if (events[i].disposition == OUTBOX_EVENT_PENDING && events[i].attempts > 0)
			any_refused = true;

	/* a resend after a failure is still part of backing off */
	if (r->backoff_ms == 0)
		OutboxRelaySetState(r, OUTBOX_RELAY_PUBLISHING);
	for (i = 0; i < pg->n; i++)
	{
		/*
		 * A new topic may cost librdkafka a bounded metadata round trip:
		 * between events, look whether the relay must stop, so that a page
		 * of many topics does not outlast outbox.shutdown_timeout.
		 */
		if (ShutdownRequestPending)
		{
			pg->cut = true;
			break;
		}
		if (events[i].disposition != OUTBOX_EVENT_PENDING)
			continue;
		/* before anything holds it back: the page's events share one count */
		OutboxRelayPartition(r, &events[i]);
		if (held_back(events, i, any_refused))
			continue;
		switch (OutboxRelayHoldOrSend(r, pg, &events[i]))
		{
			case RELAY_EVENT_HOLD:
			case RELAY_EVENT_WAIT:
				continue;
			case RELAY_EVENT_SEND:
				break;
		}
		OutboxProducerSend(r->producer, &events[i]);
		pg->sent++;
		if (events[i].first_failed_at != 0)
			pg->retried++;
		if (refused_now(&events[i]))
			any_refused = true;
	}
	pg->rounds++;

	/*
	 * The last page of a batch, short of a full page: the relay has caught
	 * up, and the page is all it has to send.  Waiting out linger.ms would
	 * only delay it.  (Under exactly_once, the commit sends it.)
	 */
	if (pg->sent > 0 && pg->done && !pg->replay && pg->drain == NULL &&
		pg->n < outbox_batch_size && !RELAY_TRANSACTIONAL(r))
		OutboxProducerSendNow(r->producer);
}

/*
 * OutboxRelayWatchRound
 *		The round under way still has pending messages: withdraw it whole
 *		once outbox.delivery_timeout passed or librdkafka failed its Kafka
 *		transaction, or say that it is late.
 */
void
OutboxRelayWatchRound(Relay *r, int pending)
{
	TimestampTz now = GetCurrentTimestamp();
	char		detail[128];

	/*
	 * The round's deadline is the relay's, not librdkafka's: a message
	 * timeout could fail part of a partition's queue and let the rest
	 * through, out of order.  Purging fails everything not yet
	 * acknowledged at once, and the resend goes out in id order.
	 */
	if (now >= r->round_give_up)
	{
		snprintf(detail, sizeof(detail),
				 "outbox.delivery_timeout (%d ms) passed with %d brokers up",
				 outbox_delivery_timeout, OutboxProducerBrokersUp(r->producer));
		OutboxRelayNoteError(r, "Kafka did not acknowledge in time, resending", detail);
		OutboxProducerPurge(r->producer);
		r->round_give_up = PG_INT64_MAX;
	}
	else if (r->txn_open && RELAY_TRANSACTIONAL(r) && OutboxProducerTxnFailed(r->producer))
	{
		/*
		 * exactly_once: librdkafka failed the transaction, and may hold what
		 * it has not acknowledged until the abort (a partition drained for
		 * an epoch bump): abort now, which serves every report of the round
		 * (relay_txn.c); the page goes again after it settles.
		 */
		OutboxRelayTxnAbortNow(r);
	}
	else if (TimestampDifferenceExceeds(r->last_stall_report, now, RELAY_STALL_REPORT_MS) &&
			 TimestampDifferenceExceeds(r->round_started, now, RELAY_STALL_REPORT_MS))
	{
		/*
		 * librdkafka retries an outage quietly; say that acknowledgements
		 * are overdue well before the round is given up.
		 */
		snprintf(detail, sizeof(detail), "%d messages unacknowledged for %ld ms, %d brokers up",
				 pending, (long) TimestampDifferenceMilliseconds(r->round_started, now),
				 OutboxProducerBrokersUp(r->producer));
		OutboxRelayNoteError(r, "waiting for Kafka", detail);
		r->last_stall_report = now;
	}
}

/*
 * OutboxRelaySettleRound
 *		Every delivery report of pg's round is in: apply them, in id order.
 *		Delivered events are tallied; a failure leaves its event pending for
 *		the next round, a permanent one counting towards outbox.max_attempts
 *		and quarantining the event when they are used up; a fatal one has
 *		the producer rebuilt (Relay.fatal_reason).  The round's figures go to
 *		shared memory at once: the batch's delivered events leave the
 *		backlog now, not when the page is recorded.  Returns whether every
 *		report of the round was a success.
 */
bool
OutboxRelaySettleRound(Relay *r, RelayPage *pg)
{
	OutboxRoundReport report;
	TimestampTz acked_at = GetCurrentTimestamp();
	OutboxEvent *first = NULL;
	int			failed = 0;
	bool		fatal = false;
	int			i;
	char		detail[200];

	OutboxRelayReportInit(&report);
	OutboxRelayTakeProducerErrors(r, &report);
	report.brokers_up = OutboxProducerBrokersUp(r->producer);
	report.retries = pg->retried;
	/* replays and held events are not part of the batch, so not of its backlog */
	report.batch_events = !pg->replay && pg->drain == NULL;
	for (i = 0; i < pg->n; i++)
	{
		OutboxEvent *ev = &pg->events[i];

		if (ev->disposition != OUTBOX_EVENT_PENDING ||
			ev->delivery_err == OUTBOX_DELIVERY_PENDING)
			continue;
		if (ev->delivery_err == 0)
		{
			ev->disposition = OUTBOX_EVENT_DELIVERED;
			/* a replay's age is no publish latency */
			OutboxTallyAdd(&report.delivered,
						   pg->replay ? -1 : acked_at - ev->created_at,
						   ev->payload_len);
			continue;
		}
		if (failed++ == 0)
			first = ev;
		ev->delivery_err = OUTBOX_DELIVERY_PENDING;
		report.failures[ev->last_class]++;
		if (ev->last_class == OUTBOX_ERROR_FATAL)
			fatal = true;
		else if (ev->last_class == OUTBOX_ERROR_PERMANENT &&
				 ++ev->attempts >= outbox_max_attempts)
			quarantine(r, pg, i);
	}
	OutboxSlotReportRound(r->slot, &report);
	if (report.delivered.events > 0)
		r->last_ack_at = acked_at;
	if (failed == 0)
		return true;

	snprintf(detail, sizeof(detail), "%d of %d events failed, first with %s (%s); %d brokers up",
			 failed, pg->sent, OutboxDeliveryErrorName(first->last_err),
			 OutboxErrorClassName(first->last_class),
			 OutboxProducerBrokersUp(r->producer));
	OutboxRelayReportError(r, "could not publish events, retrying", detail);
	if (fatal)
		r->fatal_reason = OutboxDeliveryErrorName(first->last_err);
	return false;
}
