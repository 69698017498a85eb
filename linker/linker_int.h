/*
 * linker_int.h - libkvdock's internals shared by its files. Private to
 * linker/.
 *
 * Threading: engine threads call the public functions; a load thread runs
 * committed load batches layer by layer, and an offload thread runs
 * offload jobs, so that no load waits behind an offload. `lock` guards
 * every list and counter below it; `rpc` serialises calls on the one
 * daemon connection; `map` (a rwlock) keeps the pool mapping and the UCX
 * endpoint alive while copies use them (a reconnect replaces both under
 * the write lock); `xport_lock` lets one of the two threads at a time post
 * and wait on the endpoint (UCX's worker is serialised), a batch at a
 * time. Completions wake waiters through `cond`.
 */
#ifndef KVD_LINKER_INT_H
#define KVD_LINKER_INT_H

#include "devmem.h"
#include "kvd_common.h"
#include "kvd_proto.h"
#include "kvd_transport.h"
#include "kvdock.h"

#include <pthread.h>
#include <stdatomic.h>

/* Half of the staging buffer of offloads in the UCX message mode (see
 * transfer.c): 16 MiB per linker, made on the first such offload. */
#define KVD_LINKER_STAGE_HALF (8u << 20)
/* Pools one Lookup may name: the daemon's limit (a protocol constant). */
#define KVD_LOOKUP_POOLS_MAX 16

/* A registered device pool. */
typedef struct lpool {
    kvd_pool_desc_t desc;     /* layers point at `layers` below */
    kvd_pool_layer_t *layers; /* owned copy */
    char name[64];
    char ns_name[KVD_NS_NAME_BYTES];
    uint32_t ns_id; /* in the daemon we are connected to */
    uint64_t object_bytes;
    uint32_t rows;               /* rows of one object: page_size or 1 */
    const kvd_devmem_ops_t *dev; /* how its buffers are copied */
    kvd_ucx_mem_t **mems;        /* ucx: each buffer mapped, for its handle */
    uint32_t n_mems;
    _Atomic uint64_t lookup_hit_pages, load_bytes, offload_bytes;
    _Atomic uint64_t load_failures, offload_failures;
} lpool_t;

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
    uint64_t lease;      /* read lease of a load's pins; 0 none */
    uint64_t asked_ns;   /* when the lease was asked for (its TTL began later) */
    uint64_t epoch;      /* of the connection that granted lease or offsets */
    uint64_t *offsets;   /* where each key's object is (loads) */
    uint32_t begin, end; /* keys to copy, after COMMIT */
    bool dropped;        /* COMMIT dropped it (mamba_exist) */
} lxfer_t;

/* LOAD_FAILED: kvd_load could not pin; kept (without pins) for ABORT. */
/* PINNING: recorded (so a second LOAD of the rid is refused) while its
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

/* A batch of committed loads, copied layer group by layer group. */
typedef struct lbatch {
    uint32_t counter;
    lload_t *loads;
    uint32_t n_layers;
    uint32_t *layer_ids; /* sorted, unique */
    uint32_t layers_done;
    int error; /* the first failure; the rest of the layers fail */
    bool finished;
    struct lbatch *next;
} lbatch_t;

typedef struct ljob {
    uint64_t ack;
    size_t n;
    lxfer_t *x;
    struct ljob *next;
} ljob_t;

/* A growable queue of completions. */
typedef struct lqueue {
    kvd_completion_t *items;
    size_t n, cap;
    size_t reserved; /* completions promised room (n + reserved <= cap) */
} lqueue_t;

struct kvd_linker {
    kvd_linker_config_t cfg;
    char socket_path[108], connect[128], client_name[64], model_id[128];
    int timeout_ms;

    pthread_mutex_t rpc; /* the connection */
    kvd_client_t *client;
    uint64_t lease_ttl_ms; /* the connected daemon's (under rpc) */
    /* bumped at every (re)connection, under the map write lock together
     * with the mapping: a lease or an offset belongs to one epoch */
    _Atomic uint64_t epoch;

