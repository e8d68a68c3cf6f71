# outbox: PGXS build.  The version lives in outbox.control only: META.json
# (for PGXN) is made from META.json.in with it, and debian/changelog is
# checked against it (test/t/027_dist.pl).

EXTENSION = outbox
MODULE_big = outbox
# every C file of src/ and its folders
OBJS = $(patsubst %.c,%.o,$(sort $(wildcard src/*.c src/*/*.c)))

# the frozen 1.0 script and the upgrade chain as they are; the current
# version's script built from sql/outbox.sql (the version read from
# outbox.control), so CREATE EXTENSION of an older version walks the chain
EXTVERSION := $(shell sed -n "s/^default_version *= *'\([^']*\)'.*/\1/p" $(EXTENSION).control)
ifeq ($(EXTVERSION),)
$(error no default_version found in $(EXTENSION).control)
endif
# PGXN and Debian want three numbers: 1.8 is 1.8.0
DISTVERSION := $(if $(word 3,$(subst ., ,$(EXTVERSION))),$(EXTVERSION),$(EXTVERSION).0)
DATA = sql/$(EXTENSION)--1.0.sql $(wildcard sql/$(EXTENSION)--*--*.sql)
DATA_built = sql/$(EXTENSION)--$(EXTVERSION).sql

RDKAFKA_CFLAGS := $(shell pkg-config --cflags rdkafka 2>/dev/null)
RDKAFKA_LIBS := $(shell pkg-config --libs rdkafka 2>/dev/null)
ifeq ($(shell pkg-config --exists rdkafka && echo yes),)
$(error librdkafka not found by pkg-config: install librdkafka-dev (Debian) and pkg-config)
endif
# Avro through a schema registry: avro-c encodes, libcurl asks the registry
AVRO_CFLAGS := $(shell pkg-config --cflags avro-c libcurl 2>/dev/null)
AVRO_LIBS := $(shell pkg-config --libs avro-c libcurl 2>/dev/null)
ifeq ($(shell pkg-config --exists avro-c 'libcurl >= 7.85' && echo yes),)
$(error avro-c or libcurl 7.85 or later not found by pkg-config: install libavro-dev and libcurl4-openssl-dev (Debian))
endif
# a room's header is named by its folder: #include "relay/relay.h"
PG_CPPFLAGS = -I$(srcdir)/src $(RDKAFKA_CFLAGS) $(AVRO_CFLAGS)
SHLIB_LINK = $(RDKAFKA_LIBS) $(AVRO_LIBS)

# pg_regress (test/sql, test/expected): emit() without preload, against a
# throwaway instance
REGRESS = setup emit emit_shapes avro capture privileges settings replay sequence inbox subscription drop
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

# after the include: Makefile.global sets PROVE_FLAGS itself.
# PROVE_JOBS=N runs N TAP files at a time, among those test/tap-rules.yml
# lets share the machine; the others run alone
PROVE_JOBS ?= 1
PROVE_FLAGS += -I test/perl -j$(PROVE_JOBS)
export HARNESS_RULESFILE = test/tap-rules.yml

# PGXS tracks no header: the compiler writes each object's header
# dependencies beside it (src/<room>/<file>.d), read back at the next make.
# The bitcode a server built with LLVM also compiles writes none: it would
# overwrite the object's with its own target, and a header's change would
# then rebuild no object
override CPPFLAGS += -MMD -MP
COMPILE.c.bc = $(CLANG) -Wno-ignored-attributes $(BITCODE_CFLAGS) \
	$(filter-out -MMD -MP,$(CPPFLAGS)) -flto=thin -emit-llvm -c
-include $(OBJS:.o=.d)
EXTRA_CLEAN = $(OBJS:.o=.d) META.json

sql/$(EXTENSION)--$(EXTVERSION).sql: sql/$(EXTENSION).sql $(EXTENSION).control
	cp $< $@

META.json: META.json.in $(EXTENSION).control
	sed 's/@VERSION@/$(DISTVERSION)/g' $< >$@

# the version the release files carry (test/package-check asks)
distversion:
	@echo $(DISTVERSION)

# the PGXN release: HEAD's files and the made META.json, under
# outbox-VERSION/ in outbox-VERSION.zip; the version must be HEAD's
dist: META.json
	@git diff --quiet HEAD -- $(EXTENSION).control META.json.in || \
		{ echo "make dist: $(EXTENSION).control or META.json.in differs from HEAD; commit first" >&2; exit 1; }
	git archive --format zip --prefix=$(EXTENSION)-$(DISTVERSION)/ \
		--add-file=META.json -o $(EXTENSION)-$(DISTVERSION).zip HEAD

test-broker:
	$(MAKE) -C test/broker

# the 3xx TAP files run Apache Kafka: fetched through Maven once
kafka-lib:
	@case "$(PROVE_TESTS)" in *test/t/3* | *test/drills/* | *test/soak/* | *'test/t/*.pl'*) test/kafka/apache fetch ;; esac

installcheck: test-broker kafka-lib

.PHONY: dist distversion test-broker kafka-lib
