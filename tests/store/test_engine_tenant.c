/*
 * Description: tenants in the store engine: namespaces of one name in two
 * tenants share nothing; quotas on bytes (the tenant's own cold objects are
 * evicted, leaf first, never another tenant's), pins, leases and
 * namespaces; namespaces removed once without users and objects, and their
 * ids never valid again; extents that cross tenants are scrubbed.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "engine_util.h"

#define PAGE  4096u
#define POOL  (64u * PAGE)
#define OWN_A 101u
#define OWN_B 202u

static kvd_store_t *mk(void)
{
    kvd_store_config_t cfg;
    kvd_store_config_default(&cfg, POOL);
    cfg.evict_high = 1.0; /* no watermark eviction: only what the test asks */
    cfg.evict_low = 1.0;
    kvd_store_t *s = NULL;
    assert_int_equal(kvd_store_create(&cfg, &s), KVD_OK);
    return s;
}

static uint32_t tenant(kvd_store_t *s, const char *name, kvd_tenant_limits_t lim)
{
    uint32_t id = 0;
    assert_int_equal(kvd_store_tenant_add(s, name, &lim, &id), KVD_OK);
    return id;
}

static uint32_t reg_for(kvd_store_t *s, uint32_t t, uint64_t owner, const char *name)
{
    uint32_t id = UINT32_MAX;
    assert_int_equal(kvd_store_ns_register(s, t, owner, name, PAGE, false, &id), KVD_OK);
    return id;
}

/* Reserves keys first..first+n-1 as one chain (key k's parent k-1) in ns
 * and publishes them; returns how many were allocated. */
static size_t put_chain(kvd_store_t *s, uint64_t owner, uint32_t ns, uint32_t first,
                        size_t n, uint8_t *res)
{
    key_t32 keys[64];
    kvd_put_t items[64];
    kvd_loc_t locs[64];
    assert_true(n <= 64);
    for (size_t k = 0; k < n; k++) {
        mkkey(keys[k], first + (uint32_t)k);
        items[k] = (kvd_put_t){
            .key = keys[k], .parent = k ? keys[k - 1] : NULL, .depth = (uint32_t)k};
    }
    uint64_t lease = 0;
    assert_int_equal(kvd_store_reserve(s, owner, ns, items, n, 0, &lease, res, locs),
                     KVD_OK);
    size_t got = 0;
    for (size_t k = 0; k < n; k++)
        got += res[k] == KVD_RESERVE_ALLOCATED;
    if (lease != 0)
        assert_int_equal(kvd_store_publish(s, owner, lease, NULL, 0), KVD_OK);
    check_ok(s);
    return got;
}

static bool present(const kvd_store_t *s, uint32_t ns, uint32_t n)
{
    key_t32 k;
    mkkey(k, n);
    kvd_obj_info_t info;
    return kvd_store_inspect(s, ns, k, &info) == KVD_OK;
}

static kvd_tenant_usage_t usage(const kvd_store_t *s, uint32_t t)
{
    kvd_tenant_usage_t u;
    assert_int_equal(kvd_store_tenant_usage(s, t, NULL, &u), KVD_OK);
    return u;
}

