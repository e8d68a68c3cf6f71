/*-------------------------------------------------------------------------
 *
 * spi_exec.c
 *		One SQL statement of the extension's own run through SPI, its
 *		result code checked.
 *
 * Invariants:
 *	- The caller is connected to SPI, in its own transaction; nothing here
 *	  starts, commits or aborts one.
 *	- The statements are the extension's own, every name qualified: one
 *	  that answers other than expected is a bug, hence elog, never an
 *	  error a user causes.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "utils/builtins.h"

#include "outbox.h"

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
