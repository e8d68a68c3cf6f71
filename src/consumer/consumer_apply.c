/*-------------------------------------------------------------------------
 *
 * consumer/consumer_apply.c
 *		One message applied by the subscription worker: its dedupe row,
 *		then the handler's call as the subscription's owner.
 *
 * Invariants:
 *	- Exactly-once effect: a message with an id header inserts its dedupe
 *	  row (outbox.inbox, consumer = the consumer group) in the transaction
 *	  that calls the handler; a row that was there already makes it a
 *	  duplicate, not called.  The dedupe key is scoped by topic and origin
 *	  (dedupe_key): an id chosen by another writer does not suppress
 *	  another topic's or database's event.
 *	- The handler runs as the subscription's owner, with
 *	  SECURITY_LOCAL_USERID_CHANGE and SECURITY_RESTRICTED_OPERATION (no
 *	  SET ROLE, no SET SESSION AUTHORIZATION back to the worker's
 *	  superuser), an empty search_path, and every setting it changes
 *	  undone after it.  The worker's own statements name every object.
 *	- Right before each call the owner's right to run the handler is
 *	  checked again: losing it stops the worker (w->refused), it is not the
 *	  message's failure.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/pg_authid.h"
#include "catalog/pg_type.h"
#include "common/cryptohash.h"
#include "common/sha2.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/jsonb.h"
#include "utils/syscache.h"
#include "utils/uuid.h"

#include "consumer/consumer_worker.h"
#include "kafka/kafka.h"
#include "consumer/consumer.h"

/*
 * dedupe_key
 *		The key of a message's dedupe row: its event id, scoped by its
 *		topic and its origin header (the database the relay sent it from),
 *		as a SHA-256 of the three cut to a UUID (version 8).  A writer that
 *		chooses the id of another topic's or database's event does not
 *		suppress it.  Read from the composite, so that a replayed dead
 *		letter gets the key its first try would have.
 */
static Datum
dedupe_key(Worker *w, Datum message, Datum id)
{
	pg_cryptohash_ctx *ctx = pg_cryptohash_create(PG_SHA256);
	bool		isnull;
	Datum		topic_attr = OutboxSubscriberMessageAttr(w, message, OUTBOX_MESSAGE_TOPIC,
														 &isnull);
	char	   *topic = TextDatumGetCString(topic_attr);
	Datum		headers = OutboxSubscriberMessageAttr(w, message, OUTBOX_MESSAGE_HEADERS,
													  &isnull);
	JsonbValue *origin = NULL;
	uint8		digest[PG_SHA256_DIGEST_LENGTH];
	pg_uuid_t  *key = palloc(sizeof(pg_uuid_t));

	if (!isnull)
		origin = getKeyJsonValueFromContainer(&DatumGetJsonbP(headers)->root,
											  "origin", 6, NULL);
	if (origin != NULL && origin->type != jbvString)
		origin = NULL;
	if (ctx == NULL || pg_cryptohash_init(ctx) < 0 ||
		pg_cryptohash_update(ctx, (const uint8 *) topic, strlen(topic) + 1) < 0 ||
		(origin != NULL &&
		 pg_cryptohash_update(ctx, (const uint8 *) origin->val.string.val,
							  origin->val.string.len) < 0) ||
		pg_cryptohash_update(ctx, (const uint8 *) "", 1) < 0 ||
		pg_cryptohash_update(ctx, DatumGetUUIDP(id)->data, UUID_LEN) < 0 ||
		pg_cryptohash_final(ctx, digest, sizeof(digest)) < 0)
		elog(ERROR, "could not compute a dedupe key");
	pg_cryptohash_free(ctx);
	memcpy(key->data, digest, UUID_LEN);
	key->data[6] = (key->data[6] & 0x0f) | 0x80;
	key->data[8] = (key->data[8] & 0x3f) | 0x80;
	return UUIDPGetDatum(key);
}

/*
 * is_duplicate
 *		Insert the message's dedupe row; true when it was there already.
 *		The group's rows of before 1.8 hold bare ids: while the group has
 *		any (they age out with outbox.inbox_retention), one of them counts
 *		too.
 */
