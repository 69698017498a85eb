/*
 * shm.c - the same-host backend: the peer's region is mapped in this
 * process (the daemon's pool, through its shared-memory file), so a
 * transfer is a copy by the local region's memory kind, issued at post
 * time (each run of one kind as one batch of the kind's). A WRITE batch
 * first syncs its synchronous kinds (the memory's own writes are final
 * before it is read). A batch is reported by poll, in posting order, once
 * its synchronous kinds synced after its copies and a mark each of its
 * asynchronous kinds (a device's stream) took after them is done: the
 * copy thread never blocks on a device copy in post or poll.
 */
#include "transport_int.h"

#include <stdlib.h>
#include <string.h>

/* A batch posted whose copies through async kinds may still run: done
 * once each of its marks is. */
typedef struct shm_pending {
    uint64_t cookie;
    int status;
    size_t n_marks;
    const kvd_memkind_t *kinds[KVD_KINDS_MAX];
    void *marks[KVD_KINDS_MAX];
} shm_pending_t;

typedef struct shm_transport {
    kvd_transport_t base;
    uint8_t *remote; /* the peer's region, mapped here; NULL: none */
    kvd_done_ring_t done;
    kvd_kind_set_t unsynced; /* synchronous kinds copied through since the last poll */
    /* batches waiting for their marks, oldest first */
    shm_pending_t *pending;
    size_t n_pending, cap_pending;
    kvd_copy_t *copies; /* one run of a batch, for copy_batch */
    size_t cap_copies;
} shm_transport_t;

static int shm_connect(kvd_transport_t *t, const kvd_peer_t *peer)
{
    shm_transport_t *s = (shm_transport_t *)t;
    if (peer->mapping == NULL)
        return KVD_ERR_INVALID;
    s->remote = peer->mapping;
    return KVD_OK;
}

/* Moves the pending batches whose marks are done (all of them when wait)
 * to the done ring, in posting order. */
static void settle(shm_transport_t *s, bool wait)
{
    size_t k = 0;
    for (; k < s->n_pending; k++) {
        shm_pending_t *p = &s->pending[k];
        int rc = KVD_OK;
        for (size_t m = 0; m < p->n_marks; m++) {
            int one = wait ? kvd_memkind_mark_wait(p->kinds[m], p->marks[m])
                           : kvd_memkind_mark_query(p->kinds[m], p->marks[m]);
            if (one == KVD_INPROGRESS) {
                rc = one;
                break;
            }
            if (rc == KVD_OK)
                rc = one;
        }
        if (rc == KVD_INPROGRESS)
            break; /* reports go out in posting order */
        for (size_t m = 0; m < p->n_marks; m++)
            kvd_memkind_mark_free(p->kinds[m], p->marks[m]);
        kvd_done_ring_push(&s->done, p->cookie, p->status != KVD_OK ? p->status : rc);
    }
    if (k > 0) {
        memmove(s->pending, s->pending + k, (s->n_pending - k) * sizeof(*s->pending));
        s->n_pending -= k;
    }
}

/* Copies are issued when post returns: a disconnect waits for what is
 * still running, so that nothing lands in local memory later. */
static void shm_disconnect(kvd_transport_t *t)
{
    shm_transport_t *s = (shm_transport_t *)t;
    (void)kvd_kind_set_sync(&s->unsynced);
    settle(s, true);
    s->remote = NULL;
}

/* Issues one run of copies through one kind. */
static int copy_run(shm_transport_t *s, kvd_xfer_dir_t dir, const kvd_xfer_t *xfers,
                    size_t n)
{
    if (n > s->cap_copies) {
        kvd_copy_t *v = realloc(s->copies, n * sizeof(*v));
        if (v == NULL)
            return KVD_ERR_NOMEM;
        s->copies = v;
        s->cap_copies = n;
    }
    for (size_t i = 0; i < n; i++) {
        uint8_t *local = xfers[i].local->base + xfers[i].local_offset;
        uint8_t *remote = s->remote + xfers[i].remote_offset;
        s->copies[i] =
            dir == KVD_XFER_READ
                ? (kvd_copy_t){.dst = local, .src = remote, .n = xfers[i].length}
                : (kvd_copy_t){.dst = remote, .src = local, .n = xfers[i].length};
    }
    return kvd_memkind_copy_batch(xfers[0].local->kind, s->copies, n,
                                  dir == KVD_XFER_READ);
}

