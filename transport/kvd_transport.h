/*
 * kvd_transport.h - the one public header of transport/: moving bytes
 * between regions of this process and a peer's region (DESIGN.md section 7).
 * Every byte the linker moves goes through it.
 *
 * The model:
 *   - A transport is opened once per backend and lives as long as its
 *     user; it is an ops table, and the public calls dispatch through it.
 *     Slots a backend does not fill come from the typed stubs at the end
 *     of this header, so callers never test for NULL.
 *   - Local memory is registered with the transport as regions
 *     (kvd_transport_register). A region has a memory kind (host now; CUDA
 *     and HIP plug in as kinds), and the kind brings the copy and sync
 *     hooks that memory needs: the caller never branches on the kind.
 *   - The transport is connected to one peer region at a time
 *     (kvd_transport_connect). Connecting again replaces the peer; what
 *     was outstanding on the old one is reported failed first.
 *   - A batch of (local region + offset, remote offset, length) transfers
 *     is posted in one direction with a cookie, and reported once by poll.
 *     A READ batch is reported when its bytes are in the local regions; a
 *     WRITE batch when they are in the peer's region, so that what the
 *     peer publishes then is whole.
 *
 * Backends: `shm` (same host: the peer's region is mapped in this process,
 * a copy is the kind's copy), `ucx` (UCP RMA, or active messages the
 * peer's worker serves where UCX only emulates RMA). `verbs` follows.
 *
 * Threading: one transport, its regions and its batches are driven by one
 * thread at a time (the caller serialises). Two threads that move bytes at
 * once open a transport each.
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

/* ------------------------------------------------------- memory kinds */

/*
 * How memory of one kind is copied to and from host memory. A kind object
 * is an instance: a device kind has a stream of its own, so each data
 * path opens its own (kvd_memkind_gpu_open); the host kind is one shared
 * constant. A copy may be asynchronous (async: it completes at sync, or
 * when a mark taken after it is done); sync returns once every copy issued
 * through the kind so far is complete. Before a copy out of the kind's
 * memory, the writes its owner issued must be final: the owner syncs, or
 * has the kind wait for them (after).
 */
typedef struct kvd_memkind kvd_memkind_t;

/* One copy of a batch: dst <- src, n bytes. */
typedef struct kvd_copy {
    void *dst;
    const void *src;
    size_t n;
} kvd_copy_t;

struct kvd_memkind {
    const char *name;
    bool async;
    /* a device kind's runtime (kvd_gpu_runtime_t; 0: host memory) and
     * device, for what a transport stages through pinned host memory */
    int runtime;
    int ordinal;
    /* into_region: dst is memory of this kind (a READ), else src is (a
     * WRITE); the other side is host memory */
    int (*copy)(const kvd_memkind_t *k, void *dst, const void *src, size_t n,
                bool into_region);
    /* n copies in one direction at once (a device kind issues them as one
     * batch where its runtime can) */
    int (*copy_batch)(const kvd_memkind_t *k, const kvd_copy_t *v, size_t n,
                      bool into_region);
    int (*sync)(const kvd_memkind_t *k);
    /* A mark: done once every copy issued through k before it is. *mark
     * is NULL where nothing can be pending (the host kind). */
    int (*mark)(const kvd_memkind_t *k, void **mark);
    /* KVD_OK once done, KVD_INPROGRESS before, or the copies' error */
    int (*mark_query)(const kvd_memkind_t *k, void *mark);
    /* blocks until done: KVD_OK or the copies' error */
    int (*mark_wait)(const kvd_memkind_t *k, void *mark);
    /* has a stream of the kind's runtime (the engine's) wait on the device
     * for the mark; returns once the wait is queued. KVD_ERR_UNSUPPORTED
     * for a stream being captured into a graph (the wait would name an
     * event kvdock reuses). */
    int (*mark_stream_wait)(const kvd_memkind_t *k, void *mark, void *stream);
    void (*mark_free)(const kvd_memkind_t *k, void *mark);
    /* has the kind's later copies wait, on the device, for `event` (its
     * record as it stands now), or when NULL for what `stream` holds now;
     * *mark (may be NULL) is then a mark done once that wait is over, so
     * that a caller can hold its copies back until then instead of
     * counting the engine's time against its own deadline.
     * KVD_ERR_INVALID for the host kind (nothing to wait for),
     * KVD_ERR_UNSUPPORTED for a stream being captured into a graph. */
    int (*after)(const kvd_memkind_t *k, void *stream, void *event, void **mark);
};

