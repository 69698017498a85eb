/*
 * Description: the store's RPC methods across tenants, called directly
 * (kvd_rpc_store_serve) with crafted connection contexts against an
 * in-memory store. Each test is one attack of issue 11 item 3 by tenant
 * "mallory" on tenant "alice": listing her namespaces and keys, acquiring,
 * reserving (to publish) in her namespace, evicting her objects, probing
 * her ids, filling the pool or the namespace table. An id or name of
 * alice's answers mallory exactly as one that does not exist.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "rpc_store.h"

#define PAGE 4096u
#define POOL (256u * PAGE)

static kvd_store_t *store;
static kvd_opts_t opts;
static kvd_msg_t rep;
static uint32_t t_alice, t_mallory;
static const kvd_rpc_ctx_t *alice, *mallory, *op;
static kvd_rpc_ctx_t ctx_alice, ctx_mallory, ctx_op;

static int setup(void **state)
{
    (void)state;
    kvd_store_config_t cfg;
    kvd_store_config_default(&cfg, POOL);
    if (kvd_store_create(&cfg, &store) != KVD_OK)
        return -1;
    memset(&opts, 0, sizeof(opts));
    opts.max_batch = 4096;
    opts.max_frame_bytes = 16u << 20;
    kvd_tenant_limits_t none = {0};
    kvd_tenant_limits_t small = {.max_bytes = 16 * PAGE, .max_namespaces = 8};
    if (kvd_store_tenant_add(store, "alice", &none, &t_alice) != KVD_OK ||
        kvd_store_tenant_add(store, "mallory", &small, &t_mallory) != KVD_OK)
        return -1;
    ctx_alice = (kvd_rpc_ctx_t){.conn_id = 1, .tenant = t_alice};
    ctx_mallory = (kvd_rpc_ctx_t){.conn_id = 2, .tenant = t_mallory};
    ctx_op =
        (kvd_rpc_ctx_t){.conn_id = 3, .tenant = KVD_TENANT_DEFAULT, .is_operator = true};
    alice = &ctx_alice;
    mallory = &ctx_mallory;
    op = &ctx_op;
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    kvd_msg_clear(&rep);
    kvd_store_destroy(store);
    return 0;
}

/* Serves req for ctx into rep (cleared first); returns the status. */
static int call(const kvd_rpc_ctx_t *ctx, kvd_msg_t *req)
{
    kvd_msg_clear(&rep);
    memset(&rep, 0, sizeof(rep));
    rep.id = req->id;
    rep.method = req->method;
    rep.reply = true;
    kvd_rpc_store_serve(store, &opts, ctx, req, &rep);
    return rep.status;
}

static void key(kvd_key_t k, uint32_t n)
{
    memset(k, 0, KVD_KEY_BYTES);
    memcpy(k, &n, sizeof(n));
    k[31] = 0xa1;
}

static uint32_t reg(const kvd_rpc_ctx_t *ctx, const char *name)
{
    kvd_ns_spec_t spec = {.object_bytes = PAGE};
    kvd_strlcpy(spec.name, name, sizeof(spec.name));
    kvd_msg_t req;
    kvd_msg_request(&req, 1, KVD_METHOD_REGISTER_NAMESPACE);
    req.body.register_req = (kvd_register_req_t){.n = 1, .namespaces = &spec};
    assert_int_equal(call(ctx, &req), KVD_OK);
    assert_int_equal(rep.body.register_rep.n, 1);
    return rep.body.register_rep.ids[0];
}

/* Reserves keys first.. (a chain) in ns; returns the status, results in
 * res and the lease in *lease. */
static int reserve(const kvd_rpc_ctx_t *ctx, uint32_t ns, uint32_t first, size_t n,
                   uint64_t *lease, uint8_t *res)
{
    kvd_put_item_t items[64];
    assert_true(n <= 64);
    memset(items, 0, sizeof(items));
    for (size_t i = 0; i < n; i++) {
        key(items[i].key, first + (uint32_t)i);
        if (i > 0) {
            memcpy(items[i].parent, items[i - 1].key, KVD_KEY_BYTES);
            items[i].has_parent = true;
        }
        items[i].depth = (uint32_t)i;
    }
    kvd_msg_t req;
    kvd_msg_request(&req, 2, KVD_METHOD_RESERVE);
    req.body.reserve_req = (kvd_reserve_req_t){.ns = ns, .n = n, .items = items};
    int st = call(ctx, &req);
    if (st == KVD_OK) {
        *lease = rep.body.reserve_rep.lease_id;
        memcpy(res, rep.body.reserve_rep.results, n);
    }
    return st;
}

