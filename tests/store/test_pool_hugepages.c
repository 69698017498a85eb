/*
 * Description: a pool of 2 MiB hugetlb pages is created, populated until
 * ready, and shared through its descriptor like a 4 KiB pool.
 *
 * Needs reserved hugepages (vm.nr_hugepages). Where the kernel has no
 * hugetlb memfd, or none are reserved and free, the test prints why and
 * exits 77 (meson: SKIP); any other failure is a failure.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "kvd_store.h"
#include "store_testing.h"

#define MiB        (1ull << 20)
#define POOL_BYTES (4 * MiB) /* two 2 MiB pages */
#define SKIP_EXIT  77

static char skip_reason[512];

/* Reads "Key: N" from /proc/meminfo; -1 when absent. */
static long long meminfo_value(const char *key)
{
    FILE *f = fopen("/proc/meminfo", "r");
    if (f == NULL)
        return -1;
    char line[256];
    long long v = -1;
    size_t klen = strlen(key);
    while (fgets(line, sizeof(line), f) != NULL) {
        if (strncmp(line, key, klen) == 0 && line[klen] == ':') {
            v = strtoll(line + klen + 1, NULL, 10);
            break;
        }
    }
    fclose(f);
    return v;
}

/* True when fewer free 2 MiB hugepages exist than the pool needs. */
static bool hugepages_short(void)
{
    long long free_pages = meminfo_value("HugePages_Free");
    long long page_kib = meminfo_value("Hugepagesize");
    return free_pages < 0 || page_kib != 2048 ||
           (unsigned long long)free_pages * 2 * MiB < POOL_BYTES;
}

static void skip_because(const char *what, int status)
{
    FILE *f = fopen("/proc/sys/vm/nr_hugepages", "r");
    long long nr = -1;
    if (f != NULL) {
        if (fscanf(f, "%lld", &nr) != 1)
            nr = -1;
        fclose(f);
    }
    snprintf(skip_reason, sizeof(skip_reason),
             "%s (%s): vm.nr_hugepages=%lld, HugePages_Free=%lld, Hugepagesize=%lld kB; "
             "reserve some with sysctl vm.nr_hugepages=%llu",
             what, kvd_status_str(status), nr, meminfo_value("HugePages_Free"),
             meminfo_value("Hugepagesize"), POOL_BYTES / (2 * MiB));
    print_message("SKIP: %s\n", skip_reason);
    skip();
}

static void test_pool_hugepages(void **state)
{
    (void)state;
    kvd_pool_opts_t o = {
        .instance = "unit-hugepages", .size_bytes = POOL_BYTES, .hugepages = true};
    kvd_pool_t *p = NULL;
    int rc = kvd_pool_create(&o, &p);
    if (rc == KVD_ERR_UNSUPPORTED) {
        skip_because("no hugetlb memfd on this kernel", rc);
        return;
    }
    if (rc != KVD_OK && hugepages_short()) {
        /* a shared hugetlb mapping reserves its pages at mmap time */
        skip_because("no free hugepages to map the pool", rc);
        return;
    }
    assert_int_equal(rc, KVD_OK);
    assert_true(kvd_pool_hugepages(p));

    /* a size that is not a multiple of 2 MiB is refused */
    kvd_pool_opts_t bad = o;
    bad.size_bytes = POOL_BYTES + 4096;
    kvd_pool_t *q = NULL;
    assert_int_equal(kvd_pool_create(&bad, &q), KVD_ERR_INVALID);

    assert_int_equal(kvd_pool_populate_start(p), KVD_OK);
    uint64_t deadline = kvd_now_ns() + 10ull * 1000000000ull;
    while (!kvd_pool_ready(p) && kvd_pool_error(p) == KVD_OK && kvd_now_ns() < deadline)
        kvd_sleep_ns(1000000);
    if (kvd_pool_error(p) == KVD_ERR_NO_SPACE && hugepages_short()) {
        kvd_pool_destroy(p);
        skip_because("out of hugepages while populating", KVD_ERR_NO_SPACE);
        return;
    }
    assert_int_equal(kvd_pool_error(p), KVD_OK);
    assert_true(kvd_pool_ready(p));
    assert_true(kvd_pool_populated_bytes(p) == POOL_BYTES);

    uint8_t *base = kvd_pool_base(p);
    for (uint64_t i = 0; i < POOL_BYTES; i++)
        base[i] = (uint8_t)(i * 31 + 7);
    uint8_t *other =
        mmap(NULL, POOL_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, kvd_pool_fd(p), 0);
    assert_true(other != MAP_FAILED);
    assert_memory_equal(other, base, POOL_BYTES);
    munmap(other, POOL_BYTES);
    kvd_pool_destroy(p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pool_hugepages),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    if (failed == 0 && skip_reason[0] != '\0') {
        fprintf(stderr, "skipped: %s\n", skip_reason);
        return SKIP_EXIT;
    }
    return failed;
}