/* Ordinary host memory: memcpy, nothing to wait for. */
const kvd_memkind_t *kvd_memkind_host(void);

/* The calls through a kind. Only name, copy and sync are required: a kind
 * without copy_batch copies each; one without marks is never pending (it
 * must not be async); one without after refuses it (KVD_ERR_INVALID). */
int kvd_memkind_copy_batch(const kvd_memkind_t *k, const kvd_copy_t *v, size_t n,
                           bool into_region);
int kvd_memkind_mark(const kvd_memkind_t *k, void **mark);
int kvd_memkind_mark_query(const kvd_memkind_t *k, void *mark);
int kvd_memkind_mark_wait(const kvd_memkind_t *k, void *mark);
int kvd_memkind_mark_stream_wait(const kvd_memkind_t *k, void *mark, void *stream);
void kvd_memkind_mark_free(const kvd_memkind_t *k, void *mark);
int kvd_memkind_after(const kvd_memkind_t *k, void *stream, void *event, void **mark);

/* ------------------------------------------------------- device kinds
 *
 * CUDA (the driver API) and ROCm HIP, loaded at run time (dlopen) from
 * $KVDOCK_CUDA_LIBRARY, else libcuda.so.1; $KVDOCK_HIP_LIBRARY, else
 * libamdhip64.so.6, .so.5, .so: nothing links a GPU runtime, and a host
 * with neither runs everything else unchanged. Each call below that may
 * meet a missing runtime takes `why` (cap bytes, may be NULL) for the
 * reason in words.
 */
typedef enum kvd_gpu_runtime {
    KVD_GPU_CUDA = 1,
    KVD_GPU_HIP = 2,
} kvd_gpu_runtime_t;

/* "CUDA" or "HIP". */
const char *kvd_gpu_name(kvd_gpu_runtime_t rt);

/* A stream argument that names the runtime's legacy default stream (an
 * engine's handle 0, where NULL means none): kvdock.h's KVD_STREAM_LEGACY. */
#define KVD_GPU_STREAM_LEGACY ((void *)1)

/*
 * Loads rt once per process (later calls give the first outcome).
 * KVD_ERR_UNSUPPORTED: not built in; KVD_ERR_NO_DEVICE: the library is
 * missing, lacks a call kvdock needs, or sees no device.
 */
int kvd_gpu_load(kvd_gpu_runtime_t rt, char *why, size_t cap);

/* What rt says of a pointer. */
typedef struct kvd_gpu_pointer {
    bool device; /* device memory of rt */
    int ordinal; /* its device */
    /* the allocation it lies in (alloc_len 0: the runtime did not say) */
    uintptr_t alloc_base;
    uint64_t alloc_len;
    /* memory mapped piece by piece (CUDA's cuMemMap, as PyTorch's
     * expandable segments are), where the range above is one piece and
     * the next piece may follow it: not a cudaMalloc allocation */
    bool pieces;
} kvd_gpu_pointer_t;

/* KVD_OK (out filled: device false for memory rt does not know), or
 * kvd_gpu_load's errors. */
int kvd_gpu_pointer(kvd_gpu_runtime_t rt, const void *p, kvd_gpu_pointer_t *out,
                    char *why, size_t cap);

/*
 * A kind for rt's memory on device `ordinal`: a stream of its own (non-
 * blocking), events for marks, and a ring of pinned host slots through
 * which copies go whose host side is not pinned (kvd_gpu_pin); copies
 * whose host side is pinned go straight by DMA. Driven by one thread at a
 * time, but mark_stream_wait, mark_free and after may come from any
 * thread. KVD_ERR_NO_DEVICE, KVD_ERR_DEVICE (the runtime refused a
 * stream or the ring), KVD_ERR_NOMEM.
 */
int kvd_memkind_gpu_open(kvd_gpu_runtime_t rt, int ordinal, kvd_memkind_t **out,
                         char *why, size_t cap);
/* Syncs and frees k. NULL is fine. */
void kvd_memkind_gpu_close(kvd_memkind_t *k);

/* Bytes k moved by DMA and through its bounce ring. */
void kvd_memkind_gpu_counts(const kvd_memkind_t *k, uint64_t *dma_bytes,
                            uint64_t *bounce_bytes);

