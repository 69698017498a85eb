/*
 * Description: when the store engine answers NO_SPACE, and what that costs
 * the cache; and the quarantine of a dead writer's extent (kvd_store.h
 * "lifecycle"). In process, tiny pools of 4096-byte pages, watermarks off
 * (1.0) so that only on-demand eviction runs.
 *   (a) 256 one-page objects fill a 256-page pool; the 128 at even page
 *       offsets are pinned by one Acquire, so no two free pages can ever be
 *       adjacent: a Reserve of one 2-page object answers NO_SPACE after at
 *       most 64 + 4 * 2 evictions, never all 128 unpinned objects.
 *   (b) every object pinned: NO_SPACE with no eviction, free bytes as before.
 *   (c) free + evictable pages fewer than the object's: NO_SPACE with no
 *       eviction, free bytes as before.
 *   (d) the normal case: a full pool of unpinned objects makes room for a
 *       2-page object by eviction.
 *   Quarantine: a write lease ended by kvd_store_owner_gone keeps its extent
 *       (quarantined_bytes = its bytes, the key invisible and reservable
 *       again, at another offset, even when room has to be made by
 *       eviction); kvd_store_expire before the reservation's time + TTL
 *       keeps it, once the TTL (rounded up to the store's one-second clock)
 *       has passed frees it; kvd_store_check holds at every step.
 * Eviction counts are read from the stats before and after each Reserve.
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
#include "engine_util.h"

#define PAGE    4096u
#define OWNER_A 1u
#define OWNER_B 2u

/* ----------------------------------------------------------- helpers */

/* This file's keys: the counter in bytes 0..3, byte 31 0x5a, the rest zero. */
static void mkkey_tagged(uint8_t key[KVD_KEY_BYTES], uint32_t n)
{
    memset(key, 0, KVD_KEY_BYTES);
    memcpy(key, &n, sizeof(n));
    key[31] = 0x5a;
}

static kvd_store_t *mk_store(uint64_t pages)
{
    kvd_store_config_t cfg;
    kvd_store_config_default(&cfg, pages * PAGE);
    cfg.page_bytes = PAGE;
    cfg.evict_high = 1.0;
    cfg.evict_low = 1.0;
    kvd_store_t *s = NULL;
    assert_int_equal(kvd_store_create(&cfg, &s), KVD_OK);
    return s;
}

/* Reserves key k (depth 0, no parent) for owner at now_ms; returns the
 * result, the lease and the location through the pointers. */
static uint8_t reserve_at(kvd_store_t *s, uint64_t owner, uint32_t ns, uint32_t k,
                          uint64_t now_ms, uint64_t *lease, kvd_loc_t *loc)
{
    key_t32 key;
    mkkey_tagged(key, k);
    kvd_put_t item = {.key = key, .parent = NULL, .depth = 0};
    uint8_t res = 0xff;
    assert_int_equal(kvd_store_reserve(s, owner, ns, &item, 1, now_ms, lease, &res, loc),
                     KVD_OK);
    check_ok(s);
    return res;
}

/* Reserves and publishes key k; returns its location. */
static kvd_loc_t put_one(kvd_store_t *s, uint32_t ns, uint32_t k)
{
    uint64_t lease = 0;
    kvd_loc_t loc;
    assert_int_equal(reserve_at(s, OWNER_A, ns, k, 0, &lease, &loc),
                     KVD_RESERVE_ALLOCATED);
    assert_int_equal(kvd_store_publish(s, OWNER_A, lease, NULL, 0), KVD_OK);
    check_ok(s);
    return loc;
}

/* Pins the n keys k[] with one Acquire of OWNER_B; returns the lease. */
static uint64_t pin(kvd_store_t *s, uint32_t ns, const uint32_t *k, size_t n)
{
    key_t32 *keys = calloc(n, sizeof(key_t32));
    kvd_loc_t *locs = calloc(n, sizeof(kvd_loc_t));
    assert_non_null(keys);
    assert_non_null(locs);
    for (size_t i = 0; i < n; i++)
        mkkey_tagged(keys[i], k[i]);
    uint64_t lease = 0;
    size_t bad = SIZE_MAX;
    assert_int_equal(kvd_store_acquire(s, OWNER_B, ns,
                                       (const uint8_t(*)[KVD_KEY_BYTES])keys, n, 0,
                                       &lease, locs, &bad),
                     KVD_OK);
    check_ok(s);
    free(keys);
    free(locs);
    return lease;
}

