/*
 * Description: requests above the daemon's batch limit. One daemon runs
 * with --max-batch 64, another with its default (4,096); against each, a
 * linker stores and looks up chains of 1,000 pages in two pools, a full
 * attention one (ALL_PAGES) and a sliding-window one (TRAILING_PAGES(3)),
 * with pages missing here and there, some next to where 64-page pieces
 * meet. Against both daemons:
 *  - every offload of a 1,000-page transfer succeeds;
 *  - every lookup gives the boundaries that the hit rule of DESIGN.md
 *    section 5 gives for the pages stored (computed here from what was
 *    stored), the same against both daemons;
 *  - a load of 1,000 pages succeeds and its bytes are the stored ones;
 *  - once the linker is closed no pin and no reservation stays.
 * A third daemon runs with --max-frame 48K, under two pools' 1,000 keys
 * (64,000 bytes) in one Lookup: the same results (a Lookup that counted
 * one pool's keys against the frame was sent whole, and the daemon closed
 * the connection). The linker learns the limits at Hello and splits what
 * it sends; nothing valid is refused for its size.
 */
#include "dtest.h"
#include "harness.h"
#include "kvd_common.h"
#include "kvdock.h"
#include "ltest.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define PS       4
#define BPR      16
#define PAGES    1000
#define KV_ROWS  (2 * PAGES * PS) /* stored from [0, PAGES*PS), loaded after */
#define SWA_ROWS (PAGES * PS)
#define SWA_TAIL 3

typedef uint8_t key_t_[KVD_PAGE_KEY_BYTES];

static uint8_t kv_k[KV_ROWS * BPR], kv_v[KV_ROWS * BPR];
static uint8_t swa_k[SWA_ROWS * BPR], swa_v[SWA_ROWS * BPR];
static key_t_ chain_x[PAGES], chain_y[PAGES];
static int64_t rows_lo[PAGES * PS], rows_hi[PAGES * PS];

/* What each chain has stored in each pool (1 = stored). */
typedef struct stored {
    uint8_t kv[PAGES], swa[PAGES];
} stored_t;

/* Pages missing: chain x in the sliding-window pool at 63 (the last page
 * of a 64-page piece), 190 and 191, 500 and 998; chain y in the full
 * attention pool at 700 (its boundaries end there). */
static void plan(stored_t *x, stored_t *y)
{
    memset(x, 1, sizeof(*x));
    memset(y, 1, sizeof(*y));
    x->swa[63] = x->swa[190] = x->swa[191] = x->swa[500] = x->swa[998] = 0;
    y->kv[700] = 0;
}

static void chain(uint32_t base, key_t_ *keys)
{
    uint32_t *tokens = malloc(PAGES * PS * sizeof(uint32_t));
    for (size_t i = 0; tokens && i < PAGES * PS; i++)
        tokens[i] = base + (uint32_t)i;
    size_t n = 0;
    if (tokens)
        kvd_page_keys(tokens, PAGES * PS, PS, NULL, keys, &n);
    free(tokens);
}

/* Stores keys[i] where have[i], in one offload: a transfer per run of
 * stored pages (each with its depth and the key before it). */
static bool store(kvd_linker_t *l, uint32_t pool, const key_t_ *keys, const uint8_t *have)
{
    kvd_transfer_t t[16];
    size_t n = 0;
    for (size_t i = 0; i < PAGES;) {
        if (!have[i]) {
            i++;
            continue;
        }
        size_t e = i;
        while (e < PAGES && have[e])
            e++;
        if (n == 16)
            return false;
        t[n++] = (kvd_transfer_t){.pool_id = pool,
                                  .keys = keys + i,
                                  .n_keys = e - i,
                                  .device_indices = rows_lo + i * PS,
                                  .n_indices = (e - i) * PS,
                                  .first_depth = (uint32_t)i,
                                  .prior_key = i > 0 ? keys[i - 1] : NULL};
        i = e;
    }
    uint64_t ack = 0;
    int rc = kvd_offload(l, t, n, &ack);
    return rc == 0 && lt_wait_done(l, false, ack, 30000);
}

/* The boundaries by the hit rule, from what is stored: b is restorable in
 * a pool when the run of stored pages ending at page b-1 is b long
 * (ALL_PAGES) or min(trailing, b) long; in every pool of the lookup. */
