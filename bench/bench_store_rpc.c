/*
 * bench_store_rpc.c - mode `store-rpc` of kvdock-bench: the store through
 * the daemon, over its Unix socket, the way a same-host worker uses it.
 *
 *  - Lookup latency: 256 stored page keys probed by one Lookup (ALL_PAGES),
 *    back to back from one client; p50 and p99 of the round trip.
 *  - The data cycle: Reserve one object, write it into the mapped pool,
 *    Publish, Acquire, read it back, Release, for objects of --object-size
 *    (8 MiB by default). The bytes moved (written + read) per second, beside
 *    a single-core memcpy of the same bytes between the same buffers,
 *    measured in the same run.
 *
 * The daemon is started here (see bench.h) unless --socket names one.
 */
#include "bench.h"

#include <getopt.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define LOOKUP_KEYS 256
#define CALL_MS     5000

typedef struct srpc_opts {
    const char *kvdockd_path;
    const char *socket_path;
    uint64_t object_bytes;
    double seconds;
    bool json;
} srpc_opts_t;

typedef struct srpc_client {
    kvd_client_t *c;
    uint8_t *pool;
    uint64_t pool_bytes;
    uint32_t ns_small, ns_big;
} srpc_client_t;

static uint64_t mix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void make_key(uint64_t *seed, kvd_key_t key)
{
    for (int w = 0; w < 4; w++) {
        uint64_t v = mix(seed);
        memcpy(key + 8 * w, &v, 8);
    }
}

/* One call whose reply must be a success; the reply stays in rep. */
static int call_ok(srpc_client_t *sc, kvd_msg_t *req, kvd_msg_t *rep)
{
    int rc = kvd_client_call(sc->c, req, rep, CALL_MS);
    if (rc == KVD_OK && rep->status != KVD_OK) {
        fprintf(stderr, "kvdock-bench store-rpc: %s: %s\n", kvd_method_name(req->method),
                rep->error);
        rc = rep->status;
    }
    return rc;
}

/* Hello with two namespaces and the pool's descriptor; maps the pool. */
static int srpc_connect(const char *socket, uint64_t object_bytes, srpc_client_t *sc)
{
    memset(sc, 0, sizeof(*sc));
    int rc = kvd_client_connect_unix(socket, CALL_MS, &sc->c);
    if (rc != KVD_OK)
        return rc;
    kvd_ns_spec_t ns[2] = {{.object_bytes = 64 * KVD_KiB},
                           {.object_bytes = object_bytes}};
    snprintf(ns[0].name, sizeof(ns[0].name), "bench/kv/tp0");
    snprintf(ns[1].name, sizeof(ns[1].name), "bench/big-%llu/tp0",
             (unsigned long long)object_bytes);
    kvd_msg_t req, rep;
    kvd_msg_request(&req, 0, KVD_METHOD_HELLO);
    kvd_strlcpy(req.body.hello_req.client_name, "kvdock-bench", KVD_NAME_MAX);
    req.body.hello_req.protocol_version = KVD_PROTOCOL_VERSION;
    req.body.hello_req.want_pool_fd = true;
    req.body.hello_req.n_namespaces = 2;
    req.body.hello_req.namespaces = ns;
    rc = call_ok(sc, &req, &rep);
    int fd = kvd_client_take_fd(sc->c);
    if (rc == KVD_OK && (fd < 0 || rep.body.hello_rep.n_ns_ids != 2))
        rc = KVD_ERR_PROTOCOL;
    if (rc == KVD_OK) {
        sc->ns_small = rep.body.hello_rep.ns_ids[0];
        sc->ns_big = rep.body.hello_rep.ns_ids[1];
        sc->pool_bytes = rep.body.hello_rep.pool_bytes;
        /* populated up front, as a worker maps its pool once at start: page
         * faults belong to start-up, not to each transfer */
        sc->pool = mmap(NULL, sc->pool_bytes, PROT_READ | PROT_WRITE,
                        MAP_SHARED | MAP_POPULATE, fd, 0);
        if (sc->pool == MAP_FAILED) {
            sc->pool = NULL;
            rc = KVD_ERR_IO;
        }
    }
    if (fd >= 0)
        close(fd);
    kvd_msg_clear(&rep);
    return rc;
}

