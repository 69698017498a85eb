/*
 * Description: the object lifecycle of the store engine (kvd_store.h,
 * "engine"; DESIGN.md section 4), one transition per test: Reserve ->
 * WRITING -> Publish -> READY <-> pinned, Revoke, Release, the end of a
 * lease by its owner going away or by its TTL, and namespaces.
 *
 * Every invalid call must return its typed error and change nothing: the
 * tests compare the state figures of kvd_store_stats before and after and
 * run kvd_store_check after every step. Expectations are worked out by hand
 * from the contracts, never read back from the engine.
 *
 * The engine does bookkeeping only, so a tiny pool (64 pages of 4 KiB) and
 * hand-made keys (key[0..3] = a counter, the rest zero) are enough.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "kvd_store.h"
#include "engine_util.h"

#define PAGE      4096u
#define POOL_PGS  64u
#define POOL      ((uint64_t)POOL_PGS * PAGE)
#define OBJ_KV    5000u /* two pages, not a page multiple */
#define OBJ_KV_PG 2u
#define OWNER_A   11u
#define OWNER_B   22u
#define NO_LEASE  987654321u

/* ----------------------------------------------------------- helpers */

static kvd_store_t *mk_store(uint64_t ttl_ms)
{
    kvd_store_config_t cfg;
    kvd_store_config_default(&cfg, POOL);
    cfg.evict_high = 1.0; /* no watermark eviction in these tests */
    cfg.evict_low = 1.0;
    cfg.lease_ttl_ms = ttl_ms;
    kvd_store_t *s = NULL;
    assert_int_equal(kvd_store_create(&cfg, &s), KVD_OK);
    assert_non_null(s);
    return s;
}

/* The figures that describe the state (not the call counters). */
static void assert_same_state(const kvd_store_stats_t *a, const kvd_store_stats_t *b)
{
    assert_int_equal(a->pool_bytes, b->pool_bytes);
    assert_int_equal(a->free_bytes, b->free_bytes);
    assert_int_equal(a->writing_bytes, b->writing_bytes);
    assert_int_equal(a->ready_bytes, b->ready_bytes);
    assert_int_equal(a->pinned_bytes, b->pinned_bytes);
    assert_int_equal(a->objects_ready, b->objects_ready);
    assert_int_equal(a->objects_writing, b->objects_writing);
    assert_int_equal(a->objects_pinned, b->objects_pinned);
    assert_int_equal(a->pins, b->pins);
    assert_int_equal(a->leases, b->leases);
    assert_int_equal(a->free_extents, b->free_extents);
    assert_int_equal(a->largest_free_bytes, b->largest_free_bytes);
    assert_int_equal(a->evictions, b->evictions);
}

/* Reserves keys k[0..n) of ns for owner; results and locs out. */
static uint64_t reserve_keys(kvd_store_t *s, uint64_t owner, uint32_t ns,
                             const uint32_t *k, size_t n, uint64_t now, uint8_t *res,
                             kvd_loc_t *locs)
{
    key_t32 keys[16];
    kvd_put_t items[16];
    assert_true(n <= 16);
    for (size_t i = 0; i < n; i++) {
        mkkey(keys[i], k[i]);
        items[i] = (kvd_put_t){.key = keys[i], .parent = NULL, .depth = 0};
    }
    uint64_t lease = 777;
    assert_int_equal(kvd_store_reserve(s, owner, ns, items, n, now, &lease, res, locs),
                     KVD_OK);
    check_ok(s);
    return lease;
}

/* Reserves one key, expecting ALLOCATED; returns its write lease. */
static uint64_t reserve_one(kvd_store_t *s, uint64_t owner, uint32_t ns, uint32_t k,
                            uint64_t now)
{
    uint8_t res;
    kvd_loc_t loc;
    uint64_t lease = reserve_keys(s, owner, ns, &k, 1, now, &res, &loc);
    assert_int_equal(res, KVD_RESERVE_ALLOCATED);
    assert_true(lease != 0);
    return lease;
}

static int publish_keys(kvd_store_t *s, uint64_t owner, uint64_t lease, const uint32_t *k,
                        size_t n)
{
    key_t32 keys[16];
    assert_true(n <= 16);
    for (size_t i = 0; i < n; i++)
        mkkey(keys[i], k[i]);
    int rc = kvd_store_publish(s, owner, lease, (const uint8_t(*)[KVD_KEY_BYTES])keys, n);
    check_ok(s);
    return rc;
}

static int revoke_keys(kvd_store_t *s, uint64_t owner, uint64_t lease, const uint32_t *k,
                       size_t n)
{
    key_t32 keys[16];
    assert_true(n <= 16);
    for (size_t i = 0; i < n; i++)
        mkkey(keys[i], k[i]);
    int rc = kvd_store_revoke(s, owner, lease, (const uint8_t(*)[KVD_KEY_BYTES])keys, n);
    check_ok(s);
    return rc;
}

/* Reserves and publishes one key: a READY object. */
static void put_ready(kvd_store_t *s, uint64_t owner, uint32_t ns, uint32_t k)
{
    uint64_t lease = reserve_one(s, owner, ns, k, 0);
    assert_int_equal(kvd_store_publish(s, owner, lease, NULL, 0), KVD_OK);
    check_ok(s);
}

static int acquire_keys(kvd_store_t *s, uint64_t owner, uint32_t ns, const uint32_t *k,
                        size_t n, uint64_t now, uint64_t *lease, kvd_loc_t *locs,
                        size_t *first_bad)
{
    key_t32 keys[16];
    assert_true(n <= 16);
    for (size_t i = 0; i < n; i++)
        mkkey(keys[i], k[i]);
    int rc = kvd_store_acquire(s, owner, ns, (const uint8_t(*)[KVD_KEY_BYTES])keys, n,
                               now, lease, locs, first_bad);
    check_ok(s);
    return rc;
}

/* KVD_OK and the state, or KVD_ERR_NOT_FOUND. */
static int state_of(const kvd_store_t *s, uint32_t ns, uint32_t k, kvd_obj_info_t *info)
{
    key_t32 key;
    mkkey(key, k);
    kvd_obj_info_t tmp;
    return kvd_store_inspect(s, ns, key, info ? info : &tmp);
}

static void assert_state(const kvd_store_t *s, uint32_t ns, uint32_t k, int want)
{
    kvd_obj_info_t info;
    int rc = state_of(s, ns, k, &info);
    if (want == 0) {
        assert_int_equal(rc, KVD_ERR_NOT_FOUND);
        return;
    }
    assert_int_equal(rc, KVD_OK);
    assert_int_equal(info.state, want);
}

static uint32_t pins_of(const kvd_store_t *s, uint32_t ns, uint32_t k)
{
    kvd_obj_info_t info;
    assert_int_equal(state_of(s, ns, k, &info), KVD_OK);
    return info.pins;
}

