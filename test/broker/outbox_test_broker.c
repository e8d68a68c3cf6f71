/*-------------------------------------------------------------------------
 *
 * outbox_test_broker.c
 *	  Throw-away Kafka cluster for the outbox extension's test suites.
 *
 * This is a TEST TOOL.  It is never built into, installed with, or loaded
 * by the outbox extension and must not be treated as a product component.
 *
 * It starts librdkafka's built-in mock cluster (rdkafka_mock.h) with N
 * brokers listening on random 127.0.0.1 ports (and, with -P, a fixed
 * 127.0.0.1 port relayed to the first of them: forward.c), prints the
 * bootstrap server list as the first line on stdout (and optionally
 * writes it atomically to a file), and then applies fault-injection
 * commands read one per line from a FIFO (-c) or from stdin.  Every command is acknowledged with a
 * single "ok ..." or "error ..." line on stdout.  See README.md.
 *
 * The mock cluster API is marked experimental by librdkafka; this file is
 * written against librdkafka 2.0.2.
 *
 * IDENTIFICATION
 *	  test/broker/outbox_test_broker.c
 *
 *-------------------------------------------------------------------------
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>

#include "forward.h"

/* librdkafka 2.0.2 always auto-creates topics with this many partitions */
#define MOCK_AUTO_CREATE_PARTITIONS 4

#define MAX_LINE		1024
#define MAX_ARGS		8
#define MAX_ERROR_COUNT 100000

typedef struct NameValue
{
	const char *name;
	int			value;
} NameValue;

/* Kafka protocol request types that are useful to inject errors into */
static const NameValue api_keys[] = {
	{"produce", 0},
	{"fetch", 1},
	{"listoffsets", 2},
	{"metadata", 3},
	{"offsetcommit", 8},
	{"offsetfetch", 9},
	{"findcoordinator", 10},
	{"joingroup", 11},
	{"heartbeat", 12},
	{"leavegroup", 13},
	{"syncgroup", 14},
	{"apiversions", 18},
	{"initproducerid", 22},
	{"addpartitionstotxn", 24},
	{"addoffsetstotxn", 25},
	{"endtxn", 26},
	{"txnoffsetcommit", 28},
	{NULL, 0}
};

/*
 * Kafka's official error names where librdkafka spells them differently,
 * plus a convenience alias.  Anything else is looked up in librdkafka's own
 * error table (rd_kafka_get_err_descs).
 */
static const NameValue error_aliases[] = {
	{"MESSAGE_TOO_LARGE", RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE},
	{"INVALID_TOPIC_EXCEPTION", RD_KAFKA_RESP_ERR_TOPIC_EXCEPTION},
	{"NOT_LEADER_OR_FOLLOWER", RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION},
	{"CORRUPT_MESSAGE", RD_KAFKA_RESP_ERR_INVALID_MSG},
	{"DISCONNECT", RD_KAFKA_RESP_ERR__TRANSPORT},
	{NULL, 0}
};

static volatile sig_atomic_t got_signal = 0;
static rd_kafka_mock_cluster_t *mcluster = NULL;
static int	default_partitions = MOCK_AUTO_CREATE_PARTITIONS;

static void
usage(const char *progname)
{
	fprintf(stderr,
			"usage: %s [-b BROKERS] [-p PARTITIONS] [-c CONTROL_FIFO] "
			"[-f BOOTSTRAP_FILE] [-P PORT] [-t TOPIC[:PARTITIONS]]...\n"
			"Test tool: runs a librdkafka mock Kafka cluster on 127.0.0.1.\n"
			"-P: bootstrap through 127.0.0.1:PORT, relayed to the first broker.\n"
			"Commands (one per line, on the FIFO or stdin):\n"
			"  down|up <broker_id|all>\n"
			"  rtt <broker_id|all> <ms>\n"
			"  errors <api> <count> <error>\n"
			"  clear-errors <api>\n"
			"  topic-error <topic> <error>     (0 clears)\n"
			"  create <topic> [partitions]\n"
			"  quit\n",
			progname);
}

static void
handle_signal(int signo)
{
	got_signal = signo;
}

/*
 * Print one acknowledgement line on stdout and flush it, so that a test
 * driver reading our output sees it immediately.
 */
static void
reply(const char *fmt,...)
{
	va_list		ap;

	va_start(ap, fmt);
	vfprintf(stdout, fmt, ap);
	va_end(ap);
	fputc('\n', stdout);
	fflush(stdout);
}

