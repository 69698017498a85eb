/*
 * kvd_transport.h - the one public header of transport/: moving bytes
 * between a local region and a peer's registered region (DESIGN.md section 7).
 *
 * A backend is an ops table; the public calls dispatch through it. Slots a
 * backend does not fill come from typed stubs that answer
 * KVD_ERR_UNSUPPORTED, so callers never test for NULL.
 *
 * Backends: `shm` (same host: the peer's region is a mapping of its
 * shared-memory file; a transfer is a memcpy). `ucx` and `verbs` follow.
 *
 * Threading: one transport is driven by one thread at a time.
 */
#ifndef KVD_TRANSPORT_H
#define KVD_TRANSPORT_H

#include "kvd_common.h"

#include <stddef.h>
#include <stdint.h>

typedef enum kvd_xfer_dir {
    KVD_XFER_READ = 0,  /* remote -> local */
    KVD_XFER_WRITE = 1, /* local -> remote */
} kvd_xfer_dir_t;

/* One contiguous copy. Offsets are relative to the two regions. */
typedef struct kvd_xfer {
    uint64_t local_offset;
    uint64_t remote_offset;
    uint64_t length;
} kvd_xfer_t;

/* One finished batch: the cookie given to post and its status. */
typedef struct kvd_xfer_done {
    uint64_t cookie;
    int status;
} kvd_xfer_done_t;

typedef struct kvd_transport kvd_transport_t;

typedef int (*kvd_transport_post_fn)(kvd_transport_t *t, kvd_xfer_dir_t dir,
                                     const kvd_xfer_t *xfers, size_t n, uint64_t cookie);
typedef int (*kvd_transport_poll_fn)(kvd_transport_t *t, kvd_xfer_done_t *done,
                                     size_t max, size_t *n_done);
typedef void (*kvd_transport_destroy_fn)(kvd_transport_t *t);

typedef struct kvd_transport_ops {
    const char *name;
    kvd_transport_post_fn post;
    kvd_transport_poll_fn poll;
    kvd_transport_destroy_fn destroy;
} kvd_transport_ops_t;

/* Every backend's object starts with this header. */
struct kvd_transport {
    const kvd_transport_ops_t *ops;
};

/* A memory region: where it is mapped here and how long it is. */
typedef struct kvd_region {
    void *base;
    uint64_t length;
} kvd_region_t;

/*
 * Opens a shm transport between `local` and `remote`, both mapped in this
 * process. Every transfer is checked against both regions before any byte
 * moves. Returns KVD_OK, KVD_ERR_INVALID, KVD_ERR_NOMEM.
 */
int kvd_transport_open_shm(const kvd_region_t *local, const kvd_region_t *remote,
                           kvd_transport_t **out);

/*
 * Posts a batch; its completion is reported once by poll with `cookie`.
 * KVD_ERR_INVALID when any transfer leaves a region (nothing is copied then).
 */
static inline int kvd_transport_post(kvd_transport_t *t, kvd_xfer_dir_t dir,
                                     const kvd_xfer_t *xfers, size_t n, uint64_t cookie)
{
    return t->ops->post(t, dir, xfers, n, cookie);
}

/* Collects up to `max` finished batches into done; *n_done says how many. */
static inline int kvd_transport_poll(kvd_transport_t *t, kvd_xfer_done_t *done,
                                     size_t max, size_t *n_done)
{
    return t->ops->poll(t, done, max, n_done);
}

static inline const char *kvd_transport_name(const kvd_transport_t *t)
{
    return t->ops->name;
}

/* Destroys t; NULL is fine. */
void kvd_transport_destroy(kvd_transport_t *t);

/* Typed stubs for slots a backend does not support. */
int kvd_transport_post_unsupported(kvd_transport_t *t, kvd_xfer_dir_t dir,
                                   const kvd_xfer_t *xfers, size_t n, uint64_t cookie);
int kvd_transport_poll_unsupported(kvd_transport_t *t, kvd_xfer_done_t *done, size_t max,
                                   size_t *n_done);

/* True when [offset, offset+length) lies inside a region of region_len. */
static inline int kvd_range_ok(uint64_t offset, uint64_t length, uint64_t region_len)
{
    return offset <= region_len && length <= region_len - offset;
}

#endif /* KVD_TRANSPORT_H */
