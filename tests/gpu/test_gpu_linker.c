/*
 * Description: the linker with device pools, against a live kvdockd: one
 * source for the fake runtimes of fake/ (here, CI) and a real GPU (the
 * device check). Pools of the runtime $KVDOCK_TEST_GPU names: a paged KV
 * pool (two layers, K and V) and a slot-addressed state pool, in device
 * memory. argv[1] picks the case:
 *   roundtrip  offload from the device, wipe it, load layer-wise back into
 *              other rows: byte-exact on the device; the store's pool is
 *              pinned (the stats say so) and every byte went by DMA; on the
 *              fake, no copy touched pageable host memory. Over UCX
 *              (KVDOCK_TRANSPORT=ucx) the pool is not mapped here: every
 *              byte passes the pinned staging slots (counted as bounced),
 *              still never pageable
 *   bounce     the same with host registration refused (the fake's knob):
 *              byte-exact, nothing pinned, every byte through the ring
 *   stream     kvd_stream_wait_layer: an engine stream's read of the rows,
 *              queued right after the call, sees the loaded bytes although
 *              the copies are slow (the fake's delay)
 *   after      kvd_offload_after: the offload waits on the device for the
 *              engine's event (and, a second time, stream), which is held
 *              by a gate; what is stored is what the engine wrote after
 *              the gate opened
 *   misuse     a host pointer declared device memory, rows past the end of
 *              their allocation, an unknown memory kind, kvd_offload_after
 *              on a host pool: each refused with its named code and reason
 *   death      the daemon is killed (SIGKILL) while a slow device load is
 *              in flight: the wait and the completion come back, nothing
 *              hangs, and the linker closes clean
 *   no_runtime the runtime library cannot be loaded (KVDOCK_*_LIBRARY names
 *              a missing file): KVD_ERR_NO_DEVICE naming what is missing;
 *              host pools still work
 * Cases that need a fake's knob skip on a real runtime.
 */
#include "gpu_test.h"
#include "harness.h"
#include "kvd_common.h"
#include "kvdock.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define PS    4 /* tokens per page */
#define PAGES 8
#define ROWS  128 /* token slots */
#define BPR   256 /* bytes per row of K and V */
#define SLOTS 8
#define STATE 1024 /* bytes per state row */

static const char *g_case;
static void *k0, *v0, *k1, *v1, *st; /* device buffers */
static uint32_t kv_id, st_id;
static uint8_t keys[PAGES][KVD_PAGE_KEY_BYTES];

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static void fill(uint8_t *b, size_t n, uint8_t seed)
{
    for (size_t i = 0; i < n; i++)
        b[i] = (uint8_t)(seed * 31 + i * 7 + (i >> 8));
}

/* The bytes a buffer's rows should hold after a load of rows [to, to+n)
 * from what rows [from, from+n) held when seeded. */
static bool rows_equal(const void *dev, uint32_t bpr, int64_t to, uint8_t seed,
                       int64_t from, size_t n_rows)
{
    uint8_t *got = malloc(n_rows * bpr), *all = malloc((size_t)(from + n_rows) * bpr);
    gt_read(got, (const uint8_t *)dev + (size_t)to * bpr, n_rows * bpr);
    fill(all, (size_t)(from + n_rows) * bpr, seed);
    bool ok = memcmp(got, all + (size_t)from * bpr, n_rows * bpr) == 0;
    free(got);
    free(all);
    return ok;
}

static void seed_device(void)
{
    size_t kv = (size_t)ROWS * BPR, s = (size_t)SLOTS * STATE;
    uint8_t *h = malloc(kv > s ? kv : s);
    fill(h, kv, 1);
    gt_write(k0, h, kv);
    fill(h, kv, 2);
    gt_write(v0, h, kv);
    fill(h, kv, 3);
    gt_write(k1, h, kv);
    fill(h, kv, 4);
    gt_write(v1, h, kv);
    fill(h, s, 5);
    gt_write(st, h, s);
    free(h);
}