    pthread_rwlock_t map;
    uint8_t *pool_map; /* shm: the pool, mapped here */
    uint64_t pool_bytes;
    /* ucx: the worker lives as long as the linker; the endpoint (xport)
     * belongs to one connection and is replaced with the mapping. Only
     * the load and offload threads post on it, under the map read lock and
     * xport_lock; after it failed (xport_failed = its epoch) the next call
     * reconnects. */
    bool use_ucx;
    kvd_ucx_mode_t ucx_mode;
    kvd_ucx_t *ucx;
    pthread_mutex_t xport_lock; /* xport's use and failure, next_cookie, kept */
    kvd_transport_t *xport;
    _Atomic uint64_t xport_failed;
    uint64_t next_cookie;
    /* batches of one thread that finished while the other waited (one
     * thread has at most two outstanding: a staged half and its next) */
    kvd_xfer_done_t kept[8];
    size_t n_kept;
    /* the load thread wants xport_lock: the offload thread lets it in
     * before its next batch (a mutex hands itself back to its releaser),
     * unless loads had it loads_in_a_row times; offload_waiting: the
     * offload thread is queued for it (see transfer.c, xport_lock) */
    _Atomic int load_waiting, offload_waiting, loads_in_a_row;
    uint8_t *stage; /* offload staging, 2 x KVD_LINKER_STAGE_HALF; offload thread */

    pthread_mutex_t lock;
    pthread_cond_t cond;      /* progress, completions, starts */
    pthread_cond_t jobs_cond; /* an offload job queued, or stop */
    lpool_t pools[KVD_MAX_POOLS];
    uint32_t n_pools;
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
    bool stop;
    pthread_t thread, off_thread; /* loads, offloads */
    bool thread_started, off_thread_started;
    /* after a reconnection the new mapping is populated by this thread,
     * not under `rpc` (which would stall every call for as long as the
     * pool takes); pop_running under lock */
    pthread_t pop_thread;
    bool pop_started, pop_running;
    _Atomic int remapping; /* a shm reconnection wants the map write lock */
};

/* linker.c: one RPC. on_epoch 0: on the connection, (re)connecting first
 * when there is none; otherwise only on the connection of that epoch, and
 * KVD_ERR_CLOSED without sending when it is gone (a lease or reservation
 * id of a dead daemon can name one of ours on a restarted one). *epoch
 * (may be NULL) says which connection served it. */
int lk_call_ex(kvd_linker_t *l, kvd_msg_t *req, kvd_msg_t *rep, uint64_t on_epoch,
               uint64_t *epoch);
int lk_call(kvd_linker_t *l, kvd_msg_t *req, kvd_msg_t *rep);
/* n requests in one round trip (kvd_client_call_many), on_epoch as for
 * lk_call_ex: KVD_OK when every reply came, each reps[i].status its own;
 * else nothing was sent, or the connection failed and is dropped. */
int lk_call_many(kvd_linker_t *l, kvd_msg_t *reqs, kvd_msg_t *reps, size_t n,
                 uint64_t on_epoch, uint64_t *epoch);
/* Whether the read leases of x[0..n) provably still stand: each of the
 * current connection, a Unix socket, asked for less than half the
 * daemon's lease TTL ago, and the connection still open and quiet (a
 * daemon that ends leases by closing the connection shows it there at
 * once). When true, the bytes copied under them are the objects' and
 * their Release may come after. */
bool lk_leases_standing(kvd_linker_t *l, const lxfer_t *x, size_t n);
/* Promises room for `more` completions, so that pushing them cannot fail;
 * each push uses up one promise. */
int lk_queue_reserve(lqueue_t *q, size_t more);
void lk_xfer_free(lxfer_t *x, size_t n);
void lk_queue_push(lqueue_t *q, uint64_t id, bool success);

/* load.c: ends read leases; false when one was already gone */
bool lk_release(kvd_linker_t *l, lxfer_t *x, size_t n);

/* transfer.c */
void *lk_load_thread_main(void *arg);
void *lk_offload_thread_main(void *arg);
void lk_fail_pending(kvd_linker_t *l);

#endif
