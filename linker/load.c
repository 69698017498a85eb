/*
 * load.c - the load protocol (DESIGN.md section 6): LOAD pins and records,
 * PREPARE, COMMIT cuts the transfers to what the tree adopted, ABORT undoes
 * a load that never reached the insert; layer-wise batches, and the load
 * thread that copies them layer group by layer group through its data
 * path (datapath.c), marks each group in place so that the forward pass
 * can start on it, then ends the batch's leases and publishes (rid,
 * success) on the completed-loads queue.
 *
 * Threading: engine threads call the kvd_load* functions; the load thread
 * owns a batch from its start to its end. Lists and states are under
 * `lock`; RPCs go through conn.c with no lock held.
 */
#include "linker_int.h"

#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Releases the read leases of each transfer, all in one round trip (best
 * effort: a lost connection or an expired lease has released it already).
 * Returns false when a lease was gone: its pins may have lapsed while the
 * bytes were read. A lease goes only to the connection that granted it
 * (after a restart its id can name one of our new leases); releasing never
 * reconnects. */
static bool release(kvd_linker_t *l, lxfer_t *x, size_t n, uint64_t deadline)
{
    size_t k = 0;
    uint64_t epoch = 0; /* a load's leases come from one Acquire round trip */
    bool all = true;
    for (size_t i = 0; i < n; i++) {
        if (lk_xfer_pinned(&x[i]) && epoch == 0)
            epoch = x[i].epoch;
        for (uint32_t c = 0; c < x[i].n_leases; c++) {
            if (x[i].leases[c] != 0 && x[i].epoch != epoch) {
                x[i].leases[c] = 0; /* of another connection: gone with it */
                all = false;
            }
            k += x[i].leases[c] != 0;
        }
    }
    if (k == 0)
        return all;
    kvd_msg_t *req = calloc(2 * k, sizeof(*req)), *rep = req + k;
    int rc = req ? KVD_OK : KVD_ERR_NOMEM;
    k = 0;
    for (size_t i = 0; rc == KVD_OK && i < n; i++)
        for (uint32_t c = 0; c < x[i].n_leases; c++) {
            if (x[i].leases[c] == 0)
                continue;
            kvd_msg_request(&req[k], 0, KVD_METHOD_RELEASE);
            req[k++].body.release_req.lease_id = x[i].leases[c];
        }
    if (rc == KVD_OK)
        rc = lk_call_many(l, req, rep, k, epoch, NULL, deadline);
    for (size_t j = 0; j < k; j++) {
        if (rc == KVD_OK && rep[j].status != KVD_OK)
            rc = rep[j].status;
        kvd_msg_clear(&rep[j]);
    }
    /* out of memory too: the leases end with their TTL, the load fails */
    for (size_t i = 0; i < n; i++)
        for (uint32_t c = 0; c < x[i].n_leases; c++)
            x[i].leases[c] = 0;
    free(req);
    return all && rc == KVD_OK;
}

/* Acquire j is of transfer xi[j] (lk_call_ns), all asked by deadline. */
typedef struct acquire_ctx {
    const lxfer_t *x;
    const uint32_t *xi;
    uint64_t deadline;
} acquire_ctx_t;

/* Kept out of a held Acquire's wait for the round trip and a daemon that
 * answers late (its loop finishing a busy turn first): below twice this
 * left, the daemon is asked to answer at once. */
#define ACQUIRE_WAIT_RESERVE_MS 50u

/* The namespace of each transfer's pool into its Acquires (lk_call_ns),
 * and how long the daemon may hold one whose objects it is bringing into
 * its pool: half of what is left past the reserve, so that it answers, in
 * progress at worst, well before the call gives up (a call that times out
 * takes the session for hung). A daemon that does not know wait_ms
 * answers at once and ask_again's pauses pace the asking, as before. */
static void fill_acquire_ns(kvd_linker_t *l, void *ctx, kvd_msg_t *reqs, size_t n)
{
    const acquire_ctx_t *c = ctx;
    uint64_t now = kvd_now_ns();
    uint64_t left_ms = c->deadline > now ? (c->deadline - now) / 1000000 : 0;
    uint64_t spare =
        left_ms > 2 * ACQUIRE_WAIT_RESERVE_MS ? left_ms - ACQUIRE_WAIT_RESERVE_MS : 0;
    uint32_t wait_ms = (uint32_t)KVD_MIN(spare / 2, (uint64_t)KVD_ACQUIRE_WAIT_MAX_MS);
    for (size_t j = 0; j < n; j++) {
        reqs[j].body.acquire_req.ns = l->pools[c->x[c->xi[j]].pool].ns_id;
        reqs[j].body.acquire_req.wait_ms = wait_ms;
    }
}