/* Boundaries of an ALL_PAGES lookup over keys k[0..n). */
static size_t lookup_all(kvd_store_t *s, uint32_t ns, const uint32_t *k, size_t n)
{
    key_t32 keys[16];
    uint32_t b[16];
    for (size_t i = 0; i < n; i++)
        mkkey(keys[i], k[i]);
    kvd_lookup_pool_t p = {.ns = ns,
                           .keys = (const uint8_t(*)[KVD_KEY_BYTES])keys,
                           .n_keys = n,
                           .trailing_pages = 0};
    size_t nb = 99;
    assert_int_equal(kvd_store_lookup(s, &p, 1, b, &nb), KVD_OK);
    return nb;
}

/* ------------------------------------------------------------- tests */

static void test_fresh_store(void **state)
{
    (void)state;
    kvd_store_t *s = mk_store(30000);
    kvd_store_stats_t st = stats(s);
    assert_int_equal(st.pool_bytes, POOL);
    assert_int_equal(st.free_bytes, POOL);
    assert_int_equal(st.writing_bytes + st.ready_bytes + st.pinned_bytes, 0);
    assert_int_equal(st.leases, 0);
    assert_int_equal(st.pins, 0);
    assert_int_equal(st.free_extents, 1);
    assert_int_equal(st.largest_free_bytes, POOL);
    assert_true(st.fragmentation == 0.0);
    assert_int_equal(kvd_store_ns_count(s), 0);
    check_ok(s);
    kvd_store_destroy(s);
}

/* Reserve: ALLOCATED, each loc page aligned, inside the pool, of the object
 * size, no two overlapping; the objects are WRITING under one lease. */
static void test_reserve_allocates(void **state)
{
    (void)state;
    kvd_store_t *s = mk_store(30000);
    uint32_t ns = reg(s, "model/kv/tp0", OBJ_KV);
    key_t32 keys[3], parent;
    mkkey(parent, 500);
    kvd_put_t items[3];
    for (uint32_t i = 0; i < 3; i++) {
        mkkey(keys[i], 1 + i);
        items[i] = (kvd_put_t){
            .key = keys[i], .parent = i ? keys[i - 1] : parent, .depth = 4 + i};
    }
    uint8_t res[3];
    kvd_loc_t locs[3];
    uint64_t lease = 0;
    assert_int_equal(kvd_store_reserve(s, OWNER_A, ns, items, 3, 0, &lease, res, locs),
                     KVD_OK);
    check_ok(s);
    assert_true(lease != 0);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(res[i], KVD_RESERVE_ALLOCATED);
        assert_int_equal(locs[i].offset % PAGE, 0);
        assert_int_equal(locs[i].size, OBJ_KV);
        assert_true(locs[i].offset + OBJ_KV_PG * PAGE <= POOL);
        for (int j = 0; j < i; j++) /* the two-page extents are disjoint */
            assert_true(locs[i].offset + OBJ_KV_PG * PAGE <= locs[j].offset ||
                        locs[j].offset + OBJ_KV_PG * PAGE <= locs[i].offset);
        kvd_obj_info_t info;
        assert_int_equal(kvd_store_inspect(s, ns, keys[i], &info), KVD_OK);
        assert_int_equal(info.state, KVD_OBJ_WRITING);
        assert_int_equal(info.pins, 0);
        assert_int_equal(info.ns, ns);
        assert_int_equal(info.depth, 4 + i);
        assert_true(info.has_parent);
        uint8_t tag[KVD_KEY_TAG_BYTES];
        kvd_store_key_tag(s, i ? keys[i - 1] : parent, tag);
        assert_memory_equal(info.parent_tag, tag, KVD_KEY_TAG_BYTES);
        assert_int_equal(info.loc.offset, locs[i].offset);
        assert_int_equal(info.loc.size, OBJ_KV);
    }
    kvd_store_stats_t st = stats(s);
    assert_int_equal(st.free_bytes, POOL - 3 * OBJ_KV_PG * PAGE);
    assert_int_equal(st.writing_bytes, 3 * OBJ_KV_PG * PAGE);
    assert_int_equal(st.ready_bytes, 0);
    assert_int_equal(st.objects_writing, 3);
    assert_int_equal(st.leases, 1);
    assert_int_equal(st.reserve_allocated, 3);
    assert_int_equal(
        st.free_bytes + st.writing_bytes + st.ready_bytes + st.quarantined_bytes, POOL);
    kvd_ns_info_t ni;
    assert_int_equal(kvd_store_ns_info(s, ns, &ni), KVD_OK);
    assert_int_equal(ni.objects_writing, 3);
    assert_int_equal(ni.objects_ready, 0);
    /* a WRITING object is invisible to readers */
    uint32_t k[3] = {1, 2, 3};
    assert_int_equal(lookup_all(s, ns, k, 3), 0);
    kvd_store_destroy(s);
}

/* The same key again: IN_FLIGHT while WRITING (for any owner), EXISTS once
 * published; neither creates a lease or changes the state. */
static void test_reserve_same_key(void **state)
{
    (void)state;
    kvd_store_t *s = mk_store(30000);
    uint32_t ns = reg(s, "kv", PAGE);
    uint64_t la = reserve_one(s, OWNER_A, ns, 1, 0);

    kvd_store_stats_t before = stats(s);
    uint8_t res[2];
    kvd_loc_t locs[2];
    uint32_t one = 1;
    assert_int_equal(reserve_keys(s, OWNER_B, ns, &one, 1, 0, res, locs), 0);
    assert_int_equal(res[0], KVD_RESERVE_IN_FLIGHT);
    assert_int_equal(reserve_keys(s, OWNER_A, ns, &one, 1, 0, res, locs), 0);
    assert_int_equal(res[0], KVD_RESERVE_IN_FLIGHT);
    kvd_store_stats_t after = stats(s);
    assert_same_state(&before, &after);
    assert_int_equal(after.reserve_in_flight, 2);

    /* mixed batch: the new key is allocated into a new lease of B */
    uint32_t mixed[2] = {1, 2};
    uint64_t lb = reserve_keys(s, OWNER_B, ns, mixed, 2, 0, res, locs);
    assert_int_equal(res[0], KVD_RESERVE_IN_FLIGHT);
    assert_int_equal(res[1], KVD_RESERVE_ALLOCATED);
    assert_true(lb != 0 && lb != la);
    assert_int_equal(stats(s).leases, 2);

    assert_int_equal(kvd_store_publish(s, OWNER_A, la, NULL, 0), KVD_OK);
    check_ok(s);
    assert_state(s, ns, 1, KVD_OBJ_READY);
    before = stats(s);
    assert_int_equal(reserve_keys(s, OWNER_B, ns, &one, 1, 0, res, locs), 0);
    assert_int_equal(res[0], KVD_RESERVE_EXISTS);
    after = stats(s);
    assert_same_state(&before, &after);
    assert_int_equal(after.reserve_exists, 1);
    assert_state(s, ns, 1, KVD_OBJ_READY);
    kvd_store_destroy(s);
}

