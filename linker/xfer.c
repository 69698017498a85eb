/*
 * xfer.c - what loads and offloads share: a transfer's owned copy, checked
 * against its pool, and one key's rows moved through a data path.
 *
 * Object layout (DESIGN.md section 3): layer by layer in registration
 * order, buffer by buffer, the object's rows (page_size rows of a paged
 * pool, one row of a slot-addressed one).
 */
#include "linker_int.h"

#include <stdlib.h>
#include <string.h>

void lk_xfer_free(lxfer_t *x, size_t n)
{
    for (size_t i = 0; x != NULL && i < n; i++) {
        free(x[i].keys);
        free(x[i].idx);
        free(x[i].depths);
        free(x[i].offsets);
        free(x[i].leases);
    }
    free(x);
}

bool lk_xfer_pinned(const lxfer_t *x)
{
    for (uint32_t c = 0; c < x->n_leases; c++)
        if (x->leases[c] != 0)
            return true;
    return false;
}

/* Copies the caller's transfer into owned arrays; checks its shape.
 * Caller holds lock. */
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

int lk_xfers_copy(kvd_linker_t *l, const kvd_transfer_t *t, size_t n, lxfer_t **out)
{
    lxfer_t *x = calloc(n, sizeof(*x));
    if (x == NULL)
        return KVD_ERR_NOMEM;
    lk_lock(&l->lock);
    int rc = KVD_OK;
    for (size_t i = 0; i < n && rc == KVD_OK; i++)
        rc = xfer_copy(l, &t[i], &x[i]);
    lk_unlock(&l->lock);
    if (rc != KVD_OK) {
        lk_xfer_free(x, n);
        return rc;
    }
    *out = x;
    return KVD_OK;
}

/* Moves one buffer's rows of one object (at pool_off): to the device (a
 * load) or from it. A buffer whose rows are packed moves as one range. */
static int copy_rows(kvd_linker_t *l, ldp_t *dp, kvd_region_t *r,
                     const kvd_pool_buffer_t *buf, int64_t row0, uint32_t rows,
                     uint64_t pool_off)
{
    uint64_t off = (uint64_t)row0 * buf->row_stride;
    if (buf->row_stride == buf->bytes_per_row)
        return lk_dp_add(l, dp, r, off, pool_off, (uint64_t)rows * buf->bytes_per_row);
    int rc = KVD_OK;
    for (uint32_t k = 0; rc == KVD_OK && k < rows; k++)
        rc = lk_dp_add(l, dp, r, off + (uint64_t)k * buf->row_stride,
                       pool_off + (uint64_t)k * buf->bytes_per_row, buf->bytes_per_row);
    return rc;
}

int lk_copy_key(kvd_linker_t *l, ldp_t *dp, const lpool_t *p, const lxfer_t *x,
                uint32_t i, uint32_t l0, uint32_t l1, uint64_t *moved)
{
    int64_t row0 = p->desc.addressing == KVD_ADDR_PAGED
                       ? x->idx[(size_t)i * p->desc.page_size]
                       : x->idx[i];
    uint64_t obj = x->offsets[i] + p->layer_off[l0], obj0 = obj;
    kvd_region_t **regions = p->regions[dp->index];
    for (uint32_t li = l0; li < l1; li++) {
        const kvd_pool_layer_t *ly = &p->layers[li];
        for (uint32_t b = 0; b < ly->n_buffers; b++) {
            int rc = copy_rows(l, dp, regions[p->buffer0[li] + b], &ly->buffers[b], row0,
                               p->rows, obj);
            if (rc != KVD_OK)
                return rc;
            obj += (uint64_t)p->rows * ly->buffers[b].bytes_per_row;
            *moved += (uint64_t)p->rows * ly->buffers[b].bytes_per_row;
        }
    }
    if (p->rt != 0 && dp->peer != NULL) {
        /* by DMA, or through the bounce ring: as the kind will decide, from
         * whether the pool's side is pinned; over UCX through the staging
         * slots, which count as bounced (a pool entry's counters are the
         * part of it that changes) */
        lpool_t *mp = (lpool_t *)(uintptr_t)p;
        bool dma = dp->peer->map != NULL &&
                   kvd_gpu_pinned(p->rt, (uint8_t *)dp->peer->map + obj0, obj - obj0);
        atomic_fetch_add(dma ? &mp->dma_bytes : &mp->bounce_bytes, obj - obj0);
    }
    return KVD_OK;
}
