/*
 * Description: the daemon dies under the linker and comes back. With a
 * load committed and an offload queued while kvdockd is SIGKILLed, every
 * queued load and offload still comes back exactly once, as failed, and
 * nothing hangs (every wait is bounded by the linker's timeout). Once a new
 * kvdockd serves the same socket, the next call reconnects: the pools'
 * namespaces are registered again, the new pool is mapped, and an offload
 * followed by a load round-trips byte-exact.
 */
#include "harness.h"
#include "kvd_common.h" /* the status codes */
#include "kvdock.h"
#include "ltest.h"

#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>

#define PS    4
#define PAGES 4
#define ROWS  64
#define BPR   64

static uint8_t kbuf[ROWS * BPR], vbuf[ROWS * BPR];

static void nap(void)
{
    struct timespec ts = {0, 10000000};
    nanosleep(&ts, NULL);
}

/* Pops completions (loads or offloads) for up to 10 s; returns how many
 * came back for id, and their success in *ok (all of them). */
static int collect(kvd_linker_t *l, bool loads, uint64_t id, bool *ok)
{
    int seen = 0;
    *ok = true;
    for (int i = 0; i < 1000; i++) {
        kvd_completion_t c[8];
        size_t n = 0;
        if (loads)
            kvd_pop_completed_loads(l, c, 8, &n);
        else
            kvd_pop_completed_offloads(l, c, 8, &n);
        for (size_t k = 0; k < n; k++) {
            if (c[k].id == id) {
                seen++;
                *ok &= c[k].success;
            }
        }
        if (seen > 0 && i > 20)
            break; /* a while longer, to catch a second completion */
        nap();
    }
    return seen;
}

static void make_keys(uint32_t base, uint8_t keys[PAGES][KVD_PAGE_KEY_BYTES])
{
    uint32_t tokens[PAGES * PS];
    for (int i = 0; i < PAGES * PS; i++)
        tokens[i] = base + (uint32_t)i;
    size_t n = 0;
    kvd_page_keys(tokens, PAGES * PS, PS, NULL, keys, &n);
}

static int offload(kvd_linker_t *l, uint32_t pool,
                   uint8_t keys[PAGES][KVD_PAGE_KEY_BYTES], uint64_t *ack)
{
    int64_t idx[PAGES * PS];
    for (int i = 0; i < PAGES * PS; i++)
        idx[i] = i;
    kvd_transfer_t t = {.pool_id = pool,
                        .keys = (const uint8_t(*)[KVD_PAGE_KEY_BYTES])keys,
                        .n_keys = PAGES,
                        .device_indices = idx,
                        .n_indices = PAGES * PS};
    return kvd_offload(l, &t, 1, ack);
}

/* LOAD and PREPARE into rows 32.. (no COMMIT). */
static int pin_prepare(kvd_linker_t *l, uint32_t pool,
                       uint8_t keys[PAGES][KVD_PAGE_KEY_BYTES], uint64_t rid)
{
    int64_t idx[PAGES * PS];
    for (int i = 0; i < PAGES * PS; i++)
        idx[i] = 32 + i;
    kvd_transfer_t t = {.pool_id = pool,
                        .keys = (const uint8_t(*)[KVD_PAGE_KEY_BYTES])keys,
                        .n_keys = PAGES,
                        .device_indices = idx,
                        .n_indices = PAGES * PS};
    int rc = kvd_load(l, rid, &t, 1);
    return rc != 0 ? rc : kvd_load_prepare(l, rid);
}

static int commit(kvd_linker_t *l, uint64_t rid)
{
    kvd_commit_pool_t c = {.adopted_begin = 0, .adopted_end = PAGES};
    return kvd_load_commit(l, rid, &c, 1);
}

static int load(kvd_linker_t *l, uint32_t pool, uint8_t keys[PAGES][KVD_PAGE_KEY_BYTES],
                uint64_t rid)
{
    int rc = pin_prepare(l, pool, keys, rid);
    return rc != 0 ? rc : commit(l, rid);
}

