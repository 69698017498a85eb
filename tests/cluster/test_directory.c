/*
 * Description: the cluster's page directory (issue 15), three kvdockd
 * daemons in three network namespaces (A = node-0, B = node-1, C = node-2):
 * (a) a chain of 8 pages published on C (Reserve, the bytes written into
 *     C's pool, Publish: a worker on C through C's own socket) is found by
 *     a Lookup sent to A (`kvdock --connect A lookup`), with the same
 *     boundaries as the same Lookup sent to C, all 8 pages;
 * (b) `kvdock --connect A show KEY --cluster --json` names C among the
 *     key's holders, and not B, which holds nothing;
 * (c) the members' directory_entries (kvdock cluster --json) add up to
 *     the 8 entries, each member owning those the rendezvous hash
 *     (common/, over the members sorted by id) gives it;
 * (d) the chain evicted on C: within a bounded wait A's Lookup no longer
 *     returns it;
 * (e) before that, B (which owns part of the directory) SIGKILLed and
 *     restarted: once it is back, the members' directory_entries are again
 *     those of (c): the holders re-announced B's share to its new life.
 * It skips (77) where namespaces or etcd are missing.
 */
#include "cluster.h"
#include "test_store_util.h"

#include <cjson/cJSON.h>
#include <signal.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define PAGES       8
#define PAGE_SIZE   16
#define A           0
#define B           1
#define C           2
#define DIR_WAIT_MS 30000

static kc_cluster_t cl;
static char out[1 << 16];
static kvd_key_t keys[PAGES];
static char hex[PAGES][65];

/* `kvdock --connect NODE lookup --namespace NS --json KEYS`: the
 * boundaries into b (at most PAGES), their number; -1 on an error. */
static int lookup_on(int node, uint32_t *b, size_t *nb)
{
    const char *args[PAGES + 8];
    size_t n = 0;
    args[n++] = "lookup";
    args[n++] = "--namespace";
    args[n++] = TS_KV_NS;
    args[n++] = "--json";
    for (size_t i = 0; i < PAGES; i++)
        args[n++] = hex[i];
    args[n] = NULL;
    *nb = 0;
    if (kc_cli(&cl, node, out, sizeof(out), args) != 0)
        return -1;
    cJSON *j = cJSON_Parse(out);
    const cJSON *arr = j ? cJSON_GetObjectItemCaseSensitive(j, "boundaries") : NULL, *x;
    if (!cJSON_IsArray(arr)) {
        cJSON_Delete(j);
        return -1;
    }
    cJSON_ArrayForEach(x, arr)
    {
        if (*nb < PAGES && cJSON_IsNumber(x))
            b[(*nb)++] = (uint32_t)x->valuedouble;
    }
    cJSON_Delete(j);
    return 0;
}

static void publish_on_c(void)
{
    kvd_ns_spec_t spec = ts_spec(TS_KV_NS, TS_KV_BYTES);
    ts_put_chain(cl.node[C].socket, &spec, keys, PAGES, 3, "publish on C");
}

/* (a); true when A found the chain (what (d) then waits to see go) */
static bool found_from_a(void)
{
    uint32_t bc[PAGES], ba[PAGES];
    size_t nc = 0, na = 0;
    if (!DT_CHECK(lookup_on(C, bc, &nc) == 0, "(a) lookup on C: %s", out))
        return false;
    DT_CHECK(nc > 0 && bc[nc - 1] == PAGES, "(a) C's own lookup: %zu boundaries, last %u",
             nc, nc ? bc[nc - 1] : 0);
    /* the announcement from C to the entries' owners is asynchronous:
     * poll A, bounded */
    uint64_t t0 = kc_now_ms();
    bool same = false;
    while (kc_now_ms() < t0 + DIR_WAIT_MS) {
        if (lookup_on(A, ba, &na) == 0 && na == nc &&
            memcmp(ba, bc, nc * sizeof(*ba)) == 0) {
            same = true;
            break;
        }
        kvd_sleep_ns(200000000);
    }
    DT_CHECK(
        same,
        "(a) A's lookup should give C's boundaries: A %zu (last %u), C %zu (last %u)", na,
        na ? ba[na - 1] : 0, nc, nc ? bc[nc - 1] : 0);
    if (same)
        printf("(a) the chain published on C found by a Lookup on A after %llu ms\n",
               (unsigned long long)(kc_now_ms() - t0));
    return same && nc > 0;
}

/* (b) */
static void shown_from_a(void)
{
    int rc = kc_cli(&cl, A, out, sizeof(out),
                    (const char *[]){"show", hex[3], "--cluster", "--json", NULL});
    if (!DT_CHECK(rc == 0 && dt_json_valid(out),
                  "(b) show --cluster --json on A: exit %d '%s'", rc, out))
        return;
    char c_id[40], b_id[40];
    snprintf(c_id, sizeof(c_id), "\"%s\"", cl.node[C].node_id);
    snprintf(b_id, sizeof(b_id), "\"%s\"", cl.node[B].node_id);
    DT_CHECK(strstr(out, c_id) != NULL, "(b) show --cluster on A should name %s: %s",
             c_id, out);
    DT_CHECK(strstr(out, b_id) == NULL,
             "(b) show --cluster on A names %s, which holds nothing: %s", b_id, out);
}