#define KVD_GPU_PIN_CHUNK (64ull << 30) /* bytes of one host registration at most */

/*
 * Registers host memory [base, base+len) with rt for DMA (page-locked;
 * usable from every device, registered through device `ordinal`), in
 * chunks of at most KVD_GPU_PIN_CHUNK, on the calling thread (0.1 s per GB
 * or so: callers run it in the background). `stop` (may be NULL) is
 * looked at between chunks. *pinned says how many bytes from base are
 * registered (also on failure: what was done stays until kvd_gpu_unpin).
 * Every kind of rt copies through the registered bytes by DMA from then
 * on. KVD_ERR_DEVICE (the runtime refused: why says), KVD_ERR_INVALID
 * (overlaps a range registered already), kvd_gpu_load's errors.
 */
int kvd_gpu_pin(kvd_gpu_runtime_t rt, int ordinal, void *base, uint64_t len,
                bool read_only, const _Atomic bool *stop, uint64_t *pinned, char *why,
                size_t cap);

/* Unregisters what kvd_gpu_pin registered from base; no copy may use it
 * any longer. */
void kvd_gpu_unpin(kvd_gpu_runtime_t rt, void *base);

/* True when [p, p+n) lies within memory registered with kvd_gpu_pin. */
bool kvd_gpu_pinned(kvd_gpu_runtime_t rt, const void *p, size_t n);

/* ---------------------------------------------------------- transfers */

typedef struct kvd_transport kvd_transport_t;
/* Local memory registered with one transport (kvd_transport_register). */
typedef struct kvd_region kvd_region_t;

/* One contiguous copy between a local region and the peer's region. */
typedef struct kvd_xfer {
    kvd_region_t *local;
    uint64_t local_offset; /* in local */
    uint64_t remote_offset;
    uint64_t length;
} kvd_xfer_t;

/* One finished batch: the cookie given to post and its status. */
typedef struct kvd_xfer_done {
    uint64_t cookie;
    int status;
} kvd_xfer_done_t;

/* ------------------------------------------------------------- peers */

/* How a ucx transport moves bytes to its peer. */
typedef enum kvd_ucx_mode {
    /* one-sided get/put on the peer's region: the peer's CPU is not
     * involved where the NIC does RMA (RDMA verbs) */
    KVD_UCX_MODE_RMA = 0,
    /* active messages the peer's worker serves (kvd_ucx_serve_messages):
     * for transports where UCX emulates RMA in software (TCP), which move
     * several times more this way */
    KVD_UCX_MODE_AM = 1,
} kvd_ucx_mode_t;

/*
 * The peer region a transport connects to. Each backend reads its part:
 * shm the mapping (which must stay mapped until the transport is
 * disconnected, connected elsewhere or destroyed), ucx the worker address,
 * rkey and base. The pointed-to bytes are copied by connect.
 */
typedef struct kvd_peer {
    uint64_t length; /* bytes of the peer's region */
    /* bound on reaching the peer (ucx: the endpoint's wire-up); 0: 5000 */
    int connect_timeout_ms;
    void *mapping; /* shm: the region, mapped in this process */
    struct {
        const void *address;
        size_t address_len;
        const void *rkey;
        size_t rkey_len;
        uint64_t base; /* the region's address in the peer */
        kvd_ucx_mode_t mode;
        /* the message mode's capability (KVD_UCX_CAP_BYTES), which every
         * request carries; the serving side answers only requests whose
         * capability it was granted (kvd_ucx_grant). RMA needs the rkey
         * instead; the message mode needs no rkey. */
        const void *cap;
        size_t cap_len;
    } ucx;
} kvd_peer_t;

/* ------------------------------------------------------------ backends */

/* Opens a shm transport (no peer yet). KVD_OK, KVD_ERR_NOMEM. */
int kvd_transport_open_shm(kvd_transport_t **out);

/*
 * Opens a ucx transport with a UCP context and worker of its own (`name`
 * shows in UCX's logs), no peer yet. UCX reads UCX_TLS, UCX_NET_DEVICES
 * etc. from the environment. KVD_ERR_UNAVAILABLE when UCX cannot start.
 * Connected, a READ batch is reported once every byte landed; a WRITE
 * batch once every byte is at the peer (RMA: an endpoint flush; messages:
 * the peer's acknowledgement). A peer that goes away fails the outstanding
 * batches and every later post (KVD_ERR_CLOSED). In the message mode, the
 * ranges of a WRITE batch that follow each other in the peer's region are
 * gathered into one message through a staging buffer of the transport's
 * (at most KVD_UCX_STAGE_BYTES in all), since many small messages cost
 * more than one copy on TCP.
 */
