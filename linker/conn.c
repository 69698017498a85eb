/*
 * conn.c - the linker's connection to its daemon: Hello with every
 * registered pool's namespace, the RPCs, reconnection after the daemon
 * went away, and the epochs that tie leases and offsets to one connection.
 *
 * Each connection brings a peer (lpeer_t): the daemon's pool mapped here
 * (shm) or its UCX worker and pool (ucx). The data paths connect their
 * transports to the current peer at their next step; a peer is counted,
 * so a reconnection swaps it without waiting for them, and the old
 * mapping goes when the last of them has moved on.
 *
 * A connection is a counted session (its client and epoch): calls from
 * any number of threads run on it at once (the client hands each call its
 * own replies), each holding a reference, so none waits for another's
 * round trip. A failed call drops the session (shutting its socket down
 * wakes the other calls on it, which fail) and the next call without an
 * epoch reconnects.
 *
 * Threading: any thread calls in. `connect` serialises (re)connecting and
 * Hello; `state` guards the current session, the epoch and the peer, what
 * every call reads first. Lock order: linker_int.h.
 */
#include "linker_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---------------------------------------------------------------- peers */

lpeer_t *lk_peer_get(kvd_linker_t *l)
{
    lk_lock(&l->conn.state);
    lpeer_t *p = l->conn.peer;
    if (p != NULL)
        atomic_fetch_add(&p->refs, 1);
    lk_unlock(&l->conn.state);
    return p;
}

void lk_peer_put(lpeer_t *p)
{
    if (p == NULL || atomic_fetch_sub(&p->refs, 1) != 1)
        return;
    /* nobody copies through it any longer: unregistered before unmapped */
    for (int rt = KVD_GPU_CUDA; rt <= KVD_GPU_HIP; rt++)
        if (p->pin_any[rt])
            kvd_gpu_unpin((kvd_gpu_runtime_t)rt, p->map);
    if (p->map != NULL) {
        kvd_pool_guard_remove(p->map);
        munmap(p->map, p->desc.length);
    }
    free(p->ucx_bytes);
    free(p);
}

/* The peer of a shm connection: the pool fd mapped here (read-only where
 * the daemon gave a read-only descriptor). */
static int peer_of_fd(int fd, uint64_t bytes, bool read_only, lpeer_t **out)
{
    /* a mapping longer than the descriptor's memory faults (SIGBUS) at the
     * first copy past its end: the daemon's word is checked against it */
    struct stat st;
    if (fstat(fd, &st) != 0)
        return kvd_status_from_errno(errno);
    if (bytes == 0 || (uint64_t)st.st_size < bytes) {
        KVD_WARN("linker", "the daemon's pool is %llu bytes, its descriptor %lld",
                 (unsigned long long)bytes, (long long)st.st_size);
        return KVD_ERR_PROTOCOL;
    }
    lpeer_t *p = calloc(1, sizeof(*p));
    if (p == NULL)
        return KVD_ERR_NOMEM;
    void *map =
        mmap(NULL, bytes, PROT_READ | (read_only ? 0 : PROT_WRITE), MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) {
        int rc = kvd_status_from_errno(errno);
        KVD_WARN("linker", "cannot map the daemon's pool (%llu bytes): %s",
                 (unsigned long long)bytes, strerror(errno));
        free(p);
        return rc;
    }
    /* another same-host writer may cut the pool file short while this
     * process copies out of it: the guard keeps the SIGBUS from killing
     * the engine (common/guard.c) */
    int grc = kvd_pool_guard_add(map, bytes, fd, false);
    if (grc != KVD_OK)
        KVD_WARN("linker",
                 "cannot guard the pool's mapping (%s): a writer that cuts "
                 "the pool file short can kill this process",
                 kvd_status_str(grc));
    p->map = map;
    p->read_only = read_only;
    p->desc = (kvd_peer_t){.length = bytes, .mapping = map};
    atomic_init(&p->refs, 1);
    *out = p;
    return KVD_OK;
}

/* The peer of a ucx connection: the daemon's worker and pool, and this
 * connection's capability; reaching it is bounded by timeout_ms. One-sided
 * RMA only where the daemon offers it (an rkey: its UCX server runs on
 * transports that enforce the registration); elsewhere the message mode,
 * whatever was asked for (said once). */
