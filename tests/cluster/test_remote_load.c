/*
 * Description: remote loads across the cluster (issue 15), three kvdockd
 * daemons in three network namespaces (A = node-0, B = node-1, C = node-2):
 * (1) RPC level: a chain of 8 pages published on C (a worker on C through
 *     C's socket) is found by a Lookup on A (through A's socket) with every
 *     boundary of the chain, each of tier remote (2); A's Acquire answers
 *     in-progress, then (asked again, bounded) OK, and the bytes at the
 *     offsets in A's pool mapping are the pattern C wrote, byte for byte;
 *     a second Lookup on A answers tier DRAM (the objects are local now);
 * (2) linker level: a libkvdock worker in C's namespace offloads 4 pages;
 *     a worker in A's namespace looks them up, loads them into zeroed host
 *     buffers and gets the bytes back and (rid, true) in its completed
 *     loads;
 * (4) garbage from a peer: a client with the cluster's token sends A an
 *     undecodable frame, a frame over the frame limit, a Fetch reply as a
 *     request (each gets an error reply or the connection closed), a
 *     DirAnnounce without a holder (an error), Fetches of an unknown
 *     namespace and of more keys than a reply carries (answered within
 *     what the request asked), a chain announced as held by a non-member
 *     (A's Acquire of it fails not-found), and A keeps serving; the
 *     operator's token
 *     calling DirAnnounce, Fetch and a local DirLookup gets
 *     KVD_ERR_PERMISSION;
 * (3) holder dies: a second chain published on C and found by a Lookup on
 *     A, and pages C's linker worker offloaded found by A's worker's
 *     kvd_lookup; C SIGKILLed; A's Acquire ends in not-found within a
 *     bound (no hang), and A's worker's load fails cleanly (kvd_load
 *     not-found, or (rid, false)); A keeps serving its own objects, and
 *     once C is out of the membership a Lookup on A no longer returns
 *     C's chain.
 * (5) the directory cache (A with --cluster-cache-ms 60000): a chain only
 *     C holds, found by A's Lookup, is found again by a second Lookup that
 *     A answers alone (its cache hits rise by the chain's keys; B and C
 *     serve no DirLookup); evicted on C, A's Acquire of it fails not-found
 *     within a bound and drops the stale entries, and A's Lookups (asking
 *     the owners again) stop returning it; a chain a peer announced as
 *     held by C, which never had it (the owners keep naming C), is
 *     offered by A's first Lookup, its Acquire fails not-found, and A's
 *     Lookups after it no longer offer it (C was found without it);
 * (6) held Acquires (wait_ms): a chain only C holds, found by A's Lookup;
 *     A's Acquire with a wait answers OK on its first answer (A held the
 *     reply while it fetched), the bytes exact; with C SIGSTOPped, an
 *     Acquire with a wait of 300 ms answers in-progress (held, then let
 *     go: no hang), and one whose client closes while it is held gets no
 *     reply and leaves no lease; C continued, the Acquire with a wait
 *     answers OK, the bytes exact, and A holds no lease once it is
 *     released;
 * (3) runs last: it takes C away. Skips (77) where namespaces or etcd are
 * missing, as the other cluster tests do.
 */
#include "cluster.h"
#include "kvdock.h"
#include "ltest.h"
#include "test_store_util.h"

#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define PAGES      8
#define PAGE_SIZE  16
#define A          0
#define B          1
#define C          2
#define WAIT_MS    30000 /* the directory's announcements, a membership change */
#define ACQUIRE_MS 15000 /* an Acquire's fetch (or its failure) */
#define SALT       3

/* LookupReply tiers (KVD_TIER_* of store/kvd_store.h, which cannot be
 * included beside kvdock.h: both name a kvd_store_t) */
#define TIER_DRAM   0
#define TIER_REMOTE 2

/* the linker workers' pool: one layer of a K and a V buffer */
#define L_PS    16
#define L_PAGES 4
#define L_ROWS  (L_PAGES * L_PS)
#define L_BPR   4096
#define L_RID   41

static kc_cluster_t cl;
static kvd_key_t chain1[PAGES], chain2[PAGES], chain3[PAGES], ghost[PAGES];
static kvd_key_t chain4[PAGES], chain5[PAGES], phantom[PAGES];

/* ------------------------------------------------------------ helpers */

/* Reserve, write the pattern, Publish: chain keys[0..n) on node i. */
static void publish_on(int node, const kvd_key_t *keys, size_t n)
{
    kvd_ns_spec_t spec = ts_spec(TS_KV_NS, TS_KV_BYTES);
    char where[32];
    snprintf(where, sizeof(where), "publish on node %d", node);
    ts_put_chain(cl.node[node].socket, &spec, keys, n, SALT, where);
}

/* A Lookup of keys[0..n) in namespace ns: the boundaries into b and their
 * tiers into tiers (0 each when the reply has none), their number in *nb.
 * The call's status. */
static int lookup_tiers(kvd_client_t *c, uint32_t ns, const kvd_key_t *keys, size_t n,
                        uint32_t *b, uint32_t *tiers, size_t *nb)
{
    kvd_lookup_pool_msg_t pool = {.ns = ns, .n_keys = n, .keys = (kvd_key_t *)keys};
    kvd_msg_t req, rep;
    kvd_msg_request(&req, 0, KVD_METHOD_LOOKUP);
    req.body.lookup_req = (kvd_lookup_req_t){.n_pools = 1, .pools = &pool};
    int rc = kvd_client_call(c, &req, &rep, TS_RPC_TIMEOUT_MS);
    *nb = 0;
    if (rc == KVD_OK && rep.status != KVD_OK)
        rc = rep.status;
    if (rc == KVD_OK) {
        const kvd_lookup_rep_t *l = &rep.body.lookup_rep;
        for (size_t i = 0; i < l->n && i < n; i++) {
            b[i] = l->boundaries[i];
            tiers[i] = l->tiers ? l->tiers[i] : TIER_DRAM;
        }
        *nb = KVD_MIN(l->n, n);
    }
    kvd_msg_clear(&rep);
    return rc;
}

/* Polls A's Lookup (every 100 ms, at most WAIT_MS) until it returns the
 * whole chain (pred: want_all) or nothing (!want_all). */
static bool lookup_until(kvd_client_t *c, uint32_t ns, const kvd_key_t *keys, size_t n,
                         bool want_all, uint32_t *b, uint32_t *tiers, size_t *nb,
                         uint64_t *waited_ms)
{
    uint64_t t0 = kc_now_ms();
    for (;;) {
        int rc = lookup_tiers(c, ns, keys, n, b, tiers, nb);
        bool all = *nb > 0 && b[*nb - 1] == n;
        if (rc == KVD_OK && (want_all ? all : *nb == 0)) {
            *waited_ms = kc_now_ms() - t0;
            return true;
        }
        if (kc_now_ms() > t0 + WAIT_MS)
            return false;
        kvd_sleep_ns(100000000);
    }
}

/* Acquires keys on c, asking again while the daemon answers in-progress
 * (every 10 ms, at most ACQUIRE_MS). The last status; *first the first
 * answer's, *rounds the answers. */