int kvd_transport_open_ucx(const char *name, kvd_transport_t **out);

/*
 * Wraps `inner` (which moves host memory only: ucx) so that regions of
 * device kinds can be registered too: their bytes pass through pinned host
 * slots registered with inner (READ: peer -> slot -> device; WRITE: device
 * -> slot -> peer), pipelined over a few slots. Host regions go to inner
 * as they are. The wrapper owns inner from then on (destroy destroys it).
 * A post that finds every slot busy drives what is outstanding until one
 * frees, for slot_wait_ms at most (then the batch fails KVD_ERR_TIMEOUT).
 * KVD_ERR_INVALID, KVD_ERR_NOMEM, inner's registration errors.
 */
int kvd_transport_open_staged(kvd_transport_t *inner, int slot_wait_ms,
                              kvd_transport_t **out);

/*
 * kvd_transport_open_ucx for one mode only, for a process that faces other
 * hosts (the linker, a daemon's peers): its worker listens on every
 * transport its context opens, and any peer that reaches one may send it
 * messages. So:
 *   - the message mode's context has no UCP_FEATURE_RMA, so that no peer
 *     can read or write this process through UCP's software RMA, and
 *     opens only the transports that reach another host
 *     (kvd_ucx_tl_network); it refuses to connect in RMA mode
 *     (KVD_ERR_INVALID);
 *   - the RMA mode's context opens only transports that enforce the
 *     registration in the NIC (kvd_ucx_tl_enforces_rma: rc, dc), where a
 *     peer can reach nothing but what this process registered for it.
 * KVD_ERR_UNSUPPORTED when no such transport is here (RMA on a host
 * without an RDMA NIC, or UCX_TLS naming none): the caller falls back to
 * the message mode.
 *
 * kvd_transport_open_ucx (both modes, every transport UCX opens) is for
 * tests and benchmarks against a server of their own: a peer that reaches
 * its worker over TCP or shared memory can read and write the process.
 */
int kvd_transport_open_ucx_mode(const char *name, kvd_ucx_mode_t mode,
                                kvd_transport_t **out);

/* The transport's worker address (what a peer that connects to it uses) and
 * the transports and devices its context opened ("tcp/lo,self/memory"), for
 * logs and tests. KVD_ERR_INVALID for a transport that is not ucx. */
int kvd_transport_ucx_info(kvd_transport_t *t, const void **address, size_t *address_len,
                           char *resources, size_t resources_cap);

#define KVD_UCX_STAGE_CHUNK (8ull << 20) /* bytes of one staged message at most */
#define KVD_UCX_STAGE_BYTES (4 * KVD_UCX_STAGE_CHUNK)

/* ------------------------------------------------------------ the calls */

typedef int (*kvd_transport_reg_fn)(kvd_transport_t *t, kvd_region_t *r);
typedef void (*kvd_transport_dereg_fn)(kvd_transport_t *t, kvd_region_t *r);
typedef int (*kvd_transport_connect_fn)(kvd_transport_t *t, const kvd_peer_t *peer);
typedef void (*kvd_transport_disconnect_fn)(kvd_transport_t *t);
typedef int (*kvd_transport_post_fn)(kvd_transport_t *t, kvd_xfer_dir_t dir,
                                     const kvd_xfer_t *xfers, size_t n, uint64_t cookie);
typedef int (*kvd_transport_poll_fn)(kvd_transport_t *t, kvd_xfer_done_t *done,
                                     size_t max, size_t *n_done);
typedef unsigned (*kvd_transport_progress_fn)(kvd_transport_t *t);
typedef void (*kvd_transport_destroy_fn)(kvd_transport_t *t);

