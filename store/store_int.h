/*
 * store_int.h - internals of the store engine shared by its files. Private
 * to store/.
 *
 * Every extent of the pool, free or holding an object, is one record in a
 * chunked array (stable addresses, no per-object malloc). Records are named
 * by 32-bit indices; index 0 is NIL. A record is, at the same time:
 *   - an extent: offset and length in pages, neighbours by address;
 *   - when free: a member of one TLSF free list (link_prev/link_next);
 *   - when an object: an index entry (hash chain), an LRU member while READY
 *     and unpinned (link_prev/link_next), and the object's metadata.
 * That keeps the index at 84 bytes per object plus its hash bucket.
 *
 * An object's `ns` is its namespace's slot (kvd_store.h: ids add a
 * generation above it). A free extent's `ns` is its scrub tag instead: whose
 * bytes it last held (SCRUB_CLEAN, a tenant + 1, or SCRUB_MIXED).
 */
#ifndef KVD_STORE_INT_H
#define KVD_STORE_INT_H

#include "kvd_store.h"

#define NIL             0u
#define REC_CHUNK_SHIFT 16
#define REC_CHUNK       (1u << REC_CHUNK_SHIFT)
#define REC_MAX_CHUNKS  65536u /* 2^32 records */

/* TLSF: first level = power of two of the size in pages, second level = 16
 * linear subdivisions of it. */
#define TLSF_SL_LOG2  4
#define TLSF_SL_COUNT (1u << TLSF_SL_LOG2)
#define TLSF_FL_COUNT 29

enum rec_state {
    REC_UNUSED = 0, /* on the spare-record list */
    REC_FREE = 3,   /* a free extent */
    REC_WRITING = KVD_OBJ_WRITING,
    REC_READY = KVD_OBJ_READY,
};

typedef struct rec {
    uint8_t key[KVD_KEY_BYTES];
    uint8_t parent_tag[KVD_KEY_TAG_BYTES]; /* key_tag() of the parent key */
    uint32_t off_pages;
    uint32_t size_pages;
    uint32_t phys_prev, phys_next;
    uint32_t link_prev, link_next; /* free list, or LRU list */
    uint32_t hash_next;
    uint32_t last_access_s; /* seconds since the store's epoch; 0 = never */
    uint16_t hits;          /* acquires, saturating */
    uint16_t children;      /* objects of ns whose parent this is, saturating */
    uint16_t ns;
    uint16_t pins;
    uint32_t depth : 24; /* clamped at REC_DEPTH_MAX */
    uint32_t state : 2;  /* enum rec_state */
    uint32_t tier : 1;
    uint32_t has_parent : 1;
    uint32_t quarantined : 1; /* a dead writer's extent, waiting out its grace;
                                 its tenant + 1 is kept in `hits` then */
    uint32_t spare : 3;       /* REC_F_*: states of the SSD tier, and of a restore */
} rec_t;

/* rec_t.spare flags */
#define REC_F_DOOMED                                               \
    1u /* a restore drops it (engine.c, store_restore_objects); at \
          run time (REC_F_LOST), its bytes were lost under it */
/* A pool object whose bytes a writer destroyed (kvd_store_pool_lost) while
 * it could not go at once: absent for Lookup and Acquire, and dropped when
 * its last pin goes, its spill or promotion ends, or its writer publishes.
 * The restore's flag, reused: a restore is over before anything runs. */
#define REC_F_LOST REC_F_DOOMED
#define REC_F_SPILLING                                          \
    2u /* READY in DRAM, being written to the SSD tier: off the \
          LRU; its extent is freed once the write is done */
#define REC_F_PROMOTING                                   \
    4u /* an SSD object being read into DRAM (off the SSD \
          LRU; phys_prev names the DRAM extent), or that  \
          DRAM extent itself (WRITING, not in the index) */

