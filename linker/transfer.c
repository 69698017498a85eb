/*
 * transfer.c - the linker's two transfer threads. The load thread runs
 * committed load batches layer group by layer group (marking each group
 * done so that the forward pass can start on it), then ends their leases
 * and publishes (rid, success). The offload thread runs offload jobs
 * (reserve, copy from the device rows, publish) and publishes (ack,
 * success). Over UCX they share the endpoint a batch at a time, loads
 * first (xport_lock).
 *
 * Object layout (DESIGN.md section 3): layer by layer in registration
 * order, buffer by buffer, the object's rows (page_size rows of a paged
 * pool, one row of a slot-addressed one).
 *
 * With shm, copies go through each pool's device-memory backend
 * (devmem.h) between the device rows and the mapped pool: a layer group is
 * marked in place after its backend's sync, and an offload syncs before it
 * reads the device rows. With ucx, the copies of one layer (a load) or of
 * up to 8 MiB of an offload transfer are gathered into one batch of gets,
 * puts or messages
 * between the device rows and the daemon's pool, and waited for; a WRITE
 * batch completes only once the bytes are at the daemon, so the Publish
 * that follows shows whole objects.
 */
#include "linker_int.h"

#include <sched.h>
#include <stdlib.h>
#include <string.h>

#define KEEP_FINISHED_BATCHES 64

/* Where the copies of one step go: straight through the devmem backend
 * (shm), or gathered into one transport batch (ucx). An offload in the
 * message mode first copies the device rows into a staging buffer, so that
 * an object's rows (scattered over the device's per-layer buffers, one
 * after the other in the object) leave as one message instead of one per
 * row range: over TCP, 72 KiB messages moved 1.2-1.3 GB/s here and 4 MiB
 * ones 2.9-3.0. The buffer's two halves take turns: one fills while the
 * other is on the wire. */
typedef struct copier {
    kvd_linker_t *l;
    bool to_device;
    kvd_xfer_t *v;
    size_t n, cap;
    uint8_t *stage; /* NULL: no staging */
    size_t
        used; /* bytes gathered since the last send (of the filling half when staging) */
    int half; /* which half fills */
    const kvd_devmem_ops_t *staged_by;   /* backend of copies into the half */
    uint64_t in_flight, in_flight_bytes; /* the other half's batch; 0 none */
} copier_t;

/* Ends the endpoint after a failed batch: that cancels whatever is still
 * outstanding (the other thread's batches too, which then fail) before the
 * rows it wrote are reported, and marks the connection for a reconnect.
 * Caller holds xport_lock. */
static void xport_failed(copier_t *c, int rc)
{
    kvd_linker_t *l = c->l;
    if (l->xport != NULL) {
        KVD_WARN("linker", "%s over %s failed: %s; reconnecting",
                 c->to_device ? "load" : "offload", kvd_transport_name(l->xport),
                 kvd_status_str(rc));
        kvd_transport_destroy(l->xport);
        l->xport = NULL;
        l->n_kept = 0;
    }
    atomic_store(&l->xport_failed, atomic_load(&l->epoch));
    c->in_flight = 0;
}

/* Loads may take the endpoint this many batches in a row while an offload
 * waits for it; then the offload has one. */
#define LOADS_BEFORE_OFFLOAD 4

/* Takes xport_lock for one batch. A load goes first: the offload thread
 * waits while the load thread wants the lock, except after
 * LOADS_BEFORE_OFFLOAD load batches in a row, so that a steady stream of
 * loads cannot starve the offloads. */
