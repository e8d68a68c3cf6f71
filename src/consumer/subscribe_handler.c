/*-------------------------------------------------------------------------
 *
 * consumer/subscribe_handler.c
 *		What makes a function a subscription's handler, for subscribe()
 *		when it is called and for the worker before every transaction that
 *		calls the handler.
 *
 * Invariants:
 *	- A handler is a plain function of one outbox.inbound_message
 *	  returning one value; a subscription names it by its schema-qualified
 *	  regprocedure text and finds it again by that text, never by a
 *	  search_path.
 *	- Nothing here ERRORs on a function that is gone: the answers are
 *	  InvalidOid, false, or a problem in words.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "catalog/namespace.h"
#include "catalog/pg_proc.h"
#include "catalog/pg_type.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/regproc.h"
#include "utils/syscache.h"

#include "base/compat.h"
#include "consumer/consumer.h"

/*
 * OutboxHandlerByName
 *		The function a subscription's handler text (regprocedure form,
 *		schema-qualified) names now, or InvalidOid.  Never ERRORs.
 */
Oid
OutboxHandlerByName(const char *text)
{
	/* to_regprocedure() answers NULL for a function that is not there */
	LOCAL_FCINFO(fcinfo, 1);
	Datum		result;

	InitFunctionCallInfoData(*fcinfo, NULL, 1, InvalidOid, NULL, NULL);
	fcinfo->args[0].value = CStringGetTextDatum(text);
	fcinfo->args[0].isnull = false;
	result = to_regprocedure(fcinfo);
	return fcinfo->isnull ? InvalidOid : DatumGetObjectId(result);
}

/*
 * OutboxCheckHandler
 *		Whether the function func can be a handler: it exists, takes one
 *		argument of type typid (outbox.inbound_message), and is a plain
 *		function returning one value.  Its owner goes to *owner when it
 *		exists.  False and *problem otherwise.  Never ERRORs on a bad OID.
 */
bool
OutboxCheckHandler(Oid func, Oid typid, Oid *owner, char **problem)
{
	HeapTuple	tup;
	Form_pg_proc proc;
	char	   *text;

	*problem = NULL;
	tup = OidIsValid(func) ? SearchSysCache1(PROCOID, ObjectIdGetDatum(func)) : NULL;
	if (!HeapTupleIsValid(tup))
	{
		*problem = psprintf("function with OID %u does not exist", func);
		return false;
	}
	proc = (Form_pg_proc) GETSTRUCT(tup);
	*owner = proc->proowner;
	text = format_procedure_qualified(func);
	if (proc->pronargs != 1 || proc->proargtypes.values[0] != typid)
		*problem = psprintf("handler %s must take one argument of type outbox.inbound_message", text);
	else if (proc->prokind != PROKIND_FUNCTION)
		*problem = psprintf("handler %s must be a plain function, not a procedure or an aggregate", text);
	else if (proc->proretset)
		*problem = psprintf("handler %s must not return a set", text);
	ReleaseSysCache(tup);
	return *problem == NULL;
}

/* OutboxRoleMayExecute: whether role may execute function func */
bool
OutboxRoleMayExecute(Oid role, Oid func)
{
	return OutboxProcAclcheck(func, role) == ACLCHECK_OK;
}

/* OutboxInboundType: the OID of outbox.inbound_message, a handler's argument */
Oid
OutboxInboundType(void)
{
	Oid			nsp = get_namespace_oid("outbox", false);

	return GetSysCacheOid2(TYPENAMENSP, Anum_pg_type_oid,
						   CStringGetDatum("inbound_message"), ObjectIdGetDatum(nsp));
}