static int acquire_until(kvd_client_t *c, uint32_t ns, const kvd_key_t *keys, size_t n,
                         uint64_t *lease, uint64_t *offsets, int *first, int *rounds,
                         uint64_t *waited_ms, ts_err_t *err)
{
    uint64_t t0 = kc_now_ms();
    int rc;
    *rounds = 0;
    for (;;) {
        rc = ts_acquire(c, ns, TS_KV_BYTES, keys, n, lease, offsets, err);
        if ((*rounds)++ == 0)
            *first = rc;
        if (rc != KVD_INPROGRESS || kc_now_ms() > t0 + ACQUIRE_MS)
            break;
        kvd_sleep_ns(10000000);
    }
    *waited_ms = kc_now_ms() - t0;
    return rc;
}

/* Publishes keys[0..PAGES) on C and waits for A's Lookup to find all of
 * them (lookup_until): boundaries and tiers into b and tiers, their number
 * into *nb, the wait into *waited; false (a failure naming what) when it
 * does not. */
static bool published_on_c(ts_client_t *wa, const kvd_key_t *keys, const char *what,
                           uint32_t *b, uint32_t *tiers, size_t *nb, uint64_t *waited)
{
    publish_on(C, keys, PAGES);
    return DT_CHECK(
        lookup_until(wa->c, wa->ns[0], keys, PAGES, true, b, tiers, nb, waited),
        "%s: A's Lookup should find the chain published on C: %zu boundaries", what, *nb);
}

/* A's Health through a fresh Unix connection answers ready. */
static bool a_serves(void)
{
    return kvd_client_health_once(cl.node[A].socket, 2000, 5000) == KVD_HEALTH_READY;
}

/* ---------------------------------------------------------- (1) RPC */

static void rpc_level(ts_client_t *wa)
{
    uint32_t b[PAGES], tiers[PAGES];
    size_t nb = 0;
    uint64_t waited = 0;
    if (!published_on_c(wa, chain1, "(1)", b, tiers, &nb, &waited))
        return;
    printf("(1) the chain published on C found by a Lookup on A after %llu ms\n",
           (unsigned long long)waited);
    bool all_remote = true;
    for (size_t i = 0; i < nb; i++) {
        DT_CHECK(b[i] == i + 1, "(1) boundary %zu is %u, want %zu (a chain)", i, b[i],
                 i + 1);
        all_remote = all_remote && tiers[i] == TIER_REMOTE;
    }
    DT_CHECK(nb == PAGES && all_remote,
             "(1) every boundary of a chain only C holds should be tier remote (%d): "
             "%zu boundaries, tier of the last %u",
             TIER_REMOTE, nb, nb ? tiers[nb - 1] : 0);

    uint64_t lease = 0, offsets[PAGES];
    int first = 0, rounds = 0;
    ts_err_t err = {0};
    int rc = acquire_until(wa->c, wa->ns[0], chain1, PAGES, &lease, offsets, &first,
                           &rounds, &waited, &err);
    DT_CHECK(first == KVD_INPROGRESS,
             "(1) A's first Acquire of keys only C holds should answer in-progress: %s "
             "(%s)",
             kvd_status_str(first), err.text);
    if (!DT_CHECK(rc == KVD_OK && lease != 0,
                  "(1) A's Acquire should end OK after the fetch: %s (%s) after %d "
                  "answers, %llu ms",
                  kvd_status_str(rc), err.text, rounds, (unsigned long long)waited))
        return;
    printf("(1) A's Acquire: OK after %d answers, %llu ms\n", rounds,
           (unsigned long long)waited);
    for (size_t i = 0; i < PAGES; i++) {
        if (!DT_CHECK(wa->pool && ts_in_pool(offsets[i], TS_KV_BYTES, wa->pool_bytes),
                      "(1) offset %zu (%llu) outside A's pool", i,
                      (unsigned long long)offsets[i]))
            continue;
        size_t bad = ts_verify(wa->pool + offsets[i], TS_KV_BYTES, chain1[i], SALT);
        DT_CHECK(bad == SIZE_MAX,
                 "(1) page %zu in A's pool differs from what C wrote at byte %zu", i,
                 bad);
    }
    DT_CHECK(ts_release(wa->c, lease, &err) == KVD_OK, "(1) release on A: %s", err.text);

    rc = lookup_tiers(wa->c, wa->ns[0], chain1, PAGES, b, tiers, &nb);
    bool dram = rc == KVD_OK && nb == PAGES;
    for (size_t i = 0; dram && i < nb; i++)
        dram = tiers[i] == TIER_DRAM;
    DT_CHECK(dram,
             "(1) after the load A's Lookup should answer the whole chain from DRAM: %s, "
             "%zu boundaries, tier of the last %u",
             kvd_status_str(rc), nb, nb ? tiers[nb - 1] : 0);
}

/* ------------------------------------------------------- (2) linker */

static uint8_t l_pattern(size_t i, int buf)
{
    return (uint8_t)(i * (buf ? 17 : 31) + (buf ? 3 : 7) + (i >> 12));
}

typedef struct worker {
    int node;
    bool offload;    /* C's worker; else A's, which loads */
    uint32_t token0; /* the first token of its prompt */
    /* A's worker in (3): after its lookup it says so on ready_fd and waits
     * for go_fd (C killed meanwhile); its load must then fail cleanly */
    int ready_fd, go_fd;
} worker_t;

static int open_linker(int node, const char *name, uint8_t *k, uint8_t *v,
                       kvd_linker_t **l, uint32_t *pool)
{
    kvd_linker_config_t cfg = {.socket_path = cl.node[node].socket,
                               .transport = "shm",
                               .client_name = name,
                               .model_id = "remote-load",
                               .timeout_ms = 10000};
    int rc = kvd_linker_open(&cfg, l);
    if (!DT_CHECK(rc == 0, "%s: kvd_linker_open: %d", name, rc))
        return rc;
    rc = lt_register_kv(*l, "kv", k, v, L_BPR, L_PS, L_ROWS, NULL, pool);
    DT_CHECK(rc == 0, "%s: register pool: %d", name, rc);
    return rc;
}

/* (3) at the linker: the pages found, C killed (by the parent, between
 * ready and go), the load fails, by kvd_load's answer (not found: nothing
 * pinned) or (rid, false), within a bound. */
static void dies_load(const worker_t *w, kvd_linker_t *l, const kvd_transfer_t *t)
{
    char ch = 'L';
    if (!DT_CHECK(write(w->ready_fd, &ch, 1) == 1, "(3) worker: cannot say ready"))
        return;
    struct pollfd p = {.fd = w->go_fd, .events = POLLIN};
    if (!DT_CHECK(poll(&p, 1, WAIT_MS) == 1 && read(w->go_fd, &ch, 1) == 1,
                  "(3) worker: no go from the test"))
        return;
    uint64_t t0 = kc_now_ms();
    int rc = lt_load_all(l, L_RID + 1, t, L_PAGES);
    bool came = false, ok = false;
    if (rc == 0) {
        /* committed: the completion must come back, and not as a success */
        for (int waited = 0; !came && waited <= ACQUIRE_MS; waited += 10) {
            kvd_completion_t c[4];
            size_t n = 0;
            kvd_pop_completed_loads(l, c, 4, &n);
            for (size_t j = 0; j < n; j++)
                if (c[j].id == L_RID + 1) {
                    came = true;
                    ok = c[j].success;
                }
            if (!came)
                kvd_sleep_ns(10000000);
        }
        DT_CHECK(came && !ok,
                 "(3) the load from a dead holder should complete (rid, false): %s",
                 came ? "(rid, true)" : "no completion");
    } else {
        DT_CHECK(rc == KVD_ERR_NOT_FOUND,
                 "(3) the load from a dead holder should fail not-found: %d", rc);
        kvd_load_abort(l, L_RID + 1);
    }
    printf("(3) A's worker's load from the dead holder: %s after %llu ms\n",
           rc != 0 ? kvd_strerror(rc)
           : came  ? "(rid, false)"
                   : "nothing",
           (unsigned long long)(kc_now_ms() - t0));
}

