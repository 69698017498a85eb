/*
 * Description: kvd_store_lookup and its hit policies (DESIGN.md section 5,
 * kvd_store.h "lookup"), with hand-worked boundaries:
 *   ALL_PAGES, present {0,1,2,4} of 6            -> {1,2,3}
 *   TRAILING_PAGES(1), present {2,5} of 6        -> {3,6}
 *   TRAILING_PAGES(2), present {1,2,3,5} of 6    -> {3,4}
 *   kv ALL_PAGES {0..5} + mamba TRAILING(1) {1,3} -> {2,4}
 * A boundary b is restorable when ALL_PAGES has pages 0..b-1 present and
 * TRAILING_PAGES(n) has pages b-n..b-1 (clamped at 0); the answer is every
 * b in 1..min(n_keys) restorable for all pools. WRITING objects are not
 * present. Keys are real SGLang-style page keys from kvd_key_chain.
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

#define PAGE       4096u
#define POOL_PGS   64u
#define OWNER      7u
#define PAGE_TOKS  4u
#define MAX_KEYS   8u
#define BOUND_SENT 0xdeadbeefu

typedef struct fixture {
    kvd_store_t *s;
    uint32_t kv, mamba;
    key_t32 keys[MAX_KEYS]; /* the prompt's page keys, a real chain */
} fixture_t;

static int setup(void **state)
{
    static fixture_t f;
    memset(&f, 0, sizeof(f));
    kvd_store_config_t cfg;
    kvd_store_config_default(&cfg, (uint64_t)POOL_PGS * PAGE);
    cfg.evict_high = 1.0;
    cfg.evict_low = 1.0;
    if (kvd_store_create(&cfg, &f.s) != KVD_OK)
        return -1;
    if (kvd_store_ns_register(f.s, KVD_TENANT_DEFAULT, KVD_OWNER_PERMANENT, "m/kv/tp0",
                              PAGE, false, &f.kv) != KVD_OK ||
        kvd_store_ns_register(f.s, KVD_TENANT_DEFAULT, KVD_OWNER_PERMANENT, "m/mamba/tp0",
                              2 * PAGE, false, &f.mamba) != KVD_OK)
        return -1;
    uint32_t tokens[MAX_KEYS * PAGE_TOKS];
    for (uint32_t i = 0; i < MAX_KEYS * PAGE_TOKS; i++)
        tokens[i] = 1000 + i * 7;
    size_t n = 0;
    if (kvd_key_chain(tokens, MAX_KEYS * PAGE_TOKS, PAGE_TOKS, NULL, f.keys, &n) !=
            KVD_OK ||
        n != MAX_KEYS)
        return -1;
    *state = &f;
    return 0;
}

static int teardown(void **state)
{
    fixture_t *f = *state;
    kvd_store_destroy(f->s);
    return 0;
}

/* Reserves pages `pages` (bit i = page i) of the chain in ns; publishes
 * them unless `writing`. */
static void put_pages(fixture_t *f, uint32_t ns, uint32_t pages, bool writing)
{
    kvd_put_t items[MAX_KEYS];
    uint8_t res[MAX_KEYS];
    kvd_loc_t locs[MAX_KEYS];
    size_t n = 0;
    for (uint32_t i = 0; i < MAX_KEYS; i++)
        if (pages >> i & 1)
            items[n++] = (kvd_put_t){
                .key = f->keys[i], .parent = i ? f->keys[i - 1] : NULL, .depth = i};
    uint64_t lease = 0;
    assert_int_equal(kvd_store_reserve(f->s, OWNER, ns, items, n, 0, &lease, res, locs),
                     KVD_OK);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(res[i], KVD_RESERVE_ALLOCATED);
    if (!writing)
        assert_int_equal(kvd_store_publish(f->s, OWNER, lease, NULL, 0), KVD_OK);
    check_ok(f->s);
}

/* Runs a lookup and compares with want[0..n_want). */
static void expect(fixture_t *f, const kvd_lookup_pool_t *pools, size_t n_pools,
                   const uint32_t *want, size_t n_want)
{
    uint32_t b[MAX_KEYS + 1];
    for (size_t i = 0; i <= MAX_KEYS; i++)
        b[i] = BOUND_SENT;
    size_t nb = 12345;
    assert_int_equal(kvd_store_lookup(f->s, pools, n_pools, b, &nb), KVD_OK);
    size_t cap = SIZE_MAX;
    for (size_t p = 0; p < n_pools; p++)
        cap = pools[p].n_keys < cap ? pools[p].n_keys : cap;
    if (nb != n_want) {
        print_error("got %zu boundaries:", nb);
        for (size_t i = 0; i < nb && i < MAX_KEYS; i++)
            print_error(" %u", b[i]);
        print_error("\n");
    }
    assert_int_equal(nb, n_want);
    for (size_t i = 0; i < n_want; i++)
        assert_int_equal(b[i], want[i]);
    for (size_t i = cap; i <= MAX_KEYS; i++) /* nothing past min n_keys entries */
        assert_int_equal(b[i], BOUND_SENT);
    check_ok(f->s);
}