/* Publish/Revoke of an unknown lease, of another owner's, of a read lease:
 * NOT_FOUND, PERMISSION, STATE, and nothing changes. */
static void test_publish_errors(void **state)
{
    (void)state;
    kvd_store_t *s = mk_store(30000);
    uint32_t ns = reg(s, "kv", PAGE);
    put_ready(s, OWNER_A, ns, 9);
    uint32_t k[2] = {1, 2};
    uint8_t res[2];
    kvd_loc_t locs[2];
    uint64_t w = reserve_keys(s, OWNER_A, ns, k, 2, 0, res, locs);
    assert_true(w != 0);
    uint64_t r = 0;
    size_t bad = 99;
    uint32_t nine = 9;
    assert_int_equal(acquire_keys(s, OWNER_A, ns, &nine, 1, 0, &r, locs, &bad), KVD_OK);
    assert_true(r != 0 && r != w);

    kvd_store_stats_t before = stats(s);
    assert_int_equal(kvd_store_publish(s, OWNER_A, NO_LEASE, NULL, 0), KVD_ERR_NOT_FOUND);
    assert_int_equal(kvd_store_publish(s, OWNER_A, 0, NULL, 0), KVD_ERR_NOT_FOUND);
    assert_int_equal(kvd_store_revoke(s, OWNER_A, NO_LEASE, NULL, 0), KVD_ERR_NOT_FOUND);
    assert_int_equal(kvd_store_publish(s, OWNER_B, w, NULL, 0), KVD_ERR_NOT_FOUND);
    assert_int_equal(publish_keys(s, OWNER_B, w, k, 1), KVD_ERR_NOT_FOUND);
    assert_int_equal(kvd_store_revoke(s, OWNER_B, w, NULL, 0), KVD_ERR_NOT_FOUND);
    assert_int_equal(kvd_store_publish(s, OWNER_A, r, NULL, 0), KVD_ERR_STATE);
    assert_int_equal(kvd_store_revoke(s, OWNER_A, r, NULL, 0), KVD_ERR_STATE);
    check_ok(s);
    kvd_store_stats_t after = stats(s);
    assert_same_state(&before, &after);
    assert_state(s, ns, 1, KVD_OBJ_WRITING);
    assert_state(s, ns, 2, KVD_OBJ_WRITING);
    assert_int_equal(pins_of(s, ns, 9), 1);

    /* the right owner still can */
    assert_int_equal(kvd_store_publish(s, OWNER_A, w, NULL, 0), KVD_OK);
    check_ok(s);
    assert_state(s, ns, 1, KVD_OBJ_READY);
    assert_state(s, ns, 2, KVD_OBJ_READY);
    kvd_store_destroy(s);
}

/* Publish/Revoke naming a key that is not a reservation of the lease (an
 * absent key, a key of another lease, a READY key): KVD_ERR_STATE and
 * nothing is published, not even the lease's own keys of that call. */
static void test_publish_key_not_in_lease(void **state)
{
    (void)state;
    kvd_store_t *s = mk_store(30000);
    uint32_t ns = reg(s, "kv", PAGE);
    put_ready(s, OWNER_A, ns, 50);
    uint32_t mine[3] = {1, 2, 3};
    uint8_t res[3];
    kvd_loc_t locs[3];
    uint64_t w = reserve_keys(s, OWNER_A, ns, mine, 3, 0, res, locs);
    uint64_t w2 = reserve_one(s, OWNER_B, ns, 4, 0);
    uint64_t w3 = reserve_one(s, OWNER_A, ns, 5, 0); /* same owner, other lease */

    kvd_store_stats_t before = stats(s);
    uint32_t other_lease[2] = {1, 4};
    uint32_t absent[2] = {2, 99};
    uint32_t own_other[2] = {3, 5};
    uint32_t ready[2] = {1, 50};
    assert_int_equal(publish_keys(s, OWNER_A, w, other_lease, 2), KVD_ERR_STATE);
    assert_int_equal(publish_keys(s, OWNER_A, w, absent, 2), KVD_ERR_STATE);
    assert_int_equal(publish_keys(s, OWNER_A, w, own_other, 2), KVD_ERR_STATE);
    assert_int_equal(publish_keys(s, OWNER_A, w, ready, 2), KVD_ERR_STATE);
    assert_int_equal(revoke_keys(s, OWNER_A, w, other_lease, 2), KVD_ERR_STATE);
    assert_int_equal(revoke_keys(s, OWNER_A, w, absent, 2), KVD_ERR_STATE);
    kvd_store_stats_t after = stats(s);
    assert_same_state(&before, &after);
    assert_int_equal(after.published_bytes, before.published_bytes);
    for (uint32_t i = 1; i <= 5; i++)
        assert_state(s, ns, i, KVD_OBJ_WRITING);
    /* invisible to acquire and lookup */
    uint64_t r = 0;
    size_t bad = 99;
    assert_int_equal(acquire_keys(s, OWNER_A, ns, mine, 1, 0, &r, locs, &bad),
                     KVD_ERR_BUSY);
    assert_int_equal(bad, 0);
    assert_int_equal(lookup_all(s, ns, mine, 3), 0);

    assert_int_equal(kvd_store_publish(s, OWNER_B, w2, NULL, 0), KVD_OK);
    assert_int_equal(kvd_store_publish(s, OWNER_A, w3, NULL, 0), KVD_OK);
    assert_int_equal(kvd_store_publish(s, OWNER_A, w, NULL, 0), KVD_OK);
    check_ok(s);
    assert_int_equal(lookup_all(s, ns, mine, 3), 3);
    kvd_store_destroy(s);
}

