/*
 * Description: the pool sizing of store/: kvd_host_mem_probe() on fixture
 * directories shaped like a host's / (cgroup v1, no limit, no meminfo), and
 * the sizing rule of kvd_store.h (kvd_sizing_compute, kvd_sizing_format).
 * The probe of cgroup v2 fixtures is test_cgroup_v2.c.
 *
 * Every expected figure below was worked out by hand from the rule in the
 * header:
 *   limit    = min(MemTotal, cgroup limit)
 *   can_give = min(MemAvailable, cgroup limit - usage)
 *   budget   = pool_size aligned down, or
 *              align_down(floor(fraction * limit) - reserve)
 *   refused (KVD_ERR_NO_SPACE) when budget > align_down(can_give - reserve)
 * and a refusal's text must name a --pool-size and a --mem-fraction that do
 * work: the test feeds them back in.
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
#define KiB (1ull << 10)

/* ------------------------------------------------------------ helpers */

static kvd_host_mem_t probe(const char *name)
{
    kvd_host_mem_t h;
    memset(&h, 0, sizeof(h));
    int rc = kvd_host_mem_probe(fixture(name), &h);
    if (rc != KVD_OK)
        print_error("probe of fixture %s: %s\n", name, kvd_status_str(rc));
    assert_int_equal(rc, KVD_OK);
    return h;
}

/* The figures the cgroup v2 fixtures hold (test_cgroup_v2 checks that the
 * probe reads exactly these); the rule is a pure function of them. */
static kvd_host_mem_t pod_host(void) /* cgv2-limited */
{
    return (kvd_host_mem_t){.mem_total_bytes = 64 * GiB,
                            .mem_available_bytes = 60 * GiB,
                            .cgroup_limit_bytes = 8 * GiB,
                            .cgroup_usage_bytes = 1 * GiB,
                            .cgroup_version = 2};
}

static kvd_host_mem_t slice_host(void) /* cgv2-parent-tighter */
{
    return (kvd_host_mem_t){.mem_total_bytes = 64 * GiB,
                            .mem_available_bytes = 60 * GiB,
                            .cgroup_limit_bytes = 2 * GiB,
                            .cgroup_usage_bytes = 512 * MiB,
                            .cgroup_version = 2};
}

static kvd_sizing_req_t req_size(uint64_t pool, uint64_t reserve, uint64_t object)
{
    return (kvd_sizing_req_t){.pool_size_bytes = pool,
                              .reserve_bytes = reserve,
                              .object_bytes = object,
                              .align_bytes = 4096};
}

static kvd_sizing_req_t req_fraction(double f, uint64_t reserve, uint64_t object)
{
    return (kvd_sizing_req_t){.mem_fraction = f,
                              .reserve_bytes = reserve,
                              .object_bytes = object,
                              .align_bytes = 4096};
}

/* Checks a refusal's text: it names both flags, and the values it suggests
 * make kvd_sizing_compute succeed on the same host. */
static void check_refusal_advice(const kvd_host_mem_t *host, const kvd_sizing_req_t *req,
                                 const char *why)
{
    assert_non_null(strstr(why, "--pool-size"));
    assert_non_null(strstr(why, "--mem-fraction"));

    char num[64], suffix = 0;
    assert_true(find_suggestion(why, "--pool-size", num, sizeof(num), &suffix));
    assert_int_equal(suffix, 'K');
    uint64_t kib = strtoull(num, NULL, 10);
    kvd_sizing_req_t r = *req;
    r.mem_fraction = 0;
    r.pool_size_bytes = kib * 1024;
    kvd_sizing_t s;
    char why2[512] = "";
    int rc = kvd_sizing_compute(host, &r, &s, why2, sizeof(why2));
    if (rc != KVD_OK)
        print_error("suggested --pool-size %sK fails: %s (%s)\n", num, kvd_status_str(rc),
                    why2);
    assert_int_equal(rc, KVD_OK);
    assert_true(s.budget_bytes == kib * 1024); /* 1 KiB multiples of a 4 KiB page */

    assert_true(find_suggestion(why, "--mem-fraction", num, sizeof(num), &suffix));
    double f = strtod(num, NULL);
    assert_true(f > 0.0 && f <= 1.0);
    r = *req;
    r.pool_size_bytes = 0;
    r.mem_fraction = f;
    why2[0] = '\0';
    rc = kvd_sizing_compute(host, &r, &s, why2, sizeof(why2));
    if (rc != KVD_OK)
        print_error("suggested --mem-fraction %s fails: %s (%s)\n", num,
                    kvd_status_str(rc), why2);
    assert_int_equal(rc, KVD_OK);
}

