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
    /* bytes of the pool the host has given already: the pages of a pool
     * file a restart attaches to. They are in use (not MemAvailable), yet
     * this pool is what uses them, so they count as what the host can give. */
    uint64_t held_bytes;
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
    const char *instance;       /* names the file: "kvdock-<instance>" */
    uint64_t size_bytes;        /* from kvd_sizing_t.budget_bytes */
    bool hugepages;             /* 2 MiB hugetlb pages */
    bool mlock;                 /* lock the pool once populated */
    uint64_t populate_rate_bps; /* bytes per second; 0 = no bound */
    /*
     * Where the pool lives. NULL: an anonymous memfd, sealed against
     * resizing, that dies with the process (and its last mapping). Else the
     * file dir/kvdock-<instance>.pool, which outlives the process: /dev/shm
     * (tmpfs), or with hugepages a hugetlbfs mount. It is created private
     * (0600) or, when there, attached as it is: its bytes are kept. A lock
     * (lock_dir/kvdock-<instance>.lock, holding the owner's pid) lets one
     * process of an instance have it at a time.
     */
    const char *dir;
    const char *lock_dir; /* NULL: dir */
    bool fresh;           /* remove a pool file that is there first */
    /*
     * Where an older kvdockd kept this instance's files when dir and
     * lock_dir are private directories made by kvd_private_dir (NULL:
     * nowhere): a pool file of this user there, private to it and held by
     * no running daemon, is moved into dir, its journal
     * (kvdock-<instance>.journal) into lock_dir, under the instance's lock,
     * so that an upgrade keeps the cache. Not with fresh, nor when dir
     * already has a pool file.
     */
    const char *legacy_dir;
    const char *legacy_lock_dir; /* NULL: legacy_dir */
    /* bytes the files beside the pool need on dir's file system (its
     * journal at its bound: kvd_store_journal_bound_bytes), counted by the
     * free-space check at creation */
    uint64_t beside_bytes;
} kvd_pool_opts_t;

/*
 * The directory that holds the daemon's own files under `dir` (--shm-dir,
 * --hugepages-dir): `dir` itself when it is private (owned by this user or
 * root, writable by neither group nor others); for a shared one with the
 * sticky bit (/dev/shm is 1777) its subdirectory kvdock-<euid>, made 0700
 * when missing. In a shared directory any local user could otherwise
 * squat the predictable names (a FIFO where the lock goes, another user's
 * file where the journal's rewrite goes) and stop the daemon from
 * starting, with nothing --fresh could remove. The subdirectory is opened
 * O_DIRECTORY|O_NOFOLLOW and must be a directory of this user private to
 * it; once it is, nobody else can create, rename or remove an entry in it,
 * nor (the sticky bit) rename or remove it, so paths under it name what
 * this check saw. KVD_ERR_STATE (logged, naming the owner and what to do)
 * for a squatted subdirectory, a symlink there, or a shared directory
 * without the sticky bit or owned by another user; KVD_ERR_INVALID when
 * the path would not fit out_len; the system's error otherwise.
 */
int kvd_private_dir(const char *dir, char *out, size_t out_len);

typedef struct kvd_pool kvd_pool_t;

/*
 * Creates (or, with a dir, attaches) the shared-memory file and maps it.
 * Nothing is populated yet. Errors, each logged with what would fix it:
 * KVD_ERR_INVALID (size not a multiple of the page size),
 * KVD_ERR_UNSUPPORTED (no hugetlb memfd; with a dir, one that is not a
 * hugetlbfs mount of 2 MiB pages), KVD_ERR_BUSY (another process holds the
 * instance's lock), KVD_ERR_STATE (a pool file there of another size, or
 * not private to this user), KVD_ERR_NO_SPACE (the file system cannot hold
 * the pool), or the system's error.
 */
int kvd_pool_create(const kvd_pool_opts_t *opts, kvd_pool_t **out);

/* Starts the population thread: fallocate then map each chunk, at most
 * populate_rate_bps, with a progress line per 10%. */
int kvd_pool_populate_start(kvd_pool_t *p);

/* Stops population (if running), unmaps and closes. NULL is fine. */
void kvd_pool_destroy(kvd_pool_t *p);

/* True once the whole pool is populated (and locked, if asked); an
 * attached pool file whose pages all exist (kvd_pool_attached) is ready
 * once population started: its thread only maps them. */
bool kvd_pool_ready(const kvd_pool_t *p);
/* KVD_OK while fine; the population's error once it failed. */
int kvd_pool_error(const kvd_pool_t *p);
/* Why the population failed, with the system's reason and what would fix
 * it ("mlock of 1.00 GiB failed: Cannot allocate memory (raise
 * RLIMIT_MEMLOCK, ...)"); "" while kvd_pool_error is KVD_OK. */
const char *kvd_pool_error_text(const kvd_pool_t *p);
uint64_t kvd_pool_populated_bytes(const kvd_pool_t *p);
uint64_t kvd_pool_size(const kvd_pool_t *p);
/* A named file that outlives the process (opts.dir), not a memfd. */
bool kvd_pool_persistent(const kvd_pool_t *p);
/* The file was made by this kvd_pool_create (nothing in it to recover);
 * true for a memfd. */
