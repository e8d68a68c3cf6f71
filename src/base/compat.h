/*-------------------------------------------------------------------------
 *
 * base/compat.h
 *		Every difference between the PostgreSQL and librdkafka versions
 *		outbox builds against, in one place.
 *
 * Supported: PostgreSQL 15, 17 and 18 (16 builds too but Debian carries no
 * release of it, so it is not tested); librdkafka 2.0 and later (Debian
 * bookworm has 2.0.2, trixie 2.8.0, sid 2.14.2).
 *
 * Invariants:
 *	- this is the only file of the project that tests PG_VERSION_NUM,
 *	  RD_KAFKA_VERSION or a C library's identity; the rest of the code calls
 *	  what is defined here and reads the same on every version;
 *	- each section below is independent: one topic, its version test, its
 *	  definitions for both sides of it.  Add a new difference as a new
 *	  section at the end of its part (PostgreSQL, librdkafka, C library).
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_COMPAT_H
#define OUTBOX_COMPAT_H

#include "pgstat.h"


/* ========================================================================
 * Part 1: PostgreSQL
 * ========================================================================
 */

/* ---- 1.1 Supported range ---------------------------------------------- */
#if PG_VERSION_NUM < 150000
#error "outbox needs PostgreSQL 15 or later"
#endif

/* ---- 1.2 Wait events ----------------------------------------------------
 *
 * From 17 on, an extension registers named wait events
 * (WaitEventExtensionNew), so pg_stat_activity.wait_event tells what a relay
 * waits for.  Before 17 every wait shows as "Extension".
 *
 * OutboxWaitEvent(&cache, name) returns the wait event to pass to
 * WaitLatch(); the cache (a static uint32 of the caller, 0 at start) keeps
 * the registration per process: WaitEventExtensionNew takes a lock and looks
 * the name up in shared memory, which is not for every wait.
 */
#if PG_VERSION_NUM >= 170000
#define OUTBOX_NAMED_WAIT_EVENTS 1
static inline uint32
OutboxWaitEvent(uint32 *cache, const char *name)
{
	if (*cache == 0)
		*cache = WaitEventExtensionNew(name);
	return *cache;
}
#else
static inline uint32
OutboxWaitEvent(uint32 *cache, const char *name)
{
	(void) cache;
	(void) name;
	return PG_WAIT_EXTENSION;
}
#endif

/* ---- 1.3 Ownership checks -------------------------------------------
 *
 * 16 replaced the per-kind pg_*_ownercheck() by object_ownercheck().
 */
#if PG_VERSION_NUM >= 160000
#include "catalog/pg_database.h"
#include "catalog/pg_extension.h"
#include "catalog/pg_namespace.h"
#include "utils/acl.h"
#define OutboxDatabaseOwnercheck(dboid, roleid) \
	object_ownercheck(DatabaseRelationId, (dboid), (roleid))
#define OutboxExtensionOwnercheck(extoid, roleid) \
	object_ownercheck(ExtensionRelationId, (extoid), (roleid))
#define OutboxSchemaOwnercheck(nspoid, roleid) \
	object_ownercheck(NamespaceRelationId, (nspoid), (roleid))
#else
#include "utils/acl.h"
#define OutboxDatabaseOwnercheck(dboid, roleid) \
	pg_database_ownercheck((dboid), (roleid))
#define OutboxExtensionOwnercheck(extoid, roleid) \
	pg_extension_ownercheck((extoid), (roleid))
#define OutboxSchemaOwnercheck(nspoid, roleid) \
	pg_namespace_ownercheck((nspoid), (roleid))
#endif

/* ---- 1.3c EXECUTE checks ----------------------------------------------
 *
 * 16 replaced pg_proc_aclcheck() by object_aclcheck() too.
 */
#if PG_VERSION_NUM >= 160000
#include "catalog/pg_proc.h"
#define OutboxProcAclcheck(funcid, roleid) \
	object_aclcheck(ProcedureRelationId, (funcid), (roleid), ACL_EXECUTE)
#else
#define OutboxProcAclcheck(funcid, roleid) \
	pg_proc_aclcheck((funcid), (roleid), ACL_EXECUTE)
#endif

/* ---- 1.3d Is this JSON? ------------------------------------------------
 *
 * OutboxJsonIsValid(text, len): whether len bytes (valid text of the
 * database's encoding) parse as JSON, by the json type's own parser with
 * no semantic actions; a syntax error is a false, not an ERROR (a nesting
 * too deep for the stack still ERRORs).  17 made the lexer context the
 * caller's to allocate and free.
 */
