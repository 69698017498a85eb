/*
 * Description: two hosts on one machine. kvdockd runs in network namespace
 * A, a libkvdock worker in namespace B; a veth pair named kvd0 on both sides
 * is the only link between them. The worker connects to the daemon's TCP
 * listener (`--listen`) and its bytes move over UCX's tcp transport
 * (UCX_TLS=tcp, UCX_NET_DEVICES=kvd0 on both sides): an offload and a load
 * into zeroed buffers round-trip byte-exact, the daemon's log shows the
 * worker's Hello "over tcp", and A's end of the veth carried at least the
 * payload each way. The daemon then exits 0 on SIGTERM with a clean log.
 *
 * The worker is this program again, started as
 * `ip netns exec B <this binary> --worker HOST:PORT`; `ip netns exec`
 * execs, so the pid fork returns is the worker's (and the daemon's).
 * No namespaces (not root, no CAP_SYS_ADMIN, no `ip`, no veth): skip (77).
 *
 * Cleanup: namespaces and links are named after the test's pid. A guardian
 * process, started before anything is created and in its own session (out
 * of reach of meson's kill of the test's process group), deletes them and
 * the temporary directory when the test dies without saying it cleaned up
 * itself; the daemon and the worker die with the test (PR_SET_PDEATHSIG).
 */
#include "dtest.h"
#include "harness.h"
#include "kvd_common.h"
#include "kvdock.h"
#include "ltest.h"

#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define TEST_NAME "linker/two_hosts"
#define PS        16
#define PAGES     8
#define ROWS      (PAGES * PS)
#define BPR       (16 * 1024) /* 2 MiB a buffer, 4 MiB each way */
#define PAYLOAD   (2ull * ROWS * BPR)
#define RPC_PORT  7300 /* namespace A is fresh: nothing else listens there */

/* `PATH` with the sbin directories (ip lives there), stderr into stdout */
#define SH_PREFIX "PATH=\"$PATH:/usr/sbin:/sbin:/usr/bin:/bin\"; exec 2>&1; "

typedef struct net {
    char ns_a[32], ns_b[32];     /* kvdtA<pid>, kvdtB<pid> */
    char link_a[16], link_b[16]; /* the veth ends before they move and rename */
    char addr_a[32], addr_b[32]; /* 10.x.y.1, 10.x.y.2 */
    char ip[PATH_MAX];           /* the ip command */
} net_t;

/* --------------------------------------------------------------- worker */

static uint8_t pattern_k(size_t i)
{
    return (uint8_t)(i * 31 + 7);
}

static uint8_t pattern_v(size_t i)
{
    return (uint8_t)(i * 17 + 3);
}

/* Opens a linker to the daemon at addr over UCX and registers one paged
 * pool on k and v. The daemon is still starting: retries the connection
 * and waits for it to be ready (it takes no transfers before) for up to
 * 30 s. Returns 0 or the last status. */
static int open_worker(const char *addr, uint8_t *k, uint8_t *v, kvd_linker_t **l,
                       uint32_t *pool)
{
    kvd_linker_config_t cfg = {.connect = addr,
                               .transport = "ucx",
                               .client_name = "two-hosts",
                               .model_id = "th",
                               .timeout_ms = 5000};
    kvd_linker_health_t state = 0;
    int rc = -1;
    *l = NULL;
    for (int i = 0; i < 600 && state != KVD_LINKER_HEALTH_READY; i++) {
        if (*l == NULL)
            rc = kvd_linker_open(&cfg, l); /* leaves *l NULL when it fails */
        if (*l != NULL)
            rc = kvd_linker_health(*l, &state, NULL);
        if (state != KVD_LINKER_HEALTH_READY)
            kvd_sleep_ns(50 * 1000000ull);
    }
    if (state != KVD_LINKER_HEALTH_READY)
        return rc != 0 ? rc : KVD_ERR_TIMEOUT;
    return lt_register_kv(*l, "kv", k, v, BPR, PS, ROWS, NULL, pool);
}

/* The worker, inside namespace B: offload a pattern, zero the buffers, load
 * it back, compare. Returns the exit status (0 when every check passed). */