/* ------------------------------------------------------------- probe */

static void test_probe_host_without_cgroup_limit(void **state)
{
    (void)state;
    kvd_host_mem_t h = probe("host-nocgroup");
    assert_true(h.mem_total_bytes == 16 * GiB);
    assert_true(h.mem_available_bytes == 12 * GiB);
    assert_true(h.cgroup_limit_bytes == UINT64_MAX); /* "max" */
    assert_true(h.cgroup_usage_bytes == 0);
    /* (its cgroup_version is checked by test_cgroup_v2) */

    /* a trailing slash on the root changes nothing */
    char root[1100];
    snprintf(root, sizeof(root), "%s/", fixture("host-nocgroup"));
    kvd_host_mem_t h2;
    assert_int_equal(kvd_host_mem_probe(root, &h2), KVD_OK);
    assert_memory_equal(&h, &h2, sizeof(h));
}

static void test_probe_cgroup_v1_limited(void **state)
{
    (void)state;
    kvd_host_mem_t h = probe("cgv1-limited");
    assert_true(h.mem_total_bytes == 32 * GiB);
    assert_true(h.mem_available_bytes == 30 * GiB);
    assert_true(h.cgroup_limit_bytes == 4 * GiB);
    assert_true(h.cgroup_usage_bytes == 512 * MiB);
    assert_int_equal(h.cgroup_version, 1);
}

static void test_probe_cgroup_v1_unlimited(void **state)
{
    (void)state;
    kvd_host_mem_t h = probe("cgv1-unlimited");
    assert_true(h.mem_total_bytes == 32 * GiB);
    /* 9223372036854771712 is cgroup v1's "no limit" */
    assert_true(h.cgroup_limit_bytes == UINT64_MAX);
    assert_true(h.cgroup_usage_bytes == 0); /* no usage file */
    assert_int_equal(h.cgroup_version, 1);
}

static void test_probe_without_meminfo_fails(void **state)
{
    (void)state;
    kvd_host_mem_t h;
    memset(&h, 0x5a, sizeof(h));
    kvd_host_mem_t before = h;
    int rc = kvd_host_mem_probe(fixture("no-meminfo"), &h);
    assert_int_equal(rc, KVD_ERR_NOT_FOUND);
    assert_memory_equal(&h, &before, sizeof(h)); /* output untouched */

    rc = kvd_host_mem_probe(fixture("no-such-fixture"), &h);
    assert_true(rc == KVD_ERR_NOT_FOUND);
    assert_memory_equal(&h, &before, sizeof(h));
}

static void test_probe_live_system(void **state)
{
    (void)state;
    kvd_host_mem_t h;
    assert_int_equal(kvd_host_mem_probe("/", &h), KVD_OK);
    assert_true(h.mem_total_bytes > 0);
    assert_true(h.mem_available_bytes <= h.mem_total_bytes);
    assert_true(h.cgroup_version >= 0 && h.cgroup_version <= 2);
}

/* ------------------------------------------------------------ sizing */