/*
 * An object on the SSD tier is a record of its own, tier = KVD_TIER_SSD and
 * state READY, in the index like any object but in none of the pool's
 * lists: off_pages is its place in the tier (tier.c: a block number in
 * SEG_BLOCK units), size_pages its size in pool pages, link_prev/link_next
 * its place in the SSD LRU, phys_next NIL. Tiers are exclusive: an object
 * is in DRAM or on SSD, never both, so a spill moves it (a new SSD record,
 * the DRAM extent freed) and a promotion moves it back.
 */

#define REC_DEPTH_MAX 0xffffffu

#define SCRUB_CLEAN 0u      /* never held an object: zero since creation */
#define SCRUB_MIXED 0xffffu /* held objects of several tenants */

_Static_assert(sizeof(rec_t) == 84, "a record is 84 bytes: keep the index small");

/* A lease: what one Reserve (write) or one Acquire (read) holds, by record
 * index. A write hold's record keeps its place in recs in link_prev and the
 * lease id's low 32 bits in link_next, so a key is matched to its hold in
 * O(1). */
typedef struct lease {
    uint64_t id;
    uint64_t owner;
    uint64_t expires_ms;
    bool write;      /* reservations (true) or pins (false) */
    uint32_t ns;     /* slot, of a write lease */
    uint32_t tenant; /* whose quota it counts against */
    uint32_t writer; /* of a write lease: its writer's slot in writers + 1; 0 none */
    uint32_t n, cap;
    uint32_t *recs;
    struct lease *older, *newer; /* by expiry */
    struct lease *hnext;         /* lease hash chain */
} lease_t;

/*
 * A writer process that holds extents (kvd_store.h kvd_writer_t): its
 * write leases count here, and the extents of those that ended without
 * Publish or Revoke wait in its held list (through link_next; quarantined,
 * tenant + 1 in hits like those of the TTL quarantine) until the process
 * is gone or says its copies are over. A slot with neither is free (pid 0).
 */
typedef struct writer_ent {
    kvd_writer_t id;
    uint32_t leases;
    uint32_t held_head;
    uint64_t held_pages;
    uint64_t checked_ms; /* when /proc was last read for it */
    bool gone;           /* found gone: its held extents are being freed */
    bool logged;         /* its first held line was written */
} writer_ent_t;

typedef struct ns_entry {
    kvd_ns_info_t info; /* name, tenant, users, size, flags and counters */
    uint32_t pages;     /* object size in pages */
    uint32_t gen;       /* bumped at each removal; ids carry it */
    bool live;
    bool permanent;     /* a KVD_OWNER_PERMANENT user: never removed */
    uint32_t free_next; /* FIFO of free slots, + 1 (0 ends it) */
} ns_entry_t;

#define NS_GEN_MASK ((1u << (31 - KVD_NS_SLOT_BITS)) - 1)

/* The namespaces one owner uses: a bit per slot. */
typedef struct ns_owner {
    uint64_t owner;
    uint64_t bits[KVD_STORE_MAX_NAMESPACES / 64];
    struct ns_owner *next;
} ns_owner_t;

#define NS_OWNER_BUCKETS 1024u

typedef struct tenant {
    char name[KVD_TENANT_NAME_MAX];
    kvd_tenant_limits_t lim;
    kvd_tenant_usage_t use;
    uint64_t lru_pages; /* of its objects on the LRU: what it could evict */
} tenant_t;

struct kvd_store {
    kvd_store_config_t cfg;
    uint64_t total_pages;
    uint64_t epoch_ms;  /* wall clock at creation: last_access base */
    uint64_t secret[6]; /* keys the index hash (getrandom at creation) */

    /* records */
    rec_t *chunks[REC_MAX_CHUNKS];
    uint32_t n_chunks;
    uint32_t rec_high; /* records ever handed out (excl. NIL) */
    uint32_t spare;    /* list of unused records through link_next */

    /* extents (TLSF) */
    uint32_t phys_head;
    uint32_t fl_bitmap;
    uint32_t sl_bitmap[TLSF_FL_COUNT];
    uint32_t free_heads[TLSF_FL_COUNT][TLSF_SL_COUNT];
    uint64_t free_pages;
    uint64_t free_extents;