static void wipe_device(void)
{
    size_t kv = (size_t)ROWS * BPR, s = (size_t)SLOTS * STATE;
    uint8_t *z = calloc(1, kv > s ? kv : s);
    gt_write(k0, z, kv);
    gt_write(v0, z, kv);
    gt_write(k1, z, kv);
    gt_write(v1, z, kv);
    gt_write(st, z, s);
    free(z);
}

static int register_pools(kvd_linker_t *l)
{
    kvd_pool_layer_t kv_layers[2] = {
        {.layer_id = 0, .n_buffers = 2, .buffers = {{k0, BPR, BPR}, {v0, BPR, BPR}}},
        {.layer_id = 1, .n_buffers = 2, .buffers = {{k1, BPR, BPR}, {v1, BPR, BPR}}},
    };
    kvd_pool_layer_t st_layers[1] = {
        {.layer_id = 2, .n_buffers = 1, .buffers = {{st, STATE, STATE}}}};
    kvd_pool_desc_t kv = {.name = "kv",
                          .addressing = KVD_ADDR_PAGED,
                          .page_size = PS,
                          .n_rows = ROWS,
                          .memory = (kvd_memory_kind_t)gt_memory_kind(),
                          .n_layers = 2,
                          .layers = kv_layers};
    kvd_pool_desc_t sd = {.name = "mamba",
                          .addressing = KVD_ADDR_SLOT,
                          .n_rows = SLOTS,
                          .trailing_pages = 1,
                          .memory = (kvd_memory_kind_t)gt_memory_kind(),
                          .n_layers = 1,
                          .layers = st_layers};
    int rc = kvd_register_pool(l, &kv, &kv_id);
    DT_CHECK(rc == KVD_OK, "register kv: %s (%s)", kvd_strerror(rc), kvd_last_error());
    if (rc == KVD_OK)
        rc = kvd_register_pool(l, &sd, &st_id);
    DT_CHECK(rc == KVD_OK, "register mamba: %s (%s)", kvd_strerror(rc), kvd_last_error());
    return rc;
}

static bool wait_done(kvd_linker_t *l, bool loads, uint64_t id, bool *success)
{
    kvd_completion_t c[8];
    for (int i = 0; i < 3000; i++) {
        size_t n = 0;
        if (loads)
            kvd_pop_completed_loads(l, c, 8, &n);
        else
            kvd_pop_completed_offloads(l, c, 8, &n);
        for (size_t k = 0; k < n; k++)
            if (c[k].id == id) {
                *success = c[k].success;
                return true;
            }
        sleep_ms(10);
    }
    return false;
}

static int64_t kv_rows_from[PAGES * PS], kv_rows_to[PAGES * PS];
static int64_t st_from[1] = {3}, st_to[1] = {6};

static void transfers(kvd_transfer_t t[2], const int64_t *kv_rows, const int64_t *st_rows)
{
    t[0] = (kvd_transfer_t){.pool_id = kv_id,
                            .keys = (const uint8_t(*)[KVD_PAGE_KEY_BYTES])keys,
                            .n_keys = PAGES,
                            .device_indices = kv_rows,
                            .n_indices = PAGES * PS};
    t[1] =
        (kvd_transfer_t){.pool_id = st_id,
                         .keys = (const uint8_t(*)[KVD_PAGE_KEY_BYTES]) & keys[PAGES - 1],
                         .n_keys = 1,
                         .device_indices = st_rows,
                         .n_indices = 1,
                         .first_depth = PAGES - 1};
}

/* Offloads rows 8.. and slot 3 (optionally after the engine's stream or
 * event), and waits for the ack. */
static bool offload_all(kvd_linker_t *l, void *stream, void *event, bool hold_check)
{
    kvd_transfer_t t[2];
    transfers(t, kv_rows_from, st_from);
    uint64_t ack = 0;
    int rc = stream || event ? kvd_offload_after(l, t, 2, stream, event, &ack)
                             : kvd_offload(l, t, 2, &ack);
    DT_CHECK(rc == KVD_OK, "offload: %s (%s)", kvd_strerror(rc), kvd_last_error());
    if (rc != KVD_OK)
        return false;
    if (hold_check) {
        /* the engine's write is held by a gate: the offload cannot end */
        sleep_ms(200);
        kvd_completion_t c[4];
        size_t n = 0;
        kvd_pop_completed_offloads(l, c, 4, &n);
        DT_CHECK(n == 0, "an offload after a held event completed before it (%zu)", n);
        return true;
    }
    bool ok = false;
    DT_CHECK(wait_done(l, false, ack, &ok) && ok, "offload completion");
    return ok;
}