static void xport_lock(copier_t *c)
{
    kvd_linker_t *l = c->l;
    if (c->to_device) {
        atomic_fetch_add(&l->load_waiting, 1);
        while (atomic_load(&l->offload_waiting) &&
               atomic_load(&l->loads_in_a_row) >= LOADS_BEFORE_OFFLOAD)
            sched_yield(); /* its turn: it takes the lock next */
        pthread_mutex_lock(&l->xport_lock);
        atomic_fetch_sub(&l->load_waiting, 1);
        atomic_fetch_add(&l->loads_in_a_row, 1);
        return;
    }
    while (atomic_load(&l->load_waiting) > 0 &&
           atomic_load(&l->loads_in_a_row) < LOADS_BEFORE_OFFLOAD)
        sched_yield();
    atomic_store(&l->offload_waiting, 1);
    pthread_mutex_lock(&l->xport_lock);
    atomic_store(&l->offload_waiting, 0);
    atomic_store(&l->loads_in_a_row, 0);
}

/* Posts a batch of what was gathered; *cookie names it. Caller holds
 * xport_lock. */
static int post_batch(copier_t *c, uint64_t *cookie)
{
    kvd_linker_t *l = c->l;
    if (l->xport == NULL)
        return KVD_ERR_CLOSED; /* the other thread's batch failed it */
    *cookie = ++l->next_cookie;
    return kvd_transport_post(l->xport, c->to_device ? KVD_XFER_READ : KVD_XFER_WRITE,
                              c->v, c->n, *cookie);
}

/* Waits for a posted batch of `bytes`: timeout_ms, plus its bytes at
 * 50 MB/s (a large offload over a slow link is not a dead daemon). The
 * batch may have finished while the other thread waited: it kept it.
 * Caller holds xport_lock. */
static int wait_batch(copier_t *c, uint64_t cookie, uint64_t bytes)
{
    kvd_linker_t *l = c->l;
    for (size_t i = 0; i < l->n_kept; i++)
        if (l->kept[i].cookie == cookie) {
            int status = l->kept[i].status;
            l->kept[i] = l->kept[--l->n_kept];
            return status;
        }
    if (l->xport == NULL)
        return KVD_ERR_CLOSED;
    uint64_t ms = (uint64_t)l->timeout_ms + bytes / 50000u;
    return kvd_transport_wait_keep(l->xport, cookie,
                                   (int)KVD_MIN(ms, (uint64_t)INT32_MAX), l->kept,
                                   &l->n_kept, KVD_ARRAY_SIZE(l->kept));
}

static uint64_t batch_bytes(const copier_t *c)
{
    uint64_t bytes = 0;
    for (size_t i = 0; i < c->n; i++)
        bytes += c->v[i].length;
    return bytes;
}

/* Sends what was gathered, once the staged batch still on the wire (if
 * any) is done and the device copies into the stage are complete; with
 * `wait`, waits for it too, else leaves it on the wire (in_flight). A
 * failure (the daemon gone, a timeout) ends the endpoint (xport_failed).
 * Caller holds the map read lock; the endpoint is this thread's while it
 * holds xport_lock, for one batch. */
static int send_gathered(copier_t *c, bool wait)
{
    kvd_linker_t *l = c->l;
    int rc = KVD_OK;
    xport_lock(c);
    if (c->in_flight != 0)
        rc = wait_batch(c, c->in_flight, c->in_flight_bytes);
    c->in_flight = 0;
    if (rc == KVD_OK && c->staged_by != NULL) /* the device copies are done */
        rc = c->staged_by->sync();
    c->staged_by = NULL;
    if (rc == KVD_OK && c->n > 0) {
        uint64_t cookie = 0, bytes = batch_bytes(c);
        rc = post_batch(c, &cookie);
        if (rc == KVD_OK && wait)
            rc = wait_batch(c, cookie, bytes);
        else if (rc == KVD_OK) {
            c->in_flight = cookie;
            c->in_flight_bytes = bytes;
        }
    }
    c->n = 0;
    if (rc != KVD_OK && rc != KVD_ERR_INVALID)
        xport_failed(c, rc);
    pthread_mutex_unlock(&l->xport_lock);
    return rc;
}

/* Sends what the filling half holds, once the other half's batch is done,
 * and turns to that half. */
static int stage_flip(copier_t *c)
{
    int rc = send_gathered(c, false);
    c->half ^= 1;
    c->used = 0;
    return rc;
}

