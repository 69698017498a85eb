/*
 * offload.c - offloads (DESIGN.md section 6): kvd_offload queues a job of
 * finished nodes' transfers; the offload thread runs each job through its
 * own data path (datapath.c): reserve, copy the device rows into the
 * reserved objects (the transport first waits for the rows to be final),
 * publish, and publishes (ack, success) on the completed-offloads queue.
 *
 * Threading: engine threads queue jobs under `lock`; the offload thread
 * owns a job from its dequeue to its completion, and calls the daemon
 * with no lock held.
 */
#include "linker_int.h"

#include <stdlib.h>
#include <string.h>

/* The reservation's items: each key with its depth and parent. */
static kvd_put_item_t *put_items(const lpool_t *p, const lxfer_t *x)
{
    kvd_put_item_t *items = calloc(x->n_keys, sizeof(*items));
    if (items == NULL)
        return NULL;
    bool paged = p->desc.addressing == KVD_ADDR_PAGED;
    for (size_t i = 0; i < x->n_keys; i++) {
        memcpy(items[i].key, x->keys[i], KVD_KEY_BYTES);
        items[i].depth = x->depths ? x->depths[i] : x->first_depth + (uint32_t)i;
        /* a paged transfer is a run of a chain; slot keys (node ends) are
         * not each other's parents */
        const uint8_t *parent =
            i == 0 ? (x->has_prior ? x->prior : NULL) : (paged ? x->keys[i - 1] : NULL);
        if (parent) {
            memcpy(items[i].parent, parent, KVD_KEY_BYTES);
            items[i].has_parent = true;
        }
    }
    return items;
}

/* Copies the reserved objects of x (allocated[i]) in one data-path step,
 * object by object: an object's rows are adjacent in the pool, so they
 * leave together. The offsets must be of the pool of `epoch`. */
static int copy_reserved(kvd_linker_t *l, lpool_t *p, lxfer_t *x,
                         const uint8_t *allocated, uint64_t epoch)
{
    ldp_t *dp = &l->dp[LK_DP_OFFLOAD];
    /* a lost connection's reservations are held for this process until
     * it says (its next Hello) that no copy into them is in flight: the
     * copy says when it runs, and stops once the connection is gone */
    if (!lk_copy_begin(l, epoch))
        return KVD_ERR_CLOSED;
    int rc = lk_dp_begin(l, dp) == epoch ? KVD_OK : KVD_ERR_CLOSED;
    uint64_t pool_bytes = rc == KVD_OK ? dp->peer->desc.length : 0;
    for (uint32_t i = x->begin; rc == KVD_OK && i < x->end; i++)
        if (allocated[i] &&
            (x->offsets[i] > pool_bytes || p->object_bytes > pool_bytes - x->offsets[i]))
            rc = KVD_ERR_PROTOCOL; /* the daemon's offsets are checked here too */
    for (uint32_t i = x->begin; rc == KVD_OK && i < x->end; i++) {
        uint64_t moved = 0; /* counted as it goes: the counter shows progress */
        if (allocated[i] && !lk_copy_live(l, epoch))
            rc = KVD_ERR_CLOSED; /* its reservations are void: the rest is not copied */
        else if (allocated[i])
            rc = lk_copy_key(l, dp, p, x, i, 0, p->desc.n_layers, &moved);
        atomic_fetch_add(&p->offload_bytes, moved);
    }
    if (rc == KVD_OK)
        rc = lk_dp_flush(l, dp); /* complete at the daemon before Publish */
    lk_dp_end(l, dp);
    lk_copy_end(l); /* every batch of the step is done (or failed) by now */
    return rc;
}

/* The namespace of the transfer's pool into its Reserves (lk_call_ns). */
static void fill_reserve_ns(kvd_linker_t *l, void *ctx, kvd_msg_t *reqs, size_t n)
{
    uint32_t ns = l->pools[((const lxfer_t *)ctx)->pool].ns_id;
    for (size_t j = 0; j < n; j++)
        reqs[j].body.reserve_req.ns = ns;
}

/* Room one Reserve item takes in a frame at most: key, parent, the
 * has-parent flag and the depth (a varint). */
#define RESERVE_ITEM_BYTES (2 * KVD_KEY_BYTES + 16)

/* Ends the reservation leases[0..n) of connection `epoch`: Publish
 * (publish) or Revoke, all in one round trip. The first failure. */
