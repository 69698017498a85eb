/*
 * Description: four TP ranks as four processes against one kvdockd. Each
 * rank offloads the same rank-replicated KV pages (an MLA pool: identical
 * bytes on every rank) and its own mamba state under the same key. The
 * replicated pages are stored once (one namespace without a tp suffix, one
 * object per page: the other ranks' writes are EXISTS or IN_FLIGHT, which
 * count as success); the states are stored per rank (four namespaces). Then
 * every rank loads both back: the shared KV is byte-exact for all, and each
 * rank gets its own state, not another rank's.
 */
#include "harness.h"
#include "kvd_proto.h"
#include "kvdock.h"

#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define RANKS 4
#define PS    4
#define PAGES 6
#define ROWS  64
#define BPR   96  /* the latent row */
#define STATE 128 /* bytes of state per slot */

static void nap(void)
{
    struct timespec ts = {0, 5000000};
    nanosleep(&ts, NULL);
}

/* Pops completions until id comes back (10 s); returns its success. */
static bool wait_id(kvd_linker_t *l, bool loads, uint64_t id)
{
    for (int i = 0; i < 2000; i++) {
        kvd_completion_t c;
        size_t n = 0;
        if (loads)
            kvd_pop_completed_loads(l, &c, 1, &n);
        else
            kvd_pop_completed_offloads(l, &c, 1, &n);
        if (n == 1)
            return c.id == id && c.success;
        nap();
    }
    return false;
}

static uint8_t kv_byte(size_t i)
{
    return (uint8_t)(i * 31 + 7);
}

static uint8_t state_byte(int rank, size_t i)
{
    return (uint8_t)(rank * 50 + i * 3 + 1);
}