static size_t expected(const stored_t *s, bool with_swa, uint32_t *out)
{
    size_t m = 0;
    uint32_t run_kv = 0, run_swa = 0;
    for (uint32_t b = 1; b <= PAGES; b++) {
        run_kv = s->kv[b - 1] ? run_kv + 1 : 0;
        run_swa = s->swa[b - 1] ? run_swa + 1 : 0;
        bool ok = run_kv >= b;
        if (with_swa)
            ok = ok && run_swa >= (b < SWA_TAIL ? b : SWA_TAIL);
        if (ok)
            out[m++] = b;
    }
    return m;
}

static bool same(const uint32_t *a, size_t na, const uint32_t *b, size_t nb)
{
    return na == nb && memcmp(a, b, na * sizeof(uint32_t)) == 0;
}

/* One lookup result. */
typedef struct found {
    int rc;
    size_t n;
    uint32_t b[PAGES];
} found_t;

static void lookup(kvd_linker_t *l, uint32_t kv, uint32_t swa, const key_t_ *keys,
                   bool with_swa, found_t *f)
{
    kvd_transfer_t t[2] = {{.pool_id = kv, .keys = keys, .n_keys = PAGES},
                           {.pool_id = swa, .keys = keys, .n_keys = PAGES}};
    f->n = 0;
    f->rc = kvd_lookup(l, 1, t, with_swa ? 2 : 1, f->b, &f->n);
}

/* The lookups of one daemon: chain x with both pools, chain x in the
 * full-attention pool alone, chain y with both pools. */
typedef struct results {
    found_t f[3];
} results_t;

static void run(const char *socket, const char *label, results_t *res)
{
    kvd_linker_config_t cfg = {
        .socket_path = socket, .model_id = "batch", .timeout_ms = 10000};
    kvd_linker_t *l = NULL;
    int rc = kvd_linker_open(&cfg, &l);
    if (!DT_CHECK(rc == 0, "%s: open: %s", label, kvd_strerror(rc)))
        return;
    uint32_t kv = 0, swa = 0;
    rc = lt_register_kv(l, "kv", kv_k, kv_v, BPR, PS, KV_ROWS, NULL, &kv);
    kvd_pool_layer_t layer = {
        .layer_id = 1, .n_buffers = 2, .buffers = {{swa_k, BPR, BPR}, {swa_v, BPR, BPR}}};
    kvd_pool_desc_t d = {.name = "swa",
                         .addressing = KVD_ADDR_PAGED,
                         .page_size = PS,
                         .n_rows = SWA_ROWS,
                         .trailing_pages = SWA_TAIL,
                         .memory = KVD_MEM_HOST,
                         .n_layers = 1,
                         .layers = &layer};
    if (rc == 0)
        rc = kvd_register_pool(l, &d, &swa);
    DT_CHECK(rc == 0, "%s: register: %s", label, kvd_strerror(rc));
    stored_t sx, sy;
    plan(&sx, &sy);
    DT_CHECK(store(l, kv, chain_x, sx.kv), "%s: offload of chain x (kv)", label);
    DT_CHECK(store(l, swa, chain_x, sx.swa), "%s: offload of chain x (swa)", label);
    DT_CHECK(store(l, kv, chain_y, sy.kv), "%s: offload of chain y (kv)", label);
    DT_CHECK(store(l, swa, chain_y, sy.swa), "%s: offload of chain y (swa)", label);

    static uint32_t want[PAGES];
    lookup(l, kv, swa, chain_x, true, &res->f[0]);
    size_t nw = expected(&sx, true, want);
    DT_CHECK(res->f[0].rc == 0 && same(res->f[0].b, res->f[0].n, want, nw),
             "%s: chain x, both pools: %s, %zu boundaries (%zu expected)", label,
             kvd_strerror(res->f[0].rc), res->f[0].n, nw);
    lookup(l, kv, swa, chain_x, false, &res->f[1]);
    nw = expected(&sx, false, want);
    DT_CHECK(res->f[1].rc == 0 && same(res->f[1].b, res->f[1].n, want, nw),
             "%s: chain x, full attention: %s, %zu boundaries (%zu expected)", label,
             kvd_strerror(res->f[1].rc), res->f[1].n, nw);
    lookup(l, kv, swa, chain_y, true, &res->f[2]);
    nw = expected(&sy, true, want);
    DT_CHECK(res->f[2].rc == 0 && same(res->f[2].b, res->f[2].n, want, nw),
             "%s: chain y, both pools: %s, %zu boundaries (%zu expected)", label,
             kvd_strerror(res->f[2].rc), res->f[2].n, nw);

    /* all 1,000 pages of chain x loaded into the rows after the stored ones */
    memset(kv_k + PAGES * PS * BPR, 0, PAGES * PS * BPR);
    memset(kv_v + PAGES * PS * BPR, 0, PAGES * PS * BPR);
    kvd_transfer_t t = {.pool_id = kv,
                        .keys = chain_x,
                        .n_keys = PAGES,
                        .device_indices = rows_hi,
                        .n_indices = PAGES * PS};
    rc = lt_load_all(l, 7, &t, PAGES);
    DT_CHECK(rc == 0, "%s: load of 1,000 pages: %s", label, kvd_strerror(rc));
    DT_CHECK(rc == 0 && lt_wait_done(l, true, 7, 30000), "%s: the load comes back failed",
             label);
    DT_CHECK(memcmp(kv_k, kv_k + PAGES * PS * BPR, PAGES * PS * BPR) == 0 &&
                 memcmp(kv_v, kv_v + PAGES * PS * BPR, PAGES * PS * BPR) == 0,
             "%s: the loaded bytes are not the stored ones", label);
    kvd_linker_close(l);
    kvd_stats_rep_t s = {0};
    for (int i = 0; i < 500; i++) {
        if (dt_stats_fresh(socket, &s) == KVD_OK && s.store.pins == 0 &&
            s.store.objects_writing == 0)
            break;
        struct timespec ts = {0, 10000000};
        nanosleep(&ts, NULL);
    }
    DT_CHECK(s.store.pins == 0 && s.store.objects_writing == 0,
             "%s: pins (%llu) or reservations (%llu) stay", label,
             (unsigned long long)s.store.pins,
             (unsigned long long)s.store.objects_writing);
}

