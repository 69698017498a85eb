/*
 * transport.c - what every backend shares: the destroy dispatch and the
 * typed "unsupported" stubs.
 */
#include "transport_int.h"

#include <sched.h>
#include <stdlib.h>

void kvd_transport_destroy(kvd_transport_t *t)
{
    if (t != NULL)
        t->ops->destroy(t);
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

int kvd_transport_wait_keep(kvd_transport_t *t, uint64_t cookie, int timeout_ms,
                            kvd_xfer_done_t *kept, size_t *n_kept, size_t cap)
{
    uint64_t deadline = kvd_now_ns() + (uint64_t)KVD_MAX(timeout_ms, 0) * 1000000ull;
    unsigned idle = 0;
    for (unsigned pass = 0;; pass++) {
        kvd_xfer_done_t done[16];
        size_t n = 0;
        int rc = kvd_transport_poll(t, done, KVD_ARRAY_SIZE(done), &n);
        if (rc != KVD_OK)
            return rc;
        bool found = false;
        int status = KVD_OK;
        for (size_t i = 0; i < n; i++) {
            if (done[i].cookie == cookie) {
                found = true;
                status = done[i].status;
            } else if (n_kept != NULL && *n_kept < cap) {
                kept[(*n_kept)++] = done[i]; /* someone else's */
            }
        }
        if (found)
            return status;
        bool busy = kvd_transport_progress(t) > 0 || n > 0;
        idle = busy ? 0 : idle + 1;
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

int kvd_transport_wait(kvd_transport_t *t, uint64_t cookie, int timeout_ms)
{
    return kvd_transport_wait_keep(t, cookie, timeout_ms, NULL, NULL, 0);
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