#include "common/jsonapi.h"
#include "mb/pg_wchar.h"
#if PG_VERSION_NUM >= 170000
static inline bool
OutboxJsonIsValid(const char *json, int len)
{
	JsonLexContext lex;
	JsonParseErrorType result;

	makeJsonLexContextCstringLen(&lex, json, len, GetDatabaseEncoding(), false);
	result = pg_parse_json(&lex, &nullSemAction);
	freeJsonLexContext(&lex);
	return result == JSON_SUCCESS;
}
#else
static inline bool
OutboxJsonIsValid(const char *json, int len)
{
	JsonLexContext *lex = makeJsonLexContextCstringLen((char *) json, len,
													   GetDatabaseEncoding(), false);

	return pg_parse_json(lex, &nullSemAction) == JSON_SUCCESS;
}
#endif

/* ---- 1.3e Set-returning functions into a tuplestore -------------------
 *
 * 16 renamed SetSingleFuncCall() to InitMaterializedSRF().
 */
#include "funcapi.h"
#if PG_VERSION_NUM >= 160000
#define OutboxMaterializedSRF(fcinfo) InitMaterializedSRF((fcinfo), 0)
#else
#define OutboxMaterializedSRF(fcinfo) SetSingleFuncCall((fcinfo), 0)
#endif

/* ---- 1.3b The CREATEDB privilege -------------------------------------
 *
 * OutboxHaveCreatedbPrivilege(): whether the current user may create
 * databases (a superuser, or a role with CREATEDB), as CREATE DATABASE
 * decides.  dbcommands.c exports have_createdb_privilege() from 16 on; 15
 * kept it static until a late minor release (15.20 exports it, 15.18,
 * Debian bookworm's main suite, does not), so up to 15 the role's flag is
 * read here from its catalog row.
 */
#if PG_VERSION_NUM >= 160000
#include "commands/dbcommands.h"
#define OutboxHaveCreatedbPrivilege() have_createdb_privilege()
#else
#include "access/htup_details.h"
#include "catalog/pg_authid.h"
#include "miscadmin.h"
#include "utils/syscache.h"
static inline bool
OutboxHaveCreatedbPrivilege(void)
{
	HeapTuple	tuple;
	bool		result;

	if (superuser())
		return true;
	tuple = SearchSysCache1(AUTHOID, ObjectIdGetDatum(GetUserId()));
	if (!HeapTupleIsValid(tuple))
		return false;
	result = ((Form_pg_authid) GETSTRUCT(tuple))->rolcreatedb;
	ReleaseSysCache(tuple);
	return result;
}
#endif

/* ---- 1.4 Memory of a GUC check hook's "extra" ---------------------------
 *
 * guc.c frees extra with free() up to 15 and with pfree() (in its own
 * memory context) from 16 on, where guc_malloc() is exported for it.
 * OutboxGucMalloc returns NULL when out of memory, as guc_malloc(LOG, ...)
 * does; a check hook then returns false.
 */
#if PG_VERSION_NUM >= 160000
#include "utils/guc.h"
#define OutboxGucMalloc(size) guc_malloc(LOG, (size))
#else
#define OutboxGucMalloc(size) malloc(size)
#endif

/* ---- 1.5 Transaction completion counter -------------------------------
 *
 * OutboxXactCompletionCount(): how many transactions with an xid have ended
 * (committed, aborted, prepared ones finished) in the cluster since start:
 * the counter PostgreSQL bumps under ProcArrayLock at each such end, to
 * reuse snapshots.  Unchanged since before a snapshot was taken means a new
 * snapshot would see the same transactions as done.  17 renamed
 * ShmemVariableCache to TransamVariables.
 */
#include "access/transam.h"
#include "port/atomics.h"
static inline uint64
OutboxXactCompletionCount(void)
{
	pg_read_barrier();
#if PG_VERSION_NUM >= 170000
	return ((volatile TransamVariablesData *) TransamVariables)->xactCompletionCount;
#else
	return ((volatile VariableCacheData *) ShmemVariableCache)->xactCompletionCount;
#endif
}

/* ---- 1.6 A long-lived WaitEventSet ------------------------------------
 *
 * 17 made CreateWaitEventSet take a resource owner instead of a memory
 * context; with none, the set lives in TopMemoryContext there.
 * OutboxCreateWaitEventSet(cxt, nevents) makes a set that no resource owner
 * releases, in cxt before 17; FreeWaitEventSet frees it on every version.
 */
#include "storage/latch.h"
#if PG_VERSION_NUM >= 170000
#define OutboxCreateWaitEventSet(cxt, nevents) \
	((void) (cxt), CreateWaitEventSet(NULL, (nevents)))
#else
#define OutboxCreateWaitEventSet(cxt, nevents) CreateWaitEventSet((cxt), (nevents))
#endif