static bool present(const kvd_store_t *s, uint32_t ns, uint32_t k)
{
    key_t32 key;
    kvd_obj_info_t info;
    mkkey_tagged(key, k);
    return kvd_store_inspect(s, ns, key, &info) == KVD_OK;
}

/* A Reserve of key k in ns that must answer NO_SPACE: no lease, the
 * NO_SPACE counter up by one; returns the evictions it cost. */
static uint64_t reserve_no_space(kvd_store_t *s, uint32_t ns, uint32_t k)
{
    kvd_store_stats_t before = stats(s);
    uint64_t lease = 99;
    kvd_loc_t loc;
    uint8_t res = reserve_at(s, OWNER_A, ns, k, 0, &lease, &loc);
    if (res != KVD_RESERVE_NO_SPACE)
        print_error("reserve answered %s, want no_space\n", reserve_result_name(res));
    assert_int_equal(res, KVD_RESERVE_NO_SPACE);
    assert_int_equal(lease, 0);
    kvd_store_stats_t after = stats(s);
    assert_int_equal(after.reserve_no_space, before.reserve_no_space + 1);
    assert_int_equal(after.leases, before.leases);
    assert_false(present(s, ns, k));
    return after.evictions - before.evictions;
}

/* ------------------------------------------------------------ no space */

#define FRAG_PAGES 256u

/* (a) Every other page pinned: eviction can never form a 2-page hole, so
 * the Reserve must give up within its budget instead of emptying the
 * cache. */
static void test_fragmented_gives_up_within_budget(void **state)
{
    (void)state;
    kvd_store_t *s = mk_store(FRAG_PAGES);
    uint32_t one = reg(s, "one", PAGE), two = reg(s, "two", 2 * PAGE);
    uint32_t pinned[FRAG_PAGES / 2];
    size_t n_pinned = 0;
    for (uint32_t k = 0; k < FRAG_PAGES; k++) {
        kvd_loc_t loc = put_one(s, one, k);
        assert_true(loc.offset % PAGE == 0 && loc.offset / PAGE < FRAG_PAGES);
        if (loc.offset / PAGE % 2 == 0)
            pinned[n_pinned++] = k;
    }
    assert_int_equal(n_pinned, FRAG_PAGES / 2); /* each page holds one object */
    kvd_store_stats_t st = stats(s);
    assert_int_equal(st.free_bytes, 0);
    assert_int_equal(st.evictions, 0);
    uint64_t r = pin(s, one, pinned, n_pinned);
    st = stats(s);
    assert_int_equal(st.objects_pinned, FRAG_PAGES / 2);

    uint64_t evicted = reserve_no_space(s, two, 1);
    uint64_t budget = 64 + 4 * 2;
    print_message("2-page reserve among %u pinned pages: no_space after %llu "
                  "evictions (budget %llu)\n",
                  FRAG_PAGES / 2, (unsigned long long)evicted,
                  (unsigned long long)budget);
    if (evicted > budget)
        print_error("%llu evictions for one 2-page reserve, the budget is %llu\n",
                    (unsigned long long)evicted, (unsigned long long)budget);
    assert_true(evicted <= budget);
    assert_true(evicted < FRAG_PAGES / 2);
    st = stats(s);
    assert_int_equal(st.objects_ready, FRAG_PAGES - evicted);
    assert_int_equal(st.free_bytes, evicted * PAGE);
    assert_int_equal(st.objects_pinned, FRAG_PAGES / 2);
    /* no hole of two pages was ever there to be found */
    assert_int_equal(st.largest_free_bytes, evicted ? PAGE : 0);

    /* every pinned object is still there */
    for (size_t i = 0; i < n_pinned; i++)
        assert_true(present(s, one, pinned[i]));

    /* a second attempt is bounded the same way, and the cache survives it */
    uint64_t evicted2 = reserve_no_space(s, two, 2);
    assert_true(evicted2 <= budget);
    assert_true(evicted + evicted2 <= FRAG_PAGES / 2);

    /* unpinned, the pool has room again */
    assert_int_equal(kvd_store_release(s, OWNER_B, r), KVD_OK);
    check_ok(s);
    uint64_t lease = 0;
    kvd_loc_t loc;
    assert_int_equal(reserve_at(s, OWNER_A, two, 3, 0, &lease, &loc),
                     KVD_RESERVE_ALLOCATED);
    assert_int_equal(kvd_store_publish(s, OWNER_A, lease, NULL, 0), KVD_OK);
    check_ok(s);
    kvd_store_destroy(s);
}