static int peer_of_ucx(const kvd_hello_rep_t *h, kvd_ucx_mode_t mode, int timeout_ms,
                       lpeer_t **out)
{
    if (h->ucx_address_len == 0 || h->ucx_token_len != KVD_UCX_CAP_BYTES)
        return KVD_ERR_PROTOCOL;
    if (mode == KVD_UCX_MODE_RMA && h->ucx_rkey_len == 0) {
        static atomic_bool said;
        if (!atomic_exchange(&said, true))
            KVD_WARN("linker", "one-sided RMA was asked for, but the daemon offers none "
                               "here (its UCX transports do not enforce the "
                               "registration): using the message mode");
        mode = KVD_UCX_MODE_AM;
    }
    lpeer_t *p = calloc(1, sizeof(*p));
    uint8_t *bytes = malloc(h->ucx_address_len + h->ucx_rkey_len + h->ucx_token_len);
    if (p == NULL || bytes == NULL) {
        free(p);
        free(bytes);
        return KVD_ERR_NOMEM;
    }
    memcpy(bytes, h->ucx_address, h->ucx_address_len);
    if (h->ucx_rkey_len)
        memcpy(bytes + h->ucx_address_len, h->ucx_rkey, h->ucx_rkey_len);
    memcpy(bytes + h->ucx_address_len + h->ucx_rkey_len, h->ucx_token, h->ucx_token_len);
    p->ucx_bytes = bytes;
    p->desc.length = h->pool_bytes;
    p->desc.ucx.address = bytes;
    p->desc.ucx.address_len = h->ucx_address_len;
    p->desc.ucx.rkey = h->ucx_rkey_len ? bytes + h->ucx_address_len : NULL;
    p->desc.ucx.rkey_len = h->ucx_rkey_len;
    p->desc.ucx.base = h->ucx_pool_base;
    p->desc.ucx.mode = mode;
    p->desc.ucx.cap = bytes + h->ucx_address_len + h->ucx_rkey_len;
    p->desc.ucx.cap_len = h->ucx_token_len;
    p->desc.connect_timeout_ms = timeout_ms;
    atomic_init(&p->refs, 1);
    *out = p;
    return KVD_OK;
}

/* ------------------------------------------------------------ sessions */

static lsession_t *session_get(kvd_linker_t *l)
{
    lk_lock(&l->conn.state);
    lsession_t *s = l->conn.session;
    if (s != NULL)
        atomic_fetch_add(&s->refs, 1);
    lk_unlock(&l->conn.state);
    return s;
}

/* Drops n references; the last closes the client. */
static void session_unref(lsession_t *s, int n)
{
    if (s == NULL || atomic_fetch_sub(&s->refs, n) != n)
        return;
    kvd_client_close(s->client);
    free(s);
}

static void session_put(lsession_t *s)
{
    session_unref(s, 1);
}

/* Ends s as the current session, if it still is: its pins and
 * reservations are gone with it. Calls still on it fail (the socket is
 * shut down under them); the peer stays current until the next
 * connection replaces it (copies of this epoch in progress land in memory
 * that is still mapped, and fail at their release). Drops the caller's
 * reference too (and the connection's, when s was current). */
static void session_drop_put(kvd_linker_t *l, lsession_t *s, int why)
{
    lk_lock(&l->conn.state);
    bool current = l->conn.session == s;
    if (current) {
        l->conn.session = NULL;
        /* before the shutdown: a call that fails of it finds the reason */
        atomic_store(&s->dropped, why);
    }
    lk_unlock(&l->conn.state);
    if (current)
        shutdown(kvd_client_fd(s->client), SHUT_RDWR);
    session_unref(s, current ? 2 : 1);
}

/* ------------------------------------------------------- populating */

#define POPULATE_CHUNK (16ull << 20)
#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif

/* Registers p's mapping with every device runtime in want that has not
 * tried it yet (the preparing thread only). */
