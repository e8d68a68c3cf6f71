/*-------------------------------------------------------------------------
 *
 * nodelay.c
 *	  The mock brokers' connections without Nagle's algorithm, as Kafka's.
 *
 * This is a TEST TOOL, like outbox_test_broker.c.  Apache Kafka's brokers
 * set TCP_NODELAY on every connection they accept; librdkafka's mock
 * brokers do not.  Without it a mock broker holds a small response back
 * while an earlier one is unacknowledged, and a client with nothing to
 * send acknowledges late (the kernel's delayed ACK, tens of milliseconds):
 * a producer that waits for its last acknowledgements waits that long,
 * which no Kafka cluster would make it wait.  So this program's accept()
 * and accept4(), which librdkafka's mock brokers call (and forward.c),
 * set TCP_NODELAY on the connection they return.  glibc's own: they take
 * its socket address type, and find the C library's with dlsym.
 *
 * IDENTIFICATION
 *	  test/broker/nodelay.c
 *
 *-------------------------------------------------------------------------
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stddef.h>
#include <sys/socket.h>

typedef int (*accept_fn) (int, __SOCKADDR_ARG, socklen_t *);
typedef int (*accept4_fn) (int, __SOCKADDR_ARG, socklen_t *, int);

/* a connection just accepted: no Nagle (not a socket of TCP: no harm) */
static int
no_delay(int conn)
{
	int			one = 1;

	if (conn >= 0)
		(void) setsockopt(conn, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	return conn;
}

/* the C library's function name, found once into *slot; NULL and ENOSYS if none */
static void *
c_library(const char *name, void **slot)
{
	void	   *fn = __atomic_load_n(slot, __ATOMIC_ACQUIRE);

	if (fn == NULL)
	{
		fn = dlsym(RTLD_NEXT, name);
		if (fn == NULL)
			errno = ENOSYS;
		else
			__atomic_store_n(slot, fn, __ATOMIC_RELEASE);
	}
	return fn;
}

int
accept(int fd, __SOCKADDR_ARG addr, socklen_t *len)
{
	static void *real;
	accept_fn	fn = (accept_fn) c_library("accept", &real);

	return fn == NULL ? -1 : no_delay(fn(fd, addr, len));
}

int
accept4(int fd, __SOCKADDR_ARG addr, socklen_t *len, int flags)
{
	static void *real;
	accept4_fn	fn = (accept4_fn) c_library("accept4", &real);

	return fn == NULL ? -1 : no_delay(fn(fd, addr, len, flags));
}