/* One name, two tenants: two namespaces that share no object. */
static void test_same_name_two_tenants(void **state)
{
    (void)state;
    kvd_store_t *s = mk();
    kvd_tenant_limits_t none = {0};
    uint32_t a = tenant(s, "alpha", none), b = tenant(s, "beta", none);
    uint32_t na = reg_for(s, a, OWN_A, "m/kv"), nb = reg_for(s, b, OWN_B, "m/kv");
    assert_int_not_equal(na, nb);
    uint32_t id;
    assert_int_equal(kvd_store_ns_find(s, a, "m/kv", &id), KVD_OK);
    assert_int_equal(id, na);
    assert_int_equal(kvd_store_ns_find(s, b, "m/kv", &id), KVD_OK);
    assert_int_equal(id, nb);
    assert_int_equal(kvd_store_ns_find(s, KVD_TENANT_DEFAULT, "m/kv", &id),
                     KVD_ERR_NOT_FOUND);
    kvd_ns_info_t info;
    assert_int_equal(kvd_store_ns_info(s, na, &info), KVD_OK);
    assert_int_equal(info.tenant, a);
    assert_int_equal(info.users, 1);

    uint8_t res[8];
    assert_int_equal(put_chain(s, OWN_A, na, 1, 4, res), 4);
    /* B's namespace of the same name has none of A's keys */
    key_t32 keys[4];
    for (uint32_t k = 0; k < 4; k++)
        mkkey(keys[k], 1 + k);
    kvd_lookup_pool_t lp = {
        .ns = nb, .keys = (const uint8_t(*)[KVD_KEY_BYTES])keys, .n_keys = 4};
    uint32_t bounds[4];
    size_t nbounds = 9;
    assert_int_equal(kvd_store_lookup(s, &lp, 1, bounds, &nbounds), KVD_OK);
    assert_int_equal(nbounds, 0);
    assert_false(present(s, nb, 1));
    uint64_t lease = 0;
    kvd_loc_t locs[4];
    size_t bad = 9;
    assert_int_equal(kvd_store_acquire(s, OWN_B, nb,
                                       (const uint8_t(*)[KVD_KEY_BYTES])keys, 1, 0,
                                       &lease, locs, &bad),
                     KVD_ERR_NOT_FOUND);
    /* B writes the same keys: its own objects, not A's */
    assert_int_equal(put_chain(s, OWN_B, nb, 1, 4, res), 4);
    assert_int_equal(usage(s, a).bytes, 4 * PAGE);
    assert_int_equal(usage(s, b).bytes, 4 * PAGE);
    /* evicting B's tenant leaves A's objects */
    uint64_t ev = 0, sk = 0;
    assert_int_equal(kvd_store_evict_tenant(s, b, &ev, &sk), KVD_OK);
    assert_int_equal(ev, 4);
    assert_true(present(s, na, 1) && present(s, na, 4));
    assert_false(present(s, nb, 1));
    check_ok(s);
    kvd_store_destroy(s);
}

/* At its byte quota a tenant evicts its own coldest leaves, never the
 * other tenant's objects. */
static void test_byte_quota_evicts_own(void **state)
{
    (void)state;
    kvd_store_t *s = mk();
    kvd_tenant_limits_t lim = {.max_bytes = 8 * PAGE};
    kvd_tenant_limits_t none = {0};
    uint32_t a = tenant(s, "alpha", lim), b = tenant(s, "beta", none);
    uint32_t na = reg_for(s, a, OWN_A, "m/kv"), nb = reg_for(s, b, OWN_B, "m/kv");
    uint8_t res[16];
    assert_int_equal(put_chain(s, OWN_B, nb, 1000, 16, res), 16);
    /* then A's chain: B's objects are now the coldest of the pool */
    assert_int_equal(put_chain(s, OWN_A, na, 1, 8, res), 8);
    assert_int_equal(usage(s, a).bytes, 8 * PAGE);
    /* 4 more pages of A: its 4 deepest pages go (leaf first), B keeps all */
    assert_int_equal(put_chain(s, OWN_A, na, 100, 4, res), 4);
    kvd_tenant_usage_t u = usage(s, a);
    assert_int_equal(u.bytes, 8 * PAGE);
    assert_int_equal(u.quota_evictions, 4);
    for (uint32_t k = 1; k <= 4; k++)
        assert_true(present(s, na, k));
    for (uint32_t k = 5; k <= 8; k++)
        assert_false(present(s, na, k));
    for (uint32_t k = 0; k < 16; k++)
        assert_true(present(s, nb, 1000 + k));
    assert_int_equal(usage(s, b).quota_evictions, 0);
    /* an object larger than the quota never fits */
    uint32_t big = 0;
    assert_int_equal(kvd_store_ns_register(s, a, OWN_A, "m/big", 9 * PAGE, false, &big),
                     KVD_OK);
    assert_int_equal(put_chain(s, OWN_A, big, 500, 1, res), 0);
    assert_int_equal(res[0], KVD_RESERVE_NO_SPACE);
    assert_true(stats(s).reserve_quota >= 1);
    check_ok(s);
    kvd_store_destroy(s);
}

/* A tenant whose every object is pinned, at its quota: NO_SPACE, and
 * nothing of the other tenant goes. */
