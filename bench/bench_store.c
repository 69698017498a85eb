/*
 * bench_store.c - mode `store` of kvdock-bench: the store engine in
 * process, without RPC: how fast keys are inserted (Reserve + Publish in
 * batches) and probed (Lookup of ALL_PAGES pools), and how much index memory
 * an object costs, at a given number of objects.
 *
 * The engine does bookkeeping only, so a pool of any size is a number here:
 * nothing of it is allocated. Keys are random 32-byte digests (the same
 * distribution as SHA-256 page keys). One thread: the figures are per core.
 */
#include "bench.h"
#include "kvd_store.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define STORE_OBJECT_BYTES 4096u

typedef struct store_opts {
    uint64_t objects[8];
    size_t n_points;
    size_t batch;
    double seconds;
    bool json;
} store_opts_t;

static uint64_t splitmix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void random_keys(kvd_key_t *keys, size_t n, uint64_t seed)
{
    for (size_t i = 0; i < n; i++)
        for (size_t w = 0; w < 4; w++) {
            uint64_t v = splitmix64(&seed);
            memcpy(keys[i] + 8 * w, &v, 8);
        }
}

typedef struct store_result {
    uint64_t objects;
    double insert_per_s;
    double hit_probes_per_s;
    double miss_probes_per_s;
    double index_bytes_per_object;
    double check_ms; /* one kvd_store_check (Stats --check) over the store */
    uint64_t rss_bytes;
    /* a writer's holes: one in each of `holes` objects spread over the
     * pool, handed to the store one call per hole and in one call */
    size_t holes;
    double holes_each_ms, holes_batched_ms;
} store_result_t;

/* Inserts every key in batches: Reserve then Publish of the whole lease. */
static int store_fill(kvd_store_t *s, uint32_t ns, const kvd_key_t *keys, size_t n,
                      size_t batch, double *per_s)
{
    kvd_put_t *puts = calloc(batch, sizeof(*puts));
    uint8_t *res = calloc(batch, 1);
    kvd_loc_t *locs = calloc(batch, sizeof(*locs));
    if (!puts || !res || !locs)
        return -1;
    uint64_t t0 = kvd_now_ns();
    int rc = 0;
    for (size_t at = 0; at < n && rc == 0; at += batch) {
        size_t m = KVD_MIN(batch, n - at);
        for (size_t i = 0; i < m; i++)
            puts[i] = (kvd_put_t){.key = keys[at + i],
                                  .parent = at + i ? keys[at + i - 1] : NULL,
                                  .depth = (uint32_t)((at + i) % 1024)};
        uint64_t lease = 0;
        kvd_store_reserve(s, 1, ns, puts, m, 0, &lease, res, locs);
        for (size_t i = 0; i < m; i++)
            if (res[i] != KVD_RESERVE_ALLOCATED)
                rc = -1;
        if (rc == 0 && kvd_store_publish(s, 1, lease, NULL, 0) != KVD_OK)
            rc = -1;
    }
    *per_s = (double)n / ((double)(kvd_now_ns() - t0) / 1e9);
    free(puts);
    free(res);
    free(locs);
    return rc;
}

/* Probes batches of keys for `seconds`; returns key probes per second. */
static double store_probe(kvd_store_t *s, uint32_t ns, const kvd_key_t *keys, size_t n,
                          size_t batch, double seconds, bool expect_hits)
{
    uint32_t *bounds = calloc(batch, sizeof(*bounds));
    uint64_t seed = 7, probes = 0;
    uint64_t t0 = kvd_now_ns(), end = t0 + (uint64_t)(seconds * 1e9);
    size_t nb;
    while (bounds != NULL && kvd_now_ns() < end) {
        for (int rep = 0; rep < 64; rep++) {
            size_t at = (size_t)(splitmix64(&seed) % (n - batch + 1));
            kvd_lookup_pool_t pool = {.ns = ns,
                                      .keys =
                                          (const uint8_t(*)[KVD_KEY_BYTES])(keys + at),
                                      .n_keys = batch};
            kvd_store_lookup(s, &pool, 1, bounds, &nb);
            if (expect_hits && nb != batch) {
                fprintf(stderr, "kvdock-bench store: a lookup missed stored keys\n");
                free(bounds);
                return 0;
            }
            probes += batch;
        }
    }
    free(bounds);
    return (double)probes / ((double)(kvd_now_ns() - t0) / 1e9);
}

