/*
 * shm.c - the same-host backend: the peer's region is mapped in this
 * process (the daemon's pool, through its shared-memory file), so a
 * transfer is a copy by the local region's memory kind, issued at post
 * time. A WRITE batch first syncs its kinds (the memory's own writes are
 * final before it is read); a batch is reported by poll once its kinds
 * synced after its copies, in posting order.
 */
#include "transport_int.h"

#include <stdlib.h>

typedef struct shm_transport {
    kvd_transport_t base;
    uint8_t *remote; /* the peer's region, mapped here; NULL: none */
    kvd_done_ring_t done;
    kvd_kind_set_t unsynced; /* kinds copied through since the last poll */
} shm_transport_t;

static int shm_connect(kvd_transport_t *t, const kvd_peer_t *peer)
{
    shm_transport_t *s = (shm_transport_t *)t;
    if (peer->mapping == NULL)
        return KVD_ERR_INVALID;
    s->remote = peer->mapping;
    return KVD_OK;
}

/* Copies are done when post returns (they complete at the next sync):
 * nothing is left to cancel. */
static void shm_disconnect(kvd_transport_t *t)
{
    shm_transport_t *s = (shm_transport_t *)t;
    (void)kvd_kind_set_sync(&s->unsynced);
    s->remote = NULL;
}

static int shm_post(kvd_transport_t *t, kvd_xfer_dir_t dir, const kvd_xfer_t *xfers,
                    size_t n, uint64_t cookie)
{
    shm_transport_t *s = (shm_transport_t *)t;
    if (kvd_done_ring_reserve(&s->done, s->done.len + 1) != KVD_OK)
        return KVD_ERR_NOMEM;
    int rc = KVD_OK;
    if (dir == KVD_XFER_WRITE) {
        kvd_kind_set_t kinds = {0};
        for (size_t i = 0; rc == KVD_OK && i < n; i++)
            if (!kvd_kind_set_add(&kinds, xfers[i].local->kind))
                rc = kvd_kind_set_sync(&kinds);
        if (rc == KVD_OK)
            rc = kvd_kind_set_sync(&kinds); /* the region's writes are final */
    }
    for (size_t i = 0; rc == KVD_OK && i < n; i++) {
        const kvd_xfer_t *x = &xfers[i];
        const kvd_memkind_t *kind = x->local->kind;
        uint8_t *local = x->local->base + x->local_offset;
        uint8_t *remote = s->remote + x->remote_offset;
        if (!kvd_kind_set_add(&s->unsynced, kind))
            rc = kvd_kind_set_sync(&s->unsynced);
        if (rc == KVD_OK && !kvd_kind_set_add(&s->unsynced, kind))
            rc = KVD_ERR_STATE; /* cannot happen: the set was just emptied */
        if (rc == KVD_OK)
            rc = dir == KVD_XFER_READ ? kind->copy(local, remote, x->length, true)
                                      : kind->copy(remote, local, x->length, false);
    }
    kvd_done_ring_push(&s->done, cookie, rc);
    return KVD_OK;
}

static int shm_poll(kvd_transport_t *t, kvd_xfer_done_t *done, size_t max, size_t *n_done)
{
    shm_transport_t *s = (shm_transport_t *)t;
    *n_done = 0;
    if (s->done.len == 0)
        return KVD_OK;
    /* every copy of the batches reported below is complete */
    int rc = kvd_kind_set_sync(&s->unsynced);
    size_t n = kvd_done_ring_pop(&s->done, done, max);
    for (size_t i = 0; i < n; i++)
        if (done[i].status == KVD_OK)
            done[i].status = rc;
    *n_done = n;
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
    .reg = kvd_transport_reg_none,
    .dereg = kvd_transport_dereg_none,
    .connect = shm_connect,
    .disconnect = shm_disconnect,
    .post = shm_post,
    .poll = shm_poll,
    .progress = kvd_transport_progress_none,
    .destroy = shm_destroy,
};

int kvd_transport_open_shm(kvd_transport_t **out)
{
    if (out == NULL)
        return KVD_ERR_INVALID;
    shm_transport_t *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return KVD_ERR_NOMEM;
    s->base.ops = &shm_ops;
    *out = &s->base;
    return KVD_OK;
}