static int worker_main(const char *addr)
{
    uint8_t *k = malloc((size_t)ROWS * BPR), *v = malloc((size_t)ROWS * BPR);
    kvd_linker_t *l = NULL;
    uint32_t pool = 0;
    int rc = k && v ? open_worker(addr, k, v, &l, &pool) : KVD_ERR_NOMEM;
    if (DT_CHECK(rc == 0, "the worker cannot reach the daemon at %s: %d", addr, rc)) {
        for (size_t i = 0; i < (size_t)ROWS * BPR; i++) {
            k[i] = pattern_k(i);
            v[i] = pattern_v(i);
        }
        uint32_t tokens[ROWS];
        for (int i = 0; i < ROWS; i++)
            tokens[i] = 7 + (uint32_t)i;
        uint8_t keys[PAGES][KVD_PAGE_KEY_BYTES];
        size_t n_keys = 0;
        kvd_page_keys(tokens, ROWS, PS, NULL, keys, &n_keys);
        int64_t idx[ROWS];
        for (int i = 0; i < ROWS; i++)
            idx[i] = i;
        kvd_transfer_t t = {.pool_id = pool,
                            .keys = (const uint8_t(*)[KVD_PAGE_KEY_BYTES])keys,
                            .n_keys = PAGES,
                            .device_indices = idx,
                            .n_indices = ROWS};
        uint64_t ack = 0;
        rc = kvd_offload(l, &t, 1, &ack);
        DT_CHECK(rc == 0 && lt_wait_done(l, false, ack, 10000),
                 "the offload should succeed: %d", rc);
        memset(k, 0, (size_t)ROWS * BPR);
        memset(v, 0, (size_t)ROWS * BPR);
        rc = lt_load_all(l, 1, &t, PAGES);
        DT_CHECK(rc == 0 && lt_wait_done(l, true, 1, 10000),
                 "the load should succeed: %d", rc);
        size_t bad = 0;
        for (size_t i = 0; i < (size_t)ROWS * BPR; i++)
            bad += k[i] != pattern_k(i) || v[i] != pattern_v(i);
        DT_CHECK(bad == 0, "%zu bytes differ after the round trip", bad);
    }
    kvd_linker_close(l);
    free(k);
    free(v);
    return dt_exit_status(TEST_NAME " (worker)");
}

/* ------------------------------------------------------------- network */

/* Runs a shell script (SH_PREFIX in front); its output into out. Returns
 * the exit status, -1 when it did not finish within 30 s. */