/* LOAD .. COMMIT into rows 40.. and slot 6, start; the batch's counter. */
static int start_load(kvd_linker_t *l, uint64_t rid, uint32_t *counter)
{
    kvd_transfer_t t[2];
    transfers(t, kv_rows_to, st_to);
    t[1].first_depth = 0;
    int rc = kvd_load(l, rid, t, 2);
    if (rc == KVD_OK)
        rc = kvd_load_prepare(l, rid);
    kvd_commit_pool_t c[2] = {{.adopted_begin = 0, .adopted_end = PAGES}, {0}};
    if (rc == KVD_OK)
        rc = kvd_load_commit(l, rid, c, 2);
    if (rc == KVD_OK)
        rc = kvd_start_layer_wise_loading(l, counter);
    DT_CHECK(rc == KVD_OK, "load: %s (%s)", kvd_strerror(rc), kvd_last_error());
    return rc;
}

static bool loaded_right(void)
{
    return rows_equal(k0, BPR, 40, 1, 8, PAGES * PS) &&
           rows_equal(v0, BPR, 40, 2, 8, PAGES * PS) &&
           rows_equal(k1, BPR, 40, 3, 8, PAGES * PS) &&
           rows_equal(v1, BPR, 40, 4, 8, PAGES * PS) && rows_equal(st, STATE, 6, 5, 3, 1);
}

static void case_roundtrip(kvd_linker_t *l, bool expect_pinned)
{
    kvd_pool_stats_t s = {0};
    if (expect_pinned) { /* registration runs in the background */
        for (int i = 0; i < 600 && !s.pinned; i++) {
            kvd_stats(l, kv_id, &s);
            if (!s.pinned)
                sleep_ms(50);
        }
        DT_CHECK(s.pinned, "the store's pool was never pinned");
    }
    fakegpu_stats_t f0 = {0}, f1 = {0};
    bool fake = gt_fake_stats(&f0);
    seed_device();
    if (!offload_all(l, NULL, NULL, false))
        return;
    wipe_device();
    uint32_t bounds[PAGES];
    size_t nb = 0;
    kvd_transfer_t look[2];
    transfers(look, NULL, NULL);
    look[1].keys = (const uint8_t(*)[KVD_PAGE_KEY_BYTES])keys;
    look[1].n_keys = PAGES;
    int rc = kvd_lookup(l, 7, look, 2, bounds, &nb);
    DT_CHECK(rc == KVD_OK && nb == 1 && bounds[0] == PAGES, "lookup: %s, %zu boundaries",
             kvd_strerror(rc), nb);
    uint32_t counter = 0;
    if (start_load(l, 7, &counter) != KVD_OK)
        return;
    for (uint32_t layer = 0; layer < 3; layer++) {
        rc = kvd_wait_layer(l, counter, layer);
        DT_CHECK(rc == KVD_OK, "wait layer %u: %s", layer, kvd_strerror(rc));
    }
    /* in place once the wait says so: read at once, no sync of ours */
    DT_CHECK(loaded_right(), "the device rows are not what was offloaded");
    bool ok = false;
    DT_CHECK(wait_done(l, true, 7, &ok) && ok, "load completion");
    kvd_pool_stats_t a, b;
    kvd_stats(l, kv_id, &a);
    kvd_stats(l, st_id, &b);
    uint64_t moved = a.load_bytes + a.offload_bytes;
    DT_CHECK(a.memory == (kvd_memory_kind_t)gt_memory_kind(), "stats memory %d",
             a.memory);
    DT_CHECK(a.dma_bytes + a.bounce_bytes == moved &&
                 b.dma_bytes + b.bounce_bytes == b.load_bytes + b.offload_bytes,
             "dma %llu + bounce %llu != moved %llu", (unsigned long long)a.dma_bytes,
             (unsigned long long)a.bounce_bytes, (unsigned long long)moved);
    DT_CHECK(moved == 2ull * 2 * 2 * PAGES * PS * BPR, "moved %llu",
             (unsigned long long)moved);
    if (expect_pinned)
        DT_CHECK(a.pinned && a.bounce_bytes == 0 && a.dma_bytes == moved,
                 "pinned: dma %llu bounce %llu", (unsigned long long)a.dma_bytes,
                 (unsigned long long)a.bounce_bytes);
    else
        DT_CHECK(!a.pinned && a.dma_bytes == 0 && a.bounce_bytes == moved,
                 "not pinned: dma %llu bounce %llu", (unsigned long long)a.dma_bytes,
                 (unsigned long long)a.bounce_bytes);
    if (fake && gt_fake_stats(&f1))
        DT_CHECK(
            f1.async_copies_pageable == f0.async_copies_pageable,
            "%llu device copies touched pageable host memory",
            (unsigned long long)(f1.async_copies_pageable - f0.async_copies_pageable));
}