/* One rank's life; returns the number of failed checks (the exit status). */
static int rank_main(const char *socket, int rank, int start_fd)
{
    int fails = 0;
#define RCHECK(cond, what)                                     \
    do {                                                       \
        if (!(cond)) {                                         \
            fprintf(stderr, "FAIL rank %d: %s\n", rank, what); \
            fails++;                                           \
        }                                                      \
    } while (0)
    static uint8_t kv[ROWS * BPR], st[8 * STATE];
    for (size_t i = 0; i < sizeof(kv); i++)
        kv[i] = kv_byte(i);
    for (size_t i = 0; i < sizeof(st); i++)
        st[i] = state_byte(rank, i);
    kvd_linker_config_t cfg = {.socket_path = socket,
                               .model_id = "tp-model",
                               .tp_rank = rank,
                               .tp_size = RANKS,
                               .timeout_ms = 5000};
    kvd_linker_t *l = NULL;
    if (kvd_linker_open(&cfg, &l) != 0)
        return 1;
    kvd_pool_layer_t kl = {.layer_id = 0, .n_buffers = 1, .buffers = {{kv, BPR, BPR}}};
    kvd_pool_layer_t sl = {
        .layer_id = 1, .n_buffers = 1, .buffers = {{st, STATE, STATE}}};
    kvd_pool_desc_t kd = {.name = "kv",
                          .addressing = KVD_ADDR_PAGED,
                          .page_size = PS,
                          .n_rows = ROWS,
                          .rank_replicated = true,
                          .memory = KVD_MEM_HOST,
                          .n_layers = 1,
                          .layers = &kl};
    kvd_pool_desc_t sd = {.name = "mamba",
                          .addressing = KVD_ADDR_SLOT,
                          .n_rows = 8,
                          .trailing_pages = 1,
                          .memory = KVD_MEM_HOST,
                          .n_layers = 1,
                          .layers = &sl};
    uint32_t kid = 0, sid = 0;
    RCHECK(kvd_register_pool(l, &kd, &kid) == 0, "register kv");
    RCHECK(kvd_register_pool(l, &sd, &sid) == 0, "register mamba");
    char ns[256];
    kvd_pool_info(l, kid, NULL, ns, sizeof(ns));
    RCHECK(strcmp(ns, "tp-model/kv/rep") == 0, "the replicated pool has no tp suffix");
    char want[64];
    snprintf(want, sizeof(want), "tp-model/mamba/tp%d", rank);
    kvd_pool_info(l, sid, NULL, ns, sizeof(ns));
    RCHECK(strcmp(ns, want) == 0, "the per-rank pool has its tp suffix");

    uint32_t tokens[PAGES * PS];
    for (int i = 0; i < PAGES * PS; i++)
        tokens[i] = 7000 + (uint32_t)i;
    uint8_t keys[PAGES][KVD_PAGE_KEY_BYTES];
    size_t nk = 0;
    kvd_page_keys(tokens, PAGES * PS, PS, NULL, keys, &nk);
    int64_t idx[PAGES * PS], slot[1] = {2};
    for (int i = 0; i < PAGES * PS; i++)
        idx[i] = i;
    kvd_transfer_t off[2] = {
        {.pool_id = kid,
         .keys = (const uint8_t(*)[KVD_PAGE_KEY_BYTES])keys,
         .n_keys = PAGES,
         .device_indices = idx,
         .n_indices = PAGES * PS},
        {.pool_id = sid,
         .keys = (const uint8_t(*)[KVD_PAGE_KEY_BYTES]) & keys[PAGES - 1],
         .n_keys = 1,
         .device_indices = slot,
         .n_indices = 1,
         .first_depth = PAGES - 1},
    };
    /* all ranks offload at once */
    char go;
    if (read(start_fd, &go, 1) != 1)
        fails++;
    uint64_t ack = 0;
    RCHECK(kvd_offload(l, off, 2, &ack) == 0 && wait_id(l, false, ack),
           "offload succeeds (EXISTS and IN_FLIGHT count as success)");
    /* until every rank has offloaded, a load may find pages in flight */
    uint32_t b[PAGES];
    size_t nb = 0;
    kvd_transfer_t look[2] = {
        {.pool_id = kid,
         .keys = (const uint8_t(*)[KVD_PAGE_KEY_BYTES])keys,
         .n_keys = PAGES},
        {.pool_id = sid,
         .keys = (const uint8_t(*)[KVD_PAGE_KEY_BYTES])keys,
         .n_keys = PAGES},
    };
    for (int i = 0; i < 2000; i++) {
        if (kvd_lookup(l, 1, look, 2, b, &nb) == 0 && nb == 1 && b[0] == PAGES)
            break;
        nap();
    }
    RCHECK(nb == 1 && b[0] == PAGES, "the whole prefix is restorable");
    memset(kv, 0, sizeof(kv));
    memset(st, 0, sizeof(st));
    int64_t idx2[PAGES * PS], slot2[1] = {5};
    for (int i = 0; i < PAGES * PS; i++)
        idx2[i] = 32 + i;
    kvd_transfer_t ld[2] = {
        {.pool_id = kid,
         .keys = (const uint8_t(*)[KVD_PAGE_KEY_BYTES])keys,
         .n_keys = PAGES,
         .device_indices = idx2,
         .n_indices = PAGES * PS},
        {.pool_id = sid,
         .keys = (const uint8_t(*)[KVD_PAGE_KEY_BYTES]) & keys[PAGES - 1],
         .n_keys = 1,
         .device_indices = slot2,
         .n_indices = 1},
    };
    uint64_t rid = 100 + (uint64_t)rank;
    kvd_commit_pool_t c[2] = {{.adopted_begin = 0, .adopted_end = PAGES}, {0}};
    uint32_t counter = 0;
    RCHECK(kvd_load(l, rid, ld, 2) == 0 && kvd_load_prepare(l, rid) == 0 &&
               kvd_load_commit(l, rid, c, 2) == 0 &&
               kvd_start_layer_wise_loading(l, &counter) == 0 &&
               kvd_wait_layer(l, counter, 0) == 0 && kvd_wait_layer(l, counter, 1) == 0 &&
               wait_id(l, true, rid),
           "the load succeeds");
    bool kv_ok = true, st_ok = true;
    for (size_t i = 0; i < PAGES * PS * BPR; i++)
        kv_ok &= kv[32 * BPR + i] == kv_byte(i);
    for (size_t i = 0; i < STATE; i++)
        st_ok &= st[5 * STATE + i] == state_byte(rank, 2 * STATE + i);
    RCHECK(kv_ok, "the shared KV is byte-exact");
    RCHECK(st_ok, "the state is this rank's own");
    kvd_linker_close(l);
    return fails;
}

/* A namespace's figures from the daemon's Stats; false when absent. */
static bool ns_stats(const char *socket, const char *name, kvd_ns_msg_t *out)
{
    kvd_client_t *c = NULL;
    if (kvd_client_connect_unix(socket, 2000, &c) != KVD_OK)
        return false;
    if (kvd_client_hello(c, "tp-ranks-test", NULL, 0, 2000, NULL) != KVD_OK) {
        kvd_client_close(c);
        return false;
    }
    kvd_msg_t req, rep;
    kvd_msg_request(&req, 0, KVD_METHOD_STATS);
    bool found = false;
    if (kvd_client_call(c, &req, &rep, 2000) == KVD_OK && rep.status == KVD_OK)
        for (size_t i = 0; i < rep.body.stats_rep.n_namespaces; i++)
            if (strcmp(rep.body.stats_rep.namespaces[i].name, name) == 0) {
                *out = rep.body.stats_rep.namespaces[i];
                found = true;
            }
    kvd_msg_clear(&rep);
    kvd_client_close(c);
    return found;
}