static int cmp_range(const void *a, const void *b)
{
    const kvd_pool_range_t *x = a, *y = b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/* The ranges of h holes of 1 KiB, one inside each of h objects spread over
 * the keys (every step-th from `first`), ascending; 0, or -1 when a key is
 * not found. */
static int hole_ranges(kvd_store_t *s, uint32_t ns, const kvd_key_t *keys, size_t h,
                       size_t step, size_t first, kvd_pool_range_t *out)
{
    for (size_t j = 0; j < h; j++) {
        kvd_obj_info_t info;
        if (kvd_store_inspect(s, ns, keys[first + j * step], &info) != KVD_OK)
            return -1;
        out[j] = (kvd_pool_range_t){info.loc.offset + 1024, 1024};
    }
    qsort(out, h, sizeof(*out), cmp_range);
    return 0;
}

/* kvd_store_pool_lost once per hole against kvd_store_pool_lost_ranges
 * once for as many holes, each on objects of its own, spread alike. */
static int store_holes(kvd_store_t *s, uint32_t ns, const kvd_key_t *keys, size_t n,
                       store_result_t *r)
{
    size_t h = KVD_MIN((size_t)1000, n / 4), step = h ? n / h : 0;
    kvd_pool_range_t *a = calloc(h + 1, sizeof(*a)), *b = calloc(h + 1, sizeof(*b));
    int rc = a && b && h > 0 && hole_ranges(s, ns, keys, h, step, 0, a) == 0 &&
                     hole_ranges(s, ns, keys, h, step, step / 2, b) == 0
                 ? 0
                 : -1;
    uint64_t lost = 0, t0 = kvd_now_ns();
    for (size_t j = 0; rc == 0 && j < h; j++)
        lost += kvd_store_pool_lost(s, a[j].offset, a[j].bytes);
    uint64_t t1 = kvd_now_ns();
    if (rc == 0)
        lost += kvd_store_pool_lost_ranges(s, b, h);
    uint64_t t2 = kvd_now_ns();
    if (rc == 0 && lost != 2 * h) {
        fprintf(stderr,
                "kvdock-bench store: %llu objects lost under %zu holes, want %zu\n",
                (unsigned long long)lost, 2 * h, 2 * h);
        rc = -1;
    }
    r->holes = h;
    r->holes_each_ms = (double)(t1 - t0) / 1e6;
    r->holes_batched_ms = (double)(t2 - t1) / 1e6;
    free(a);
    free(b);
    return rc;
}

static int store_point(const store_opts_t *o, uint64_t n, store_result_t *r)
{
    kvd_key_t *keys = malloc(n * sizeof(kvd_key_t));
    kvd_key_t *absent = malloc(o->batch * 64 * sizeof(kvd_key_t));
    if (keys == NULL || absent == NULL) {
        free(keys);
        free(absent);
        return -1;
    }
    random_keys(keys, n, 1);
    random_keys(absent, o->batch * 64, 2);
    kvd_store_config_t cfg;
    kvd_store_config_default(&cfg, (n + n / 16 + 1) * STORE_OBJECT_BYTES);
    cfg.index_hint = n;
    kvd_store_t *s = NULL;
    uint32_t ns;
    int rc = kvd_store_create(&cfg, &s);
    if (rc == KVD_OK)
        rc = kvd_store_ns_register(s, KVD_TENANT_DEFAULT, KVD_OWNER_PERMANENT,
                                   "bench/kv/tp0", STORE_OBJECT_BYTES, false, &ns);
    if (rc == KVD_OK)
        rc = store_fill(s, ns, keys, n, o->batch, &r->insert_per_s);
    if (rc == KVD_OK) {
        r->objects = n;
        r->hit_probes_per_s = store_probe(s, ns, keys, n, o->batch, o->seconds, true);
        r->miss_probes_per_s =
            store_probe(s, ns, absent, o->batch * 64, o->batch, o->seconds, false);
        kvd_store_stats_t st;
        kvd_store_stats(s, &st);
        r->index_bytes_per_object = (double)st.index_bytes / (double)n;
        char why[256];
        uint64_t t0 = kvd_now_ns();
        rc = kvd_store_check(s, why, sizeof(why));
        r->check_ms = (double)(kvd_now_ns() - t0) / 1e6;
        if (rc != KVD_OK)
            fprintf(stderr, "kvdock-bench store: the invariant check failed: %s\n", why);
        kvd_proc_mem_t pm;
        r->rss_bytes = kvd_proc_mem_read(&pm) == KVD_OK ? pm.rss_bytes : 0;
        if (rc == KVD_OK && store_holes(s, ns, keys, n, r) != 0)
            rc = KVD_ERR_INVALID;
    }
    kvd_store_destroy(s);
    free(keys);
    free(absent);
    return rc == KVD_OK ? 0 : -1;
}

static void store_usage(FILE *f)
{
    fprintf(f, "Usage: kvdock-bench store [--objects N[,N...]] [--batch B] [--seconds S] "
               "[--json]\n"
               "The store engine in process: insert+publish/s, key probes/s (hits and\n"
               "misses), index bytes per object and the time of one invariant check\n"
               "(Stats --check) (default 1000000,10000000 objects,\n"
               "batches of 256, 2 s per probe run).\n");
}

static int store_parse(int argc, char **argv, store_opts_t *o)
{
    static const struct option longopts[] = {{"objects", required_argument, NULL, 'o'},
                                             {"batch", required_argument, NULL, 'b'},
                                             {"seconds", required_argument, NULL, 's'},
                                             {"json", no_argument, NULL, 'j'},
                                             {"help", no_argument, NULL, 'h'},
                                             {NULL, 0, NULL, 0}};
    *o = (store_opts_t){
        .objects = {1000000, 10000000}, .n_points = 2, .batch = 256, .seconds = 2.0};
    int c;
    uint64_t v;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        switch (c) {
        case 'o': {
            o->n_points = 0;
            char buf[256];
            kvd_strlcpy(buf, optarg, sizeof(buf));
            char *save = NULL;
            for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
                if (o->n_points == KVD_ARRAY_SIZE(o->objects) ||
                    kvd_u64_parse(t, 1024, 1ull << 31, &v) != KVD_OK)
                    return BENCH_EXIT_USAGE;
                o->objects[o->n_points++] = v;
            }
            break;
        }
        case 'b':
            if (kvd_u64_parse(optarg, 1, 65536, &v) != KVD_OK)
                return BENCH_EXIT_USAGE;
            o->batch = v;
            break;
        case 's':
            if (kvd_double_parse(optarg, 0.05, 600, &o->seconds) != KVD_OK)
                return BENCH_EXIT_USAGE;
            break;
        case 'j': o->json = true; break;
        case 'h': store_usage(stdout); return -1;
        default: return BENCH_EXIT_USAGE;
        }
    }
    return 0;
}

