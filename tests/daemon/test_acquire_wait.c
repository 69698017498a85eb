/*
 * Description: an Acquire with wait_ms is held while its objects come back
 * from the SSD tier. A daemon with a 4 MiB pool and an SSD tier (in a
 * directory of its own under /tmp, removed at the end) is given twice its
 * pool in 64 KiB objects, so that the earliest spill to the tier and leave
 * DRAM (Stats ssd_objects and Inspect's tier say which, polled at most
 * 10 s). Then, each case on objects of its own that Inspect shows on the
 * tier:
 * (a) an Acquire without wait (wait_ms 0) answers in progress first, the
 *     old behaviour; asked again (at most 10 s) it answers OK, and the bytes
 *     are the ones written;
 * (b) an Acquire with wait_ms 1000 answers OK with a lease on its first
 *     answer (or, on a machine so busy that the promotion took longer, in
 *     progress only after the whole wait), and the bytes at its offset in
 *     the mapped pool are exactly the ones written (a daemon without the
 *     feature answers in progress at once);
 * (c) a second connection sends an Acquire of 16 objects with wait_ms
 *     1000 and closes at once without reading (their promotion usually
 *     takes longer, so the Acquire is held then): the daemon still answers
 *     Health, Stats count the 16 promotions done (the request reached it;
 *     some may spill again under the watermark, so Inspect's tier is not
 *     asked) and no lease or pin is left (polled at most 10 s each), whether
 *     the close came before the promotions ended or after;
 * (d) one Acquire with wait_ms 1000 of several objects, all on the tier,
 *     answers OK on its first answer (as (b)), every object byte-exact.
 * Every lease is released; at the end nothing is pinned, Stats count no
 * Acquire held now and at least the three of (b), (c), (d), no promotion
 * failed, the invariant check passes and the daemon exits 0 on SIGTERM
 * with a clean log. Times are printed, never asserted.
 */
#include "test_store_util.h"

#include <ftw.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PAGE_SIZE    16 /* tokens per page */
#define CHAIN_PAGES  8
#define CHAINS       16 /* 128 objects of 64 KiB: twice the 4 MiB pool */
#define N_KEYS       (CHAINS * CHAIN_PAGES)
#define SALT         0xacc0u
#define WAIT_MS      1000u
#define D_KEYS       6
#define C_KEYS       16
#define SPILLED_NEED (2 + C_KEYS + D_KEYS) /* (a), (b), (c)'s, (d)'s */
#define POLL_MS      10000

static kvd_key_t keys[N_KEYS];

/* Removes one entry of the tier's directory (nftw, deepest first). */
static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path);
}

static double ms_since(uint64_t t0_ns)
{
    return (double)(kvd_now_ns() - t0_ns) / 1e6;
}

static bool no_spill_in_flight(const ts_stats_t *s)
{
    return s->store.spilling_bytes == 0;
}

static bool enough_on_ssd(const ts_stats_t *s)
{
    return s->store.ssd_objects >= SPILLED_NEED && s->store.spilling_bytes == 0;
}

/* The promotions counter (c) waits for: one per object of its Acquire;
 * and the spills they may set off (the watermark) to end before (d). */
static uint64_t promotions_want;

static bool promotions_done(const ts_stats_t *s)
{
    return s->store.promotions >= promotions_want && s->store.promoting_bytes == 0 &&
           s->store.spilling_bytes == 0;
}

static bool nothing_held(const ts_stats_t *s)
{
    return s->store.leases == 0 && s->store.pins == 0 && s->store.objects_pinned == 0;
}

/* Inspect's tier of key (0 DRAM, 1 SSD), or -1 when Inspect did not find it. */
static int tier_of(ts_client_t *t, const kvd_key_t key)
{
    kvd_obj_msg_t o;
    size_t n = 0;
    ts_err_t e;
    int st = ts_inspect(t->c, TS_KV_NS, key, &o, 1, &n, &e);
    if (st != KVD_OK || n != 1)
        return -1;
    return o.state == 2 ? (int)o.tier : -1;
}

/* Checks that each of keys[0..n) is on the tier before a case uses it. */
static bool all_on_ssd(ts_client_t *t, const kvd_key_t *k, size_t n, const char *what)
{
    bool ok = true;
    for (size_t i = 0; i < n; i++)
        ok &= DT_CHECK(tier_of(t, k[i]) == 1, "%s: object %zu should be on the SSD tier",
                       what, i);
    return ok;
}