/* The worker, in its node's namespace (a child: its exit status is its
 * failures). */
static int worker_main(void *arg)
{
    const worker_t *w = arg;
    const char *name = w->offload ? "worker-c" : "worker-a";
    unsigned before = (unsigned)dt_failure_count(); /* the parent's, inherited */
    uint8_t *k = calloc(L_ROWS, L_BPR), *v = calloc(L_ROWS, L_BPR);
    kvd_linker_t *l = NULL;
    uint32_t pool = 0;
    if (!DT_CHECK(k && v, "%s: out of memory", name) ||
        open_linker(w->node, name, k, v, &l, &pool) != 0)
        goto out;
    uint32_t tokens[L_ROWS];
    for (int i = 0; i < L_ROWS; i++)
        tokens[i] = w->token0 + (uint32_t)i;
    uint8_t keys[L_PAGES][KVD_PAGE_KEY_BYTES];
    size_t n_keys = 0;
    kvd_page_keys(tokens, L_ROWS, L_PS, NULL, keys, &n_keys);
    int64_t idx[L_ROWS];
    for (int i = 0; i < L_ROWS; i++)
        idx[i] = i;
    kvd_transfer_t t = {.pool_id = pool,
                        .keys = (const uint8_t(*)[KVD_PAGE_KEY_BYTES])keys,
                        .n_keys = L_PAGES,
                        .device_indices = idx,
                        .n_indices = L_ROWS};
    if (w->offload) {
        for (size_t i = 0; i < (size_t)L_ROWS * L_BPR; i++) {
            k[i] = l_pattern(i, 0);
            v[i] = l_pattern(i, 1);
        }
        uint64_t ack = 0;
        int rc = kvd_offload(l, &t, 1, &ack);
        DT_CHECK(rc == 0 && lt_wait_done(l, false, ack, 10000),
                 "(2) the offload on C should succeed: %d", rc);
        goto out;
    }
    /* A's worker: the announcement from C is asynchronous, poll (bounded) */
    uint32_t b[L_PAGES];
    size_t nb = 0;
    uint64_t t0 = kc_now_ms();
    int rc = 0;
    while (kc_now_ms() < t0 + WAIT_MS) {
        rc = kvd_lookup(l, L_RID, &t, 1, b, &nb);
        if (rc == 0 && nb > 0 && b[nb - 1] == L_PAGES)
            break;
        kvd_sleep_ns(100000000);
    }
    if (!DT_CHECK(rc == 0 && nb > 0 && b[nb - 1] == L_PAGES,
                  "(2) A's worker should find the %d pages C's worker offloaded: %d, %zu "
                  "boundaries",
                  L_PAGES, rc, nb))
        goto out;
    if (w->go_fd >= 0) {
        dies_load(w, l, &t);
        goto out;
    }
    printf("(2) A's worker found C's pages after %llu ms\n",
           (unsigned long long)(kc_now_ms() - t0));
    rc = lt_load_all(l, L_RID, &t, L_PAGES);
    bool done = rc == 0 && lt_wait_done(l, true, L_RID, 15000);
    DT_CHECK(done, "(2) A's worker's load should complete (rid, true): %d", rc);
    size_t bad = 0;
    for (size_t i = 0; i < (size_t)L_ROWS * L_BPR; i++)
        bad += k[i] != l_pattern(i, 0) || v[i] != l_pattern(i, 1);
    DT_CHECK(done && bad == 0, "(2) %zu bytes of A's worker's buffers differ from C's",
             bad);
    if (done && bad == 0)
        printf("(2) A's worker loaded C's %d pages byte-exact in %llu ms\n", L_PAGES,
               (unsigned long long)(kc_now_ms() - t0));
out:
    kvd_linker_close(l);
    free(k);
    free(v);
    return (unsigned)dt_failure_count() > before ? 1 : 0;
}

static void linker_level(void)
{
    worker_t wc = {
        .node = C, .offload = true, .token0 = 500, .ready_fd = -1, .go_fd = -1};
    worker_t wa = {
        .node = A, .offload = false, .token0 = 500, .ready_fd = -1, .go_fd = -1};
    int rc = kc_run_in(cl.node[C].ns, worker_main, &wc, 60000);
    if (!DT_CHECK(rc == 0, "(2) the worker on C failed (%d)", rc))
        return;
    rc = kc_run_in(cl.node[A].ns, worker_main, &wa, 90000);
    DT_CHECK(rc == 0, "(2) the worker on A failed (%d)", rc);
}

/* -------------------------------------------------- (4) bad peers */

/* A TCP connection to node that said Hello with the token in token_file. */
static kvd_client_t *tcp_hello_to(int node, const char *token_file, const char *what)
{
    uint8_t tok[256];
    size_t len = 0;
    char why[256];
    kvd_client_t *c = NULL;
    if (!DT_CHECK(kvd_client_token_read(token_file, tok, sizeof(tok), &len, why,
                                        sizeof(why)) == KVD_OK,
                  "(4) %s token: %s", what, why))
        return NULL;
    int rc = kvd_client_connect_tcp(cl.node[node].addr, 5000, &c);
    if (rc == KVD_OK)
        rc = kvd_client_hello(c, what, tok, len, 5000, NULL);
    if (!DT_CHECK(rc == KVD_OK, "(4) Hello to node %d with the %s token: %s", node, what,
                  kvd_status_str(rc))) {
        kvd_client_close(c);
        return NULL;
    }
    return c;
}

static kvd_client_t *tcp_hello(const char *token_file, const char *what)
{
    return tcp_hello_to(A, token_file, what);
}

/* Writes raw bytes on c's socket (a frame the client would never make). */
static bool write_raw(kvd_client_t *c, const void *p, size_t len)
{
    const uint8_t *b = p;
    while (len > 0) {
        ssize_t w = write(kvd_client_fd(c), b, len);
        if (w <= 0)
            return false;
        b += w;
        len -= (size_t)w;
    }
    return true;
}

/* After garbage on c: the daemon answered with an error (the next call
 * gets it) or closed; never a plain OK as if nothing had come. */
static void refused(kvd_client_t *c, const char *what)
{
    kvd_msg_t req, rep;
    kvd_msg_request(&req, 0, KVD_METHOD_HEALTH);
    int rc = kvd_client_call(c, &req, &rep, 5000);
    int st = rc == KVD_OK ? rep.status : rc;
    kvd_msg_clear(&rep);
    DT_CHECK(st != KVD_OK && st != KVD_ERR_TIMEOUT,
             "(4) %s: A should answer an error or close, not %s", what,
             kvd_status_str(st));
    DT_CHECK(a_serves(), "(4) A stopped serving after %s", what);
}

