/*-------------------------------------------------------------------------
 *
 * emit.c
 *		outbox.emit(): validate an event and insert it into outbox.events.
 *
 * Invariants:
 *	- emit() never talks to Kafka.  It inserts one row in the caller's
 *	  transaction, so commit makes the event durable with the business data
 *	  and rollback removes both.
 *	- With outbox.aggregate_sequence on, the per-aggregate counter row is
 *	  locked (upserted) by the transaction's first emit of that aggregate,
 *	  before the event row's id is drawn.  Emitters of one aggregate
 *	  therefore queue on that row lock, and for one aggregate id order, seq
 *	  order and commit order are the same.  A rolled-back transaction rolls
 *	  its counter increment back too: seq stays gapless.
 *	- Later emits of an aggregate in the same transaction take their seq
 *	  from a backend-local table (seq_table), not from the row: updating
 *	  one row again and again walks its growing chain of versions, which
 *	  made a run of emits quadratic.  The row gets the table's final value
 *	  once, just before commit or prepare (seq_flush).  The table always
 *	  says what the row would hold had every emit updated it: a
 *	  subtransaction's abort undoes what it gave out (seq_undo), and
 *	  forgets an aggregate whose row it upserted, since the upsert and its
 *	  lock went with it.
 *	- Everything a relay needs is resolved here, once: event id (UUIDv7),
 *	  topic (validated as a legal Kafka name), key, tenant, traceparent.
 *	- Every argument is hostile input: an event emit() accepts cannot
 *	  forge the relay's own headers, write to a topic outbox.allowed_topics
 *	  does not allow, carry an occurred_at that is not RFC 3339, or be
 *	  larger than librdkafka accepts (message.max.bytes, counted as
 *	  librdkafka counts it, with every header the relay will send).
 *	- A transaction that emitted wakes its database's relay when it commits
 *	  (a latch in shared memory); an aborted or prepared one wakes nobody.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "port/pg_bswap.h"
#include "tcop/utility.h"
#include "common/hashfn.h"
#include "utils/builtins.h"
#include "utils/datetime.h"
#include "utils/hsearch.h"
#include "utils/jsonb.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"
#include "utils/uuid.h"

#include "outbox.h"

PG_FUNCTION_INFO_V1(outbox_emit);
PG_FUNCTION_INFO_V1(outbox_uuid_v7);
PG_FUNCTION_INFO_V1(outbox_notify_relay);

#define EMIT_NARGS 12

/*
 * The counter upsert runs first, as the source of the event insert, so its
 * row lock is held before nextval() draws the event id.  Operators are
 * schema-qualified because emit() runs as the extension owner.
 */
static const char *emit_sql_seq =
"WITH s AS ("
" INSERT INTO outbox.aggregates AS a (aggregate_type, aggregate_id, last_seq)"
" VALUES ($2, $3, 1)"
" ON CONFLICT (aggregate_type, aggregate_id)"
" DO UPDATE SET last_seq = a.last_seq OPERATOR(pg_catalog.+) 1"
" RETURNING a.last_seq)"
" INSERT INTO outbox.events (event_id, aggregate_type, aggregate_id, seq,"
" event_type, schema_version, topic, key, payload, headers, tenant,"
" traceparent, occurred_at)"
" SELECT $1, $2, $3, s.last_seq, $4, $5, $6, $7, $8, $9, $10, $11, $12 FROM s"
" RETURNING seq";

/* a later emit of an aggregate this transaction holds: seq is $13 */
static const char *emit_sql_given_seq =
"INSERT INTO outbox.events (event_id, aggregate_type, aggregate_id, seq,"
" event_type, schema_version, topic, key, payload, headers, tenant,"
" traceparent, occurred_at)"
" VALUES ($1, $2, $3, $13, $4, $5, $6, $7, $8, $9, $10, $11, $12)"
" RETURNING seq";

/* at commit or prepare: the counter row's final value, written once */
static const char *flush_sql =
"UPDATE outbox.aggregates SET last_seq = $3"
" WHERE aggregate_type OPERATOR(pg_catalog.=) $1"
" AND aggregate_id OPERATOR(pg_catalog.=) $2";

