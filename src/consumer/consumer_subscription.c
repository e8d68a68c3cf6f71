/*-------------------------------------------------------------------------
 *
 * consumer/consumer_subscription.c
 *		The subscription worker's row of outbox.subscriptions and its
 *		handler: read once at start-up, the handler checked again in
 *		every transaction that calls it.
 *
 * Invariants:
 *	- The handler runs as the subscription's owner, and only while the
 *	  owner exists, the name still finds a handler owned by the role that
 *	  owned it at subscribe(), and the owner may execute it
 *	  (OutboxSubscriberHandlerProblem).  Otherwise the worker says why and
 *	  waits for the subscription to change; it never runs a function
 *	  planted under a dropped handler's name.
 *	- A transaction that calls the handler holds the subscription's row
 *	  FOR KEY SHARE (OutboxSubscriberCheckHandler): unsubscribe() waits for
 *	  it, and the next transaction finds the row gone and stops the worker
 *	  before it writes into a group that may have been purged.
 *	- The Kafka group is this database's own (see read_row): two
 *	  databases with a group of one name never split its partitions.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xlog.h"
#include "catalog/namespace.h"
#include "catalog/pg_authid.h"
#include "catalog/pg_type.h"
#include "miscadmin.h"
#include "storage/ipc.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/syscache.h"
#include "utils/typcache.h"

#include "consumer/consumer_worker.h"
#include "base/base.h"
#include "shmem/shmem.h"
#include "store/store.h"
#include "consumer/consumer.h"

/*
 * OutboxSubscriberHandlerProblem
 *		Why the subscription's owner may not run its handler now, or NULL:
 *		the owner is gone, no function has the handler's name, it is no
 *		longer a handler, it is owned by another role than at subscribe()
 *		(a function planted under a dropped handler's name, or an ALTER
 *		FUNCTION ... OWNER TO), or the owner lost EXECUTE on it.  Sets
 *		w->sub.handler to the function the name finds now.  Reads the
 *		catalogs as they are in the caller's transaction.
 */
char *
OutboxSubscriberHandlerProblem(Worker *w)
{
	Subscription *s = &w->sub;
	char	   *problem;
	Oid			proowner = InvalidOid;

	if (!SearchSysCacheExists1(AUTHOID, ObjectIdGetDatum(s->owner)))
		return psprintf("the role that owns the subscription (OID %u) no longer exists", s->owner);
	s->handler = OutboxHandlerByName(s->handler_text);
	if (!OidIsValid(s->handler))
		return psprintf("handler %s does not exist", s->handler_text);
	if (!OutboxCheckHandler(s->handler, w->typid, &proowner, &problem))
		return problem;
	if (proowner != s->handler_owner)
	{
		char	   *now = GetUserNameFromId(proowner, true);
		char	   *then = GetUserNameFromId(s->handler_owner, true);

		return psprintf("handler %s is owned by role \"%s\", not by role \"%s\" as at subscribe(): subscribe again to run it",
						s->handler_text, now ? now : "?", then ? then : "?");
	}
	if (!OutboxRoleMayExecute(s->owner, s->handler))
	{
		char	   *role = GetUserNameFromId(s->owner, true);

		return psprintf("role \"%s\" may not execute handler %s", role ? role : "?",
						s->handler_text);
	}
	return NULL;
}

/*
 * OutboxSubscriberCheckHandler
 *		At the start of each transaction that calls the handler (inside
 *		SPI): the subscription's row is locked FOR KEY SHARE, so that
 *		unsubscribe() waits for this transaction and the next one finds the
 *		row gone (the worker then stops, and writes nothing more into a
 *		group that may have been purged).  ERROR (the worker stops, and
 *		waits for the subscription to change) when
 *		OutboxSubscriberHandlerProblem finds one; else the call info is
 *		made again, so that a change of the function (SECURITY DEFINER or
 *		INVOKER, its body) is seen by the next transaction, not at the
 *		worker's next start.  It lives in batch_cxt, reset before the next
 *		one.
 */
void
OutboxSubscriberCheckHandler(Worker *w)
{
	char	   *problem;

	OutboxSpiExecText("SELECT 1 FROM outbox.subscriptions s"
					  " WHERE s.name OPERATOR(pg_catalog.=) $1 FOR KEY SHARE",
					  w->sub.name, false, 1, SPI_OK_SELECT, "locking the subscription");
	if (SPI_processed == 0)
	{
		OutboxInboxMarkGone(w->slot);
		ereport(LOG, (errmsg("outbox subscription \"%s\" is gone: its worker stops", w->sub.name)));
		proc_exit(0);
	}
	problem = OutboxSubscriberHandlerProblem(w);

	if (problem != NULL)
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("outbox subscription \"%s\" may not run its handler: %s",
						w->sub.name, problem),
				 errdetail("The worker stops; it waits for the subscription to change.")));
	w->refused = false;
	fmgr_info_cxt(w->sub.handler, &w->handler, w->batch_cxt);
}

