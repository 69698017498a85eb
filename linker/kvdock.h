/*
 * kvdock.h - libkvdock, the worker-side linker: the library a serving
 * worker links to offload KV and mamba state to its node's kvdockd and to
 * load it back (DESIGN.md section 6).
 *
 * Conventions: every function returns KVD_OK (0) or a negative
 * kvd_status_t (kvd_status.h, installed beside this header; kvd_strerror()
 * names each); handles are opaque and owned by the caller until the
 * matching close; outputs are set only on success. Every call is
 * thread-safe: engine threads call in while the linker's load thread
 * copies layer group by layer group and its offload thread stores.
 *
 * Every call may fail with KVD_ERR_INVALID (a NULL handle or output, a bad
 * argument) and KVD_ERR_NOMEM. A call that asks the daemon may also fail
 * with the connection's errors: KVD_ERR_UNAVAILABLE (no daemon listens, or
 * it is not ready yet), KVD_ERR_DRAINING (it is shutting down),
 * KVD_ERR_TIMEOUT (no answer within timeout_ms), KVD_ERR_CLOSED (the
 * connection dropped; the next call reconnects) and KVD_ERR_PROTOCOL (an
 * answer that breaks the protocol). Each function's comment names the
 * codes particular to it.
 *
 * timeout_ms bounds each call from its start, every round trip and wait
 * it makes included, whichever thread calls and whatever the daemon does
 * (a daemon that hangs still has its connections accepted by its kernel).
 * Once the daemon did not answer within it, it counts as hung for the
 * next timeout_ms: calls that would have to reconnect fail at once with
 * KVD_ERR_TIMEOUT, offloads queued fail (their device rows are the
 * engine's again), then the next call tries again. Requests longer than
 * the daemon's batch or frame limit (learnt at Hello) are split; the
 * results are those of one call.
 *
 * The flow for one request `rid`, in the engine's order:
 *   kvd_lookup        -> every restorable boundary (in pages)
 *   kvd_load          LOAD: re-validate and pin what the chosen boundary needs
 *   kvd_load_prepare  PREPARE: per-component fix-ups before the tree insert
 *   (the engine inserts the prefix into its radix tree)
 *   kvd_load_commit   COMMIT: cut the transfers to what the tree adopted
 *   or kvd_load_abort ABORT: only for a load that never reached the insert
 *   kvd_start_layer_wise_loading / kvd_wait_layer: the copies, layer by layer
 *   kvd_pop_completed_loads: (rid, success), exactly once per committed load
 * and for offloads: kvd_offload -> ack; kvd_pop_completed_offloads.
 */
#ifndef KVDOCK_H
#define KVDOCK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvd_status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVD_API __attribute__((visibility("default")))

#define KVD_PAGE_KEY_BYTES   32
#define KVD_MAX_POOLS        16 /* device pool entries of one linker */
#define KVD_MAX_POOL_BUFFERS 8  /* component buffers of one layer */

typedef struct kvd_linker kvd_linker_t;

/* ------------------------------------------------------------- opening */