static int finish(const kvd_rpc_ctx_t *ctx, kvd_method_t m, uint64_t lease)
{
    kvd_msg_t req;
    kvd_msg_request(&req, 3, m);
    if (m == KVD_METHOD_RELEASE)
        req.body.release_req.lease_id = lease;
    else
        req.body.finish_req = (kvd_finish_req_t){.lease_id = lease};
    return call(ctx, &req);
}

/* Stores keys first..first+n-1 in ns for ctx. */
static void put(const kvd_rpc_ctx_t *ctx, uint32_t ns, uint32_t first, size_t n)
{
    uint64_t lease = 0;
    uint8_t res[64];
    assert_int_equal(reserve(ctx, ns, first, n, &lease, res), KVD_OK);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(res[i], KVD_RESERVE_ALLOCATED);
    assert_int_equal(finish(ctx, KVD_METHOD_PUBLISH, lease), KVD_OK);
}

static int acquire(const kvd_rpc_ctx_t *ctx, uint32_t ns, uint32_t first, size_t n,
                   uint64_t *lease)
{
    kvd_key_t keys[64];
    for (size_t i = 0; i < n; i++)
        key(keys[i], first + (uint32_t)i);
    kvd_msg_t req;
    kvd_msg_request(&req, 4, KVD_METHOD_ACQUIRE);
    req.body.acquire_req = (kvd_acquire_req_t){.ns = ns, .n = n, .keys = keys};
    int st = call(ctx, &req);
    if (st == KVD_OK && lease)
        *lease = rep.body.acquire_rep.lease_id;
    return st;
}

static int lookup(const kvd_rpc_ctx_t *ctx, uint32_t ns, uint32_t first, size_t n)
{
    kvd_key_t keys[64];
    for (size_t i = 0; i < n; i++)
        key(keys[i], first + (uint32_t)i);
    kvd_lookup_pool_msg_t pool = {.ns = ns, .n_keys = n, .keys = keys};
    kvd_msg_t req;
    kvd_msg_request(&req, 5, KVD_METHOD_LOOKUP);
    req.body.lookup_req = (kvd_lookup_req_t){.n_pools = 1, .pools = &pool};
    return call(ctx, &req);
}

static int evict(const kvd_rpc_ctx_t *ctx, const char *ns_name, const kvd_key_t *k,
                 bool all)
{
    kvd_msg_t req;
    kvd_msg_request(&req, 6, KVD_METHOD_EVICT);
    kvd_evict_req_t *e = &req.body.evict_req;
    kvd_strlcpy(e->ns_name, ns_name, sizeof(e->ns_name));
    e->all = all;
    if (k != NULL) {
        e->has_key = true;
        memcpy(e->key, *k, KVD_KEY_BYTES);
    }
    return call(ctx, &req);
}

static int inspect(const kvd_rpc_ctx_t *ctx, const char *ns_name, uint32_t n)
{
    kvd_msg_t req;
    kvd_msg_request(&req, 7, KVD_METHOD_INSPECT);
    kvd_strlcpy(req.body.inspect_req.ns_name, ns_name, KVD_NS_NAME_BYTES);
    key(req.body.inspect_req.key, n);
    return call(ctx, &req);
}

static int list(const kvd_rpc_ctx_t *ctx, const char *ns_name)
{
    kvd_msg_t req;
    kvd_msg_request(&req, 8, KVD_METHOD_LIST_PREFIXES);
    kvd_strlcpy(req.body.list_req.ns_name, ns_name, KVD_NS_NAME_BYTES);
    req.body.list_req.nodes = true;
    return call(ctx, &req);
}

/* The error text of an id nobody was ever given, for comparison. */
static void unknown_text(int (*probe)(uint32_t), char *out, size_t len)
{
    assert_int_equal(probe(0x7ffffffe), KVD_ERR_NOT_FOUND);
    snprintf(out, len, "%s", rep.error);
}

/* Replaces the decimal id in an error text by '#', so that texts about two
 * ids compare. */
static void strip_ids(char *t)
{
    char *w = t;
    for (const char *r = t; *r; r++) {
        if (*r >= '0' && *r <= '9') {
            if (w == t || w[-1] != '#')
                *w++ = '#';
        } else {
            *w++ = *r;
        }
    }
    *w = '\0';
}

static uint32_t alice_kv;

static int probe_acquire(uint32_t ns)
{
    return acquire(mallory, ns, 1, 1, NULL);
}

