/*
 * Description: timeout_ms bounds every call and every wait when the daemon
 * hangs. A linker with timeout_ms = 1000 stores a page, pins and commits a
 * load of it; then its daemon is stopped (SIGSTOP), 8 one-page offloads are
 * queued, and the daemon stays stopped until every check below is done:
 *  - two engine threads call kvd_lookup in a loop (one of them with chains
 *    of 4,000 pages, which fill the socket), and the main thread
 *    kvd_linker_health, kvd_load and kvd_register_pool: every call returns,
 *    with KVD_ERR_TIMEOUT (a call that waited for the daemon would never
 *    return: the test would hang);
 *  - every queued offload comes back failed, so the engine gets its device
 *    rows back, and the committed load, started once a call has timed out
 *    (its leases went with that connection), comes back failed; the layer
 *    wait returns.
 * Then SIGCONT: the linker reconnects, an offload and a lookup succeed, and
 * once the linker is closed the daemon holds no pin and no reservation.
 * Each call's duration is printed (nothing asserts a time).
 *
 * A watchdog SIGKILLs the daemon (ours, by pid) if the checks are not done
 * 60 s into the stop, and records that as a failure, so that a linker that
 * waits for the daemon fails the test instead of leaving a stopped daemon.
 */
#include "dtest.h"
#include "harness.h"
#include "kvd_common.h"
#include "kvdock.h"
#include "ltest.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define PS          4
#define ROWS        64
#define BPR         64
#define N_OFFLOADS  8
#define N_LOOKUPS   8 /* per engine thread */
#define TIMEOUT_MS  1000
#define WATCHDOG_MS 60000

static uint8_t kbuf[ROWS * BPR], vbuf[ROWS * BPR];
static uint8_t k2buf[ROWS * BPR], v2buf[ROWS * BPR];

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static void nap(void)
{
    struct timespec ts = {0, 10000000};
    nanosleep(&ts, NULL);
}

static void key_of(uint32_t base, uint8_t key[1][KVD_PAGE_KEY_BYTES])
{
    uint32_t tokens[PS];
    for (int i = 0; i < PS; i++)
        tokens[i] = base + (uint32_t)i;
    size_t n = 0;
    kvd_page_keys(tokens, PS, PS, NULL, key, &n);
}

static kvd_transfer_t page(uint32_t pool, uint8_t key[1][KVD_PAGE_KEY_BYTES],
                           const int64_t *idx)
{
    return (kvd_transfer_t){.pool_id = pool,
                            .keys = (const uint8_t(*)[KVD_PAGE_KEY_BYTES])key,
                            .n_keys = 1,
                            .device_indices = idx,
                            .n_indices = idx ? PS : 0};
}

/* ------------------------------------------------------------ watchdog */

static pthread_mutex_t wd_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wd_cv = PTHREAD_COND_INITIALIZER;
static bool wd_done;
static pid_t wd_pid;

static void *watchdog(void *arg)
{
    (void)arg;
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += WATCHDOG_MS / 1000;
    pthread_mutex_lock(&wd_mu);
    while (!wd_done)
        if (pthread_cond_timedwait(&wd_cv, &wd_mu, &until) != 0)
            break;
    bool fired = !wd_done;
    pthread_mutex_unlock(&wd_mu);
    if (fired) {
        dt_fail(__FILE__, __LINE__,
                "a call or a completion waited for the stopped daemon");
        kill(wd_pid, SIGKILL); /* the blocked calls return: the test ends */
    }
    return NULL;
}

/* ------------------------------------------------------- engine threads */

typedef struct engine {
    kvd_linker_t *l;
    uint32_t pool;
    size_t n_keys; /* of each lookup */
    int rcs[N_LOOKUPS];
    double ms[N_LOOKUPS];
} engine_t;

/* Lookups a quarter of the timeout apart, so that they span several
 * timeouts: calls while the daemon counts as hung, and the calls that try
 * it again (and the calls that wait for those). */
static void *engine_main(void *arg)
{
    engine_t *e = arg;
    uint8_t(*keys)[KVD_PAGE_KEY_BYTES] = calloc(e->n_keys, KVD_PAGE_KEY_BYTES);
    uint32_t *b = calloc(e->n_keys, sizeof(uint32_t));
    if (!DT_CHECK(keys && b, "out of memory")) {
        free(keys);
        free(b);
        return NULL;
    }
    for (size_t i = 0; i < e->n_keys; i++) {
        keys[i][0] = (uint8_t)i;
        keys[i][1] = (uint8_t)(i >> 8);
        keys[i][2] = 0xab;
    }
    kvd_transfer_t t = {.pool_id = e->pool,
                        .keys = (const uint8_t(*)[KVD_PAGE_KEY_BYTES])keys,
                        .n_keys = e->n_keys};
    for (int i = 0; i < N_LOOKUPS; i++) {
        size_t nb = 0;
        double t0 = now_ms();
        e->rcs[i] = kvd_lookup(e->l, 1, &t, 1, b, &nb);
        e->ms[i] = now_ms() - t0;
        struct timespec ts = {0, TIMEOUT_MS * 250000L};
        nanosleep(&ts, NULL);
    }
    free(keys);
    free(b);
    return NULL;
}