static void test_byte_quota_all_pinned(void **state)
{
    (void)state;
    kvd_store_t *s = mk();
    kvd_tenant_limits_t lim = {.max_bytes = 4 * PAGE};
    kvd_tenant_limits_t none = {0};
    uint32_t a = tenant(s, "alpha", lim), b = tenant(s, "beta", none);
    uint32_t na = reg_for(s, a, OWN_A, "m/kv"), nb = reg_for(s, b, OWN_B, "m/kv");
    uint8_t res[8];
    assert_int_equal(put_chain(s, OWN_B, nb, 1000, 8, res), 8);
    assert_int_equal(put_chain(s, OWN_A, na, 1, 4, res), 4);
    key_t32 keys[4];
    for (uint32_t k = 0; k < 4; k++)
        mkkey(keys[k], 1 + k);
    uint64_t rl = 0;
    kvd_loc_t locs[4];
    size_t bad;
    assert_int_equal(kvd_store_acquire(s, OWN_A, na,
                                       (const uint8_t(*)[KVD_KEY_BYTES])keys, 4, 0, &rl,
                                       locs, &bad),
                     KVD_OK);
    uint64_t refused = usage(s, a).quota_refusals;
    assert_int_equal(put_chain(s, OWN_A, na, 100, 2, res), 0);
    assert_int_equal(res[0], KVD_RESERVE_NO_SPACE);
    assert_int_equal(res[1], KVD_RESERVE_NO_SPACE);
    assert_int_equal(usage(s, a).quota_refusals, refused + 2);
    for (uint32_t k = 0; k < 8; k++)
        assert_true(present(s, nb, 1000 + k));
    /* the pool itself had room: it was the quota */
    assert_true(stats(s).free_bytes >= 2 * PAGE);
    assert_int_equal(kvd_store_release(s, OWN_A, rl), KVD_OK);
    assert_int_equal(put_chain(s, OWN_A, na, 100, 2, res), 2);
    check_ok(s);
    kvd_store_destroy(s);
}

static void test_pin_and_lease_quota(void **state)
{
    (void)state;
    kvd_store_t *s = mk();
    kvd_tenant_limits_t lim = {.max_pins = 4, .max_leases = 2};
    uint32_t a = tenant(s, "alpha", lim);
    uint32_t na = reg_for(s, a, OWN_A, "m/kv");
    uint8_t res[8];
    assert_int_equal(put_chain(s, OWN_A, na, 1, 8, res), 8);
    key_t32 keys[8];
    for (uint32_t k = 0; k < 8; k++)
        mkkey(keys[k], 1 + k);
    const uint8_t(*kp)[KVD_KEY_BYTES] = (const uint8_t(*)[KVD_KEY_BYTES])keys;
    uint64_t l1 = 0, l2 = 0, l3 = 0;
    kvd_loc_t locs[8];
    size_t bad;
    assert_int_equal(kvd_store_acquire(s, OWN_A, na, kp, 5, 0, &l1, locs, &bad),
                     KVD_ERR_QUOTA);
    assert_int_equal(kvd_store_acquire(s, OWN_A, na, kp, 3, 0, &l1, locs, &bad), KVD_OK);
    assert_int_equal(kvd_store_acquire(s, OWN_A, na, kp, 2, 0, &l2, locs, &bad),
                     KVD_ERR_QUOTA);
    assert_int_equal(kvd_store_acquire(s, OWN_A, na, kp, 1, 0, &l2, locs, &bad), KVD_OK);
    assert_int_equal(usage(s, a).pins, 4);
    assert_int_equal(usage(s, a).leases, 2);
    /* a third lease: a read is refused, a write's keys get NO_SPACE */
    assert_int_equal(kvd_store_release(s, OWN_A, l2), KVD_OK);
    assert_int_equal(kvd_store_acquire(s, OWN_A, na, kp, 1, 0, &l2, locs, &bad), KVD_OK);
    key_t32 nk;
    mkkey(nk, 77);
    kvd_put_t item = {.key = nk};
    assert_int_equal(kvd_store_reserve(s, OWN_A, na, &item, 1, 0, &l3, res, locs),
                     KVD_OK);
    assert_int_equal(res[0], KVD_RESERVE_NO_SPACE);
    assert_int_equal(l3, 0);
    assert_int_equal(kvd_store_owner_gone(s, OWN_A), 2);
    kvd_tenant_usage_t u = usage(s, a);
    assert_int_equal(u.pins, 0);
    assert_int_equal(u.leases, 0);
    check_ok(s);
    kvd_store_destroy(s);
}