static void garbage_frame(const char *what, const uint8_t *payload, size_t len,
                          uint32_t claimed)
{
    kvd_client_t *c = tcp_hello(cl.peer_token_file, "peer");
    if (c == NULL)
        return;
    kvd_buf_t b;
    kvd_buf_init(&b, KVD_MEM_OTHER);
    bool ok = kvd_frame_put_header(&b, claimed ? claimed : len) == KVD_OK &&
              kvd_buf_append(&b, payload, len) == KVD_OK && write_raw(c, b.data, b.len);
    kvd_buf_free(&b);
    if (DT_CHECK(ok, "(4) %s: could not write the frame", what))
        refused(c, what);
    kvd_client_close(c);
}

/* A Fetch reply sent to A as if it were a request. */
static void reply_as_request(void)
{
    kvd_client_t *c = tcp_hello(cl.peer_token_file, "peer");
    if (c == NULL)
        return;
    static uint8_t present[2] = {1, 1}, data[2 * 64];
    static uint32_t depths[2] = {0, 1};
    kvd_msg_t m = {0};
    kvd_msg_request(&m, 7, KVD_METHOD_FETCH);
    m.reply = true;
    m.body.fetch_rep = (kvd_fetch_rep_t){.object_bytes = 64,
                                         .n = 2,
                                         .present = present,
                                         .data_len = sizeof(data),
                                         .data = data,
                                         .n_depths = 2,
                                         .depths = depths};
    kvd_buf_t b;
    kvd_buf_init(&b, KVD_MEM_OTHER);
    bool ok = kvd_msg_pack(&m, KVD_FRAME_DEFAULT_MAX, &b) == KVD_OK &&
              write_raw(c, b.data, b.len);
    kvd_buf_free(&b);
    if (DT_CHECK(ok, "(4) could not send the Fetch reply"))
        refused(c, "a Fetch reply sent as a request");
    kvd_client_close(c);
}

/* One call on c; the reply's status (or the call's), rep kept. */
static int call(kvd_client_t *c, kvd_msg_t *req, kvd_msg_t *rep)
{
    int rc = kvd_client_call(c, req, rep, TS_RPC_TIMEOUT_MS);
    return rc == KVD_OK ? rep->status : rc;
}

/* A directory batch of chain1's first key, in the default tenant's kv
 * namespace (k1 holds the key). */
static kvd_dir_keys_t first_key_batch(kvd_key_t k1[1])
{
    memcpy(k1[0], chain1[0], KVD_KEY_BYTES);
    kvd_dir_keys_t batch = {.n_added = 1, .added = k1};
    kvd_strlcpy(batch.tenant, "default", sizeof(batch.tenant));
    kvd_strlcpy(batch.ns_name, TS_KV_NS, sizeof(batch.ns_name));
    return batch;
}

static void bad_requests(void)
{
    kvd_client_t *c = tcp_hello(cl.peer_token_file, "peer");
    if (c == NULL)
        return;
    kvd_msg_t req, rep;
    /* a DirAnnounce that names no holder */
    kvd_key_t k1[1];
    kvd_dir_keys_t batch = first_key_batch(k1);
    kvd_msg_request(&req, 0, KVD_METHOD_DIR_ANNOUNCE);
    req.body.dir_announce_req = (kvd_dir_announce_req_t){.n = 1, .batches = &batch};
    int st = call(c, &req, &rep);
    kvd_msg_clear(&rep);
    DT_CHECK(st == KVD_ERR_INVALID, "(4) a DirAnnounce without a holder: want %s, got %s",
             kvd_status_str(KVD_ERR_INVALID), kvd_status_str(st));

    /* a Fetch of a namespace A does not know: every key absent */
    kvd_msg_request(&req, 0, KVD_METHOD_FETCH);
    req.body.fetch_req = (kvd_fetch_req_t){.n = PAGES, .keys = chain1};
    kvd_strlcpy(req.body.fetch_req.tenant, "default", sizeof(req.body.fetch_req.tenant));
    kvd_strlcpy(req.body.fetch_req.ns_name, "no/such/ns",
                sizeof(req.body.fetch_req.ns_name));
    st = call(c, &req, &rep);
    size_t present = 0;
    for (size_t i = 0; st == KVD_OK && i < rep.body.fetch_rep.n; i++)
        present += rep.body.fetch_rep.present[i] != 0;
    DT_CHECK(st == KVD_OK && rep.body.fetch_rep.n == PAGES && present == 0 &&
                 rep.body.fetch_rep.data_len == 0,
             "(4) a Fetch of an unknown namespace should answer every key absent: %s, "
             "n %zu, %zu present, %zu bytes",
             kvd_status_str(st), rep.body.fetch_rep.n, present,
             rep.body.fetch_rep.data_len);
    kvd_msg_clear(&rep);

    /* a Fetch of more keys than one reply carries (chain1 is on A now,
     * repeated): the reply carries at most a frame's worth, each present
     * key's bytes, and those bytes are the objects' */
    enum { MANY = 100 * PAGES };
    static kvd_key_t many[MANY];
    for (size_t i = 0; i < MANY; i++)
        memcpy(many[i], chain1[i % PAGES], KVD_KEY_BYTES);
    kvd_msg_request(&req, 0, KVD_METHOD_FETCH);
    req.body.fetch_req = (kvd_fetch_req_t){.n = MANY, .keys = many};
    kvd_strlcpy(req.body.fetch_req.tenant, "default", sizeof(req.body.fetch_req.tenant));
    kvd_strlcpy(req.body.fetch_req.ns_name, TS_KV_NS, sizeof(req.body.fetch_req.ns_name));
    st = call(c, &req, &rep);
    const kvd_fetch_rep_t *f = &rep.body.fetch_rep;
    present = 0;
    size_t again = 0;
    for (size_t i = 0; st == KVD_OK && i < f->n; i++) {
        present += f->present[i] == KVD_FETCH_HERE;
        again += f->present[i] == KVD_FETCH_PROMOTING;
    }
    /* every key is held there: those past the frame are "ask again", never
     * absent (the asker would take C for a member without them) */
    bool shaped = st == KVD_OK && f->n == MANY && f->object_bytes == TS_KV_BYTES &&
                  present > 0 && present < MANY && present + again == MANY &&
                  f->n_depths == present && f->data_len == present * TS_KV_BYTES;
    DT_CHECK(shaped,
             "(4) a Fetch of %d keys: %s, n %zu, object_bytes %llu, %zu present, %zu "
             "ask again, %zu depths, %zu bytes",
             MANY, kvd_status_str(st), f->n, (unsigned long long)f->object_bytes, present,
             again, f->n_depths, f->data_len);
    for (size_t i = 0, d = 0; shaped && i < f->n; i++) {
        if (f->present[i] != KVD_FETCH_HERE)
            continue;
        size_t bad =
            ts_verify(f->data + d++ * TS_KV_BYTES, TS_KV_BYTES, chain1[i % PAGES], SALT);
        if (!DT_CHECK(bad == SIZE_MAX, "(4) Fetch reply's object %zu differs at byte %zu",
                      i, bad))
            break;
    }
    if (shaped)
        printf("(4) a Fetch of %d keys carried %zu of them, the others \"ask again\"\n",
               MANY, present);
    kvd_msg_clear(&rep);

    /* a local DirLookup of nothing, and of keys nobody announced */
    kvd_dir_keys_t q = {.n_added = MANY, .added = many};
    kvd_strlcpy(q.tenant, "nobody", sizeof(q.tenant));
    kvd_strlcpy(q.ns_name, "x", sizeof(q.ns_name));
    kvd_msg_request(&req, 0, KVD_METHOD_DIR_LOOKUP);
    req.body.dir_lookup_req =
        (kvd_dir_lookup_req_t){.n = 1, .queries = &q, .local = true};
    st = call(c, &req, &rep);
    bool none = st == KVD_OK && rep.body.dir_lookup_rep.n == 1;
    for (size_t i = 0; none && i < rep.body.dir_lookup_rep.n_holders[0]; i++)
        none = rep.body.dir_lookup_rep.holders[0][i] == 0;
    DT_CHECK(none, "(4) a local DirLookup of an unknown namespace: %s, want no holders",
             kvd_status_str(st));
    kvd_msg_clear(&rep);
    kvd_client_close(c);
    DT_CHECK(a_serves(), "(4) A stopped serving after the peer's bad requests");
}

