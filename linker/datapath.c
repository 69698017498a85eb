/*
 * datapath.c - one transfer thread's data path: its own transport
 * (kvd_transport: shm or ucx, the only place bytes move), the pools'
 * buffers registered on it as regions, and the gathering of one step's
 * copies into batches.
 *
 * A step (lk_dp_begin .. lk_dp_end) connects the transport to the
 * connection's current peer if that changed, gathers
 * (local region + offset, pool offset, length) copies, merging adjacent
 * ones, posts a batch each dp->batch_bytes with at most LK_DP_WINDOW in
 * flight, and waits for them all at the flush. A batch that fails (other
 * than a refused one) disconnects the transport, which cancels what is
 * still outstanding before anything is reported, and voids the
 * connection's epoch so that the next call reconnects.
 *
 * Threading: each data path belongs to its thread. dp->mutex serialises
 * the calls on its transport between that thread and pool registration
 * (engine threads adding regions); it is held for one call at a time,
 * never while a wait polls or yields.
 */
#include "linker_int.h"

#include <stdio.h>
#include <stdlib.h>

int lk_dp_open(kvd_linker_t *l, ldp_t *dp, int index)
{
    *dp = (ldp_t){.index = index,
                  .dir = index == LK_DP_LOAD ? KVD_XFER_READ : KVD_XFER_WRITE};
    lk_mutex_init(&dp->mutex, LK_RANK_DP);
    char name[96];
    snprintf(name, sizeof(name), "%s-%s", l->client_name,
             index == LK_DP_LOAD ? "load" : "offload");
    /* a message-mode transport has no RMA feature and an RMA one only
     * RDMA transports: a peer that reaches its worker cannot read or write
     * this process through UCP's software RMA (kvd_transport_open_ucx_mode) */
    if (!l->use_ucx)
        return kvd_transport_open_shm(&dp->t);
    /* UCX moves host memory only here: device pools' rows are staged
     * through pinned host slots (transport/staged.c) */
    kvd_transport_t *ucx = NULL;
    int rc = kvd_transport_open_ucx_mode(name, l->ucx_mode, &ucx);
    if (rc == KVD_ERR_UNSUPPORTED && l->ucx_mode == KVD_UCX_MODE_RMA) {
        /* RMA only on transports where the NIC holds a peer to what this
         * process registered for it: elsewhere UCP's software RMA would let
         * any host that reaches this worker read and write the engine's
         * memory. Both data paths are opened here, before any thread. */
        KVD_WARN("linker", "one-sided RMA needs an RDMA transport that enforces the "
                           "registration (rc, dc), and UCX has none here: using the "
                           "message mode");
        l->ucx_mode = KVD_UCX_MODE_AM;
        rc = kvd_transport_open_ucx_mode(name, l->ucx_mode, &ucx);
    }
    if (rc == KVD_OK)
        rc = kvd_transport_open_staged(ucx, l->timeout_ms, &dp->t);
    if (rc != KVD_OK && dp->t == NULL)
        kvd_transport_destroy(ucx);
    return rc;
}

void lk_dp_close(ldp_t *dp)
{
    kvd_transport_destroy(dp->t); /* disconnects: then the mapping may go */
    dp->t = NULL;
    /* after the transport: it waited for what ran through them */
    size_t n_kinds = atomic_load(&dp->n_kinds);
    for (size_t i = 0; i < n_kinds; i++)
        kvd_memkind_gpu_close(dp->kinds[i].kind);
    atomic_store(&dp->n_kinds, 0);
    lk_peer_put(dp->peer);
    dp->peer = NULL;
    free(dp->v);
    dp->v = NULL;
    lk_mutex_destroy(&dp->mutex);
}