/* A subset, then the rest: the lease lives until it holds nothing. */
static void test_publish_partial(void **state)
{
    (void)state;
    kvd_store_t *s = mk_store(30000);
    uint32_t ns = reg(s, "kv", PAGE);
    uint32_t k[3] = {1, 2, 3};
    uint8_t res[3];
    kvd_loc_t locs[3];
    uint64_t w = reserve_keys(s, OWNER_A, ns, k, 3, 0, res, locs);

    uint32_t two = 2;
    assert_int_equal(publish_keys(s, OWNER_A, w, &two, 1), KVD_OK);
    assert_state(s, ns, 1, KVD_OBJ_WRITING);
    assert_state(s, ns, 2, KVD_OBJ_READY);
    assert_state(s, ns, 3, KVD_OBJ_WRITING);
    kvd_store_stats_t st = stats(s);
    assert_int_equal(st.leases, 1);
    assert_int_equal(st.objects_ready, 1);
    assert_int_equal(st.objects_writing, 2);
    assert_int_equal(st.ready_bytes, PAGE);
    assert_int_equal(st.writing_bytes, 2 * PAGE);
    assert_int_equal(st.published_bytes, PAGE);
    /* key 2 is no longer a reservation of the lease */
    assert_int_equal(publish_keys(s, OWNER_A, w, &two, 1), KVD_ERR_STATE);
    assert_int_equal(revoke_keys(s, OWNER_A, w, &two, 1), KVD_ERR_STATE);
    assert_state(s, ns, 2, KVD_OBJ_READY);
    uint32_t ks[3] = {2, 1, 2};
    assert_int_equal(lookup_all(s, ns, ks, 1), 1);

    /* the rest (keys == NULL) */
    assert_int_equal(kvd_store_publish(s, OWNER_A, w, NULL, 0), KVD_OK);
    check_ok(s);
    for (uint32_t i = 1; i <= 3; i++)
        assert_state(s, ns, i, KVD_OBJ_READY);
    st = stats(s);
    assert_int_equal(st.leases, 0);
    assert_int_equal(st.objects_ready, 3);
    assert_int_equal(st.objects_writing, 0);
    assert_int_equal(st.published_bytes, 3 * PAGE);
    assert_int_equal(kvd_store_publish(s, OWNER_A, w, NULL, 0), KVD_ERR_NOT_FOUND);

    /* the last keys by name end the lease too */
    uint32_t k2[2] = {7, 8};
    w = reserve_keys(s, OWNER_A, ns, k2, 2, 0, res, locs);
    assert_int_equal(publish_keys(s, OWNER_A, w, &k2[1], 1), KVD_OK);
    assert_int_equal(stats(s).leases, 1);
    assert_int_equal(publish_keys(s, OWNER_A, w, &k2[0], 1), KVD_OK);
    assert_int_equal(stats(s).leases, 0);
    assert_int_equal(kvd_store_revoke(s, OWNER_A, w, NULL, 0), KVD_ERR_NOT_FOUND);
    kvd_store_destroy(s);
}

/* Revoke frees: the bytes come back, the key is absent and can be
 * reserved again, extents merge back into one. */
static void test_revoke_frees(void **state)
{
    (void)state;
    kvd_store_t *s = mk_store(30000);
    uint32_t ns = reg(s, "kv", OBJ_KV);
    uint32_t k[3] = {1, 2, 3};
    uint8_t res[3];
    kvd_loc_t locs[3];
    uint64_t w = reserve_keys(s, OWNER_A, ns, k, 3, 0, res, locs);
    assert_int_equal(stats(s).free_bytes, POOL - 3 * OBJ_KV_PG * PAGE);

    assert_int_equal(revoke_keys(s, OWNER_A, w, &k[1], 1), KVD_OK);
    assert_state(s, ns, 2, 0);
    assert_state(s, ns, 1, KVD_OBJ_WRITING);
    kvd_store_stats_t st = stats(s);
    assert_int_equal(st.free_bytes, POOL - 2 * OBJ_KV_PG * PAGE);
    assert_int_equal(st.writing_bytes, 2 * OBJ_KV_PG * PAGE);
    assert_int_equal(st.leases, 1);
    assert_int_equal(st.objects_writing, 2);

    /* the revoked key is free to be written by anyone */
    uint64_t wb = reserve_one(s, OWNER_B, ns, 2, 0);

    assert_int_equal(kvd_store_revoke(s, OWNER_A, w, NULL, 0), KVD_OK);
    check_ok(s);
    assert_state(s, ns, 1, 0);
    assert_state(s, ns, 3, 0);
    assert_int_equal(stats(s).leases, 1);
    assert_int_equal(kvd_store_revoke(s, OWNER_A, w, NULL, 0), KVD_ERR_NOT_FOUND);
    assert_int_equal(kvd_store_revoke(s, OWNER_B, wb, NULL, 0), KVD_OK);
    check_ok(s);
    st = stats(s);
    assert_int_equal(st.free_bytes, POOL);
    assert_int_equal(st.writing_bytes, 0);
    assert_int_equal(st.objects_writing, 0);
    assert_int_equal(st.leases, 0);
    assert_int_equal(st.free_extents, 1);
    assert_int_equal(st.largest_free_bytes, POOL);
    assert_int_equal(st.published_bytes, 0);
    kvd_ns_info_t ni;
    assert_int_equal(kvd_store_ns_info(s, ns, &ni), KVD_OK);
    assert_int_equal(ni.objects_writing, 0);
    kvd_store_destroy(s);
}

/* Acquire is all or nothing: the first key that is still being written
 * (BUSY) or missing (NOT_FOUND) is named, and no pin is taken. */
static void test_acquire_all_or_nothing(void **state)
{
    (void)state;
    kvd_store_t *s = mk_store(30000);
    uint32_t ns = reg(s, "kv", PAGE);
    put_ready(s, OWNER_B, ns, 1);
    put_ready(s, OWNER_B, ns, 2);
    reserve_one(s, OWNER_B, ns, 3, 0); /* WRITING */

    kvd_store_stats_t before = stats(s);
    uint64_t r = 55;
    size_t bad = 99;
    kvd_loc_t locs[4];
    uint32_t busy[4] = {1, 2, 3, 4};
    assert_int_equal(acquire_keys(s, OWNER_A, ns, busy, 4, 0, &r, locs, &bad),
                     KVD_ERR_BUSY);
    assert_int_equal(bad, 2);
    uint32_t missing[3] = {1, 4, 3};
    assert_int_equal(acquire_keys(s, OWNER_A, ns, missing, 3, 0, &r, locs, &bad),
                     KVD_ERR_NOT_FOUND);
    assert_int_equal(bad, 1);
    uint32_t first[2] = {4, 1};
    assert_int_equal(acquire_keys(s, OWNER_A, ns, first, 2, 0, &r, locs, &bad),
                     KVD_ERR_NOT_FOUND);
    assert_int_equal(bad, 0);
    kvd_store_stats_t after = stats(s);
    assert_same_state(&before, &after);
    assert_int_equal(after.pins, 0);
    assert_int_equal(after.objects_pinned, 0);
    assert_int_equal(pins_of(s, ns, 1), 0);
    assert_int_equal(pins_of(s, ns, 2), 0);
    assert_int_equal(after.acquire_failures, 3);

    /* success: locs are where the objects are; one pin per named key */
    uint32_t ok[3] = {2, 1, 2};
    assert_int_equal(acquire_keys(s, OWNER_A, ns, ok, 3, 0, &r, locs, &bad), KVD_OK);
    assert_true(r != 0);
    for (int i = 0; i < 3; i++) {
        kvd_obj_info_t info;
        assert_int_equal(state_of(s, ns, ok[i], &info), KVD_OK);
        assert_int_equal(locs[i].offset, info.loc.offset);
        assert_int_equal(locs[i].size, PAGE);
    }
    assert_int_equal(pins_of(s, ns, 1), 1);
    assert_int_equal(pins_of(s, ns, 2), 2);
    kvd_store_stats_t st = stats(s);
    assert_int_equal(st.pins, 3);
    assert_int_equal(st.objects_pinned, 2);
    assert_int_equal(st.pinned_bytes, 2 * PAGE);
    assert_int_equal(st.objects_ready, 2);
    assert_int_equal(st.leases, before.leases + 1);
    assert_int_equal(st.acquired_bytes, 3 * PAGE);
    kvd_ns_info_t ni;
    kvd_store_ns_info(s, ns, &ni);
    assert_int_equal(ni.objects_pinned, 2);
    kvd_obj_info_t info;
    assert_int_equal(state_of(s, ns, 2, &info), KVD_OK);
    assert_int_equal(info.hits, 2);
    assert_int_equal(info.state, KVD_OBJ_READY);
    /* a pinned object cannot be evicted */
    key_t32 key;
    mkkey(key, 1);
    assert_int_equal(kvd_store_evict_key(s, ns, key), KVD_ERR_BUSY);
    assert_int_equal(kvd_store_release(s, OWNER_A, r), KVD_OK);
    check_ok(s);
    assert_int_equal(stats(s).pins, 0);
    kvd_store_destroy(s);
}

