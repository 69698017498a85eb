/*
 * kvd_store.h - the one public header of store/, in three parts:
 *   sizing  how big the pool is: the rule of DESIGN.md section 9, a pure
 *           function of the host's memory figures (so that tests drive it
 *           with fixture directories), and the reader of those figures;
 *   pool    the pool itself, a shared-memory file the daemon maps and
 *           populates at a bounded rate on a thread of its own;
 *   engine  the store engine (DESIGN.md sections 3 to 5): namespaces, the
 *           allocator, the index, the objects' lifecycle, leases, eviction,
 *           lookups and inspection; bookkeeping only, never the pool's bytes.
 *
 * Threading: kvd_pool_* may be called from the daemon's loop thread while the
 * population thread runs; the progress counters are atomics. The engine has
 * no lock of its own (see its section).
 */
#ifndef KVD_STORE_H
#define KVD_STORE_H

#include "kvd_common.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---------------------------------------------------------------- sizing */

/* What the host has, read from /proc/meminfo and the memory cgroup. */
typedef struct kvd_host_mem {
    uint64_t mem_total_bytes;     /* MemTotal */
    uint64_t mem_available_bytes; /* MemAvailable */
    uint64_t cgroup_limit_bytes;  /* UINT64_MAX when unlimited or absent */
    uint64_t cgroup_usage_bytes;  /* 0 when absent */
    int cgroup_version;           /* 0 (none found), 1 or 2 */
} kvd_host_mem_t;

/*
 * Reads the memory figures below `root` ("" or "/" for the live system, a
 * fixture directory in tests): root/proc/meminfo, root/proc/self/cgroup and
 * the cgroup files under root/sys/fs/cgroup. The tightest limit on the path
 * from the process's cgroup up to the root counts. Returns KVD_OK, or
 * KVD_ERR_NOT_FOUND / KVD_ERR_INVALID when meminfo is missing or unreadable.
 */
int kvd_host_mem_probe(const char *root, kvd_host_mem_t *out);

typedef struct kvd_sizing_req {
    uint64_t pool_size_bytes; /* --pool-size; 0 when not given */
    double mem_fraction;      /* --mem-fraction; 0 when not given */
    uint64_t reserve_bytes;   /* --reserve: kept free for everything else */
    uint64_t object_bytes;    /* a typical object, for the "fits" figure */
    uint64_t align_bytes;     /* the pool's page size (4 KiB, 2 MiB) */
} kvd_sizing_req_t;

typedef struct kvd_sizing {
    uint64_t limit_bytes;      /* min(MemTotal, cgroup limit) */
    uint64_t can_give_bytes;   /* min(MemAvailable, cgroup limit - usage) */
    uint64_t budget_bytes;     /* the pool's size, aligned */
    uint64_t max_budget_bytes; /* the largest pool that fits now */
    double max_fraction;       /* the --mem-fraction giving max_budget */
    uint64_t objects_fit;      /* budget / object_bytes */
    const char *source;        /* "pool-size" or "mem-fraction" */
} kvd_sizing_t;

/*
 * The sizing rule. The budget is --pool-size exactly, or
 * floor(mem_fraction * limit) - reserve: a function of the limit, which does
 * not change between starts, never of a free-memory snapshot. The snapshot
 * (can_give) only decides whether the budget plus the reserve fits now.
 *
 * Returns KVD_OK with *out filled; KVD_ERR_INVALID when both or neither of
 * pool size and fraction are given, or the budget is below one page or one
 * object; KVD_ERR_NO_SPACE when it does not fit. On error `why` (may be NULL)
 * says what is wrong and which value would work.
 */
int kvd_sizing_compute(const kvd_host_mem_t *host, const kvd_sizing_req_t *req,
                       kvd_sizing_t *out, char *why, size_t why_len);

/* The one startup line with every input and the result. */
void kvd_sizing_format(const kvd_host_mem_t *host, const kvd_sizing_req_t *req,
                       const kvd_sizing_t *s, char *buf, size_t buf_len);

/* ------------------------------------------------------------------ pool */

typedef struct kvd_pool_opts {
    const char *instance;       /* names the memfd: "kvdock-<instance>" */
    uint64_t size_bytes;        /* from kvd_sizing_t.budget_bytes */
    bool hugepages;             /* 2 MiB hugetlb pages */
    bool mlock;                 /* lock the pool once populated */
    uint64_t populate_rate_bps; /* bytes per second; 0 = no bound */
} kvd_pool_opts_t;

