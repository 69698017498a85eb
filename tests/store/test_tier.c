/*
 * Description: the SSD tier through the store engine, on real files and a
 * real pool mapping: objects spill when the pool passes its watermark and
 * come back byte-exact through Acquire's promotion (a working set twice the
 * pool), Lookup says which tier a boundary needs, the tier comes back after
 * a clean stop and after a crash (a child killed by SIGKILL) with the pool's
 * bytes gone (a reboot), an operator's eviction lasts across a crash, the
 * tier evicts and compacts when full (and a restart keeps compaction's
 * copy of a record, not its source; a copy that cannot be written leaves
 * its source good), and faults (a flipped byte, a device that answers
 * EIO, a truncated segment) make objects absent, never wrong, and so do
 * pool bytes lost under spills in flight, across a SIGKILL too. Each case runs
 * over both I/O paths (io_uring where the kernel allows it, pread/pwrite).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "engine_util.h"
#include "kvd_store.h"
#include "store_testing.h"

#define POOL_BYTES (1u << 20) /* 16 objects */
#define OBJ_BYTES  (64u << 10)
#define SEG_BYTES  (256u << 10) /* 3 records of 64 KiB + header each */
#define TIER_BYTES (16u * SEG_BYTES)
#define N_OBJ      32 /* twice the pool */

typedef struct fx {
    char dir[64];
    uint8_t *pool;
    kvd_store_t *s;
    uint32_t ns;
    int io_path;
    uint64_t checkpoint_ms;         /* 0: the default period */
    uint64_t seg_bytes, tier_bytes; /* 0: SEG_BYTES, TIER_BYTES */
    uint32_t fail_copy_writes;      /* test hooks (kvd_tier_opts_t) */
    uint32_t fail_spill_writes;
    bool fail_pads;
    bool hold_syncs, no_sync;
    kvd_tier_recovery_t rec; /* what the last open found */
} fx_t;

static int io_path_of_state(void **state)
{
    return (int)(intptr_t)*state;
}

static void fill(uint8_t *p, uint32_t n)
{
    for (uint32_t k = 0; k < OBJ_BYTES; k++)
        p[k] = (uint8_t)(n * 131 + k * 7 + (k >> 9));
}

static bool same(const uint8_t *p, uint32_t n)
{
    uint8_t want[OBJ_BYTES];
    fill(want, n);
    return memcmp(p, want, OBJ_BYTES) == 0;
}

/* A store on the fixture's pool with a tier in its directory. */
static int open_store(fx_t *f, bool fresh, uint32_t fail_read_every, char *why,
                      size_t len)
{
    kvd_store_config_t cfg;
    kvd_store_config_default(&cfg, POOL_BYTES);
    cfg.evict_high = 0.80;
    cfg.evict_low = 0.60;
    assert_int_equal(kvd_store_create(&cfg, &f->s), KVD_OK);
    kvd_tier_opts_t o = {.dir = f->dir,
                         .size_bytes = f->tier_bytes ? f->tier_bytes : TIER_BYTES,
                         .segment_bytes = f->seg_bytes ? f->seg_bytes : SEG_BYTES,
                         .io_path = f->io_path,
                         .queue_depth = 8,
                         .pool_base = f->pool,
                         .pool_bytes = POOL_BYTES,
                         .fresh = fresh,
                         .fail_read_every = fail_read_every,
                         .fail_copy_writes = f->fail_copy_writes,
                         .fail_spill_writes = f->fail_spill_writes,
                         .fail_pad_writes = f->fail_pads,
                         .hold_syncs = f->hold_syncs,
                         .no_sync = f->no_sync,
                         .checkpoint_ms = f->checkpoint_ms,
                         .checkpoint_slice = f->checkpoint_ms ? 5 : 0};
    int rc = kvd_store_tier_attach(f->s, &o, &f->rec, why, len);
    if (rc != KVD_OK) {
        kvd_store_destroy(f->s);
        f->s = NULL;
        return rc;
    }
    f->ns = reg(f->s, "kv", OBJ_BYTES);
    return KVD_OK;
}