int bench_mode_store(int argc, char **argv)
{
    store_opts_t o;
    int rc = store_parse(argc, argv, &o);
    if (rc == -1)
        return BENCH_EXIT_OK;
    if (rc != 0) {
        store_usage(stderr);
        return BENCH_EXIT_USAGE;
    }
    if (!o.json)
        printf("%12s %16s %18s %18s %14s %10s %12s\n", "objects", "insert+pub/s",
               "hit probes/s", "miss probes/s", "index B/obj", "check ms", "rss");
    for (size_t i = 0; i < o.n_points; i++) {
        store_result_t r = {0};
        if (store_point(&o, o.objects[i], &r) != 0) {
            fprintf(stderr, "kvdock-bench store: the point at %llu objects failed\n",
                    (unsigned long long)o.objects[i]);
            return BENCH_EXIT_FAIL;
        }
        char rss[32];
        if (o.json)
            printf("{\"mode\":\"store\",\"objects\":%llu,\"batch\":%zu,"
                   "\"insert_publish_per_s\":%.0f,\"hit_probes_per_s\":%.0f,"
                   "\"miss_probes_per_s\":%.0f,\"index_bytes_per_object\":%.1f,"
                   "\"check_ms\":%.1f,\"rss_bytes\":%llu,\"holes\":%zu,"
                   "\"holes_each_ms\":%.2f,\"holes_batched_ms\":%.3f}\n",
                   (unsigned long long)r.objects, o.batch, r.insert_per_s,
                   r.hit_probes_per_s, r.miss_probes_per_s, r.index_bytes_per_object,
                   r.check_ms, (unsigned long long)r.rss_bytes, r.holes, r.holes_each_ms,
                   r.holes_batched_ms);
        else
            printf("%12llu %16.0f %18.0f %18.0f %14.1f %10.1f %12s\n"
                   "%12s %zu holes a writer punched, one in each of as many objects: "
                   "%.1f ms one call per hole, %.3f ms in one call (%.0fx)\n",
                   (unsigned long long)r.objects, r.insert_per_s, r.hit_probes_per_s,
                   r.miss_probes_per_s, r.index_bytes_per_object, r.check_ms,
                   kvd_size_format(r.rss_bytes, rss, sizeof(rss)), "", r.holes,
                   r.holes_each_ms, r.holes_batched_ms,
                   r.holes_batched_ms > 0 ? r.holes_each_ms / r.holes_batched_ms : 0.0);
        fflush(stdout);
    }
    return BENCH_EXIT_OK;
}