bool kvd_pool_created(const kvd_pool_t *p);
/* A pool file that was there with every page allocated: its bytes are
 * kept, and population has nothing to allocate. */
bool kvd_pool_attached(const kvd_pool_t *p);
/* The pool file's path; "" for a memfd. */
const char *kvd_pool_path(const kvd_pool_t *p);
/* The file's device and inode (what a journal ties itself to). */
void kvd_pool_identity(const kvd_pool_t *p, uint64_t *dev, uint64_t *ino);
bool kvd_pool_hugepages(const kvd_pool_t *p);
bool kvd_pool_mlocked(const kvd_pool_t *p);
int kvd_pool_fd(const kvd_pool_t *p);
/* The same file opened O_RDONLY: what read-only connections get. Mappings
 * of it cannot be writable; write() and fallocate() through it fail. */
int kvd_pool_fd_ro(const kvd_pool_t *p);
/* The pool's mapping in the daemon. The daemon touches it only to zero
 * extents that cross tenants (kvd_store_set_scrub); tests write through it
 * and read through a mapping of their own, or the other way round. */
void *kvd_pool_base(const kvd_pool_t *p);
/* Zeroes [offset, offset + bytes) of the pool. A named tmpfs pool file is
 * written through its descriptor, not the mapping: a same-host writer can
 * shrink that file (only a memfd can be sealed), and a store past its end
 * through the mapping would be a SIGBUS in the daemon; a write() grows the
 * file back instead. */
void kvd_pool_zero(const kvd_pool_t *p, uint64_t offset, uint64_t bytes);

/* Bytes [offset, offset + bytes) of the pool. */
typedef struct kvd_pool_range {
    uint64_t offset;
    uint64_t bytes;
} kvd_pool_range_t;

/*
 * Finds bytes of the pool that a same-host writer destroyed since the last
 * call: the file cut short (ftruncate) or holes punched in it (fallocate)
 * in what is populated. The ranges lost are handed to fn in batches (in
 * ascending order, not overlapping; the daemon drops the objects there:
 * kvd_store_pool_lost_ranges), and then the file gets its size and its
 * pages back (so that no mapping faults and the pool stays allocated as
 * sized). A writer that punched ten thousand holes costs one walk of the
 * store's records per batch of KVD_POOL_LOST_BATCH, not one per hole, and
 * a few log lines, not one per hole. Returns how many ranges; 0, after one
 * fstat, when nothing changed. A hugetlbfs pool is checked for its size
 * only (its holes are not seen). Call it from one thread; on each event
 * of kvd_pool_watch_fd and on a tick (a change that raced the watch).
 */
#define KVD_POOL_LOST_BATCH 256
typedef void (*kvd_pool_lost_fn)(void *arg, const kvd_pool_range_t *ranges, size_t n);
size_t kvd_pool_damage_check(kvd_pool_t *p, kvd_pool_lost_fn fn, void *arg);
/* An inotify descriptor readable when the pool file was modified (a
 * truncate, a hole punched, a write()), or -1 where none could be made;
 * kvd_pool_watch_drain empties it. Owned by the pool. */
int kvd_pool_watch_fd(kvd_pool_t *p);
void kvd_pool_watch_drain(kvd_pool_t *p);

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
    KVD_TIER_REMOTE = 2, /* on another daemon of the cluster (a lookup's answer only) */
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
    /* bytes one Reserve may scrub (kvd_store_set_scrub) beyond its first
     * object; 0: 16 MiB */
    uint64_t scrub_budget_bytes;
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

/* --- namespaces
 *
 * A namespace belongs to a tenant: (tenant, name) is unique, so two tenants
 * may use one name without sharing anything. Its users are the owners
 * (connections) that registered it; it is removed when it has neither users
 * nor objects (its last user gone with no objects left, or its last object
 * gone with no user left), so the table cannot fill for ever with names
 * nobody uses. Owner KVD_OWNER_PERMANENT (0, in-process users: tests,
 * benchmarks) is a user that never goes.
 *
 * Ids are generation-tagged: the low KVD_NS_SLOT_BITS bits name a slot of
 * the table, the bits above count how often that slot was reused. A removed
 * namespace's id is never valid again (until the generation wraps, after
 * 2^19 reuses of one slot), so a client holding a stale id gets
 * KVD_ERR_NOT_FOUND, never another namespace. Freed slots are reused only
 * once every slot has been used, oldest freed first. Ids stay below
 * UINT32_MAX, which the functions taking an optional id read as "all".
 */
#define KVD_OWNER_PERMANENT 0u
#define KVD_NS_SLOT_BITS    12
_Static_assert(KVD_STORE_MAX_NAMESPACES == 1u << KVD_NS_SLOT_BITS,
               "a namespace id's slot bits hold every slot");

/*
 * Registers (or finds) tenant's namespace `name` and counts owner as one of
 * its users (once per owner). The same name with the same object size and
 * flag is idempotent; a different size or flag is KVD_ERR_INVALID.
 * KVD_ERR_NO_SPACE past KVD_STORE_MAX_NAMESPACES, KVD_ERR_QUOTA past the
 * tenant's max_namespaces; KVD_ERR_INVALID for an empty or over-long name,
 * a zero size, an object larger than the pool or an unknown tenant.
 */
