/*
 * metrics.h - kvdockd's HTTP endpoint: /metrics (Prometheus text) and
 * /healthz. Private to daemon/.
 *
 * The endpoint knows nothing of the server: the loop hands it a snapshot
 * (a Stats reply, with the namespace table) on every tick and whenever the
 * health changes, and the endpoint's threads serve the latest one.
 */
#ifndef KVD_DAEMON_METRICS_H
#define KVD_DAEMON_METRICS_H

#include "kvd_proto.h"

typedef struct kvd_metrics kvd_metrics_t;

/* Serves /metrics and /healthz on host_port ("HOST:PORT"). Until the first
 * snapshot, /healthz answers 503 "starting" and /metrics 503. */
int kvd_metrics_start(const char *host_port, kvd_metrics_t **out);
void kvd_metrics_stop(kvd_metrics_t *m);

/*
 * Hands over a snapshot: snap is a Stats reply (body.stats_rep, its
 * namespaces in its arena) in a block of kvd_mem_calloc(KVD_MEM_OTHER, 1,
 * sizeof(kvd_msg_t)). m owns it from here and frees the one it replaces.
 * Any thread.
 */
void kvd_metrics_publish(kvd_metrics_t *m, kvd_msg_t *snap);

/* Renders the Prometheus text of a Stats snapshot (and its namespaces)
 * into buf. KVD_OK or KVD_ERR_NOMEM. */
int kvd_metrics_render(const kvd_stats_rep_t *st, kvd_buf_t *buf);

#endif
