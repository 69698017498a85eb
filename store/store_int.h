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
    uint32_t quarantined : 1; /* a dead writer's extent, waiting out its grace */
    uint32_t spare : 3;
} rec_t;

#define REC_DEPTH_MAX 0xffffffu

_Static_assert(sizeof(rec_t) == 84, "a record is 84 bytes: keep the index small");

/* A lease: what one Reserve (write) or one Acquire (read) holds, by record
 * index. A write hold's record keeps its place in recs in link_prev and the
 * lease id's low 32 bits in link_next, so a key is matched to its hold in
 * O(1). */
typedef struct lease {
    uint64_t id;
    uint64_t owner;
    uint64_t expires_ms;
    bool write;  /* reservations (true) or pins (false) */
    uint32_t ns; /* of a write lease */
    uint32_t n, cap;
    uint32_t *recs;
    struct lease *older, *newer; /* by expiry */
    struct lease *hnext;         /* lease hash chain */
} lease_t;

typedef struct ns_entry {
    kvd_ns_info_t info; /* name, size, flags and counters */
    uint32_t pages;     /* object size in pages */
} ns_entry_t;

typedef struct tenant {
    char name[KVD_TENANT_NAME_MAX];
    kvd_tenant_limits_t lim;
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
    uint64_t quarantine_pages;
    uint64_t now_ms; /* the latest clock a caller passed (monotonic) */
    uint64_t pins;   /* sum of pin counts */
    uint64_t lease_bytes;

    /* tenants (tenant.c); 0 is the default one */
    tenant_t tenants[KVD_TENANTS_MAX];
    uint32_t n_tenants;

    /* namespaces */
    ns_entry_t *ns;
    uint32_t n_ns, ns_cap;
    /* names to ids (engine.c ns_index_*): open addressing, id + 1 per slot,
     * a hash keyed with the secret (clients choose names); a cache, valid
     * while ns_index_n == n_ns: code that removes or renumbers namespaces
     * sets ns_index_n = UINT32_MAX and the next find rebuilds it */
    uint16_t ns_index[2 * KVD_STORE_MAX_NAMESPACES];
    uint32_t ns_index_n;

    /* leases */
    lease_t **lease_buckets;
    uint64_t n_lease_buckets;
    uint64_t n_leases;
    uint64_t next_lease_id;
    lease_t *oldest, *newest;

    kvd_store_stats_t st; /* counters; the byte figures are derived */
};

static inline rec_t *R(const kvd_store_t *s, uint32_t i)
{
    return &s->chunks[i >> REC_CHUNK_SHIFT][i & (REC_CHUNK - 1)];
}

/* tenant.c */
void tenant_init(kvd_store_t *s);

/* extent.c: records and the TLSF allocator */
int rec_init(kvd_store_t *s);
void rec_fini(kvd_store_t *s);
uint32_t rec_new(kvd_store_t *s);
void rec_put(kvd_store_t *s, uint32_t i);
/* An extent of `pages` pages (state set to REC_WRITING), or NIL. */
uint32_t extent_alloc(kvd_store_t *s, uint32_t pages);
/* Frees an object's extent, merging with free neighbours. */
void extent_free(kvd_store_t *s, uint32_t i);
uint64_t extent_largest_free(const kvd_store_t *s);
/* 0 when the free lists agree with the records, else a description. */
const char *extent_check_lists(const kvd_store_t *s, uint64_t *free_records);

#endif
