/*-------------------------------------------------------------------------
 *
 * kafka/kafka_settings.c
 *		What outbox allows in librdkafka's settings, and the form of the
 *		secrets file: the rules that need no librdkafka call.  producer.c
 *		applies them, and has librdkafka judge what they let through.
 *
 * Invariants:
 *	- No librdkafka here (producer.c is the only file that includes rdkafka.h):
 *	  the check hook of outbox.kafka_config runs these rules in every
 *	  backend at each reload.
 *	- A property outbox owns, or one that would let a setting load or run
 *	  code in the server, is refused whatever its value; a value that
 *	  breaks the ordering promise, or that librdkafka would refuse when the
 *	  relay or a subscription makes its client with outbox's own settings,
 *	  is refused by value.  So a value the check hook lets through never
 *	  leaves a relay or a subscription unable to make its client.
 *	- Nothing of a secrets file's lines is ever put in a message: a
 *	  message names the line by number.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "storage/fd.h"

#include "kafka/kafka.h"

/* properties outbox owns; setting them in outbox.kafka_config is refused */
static const char *const reserved_properties[][2] = {
	{"bootstrap.servers", "Set outbox.kafka_brokers instead."},
	{"metadata.broker.list", "Set outbox.kafka_brokers instead."},
	{"enable.idempotence", "The relay's ordering promise needs the idempotent producer."},

	/*
	 * A batch that runs out of retries fails while the later batches of its
	 * partition go through, so the relay's resend would land behind them
	 * (test/t/102_request_errors.pl); so does a message timeout that fails
	 * part of a partition's queue.  librdkafka retries without end here,
	 * and the relay withdraws a whole round after outbox.delivery_timeout.
	 */
	{"message.send.max.retries", "The relay's ordering promise needs librdkafka to retry until the relay gives up on the round."},
	{"retries", "The relay's ordering promise needs librdkafka to retry until the relay gives up on the round."},
	{"message.timeout.ms", "Set outbox.delivery_timeout: the relay withdraws an unacknowledged round and resends it in order."},
	{"delivery.timeout.ms", "Set outbox.delivery_timeout: the relay withdraws an unacknowledged round and resends it in order."},
	{"log.queue", "The relay serves librdkafka logs from its own thread."},
	{"transactional.id", "outbox.delivery = exactly_once sets it from the database's identity; outbox.transactional_id_suffix adds to it."},

	/* what a subscription's consumer sets itself (kafka_consumer.c) */
	{"group.id", "A subscription's consumer group is named for its group_id: see outbox.subscribe()."},
	{"auto.offset.reset", "A subscription starts where the database's offsets say; a position outside the log stops the partition until outbox.subscription_seek()."},
	{"enable.auto.commit", "A subscription's offsets are committed in the database, with the messages applied."},
	{"enable.auto.offset.store", "A subscription's offsets are committed in the database, with the messages applied."},
	{"enable.partition.eof", "Subscriptions do not take end-of-partition events."},
	{"isolation.level", "Subscriptions read committed messages only."},

	/*
	 * Properties that make the server process load or run code named in a
	 * setting: a configuration mistake or a stolen superuser session should
	 * not become a shared library in every backend (librdkafka loads
	 * plugins as soon as the property is set, in the check hook).
	 */
	{"plugin.library.paths", "It loads shared libraries into the server."},
	{"ssl.engine.location", "It loads a shared library into the server."},
	{"ssl.providers", "It loads OpenSSL provider modules into the server; configure them in OpenSSL's own configuration file."},
	{"sasl.kerberos.kinit.cmd", "It runs a shell command from the server; keep librdkafka's default kinit command."},
};

/*
 * Values of a property that are refused: a text (letter case aside), or an
 * integer above a bound or other than the one allowed.  The relay always
 * sends a non-empty key (emit() refuses an empty one), so every other
 * partitioner maps a key to one partition: the *_random ones are random
 * only for a NULL key (consistent_random also for an empty one).  The
 * relay's producer is idempotent (enable.idempotence is outbox's), and
 * librdkafka refuses to make one with acks other than all, more than 5
 * requests in flight or a backpressure threshold above 1.
 */
