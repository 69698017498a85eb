/*
 * load.c - the load protocol (DESIGN.md section 6): LOAD pins and records,
 * PREPARE, COMMIT cuts the transfers to what the tree adopted, ABORT undoes
 * a load that never reached the insert; layer-wise batches and the
 * completion queues; offload jobs. The copies themselves run on the
 * load and offload threads (transfer.c).
 */
#include "linker_int.h"

#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Copies the caller's transfer into owned arrays; checks its shape. */
static int xfer_copy(const kvd_linker_t *l, const kvd_transfer_t *t, lxfer_t *x)
{
    memset(x, 0, sizeof(*x));
    /* key positions are 32-bit (begin, end) */
    if (t->pool_id >= l->n_pools || t->n_keys == 0 || t->n_keys > UINT32_MAX ||
        t->keys == NULL)
        return KVD_ERR_INVALID;
    const lpool_t *p = &l->pools[t->pool_id];
    size_t want =
        p->desc.addressing == KVD_ADDR_PAGED ? t->n_keys * p->desc.page_size : t->n_keys;
    if (t->device_indices == NULL || t->n_indices != want)
        return KVD_ERR_INVALID;
    for (size_t i = 0; i < want; i++) {
        int64_t v = t->device_indices[i];
        if (v < 0 || (uint64_t)v >= p->desc.n_rows)
            return KVD_ERR_INVALID;
        /* a page's slots are consecutive from a multiple of page_size */
        if (p->desc.addressing == KVD_ADDR_PAGED &&
            (i % p->desc.page_size == 0 ? v % p->desc.page_size != 0
                                        : v != t->device_indices[i - 1] + 1))
            return KVD_ERR_INVALID;
    }
    x->pool = t->pool_id;
    x->n_keys = t->n_keys;
    x->n_idx = want;
    x->first_depth = t->first_depth;
    x->keys = malloc(t->n_keys * sizeof(kvd_key_t));
    x->idx = malloc(want * sizeof(int64_t));
    x->offsets = calloc(t->n_keys, sizeof(uint64_t));
    if (t->depths)
        x->depths = malloc(t->n_keys * sizeof(uint32_t));
    if (!x->keys || !x->idx || !x->offsets || (t->depths && !x->depths))
        return KVD_ERR_NOMEM;
    memcpy(x->keys, t->keys, t->n_keys * sizeof(kvd_key_t));
    memcpy(x->idx, t->device_indices, want * sizeof(int64_t));
    if (t->depths)
        memcpy(x->depths, t->depths, t->n_keys * sizeof(uint32_t));
    if (t->prior_key) {
        x->has_prior = true;
        memcpy(x->prior, t->prior_key, sizeof(kvd_key_t));
    }
    x->begin = 0;
    x->end = (uint32_t)t->n_keys;
    return KVD_OK;
}

static int copy_transfers(kvd_linker_t *l, const kvd_transfer_t *t, size_t n,
                          lxfer_t **out)
{
    lxfer_t *x = calloc(n, sizeof(*x));
    if (x == NULL)
        return KVD_ERR_NOMEM;
    pthread_mutex_lock(&l->lock);
    int rc = KVD_OK;
    for (size_t i = 0; i < n && rc == KVD_OK; i++)
        rc = xfer_copy(l, &t[i], &x[i]);
    pthread_mutex_unlock(&l->lock);
    if (rc != KVD_OK) {
        lk_xfer_free(x, n);
        return rc;
    }
    *out = x;
    return KVD_OK;
}

/* Releases the read lease of each transfer, all in one round trip (best
 * effort: a lost connection or an expired lease has released it already).
 * Returns false when a lease was gone: its pins may have lapsed while the
 * bytes were read. A lease goes only to the connection that granted it
 * (after a restart its id can name one of our new leases); releasing never
 * reconnects. */
