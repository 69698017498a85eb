/*
 * Description: the pool guard (common/guard.c). A process that maps a
 * shared file which another holder cuts short survives its next touch past
 * the cut:
 *   - the daemon's own mapping (owner) grows the file back itself, and
 *     keeps the size it found for the daemon's damage check;
 *   - another one waits until the daemon does (here a thread standing in
 *     for it, 100 ms later; a read-only descriptor could not do it anyway);
 * and the bytes past the cut read as zeros. A fault outside every guarded
 * mapping, or in one removed, still kills the process (the handler that
 * was there before decides, or the default), checked in child processes.
 */
#include "kvd_common.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* Not cmocka: it installs a SIGBUS handler of its own before each test,
 * which would take the signal from the guard (installed once). */
#define CHECK(c)                                                                  \
    do {                                                                          \
        if (!(c)) {                                                               \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #c); \
            exit(1);                                                              \
        }                                                                         \
    } while (0)
#define assert_true(c)             CHECK(c)
#define assert_int_equal(a, b)     CHECK((long long)(a) == (long long)(b))
#define assert_int_not_equal(a, b) CHECK((long long)(a) != (long long)(b))

#define FILE_BYTES (1u << 20)
#define CUT        (256u << 10)
#define TOUCH      (512u << 10)

/* A shared-memory file of FILE_BYTES filled with 0xa5, unlinked: its fd. */
static int shm_file(void)
{
    char name[64];
    snprintf(name, sizeof(name), "/dev/shm/kvdock-test-guard-%d", (int)getpid());
    int fd = open(name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    assert_true(fd >= 0);
    unlink(name);
    assert_int_equal(ftruncate(fd, FILE_BYTES), 0);
    uint8_t *m = mmap(NULL, FILE_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    assert_true(m != MAP_FAILED);
    memset(m, 0xa5, FILE_BYTES);
    munmap(m, FILE_BYTES);
    return fd;
}

static off_t file_size(int fd)
{
    struct stat st;
    assert_int_equal(fstat(fd, &st), 0);
    return st.st_size;
}

static void test_writable_regrows(void)
{
    int fd = shm_file();
    volatile uint8_t *m =
        mmap(NULL, FILE_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    assert_true(m != MAP_FAILED);
    assert_int_equal(kvd_pool_guard_add((void *)m, FILE_BYTES, fd, true), KVD_OK);
    uint64_t before = kvd_pool_guard_repairs();
    assert_int_equal(ftruncate(fd, CUT), 0); /* the other holder's cut */
    assert_int_equal(m[CUT - 1], 0xa5);      /* before the cut: kept */
    assert_int_equal(m[TOUCH], 0);           /* past it: faulted, regrown, zeros */
    m[TOUCH + 1] = 7;                        /* and writable again */
    assert_int_equal(m[TOUCH + 1], 7);
    assert_int_equal(file_size(fd), FILE_BYTES);
    assert_int_equal(kvd_pool_guard_repairs(), before + 1);
    /* the owner (the daemon) keeps the cut it saw, for its damage check */
    assert_int_equal(kvd_pool_guard_take_cut((void *)m), CUT);
    assert_int_equal(kvd_pool_guard_take_cut((void *)m), UINT64_MAX);
    kvd_pool_guard_remove((void *)m);
    munmap((void *)m, FILE_BYTES);
    close(fd);
}

typedef struct regrower {
    int fd;
} regrower_t;

static void *regrow_later(void *arg)
{
    regrower_t *r = arg;
    usleep(100 * 1000);
    if (ftruncate(r->fd, FILE_BYTES) != 0)
        abort();
    return NULL;
}

static void test_read_only_waits(void)
{
    int fd = shm_file();
    char path[64];
    snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
    int ro = open(path, O_RDONLY | O_CLOEXEC);
    assert_true(ro >= 0);
    volatile uint8_t *m = mmap(NULL, FILE_BYTES, PROT_READ, MAP_SHARED, ro, 0);
    assert_true(m != MAP_FAILED);
    assert_int_equal(kvd_pool_guard_add((void *)m, FILE_BYTES, ro, false), KVD_OK);
    uint64_t before = kvd_pool_guard_repairs();
    assert_int_equal(ftruncate(fd, CUT), 0);
    regrower_t r = {fd};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, regrow_later, &r), 0);
    assert_int_equal(m[TOUCH], 0); /* waits for the regrowth, then reads */
    pthread_join(t, NULL);
    assert_int_equal(m[CUT - 1], 0xa5);
    assert_int_equal(kvd_pool_guard_repairs(), before + 1);
    kvd_pool_guard_remove((void *)m);
    munmap((void *)m, FILE_BYTES);
    close(ro);
    close(fd);
}

/* In a child: maps the file, guards another mapping (and this one when
 * guard_it, removed again when remove_it), cuts the file, touches past the
 * cut. Exits 0 only when the touch returned. */
static void child_touch(bool guard_it, bool remove_it)
{
    int fd = shm_file();
    volatile uint8_t *other =
        mmap(NULL, FILE_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    volatile uint8_t *m =
        mmap(NULL, FILE_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (other == MAP_FAILED || m == MAP_FAILED ||
        kvd_pool_guard_add((void *)other, CUT, fd, true) != KVD_OK)
        _exit(3);
    if (guard_it && kvd_pool_guard_add((void *)m, FILE_BYTES, fd, true) != KVD_OK)
        _exit(3);
    if (remove_it)
        kvd_pool_guard_remove((void *)m);
    if (ftruncate(fd, CUT) != 0)
        _exit(3);
    uint8_t v = m[TOUCH];
    _exit(v == 0 ? 0 : 4);
}

/* How a child that runs child_touch ended: 0 when it returned. */
static int touch_in_child(bool guard_it, bool remove_it)
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0)
        child_touch(guard_it, remove_it);
    int ws = 0;
    assert_int_equal(waitpid(pid, &ws, 0), pid);
    if (WIFEXITED(ws))
        assert_int_not_equal(WEXITSTATUS(ws), 3); /* the set-up itself failed */
    /* killed by SIGBUS, or a sanitizer's handler that reported it and
     * exited non-zero: either way not survived */
    return WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
}

static void test_unguarded_still_faults(void)
{
    assert_int_equal(touch_in_child(true, false), 0); /* the control: guarded */
    assert_int_not_equal(touch_in_child(false, false), 0);
    assert_int_not_equal(touch_in_child(true, true), 0);
}

static void test_bad_arguments(void)
{
    uint8_t b[16];
    assert_int_equal(kvd_pool_guard_add(NULL, 4096, 0, true), KVD_ERR_INVALID);
    assert_int_equal(kvd_pool_guard_add(b, 0, 0, true), KVD_ERR_INVALID);
    assert_int_equal(kvd_pool_guard_add(b, sizeof(b), -1, true), KVD_ERR_INVALID);
    kvd_pool_guard_remove(b); /* never added: nothing happens */
    kvd_pool_guard_remove(NULL);
}

int main(void)
{
    test_writable_regrows();
    test_read_only_waits();
    test_unguarded_still_faults();
    test_bad_arguments();
    printf("common/guard: all checks passed\n");
    return 0;
}
