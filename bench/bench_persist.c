/*
 * bench_persist.c - mode `persist` of kvdock-bench: what crash safety costs
 * and how fast a restart is (issue 14), each beside its "before" in the
 * same run.
 *
 *  - The engine in process: Reserve + Publish of 4 KiB objects in batches
 *    (1 and 64 keys), objects per second without a journal and with one in
 *    /dev/shm; then the restart of the journaled store holding --objects
 *    objects: a new store attaching the journal (read, rebuild, write the
 *    fresh snapshot).
 *  - Through kvdockd (--kvdockd): the Publish RPC (p50, p99 of its round
 *    trip, objects per second of Reserve + Publish) with --no-persist and
 *    with the journal; then a daemon filled with --objects objects is
 *    SIGKILLed and started again on its pool file: the time from exec to
 *    "ready", and what its log says it recovered.
 */
#include "bench.h"
#include "kvd_store.h"

#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define OBJ_BYTES 4096u
#define CALL_MS   30000

typedef struct persist_opts {
    const char *kvdockd_path;
    uint64_t objects;
    double seconds;
} persist_opts_t;

static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void key_of(uint64_t i, uint8_t key[KVD_KEY_BYTES])
{
    uint64_t s = i * 0x9e3779b97f4a7c15ull + 12345;
    for (int w = 0; w < 4; w++) {
        uint64_t v = splitmix(&s);
        memcpy(key + 8 * w, &v, 8);
    }
}

/* This thread's CPU time, ns. */
static uint64_t cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ------------------------------------------------------------ in process */

/* A store of room for `objects` objects of 4 KiB (plus 1/16), with a
 * journal at path unless path is NULL. */
static int engine_open(uint64_t objects, const char *path, bool created,
                       kvd_store_t **out, uint32_t *ns, kvd_store_recovery_t *rec)
{
    kvd_store_config_t cfg;
    uint64_t pool = (objects + objects / 16 + 64) * OBJ_BYTES;
    kvd_store_config_default(&cfg, pool);
    cfg.index_hint = objects;
    int rc = kvd_store_create(&cfg, out);
    if (rc != KVD_OK)
        return rc;
    if (path != NULL) {
        kvd_store_journal_opts_t jo = {
            .path = path, .pool_dev = 1, .pool_ino = 2, .pool_created = created};
        char why[512];
        kvd_store_recovery_t r;
        rc = kvd_store_journal_attach(*out, &jo, rec ? rec : &r, why, sizeof(why));
        if (rc != KVD_OK) {
            fprintf(stderr, "kvdock-bench persist: attach: %s\n", why);
            kvd_store_destroy(*out);
            return rc;
        }
    }
    return kvd_store_ns_register(*out, KVD_TENANT_DEFAULT, KVD_OWNER_PERMANENT,
                                 "bench/kv", OBJ_BYTES, false, ns);
}

/* Reserve + Publish of keys [from, from + n) in batches; objects/s. */
static int engine_fill(kvd_store_t *s, uint32_t ns, uint64_t from, uint64_t n,
                       size_t batch, double *per_s)
{
    kvd_put_t puts[64];
    uint8_t keys[64][KVD_KEY_BYTES], res[64];
    kvd_loc_t locs[64];
    uint64_t t0 = kvd_now_ns(), calls = 0;
    for (uint64_t i = 0; i < n; i += batch) {
        size_t m = (size_t)KVD_MIN((uint64_t)batch, n - i);
        for (size_t k = 0; k < m; k++) {
            key_of(from + i + k, keys[k]);
            puts[k] = (kvd_put_t){.key = keys[k], .depth = (uint32_t)k};
        }
        uint64_t lease = 0, now_ms = kvd_now_ns() / 1000000;
        int rc = kvd_store_reserve(s, 1, ns, puts, m, now_ms, &lease, res, locs);
        if (rc == KVD_OK && lease != 0)
            rc = kvd_store_publish(s, 1, lease, NULL, 0);
        if (rc != KVD_OK)
            return rc;
        if (++calls % 256 == 0) /* the daemon's tick: compaction slices */
            kvd_store_expire(s, now_ms);
    }
    *per_s = (double)n / ((double)(kvd_now_ns() - t0) / 1e9);
    return KVD_OK;
}

