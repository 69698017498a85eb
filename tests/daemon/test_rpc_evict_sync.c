/*
 * Description: an operator's Evict of objects on the SSD tier, served by
 * the store's RPC method (kvd_rpc_store_serve, called directly against an
 * in-memory store with a tier in a temporary directory). Its reply comes
 * after one sync of the tier's dead-list (the tombstones that keep the
 * evicted records from coming back after a power loss); when that sync
 * fails, the reply is an error that says so, the objects are gone from the
 * index all the same, and the next Evict's sync covers the tombstones the
 * failed one left behind.
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

#include "rpc_store.h"
#include "store_testing.h"

#define POOL_BYTES (1u << 20) /* 16 objects */
#define OBJ_BYTES  (64u << 10)
#define SEG_BYTES  (256u << 10)
#define N_OBJ      24 /* more than the pool holds: the first ones spill */

static char dir[64];
static uint8_t *pool;
static kvd_store_t *store;
static uint32_t ns;
static kvd_opts_t opts;
static kvd_msg_t rep;
static const kvd_rpc_ctx_t op = {.conn_id = 7, .is_operator = true};

static void key_of(kvd_key_t k, uint32_t n)
{
    memset(k, 0, KVD_KEY_BYTES);
    memcpy(k, &n, sizeof(n));
    k[31] = 0x5e;
}

/* Where object n is: 0 absent, 1 in DRAM, 2 on the tier. */
static int where_of(uint32_t n)
{
    kvd_key_t k;
    kvd_obj_info_t info;
    key_of(k, n);
    if (kvd_store_inspect(store, ns, k, &info) != KVD_OK)
        return 0;
    return info.tier == KVD_TIER_SSD ? 2 : 1;
}

static uint64_t dead_syncs(void)
{
    kvd_store_stats_t st;
    kvd_store_stats(store, &st);
    return st.ssd_dead_syncs;
}

static int setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof(dir), "/tmp/kvd-evsync-XXXXXX");
    if (mkdtemp(dir) == NULL)
        return -1;
    pool =
        mmap(NULL, POOL_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (pool == MAP_FAILED)
        return -1;
    kvd_store_config_t cfg;
    kvd_store_config_default(&cfg, POOL_BYTES);
    cfg.evict_high = 0.80;
    cfg.evict_low = 0.60;
    if (kvd_store_create(&cfg, &store) != KVD_OK)
        return -1;
    kvd_tier_opts_t o = {
        .dir = dir,
        .size_bytes = 16u * SEG_BYTES,
        .segment_bytes = SEG_BYTES,
        .io_path = 2, /* pread/pwrite: the dead-list's sync is the same on both */
        .queue_depth = 8,
        .pool_base = pool,
        .pool_bytes = POOL_BYTES,
        .fresh = true};
    kvd_tier_recovery_t rec;
    char why[256] = "";
    if (kvd_store_tier_attach(store, &o, &rec, why, sizeof(why)) != KVD_OK) {
        fprintf(stderr, "tier: %s\n", why);
        return -1;
    }
    if (kvd_store_ns_register(store, KVD_TENANT_DEFAULT, 1, "kv", OBJ_BYTES, false,
                              &ns) != KVD_OK)
        return -1;
    memset(&opts, 0, sizeof(opts));
    opts.max_batch = 4096;
    opts.max_frame_bytes = 16u << 20;
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    kvd_msg_clear(&rep);
    kvd_store_destroy(store);
    munmap(pool, POOL_BYTES);
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    return system(cmd) == 0 ? 0 : -1;
}

/* Publishes N_OBJ objects; the coldest spill to the tier as the pool
 * fills. Returns how many are on the tier once the tier is idle. */
static int put_all(void)
{
    for (uint32_t n = 0; n < N_OBJ; n++) {
        kvd_key_t k;
        key_of(k, n);
        kvd_put_t it = {.key = k};
        uint64_t lease;
        uint8_t res;
        kvd_loc_t loc;
        assert_int_equal(kvd_store_reserve(store, 1, ns, &it, 1, 0, &lease, &res, &loc),
                         KVD_OK);
        assert_int_equal(res, KVD_RESERVE_ALLOCATED);
        memset(pool + loc.offset, (int)n, OBJ_BYTES);
        assert_int_equal(kvd_store_publish(store, 1, lease, NULL, 0), KVD_OK);
        kvd_store_tier_drain(store, 1000);
    }
    kvd_store_tier_drain(store, 2000);
    int on_tier = 0;
    for (uint32_t n = 0; n < N_OBJ; n++)
        on_tier += where_of(n) == 2;
    return on_tier;
}

static int evict_key(uint32_t n)
{
    kvd_msg_t req;
    kvd_msg_request(&req, 9, KVD_METHOD_EVICT);
    kvd_strlcpy(req.body.evict_req.ns_name, "kv", KVD_NS_NAME_BYTES);
    req.body.evict_req.has_key = true;
    key_of(req.body.evict_req.key, n);
    kvd_msg_clear(&rep);
    memset(&rep, 0, sizeof(rep));
    rep.id = req.id;
    rep.method = req.method;
    rep.reply = true;
    kvd_rpc_store_serve(store, &opts, &op, &req, &rep);
    return rep.status;
}

/* The first spilled object's Evict with its dead-list sync failing: an
 * IO error naming the dead-list, the object absent anyway; the next
 * Evict syncs (and so covers) both tombstones and answers OK. */
static void test_evict_reply_says_its_sync_failed(void **state)
{
    (void)state;
    assert_true(put_all() >= 2);
    uint32_t a = UINT32_MAX, b = UINT32_MAX;
    for (uint32_t n = 0; n < N_OBJ && b == UINT32_MAX; n++)
        if (where_of(n) == 2) {
            if (a == UINT32_MAX)
                a = n;
            else
                b = n;
        }
    /* no sync round may make the tombstones durable behind the Evicts' backs */
    kvd_store_tier_hold_syncs(store, true);
    uint64_t d0 = dead_syncs();
    kvd_store_tier_fail_dead_syncs(store, 1);
    assert_int_equal(evict_key(a), KVD_ERR_IO);
    assert_non_null(strstr(rep.error, "dead-list could not be synced"));
    assert_non_null(strstr(rep.error, "after a power loss"));
    assert_int_equal(where_of(a), 0); /* gone from the index all the same */
    assert_int_equal(dead_syncs(), d0 + 1);
    /* the failed sync left its tombstone not durable: the next one retries */
    assert_int_equal(evict_key(b), KVD_OK);
    assert_int_equal(rep.body.evict_rep.evicted, 1);
    assert_int_equal(dead_syncs(), d0 + 2);
    assert_int_equal(where_of(b), 0);
    /* nothing new: no sync, no error */
    assert_int_equal(kvd_store_tier_sync_dead(store), KVD_OK);
    assert_int_equal(dead_syncs(), d0 + 2);
    kvd_store_tier_hold_syncs(store, false);
    char why[256];
    assert_int_equal(kvd_store_check(store, why, sizeof(why)), KVD_OK);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_evict_reply_says_its_sync_failed, setup,
                                        teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
