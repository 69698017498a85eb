/*
 * Description: what a linker offloaded survives its daemon's SIGKILL. The
 * linker offloads two chains of four pages (each acknowledged); kvdockd is
 * SIGKILLed and a new one starts on the same socket and the same pool file
 * and journal (--shm-dir of the first). Without reopening anything the
 * linker reconnects (a new epoch: its namespaces registered again, the
 * pool mapped again), a lookup finds every page of both chains, and a
 * layer-wise load of them into other device rows is byte-exact; a chain
 * never offloaded is still not found.
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
#define ROWS  96
#define BPR   64

static uint8_t kbuf[ROWS * BPR], vbuf[ROWS * BPR];

static void nap(void)
{
    struct timespec ts = {0, 10000000};
    nanosleep(&ts, NULL);
}

static void make_keys(uint32_t base, uint8_t keys[PAGES][KVD_PAGE_KEY_BYTES])
{
    uint32_t tokens[PAGES * PS];
    for (int i = 0; i < PAGES * PS; i++)
        tokens[i] = base + (uint32_t)i;
    size_t n = 0;
    kvd_page_keys(tokens, PAGES * PS, PS, NULL, keys, &n);
}

static kvd_transfer_t transfer(uint32_t pool, uint8_t keys[PAGES][KVD_PAGE_KEY_BYTES],
                               int64_t *idx, int64_t first_row)
{
    for (int i = 0; i < PAGES * PS; i++)
        idx[i] = first_row + i;
    return (kvd_transfer_t){.pool_id = pool,
                            .keys = (const uint8_t(*)[KVD_PAGE_KEY_BYTES])keys,
                            .n_keys = PAGES,
                            .device_indices = idx,
                            .n_indices = PAGES * PS};
}

/* Offloads rows [first_row, first_row + 16) under keys; true once
 * acknowledged with success. */
static bool offload(kvd_linker_t *l, uint32_t pool,
                    uint8_t keys[PAGES][KVD_PAGE_KEY_BYTES], int64_t first_row)
{
    int64_t idx[PAGES * PS];
    kvd_transfer_t t = transfer(pool, keys, idx, first_row);
    uint64_t ack = 0;
    if (kvd_offload(l, &t, 1, &ack) != 0)
        return false;
    return lt_wait_done(l, false, ack, 10000);
}

/* The restorable boundaries of keys: the longest, or -1 on error. */
static int lookup(kvd_linker_t *l, uint32_t pool, uint8_t keys[PAGES][KVD_PAGE_KEY_BYTES])
{
    int64_t idx[PAGES * PS];
    kvd_transfer_t t = transfer(pool, keys, idx, 0);
    uint32_t b[PAGES];
    size_t nb = 0;
    if (kvd_lookup(l, 1, &t, 1, b, &nb) != 0)
        return -1;
    return nb ? (int)b[nb - 1] : 0;
}

/* LOAD, PREPARE and COMMIT of every page of t under rid. */
static int load(kvd_linker_t *l, uint64_t rid, const kvd_transfer_t *t)
{
    kvd_commit_pool_t all = {.adopted_begin = 0, .adopted_end = PAGES};
    int rc = kvd_load(l, rid, t, 1);
    if (rc == 0)
        rc = kvd_load_prepare(l, rid);
    return rc != 0 ? rc : kvd_load_commit(l, rid, &all, 1);
}

