/*
 * Description: the UCX server's seccomp filter (daemon/sandbox.h), entered
 * by a forked child of this test that already runs a second thread (as the
 * UCX server runs UCX's). After kvd_sandbox_enter, on the thread that
 * entered and on the one that was already running (TSYNC):
 *   - refused: execve, fork, clone3 (ENOSYS, so that glibc falls back to
 *     clone), an open for writing, creating, truncating or appending, creat,
 *     unlink, rename, mkdir, truncate, chmod, openat2 (ENOSYS), socket and
 *     socketpair of AF_UNIX, kill of the parent and of the process group,
 *     ptrace, process_vm_readv of the parent, prlimit64 of the parent,
 *     io_uring_setup, bpf, setuid, unshare;
 *   - still served: a new thread (pthread_create, through clone), an open
 *     for reading, a TCP socket, kill and prlimit64 of itself;
 *   - /proc/self/status says Seccomp 2 (filter mode), NoNewPrivs 1, and one
 *     filter more than the test process has.
 * Before both, still single-threaded, the child confines its files
 * (kvd_sandbox_confine_files, Landlock): from then on, on both threads, a
 * file it could read before (the test's own, /etc/passwd, the parent's
 * /proc/PID/status and /proc/PID/mem) is refused with EACCES, and what UCX
 * reads is served (/proc/self/status, /proc/net/route, the loader's cache,
 * /sys/class/net). Where the kernel has no Landlock, that part is skipped,
 * saying so, and reading stays served.
 * Each refused call was served before the filter (the file it changes was
 * made and opened for writing before), so the refusal is the filter's.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kvd_common.h"
#include "sandbox.h"

static char dir[64];
static char file[96];

/* The failures of one child, written to stderr and counted. */
static int failures;

#define EXPECT(cond, ...)                                   \
    do {                                                    \
        if (!(cond)) {                                      \
            fprintf(stderr, "sandbox child: " __VA_ARGS__); \
            fprintf(stderr, " (errno %d)\n", errno);        \
            failures++;                                     \
        }                                                   \
    } while (0)

/* A call refused with err. */
#define REFUSED(call, err, what)                                                        \
    do {                                                                                \
        errno = 0;                                                                      \
        long r_ = (long)(call);                                                         \
        EXPECT(r_ == -1 && errno == (err), "%s: answered %ld, want errno %d", what, r_, \
               err);                                                                    \
    } while (0)

/* The value of field `name` of /proc/self/status, or -1. */
static long status_field(const char *name)
{
    FILE *f = fopen("/proc/self/status", "r");
    if (f == NULL)
        return -1;
    char line[256];
    long v = -1;
    size_t n = strlen(name);
    while (fgets(line, sizeof(line), f) != NULL)
        if (strncmp(line, name, n) == 0 && line[n] == ':')
            v = strtol(line + n + 1, NULL, 10);
    fclose(f);
    return v;
}

static bool confined; /* Landlock took: reads outside its rules are refused */

/* Opens path for reading: 0, or the errno. */
static int read_errno(const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return errno;
    close(fd);
    return 0;
}

static void *nothing(void *arg)
{
    return arg;
}

