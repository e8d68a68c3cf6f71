/*-------------------------------------------------------------------------
 *
 * base/spi.c
 *		The statements the extension runs on its own tables: search_path
 *		pinned around each, plans prepared once, a statement's result code
 *		checked, a one-row result read.
 *
 * Invariants:
 *	- A statement run for a caller resolves no name through the caller's
 *	  search_path: OutboxPinSearchPath sets it to pg_catalog, pg_temp at a
 *	  new GUC nest level, which OutboxUnpinSearchPath pops once the
 *	  statement is done; an error leaves that to the (sub)transaction's
 *	  abort.  Levels nest, so a statement run from inside another one (a
 *	  trigger its INSERT fires that emits) pins and unpins inside it.
 *	- Nothing here knows a table or a statement: the callers own theirs,
 *	  and nothing here keeps state.
 *	- The caller is connected to SPI, in its own transaction; nothing here
 *	  starts, commits or aborts one.
 *	- A statement of ours that does not prepare, or answers other than
 *	  expected, is a bug, hence elog, never an error a user causes.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "utils/builtins.h"
#include "utils/guc.h"

#include "base/base.h"

/*
 * OutboxPinSearchPath
 *		Pin search_path to pg_catalog, pg_temp until OutboxUnpinSearchPath
 *		is given the level returned.
 */
int
OutboxPinSearchPath(void)
{
	int			level = NewGUCNestLevel();

	(void) set_config_option("search_path", "pg_catalog, pg_temp",
							 PGC_USERSET, PGC_S_SESSION, GUC_ACTION_SAVE,
							 true, 0, false);
	return level;
}

/*
 * OutboxUnpinSearchPath
 *		Give search_path back as it was before OutboxPinSearchPath returned
 *		level.
 */
void
OutboxUnpinSearchPath(int level)
{
	AtEOXact_GUC(true, level);
}

static SPIPlanPtr
prepare(const char *sql, int nargs, Oid *types, int options, const char *what)
{
	SPIPlanPtr	plan = SPI_prepare_cursor(sql, nargs, types, options);

	if (plan == NULL)
		elog(ERROR, "could not prepare %s: %s", what,
			 SPI_result_code_string(SPI_result));
	SPI_keepplan(plan);
	return plan;
}

/*
 * OutboxSpiPrepare
 *		Prepare one of the extension's statements and keep the plan for the
 *		life of the process; the caller holds it in a static and prepares
 *		only while that is NULL.  Must run inside SPI; what names the
 *		statement in the error.
 */
SPIPlanPtr
OutboxSpiPrepare(const char *sql, int nargs, Oid *types, const char *what)
{
	return prepare(sql, nargs, types, 0, what);
}

/*
 * OutboxSpiPrepareGeneric
 *		OutboxSpiPrepare for a statement whose plan must not depend on its
 *		parameters' values, and is planned once: a custom plan is planned
 *		at every run, which for a statement run per page of one event costs
 *		more than running it (the planner may also read an index's end to
 *		estimate a range past its statistics).
 */
SPIPlanPtr
OutboxSpiPrepareGeneric(const char *sql, int nargs, Oid *types, const char *what)
{
	return prepare(sql, nargs, types, CURSOR_OPT_GENERIC_PLAN, what);
}

/*
 * OutboxSpiValue
 *		Column col (1-based) of the first row the last SPI statement
 *		returned, which must have returned one.
 */
Datum
OutboxSpiValue(int col, bool *isnull)
{
	return SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, col,
						 isnull);
}

/*
 * OutboxSpiExec
 *		Run sql with nargs arguments (types, values and nulls as
 *		SPI_execute_with_args takes them), read-only or not, returning at
 *		most count rows (0: all).  Anything but the expected SPI_OK_* code
 *		ends in elog: "<what> failed".  The result is in SPI_tuptable and
 *		SPI_processed.
 */
void
OutboxSpiExec(const char *sql, int nargs, Oid *types, Datum *values,
			  const char *nulls, bool read_only, long count, int expected,
			  const char *what)
{
	int			rc = SPI_execute_with_args(sql, nargs, types, values, nulls,
										   read_only, count);

	if (rc != expected)
		elog(ERROR, "%s failed: %s", what, SPI_result_code_string(rc));
}

/*
 * OutboxSpiExecText
 *		OutboxSpiExec of sql with one text argument, arg ($1).
 */
void
OutboxSpiExecText(const char *sql, const char *arg, bool read_only, long count,
				  int expected, const char *what)
{
	Oid			types[1] = {TEXTOID};
	Datum		values[1];

	values[0] = CStringGetTextDatum(arg);
	OutboxSpiExec(sql, 1, types, values, NULL, read_only, count, expected, what);
}
