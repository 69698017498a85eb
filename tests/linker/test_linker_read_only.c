/*
 * Description: a linker opened with read_only (kvd_linker_config_t) loads
 * what another linker offloaded, byte for byte, through a read-only
 * mapping of the pool, and its own offloads fail (the daemon refuses its
 * Reserve) without touching the pool.
 */
#include "harness.h"
#include "kvd_common.h" /* the status codes */
#include "kvdock.h"
#include "ltest.h"

#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#define PS    4 /* tokens per page */
#define PAGES 4
#define ROWS  64
#define BPR   32

static uint8_t k0[ROWS * BPR], v0[ROWS * BPR];

static void on_free(void *ctx, const int64_t *idx, size_t n)
{
    (void)ctx;
    (void)idx;
    (void)n;
}

static int open_one(const char *socket, bool read_only, kvd_linker_t **l, uint32_t *pool)
{
    kvd_linker_config_t cfg = {.socket_path = socket,
                               .model_id = "read-only",
                               .tp_size = 1,
                               .timeout_ms = 5000,
                               .read_only = read_only};
    int rc = kvd_linker_open(&cfg, l);
    if (!DT_CHECK(rc == 0, "open (read_only %d): %s", read_only, kvd_strerror(rc)))
        return rc;
    kvd_pool_layer_t layer = {
        .layer_id = 0, .n_buffers = 2, .buffers = {{k0, BPR, BPR}, {v0, BPR, BPR}}};
    kvd_pool_desc_t kv = {.name = "kv",
                          .addressing = KVD_ADDR_PAGED,
                          .page_size = PS,
                          .n_rows = ROWS,
                          .memory = KVD_MEM_HOST,
                          .n_layers = 1,
                          .layers = &layer,
                          .free_indices = on_free};
    rc = kvd_register_pool(*l, &kv, pool);
    DT_CHECK(rc == 0, "register (read_only %d): %s", read_only, kvd_strerror(rc));
    return rc;
}

/* Waits (bounded) for one offload completion; its success or -1. */
static int offload_result(kvd_linker_t *l, uint64_t ack)
{
    kvd_completion_t done[4];
    size_t n = 0;
    for (int i = 0; i < 500 && n == 0; i++) {
        kvd_pop_completed_offloads(l, done, 4, &n);
        if (n == 0) {
            struct timespec ts = {0, 10000000};
            nanosleep(&ts, NULL);
        }
    }
    if (!DT_CHECK(n == 1 && done[0].id == ack, "offload %llu: %zu completions",
                  (unsigned long long)ack, n))
        return -1;
    return done[0].success;
}

