/*
 * bench_util.c - the pieces every kvdock-bench mode uses: the log-linear
 * latency histogram and the processes of a run (see bench.h).
 */
#include "bench.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* ----------------------------------------------------------- histogram */

/* The bucket a value falls in. */
static size_t hist_index(uint64_t v)
{
    if (v < HIST_SUB)
        return (size_t)v;
    unsigned shift = (unsigned)(63 - __builtin_clzll(v)) - HIST_SUB_BITS;
    return HIST_SUB + (size_t)shift * HIST_SUB + (size_t)((v >> shift) - HIST_SUB);
}

/* The value a bucket stands for: the middle of its range. */
static uint64_t hist_bucket_value(size_t i)
{
    if (i < HIST_SUB)
        return i;
    unsigned shift = (unsigned)((i - HIST_SUB) / HIST_SUB);
    uint64_t low = (uint64_t)(HIST_SUB + (i - HIST_SUB) % HIST_SUB) << shift;
    return low + ((1ull << shift) >> 1);
}

void hist_add(bench_hist_t *h, uint64_t v)
{
    h->buckets[hist_index(v)]++;
    h->count++;
    if (v > h->max_ns)
        h->max_ns = v;
}

void hist_merge(bench_hist_t *into, const bench_hist_t *from)
{
    for (size_t i = 0; i < HIST_BUCKETS; i++)
        into->buckets[i] += from->buckets[i];
    into->count += from->count;
    into->max_ns = KVD_MAX(into->max_ns, from->max_ns);
}

/* The q-quantile (0 < q <= 1) in nanoseconds; 0 for an empty histogram. */
uint64_t hist_quantile_ns(const bench_hist_t *h, double q)
{
    if (h->count == 0)
        return 0;
    uint64_t rank = (uint64_t)(q * (double)h->count + 0.5);
    rank = KVD_MAX(rank, (uint64_t)1);
    uint64_t seen = 0;
    for (size_t i = 0; i < HIST_BUCKETS; i++) {
        seen += h->buckets[i];
        if (seen >= rank)
            return KVD_MIN(hist_bucket_value(i), h->max_ns);
    }
    return h->max_ns;
}

/* ------------------------------------------------------------ processes */

/* SIGTERM to one of our children by its pid, SIGKILL past the timeout. */
void bench_stop_child(pid_t *pid, const char *what)
{
    if (*pid <= 0)
        return;
    kill(*pid, SIGTERM);
    int rc = kvd_wait_pid(*pid, BENCH_STOP_TIMEOUT_MS, NULL);
    if (rc != KVD_OK && rc != KVD_ERR_NOT_FOUND) { /* not found: reaped already */
        fprintf(stderr,
                "kvdock-bench: %s (pid %d) ignored SIGTERM for %d ms; "
                "killing it\n",
                what, (int)*pid, BENCH_STOP_TIMEOUT_MS);
        kill(*pid, SIGKILL);
        kvd_wait_pid(*pid, BENCH_STOP_TIMEOUT_MS, NULL);
    }
    *pid = 0;
}

/* In a fresh child: die with the parent. Returns -1 if it is already gone. */
int bench_child_tie_to_parent(pid_t parent)
{
    if (prctl(PR_SET_PDEATHSIG, SIGTERM) != 0)
        return -1;
    return getppid() == parent ? 0 : -1;
}

/* Creates the temporary directory and the socket paths inside it. */
int bench_env_init(bench_env_t *env)
{
    memset(env, 0, sizeof(*env));
    /* in /dev/shm where there is one: the daemon's pool file, journal and
     * lock go here too (--shm-dir), and are removed with it */
    snprintf(env->dir, sizeof(env->dir), "/dev/shm/kvdock-bench-XXXXXX");
    if (mkdtemp(env->dir) == NULL) {
        snprintf(env->dir, sizeof(env->dir), "/tmp/kvdock-bench-XXXXXX");
        if (mkdtemp(env->dir) == NULL) {
            fprintf(stderr, "kvdock-bench: mkdtemp: %s\n", strerror(errno));
            env->dir[0] = '\0';
            return KVD_ERR_IO;
        }
    }
    snprintf(env->daemon_socket, sizeof(env->daemon_socket), "%s/kvdockd.sock", env->dir);
    snprintf(env->daemon_log, sizeof(env->daemon_log), "%s/kvdockd.log", env->dir);
    snprintf(env->echo_socket, sizeof(env->echo_socket), "%s/echo.sock", env->dir);
    return KVD_OK;
}