int kvd_store_ns_register(kvd_store_t *s, uint32_t tenant, uint64_t owner,
                          const char *name, uint64_t object_bytes, bool rank_replicated,
                          uint32_t *ns_id);
/* The id of tenant's namespace `name`: KVD_ERR_NOT_FOUND when that tenant
 * has none of that name (another tenant's does not count). */
int kvd_store_ns_find(const kvd_store_t *s, uint32_t tenant, const char *name,
                      uint32_t *ns_id);

typedef struct kvd_ns_info {
    char name[KVD_NS_NAME_MAX];
    uint32_t tenant; /* the owning tenant */
    uint32_t users;  /* owners that registered it and are not gone */
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
    uint64_t objects_ssd;      /* on the SSD tier (not in objects_ready) */
} kvd_ns_info_t;

/* Namespaces that exist now. */
uint32_t kvd_store_ns_count(const kvd_store_t *s);
/* KVD_ERR_NOT_FOUND for an id that is not (or no longer) a namespace. */
int kvd_store_ns_info(const kvd_store_t *s, uint32_t ns_id, kvd_ns_info_t *out);
/* Walks the namespaces in slot order: start with *pos = 0; each call sets
 * *ns_id to the next one and returns true, false once none is left. */
bool kvd_store_ns_next(const kvd_store_t *s, uint32_t *pos, uint32_t *ns_id);

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

/* What a tenant holds now, against its limits, and what the limits did. */
typedef struct kvd_tenant_usage {
    uint64_t bytes;           /* pool bytes of its objects (and dead writers' extents
                                 still quarantined) */
    uint64_t pins;            /* pins its read leases hold */
    uint64_t leases;          /* leases open */
    uint64_t namespaces;      /* namespaces it owns */
    uint64_t quota_refusals;  /* keys and calls refused for a limit */
    uint64_t quota_evictions; /* own objects evicted to stay within max_bytes */
} kvd_tenant_usage_t;

/* Adds a tenant: KVD_ERR_EXISTS when the name is taken, KVD_ERR_NO_SPACE
 * past KVD_TENANTS_MAX, KVD_ERR_INVALID for an empty or long name. */
int kvd_store_tenant_add(kvd_store_t *s, const char *name, const kvd_tenant_limits_t *lim,
                         uint32_t *id);
int kvd_store_tenant_find(const kvd_store_t *s, const char *name, uint32_t *id);
/* The tenant's name; NULL for an id never added. */
const char *kvd_store_tenant_name(const kvd_store_t *s, uint32_t id);
uint32_t kvd_store_tenant_count(const kvd_store_t *s);
/* Its limits and usage; KVD_ERR_NOT_FOUND for an id never added. Either
 * output may be NULL. */
int kvd_store_tenant_usage(const kvd_store_t *s, uint32_t id, kvd_tenant_limits_t *lim,
                           kvd_tenant_usage_t *use);

/*
 * Scrubbing: an extent handed to a Reserve of tenant T whose bytes last
 * belonged to another tenant (an object of it, or free space merged from
 * several tenants' objects) is zeroed before the reply leaves, through this
 * callback, so that a Publish of bytes never written shows zeros, not
 * another tenant's data. The engine never touches the pool itself; the
 * daemon installs a memset over its mapping. Extents that were never used
 * (a new pool file or memfd starts zeroed) or last held T's own objects are
 * not scrubbed. After a restart (kvd_store_journal_attach) the free space
 * of an attached pool file counts as holding several tenants' bytes unless
 * only the default tenant ever used it.
 * Without a callback nothing is zeroed (only the stats count). The
 * zeroing runs in the caller's thread (the daemon's loop): one Reserve
 * scrubs its first such extent and then at most scrub_budget_bytes; a key
 * past that answers NO_SPACE (the writer tries again later, when the
 * extents it gets are its tenant's own or scrubbed by earlier calls).
 */
typedef void (*kvd_scrub_fn)(void *arg, uint64_t offset, uint64_t bytes);
void kvd_store_set_scrub(kvd_store_t *s, kvd_scrub_fn fn, void *arg);

/*
 * Tells fn when a key becomes readable in namespace ns (a Publish:
 * present) and when it stops being readable on every tier (evicted from
 * DRAM without a tier, evicted from the tier, a failed promotion, an
 * operator's eviction: !present). Moves between DRAM and the SSD tier are
 * not told: the key stays readable. Objects restored at start are not
 * told either (walk them with kvd_store_foreach_from). fn runs inside the
 * store's call, while ns still exists (kvd_store_ns_info answers for it):
 * it must not call back into the store but for kvd_store_ns_info and
 * kvd_store_tenant_name.
 */
typedef void (*kvd_presence_fn)(void *arg, uint32_t ns, const uint8_t key[KVD_KEY_BYTES],
                                bool present);
void kvd_store_set_presence(kvd_store_t *s, kvd_presence_fn fn, void *arg);

/* --- lifecycle */

