/*-------------------------------------------------------------------------
 *
 * consumer/subscribe.c
 *		The SQL side of subscriptions, in user backends: subscribe(),
 *		unsubscribe(), subscription_seek(), the trigger that tells the
 *		launcher at commit, and inbox_wake() (subscription_status.c shows
 *		them).
 *
 * Invariants:
 *	- subscribe() is SECURITY INVOKER: the subscription's owner is the
 *	  role calling it (GetUserId()), which must be allowed to execute the
 *	  handler.  Only the row's insert runs with the extension owner's
 *	  rights (the caller has none on outbox.subscriptions), with a pinned
 *	  search_path and every name qualified.
 *	- unsubscribe() is allowed to the owner's members and superusers only;
 *	  subscription_seek() (the group's offsets) to those of all its owners.
 *	- Shared memory hears of a subscription only at commit (a statement
 *	  trigger's names, kept until then); the worker reads the row itself,
 *	  so a slot is a cue, never the truth.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_authid.h"
#include "catalog/pg_proc.h"
#include "catalog/pg_type.h"
#include "commands/dbcommands.h"
#include "commands/trigger.h"
#include "executor/spi.h"
#include "funcapi.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "utils/acl.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/regproc.h"
#include "utils/syscache.h"

#include "base/compat.h"
#include "base/base.h"
#include "shmem/shmem.h"
#include "emit/emit.h"
#include "consumer/consumer.h"

PG_FUNCTION_INFO_V1(outbox_subscribe);
PG_FUNCTION_INFO_V1(outbox_unsubscribe);
PG_FUNCTION_INFO_V1(outbox_subscription_seek);
PG_FUNCTION_INFO_V1(outbox_subscriptions_changed);
PG_FUNCTION_INFO_V1(outbox_inbox_wake);

#define TOPICS_MAX 64

/* names to tell shared memory about at commit (TopTransactionContext) */
static List *changed_names = NIL;
static List *woken_names = NIL;
static bool callback_registered = false;

static void
subscribe_xact_callback(XactEvent event, void *arg)
{
	ListCell   *lc;

	switch (event)
	{
		case XACT_EVENT_PRE_PREPARE:
			/* COMMIT PREPARED, elsewhere, could not tell the launcher */
			if (changed_names != NIL)
				ereport(ERROR,
						(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
						 errmsg("cannot PREPARE a transaction that changed outbox subscriptions")));
			break;
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_PARALLEL_COMMIT:
		case XACT_EVENT_PREPARE:
			foreach(lc, changed_names)
				if (OutboxShmemAvailable() &&
					!OutboxInboxRequest(MyDatabaseId, (char *) lfirst(lc), true))
					ereport(WARNING,
							(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
							 errmsg("outbox subscription \"%s\" has no worker: all outbox.max_subscriptions slots are taken",
									(char *) lfirst(lc)),
							 errhint("Raise outbox.max_subscriptions and restart the server.")));
			foreach(lc, woken_names)
				OutboxInboxWake(MyDatabaseId, (char *) lfirst(lc));
			changed_names = woken_names = NIL;
			break;
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PARALLEL_ABORT:
			changed_names = woken_names = NIL;
			break;
		default:
			break;
	}
}

static void
remember(List **list, const char *name)
{
	MemoryContext old;
	ListCell   *lc;

	if (!callback_registered)
	{
		RegisterXactCallback(subscribe_xact_callback, NULL);
		callback_registered = true;
	}
	foreach(lc, *list)
		if (strcmp((char *) lfirst(lc), name) == 0)
			return;
	old = MemoryContextSwitchTo(TopTransactionContext);
	*list = lappend(*list, pstrdup(name));
	MemoryContextSwitchTo(old);
}

static bool
name_is_valid(const char *name)
{
	int			len = strlen(name);
	int			i;

	if (len < 1 || len > OUTBOX_SUBSCRIPTION_NAME_MAX - 1)
		return false;
	for (i = 0; i < len; i++)
	{
		char		c = name[i];

		if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' ||
			  (i > 0 && (c == '.' || c == '-'))))
			return false;
	}
	return true;
}

/*
 * OutboxAsOwnerBegin / OutboxAsOwnerEnd
 *		Run the SQL between them with the extension's owner's rights (the
 *		bootstrap superuser who owns its tables) and a pinned search_path.
 */
