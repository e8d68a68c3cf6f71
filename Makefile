# outbox: PGXS build.  The version lives in outbox.control only.

EXTENSION = outbox
MODULE_big = outbox
OBJS = src/common_spi.o src/outbox.o src/shmem.o src/handoff.o src/utility.o src/emit.o src/emit_check.o src/emit_counter.o src/emit_direct.o src/emit_table.o src/emit_uuid.o src/status_health.o src/status_metrics.o \
	src/topic.o src/sequence.o src/counter.o src/launcher.o src/launcher_consumers.o src/relay.o src/relay_round.o \
	src/relay_page.o src/relay_hold.o src/relay_standby.o src/message.o src/store.o src/store_dead.o \
	src/store_upkeep.o src/store_held.o src/kafka.o src/kafka_topic.o \
	src/kafka_settings.o src/status.o src/probe.o src/inbox_shmem.o \
	src/subscribe.o src/subscription_status.o src/consumer.o src/consumer_range.o src/kafka_consumer.o
DATA = $(wildcard sql/$(EXTENSION)--*.sql)

RDKAFKA_CFLAGS := $(shell pkg-config --cflags rdkafka 2>/dev/null)
RDKAFKA_LIBS := $(shell pkg-config --libs rdkafka 2>/dev/null)
ifeq ($(shell pkg-config --exists rdkafka && echo yes),)
$(error librdkafka not found by pkg-config: install librdkafka-dev (Debian) and pkg-config)
endif
PG_CPPFLAGS = $(RDKAFKA_CFLAGS)
SHLIB_LINK = $(RDKAFKA_LIBS)

# pg_regress: emit() without preload, against a throwaway instance
REGRESS = setup emit capture privileges settings replay sequence inbox subscription
REGRESS_OPTS = --temp-instance=tmp_check_regress --temp-config=test/regress.conf

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
$(OBJS): src/outbox.h src/compat.h src/relay.h src/store.h src/kafka.h

test-broker:
	$(MAKE) -C test/broker

# the 3xx TAP files run Apache Kafka: fetched through Maven once
kafka-lib:
	@case "$(PROVE_TESTS)" in *test/t/3* | *'test/t/*.pl'*) test/kafka/apache fetch ;; esac

installcheck: test-broker kafka-lib

.PHONY: test-broker kafka-lib
