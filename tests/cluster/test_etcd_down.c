/*
 * Description: etcd down and back (issue 15), three kvdockd daemons in
 * three network namespaces:
 * (a) joined: three members at one epoch, cluster "ready" everywhere;
 * (b) etcd SIGKILLed: every daemon's `health --json` says cluster
 *     "degraded" within a bounded wait (its length printed), while local
 *     serving goes on: on node-0 a chain is reserved, written, published
 *     and found by Lookup over its Unix socket, and Health answers over TCP;
 * (c) etcd restarted on the same data directory: cluster "ready" again on
 *     every daemon with the same three members, and node-0 still has the
 *     chain published while etcd was down.
 * Skips (77) where namespaces cannot be made or etcd is missing.
 */
#include "cluster.h"
#include "test_store_util.h"

#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define PAGES     8
#define PAGE_SIZE 16

static kc_cluster_t cl;
static char out[1 << 16];

static bool all_say(const char *want, int timeout_ms, uint64_t *ms)
{
    uint64_t t0 = kc_now_ms(), deadline = t0 + (uint64_t)timeout_ms;
    char state[3][16];
    for (;;) {
        bool all = true;
        for (int i = 0; i < 3; i++) {
            state[i][0] = '\0';
            if (kc_health_cluster(&cl, i, state[i], sizeof(state[i])) != 0 ||
                strcmp(state[i], want) != 0)
                all = false;
        }
        *ms = kc_now_ms() - t0;
        if (all)
            return true;
        if (kc_now_ms() >= deadline) {
            fprintf(stderr, "cluster states after %llu ms: '%s' '%s' '%s', want %s\n",
                    (unsigned long long)*ms, state[0], state[1], state[2], want);
            return false;
        }
        kvd_sleep_ns(200000000);
    }
}

/* Reserve, write, publish and look up a chain on node-0's Unix socket;
 * the lookup must find all of it. */
static void still_there(const kvd_key_t *keys, const char *when);

static void serve_locally(const kvd_key_t *keys, const char *when)
{
    kvd_ns_spec_t spec = ts_spec(TS_KV_NS, TS_KV_BYTES);
    char where[64];
    snprintf(where, sizeof(where), "(%s) serve locally", when);
    if (ts_put_chain(cl.node[0].socket, &spec, keys, PAGES, 7, where) == 0)
        still_there(keys, when);
}

/* The chain is still there: Lookup finds all of it. */
static void still_there(const kvd_key_t *keys, const char *when)
{
    kvd_ns_spec_t spec = ts_spec(TS_KV_NS, TS_KV_BYTES);
    ts_client_t t;
    if (ts_open(&t, cl.node[0].socket, &spec, 1, false) != 0)
        return;
    kvd_lookup_pool_msg_t pool = {
        .ns = t.ns[0], .keys = (kvd_key_t *)keys, .n_keys = PAGES};
    uint32_t b[PAGES];
    size_t nb = 0;
    ts_err_t err;
    int rc = ts_lookup(t.c, &pool, 1, b, PAGES, &nb, &err);
    DT_CHECK(rc == KVD_OK && nb > 0 && b[nb - 1] == PAGES,
             "(%s) lookup: %s, %zu boundaries, last %u (want %d)", when,
             kvd_status_str(rc), nb, nb ? b[nb - 1] : 0, PAGES);
    ts_close(&t);
}

static void etcd_down_and_back(void)
{
    uint64_t epoch = 0, ms = 0;
    if (!DT_CHECK(kc_wait_members(&cl, 0x7u, KC_READY_MS, &epoch, &ms),
                  "(a) three members, one epoch, on every daemon"))
        return;
    DT_CHECK(all_say("ready", KC_READY_MS, &ms), "(a) cluster ready on every daemon");

    kc_etcd_stop(&cl, SIGKILL);
    uint64_t bound = 4ull * (uint64_t)cl.ttl_s * 1000 + 10000;
    bool ok = all_say("degraded", (int)bound, &ms);
    DT_CHECK(
        ok, "(b) every daemon should say cluster degraded within %llu ms of etcd's death",
        (unsigned long long)bound);
    if (ok)
        printf("(b) etcd SIGKILLed: every daemon degraded after %llu ms (TTL %d s)\n",
               (unsigned long long)ms, cl.ttl_s);
    kvd_key_t keys[PAGES];
    if (ts_make_keys(5000, PAGES, PAGE_SIZE, keys) != 0)
        return;
    serve_locally(keys, "b, etcd down");
    for (int i = 0; i < 3; i++) {
        int rc = kc_cli(&cl, i, out, sizeof(out), (const char *[]){"health", NULL});
        DT_CHECK(rc == 0, "(b) %s health over TCP with etcd down: exit %d '%s'",
                 cl.node[i].node_id, rc, out);
    }

    if (kc_etcd_start(&cl) != 0)
        return;
    ok = all_say("ready", KC_READY_MS + (int)bound, &ms);
    DT_CHECK(ok, "(c) every daemon should say cluster ready again");
    if (ok)
        printf("(c) etcd restarted: every daemon ready after %llu ms\n",
               (unsigned long long)ms);
    uint64_t epoch2 = 0;
    ok = kc_wait_members(&cl, 0x7u, KC_READY_MS, &epoch2, &ms);
    DT_CHECK(ok, "(c) the same three members after etcd's restart");
    if (ok)
        printf("(c) the same three members at epoch %llu (was %llu)\n",
               (unsigned long long)epoch2, (unsigned long long)epoch);
    still_there(keys, "c, etcd back");
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    int rc = kc_setup(&cl, 3, true);
    if (rc == KVD_TEST_SKIP)
        return KVD_TEST_SKIP;
    if (rc == 0 && kc_node_start(&cl, 0, true, NULL) == 0 &&
        kc_node_start(&cl, 1, true, NULL) == 0 && kc_node_start(&cl, 2, true, NULL) == 0)
        etcd_down_and_back();
    kc_teardown(&cl);
    return dt_exit_status("cluster/etcd_down");
}