    /* index */
    uint32_t *buckets;
    uint64_t n_buckets; /* power of two */
    uint64_t n_objects;

    /* LRU of READY, unpinned objects: head most recent */
    uint32_t lru_head, lru_tail;
    uint64_t lru_pages; /* pages on the LRU: what eviction could free */

    /* extents of writers that died or outlived their lease: not reused until
     * their grace (one lease TTL) passes, so a late write lands nowhere
     * live. FIFO through link_next; release time in last_access_s (s). */
    uint32_t quarantine_head, quarantine_tail;
    uint64_t quarantine_pages; /* the TTL quarantine's and the held ones */

    /* writers that hold leases or held extents (engine.c "held extents"):
     * slots [0, n_writers), a free one has pid 0; the sweep's next slot */
    writer_ent_t *writers;
    uint32_t n_writers, cap_writers;
    uint32_t writer_cursor;
    uint64_t held_pages;
    uint64_t held_logged_ms, writers_full_logged_ms; /* rate limits of logs */
    uint64_t now_ms; /* the latest clock a caller passed (monotonic) */
    uint64_t pins;   /* sum of pin counts */
    uint64_t lease_bytes;

    /* tenants (tenant.c); 0 is the default one */
    tenant_t tenants[KVD_TENANTS_MAX];
    uint32_t n_tenants;

    /* namespaces: n_slots ever used, n_ns live; freed slots queue in a
     * FIFO (ns_free_head/tail, slot + 1) */
    ns_entry_t *ns;
    uint32_t n_ns, n_slots, ns_cap;
    uint32_t ns_free_head, ns_free_tail;
    ns_owner_t *owners[NS_OWNER_BUCKETS];
    uint64_t owners_bytes;
    /* (tenant, name) to slot (engine.c ns_index_*): open addressing, slot + 1
     * per entry, a hash keyed with the secret (clients choose names); a
     * cache, valid while ns_index_n == n_ns: removing a namespace sets
     * ns_index_n = UINT32_MAX and the next find rebuilds it */
    uint16_t ns_index[2 * KVD_STORE_MAX_NAMESPACES];
    uint32_t ns_index_n;

    kvd_scrub_fn scrub;
    void *scrub_arg;
    kvd_presence_fn presence; /* objects appearing and going (the cluster's directory) */
    void *presence_arg;

    /* the journal of this store's metadata (persist.c); NULL without one */
    struct persist *persist;

    /* the SSD tier (tier.c); NULL without one. Its objects' LRU (head most
     * recent), and the DRAM pages being spilled or promoted now. */
    struct tier *tier;
    uint32_t ssd_lru_head, ssd_lru_tail;
    uint64_t ssd_objects, ssd_pages;
    uint64_t spilling_pages, promoting_pages;
    kvd_spill_policy_t spill_policy;
    bool spilling_down; /* past the high watermark, not yet at the low one */

    /* leases */
    lease_t **lease_buckets;
    uint64_t n_lease_buckets;
    uint64_t n_leases;
    /* lease ids are random (getrandom, drawn 64 at a time): a client that
     * sees its own ids learns nothing of another's */
    uint64_t lease_ids[64];
    uint32_t lease_ids_left;
    uint64_t lease_id_fallback; /* without getrandom: a keyed sequence */
    lease_t *oldest, *newest;

    kvd_store_stats_t st; /* counters; the byte figures are derived */
};

static inline rec_t *R(const kvd_store_t *s, uint32_t i)
{
    return &s->chunks[i >> REC_CHUNK_SHIFT][i & (REC_CHUNK - 1)];
}

/* persist.c: the journal of the store's metadata (kvd_store.h
 * "persistence"). The engine reports every change that a restart must
 * see, and commits at the end of each call (and before it lets anything
 * touch an extent that was freed in the call: scrubbing). Without a
 * journal each hook is one test of s->persist. */
