/*-------------------------------------------------------------------------
 *
 * relay/relay_producer.c
 *		The relay's producer: built, rebuilt after a reload changed its
 *		settings or a fatal error, closed after outbox.kafka_idle_timeout
 *		with nothing to publish, served, and its figures reported.
 *
 * Invariants:
 *	- The producer is built, and rebuilt, in one place
 *	  (OutboxRelayEnsureProducer), and replaced in one
 *	  (OutboxRelaySetProducer), which forgets the holds' probes of the one
 *	  it destroys: they will never report.
 *	- Every producer writes to the relay's one event pipe, so the relay's
 *	  wait set (relay.c) stays as it is when the producer is replaced.
 *	- Delivery reports arrive in one place, OutboxRelayServeProducer,
 *	  which then tells the holds' probes (relay_hold.c) what they learnt.
 *	- An idle relay closes its producer (not while partitions are held:
 *	  their probes need it) and hands back the memory the drains left
 *	  mapped (release_idle_memory); the next page to send opens it again.
 *
 * No SQL here (store_batch.c) and no librdkafka call (producer.c).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "storage/bufmgr.h"
#include "utils/timestamp.h"

#include "base/compat.h"
#include "relay/relay_state.h"
#include "base/base.h"
#include "shmem/shmem.h"
#include "kafka/kafka.h"

/*
 * OutboxRelayTakeProducerErrors
 *		Report what the producer's error callbacks recorded; its refused
 *		logins and TLS handshakes join report's fatal failures (librdkafka
 *		retries them itself).
 */
void
OutboxRelayTakeProducerErrors(Relay *r, OutboxRoundReport *report)
{
	char		buf[256];
	int			count;
	int			fatal;

	if (r->producer != NULL &&
		OutboxProducerTakeError(r->producer, buf, sizeof(buf), &count, &fatal))
	{
		OutboxRelayReportError(r, "Kafka client error", buf);
		report->failures[OUTBOX_ERROR_FATAL] += fatal;
	}
}

/*
 * OutboxRelayReportProducer
 *		status(): the producer's errors and the brokers it reaches.  The
 *		relay has a producer.
 */
void
OutboxRelayReportProducer(Relay *r)
{
	OutboxRoundReport report;

	OutboxRelayReportInit(&report);
	OutboxRelayTakeProducerErrors(r, &report);
	report.brokers_up = OutboxProducerBrokersUp(r->producer);
	OutboxSlotReportRound(r->slot, &report);
}

/*
 * OutboxRelaySetProducer
 *		Replace the relay's producer (NULL: none).  The wait set stays: every
 *		producer writes to the relay's one event pipe.
 */
void
OutboxRelaySetProducer(Relay *r, OutboxProducer *producer)
{
	if (r->producer != NULL)
	{
		OutboxProducerDestroy(r->producer);
		OutboxRelayForgetProbes(r);
	}
	r->producer = producer;
}

/* two transactional ids (NULL: none) are the same */
static bool
same_id(const char *a, const char *b)
{
	return (a == NULL && b == NULL) || (a != NULL && b != NULL && strcmp(a, b) == 0);
}

/*
 * still_fenced
 *		A fenced relay stays so until a setting it was fenced under changes:
 *		outbox.delivery, the transactional id's suffix, or the Kafka settings
 *		its producer was built from.
 */
static bool
still_fenced(Relay *r, const char *txn_id)
{
	return txn_id != NULL && r->producer != NULL &&
		same_id(OutboxProducerTransactionalId(r->producer), txn_id) &&
		!OutboxProducerOutdated(r->producer);
}

/*
 * OutboxRelayEnsureProducer
 *		Have a producer for the current settings, rebuilding it after a
 *		reload changed them or a fatal error.  False when none can be built
 *		now (the caller backs off).
 */
