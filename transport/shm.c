/*
 * shm.c - the same-host backend: both regions are mapped in this process
 * (the peer's through its shared-memory file), so a transfer is a memcpy
 * done at post time; poll hands the completions back in posting order.
 *
 * Completions wait in a small growable ring until polled.
 */
#include "kvd_transport.h"

#include <stdlib.h>
#include <string.h>

typedef struct shm_transport {
    kvd_transport_t base;
    kvd_region_t local;
    kvd_region_t remote;
    kvd_xfer_done_t *done;
    size_t done_head, done_len, done_cap;
} shm_transport_t;

static int shm_post(kvd_transport_t *t, kvd_xfer_dir_t dir, const kvd_xfer_t *xfers,
                    size_t n, uint64_t cookie)
{
    shm_transport_t *s = (shm_transport_t *)t;
    for (size_t i = 0; i < n; i++)
        if (!kvd_range_ok(xfers[i].local_offset, xfers[i].length, s->local.length) ||
            !kvd_range_ok(xfers[i].remote_offset, xfers[i].length, s->remote.length))
            return KVD_ERR_INVALID;
    if (s->done_len == s->done_cap) {
        size_t cap = s->done_cap ? s->done_cap * 2 : 16;
        kvd_xfer_done_t *d = malloc(cap * sizeof(*d));
        if (d == NULL)
            return KVD_ERR_NOMEM;
        for (size_t i = 0; i < s->done_len; i++)
            d[i] = s->done[(s->done_head + i) % s->done_cap];
        free(s->done);
        s->done = d;
        s->done_cap = cap;
        s->done_head = 0;
    }
    uint8_t *l = s->local.base, *r = s->remote.base;
    for (size_t i = 0; i < n; i++) {
        const kvd_xfer_t *x = &xfers[i];
        if (dir == KVD_XFER_READ)
            memcpy(l + x->local_offset, r + x->remote_offset, x->length);
        else
            memcpy(r + x->remote_offset, l + x->local_offset, x->length);
    }
    s->done[(s->done_head + s->done_len) % s->done_cap] =
        (kvd_xfer_done_t){.cookie = cookie, .status = KVD_OK};
    s->done_len++;
    return KVD_OK;
}

static int shm_poll(kvd_transport_t *t, kvd_xfer_done_t *done, size_t max, size_t *n_done)
{
    shm_transport_t *s = (shm_transport_t *)t;
    size_t n = KVD_MIN(max, s->done_len);
    for (size_t i = 0; i < n; i++)
        done[i] = s->done[(s->done_head + i) % s->done_cap];
    if (n > 0) {
        s->done_head = (s->done_head + n) % s->done_cap;
        s->done_len -= n;
    }
    *n_done = n;
    return KVD_OK;
}

static void shm_destroy(kvd_transport_t *t)
{
    shm_transport_t *s = (shm_transport_t *)t;
    free(s->done);
    free(s);
}

static const kvd_transport_ops_t shm_ops = {
    .name = "shm",
    .post = shm_post,
    .poll = shm_poll,
    .destroy = shm_destroy,
};

int kvd_transport_open_shm(const kvd_region_t *local, const kvd_region_t *remote,
                           kvd_transport_t **out)
{
    if (local == NULL || remote == NULL || local->base == NULL || remote->base == NULL)
        return KVD_ERR_INVALID;
    shm_transport_t *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return KVD_ERR_NOMEM;
    s->base.ops = &shm_ops;
    s->local = *local;
    s->remote = *remote;
    *out = &s->base;
    return KVD_OK;
}
