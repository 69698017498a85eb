/*
 * cluster.h - what the cluster tests share (on top of netns.h and
 * tests/daemon/dtest.h): one etcd and N kvdockd daemons, daemon i in
 * network namespace i at 10.X.Y.(i+1):7400, the CLI run against any of
 * them over TCP, and its `cluster --json` and `health --json` read back.
 *
 * etcd runs in the root namespace on the bridge's address (10.X.Y.254,
 * client port 2379, peer port 2380): the daemons reach it over the bridge
 * as they would a remote etcd; the address is this run's alone, so the
 * ports cannot collide with another run's or the machine's; and the test
 * can SIGKILL and restart it (on the same data directory) without touching
 * the namespaces.
 *
 * Every process is started here, tracked for the teardown (netns.h) and
 * stopped by its pid. A daemon keeps its directory (socket, log, pool
 * files) across a restart, and its log is appended to: the teardown prints
 * every log when a check failed.
 *
 * Threading: main thread only.
 */
#ifndef KVD_TEST_CLUSTER_H
#define KVD_TEST_CLUSTER_H

#include "dtest.h"
#include "netns.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KC_DAEMON_PORT  7400
#define KC_ETCD_PORT    2379
#define KC_ETCD_PEER    2380
#define KC_READY_MS     30000
#define KC_CLI_MS       10000
#define KC_CLIENT_TOKEN "kvc-client-token-5f1d2a"
#define KC_PEER_TOKEN   "kvc-peer-token-9b77e0c4"

typedef struct kc_etcd {
    pid_t pid;
    char dir[64]; /* the data directory's parent: log and data/ */
    char log[128];
    char data[128];
    char host[16];
    char name[32];
    char url[64]; /* http://10.X.Y.254:2379 */
} kc_etcd_t;

typedef struct kc_node {
    pid_t pid;
    bool cluster;    /* started with --cluster-etcd */
    bool default_id; /* started without --node-id: its id is its address */
    char ns[KC_NAME_MAX];
    char dir[64];
    char socket[108];
    char log[128];
    char addr[32];    /* "10.X.Y.Z:7400" */
    char node_id[32]; /* "node-<i>", or addr with default_id */
    char instance[32];
} kc_node_t;

typedef struct kc_cluster {
    kc_net_t net;
    kc_etcd_t etcd;
    int n;
    kc_node_t node[KC_MAX_NODES];
    char client_token_file[64]; /* --auth-token-file, kvdock --token-file */
    char peer_token_file[64];   /* --cluster-token-file */
    char name[32];              /* --cluster-name */
    int ttl_s;                  /* --cluster-ttl */
} kc_cluster_t;

/* True when the line of `kvdock --help` for command cmd names flag (a
 * feature not built yet skips). */
bool kc_cli_has_flag(const char *cmd, const char *flag);

/*
 * Makes n namespaces, the token files and (with_etcd) starts etcd, waiting
 * until it is healthy. Daemons are started by kc_node_start. Returns 0,
 * KVD_TEST_SKIP with the reason printed (no namespaces, no etcd binary),
 * or -1 after recording a failure.
 */
int kc_setup(kc_cluster_t *c, int n, bool with_etcd);

/* Stops every daemon (SIGTERM, checks a clean exit) and etcd, prints the
 * logs when a check failed, removes the directories, files and the net. */
void kc_teardown(kc_cluster_t *c);

/* Daemon i is started without --node-id from now on: its id is its
 * advertise address (the default). */
void kc_node_default_id(kc_cluster_t *c, int i);

/*
 * Starts daemon i in its namespace with the harness's flags (--socket,
 * --instance, --shm-dir in its directory, --pool-size 64M, --usage-interval
 * 0, --ucx off, --listen on its address, --auth-token-file) and, with
 * cluster, --cluster-etcd, --advertise, --cluster-token-file, --node-id,
 * --cluster-name, --cluster-ttl; then extra (may be NULL). Waits until its
 * Health says ready. 0, or -1 after recording a failure (its log printed).
 */
int kc_node_start(kc_cluster_t *c, int i, bool cluster, const char *const *extra);

/* Signals daemon i by its pid and waits up to timeout_ms for its exit;
 * with check, records a failure unless it exited 0 with a clean log. */
int kc_node_stop(kc_cluster_t *c, int i, int sig, int timeout_ms, bool check);

/* etcd: start (on the data directory it had, if any), stop by pid. */
int kc_etcd_start(kc_cluster_t *c);
void kc_etcd_stop(kc_cluster_t *c, int sig);
/* Waits up to timeout_ms for GET /health to say true. */
bool kc_etcd_wait_healthy(const kc_etcd_t *e, int timeout_ms);

/* A plain HTTP/1.0 request to host:port (in this process's namespace);
 * body may be NULL. Returns the status code, the body in out; -1 on a
 * transport failure. */
int kc_http(const char *host, int port, const char *method, const char *path,
            const char *body, char *out, size_t out_len, int timeout_ms);

/* `kvdock --connect <node i> --token-file F ARGS...`; the exit status, or
 * -1 when it did not finish in time. */
int kc_cli(const kc_cluster_t *c, int i, char *out, size_t out_len,
           const char *const *args);

/* What `kvdock cluster --json` says. */
#define KC_VIEW_MAX 8
typedef struct kc_member {
    char node[32];
    char address[32];
    bool self;
    uint64_t pool_bytes;
    uint64_t objects;
    uint64_t directory_entries;
} kc_member_t;
typedef struct kc_view {
    char state[16];
    char node[32];
    uint64_t epoch;
    size_t n;
    kc_member_t m[KC_VIEW_MAX];
    bool sorted; /* members in ascending node id */
} kc_view_t;

/* Runs `cluster --json` on node i and parses it; 0, or -1 with the reason
 * in why (not a failure: callers poll). */
int kc_view(const kc_cluster_t *c, int i, kc_view_t *v, char *why, size_t why_len);

/* The "cluster" field of `health --json` on node i into state; 0 or -1. */
int kc_health_cluster(const kc_cluster_t *c, int i, char *state, size_t state_len);

/* True when view v lists exactly the nodes whose bit is set in `want`
 * (bit i: node i), with their addresses, sorted, and self only on itself. */
bool kc_view_is(const kc_cluster_t *c, const kc_view_t *v, int self, unsigned want);

/*
 * Polls (every 200 ms, at most timeout_ms) until every running node of
 * `want` says state "ready" and lists exactly `want` with the same epoch.
 * Returns true then, with the epoch in *epoch; false at the deadline (what
 * each node said last is printed). *waited_ms gets the time it took.
 */
bool kc_wait_members(const kc_cluster_t *c, unsigned want, int timeout_ms,
                     uint64_t *epoch, uint64_t *waited_ms);

/* Milliseconds on the monotonic clock. */
uint64_t kc_now_ms(void);

#endif