/* Ends a reply of ask_again that will not be asked again: its status is
 * rc from here. */
static void reply_failed(kvd_msg_t *rep, int rc)
{
    kvd_msg_clear(rep);
    rep->reply = true;
    rep->status = rc;
}

/* Releases, on the connection of `epoch`, the leases that the replies
 * sub[0..k) granted: they came from a connection the load cannot use. */
static void release_granted(kvd_linker_t *l, kvd_msg_t *sub, size_t k, uint64_t epoch,
                            uint64_t deadline)
{
    kvd_msg_t *rel = calloc(2 * (k ? k : 1), sizeof(*rel));
    size_t n = 0;
    for (size_t q = 0; rel != NULL && q < k; q++) {
        if (sub[q].status != KVD_OK || sub[q].body.acquire_rep.lease_id == 0)
            continue;
        kvd_msg_request(&rel[n], 0, KVD_METHOD_RELEASE);
        rel[n++].body.release_req.lease_id = sub[q].body.acquire_rep.lease_id;
    }
    if (n > 0 && lk_call_many(l, rel, rel + n, n, epoch, NULL, deadline) == KVD_OK)
        for (size_t q = 0; q < n; q++)
            kvd_msg_clear(&rel[n + q]);
    free(rel); /* out of memory: the leases end with their TTL */
}

/*
 * Acquires answered KVD_INPROGRESS (objects being promoted from the
 * daemon's SSD tier) are asked again, with a growing pause, until each has
 * another answer. Whatever ends the asking leaves every other reply as it
 * is (the leases they granted are recorded by the caller, for release())
 * and gives those still in progress a failure: KVD_ERR_TIMEOUT at the
 * deadline, KVD_ERR_NOMEM, the call's error, or KVD_ERR_CLOSED when a round
 * reached another connection than the first (what that one granted is
 * released on it at once: the load cannot use a pool of two connections).
 */
static void ask_again(kvd_linker_t *l, lxfer_t *x, kvd_msg_t *req, kvd_msg_t *rep,
                      const uint32_t *xi, size_t n_req, uint64_t epoch, uint64_t deadline)
{
    uint64_t pause_ns = 100000; /* 0.1 ms, doubling to 5 ms */
    kvd_msg_t *sub = NULL;
    uint32_t *sub_at = NULL, *sub_xi = NULL;
    int rc = KVD_OK;
    for (;;) {
        size_t m = 0;
        for (size_t j = 0; j < n_req; j++)
            m += rep[j].status == KVD_INPROGRESS;
        if (m == 0)
            break;
        if (kvd_now_ns() + pause_ns >= deadline) {
            rc = KVD_ERR_TIMEOUT;
            break;
        }
        if (sub == NULL) {
            sub = calloc(2 * m, sizeof(*sub));
            sub_at = calloc(m, sizeof(*sub_at));
            sub_xi = calloc(m, sizeof(*sub_xi));
            if (sub == NULL || sub_at == NULL || sub_xi == NULL) {
                rc = KVD_ERR_NOMEM;
                break;
            }
        }
        struct timespec ts = {0, (long)pause_ns};
        nanosleep(&ts, NULL);
        pause_ns = KVD_MIN(2 * pause_ns, 5000000ull);
        size_t k = 0;
        for (size_t j = 0; j < n_req; j++) {
            if (rep[j].status != KVD_INPROGRESS)
                continue;
            kvd_msg_clear(&rep[j]);
            sub[k] = req[j];
            sub_at[k] = (uint32_t)j;
            sub_xi[k++] = xi[j];
        }
        acquire_ctx_t ctx = {.x = x, .xi = sub_xi, .deadline = deadline};
        uint64_t again = 0;
        rc = lk_call_ns(l, fill_acquire_ns, &ctx, sub, sub + m, k, &again, deadline);
        if (rc == KVD_OK && again != epoch) {
            release_granted(l, sub + m, k, again, deadline);
            rc = KVD_ERR_CLOSED;
        }
        for (size_t q = 0; q < k; q++) {
            if (rc == KVD_OK) {
                rep[sub_at[q]] = sub[m + q]; /* moved: the reply's memory with it */
            } else {
                reply_failed(&rep[sub_at[q]], rc);
                kvd_msg_clear(&sub[m + q]);
            }
            memset(&sub[m + q], 0, sizeof(sub[m + q]));
        }
        if (rc != KVD_OK)
            break;
    }
    for (size_t j = 0; rc != KVD_OK && j < n_req; j++)
        if (rep[j].status == KVD_INPROGRESS)
            reply_failed(&rep[j], rc);
    free(sub);
    free(sub_at);
    free(sub_xi);
}

