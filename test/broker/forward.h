/*-------------------------------------------------------------------------
 *
 * forward.h
 *	  outbox_test_broker's fixed loopback port (forward.c).
 *
 * IDENTIFICATION
 *	  test/broker/forward.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_TEST_BROKER_FORWARD_H
#define OUTBOX_TEST_BROKER_FORWARD_H

#include <stdbool.h>
#include <stddef.h>

extern bool forward_start(int port, int broker_port, char *err, size_t errlen);

#endif