/* (c) */
static void shares(void)
{
    /* the members in id order, as the daemons pass them to the hash */
    uint64_t h[3];
    for (int i = 0; i < 3; i++)
        h[i] = kvd_node_hash(cl.node[i].node_id); /* node-0 < node-1 < node-2 */
    uint64_t want[3] = {0, 0, 0};
    for (size_t k = 0; k < PAGES; k++)
        want[kvd_rendezvous_owner(kvd_dir_hash("default", TS_KV_NS, keys[k]), h, 3)]++;
    uint64_t t0 = kc_now_ms();
    kc_view_t v;
    char why[512] = "";
    bool ok = false;
    while (!ok && kc_now_ms() < t0 + DIR_WAIT_MS) {
        if (kc_view(&cl, A, &v, why, sizeof(why)) == 0 && v.n == 3) {
            ok = true;
            for (int i = 0; i < 3; i++)
                ok = ok && strcmp(v.m[i].node, cl.node[i].node_id) == 0 &&
                     v.m[i].directory_entries == want[i];
        }
        if (!ok)
            kvd_sleep_ns(200000000);
    }
    if (ok)
        printf(
            "directory_entries per member %llu %llu %llu, as the rendezvous owners say, "
            "after %llu ms\n",
            (unsigned long long)want[0], (unsigned long long)want[1],
            (unsigned long long)want[2], (unsigned long long)(kc_now_ms() - t0));
    DT_CHECK(ok,
             "(c) directory_entries per member should be %llu %llu %llu (the rendezvous "
             "owners of the 8 keys); A lists %llu %llu %llu %s",
             (unsigned long long)want[0], (unsigned long long)want[1],
             (unsigned long long)want[2],
             (unsigned long long)(v.n > 0 ? v.m[0].directory_entries : 0),
             (unsigned long long)(v.n > 1 ? v.m[1].directory_entries : 0),
             (unsigned long long)(v.n > 2 ? v.m[2].directory_entries : 0), why);
}

/* (d) */
static void evicted_on_c(void)
{
    int rc = kc_cli(&cl, C, out, sizeof(out),
                    (const char *[]){"evict", "--namespace", TS_KV_NS, "--json", NULL});
    uint64_t evicted = 0;
    DT_CHECK(rc == 0 && dt_json_u64(out, NULL, "evicted", &evicted) && evicted == PAGES,
             "(d) evict on C: exit %d '%s', want %d evicted", rc, out, PAGES);
    uint64_t t0 = kc_now_ms();
    uint32_t b[PAGES];
    size_t nb = PAGES;
    while (kc_now_ms() < t0 + DIR_WAIT_MS) {
        if (lookup_on(A, b, &nb) == 0 && nb == 0)
            break;
        nb = PAGES;
        kvd_sleep_ns(200000000);
    }
    DT_CHECK(nb == 0,
             "(d) A's lookup still returns %zu boundaries %d ms after the eviction", nb,
             DIR_WAIT_MS);
    if (nb == 0)
        printf("(d) evicted on C: gone from A's lookups after %llu ms\n",
               (unsigned long long)(kc_now_ms() - t0));
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    int rc = kc_setup(&cl, 3, true);
    if (rc == KVD_TEST_SKIP)
        return KVD_TEST_SKIP;
    if (rc == 0 && ts_make_keys(9000, PAGES, PAGE_SIZE, keys) == 0 &&
        kc_node_start(&cl, A, true, NULL) == 0 &&
        kc_node_start(&cl, B, true, NULL) == 0 &&
        kc_node_start(&cl, C, true, NULL) == 0 &&
        DT_CHECK(kc_wait_members(&cl, 0x7u, KC_READY_MS, NULL, NULL),
                 "three members, one epoch")) {
        for (size_t i = 0; i < PAGES; i++)
            kvd_key_to_hex(keys[i], hex[i]);
        /* a worker on A: its namespace is known there */
        kvd_ns_spec_t spec = ts_spec(TS_KV_NS, TS_KV_BYTES);
        ts_client_t worker_a;
        if (ts_open(&worker_a, cl.node[A].socket, &spec, 1, false) == 0) {
            publish_on_c();
            bool found = found_from_a();
            shown_from_a();
            shares();
            /* (e) */
            kc_node_stop(&cl, B, SIGKILL, 10000, false);
            if (kc_node_start(&cl, B, true, NULL) == 0 &&
                DT_CHECK(kc_wait_members(&cl, 0x7u, KC_READY_MS, NULL, NULL),
                         "(e) B back among the members"))
                shares();
            /* a lookup that never found the chain cannot show it gone */
            if (found)
                evicted_on_c();
            ts_close(&worker_a);
        }
    }
    kc_teardown(&cl);
    return dt_exit_status("cluster/directory");
}