void persist_ns_added_(kvd_store_t *s, uint32_t slot);
void persist_ns_removed_(kvd_store_t *s, uint32_t slot);
void persist_writing_(kvd_store_t *s, uint32_t i, const kvd_writer_t *w);
void persist_freed_(kvd_store_t *s, uint32_t i);
void persist_quarantined_(kvd_store_t *s, uint32_t i);
int persist_published_(kvd_store_t *s, const uint32_t *recs, size_t n, uint32_t now_s);
void persist_commit_(kvd_store_t *s);
void persist_tick_(kvd_store_t *s);
void persist_close(kvd_store_t *s);
void persist_stats(const kvd_store_t *s, kvd_store_stats_t *out);

/* A namespace was registered into slot (its entry filled). */
static inline void persist_ns_added(kvd_store_t *s, uint32_t slot)
{
    if (s->persist)
        persist_ns_added_(s, slot);
}
/* Slot's namespace was removed (its generation bumped). */
static inline void persist_ns_removed(kvd_store_t *s, uint32_t slot)
{
    if (s->persist)
        persist_ns_removed_(s, slot);
}
/* Record i is a fresh reservation (WRITING, its metadata filled) of writer
 * w (NULL: none known): a restart holds it for w as the engine would. */
static inline void persist_writing(kvd_store_t *s, uint32_t i, const kvd_writer_t *w)
{
    if (s->persist)
        persist_writing_(s, i, w);
}
/* Record i went into quarantine (its tenant + 1 in hits): a restart keeps
 * its grace and whose bytes it holds, instead of the WRITING entry's
 * namespace slot, which may serve another tenant by then. */
static inline void persist_quarantined(kvd_store_t *s, uint32_t i)
{
    if (s->persist)
        persist_quarantined_(s, i);
}
/* Record i's extent is about to be freed (an object evicted, revoked or
 * dropped, a quarantine ended). */
static inline void persist_freed(kvd_store_t *s, uint32_t i)
{
    if (s->persist)
        persist_freed_(s, i);
}
/* The records are about to be published at now_s: writes it first and
 * returns KVD_OK, or KVD_ERR_IO when the journal cannot take it (then the
 * publish must not happen). */
static inline int persist_published(kvd_store_t *s, const uint32_t *recs, size_t n,
                                    uint32_t now_s)
{
    return s->persist ? persist_published_(s, recs, n, now_s) : KVD_OK;
}
/* Writes what the current call changed, as one record. */
static inline void persist_commit(kvd_store_t *s)
{
    if (s->persist)
        persist_commit_(s);
}
/* Periodic work (kvd_store_expire): a slice of compaction, a retry of a
 * journal that failed. */
static inline void persist_tick(kvd_store_t *s)
{
    if (s->persist)
        persist_tick_(s);
}

/* tier.c: the SSD tier, called by the engine. Without a tier the engine
 * never calls them (s->tier == NULL). */
/* Begins writing READY DRAM object i to the tier (it is off the LRU,
 * REC_F_SPILLING set by the caller after success); false when the tier
 * cannot take it now (its queue is full or it has no room). */
bool tier_spill_begin(kvd_store_t *s, uint32_t i);
/* Begins reading SSD object i into DRAM extent j (WRITING, REC_F_PROMOTING);
 * false when the tier cannot take it now. */
bool tier_promote_begin(kvd_store_t *s, uint32_t i, uint32_t j);
/* SSD object i is leaving the tier (dropped or promoted): its place is
 * dead space now. */
void tier_forget(kvd_store_t *s, uint32_t i);
/* DRAM record i, being spilled, lost its bytes (kvd_store_pool_lost): the
 * record its spill writes is named dead now, so that a crash before the
 * spill ends cannot bring back a copy of what was lost. */
void tier_spill_lost(kvd_store_t *s, uint32_t i);
/* The next kvd_store_tier_poll begins a checkpoint, whatever the period. */
void tier_checkpoint_soon(kvd_store_t *s);
void tier_close(kvd_store_t *s);
void tier_stats(const kvd_store_t *s, kvd_store_stats_t *out);
/* Blocks per segment: a place (an SSD record's off_pages) is
 * segment * this + block. */
