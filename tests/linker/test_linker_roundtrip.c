/*
 * Description: the linker's whole path through the shared library, against
 * a live kvdockd, on host memory: a paged pool (two layers, K and V, page
 * size 4) and a slot-addressed pool (one layer, two buffers). Offload four
 * pages and one state slot; wipe the device buffers; Lookup finds every
 * boundary; Load, Prepare, Commit with the whole range adopted, layer-wise
 * loading with a wait per layer; the completed-loads queue returns the rid
 * once with success; the device bytes equal what was offloaded, byte for
 * byte, each in its slot; the counters count the bytes both ways. A second
 * load of a key that is not stored fails and pins nothing. The protocol's
 * order is enforced: of eight threads loading one rid at once exactly one
 * gets it; PREPARE twice, ABORT after COMMIT, unknown rids are refused.
 */
#include "harness.h"
#include "kvd_common.h" /* the status codes */
#include "kvdock.h"
#include "ltest.h"

#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define PS      4 /* tokens per page */
#define PAGES   4
#define ROWS    64 /* token slots in the paged pool */
#define BPR     32 /* bytes per row of K and V */
#define SLOTS   8  /* state slots */
#define STATE_A 96 /* bytes per row of the first state buffer */
#define STATE_B 16

static uint8_t k0[ROWS * BPR], v0[ROWS * BPR], k1[ROWS * BPR], v1[ROWS * BPR];
static uint8_t sa[SLOTS * STATE_A], sb[SLOTS * STATE_B];
static int64_t freed[256];
static size_t n_freed;

static void on_free(void *ctx, const int64_t *idx, size_t n)
{
    (void)ctx;
    for (size_t i = 0; i < n && n_freed < 256; i++)
        freed[n_freed++] = idx[i];
}

static void fill(uint8_t *buf, size_t len, uint8_t seed)
{
    for (size_t i = 0; i < len; i++)
        buf[i] = (uint8_t)(seed * 31 + i * 7 + (i >> 8));
}

/* Eight threads LOAD one rid at the same moment. */
typedef struct racer {
    kvd_linker_t *l;
    const kvd_transfer_t *t;
    pthread_barrier_t *go;
    int rc;
} racer_t;

static void *race_load(void *arg)
{
    racer_t *r = arg;
    pthread_barrier_wait(r->go);
    r->rc = kvd_load(r->l, 9, r->t, 2);
    return NULL;
}

