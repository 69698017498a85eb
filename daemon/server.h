/*
 * server.h - kvdockd's internals shared by its files: the server, its
 * counters, the metrics endpoint. Private to daemon/.
 *
 * Threading: the event loop owns the server and every connection. The
 * metrics endpoint runs on libmicrohttpd's threads and reads atomics
 * (counters, health, pool progress) and, under the store lock the loop
 * holds while it serves a store request, the store's statistics.
 */
#ifndef KVD_DAEMON_SERVER_H
#define KVD_DAEMON_SERVER_H

#include "kvd_common.h"
#include "kvd_proto.h"
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
} kvd_counters_t;

typedef struct kvd_server kvd_server_t;
typedef struct kvd_metrics kvd_metrics_t;

/* Creates the server: listeners bound, signals blocked, nothing served yet.
 * The pool stays owned by the caller and must outlive the server. */
int kvd_server_create(const kvd_opts_t *opts, kvd_pool_t *pool, kvd_server_t **out);
/* Runs the loop until a signal drains it (returns 0) or a fatal error (1). */
int kvd_server_run(kvd_server_t *s);
void kvd_server_destroy(kvd_server_t *s);

/* A consistent-enough snapshot for Stats and /metrics (any thread). */
void kvd_server_stats(kvd_server_t *s, kvd_stats_rep_t *out);
kvd_health_t kvd_server_health(kvd_server_t *s);

/* The namespace table (in m's arena), under the store's lock (any thread). */
int kvd_server_ns_table(kvd_server_t *s, kvd_msg_t *m, kvd_ns_msg_t **out, size_t *n);

/* Records one served call in the counters. */
void kvd_counters_record(kvd_counters_t *c, kvd_method_t m, bool error,
                         uint64_t latency_ns);

/* The HTTP endpoint: /metrics (Prometheus text) and /healthz. */
int kvd_metrics_start(kvd_server_t *s, const char *host_port, kvd_metrics_t **out);
void kvd_metrics_stop(kvd_metrics_t *m);
/* Renders the Prometheus text of a stats snapshot into buf. */
int kvd_metrics_render(const kvd_stats_rep_t *st, const kvd_ns_msg_t *ns, size_t n_ns,
                       kvd_buf_t *buf);

#endif
