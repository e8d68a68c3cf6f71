-- outbox.validate(): a payload judged against the Avro schema the relay
-- recorded for its topic (outbox.schemas), without the network; the same
-- encoder the relay runs.  outbox.avro_topics is 'shop.orders, shop.other'
-- (test/regress.conf).
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS outbox;
RESET client_min_messages;

-- as the relay records it after fetching subject shop.orders-value
INSERT INTO outbox.schemas (topic, schema_id, schema) VALUES ('shop.orders', 17, $$
{"type": "record", "name": "Order", "namespace": "shop", "fields": [
  {"name": "id", "type": "long"},
  {"name": "total", "type": "double"},
  {"name": "qty", "type": "int"},
  {"name": "note", "type": ["null", "string"], "default": null},
  {"name": "status", "type": {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID"]}},
  {"name": "items", "type": {"type": "array", "items": {"type": "record", "name": "Item",
     "fields": [{"name": "sku", "type": "string"}, {"name": "n", "type": "int"}]}}},
  {"name": "tags", "type": {"type": "map", "values": "string"}},
  {"name": "flag", "type": "boolean"},
  {"name": "raw", "type": "bytes"},
  {"name": "code", "type": {"type": "fixed", "name": "Code", "size": 2}},
  {"name": "amount", "type": ["null", "long", "string"]}
]}$$);

CREATE TEMP TABLE good AS SELECT
 '{"id": 42, "total": 250.5, "qty": 3, "note": "gift", "status": "PAID",
   "items": [{"sku": "A-1", "n": 2}, {"sku": "B-2", "n": 1}],
   "tags": {"channel": "web"}, "flag": true, "raw": "\u0001\u00ff", "code": "ab",
   "amount": 7}'::jsonb AS p;

-- fits: NULL
SELECT outbox.validate('shop.orders', p) IS NULL AS fits FROM good;
-- an optional field left out is null; a tagged union value; a whole number written 3.0
SELECT outbox.validate('shop.orders', p - 'note') IS NULL AS fits FROM good;
SELECT outbox.validate('shop.orders', p || '{"amount": {"string": "7"}}') IS NULL AS fits FROM good;
SELECT outbox.validate('shop.orders', p || '{"amount": null, "qty": 3.0}') IS NULL AS fits FROM good;

-- each refusal names the field and the schema, never the value
SELECT outbox.validate('shop.orders', p - 'id') FROM good;
SELECT outbox.validate('shop.orders', p || '{"id": "42"}') FROM good;
SELECT outbox.validate('shop.orders', p || '{"qty": 2.5}') FROM good;
SELECT outbox.validate('shop.orders', p || '{"qty": 3000000000}') FROM good;
SELECT outbox.validate('shop.orders', p || '{"id": 9223372036854775808}') FROM good;
SELECT outbox.validate('shop.orders', p || '{"status": "LOST"}') FROM good;
SELECT outbox.validate('shop.orders', p || '{"items": [{"sku": "A-1", "n": 2}, {"sku": 7, "n": 1}]}') FROM good;
SELECT outbox.validate('shop.orders', p || '{"items": [{"sku": "A-1"}]}') FROM good;
SELECT outbox.validate('shop.orders', p || '{"tags": {"channel": 1}}') FROM good;
SELECT outbox.validate('shop.orders', p || '{"flag": "yes"}') FROM good;
SELECT outbox.validate('shop.orders', p || '{"raw": "\u0100"}') FROM good;
SELECT outbox.validate('shop.orders', p || '{"code": "abc"}') FROM good;
SELECT outbox.validate('shop.orders', p || '{"amount": true}') FROM good;
SELECT outbox.validate('shop.orders', p || '{"secret-field": "hunter2"}') FROM good;
SELECT outbox.validate('shop.orders', p || '{"surprise": 1}') FROM good;
SELECT outbox.validate('shop.orders', '[1, 2]');
SELECT outbox.validate('shop.orders', '"just a string"');

-- a topic that is not an Avro one, and one whose schema is not known yet
SELECT outbox.validate('shop.json', '{}');
\echo :LAST_ERROR_SQLSTATE
SELECT outbox.validate('shop.other', '{}');
\echo :LAST_ERROR_SQLSTATE
-- STRICT
SELECT outbox.validate('shop.orders', NULL) IS NULL AS is_null;

-- a schema of the primitive kinds, and a recursive one
UPDATE outbox.schemas SET schema_id = 18, schema = '"string"' WHERE topic = 'shop.orders';
SELECT outbox.validate('shop.orders', '"plain"') IS NULL AS fits;
SELECT outbox.validate('shop.orders', '{"a": 1}');
UPDATE outbox.schemas SET schema_id = 19, schema =
 '{"type": "record", "name": "Node", "fields": [{"name": "v", "type": "int"},
   {"name": "next", "type": ["null", "Node"]}]}' WHERE topic = 'shop.orders';
