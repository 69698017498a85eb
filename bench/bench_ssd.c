/*
 * bench_ssd.c - mode `ssd` of kvdock-bench: the SSD tier (issue 14) through
 * the store engine in process, on real segment files with O_DIRECT, beside
 * fio on the same file system in the same run.
 *
 *  - spill: N objects published through a pool whose watermarks (high
 *    0.3, low 0.05) make nearly all of them spill; the publisher waits for
 *    room (the tier's completions) instead of letting Reserve drop objects
 *    on demand. GB/s = stats.spilled_bytes / the wall time from the first
 *    publish until the tier has nothing in flight (kvd_store_tier_drain).
 *  - load latency: one key on the tier at a time, from the first Acquire
 *    (KVD_INPROGRESS) to the Acquire that pins it, kvd_store_tier_poll
 *    spun in a tight loop in between.
 *  - promote: every other object on the tier acquired in batches (an
 *    Acquire of the batch starts as many promotions as the executor takes;
 *    each completion polled from the tier's fd refills it), then released
 *    and evicted from DRAM so that it does not spill again. GB/s =
 *    promoted bytes / wall time.
 *  - fio on a file in the same directory, same bytes, block size = object
 *    size, same queue depth and I/O path: write, read, randread; the
 *    ratios kvdock / fio.
 *  - restart: M objects of 4 KiB spilled through a small pool; the store
 *    destroyed (which writes the tier's checkpoint), then a new store's
 *    kvd_store_create + kvd_store_tier_attach timed, once from the
 *    checkpoint and once (tier.ckpt deleted) by the scan of every record
 *    header; beside fio's synchronous 4 KiB reads at the scan's stride.
 *
 * Files: everything goes into a mkdtemp'd directory under --dir, removed at
 * the end. Threading: the caller's (the engine has none); the tier's
 * executor has its own threads.
 */
#include "bench.h"
#include "kvd_store.h"

#include <errno.h>
#include <ftw.h>
#include <getopt.h>
#include <limits.h>
#include <linux/magic.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#define SSD_BLOCK         4096u /* the tier's record grain (segment.h) */
#define SSD_EVICT_HIGH    0.30
#define SSD_EVICT_LOW     0.05
#define SSD_LAT_KEYS      200
#define SSD_RESTART_OBJ   4096u
#define SSD_RESTART_POOL  (64ull << 20)
#define SSD_FILL_BATCH_4K 64
#define SSD_STALL_NS      (30ull * 1000000000ull) /* no progress: the tier is stuck */
#define SSD_MARGIN_BYTES  (1ull << 30)            /* left free on the file system */

typedef struct ssd_opts {
    const char *dir;
    uint64_t object_bytes, objects, pool_bytes, segment_bytes, restart_objects;
    uint64_t queue_depth;
    int io_path; /* 0 auto, 1 io_uring, 2 pread/pwrite */
    double seconds;
    bool no_sync;             /* the rig's tier acknowledges spills unsynced */
    uint64_t sync_objects;    /* the group commit's comparison: objects per mode */
    uint64_t compact_objects; /* the compaction run: objects in all */
} ssd_opts_t;

/* One store with its pool mapping and its tier. */
typedef struct ssd_rig {
    kvd_store_t *s;
    uint8_t *pool;
    uint64_t pool_bytes, object_bytes;
    uint32_t ns;
    char tier_dir[PATH_MAX + 16];
} ssd_rig_t;

static uint64_t ssd_splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Key i of a run (salt: one key space per phase). */
static void ssd_key(uint64_t salt, uint64_t i, uint8_t key[KVD_KEY_BYTES])
{
    uint64_t s = i * 0x9e3779b97f4a7c15ull + salt;
    for (int w = 0; w < 4; w++) {
        uint64_t v = ssd_splitmix(&s);
        memcpy(key + 8 * w, &v, 8);
    }
}

static double ssd_s(uint64_t ns)
{
    return (double)ns / 1e9;
}

/* Bytes per second as decimal GB/s. */
static double ssd_gbps(uint64_t bytes, uint64_t ns)
{
    return ns ? (double)bytes / (double)ns : 0.0;
}

static uint64_t ssd_cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t ssd_fs_avail(const char *dir)
{
    struct statvfs v;
    return statvfs(dir, &v) == 0 ? (uint64_t)v.f_bavail * v.f_frsize : 0;
}

static int ssd_rm_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    if (remove(path) != 0 && errno != ENOENT)
        fprintf(stderr, "kvdock-bench ssd: removing %s: %s\n", path, strerror(errno));
    return 0;
}