typedef struct kvd_transport_ops {
    const char *name;
    /* post itself issues the copies through the regions' kinds (shm): a
     * kind's mark taken after post follows them. Otherwise they are issued
     * later (a staged transport's, once the wire brought the bytes). */
    bool copies_at_post;
    /* makes r (base, length, kind set) usable by the backend */
    kvd_transport_reg_fn reg;
    kvd_transport_dereg_fn dereg;
    /* replaces the peer; disconnect reports what was outstanding failed
     * and returns once the backend no longer touches local memory */
    kvd_transport_connect_fn connect;
    kvd_transport_disconnect_fn disconnect;
    /* called with a batch already checked against the regions */
    kvd_transport_post_fn post;
    kvd_transport_poll_fn poll;
    /* drives outstanding work; returns how many events it handled */
    kvd_transport_progress_fn progress;
    /* frees the backend's object; disconnected and with no region left */
    kvd_transport_destroy_fn destroy;
} kvd_transport_ops_t;

/* Every backend's object starts with this header. */
struct kvd_transport {
    const kvd_transport_ops_t *ops;
    uint64_t remote_length; /* the connected peer's region; 0: none */
    kvd_region_t *regions;  /* registered, for destroy */
};

/*
 * Registers [base, base+length) of memory of `kind` for transfers on t.
 * KVD_ERR_INVALID (NULL base, zero length, a range that wraps),
 * KVD_ERR_NOMEM, KVD_ERR_IO (the backend refused it: the log says why).
 */
int kvd_transport_register(kvd_transport_t *t, void *base, uint64_t length,
                           const kvd_memkind_t *kind, kvd_region_t **out);

/* Deregisters r; no batch of t may still use it. NULL is fine. */
void kvd_transport_deregister(kvd_transport_t *t, kvd_region_t *r);

/* The region's base and length as registered. */
void *kvd_region_base(const kvd_region_t *r);
uint64_t kvd_region_length(const kvd_region_t *r);

/*
 * Connects t to `peer`, replacing the peer it had (its outstanding batches
 * are reported failed first). KVD_ERR_INVALID for a peer description the
 * backend cannot use, KVD_ERR_UNAVAILABLE when the peer cannot be reached.
 * After a failure t is disconnected.
 */
int kvd_transport_connect(kvd_transport_t *t, const kvd_peer_t *peer);

/* Reports what is outstanding failed (KVD_ERR_CLOSED) and drops the peer;
 * returns once the backend no longer touches local memory for it. */
void kvd_transport_disconnect(kvd_transport_t *t);

/*
 * Posts a batch; its completion is reported once by poll with `cookie`.
 * KVD_ERR_INVALID when a transfer names a region of another transport or
 * leaves its region or the peer's (nothing moves then), KVD_ERR_CLOSED
 * when t has no peer (or it failed), KVD_ERR_NOMEM.
 */
int kvd_transport_post(kvd_transport_t *t, kvd_xfer_dir_t dir, const kvd_xfer_t *xfers,
                       size_t n, uint64_t cookie);

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
 * Waits until the batch `cookie` is reported and returns its status;
 * KVD_ERR_TIMEOUT after timeout_ms (the batch may still be running then:
 * disconnect before its memory is reused). A report already in kept is
 * taken from there. Other batches reported on the way are appended to
 * kept[*n_kept..cap) (beyond cap they are lost: size it for the batches
 * outstanding); kept may be NULL to drop them.
 */
int kvd_transport_wait(kvd_transport_t *t, uint64_t cookie, int timeout_ms,
                       kvd_xfer_done_t *kept, size_t *n_kept, size_t cap);

/* A lock a waiter takes around each look at the transport, for callers
 * that share it with another thread's occasional calls. */
typedef struct kvd_wait_lock {
    void (*lock)(void *ctx);
    void (*unlock)(void *ctx);
    void *ctx;
} kvd_wait_lock_t;

/* kvd_transport_wait taking `lk` (NULL: none) around each poll and
 * progress, never while it yields. */
int kvd_transport_wait_locked(kvd_transport_t *t, uint64_t cookie, int timeout_ms,
                              kvd_xfer_done_t *kept, size_t *n_kept, size_t cap,
                              const kvd_wait_lock_t *lk);

static inline bool kvd_transport_copies_at_post(const kvd_transport_t *t)
{
    return t->ops->copies_at_post;
}

static inline const char *kvd_transport_name(const kvd_transport_t *t)
{
    return t->ops->name;
}

/* Disconnects, deregisters every region left and destroys t; NULL is fine. */
void kvd_transport_destroy(kvd_transport_t *t);