static void not_a_peer(void)
{
    kvd_client_t *c = tcp_hello(cl.client_token_file, "operator");
    if (c == NULL)
        return;
    kvd_msg_t req, rep;
    kvd_key_t k1[1];
    kvd_dir_keys_t batch = first_key_batch(k1);

    kvd_msg_request(&req, 0, KVD_METHOD_DIR_ANNOUNCE);
    req.body.dir_announce_req =
        (kvd_dir_announce_req_t){.n = 1, .batches = &batch, .reset = true};
    kvd_strlcpy(req.body.dir_announce_req.holder, cl.node[C].node_id,
                sizeof(req.body.dir_announce_req.holder));
    int st = call(c, &req, &rep);
    kvd_msg_clear(&rep);
    DT_CHECK(st == KVD_ERR_PERMISSION,
             "(4) DirAnnounce with the operator's token: want %s, got %s",
             kvd_status_str(KVD_ERR_PERMISSION), kvd_status_str(st));

    kvd_msg_request(&req, 0, KVD_METHOD_FETCH);
    req.body.fetch_req = (kvd_fetch_req_t){.n = 1, .keys = k1};
    kvd_strlcpy(req.body.fetch_req.tenant, "default", sizeof(req.body.fetch_req.tenant));
    kvd_strlcpy(req.body.fetch_req.ns_name, TS_KV_NS, sizeof(req.body.fetch_req.ns_name));
    st = call(c, &req, &rep);
    bool leaked = st == KVD_OK && rep.body.fetch_rep.data_len > 0;
    kvd_msg_clear(&rep);
    DT_CHECK(st == KVD_ERR_PERMISSION && !leaked,
             "(4) Fetch with the operator's token: want %s, got %s",
             kvd_status_str(KVD_ERR_PERMISSION), kvd_status_str(st));

    kvd_msg_request(&req, 0, KVD_METHOD_DIR_LOOKUP);
    req.body.dir_lookup_req =
        (kvd_dir_lookup_req_t){.n = 1, .queries = &batch, .local = true};
    st = call(c, &req, &rep);
    kvd_msg_clear(&rep);
    DT_CHECK(st == KVD_ERR_PERMISSION,
             "(4) a local DirLookup with the operator's token: want %s, got %s",
             kvd_status_str(KVD_ERR_PERMISSION), kvd_status_str(st));
    kvd_client_close(c);
}

/* A peer's DirAnnounce to every member (each key's owner gets it): keys
 * as held by node id `holder`. */
static bool announce_as(const char *holder, const kvd_key_t *keys, const char *what)
{
    kvd_dir_keys_t batch = {.n_added = PAGES, .added = (kvd_key_t *)keys};
    kvd_strlcpy(batch.tenant, "default", sizeof(batch.tenant));
    kvd_strlcpy(batch.ns_name, TS_KV_NS, sizeof(batch.ns_name));
    for (int node = 0; node < 3; node++) {
        kvd_client_t *c = tcp_hello_to(node, cl.peer_token_file, "peer");
        if (c == NULL)
            return false;
        kvd_msg_t req, rep;
        kvd_msg_request(&req, 0, KVD_METHOD_DIR_ANNOUNCE);
        req.body.dir_announce_req = (kvd_dir_announce_req_t){.n = 1, .batches = &batch};
        kvd_strlcpy(req.body.dir_announce_req.holder, holder,
                    sizeof(req.body.dir_announce_req.holder));
        int st = call(c, &req, &rep);
        kvd_msg_clear(&rep);
        kvd_client_close(c);
        if (!DT_CHECK(st == KVD_OK, "%s: the DirAnnounce to node %d: %s", what, node,
                      kvd_status_str(st)))
            return false;
    }
    return true;
}

/* A peer announces a chain as held by "node-9", which is no member (to
 * every member: each key's owner gets it). A's Lookup must not offer it
 * (a lookup never returns a boundary it cannot acquire now: holders that
 * are not live members do not count), and A's Acquire of it fails
 * not-found within a bound, as for a holder that died. */
static void ghost_holder(ts_client_t *wa)
{
    if (!announce_as("node-9", ghost, "(4) a ghost"))
        return;
    uint32_t b[PAGES], tiers[PAGES];
    size_t before = 0, after = 0;
    lookup_tiers(wa->c, wa->ns[0], ghost, PAGES, b, tiers, &before);
    uint64_t lease = 0, offsets[PAGES], waited = 0;
    int first = 0, rounds = 0;
    ts_err_t err = {0};
    int rc = acquire_until(wa->c, wa->ns[0], ghost, PAGES, &lease, offsets, &first,
                           &rounds, &waited, &err);
    DT_CHECK(rc == KVD_ERR_NOT_FOUND,
             "(4) A's Acquire of a chain only a non-member is said to hold should fail "
             "not-found: %s (%s) after %d answers, %llu ms",
             kvd_status_str(rc), err.text, rounds, (unsigned long long)waited);
    if (lease != 0)
        ts_release(wa->c, lease, &err);
    lookup_tiers(wa->c, wa->ns[0], ghost, PAGES, b, tiers, &after);
    DT_CHECK(before == 0 && after == 0,
             "(4) a chain announced for non-member node-9: A's Lookup offered %zu "
             "boundaries before the Acquire and %zu after, want none",
             before, after);
}

static void bad_peers(ts_client_t *wa)
{
    static const uint8_t junk[] = {0xff, 0xfe, 0x12, 0x00, 0x9a, 0x7f, 0x01, 0x02,
                                   0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80};
    garbage_frame("an undecodable frame", junk, sizeof(junk), 0);
    /* a header that claims more than any frame may be */
    garbage_frame("a frame over the limit", junk, sizeof(junk), KVD_FRAME_LIMIT_MAX + 1u);
    reply_as_request();
    bad_requests();
    not_a_peer();
    ghost_holder(wa);
    /* and A still serves what it holds */
    uint32_t b[PAGES], tiers[PAGES];
    size_t nb = 0;
    int rc = lookup_tiers(wa->c, wa->ns[0], chain1, PAGES, b, tiers, &nb);
    DT_CHECK(rc == KVD_OK && nb == PAGES && tiers[PAGES - 1] == TIER_DRAM,
             "(4) after the bad peers A's Lookup of its chain: %s, %zu boundaries",
             kvd_status_str(rc), nb);
}