static void run(kvd_test_daemon_t *d1, kvd_test_daemon_t *d2)
{
    kvd_linker_config_t cfg = {
        .socket_path = d1->socket, .model_id = "persist", .timeout_ms = 2000};
    kvd_linker_t *l = NULL;
    int rc = kvd_linker_open(&cfg, &l);
    if (!DT_CHECK(rc == 0, "open: %s", kvd_strerror(rc)))
        return;
    uint32_t pool = 0;
    DT_CHECK(lt_register_kv(l, "kv", kbuf, vbuf, BPR, PS, ROWS, NULL, &pool) == 0,
             "register");
    for (size_t i = 0; i < sizeof(kbuf); i++) {
        kbuf[i] = (uint8_t)(i * 13 + 1);
        vbuf[i] = (uint8_t)(i * 7 + 2);
    }
    uint8_t a[PAGES][KVD_PAGE_KEY_BYTES], b[PAGES][KVD_PAGE_KEY_BYTES],
        never[PAGES][KVD_PAGE_KEY_BYTES];
    make_keys(100, a);
    make_keys(500, b);
    make_keys(900, never);
    DT_CHECK(offload(l, pool, a, 0), "offload of chain a");
    DT_CHECK(offload(l, pool, b, PAGES * PS), "offload of chain b");
    DT_CHECK(lookup(l, pool, a) == PAGES && lookup(l, pool, b) == PAGES,
             "both chains stored before the kill");

    kill(d1->pid, SIGKILL);
    kvd_test_wait_pid(d1->pid, 5000, NULL);
    d1->pid = 0;

    /* the same socket, the same pool file and journal */
    const char *args[] = {"--pool-size", "64M",      "--usage-interval",
                          "0",           "--socket", d1->socket,
                          "--shm-dir",   d1->dir,    NULL};
    if (!DT_CHECK(kvd_test_daemon_start(d2, args, false, 0) == 0,
                  "the second daemon did not start")) {
        kvd_linker_close(l);
        return;
    }
    /* the linker finds it on its own (errors while it is not there yet),
     * and it serves loads once its pool is ready */
    DT_CHECK(lt_wait_ready(l, 20000), "the linker should reach the new daemon");
    int found = -1;
    for (int i = 0; i < 2000 && found != PAGES; i++) {
        found = lookup(l, pool, a);
        if (found != PAGES)
            nap();
    }
    DT_CHECK(found == PAGES, "after the restart chain a has %d of %d pages", found,
             PAGES);
    DT_CHECK(kvd_test_file_contains(d2->log, "recovered 8 objects"),
             "the new daemon should log that it recovered the 8 pages");
    DT_CHECK(lookup(l, pool, b) == PAGES, "after the restart chain b is whole");
    DT_CHECK(lookup(l, pool, never) == 0, "a chain never offloaded is not found");

    /* load both into rows 32.. and 48.., byte-exact */
    memset(kbuf + 2 * PAGES * PS * BPR, 0, 2 * PAGES * PS * BPR);
    memset(vbuf + 2 * PAGES * PS * BPR, 0, 2 * PAGES * PS * BPR);
    int64_t ia[PAGES * PS], ib[PAGES * PS];
    kvd_transfer_t ta = transfer(pool, a, ia, 2 * PAGES * PS);
    kvd_transfer_t tb = transfer(pool, b, ib, 3 * PAGES * PS);
    /* one load at a time: waiting for one completion skips the others */
    uint32_t counter = 0;
    for (int k = 0; k < 2; k++) {
        uint64_t rid = 7 + (uint64_t)k;
        int r = load(l, rid, k == 0 ? &ta : &tb);
        if (!DT_CHECK(r == 0, "load of chain %c: %s", "ab"[k], kvd_strerror(r)) ||
            !DT_CHECK(kvd_start_layer_wise_loading(l, &counter) == 0 &&
                          kvd_wait_layer(l, counter, 0) == 0,
                      "layer-wise loading of chain %c", "ab"[k]))
            break;
        DT_CHECK(lt_wait_done(l, true, rid, 10000), "the load of chain %c succeeds",
                 "ab"[k]);
    }
    size_t half = 2 * PAGES * PS * BPR;
    DT_CHECK(memcmp(kbuf + half, kbuf, half) == 0 && memcmp(vbuf + half, vbuf, half) == 0,
             "the loaded rows equal the offloaded ones, byte for byte");
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
    kvd_test_daemon_stop(&d1, SIGKILL, 5000, NULL); /* its directory, the files */
    return dt_exit_status("linker/persist");
}