int main(void)
{
    for (size_t i = 0; i < sizeof(kv_k) / 2; i++) {
        kv_k[i] = (uint8_t)(i * 13 + 1);
        kv_v[i] = (uint8_t)(i * 7 + 3);
    }
    for (size_t i = 0; i < sizeof(swa_k); i++) {
        swa_k[i] = (uint8_t)(i * 5 + 1);
        swa_v[i] = (uint8_t)(i * 11 + 2);
    }
    for (int i = 0; i < PAGES * PS; i++) {
        rows_lo[i] = i;
        rows_hi[i] = PAGES * PS + i;
    }
    chain(1, chain_x);
    chain(1000000, chain_y);
    static results_t small, large, framed;
    kvd_test_daemon_t a = {0}, b = {0}, c = {0};
    const char *small_args[] = {"--max-batch", "64", NULL};
    if (dt_start(&a, small_args) == 0) {
        run(a.socket, "--max-batch 64", &small);
        dt_stop(&a, SIGTERM, 10000);
    }
    if (dt_start(&b, NULL) == 0) {
        run(b.socket, "--max-batch 4096", &large);
        dt_stop(&b, SIGTERM, 10000);
    }
    const char *frame_args[] = {"--max-frame", "48K", NULL};
    if (dt_start(&c, frame_args) == 0) {
        run(c.socket, "--max-frame 48K", &framed);
        dt_stop(&c, SIGTERM, 10000);
    }
    for (int i = 0; i < 3; i++) {
        DT_CHECK(small.f[i].rc == large.f[i].rc &&
                     same(small.f[i].b, small.f[i].n, large.f[i].b, large.f[i].n),
                 "lookup %d differs between the daemons", i);
        DT_CHECK(framed.f[i].rc == large.f[i].rc &&
                     same(framed.f[i].b, framed.f[i].n, large.f[i].b, large.f[i].n),
                 "lookup %d differs under --max-frame 48K", i);
    }
    return dt_exit_status("linker/batch");
}