typedef struct kvd_linker_config {
    /* Unix socket of the daemon (NULL: the default instance's socket). */
    const char *socket_path;
    /* "HOST:PORT" of a daemon's TCP listener; used instead of socket_path
     * (bytes then move over UCX). */
    const char *connect;
    /* Shows up in the daemon's log. NULL: "libkvdock". */
    const char *client_name;
    /* The model and its layout (weights, dtype, head config): two workers
     * share stored KV only when this is equal. NULL: "model". */
    const char *model_id;
    int tp_rank, tp_size; /* tensor parallel: 0, 1 when unused */
    int pp_rank, pp_size; /* pipeline parallel: 0, 1 when unused */
    int cp_rank, cp_size; /* context parallel: 0, 1 when unused */
    /* Layers copied per step of layer-wise loading; 0: 1. */
    int layer_group_size;
    /* Bound on every RPC and on every wait; 0: 5000 ms. */
    int timeout_ms;
    /* How long a linker thread polls (yielding the CPU) before it sleeps:
     * the load thread for the start of a load, from kvd_load on, and
     * kvd_wait_layer for its layer. Waking a sleeping thread cost 100-300
     * us on a VM, and each wake-up per layer took the copying CPU for a
     * while. 0: 1000 us; negative: sleep at once. */
    int spin_us;
    /* false (default): the pool's mapping is populated when the linker
     * connects, so no transfer pays a page fault per 4 KiB (measured here:
     * writing into an unpopulated mapping ran at 0.3 GB/s); true: pages map
     * in on first use (for pools too large to map up front). */
    bool lazy_pool_mapping;
    /* true: this linker only looks up and loads. It asks the daemon for a
     * read-only connection: the pool is mapped read-only (no write through
     * it can corrupt a published object) and offloads are refused. */
    bool read_only;
    /* How bytes move: "shm" (the daemon's pool mapped here; Unix socket
     * only), "ucx" (UCX into the daemon's pool: RDMA, or TCP where the
     * daemon runs with --ucx-tcp, as UCX_TLS says; never a fallback to
     * shm), "auto" (shm over a Unix socket, ucx over TCP). NULL:
     * $KVDOCK_TRANSPORT, else auto. */
    const char *transport;
    /* With ucx: "rma" (one-sided get/put: RDMA NICs), "am" (active
     * messages the daemon's UCX server answers: several times faster where
     * UCX emulates RMA in software, i.e. TCP), "auto" (rma when this host
     * has an RDMA device and UCX_TLS does not rule it out, am otherwise).
     * NULL: $KVDOCK_UCX_MODE, else auto. */
    const char *ucx_mode;
    /* A file holding the token the daemon's --auth-token-file (or a token
     * line of its --auth-config) names: its content, trailing newline
     * trimmed, goes in every Hello, on every reconnection too. A daemon
     * over TCP requires one; over the Unix socket the daemon knows the
     * process by its uid and the token is optional. Read once, at open.
     * NULL: $KVDOCK_AUTH_TOKEN_FILE, else none. */
    const char *auth_token_file;
} kvd_linker_config_t;

typedef enum kvd_linker_health {
    KVD_LINKER_HEALTH_STARTING = 1,
    KVD_LINKER_HEALTH_READY = 2,
    KVD_LINKER_HEALTH_DRAINING = 3,
} kvd_linker_health_t;

/* Connects to the daemon and says Hello. Errors: KVD_ERR_UNAVAILABLE when
 * no daemon listens, KVD_ERR_AUTH when it refuses the credential (the
 * token, or this process's uid), the error reading auth_token_file (e.g.
 * KVD_ERR_NOT_FOUND; KVD_ERR_INVALID when empty), KVD_ERR_UNSUPPORTED for a
 * protocol version mismatch or ucx to a daemon that serves no UCX here (such
 * as TCP without its --ucx-tcp: the reason is logged), KVD_ERR_INVALID for
 * an unknown transport or ucx_mode (or shm to a daemon over TCP) or a rank
 * outside [0, size) (tp, pp or cp), the connection's errors. */
KVD_API int kvd_linker_open(const kvd_linker_config_t *config, kvd_linker_t **out);

/* Stops the transfer threads (pending loads and offloads complete as
 * failed), closes the connection and frees the handle. NULL is fine. */
KVD_API void kvd_linker_close(kvd_linker_t *linker);

/* The daemon's health and its pool size in bytes (either may be NULL).
 * Errors: the connection's. */
KVD_API int kvd_linker_health(kvd_linker_t *linker, kvd_linker_health_t *state,
                              uint64_t *pool_bytes);

/* --------------------------------------------------------- device pools */

