/*
 * harness.h - helpers for the integration tests: start a real kvdockd on a
 * socket in a fresh temporary directory, wait for it to be ready, run the
 * kvdock CLI and capture its output, stop the daemon by its pid.
 *
 * The binaries come from the environment meson sets for each test:
 * KVDOCKD and KVDOCK (absolute paths into the build tree).
 */
#ifndef KVD_TEST_HARNESS_H
#define KVD_TEST_HARNESS_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

/* liburing's convention: meson reports exit 77 as a skip */
#define KVD_TEST_SKIP 77

typedef struct kvd_test_daemon {
    pid_t pid;
    char dir[64];     /* temporary directory, removed by stop */
    char socket[108]; /* dir/kvdockd.sock */
    char log[300];    /* dir/kvdockd.log: the daemon's stderr and stdout */
} kvd_test_daemon_t;

/* Absolute path of a built binary: "kvdockd" or "kvdock". Aborts if unset. */
const char *kvd_test_bin(const char *name);

/*
 * Starts kvdockd with `--socket <dir>/kvdockd.sock --instance test-<pid>`
 * (then extra_args, then the words of $KVDOCK_TEST_DAEMON_ARGS: a test
 * variant's daemon flags)
 * plus the NULL-terminated extra arguments. With wait_ready, waits up to
 * timeout_ms for Health to answer "ready". Returns 0 on success; -1 if the
 * daemon exited or never became ready (its log is printed to stderr).
 */
int kvd_test_daemon_start(kvd_test_daemon_t *d, const char *const *extra_args,
                          bool wait_ready, int timeout_ms);

/* Starts kvdockd (as kvd_test_daemon_start, not waiting for ready) for a
 * start that must end by itself within timeout_ms: its exit status (0..255,
 * or 128 + the signal), or -1 when it could not be started or still runs
 * (d->pid is then kept for kvd_test_daemon_stop). The log stays in d->log. */
int kvd_test_daemon_exit_status(kvd_test_daemon_t *d, const char *const *extra_args,
                                int timeout_ms);

/* Sends `sig`, waits up to timeout_ms for the exit, then SIGKILLs. Stores
 * the wait status in *wstatus (may be NULL); removes the temp directory.
 * Returns 0 when the daemon exited within the timeout, -1 otherwise. */
int kvd_test_daemon_stop(kvd_test_daemon_t *d, int sig, int timeout_ms, int *wstatus);

/*
 * Runs argv (argv[0] a path), captures stdout into out (NUL-terminated,
 * truncated to out_len-1), waits up to timeout_ms. Returns the exit status
 * (0..255), or -1 when it did not exit normally in time.
 */
int kvd_test_run(char *const argv[], char *out, size_t out_len, int timeout_ms);
/* The same, with stderr into out too when stderr_too; out may be NULL
 * (out_len 0): the output is read and dropped. */
int kvd_test_run_out(char *const argv[], char *out, size_t out_len, int timeout_ms,
                     bool stderr_too);

/* Non-fatal checks: a failure is printed (FAIL file:line: message) and
 * counted, and the test goes on to its cleanup. Safe from several threads. */

/* Failures recorded so far by DT_CHECK (any thread). */
int dt_failure_count(void);

void dt_fail(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Records a failure with the message when cond is false; evaluates to cond. */
#define DT_CHECK(cond, ...)                           \
    ({                                                \
        bool dt_ok_ = (cond);                         \
        if (!dt_ok_)                                  \
            dt_fail(__FILE__, __LINE__, __VA_ARGS__); \
        dt_ok_;                                       \
    })

/* Exit status for main(): 0 when nothing failed, else 1 (with a summary). */
int dt_exit_status(const char *test_name);

/* Waits up to timeout_ms for a process started by this test to exit: 0
 * once reaped, -1 otherwise (kvd_wait_pid, for tests that see only the
 * public kvdock.h). A daemon's log is dumped with kvd_dump_file. */
int kvd_test_wait_pid(pid_t pid, int timeout_ms, int *wstatus);

/* True when `needle` occurs in the file. */
bool kvd_test_file_contains(const char *path, const char *needle);

#endif
