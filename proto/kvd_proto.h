/*
 * kvd_proto.h - the one public header of proto/: framing of messages on a
 * byte stream, the RPC messages as plain C structs, a small blocking
 * client used by the CLI, the linker, tests and benchmarks, the operator's
 * queries (paged prefix listings, lookups by namespace name) and the JSON
 * texts of replies that the CLI and libkvdock's store client share.
 *
 * The generated protobuf-c types never leave proto/: callers fill and read
 * kvd_msg_t, and kvd_msg_pack()/kvd_msg_decode() convert.
 *
 * Frame format: a 4-byte little-endian payload length, then the payload (one
 * encoded Envelope of kvdock.proto). A length of zero or above the configured
 * maximum is a protocol error.
 *
 * Threading: a framer, a buffer and a client belong to one thread at a time.
 */
#ifndef KVD_PROTO_H
#define KVD_PROTO_H

#include "kvd_common.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define KVD_PROTOCOL_VERSION   1
#define KVD_FRAME_HEADER_BYTES 4
#define KVD_FRAME_DEFAULT_MAX  (4u * 1024u * 1024u)
/* The hard ceiling for --max-frame: a frame must fit a 32-bit length and
 * one connection must not pin a large part of the daemon's heap. */
#define KVD_FRAME_LIMIT_MAX   (256u * 1024u * 1024u)
#define KVD_NAME_MAX          128
#define KVD_TENANT_NAME_BYTES 64 /* = KVD_TENANT_NAME_MAX of the store */
#define KVD_VERSION_MAX       32
#define KVD_TOKEN_MAX         256 /* HelloRequest.auth_token */
#define KVD_UCX_TOKEN_MAX     32  /* HelloReply.ucx_token */
#define KVD_CURSOR_MAX        128 /* ListPrefixes cursors */
#define KVD_ERROR_MAX         256

/* --------------------------------------------------------------- buffer */

/* A growable byte buffer, charged to a memory category. */
typedef struct kvd_buf {
    uint8_t *data;
    size_t len;
    size_t cap;
    kvd_mem_cat_t cat;
} kvd_buf_t;

void kvd_buf_init(kvd_buf_t *b, kvd_mem_cat_t cat);
void kvd_buf_free(kvd_buf_t *b);
/* Makes room for `extra` more bytes. KVD_ERR_NOMEM on failure. */
int kvd_buf_reserve(kvd_buf_t *b, size_t extra);
int kvd_buf_append(kvd_buf_t *b, const void *data, size_t len);
/* Drops the first n bytes (they were written out). */
void kvd_buf_consume(kvd_buf_t *b, size_t n);

/* --------------------------------------------------------------- framer */

/*
 * Incremental frame reader for non-blocking sockets: read into the space
 * kvd_framer_space() hands out, kvd_framer_commit() what arrived, then take
 * whole frames with kvd_framer_next() until it answers 0.
 */
typedef struct kvd_framer {
    kvd_buf_t buf;
    size_t start;     /* first unconsumed byte in buf */
    size_t max_frame; /* largest payload accepted */
} kvd_framer_t;

void kvd_framer_init(kvd_framer_t *f, size_t max_frame, kvd_mem_cat_t cat);
void kvd_framer_free(kvd_framer_t *f);
/* Hands out at least `min` writable bytes at *space (*avail may be more). */
int kvd_framer_space(kvd_framer_t *f, size_t min, uint8_t **space, size_t *avail);
void kvd_framer_commit(kvd_framer_t *f, size_t n);
/*
 * Returns 1 and the next whole payload (valid until the next call on f),
 * 0 when more bytes are needed, KVD_ERR_TOO_LARGE for a length over the
 * maximum, KVD_ERR_PROTOCOL for a zero length.
 */
int kvd_framer_next(kvd_framer_t *f, const uint8_t **payload, size_t *len);
/* Bytes of a started but unfinished frame: non-zero at EOF = truncated. */
size_t kvd_framer_pending(const kvd_framer_t *f);
/* Whether the next frame has begun and is not all there yet (whole frames
 * waiting to be taken are not partial). */
bool kvd_framer_partial(const kvd_framer_t *f);
/* The capacity f's buffer would have after kvd_framer_space(f, min): what a
 * caller that caps memory checks before reading. */
size_t kvd_framer_space_cap(const kvd_framer_t *f, size_t min);

/* Appends a frame header for a payload of `len` bytes. */
int kvd_frame_put_header(kvd_buf_t *b, size_t len);

/* ------------------------------------------------------------- messages */

typedef enum kvd_method {
    KVD_METHOD_NONE = 0,
    KVD_METHOD_HELLO = 1,
    KVD_METHOD_HEALTH = 2,
    KVD_METHOD_STATS = 3,
    KVD_METHOD_REGISTER_NAMESPACE = 4,
    KVD_METHOD_LOOKUP = 5,
    KVD_METHOD_RESERVE = 6,
    KVD_METHOD_PUBLISH = 7,
    KVD_METHOD_REVOKE = 8,
    KVD_METHOD_ACQUIRE = 9,
    KVD_METHOD_RELEASE = 10,
    KVD_METHOD_LIST_PREFIXES = 11,
    KVD_METHOD_INSPECT = 12,
    KVD_METHOD_EVICT = 13,
    KVD_METHOD_CLUSTER = 14,
    KVD_METHOD_DIR_ANNOUNCE = 15, /* peer daemons only */
    KVD_METHOD_DIR_LOOKUP = 16,   /* peer daemons only */
    KVD_METHOD_FETCH = 17,        /* peer daemons only */
    KVD_METHOD_COUNT
} kvd_method_t;

/* "hello", "health", ...; "unknown" outside the enum. */
const char *kvd_method_name(kvd_method_t m);

typedef enum kvd_health {
    KVD_HEALTH_NONE = 0,
    KVD_HEALTH_STARTING = 1,
    KVD_HEALTH_READY = 2,
    KVD_HEALTH_DRAINING = 3,
} kvd_health_t;

const char *kvd_health_name(kvd_health_t h);

/* This daemon's standing in its cluster (wire values: never renumber). */
typedef enum kvd_cluster_state {
    KVD_CLUSTER_OFF = 0,      /* a single-node store */
    KVD_CLUSTER_JOINING = 1,  /* configured, not yet a member */
    KVD_CLUSTER_READY = 2,    /* a member, etcd reachable */
    KVD_CLUSTER_DEGRADED = 3, /* etcd unreachable or the lease lost */
} kvd_cluster_state_t;

/* "off", "joining", "ready", "degraded"; "unknown" outside the enum. */
const char *kvd_cluster_state_name(kvd_cluster_state_t c);

/* Latency histogram bounds (microseconds), shared by daemon and readers. */
#define KVD_LATENCY_BUCKETS 14
/* Upper bound of bucket i in microseconds; UINT64_MAX for the last one. */
uint64_t kvd_latency_bound_us(size_t i);

#define KVD_NS_NAME_BYTES 256 /* with the NUL: names are at most 255 bytes */
/* Most pools one Lookup names (the daemon refuses more before decoding). */
#define KVD_LOOKUP_POOLS_MAX 16

/* The longest a daemon holds an Acquire's reply while its objects come
 * into the pool (kvd_acquire_req_t.wait_ms beyond it is cut to it). */
#define KVD_ACQUIRE_WAIT_MAX_MS 1000u

typedef uint8_t kvd_key_t[KVD_KEY_BYTES];

/* ---------------------------------------------------------- field lists */