static int bench_engine(const bench_env_t *env, const persist_opts_t *o)
{
    char path[160];
    snprintf(path, sizeof(path), "%s/engine.journal", env->dir);
    printf("Engine in process, Reserve + Publish of 4 KiB objects (objects/s):\n");
    uint64_t n = KVD_MIN(o->objects, 200000ull);
    size_t batches[] = {1, 64};
    for (size_t b = 0; b < 2; b++) {
        double rate[2] = {0, 0};
        for (int j = 0; j < 2; j++) {
            kvd_store_t *s = NULL;
            uint32_t ns;
            int rc = engine_open(n, j ? path : NULL, true, &s, &ns, NULL);
            if (rc == KVD_OK)
                rc = engine_fill(s, ns, 0, n, batches[b], &rate[j]);
            kvd_store_destroy(s);
            unlink(path);
            if (rc != KVD_OK) {
                fprintf(stderr, "kvdock-bench persist: engine fill: %s\n",
                        kvd_status_str(rc));
                return rc;
            }
        }
        printf("  batch %2zu, %llu objects: no journal %.0f/s, journal %.0f/s, ratio "
               "%.2f\n",
               batches[b], (unsigned long long)n, rate[0], rate[1],
               rate[0] > 0 ? rate[1] / rate[0] : 0.0);
    }

    /* the restart of a journaled store of o->objects objects */
    kvd_store_t *s = NULL;
    uint32_t ns;
    double fill = 0;
    int rc = engine_open(o->objects, path, true, &s, &ns, NULL);
    if (rc == KVD_OK)
        rc = engine_fill(s, ns, 0, o->objects, 64, &fill);
    kvd_store_stats_t st;
    if (rc == KVD_OK)
        kvd_store_stats(s, &st);
    kvd_store_destroy(s); /* as a SIGKILL leaves it: every call was written */
    s = NULL;
    kvd_store_recovery_t rec = {0};
    uint64_t cpu0 = cpu_ns();
    if (rc == KVD_OK)
        rc = engine_open(o->objects, path, false, &s, &ns, &rec);
    double cpu = (double)(cpu_ns() - cpu0) / 1e9;
    if (rc == KVD_OK)
        printf("  restart with %llu objects: journal %.1f MiB (%llu records, %llu "
               "compactions while filling), recovered %llu objects in %.3f s (read "
               "%.3f, rebuilt %.3f, written anew %.3f)\n",
               (unsigned long long)o->objects, (double)rec.journal_bytes / 1048576.0,
               (unsigned long long)rec.records,
               (unsigned long long)st.journal_compactions,
               (unsigned long long)rec.objects, (double)rec.elapsed_ns / 1e9,
               (double)rec.read_ns / 1e9, (double)rec.rebuild_ns / 1e9,
               (double)rec.write_ns / 1e9);
    if (rc == KVD_OK)
        printf("    (CPU time of that restart: %.3f s; on a shared host the wall time "
               "includes waiting for a CPU)\n",
               cpu);
    kvd_store_destroy(s);
    unlink(path);
    return rc;
}

/* ------------------------------------------------------------ the daemon */

typedef struct rpc {
    kvd_client_t *c;
    uint32_t ns;
} rpc_t;

static int rpc_open(const char *socket, rpc_t *r)
{
    memset(r, 0, sizeof(*r));
    int rc = kvd_client_connect_unix(socket, CALL_MS, &r->c);
    if (rc != KVD_OK)
        return rc;
    kvd_ns_spec_t spec = {.object_bytes = OBJ_BYTES};
    snprintf(spec.name, sizeof(spec.name), "bench/persist/tp0");
    kvd_msg_t req, rep;
    kvd_msg_request(&req, 0, KVD_METHOD_HELLO);
    kvd_hello_req_t *h = &req.body.hello_req;
    kvd_strlcpy(h->client_name, "kvdock-bench-persist", sizeof(h->client_name));
    h->pid = (uint32_t)getpid();
    h->protocol_version = KVD_PROTOCOL_VERSION;
    h->n_namespaces = 1;
    h->namespaces = &spec;
    rc = kvd_client_call(r->c, &req, &rep, CALL_MS);
    if (rc == KVD_OK)
        rc = rep.status;
    if (rc == KVD_OK && rep.body.hello_rep.n_ns_ids == 1)
        r->ns = rep.body.hello_rep.ns_ids[0];
    kvd_msg_clear(&rep);
    return rc;
}

/* Reserve of keys [from, from + n) (no bytes written: the journal's cost
 * is the metadata's), then Publish, whose round trip goes to h. */
