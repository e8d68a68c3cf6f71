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
-- properties that load or run code, or break per-key order, are refused,
-- also with librdkafka's "topic." prefix
ALTER SYSTEM SET outbox.kafka_config = 'plugin.library.paths=/tmp/evil.so';
\echo :LAST_ERROR_SQLSTATE
ALTER SYSTEM SET outbox.kafka_config = 'sasl.kerberos.kinit.cmd=touch /tmp/pwned';
ALTER SYSTEM SET outbox.kafka_config = 'ssl.engine.location=/tmp/evil.so';
ALTER SYSTEM SET outbox.kafka_config = 'ssl.providers=/tmp/evil';
ALTER SYSTEM SET outbox.kafka_config = 'partitioner=random';
ALTER SYSTEM SET outbox.kafka_config = 'topic.partitioner=random';
ALTER SYSTEM SET outbox.kafka_config = 'queuing.strategy=lifo';
ALTER SYSTEM SET outbox.kafka_config = 'queuing.strategy=LIFO';
ALTER SYSTEM SET outbox.kafka_config = 'topic.message.timeout.ms=5000';
-- what the relay's idempotent producer cannot be made with: refused here,
-- so that a reload never hands it to the relay (librdkafka reads "all" in
-- any case, and an integer in any base)
ALTER SYSTEM SET outbox.kafka_config = 'acks=1';
\echo :LAST_ERROR_SQLSTATE
ALTER SYSTEM SET outbox.kafka_config = 'linger.ms=5;topic.acks=0';
ALTER SYSTEM SET outbox.kafka_config = 'request.required.acks=2';
ALTER SYSTEM SET outbox.kafka_config = 'max.in.flight=6';
ALTER SYSTEM SET outbox.kafka_config = 'max.in.flight.requests.per.connection=0x10';
ALTER SYSTEM SET outbox.kafka_config = 'queue.buffering.backpressure.threshold=2';
ALTER SYSTEM SET outbox.kafka_config = 'transactional.id=outbox';
-- what a subscription's consumer sets itself
ALTER SYSTEM SET outbox.kafka_config = 'group.id=mine';
ALTER SYSTEM SET outbox.kafka_config = 'auto.offset.reset=earliest';
ALTER SYSTEM SET outbox.kafka_config = 'enable.auto.commit=true';
ALTER SYSTEM SET outbox.kafka_config = 'enable.auto.offset.store=true';
ALTER SYSTEM SET outbox.kafka_config = 'enable.partition.eof=true';
ALTER SYSTEM SET outbox.kafka_config = 'isolation.level=read_uncommitted';
ALTER SYSTEM SET outbox.kafka_config = 'group.protocol=consumer';
-- pairs librdkafka refuses together; an unset one counts as the relay and
-- the subscriptions run it (a subscription's session.timeout.ms is 10 s)
ALTER SYSTEM SET outbox.kafka_config = 'reconnect.backoff.ms=20000';
\echo :LAST_ERROR_SQLSTATE
ALTER SYSTEM SET outbox.kafka_config = 'max.poll.interval.ms=5000';
ALTER SYSTEM SET outbox.kafka_config = 'session.timeout.ms=3000;max.poll.interval.ms=5000;session.timeout.ms=6000';
ALTER SYSTEM SET outbox.kafka_config = 'fetch.max.bytes=500000';
ALTER SYSTEM SET outbox.kafka_config = 'message.max.bytes=2000000;fetch.max.bytes=1500000';
-- and what they allow
ALTER SYSTEM SET outbox.kafka_config = 'acks=all;topic.acks=-1;acks=ALL;max.in.flight=5;queue.buffering.backpressure.threshold=1';
ALTER SYSTEM SET outbox.kafka_config = 'session.timeout.ms=3000;max.poll.interval.ms=3000;fetch.max.bytes=1000000;reconnect.backoff.ms=50;reconnect.backoff.max.ms=500';
-- callbacks and interceptors have no string form: librdkafka refuses them
ALTER SYSTEM SET outbox.kafka_config = 'partitioner_cb=0x1234';
ALTER SYSTEM SET outbox.kafka_config = 'interceptors=x';
-- partitioners that hash the (never empty) key are fine
ALTER SYSTEM SET outbox.kafka_config = 'partitioner=consistent';
ALTER SYSTEM SET outbox.kafka_config = 'partitioner=consistent_random';
ALTER SYSTEM SET outbox.kafka_config = 'partitioner=murmur2';
ALTER SYSTEM SET outbox.kafka_config = 'partitioner=fnv1a_random';
ALTER SYSTEM SET outbox.kafka_config = 'message.max.bytes=2000';
-- several properties, spaces allowed around them
ALTER SYSTEM SET outbox.kafka_config = 'linger.ms=5; compression.codec=lz4; acks=all';
ALTER SYSTEM RESET outbox.kafka_config;

-- a page's bytes: between 1kB and 1GB
ALTER SYSTEM SET outbox.batch_max_bytes = 512;
\echo :LAST_ERROR_SQLSTATE
ALTER SYSTEM SET outbox.batch_max_bytes = '1025MB';
ALTER SYSTEM SET outbox.batch_max_bytes = '16MB';
ALTER SYSTEM RESET outbox.batch_max_bytes;

-- how long a silent partition waits before it is held: 0 (never) to an hour
ALTER SYSTEM SET outbox.hold_after = -1;
\echo :LAST_ERROR_SQLSTATE
ALTER SYSTEM SET outbox.hold_after = '2h';
ALTER SYSTEM SET outbox.hold_after = 0;
ALTER SYSTEM SET outbox.hold_after = '2s';
ALTER SYSTEM RESET outbox.hold_after;

-- subscriptions one database may have (and workers it may run): 0 to 256
ALTER SYSTEM SET outbox.max_subscriptions_per_database = -1;
\echo :LAST_ERROR_SQLSTATE
ALTER SYSTEM SET outbox.max_subscriptions_per_database = 257;
ALTER SYSTEM SET outbox.max_subscriptions_per_database = 0;
ALTER SYSTEM RESET outbox.max_subscriptions_per_database;

-- the standbys' slots: physical slot names, split and down-cased as
-- identifiers; whether they exist is the relay's to say
ALTER SYSTEM SET outbox.synchronized_standby_slots = 'standby-1';
\echo :LAST_ERROR_SQLSTATE
ALTER SYSTEM SET outbox.synchronized_standby_slots = '"Standby1"';
ALTER SYSTEM SET outbox.synchronized_standby_slots = 'a,,b';
ALTER SYSTEM SET outbox.synchronized_standby_slots = 'Standby1, standby_2';
SELECT t.err($$SET outbox.synchronized_standby_slots = 's1'$$);
ALTER SYSTEM RESET outbox.synchronized_standby_slots;

-- credentials belong in a file: PostgreSQL logs a changed setting's value
-- (relative paths are from the data directory)
ALTER SYSTEM SET outbox.kafka_secrets_file = 'no_such_file.conf';
SELECT current_setting('data_directory') AS datadir \gset
\set secrets_ok :datadir '/outbox_secrets_ok.conf'
\set secrets_bad :datadir '/outbox_secrets_bad.conf'
\set secrets_semicolon :datadir '/outbox_secrets_semicolon.conf'
COPY (SELECT '# Kafka credentials' UNION ALL SELECT 'sasl.username=outbox'
      UNION ALL SELECT 'sasl.password=hunter2'
      UNION ALL SELECT 'schema.registry.basic.auth.user.info=outbox:hunter2') TO :'secrets_ok';
ALTER SYSTEM SET outbox.kafka_secrets_file = 'outbox_secrets_ok.conf';
COPY (SELECT 'sasl.password=hunter2' UNION ALL SELECT 'acks=banana') TO :'secrets_bad';
ALTER SYSTEM SET outbox.kafka_secrets_file = 'outbox_secrets_bad.conf';
COPY (SELECT 'sasl.password=hunter2;acks=all') TO :'secrets_semicolon';
ALTER SYSTEM SET outbox.kafka_secrets_file = 'outbox_secrets_semicolon.conf';
-- errors about the file name the line, never any part of it
\set secrets_nokv :datadir '/outbox_secrets_nokv.conf'
\set secrets_badname :datadir '/outbox_secrets_badname.conf'
\set secrets_badvalue :datadir '/outbox_secrets_badvalue.conf'
\set secrets_long :datadir '/outbox_secrets_long.conf'
\set secrets_plugin :datadir '/outbox_secrets_plugin.conf'
\set secrets_size :datadir '/outbox_secrets_size.conf'
\set secrets_maxline :datadir '/outbox_secrets_maxline.conf'
COPY (SELECT 'sasl.username=outbox' UNION ALL SELECT 'hunter2') TO :'secrets_nokv';
ALTER SYSTEM SET outbox.kafka_secrets_file = 'outbox_secrets_nokv.conf';
COPY (SELECT '# comment' UNION ALL SELECT 'hunter2.no.such.property=1') TO :'secrets_badname';
ALTER SYSTEM SET outbox.kafka_secrets_file = 'outbox_secrets_badname.conf';
COPY (SELECT 'acks=hunter2') TO :'secrets_badvalue';
ALTER SYSTEM SET outbox.kafka_secrets_file = 'outbox_secrets_badvalue.conf';
COPY (SELECT 'sasl.username=outbox' UNION ALL SELECT 'sasl.password=hunter2' || repeat('x', 4096)) TO :'secrets_long';
ALTER SYSTEM SET outbox.kafka_secrets_file = 'outbox_secrets_long.conf';
COPY (SELECT 'plugin.library.paths=/tmp/hunter2.so') TO :'secrets_plugin';
ALTER SYSTEM SET outbox.kafka_secrets_file = 'outbox_secrets_plugin.conf';
-- the relay's rules hold for the secrets file too
\set secrets_acks :datadir '/outbox_secrets_acks.conf'
COPY (SELECT 'sasl.username=outbox' UNION ALL SELECT 'acks=1') TO :'secrets_acks';
ALTER SYSTEM SET outbox.kafka_secrets_file = 'outbox_secrets_acks.conf';
-- emit() reads message.max.bytes from outbox.kafka_config only
COPY (SELECT 'message.max.bytes=2000') TO :'secrets_size';
ALTER SYSTEM SET outbox.kafka_secrets_file = 'outbox_secrets_size.conf';
-- a line of 4096 bytes is the longest accepted
COPY (SELECT 'sasl.password=' || repeat('x', 4096 - 14)) TO :'secrets_maxline';
ALTER SYSTEM SET outbox.kafka_secrets_file = 'outbox_secrets_maxline.conf';
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
-- nor raise the payload limit or widen the topic allow-list
SELECT t.err($$SET outbox.max_payload_bytes = '64kB'$$);
SELECT t.err($$SET outbox.allowed_topics = '*'$$);
-- session settings are anyone's
SELECT t.err($$SET outbox.tenant = 'acme'$$);
RESET ROLE;
DROP ROLE outbox_plain;

-- pg_monitor includes pg_read_all_settings: a monitoring role with it reads
-- outbox.kafka_config (and every other superuser-only setting), but not
-- the contents of the secrets file
CREATE ROLE outbox_monitor IN ROLE pg_monitor;
SET ROLE outbox_monitor;
SELECT t.err($$SHOW outbox.kafka_config$$);
SELECT t.err($$SHOW outbox.kafka_secrets_file$$);
SELECT t.err(format('SELECT pg_read_file(%L)', :'secrets_ok'));
RESET ROLE;
DROP ROLE outbox_monitor;

-- exactly_once: the delivery mode, the progress topic's name and the
-- transactional id's suffix are judged when set
ALTER SYSTEM SET outbox.delivery = 'exactly-once';
\echo :LAST_ERROR_SQLSTATE
ALTER SYSTEM SET outbox.progress_topic = 'no spaces';
\echo :LAST_ERROR_SQLSTATE
ALTER SYSTEM SET outbox.progress_topic = '..';
ALTER SYSTEM SET outbox.transactional_id_suffix = 'dc/2';
\echo :LAST_ERROR_SQLSTATE
ALTER SYSTEM SET outbox.transactional_id_suffix = 'a-suffix-much-longer-than-sixty-four-characters-is-refused-all-the-same';
SELECT t.err($$SET outbox.delivery = 'exactly_once'$$);
ALTER SYSTEM SET outbox.delivery = 'exactly_once';
ALTER SYSTEM SET outbox.progress_topic = 'ops.outbox-progress_1';
ALTER SYSTEM SET outbox.transactional_id_suffix = 'dc-2';
ALTER SYSTEM RESET outbox.delivery;
ALTER SYSTEM RESET outbox.progress_topic;
ALTER SYSTEM RESET outbox.transactional_id_suffix;

-- the message format and the CloudEvents source are judged when set
ALTER SYSTEM SET outbox.message_format = 'cloudevents';
\echo :LAST_ERROR_SQLSTATE
ALTER SYSTEM SET outbox.cloudevents_source = 'has a space';
\echo :LAST_ERROR_SQLSTATE
ALTER SYSTEM SET outbox.cloudevents_source = E'line\nbreak';
ALTER SYSTEM SET outbox.cloudevents_source = 'https://shop.example/orders?x="1"';
ALTER SYSTEM SET outbox.cloudevents_source = 'urn:x:%zz';
SELECT t.err($$SET outbox.message_format = 'cloudevents_binary'$$);
ALTER SYSTEM SET outbox.message_format = 'cloudevents_structured';
ALTER SYSTEM SET outbox.cloudevents_source = 'https://shop.example/orders?x=%221%22&y=(a,b)';
ALTER SYSTEM RESET outbox.message_format;
ALTER SYSTEM RESET outbox.cloudevents_source;

-- the schema registry: an http(s) URL, credentials only in the secrets
-- file (a refused URL is not quoted: it may hold them); the Avro topics
ALTER SYSTEM SET outbox.schema_registry_url = 'ftp://registry:8081';
ALTER SYSTEM SET outbox.schema_registry_url = 'http://outbox:hunter2@registry:8081';
ALTER SYSTEM SET outbox.schema_registry_url = 'https://';
ALTER SYSTEM SET outbox.schema_registry_url = 'http://127.0.0.1:8081/apis/ccompat/v7';
ALTER SYSTEM RESET outbox.schema_registry_url;
ALTER SYSTEM SET outbox.kafka_config = 'schema.registry.basic.auth.user.info=outbox:hunter2';
ALTER SYSTEM SET outbox.avro_topics = 'shop.orders, bad topic';
ALTER SYSTEM SET outbox.avro_topics = ' shop.orders ,*';
ALTER SYSTEM RESET outbox.avro_topics;
ALTER SYSTEM SET outbox.schema_registry_timeout = 50;
SELECT t.err($$SET outbox.avro_topics = '*'$$);
