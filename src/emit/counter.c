/*-------------------------------------------------------------------------
 *
 * emit/counter.c
 *		Where each aggregate's counter row in outbox.aggregates was last
 *		seen: the root of its HOT chain (block, offset) and the shared
 *		buffer that held the block.  emit_counter.c looks a counter row up
 *		here before it descends the primary key.
 *
 * A counter row is updated once per transaction and almost always stays on
 * its page (HOT), so its root line pointer stays put; the btree descent
 * that finds it again is a third of what the sequence costs an emit().
 * Remembering the root lets emit_counter.c pin the buffer with
 * ReadRecentBuffer() and walk the chain directly.
 *
 * Invariants:
 *	- A slot is a hint, never an answer.  It may be stale (the row was
 *	  moved, the page evicted, the line pointer reused by another row, the
 *	  table rewritten), lost to another key (the map is direct-mapped and
 *	  lossy), or torn (its two words written by different backends).  The
 *	  caller checks everything: ReadRecentBuffer() pins the buffer only if
 *	  it still holds that block of the table's current file, so no block
 *	  past the end is ever read; heap_hot_search_buffer() refuses a line
 *	  pointer that is not a chain's root; the row found must be visible
 *	  and carry the aggregate's key (emit_counter.c's counter_is).  Any
 *	  doubt sends the caller to the primary key, which is what it did
 *	  before.
 *	- A slot's words are atomics: a reader sees a value some writer wrote,
 *	  never half of one.  Buffers written are valid shared buffers, so a
 *	  torn pair still names a real buffer and a real block.
 *	- With the library preloaded the map is in shared memory, so one
 *	  backend's lookup serves every other; without it each backend keeps
 *	  its own (regress and isolation run that way, through the same code).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "common/hashfn.h"
#include "miscadmin.h"
#include "port/atomics.h"
#include "storage/bufmgr.h"
#include "storage/shmem.h"
#include "utils/memutils.h"
#include "utils/rel.h"

#include "base/compat.h"
#include "emit/emit.h"

/* 1 MB of shared memory; a power of two */
#define COUNTER_SLOTS	65536

typedef struct CounterSlot
{
	pg_atomic_uint64 where;		/* tag:16 block:32 offset:16; 0: empty */
	pg_atomic_uint32 buffer;	/* the shared buffer that held the block */
	uint32		pad;
} CounterSlot;

static CounterSlot *counter_slots = NULL;

static Size
counter_size(void)
{
	return mul_size(COUNTER_SLOTS, sizeof(CounterSlot));
}

/*
 * OutboxCounterShmemRequest / OutboxCounterShmemInit
 *		relay_slots.c's request and startup hooks.
 */
void
OutboxCounterShmemRequest(void)
{
	RequestAddinShmemSpace(counter_size());
}

void
OutboxCounterShmemInit(void)
{
	bool		found;

	counter_slots = ShmemInitStruct("outbox counter rows", counter_size(), &found);
	if (!found)
		for (int i = 0; i < COUNTER_SLOTS; i++)
		{
			pg_atomic_init_u64(&counter_slots[i].where, 0);
			pg_atomic_init_u32(&counter_slots[i].buffer, 0);
		}
}

/* the map: shared when preloaded, else this backend's own */
static CounterSlot *
counter_map(void)
{
	if (counter_slots == NULL)
	{
		counter_slots = MemoryContextAllocHuge(TopMemoryContext, counter_size());
		for (int i = 0; i < COUNTER_SLOTS; i++)
		{
			pg_atomic_init_u64(&counter_slots[i].where, 0);
			pg_atomic_init_u32(&counter_slots[i].buffer, 0);
		}
	}
	return counter_slots;
}

/*
 * OutboxCounterHash
 *		The key of an aggregate's counter row in table relid of this
 *		database.
 */
uint64
OutboxCounterHash(Oid relid, text *aggregate_type, text *aggregate_id)
{
	uint64		h;

	h = hash_bytes_extended((const unsigned char *) VARDATA_ANY(aggregate_type),
							VARSIZE_ANY_EXHDR(aggregate_type),
							((uint64) MyDatabaseId << 32) | relid);
	return hash_combine64(h,
						  hash_bytes_extended((const unsigned char *) VARDATA_ANY(aggregate_id),
											  VARSIZE_ANY_EXHDR(aggregate_id), 0));
}

/* the slot of hash, and the tag that says a slot's value is hash's */
#define counter_slot(hash)	(&counter_map()[(hash) & (COUNTER_SLOTS - 1)])
#define counter_tag(hash)	((((hash) >> 48) & 0xFFFF) | 1)

/*
 * OutboxCounterRecall
 *		Where hash's counter row was last seen, with its buffer pinned by
 *		ReadRecentBuffer() (the caller releases it): false when the map
 *		does not know, or the buffer no longer holds that block of rel.
 */
bool
OutboxCounterRecall(Relation rel, uint64 hash, ItemPointer root, Buffer *buffer)
{
	CounterSlot *slot = counter_slot(hash);
	uint64		where = pg_atomic_read_u64(&slot->where);
	Buffer		buf = (Buffer) pg_atomic_read_u32(&slot->buffer);
	BlockNumber block = (BlockNumber) ((where >> 16) & 0xFFFFFFFF);

	if (where == 0 || (where >> 48) != counter_tag(hash) ||
		buf <= 0 || buf > NBuffers)
		return false;
	if (!OutboxReadRecentBuffer(rel, block, buf))
		return false;
	ItemPointerSet(root, block, (OffsetNumber) (where & 0xFFFF));
	*buffer = buf;
	return true;
}

/*
 * OutboxCounterRemember
 *		hash's counter row has root as its chain's root, on the block buffer
 *		holds.
 */
void
OutboxCounterRemember(uint64 hash, ItemPointer root, Buffer buffer)
{
	CounterSlot *slot = counter_slot(hash);

	if (buffer <= 0)			/* a local buffer: not this table's kind */
		return;
	pg_atomic_write_u32(&slot->buffer, (uint32) buffer);
	pg_atomic_write_u64(&slot->where,
						((uint64) counter_tag(hash) << 48) |
						((uint64) ItemPointerGetBlockNumber(root) << 16) |
						ItemPointerGetOffsetNumber(root));
}

/*
 * OutboxCounterForget
 *		hash's counter row has moved (an update off its page).
 */
void
OutboxCounterForget(uint64 hash)
{
	CounterSlot *slot = counter_slot(hash);

	if ((pg_atomic_read_u64(&slot->where) >> 48) == counter_tag(hash))
		pg_atomic_write_u64(&slot->where, 0);
}