typedef struct kvd_pool kvd_pool_t;

/*
 * Creates the shared-memory file and maps it. Nothing is populated yet.
 * Errors: KVD_ERR_INVALID (size not a multiple of the page size),
 * KVD_ERR_UNSUPPORTED (no hugetlb memfd), or the mapping's error.
 */
int kvd_pool_create(const kvd_pool_opts_t *opts, kvd_pool_t **out);

/* Starts the population thread: fallocate then map each chunk, at most
 * populate_rate_bps, with a progress line per 10%. */
int kvd_pool_populate_start(kvd_pool_t *p);

/* Stops population (if running), unmaps and closes. NULL is fine. */
void kvd_pool_destroy(kvd_pool_t *p);

/* True once the whole pool is populated (and locked, if asked). */
bool kvd_pool_ready(const kvd_pool_t *p);
/* KVD_OK while fine; the population's error once it failed. */
int kvd_pool_error(const kvd_pool_t *p);
/* Why the population failed, with the system's reason and what would fix
 * it ("mlock of 1.00 GiB failed: Cannot allocate memory (raise
 * RLIMIT_MEMLOCK, ...)"); "" while kvd_pool_error is KVD_OK. */
const char *kvd_pool_error_text(const kvd_pool_t *p);
uint64_t kvd_pool_populated_bytes(const kvd_pool_t *p);
uint64_t kvd_pool_size(const kvd_pool_t *p);
bool kvd_pool_hugepages(const kvd_pool_t *p);
bool kvd_pool_mlocked(const kvd_pool_t *p);
int kvd_pool_fd(const kvd_pool_t *p);

/* ---------------------------------------------------------------- engine */

/*
 * The store engine (DESIGN.md sections 3 to 5): namespaces, an extent
 * allocator over the pool, the index of objects, their lifecycle
 * (Reserve -> WRITING -> Publish -> READY <-> pinned), leases, eviction and
 * lookups. It does bookkeeping only: it never touches the pool's bytes, so
 * it can be driven in-process by tests and benchmarks at any pool size.
 *
 * Threading: none inside: callers serialise every call (the daemon calls
 * it from its event loop only; its metrics endpoint reads snapshots).
 *
 * Ownership of holds: every reservation and pin belongs to a lease; a lease
 * belongs to an owner (the daemon uses the connection id). Ending a lease
 * (Publish/Revoke of all its reservations, Release, its owner gone, its TTL
 * passed) undoes what it still holds.
 */

#define KVD_NS_NAME_MAX          256
#define KVD_STORE_MAX_NAMESPACES 4096

typedef enum kvd_obj_state {
    KVD_OBJ_WRITING = 1, /* reserved, being written, invisible to readers */
    KVD_OBJ_READY = 2,   /* published; pinned while pins > 0 */
} kvd_obj_state_t;

typedef enum kvd_tier {
    KVD_TIER_DRAM = 0,
    KVD_TIER_SSD = 1,
} kvd_tier_t;

/* kvd_reserve_result_t, the per-key answer of kvd_store_reserve, is in
 * kvd_common.h: the RPC carries it too. */

typedef struct kvd_store_config {
    uint64_t pool_bytes;   /* bytes of pool the store manages */
    uint32_t page_bytes;   /* allocation unit and alignment (4096) */
    double evict_high;     /* evict when used > evict_high * pool (0.95) */
    double evict_low;      /* ... down to evict_low * pool (0.90) */
    uint64_t lease_ttl_ms; /* a lease not ended by then is undone (30000) */
    uint64_t index_hint;   /* objects expected: sizes the first hash table */
} kvd_store_config_t;

typedef struct kvd_store kvd_store_t;

/* Fills the defaults above for a pool of pool_bytes. */
void kvd_store_config_default(kvd_store_config_t *cfg, uint64_t pool_bytes);

/* KVD_ERR_INVALID for a pool over 2^32 pages or bad watermarks. */
int kvd_store_create(const kvd_store_config_t *cfg, kvd_store_t **out);
void kvd_store_destroy(kvd_store_t *s);

/* A key with what Reserve records about its place in its chain. */
typedef struct kvd_put {
    const uint8_t *key;    /* KVD_KEY_BYTES */
    const uint8_t *parent; /* KVD_KEY_BYTES, NULL for the first page of a chain */
    uint32_t depth;        /* page index in the chain: 0 for the first */
} kvd_put_t;