static void srpc_close(srpc_client_t *sc)
{
    if (sc->pool)
        munmap(sc->pool, sc->pool_bytes);
    kvd_client_close(sc->c);
}

/* Reserves, writes and publishes n keys of ns; fills offsets. */
static int put_keys(srpc_client_t *sc, uint32_t ns, uint64_t object_bytes,
                    const kvd_key_t *keys, size_t n, const uint8_t *src,
                    uint64_t *offsets)
{
    kvd_put_item_t *items = calloc(n, sizeof(*items));
    if (items == NULL)
        return KVD_ERR_NOMEM;
    for (size_t i = 0; i < n; i++) {
        memcpy(items[i].key, keys[i], KVD_KEY_BYTES);
        if (i > 0) {
            memcpy(items[i].parent, keys[i - 1], KVD_KEY_BYTES);
            items[i].has_parent = true;
        }
        items[i].depth = (uint32_t)i;
    }
    kvd_msg_t req, rep;
    kvd_msg_request(&req, 0, KVD_METHOD_RESERVE);
    req.body.reserve_req = (kvd_reserve_req_t){
        .ns = ns, .object_bytes = object_bytes, .n = n, .items = items};
    int rc = call_ok(sc, &req, &rep);
    uint64_t lease = rep.body.reserve_rep.lease_id;
    for (size_t i = 0; rc == KVD_OK && i < n; i++) {
        uint64_t off = rep.body.reserve_rep.offsets[i];
        if (rep.body.reserve_rep.results[i] != KVD_RESERVE_ALLOCATED ||
            off + object_bytes > sc->pool_bytes)
            rc = KVD_ERR_NO_SPACE;
        else
            memcpy(sc->pool + off, src, object_bytes);
        if (offsets)
            offsets[i] = off;
    }
    kvd_msg_clear(&rep);
    free(items);
    if (rc != KVD_OK)
        return rc;
    kvd_msg_request(&req, 0, KVD_METHOD_PUBLISH);
    req.body.finish_req.lease_id = lease;
    rc = call_ok(sc, &req, &rep);
    kvd_msg_clear(&rep);
    return rc;
}

/* Acquires n keys, reads them into dst (one object's room, reused), releases. */
static int get_keys(srpc_client_t *sc, uint32_t ns, uint64_t object_bytes,
                    kvd_key_t *keys, size_t n, uint8_t *dst)
{
    kvd_msg_t req, rep;
    kvd_msg_request(&req, 0, KVD_METHOD_ACQUIRE);
    req.body.acquire_req =
        (kvd_acquire_req_t){.ns = ns, .object_bytes = object_bytes, .n = n, .keys = keys};
    int rc = call_ok(sc, &req, &rep);
    uint64_t lease = rep.body.acquire_rep.lease_id;
    for (size_t i = 0; rc == KVD_OK && i < n; i++) {
        uint64_t off = rep.body.acquire_rep.offsets[i];
        if (off + object_bytes > sc->pool_bytes)
            rc = KVD_ERR_PROTOCOL;
        else
            memcpy(dst, sc->pool + off, object_bytes);
    }
    kvd_msg_clear(&rep);
    if (rc != KVD_OK)
        return rc;
    kvd_msg_request(&req, 0, KVD_METHOD_RELEASE);
    req.body.release_req.lease_id = lease;
    rc = call_ok(sc, &req, &rep);
    kvd_msg_clear(&rep);
    return rc;
}

