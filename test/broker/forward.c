/*-------------------------------------------------------------------------
 *
 * forward.c
 *	  A fixed loopback port for outbox_test_broker (-P): each connection to
 *	  it is relayed, byte for byte, to the first mock broker.
 *
 * This is a TEST TOOL, like outbox_test_broker.c.  librdkafka's mock
 * brokers listen on ports the system chooses; a client given the fixed
 * port as its bootstrap address is answered with metadata naming the mock
 * brokers' own loopback ports, and connects to those directly.  One thread
 * accepts; each connection gets a thread that copies both ways until
 * either side closes.  The threads block SIGTERM and SIGINT: the main
 * thread serves them.
 *
 * IDENTIFICATION
 *	  test/broker/forward.c
 *
 *-------------------------------------------------------------------------
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "forward.h"

static struct sockaddr_in target;

/* a loopback address with port, or false */
static bool
loopback(int port, struct sockaddr_in *addr)
{
	if (port < 1 || port > 65535)
		return false;
	memset(addr, 0, sizeof(*addr));
	addr->sin_family = AF_INET;
	addr->sin_port = htons((unsigned short) port);
	addr->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	return true;
}

static bool
write_all(int fd, const char *buf, ssize_t len)
{
	while (len > 0)
	{
		ssize_t		n = write(fd, buf, (size_t) len);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return false;
		buf += n;
		len -= n;
	}
	return true;
}

/* one connection: fds[0] the client's, fds[1] the broker's */
static void *
pump(void *arg)
{
	int		   *fds = arg;
	char		buf[65536];

	for (;;)
	{
		struct pollfd p[2] = {{.fd = fds[0],.events = POLLIN},
		{.fd = fds[1],.events = POLLIN}};
		int			i;

		if (poll(p, 2, -1) < 0)
		{
			if (errno == EINTR)
				continue;
			break;
		}
		for (i = 0; i < 2; i++)
		{
			ssize_t		n;

			if (p[i].revents == 0)
				continue;
			n = read(fds[i], buf, sizeof(buf));
			if (n <= 0 || !write_all(fds[1 - i], buf, n))
				goto done;
		}
	}
done:
	close(fds[0]);
	close(fds[1]);
	free(fds);
	return NULL;
}

static void *
accept_loop(void *arg)
{
	int			listener = *(int *) arg;

	free(arg);
	for (;;)
	{
		int			client = accept(listener, NULL, NULL);
		int			upstream;
		int		   *fds;
		int			one = 1;
		pthread_t	thread;

		if (client < 0)
		{
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			fprintf(stderr, "forward: accept failed: %s\n", strerror(errno));
			return NULL;
		}
		upstream = socket(AF_INET, SOCK_STREAM, 0);
		fds = malloc(2 * sizeof(int));
		if (upstream < 0 || fds == NULL ||
			connect(upstream, (struct sockaddr *) &target, sizeof(target)) != 0)
		{
			fprintf(stderr, "forward: could not reach the mock broker: %s\n",
					strerror(errno));
			close(client);
			if (upstream >= 0)
				close(upstream);
			free(fds);
			continue;
		}
		/* both legs without Nagle, as the brokers' own (nodelay.c) */
		(void) setsockopt(upstream, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		fds[0] = client;
		fds[1] = upstream;
		if (pthread_create(&thread, NULL, pump, fds) != 0)
		{
			close(client);
			close(upstream);
			free(fds);
			continue;
		}
		pthread_detach(thread);
	}
}

/*
 * forward_start
 *		Listen on 127.0.0.1:port and relay every connection to the mock
 *		broker at 127.0.0.1:broker_port.  False with a message in err when
 *		the port cannot be had.
 */
bool
forward_start(int port, int broker_port, char *err, size_t errlen)
{
	struct sockaddr_in addr;
	sigset_t	block;
	sigset_t	old;
	pthread_t	thread;
	int			one = 1;
	int		   *listener = malloc(sizeof(int));

	if (listener == NULL || !loopback(port, &addr) || !loopback(broker_port, &target))
	{
		snprintf(err, errlen, "invalid port %d", port);
		free(listener);
		return false;
	}
	*listener = socket(AF_INET, SOCK_STREAM, 0);
	if (*listener < 0 ||
		setsockopt(*listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0 ||
		bind(*listener, (struct sockaddr *) &addr, sizeof(addr)) != 0 ||
		listen(*listener, 16) != 0)
	{
		snprintf(err, errlen, "could not listen on 127.0.0.1:%d: %s",
				 port, strerror(errno));
		if (*listener >= 0)
			close(*listener);
		free(listener);
		return false;
	}
	/* the threads inherit a mask without the signals the main thread serves */
	sigemptyset(&block);
	sigaddset(&block, SIGTERM);
	sigaddset(&block, SIGINT);
	pthread_sigmask(SIG_BLOCK, &block, &old);
	if (pthread_create(&thread, NULL, accept_loop, listener) != 0)
	{
		pthread_sigmask(SIG_SETMASK, &old, NULL);
		snprintf(err, errlen, "could not start a thread");
		close(*listener);
		free(listener);
		return false;
	}
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	pthread_detach(thread);
	return true;
}