static void case_stream(kvd_linker_t *l)
{
    seed_device();
    if (!offload_all(l, NULL, NULL, false))
        return;
    wipe_device();
    void *s = gt_stream_create();
    uint32_t counter = 0;
    if (start_load(l, 8, &counter) != KVD_OK)
        return;
    size_t n = (size_t)PAGES * PS * BPR;
    uint8_t *got = malloc(n), *want = malloc((size_t)(8 + PAGES * PS) * BPR);
    int rc = kvd_stream_wait_layer(l, counter, 1, s);
    DT_CHECK(rc == KVD_OK, "stream wait layer 1: %s", kvd_strerror(rc));
    /* the engine's next kernel reads layer 1's rows on its stream */
    gt_read_async(got, (uint8_t *)k1 + 40 * BPR, n, s);
    gt_stream_sync(s);
    fill(want, (size_t)(8 + PAGES * PS) * BPR, 3);
    DT_CHECK(memcmp(got, want + 8 * BPR, n) == 0,
             "the engine stream read layer 1 before its bytes were in place");
    rc = kvd_stream_wait_layer(l, counter, 2, s);
    DT_CHECK(rc == KVD_OK, "stream wait layer 2: %s", kvd_strerror(rc));
    rc = kvd_stream_wait_layer(l, counter, 77, s);
    DT_CHECK(rc == KVD_OK, "a layer no pool has: %s", kvd_strerror(rc));
    rc = kvd_stream_wait_layer(l, 999, 0, s);
    DT_CHECK(rc == KVD_ERR_NOT_FOUND, "an unknown counter: %s", kvd_strerror(rc));
    bool ok = false;
    DT_CHECK(wait_done(l, true, 8, &ok) && ok, "load completion");
    DT_CHECK(loaded_right(), "the device rows are not what was offloaded");
    free(got);
    free(want);
    gt_stream_destroy(s);
}

static void case_after(kvd_linker_t *l)
{
    /* by event, by stream, by the legacy default stream (handle 0, where
     * engines compute unless told otherwise; KVD_STREAM_LEGACY names it) */
    for (int pass = 0; pass < 3; pass++) {
        seed_device();
        void *s = pass < 2 ? gt_stream_create() : NULL;
        void *e = gt_event_create();
        gt_gate_t *gate = gt_gate(s);
        /* after the gate the engine rewrites layer 0's K rows 8.. */
        size_t n = (size_t)PAGES * PS * BPR;
        uint8_t *fresh = malloc(n);
        fill(fresh, n, (uint8_t)(77 + pass));
        gt_write_async((uint8_t *)k0 + 8 * BPR, fresh, n, s);
        gt_event_record(e, s);
        if (pass == 0)
            offload_all(l, NULL, e, true);
        else
            offload_all(l, pass == 1 ? s : KVD_STREAM_LEGACY, NULL, true);
        gt_gate_open(gate);
        bool ok = false;
        kvd_completion_t c[4];
        size_t got_n = 0;
        for (int i = 0; i < 3000 && got_n == 0; i++) {
            kvd_pop_completed_offloads(l, c, 4, &got_n);
            if (got_n == 0)
                sleep_ms(10);
        }
        ok = got_n == 1 && c[0].success;
        DT_CHECK(ok, "offload after the engine: %zu completions", got_n);
        gt_stream_sync(s);
        /* what was stored is what the engine wrote after the gate */
        wipe_device();
        uint32_t counter = 0;
        if (start_load(l, 20 + (uint64_t)pass, &counter) == KVD_OK) {
            DT_CHECK(kvd_wait_layer(l, counter, 0) == KVD_OK, "wait layer 0");
            uint8_t *back = malloc(n);
            gt_read(back, (uint8_t *)k0 + 40 * BPR, n);
            DT_CHECK(memcmp(back, fresh, n) == 0,
                     "pass %d: the store holds the rows from before the engine's write",
                     pass);
            free(back);
            DT_CHECK(wait_done(l, true, 20 + (uint64_t)pass, &ok) && ok,
                     "load completion");
        }
        free(fresh);
        gt_event_destroy(e);
        if (s != NULL)
            gt_stream_destroy(s);
        {
            /* the next pass stores under new keys: another prompt */
            uint32_t tokens[PAGES * PS];
            for (int i = 0; i < PAGES * PS; i++)
                tokens[i] = 5000 + 100 * (uint32_t)pass + (uint32_t)i;
            size_t nk = 0;
            kvd_page_keys(tokens, PAGES * PS, PS, NULL, keys, &nk);
        }
    }
}