/* Namespaces without users and objects go; ids are never valid again. */
static void test_namespace_removal(void **state)
{
    (void)state;
    kvd_store_t *s = mk();
    kvd_tenant_limits_t lim = {.max_namespaces = 2};
    uint32_t a = tenant(s, "alpha", lim);
    uint32_t n1 = reg_for(s, a, OWN_A, "one");
    assert_int_equal(reg_for(s, a, OWN_B, "one"), n1); /* a second user */
    uint32_t n2 = reg_for(s, a, OWN_A, "two");
    uint32_t id;
    assert_int_equal(kvd_store_ns_register(s, a, OWN_A, "three", PAGE, false, &id),
                     KVD_ERR_QUOTA);
    uint8_t res[4];
    assert_int_equal(put_chain(s, OWN_A, n2, 1, 2, res), 2);
    assert_int_equal(kvd_store_ns_count(s), 2);
    kvd_store_owner_gone(s, OWN_A);
    /* "one" still has B; "two" still has objects */
    assert_int_equal(kvd_store_ns_count(s), 2);
    kvd_store_owner_gone(s, OWN_B);
    assert_int_equal(kvd_store_ns_count(s), 1);
    kvd_ns_info_t info;
    assert_int_equal(kvd_store_ns_info(s, n1, &info), KVD_ERR_NOT_FOUND);
    assert_int_equal(stats(s).namespaces_removed, 1);
    assert_int_equal(usage(s, a).namespaces, 1);
    /* its last object gone, "two" goes too */
    uint64_t ev, sk;
    assert_int_equal(kvd_store_evict_ns(s, n2, &ev, &sk), KVD_OK);
    assert_int_equal(ev, 2);
    assert_int_equal(kvd_store_ns_count(s), 0);
    assert_int_equal(kvd_store_ns_info(s, n2, &info), KVD_ERR_NOT_FOUND);
    check_ok(s);
    /* a stale id answers NOT_FOUND everywhere */
    key_t32 k;
    mkkey(k, 1);
    kvd_put_t item = {.key = k};
    uint64_t lease;
    kvd_loc_t loc;
    size_t bad;
    assert_int_equal(kvd_store_reserve(s, OWN_A, n2, &item, 1, 0, &lease, res, &loc),
                     KVD_ERR_NOT_FOUND);
    assert_int_equal(kvd_store_acquire(s, OWN_A, n2,
                                       (const uint8_t(*)[KVD_KEY_BYTES]) & k, 1, 0,
                                       &lease, &loc, &bad),
                     KVD_ERR_NOT_FOUND);
    kvd_obj_info_t oi;
    assert_int_equal(kvd_store_inspect(s, n2, k, &oi), KVD_ERR_NOT_FOUND);
    /* the quota counts live namespaces only */
    uint32_t again = reg_for(s, a, OWN_A, "one");
    reg_for(s, a, OWN_A, "four");
    assert_int_not_equal(again, n1);
    kvd_store_owner_gone(s, OWN_A);
    assert_int_equal(kvd_store_ns_count(s), 0);
    check_ok(s);
    kvd_store_destroy(s);
}

/* Once every slot was used, freed slots serve again under new ids: an id
 * of the namespace removed from a slot never names its successor. */
static void test_id_reuse(void **state)
{
    (void)state;
    kvd_store_t *s = mk();
    static uint32_t ids[KVD_STORE_MAX_NAMESPACES];
    char name[32];
    for (uint32_t i = 0; i < KVD_STORE_MAX_NAMESPACES; i++) {
        snprintf(name, sizeof(name), "ns-%u", i);
        ids[i] = reg_for(s, KVD_TENANT_DEFAULT, 1000 + i, name);
    }
    uint32_t id;
    assert_int_equal(
        kvd_store_ns_register(s, KVD_TENANT_DEFAULT, 1, "more", PAGE, false, &id),
        KVD_ERR_NO_SPACE);
    /* the table no longer fills for ever: users gone, slots come back */
    for (uint32_t i = 0; i < 16; i++)
        kvd_store_owner_gone(s, 1000 + i);
    assert_int_equal(kvd_store_ns_count(s), KVD_STORE_MAX_NAMESPACES - 16);
    for (uint32_t i = 0; i < 16; i++) {
        snprintf(name, sizeof(name), "new-%u", i);
        id = reg_for(s, KVD_TENANT_DEFAULT, 5000, name);
        for (uint32_t k = 0; k < 16; k++)
            assert_int_not_equal(id, ids[k]);
        /* the slot is the oldest freed, its old id dead */
        assert_int_equal(id & (KVD_STORE_MAX_NAMESPACES - 1),
                         ids[i] & (KVD_STORE_MAX_NAMESPACES - 1));
        kvd_ns_info_t info;
        assert_int_equal(kvd_store_ns_info(s, ids[i], &info), KVD_ERR_NOT_FOUND);
        assert_int_equal(kvd_store_ns_info(s, id, &info), KVD_OK);
        assert_string_equal(info.name, name);
    }
    uint32_t pos = 0, n = 0;
    while (kvd_store_ns_next(s, &pos, &id))
        n++;
    assert_int_equal(n, KVD_STORE_MAX_NAMESPACES);
    check_ok(s);
    kvd_store_destroy(s);
}