static void test_sizing_fraction_fits(void **state)
{
    (void)state;
    /* 16 GiB host: 0.5 * 16 GiB - 1 GiB = 7 GiB, can give 12 GiB - 1 GiB */
    kvd_host_mem_t h = probe("host-nocgroup");
    kvd_sizing_req_t r = req_fraction(0.5, 1 * GiB, 1 * MiB);
    kvd_sizing_t s;
    char why[512] = "";
    assert_int_equal(kvd_sizing_compute(&h, &r, &s, why, sizeof(why)), KVD_OK);
    assert_true(s.limit_bytes == 16 * GiB);
    assert_true(s.can_give_bytes == 12 * GiB);
    assert_true(s.budget_bytes == 7 * GiB);
    assert_true(s.max_budget_bytes == 11 * GiB);
    assert_true(s.objects_fit == 7168);
    assert_string_equal(s.source, "mem-fraction");

    /* pod with 8 GiB limit, 1 GiB used: limit 8 GiB, can give 7 GiB;
     * 0.5 * 8 GiB - 512 MiB = 3.5 GiB, 2 MiB objects -> 1792 */
    h = pod_host();
    r = req_fraction(0.5, 512 * MiB, 2 * MiB);
    assert_int_equal(kvd_sizing_compute(&h, &r, &s, why, sizeof(why)), KVD_OK);
    assert_true(s.limit_bytes == 8 * GiB);
    assert_true(s.can_give_bytes == 7 * GiB);
    assert_true(s.budget_bytes == 3758096384ull);
    assert_true(s.objects_fit == 1792);

    /* v1 container, 4 GiB limit, 512 MiB used: 0.8 * 4 GiB = 3435973836.8,
     * floor - 256 MiB = 3167538380, aligned down to 4 KiB = 3167535104 */
    h = probe("cgv1-limited");
    r = req_fraction(0.8, 256 * MiB, 64 * KiB);
    assert_int_equal(kvd_sizing_compute(&h, &r, &s, why, sizeof(why)), KVD_OK);
    assert_true(s.limit_bytes == 4 * GiB);
    assert_true(s.can_give_bytes == 3584 * MiB);
    assert_true(s.budget_bytes == 3167535104ull);
    assert_true(s.objects_fit == 3167535104ull / (64 * KiB));

    /* v1 without a limit: the host's 32 GiB count, no reserve */
    h = probe("cgv1-unlimited");
    r = req_fraction(0.5, 0, 4096);
    assert_int_equal(kvd_sizing_compute(&h, &r, &s, why, sizeof(why)), KVD_OK);
    assert_true(s.limit_bytes == 32 * GiB);
    assert_true(s.can_give_bytes == 30 * GiB);
    assert_true(s.budget_bytes == 16 * GiB);
    assert_true(s.objects_fit == 4194304);

    /* the parent's 2 GiB, 512 MiB used: can give 1.5 GiB */
    h = slice_host();
    r = req_fraction(0.5, 256 * MiB, 1 * MiB);
    assert_int_equal(kvd_sizing_compute(&h, &r, &s, why, sizeof(why)), KVD_OK);
    assert_true(s.limit_bytes == 2 * GiB);
    assert_true(s.can_give_bytes == 1536 * MiB);
    assert_true(s.budget_bytes == 768 * MiB);
}

static void test_sizing_budget_ignores_free_memory(void **state)
{
    (void)state;
    /* the budget depends on the limit only: less MemAvailable, same budget */
    kvd_host_mem_t h = probe("host-nocgroup");
    kvd_sizing_req_t r = req_fraction(0.25, 1 * GiB, 1 * MiB);
    kvd_sizing_t a, b;
    assert_int_equal(kvd_sizing_compute(&h, &r, &a, NULL, 0), KVD_OK);
    h.mem_available_bytes = 6 * GiB;
    assert_int_equal(kvd_sizing_compute(&h, &r, &b, NULL, 0), KVD_OK);
    assert_true(a.budget_bytes == 3 * GiB);
    assert_true(b.budget_bytes == 3 * GiB);
    assert_true(b.can_give_bytes == 6 * GiB);
}

static void test_sizing_pool_size_exact_and_aligned(void **state)
{
    (void)state;
    kvd_host_mem_t h = probe("host-nocgroup");
    kvd_sizing_t s;
    char why[512] = "";

    kvd_sizing_req_t r = req_size(10 * GiB, 1 * GiB, 1 * MiB);
    assert_int_equal(kvd_sizing_compute(&h, &r, &s, why, sizeof(why)), KVD_OK);
    assert_true(s.budget_bytes == 10 * GiB);
    assert_true(s.objects_fit == 10240);
    assert_string_equal(s.source, "pool-size");

    /* exactly what can be given: 12 GiB available - 1 GiB reserve */
    r = req_size(11 * GiB, 1 * GiB, 1 * MiB);
    assert_int_equal(kvd_sizing_compute(&h, &r, &s, why, sizeof(why)), KVD_OK);
    assert_true(s.budget_bytes == 11 * GiB);

    /* not a page multiple: aligned down, and then it fits */
    r = req_size(11 * GiB + 100, 1 * GiB, 1 * MiB);
    assert_int_equal(kvd_sizing_compute(&h, &r, &s, why, sizeof(why)), KVD_OK);
    assert_true(s.budget_bytes == 11 * GiB);

    /* 2 MiB pages: 3 GiB + 1 MiB -> 3 GiB */
    r = req_size(3 * GiB + 1 * MiB, 0, 1 * MiB);
    r.align_bytes = 2 * MiB;
    assert_int_equal(kvd_sizing_compute(&h, &r, &s, why, sizeof(why)), KVD_OK);
    assert_true(s.budget_bytes == 3 * GiB);
    assert_true(s.objects_fit == 3072);

    /* objects_fit rounds down */
    r = req_size(10 * MiB, 0, 3 * MiB);
    assert_int_equal(kvd_sizing_compute(&h, &r, &s, why, sizeof(why)), KVD_OK);
    assert_true(s.objects_fit == 3);
}