/* Pins every transfer's keys, all in one round trip: one Acquire per
 * transfer, or per piece of one when its keys are more than a request
 * may carry (lk_batch_limit); records each lease and the objects'
 * offsets. All or nothing is the caller's: on failure the leases that
 * were granted are recorded, for release(). */
static int pin_all(kvd_linker_t *l, lxfer_t *x, size_t n, uint64_t deadline)
{
    size_t limit = lk_batch_limit(l, KVD_KEY_BYTES), n_req = 0;
    for (size_t i = 0; i < n; i++) {
        free(x[i].leases);
        x[i].n_leases = (uint32_t)((x[i].n_keys + limit - 1) / limit);
        x[i].leases = calloc(x[i].n_leases, sizeof(uint64_t));
        if (x[i].leases == NULL) {
            x[i].n_leases = 0;
            return KVD_ERR_NOMEM;
        }
        n_req += x[i].n_leases;
    }
    kvd_msg_t *req = calloc(2 * n_req, sizeof(*req)), *rep = req + n_req;
    uint32_t *xi = calloc(n_req, sizeof(*xi));
    uint64_t *object_bytes = calloc(n, sizeof(*object_bytes));
    if (req == NULL || xi == NULL || object_bytes == NULL) {
        free(req);
        free(xi);
        free(object_bytes);
        return KVD_ERR_NOMEM;
    }
    lk_lock(&l->lock);
    for (size_t i = 0, j = 0; i < n; i++) {
        const lpool_t *p = &l->pools[x[i].pool];
        object_bytes[i] = p->object_bytes;
        for (size_t s = 0; s < x[i].n_keys; s += limit, j++) {
            xi[j] = (uint32_t)i;
            kvd_msg_request(&req[j], 0, KVD_METHOD_ACQUIRE);
            req[j].body.acquire_req =
                (kvd_acquire_req_t){.object_bytes = p->object_bytes,
                                    .n = KVD_MIN(limit, x[i].n_keys - s),
                                    .keys = x[i].keys + s};
        }
    }
    lk_unlock(&l->lock);
    uint64_t epoch = 0, asked = kvd_now_ns();
    acquire_ctx_t ctx = {.x = x, .xi = xi, .deadline = deadline};
    int call = lk_call_ns(l, fill_acquire_ns, &ctx, req, rep, n_req, &epoch, deadline),
        rc = call;
    if (call == KVD_OK)
        ask_again(l, x, req, rep, xi, n_req, epoch, deadline); /* replies: per piece */
    /* offsets are into the pool of the connection that gave them */
    uint64_t pool_bytes = call == KVD_OK ? lk_conn_pool_bytes(l, epoch) : 0;
    bool current = pool_bytes != 0;
    for (size_t i = 0, j = 0; i < n; i++) {
        x[i].epoch = epoch;
        x[i].asked_ns = asked;
        for (uint32_t c = 0; c < x[i].n_leases; c++, j++) {
            size_t s = (size_t)c * limit, len = req[j].body.acquire_req.n;
            int one = call != KVD_OK                     ? call
                      : rep[j].status != KVD_OK          ? rep[j].status
                      : rep[j].body.acquire_rep.n != len ? KVD_ERR_PROTOCOL
                                                         : KVD_OK;
            if (one == KVD_OK) {
                x[i].leases[c] = rep[j].body.acquire_rep.lease_id;
                if (!current)
                    one = KVD_ERR_CLOSED;
            }
            for (size_t k = 0; k < len && one == KVD_OK; k++) {
                uint64_t off = rep[j].body.acquire_rep.offsets[k];
                /* the daemon's offsets are checked against the pool here too */
                if (off > pool_bytes || object_bytes[i] > pool_bytes - off)
                    one = KVD_ERR_PROTOCOL;
                x[i].offsets[s + k] = off;
            }
            if (rc == KVD_OK && one != KVD_OK)
                rc = one; /* the first failure; later leases are still recorded */
            kvd_msg_clear(&rep[j]);
        }
    }
    free(req);
    free(xi);
    free(object_bytes);
    return rc;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

/* What a load writes must be written once: each pool in one transfer,
 * and each page (or slot) of a transfer on device rows of its own. Two
 * writers of one row would land in any order, and an ABORT would hand
 * the engine's allocator the same indices twice. KVD_ERR_INVALID, named
 * in the log, otherwise. */
static int check_load_rows(kvd_linker_t *l, uint64_t rid, const lxfer_t *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < i; j++)
            if (x[i].pool == x[j].pool) {
                KVD_WARN("linker", "load %llu: transfers %zu and %zu name one pool (%u)",
                         (unsigned long long)rid, j, i, x[i].pool);
                return KVD_ERR_INVALID;
            }
    int rc = KVD_OK;
    for (size_t i = 0; rc == KVD_OK && i < n; i++) {
        lk_lock(&l->lock);
        const lpool_t *p = &l->pools[x[i].pool];
        uint32_t ps = p->desc.addressing == KVD_ADDR_PAGED ? p->desc.page_size : 1;
        lk_unlock(&l->lock);
        /* a page's rows start at a multiple of page_size (lk_xfers_copy):
         * two pages share rows exactly when they start at one row */
        int64_t *first = malloc(x[i].n_keys * sizeof(*first));
        if (first == NULL)
            return KVD_ERR_NOMEM;
        for (size_t k = 0; k < x[i].n_keys; k++)
            first[k] = x[i].idx[k * ps];
        qsort(first, x[i].n_keys, sizeof(*first), cmp_i64);
        for (size_t k = 1; rc == KVD_OK && k < x[i].n_keys; k++)
            if (first[k] == first[k - 1]) {
                KVD_WARN(
                    "linker",
                    "load %llu: transfer %zu puts two pages on device rows from %lld",
                    (unsigned long long)rid, i, (long long)first[k]);
                rc = KVD_ERR_INVALID;
            }
        free(first);
    }
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
    lk_clear_last_error();
    if (l == NULL || t == NULL || n == 0)
        return KVD_ERR_INVALID;
    uint64_t deadline = lk_deadline(l); /* pins, and their release on failure */
    lload_t *ld = calloc(1, sizeof(*ld));
    if (ld == NULL)
        return KVD_ERR_NOMEM;
    int rc = lk_xfers_copy(l, t, n, &ld->x);
    if (rc == KVD_OK)
        rc = check_load_rows(l, rid, ld->x, n);
    ld->n = n;
    ld->rid = rid;
    /* recorded before pinning: a second LOAD of the rid meanwhile is refused */
    lk_lock(&l->lock);
    if (rc == KVD_OK && *find_load(l, rid) != NULL)
        rc = KVD_ERR_EXISTS; /* one load per request at a time */
    if (rc == KVD_OK) {
        ld->state = LOAD_PINNING;
        ld->next = l->loads;
        l->loads = ld;
        /* offloads let it go first from here (datapath.c) */
        atomic_store(&l->load_coming_until_ns, kvd_now_ns() + LK_DP_YIELD_NS);
        /* wake the load thread now, while the pins are asked for: it
         * waits awake for the start (lk_load_thread_main) */
        if (l->spin_ns > 0) {
            l->spin_until_ns = kvd_now_ns() + l->spin_ns;
            pthread_cond_broadcast(&l->cond);
        }
    }
    lk_unlock(&l->lock);
    if (rc != KVD_OK) { /* bad arguments: nothing recorded, nothing to abort */
        lk_xfer_free(ld->x, n);
        free(ld);
        return rc;
    }
    rc = pin_all(l, ld->x, n, deadline);
    if (rc != KVD_OK) {
        /* all or nothing: no pins stay; the record does, so that the
         * engine's ABORT can hand every device index back */
        release(l, ld->x, n, deadline);
        for (size_t i = 0; i < n; i++)
            atomic_fetch_add(&l->pools[ld->x[i].pool].load_failures, 1);
    }
    lk_lock(&l->lock);
    ld->state = rc == KVD_OK ? LOAD_PINNED : LOAD_FAILED;
    lk_unlock(&l->lock);
    return rc;
}