/* Where an object lives in the pool. */
typedef struct kvd_loc {
    uint64_t offset;
    uint64_t size;
} kvd_loc_t;

/* --- namespaces */

/*
 * Registers (or finds) a namespace. The same name with the same object size
 * and flag is idempotent; a different size or flag is KVD_ERR_INVALID.
 * KVD_ERR_NO_SPACE past KVD_STORE_MAX_NAMESPACES; KVD_ERR_INVALID for an
 * empty or over-long name, a zero size, or an object larger than the pool.
 */
int kvd_store_ns_register(kvd_store_t *s, const char *name, uint64_t object_bytes,
                          bool rank_replicated, uint32_t *ns_id);
int kvd_store_ns_find(const kvd_store_t *s, const char *name, uint32_t *ns_id);

typedef struct kvd_ns_info {
    char name[KVD_NS_NAME_MAX];
    uint64_t object_bytes;
    bool rank_replicated;
    uint64_t objects_ready;
    uint64_t objects_writing;
    uint64_t objects_pinned;
    uint64_t lookup_pages; /* pages probed by lookups */
    uint64_t hit_pages;    /* ... of which present */
    uint64_t evictions;
    uint64_t published_bytes;  /* offloaded into this namespace */
    uint64_t acquired_bytes;   /* loaded (pinned for reading) */
    uint64_t acquire_failures; /* Acquires refused: a key missing or busy */
} kvd_ns_info_t;

uint32_t kvd_store_ns_count(const kvd_store_t *s);
int kvd_store_ns_info(const kvd_store_t *s, uint32_t ns_id, kvd_ns_info_t *out);

/* --- tenants
 *
 * A tenant owns namespaces; the connections of its credential (the daemon's
 * auth config) see and touch only those, within its limits. Tenant 0,
 * KVD_TENANT_DEFAULT ("default"), exists from creation without limits: a
 * daemon with no tenants configured is one tenant. A limit of 0 means none.
 */
#define KVD_TENANTS_MAX     256
#define KVD_TENANT_NAME_MAX 64
#define KVD_TENANT_DEFAULT  0u

typedef struct kvd_tenant_limits {
    uint64_t max_bytes;      /* pool bytes of its objects, writing or ready */
    uint64_t max_pins;       /* objects its read leases pin at once */
    uint64_t max_leases;     /* leases open at once */
    uint64_t max_namespaces; /* namespaces registered at once */
} kvd_tenant_limits_t;

/* Adds a tenant: KVD_ERR_EXISTS when the name is taken, KVD_ERR_NO_SPACE
 * past KVD_TENANTS_MAX, KVD_ERR_INVALID for an empty or long name. */
int kvd_store_tenant_add(kvd_store_t *s, const char *name, const kvd_tenant_limits_t *lim,
                         uint32_t *id);
int kvd_store_tenant_find(const kvd_store_t *s, const char *name, uint32_t *id);
/* The tenant's name; NULL for an id never added. */
const char *kvd_store_tenant_name(const kvd_store_t *s, uint32_t id);
uint32_t kvd_store_tenant_count(const kvd_store_t *s);

/* --- lifecycle */

/*
 * Put-if-absent for each key of namespace ns. results[i] says what happened;
 * locs[i] is set for ALLOCATED. All ALLOCATED keys are held by one new write
 * lease of `owner`, returned in *lease_id (0 when nothing was allocated).
 * Eviction makes room as needed (watermarks, then on demand). A key answers
 * NO_SPACE without evicting anything when even all evictable objects beside
 * the free space would be too few, and after at most 64 + 4 * (its pages)
 * evictions when fragmentation keeps a hole from forming.
 */
int kvd_store_reserve(kvd_store_t *s, uint64_t owner, uint32_t ns, const kvd_put_t *items,
                      size_t n, uint64_t now_ms, uint64_t *lease_id, uint8_t *results,
                      kvd_loc_t *locs);

/*
 * Makes the reservations of write lease `lease_id` visible, atomically: all
 * of them (keys == NULL) or the n given keys. Every key must be a reservation
 * of that lease, else KVD_ERR_STATE and nothing changes. The lease ends when
 * it holds nothing more. KVD_ERR_NOT_FOUND for an unknown (or ended) lease,
 * KVD_ERR_PERMISSION for another owner's, KVD_ERR_STATE for a read lease.
 */