/*
 * Put-if-absent for each key of namespace ns. results[i] says what happened;
 * locs[i] is set for ALLOCATED. All ALLOCATED keys are held by one new write
 * lease of `owner`, returned in *lease_id (0 when nothing was allocated).
 * Eviction makes room as needed (watermarks, then on demand). A key answers
 * NO_SPACE without evicting anything when even all evictable objects beside
 * the free space would be too few, and after at most 64 + 4 * (its pages)
 * evictions when fragmentation keeps a hole from forming.
 *
 * Tenant limits (of ns's tenant): a key that would take the tenant past
 * max_bytes first evicts the tenant's own cold objects (leaf-first, as the
 * global eviction; at most 64 + 4 * its pages of them, looking at most
 * 4096 objects of the LRU), and answers NO_SPACE when that is
 * not enough; the tenant's quota_refusals counts it. A tenant at max_leases
 * gets KVD_ERR_QUOTA for the call, with nothing changed. KVD_ERR_NOT_FOUND
 * for an unknown namespace.
 */
int kvd_store_reserve(kvd_store_t *s, uint64_t owner, uint32_t ns, const kvd_put_t *items,
                      size_t n, uint64_t now_ms, uint64_t *lease_id, uint8_t *results,
                      kvd_loc_t *locs);

/*
 * Who writes into a reservation: one process for its whole life (its pid
 * and start time, kvd_proc_start_ticks) and a token of its own choosing
 * that tells its linkers apart (HelloRequest.writer_token). A lease of a
 * known writer that ends without Publish or Revoke (its connection gone,
 * its TTL passed, the daemon restarted) keeps its extents *held* instead of
 * one lease TTL in quarantine: they are freed only once that process is
 * gone (kvd_store_expire looks, a few writers per call) or says its copies
 * are over (kvd_store_writer_done). A writer that never says so and never
 * exits holds them for ever: the safe choice, as its memcpy may resume at
 * any time. pid 0 is no writer: the lease TTL rule.
 */
typedef struct kvd_writer {
    uint32_t pid;
    uint64_t start_ticks;
    uint64_t token;
} kvd_writer_t;

/* kvd_store_reserve for a known writer (NULL: as kvd_store_reserve). When
 * the store already tracks KVD_STORE_WRITERS_MAX writers the lease falls
 * back to the TTL rule (a warning, rate-limited, says so). */
#define KVD_STORE_WRITERS_MAX 4096
int kvd_store_reserve_by(kvd_store_t *s, uint64_t owner, const kvd_writer_t *writer,
                         uint32_t ns, const kvd_put_t *items, size_t n, uint64_t now_ms,
                         uint64_t *lease_id, uint8_t *results, kvd_loc_t *locs);

/* The writer says that no copy into a reservation of its earlier
 * connections is in flight (a linker's first Hello on a new connection,
 * once its copies of the lost one ended): its held extents are freed, and
 * so are the reservations of its write leases of owners other than
 * `owner` (its new connection): an earlier connection whose close the
 * daemon has not seen yet (the new Hello came first) would otherwise hold
 * them after this. Returns the bytes freed. */
uint64_t kvd_store_writer_done(kvd_store_t *s, const kvd_writer_t *writer,
                               uint64_t owner);

/*
 * Makes the reservations of write lease `lease_id` visible, atomically: all
 * of them (keys == NULL) or the n given keys. Every key must be a reservation
 * of that lease, else KVD_ERR_STATE and nothing changes. The lease ends when
 * it holds nothing more. KVD_ERR_NOT_FOUND for an unknown (or ended) lease
 * and for another owner's (the same answer, so that nobody learns which ids
 * are live; ids are random, non-zero and unique among live leases),
 * KVD_ERR_STATE for a read lease. With a journal: KVD_ERR_IO, nothing
 * changed, when the journal cannot record it (see "persistence").
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
 * KVD_INPROGRESS (nothing pinned; *first_bad the first such key) when
 * keys are on the SSD tier: their promotion has begun (or is running) and
 * the caller asks again; KVD_ERR_NO_SPACE names a key that has no room in
 * DRAM to be promoted into.
 * KVD_ERR_QUOTA (key 0) when the pins would take ns's tenant past max_pins
 * or a lease past max_leases.
 */
int kvd_store_acquire(kvd_store_t *s, uint64_t owner, uint32_t ns,
                      const uint8_t (*keys)[KVD_KEY_BYTES], size_t n, uint64_t now_ms,
                      uint64_t *lease_id, kvd_loc_t *locs, size_t *first_bad);

/* True while lease_id is a live lease of owner (not yet published, revoked,
 * released or expired). */
bool kvd_store_lease_live(const kvd_store_t *s, uint64_t owner, uint64_t lease_id);

/* Ends read lease lease_id, unpinning what it holds. Errors as publish. */
int kvd_store_release(kvd_store_t *s, uint64_t owner, uint64_t lease_id);

/*
 * Ends every lease of owner (its connection closed) and its uses of
 * namespaces (removing those left without users or objects). Returns the
 * leases ended. Its
 * reservations become invisible at once (the keys can be reserved again)
 * but their extents stay quarantined, so that a writer still copying lands
 * in nothing live: held for their writer (kvd_writer_t), else for one
 * lease TTL; pins are released.
 */
