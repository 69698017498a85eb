/*
 * cluster.h - this daemon's membership in a cluster of kvdockd daemons,
 * kept in etcd (etcd.h). Private to daemon/.
 *
 * In etcd, under /kvdock/CLUSTER/:
 *   members/NODE_ID  one key per live daemon, attached to its lease (TTL
 *                    --cluster-ttl, kept alive every TTL/3): a JSON object
 *                    with its address, pool size, start time and, re-put
 *                    every TTL as its heartbeat, its object and directory
 *                    counts. A daemon that dies stops keeping the lease
 *                    alive; etcd deletes the key when the TTL runs out, and
 *                    every other member sees the DELETE on its watch.
 *   epoch            a decimal counter raised once per membership change:
 *                    by a daemon when it joins, and for a departure by the
 *                    first member that sees it (a compare-and-put on the
 *                    epoch's revision against the DELETE's, so one change
 *                    raises it once however many members see it).
 * Nothing per page goes into etcd.
 *
 * States (kvd_cluster_state_t): JOINING until the first registration;
 * READY while the lease is kept and the watch runs; DEGRADED when etcd
 * cannot be reached or the lease was lost (the daemon serves its local
 * objects and keeps trying; a lost lease is granted again and the daemon
 * registers again, which is a join).
 *
 * Threading: one thread of its own does every etcd call (all bounded by a
 * timeout) and keeps the member table, changed under a mutex; the event
 * loop takes copies of it (kvd_cluster_view) when the eventfd
 * (kvd_cluster_fd) says the state, the epoch or the members changed (a
 * heartbeat alone does not wake it: at a thousand members they come by
 * the hundred a second), and for `kvdock cluster`; it hands in its counts
 * for the heartbeat (kvd_cluster_set_load).
 */
#ifndef KVD_DAEMON_CLUSTER_H
#define KVD_DAEMON_CLUSTER_H

#include "kvd_common.h"
#include "kvd_proto.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct kvd_cluster kvd_cluster_t;

typedef struct kvd_cluster_cfg {
    const char *endpoints; /* etcd: "http://H:P,http://H2:P2" */
    const char *cluster_name;
    const char *node_id;
    const char *advertise; /* HOST:PORT of this daemon's RPC */
    int ttl_s;
    uint64_t pool_bytes;
    uint64_t started_unix_ms;
} kvd_cluster_cfg_t;

/* A copy of the membership as this daemon sees it. */
typedef struct kvd_cluster_view {
    kvd_cluster_state_t state;
    uint64_t epoch;
    uint64_t version;     /* rises whenever anything below changed */
    uint64_t members_gen; /* rises when a member joins, leaves or restarts (not
                             on heartbeats) */
    char etcd[KVD_ERROR_MAX];
    size_t n;                  /* members, sorted by node_id; this one included
                                  while it is registered */
    kvd_member_msg_t *members; /* heartbeat_ms_ago as of the copy */
} kvd_cluster_view_t;

/* Starts the membership thread (it joins in the background: the daemon
 * serves locally meanwhile). Returns KVD_OK or an error (nothing started). */
int kvd_cluster_start(const kvd_cluster_cfg_t *cfg, kvd_cluster_t **out);
/* Leaves the cluster (revokes the lease: the others see the departure at
 * once, not after the TTL) and stops the thread; bounded by the etcd
 * timeout. NULL is fine. */
void kvd_cluster_stop(kvd_cluster_t *c);
/* Readable (an eventfd) when the view changed; the loop reads it
 * (kvd_cluster_ack) and takes a new view. */
int kvd_cluster_fd(const kvd_cluster_t *c);
void kvd_cluster_ack(kvd_cluster_t *c);
/* A copy of the current view; free with kvd_cluster_view_free. */
int kvd_cluster_view(kvd_cluster_t *c, kvd_cluster_view_t *out);
void kvd_cluster_view_free(kvd_cluster_view_t *v);
/* The state alone (for Health), without a copy. */
kvd_cluster_state_t kvd_cluster_state(kvd_cluster_t *c);
/* The loop's counts, put at the next heartbeat. */
void kvd_cluster_set_load(kvd_cluster_t *c, uint64_t objects, uint64_t directory_entries);

#endif