/* Lookup of 256 stored keys, back to back; fills p50/p99 (us). */
static int bench_lookup(srpc_client_t *sc, double seconds, double *p50, double *p99,
                        double *per_s)
{
    kvd_key_t keys[LOOKUP_KEYS];
    uint64_t seed = 11;
    for (size_t i = 0; i < LOOKUP_KEYS; i++)
        make_key(&seed, keys[i]);
    uint8_t *page = calloc(1, 64 * KVD_KiB);
    int rc = page
                 ? put_keys(sc, sc->ns_small, 64 * KVD_KiB, keys, LOOKUP_KEYS, page, NULL)
                 : KVD_ERR_NOMEM;
    free(page);
    bench_hist_t *h = calloc(1, sizeof(*h));
    if (rc != KVD_OK || h == NULL) {
        free(h);
        return rc ? rc : KVD_ERR_NOMEM;
    }
    kvd_lookup_pool_msg_t pool = {
        .ns = sc->ns_small, .n_keys = LOOKUP_KEYS, .keys = keys};
    uint64_t start = kvd_now_ns(), end = start + (uint64_t)(seconds * 1e9);
    while (rc == KVD_OK && kvd_now_ns() < end) {
        kvd_msg_t req, rep;
        kvd_msg_request(&req, 0, KVD_METHOD_LOOKUP);
        req.body.lookup_req = (kvd_lookup_req_t){.n_pools = 1, .pools = &pool};
        uint64_t t0 = kvd_now_ns();
        rc = call_ok(sc, &req, &rep);
        uint64_t t1 = kvd_now_ns();
        if (rc == KVD_OK && rep.body.lookup_rep.n != LOOKUP_KEYS)
            rc = KVD_ERR_NOT_FOUND;
        kvd_msg_clear(&rep);
        hist_add(h, t1 - t0);
    }
    *p50 = (double)hist_quantile_ns(h, 0.5) / 1e3;
    *p99 = (double)hist_quantile_ns(h, 0.99) / 1e3;
    *per_s = (double)h->count / ((double)(kvd_now_ns() - start) / 1e9);
    free(h);
    return rc;
}

/* The cycle, then memcpy of the same bytes; GB/s of both. */
static int bench_cycle(srpc_client_t *sc, uint64_t object_bytes, double seconds,
                       double *cycle_gbs, double *memcpy_gbs, uint64_t *cycles)
{
    uint8_t *src = malloc(object_bytes), *dst = malloc(object_bytes);
    if (src == NULL || dst == NULL) {
        free(src);
        free(dst);
        return KVD_ERR_NOMEM;
    }
    memset(src, 0x5a, object_bytes);
    memset(dst, 0, object_bytes);
    size_t cap = 1u << 16;
    uint64_t *offs = calloc(cap, sizeof(*offs));
    uint64_t seed = 99, n = 0;
    int rc = offs ? KVD_OK : KVD_ERR_NOMEM;
    uint64_t start = kvd_now_ns(), end = start + (uint64_t)(seconds * 1e9);
    while (rc == KVD_OK && n < cap && kvd_now_ns() < end) {
        kvd_key_t key;
        make_key(&seed, key);
        rc = put_keys(sc, sc->ns_big, object_bytes, &key, 1, src, &offs[n]);
        if (rc == KVD_OK)
            rc = get_keys(sc, sc->ns_big, object_bytes, &key, 1, dst);
        n++;
    }
    double secs = (double)(kvd_now_ns() - start) / 1e9;
    *cycle_gbs = 2.0 * (double)object_bytes * (double)n / secs / 1e9;
    *cycles = n;
    if (rc == KVD_OK && memcmp(src, dst, object_bytes) != 0) {
        fprintf(stderr, "kvdock-bench store-rpc: the bytes read back differ\n");
        rc = KVD_ERR_PROTOCOL;
    }
    /* the reference: the same two copies per cycle, to and from the same
     * places in the pool, with nothing else, on this core */
    start = kvd_now_ns();
    for (uint64_t i = 0; i < n; i++) {
        memcpy(sc->pool + offs[i], src, object_bytes);
        __asm__ volatile("" ::: "memory");
        memcpy(dst, sc->pool + offs[i], object_bytes);
        __asm__ volatile("" ::: "memory");
    }
    secs = (double)(kvd_now_ns() - start) / 1e9;
    *memcpy_gbs = 2.0 * (double)object_bytes * (double)n / secs / 1e9;
    free(offs);
    free(src);
    free(dst);
    return rc;
}

static void srpc_usage(FILE *f)
{
    fprintf(f,
            "Usage: kvdock-bench store-rpc [--kvdockd PATH | --socket PATH] "
            "[--object-size SIZE] [--seconds S] [--json]\n"
            "Lookup of 256 keys (p50/p99) and the Reserve/write/Publish/Acquire/read/\n"
            "Release cycle of --object-size objects (default 8M) in GB/s beside a\n"
            "single-core memcpy of the same bytes.\n");
}

