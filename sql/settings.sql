-- Server settings: Kafka properties are judged by librdkafka when set, and
-- the relay settings are for postgresql.conf, not sessions.  (This server
-- does not preload the library; LOAD defines the settings in this session.)
LOAD 'outbox';
SELECT name, setting, unit, context FROM pg_settings WHERE name LIKE 'outbox.%' ORDER BY name;

ALTER SYSTEM SET outbox.kafka_config = 'acks=banana';
\echo :LAST_ERROR_SQLSTATE
ALTER SYSTEM SET outbox.kafka_config = 'no.such.property=1';
ALTER SYSTEM SET outbox.kafka_config = 'linger.ms';
ALTER SYSTEM SET outbox.kafka_config = 'bootstrap.servers=x:9092';
ALTER SYSTEM SET outbox.kafka_config = 'enable.idempotence=false';
ALTER SYSTEM SET outbox.kafka_config = 'message.timeout.ms=5000';
-- a secret's value never appears in the error
ALTER SYSTEM SET outbox.kafka_config = 'sasl.mechanisms=PLAIN;ssl.key.password';
ALTER SYSTEM SET outbox.kafka_config = 'sasl.password=hunter2;acks=banana';
-- several properties, spaces allowed around them
ALTER SYSTEM SET outbox.kafka_config = 'linger.ms=5; compression.codec=lz4; acks=all';
ALTER SYSTEM RESET outbox.kafka_config;

-- a page's bytes: between 1kB and 1GB
ALTER SYSTEM SET outbox.batch_max_bytes = 512;
\echo :LAST_ERROR_SQLSTATE
ALTER SYSTEM SET outbox.batch_max_bytes = '1025MB';
ALTER SYSTEM SET outbox.batch_max_bytes = '16MB';
ALTER SYSTEM RESET outbox.batch_max_bytes;

-- credentials belong in a file: PostgreSQL logs a changed setting's value
-- (relative paths are from the data directory)
ALTER SYSTEM SET outbox.kafka_secrets_file = 'no_such_file.conf';
SELECT current_setting('data_directory') AS datadir \gset
\set secrets_ok :datadir '/outbox_secrets_ok.conf'
\set secrets_bad :datadir '/outbox_secrets_bad.conf'
\set secrets_semicolon :datadir '/outbox_secrets_semicolon.conf'
COPY (SELECT '# Kafka credentials' UNION ALL SELECT 'sasl.username=outbox'
      UNION ALL SELECT 'sasl.password=hunter2') TO :'secrets_ok';
ALTER SYSTEM SET outbox.kafka_secrets_file = 'outbox_secrets_ok.conf';
COPY (SELECT 'sasl.password=hunter2' UNION ALL SELECT 'acks=banana') TO :'secrets_bad';
ALTER SYSTEM SET outbox.kafka_secrets_file = 'outbox_secrets_bad.conf';
COPY (SELECT 'sasl.password=hunter2;acks=all') TO :'secrets_semicolon';
ALTER SYSTEM SET outbox.kafka_secrets_file = 'outbox_secrets_semicolon.conf';
ALTER SYSTEM RESET outbox.kafka_secrets_file;

ALTER SYSTEM SET outbox.batch_size = 0;
\echo :LAST_ERROR_SQLSTATE
ALTER SYSTEM SET outbox.poll_interval = '1ms';
ALTER SYSTEM SET outbox.enabled = 'maybe';
ALTER SYSTEM SET outbox.shutdown_timeout = '-1s';

-- relay settings cannot be changed per session
SELECT t.err($$SET outbox.kafka_brokers = 'localhost:9092'$$);
SELECT t.err($$SET outbox.batch_size = 10$$);
SELECT t.err($$SET outbox.enabled = off$$);
-- the outbox prefix is reserved
SELECT t.err($$SET outbox.no_such_setting = 1$$);

-- only superusers read the Kafka settings or turn the sequence off
CREATE ROLE outbox_plain;
SET ROLE outbox_plain;
SELECT t.err($$SHOW outbox.kafka_config$$);
SELECT t.err($$SHOW outbox.kafka_brokers$$);
SELECT t.err($$SET outbox.aggregate_sequence = off$$);
-- session settings are anyone's
SELECT t.err($$SET outbox.tenant = 'acme'$$);
SELECT t.err($$SET outbox.max_payload_bytes = '64kB'$$);
RESET ROLE;
DROP ROLE outbox_plain;
