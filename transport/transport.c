/*
 * transport.c - what every backend shares: regions (registration and the
 * checks every batch passes before a backend sees it), the dispatch of
 * connect, post and destroy, waiting for one batch, the typed stubs, and
 * the ring of finished batches.
 */
#include "transport_int.h"

#include <sched.h>
#include <stdlib.h>

/* ------------------------------------------------------------- regions */

int kvd_transport_register(kvd_transport_t *t, void *base, uint64_t length,
                           const kvd_memkind_t *kind, kvd_region_t **out)
{
    if (t == NULL || base == NULL || length == 0 || kind == NULL || out == NULL ||
        length > UINT64_MAX - (uint64_t)(uintptr_t)base)
        return KVD_ERR_INVALID;
    kvd_region_t *r = calloc(1, sizeof(*r));
    if (r == NULL)
        return KVD_ERR_NOMEM;
    *r = (kvd_region_t){.t = t, .base = base, .length = length, .kind = kind};
    int rc = t->ops->reg(t, r);
    if (rc != KVD_OK) {
        free(r);
        return rc;
    }
    r->next = t->regions;
    t->regions = r;
    *out = r;
    return KVD_OK;
}

void kvd_transport_deregister(kvd_transport_t *t, kvd_region_t *r)
{
    if (t == NULL || r == NULL || r->t != t)
        return;
    kvd_region_t **pp = &t->regions;
    while (*pp != NULL && *pp != r)
        pp = &(*pp)->next;
    if (*pp == NULL)
        return; /* not registered here */
    *pp = r->next;
    t->ops->dereg(t, r);
    free(r);
}

void *kvd_region_base(const kvd_region_t *r)
{
    return r->base;
}

uint64_t kvd_region_length(const kvd_region_t *r)
{
    return r->length;
}

/* ------------------------------------------------------------ dispatch */

int kvd_transport_connect(kvd_transport_t *t, const kvd_peer_t *peer)
{
    if (t == NULL)
        return KVD_ERR_INVALID;
    kvd_transport_disconnect(t); /* a failure leaves t disconnected */
    if (peer == NULL || peer->length == 0)
        return KVD_ERR_INVALID;
    int rc = t->ops->connect(t, peer);
    if (rc == KVD_OK)
        t->remote_length = peer->length;
    return rc;
}

void kvd_transport_disconnect(kvd_transport_t *t)
{
    if (t == NULL)
        return;
    t->ops->disconnect(t);
    t->remote_length = 0;
}

int kvd_transport_post(kvd_transport_t *t, kvd_xfer_dir_t dir, const kvd_xfer_t *xfers,
                       size_t n, uint64_t cookie)
{
    if (t == NULL || (xfers == NULL && n > 0) ||
        (dir != KVD_XFER_READ && dir != KVD_XFER_WRITE))
        return KVD_ERR_INVALID;
    /* every transfer is checked before any byte moves: the whole batch
     * is refused, never half done */
    for (size_t i = 0; i < n; i++) {
        const kvd_xfer_t *x = &xfers[i];
        if (x->local == NULL || x->local->t != t ||
            !kvd_range_ok(x->local_offset, x->length, x->local->length))
            return KVD_ERR_INVALID;
        if (t->remote_length != 0 &&
            !kvd_range_ok(x->remote_offset, x->length, t->remote_length))
            return KVD_ERR_INVALID;
    }
    if (t->remote_length == 0)
        return KVD_ERR_CLOSED;
    return t->ops->post(t, dir, xfers, n, cookie);
}

void kvd_transport_destroy(kvd_transport_t *t)
{
    if (t == NULL)
        return;
    kvd_transport_disconnect(t);
    while (t->regions != NULL)
        kvd_transport_deregister(t, t->regions);
    t->ops->destroy(t);
}

/* Takes cookie's report out of kept, if it is there. */
static bool take_kept(uint64_t cookie, kvd_xfer_done_t *kept, size_t *n_kept, int *status)
{
    for (size_t i = 0; kept != NULL && n_kept != NULL && i < *n_kept; i++)
        if (kept[i].cookie == cookie) {
            *status = kept[i].status;
            kept[i] = kept[--*n_kept];
            return true;
        }
    return false;
}