/* Runs what was gathered and waits for it, and for a staged batch still in
 * flight (send_gathered). */
static int copy_run(copier_t *c)
{
    if (!c->l->use_ucx)
        return KVD_OK;
    int rc = send_gathered(c, true);
    c->used = 0;
    return rc;
}

/* One contiguous copy between device memory at `d` and the pool at
 * `pool_off`. Adjacent ones merge, so a contiguous run is one operation. */
static int copy_add(copier_t *c, const kvd_devmem_ops_t *dev, uint8_t *d,
                    uint64_t pool_off, size_t n)
{
    kvd_linker_t *l = c->l;
    if (!l->use_ucx) {
        uint8_t *obj = l->pool_map + pool_off;
        return c->to_device ? dev->copy(d, obj, n, true) : dev->copy(obj, d, n, false);
    }
    if (c->stage != NULL && n <= KVD_LINKER_STAGE_HALF) {
        if (c->used + n > KVD_LINKER_STAGE_HALF) {
            int rc = stage_flip(c);
            if (rc != KVD_OK)
                return rc;
        }
        uint8_t *s = c->stage + (size_t)c->half * KVD_LINKER_STAGE_HALF + c->used;
        int rc = KVD_OK;
        if (c->staged_by != NULL && c->staged_by != dev)
            rc = c->staged_by->sync(); /* one backend's copies pending at a time */
        if (rc == KVD_OK)
            rc = dev->copy(s, d, n, false);
        if (rc != KVD_OK)
            return rc;
        c->staged_by = dev;
        c->used += n;
        d = s; /* what goes on the wire; the next row lands right after */
    } else if (!c->to_device && c->n > 0 && c->used + n > KVD_LINKER_STAGE_HALF) {
        /* unstaged offloads go in batches of a half's size too, so that
         * a load waits for one of them at most (copy_run) */
        int rc = copy_run(c);
        if (rc != KVD_OK)
            return rc;
    }
    if (c->stage == NULL && !c->to_device)
        c->used += n;
    uint64_t local = (uint64_t)(uintptr_t)d;
    if (c->n > 0) {
        kvd_xfer_t *last = &c->v[c->n - 1];
        if (last->local_offset + last->length == local &&
            last->remote_offset + last->length == pool_off) {
            last->length += n;
            return KVD_OK;
        }
    }
    if (c->n == c->cap) {
        size_t cap = c->cap ? c->cap * 2 : 64;
        kvd_xfer_t *v = realloc(c->v, cap * sizeof(*v));
        if (v == NULL)
            return KVD_ERR_NOMEM;
        c->v = v;
        c->cap = cap;
    }
    c->v[c->n++] =
        (kvd_xfer_t){.local_offset = local, .remote_offset = pool_off, .length = n};
    return KVD_OK;
}

static void copy_free(copier_t *c)
{
    free(c->v);
}

/* Whether copies can run: a mapped pool, or an endpoint of the current
 * connection that has not failed (read without xport_lock, which a load
 * would otherwise queue for behind an offload's batch). Caller holds the
 * map read lock, so the connection cannot change meanwhile. */
static bool data_path_up(const kvd_linker_t *l)
{
    if (!l->use_ucx)
        return l->pool_map != NULL;
    return atomic_load(&l->xport_failed) != atomic_load(&l->epoch);
}

/* Moves one buffer's rows of one object (at pool_off): to the device (a
 * load) or from it. */
static int copy_rows(copier_t *c, const kvd_devmem_ops_t *dev,
                     const kvd_pool_buffer_t *buf, int64_t row0, uint32_t rows,
                     uint64_t pool_off)
{
    uint8_t *d = (uint8_t *)buf->base + (uint64_t)row0 * buf->row_stride;
    if (buf->row_stride == buf->bytes_per_row)
        return copy_add(c, dev, d, pool_off, (size_t)rows * buf->bytes_per_row);
    int rc = KVD_OK;
    for (uint32_t r = 0; rc == KVD_OK && r < rows; r++)
        rc = copy_add(c, dev, d + (uint64_t)r * buf->row_stride,
                      pool_off + (uint64_t)r * buf->bytes_per_row, buf->bytes_per_row);
    return rc;
}