static void pin_peer(kvd_linker_t *l, lpeer_t *p, uint32_t want, const int *ordinal)
{
    for (int rt = KVD_GPU_CUDA; rt <= KVD_GPU_HIP; rt++) {
        if (!(want & (1u << rt)) || p->pin_tried[rt])
            continue;
        lk_lock(&l->lock);
        if (!l->stop)
            atomic_store(&l->conn.pin_stop, false);
        lk_unlock(&l->lock);
        if (atomic_load(&l->conn.epoch) != p->epoch)
            return; /* replaced already: the next one is pinned instead */
        p->pin_tried[rt] = true;
        char why[256] = "";
        uint64_t pinned = 0, t0 = kvd_now_ns();
        int rc = kvd_gpu_pin((kvd_gpu_runtime_t)rt, ordinal[rt], p->map, p->desc.length,
                             p->read_only, &l->conn.pin_stop, &pinned, why, sizeof(why));
        p->pin_any[rt] = pinned > 0;
        if (rc == KVD_OK && pinned == p->desc.length) {
            atomic_store(&p->pinned[rt], true);
            KVD_INFO(
                "linker", "the store's pool (%llu MiB) is pinned for %s DMA (%.2f s)",
                (unsigned long long)(pinned >> 20), kvd_gpu_name((kvd_gpu_runtime_t)rt),
                (double)(kvd_now_ns() - t0) / 1e9);
        } else if (!atomic_load(&l->conn.pin_stop)) {
            KVD_WARN("linker",
                     "the store's pool is not pinned for %s DMA (%s): device copies go "
                     "through the pinned bounce ring, slower (kvd_stats: bounce_bytes)",
                     kvd_gpu_name((kvd_gpu_runtime_t)rt),
                     why[0] ? why : kvd_status_str(rc));
        }
    }
}

/* Prepares the current mapping for copies: write-populates it a chunk at
 * a time where it is not yet (a MAP_SHARED mapping read-faults its pages;
 * each first write would fault again), then registers it with the device
 * runtimes of the device pools. Starts over when a reconnection replaces
 * it or a new runtime comes, until the current one is done. It holds a
 * reference, not a lock: copies and reconnections go on. */
static void *populate_main(void *arg)
{
    kvd_linker_t *l = arg;
    for (;;) {
        lk_lock(&l->lock);
        uint32_t want = l->conn.pin_rts;
        int ordinal[3] = {l->conn.pin_ordinal[0], l->conn.pin_ordinal[1],
                          l->conn.pin_ordinal[2]};
        lk_unlock(&l->lock);
        lpeer_t *p = lk_peer_get(l);
        uint64_t epoch = p != NULL ? p->epoch : atomic_load(&l->conn.epoch);
        bool stop = false;
        for (uint64_t off = 0;
             p != NULL && p->map != NULL && !p->populated && off < p->desc.length;
             off += POPULATE_CHUNK) {
            if (atomic_load(&l->conn.epoch) != epoch)
                break; /* replaced: start over on the new one */
            madvise((uint8_t *)p->map + off,
                    KVD_MIN(POPULATE_CHUNK, p->desc.length - off),
                    /* as mapped: a read-only descriptor may come without
                     * cfg.read_only (the credential's), and WRITE fails there */
                    p->read_only ? MADV_POPULATE_READ : MADV_POPULATE_WRITE);
            lk_lock(&l->lock);
            stop = l->stop;
            lk_unlock(&l->lock);
            if (stop)
                break;
            if (off + POPULATE_CHUNK >= p->desc.length)
                p->populated = true;
        }
        if (p != NULL && p->map != NULL && !stop && atomic_load(&l->conn.epoch) == epoch)
            pin_peer(l, p, want, ordinal);
        lk_peer_put(p);
        lk_lock(&l->lock);
        bool done =
            l->stop || (atomic_load(&l->conn.epoch) == epoch && l->conn.pin_rts == want);
        if (done)
            l->conn.pop_running = false;
        lk_unlock(&l->lock);
        if (done)
            return NULL;
    }
}

/* Has the preparing thread (re)start on the current mapping; best effort:
 * without it, pages map in on first use and device copies bounce. */
static void populate_in_background(kvd_linker_t *l)
{
    lk_lock(&l->lock);
    if (!l->conn.pop_running && !l->stop) {
        if (l->conn.pop_started)
            pthread_join(l->conn.pop_thread, NULL); /* it has ended */
        l->conn.pop_running =
            pthread_create(&l->conn.pop_thread, NULL, populate_main, l) == 0;
        l->conn.pop_started = l->conn.pop_running;
    }
    lk_unlock(&l->lock);
}

void lk_conn_pin(kvd_linker_t *l, kvd_gpu_runtime_t rt, int ordinal)
{
    lk_lock(&l->lock);
    bool added = !(l->conn.pin_rts & (1u << rt));
    if (added) {
        l->conn.pin_ordinal[rt] = ordinal;
        l->conn.pin_rts |= 1u << rt;
    }
    lk_unlock(&l->lock);
    if (added)
        populate_in_background(l);
}

