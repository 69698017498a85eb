/*
 * Description: a worker killed mid-offload costs the daemon nothing. A
 * child process offloads 4 MiB objects back to back through libkvdock
 * (whatever transport KVDOCK_TRANSPORT names); the parent SIGKILLs it
 * while its bytes are moving. Then the daemon still answers, its store
 * invariant holds (`kvdock stats --check`), the dead worker's reservations
 * and pins are gone (no lease, nothing writing) and its quarantined
 * extents come back after a TTL, and a fresh worker's offload and load
 * round-trip byte-exact. Then the daemon's UCX server process is killed:
 * the daemon stays ready, starts another (its log says so), and a fresh
 * worker round-trips again. The daemon exits 0 on SIGTERM with a clean log.
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
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define PS    16
#define PAGES 8
#define ROWS  (PAGES * PS)
#define BPR   (128 * 1024) /* one page of one buffer: 2 MiB; an object 4 MiB */

static int open_worker(const char *socket, uint8_t *k, uint8_t *v, kvd_linker_t **l,
                       uint32_t *pool)
{
    kvd_linker_config_t cfg = {
        .socket_path = socket, .model_id = "wd", .timeout_ms = 5000};
    int rc = kvd_linker_open(&cfg, l);
    if (rc != 0)
        return rc;
    return lt_register_kv(*l, "kv", k, v, BPR, PS, ROWS, NULL, pool);
}

static void keys_of(uint32_t base, uint8_t keys[PAGES][KVD_PAGE_KEY_BYTES])
{
    uint32_t tokens[PAGES * PS];
    for (int i = 0; i < PAGES * PS; i++)
        tokens[i] = base + (uint32_t)i;
    size_t n = 0;
    kvd_page_keys(tokens, PAGES * PS, PS, NULL, keys, &n);
}

static kvd_transfer_t transfer(uint32_t pool, uint8_t keys[PAGES][KVD_PAGE_KEY_BYTES],
                               int64_t *idx)
{
    for (int i = 0; i < ROWS; i++)
        idx[i] = i;
    return (kvd_transfer_t){.pool_id = pool,
                            .keys = (const uint8_t(*)[KVD_PAGE_KEY_BYTES])keys,
                            .n_keys = PAGES,
                            .device_indices = idx,
                            .n_indices = ROWS};
}

/* The child: offloads fresh prefixes until it is killed; one byte on the
 * pipe once the first offload is queued. */
static void worker(const char *socket, int ready_fd)
{
    uint8_t *k = malloc((size_t)ROWS * BPR), *v = malloc((size_t)ROWS * BPR);
    kvd_linker_t *l = NULL;
    uint32_t pool = 0;
    if (k == NULL || v == NULL || open_worker(socket, k, v, &l, &pool) != 0)
        _exit(3);
    memset(k, 0x5A, (size_t)ROWS * BPR);
    memset(v, 0xA5, (size_t)ROWS * BPR);
    for (uint32_t round = 0; round < 100000; round++) {
        uint8_t keys[PAGES][KVD_PAGE_KEY_BYTES];
        int64_t idx[ROWS];
        keys_of(1000000 + round * ROWS, keys);
        kvd_transfer_t t = transfer(pool, keys, idx);
        uint64_t ack = 0;
        if (kvd_offload(l, &t, 1, &ack) != 0)
            _exit(4);
        if (round == 0 && write(ready_fd, "r", 1) != 1)
            _exit(5);
        /* keep a few in flight: drain completions now and then */
        kvd_completion_t c[16];
        size_t n = 0;
        kvd_pop_completed_offloads(l, c, 16, &n);
        if (round % 4 == 3)
            kvd_sleep_ns(1 * 1000000ull);
    }
    _exit(0);
}

static void check_store(const char *socket)
{
    /* the dead worker's reservations went with its connection; its
     * extents sit in quarantine for one TTL, then are free again */
    kvd_stats_rep_t st;
    bool drained = false;
    for (int i = 0; i < 750 && !drained; i++) { /* 15 s: a TTL and time to spare */
        if (dt_stats_fresh(socket, &st) == KVD_OK)
            drained = st.store.leases == 0 && st.store.objects_writing == 0 &&
                      st.store.writing_bytes == 0 && st.store.quarantined_bytes == 0 &&
                      st.store.pinned_bytes == 0;
        if (!drained)
            kvd_sleep_ns(20 * 1000000ull);
    }
    DT_CHECK(drained,
             "the dead worker's leases, reservations and quarantine should be gone: "
             "leases %llu, writing %llu B, quarantined %llu B, pinned %llu B",
             (unsigned long long)st.store.leases,
             (unsigned long long)st.store.writing_bytes,
             (unsigned long long)st.store.quarantined_bytes,
             (unsigned long long)st.store.pinned_bytes);
    DT_CHECK(st.store.free_bytes + st.store.ready_bytes == st.store.pool_bytes,
             "free %llu + ready %llu should be the pool %llu",
             (unsigned long long)st.store.free_bytes,
             (unsigned long long)st.store.ready_bytes,
             (unsigned long long)st.store.pool_bytes);
    char out[8192];
    char *argv[] = {(char *)kvd_test_bin("kvdock"),
                    "--socket",
                    (char *)socket,
                    "stats",
                    "--check",
                    NULL};
    int ex = kvd_test_run(argv, out, sizeof(out), 10000);
    DT_CHECK(ex == 0, "kvdock stats --check exited %d:\n%s", ex, out);
}