/* Parse a base-10 integer in [min, max]; returns false on any junk. */
static bool
parse_long(const char *s, long min, long max, long *result)
{
	char	   *end;
	long		val;

	if (s == NULL || *s == '\0')
		return false;
	errno = 0;
	val = strtol(s, &end, 10);
	if (errno != 0 || *end != '\0' || val < min || val > max)
		return false;
	*result = val;
	return true;
}

/* "all" means every broker (-1 for the mock API), else a broker id. */
static bool
parse_broker(const char *s, int32_t *broker_id)
{
	long		val;

	if (s != NULL && strcasecmp(s, "all") == 0)
	{
		*broker_id = -1;
		return true;
	}
	if (!parse_long(s, 0, INT32_MAX, &val))
		return false;
	*broker_id = (int32_t) val;
	return true;
}

static bool
parse_api_key(const char *s, int16_t *api_key)
{
	long		val;
	int			i;

	if (parse_long(s, 0, INT16_MAX, &val))
	{
		*api_key = (int16_t) val;
		return true;
	}
	for (i = 0; s != NULL && api_keys[i].name != NULL; i++)
	{
		if (strcasecmp(s, api_keys[i].name) == 0)
		{
			*api_key = (int16_t) api_keys[i].value;
			return true;
		}
	}
	return false;
}

/*
 * Accept a plain number, a Kafka error name, or a librdkafka error name
 * with or without the RD_KAFKA_RESP_ERR_ prefix (case-insensitive).
 */
static bool
parse_error_code(const char *s, rd_kafka_resp_err_t *err)
{
	const struct rd_kafka_err_desc *descs;
	size_t		ndescs;
	size_t		i;
	long		val;

	if (s == NULL)
		return false;
	if (parse_long(s, INT16_MIN, INT16_MAX, &val))
	{
		*err = (rd_kafka_resp_err_t) val;
		return true;
	}
	if (strncasecmp(s, "RD_KAFKA_RESP_ERR_", 18) == 0)
		s += 18;

	for (i = 0; error_aliases[i].name != NULL; i++)
	{
		if (strcasecmp(s, error_aliases[i].name) == 0)
		{
			*err = (rd_kafka_resp_err_t) error_aliases[i].value;
			return true;
		}
	}

	rd_kafka_get_err_descs(&descs, &ndescs);
	for (i = 0; i < ndescs; i++)
	{
		if (descs[i].name != NULL && strcasecmp(s, descs[i].name) == 0)
		{
			*err = descs[i].code;
			return true;
		}
	}
	return false;
}

static const char *
broker_name(int32_t broker_id)
{
	static char buf[16];

	if (broker_id == -1)
		return "all";
	snprintf(buf, sizeof(buf), "%d", (int) broker_id);
	return buf;
}

static void
create_topic(const char *topic, int partitions)
{
	rd_kafka_resp_err_t err;

	/* replication factor is ignored by the 2.0.2 mock; see README.md */
	err = rd_kafka_mock_topic_create(mcluster, topic, partitions, 1);
	if (err)
		reply("error create %s: %s", topic, rd_kafka_err2name(err));
	else
		reply("ok create %s %d", topic, partitions);
}

/*
 * Apply one command line to the mock cluster.  Returns false on "quit".
 */
