/*
 * bench_cluster.c - `kvdock-bench cluster`: the cluster measured (issue
 * 15). Three kvdockd daemons in three network namespaces joined by a
 * bridge, one etcd, started with the cluster tests' harness
 * (tests/cluster/cluster.h: this mode is built only where the tests are):
 * A = node-0, B = node-1, C = node-2. In one run:
 *
 *   lookup   Lookup of a chain of --lookup-pages 64 KiB pages on A through
 *            A's socket, p50/p99 over --lookups calls: a chain A holds
 *            (answered by A's store alone) against one only C holds (after
 *            the first call answered by A's directory cache, tier remote),
 *            and against C's chain with one key more that nobody holds (the
 *            cache answers the chain; that key's owner is asked each time,
 *            as for a request's own tail after a shared prefix);
 *   load     a chain of --objects 1 MiB objects (64 MiB) on A: Acquire
 *            (asked again while it answers in-progress, as the linker does)
 *            and the copy out of A's pool into a worker's buffer. Held only
 *            on C: the Acquire fetches the objects from C into A's pool
 *            (Fetch over the daemons' TCP RPC, the holder copying them out
 *            of its pool into the reply), then the worker reads A's pool
 *            (shared memory). Held on A: the Acquire and the copy alone.
 *            The bytes C's veth carried are read from its counters;
 *   perftest ucx_perftest (tag_bw and ucp_put_bw, UCX_TLS=tcp) between
 *            namespaces C and A over the same bridge, at the object size;
 *   leave    a chain on C, C SIGKILLed: the time until A's Lookup no longer
 *            returns it, with C's lease TTL 2 s and 5 s.
 *
 * Benchmarks measure and do not assert. Needs root (namespaces), etcd,
 * and KVDOCKD / KVDOCK (or --kvdockd / --kvdock) naming the binaries.
 */
#include "bench.h"
#include "cluster.h"
#include "test_store_util.h"

#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define A 0
#define B 1
#define C 2

#define BIG_NS      "bench/1m"
#define BIG_BYTES   (1u << 20)
#define MAX_OBJECTS 256
#define MAX_LOOKUP  256
#define WAIT_MS     30000
#define PERF_PORT   13377

typedef struct copts {
    int lookups;
    size_t lookup_pages;
    size_t objects;
    int trials;
    const char *max_frame; /* --max-frame for A and C, NULL: the default */
    const char *pool;      /* A's and C's --pool-size */
    size_t per_fetch;      /* objects one Fetch of A's carries at most */
} copts_t;

static kc_cluster_t cl;

static double now_s(void)
{
    return (double)kvd_now_ns() / 1e9;
}

/* Reserve, fill, Publish keys[0..n) of ns (object bytes obj) on node i. */
static int publish_on(int node, const char *ns, uint32_t obj, const kvd_key_t *keys,
                      size_t n)
{
    kvd_ns_spec_t spec = ts_spec(ns, obj);
    ts_client_t t;
    if (ts_open(&t, cl.node[node].socket, &spec, 1, true) != 0)
        return -1;
    kvd_put_item_t *items = calloc(n, sizeof(*items));
    uint64_t *off = calloc(n, sizeof(*off));
    uint8_t *res = calloc(n, 1);
    uint64_t lease = 0;
    ts_err_t err;
    int rc = -1;
    if (items && off && res) {
        ts_chain_items(keys, n, NULL, 0, items);
        /* the batch limit: reserve in pieces of 64 */
        rc = 0;
        for (size_t at = 0; rc == 0 && at < n; at += 64) {
            size_t k = KVD_MIN((size_t)64, n - at);
            if (ts_reserve(t.c, t.ns[0], obj, items + at, k, &lease, res + at, off + at,
                           &err) != KVD_OK) {
                fprintf(stderr, "cluster: reserve on node %d: %s\n", node, err.text);
                rc = -1;
                break;
            }
            for (size_t i = at; i < at + k; i++)
                if (res[i] == KVD_RESERVE_ALLOCATED)
                    ts_fill(t.pool + off[i], obj, keys[i], 5);
            if (ts_publish(t.c, lease, keys + at, k, &err) != KVD_OK) {
                fprintf(stderr, "cluster: publish on node %d: %s\n", node, err.text);
                rc = -1;
            }
        }
    }
    free(items);
    free(off);
    free(res);
    ts_close(&t);
    return rc;
}

