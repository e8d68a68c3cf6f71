/* outbox--1.6--1.7.sql: from 1.6 to 1.7.  Must leave a database equal to a fresh 1.7 install. */

\echo Use "ALTER EXTENSION outbox UPDATE TO '1.7'" to load this file. \quit

/*
 * emit() switches to its owner itself and pins search_path only for the
 * statements it runs (src/emit.c, outbox_emit): as SECURITY DEFINER with a
 * SET clause, every call set and reset search_path, about 8% of an
 * UPDATE + emit() transaction.  Its rights are unchanged: callers still
 * need EXECUTE on it and nothing on the tables.
 */
ALTER FUNCTION outbox.emit(text, text, text, jsonb, jsonb, text, text, uuid, integer, timestamptz)
	SECURITY INVOKER;
ALTER FUNCTION outbox.emit(text, text, text, jsonb, jsonb, text, text, uuid, integer, timestamptz)
	RESET search_path;