static bool
handle_command(char *line)
{
	char	   *argv[MAX_ARGS];
	char	   *save = NULL;
	char	   *tok;
	int			argc = 0;
	const char *cmd;
	int32_t		broker_id;
	int16_t		api_key;
	rd_kafka_resp_err_t err;
	long		val;

	for (tok = strtok_r(line, " \t\r\n", &save);
		 tok != NULL && argc < MAX_ARGS;
		 tok = strtok_r(NULL, " \t\r\n", &save))
		argv[argc++] = tok;

	/* blank lines and # comments are ignored without an acknowledgement */
	if (argc == 0 || argv[0][0] == '#')
		return true;
	cmd = argv[0];

	if (strcmp(cmd, "quit") == 0 && argc == 1)
	{
		reply("ok quit");
		return false;
	}
	else if ((strcmp(cmd, "down") == 0 || strcmp(cmd, "up") == 0) &&
			 argc == 2)
	{
		if (!parse_broker(argv[1], &broker_id))
		{
			reply("error %s: invalid broker \"%s\"", cmd, argv[1]);
			return true;
		}
		if (strcmp(cmd, "down") == 0)
			err = rd_kafka_mock_broker_set_down(mcluster, broker_id);
		else
			err = rd_kafka_mock_broker_set_up(mcluster, broker_id);
		if (err)
			reply("error %s %s: %s", cmd, argv[1], rd_kafka_err2name(err));
		else
			reply("ok %s %s", cmd, broker_name(broker_id));
	}
	else if (strcmp(cmd, "rtt") == 0 && argc == 3)
	{
		if (!parse_broker(argv[1], &broker_id) ||
			!parse_long(argv[2], 0, INT_MAX, &val))
		{
			reply("error rtt: usage: rtt <broker_id|all> <ms>");
			return true;
		}
		err = rd_kafka_mock_broker_set_rtt(mcluster, broker_id, (int) val);
		if (err)
			reply("error rtt %s: %s", argv[1], rd_kafka_err2name(err));
		else
			reply("ok rtt %s %ld", broker_name(broker_id), val);
	}
	else if (strcmp(cmd, "errors") == 0 && argc == 4)
	{
		rd_kafka_resp_err_t *errs;
		long		i;

		if (!parse_api_key(argv[1], &api_key))
		{
			reply("error errors: unknown api \"%s\"", argv[1]);
			return true;
		}
		if (!parse_long(argv[2], 1, MAX_ERROR_COUNT, &val))
		{
			reply("error errors: count must be 1..%d", MAX_ERROR_COUNT);
			return true;
		}
		if (!parse_error_code(argv[3], &err))
		{
			reply("error errors: unknown error code \"%s\"", argv[3]);
			return true;
		}
		errs = malloc(sizeof(*errs) * (size_t) val);
		if (errs == NULL)
		{
			reply("error errors: out of memory");
			return true;
		}
		for (i = 0; i < val; i++)
			errs[i] = err;
		rd_kafka_mock_push_request_errors_array(mcluster, api_key,
												(size_t) val, errs);
		free(errs);
		reply("ok errors %d %ld %s(%d)", (int) api_key, val,
			  rd_kafka_err2name(err), (int) err);
	}
	else if (strcmp(cmd, "clear-errors") == 0 && argc == 2)
	{
		if (!parse_api_key(argv[1], &api_key))
		{
			reply("error clear-errors: unknown api \"%s\"", argv[1]);
			return true;
		}
		rd_kafka_mock_clear_request_errors(mcluster, api_key);
		reply("ok clear-errors %d", (int) api_key);
	}
	else if (strcmp(cmd, "topic-error") == 0 && argc == 3)
	{
		if (!parse_error_code(argv[2], &err))
		{
			reply("error topic-error: unknown error code \"%s\"", argv[2]);
			return true;
		}
		rd_kafka_mock_topic_set_error(mcluster, argv[1], err);
		reply("ok topic-error %s %s(%d)", argv[1],
			  rd_kafka_err2name(err), (int) err);
	}
	else if (strcmp(cmd, "create") == 0 && (argc == 2 || argc == 3))
	{
		val = default_partitions;
		if (argc == 3 && !parse_long(argv[2], 1, 100000, &val))
		{
			reply("error create: invalid partition count \"%s\"", argv[2]);
			return true;
		}
		create_topic(argv[1], (int) val);
	}
	else
		reply("error unknown command or wrong arguments: %s", cmd);

	return true;
}

/*
 * Write the bootstrap list to "path" atomically: readers either see no
 * file or the complete line.
 */
static bool
write_bootstrap_file(const char *path, const char *bootstraps)
{
	char		tmp[PATH_MAX];
	FILE	   *fp;

	if (snprintf(tmp, sizeof(tmp), "%s.tmp.%d", path, (int) getpid()) >=
		(int) sizeof(tmp))
	{
		fprintf(stderr, "bootstrap file path too long\n");
		return false;
	}
	fp = fopen(tmp, "w");
	if (fp == NULL)
	{
		fprintf(stderr, "could not create \"%s\": %s\n", tmp, strerror(errno));
		return false;
	}
	if (fprintf(fp, "%s\n", bootstraps) < 0 || fflush(fp) != 0 ||
		fsync(fileno(fp)) != 0)
	{
		fprintf(stderr, "could not write \"%s\": %s\n", tmp, strerror(errno));
		fclose(fp);
		unlink(tmp);
		return false;
	}
	fclose(fp);
	if (rename(tmp, path) != 0)
	{
		fprintf(stderr, "could not rename \"%s\" to \"%s\": %s\n",
				tmp, path, strerror(errno));
		unlink(tmp);
		return false;
	}
	return true;
}

