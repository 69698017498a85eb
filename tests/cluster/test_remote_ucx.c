/*
 * Description: a remote load whose bytes move over UCX (issue 15): two
 * daemons in two network namespaces (A = node-0, C = node-1), both serving
 * UCX over TCP (--ucx on --ucx-tcp, UCX_TLS=tcp from the test's
 * environment):
 * (a) a chain of 16 pages of 256 KiB published on C is found by a Lookup
 *     on A (every page remote);
 * (b) an Acquire on A, asked again while it answers in progress (bounded),
 *     pins all 16 in A's pool, whose bytes are what C's writer wrote;
 * (c) A's cluster counters say the 16 objects were read over UCX (16 x
 *     256 KiB), not fetched over the RPC; C's say it served them;
 * (d) C's link carried at least the payload while it happened (the bytes
 *     crossed the bridge: counted on C's veth in the root namespace);
 * (e) a second chain on C, found by A's Lookup, then C SIGKILLed: A's
 *     Acquire of it fails not-found within a bound (the read from a dead
 *     holder fails; nothing hangs), and A still serves the first chain.
 * Skips where namespaces, etcd or UCX over TCP are missing.
 */
#include "cluster.h"
#include "test_store_util.h"

#include <cjson/cJSON.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PAGES     16
#define OBJ_BYTES (256u * 1024u)
#define PAGE_SIZE 16
#define A         0
#define C         1
#define WAIT_MS   30000
#define NS        "m/kv/tp0"

static kc_cluster_t cl;
static kvd_key_t keys[PAGES], keys2[PAGES];
static char out[1 << 16];

static void publish_on_c(const kvd_key_t *chain, size_t n)
{
    kvd_ns_spec_t spec = ts_spec(NS, OBJ_BYTES);
    ts_put_chain(cl.node[C].socket, &spec, chain, n, 9, "publish on C");
}

/* A counter of node i's `kvdock cluster --json` (-1 on an error). */
static int64_t counter(int i, const char *name)
{
    if (kc_cli(&cl, i, out, sizeof(out), (const char *[]){"cluster", "--json", NULL}) !=
        0)
        return -1;
    cJSON *j = cJSON_Parse(out);
    const cJSON *c = j ? cJSON_GetObjectItemCaseSensitive(j, "counters") : NULL;
    const cJSON *v = c ? cJSON_GetObjectItemCaseSensitive(c, name) : NULL;
    int64_t r = cJSON_IsNumber(v) ? (int64_t)v->valuedouble : -1;
    cJSON_Delete(j);
    return r;
}

/* Bytes sent by C's side of the bridge: its veth end in the root
 * namespace receives what C sends. */