typedef struct scrubs {
    size_t n;
    uint64_t offset[8], bytes[8];
} scrubs_t;

static void on_scrub(void *arg, uint64_t offset, uint64_t bytes)
{
    scrubs_t *sc = arg;
    if (sc->n < 8) {
        sc->offset[sc->n] = offset;
        sc->bytes[sc->n] = bytes;
    }
    sc->n++;
}

/* An extent that held another tenant's object is zeroed before it is
 * handed out; one that held the tenant's own, or nothing, is not. */
static void test_scrub(void **state)
{
    (void)state;
    kvd_store_config_t cfg;
    kvd_store_config_default(&cfg, 2 * PAGE);
    cfg.evict_high = cfg.evict_low = 1.0;
    kvd_store_t *s = NULL;
    assert_int_equal(kvd_store_create(&cfg, &s), KVD_OK);
    scrubs_t sc = {0};
    kvd_store_set_scrub(s, on_scrub, &sc);
    kvd_tenant_limits_t none = {0};
    uint32_t a = tenant(s, "alpha", none), b = tenant(s, "beta", none);
    uint32_t na, nb;
    assert_int_equal(kvd_store_ns_register(s, a, OWN_A, "m/kv", 2 * PAGE, false, &na),
                     KVD_OK);
    assert_int_equal(kvd_store_ns_register(s, b, OWN_B, "m/kv", 2 * PAGE, false, &nb),
                     KVD_OK);
    uint8_t res[1];
    assert_int_equal(put_chain(s, OWN_A, na, 1, 1, res), 1);
    assert_int_equal(sc.n, 0); /* a fresh pool is zero */
    /* A again, into its own old extent: nothing to hide from itself */
    assert_int_equal(put_chain(s, OWN_A, na, 2, 1, res), 1); /* evicts key 1 */
    assert_int_equal(sc.n, 0);
    /* B into the extent of A's key 2 */
    assert_int_equal(put_chain(s, OWN_B, nb, 3, 1, res), 1);
    assert_int_equal(sc.n, 1);
    assert_int_equal(sc.offset[0], 0);
    assert_int_equal(sc.bytes[0], 2 * PAGE);
    assert_int_equal(stats(s).scrubbed_bytes, 2 * PAGE);
    check_ok(s);
    kvd_store_destroy(s);
}

/* The scrub covers the whole extent, not only the new object's bytes: the
 * pages' tail past object_bytes held the other tenant's bytes too, and the
 * extent is tagged the new tenant's once freed (found in review: a later
 * object of more bytes would have shown them). */
static void test_scrub_whole_extent(void **state)
{
    (void)state;
    kvd_store_config_t cfg;
    kvd_store_config_default(&cfg, 2 * PAGE);
    cfg.evict_high = cfg.evict_low = 1.0;
    kvd_store_t *s = NULL;
    assert_int_equal(kvd_store_create(&cfg, &s), KVD_OK);
    scrubs_t sc = {0};
    kvd_store_set_scrub(s, on_scrub, &sc);
    kvd_tenant_limits_t none = {0};
    uint32_t a = tenant(s, "alpha", none), b = tenant(s, "beta", none);
    uint32_t na, nb;
    assert_int_equal(kvd_store_ns_register(s, a, OWN_A, "m/kv", 2 * PAGE, false, &na),
                     KVD_OK);
    /* B's objects take two pages but fill only one and 100 bytes of them */
    assert_int_equal(kvd_store_ns_register(s, b, OWN_B, "m/kv", PAGE + 100, false, &nb),
                     KVD_OK);
    uint8_t res[1];
    assert_int_equal(put_chain(s, OWN_A, na, 1, 1, res), 1);
    assert_int_equal(put_chain(s, OWN_B, nb, 2, 1, res), 1); /* evicts A's key 1 */
    assert_int_equal(sc.n, 1);
    assert_int_equal(sc.offset[0], 0);
    assert_int_equal(sc.bytes[0], 2 * PAGE);
    assert_int_equal(stats(s).scrubbed_bytes, 2 * PAGE);
    check_ok(s);
    kvd_store_destroy(s);
}