static void case_misuse(kvd_linker_t *l)
{
    uint8_t *host = calloc(ROWS, BPR);
    kvd_pool_layer_t ly = {.layer_id = 0, .n_buffers = 1, .buffers = {{host, BPR, BPR}}};
    kvd_pool_desc_t d = {.name = "hostlie",
                         .addressing = KVD_ADDR_PAGED,
                         .page_size = PS,
                         .n_rows = ROWS,
                         .memory = (kvd_memory_kind_t)gt_memory_kind(),
                         .n_layers = 1,
                         .layers = &ly};
    uint32_t id;
    int rc = kvd_register_pool(l, &d, &id);
    DT_CHECK(rc == KVD_ERR_NOT_DEVICE && strstr(kvd_last_error(), "not device memory"),
             "a host pointer as device memory: %s (%s)", kvd_strerror(rc),
             kvd_last_error());
    /* device memory, but rows past the end of the allocation */
    void *small = gt_alloc((size_t)ROWS * BPR / 2);
    ly.buffers[0].base = small;
    d.name = "pastend";
    rc = kvd_register_pool(l, &d, &id);
    DT_CHECK(rc == KVD_ERR_NOT_DEVICE && strstr(kvd_last_error(), "past the end"),
             "rows past the allocation: %s (%s)", kvd_strerror(rc), kvd_last_error());
    /* the rows inside a larger allocation, but starting off its base */
    void *big = gt_alloc((size_t)ROWS * BPR + 4096);
    ly.buffers[0].base = (uint8_t *)big + 4096;
    d.name = "inside";
    rc = kvd_register_pool(l, &d, &id);
    DT_CHECK(rc == KVD_OK, "rows inside an allocation: %s (%s)", kvd_strerror(rc),
             kvd_last_error());
    d.memory = (kvd_memory_kind_t)99;
    d.name = "bogus";
    rc = kvd_register_pool(l, &d, &id);
    DT_CHECK(rc == KVD_ERR_UNSUPPORTED, "memory kind 99: %s", kvd_strerror(rc));
    /* a host pool: nothing on a device to wait for */
    ly.buffers[0].base = host;
    d.memory = KVD_MEM_HOST;
    d.name = "hostpool";
    uint32_t hid = 0;
    rc = kvd_register_pool(l, &d, &hid);
    DT_CHECK(rc == KVD_OK, "host pool: %s", kvd_strerror(rc));
    int64_t rows[PS] = {0, 1, 2, 3};
    kvd_transfer_t t = {.pool_id = hid,
                        .keys = (const uint8_t(*)[KVD_PAGE_KEY_BYTES])keys,
                        .n_keys = 1,
                        .device_indices = rows,
                        .n_indices = PS};
    uint64_t ack;
    void *s = gt_stream_create();
    rc = kvd_offload_after(l, &t, 1, s, NULL, &ack);
    DT_CHECK(rc == KVD_ERR_INVALID, "offload_after on a host pool: %s", kvd_strerror(rc));
    gt_stream_destroy(s);
    /* an engine stream being captured into a graph cannot be waited for:
     * refused, nothing queued (the fake CUDA driver marks capturing
     * streams; a real one too) */
    typedef int (*begin_fn)(void *, int);
    typedef int (*end_fn)(void *, void **);
    begin_fn begin = (begin_fn)gt_symbol("cuStreamBeginCapture_v2");
    end_fn end = (end_fn)gt_symbol("cuStreamEndCapture");
    if (gt_runtime() == GT_CUDA && begin != NULL && end != NULL) {
        void *cs = gt_stream_create();
        DT_CHECK(begin(cs, 2 /* relaxed */) == 0, "begin capture");
        int64_t krows[PS] = {8, 9, 10, 11};
        kvd_transfer_t kt = {.pool_id = kv_id,
                             .keys = (const uint8_t(*)[KVD_PAGE_KEY_BYTES])keys,
                             .n_keys = 1,
                             .device_indices = krows,
                             .n_indices = PS};
        rc = kvd_offload_after(l, &kt, 1, cs, NULL, &ack);
        DT_CHECK(rc == KVD_ERR_UNSUPPORTED && strstr(kvd_last_error(), "captured"),
                 "offload_after a capturing stream: %s (%s)", kvd_strerror(rc),
                 kvd_last_error());
        void *graph = NULL;
        DT_CHECK(end(cs, &graph) == 0, "end capture");
        gt_stream_destroy(cs);
    } else {
        printf("no graph capture in this runtime: its refusal is not checked here\n");
    }
    gt_free(small);
    gt_free(big);
    free(host);
}

