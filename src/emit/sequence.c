/*-------------------------------------------------------------------------
 *
 * emit/sequence.c
 *		The per-aggregate sequence (outbox.aggregate_sequence): the
 *		transaction's table of aggregates it numbers, and the callbacks that
 *		keep it true across subtransactions, commit and prepare.
 *
 * Invariants:
 *	- seq is gapless and in commit order per aggregate.  The transaction's
 *	  first event of an aggregate takes its seq from the aggregate's
 *	  counter row in outbox.aggregates, which emit_counter.c updates
 *	  before emit_direct.c inserts the event, so the row is locked before
 *	  the event row's id is drawn.  Emitters of one aggregate therefore
 *	  queue on that row lock, and for one aggregate id order, seq order and
 *	  commit order are the same.
 *	- That is a plain UPDATE; only when it finds no row (the aggregate's
 *	  first event ever, or one whose first emitter has not committed) does
 *	  OutboxSequenceCreate upsert it.  An upsert that finds the row locks
 *	  it with a WAL record of its own before it updates it, where the
 *	  UPDATE writes only the new version.
 *	- No number is consumed by a rolled-back (sub)transaction.  A
 *	  transaction that rolls back rolls its upsert back and drops this
 *	  table with TopTransactionContext; a subtransaction that rolls back
 *	  restores the seq of every entry it advanced and forgets every entry
 *	  it created, since its upsert and the lock went with it (seq_undo).
 *	- Later emits of an aggregate in the same transaction take their seq
 *	  from this backend-local table, not from the row: updating one row
 *	  again and again walks its growing chain of versions, which made a
 *	  run of emits quadratic.  The table always says what the row would
 *	  hold had every emit updated it, and the row gets the table's final
 *	  value once, just before commit or prepare (seq_flush), while the
 *	  transaction can still fail.
 *	- Nothing here outlives its transaction: the table and the undo log
 *	  live in TopTransactionContext, and the pointers to them are reset at
 *	  commit, prepare and abort.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "common/hashfn.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/hsearch.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"

#include "base/base.h"
#include "emit/emit.h"

/*
 * The aggregate's first event ever, or one whose first emitter has not
 * committed: insert its counter row, or wait for that emitter and add one.
 */
static const char *create_sql =
"INSERT INTO outbox.aggregates AS a (aggregate_type, aggregate_id, last_seq)"
" VALUES ($1, $2, 1)"
" ON CONFLICT (aggregate_type, aggregate_id)"
" DO UPDATE SET last_seq = a.last_seq OPERATOR(pg_catalog.+) 1"
" RETURNING a.last_seq";

/* at commit or prepare: the counter row's final value, written once */
static const char *flush_sql =
"UPDATE outbox.aggregates SET last_seq = $3"
" WHERE aggregate_type OPERATOR(pg_catalog.=) $1"
" AND aggregate_id OPERATOR(pg_catalog.=) $2";

static SPIPlanPtr create_plan = NULL;
static SPIPlanPtr flush_plan = NULL;

/*
 * The aggregates this transaction has locked the counter row of, with the
 * last seq given out and the value the row holds.
 */
typedef struct SeqKey
{
	const char *type;
	const char *id;
	int			type_len;
	int			id_len;
} SeqKey;

struct OutboxSequenceEntry
{
	SeqKey		key;			/* strings copied into the table's context */
	int64		seq;			/* last seq given out */
	int64		written;		/* what the counter row holds */
};

typedef struct OutboxSequenceEntry SeqEntry;

/*
 * What a subtransaction changed in the table, newest last: an entry it
 * created (prev_seq < 0) or the seq an entry had before one of its emits.
 * Only emits inside a subtransaction leave a record; the top transaction's
 * abort drops the whole table.  A committed subtransaction's records pass
 * to its parent.
 */
typedef struct SeqUndo
{
	SeqEntry   *entry;
	SubTransactionId subid;
	int64		prev_seq;
} SeqUndo;

static HTAB *seq_table = NULL;
static SeqUndo *seq_undo = NULL;
static int	seq_undo_len = 0;
static int	seq_undo_cap = 0;
static Oid	seq_owner = InvalidOid; /* the user emit() ran as */

static void seq_xact_callback(XactEvent event, void *arg);
static void seq_subxact_callback(SubXactEvent event, SubTransactionId mySubid,
								 SubTransactionId parentSubid, void *arg);

/*
 * OutboxSequenceInit
 *		Register the transaction callbacks, once per backend.
 */
void
OutboxSequenceInit(void)
{
	RegisterXactCallback(seq_xact_callback, NULL);
	RegisterSubXactCallback(seq_subxact_callback, NULL);
}

static uint32
seq_key_hash(const void *key, Size keysize)
{
	const SeqKey *k = (const SeqKey *) key;

	return hash_combine(hash_bytes((const unsigned char *) k->type, k->type_len),
						hash_bytes((const unsigned char *) k->id, k->id_len));
}

