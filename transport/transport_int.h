/*
 * transport_int.h - what the backends of transport/ share: the region
 * object and the ring of finished batches. Private to transport/.
 */
#ifndef KVD_TRANSPORT_INT_H
#define KVD_TRANSPORT_INT_H

#include "kvd_transport.h"

/* A registered local region. `backend` is the backend's own handle for it
 * (ucx: its ucp_mem_h); regions of one transport are listed for destroy. */
struct kvd_region {
    kvd_transport_t *t;
    uint8_t *base;
    uint64_t length;
    const kvd_memkind_t *kind;
    void *backend;
    struct kvd_region *next;
};

/* Finished batches waiting to be polled, in the order they finished. */
typedef struct kvd_done_ring {
    kvd_xfer_done_t *v;
    size_t head, len, cap;
} kvd_done_ring_t;

/* Makes room for `n` entries in all, so that pushing them cannot fail. */
int kvd_done_ring_reserve(kvd_done_ring_t *r, size_t n);
/* Appends one entry; room was reserved. */
void kvd_done_ring_push(kvd_done_ring_t *r, uint64_t cookie, int status);
/* Takes up to max entries, oldest first; returns how many. */
size_t kvd_done_ring_pop(kvd_done_ring_t *r, kvd_xfer_done_t *out, size_t max);
void kvd_done_ring_free(kvd_done_ring_t *r);

/* The distinct kinds of a batch's regions, to sync each once. */
#define KVD_KINDS_MAX 4
typedef struct kvd_kind_set {
    const kvd_memkind_t *v[KVD_KINDS_MAX];
    size_t n;
} kvd_kind_set_t;

/* Adds k to s; false when s is full (then sync what it holds first). */
bool kvd_kind_set_add(kvd_kind_set_t *s, const kvd_memkind_t *k);
/* Syncs every kind of s and empties it; the first failure. */
int kvd_kind_set_sync(kvd_kind_set_t *s);

#endif