static int sh(char *out, size_t out_len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int sh(char *out, size_t out_len, const char *fmt, ...)
{
    char script[2048];
    int n = snprintf(script, sizeof(script), "%s", SH_PREFIX);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(script + n, sizeof(script) - (size_t)n, fmt, ap);
    va_end(ap);
    return dt_sh(out, out_len, script);
}

static void net_names(net_t *n)
{
    int pid = (int)getpid();
    snprintf(n->ns_a, sizeof(n->ns_a), "kvdtA%d", pid);
    snprintf(n->ns_b, sizeof(n->ns_b), "kvdtB%d", pid);
    snprintf(n->link_a, sizeof(n->link_a), "kvdA%d", pid);
    snprintf(n->link_b, sizeof(n->link_b), "kvdB%d", pid);
    /* the namespaces are private, so any subnet works; the pid's keeps two
     * runs' addresses apart in logs */
    int x = 100 + (pid >> 8) % 100, y = pid & 0xff;
    snprintf(n->addr_a, sizeof(n->addr_a), "10.%d.%d.1", x, y);
    snprintf(n->addr_b, sizeof(n->addr_b), "10.%d.%d.2", x, y);
}

/* Deletes whatever of the namespaces and links exists (a namespace takes
 * its veth end along); idempotent. */
static void net_remove(const net_t *n)
{
    char out[1024];
    sh(out, sizeof(out),
       "ip netns del %s; ip netns del %s; ip link del %s; ip link del %s; true", n->ns_a,
       n->ns_b, n->link_a, n->link_b);
}

/* Creates the namespaces and the veth pair and checks that `ip netns exec`
 * works. Returns 0, or -1 with the reason printed (the machine lacks the
 * feature or the privilege: a skip). */
static int net_create(net_t *n)
{
    char out[4096];
    int rc = sh(out, sizeof(out), "command -v ip");
    if (rc != 0 || sscanf(out, "%4095s", n->ip) != 1) {
        printf("SKIP: no `ip` command (iproute2): %s\n", out);
        return -1;
    }
    rc = sh(out, sizeof(out),
            "ip netns add %s && ip netns add %s && "
            "ip link add %s type veth peer name %s && ip netns exec %s true",
            n->ns_a, n->ns_b, n->link_a, n->link_b, n->ns_a);
    if (rc != 0) {
        printf("SKIP: cannot create network namespaces and a veth pair (uid %d; "
               "needs root or CAP_SYS_ADMIN and CAP_NET_ADMIN, and veth): %s\n",
               (int)geteuid(), out);
        return -1;
    }
    return 0;
}

/* Moves each veth end into its namespace as kvd0, addresses it, brings it
 * and lo up. Returns 0 or -1 after recording a failure. */
static int net_configure(const net_t *n)
{
    char out[4096];
    int rc =
        sh(out, sizeof(out),
           "ip link set %s netns %s && ip link set %s netns %s && "
           "ip -n %s link set %s name kvd0 && ip -n %s link set %s name kvd0 && "
           "ip -n %s addr add %s/24 dev kvd0 && ip -n %s addr add %s/24 dev kvd0 && "
           "ip -n %s link set lo up && ip -n %s link set lo up && "
           "ip -n %s link set kvd0 up && ip -n %s link set kvd0 up",
           n->link_a, n->ns_a, n->link_b, n->ns_b, n->ns_a, n->link_a, n->ns_b, n->link_b,
           n->ns_a, n->addr_a, n->ns_b, n->addr_b, n->ns_a, n->ns_b, n->ns_a, n->ns_b);
    return DT_CHECK(rc == 0, "configuring the veth pair failed (%d): %s", rc, out) ? 0
                                                                                   : -1;
}

/* Reads kvd0's byte counters in namespace ns. Returns 0 or -1. */
static int net_counters(const char *ns, unsigned long long *rx, unsigned long long *tx)
{
    char out[1024];
    int rc = sh(out, sizeof(out),
                "ip netns exec %s cat /sys/class/net/kvd0/statistics/rx_bytes "
                "/sys/class/net/kvd0/statistics/tx_bytes",
                ns);
    return rc == 0 && sscanf(out, "%llu %llu", rx, tx) == 2 ? 0 : -1;
}

/* Checks, for up to 5 s, that `ip netns list` names none of ours and that
 * no veth end of ours is left in this namespace (removal is asynchronous). */
static void net_check_gone(const net_t *n)
{
    char out[4096];
    int rc = -1;
    for (int i = 0; i < 50 && rc != 0; i++) {
        rc = sh(out, sizeof(out),
                "ip netns list | grep -E '^(%s|%s)( |$)' && exit 1; "
                "ip link show %s >/dev/null 2>&1 && exit 1; "
                "ip link show %s >/dev/null 2>&1 && exit 1; exit 0",
                n->ns_a, n->ns_b, n->link_a, n->link_b);
        if (rc != 0)
            kvd_sleep_ns(100 * 1000000ull);
    }
    DT_CHECK(rc == 0, "the test's namespaces or links are still there: %s", out);
}

/* ------------------------------------------------------------ guardian */

/*
 * Forks the guardian: in its own session, it reads the pipe; one byte means
 * the test cleaned up itself, EOF (the test died) means it removes the
 * network and the daemon's directory d. Returns the write end
 * (close-on-exec) or -1; *pid its pid.
 */
static int guardian_start(const net_t *n, kvd_test_daemon_t *d, pid_t *pid)
{
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0)
        return -1;
    *pid = fork();
    if (*pid < 0) {
        close(p[0]);
        close(p[1]);
        return -1;
    }
    if (*pid == 0) {
        close(p[1]);
        setsid();
        int null = open("/dev/null", O_RDWR);
        dup2(null, STDIN_FILENO);
        dup2(null, STDOUT_FILENO);
        dup2(null, STDERR_FILENO);
        char b;
        if (read(p[0], &b, 1) != 1) {
            net_remove(n);
            kvd_test_daemon_stop(d, SIGKILL, 1000, NULL); /* pid 0: the files */
        }
        _exit(0);
    }
    close(p[0]);
    return p[1];
}