static void run(const char *socket)
{
    uint32_t tokens[PAGES * PS];
    for (int i = 0; i < PAGES * PS; i++)
        tokens[i] = 5000 + (uint32_t)i;
    uint8_t keys[PAGES][KVD_PAGE_KEY_BYTES];
    size_t nk = 0;
    DT_CHECK(kvd_page_keys(tokens, PAGES * PS, PS, NULL, keys, &nk) == 0 && nk == PAGES,
             "keys");
    for (size_t i = 0; i < sizeof(k0); i++) {
        k0[i] = (uint8_t)(i * 7 + 1);
        v0[i] = (uint8_t)(i * 13 + 5);
    }
    uint8_t ek[sizeof(k0)], evv[sizeof(v0)];
    memcpy(ek, k0, sizeof(k0));
    memcpy(evv, v0, sizeof(v0));
    int64_t idx[PAGES * PS];
    for (int i = 0; i < PAGES * PS; i++)
        idx[i] = i;

    kvd_linker_t *w = NULL, *r = NULL;
    uint32_t wp = 0, rp = 0;
    if (open_one(socket, false, &w, &wp) != 0)
        goto out;
    kvd_transfer_t off = {.pool_id = wp,
                          .keys = (const uint8_t(*)[KVD_PAGE_KEY_BYTES])keys,
                          .n_keys = PAGES,
                          .device_indices = idx,
                          .n_indices = PAGES * PS};
    uint64_t ack = 0;
    DT_CHECK(kvd_offload(w, &off, 1, &ack) == 0, "writer: offload");
    DT_CHECK(offload_result(w, ack) == 1, "writer: the offload should succeed");

    if (open_one(socket, true, &r, &rp) != 0)
        goto out;
    memset(k0, 0, sizeof(k0));
    memset(v0, 0, sizeof(v0));
    uint32_t bounds[PAGES];
    size_t nb = 0;
    kvd_transfer_t look = {.pool_id = rp,
                           .keys = (const uint8_t(*)[KVD_PAGE_KEY_BYTES])keys,
                           .n_keys = PAGES};
    DT_CHECK(kvd_lookup(r, 1, &look, 1, bounds, &nb) == 0 && nb == PAGES &&
                 bounds[nb - 1] == PAGES,
             "reader: lookup found %zu boundaries", nb);
    int64_t back[PAGES * PS];
    for (int i = 0; i < PAGES * PS; i++)
        back[i] = 32 + i;
    kvd_transfer_t ld = {.pool_id = rp,
                         .keys = (const uint8_t(*)[KVD_PAGE_KEY_BYTES])keys,
                         .n_keys = PAGES,
                         .device_indices = back,
                         .n_indices = PAGES * PS};
    DT_CHECK(kvd_load(r, 1, &ld, 1) == 0, "reader: load");
    DT_CHECK(kvd_load_prepare(r, 1) == 0, "reader: prepare");
    kvd_commit_pool_t c = {.adopted_begin = 0, .adopted_end = PAGES};
    DT_CHECK(kvd_load_commit(r, 1, &c, 1) == 0, "reader: commit");
    uint32_t ctr = 0;
    if (DT_CHECK(kvd_start_layer_wise_loading(r, &ctr) == 0, "reader: layer-wise start"))
        DT_CHECK(kvd_wait_layer(r, ctr, 0) == 0, "reader: layer 0");
    kvd_completion_t done[2];
    size_t n = 0;
    for (int i = 0; i < 500 && n == 0; i++) {
        kvd_pop_completed_loads(r, done, 2, &n);
        if (n == 0) {
            struct timespec ts = {0, 10000000};
            nanosleep(&ts, NULL);
        }
    }
    DT_CHECK(n == 1 && done[0].success, "reader: the load should complete");
    DT_CHECK(memcmp(k0 + 32 * BPR, ek, PAGES * PS * BPR) == 0 &&
                 memcmp(v0 + 32 * BPR, evv, PAGES * PS * BPR) == 0,
             "reader: the loaded bytes differ from the offloaded ones");

    /* the reader's offload of other pages fails: it may not write */
    uint32_t more[PAGES * PS];
    for (int i = 0; i < PAGES * PS; i++)
        more[i] = 9000 + (uint32_t)i;
    uint8_t mkeys[PAGES][KVD_PAGE_KEY_BYTES];
    DT_CHECK(kvd_page_keys(more, PAGES * PS, PS, NULL, mkeys, &nk) == 0, "keys");
    kvd_transfer_t roff = {.pool_id = rp,
                           .keys = (const uint8_t(*)[KVD_PAGE_KEY_BYTES])mkeys,
                           .n_keys = PAGES,
                           .device_indices = back,
                           .n_indices = PAGES * PS};
    uint64_t rack = 0;
    int rc = kvd_offload(r, &roff, 1, &rack);
    if (rc == 0)
        DT_CHECK(offload_result(r, rack) == 0, "reader: its offload should fail");
    nb = 0;
    look.keys = (const uint8_t(*)[KVD_PAGE_KEY_BYTES])mkeys;
    DT_CHECK(
        kvd_lookup(w, 2,
                   &(kvd_transfer_t){.pool_id = wp, .keys = look.keys, .n_keys = PAGES},
                   1, bounds, &nb) == 0 &&
            nb == 0,
        "the reader's pages should not be stored (%zu boundaries)", nb);
out:
    if (r)
        kvd_linker_close(r);
    if (w)
        kvd_linker_close(w);
}

int main(void)
{
    return lt_main("linker/read_only", run);
}
