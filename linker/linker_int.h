/*
 * linker_int.h - libkvdock's internals. Private to linker/.
 *
 * The parts, each a file with one owner of its state, calling only down
 * this list (no two files call each other):
 *   linker.c   the front: open and close, pools, lookups, counters
 *   load.c     LOAD / PREPARE / COMMIT / ABORT, layer-wise batches and
 *              the load thread that copies them
 *   offload.c  offload jobs and the offload thread
 *   datapath.c one thread's data path: its transport (kvd_transport), the
 *              pools' regions on it, gathering copies into batches
 *   conn.c     the daemon connection: Hello, RPCs, reconnection, epochs,
 *              the peer region of each connection (the pool mapping or
 *              the daemon's UCX worker) and its population
 *   xfer.c     a transfer's owned copy, and one key's rows through a
 *              data path (what loads and offloads share)
 *   queue.c    the completion queues
 *   lock.c     the lock-order check
 *   store_client.c  the operator's store client (kvd_store_*): its own
 *              connection; it shares only lk_set_last_error with the rest
 *
 * Threads: engine threads call the public functions; the load thread runs
 * committed load batches layer group by layer group; the offload thread
 * runs offload jobs; after a reconnection a populating thread write-faults
 * the new pool mapping. The load and offload threads have a data path
 * each (their own transport, their own UCX worker), so neither ever waits
 * for the other's bytes.
 *
 * Locks, in the only order they may be taken (a thread holding one takes
 * only locks further down; debug builds assert it, lock.c):
 *   1. conn.connect  (re)connecting: Hello, and listing a new pool; held
 *                  across a Hello, so taken with the call's deadline
 *                  (lk_lock_until)
 *   2. dp->mutex   one call on a data path's transport: its thread's
 *                  connect, post, poll, disconnect, and pool registration
 *                  adding regions. Never two at once, never across a
 *                  batch's wait (a UCX connect waits for its wire-up under
 *                  it, within the linker's timeout).
 *   3. conn.state  the view of the connection other threads read without
 *                  waiting for an RPC: epoch, whether it is up, its peer
 *   4. lock        pools, loads, batches, jobs, queues, counters
 * Condition variables wait on `lock` only. No thread spins or sleeps while
 * it holds a lock: the waits that poll (the load thread for a start,
 * kvd_wait_layer for its layer, a data path for its batch) take a lock
 * for one look at a time.
 * RPCs hold no linker lock: any number run at once on the connection's
 * session (conn.c), so a load's Release never queues behind an engine's
 * call. A reconnection takes connect and, for a moment, state; the
 * transfer threads never hold either while they copy, so it cannot be
 * starved by them, and they pick the new peer up at their next step; a
 * call bound to the old connection fails at once instead of waiting.
 */
#ifndef KVD_LINKER_INT_H
#define KVD_LINKER_INT_H

#include "kvd_common.h"
#include "kvd_proto.h"
#include "kvd_transport.h"
#include "kvdock.h"

#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

/* ------------------------------------------------------------ locks */

enum lk_rank { LK_RANK_CONNECT = 1, LK_RANK_DP = 2, LK_RANK_STATE = 3, LK_RANK_LOCK = 4 };

typedef struct lk_mutex {
    pthread_mutex_t m;
    enum lk_rank rank;
} lk_mutex_t;

void lk_mutex_init(lk_mutex_t *m, enum lk_rank rank);
void lk_mutex_destroy(lk_mutex_t *m);
/* Takes m; in debug builds asserts that this thread holds no lock of m's
 * rank or a later one. */
void lk_lock(lk_mutex_t *m);
/* lk_lock, giving up at deadline_ns (kvd_now_ns): false then, m not
 * taken. For a lock that may be held across a round trip (connect). */
bool lk_lock_until(lk_mutex_t *m, uint64_t deadline_ns);
void lk_unlock(lk_mutex_t *m);
void lk_cond_wait(pthread_cond_t *c, lk_mutex_t *m);
/* false when `until` (CLOCK_REALTIME) passed */
bool lk_cond_timedwait(pthread_cond_t *c, lk_mutex_t *m, const struct timespec *until);

/* ------------------------------------------------------------ pools */

enum { LK_DP_LOAD = 0, LK_DP_OFFLOAD = 1, LK_DP_COUNT = 2 };

/* A registered device pool. Entries never move once added; what is set
 * before it is listed (everything but the counters) never changes. */