/* Attack: Acquire (and so read) in any namespace. */
static void test_acquire_foreign(void **state)
{
    (void)state;
    alice_kv = reg(alice, "llama/kv/tp0");
    put(alice, alice_kv, 1, 4);
    uint64_t l = 0;
    assert_int_equal(acquire(alice, alice_kv, 1, 4, &l), KVD_OK);
    assert_int_equal(finish(alice, KVD_METHOD_RELEASE, l), KVD_OK);

    char want[KVD_ERROR_MAX];
    unknown_text(probe_acquire, want, sizeof(want));
    strip_ids(want);
    assert_int_equal(acquire(mallory, alice_kv, 1, 4, NULL), KVD_ERR_NOT_FOUND);
    char got[KVD_ERROR_MAX];
    snprintf(got, sizeof(got), "%s", rep.error);
    strip_ids(got);
    assert_string_equal(got, want); /* no tell between foreign and unknown */
    /* nor does Lookup answer */
    assert_int_equal(lookup(mallory, alice_kv, 1, 4), KVD_ERR_NOT_FOUND);
    assert_int_equal(lookup(alice, alice_kv, 1, 4), KVD_OK);
    assert_int_equal(rep.body.lookup_rep.n, 4);
}

/* Attack: Publish any key in any namespace (Reserve is its first step),
 * and serve stale bytes under it. */
static void test_publish_foreign(void **state)
{
    (void)state;
    uint64_t lease = 0;
    uint8_t res[4];
    assert_int_equal(reserve(mallory, alice_kv, 100, 2, &lease, res), KVD_ERR_NOT_FOUND);
    /* the same name in mallory's tenant is a namespace of her own */
    uint32_t mine = reg(mallory, "llama/kv/tp0");
    assert_int_not_equal(mine, alice_kv);
    assert_int_equal(reserve(mallory, mine, 1, 1, &lease, res), KVD_OK);
    assert_int_equal(res[0], KVD_RESERVE_ALLOCATED); /* alice's key 1 is not hers */
    assert_int_equal(finish(mallory, KVD_METHOD_PUBLISH, lease), KVD_OK);
    /* alice's object is untouched and hers alone */
    assert_int_equal(inspect(alice, "llama/kv/tp0", 1), KVD_OK);
    assert_int_equal(rep.body.inspect_rep.n_objects, 1);
    assert_int_equal(rep.body.inspect_rep.objects[0].ns, alice_kv);
}

/* Attack: list every namespace and key. */
static void test_list_foreign(void **state)
{
    (void)state;
    assert_int_equal(list(mallory, ""), KVD_OK);
    kvd_list_rep_t *l = &rep.body.list_rep;
    for (size_t i = 0; i < l->n_namespaces; i++)
        assert_int_not_equal(l->namespaces[i].id, alice_kv);
    for (size_t i = 0; i < l->n_nodes; i++)
        assert_int_not_equal(l->nodes[i].ns, alice_kv);
    assert_int_equal(l->n_nodes, 1); /* her own one page */
    /* alice sees her four; the operator sees both tenants' */
    assert_int_equal(list(alice, ""), KVD_OK);
    assert_int_equal(rep.body.list_rep.n_nodes, 4);
    assert_int_equal(list(op, ""), KVD_OK);
    assert_int_equal(rep.body.list_rep.n_nodes, 5);
    /* Inspect of alice's key answers as a key never stored */
    assert_int_equal(inspect(mallory, "", 2), KVD_ERR_NOT_FOUND);
    /* the Stats table: her namespaces only */
    kvd_ns_msg_t *t = NULL;
    size_t n = 0;
    kvd_msg_clear(&rep);
    assert_int_equal(kvd_rpc_ns_table(store, mallory, &rep, &t, &n), KVD_OK);
    assert_int_equal(n, 1);
    assert_int_not_equal(t[0].id, alice_kv);
    assert_string_equal(t[0].tenant, "mallory");
    /* and the tenants table: hers, with her usage; every one for operators */
    kvd_tenant_msg_t *tt = NULL;
    assert_int_equal(kvd_rpc_tenant_table(store, mallory, &rep, &tt, &n), KVD_OK);
    assert_int_equal(n, 1);
    assert_string_equal(tt[0].name, "mallory");
    assert_int_equal(tt[0].bytes, PAGE);
    assert_int_equal(tt[0].max_bytes, 16 * PAGE);
    assert_int_equal(tt[0].namespaces, 1);
    assert_int_equal(kvd_rpc_tenant_table(store, op, &rep, &tt, &n), KVD_OK);
    assert_int_equal(n, 3);
}

