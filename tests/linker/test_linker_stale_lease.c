/*
 * Description: a lease of a dead daemon is never sent to its successor.
 * A restarted kvdockd numbers leases from 1 again, so the id of a lease
 * taken on the first daemon can name one of this linker's leases on the
 * second, and releasing it there would end that lease.
 *
 * On daemon 1: offload four pages (lease 1), then LOAD and PREPARE rid 14
 * (lease 2). Daemon 1 is SIGKILLed; daemon 2 starts on the same socket; the
 * linker reconnects. On daemon 2: offload the same pages (lease 1), then
 * LOAD and PREPARE rid 20 (lease 2 again). COMMIT and start rid 14: it fails
 * (its pins were daemon 1's), and daemon 2 must still hold rid 20's four
 * pins and its lease afterwards. Then rid 20 loads: success, byte-exact.
 */
#include "dtest.h"
#include "harness.h"
#include "kvd_common.h"
#include "kvdock.h"
#include "ltest.h"

#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#define PS    4
#define PAGES 4
#define ROWS  (2 * PAGES * PS)
#define BPR   64

static uint8_t kbuf[ROWS * BPR], vbuf[ROWS * BPR];
static int64_t store_idx[PAGES * PS], load_idx[PAGES * PS];

static kvd_transfer_t transfer(uint32_t pool, uint8_t keys[PAGES][KVD_PAGE_KEY_BYTES],
                               int64_t *idx)
{
    return (kvd_transfer_t){.pool_id = pool,
                            .keys = (const uint8_t(*)[KVD_PAGE_KEY_BYTES])keys,
                            .n_keys = PAGES,
                            .device_indices = idx,
                            .n_indices = PAGES * PS};
}

static bool offload(kvd_linker_t *l, uint32_t pool,
                    uint8_t keys[PAGES][KVD_PAGE_KEY_BYTES])
{
    kvd_transfer_t t = transfer(pool, keys, store_idx);
    uint64_t ack = 0;
    return kvd_offload(l, &t, 1, &ack) == 0 && lt_wait_done(l, false, ack, 10000);
}

static int load_prepare(kvd_linker_t *l, uint32_t pool,
                        uint8_t keys[PAGES][KVD_PAGE_KEY_BYTES], uint64_t rid)
{
    kvd_transfer_t t = transfer(pool, keys, load_idx);
    int rc = kvd_load(l, rid, &t, 1);
    return rc != 0 ? rc : kvd_load_prepare(l, rid);
}

static int commit_start(kvd_linker_t *l, uint64_t rid)
{
    kvd_commit_pool_t c = {.adopted_begin = 0, .adopted_end = PAGES};
    uint32_t counter = 0;
    int rc = kvd_load_commit(l, rid, &c, 1);
    if (rc == 0)
        rc = kvd_start_layer_wise_loading(l, &counter);
    if (rc == 0)
        kvd_wait_layer(l, counter, 0); /* in place, or failed: either way done */
    return rc;
}

static bool store_holds(const char *socket, uint64_t pins, uint64_t leases)
{
    kvd_stats_rep_t st;
    if (dt_stats_fresh(socket, &st) != KVD_OK)
        return false;
    if (st.store.pins == pins && st.store.leases == leases)
        return true;
    fprintf(stderr, "daemon holds %llu pins and %llu leases, want %llu and %llu\n",
            (unsigned long long)st.store.pins, (unsigned long long)st.store.leases,
            (unsigned long long)pins, (unsigned long long)leases);
    return false;
}

int main(void)
{
    kvd_test_daemon_t d1 = {0}, d2 = {0};
    const char *args[] = {"--pool-size", "64M", "--usage-interval", "0", NULL};
    if (kvd_test_daemon_start(&d1, args, true, 30000) != 0)
        return dt_exit_status("linker/stale_lease");
    kvd_linker_config_t cfg = {
        .socket_path = d1.socket, .model_id = "stale", .timeout_ms = 5000};
    kvd_linker_t *l = NULL;
    int rc = kvd_linker_open(&cfg, &l);
    DT_CHECK(rc == 0, "open: %s", kvd_strerror(rc));
    uint32_t pool = 0;
    if (rc == 0)
        rc = lt_register_kv(l, "kv", kbuf, vbuf, BPR, PS, ROWS, NULL, &pool);
    DT_CHECK(rc == 0, "register: %s", kvd_strerror(rc));
    for (int i = 0; i < PAGES * PS; i++) {
        store_idx[i] = i;
        load_idx[i] = PAGES * PS + i; /* loads land in the other half */
    }
    for (size_t i = 0; i < sizeof(kbuf); i++) {
        kbuf[i] = (uint8_t)(i * 7 + 3);
        vbuf[i] = (uint8_t)(i * 11 + 5);
    }
    uint32_t tokens[PAGES * PS];
    for (int i = 0; i < PAGES * PS; i++)
        tokens[i] = 500 + (uint32_t)i;
    uint8_t keys[PAGES][KVD_PAGE_KEY_BYTES];
    size_t nk = 0;
    kvd_page_keys(tokens, PAGES * PS, PS, NULL, keys, &nk);

    DT_CHECK(rc == 0 && offload(l, pool, keys), "offload on daemon 1");
    rc = load_prepare(l, pool, keys, 14);
    DT_CHECK(rc == 0, "LOAD of rid 14 on daemon 1: %s", kvd_strerror(rc));

    kill(d1.pid, SIGKILL);
    kvd_test_wait_pid(d1.pid, 5000, NULL);
    d1.pid = 0;
    const char *args2[] = {"--pool-size", "64M", "--usage-interval", "0", "--socket",
                           d1.socket,     NULL};
    DT_CHECK(kvd_test_daemon_start(&d2, args2, false, 0) == 0, "daemon 2 starts");
    DT_CHECK(lt_wait_ready(l, 10000), "the linker never saw daemon 2 ready");

    DT_CHECK(offload(l, pool, keys), "offload on daemon 2");
    rc = load_prepare(l, pool, keys, 20);
    DT_CHECK(rc == 0, "LOAD of rid 20 on daemon 2: %s", kvd_strerror(rc));
    DT_CHECK(store_holds(d1.socket, PAGES, 1), "daemon 2 should hold rid 20's pins");

    /* rid 14 fails (its pins were daemon 1's) and releases nothing here */
    DT_CHECK(commit_start(l, 14) == 0, "start rid 14");
    DT_CHECK(!lt_wait_done(l, true, 14, 10000), "rid 14 came back successful");
    DT_CHECK(store_holds(d1.socket, PAGES, 1),
             "daemon 2 lost rid 20's pins to rid 14's stale release");

    memset(kbuf + PAGES * PS * BPR, 0, PAGES * PS * BPR);
    memset(vbuf + PAGES * PS * BPR, 0, PAGES * PS * BPR);
    DT_CHECK(commit_start(l, 20) == 0, "start rid 20");
    DT_CHECK(lt_wait_done(l, true, 20, 10000), "rid 20 should come back successful");
    DT_CHECK(memcmp(kbuf, kbuf + PAGES * PS * BPR, PAGES * PS * BPR) == 0 &&
                 memcmp(vbuf, vbuf + PAGES * PS * BPR, PAGES * PS * BPR) == 0,
             "rid 20's bytes are not what was offloaded");
    kvd_linker_close(l);
    kvd_test_daemon_stop(&d2, SIGTERM, 10000, NULL);
    kvd_test_daemon_stop(&d1, SIGKILL, 5000, NULL);
    return dt_exit_status("linker/stale_lease");
}