typedef struct lpool {
    kvd_pool_desc_t desc;     /* layers and name point at the copies below */
    kvd_pool_layer_t *layers; /* owned copy */
    char name[64];
    char ns_name[KVD_NS_NAME_BYTES];
    uint32_t ns_id; /* in the daemon we are connected to (under lock) */
    uint64_t object_bytes;
    uint32_t rows; /* rows of one object: page_size or 1 */
    /* device kinds: the runtime and device of its buffers (rt 0: host) */
    kvd_gpu_runtime_t rt;
    int ordinal;
    /* the kind its buffers are copied through on each data path (a
     * device kind is the data path's own: its stream) */
    const kvd_memkind_t *kinds[LK_DP_COUNT];
    uint64_t *layer_off; /* where each layer starts inside an object */
    uint32_t n_buffers;  /* over all layers */
    uint32_t *buffer0;   /* layer i's buffers are regions buffer0[i]... */
    /* each buffer as a region of each data path's transport */
    kvd_region_t **regions[LK_DP_COUNT];
    _Atomic uint64_t lookup_hit_pages, load_bytes, offload_bytes;
    _Atomic uint64_t load_failures, offload_failures;
    /* device kinds: bytes whose pool side was pinned (DMA) or not (the
     * bounce ring), counted as they are issued */
    _Atomic uint64_t dma_bytes, bounce_bytes;
} lpool_t;

/* The extent of one buffer of a pool: every row, from the first to the
 * last byte. */
static inline uint64_t lk_buffer_extent(const kvd_pool_desc_t *d,
                                        const kvd_pool_buffer_t *b)
{
    return (d->n_rows - 1) * b->row_stride + b->bytes_per_row;
}

/* ------------------------------------------------------- connection */

/* What one connection's bytes move to: the pool mapped here (shm), or the
 * daemon's UCX worker and pool. Counted: the connection holds a reference
 * while it is current, each data path while connected to it, the
 * populating thread while it works; the last one unmaps. */
typedef struct lpeer {
    _Atomic int refs;
    uint64_t epoch;
    kvd_peer_t desc;
    void *map;          /* shm: the mapping, desc.mapping */
    bool read_only;     /* shm: mapped PROT_READ (the daemon's descriptor) */
    uint8_t *ucx_bytes; /* ucx: the address and the rkey, copied */
    /* shm, per device runtime (index kvd_gpu_runtime_t): the mapping is
     * registered with it whole (pinned), or registration was tried
     * (pin_tried: not again). Written by the preparing thread while it
     * holds a reference; the last reference unregisters what was. */
    _Atomic bool pinned[3];
    bool pin_tried[3];
    bool pin_any[3]; /* some of it registered: kvd_gpu_unpin at the end */
    bool populated;  /* write-faulted whole (at open, or by the thread) */
} lpeer_t;

/* One connection: its client, shared by every call on it, each holding a
 * reference; the last closes it. */
typedef struct lsession {
    _Atomic int refs;
    kvd_client_t *client;
    uint64_t epoch;
    /* why it stopped being current (the first reason), KVD_OK until then:
     * a call that fails because another one's timeout shut it down says
     * KVD_ERR_TIMEOUT too */
    _Atomic int dropped;
} lsession_t;

typedef struct lconn {
    lk_mutex_t connect;
    uint64_t lease_ttl_ms; /* the connected daemon's (written under connect and state) */
    /* its limits on one request, from its Hello (likewise): items of a
     * batch (--max-batch) and bytes of a frame (--max-frame) */
    uint64_t max_batch, max_frame_bytes;
    lk_mutex_t state;
    /* bumped at every (re)connection, under state with the peer: a lease
     * or an offset belongs to one epoch */
    _Atomic uint64_t epoch;
    lsession_t *session; /* the current connection, under state; NULL none */
    lpeer_t *peer;       /* its peer, under state; NULL none */
    /* a data path failed on this epoch: the next call reconnects */
    _Atomic uint64_t failed_epoch;
    /* Until when (kvd_now_ns) the daemon counts as hung: set to now +
     * timeout_ms whenever a call or a Hello timed out. Meanwhile a call
     * that has no connection fails at once with KVD_ERR_TIMEOUT instead of
     * connecting: a stopped daemon's kernel still accepts connections, so
     * every attempt would wait out a whole timeout, and the calls queued
     * behind it one each. The first call after it tries again. */
    _Atomic uint64_t hung_until_ns;
    /* This linker among its process's writers (HelloRequest.writer_token,
     * random), and the epoch whose reservations an offload copies into now
     * (0 none): a Hello says its earlier connections' copies are over only
     * while none is (lk_copy_begin; the daemon holds a lost connection's
     * reservations until then). */
    uint64_t writer_token;
    _Atomic uint64_t copy_epoch;
    pthread_t pop_thread; /* prepares a new mapping; pop_* under lock */
    bool pop_started, pop_running;
    /* device runtimes whose pools are registered (bit rt), each with the
     * device to register through (under lock): the preparing thread pins
     * every mapping for them */
    uint32_t pin_rts;
    int pin_ordinal[3];
    /* closing, or the mapping being registered was replaced: the
     * registration stops between chunks (cleared before each one starts,
     * unless closing) */
    _Atomic bool pin_stop;
} lconn_t;