/* Where layer li starts inside an object of pool p. */
static uint64_t layer_offset(const lpool_t *p, uint32_t li)
{
    uint64_t off = 0;
    for (uint32_t k = 0; k < li; k++)
        for (uint32_t b = 0; b < p->layers[k].n_buffers; b++)
            off += (uint64_t)p->rows * p->layers[k].buffers[b].bytes_per_row;
    return off;
}

/* Copies (or gathers) layers [l0, l1) of key i of one transfer; adds the
 * bytes to *moved. Caller holds the map read lock. */
static int copy_key(copier_t *c, const lpool_t *p, const lxfer_t *x, uint32_t i,
                    uint32_t l0, uint32_t l1, uint64_t *moved)
{
    int64_t row0 = p->desc.addressing == KVD_ADDR_PAGED
                       ? x->idx[(size_t)i * p->desc.page_size]
                       : x->idx[i];
    uint64_t obj = x->offsets[i] + layer_offset(p, l0);
    for (uint32_t li = l0; li < l1; li++) {
        const kvd_pool_layer_t *ly = &p->layers[li];
        for (uint32_t b = 0; b < ly->n_buffers; b++) {
            int rc = copy_rows(c, p->dev, &ly->buffers[b], row0, p->rows, obj);
            if (rc != KVD_OK)
                return rc;
            obj += (uint64_t)p->rows * ly->buffers[b].bytes_per_row;
            *moved += (uint64_t)p->rows * ly->buffers[b].bytes_per_row;
        }
    }
    return KVD_OK;
}

/* Copies (or gathers) layer li of keys [x->begin, x->end) of one load
 * transfer; adds the bytes to *moved. Caller holds the map read lock. */
static int copy_layer(copier_t *c, const lpool_t *p, const lxfer_t *x, uint32_t li,
                      uint64_t *moved)
{
    for (uint32_t i = x->begin; i < x->end; i++) {
        int rc = copy_key(c, p, x, i, li, li + 1, moved);
        if (rc != KVD_OK)
            return rc;
    }
    return KVD_OK;
}

/* The linker's staging buffer (two halves of KVD_LINKER_STAGE_HALF),
 * made on first use; NULL without memory (then rows go unstaged). Only
 * the offload thread uses it. */
static uint8_t *stage_buffer(kvd_linker_t *l)
{
    if (l->stage == NULL)
        l->stage = kvd_mem_calloc(KVD_MEM_STAGING, 2, KVD_LINKER_STAGE_HALF);
    return l->stage;
}

/* Copies every transfer of the batch that has layer `layer_id`. A load
 * whose pins belong to an earlier connection (the daemon went away, and
 * the mapping with it) is marked failed and not copied: its offsets mean
 * nothing in the current mapping. The epoch is checked under the map read
 * lock, which a reconnection takes for writing to swap the mapping. */