static bool
is_duplicate(Worker *w, Datum message, Datum id)
{
	Datum		args[2];

	args[0] = CStringGetTextDatum(w->sub.dedupe_name);
	args[1] = dedupe_key(w, message, id);
	OutboxSubscriberRunPlan(w, PLAN_DEDUPE, args, NULL, 0);
	if (SPI_processed == 0)
		return true;
	if (!w->sub.legacy_rows)
		return false;
	args[0] = CStringGetTextDatum(w->sub.legacy_name);
	args[1] = id;
	OutboxSubscriberRunPlan(w, PLAN_LEGACY, args, NULL, 1);
	return SPI_processed > 0;
}

/*
 * OutboxSubscriberApplyMessage
 *		Dedupe and hand one message to the handler, in the current
 *		(sub)transaction.  Returns false for a duplicate.  Errors propagate.
 *		Right before the call, the owner's right to run the handler is
 *		checked again: see the invariants.
 */
bool
OutboxSubscriberApplyMessage(Worker *w, Datum message)
{
	bool		isnull;
	Datum		id = OutboxSubscriberMessageAttr(w, message, OUTBOX_MESSAGE_EVENT_ID,
												   &isnull);
	Oid			save_user;
	int			save_sec;
	int			save_nestlevel;

	if (!isnull && is_duplicate(w, message, id))
		return false;
	if (!SearchSysCacheExists1(AUTHOID, ObjectIdGetDatum(w->sub.owner)) ||
		!OutboxRoleMayExecute(w->sub.owner, w->sub.handler))
	{
		w->refused = true;
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("outbox subscription \"%s\": its owner may no longer execute its handler",
						w->sub.name),
				 errdetail("The worker stops; it waits for the subscription to change.")));
	}

	CommandCounterIncrement();
	GetUserIdAndSecContext(&save_user, &save_sec);
	SetUserIdAndSecContext(w->sub.owner,
						   save_sec | SECURITY_LOCAL_USERID_CHANGE |
						   SECURITY_RESTRICTED_OPERATION);
	save_nestlevel = NewGUCNestLevel();
	(void) set_config_option("search_path", "", PGC_USERSET, PGC_S_SESSION,
							 GUC_ACTION_SAVE, true, 0, false);
	{
		LOCAL_FCINFO(fcinfo, 1);

		InitFunctionCallInfoData(*fcinfo, &w->handler, 1, InvalidOid, NULL, NULL);
		fcinfo->args[0].value = message;
		fcinfo->args[0].isnull = false;
		(void) FunctionCallInvoke(fcinfo);
	}
	AtEOXact_GUC(false, save_nestlevel);
	SetUserIdAndSecContext(save_user, save_sec);
	CommandCounterIncrement();
	return true;
}

/* what OutboxSubscriberTryApply's subtransaction works on */
typedef struct ApplyWork
{
	const OutboxInbound *m;		/* the message as fetched, or NULL */
	Datum		message;		/* else its composite */
	bool		applied;
} ApplyWork;

/* the subtransaction's body: a value jsonb refuses (\u0000) arrives with payload NULL */
static void
apply_body(Worker *w, void *arg)
{
	ApplyWork  *aw = (ApplyWork *) arg;

	if (aw->m != NULL)
		aw->message = OutboxSubscriberKeptMessage(w, aw->m);
	aw->applied = OutboxSubscriberApplyMessage(w, aw->message);
}

/*
 * OutboxSubscriberTryApply
 *		Apply one message, m as fetched or else the composite message, in
 *		a subtransaction of its own.  True when it went through (*applied:
 *		false for a duplicate); on failure false, and the error's text and
 *		SQLSTATE go into *f.
 */
bool
OutboxSubscriberTryApply(Worker *w, const OutboxInbound *m, Datum message,
						 bool *applied, Failure *f)
{
	ApplyWork	aw;

	aw.m = m;
	aw.message = message;
	aw.applied = false;
	if (!OutboxSubscriberTry(w, apply_body, &aw, f))
		return false;
	*applied = aw.applied;
	return true;
}
