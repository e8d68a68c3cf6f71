/*-------------------------------------------------------------------------
 *
 * emit/emit_uuid.c
 *		Event ids: RFC 9562 version 7 UUIDs, for emit() and outbox.uuid_v7().
 *
 * Invariants:
 *	- The ids a backend makes are strictly increasing: the 12 bits after
 *	  the millisecond count the sub-millisecond fraction (RFC 9562 method
 *	  3), and a tick not past the last one becomes the last one plus one.
 *	- The random bits come from pg_strong_random(), drawn a batch at a
 *	  time; the batch lives in this backend only, each part of it is
 *	  handed out once and wiped, and it is dropped in a process that did
 *	  not draw it (a fork), so no two processes share bytes.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "fmgr.h"
#include "miscadmin.h"
#include "utils/timestamp.h"
#include "utils/uuid.h"

#include "emit/emit.h"

PG_FUNCTION_INFO_V1(outbox_uuid_v7);

/* last UUIDv7 timestamp of this backend, in 1/4096 ms since 1970 */
static int64 uuid_last_tick = 0;

/*
 * uuid_random_bytes
 *		8 bytes from pg_strong_random() into out, drawn UUID_RANDOM_BATCH
 *		ids at a time: each call of pg_strong_random() takes OpenSSL's
 *		locks and checks, which cost an emit() more than the bytes (0.8
 *		points of the backends' samples in the Debezium section's emit
 *		workload, 2026-12-04).  The batch lives in this backend only, is
 *		handed out once and dropped when the process is not the one that
 *		drew it (a fork), so no two processes share bytes.
 */
#define UUID_RANDOM_BATCH 64

static uint8 uuid_random[UUID_RANDOM_BATCH * 8];
static int	uuid_random_used = UUID_RANDOM_BATCH;
static int	uuid_random_pid = 0;

static void
uuid_random_bytes(uint8 *out)
{
	if (uuid_random_used >= UUID_RANDOM_BATCH || uuid_random_pid != MyProcPid)
	{
		if (!pg_strong_random(uuid_random, sizeof(uuid_random)))
			ereport(ERROR,
					(errcode(ERRCODE_INTERNAL_ERROR),
					 errmsg("could not generate random values for an event id")));
		uuid_random_used = 0;
		uuid_random_pid = MyProcPid;
	}
	memcpy(out, &uuid_random[uuid_random_used * 8], 8);
	explicit_bzero(&uuid_random[uuid_random_used * 8], 8);
	uuid_random_used++;
}

/*
 * OutboxGenerateUuidV7
 *		Fill *uuid with an RFC 9562 version 7 UUID.
 *
 * 48 bits of Unix milliseconds, then the sub-millisecond fraction in the
 * 12 bits of rand_a (RFC 9562 method 3), kept strictly increasing within
 * this backend, then the variant and 62 random bits.
 */
void
OutboxGenerateUuidV7(pg_uuid_t *uuid)
{
	int64		unix_us;
	int64		tick;
	uint64		ms;
	int			sub;
	int			i;

	unix_us = GetCurrentTimestamp() +
		((int64) (POSTGRES_EPOCH_JDATE - UNIX_EPOCH_JDATE)) * USECS_PER_DAY;
	tick = (unix_us / 1000) * 4096 + ((unix_us % 1000) * 4096) / 1000;
	if (tick <= uuid_last_tick)
		tick = uuid_last_tick + 1;
	uuid_last_tick = tick;

	ms = (uint64) (tick >> 12);
	sub = (int) (tick & 0xFFF);
	for (i = 0; i < 6; i++)
		uuid->data[i] = (unsigned char) (ms >> (40 - 8 * i));
	uuid->data[6] = (unsigned char) (0x70 | (sub >> 8));
	uuid->data[7] = (unsigned char) (sub & 0xFF);
	uuid_random_bytes(&uuid->data[8]);
	uuid->data[8] = (uuid->data[8] & 0x3F) | 0x80;
}

/*
 * outbox_uuid_v7
 *		SQL outbox.uuid_v7(): the event id emit() would generate.
 */
Datum
outbox_uuid_v7(PG_FUNCTION_ARGS)
{
	pg_uuid_t  *uuid = palloc(sizeof(pg_uuid_t));

	OutboxGenerateUuidV7(uuid);
	PG_RETURN_UUID_P(uuid);
}