/* Release: once (then NOT_FOUND), by its owner only, of a read lease only. */
static void test_release(void **state)
{
    (void)state;
    kvd_store_t *s = mk_store(30000);
    uint32_t ns = reg(s, "kv", PAGE);
    put_ready(s, OWNER_B, ns, 1);
    uint64_t w = reserve_one(s, OWNER_A, ns, 2, 0);
    uint64_t r = 0;
    size_t bad;
    kvd_loc_t loc;
    uint32_t one = 1;
    assert_int_equal(acquire_keys(s, OWNER_A, ns, &one, 1, 0, &r, &loc, &bad), KVD_OK);

    kvd_store_stats_t before = stats(s);
    assert_int_equal(kvd_store_release(s, OWNER_B, r), KVD_ERR_NOT_FOUND);
    assert_int_equal(kvd_store_release(s, OWNER_A, w), KVD_ERR_STATE);
    assert_int_equal(kvd_store_release(s, OWNER_A, NO_LEASE), KVD_ERR_NOT_FOUND);
    check_ok(s);
    kvd_store_stats_t after = stats(s);
    assert_same_state(&before, &after);
    assert_int_equal(pins_of(s, ns, 1), 1);
    assert_state(s, ns, 2, KVD_OBJ_WRITING);

    assert_int_equal(kvd_store_release(s, OWNER_A, r), KVD_OK);
    check_ok(s);
    assert_int_equal(pins_of(s, ns, 1), 0);
    before = stats(s);
    assert_int_equal(before.pins, 0);
    assert_int_equal(before.objects_pinned, 0);
    assert_int_equal(kvd_store_release(s, OWNER_A, r), KVD_ERR_NOT_FOUND);
    after = stats(s);
    assert_same_state(&before, &after);
    /* unpinned, it can be evicted again */
    key_t32 key;
    mkkey(key, 1);
    assert_int_equal(kvd_store_evict_key(s, ns, key), KVD_OK);
    check_ok(s);
    kvd_store_destroy(s);
}

/* An unknown namespace id is NOT_FOUND everywhere and changes nothing. */
static void test_unknown_namespace(void **state)
{
    (void)state;
    kvd_store_t *s = mk_store(30000);
    uint32_t ns = reg(s, "kv", PAGE);
    assert_int_equal(ns, 0);
    put_ready(s, OWNER_A, ns, 1);
    kvd_store_stats_t before = stats(s);
    const uint32_t bad_ids[2] = {1, 4096};
    for (int b = 0; b < 2; b++) {
        uint32_t bad_ns = bad_ids[b];
        key_t32 key;
        mkkey(key, 1);
        kvd_put_t item = {.key = key};
        uint8_t res = 0xee;
        kvd_loc_t loc;
        uint64_t lease = 0;
        assert_int_equal(
            kvd_store_reserve(s, OWNER_A, bad_ns, &item, 1, 0, &lease, &res, &loc),
            KVD_ERR_NOT_FOUND);
        size_t first_bad;
        assert_int_equal(kvd_store_acquire(s, OWNER_A, bad_ns,
                                           (const uint8_t(*)[KVD_KEY_BYTES]) & key, 1, 0,
                                           &lease, &loc, &first_bad),
                         KVD_ERR_NOT_FOUND);
        kvd_obj_info_t info;
        assert_int_equal(kvd_store_inspect(s, bad_ns, key, &info), KVD_ERR_NOT_FOUND);
        assert_int_equal(kvd_store_find_tag(s, bad_ns, key, &info), KVD_ERR_NOT_FOUND);
        assert_int_equal(kvd_store_evict_key(s, bad_ns, key), KVD_ERR_NOT_FOUND);
        uint64_t ev = 0, sk = 0;
        assert_int_equal(kvd_store_evict_ns(s, bad_ns, &ev, &sk), KVD_ERR_NOT_FOUND);
        kvd_ns_info_t ni;
        assert_int_equal(kvd_store_ns_info(s, bad_ns, &ni), KVD_ERR_NOT_FOUND);
        kvd_lookup_pool_t pools[2] = {
            {.ns = ns, .keys = (const uint8_t(*)[KVD_KEY_BYTES]) & key, .n_keys = 1},
            {.ns = bad_ns, .keys = (const uint8_t(*)[KVD_KEY_BYTES]) & key, .n_keys = 1}};
        uint32_t bnd[1];
        size_t nb;
        assert_int_equal(kvd_store_lookup(s, pools, 2, bnd, &nb), KVD_ERR_NOT_FOUND);
        check_ok(s);
    }
    kvd_store_stats_t after = stats(s);
    assert_same_state(&before, &after);
    assert_state(s, ns, 1, KVD_OBJ_READY);
    assert_int_equal(kvd_store_ns_count(s), 1);
    uint32_t id;
    assert_int_equal(kvd_store_ns_find(s, KVD_TENANT_DEFAULT, "nope", &id),
                     KVD_ERR_NOT_FOUND);
    kvd_store_destroy(s);
}

/* Namespaces: the same name, size and flag is idempotent (same id); a
 * different size or flag, an empty or over-long name, a zero size or an
 * object larger than the pool is INVALID; past the limit NO_SPACE. */
