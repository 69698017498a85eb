/*
 * Description: the pool as a named file (kvd_pool_opts_t.dir): created
 * private (a regular file of mode 0600 owned by this user, of the pool's
 * size) and reported as created; its bytes outlive the pool object and
 * come back when it attaches again (not created, same device and inode);
 * a second pool of the same instance is refused while the first holds the
 * lock (KVD_ERR_BUSY), and the lock file names the holder's pid; a pool
 * file of another size is refused (KVD_ERR_STATE) and left as it was, as
 * is one open to others; fresh removes it and starts from zeroes; the
 * read-only descriptor cannot write; a pool that does not fit the file
 * system is refused before anything is allocated (KVD_ERR_NO_SPACE);
 * hugepages on a directory that is no hugetlbfs mount is refused
 * (KVD_ERR_UNSUPPORTED). A pool without a dir is still a memfd.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "kvd_store.h"

#define MiB        (1ull << 20)
#define POOL_BYTES (4 * MiB)

static char dir[64], instance[64], pool_path[160];

static int setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof(dir), "/dev/shm/kvdock-pf-XXXXXX");
    if (mkdtemp(dir) == NULL) {
        snprintf(dir, sizeof(dir), "/tmp/kvdock-pf-XXXXXX");
        if (mkdtemp(dir) == NULL)
            return -1;
    }
    snprintf(instance, sizeof(instance), "unit-%d", (int)getpid());
    snprintf(pool_path, sizeof(pool_path), "%s/kvdock-%s.pool", dir, instance);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    char p[200];
    unlink(pool_path);
    snprintf(p, sizeof(p), "%s/kvdock-%s.lock", dir, instance);
    unlink(p);
    rmdir(dir);
    return 0;
}

static kvd_pool_opts_t opts(uint64_t size)
{
    return (kvd_pool_opts_t){.instance = instance, .size_bytes = size, .dir = dir};
}

static void test_created_then_attached(void **state)
{
    (void)state;
    kvd_pool_opts_t o = opts(POOL_BYTES);
    kvd_pool_t *p = NULL;
    assert_int_equal(kvd_pool_create(&o, &p), KVD_OK);
    assert_true(kvd_pool_persistent(p));
    assert_true(kvd_pool_created(p));
    assert_string_equal(kvd_pool_path(p), pool_path);
    struct stat st;
    assert_int_equal(stat(pool_path, &st), 0);
    assert_true(S_ISREG(st.st_mode));
    assert_int_equal(st.st_mode & 07777, 0600);
    assert_int_equal(st.st_uid, geteuid());
    assert_int_equal((uint64_t)st.st_size, POOL_BYTES);
    uint64_t dev, ino;
    kvd_pool_identity(p, &dev, &ino);
    assert_int_equal(ino, (uint64_t)st.st_ino);
    assert_int_equal(dev, (uint64_t)st.st_dev);

    /* while it is held, another pool of the instance is refused */
    kvd_pool_t *q = NULL;
    assert_int_equal(kvd_pool_create(&o, &q), KVD_ERR_BUSY);
    assert_null(q);
    char lock[200], pid[32] = "", want[32];
    snprintf(lock, sizeof(lock), "%s/kvdock-%s.lock", dir, instance);
    int fd = open(lock, O_RDONLY);
    assert_true(fd >= 0);
    assert_true(read(fd, pid, sizeof(pid) - 1) > 0);
    close(fd);
    snprintf(want, sizeof(want), "%d\n", (int)getpid());
    assert_string_equal(pid, want);

    assert_int_equal(kvd_pool_populate_start(p), KVD_OK);
    for (int i = 0; i < 1000 && !kvd_pool_ready(p); i++)
        usleep(10000);
    assert_true(kvd_pool_ready(p));
    uint8_t *base = kvd_pool_base(p);
    for (uint64_t i = 0; i < POOL_BYTES; i += 4096)
        base[i] = (uint8_t)(i / 4096 + 1);
    kvd_pool_destroy(p);

    /* attached again: the bytes are there, population keeps them */
    assert_int_equal(kvd_pool_create(&o, &p), KVD_OK);
    assert_false(kvd_pool_created(p));
    uint64_t dev2, ino2;
    kvd_pool_identity(p, &dev2, &ino2);
    assert_int_equal(ino2, ino);
    assert_int_equal(kvd_pool_populate_start(p), KVD_OK);
    for (int i = 0; i < 1000 && !kvd_pool_ready(p); i++)
        usleep(10000);
    assert_true(kvd_pool_ready(p));
    base = kvd_pool_base(p);
    for (uint64_t i = 0; i < POOL_BYTES; i += 4096)
        assert_int_equal(base[i], (uint8_t)(i / 4096 + 1));

    /* the read-only descriptor cannot write */
    int ro = kvd_pool_fd_ro(p);
    assert_int_equal(write(ro, "x", 1), -1);
    assert_true(mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, ro, 0) ==
                MAP_FAILED);
    kvd_pool_destroy(p);

    /* another size: refused, the file as it was */
    kvd_pool_opts_t big = opts(2 * POOL_BYTES);
    assert_int_equal(kvd_pool_create(&big, &p), KVD_ERR_STATE);
    assert_int_equal(stat(pool_path, &st), 0);
    assert_int_equal((uint64_t)st.st_size, POOL_BYTES);

    /* fresh: removed first, zeroes */
    o.fresh = true;
    assert_int_equal(kvd_pool_create(&o, &p), KVD_OK);
    assert_true(kvd_pool_created(p));
    base = kvd_pool_base(p);
    for (uint64_t i = 0; i < POOL_BYTES; i += 4096)
        assert_int_equal(base[i], 0);
    kvd_pool_destroy(p);
}

