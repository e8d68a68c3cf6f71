/*-------------------------------------------------------------------------
 *
 * launcher/utility.c
 *		The utility hook and its transaction callback.  They run in user
 *		backends, inside the user's commands, never in a worker.
 *
 * What it does:
 *	- A command that needs a database with no other connection (DROP
 *	  DATABASE, ALTER DATABASE ... RENAME TO / SET TABLESPACE, CREATE
 *	  DATABASE ... TEMPLATE) first stops that database's relay and holds it
 *	  off for OUTBOX_HOLD_MS (OutboxHoldDatabase).
 *	- CREATE EXTENSION outbox asks the launcher for a probe at commit, so
 *	  the relay starts at once; DROP EXTENSION outbox has the relay check
 *	  for its extension at commit, even while it is paused.
 *	- DROP EXTENSION outbox, and DROP SCHEMA outbox CASCADE, which drops
 *	  it too, are refused while committed events are not delivered (the
 *	  store counts them), unless outbox.allow_drop_undelivered is on or
 *	  pg_upgrade runs the command.
 *	- PREPARE TRANSACTION hands its gid to handoff.c; emit.c's PREPARE callback
 *	  hands the transaction's event count to OutboxNotePrepared, which
 *	  files it in shared memory under the gid.  COMMIT PREPARED takes the
 *	  count back and wakes the relay as a plain commit does.
 *
 * Invariants:
 *	- The hold is taken only for a command that will go on past its
 *	  checks: any login role can type DROP DATABASE, and a refused one must
 *	  not stop someone else's relay.  So the hook repeats the checks that
 *	  come first in the command itself (the database exists and is not the
 *	  current one, the caller owns it, may create databases, the command
 *	  runs outside a transaction block); if a later check refuses the
 *	  command, the relay is back after the hold.
 *	- Apart from the hold, which must come before the command runs,
 *	  nothing is told to the launcher or a relay before the command's
 *	  transaction commits.  What the hook noted for commit is dropped at
 *	  abort and at PREPARE TRANSACTION: COMMIT PREPARED of a CREATE or
 *	  DROP EXTENSION outbox tells nobody.
 *	- Nothing here runs SQL: it reads the catalogs through their caches
 *	  and calls relay_slots.c (holds, wake-ups), handoff.c (probes, prepared
 *	  counts) and the store (what a drop would delete).
 *	- Installed whenever the library is loaded: by the preload, and else
 *	  in a session once it loads it (CREATE EXTENSION, emit()).  Without
 *	  the preload there is no shared memory: the holds, probes and
 *	  wake-ups find none and do nothing; the drop is guarded all the same.
 *	  A session that has not loaded the library runs no hook at all.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "access/twophase.h"
#include "access/xact.h"
#include "access/xlog.h"
#include "catalog/namespace.h"
#include "catalog/pg_database.h"
#include "catalog/pg_extension.h"
#include "commands/dbcommands.h"
#include "commands/defrem.h"
#include "commands/extension.h"
#include "miscadmin.h"
#include "nodes/parsenodes.h"
#include "storage/lmgr.h"
#include "tcop/utility.h"
#include "utils/acl.h"
#include "utils/syscache.h"

#include "base/compat.h"
#include "base/base.h"
#include "shmem/shmem.h"
#include "store/store.h"
#include "launcher/launcher.h"

/* how long a command holds its database's relay off */
#define OUTBOX_HOLD_MS				10000

static ProcessUtility_hook_type prev_utility_hook = NULL;
static bool probe_at_commit = false;
static bool wake_at_commit = false;

/*
 * runs_outside_block
 *		Whether a command that calls PreventInTransactionBlock() will pass
 *		that check.
 */
static bool
runs_outside_block(ProcessUtilityContext context)
{
	return context == PROCESS_UTILITY_TOPLEVEL &&
		!IsTransactionBlock() && !IsSubTransaction();
}

/*
 * other_database
 *		The OID of database name if it exists and is not the current one
 *		(a command on the current database is refused), else InvalidOid.
 */
static Oid
other_database(const char *name)
{
	Oid			dboid;

	if (name == NULL)
		return InvalidOid;
	dboid = get_database_oid(name, true);
	if (dboid == MyDatabaseId)
		return InvalidOid;
	return dboid;
}

static bool
owns_database(Oid dboid)
{
	return OidIsValid(dboid) && OutboxDatabaseOwnercheck(dboid, GetUserId());
}