/* Typed stubs for slots a backend does not support or need. */
int kvd_transport_reg_none(kvd_transport_t *t, kvd_region_t *r);
void kvd_transport_dereg_none(kvd_transport_t *t, kvd_region_t *r);
int kvd_transport_connect_unsupported(kvd_transport_t *t, const kvd_peer_t *peer);
void kvd_transport_disconnect_none(kvd_transport_t *t);
int kvd_transport_post_unsupported(kvd_transport_t *t, kvd_xfer_dir_t dir,
                                   const kvd_xfer_t *xfers, size_t n, uint64_t cookie);
int kvd_transport_poll_unsupported(kvd_transport_t *t, kvd_xfer_done_t *done, size_t max,
                                   size_t *n_done);
unsigned kvd_transport_progress_none(kvd_transport_t *t);

/* ------------------------------------------------------------------ UCX
 *
 * The serving side: one kvd_ucx_t is a UCP context and worker whose
 * memory peers reach. The daemon's UCX server maps its pool with
 * kvd_ucx_mem_map, describes it to peers by a packed rkey and the base
 * address, and serves the message mode from its progress.
 *
 * Threading: a kvd_ucx_t is driven by one thread at a time.
 */
typedef struct kvd_ucx kvd_ucx_t;
typedef struct kvd_ucx_mem kvd_ucx_mem_t;

/*
 * Creates the context and worker. `wakeup` asks for an event fd (the
 * daemon's epoll). KVD_ERR_UNAVAILABLE when UCX cannot start. With one-sided
 * RMA (UCP_FEATURE_RMA) and the message mode's handlers; see
 * kvd_ucx_create_with for a serving side that must not offer RMA.
 */
int kvd_ucx_create(const char *name, bool wakeup, kvd_ucx_t **out);

typedef struct kvd_ucx_opts {
    const char *name; /* shows in UCX's logs */
    bool wakeup;      /* an event fd (kvd_ucx_efd) */
    /* UCP_FEATURE_RMA. Without it UCP installs no handler for its software
     * get/put (the emulation of RMA over active messages), so a peer's
     * ucp_get_nbx/ucp_put_nbx over TCP or shared memory reaches nothing. */
    bool rma;
    /* UCX_NET_DEVICES for this context (NULL: UCX's own, from the
     * environment): which network devices it opens, and so listens on */
    const char *net_devices;
    /* a serving side facing peers it does not trust: indirect ids for
     * every endpoint and request on the wire (UCX_PROTO_INDIRECT_ID=on),
     * so a peer cannot name a pointer of ours in a protocol header */
    bool untrusted_peers;
    /* which transports the context may open, by name ("tcp"; NULL: any).
     * Those UCX_TLS (or UCX's own choice) would open beyond these are left
     * out before any interface exists (the worker is created only after:
     * a transport left out never listened), and named in dropped (cut at
     * dropped_cap; dropped may be NULL) as "tl/dev", comma separated.
     * KVD_ERR_UNSUPPORTED when nothing but self would be left. */
    bool (*tl_allowed)(const char *tl);
    char *dropped;
    size_t dropped_cap;
} kvd_ucx_opts_t;
int kvd_ucx_create_with(const kvd_ucx_opts_t *o, kvd_ucx_t **out);
void kvd_ucx_destroy(kvd_ucx_t *u);

/* The transports and devices the context opened, "tl/dev" each, comma
 * separated ("tcp/lo,posix/memory"), into buf (cut at cap). */
void kvd_ucx_resources(const kvd_ucx_t *u, char *buf, size_t cap);

/*
 * Whether every transport the context opened enforces a memory
 * registration in the NIC (rc_verbs, rc_mlx5, dc_mlx5; self, which only
 * this process reaches): only then may one-sided RMA be offered to peers.
 * Transports that emulate RMA in software (tcp, the shared-memory ones,
 * UD's put) write wherever a peer says. When false and why_not is given,
 * the first transport that does not enforce it ("tcp/lo").
 */
bool kvd_ucx_rma_enforced(const kvd_ucx_t *u, char *why_not, size_t cap);

/* Pure form of the above, for one transport name ("rc_mlx5"). */
bool kvd_ucx_tl_enforces_rma(const char *tl);
/* The transports that reach another host: those above, tcp and UD. Not
 * UCX's shared-memory ones (posix, sysv, cma, knem, xpmem): a peer that
 * claims to share this host makes the context attach the segment, or
 * read and write the memory of the process, that its address names. */
bool kvd_ucx_tl_network(const char *tl);