/* -------------------------------------------------------- data path */

/* Batches in flight on one data path, and the bytes gathered into one. */
#define LK_DP_WINDOW      4
#define LK_DP_BATCH_BYTES (8ull << 20)
/* An offload's batches over shm: a copy at post time, so a load that
 * starts meanwhile waits for at most this much of it */
#define LK_DP_SHM_OFFLOAD_BATCH_BYTES (2ull << 20)
/* How long an offload batch waits at most for the loads being copied
 * (then it goes anyway, so that a stream of loads cannot starve it). */
#define LK_DP_YIELD_NS (2ull * 1000000)

typedef struct ldp_flight {
    uint64_t cookie, bytes;
} ldp_flight_t;

/* A device kind of one data path: the data path's own stream on that
 * device. */
typedef struct ldp_kind {
    kvd_gpu_runtime_t rt;
    int ordinal;
    kvd_memkind_t *kind;
} ldp_kind_t;

#define LK_DP_KINDS 4 /* device kinds of one data path (kvd_kind_set_t's bound) */

typedef struct ldp {
    int index; /* LK_DP_LOAD or LK_DP_OFFLOAD: which pool regions are its */
    kvd_xfer_dir_t dir;
    uint64_t batch_bytes; /* gathered bytes that make a batch */
    lk_mutex_t mutex;
    kvd_transport_t *t;
    lpeer_t *peer; /* what t is connected to (a reference); NULL none */
    uint64_t next_cookie;
    kvd_xfer_t *v; /* gathered, not posted yet */
    size_t n, cap;
    uint64_t gathered_bytes;
    ldp_flight_t flight[LK_DP_WINDOW]; /* posted, oldest first */
    size_t n_flight;
    kvd_xfer_done_t kept[LK_DP_WINDOW];
    size_t n_kept;
    int error; /* the step's first failure */
    /* its device kinds, opened by pool registration (under mutex), closed
     * with it; read by its thread and by engine threads (marks, waits) */
    ldp_kind_t kinds[LK_DP_KINDS];
    _Atomic size_t n_kinds;
} ldp_t;

/* -------------------------------------------------- loads, offloads */

/* One transfer of a load or an offload, with its own copies of the arrays. */
typedef struct lxfer {
    uint32_t pool;
    size_t n_keys;
    kvd_key_t *keys;
    int64_t *idx;
    size_t n_idx;
    uint32_t first_depth;
    uint32_t *depths; /* NULL: first_depth + i */
    bool has_prior;
    kvd_key_t prior;
    /* read leases of a load's pins: one per Acquire its keys went in (a
     * daemon's batch limit splits them), each 0 when none */
    uint64_t *leases;
    uint32_t n_leases;
    uint64_t asked_ns;   /* when the leases were asked for (their TTL began later) */
    uint64_t epoch;      /* of the connection that granted leases or offsets */
    uint64_t *offsets;   /* where each key's object is (loads) */
    uint32_t begin, end; /* keys to copy, after COMMIT */
    bool dropped;        /* COMMIT dropped it (mamba_exist) */
} lxfer_t;

/* LOAD_FAILED: kvd_load could not pin; kept (without pins) for ABORT.
 * PINNING: recorded (so a second LOAD of the rid is refused) while its
 * pins are taken; nothing but that LOAD may touch it then. */
enum load_state {
    LOAD_PINNING = 1,
    LOAD_PINNED,
    LOAD_PREPARED,
    LOAD_COMMITTED,
    LOAD_FAILED
};

typedef struct lload {
    uint64_t rid;
    enum load_state state;
    size_t n;
    lxfer_t *x;
    bool failed; /* its pins lapsed (connection lost): fail, do not copy */
    struct lload *next;
} lload_t;

/* The marks of one layer group: done once its copies through each device
 * kind of the load data path are. */