bool lk_conn_pinned(kvd_linker_t *l, kvd_gpu_runtime_t rt)
{
    lpeer_t *p = lk_peer_get(l);
    bool pinned = p != NULL && atomic_load(&p->pinned[rt]);
    lk_peer_put(p);
    return pinned;
}

/* ------------------------------------------------------------ deadlines */

uint64_t lk_deadline(const kvd_linker_t *l)
{
    return kvd_now_ns() + (uint64_t)l->timeout_ms * 1000000ull;
}

/* What is left until deadline, in whole ms rounded up; 0 once passed. */
static int ms_until(uint64_t deadline)
{
    uint64_t now = kvd_now_ns();
    return now >= deadline ? 0
                           : (int)KVD_MIN((deadline - now + 999999) / 1000000, INT32_MAX);
}

/* The daemon did not answer within the timeout (a call, or a Hello on a
 * connection its kernel accepted): for the next timeout_ms it counts as
 * hung, and a call that would have to connect fails at once instead of
 * waiting out one more timeout (linker_int.h, lconn_t.hung_until_ns). */
static void note_hung(kvd_linker_t *l)
{
    atomic_store(&l->conn.hung_until_ns, lk_deadline(l));
}

static bool hung(kvd_linker_t *l)
{
    return kvd_now_ns() < atomic_load(&l->conn.hung_until_ns);
}

/* ---------------------------------------------------------- connecting */

static bool copies_over(kvd_linker_t *l, uint64_t until);

/* The Hello of this linker: every registered pool's namespace. */
static uint32_t hello_request(kvd_linker_t *l, kvd_msg_t *req, kvd_ns_spec_t *specs,
                              bool copies_done)
{
    lk_lock(&l->lock);
    uint32_t n = l->n_pools;
    for (uint32_t i = 0; i < n; i++) {
        specs[i] = (kvd_ns_spec_t){.object_bytes = l->pools[i].object_bytes,
                                   .rank_replicated = l->pools[i].desc.rank_replicated};
        kvd_strlcpy(specs[i].name, l->pools[i].ns_name, sizeof(specs[i].name));
    }
    lk_unlock(&l->lock);
    kvd_msg_request(req, 0, KVD_METHOD_HELLO);
    kvd_hello_req_t *h = &req->body.hello_req;
    kvd_strlcpy(h->client_name, l->client_name, KVD_NAME_MAX);
    h->pid = (uint32_t)getpid();
    h->protocol_version = KVD_PROTOCOL_VERSION;
    h->want_pool_fd = !l->use_ucx && l->connect[0] == '\0';
    h->want_ucx = l->use_ucx;
    h->read_only = l->cfg.read_only;
    h->writer_token = l->conn.writer_token;
    h->earlier_copies_over = copies_done;
    memcpy(h->auth_token, l->auth_token, l->auth_token_len);
    h->auth_token_len = l->auth_token_len;
    h->n_namespaces = n;
    h->namespaces = specs;
    return n;
}

/* Says Hello and makes the connection and its peer current, by deadline.
 * Caller holds connect. */