bool lk_release(kvd_linker_t *l, lxfer_t *x, size_t n)
{
    size_t k = 0;
    uint64_t epoch = 0; /* a load's leases come from one Acquire round trip */
    bool all = true;
    for (size_t i = 0; i < n; i++) {
        if (x[i].lease != 0 && epoch == 0)
            epoch = x[i].epoch;
        if (x[i].lease != 0 && x[i].epoch != epoch) {
            x[i].lease = 0; /* of another connection: gone with it */
            all = false;
        }
        k += x[i].lease != 0;
    }
    if (k == 0)
        return all;
    kvd_msg_t *req = calloc(2 * k, sizeof(*req)), *rep = req + k;
    int rc = req ? KVD_OK : KVD_ERR_NOMEM;
    k = 0;
    for (size_t i = 0; rc == KVD_OK && i < n; i++) {
        if (x[i].lease == 0)
            continue;
        kvd_msg_request(&req[k], 0, KVD_METHOD_RELEASE);
        req[k++].body.release_req.lease_id = x[i].lease;
    }
    if (rc == KVD_OK)
        rc = lk_call_many(l, req, rep, k, epoch, NULL);
    for (size_t j = 0; j < k; j++) {
        if (rc == KVD_OK && rep[j].status != KVD_OK)
            rc = rep[j].status;
        kvd_msg_clear(&rep[j]);
    }
    /* out of memory too: the leases end with their TTL, the load fails */
    for (size_t i = 0; i < n; i++)
        x[i].lease = 0;
    free(req);
    return all && rc == KVD_OK;
}

/* Pins every transfer's keys, all in one round trip; records each lease
 * and the objects' offsets. All or nothing is the caller's: on failure
 * the leases that were granted are recorded, for lk_release. */
static int pin_all(kvd_linker_t *l, lxfer_t *x, size_t n)
{
    kvd_msg_t *req = calloc(2 * n, sizeof(*req)), *rep = req + n;
    uint64_t *object_bytes = calloc(n, sizeof(*object_bytes));
    if (req == NULL || object_bytes == NULL) {
        free(req);
        free(object_bytes);
        return KVD_ERR_NOMEM;
    }
    pthread_mutex_lock(&l->lock);
    for (size_t i = 0; i < n; i++) {
        const lpool_t *p = &l->pools[x[i].pool];
        object_bytes[i] = p->object_bytes;
        kvd_msg_request(&req[i], 0, KVD_METHOD_ACQUIRE);
        req[i].body.acquire_req = (kvd_acquire_req_t){.ns = p->ns_id,
                                                      .object_bytes = p->object_bytes,
                                                      .n = x[i].n_keys,
                                                      .keys = x[i].keys};
    }
    pthread_mutex_unlock(&l->lock);
    uint64_t epoch = 0, asked = kvd_now_ns();
    int call = lk_call_many(l, req, rep, n, 0, &epoch), rc = call;
    pthread_rwlock_rdlock(&l->map);
    /* offsets are into the mapping of the connection that gave them */
    bool current = epoch == atomic_load(&l->epoch);
    for (size_t i = 0; i < n; i++) {
        int one = call != KVD_OK                             ? call
                  : rep[i].status != KVD_OK                  ? rep[i].status
                  : rep[i].body.acquire_rep.n != x[i].n_keys ? KVD_ERR_PROTOCOL
                                                             : KVD_OK;
        if (one == KVD_OK) {
            x[i].lease = rep[i].body.acquire_rep.lease_id;
            x[i].epoch = epoch;
            x[i].asked_ns = asked;
            if (!current)
                one = KVD_ERR_CLOSED;
        }
        for (size_t k = 0; k < x[i].n_keys && one == KVD_OK; k++) {
            uint64_t off = rep[i].body.acquire_rep.offsets[k];
            /* the daemon's offsets are checked against the pool here too */
            if (off > l->pool_bytes || object_bytes[i] > l->pool_bytes - off)
                one = KVD_ERR_PROTOCOL;
            x[i].offsets[k] = off;
        }
        if (rc == KVD_OK && one != KVD_OK)
            rc = one; /* the first failure; later leases are still recorded */
        kvd_msg_clear(&rep[i]);
    }
    pthread_rwlock_unlock(&l->map);
    free(req);
    free(object_bytes);
    return rc;
}

static lload_t **find_load(kvd_linker_t *l, uint64_t rid)
{
    lload_t **pp = &l->loads;
    while (*pp != NULL && (*pp)->rid != rid)
        pp = &(*pp)->next;
    return pp;
}