static void case_death(kvd_linker_t *l, kvd_test_daemon_t *d)
{
    seed_device();
    if (!offload_all(l, NULL, NULL, false))
        return;
    uint32_t counter = 0;
    if (start_load(l, 30, &counter) != KVD_OK)
        return;
    /* the copies are slow (the fake's delay): the daemon dies under them */
    kill(d->pid, SIGKILL);
    int st = 0;
    kvd_test_daemon_stop(d, SIGKILL, 10000, &st);
    for (uint32_t layer = 0; layer < 3; layer++) {
        int rc = kvd_wait_layer(l, counter, layer);
        DT_CHECK(rc == KVD_OK || rc == KVD_ERR_CLOSED || rc == KVD_ERR_TIMEOUT ||
                     rc == KVD_ERR_STATE,
                 "wait layer %u after the daemon died: %s", layer, kvd_strerror(rc));
    }
    bool ok = true;
    DT_CHECK(wait_done(l, true, 30, &ok), "the load's completion never came back");
    printf("the load of a killed daemon completed %s\n", ok ? "ok" : "failed");
}

static void case_no_runtime(const char *socket)
{
    kvd_linker_config_t cfg = {
        .socket_path = socket, .model_id = "gpu-none", .tp_size = 1, .timeout_ms = 5000};
    kvd_linker_t *l = NULL;
    int rc = kvd_linker_open(&cfg, &l);
    DT_CHECK(rc == KVD_OK, "open: %s", kvd_strerror(rc));
    if (rc != KVD_OK)
        return;
    static uint8_t rows[ROWS * BPR];
    kvd_pool_layer_t ly = {.layer_id = 0, .n_buffers = 1, .buffers = {{rows, BPR, BPR}}};
    kvd_pool_desc_t d = {.name = "kv",
                         .addressing = KVD_ADDR_PAGED,
                         .page_size = PS,
                         .n_rows = ROWS,
                         .memory = KVD_MEM_CUDA,
                         .n_layers = 1,
                         .layers = &ly};
    const char *names[] = {"CUDA", "HIP"};
    kvd_memory_kind_t kinds[] = {KVD_MEM_CUDA, KVD_MEM_HIP};
    for (int i = 0; i < 2; i++) {
        d.memory = kinds[i];
        uint32_t id;
        rc = kvd_register_pool(l, &d, &id);
        printf("%s pool without its runtime: %s: %s\n", names[i], kvd_strerror(rc),
               kvd_last_error());
        DT_CHECK((rc == KVD_ERR_NO_DEVICE && strstr(kvd_last_error(), "cannot load")) ||
                     (rc == KVD_ERR_UNSUPPORTED && strstr(kvd_last_error(), "not built")),
                 "%s pool without its runtime: %s (%s)", names[i], kvd_strerror(rc),
                 kvd_last_error());
    }
    d.memory = KVD_MEM_HOST;
    uint32_t id;
    rc = kvd_register_pool(l, &d, &id);
    DT_CHECK(rc == KVD_OK, "a host pool after: %s", kvd_strerror(rc));
    kvd_linker_close(l);
}