static void test_namespace_register(void **state)
{
    (void)state;
    kvd_store_t *s = mk_store(30000);
    uint32_t a = 99, b = 99, id = 99;
    assert_int_equal(kvd_store_ns_register(s, KVD_TENANT_DEFAULT, KVD_OWNER_PERMANENT,
                                           "m/kv/tp0", OBJ_KV, false, &a),
                     KVD_OK);
    assert_int_equal(kvd_store_ns_register(s, KVD_TENANT_DEFAULT, KVD_OWNER_PERMANENT,
                                           "m/kv", 3 * PAGE, true, &b),
                     KVD_OK);
    assert_true(a != b);
    assert_int_equal(kvd_store_ns_register(s, KVD_TENANT_DEFAULT, KVD_OWNER_PERMANENT,
                                           "m/kv/tp0", OBJ_KV, false, &id),
                     KVD_OK);
    assert_int_equal(id, a);
    assert_int_equal(kvd_store_ns_register(s, KVD_TENANT_DEFAULT, KVD_OWNER_PERMANENT,
                                           "m/kv", 3 * PAGE, true, &id),
                     KVD_OK);
    assert_int_equal(id, b);
    assert_int_equal(kvd_store_ns_count(s), 2);

    id = 77;
    assert_int_equal(kvd_store_ns_register(s, KVD_TENANT_DEFAULT, KVD_OWNER_PERMANENT,
                                           "m/kv/tp0", OBJ_KV + 1, false, &id),
                     KVD_ERR_INVALID);
    assert_int_equal(kvd_store_ns_register(s, KVD_TENANT_DEFAULT, KVD_OWNER_PERMANENT,
                                           "m/kv/tp0", OBJ_KV, true, &id),
                     KVD_ERR_INVALID);
    assert_int_equal(kvd_store_ns_register(s, KVD_TENANT_DEFAULT, KVD_OWNER_PERMANENT,
                                           "m/kv", 3 * PAGE, false, &id),
                     KVD_ERR_INVALID);
    assert_int_equal(kvd_store_ns_register(s, KVD_TENANT_DEFAULT, KVD_OWNER_PERMANENT, "",
                                           PAGE, false, &id),
                     KVD_ERR_INVALID);
    assert_int_equal(kvd_store_ns_register(s, KVD_TENANT_DEFAULT, KVD_OWNER_PERMANENT,
                                           "zero", 0, false, &id),
                     KVD_ERR_INVALID);
    assert_int_equal(kvd_store_ns_register(s, KVD_TENANT_DEFAULT, KVD_OWNER_PERMANENT,
                                           "big", POOL + 1, false, &id),
                     KVD_ERR_INVALID);
    char name[KVD_NS_NAME_MAX + 1];
    memset(name, 'x', KVD_NS_NAME_MAX);
    name[KVD_NS_NAME_MAX] = '\0'; /* 256 characters: one too many */
    assert_int_equal(kvd_store_ns_register(s, KVD_TENANT_DEFAULT, KVD_OWNER_PERMANENT,
                                           name, PAGE, false, &id),
                     KVD_ERR_INVALID);
    assert_int_equal(id, 77);
    assert_int_equal(kvd_store_ns_count(s), 2);

    name[KVD_NS_NAME_MAX - 1] = '\0'; /* 255: the longest allowed */
    uint32_t longest;
    assert_int_equal(kvd_store_ns_register(s, KVD_TENANT_DEFAULT, KVD_OWNER_PERMANENT,
                                           name, PAGE, false, &longest),
                     KVD_OK);
    assert_int_equal(kvd_store_ns_register(s, KVD_TENANT_DEFAULT, KVD_OWNER_PERMANENT,
                                           "whole", POOL, false, &id),
                     KVD_OK);
    assert_int_equal(kvd_store_ns_count(s), 4);

    kvd_ns_info_t ni;
    assert_int_equal(kvd_store_ns_info(s, b, &ni), KVD_OK);
    assert_string_equal(ni.name, "m/kv");
    assert_int_equal(ni.object_bytes, 3 * PAGE);
    assert_true(ni.rank_replicated);
    assert_int_equal(kvd_store_ns_info(s, longest, &ni), KVD_OK);
    assert_string_equal(ni.name, name);
    assert_int_equal(kvd_store_ns_find(s, KVD_TENANT_DEFAULT, "m/kv/tp0", &id), KVD_OK);
    assert_int_equal(id, a);

    /* an object of the whole pool (64 pages) fits an empty pool */
    uint64_t w = reserve_one(s, OWNER_A, kvd_store_ns_count(s) - 1, 1, 0);
    assert_int_equal(stats(s).free_bytes, 0);
    assert_int_equal(kvd_store_revoke(s, OWNER_A, w, NULL, 0), KVD_OK);

    /* the table is bounded */
    for (uint32_t i = kvd_store_ns_count(s); i < KVD_STORE_MAX_NAMESPACES; i++) {
        char n[32];
        snprintf(n, sizeof(n), "ns-%u", i);
        assert_int_equal(kvd_store_ns_register(s, KVD_TENANT_DEFAULT, KVD_OWNER_PERMANENT,
                                               n, PAGE, false, &id),
                         KVD_OK);
        assert_int_equal(id, i);
    }
    assert_int_equal(kvd_store_ns_register(s, KVD_TENANT_DEFAULT, KVD_OWNER_PERMANENT,
                                           "one-more", PAGE, false, &id),
                     KVD_ERR_NO_SPACE);
    assert_int_equal(kvd_store_ns_register(s, KVD_TENANT_DEFAULT, KVD_OWNER_PERMANENT,
                                           "m/kv", 3 * PAGE, true, &id),
                     KVD_OK);
    assert_int_equal(id, b);
    assert_int_equal(kvd_store_ns_count(s), KVD_STORE_MAX_NAMESPACES);
    /* the last id works */
    put_ready(s, OWNER_A, KVD_STORE_MAX_NAMESPACES - 1, 3);
    assert_state(s, KVD_STORE_MAX_NAMESPACES - 1, 3, KVD_OBJ_READY);
    assert_state(s, 0, 3, 0);
    check_ok(s);
    kvd_store_destroy(s);
}

/* The owner goes: its reservations are revoked (never visible), its pins
 * released, what it published stays; other owners keep theirs. */