int kvd_transport_wait_locked(kvd_transport_t *t, uint64_t cookie, int timeout_ms,
                              kvd_xfer_done_t *kept, size_t *n_kept, size_t cap,
                              const kvd_wait_lock_t *lk)
{
    int status = KVD_OK;
    if (take_kept(cookie, kept, n_kept, &status))
        return status;
    uint64_t deadline = kvd_now_ns() + (uint64_t)KVD_MAX(timeout_ms, 0) * 1000000ull;
    unsigned idle = 0;
    for (unsigned pass = 0;; pass++) {
        kvd_xfer_done_t done[16];
        size_t n = 0;
        if (lk != NULL)
            lk->lock(lk->ctx);
        int rc = kvd_transport_poll(t, done, KVD_ARRAY_SIZE(done), &n);
        bool busy = rc == KVD_OK && n == 0 && kvd_transport_progress(t) > 0;
        if (lk != NULL)
            lk->unlock(lk->ctx);
        if (rc != KVD_OK)
            return rc;
        bool found = false;
        for (size_t i = 0; i < n; i++) {
            if (done[i].cookie == cookie) {
                found = true;
                status = done[i].status;
            } else if (kept != NULL && n_kept != NULL && *n_kept < cap) {
                kept[(*n_kept)++] = done[i]; /* someone else's */
            }
        }
        if (found)
            return status;
        idle = busy || n > 0 ? 0 : idle + 1;
        /* the clock is read every 64 passes (a pass is ~100 ns), busy or
         * not, so that a peer that keeps the worker busy cannot stretch it */
        if ((pass & 63) == 63 && kvd_now_ns() >= deadline)
            return KVD_ERR_TIMEOUT;
        if (idle >= 64) {
            idle = 0;
            sched_yield();
        }
    }
}

int kvd_transport_wait(kvd_transport_t *t, uint64_t cookie, int timeout_ms,
                       kvd_xfer_done_t *kept, size_t *n_kept, size_t cap)
{
    return kvd_transport_wait_locked(t, cookie, timeout_ms, kept, n_kept, cap, NULL);
}

/* --------------------------------------------------------------- stubs */

int kvd_transport_reg_none(kvd_transport_t *t, kvd_region_t *r)
{
    (void)t;
    (void)r;
    return KVD_OK;
}

void kvd_transport_dereg_none(kvd_transport_t *t, kvd_region_t *r)
{
    (void)t;
    (void)r;
}

int kvd_transport_connect_unsupported(kvd_transport_t *t, const kvd_peer_t *peer)
{
    (void)t;
    (void)peer;
    return KVD_ERR_UNSUPPORTED;
}

void kvd_transport_disconnect_none(kvd_transport_t *t)
{
    (void)t;
}

int kvd_transport_post_unsupported(kvd_transport_t *t, kvd_xfer_dir_t dir,
                                   const kvd_xfer_t *xfers, size_t n, uint64_t cookie)
{
    (void)t;
    (void)dir;
    (void)xfers;
    (void)n;
    (void)cookie;
    return KVD_ERR_UNSUPPORTED;
}

int kvd_transport_poll_unsupported(kvd_transport_t *t, kvd_xfer_done_t *done, size_t max,
                                   size_t *n_done)
{
    (void)t;
    (void)done;
    (void)max;
    *n_done = 0;
    return KVD_ERR_UNSUPPORTED;
}

unsigned kvd_transport_progress_none(kvd_transport_t *t)
{
    (void)t;
    return 0;
}

/* ---------------------------------------------------------- kind sets */

bool kvd_kind_set_add(kvd_kind_set_t *s, const kvd_memkind_t *k)
{
    for (size_t i = 0; i < s->n; i++)
        if (s->v[i] == k)
            return true;
    if (s->n == KVD_KINDS_MAX)
        return false;
    s->v[s->n++] = k;
    return true;
}

int kvd_kind_set_sync(kvd_kind_set_t *s)
{
    int rc = KVD_OK;
    for (size_t i = 0; i < s->n; i++) {
        int one = s->v[i]->sync(s->v[i]);
        if (rc == KVD_OK)
            rc = one;
    }
    s->n = 0;
    return rc;
}

/* ---------------------------------------------------------- done ring */

int kvd_done_ring_reserve(kvd_done_ring_t *r, size_t n)
{
    if (n <= r->cap)
        return KVD_OK;
    size_t cap = KVD_MAX(r->cap * 2, KVD_MAX(n, (size_t)16));
    kvd_xfer_done_t *v = malloc(cap * sizeof(*v));
    if (v == NULL)
        return KVD_ERR_NOMEM;
    for (size_t i = 0; i < r->len; i++)
        v[i] = r->v[(r->head + i) % r->cap];
    free(r->v);
    *r = (kvd_done_ring_t){.v = v, .head = 0, .len = r->len, .cap = cap};
    return KVD_OK;
}

void kvd_done_ring_push(kvd_done_ring_t *r, uint64_t cookie, int status)
{
    r->v[(r->head + r->len) % r->cap] =
        (kvd_xfer_done_t){.cookie = cookie, .status = status};
    r->len++;
}

size_t kvd_done_ring_pop(kvd_done_ring_t *r, kvd_xfer_done_t *out, size_t max)
{
    size_t n = KVD_MIN(max, r->len);
    for (size_t i = 0; i < n; i++)
        out[i] = r->v[(r->head + i) % r->cap];
    if (n > 0) {
        r->head = (r->head + n) % r->cap;
        r->len -= n;
    }
    return n;
}

void kvd_done_ring_free(kvd_done_ring_t *r)
{
    free(r->v);
    *r = (kvd_done_ring_t){0};
}