/* Objects of a namespace, from the daemon's Stats. */
static long ns_objects(const char *socket, const char *name)
{
    kvd_client_t *c = NULL;
    if (kvd_client_connect_unix(socket, 2000, &c) != KVD_OK)
        return -1;
    if (kvd_client_hello(c, "tp-ranks-test", NULL, 0, 2000, NULL) != KVD_OK) {
        kvd_client_close(c);
        return -1;
    }
    kvd_msg_t req, rep;
    kvd_msg_request(&req, 0, KVD_METHOD_STATS);
    long n = -1;
    if (kvd_client_call(c, &req, &rep, 2000) == KVD_OK && rep.status == KVD_OK)
        for (size_t i = 0; i < rep.body.stats_rep.n_namespaces; i++)
            if (strcmp(rep.body.stats_rep.namespaces[i].name, name) == 0)
                n = (long)rep.body.stats_rep.namespaces[i].objects_ready;
    kvd_msg_clear(&rep);
    kvd_client_close(c);
    return n;
}

int main(void)
{
    kvd_test_daemon_t d;
    const char *args[] = {"--pool-size", "64M", "--usage-interval", "0", NULL};
    if (kvd_test_daemon_start(&d, args, true, 30000) != 0)
        return 1;
    int failures = 0, go[2];
    if (pipe(go) != 0)
        return 1;
    pid_t pids[RANKS];
    for (int r = 0; r < RANKS; r++) {
        pids[r] = fork();
        if (pids[r] == 0) {
            close(go[1]);
            _exit(rank_main(d.socket, r, go[0]) ? 1 : 0);
        }
    }
    close(go[0]);
    char bytes[RANKS] = {0};
    if (write(go[1], bytes, RANKS) != RANKS) /* every rank starts together */
        failures++;
    close(go[1]);
    for (int r = 0; r < RANKS; r++) {
        int st = 0;
        if (pids[r] < 0 || kvd_test_wait_pid(pids[r], 60000, &st) != 0 ||
            !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            fprintf(stderr, "FAIL: rank %d failed\n", r);
            failures++;
        }
    }
    long shared = ns_objects(d.socket, "tp-model/kv/rep");
    if (shared != PAGES) {
        fprintf(stderr, "FAIL: the replicated pool holds %ld objects, want %d\n", shared,
                PAGES);
        failures++;
    }
    for (int r = 0; r < RANKS; r++) {
        char name[64];
        snprintf(name, sizeof(name), "tp-model/mamba/tp%d", r);
        long n = ns_objects(d.socket, name);
        if (n != 1) {
            fprintf(stderr, "FAIL: %s holds %ld objects, want 1\n", name, n);
            failures++;
        }
    }
    /* the daemon's per-pool counters: the shared pages offloaded once and
     * loaded by every rank; each state offloaded and loaded by its rank */
    kvd_ns_msg_t kv, st;
    uint64_t page = (uint64_t)PS * BPR;
    if (!ns_stats(d.socket, "tp-model/kv/rep", &kv) ||
        kv.published_bytes != PAGES * page || kv.acquired_bytes != RANKS * PAGES * page) {
        fprintf(stderr, "FAIL: kv/rep offloaded %llu, loaded %llu; want %llu, %llu\n",
                (unsigned long long)kv.published_bytes,
                (unsigned long long)kv.acquired_bytes, (unsigned long long)(PAGES * page),
                (unsigned long long)(RANKS * PAGES * page));
        failures++;
    }
    if (!ns_stats(d.socket, "tp-model/mamba/tp0", &st) || st.published_bytes != STATE ||
        st.acquired_bytes != STATE) {
        fprintf(stderr, "FAIL: mamba/tp0 offloaded %llu, loaded %llu; want %d each\n",
                (unsigned long long)st.published_bytes,
                (unsigned long long)st.acquired_bytes, STATE);
        failures++;
    }
    if (kvd_test_daemon_stop(&d, SIGTERM, 10000, NULL) != 0)
        failures++;
    printf("%s\n", failures ? "FAILED" : "ok");
    return failures ? 1 : 0;
}