static int shm_post(kvd_transport_t *t, kvd_xfer_dir_t dir, const kvd_xfer_t *xfers,
                    size_t n, uint64_t cookie)
{
    shm_transport_t *s = (shm_transport_t *)t;
    if (kvd_done_ring_reserve(&s->done, s->done.len + s->n_pending + 1) != KVD_OK)
        return KVD_ERR_NOMEM;
    if (s->n_pending == s->cap_pending) {
        size_t cap = s->cap_pending ? s->cap_pending * 2 : 16;
        shm_pending_t *v = realloc(s->pending, cap * sizeof(*v));
        if (v == NULL)
            return KVD_ERR_NOMEM;
        s->pending = v;
        s->cap_pending = cap;
    }
    shm_pending_t *p = &s->pending[s->n_pending];
    *p = (shm_pending_t){.cookie = cookie};
    int rc = KVD_OK;
    if (dir == KVD_XFER_WRITE) {
        /* a synchronous kind's memory is final once it synced; an async
         * kind's owner syncs, or has the kind wait (after) */
        kvd_kind_set_t kinds = {0};
        for (size_t i = 0; rc == KVD_OK && i < n; i++)
            if (!xfers[i].local->kind->async &&
                !kvd_kind_set_add(&kinds, xfers[i].local->kind))
                rc = kvd_kind_set_sync(&kinds);
        if (rc == KVD_OK)
            rc = kvd_kind_set_sync(&kinds);
    }
    kvd_kind_set_t async_kinds = {0};
    for (size_t i = 0; rc == KVD_OK && i < n;) {
        const kvd_memkind_t *kind = xfers[i].local->kind;
        size_t run = 1;
        while (i + run < n && xfers[i + run].local->kind == kind)
            run++;
        if (kind->async) {
            if (!kvd_kind_set_add(&async_kinds, kind))
                rc = KVD_ERR_UNSUPPORTED; /* more device kinds in one batch than marks */
        } else {
            if (!kvd_kind_set_add(&s->unsynced, kind))
                rc = kvd_kind_set_sync(&s->unsynced);
            if (rc == KVD_OK && !kvd_kind_set_add(&s->unsynced, kind))
                rc = KVD_ERR_STATE; /* cannot happen: the set was just emptied */
        }
        if (rc == KVD_OK)
            rc = copy_run(s, dir, xfers + i, run);
        i += run;
    }
    /* every async kind the batch went through marks its end (also after a
     * failure: what was issued must end before the batch is reported) */
    for (size_t k = 0; k < async_kinds.n; k++) {
        void *mark = NULL;
        int one = kvd_memkind_mark(async_kinds.v[k], &mark);
        if (one != KVD_OK) {
            if (rc == KVD_OK)
                rc = one;
            (void)async_kinds.v[k]->sync(async_kinds.v[k]);
            continue;
        }
        p->kinds[p->n_marks] = async_kinds.v[k];
        p->marks[p->n_marks++] = mark;
    }
    p->status = rc;
    s->n_pending++;
    return KVD_OK;
}

static int shm_poll(kvd_transport_t *t, kvd_xfer_done_t *done, size_t max, size_t *n_done)
{
    shm_transport_t *s = (shm_transport_t *)t;
    *n_done = 0;
    if (s->done.len == 0 && s->n_pending == 0)
        return KVD_OK;
    /* every synchronous copy of the batches reported below is complete */
    int rc = kvd_kind_set_sync(&s->unsynced);
    settle(s, false);
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
    settle(s, true); /* disconnected already: nothing is left */
    kvd_done_ring_free(&s->done);
    free(s->pending);
    free(s->copies);
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