static int connect_once(kvd_linker_t *l, uint64_t deadline)
{
    kvd_client_t *c = NULL;
    int ms = ms_until(deadline);
    if (ms == 0)
        return KVD_ERR_TIMEOUT;
    int rc = l->connect[0] ? kvd_client_connect_tcp(l->connect, ms, &c)
                           : kvd_client_connect_unix(l->socket_path, ms, &c);
    if (rc != KVD_OK)
        return rc;
    kvd_ns_spec_t specs[KVD_MAX_POOLS];
    kvd_msg_t req, rep;
    /* an offload copy of the lost connection gets half of what is left to
     * end; one still running then keeps its reservations held (until this
     * process exits, or a later Hello says they are over) */
    uint64_t now = kvd_now_ns();
    bool done = copies_over(l, now + (deadline > now ? (deadline - now) / 2 : 0));
    uint32_t n = hello_request(l, &req, specs, done);
    rc = kvd_client_call_many_until(c, &req, &rep, 1, deadline);
    explicit_bzero(req.body.hello_req.auth_token, sizeof(req.body.hello_req.auth_token));
    if (rc == KVD_OK && rep.status != KVD_OK) {
        rc = rep.status;
        /* the daemon's reason (such as UCX over TCP not served without
         * its --ucx-tcp): what the caller's -10 alone cannot say */
        if (rc != KVD_ERR_BUSY)
            KVD_WARN("linker", "the daemon refused Hello: %s (%s)", kvd_status_str(rc),
                     rep.error);
        lk_set_last_error("the daemon refused Hello: %s", rep.error);
    }
    if (rc == KVD_OK && rep.body.hello_rep.n_ns_ids != n)
        rc = KVD_ERR_PROTOCOL;
    int fd = kvd_client_take_fd(c);
    lpeer_t *peer = NULL;
    if (rc == KVD_OK && fd >= 0)
        rc = peer_of_fd(fd, rep.body.hello_rep.pool_bytes, rep.body.hello_rep.read_only,
                        &peer);
    else if (rc == KVD_OK && l->use_ucx)
        rc = peer_of_ucx(&rep.body.hello_rep, l->ucx_mode, l->timeout_ms, &peer);
    if (fd >= 0)
        close(fd);
    bool reconnect = atomic_load(&l->conn.epoch) != 0;
    /* the first mapping is populated before kvd_linker_open returns, so
     * that no copy takes a fault per page (measured: writes into an
     * unpopulated shared mapping ran at 0.3 GB/s); a new one after a
     * reconnection in the background, as calls wait on us here */
    if (rc == KVD_OK && peer != NULL && peer->map != NULL && !l->cfg.lazy_pool_mapping &&
        !reconnect) {
        madvise(peer->map, peer->desc.length,
                rep.body.hello_rep.read_only ? MADV_POPULATE_READ : MADV_POPULATE_WRITE);
        peer->populated = true;
    }
    if (peer != NULL && l->cfg.lazy_pool_mapping)
        peer->populated = true; /* left to first use, as asked */
    lsession_t *sess = rc == KVD_OK ? calloc(1, sizeof(*sess)) : NULL;
    if (rc == KVD_OK && sess == NULL)
        rc = KVD_ERR_NOMEM;
    if (rc != KVD_OK) {
        lk_peer_put(peer);
        kvd_client_close(c);
        kvd_msg_clear(&rep);
        return rc;
    }
    lk_lock(&l->conn.state);
    lpeer_t *old = l->conn.peer;
    lsession_t *old_sess = l->conn.session; /* none: a failed call dropped it */
    uint64_t epoch = atomic_fetch_add(&l->conn.epoch, 1) + 1; /* old leases end here */
    if (peer != NULL)
        peer->epoch = epoch;
    l->conn.peer = peer;
    /* a registration of the old mapping under way stops at its next chunk */
    atomic_store(&l->conn.pin_stop, true);
    *sess = (lsession_t){.client = c, .epoch = epoch};
    atomic_init(&sess->refs, 1);
    atomic_init(&sess->dropped, KVD_OK);
    l->conn.session = sess;
    l->conn.lease_ttl_ms = rep.body.hello_rep.lease_ttl_ms;
    l->conn.max_batch = rep.body.hello_rep.max_batch;
    l->conn.max_frame_bytes = rep.body.hello_rep.max_frame_bytes;
    lk_lock(&l->lock);
    for (uint32_t i = 0; i < n; i++)
        l->pools[i].ns_id = rep.body.hello_rep.ns_ids[i];
    l->ns_epoch = epoch;
    lk_unlock(&l->lock);
    lk_unlock(&l->conn.state);
    lk_peer_put(old);
    session_put(old_sess);
    kvd_msg_clear(&rep);
    lk_lock(&l->lock);
    bool pin = l->conn.pin_rts != 0;
    lk_unlock(&l->lock);
    if (peer != NULL && peer->map != NULL && (!peer->populated || pin))
        populate_in_background(l);
    return KVD_OK;
}

/* connect_once, again while the daemon says busy (its UCX server is
 * restarting: a second at most), until the deadline. Caller holds
 * connect. */
static int connect_locked(kvd_linker_t *l, uint64_t deadline)
{
    for (;;) {
        int rc = connect_once(l, deadline);
        if (rc == KVD_ERR_TIMEOUT)
            note_hung(l);
        uint64_t now = kvd_now_ns();
        if (rc != KVD_ERR_BUSY || now >= deadline)
            return rc;
        kvd_sleep_ns(KVD_MIN(100 * 1000000ull, deadline - now));
    }
}

