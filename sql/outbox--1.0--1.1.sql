/* outbox--1.0--1.1.sql: from 1.0 to 1.1.  Must leave a database equal to a fresh 1.1 install. */

\echo Use "ALTER EXTENSION outbox UPDATE TO '1.1'" to load this file. \quit

/*
 * SECURITY DEFINER functions run with a pinned search_path: under the
 * caller's path, an operator or function the caller created could run with
 * the extension owner's rights.
 */
ALTER FUNCTION outbox.emit(text, text, text, jsonb, jsonb, text, text, uuid, integer, timestamptz)
	SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION outbox.status() SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION outbox.metrics() SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION outbox.health(interval) SET search_path = pg_catalog, pg_temp;