/* (b) Nothing evictable at all: NO_SPACE costs nothing. */
static void test_all_pinned_evicts_nothing(void **state)
{
    (void)state;
    kvd_store_t *s = mk_store(16);
    uint32_t one = reg(s, "one", PAGE), two = reg(s, "two", 2 * PAGE);
    uint32_t k[16];
    for (uint32_t i = 0; i < 16; i++) {
        put_one(s, one, i);
        k[i] = i;
    }
    pin(s, one, k, 16);
    kvd_store_stats_t before = stats(s);
    assert_int_equal(before.free_bytes, 0);
    assert_int_equal(reserve_no_space(s, one, 100), 0);
    assert_int_equal(reserve_no_space(s, two, 101), 0);
    kvd_store_stats_t after = stats(s);
    assert_int_equal(after.free_bytes, before.free_bytes);
    assert_int_equal(after.objects_ready, 16);
    assert_int_equal(after.evictions, 0);
    kvd_store_destroy(s);
}

/* (c) Free pages plus every evictable page are fewer than the object
 * needs: 3 free pages, 1 unpinned object, the rest pinned or being
 * written; a 5-page object cannot fit, so nothing is evicted for it. */
static void test_too_few_evictable_evicts_nothing(void **state)
{
    (void)state;
    kvd_store_t *s = mk_store(16);
    uint32_t one = reg(s, "one", PAGE), five = reg(s, "five", 5 * PAGE);
    uint32_t k[8];
    for (uint32_t i = 0; i < 9; i++) {
        put_one(s, one, i);
        if (i < 8)
            k[i] = i;
    }
    pin(s, one, k, 8); /* key 8 stays unpinned: the one evictable page */
    kvd_loc_t loc;
    for (uint32_t i = 20; i < 24; i++) { /* 4 pages being written */
        uint64_t l = 0;
        assert_int_equal(reserve_at(s, OWNER_A, one, i, 0, &l, &loc),
                         KVD_RESERVE_ALLOCATED);
    }
    kvd_store_stats_t before = stats(s);
    assert_int_equal(before.free_bytes, 3 * PAGE);
    assert_int_equal(before.objects_ready, 9);
    assert_int_equal(before.objects_pinned, 8);
    assert_int_equal(before.objects_writing, 4);

    assert_int_equal(reserve_no_space(s, five, 1), 0);
    kvd_store_stats_t after = stats(s);
    assert_int_equal(after.free_bytes, before.free_bytes);
    assert_int_equal(after.objects_ready, 9);
    assert_true(present(s, one, 8));

    /* the writers dying does not change the sum (their extents go to
     * quarantine, not to the free pages): still no room, nothing evicted */
    assert_int_equal(kvd_store_owner_gone(s, OWNER_A), 4);
    check_ok(s);
    assert_int_equal(stats(s).quarantined_bytes, 4 * PAGE);
    assert_int_equal(reserve_no_space(s, five, 2), 0);
    assert_true(present(s, one, 8));
    kvd_store_destroy(s);
}

/* (d) The normal case: a full pool of unpinned objects evicts for a
 * 2-page object and grants it. */
static void test_full_unpinned_pool_makes_room(void **state)
{
    (void)state;
    kvd_store_t *s = mk_store(16);
    uint32_t one = reg(s, "one", PAGE), two = reg(s, "two", 2 * PAGE);
    for (uint32_t i = 0; i < 16; i++)
        put_one(s, one, i);
    assert_int_equal(stats(s).free_bytes, 0);
    uint64_t lease = 0;
    kvd_loc_t loc;
    assert_int_equal(reserve_at(s, OWNER_A, two, 1, 0, &lease, &loc),
                     KVD_RESERVE_ALLOCATED);
    assert_true(lease != 0);
    assert_int_equal(loc.size, 2 * PAGE);
    assert_true(loc.offset % PAGE == 0 && loc.offset + loc.size <= 16 * PAGE);
    kvd_store_stats_t st = stats(s);
    assert_true(st.evictions >= 2 && st.evictions <= 64 + 4 * 2);
    assert_int_equal(st.objects_ready, 16 - st.evictions);
    assert_int_equal(kvd_store_publish(s, OWNER_A, lease, NULL, 0), KVD_OK);
    check_ok(s);
    assert_true(present(s, two, 1));
    kvd_store_destroy(s);
}

