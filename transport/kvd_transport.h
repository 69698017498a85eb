/*
 * kvd_transport.h - the one public header of transport/: moving bytes
 * between a local region and a peer's registered region (DESIGN.md section 7).
 *
 * A backend is an ops table; the public calls dispatch through it. Slots a
 * backend does not fill come from typed stubs that answer
 * KVD_ERR_UNSUPPORTED, so callers never test for NULL.
 *
 * Backends: `shm` (same host: the peer's region is a mapping of its
 * shared-memory file; a transfer is a memcpy) and `ucx` (UCP RMA get/put
 * on the peer's registered region, whatever UCX runs underneath: RDMA
 * verbs, TCP, shared memory). `verbs` follows.
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
typedef unsigned (*kvd_transport_progress_fn)(kvd_transport_t *t);
typedef void (*kvd_transport_destroy_fn)(kvd_transport_t *t);

typedef struct kvd_transport_ops {
    const char *name;
    kvd_transport_post_fn post;
    kvd_transport_poll_fn poll;
    /* drives outstanding work; returns how many events it handled */
    kvd_transport_progress_fn progress;
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

/* Drives outstanding batches (a no-op where post completes them). */
static inline unsigned kvd_transport_progress(kvd_transport_t *t)
{
    return t->ops->progress(t);
}

/*
 * Waits until the batch `cookie` is reported (other batches reported on the
 * way are dropped: callers wait for one batch at a time) and returns its
 * status; KVD_ERR_TIMEOUT after timeout_ms (the batch may still be running
 * then: destroy the transport before its memory is reused).
 */
int kvd_transport_wait(kvd_transport_t *t, uint64_t cookie, int timeout_ms);

/*
 * kvd_transport_wait for callers that share t between batches they wait on
 * one at a time: the other batches that finish meanwhile are appended to
 * kept[*n_kept..cap) instead of being dropped (beyond cap they are lost:
 * size it for the batches outstanding).
 */
int kvd_transport_wait_keep(kvd_transport_t *t, uint64_t cookie, int timeout_ms,
                            kvd_xfer_done_t *kept, size_t *n_kept, size_t cap);

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
unsigned kvd_transport_progress_none(kvd_transport_t *t);

/* ------------------------------------------------------------------ UCX
 *
 * One kvd_ucx_t is a UCP context and worker: the daemon has one for its
 * pool, a linker one for its connection. Memory a peer reaches is mapped
 * with kvd_ucx_mem_map and described to it by a packed rkey and the base
 * address; the peer connects to this worker's address.
 *
 * Threading: a kvd_ucx_t and every transport opened on it are driven by
 * one thread at a time (the caller serialises).
 */
typedef struct kvd_ucx kvd_ucx_t;
typedef struct kvd_ucx_mem kvd_ucx_mem_t;

/*
 * Creates the context and worker. `wakeup` asks for an event fd (the
 * daemon's epoll). UCX reads UCX_TLS, UCX_NET_DEVICES etc. from the
 * environment. KVD_ERR_UNAVAILABLE when UCX cannot start.
 */
int kvd_ucx_create(const char *name, bool wakeup, kvd_ucx_t **out);
void kvd_ucx_destroy(kvd_ucx_t *u);

/* The worker's address for peers (owned by u). */
void kvd_ucx_address(const kvd_ucx_t *u, const void **addr, size_t *len);

/* The wakeup fd (-1 without wakeup). Watch it for reading; call
 * kvd_ucx_drive when it fires, and once before the first wait. */
int kvd_ucx_efd(const kvd_ucx_t *u);

/* Progresses until idle and re-arms the wakeup fd. */
void kvd_ucx_drive(kvd_ucx_t *u);

/* One progress pass; returns how many events it handled. */
unsigned kvd_ucx_progress(kvd_ucx_t *u);

/* Maps [base, base+len) for remote access and packs its rkey.
 * KVD_ERR_INVALID, KVD_ERR_NOMEM, KVD_ERR_IO (UCX refused). */
int kvd_ucx_mem_map(kvd_ucx_t *u, void *base, uint64_t len, kvd_ucx_mem_t **out);
void kvd_ucx_mem_rkey(const kvd_ucx_mem_t *m, const void **rkey, size_t *len);
void kvd_ucx_mem_unmap(kvd_ucx_mem_t *m);

/* How a ucx transport moves bytes. */
typedef enum kvd_ucx_mode {
    /* one-sided get/put on the peer's region: the peer's CPU is not
     * involved where the NIC does RMA (RDMA verbs) */
    KVD_UCX_MODE_RMA = 0,
    /* active messages the peer's worker serves (kvd_ucx_serve_messages):
     * for transports where UCX emulates RMA in software (TCP), which move
     * several times more this way */
    KVD_UCX_MODE_AM = 1,
} kvd_ucx_mode_t;

/* The peer a ucx transport talks to: its worker, and its region. */
typedef struct kvd_ucx_peer {
    const void *address;
    size_t address_len;
    const void *rkey;
    size_t rkey_len;
    uint64_t remote_base; /* the region's address in the peer */
    uint64_t remote_length;
    kvd_ucx_mode_t mode;
} kvd_ucx_peer_t;

/*
 * Opens a ucx transport to `peer` on u's worker. A transfer's local_offset
 * is an address in this process; memory mapped with kvd_ucx_add_local is
 * used with its handle, other memory as UCX sees fit. A READ batch is
 * reported once every get landed; a WRITE batch once every put is
 * complete at the peer (an endpoint flush), so what the peer publishes
 * then is whole. A peer that goes away fails the outstanding batches and
 * every later post (KVD_ERR_CLOSED). Destroy cancels what is still
 * outstanding and returns only when UCX no longer touches local memory.
 */
int kvd_transport_open_ucx(kvd_ucx_t *u, const kvd_ucx_peer_t *peer,
                           kvd_transport_t **out);

/* Serves message-mode requests (KVD_UCX_MODE_AM) for the region m on u's
 * worker, from its progress. Ranges outside m are refused (the requester
 * is told). KVD_ERR_INVALID, KVD_ERR_IO. */
int kvd_ucx_serve_messages(kvd_ucx_t *u, const kvd_ucx_mem_t *m);

/* Lets batches of t use m's handle for local memory inside m. */
int kvd_transport_ucx_add_local(kvd_transport_t *t, const kvd_ucx_mem_t *m);

/* True when [offset, offset+length) lies inside a region of region_len. */
static inline int kvd_range_ok(uint64_t offset, uint64_t length, uint64_t region_len)
{
    return offset <= region_len && length <= region_len - offset;
}

#endif /* KVD_TRANSPORT_H */