int lk_dp_register(ldp_t *dp, lpool_t *p)
{
    kvd_region_t **r = calloc(p->n_buffers, sizeof(*r));
    if (r == NULL)
        return KVD_ERR_NOMEM;
    int rc = KVD_OK;
    lk_lock(&dp->mutex);
    for (uint32_t i = 0; rc == KVD_OK && i < p->desc.n_layers; i++)
        for (uint32_t b = 0; rc == KVD_OK && b < p->layers[i].n_buffers; b++) {
            const kvd_pool_buffer_t *buf = &p->layers[i].buffers[b];
            rc = kvd_transport_register(dp->t, buf->base, lk_buffer_extent(&p->desc, buf),
                                        p->kinds[dp->index], &r[p->buffer0[i] + b]);
        }
    if (rc != KVD_OK)
        for (uint32_t k = 0; k < p->n_buffers; k++)
            kvd_transport_deregister(dp->t, r[k]);
    lk_unlock(&dp->mutex);
    if (rc != KVD_OK) {
        free(r);
        return rc;
    }
    p->regions[dp->index] = r;
    return KVD_OK;
}

int lk_dp_device_kind(ldp_t *dp, kvd_gpu_runtime_t rt, int ordinal,
                      const kvd_memkind_t **out, char *why, size_t cap)
{
    lk_lock(&dp->mutex);
    size_t n = atomic_load(&dp->n_kinds);
    int rc = KVD_OK;
    *out = NULL;
    for (size_t i = 0; i < n && *out == NULL; i++)
        if (dp->kinds[i].rt == rt && dp->kinds[i].ordinal == ordinal)
            *out = dp->kinds[i].kind;
    if (*out == NULL && n == LK_DP_KINDS) {
        snprintf(why, cap, "a linker copies to at most %d devices", LK_DP_KINDS);
        rc = KVD_ERR_NO_SPACE;
    } else if (*out == NULL) {
        kvd_memkind_t *k = NULL;
        rc = kvd_memkind_gpu_open(rt, ordinal, &k, why, cap);
        if (rc == KVD_OK) {
            dp->kinds[n] = (ldp_kind_t){.rt = rt, .ordinal = ordinal, .kind = k};
            atomic_store(&dp->n_kinds, n + 1); /* readers see it whole */
            *out = k;
        }
    }
    lk_unlock(&dp->mutex);
    return rc;
}

int lk_dp_mark(ldp_t *dp, lgroup_marks_t *m)
{
    *m = (lgroup_marks_t){0};
    size_t n = atomic_load(&dp->n_kinds);
    for (size_t i = 0; i < n; i++) {
        void *mark = NULL;
        int rc = kvd_memkind_mark(dp->kinds[i].kind, &mark);
        if (rc != KVD_OK) {
            lk_dp_marks_free(m);
            return rc;
        }
        m->kinds[m->n] = dp->kinds[i].kind;
        m->marks[m->n++] = mark;
    }
    return KVD_OK;
}

void lk_dp_marks_free(lgroup_marks_t *m)
{
    for (size_t i = 0; i < m->n; i++)
        kvd_memkind_mark_free(m->kinds[i], m->marks[i]);
    m->n = 0;
}

void lk_dp_unregister(ldp_t *dp, lpool_t *p)
{
    kvd_region_t **r = p->regions[dp->index];
    if (r != NULL && dp->t != NULL) {
        lk_lock(&dp->mutex);
        for (uint32_t k = 0; k < p->n_buffers; k++)
            kvd_transport_deregister(dp->t, r[k]);
        lk_unlock(&dp->mutex);
    }
    free(r);
    p->regions[dp->index] = NULL;
}

/* Drops every report the transport still holds (caller holds dp->mutex,
 * nothing in flight). */
static void drain_reports(ldp_t *dp)
{
    kvd_xfer_done_t done[16];
    size_t n = 0;
    do
        kvd_transport_poll(dp->t, done, KVD_ARRAY_SIZE(done), &n);
    while (n > 0);
}

/* Ends the data path's use of its peer after a failure: the transport
 * disconnects (what is outstanding is cancelled before the rows it wrote
 * are reported) and the connection of that epoch is void. */