/* ------------------------------------------------ (3) holder dies */

/* ---------------------------------------------------- (5) the cache */

/* A's directory cache counters (`kvdock cluster --json`) into c[0..2]:
 * hits, misses, stale. */
static bool cache_counters(uint64_t c[3])
{
    static char out[1 << 16];
    int rc =
        kc_cli(&cl, A, out, sizeof(out), (const char *[]){"cluster", "--json", NULL});
    return rc == 0 && dt_json_u64(out, NULL, "dir_cache_hits", &c[0]) &&
           dt_json_u64(out, NULL, "dir_cache_misses", &c[1]) &&
           dt_json_u64(out, NULL, "dir_cache_stale", &c[2]);
}

/* DirLookup calls B and C served (their Stats), added. */
static uint64_t owner_dir_lookups(void)
{
    uint64_t n = 0;
    for (int i = B; i <= C; i++) {
        ts_stats_t st;
        if (ts_stats_fresh(cl.node[i].socket, false, &st) == 0)
            n += st.methods[KVD_METHOD_DIR_LOOKUP].calls;
    }
    return n;
}

static void cache_level(ts_client_t *wa)
{
    int failures_before = dt_failure_count();
    uint32_t b[PAGES], tiers[PAGES];
    size_t nb = 0;
    uint64_t waited = 0;
    if (!published_on_c(wa, chain3, "(5)", b, tiers, &nb, &waited))
        return;
    /* the chain found: the owners told A where it is, and A keeps it */
    uint64_t c0[3], c1[3], c2[3];
    uint64_t asked0 = owner_dir_lookups();
    if (!DT_CHECK(cache_counters(c0), "(5) A's cluster counters"))
        return;
    DT_CHECK(asked0 > 0 && c0[1] >= PAGES,
             "(5) finding the chain should have asked the owners: %llu DirLookups on B "
             "and C, %llu cache misses on A",
             (unsigned long long)asked0, (unsigned long long)c0[1]);
    int rc = lookup_tiers(wa->c, wa->ns[0], chain3, PAGES, b, tiers, &nb);
    uint64_t asked1 = owner_dir_lookups();
    DT_CHECK(cache_counters(c1), "(5) A's cluster counters");
    DT_CHECK(rc == KVD_OK && nb == PAGES && b[PAGES - 1] == PAGES &&
                 tiers[PAGES - 1] == TIER_REMOTE,
             "(5) the Lookup again should return the whole chain, tier remote: %s, %zu "
             "boundaries",
             kvd_status_str(rc), nb);
    DT_CHECK(c1[0] == c0[0] + PAGES && c1[1] == c0[1] && asked1 == asked0,
             "(5) the Lookup again should be answered from A's cache: hits %llu -> %llu "
             "(want +%d), misses %llu -> %llu, DirLookups on B and C %llu -> %llu",
             (unsigned long long)c0[0], (unsigned long long)c1[0], PAGES,
             (unsigned long long)c0[1], (unsigned long long)c1[1],
             (unsigned long long)asked0, (unsigned long long)asked1);
    /* evicted on C: the cache still names C (A was started with a TTL far
     * longer than this case), so the Acquire's fetch finds them gone, fails
     * cleanly and drops the entries; then A asks the owners again */
    for (size_t i = 0; i < PAGES; i++) {
        static char out[4096];
        char hx[2 * KVD_KEY_BYTES + 1];
        for (size_t k = 0; k < KVD_KEY_BYTES; k++)
            snprintf(hx + 2 * k, 3, "%02x", chain3[i][k]);
        DT_CHECK(kc_cli(&cl, C, out, sizeof(out),
                        (const char *[]){"evict", "--key", hx, "--namespace", TS_KV_NS,
                                         NULL}) == 0,
                 "(5) evict key %zu on C: %s", i, out);
    }
    uint64_t lease = 0, offsets[PAGES];
    int first = 0, rounds = 0;
    ts_err_t err = {0};
    rc = acquire_until(wa->c, wa->ns[0], chain3, PAGES, &lease, offsets, &first, &rounds,
                       &waited, &err);
    int evict_rounds = rounds;
    DT_CHECK(cache_counters(c2), "(5) A's cluster counters");
    DT_CHECK(rc == KVD_ERR_NOT_FOUND && c2[2] >= c1[2] + PAGES,
             "(5) A's Acquire of the chain C evicted should fail not-found, its cached "
             "entries stale: %s (%s) after %d answers, %llu ms; stale %llu -> %llu",
             kvd_status_str(rc), err.text, rounds, (unsigned long long)waited,
             (unsigned long long)c1[2], (unsigned long long)c2[2]);
    if (lease != 0)
        ts_release(wa->c, lease, &err);
    DT_CHECK(lookup_until(wa->c, wa->ns[0], chain3, PAGES, false, b, tiers, &nb, &waited),
             "(5) A's Lookup should no longer return the evicted chain: %zu boundaries",
             nb);
    uint64_t c3[3];
    DT_CHECK(cache_counters(c3) && c3[1] > c2[1],
             "(5) after the stale entries, A should ask the owners again: misses %llu -> "
             "%llu",
             (unsigned long long)c2[1], (unsigned long long)c3[1]);
    /* C named by the owners for keys it never had: what a holder's
     * eviction looks like before the owners hear of it. C tells the owners
     * it lacks them when its Fetch finds them missing (at its next tick),
     * so they are announced for C once more after that: the owners name C
     * again, as a slow announcement would leave them doing */
    size_t offered = 0, later = 0;
    if (announce_as(cl.node[C].node_id, phantom, "(5) keys announced for C")) {
        lookup_tiers(wa->c, wa->ns[0], phantom, PAGES, b, tiers, &offered);
        DT_CHECK(offered == PAGES,
                 "(5) keys the owners say C holds: A's first Lookup should offer them "
                 "(it cannot know better yet): %zu boundaries",
                 offered);
        rc = acquire_until(wa->c, wa->ns[0], phantom, PAGES, &lease, offsets, &first,
                           &rounds, &waited, &err);
        DT_CHECK(rc == KVD_ERR_NOT_FOUND,
                 "(5) A's Acquire of keys C never had should fail not-found: %s (%s)",
                 kvd_status_str(rc), err.text);
        if (lease != 0)
            ts_release(wa->c, lease, &err);
        kvd_sleep_ns(300000000); /* C's "not here" reached the owners */
        announce_as(cl.node[C].node_id, phantom, "(5) keys announced for C again");
        for (int k = 0; k < 3; k++) {
            size_t nb_k = 0;
            lookup_tiers(wa->c, wa->ns[0], phantom, PAGES, b, tiers, &nb_k);
            later = KVD_MAX(later, nb_k);
        }
        DT_CHECK(later == 0,
                 "(5) C found without the keys: A's Lookups should stop offering them "
                 "although the owners still name C: up to %zu boundaries in 3 Lookups",
                 later);
    }
    if (dt_failure_count() == failures_before)
        printf("(5) cache: a second Lookup answered by A alone (+%llu hits, no DirLookup "
               "on B or C); the chain evicted on C: Acquire not-found after %d answers, "
               "%llu stale entries dropped, then gone from A's Lookups; keys the owners "
               "say C holds but C never had: offered once (%zu), then no more\n",
               (unsigned long long)(c1[0] - c0[0]), evict_rounds,
               (unsigned long long)(c2[2] - c1[2]), offered);
}