static int srpc_parse(int argc, char **argv, srpc_opts_t *o)
{
    static const struct option longopts[] = {
        {"kvdockd", required_argument, NULL, 'k'},
        {"socket", required_argument, NULL, 's'},
        {"object-size", required_argument, NULL, 'o'},
        {"seconds", required_argument, NULL, 't'},
        {"json", no_argument, NULL, 'j'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0}};
    *o = (srpc_opts_t){.object_bytes = 8 * KVD_MiB, .seconds = 3.0};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        switch (c) {
        case 'k': o->kvdockd_path = optarg; break;
        case 's': o->socket_path = optarg; break;
        case 'o':
            if (kvd_size_parse(optarg, &o->object_bytes) != KVD_OK ||
                o->object_bytes < 4096 || o->object_bytes > 64 * KVD_MiB)
                return BENCH_EXIT_USAGE;
            break;
        case 't':
            if (kvd_double_parse(optarg, 0.1, 600, &o->seconds) != KVD_OK)
                return BENCH_EXIT_USAGE;
            break;
        case 'j': o->json = true; break;
        case 'h': srpc_usage(stdout); return -1;
        default: return BENCH_EXIT_USAGE;
        }
    }
    return (o->kvdockd_path != NULL) == (o->socket_path != NULL) ? BENCH_EXIT_USAGE : 0;
}

int bench_mode_store_rpc(int argc, char **argv)
{
    srpc_opts_t o;
    int rc = srpc_parse(argc, argv, &o);
    if (rc == -1)
        return BENCH_EXIT_OK;
    if (rc != 0) {
        srpc_usage(stderr);
        return BENCH_EXIT_USAGE;
    }
    bench_env_t env;
    if (bench_env_init(&env) != KVD_OK)
        return BENCH_EXIT_FAIL;
    const char *socket = o.socket_path ? o.socket_path : env.daemon_socket;
    rc = o.kvdockd_path ? bench_daemon_start(&env, o.kvdockd_path, "1G", false) : KVD_OK;
    srpc_client_t sc = {0};
    if (rc == KVD_OK)
        rc = srpc_connect(socket, o.object_bytes, &sc);
    double p50 = 0, p99 = 0, lps = 0, cyc = 0, mem = 0;
    uint64_t cycles = 0;
    if (rc == KVD_OK)
        rc = bench_lookup(&sc, o.seconds, &p50, &p99, &lps);
    if (rc == KVD_OK)
        rc = bench_cycle(&sc, o.object_bytes, o.seconds, &cyc, &mem, &cycles);
    srpc_close(&sc);
    bench_env_cleanup(&env);
    if (rc != KVD_OK) {
        fprintf(stderr, "kvdock-bench store-rpc: failed: %s\n", kvd_status_str(rc));
        return BENCH_EXIT_FAIL;
    }
    char obj[32];
    kvd_size_format(o.object_bytes, obj, sizeof(obj));
    if (o.json) {
        printf(
            "{\"mode\":\"store-rpc\",\"lookup_keys\":%d,\"lookup_p50_us\":%.1f,"
            "\"lookup_p99_us\":%.1f,\"lookups_per_s\":%.0f,\"object_bytes\":%llu,"
            "\"cycles\":%llu,\"cycle_gb_s\":%.2f,\"memcpy_gb_s\":%.2f,\"ratio\":%.2f}\n",
            LOOKUP_KEYS, p50, p99, lps, (unsigned long long)o.object_bytes,
            (unsigned long long)cycles, cyc, mem, mem > 0 ? cyc / mem : 0.0);
    } else {
        printf("Lookup of %d keys: p50 %.1f us, p99 %.1f us, %.0f lookups/s\n",
               LOOKUP_KEYS, p50, p99, lps);
        printf("Cycle of %s objects (reserve, write, publish, acquire, read, release): "
               "%.2f GB/s over %llu cycles; memcpy of the same bytes: %.2f GB/s; ratio "
               "%.2f\n",
               obj, cyc, (unsigned long long)cycles, mem, mem > 0 ? cyc / mem : 0.0);
    }
    return BENCH_EXIT_OK;
}
