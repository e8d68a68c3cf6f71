-- Installing the extension, and a helper that shows an error's SQLSTATE,
-- message, detail and hint, so the expected files pin all four.
CREATE EXTENSION outbox;
SELECT extname, extversion, extnamespace::regnamespace AS schema
  FROM pg_extension WHERE extname = 'outbox';
-- its members (not \dx+: psql 17 lists the tables' row types too)
SELECT pg_describe_object(classid, objid, 0) AS member
  FROM pg_depend
 WHERE refclassid = 'pg_extension'::regclass
   AND refobjid = (SELECT oid FROM pg_extension WHERE extname = 'outbox')
   AND deptype = 'e' AND classid <> 'pg_type'::regclass
 ORDER BY 1;

CREATE SCHEMA t;
CREATE FUNCTION t.err(q text) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
	st text; msg text; det text; hin text;
BEGIN
	EXECUTE q;
	RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
	GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, msg = MESSAGE_TEXT,
		det = PG_EXCEPTION_DETAIL, hin = PG_EXCEPTION_HINT;
	RETURN st || ' ' || msg
		|| coalesce(' | DETAIL: ' || nullif(det, ''), '')
		|| coalesce(' | HINT: ' || nullif(hin, ''), '');
END
$$;
GRANT USAGE ON SCHEMA t TO PUBLIC;
GRANT EXECUTE ON FUNCTION t.err(text) TO PUBLIC;