size_t kvd_store_owner_gone(kvd_store_t *s, uint64_t owner);

/* Ends every lease whose TTL passed by now_ms (reservations quarantined as
 * above) and frees quarantined extents whose grace is over, and held ones
 * whose writer process is gone (checking at most a few writers' /proc
 * entries per call, each at most once a second, and freeing at most 65536
 * extents per call). Callers pass a monotonic clock, never going back.
 * Returns the leases ended. */
size_t kvd_store_expire(kvd_store_t *s, uint64_t now_ms);

/* --- lookup */

typedef struct kvd_lookup_pool {
    uint32_t ns;
    const uint8_t (*keys)[KVD_KEY_BYTES]; /* page keys of the prompt's tail, in order */
    size_t n_keys;
    uint32_t trailing_pages; /* 0: ALL_PAGES; n: TRAILING_PAGES(n) */
    /* n_keys flags, or NULL: non-zero where another daemon of the cluster
     * holds a key this store lacks (kvd_store_lookup_remote) */
    const uint8_t *remote;
} kvd_lookup_pool_t;

/*
 * Every boundary b (in pages, 1..min n_keys) restorable for all pools, in
 * increasing order: ALL_PAGES needs pages 0..b-1 present, TRAILING_PAGES(n)
 * needs pages b-n..b-1 (clamped at 0). Present = READY. `boundaries` must
 * hold min n_keys entries. Counts probed and present pages per namespace.
 */
int kvd_store_lookup(kvd_store_t *s, const kvd_lookup_pool_t *pools, size_t n_pools,
                     uint32_t *boundaries, size_t *n_boundaries);
/* The same, and tiers[m] (may be NULL) is the slowest tier boundary m
 * needs: KVD_TIER_SSD when any page it needs is on the SSD tier. */
int kvd_store_lookup_tiers(kvd_store_t *s, const kvd_lookup_pool_t *pools, size_t n_pools,
                           uint32_t *boundaries, uint8_t *tiers, size_t *n_boundaries);
/* The same lookup again, with each pool's `remote` flags counting as
 * present (tier KVD_TIER_REMOTE where a boundary needs one): what the
 * cluster can restore. Counts nothing (the first lookup did). */
int kvd_store_lookup_remote(kvd_store_t *s, const kvd_lookup_pool_t *pools,
                            size_t n_pools, uint32_t *boundaries, uint8_t *tiers,
                            size_t *n_boundaries);

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
/* The same for every namespace of one tenant. */
int kvd_store_evict_tenant(kvd_store_t *s, uint32_t tenant, uint64_t *evicted,
                           uint64_t *skipped);

/* Evicts the READY, unpinned objects of ns (UINT32_MAX: all) met while
 * visiting at most max_visits records from position *pos (0: the start; see
 * kvd_store_foreach_from), so that a huge namespace goes in bounded
 * slices; *pos is where to go on, KVD_STORE_POS_END once the walk ended.
 * *evicted counts this slice's evictions. */
int kvd_store_evict_from(kvd_store_t *s, uint32_t ns, uint64_t *pos, uint64_t max_visits,
                         uint64_t *evicted);
/* The same for every namespace of one tenant (KVD_ERR_NOT_FOUND for an
 * unknown tenant). */
int kvd_store_evict_tenant_from(kvd_store_t *s, uint32_t tenant, uint64_t *pos,
                                uint64_t max_visits, uint64_t *evicted);

/*
 * The bytes of the pool at [offset, offset + bytes) were lost under the
 * store: a same-host writer cut the pool file short or punched a hole in
 * it (the daemon finds it, kvd_pool_damage_check). Every object there
 * goes, so that none is served with the zeros that replaced its bytes:
 *   - READY and unpinned: evicted now;
 *   - pinned, or being spilled: absent for Lookup and Acquire from now on,
 *     dropped when its last pin goes or its spill ends (the loads that are
 *     copying it now got what was there);
 *   - being written: dropped at its Publish (the Publish succeeds, the
 *     object is not stored);
 *   - a promotion's extent: the promotion fails, the SSD copy stays.
 * Free extents need nothing. Returns how many objects were dropped now or
 * marked to go; counted in pool_lost_objects (and the call in
 * pool_lost_ranges).
 */
uint64_t kvd_store_pool_lost(kvd_store_t *s, uint64_t offset, uint64_t bytes);
/* kvd_store_pool_lost of ranges[0..n) (ascending, not overlapping) in one
 * walk of the records and one journal commit; the objects it dropped or
 * marked, as above (pool_lost_ranges counts the ranges with bytes in the
 * pool; empty ones and those past its end are ignored). */
uint64_t kvd_store_pool_lost_ranges(kvd_store_t *s, const kvd_pool_range_t *ranges,
                                    size_t n);