static const char *emit_sql_noseq =
"INSERT INTO outbox.events (event_id, aggregate_type, aggregate_id, seq,"
" event_type, schema_version, topic, key, payload, headers, tenant,"
" traceparent, occurred_at)"
" VALUES ($1, $2, $3, NULL, $4, $5, $6, $7, $8, $9, $10, $11, $12)"
" RETURNING seq";

static SPIPlanPtr emit_plan_seq = NULL;
static SPIPlanPtr emit_plan_noseq = NULL;
static SPIPlanPtr emit_plan_given_seq = NULL;
static SPIPlanPtr flush_plan = NULL;

/*
 * The aggregates this transaction has locked the counter row of, with the
 * last seq given out and the value the row holds.  Lives in
 * TopTransactionContext: gone with the transaction.
 */
typedef struct SeqKey
{
	const char *type;
	const char *id;
	int			type_len;
	int			id_len;
} SeqKey;

typedef struct SeqEntry
{
	SeqKey		key;			/* strings copied into the table's context */
	int64		seq;			/* last seq given out */
	int64		written;		/* what the counter row holds */
} SeqEntry;

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

/* set by emit(), consumed by the transaction callback */
static bool wake_at_commit = false;
static bool replay_at_commit = false;
static int	events_this_xact = 0;

/* last UUIDv7 timestamp of this backend, in 1/4096 ms since 1970 */
static int64 uuid_last_tick = 0;

static void emit_xact_callback(XactEvent event, void *arg);
static void emit_subxact_callback(SubXactEvent event, SubTransactionId mySubid,
								  SubTransactionId parentSubid, void *arg);
static void seq_flush(void);

/*
 * OutboxEmitInit
 *		Register the commit callback, once per backend.
 */
void
OutboxEmitInit(void)
{
	RegisterXactCallback(emit_xact_callback, NULL);
	RegisterSubXactCallback(emit_subxact_callback, NULL);
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

/* the transaction is over: its table went with TopTransactionContext */
static void
seq_forget(void)
{
	seq_table = NULL;
	seq_undo = NULL;
	seq_undo_len = seq_undo_cap = 0;
}

/*
 * seq_lookup
 *		The table's entry for this aggregate, or NULL when this transaction
 *		has not locked its counter row.
 */
static SeqEntry *
seq_lookup(text *aggregate_type, text *aggregate_id)
{
	SeqKey		key;

	if (seq_table == NULL)
		return NULL;
	key.type = VARDATA_ANY(aggregate_type);
	key.type_len = VARSIZE_ANY_EXHDR(aggregate_type);
	key.id = VARDATA_ANY(aggregate_id);
	key.id_len = VARSIZE_ANY_EXHDR(aggregate_id);
	return (SeqEntry *) hash_search(seq_table, &key, HASH_FIND, NULL);
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
 * seq_remember
 *		Enter an aggregate whose counter row this (sub)transaction has just
 *		upserted and locked, with the seq the upsert gave.
 */
static void
seq_remember(text *aggregate_type, text *aggregate_id, int64 seq)
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
	key.type = VARDATA_ANY(aggregate_type);
	key.type_len = VARSIZE_ANY_EXHDR(aggregate_type);
	key.id = VARDATA_ANY(aggregate_id);
	key.id_len = VARSIZE_ANY_EXHDR(aggregate_id);
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

static void
emit_subxact_callback(SubXactEvent event, SubTransactionId mySubid,
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
			/* portals are closed by now: the update needs its own snapshot */
			PushActiveSnapshot(GetTransactionSnapshot());
			if (SPI_connect() != SPI_OK_CONNECT)
				elog(ERROR, "SPI_connect failed");
			connected = true;
			if (flush_plan == NULL)
			{
				Oid			argtypes[3] = {TEXTOID, TEXTOID, INT8OID};
				SPIPlanPtr	plan = SPI_prepare(flush_sql, 3, argtypes);

				if (plan == NULL)
					elog(ERROR, "could not prepare the counter update: %s",
						 SPI_result_code_string(SPI_result));
				if (SPI_keepplan(plan) != 0)
					elog(ERROR, "could not keep the counter update plan");
				flush_plan = plan;
			}
		}
		values[0] = PointerGetDatum(cstring_to_text_with_len(entry->key.type,
															 entry->key.type_len));
		values[1] = PointerGetDatum(cstring_to_text_with_len(entry->key.id,
															 entry->key.id_len));
		values[2] = Int64GetDatum(entry->seq);
		rc = SPI_execute_plan(flush_plan, values, NULL, false, 0);
		if (rc != SPI_OK_UPDATE || SPI_processed != 1)
			elog(ERROR, "outbox counter update returned %s with %llu rows",
				 SPI_result_code_string(rc), (unsigned long long) SPI_processed);
		entry->written = entry->seq;
	}
	if (connected)
	{
		SPI_finish();
		PopActiveSnapshot();
		SetUserIdAndSecContext(save_userid, save_sec_context);
	}
}