/* What came back while the daemon was stopped, and when (ms into the
 * stop). */
typedef struct back {
    int offloads, offloads_failed;
    double offload_ms[N_OFFLOADS];
    int load; /* 1 success, 0 failure, -1 not back */
    double load_ms;
} back_t;

/* Pops completions until every one of acks[0..N_OFFLOADS) and load rid
 * came back (or the watchdog fires). */
static void completions(kvd_linker_t *l, const uint64_t *acks, uint64_t rid,
                        double stop_at, back_t *b)
{
    bool seen[N_OFFLOADS] = {0};
    *b = (back_t){.load = -1};
    for (int i = 0; i < 2 * WATCHDOG_MS / 10 && (b->offloads < N_OFFLOADS || b->load < 0);
         i++) {
        kvd_completion_t c[8];
        size_t k = 0;
        kvd_pop_completed_offloads(l, c, 8, &k);
        for (size_t j = 0; j < k; j++)
            for (int a = 0; a < N_OFFLOADS; a++)
                if (c[j].id == acks[a] && !seen[a]) {
                    seen[a] = true;
                    b->offload_ms[b->offloads++] = now_ms() - stop_at;
                    b->offloads_failed += !c[j].success;
                }
        kvd_pop_completed_loads(l, c, 8, &k);
        for (size_t j = 0; j < k; j++)
            if (c[j].id == rid && b->load < 0) {
                b->load = c[j].success;
                b->load_ms = now_ms() - stop_at;
            }
        nap();
    }
}

static int n_freed;
static void count_freed(void *ctx, const int64_t *idx, size_t n)
{
    (void)ctx;
    (void)idx;
    n_freed += (int)n;
}