static void fx_init(fx_t *f, int io_path)
{
    memset(f, 0, sizeof(*f));
    f->io_path = io_path;
    snprintf(f->dir, sizeof(f->dir), "/tmp/kvd-tier-XXXXXX");
    assert_non_null(mkdtemp(f->dir));
    f->pool =
        mmap(NULL, POOL_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    assert_true(f->pool != MAP_FAILED);
    char why[512] = "";
    int rc = open_store(f, true, 0, why, sizeof(why));
    if (rc == KVD_ERR_UNSUPPORTED) {
        print_message("skip: io_uring cannot be set up here (%s)\n", why);
        skip();
    }
    assert_int_equal(rc, KVD_OK);
}

static void fx_fini(fx_t *f)
{
    kvd_store_destroy(f->s);
    munmap(f->pool, POOL_BYTES);
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", f->dir);
    assert_int_equal(system(cmd), 0);
}

/* Publishes object n (its bytes written into the pool first). */
static void put(fx_t *f, uint32_t n)
{
    key_t32 key;
    mkkey(key, n);
    kvd_put_t it = {.key = key};
    uint64_t lease;
    uint8_t res;
    kvd_loc_t loc;
    assert_int_equal(kvd_store_reserve(f->s, 1, f->ns, &it, 1, 0, &lease, &res, &loc),
                     KVD_OK);
    assert_int_equal(res, KVD_RESERVE_ALLOCATED);
    fill(f->pool + loc.offset, n);
    assert_int_equal(kvd_store_publish(f->s, 1, lease, NULL, 0), KVD_OK);
    kvd_store_tier_poll(f->s, 0);
    check_ok(f->s);
}

/* Acquires object n, waiting for its promotion: KVD_OK with its bytes
 * checked, or the error that ended it. */
static int get(fx_t *f, uint32_t n)
{
    key_t32 key;
    mkkey(key, n);
    for (int round = 0; round < 2000; round++) {
        uint64_t lease;
        kvd_loc_t loc;
        size_t bad;
        int rc = kvd_store_acquire(f->s, 1, f->ns, (const uint8_t(*)[KVD_KEY_BYTES])key,
                                   1, 0, &lease, &loc, &bad);
        check_ok(f->s);
        if (rc == KVD_INPROGRESS) {
            kvd_store_tier_drain(f->s, 100);
            continue;
        }
        if (rc != KVD_OK)
            return rc;
        bool ok = same(f->pool + loc.offset, n);
        assert_int_equal(kvd_store_release(f->s, 1, lease), KVD_OK);
        assert_true(ok);
        return KVD_OK;
    }
    fail_msg("object %u: still promoting after 2000 rounds", n);
    return KVD_ERR_TIMEOUT;
}

static void put_all(fx_t *f)
{
    for (uint32_t n = 0; n < N_OBJ; n++) {
        put(f, n);
        kvd_store_tier_drain(f->s, 1000);
    }
    kvd_store_tier_drain(f->s, 2000);
    check_ok(f->s);
}

/* Publishes object n in namespace ns. */
static void put_ns(fx_t *f, uint32_t ns, uint32_t n)
{
    uint32_t keep = f->ns;
    f->ns = ns;
    put(f, n);
    f->ns = keep;
}

static uint64_t tenant_bytes(fx_t *f, uint32_t t, uint64_t *max)
{
    kvd_tenant_limits_t lim;
    kvd_tenant_usage_t use;
    assert_int_equal(kvd_store_tenant_usage(f->s, t, &lim, &use), KVD_OK);
    *max = lim.max_bytes;
    return use.bytes;
}

/* A promotion brings an object back into DRAM within its tenant's
 * max_bytes: the tenant's own cold objects make room (as for a Reserve),
 * and what comes back is byte-exact. Before, promotions took the tenant
 * past its quota. */
static void test_promotion_keeps_the_tenant_quota(void **state)
{
    fx_t f;
    fx_init(&f, io_path_of_state(state));
    kvd_tenant_limits_t lim = {.max_bytes = 6ull * OBJ_BYTES};
    uint32_t t, ns;
    assert_int_equal(kvd_store_tenant_add(f.s, "t1", &lim, &t), KVD_OK);
    assert_int_equal(kvd_store_ns_register(f.s, t, 1, "t1/kv", OBJ_BYTES, false, &ns),
                     KVD_OK);
    for (uint32_t n = 0; n < 5; n++) /* the tenant's first five: spilled below */
        put_ns(&f, ns, n);
    for (uint32_t n = 100; n < 100 + N_OBJ; n++) { /* the default tenant's */
        put(&f, n);
        kvd_store_tier_drain(f.s, 1000);
    }
    kvd_store_tier_drain(f.s, 2000);
    for (uint32_t n = 5; n < 10; n++) /* five more, in DRAM */
        put_ns(&f, ns, n);
    uint64_t max = 0;
    assert_true(tenant_bytes(&f, t, &max) <= max);
    uint32_t keep = f.ns;
    f.ns = ns;
    size_t back = 0;
    for (uint32_t n = 0; n < 5; n++) {
        int rc = get(&f, n);
        assert_true(rc == KVD_OK || rc == KVD_ERR_NOT_FOUND || rc == KVD_ERR_NO_SPACE);
        back += rc == KVD_OK;
        uint64_t b = tenant_bytes(&f, t, &max);
        assert_true(b <= max);
    }
    f.ns = keep;
    /* the first ones did spill, and came back within the quota */
    assert_true(back > 0);
    kvd_tenant_usage_t use;
    assert_int_equal(kvd_store_tenant_usage(f.s, t, NULL, &use), KVD_OK);
    assert_true(use.quota_evictions > 0);
    check_ok(f.s);
    fx_fini(&f);
}

static uint8_t where_of(fx_t *f, uint32_t k);

/* Group commit: a spill whose write landed is not acknowledged while its
 * segment's sync is held back (the test hook): the object stays in DRAM,
 * readable and byte-exact, its extent not freed (spilling_bytes), nothing
 * on the tier; once the syncs go, the spills are acknowledged (the DRAM
 * copies freed, the objects on the tier) and the syncs are counted. With
 * no_sync the spills are acknowledged as their writes land, unsynced.
 * Before the group commit, the spills were acknowledged with no sync. */
static void test_spill_waits_for_its_sync(void **state)
{
    fx_t f;
    fx_init(&f, io_path_of_state(state));
    kvd_store_destroy(f.s); /* again, with the hook from the start */
    f.hold_syncs = true;
    char why[512];
    assert_int_equal(open_store(&f, true, 0, why, sizeof(why)), KVD_OK);
    for (uint32_t n = 0; n < 16; n++) /* past the high watermark: spills begin */
        put(&f, n);
    kvd_store_tier_drain(f.s, 2000); /* every write lands; no sync begins */
    kvd_store_stats_t st = stats(f.s);
    print_message("held: %llu bytes spilling, %llu spills, %llu syncs, %llu writes in "
                  "flight\n",
                  (unsigned long long)st.spilling_bytes, (unsigned long long)st.spills,
                  (unsigned long long)st.ssd_syncs, (unsigned long long)st.ssd_in_flight);
    assert_true(st.spilling_bytes > 0); /* extents held, not freed */
    assert_int_equal(st.spills, 0);
    assert_int_equal(st.ssd_objects, 0);
    assert_int_equal(st.ssd_live_bytes, 0);
    assert_int_equal(st.ssd_syncs, 0);
    assert_int_equal(st.evictions, 0);
    for (uint32_t n = 0; n < 16; n++)
        assert_int_equal(where_of(&f, n), 1); /* in DRAM */
    kvd_store_tier_hold_syncs(f.s, false);
    kvd_store_tier_drain(f.s, 2000);
    st = stats(f.s);
    print_message("released: %llu spills, %llu syncs\n", (unsigned long long)st.spills,
                  (unsigned long long)st.ssd_syncs);
    assert_true(st.spills > 0);
    assert_true(st.ssd_syncs > 0);
    assert_int_equal(st.ssd_objects, st.spills);
    assert_int_equal(st.spilling_bytes, 0);
    for (uint32_t n = 0; n < 16; n++)
        assert_int_equal(get(&f, n), KVD_OK); /* byte-exact, from either tier */
    check_ok(f.s);
    kvd_store_destroy(f.s);

    /* without the syncs: acknowledged as written, none counted */
    f.hold_syncs = false;
    f.no_sync = true;
    assert_int_equal(open_store(&f, true, 0, why, sizeof(why)), KVD_OK);
    for (uint32_t n = 0; n < 16; n++)
        put(&f, n);
    kvd_store_tier_drain(f.s, 2000);
    st = stats(f.s);
    assert_true(st.spills > 0);
    assert_int_equal(st.ssd_syncs, 0);
    check_ok(f.s);
    fx_fini(&f);
}

/* Twice the pool's worth goes through the tier and back, byte-exact. */
static void test_twice_dram_round_trips(void **state)
{
    fx_t f;
    fx_init(&f, io_path_of_state(state));
    put_all(&f);
    kvd_store_stats_t st = stats(f.s);
    assert_true(st.spills >= N_OBJ / 2);
    assert_true(st.ssd_objects > 0);
    assert_int_equal(st.evictions, 0); /* moved, not dropped */
    for (uint32_t n = 0; n < N_OBJ; n++)
        assert_int_equal(get(&f, n), KVD_OK);
    st = stats(f.s);
    assert_true(st.promotions > 0);
    assert_int_equal(st.ssd_checksum_failures, 0);
    assert_int_equal(st.promote_failures, 0);
    fx_fini(&f);
}

/* Lookup counts objects on the tier and says a boundary needs it. */
static void test_lookup_says_the_tier(void **state)
{
    fx_t f;
    fx_init(&f, io_path_of_state(state));
    put_all(&f);
    key_t32 keys[N_OBJ];
    for (uint32_t n = 0; n < N_OBJ; n++)
        mkkey(keys[n], n);
    kvd_lookup_pool_t p = {
        .ns = f.ns, .keys = (const uint8_t(*)[KVD_KEY_BYTES])keys, .n_keys = N_OBJ};
    uint32_t b[N_OBJ];
    uint8_t tiers[N_OBJ];
    size_t nb;
    assert_int_equal(kvd_store_lookup_tiers(f.s, &p, 1, b, tiers, &nb), KVD_OK);
    assert_int_equal(nb, N_OBJ); /* every page is there, on one tier or the other */
    /* the oldest pages went first: boundary 1 needs page 0, on SSD */
    kvd_obj_info_t info;
    assert_int_equal(kvd_store_inspect(f.s, f.ns, keys[0], &info), KVD_OK);
    assert_int_equal(info.tier, KVD_TIER_SSD);
    assert_int_equal(tiers[0], KVD_TIER_SSD);
    assert_int_equal(tiers[N_OBJ - 1], KVD_TIER_SSD); /* ALL_PAGES includes page 0 */
    /* a trailing window of the newest page alone is in DRAM */
    assert_int_equal(kvd_store_inspect(f.s, f.ns, keys[N_OBJ - 1], &info), KVD_OK);
    assert_int_equal(info.tier, KVD_TIER_DRAM);
    p.trailing_pages = 1;
    assert_int_equal(kvd_store_lookup_tiers(f.s, &p, 1, b, tiers, &nb), KVD_OK);
    assert_int_equal(tiers[nb - 1], KVD_TIER_DRAM);
    fx_fini(&f);
}

/* After a clean stop and with the pool's bytes gone, the tier's objects
 * are back and read back exact. */
static void test_restart_keeps_the_tier(void **state)
{
    fx_t f;
    fx_init(&f, io_path_of_state(state));
    put_all(&f);
    uint64_t on_ssd = stats(f.s).ssd_objects;
    kvd_store_destroy(f.s);        /* writes the checkpoint */
    memset(f.pool, 0, POOL_BYTES); /* a reboot: DRAM is gone */
    char why[512];
    assert_int_equal(open_store(&f, false, 0, why, sizeof(why)), KVD_OK);
    kvd_store_stats_t st = stats(f.s);
    assert_int_equal(st.ssd_objects, on_ssd);
    assert_int_equal(st.ssd_recovered_objects, on_ssd);
    size_t back = 0;
    for (uint32_t n = 0; n < N_OBJ; n++) {
        int rc = get(&f, n);
        assert_true(rc == KVD_OK || rc == KVD_ERR_NOT_FOUND);
        back += rc == KVD_OK;
    }
    assert_int_equal(back, on_ssd);
    fx_fini(&f);
}

/* Without the checkpoint a restart reads the segments' summaries, not their
 * record headers; without those too, it scans, and finds the same. */
static void test_summaries_spare_the_scan(void **state)
{
    fx_t f;
    fx_init(&f, io_path_of_state(state));
    put_all(&f);
    uint64_t on_ssd = stats(f.s).ssd_objects;
    kvd_store_destroy(f.s); /* summaries of every segment written, and the checkpoint */
    char path[160], why[512];
    snprintf(path, sizeof(path), "%s/tier.ckpt", f.dir);
    assert_int_equal(unlink(path), 0);
    memset(f.pool, 0, POOL_BYTES);
    assert_int_equal(open_store(&f, false, 0, why, sizeof(why)), KVD_OK);
    assert_int_equal(stats(f.s).ssd_objects, on_ssd);
    assert_true(f.rec.summary_records >= on_ssd);
    assert_int_equal(f.rec.scanned_records, 0);
    assert_int_equal(f.rec.checkpoint_records, 0);
    kvd_store_destroy(f.s);
    /* every summary and the checkpoint gone: the scan finds as many */
    for (uint32_t id = 0; id < TIER_BYTES / SEG_BYTES; id++) {
        snprintf(path, sizeof(path), "%s/seg-%06u.sum", f.dir, id);
        unlink(path);
    }
    snprintf(path, sizeof(path), "%s/tier.ckpt", f.dir);
    assert_int_equal(unlink(path), 0);
    assert_int_equal(open_store(&f, false, 0, why, sizeof(why)), KVD_OK);
    assert_int_equal(stats(f.s).ssd_objects, on_ssd);
    assert_int_equal(f.rec.summary_records, 0);
    assert_true(f.rec.scanned_records >= on_ssd);
    size_t back = 0;
    for (uint32_t n = 0; n < N_OBJ; n++)
        back += get(&f, n) == KVD_OK;
    assert_true(back >= on_ssd);
    fx_fini(&f);
}

/* A process killed with SIGKILL after its spills were acknowledged, while
 * periodic checkpoints ran on their thread: the records are found from the
 * last checkpoint and the segments' headers written after it. */
static void test_sigkill_keeps_acknowledged_spills(void **state)
{
    fx_t f;
    fx_init(&f, io_path_of_state(state));
    kvd_store_destroy(f.s); /* the child makes its own */
    f.s = NULL;
    int pipefd[2];
    assert_int_equal(pipe(pipefd), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        char why[512];
        /* one checkpoint after another, each built over several polls (5
         * records a slice) while spills go on, and written on its thread */
        f.checkpoint_ms = 1;
        if (open_store(&f, true, 0, why, sizeof(why)) != KVD_OK)
            _exit(3);
        put_all(&f);
        /* a checkpoint written after put_all began: it lists spills */
        uint64_t begun = stats(f.s).ssd_checkpoints;
        for (int k = 0; k < 500 && stats(f.s).ssd_checkpoints < begun + 1; k++) {
            usleep(10000);
            kvd_store_tier_poll(f.s, 0);
        }
        uint64_t n = stats(f.s).ssd_objects;
        if (write(pipefd[1], &n, sizeof(n)) != sizeof(n))
            _exit(4);
        pause(); /* killed here, with nothing closed */
        _exit(5);
    }
    close(pipefd[1]);
    uint64_t on_ssd = 0;
    assert_int_equal(read(pipefd[0], &on_ssd, sizeof(on_ssd)), sizeof(on_ssd));
    close(pipefd[0]);
    kill(pid, SIGKILL);
    int ws;
    assert_int_equal(waitpid(pid, &ws, 0), pid);
    assert_true(on_ssd > 0);
    memset(f.pool, 0, POOL_BYTES);
    char why[512];
    assert_int_equal(open_store(&f, false, 0, why, sizeof(why)), KVD_OK);
    assert_true(stats(f.s).ssd_objects >= on_ssd);
    /* the periodic checkpoints ran: the restart read one, and scanned
     * only what came after it */
    assert_true(f.rec.checkpoint_records > 0);
    size_t back = 0;
    for (uint32_t n = 0; n < N_OBJ; n++)
        back += get(&f, n) == KVD_OK;
    assert_true(back >= on_ssd);
    fx_fini(&f);
}

/* An operator's eviction of the tier's objects lasts across a crash: it
 * begins a checkpoint at once, and a restart after SIGKILL finds none of
 * them (their records are still in the segments). */
static void test_eviction_survives_sigkill(void **state)
{
    fx_t f;
    fx_init(&f, io_path_of_state(state));
    kvd_store_destroy(f.s);
    f.s = NULL;
    int pipefd[2];
    assert_int_equal(pipe(pipefd), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        char why[512];
        if (open_store(&f, true, 0, why, sizeof(why)) != KVD_OK)
            _exit(3);
        put_all(&f);
        uint64_t on_ssd = stats(f.s).ssd_objects, ev, sk;
        uint64_t begun = stats(f.s).ssd_checkpoints;
        kvd_store_evict_ns(f.s, UINT32_MAX, &ev, &sk);
        for (int k = 0; k < 500 && stats(f.s).ssd_checkpoints < begun + 1; k++) {
            usleep(10000);
            kvd_store_tier_poll(f.s, 0);
        }
        uint64_t n = stats(f.s).ssd_checkpoints > begun ? on_ssd : 0;
        if (write(pipefd[1], &n, sizeof(n)) != sizeof(n))
            _exit(4);
        pause(); /* killed here */
        _exit(5);
    }
    close(pipefd[1]);
    uint64_t evicted_from_ssd = 0;
    assert_int_equal(read(pipefd[0], &evicted_from_ssd, sizeof(evicted_from_ssd)),
                     sizeof(evicted_from_ssd));
    close(pipefd[0]);
    kill(pid, SIGKILL);
    int ws;
    assert_int_equal(waitpid(pid, &ws, 0), pid);
    assert_true(evicted_from_ssd > 0); /* the tier held objects; a checkpoint followed */
    char why[512];
    assert_int_equal(open_store(&f, false, 0, why, sizeof(why)), KVD_OK);
    assert_int_equal(stats(f.s).ssd_objects, 0);
    for (uint32_t n = 0; n < N_OBJ; n++)
        assert_int_equal(get(&f, n), KVD_ERR_NOT_FOUND);
    fx_fini(&f);
}

/* Removes the tier's checkpoint, and with `summaries` every segment's
 * summary too: the next open reads what is left (summaries, or headers). */
static void drop_index_files(const fx_t *f, bool summaries)
{
    char path[160];
    snprintf(path, sizeof(path), "%s/tier.ckpt", f->dir);
    assert_int_equal(unlink(path), 0);
    for (uint32_t id = 0; summaries && id < TIER_BYTES / SEG_BYTES; id++) {
        snprintf(path, sizeof(path), "%s/seg-%06u.sum", f->dir, id);
        unlink(path);
    }
}

typedef struct place {
    uint32_t seg, block;
    bool on_ssd;
} place_t;

static place_t place_of(fx_t *f, uint32_t n)
{
    key_t32 key;
    mkkey(key, n);
    place_t p = {0};
    p.on_ssd = kvd_store_tier_place(f->s, f->ns, key, &p.seg, &p.block) == KVD_OK;
    return p;
}

#define MOVE_MAX 600

/* Fills the tier, promoting every third object of 20 puts ago (its record
 * dies; with `most`, two of three), until a segment half dead is
 * compacted; before[k] is object k's place before the last put. Returns
 * the objects put. */
static uint32_t fill_until_compacted(fx_t *f, place_t *before, bool most)
{
    uint32_t n = 0;
    for (; n < MOVE_MAX && stats(f->s).ssd_compactions == 0; n++) {
        for (uint32_t k = 0; before != NULL && k < n; k++)
            before[k] = place_of(f, k);
        put(f, n);
        kvd_store_tier_drain(f->s, 1000);
        if (n >= 20 && (most ? n % 3 != 0 : n % 3 == 0)) {
            int rc = get(f, n - 20); /* absent: the tier evicted it for room */
            assert_true(rc == KVD_OK || rc == KVD_ERR_NOT_FOUND);
        }
        kvd_store_tier_drain(f->s, 1000);
    }
    assert_true(stats(f->s).ssd_compactions > 0);
    return n;
}

/* Compaction's copy of a record is the newer of the two: a restart that
 * finds both the copy and its source (the source's segment freed but not
 * begun again) keeps the copy, from the segments' summaries and from their
 * headers alike. Before, a copy's summary entry had seq 0 and its header
 * its source's seq, so the source won, in a segment compaction had freed. */
static void test_restart_keeps_the_copy_not_its_source(void **state)
{
    fx_t f;
    fx_init(&f, io_path_of_state(state));
    static place_t before[MOVE_MAX];
    uint32_t n = fill_until_compacted(&f, before, false);
    uint32_t moved = UINT32_MAX;
    place_t to = {0};
    for (uint32_t k = 0; k < n && moved == UINT32_MAX; k++) {
        place_t p = place_of(&f, k);
        if (p.on_ssd && before[k].on_ssd && p.seg != before[k].seg)
            moved = k, to = p;
    }
    assert_true(moved != UINT32_MAX); /* a copy the compaction made */
    print_message("object %u copied from segment %u block %u to segment %u block %u\n",
                  moved, before[moved].seg, before[moved].block, to.seg, to.block);
    for (int from_headers = 0; from_headers < 2; from_headers++) {
        kvd_store_destroy(f.s); /* summaries of every segment, and the checkpoint */
        drop_index_files(&f, from_headers);
        memset(f.pool, 0, POOL_BYTES); /* the pool gone: the tier alone decides */
        char why[512];
        assert_int_equal(open_store(&f, false, 0, why, sizeof(why)), KVD_OK);
        assert_true(from_headers ? f.rec.scanned_records > 0 : f.rec.summary_records > 0);
        place_t p = place_of(&f, moved);
        assert_true(p.on_ssd);
        assert_int_equal(p.seg, to.seg);
        assert_int_equal(p.block, to.block);
        check_ok(f.s);
    }
    assert_int_equal(get(&f, moved), KVD_OK);
    fx_fini(&f);
}

/* A compaction whose first copy cannot be written, nor its place covered
 * by a pad record (a hole: a restart's scan stops there, so the copies
 * after it in that segment are lost to a restart too): every source stays
 * good, so no object is dropped as failed; each object is still there,
 * byte-exact, or was evicted and counted so. Before, the failed copy and
 * those past the hole dropped their sources as failed records. */
static void test_failed_copy_keeps_its_source(void **state)
{
    fx_t f;
    fx_init(&f, io_path_of_state(state));
    kvd_store_destroy(f.s);
    /* segments of 15 records: a compaction copies several at once, and
     * those after the failed one lie past its hole */
    f.seg_bytes = 1u << 20;
    f.tier_bytes = 4u << 20;
    f.fail_copy_writes = 1;
    f.fail_pads = true;
    char why[512];
    assert_int_equal(open_store(&f, true, 0, why, sizeof(why)), KVD_OK);
    uint32_t n = fill_until_compacted(&f, NULL, true);
    kvd_store_tier_drain(f.s, 2000);
    kvd_store_stats_t st = stats(f.s);
    uint64_t absent = 0;
    for (uint32_t k = 0; k < n; k++) {
        key_t32 key;
        kvd_obj_info_t info;
        mkkey(key, k);
        absent += kvd_store_inspect(f.s, f.ns, key, &info) == KVD_ERR_NOT_FOUND;
    }
    print_message("%u objects: %llu absent, %llu evicted from the tier, %llu from DRAM, "
                  "%llu I/O errors, %llu failed promotions\n",
                  n, (unsigned long long)absent, (unsigned long long)st.ssd_evictions,
                  (unsigned long long)st.evictions, (unsigned long long)st.ssd_io_errors,
                  (unsigned long long)st.promote_failures);
    assert_true(st.ssd_io_errors >= 1); /* the hook's failed copy */
    assert_int_equal(st.promote_failures, 0);
    assert_int_equal(absent, st.ssd_evictions + st.evictions);
    for (uint32_t k = 0; k < n; k++) {
        int rc = get(&f, k); /* byte-exact when there (get asserts it) */
        assert_true(rc == KVD_OK || rc == KVD_ERR_NOT_FOUND);
    }
    assert_int_equal(stats(f.s).promote_failures, 0);
    check_ok(f.s);
    fx_fini(&f);
}

/* Entries in the tier's dead-list file (24 bytes each: tier.c's dead_ent_t). */
static uint64_t dead_entries(const fx_t *f)
{
    char path[160];
    struct stat st;
    snprintf(path, sizeof(path), "%s/tier.dead", f->dir);
    return stat(path, &st) == 0 ? (uint64_t)st.st_size / 24 : 0;
}

/* A spill whose write the device refuses (the hook: the first spill's
 * write ends with EIO), its place not covered by a pad either (a hole,
 * where a restart's scan stops): the failed spill's object is dropped and
 * counted, as eviction without a tier would (done_spill: a failing device
 * must not keep a spill loop going), never read wrong. The spills placed
 * after it in its segment landed past the hole, where a restart would not
 * find them: not acknowledged, their objects stay in DRAM, byte-exact, not
 * counted as failures, their records named dead; a later spill writes them
 * into another segment, and a restart after a clean stop brings them back
 * from there. */
static void test_spill_past_a_hole_stays_in_dram(void **state)
{
    fx_t f;
    fx_init(&f, io_path_of_state(state));
    kvd_store_destroy(f.s);
    f.fail_spill_writes = 1;
    f.fail_pads = true;
    f.checkpoint_ms = UINT64_MAX; /* no checkpoint rewrites the dead-list meanwhile */
    char why[512];
    assert_int_equal(open_store(&f, true, 0, why, sizeof(why)), KVD_OK);
    for (uint32_t n = 0; n < 13; n++) /* the 13th passes the high watermark */
        put(&f, n);
    kvd_store_tier_drain(f.s, 2000);
    kvd_store_stats_t st = stats(f.s);
    uint8_t where[13];
    uint32_t first_ssd = UINT32_MAX, kept = 0;
    for (uint32_t n = 0; n < 13; n++) {
        where[n] = where_of(&f, n);
        if (where[n] == 2 && first_ssd == UINT32_MAX)
            first_ssd = n;
    }
    /* spills go oldest first: 0 failed, those after it up to the first one
     * acknowledged (in the next segment) lay past the hole */
    for (uint32_t n = 1; n < first_ssd && n < 13; n++)
        kept += where[n] == 1;
    print_message("hole: %llu spill failures, %llu spills, %llu I/O errors, %u kept in "
                  "DRAM past it, first on the tier: object %u, %llu dead-list entries\n",
                  (unsigned long long)st.spill_failures, (unsigned long long)st.spills,
                  (unsigned long long)st.ssd_io_errors, kept, first_ssd,
                  (unsigned long long)dead_entries(&f));
    assert_int_equal(st.ssd_io_errors, 1); /* the hook's write, and nothing else */
    assert_int_equal(st.spill_failures, 1);
    assert_int_equal(where[0], 0); /* the failed spill: dropped */
    assert_true(first_ssd != UINT32_MAX && first_ssd < 13);
    assert_true(kept >= 1);
    assert_int_equal(kept, first_ssd - 1);    /* every one between: in DRAM */
    assert_int_equal(st.spilling_bytes, 0);   /* none of them still held */
    assert_int_equal(dead_entries(&f), kept); /* written, then named dead */
    uint32_t seg, block;
    key_t32 key;
    mkkey(key, first_ssd);
    assert_int_equal(kvd_store_tier_place(f.s, f.ns, key, &seg, &block), KVD_OK);
    assert_int_not_equal(seg, 0); /* the hole's segment (the first) got no more */
    for (uint32_t n = 1; n < first_ssd; n++) {
        mkkey(key, n);
        kvd_obj_info_t info;
        assert_int_equal(kvd_store_inspect(f.s, f.ns, key, &info), KVD_OK);
        assert_int_equal(info.tier, KVD_TIER_DRAM);
    }
    /* more objects: the kept ones reach the LRU's tail and spill again */
    uint32_t n = 13;
    bool all_moved = false;
    for (; n < 13 + 2 * N_OBJ && !all_moved; n++) {
        put(&f, n);
        kvd_store_tier_drain(f.s, 1000);
        all_moved = true;
        for (uint32_t k = 1; k < first_ssd; k++)
            all_moved &= where_of(&f, k) == 2;
    }
    st = stats(f.s);
    print_message("after %u more puts: kept objects on the tier: %s, %llu spills, %llu "
                  "failures\n",
                  n - 13, all_moved ? "all" : "not all", (unsigned long long)st.spills,
                  (unsigned long long)st.spill_failures);
    assert_true(all_moved);
    assert_int_equal(st.spill_failures, 1);
    assert_int_equal(st.ssd_io_errors, 1);
    check_ok(f.s);
    /* a clean stop, the pool gone: they come back from their new records */
    kvd_store_destroy(f.s);
    memset(f.pool, 0, POOL_BYTES);
    f.fail_spill_writes = 0;
    assert_int_equal(open_store(&f, false, 0, why, sizeof(why)), KVD_OK);
    assert_int_equal(get(&f, 0), KVD_ERR_NOT_FOUND);
    for (uint32_t k = 1; k < first_ssd; k++)
        assert_int_equal(get(&f, k), KVD_OK); /* byte-exact (get asserts) */
    check_ok(f.s);
    fx_fini(&f);
}

#define SYNC_N 16 /* puts before the sync fails: a round over several segments */

/* A child that opens the fixture's tier with its syncs held and no
 * checkpoint (so that only the dead-list keeps records out of a restart),
 * to report through pipefd and be SIGKILLed: its pid in the parent; 0 in
 * the child, its store open (or it exits 3). */
static pid_t fork_held(fx_t *f, void **state, int pipefd[2])
{
    fx_init(f, io_path_of_state(state));
    kvd_store_destroy(f->s);
    f->s = NULL;
    f->checkpoint_ms = UINT64_MAX;
    assert_int_equal(pipe(pipefd), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        char why[512];
        f->hold_syncs = true;
        if (open_store(f, true, 0, why, sizeof(why)) != KVD_OK)
            _exit(3);
    }
    return pid;
}

/* A segment's sync that fails (the hook: the round's first sync, the
 * first segment's, ends with EIO): its writes of the round are not
 * acknowledged as durable. sync_done makes each a failed write and a hole
 * (seg_break: the device may hold them torn), so, as a refused write,
 * each of those objects is dropped and counted in spill_failures; the
 * round's other segments are acknowledged. Nothing hangs: nothing stays in
 * flight or held. The records were written, so a restart's scan meets
 * them: after SIGKILL (no checkpoint since), the dead-list keeps them out,
 * the acknowledged ones come back byte-exact, and the tier goes on. */
static void test_failed_sync_acknowledges_nothing(void **state)
{
    fx_t f;
    int pipefd[2];
    pid_t pid = fork_held(&f, state, pipefd);
    if (pid == 0) {
        for (uint32_t n = 0; n < SYNC_N; n++)
            put(&f, n);
        kvd_store_tier_drain(f.s, 2000); /* the writes land; no round */
        uint64_t out[5];
        out[0] = stats(f.s).spilling_bytes; /* held: > 0 */
        kvd_store_tier_fail_syncs(f.s, 1);
        kvd_store_tier_hold_syncs(f.s, false);
        kvd_store_tier_drain(f.s, 2000);
        /* (its last poll may begin the round syncing the dead-list's new
         * entries: one more for that) */
        kvd_store_tier_drain(f.s, 2000);
        kvd_store_stats_t st = stats(f.s);
        out[1] = st.spill_failures;
        out[2] = st.spills;
        out[3] = st.spilling_bytes + st.ssd_in_flight; /* 0: nothing hangs */
        out[4] = st.ssd_checkpoints;
        uint8_t where[SYNC_N];
        for (uint32_t n = 0; n < SYNC_N; n++)
            where[n] = where_of(&f, n);
        if (write(pipefd[1], out, sizeof(out)) != sizeof(out) ||
            write(pipefd[1], where, sizeof(where)) != sizeof(where))
            _exit(4);
        pause(); /* killed here, with nothing closed */
        _exit(5);
    }
    close(pipefd[1]);
    uint64_t out[5];
    uint8_t where[SYNC_N];
    assert_int_equal(read(pipefd[0], out, sizeof(out)), sizeof(out));
    assert_int_equal(read(pipefd[0], where, sizeof(where)), sizeof(where));
    close(pipefd[0]);
    kill(pid, SIGKILL);
    int ws;
    assert_int_equal(waitpid(pid, &ws, 0), pid);
    uint32_t absent = 0, on_ssd = 0;
    for (uint32_t n = 0; n < SYNC_N; n++) {
        absent += where[n] == 0;
        on_ssd += where[n] == 2;
    }
    print_message("failed sync: %llu bytes held before, %llu spill failures, %llu "
                  "spills, %u absent, %u on the tier, %llu held or in flight after, "
                  "%llu checkpoints\n",
                  (unsigned long long)out[0], (unsigned long long)out[1],
                  (unsigned long long)out[2], absent, on_ssd, (unsigned long long)out[3],
                  (unsigned long long)out[4]);
    assert_true(out[0] > 0);
    assert_true(out[1] >= 1);         /* the failed segment's spills */
    assert_int_equal(absent, out[1]); /* dropped, and nothing else */
    assert_true(out[2] >= 1);         /* the other segments' spills */
    assert_int_equal(on_ssd, out[2]);
    assert_int_equal(out[3], 0);
    assert_int_equal(out[4], 0);
    memset(f.pool, 0, POOL_BYTES); /* a reboot: only the tier is left */
    char why[512];
    assert_int_equal(open_store(&f, false, 0, why, sizeof(why)), KVD_OK);
    print_message("restart: %llu objects back, %llu scanned, %llu named dead\n",
                  (unsigned long long)f.rec.objects,
                  (unsigned long long)f.rec.scanned_records,
                  (unsigned long long)f.rec.dead);
    assert_true(f.rec.dead >= out[1]); /* the failed round's records, met and dropped */
    assert_int_equal(stats(f.s).ssd_objects, on_ssd);
    for (uint32_t n = 0; n < SYNC_N; n++) {
        int rc = get(&f, n); /* byte-exact when KVD_OK */
        if (where[n] == 2)
            assert_int_equal(rc, KVD_OK);
        else
            assert_int_equal(rc, KVD_ERR_NOT_FOUND);
    }
    /* the tier goes on: spills are acknowledged again */
    for (uint32_t n = 100; n < 100 + SYNC_N; n++)
        put(&f, n);
    kvd_store_tier_drain(f.s, 2000);
    kvd_store_stats_t st = stats(f.s);
    assert_true(st.spills > 0);
    assert_int_equal(st.spill_failures, 0);
    check_ok(f.s);
    fx_fini(&f);
}

/* An eviction's tombstones made durable for its reply (an operator's
 * Evict, kvd_store_tier_sync_dead): with no sync round since the eviction
 * (held back), one fdatasync of the dead-list, and none when nothing is
 * new; once a round synced the dead-list, none either. Before, the reply
 * came with the tombstone perhaps only in the page cache. */
static void test_evict_syncs_its_tombstone(void **state)
{
    fx_t f;
    fx_init(&f, io_path_of_state(state));
    put_all(&f);
    assert_int_equal(where_of(&f, 0), 2);
    assert_int_equal(where_of(&f, 1), 2);
    uint64_t d0 = stats(f.s).ssd_dead_syncs;
    assert_int_equal(kvd_store_tier_sync_dead(f.s), KVD_OK);
    assert_int_equal(stats(f.s).ssd_dead_syncs, d0); /* every entry synced already */
    kvd_store_tier_hold_syncs(f.s, true);
    key_t32 key;
    mkkey(key, 0);
    assert_int_equal(kvd_store_evict_key(f.s, f.ns, key), KVD_OK);
    assert_int_equal(kvd_store_tier_sync_dead(f.s), KVD_OK);
    assert_int_equal(stats(f.s).ssd_dead_syncs, d0 + 1);
    assert_int_equal(kvd_store_tier_sync_dead(f.s), KVD_OK);
    assert_int_equal(stats(f.s).ssd_dead_syncs, d0 + 1); /* nothing new */
    kvd_store_tier_hold_syncs(f.s, false);
    mkkey(key, 1);
    assert_int_equal(kvd_store_evict_key(f.s, f.ns, key), KVD_OK);
    kvd_store_tier_drain(f.s, 2000); /* a round syncs the dead-list */
    assert_int_equal(kvd_store_tier_sync_dead(f.s), KVD_OK);
    assert_int_equal(stats(f.s).ssd_dead_syncs, d0 + 1);
    assert_int_equal(where_of(&f, 0), 0);
    assert_int_equal(where_of(&f, 1), 0);
    check_ok(f.s);
    fx_fini(&f);
}

#define EVICT_N (4 * N_OBJ) /* over twice what the tier holds */

/* Where object k is: 0 absent, 1 in DRAM, 2 on the tier. */
static uint8_t where_of(fx_t *f, uint32_t k)
{
    key_t32 key;
    kvd_obj_info_t info;
    mkkey(key, k);
    if (kvd_store_inspect(f->s, f->ns, key, &info) != KVD_OK)
        return 0;
    return info.tier == KVD_TIER_SSD ? 2 : 1;
}

/* Puts more objects than the tier holds, promoting every third of 20
 * puts ago on the way (a record of its key dies there, and a newer one
 * comes when it spills again): the tier evicts for room. where[k] says
 * where each is afterwards. */
static void overfill(fx_t *f, uint8_t *where)
{
    for (uint32_t n = 0; n < EVICT_N; n++) {
        put(f, n);
        kvd_store_tier_drain(f->s, 1000);
        if (n >= 20 && n % 3 == 0) {
            int rc = get(f, n - 20);
            assert_true(rc == KVD_OK || rc == KVD_ERR_NOT_FOUND);
        }
    }
    kvd_store_tier_drain(f->s, 2000);
    for (uint32_t k = 0; k < EVICT_N; k++)
        where[k] = where_of(f, k);
}

/* After a restart that lost the pool: what the tier evicted is absent,
 * what it held is there, byte-exact. */
static void check_evicted_stay_out(fx_t *f, const uint8_t *where)
{
    size_t evicted = 0, kept = 0;
    for (uint32_t k = 0; k < EVICT_N; k++) {
        int rc = get(f, k); /* byte-exact when KVD_OK */
        if (where[k] == 0) {
            if (rc != KVD_ERR_NOT_FOUND)
                fail_msg("object %u, evicted before the stop, is back (%s)", k,
                         kvd_status_str(rc));
            evicted++;
        } else if (where[k] == 2) {
            assert_int_equal(rc, KVD_OK);
            kept++;
        }
    }
    print_message("%zu evicted stayed out, %zu on the tier came back\n", evicted, kept);
    assert_true(evicted > 0 && kept > 0);
    check_ok(f->s);
}

/* Objects the tier evicted for room do not come back at a restart, after
 * a clean stop nor after SIGKILL (no checkpoint since: the restart scans
 * the segments, whose records are still there): the dead-list names them.
 * Before, every evicted record the scan met came back. */
static void test_tier_evictions_stay_out_after_a_restart(void **state)
{
    fx_t f;
    fx_init(&f, io_path_of_state(state));
    static uint8_t where[EVICT_N];
    overfill(&f, where);
    assert_true(stats(f.s).ssd_evictions > 0);
    kvd_store_destroy(f.s); /* a clean stop */
    memset(f.pool, 0, POOL_BYTES);
    char why[512];
    assert_int_equal(open_store(&f, false, 0, why, sizeof(why)), KVD_OK);
    check_evicted_stay_out(&f, where);
    kvd_store_destroy(f.s);
    f.s = NULL;

    int pipefd[2];
    assert_int_equal(pipe(pipefd), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        if (open_store(&f, true, 0, why, sizeof(why)) != KVD_OK)
            _exit(3);
        overfill(&f, where);
        uint8_t ok = stats(f.s).ssd_evictions > 0;
        if (write(pipefd[1], &ok, 1) != 1 || write(pipefd[1], where, EVICT_N) != EVICT_N)
            _exit(4);
        pause(); /* killed here, with nothing closed */
        _exit(5);
    }
    close(pipefd[1]);
    uint8_t ok = 0;
    assert_int_equal(read(pipefd[0], &ok, 1), 1);
    size_t got = 0;
    while (got < EVICT_N) {
        ssize_t n = read(pipefd[0], where + got, EVICT_N - got);
        assert_true(n > 0);
        got += (size_t)n;
    }
    close(pipefd[0]);
    kill(pid, SIGKILL);
    int ws;
    assert_int_equal(waitpid(pid, &ws, 0), pid);
    assert_true(ok);
    memset(f.pool, 0, POOL_BYTES);
    assert_int_equal(open_store(&f, false, 0, why, sizeof(why)), KVD_OK);
    assert_true(f.rec.dead > 0);
    check_evicted_stay_out(&f, where);
    fx_fini(&f);
}

/* The path of segment id of the fixture's tier. */
static void seg_path(const fx_t *f, uint32_t id, char *buf, size_t len)
{
    snprintf(buf, len, "%s/seg-%06u.kvs", f->dir, id);
}

/* A flipped byte in every segment's values: each promotion fails its
 * check and the object is absent afterwards; the counters say so. */
static void test_flipped_byte_is_absent_not_wrong(void **state)
{
    fx_t f;
    fx_init(&f, io_path_of_state(state));
    put_all(&f);
    uint64_t on_ssd = stats(f.s).ssd_objects;
    char path[128];
    for (uint32_t id = 0; id < TIER_BYTES / SEG_BYTES; id++) {
        seg_path(&f, id, path, sizeof(path));
        int fd = open(path, O_RDWR);
        assert_true(fd >= 0);
        /* every block of every record value but the header blocks */
        for (uint64_t off = 4096; off < SEG_BYTES; off += 4096) {
            uint8_t b;
            if (pread(fd, &b, 1, (off_t)off + 100) == 1 && (off / 4096) % 17 != 1) {
                b ^= 0x40;
                assert_int_equal(pwrite(fd, &b, 1, (off_t)off + 100), 1);
            }
        }
        close(fd);
    }
    size_t absent = 0;
    for (uint32_t n = 0; n < N_OBJ; n++) {
        int rc = get(&f, n); /* KVD_OK only with exact bytes (get asserts) */
        assert_true(rc == KVD_OK || rc == KVD_ERR_NOT_FOUND);
        absent += rc == KVD_ERR_NOT_FOUND;
    }
    kvd_store_stats_t st = stats(f.s);
    assert_true(absent > 0);
    assert_true(st.ssd_checksum_failures > 0);
    assert_true(st.promote_failures == absent);
    assert_true(absent <= on_ssd);
    check_ok(f.s);
    fx_fini(&f);
}

/* A device that answers EIO to every second read: those promotions fail
 * cleanly, the objects are dropped, the rest come back exact. */
static void test_eio_drops_the_object(void **state)
{
    fx_t f;
    fx_init(&f, io_path_of_state(state));
    kvd_store_destroy(f.s);
    char why[512];
    assert_int_equal(open_store(&f, true, 2, why, sizeof(why)), KVD_OK);
    put_all(&f);
    size_t absent = 0, ok = 0;
    for (uint32_t n = 0; n < N_OBJ; n++) {
        int rc = get(&f, n);
        assert_true(rc == KVD_OK || rc == KVD_ERR_NOT_FOUND);
        absent += rc == KVD_ERR_NOT_FOUND;
        ok += rc == KVD_OK;
    }
    kvd_store_stats_t st = stats(f.s);
    print_message("eio: %zu back, %zu absent, %llu I/O errors, %llu evictions\n", ok,
                  absent, (unsigned long long)st.ssd_io_errors,
                  (unsigned long long)st.evictions);
    /* each failed read dropped its object and nothing else */
    assert_true(absent > 0 && ok > 0);
    assert_int_equal(ok + absent, N_OBJ);
    assert_int_equal(st.ssd_io_errors, absent);
    assert_int_equal(st.promote_failures, absent);
    fx_fini(&f);
}

/* A segment cut short between a clean stop and a restart: what it lost is
 * absent, the rest is there, nothing is wrong. */
static void test_truncated_segment(void **state)
{
    fx_t f;
    fx_init(&f, io_path_of_state(state));
    put_all(&f);
    kvd_store_destroy(f.s);
    char path[128];
    seg_path(&f, 0, path, sizeof(path));
    assert_int_equal(truncate(path, 4096 + 4096 + 100), 0);
    memset(f.pool, 0, POOL_BYTES);
    char why[512];
    assert_int_equal(open_store(&f, false, 0, why, sizeof(why)), KVD_OK);
    for (uint32_t n = 0; n < N_OBJ; n++) {
        int rc = get(&f, n);
        assert_true(rc == KVD_OK || rc == KVD_ERR_NOT_FOUND);
    }
    check_ok(f.s);
    fx_fini(&f);
}

/* More objects than the tier holds: it evicts leaf-first and compacts, and
 * whatever is still there reads back exact. */
static void test_tier_full_evicts_and_compacts(void **state)
{
    fx_t f;
    fx_init(&f, io_path_of_state(state));
    for (int round = 0; round < 4; round++)
        for (uint32_t n = 0; n < N_OBJ; n++) {
            put(&f, 1000 * (uint32_t)round + n);
            kvd_store_tier_drain(f.s, 1000);
        }
    kvd_store_tier_drain(f.s, 2000);
    kvd_store_stats_t st = stats(f.s);
    print_message("full tier: %llu evictions, %llu compactions (%llu bytes copied)\n",
                  (unsigned long long)st.ssd_evictions,
                  (unsigned long long)st.ssd_compactions,
                  (unsigned long long)st.ssd_copied_bytes);
    assert_true(st.ssd_evictions > 0);
    assert_true(st.ssd_compactions > 0 && st.ssd_copied_bytes > 0);
    assert_true(st.ssd_used_bytes <= st.ssd_bytes);
    for (int round = 0; round < 4; round++)
        for (uint32_t n = 0; n < N_OBJ; n++) {
            int rc = get(&f, 1000 * (uint32_t)round + n);
            assert_true(rc == KVD_OK || rc == KVD_ERR_NOT_FOUND);
        }
    check_ok(f.s);
    fx_fini(&f);
}

/* A tier the file system cannot hold is refused, naming a size that fits. */
static void test_too_big_is_refused(void **state)
{
    fx_t f;
    fx_init(&f, io_path_of_state(state));
    kvd_store_destroy(f.s);
    kvd_store_config_t cfg;
    kvd_store_config_default(&cfg, POOL_BYTES);
    assert_int_equal(kvd_store_create(&cfg, &f.s), KVD_OK);
    kvd_tier_opts_t o = {.dir = f.dir,
                         .size_bytes = 8ull << 40,
                         .segment_bytes = 1ull << 30,
                         .pool_base = f.pool,
                         .pool_bytes = POOL_BYTES};
    kvd_tier_recovery_t rec;
    char why[512] = "";
    assert_int_equal(kvd_store_tier_attach(f.s, &o, &rec, why, sizeof(why)),
                     KVD_ERR_NO_SPACE);
    assert_non_null(strstr(why, "--ssd-size"));
    assert_non_null(strstr(why, "fits"));
    fx_fini(&f);
}

/* The whole pool's bytes lost (kvd_store_pool_lost) while objects are
 * being spilled: those in DRAM go at once, those being written to the
 * tier when their spill ends, and none is served afterwards from either
 * tier (its SSD copy was made of what was lost). */
static void test_lost_while_spilling(void **state)
{
    fx_t f;
    fx_init(&f, io_path_of_state(state));
    kvd_store_destroy(f.s);
    f.hold_syncs = true; /* spills stay in flight until released */
    char why[512];
    assert_int_equal(open_store(&f, true, 0, why, sizeof(why)), KVD_OK);
    for (uint32_t n = 0; n < 16; n++)
        put(&f, n);
    kvd_store_tier_drain(f.s, 2000);
    kvd_store_stats_t st = stats(f.s);
    assert_true(st.spilling_bytes > 0);
    uint64_t objects = st.objects_ready;
    assert_int_equal(kvd_store_pool_lost(f.s, 0, POOL_BYTES), objects);
    check_ok(f.s);
    for (uint32_t n = 0; n < 16; n++)
        assert_int_equal(get(&f, n), KVD_ERR_NOT_FOUND); /* spilling ones too */
    kvd_store_tier_hold_syncs(f.s, false);
    kvd_store_tier_drain(f.s, 2000);
    st = stats(f.s);
    assert_int_equal(st.pool_lost_objects, objects);
    assert_int_equal(st.pool_lost_ranges, 1);
    assert_int_equal(st.objects_ready, 0);
    assert_int_equal(st.spilling_bytes, 0);
    assert_int_equal(st.ssd_objects, 0);
    assert_int_equal(st.free_bytes, POOL_BYTES);
    for (uint32_t n = 0; n < 16; n++)
        assert_int_equal(where_of(&f, n), 0);
    check_ok(f.s);
    fx_fini(&f);
}

/* The same loss, and then SIGKILL while the spills are still held (their
 * records written, not synced): the records being written when the bytes
 * were lost are named dead at the loss, so a restart's scan meets them and
 * keeps them out, and no object comes back from either tier. */
static void test_lost_while_spilling_then_sigkill(void **state)
{
    fx_t f;
    int pipefd[2];
    pid_t pid = fork_held(&f, state, pipefd);
    if (pid == 0) {
        for (uint32_t n = 0; n < 16; n++)
            put(&f, n);
        kvd_store_tier_drain(f.s, 2000); /* the writes land; no sync */
        uint64_t out[2] = {stats(f.s).spilling_bytes, 0};
        out[1] = kvd_store_pool_lost(f.s, 0, POOL_BYTES);
        if (write(pipefd[1], out, sizeof(out)) != sizeof(out))
            _exit(4);
        pause(); /* killed here, with the spills held */
        _exit(5);
    }
    close(pipefd[1]);
    uint64_t out[2];
    assert_int_equal(read(pipefd[0], out, sizeof(out)), sizeof(out));
    close(pipefd[0]);
    kill(pid, SIGKILL);
    int ws;
    assert_int_equal(waitpid(pid, &ws, 0), pid);
    assert_true(out[0] > 0);
    assert_true(out[1] > 0);
    memset(f.pool, 0, POOL_BYTES); /* a reboot: only the tier is left */
    char why[512];
    assert_int_equal(open_store(&f, false, 0, why, sizeof(why)), KVD_OK);
    print_message("restart after a loss while spilling: %llu bytes were held, %llu "
                  "objects lost; %llu records scanned, %llu named dead, %llu back\n",
                  (unsigned long long)out[0], (unsigned long long)out[1],
                  (unsigned long long)f.rec.scanned_records,
                  (unsigned long long)f.rec.dead, (unsigned long long)f.rec.objects);
    assert_true(f.rec.dead > 0);
    assert_int_equal(f.rec.objects, 0);
    assert_int_equal(stats(f.s).ssd_objects, 0);
    for (uint32_t n = 0; n < 16; n++)
        assert_int_equal(get(&f, n), KVD_ERR_NOT_FOUND);
    check_ok(f.s);
    fx_fini(&f);
}

/* The pool's bytes lost while an object is promoted into it: the
 * promotion fails, the tier's copy stays, and the next Acquire brings it
 * back byte-exact. */
static void test_lost_while_promoting(void **state)
{
    fx_t f;
    fx_init(&f, io_path_of_state(state));
    put_all(&f);
    uint32_t n = 0;
    while (n < N_OBJ && where_of(&f, n) != 2)
        n++;
    assert_true(n < N_OBJ);
    key_t32 key;
    mkkey(key, n);
    uint64_t lease;
    kvd_loc_t loc;
    size_t bad;
    assert_int_equal(kvd_store_acquire(f.s, 1, f.ns, (const uint8_t(*)[KVD_KEY_BYTES])key,
                                       1, 0, &lease, &loc, &bad),
                     KVD_INPROGRESS);
    kvd_store_stats_t st = stats(f.s);
    assert_true(st.promoting_bytes > 0);
    uint64_t before = st.promotions;
    assert_true(kvd_store_pool_lost(f.s, 0, POOL_BYTES) >= 1);
    check_ok(f.s);
    kvd_store_tier_drain(f.s, 2000);
    st = stats(f.s);
    assert_int_equal(st.promotions, before); /* that promotion did not count */
    assert_int_equal(st.promoting_bytes, 0);
    assert_int_equal(where_of(&f, n), 2);
    assert_int_equal(get(&f, n), KVD_OK); /* promoted again, byte-exact */
    check_ok(f.s);
    fx_fini(&f);
}

#define BOTH(t)                                        \
    cmocka_unit_test_prestate(t, (void *)(intptr_t)2), \
        cmocka_unit_test_prestate(t, (void *)(intptr_t)1)

int main(void)
{
    const struct CMUnitTest tests[] = {
        BOTH(test_twice_dram_round_trips),
        BOTH(test_spill_waits_for_its_sync),
        BOTH(test_promotion_keeps_the_tenant_quota),
        BOTH(test_lookup_says_the_tier),
        BOTH(test_restart_keeps_the_tier),
        BOTH(test_sigkill_keeps_acknowledged_spills),
        BOTH(test_summaries_spare_the_scan),
        BOTH(test_eviction_survives_sigkill),
        BOTH(test_flipped_byte_is_absent_not_wrong),
        BOTH(test_eio_drops_the_object),
        BOTH(test_truncated_segment),
        BOTH(test_tier_full_evicts_and_compacts),
        BOTH(test_restart_keeps_the_copy_not_its_source),
        BOTH(test_failed_copy_keeps_its_source),
        BOTH(test_tier_evictions_stay_out_after_a_restart),
        BOTH(test_spill_past_a_hole_stays_in_dram),
        BOTH(test_failed_sync_acknowledges_nothing),
        BOTH(test_evict_syncs_its_tombstone),
        BOTH(test_lost_while_spilling),
        BOTH(test_lost_while_spilling_then_sigkill),
        BOTH(test_lost_while_promoting),
        cmocka_unit_test_prestate(test_too_big_is_refused, (void *)(intptr_t)2),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