/* What the filter refuses and serves, from the calling thread. */
static void check_from_here(const char *who)
{
    pid_t parent = getppid();
    char what[96];
#define W(s) (snprintf(what, sizeof(what), "%s: %s", who, s), what)
    /* /bin/false: were it run, the child's status would say so */
    REFUSED(execl("/bin/false", "false", (char *)NULL), EPERM, W("execve"));
    pid_t f = fork();
    if (f == 0)
        _exit(0); /* the filter let it through: counted below */
    EXPECT(f == -1 && errno == EPERM, "%s: fork answered %d", who, (int)f);
    if (f > 0)
        waitpid(f, NULL, 0);
    REFUSED(syscall(SYS_clone3, NULL, 0), ENOSYS, W("clone3"));
    REFUSED(open(file, O_WRONLY), EPERM, W("open for writing"));
    REFUSED(open(file, O_RDWR), EPERM, W("open for reading and writing"));
    REFUSED(open(file, O_RDONLY | O_TRUNC), EPERM, W("open with O_TRUNC"));
    REFUSED(open(file, O_RDONLY | O_APPEND), EPERM, W("open with O_APPEND"));
    char fresh[128];
    snprintf(fresh, sizeof(fresh), "%s/new", dir);
    REFUSED(open(fresh, O_RDONLY | O_CREAT, 0600), EPERM, W("open with O_CREAT"));
    REFUSED(creat(file, 0600), EPERM, W("creat"));
    REFUSED(unlink(file), EPERM, W("unlink"));
    REFUSED(rename(file, dir), EPERM, W("rename"));
    REFUSED(mkdir(file, 0700), EPERM, W("mkdir"));
    REFUSED(truncate(file, 0), EPERM, W("truncate"));
    REFUSED(chmod(file, 0777), EPERM, W("chmod"));
#ifdef SYS_openat2
    REFUSED(syscall(SYS_openat2, AT_FDCWD, file, NULL, 0), ENOSYS, W("openat2"));
#endif
    REFUSED(socket(AF_UNIX, SOCK_STREAM, 0), EPERM, W("socket(AF_UNIX)"));
    int sv[2];
    REFUSED(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), EPERM, W("socketpair(AF_UNIX)"));
    REFUSED(kill(parent, 0), EPERM, W("kill of the parent"));
    REFUSED(kill(0, 0), EPERM, W("kill of the process group"));
    REFUSED(syscall(SYS_ptrace, 16 /* PTRACE_ATTACH */, parent, 0, 0), EPERM,
            W("ptrace"));
    char buf[8];
    struct iovec here = {buf, sizeof(buf)}, there = {(void *)&parent, sizeof(buf)};
    REFUSED(process_vm_readv(parent, &here, 1, &there, 1, 0), EPERM,
            W("process_vm_readv"));
    struct rlimit rl;
    REFUSED(prlimit(parent, RLIMIT_NOFILE, NULL, &rl), EPERM, W("prlimit of the parent"));
    REFUSED(syscall(SYS_io_uring_setup, 4, NULL), EPERM, W("io_uring_setup"));
    REFUSED(syscall(SYS_bpf, 0, NULL, 0), EPERM, W("bpf"));
    REFUSED(syscall(SYS_setuid, getuid()), EPERM, W("setuid"));
    REFUSED(syscall(SYS_unshare, 0x10000000 /* CLONE_NEWUSER */), EPERM, W("unshare"));
#undef W

    /* what it still serves */
    pthread_t t;
    int rc = pthread_create(&t, NULL, nothing, NULL);
    EXPECT(rc == 0, "%s: pthread_create: %s", who, strerror(rc));
    if (rc == 0)
        pthread_join(t, NULL);
    /* reading: what UCX reads, and, unless confined, anything */
    int e = read_errno(file);
    EXPECT(e == (confined ? EACCES : 0), "%s: reading the test's file: errno %d, want %d",
           who, e, confined ? EACCES : 0);
    char theirs[64];
    snprintf(theirs, sizeof(theirs), "/proc/%d/status", (int)parent);
    char their_mem[64];
    snprintf(their_mem, sizeof(their_mem), "/proc/%d/mem", (int)parent);
    if (confined) {
        const char *refused[] = {"/etc/passwd", theirs, their_mem};
        for (size_t i = 0; i < KVD_ARRAY_SIZE(refused); i++) {
            e = read_errno(refused[i]);
            EXPECT(e == EACCES, "%s: reading %s: errno %d, want EACCES", who, refused[i],
                   e);
        }
    }
    const char *served[] = {"/proc/self/status", "/proc/net/route", "/etc/ld.so.cache",
                            "/sys/class/net"};
    for (size_t i = 0; i < KVD_ARRAY_SIZE(served); i++) {
        e = read_errno(served[i]);
        EXPECT(e == 0 || e == ENOENT, "%s: reading %s refused: errno %d", who, served[i],
               e);
    }
    int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    EXPECT(s >= 0, "%s: socket(AF_INET) refused", who);
    if (s >= 0)
        close(s);
    EXPECT(kill(getpid(), 0) == 0, "%s: kill of itself refused", who);
    EXPECT(prlimit(0, RLIMIT_NOFILE, NULL, &rl) == 0, "%s: prlimit of itself refused",
           who);
}