/* Checks the bytes of each acquired object against the pattern written. */
static void verify_objects(ts_client_t *t, const kvd_key_t *k, const uint64_t *off,
                           size_t n, const char *what)
{
    for (size_t i = 0; i < n; i++) {
        if (!DT_CHECK(ts_in_pool(off[i], TS_KV_BYTES, t->pool_bytes),
                      "%s: object %zu at offset %llu is outside the pool", what, i,
                      (unsigned long long)off[i]))
            continue;
        size_t bad = ts_verify(t->pool + off[i], TS_KV_BYTES, k[i], SALT);
        DT_CHECK(bad == SIZE_MAX,
                 "%s: object %zu differs from what was written at byte %zu", what, i,
                 bad);
    }
}

/* Publishes the chains, each after the spills of the one before ended. */
static bool put_all(const kvd_test_daemon_t *d, const kvd_ns_spec_t *spec)
{
    for (int c = 0; c < CHAINS; c++) {
        kvd_key_t *chain = &keys[c * CHAIN_PAGES];
        uint32_t first_token = 1000u + (uint32_t)c * 100000u;
        if (ts_make_keys(first_token, CHAIN_PAGES, PAGE_SIZE, chain) != 0)
            return false;
        if (ts_put_chain(d->socket, spec, chain, CHAIN_PAGES, SALT, "offload") != 0)
            return false;
        ts_stats_t s;
        if (!DT_CHECK(ts_wait_stats(d->socket, POLL_MS, no_spill_in_flight, &s),
                      "chain %d: %llu bytes still spilling after %d ms", c,
                      (unsigned long long)s.store.spilling_bytes, POLL_MS))
            return false;
    }
    return true;
}

/* (a): wait_ms 0 answers in progress first; asked again it comes. */
static void case_no_wait(ts_client_t *t, const kvd_key_t *key)
{
    uint64_t lease = 0, off = 0, t0 = kvd_now_ns();
    ts_err_t e;
    int first = ts_acquire_wait(t->c, t->ns[0], TS_KV_BYTES, key, 1, 0, &lease, &off, &e);
    DT_CHECK(first == KVD_INPROGRESS, "(a) first answer without wait: %s (%s), want %s",
             kvd_status_str(first), e.text, kvd_status_str(KVD_INPROGRESS));
    int st = first, asks = 1;
    while (st == KVD_INPROGRESS && kvd_now_ns() - t0 < POLL_MS * 1000000ull) {
        kvd_sleep_ns(2000000);
        st = ts_acquire_wait(t->c, t->ns[0], TS_KV_BYTES, key, 1, 0, &lease, &off, &e);
        asks++;
    }
    if (!DT_CHECK(st == KVD_OK && lease != 0, "(a) after %d asks: %s (%s)", asks,
                  kvd_status_str(st), e.text))
        return;
    verify_objects(t, key, &off, 1, "(a)");
    st = ts_release(t->c, lease, &e);
    DT_CHECK(st == KVD_OK, "(a) release: %s (%s)", kvd_status_str(st), e.text);
    printf(
        "(a) Acquire without wait: %s on the first answer, OK on ask %d after %.1f ms\n",
        kvd_status_str(first), asks, ms_since(t0));
}

/*
 * An Acquire with wait_ms WAIT_MS of keys[0..n): its first answer must be
 * OK, or in progress only after the whole wait (a machine so busy that the
 * promotion took longer: held all the same), and then asked again (at
 * most POLL_MS) OK. The status; the first answer's time into *took.
 */
static int held_acquire(ts_client_t *t, const kvd_key_t *k, size_t n, uint64_t *lease,
                        uint64_t *off, double *took, const char *what)
{
    uint64_t t0 = kvd_now_ns();
    ts_err_t e;
    int st = ts_acquire_wait(t->c, t->ns[0], TS_KV_BYTES, k, n, WAIT_MS, lease, off, &e);
    *took = ms_since(t0);
    if (!DT_CHECK(st == KVD_OK || (st == KVD_INPROGRESS && *took >= WAIT_MS),
                  "%s held Acquire: first answer %s (%s) after %.1f ms, want OK (or in "
                  "progress after the whole wait of %u ms)",
                  what, kvd_status_str(st), e.text, *took, WAIT_MS))
        return st == KVD_OK ? KVD_ERR_PROTOCOL : st;
    while (st == KVD_INPROGRESS && kvd_now_ns() - t0 < POLL_MS * 1000000ull)
        st = ts_acquire_wait(t->c, t->ns[0], TS_KV_BYTES, k, n, WAIT_MS, lease, off, &e);
    DT_CHECK(st == KVD_OK && *lease != 0, "%s held Acquire: %s (%s)", what,
             kvd_status_str(st), e.text);
    return st;
}