/* One Lookup: boundaries' count, the last's tier (0 without tiers). */
static int lookup(kvd_client_t *c, uint32_t ns, const kvd_key_t *keys, size_t n,
                  size_t *nb, uint32_t *last_tier)
{
    kvd_lookup_pool_msg_t pool = {.ns = ns, .n_keys = n, .keys = (kvd_key_t *)keys};
    kvd_msg_t req, rep;
    kvd_msg_request(&req, 0, KVD_METHOD_LOOKUP);
    req.body.lookup_req = (kvd_lookup_req_t){.n_pools = 1, .pools = &pool};
    int rc = kvd_client_call(c, &req, &rep, 10000);
    if (rc == KVD_OK)
        rc = rep.status;
    *nb = rc == KVD_OK ? rep.body.lookup_rep.n : 0;
    *last_tier = rc == KVD_OK && *nb > 0 && rep.body.lookup_rep.tiers
                     ? rep.body.lookup_rep.tiers[*nb - 1]
                     : 0;
    kvd_msg_clear(&rep);
    return rc;
}

/* Polls A's Lookup until it covers all n keys (want_all) or none. The
 * milliseconds it took, -1 past WAIT_MS (or a failing call). */
static double lookup_until(kvd_client_t *c, uint32_t ns, const kvd_key_t *keys, size_t n,
                           bool want_all, int every_ms)
{
    double t0 = now_s();
    size_t nb;
    uint32_t tier;
    while (now_s() < t0 + WAIT_MS / 1000.0) {
        if (lookup(c, ns, keys, n, &nb, &tier) == KVD_OK &&
            (want_all ? nb == n : nb == 0))
            return (now_s() - t0) * 1000.0;
        kvd_sleep_ns((uint64_t)every_ms * 1000000ull);
    }
    return -1;
}

/* ------------------------------------------------------------- lookup */

/* A's directory cache hits and misses (`kvdock cluster --json`); zeros when
 * they cannot be read. */
static void cache_counters(uint64_t *hits, uint64_t *misses)
{
    static char out[1 << 16];
    *hits = *misses = 0;
    if (kc_cli(&cl, A, out, sizeof(out), (const char *[]){"cluster", "--json", NULL}) ==
        0) {
        dt_json_u64(out, NULL, "dir_cache_hits", hits);
        dt_json_u64(out, NULL, "dir_cache_misses", misses);
    }
}

static void bench_lookup(const copts_t *o, ts_client_t *wa)
{
    static kvd_key_t local[MAX_LOOKUP], remote[MAX_LOOKUP + 1], tail[MAX_LOOKUP + 1];
    size_t n = o->lookup_pages;
    if (ts_make_keys(1000, n, 16, local) != 0 ||
        ts_make_keys(50000, n, 16, remote) != 0 ||
        ts_make_keys(90000, n + 1, 16, tail) != 0 ||
        publish_on(A, TS_KV_NS, TS_KV_BYTES, local, n) != 0 ||
        publish_on(C, TS_KV_NS, TS_KV_BYTES, remote, n) != 0)
        return;
    if (lookup_until(wa->c, wa->ns[0], remote, n, true, 50) < 0) {
        printf("lookup: A never saw C's chain\n");
        return;
    }
    /* C's chain and one key more that nobody holds (a request's own tail
     * after a shared prefix): the cache answers the chain, the tail's
     * owner is asked each time (absence is not cached) */
    memcpy(tail, remote, n * sizeof(kvd_key_t));
    const char *what[3] = {"local (held on A)", "cluster (held on C)",
                           "cluster + 1 new key"};
    const kvd_key_t *chains[3] = {local, remote, tail};
    size_t asked[3] = {n, n, n + 1};
    uint64_t p50[3] = {0, 0, 0}, p99[3] = {0, 0, 0};
    uint64_t hits0 = 0, misses0 = 0;
    cache_counters(&hits0, &misses0);
    for (int w = 0; w < 3; w++) {
        bench_hist_t *h = calloc(1, sizeof(*h));
        size_t nb = 0;
        uint32_t tier = 0;
        int errors = 0;
        for (int i = 0; h && i < o->lookups; i++) {
            uint64_t t0 = kvd_now_ns();
            int rc = lookup(wa->c, wa->ns[0], chains[w], asked[w], &nb, &tier);
            hist_add(h, kvd_now_ns() - t0);
            errors += rc != KVD_OK || nb != n;
        }
        if (h) {
            p50[w] = hist_quantile_ns(h, 0.5);
            p99[w] = hist_quantile_ns(h, 0.99);
        }
        printf("lookup %-20s %zu pages: p50 %7.1f us  p99 %7.1f us  (%d calls, last "
               "tier %u, %d short or failed)\n",
               what[w], n, p50[w] / 1e3, p99[w] / 1e3, o->lookups, tier, errors);
        free(h);
    }
    uint64_t hits1 = 0, misses1 = 0;
    cache_counters(&hits1, &misses1);
    printf("lookup: A's directory cache over these calls: %llu hits, %llu misses "
           "(--cluster-cache-ms, default 1000 ms)\n",
           (unsigned long long)(hits1 - hits0), (unsigned long long)(misses1 - misses0));
    for (int w = 1; w < 3 && p50[0] > 0; w++)
        printf("lookup %s / local: p50 %.2fx  p99 %.2fx  (goal: at most 2x)\n", what[w],
               (double)p50[w] / (double)p50[0], (double)p99[w] / (double)p99[0]);
}

