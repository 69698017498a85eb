/*
 * shm.c - the same-host backend: both regions are mapped in this process
 * (the peer's through its shared-memory file), so a transfer is a memcpy
 * done at post time; poll hands the completions back in posting order.
 */
#include "transport_int.h"

#include <stdlib.h>
#include <string.h>

typedef struct shm_transport {
    kvd_transport_t base;
    kvd_region_t local;
    kvd_region_t remote;
    kvd_done_ring_t done;
} shm_transport_t;

static int shm_post(kvd_transport_t *t, kvd_xfer_dir_t dir, const kvd_xfer_t *xfers,
                    size_t n, uint64_t cookie)
{
    shm_transport_t *s = (shm_transport_t *)t;
    for (size_t i = 0; i < n; i++)
        if (!kvd_range_ok(xfers[i].local_offset, xfers[i].length, s->local.length) ||
            !kvd_range_ok(xfers[i].remote_offset, xfers[i].length, s->remote.length))
            return KVD_ERR_INVALID;
    if (kvd_done_ring_reserve(&s->done, s->done.len + 1) != KVD_OK)
        return KVD_ERR_NOMEM;
    uint8_t *l = s->local.base, *r = s->remote.base;
    for (size_t i = 0; i < n; i++) {
        const kvd_xfer_t *x = &xfers[i];
        if (dir == KVD_XFER_READ)
            memcpy(l + x->local_offset, r + x->remote_offset, x->length);
        else
            memcpy(r + x->remote_offset, l + x->local_offset, x->length);
    }
    kvd_done_ring_push(&s->done, cookie, KVD_OK);
    return KVD_OK;
}

static int shm_poll(kvd_transport_t *t, kvd_xfer_done_t *done, size_t max, size_t *n_done)
{
    shm_transport_t *s = (shm_transport_t *)t;
    *n_done = kvd_done_ring_pop(&s->done, done, max);
    return KVD_OK;
}

static void shm_destroy(kvd_transport_t *t)
{
    shm_transport_t *s = (shm_transport_t *)t;
    kvd_done_ring_free(&s->done);
    free(s);
}

static const kvd_transport_ops_t shm_ops = {
    .name = "shm",
    .post = shm_post,
    .poll = shm_poll,
    .progress = kvd_transport_progress_none,
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