/* One Reserve zeroes its first crossing extent and then at most the
 * budget: the daemon's loop is never held for a whole batch of them. */
static void test_scrub_budget(void **state)
{
    (void)state;
    kvd_store_config_t cfg;
    kvd_store_config_default(&cfg, 8 * PAGE);
    cfg.evict_high = cfg.evict_low = 1.0;
    cfg.scrub_budget_bytes = 2 * PAGE;
    kvd_store_t *s = NULL;
    assert_int_equal(kvd_store_create(&cfg, &s), KVD_OK);
    scrubs_t sc = {0};
    kvd_store_set_scrub(s, on_scrub, &sc);
    kvd_tenant_limits_t none = {0};
    uint32_t a = tenant(s, "alpha", none), b = tenant(s, "beta", none);
    uint32_t na = reg_for(s, a, OWN_A, "m/kv"), nb = reg_for(s, b, OWN_B, "m/kv");
    uint8_t res[8];
    assert_int_equal(put_chain(s, OWN_A, na, 1, 8, res), 8);
    uint64_t ev, sk;
    assert_int_equal(kvd_store_evict_tenant(s, a, &ev, &sk), KVD_OK);
    assert_int_equal(ev, 8);
    /* all of the pool held A's bytes: B gets 2 keys scrubbed, then NO_SPACE */
    assert_int_equal(put_chain(s, OWN_B, nb, 100, 4, res), 2);
    assert_int_equal(sc.n, 2);
    assert_int_equal(res[0], KVD_RESERVE_ALLOCATED);
    assert_int_equal(res[1], KVD_RESERVE_ALLOCATED);
    assert_int_equal(res[2], KVD_RESERVE_NO_SPACE);
    assert_int_equal(res[3], KVD_RESERVE_NO_SPACE);
    /* the next call goes on */
    assert_int_equal(put_chain(s, OWN_B, nb, 102, 2, res), 2);
    assert_int_equal(sc.n, 4);
    assert_int_equal(stats(s).scrubbed_bytes, 4 * PAGE);
    check_ok(s);
    kvd_store_destroy(s);
}

/* A dead writer's quarantined extent counts against its tenant until it
 * is freed, and the tag it keeps survives its namespace's removal. */
static void test_quarantine_charged(void **state)
{
    (void)state;
    kvd_store_t *s = mk();
    kvd_tenant_limits_t none = {0};
    uint32_t a = tenant(s, "alpha", none);
    uint32_t na = reg_for(s, a, OWN_A, "m/kv");
    key_t32 k;
    mkkey(k, 1);
    kvd_put_t item = {.key = k};
    uint64_t lease;
    uint8_t res[1];
    kvd_loc_t loc;
    assert_int_equal(kvd_store_reserve(s, OWN_A, na, &item, 1, 0, &lease, res, &loc),
                     KVD_OK);
    assert_int_equal(res[0], KVD_RESERVE_ALLOCATED);
    kvd_store_owner_gone(s, OWN_A);
    assert_int_equal(kvd_store_ns_count(s), 0); /* no user, no object */
    assert_int_equal(usage(s, a).bytes, PAGE);
    check_ok(s);
    kvd_store_expire(s, 1000000); /* past every TTL and grace */
    assert_int_equal(usage(s, a).bytes, 0);
    check_ok(s);
    kvd_store_destroy(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_same_name_two_tenants),
        cmocka_unit_test(test_byte_quota_evicts_own),
        cmocka_unit_test(test_byte_quota_all_pinned),
        cmocka_unit_test(test_pin_and_lease_quota),
        cmocka_unit_test(test_namespace_removal),
        cmocka_unit_test(test_id_reuse),
        cmocka_unit_test(test_scrub),
        cmocka_unit_test(test_scrub_whole_extent),
        cmocka_unit_test(test_scrub_budget),
        cmocka_unit_test(test_quarantine_charged),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