static void
emit_xact_callback(XactEvent event, void *arg)
{
	switch (event)
	{
		case XACT_EVENT_PRE_COMMIT:
		case XACT_EVENT_PRE_PREPARE:
			seq_flush();
			break;
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_PARALLEL_COMMIT:
			seq_forget();
			if (wake_at_commit || replay_at_commit)
				OutboxWakeRelay(MyDatabaseId, replay_at_commit, events_this_xact);
			wake_at_commit = replay_at_commit = false;
			events_this_xact = 0;
			break;
		case XACT_EVENT_PREPARE:
			seq_forget();
			/* COMMIT PREPARED wakes the relay and counts these events */
			if (wake_at_commit || replay_at_commit)
				OutboxNotePrepared(events_this_xact, replay_at_commit);
			wake_at_commit = replay_at_commit = false;
			events_this_xact = 0;
			break;
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PARALLEL_ABORT:
			seq_forget();
			wake_at_commit = replay_at_commit = false;
			events_this_xact = 0;
			break;
		default:
			break;
	}
}

/*
 * OutboxTopicNameIsLegal
 *		Whether Kafka accepts this topic name.
 *
 * Kafka allows 1..249 characters from [A-Za-z0-9._-], except "." and "..".
 */
bool
OutboxTopicNameIsLegal(const char *name, int len)
{
	int			i;

	if (len < 1 || len > OUTBOX_TOPIC_MAX_LEN)
		return false;
	if ((len == 1 && name[0] == '.') ||
		(len == 2 && name[0] == '.' && name[1] == '.'))
		return false;
	for (i = 0; i < len; i++)
	{
		char		c = name[i];

		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
			  (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-'))
			return false;
	}
	return true;
}

static bool
is_lower_hex(const char *s, int n, bool *all_zero)
{
	int			i;

	*all_zero = true;
	for (i = 0; i < n; i++)
	{
		if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
			return false;
		if (s[i] != '0')
			*all_zero = false;
	}
	return true;
}

/*
 * OutboxTraceparentIsValid
 *		Whether value is a W3C Trace Context traceparent header.
 *
 * Version 00 is exactly "vv-<32 hex>-<16 hex>-<2 hex>"; a later version may
 * append "-..." fields.  Version ff and all-zero ids are invalid.
 */
bool
OutboxTraceparentIsValid(const char *value)
{
	size_t		len = strlen(value);
	bool		zero;

	if (len < 55)
		return false;
	if (!is_lower_hex(value, 2, &zero) || strncmp(value, "ff", 2) == 0)
		return false;
	if (value[2] != '-' || value[35] != '-' || value[52] != '-')
		return false;
	if (!is_lower_hex(value + 3, 32, &zero) || zero)
		return false;
	if (!is_lower_hex(value + 36, 16, &zero) || zero)
		return false;
	if (!is_lower_hex(value + 53, 2, &zero))
		return false;
	if (strncmp(value, "00", 2) == 0)
		return len == 55;
	return len == 55 || value[55] == '-';
}

/*
 * Template placeholders.  Expansion and validation share this table so a
 * template the check hook accepted always expands.
 */
#define PLACEHOLDER_AGGREGATE_TYPE	0
#define PLACEHOLDER_EVENT_TYPE		1

static const char *const placeholders[] = {"{aggregate_type}", "{event_type}"};

static int
match_placeholder(const char *p)
{
	int			i;

	for (i = 0; i < lengthof(placeholders); i++)
		if (strncmp(p, placeholders[i], strlen(placeholders[i])) == 0)
			return i;
	return -1;
}

/*
 * OutboxTopicTemplateIsValid
 *		Check outbox.topic_template; on failure *bad gets a detail sentence.
 */
bool
OutboxTopicTemplateIsValid(const char *tmpl, char **bad)
{
	const char *p;

	if (tmpl == NULL || tmpl[0] == '\0')
	{
		*bad = pstrdup("The template must not be empty.");
		return false;
	}
	for (p = tmpl; *p; p++)
	{
		int			ph;

		if (*p != '{')
		{
			if (!OutboxTopicNameIsLegal(p, 1) && *p != '.')
			{
				*bad = psprintf("Character \"%c\" cannot appear in a Kafka topic name.", *p);
				return false;
			}
			continue;
		}
		ph = match_placeholder(p);
		if (ph < 0)
		{
			*bad = pstrdup("The only placeholders are {aggregate_type} and {event_type}.");
			return false;
		}
		p += strlen(placeholders[ph]) - 1;
	}
	return true;
}

static char *
expand_topic_template(const char *tmpl, const char *aggregate_type,
					  const char *event_type)
{
	StringInfoData buf;
	const char *p;

	initStringInfo(&buf);
	for (p = tmpl; *p; p++)
	{
		int			ph = (*p == '{') ? match_placeholder(p) : -1;

		if (ph < 0)
		{
			appendStringInfoChar(&buf, *p);
			continue;
		}
		appendStringInfoString(&buf, ph == PLACEHOLDER_AGGREGATE_TYPE ?
							   aggregate_type : event_type);
		p += strlen(placeholders[ph]) - 1;
	}
	return buf.data;
}

/*
 * next_pattern
 *		The next comma-separated entry of outbox.allowed_topics, trimmed of
 *		spaces: *start and *len, and where to go on.  NULL at the end.
 */
static const char *
next_pattern(const char *p, const char **start, int *len)
{
	const char *end;

	if (*p == '\0')
		return NULL;
	end = strchr(p, ',');
	if (end == NULL)
		end = p + strlen(p);
	while (p < end && *p == ' ')
		p++;
	*start = p;
	*len = (int) (end - p);
	while (*len > 0 && p[*len - 1] == ' ')
		(*len)--;
	return *end == ',' ? end + 1 : end;
}

/*
 * OutboxTopicPatternsAreValid
 *		Check outbox.allowed_topics: empty, or comma-separated patterns of
 *		topic name characters and '*'.  On failure *bad gets a detail
 *		sentence.
 */
bool
OutboxTopicPatternsAreValid(const char *patterns, char **bad)
{
	const char *p = patterns;
	const char *start;
	int			len;
	int			n = 0;

	if (patterns == NULL || strspn(patterns, " ") == strlen(patterns))
		return true;
	while ((p = next_pattern(p, &start, &len)) != NULL)
	{
		int			i;

		n++;
		if (len == 0)
		{
			*bad = psprintf("Entry %d of the list is empty.", n);
			return false;
		}
		for (i = 0; i < len; i++)
			if (start[i] != '*' && !OutboxTopicNameIsLegal(start + i, 1) && start[i] != '.')
			{
				*bad = psprintf("Character \"%c\" cannot appear in a topic pattern: "
								"patterns have characters from [A-Za-z0-9._-] and the wildcard \"*\".",
								start[i]);
				return false;
			}
	}
	return true;
}

/*
 * pattern_matches
 *		Whether topic matches pattern[0..plen), '*' matching any run of
 *		characters, possibly empty.  Greedy with one backtrack point: the
 *		last '*' seen is the only one worth retrying.
 */
static bool
pattern_matches(const char *pattern, int plen, const char *topic)
{
	int			p = 0;
	int			star = -1;
	const char *t = topic;
	const char *star_t = NULL;

	while (*t)
	{
		if (p < plen && pattern[p] == '*')
		{
			star = p++;
			star_t = t;
		}
		else if (p < plen && pattern[p] == *t)
		{
			p++;
			t++;
		}
		else if (star >= 0)
		{
			p = star + 1;
			t = ++star_t;
		}
		else
			return false;
	}
	while (p < plen && pattern[p] == '*')
		p++;
	return p == plen;
}

/*
 * topic_is_allowed
 *		Whether outbox.allowed_topics lets emit() write to topic.
 */
static bool
topic_is_allowed(const char *topic)
{
	const char *p = outbox_allowed_topics;
	const char *start;
	int			len;

	if (p == NULL || strspn(p, " ") == strlen(p))
		return true;
	while ((p = next_pattern(p, &start, &len)) != NULL)
		if (pattern_matches(start, len, topic))
			return true;
	return false;
}

/*
 * generate_uuid_v7
 *		Fill *uuid with an RFC 9562 version 7 UUID.
 *
 * 48 bits of Unix milliseconds, then the sub-millisecond fraction in the
 * 12 bits of rand_a (RFC 9562 method 3), kept strictly increasing within
 * this backend, then the variant and 62 random bits.
 */
static void
generate_uuid_v7(pg_uuid_t *uuid)
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
	if (!pg_strong_random(&uuid->data[8], 8))
		ereport(ERROR,
				(errcode(ERRCODE_INTERNAL_ERROR),
				 errmsg("could not generate random values for an event id")));
	uuid->data[8] = (uuid->data[8] & 0x3F) | 0x80;
}