KVD_API int kvd_load(kvd_linker_t *l, uint64_t rid, const kvd_transfer_t *t, size_t n)
{
    if (l == NULL || t == NULL || n == 0)
        return KVD_ERR_INVALID;
    lload_t *ld = calloc(1, sizeof(*ld));
    if (ld == NULL)
        return KVD_ERR_NOMEM;
    int rc = copy_transfers(l, t, n, &ld->x);
    ld->n = n;
    ld->rid = rid;
    /* recorded before pinning: a second LOAD of the rid meanwhile is refused */
    pthread_mutex_lock(&l->lock);
    if (rc == KVD_OK && *find_load(l, rid) != NULL)
        rc = KVD_ERR_EXISTS; /* one load per request at a time */
    if (rc == KVD_OK) {
        ld->state = LOAD_PINNING;
        ld->next = l->loads;
        l->loads = ld;
        /* wake the load thread now, while the pins are asked for: it
         * waits awake for the start (lk_load_thread_main) */
        if (l->spin_ns > 0) {
            l->spin_until_ns = kvd_now_ns() + l->spin_ns;
            pthread_cond_broadcast(&l->cond);
        }
    }
    pthread_mutex_unlock(&l->lock);
    if (rc != KVD_OK) { /* bad arguments: nothing recorded, nothing to abort */
        lk_xfer_free(ld->x, n);
        free(ld);
        return rc;
    }
    rc = pin_all(l, ld->x, n);
    if (rc != KVD_OK) {
        /* all or nothing: no pins stay; the record does, so that the
         * engine's ABORT can hand every device index back */
        lk_release(l, ld->x, n);
        for (size_t i = 0; i < n; i++)
            atomic_fetch_add(&l->pools[ld->x[i].pool].load_failures, 1);
    }
    pthread_mutex_lock(&l->lock);
    ld->state = rc == KVD_OK ? LOAD_PINNED : LOAD_FAILED;
    pthread_mutex_unlock(&l->lock);
    return rc;
}

KVD_API int kvd_load_prepare(kvd_linker_t *l, uint64_t rid)
{
    if (l == NULL)
        return KVD_ERR_INVALID;
    pthread_mutex_lock(&l->lock);
    lload_t *ld = *find_load(l, rid);
    int rc = ld == NULL                 ? KVD_ERR_NOT_FOUND
             : ld->state != LOAD_PINNED ? KVD_ERR_STATE
                                        : KVD_OK;
    if (rc == KVD_OK)
        ld->state = LOAD_PREPARED; /* host memory needs no fix-up */
    pthread_mutex_unlock(&l->lock);
    return rc;
}

/* Hands device indices back to the engine's allocator. */
static void free_indices(const lpool_t *p, const int64_t *idx, size_t n)
{
    if (n > 0 && p->desc.free_indices != NULL)
        p->desc.free_indices(p->desc.free_ctx, idx, n);
}

/* Device indices to hand back once the lock is dropped (the engine's
 * callback may call into the linker). */
typedef struct to_free {
    const lpool_t *pool;
    int64_t *idx;
    size_t n;
} to_free_t;

/* Copies idx[0..n) to be freed later; false when out of memory. */
static bool defer_free(to_free_t *f, size_t *k, const lpool_t *p, const int64_t *idx,
                       size_t n)
{
    if (n == 0)
        return true;
    int64_t *c = malloc(n * sizeof(*c));
    if (c == NULL)
        return false;
    memcpy(c, idx, n * sizeof(*c));
    f[(*k)++] = (to_free_t){p, c, n};
    return true;
}

KVD_API int kvd_load_commit(kvd_linker_t *l, uint64_t rid, const kvd_commit_pool_t *c,
                            size_t n)
{
    if (l == NULL || (c == NULL && n > 0))
        return KVD_ERR_INVALID;
    to_free_t *f = calloc(2 * n + 1, sizeof(*f));
    if (f == NULL)
        return KVD_ERR_NOMEM;
    size_t k = 0;
    pthread_mutex_lock(&l->lock);
    lload_t *ld = *find_load(l, rid);
    int rc = ld == NULL ? KVD_ERR_NOT_FOUND
             : ld->state == LOAD_PINNING || ld->state == LOAD_COMMITTED ||
                     ld->state == LOAD_FAILED
                 ? KVD_ERR_STATE
             : n != ld->n ? KVD_ERR_INVALID
                          : KVD_OK;
    /* adopted ranges mean something for paged transfers only */
    for (size_t i = 0; rc == KVD_OK && i < n; i++)
        if (l->pools[ld->x[i].pool].desc.addressing == KVD_ADDR_PAGED &&
            (c[i].adopted_begin > c[i].adopted_end || c[i].adopted_end > ld->x[i].n_keys))
            rc = KVD_ERR_INVALID;
    for (size_t i = 0; rc == KVD_OK && i < n; i++) {
        lxfer_t *x = &ld->x[i];
        const lpool_t *p = &l->pools[x->pool];
        if (p->desc.addressing == KVD_ADDR_SLOT)
            continue; /* never page-sliced */
        uint32_t ps = p->desc.page_size;
        if (!defer_free(f, &k, p, x->idx, (size_t)c[i].adopted_begin * ps) ||
            !defer_free(f, &k, p, x->idx + (size_t)c[i].adopted_end * ps,
                        (x->n_keys - c[i].adopted_end) * ps))
            rc = KVD_ERR_NOMEM;
    }
    /* its completion will have room in the queue, whatever happens */
    if (rc == KVD_OK)
        rc = lk_queue_reserve(&l->done_loads, 1);
    /* nothing changes until everything is known to succeed */
    for (size_t i = 0; rc == KVD_OK && i < n; i++) {
        lxfer_t *x = &ld->x[i];
        if (l->pools[x->pool].desc.addressing == KVD_ADDR_SLOT) {
            /* kept whole, or dropped without freeing when the tree already
             * had the state (it freed our slot itself) */
            x->dropped = c[i].mamba_exist;
            if (x->dropped)
                x->begin = x->end = 0;
        } else {
            x->begin = c[i].adopted_begin;
            x->end = c[i].adopted_end;
        }
    }
    if (rc == KVD_OK)
        ld->state = LOAD_COMMITTED;
    pthread_mutex_unlock(&l->lock);
    /* pages the tree did not adopt: their slots go back (outside the lock) */
    for (size_t i = 0; i < k; i++) {
        if (rc == KVD_OK)
            free_indices(f[i].pool, f[i].idx, f[i].n);
        free(f[i].idx);
    }
    free(f);
    return rc;
}