void lk_conn_init(kvd_linker_t *l)
{
    uint64_t t = 0;
    if (getrandom(&t, sizeof(t), GRND_NONBLOCK) != sizeof(t))
        t = kvd_now_ns() ^ (uint64_t)(uintptr_t)l; /* only tells linkers apart */
    l->conn.writer_token = t;
    atomic_init(&l->conn.copy_epoch, 0);
    lk_mutex_init(&l->conn.connect, LK_RANK_CONNECT);
    lk_mutex_init(&l->conn.state, LK_RANK_STATE);
}

int lk_conn_open(kvd_linker_t *l)
{
    lk_lock(&l->conn.connect);
    int rc = connect_locked(l, lk_deadline(l));
    lk_unlock(&l->conn.connect);
    return rc;
}

void lk_conn_close(kvd_linker_t *l)
{
    /* the preparing thread stops within a chunk once l->stop is set (a
     * registration of up to KVD_GPU_PIN_CHUNK first) */
    atomic_store(&l->conn.pin_stop, true);
    if (l->conn.pop_started)
        pthread_join(l->conn.pop_thread, NULL);
    lsession_t *s = session_get(l);
    if (s != NULL)
        session_drop_put(l, s, KVD_ERR_CLOSED);
    lk_lock(&l->conn.state);
    lpeer_t *p = l->conn.peer;
    l->conn.peer = NULL;
    lk_unlock(&l->conn.state);
    lk_peer_put(p);
    lk_mutex_destroy(&l->conn.connect);
    lk_mutex_destroy(&l->conn.state);
}

/* Whether the connection of on_epoch is gone (a call bound to a dead
 * connection fails at once, never waiting for a reconnect). */
static bool epoch_gone(kvd_linker_t *l, uint64_t on_epoch)
{
    lk_lock(&l->conn.state);
    bool gone = l->conn.session == NULL || atomic_load(&l->conn.epoch) != on_epoch ||
                atomic_load(&l->conn.failed_epoch) == on_epoch;
    lk_unlock(&l->conn.state);
    return gone;
}

/*
 * The copy announces itself before it looks whether its connection lives,
 * and a connection is dropped (session NULL, under state) before the next
 * Hello looks for copies: either the copy sees its connection gone, or
 * that Hello sees the copy (state orders the two).
 */
bool lk_copy_begin(kvd_linker_t *l, uint64_t epoch)
{
    atomic_store(&l->conn.copy_epoch, epoch);
    if (!epoch_gone(l, epoch))
        return true;
    atomic_store(&l->conn.copy_epoch, 0);
    return false;
}

bool lk_copy_live(kvd_linker_t *l, uint64_t epoch)
{
    return !epoch_gone(l, epoch);
}

void lk_copy_end(kvd_linker_t *l)
{
    atomic_store(&l->conn.copy_epoch, 0);
}

/* Whether no copy into an earlier connection's reservations is in flight,
 * waiting for one until `until` (it stops at its next object once its
 * connection is gone). Called without a session: any copy is of an
 * earlier connection. */
static bool copies_over(kvd_linker_t *l, uint64_t until)
{
    while (atomic_load(&l->conn.copy_epoch) != 0) {
        if (kvd_now_ns() >= until)
            return false;
        kvd_sleep_ns(1000000);
    }
    return true;
}

/* A new session for a call that has none, by the call's deadline. One
 * thread connects at a time (holding connect across the Hello); a call
 * that finds another connecting waits for it until its own deadline and
 * then takes its outcome: the new session, or, when that attempt found
 * the daemon hung, KVD_ERR_TIMEOUT without a second attempt. While the
 * daemon counts as hung a call fails at once: its kernel still accepts
 * connections, so each attempt would wait out a whole timeout. */
static lsession_t *connect_for_call(kvd_linker_t *l, uint64_t deadline, int *rc)
{
    *rc = KVD_ERR_TIMEOUT;
    if (hung(l) || kvd_now_ns() >= deadline || !lk_lock_until(&l->conn.connect, deadline))
        return NULL;
    lsession_t *s = session_get(l); /* another thread may have reconnected meanwhile */
    if (s == NULL && !hung(l))
        *rc = connect_locked(l, deadline);
    if (s == NULL && *rc == KVD_OK)
        s = session_get(l);
    lk_unlock(&l->conn.connect);
    if (s != NULL)
        *rc = KVD_OK;
    return s;
}

