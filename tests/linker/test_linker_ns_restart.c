/*
 * Description: a linker's requests carry the namespace ids of the daemon
 * they go to. Two TP ranks share a daemon; it is SIGKILLed and a new one
 * starts on the same socket; rank 1 says Hello first, so on the new daemon
 * the ids are swapped (rank 1's namespace has the id rank 0's had). Rank 0
 * then offloads four pages: they must land in rank 0's namespace, so rank
 * 1 finds none of them and rank 0 finds all four, byte-exact after a load.
 * Before the fix the Reserve carried the old id and rank 0's KV shard was
 * stored, silently, as rank 1's.
 */
#include "dtest.h"
#include "harness.h"
#include "kvdock.h"
#include "ltest.h"

#include <signal.h>
#include <string.h>
#include <time.h>

#define PS    4
#define PAGES 4
#define ROWS  (2 * PAGES * PS)
#define BPR   64

static uint8_t k0[ROWS * BPR], v0[ROWS * BPR], k1[ROWS * BPR], v1[ROWS * BPR];

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

int main(void)
{
    kvd_test_daemon_t d1 = {0}, d2 = {0};
    const char *args[] = {"--pool-size", "64M", "--usage-interval", "0", NULL};
    if (kvd_test_daemon_start(&d1, args, true, 30000) != 0)
        return dt_exit_status("linker/ns_restart");
    kvd_linker_t *l0 = NULL, *l1 = NULL;
    kvd_linker_config_t c0 = {.socket_path = d1.socket,
                              .model_id = "m",
                              .timeout_ms = 3000,
                              .tp_size = 2,
                              .tp_rank = 0};
    kvd_linker_config_t c1 = c0;
    c1.tp_rank = 1;
    uint32_t p0 = 0, p1 = 0;
    bool up = DT_CHECK(kvd_linker_open(&c0, &l0) == 0, "rank 0 open") &&
              DT_CHECK(lt_register_kv(l0, "kv", k0, v0, BPR, PS, ROWS, NULL, &p0) == 0,
                       "rank 0 pool") &&
              DT_CHECK(kvd_linker_open(&c1, &l1) == 0, "rank 1 open") &&
              DT_CHECK(lt_register_kv(l1, "kv", k1, v1, BPR, PS, ROWS, NULL, &p1) == 0,
                       "rank 1 pool");
    int64_t idx[PAGES * PS];
    uint32_t tokens[PAGES * PS];
    for (int i = 0; i < PAGES * PS; i++) {
        idx[i] = i;
        tokens[i] = 900 + (uint32_t)i;
    }
    uint8_t keys[PAGES][KVD_PAGE_KEY_BYTES];
    size_t nk = 0;
    kvd_page_keys(tokens, PAGES * PS, PS, NULL, keys, &nk);
    for (size_t i = 0; i < sizeof(k0); i++) {
        k0[i] = (uint8_t)(i * 7 + 1);
        v0[i] = (uint8_t)(i * 13 + 5);
    }

    if (up) {
        kill(d1.pid, SIGKILL);
        kvd_test_wait_pid(d1.pid, 5000, NULL);
        d1.pid = 0;
        /* on the first one's socket (a later --socket wins): the
         * harness's readiness poll watches its own, so none here; rank 1's
         * reconnection below waits for it */
        const char *args2[] = {"--pool-size", "64M", "--usage-interval", "0", "--socket",
                               d1.socket,     NULL};
        up = DT_CHECK(kvd_test_daemon_start(&d2, args2, false, 0) == 0,
                      "the second daemon started");
    }
    kvd_linker_health_t h;
    if (up) {
        /* rank 1 comes back first: its namespace takes the first id */
        bool back = false;
        for (int i = 0; i < 400 && !back; i++) {
            back = kvd_linker_health(l1, &h, NULL) == 0 && h == KVD_LINKER_HEALTH_READY;
            if (!back)
                sleep_ms(50);
        }
        up = DT_CHECK(back, "rank 1 reconnected to the new daemon, ready");
        /* rank 0's first call finds its connection gone */
        kvd_linker_health(l0, &h, NULL);
    }
    kvd_transfer_t t = {.pool_id = p0,
                        .keys = (const uint8_t(*)[KVD_PAGE_KEY_BYTES])keys,
                        .n_keys = PAGES,
                        .device_indices = idx,
                        .n_indices = PAGES * PS};
    if (up) {
        uint64_t ack = 0;
        DT_CHECK(kvd_offload(l0, &t, 1, &ack) == 0 && lt_wait_done(l0, false, ack, 10000),
                 "rank 0's offload after the restart succeeded");
        uint32_t b[PAGES];
        size_t nb = 0;
        kvd_transfer_t t1 = t;
        t1.pool_id = p1;
        DT_CHECK(kvd_lookup(l1, 1, &t1, 1, b, &nb) == 0 && nb == 0,
                 "rank 1 finds none of rank 0's pages (found %zu)", nb);
        nb = 0;
        DT_CHECK(kvd_lookup(l0, 2, &t, 1, b, &nb) == 0 && nb == PAGES,
                 "rank 0 finds its %d pages (found %zu)", PAGES, nb);
        /* and they are rank 0's bytes */
        uint8_t want_k[sizeof(k0)], want_v[sizeof(v0)];
        memcpy(want_k, k0, sizeof(k0));
        memcpy(want_v, v0, sizeof(v0));
        memset(k0, 0, sizeof(k0));
        memset(v0, 0, sizeof(v0));
        DT_CHECK(lt_load_all(l0, 3, &t, PAGES) == 0 && lt_wait_done(l0, true, 3, 10000),
                 "rank 0 loads them back");
        size_t bytes = (size_t)PAGES * PS * BPR;
        DT_CHECK(memcmp(k0, want_k, bytes) == 0 && memcmp(v0, want_v, bytes) == 0,
                 "the loaded rows are the offloaded ones");
    }
    kvd_linker_close(l0);
    kvd_linker_close(l1);
    kvd_test_daemon_stop(&d2, SIGTERM, 10000, NULL);
    kvd_test_daemon_stop(&d1, SIGTERM, 10000, NULL); /* its directory */
    return dt_exit_status("linker/ns_restart");
}