static int finish_leases(kvd_linker_t *l, const uint64_t *leases, size_t n, bool publish,
                         uint64_t epoch)
{
    size_t k = 0;
    for (size_t j = 0; j < n; j++)
        k += leases[j] != 0;
    if (k == 0)
        return KVD_OK;
    kvd_msg_t *req = calloc(2 * k, sizeof(*req)), *rep = req + k;
    if (req == NULL)
        return KVD_ERR_NOMEM; /* the reservations end with their TTL */
    k = 0;
    for (size_t j = 0; j < n; j++) {
        if (leases[j] == 0)
            continue;
        kvd_msg_request(&req[k], 0, publish ? KVD_METHOD_PUBLISH : KVD_METHOD_REVOKE);
        req[k++].body.finish_req.lease_id = leases[j];
    }
    int rc = lk_call_many(l, req, rep, k, epoch, NULL, lk_deadline(l));
    for (size_t j = 0; j < k; j++) {
        if (rc == KVD_OK && rep[j].status != KVD_OK)
            rc = rep[j].status;
        kvd_msg_clear(&rep[j]);
    }
    free(req);
    return rc;
}

/* Reserves, writes and publishes one offload transfer. Its keys go in one
 * Reserve, or in pieces when they are more than a request may carry
 * (lk_batch_limit), all in one round trip; each piece is a reservation
 * lease of its own, all published (or revoked) together. */
static int run_offload_xfer(kvd_linker_t *l, lxfer_t *x)
{
    lk_lock(&l->lock);
    lpool_t *p = &l->pools[x->pool];
    lk_unlock(&l->lock);
    size_t limit = lk_batch_limit(l, RESERVE_ITEM_BYTES);
    size_t n_req = (x->n_keys + limit - 1) / limit;
    kvd_put_item_t *items = put_items(p, x);
    uint8_t *allocated = calloc(x->n_keys, 1);
    uint64_t *leases = calloc(n_req, sizeof(*leases));
    kvd_msg_t *req = calloc(2 * n_req, sizeof(*req)), *rep = req + n_req;
    if (items == NULL || allocated == NULL || leases == NULL || req == NULL) {
        free(items);
        free(allocated);
        free(leases);
        free(req);
        return KVD_ERR_NOMEM;
    }
    for (size_t j = 0; j < n_req; j++) {
        size_t s = j * limit;
        kvd_msg_request(&req[j], 0, KVD_METHOD_RESERVE);
        req[j].body.reserve_req = (kvd_reserve_req_t){.object_bytes = p->object_bytes,
                                                      .n = KVD_MIN(limit, x->n_keys - s),
                                                      .items = items + s};
    }
    uint64_t epoch = 0;
    int rc = lk_call_ns(l, fill_reserve_ns, x, req, rep, n_req, &epoch, lk_deadline(l));
    bool no_space = false, any = false;
    for (size_t j = 0; j < n_req; j++) {
        const kvd_reserve_rep_t *r = &rep[j].body.reserve_rep;
        size_t s = j * limit, len = req[j].body.reserve_req.n;
        int one = rc != KVD_OK ? rc : rep[j].status;
        if (one == KVD_OK)
            leases[j] = r->lease_id; /* ended below, whatever else fails */
        if (one == KVD_OK && r->n != len)
            one = KVD_ERR_PROTOCOL;
        for (size_t i = 0; one == KVD_OK && i < len; i++) {
            no_space |= r->results[i] == KVD_RESERVE_NO_SPACE;
            if (r->results[i] != KVD_RESERVE_ALLOCATED)
                continue; /* exists or in flight: stored by someone: success */
            x->offsets[s + i] = r->offsets[i];
            allocated[s + i] = 1;
            any = true;
        }
        if (rc == KVD_OK && one != KVD_OK)
            rc = one;
        kvd_msg_clear(&rep[j]);
    }
    if (rc == KVD_OK && any)
        rc = copy_reserved(l, p, x, allocated, epoch);
    /* copied: now the bytes may be seen; failed: the reservations go back
     * rather than waiting out their lease (only to the connection that
     * granted them; a lost one took its reservations along) */
    int frc = finish_leases(l, leases, n_req, rc == KVD_OK, epoch);
    /* a lease the daemon no longer knows on a live connection lapsed while
     * this ran (the process stalled past its TTL): its extents are held for
     * this process until a Hello says that its copies are over. None runs
     * now, so this connection goes and the next one's Hello says it. */
    if (frc == KVD_ERR_NOT_FOUND)
        lk_conn_fail(l, epoch);
    if (rc == KVD_OK)
        rc = frc;
    free(items);
    free(allocated);
    free(leases);
    free(req);
    return rc != KVD_OK ? rc : no_space ? KVD_ERR_NO_SPACE : KVD_OK;
}

/* Waits (polling, no lock held) until the engine's work a job waits for
 * is over, or the linker closes: the job's copies then start with their
 * own deadline, which the engine's time does not eat. */
static void wait_engine(kvd_linker_t *l, ljob_t *j)
{
    for (size_t i = 0; i < j->after.n; i++) {
        for (;;) {
            int rc = kvd_memkind_mark_query(j->after.kinds[i], j->after.marks[i]);
            if (rc != KVD_INPROGRESS)
                break; /* done, or failed: the copies say so */
            lk_lock(&l->lock);
            bool stop = l->stop;
            lk_unlock(&l->lock);
            if (stop)
                break;
            kvd_sleep_ns(50000);
        }
    }
    lk_dp_marks_free(&j->after);
}