void
OutboxAsOwnerBegin(OutboxAsOwner *save)
{
	GetUserIdAndSecContext(&save->user, &save->sec);
	SetUserIdAndSecContext(BOOTSTRAP_SUPERUSERID, save->sec | SECURITY_LOCAL_USERID_CHANGE);
	save->nestlevel = NewGUCNestLevel();
	(void) set_config_option("search_path", "pg_catalog, pg_temp", PGC_USERSET,
							 PGC_S_SESSION, GUC_ACTION_SAVE, true, 0, false);
}

void
OutboxAsOwnerEnd(OutboxAsOwner *save)
{
	AtEOXact_GUC(false, save->nestlevel);
	SetUserIdAndSecContext(save->user, save->sec);
}

/*
 * check_database_limit
 *		Refuse a subscription past outbox.max_subscriptions_per_database:
 *		one database must not take every worker.  Run inside SPI, after
 *		the lock that serializes subscribe(), so that two sessions cannot
 *		both take the last place.  A subscription of the same name is left
 *		out of the count: the insert reports it.
 */
static void
check_database_limit(const char *name)
{
	bool		isnull;
	int64		n;

	OutboxSpiExecText("SELECT pg_catalog.count(*) FROM outbox.subscriptions s"
					  " WHERE s.name OPERATOR(pg_catalog.<>) $1",
					  name, true, 1, SPI_OK_SELECT, "counting the subscriptions");
	if (SPI_processed != 1)
		elog(ERROR, "counting the subscriptions returned %d rows", (int) SPI_processed);
	n = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
	if (n >= outbox_max_subscriptions_per_database)
		ereport(ERROR,
				(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
				 errmsg("too many subscriptions in database \"%s\"",
						get_database_name(MyDatabaseId)),
				 errdetail("The database has " INT64_FORMAT " subscriptions and outbox.max_subscriptions_per_database is %d.",
						   n, outbox_max_subscriptions_per_database),
				 errhint("Unsubscribe one, or raise outbox.max_subscriptions_per_database and reload the server configuration.")));
}

/* the topics argument of subscribe(): 1 to TOPICS_MAX legal, distinct names */
static void
check_topics(ArrayType *topics)
{
	Datum	   *elems;
	bool	   *elem_nulls;
	int			ntopics;
	int			i;
	int			j;

	if (ARR_NDIM(topics) > 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("topics must be a one-dimensional array")));
	deconstruct_array(topics, TEXTOID, -1, false, TYPALIGN_INT, &elems, &elem_nulls, &ntopics);
	if (ntopics < 1 || ntopics > TOPICS_MAX)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("a subscription has 1 to %d topics, not %d", TOPICS_MAX, ntopics)));
	for (i = 0; i < ntopics; i++)
	{
		char	   *t;

		if (elem_nulls[i])
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("topics must not contain null")));
		t = TextDatumGetCString(elems[i]);
		if (!OutboxTopicNameIsLegal(t))
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("invalid Kafka topic name \"%.100s\"", t),
					 errdetail("A topic name has 1 to 249 characters from [A-Za-z0-9._-] and is not \".\" or \"..\"; patterns are not accepted.")));
		for (j = 0; j < i; j++)
			if (strcmp(t, TextDatumGetCString(elems[j])) == 0)
				ereport(ERROR,
						(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
						 errmsg("topic \"%s\" is named twice", t)));
	}
}

/*
 * check_handler_arg
 *		The handler argument of subscribe(): a function that can be a
 *		handler and that the caller may execute.  Returns its owner.
 */
static Oid
check_handler_arg(Oid handler, Oid caller)
{
	char	   *problem;
	Oid			proowner = InvalidOid;

	if (!OutboxCheckHandler(handler, OutboxInboundType(), &proowner, &problem))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_FUNCTION_DEFINITION),
				 errmsg("%s", problem),
				 errhint("A handler is a function (m outbox.inbound_message) returning void or any single value.")));
	if (!OutboxRoleMayExecute(caller, handler))
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("permission denied for function %s", format_procedure_qualified(handler)),
				 errdetail("The handler runs as the role that subscribes, which must be allowed to execute it.")));
	return proowner;
}

/*
 * claim_group
 *		Make group_id the caller's, or check that it may join it (as the
 *		extension's owner, inside SPI, with outbox.subscriptions locked).
 *		A group's offsets, dedupe rows and dead letters are its members'
 *		shared state and outlive its subscriptions: the group stays its
 *		first subscriber's until unsubscribe(purge => true) removes it.
 */