/* (b): wait_ms 1000 answers OK on its first answer. */
static void case_held(ts_client_t *t, const kvd_key_t *key)
{
    uint64_t lease = 0, off = 0;
    ts_err_t e;
    double took = 0;
    int st = held_acquire(t, key, 1, &lease, &off, &took, "(b)");
    if (st != KVD_OK)
        return;
    verify_objects(t, key, &off, 1, "(b)");
    st = ts_release(t->c, lease, &e);
    DT_CHECK(st == KVD_OK, "(b) release: %s (%s)", kvd_status_str(st), e.text);
    printf("(b) held Acquire: OK on the first answer after %.1f ms, bytes exact\n", took);
}

/*
 * (c): a held Acquire whose connection closes leaves nothing behind. The
 * request is written whole onto a second connection's socket (no deadline
 * that could keep it from going out), and the connection is closed at
 * once without reading: promoting C_KEYS objects takes longer than that,
 * so the close usually comes while it is held.
 */
static void case_close(const kvd_test_daemon_t *d, ts_client_t *t,
                       const kvd_ns_spec_t *spec, const kvd_key_t *k)
{
    ts_client_t t2;
    if (ts_open(&t2, d->socket, spec, 1, false) != 0)
        return;
    ts_stats_t s;
    if (!DT_CHECK(ts_stats_fresh(d->socket, false, &s) == KVD_OK, "(c) stats before")) {
        ts_close(&t2);
        return;
    }
    promotions_want = s.store.promotions + C_KEYS;
    kvd_msg_t req;
    kvd_msg_request(&req, 1000, KVD_METHOD_ACQUIRE);
    req.body.acquire_req = (kvd_acquire_req_t){.ns = t2.ns[0],
                                               .object_bytes = TS_KV_BYTES,
                                               .n = C_KEYS,
                                               .keys = (kvd_key_t *)k,
                                               .wait_ms = WAIT_MS};
    kvd_buf_t frame;
    int fd = kvd_client_fd(t2.c);
    int rc = dt_pack(&req, &frame);
    if (rc == KVD_OK)
        rc = dt_send_all(fd, frame.data, frame.len);
    kvd_buf_free(&frame);
    struct pollfd p = {.fd = fd, .events = POLLIN};
    bool answered = rc == 0 && poll(&p, 1, 0) == 1;
    ts_close(&t2);
    if (!DT_CHECK(rc == 0, "(c) cannot send the Acquire (%d)", rc))
        return;

    DT_CHECK(ts_health_ok(t->c) == KVD_OK,
             "(c) the daemon should answer Health after the close");
    bool promoted = ts_wait_stats(d->socket, POLL_MS, promotions_done, &s);
    DT_CHECK(promoted,
             "(c) %llu promotions after %d ms, want %llu: the Acquire should "
             "have begun one per object",
             (unsigned long long)s.store.promotions, POLL_MS,
             (unsigned long long)promotions_want);
    bool clean = ts_wait_stats(d->socket, POLL_MS, nothing_held, &s);
    DT_CHECK(clean, "(c) after the close: leases %llu, pins %llu, pinned %llu; want 0",
             (unsigned long long)s.store.leases, (unsigned long long)s.store.pins,
             (unsigned long long)s.store.objects_pinned);
    for (size_t i = 0; i < C_KEYS; i++) {
        kvd_obj_msg_t o;
        size_t n = 0;
        ts_err_t e;
        if (ts_inspect(t->c, TS_KV_NS, k[i], &o, 1, &n, &e) == KVD_OK && n == 1)
            DT_CHECK(o.pins == 0, "(c) object %zu has %u pins, want 0", i, o.pins);
    }
    printf("(c) held Acquire of %d objects, connection closed right after sending (%s): "
           "then Health ok, %d promotions done, leases %llu, pins %llu\n",
           C_KEYS, answered ? "its answer had come" : "no answer yet", C_KEYS,
           (unsigned long long)s.store.leases, (unsigned long long)s.store.pins);
}

/* (d): several objects from the tier in one held Acquire. */
static void case_batch(ts_client_t *t, const kvd_key_t *k)
{
    uint64_t lease = 0, off[D_KEYS];
    ts_err_t e;
    double took = 0;
    int st = held_acquire(t, k, D_KEYS, &lease, off, &took, "(d)");
    if (st != KVD_OK)
        return;
    verify_objects(t, k, off, D_KEYS, "(d)");
    st = ts_release(t->c, lease, &e);
    DT_CHECK(st == KVD_OK, "(d) release: %s (%s)", kvd_status_str(st), e.text);
    printf("(d) held Acquire of %d objects from the tier: OK on the first answer after "
           "%.1f ms, every object exact\n",
           D_KEYS, took);
}