/* For a serving side facing strangers: UCX's own warnings of a message
 * for which no handler is installed (what a peer's software RMA brings to a
 * context without RMA, each with a hex dump of its payload) are let
 * through a few a minute; the rest are counted and summed up in one line.
 * Process-wide; call before creating contexts. */
void kvd_ucx_quiet_strangers(void);

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

/* Serves message-mode requests (KVD_UCX_MODE_AM) for the region m on u's
 * worker, from its progress. A request is served only when it carries a
 * capability granted (kvd_ucx_grant) and lives within its grant's range
 * (and m), and a write only when the grant allows writes; every other one
 * is answered with an error (KVD_ERR_AUTH: no live capability, a write
 * of a read-only one, or of a windowed one outside its open windows;
 * KVD_ERR_INVALID: outside the range) and moves no
 * byte. KVD_ERR_INVALID, KVD_ERR_IO. */
int kvd_ucx_serve_messages(kvd_ucx_t *u, const kvd_ucx_mem_t *m);

/* Serves the message mode for [base, base+len) without a memory
 * registration (nothing one-sided is offered on it). */
int kvd_ucx_serve_region(kvd_ucx_t *u, void *base, uint64_t len);

#define KVD_UCX_CAP_BYTES 16 /* a capability: random bytes (getrandom) */

/* What a capability allows: [offset, offset+length) of the served region,
 * writes unless read_only; with windowed, writes only within its open
 * windows (kvd_ucx_window_open: the daemon opens one per reservation
 * lease, so a writer reaches only what it reserved and only while it
 * holds it). conn_id is for the log. */
typedef struct kvd_ucx_grant {
    uint8_t cap[KVD_UCX_CAP_BYTES];
    bool read_only;
    bool windowed;
    uint64_t offset, length;
    uint64_t conn_id;
} kvd_ucx_grant_t;

/* Grants g (replacing a grant of the same capability, and its windows).
 * KVD_ERR_NOMEM. */
int kvd_ucx_grant(kvd_ucx_t *u, const kvd_ucx_grant_t *g);

/* One range of the served region. */
typedef struct kvd_ucx_range {
    uint64_t offset, length;
} kvd_ucx_range_t;

/* Opens n write windows of a windowed grant under `tag` (the lease they
 * belong to): ranges within the grant's range, not overlapping each other
 * or an open window (those of the pool's allocator never do). Ranges that
 * touch are joined, so a write may cross from one into the next. KVD_OK;
 * KVD_ERR_NOT_FOUND (no such grant), KVD_ERR_INVALID (a range outside the
 * grant or over an open window: none is opened), KVD_ERR_NOMEM. */
int kvd_ucx_window_open(kvd_ucx_t *u, const uint8_t cap[KVD_UCX_CAP_BYTES], uint64_t tag,
                        const kvd_ucx_range_t *r, size_t n);
/* Closes every window of `tag` of the grant: later writes there are
 * refused. The number closed. */
size_t kvd_ucx_window_close(kvd_ucx_t *u, const uint8_t cap[KVD_UCX_CAP_BYTES],
                            uint64_t tag);
/* Revokes a capability; true when it was granted. */
bool kvd_ucx_revoke(kvd_ucx_t *u, const uint8_t cap[KVD_UCX_CAP_BYTES]);
/* Live grants. */
size_t kvd_ucx_grants(const kvd_ucx_t *u);

/* Called, once per request, when a request names a capability not
 * granted, before it is refused: the daemon's UCX server reads the grants
 * its parent sent meanwhile. NULL: none. */
void kvd_ucx_on_unknown_cap(kvd_ucx_t *u, void (*fn)(void *arg), void *arg);

/* Requests refused so far, by reason. */
typedef struct kvd_ucx_refused {
    uint64_t malformed; /* not a request of this protocol */
    uint64_t no_cap;    /* no live capability */
    uint64_t read_only; /* a write with a read-only grant */
    uint64_t range;     /* outside the grant's range or the region */
    uint64_t window;    /* a write of a windowed grant outside its windows */
} kvd_ucx_refused_t;
void kvd_ucx_refused(const kvd_ucx_t *u, kvd_ucx_refused_t *out);

/* True when [offset, offset+length) lies inside a region of region_len. */
static inline int kvd_range_ok(uint64_t offset, uint64_t length, uint64_t region_len)
{
    return offset <= region_len && length <= region_len - offset;
}

#endif /* KVD_TRANSPORT_H */