/* The session a call runs on, with a reference: the current one, or (for
 * on_epoch 0) a new one when there is none or a data path failed on it. */
static lsession_t *session_for_call(kvd_linker_t *l, uint64_t on_epoch, uint64_t deadline,
                                    int *rc)
{
    lsession_t *s = session_get(l);
    if (s != NULL && atomic_load(&l->conn.failed_epoch) == s->epoch) {
        /* its pins and offsets are void: start over */
        session_drop_put(l, s, KVD_ERR_CLOSED);
        s = NULL;
    }
    *rc = KVD_OK;
    if (s == NULL && on_epoch == 0)
        s = connect_for_call(l, deadline, rc);
    if (s == NULL || (on_epoch != 0 && s->epoch != on_epoch)) {
        if (*rc == KVD_OK)
            *rc = KVD_ERR_CLOSED;
        session_put(s);
        return NULL;
    }
    return s;
}

int lk_call_many(kvd_linker_t *l, kvd_msg_t *reqs, kvd_msg_t *reps, size_t n,
                 uint64_t on_epoch, uint64_t *epoch, uint64_t deadline)
{
    memset(reps, 0, n * sizeof(*reps));
    if (on_epoch != 0 && epoch_gone(l, on_epoch))
        return KVD_ERR_CLOSED;
    /* a deadline the caller spent on local work says nothing of the
     * daemon: no round trip, and the daemon is not taken for hung */
    if (kvd_now_ns() >= deadline)
        return KVD_ERR_TIMEOUT;
    int rc;
    lsession_t *s = session_for_call(l, on_epoch, deadline, &rc);
    if (s == NULL)
        return rc;
    if (epoch)
        *epoch = s->epoch;
    rc = kvd_client_call_many_until(s->client, reqs, reps, n, deadline);
    for (size_t i = 0; rc == KVD_OK && i < n; i++)
        if (reps[i].status != KVD_OK && reps[i].error[0])
            lk_set_last_error("%s", reps[i].error); /* names its method itself */
    if (rc != KVD_OK) {
        if (rc == KVD_ERR_TIMEOUT)
            note_hung(l);
        /* a call that timed out shut the socket down under this one: the
         * daemon did not answer it either */
        if (rc == KVD_ERR_CLOSED && atomic_load(&s->dropped) == KVD_ERR_TIMEOUT)
            rc = KVD_ERR_TIMEOUT;
        session_drop_put(l, s, rc); /* closed, timed out or garbled: start over */
    } else {
        session_put(s);
    }
    return rc;
}

int lk_call_ns(kvd_linker_t *l, lk_ns_fill_fn fill, void *ctx, kvd_msg_t *reqs,
               kvd_msg_t *reps, size_t n, uint64_t *epoch, uint64_t deadline)
{
    for (int attempt = 0;; attempt++) {
        int rc;
        if (lk_conn_ensure(l, deadline, &rc) == 0) {
            memset(reps, 0, n * sizeof(*reps));
            return rc;
        }
        lk_lock(&l->lock);
        fill(l, ctx, reqs, n);
        uint64_t ns_epoch = l->ns_epoch;
        lk_unlock(&l->lock);
        rc = lk_call_many(l, reqs, reps, n, ns_epoch, epoch, deadline);
        if (rc != KVD_ERR_CLOSED || attempt == 1)
            return rc;
    }
}

int lk_call_ex(kvd_linker_t *l, kvd_msg_t *req, kvd_msg_t *rep, uint64_t on_epoch,
               uint64_t *epoch, uint64_t deadline)
{
    int rc = lk_call_many(l, req, rep, 1, on_epoch, epoch, deadline);
    return rc == KVD_OK ? rep->status : rc;
}

int lk_call(kvd_linker_t *l, kvd_msg_t *req, kvd_msg_t *rep)
{
    return lk_call_ex(l, req, rep, 0, NULL, lk_deadline(l));
}

uint64_t lk_conn_ensure(kvd_linker_t *l, uint64_t deadline, int *rc)
{
    lsession_t *s = session_for_call(l, 0, deadline, rc);
    uint64_t epoch = s != NULL ? s->epoch : 0;
    session_put(s);
    return epoch;
}

/* Room kept in a frame for the envelope and a request's fixed fields. */
#define FRAME_SLACK_BYTES 1024