static void test_sizing_refuses_pool_size_that_does_not_fit(void **state)
{
    (void)state;
    kvd_host_mem_t h = probe("host-nocgroup");
    kvd_sizing_t s;
    char why[512] = "";

    /* one page more than 12 GiB - 1 GiB */
    kvd_sizing_req_t r = req_size(11 * GiB + 4096, 1 * GiB, 1 * MiB);
    assert_int_equal(kvd_sizing_compute(&h, &r, &s, why, sizeof(why)), KVD_ERR_NO_SPACE);
    print_message("refusal: %s\n", why);
    check_refusal_advice(&h, &r, why);
    /* the suggestion is the largest that fits: 11 GiB = 11534336K, 0.75 */
    char num[64], suffix;
    assert_true(find_suggestion(why, "--pool-size", num, sizeof(num), &suffix));
    assert_string_equal(num, "11534336");
    assert_true(find_suggestion(why, "--mem-fraction", num, sizeof(num), &suffix));
    assert_true(strtod(num, NULL) == 0.75);

    /* the pod: can give 7 GiB - 512 MiB = 6.5 GiB; 7 GiB does not fit */
    h = pod_host();
    r = req_size(6979321856ull, 512 * MiB, 2 * MiB);
    assert_int_equal(kvd_sizing_compute(&h, &r, &s, why, sizeof(why)), KVD_OK);
    r = req_size(7 * GiB, 512 * MiB, 2 * MiB);
    why[0] = '\0';
    assert_int_equal(kvd_sizing_compute(&h, &r, &s, why, sizeof(why)), KVD_ERR_NO_SPACE);
    check_refusal_advice(&h, &r, why);

    /* v1 container: 3.5 GiB pool + 256 MiB reserve > 3.5 GiB */
    h = probe("cgv1-limited");
    r = req_size(3584 * MiB, 256 * MiB, 1 * MiB);
    why[0] = '\0';
    assert_int_equal(kvd_sizing_compute(&h, &r, &s, why, sizeof(why)), KVD_ERR_NO_SPACE);
    check_refusal_advice(&h, &r, why);

    /* a pool larger than the whole host */
    h = probe("host-nocgroup");
    r = req_size(64 * GiB, 1 * GiB, 1 * MiB);
    why[0] = '\0';
    assert_int_equal(kvd_sizing_compute(&h, &r, &s, why, sizeof(why)), KVD_ERR_NO_SPACE);
    check_refusal_advice(&h, &r, why);
}

static void test_sizing_refuses_fraction_that_does_not_fit(void **state)
{
    (void)state;
    kvd_sizing_t s;
    char why[512] = "";

    /* 0.9 * 16 GiB - 1 GiB = 14388137984 (aligned) > 11 GiB */
    kvd_host_mem_t h = probe("host-nocgroup");
    kvd_sizing_req_t r = req_fraction(0.9, 1 * GiB, 1 * MiB);
    assert_int_equal(kvd_sizing_compute(&h, &r, &s, why, sizeof(why)), KVD_ERR_NO_SPACE);
    assert_true(s.budget_bytes == 14388137984ull);
    check_refusal_advice(&h, &r, why);

    /* 0.95 * 8 GiB - 512 MiB = 7623565312 (aligned) > 6.5 GiB; the largest
     * fitting fraction is (6.5 GiB + 512 MiB) / 8 GiB = 0.875 */
    h = pod_host();
    r = req_fraction(0.95, 512 * MiB, 2 * MiB);
    why[0] = '\0';
    assert_int_equal(kvd_sizing_compute(&h, &r, &s, why, sizeof(why)), KVD_ERR_NO_SPACE);
    assert_true(s.budget_bytes == 7623565312ull);
    assert_true(s.max_budget_bytes == 6979321856ull);
    check_refusal_advice(&h, &r, why);

    /* 0.9 * 4 GiB - 256 MiB > 3.25 GiB in the v1 container */
    h = probe("cgv1-limited");
    r = req_fraction(0.9, 256 * MiB, 1 * MiB);
    why[0] = '\0';
    assert_int_equal(kvd_sizing_compute(&h, &r, &s, why, sizeof(why)), KVD_ERR_NO_SPACE);
    check_refusal_advice(&h, &r, why);

    /* all of the parent-limited cgroup */
    h = slice_host();
    r = req_fraction(1.0, 0, 1 * MiB);
    why[0] = '\0';
    assert_int_equal(kvd_sizing_compute(&h, &r, &s, why, sizeof(why)), KVD_ERR_NO_SPACE);
    check_refusal_advice(&h, &r, why);
}