static int copy_batch_layer(kvd_linker_t *l, lbatch_t *b, uint32_t layer_id)
{
    int rc = KVD_OK;
    copier_t c = {.l = l, .to_device = true};
    pthread_rwlock_rdlock(&l->map);
    uint64_t epoch = atomic_load(&l->epoch);
    if (!data_path_up(l))
        rc = KVD_ERR_CLOSED;
    for (lload_t *ld = b->loads; rc == KVD_OK && ld; ld = ld->next) {
        for (size_t i = 0; i < ld->n; i++)
            ld->failed |= ld->x[i].lease != 0 && ld->x[i].epoch != epoch;
        for (size_t i = 0; !ld->failed && i < ld->n; i++) {
            lxfer_t *x = &ld->x[i];
            lpool_t *p = &l->pools[x->pool];
            for (uint32_t li = 0; !x->dropped && li < p->desc.n_layers; li++) {
                if (p->layers[li].layer_id != layer_id)
                    continue;
                uint64_t moved = 0;
                rc = copy_layer(&c, p, x, li, &moved);
                atomic_fetch_add(&p->load_bytes, moved);
                if (rc != KVD_OK)
                    break;
            }
            if (rc != KVD_OK)
                break;
        }
    }
    if (rc == KVD_OK)
        rc = copy_run(&c); /* one batch for the layer, all loads together */
    pthread_rwlock_unlock(&l->map);
    copy_free(&c);
    return rc;
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
            ok = lk_release(l, ld->x, ld->n) && ok;
        pthread_mutex_lock(&l->lock);
        if (!ok)
            for (size_t i = 0; i < ld->n; i++)
                atomic_fetch_add(&l->pools[ld->x[i].pool].load_failures, 1);
        lk_queue_push(&l->done_loads, ld->rid, ok);
        if (early)
            pthread_cond_broadcast(&l->cond);
        pthread_mutex_unlock(&l->lock);
        if (early)
            lk_release(l, ld->x, ld->n); /* what it says changes nothing now */
    }
    pthread_mutex_lock(&l->lock);
    for (lload_t *ld = b->loads, *next; ld; ld = next) {
        next = ld->next;
        lk_xfer_free(ld->x, ld->n);
        free(ld);
    }
    b->loads = NULL;
    if (err != KVD_OK && b->error == KVD_OK)
        b->error = err;
    b->finished = true;
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
        free(old->layer_ids);
        free(old);
        n--;
    }
    pthread_cond_broadcast(&l->cond);
    pthread_mutex_unlock(&l->lock);
}

static void run_batch(kvd_linker_t *l, lbatch_t *b)
{
    pthread_mutex_lock(&l->lock);
    int err = KVD_OK;
    uint32_t group = (uint32_t)l->cfg.layer_group_size;
    pthread_mutex_unlock(&l->lock);
    for (uint32_t pos = 0; err == KVD_OK && pos < b->n_layers; pos += group) {
        uint32_t end = KVD_MIN(pos + group, b->n_layers);
        for (uint32_t k = pos; err == KVD_OK && k < end; k++)
            err = copy_batch_layer(l, b, b->layer_ids[k]);
        /* the group is in place only once its copies completed: one sync
         * per backend the batch used, not one per transfer */
        const kvd_devmem_ops_t *synced[KVD_MAX_POOLS];
        size_t n_synced = 0;
        for (lload_t *ld = b->loads; err == KVD_OK && ld; ld = ld->next)
            for (size_t i = 0; err == KVD_OK && i < ld->n; i++) {
                const kvd_devmem_ops_t *dev = l->pools[ld->x[i].pool].dev;
                size_t k = 0;
                while (k < n_synced && synced[k] != dev)
                    k++;
                if (k < n_synced)
                    continue;
                if (n_synced < KVD_MAX_POOLS)
                    synced[n_synced++] = dev;
                err = dev->sync();
            }
        pthread_mutex_lock(&l->lock);
        if (err == KVD_OK)
            b->layers_done = end;
        else
            b->error = err; /* the remaining layers fail now, nobody waits */
        atomic_fetch_add(&l->progress, 1);
        pthread_cond_broadcast(&l->cond);
        pthread_mutex_unlock(&l->lock);
    }
    finish_batch(l, b, err);
}