static int
seq_key_match(const void *key1, const void *key2, Size keysize)
{
	const SeqKey *a = (const SeqKey *) key1;
	const SeqKey *b = (const SeqKey *) key2;

	if (a->type_len != b->type_len || a->id_len != b->id_len ||
		memcmp(a->type, b->type, a->type_len) != 0 ||
		memcmp(a->id, b->id, a->id_len) != 0)
		return 1;
	return 0;
}

/* a key pointing into the caller's texts, for a lookup or a new entry */
static void
seq_key_init(SeqKey *key, text *aggregate_type, text *aggregate_id)
{
	key->type = VARDATA_ANY(aggregate_type);
	key->type_len = VARSIZE_ANY_EXHDR(aggregate_type);
	key->id = VARDATA_ANY(aggregate_id);
	key->id_len = VARSIZE_ANY_EXHDR(aggregate_id);
}

/* the transaction is over: its table went with TopTransactionContext */
static void
seq_forget(void)
{
	seq_table = NULL;
	seq_undo = NULL;
	seq_undo_len = seq_undo_cap = 0;
}

/*
 * OutboxSequenceHeld
 *		The table's entry for this aggregate, or NULL when this transaction
 *		has not locked its counter row.
 */
OutboxSequenceEntry *
OutboxSequenceHeld(text *aggregate_type, text *aggregate_id)
{
	SeqKey		key;

	if (seq_table == NULL)
		return NULL;
	seq_key_init(&key, aggregate_type, aggregate_id);
	return (SeqEntry *) hash_search(seq_table, &key, HASH_FIND, NULL);
}

/*
 * OutboxSequenceNext
 *		The seq the next event of a held aggregate gets: this transaction
 *		holds the row lock, so the next number is its own.
 */
int64
OutboxSequenceNext(const OutboxSequenceEntry *entry)
{
	return entry->seq + 1;
}

/*
 * seq_reserve_undo, seq_note_undo
 *		Remember, inside a subtransaction, what to restore if it aborts.
 *		Room is made before anything changes, so a failure there leaves the
 *		table as it was.
 */
static void
seq_reserve_undo(void)
{
	if (GetCurrentTransactionNestLevel() <= 1 || seq_undo_len < seq_undo_cap)
		return;
	if (seq_undo == NULL)
	{
		seq_undo_cap = 64;
		seq_undo = MemoryContextAlloc(TopTransactionContext,
									  sizeof(SeqUndo) * seq_undo_cap);
	}
	else
	{
		seq_undo_cap *= 2;
		seq_undo = repalloc_huge(seq_undo, sizeof(SeqUndo) * seq_undo_cap);
	}
}

static void
seq_note_undo(SeqEntry *entry, int64 prev_seq)
{
	if (GetCurrentTransactionNestLevel() <= 1)
		return;
	Assert(seq_undo_len < seq_undo_cap);
	seq_undo[seq_undo_len].entry = entry;
	seq_undo[seq_undo_len].subid = GetCurrentSubTransactionId();
	seq_undo[seq_undo_len].prev_seq = prev_seq;
	seq_undo_len++;
}

/*
 * OutboxSequenceGiven
 *		A held aggregate's event was inserted with seq (OutboxSequenceNext).
 */
void
OutboxSequenceGiven(OutboxSequenceEntry *entry, int64 seq)
{
	seq_reserve_undo();
	seq_note_undo(entry, entry->seq);
	entry->seq = seq;
}

/*
 * OutboxSequenceEnter
 *		Enter an aggregate whose counter row this (sub)transaction has just
 *		updated and locked, with the seq the row now holds.
 */
void
OutboxSequenceEnter(text *aggregate_type, text *aggregate_id, int64 seq)
{
	SeqKey		key;
	SeqEntry   *entry;
	bool		found;

	if (seq_table == NULL)
	{
		HASHCTL		ctl;

		ctl.keysize = sizeof(SeqKey);
		ctl.entrysize = sizeof(SeqEntry);
		ctl.hash = seq_key_hash;
		ctl.match = seq_key_match;
		ctl.hcxt = TopTransactionContext;
		seq_table = hash_create("outbox aggregate sequences", 64, &ctl,
								HASH_ELEM | HASH_FUNCTION | HASH_COMPARE |
								HASH_CONTEXT);
	}
	seq_reserve_undo();
	seq_key_init(&key, aggregate_type, aggregate_id);
	entry = (SeqEntry *) hash_search(seq_table, &key, HASH_ENTER, &found);
	Assert(!found);
	entry->key.type = MemoryContextAlloc(TopTransactionContext, key.type_len + 1);
	memcpy((char *) entry->key.type, key.type, key.type_len);
	entry->key.id = MemoryContextAlloc(TopTransactionContext, key.id_len + 1);
	memcpy((char *) entry->key.id, key.id, key.id_len);
	entry->seq = entry->written = seq;
	seq_owner = GetUserId();
	seq_note_undo(entry, -1);
}

/*
 * OutboxSequenceCreate
 *		The seq of an aggregate's event when emit_counter.c's update found
 *		no counter row: make the row, which locks it until the transaction
 *		ends, and enter the aggregate in the table.  The caller is
 *		connected to SPI, as a user that may write outbox.aggregates.
 */