/* Attack: Evict everything. */
static void test_evict_foreign(void **state)
{
    (void)state;
    kvd_key_t k;
    key(k, 2);
    assert_int_equal(evict(mallory, "", &k, false), KVD_ERR_NOT_FOUND);
    assert_int_equal(evict(mallory, "llama/kv/tp0", &k, false), KVD_ERR_NOT_FOUND);
    /* "all" of a tenant is its own objects */
    assert_int_equal(evict(mallory, "", NULL, true), KVD_OK);
    assert_int_equal(rep.body.evict_rep.evicted, 1);
    assert_int_equal(lookup(alice, alice_kv, 1, 4), KVD_OK);
    assert_int_equal(rep.body.lookup_rep.n, 4);
    /* a name of only another tenant's is unknown to her */
    reg(alice, "alice/only");
    assert_int_equal(evict(mallory, "alice/only", NULL, false), KVD_ERR_NOT_FOUND);
    assert_string_equal(rep.error, "unknown namespace 'alice/only'");
}

/* Attack: another connection's lease, and telling live ids from dead. */
static void test_foreign_lease(void **state)
{
    (void)state;
    uint64_t lease = 0;
    uint8_t res[1];
    assert_int_equal(reserve(alice, alice_kv, 50, 1, &lease, res), KVD_OK);
    assert_int_equal(finish(mallory, KVD_METHOD_PUBLISH, lease), KVD_ERR_NOT_FOUND);
    char live[KVD_ERROR_MAX];
    snprintf(live, sizeof(live), "%s", rep.error);
    assert_int_equal(finish(mallory, KVD_METHOD_PUBLISH, lease + 1000),
                     KVD_ERR_NOT_FOUND);
    char dead[KVD_ERROR_MAX];
    snprintf(dead, sizeof(dead), "%s", rep.error);
    strip_ids(live);
    strip_ids(dead);
    assert_string_equal(live, dead);
    assert_int_equal(finish(alice, KVD_METHOD_REVOKE, lease), KVD_OK);
}

/* Attack: fill the pool (pin or write it all) so every other Reserve gets
 * NO_SPACE. Mallory's quota is 16 pages of a 256-page pool. */
static void test_fill_pool(void **state)
{
    (void)state;
    uint32_t mine = reg(mallory, "fill");
    uint64_t lease = 0;
    uint8_t res[64];
    size_t got = 0;
    for (uint32_t round = 0; round < 8; round++) {
        assert_int_equal(reserve(mallory, mine, 1000 + round * 64, 64, &lease, res),
                         KVD_OK);
        for (size_t i = 0; i < 64; i++)
            got += res[i] == KVD_RESERVE_ALLOCATED;
        /* held, never published: as pinning, it cannot be evicted */
    }
    assert_true(got <= 16);
    /* alice still writes */
    uint32_t more = reg(alice, "alice/more");
    put(alice, more, 1, 64);
}

/* Attack: fill the namespace table so no later model can register. */
static void test_fill_namespaces(void **state)
{
    (void)state;
    kvd_ns_spec_t specs[64];
    for (int i = 0; i < 64; i++) {
        specs[i] = (kvd_ns_spec_t){.object_bytes = PAGE};
        snprintf(specs[i].name, sizeof(specs[i].name), "junk/%d", i);
    }
    kvd_msg_t req;
    kvd_msg_request(&req, 9, KVD_METHOD_REGISTER_NAMESPACE);
    req.body.register_req = (kvd_register_req_t){.n = 64, .namespaces = specs};
    kvd_rpc_ctx_t burst = {.conn_id = 77, .tenant = t_mallory};
    assert_int_equal(call(&burst, &req), KVD_ERR_QUOTA);
    uint32_t before = kvd_store_ns_count(store);
    req.body.register_req.n = 4;
    assert_int_equal(call(&burst, &req), KVD_OK);
    assert_int_equal(kvd_store_ns_count(store), before + 4);
    /* the connection goes: its empty namespaces go with it */
    kvd_store_owner_gone(store, burst.conn_id);
    assert_int_equal(kvd_store_ns_count(store), before);
}

/* A read-only connection loads but never writes or evicts. */
static void test_read_only(void **state)
{
    (void)state;
    kvd_rpc_ctx_t ro = {.conn_id = 88, .tenant = t_alice, .read_only = true};
    uint64_t lease = 0;
    uint8_t res[1];
    assert_int_equal(reserve(&ro, alice_kv, 900, 1, &lease, res), KVD_ERR_PERMISSION);
    assert_int_equal(evict(&ro, "", NULL, true), KVD_ERR_PERMISSION);
    assert_int_equal(acquire(&ro, alice_kv, 1, 2, &lease), KVD_OK);
    assert_int_equal(finish(&ro, KVD_METHOD_RELEASE, lease), KVD_OK);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_acquire_foreign), cmocka_unit_test(test_publish_foreign),
        cmocka_unit_test(test_list_foreign),    cmocka_unit_test(test_evict_foreign),
        cmocka_unit_test(test_foreign_lease),   cmocka_unit_test(test_fill_pool),
        cmocka_unit_test(test_fill_namespaces), cmocka_unit_test(test_read_only),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