typedef struct lgroup_marks {
    size_t n;
    const kvd_memkind_t *kinds[LK_DP_KINDS];
    void *marks[LK_DP_KINDS];
} lgroup_marks_t;

/* A batch of committed loads, copied layer group by layer group. */
typedef struct lbatch {
    uint32_t counter;
    lload_t *loads;
    uint32_t n_layers;
    uint32_t *layer_ids; /* sorted, unique */
    uint32_t layers_done;
    /* layers whose copies are issued, and each group's marks (NULL until
     * the batch runs; kvd_stream_wait_layer queues waits on them) */
    uint32_t layers_issued;
    lgroup_marks_t *groups;
    uint32_t n_groups;
    int error; /* the first failure; the rest of the layers fail */
    bool finished;
    struct lbatch *next;
} lbatch_t;

typedef struct ljob {
    uint64_t ack;
    size_t n;
    lxfer_t *x;
    /* kvd_offload_after: done once the engine's work it waits for is; the
     * offload thread starts the job's copies after them */
    lgroup_marks_t after;
    struct ljob *next;
} ljob_t;

/* A growable queue of completions. */
typedef struct lqueue {
    kvd_completion_t *items;
    size_t n, cap;
    size_t reserved; /* completions promised room (n + reserved <= cap) */
} lqueue_t;

/* ----------------------------------------------------------- linker */

struct kvd_linker {
    kvd_linker_config_t cfg; /* its strings point at the copies below */
    char socket_path[108], connect[128], client_name[64], model_id[128];
    uint8_t auth_token[KVD_TOKEN_MAX]; /* sent in every Hello; none: len 0 */
    size_t auth_token_len;
    int timeout_ms;
    bool use_ucx;
    kvd_ucx_mode_t ucx_mode;

    lconn_t conn;
    ldp_t dp[LK_DP_COUNT];

    lk_mutex_t lock;
    pthread_cond_t cond;      /* progress, completions, starts */
    pthread_cond_t jobs_cond; /* an offload job queued, or stop */
    lpool_t pools[KVD_MAX_POOLS];
    uint32_t n_pools;
    /* the connection whose namespace ids the pools hold (set with them) */
    uint64_t ns_epoch;
    lload_t *loads;    /* pinned, prepared, committed-not-started */
    lbatch_t *batches; /* started, oldest first, finished ones kept a while */
    ljob_t *jobs, *jobs_tail;
    lqueue_t done_loads, done_offloads;
    uint32_t next_counter;
    /* the newest counter of a failed batch already forgotten (0: none): a
     * late wait on a forgotten counter up to it cannot be told "in place" */
    uint32_t forgot_failed_max;
    uint64_t next_ack;
    /* the load thread polls `kick` (bumped by each start) instead of
     * sleeping until spin_until_ns (under lock), set by kvd_load; layer
     * waiters poll `progress` (bumped by each group in place, each batch
     * ended) for spin_ns before they sleep */
    uint64_t spin_ns, spin_until_ns;
    _Atomic uint32_t kick;
    _Atomic uint64_t progress;
    /* load batches started and not copied yet (from their start, the load
     * thread's pickup included), and until when a load is expected (set
     * by kvd_load): the offload thread yields to them between its batches
     * (datapath.c) */
    _Atomic int loads_copying;
    _Atomic uint64_t load_coming_until_ns;
    bool stop;
    pthread_t thread, off_thread; /* loads, offloads */
    bool thread_started, off_thread_started;
};

/* ------------------------------------------------------------ conn.c */

/* Sets up the connection's locks; no I/O. */
void lk_conn_init(kvd_linker_t *l);
/* Connects (Hello with every registered pool's namespace). */
int lk_conn_open(kvd_linker_t *l);
/* Closes the connection, drops the peer, joins the populating thread. */
void lk_conn_close(kvd_linker_t *l);
/* Has every pool mapping, this one and those after a reconnection, pinned
 * for device runtime rt (registered through device `ordinal`), in the
 * background; best effort: until then, or where it fails, device copies
 * go through the bounce ring (logged). */
void lk_conn_pin(kvd_linker_t *l, kvd_gpu_runtime_t rt, int ordinal);
/* Whether the current mapping is pinned for rt. */
bool lk_conn_pinned(kvd_linker_t *l, kvd_gpu_runtime_t rt);

/* Deadlines: every call below ends by its deadline (kvd_now_ns), waits
 * for `connect` and for the client included; an engine's call takes one
 * deadline at its start for all the round trips it makes, so that the
 * whole call is bounded by timeout_ms. lk_deadline: now + timeout_ms. */