KVD_API int kvd_load_prepare(kvd_linker_t *l, uint64_t rid)
{
    lk_clear_last_error();
    if (l == NULL)
        return KVD_ERR_INVALID;
    lk_lock(&l->lock);
    lload_t *ld = *find_load(l, rid);
    int rc = ld == NULL                 ? KVD_ERR_NOT_FOUND
             : ld->state != LOAD_PINNED ? KVD_ERR_STATE
                                        : KVD_OK;
    if (rc == KVD_OK)
        ld->state = LOAD_PREPARED; /* host memory needs no fix-up */
    lk_unlock(&l->lock);
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
    lk_clear_last_error();
    if (l == NULL || (c == NULL && n > 0))
        return KVD_ERR_INVALID;
    to_free_t *f = calloc(2 * n + 1, sizeof(*f));
    if (f == NULL)
        return KVD_ERR_NOMEM;
    size_t k = 0;
    lk_lock(&l->lock);
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
    lk_unlock(&l->lock);
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
    lk_clear_last_error();
    if (l == NULL)
        return KVD_ERR_INVALID;
    lk_lock(&l->lock);
    lload_t **pp = find_load(l, rid);
    lload_t *ld = *pp;
    int rc = ld == NULL                    ? KVD_ERR_NOT_FOUND
             : ld->state == LOAD_PINNING   ? KVD_ERR_STATE /* its LOAD is running */
             : ld->state == LOAD_COMMITTED ? KVD_ERR_STATE /* it reached the insert */
                                           : KVD_OK;
    if (rc == KVD_OK)
        *pp = ld->next;
    lk_unlock(&l->lock);
    if (rc != KVD_OK)
        return rc;
    release(l, ld->x, ld->n, lk_deadline(l));
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
    lk_clear_last_error();
    if (l == NULL || counter == NULL)
        return KVD_ERR_INVALID;
    lbatch_t *b = calloc(1, sizeof(*b));
    if (b == NULL)
        return KVD_ERR_NOMEM;
    lk_lock(&l->lock);
    /* take every committed load; the union of their layers, sorted */
    size_t cap = 0;
    for (lload_t *ld = l->loads; ld; ld = ld->next)
        if (ld->state == LOAD_COMMITTED)
            for (size_t i = 0; i < ld->n; i++)
                cap += l->pools[ld->x[i].pool].desc.n_layers;
    b->layer_ids = malloc((cap ? cap : 1) * sizeof(uint32_t));
    if (b->layer_ids == NULL) {
        lk_unlock(&l->lock);
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
    else /* offloads let it go first from its start, not only once the load
          * thread has it (datapath.c): a load thread asleep takes a while
          * to wake on a busy CPU, and meanwhile an offload that did not
          * yield copied on at full speed */
        atomic_fetch_add(&l->loads_copying, 1);
    lbatch_t **tail = &l->batches;
    while (*tail)
        tail = &(*tail)->next;
    *tail = b;
    *counter = b->counter;
    atomic_fetch_add(&l->kick, 1); /* a load thread awake sees it at once */
    pthread_cond_broadcast(&l->cond);
    lk_unlock(&l->lock);
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

/*
 * What a wait for layer_id of batch `counter` can say now (caller holds
 * lock): true with *rc when it is answered (the batch forgotten long ago:
 * in place unless it may be one of the failed ones forgotten; never
 * started; the layer not in the batch or in place; the batch failed or
 * finished); false when the caller must wait, with the batch and the
 * layer's place in it.
 */
static bool layer_answered(kvd_linker_t *l, uint32_t counter, uint32_t layer_id,
                           lbatch_t **bp, uint32_t *pos, int *rc)
{
    lbatch_t *b = l->batches;
    while (b != NULL && b->counter != counter)
        b = b->next;
    *rc = KVD_OK;
    if (b == NULL) {
        *rc = counter == 0 || counter >= l->next_counter ? KVD_ERR_NOT_FOUND
              : counter <= l->forgot_failed_max          ? KVD_ERR_STATE
                                                         : KVD_OK;
        return true;
    }
    uint32_t k = 0;
    while (k < b->n_layers && b->layer_ids[k] != layer_id)
        k++;
    if (k == b->n_layers || b->layers_done > k)
        return true;
    if (b->error != KVD_OK) {
        *rc = b->error;
        return true;
    }
    *bp = b;
    *pos = k;
    return b->finished;
}

KVD_API int kvd_wait_layer(kvd_linker_t *l, uint32_t counter, uint32_t layer_id)
{
    lk_clear_last_error();
    if (l == NULL)
        return KVD_ERR_INVALID;
    struct timespec until = deadline_of(l);
    uint64_t spin_until = kvd_now_ns() + l->spin_ns;
    lk_lock(&l->lock);
    int rc = KVD_OK;
    for (;;) {
        lbatch_t *b;
        uint32_t pos;
        if (layer_answered(l, counter, layer_id, &b, &pos, &rc))
            break;
        if (kvd_now_ns() < spin_until) {
            /* poll a while: a sleeping waiter costs the copying thread a
             * wake-up per layer */
            uint64_t seen = atomic_load(&l->progress);
            lk_unlock(&l->lock);
            while (atomic_load(&l->progress) == seen && kvd_now_ns() < spin_until)
                sched_yield();
            lk_lock(&l->lock);
            continue;
        }
        if (!lk_cond_timedwait(&l->cond, &l->lock, &until)) {
            rc = KVD_ERR_TIMEOUT;
            break;
        }
    }
    lk_unlock(&l->lock);
    return rc;
}

KVD_API int kvd_stream_wait_layer(kvd_linker_t *l, uint32_t counter, uint32_t layer_id,
                                  void *stream)
{
    lk_clear_last_error();
    if (l == NULL)
        return KVD_ERR_INVALID;
    struct timespec until = deadline_of(l);
    uint32_t group = (uint32_t)l->cfg.layer_group_size;
    lk_lock(&l->lock);
    int rc = KVD_OK;
    for (;;) {
        lbatch_t *b;
        uint32_t pos;
        if (layer_answered(l, counter, layer_id, &b, &pos, &rc))
            break; /* nothing to wait for, or failed */
        if (b->groups != NULL && b->layers_issued > pos) {
            /* issued: the device waits for the group's marks. Under the
             * lock, which keeps the marks alive; queuing a wait does not
             * block. */
            const lgroup_marks_t *m = &b->groups[pos / group];
            for (size_t i = 0; rc == KVD_OK && i < m->n; i++)
                rc = kvd_memkind_mark_stream_wait(m->kinds[i], m->marks[i], stream);
            break;
        }
        if (!lk_cond_timedwait(&l->cond, &l->lock, &until)) {
            rc = KVD_ERR_TIMEOUT;
            break;
        }
    }
    lk_unlock(&l->lock);
    return rc;
}

#define KEEP_FINISHED_BATCHES 64

/* Issues layers [pos, end) of the batch, every load of it that has them,
 * in the load data path's current step (lk_dp_begin in run_batch). A
 * load whose pins belong to an earlier connection (the daemon went away,
 * and the pool with it) is marked failed and not copied: its offsets mean
 * nothing in the current pool. */
static int issue_group(kvd_linker_t *l, lbatch_t *b, uint64_t epoch, uint32_t pos,
                       uint32_t end)
{
    ldp_t *dp = &l->dp[LK_DP_LOAD];
    int rc = epoch != 0 ? KVD_OK : KVD_ERR_CLOSED;
    for (lload_t *ld = b->loads; rc == KVD_OK && ld; ld = ld->next)
        for (size_t i = 0; i < ld->n; i++)
            ld->failed |= lk_xfer_pinned(&ld->x[i]) && ld->x[i].epoch != epoch;
    for (uint32_t k = pos; rc == KVD_OK && k < end; k++) {
        uint32_t layer_id = b->layer_ids[k];
        for (lload_t *ld = b->loads; rc == KVD_OK && ld; ld = ld->next) {
            for (size_t i = 0; rc == KVD_OK && !ld->failed && i < ld->n; i++) {
                lxfer_t *x = &ld->x[i];
                lpool_t *p = &l->pools[x->pool];
                for (uint32_t li = 0;
                     rc == KVD_OK && !x->dropped && li < p->desc.n_layers; li++) {
                    if (p->layers[li].layer_id != layer_id)
                        continue;
                    uint64_t moved = 0;
                    for (uint32_t key = x->begin; rc == KVD_OK && key < x->end; key++)
                        rc = lk_copy_key(l, dp, p, x, key, li, li + 1, &moved);
                    atomic_fetch_add(&p->load_bytes, moved);
                }
            }
        }
    }
    if (rc == KVD_OK)
        rc = lk_dp_post(l, dp);
    return rc;
}

/* Frees the marks of b's layer groups (caller holds lock): once every
 * layer is in place no stream needs to wait for them. */
static void batch_marks_free(lbatch_t *b)
{
    for (uint32_t g = 0; b->groups != NULL && g < b->n_groups; g++)
        lk_dp_marks_free(&b->groups[g]);
    free(b->groups);
    b->groups = NULL;
}

/* Frees a batch forgotten or never run (caller holds lock). */
static void batch_free(lbatch_t *b)
{
    batch_marks_free(b);
    free(b->layer_ids);
    free(b);
}

/* Ends a finished batch: leases, completions, counters. */
static void finish_batch(kvd_linker_t *l, lbatch_t *b, int err)
{
    for (lload_t *ld = b->loads; ld; ld = ld->next) {
        bool ok = !ld->failed && err == KVD_OK;
        /* A lease that lapsed while we copied: the bytes may be another
         * object's by now, so the load failed. When the leases provably
         * still stand, the load is done now and the Release (a round trip
         * to a daemon idle through the copy) follows; otherwise its reply
         * decides. */
        bool early = ok && lk_leases_standing(l, ld->x, ld->n);
        if (!early)
            ok = release(l, ld->x, ld->n, lk_deadline(l)) && ok;
        lk_lock(&l->lock);
        if (!ok)
            for (size_t i = 0; i < ld->n; i++)
                atomic_fetch_add(&l->pools[ld->x[i].pool].load_failures, 1);
        lk_queue_push(&l->done_loads, ld->rid, ok);
        if (early)
            pthread_cond_broadcast(&l->cond);
        lk_unlock(&l->lock);
        if (early)
            release(l, ld->x, ld->n,
                    lk_deadline(l)); /* what it says changes nothing now */
    }
    lk_lock(&l->lock);
    for (lload_t *ld = b->loads, *next; ld; ld = next) {
        next = ld->next;
        lk_xfer_free(ld->x, ld->n);
        free(ld);
    }
    b->loads = NULL;
    if (err != KVD_OK && b->error == KVD_OK)
        b->error = err;
    b->finished = true;
    batch_marks_free(b);
    atomic_fetch_add(&l->progress, 1);
    /* keep the last few finished batches for late waiters */
    size_t n = 0;
    for (lbatch_t *x = l->batches; x; x = x->next)
        n += x->finished;
    while (n > KEEP_FINISHED_BATCHES && l->batches && l->batches->finished) {
        lbatch_t *old = l->batches;
        l->batches = old->next;
        if (old->error != KVD_OK && old->counter > l->forgot_failed_max)
            l->forgot_failed_max = old->counter;
        batch_free(old);
        n--;
    }
    pthread_cond_broadcast(&l->cond);
    lk_unlock(&l->lock);
}

/* Says layers up to `end` are in place (or the batch failed). */
static void group_done(kvd_linker_t *l, lbatch_t *b, uint32_t end, int err)
{
    lk_lock(&l->lock);
    if (err == KVD_OK)
        b->layers_done = end;
    else if (b->error == KVD_OK)
        b->error = err; /* the remaining layers fail now, nobody waits */
    atomic_fetch_add(&l->progress, 1);
    pthread_cond_broadcast(&l->cond);
    lk_unlock(&l->lock);
}

/*
 * Copies a started batch (counted in loads_copying since its start), one
 * data-path step, layer group by layer group. A group's copies are issued,
 * then marked (where the data path has device kinds: an event after them
 * on each device stream, which kvd_stream_wait_layer hands to engine
 * streams); it is in place once its batches are reported. Host copies are
 * done when issued, so each group is reported before the next is issued
 * (the first layer's waiter sees it at once); device copies run after
 * they are issued, so the next group is issued before the last one is
 * waited for, and the copy engine never idles between groups.
 */
static void run_batch(kvd_linker_t *l, lbatch_t *b)
{
    ldp_t *dp = &l->dp[LK_DP_LOAD];
    uint32_t group = (uint32_t)l->cfg.layer_group_size;
    uint32_t n_groups = (b->n_layers + group - 1) / group;
    /* device pools in the batch: their copies end after they are issued */
    bool device = false;
    for (lload_t *ld = b->loads; ld != NULL && !device; ld = ld->next)
        for (size_t i = 0; i < ld->n && !device; i++)
            device = l->pools[ld->x[i].pool].rt != 0;
    /* a group's marks follow its device copies only where the data path
     * issues them as it posts (shm); a staged transport (UCX) issues them
     * once the wire brought the bytes, so there a stream waits as the CPU
     * does, for the group in place */
    bool marked = device && kvd_transport_copies_at_post(dp->t);
    lgroup_marks_t *marks =
        marked ? calloc(n_groups ? n_groups : 1, sizeof(*marks)) : NULL;
    int err = marked && marks == NULL ? KVD_ERR_NOMEM : KVD_OK;
    if (marks != NULL) {
        lk_lock(&l->lock);
        b->groups = marks; /* freed when it finishes; read under lock */
        b->n_groups = n_groups;
        lk_unlock(&l->lock);
    }
    uint64_t epoch = err == KVD_OK ? lk_dp_begin(l, dp) : 0;
    uint64_t prev_cookie = 0;
    uint32_t prev_end = 0;
    for (uint32_t g = 0, pos = 0; err == KVD_OK && pos < b->n_layers; g++, pos += group) {
        uint32_t end = KVD_MIN(pos + group, b->n_layers);
        err = issue_group(l, b, epoch, pos, end);
        lgroup_marks_t m = {0};
        if (err == KVD_OK && marks != NULL)
            err = lk_dp_mark(dp, &m);
        if (err == KVD_OK) {
            lk_lock(&l->lock);
            if (marks != NULL)
                marks[g] = m;
            b->layers_issued = end;
            pthread_cond_broadcast(&l->cond);
            lk_unlock(&l->lock);
        }
        uint64_t cookie = dp->next_cookie;
        if (err == KVD_OK && !device) {
            err = lk_dp_wait_upto(l, dp, cookie);
            if (err == KVD_OK)
                group_done(l, b, end, err);
        } else if (err == KVD_OK && prev_end > 0) {
            err = lk_dp_wait_upto(l, dp, prev_cookie);
            if (err == KVD_OK)
                group_done(l, b, prev_end, err);
        }
        prev_cookie = cookie;
        prev_end = end;
    }
    if (err == KVD_OK)
        err = lk_dp_flush(l, dp); /* the last group */
    lk_dp_end(l, dp);
    /* a failure is said only now, once nothing of the batch still runs: a
     * waiter told of it may reuse the rows at once */
    group_done(l, b, b->n_layers, err);
    atomic_fetch_sub(&l->loads_copying, 1); /* the bytes are in: offloads go on */
    finish_batch(l, b, err);
}

void *lk_load_thread_main(void *arg)
{
    kvd_linker_t *l = arg;
    lk_lock(&l->lock);
    for (;;) {
        if (l->stop)
            break; /* closing: what is left fails in lk_loads_fail_pending */
        lbatch_t *b = l->batches;
        while (b != NULL && (b->finished || b->layers_done > 0 || b->error != KVD_OK))
            b = b->next;
        if (b != NULL && b->loads != NULL) {
            lk_unlock(&l->lock);
            run_batch(l, b);
            lk_lock(&l->lock);
            continue;
        }
        if (kvd_now_ns() < l->spin_until_ns) {
            /* a load is on its way (kvd_load): poll for its start rather
             * than sleep, yielding the CPU to whoever needs it */
            uint32_t seen = atomic_load(&l->kick);
            uint64_t until = l->spin_until_ns;
            lk_unlock(&l->lock);
            while (atomic_load(&l->kick) == seen && kvd_now_ns() < until)
                sched_yield();
            lk_lock(&l->lock);
            if (atomic_load(&l->kick) == seen)
                l->spin_until_ns = 0; /* it did not come: sleep next time */
            continue;
        }
        lk_cond_wait(&l->cond, &l->lock);
    }
    lk_unlock(&l->lock);
    return NULL;
}

void lk_loads_fail_pending(kvd_linker_t *l)
{
    /* batches the thread never ran: failed, each load comes back once */
    for (lbatch_t *b = l->batches; b; b = b->next)
        if (!b->finished) {
            atomic_fetch_sub(&l->loads_copying, 1); /* counted at its start */
            finish_batch(l, b, KVD_ERR_CLOSED);
        }
    /* loads never committed: their pins end, no completion (not queued) */
    for (lload_t *ld = l->loads, *next; ld; ld = next) {
        next = ld->next;
        release(l, ld->x, ld->n, lk_deadline(l));
        lk_xfer_free(ld->x, ld->n);
        free(ld);
    }
    l->loads = NULL;
}