typedef enum kvd_addressing {
    /* Token slots: a page is page_size consecutive rows starting at a
     * multiple of page_size (KV, sliding-window KV, indexer). */
    KVD_ADDR_PAGED = 1,
    /* One row per tree node, addressed by slot id (mamba state). Never
     * page-sliced. */
    KVD_ADDR_SLOT = 2,
} kvd_addressing_t;

/*
 * The memory a pool's buffers live in. The device kinds load their runtime
 * when the first pool of that kind is registered (the CUDA driver,
 * libcuda.so.1, or $KVDOCK_CUDA_LIBRARY; ROCm's libamdhip64.so, or
 * $KVDOCK_HIP_LIBRARY): libkvdock has no link-time dependency on either.
 * Device buffers are copied on streams of the linker's own, one per
 * direction, between the device and the store's pool, which the linker
 * pins for DMA in the background (kvd_pool_stats_t says whether it is, and
 * what went through the small pinned bounce ring meanwhile).
 */
typedef enum kvd_memory_kind {
    KVD_MEM_HOST = 1, /* ordinary host memory: memcpy */
    KVD_MEM_HIP = 2,  /* ROCm device memory (hipMalloc) */
    KVD_MEM_CUDA = 3, /* CUDA device memory (cudaMalloc, cuMemAlloc) */
} kvd_memory_kind_t;

/* One component buffer of one layer: row r lives at base + r * row_stride
 * and holds bytes_per_row bytes. */
typedef struct kvd_pool_buffer {
    void *base;
    uint64_t row_stride;
    uint64_t bytes_per_row;
} kvd_pool_buffer_t;

/* One layer of a pool: its global layer id and its buffers (K and V, or one
 * MLA buffer, or a mamba layer's temporal state then its conv buffers). */
typedef struct kvd_pool_layer {
    uint32_t layer_id;
    uint32_t n_buffers;
    kvd_pool_buffer_t buffers[KVD_MAX_POOL_BUFFERS];
} kvd_pool_layer_t;

/* Called by ABORT and COMMIT, synchronously and with no lock of the linker
 * held, to hand device indices back to the engine's allocator (paged: token
 * slots; slot-addressed: slot ids). */
typedef void (*kvd_free_indices_fn)(void *ctx, const int64_t *indices, size_t n);

typedef struct kvd_pool_desc {
    const char *name; /* "kv", "swa", "mamba", "indexer", ... */
    kvd_addressing_t addressing;
    uint32_t page_size; /* tokens per page (PAGED; unused for SLOT) */
    uint64_t n_rows;    /* rows (token slots or state slots) of every
                         * buffer: device indices must be below it */
    /* Lookup hit policy: 0 = ALL_PAGES (full attention), n =
     * TRAILING_PAGES(n) (sliding window: its pages; mamba: 1). */
    uint32_t trailing_pages;
    bool rank_replicated; /* identical on every TP rank (MLA KV) */
    kvd_memory_kind_t memory;
    uint32_t n_layers;
    const kvd_pool_layer_t *layers; /* copied by kvd_register_pool */
    kvd_free_indices_fn free_indices;
    void *free_ctx;
} kvd_pool_desc_t;

/*
 * Registers a device pool entry; *pool_id names it in transfers. The object
 * of one page (or one slot) holds, layer by layer and buffer by buffer, the
 * page's rows; its size and the namespace (model id, pool name, rank suffix)
 * follow from the description and are registered with the daemon.
 * Errors: KVD_ERR_INVALID for a bad description (a layer id twice among
 * its layers, among others), KVD_ERR_UNSUPPORTED for a
 * memory kind not built in, KVD_ERR_NO_DEVICE when the kind's runtime or
 * a device is not on this host (kvd_last_error names what is missing),
 * KVD_ERR_NOT_DEVICE when a buffer of a device kind is not device memory
 * of that kind (a host pointer, the other runtime's memory), or its rows
 * run past the end of the allocation it lies in, or the pool's buffers lie
 * on two devices; KVD_ERR_DEVICE when the runtime fails (its error named),
 * KVD_ERR_NO_SPACE past KVD_MAX_POOLS pools, the
 * daemon's refusal (e.g. KVD_ERR_INVALID: the namespace exists with
 * another object size), the connection's errors.
 */