static void run_job(kvd_linker_t *l, ljob_t *j)
{
    wait_engine(l, j);
    bool ok = true;
    for (size_t i = 0; i < j->n; i++) {
        if (run_offload_xfer(l, &j->x[i]) != KVD_OK) {
            ok = false;
            atomic_fetch_add(&l->pools[j->x[i].pool].offload_failures, 1);
        }
    }
    lk_lock(&l->lock);
    lk_queue_push(&l->done_offloads, j->ack, ok);
    pthread_cond_broadcast(&l->cond);
    lk_unlock(&l->lock);
    lk_xfer_free(j->x, j->n);
    free(j);
}

void *lk_offload_thread_main(void *arg)
{
    kvd_linker_t *l = arg;
    lk_lock(&l->lock);
    for (;;) {
        if (l->stop)
            break; /* closing: what is left fails in lk_offloads_fail_pending */
        if (l->jobs != NULL) {
            ljob_t *j = l->jobs;
            l->jobs = j->next;
            if (l->jobs == NULL)
                l->jobs_tail = NULL;
            lk_unlock(&l->lock);
            run_job(l, j);
            lk_lock(&l->lock);
            continue;
        }
        lk_cond_wait(&l->jobs_cond, &l->lock);
    }
    lk_unlock(&l->lock);
    return NULL;
}

void lk_offloads_fail_pending(kvd_linker_t *l)
{
    for (ljob_t *j = l->jobs, *next; j; j = next) {
        next = j->next;
        lk_dp_marks_free(&j->after);
        lk_queue_push(&l->done_offloads, j->ack, false);
        lk_xfer_free(j->x, j->n);
        free(j);
    }
    l->jobs = l->jobs_tail = NULL;
}

/* Has the offload stream of each device kind of the job's pools wait for
 * the engine's event (or stream) before the job's copies, which the
 * offload thread issues later on that stream. */
static int wait_for_engine(kvd_linker_t *l, ljob_t *j, void *stream, void *event)
{
    const kvd_memkind_t *done[LK_DP_KINDS];
    size_t n_done = 0;
    for (size_t i = 0; i < j->n; i++) {
        const lpool_t *p = &l->pools[j->x[i].pool];
        const kvd_memkind_t *k = p->kinds[LK_DP_OFFLOAD];
        if (p->rt == 0) {
            lk_set_last_error("kvd_offload_after: pool '%s' is host memory: nothing on a "
                              "device to wait for",
                              p->name);
            return KVD_ERR_INVALID;
        }
        bool seen = false;
        for (size_t d = 0; d < n_done; d++)
            seen |= done[d] == k;
        if (seen)
            continue;
        void *mark = NULL;
        int rc = kvd_memkind_after(k, stream, event, &mark);
        if (rc != KVD_OK) {
            lk_set_last_error(
                rc == KVD_ERR_UNSUPPORTED
                    ? "kvd_offload_after: a stream being captured into a "
                      "graph cannot be waited for"
                    : "kvd_offload_after: %s refused the wait (the log says "
                      "why)",
                kvd_gpu_name(p->rt));
            lk_dp_marks_free(&j->after);
            return rc;
        }
        j->after.kinds[j->after.n] = k;
        j->after.marks[j->after.n++] = mark;
        done[n_done++] = k; /* at most LK_DP_KINDS distinct kinds exist */
    }
    return KVD_OK;
}

static int offload(kvd_linker_t *l, const kvd_transfer_t *t, size_t n, void *stream,
                   void *event, uint64_t *ack)
{
    lk_clear_last_error();
    if (l == NULL || t == NULL || n == 0 || ack == NULL)
        return KVD_ERR_INVALID;
    ljob_t *j = calloc(1, sizeof(*j));
    if (j == NULL)
        return KVD_ERR_NOMEM;
    int rc = lk_xfers_copy(l, t, n, &j->x);
    if (rc != KVD_OK) {
        free(j);
        return rc;
    }
    j->n = n;
    if (stream != NULL || event != NULL) {
        rc = wait_for_engine(l, j, stream, event);
        if (rc != KVD_OK) {
            lk_xfer_free(j->x, n);
            free(j);
            return rc;
        }
    }
    lk_lock(&l->lock);
    rc = lk_queue_reserve(&l->done_offloads, 1); /* its completion has room */
    if (rc != KVD_OK) {
        lk_unlock(&l->lock);
        lk_dp_marks_free(&j->after);
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
    lk_unlock(&l->lock);
    return KVD_OK;
}

KVD_API int kvd_offload(kvd_linker_t *l, const kvd_transfer_t *t, size_t n, uint64_t *ack)
{
    return offload(l, t, n, NULL, NULL, ack);
}

KVD_API int kvd_offload_after(kvd_linker_t *l, const kvd_transfer_t *t, size_t n,
                              void *stream, void *event, uint64_t *ack)
{
    return offload(l, t, n, stream, event, ack);
}