static kvd_lookup_pool_t pool(fixture_t *f, uint32_t ns, size_t n, uint32_t trailing)
{
    return (kvd_lookup_pool_t){.ns = ns,
                               .keys = (const uint8_t(*)[KVD_KEY_BYTES])f->keys,
                               .n_keys = n,
                               .trailing_pages = trailing};
}

/* ------------------------------------------------------------- tests */

static void test_all_pages(void **state)
{
    fixture_t *f = *state;
    put_pages(f, f->kv, 0x17, false); /* {0,1,2,4} */
    kvd_lookup_pool_t p = pool(f, f->kv, 6, 0);
    const uint32_t want[] = {1, 2, 3};
    expect(f, &p, 1, want, 3);
}

static void test_trailing_one(void **state)
{
    fixture_t *f = *state;
    put_pages(f, f->kv, 0x24, false); /* {2,5} */
    kvd_lookup_pool_t p = pool(f, f->kv, 6, 1);
    const uint32_t want[] = {3, 6};
    expect(f, &p, 1, want, 2);
    /* ALL_PAGES over the same: page 0 is missing, nothing */
    p = pool(f, f->kv, 6, 0);
    expect(f, &p, 1, NULL, 0);
}

/* TRAILING_PAGES(2), present {1,2,3,5}: b=1 needs {0}, b=2 {0,1}, b=3
 * {1,2}, b=4 {2,3}, b=5 {3,4}, b=6 {4,5}: only 3 and 4. */
static void test_trailing_two(void **state)
{
    fixture_t *f = *state;
    put_pages(f, f->kv, 0x2e, false); /* {1,2,3,5} */
    kvd_lookup_pool_t p = pool(f, f->kv, 6, 2);
    const uint32_t want[] = {3, 4};
    expect(f, &p, 1, want, 2);
    /* a window larger than b is clamped at page 0: TRAILING(8) = ALL here */
    put_pages(f, f->kv, 0x01, false); /* now {0,1,2,3,5} */
    p = pool(f, f->kv, 6, 8);
    const uint32_t want8[] = {1, 2, 3, 4};
    expect(f, &p, 1, want8, 4);
    p = pool(f, f->kv, 6, 2);
    const uint32_t want2[] = {1, 2, 3, 4};
    expect(f, &p, 1, want2, 4);
}

/* The hybrid rule: KV and state must both be present. */
static void test_hybrid_kv_and_mamba(void **state)
{
    fixture_t *f = *state;
    put_pages(f, f->kv, 0x3f, false);    /* {0..5} */
    put_pages(f, f->mamba, 0x0a, false); /* {1,3} */
    kvd_lookup_pool_t p[2] = {pool(f, f->kv, 6, 0), pool(f, f->mamba, 6, 1)};
    const uint32_t want[] = {2, 4};
    expect(f, p, 2, want, 2);
    /* the order of the pools does not matter */
    kvd_lookup_pool_t q[2] = {p[1], p[0]};
    expect(f, q, 2, want, 2);
    /* KV with a hole at page 2: only boundary 2 survives */
    uint8_t key[KVD_KEY_BYTES];
    memcpy(key, f->keys[2], KVD_KEY_BYTES);
    assert_int_equal(kvd_store_evict_key(f->s, f->kv, key), KVD_OK);
    const uint32_t want2[] = {2};
    expect(f, p, 2, want2, 1);
}

/* Pools with different key counts: boundaries only up to the shortest. */
static void test_shortest_pool_bounds(void **state)
{
    fixture_t *f = *state;
    put_pages(f, f->kv, 0x3f, false);    /* {0..5} */
    put_pages(f, f->mamba, 0x2a, false); /* {1,3,5} */
    kvd_lookup_pool_t p[2] = {pool(f, f->kv, 3, 0), pool(f, f->mamba, 6, 1)};
    const uint32_t want[] = {2};
    expect(f, p, 2, want, 1);
    kvd_lookup_pool_t q[2] = {pool(f, f->kv, 6, 0), pool(f, f->mamba, 4, 1)};
    const uint32_t want4[] = {2, 4};
    expect(f, q, 2, want4, 2);
    /* a pool with no keys: no boundary at all */
    kvd_lookup_pool_t r[2] = {pool(f, f->kv, 6, 0), pool(f, f->mamba, 0, 1)};
    expect(f, r, 2, NULL, 0);
    kvd_lookup_pool_t single = pool(f, f->kv, 0, 0);
    expect(f, &single, 1, NULL, 0);
}

/* Objects still being written are not present. */
static void test_writing_not_present(void **state)
{
    fixture_t *f = *state;
    put_pages(f, f->kv, 0x37, false); /* {0,1,2,4,5} READY */
    put_pages(f, f->kv, 0x08, true);  /* {3} WRITING */
    kvd_lookup_pool_t p = pool(f, f->kv, 6, 0);
    const uint32_t want[] = {1, 2, 3};
    expect(f, &p, 1, want, 3);
    p = pool(f, f->kv, 6, 1);
    const uint32_t want1[] = {1, 2, 3, 5, 6};
    expect(f, &p, 1, want1, 5);
    kvd_ns_info_t ni;
    assert_int_equal(kvd_store_ns_info(f->s, f->kv, &ni), KVD_OK);
    assert_int_equal(ni.hit_pages, 10); /* 5 of 6, twice */
}