/* --------------------------------------------------------------- load */

static int read_counter(const char *dev, const char *name, uint64_t *v)
{
    char path[128];
    snprintf(path, sizeof(path), "/sys/class/net/%s/statistics/%s", dev, name);
    FILE *f = fopen(path, "r");
    unsigned long long x = 0;
    int ok = f && fscanf(f, "%llu", &x) == 1;
    if (f)
        fclose(f);
    *v = x;
    return ok ? 0 : -1;
}

/* Acquire (asking again while in-progress), copy every object into buf,
 * Release. Seconds of the Acquire into *acq, of it all into *all; -1 on a
 * failure. */
static int load_once(ts_client_t *t, const kvd_key_t *keys, size_t n, uint8_t *buf,
                     double *acq, double *all, int *rounds)
{
    static uint64_t off[MAX_OBJECTS];
    uint64_t lease = 0;
    ts_err_t err = {0};
    double t0 = now_s();
    int rc;
    *rounds = 0;
    uint64_t pause = 100000; /* the linker's schedule: 0.1 ms doubling to 5 ms */
    do {
        if (*rounds > 0) {
            kvd_sleep_ns(pause);
            pause = KVD_MIN(2 * pause, 5000000ull);
        }
        /* as the linker asks: the daemon holds the reply while it fetches */
        rc = ts_acquire_wait(t->c, t->ns[0], BIG_BYTES, keys, n, KVD_ACQUIRE_WAIT_MAX_MS,
                             &lease, off, &err);
        (*rounds)++;
    } while (rc == KVD_INPROGRESS && now_s() < t0 + 30);
    double t1 = now_s();
    if (rc != KVD_OK) {
        printf("load: Acquire failed: %s (%s)\n", kvd_status_str(rc), err.text);
        return -1;
    }
    for (size_t i = 0; i < n; i++)
        memcpy(buf + i * BIG_BYTES, t->pool + off[i], BIG_BYTES);
    double t2 = now_s();
    ts_release(t->c, lease, &err);
    *acq = t1 - t0;
    *all = t2 - t0;
    size_t bad = 0;
    for (size_t i = 0; i < n; i++)
        bad += ts_verify(buf + i * BIG_BYTES, BIG_BYTES, keys[i], 5) != SIZE_MAX;
    if (bad > 0) {
        printf("load: %zu objects differ from what was published\n", bad);
        return -1;
    }
    return 0;
}

/* The RPC alone: a client with the cluster's token (in the root namespace,
 * over the bridge) asks C for per_call objects of a chain C holds, as A's
 * fetch does, --trials x 8 times. GB/s of the replies' payload. */
