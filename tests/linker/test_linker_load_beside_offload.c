/*
 * Description: a load does not wait behind an offload. Loads and offloads
 * run on their own threads, and an offload over UCX goes in batches of at
 * most 8 MiB, so a load waits for one batch at most.
 *
 * Two pools of one linker: a large one (32 pages of 4 MiB) and a small one
 * (one page of 8 KiB, stored and wiped first). The large pool's 128 MiB go
 * out in one offload (fresh keys, so every byte moves); right after
 * kvd_offload returns, the small page is loaded. Its completion must come
 * back, successful and byte-exact, before the offload's, and by then the
 * offload's byte counter (which grows object by object) must show at most
 * half of its 128 MiB copied: copying them takes far longer than the small
 * load, whatever the transport, and a load queued behind the offload's
 * copy would see all of them.
 * Then the offload comes back successful, and the daemon's pins and
 * reservations end at 0.
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

#define PS         16
#define BIG_PAGES  32
#define BIG_BPR    (128 * 1024) /* a page of one buffer: 2 MiB; an object 4 MiB */
#define BIG_ROWS   (BIG_PAGES * PS)
#define SMALL_BPR  256
#define SMALL_ROWS (2 * PS) /* stored from rows [0, PS), loaded into [PS, 2 PS) */

static uint8_t small_k[SMALL_ROWS * SMALL_BPR], small_v[SMALL_ROWS * SMALL_BPR];

static void keys_of(uint32_t base, size_t pages, uint8_t (*keys)[KVD_PAGE_KEY_BYTES])
{
    uint32_t *tokens = malloc(pages * PS * sizeof(uint32_t));
    for (size_t i = 0; tokens && i < pages * PS; i++)
        tokens[i] = base + (uint32_t)i;
    size_t n = 0;
    if (tokens)
        kvd_page_keys(tokens, pages * PS, PS, NULL, keys, &n);
    free(tokens);
}