static void dp_fail(kvd_linker_t *l, ldp_t *dp, int rc)
{
    if (dp->error == KVD_OK)
        dp->error = rc;
    if (rc == KVD_ERR_INVALID || dp->peer == NULL)
        return; /* refused whole: nothing moved, the peer is fine */
    KVD_WARN("linker", "%s over %s failed: %s; reconnecting",
             dp->dir == KVD_XFER_READ ? "load" : "offload", kvd_transport_name(dp->t),
             kvd_status_str(rc));
    lk_lock(&dp->mutex);
    kvd_transport_disconnect(dp->t);
    drain_reports(dp); /* the cancelled batches' reports: nobody waits */
    lk_unlock(&dp->mutex);
    dp->n_flight = 0;
    dp->n_kept = 0;
    lk_conn_fail(l, dp->peer->epoch);
    lk_peer_put(dp->peer);
    dp->peer = NULL;
}

uint64_t lk_dp_begin(kvd_linker_t *l, ldp_t *dp)
{
    dp->error = KVD_OK;
    dp->n = 0;
    dp->gathered_bytes = 0;
    lpeer_t *cur = lk_peer_get(l);
    if (cur != NULL && atomic_load(&l->conn.failed_epoch) >= cur->epoch) {
        lk_peer_put(cur); /* void already: not worth a connect */
        cur = NULL;
    }
    if (cur != NULL && cur == dp->peer) {
        lk_peer_put(cur); /* connected already: one reference is enough */
    } else {
        /* connect replaces the old peer (disconnecting first) */
        lk_lock(&dp->mutex);
        int rc = KVD_ERR_CLOSED;
        if (cur != NULL)
            rc = kvd_transport_connect(dp->t, &cur->desc);
        else
            kvd_transport_disconnect(dp->t);
        drain_reports(dp);
        lk_unlock(&dp->mutex);
        lk_peer_put(dp->peer); /* after the disconnect: the mapping may go */
        dp->peer = NULL;
        if (rc != KVD_OK && cur != NULL) {
            KVD_WARN("linker", "%s data path cannot reach the daemon over %s: %s",
                     dp->dir == KVD_XFER_READ ? "load" : "offload",
                     kvd_transport_name(dp->t), kvd_status_str(rc));
            lk_conn_fail(l, cur->epoch);
            lk_peer_put(cur);
            cur = NULL;
            dp->error = rc; /* the reason, for the caller */
        }
        dp->peer = cur;
    }
    if (dp->peer == NULL || atomic_load(&l->conn.failed_epoch) >= dp->peer->epoch) {
        if (dp->error == KVD_OK)
            dp->error = KVD_ERR_CLOSED;
        return 0;
    }
    return dp->peer->epoch;
}

static void dp_lock(void *m)
{
    lk_lock(m);
}

static void dp_unlock(void *m)
{
    lk_unlock(m);
}

/* Waits for the oldest batch in flight: timeout_ms, plus its bytes at
 * 50 MB/s (a large batch over a slow link is not a dead daemon). The
 * mutex is taken per look, so registration never waits behind a wait. */
static void wait_oldest(kvd_linker_t *l, ldp_t *dp)
{
    uint64_t cookie = dp->flight[0].cookie, bytes = dp->flight[0].bytes;
    dp->n_flight--;
    for (size_t i = 0; i < dp->n_flight; i++)
        dp->flight[i] = dp->flight[i + 1];
    uint64_t ms = (uint64_t)l->timeout_ms + bytes / 50000u;
    const kvd_wait_lock_t lk = {dp_lock, dp_unlock, &dp->mutex};
    int rc =
        kvd_transport_wait_locked(dp->t, cookie, (int)KVD_MIN(ms, (uint64_t)INT32_MAX),
                                  dp->kept, &dp->n_kept, KVD_ARRAY_SIZE(dp->kept), &lk);
    if (rc != KVD_OK)
        dp_fail(l, dp, rc);
}