static void bench_fetch_rpc(const copts_t *o, const kvd_key_t *keys, size_t n,
                            size_t per_call)
{
    uint8_t tok[256];
    size_t len = 0;
    char why[256];
    kvd_client_t *c = NULL;
    if (kvd_client_token_read(cl.peer_token_file, tok, sizeof(tok), &len, why,
                              sizeof(why)) != KVD_OK ||
        kvd_client_connect_tcp(cl.node[C].addr, 5000, &c) != KVD_OK ||
        kvd_client_hello(c, "bench-peer", tok, len, 5000, NULL) != KVD_OK) {
        printf("fetch-rpc: cannot connect to C as a peer\n");
        kvd_client_close(c);
        return;
    }
    uint64_t bytes = 0;
    double t0 = now_s();
    int calls = 0;
    for (int r = 0; r < 8 * o->trials; r++)
        for (size_t at = 0; at < n; at += per_call, calls++) {
            kvd_msg_t req, rep;
            kvd_msg_request(&req, 0, KVD_METHOD_FETCH);
            req.body.fetch_req = (kvd_fetch_req_t){.n = KVD_MIN(per_call, n - at),
                                                   .keys = (kvd_key_t *)keys + at};
            kvd_strlcpy(req.body.fetch_req.tenant, "default",
                        sizeof(req.body.fetch_req.tenant));
            kvd_strlcpy(req.body.fetch_req.ns_name, BIG_NS,
                        sizeof(req.body.fetch_req.ns_name));
            if (kvd_client_call(c, &req, &rep, 10000) == KVD_OK && rep.status == KVD_OK)
                bytes += rep.body.fetch_rep.data_len;
            kvd_msg_clear(&rep);
        }
    double dt = now_s() - t0;
    printf("fetch-rpc: %d Fetches of up to %zu x 1 MiB from C over the bridge, one at a "
           "time: %.2f ms each, %.2f GB/s\n",
           calls, per_call, dt * 1e3 / calls, bytes / dt / 1e9);
    kvd_client_close(c);
}

static double bench_load(const copts_t *o, ts_client_t *big)
{
    size_t n = o->objects;
    size_t bytes = n * BIG_BYTES;
    uint8_t *buf = malloc(bytes);
    kvd_key_t *keys = calloc(n, sizeof(kvd_key_t));
    double best_remote = 0;
    if (buf == NULL || keys == NULL)
        goto out;
    memset(buf, 0, bytes); /* the worker's buffer, faulted in */
    /* local: one chain on A, loaded --trials times */
    if (ts_make_keys(200000, n, 16, keys) != 0 ||
        publish_on(A, BIG_NS, BIG_BYTES, keys, n))
        goto out;
    double acq, all, sum_l = 0, best_l = 0;
    int rounds;
    /* one load first, untimed: the worker's mapping of A's pool faults in */
    if (load_once(big, keys, n, buf, &acq, &all, &rounds) != 0)
        goto out;
    for (int t = 0; t < o->trials; t++) {
        if (load_once(big, keys, n, buf, &acq, &all, &rounds) != 0)
            goto out;
        double g = bytes / all / 1e9;
        sum_l += g;
        best_l = KVD_MAX(best_l, g);
        printf("load local  trial %d: %zu x 1 MiB: %.2f ms (Acquire %.3f ms, %d answers) "
               "%.2f GB/s\n",
               t, n, all * 1e3, acq * 1e3, rounds, g);
    }
    /* remote: a fresh chain on C per trial (a loaded chain is local after) */
    double sum_r = 0, sum_f = 0, sum_again = 0;
    uint64_t link = 0;
    for (int t = 0; t < o->trials; t++) {
        if (ts_make_keys(300000 + 10000 * (uint32_t)t, n, 16, keys) != 0 ||
            publish_on(C, BIG_NS, BIG_BYTES, keys, n) != 0)
            goto out;
        if (lookup_until(big->c, big->ns[0], keys, n, true, 20) < 0) {
            printf("load: A never saw C's chain %d\n", t);
            goto out;
        }
        uint64_t rx0 = 0, rx1 = 0;
        read_counter(cl.net.veth_root[C], "rx_bytes", &rx0); /* what C sent */
        if (load_once(big, keys, n, buf, &acq, &all, &rounds) != 0)
            goto out;
        read_counter(cl.net.veth_root[C], "rx_bytes", &rx1);
        double g = bytes / all / 1e9, gf = bytes / acq / 1e9;
        sum_r += g;
        sum_f += gf;
        best_remote = KVD_MAX(best_remote, g);
        link += rx1 - rx0;
        printf("load remote trial %d: %zu x 1 MiB: %.2f ms (Acquire with its fetch %.2f "
               "ms, %d answers) %.2f GB/s (fetch alone %.2f GB/s); C's link carried "
               "%.1f MiB\n",
               t, n, all * 1e3, acq * 1e3, rounds, g, gf, (rx1 - rx0) / 1048576.0);
        /* the same prefix asked again: what staging in A's pool buys */
        if (load_once(big, keys, n, buf, &acq, &all, &rounds) != 0)
            goto out;
        sum_again += bytes / all / 1e9;
        printf("load remote trial %d again: %.2f ms, %.2f GB/s (local now)\n", t,
               all * 1e3, bytes / all / 1e9);
    }
    /* the last chain is still on C: the holder's side and the RPC alone, at
     * the frame's worth of objects A's fetch asks for at a time */
    bench_fetch_rpc(o, keys, n, o->per_fetch);
    printf("load mean: local %.2f GB/s, remote %.2f GB/s (fetch alone %.2f GB/s); "
           "remote/local %.3f; C's link carried %.3f x the payload\n",
           sum_l / o->trials, sum_r / o->trials, sum_f / o->trials, sum_r / sum_l,
           (double)link / ((double)bytes * o->trials));
    /* a worker reading C's objects itself would move the same bytes over
     * the same UCX path without the copy into A's pool: the fetch alone
     * bounds it; it would leave no local copy for the next load */
    printf("staging: a direct read would be at most %.2f x the staged first load (the "
           "fetch alone); the staged prefix's next load runs at %.2f GB/s, %.1f x the "
           "fetch alone\n",
           sum_f / sum_r, sum_again / o->trials, sum_again / sum_f);
out:
    free(buf);
    free(keys);
    return best_remote;
}

