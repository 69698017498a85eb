/*
 * Description: cluster membership through etcd (issue 15), three kvdockd
 * daemons in three network namespaces and one etcd:
 * (a) joined: each daemon's `kvdock cluster --json` says "ready", lists the
 *     same three members (by node id, sorted, with their advertise
 *     addresses and pool sizes, self only on itself) at the same epoch;
 *     node 2 has no --node-id, so its id is its advertise address;
 *     `health --json` says cluster "ready"; the table form exits 0 and
 *     names every member; 4 objects published on node 2 show in its
 *     "objects" as node-0 lists it (the heartbeat, a bounded wait);
 * (b) node-1 SIGKILLed (no chance to revoke its lease): it leaves the list
 *     of both others and the epoch rises; the wait is bounded by 4 x the
 *     TTL plus start-up slack and its measured length is printed, never
 *     asserted;
 * (c) node-1 restarted with the same node id: back in every list, at one
 *     epoch higher than the last;
 * (d) a daemon that was never in a cluster says "off" in health and in
 *     `kvdock cluster --json`.
 * Skips (77) where namespaces cannot be made or etcd is missing.
 */
#include "cluster.h"
#include "test_store_util.h"

#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static kc_cluster_t cl;
static char out[1 << 16];

#define ALL      0x7u
#define NO_NODE1 0x5u

/* Publishes 4 objects on node 2 (its Unix socket) and waits until node-0
 * lists node 2 with 4 objects. */
static void published_objects_show(void)
{
    enum { N = 4 };
    kvd_ns_spec_t spec = ts_spec(TS_KV_NS, TS_KV_BYTES);
    ts_client_t t;
    kvd_key_t keys[N];
    if (ts_make_keys(700, N, 16, keys) != 0 ||
        ts_open(&t, cl.node[2].socket, &spec, 1, true))
        return;
    kvd_put_item_t items[N];
    ts_chain_items(keys, N, NULL, 0, items);
    uint64_t lease = 0, offsets[N];
    uint8_t results[N];
    ts_err_t err;
    bool ok = DT_CHECK(ts_reserve(t.c, t.ns[0], TS_KV_BYTES, items, N, &lease, results,
                                  offsets, &err) == KVD_OK,
                       "(a) reserve on node 2: %s", err.text);
    for (size_t i = 0; ok && i < N; i++)
        if (t.pool && ts_in_pool(offsets[i], TS_KV_BYTES, t.pool_bytes))
            ts_fill(t.pool + offsets[i], TS_KV_BYTES, keys[i], 1);
    ok = ok && DT_CHECK(ts_publish(t.c, lease, keys, N, &err) == KVD_OK,
                        "(a) publish on node 2: %s", err.text);
    ts_close(&t);
    if (!ok)
        return;
    uint64_t t0 = kc_now_ms(), bound = 4ull * (uint64_t)cl.ttl_s * 1000 + 10000, seen = 0;
    while (kc_now_ms() < t0 + bound) {
        kc_view_t v;
        char why[512];
        seen = UINT64_MAX;
        if (kc_view(&cl, 0, &v, why, sizeof(why)) == 0)
            for (size_t k = 0; k < v.n; k++)
                if (strcmp(v.m[k].node, cl.node[2].node_id) == 0)
                    seen = v.m[k].objects;
        if (seen == N)
            break;
        kvd_sleep_ns(200000000);
    }
    if (DT_CHECK(seen == N, "(a) node-0 lists %s with %llu objects, want %d",
                 cl.node[2].node_id, (unsigned long long)seen, N))
        printf("(a) 4 objects published on %s listed by node-0 after %llu ms\n",
               cl.node[2].node_id, (unsigned long long)(kc_now_ms() - t0));
}

static void joined(uint64_t *epoch)
{
    uint64_t ms = 0;
    bool ok = kc_wait_members(&cl, ALL, KC_READY_MS, epoch, &ms);
    DT_CHECK(ok, "(a) three members, one epoch, on every daemon");
    if (!ok)
        return;
    printf("(a) three daemons agree on their members after %llu ms, epoch %llu\n",
           (unsigned long long)ms, (unsigned long long)*epoch);
    for (int i = 0; i < 3; i++) {
        char state[16] = "";
        DT_CHECK(kc_health_cluster(&cl, i, state, sizeof(state)) == 0 &&
                     strcmp(state, "ready") == 0,
                 "(a) %s health --json cluster '%s', want ready", cl.node[i].node_id,
                 state);
        kc_view_t v;
        char why[512];
        if (DT_CHECK(kc_view(&cl, i, &v, why, sizeof(why)) == 0, "(a) %s", why))
            for (size_t k = 0; k < v.n; k++)
                DT_CHECK(v.m[k].pool_bytes == DT_POOL_BYTES,
                         "(a) %s lists %s with pool_bytes %llu, want %llu",
                         cl.node[i].node_id, v.m[k].node,
                         (unsigned long long)v.m[k].pool_bytes,
                         (unsigned long long)DT_POOL_BYTES);
    }
    published_objects_show();
    int rc = kc_cli(&cl, 1, out, sizeof(out), (const char *[]){"cluster", NULL});
    DT_CHECK(rc == 0, "(a) kvdock cluster (table): exit %d", rc);
    for (int i = 0; i < 3; i++)
        DT_CHECK(strstr(out, cl.node[i].node_id) != NULL && strstr(out, cl.node[i].addr),
                 "(a) the table does not name %s at %s:\n%s", cl.node[i].node_id,
                 cl.node[i].addr, out);
}