/* Removes path and everything below it (no symlinks followed). */
static void ssd_rm_tree(const char *path)
{
    nftw(path, ssd_rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

/* The tier's size for n objects of obj bytes in segments of seg bytes:
 * every record whole in a segment, one segment for the head's remainder
 * and the one kept for compaction. */
static uint64_t ssd_tier_bytes(uint64_t n, uint64_t obj, uint64_t seg)
{
    uint64_t rec_blocks = 1 + (obj + SSD_BLOCK - 1) / SSD_BLOCK;
    uint64_t per_seg = (seg / SSD_BLOCK - 1) / rec_blocks;
    if (per_seg == 0)
        return 0;
    return ((n + per_seg - 1) / per_seg + 2) * seg;
}

/* ------------------------------------------------------------------ rig */

/* A store of pool_bytes on a fresh shared anonymous mapping (faulted in
 * here, so that page faults are not timed), with a tier in dir of
 * tier_bytes, and namespace `name` of the rig's object size. */
static int rig_open(ssd_rig_t *g, const ssd_opts_t *o, const char *dir,
                    uint64_t tier_bytes, bool fresh, uint64_t index_hint,
                    const char *name, kvd_tier_recovery_t *rec, uint64_t *open_ns)
{
    if (g->pool == NULL) {
        g->pool = mmap(NULL, g->pool_bytes, PROT_READ | PROT_WRITE,
                       MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        if (g->pool == MAP_FAILED) {
            g->pool = NULL;
            fprintf(stderr, "kvdock-bench ssd: mmap of the pool: %s\n", strerror(errno));
            return KVD_ERR_NOMEM;
        }
        memset(g->pool, 0x5a, g->pool_bytes);
    }
    snprintf(g->tier_dir, sizeof(g->tier_dir), "%s", dir);
    uint64_t t0 = kvd_now_ns();
    kvd_store_config_t cfg;
    kvd_store_config_default(&cfg, g->pool_bytes);
    cfg.evict_high = SSD_EVICT_HIGH;
    cfg.evict_low = SSD_EVICT_LOW;
    cfg.index_hint = index_hint;
    int rc = kvd_store_create(&cfg, &g->s);
    if (rc != KVD_OK) {
        fprintf(stderr, "kvdock-bench ssd: store: %s\n", kvd_status_str(rc));
        return rc;
    }
    kvd_tier_opts_t to = {.dir = dir,
                          .size_bytes = tier_bytes,
                          .segment_bytes = o->segment_bytes,
                          .io_path = o->io_path,
                          .queue_depth = (uint32_t)o->queue_depth,
                          .pool_base = g->pool,
                          .pool_bytes = g->pool_bytes,
                          .fresh = fresh,
                          .no_sync = o->no_sync};
    char why[512] = "";
    kvd_tier_recovery_t r;
    rc = kvd_store_tier_attach(g->s, &to, rec ? rec : &r, why, sizeof(why));
    if (open_ns != NULL)
        *open_ns = kvd_now_ns() - t0;
    if (rc != KVD_OK) {
        fprintf(stderr, "kvdock-bench ssd: tier attach: %s (%s)\n", kvd_status_str(rc),
                why);
        kvd_store_destroy(g->s);
        g->s = NULL;
        return rc;
    }
    rc = kvd_store_ns_register(g->s, KVD_TENANT_DEFAULT, KVD_OWNER_PERMANENT, name,
                               g->object_bytes, false, &g->ns);
    if (rc != KVD_OK)
        fprintf(stderr, "kvdock-bench ssd: namespace: %s\n", kvd_status_str(rc));
    return rc;
}

/* Destroys the store (the tier writes its checkpoint); the pool stays. */
static uint64_t rig_close_store(ssd_rig_t *g)
{
    uint64_t t0 = kvd_now_ns();
    kvd_store_destroy(g->s);
    g->s = NULL;
    return kvd_now_ns() - t0;
}

static void rig_free(ssd_rig_t *g)
{
    if (g->s != NULL)
        rig_close_store(g);
    if (g->pool != NULL)
        munmap(g->pool, g->pool_bytes);
    g->pool = NULL;
}

static kvd_store_stats_t rig_stats(const ssd_rig_t *g)
{
    kvd_store_stats_t st;
    kvd_store_stats(g->s, &st);
    return st;
}

/* Waits up to timeout_ms for a completion of the tier, then moves the
 * tier on. Returns the completions taken. */
static size_t rig_wait(ssd_rig_t *g, int timeout_ms)
{
    struct pollfd p = {.fd = kvd_store_tier_fd(g->s), .events = POLLIN};
    poll(&p, 1, timeout_ms);
    return kvd_store_tier_poll(g->s, 0);
}

/* Polls the tier if a completion waits (no wait otherwise). */
static void rig_poll_ready(ssd_rig_t *g)
{
    struct pollfd p = {.fd = kvd_store_tier_fd(g->s), .events = POLLIN};
    if (poll(&p, 1, 0) > 0)
        kvd_store_tier_poll(g->s, 0);
}

/* Reserve + Publish of keys [from, from + n) (salt) in batches, each
 * value's first 8 bytes its index; before each batch it waits for room
 * (spills ending) so that no Reserve evicts on demand. Stops at
 * deadline_ns; *done says how many were published. */
static int rig_fill(ssd_rig_t *g, uint64_t salt, uint64_t from, uint64_t n, size_t batch,
                    uint64_t deadline_ns, uint64_t *done)
{
    kvd_put_t puts[SSD_FILL_BATCH_4K];
    uint8_t keys[SSD_FILL_BATCH_4K][KVD_KEY_BYTES], res[SSD_FILL_BATCH_4K];
    kvd_loc_t locs[SSD_FILL_BATCH_4K];
    uint64_t i = 0;
    batch = KVD_MIN(batch, (size_t)SSD_FILL_BATCH_4K);
    int rc = KVD_OK;
    while (rc == KVD_OK && i < n && kvd_now_ns() < deadline_ns) {
        size_t m = (size_t)KVD_MIN((uint64_t)batch, n - i);
        uint64_t want = m * g->object_bytes, waited_from = kvd_now_ns();
        while (rig_stats(g).largest_free_bytes < want) {
            if (rig_wait(g, 100) == 0 && kvd_now_ns() - waited_from > SSD_STALL_NS) {
                kvd_store_stats_t st = rig_stats(g);
                fprintf(stderr,
                        "kvdock-bench ssd: no room in the pool for 30 s (%llu free, "
                        "%llu spilling, %llu in flight, tier %llu/%llu bytes used)\n",
                        (unsigned long long)st.free_bytes,
                        (unsigned long long)st.spilling_bytes,
                        (unsigned long long)st.ssd_in_flight,
                        (unsigned long long)st.ssd_used_bytes,
                        (unsigned long long)st.ssd_bytes);
                return KVD_ERR_TIMEOUT;
            }
        }
        for (size_t k = 0; k < m; k++) {
            ssd_key(salt, from + i + k, keys[k]);
            puts[k] = (kvd_put_t){.key = keys[k]};
        }
        uint64_t lease = 0, now_ms = kvd_now_ns() / 1000000;
        rc = kvd_store_reserve(g->s, 1, g->ns, puts, m, now_ms, &lease, res, locs);
        for (size_t k = 0; rc == KVD_OK && k < m; k++) {
            if (res[k] != KVD_RESERVE_ALLOCATED) {
                rc = KVD_ERR_STATE;
                break;
            }
            uint64_t idx = from + i + k;
            memcpy(g->pool + locs[k].offset, &idx, sizeof(idx));
        }
        if (rc == KVD_OK && lease != 0)
            rc = kvd_store_publish(g->s, 1, lease, NULL, 0);
        i += m;
        rig_poll_ready(g);
    }
    *done = i;
    if (rc != KVD_OK)
        fprintf(stderr, "kvdock-bench ssd: fill: %s\n", kvd_status_str(rc));
    return rc;
}

/* Whether key (salt, i) is on the tier now. */
static bool rig_on_ssd(const ssd_rig_t *g, uint64_t salt, uint64_t i)
{
    uint8_t key[KVD_KEY_BYTES];
    kvd_obj_info_t info;
    ssd_key(salt, i, key);
    return kvd_store_inspect(g->s, g->ns, key, &info) == KVD_OK &&
           info.tier == KVD_TIER_SSD;
}

/* Evicts what of keys [0, n) is in DRAM (not spilled): the pool is empty
 * afterwards but for objects being spilled, which the caller drains. */
static void rig_evict_dram(ssd_rig_t *g, uint64_t salt, uint64_t n)
{
    uint8_t key[KVD_KEY_BYTES];
    kvd_obj_info_t info;
    for (uint64_t i = 0; i < n; i++) {
        ssd_key(salt, i, key);
        if (kvd_store_inspect(g->s, g->ns, key, &info) == KVD_OK &&
            info.tier == KVD_TIER_DRAM)
            kvd_store_evict_key(g->s, g->ns, key);
    }
}

/* -------------------------------------------------------------- phases */

/* One load that hits the tier: the first Acquire (KVD_INPROGRESS) to the
 * Acquire that pins it, tier_poll spun between; released and evicted after.
 * *stamp_ok is false when the value's first bytes are not its index. */
static int rig_load_one(ssd_rig_t *g, uint64_t salt, uint64_t i, uint64_t *ns,
                        bool *stamp_ok)
{
    uint8_t key[KVD_KEY_BYTES];
    ssd_key(salt, i, key);
    const uint8_t(*keys)[KVD_KEY_BYTES] = (const uint8_t(*)[KVD_KEY_BYTES])key;
    uint64_t lease = 0, t0 = kvd_now_ns(), deadline = t0 + SSD_STALL_NS;
    kvd_loc_t loc;
    size_t bad;
    int rc = kvd_store_acquire(g->s, 1, g->ns, keys, 1, 0, &lease, &loc, &bad);
    if (rc != KVD_INPROGRESS)
        return rc == KVD_OK ? KVD_ERR_STATE : rc; /* it was not on the tier */
    while (rc == KVD_INPROGRESS && kvd_now_ns() < deadline) {
        if (kvd_store_tier_poll(g->s, 0) > 0)
            rc = kvd_store_acquire(g->s, 1, g->ns, keys, 1, 0, &lease, &loc, &bad);
    }
    *ns = kvd_now_ns() - t0;
    if (rc != KVD_OK)
        return rc == KVD_INPROGRESS ? KVD_ERR_TIMEOUT : rc;
    uint64_t idx;
    memcpy(&idx, g->pool + loc.offset, sizeof(idx));
    *stamp_ok = idx == i;
    kvd_store_release(g->s, 1, lease);
    kvd_store_evict_key(g->s, g->ns, key);
    return KVD_OK;
}

typedef struct ssd_lat {
    uint64_t n, failed, wrong;
    double p50_us, p99_us, max_us;
} ssd_lat_t;

/* Loads n_keys keys that are on the tier, one at a time, spread evenly
 * over those of [0, n) that are; each key taken is marked in taken[]. */
static int phase_latency(ssd_rig_t *g, uint64_t salt, uint64_t n, size_t n_keys,
                         bool *taken, ssd_lat_t *out)
{
    bench_hist_t *h = calloc(1, sizeof(*h));
    uint64_t *on = calloc(n ? n : 1, sizeof(*on));
    if (h == NULL || on == NULL) {
        free(h);
        free(on);
        return KVD_ERR_NOMEM;
    }
    memset(out, 0, sizeof(*out));
    kvd_store_tier_drain(g->s, 60000); /* nothing else in flight */
    uint64_t n_on = 0;
    for (uint64_t i = 0; i < n; i++)
        if (rig_on_ssd(g, salt, i))
            on[n_on++] = i;
    uint64_t want = KVD_MIN((uint64_t)n_keys, n_on);
    for (uint64_t k = 0; k < want; k++) {
        uint64_t i = on[k * n_on / want], ns = 0;
        bool ok = false;
        int rc = rig_load_one(g, salt, i, &ns, &ok);
        if (taken != NULL)
            taken[i] = true;
        if (rc != KVD_OK) {
            out->failed++;
            continue;
        }
        hist_add(h, ns);
        out->n++;
        out->wrong += !ok;
    }
    out->p50_us = (double)hist_quantile_ns(h, 0.5) / 1e3;
    out->p99_us = (double)hist_quantile_ns(h, 0.99) / 1e3;
    out->max_us = (double)h->max_ns / 1e3;
    free(h);
    free(on);
    return KVD_OK;
}

typedef struct ssd_promote {
    uint64_t objects, bytes, ns, cpu_ns, op_ns, failed, wrong, evictions, spills;
    bool cut;
} ssd_promote_t;

/* Acquires one batch until it is pinned (promotions refilled on each
 * completion), checks and releases it and evicts it from DRAM. Keys whose
 * promotion failed (absent afterwards) leave the batch. */
static int promote_batch(ssd_rig_t *g, uint8_t (*keys)[KVD_KEY_BYTES], uint64_t *idx,
                         size_t m, kvd_loc_t *locs, ssd_promote_t *out)
{
    uint64_t lease = 0, stalled_from = kvd_now_ns();
    size_t bad = 0;
    for (;;) {
        int rc = kvd_store_acquire(g->s, 1, g->ns, (const uint8_t(*)[KVD_KEY_BYTES])keys,
                                   m, 0, &lease, locs, &bad);
        if (rc == KVD_OK)
            break;
        if (rc == KVD_ERR_NOT_FOUND && bad < m) { /* its promotion failed */
            out->failed++;
            memmove(keys[bad], keys[bad + 1], (m - bad - 1) * KVD_KEY_BYTES);
            memmove(&idx[bad], &idx[bad + 1], (m - bad - 1) * sizeof(*idx));
            if (--m == 0)
                return KVD_OK;
            continue;
        }
        if (rc != KVD_INPROGRESS && rc != KVD_ERR_BUSY && rc != KVD_ERR_NO_SPACE) {
            fprintf(stderr, "kvdock-bench ssd: promote: acquire: %s\n",
                    kvd_status_str(rc));
            return rc;
        }
        if (rig_wait(g, 100) > 0)
            stalled_from = kvd_now_ns();
        else if (kvd_now_ns() - stalled_from > SSD_STALL_NS) {
            fprintf(stderr, "kvdock-bench ssd: promote: no completion for 30 s (%s)\n",
                    kvd_status_str(rc));
            return KVD_ERR_TIMEOUT;
        }
    }
    for (size_t k = 0; k < m; k++) {
        uint64_t v;
        memcpy(&v, g->pool + locs[k].offset, sizeof(v));
        out->wrong += v != idx[k];
    }
    kvd_store_release(g->s, 1, lease);
    for (size_t k = 0; k < m; k++)
        kvd_store_evict_key(g->s, g->ns, keys[k]);
    out->objects += m;
    return KVD_OK;
}

/* Promotes every object of [0, n) on the tier but those in skip[], in
 * batches of `batch`, until deadline_ns. */
static int phase_promote(ssd_rig_t *g, uint64_t salt, uint64_t n, const bool *skip,
                         size_t batch, uint64_t deadline_ns, ssd_promote_t *out)
{
    memset(out, 0, sizeof(*out));
    uint8_t(*keys)[KVD_KEY_BYTES] = calloc(batch, KVD_KEY_BYTES);
    uint64_t *idx = calloc(batch, sizeof(*idx));
    kvd_loc_t *locs = calloc(batch, sizeof(*locs));
    if (keys == NULL || idx == NULL || locs == NULL) {
        free(keys);
        free(idx);
        free(locs);
        return KVD_ERR_NOMEM;
    }
    kvd_store_stats_t a = rig_stats(g);
    uint64_t t0 = kvd_now_ns(), c0 = ssd_cpu_ns();
    int rc = KVD_OK;
    for (uint64_t i = 0; rc == KVD_OK && i < n;) {
        if (kvd_now_ns() >= deadline_ns) {
            out->cut = true;
            break;
        }
        size_t m = 0;
        for (; i < n && m < batch; i++) {
            if ((skip != NULL && skip[i]) || !rig_on_ssd(g, salt, i))
                continue;
            ssd_key(salt, i, keys[m]);
            idx[m++] = i;
        }
        if (m > 0)
            rc = promote_batch(g, keys, idx, m, locs, out);
    }
    out->ns = kvd_now_ns() - t0;
    out->cpu_ns = ssd_cpu_ns() - c0;
    kvd_store_stats_t b = rig_stats(g);
    out->bytes = b.promoted_bytes - a.promoted_bytes;
    out->op_ns = b.ssd_promote_ns - a.ssd_promote_ns;
    out->evictions = b.evictions - a.evictions;
    out->spills = b.spills - a.spills;
    out->failed = KVD_MAX(out->failed, b.promote_failures - a.promote_failures);
    free(keys);
    free(idx);
    free(locs);
    return rc;
}

/* ------------------------------------------------------------------ fio */

static bool fio_present(void)
{
    FILE *p = popen("fio --version 2>/dev/null", "r");
    char buf[64] = "";
    if (p == NULL)
        return false;
    bool ok = fgets(buf, sizeof(buf), p) != NULL && strncmp(buf, "fio-", 4) == 0;
    pclose(p);
    return ok;
}

/* "bw_bytes" of the first job's `section` ("read", "write") in fio's JSON. */
static double fio_bw_of(const char *json, const char *section)
{
    char pat[32]; /* the section, not the value of "rw" */
    snprintf(pat, sizeof(pat), "\"%s\" : {", section);
    const char *at = strstr(json, "\"jobs\"");
    at = at ? strstr(at, pat) : NULL;
    at = at ? strstr(at, "\"bw_bytes\"") : NULL;
    at = at ? strchr(at, ':') : NULL;
    return at ? strtod(at + 1, NULL) : -1.0;
}

/*
 * Runs fio once (rw: write, read, randread, or a pattern such as
 * "read:4k"), on DIR/fio.dat of `bytes`, block size bs: io_uring at
 * iodepth qd (jobs 0), or psync with `jobs` jobs each on its slice of the
 * file. runtime_s > 0 bounds it (time_based). Returns
 * bytes/s from its JSON, or -1.
 */
static double fio_run(const char *dir, const char *rw, uint64_t bytes, uint64_t bs,
                      uint64_t qd, uint64_t jobs, int runtime_s)
{
    char cmd[1024], extra[256] = "";
    if (jobs > 0) {
        uint64_t slice = bytes / jobs / bs * bs;
        snprintf(extra, sizeof(extra),
                 "--ioengine=psync --numjobs=%llu --size=%llu --offset_increment=%llu "
                 "--group_reporting",
                 (unsigned long long)jobs, (unsigned long long)slice,
                 (unsigned long long)slice);
    } else {
        snprintf(extra, sizeof(extra), "--ioengine=io_uring --iodepth=%llu --size=%llu",
                 (unsigned long long)qd, (unsigned long long)bytes);
    }
    char bound[64] = "";
    if (runtime_s > 0)
        snprintf(bound, sizeof(bound), "--runtime=%d --time_based", runtime_s);
    snprintf(cmd, sizeof(cmd),
             "fio --output-format=json --name=w --filename=%s/fio.dat --bs=%llu "
             "--direct=1 --rw=%s %s %s 2>/dev/null",
             dir, (unsigned long long)bs, rw, extra, bound);
    FILE *p = popen(cmd, "r");
    if (p == NULL)
        return -1.0;
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    size_t got;
    while (buf != NULL && (got = fread(buf + len, 1, cap - len - 1, p)) > 0) {
        len += got;
        if (cap - len < 4096) {
            char *b = realloc(buf, cap * 2);
            if (b == NULL)
                break;
            buf = b;
            cap *= 2;
        }
    }
    int st = pclose(p);
    if (buf == NULL)
        return -1.0;
    buf[len] = '\0';
    double bw =
        st == 0 ? fio_bw_of(buf, strncmp(rw, "write", 5) == 0 ? "write" : "read") : -1.0;
    free(buf);
    if (bw < 0)
        fprintf(stderr, "kvdock-bench ssd: fio failed: %s\n", cmd);
    return bw;
}

static void print_ratio(const char *what, double kvdock_bps, double fio_bps)
{
    if (fio_bps > 0)
        printf("  ratio %s: %.2fx fio (goal >= 0.8x)\n", what, kvdock_bps / fio_bps);
}

/* ------------------------------------------------- the group commit's cost */

/* Spills `sync_objects` objects with the group commit (a spill acknowledged
 * once its segment's fdatasync of the round ended) and again without it
 * (acknowledged as the O_DIRECT write lands), each on a fresh tier in the
 * same directory; spill GB/s as in the spill part; the ratio. */
static int run_sync_compare(const ssd_opts_t *o, const char *work)
{
    uint64_t n = o->sync_objects;
    uint64_t tier = ssd_tier_bytes(n, o->object_bytes, o->segment_bytes);
    if (tier + SSD_MARGIN_BYTES > ssd_fs_avail(work)) {
        fprintf(stderr, "kvdock-bench ssd: --sync-objects %llu: not enough free space\n",
                (unsigned long long)n);
        return KVD_ERR_NO_SPACE;
    }
    double bps[2] = {0, 0};
    for (int mode = 0; mode < 2; mode++) {
        ssd_opts_t m = *o;
        m.no_sync = mode == 1;
        ssd_rig_t g = {.pool_bytes = o->pool_bytes, .object_bytes = o->object_bytes};
        char dir[PATH_MAX + 16];
        snprintf(dir, sizeof(dir), "%s/tier-sync-%d", work, mode);
        int rc = rig_open(&g, &m, dir, tier, true, n, "bench/sync", NULL, NULL);
        if (rc != KVD_OK) {
            rig_free(&g);
            return rc;
        }
        uint64_t deadline = kvd_now_ns() + (uint64_t)(o->seconds * 1e9), done = 0;
        uint64_t t0 = kvd_now_ns();
        rc = rig_fill(&g, 3 + (uint64_t)mode, 0, n, 1, deadline, &done);
        if (rc == KVD_OK)
            kvd_store_tier_drain(g.s, 120000);
        uint64_t ns = kvd_now_ns() - t0;
        kvd_store_stats_t st = rig_stats(&g);
        bps[mode] = ssd_gbps(st.spilled_bytes, ns);
        printf("spill, group commit %s: %llu objects of %llu KiB, %llu spilled in %.2f "
               "s: %.3f GB/s; %llu syncs (%.1f spills per sync); per op %.2f ms mean%s\n",
               mode == 0 ? "on " : "off", (unsigned long long)done,
               (unsigned long long)(o->object_bytes >> 10), (unsigned long long)st.spills,
               ssd_s(ns), bps[mode], (unsigned long long)st.ssd_syncs,
               st.ssd_syncs ? (double)st.spills / (double)st.ssd_syncs : 0.0,
               st.spills ? (double)st.ssd_spill_ns / (double)st.spills / 1e6 : 0.0,
               done < n ? " (cut by --seconds)" : "");
        fflush(stdout);
        rig_free(&g);
        ssd_rm_tree(dir);
        if (rc != KVD_OK)
            return rc;
    }
    if (bps[1] > 0)
        printf("  ratio spill with group commit / without: %.2fx\n", bps[0] / bps[1]);
    return KVD_OK;
}

/*
 * Compaction: a tier that holds half of n objects; the first half spilled
 * (timed: the reference, nothing to reclaim), every other one of them
 * evicted (so each full segment is half dead), then the second half
 * spilled (timed) while reclaim compacts those segments (their live
 * records copied to the head) or evicts. Reported: both spill rates and
 * their ratio, segments compacted, bytes copied, the write amplification
 * ((spilled + copied) / spilled) and the tier's own evictions.
 */
static int run_compact(const ssd_opts_t *o, const char *work)
{
    uint64_t half = o->compact_objects / 2;
    uint64_t tier = ssd_tier_bytes(half, o->object_bytes, o->segment_bytes);
    if (tier + SSD_MARGIN_BYTES > ssd_fs_avail(work)) {
        fprintf(stderr, "kvdock-bench ssd: --compact-objects: not enough free space\n");
        return KVD_ERR_NO_SPACE;
    }
    ssd_rig_t g = {.pool_bytes = o->pool_bytes, .object_bytes = o->object_bytes};
    char dir[PATH_MAX + 16];
    snprintf(dir, sizeof(dir), "%s/tier-compact", work);
    int rc = rig_open(&g, o, dir, tier, true, 2 * half, "bench/compact", NULL, NULL);
    uint64_t deadline = kvd_now_ns() + (uint64_t)(o->seconds * 1e9), done = 0;
    double bps[2] = {0, 0};
    kvd_store_stats_t st0 = {0}, st1 = {0};
    for (int phase = 0; rc == KVD_OK && phase < 2; phase++) {
        st0 = rig_stats(&g);
        uint64_t t0 = kvd_now_ns();
        rc = rig_fill(&g, 9, phase * half, half, 1, deadline, &done);
        if (rc == KVD_OK)
            kvd_store_tier_drain(g.s, 120000);
        uint64_t ns = kvd_now_ns() - t0;
        st1 = rig_stats(&g);
        bps[phase] = ssd_gbps(st1.spilled_bytes - st0.spilled_bytes, ns);
        printf(
            "compaction, phase %d (%s): %llu objects published, %llu spilled in %.2f s: "
            "%.3f GB/s; tier %.2f of %.2f GiB used%s\n",
            phase + 1, phase == 0 ? "an empty tier" : "half of it evicted first",
            (unsigned long long)done, (unsigned long long)(st1.spills - st0.spills),
            ssd_s(ns), bps[phase], (double)st1.ssd_used_bytes / KVD_GiB,
            (double)st1.ssd_bytes / KVD_GiB, done < half ? " (cut by --seconds)" : "");
        fflush(stdout);
        if (phase == 0) {
            uint8_t key[KVD_KEY_BYTES];
            uint64_t evicted = 0;
            for (uint64_t i = 0; i < half; i += 2) {
                ssd_key(9, i, key);
                evicted += kvd_store_evict_key(g.s, g.ns, key) == KVD_OK;
            }
            kvd_store_tier_poll(g.s, 0);
            printf("compaction: evicted every other object of phase 1: %llu\n",
                   (unsigned long long)evicted);
        }
    }
    if (rc == KVD_OK) {
        uint64_t spilled = st1.spilled_bytes - st0.spilled_bytes;
        uint64_t copied = st1.ssd_copied_bytes - st0.ssd_copied_bytes;
        printf(
            "compaction: %llu segments compacted, %.2f GiB copied, write amplification "
            "%.2f, %llu objects evicted by the tier, %llu I/O errors\n",
            (unsigned long long)(st1.ssd_compactions - st0.ssd_compactions),
            (double)copied / KVD_GiB,
            spilled ? (double)(spilled + copied) / (double)spilled : 0.0,
            (unsigned long long)(st1.ssd_evictions - st0.ssd_evictions),
            (unsigned long long)(st1.ssd_io_errors - st0.ssd_io_errors));
        if (bps[0] > 0)
            printf("  ratio spill while compacting / into an empty tier: %.2fx\n",
                   bps[1] / bps[0]);
    }
    rig_free(&g);
    ssd_rm_tree(dir);
    return rc;
}

/* ----------------------------------------------------------- the 2 GiB run */

static int run_throughput(const ssd_opts_t *o, const char *work, bool have_fio)
{
    ssd_rig_t g = {.pool_bytes = o->pool_bytes, .object_bytes = o->object_bytes};
    char dir[PATH_MAX + 16];
    snprintf(dir, sizeof(dir), "%s/tier", work);
    uint64_t n = o->objects, bytes = n * o->object_bytes;
    uint64_t tier = ssd_tier_bytes(n, o->object_bytes, o->segment_bytes);
    uint64_t need = tier + (have_fio ? bytes : 0) + SSD_MARGIN_BYTES;
    uint64_t avail = ssd_fs_avail(work);
    if (need > avail) {
        fprintf(stderr,
                "kvdock-bench ssd: %llu objects need %.2f GiB (tier and fio's file) but "
                "%s has %.2f GiB free: give fewer --objects\n",
                (unsigned long long)n, (double)need / KVD_GiB, work,
                (double)avail / KVD_GiB);
        return KVD_ERR_NO_SPACE;
    }
    int rc = rig_open(&g, o, dir, tier, true, n, "bench/ssd", NULL, NULL);
    if (rc != KVD_OK) {
        rig_free(&g);
        return rc;
    }
    kvd_store_stats_t st = rig_stats(&g);
    bool psync = st.ssd_io_path == 2;
    uint64_t jobs = psync ? KVD_MIN(o->queue_depth, 16ull) : 0; /* as tier_io's workers */
    printf("tier: %s, %s%s; queue depth %llu; %llu segments of %llu MiB; pool %llu "
           "MiB (watermarks %.2f/%.2f); %s\n",
           dir, kvd_store_tier_io_path(g.s),
           st.ssd_fixed_buffers ? " (fixed buffers)" : "",
           (unsigned long long)st.ssd_queue_depth, (unsigned long long)st.ssd_segments,
           (unsigned long long)(o->segment_bytes >> 20),
           (unsigned long long)(o->pool_bytes >> 20), SSD_EVICT_HIGH, SSD_EVICT_LOW,
           kvd_store_tier_note(g.s));
    fflush(stdout);

    /* 1. spill */
    uint64_t deadline = kvd_now_ns() + (uint64_t)(o->seconds * 1e9), done = 0;
    uint64_t t0 = kvd_now_ns(), c0 = ssd_cpu_ns();
    rc = rig_fill(&g, 1, 0, n, 1, deadline, &done);
    if (rc == KVD_OK)
        kvd_store_tier_drain(g.s, 120000);
    uint64_t spill_ns = kvd_now_ns() - t0, spill_cpu = ssd_cpu_ns() - c0;
    st = rig_stats(&g);
    double spill_bps = ssd_gbps(st.spilled_bytes, spill_ns) * 1e9;
    printf("spill: %llu objects of %llu KiB published (%.2f GiB), %llu spilled (%.2f "
           "GiB) in %.2f s: %.3f GB/s; per op %.2f ms mean (%.3f GB/s per op in "
           "flight); CPU %.2f s; drops %llu, spill failures %llu%s\n",
           (unsigned long long)done, (unsigned long long)(o->object_bytes >> 10),
           (double)done * (double)o->object_bytes / KVD_GiB,
           (unsigned long long)st.spills, (double)st.spilled_bytes / KVD_GiB,
           ssd_s(spill_ns), spill_bps / 1e9,
           st.spills ? (double)st.ssd_spill_ns / (double)st.spills / 1e6 : 0.0,
           ssd_gbps(st.spilled_bytes, st.ssd_spill_ns), ssd_s(spill_cpu),
           (unsigned long long)st.evictions, (unsigned long long)st.spill_failures,
           done < n ? " (cut by --seconds)" : "");
    fflush(stdout);
    double fio_write = -1, fio_read = -1, fio_rand = -1;
    if (rc == KVD_OK && have_fio) {
        fio_write =
            fio_run(work, "write", bytes, o->object_bytes, o->queue_depth, jobs, 0);
        printf("fio write: %.2f GiB, bs %llu KiB, %s: %.3f GB/s\n",
               (double)bytes / KVD_GiB, (unsigned long long)(o->object_bytes >> 10),
               psync ? "psync" : "io_uring", fio_write / 1e9);
        print_ratio("spill / fio write", spill_bps, fio_write);
        fflush(stdout);
    }

    /* 3. one load that hits the tier */
    bool *taken = calloc(n, sizeof(bool));
    ssd_lat_t lat = {0};
    if (rc == KVD_OK)
        rc =
            taken ? phase_latency(&g, 1, done, SSD_LAT_KEYS, taken, &lat) : KVD_ERR_NOMEM;
    if (rc == KVD_OK)
        printf("load from SSD (1 key of %llu KiB, tier_poll spun): %llu loads, p50 %.0f "
               "us, p99 %.0f us, max %.0f us; failed %llu, wrong bytes %llu\n",
               (unsigned long long)(o->object_bytes >> 10), (unsigned long long)lat.n,
               lat.p50_us, lat.p99_us, lat.max_us, (unsigned long long)lat.failed,
               (unsigned long long)lat.wrong);
    fflush(stdout);

    /* 2. promote */
    ssd_promote_t pr = {0};
    size_t batch = (size_t)KVD_MAX(
        1ull, KVD_MIN(4096ull, (uint64_t)(o->pool_bytes * 0.25) / o->object_bytes));
    if (rc == KVD_OK) {
        rig_evict_dram(&g, 1, done);
        kvd_store_tier_drain(g.s, 60000);
        deadline = kvd_now_ns() + (uint64_t)(o->seconds * 1e9);
        rc = phase_promote(&g, 1, done, taken, batch, deadline, &pr);
    }
    double promote_bps = ssd_gbps(pr.bytes, pr.ns) * 1e9;
    if (rc == KVD_OK)
        printf("promote: %llu objects (%.2f GiB) in batches of %zu in %.2f s: %.3f GB/s; "
               "per op %.2f ms mean; CPU %.2f s; failed %llu, wrong bytes %llu, "
               "evictions %llu, re-spills %llu%s\n",
               (unsigned long long)pr.objects, (double)pr.bytes / KVD_GiB, batch,
               ssd_s(pr.ns), promote_bps / 1e9,
               pr.objects ? (double)pr.op_ns / (double)pr.objects / 1e6 : 0.0,
               ssd_s(pr.cpu_ns), (unsigned long long)pr.failed,
               (unsigned long long)pr.wrong, (unsigned long long)pr.evictions,
               (unsigned long long)pr.spills, pr.cut ? " (cut by --seconds)" : "");
    fflush(stdout);
    free(taken);
    rig_free(&g);
    ssd_rm_tree(dir); /* room for what comes next */
    if (rc == KVD_OK && have_fio) {
        fio_read = fio_run(work, "read", bytes, o->object_bytes, o->queue_depth, jobs, 0);
        fio_rand =
            fio_run(work, "randread", bytes, o->object_bytes, o->queue_depth, jobs, 0);
        printf("fio read: %.3f GB/s; randread: %.3f GB/s (bs %llu KiB, %s)\n",
               fio_read / 1e9, fio_rand / 1e9,
               (unsigned long long)(o->object_bytes >> 10), psync ? "psync" : "io_uring");
        print_ratio("promote / fio read", promote_bps, fio_read);
        print_ratio("promote / fio randread", promote_bps, fio_rand);
        char f[PATH_MAX + 16];
        snprintf(f, sizeof(f), "%s/fio.dat", work);
        unlink(f);
    } else if (!have_fio) {
        printf("fio: not installed (apt-get install fio): no ratios\n");
    }
    fflush(stdout);
    return rc;
}

/* -------------------------------------------------------------- restart */

/* Attaches the restart rig's tier again on a zeroed pool (DRAM gone) and
 * prints what came back and how long it took. */
static int restart_attach(ssd_rig_t *g, const ssd_opts_t *o, const char *dir,
                          uint64_t tier, uint64_t n, uint64_t on_tier, const char *how)
{
    memset(g->pool, 0, g->pool_bytes);
    kvd_tier_recovery_t rec;
    uint64_t open_ns = 0, c0 = ssd_cpu_ns();
    int rc = rig_open(g, o, dir, tier, false, n, "bench/ssd4k", &rec, &open_ns);
    if (rc != KVD_OK)
        return rc;
    printf("restart (%s): kvd_store_create + kvd_store_tier_attach %.3f s (attach %.3f "
           "s, CPU %.2f s): %llu objects back of %llu on the tier%s (%llu from the "
           "checkpoint, %llu from summaries, %llu record headers scanned, %llu "
           "segments, %llu duplicates, "
           "%llu discarded, %llu torn)\n",
           how, ssd_s(open_ns), ssd_s(rec.elapsed_ns), ssd_s(ssd_cpu_ns() - c0),
           (unsigned long long)rec.objects, (unsigned long long)on_tier,
           rec.objects == on_tier ? "" : " MISMATCH",
           (unsigned long long)rec.checkpoint_records,
           (unsigned long long)rec.summary_records,
           (unsigned long long)rec.scanned_records, (unsigned long long)rec.segments,
           (unsigned long long)rec.duplicates, (unsigned long long)rec.discarded,
           (unsigned long long)rec.torn);
    fflush(stdout);
    return KVD_OK;
}

static int run_restart(const ssd_opts_t *o, const char *work, bool have_fio)
{
    uint64_t n = o->restart_objects, seg = o->segment_bytes;
    uint64_t tier = ssd_tier_bytes(n, SSD_RESTART_OBJ, seg);
    uint64_t avail = ssd_fs_avail(work);
    if (tier + SSD_MARGIN_BYTES > avail) {
        uint64_t room = avail > SSD_MARGIN_BYTES + 3 * seg ? avail - SSD_MARGIN_BYTES : 0;
        uint64_t fit = room / (2 * SSD_RESTART_OBJ) * 9 / 10;
        printf("restart: %llu objects need a tier of %.2f GiB, %s has %.2f GiB free: "
               "%llu objects instead\n",
               (unsigned long long)n, (double)tier / KVD_GiB, work,
               (double)avail / KVD_GiB, (unsigned long long)fit);
        n = fit;
        if (n < 1000)
            return KVD_ERR_NO_SPACE;
        tier = ssd_tier_bytes(n, SSD_RESTART_OBJ, seg);
    }
    char dir[PATH_MAX + 16];
    snprintf(dir, sizeof(dir), "%s/tier-restart", work);
    ssd_rig_t g = {.pool_bytes = KVD_MIN(SSD_RESTART_POOL, o->pool_bytes),
                   .object_bytes = SSD_RESTART_OBJ};
    int rc = rig_open(&g, o, dir, tier, true, n, "bench/ssd4k", NULL, NULL);
    if (rc != KVD_OK) {
        rig_free(&g);
        return rc;
    }
    uint64_t deadline = kvd_now_ns() + (uint64_t)(o->seconds * 1e9), done = 0;
    uint64_t t0 = kvd_now_ns(), c0 = ssd_cpu_ns();
    rc = rig_fill(&g, 2, 0, n, SSD_FILL_BATCH_4K, deadline, &done);
    kvd_store_tier_drain(g.s, 120000);
    uint64_t fill_ns = kvd_now_ns() - t0, fill_cpu = ssd_cpu_ns() - c0;
    kvd_store_stats_t st = rig_stats(&g);
    uint64_t on_tier = st.ssd_objects;
    printf("restart fill: %llu objects of 4 KiB published in %.1f s through a %llu MiB "
           "pool, %llu spilled (%.0f spills/s, %.3f GB/s of records with their header "
           "blocks); CPU %.1f s; %llu on the tier, %.2f GiB of it used, drops %llu%s\n",
           (unsigned long long)done, ssd_s(fill_ns),
           (unsigned long long)(g.pool_bytes >> 20), (unsigned long long)st.spills,
           (double)st.spills / ssd_s(fill_ns),
           ssd_gbps(st.spills * 2 * SSD_RESTART_OBJ, fill_ns), ssd_s(fill_cpu),
           (unsigned long long)on_tier, (double)st.ssd_used_bytes / KVD_GiB,
           (unsigned long long)st.evictions, done < n ? " (cut by --seconds)" : "");
    fflush(stdout);
    if (rc == KVD_OK) {
        uint64_t close_ns = rig_close_store(&g);
        printf("restart: kvd_store_destroy (writes the checkpoint of %llu records) "
               "%.3f s\n",
               (unsigned long long)on_tier, ssd_s(close_ns));
        rc = restart_attach(&g, o, dir, tier, n, on_tier, "checkpoint");
    }
    if (rc == KVD_OK) {
        rig_close_store(&g);
        char ckpt[PATH_MAX + 32];
        snprintf(ckpt, sizeof(ckpt), "%s/tier.ckpt", dir);
        if (unlink(ckpt) != 0)
            fprintf(stderr, "kvdock-bench ssd: unlink %s: %s\n", ckpt, strerror(errno));
        rc = restart_attach(&g, o, dir, tier, n, on_tier, "no checkpoint: summaries");
    }
    if (rc == KVD_OK) {
        /* neither: every record header is read */
        rig_close_store(&g);
        char path[PATH_MAX + 32];
        snprintf(path, sizeof(path), "%s/tier.ckpt", dir);
        unlink(path);
        for (uint64_t id = 0; id <= tier / seg; id++) {
            snprintf(path, sizeof(path), "%s/seg-%06u.sum", dir, (unsigned)id);
            unlink(path);
        }
        rc = restart_attach(&g, o, dir, tier, n, on_tier,
                            "no checkpoint, no summaries: scan");
    }
    ssd_lat_t lat = {0};
    if (rc == KVD_OK)
        rc = phase_latency(&g, 2, done, SSD_LAT_KEYS, NULL, &lat);
    if (rc == KVD_OK)
        printf("load from SSD after the restart (1 key of 4 KiB, tier_poll spun): %llu "
               "loads, p50 %.0f us, p99 %.0f us, max %.0f us; failed %llu, wrong bytes "
               "%llu\n",
               (unsigned long long)lat.n, lat.p50_us, lat.p99_us, lat.max_us,
               (unsigned long long)lat.failed, (unsigned long long)lat.wrong);
    rig_free(&g);
    ssd_rm_tree(dir);
    if (rc == KVD_OK && have_fio) {
        /* the same shapes of I/O: a spill of 4 KiB is one 8 KiB write, the
         * scan one synchronous 4 KiB read per 8 KiB */
        double w = fio_run(work, "write", 256ull << 20, 2 * SSD_RESTART_OBJ,
                           o->queue_depth, 0, 5);
        double r = fio_run(work, "read:4k", 256ull << 20, SSD_RESTART_OBJ, 1, 1, 5);
        printf("fio beside (5 s each): 8 KiB writes at iodepth %llu (io_uring): %.0f/s; "
               "4 KiB psync reads at an 8 KiB stride, 1 job: %.0f/s -> a scan of %llu "
               "headers at that rate: %.1f s\n",
               (unsigned long long)o->queue_depth, w / (2.0 * SSD_RESTART_OBJ),
               r / SSD_RESTART_OBJ, (unsigned long long)on_tier,
               r > 0 ? (double)on_tier / (r / SSD_RESTART_OBJ) : 0.0);
        if (w > 0)
            printf("  ratio spills/s / fio 8 KiB writes/s: %.2fx\n",
                   ((double)st.spills / ssd_s(fill_ns)) / (w / (2.0 * SSD_RESTART_OBJ)));
        char f[PATH_MAX + 16];
        snprintf(f, sizeof(f), "%s/fio.dat", work);
        unlink(f);
    }
    fflush(stdout);
    return rc;
}

/* ----------------------------------------------------------------- mode */

static void ssd_usage(FILE *f)
{
    fprintf(f,
            "Usage: kvdock-bench ssd [--dir DIR] [--object-size 1M] [--objects 2048]\n"
            "         [--pool-size 256M] [--queue-depth 32] [--io auto|io_uring|psync]\n"
            "         [--segment-size 256M] [--restart-objects 1000000] [--seconds 120]\n"
            "         [--sync-objects 1024] [--compact-objects 0]\n"
            "The SSD tier in process on real files (O_DIRECT) beside fio in the same\n"
            "directory: spill and promote GB/s, the latency of a load that hits the\n"
            "tier, and the restart with --restart-objects objects of 4 KiB on it\n"
            "(checkpoint, then the scan). Files go to a temporary directory under DIR\n"
            "(/var/tmp: a disk, not tmpfs), removed at the end. --seconds bounds each\n"
            "fill and the promote pass (0 objects skips a part). --sync-objects objects\n"
            "are spilled with the group commit (a spill acknowledged once its record\n"
            "is synced) and without, on fresh tiers: both GB/s and their ratio.\n"
            "--compact-objects N: a tier for N/2 objects, N/2 spilled, every other one\n"
            "evicted, N/2 more spilled while compaction reclaims: both rates, segments\n"
            "compacted, bytes copied, write amplification.\n");
}

static int ssd_size_opt(const char *flag, const char *arg, uint64_t min, uint64_t max,
                        uint64_t *out)
{
    uint64_t v;
    if (kvd_size_parse(arg, &v) != KVD_OK || v < min || v > max) {
        fprintf(stderr, "kvdock-bench ssd: %s '%s': expected a size in [%llu, %llu]\n",
                flag, arg, (unsigned long long)min, (unsigned long long)max);
        return -1;
    }
    *out = v;
    return 0;
}

static int ssd_parse_opts(int argc, char **argv, ssd_opts_t *o)
{
    static const struct option longopts[] = {
        {"dir", required_argument, NULL, 'd'},
        {"object-size", required_argument, NULL, 'b'},
        {"objects", required_argument, NULL, 'n'},
        {"pool-size", required_argument, NULL, 'p'},
        {"queue-depth", required_argument, NULL, 'q'},
        {"io", required_argument, NULL, 'i'},
        {"segment-size", required_argument, NULL, 'g'},
        {"restart-objects", required_argument, NULL, 'r'},
        {"seconds", required_argument, NULL, 't'},
        {"sync-objects", required_argument, NULL, 'y'},
        {"compact-objects", required_argument, NULL, 'c'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0}};
    *o = (ssd_opts_t){.dir = "/var/tmp",
                      .object_bytes = KVD_MiB,
                      .objects = 2048,
                      .pool_bytes = 256 * KVD_MiB,
                      .segment_bytes = 256 * KVD_MiB,
                      .restart_objects = 1000000,
                      .sync_objects = 1024,
                      .queue_depth = 32,
                      .seconds = 120};
    int c, bad = 0;
    optind = 1;
    while (!bad && (c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        switch (c) {
        case 'd': o->dir = optarg; break;
        case 'b':
            bad = ssd_size_opt("--object-size", optarg, SSD_BLOCK, 64 * KVD_MiB,
                               &o->object_bytes);
            break;
        case 'p':
            bad = ssd_size_opt("--pool-size", optarg, 16 * KVD_MiB, 64 * KVD_GiB,
                               &o->pool_bytes);
            break;
        case 'g':
            bad = ssd_size_opt("--segment-size", optarg, 1 * KVD_MiB, 4 * KVD_GiB,
                               &o->segment_bytes);
            break;
        case 'n':
            bad = kvd_u64_parse(optarg, 0, 1ull << 24, &o->objects) != KVD_OK;
            break;
        case 'r':
            bad = kvd_u64_parse(optarg, 0, 1ull << 28, &o->restart_objects) != KVD_OK;
            break;
        case 'y':
            bad = kvd_u64_parse(optarg, 0, 1ull << 24, &o->sync_objects) != KVD_OK;
            break;
        case 'c':
            bad = kvd_u64_parse(optarg, 0, 1ull << 24, &o->compact_objects) != KVD_OK;
            break;
        case 'q': bad = kvd_u64_parse(optarg, 1, 4096, &o->queue_depth) != KVD_OK; break;
        case 't': bad = kvd_double_parse(optarg, 1, 3600, &o->seconds) != KVD_OK; break;
        case 'i':
            o->io_path = strcmp(optarg, "auto") == 0       ? 0
                         : strcmp(optarg, "io_uring") == 0 ? 1
                         : strcmp(optarg, "psync") == 0    ? 2
                                                           : -1;
            bad = o->io_path < 0;
            break;
        case 'h': ssd_usage(stdout); return -1;
        default: bad = 1; break;
        }
    }
    if (!bad && optind < argc)
        bad = 1;
    if (!bad && (o->object_bytes % SSD_BLOCK != 0 || o->segment_bytes % SSD_BLOCK != 0 ||
                 o->object_bytes + SSD_BLOCK >= o->segment_bytes ||
                 o->object_bytes * 4 > o->pool_bytes)) {
        fprintf(stderr, "kvdock-bench ssd: --object-size must be a multiple of 4 KiB, "
                        "below --segment-size and at most a quarter of --pool-size\n");
        bad = 1;
    }
    if (bad) {
        ssd_usage(stderr);
        return BENCH_EXIT_USAGE;
    }
    return BENCH_EXIT_OK;
}

/* `kvdock-bench ssd`: see ssd_usage(). */
int bench_mode_ssd(int argc, char **argv)
{
    ssd_opts_t o;
    int rc = ssd_parse_opts(argc, argv, &o);
    if (rc != BENCH_EXIT_OK)
        return rc < 0 ? BENCH_EXIT_OK : rc;
    char work[PATH_MAX];
    snprintf(work, sizeof(work), "%s/kvdock-bench-ssd-XXXXXX", o.dir);
    if (mkdtemp(work) == NULL) {
        fprintf(stderr, "kvdock-bench ssd: mkdtemp in %s: %s\n", o.dir, strerror(errno));
        return BENCH_EXIT_FAIL;
    }
    struct statfs fs;
    bool tmpfs = statfs(work, &fs) == 0 && fs.f_type == TMPFS_MAGIC;
    bool have_fio = fio_present();
    printf("kvdock-bench ssd: %s (%s, %.1f GiB free), %ld online CPUs; GB/s are 1e9 "
           "bytes/s\n",
           work,
           tmpfs ? "tmpfs: NOT a disk, the figures say nothing of one" : "not tmpfs",
           (double)ssd_fs_avail(work) / KVD_GiB, sysconf(_SC_NPROCESSORS_ONLN));
    if (!have_fio)
        printf("fio: not found on PATH (apt-get install fio): the fio figures and "
               "ratios are skipped\n");
    fflush(stdout);
    rc = KVD_OK;
    if (o.objects > 0)
        rc = run_throughput(&o, work, have_fio);
    if (rc == KVD_OK && o.sync_objects > 0)
        rc = run_sync_compare(&o, work);
    if (rc == KVD_OK && o.compact_objects > 0)
        rc = run_compact(&o, work);
    if (rc == KVD_OK && o.restart_objects > 0)
        rc = run_restart(&o, work, have_fio);
    ssd_rm_tree(work);
    return rc == KVD_OK ? BENCH_EXIT_OK : BENCH_EXIT_FAIL;
}
