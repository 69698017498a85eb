/*
 * Description: rank-replicated namespaces stored once per cluster
 * (kvdockd --cluster-once, issue 15), three daemons in three network
 * namespaces: A = node-0 and C = node-1 with a --cluster-once pattern that
 * matches the test's kv namespaces, B = node-2 without:
 * (a) a chain of 8 pages of a rank-replicated namespace published on C;
 *     once the directory knows it, a Reserve of the same keys on A answers
 *     EXISTS for every one (nothing is written twice), bounded wait;
 * (b) a Lookup on A then restores the whole chain, and an Acquire on A
 *     (asked again while it answers in progress, bounded) pins all 8,
 *     whose bytes in A's pool are what C's writer wrote (the remote load
 *     brought them);
 * (c) a namespace that is not rank-replicated is written on A as usual:
 *     its Reserve allocates, whatever C holds under the same keys;
 * (d) without --cluster-once (on B), the same Reserve allocates: the local
 *     copy is the default.
 */
#include "cluster.h"
#include "test_store_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PAGES     8
#define PAGE_SIZE 16
#define A         0
#define C         1
#define B         2
#define WAIT_MS   30000
#define RR_NS     "m/kv/all" /* rank-replicated: matches */
#define PLAIN_NS  "m/kv/tp0" /* per rank: never stored once */

static kc_cluster_t cl;
static kvd_key_t keys[PAGES];

static kvd_ns_spec_t spec_of(const char *name, bool replicated)
{
    kvd_ns_spec_t s = ts_spec(name, TS_KV_BYTES);
    s.rank_replicated = replicated;
    return s;
}

static void publish_on_c(void)
{
    kvd_ns_spec_t specs[2] = {spec_of(RR_NS, true), spec_of(PLAIN_NS, false)};
    for (int n = 0; n < 2; n++)
        ts_put_chain(cl.node[C].socket, &specs[n], keys, PAGES, 5, "publish on C");
}

/* Reserves the chain in namespace index n of t; counts results of kind
 * want; revokes what it allocated. */
static size_t reserve_count(ts_client_t *t, size_t n, unsigned want)
{
    kvd_put_item_t items[PAGES];
    ts_chain_items(keys, PAGES, NULL, 0, items);
    uint64_t lease = 0, offsets[PAGES];
    uint8_t results[PAGES];
    ts_err_t err;
    if (ts_reserve(t->c, t->ns[n], TS_KV_BYTES, items, PAGES, &lease, results, offsets,
                   &err) != KVD_OK)
        return SIZE_MAX;
    size_t k = 0;
    for (size_t i = 0; i < PAGES; i++)
        k += results[i] == want;
    if (lease != 0)
        ts_finish(t->c, KVD_METHOD_REVOKE, lease, NULL, 0, &err);
    return k;
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    int rc = kc_setup(&cl, 3, true);
    if (rc == KVD_TEST_SKIP)
        return KVD_TEST_SKIP;
    const char *once[] = {"--cluster-once", "*/kv/*", NULL};
    if (rc == 0 && ts_make_keys(7000, PAGES, PAGE_SIZE, keys) == 0 &&
        kc_node_start(&cl, A, true, once) == 0 &&
        kc_node_start(&cl, C, true, once) == 0 &&
        kc_node_start(&cl, B, true, NULL) == 0 &&
        DT_CHECK(kc_wait_members(&cl, 0x7u, KC_READY_MS, NULL, NULL),
                 "three members, one epoch")) {
        publish_on_c();
        kvd_ns_spec_t specs[2] = {spec_of(RR_NS, true), spec_of(PLAIN_NS, false)};
        ts_client_t a, b;
        if (ts_open(&a, cl.node[A].socket, specs, 2, true) == 0) {
            /* (a) the announcement is asynchronous: bounded poll */
            uint64_t t0 = kc_now_ms();
            size_t exists = 0;
            while (kc_now_ms() < t0 + WAIT_MS &&
                   (exists = reserve_count(&a, 0, KVD_RESERVE_EXISTS)) != PAGES)
                kvd_sleep_ns(100000000);
            DT_CHECK(exists == PAGES, "(a) Reserve on A: %zu of %d keys exist, want all",
                     exists, PAGES);
            /* (b) */
            kvd_lookup_pool_msg_t pool = {.ns = a.ns[0], .n_keys = PAGES, .keys = keys};
            uint32_t bnd[PAGES];
            size_t nb = 0;
            ts_err_t err;
            DT_CHECK(ts_lookup(a.c, &pool, 1, bnd, PAGES, &nb, &err) == KVD_OK &&
                         nb == PAGES && bnd[PAGES - 1] == PAGES,
                     "(b) Lookup on A: %zu boundaries (%s)", nb, err.text);
            uint64_t lease = 0, offsets[PAGES];
            int arc = KVD_INPROGRESS;
            t0 = kc_now_ms();
            while (kc_now_ms() < t0 + WAIT_MS &&
                   (arc = ts_acquire(a.c, a.ns[0], TS_KV_BYTES, keys, PAGES, &lease,
                                     offsets, &err)) == KVD_INPROGRESS)
                kvd_sleep_ns(5000000);
            if (DT_CHECK(arc == KVD_OK, "(b) Acquire on A: %d %s", arc, err.text)) {
                for (size_t i = 0; i < PAGES; i++) {
                    size_t bad =
                        a.pool && ts_in_pool(offsets[i], TS_KV_BYTES, a.pool_bytes)
                            ? ts_verify(a.pool + offsets[i], TS_KV_BYTES, keys[i], 5)
                            : 0;
                    DT_CHECK(bad == SIZE_MAX, "(b) page %zu on A differs at byte %zu", i,
                             bad);
                }
                printf("(b) the chain stored once, on C, loaded on A after %llu ms\n",
                       (unsigned long long)(kc_now_ms() - t0));
                ts_release(a.c, lease, &err);
            }
            /* (c) */
            size_t alloc = reserve_count(&a, 1, KVD_RESERVE_ALLOCATED);
            DT_CHECK(alloc == PAGES, "(c) a per-rank namespace on A: %zu of %d allocated",
                     alloc, PAGES);
            ts_close(&a);
        }
        /* (d) */
        if (ts_open(&b, cl.node[B].socket, specs, 2, true) == 0) {
            size_t alloc = reserve_count(&b, 0, KVD_RESERVE_ALLOCATED);
            DT_CHECK(alloc == PAGES, "(d) B without --cluster-once: %zu of %d allocated",
                     alloc, PAGES);
            ts_close(&b);
        }
    }
    kc_teardown(&cl);
    return dt_exit_status("cluster/cluster_once");
}