bool
OutboxRelayEnsureProducer(Relay *r)
{
	char	   *message = NULL;
	char		fatal[256];
	OutboxProducer *producer;
	const char *txn_id = OutboxRelayTxnIdWanted(r);

	if (r->fenced && !still_fenced(r, txn_id))
	{
		ereport(LOG,
				(errmsg("outbox relay for database \"%s\": settings changed, no longer fenced",
						r->dbname)));
		r->fenced = false;
	}
	if (r->fenced)
	{
		/* kept, failed, as the memo of what it was fenced under */
		OutboxRelaySetState(r, OUTBOX_RELAY_FENCED);
		return false;
	}
	/* a fenced producer is never rebuilt: that would fence the new owner */
	if (r->producer != NULL && OutboxProducerFenced(r->producer))
	{
		OutboxRelayTxnFence(r, "the producer's transactional.id was taken by a newer producer");
		return false;
	}
	if (r->producer != NULL)
	{
		if (r->fatal_reason != NULL)
			OutboxRelayReportError(r, "Kafka producer failed fatally, rebuilding it",
								   r->fatal_reason);
		else if (OutboxProducerIsFatal(r->producer, fatal, sizeof(fatal)))
			OutboxRelayReportError(r, "Kafka producer failed fatally, rebuilding it",
								   fatal);
		else if (r->txn_open)
			/* new settings wait for the open transaction to end */
			return true;
		else if (OutboxProducerOutdated(r->producer) ||
				 !same_id(OutboxProducerTransactionalId(r->producer), txn_id))
			ereport(LOG,
					(errmsg("outbox relay: Kafka settings changed, rebuilding the producer")));
		else
			return txn_id == NULL || OutboxRelayTxnStart(r);
		OutboxRelaySetProducer(r, NULL);
	}
	r->fatal_reason = NULL;
	/*
	 * A producer that failed fatally in a transaction: a transactional one
	 * learns from the progress topic whether it committed (relay_txn.c);
	 * without one, the page goes out again.
	 */
	if (txn_id == NULL && r->page_in_txn && r->in_hand != NULL)
		OutboxRelayTxnRevert(r, r->in_hand);
	if (txn_id == NULL)
		r->txn_committing = false;
	r->marker_sent = false;
	r->txn_open = false;
	r->txn_inited = false;
	r->txn_ready = false;

	/* what building leaves behind is in the loop's context */
	producer = OutboxProducerCreate(r->event_pipe[1], txn_id, &message);
	if (producer == NULL)
	{
		OutboxRelayReportError(r, "could not create the Kafka producer", message);
		return false;
	}
	if (r->producer_closed)
		ereport(DEBUG1,
				(errmsg("outbox relay: events to publish, opening the Kafka producer again")));
	OutboxRelaySetProducer(r, producer);
	r->producer_closed = false;
	return txn_id == NULL || OutboxRelayTxnStart(r);
}

/*
 * release_idle_memory
 *		Idle past outbox.kafka_idle_timeout, hand back what the drains left
 *		in the relay: the freed memory malloc keeps for the next page
 *		(relay.c's RELAY_MALLOC_KEEP), and the relay's mapping of the shared
 *		buffers it read.  An idle relay's cost is its wake-ups, and on a
 *		virtual machine a wake-up costs more the more memory the process
 *		maps: after the benchmark's emit section, with 367 MB of shared
 *		buffers mapped, 1.7 to 2.0 ms a wake-up; 0.3 ms once they were
 *		unmapped, about as for a fresh relay (README, Benchmarks).  The
 *		buffers stay where they are; the next page read maps what it
 *		touches again, a minor fault a page.
 */
static void
release_idle_memory(Relay *r)
{
	int			err;

	OutboxMallocRelease();
	if (r->unmap_refused)
		return;
	err = OutboxUnmapRange(BufferBlocks, (Size) NBuffers * BLCKSZ);
	if (err != 0)
	{
		/* refused once, refused always: say it once, then stop asking */
		r->unmap_refused = true;
		if (err != ENOSYS)
			ereport(LOG,
					(errmsg("outbox relay: its mapping of shared buffers is kept while idle: %s",
							strerror(err)),
					 errdetail("madvise(MADV_DONTNEED) was refused; only the idle cost of each wake-up is affected.")));
	}
}

/*
 * OutboxRelayCloseIdleProducer
 *		After outbox.kafka_idle_timeout with nothing to publish, close the
 *		producer: even idle, an open one costs the wake-ups of librdkafka's
 *		threads, about one a second each (one per broker, one per bootstrap
 *		address, its main thread).  Not while partitions are held: their
 *		probes need it.  The next page to send opens it again (relay.c's
 *		SEND step).
 */
void
OutboxRelayCloseIdleProducer(Relay *r)
{
	OutboxRoundReport report;

	if (r->producer == NULL || outbox_kafka_idle_timeout <= 0 || r->holds != NIL ||
		!TimestampDifferenceExceeds(r->idle_since, GetCurrentTimestamp(),
									outbox_kafka_idle_timeout))
		return;
	ereport(DEBUG1,
			(errmsg("outbox relay: nothing to publish for %d ms, closing the Kafka producer",
					outbox_kafka_idle_timeout)));
	OutboxRelaySetProducer(r, NULL);
	r->producer_closed = true;
	release_idle_memory(r);
	/* status(): no producer, so no broker count */
	OutboxRelayReportInit(&report);
	report.brokers_up = -1;
	OutboxSlotReportRound(r->slot, &report);
}

/*
 * OutboxRelayServeProducer
 *		Serve the producer's callbacks, then what they told the holds'
 *		probes: the one place delivery reports arrive.  Returns how many
 *		page messages still await their report.  The relay has a producer.
 */
int
OutboxRelayServeProducer(Relay *r)
{
	int			pending = OutboxProducerServe(r->producer);

	if (r->holds != NIL)
		OutboxRelayServeProbes(r);
	return pending;
}