static void run(const char *socket)
{
    kvd_linker_config_t cfg = {
        .socket_path = socket, .model_id = "roundtrip", .tp_size = 1, .timeout_ms = 5000};
    kvd_linker_t *l = NULL;
    int rc = kvd_linker_open(&cfg, &l);
    DT_CHECK(rc == 0, "open: %s", kvd_strerror(rc));
    if (rc != 0)
        return;
    kvd_pool_layer_t kv_layers[2] = {
        {.layer_id = 0, .n_buffers = 2, .buffers = {{k0, BPR, BPR}, {v0, BPR, BPR}}},
        {.layer_id = 2, .n_buffers = 2, .buffers = {{k1, BPR, BPR}, {v1, BPR, BPR}}},
    };
    kvd_pool_layer_t st_layers[1] = {
        {.layer_id = 1,
         .n_buffers = 2,
         .buffers = {{sa, STATE_A, STATE_A}, {sb, STATE_B, STATE_B}}},
    };
    kvd_pool_desc_t kv = {.name = "kv",
                          .addressing = KVD_ADDR_PAGED,
                          .page_size = PS,
                          .n_rows = ROWS,
                          .memory = KVD_MEM_HOST,
                          .n_layers = 2,
                          .layers = kv_layers,
                          .free_indices = on_free};
    kvd_pool_desc_t st = {.name = "mamba",
                          .addressing = KVD_ADDR_SLOT,
                          .n_rows = SLOTS,
                          .trailing_pages = 1,
                          .memory = KVD_MEM_HOST,
                          .n_layers = 1,
                          .layers = st_layers,
                          .free_indices = on_free};
    uint32_t kv_id, st_id;
    DT_CHECK(kvd_register_pool(l, &kv, &kv_id) == 0, "register kv");
    DT_CHECK(kvd_register_pool(l, &st, &st_id) == 0, "register mamba");
    uint64_t obj;
    char ns[256];
    DT_CHECK(kvd_pool_info(l, kv_id, &obj, ns, sizeof(ns)) == 0 &&
                 obj == 2 * 2 * PS * BPR && strcmp(ns, "roundtrip/kv/tp0") == 0,
             "kv object %llu bytes in %s", (unsigned long long)obj, ns);

    uint32_t tokens[PAGES * PS];
    for (int i = 0; i < PAGES * PS; i++)
        tokens[i] = 1000 + (uint32_t)i;
    uint8_t keys[PAGES][KVD_PAGE_KEY_BYTES];
    size_t nk = 0;
    DT_CHECK(kvd_page_keys(tokens, PAGES * PS, PS, NULL, keys, &nk) == 0 && nk == PAGES,
             "keys");

    /* the engine's prefill wrote pages into slots 8..23 and state into slot 3 */
    fill(k0, sizeof(k0), 1);
    fill(v0, sizeof(v0), 2);
    fill(k1, sizeof(k1), 3);
    fill(v1, sizeof(v1), 4);
    fill(sa, sizeof(sa), 5);
    fill(sb, sizeof(sb), 6);
    uint8_t ek0[sizeof(k0)], ev0[sizeof(v0)], ek1[sizeof(k1)], ev1[sizeof(v1)],
        esa[sizeof(sa)], esb[sizeof(sb)];
    memcpy(ek0, k0, sizeof(k0));
    memcpy(ev0, v0, sizeof(v0));
    memcpy(ek1, k1, sizeof(k1));
    memcpy(ev1, v1, sizeof(v1));
    memcpy(esa, sa, sizeof(sa));
    memcpy(esb, sb, sizeof(sb));
    int64_t kv_idx[PAGES * PS], st_idx[1] = {3};
    for (int i = 0; i < PAGES * PS; i++)
        kv_idx[i] = 8 + i;
    kvd_transfer_t off[2] = {
        {.pool_id = kv_id,
         .keys = (const uint8_t(*)[KVD_PAGE_KEY_BYTES])keys,
         .n_keys = PAGES,
         .device_indices = kv_idx,
         .n_indices = PAGES * PS},
        {.pool_id = st_id,
         .keys = (const uint8_t(*)[KVD_PAGE_KEY_BYTES]) & keys[PAGES - 1],
         .n_keys = 1,
         .device_indices = st_idx,
         .n_indices = 1,
         .first_depth = PAGES - 1},
    };
    uint64_t ack = 0;
    DT_CHECK(kvd_offload(l, off, 2, &ack) == 0, "offload");
    kvd_completion_t done[4];
    size_t n = 0;
    for (int i = 0; i < 500 && n == 0; i++) {
        kvd_pop_completed_offloads(l, done, 4, &n);
        if (n == 0) {
            struct timespec ts = {0, 10000000};
            nanosleep(&ts, NULL);
        }
    }
    DT_CHECK(n == 1 && done[0].id == ack && done[0].success, "offload completion");

    /* the device forgets; the rows come back into other slots: 32..47, 6 */
    memset(k0, 0, sizeof(k0));
    memset(v0, 0, sizeof(v0));
    memset(k1, 0, sizeof(k1));
    memset(v1, 0, sizeof(v1));
    memset(sa, 0, sizeof(sa));
    memset(sb, 0, sizeof(sb));
    uint32_t bounds[PAGES];
    size_t nb = 0;
    kvd_transfer_t look[2] = {
        {.pool_id = kv_id,
         .keys = (const uint8_t(*)[KVD_PAGE_KEY_BYTES])keys,
         .n_keys = PAGES},
        {.pool_id = st_id,
         .keys = (const uint8_t(*)[KVD_PAGE_KEY_BYTES])keys,
         .n_keys = PAGES},
    };
    DT_CHECK(kvd_lookup(l, 7, look, 2, bounds, &nb) == 0 && nb == 1 && bounds[0] == PAGES,
             "lookup: %zu boundaries, last %u", nb, nb ? bounds[nb - 1] : 0);
    int64_t kv_new[PAGES * PS], st_new[1] = {6};
    for (int i = 0; i < PAGES * PS; i++)
        kv_new[i] = 32 + i;
    kvd_transfer_t ld[2] = {
        {.pool_id = kv_id,
         .keys = (const uint8_t(*)[KVD_PAGE_KEY_BYTES])keys,
         .n_keys = PAGES,
         .device_indices = kv_new,
         .n_indices = PAGES * PS},
        {.pool_id = st_id,
         .keys = (const uint8_t(*)[KVD_PAGE_KEY_BYTES]) & keys[PAGES - 1],
         .n_keys = 1,
         .device_indices = st_new,
         .n_indices = 1},
    };
    DT_CHECK(kvd_load(l, 7, ld, 2) == 0, "load");
    DT_CHECK(kvd_load_prepare(l, 7) == 0, "prepare");
    kvd_commit_pool_t c[2] = {{.adopted_begin = 0, .adopted_end = PAGES}, {0}};
    DT_CHECK(kvd_load_commit(l, 7, c, 2) == 0, "commit");
    DT_CHECK(n_freed == 0, "a fully adopted commit frees nothing (%zu freed)", n_freed);
    uint32_t counter = 0;
    DT_CHECK(kvd_start_layer_wise_loading(l, &counter) == 0, "start");
    for (uint32_t layer = 0; layer < 3; layer++)
        DT_CHECK(kvd_wait_layer(l, counter, layer) == 0, "wait layer %u", layer);
    n = 0;
    for (int i = 0; i < 500 && n == 0; i++) {
        kvd_pop_completed_loads(l, done, 4, &n);
        if (n == 0) {
            struct timespec ts = {0, 10000000};
            nanosleep(&ts, NULL);
        }
    }
    DT_CHECK(n == 1 && done[0].id == 7 && done[0].success, "load completion");
    DT_CHECK(memcmp(k0 + 32 * BPR, ek0 + 8 * BPR, PAGES * PS * BPR) == 0,
             "layer 0 K restored");
    DT_CHECK(memcmp(v0 + 32 * BPR, ev0 + 8 * BPR, PAGES * PS * BPR) == 0,
             "layer 0 V restored");
    DT_CHECK(memcmp(k1 + 32 * BPR, ek1 + 8 * BPR, PAGES * PS * BPR) == 0,
             "layer 2 K restored");
    DT_CHECK(memcmp(v1 + 32 * BPR, ev1 + 8 * BPR, PAGES * PS * BPR) == 0,
             "layer 2 V restored");
    DT_CHECK(memcmp(sa + 6 * STATE_A, esa + 3 * STATE_A, STATE_A) == 0,
             "state A restored");
    DT_CHECK(memcmp(sb + 6 * STATE_B, esb + 3 * STATE_B, STATE_B) == 0,
             "state B restored");
    /* nothing else was written */
    uint8_t zero[ROWS * BPR] = {0};
    DT_CHECK(memcmp(k0, zero, 32 * BPR) == 0,
             "rows before the loaded pages stay untouched");
    kvd_pool_stats_t s;
    DT_CHECK(kvd_stats(l, kv_id, &s) == 0 && s.load_bytes == PAGES * obj &&
                 s.offload_bytes == PAGES * obj && s.lookup_hit_pages == PAGES,
             "kv counters: load %llu offload %llu hits %llu",
             (unsigned long long)s.load_bytes, (unsigned long long)s.offload_bytes,
             (unsigned long long)s.lookup_hit_pages);
    DT_CHECK(kvd_stats(l, st_id, &s) == 0 && s.load_bytes == STATE_A + STATE_B &&
                 s.lookup_hit_pages > 0,
             "mamba counters: load %llu hits %llu", (unsigned long long)s.load_bytes,
             (unsigned long long)s.lookup_hit_pages);

    /* a key that is not stored: the load fails, nothing stays pinned */
    uint8_t absent[1][KVD_PAGE_KEY_BYTES];
    memset(absent, 0x5a, sizeof(absent));
    kvd_transfer_t bad = {.pool_id = kv_id,
                          .keys = (const uint8_t(*)[KVD_PAGE_KEY_BYTES])absent,
                          .n_keys = 1,
                          .device_indices = kv_new,
                          .n_indices = PS};
    DT_CHECK(kvd_load(l, 8, &bad, 1) < 0, "a load of an absent key must fail");
    DT_CHECK(kvd_load_commit(l, 8, c, 1) < 0, "a failed load cannot be committed");
    n_freed = 0;
    DT_CHECK(kvd_load_abort(l, 8) == 0 && n_freed == PS,
             "ABORT of the failed load hands its indices back (%zu)", n_freed);

    /* one load per rid: of eight racing LOADs exactly one is recorded */
    enum { RACERS = 8 };
    pthread_barrier_t go;
    pthread_barrier_init(&go, NULL, RACERS);
    racer_t r[RACERS];
    pthread_t th[RACERS];
    for (int i = 0; i < RACERS; i++) {
        r[i] = (racer_t){.l = l, .t = ld, .go = &go, .rc = 1};
        pthread_create(&th[i], NULL, race_load, &r[i]);
    }
    int won = 0, refused = 0;
    for (int i = 0; i < RACERS; i++) {
        pthread_join(th[i], NULL);
        won += r[i].rc == 0;
        refused += r[i].rc == KVD_ERR_EXISTS;
    }
    pthread_barrier_destroy(&go);
    DT_CHECK(won == 1 && refused == RACERS - 1, "racing loads: %d won, %d refused", won,
             refused);
    DT_CHECK(kvd_load_prepare(l, 9) == 0, "prepare");
    DT_CHECK(kvd_load_prepare(l, 9) == KVD_ERR_STATE, "a second PREPARE is refused");
    DT_CHECK(kvd_load_prepare(l, 4242) == KVD_ERR_NOT_FOUND, "PREPARE of an unknown rid");
    DT_CHECK(kvd_load_commit(l, 4242, c, 2) == KVD_ERR_NOT_FOUND,
             "COMMIT of an unknown rid");
    DT_CHECK(kvd_load_commit(l, 9, c, 1) == KVD_ERR_INVALID,
             "COMMIT with the wrong number of pools");
    DT_CHECK(kvd_load_commit(l, 9, c, 2) == 0, "commit");
    DT_CHECK(kvd_load_commit(l, 9, c, 2) == KVD_ERR_STATE, "a second COMMIT is refused");
    DT_CHECK(kvd_load_abort(l, 9) == KVD_ERR_STATE, "ABORT after COMMIT is refused");
    DT_CHECK(kvd_start_layer_wise_loading(l, &counter) == 0 &&
                 kvd_wait_layer(l, counter, 2) == 0,
             "the raced load runs");
    n = 0;
    for (int i = 0; i < 500 && n == 0; i++) {
        kvd_pop_completed_loads(l, done, 4, &n);
        if (n == 0) {
            struct timespec ts = {0, 10000000};
            nanosleep(&ts, NULL);
        }
    }
    DT_CHECK(n == 1 && done[0].id == 9 && done[0].success, "its completion, once");
    DT_CHECK(memcmp(k1 + 32 * BPR, ek1 + 8 * BPR, PAGES * PS * BPR) == 0,
             "the raced load's bytes are exact");
    kvd_linker_close(l);
}

int main(void)
{
    return lt_main("linker/roundtrip", run);
}