/* (6): the pages of an Acquire's offsets in A's pool are the chain's. */
static void check_bytes(const ts_client_t *wa, const kvd_key_t *keys, const uint64_t *off,
                        const char *what)
{
    for (size_t i = 0; i < PAGES; i++) {
        if (!DT_CHECK(wa->pool && ts_in_pool(off[i], TS_KV_BYTES, wa->pool_bytes),
                      "(6) %s: offset %zu (%llu) outside A's pool", what, i,
                      (unsigned long long)off[i]))
            continue;
        size_t bad = ts_verify(wa->pool + off[i], TS_KV_BYTES, keys[i], SALT);
        DT_CHECK(bad == SIZE_MAX,
                 "(6) %s: page %zu differs from what C wrote at byte %zu", what, i, bad);
    }
}

static bool no_leases(const ts_stats_t *s)
{
    return s->store.leases == 0;
}

static void held_level(ts_client_t *wa)
{
    int failures_before = dt_failure_count();
    uint32_t b[PAGES], tiers[PAGES];
    size_t nb = 0;
    uint64_t waited = 0;
    if (!published_on_c(wa, chain4, "(6)", b, tiers, &nb, &waited) ||
        !published_on_c(wa, chain5, "(6)", b, tiers, &nb, &waited))
        return;
    uint64_t lease = 0, off[PAGES];
    ts_err_t err = {0};
    uint64_t t0 = kc_now_ms();
    int rc = ts_acquire_wait(wa->c, wa->ns[0], TS_KV_BYTES, chain4, PAGES,
                             KVD_ACQUIRE_WAIT_MAX_MS, &lease, off, &err);
    uint64_t first_ms = kc_now_ms() - t0;
    /* OK on the first answer; on a machine so busy that the fetch took
     * longer than the wait, in progress only after the whole wait (held
     * all the same), and then OK */
    DT_CHECK(rc == KVD_OK ||
                 (rc == KVD_INPROGRESS && first_ms >= KVD_ACQUIRE_WAIT_MAX_MS),
             "(6) A's Acquire with a wait of keys only C holds should answer OK at once "
             "(held while A fetched): %s (%s) after %llu ms",
             kvd_status_str(rc), err.text, (unsigned long long)first_ms);
    while (rc == KVD_INPROGRESS && kc_now_ms() < t0 + ACQUIRE_MS)
        rc = ts_acquire_wait(wa->c, wa->ns[0], TS_KV_BYTES, chain4, PAGES,
                             KVD_ACQUIRE_WAIT_MAX_MS, &lease, off, &err);
    if (DT_CHECK(rc == KVD_OK && lease != 0, "(6) the held Acquire: %s (%s)",
                 kvd_status_str(rc), err.text)) {
        check_bytes(wa, chain4, off, "held Acquire");
        DT_CHECK(ts_release(wa->c, lease, &err) == KVD_OK, "(6) release: %s", err.text);
    }

    /* C stopped: A's fetch cannot end; the held Acquire is let go at its
     * wait, and a client that leaves meanwhile is forgotten */
    pid_t cpid = cl.node[C].pid;
    if (!DT_CHECK(cpid > 0 && kill(cpid, SIGSTOP) == 0, "(6) SIGSTOP C (pid %d)",
                  (int)cpid))
        return;
    lease = 0;
    t0 = kc_now_ms();
    rc = ts_acquire_wait(wa->c, wa->ns[0], TS_KV_BYTES, chain5, PAGES, 300, &lease, off,
                         &err);
    uint64_t held_ms = kc_now_ms() - t0;
    DT_CHECK(rc == KVD_INPROGRESS && held_ms >= 300,
             "(6) with C stopped, an Acquire with a wait of 300 ms should answer "
             "in-progress after its wait: %s (%s) after %llu ms",
             kvd_status_str(rc), err.text, (unsigned long long)held_ms);
    if (rc == KVD_OK && lease != 0)
        ts_release(wa->c, lease, &err);
    kvd_ns_spec_t spec = ts_spec(TS_KV_NS, TS_KV_BYTES);
    ts_client_t gone;
    if (ts_open(&gone, cl.node[A].socket, &spec, 1, false) == 0) {
        kvd_msg_t req, rep;
        kvd_msg_request(&req, 0, KVD_METHOD_ACQUIRE);
        req.body.acquire_req = (kvd_acquire_req_t){.ns = gone.ns[0],
                                                   .object_bytes = TS_KV_BYTES,
                                                   .n = PAGES,
                                                   .keys = chain5,
                                                   .wait_ms = KVD_ACQUIRE_WAIT_MAX_MS};
        int call = kvd_client_call(gone.c, &req, &rep, 50);
        DT_CHECK(call == KVD_ERR_TIMEOUT,
                 "(6) an Acquire held while C is stopped should not be answered within "
                 "50 ms: %s",
                 kvd_status_str(call));
        kvd_msg_clear(&rep);
        ts_close(&gone); /* leaves with its Acquire held */
    }
    DT_CHECK(a_serves(), "(6) A should serve while a fetch from the stopped C waits");
    DT_CHECK(kill(cpid, SIGCONT) == 0, "(6) SIGCONT C");
    int rounds = 0;
    t0 = kc_now_ms();
    do {
        rc = ts_acquire_wait(wa->c, wa->ns[0], TS_KV_BYTES, chain5, PAGES,
                             KVD_ACQUIRE_WAIT_MAX_MS, &lease, off, &err);
        rounds++;
        /* a fetch that outlived A's peer timeout while C was stopped (a
         * busy machine) failed: its keys answer not-found for a while,
         * then are fetched anew */
        if (rc == KVD_ERR_NOT_FOUND)
            kvd_sleep_ns(100000000);
    } while ((rc == KVD_INPROGRESS || rc == KVD_ERR_NOT_FOUND) &&
             kc_now_ms() < t0 + ACQUIRE_MS);
    if (DT_CHECK(
            rc == KVD_OK && lease != 0,
            "(6) C continued: the Acquire with a wait should answer OK: %s (%s) after "
            "%d answers",
            kvd_status_str(rc), err.text, rounds)) {
        check_bytes(wa, chain5, off, "after C continued");
        DT_CHECK(ts_release(wa->c, lease, &err) == KVD_OK, "(6) release: %s", err.text);
    }
    ts_stats_t st;
    DT_CHECK(ts_wait_stats(cl.node[A].socket, WAIT_MS, no_leases, &st),
             "(6) A should hold no lease once the loads released theirs and the client "
             "that left is gone: %llu",
             (unsigned long long)st.store.leases);
    if (dt_failure_count() == failures_before)
        printf("(6) held Acquire: OK on its first answer (%llu ms, the fetch from C "
               "inside); C stopped: in-progress after %llu ms of a 300 ms wait, a client "
               "gone while held left no lease; C continued: OK after %d answers\n",
               (unsigned long long)first_ms, (unsigned long long)held_ms, rounds);
}