static void test_owner_gone(void **state)
{
    (void)state;
    kvd_store_t *s = mk_store(30000);
    uint32_t ns = reg(s, "kv", PAGE);
    for (uint32_t k = 1; k <= 4; k++)
        put_ready(s, OWNER_B, ns, k);
    uint32_t wk[3] = {5, 6, 7};
    uint8_t res[3];
    kvd_loc_t locs[3];
    uint64_t w1 = reserve_keys(s, OWNER_A, ns, wk, 3, 0, res, locs);
    assert_int_equal(publish_keys(s, OWNER_A, w1, &wk[2], 1), KVD_OK); /* 7 READY */
    uint64_t r1, r2, r3;
    size_t bad;
    uint32_t p1[2] = {1, 2}, p2[2] = {2, 3}, p3[1] = {1};
    assert_int_equal(acquire_keys(s, OWNER_A, ns, p1, 2, 0, &r1, locs, &bad), KVD_OK);
    assert_int_equal(acquire_keys(s, OWNER_A, ns, p2, 2, 0, &r2, locs, &bad), KVD_OK);
    assert_int_equal(acquire_keys(s, OWNER_B, ns, p3, 1, 0, &r3, locs, &bad), KVD_OK);
    uint64_t w3 = reserve_one(s, OWNER_B, ns, 8, 0);
    kvd_store_stats_t st = stats(s);
    assert_int_equal(st.pins, 5);
    assert_int_equal(st.leases, 5);
    assert_int_equal(st.objects_writing, 3);

    assert_int_equal(kvd_store_owner_gone(s, OWNER_A), 3);
    check_ok(s);
    assert_state(s, ns, 5, 0);
    assert_state(s, ns, 6, 0);
    assert_state(s, ns, 7, KVD_OBJ_READY);
    assert_state(s, ns, 8, KVD_OBJ_WRITING);
    assert_int_equal(pins_of(s, ns, 1), 1);
    assert_int_equal(pins_of(s, ns, 2), 0);
    assert_int_equal(pins_of(s, ns, 3), 0);
    st = stats(s);
    assert_int_equal(st.pins, 1);
    assert_int_equal(st.objects_pinned, 1);
    assert_int_equal(st.leases, 2);
    assert_int_equal(st.objects_writing, 1);
    assert_int_equal(st.writing_bytes, PAGE);
    assert_int_equal(
        st.free_bytes + st.writing_bytes + st.ready_bytes + st.quarantined_bytes, POOL);
    /* the half-written objects were never and are not visible */
    uint32_t half[2] = {5, 6};
    assert_int_equal(lookup_all(s, ns, half, 1), 0);
    assert_int_equal(lookup_all(s, ns, &half[1], 1), 0);
    uint64_t r;
    assert_int_equal(acquire_keys(s, OWNER_B, ns, half, 2, 0, &r, locs, &bad),
                     KVD_ERR_NOT_FOUND);
    assert_int_equal(bad, 0);
    /* its leases are gone */
    assert_int_equal(kvd_store_release(s, OWNER_A, r1), KVD_ERR_NOT_FOUND);
    assert_int_equal(kvd_store_release(s, OWNER_A, r2), KVD_ERR_NOT_FOUND);
    assert_int_equal(kvd_store_publish(s, OWNER_A, w1, NULL, 0), KVD_ERR_NOT_FOUND);
    /* and the keys can be written again */
    uint64_t w5 = reserve_one(s, OWNER_B, ns, 5, 0);
    assert_int_equal(kvd_store_owner_gone(s, OWNER_A), 0);

    assert_int_equal(kvd_store_owner_gone(s, OWNER_B), 3);
    check_ok(s);
    (void)w3;
    (void)w5;
    (void)r3;
    st = stats(s);
    assert_int_equal(st.pins, 0);
    assert_int_equal(st.objects_pinned, 0);
    assert_int_equal(st.writing_bytes, 0);
    assert_int_equal(st.objects_writing, 0);
    assert_int_equal(st.leases, 0);
    assert_int_equal(st.objects_ready, 5); /* 1..4 and 7 */
    /* the dead writers' extents wait out one TTL before they are reused */
    assert_true(st.quarantined_bytes > 0);
    assert_int_equal(st.free_bytes + st.ready_bytes + st.quarantined_bytes, POOL);
    kvd_store_expire(s, UINT64_MAX / 2);
    check_ok(s);
    st = stats(s);
    assert_int_equal(st.quarantined_bytes, 0);
    assert_int_equal(st.free_bytes + st.ready_bytes, POOL);
    assert_state(s, ns, 8, 0);
    kvd_store_destroy(s);
}

/* Expire: before the TTL nothing happens; past it every lease is undone as
 * if its owner had gone, and counted. */
static void test_expire(void **state)
{
    (void)state;
    const uint64_t ttl = 1000;
    kvd_store_t *s = mk_store(ttl);
    uint32_t ns = reg(s, "kv", PAGE);
    put_ready(s, OWNER_B, ns, 1); /* its lease ended with the publish */
    uint64_t w = reserve_one(s, OWNER_A, ns, 2, 100);
    uint64_t r;
    size_t bad;
    kvd_loc_t loc;
    uint32_t one = 1;
    assert_int_equal(acquire_keys(s, OWNER_A, ns, &one, 1, 200, &r, &loc, &bad), KVD_OK);

    kvd_store_stats_t before = stats(s);
    assert_int_equal(kvd_store_expire(s, 0), 0);
    assert_int_equal(kvd_store_expire(s, 100 + ttl - 1), 0);
    check_ok(s);
    kvd_store_stats_t after = stats(s);
    assert_same_state(&before, &after);
    assert_int_equal(after.leases_expired, 0);
    assert_state(s, ns, 2, KVD_OBJ_WRITING);
    assert_int_equal(pins_of(s, ns, 1), 1);

    /* the write lease (from t=100) has passed, the read lease (t=200) not */
    assert_int_equal(kvd_store_expire(s, 100 + ttl + 50), 1);
    check_ok(s);
    assert_state(s, ns, 2, 0);
    assert_int_equal(pins_of(s, ns, 1), 1);
    after = stats(s);
    assert_int_equal(after.leases_expired, 1);
    assert_int_equal(after.leases, 1);
    assert_int_equal(after.writing_bytes, 0);
    assert_int_equal(kvd_store_publish(s, OWNER_A, w, NULL, 0), KVD_ERR_NOT_FOUND);

    assert_int_equal(kvd_store_expire(s, 200 + ttl + 50), 1);
    check_ok(s);
    after = stats(s);
    assert_int_equal(after.leases_expired, 2);
    assert_int_equal(after.leases, 0);
    assert_int_equal(after.pins, 0);
    assert_int_equal(after.objects_pinned, 0);
    /* the expired writer's extent is quarantined for one more TTL */
    assert_int_equal(after.free_bytes + after.ready_bytes + after.quarantined_bytes,
                     POOL);
    assert_int_equal(after.quarantined_bytes, PAGE);
    assert_int_equal(kvd_store_expire(s, 100 + 2 * ttl + 50 + 1000), 0);
    check_ok(s);
    after = stats(s);
    assert_int_equal(after.quarantined_bytes, 0);
    assert_int_equal(after.free_bytes + after.ready_bytes, POOL);
    assert_int_equal(pins_of(s, ns, 1), 0);
    assert_state(s, ns, 1, KVD_OBJ_READY); /* published objects stay */
    assert_int_equal(kvd_store_release(s, OWNER_A, r), KVD_ERR_NOT_FOUND);
    assert_int_equal(kvd_store_expire(s, UINT64_MAX / 2), 0);
    assert_int_equal(stats(s).leases_expired, 2);
    kvd_store_destroy(s);
}