static void
claim_group(const char *group_id, Oid caller)
{
	Oid			types[2] = {TEXTOID, OIDOID};
	Datum		args[2];
	bool		isnull;
	Oid			owner = InvalidOid;
	uint64		k;

	args[0] = CStringGetTextDatum(group_id);
	args[1] = ObjectIdGetDatum(caller);
	OutboxSpiExec("INSERT INTO outbox.inbox_groups (group_id, owner)"
				  " VALUES ($1, $2::pg_catalog.regrole) ON CONFLICT (group_id) DO NOTHING",
				  2, types, args, NULL, false, 0, SPI_OK_INSERT, "recording the consumer group");

	/*
	 * The group's owner, and the owners of its subscriptions (a row a
	 * superuser inserted by hand has no group row of its own).
	 */
	OutboxSpiExecText("SELECT g.owner::pg_catalog.oid FROM outbox.inbox_groups g"
					  " WHERE g.group_id OPERATOR(pg_catalog.=) $1"
					  " UNION ALL SELECT s.owner::pg_catalog.oid FROM outbox.subscriptions s"
					  " WHERE s.group_id OPERATOR(pg_catalog.=) $1",
					  group_id, false, 0, SPI_OK_SELECT, "reading the consumer group");
	for (k = 0; k < SPI_processed && !OidIsValid(owner); k++)
	{
		Oid			o = DatumGetObjectId(SPI_getbinval(SPI_tuptable->vals[k],
													   SPI_tuptable->tupdesc, 1, &isnull));

		if (!has_privs_of_role(caller, o))
			owner = o;
	}
	if (OidIsValid(owner))
	{
		char	   *name = GetUserNameFromId(owner, true);

		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("consumer group \"%s\" belongs to another role", group_id),
				 errdetail("Consumer group \"%s\" is owned by %s%s%s; its subscriptions share its offsets, dedupe rows and dead letters, which outlive them.",
						   group_id, name ? "role \"" : "a dropped role",
						   name ? name : "", name ? "\"" : ""),
				 errhint("Choose another group_id, or have the group's owner remove it with outbox.unsubscribe(name, purge => true).")));
	}
}

/* subscribe()'s arguments, checked */
typedef struct SubscribeArgs
{
	char	   *name;
	Oid			handler;
	Oid			handler_owner;	/* the handler's owner now */
	char	   *group_id;
	char	   *start_from;
	char	   *policy;
	int			batch_size;
} SubscribeArgs;

/*
 * check_names
 *		subscribe()'s name, topics, handler and group_id, into *a: the
 *		caller (owner) must be allowed to execute the handler.
 */
static void
check_names(FunctionCallInfo fcinfo, SubscribeArgs *a, Oid owner)
{
	int			i;

	for (i = 0; i < 3; i++)
		if (PG_ARGISNULL(i))
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("%s must not be null", i == 0 ? "name" : i == 1 ? "topics" : "handler")));
	a->name = text_to_cstring(PG_GETARG_TEXT_PP(0));
	if (!name_is_valid(a->name))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid subscription name \"%.100s\"", a->name),
				 errdetail("A subscription name has 1 to %d characters from [a-z0-9_.-] and starts with a letter, digit or underscore.",
						   OUTBOX_SUBSCRIPTION_NAME_MAX - 1)));
	check_topics(PG_GETARG_ARRAYTYPE_P(1));
	a->handler = PG_GETARG_OID(2);
	a->handler_owner = check_handler_arg(a->handler, owner);

	a->group_id = PG_ARGISNULL(3) ? a->name : text_to_cstring(PG_GETARG_TEXT_PP(3));
	/* its dedupe rows are consumer 'outbox;<group_id>', of 200 characters at most */
	if (strlen(a->group_id) < 1 ||
		pg_mbstrlen_with_len(a->group_id, strlen(a->group_id)) > 193 ||
		!pg_verify_mbstr(GetDatabaseEncoding(), a->group_id, strlen(a->group_id), true))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("group_id must have 1 to 193 characters")));
}

/*
 * check_options
 *		subscribe()'s start_from, max_attempts, poison_policy and
 *		batch_size, into *a; then whether a slot is free for a worker.
 */