/*
 * The flat messages (NamespaceSpec, StoreStats, NamespaceInfo, ObjectInfo,
 * Nic) are written once each, as a field list: one
 *   X(TYPE, name, SIZE, METRIC, help)
 * per field of the kvdock.proto message, in its order (a test checks the
 * order against the field numbers). The list makes the C struct below, both
 * conversions in msg.c, and the descriptor tables (kvd_field_list_t) from
 * which the CLI writes its JSON and its tables and the daemon its metrics.
 * So a field has one name everywhere: `name` in C, in kvdock.proto, as JSON
 * key and table row, and kvdock_<group>_<name> as a metric (a counter ends
 * in _total).
 *
 * TYPE: U32, I32, U64, F64, BOOL, STR (char[SIZE], NUL-terminated; SIZE is
 * 0 for the others) or KEY (kvd_key_t). METRIC: GAUGE, COUNTER or NONE (not
 * exported as a metric); help is the metric's HELP text.
 */
#define KVD_FIELD_DECL(type, name, size, metric, help) KVD_FIELD_DECL_##type(name, size)
#define KVD_FIELD_DECL_U32(name, size)                 uint32_t name;
#define KVD_FIELD_DECL_I32(name, size)                 int32_t name;
#define KVD_FIELD_DECL_U64(name, size)                 uint64_t name;
#define KVD_FIELD_DECL_F64(name, size)                 double name;
#define KVD_FIELD_DECL_BOOL(name, size)                bool name;
#define KVD_FIELD_DECL_STR(name, size)                 char name[size];
#define KVD_FIELD_DECL_KEY(name, size)                 kvd_key_t name;

/* What a descriptor says of a field's C type. */
typedef enum kvd_field_type {
    KVD_FIELD_U32,
    KVD_FIELD_I32,
    KVD_FIELD_U64,
    KVD_FIELD_F64,
    KVD_FIELD_BOOL,
    KVD_FIELD_STR,
    KVD_FIELD_KEY,
} kvd_field_type_t;

typedef enum kvd_metric_kind {
    KVD_METRIC_NONE,
    KVD_METRIC_GAUGE,
    KVD_METRIC_COUNTER,
} kvd_metric_kind_t;

/* One field of a flat message, made from its field list. */
typedef struct kvd_field {
    const char *name; /* C member, proto field, JSON key */
    kvd_field_type_t type;
    size_t offset; /* of the member in the C struct */
    size_t size;   /* of the member: a string's room with its NUL */
    kvd_metric_kind_t metric;
    const char *help;
} kvd_field_t;

/* The fields of one flat message; group names its metrics. */
typedef struct kvd_field_list {
    const char *group; /* "store", "ns", ...: kvdock_<group>_<name> */
    const kvd_field_t *fields;
    size_t n;
} kvd_field_list_t;

/* The descriptor tables of the structs below. */
extern const kvd_field_list_t kvd_ns_spec_fields;         /* kvd_ns_spec_t */
extern const kvd_field_list_t kvd_store_stats_fields;     /* kvd_store_stats_msg_t */
extern const kvd_field_list_t kvd_mem_stats_fields;       /* kvd_mem_stats_t */
extern const kvd_field_list_t kvd_ns_fields;              /* kvd_ns_msg_t */
extern const kvd_field_list_t kvd_tenant_fields;          /* kvd_tenant_msg_t */
extern const kvd_field_list_t kvd_member_fields;          /* kvd_member_msg_t */
extern const kvd_field_list_t kvd_cluster_counter_fields; /* kvd_cluster_counters_t */
extern const kvd_field_list_t kvd_obj_fields;             /* kvd_obj_msg_t */
extern const kvd_field_list_t kvd_nic_fields;             /* kvd_nic_msg_t */

/* An integer field (U32, U64; BOOL as 0 or 1; I32 below 0 as 0) of obj;
 * 0 for the others. */
uint64_t kvd_field_u64(const kvd_field_t *f, const void *obj);

/* A numeric field (U32, I32, U64, F64; BOOL as 0 or 1) of obj as a double,
 * for ratios; exact for every integer a daemon counts in practice. */
double kvd_field_f64(const kvd_field_t *f, const void *obj);

/*
 * Writes field f of obj as text into buf: integers in decimal, F64 with
 * "%.6g", BOOL as true or false (the JSON literals), STR as it is (not
 * escaped), KEY as 64 hex digits. Returns buf.
 */
const char *kvd_field_text(const kvd_field_t *f, const void *obj, char *buf, size_t len);

/* A string (STR) field's value. */
const char *kvd_field_str(const kvd_field_t *f, const void *obj);

/* The metric name of field f of list l: kvdock_<group>_<name>, plus _total
 * for a counter. KVD_ERR_INVALID for a field that is no metric,
 * KVD_ERR_TOO_LARGE when buf is too short. */
int kvd_field_metric_name(const kvd_field_list_t *l, const kvd_field_t *f, char *buf,
                          size_t len);

/*
 * Variable-length parts of messages (arrays of keys, items, ids) are
 * pointer + count. In a decoded message they point into the message's own
 * arena and live until kvd_msg_clear(); in a message being built they point
 * wherever the builder likes (kvd_msg_alloc() gives arena memory too).
 */
/* A namespace to register (Hello, RegisterNamespace). */
#define KVD_NS_SPEC_FIELDS(X)                                                  \
    X(STR, name, KVD_NS_NAME_BYTES, NONE, "model identity, pool, rank suffix") \
    X(U64, object_bytes, 0, NONE, "the size of every object")                  \
    X(BOOL, rank_replicated, 0, NONE, "one copy for every TP rank")

typedef struct kvd_ns_spec {
    KVD_NS_SPEC_FIELDS(KVD_FIELD_DECL)
} kvd_ns_spec_t;

typedef struct kvd_hello_req {
    char client_name[KVD_NAME_MAX];
    uint32_t pid;
    uint32_t protocol_version;
    size_t n_namespaces;
    kvd_ns_spec_t *namespaces;
    bool want_pool_fd;
    bool want_ucx;
    uint8_t auth_token[KVD_TOKEN_MAX];
    size_t auth_token_len;
    bool read_only;
    uint64_t writer_token;    /* this writer among its process's (a linker's) */
    bool earlier_copies_over; /* copies of its earlier connections ended */
} kvd_hello_req_t;

typedef struct kvd_hello_rep {
    char daemon_version[KVD_VERSION_MAX];
    char instance[KVD_NAME_MAX];
    uint32_t protocol_version;
    uint32_t max_frame_bytes;
    uint32_t max_batch;
    uint64_t pool_bytes;
    uint64_t connection_id;
    size_t n_ns_ids;
    uint32_t *ns_ids;
    bool pool_fd_attached;
    uint64_t lease_ttl_ms;
    /* UCX (want_ucx and the daemon runs it; lengths 0 otherwise) */
    const uint8_t *ucx_address; /* in the message (arena or the daemon's) */
    size_t ucx_address_len;
    const uint8_t *ucx_rkey;
    size_t ucx_rkey_len;
    uint64_t ucx_pool_base;
    uint8_t ucx_token[KVD_UCX_TOKEN_MAX];
    size_t ucx_token_len;
    char tenant[KVD_NAME_MAX];
    bool read_only;
} kvd_hello_rep_t;

typedef struct kvd_register_req {
    size_t n;
    kvd_ns_spec_t *namespaces;
} kvd_register_req_t;

typedef struct kvd_ids_rep {
    size_t n;
    uint32_t *ids;
} kvd_ids_rep_t;

typedef struct kvd_put_item {
    kvd_key_t key;
    kvd_key_t parent;
    bool has_parent;
    uint32_t depth;
} kvd_put_item_t;

typedef struct kvd_reserve_req {
    uint32_t ns;
    uint64_t object_bytes; /* 0 = unchecked */
    size_t n;
    kvd_put_item_t *items;
} kvd_reserve_req_t;