int kvd_store_publish(kvd_store_t *s, uint64_t owner, uint64_t lease_id,
                      const uint8_t (*keys)[KVD_KEY_BYTES], size_t n);

/* Frees reservations (all, or the n given keys), same rules as publish. */
int kvd_store_revoke(kvd_store_t *s, uint64_t owner, uint64_t lease_id,
                     const uint8_t (*keys)[KVD_KEY_BYTES], size_t n);

/*
 * Pins every key for reading, all or nothing: on success locs[i] says where
 * each is and *lease_id holds the pins (0 and no lease for n = 0). Otherwise
 * nothing is pinned and *first_bad is the index of the first key that is
 * missing (KVD_ERR_NOT_FOUND), still being written (KVD_ERR_BUSY) or pinned
 * 65535 times already (KVD_ERR_NO_SPACE); KVD_ERR_NOMEM names key 0.
 */
int kvd_store_acquire(kvd_store_t *s, uint64_t owner, uint32_t ns,
                      const uint8_t (*keys)[KVD_KEY_BYTES], size_t n, uint64_t now_ms,
                      uint64_t *lease_id, kvd_loc_t *locs, size_t *first_bad);

/* Ends read lease lease_id, unpinning what it holds. Errors as publish. */
int kvd_store_release(kvd_store_t *s, uint64_t owner, uint64_t lease_id);

/*
 * Ends every lease of owner (its connection closed). Returns how many. Its
 * reservations become invisible at once (the keys can be reserved again)
 * but their extents stay quarantined for one lease TTL, so that a writer
 * still copying lands in nothing live; pins are released.
 */
size_t kvd_store_owner_gone(kvd_store_t *s, uint64_t owner);

/* Ends every lease whose TTL passed by now_ms (reservations quarantined as
 * above) and frees quarantined extents whose grace is over. Callers pass a
 * monotonic clock, never going back. Returns the leases ended. */
size_t kvd_store_expire(kvd_store_t *s, uint64_t now_ms);

/* --- lookup */

typedef struct kvd_lookup_pool {
    uint32_t ns;
    const uint8_t (*keys)[KVD_KEY_BYTES]; /* page keys of the prompt's tail, in order */
    size_t n_keys;
    uint32_t trailing_pages; /* 0: ALL_PAGES; n: TRAILING_PAGES(n) */
} kvd_lookup_pool_t;

/*
 * Every boundary b (in pages, 1..min n_keys) restorable for all pools, in
 * increasing order: ALL_PAGES needs pages 0..b-1 present, TRAILING_PAGES(n)
 * needs pages b-n..b-1 (clamped at 0). Present = READY. `boundaries` must
 * hold min n_keys entries. Counts probed and present pages per namespace.
 */
int kvd_store_lookup(kvd_store_t *s, const kvd_lookup_pool_t *pools, size_t n_pools,
                     uint32_t *boundaries, size_t *n_boundaries);

/* --- inspection and eviction */

typedef struct kvd_obj_info {
    uint8_t key[KVD_KEY_BYTES];
    uint8_t parent_tag[KVD_KEY_TAG_BYTES]; /* the parent key's tag (kvd_store_key_tag) */
    bool has_parent;
    uint32_t ns;
    uint32_t depth;
    kvd_obj_state_t state;
    kvd_tier_t tier;
    uint32_t pins;
    uint32_t hits;           /* acquires (saturates at 65535) */
    uint32_t children;       /* stored pages naming this one as parent */
    uint64_t last_access_ms; /* wall clock of the last publish or acquire */
    kvd_loc_t loc;
} kvd_obj_info_t;

/* KVD_ERR_NOT_FOUND when the key is not in ns. */
int kvd_store_inspect(const kvd_store_t *s, uint32_t ns, const uint8_t key[KVD_KEY_BYTES],
                      kvd_obj_info_t *out);

/* The object of ns whose key starts with the 8-byte tag (a parent). */
int kvd_store_find_tag(const kvd_store_t *s, uint32_t ns,
                       const uint8_t tag[KVD_KEY_TAG_BYTES], kvd_obj_info_t *out);

/* A key's 8-byte tag: a hash keyed with this store's seed (so clients, who
 * choose keys, cannot aim at one index bucket). */
void kvd_store_key_tag(const kvd_store_t *s, const uint8_t key[KVD_KEY_BYTES],
                       uint8_t tag[KVD_KEY_TAG_BYTES]);