static text *
required_text(FunctionCallInfo fcinfo, int argno, const char *name)
{
	text	   *t;

	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not be null", name)));
	t = PG_GETARG_TEXT_PP(argno);
	if (VARSIZE_ANY_EXHDR(t) == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must not be empty", name)));
	return t;
}

/*
 * check_headers
 *		Headers must be a JSON object of string values: each becomes a Kafka
 *		header whose value is that string, sent after the relay's own.  No
 *		name may be empty or one of the relay's (OutboxHeaderNames), in any
 *		letter case: Kafka header names are case-sensitive, but a reader
 *		that folds case must not see a forged "ID" either.  At most
 *		OUTBOX_CALLER_HEADERS_MAX headers of OUTBOX_CALLER_HEADER_BYTES_MAX
 *		bytes (names and values).  The names and values, palloc'd, go to
 *		event for the size check.
 */
static void
check_headers(Jsonb *headers, OutboxEvent *event)
{
	JsonbIterator *it;
	JsonbValue	v;
	JsonbIteratorToken tok;
	char	   *key = NULL;
	int			count;
	size_t		bytes = 0;
	int			n = 0;

	if (!JB_ROOT_IS_OBJECT(headers))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("headers must be a JSON object of string values"),
				 errdetail("The headers argument is a JSON %s.",
						   JB_ROOT_IS_SCALAR(headers) ? "scalar" : "array")));

	count = JB_ROOT_COUNT(headers);
	if (count > OUTBOX_CALLER_HEADERS_MAX)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("an event can have at most %d headers, not %d",
						OUTBOX_CALLER_HEADERS_MAX, count)));
	event->header_names = palloc(sizeof(char *) * Max(count, 1));
	event->header_values = palloc(sizeof(char *) * Max(count, 1));

	it = JsonbIteratorInit(&headers->root);
	while ((tok = JsonbIteratorNext(&it, &v, true)) != WJB_DONE)
	{
		if (tok == WJB_KEY)
		{
			int			i;

			key = pnstrdup(v.val.string.val, v.val.string.len);
			if (key[0] == '\0')
				ereport(ERROR,
						(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
						 errmsg("header names must not be empty")));
			for (i = 0; i < OUTBOX_NUM_HEADERS; i++)
				if (pg_strcasecmp(key, OutboxHeaderNames[i]) == 0)
					ereport(ERROR,
							(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
							 errmsg("header \"%s\" is reserved", key),
							 errdetail("The relay sets headers id, event_type, aggregate_type, "
									   "aggregate_id, seq, schema_version, occurred_at, "
									   "traceparent and tenant itself; their names are "
									   "reserved in any letter case.")));
			bytes += v.val.string.len;
		}
		else if (tok == WJB_VALUE)
		{
			if (v.type != jbvString)
				ereport(ERROR,
						(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
						 errmsg("headers must be a JSON object of string values"),
						 errdetail("Header \"%s\" is not a JSON string.", key)));
			bytes += v.val.string.len;
			event->header_names[n] = key;
			event->header_values[n++] = pnstrdup(v.val.string.val, v.val.string.len);
		}
	}
	if (bytes > OUTBOX_CALLER_HEADER_BYTES_MAX)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("event headers are %zu bytes, more than %d",
						bytes, OUTBOX_CALLER_HEADER_BYTES_MAX),
				 errdetail("Header names and values count.")));
	event->nheaders = n;
}

