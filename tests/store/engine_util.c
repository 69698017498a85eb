/*
 * Description: helpers shared by the store engine tests; see
 * engine_util.h.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <string.h>

#include "engine_util.h"

void mkkey(uint8_t key[KVD_KEY_BYTES], uint32_t n)
{
    memset(key, 0, KVD_KEY_BYTES);
    memcpy(key, &n, sizeof(n));
}

void check_ok(const kvd_store_t *s)
{
    char why[256] = "";
    int rc = kvd_store_check(s, why, sizeof(why));
    if (rc != KVD_OK)
        print_error("kvd_store_check: %s\n", why);
    assert_int_equal(rc, KVD_OK);
}

kvd_store_stats_t stats(const kvd_store_t *s)
{
    kvd_store_stats_t st;
    kvd_store_stats(s, &st);
    return st;
}

uint32_t reg(kvd_store_t *s, const char *name, uint64_t bytes)
{
    uint32_t id = 12345;
    assert_int_equal(kvd_store_ns_register(s, KVD_TENANT_DEFAULT, KVD_OWNER_PERMANENT,
                                           name, bytes, false, &id),
                     KVD_OK);
    return id;
}

const char *reserve_result_name(kvd_reserve_result_t r)
{
    switch (r) {
    case KVD_RESERVE_ALLOCATED: return "allocated";
    case KVD_RESERVE_EXISTS: return "exists";
    case KVD_RESERVE_IN_FLIGHT: return "in_flight";
    case KVD_RESERVE_NO_SPACE: return "no_space";
    }
    return "?";
}