typedef struct seen {
    uint32_t n, ready, writing, stop_at;
    uint32_t keys[16];
} seen_t;

static int count_obj(const kvd_obj_info_t *info, void *arg)
{
    seen_t *s = arg;
    uint32_t k;
    memcpy(&k, info->key, sizeof(k));
    s->keys[s->n++ % 16] = k;
    s->ready += info->state == KVD_OBJ_READY;
    s->writing += info->state == KVD_OBJ_WRITING;
    return s->n == s->stop_at ? 42 : 0;
}

/* foreach visits every object (READY and WRITING) of a namespace, or of
 * all with UINT32_MAX, and stops at the first non-zero return. */
static void test_foreach(void **state)
{
    (void)state;
    kvd_store_t *s = mk_store(30000);
    uint32_t a = reg(s, "a", PAGE), b = reg(s, "b", OBJ_KV);
    put_ready(s, OWNER_A, a, 1);
    put_ready(s, OWNER_A, a, 2);
    reserve_one(s, OWNER_A, a, 3, 0);
    put_ready(s, OWNER_A, b, 1);
    reserve_one(s, OWNER_A, b, 4, 0);

    seen_t seen = {0};
    assert_int_equal(kvd_store_foreach(s, a, count_obj, &seen), 0);
    assert_int_equal(seen.n, 3);
    assert_int_equal(seen.ready, 2);
    assert_int_equal(seen.writing, 1);
    uint32_t mask = 0;
    for (uint32_t i = 0; i < seen.n; i++)
        mask |= 1u << seen.keys[i];
    assert_int_equal(mask, 0xe); /* keys 1, 2, 3 */
    memset(&seen, 0, sizeof(seen));
    assert_int_equal(kvd_store_foreach(s, UINT32_MAX, count_obj, &seen), 0);
    assert_int_equal(seen.n, 5);
    assert_int_equal(seen.ready, 3);
    assert_int_equal(seen.writing, 2);
    memset(&seen, 0, sizeof(seen));
    seen.stop_at = 2;
    assert_int_equal(kvd_store_foreach(s, UINT32_MAX, count_obj, &seen), 42);
    assert_int_equal(seen.n, 2);
    kvd_store_destroy(s);
}

/* Acquire records the read: hits and a wall-clock last access (kept at a
 * resolution of a second, so a second of slack). The tier is DRAM. */
static void test_access_metadata(void **state)
{
    (void)state;
    kvd_store_t *s = mk_store(30000);
    uint32_t ns = reg(s, "kv", PAGE);
    put_ready(s, OWNER_A, ns, 1);
    kvd_obj_info_t info;
    assert_int_equal(state_of(s, ns, 1, &info), KVD_OK);
    assert_int_equal(info.hits, 0);
    assert_int_equal(info.tier, KVD_TIER_DRAM);
    uint64_t t0 = kvd_wall_ms();
    uint64_t r;
    size_t bad;
    kvd_loc_t loc;
    uint32_t one = 1;
    assert_int_equal(acquire_keys(s, OWNER_A, ns, &one, 1, 0, &r, &loc, &bad), KVD_OK);
    uint64_t t1 = kvd_wall_ms();
    assert_int_equal(state_of(s, ns, 1, &info), KVD_OK);
    assert_int_equal(info.hits, 1);
    assert_true(info.last_access_ms + 1000 > t0);
    assert_true(info.last_access_ms <= t1);
    assert_int_equal(kvd_store_release(s, OWNER_A, r), KVD_OK);
    kvd_store_destroy(s);
}

/* A publish counts as a use (kvd_store.h: "the last publish or acquire"):
 * the object reports it, with no hits until it is read; a read adds one. */
static void test_last_access_set_by_publish(void **state)
{
    (void)state;
    kvd_store_t *s = mk_store(30000);
    uint32_t ns = reg(s, "kv", PAGE);
    uint64_t before = kvd_wall_ms();
    put_ready(s, OWNER_A, ns, 1);
    kvd_obj_info_t info;
    assert_int_equal(state_of(s, ns, 1, &info), KVD_OK);
    kvd_store_destroy(s);
    assert_int_equal(info.hits, 0);
    /* last access has a resolution of one second from the store's epoch */
    assert_true(info.last_access_ms + 1000 >= before);
    assert_true(info.last_access_ms <= kvd_wall_ms());
}

/* Bad configurations are refused. */
static void test_create_invalid(void **state)
{
    (void)state;
    kvd_store_config_t cfg;
    kvd_store_t *s = NULL;
    kvd_store_config_default(&cfg, POOL);
    cfg.evict_high = 0.5;
    cfg.evict_low = 0.6; /* low above high */
    assert_int_equal(kvd_store_create(&cfg, &s), KVD_ERR_INVALID);
    kvd_store_config_default(&cfg, POOL);
    cfg.evict_high = 1.5;
    assert_int_equal(kvd_store_create(&cfg, &s), KVD_ERR_INVALID);
    kvd_store_config_default(&cfg, POOL);
    cfg.evict_low = 0.0;
    assert_int_equal(kvd_store_create(&cfg, &s), KVD_ERR_INVALID);
    kvd_store_config_default(&cfg, ((uint64_t)UINT32_MAX + 1) * PAGE); /* 2^32 pages */
    assert_int_equal(kvd_store_create(&cfg, &s), KVD_ERR_INVALID);
    assert_null(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fresh_store),
        cmocka_unit_test(test_reserve_allocates),
        cmocka_unit_test(test_reserve_same_key),
        cmocka_unit_test(test_publish_errors),
        cmocka_unit_test(test_publish_key_not_in_lease),
        cmocka_unit_test(test_publish_partial),
        cmocka_unit_test(test_revoke_frees),
        cmocka_unit_test(test_acquire_all_or_nothing),
        cmocka_unit_test(test_release),
        cmocka_unit_test(test_unknown_namespace),
        cmocka_unit_test(test_namespace_register),
        cmocka_unit_test(test_owner_gone),
        cmocka_unit_test(test_expire),
        cmocka_unit_test(test_create_invalid),
        cmocka_unit_test(test_foreach),
        cmocka_unit_test(test_access_metadata),
        cmocka_unit_test(test_last_access_set_by_publish),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