/* CREATE DATABASE ... TEMPLATE: whether the caller may copy dboid */
static bool
may_copy_database(Oid dboid)
{
	HeapTuple	tup;
	bool		is_template;

	if (!OidIsValid(dboid))
		return false;
	tup = SearchSysCache1(DATABASEOID, ObjectIdGetDatum(dboid));
	if (!HeapTupleIsValid(tup))
		return false;
	is_template = ((Form_pg_database) GETSTRUCT(tup))->datistemplate;
	ReleaseSysCache(tup);
	return is_template || owns_database(dboid);
}

static bool
has_option(List *options, const char *name, char **value)
{
	ListCell   *lc;

	foreach(lc, options)
	{
		DefElem    *def = (DefElem *) lfirst(lc);

		if (strcmp(def->defname, name) == 0)
		{
			if (value)
				*value = def->arg ? defGetString(def) : NULL;
			return true;
		}
	}
	return false;
}

/*
 * drops_outbox
 *		Whether stmt drops the extension: DROP EXTENSION outbox, or DROP
 *		SCHEMA outbox CASCADE (its schema, which the extension depends on).
 */
static bool
drops_outbox(DropStmt *stmt)
{
	ListCell   *lc;

	if (stmt->removeType != OBJECT_EXTENSION &&
		!(stmt->removeType == OBJECT_SCHEMA && stmt->behavior == DROP_CASCADE))
		return false;
	foreach(lc, stmt->objects)
		if (strcmp(strVal(lfirst(lc)), "outbox") == 0)
			return true;
	return false;
}

/*
 * may_drop_outbox
 *		Whether the command would get past its ownership check (a refused
 *		one needs no count, which the caller may not even read).
 */
static bool
may_drop_outbox(DropStmt *stmt, Oid extoid, Oid nsp)
{
	if (stmt->removeType == OBJECT_EXTENSION)
		return OutboxExtensionOwnercheck(extoid, GetUserId());
	/* DROP SCHEMA: when the extension is still in the schema of that name */
	return nsp == get_namespace_oid("outbox", true) &&
		OutboxSchemaOwnercheck(nsp, GetUserId());
}

/*
 * refuse_undelivered_drop
 *		Refuse stmt, which drops the extension, while committed events are
 *		not delivered: it would delete them.  Not when the setting allows
 *		it, in pg_upgrade (which restores the extension as it was), in a
 *		command refused anyway (recovery, read-only, not the owner).
 */
static void
refuse_undelivered_drop(DropStmt *stmt)
{
	Oid			extoid;
	Oid			nsp;
	OutboxUndelivered n;
	int64		total;

	if (outbox_allow_drop_undelivered || IsBinaryUpgrade ||
		RecoveryInProgress() || XactReadOnly)
		return;
	extoid = get_extension_oid("outbox", true);
	if (!OidIsValid(extoid))
		return;
	nsp = OutboxExtensionSchema(extoid);
	if (!OidIsValid(nsp) || !may_drop_outbox(stmt, extoid, nsp))
		return;
	/* the lock the drop takes first: concurrent drops queue before counting */
	LockDatabaseObject(ExtensionRelationId, extoid, 0, AccessExclusiveLock);
	OutboxStoreCountUndelivered(nsp, &n);
	total = n.waiting + n.held + n.dead;
	if (total == 0)
		return;
	ereport(ERROR,
			(errcode(ERRCODE_OBJECT_IN_USE),
			 errmsg_plural("cannot drop extension outbox while %lld committed event is not delivered to Kafka",
						   "cannot drop extension outbox while %lld committed events are not delivered to Kafka",
						   total, (long long) total),
			 errdetail("Waiting for the relay: %lld; held for a Kafka partition: %lld; "
					   "dead letters neither replayed nor discarded: %lld. "
					   "Dropping the extension deletes them.",
					   (long long) n.waiting, (long long) n.held, (long long) n.dead),
			 errhint("Let the relay deliver them and replay or discard the dead letters, "
					 "or run SET outbox.allow_drop_undelivered = on to drop them on purpose.")));
}

/*
 * database_to_hold
 *		The database whose relay node, about to run, needs out of the way,
 *		or InvalidOid: none, or the command will be refused anyway.
 */
