# outbox: PGXS build.  The version lives in outbox.control only.

EXTENSION = outbox
MODULE_big = outbox
OBJS = src/outbox.o src/shmem.o src/handoff.o src/utility.o src/emit.o \
	src/topic.o src/sequence.o src/counter.o src/launcher.o src/launcher_consumers.o src/launcher_relays.o src/relay.o src/relay_round.o \
	src/relay_page.o src/relay_hold.o src/relay_standby.o src/relay_state.o src/relay_producer.o src/message.o src/store.o src/store_dead.o \
	src/store_upkeep.o src/store_held.o src/kafka.o src/kafka_topic.o \
	src/kafka_settings.o src/status.o src/probe.o src/inbox_shmem.o \
	src/subscribe.o src/subscription_status.o src/consumer.o src/consumer_range.o src/kafka_consumer.o src/consumer_worker.o src/consumer_message.o src/consumer_subscription.o src/consumer_dead.o src/consumer_offsets.o src/consumer_apply.o src/consumer_batch.o src/consumer_replay.o src/subscribe_handler.o src/spi_exec.o src/worker.o

# the frozen 1.0 script and the upgrade chain as they are; the current
# version's script built from sql/outbox.sql (the version read from
# outbox.control), so CREATE EXTENSION of an older version walks the chain
EXTVERSION := $(shell sed -n "s/^default_version *= *'\([^']*\)'.*/\1/p" $(EXTENSION).control)
ifeq ($(EXTVERSION),)
$(error no default_version found in $(EXTENSION).control)
endif
DATA = sql/$(EXTENSION)--1.0.sql $(wildcard sql/$(EXTENSION)--*--*.sql)
DATA_built = sql/$(EXTENSION)--$(EXTVERSION).sql

RDKAFKA_CFLAGS := $(shell pkg-config --cflags rdkafka 2>/dev/null)
RDKAFKA_LIBS := $(shell pkg-config --libs rdkafka 2>/dev/null)
ifeq ($(shell pkg-config --exists rdkafka && echo yes),)
$(error librdkafka not found by pkg-config: install librdkafka-dev (Debian) and pkg-config)
endif
PG_CPPFLAGS = $(RDKAFKA_CFLAGS)
SHLIB_LINK = $(RDKAFKA_LIBS)

# pg_regress (test/sql, test/expected): emit() without preload, against a
# throwaway instance
REGRESS = setup emit capture privileges settings replay sequence inbox subscription
REGRESS_OPTS = --inputdir=test --temp-instance=tmp_check_regress --temp-config=test/regress.conf

# isolation: concurrency claims
ISOLATION = aggregate_order inbox_race emit_moved
ISOLATION_OPTS = --inputdir=test --temp-instance=tmp_check_iso --temp-config=test/regress.conf

# TAP: the workers' life, read back through kcat
TAP_TESTS = 1
PROVE_TESTS = test/t/*.pl

PG_CONFIG ?= pg_config
PGXS := $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)

# after the include: Makefile.global sets PROVE_FLAGS itself
PROVE_FLAGS += -I test/perl

# every object depends on the shared headers (PGXS tracks no header)
$(OBJS): src/outbox.h src/compat.h src/relay_state.h src/store.h src/kafka.h src/shmem_area.h src/consumer_worker.h

sql/$(EXTENSION)--$(EXTVERSION).sql: sql/$(EXTENSION).sql $(EXTENSION).control
	cp $< $@

test-broker:
	$(MAKE) -C test/broker

# the 3xx TAP files run Apache Kafka: fetched through Maven once
kafka-lib:
	@case "$(PROVE_TESTS)" in *test/t/3* | *'test/t/*.pl'*) test/kafka/apache fetch ;; esac

installcheck: test-broker kafka-lib

.PHONY: test-broker kafka-lib