typedef struct kvd_reserve_rep {
    uint64_t lease_id;
    uint64_t object_bytes;
    size_t n;
    uint8_t *results;  /* kvd_reserve_result_t values (kvd_common.h) */
    uint64_t *offsets; /* meaningful where results[i] == allocated */
} kvd_reserve_rep_t;

/* Publish and Revoke: n == 0 means every reservation of the lease. */
typedef struct kvd_finish_req {
    uint64_t lease_id;
    size_t n;
    kvd_key_t *keys;
} kvd_finish_req_t;

typedef struct kvd_acquire_req {
    uint32_t ns;
    uint64_t object_bytes; /* 0 = unchecked */
    size_t n;
    kvd_key_t *keys;
    /* the daemon may hold an in-progress reply this long (it answers when
     * the objects are in its pool, or in-progress when the time is up); 0:
     * in-progress at once */
    uint32_t wait_ms;
} kvd_acquire_req_t;

typedef struct kvd_acquire_rep {
    uint64_t lease_id;
    uint64_t object_bytes;
    size_t n;
    uint64_t *offsets;
} kvd_acquire_rep_t;

typedef struct kvd_release_req {
    uint64_t lease_id;
} kvd_release_req_t;

typedef struct kvd_lookup_pool_msg {
    uint32_t ns;
    uint32_t trailing_pages; /* 0 = ALL_PAGES */
    size_t n_keys;
    kvd_key_t *keys;
} kvd_lookup_pool_msg_t;

typedef struct kvd_lookup_req {
    size_t n_pools;
    kvd_lookup_pool_msg_t *pools;
} kvd_lookup_req_t;

typedef struct kvd_lookup_rep {
    size_t n;
    uint32_t *boundaries;
    /* n entries (KVD_TIER_*: the slowest tier each boundary needs), or NULL
     * when every one is in DRAM */
    uint32_t *tiers;
} kvd_lookup_rep_t;

/* A namespace and its counters (Stats, ListPrefixes, Inspect): the
 * identity, then the counters the store keeps per namespace (the same names
 * as in kvd_ns_info_t of kvd_store.h). */
#define KVD_NS_COUNTER_FIELDS(X)                                                  \
    X(U64, objects_ready, 0, GAUGE, "Objects published in the namespace.")        \
    X(U64, objects_writing, 0, GAUGE, "Objects of the namespace being written.")  \
    X(U64, objects_pinned, 0, GAUGE, "Objects of the namespace pinned by loads.") \
    X(U64, lookup_pages, 0, COUNTER, "Pages of the namespace probed by lookups.") \
    X(U64, hit_pages, 0, COUNTER, "Probed pages of the namespace found.")         \
    X(U64, evictions, 0, COUNTER, "Objects of the namespace evicted.")            \
    X(U64, published_bytes, 0, COUNTER, "Bytes offloaded (published) into it.")   \
    X(U64, acquired_bytes, 0, COUNTER, "Bytes loaded (acquired) from it.")        \
    X(U64, acquire_failures, 0, COUNTER, "Loads refused: a key missing or busy.")
#define KVD_NS_FIELDS(X)                                               \
    X(U32, id, 0, NONE, "the namespace's id")                          \
    X(STR, name, KVD_NS_NAME_BYTES, NONE, "the namespace's name")      \
    X(U64, object_bytes, 0, GAUGE, "Size of the namespace's objects.") \
    X(BOOL, rank_replicated, 0, NONE, "one copy for every TP rank")    \
    KVD_NS_COUNTER_FIELDS(X)                                           \
    X(STR, tenant, KVD_TENANT_NAME_BYTES, NONE, "the owning tenant")

typedef struct kvd_ns_msg {
    KVD_NS_FIELDS(KVD_FIELD_DECL)
} kvd_ns_msg_t;

/* One stored object (Inspect, ListPrefixes --tree). Its parent (field 3 of
 * ObjectInfo) is not in the list: its length says what it is. state is
 * 1 writing, 2 ready; tier 0 DRAM, 1 SSD. */
#define KVD_OBJ_FIELDS(X)                                                        \
    X(U32, ns, 0, NONE, "the namespace's id")                                    \
    X(KEY, key, 0, NONE, "the page key")                                         \
    X(U32, depth, 0, NONE, "page index in its chain")                            \
    X(U32, state, 0, NONE, "1 writing, 2 ready")                                 \
    X(U32, tier, 0, NONE, "0 DRAM, 1 SSD")                                       \
    X(U32, pins, 0, NONE, "loads holding it")                                    \
    X(U32, hits, 0, NONE, "acquires (saturates at 65535)")                       \
    X(U64, last_access_ms, 0, NONE, "wall clock of the last publish or acquire") \
    X(U64, offset, 0, NONE, "where it is in the pool")                           \
    X(U64, size, 0, NONE, "its bytes")

typedef struct kvd_obj_msg {
    KVD_OBJ_FIELDS(KVD_FIELD_DECL)
    uint8_t parent[KVD_KEY_BYTES];
    uint8_t parent_len; /* 0 (none), KVD_KEY_TAG_BYTES (a tag: the parent is not
                         * stored) or KVD_KEY_BYTES */
} kvd_obj_msg_t;

typedef struct kvd_inspect_req {
    char ns_name[KVD_NS_NAME_BYTES]; /* "" = every namespace */
    kvd_key_t key;
} kvd_inspect_req_t;

typedef struct kvd_inspect_rep {
    size_t n_objects;
    kvd_obj_msg_t *objects;
    size_t n_namespaces;
    kvd_ns_msg_t *namespaces;
} kvd_inspect_rep_t;

typedef struct kvd_evict_req {
    char ns_name[KVD_NS_NAME_BYTES];
    bool has_key;
    kvd_key_t key;
    bool all;
    uint8_t cursor[KVD_CURSOR_MAX]; /* a namespace or all, continued */
    size_t cursor_len;
} kvd_evict_req_t;

typedef struct kvd_evict_rep {
    uint64_t evicted;
    uint64_t skipped;
    uint8_t next_cursor[KVD_CURSOR_MAX]; /* set when there is more to evict */
    size_t next_cursor_len;
} kvd_evict_rep_t;

typedef struct kvd_pool_bounds {
    uint32_t ns;
    size_t n;
    uint32_t *boundaries;
} kvd_pool_bounds_t;

typedef struct kvd_prefix_msg {
    uint32_t ns;
    kvd_key_t root;
    kvd_key_t leaf;
    uint32_t pages;
    uint64_t bytes;
    uint64_t last_access_ms;
    uint64_t hits;
    size_t n_pools;
    kvd_pool_bounds_t *pools;
} kvd_prefix_msg_t;

typedef struct kvd_list_req {
    char ns_name[KVD_NS_NAME_BYTES];
    bool nodes;
    uint32_t limit;
    uint8_t cursor[KVD_CURSOR_MAX];
    size_t cursor_len;
} kvd_list_req_t;

typedef struct kvd_list_rep {
    size_t n_prefixes;
    kvd_prefix_msg_t *prefixes;
    size_t n_nodes;
    kvd_obj_msg_t *nodes;
    size_t n_namespaces;
    kvd_ns_msg_t *namespaces;
    bool truncated;
    uint8_t next_cursor[KVD_CURSOR_MAX];
    size_t next_cursor_len;
} kvd_list_rep_t;

typedef struct kvd_stats_req {
    bool check;
} kvd_stats_req_t;

/* The store's figures (Stats): the same names as kvd_store_stats_t of
 * kvd_store.h. free + writing + ready + quarantined bytes = pool bytes. */