static void killed_and_back(uint64_t epoch)
{
    /* SIGKILL: the lease is left to lapse, as for a crashed node */
    kc_node_stop(&cl, 1, SIGKILL, 5000, false);
    uint64_t bound = 4ull * (uint64_t)cl.ttl_s * 1000 + 10000, ms = 0, left_epoch = 0;
    bool ok = kc_wait_members(&cl, NO_NODE1, (int)bound, &left_epoch, &ms);
    DT_CHECK(ok, "(b) node-1 should leave the others' lists within %llu ms",
             (unsigned long long)bound);
    if (ok) {
        printf("(b) node-1 SIGKILLed: gone from both others' lists after %llu ms "
               "(TTL %d s), epoch %llu -> %llu\n",
               (unsigned long long)ms, cl.ttl_s, (unsigned long long)epoch,
               (unsigned long long)left_epoch);
        DT_CHECK(left_epoch > epoch,
                 "(b) the epoch should rise when a member leaves: %llu -> %llu",
                 (unsigned long long)epoch, (unsigned long long)left_epoch);
    }
    if (kc_node_start(&cl, 1, true, NULL) != 0)
        return;
    uint64_t back_epoch = 0;
    ok = kc_wait_members(&cl, ALL, KC_READY_MS, &back_epoch, &ms);
    DT_CHECK(ok, "(c) node-1 restarted should be back in every list");
    if (ok) {
        printf("(c) node-1 back in every list after %llu ms, epoch %llu\n",
               (unsigned long long)ms, (unsigned long long)back_epoch);
        DT_CHECK(back_epoch > left_epoch,
                 "(c) the epoch should rise when a member joins: %llu -> %llu",
                 (unsigned long long)left_epoch, (unsigned long long)back_epoch);
    }
}

/* (d) node 0 restarted without --cluster-etcd */
static void off(void)
{
    kc_node_stop(&cl, 0, SIGTERM, 10000, true);
    if (kc_node_start(&cl, 0, false, NULL) != 0)
        return;
    char state[16] = "";
    DT_CHECK(kc_health_cluster(&cl, 0, state, sizeof(state)) == 0 &&
                 strcmp(state, "off") == 0,
             "(d) health --json cluster '%s' without --cluster-etcd, want off", state);
    kc_view_t v;
    char why[512];
    if (DT_CHECK(kc_view(&cl, 0, &v, why, sizeof(why)) == 0, "(d) %s", why))
        DT_CHECK(strcmp(v.state, "off") == 0,
                 "(d) kvdock cluster --json state '%s', want off", v.state);
    /* and a clean SIGTERM took node-0 out of the others' lists at once (the
     * lease revoked), well within the TTL wait used for a SIGKILL */
    uint64_t ms = 0;
    bool ok = kc_wait_members(&cl, 0x6u, 4 * cl.ttl_s * 1000 + 10000, NULL, &ms);
    DT_CHECK(ok, "(d) node-0 stopped should leave the others' lists");
    if (ok)
        printf(
            "(d) node-0 stopped by SIGTERM: gone from the others' lists after %llu ms\n",
            (unsigned long long)ms);
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    int rc = kc_setup(&cl, 3, true);
    if (rc == KVD_TEST_SKIP)
        return KVD_TEST_SKIP;
    uint64_t epoch = 0;
    if (rc == 0)
        kc_node_default_id(&cl, 2);
    if (rc == 0 && kc_node_start(&cl, 0, true, NULL) == 0 &&
        kc_node_start(&cl, 1, true, NULL) == 0 &&
        kc_node_start(&cl, 2, true, NULL) == 0) {
        joined(&epoch);
        if (dt_failure_count() == 0) {
            killed_and_back(epoch);
            off();
        }
    }
    kc_teardown(&cl);
    return dt_exit_status("cluster/membership");
}