static void run(const char *socket)
{
    uint8_t *big_k = malloc((size_t)BIG_ROWS * BIG_BPR);
    uint8_t *big_v = malloc((size_t)BIG_ROWS * BIG_BPR);
    uint8_t(*big_keys)[KVD_PAGE_KEY_BYTES] = malloc(BIG_PAGES * 32);
    int64_t *big_idx = malloc(BIG_ROWS * sizeof(int64_t));
    if (!DT_CHECK(big_k && big_v && big_keys && big_idx, "out of memory")) {
        free(big_k);
        free(big_v);
        free(big_keys);
        free(big_idx);
        return;
    }
    memset(big_k, 0x5a, (size_t)BIG_ROWS * BIG_BPR);
    memset(big_v, 0xa5, (size_t)BIG_ROWS * BIG_BPR);
    for (int i = 0; i < BIG_ROWS; i++)
        big_idx[i] = i;
    kvd_linker_config_t cfg = {
        .socket_path = socket, .model_id = "hol", .timeout_ms = 10000};
    kvd_linker_t *l = NULL;
    int rc = kvd_linker_open(&cfg, &l);
    DT_CHECK(rc == 0, "open: %s", kvd_strerror(rc));
    uint32_t big = 0, small = 0;
    if (rc == 0)
        rc = lt_register_kv(l, "big", big_k, big_v, BIG_BPR, PS, BIG_ROWS, NULL, &big);
    if (rc == 0)
        rc = lt_register_kv(l, "small", small_k, small_v, SMALL_BPR, PS, SMALL_ROWS, NULL,
                            &small);
    DT_CHECK(rc == 0, "register: %s", kvd_strerror(rc));

    /* the small page, stored first */
    for (size_t i = 0; i < PS * SMALL_BPR; i++) {
        small_k[i] = (uint8_t)(i * 13 + 1);
        small_v[i] = (uint8_t)(i * 29 + 7);
    }
    uint8_t small_key[1][KVD_PAGE_KEY_BYTES];
    keys_of(1, 1, small_key);
    int64_t store_idx[PS], load_idx[PS];
    for (int i = 0; i < PS; i++) {
        store_idx[i] = i;
        load_idx[i] = PS + i;
    }
    kvd_transfer_t st = {.pool_id = small,
                         .keys = (const uint8_t(*)[KVD_PAGE_KEY_BYTES])small_key,
                         .n_keys = 1,
                         .device_indices = store_idx,
                         .n_indices = PS};
    uint64_t ack = 0;
    bool stored = rc == 0 && kvd_offload(l, &st, 1, &ack) == 0 &&
                  lt_wait_done(l, false, ack, 10000);
    DT_CHECK(stored, "the small page was not stored");

    /* The small load is pinned, prepared and committed first, so that no
     * round trip of its own stands between the large offload's start and
     * its copy (the offload's Reserve goes first on the connection, and a
     * busy daemon answers late: the offload had a head start of that much
     * under CPU load); then the large offload, then at once the copy. */
    kvd_transfer_t lt = st;
    lt.device_indices = load_idx;
    kvd_commit_pool_t cp = {.adopted_begin = 0, .adopted_end = 1};
    rc = stored ? kvd_load(l, 7, &lt, 1) : KVD_ERR_STATE;
    if (rc == 0)
        rc = kvd_load_prepare(l, 7);
    if (rc == 0)
        rc = kvd_load_commit(l, 7, &cp, 1);
    DT_CHECK(rc == 0, "small load: %s", kvd_strerror(rc));
    keys_of(1000, BIG_PAGES, big_keys);
    kvd_transfer_t bt = {.pool_id = big,
                         .keys = (const uint8_t(*)[KVD_PAGE_KEY_BYTES])big_keys,
                         .n_keys = BIG_PAGES,
                         .device_indices = big_idx,
                         .n_indices = BIG_ROWS};
    uint64_t big_ack = 0;
    rc = rc == 0 ? kvd_offload(l, &bt, 1, &big_ack) : rc;
    DT_CHECK(rc == 0, "large offload: %s", kvd_strerror(rc));
    uint32_t counter = 0;
    if (rc == 0)
        rc = kvd_start_layer_wise_loading(l, &counter);
    if (rc == 0)
        rc = kvd_wait_layer(l, counter, 0);
    DT_CHECK(rc == 0, "small load's copy: %s", kvd_strerror(rc));
    /* The load's completion first. The offload must not be back yet, and
     * must have copied at most half of its bytes (its counter grows object
     * by object): a load that waited for the whole copy, and only raced
     * the offload's Publish, fails here. Both are looked at the moment the
     * load's bytes are in place and its completion is out, without a nap
     * in between (100 us naps): the offload, no longer yielding to a load,
     * copies on at full speed meanwhile, and a look 10 ms (plus a wake-up
     * on a busy CPU) later saw its progress then, not at the load's end. */
    kvd_pool_stats_t bs = {0};
    kvd_completion_t c;
    size_t n = 0;
    bool loaded = false, offload_first = false;
    for (long i = 0; rc == 0 && i < 300000 && !loaded && !offload_first; i++) {
        kvd_completion_t lc[4];
        size_t k = 0;
        kvd_pop_completed_loads(l, lc, 4, &k);
        for (size_t j = 0; j < k; j++)
            if (lc[j].id == 7) {
                kvd_stats(l, big, &bs); /* first: it only grows */
                kvd_pop_completed_offloads(l, &c, 1, &n);
                loaded = lc[j].success;
                offload_first = n == 1; /* it was back before the load's */
                break;
            }
        if (k == 0) {
            kvd_pop_completed_offloads(l, &c, 1, &n);
            offload_first = n == 1;
        }
        if (!loaded && !offload_first && k == 0) {
            struct timespec ts = {0, 100000}; /* not a spin: the CPUs are the copies' */
            nanosleep(&ts, NULL);
        }
    }
    DT_CHECK(loaded || offload_first, "the small load did not come back successful");
    DT_CHECK(!offload_first, "the small load waited behind the offload");
    uint64_t big_bytes = (uint64_t)BIG_ROWS * BIG_BPR * 2;
    printf("the offload had copied %llu of %llu bytes when the small load was back\n",
           (unsigned long long)bs.offload_bytes, (unsigned long long)big_bytes);
    DT_CHECK(bs.offload_bytes <= big_bytes / 2,
             "the offload had copied %llu of %llu bytes when the small load was done",
             (unsigned long long)bs.offload_bytes, (unsigned long long)big_bytes);
    bool offloaded = rc == 0 && (n == 1 ? c.id == big_ack && c.success
                                        : lt_wait_done(l, false, big_ack, 60000));
    DT_CHECK(offloaded, "the large offload did not come back successful");
    DT_CHECK(memcmp(small_k + PS * SMALL_BPR, small_k, PS * SMALL_BPR) == 0 &&
                 memcmp(small_v + PS * SMALL_BPR, small_v, PS * SMALL_BPR) == 0,
             "the small page's bytes are not what was stored");
    kvd_linker_close(l);
    for (int waited = 0; waited < 5000; waited += 10) {
        kvd_stats_rep_t s;
        if (dt_stats_fresh(socket, &s) == KVD_OK && s.store.pins == 0 &&
            s.store.objects_writing == 0)
            break;
        struct timespec ts = {0, 10000000};
        nanosleep(&ts, NULL);
    }
    kvd_stats_rep_t s;
    DT_CHECK(dt_stats_fresh(socket, &s) == KVD_OK && s.store.pins == 0 &&
                 s.store.objects_writing == 0,
             "pins or writing objects stay");
    free(big_k);
    free(big_v);
    free(big_keys);
    free(big_idx);
}

int main(void)
{
    kvd_test_daemon_t d = {0};
    const char *args[] = {"--pool-size", "256M", NULL};
    if (dt_start(&d, args) != 0)
        return dt_exit_status("linker/load_beside_offload");
    run(d.socket);
    dt_stop(&d, SIGTERM, 10000);
    return dt_exit_status("linker/load_beside_offload");
}