static uint64_t c_link_rx(void)
{
    char path[160];
    snprintf(path, sizeof(path), "/sys/class/net/%s/statistics/rx_bytes",
             cl.net.veth_root[C]);
    FILE *f = fopen(path, "r");
    unsigned long long v = 0;
    if (f != NULL) {
        if (fscanf(f, "%llu", &v) != 1)
            v = 0;
        fclose(f);
    }
    return v;
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    int rc = kc_setup(&cl, 2, true);
    if (rc == KVD_TEST_SKIP)
        return KVD_TEST_SKIP;
    const char *ucx[] = {"--ucx", "on", "--ucx-tcp", NULL};
    if (rc == 0 && ts_make_keys(5000, PAGES, PAGE_SIZE, keys) == 0 &&
        ts_make_keys(6000, PAGES, PAGE_SIZE, keys2) == 0 &&
        kc_node_start(&cl, A, true, ucx) == 0 && kc_node_start(&cl, C, true, ucx) == 0 &&
        DT_CHECK(kc_wait_members(&cl, 0x3u, KC_READY_MS, NULL, NULL),
                 "two members, one epoch")) {
        publish_on_c(keys, PAGES);
        kvd_ns_spec_t spec = ts_spec(NS, OBJ_BYTES);
        ts_client_t a;
        if (ts_open(&a, cl.node[A].socket, &spec, 1, true) == 0) {
            /* (a) the announcement is asynchronous: bounded poll */
            kvd_lookup_pool_msg_t pool = {.ns = a.ns[0], .n_keys = PAGES, .keys = keys};
            uint32_t bnd[PAGES];
            size_t nb = 0;
            ts_err_t err = {0};
            uint64_t t0 = kc_now_ms();
            while (kc_now_ms() < t0 + WAIT_MS &&
                   !(ts_lookup(a.c, &pool, 1, bnd, PAGES, &nb, &err) == KVD_OK &&
                     nb == PAGES))
                kvd_sleep_ns(100000000);
            DT_CHECK(nb == PAGES, "(a) Lookup on A: %zu boundaries (%s)", nb, err.text);
            /* (b) */
            uint64_t rx0 = c_link_rx();
            uint64_t lease = 0, offsets[PAGES];
            int arc = KVD_INPROGRESS;
            t0 = kc_now_ms();
            while (kc_now_ms() < t0 + WAIT_MS &&
                   (arc = ts_acquire(a.c, a.ns[0], OBJ_BYTES, keys, PAGES, &lease,
                                     offsets, &err)) == KVD_INPROGRESS)
                kvd_sleep_ns(5000000);
            uint64_t rx = c_link_rx() - rx0;
            if (DT_CHECK(arc == KVD_OK, "(b) Acquire on A: %d %s", arc, err.text)) {
                for (size_t i = 0; i < PAGES; i++) {
                    size_t bad =
                        a.pool && ts_in_pool(offsets[i], OBJ_BYTES, a.pool_bytes)
                            ? ts_verify(a.pool + offsets[i], OBJ_BYTES, keys[i], 9)
                            : 0;
                    DT_CHECK(bad == SIZE_MAX, "(b) page %zu on A differs at byte %zu", i,
                             bad);
                }
                printf("(b) %d x %u KiB held on C loaded on A after %llu ms\n", PAGES,
                       OBJ_BYTES / 1024, (unsigned long long)(kc_now_ms() - t0));
                ts_release(a.c, lease, &err);
            }
            /* (c) */
            int64_t ucx_objs = counter(A, "fetched_ucx_objects");
            int64_t ucx_bytes = counter(A, "fetched_ucx_bytes");
            int64_t served = counter(C, "served_objects");
            if (served < PAGES)
                printf("C's cluster --json: %s\n", out);
            DT_CHECK(ucx_objs == PAGES && ucx_bytes == (int64_t)PAGES * OBJ_BYTES,
                     "(c) A read %lld objects, %lld bytes over UCX; want %d, %llu",
                     (long long)ucx_objs, (long long)ucx_bytes, PAGES,
                     (unsigned long long)PAGES * OBJ_BYTES);
            DT_CHECK(served >= PAGES, "(c) C served %lld objects, want at least %d",
                     (long long)served, PAGES);
            /* (d) */
            DT_CHECK(rx >= (uint64_t)PAGES * OBJ_BYTES,
                     "(d) C's link carried %llu bytes during the load, less than the "
                     "%llu of the payload",
                     (unsigned long long)rx, (unsigned long long)PAGES * OBJ_BYTES);
            printf("(d) C's link carried %.3f x the payload\n",
                   (double)rx / ((double)PAGES * OBJ_BYTES));
            /* (e) */
            publish_on_c(keys2, 4);
            kvd_lookup_pool_msg_t pool2 = {.ns = a.ns[0], .n_keys = 4, .keys = keys2};
            t0 = kc_now_ms();
            nb = 0;
            while (
                kc_now_ms() < t0 + WAIT_MS &&
                !(ts_lookup(a.c, &pool2, 1, bnd, PAGES, &nb, &err) == KVD_OK && nb == 4))
                kvd_sleep_ns(100000000);
            if (DT_CHECK(nb == 4, "(e) Lookup on A of the second chain: %zu boundaries",
                         nb)) {
                kc_node_stop(&cl, C, SIGKILL, 10000, false);
                t0 = kc_now_ms();
                arc = KVD_INPROGRESS;
                while (kc_now_ms() < t0 + WAIT_MS &&
                       (arc = ts_acquire(a.c, a.ns[0], OBJ_BYTES, keys2, 4, &lease,
                                         offsets, &err)) == KVD_INPROGRESS)
                    kvd_sleep_ns(5000000);
                DT_CHECK(arc == KVD_ERR_NOT_FOUND,
                         "(e) Acquire on A from a dead holder: %d %s, want not-found",
                         arc, err.text);
                printf("(e) the dead holder's chain failed not-found after %llu ms\n",
                       (unsigned long long)(kc_now_ms() - t0));
                arc = ts_acquire(a.c, a.ns[0], OBJ_BYTES, keys, PAGES, &lease, offsets,
                                 &err);
                if (DT_CHECK(arc == KVD_OK, "(e) A's own copy of the first chain: %d %s",
                             arc, err.text))
                    ts_release(a.c, lease, &err);
            }
            ts_close(&a);
        }
    }
    kc_teardown(&cl);
    return dt_exit_status("cluster/remote_ucx");
}