static void test_sizing_needs_exactly_one_of_size_and_fraction(void **state)
{
    (void)state;
    kvd_host_mem_t h = probe("host-nocgroup");
    kvd_sizing_t s;
    char why[512] = "";
    kvd_sizing_req_t r = req_size(1 * GiB, 0, 1 * MiB);
    r.mem_fraction = 0.5;
    assert_int_equal(kvd_sizing_compute(&h, &r, &s, why, sizeof(why)), KVD_ERR_INVALID);
    assert_non_null(strstr(why, "--pool-size"));
    assert_non_null(strstr(why, "--mem-fraction"));

    r = req_size(0, 0, 1 * MiB);
    why[0] = '\0';
    assert_int_equal(kvd_sizing_compute(&h, &r, &s, why, sizeof(why)), KVD_ERR_INVALID);
    assert_true(strlen(why) > 0);
    /* why may be NULL */
    assert_int_equal(kvd_sizing_compute(&h, &r, &s, NULL, 0), KVD_ERR_INVALID);
}

static void test_sizing_budget_below_one_object_or_page(void **state)
{
    (void)state;
    kvd_host_mem_t h = probe("host-nocgroup");
    kvd_sizing_t s;
    char why[512] = "";
    /* 1 MiB pool, 2 MiB objects */
    kvd_sizing_req_t r = req_size(1 * MiB, 0, 2 * MiB);
    assert_int_equal(kvd_sizing_compute(&h, &r, &s, why, sizeof(why)), KVD_ERR_INVALID);
    assert_true(strlen(why) > 0);
    /* less than a page: aligns down to nothing */
    r = req_size(100, 0, 64);
    assert_int_equal(kvd_sizing_compute(&h, &r, &s, why, sizeof(why)), KVD_ERR_INVALID);
    /* a fraction whose share is all reserve */
    r = req_fraction(0.01, 1 * GiB, 1 * MiB); /* 0.01 * 16 GiB < 1 GiB */
    assert_int_equal(kvd_sizing_compute(&h, &r, &s, why, sizeof(why)), KVD_ERR_INVALID);
    /* exactly one object is enough */
    r = req_size(2 * MiB, 0, 2 * MiB);
    assert_int_equal(kvd_sizing_compute(&h, &r, &s, why, sizeof(why)), KVD_OK);
    assert_true(s.objects_fit == 1);
}

static void test_sizing_format_names_every_input(void **state)
{
    (void)state;
    kvd_host_mem_t h = pod_host();
    kvd_sizing_req_t r = req_fraction(0.5, 512 * MiB, 2 * MiB);
    kvd_sizing_t s;
    assert_int_equal(kvd_sizing_compute(&h, &r, &s, NULL, 0), KVD_OK);
    char line[1024];
    kvd_sizing_format(&h, &r, &s, line, sizeof(line));
    print_message("%s\n", line);
    const char *keys[] = {"source=", "mem_total=", "mem_available=", "cgroup",
                          "limit=",  "can_give=",  "fraction=",      "reserve=",
                          "budget=", "page=",      "object=",        "objects_fit="};
    for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
        if (strstr(line, keys[i]) == NULL)
            print_error("\"%s\" missing from the sizing line\n", keys[i]);
        assert_non_null(strstr(line, keys[i]));
    }
    assert_non_null(strstr(line, "objects_fit=1792"));
    assert_non_null(strstr(line, "3758096384")); /* the budget in bytes */

    /* a short buffer is cut and terminated */
    char small[16];
    memset(small, 'x', sizeof(small));
    kvd_sizing_format(&h, &r, &s, small, 10);
    assert_int_equal(strlen(small), 9);
    assert_int_equal(small[10], 'x');
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_probe_host_without_cgroup_limit),
        cmocka_unit_test(test_probe_cgroup_v1_limited),
        cmocka_unit_test(test_probe_cgroup_v1_unlimited),
        cmocka_unit_test(test_probe_without_meminfo_fails),
        cmocka_unit_test(test_probe_live_system),
        cmocka_unit_test(test_sizing_fraction_fits),
        cmocka_unit_test(test_sizing_budget_ignores_free_memory),
        cmocka_unit_test(test_sizing_pool_size_exact_and_aligned),
        cmocka_unit_test(test_sizing_refuses_pool_size_that_does_not_fit),
        cmocka_unit_test(test_sizing_refuses_fraction_that_does_not_fit),
        cmocka_unit_test(test_sizing_needs_exactly_one_of_size_and_fraction),
        cmocka_unit_test(test_sizing_budget_below_one_object_or_page),
        cmocka_unit_test(test_sizing_format_names_every_input),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