/*
 * format_occurred_at
 *		occurred_at as the relay sends it (RFC 3339 in UTC, microseconds,
 *		the form store.c's format_timestamp writes), or an error when it
 *		has no such form: infinite, before year 1 or after year 9999.
 */
static char *
format_occurred_at(TimestampTz ts)
{
	struct pg_tm tm;
	fsec_t		fsec;

	if (TIMESTAMP_NOT_FINITE(ts) ||
		timestamp2tm(ts, NULL, &tm, &fsec, NULL, NULL) != 0 ||
		tm.tm_year < 1 || tm.tm_year > 9999)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("occurred_at must be between years 1 and 9999 in UTC"),
				 errdetail("The relay sends it as an RFC 3339 timestamp, which has four-digit years.")));
	return psprintf("%04d-%02d-%02dT%02d:%02d:%02d.%06dZ",
					tm.tm_year, tm.tm_mon, tm.tm_mday, tm.tm_hour, tm.tm_min,
					tm.tm_sec, (int) fsec);
}

/*
 * check_message_size
 *		Refuse an event librdkafka would refuse as larger than the
 *		producer's message.max.bytes: the same sum, the same limit, so what
 *		emit() accepts the relay can produce.
 */
static void
check_message_size(const OutboxEvent *event)
{
	size_t		headers_size;
	size_t		total = OutboxEventWireSize(event, &headers_size);

	if (total > (size_t) outbox_kafka_message_max_bytes)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("event is %zu bytes as a Kafka message, more than the producer's limit of %d bytes",
						total, outbox_kafka_message_max_bytes),
				 errdetail("Payload %d bytes, key %zu bytes, headers %zu bytes (the relay's and the caller's), record overhead %zu bytes.",
						   event->payload_len, strlen(event->key), headers_size,
						   total - headers_size - strlen(event->key) - (size_t) event->payload_len),
				 errhint("The limit is librdkafka's message.max.bytes, set in outbox.kafka_config.")));
}

