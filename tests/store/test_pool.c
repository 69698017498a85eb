/*
 * Description: the shared-memory pool of store/ (4 KiB pages): created,
 * populated by its thread until ready, the same bytes seen through a second
 * mapping of its descriptor; sizes that are not page multiples refused; a
 * rate bound holds readiness back; destroy stops a population in progress.
 *
 * No timing figures are asserted: waits are bounded polls, and the rate
 * test only checks the order of events (not ready, then ready).
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kvd_store.h"
#include "store_testing.h"

#define MiB           (1ull << 20)
#define WAIT_READY_NS (10ull * 1000000000ull)

/* Polls until the pool is ready or failed, at most WAIT_READY_NS. */
static void wait_ready(kvd_pool_t *p)
{
    uint64_t deadline = kvd_now_ns() + WAIT_READY_NS;
    while (!kvd_pool_ready(p) && kvd_pool_error(p) == KVD_OK && kvd_now_ns() < deadline)
        kvd_sleep_ns(1000000);
    if (kvd_pool_error(p) != KVD_OK)
        print_error("population failed: %s\n", kvd_status_str(kvd_pool_error(p)));
    assert_int_equal(kvd_pool_error(p), KVD_OK);
    assert_true(kvd_pool_ready(p));
}

static kvd_pool_opts_t opts(uint64_t size, uint64_t rate)
{
    static char instance[64];
    snprintf(instance, sizeof(instance), "unit-pool-%d", (int)getpid());
    return (kvd_pool_opts_t){
        .instance = instance, .size_bytes = size, .populate_rate_bps = rate};
}

static void test_pool_populates_and_is_shared(void **state)
{
    (void)state;
    kvd_pool_opts_t o = opts(8 * MiB, 0);
    kvd_pool_t *p = NULL;
    assert_int_equal(kvd_pool_create(&o, &p), KVD_OK);
    assert_non_null(p);
    assert_true(kvd_pool_size(p) == 8 * MiB);
    assert_false(kvd_pool_hugepages(p));
    assert_false(kvd_pool_mlocked(p));
    assert_non_null(kvd_pool_base(p));
    int fd = kvd_pool_fd(p);
    assert_true(fd >= 0);

    /* the descriptor is a memfd named after the instance, of the pool's size */
    struct stat st;
    assert_int_equal(fstat(fd, &st), 0);
    assert_true((uint64_t)st.st_size == 8 * MiB);
    char link[64], target[256];
    snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, target, sizeof(target) - 1);
    assert_true(n > 0);
    target[n] = '\0';
    char want[96];
    snprintf(want, sizeof(want), "memfd:kvdock-%s", o.instance);
    if (strstr(target, want) == NULL)
        print_error("pool fd is %s, want a name with %s\n", target, want);
    assert_non_null(strstr(target, want));

    assert_int_equal(kvd_pool_populate_start(p), KVD_OK);
    wait_ready(p);
    assert_true(kvd_pool_populated_bytes(p) == 8 * MiB);
    assert_false(kvd_pool_mlocked(p));

    /* a pattern written through the pool's mapping ... */
    uint8_t *base = kvd_pool_base(p);
    for (uint64_t i = 0; i < 8 * MiB; i += 8) {
        uint64_t v = i * 0x9e3779b97f4a7c15ull;
        memcpy(base + i, &v, 8);
    }
    /* ... is what a second shared mapping of the descriptor sees */
    uint8_t *other = mmap(NULL, 8 * MiB, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    assert_true(other != MAP_FAILED);
    assert_memory_equal(other, base, 8 * MiB);
    /* and the other way round */
    memset(other + 4 * MiB + 123, 0xc3, 4096);
    for (size_t i = 0; i < 4096; i++)
        assert_int_equal(base[4 * MiB + 123 + i], 0xc3);
    assert_int_equal(munmap(other, 8 * MiB), 0);

    kvd_pool_destroy(p);
}

static void test_pool_size_not_page_multiple(void **state)
{
    (void)state;
    long page = sysconf(_SC_PAGESIZE);
    kvd_pool_t *p = (kvd_pool_t *)(uintptr_t)0x1234;
    kvd_pool_opts_t o = opts(8 * MiB + 1, 0);
    assert_int_equal(kvd_pool_create(&o, &p), KVD_ERR_INVALID);
    o = opts(8 * MiB + (uint64_t)page / 2, 0);
    assert_int_equal(kvd_pool_create(&o, &p), KVD_ERR_INVALID);
    o = opts((uint64_t)page - 1, 0);
    assert_int_equal(kvd_pool_create(&o, &p), KVD_ERR_INVALID);
    o = opts(0, 0);
    assert_int_equal(kvd_pool_create(&o, &p), KVD_ERR_INVALID);
    assert_ptr_equal(p, (kvd_pool_t *)(uintptr_t)0x1234); /* untouched */

    /* one page is fine */
    o = opts((uint64_t)page, 0);
    assert_int_equal(kvd_pool_create(&o, &p), KVD_OK);
    assert_int_equal(kvd_pool_populate_start(p), KVD_OK);
    wait_ready(p);
    assert_true(kvd_pool_populated_bytes(p) == (uint64_t)page);
    kvd_pool_destroy(p);
}

static void test_pool_rate_holds_readiness_back(void **state)
{
    (void)state;
    /* 8 MiB at 8 MiB/s: the pool cannot be ready as soon as the population
     * starts, and must become ready within the bounded wait */
    kvd_pool_opts_t o = opts(8 * MiB, 8 * MiB);
    kvd_pool_t *p = NULL;
    assert_int_equal(kvd_pool_create(&o, &p), KVD_OK);
    assert_false(kvd_pool_ready(p));
    assert_int_equal(kvd_pool_populate_start(p), KVD_OK);
    assert_false(kvd_pool_ready(p));
    wait_ready(p);
    assert_true(kvd_pool_populated_bytes(p) == 8 * MiB);
    kvd_pool_destroy(p);
}

static void test_pool_destroy_stops_population(void **state)
{
    (void)state;
    /* at 1 byte per second this pool would take months: destroy must not
     * wait for it (a hang here ends in the test's timeout) */
    kvd_pool_opts_t o = opts(8 * MiB, 1);
    kvd_pool_t *p = NULL;
    assert_int_equal(kvd_pool_create(&o, &p), KVD_OK);
    assert_int_equal(kvd_pool_populate_start(p), KVD_OK);
    kvd_sleep_ns(20000000);
    assert_false(kvd_pool_ready(p));
    assert_true(kvd_pool_populated_bytes(p) <= 8 * MiB);
    kvd_pool_destroy(p);

    /* a pool never started, and NULL, are destroyed as well */
    o = opts(1 * MiB, 0);
    assert_int_equal(kvd_pool_create(&o, &p), KVD_OK);
    kvd_pool_destroy(p);
    kvd_pool_destroy(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pool_populates_and_is_shared),
        cmocka_unit_test(test_pool_size_not_page_multiple),
        cmocka_unit_test(test_pool_rate_holds_readiness_back),
        cmocka_unit_test(test_pool_destroy_stops_population),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