/* An offload's batch lets the loads being copied go first, for up to
 * LK_DP_YIELD_NS: on a host with few cores the two threads' copies
 * compete for the same CPUs and memory, and a load's first layer is what
 * the forward pass waits for. Sleeps, holding no lock. */
static void yield_to_loads(kvd_linker_t *l, const ldp_t *dp)
{
    if (dp->index != LK_DP_OFFLOAD)
        return;
    uint64_t now = kvd_now_ns(), until = now + LK_DP_YIELD_NS;
    while ((atomic_load(&l->loads_copying) > 0 ||
            now < atomic_load(&l->load_coming_until_ns)) &&
           now < until) {
        kvd_sleep_ns(20000);
        now = kvd_now_ns();
    }
}

/* Posts what is gathered as one batch, after the oldest in flight when
 * the window is full. */
static int post_gathered(kvd_linker_t *l, ldp_t *dp)
{
    if (dp->n == 0 || dp->error != KVD_OK) {
        dp->n = 0;
        dp->gathered_bytes = 0;
        return dp->error;
    }
    yield_to_loads(l, dp);
    if (dp->n_flight == LK_DP_WINDOW)
        wait_oldest(l, dp);
    if (dp->error != KVD_OK)
        return dp->error;
    uint64_t cookie = ++dp->next_cookie;
    lk_lock(&dp->mutex);
    int rc = kvd_transport_post(dp->t, dp->dir, dp->v, dp->n, cookie);
    lk_unlock(&dp->mutex);
    if (rc == KVD_OK)
        dp->flight[dp->n_flight++] = (ldp_flight_t){cookie, dp->gathered_bytes};
    else
        dp_fail(l, dp, rc);
    dp->n = 0;
    dp->gathered_bytes = 0;
    return dp->error;
}

int lk_dp_add(kvd_linker_t *l, ldp_t *dp, kvd_region_t *r, uint64_t off,
              uint64_t pool_off, uint64_t bytes)
{
    if (dp->error != KVD_OK)
        return dp->error;
    if (dp->n > 0) {
        kvd_xfer_t *last = &dp->v[dp->n - 1];
        if (last->local == r && last->local_offset + last->length == off &&
            last->remote_offset + last->length == pool_off) {
            last->length += bytes;
            goto added;
        }
    }
    if (dp->n == dp->cap) {
        size_t cap = dp->cap ? dp->cap * 2 : 64;
        kvd_xfer_t *v = realloc(dp->v, cap * sizeof(*v));
        if (v == NULL) {
            dp->error = KVD_ERR_NOMEM;
            return dp->error;
        }
        dp->v = v;
        dp->cap = cap;
    }
    dp->v[dp->n++] = (kvd_xfer_t){
        .local = r, .local_offset = off, .remote_offset = pool_off, .length = bytes};
added:
    dp->gathered_bytes += bytes;
    if (dp->gathered_bytes >= dp->batch_bytes)
        return post_gathered(l, dp);
    return KVD_OK;
}

int lk_dp_flush(kvd_linker_t *l, ldp_t *dp)
{
    post_gathered(l, dp);
    while (dp->n_flight > 0)
        wait_oldest(l, dp);
    return dp->error;
}

int lk_dp_post(kvd_linker_t *l, ldp_t *dp)
{
    return post_gathered(l, dp);
}

int lk_dp_wait_upto(kvd_linker_t *l, ldp_t *dp, uint64_t cookie)
{
    while (dp->n_flight > 0 && dp->flight[0].cookie <= cookie)
        wait_oldest(l, dp);
    return dp->error;
}

void lk_dp_end(kvd_linker_t *l, ldp_t *dp)
{
    dp->n = 0; /* not sent: nothing more goes out */
    dp->gathered_bytes = 0;
    while (dp->n_flight > 0) /* what is on the wire ends before its rows are reused */
        wait_oldest(l, dp);
}