KVD_API int kvd_register_pool(kvd_linker_t *linker, const kvd_pool_desc_t *desc,
                              uint32_t *pool_id);

/* The object size and namespace of a registered pool (either may be
 * NULL). Errors: KVD_ERR_INVALID for an unknown pool_id. */
KVD_API int kvd_pool_info(kvd_linker_t *linker, uint32_t pool_id, uint64_t *object_bytes,
                          char *ns_name, size_t ns_name_len);

/* ----------------------------------------------------------- page keys */

/*
 * The SGLang-compatible page-key chain: one 32-byte key per full page of
 * `page_size` tokens, key[i] = SHA256(key[i-1] || page i's tokens as uint32
 * little-endian), key[-1] = prior (32 bytes) or nothing when prior is NULL.
 * `keys` must hold n_tokens / page_size keys; *n_keys says how many.
 * Errors: KVD_ERR_INVALID (page_size 0, tokens NULL with n_tokens > 0,
 * keys or n_keys NULL).
 */
KVD_API int kvd_page_keys(const uint32_t *tokens, size_t n_tokens, size_t page_size,
                          const uint8_t *prior, uint8_t (*keys)[KVD_PAGE_KEY_BYTES],
                          size_t *n_keys);

/* ------------------------------------------------------------ transfers */

/*
 * What moves for one pool of one request.
 *  PAGED: keys[i] is the key of page i; device_indices holds one token slot
 *         per token (n_keys * page_size), each page's slots consecutive and
 *         starting at a multiple of page_size.
 *  SLOT:  keys[i] is the key of the page that ends node i; device_indices
 *         holds one slot id per key.
 * For kvd_lookup only keys are read (device_indices may be NULL); there the
 * keys are the page keys of the prompt's page-aligned tail for every pool,
 * slot-addressed ones included.
 */
typedef struct kvd_transfer {
    uint32_t pool_id;
    const uint8_t (*keys)[KVD_PAGE_KEY_BYTES];
    size_t n_keys;
    const int64_t *device_indices;
    size_t n_indices;
    /* For offloads (where the store records each page's place in its
     * chain): the depth of keys[0] (page index in the chain), or per key
     * when depths is non-NULL; the key of the page before keys[0], NULL at
     * the start of a chain. PAGED keys i > 0 have keys[i-1] as parent. */
    uint32_t first_depth;
    const uint32_t *depths;
    const uint8_t *prior_key;
} kvd_transfer_t;

/*
 * Every boundary b (in pages, increasing) restorable in all the pools
 * given, by each pool's hit policy (DESIGN.md section 5). Boundaries count
 * pages from keys[0] (the engine adds its cached prefix). `boundaries`
 * holds at least the smallest n_keys entries; *n_boundaries is output only.
 * Each pool's lookup_hit_pages grows by the longest boundary found.
 * Errors: KVD_ERR_INVALID (no transfer, more pools than a lookup takes, an
 * unknown pool_id), the connection's errors.
 */
KVD_API int kvd_lookup(kvd_linker_t *linker, uint64_t rid,
                       const kvd_transfer_t *transfers, size_t n_transfers,
                       uint32_t *boundaries, size_t *n_boundaries);

/*
 * LOAD: pins the stored objects of every transfer (all or nothing) and
 * records the load of rid. Fails (nothing pinned) when anything is missing
 * now; the load stays recorded so that the engine's ABORT hands its device
 * indices back. The arrays are copied. Invalid arguments record nothing.
 * Errors: KVD_ERR_NOT_FOUND when an object is missing now (evicted since
 * the lookup), KVD_ERR_EXISTS when rid has a load recorded already (nothing
 * recorded), KVD_ERR_INVALID (nothing recorded: a bad transfer, one pool
 * in two transfers, or two pages (slots) of a transfer on the same device
 * rows, which the load would write twice and ABORT would free twice), the
 * connection's errors.
 */