/* --- persistence
 *
 * A store may keep a journal of its metadata in a file beside the pool
 * (kvd_store_journal_attach), so that a daemon started again after a crash
 * (SIGKILL, OOM kill) on the same pool file finds its objects again:
 *   - every object whose Publish returned KVD_OK is back, with its
 *     namespace (name, object size, tenant, generation) and its chain
 *     metadata (parent tag, depth), access time and hits;
 *   - reservations that were being written are not: their extents are
 *     held for their writer as the journal names it (kvd_writer_t), or
 *     quarantined for one lease TTL when it names none (a writer of the
 *     dead daemon may still be copying into them), then free;
 *   - leases and pins are not kept: they belonged to connections of the
 *     process that died.
 * What the engine guarantees for that:
 *   - a Publish is written to the journal before it changes anything, and
 *     fails with KVD_ERR_IO (nothing changed) when it cannot be;
 *   - an extent freed (eviction, revoke, a quarantine's end) is written as
 *     free before any caller can reuse it: every call writes what it
 *     changed before it returns (one write for the call), and a Reserve
 *     writes before it scrubs an extent;
 *   - a journal that cannot be written (a full file system) is marked
 *     invalid at once, so a restart discards it rather than misread it,
 *     and cut to its header, so that its records' space is free for the
 *     rewrite; until a rewrite succeeds Publish fails with KVD_ERR_IO. The
 *     rewrite is a whole snapshot, on the caller's thread (from
 *     kvd_store_expire): it is tried 1 s after the failure, then after
 *     2, 4, ... up to 60 s between tries, and not at all while the file
 *     system has less free space than the snapshot needs;
 *   - the journal is compacted in slices from kvd_store_expire once it
 *     outgrows twice what a snapshot of the live objects would take.
 * The file format is journal.h's.
 */

typedef struct kvd_store_journal_opts {
    const char *path;            /* the journal file */
    uint64_t pool_dev, pool_ino; /* the pool file it describes (kvd_pool_identity) */
    bool pool_created;           /* the pool file is new: nothing to recover */
    bool fresh;                  /* discard a journal that is there */
    bool hugepages;              /* the pool is of 2 MiB pages (recorded) */
    uint64_t now_ms;             /* the callers' clock (kvd_store_expire's); 0: now */
    /* compaction: starts once the journal is past compact_min_bytes and
     * twice a snapshot's size (0: 8 MiB); a tick snapshots slice_records
     * records (0: 65536). Tests make them small. */
    uint64_t compact_min_bytes;
    uint32_t slice_records;
} kvd_store_journal_opts_t;

/* What a journal gave back at attach. */
typedef struct kvd_store_recovery {
    bool found;                 /* a journal was there and read */
    uint64_t objects;           /* published objects back in the index */
    uint64_t bytes;             /* ... their object bytes */
    uint64_t namespaces;        /* namespaces back (those with objects) */
    uint64_t writing_discarded; /* partial writes: quarantined, then free */
    uint64_t writing_bytes;
    uint64_t discarded;     /* journaled extents not restored: their namespace
                               or tenant is gone, or they did not fit */
    uint64_t journal_bytes; /* of the journal read */
    uint64_t records;       /* its whole records */
    uint64_t torn_bytes;    /* after its last whole record (a write cut short) */
    uint64_t elapsed_ns;    /* reading, rebuilding and writing the new journal */
    uint64_t read_ns, rebuild_ns, write_ns; /* ... each of them */
    char note[256]; /* why nothing was recovered, when nothing was */
} kvd_store_recovery_t;

/*
 * Attaches the journal at o->path to an empty store (created, its tenants
 * added, nothing else): reads what is there, rebuilds the store from it,
 * then writes a fresh journal (a snapshot, through a new file and a
 * rename) and keeps it from here on. Nothing to read (no file, fresh, a
 * new pool file, a journal marked invalid) is no error: the store starts
 * empty and *rec->note says why.
 * Errors: KVD_ERR_STATE when the journal is of another layout or version,
 * damaged, or describes another pool (size, page size, pool file): `why`
 * says which, and nothing was changed (discarding it is the caller's
 * decision: o->fresh); KVD_ERR_NOMEM, KVD_ERR_IO and the like.
 */
int kvd_store_journal_attach(kvd_store_t *s, const kvd_store_journal_opts_t *o,
                             kvd_store_recovery_t *rec, char *why, size_t why_len);

/*
 * The most file-system space a journal takes for a pool of pool_bytes
 * holding objects of object_bytes (the sizing's typical object): a
 * snapshot of every object the pool fits, the journal grown to its
 * compaction bound (compact_min_bytes, 0: the default), and the
 * rewrite's new file beside it while compaction runs. What the
 * daemon's start-up space check counts beside the pool.
 */
uint64_t kvd_store_journal_bound_bytes(uint64_t pool_bytes, uint64_t object_bytes,
                                       uint64_t compact_min_bytes);