/* ---- 1.7 Index entries of a row inserted without the executor ---------
 *
 * 16 gave ExecInsertIndexTuples() an onlySummarizing flag (for HOT updates
 * that touch only summarizing indexes); an insert passes false.
 */
#include "executor/executor.h"
#if PG_VERSION_NUM >= 160000
#define OutboxInsertIndexTuples(rri, slot, estate) \
	ExecInsertIndexTuples((rri), (slot), (estate), false, false, NULL, NIL, false)
#else
#define OutboxInsertIndexTuples(rri, slot, estate) \
	ExecInsertIndexTuples((rri), (slot), (estate), false, false, NULL, NIL)
#endif


/* ---- 1.8 A row updated without the executor --------------------------
 *
 * 16 made table_tuple_update()'s "update the indexes" answer an enum
 * (TU_None, TU_All, TU_Summarizing: a HOT update may still need its
 * summarizing indexes) where 15 had a bool; ExecInsertIndexTuples() then
 * takes onlySummarizing.  Its "update" flag asks each index whether the
 * update left its key alone (a hint for btree's bottom-up deletion); with
 * no range table the caller answers it first (IndexInfo's
 * ii_CheckedUnchanged).  18 gave index_beginscan() an instrumentation
 * argument (NULL: none).
 */
#include "access/tableam.h"
#if PG_VERSION_NUM >= 160000
typedef TU_UpdateIndexes OutboxUpdateIndexes;
#define OutboxUpdateNeedsIndexes(u)	((u) != TU_None)
#define OutboxUpdateIndexTuples(rri, slot, estate, u) \
	ExecInsertIndexTuples((rri), (slot), (estate), true, false, NULL, NIL, \
						  (u) == TU_Summarizing)
#else
typedef bool OutboxUpdateIndexes;
#define OutboxUpdateNeedsIndexes(u)	(u)
#define OutboxUpdateIndexTuples(rri, slot, estate, u) \
	ExecInsertIndexTuples((rri), (slot), (estate), true, false, NULL, NIL)
#endif
#include "access/genam.h"
#if PG_VERSION_NUM >= 180000
#define OutboxIndexBeginScan(heap, index, snapshot, nkeys) \
	index_beginscan((heap), (index), (snapshot), NULL, (nkeys), 0)
#else
#define OutboxIndexBeginScan(heap, index, snapshot, nkeys) \
	index_beginscan((heap), (index), (snapshot), (nkeys), 0)
#endif

/* ---- 1.9 Pinning a buffer that may still hold a block -------------------
 *
 * 16 renamed RelFileNode (rd_node) to RelFileLocator (rd_locator), which
 * ReadRecentBuffer() takes.  OutboxReadRecentBuffer(rel, block, buffer):
 * whether buffer still holds that block of rel's main fork, now pinned.
 */
#include "storage/bufmgr.h"
#include "utils/rel.h"
#if PG_VERSION_NUM >= 160000
#define OutboxReadRecentBuffer(rel, block, buffer) \
	ReadRecentBuffer((rel)->rd_locator, MAIN_FORKNUM, (block), (buffer))
#else
#define OutboxReadRecentBuffer(rel, block, buffer) \
	ReadRecentBuffer((rel)->rd_node, MAIN_FORKNUM, (block), (buffer))
#endif

/* ---- 1.10 An extension's schema ---------------------------------------
 *
 * 17 exports get_extension_schema(); before, it is static in extension.c,
 * and OutboxExtensionSchema(extoid) reads pg_extension as it does.
 * InvalidOid when there is no such extension.
 */
#if PG_VERSION_NUM >= 170000
#include "commands/extension.h"
#define OutboxExtensionSchema(extoid) get_extension_schema(extoid)
#else
#include "access/genam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "catalog/pg_extension.h"
#include "utils/fmgroids.h"
static inline Oid
OutboxExtensionSchema(Oid extoid)
{
	Relation	rel = table_open(ExtensionRelationId, AccessShareLock);
	ScanKeyData key;
	SysScanDesc scan;
	HeapTuple	tup;
	Oid			nsp = InvalidOid;

	ScanKeyInit(&key, Anum_pg_extension_oid, BTEqualStrategyNumber, F_OIDEQ,
				ObjectIdGetDatum(extoid));
	scan = systable_beginscan(rel, ExtensionOidIndexId, true, NULL, 1, &key);
	tup = systable_getnext(scan);
	if (HeapTupleIsValid(tup))
		nsp = ((Form_pg_extension) GETSTRUCT(tup))->extnamespace;
	systable_endscan(scan);
	table_close(rel, AccessShareLock);
	return nsp;
}
#endif