SELECT outbox.validate('shop.orders', '{"v": 1, "next": {"v": 2, "next": {"v": 3}}}') IS NULL AS fits;
SELECT outbox.validate('shop.orders', '{"v": 1, "next": {"v": 2, "next": {"v": "3"}}}');

-- a payload nesting deeper than the walk goes is refused, not an error
SELECT outbox.validate('shop.orders',
  (SELECT string_agg('{"v": 1, "next": ', '') || '{"v": 1}' || repeat('}', 150)
     FROM generate_series(1, 150))::jsonb);

-- Avro's tagged union names a named type by its full name or its name
UPDATE outbox.schemas SET schema_id = 21, schema =
 '{"type": "record", "name": "T", "namespace": "ns", "fields": [{"name": "u",
   "type": ["null", {"type": "record", "name": "In", "fields": [{"name": "x", "type": "int"}]}]}]}'
 WHERE topic = 'shop.orders';
SELECT outbox.validate('shop.orders', p) IS NULL AS fits
  FROM (VALUES ('{"u": {"ns.In": {"x": 1}}}'::jsonb), ('{"u": {"In": {"x": 1}}}'),
			   ('{"u": {"x": 1}}'), ('{"u": null}'), ('{}')) v(p);
SELECT outbox.validate('shop.orders', '{"u": {"other.In": {"x": 1}}}');

-- a record that contains itself other than through a union, an array or a
-- map: no value can be made of it, and it is refused rather than followed
UPDATE outbox.schemas SET schema_id = 22, schema =
 '{"type": "record", "name": "A", "fields": [{"name": "a", "type": "A"}]}' WHERE topic = 'shop.orders';
SELECT outbox.validate('shop.orders', '{}');
\echo :LAST_ERROR_SQLSTATE
UPDATE outbox.schemas SET schema_id = 23, schema =
 '{"type": "record", "name": "B", "fields": [{"name": "c", "type": {"type": "record", "name": "C",
   "fields": [{"name": "b", "type": "B"}]}}]}' WHERE topic = 'shop.orders';
SELECT outbox.validate('shop.orders', '{}');

-- a schema larger than a memory page of its own (about 200 kB)
UPDATE outbox.schemas SET schema_id = 24, schema =
 (SELECT '{"type": "record", "name": "Big", "fields": ['
		 || string_agg(format('{"name": "f%s", "type": "string", "doc": "%s"}', g, repeat('d', 90)), ', ')
		 || ']}' FROM generate_series(1, 2000) g) WHERE topic = 'shop.orders';
SELECT length(schema) > 131072 AS large FROM outbox.schemas WHERE topic = 'shop.orders';
SELECT outbox.validate('shop.orders', '{"f1": "x"}');
SELECT outbox.validate('shop.orders', (SELECT jsonb_object_agg('f' || g, 'x') FROM generate_series(1, 2000) g)) IS NULL AS fits;

-- a schema avro-c cannot read (only a superuser can record one)
UPDATE outbox.schemas SET schema_id = 20, schema = '{"type": "nonsense"}' WHERE topic = 'shop.orders';
SELECT outbox.validate('shop.orders', '{}');
\echo :LAST_ERROR_SQLSTATE

-- privileges: nobody but the owner may call it until granted; granted, it
-- needs no right on outbox.schemas, and a writer cannot change the schemas
CREATE ROLE avro_writer;
GRANT USAGE ON SCHEMA outbox TO avro_writer;
SET ROLE avro_writer;
SELECT outbox.validate('shop.orders', '{}');
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;
GRANT EXECUTE ON FUNCTION outbox.validate(text, jsonb) TO avro_writer;
UPDATE outbox.schemas SET schema_id = 18, schema = '"string"' WHERE topic = 'shop.orders';
SET ROLE avro_writer;
SELECT outbox.validate('shop.orders', '"x"') IS NULL AS fits;
SELECT * FROM outbox.schemas;
\echo :LAST_ERROR_SQLSTATE
UPDATE outbox.schemas SET schema = '"long"';
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;
DROP OWNED BY avro_writer;
DROP ROLE avro_writer;
DELETE FROM outbox.schemas;