static int rpc_put(rpc_t *r, uint64_t from, size_t n, bench_hist_t *h)
{
    kvd_put_item_t *items = calloc(n, sizeof(*items));
    if (items == NULL)
        return KVD_ERR_NOMEM;
    for (size_t i = 0; i < n; i++) {
        key_of(from + i, items[i].key);
        items[i].depth = (uint32_t)i;
    }
    kvd_msg_t req, rep;
    kvd_msg_request(&req, 0, KVD_METHOD_RESERVE);
    req.body.reserve_req = (kvd_reserve_req_t){
        .ns = r->ns, .object_bytes = OBJ_BYTES, .n = n, .items = items};
    int rc = kvd_client_call(r->c, &req, &rep, CALL_MS);
    if (rc == KVD_OK)
        rc = rep.status;
    uint64_t lease = rc == KVD_OK ? rep.body.reserve_rep.lease_id : 0;
    kvd_msg_clear(&rep);
    free(items);
    if (rc != KVD_OK || lease == 0)
        return rc;
    kvd_msg_request(&req, 0, KVD_METHOD_PUBLISH);
    req.body.finish_req.lease_id = lease;
    uint64_t t0 = kvd_now_ns();
    rc = kvd_client_call(r->c, &req, &rep, CALL_MS);
    if (h != NULL)
        hist_add(h, kvd_now_ns() - t0);
    if (rc == KVD_OK)
        rc = rep.status;
    kvd_msg_clear(&rep);
    return rc;
}

/* One daemon's side of the comparison: its connection, histogram, counts. */
typedef struct side {
    rpc_t r;
    bench_hist_t *h;
    uint64_t objects, ns;
} side_t;

#define SLICES 6

/*
 * Publish round trips and Reserve + Publish objects/s of two daemons (0:
 * --no-persist, 1: the journal), both running, measured in SLICES
 * alternating slices of seconds / SLICES each, so that the VM's drift and
 * other processes' load fall on both alike.
 */
static int rpc_publish_compare(const char *sock0, const char *sock1, size_t batch,
                               double seconds, double p50[2], double p99[2],
                               double rate[2])
{
    side_t side[2] = {0};
    const char *socks[2] = {sock0, sock1};
    int rc = KVD_OK;
    for (int j = 0; j < 2 && rc == KVD_OK; j++) {
        rc = rpc_open(socks[j], &side[j].r);
        side[j].h = calloc(1, sizeof(bench_hist_t));
        if (side[j].h == NULL)
            rc = KVD_ERR_NOMEM;
    }
    uint64_t next = 1000000000ull;
    for (int slice = 0; rc == KVD_OK && slice < 2 * SLICES; slice++) {
        side_t *sd = &side[slice % 2];
        uint64_t t0 = kvd_now_ns(), until = t0 + (uint64_t)(seconds / SLICES * 1e9);
        while (rc == KVD_OK && kvd_now_ns() < until) {
            rc = rpc_put(&sd->r, next, batch, sd->h);
            next += batch;
            sd->objects += batch;
        }
        sd->ns += kvd_now_ns() - t0;
    }
    for (int j = 0; j < 2; j++) {
        if (rc == KVD_OK) {
            p50[j] = (double)hist_quantile_ns(side[j].h, 0.5) / 1e3;
            p99[j] = (double)hist_quantile_ns(side[j].h, 0.99) / 1e3;
            rate[j] = (double)side[j].objects / ((double)side[j].ns / 1e9);
        }
        free(side[j].h);
        kvd_client_close(side[j].r.c);
    }
    return rc;
}

static int bench_daemon_publish(bench_env_t *env, const persist_opts_t *o)
{
    printf("Through kvdockd, Publish of 4 KiB objects (after a Reserve of the batch), "
           "two daemons measured in %d alternating slices:\n",
           2 * SLICES);
    bench_env_t other;
    if (bench_env_init(&other) != KVD_OK)
        return KVD_ERR_IO;
    const char *no[] = {"--no-persist", NULL}, *yes[] = {"--fresh", NULL};
    int rc = bench_daemon_start_args(&other, o->kvdockd_path, "1G", no);
    if (rc == KVD_OK)
        rc = bench_daemon_start_args(env, o->kvdockd_path, "1G", yes);
    size_t batches[] = {1, 64};
    for (size_t b = 0; rc == KVD_OK && b < 2; b++) {
        double p50[2], p99[2], rate[2];
        rc = rpc_publish_compare(other.daemon_socket, env->daemon_socket, batches[b],
                                 o->seconds, p50, p99, rate);
        if (rc != KVD_OK)
            break;
        printf("  batch %2zu: --no-persist p50 %.1f us p99 %.1f us %.0f objects/s; "
               "journal p50 %.1f us p99 %.1f us %.0f objects/s; ratio %.2f (objects/s), "
               "%.2f (p50)\n",
               batches[b], p50[0], p99[0], rate[0], p50[1], p99[1], rate[1],
               rate[0] > 0 ? rate[1] / rate[0] : 0.0, p50[0] > 0 ? p50[1] / p50[0] : 0.0);
    }
    bench_stop_child(&env->daemon_pid, "kvdockd");
    bench_env_cleanup(&other);
    if (rc != KVD_OK)
        fprintf(stderr, "kvdock-bench persist: publish: %s\n", kvd_status_str(rc));
    return rc;
}

