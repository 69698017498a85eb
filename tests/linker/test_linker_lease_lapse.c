/*
 * Description: a load whose read leases lapse before its bytes are copied
 * fails, and one whose leases stand succeeds, over two pools at once (a
 * paged KV pool and a slot-addressed state pool: two leases, asked for and
 * released in one round trip each). kvdockd runs with --lease-ttl 1000.
 *
 *  1. Offload four KV pages and one state slot; wipe the buffers; load:
 *     (rid, true), the bytes are back byte for byte, and the daemon's pins
 *     and leases return to 0 (the Release may follow the completion).
 *  2. LOAD, PREPARE, COMMIT, then wait until the daemon has ended both
 *     leases by their TTL before starting the copy: (rid, false) once, the
 *     pools count a load failure, nothing stays pinned.
 *  3. A LOAD whose state key is not stored: refused, no pin left (all or
 *     nothing across the pipelined Acquires); ABORT hands its indices back.
 *  4. The connection is as good as before: a fresh load succeeds.
 * The linker here runs with spin_us < 0: its threads sleep until each
 * start and each layer instead of polling for them.
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

#define PS      4
#define PAGES   4
#define ROWS    (PAGES * PS)
#define BPR     256
#define STATE_A 512
#define TTL_MS  1000

static uint8_t kbuf[ROWS * BPR], vbuf[ROWS * BPR], sbuf[2 * STATE_A];
static uint8_t kwant[ROWS * BPR], vwant[ROWS * BPR], swant[2 * STATE_A];
static size_t n_freed;

static void on_free(void *ctx, const int64_t *idx, size_t n)
{
    (void)ctx;
    (void)idx;
    n_freed += n;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Polls the daemon's Stats until pins and leases are both 0 (true) or
 * timeout_ms passes. */
static bool wait_store_idle(const char *socket, int timeout_ms)
{
    for (int waited = 0; waited <= timeout_ms; waited += 10) {
        kvd_stats_rep_t st;
        if (dt_stats_fresh(socket, &st) == KVD_OK && st.store.pins == 0 &&
            st.store.leases == 0)
            return true;
        sleep_ms(10);
    }
    return false;
}

/* Pops until rid comes back; returns 1 success, 0 failure, -1 never. Also
 * checks that it comes back once. */
static int wait_rid(kvd_linker_t *l, uint64_t rid)
{
    int seen = -1;
    for (int waited = 0; waited <= 5000; waited += 10) {
        kvd_completion_t c[4];
        size_t n = 0;
        kvd_pop_completed_loads(l, c, 4, &n);
        for (size_t j = 0; j < n; j++) {
            DT_CHECK(c[j].id == rid, "completion of rid %llu, want %llu",
                     (unsigned long long)c[j].id, (unsigned long long)rid);
            DT_CHECK(seen < 0, "rid %llu came back twice", (unsigned long long)rid);
            seen = c[j].success ? 1 : 0;
        }
        if (seen >= 0 && waited >= 100)
            return seen; /* and nothing more came for 100 ms */
        sleep_ms(10);
    }
    return seen;
}

static void keys_of(uint32_t base, uint8_t keys[PAGES][KVD_PAGE_KEY_BYTES])
{
    uint32_t tokens[ROWS];
    for (int i = 0; i < ROWS; i++)
        tokens[i] = base + (uint32_t)i;
    size_t n = 0;
    kvd_page_keys(tokens, ROWS, PS, NULL, keys, &n);
}

static int64_t kv_idx[ROWS], state_idx[1] = {1};
static uint8_t keys[PAGES][KVD_PAGE_KEY_BYTES], other[PAGES][KVD_PAGE_KEY_BYTES];

static void make_transfers(kvd_transfer_t t[2], uint32_t kv, uint32_t st,
                           uint8_t (*state_key)[KVD_PAGE_KEY_BYTES])
{
    t[0] = (kvd_transfer_t){.pool_id = kv,
                            .keys = (const uint8_t(*)[KVD_PAGE_KEY_BYTES])keys,
                            .n_keys = PAGES,
                            .device_indices = kv_idx,
                            .n_indices = ROWS};
    t[1] = (kvd_transfer_t){.pool_id = st,
                            .keys = (const uint8_t(*)[KVD_PAGE_KEY_BYTES])state_key,
                            .n_keys = 1,
                            .device_indices = state_idx,
                            .n_indices = 1,
                            .first_depth = PAGES - 1};
}