/* The thread that ran before the filter: waits for it, then checks. */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static bool entered;

static void *older_thread(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&mu);
    while (!entered)
        pthread_cond_wait(&cv, &mu);
    pthread_mutex_unlock(&mu);
    check_from_here("the thread started before");
    return NULL;
}

static int child_main(long filters_before)
{
    /* served before the filter: the refusals below are the filter's */
    int fd = open(file, O_WRONLY | O_TRUNC);
    EXPECT(fd >= 0, "open for writing before the filter");
    if (fd >= 0)
        close(fd);
    char their_status[64];
    snprintf(their_status, sizeof(their_status), "/proc/%d/status", (int)getppid());
    EXPECT(read_errno("/etc/passwd") == 0 && read_errno(their_status) == 0,
           "reading before the confinement");
    char why_ll[160] = "";
    int ll = kvd_sandbox_confine_files(why_ll, sizeof(why_ll));
    if (ll == KVD_ERR_UNSUPPORTED)
        printf("sandbox child: files not confined (%s): reads stay served\n", why_ll);
    else
        EXPECT(ll == KVD_OK, "kvd_sandbox_confine_files: %s (%s)", kvd_status_str(ll),
               why_ll);
    confined = ll == KVD_OK;
    pthread_t older;
    if (pthread_create(&older, NULL, older_thread, NULL) != 0) {
        fprintf(stderr, "sandbox child: pthread_create before the filter\n");
        return 100;
    }
    char why[160] = "";
    int rc = kvd_sandbox_enter(why, sizeof(why));
    if (rc == KVD_ERR_UNSUPPORTED) {
        /* pthread_join would need the thread to finish: it waits on cv */
        fprintf(stderr, "sandbox child: %s\n", why);
        return 77;
    }
    EXPECT(rc == KVD_OK, "kvd_sandbox_enter: %s (%s)", kvd_status_str(rc), why);
    pthread_mutex_lock(&mu);
    entered = true;
    pthread_cond_signal(&cv);
    pthread_mutex_unlock(&mu);
    check_from_here("the thread that entered");
    pthread_join(older, NULL);
    EXPECT(status_field("Seccomp") == 2, "Seccomp is %ld", status_field("Seccomp"));
    EXPECT(status_field("NoNewPrivs") == 1, "NoNewPrivs is %ld",
           status_field("NoNewPrivs"));
    long filters = status_field("Seccomp_filters");
    EXPECT(filters < 0 || filters == filters_before + 1, "%ld filters, %ld before",
           filters, filters_before);
    return failures > 100 ? 100 : failures;
}

static void test_filter(void **state)
{
    (void)state;
    long filters_before = status_field("Seccomp_filters");
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0)
        /* _exit: a sanitizer's at-exit work (LeakSanitizer stops the world
         * with clone and ptrace) is what the filter refuses */
        _exit(child_main(filters_before));
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st));
    if (WEXITSTATUS(st) == 77)
        skip();
    /* the number of checks that failed: each is on stderr */
    assert_int_equal(WEXITSTATUS(st), 0);
}

int main(void)
{
    snprintf(dir, sizeof(dir), "/tmp/kvd-sandbox-XXXXXX");
    if (mkdtemp(dir) == NULL)
        return 1;
    snprintf(file, sizeof(file), "%s/f", dir);
    int fd = open(file, O_WRONLY | O_CREAT | O_EXCL, 0600);
    if (fd < 0)
        return 1;
    close(fd);
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_filter)};
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    unlink(file);
    rmdir(dir);
    return rc;
}