typedef enum ValueRule
{
	REFUSE_TEXT,				/* text is refused */
	REFUSE_ABOVE,				/* an integer above bound is refused */
	REQUIRE_INT					/* an integer other than bound (or text,
								 * its name) is refused */
} ValueRule;

typedef struct ValueRefusal
{
	const char *name;
	ValueRule	rule;
	const char *text;
	int			bound;
	const char *why;
} ValueRefusal;

#define ACKS_WHY "The relay's producer is idempotent, which needs acks=all: an event is acknowledged once every in-sync replica has it."
#define IN_FLIGHT_WHY "The relay's idempotent producer keeps each partition's order with at most 5 requests in flight."

static const ValueRefusal refused_values[] = {
	{"partitioner", REFUSE_TEXT, "random", 0, "Events of one aggregate must go to one partition: use a partitioner that hashes the key."},
	{"queuing.strategy", REFUSE_TEXT, "lifo", 0, "The relay's ordering promise needs queuing.strategy fifo."},
	{"acks", REQUIRE_INT, "all", -1, ACKS_WHY},
	{"request.required.acks", REQUIRE_INT, "all", -1, ACKS_WHY},
	{"max.in.flight", REFUSE_ABOVE, NULL, 5, IN_FLIGHT_WHY},
	{"max.in.flight.requests.per.connection", REFUSE_ABOVE, NULL, 5, IN_FLIGHT_WHY},
	{"queue.buffering.backpressure.threshold", REFUSE_ABOVE, NULL, 1, "The relay's idempotent producer needs a threshold of 1."},
	{"group.protocol", REFUSE_TEXT, "consumer", 0, "Subscriptions set session.timeout.ms and heartbeat.interval.ms, which that group protocol leaves to the broker."},
};

/*
 * Pairs librdkafka refuses when a client is made: low must not exceed
 * high.  Each side's value when outbox.kafka_config leaves it unset is
 * what the relay and the subscriptions run with (-1: the pair is judged
 * only when high is set).
 */
typedef struct PairRule
{
	const char *low;
	int			low_default;
	const char *high;
	int			high_default;
} PairRule;

static const PairRule pair_rules[] = {
	{"reconnect.backoff.ms", 100, "reconnect.backoff.max.ms", 10000},
	{"session.timeout.ms", OUTBOX_KAFKA_SESSION_TIMEOUT_MS, "max.poll.interval.ms", 300000},
	{"message.max.bytes", OUTBOX_KAFKA_MESSAGE_MAX_DEFAULT, "fetch.max.bytes", -1},
};

/*
 * In the secrets file: a property emit() must see too (it is read from
 * outbox.kafka_config only, by every backend).
 */
static const char *const not_secret_properties[][2] = {
	{"message.max.bytes", "It belongs in outbox.kafka_config, where emit() reads it to check event sizes."},
};

/*
 * OutboxKafkaPropertyIsSecret
 *		Whether a property's value may be a secret, by its name: such a
 *		value is never quoted in a message.
 */
bool
OutboxKafkaPropertyIsSecret(const char *name)
{
	return strstr(name, "password") != NULL || strstr(name, "secret") != NULL ||
		strstr(name, "key") != NULL || strstr(name, "token") != NULL ||
		strstr(name, "jaas") != NULL;
}

/* whether name, or name without librdkafka's "topic." prefix, is property */
static bool
names(const char *name, const char *property)
{
	return strcmp(name, property) == 0 ||
		(strncmp(name, "topic.", 6) == 0 && strcmp(name + 6, property) == 0);
}

/*
 * int_value
 *		An integer property's value as librdkafka reads it: strtol in any
 *		base, else the integer named by alias (in any letter case).  False
 *		when it is neither: librdkafka refuses it itself.
 */
static bool
int_value(const char *value, const char *alias, int bound, long *result)
{
	char	   *end;

	*result = strtol(value, &end, 0);
	if (end != value)
		return true;
	if (alias != NULL && pg_strcasecmp(value, alias) == 0)
	{
		*result = bound;
		return true;
	}
	return false;
}

