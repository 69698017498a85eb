/*
 * Description: arguments the linker must refuse with KVD_ERR_INVALID, each
 * with nothing done:
 *  - kvd_page_keys with NULL outputs (it wrote through them);
 *  - kvd_linker_open with tp_rank 2 of 2, 5 of 1, -1, and pp or cp ranks
 *    outside their sizes (it opened, naming another rank's namespace);
 *  - kvd_register_pool with one layer id twice in a pool (registered);
 *  - kvd_load naming one pool in two transfers, or two pages of a transfer
 *    on the same device rows (accepted: the copy wrote the rows twice and
 *    ABORT handed the engine's allocator the same indices twice). Refused,
 *    nothing is recorded: a later load of the rid works, ABORT of the
 *    refused one finds nothing, and no index came back twice.
 * What is valid still works: the same layer id in two pools, the same rows
 * in two pools, a valid rank.
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

#define PS   4
#define ROWS 64
#define BPR  32

static uint8_t k1[ROWS * BPR], v1[ROWS * BPR], k2[ROWS * BPR], v2[ROWS * BPR];

/* Every index handed back, counted per row. */
static int freed[2][ROWS];
static void free_pool0(void *ctx, const int64_t *idx, size_t n)
{
    (void)ctx;
    for (size_t i = 0; i < n; i++)
        if (idx[i] >= 0 && idx[i] < ROWS)
            freed[0][idx[i]]++;
}
static void free_pool1(void *ctx, const int64_t *idx, size_t n)
{
    (void)ctx;
    for (size_t i = 0; i < n; i++)
        if (idx[i] >= 0 && idx[i] < ROWS)
            freed[1][idx[i]]++;
}

static void check_page_keys(void)
{
    uint32_t tokens[2 * PS] = {1, 2, 3, 4, 5, 6, 7, 8};
    uint8_t keys[2][KVD_PAGE_KEY_BYTES];
    size_t n = 0;
    DT_CHECK(kvd_page_keys(tokens, 2 * PS, PS, NULL, NULL, &n) == KVD_ERR_INVALID,
             "kvd_page_keys with keys NULL");
    DT_CHECK(kvd_page_keys(tokens, 2 * PS, PS, NULL, keys, NULL) == KVD_ERR_INVALID,
             "kvd_page_keys with n_keys NULL");
    DT_CHECK(kvd_page_keys(tokens, 2 * PS, PS, NULL, NULL, NULL) == KVD_ERR_INVALID,
             "kvd_page_keys with both outputs NULL");
    DT_CHECK(kvd_page_keys(tokens, 2 * PS, PS, NULL, keys, &n) == 0 && n == 2,
             "kvd_page_keys with outputs");
}

static void check_ranks(const char *socket)
{
    struct {
        int tp_rank, tp_size, pp_rank, pp_size, cp_rank, cp_size;
    } bad[] = {
        {2, 2, 0, 1, 0, 1}, {5, 1, 0, 1, 0, 1},  {-1, 1, 0, 1, 0, 1}, {-1, 4, 0, 1, 0, 1},
        {1, 0, 0, 1, 0, 1}, /* size 0 means 1 */
        {0, 1, 3, 2, 0, 1}, {0, 1, -1, 2, 0, 1}, {0, 1, 0, 1, 2, 2},  {0, 1, 0, 1, -2, 0},
    };
    for (size_t i = 0; i < KVD_ARRAY_SIZE(bad); i++) {
        kvd_linker_config_t cfg = {.socket_path = socket,
                                   .model_id = "ranks",
                                   .timeout_ms = 5000,
                                   .tp_rank = bad[i].tp_rank,
                                   .tp_size = bad[i].tp_size,
                                   .pp_rank = bad[i].pp_rank,
                                   .pp_size = bad[i].pp_size,
                                   .cp_rank = bad[i].cp_rank,
                                   .cp_size = bad[i].cp_size};
        kvd_linker_t *l = NULL;
        int rc = kvd_linker_open(&cfg, &l);
        DT_CHECK(rc == KVD_ERR_INVALID && l == NULL,
                 "open with tp %d/%d pp %d/%d cp %d/%d: %s", bad[i].tp_rank,
                 bad[i].tp_size, bad[i].pp_rank, bad[i].pp_size, bad[i].cp_rank,
                 bad[i].cp_size, kvd_strerror(rc));
        if (l != NULL)
            kvd_linker_close(l);
    }
    kvd_linker_config_t ok = {.socket_path = socket,
                              .model_id = "ranks",
                              .timeout_ms = 5000,
                              .tp_rank = 1,
                              .tp_size = 2,
                              .pp_rank = 1,
                              .pp_size = 2,
                              .cp_rank = 0,
                              .cp_size = 2};
    kvd_linker_t *l = NULL;
    int rc = kvd_linker_open(&ok, &l);
    DT_CHECK(rc == 0, "open with tp 1/2 pp 1/2 cp 0/2: %s", kvd_strerror(rc));
    kvd_linker_close(l);
}