/* ---------------------------------------------------------- quarantine */

#define TTL_MS 30000u
#define T0_MS  1000u

static void test_quarantine_of_a_dead_writer(void **state)
{
    (void)state;
    kvd_store_config_t cfg;
    kvd_store_config_default(&cfg, 2 * PAGE);
    cfg.page_bytes = PAGE;
    cfg.evict_high = cfg.evict_low = 1.0;
    cfg.lease_ttl_ms = TTL_MS;
    kvd_store_t *s = NULL;
    assert_int_equal(kvd_store_create(&cfg, &s), KVD_OK);
    uint32_t ns = reg(s, "one", PAGE);

    /* A reserves K and dies while (perhaps) still copying into it */
    uint64_t la = 0;
    kvd_loc_t dead;
    assert_int_equal(reserve_at(s, OWNER_A, ns, 7, T0_MS, &la, &dead),
                     KVD_RESERVE_ALLOCATED);
    assert_int_equal(kvd_store_owner_gone(s, OWNER_A), 1);
    check_ok(s);
    kvd_store_stats_t st = stats(s);
    assert_int_equal(st.quarantined_bytes, PAGE);
    assert_int_equal(st.free_bytes, PAGE);
    assert_int_equal(st.writing_bytes, 0);
    assert_int_equal(st.objects_writing, 0);
    assert_int_equal(st.leases, 0);
    assert_false(present(s, ns, 7));
    assert_int_equal(kvd_store_publish(s, OWNER_A, la, NULL, 0), KVD_ERR_NOT_FOUND);

    /* the key is free to reserve again, never at the dead writer's extent */
    uint64_t lb = 0;
    kvd_loc_t again;
    assert_int_equal(reserve_at(s, OWNER_B, ns, 7, T0_MS, &lb, &again),
                     KVD_RESERVE_ALLOCATED);
    assert_true(again.offset != dead.offset);
    assert_int_equal(kvd_store_publish(s, OWNER_B, lb, NULL, 0), KVD_OK);
    check_ok(s);

    /* under pressure too: room is made by eviction, not from quarantine */
    kvd_loc_t other;
    assert_int_equal(reserve_at(s, OWNER_B, ns, 8, T0_MS, &lb, &other),
                     KVD_RESERVE_ALLOCATED);
    assert_true(other.offset != dead.offset);
    assert_int_equal(stats(s).evictions, 1);
    assert_false(present(s, ns, 7));
    assert_int_equal(kvd_store_publish(s, OWNER_B, lb, NULL, 0), KVD_OK);
    check_ok(s);

    /* just before the grace is over: still held */
    assert_int_equal(kvd_store_expire(s, T0_MS + TTL_MS - 1), 0);
    check_ok(s);
    st = stats(s);
    assert_int_equal(st.quarantined_bytes, PAGE);
    assert_int_equal(st.free_bytes, 0);

    /* past it (the store keeps release times in whole seconds, rounded
     * up): freed */
    assert_int_equal(kvd_store_expire(s, T0_MS + TTL_MS + 1000), 0);
    check_ok(s);
    st = stats(s);
    assert_int_equal(st.quarantined_bytes, 0);
    assert_int_equal(st.free_bytes, PAGE);
    assert_int_equal(st.objects_ready, 1);
    assert_int_equal(st.evictions, 1);

    /* and reusable: the next object takes that page without evicting */
    uint64_t lc = 0;
    kvd_loc_t reused;
    assert_int_equal(reserve_at(s, OWNER_B, ns, 9, T0_MS + TTL_MS + 1000, &lc, &reused),
                     KVD_RESERVE_ALLOCATED);
    assert_true(reused.offset == dead.offset);
    assert_int_equal(stats(s).evictions, 1);
    assert_int_equal(kvd_store_revoke(s, OWNER_B, lc, NULL, 0), KVD_OK);
    check_ok(s);
    assert_int_equal(stats(s).quarantined_bytes, 0); /* a revoke frees at once */
    assert_int_equal(stats(s).free_bytes, PAGE);
    kvd_store_destroy(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fragmented_gives_up_within_budget),
        cmocka_unit_test(test_all_pinned_evicts_nothing),
        cmocka_unit_test(test_too_few_evictable_evicts_nothing),
        cmocka_unit_test(test_full_unpinned_pool_makes_room),
        cmocka_unit_test(test_quarantine_of_a_dead_writer),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