/* LOAD, PREPARE, COMMIT of both transfers with everything adopted. */
static int load_commit(kvd_linker_t *l, uint64_t rid, const kvd_transfer_t t[2])
{
    kvd_commit_pool_t cp[2] = {{.adopted_begin = 0, .adopted_end = PAGES}, {0}};
    int rc = kvd_load(l, rid, t, 2);
    if (rc == 0)
        rc = kvd_load_prepare(l, rid);
    if (rc == 0)
        rc = kvd_load_commit(l, rid, cp, 2);
    return rc;
}

/* Starts the committed loads and waits for every layer (0 and 1). */
static int run_layers(kvd_linker_t *l)
{
    uint32_t counter = 0;
    int rc = kvd_start_layer_wise_loading(l, &counter);
    for (uint32_t layer = 0; rc == 0 && layer < 2; layer++)
        rc = kvd_wait_layer(l, counter, layer);
    return rc;
}

static void wipe(void)
{
    memset(kbuf, 0, sizeof(kbuf));
    memset(vbuf, 0, sizeof(vbuf));
    memset(sbuf, 0, sizeof(sbuf));
}

static bool bytes_back(void)
{
    return memcmp(kbuf, kwant, sizeof(kbuf)) == 0 &&
           memcmp(vbuf, vwant, sizeof(vbuf)) == 0 &&
           memcmp(sbuf + STATE_A, swant + STATE_A, STATE_A) == 0;
}