int main(int argc, char **argv)
{
    g_case = argc > 1 ? argv[1] : "roundtrip";
    bool no_runtime = strcmp(g_case, "no_runtime") == 0;
    if (!no_runtime) {
        int rc = gt_open();
        if (rc != 0)
            return rc; /* 77: no runtime or device here, said why */
        bool needs_fake = strcmp(g_case, "bounce") == 0 ||
                          strcmp(g_case, "stream") == 0 || strcmp(g_case, "death") == 0;
        if (needs_fake && !gt_is_fake()) {
            printf("SKIP: case %s needs a knob of the fake runtime\n", g_case);
            return 77;
        }
    }
    kvd_test_daemon_t d;
    const char *args[] = {"--pool-size", "64M", "--usage-interval", "0", NULL};
    if (kvd_test_daemon_start(&d, args, true, 30000) != 0)
        return 1;
    bool killed = false;
    if (no_runtime) {
        case_no_runtime(d.socket);
    } else {
        k0 = gt_alloc((size_t)ROWS * BPR);
        v0 = gt_alloc((size_t)ROWS * BPR);
        k1 = gt_alloc((size_t)ROWS * BPR);
        v1 = gt_alloc((size_t)ROWS * BPR);
        st = gt_alloc((size_t)SLOTS * STATE);
        for (int i = 0; i < PAGES * PS; i++) {
            kv_rows_from[i] = 8 + i;
            kv_rows_to[i] = 40 + i;
        }
        uint32_t tokens[PAGES * PS];
        for (int i = 0; i < PAGES * PS; i++)
            tokens[i] = 1000 + (uint32_t)i;
        size_t nk = 0;
        kvd_page_keys(tokens, PAGES * PS, PS, NULL, keys, &nk);
        kvd_linker_config_t cfg = {.socket_path = d.socket,
                                   .model_id = "gpu",
                                   .tp_size = 1,
                                   .timeout_ms = 10000};
        kvd_linker_t *l = NULL;
        int rc = kvd_linker_open(&cfg, &l);
        DT_CHECK(rc == KVD_OK, "open: %s", kvd_strerror(rc));
        if (rc == KVD_OK && register_pools(l) == KVD_OK) {
            const char *tr = getenv("KVDOCK_TRANSPORT");
            bool ucx = tr != NULL && strcmp(tr, "ucx") == 0;
            if (strcmp(g_case, "roundtrip") == 0)
                case_roundtrip(l, !ucx);
            else if (strcmp(g_case, "bounce") == 0)
                case_roundtrip(l, false);
            else if (strcmp(g_case, "stream") == 0)
                case_stream(l);
            else if (strcmp(g_case, "after") == 0)
                case_after(l);
            else if (strcmp(g_case, "misuse") == 0)
                case_misuse(l);
            else if (strcmp(g_case, "death") == 0) {
                case_death(l, &d);
                killed = true;
            } else
                DT_CHECK(false, "unknown case %s", g_case);
        }
        kvd_linker_close(l);
        gt_free(k0);
        gt_free(v0);
        gt_free(k1);
        gt_free(v1);
        gt_free(st);
    }
    if (!killed) {
        int stv = 0;
        DT_CHECK(kvd_test_daemon_stop(&d, SIGTERM, 10000, &stv) == 0,
                 "kvdockd did not exit on SIGTERM");
    }
    char name[64];
    snprintf(name, sizeof(name), "gpu/linker-%s", g_case);
    return dt_exit_status(name);
}