static void test_not_private_refused(void **state)
{
    (void)state;
    kvd_pool_opts_t o = opts(POOL_BYTES);
    kvd_pool_t *p = NULL;
    assert_int_equal(kvd_pool_create(&o, &p), KVD_OK);
    kvd_pool_destroy(p);
    assert_int_equal(chmod(pool_path, 0644), 0);
    assert_int_equal(kvd_pool_create(&o, &p), KVD_ERR_STATE);
    struct stat st;
    assert_int_equal(stat(pool_path, &st), 0); /* left as it was */
    assert_int_equal(st.st_mode & 0777, 0644);
    /* a symlink in its place is not followed */
    unlink(pool_path);
    assert_int_equal(symlink("/dev/null", pool_path), 0);
    assert_int_not_equal(kvd_pool_create(&o, &p), KVD_OK);
}

static void test_too_big_and_hugepages(void **state)
{
    (void)state;
    /* far more than any tmpfs here holds; refused before any allocation */
    kvd_pool_opts_t o = opts(1ull << 50);
    kvd_pool_t *p = NULL;
    assert_int_equal(kvd_pool_create(&o, &p), KVD_ERR_NO_SPACE);
    assert_int_equal(access(pool_path, F_OK), -1); /* nothing left behind */

    kvd_pool_opts_t h = opts(POOL_BYTES);
    h.hugepages = true;
    assert_int_equal(kvd_pool_create(&h, &p), KVD_ERR_UNSUPPORTED);
    assert_int_equal(access(pool_path, F_OK), -1);
}

/* The lock file removed while its daemon runs: a second daemon of the
 * instance still cannot attach (the pool file is locked by an open file
 * description only the holder has); once the holder is gone, it can. */
static void test_lock_file_removed(void **state)
{
    (void)state;
    kvd_pool_opts_t o = opts(POOL_BYTES);
    kvd_pool_t *p = NULL, *q = NULL;
    assert_int_equal(kvd_pool_create(&o, &p), KVD_OK);
    char lock[200];
    snprintf(lock, sizeof(lock), "%s/kvdock-%s.lock", dir, instance);
    assert_int_equal(unlink(lock), 0);
    int client = open(pool_path, O_RDWR); /* a client's descriptor, as the daemon's */
    assert_true(client >= 0);
    assert_int_equal(kvd_pool_create(&o, &q), KVD_ERR_BUSY);
    assert_null(q);
    kvd_pool_destroy(p);
    /* a client that still holds the file does not hold its lock */
    assert_int_equal(kvd_pool_create(&o, &q), KVD_OK);
    kvd_pool_destroy(q);
    close(client);
}

/* A writer that shrinks the pool file (it holds the read-write
 * descriptor; only a memfd can be sealed): zeroing an extent past the new
 * end grows the file back instead of a SIGBUS in the daemon. */