static void run(const char *socket)
{
    /* threads sleep at once here (every other test runs with the default:
     * they poll a while first) */
    kvd_linker_config_t cfg = {
        .socket_path = socket, .model_id = "lapse", .timeout_ms = 5000, .spin_us = -1};
    kvd_linker_t *l = NULL;
    int rc = kvd_linker_open(&cfg, &l);
    DT_CHECK(rc == 0, "open: %s", kvd_strerror(rc));
    if (rc != 0)
        return;
    kvd_pool_layer_t st_layer = {
        .layer_id = 1, .n_buffers = 1, .buffers = {{sbuf, STATE_A, STATE_A}}};
    kvd_pool_desc_t st = {.name = "state",
                          .addressing = KVD_ADDR_SLOT,
                          .n_rows = 2,
                          .trailing_pages = 1,
                          .memory = KVD_MEM_HOST,
                          .n_layers = 1,
                          .layers = &st_layer,
                          .free_indices = on_free};
    uint32_t kv_id = 0, st_id = 0;
    rc = lt_register_kv(l, "kv", kbuf, vbuf, BPR, PS, ROWS, on_free, &kv_id);
    if (rc == 0)
        rc = kvd_register_pool(l, &st, &st_id);
    DT_CHECK(rc == 0, "register: %s", kvd_strerror(rc));
    for (size_t i = 0; i < sizeof(kwant); i++) {
        kwant[i] = (uint8_t)(i * 7 + 1);
        vwant[i] = (uint8_t)(i * 13 + 5);
    }
    for (size_t i = 0; i < sizeof(swant); i++)
        swant[i] = (uint8_t)(i * 3 + 9);
    for (int i = 0; i < ROWS; i++)
        kv_idx[i] = i;
    keys_of(100, keys);
    keys_of(900, other);
    memcpy(kbuf, kwant, sizeof(kbuf));
    memcpy(vbuf, vwant, sizeof(vbuf));
    memcpy(sbuf, swant, sizeof(sbuf));
    /* the state of the node at the fourth page: the last page's key */
    uint8_t state_key[1][KVD_PAGE_KEY_BYTES], missing[1][KVD_PAGE_KEY_BYTES];
    memcpy(state_key[0], keys[PAGES - 1], KVD_PAGE_KEY_BYTES);
    memcpy(missing[0], other[PAGES - 1], KVD_PAGE_KEY_BYTES);
    kvd_transfer_t t[2];
    make_transfers(t, kv_id, st_id, state_key);
    uint64_t ack = 0;
    if (rc == 0)
        rc = kvd_offload(l, t, 2, &ack);
    bool stored = false;
    for (int waited = 0; rc == 0 && waited <= 5000 && !stored; waited += 10) {
        kvd_completion_t c;
        size_t n = 0;
        kvd_pop_completed_offloads(l, &c, 1, &n);
        if (n == 1) {
            DT_CHECK(c.id == ack && c.success, "offload came back failed");
            stored = c.success;
        }
        sleep_ms(n ? 0 : 10);
    }
    DT_CHECK(stored, "the offload never completed");
    if (!stored) {
        kvd_linker_close(l);
        return;
    }

    /* 1. leases that stand: success, bytes back, pins and leases end */
    wipe();
    rc = load_commit(l, 1, t);
    DT_CHECK(rc == 0, "1: load: %s", kvd_strerror(rc));
    rc = rc == 0 ? run_layers(l) : rc;
    DT_CHECK(rc == 0, "1: layers: %s", kvd_strerror(rc));
    DT_CHECK(wait_rid(l, 1) == 1, "1: the load did not come back successful");
    DT_CHECK(bytes_back(), "1: the bytes are not what was offloaded");
    DT_CHECK(wait_store_idle(socket, 5000), "1: pins or leases stay after the load");

    /* 2. leases ended by their TTL before the copy: the load fails */
    kvd_pool_stats_t before_kv = {0}, before_st = {0}, after_kv = {0}, after_st = {0};
    kvd_stats(l, kv_id, &before_kv);
    kvd_stats(l, st_id, &before_st);
    wipe();
    rc = load_commit(l, 2, t);
    DT_CHECK(rc == 0, "2: load: %s", kvd_strerror(rc));
    kvd_stats_rep_t sr;
    DT_CHECK(dt_stats_fresh(socket, &sr) == KVD_OK && sr.store.leases == 2 &&
                 sr.store.pins == PAGES + 1,
             "2: the daemon holds %llu leases and %llu pins, want 2 and %d",
             (unsigned long long)sr.store.leases, (unsigned long long)sr.store.pins,
             PAGES + 1);
    DT_CHECK(wait_store_idle(socket, 20 * TTL_MS), "2: the leases did not lapse");
    rc = run_layers(l);
    DT_CHECK(rc == 0, "2: layers: %s", kvd_strerror(rc));
    DT_CHECK(wait_rid(l, 2) == 0, "2: a load whose leases lapsed did not fail");
    kvd_stats(l, kv_id, &after_kv);
    kvd_stats(l, st_id, &after_st);
    DT_CHECK(after_kv.load_failures == before_kv.load_failures + 1 &&
                 after_st.load_failures == before_st.load_failures + 1,
             "2: load failures %llu/%llu, want one more each",
             (unsigned long long)after_kv.load_failures,
             (unsigned long long)after_st.load_failures);
    DT_CHECK(wait_store_idle(socket, 5000), "2: pins or leases stay");

    /* 3. the state key is not stored: all or nothing */
    kvd_transfer_t bad[2];
    make_transfers(bad, kv_id, st_id, missing);
    size_t freed_before = n_freed;
    rc = kvd_load(l, 3, bad, 2);
    DT_CHECK(rc == KVD_ERR_NOT_FOUND, "3: load of a missing key: %s, want not found",
             kvd_strerror(rc));
    kvd_stats_rep_t s3;
    DT_CHECK(dt_stats_fresh(socket, &s3) == KVD_OK && s3.store.pins == 0 &&
                 s3.store.leases == 0,
             "3: a refused load left %llu pins and %llu leases",
             (unsigned long long)s3.store.pins, (unsigned long long)s3.store.leases);
    rc = kvd_load_abort(l, 3);
    DT_CHECK(rc == 0, "3: abort: %s", kvd_strerror(rc));
    DT_CHECK(n_freed - freed_before == ROWS + 1,
             "3: abort handed back %zu indices, want %d", n_freed - freed_before,
             ROWS + 1);

    /* 4. and the next load is fine */
    wipe();
    rc = load_commit(l, 4, t);
    rc = rc == 0 ? run_layers(l) : rc;
    DT_CHECK(rc == 0, "4: load: %s", kvd_strerror(rc));
    DT_CHECK(wait_rid(l, 4) == 1, "4: the load did not come back successful");
    DT_CHECK(bytes_back(), "4: the bytes are not what was offloaded");
    DT_CHECK(wait_store_idle(socket, 5000), "4: pins or leases stay");
    kvd_linker_close(l);
}

int main(void)
{
    kvd_test_daemon_t d = {0};
    char ttl[16];
    snprintf(ttl, sizeof(ttl), "%d", TTL_MS);
    const char *args[] = {"--lease-ttl", ttl, NULL};
    if (dt_start(&d, args) != 0)
        return dt_exit_status("linker/lease_lapse");
    run(d.socket);
    dt_stop(&d, SIGTERM, 5000);
    return dt_exit_status("linker/lease_lapse");
}