static void run(const kvd_test_daemon_t *d)
{
    kvd_ns_spec_t spec = ts_spec(TS_KV_NS, TS_KV_BYTES);
    if (!put_all(d, &spec))
        return;
    ts_stats_t s;
    bool spilled = ts_wait_stats(d->socket, POLL_MS, enough_on_ssd, &s);
    if (!DT_CHECK(spilled, "%llu objects on the SSD tier after %d ms, want %d",
                  (unsigned long long)s.store.ssd_objects, POLL_MS, SPILLED_NEED))
        return;

    ts_client_t t;
    if (ts_open(&t, d->socket, &spec, 1, true) != 0)
        return;
    kvd_key_t on_ssd[SPILLED_NEED];
    size_t n_ssd = 0;
    for (size_t i = 0; i < N_KEYS && n_ssd < SPILLED_NEED; i++)
        if (tier_of(&t, keys[i]) == 1)
            memcpy(on_ssd[n_ssd++], keys[i], KVD_KEY_BYTES);
    printf("%llu objects on the SSD tier, %llu spills\n",
           (unsigned long long)s.store.ssd_objects, (unsigned long long)s.store.spills);
    if (!DT_CHECK(n_ssd == SPILLED_NEED, "Inspect shows %zu objects on the tier, want %d",
                  n_ssd, SPILLED_NEED)) {
        ts_close(&t);
        return;
    }

    if (all_on_ssd(&t, &on_ssd[0], 1, "(a)"))
        case_no_wait(&t, &on_ssd[0]);
    if (all_on_ssd(&t, &on_ssd[1], 1, "(b)"))
        case_held(&t, &on_ssd[1]);
    if (all_on_ssd(&t, &on_ssd[2], C_KEYS, "(c)"))
        case_close(d, &t, &spec, &on_ssd[2]);
    if (all_on_ssd(&t, &on_ssd[2 + C_KEYS], D_KEYS, "(d)"))
        case_batch(&t, &on_ssd[2 + C_KEYS]);

    DT_CHECK(ts_health_ok(t.c) == KVD_OK, "the connection should still answer");
    ts_close(&t);
    bool clean = ts_wait_stats(d->socket, POLL_MS, nothing_held, &s);
    DT_CHECK(clean, "at the end: leases %llu, pins %llu; want 0",
             (unsigned long long)s.store.leases, (unsigned long long)s.store.pins);
    DT_CHECK(s.store.promotions >= SPILLED_NEED && s.store.promote_failures == 0 &&
                 s.store.ssd_checksum_failures == 0,
             "at the end: %llu promotions, %llu failed, %llu checksum failures",
             (unsigned long long)s.store.promotions,
             (unsigned long long)s.store.promote_failures,
             (unsigned long long)s.store.ssd_checksum_failures);
    ts_check_accounting(&s, "at the end");
    ts_cli_check(d->socket, "at the end");
    /* the daemon's own count: (b), (c) and (d) were held, none is now */
    kvd_stats_rep_t *rs = calloc(1, sizeof(*rs));
    if (rs != NULL &&
        DT_CHECK(dt_stats_fresh(d->socket, rs) == KVD_OK, "stats at the end"))
        DT_CHECK(rs->acquires_held == 0 && rs->acquires_held_total >= 3,
                 "at the end: %llu Acquires held, %llu since the start; want 0 and at "
                 "least 3",
                 (unsigned long long)rs->acquires_held,
                 (unsigned long long)rs->acquires_held_total);
    free(rs);
}

int main(void)
{
    char dir[] = "/tmp/kvd-acqwait-XXXXXX";
    if (mkdtemp(dir) == NULL) {
        dt_fail(__FILE__, __LINE__, "mkdtemp %s failed", dir);
        return dt_exit_status("daemon/acquire_wait");
    }
    char tier[sizeof(dir) + 8];
    snprintf(tier, sizeof(tier), "%s/tier", dir);
    const char *const args[] = {"--pool-size",
                                "4M",
                                "--ssd-path",
                                tier,
                                "--ssd-size",
                                "24M",
                                "--ssd-segment-size",
                                "2M",
                                "--evict-high",
                                "0.8",
                                "--evict-low",
                                "0.6",
                                NULL};
    kvd_test_daemon_t d = {0};
    if (dt_start(&d, args) == 0)
        run(&d);
    dt_stop(&d, SIGTERM, 10000); /* checks the log for sanitizer reports */
    nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    return dt_exit_status("daemon/acquire_wait");
}
