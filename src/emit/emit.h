/*-------------------------------------------------------------------------
 *
 * emit/emit.h
 *		outbox.emit() and what it needs: argument checks, topics, event ids,
 *		the direct insert, the per-aggregate sequence and counter rows.
 *
 * What the emit room offers to the rooms above it; a file includes only
 * the headers of rooms below its own (docs/design.md).
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_EMIT_H
#define OUTBOX_EMIT_H

#include "postgres.h"

#include "base/base.h"
#include "kafka/kafka.h"

/* emit.c: outbox.emit(), and the relay woken at commit */
extern void OutboxEmitInit(void);

/* topic.c: topic names, template and allowed patterns, for emit() */
extern bool OutboxTopicTemplateIsValid(const char *tmpl, char **bad);
extern bool OutboxTopicPatternsAreValid(const char *patterns, char **bad);
extern char *OutboxTopicResolve(char *topic, const char *aggregate_type,
								const char *event_type);
extern bool OutboxTopicNameIsLegal(const char *name);

/* sequence.c: the per-aggregate sequence of one transaction, for emit() */
typedef struct OutboxSequenceEntry OutboxSequenceEntry;

extern void OutboxSequenceInit(void);
extern OutboxSequenceEntry *OutboxSequenceHeld(text *aggregate_type,
											   text *aggregate_id);
extern int64 OutboxSequenceNext(const OutboxSequenceEntry *entry);
extern void OutboxSequenceGiven(OutboxSequenceEntry *entry, int64 seq);
extern void OutboxSequenceEnter(text *aggregate_type, text *aggregate_id,
								int64 seq);
extern int64 OutboxSequenceCreate(text *aggregate_type, text *aggregate_id);

/* emit_counter.c: a transaction's first seq of an aggregate, from its row */
extern bool OutboxEmitTakeSeq(text *aggregate_type, text *aggregate_id,
							  int64 *seq);

/* emit_table.c: the tables emit() writes without a statement */
typedef enum OutboxEmitTable
{
	OUTBOX_EMIT_EVENTS,			/* outbox.events */
	OUTBOX_EMIT_AGGREGATES,		/* outbox.aggregates */
	OUTBOX_EMIT_GENERATION_0,	/* outbox.events_0, the first generation's
								 * partition; the others follow */
	OUTBOX_EMIT_NTABLES = OUTBOX_EMIT_GENERATION_0 + OUTBOX_GENERATIONS
} OutboxEmitTable;

extern Relation OutboxEmitOpenTable(OutboxEmitTable which);
extern bool OutboxEmitTableKnown(OutboxEmitTable which, Relation rel);
extern uint64 OutboxEmitTableStamp(void);
extern void OutboxEmitTableJudged(OutboxEmitTable which, Relation rel,
								  uint64 stamp);
extern bool OutboxEmitPlainIndexes(Relation rel);

/* emit_generation.c: the log's generation emit() writes into */
extern int	OutboxEmitGeneration(void);
extern void OutboxEmitCheckEventId(Relation parent, pg_uuid_t *id, int own,
								   bool inserted);

/* emit_uuid.c: event ids */
extern void OutboxGenerateUuidV7(pg_uuid_t *uuid);

/* counter.c: where counter rows were last seen, for emit() */
extern void OutboxCounterShmemRequest(void);
extern void OutboxCounterShmemInit(void);
extern uint64 OutboxCounterHash(Oid relid, text *aggregate_type,
								text *aggregate_id);
extern bool OutboxCounterRecall(Relation rel, uint64 hash, ItemPointer root,
								Buffer *buffer);
extern void OutboxCounterRemember(uint64 hash, ItemPointer root, Buffer buffer);
extern void OutboxCounterForget(uint64 hash);

/* emit_check.c: emit()'s arguments, each hostile input */
extern bool OutboxTraceparentIsValid(const char *value);
extern void OutboxEmitCheckContent(FunctionCallInfo fcinfo, OutboxEmitRow *row);
extern void OutboxEmitCheckEnvelope(FunctionCallInfo fcinfo, OutboxEmitRow *row);
extern char *OutboxEmitTopicArg(FunctionCallInfo fcinfo, OutboxEmitRow *row);
extern void OutboxEmitCheckSize(const OutboxEvent *event);
extern int	OutboxEmitCheckPayloadSize(size_t payload_len);

/* emit_backlog.c */
extern void OutboxEmitCheckBacklog(void);

/* emit_binary.c */
extern void OutboxEmitCheckBinary(FunctionCallInfo fcinfo, OutboxEmitRow *row);

/* emit_direct.c: the event row, written as the INSERT would write it */
extern void OutboxEmitInsert(OutboxEmitRow *row);

#endif							/* OUTBOX_EMIT_H */