/* ----------------------------------------------------------- perftest */

/* ucx_perftest -t test at size between C (server) and A (client); the
 * overall bandwidth in GB/s, 0 when it did not run. */
static double perftest(const char *test, size_t size, int iters)
{
    char srv_log[160], cli_log[160], sz[32], it[32], port[16];
    snprintf(srv_log, sizeof(srv_log), "%s/perf-srv.log", cl.node[C].dir);
    snprintf(cli_log, sizeof(cli_log), "%s/perf-cli.log", cl.node[A].dir);
    snprintf(sz, sizeof(sz), "%zu", size);
    snprintf(it, sizeof(it), "%d", iters);
    snprintf(port, sizeof(port), "%d", PERF_PORT);
    unlink(cli_log);
    /* through `ip netns exec`, which mounts the namespace's own /sys: UCX
     * finds its devices there (a bare setns would show the root's) */
    const char *ip = kc_ip_path();
    const char *srv[] = {ip,   "netns", "exec", cl.node[C].ns, "/usr/bin/ucx_perftest",
                         "-p", port,    NULL};
    /* each side on its namespace's veth (UCX would also try lo, which
     * cannot reach the other namespace); the children inherit it */
    setenv("UCX_NET_DEVICES", cl.net.veth_ns[C], 1);
    pid_t s = kc_spawn(NULL, srv, srv_log);
    if (s < 0)
        return 0;
    kc_net_track(s);
    kvd_sleep_ns(500000000); /* the server listening */
    const char *cli[] = {ip,
                         "netns",
                         "exec",
                         cl.node[A].ns,
                         "/usr/bin/ucx_perftest",
                         cl.net.addr[C],
                         "-p",
                         port,
                         "-t",
                         test,
                         "-s",
                         sz,
                         "-n",
                         it,
                         NULL};
    setenv("UCX_NET_DEVICES", cl.net.veth_ns[A], 1);
    pid_t c = kc_spawn(NULL, cli, cli_log);
    int st = -1;
    if (c > 0) {
        kc_net_track(c);
        if (kvd_wait_pid(c, 120000, &st) != 0) {
            kill(c, SIGKILL);
            kvd_wait_pid(c, 5000, NULL);
        }
        kc_net_untrack(c);
    }
    if (kvd_wait_pid(s, 5000, NULL) != 0) {
        kill(s, SIGKILL);
        kvd_wait_pid(s, 5000, NULL);
    }
    kc_net_untrack(s);
    double mbs = 0;
    FILE *f = fopen(cli_log, "r");
    char line[512];
    while (f && fgets(line, sizeof(line), f)) {
        unsigned long long n;
        double p50, avg, ovh, bw_avg, bw_all;
        if (sscanf(line, "Final: %llu %lf %lf %lf %lf %lf", &n, &p50, &avg, &ovh, &bw_avg,
                   &bw_all) == 6)
            mbs = bw_all;
    }
    if (f)
        fclose(f);
    double g = mbs * 1048576.0 / 1e9; /* ucx_perftest's MB is 2^20 bytes */
    printf("ucx_perftest %s %zu B over the bridge (UCX_TLS=tcp): %.2f GB/s%s\n", test,
           size, g, g > 0 ? "" : " (did not run: see its log)");
    if (g == 0) {
        kvd_dump_file(cli_log);
        kvd_dump_file(srv_log);
    }
    return g;
}