static void holder_dies(ts_client_t *wa)
{
    uint32_t b[PAGES], tiers[PAGES];
    size_t nb = 0;
    uint64_t waited = 0;
    if (!published_on_c(wa, chain2, "(3)", b, tiers, &nb, &waited))
        return;
    DT_CHECK(tiers[nb - 1] == TIER_REMOTE, "(3) the second chain's tier: %u",
             tiers[nb - 1]);
    /* and at the linker: C's worker offloads, A's worker looks them up and
     * waits (a child: the load runs while this process kills C) */
    worker_t wc = {
        .node = C, .offload = true, .token0 = 900, .ready_fd = -1, .go_fd = -1};
    int ready[2] = {-1, -1}, go[2] = {-1, -1};
    pid_t child = -1;
    if (DT_CHECK(kc_run_in(cl.node[C].ns, worker_main, &wc, 60000) == 0,
                 "(3) the worker on C failed") &&
        DT_CHECK(pipe(ready) == 0 && pipe(go) == 0, "(3) pipe")) {
        worker_t wa = {.node = A, .token0 = 900, .ready_fd = ready[1], .go_fd = go[0]};
        fflush(NULL);
        child = fork();
        if (child == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            _exit(worker_main(&wa));
        }
        char ch;
        struct pollfd p = {.fd = ready[0], .events = POLLIN};
        if (!DT_CHECK(child > 0 && poll(&p, 1, WAIT_MS + 10000) == 1 &&
                          read(ready[0], &ch, 1) == 1,
                      "(3) A's worker never found C's offloaded pages"))
            child = child > 0 ? (kill(child, SIGKILL), child) : -1;
    }
    kc_node_stop(&cl, C, SIGKILL, 10000, false);
    if (child > 0 && write(go[1], "G", 1) != 1)
        DT_CHECK(false, "(3) cannot tell A's worker to go");
    uint64_t lease = 0, offsets[PAGES];
    int first = 0, rounds = 0;
    ts_err_t err = {0};
    int rc = acquire_until(wa->c, wa->ns[0], chain2, PAGES, &lease, offsets, &first,
                           &rounds, &waited, &err);
    DT_CHECK(rc == KVD_ERR_NOT_FOUND,
             "(3) A's Acquire of the dead holder's chain should fail not-found within "
             "%d ms: %s (%s) after %d answers, %llu ms",
             ACQUIRE_MS, kvd_status_str(rc), err.text, rounds,
             (unsigned long long)waited);
    if (rc == KVD_ERR_NOT_FOUND)
        printf("(3) C killed: A's Acquire failed not-found after %d answers, %llu ms\n",
               rounds, (unsigned long long)waited);
    if (lease != 0)
        ts_release(wa->c, lease, &err);
    if (child > 0) {
        int st = -1;
        bool ended = kvd_wait_pid(child, 2 * ACQUIRE_MS + 10000, &st) == 0;
        if (!ended) {
            kill(child, SIGKILL);
            kvd_wait_pid(child, 5000, NULL);
        }
        DT_CHECK(ended && WIFEXITED(st) && WEXITSTATUS(st) == 0,
                 "(3) A's worker's load from the dead holder: %s (status %d)",
                 ended ? "failed a check" : "hung", st);
    }
    for (int i = 0; i < 2; i++) {
        if (ready[i] >= 0)
            close(ready[i]);
        if (go[i] >= 0)
            close(go[i]);
    }
    /* A serves on: its own objects (chain1, fetched in (1)) load */
    DT_CHECK(a_serves(), "(3) A stopped serving after C died");
    rc = acquire_until(wa->c, wa->ns[0], chain1, PAGES, &lease, offsets, &first, &rounds,
                       &waited, &err);
    DT_CHECK(rc == KVD_OK && first == KVD_OK,
             "(3) A's own objects should still be acquired at once: %s (%s)",
             kvd_status_str(rc), err.text);
    for (size_t i = 0; rc == KVD_OK && i < PAGES; i++)
        DT_CHECK(ts_in_pool(offsets[i], TS_KV_BYTES, wa->pool_bytes) &&
                     ts_verify(wa->pool + offsets[i], TS_KV_BYTES, chain1[i], SALT) ==
                         SIZE_MAX,
                 "(3) A's copy of page %zu differs", i);
    if (lease != 0)
        ts_release(wa->c, lease, &err);
    /* C out of the membership: out of A's lookups */
    uint64_t t0 = kc_now_ms();
    if (!DT_CHECK(kc_wait_members(&cl, 1u << A | 1u << B, WAIT_MS, NULL, NULL),
                  "(3) C should leave the membership"))
        return;
    printf("(3) C out of the membership %llu ms after its Acquire failed\n",
           (unsigned long long)(kc_now_ms() - t0));
    DT_CHECK(lookup_until(wa->c, wa->ns[0], chain2, PAGES, false, b, tiers, &nb, &waited),
             "(3) after C left, A's Lookup still returns %zu boundaries of its chain",
             nb);
    printf("(3) C's chain gone from A's lookups %llu ms after C left\n",
           (unsigned long long)waited);
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    int rc = kc_setup(&cl, 3, true);
    if (rc == KVD_TEST_SKIP)
        return KVD_TEST_SKIP;
    if (rc == 0 && ts_make_keys(9000, PAGES, PAGE_SIZE, chain1) == 0 &&
        ts_make_keys(19000, PAGES, PAGE_SIZE, chain2) == 0 &&
        ts_make_keys(29000, PAGES, PAGE_SIZE, ghost) == 0 &&
        ts_make_keys(39000, PAGES, PAGE_SIZE, chain3) == 0 &&
        ts_make_keys(49000, PAGES, PAGE_SIZE, chain4) == 0 &&
        ts_make_keys(59000, PAGES, PAGE_SIZE, chain5) == 0 &&
        ts_make_keys(69000, PAGES, PAGE_SIZE, phantom) == 0 &&
        /* A keeps its directory cache far longer than the test runs: (5) */
        kc_node_start(&cl, A, true,
                      (const char *const[]){"--cluster-cache-ms", "60000", NULL}) == 0 &&
        kc_node_start(&cl, B, true, NULL) == 0 &&
        kc_node_start(&cl, C, true, NULL) == 0 &&
        DT_CHECK(kc_wait_members(&cl, 0x7u, KC_READY_MS, NULL, NULL),
                 "three members, one epoch")) {
        /* a worker on A: its namespace is known there, its pool mapped */
        kvd_ns_spec_t spec = ts_spec(TS_KV_NS, TS_KV_BYTES);
        ts_client_t wa;
        if (ts_open(&wa, cl.node[A].socket, &spec, 1, true) == 0) {
            rpc_level(&wa);
            linker_level();
            bad_peers(&wa);
            cache_level(&wa);
            held_level(&wa);
            holder_dies(&wa);
            ts_close(&wa);
        }
    }
    kc_teardown(&cl);
    return dt_exit_status("cluster/remote_load");
}