typedef struct kvd_store_stats {
    uint64_t pool_bytes;
    uint64_t free_bytes;
    uint64_t writing_bytes;
    uint64_t ready_bytes;
    uint64_t quarantined_bytes; /* lapsed writers' extents: held, or in a TTL grace */
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
    uint64_t published_bytes;    /* offloaded: bytes made READY */
    uint64_t acquired_bytes;     /* loaded: bytes pinned for reading */
    uint64_t reserve_quota;      /* reserved keys refused for a tenant's max_bytes */
    uint64_t scrubbed_bytes;     /* bytes zeroed: extents crossing tenants */
    uint64_t namespaces_removed; /* left without users or objects */
    uint64_t recovered_objects;  /* brought back from the journal at start */
    uint64_t recovered_bytes;
    uint64_t journal_bytes;           /* the journal file now; 0 without one */
    uint64_t journal_records;         /* records written (batches, snapshot parts) */
    uint64_t journal_compactions;     /* snapshots put in place of the journal */
    uint64_t journal_errors;          /* writes that failed (the journal then
                                         invalid until rewritten) */
    uint64_t journal_broken;          /* 1 while invalid: publishes fail */
    uint64_t journal_repairs_skipped; /* rewrites not tried: too little space */
    uint64_t pool_lost_ranges;        /* ranges of the pool file a writer destroyed */
    uint64_t pool_lost_objects;       /* objects dropped: their bytes were lost */
    /* the SSD tier (all 0 without one) */
    uint64_t ssd_bytes;      /* the tier's size */
    uint64_t ssd_used_bytes; /* segments in use (live and dead records) */
    uint64_t ssd_live_bytes; /* records of objects on the tier */
    uint64_t ssd_objects;    /* objects on the tier */
    uint64_t ssd_segments, ssd_segments_free;
    uint64_t spilling_bytes;  /* DRAM objects being written to the tier */
    uint64_t promoting_bytes; /* DRAM extents being read from it (in writing_bytes) */
    uint64_t spills, spilled_bytes;      /* objects moved to the tier */
    uint64_t spill_failures;             /* spills that failed (the object dropped) */
    uint64_t spill_cancelled;            /* pinned while spilled: kept in DRAM */
    uint64_t spill_drops;                /* cold objects dropped by the spill policy */
    uint64_t promotions, promoted_bytes; /* objects moved back into DRAM */
    uint64_t promote_failures;           /* promotions that failed: object dropped */
    uint64_t ssd_evictions;              /* objects evicted from the tier */
    uint64_t ssd_compactions;            /* segments freed by compaction */
    uint64_t ssd_copied_bytes;           /* ... live bytes they moved */
    uint64_t ssd_io_errors, ssd_checksum_failures, ssd_no_space;
    uint64_t ssd_queue_depth;              /* the executor's limit */
    uint64_t ssd_in_flight;                /* its ops in flight now */
    uint64_t ssd_spill_ns, ssd_promote_ns; /* time spent, summed per op: GB/s */
    uint64_t ssd_recovered_objects;        /* found on the tier at start */
    uint64_t ssd_checkpoints;              /* checkpoints written */
    uint64_t ssd_syncs;                    /* fdatasyncs of the group commit ended */
    uint64_t
        ssd_dead_syncs; /* ... of the dead-list for a reply (kvd_store_tier_sync_dead) */
    uint32_t ssd_io_path;       /* 0 none, 1 io_uring, 2 pread/pwrite */
    uint32_t ssd_fixed_buffers; /* 1: the pool is registered with the ring */
} kvd_store_stats_t;

void kvd_store_stats(const kvd_store_t *s, kvd_store_stats_t *out);

/* --- the SSD tier
 *
 * A store may have an SSD tier (kvd_store_tier_attach): a directory of
 * segment files (segment.h) on a file system, written with O_DIRECT
 * through io_uring or pread/pwrite threads (tier_io.h). Then
 *   - eviction past the high watermark moves READY objects to the tier
 *     (a spill, asynchronous: the object stays readable in DRAM until its
 *     record is written, then its extent is freed) instead of freeing
 *     them; under the "hit" policy objects never acquired are dropped
 *     instead. Eviction on demand (a Reserve that needs room now) still
 *     drops, since a spill frees nothing at once;
 *   - the tier evicts its own objects leaf-first by chain depth from its
 *     LRU, and frees segments whole: a segment mostly dead is compacted
 *     (its live records copied to the head);
 *   - Lookup counts objects on the tier as present and says per boundary
 *     which tier it needs (kvd_store_lookup's tiers);
 *   - Acquire of an object on the tier starts its promotion into DRAM and
 *     answers KVD_INPROGRESS (nothing pinned): the caller asks again; a
 *     promotion that fails (I/O error, checksum) makes the object absent;
 *   - the tier's index is rebuilt at attach from its checkpoint and the
 *     segments' record headers, so its objects survive the pool's loss.
 * The tier's I/O ends on the executor's threads; the caller polls
 * kvd_store_tier_fd and calls kvd_store_tier_poll from its thread.
 */

typedef enum kvd_spill_policy {
    KVD_SPILL_ALL = 0, /* every evicted object goes to the tier */
    KVD_SPILL_HIT = 1, /* only objects acquired at least once; others dropped */
} kvd_spill_policy_t;