KVD_API int kvd_load(kvd_linker_t *linker, uint64_t rid, const kvd_transfer_t *transfers,
                     size_t n_transfers);

/* PREPARE: fix-ups before the insert (host memory needs none). Errors:
 * KVD_ERR_NOT_FOUND (no load of rid recorded), KVD_ERR_STATE (its LOAD
 * failed or is still running, or it was prepared or committed already). */
KVD_API int kvd_load_prepare(kvd_linker_t *linker, uint64_t rid);

/* What the tree adopted, per transfer of the load (in the same order). */
typedef struct kvd_commit_pool {
    /* PAGED: pages [adopted_begin, adopted_end) were adopted by the tree;
     * the rest already existed there, and their device indices are freed
     * through the pool's free_indices. */
    uint32_t adopted_begin, adopted_end;
    /* SLOT: the tree already had a state at that node: the transfer is
     * dropped and its slot NOT freed (the tree freed it). */
    bool mamba_exist;
} kvd_commit_pool_t;

/*
 * COMMIT: cuts rid's transfers to what the tree adopted (n = the number of
 * transfers given to kvd_load) and queues the copies for the next
 * kvd_start_layer_wise_loading. The device indices of pages not adopted go
 * back through free_indices; their pins end with the batch's.
 * Errors: KVD_ERR_NOT_FOUND (no load of rid), KVD_ERR_STATE (its LOAD is
 * still running, or failed: ABORT a failed load; or it was committed),
 * KVD_ERR_INVALID (n is not the load's number of transfers, or an adopted
 * range outside the transfer); nothing is freed then.
 */
KVD_API int kvd_load_commit(kvd_linker_t *linker, uint64_t rid,
                            const kvd_commit_pool_t *pools, size_t n);

/* ABORT: only for a load that never reached the insert: releases the pins
 * and frees every device index of the load through free_indices. Errors:
 * KVD_ERR_NOT_FOUND (no load of rid, or aborted already), KVD_ERR_STATE
 * (its LOAD is still running, or it was committed); nothing is freed then. */
KVD_API int kvd_load_abort(kvd_linker_t *linker, uint64_t rid);

/*
 * Starts copying every committed load not started yet, layer group by layer
 * group, on the load thread. *counter names the batch for
 * kvd_wait_layer. With nothing committed the batch is empty (every wait
 * returns at once). Errors: KVD_ERR_INVALID, KVD_ERR_NOMEM only.
 */
KVD_API int kvd_start_layer_wise_loading(kvd_linker_t *linker, uint32_t *counter);

/*
 * Waits until layer_id's bytes of batch `counter` are in place: KVD_OK, or
 * the batch's error (it failed: the remaining layers are failed, never left
 * waiting; e.g. KVD_ERR_CLOSED when the data path went away), or
 * KVD_ERR_TIMEOUT past the linker's timeout, or KVD_ERR_NOT_FOUND for a
 * counter kvd_start_layer_wise_loading never gave. A layer no pool of
 * the batch has returns at once. One load of the batch can fail alone (its
 * pins lapsed, its daemon went away): the wait still says KVD_OK for the
 * others, and that load's completion says failed, so an engine checks a
 * request's completion before it trusts that request's KV. A batch
 * forgotten long ago (64 newer finished ones) answers KVD_OK, or
 * KVD_ERR_STATE when a forgotten batch as new as it had failed.
 */
KVD_API int kvd_wait_layer(kvd_linker_t *linker, uint32_t counter, uint32_t layer_id);

/* Names the runtime's legacy default stream (an engine's stream handle 0)
 * where a stream argument's NULL would mean none. */
#define KVD_STREAM_LEGACY ((void *)1) /* kvd_transport.h's KVD_GPU_STREAM_LEGACY */