/* Calls fn for every object (of ns, or all when ns == UINT32_MAX) until fn
 * returns non-zero, which is returned. No mutation from inside fn. */
typedef int (*kvd_obj_fn)(const kvd_obj_info_t *info, void *arg);
int kvd_store_foreach(const kvd_store_t *s, uint32_t ns, kvd_obj_fn fn, void *arg);

/*
 * Resumable iteration, for work that must be cut into bounded slices (a
 * paged listing): visits the objects of ns (UINT32_MAX: all) from position
 * *pos (0: the start) in a fixed order, calling fn for each, and stops
 *   - when fn returns non-zero: returns it, *pos is that object's position
 *     (calling again starts with it);
 *   - after max_visits records (objects or not) were looked at: returns 0,
 *     *pos is where to continue;
 *   - at the end: returns 0, *pos = KVD_STORE_POS_END.
 * A position stays meaningful while the store changes: each object present
 * throughout a walk is visited exactly once; one added behind the position
 * is missed, one removed is not visited. No mutation from inside fn.
 */
#define KVD_STORE_POS_END UINT64_MAX
int kvd_store_foreach_from(const kvd_store_t *s, uint32_t ns, uint64_t *pos,
                           uint64_t max_visits, kvd_obj_fn fn, void *arg);

/* A check value of a position (and a caller's salt), keyed with this
 * store's secret: a position handed to a client and back (a cursor) is
 * verified with it, so a forged one is refused rather than walked. */
uint64_t kvd_store_pos_check(const kvd_store_t *s, uint64_t pos, uint64_t salt);

/* Evicts one READY, unpinned object: KVD_ERR_BUSY when pinned or being
 * written, KVD_ERR_NOT_FOUND when absent. */
int kvd_store_evict_key(kvd_store_t *s, uint32_t ns, const uint8_t key[KVD_KEY_BYTES]);
/* Evicts every READY, unpinned object of ns (UINT32_MAX: all); counts what
 * went and what had to stay (pinned or being written). */
int kvd_store_evict_ns(kvd_store_t *s, uint32_t ns, uint64_t *evicted, uint64_t *skipped);

/* Evicts the READY, unpinned objects of ns (UINT32_MAX: all) met while
 * visiting at most max_visits records from position *pos (0: the start; see
 * kvd_store_foreach_from), so that a huge namespace goes in bounded
 * slices; *pos is where to go on, KVD_STORE_POS_END once the walk ended.
 * *evicted counts this slice's evictions. */
int kvd_store_evict_from(kvd_store_t *s, uint32_t ns, uint64_t *pos, uint64_t max_visits,
                         uint64_t *evicted);

typedef struct kvd_store_stats {
    uint64_t pool_bytes;
    uint64_t free_bytes;
    uint64_t writing_bytes;
    uint64_t ready_bytes;
    uint64_t quarantined_bytes; /* dead writers' extents in their grace */
    uint64_t pinned_bytes;
    uint64_t objects_ready;
    uint64_t objects_writing;
    uint64_t objects_pinned;
    uint64_t pins; /* sum of pin counts */
    uint64_t leases;
    uint64_t free_extents;
    uint64_t largest_free_bytes;
    double fragmentation; /* 1 - largest free extent / free bytes */
    uint64_t index_bytes; /* records + hash table + lease tables */
    uint64_t evictions;
    uint64_t evicted_bytes;
    uint64_t reserve_allocated, reserve_exists, reserve_in_flight, reserve_no_space;
    uint64_t lookups, lookup_pages, hit_pages;
    uint64_t acquires, acquire_failures;
    uint64_t leases_expired;
    uint64_t published_bytes; /* offloaded: bytes made READY */
    uint64_t acquired_bytes;  /* loaded: bytes pinned for reading */
} kvd_store_stats_t;

void kvd_store_stats(const kvd_store_t *s, kvd_store_stats_t *out);

/*
 * Checks every invariant: free + writing + ready bytes = pool bytes, extents
 * tile the pool with free neighbours merged, the free lists, the LRU list
 * and the hash table agree with the records, pins and reservations equal
 * what the leases hold. Returns KVD_OK, or KVD_ERR_STATE with `why` filled.
 */
int kvd_store_check(const kvd_store_t *s, char *why, size_t why_len);

#endif /* KVD_STORE_H */