typedef struct kvd_tier_opts {
    const char *dir;        /* the tier's directory (created if absent) */
    uint64_t size_bytes;    /* the tier's size: segments of it */
    uint64_t segment_bytes; /* 0: 256 MiB */
    int io_path;            /* 0 auto, 1 io_uring, 2 pread/pwrite */
    uint32_t queue_depth;   /* 0: 32 */
    kvd_spill_policy_t policy;
    void *pool_base; /* the pool's mapping: where values move */
    uint64_t pool_bytes;
    bool fresh;            /* discard what the tier holds */
    bool no_fixed_buffers; /* do not register the pool with the ring */
    /* register the pool with io_uring only at kvd_store_tier_pool_ready:
     * registering faults in and pins every page, which would populate the
     * pool at once, past its bounded rate */
    bool defer_fixed_buffers;
    uint32_t fail_read_every;  /* test hook: every n-th read fails with EIO */
    uint32_t fail_copy_writes; /* test hook: the first n compaction copies' writes fail */
    bool fail_pad_writes;      /* test hook: a failed write's pad fails too (a hole) */
    uint32_t fail_spill_writes; /* test hook: the first n spills' writes fail (EIO) */
    /* a spill is acknowledged (its DRAM copy freed) only once its record is
     * durable: the writes that landed are synced in rounds (group commit,
     * tier.c). no_sync acknowledges as the write lands, leaving the record
     * in the device's write cache: a power loss may lose it, and with it
     * the object. For measuring what the syncs cost. */
    bool no_sync;
    /* test hook: no sync round starts (written spills are not acknowledged)
     * until kvd_store_tier_hold_syncs(s, false) */
    bool hold_syncs;
    uint64_t checkpoint_ms;    /* between periodic checkpoints; 0: 60000 */
    uint32_t checkpoint_slice; /* records a poll's checkpoint slice looks at; 0: 65536 */
    uint64_t now_ms;           /* the callers' clock; 0: now */
} kvd_tier_opts_t;

typedef struct kvd_tier_recovery {
    uint64_t objects, bytes;     /* back on the tier */
    uint64_t checkpoint_records; /* ... of them from the checkpoint */
    uint64_t scanned_records;    /* ... read from segment headers */
    uint64_t summary_records;    /* ... read from segments' summaries */
    uint64_t duplicates;         /* keys in DRAM already, or twice */
    uint64_t discarded;          /* records whose namespace or tenant is gone */
    uint64_t dead;               /* records the dead-list names: gone before the stop */
    uint64_t segments, torn;     /* segments read; those ending in a torn record */
    uint64_t elapsed_ns;
    char note[256]; /* why nothing was recovered, when nothing was */
} kvd_tier_recovery_t;

/*
 * Attaches an SSD tier to s (after kvd_store_journal_attach, if any, so
 * that DRAM objects win over older copies on the tier): opens or creates
 * o->dir, checks it is a tier of this layout (KVD_ERR_STATE, `why` says
 * why, when not: o->fresh discards it), takes its lock (KVD_ERR_BUSY),
 * creates the segment files up to size_bytes (KVD_ERR_NO_SPACE when the
 * file system cannot hold them: `why` names a size that fits), starts the
 * executor (KVD_ERR_UNSUPPORTED when io_uring is asked for and refused)
 * and rebuilds the tier's index.
 */
int kvd_store_tier_attach(kvd_store_t *s, const kvd_tier_opts_t *o,
                          kvd_tier_recovery_t *rec, char *why, size_t why_len);
/* The executor's completion fd (readable when kvd_store_tier_poll has
 * work), or -1 without a tier. */
int kvd_store_tier_fd(const kvd_store_t *s);
/* Takes the tier's completions and moves the work on (spills, promotions,
 * compaction, checkpoints). Returns the completions taken. */
size_t kvd_store_tier_poll(kvd_store_t *s, uint64_t now_ms);
/* Makes the tier's dead-list durable now when entries appended to it are
 * not yet (no sync round or rewrite covered them): one fdatasync, on the
 * caller's thread. For a reply that must not come before the tombstones
 * of the objects it removed from the tier (an operator's Evict): after
 * it, a power loss does not bring them back. KVD_OK (also without a tier,
 * with no_sync, or with nothing to sync), or the fdatasync's error
 * (logged). */
int kvd_store_tier_sync_dead(kvd_store_t *s);
/* Writes the tier's checkpoint now (a clean stop). */
int kvd_store_tier_checkpoint(kvd_store_t *s);
/* Waits until the tier has nothing in flight or timeout_ms passed, polling
 * (tests, a clean stop). */
void kvd_store_tier_drain(kvd_store_t *s, int timeout_ms);
/* The pool is populated: registers it with io_uring now, if that was
 * deferred (defer_fixed_buffers); the outcome is logged. */
void kvd_store_tier_pool_ready(kvd_store_t *s);
/* The I/O path's name ("io_uring", "pread/pwrite") and why it is what it
 * is; "" without a tier. */
const char *kvd_store_tier_io_path(const kvd_store_t *s);
const char *kvd_store_tier_note(const kvd_store_t *s);

/*
 * Checks every invariant: free + writing + ready bytes = pool bytes, extents
 * tile the pool with free neighbours merged, the free lists, the LRU list
 * and the hash table agree with the records, pins and reservations equal
 * what the leases hold. Returns KVD_OK, or KVD_ERR_STATE with `why` filled.
 */
int kvd_store_check(const kvd_store_t *s, char *why, size_t why_len);

#endif /* KVD_STORE_H */