/*
 * Makes the engine's `stream` (a cudaStream_t or hipStream_t, as the
 * batch's device pools are; NULL or KVD_STREAM_LEGACY: the legacy default
 * stream) wait, on the device, until layer_id's bytes of batch `counter`
 * are in place, and returns once that wait is queued: the forward pass
 * overlaps with the load without a host round trip per layer. The call
 * itself waits (as kvd_wait_layer does) only until the layer's copies are
 * issued; for a layer of host pools, or over UCX (where the device copies
 * are issued once the bytes came), until they are done. Returns what
 * kvd_wait_layer would for a layer in place or failed; the layer's copies
 * that fail after the wait was queued fail the load's completion, which the
 * engine checks before it trusts that request's KV. A stream being
 * captured into a CUDA or HIP graph is refused (KVD_ERR_UNSUPPORTED): the
 * wait would become a graph node naming an event kvdock reuses; wait
 * before the capture. Errors as kvd_wait_layer's, KVD_ERR_DEVICE (the
 * runtime refused the wait).
 */
KVD_API int kvd_stream_wait_layer(kvd_linker_t *linker, uint32_t counter,
                                  uint32_t layer_id, void *stream);

/* One finished load or offload. */
typedef struct kvd_completion {
    uint64_t id; /* the rid, or the offload's ack */
    bool success;
} kvd_completion_t;

/*
 * Pops up to max finished loads (each committed load comes back exactly
 * once, success or not); *n says how many. Never blocks. A load succeeds
 * only if its pins held until its last byte was in place: when that is
 * certain without asking (a daemon on this host, its connection quiet and
 * open, the pins younger than half its lease TTL) it is reported at once
 * and its pins are released just after; otherwise the daemon's answer to
 * the release decides. Errors: KVD_ERR_INVALID only.
 */
KVD_API int kvd_pop_completed_loads(kvd_linker_t *linker, kvd_completion_t *out,
                                    size_t max, size_t *n);

/*
 * Offloads finished nodes: copies each transfer's device rows into the
 * store (reserve, write, publish) on the offload thread, after the device
 * data is final. Pages already stored (EXISTS, or being written by another
 * rank) count as success. *ack names it in the completed-offloads queue.
 * The arrays are copied: the caller may reuse them at once; the device
 * rows must stay as they are until the ack comes back (loads run beside
 * offloads, so a load may land while an offload still reads its rows:
 * never into those rows). Errors (nothing queued): KVD_ERR_INVALID for a
 * bad transfer or an unknown pool_id, KVD_ERR_NOMEM. What fails later
 * (e.g. KVD_ERR_NO_SPACE in the store) comes back as the ack's failure.
 */
KVD_API int kvd_offload(kvd_linker_t *linker, const kvd_transfer_t *transfers,
                        size_t n_transfers, uint64_t *ack);

/*
 * kvd_offload for rows the engine is still writing on the device: the
 * device-to-host copies wait, on the device, for `event` (a cudaEvent_t or
 * hipEvent_t, as its record stands when this is called) or, when event is
 * NULL, for everything queued on `stream` so far (KVD_STREAM_LEGACY: the
 * legacy default stream). The call does not block; the engine may
 * re-record the event or go on with the stream at once. The offload
 * thread starts the job's copies once the wait is over, so the engine's
 * time does not count against timeout_ms. Both NULL is kvd_offload.
 * Errors as kvd_offload's, KVD_ERR_INVALID for a transfer of a host pool
 * (nothing on a device to wait for), KVD_ERR_UNSUPPORTED for a stream
 * being captured into a graph, KVD_ERR_DEVICE (the runtime refused the
 * wait).
 */
KVD_API int kvd_offload_after(kvd_linker_t *linker, const kvd_transfer_t *transfers,
                              size_t n_transfers, void *stream, void *event,
                              uint64_t *ack);