size_t lk_batch_limit(kvd_linker_t *l, size_t item_bytes)
{
    lk_lock(&l->conn.state);
    uint64_t batch = l->conn.max_batch, frame = l->conn.max_frame_bytes;
    lk_unlock(&l->conn.state);
    /* a daemon that does not say: its defaults */
    if (batch == 0)
        batch = 4096;
    if (frame == 0)
        frame = KVD_FRAME_DEFAULT_MAX;
    uint64_t fit =
        frame > FRAME_SLACK_BYTES ? (frame - FRAME_SLACK_BYTES) / item_bytes : 1;
    return (size_t)KVD_MAX(1ull, KVD_MIN(KVD_MIN(batch, fit), (uint64_t)SIZE_MAX));
}

bool lk_leases_standing(kvd_linker_t *l, const lxfer_t *x, size_t n)
{
    lk_lock(&l->conn.state);
    uint64_t epoch = atomic_load(&l->conn.epoch), now = kvd_now_ns();
    /* half the TTL: the daemon started it after we asked, on a clock that
     * runs at the rate of ours; the margin covers any difference. The TTL
     * is set with the session, under state: read under state it is the
     * current session's. */
    uint64_t ttl_ns = l->conn.lease_ttl_ms * 1000000ull / 2;
    /* over a Unix socket only: the daemon's close is then seen here at
     * once, while a TCP FIN may still be on its way when the daemon has
     * already dropped the pins (and a remote clock is not ours) */
    lsession_t *s = l->conn.session;
    bool ok = l->connect[0] == '\0' && s != NULL && s->epoch == epoch &&
              atomic_load(&l->conn.failed_epoch) != epoch;
    for (size_t i = 0; ok && i < n; i++)
        ok = !lk_xfer_pinned(&x[i]) ||
             (x[i].epoch == epoch && now - x[i].asked_ns < ttl_ns);
    /* checked last: the leases stood until now only if the daemon has not
     * ended the connection by now. The socket is polled, not read (an
     * engine thread may be inside a call on it): the daemon ends leases by
     * closing it, which shows as a hang-up whatever is unread. The socket
     * cannot close meanwhile: the session is current, and ending that
     * takes state. */
    ok = ok && !kvd_client_ended(s->client);
    lk_unlock(&l->conn.state);
    return ok;
}

uint64_t lk_conn_pool_bytes(kvd_linker_t *l, uint64_t epoch)
{
    lk_lock(&l->conn.state);
    lpeer_t *p = l->conn.peer;
    uint64_t bytes = p != NULL && p->epoch == epoch ? p->desc.length : 0;
    lk_unlock(&l->conn.state);
    return bytes;
}

void lk_conn_fail(kvd_linker_t *l, uint64_t epoch)
{
    /* only ever raised: a path failing late on an older peer must not
     * make the current epoch look sound again */
    uint64_t seen = atomic_load(&l->conn.failed_epoch);
    while (seen < epoch &&
           !atomic_compare_exchange_weak(&l->conn.failed_epoch, &seen, epoch)) {
    }
    /* the connection goes now, not at the next call: its pins and
     * reservations end at the daemon at once (nobody else publishes a
     * key we hold in flight) */
    lsession_t *s = session_get(l);
    if (s != NULL && s->epoch == epoch)
        session_drop_put(l, s, KVD_ERR_CLOSED);
    else
        session_put(s);
}

int lk_conn_add_pool(kvd_linker_t *l, uint64_t epoch, const lpool_t *p, uint32_t *pool_id,
                     uint64_t deadline)
{
    int rc = KVD_ERR_CLOSED;
    /* no Hello in between: every later one lists it (one in progress ends
     * by its deadline, which may be later than ours) */
    if (!lk_lock_until(&l->conn.connect, deadline))
        return KVD_ERR_TIMEOUT;
    lk_lock(&l->lock);
    if (epoch == atomic_load(&l->conn.epoch)) {
        if (l->n_pools == KVD_MAX_POOLS) {
            rc = KVD_ERR_NO_SPACE;
        } else {
            lpool_t *e = &l->pools[l->n_pools];
            *e = *p;
            e->desc.name = e->name;
            *pool_id = l->n_pools++;
            rc = KVD_OK;
        }
    }
    lk_unlock(&l->lock);
    lk_unlock(&l->conn.connect);
    return rc;
}
