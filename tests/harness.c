/*
 * harness.c - see harness.h. Every process started here is waited for and,
 * past its timeout, killed by its pid; nothing else is ever signalled.
 */
#include "harness.h"
#include "kvd_common.h"
#include "kvd_proto.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

const char *kvd_test_bin(const char *name)
{
    const char *env = strcmp(name, "kvdockd") == 0 ? "KVDOCKD" : "KVDOCK";
    const char *p = getenv(env);
    if (p == NULL || *p == '\0') {
        fprintf(stderr, "harness: %s is not set (run through meson test)\n", env);
        abort();
    }
    return p;
}

static _Atomic int failures_atomic;

int dt_failure_count(void)
{
    return atomic_load(&failures_atomic);
}

void dt_fail(const char *file, int line, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    fprintf(stderr, "FAIL %s:%d: %s\n", file, line, msg);
    atomic_fetch_add(&failures_atomic, 1);
}

int dt_exit_status(const char *test_name)
{
    int n = atomic_load(&failures_atomic);
    if (n == 0) {
        printf("%s: all checks passed\n", test_name);
        return 0;
    }
    fprintf(stderr, "%s: %d check(s) failed\n", test_name, n);
    return 1;
}

int kvd_test_wait_pid(pid_t pid, int timeout_ms, int *wstatus)
{
    return kvd_wait_pid(pid, timeout_ms, wstatus) == KVD_OK ? 0 : -1;
}

int kvd_test_daemon_exit_status(kvd_test_daemon_t *d, const char *const *extra_args,
                                int timeout_ms)
{
    if (kvd_test_daemon_start(d, extra_args, false, 0) != 0)
        return -1;
    int st = 0;
    if (kvd_test_wait_pid(d->pid, timeout_ms, &st) != 0)
        return -1;
    d->pid = 0;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

bool kvd_test_file_contains(const char *path, const char *needle)
{
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return false;
    static char buf[1 << 20];
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    return strstr(buf, needle) != NULL;
}

int kvd_test_daemon_start(kvd_test_daemon_t *d, const char *const *extra_args,
                          bool wait_ready, int timeout_ms)
{
    memset(d, 0, sizeof(*d));
    /* in /dev/shm where there is one: the daemon's pool file, journal and
     * lock go here too (--shm-dir), so that every start has a pool of its
     * own and stop removes it; a test that restarts a daemon on the same
     * files passes its own --shm-dir after these */
    snprintf(d->dir, sizeof(d->dir), "/dev/shm/kvdock-test-XXXXXX");
    if (mkdtemp(d->dir) == NULL) {
        snprintf(d->dir, sizeof(d->dir), "/tmp/kvdock-test-XXXXXX");
        if (mkdtemp(d->dir) == NULL) {
            perror("mkdtemp");
            return -1;
        }
    }
    snprintf(d->socket, sizeof(d->socket), "%s/kvdockd.sock", d->dir);
    snprintf(d->log, sizeof(d->log), "%s/kvdockd.log", d->dir);
    char instance[64];
    snprintf(instance, sizeof(instance), "test-%d", (int)getpid());

    const char *argv[64];
    size_t n = 0;
    argv[n++] = kvd_test_bin("kvdockd");
    argv[n++] = "--socket";
    argv[n++] = d->socket;
    argv[n++] = "--instance";
    argv[n++] = instance;
    argv[n++] = "--shm-dir";
    argv[n++] = d->dir;
    for (size_t i = 0; extra_args && extra_args[i] && n < 62; i++)
        argv[n++] = extra_args[i];
    /* the variant's own daemon flags (tests/meson.build: --ucx-tcp where
     * the bytes move over UCX's TCP), split at spaces */
    char env_args[256];
    kvd_strlcpy(env_args,
                getenv("KVDOCK_TEST_DAEMON_ARGS") ? getenv("KVDOCK_TEST_DAEMON_ARGS")
                                                  : "",
                sizeof(env_args));
    for (char *save = NULL, *a = strtok_r(env_args, " ", &save); a && n < 62;
         a = strtok_r(NULL, " ", &save))
        argv[n++] = a;
    argv[n] = NULL;

    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        /* a test that crashes does not leave its daemon behind (the thread
         * that starts daemons is the test's main thread) */
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() != parent)
            _exit(127);
        int fd = open(d->log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) {
            dup2(fd, STDOUT_FILENO);
            dup2(fd, STDERR_FILENO);
            close(fd);
        }
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    d->pid = pid;
    if (!wait_ready)
        return 0;
    uint64_t deadline = kvd_now_ns() + (uint64_t)timeout_ms * 1000000ull;
    while (kvd_now_ns() < deadline) {
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid) {
            fprintf(stderr, "harness: kvdockd exited early (status %d)\n",
                    WIFEXITED(st) ? WEXITSTATUS(st) : -1);
            kvd_dump_file(d->log);
            d->pid = 0;
            return -1;
        }
        if (kvd_client_health_once(d->socket, 200, 1000) == KVD_HEALTH_READY)
            return 0;
        kvd_sleep_ns(10000000);
    }
    fprintf(stderr, "harness: kvdockd not ready after %d ms\n", timeout_ms);
    kvd_dump_file(d->log);
    return -1;
}