static void
check_options(FunctionCallInfo fcinfo, SubscribeArgs *a)
{
	a->start_from = PG_ARGISNULL(4) ? "earliest" : text_to_cstring(PG_GETARG_TEXT_PP(4));
	if (strcmp(a->start_from, "earliest") != 0 && strcmp(a->start_from, "latest") != 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("start_from must be 'earliest' or 'latest', not \"%.20s\"", a->start_from)));
	if (!PG_ARGISNULL(5) && (PG_GETARG_INT32(5) < 1 || PG_GETARG_INT32(5) > OUTBOX_MAX_ATTEMPTS_LIMIT))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("max_attempts must be between 1 and %d", OUTBOX_MAX_ATTEMPTS_LIMIT)));
	a->policy = PG_ARGISNULL(6) ? "block" : text_to_cstring(PG_GETARG_TEXT_PP(6));
	if (strcmp(a->policy, "block") != 0 && strcmp(a->policy, "skip") != 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("poison_policy must be 'block' or 'skip', not \"%.20s\"", a->policy)));
	a->batch_size = PG_ARGISNULL(7) ? 500 : PG_GETARG_INT32(7);
	if (a->batch_size < 1 || a->batch_size > 10000)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("batch_size must be between 1 and 10000")));
	if (OutboxShmemAvailable() && !OutboxInboxHasRoom(MyDatabaseId, a->name))
		ereport(ERROR,
				(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
				 errmsg("all %d subscription slots are taken", outbox_max_subscriptions),
				 errhint("Raise outbox.max_subscriptions and restart the server.")));
}

/*
 * insert_subscription
 *		Insert the row of the checked arguments a, owned by owner, as the
 *		extension's owner: after the group is claimed and the database's
 *		limit checked, with outbox.subscriptions locked against another
 *		subscribe() meanwhile.
 */
static void
insert_subscription(FunctionCallInfo fcinfo, const SubscribeArgs *a, Oid owner)
{
	Oid			types[10] = {TEXTOID, TEXTARRAYOID, TEXTOID, OIDOID, TEXTOID, TEXTOID,
	INT4OID, TEXTOID, INT4OID, OIDOID};
	Datum		args[10];
	char		nulls[10] = {' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' '};
	OutboxAsOwner save;

	args[0] = CStringGetTextDatum(a->name);
	args[1] = PG_GETARG_DATUM(1);
	/* schema-qualified: the worker finds it with an empty search_path */
	args[2] = CStringGetTextDatum(format_procedure_qualified(a->handler));
	args[3] = ObjectIdGetDatum(owner);
	args[4] = CStringGetTextDatum(a->group_id);
	args[5] = CStringGetTextDatum(a->start_from);
	args[6] = PG_ARGISNULL(5) ? (Datum) 0 : Int32GetDatum(PG_GETARG_INT32(5));
	if (PG_ARGISNULL(5))
		nulls[6] = 'n';
	args[7] = CStringGetTextDatum(a->policy);
	args[8] = Int32GetDatum(a->batch_size);
	args[9] = ObjectIdGetDatum(a->handler_owner);

	OutboxAsOwnerBegin(&save);
	SPI_connect();
	/* two roles subscribing to one new group at once: one waits */
	if (SPI_execute("LOCK TABLE outbox.subscriptions IN SHARE ROW EXCLUSIVE MODE", false, 0) != SPI_OK_UTILITY)
		elog(ERROR, "locking the subscriptions failed");
	claim_group(a->group_id, owner);
	check_database_limit(a->name);
	OutboxSpiExec("INSERT INTO outbox.subscriptions (name, topics, handler, owner, group_id,"
				  " start_from, max_attempts, poison_policy, batch_size, handler_owner)"
				  " VALUES ($1, $2, $3, $4::pg_catalog.regrole, $5,"
				  " $6, $7, $8, $9, $10::pg_catalog.regrole)"
				  " ON CONFLICT (name) DO NOTHING",
				  10, types, args, nulls, false, 0, SPI_OK_INSERT, "inserting the subscription");
	if (SPI_processed == 0)
		ereport(ERROR,
				(errcode(ERRCODE_DUPLICATE_OBJECT),
				 errmsg("subscription \"%s\" already exists", a->name),
				 errhint("Call outbox.unsubscribe('%s') first, in the same transaction to change it.", a->name)));
	SPI_finish();
	OutboxAsOwnerEnd(&save);
}

/*
 * outbox_subscribe
 *		SQL outbox.subscribe(name, topics, handler, group_id, start_from,
 *		max_attempts, poison_policy, batch_size).
 */
Datum
outbox_subscribe(PG_FUNCTION_ARGS)
{
	SubscribeArgs a;
	Oid			owner = GetUserId();

	check_names(fcinfo, &a, owner);
	check_options(fcinfo, &a);
	if (!OidIsValid(get_relname_relid("inbox_groups", get_namespace_oid("outbox", false))))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("%s", OUTBOX_OLD_SQL_PROBLEM),
				 errhint("Run ALTER EXTENSION outbox UPDATE in this database.")));
	insert_subscription(fcinfo, &a, owner);
	if (!OutboxShmemAvailable())
		ereport(WARNING,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("outbox is not in shared_preload_libraries: no worker will apply subscription \"%s\"", a.name),
				 errhint("Add outbox to shared_preload_libraries and restart the server.")));
	PG_RETURN_VOID();
}

