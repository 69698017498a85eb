/*
 * server.h - kvdockd's server: the event loop, its connections and
 * counters. Private to daemon/.
 *
 * Threading: the event loop owns the server, the store and every
 * connection; nothing else touches them. The metrics endpoint (metrics.h)
 * runs on threads of its own and reads only the snapshots the loop hands it.
 */
#ifndef KVD_DAEMON_SERVER_H
#define KVD_DAEMON_SERVER_H

#include "kvd_common.h"
#include "kvd_proto.h"
#include "auth.h"
#include "kvd_store.h"
#include "options.h"

#include <stdatomic.h>

typedef struct kvd_method_counters {
    _Atomic uint64_t calls;
    _Atomic uint64_t errors;
    _Atomic uint64_t latency_us_sum;
    _Atomic uint64_t buckets[KVD_LATENCY_BUCKETS];
} kvd_method_counters_t;

typedef struct kvd_counters {
    kvd_method_counters_t methods[KVD_METHOD_COUNT];
    _Atomic uint64_t connections_current;
    _Atomic uint64_t connections_total;
    _Atomic uint64_t connections_rejected;
    _Atomic uint64_t protocol_errors;
    _Atomic uint64_t auth_failures; /* a method before Hello, or a credential refused */
} kvd_counters_t;

typedef struct kvd_server kvd_server_t;

/* Creates the server: listeners bound, signals blocked, nothing served yet.
 * The pool stays owned by the caller and must outlive the server; auth
 * (the credentials, auth.h) is the server's from here on, also on failure. */
int kvd_server_create(const kvd_opts_t *opts, kvd_pool_t *pool, kvd_auth_t *auth,
                      kvd_server_t **out);
/* Runs the loop until a signal drains it (returns 0) or a fatal error (1). */
int kvd_server_run(kvd_server_t *s);
void kvd_server_destroy(kvd_server_t *s);

/* Records one served call in the counters. */
void kvd_counters_record(kvd_counters_t *c, kvd_method_t m, bool error,
                         uint64_t latency_ns);

#endif