#define KVD_STORE_STATS_FIELDS(X)                                                        \
    X(U64, pool_bytes, 0, GAUGE, "Bytes of pool the store manages.")                     \
    X(U64, free_bytes, 0, GAUGE, "Pool bytes free.")                                     \
    X(U64, writing_bytes, 0, GAUGE, "Pool bytes reserved and being written.")            \
    X(U64, ready_bytes, 0, GAUGE, "Pool bytes of published objects.")                    \
    X(U64, pinned_bytes, 0, GAUGE, "Ready bytes pinned by loads.")                       \
    X(U64, objects_ready, 0, GAUGE, "Objects published.")                                \
    X(U64, objects_writing, 0, GAUGE, "Objects reserved, being written.")                \
    X(U64, objects_pinned, 0, GAUGE, "Objects pinned by loads.")                         \
    X(U64, pins, 0, GAUGE, "Pins held: the sum of every object's pin count.")            \
    X(U64, leases, 0, GAUGE, "Leases holding reservations or pins.")                     \
    X(U64, free_extents, 0, GAUGE, "Free extents of the pool.")                          \
    X(U64, largest_free_bytes, 0, GAUGE, "Largest free extent.")                         \
    X(F64, fragmentation, 0, GAUGE, "1 - largest free extent / free bytes.")             \
    X(U64, index_bytes, 0, GAUGE, "Memory of the index (records, hash, leases).")        \
    X(U64, evictions, 0, COUNTER, "Objects evicted.")                                    \
    X(U64, evicted_bytes, 0, COUNTER, "Bytes evicted.")                                  \
    X(U64, reserve_allocated, 0, COUNTER, "Reserved keys allocated.")                    \
    X(U64, reserve_exists, 0, COUNTER, "Reserved keys found stored already.")            \
    X(U64, reserve_in_flight, 0, COUNTER, "Reserved keys another writer held.")          \
    X(U64, reserve_no_space, 0, COUNTER, "Reserved keys refused: no space.")             \
    X(U64, lookups, 0, COUNTER, "Lookups served.")                                       \
    X(U64, lookup_pages, 0, COUNTER, "Pages probed by lookups.")                         \
    X(U64, hit_pages, 0, COUNTER, "Probed pages found.")                                 \
    X(U64, acquires, 0, COUNTER, "Acquires served.")                                     \
    X(U64, acquire_failures, 0, COUNTER, "Acquires refused: a key missing or busy.")     \
    X(U64, leases_expired, 0, COUNTER, "Leases undone by their TTL.")                    \
    X(U64, published_bytes, 0, COUNTER, "Bytes offloaded (published).")                  \
    X(U64, acquired_bytes, 0, COUNTER, "Bytes loaded (acquired).")                       \
    X(U64, quarantined_bytes, 0, GAUGE, "Lapsed writers' extents, held or in grace.")    \
    X(U64, reserve_quota, 0, COUNTER, "Reserved keys refused for a tenant's quota.")     \
    X(U64, scrubbed_bytes, 0, COUNTER, "Bytes zeroed: extents handed across tenants.")   \
    X(U64, namespaces_removed, 0, COUNTER, "Namespaces gone: no users, no objects.")     \
    X(U64, recovered_objects, 0, GAUGE, "Objects recovered from the journal.")           \
    X(U64, recovered_bytes, 0, GAUGE, "Object bytes recovered from the journal.")        \
    X(U64, journal_bytes, 0, GAUGE, "Bytes of the metadata journal file.")               \
    X(U64, journal_records, 0, COUNTER, "Records written to the metadata journal.")      \
    X(U64, journal_compactions, 0, COUNTER, "Snapshots put in place of the journal.")    \
    X(U64, journal_errors, 0, COUNTER, "Journal writes that failed.")                    \
    X(U64, ssd_bytes, 0, GAUGE, "The SSD tier's size.")                                  \
    X(U64, ssd_used_bytes, 0, GAUGE, "SSD tier bytes in segments in use.")               \
    X(U64, ssd_live_bytes, 0, GAUGE, "SSD tier bytes of live records.")                  \
    X(U64, ssd_objects, 0, GAUGE, "Objects on the SSD tier.")                            \
    X(U64, ssd_segments, 0, GAUGE, "Segments of the SSD tier.")                          \
    X(U64, ssd_segments_free, 0, GAUGE, "Free segments of the SSD tier.")                \
    X(U64, spilling_bytes, 0, GAUGE, "DRAM bytes being written to the SSD tier.")        \
    X(U64, promoting_bytes, 0, GAUGE, "DRAM bytes being read from the SSD tier.")        \
    X(U64, spills, 0, COUNTER, "Objects moved to the SSD tier.")                         \
    X(U64, spilled_bytes, 0, COUNTER, "Bytes moved to the SSD tier.")                    \
    X(U64, spill_failures, 0, COUNTER, "Spills that failed (the object dropped).")       \
    X(U64, spill_cancelled, 0, COUNTER,                                                  \
      "Spills undone: the object was loaded meanwhile.")                                 \
    X(U64, spill_drops, 0, COUNTER, "Cold objects dropped by the spill policy.")         \
    X(U64, promotions, 0, COUNTER, "Objects moved back from the SSD tier.")              \
    X(U64, promoted_bytes, 0, COUNTER, "Bytes moved back from the SSD tier.")            \
    X(U64, promote_failures, 0, COUNTER, "Promotions that failed (the object dropped).") \
    X(U64, ssd_evictions, 0, COUNTER, "Objects evicted from the SSD tier.")              \
    X(U64, ssd_compactions, 0, COUNTER, "SSD segments freed by compaction.")             \
    X(U64, ssd_copied_bytes, 0, COUNTER, "Live bytes compaction copied.")                \
    X(U64, ssd_io_errors, 0, COUNTER, "SSD tier I/O errors.")                            \
    X(U64, ssd_checksum_failures, 0, COUNTER, "SSD records that failed their checksum.") \
    X(U64, ssd_no_space, 0, COUNTER, "SSD writes refused for space.")                    \
    X(U64, ssd_queue_depth, 0, GAUGE, "The SSD tier's I/O queue depth limit.")           \
    X(U64, ssd_in_flight, 0, GAUGE, "SSD tier I/O operations in flight.")                \
    X(U64, ssd_spill_ns, 0, COUNTER, "Time spent on spills, summed per operation (ns).") \
    X(U64, ssd_promote_ns, 0, COUNTER,                                                   \
      "Time spent on promotions, summed per operation (ns).")                            \
    X(U64, ssd_recovered_objects, 0, GAUGE, "Objects found on the SSD tier at start.")   \
    X(U64, ssd_io_path, 0, GAUGE,                                                        \
      "The SSD tier's I/O path: 0 none, 1 io_uring, 2 pread/pwrite.")                    \
    X(U64, ssd_fixed_buffers, 0, GAUGE, "1 when the pool is registered with io_uring.")  \
    X(U64, ssd_checkpoints, 0, COUNTER, "SSD tier checkpoints written.")                 \
    X(U64, ssd_syncs, 0, COUNTER,                                                        \
      "SSD tier syncs (fdatasync) that made spills durable before their "                \
      "acknowledgement.")                                                                \
    X(U64, journal_broken, 0, GAUGE, "1 while the journal is invalid: publishes fail.")  \
    X(U64, journal_repairs_skipped, 0, COUNTER,                                          \
      "Journal rewrites not tried: too little free space.")                              \
    X(U64, pool_lost_ranges, 0, COUNTER,                                                 \
      "Ranges of the pool file found cut off or punched out by a writer.")               \
    X(U64, pool_lost_objects, 0, COUNTER,                                                \
      "Objects dropped because a writer destroyed their bytes in the pool file.")