/* Pops up to max finished offloads, each ack exactly once; *n says how
 * many. Never blocks. Errors: KVD_ERR_INVALID only. */
KVD_API int kvd_pop_completed_offloads(kvd_linker_t *linker, kvd_completion_t *out,
                                       size_t max, size_t *n);

/* ------------------------------------------------------------- counters */

typedef struct kvd_pool_stats {
    uint64_t lookup_hit_pages;
    uint64_t load_bytes;    /* counted layer by layer as loads copy */
    uint64_t offload_bytes; /* counted object by object as offloads copy */
    uint64_t load_failures;
    uint64_t offload_failures;
    kvd_memory_kind_t memory;
    /* device kinds: whether the store's pool is registered with the
     * device (pinned for DMA) on this connection; host kinds: false */
    bool pinned;
    uint64_t dma_bytes;    /* copied between the device and the pinned pool */
    uint64_t bounce_bytes; /* copied through the pinned bounce ring (the pool
                            * not pinned yet, or its registration failed) */
} kvd_pool_stats_t;

/* Counters of one registered pool. Errors: KVD_ERR_INVALID for an unknown
 * pool_id. */
KVD_API int kvd_stats(kvd_linker_t *linker, uint32_t pool_id, kvd_pool_stats_t *out);

/* --------------------------------------------------------- store client */

/*
 * A small client of the daemon for operators and tests: its health, its
 * statistics, the stored prefixes and lookups by namespace name, the last
 * three as the JSON texts `kvdock stats --json`, `kvdock prefixes --json`
 * and `kvdock lookup --json` print (the same code writes both). It needs
 * no linker and registers nothing. One connection, opened with a Hello
 * and opened again at the next call when the daemon has closed it (or a
 * call failed on it). Calls on one handle are serialised; each is bounded
 * by timeout_ms from its start, waiting for another caller's call
 * included. A daemon's error reply is returned as its status, and its
 * text is this thread's kvd_last_error() (as are the reasons of the other
 * failures: the unknown namespace, the refused Hello, the argument).
 */
typedef struct kvd_store kvd_store_t;

typedef struct kvd_store_config {
    const char *socket_path;     /* NULL: the default instance's socket */
    const char *connect;         /* "HOST:PORT": over TCP instead */
    const char *client_name;     /* in the daemon's log; NULL: "kvdock-client" */
    const char *auth_token_file; /* as kvd_linker_config_t's; read once, at open.
                                  * NULL: $KVDOCK_AUTH_TOKEN_FILE, else none */
    int timeout_ms;              /* bounds each call from its start; 0: 5000 */
} kvd_store_config_t;

/* Connects and says Hello (config NULL: every default). Errors as
 * kvd_linker_open's: KVD_ERR_UNAVAILABLE (no daemon listens), KVD_ERR_AUTH
 * (the credential refused), the error reading auth_token_file,
 * KVD_ERR_INVALID (a socket path or HOST:PORT too long or malformed), the
 * connection's. */
KVD_API int kvd_store_open(const kvd_store_config_t *config, kvd_store_t **out);

/* Closes the connection and frees the handle. NULL is fine. */
KVD_API void kvd_store_close(kvd_store_t *store);

/* The daemon's limits, as its last Hello said (connecting when there is
 * no connection): the most items (keys) one request may carry, and the
 * largest frame. kvd_store_lookup_json refuses more keys with
 * KVD_ERR_TOO_LARGE. Errors: the connection's. */
KVD_API int kvd_store_limits(kvd_store_t *store, uint32_t *max_batch,
                             uint32_t *max_frame_bytes);

/* The daemon's state and its pool size in bytes (either may be NULL).
 * Errors: the connection's. */
KVD_API int kvd_store_health(kvd_store_t *store, kvd_linker_health_t *state,
                             uint64_t *pool_bytes);

/*
 * The JSON texts below are NUL-terminated and malloc'd: *json is the
 * caller's, freed with kvd_free(). Each is one JSON object.
 */

