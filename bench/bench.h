/*
 * bench.h - what the modes of kvdock-bench share: exit codes, the latency
 * histogram, and the processes a run starts (kvdockd, the echo server) in a
 * temporary directory. Benchmarks measure; they never assert.
 */
#ifndef KVD_BENCH_H
#define KVD_BENCH_H

#include "kvd_common.h"
#include "kvd_proto.h"

#include <stdbool.h>
#include <stdio.h>
#include <sys/types.h>

#define BENCH_EXIT_OK    0
#define BENCH_EXIT_FAIL  1
#define BENCH_EXIT_USAGE 2

#define BENCH_CALL_TIMEOUT_MS  5000  /* one round trip, kvdock or echo */
#define BENCH_READY_TIMEOUT_MS 30000 /* kvdockd populating its pool */
#define BENCH_STOP_TIMEOUT_MS  5000  /* SIGTERM to exit, then SIGKILL */
#define BENCH_MAX_CLIENTS      1024
#define BENCH_MAX_POINTS       32

/*
 * A log-linear histogram of nanosecond values, HDR style: values below 128
 * are exact; above, each power of two is split into 128 equal buckets.
 */
#define HIST_SUB_BITS 7
#define HIST_SUB      (1u << HIST_SUB_BITS)
#define HIST_BUCKETS  (HIST_SUB + (64 - HIST_SUB_BITS) * HIST_SUB)

typedef struct bench_hist {
    uint64_t count;
    uint64_t max_ns;
    uint64_t buckets[HIST_BUCKETS];
} bench_hist_t;

/* Adds one value (nanoseconds). */
void hist_add(bench_hist_t *h, uint64_t v);
void hist_merge(bench_hist_t *into, const bench_hist_t *from);
/* The q-quantile (0 < q <= 1) in nanoseconds; 0 for an empty histogram. */
uint64_t hist_quantile_ns(const bench_hist_t *h, double q);

/* The children of one run and the temporary directory of their sockets. */
typedef struct bench_env {
    char dir[64]; /* mkdtemp'd; removed by bench_env_cleanup */
    char daemon_socket[108];
    char daemon_log[128];
    char echo_socket[108];
    pid_t daemon_pid; /* 0 when --socket names someone else's daemon */
    pid_t echo_pid;
} bench_env_t;

/* Creates the temporary directory and the socket paths inside it. */
int bench_env_init(bench_env_t *env);
/* Stops the children this run started and removes the temporary directory. */
void bench_env_cleanup(bench_env_t *env);
/* Starts kvdockd with a pool of pool_size ("64M") on env's socket and waits
 * for "ready"; prints the daemon's log on failure. ucx_tcp: with
 * --ucx-tcp (a benchmark that moves bytes over UCX's TCP, on loopback). */
int bench_daemon_start(bench_env_t *env, const char *kvdockd_path, const char *pool_size,
                       bool ucx_tcp);
/* The same with more flags (NULL-terminated, may be NULL). The daemon's
 * pool file, journal and lock go to env's directory (--shm-dir): a daemon
 * started again there recovers what the last one had. */
int bench_daemon_start_args(bench_env_t *env, const char *kvdockd_path,
                            const char *pool_size, const char *const *extra);
/* Waits until the daemon at socket_path is ready (pid > 0: our child). */
int bench_wait_ready(const char *socket_path, pid_t *pid, int timeout_ms);
/* SIGTERM to one of our children by pid, SIGKILL past the timeout. */
void bench_stop_child(pid_t *pid, const char *what);
/* In a fresh child: die with the parent. -1 if it is already gone. */
int bench_child_tie_to_parent(pid_t parent);
/* CPU time a process has used (ns), UINT64_MAX when unreadable. */
uint64_t bench_proc_cpu_ns(pid_t pid);

/* The modes. */
int bench_mode_rpc(int argc, char **argv);
int bench_mode_store(int argc, char **argv);
int bench_mode_store_rpc(int argc, char **argv);
int bench_mode_linker(int argc, char **argv);
int bench_mode_ucx(int argc, char **argv);
int bench_mode_list_stall(int argc, char **argv);
int bench_mode_persist(int argc, char **argv);
int bench_mode_ssd(int argc, char **argv);
int bench_mode_cluster(int argc, char **argv);
int bench_mode_cluster_sim(int argc, char **argv);

#endif