uint64_t lk_deadline(const kvd_linker_t *l);

/* n requests in one round trip. on_epoch 0: on the connection,
 * (re)connecting first when there is none; otherwise only on the
 * connection of that epoch, and KVD_ERR_CLOSED at once without sending
 * when it is gone (a lease or reservation id of a dead daemon can name
 * one of ours on a restarted one). KVD_OK when every reply came, each
 * reps[i].status its own; else nothing was sent, or the connection failed
 * and is dropped. *epoch (may be NULL) says which connection served it. */
int lk_call_many(kvd_linker_t *l, kvd_msg_t *reqs, kvd_msg_t *reps, size_t n,
                 uint64_t on_epoch, uint64_t *epoch, uint64_t deadline);

/* The reason for the calling thread's last failed libkvdock call
 * (kvd_last_error): every public function clears it on entry, and the first
 * reason recorded during the call stays (a daemon's error text, the
 * refusal of a Hello). Thread-local: the load and offload threads never
 * overwrite an engine thread's reason. */
void lk_clear_last_error(void);
void lk_set_last_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Writes the namespace ids of the pools into reqs[0..n) (called with lock
 * held, the ids those of connection l->ns_epoch). */
typedef void (*lk_ns_fill_fn)(kvd_linker_t *l, void *ctx, kvd_msg_t *reqs, size_t n);
/* n requests that name namespaces by id: the ids are filled in for one
 * connection and the requests go to that one only (ids differ between a
 * daemon and its successor: another rank's namespace may have ours), once
 * more when it changed meanwhile. Otherwise as lk_call_many, on_epoch 0. */
int lk_call_ns(kvd_linker_t *l, lk_ns_fill_fn fill, void *ctx, kvd_msg_t *reqs,
               kvd_msg_t *reps, size_t n, uint64_t *epoch, uint64_t deadline);
/* One request: the transport's failure or the reply's status. */
int lk_call_ex(kvd_linker_t *l, kvd_msg_t *req, kvd_msg_t *rep, uint64_t on_epoch,
               uint64_t *epoch, uint64_t deadline);
/* lk_call_ex on the connection, within timeout_ms from now. */
int lk_call(kvd_linker_t *l, kvd_msg_t *req, kvd_msg_t *rep);
/* Connects when there is no connection; its epoch, 0 when that failed. */
uint64_t lk_conn_ensure(kvd_linker_t *l, uint64_t deadline, int *rc);

/* The most items (of at most item_bytes each on the wire) one request
 * may carry to the current daemon: its batch limit, and what fits in its
 * frame limit. Requests above it are split (nothing valid is refused for
 * its size); at least 1. */
size_t lk_batch_limit(kvd_linker_t *l, size_t item_bytes);

/* Whether the read leases of x[0..n) provably still stand: each of the
 * current connection, a Unix socket, asked for less than half the
 * daemon's lease TTL ago, and the connection still open and quiet (a
 * daemon that ends leases by closing the connection shows it there at
 * once). When true, the bytes copied under them are the objects' and
 * their Release may come after. */
bool lk_leases_standing(kvd_linker_t *l, const lxfer_t *x, size_t n);

/* The current peer with a reference (NULL: none); lk_peer_put drops it. */
lpeer_t *lk_peer_get(kvd_linker_t *l);
void lk_peer_put(lpeer_t *p);
/* The bytes of the pool of the connection of `epoch`; 0 when that is not
 * the current connection. */
uint64_t lk_conn_pool_bytes(kvd_linker_t *l, uint64_t epoch);
/* Lists p as *pool_id if the connection of `epoch` (whose namespace id p
 * carries) is still current, so that every later Hello lists it too:
 * KVD_ERR_CLOSED when it is not, KVD_ERR_NO_SPACE when the table is full. */
int lk_conn_add_pool(kvd_linker_t *l, uint64_t epoch, const lpool_t *p, uint32_t *pool_id,
                     uint64_t deadline);
/* A data path failed on epoch's peer: that connection is void (its pins
 * and offsets with it) and the next call reconnects. */
void lk_conn_fail(kvd_linker_t *l, uint64_t epoch);
/* An offload copy into reservations of the connection of `epoch` begins:
 * false, and nothing may be copied, when that connection is gone already.
 * Until lk_copy_end no Hello says that earlier copies are over; a copy
 * under way looks at lk_copy_live between its objects and abandons the
 * rest once its connection is gone. One copy at a time (the offload
 * thread's). */