static void run(kvd_test_daemon_t *d1, kvd_test_daemon_t *d2)
{
    kvd_linker_config_t cfg = {
        .socket_path = d1->socket, .model_id = "death", .timeout_ms = 2000};
    kvd_linker_t *l = NULL;
    int rc = kvd_linker_open(&cfg, &l);
    DT_CHECK(rc == 0, "open: %s", kvd_strerror(rc));
    if (rc != 0)
        return;
    uint32_t pool = 0;
    DT_CHECK(lt_register_kv(l, "kv", kbuf, vbuf, BPR, PS, ROWS, NULL, &pool) == 0,
             "register");
    uint8_t keys[PAGES][KVD_PAGE_KEY_BYTES], keys2[PAGES][KVD_PAGE_KEY_BYTES];
    make_keys(100, keys);
    make_keys(900, keys2);
    for (size_t i = 0; i < sizeof(kbuf); i++) {
        kbuf[i] = (uint8_t)(i * 13 + 1);
        vbuf[i] = (uint8_t)(i * 7 + 2);
    }
    uint64_t ack = 0;
    bool ok = false;
    DT_CHECK(offload(l, pool, keys, &ack) == 0 && collect(l, false, ack, &ok) == 1 && ok,
             "the first offload should succeed once");

    /* a load pinned and prepared on this daemon, committed only once the
     * linker is on the next one (rid 14, below) */
    DT_CHECK(pin_prepare(l, pool, keys, 14) == 0, "pin and prepare");
    /* a load committed, then the daemon dies before its copies run */
    DT_CHECK(load(l, pool, keys, 11) == 0, "load and commit");
    kill(d1->pid, SIGKILL);
    kvd_test_wait_pid(d1->pid, 5000, NULL);
    d1->pid = 0;
    uint32_t counter = 0;
    DT_CHECK(kvd_start_layer_wise_loading(l, &counter) == 0, "start");
    rc = kvd_wait_layer(l, counter, 0); /* returns: in place or failed, never hangs */
    DT_CHECK(rc == 0 || rc < 0, "wait_layer returned %d", rc);
    int seen = collect(l, true, 11, &ok);
    DT_CHECK(seen == 1 && !ok, "the load comes back once, failed: %d times, ok %d", seen,
             ok);

    /* an offload while nobody serves: failed, once */
    DT_CHECK(offload(l, pool, keys2, &ack) == 0, "queueing an offload still works");
    seen = collect(l, false, ack, &ok);
    DT_CHECK(seen == 1 && !ok, "the offload comes back once, failed: %d times, ok %d",
             seen, ok);

    /* a new daemon on the same socket: the next calls reconnect */
    const char *args[] = {"--pool-size", "64M", "--usage-interval", "0", "--socket",
                          d1->socket,    NULL};
    if (!DT_CHECK(kvd_test_daemon_start(d2, args, false, 0) == 0,
                  "the second daemon did not start")) {
        kvd_linker_close(l);
        return;
    }
    DT_CHECK(lt_wait_ready(l, 10000), "the linker should reach the new daemon");
    DT_CHECK(offload(l, pool, keys2, &ack) == 0 && collect(l, false, ack, &ok) == 1 && ok,
             "an offload to the new daemon succeeds once");

    /* rid 14's pins and offsets were the dead daemon's: its offsets mean
     * nothing in the new mapping, so it fails and writes no row */
    memset(kbuf + 32 * BPR, 0xEE, PAGES * PS * BPR);
    memset(vbuf + 32 * BPR, 0xEE, PAGES * PS * BPR);
    DT_CHECK(commit(l, 14) == 0, "commit after the reconnection");
    DT_CHECK(kvd_start_layer_wise_loading(l, &counter) == 0, "start");
    uint32_t failed_counter = counter;
    kvd_wait_layer(l, counter, 0);
    DT_CHECK(collect(l, true, 14, &ok) == 1 && !ok,
             "a load pinned on the dead daemon fails once after the reconnection");
    bool untouched = true;
    for (size_t i = 32 * BPR; i < (32 + PAGES * PS) * BPR; i++)
        untouched &= kbuf[i] == 0xEE && vbuf[i] == 0xEE;
    DT_CHECK(untouched, "a stale load writes no device row");

    /* a late wait on a batch the linker no longer keeps (64 finished batches
     * are kept) says in place: rid 14 failed alone (its completion says so),
     * the batch had no error */
    for (int i = 0; i < 70; i++)
        DT_CHECK(kvd_start_layer_wise_loading(l, &counter) == 0, "empty batch");
    uint32_t empty_counter = failed_counter + 5;
    DT_CHECK(
        load(l, pool, keys2, 15) == 0 && kvd_start_layer_wise_loading(l, &counter) == 0 &&
            kvd_wait_layer(l, counter, 0) == 0 && collect(l, true, 15, &ok) == 1 && ok,
        "a load after many batches");
    DT_CHECK(kvd_wait_layer(l, failed_counter, 0) == 0 &&
                 kvd_wait_layer(l, empty_counter, 0) == 0,
             "a late wait on a forgotten batch without error");
    DT_CHECK(kvd_wait_layer(l, counter + 1, 0) == KVD_ERR_NOT_FOUND,
             "a wait on a batch never started");
    uint8_t want_k[PAGES * PS * BPR], want_v[PAGES * PS * BPR];
    memcpy(want_k, kbuf, sizeof(want_k));
    memcpy(want_v, vbuf, sizeof(want_v));
    memset(kbuf + 32 * BPR, 0, PAGES * PS * BPR);
    memset(vbuf + 32 * BPR, 0, PAGES * PS * BPR);
    DT_CHECK(load(l, pool, keys2, 12) == 0, "load from the new daemon");
    DT_CHECK(kvd_start_layer_wise_loading(l, &counter) == 0 &&
                 kvd_wait_layer(l, counter, 0) == 0,
             "layer-wise loading from the new daemon");
    DT_CHECK(collect(l, true, 12, &ok) == 1 && ok, "that load succeeds once");
    DT_CHECK(memcmp(kbuf + 32 * BPR, want_k, sizeof(want_k)) == 0 &&
                 memcmp(vbuf + 32 * BPR, want_v, sizeof(want_v)) == 0,
             "the bytes from the new daemon are exact");
    kvd_linker_close(l);
}

int main(void)
{
    kvd_test_daemon_t d1, d2 = {0};
    const char *args[] = {"--pool-size", "64M", "--usage-interval", "0", NULL};
    if (kvd_test_daemon_start(&d1, args, true, 30000) != 0)
        return 1;
    run(&d1, &d2);
    DT_CHECK(d2.pid <= 0 || kvd_test_daemon_stop(&d2, SIGTERM, 10000, NULL) == 0,
             "the second daemon did not exit on SIGTERM");
    kvd_test_daemon_stop(&d1, SIGKILL, 5000, NULL); /* its directory */
    return dt_exit_status("linker/daemon_death");
}
