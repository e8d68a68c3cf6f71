/* outbox--1.5--1.6.sql: from 1.5 to 1.6.  Must leave a database equal to a fresh 1.6 install. */

\echo Use "ALTER EXTENSION outbox UPDATE TO '1.6'" to load this file. \quit

/*
 * The counter rows' key compares bytes.  emit() looks a row up by it once
 * per transaction with outbox.aggregate_sequence on, and the database's
 * collation made each comparison of that lookup a strcoll() call (the
 * largest part of the lookup under C.UTF-8 or en_US.UTF-8).  Equality is
 * the same under any deterministic collation, and a database's default
 * collation is deterministic, so every row stays the row of the same
 * aggregate.  Rebuilds the primary key; the table keeps its rows.
 */
ALTER TABLE outbox.aggregates
	ALTER COLUMN aggregate_type TYPE text COLLATE "C",
	ALTER COLUMN aggregate_id TYPE text COLLATE "C";
