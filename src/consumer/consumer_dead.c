/*-------------------------------------------------------------------------
 *
 * consumer/consumer_dead.c
 *		The subscription worker's dead letters and parked keys: a message
 *		that failed max_attempts times goes to outbox.inbox_dead_letters,
 *		and under the block policy the later messages of its topic and key
 *		are parked there behind it.
 *
 * Invariants:
 *	- Dead letters belong to the consumer group, like its offsets: a
 *	  row is keyed by group, topic, partition and offset, and inserting
 *	  one twice keeps the first.
 *	- A parked message names the dead letter it waits behind
 *	  (blocked_by), the oldest of its key; replaying or discarding that
 *	  one lets the parked ones follow in id order (consumer_replay.c).
 *	- The parked keys are read again in every transaction that may see a
 *	  partition another worker of the group had: on assignment, and in a
 *	  batch whose stored offset moved since this worker last knew it.
 *	  They are read with a snapshot of their own, taken then.
 *	- A key is kept as two independent 64-bit hashes of topic and key, so
 *	  any length fits a fixed hash key.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "common/hashfn.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

#include "consumer/consumer_worker.h"
#include "base/base.h"
#include "kafka/kafka.h"

/*
 * OutboxSubscriberParkedTag
 *		The hash key of topic/key (OUTBOX_PARKED_TAG_LEN bytes at tag): two
 *		independent 64-bit hashes of both.
 */
void
OutboxSubscriberParkedTag(const char *topic, const char *key, char *tag)
{
	StringInfoData buf;
	uint64		h[2];

	initStringInfo(&buf);
	appendStringInfoString(&buf, topic);
	appendStringInfoChar(&buf, '\0');
	appendStringInfoString(&buf, key);
	h[0] = hash_bytes_extended((const unsigned char *) buf.data, buf.len, 0);
	h[1] = hash_bytes_extended((const unsigned char *) buf.data, buf.len, 0x9e3779b97f4a7c15);
	memcpy(tag, h, sizeof(h));
	pfree(buf.data);
}

/*
 * OutboxSubscriberParkedTable
 *		An empty table of ParkedKey entries, keyed by their tag, in cxt;
 *		the caller destroys it.
 */
