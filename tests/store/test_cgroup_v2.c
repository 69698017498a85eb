/*
 * Description: kvd_host_mem_probe() finds the cgroup v2 memory limit.
 *
 * On a cgroup v2 host /proc/self/cgroup holds one line "0::/<path>"; the
 * limit is the tightest memory.max from /sys/fs/cgroup/<path> up to
 * /sys/fs/cgroup, and the usage is memory.current next to it. Fixtures:
 *   host-nocgroup        "0::/", memory.max "max" at the root: version 2,
 *                        unlimited
 *   cgv2-limited         pod 8 GiB (1 GiB used) under kubepods 16 GiB
 *   cgv2-parent-tighter  service unlimited under a 2 GiB slice (512 MiB used)
 * and the pool sizing on the probed pod must then use the 8 GiB limit.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvd_store.h"
#include "sizing_util.h"

#define GiB (1ull << 30)
#define MiB (1ull << 20)

static kvd_host_mem_t probe(const char *name)
{
    kvd_host_mem_t h;
    memset(&h, 0, sizeof(h));
    assert_int_equal(kvd_host_mem_probe(fixture(name), &h), KVD_OK);
    print_message("%s: limit %llu usage %llu version %d\n", name,
                  (unsigned long long)h.cgroup_limit_bytes,
                  (unsigned long long)h.cgroup_usage_bytes, h.cgroup_version);
    return h;
}

static void test_probe_v2_root_unlimited(void **state)
{
    (void)state;
    kvd_host_mem_t h = probe("host-nocgroup");
    assert_int_equal(h.cgroup_version, 2);
    assert_true(h.cgroup_limit_bytes == UINT64_MAX);
    assert_true(h.cgroup_usage_bytes == 0);
}

static void test_probe_v2_pod_limit(void **state)
{
    (void)state;
    kvd_host_mem_t h = probe("cgv2-limited");
    assert_true(h.mem_total_bytes == 64 * GiB);
    assert_true(h.mem_available_bytes == 60 * GiB);
    assert_int_equal(h.cgroup_version, 2);
    /* the pod's 8 GiB is tighter than kubepods' 16 GiB; usage is the pod's */
    assert_true(h.cgroup_limit_bytes == 8 * GiB);
    assert_true(h.cgroup_usage_bytes == 1 * GiB);
}

static void test_probe_v2_parent_tighter(void **state)
{
    (void)state;
    kvd_host_mem_t h = probe("cgv2-parent-tighter");
    assert_int_equal(h.cgroup_version, 2);
    assert_true(h.cgroup_limit_bytes == 2 * GiB);
    assert_true(h.cgroup_usage_bytes == 512 * MiB);
}

static void test_sizing_on_probed_pod(void **state)
{
    (void)state;
    kvd_host_mem_t h = probe("cgv2-limited");
    kvd_sizing_t s;
    char why[512] = "";
    /* limit 8 GiB, can give 7 GiB: 0.9 * 8 GiB - 512 MiB = 7194066944
     * (aligned) does not fit in 7 GiB - 512 MiB = 6979321856. Sized on the
     * host's 64 GiB instead it would "fit", and the pod's limit would kill
     * the daemon while it populates. */
    kvd_sizing_req_t r = {.mem_fraction = 0.9,
                          .reserve_bytes = 512 * MiB,
                          .object_bytes = 2 * MiB,
                          .align_bytes = 4096};
    int rc = kvd_sizing_compute(&h, &r, &s, why, sizeof(why));
    print_message("limit %llu can_give %llu budget %llu: %s\n",
                  (unsigned long long)s.limit_bytes, (unsigned long long)s.can_give_bytes,
                  (unsigned long long)s.budget_bytes, why);
    assert_int_equal(rc, KVD_ERR_NO_SPACE);
    assert_true(s.limit_bytes == 8 * GiB);
    assert_true(s.can_give_bytes == 7 * GiB);
    assert_true(s.budget_bytes == 7194066944ull);

    /* the same for a 7 GiB --pool-size */
    r.mem_fraction = 0;
    r.pool_size_bytes = 7 * GiB;
    assert_int_equal(kvd_sizing_compute(&h, &r, &s, why, sizeof(why)), KVD_ERR_NO_SPACE);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_probe_v2_root_unlimited),
        cmocka_unit_test(test_probe_v2_pod_limit),
        cmocka_unit_test(test_probe_v2_parent_tighter),
        cmocka_unit_test(test_sizing_on_probed_pod),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