/*
 * purge_group
 *		Remove a consumer group's state and its ownership (as the
 *		extension's owner, inside SPI), once no subscription uses it; for
 *		roles with the privileges of the group's owner.
 */
static void
purge_group(const char *group_id, Oid caller)
{
	/* $1: the group; its ownership row goes last */
	static const char *const group_state[] = {
		"DELETE FROM outbox.inbox_offsets WHERE consumer_group OPERATOR(pg_catalog.=) $1",
		"DELETE FROM outbox.inbox_dead_letters WHERE consumer_group OPERATOR(pg_catalog.=) $1",
		"DELETE FROM outbox.inbox WHERE consumer OPERATOR(pg_catalog.=) ANY"
		" (ARRAY['outbox:' OPERATOR(pg_catalog.||) $1, 'outbox;' OPERATOR(pg_catalog.||) $1])",
		"DELETE FROM outbox.inbox_groups WHERE group_id OPERATOR(pg_catalog.=) $1",
	};
	bool		isnull;
	int			i;

	OutboxSpiExecText("SELECT g.owner::pg_catalog.oid FROM outbox.inbox_groups g"
					  " WHERE g.group_id OPERATOR(pg_catalog.=) $1 FOR UPDATE",
					  group_id, false, 1, SPI_OK_SELECT, "reading the consumer group");
	if (SPI_processed > 0 &&
		!has_privs_of_role(caller, DatumGetObjectId(SPI_getbinval(SPI_tuptable->vals[0],
																  SPI_tuptable->tupdesc, 1, &isnull))))
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("must be a member of the role that owns consumer group \"%s\" to purge it", group_id)));
	OutboxSpiExecText("SELECT s.name FROM outbox.subscriptions s"
					  " WHERE s.group_id OPERATOR(pg_catalog.=) $1 ORDER BY s.name LIMIT 1",
					  group_id, false, 1, SPI_OK_SELECT, "reading the group's subscriptions");
	if (SPI_processed > 0)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_IN_USE),
				 errmsg("consumer group \"%s\" is still used by subscription \"%s\"", group_id,
						SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1)),
				 errhint("Unsubscribe the group's other subscriptions first, or unsubscribe without purge.")));
	for (i = 0; i < lengthof(group_state); i++)
		OutboxSpiExecText(group_state[i],
						  group_id, false, 0, SPI_OK_DELETE, "removing the consumer group's state");
}

/*
 * outbox_unsubscribe
 *		SQL outbox.unsubscribe(name [, purge]): true when it removed the
 *		subscription.  With purge, its group's state goes too.
 */
Datum
outbox_unsubscribe(PG_FUNCTION_ARGS)
{
	char	   *name = text_to_cstring(PG_GETARG_TEXT_PP(0));
	bool		purge = PG_NARGS() > 1 && PG_GETARG_BOOL(1);
	OutboxAsOwner save;
	Oid			caller = GetUserId();
	Oid			owner = InvalidOid;
	char	   *group_id = NULL;
	bool		isnull;
	bool		found;

	OutboxAsOwnerBegin(&save);
	SPI_connect();
	OutboxSpiExecText("SELECT s.owner::pg_catalog.oid, s.group_id FROM outbox.subscriptions s"
					  " WHERE s.name OPERATOR(pg_catalog.=) $1 FOR UPDATE",
					  name, false, 1, SPI_OK_SELECT, "reading the subscription");
	found = SPI_processed > 0;
	if (found)
	{
		owner = DatumGetObjectId(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
		group_id = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2);
	}
	if (found && !has_privs_of_role(caller, owner))
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("must be a member of the role that owns subscription \"%s\"", name)));
	if (found)
		OutboxSpiExecText("DELETE FROM outbox.subscriptions WHERE name OPERATOR(pg_catalog.=) $1",
						  name, false, 0, SPI_OK_DELETE, "deleting the subscription");
	if (found && purge)
		purge_group(group_id, caller);
	SPI_finish();
	OutboxAsOwnerEnd(&save);
	PG_RETURN_BOOL(found);
}