/* whether r refuses value */
static bool
value_refused(const ValueRefusal *r, const char *value)
{
	long		n;

	if (r->rule == REFUSE_TEXT)
		return pg_strcasecmp(value, r->text) == 0;
	if (!int_value(value, r->text, r->bound, &n))
		return false;
	return r->rule == REFUSE_ABOVE ? n > r->bound : n != r->bound;
}

/*
 * OutboxKafkaPropertyRefusal
 *		Why outbox refuses this property and value, or NULL; *by_value
 *		tells whether only this value is refused.  librdkafka also accepts a
 *		topic property with a "topic." prefix, so the name is judged without
 *		it too; it reads some values (queuing.strategy) in any letter case.
 */
const char *
OutboxKafkaPropertyRefusal(const char *name, const char *value, bool from_secrets,
						   bool *by_value)
{
	int			i;

	*by_value = false;
	if (strcmp(name, OUTBOX_REGISTRY_AUTH_PROPERTY) == 0 && !from_secrets)
		return "The schema registry's credentials go in outbox.kafka_secrets_file.";
	for (i = 0; i < lengthof(reserved_properties); i++)
		if (names(name, reserved_properties[i][0]))
			return reserved_properties[i][1];
	for (i = 0; i < lengthof(refused_values); i++)
		if (names(name, refused_values[i].name) &&
			value_refused(&refused_values[i], value))
		{
			*by_value = true;
			return refused_values[i].why;
		}
	if (from_secrets)
		for (i = 0; i < lengthof(not_secret_properties); i++)
			if (names(name, not_secret_properties[i][0]))
				return not_secret_properties[i][1];
	return NULL;
}

/*
 * last_int
 *		The integer the last "name=value" of text gives name (the last one
 *		is the one librdkafka keeps), or dflt when none does.
 */
static long
last_int(const char *text, const char *name, long dflt)
{
	char	   *copy = pstrdup(text);
	char	   *item;
	char	   *save = NULL;
	long		result = dflt;

	for (item = strtok_r(copy, ";", &save); item != NULL;
		 item = strtok_r(NULL, ";", &save))
	{
		char	   *n;
		char	   *v;
		long		i;

		while (*item == ' ' || *item == '\t' || *item == '\n')
			item++;
		if (OutboxKafkaSplitProperty(item, &n, &v) && strcmp(n, name) == 0 &&
			int_value(v, NULL, 0, &i))
			result = i;
	}
	pfree(copy);
	return result;
}

/*
 * OutboxKafkaConfigConflict
 *		For outbox.kafka_config's check hook, once each property passed:
 *		a pair of properties librdkafka would refuse together when the
 *		relay or a subscription makes its client.  False with *detail and
 *		*hint (palloc'd sentences naming the properties) when there is one.
 */
bool
OutboxKafkaConfigConflict(const char *text, char **detail, char **hint)
{
	int			i;

	for (i = 0; i < lengthof(pair_rules); i++)
	{
		const PairRule *p = &pair_rules[i];
		long		high = last_int(text, p->high, p->high_default);
		long		low = last_int(text, p->low, p->low_default);

		if (high < 0 || low <= high)
			continue;
		*detail = psprintf("Property \"%s\" (%ld) is greater than \"%s\" (%ld).",
						   p->low, low, p->high, high);
		*hint = psprintf("librdkafka refuses to make a client whose %s is greater than its %s. "
						 "A property left unset counts with the value the relay and the subscriptions use.",
						 p->low, p->high);
		return false;
	}
	return true;
}

/*
 * OutboxKafkaSplitProperty
 *		Split "name = value" in place; false when there is no '='.
 */
bool
OutboxKafkaSplitProperty(char *item, char **name, char **value)
{
	char	   *eq = strchr(item, '=');

	if (eq == NULL)
		return false;
	*eq = '\0';
	*name = item;
	*value = eq + 1;
	while (eq > item && (eq[-1] == ' ' || eq[-1] == '\t'))
		*--eq = '\0';
	return true;
}

