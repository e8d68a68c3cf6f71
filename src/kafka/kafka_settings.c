/*-------------------------------------------------------------------------
 *
 * kafka/kafka_settings.c
 *		What outbox allows in librdkafka's settings, and the form of the
 *		secrets file: the rules that need no librdkafka call.  producer.c
 *		applies them, and has librdkafka judge what they let through.
 *
 * Invariants:
 *	- No librdkafka here (producer.c is the only file that includes rdkafka.h).
 *	- A property outbox owns, or one that would let a setting load or run
 *	  code in the server, is refused whatever its value; a value that
 *	  breaks the ordering promise is refused by value.
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
 * Values of a property that are refused.  The relay always sends a
 * non-empty key (emit() refuses an empty one), so every other partitioner
 * maps a key to one partition: the *_random ones are random only for a
 * NULL key (consistent_random also for an empty one).
 */
static const char *const refused_values[][3] = {
	{"partitioner", "random", "Events of one aggregate must go to one partition: use a partitioner that hashes the key."},
	{"queuing.strategy", "lifo", "The relay's ordering promise needs queuing.strategy fifo."},
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
	const char *bare = name;
	int			i;

	*by_value = false;
	if (strncmp(bare, "topic.", 6) == 0)
		bare += 6;
	for (i = 0; i < lengthof(reserved_properties); i++)
		if (strcmp(name, reserved_properties[i][0]) == 0 ||
			strcmp(bare, reserved_properties[i][0]) == 0)
			return reserved_properties[i][1];
	for (i = 0; i < lengthof(refused_values); i++)
		if ((strcmp(name, refused_values[i][0]) == 0 ||
			 strcmp(bare, refused_values[i][0]) == 0) &&
			pg_strcasecmp(value, refused_values[i][1]) == 0)
		{
			*by_value = true;
			return refused_values[i][2];
		}
	if (from_secrets)
		for (i = 0; i < lengthof(not_secret_properties); i++)
			if (strcmp(name, not_secret_properties[i][0]) == 0 ||
				strcmp(bare, not_secret_properties[i][0]) == 0)
				return not_secret_properties[i][1];
	return NULL;
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