static int register_pool(kvd_linker_t *l, const char *name, uint8_t *k, uint8_t *v,
                         uint32_t id0, uint32_t id1, int n_layers, kvd_free_indices_fn fn,
                         uint32_t *pool)
{
    kvd_pool_layer_t layers[2] = {
        {.layer_id = id0, .n_buffers = 1, .buffers = {{k, BPR, BPR}}},
        {.layer_id = id1, .n_buffers = 1, .buffers = {{v, BPR, BPR}}},
    };
    kvd_pool_desc_t d = {.name = name,
                         .addressing = KVD_ADDR_PAGED,
                         .page_size = PS,
                         .n_rows = ROWS,
                         .memory = KVD_MEM_HOST,
                         .n_layers = (uint32_t)n_layers,
                         .layers = layers,
                         .free_indices = fn};
    return kvd_register_pool(l, &d, pool);
}

static void check_pools_and_loads(const char *socket)
{
    kvd_linker_config_t cfg = {
        .socket_path = socket, .model_id = "args", .timeout_ms = 5000};
    kvd_linker_t *l = NULL;
    int rc = kvd_linker_open(&cfg, &l);
    if (!DT_CHECK(rc == 0, "open: %s", kvd_strerror(rc)))
        return;
    uint32_t p0 = 99, p1 = 99, bad = 99;
    rc = register_pool(l, "dup", k1, v1, 3, 3, 2, NULL, &bad);
    DT_CHECK(rc == KVD_ERR_INVALID && bad == 99, "a pool with layer 3 twice: %s",
             kvd_strerror(rc));
    /* layers 0 and 1 in both pools: a layer may have buffers in two pools */
    rc = register_pool(l, "a", k1, v1, 0, 1, 2, free_pool0, &p0);
    DT_CHECK(rc == 0, "pool a: %s", kvd_strerror(rc));
    rc = register_pool(l, "b", k2, v2, 0, 1, 2, free_pool1, &p1);
    DT_CHECK(rc == 0, "pool b (the same layer ids as a): %s", kvd_strerror(rc));
    DT_CHECK(p0 == 0 && p1 == 1, "pool ids %u %u: the refused pool took an id", p0, p1);

    /* two pages stored in both pools */
    uint32_t tokens[2 * PS];
    for (int i = 0; i < 2 * PS; i++)
        tokens[i] = 40 + (uint32_t)i;
    uint8_t keys[2][KVD_PAGE_KEY_BYTES];
    size_t nk = 0;
    kvd_page_keys(tokens, 2 * PS, PS, NULL, keys, &nk);
    int64_t rows[2 * PS], dup_rows[2 * PS], load_rows[2 * PS];
    for (int i = 0; i < 2 * PS; i++) {
        rows[i] = i;
        dup_rows[i] = 16 + i % PS; /* both pages on rows 16..19 */
        load_rows[i] = 32 + i;
    }
    kvd_transfer_t t0 = {.pool_id = p0,
                         .keys = (const uint8_t(*)[KVD_PAGE_KEY_BYTES])keys,
                         .n_keys = 2,
                         .device_indices = rows,
                         .n_indices = 2 * PS};
    kvd_transfer_t t1 = t0;
    t1.pool_id = p1;
    kvd_transfer_t both[2] = {t0, t1};
    uint64_t ack = 0;
    DT_CHECK(kvd_offload(l, both, 2, &ack) == 0 && lt_wait_done(l, false, ack, 10000),
             "storing two pages in both pools");

    /* one pool twice */
    t0.device_indices = t1.device_indices = load_rows;
    kvd_transfer_t twice[2] = {t0, t0};
    rc = kvd_load(l, 5, twice, 2);
    DT_CHECK(rc == KVD_ERR_INVALID, "a load naming pool a twice: %s", kvd_strerror(rc));
    DT_CHECK(kvd_load_abort(l, 5) == KVD_ERR_NOT_FOUND,
             "the refused load was recorded (ABORT found it)");
    /* two pages on rows 16..19 */
    kvd_transfer_t dup = t0;
    dup.device_indices = dup_rows;
    rc = kvd_load(l, 6, &dup, 1);
    DT_CHECK(rc == KVD_ERR_INVALID, "a load of two pages on the same rows: %s",
             kvd_strerror(rc));
    DT_CHECK(kvd_load_abort(l, 6) == KVD_ERR_NOT_FOUND,
             "the refused load was recorded (ABORT found it)");
    /* the same rows in two pools are two pools' rows: fine */
    kvd_transfer_t ok2[2] = {t0, t1};
    rc = kvd_load(l, 5, ok2, 2);
    DT_CHECK(rc == 0, "a load of both pools on rows 32..39 of each: %s",
             kvd_strerror(rc));
    DT_CHECK(kvd_load_abort(l, 5) == 0, "abort of the valid load");
    for (int r = 0; r < ROWS; r++) {
        int want = r >= 32 && r < 40;
        DT_CHECK(freed[0][r] == want && freed[1][r] == want,
                 "row %d handed back %d and %d times, want %d", r, freed[0][r],
                 freed[1][r], want);
    }
    kvd_linker_close(l);
}

int main(void)
{
    check_page_keys();
    kvd_test_daemon_t d = {0};
    if (dt_start(&d, NULL) != 0)
        return dt_exit_status("linker/args");
    check_ranks(d.socket);
    check_pools_and_loads(d.socket);
    dt_stop(&d, SIGTERM, 10000);
    return dt_exit_status("linker/args");
}