/*
 * seek_check
 *		The group of subscription name, after checking that it consumes
 *		topic and that caller has the privileges of every owner in the
 *		group, whose workers restart at commit (remembered).  Runs
 *		connected to SPI as the extension's owner, and ends both before an
 *		error.  The result is palloc'd in outer.
 */
static char *
seek_check(const char *name, const char *topic, Oid caller, OutboxAsOwner *save,
		   MemoryContext outer)
{
	Oid			types[2] = {TEXTOID, TEXTOID};
	Datum		args[2];
	bool		isnull;
	char	   *group_id = NULL;
	char	   *refused = NULL;
	bool		consumes = false;
	uint64		i;

	args[0] = CStringGetTextDatum(name);
	args[1] = CStringGetTextDatum(topic);
	/* FOR SHARE: the group's rows stay until commit */
	OutboxSpiExec("SELECT s.name, s.owner::pg_catalog.oid, s.group_id,"
				  " s.name OPERATOR(pg_catalog.=) $1 AND $2 OPERATOR(pg_catalog.=) ANY (s.topics)"
				  " FROM outbox.subscriptions s WHERE s.group_id OPERATOR(pg_catalog.=) ("
				  "  SELECT g.group_id FROM outbox.subscriptions g WHERE g.name OPERATOR(pg_catalog.=) $1)"
				  " ORDER BY s.name FOR SHARE",
				  2, types, args, NULL, false, 0, SPI_OK_SELECT,
				  "reading the subscription's group");
	for (i = 0; i < SPI_processed; i++)
	{
		HeapTuple	t = SPI_tuptable->vals[i];
		char	   *member = TextDatumGetCString(SPI_getbinval(t, SPI_tuptable->tupdesc, 1, &isnull));

		if (refused == NULL &&
			!has_privs_of_role(caller, DatumGetObjectId(SPI_getbinval(t, SPI_tuptable->tupdesc, 2, &isnull))))
			refused = MemoryContextStrdup(outer, member);
		group_id = MemoryContextStrdup(outer, TextDatumGetCString(SPI_getbinval(t, SPI_tuptable->tupdesc, 3, &isnull)));
		consumes |= DatumGetBool(SPI_getbinval(t, SPI_tuptable->tupdesc, 4, &isnull));
		remember(&changed_names, member);
	}
	if (group_id == NULL || refused != NULL || !consumes)
	{
		SPI_finish();
		OutboxAsOwnerEnd(save);
	}
	if (group_id == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("subscription \"%s\" does not exist", name)));
	if (refused != NULL)
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("must be a member of the role that owns subscription \"%s\"", refused),
				 errdetail("The subscriptions of consumer group \"%s\" share its offsets.", group_id)));
	if (!consumes)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("subscription \"%s\" does not consume topic \"%s\"", name, topic)));
	return group_id;
}

/*
 * outbox_subscription_seek
 *		SQL outbox.subscription_seek(subscription, topic, kafka_partition,
 *		next_offset): set the consumer group's next offset of one partition;
 *		at commit the group's workers start again and take it.
 */