/* The "recovered ..." line of the daemon's log, into line. */
static void recovered_line(const char *log, char *line, size_t len)
{
    FILE *f = fopen(log, "r");
    char buf[1024];
    line[0] = '\0';
    while (f && fgets(buf, sizeof(buf), f)) {
        char *at = strstr(buf, "recovered ");
        if (at != NULL) {
            at[strcspn(at, "\n")] = '\0';
            kvd_strlcpy(line, at, len);
        }
    }
    if (f)
        fclose(f);
}

static int bench_daemon_restart(bench_env_t *env, const persist_opts_t *o)
{
    char pool[32];
    uint64_t mib =
        ((o->objects + o->objects / 16) * OBJ_BYTES + KVD_MiB - 1) / KVD_MiB + 16;
    snprintf(pool, sizeof(pool), "%lluM", (unsigned long long)mib);
    const char *extra[] = {"--fresh", NULL};
    uint64_t t0 = kvd_now_ns();
    int rc = bench_daemon_start_args(env, o->kvdockd_path, pool, extra);
    double first = (double)(kvd_now_ns() - t0) / 1e9;
    rpc_t r = {0};
    if (rc == KVD_OK)
        rc = rpc_open(env->daemon_socket, &r);
    uint64_t fill0 = kvd_now_ns();
    for (uint64_t i = 0; rc == KVD_OK && i < o->objects; i += 4096)
        rc = rpc_put(&r, i, (size_t)KVD_MIN(4096ull, o->objects - i), NULL);
    double fill = (double)(kvd_now_ns() - fill0) / 1e9;
    kvd_client_close(r.c);
    if (rc != KVD_OK) {
        fprintf(stderr, "kvdock-bench persist: fill: %s\n", kvd_status_str(rc));
        bench_stop_child(&env->daemon_pid, "kvdockd");
        return rc;
    }
    kill(env->daemon_pid, SIGKILL);
    int st;
    waitpid(env->daemon_pid, &st, 0);
    env->daemon_pid = 0;
    t0 = kvd_now_ns();
    rc = bench_daemon_start_args(env, o->kvdockd_path, pool, NULL);
    double again = (double)(kvd_now_ns() - t0) / 1e9;
    char line[512];
    recovered_line(env->daemon_log, line, sizeof(line));
    bench_stop_child(&env->daemon_pid, "kvdockd");
    if (rc != KVD_OK)
        return rc;
    printf(
        "Restart of kvdockd with %llu objects of 4 KiB in a %s pool (filled in %.1f s):\n"
        "  first start (creating and populating the pool) %.2f s; after SIGKILL, exec "
        "to ready %.2f s\n  its log: %s\n",
        (unsigned long long)o->objects, pool, fill, first, again, line);
    return KVD_OK;
}

/* ------------------------------------------------------------------ mode */

static void persist_usage(FILE *f)
{
    fprintf(f,
            "Usage: kvdock-bench persist [--kvdockd PATH] [--objects N] [--seconds S]\n"
            "What the journal costs Reserve + Publish (in process, and through\n"
            "kvdockd against --no-persist), and the restart with N objects of 4 KiB\n"
            "(default 1000000).\n");
}

int bench_mode_persist(int argc, char **argv)
{
    static const struct option longopts[] = {{"kvdockd", required_argument, NULL, 'k'},
                                             {"objects", required_argument, NULL, 'n'},
                                             {"seconds", required_argument, NULL, 't'},
                                             {"help", no_argument, NULL, 'h'},
                                             {NULL, 0, NULL, 0}};
    persist_opts_t o = {.objects = 1000000, .seconds = 3.0};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        switch (c) {
        case 'k': o.kvdockd_path = optarg; break;
        case 'n':
            if (kvd_u64_parse(optarg, 1000, 1ull << 28, &o.objects) != KVD_OK) {
                persist_usage(stderr);
                return BENCH_EXIT_USAGE;
            }
            break;
        case 't':
            if (kvd_double_parse(optarg, 0.1, 600, &o.seconds) != KVD_OK) {
                persist_usage(stderr);
                return BENCH_EXIT_USAGE;
            }
            break;
        case 'h': persist_usage(stdout); return BENCH_EXIT_OK;
        default: persist_usage(stderr); return BENCH_EXIT_USAGE;
        }
    }
    bench_env_t env;
    if (bench_env_init(&env) != KVD_OK)
        return BENCH_EXIT_FAIL;
    int rc = bench_engine(&env, &o);
    if (rc == KVD_OK && o.kvdockd_path != NULL)
        rc = bench_daemon_publish(&env, &o);
    if (rc == KVD_OK && o.kvdockd_path != NULL)
        rc = bench_daemon_restart(&env, &o);
    bench_env_cleanup(&env);
    return rc == KVD_OK ? BENCH_EXIT_OK : BENCH_EXIT_FAIL;
}