bool lk_copy_begin(kvd_linker_t *l, uint64_t epoch);
bool lk_copy_live(kvd_linker_t *l, uint64_t epoch);
void lk_copy_end(kvd_linker_t *l);

/* --------------------------------------------------------- datapath.c */

int lk_dp_open(kvd_linker_t *l, ldp_t *dp, int index);
/* Destroys the transport (its regions with it); the thread has ended. */
void lk_dp_close(ldp_t *dp);
/* Registers every buffer of p on dp's transport (p->regions[dp->index]). */
int lk_dp_register(ldp_t *dp, lpool_t *p);
/* Frees p's region table of dp after the transport is gone, or
 * deregisters them when it is still open. */
void lk_dp_unregister(ldp_t *dp, lpool_t *p);
/* Starts a step of copies: connects to the current peer if needed. Returns the peer's
 * epoch, 0 when there is none (the step's copies then fail with KVD_ERR_CLOSED). */
uint64_t lk_dp_begin(kvd_linker_t *l, ldp_t *dp);
/* Adds `bytes` from offset `off` of region r and `pool_off` of the peer's
 * region; adjacent ones merge, a full batch is posted (at most
 * LK_DP_WINDOW in flight). */
int lk_dp_add(kvd_linker_t *l, ldp_t *dp, kvd_region_t *r, uint64_t off,
              uint64_t pool_off, uint64_t bytes);
/* Posts what is gathered and waits for every batch of the step. */
int lk_dp_flush(kvd_linker_t *l, ldp_t *dp);
/* Posts what is gathered; returns the step's error. The cookie of the
 * last batch posted is dp->next_cookie. */
int lk_dp_post(kvd_linker_t *l, ldp_t *dp);
/* Waits for the step's batches up to `cookie`. */
int lk_dp_wait_upto(kvd_linker_t *l, ldp_t *dp, uint64_t cookie);
/* dp's kind for memory of runtime rt on device `ordinal`, opened on first
 * use (its stream, its bounce ring). KVD_ERR_NO_SPACE past LK_DP_KINDS;
 * kvd_memkind_gpu_open's errors, why says. */
int lk_dp_device_kind(ldp_t *dp, kvd_gpu_runtime_t rt, int ordinal,
                      const kvd_memkind_t **out, char *why, size_t cap);
/* A mark of each of dp's device kinds into m (nothing where it has
 * none). On failure what was marked is freed. */
int lk_dp_mark(ldp_t *dp, lgroup_marks_t *m);
void lk_dp_marks_free(lgroup_marks_t *m);
/* Ends the step: what is gathered and not flushed is dropped, what is in
 * flight ends first. */
void lk_dp_end(kvd_linker_t *l, ldp_t *dp);

/* ----------------------------------------------------------- queue.c */

/* Promises room for `more` completions, so that pushing them cannot fail;
 * each push uses up one promise. Caller holds lock. */
int lk_queue_reserve(lqueue_t *q, size_t more);
void lk_queue_push(lqueue_t *q, uint64_t id, bool success);
/* Takes up to max completions, oldest first. Caller holds lock. */
size_t lk_queue_pop(lqueue_t *q, kvd_completion_t *out, size_t max);
void lk_queue_free(lqueue_t *q);

/* ------------------------------------------------------------ xfer.c */

void lk_xfer_free(lxfer_t *x, size_t n);
/* Whether x holds a read lease. */
bool lk_xfer_pinned(const lxfer_t *x);
/* Copies the caller's transfers into owned arrays after checking their
 * shape against the pools; takes lock. */
int lk_xfers_copy(kvd_linker_t *l, const kvd_transfer_t *t, size_t n, lxfer_t **out);
/* Moves key i's layers [l0, l1) of transfer x of pool p through dp; adds
 * the bytes to *moved. Inside a data-path step. */
int lk_copy_key(kvd_linker_t *l, ldp_t *dp, const lpool_t *p, const lxfer_t *x,
                uint32_t i, uint32_t l0, uint32_t l1, uint64_t *moved);

/* ------------------------------------------------------------ load.c */

void *lk_load_thread_main(void *arg);
/* Closing: batches never run complete as failed, uncommitted loads end. */
void lk_loads_fail_pending(kvd_linker_t *l);

/* --------------------------------------------------------- offload.c */

void *lk_offload_thread_main(void *arg);
/* Closing: jobs never run complete as failed. */
void lk_offloads_fail_pending(kvd_linker_t *l);

#endif