typedef struct kvd_store_stats_msg {
    KVD_STORE_STATS_FIELDS(KVD_FIELD_DECL)
} kvd_store_stats_msg_t;

typedef struct kvd_health_rep {
    kvd_health_t state;
    uint64_t pool_bytes;
    uint64_t populated_bytes;
    uint64_t uptime_ms;
    kvd_cluster_state_t cluster;
} kvd_health_rep_t;

/* ---- the cluster (kvdock cluster, and the peer daemons' directory) */

#define KVD_NODE_ID_BYTES 64  /* with the NUL */
#define KVD_ADDR_BYTES    128 /* HOST:PORT, with the NUL */
/* One member (ClusterReply), in the proto's field order. */
#define KVD_MEMBER_FIELDS(X)                                                    \
    X(STR, node_id, KVD_NODE_ID_BYTES, NONE, "the member's --node-id")          \
    X(STR, address, KVD_ADDR_BYTES, NONE, "HOST:PORT of its RPC")               \
    X(U64, pool_bytes, 0, NONE, "its pool's size")                              \
    X(U64, objects, 0, NONE, "objects it stores, at its last heartbeat")        \
    X(U64, directory_entries, 0, NONE, "entries of its directory share, same")  \
    X(U64, started_unix_ms, 0, NONE, "when it started (Unix ms)")               \
    X(U64, heartbeat_ms_ago, 0, NONE, "since its last heartbeat, by our clock") \
    X(BOOL, self, 0, NONE, "whether it is the daemon that answered")

typedef struct kvd_member_msg {
    KVD_MEMBER_FIELDS(KVD_FIELD_DECL)
} kvd_member_msg_t;

/* What a daemon did for the cluster (ClusterReply.counters), in the
 * proto's field order. */
#define KVD_CLUSTER_COUNTER_FIELDS(X)                                                 \
    X(U64, directory_entries, 0, GAUGE, "Entries of this daemon's directory share.")  \
    X(U64, announced_keys, 0, COUNTER, "Keys told to their directory owners.")        \
    X(U64, announce_failures, 0, COUNTER, "Announcements that did not arrive.")       \
    X(U64, announce_queued, 0, GAUGE, "Keys waiting for the next announcement.")      \
    X(U64, peer_pending, 0, GAUGE, "Calls to peer daemons queued or in flight.")      \
    X(U64, fetches, 0, COUNTER, "Fetch requests sent for remote loads.")              \
    X(U64, fetched_objects, 0, COUNTER, "Objects fetched from other members.")        \
    X(U64, fetched_bytes, 0, COUNTER, "Bytes fetched from other members.")            \
    X(U64, fetch_failures, 0, COUNTER, "Keys no member held, or whose fetch failed.") \
    X(U64, served_objects, 0, COUNTER, "Objects sent to other members.")              \
    X(U64, served_bytes, 0, COUNTER, "Bytes sent to other members.")                  \
    X(U64, fetched_ucx_objects, 0, COUNTER, "Fetched objects read over UCX.")         \
    X(U64, fetched_ucx_bytes, 0, COUNTER, "Bytes read over UCX from other members.")  \
    X(U64, dir_cache_hits, 0, COUNTER, "Keys the directory cache named a holder of.") \
    X(U64, dir_cache_misses, 0, COUNTER, "Keys the directory cache did not know.")    \
    X(U64, dir_cache_stale, 0, COUNTER,                                               \
      "Keys a cached holder no longer had (its fetch found them gone).")

typedef struct kvd_cluster_counters {
    KVD_CLUSTER_COUNTER_FIELDS(KVD_FIELD_DECL)
} kvd_cluster_counters_t;

typedef struct kvd_cluster_rep {
    kvd_cluster_state_t state;
    char node_id[KVD_NODE_ID_BYTES];
    uint64_t epoch;
    char etcd[KVD_ERROR_MAX]; /* the endpoint in use, or what went wrong */
    size_t n_members;
    kvd_member_msg_t *members;
    kvd_cluster_counters_t counters;
} kvd_cluster_rep_t;

/* Keys of one namespace in directory traffic (packed 32-byte keys). */
typedef struct kvd_dir_keys {
    char tenant[KVD_TENANT_NAME_BYTES];
    char ns_name[KVD_NS_NAME_BYTES];
    size_t n_added;
    kvd_key_t *added; /* a lookup's keys */
    size_t n_removed;
    kvd_key_t *removed;
} kvd_dir_keys_t;

typedef struct kvd_dir_announce_req {
    char holder[KVD_NODE_ID_BYTES];
    uint64_t holder_started_ms;
    bool reset; /* forget what this holder announced before */
    size_t n;
    kvd_dir_keys_t *batches;
} kvd_dir_announce_req_t;

typedef struct kvd_dir_announce_rep {
    uint64_t entries;
} kvd_dir_announce_rep_t;

typedef struct kvd_dir_lookup_req {
    size_t n;
    kvd_dir_keys_t *queries;
    bool local; /* this daemon's share only (peers); else routed to the owners */
} kvd_dir_lookup_req_t;

#define KVD_DIR_NODES_MAX 64 /* holders one reply can name (a bit each) */
typedef struct kvd_dir_lookup_rep {
    size_t n_nodes;
    char (*nodes)[KVD_NODE_ID_BYTES];
    size_t n; /* = the request's queries */
    /* per query, per key: a bit set over nodes */
    size_t *n_holders;
    uint64_t **holders;
} kvd_dir_lookup_rep_t;

typedef struct kvd_fetch_req {
    char tenant[KVD_TENANT_NAME_BYTES];
    char ns_name[KVD_NS_NAME_BYTES];
    size_t n;
    kvd_key_t *keys;
    bool pin; /* answer a lease and offsets instead of the bytes */
} kvd_fetch_req_t;

/* What a Fetch reply says of each key (FetchReply.present): not held here;
 * here (its bytes, or pinned: its offset); not now, ask again (being
 * promoted from the SSD tier, past what this reply could carry, or its pin
 * refused for a while: a holder that has it never answers absent). */
enum { KVD_FETCH_ABSENT = 0, KVD_FETCH_HERE = 1, KVD_FETCH_PROMOTING = 2 };

typedef struct kvd_fetch_rep {
    uint64_t object_bytes;
    size_t n;         /* = the request's keys */
    uint8_t *present; /* n bytes: KVD_FETCH_* */
    size_t data_len;  /* object_bytes per present key */
    const uint8_t *data;
    size_t n_depths; /* one per present key */
    uint32_t *depths;
    uint64_t lease_id; /* pin: the lease holding the present keys */
    size_t n_offsets;  /* pin: one per present key */
    uint64_t *offsets;
} kvd_fetch_rep_t;

typedef struct kvd_method_stats {
    uint64_t calls;
    uint64_t errors;
    uint64_t latency_us_sum;
    uint64_t latency_buckets[KVD_LATENCY_BUCKETS];
} kvd_method_stats_t;

/* The daemon's memory (Stats): the pool, what the OS says is resident,
 * and kvdock's own allocations by category (kvd_mem_cat_t, in its order).
 * The list gives the struct, the conversions and the JSON keys; its
 * metrics keep the names operators know (kvdock_pool_*,
 * kvdock_process_rss_*, kvdock_memory_bytes{category}), written in
 * daemon/metrics.c, whose category label is kvd_mem_cat_name's. */
