-- test/t/fingerprints/catalog.sql: the outbox extension's catalog as a user
-- of its objects can observe it, one fact a line, sorted, without an OID;
-- in grants, the role that installed the extension reads <owner>.  The
-- facts: functions, in schema outbox and in outbox_internal (1.8), with
-- their attributes, settings, grants and a digest of their source; tables,
-- columns, defaults, constraints, indexes, views, types and triggers;
-- comments; what pg_dump dumps of the configuration tables; the
-- extension's members; both schemas' grants.
--
-- test/t/007_upgrade.pl compares databases with it: an upgraded one with a
-- fresh install of the current version, and each upgrade step with the
-- fingerprint saved for the version it reaches (pg<major>/outbox-<version>.txt;
-- catalogs and deparsed views differ between PostgreSQL majors).  The
-- saved fingerprints of released versions never change.  The current
-- version's changes with its install script; regenerate it on each tested
-- PostgreSQL, in a scratch database of a server this tree is installed in:
--   psql -XAtq -d scratch -c 'CREATE EXTENSION outbox' \
--     -f test/t/fingerprints/catalog.sql -c 'DROP EXTENSION outbox' \
--     >test/t/fingerprints/pg$MAJOR/outbox-$VERSION.txt
-- or take the one t/007 writes when they differ (its TAP log directory,
-- kept by test/run-tests in test/log/pg$MAJOR/).
WITH ext AS (SELECT oid, extconfig, extcondition FROM pg_extension WHERE extname = 'outbox'),
members AS (
	SELECT d.classid, d.objid FROM pg_depend d, ext
	 WHERE d.refclassid = 'pg_extension'::regclass AND d.refobjid = ext.oid AND d.deptype = 'e'
),
facts AS (
	SELECT 'function ' || p.oid::regprocedure || ' returns ' || pg_get_function_result(p.oid)
		|| ' lang ' || l.lanname || ' vol ' || p.provolatile::text || ' strict ' || p.proisstrict
		|| ' secdef ' || p.prosecdef || ' parallel ' || p.proparallel::text
		|| ' config ' || coalesce(array_to_string(p.proconfig, '|'), '-')
		|| ' acl ' || coalesce(p.proacl::text, '-')
		|| ' src ' || md5(p.prosrc)
		|| ' args ' || pg_get_function_arguments(p.oid)
		|| ' comment ' || coalesce(obj_description(p.oid, 'pg_proc'), '-') AS fact
	  FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
	 WHERE p.pronamespace IN (SELECT n.oid FROM pg_namespace n
							   WHERE n.nspname IN ('outbox', 'outbox_internal'))
	UNION ALL
	SELECT 'relation ' || c.oid::regclass || ' kind ' || c.relkind::text
		|| ' acl ' || coalesce(c.relacl::text, '-')
		|| ' comment ' || coalesce(obj_description(c.oid, 'pg_class'), '-')
		|| ' member ' || EXISTS (SELECT 1 FROM members m WHERE m.classid = 'pg_class'::regclass AND m.objid = c.oid)
		|| ' view ' || CASE WHEN c.relkind = 'v' THEN pg_get_viewdef(c.oid) ELSE '-' END
		|| ' index ' || CASE WHEN c.relkind = 'i' THEN pg_get_indexdef(c.oid) ELSE '-' END
	  FROM pg_class c WHERE c.relnamespace = 'outbox'::regnamespace
	UNION ALL
	SELECT 'column ' || a.attrelid::regclass || '.' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod)
		|| ' collation ' || a.attcollation::regcollation::text
		|| ' notnull ' || a.attnotnull || ' identity ' || a.attidentity::text
		|| ' default ' || coalesce(pg_get_expr(ad.adbin, ad.adrelid), '-')
		|| ' comment ' || coalesce(col_description(a.attrelid, a.attnum), '-')
	  FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
	  LEFT JOIN pg_attrdef ad ON ad.adrelid = a.attrelid AND ad.adnum = a.attnum
	 WHERE c.relnamespace = 'outbox'::regnamespace AND a.attnum > 0 AND NOT a.attisdropped
	UNION ALL
	SELECT 'constraint ' || co.conrelid::regclass || ' ' || co.conname || ' ' || pg_get_constraintdef(co.oid)
	  FROM pg_constraint co WHERE co.connamespace = 'outbox'::regnamespace
	UNION ALL
	SELECT 'type ' || t.oid::regtype || ' comment ' || coalesce(obj_description(t.oid, 'pg_type'), '-')
	  FROM pg_type t WHERE t.typnamespace = 'outbox'::regnamespace AND t.typrelid = 0
	  AND t.typelem = 0
	UNION ALL
	SELECT 'trigger ' || tg.tgrelid::regclass || ' ' || pg_get_triggerdef(tg.oid)
	  FROM pg_trigger tg JOIN pg_class c ON c.oid = tg.tgrelid
	 WHERE c.relnamespace = 'outbox'::regnamespace AND NOT tg.tgisinternal
	UNION ALL
	SELECT 'dumped ' || u.cfg::regclass || ' where ' || coalesce(nullif(u.cond, ''), '-')
	  FROM ext, unnest(ext.extconfig, ext.extcondition) AS u(cfg, cond)
	UNION ALL
	SELECT 'member ' || pg_describe_object(m.classid, m.objid, 0) FROM members m
	UNION ALL
	SELECT 'schema acl ' || coalesce(n.nspacl::text, '-') || ' owner super '
		|| (SELECT rolsuper FROM pg_roles WHERE oid = n.nspowner)
	  FROM pg_namespace n WHERE n.nspname = 'outbox'
	UNION ALL
	SELECT 'schema outbox_internal acl ' || coalesce(n.nspacl::text, '-')
		|| ' owner super ' || (SELECT rolsuper FROM pg_roles WHERE oid = n.nspowner)
		|| ' comment ' || coalesce(obj_description(n.oid, 'pg_namespace'), '-')
	  FROM pg_namespace n WHERE n.nspname = 'outbox_internal'
),
-- the installing role as aclitem prints it, escaped for a regular expression
installer AS (
	SELECT regexp_replace(substring(acldefault('n', r.oid)::text FROM '^\{([^=]*)='),
		'([^[:alnum:]_])', '\\\1', 'g') AS name
	  FROM pg_roles r WHERE r.rolname = current_user
)
SELECT fact
  FROM (SELECT replace(regexp_replace(f.fact, '(?<=[{,/])' || i.name || '(?=[=/,}])', '<owner>', 'g'),
			E'\n', '\n') AS fact
		  FROM facts f, installer i) normalized
 ORDER BY fact COLLATE "C";
