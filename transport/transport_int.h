/*
 * transport_int.h - what the backends of transport/ share. Private to
 * transport/.
 */
#ifndef KVD_TRANSPORT_INT_H
#define KVD_TRANSPORT_INT_H

#include "kvd_transport.h"

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

#endif