static void test_zero_past_a_shrunk_end(void **state)
{
    (void)state;
    kvd_pool_opts_t o = opts(POOL_BYTES);
    kvd_pool_t *p = NULL;
    assert_int_equal(kvd_pool_create(&o, &p), KVD_OK);
    uint8_t *base = kvd_pool_base(p);
    int fd = open(pool_path, O_RDWR);
    assert_true(fd >= 0);
    uint8_t ones[8192];
    memset(ones, 0xff, sizeof(ones));
    assert_int_equal(pwrite(fd, ones, sizeof(ones), POOL_BYTES - sizeof(ones)),
                     (ssize_t)sizeof(ones));
    assert_int_equal(ftruncate(fd, 0), 0); /* the misbehaving writer */
    kvd_pool_zero(p, POOL_BYTES - sizeof(ones), sizeof(ones)); /* no SIGBUS */
    struct stat st;
    assert_int_equal(fstat(fd, &st), 0);
    assert_int_equal((uint64_t)st.st_size, POOL_BYTES); /* grown back */
    for (size_t i = 0; i < sizeof(ones); i++)
        assert_int_equal(base[POOL_BYTES - sizeof(ones) + i], 0);
    close(fd);
    kvd_pool_destroy(p);
}

/* The journal's space counts at creation: a pool that fits alone but not
 * with beside_bytes more is refused, naming both, and leaves no file. */
static void test_beside_bytes_counted(void **state)
{
    (void)state;
    struct statfs fs;
    assert_int_equal(statfs(dir, &fs), 0);
    kvd_pool_opts_t o = opts(POOL_BYTES);
    o.beside_bytes = (uint64_t)fs.f_bavail * (uint64_t)fs.f_bsize;
    kvd_pool_t *p = NULL;
    assert_int_equal(kvd_pool_create(&o, &p), KVD_ERR_NO_SPACE);
    assert_int_equal(access(pool_path, F_OK), -1);
    o.beside_bytes = 4096;
    assert_int_equal(kvd_pool_create(&o, &p), KVD_OK);
    kvd_pool_destroy(p);
}

/* A directory on a disk: the journal, never synced, could outlive the
 * pool's bytes across a reboot there; refused, nothing left behind. */
static void test_disk_dir_refused(void **state)
{
    (void)state;
    char disk[64] = "kvdock-pf-disk-XXXXXX"; /* in the test's own directory */
    assert_non_null(mkdtemp(disk));
    struct statfs fs;
    assert_int_equal(statfs(disk, &fs), 0);
    if (fs.f_type == 0x01021994 /* TMPFS_MAGIC */) {
        rmdir(disk);
        skip(); /* the working directory is on tmpfs here: nothing to refuse */
    }
    kvd_pool_opts_t o = {.instance = instance, .size_bytes = POOL_BYTES, .dir = disk};
    kvd_pool_t *p = NULL;
    assert_int_equal(kvd_pool_create(&o, &p), KVD_ERR_UNSUPPORTED);
    char path[256];
    snprintf(path, sizeof(path), "%s/kvdock-%s.pool", disk, instance);
    assert_int_equal(access(path, F_OK), -1);
    snprintf(path, sizeof(path), "%s/kvdock-%s.lock", disk, instance);
    unlink(path);
    assert_int_equal(rmdir(disk), 0);
}

static void test_memfd_without_dir(void **state)
{
    (void)state;
    kvd_pool_opts_t o = {.instance = instance, .size_bytes = POOL_BYTES};
    kvd_pool_t *p = NULL;
    assert_int_equal(kvd_pool_create(&o, &p), KVD_OK);
    assert_false(kvd_pool_persistent(p));
    assert_string_equal(kvd_pool_path(p), "");
    assert_int_equal(access(pool_path, F_OK), -1);
    kvd_pool_destroy(p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_created_then_attached, setup, teardown),
        cmocka_unit_test_setup_teardown(test_not_private_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_too_big_and_hugepages, setup, teardown),
        cmocka_unit_test_setup_teardown(test_lock_file_removed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_zero_past_a_shrunk_end, setup, teardown),
        cmocka_unit_test_setup_teardown(test_disk_dir_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_beside_bytes_counted, setup, teardown),
        cmocka_unit_test_setup_teardown(test_memfd_without_dir, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
