/*
 * Description: --mlock locks the pool once it is populated. Where the
 * process may lock that much memory (root, or RLIMIT_MEMLOCK large enough,
 * as on CI), the daemon becomes ready and Stats, `kvdock stats` and
 * /proc/<pid>/status (VmLck) all say the pool is locked. Where it may not,
 * the daemon refuses to serve: it exits 1 and its log says that mlock
 * failed, the system's reason and how to allow it, in the pool's line and
 * again in the line it exits with (never "in progress"). As root both are
 * checked: the refusal after dropping CAP_IPC_LOCK from the capability
 * bounding set (so the daemon this test execs lacks it) and lowering
 * RLIMIT_MEMLOCK. Neither is a skip. (Under AddressSanitizer and
 * ThreadSanitizer mlock is a no-op: VmLck is not checked and no refusal can
 * be provoked in those builds.)
 */
#include "dtest.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/capability.h>
#include <sys/prctl.h>
#include <sys/resource.h>

#define POOL_BYTES (32ull * 1024 * 1024)

/* the sanitizers' runtimes turn mlock into a no-op that succeeds; the
 * daemon under test is built with the same one as this test */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define MLOCK_NOOP 1
#else
#define MLOCK_NOOP 0
#endif

static char out[1 << 16];

/* VmLck of a process in bytes, or 0. */
static __attribute__((unused)) uint64_t vm_locked(pid_t pid)
{
    char path[64], line[256];
    snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    uint64_t kib = 0;
    while (f != NULL && fgets(line, sizeof(line), f) != NULL)
        if (strncmp(line, "VmLck:", 6) == 0)
            kib = strtoull(line + 6, NULL, 10);
    if (f != NULL)
        fclose(f);
    return kib * 1024;
}

/* True when this process (and so its child) may lock the pool. */
static bool may_lock(void)
{
    struct rlimit rl;
    if (geteuid() == 0)
        return true;
    return getrlimit(RLIMIT_MEMLOCK, &rl) == 0 &&
           (rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur >= 2 * POOL_BYTES);
}

static void run_locked(void)
{
    kvd_test_daemon_t d = {0};
    if (!DT_CHECK(dt_start(&d, (const char *const[]){"--pool-size", "32M", "--mlock",
                                                     NULL}) == 0,
                  "kvdockd --mlock did not become ready"))
        return;
    kvd_stats_rep_t *st = calloc(1, sizeof(*st));
    if (st != NULL && DT_CHECK(dt_stats_fresh(d.socket, st) == KVD_OK, "stats failed")) {
        DT_CHECK(st->memory.mlocked, "Stats says the pool is not locked");
        DT_CHECK(st->memory.pool_bytes == POOL_BYTES, "pool_bytes %llu",
                 (unsigned long long)st->memory.pool_bytes);
    }
    free(st);
    if (!MLOCK_NOOP)
        DT_CHECK(vm_locked(d.pid) >= POOL_BYTES, "VmLck of kvdockd is %llu, want >= %llu",
                 (unsigned long long)vm_locked(d.pid), POOL_BYTES);
    int rc =
        dt_cli(out, sizeof(out), (const char *[]){"--socket", d.socket, "stats", NULL});
    DT_CHECK(rc == 0 && strstr(out, "locked") != NULL,
             "kvdock stats should say the pool is locked: exit %d\n%s", rc, out);
    rc = dt_cli(out, sizeof(out),
                (const char *[]){"--socket", d.socket, "stats", "--json", NULL});
    DT_CHECK(rc == 0 && strstr(out, "\"mlocked\":true") != NULL,
             "kvdock stats --json should say mlocked true: exit %d", rc);
    dt_stop(&d, SIGTERM, 10000);
}

static void run_refused(void)
{
    kvd_test_daemon_t d = {0};
    const char *args[] = {"--pool-size", "32M", "--mlock", "--usage-interval", "0", NULL};
    if (!DT_CHECK(kvd_test_daemon_start(&d, args, false, 0) == 0, "cannot start kvdockd"))
        return;
    int st = 0;
    bool exited = kvd_test_wait_pid(d.pid, 30000, &st) == 0;
    DT_CHECK(exited && WIFEXITED(st) && WEXITSTATUS(st) == 1,
             "kvdockd --mlock without the right to lock should exit 1");
    DT_CHECK(kvd_test_file_contains(d.log, "mlock of") &&
                 kvd_test_file_contains(d.log, "RLIMIT_MEMLOCK"),
             "the log should say mlock failed and how to allow it");
    /* the exit line keeps the reason: the pool's text, not a bare status */
    char *log = dt_read_file(d.log);
    const char *line = log != NULL ? strstr(log, "could not be populated") : NULL;
    const char *end = line != NULL ? strchr(line, '\n') : NULL;
    size_t len = line == NULL ? 0 : end != NULL ? (size_t)(end - line) : strlen(line);
    char exit_line[512] = "";
    snprintf(exit_line, sizeof(exit_line), "%.*s", (int)len, line != NULL ? line : "");
    DT_CHECK(strstr(exit_line, "mlock of") != NULL &&
                 strstr(exit_line, "RLIMIT_MEMLOCK") != NULL &&
                 strstr(exit_line, "in progress") == NULL,
             "the exit line should say why mlock failed: '%s'", exit_line);
    free(log);
    if (exited)
        d.pid = 0;
    kvd_test_daemon_stop(&d, SIGKILL, 5000, NULL);
}

/* As root: takes the right to lock from the daemons started from now on
 * (CAP_IPC_LOCK out of the bounding set, which an exec keeps, and a small
 * RLIMIT_MEMLOCK). False when the system does not let it. */
static __attribute__((unused)) bool forbid_locking(void)
{
    struct rlimit rl = {.rlim_cur = 64 * 1024, .rlim_max = 64 * 1024};
    if (prctl(PR_CAPBSET_DROP, CAP_IPC_LOCK, 0, 0, 0) != 0 ||
        setrlimit(RLIMIT_MEMLOCK, &rl) != 0) {
        fprintf(stderr,
                "daemon/mlock: cannot take CAP_IPC_LOCK away (%s): the "
                "refusal is not checked here\n",
                strerror(errno));
        return false;
    }
    return true;
}

int main(void)
{
    if (!may_lock() && MLOCK_NOOP) {
        printf("daemon/mlock: SKIP: this build's sanitizer makes mlock a no-op, and "
               "this process may not lock the pool: nothing to check\n");
        return 77;
    }
    if (!may_lock()) {
        run_refused();
        return dt_exit_status("daemon/mlock");
    }
    run_locked();
    if (!MLOCK_NOOP && geteuid() == 0 && forbid_locking())
        run_refused();
    return dt_exit_status("daemon/mlock");
}