#define SECRETS_FILE_MAX (64 * 1024)
#define SECRETS_LINE_MAX 4096

/*
 * OutboxKafkaReadSecretsText
 *		Read the outbox.kafka_secrets_file at path: librdkafka properties,
 *		one key=value per line of at most SECRETS_LINE_MAX bytes, '#'
 *		starting a comment line; judge (producer.c) judges each, told where it
 *		is ("line 3 of \"path\"").  Returns them as "k=v;k=v" (palloc'd), or
 *		NULL with *errmsg set.  Neither the result's users nor any message
 *		shows any part of a line: a message names the line by number.
 */
char *
OutboxKafkaReadSecretsText(const char *path, OutboxKafkaJudge judge, void *arg,
						   char **errmsg)
{
	FILE	   *f;
	StringInfoData out;

	/* room for a longest line, its \r\n and the terminator */
	char		line[SECRETS_LINE_MAX + 3];
	int			lineno = 0;

	f = AllocateFile(path, "r");
	if (f == NULL)
	{
		*errmsg = psprintf("Could not open \"%s\": %m.", path);
		return NULL;
	}
	initStringInfo(&out);
	while (fgets(line, sizeof(line), f) != NULL)
	{
		char	   *p = line;
		char	   *item;
		char	   *name;
		char	   *value;
		size_t		len;

		lineno++;
		len = strcspn(line, "\r\n");
		if ((line[len] == '\0' && !feof(f)) || len > SECRETS_LINE_MAX)
		{
			*errmsg = psprintf("Line %d of \"%s\" is longer than %d bytes.",
							   lineno, path, SECRETS_LINE_MAX);
			goto fail;
		}
		line[len] = '\0';
		while (*p == ' ' || *p == '\t')
			p++;
		if (*p == '\0' || *p == '#')
			continue;
		if (strchr(p, ';') != NULL)
		{
			*errmsg = psprintf("Line %d of \"%s\" contains \";\": write one property per line.",
							   lineno, path);
			goto fail;
		}
		if (out.len + strlen(p) > SECRETS_FILE_MAX)
		{
			*errmsg = psprintf("\"%s\" is larger than %d bytes.", path, SECRETS_FILE_MAX);
			goto fail;
		}
		appendStringInfo(&out, "%s%s", out.len > 0 ? ";" : "", p);
		item = pstrdup(p);
		if (!OutboxKafkaSplitProperty(item, &name, &value))
		{
			*errmsg = psprintf("Line %d of \"%s\" is not of the form key=value.",
							   lineno, path);
			goto fail;
		}
		if (!judge(name, value, psprintf("line %d of \"%s\"", lineno, path),
				   errmsg, arg))
			goto fail;
		pfree(item);
	}
	FreeFile(f);
	return out.data;

fail:
	FreeFile(f);
	return NULL;
}

/*
 * OutboxKafkaSecretValue
 *		The value text, the secrets file as last read (OutboxKafkaSecretsText),
 *		gives name (the last entry of it), palloc'd, or NULL.  For outbox's
 *		own entries (OUTBOX_REGISTRY_AUTH_PROPERTY), which librdkafka never
 *		sees; the caller never shows it.
 */
char *
OutboxKafkaSecretValue(const char *text, const char *name)
{
	size_t		len = strlen(text);
	char	   *copy = pstrdup(text);
	char	   *item;
	char	   *save = NULL;
	char	   *result = NULL;

	for (item = strtok_r(copy, ";", &save); item != NULL;
		 item = strtok_r(NULL, ";", &save))
	{
		char	   *n;
		char	   *v;

		if (OutboxKafkaSplitProperty(item, &n, &v) && strcmp(n, name) == 0)
		{
			if (result != NULL)
				pfree(result);
			result = pstrdup(v);
		}
	}
	/* every secret of the file was in the copy */
	explicit_bzero(copy, len);
	pfree(copy);
	return result;
}
