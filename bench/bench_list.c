/*
 * bench_list.c - mode `list-stall` of kvdock-bench: how long the daemon's
 * other clients wait while one lists a hostile store (issue 11, hole 5).
 *
 * The state is made through the RPC, as an attacker would: --empty empty
 * namespaces (4,095) of the same model as the one holding data, a chain of
 * --chain pages (1,000) and --leaves leaves (600), leaf j a child of chain
 * page (chain - leaves - 1 + j). Then one thread does Health round trips back to
 * back on its own connection while the main thread lists every namespace,
 * following next_cursor to the end (a daemon that does not page answers in
 * one reply). Reported: the pages, the whole listing's time, the slowest
 * page, and the Health round trips during the listing (count, p50, worst).
 * Then the other methods on the same state, each timed once: Stats (the
 * namespace table), Inspect of a chain key in every namespace, Lookup of
 * 4,096 keys in 8 pools, and the
 * RegisterNamespace of the empty namespaces (from the setup). With
 * --evict-objects N, a second namespace gets N objects (the pool grows to
 * hold them) and is evicted, following the Evict cursor where the daemon
 * gives one: the calls and the slowest one are reported. Last, from the
 * daemon's own Stats, each of those methods' mean and slowest latency
 * bucket (the time the daemon spent on one call, from its clock).
 *
 * The daemon is started here (see bench.h) unless --socket names one.
 */
#include "bench.h"

#include <getopt.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define OBJ_BYTES 4096u
#define CALL_MS   900000 /* a daemon that does not page: a minute, more when busy */
#define PAGES_MAX 100000u

typedef struct ls_opts {
    const char *kvdockd_path;
    const char *socket_path;
    uint32_t empty, chain, leaves;
    uint64_t evict_objects;
    bool json;
} ls_opts_t;

static void ls_usage(FILE *f)
{
    fprintf(f,
            "Usage: kvdock-bench list-stall (--kvdockd PATH | --socket S) [--empty N]\n"
            "         [--chain N] [--leaves N] [--evict-objects N] [--json]\n"
            "Health round trips while one client lists a hostile store; defaults\n"
            "4095 empty namespaces, a 1000-page chain, 600 leaves.\n");
}