KVD_API int kvd_load_abort(kvd_linker_t *l, uint64_t rid)
{
    if (l == NULL)
        return KVD_ERR_INVALID;
    pthread_mutex_lock(&l->lock);
    lload_t **pp = find_load(l, rid);
    lload_t *ld = *pp;
    int rc = ld == NULL                    ? KVD_ERR_NOT_FOUND
             : ld->state == LOAD_PINNING   ? KVD_ERR_STATE /* its LOAD is running */
             : ld->state == LOAD_COMMITTED ? KVD_ERR_STATE /* it reached the insert */
                                           : KVD_OK;
    if (rc == KVD_OK)
        *pp = ld->next;
    pthread_mutex_unlock(&l->lock);
    if (rc != KVD_OK)
        return rc;
    lk_release(l, ld->x, ld->n);
    /* outside the lock: the engine's callback may call into the linker */
    for (size_t i = 0; i < ld->n; i++)
        free_indices(&l->pools[ld->x[i].pool], ld->x[i].idx, ld->x[i].n_idx);
    lk_xfer_free(ld->x, ld->n);
    free(ld);
    return KVD_OK;
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

KVD_API int kvd_start_layer_wise_loading(kvd_linker_t *l, uint32_t *counter)
{
    if (l == NULL || counter == NULL)
        return KVD_ERR_INVALID;
    lbatch_t *b = calloc(1, sizeof(*b));
    if (b == NULL)
        return KVD_ERR_NOMEM;
    pthread_mutex_lock(&l->lock);
    /* take every committed load; the union of their layers, sorted */
    size_t cap = 0;
    for (lload_t *ld = l->loads; ld; ld = ld->next)
        if (ld->state == LOAD_COMMITTED)
            for (size_t i = 0; i < ld->n; i++)
                cap += l->pools[ld->x[i].pool].desc.n_layers;
    b->layer_ids = malloc((cap ? cap : 1) * sizeof(uint32_t));
    if (b->layer_ids == NULL) {
        pthread_mutex_unlock(&l->lock);
        free(b);
        return KVD_ERR_NOMEM;
    }
    for (lload_t **pp = &l->loads; *pp;) {
        lload_t *ld = *pp;
        if (ld->state != LOAD_COMMITTED) {
            pp = &ld->next;
            continue;
        }
        *pp = ld->next;
        ld->next = b->loads;
        b->loads = ld;
        for (size_t i = 0; i < ld->n; i++) {
            const lpool_t *p = &l->pools[ld->x[i].pool];
            for (uint32_t k = 0; k < p->desc.n_layers; k++)
                b->layer_ids[b->n_layers++] = p->layers[k].layer_id;
        }
    }
    qsort(b->layer_ids, b->n_layers, sizeof(uint32_t), cmp_u32);
    uint32_t u = 0;
    for (uint32_t i = 0; i < b->n_layers; i++)
        if (u == 0 || b->layer_ids[u - 1] != b->layer_ids[i])
            b->layer_ids[u++] = b->layer_ids[i];
    b->n_layers = u;
    b->counter = l->next_counter++;
    if (b->loads == NULL)
        b->finished = true; /* nothing to copy: every wait returns at once */
    lbatch_t **tail = &l->batches;
    while (*tail)
        tail = &(*tail)->next;
    *tail = b;
    *counter = b->counter;
    atomic_fetch_add(&l->kick, 1); /* a load thread awake sees it at once */
    pthread_cond_broadcast(&l->cond);
    pthread_mutex_unlock(&l->lock);
    return KVD_OK;
}

/* The deadline of a wait: now + the linker's timeout, as a timespec. */
static struct timespec deadline_of(const kvd_linker_t *l)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += l->timeout_ms / 1000;
    ts.tv_nsec += (long)(l->timeout_ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    return ts;
}

KVD_API int kvd_wait_layer(kvd_linker_t *l, uint32_t counter, uint32_t layer_id)
{
    if (l == NULL)
        return KVD_ERR_INVALID;
    struct timespec until = deadline_of(l);
    uint64_t spin_until = kvd_now_ns() + l->spin_ns;
    pthread_mutex_lock(&l->lock);
    int rc = KVD_OK;
    for (;;) {
        lbatch_t *b = l->batches;
        while (b != NULL && b->counter != counter)
            b = b->next;
        if (b == NULL) {
            /* forgotten long ago (in place unless it may be one of the
             * failed ones forgotten), or never started */
            rc = counter == 0 || counter >= l->next_counter ? KVD_ERR_NOT_FOUND
                 : counter <= l->forgot_failed_max          ? KVD_ERR_STATE
                                                            : KVD_OK;
            break;
        }
        uint32_t pos = 0;
        while (pos < b->n_layers && b->layer_ids[pos] != layer_id)
            pos++;
        if (pos == b->n_layers || b->layers_done > pos)
            break; /* not in the batch, or in place */
        if (b->error != KVD_OK) {
            rc = b->error;
            break;
        }
        if (b->finished)
            break;
        if (kvd_now_ns() < spin_until) {
            /* poll a while: a sleeping waiter costs the copying thread a
             * wake-up per layer */
            uint64_t seen = atomic_load(&l->progress);
            pthread_mutex_unlock(&l->lock);
            while (atomic_load(&l->progress) == seen && kvd_now_ns() < spin_until)
                sched_yield();
            pthread_mutex_lock(&l->lock);
            continue;
        }
        if (pthread_cond_timedwait(&l->cond, &l->lock, &until) == ETIMEDOUT) {
            rc = KVD_ERR_TIMEOUT;
            break;
        }
    }
    pthread_mutex_unlock(&l->lock);
    return rc;
}

static int pop(kvd_linker_t *l, lqueue_t *q, kvd_completion_t *out, size_t max, size_t *n)
{
    if (l == NULL || (out == NULL && max > 0) || n == NULL)
        return KVD_ERR_INVALID;
    pthread_mutex_lock(&l->lock);
    size_t k = KVD_MIN(max, q->n);
    if (k > 0) {
        memcpy(out, q->items, k * sizeof(*out));
        memmove(q->items, q->items + k, (q->n - k) * sizeof(*out));
        q->n -= k;
    }
    pthread_mutex_unlock(&l->lock);
    *n = k;
    return KVD_OK;
}

KVD_API int kvd_pop_completed_loads(kvd_linker_t *l, kvd_completion_t *out, size_t max,
                                    size_t *n)
{
    return pop(l, &l->done_loads, out, max, n);
}

KVD_API int kvd_pop_completed_offloads(kvd_linker_t *l, kvd_completion_t *out, size_t max,
                                       size_t *n)
{
    return pop(l, &l->done_offloads, out, max, n);
}

KVD_API int kvd_offload(kvd_linker_t *l, const kvd_transfer_t *t, size_t n, uint64_t *ack)
{
    if (l == NULL || t == NULL || n == 0 || ack == NULL)
        return KVD_ERR_INVALID;
    ljob_t *j = calloc(1, sizeof(*j));
    if (j == NULL)
        return KVD_ERR_NOMEM;
    int rc = copy_transfers(l, t, n, &j->x);
    if (rc != KVD_OK) {
        free(j);
        return rc;
    }
    j->n = n;
    pthread_mutex_lock(&l->lock);
    rc = lk_queue_reserve(&l->done_offloads, 1); /* its completion has room */
    if (rc != KVD_OK) {
        pthread_mutex_unlock(&l->lock);
        lk_xfer_free(j->x, n);
        free(j);
        return rc;
    }
    j->ack = l->next_ack++;
    if (l->jobs_tail)
        l->jobs_tail->next = j;
    else
        l->jobs = j;
    l->jobs_tail = j;
    *ack = j->ack;
    pthread_cond_signal(&l->jobs_cond);
    pthread_mutex_unlock(&l->lock);
    return KVD_OK;
}