/* -------------------------------------------------------------- leave */

static void bench_leave(ts_client_t *wa, int ttl_s, uint32_t first_token, bool restart,
                        const char *const *big_args)
{
    static kvd_key_t keys[8];
    if (restart) {
        cl.ttl_s = ttl_s;
        if (kc_node_start(&cl, C, true, big_args) != 0 ||
            !kc_wait_members(&cl, 0x7u, WAIT_MS, NULL, NULL)) {
            printf("leave: C did not rejoin with TTL %d s\n", ttl_s);
            return;
        }
    }
    if (ts_make_keys(first_token, 8, 16, keys) != 0 ||
        publish_on(C, TS_KV_NS, TS_KV_BYTES, keys, 8) != 0 ||
        lookup_until(wa->c, wa->ns[0], keys, 8, true, 20) < 0) {
        printf("leave: A never saw C's chain (TTL %d s)\n", ttl_s);
        return;
    }
    kc_node_stop(&cl, C, SIGKILL, 10000, false);
    double ms = lookup_until(wa->c, wa->ns[0], keys, 8, false, 20);
    printf("leave: C SIGKILLed with lease TTL %d s: out of A's lookups after %.0f ms\n",
           ttl_s, ms);
}

/* --------------------------------------------------------------- main */

/* What remote.c puts in one Fetch: (frame - 64 KiB of slack) / object. */
static size_t per_fetch(const char *max_frame)
{
    uint64_t f = KVD_FRAME_DEFAULT_MAX;
    if (max_frame)
        kvd_size_parse(max_frame, &f);
    return f > (64u << 10) + BIG_BYTES ? (f - (64u << 10)) / BIG_BYTES : 1;
}

static void usage(FILE *f)
{
    fprintf(f, "Usage: kvdock-bench cluster [--kvdockd PATH] [--kvdock PATH] "
               "[--lookups N] [--lookup-pages N] [--objects N] [--trials N] "
               "[--max-frame SIZE] [--pool-size SIZE] [--ucx]\n"
               "  --ucx: the daemons serve UCX over TCP (--ucx on --ucx-tcp), so remote\n"
               "  loads read the objects over UCX; without it, over the daemons' RPC\n");
}