/* 0 pools: INVALID; an unknown namespace: NOT_FOUND; none of them counts as
 * a lookup. How many pools one Lookup may name is the protocol's limit
 * (KVD_LOOKUP_POOLS_MAX, checked by the daemon): the engine takes any
 * number, here 40 pools of one namespace. */
static void test_invalid_lookups(void **state)
{
    fixture_t *f = *state;
    put_pages(f, f->kv, 0x3f, false);
    kvd_lookup_pool_t p[40];
    for (size_t i = 0; i < KVD_ARRAY_SIZE(p); i++)
        p[i] = pool(f, f->kv, 6, i % 2); /* ALL_PAGES and TRAILING(1) */
    uint32_t b[MAX_KEYS];
    size_t nb = 777;
    kvd_store_stats_t before, after;
    kvd_store_stats(f->s, &before);
    assert_int_equal(kvd_store_lookup(f->s, p, 0, b, &nb), KVD_ERR_INVALID);
    kvd_lookup_pool_t bad = pool(f, 2, 6, 0);
    assert_int_equal(kvd_store_lookup(f->s, &bad, 1, b, &nb), KVD_ERR_NOT_FOUND);
    bad.ns = UINT32_MAX;
    assert_int_equal(kvd_store_lookup(f->s, &bad, 1, b, &nb), KVD_ERR_NOT_FOUND);
    kvd_store_stats(f->s, &after);
    assert_int_equal(after.lookups, before.lookups);
    assert_int_equal(after.lookup_pages, before.lookup_pages);
    check_ok(f->s);
    const uint32_t want[] = {1, 2, 3, 4, 5, 6};
    expect(f, p, KVD_ARRAY_SIZE(p), want, 6);
}

/* Counters: per namespace, pages probed and pages present; in the store's
 * stats, lookups and the sums. */
static void test_lookup_counters(void **state)
{
    fixture_t *f = *state;
    put_pages(f, f->kv, 0x17, false);    /* {0,1,2,4} */
    put_pages(f, f->mamba, 0x0a, false); /* {1,3} */
    kvd_lookup_pool_t p[2] = {pool(f, f->kv, 6, 0), pool(f, f->mamba, 6, 1)};
    const uint32_t want[] = {2};
    expect(f, p, 2, want, 1);
    expect(f, p, 1, (const uint32_t[]){1, 2, 3}, 3);
    kvd_ns_info_t kv, mb;
    kvd_store_ns_info(f->s, f->kv, &kv);
    kvd_store_ns_info(f->s, f->mamba, &mb);
    assert_int_equal(kv.lookup_pages, 12);
    assert_int_equal(kv.hit_pages, 8);
    assert_int_equal(mb.lookup_pages, 6);
    assert_int_equal(mb.hit_pages, 2);
    kvd_store_stats_t st;
    kvd_store_stats(f->s, &st);
    assert_int_equal(st.lookups, 2);
    assert_int_equal(st.lookup_pages, 18);
    assert_int_equal(st.hit_pages, 10);
    /* a lookup changes no state */
    assert_int_equal(st.pins, 0);
    assert_int_equal(st.leases, 0);
    assert_int_equal(st.objects_ready, 6);
}

/* Keys from a different chain (another anchor) miss entirely, and a key of
 * one namespace is not present in another. */
static void test_other_chain_and_namespace(void **state)
{
    fixture_t *f = *state;
    put_pages(f, f->kv, 0x3f, false);
    kvd_lookup_pool_t p = pool(f, f->mamba, 6, 0);
    expect(f, &p, 1, NULL, 0);
    uint32_t tokens[6 * PAGE_TOKS];
    for (uint32_t i = 0; i < 6 * PAGE_TOKS; i++)
        tokens[i] = 1000 + i * 7; /* the same tokens ... */
    key_t32 anchored[6];
    size_t n;
    assert_int_equal(
        kvd_key_chain(tokens, 6 * PAGE_TOKS, PAGE_TOKS, f->keys[7], anchored, &n),
        KVD_OK); /* ... after another prefix */
    assert_int_equal(n, 6);
    kvd_lookup_pool_t q = {
        .ns = f->kv, .keys = (const uint8_t(*)[KVD_KEY_BYTES])anchored, .n_keys = 6};
    expect(f, &q, 1, NULL, 0);
    p = pool(f, f->kv, 6, 0);
    expect(f, &p, 1, (const uint32_t[]){1, 2, 3, 4, 5, 6}, 6);
}

#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)

int main(void)
{
    const struct CMUnitTest tests[] = {
        T(test_all_pages),
        T(test_trailing_one),
        T(test_trailing_two),
        T(test_hybrid_kv_and_mamba),
        T(test_shortest_pool_bounds),
        T(test_writing_not_present),
        T(test_invalid_lookups),
        T(test_lookup_counters),
        T(test_other_chain_and_namespace),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