/* Tells the guardian that the test cleaned up and waits for it. */
static void guardian_stop(int fd, pid_t pid)
{
    if (fd < 0)
        return;
    if (write(fd, "d", 1) != 1)
        fprintf(stderr, "cannot reach the guardian\n");
    close(fd);
    kvd_test_wait_pid(pid, 5000, NULL);
}

/* ------------------------------------------------------------- children */

/*
 * Forks `ip netns exec ns argv...` with UCX_TLS=tcp UCX_NET_DEVICES=kvd0,
 * stdout and stderr into log (NULL: kept). The child dies with the test.
 * Returns its pid (the program's, as ip execs) or -1.
 */
static pid_t spawn_in(const net_t *n, const char *ns, const char *const *argv,
                      const char *log)
{
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid != 0)
        return pid;
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent)
        _exit(126);
    if (log) {
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) {
            dup2(fd, STDOUT_FILENO);
            dup2(fd, STDERR_FILENO);
            close(fd);
        }
    }
    setenv("UCX_TLS", "tcp", 1);
    setenv("UCX_NET_DEVICES", "kvd0", 1);
    const char *full[32] = {n->ip, "netns", "exec", ns};
    size_t k = 4;
    for (size_t i = 0; argv[i] && k < 31; i++)
        full[k++] = argv[i];
    full[k] = NULL;
    execv(full[0], (char *const *)full);
    _exit(127);
}

/* Makes the daemon's directory (for its socket, log, pool file, journal
 * and lock: --shm-dir), in /dev/shm where there is one. 0 or -1. */
static int daemon_dir(kvd_test_daemon_t *d)
{
    memset(d, 0, sizeof(*d));
    snprintf(d->dir, sizeof(d->dir), "/dev/shm/kvdock-test-XXXXXX");
    bool made = mkdtemp(d->dir) != NULL;
    if (!made) {
        snprintf(d->dir, sizeof(d->dir), "/tmp/kvdock-test-XXXXXX");
        made = mkdtemp(d->dir) != NULL;
    }
    if (!DT_CHECK(made, "mkdtemp")) {
        d->dir[0] = '\0';
        return -1;
    }
    snprintf(d->socket, sizeof(d->socket), "%s/kvdockd.sock", d->dir);
    snprintf(d->log, sizeof(d->log), "%s/kvdockd.log", d->dir);
    return 0;
}

/* Starts kvdockd in namespace A, listening on A's address. 0 or -1. */
static int daemon_start(const net_t *n, kvd_test_daemon_t *d, const char *token_file)
{
    char listen[64], instance[64];
    snprintf(listen, sizeof(listen), "%s:%d", n->addr_a, RPC_PORT);
    snprintf(instance, sizeof(instance), "two-hosts-%d", (int)getpid());
    const char *argv[] = {kvd_test_bin("kvdockd"),
                          "--socket",
                          d->socket,
                          "--instance",
                          instance,
                          "--shm-dir",
                          d->dir,
                          "--listen",
                          listen,
                          "--ucx-tcp", /* the bytes move over UCX's tcp */
                          "--pool-size",
                          DT_POOL,
                          "--usage-interval",
                          "0",
                          "--auth-token-file",
                          token_file,
                          NULL};
    d->pid = spawn_in(n, n->ns_a, argv, d->log);
    if (!DT_CHECK(d->pid > 0, "fork")) {
        d->pid = 0;
        return -1;
    }
    return 0;
}

/*
 * Waits up to 60 s for the worker (*ws its status). Gives up early when the
 * daemon exits first (seen without reaping it: dt_stop reports how it
 * exited). Returns 0, or -1 after recording a failure and killing the
 * worker.
 */