static int ls_parse(int argc, char **argv, ls_opts_t *o)
{
    *o = (ls_opts_t){.empty = 4095, .chain = 1000, .leaves = 600};
    static const struct option longopts[] = {
        {"kvdockd", required_argument, NULL, 'k'},
        {"socket", required_argument, NULL, 's'},
        {"empty", required_argument, NULL, 'e'},
        {"chain", required_argument, NULL, 'c'},
        {"leaves", required_argument, NULL, 'l'},
        {"json", no_argument, NULL, 'j'},
        {"evict-objects", required_argument, NULL, 'x'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0}};
    optind = 1;
    int ch;
    uint64_t v;
    while ((ch = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        switch (ch) {
        case 'k': o->kvdockd_path = optarg; break;
        case 's': o->socket_path = optarg; break;
        case 'j': o->json = true; break;
        case 'h': ls_usage(stdout); return -1;
        case 'x':
            if (kvd_u64_parse(optarg, 0, 4u << 20, &o->evict_objects) != KVD_OK)
                return 1;
            break;
        case 'e':
        case 'c':
        case 'l':
            if (kvd_u64_parse(optarg, ch == 'e' ? 0 : 1, ch == 'e' ? 4095 : 4096, &v) !=
                KVD_OK)
                return 1;
            *(ch == 'e' ? &o->empty : ch == 'c' ? &o->chain : &o->leaves) = (uint32_t)v;
            break;
        default: return 1;
        }
    }
    if (o->evict_objects > 0 && o->empty > 4094)
        o->empty = 4094; /* room for the namespace to evict */
    if ((o->kvdockd_path == NULL) == (o->socket_path == NULL) || o->leaves >= o->chain)
        return 1;
    return 0;
}

static int call(kvd_client_t *c, kvd_msg_t *req, kvd_msg_t *rep)
{
    int rc = kvd_client_call(c, req, rep, CALL_MS);
    if (rc == KVD_OK && rep->status != KVD_OK) {
        fprintf(stderr, "kvdock-bench list-stall: %s: %s\n", kvd_method_name(req->method),
                rep->error);
        rc = rep->status;
    }
    return rc;
}

static int hello(kvd_client_t *c, const kvd_ns_spec_t *spec, size_t n, uint32_t *ids)
{
    kvd_msg_t req, rep;
    kvd_msg_request(&req, 0, KVD_METHOD_HELLO);
    kvd_hello_req_t *h = &req.body.hello_req;
    kvd_strlcpy(h->client_name, "bench-list", sizeof(h->client_name));
    h->pid = (uint32_t)getpid();
    h->protocol_version = KVD_PROTOCOL_VERSION;
    h->n_namespaces = n;
    h->namespaces = (kvd_ns_spec_t *)spec;
    int rc = call(c, &req, &rep);
    if (rc == KVD_OK && n > 0)
        ids[0] = rep.body.hello_rep.ns_ids[0];
    kvd_msg_clear(&rep);
    return rc;
}

static void key_of(uint32_t i, kvd_key_t key)
{
    memset(key, 0, KVD_KEY_BYTES);
    memcpy(key, &i, sizeof(i));
    key[31] = 0xb7;
}

/* Reserves and publishes n items in ns. */
static int put(kvd_client_t *c, uint32_t ns, kvd_put_item_t *items, size_t n)
{
    kvd_msg_t req, rep;
    kvd_msg_request(&req, 0, KVD_METHOD_RESERVE);
    req.body.reserve_req =
        (kvd_reserve_req_t){.ns = ns, .object_bytes = OBJ_BYTES, .n = n, .items = items};
    int rc = call(c, &req, &rep);
    uint64_t lease = rep.body.reserve_rep.lease_id;
    kvd_msg_clear(&rep);
    if (rc != KVD_OK)
        return rc;
    kvd_msg_request(&req, 0, KVD_METHOD_PUBLISH);
    req.body.finish_req.lease_id = lease;
    rc = call(c, &req, &rep);
    kvd_msg_clear(&rep);
    return rc;
}

/* The daemon's CPU time (ns) when pid is known, else UINT64_MAX. */
static uint64_t daemon_cpu(pid_t pid)
{
    return pid ? bench_proc_cpu_ns(pid) : UINT64_MAX;
}

static double cpu_ms(uint64_t a, uint64_t b)
{
    return a != UINT64_MAX && b != UINT64_MAX && b >= a ? (double)(b - a) / 1e6 : -1.0;
}

static int setup(kvd_client_t *c, const ls_opts_t *o, pid_t pid, double *register_ms,
                 double *register_cpu_ms)
{
    kvd_ns_spec_t spec = {.object_bytes = OBJ_BYTES};
    kvd_strlcpy(spec.name, "bench/kv/tp0", sizeof(spec.name));
    uint32_t ns = 0;
    int rc = hello(c, &spec, 1, &ns);
    kvd_ns_spec_t *specs = calloc(o->empty + 1, sizeof(*specs));
    kvd_put_item_t *items = calloc(o->chain, sizeof(*items));
    if (specs == NULL || items == NULL)
        rc = KVD_ERR_NOMEM;
    kvd_msg_t req, rep;
    if (rc == KVD_OK && o->empty > 0) {
        for (uint32_t i = 0; i < o->empty; i++) {
            snprintf(specs[i].name, sizeof(specs[i].name), "bench/empty%04u/tp0", i);
            specs[i].object_bytes = OBJ_BYTES;
        }
        kvd_msg_request(&req, 0, KVD_METHOD_REGISTER_NAMESPACE);
        req.body.register_req = (kvd_register_req_t){.n = o->empty, .namespaces = specs};
        uint64_t t0 = kvd_now_ns(), c0 = daemon_cpu(pid);
        rc = call(c, &req, &rep);
        *register_ms = (double)(kvd_now_ns() - t0) / 1e6;
        *register_cpu_ms = cpu_ms(c0, daemon_cpu(pid));
        kvd_msg_clear(&rep);
    }
    for (uint32_t i = 0; rc == KVD_OK && i < o->chain; i++) {
        memset(&items[i], 0, sizeof(items[i]));
        key_of(i, items[i].key);
        items[i].has_parent = i > 0;
        if (i > 0)
            key_of(i - 1, items[i].parent);
        items[i].depth = i;
    }
    if (rc == KVD_OK)
        rc = put(c, ns, items, o->chain);
    uint32_t at = o->chain - o->leaves - 1;
    for (uint32_t j = 0; rc == KVD_OK && j < o->leaves; j++) {
        memset(&items[j], 0, sizeof(items[j]));
        key_of(0x10000000u + j, items[j].key);
        items[j].has_parent = true;
        key_of(at + j, items[j].parent);
        items[j].depth = at + j + 1;
    }
    if (rc == KVD_OK)
        rc = put(c, ns, items, o->leaves);
    free(specs);
    free(items);
    return rc;
}

typedef struct ls_health {
    const char *socket;
    atomic_bool stop, measuring;
    bench_hist_t hist; /* while measuring; read after the join */
    int rc;
} ls_health_t;

static void *health_main(void *arg)
{
    ls_health_t *h = arg;
    kvd_client_t *c = NULL;
    h->rc = kvd_client_connect_unix(h->socket, 5000, &c);
    if (h->rc == KVD_OK)
        h->rc = hello(c, NULL, 0, NULL);
    for (uint64_t i = 0; h->rc == KVD_OK && !atomic_load(&h->stop) && i < 100000000ull;
         i++) {
        kvd_msg_t req, rep;
        kvd_msg_request(&req, 0, KVD_METHOD_HEALTH);
        uint64_t t0 = kvd_now_ns();
        h->rc = call(c, &req, &rep);
        uint64_t dt = kvd_now_ns() - t0;
        kvd_msg_clear(&rep);
        if (atomic_load(&h->measuring))
            hist_add(&h->hist, dt);
    }
    kvd_client_close(c);
    return NULL;
}

typedef struct ls_result {
    uint32_t pages, prefixes, evict_calls;
    uint64_t evicted;
    double list_ms, worst_page_ms, register_ms, stats_ms, inspect_ms, evict_worst_ms;
    double lookup_ms, list_cpu_ms, register_cpu_ms; /* the daemon's CPU time */
    bench_hist_t health;
} ls_result_t;

static int list_all(kvd_client_t *c, ls_result_t *r)
{
    kvd_msg_t req, *rep = calloc(1, sizeof(*rep));
    if (rep == NULL)
        return KVD_ERR_NOMEM;
    uint8_t cursor[KVD_CURSOR_MAX];
    size_t cursor_len = 0;
    int rc = KVD_OK;
    uint64_t t0 = kvd_now_ns();
    while (rc == KVD_OK && r->pages < PAGES_MAX) {
        kvd_msg_request(&req, 0, KVD_METHOD_LIST_PREFIXES);
        memcpy(req.body.list_req.cursor, cursor, cursor_len);
        req.body.list_req.cursor_len = cursor_len;
        uint64_t p0 = kvd_now_ns();
        rc = call(c, &req, rep);
        double ms = (double)(kvd_now_ns() - p0) / 1e6;
        r->worst_page_ms = ms > r->worst_page_ms ? ms : r->worst_page_ms;
        if (rc != KVD_OK)
            break;
        r->pages++;
        const kvd_list_rep_t *l = &rep->body.list_rep;
        r->prefixes += (uint32_t)l->n_prefixes;
        cursor_len =
            l->truncated && l->next_cursor_len <= sizeof(cursor) ? l->next_cursor_len : 0;
        memcpy(cursor, l->next_cursor, cursor_len);
        kvd_msg_clear(rep);
        if (cursor_len == 0)
            break;
    }
    r->list_ms = (double)(kvd_now_ns() - t0) / 1e6;
    free(rep);
    return rc;
}

/* Stats, Inspect("", a chain key) and a Lookup in n_pools (up to 8) pools,
 * once each, on the hostile state. */
static int others(kvd_client_t *c, uint32_t n_pools, ls_result_t *r)
{
    kvd_msg_t req, rep;
    kvd_msg_request(&req, 0, KVD_METHOD_STATS);
    uint64_t t0 = kvd_now_ns();
    int rc = call(c, &req, &rep);
    r->stats_ms = (double)(kvd_now_ns() - t0) / 1e6;
    kvd_msg_clear(&rep);
    kvd_msg_request(&req, 0, KVD_METHOD_INSPECT);
    key_of(1, req.body.inspect_req.key);
    t0 = kvd_now_ns();
    if (rc == KVD_OK)
        rc = call(c, &req, &rep);
    r->inspect_ms = (double)(kvd_now_ns() - t0) / 1e6;
    kvd_msg_clear(&rep);
    /* Lookup of 4,096 keys in 8 pools (ids 0..7): 32,768 probes */
    kvd_key_t *keys = calloc(4096, sizeof(kvd_key_t));
    if (keys == NULL)
        return KVD_ERR_NOMEM;
    for (uint32_t i = 0; i < 4096; i++)
        key_of(i, keys[i]);
    kvd_lookup_pool_msg_t pools[8];
    for (uint32_t p = 0; p < n_pools; p++)
        pools[p] = (kvd_lookup_pool_msg_t){.ns = p, .n_keys = 4096, .keys = keys};
    kvd_msg_request(&req, 0, KVD_METHOD_LOOKUP);
    req.body.lookup_req.n_pools = n_pools;
    req.body.lookup_req.pools = pools;
    t0 = kvd_now_ns();
    if (rc == KVD_OK)
        rc = call(c, &req, &rep);
    r->lookup_ms = (double)(kvd_now_ns() - t0) / 1e6;
    kvd_msg_clear(&rep);
    free(keys);
    return rc;
}

/* Fills namespace bench/big/tp0 with n objects (batches of 4,096), then
 * evicts it, following the cursor when there is one. */
static int evict_big(kvd_client_t *c, uint64_t n, ls_result_t *r)
{
    kvd_ns_spec_t spec = {.object_bytes = OBJ_BYTES};
    kvd_strlcpy(spec.name, "bench/big/tp0", sizeof(spec.name));
    kvd_msg_t req, rep;
    kvd_msg_request(&req, 0, KVD_METHOD_REGISTER_NAMESPACE);
    req.body.register_req = (kvd_register_req_t){.n = 1, .namespaces = &spec};
    int rc = call(c, &req, &rep);
    uint32_t ns = rc == KVD_OK ? rep.body.register_rep.ids[0] : 0;
    kvd_msg_clear(&rep);
    kvd_put_item_t *items = calloc(4096, sizeof(*items));
    if (items == NULL)
        rc = KVD_ERR_NOMEM;
    for (uint64_t done = 0; rc == KVD_OK && done < n;) {
        size_t k = (size_t)KVD_MIN(n - done, (uint64_t)4096);
        for (size_t i = 0; i < k; i++) {
            memset(&items[i], 0, sizeof(items[i]));
            key_of(0x20000000u + (uint32_t)(done + i), items[i].key);
        }
        rc = put(c, ns, items, k);
        done += k;
    }
    free(items);
    uint8_t cursor[KVD_CURSOR_MAX];
    size_t cursor_len = 0;
    while (rc == KVD_OK && r->evict_calls < 10000000u) {
        kvd_msg_request(&req, 0, KVD_METHOD_EVICT);
        kvd_strlcpy(req.body.evict_req.ns_name, spec.name, KVD_NS_NAME_BYTES);
        memcpy(req.body.evict_req.cursor, cursor, cursor_len);
        req.body.evict_req.cursor_len = cursor_len;
        uint64_t t0 = kvd_now_ns();
        rc = call(c, &req, &rep);
        double ms = (double)(kvd_now_ns() - t0) / 1e6;
        r->evict_worst_ms = ms > r->evict_worst_ms ? ms : r->evict_worst_ms;
        r->evict_calls++;
        r->evicted += rep.body.evict_rep.evicted;
        cursor_len = rep.body.evict_rep.next_cursor_len;
        if (cursor_len > sizeof(cursor))
            cursor_len = 0;
        memcpy(cursor, rep.body.evict_rep.next_cursor, cursor_len);
        kvd_msg_clear(&rep);
        if (cursor_len == 0)
            break;
    }
    return rc;
}

/* The daemon's own figures of a method: mean and the slowest bucket. */
static void method_line(const kvd_stats_rep_t *st, kvd_method_t m, bool json, bool first)
{
    const kvd_method_stats_t *ms = &st->methods[m];
    size_t top = 0;
    for (size_t b = 0; b < KVD_LATENCY_BUCKETS; b++)
        if (ms->latency_buckets[b] > 0)
            top = b;
    double mean = ms->calls ? (double)ms->latency_us_sum / (double)ms->calls / 1e3 : 0;
    uint64_t bound = kvd_latency_bound_us(top);
    if (json)
        printf("%s\"%s\":{\"calls\":%llu,\"mean_ms\":%.3f,\"slowest_under_ms\":%.3f}",
               first ? "" : ",", kvd_method_name(m), (unsigned long long)ms->calls, mean,
               bound == UINT64_MAX ? -1.0 : (double)bound / 1e3);
    else if (ms->calls > 0)
        printf("  %-14s %8llu calls, mean %8.3f ms, every call under %s%.3f ms\n",
               kvd_method_name(m), (unsigned long long)ms->calls, mean,
               bound == UINT64_MAX ? "(beyond the last bucket) " : "",
               bound == UINT64_MAX ? (double)kvd_latency_bound_us(top - 1) / 1e3
                                   : (double)bound / 1e3);
}

static void daemon_lines(kvd_client_t *c, bool json)
{
    kvd_msg_t req, rep;
    kvd_msg_request(&req, 0, KVD_METHOD_STATS);
    if (call(c, &req, &rep) != KVD_OK) {
        kvd_msg_clear(&rep);
        return;
    }
    static const kvd_method_t ms[] = {
        KVD_METHOD_LIST_PREFIXES, KVD_METHOD_HEALTH,
        KVD_METHOD_LOOKUP,        KVD_METHOD_REGISTER_NAMESPACE,
        KVD_METHOD_INSPECT,       KVD_METHOD_STATS,
        KVD_METHOD_EVICT};
    printf(json ? "{\"mode\":\"list-stall-daemon\"," : "the daemon's own clock:\n");
    for (size_t i = 0; i < KVD_ARRAY_SIZE(ms); i++)
        method_line(&rep.body.stats_rep, ms[i], json, i == 0);
    if (json)
        printf("}\n");
    kvd_msg_clear(&rep);
}

int bench_mode_list_stall(int argc, char **argv)
{
    ls_opts_t o;
    int rc = ls_parse(argc, argv, &o);
    if (rc == -1)
        return BENCH_EXIT_OK;
    if (rc != 0) {
        ls_usage(stderr);
        return BENCH_EXIT_USAGE;
    }
    bench_env_t env;
    if (bench_env_init(&env) != KVD_OK)
        return BENCH_EXIT_FAIL;
    const char *socket = o.socket_path ? o.socket_path : env.daemon_socket;
    char pool[32];
    snprintf(pool, sizeof(pool), "%lluM",
             (unsigned long long)(64 + (o.evict_objects * OBJ_BYTES >> 20) * 11 / 10));
    rc = o.kvdockd_path ? bench_daemon_start(&env, o.kvdockd_path, pool, false) : KVD_OK;
    kvd_client_t *c = NULL;
    if (rc == KVD_OK)
        rc = kvd_client_connect_unix(socket, 5000, &c);
    static ls_result_t r;
    if (rc == KVD_OK)
        rc = setup(c, &o, env.daemon_pid, &r.register_ms, &r.register_cpu_ms);
    static ls_health_t h;
    h.socket = socket;
    pthread_t th;
    bool started = rc == KVD_OK && pthread_create(&th, NULL, health_main, &h) == 0;
    if (started) {
        usleep(100 * 1000); /* the Health client connected and going */
        atomic_store(&h.measuring, true);
        uint64_t cpu0 = daemon_cpu(env.daemon_pid);
        rc = list_all(c, &r);
        r.list_cpu_ms = cpu_ms(cpu0, daemon_cpu(env.daemon_pid));
        atomic_store(&h.measuring, false);
        atomic_store(&h.stop, true);
        pthread_join(th, NULL);
        if (rc == KVD_OK)
            rc = h.rc;
    }
    if (rc == KVD_OK)
        rc = others(c, KVD_MIN(8u, o.empty + 1), &r);
    if (rc == KVD_OK && o.evict_objects > 0)
        rc = evict_big(c, o.evict_objects, &r);
    if (rc != KVD_OK) {
        kvd_client_close(c);
        bench_env_cleanup(&env);
        fprintf(stderr, "kvdock-bench list-stall: failed: %s\n", kvd_status_str(rc));
        return BENCH_EXIT_FAIL;
    }
    double p50 = (double)hist_quantile_ns(&h.hist, 0.5) / 1e6;
    double worst = (double)h.hist.max_ns / 1e6;
    if (o.json) {
        printf("{\"mode\":\"list-stall\",\"empty\":%u,\"chain\":%u,\"leaves\":%u,"
               "\"pages\":%u,\"prefixes\":%u,\"list_ms\":%.2f,\"worst_page_ms\":%.2f,"
               "\"health_calls\":%llu,\"health_p50_ms\":%.3f,\"health_worst_ms\":%.2f,"
               "\"register_ms\":%.2f,\"stats_ms\":%.2f,\"inspect_ms\":%.2f,"
               "\"evict_objects\":%llu,\"evicted\":%llu,\"evict_calls\":%u,"
               "\"evict_worst_ms\":%.2f}\n",
               o.empty, o.chain, o.leaves, r.pages, r.prefixes, r.list_ms,
               r.worst_page_ms, (unsigned long long)h.hist.count, p50, worst,
               r.register_ms, r.stats_ms, r.inspect_ms,
               (unsigned long long)o.evict_objects, (unsigned long long)r.evicted,
               r.evict_calls, r.evict_worst_ms);
    } else {
        printf("state: %u empty namespaces, a %u-page chain, %u leaves\n", o.empty,
               o.chain, o.leaves);
        printf(
            "ListPrefixes(\"\"): %u prefixes in %u pages, %.1f ms in all, slowest page "
            "%.2f ms; the daemon's CPU meanwhile %.1f ms\n",
            r.prefixes, r.pages, r.list_ms, r.worst_page_ms, r.list_cpu_ms);
        printf("Health meanwhile: %llu round trips, p50 %.3f ms, worst %.2f ms\n",
               (unsigned long long)h.hist.count, p50, worst);
        printf("RegisterNamespace of %u: %.1f ms (daemon CPU %.1f ms); Stats: %.2f ms; "
               "Inspect in every "
               "namespace: %.2f ms; Lookup of 4096 keys x 8 pools: %.2f ms\n",
               o.empty, r.register_ms, r.register_cpu_ms, r.stats_ms, r.inspect_ms,
               r.lookup_ms);
        if (o.evict_objects > 0)
            printf("Evict of a namespace of %llu objects: %llu evicted in %u calls, the "
                   "slowest %.2f ms\n",
                   (unsigned long long)o.evict_objects, (unsigned long long)r.evicted,
                   r.evict_calls, r.evict_worst_ms);
    }
    daemon_lines(c, o.json);
    kvd_client_close(c);
    bench_env_cleanup(&env);
    return BENCH_EXIT_OK;
}