uint32_t tier_seg_blocks(const kvd_store_t *s);

/* engine.c: what the tier calls back. */
/* Spill of DRAM object i ended: with KVD_OK the object moves to the tier
 * at place `loc` (a new SSD record), its extent freed, unless it was pinned
 * meanwhile (then it stays in DRAM and the tier's copy is forgotten: the
 * return is NIL, and the caller counts loc as dead); an error drops it,
 * as an eviction would have. Returns the SSD record, or NIL when the tier
 * does not keep the copy. */
uint32_t store_spill_done(kvd_store_t *s, uint32_t i, int status, uint32_t loc,
                          bool keep);
/* Promotion of SSD object i ended: KVD_OK makes its DRAM extent the
 * object (READY, journaled); an error (I/O, checksum) drops the object:
 * absent, never wrong. */
void store_promote_done(kvd_store_t *s, uint32_t i, int status);
/* Drops SSD object i (on the SSD LRU, not promoting): its record failed
 * its check (compaction read it); counted as a failed promotion. */
void store_ssd_drop(kvd_store_t *s, uint32_t i);
/* Evicts SSD object i (on the SSD LRU, not promoting): compaction could
 * not copy it. */
void store_ssd_evict(kvd_store_t *s, uint32_t i);
/* Evicts one SSD object, leaf-first from the SSD LRU's cold end; false
 * when there is none that can go. */
bool store_ssd_evict_one(kvd_store_t *s);
/* Spills from the DRAM LRU's cold end while the pool is past its high
 * watermark (counting what is being spilled as gone), as far as the tier
 * takes; with the "hit" policy objects never acquired are dropped instead. */
void store_spill_pump(kvd_store_t *s);
/* A namespace for records found on the tier at start: tenant's `name`,
 * registered without a user (it goes once it has neither objects nor
 * users), or found. */
int store_ns_ensure(kvd_store_t *s, uint32_t tenant, const char *name,
                    uint64_t object_bytes, bool rank_replicated, uint32_t *slot);
/* Adds an SSD record found at start (tier.c's scan); false when the key is
 * there already (DRAM wins: the pool's journal is newer) or out of memory.
 * *out is the record. */
bool store_ssd_insert(kvd_store_t *s, uint32_t slot, const uint8_t key[KVD_KEY_BYTES],
                      const uint8_t *parent_tag, uint32_t depth, uint32_t last_access_s,
                      uint16_t hits, uint32_t loc, uint32_t *out);
/* Ends a restore of the tier: puts the SSD records on the SSD LRU by last
 * access, counts children. */
void store_ssd_inserted(kvd_store_t *s, const uint32_t *recs, size_t n);

/* engine.c: rebuilding a store from a recovered image (persist.c). The
 * store must be empty (created, tenants added, nothing else). */

/* One slot of the namespace table as the journal left it. */
typedef struct restore_ns {
    bool live;
    uint32_t gen;
    uint32_t tenant;
    uint64_t object_bytes;
    bool rank_replicated;
    char name[KVD_NS_NAME_MAX];
} restore_ns_t;

enum restore_kind {
    RESTORE_READY = 1,   /* a published object */
    RESTORE_WRITING = 2, /* a reservation when the daemon died: quarantined */
    RESTORE_QUAR = 3,    /* an extent in quarantine: quarantined again */
};

/* One extent that is not free. */
typedef struct restore_obj {
    uint32_t off_pages, size_pages;
    uint8_t kind; /* enum restore_kind; 0: nothing (a free slot of the replay) */
    uint8_t has_parent;
    uint16_t slot;       /* namespace slot (READY, WRITING) */
    uint32_t tenant;     /* RESTORE_QUAR: whose bytes */
    kvd_writer_t writer; /* WRITING, QUAR: its writer (pid 0: none known) */
    uint32_t depth;
    uint32_t last_access_s;
    uint16_t hits;
    uint8_t key[KVD_KEY_BYTES];
    uint8_t parent_tag[KVD_KEY_TAG_BYTES];
} restore_obj_t;