/* Reserves, writes and publishes one offload transfer. */
static int run_offload_xfer(kvd_linker_t *l, lxfer_t *x)
{
    pthread_mutex_lock(&l->lock);
    lpool_t *p = &l->pools[x->pool];
    uint32_t ns = p->ns_id;
    uint64_t object_bytes = p->object_bytes;
    pthread_mutex_unlock(&l->lock);
    bool paged = p->desc.addressing == KVD_ADDR_PAGED;
    /* the engine's writes to these rows must be final before they are read */
    int synced = p->dev->sync();
    if (synced != KVD_OK)
        return synced;
    kvd_put_item_t *items = calloc(x->n_keys, sizeof(*items));
    uint8_t *allocated = calloc(x->n_keys, 1);
    if (items == NULL || allocated == NULL) {
        free(items);
        free(allocated);
        return KVD_ERR_NOMEM;
    }
    for (size_t i = 0; i < x->n_keys; i++) {
        memcpy(items[i].key, x->keys[i], KVD_KEY_LEN);
        items[i].depth = x->depths ? x->depths[i] : x->first_depth + (uint32_t)i;
        /* a paged transfer is a run of a chain; slot keys (node ends) are
         * not each other's parents */
        const uint8_t *parent =
            i == 0 ? (x->has_prior ? x->prior : NULL) : (paged ? x->keys[i - 1] : NULL);
        if (parent) {
            memcpy(items[i].parent, parent, KVD_KEY_LEN);
            items[i].has_parent = true;
        }
    }
    kvd_msg_t req, rep;
    kvd_msg_request(&req, 0, KVD_METHOD_RESERVE);
    req.body.reserve_req = (kvd_reserve_req_t){
        .ns = ns, .object_bytes = object_bytes, .n = x->n_keys, .items = items};
    uint64_t epoch = 0;
    int rc = lk_call_ex(l, &req, &rep, 0, &epoch);
    uint64_t lease = rc == KVD_OK ? rep.body.reserve_rep.lease_id : 0;
    bool no_space = false;
    if (rc == KVD_OK && rep.body.reserve_rep.n != x->n_keys)
        rc = KVD_ERR_PROTOCOL;
    pthread_rwlock_rdlock(&l->map);
    /* offsets are into the mapping of the connection that reserved them */
    if (rc == KVD_OK && epoch != atomic_load(&l->epoch))
        rc = KVD_ERR_CLOSED;
    bool up = data_path_up(l);
    for (size_t i = 0; rc == KVD_OK && i < x->n_keys; i++) {
        uint8_t r = rep.body.reserve_rep.results[i];
        uint64_t off = rep.body.reserve_rep.offsets[i];
        no_space |= r == 3; /* KVD_RESERVE_NO_SPACE */
        if (r != 0)
            continue; /* exists or in flight: stored by someone: success */
        if (!up || off > l->pool_bytes || object_bytes > l->pool_bytes - off)
            rc = KVD_ERR_PROTOCOL;
        x->offsets[i] = off;
        allocated[i] = 1;
    }
    copier_t c = {.l = l, .to_device = false};
    if (rc == KVD_OK && l->use_ucx && l->ucx_mode == KVD_UCX_MODE_AM)
        c.stage = stage_buffer(l);
    if (rc == KVD_OK) {
        /* object by object: an object's rows are contiguous in the pool,
         * so staged rows merge into one range per object */
        for (uint32_t i = x->begin; rc == KVD_OK && i < x->end; i++) {
            uint64_t moved = 0; /* counted as it goes: the counter shows progress */
            if (allocated[i])
                rc = copy_key(&c, p, x, i, 0, p->desc.n_layers, &moved);
            atomic_fetch_add(&p->offload_bytes, moved);
        }
        if (rc == KVD_OK)
            rc = copy_run(&c); /* complete at the daemon before Publish */
        else if (c.in_flight != 0) {
            c.n = 0; /* nothing more is sent; what is on the wire ends first */
            copy_run(&c);
        }
    }
    pthread_rwlock_unlock(&l->map);
    copy_free(&c);
    kvd_msg_clear(&rep);
    if (lease != 0) {
        /* copied: now the bytes may be seen; failed: the reservation goes
         * back rather than waiting out its lease (only to the connection
         * that granted it; a lost one took its reservations along) */
        kvd_msg_request(&req, 0, rc == KVD_OK ? KVD_METHOD_PUBLISH : KVD_METHOD_REVOKE);
        req.body.finish_req.lease_id = lease;
        int prc = lk_call_ex(l, &req, &rep, epoch, NULL);
        if (rc == KVD_OK)
            rc = prc;
        kvd_msg_clear(&rep);
    }
    free(items);
    free(allocated);
    return rc != KVD_OK ? rc : no_space ? KVD_ERR_NO_SPACE : KVD_OK;
}

