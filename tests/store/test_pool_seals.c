/*
 * Description: the pool's shared-memory file is sealed against resizing.
 * Every same-host client holds the pool's descriptor; if one could
 * ftruncate() it, every object would be zeroed (shrink then grow) and every
 * worker mapping the pages beyond the new end would take a SIGBUS. So a pool
 * made by kvd_pool_create (4 KiB pages, not populated) must carry
 * F_SEAL_SHRINK, F_SEAL_GROW and F_SEAL_SEAL (F_GET_SEALS on kvd_pool_fd);
 * ftruncate(fd, 0) and ftruncate(fd, 2 * size) fail with EPERM and leave the
 * size as it was; adding a seal fails with EPERM (the seal set is final); a
 * pattern written through the pool's mapping before the attempts reads back
 * intact afterwards through a second, independent mapping of the
 * descriptor.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kvd_store.h"
#include "store_testing.h"

#define POOL_BYTES (4ull << 20)

/* Byte i of the pattern written into the pool. */
static uint8_t pattern(uint64_t i)
{
    return (uint8_t)(i * 131u + (i >> 12) * 7u + 1u);
}

static kvd_pool_opts_t opts(void)
{
    static char instance[64];
    snprintf(instance, sizeof(instance), "unit-seals-%d", (int)getpid());
    return (kvd_pool_opts_t){.instance = instance, .size_bytes = POOL_BYTES};
}

/* The index of the first byte of [0, len) that differs from the pattern,
 * or len when none does. */
static uint64_t first_bad(const uint8_t *p, uint64_t len)
{
    for (uint64_t i = 0; i < len; i++)
        if (p[i] != pattern(i))
            return i;
    return len;
}

static void test_pool_is_sealed(void **state)
{
    (void)state;
    kvd_pool_opts_t o = opts();
    kvd_pool_t *p = NULL;
    assert_int_equal(kvd_pool_create(&o, &p), KVD_OK);
    int fd = kvd_pool_fd(p);
    assert_true(fd >= 0);
    uint64_t size = kvd_pool_size(p);
    assert_true(size == POOL_BYTES);

    /* the bytes a worker would have written: every page of the pool */
    uint8_t *base = kvd_pool_base(p);
    for (uint64_t i = 0; i < size; i++)
        base[i] = pattern(i);

    int seals = fcntl(fd, F_GET_SEALS);
    if (seals < 0)
        print_error("F_GET_SEALS: %s\n", strerror(errno));
    assert_true(seals >= 0);
    if ((seals & (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)) !=
        (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL))
        print_error("seals 0x%x lack shrink/grow/seal (0x%x)\n", (unsigned)seals,
                    (unsigned)(F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL));
    assert_true(seals & F_SEAL_SHRINK);
    assert_true(seals & F_SEAL_GROW);
    assert_true(seals & F_SEAL_SEAL);

    /* shrinking to nothing: refused, the size unchanged */
    errno = 0;
    assert_int_equal(ftruncate(fd, 0), -1);
    assert_int_equal(errno, EPERM);
    struct stat st;
    assert_int_equal(fstat(fd, &st), 0);
    assert_true((uint64_t)st.st_size == size);

    /* growing: refused too */
    errno = 0;
    assert_int_equal(ftruncate(fd, (off_t)(size * 2)), -1);
    assert_int_equal(errno, EPERM);
    assert_int_equal(fstat(fd, &st), 0);
    assert_true((uint64_t)st.st_size == size);

    /* the seal set is final: no client can add one (say, F_SEAL_WRITE) */
    errno = 0;
    assert_int_equal(fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE), -1);
    assert_int_equal(errno, EPERM);
    assert_int_equal(fcntl(fd, F_GET_SEALS), seals);

    /* what was written is intact, seen through a second mapping */
    uint8_t *view = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
    assert_true(view != MAP_FAILED);
    uint64_t bad = first_bad(view, size);
    if (bad != size)
        print_error("byte %llu reads 0x%02x through a second mapping, wrote 0x%02x\n",
                    (unsigned long long)bad, view[bad], pattern(bad));
    assert_true(bad == size);
    assert_true(first_bad(base, size) == size);
    munmap(view, size);
    kvd_pool_destroy(p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pool_is_sealed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