/*
 * Open the control FIFO for reading without blocking for a writer.  After a
 * writer closes its end we get EOF and reopen, so that any number of
 * successive "echo cmd > fifo" invocations work.
 */
static int
open_fifo(const char *path)
{
	int			fd = open(path, O_RDONLY | O_NONBLOCK);

	if (fd < 0)
		fprintf(stderr, "could not open control FIFO \"%s\": %s\n",
				path, strerror(errno));
	return fd;
}

/* Process every complete line in buf; returns false once "quit" is seen. */
static bool
consume_lines(char *buf, size_t *len)
{
	char	   *start = buf;
	char	   *nl;
	bool		keep_going = true;

	while (keep_going &&
		   (nl = memchr(start, '\n', *len - (size_t) (start - buf))) != NULL)
	{
		*nl = '\0';
		keep_going = handle_command(start);
		start = nl + 1;
	}
	*len -= (size_t) (start - buf);
	memmove(buf, start, *len);
	return keep_going;
}

int
main(int argc, char **argv)
{
	int			nbrokers = 3;
	const char *fifo_path = NULL;
	const char *bootstrap_path = NULL;
	const char *topics[64];
	int			ntopics = 0;
	bool		created_fifo = false;
	char		errstr[512];
	rd_kafka_conf_t *conf;
	rd_kafka_t *rk;
	const char *bootstraps;
	char		fixed[64];
	int			port = 0;
	struct sigaction sa;
	char		buf[MAX_LINE];
	size_t		len = 0;
	int			fd;
	bool		running = true;
	int			exit_code = 0;
	long		val;
	int			c;
	int			i;

	while ((c = getopt(argc, argv, "b:p:c:f:P:t:h")) != -1)
	{
		switch (c)
		{
			case 'b':
				if (!parse_long(optarg, 1, 64, &val))
				{
					fprintf(stderr, "invalid broker count \"%s\"\n", optarg);
					return 2;
				}
				nbrokers = (int) val;
				break;
			case 'p':
				if (!parse_long(optarg, 1, 100000, &val))
				{
					fprintf(stderr, "invalid partition count \"%s\"\n", optarg);
					return 2;
				}
				default_partitions = (int) val;
				break;
			case 'c':
				fifo_path = optarg;
				break;
			case 'f':
				bootstrap_path = optarg;
				break;
			case 'P':
				if (!parse_long(optarg, 1, 65535, &val))
				{
					fprintf(stderr, "invalid port \"%s\"\n", optarg);
					return 2;
				}
				port = (int) val;
				break;
			case 't':
				if (ntopics == (int) (sizeof(topics) / sizeof(topics[0])))
				{
					fprintf(stderr, "too many -t options\n");
					return 2;
				}
				topics[ntopics++] = optarg;
				break;
			default:
				usage(argv[0]);
				return c == 'h' ? 0 : 2;
		}
	}
	if (optind != argc)
	{
		usage(argv[0]);
		return 2;
	}

	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = handle_signal;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);

	if (fifo_path != NULL)
	{
		struct stat st;

		if (stat(fifo_path, &st) != 0)
		{
			if (errno != ENOENT || mkfifo(fifo_path, 0600) != 0)
			{
				fprintf(stderr, "could not create control FIFO \"%s\": %s\n",
						fifo_path, strerror(errno));
				return 1;
			}
			created_fifo = true;
		}
		else if (!S_ISFIFO(st.st_mode))
		{
			fprintf(stderr, "\"%s\" exists and is not a FIFO\n", fifo_path);
			return 1;
		}
	}

	/*
	 * The mock cluster needs an rd_kafka_t for bookkeeping only; it is never
	 * used as a client, so it gets no bootstrap servers.  log_level 4 hides
	 * the resulting "No bootstrap.servers configured" notice.
	 */
	conf = rd_kafka_conf_new();
	if (rd_kafka_conf_set(conf, "client.id", "outbox_test_broker",
						  errstr, sizeof(errstr)) != RD_KAFKA_CONF_OK ||
		rd_kafka_conf_set(conf, "log_level", "4",
						  errstr, sizeof(errstr)) != RD_KAFKA_CONF_OK)
	{
		fprintf(stderr, "%s\n", errstr);
		return 1;
	}
	rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, sizeof(errstr));
	if (rk == NULL)
	{
		fprintf(stderr, "could not create rd_kafka handle: %s\n", errstr);
		return 1;
	}
	mcluster = rd_kafka_mock_cluster_new(rk, nbrokers);
	if (mcluster == NULL)
	{
		fprintf(stderr, "could not create mock cluster\n");
		rd_kafka_destroy(rk);
		return 1;
	}
	bootstraps = rd_kafka_mock_cluster_bootstraps(mcluster);
	if (port != 0)
	{
		/* the list starts "127.0.0.1:<first broker's port>," */
		const char *colon = strchr(bootstraps, ':');

		if (colon == NULL ||
			!forward_start(port, atoi(colon + 1), errstr, sizeof(errstr)))
		{
			fprintf(stderr, "%s\n", colon == NULL ? "no mock broker" : errstr);
			rd_kafka_mock_cluster_destroy(mcluster);
			rd_kafka_destroy(rk);
			return 1;
		}
		snprintf(fixed, sizeof(fixed), "127.0.0.1:%d", port);
		bootstraps = fixed;
	}

	if (default_partitions != MOCK_AUTO_CREATE_PARTITIONS)
		fprintf(stderr,
				"note: -p %d applies to \"create\" and -t only; librdkafka "
				"%s auto-creates topics with %d partitions\n",
				default_partitions, rd_kafka_version_str(),
				MOCK_AUTO_CREATE_PARTITIONS);

	/* pre-create topics before anyone can learn the bootstrap list */
	for (i = 0; i < ntopics; i++)
	{
		char	   *name = strdup(topics[i]);
		char	   *colon = strrchr(name, ':');
		long		parts = default_partitions;

		if (colon != NULL)
		{
			*colon = '\0';
			if (!parse_long(colon + 1, 1, 100000, &parts))
			{
				fprintf(stderr, "invalid -t \"%s\"\n", topics[i]);
				parts = default_partitions;
			}
		}
		if (rd_kafka_mock_topic_create(mcluster, name, (int) parts, 1) != 0)
			fprintf(stderr, "could not create topic \"%s\"\n", name);
		free(name);
	}

	reply("%s", bootstraps);
	if (bootstrap_path != NULL &&
		!write_bootstrap_file(bootstrap_path, bootstraps))
		exit_code = 1;

	fd = fifo_path != NULL ? open_fifo(fifo_path) : STDIN_FILENO;
	if (fd < 0)
		exit_code = 1;
	running = (exit_code == 0);

	/*
	 * Command loop.  The short poll timeout lets us notice signals without
	 * any self-pipe machinery.
	 */
	while (running && !got_signal)
	{
		struct pollfd pfd = {.fd = fd, .events = POLLIN};
		ssize_t		n;

		if (poll(&pfd, 1, 200) <= 0 || pfd.revents == 0)
			continue;

		n = read(fd, buf + len, sizeof(buf) - 1 - len);
		if (n < 0)
		{
			if (errno == EINTR || errno == EAGAIN)
				continue;
			fprintf(stderr, "read error on control input: %s\n",
					strerror(errno));
			exit_code = 1;
			break;
		}
		if (n == 0)
		{
			/* EOF: an unterminated last line still counts as a command */
			if (len > 0)
			{
				buf[len++] = '\n';
				running = consume_lines(buf, &len);
			}
			if (fifo_path != NULL)
			{
				close(fd);
				fd = open_fifo(fifo_path);
				if (fd < 0)
				{
					exit_code = 1;
					break;
				}
			}
			else
			{
				/* stdin is gone: keep serving until we get a signal */
				fprintf(stderr, "stdin closed; running until SIGTERM or SIGINT\n");
				fd = -1;
			}
			continue;
		}
		len += (size_t) n;
		running = consume_lines(buf, &len);
		if (len == sizeof(buf) - 1)
		{
			reply("error command line too long");
			len = 0;
		}
	}

	if (fd > STDIN_FILENO)
		close(fd);
	if (bootstrap_path != NULL)
		unlink(bootstrap_path);
	if (created_fifo)
		unlink(fifo_path);

	rd_kafka_mock_cluster_destroy(mcluster);
	rd_kafka_destroy(rk);

	return exit_code;
}