/*
 * outbox_emit
 *		SQL outbox.emit(aggregate_type, aggregate_id, event_type, payload,
 *		headers, topic, key, event_id, schema_version, occurred_at).
 *
 * Returns the event id.  Runs as the extension owner (SECURITY DEFINER) so
 * that callers need EXECUTE on this function and nothing on the tables.
 */
Datum
outbox_emit(PG_FUNCTION_ARGS)
{
	text	   *aggregate_type;
	text	   *aggregate_id;
	text	   *event_type;
	Jsonb	   *payload;
	char	   *topic;
	pg_uuid_t  *event_id;
	int32		schema_version = 1;
	char	   *payload_text;
	size_t		payload_len;
	Datum		values[EMIT_NARGS + 1];
	char		nulls[EMIT_NARGS + 1];
	SPIPlanPtr *planp;
	const char *sql;
	int			nargs = EMIT_NARGS;
	SeqEntry   *held = NULL;
	int			rc;
	OutboxEvent event;
	TimestampTz occurred_at;
	bool		seq_isnull;

	PreventCommandIfReadOnly("outbox.emit()");
	PreventCommandDuringRecovery("outbox.emit()");

	aggregate_type = required_text(fcinfo, 0, "aggregate_type");
	aggregate_id = required_text(fcinfo, 1, "aggregate_id");
	event_type = required_text(fcinfo, 2, "event_type");
	if (PG_ARGISNULL(3))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("payload must not be null"),
				 errhint("Use the JSON value 'null'::jsonb for an event without a payload.")));
	payload = PG_GETARG_JSONB_P(3);

	payload_text = JsonbToCString(NULL, &payload->root, VARSIZE(payload));
	payload_len = strlen(payload_text);
	if (payload_len > (size_t) outbox_max_payload_bytes)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("event payload is %zu bytes, more than outbox.max_payload_bytes (%d bytes)",
						payload_len, outbox_max_payload_bytes)));

	memset(&event, 0, sizeof(event));
	event.payload_len = (int) payload_len;
	if (!PG_ARGISNULL(4))
		check_headers(PG_GETARG_JSONB_P(4), &event);

	if (!PG_ARGISNULL(5))
	{
		topic = text_to_cstring(PG_GETARG_TEXT_PP(5));
		if (!OutboxTopicNameIsLegal(topic, strlen(topic)))
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("invalid Kafka topic name \"%s\"", topic),
					 errdetail("A topic name has 1 to 249 characters from [A-Za-z0-9._-] and is not \".\" or \"..\".")));
	}
	else
	{
		topic = expand_topic_template(outbox_topic_template,
									  text_to_cstring(aggregate_type),
									  text_to_cstring(event_type));
		if (!OutboxTopicNameIsLegal(topic, strlen(topic)))
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("invalid Kafka topic name \"%s\"", topic),
					 errdetail("A topic name has 1 to 249 characters from [A-Za-z0-9._-] and is not \".\" or \"..\"."),
					 errhint("The name comes from outbox.topic_template \"%s\"; pass a topic or change the template.",
							 outbox_topic_template)));
	}
	if (!topic_is_allowed(topic))
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("events cannot be emitted to topic \"%s\"", topic),
				 errdetail("The topic does not match outbox.allowed_topics."),
				 errhint("A superuser sets outbox.allowed_topics.")));

	/* an empty key would be partitioned at random by consistent_random */
	if (!PG_ARGISNULL(6) && VARSIZE_ANY_EXHDR(PG_GETARG_TEXT_PP(6)) == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("key must not be empty"),
				 errhint("Pass NULL to use the aggregate id as the key.")));

	occurred_at = PG_ARGISNULL(9) ? GetCurrentTransactionStartTimestamp() :
		PG_GETARG_TIMESTAMPTZ(9);
	event.occurred_at = format_occurred_at(occurred_at);

	if (!PG_ARGISNULL(8))
	{
		schema_version = PG_GETARG_INT32(8);
		if (schema_version < 1)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("schema_version must be at least 1, not %d", schema_version)));
	}
	else
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("schema_version must not be null")));

	if (!PG_ARGISNULL(7))
		event_id = PG_GETARG_UUID_P(7);
	else
	{
		event_id = palloc(sizeof(pg_uuid_t));
		generate_uuid_v7(event_id);
	}

	memset(nulls, ' ', sizeof(nulls));
	values[0] = UUIDPGetDatum(event_id);
	values[1] = PointerGetDatum(aggregate_type);
	values[2] = PointerGetDatum(aggregate_id);
	values[3] = PointerGetDatum(event_type);
	values[4] = Int32GetDatum(schema_version);
	values[5] = CStringGetTextDatum(topic);
	values[6] = PG_ARGISNULL(6) ? PointerGetDatum(aggregate_id) : PG_GETARG_DATUM(6);
	values[7] = PointerGetDatum(payload);
	if (PG_ARGISNULL(4))
		nulls[8] = 'n';
	else
		values[8] = PG_GETARG_DATUM(4);
	if (outbox_tenant == NULL || outbox_tenant[0] == '\0')
		nulls[9] = 'n';
	else
		values[9] = CStringGetTextDatum(outbox_tenant);
	if (outbox_traceparent == NULL || outbox_traceparent[0] == '\0')
		nulls[10] = 'n';
	else
		values[10] = CStringGetTextDatum(outbox_traceparent);
	values[11] = TimestampTzGetDatum(occurred_at);

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");

	if (outbox_aggregate_sequence)
		held = seq_lookup(aggregate_type, aggregate_id);
	if (held != NULL)
	{
		/* this transaction holds the row lock: the next number is ours */
		planp = &emit_plan_given_seq;
		sql = emit_sql_given_seq;
		nargs = EMIT_NARGS + 1;
		values[EMIT_NARGS] = Int64GetDatum(held->seq + 1);
		nulls[EMIT_NARGS] = ' ';
	}
	else if (outbox_aggregate_sequence)
	{
		planp = &emit_plan_seq;
		sql = emit_sql_seq;
	}
	else
	{
		planp = &emit_plan_noseq;
		sql = emit_sql_noseq;
	}
	if (*planp == NULL)
	{
		Oid			argtypes[EMIT_NARGS + 1] = {UUIDOID, TEXTOID, TEXTOID, TEXTOID,
			INT4OID, TEXTOID, TEXTOID, JSONBOID, JSONBOID, TEXTOID, TEXTOID,
		TIMESTAMPTZOID, INT8OID};
		SPIPlanPtr	plan;

		plan = SPI_prepare(sql, nargs, argtypes);
		if (plan == NULL)
			elog(ERROR, "could not prepare the outbox insert: %s",
				 SPI_result_code_string(SPI_result));
		if (SPI_keepplan(plan) != 0)
			elog(ERROR, "could not keep the outbox insert plan");
		*planp = plan;
	}

	rc = SPI_execute_plan(*planp, values, nulls, false, 0);
	if (rc != SPI_OK_INSERT_RETURNING || SPI_processed != 1)
		elog(ERROR, "outbox insert returned %s with %llu rows",
			 SPI_result_code_string(rc), (unsigned long long) SPI_processed);

	/*
	 * The size check needs the seq header, known only now; an error here
	 * rolls the insert and the counter back with the caller's transaction.
	 */
	event.seq = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0],
											SPI_tuptable->tupdesc, 1, &seq_isnull));
	event.has_seq = !seq_isnull;
	if (held != NULL)
	{
		seq_reserve_undo();
		seq_note_undo(held, held->seq);
		held->seq = event.seq;
	}
	else if (event.has_seq)
		seq_remember(aggregate_type, aggregate_id, event.seq);
	event.event_id = DatumGetCString(DirectFunctionCall1(uuid_out, UUIDPGetDatum(event_id)));
	event.aggregate_type = text_to_cstring(aggregate_type);
	event.aggregate_id = text_to_cstring(aggregate_id);
	event.event_type = text_to_cstring(event_type);
	event.schema_version = schema_version;
	event.key = TextDatumGetCString(values[6]);
	event.tenant = nulls[9] == 'n' ? NULL : outbox_tenant;
	event.traceparent = nulls[10] == 'n' ? NULL : outbox_traceparent;
	check_message_size(&event);

	SPI_finish();

	wake_at_commit = true;
	events_this_xact++;

	PG_RETURN_UUID_P(event_id);
}

/*
 * outbox_uuid_v7
 *		SQL outbox.uuid_v7(): the event id emit() would generate.
 */
Datum
outbox_uuid_v7(PG_FUNCTION_ARGS)
{
	pg_uuid_t  *uuid = palloc(sizeof(pg_uuid_t));

	generate_uuid_v7(uuid);
	PG_RETURN_UUID_P(uuid);
}

/*
 * outbox_notify_relay
 *		SQL outbox.notify_relay(): wake the relay when this transaction
 *		commits and have it look at the replay queue (replay and discard
 *		queue work for it).
 */
Datum
outbox_notify_relay(PG_FUNCTION_ARGS)
{
	replay_at_commit = true;
	PG_RETURN_VOID();
}