/* Removes the files a daemon left in its directory (socket, log, pool
 * file, journal, lock, what tests put there) and the directory. */
static void remove_dir(const char *dir)
{
    DIR *dp = opendir(dir);
    struct dirent *e;
    while (dp != NULL && (e = readdir(dp)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        char path[400];
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        unlink(path);
    }
    if (dp != NULL)
        closedir(dp);
    rmdir(dir);
}

int kvd_test_daemon_stop(kvd_test_daemon_t *d, int sig, int timeout_ms, int *wstatus)
{
    int rc = 0;
    if (d->pid > 0) {
        kill(d->pid, sig);
        if (kvd_wait_pid(d->pid, timeout_ms, wstatus) != 0) {
            fprintf(stderr, "harness: kvdockd %d did not exit in %d ms; killing it\n",
                    (int)d->pid, timeout_ms);
            kvd_dump_file(d->log);
            kill(d->pid, SIGKILL);
            kvd_wait_pid(d->pid, 5000, NULL);
            rc = -1;
        }
        d->pid = 0;
    }
    if (d->dir[0])
        remove_dir(d->dir);
    return rc;
}

int kvd_test_run(char *const argv[], char *out, size_t out_len, int timeout_ms)
{
    return kvd_test_run_out(argv, out, out_len, timeout_ms, false);
}

int kvd_test_run_out(char *const argv[], char *out, size_t out_len, int timeout_ms,
                     bool stderr_too)
{
    int pipefd[2];
    if (pipe2(pipefd, O_CLOEXEC) != 0)
        return -1;
    pid_t pid = fork();
    if (pid < 0) {
        close(pipefd[0]);
        close(pipefd[1]);
        return -1;
    }
    if (pid == 0) {
        dup2(pipefd[1], STDOUT_FILENO);
        if (stderr_too)
            dup2(pipefd[1], STDERR_FILENO);
        execv(argv[0], argv);
        _exit(127);
    }
    close(pipefd[1]);
    size_t used = 0;
    fcntl(pipefd[0], F_SETFL, O_NONBLOCK);
    uint64_t deadline = kvd_now_ns() + (uint64_t)timeout_ms * 1000000ull;
    int status = -1;
    bool exited = false;
    for (;;) {
        char buf[4096];
        ssize_t n = read(pipefd[0], buf, sizeof(buf));
        if (n > 0) {
            size_t take = KVD_MIN((size_t)n, out_len > used + 1 ? out_len - used - 1 : 0);
            if (out != NULL)
                memcpy(out + used, buf, take);
            used += take;
            continue;
        }
        if (n == 0 && exited)
            break;
        int st;
        if (!exited && waitpid(pid, &st, WNOHANG) == pid) {
            exited = true;
            status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
            continue;
        }
        if (kvd_now_ns() >= deadline) {
            if (!exited) {
                kill(pid, SIGKILL);
                waitpid(pid, NULL, 0);
            }
            status = -1;
            break;
        }
        kvd_sleep_ns(2000000);
    }
    close(pipefd[0]);
    if (out != NULL && out_len)
        out[used] = '\0';
    return status;
}