Datum
outbox_subscription_seek(PG_FUNCTION_ARGS)
{
	static const char *const argnames[] = {"subscription", "topic", "kafka_partition", "next_offset"};
	Oid			types[4] = {TEXTOID, TEXTOID, INT4OID, INT8OID};
	Datum		args[4];
	char	   *name;
	char	   *topic;
	OutboxAsOwner save;
	Oid			caller = GetUserId();
	MemoryContext outer = CurrentMemoryContext;
	int			i;

	for (i = 0; i < lengthof(argnames); i++)
		if (PG_ARGISNULL(i))
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("%s must not be null", argnames[i])));
	name = text_to_cstring(PG_GETARG_TEXT_PP(0));
	topic = text_to_cstring(PG_GETARG_TEXT_PP(1));
	if (PG_GETARG_INT32(2) < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("kafka_partition must not be negative")));
	if (PG_GETARG_INT64(3) < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("next_offset must not be negative"),
				 errhint("The next offset is that of the first message to apply: 0 for a log that starts over.")));

	OutboxAsOwnerBegin(&save);
	SPI_connect();
	args[0] = CStringGetTextDatum(seek_check(name, topic, caller, &save, outer));
	args[1] = CStringGetTextDatum(topic);
	args[2] = Int32GetDatum(PG_GETARG_INT32(2));
	args[3] = Int64GetDatum(PG_GETARG_INT64(3));
	OutboxSpiExec("INSERT INTO outbox.inbox_offsets (consumer_group, topic, kafka_partition, next_offset)"
				  " VALUES ($1, $2, $3, $4) ON CONFLICT (consumer_group, topic, kafka_partition)"
				  " DO UPDATE SET next_offset = excluded.next_offset, updated_at = pg_catalog.now(),"
				  " stopped_at = NULL",
				  4, types, args, NULL, false, 0, SPI_OK_INSERT, "setting the next offset");
	SPI_finish();
	OutboxAsOwnerEnd(&save);
	PG_RETURN_VOID();
}

/* the name column (1) of each row of a transition table */
static void
remember_names(Tuplestorestate *store, TupleDesc desc)
{
	TupleTableSlot *slot;

	if (store == NULL)
		return;
	slot = MakeSingleTupleTableSlot(desc, &TTSOpsMinimalTuple);
	tuplestore_rescan(store);
	while (tuplestore_gettupleslot(store, true, false, slot))
	{
		bool		isnull;
		Datum		d = slot_getattr(slot, 1, &isnull);

		if (!isnull)
			remember(&changed_names, TextDatumGetCString(d));
	}
	ExecDropSingleTupleTableSlot(slot);
}

/*
 * outbox_subscriptions_changed
 *		Statement trigger on outbox.subscriptions: the names written go to
 *		shared memory at commit, whoever wrote them (subscribe(), a restore,
 *		a superuser's own statement).
 */
Datum
outbox_subscriptions_changed(PG_FUNCTION_ARGS)
{
	TriggerData *trigdata = (TriggerData *) fcinfo->context;

	if (!CALLED_AS_TRIGGER(fcinfo))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("outbox_internal.subscriptions_changed() is a trigger")));
	remember_names(trigdata->tg_oldtable, RelationGetDescr(trigdata->tg_relation));
	remember_names(trigdata->tg_newtable, RelationGetDescr(trigdata->tg_relation));
	return PointerGetDatum(NULL);
}

/*
 * outbox_inbox_wake
 *		SQL outbox_internal.inbox_wake(subscription): at commit, the
 *		worker looks at its replays and parked keys.
 */
Datum
outbox_inbox_wake(PG_FUNCTION_ARGS)
{
	remember(&woken_names, text_to_cstring(PG_GETARG_TEXT_PP(0)));
	PG_RETURN_VOID();
}

/*
 * OutboxSubscriptionsAnnounce
 *		Probe: ask for a slot for each subscription of this database (in
 *		the caller's transaction; a database older than 1.5 has none).
 */
void
OutboxSubscriptionsAnnounce(void)
{
	uint64		i;
	Oid			nsp = get_namespace_oid("outbox", true);

	if (!OidIsValid(nsp) || !OidIsValid(get_relname_relid("subscriptions", nsp)))
		return;
	SPI_connect();
	if (SPI_execute("SELECT s.name FROM outbox.subscriptions s", true, 0) != SPI_OK_SELECT)
		elog(ERROR, "reading the subscriptions failed");
	for (i = 0; i < SPI_processed; i++)
	{
		bool		isnull;
		char	   *name = TextDatumGetCString(SPI_getbinval(SPI_tuptable->vals[i],
															 SPI_tuptable->tupdesc, 1, &isnull));

		if (!OutboxInboxRequest(MyDatabaseId, name, false))
			ereport(WARNING,
					(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
					 errmsg("outbox subscription \"%s\" has no worker: all outbox.max_subscriptions slots are taken",
							name)));
	}
	SPI_finish();
}

