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
 * plus the NULL-terminated extra arguments. With wait_ready, waits up to
 * timeout_ms for Health to answer "ready". Returns 0 on success; -1 if the
 * daemon exited or never became ready (its log is printed to stderr).
 */
int kvd_test_daemon_start(kvd_test_daemon_t *d, const char *const *extra_args,
                          bool wait_ready, int timeout_ms);

/* Sends `sig`, waits up to timeout_ms for the exit, then SIGKILLs. Stores
 * the wait status in *wstatus (may be NULL); removes the temp directory.
 * Returns 0 when the daemon exited within the timeout, -1 otherwise. */
int kvd_test_daemon_stop(kvd_test_daemon_t *d, int sig, int timeout_ms, int *wstatus);

/* Waits up to timeout_ms for a process started by this test to exit. */
int kvd_test_wait_pid(pid_t pid, int timeout_ms, int *wstatus);

/*
 * Runs argv (argv[0] a path), captures stdout into out (NUL-terminated,
 * truncated to out_len-1), waits up to timeout_ms. Returns the exit status
 * (0..255), or -1 when it did not exit normally in time.
 */
int kvd_test_run(char *const argv[], char *out, size_t out_len, int timeout_ms);

/* Prints the file's contents to stderr (for a failing test's context). */
void kvd_test_dump_file(const char *path);

/* True when `needle` occurs in the file. */
bool kvd_test_file_contains(const char *path, const char *needle);

#endif