static void run_job(kvd_linker_t *l, ljob_t *j)
{
    bool ok = true;
    for (size_t i = 0; i < j->n; i++) {
        if (run_offload_xfer(l, &j->x[i]) != KVD_OK) {
            ok = false;
            atomic_fetch_add(&l->pools[j->x[i].pool].offload_failures, 1);
        }
    }
    pthread_mutex_lock(&l->lock);
    lk_queue_push(&l->done_offloads, j->ack, ok);
    pthread_cond_broadcast(&l->cond);
    pthread_mutex_unlock(&l->lock);
    lk_xfer_free(j->x, j->n);
    free(j);
}

void *lk_load_thread_main(void *arg)
{
    kvd_linker_t *l = arg;
    pthread_mutex_lock(&l->lock);
    for (;;) {
        if (l->stop)
            break; /* closing: what is left fails in lk_fail_pending */
        lbatch_t *b = l->batches;
        while (b != NULL && (b->finished || b->layers_done > 0 || b->error != KVD_OK))
            b = b->next;
        if (b != NULL && b->loads != NULL) {
            pthread_mutex_unlock(&l->lock);
            run_batch(l, b);
            pthread_mutex_lock(&l->lock);
            continue;
        }
        if (kvd_now_ns() < l->spin_until_ns) {
            /* a load is on its way (kvd_load): poll for its start rather
             * than sleep, yielding the CPU to whoever needs it */
            uint32_t seen = atomic_load(&l->kick);
            uint64_t until = l->spin_until_ns;
            pthread_mutex_unlock(&l->lock);
            while (atomic_load(&l->kick) == seen && kvd_now_ns() < until)
                sched_yield();
            pthread_mutex_lock(&l->lock);
            if (atomic_load(&l->kick) == seen)
                l->spin_until_ns = 0; /* it did not come: sleep next time */
            continue;
        }
        pthread_cond_wait(&l->cond, &l->lock);
    }
    pthread_mutex_unlock(&l->lock);
    return NULL;
}

void *lk_offload_thread_main(void *arg)
{
    kvd_linker_t *l = arg;
    pthread_mutex_lock(&l->lock);
    for (;;) {
        if (l->stop)
            break; /* closing: what is left fails in lk_fail_pending */
        if (l->jobs != NULL) {
            ljob_t *j = l->jobs;
            l->jobs = j->next;
            if (l->jobs == NULL)
                l->jobs_tail = NULL;
            pthread_mutex_unlock(&l->lock);
            run_job(l, j);
            pthread_mutex_lock(&l->lock);
            continue;
        }
        pthread_cond_wait(&l->jobs_cond, &l->lock);
    }
    pthread_mutex_unlock(&l->lock);
    return NULL;
}

void lk_fail_pending(kvd_linker_t *l)
{
    /* batches the thread never ran: failed, each load comes back once */
    for (lbatch_t *b = l->batches; b; b = b->next)
        if (!b->finished)
            finish_batch(l, b, KVD_ERR_CLOSED);
    /* loads never committed: their pins end, no completion (not queued) */
    for (lload_t *ld = l->loads, *next; ld; ld = next) {
        next = ld->next;
        lk_release(l, ld->x, ld->n);
        lk_xfer_free(ld->x, ld->n);
        free(ld);
    }
    l->loads = NULL;
    for (ljob_t *j = l->jobs, *next; j; j = next) {
        next = j->next;
        lk_queue_push(&l->done_offloads, j->ack, false);
        lk_xfer_free(j->x, j->n);
        free(j);
    }
    l->jobs = l->jobs_tail = NULL;
}
