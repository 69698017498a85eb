/*
 * Description: a sizing refusal never suggests a value that does not work.
 *
 * kvd_store.h: "On error `why` says what is wrong and which value would
 * work." When kvd_sizing_compute() refuses with KVD_ERR_NO_SPACE, any
 * "--pool-size <N>K" or "--mem-fraction <F>" in the text, fed back in with
 * the same reserve, must give KVD_OK. Two tight hosts where that matters:
 *   - the reserve alone is more than the host can give: no pool fits, so
 *     no pool size or fraction may be offered as fitting;
 *   - the room left after the reserve is under 1% of the limit: a fraction
 *     printed with two decimals must still give a budget of at least a page.
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

static void check_advice_works(const kvd_host_mem_t *h, const kvd_sizing_req_t *req)
{
    kvd_sizing_t s;
    char why[512] = "";
    assert_int_equal(kvd_sizing_compute(h, req, &s, why, sizeof(why)), KVD_ERR_NO_SPACE);
    print_message("refusal: %s\n", why);

    char num[64], why2[512];
    int bad = 0;
    if (find_suggestion(why, "--pool-size", num, sizeof(num), NULL)) {
        kvd_sizing_req_t r = *req;
        r.mem_fraction = 0;
        r.pool_size_bytes = strtoull(num, NULL, 10) * 1024;
        why2[0] = '\0';
        int rc = kvd_sizing_compute(h, &r, &s, why2, sizeof(why2));
        if (rc != KVD_OK) {
            print_error("suggested --pool-size %sK gives %s: %s\n", num,
                        kvd_status_str(rc), why2);
            bad++;
        }
    }
    if (find_suggestion(why, "--mem-fraction", num, sizeof(num), NULL)) {
        kvd_sizing_req_t r = *req;
        r.pool_size_bytes = 0;
        r.mem_fraction = strtod(num, NULL);
        why2[0] = '\0';
        int rc = kvd_sizing_compute(h, &r, &s, why2, sizeof(why2));
        if (rc != KVD_OK) {
            print_error("suggested --mem-fraction %s gives %s: %s\n", num,
                        kvd_status_str(rc), why2);
            bad++;
        }
    }
    assert_int_equal(bad, 0);
}

static void test_reserve_larger_than_room(void **state)
{
    (void)state;
    /* 16 GiB host, 12 GiB available, 13 GiB reserve: nothing fits */
    kvd_host_mem_t h = {.mem_total_bytes = 16 * GiB,
                        .mem_available_bytes = 12 * GiB,
                        .cgroup_limit_bytes = UINT64_MAX};
    kvd_sizing_req_t r = {.pool_size_bytes = 1 * GiB,
                          .reserve_bytes = 13 * GiB,
                          .object_bytes = 1 * MiB,
                          .align_bytes = 4096};
    check_advice_works(&h, &r);
}

static void test_room_under_one_percent_of_limit(void **state)
{
    (void)state;
    /* 16 GiB host, 1 GiB + 100 MiB available, 1 GiB reserve: a 100 MiB
     * pool fits, and (1 GiB + 100 MiB) / 16 GiB = 0.0686 */
    kvd_host_mem_t h = {.mem_total_bytes = 16 * GiB,
                        .mem_available_bytes = 1 * GiB + 100 * MiB,
                        .cgroup_limit_bytes = UINT64_MAX};
    kvd_sizing_req_t r = {.pool_size_bytes = 200 * MiB,
                          .reserve_bytes = 1 * GiB,
                          .object_bytes = 1 * MiB,
                          .align_bytes = 4096};
    check_advice_works(&h, &r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reserve_larger_than_room),
        cmocka_unit_test(test_room_under_one_percent_of_limit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