/* Stops the children this run started and removes the temporary directory. */
void bench_env_cleanup(bench_env_t *env)
{
    bench_stop_child(&env->daemon_pid, "kvdockd");
    bench_stop_child(&env->echo_pid, "echo server");
    if (env->dir[0] == '\0')
        return;
    DIR *d = opendir(env->dir);
    struct dirent *e;
    while (d != NULL && (e = readdir(d)) != NULL) {
        char path[sizeof(env->dir) + 300];
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0 &&
            snprintf(path, sizeof(path), "%s/%s", env->dir, e->d_name) <
                (int)sizeof(path))
            unlink(path);
    }
    if (d != NULL)
        closedir(d);
    rmdir(env->dir);
    env->dir[0] = '\0';
}

/*
 * Waits until the daemon at socket_path answers Health with "ready". When
 * pid > 0 it is our child, and its early exit ends the wait. Returns KVD_OK,
 * KVD_ERR_TIMEOUT or KVD_ERR_CLOSED (the child exited).
 */
int bench_wait_ready(const char *socket_path, pid_t *pid, int timeout_ms)
{
    uint64_t deadline = kvd_now_ns() + (uint64_t)timeout_ms * 1000000ull;
    while (kvd_now_ns() < deadline) {
        int st;
        if (*pid > 0 && waitpid(*pid, &st, WNOHANG) == *pid) {
            fprintf(stderr, "kvdock-bench: kvdockd exited early (%s %d)\n",
                    WIFEXITED(st) ? "status" : "signal",
                    WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
            *pid = 0;
            return KVD_ERR_CLOSED;
        }
        if (kvd_client_health_once(socket_path, 200, 1000) == KVD_HEALTH_READY)
            return KVD_OK;
        kvd_sleep_ns(10000000);
    }
    fprintf(stderr, "kvdock-bench: %s not ready after %d ms\n", socket_path, timeout_ms);
    return KVD_ERR_TIMEOUT;
}

/* Starts kvdockd on env's socket, its output to env's log, and waits for
 * "ready". Returns KVD_OK; on failure prints why and the daemon's log. */
int bench_daemon_start(bench_env_t *env, const char *kvdockd_path, const char *pool_size,
                       bool ucx_tcp)
{
    const char *extra[] = {ucx_tcp ? "--ucx-tcp" : NULL, NULL};
    return bench_daemon_start_args(env, kvdockd_path, pool_size, extra);
}

int bench_daemon_start_args(bench_env_t *env, const char *kvdockd_path,
                            const char *pool_size, const char *const *extra)
{
    char instance[64];
    snprintf(instance, sizeof(instance), "bench-%d", (int)getpid());
    const char *argv[32] = {kvdockd_path,
                            "--socket",
                            env->daemon_socket,
                            "--instance",
                            instance,
                            "--shm-dir",
                            env->dir,
                            "--pool-size",
                            pool_size,
                            "--usage-interval",
                            "0",
                            "--populate-rate",
                            "0"};
    size_t n = 13;
    for (size_t i = 0; extra != NULL && extra[i] != NULL && n < 31; i++)
        argv[n++] = extra[i];
    argv[n] = NULL;
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "kvdock-bench: fork: %s\n", strerror(errno));
        return KVD_ERR_IO;
    }
    if (pid == 0) {
        if (bench_child_tie_to_parent(parent) != 0)
            _exit(127);
        int fd = open(env->daemon_log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd >= 0) {
            dup2(fd, STDOUT_FILENO);
            dup2(fd, STDERR_FILENO);
        }
        execv(kvdockd_path, (char *const *)argv);
        fprintf(stderr, "kvdock-bench: exec %s: %s\n", kvdockd_path, strerror(errno));
        _exit(127);
    }
    env->daemon_pid = pid;
    int rc =
        bench_wait_ready(env->daemon_socket, &env->daemon_pid, BENCH_READY_TIMEOUT_MS);
    if (rc != KVD_OK)
        kvd_dump_file(env->daemon_log);
    return rc;
}

/* The CPU time (user + system, all threads) a process has used so far, in
 * nanoseconds, or UINT64_MAX when it cannot be read. */
uint64_t bench_proc_cpu_ns(pid_t pid)
{
    clockid_t clock;
    struct timespec ts;
    if (pid <= 0 || clock_getcpuclockid(pid, &clock) != 0 ||
        clock_gettime(clock, &ts) != 0)
        return UINT64_MAX;
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