typedef struct restore_counts {
    uint64_t ready, ready_bytes;     /* objects back in the index */
    uint64_t writing, writing_bytes; /* partial writes, quarantined */
    uint64_t quarantined;            /* extents whose quarantine goes on */
    uint64_t held;                   /* of those, held for a writer process */
    uint64_t discarded;              /* not restored: no namespace, overlap, duplicate */
    uint64_t namespaces;             /* live after the restore */
} restore_counts_t;

/* Takes the journal's hash secret and clock epoch (before anything is
 * hashed). KVD_ERR_STATE when the store is not empty. */
int store_restore_begin(kvd_store_t *s, const uint64_t secret[6], uint64_t epoch_ms);
/* Fills the namespace table: n slots (the live ones registered, the rest
 * free with their generations). */
int store_restore_ns(kvd_store_t *s, const restore_ns_t *table, uint32_t n);
/* Builds the extents, the index, the LRU and the quarantine from objs,
 * sorted by offset; what does not fit (a namespace that is not there, a
 * size that is not its, an overlap, a key twice) is left out and counted.
 * Free space gets the scrub tag free_tag. Quarantines end one lease TTL
 * after now_ms. Namespaces left without objects are removed. */
int store_restore_objects(kvd_store_t *s, const restore_obj_t *objs, size_t n,
                          uint16_t free_tag, uint64_t now_ms, restore_counts_t *out);

/* The writer held extents and leases are counted for, as a store slot + 1
 * (found or added); 0 when the table is full (then the TTL rule). */
uint32_t store_writer_get(kvd_store_t *s, const kvd_writer_t *w);
/* Calls fn for every extent held for a writer (quarantined) and every live
 * reservation of a known writer, with that writer: the journal's snapshot
 * writes whom they belong to. */
void store_foreach_held(const kvd_store_t *s,
                        void (*fn)(void *arg, uint32_t rec, const kvd_writer_t *w),
                        void *arg);

/* Sorts a[0..n) by the high 32 bits of each value, stably (LSD radix;
 * tmp holds n values). */
void store_sort_high32(uint64_t *a, uint64_t *tmp, size_t n);

/* tenant.c */
void tenant_init(kvd_store_t *s);

/* namespace.c: the users of namespaces */
/* Counts owner as a user of slot (once); false out of memory. */
bool ns_use(kvd_store_t *s, uint64_t owner, uint32_t slot);
/* Drops every use of owner, removing namespaces left unused and empty. */
void ns_owner_gone(kvd_store_t *s, uint64_t owner);
/* Removes slot's namespace when it has neither users nor objects. */
void ns_maybe_remove(kvd_store_t *s, uint32_t slot);
void ns_owners_free(kvd_store_t *s);

/* extent.c: records and the TLSF allocator */
int rec_init(kvd_store_t *s);
void rec_fini(kvd_store_t *s);
uint32_t rec_new(kvd_store_t *s);
void rec_put(kvd_store_t *s, uint32_t i);
/* An extent of `pages` pages (state set to REC_WRITING), or NIL. Its ns
 * field still holds the scrub tag of the free space it came from. */
uint32_t extent_alloc(kvd_store_t *s, uint32_t pages);
/* Frees an object's extent, merging with free neighbours; tag is whose
 * bytes it held (SCRUB_CLEAN, tenant + 1, SCRUB_MIXED). */
void extent_free(kvd_store_t *s, uint32_t i, uint16_t tag);

/* Carves [off, off + pages) out of free extent f, which holds it; returns
 * the record of the carved extent (REC_WRITING) or NIL out of memory (the
 * store is then only fit to be destroyed). */
uint32_t extent_carve(kvd_store_t *s, uint32_t f, uint32_t off, uint32_t pages);

uint64_t extent_largest_free(const kvd_store_t *s);
/* 0 when the free lists agree with the records, else a description. */
const char *extent_check_lists(const kvd_store_t *s, uint64_t *free_records);

#endif