int bench_mode_cluster(int argc, char **argv)
{
    copts_t o = {.lookups = 2000,
                 .lookup_pages = 64,
                 .objects = 64,
                 .trials = 3,
                 .max_frame = NULL,
                 .pool = "512M"};
    static const struct option longopts[] = {
        {"kvdockd", required_argument, NULL, 'k'},
        {"kvdock", required_argument, NULL, 'K'},
        {"lookups", required_argument, NULL, 'l'},
        {"lookup-pages", required_argument, NULL, 'p'},
        {"objects", required_argument, NULL, 'o'},
        {"trials", required_argument, NULL, 't'},
        {"max-frame", required_argument, NULL, 'f'},
        {"pool-size", required_argument, NULL, 'P'},
        {"ucx", no_argument, NULL, 'u'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0}};
    int ch;
    bool use_ucx = false;
    while ((ch = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        switch (ch) {
        case 'k': setenv("KVDOCKD", optarg, 1); break;
        case 'K': setenv("KVDOCK", optarg, 1); break;
        case 'l': o.lookups = atoi(optarg); break;
        case 'p': o.lookup_pages = (size_t)atol(optarg); break;
        case 'o': o.objects = (size_t)atol(optarg); break;
        case 't': o.trials = atoi(optarg); break;
        case 'f': o.max_frame = optarg; break;
        case 'P': o.pool = optarg; break;
        case 'u': use_ucx = true; break;
        case 'h': usage(stdout); return BENCH_EXIT_OK;
        default: usage(stderr); return BENCH_EXIT_USAGE;
        }
    }
    if (o.lookups < 1 || o.lookup_pages < 1 || o.lookup_pages > MAX_LOOKUP ||
        o.objects < 1 || o.objects > MAX_OBJECTS || o.trials < 1) {
        usage(stderr);
        return BENCH_EXIT_USAGE;
    }
    if (getenv("KVDOCKD") == NULL || getenv("KVDOCK") == NULL) {
        fprintf(stderr, "kvdock-bench cluster: set KVDOCKD and KVDOCK (or --kvdockd, "
                        "--kvdock)\n");
        return BENCH_EXIT_USAGE;
    }
    /* ucx_perftest's, and the daemons' with --ucx */
    setenv("UCX_TLS", "tcp", 1);
    int rc = kc_setup(&cl, 3, true);
    if (rc == KVD_TEST_SKIP)
        return BENCH_EXIT_OK; /* the reason is printed */
    char frame_buf[32];
    const char *big[12] = {"--pool-size", o.pool, NULL};
    if (o.max_frame) {
        /* a connection's buffer must hold two frames */
        uint64_t f = 0;
        if (kvd_size_parse(o.max_frame, &f) != KVD_OK) {
            usage(stderr);
            kc_teardown(&cl);
            return BENCH_EXIT_USAGE;
        }
        snprintf(frame_buf, sizeof(frame_buf), "%llu", (unsigned long long)(2 * f));
        const char *more[] = {"--pool-size",       o.pool,    "--max-frame", o.max_frame,
                              "--max-conn-buffer", frame_buf, NULL};
        memcpy(big, more, sizeof(more));
    }
    const char *ucx_flags[] = {"--ucx", "on", "--ucx-tcp", NULL};
    if (use_ucx) {
        size_t k = 0;
        while (big[k] != NULL)
            k++;
        memcpy(big + k, ucx_flags, sizeof(ucx_flags));
    }
    cl.ttl_s = 2;
    ts_client_t wa = {.pool_fd = -1}, wbig = {.pool_fd = -1};
    kvd_ns_spec_t spec = ts_spec(TS_KV_NS, TS_KV_BYTES);
    kvd_ns_spec_t spec_big = ts_spec(BIG_NS, BIG_BYTES);
    if (rc == 0 && kc_node_start(&cl, A, true, big) == 0 &&
        kc_node_start(&cl, B, true, use_ucx ? ucx_flags : NULL) == 0 &&
        kc_node_start(&cl, C, true, big) == 0 &&
        kc_wait_members(&cl, 0x7u, KC_READY_MS, NULL, NULL) &&
        (o.per_fetch = per_fetch(o.max_frame)) > 0 &&
        ts_open(&wa, cl.node[A].socket, &spec, 1, false) == 0 &&
        ts_open(&wbig, cl.node[A].socket, &spec_big, 1, true) == 0) {
        char host[256] = "";
        gethostname(host, sizeof(host) - 1);
        printf("cluster: 3 daemons in namespaces on %s (%ld CPUs), bridge %s, etcd %s; "
               "A %s, B %s, C %s; frames %s; remote loads over %s\n",
               host, sysconf(_SC_NPROCESSORS_ONLN), cl.net.bridge, cl.etcd.url,
               cl.node[A].addr, cl.node[B].addr, cl.node[C].addr,
               o.max_frame ? o.max_frame : "default (4 MiB)",
               use_ucx ? "UCX (tcp)" : "the daemons' RPC");
        bench_lookup(&o, &wa);
        double remote = bench_load(&o, &wbig);
        double tag = perftest("tag_bw", BIG_BYTES, 2000);
        double put = perftest("ucp_put_bw", BIG_BYTES, 2000);
        double best = KVD_MAX(tag, put);
        if (best > 0 && remote > 0)
            printf(
                "remote load (best trial) / better ucx_perftest op: %.3f (goal: at least "
                "0.9)\n",
                remote / best);
        bench_leave(&wa, 2, 70000, false, big);
        bench_leave(&wa, 5, 80000, true, big);
    }
    ts_close(&wbig);
    ts_close(&wa);
    kc_teardown(&cl);
    return dt_failure_count() > 0 ? BENCH_EXIT_FAIL : BENCH_EXIT_OK;
}