int64
OutboxSequenceCreate(text *aggregate_type, text *aggregate_id)
{
	Datum		values[2];
	int			rc;
	bool		isnull;
	int64		seq;
	int			level;

	level = OutboxPinSearchPath();
	if (create_plan == NULL)
	{
		Oid			argtypes[2] = {TEXTOID, TEXTOID};

		create_plan = OutboxSpiPrepare(create_sql, 2, argtypes,
									   "the counter upsert");
	}
	values[0] = PointerGetDatum(aggregate_type);
	values[1] = PointerGetDatum(aggregate_id);
	rc = SPI_execute_plan(create_plan, values, NULL, false, 0);
	if (rc != SPI_OK_INSERT_RETURNING || SPI_processed != 1)
		elog(ERROR, "outbox counter upsert returned %s with %llu rows",
			 SPI_result_code_string(rc), (unsigned long long) SPI_processed);
	OutboxUnpinSearchPath(level);
	seq = DatumGetInt64(OutboxSpiValue(1, &isnull));
	OutboxSequenceEnter(aggregate_type, aggregate_id, seq);
	return seq;
}

static void
seq_subxact_callback(SubXactEvent event, SubTransactionId mySubid,
					 SubTransactionId parentSubid, void *arg)
{
	int			i;

	switch (event)
	{
		case SUBXACT_EVENT_COMMIT_SUB:
			/* the parent now answers for what this one did */
			for (i = seq_undo_len - 1; i >= 0 && seq_undo[i].subid == mySubid; i--)
				seq_undo[i].subid = parentSubid;
			break;
		case SUBXACT_EVENT_ABORT_SUB:
			/* its children were settled first: its records are the newest */
			while (seq_undo_len > 0 && seq_undo[seq_undo_len - 1].subid == mySubid)
			{
				SeqUndo    *u = &seq_undo[--seq_undo_len];

				if (u->prev_seq >= 0)
					u->entry->seq = u->prev_seq;
				else
					(void) hash_search(seq_table, &u->entry->key, HASH_REMOVE, NULL);
			}
			break;
		default:
			break;
	}
}

/* the counter update, prepared once per backend */
static SPIPlanPtr
seq_flush_plan(void)
{
	if (flush_plan == NULL)
	{
		Oid			argtypes[3] = {TEXTOID, TEXTOID, INT8OID};

		flush_plan = OutboxSpiPrepare(flush_sql, 3, argtypes,
									  "the counter update");
	}
	return flush_plan;
}

/*
 * seq_flush
 *		Write each counter row whose aggregate got more than its first emit
 *		in this transaction, once, as the user emit() ran as (the caller
 *		may have no right on the table).  Runs before commit or prepare,
 *		while the transaction can still fail.
 */
static void
seq_flush(void)
{
	HASH_SEQ_STATUS status;
	SeqEntry   *entry;
	Oid			save_userid;
	int			save_sec_context;
	bool		connected = false;
	int			level = 0;

	if (seq_table == NULL)
		return;
	GetUserIdAndSecContext(&save_userid, &save_sec_context);
	hash_seq_init(&status, seq_table);
	while ((entry = (SeqEntry *) hash_seq_search(&status)) != NULL)
	{
		Datum		values[3];
		int			rc;

		if (entry->seq == entry->written)
			continue;
		if (!connected)
		{
			SetUserIdAndSecContext(seq_owner, save_sec_context |
								   SECURITY_LOCAL_USERID_CHANGE |
								   SECURITY_RESTRICTED_OPERATION);
			level = OutboxPinSearchPath();
			/* portals are closed by now: the update needs its own snapshot */
			PushActiveSnapshot(GetTransactionSnapshot());
			if (SPI_connect() != SPI_OK_CONNECT)
				elog(ERROR, "SPI_connect failed");
			connected = true;
		}
		values[0] = PointerGetDatum(cstring_to_text_with_len(entry->key.type,
															 entry->key.type_len));
		values[1] = PointerGetDatum(cstring_to_text_with_len(entry->key.id,
															 entry->key.id_len));
		values[2] = Int64GetDatum(entry->seq);
		rc = SPI_execute_plan(seq_flush_plan(), values, NULL, false, 0);
		if (rc != SPI_OK_UPDATE || SPI_processed != 1)
			elog(ERROR, "outbox counter update returned %s with %llu rows",
				 SPI_result_code_string(rc), (unsigned long long) SPI_processed);
		entry->written = entry->seq;
	}
	if (connected)
	{
		SPI_finish();
		PopActiveSnapshot();
		OutboxUnpinSearchPath(level);
		SetUserIdAndSecContext(save_userid, save_sec_context);
	}
}

static void
seq_xact_callback(XactEvent event, void *arg)
{
	switch (event)
	{
		case XACT_EVENT_PRE_COMMIT:
		case XACT_EVENT_PRE_PREPARE:
			seq_flush();
			break;
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_PARALLEL_COMMIT:
		case XACT_EVENT_PREPARE:
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PARALLEL_ABORT:
			seq_forget();
			break;
		default:
			break;
	}
}