static Oid
database_to_hold(Node *node, ProcessUtilityContext context)
{
	Oid			dboid;
	char	   *template = NULL;

	switch (nodeTag(node))
	{
		case T_DropdbStmt:
			dboid = other_database(((DropdbStmt *) node)->dbname);
			if (runs_outside_block(context) && owns_database(dboid))
				return dboid;
			break;
		case T_RenameStmt:
			if (((RenameStmt *) node)->renameType == OBJECT_DATABASE)
			{
				RenameStmt *stmt = (RenameStmt *) node;

				dboid = other_database(stmt->subname);
				/* RENAME may run in a transaction block */
				if (owns_database(dboid) && OutboxHaveCreatedbPrivilege() &&
					!OidIsValid(get_database_oid(stmt->newname, true)))
					return dboid;
			}
			break;
		case T_AlterDatabaseStmt:
			if (has_option(((AlterDatabaseStmt *) node)->options, "tablespace", NULL))
			{
				dboid = other_database(((AlterDatabaseStmt *) node)->dbname);
				if (runs_outside_block(context) && owns_database(dboid))
					return dboid;
			}
			break;
		case T_CreatedbStmt:
			if (has_option(((CreatedbStmt *) node)->options, "template", &template))
			{
				dboid = other_database(template);
				if (runs_outside_block(context) && OutboxHaveCreatedbPrivilege() &&
					!OidIsValid(get_database_oid(((CreatedbStmt *) node)->dbname, true)) &&
					may_copy_database(dboid))
					return dboid;
			}
			break;
		default:
			break;
	}
	return InvalidOid;
}

/*
 * note_for_commit
 *		Remember what node asks of the launcher or relay at commit, and the
 *		gid PREPARE TRANSACTION gives.  Returns the gid of a COMMIT or
 *		ROLLBACK PREPARED, else NULL.
 */
static const char *
note_for_commit(Node *node)
{
	TransactionStmt *stmt;

	if (IsA(node, CreateExtensionStmt) &&
		strcmp(((CreateExtensionStmt *) node)->extname, "outbox") == 0)
		probe_at_commit = true;
	else if (IsA(node, DropStmt) && drops_outbox((DropStmt *) node))
		wake_at_commit = true;
	else if (IsA(node, TransactionStmt))
	{
		stmt = (TransactionStmt *) node;
		if (stmt->kind == TRANS_STMT_PREPARE)
			OutboxPreparingGid(stmt->gid);
		else if (stmt->kind == TRANS_STMT_COMMIT_PREPARED ||
				 stmt->kind == TRANS_STMT_ROLLBACK_PREPARED)
			return stmt->gid;
	}
	return NULL;
}

static void
outbox_utility(PlannedStmt *pstmt, const char *queryString, bool readOnlyTree,
			   ProcessUtilityContext context, ParamListInfo params,
			   QueryEnvironment *queryEnv, DestReceiver *dest,
			   QueryCompletion *qc)
{
	Node	   *node = pstmt->utilityStmt;
	Oid			hold = database_to_hold(node, context);
	const char *finish_gid;

	if (OidIsValid(hold))
		OutboxHoldDatabase(hold, OUTBOX_HOLD_MS);
	if (IsA(node, DropStmt) && drops_outbox((DropStmt *) node))
		refuse_undelivered_drop((DropStmt *) node);
	finish_gid = note_for_commit(node);

	if (prev_utility_hook)
		prev_utility_hook(pstmt, queryString, readOnlyTree, context, params,
						  queryEnv, dest, qc);
	else
		standard_ProcessUtility(pstmt, queryString, readOnlyTree, context,
								params, queryEnv, dest, qc);

	/*
	 * The prepared transaction is committed now (it is out of the proc
	 * array, so a new snapshot sees it): wake the relay as its own commit
	 * would have, adding the events counted at PREPARE to the backlog.  A
	 * transaction prepared before a restart has no count: the relay counts
	 * its events when it opens its next batch, at once since it is woken.
	 * COMMIT PREPARED works only in the database of the transaction.
	 */
	if (finish_gid != NULL)
	{
		int			events;
		bool		replay;

		(void) OutboxPreparedTake(finish_gid, MyDatabaseId, &events, &replay);
		if (((TransactionStmt *) node)->kind == TRANS_STMT_COMMIT_PREPARED)
			OutboxWakeRelay(MyDatabaseId, replay, events);
	}
}

static void
utility_xact_callback(XactEvent event, void *arg)
{
	if (event == XACT_EVENT_COMMIT)
	{
		if (probe_at_commit)
			OutboxRequestProbe(MyDatabaseId);
		if (wake_at_commit)
			OutboxRequestExtensionCheck(MyDatabaseId);
	}
	if (event == XACT_EVENT_COMMIT || event == XACT_EVENT_ABORT ||
		event == XACT_EVENT_PREPARE)
		probe_at_commit = wake_at_commit = false;
	/* at PREPARE, emit.c's callback takes the gid (in whichever order) */
	if (event == XACT_EVENT_ABORT)
		OutboxPreparingGid(NULL);
}

/*
 * OutboxUtilityHookInstall
 *		Install the utility hook and its commit callback, once per process
 *		(by the preload, or in the session that loads the library).
 */
void
OutboxUtilityHookInstall(void)
{
	prev_utility_hook = ProcessUtility_hook;
	ProcessUtility_hook = outbox_utility;
	RegisterXactCallback(utility_xact_callback, NULL);
}