#define KVD_MEM_STATS_FIELDS(X)                                                   \
    X(U64, pool_bytes, 0, NONE, "Size of the shared-memory pool.")                \
    X(U64, pool_populated_bytes, 0, NONE, "Bytes of the pool populated so far.")  \
    X(U64, rss_bytes, 0, NONE, "Resident set of the daemon (VmRSS).")             \
    X(U64, rss_anon_bytes, 0, NONE, "Anonymous resident memory (RssAnon).")       \
    X(U64, rss_file_bytes, 0, NONE, "File-backed resident memory (RssFile).")     \
    X(U64, rss_shmem_bytes, 0, NONE, "Shared-memory resident memory: the pool.")  \
    X(U64, conn_bytes, 0, NONE, "Heap bytes of connection buffers.")              \
    X(U64, index_bytes, 0, NONE, "Heap bytes of the store index.")                \
    X(U64, staging_bytes, 0, NONE, "Heap bytes of staging and bounce buffers.")   \
    X(U64, other_bytes, 0, NONE, "Other heap bytes kvdock allocated on purpose.") \
    X(BOOL, hugepages, 0, NONE, "1 when the pool uses 2 MiB hugepages.")          \
    X(BOOL, mlocked, 0, NONE, "1 when the pool is locked in memory.")

typedef struct kvd_mem_stats {
    KVD_MEM_STATS_FIELDS(KVD_FIELD_DECL)
} kvd_mem_stats_t;

/* One RDMA port the daemon found at start (Stats). Text is "" when
 * unknown; numa_node -1 when unknown, active_mtu 0 when unknown. */
#define KVD_NIC_NAME_BYTES   64 /* IBV_SYSFS_NAME_MAX */
#define KVD_NIC_STATE_BYTES  32
#define KVD_NIC_LINK_BYTES   16
#define KVD_NIC_GID_BYTES    48 /* INET6_ADDRSTRLEN */
#define KVD_NIC_NETDEV_BYTES 32
#define KVD_NIC_FIELDS(X)                                                         \
    X(STR, device, KVD_NIC_NAME_BYTES, NONE, "\"mlx5_0\"")                        \
    X(U32, port, 0, NONE, "1-based")                                              \
    X(STR, state, KVD_NIC_STATE_BYTES, NONE, "\"active\", \"down\", ...")         \
    X(STR, link_layer, KVD_NIC_LINK_BYTES, NONE, "InfiniBand, Ethernet, unknown") \
    X(STR, gid, KVD_NIC_GID_BYTES, NONE, "GID index 0, IPv6 text form")           \
    X(I32, numa_node, 0, NONE, "-1 when unknown")                                 \
    X(STR, netdev, KVD_NIC_NETDEV_BYTES, NONE, "the port's network interface")    \
    X(U32, active_mtu, 0, NONE, "bytes; 0 when unknown")

typedef struct kvd_nic_msg {
    KVD_NIC_FIELDS(KVD_FIELD_DECL)
} kvd_nic_msg_t;

/* A tenant's usage against its limits (Stats; 0 = no limit). */
#define KVD_TENANT_FIELDS(X)                                                    \
    X(U32, id, 0, NONE, "the tenant's id")                                      \
    X(STR, name, KVD_TENANT_NAME_BYTES, NONE, "the tenant's name")              \
    X(U64, bytes, 0, GAUGE, "Pool bytes of the tenant's objects.")              \
    X(U64, max_bytes, 0, GAUGE, "The tenant's byte quota; 0 = none.")           \
    X(U64, pins, 0, GAUGE, "Pins the tenant's read leases hold.")               \
    X(U64, max_pins, 0, GAUGE, "The tenant's pin quota; 0 = none.")             \
    X(U64, leases, 0, GAUGE, "Leases the tenant holds open.")                   \
    X(U64, max_leases, 0, GAUGE, "The tenant's lease quota; 0 = none.")         \
    X(U64, namespaces, 0, GAUGE, "Namespaces of the tenant.")                   \
    X(U64, max_namespaces, 0, GAUGE, "The tenant's namespace quota; 0 = none.") \
    X(U64, quota_refusals, 0, COUNTER, "Keys and calls refused for a quota.")   \
    X(U64, quota_evictions, 0, COUNTER, "Own objects evicted to stay within quota.")

typedef struct kvd_tenant_msg {
    KVD_TENANT_FIELDS(KVD_FIELD_DECL)
} kvd_tenant_msg_t;

typedef struct kvd_stats_rep {
    char daemon_version[KVD_VERSION_MAX];
    char instance[KVD_NAME_MAX];
    kvd_health_t state;
    uint64_t uptime_ms;
    kvd_mem_stats_t memory;
    uint64_t connections_current;
    uint64_t connections_total;
    uint64_t connections_rejected;
    uint64_t protocol_errors;
    uint64_t auth_failures;           /* a method before Hello, or a credential refused */
    uint64_t connections_timed_out;   /* --hello-timeout-ms, --frame-timeout-ms */
    uint64_t connections_over_buffer; /* --max-conn-buffer */
    uint64_t acquires_held;           /* now: waiting for their objects (wait_ms) */
    uint64_t acquires_held_total;     /* since the start */
    kvd_method_stats_t methods[KVD_METHOD_COUNT]; /* index = kvd_method_t */
    kvd_store_stats_msg_t store;
    size_t n_namespaces;
    kvd_ns_msg_t *namespaces;
    bool checked;
    char check_error[KVD_ERROR_MAX];
    uint64_t check_us; /* how long the check held the daemon's loop */
    size_t n_nics;     /* 0: no RDMA devices, or built without libibverbs */
    kvd_nic_msg_t *nics;
    size_t n_tenants; /* the caller's tenant; every tenant for an operator */
    kvd_tenant_msg_t *tenants;
} kvd_stats_rep_t;

/*
 * One RPC message. A request has reply = false and the body of its method
 * (Health and Stats requests have none). A reply has reply = true, the id
 * and method of its request, and either status = KVD_OK and the body of its
 * method, or a negative status, an error text and no body.
 */
typedef struct kvd_arena_block kvd_arena_block_t;

typedef struct kvd_msg {
    uint64_t id;
    kvd_method_t method;
    bool reply;
    int32_t status;
    uint32_t error_index; /* failed batch item + 1; 0 = none */
    char error[KVD_ERROR_MAX];
    union {
        kvd_hello_req_t hello_req;
        kvd_hello_rep_t hello_rep;
        kvd_health_rep_t health_rep;
        kvd_stats_req_t stats_req;
        kvd_stats_rep_t stats_rep;
        kvd_register_req_t register_req;
        kvd_ids_rep_t register_rep;
        kvd_reserve_req_t reserve_req;
        kvd_reserve_rep_t reserve_rep;
        kvd_finish_req_t finish_req; /* publish and revoke */
        kvd_acquire_req_t acquire_req;
        kvd_acquire_rep_t acquire_rep;
        kvd_release_req_t release_req;
        kvd_lookup_req_t lookup_req;
        kvd_lookup_rep_t lookup_rep;
        kvd_inspect_req_t inspect_req;
        kvd_inspect_rep_t inspect_rep;
        kvd_evict_req_t evict_req;
        kvd_evict_rep_t evict_rep;
        kvd_list_req_t list_req;
        kvd_list_rep_t list_rep;
        kvd_cluster_rep_t cluster_rep;
        kvd_dir_announce_req_t dir_announce_req;
        kvd_dir_announce_rep_t dir_announce_rep;
        kvd_dir_lookup_req_t dir_lookup_req;
        kvd_dir_lookup_rep_t dir_lookup_rep;
        kvd_fetch_req_t fetch_req;
        kvd_fetch_rep_t fetch_rep;
    } body;
    kvd_arena_block_t *arena; /* owned memory of the variable-length parts */
} kvd_msg_t;

