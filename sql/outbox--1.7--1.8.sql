/* outbox--1.7--1.8.sql: from 1.7 to 1.8.  Must leave a database equal to a fresh 1.8 install. */

\echo Use "ALTER EXTENSION outbox UPDATE TO '1.8'" to load this file. \quit

-- health() also judges the subscriptions: one left without a worker (issue 34, point 8)
COMMENT ON FUNCTION outbox.health(interval) IS
	'ok, warning or critical, judged by the oldest undelivered event''s age, the relay''s state and the subscriptions left without a worker';