static int wait_worker(pid_t worker, pid_t daemon, int *ws)
{
    const char *why = "the worker did not finish within 60 s";
    for (int i = 0; i < 6000; i++) {
        if (waitpid(worker, ws, WNOHANG) == worker)
            return 0;
        siginfo_t si = {0};
        if (waitid(P_PID, (id_t)daemon, &si, WEXITED | WNOHANG | WNOWAIT) == 0 &&
            si.si_pid == daemon) {
            why = "kvdockd exited while the worker ran";
            break;
        }
        kvd_sleep_ns(10 * 1000000ull);
    }
    dt_fail(__FILE__, __LINE__, "%s", why);
    kill(worker, SIGKILL);
    kvd_test_wait_pid(worker, 5000, NULL);
    return -1;
}

/* Runs the worker in namespace B against the daemon; checks its exit and
 * that the daemon saw its Hello over TCP. */
static void run_worker(const net_t *n, const kvd_test_daemon_t *d)
{
    char self[PATH_MAX], addr[64];
    ssize_t len = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (!DT_CHECK(len > 0, "readlink /proc/self/exe"))
        return;
    self[len] = '\0'; /* our path: /proc/self/exe would be ip's in the child */
    snprintf(addr, sizeof(addr), "%s:%d", n->addr_a, RPC_PORT);
    const char *argv[] = {self, "--worker", addr, NULL};
    pid_t pid = spawn_in(n, n->ns_b, argv, NULL);
    if (!DT_CHECK(pid > 0, "fork"))
        return;
    int ws = 0;
    if (wait_worker(pid, d->pid, &ws) != 0) {
        kvd_dump_file(d->log);
        return;
    }
    DT_CHECK(WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "the worker failed: %s %d",
             WIFEXITED(ws) ? "status" : "signal",
             WIFEXITED(ws) ? WEXITSTATUS(ws) : WTERMSIG(ws));
    char hello[128];
    snprintf(hello, sizeof(hello), "hello from 'two-hosts' pid %d over tcp", (int)pid);
    DT_CHECK(kvd_test_file_contains(d->log, hello), "the daemon's log lacks \"%s\"",
             hello);
    unsigned long long rx = 0, tx = 0;
    bool read_ok = net_counters(n->ns_a, &rx, &tx) == 0;
    printf("kvd0 in %s: rx %llu B, tx %llu B (payload %llu B each way)\n", n->ns_a, rx,
           tx, PAYLOAD);
    DT_CHECK(read_ok && rx >= PAYLOAD && tx >= PAYLOAD,
             "A's veth end should have carried the %llu-byte payload each way: "
             "rx %llu B, tx %llu B",
             PAYLOAD, rx, tx);
    if (dt_failure_count() > 0)
        kvd_dump_file(d->log);
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--worker") == 0)
        return worker_main(argv[2]);
    net_t n = {0};
    kvd_test_daemon_t d = {0};
    net_names(&n);
    if (daemon_dir(&d) != 0)
        return dt_exit_status(TEST_NAME);
    pid_t guardian = 0;
    int gfd = guardian_start(&n, &d, &guardian);
    if (!DT_CHECK(gfd >= 0, "cannot fork the guardian")) {
        dt_stop(&d, SIGTERM, 5000); /* not started: removes the directory */
        return dt_exit_status(TEST_NAME);
    }
    if (net_create(&n) != 0) {
        net_remove(&n);
        dt_stop(&d, SIGTERM, 5000);
        guardian_stop(gfd, guardian);
        return KVD_TEST_SKIP;
    }
    /* the worker's linker presents the daemon's token, named by the
     * environment it inherits */
    char token_file[64] = "";
    if (dt_token_file("two-hosts-token", token_file, sizeof(token_file)) == 0 &&
        setenv("KVDOCK_AUTH_TOKEN_FILE", token_file, 1) == 0 && net_configure(&n) == 0 &&
        daemon_start(&n, &d, token_file) == 0)
        run_worker(&n, &d);
    dt_stop(&d, SIGTERM, 5000);
    if (token_file[0])
        unlink(token_file);
    net_remove(&n);
    net_check_gone(&n);
    guardian_stop(gfd, guardian);
    return dt_exit_status(TEST_NAME);
}