/* whether the group has dedupe rows of before 1.8, not scoped (see consumer_apply.c) */
static bool
has_legacy_rows(Worker *w)
{

	OutboxSpiExecText("SELECT 1 FROM outbox.inbox i WHERE i.consumer OPERATOR(pg_catalog.=) $1 LIMIT 1",
					  w->sub.legacy_name, true, 1, SPI_OK_SELECT, "reading the dedupe rows");
	return SPI_processed > 0;
}

/*
 * read_row
 *		Read the subscription's row into w->sub (in w->cxt), with the
 *		composite type its handler takes; false when there is none.
 */
static bool
read_row(Worker *w, const char *name)
{
	Subscription *s = &w->sub;
	bool		isnull;
	HeapTuple	tup;
	TupleDesc	desc;
	Datum		d;
	Datum	   *elems;
	int			i;
	MemoryContext old;

	OutboxSpiExecText("SELECT s.topics, s.handler, s.owner::pg_catalog.oid, s.group_id,"
					  " s.start_from, s.max_attempts, s.poison_policy, s.batch_size,"
					  " s.handler_owner::pg_catalog.oid"
					  " FROM outbox.subscriptions s WHERE s.name OPERATOR(pg_catalog.=) $1",
					  name, true, 1, SPI_OK_SELECT, "reading the subscription");
	if (SPI_processed == 0)
		return false;
	tup = SPI_tuptable->vals[0];
	desc = SPI_tuptable->tupdesc;

	old = MemoryContextSwitchTo(w->cxt);
	strlcpy(s->name, name, sizeof(s->name));
	d = SPI_getbinval(tup, desc, 1, &isnull);
	deconstruct_array(DatumGetArrayTypeP(d), TEXTOID, -1, false, TYPALIGN_INT,
					  &elems, NULL, &s->ntopics);
	s->topics = palloc(sizeof(char *) * s->ntopics);
	for (i = 0; i < s->ntopics; i++)
		s->topics[i] = TextDatumGetCString(elems[i]);
	s->handler_text = TextDatumGetCString(SPI_getbinval(tup, desc, 2, &isnull));
	s->handler_owner = DatumGetObjectId(SPI_getbinval(tup, desc, 9, &isnull));
	s->owner = DatumGetObjectId(SPI_getbinval(tup, desc, 3, &isnull));
	s->group_id = TextDatumGetCString(SPI_getbinval(tup, desc, 4, &isnull));

	/*
	 * Kafka's group names are global to the cluster, the database's offsets
	 * are not: two databases (or two servers) with a group of one name would
	 * split its partitions and each skip the other's share.  The Kafka group
	 * is this database's own; its committed offsets are only for people.
	 */
	s->kafka_group = psprintf("outbox.%llu.%u.%s",
							  (unsigned long long) GetSystemIdentifier(),
							  MyDatabaseId, s->group_id);
	/* consume_once() refuses names starting with "outbox:" or "outbox;" */
	s->dedupe_name = psprintf("outbox;%s", s->group_id);
	s->legacy_name = psprintf("outbox:%s", s->group_id);
	s->earliest = strcmp(TextDatumGetCString(SPI_getbinval(tup, desc, 5, &isnull)), "earliest") == 0;
	d = SPI_getbinval(tup, desc, 6, &isnull);
	s->max_attempts = isnull ? 0 : DatumGetInt32(d);
	s->block = strcmp(TextDatumGetCString(SPI_getbinval(tup, desc, 7, &isnull)), "block") == 0;
	s->batch_size = DatumGetInt32(SPI_getbinval(tup, desc, 8, &isnull));

	w->typid = OutboxInboundType();
	w->tupdesc = lookup_rowtype_tupdesc_copy(w->typid, -1);
	MemoryContextSwitchTo(old);
	return true;
}

/*
 * OutboxSubscriberLoad
 *		Read the worker's row, inside SPI in a transaction of the caller's.
 *		False when the extension or the row is not there.  SQL objects
 *		older than the library, a handler that no longer resolves or that
 *		the owner may not run, are a problem (*problem, in w->cxt) the
 *		worker reports and waits out.
 */
bool
OutboxSubscriberLoad(Worker *w, const char *name, char **problem)
{
	Oid			relid;

	*problem = NULL;
	if (!OutboxStoreExtensionPresent())
		return false;
	relid = get_relname_relid("subscriptions", get_namespace_oid("outbox", true));
	if (!OidIsValid(relid))
		return false;
	if (get_attnum(relid, "handler_owner") == InvalidAttrNumber)
	{
		/* the library is newer than the SQL objects: the update restarts us */
		*problem = MemoryContextStrdup(w->cxt, OUTBOX_OLD_SQL_PROBLEM);
		return true;
	}
	if (!read_row(w, name))
		return false;
	*problem = OutboxSubscriberHandlerProblem(w);
	if (*problem != NULL)
		*problem = MemoryContextStrdup(w->cxt, *problem);
	w->sub.legacy_rows = *problem == NULL && has_legacy_rows(w);
	return true;
}