HTAB *
OutboxSubscriberParkedTable(const char *name, MemoryContext cxt)
{
	HASHCTL		ctl;

	memset(&ctl, 0, sizeof(ctl));
	ctl.keysize = OUTBOX_PARKED_TAG_LEN;
	ctl.entrysize = sizeof(ParkedKey);
	ctl.hcxt = cxt;
	return hash_create(name, 64, &ctl, HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
}

/*
 * OutboxSubscriberParkedHead
 *		Under the block policy, the parked key m's topic and key has, or
 *		NULL: m must then be parked behind its head.
 */
ParkedKey *
OutboxSubscriberParkedHead(Worker *w, const OutboxInbound *m)
{
	char		tag[OUTBOX_PARKED_TAG_LEN];

	if (!w->sub.block || m->key == NULL || !OutboxSubscriberIsText(m->key, m->key_len) ||
		hash_get_num_entries(w->parked) == 0)
		return NULL;
	OutboxSubscriberParkedTag(m->topic, m->key, tag);
	return (ParkedKey *) hash_search(w->parked, tag, HASH_FIND, NULL);
}

/*
 * OutboxSubscriberParkKey
 *		Park topic/key behind the dead letter head, unless it is parked
 *		already (behind an older one).
 */
void
OutboxSubscriberParkKey(Worker *w, const char *topic, const char *key, int64 head)
{
	char		tag[OUTBOX_PARKED_TAG_LEN];
	ParkedKey  *pk;
	bool		found;

	OutboxSubscriberParkedTag(topic, key, tag);
	pk = (ParkedKey *) hash_search(w->parked, tag, HASH_ENTER, &found);
	if (!found)
		pk->head = head;
}

/*
 * OutboxSubscriberLoadParked
 *		Read again the keys with dead letters, parked behind them under the
 *		block policy (inside SPI); none under the skip policy.
 */
void
OutboxSubscriberLoadParked(Worker *w)
{
	uint64		i;

	if (w->parked != NULL)
		hash_destroy(w->parked);
	w->parked = OutboxSubscriberParkedTable("outbox parked keys", w->cxt);
	if (!w->sub.block)
		return;

	/*
	 * Not read-only: a snapshot of its own, taken now.  A batch calls this
	 * after waiting for a partition's row, and must see the dead letters
	 * the worker it waited for committed.
	 */
	OutboxSpiExecText("SELECT d.topic, d.key, pg_catalog.min(d.id) FROM outbox.inbox_dead_letters d"
					  " WHERE d.consumer_group OPERATOR(pg_catalog.=) $1 AND d.key IS NOT NULL"
					  " GROUP BY d.topic, d.key",
					  w->sub.group_id, false, 0, SPI_OK_SELECT, "reading the parked keys");
	for (i = 0; i < SPI_processed; i++)
	{
		bool		isnull;
		HeapTuple	t = SPI_tuptable->vals[i];
		char	   *topic = TextDatumGetCString(SPI_getbinval(t, SPI_tuptable->tupdesc, 1, &isnull));
		char	   *key = TextDatumGetCString(SPI_getbinval(t, SPI_tuptable->tupdesc, 2, &isnull));

		OutboxSubscriberParkKey(w, topic, key,
								DatumGetInt64(SPI_getbinval(t, SPI_tuptable->tupdesc, 3, &isnull)));
	}
}

/*
 * OutboxSubscriberDeadLetter
 *		Insert m into outbox.inbox_dead_letters as state (dead or parked),
 *		blocked_by its key's head (0: none), with f's error when given;
 *		inside SPI.  Returns the row's id (0 when it was there already).
 */
int64
OutboxSubscriberDeadLetter(Worker *w, const OutboxInbound *m, const char *state,
						   int64 blocked_by, int attempts, const Failure *f)
{
	Datum		message = OutboxSubscriberKeptMessage(w, m);
	Datum		args[14];
	char		nulls[14];
	bool		isnull;

	memset(nulls, ' ', sizeof(nulls));
	args[0] = CStringGetTextDatum(w->sub.group_id);
	args[13] = CStringGetTextDatum(w->sub.name);
	args[1] = CStringGetTextDatum(m->topic);
	args[2] = Int32GetDatum(m->partition);
	args[3] = Int64GetDatum(m->offset);
	if (m->key != NULL && OutboxSubscriberIsText(m->key, m->key_len))
		args[4] = CStringGetTextDatum(m->key);
	else
		nulls[4] = 'n';
	args[5] = OutboxSubscriberMessageAttr(w, message, OUTBOX_MESSAGE_EVENT_ID, &isnull);
	if (isnull)
		nulls[5] = 'n';
	args[6] = CStringGetTextDatum(state);
	args[7] = Int64GetDatum(blocked_by);
	if (blocked_by <= 0)
		nulls[7] = 'n';
	args[8] = Int32GetDatum(attempts);
	args[9] = f ? CStringGetTextDatum(f->message) : (Datum) 0;
	args[10] = f ? CStringGetTextDatum(f->sqlstate) : (Datum) 0;
	if (f == NULL)
		nulls[9] = nulls[10] = 'n';
	args[11] = message;
	args[12] = TimestampTzGetDatum(GetCurrentTimestamp());
	OutboxSubscriberRunPlan(w, PLAN_DEAD, args, nulls, 0);
	if (SPI_processed == 0)
		return 0;
	/* the id of the row just inserted */
	if (SPI_execute("SELECT pg_catalog.currval('outbox.inbox_dead_letters_id_seq')", false, 1) != SPI_OK_SELECT)
		elog(ERROR, "reading the dead letter's id failed");
	return DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
}
