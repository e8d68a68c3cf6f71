-- outbox.capture(): emit from a table's row changes without application code.
CREATE SCHEMA shop;
CREATE TABLE shop.orders (id int PRIMARY KEY, customer text, total numeric);
CREATE TRIGGER orders_outbox
  AFTER INSERT OR UPDATE OR DELETE ON shop.orders
  FOR EACH ROW EXECUTE FUNCTION outbox.capture('order', 'id');

INSERT INTO shop.orders VALUES (100, 'ada', 12.5), (101, 'bob', 3);
UPDATE shop.orders SET total = 13 WHERE id = 100;
DELETE FROM shop.orders WHERE id = 101;
BEGIN;
INSERT INTO shop.orders VALUES (102, 'cy', 1);
ROLLBACK;

SELECT aggregate_type, aggregate_id, event_type, seq, topic, payload
  FROM outbox.events WHERE aggregate_id IN ('100', '101', '102') ORDER BY id;

-- misuse is refused with a clear error
CREATE TABLE shop.bad (id int, code text);
CREATE TRIGGER bad_args AFTER INSERT ON shop.bad
  FOR EACH ROW EXECUTE FUNCTION outbox.capture('thing');
SELECT t.err($$INSERT INTO shop.bad VALUES (1, 'a')$$);
DROP TRIGGER bad_args ON shop.bad;

CREATE TRIGGER bad_column AFTER INSERT ON shop.bad
  FOR EACH ROW EXECUTE FUNCTION outbox.capture('thing', 'uuid');
SELECT t.err($$INSERT INTO shop.bad VALUES (1, 'a')$$);
DROP TRIGGER bad_column ON shop.bad;

CREATE TRIGGER null_id AFTER INSERT ON shop.bad
  FOR EACH ROW EXECUTE FUNCTION outbox.capture('thing', 'id');
SELECT t.err($$INSERT INTO shop.bad VALUES (NULL, 'a')$$);
DROP TRIGGER null_id ON shop.bad;

CREATE TRIGGER before_row BEFORE INSERT ON shop.bad
  FOR EACH ROW EXECUTE FUNCTION outbox.capture('thing', 'id');
SELECT t.err($$INSERT INTO shop.bad VALUES (1, 'a')$$);
DROP TRIGGER before_row ON shop.bad;

CREATE TRIGGER per_statement AFTER INSERT ON shop.bad
  FOR EACH STATEMENT EXECUTE FUNCTION outbox.capture('thing', 'id');
SELECT t.err($$INSERT INTO shop.bad VALUES (1, 'a')$$);
DROP TRIGGER per_statement ON shop.bad;

-- nothing was emitted by the failed statements
SELECT count(*) AS bad_events FROM outbox.events WHERE aggregate_type = 'thing';