/* A fresh worker: offload then load into other rows, byte-exact. */
static void check_fresh_worker(const char *socket)
{
    uint8_t *k = malloc((size_t)ROWS * BPR), *v = malloc((size_t)ROWS * BPR);
    kvd_linker_t *l = NULL;
    uint32_t pool = 0;
    int rc = k && v ? open_worker(socket, k, v, &l, &pool) : KVD_ERR_NOMEM;
    if (!DT_CHECK(rc == 0, "a fresh worker cannot start: %d", rc)) {
        kvd_linker_close(l);
        free(k);
        free(v);
        return;
    }
    for (size_t i = 0; i < (size_t)ROWS * BPR; i++) {
        k[i] = (uint8_t)(i * 31 + 7);
        v[i] = (uint8_t)(i * 17 + 3);
    }
    uint8_t keys[PAGES][KVD_PAGE_KEY_BYTES];
    int64_t idx[ROWS];
    keys_of(7, keys);
    kvd_transfer_t t = transfer(pool, keys, idx);
    uint64_t ack = 0;
    bool ok = kvd_offload(l, &t, 1, &ack) == 0 && lt_wait_done(l, false, ack, 10000);
    DT_CHECK(ok, "the fresh worker's offload should succeed");
    memset(k, 0, (size_t)ROWS * BPR);
    memset(v, 0, (size_t)ROWS * BPR);
    rc = lt_load_all(l, 1, &t, PAGES);
    ok = rc == 0 && lt_wait_done(l, true, 1, 10000);
    DT_CHECK(rc == 0 && ok, "the fresh worker's load should succeed: %d", rc);
    size_t bad = 0;
    for (size_t i = 0; i < (size_t)ROWS * BPR; i++)
        bad += k[i] != (uint8_t)(i * 31 + 7) || v[i] != (uint8_t)(i * 17 + 3);
    DT_CHECK(bad == 0, "%zu bytes differ after the round trip", bad);
    kvd_linker_close(l);
    free(k);
    free(v);
}

/* The daemon's child (its UCX server), or 0. */
static pid_t ucx_server_of(pid_t daemon)
{
    char path[64], kids[256] = "";
    snprintf(path, sizeof(path), "/proc/%d/task/%d/children", (int)daemon, (int)daemon);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return 0;
    if (fgets(kids, sizeof(kids), f) == NULL)
        kids[0] = '\0';
    fclose(f);
    return (pid_t)atoi(kids);
}

int main(void)
{
    kvd_test_daemon_t d = {0};
    /* a UCX server to kill in every variant: over loopback TCP, which the
     * daemon serves only when told (the shm variant's workers do not use
     * it; the -ucx-tcp one's do) */
    setenv("UCX_TLS", "tcp", 0);
    /* a TTL short enough that the quarantines end within the test, long
     * enough that a fresh worker's offload of 16 MiB (TSan, a busy
     * machine: seen past 500 ms) publishes within its lease */
    const char *args[] = {"--lease-ttl", "2000", "--ucx-tcp", NULL};
    if (dt_start(&d, args) != 0)
        return dt_exit_status("linker/worker_death");
    for (int trial = 0; trial < 3; trial++) {
        int pfd[2];
        if (!DT_CHECK(pipe(pfd) == 0, "pipe"))
            break;
        pid_t pid = fork();
        if (pid == 0) {
            close(pfd[0]);
            worker(d.socket, pfd[1]);
        }
        close(pfd[1]);
        char b;
        bool started = read(pfd[0], &b, 1) == 1;
        close(pfd[0]);
        DT_CHECK(started, "the worker should start offloading");
        kvd_sleep_ns((uint64_t)(20 + 40 * trial) *
                     1000000u); /* mid-transfer: objects are 4 MiB each */
        kill(pid, SIGKILL);
        int ws = 0;
        kvd_test_wait_pid(pid, 10000, &ws);
        DT_CHECK(WIFSIGNALED(ws), "the worker should die by the signal, not exit %d",
                 WIFEXITED(ws) ? WEXITSTATUS(ws) : -1);
        DT_CHECK(dt_health_fresh(d.socket, NULL) == KVD_HEALTH_READY,
                 "the daemon should still be ready after worker %d died", trial);
        check_store(d.socket);
    }
    check_fresh_worker(d.socket);

    /* the UCX server process dies: it comes back, workers reconnect */
    pid_t ucxd = ucx_server_of(d.pid);
    if (DT_CHECK(ucxd > 0, "the daemon should have its UCX server child")) {
        kill(ucxd, SIGKILL);
        pid_t next = 0;
        for (int i = 0; i < 500 && (next <= 0 || next == ucxd); i++) {
            next = ucx_server_of(d.pid);
            if (next <= 0 || next == ucxd)
                kvd_sleep_ns(10 * 1000000ull);
        }
        DT_CHECK(next > 0 && next != ucxd,
                 "the daemon should start another UCX server (was %d, now %d)", (int)ucxd,
                 (int)next);
        DT_CHECK(kvd_test_file_contains(d.log, "starting UCX server again"),
                 "the daemon's log should say it restarted its UCX server");
        DT_CHECK(dt_health_fresh(d.socket, NULL) == KVD_HEALTH_READY,
                 "the daemon should stay ready when its UCX server dies");
        check_fresh_worker(d.socket);
    }
    dt_stop(&d, SIGTERM, 5000);
    return dt_exit_status("linker/worker_death");
}