/* ========================================================================
 * Part 2: librdkafka
 * ========================================================================
 *
 * Every call outbox makes exists and behaves alike from 2.0.2 on.  Versions
 * are 0xMMmmrrxx, as RD_KAFKA_VERSION and rd_kafka_version() give them.
 * Only producer.c includes rdkafka.h, so only producer.c expands these.
 */

/* ---- 2.1 a known crash on topic errors --------------------------------
 *
 * OutboxRdkafkaKnownCrash(): the version text of the librdkafka loaded at
 * run time when it is one that can crash in its own main thread on a metadata answer
 * carrying a topic-level error together with the topic's partitions: it
 * then updates leaders for partitions it has not set up (librdkafka issue
 * 4907, fixed in 2.10.0).  Seen here with trixie's 2.8.0 against the test
 * broker, which answers topic errors that way; a real Kafka 3.9 broker
 * answers an unauthorized or unknown topic with no partitions, and 2.8.0
 * took that without harm.  Bookworm's 2.0.2 and sid's 2.14.2 are not
 * affected.  NULL for every other version.  The relay warns once at start
 * where it is not NULL.
 */
#define OutboxRdkafkaKnownCrash() \
	(rd_kafka_version() >= 0x02080000 && rd_kafka_version() < 0x020a0000 ? \
	 rd_kafka_version_str() : NULL)


/* ========================================================================
 * Part 3: C library
 * ========================================================================
 */

/* ---- 3.1 malloc tuning ------------------------------------------------
 *
 * OutboxMallocKeep(bytes): ask malloc to keep up to bytes of freed memory
 * rather than handing it back to the kernel, and to serve allocations below
 * that size from the heap.  It also turns glibc's fast bins off: librdkafka
 * allocates each message and each of its headers apart and frees them at
 * its delivery report, a page of them at a time, and with fast bins on,
 * nearly every such free that joins the top of the heap walks all of them
 * (malloc_consolidate: 5% of the relay's samples in a profile of a drain of
 * 1,000,000 events, test/bench/run-bench --sections=drain --profile).  The per-thread cache still serves the small sizes.  glibc only
 * (mallopt); elsewhere a no-op, which costs speed, not correctness.
 */
#ifdef __GLIBC__
#include <malloc.h>
#define OutboxMallocKeep(bytes) \
	do { \
		mallopt(M_TRIM_THRESHOLD, (bytes)); \
		mallopt(M_MMAP_THRESHOLD, (bytes)); \
		mallopt(M_MXFAST, 0); \
	} while (0)
#else
#define OutboxMallocKeep(bytes) ((void) (bytes))
#endif

/* ---- 3.2 handing idle memory back -------------------------------------
 *
 * OutboxMallocRelease(): give the kernel the freed memory malloc kept
 * (OutboxMallocKeep).  glibc only (malloc_trim); elsewhere a no-op.
 *
 * OutboxUnmapRange(start, len): drop this process's page-table entries for
 * the aligned inside of [start, start + len) of a shared mapping, as
 * madvise(MADV_DONTNEED) does.  For shared anonymous, System V and file
 * mappings the contents stay in the shared object, and the next access maps
 * them again: nothing is lost, nothing changes for other processes.  The
 * range is first aligned to 2 MB, which fits 4 kB pages and 2 MB huge
 * pages; if the kernel refuses it (EINVAL: 1 GB huge pages, which need
 * their own alignment, or a kernel before 5.18, which refuses huge pages
 * whatever the alignment), it is tried once more aligned to 1 GB.  Returns
 * 0, or an errno; Linux only (elsewhere ENOSYS), where it is what it is for.
 */
#ifdef __GLIBC__
#define OutboxMallocRelease()	((void) malloc_trim(0))
#else
#define OutboxMallocRelease()	((void) 0)
#endif

#ifdef __linux__
#include <sys/mman.h>
#endif
#if defined(__linux__) && defined(MADV_DONTNEED)
static inline int
OutboxUnmapAligned(void *start, size_t len, uintptr_t align)
{
	uintptr_t	from = ((uintptr_t) start + align - 1) & ~(align - 1);
	uintptr_t	to = ((uintptr_t) start + len) & ~(align - 1);

	if (to <= from)
		return 0;
	return madvise((void *) from, to - from, MADV_DONTNEED) == 0 ? 0 : errno;
}

static inline int
OutboxUnmapRange(void *start, size_t len)
{
	int			err = OutboxUnmapAligned(start, len, (uintptr_t) 1 << 21);

	if (err == EINVAL)
		err = OutboxUnmapAligned(start, len, (uintptr_t) 1 << 30);
	return err;
}
#else
#define OutboxUnmapRange(start, len)	ENOSYS
#endif

#endif							/* OUTBOX_COMPAT_H */