static void run(kvd_test_daemon_t *d)
{
    kvd_linker_config_t cfg = {
        .socket_path = d->socket, .model_id = "hang", .timeout_ms = TIMEOUT_MS};
    kvd_linker_t *l = NULL;
    int rc = kvd_linker_open(&cfg, &l);
    if (!DT_CHECK(rc == 0, "open: %s", kvd_strerror(rc)))
        return;
    uint32_t pool = 0;
    rc = lt_register_kv(l, "kv", kbuf, vbuf, BPR, PS, ROWS, count_freed, &pool);
    DT_CHECK(rc == 0, "register: %s", kvd_strerror(rc));
    for (size_t i = 0; i < sizeof(kbuf); i++) {
        kbuf[i] = (uint8_t)(i * 13 + 1);
        vbuf[i] = (uint8_t)(i * 7 + 2);
    }
    int64_t rows0[PS], rows32[PS], rows48[PS];
    for (int i = 0; i < PS; i++) {
        rows0[i] = i;
        rows32[i] = 32 + i;
        rows48[i] = 48 + i;
    }
    /* page 100 stored, then pinned and committed by load 11 */
    uint8_t key[1][KVD_PAGE_KEY_BYTES];
    key_of(100, key);
    kvd_transfer_t t = page(pool, key, rows0);
    uint64_t ack = 0;
    DT_CHECK(kvd_offload(l, &t, 1, &ack) == 0 && lt_wait_done(l, false, ack, 10000),
             "storing the first page");
    t.device_indices = rows32;
    kvd_commit_pool_t cp = {.adopted_begin = 0, .adopted_end = 1};
    DT_CHECK(kvd_load(l, 11, &t, 1) == 0 && kvd_load_prepare(l, 11) == 0 &&
                 kvd_load_commit(l, 11, &cp, 1) == 0,
             "load 11 pinned and committed");
    /* the daemon hangs */
    wd_pid = d->pid;
    pthread_t wd;
    pthread_create(&wd, NULL, watchdog, NULL);
    kill(d->pid, SIGSTOP);
    double stop_at = now_ms();

    /* 8 one-page offloads queued: after the stop, so that none can finish
     * before it on a slow machine (under TSan, 4 of 8 did) */
    uint64_t acks[N_OFFLOADS];
    for (int i = 0; i < N_OFFLOADS; i++) {
        uint8_t k[1][KVD_PAGE_KEY_BYTES];
        key_of(1000 + 10 * (uint32_t)i, k);
        kvd_transfer_t o = page(pool, k, rows0);
        DT_CHECK(kvd_offload(l, &o, 1, &acks[i]) == 0, "offload %d queued", i);
    }

    /* engine 1's lookups (4,000 keys, 128 KiB each) fill the socket the
     * daemon no longer reads: a call then waits behind another's frames */
    engine_t e[2] = {{.l = l, .pool = pool, .n_keys = 1},
                     {.l = l, .pool = pool, .n_keys = 4000}};
    pthread_t th[2];
    for (int i = 0; i < 2; i++)
        pthread_create(&th[i], NULL, engine_main, &e[i]);
    /* a call of this thread while the engine threads' are on their way */
    double t0 = now_ms();
    rc = kvd_linker_health(l, NULL, NULL);
    double health_ms = now_ms() - t0;
    DT_CHECK(rc == KVD_ERR_TIMEOUT, "health during the stop: %s", kvd_strerror(rc));
    /* a call has timed out: load 11's leases went with its connection */
    uint32_t counter = 0;
    DT_CHECK(kvd_start_layer_wise_loading(l, &counter) == 0, "start");
    t0 = now_ms();
    rc = kvd_wait_layer(l, counter, 0);
    double wait_ms = now_ms() - t0;
    printf("kvd_wait_layer: %s after %.0f ms\n", kvd_strerror(rc), wait_ms);
    /* a new load: refused in time, recorded failed, its rows come back */
    t.device_indices = rows48;
    t0 = now_ms();
    rc = kvd_load(l, 12, &t, 1);
    double load_ms = now_ms() - t0;
    DT_CHECK(rc == KVD_ERR_TIMEOUT, "load during the stop: %s", kvd_strerror(rc));
    n_freed = 0;
    DT_CHECK(kvd_load_abort(l, 12) == 0 && n_freed == PS,
             "the failed load's rows come back by ABORT (%d)", n_freed);
    /* a pool registered during the stop */
    t0 = now_ms();
    uint32_t pool2 = 0;
    rc = lt_register_kv(l, "kv2", k2buf, v2buf, BPR, PS, ROWS, NULL, &pool2);
    double reg_ms = now_ms() - t0;
    DT_CHECK(rc == KVD_ERR_TIMEOUT, "register during the stop: %s", kvd_strerror(rc));
    /* the completions, while the engine threads still call */
    back_t b;
    completions(l, acks, 11, stop_at, &b);
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    DT_CHECK(b.offloads == N_OFFLOADS && b.offloads_failed == N_OFFLOADS,
             "every queued offload comes back failed during the stop: %d back, %d failed",
             b.offloads, b.offloads_failed);
    DT_CHECK(b.load == 0, "load 11 comes back failed during the stop (%d)", b.load);

    printf("during the stop (timeout_ms %d):\n", TIMEOUT_MS);
    for (int i = 0; i < 2; i++) {
        printf("  engine %d kvd_lookup:", i);
        for (int k = 0; k < N_LOOKUPS; k++) {
            printf(" %.0f", e[i].ms[k]);
            DT_CHECK(e[i].rcs[k] == KVD_ERR_TIMEOUT, "engine %d lookup %d: %s", i, k,
                     kvd_strerror(e[i].rcs[k]));
        }
        printf(" ms\n");
    }
    printf("  kvd_linker_health %.0f ms, kvd_load %.0f ms, kvd_register_pool %.0f ms\n",
           health_ms, load_ms, reg_ms);
    printf("  offloads back (ms into the stop):");
    for (int i = 0; i < b.offloads; i++)
        printf(" %.0f", b.offload_ms[i]);
    printf("; load 11 back %.0f ms into it\n", b.load_ms);
    fflush(stdout);

    /* the checks are done: the daemon goes on */
    pthread_mutex_lock(&wd_mu);
    wd_done = true;
    pthread_cond_signal(&wd_cv);
    pthread_mutex_unlock(&wd_mu);
    pthread_join(wd, NULL);
    kill(d->pid, SIGCONT);

    DT_CHECK(lt_wait_ready(l, 10000), "the linker reaches the daemon again");
    uint8_t k3[1][KVD_PAGE_KEY_BYTES];
    key_of(5000, k3);
    kvd_transfer_t o = page(pool, k3, rows0);
    DT_CHECK(kvd_offload(l, &o, 1, &ack) == 0 && lt_wait_done(l, false, ack, 10000),
             "an offload after the stop succeeds");
    uint32_t bounds[1];
    size_t nb = 0;
    o.device_indices = NULL;
    o.n_indices = 0;
    rc = kvd_lookup(l, 2, &o, 1, bounds, &nb);
    DT_CHECK(rc == 0 && nb == 1 && bounds[0] == 1, "a lookup after the stop finds it: %s",
             kvd_strerror(rc));
    kvd_linker_close(l);
    kvd_stats_rep_t s = {0};
    for (int i = 0; i < 500; i++) {
        if (dt_stats_fresh(d->socket, &s) == KVD_OK && s.store.pins == 0 &&
            s.store.objects_writing == 0)
            break;
        nap();
    }
    DT_CHECK(s.store.pins == 0 && s.store.objects_writing == 0,
             "pins (%llu) or reservations (%llu) stay", (unsigned long long)s.store.pins,
             (unsigned long long)s.store.objects_writing);
}

int main(void)
{
    kvd_test_daemon_t d = {0};
    if (dt_start(&d, NULL) != 0)
        return dt_exit_status("linker/hang");
    run(&d);
    kill(d.pid, SIGCONT); /* in case a check ended the run early */
    dt_stop(&d, SIGTERM, 10000);
    return dt_exit_status("linker/hang");
}