/* The daemon's statistics: version, instance, state, memory, connections,
 * per-method counters, "store", "namespaces" (each namespace's id, name,
 * object_bytes, counters), "nics". Errors: the connection's. */
KVD_API int kvd_store_stats_json(kvd_store_t *store, char **json);

/*
 * The stored prefixes: {"truncated":bool,"prefixes":[{"namespace", "root",
 * "leaf" (hex keys), "pages", "bytes", "last_access_ms", "hits", "pools":
 * [{"namespace", "boundaries"}]}...]}, those of namespace ns_name (NULL:
 * every namespace), at most limit entries (0: 100), followed page by page
 * as the daemon hands them out; truncated says there are more. Errors:
 * the daemon's (KVD_ERR_NOT_FOUND for an unknown namespace), the
 * connection's.
 */
KVD_API int kvd_store_prefixes_json(kvd_store_t *store, const char *ns_name, size_t limit,
                                    char **json);

/*
 * A Lookup of the n_keys page keys in each of the n_ns namespaces named
 * (1..KVD_MAX_POOLS), trailing[i] being namespace i's hit policy as
 * kvd_pool_desc_t's trailing_pages (NULL: 0 for all): {"boundaries":[every
 * restorable boundary, in pages from keys[0]],"longest":the last or 0}.
 * Errors: KVD_ERR_INVALID (no namespace or no key, more than KVD_MAX_POOLS
 * namespaces, a NULL name), KVD_ERR_NOT_FOUND (a namespace the daemon does
 * not know), the daemon's (KVD_ERR_TOO_LARGE past its batch or frame
 * limit), the connection's.
 */
KVD_API int kvd_store_lookup_json(kvd_store_t *store, const char *const *ns_names,
                                  const uint32_t *trailing, size_t n_ns,
                                  const uint8_t (*keys)[KVD_PAGE_KEY_BYTES],
                                  size_t n_keys, char **json);

/*
 * Drops stored objects: the one key in namespace ns_name (key non-NULL;
 * ns_name NULL: every namespace holding it), every object of namespace
 * ns_name (key NULL), or everything the caller may reach (all true; then
 * ns_name and key NULL). Pinned objects and those being written stay:
 * *skipped (may be NULL) counts them; *evicted (may be NULL) the objects
 * dropped. The daemon evicts a namespace in slices; every slice is asked
 * for within the call's timeout_ms. Errors: KVD_ERR_INVALID (none or more
 * than one of key, namespace, all), KVD_ERR_NOT_FOUND (an unknown
 * namespace), KVD_ERR_TIMEOUT (slices were left: the counts say what was
 * done), the daemon's (KVD_ERR_PERMISSION for a read-only credential),
 * the connection's.
 */
KVD_API int kvd_store_evict(kvd_store_t *store, const char *ns_name,
                            const uint8_t key[KVD_PAGE_KEY_BYTES], bool all,
                            uint64_t *evicted, uint64_t *skipped);

/* Frees what the store client handed out (a JSON text). NULL is fine. */
KVD_API void kvd_free(void *p);

/* ------------------------------------------------------------------ misc */

/* A short, static description of a kvd_status_t ("no space", ...); a code
 * outside the enum gets "unknown status". Never NULL. */
KVD_API const char *kvd_strerror(int status);

/* Why this thread's last failed libkvdock call failed, in words: the
 * daemon's reason when it refused a request ("Reserve: tenant 'a' is over
 * its byte quota"), the refusal of a Hello; "" when the call recorded none
 * (kvd_strerror of its status says all there is) or it succeeded. Every
 * call clears it on entry; valid until this thread's next libkvdock call.
 * Never NULL. */
KVD_API const char *kvd_last_error(void);

/* The library's version, "MAJOR.MINOR.PATCH". */
KVD_API const char *kvd_version(void);

#ifdef __cplusplus
}
#endif

#endif /* KVDOCK_H */