/* Zeroed memory owned by m, freed by kvd_msg_clear(); NULL when out of
 * memory. */
void *kvd_msg_alloc(kvd_msg_t *m, size_t bytes);
/* Frees m's arena and zeroes m. Safe on a zeroed message. */
void kvd_msg_clear(kvd_msg_t *m);

/* Initialises m (any previous arena is NOT freed: clear first when reusing)
 * and sets a request header. */
void kvd_msg_request(kvd_msg_t *m, uint64_t id, kvd_method_t method);
/* Initialises m likewise and sets an error reply to (id, method). */
void kvd_msg_error(kvd_msg_t *m, uint64_t id, kvd_method_t method, int status,
                   const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/*
 * Encodes m as one frame (header + payload) appended to out. Every string
 * field goes out as valid UTF-8 (proto3 requires it): one that is not (a
 * buffer cut inside a character, a stray byte) is sent cut between
 * characters, with '?' for a stray byte; m itself is not changed. Fails with
 * KVD_ERR_TOO_LARGE when the payload exceeds max_frame, KVD_ERR_INVALID for
 * a method or body that cannot be encoded, KVD_ERR_NOMEM.
 */
int kvd_msg_pack(const kvd_msg_t *m, size_t max_frame, kvd_buf_t *out);

/*
 * Decoding memory budget: while protobuf-c unpacks a payload of len bytes,
 * the memory it holds at any moment (charged to KVD_MEM_CONN) may not exceed
 * KVD_DECODE_BUDGET_PER_BYTE * len + KVD_DECODE_BUDGET_EXTRA_BYTES. A payload
 * that needs more (say, millions of empty submessages) is refused as
 * malformed. Batches of keys need about 1 byte per payload byte, lists of
 * objects about 4, namespaces with names of 20 characters or more about 4 to
 * 7, thousands of namespaces with names of a few characters up to about 19
 * (about 170 bytes each). With a limit on items (kvd_msg_decode_limited,
 * max_items below SIZE_MAX), each item the limit allows (max_items, at most
 * one per KVD_DECODE_ITEM_MIN_BYTES of payload: a namespace needs a name
 * and an object size) adds KVD_DECODE_BUDGET_PER_ITEM: so every valid
 * request within the limits decodes, however short its names.
 */
#define KVD_DECODE_BUDGET_PER_BYTE    16u
#define KVD_DECODE_BUDGET_EXTRA_BYTES (64u * 1024u)
#define KVD_DECODE_BUDGET_PER_ITEM    256u
#define KVD_DECODE_ITEM_MIN_BYTES     7u

/*
 * Limits on the variable parts of a decoded request, checked after the
 * payload is parsed and before any of the message's arena is allocated:
 * max_items bounds each batch (namespaces of Hello and RegisterNamespace,
 * the keys of each Lookup pool, of Reserve, Publish/Revoke and Acquire,
 * Reserve's parents and depths), max_pools the pools of one Lookup.
 * SIZE_MAX in a field means no limit on it. Replies are not limited.
 */
typedef struct kvd_msg_limits {
    size_t max_items;
    size_t max_pools;
} kvd_msg_limits_t;

/*
 * Decodes one payload into out (initialised here; a previous arena is not
 * freed). The caller calls kvd_msg_clear(out) when done, also after
 * an error. Returns KVD_OK; KVD_ERR_PROTOCOL when the bytes are not an
 * Envelope, the body does not belong to the method, a string field is not
 * valid UTF-8 (an error text is taken anyway, made valid the way
 * kvd_msg_pack does), or unpacking would
 * exceed the decoding memory budget above; KVD_ERR_UNKNOWN_METHOD when the
 * method is outside this build's enum (out->id is set then, so the error
 * reply can name the request). No item limits: see kvd_msg_decode_limited.
 */
int kvd_msg_decode(const uint8_t *payload, size_t len, kvd_msg_t *out);

/*
 * kvd_msg_decode with the request limits of *lim (NULL = none). Returns
 * also KVD_ERR_TOO_LARGE when a batch is over lim->max_items or a Lookup
 * names more than lim->max_pools pools; out->id, out->method and out->reply
 * are set then (and no body), so the error reply can name the request.
 */
int kvd_msg_decode_limited(const uint8_t *payload, size_t len,
                           const kvd_msg_limits_t *lim, kvd_msg_t *out);

/* --------------------------------------------------------------- client */

/*
 * A blocking RPC client on one connection. Used by the CLI, the linker,
 * tests and benchmarks. Calls may come from several threads at once: their
 * requests go out whole one call after the other and each call's replies
 * reach it whichever thread reads them, so a call waits for the daemon's
 * replies to what was sent before it, never for another caller's thread.
 * Connect, close and kvd_client_take_fd belong to one thread with no call
 * in flight.
 */
typedef struct kvd_client kvd_client_t;

/* Connects to a Unix socket path. KVD_ERR_UNAVAILABLE when nobody listens. */
int kvd_client_connect_unix(const char *path, int timeout_ms, kvd_client_t **out);
/* Connects to "HOST:PORT" ("[v6]:PORT" for IPv6) over TCP. */
int kvd_client_connect_tcp(const char *host_port, int timeout_ms, kvd_client_t **out);
void kvd_client_close(kvd_client_t *c);
int kvd_client_fd(const kvd_client_t *c);

/*
 * Sends req (its id is assigned here) and waits up to timeout_ms for the
 * reply with the same id, or an error reply with id 0 (the daemon refusing
 * the connection or the frame). Late replies to earlier calls that timed
 * out are read and dropped. Returns KVD_OK with *rep filled (check
 * rep->status for an error reply), KVD_ERR_TIMEOUT, KVD_ERR_CLOSED,
 * KVD_ERR_PROTOCOL.
 * rep is initialised here (a previous arena in it is not freed) and owns the
 * reply's variable parts: call kvd_msg_clear(rep) when done, on any result.
 */
int kvd_client_call(kvd_client_t *c, kvd_msg_t *req, kvd_msg_t *rep, int timeout_ms);

/*
 * kvd_client_call for n requests in one round trip: all are sent, then
 * each reply is put where its id says (reps[i] answers reqs[i]). KVD_OK
 * when every reply came (each reps[i].status says how its request went);
 * otherwise the first failure, every reps[i] cleared, and nothing of this
 * call left to go out later. After a refusal (an error reply with id 0)
 * the first unanswered reps[i] is that reply and the others carry its
 * status. Each reps[i] owns its variable parts: kvd_msg_clear each, on any
 * result.
 */
int kvd_client_call_many(kvd_client_t *c, kvd_msg_t *reqs, kvd_msg_t *reps, size_t n,
                         int timeout_ms);
/* kvd_client_call_many bounded by a deadline (kvd_now_ns) instead of a
 * timeout: every wait of the call, for the socket and for the calls
 * before it, ends by then (KVD_ERR_TIMEOUT). */
int kvd_client_call_many_until(kvd_client_t *c, kvd_msg_t *reqs, kvd_msg_t *reps,
                               size_t n, uint64_t deadline);

/*
 * Whether the daemon has ended the connection: its socket shows a hang-up
 * (whatever is still unread). Reads nothing, so it may be called while
 * other threads call on c. A daemon ends leases by ending the connection
 * (or by their TTL), so a connection not ended is one whose leases the
 * daemon has not dropped for that reason.
 */
bool kvd_client_ended(const kvd_client_t *c);

/* Connects to the daemon at a Unix socket, says Hello (the daemon knows a
 * Unix peer by its uid), asks Health once and disconnects: the daemon's
 * state (kvd_health_state_t, >= 0) or a negative status. For readiness
 * polls (tests, benchmarks). */
int kvd_client_health_once(const char *path, int connect_ms, int call_ms);

/*
 * Says Hello on c without namespaces: what every connection does first
 * (the daemon refuses every other method before it). token (token_len
 * bytes, none when 0) is the credential TCP needs; a Unix-socket peer may
 * go without. Returns KVD_OK with *out filled when not NULL (without its
 * variable parts), a transport error, or the daemon's refusal
 * (KVD_ERR_AUTH: the daemon closes the connection after it).
 */
int kvd_client_hello(kvd_client_t *c, const char *client_name, const uint8_t *token,
                     size_t token_len, int timeout_ms, kvd_hello_rep_t *out);

/* The file descriptor that arrived with the last reply (SCM_RIGHTS), handed
 * over to the caller (who closes it); -1 when none came. */
int kvd_client_take_fd(kvd_client_t *c);

/* The default Unix socket of a daemon instance:
 * $XDG_RUNTIME_DIR/kvdockd-INSTANCE.sock, or /tmp/kvdockd-INSTANCE.sock. */
void kvd_default_socket_path(const char *instance, char *buf, size_t len);

/* Splits "HOST:PORT" / "[V6]:PORT" into host and port. */
int kvd_parse_host_port(const char *text, char *host, size_t host_len, uint16_t *port);

/* --------------------------------------------------- operator queries */

/*
 * What an operator's client asks (query.c), shared by the kvdock CLI and
 * libkvdock's store client. A query makes its RPCs through the caller's
 * kvd_call_fn, which connects (or not) and reports failures its own way.
 */

/*
 * One RPC as the caller makes it: sends req, fills rep (initialised by the
 * callee; the caller clears it with kvd_msg_clear on any result). Returns
 * KVD_OK when the daemon answered with KVD_OK, else a negative status: the
 * transport's, or the daemon's error reply (rep->error its message).
 */
typedef int (*kvd_call_fn)(void *ctx, kvd_msg_t *req, kvd_msg_t *rep);

/* Reads the credential a client presents: the file at path, or when path
 * is NULL the one $KVDOCK_AUTH_TOKEN_FILE names; neither (or ""): none,
 * *len 0 and KVD_OK. Errors as kvd_token_read's (why says what). */
int kvd_client_token_read(const char *path, uint8_t *buf, size_t cap, size_t *len,
                          char *why, size_t why_len);

/*
 * Connects to the daemon over TCP at connect ("HOST:PORT") when it is not
 * NULL, else at the Unix socket_path, and says Hello as client_name with
 * the token (token_len bytes; none when 0), all within timeout_ms. Returns
 * KVD_OK with *out, or the connect's error (*refused false) or the Hello's
 * (*refused true: a transport error or the daemon's refusal, KVD_ERR_AUTH
 * for a credential it does not take). hello (may be NULL) gets the Hello
 * reply's fixed fields (its arrays and UCX address are not kept).
 */
int kvd_client_open(const char *socket_path, const char *connect, const char *client_name,
                    const uint8_t *token, size_t token_len, int timeout_ms,
                    kvd_client_t **out, bool *refused, kvd_hello_rep_t *hello);

/* The name of namespace id in a reply's namespace table; "?" when absent. */
const char *kvd_ns_msg_name(const kvd_ns_msg_t *ns, size_t n, uint32_t id);
/* The id of the namespace called name: KVD_OK, or KVD_ERR_NOT_FOUND. */
int kvd_ns_msg_find(const kvd_ns_msg_t *ns, size_t n, const char *name, uint32_t *id);

/* Pages one listing follows at most: with the daemon's pages of up to
 * --max-batch entries, far more than any store holds. */
#define KVD_LIST_PAGES_MAX 100000

/* The pages of one listing, and their entries seen as one reply (`all`
 * points into the pages, which live until kvd_list_pages_free). */
typedef struct kvd_list_pages {
    kvd_msg_t **msgs;
    size_t n, cap;
    kvd_list_rep_t all;
} kvd_list_pages_t;

/*
 * Lists the stored prefixes of namespace ns_name (NULL: every one), with
 * their objects when nodes, page after page with the daemon's cursors
 * until there is no more, limit entries (0: no limit; at most UINT32_MAX)
 * are in, or KVD_LIST_PAGES_MAX pages came; p->all.truncated says that it
 * stopped before the end. p is initialised here; kvd_list_pages_free(p)
 * after any result. Errors: the call's, KVD_ERR_NOMEM.
 */
int kvd_list_fetch(kvd_call_fn call, void *ctx, const char *ns_name, bool nodes,
                   uint64_t limit, kvd_list_pages_t *p);
void kvd_list_pages_free(kvd_list_pages_t *p);

/*
 * A Lookup of the same n_keys keys in each of n_ns namespaces named by
 * ns_names (1..KVD_LOOKUP_POOLS_MAX), with trailing[i] as namespace i's
 * hit policy (NULL: 0, every page): the Stats reply's namespace table
 * turns the names into ids, then one Lookup goes into rep (cleared by the
 * caller on any result). Errors: KVD_ERR_INVALID (no namespace or key, too
 * many namespaces), KVD_ERR_NOT_FOUND for a name the daemon does not know
 * (*unknown its index; n_ns otherwise), the calls'.
 */
int kvd_lookup_named(kvd_call_fn call, void *ctx, const char *const *ns_names,
                     const uint32_t *trailing, size_t n_ns, const kvd_key_t *keys,
                     size_t n_keys, kvd_msg_t *rep, size_t *unknown);

/*
 * An Evict as `first` says (a key, a namespace, or all), continued with
 * each reply's cursor while the daemon evicts a namespace in slices, for
 * at most max_calls calls: *evicted sums the objects dropped, *skipped is
 * the last reply's count of those that stayed (pinned or being written),
 * *complete says that no cursor was left. Errors: the calls' (the counts
 * say what was done before).
 */
int kvd_evict_run(kvd_call_fn call, void *ctx, const kvd_evict_req_t *first,
                  uint32_t max_calls, uint64_t *evicted, uint64_t *skipped,
                  bool *complete);

/* ----------------------------------------------------------------- JSON */

/*
 * The replies as JSON (json.c): what `kvdock ... --json` prints and the
 * store client returns. Each writes one value to f, without a trailing
 * newline; keys of flat messages are their field lists' names. Returns
 * KVD_OK, or KVD_ERR_IO when writing to f failed.
 */
int kvd_json_health(FILE *f, const kvd_health_rep_t *h);
int kvd_json_stats(FILE *f, const kvd_stats_rep_t *st);
/* {"truncated":...,"prefixes":[...]} and "nodes" when the listing has
 * objects; namespaces by name. */
int kvd_json_list(FILE *f, const kvd_list_rep_t *l);
/* [objects...] of an Inspect reply. */
int kvd_json_inspect(FILE *f, const kvd_inspect_rep_t *r);
/* {"boundaries":[...],"longest":N}, N 0 when there is none. */
int kvd_json_lookup(FILE *f, const kvd_lookup_rep_t *r);
/* {"state":..,"node":..,"epoch":N,"etcd":..,"members":[{"node":..,
 * "address":..,"pool_bytes":N,"objects":N,"directory_entries":N,
 * "started_unix_ms":N,"heartbeat_ms_ago":N,"self":B},...]} */
int kvd_json_cluster(FILE *f, const kvd_cluster_rep_t *c);

/* s as a JSON string literal. */
void kvd_json_str(FILE *f, const char *s);
/* Every field of obj as JSON members ("name":value, comma separated, no
 * braces). */
void kvd_json_fields(FILE *f, const kvd_field_list_t *l, const void *obj);

#endif /* KVD_PROTO_H */
