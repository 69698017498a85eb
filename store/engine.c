/*
 * engine.c - the store engine: namespaces, the index (hash of records by
 * (namespace, key)), the LRU of evictable objects, the lifecycle, leases,
 * eviction and lookups. See kvd_store.h for the contracts and store_int.h
 * for the record layout.
 *
 * Eviction takes, from the cold end of the LRU, a leaf: a page no stored page
 * names as its parent (each record counts its children), so a chain is cut
 * from its end and never in its middle, which would strand every page after
 * it. Among the EVICT_WINDOW coldest pages it takes the deepest leaf; when
 * the window holds none it looks further, and only past EVICT_SCAN_MAX takes
 * the window's deepest page anyway. Batches enter the LRU deepest first, so a
 * chain's root is its most recently used page.
 *
 * In debug builds (KVD_STORE_PARANOID) every mutation ends with the full
 * invariant check and aborts on a violation.
 */
#include "store_int.h"
#include "store_testing.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#define EVICT_WINDOW 8
/* How far past the window eviction looks for a leaf before it gives up and
 * takes the deepest page of the window. */
#define EVICT_SCAN_MAX 256
/* How many objects of the LRU eviction within one tenant's quota looks at:
 * bounds its work when the tenant's objects sit at the LRU's hot end. */
#define EVICT_TENANT_SCAN 4096

#ifdef KVD_STORE_PARANOID
static void paranoid(const kvd_store_t *s, const char *where)
{
    char why[256];
    if (kvd_store_check(s, why, sizeof(why)) != KVD_OK) {
        fprintf(stderr, "store invariant broken after %s: %s\n", where, why);
        abort();
    }
}
#define PARANOID(s, where) paranoid(s, where)
#else
#define PARANOID(s, where) ((void)0)
#endif

/* ------------------------------------------------------------ lifecycle */

void kvd_store_config_default(kvd_store_config_t *cfg, uint64_t pool_bytes)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->pool_bytes = pool_bytes;
    cfg->page_bytes = 4096;
    cfg->evict_high = 0.95;
    cfg->evict_low = 0.90;
    cfg->lease_ttl_ms = 30000;
    cfg->index_hint = 1024;
    cfg->scrub_budget_bytes = 16ull << 20;
}

static int buckets_resize(kvd_store_t *s, uint64_t n_buckets);

int kvd_store_create(const kvd_store_config_t *cfg, kvd_store_t **out)
{
    if (cfg->page_bytes == 0 || (cfg->page_bytes & (cfg->page_bytes - 1)) != 0 ||
        cfg->pool_bytes < cfg->page_bytes || cfg->evict_low <= 0 ||
        cfg->evict_low > cfg->evict_high || cfg->evict_high > 1.0)
        return KVD_ERR_INVALID;
    uint64_t pages = cfg->pool_bytes / cfg->page_bytes;
    if (pages > UINT32_MAX)
        return KVD_ERR_INVALID;
    kvd_store_t *s = kvd_mem_calloc(KVD_MEM_INDEX, 1, sizeof(*s));
    if (s == NULL)
        return KVD_ERR_NOMEM;
    s->cfg = *cfg;
    s->total_pages = pages;
    s->epoch_ms = kvd_wall_ms();
    if (getrandom(s->secret, sizeof(s->secret), GRND_NONBLOCK) != sizeof(s->secret)) {
        uint64_t x = kvd_now_ns() ^ (uint64_t)(uintptr_t)s; /* weaker, never fails */
        for (size_t i = 0; i < KVD_ARRAY_SIZE(s->secret); i++) {
            x += 0x9e3779b97f4a7c15ull;
            s->secret[i] = (x ^ (x >> 31)) * 0xbf58476d1ce4e5b9ull;
        }
    }
    s->secret[5] |= 1; /* an odd multiplier keeps the last fold from losing bits */
    tenant_init(s);
    uint64_t nb = 1024;
    while (nb < cfg->index_hint && nb < (1ull << 32))
        nb <<= 1;
    int rc = rec_init(s);
    if (rc == KVD_OK)
        rc = buckets_resize(s, nb);
    if (rc == KVD_OK) {
        s->n_lease_buckets = 256;
        s->lease_buckets =
            kvd_mem_calloc(KVD_MEM_INDEX, s->n_lease_buckets, sizeof(lease_t *));
        if (s->lease_buckets == NULL)
            rc = KVD_ERR_NOMEM;
    }
    uint32_t whole = rc == KVD_OK ? rec_new(s) : NIL;
    if (rc == KVD_OK && whole == NIL)
        rc = KVD_ERR_NOMEM;
    if (rc != KVD_OK) {
        kvd_store_destroy(s);
        return rc;
    }
    R(s, whole)->size_pages = (uint32_t)pages;
    s->phys_head = whole;
    extent_free(s, whole, SCRUB_CLEAN);
    *out = s;
    return KVD_OK;
}

static void lease_free(kvd_store_t *s, lease_t *l)
{
    s->lease_bytes -= sizeof(*l) + (uint64_t)l->cap * sizeof(uint32_t);
    kvd_mem_free(KVD_MEM_INDEX, l->recs, (size_t)l->cap * sizeof(uint32_t));
    kvd_mem_free(KVD_MEM_INDEX, l, sizeof(*l));
}

void kvd_store_destroy(kvd_store_t *s)
{
    if (s == NULL)
        return;
    if (s->tier)
        tier_close(s);
    persist_close(s);
    for (lease_t *l = s->oldest, *next; l != NULL; l = next) {
        next = l->newer;
        lease_free(s, l);
    }
    kvd_mem_free(KVD_MEM_INDEX, s->lease_buckets, s->n_lease_buckets * sizeof(lease_t *));
    kvd_mem_free(KVD_MEM_INDEX, s->buckets, s->n_buckets * sizeof(uint32_t));
    kvd_mem_free(KVD_MEM_INDEX, s->ns, (size_t)s->ns_cap * sizeof(ns_entry_t));
    ns_owners_free(s);
    kvd_mem_free(KVD_MEM_INDEX, s->writers,
                 (size_t)s->cap_writers * sizeof(writer_ent_t));
    rec_fini(s);
    kvd_mem_free(KVD_MEM_INDEX, s, sizeof(*s));
}

/* ----------------------------------------------------------- namespaces */

static uint32_t ns_id_of(const kvd_store_t *s, uint32_t slot)
{
    return slot | (s->ns[slot].gen & NS_GEN_MASK) << KVD_NS_SLOT_BITS;
}

/* The slot of a live namespace id: false for an id never handed out, of a
 * removed namespace, or of an older generation of its slot. */
static bool ns_slot(const kvd_store_t *s, uint32_t id, uint32_t *slot)
{
    uint32_t i = id & (KVD_STORE_MAX_NAMESPACES - 1);
    if (i >= s->n_slots || !s->ns[i].live || ns_id_of(s, i) != id)
        return false;
    *slot = i;
    return true;
}

static void ns_index_rebuild(kvd_store_t *s);
static void ns_index_add(kvd_store_t *s, uint32_t slot);
static uint32_t ns_index_find(const kvd_store_t *s, uint32_t tenant, const char *name);

int kvd_store_ns_find(const kvd_store_t *s, uint32_t tenant, const char *name,
                      uint32_t *ns_id)
{
    /* a name index instead of a scan: registering 4,096 namespaces would
     * otherwise compare millions of names while the loop waits */
    if (s->ns_index_n != s->n_ns)
        ns_index_rebuild((kvd_store_t *)s); /* a cache: the store is not const */
    uint32_t i = ns_index_find(s, tenant, name);
    if (i == UINT32_MAX)
        return KVD_ERR_NOT_FOUND;
    *ns_id = ns_id_of(s, i);
    return KVD_OK;
}

/* A slot for a new namespace: a never used one while any is left, else the
 * one freed longest ago (so that a stale id is as old as can be before its
 * slot serves again; the generation tells them apart anyway). */
static int ns_slot_new(kvd_store_t *s, uint32_t *slot)
{
    if (s->n_slots < KVD_STORE_MAX_NAMESPACES) {
        if (s->n_slots == s->ns_cap) {
            uint32_t cap = s->ns_cap ? s->ns_cap * 2 : 16;
            ns_entry_t *n = kvd_mem_realloc(KVD_MEM_INDEX, s->ns,
                                            (size_t)s->ns_cap * sizeof(ns_entry_t),
                                            (size_t)cap * sizeof(ns_entry_t));
            if (n == NULL)
                return KVD_ERR_NOMEM;
            s->ns = n;
            s->ns_cap = cap;
        }
        memset(&s->ns[s->n_slots], 0, sizeof(ns_entry_t));
        *slot = s->n_slots++;
        return KVD_OK;
    }
    if (s->ns_free_head == 0)
        return KVD_ERR_NO_SPACE;
    uint32_t i = s->ns_free_head - 1;
    s->ns_free_head = s->ns[i].free_next;
    if (s->ns_free_head == 0)
        s->ns_free_tail = 0;
    *slot = i;
    return KVD_OK;
}

/* Registers or finds tenant's namespace `name`; counts owner as a user
 * unless add_user is false (store_ns_ensure). */
static int ns_register(kvd_store_t *s, uint32_t tenant, uint64_t owner, const char *name,
                       uint64_t object_bytes, bool rank_replicated, bool add_user,
                       uint32_t *ns_id)
{
    size_t len = strlen(name);
    if (len == 0 || len >= KVD_NS_NAME_MAX || object_bytes == 0 ||
        object_bytes > s->total_pages * s->cfg.page_bytes || tenant >= s->n_tenants)
        return KVD_ERR_INVALID;
    uint32_t id, slot = 0;
    if (kvd_store_ns_find(s, tenant, name, &id) == KVD_OK) {
        ns_slot(s, id, &slot);
        ns_entry_t *e = &s->ns[slot];
        if (e->info.object_bytes != object_bytes ||
            e->info.rank_replicated != rank_replicated)
            return KVD_ERR_INVALID;
        if (!add_user)
            ; /* found is all that was asked */
        else if (owner == KVD_OWNER_PERMANENT)
            e->permanent = true;
        else if (!ns_use(s, owner, slot))
            return KVD_ERR_NOMEM;
        *ns_id = id;
        return KVD_OK;
    }
    if (s->n_ns >= KVD_STORE_MAX_NAMESPACES)
        return KVD_ERR_NO_SPACE;
    tenant_t *t = &s->tenants[tenant];
    if (t->lim.max_namespaces != 0 && t->use.namespaces >= t->lim.max_namespaces) {
        t->use.quota_refusals++;
        return KVD_ERR_QUOTA;
    }
    int rc = ns_slot_new(s, &slot);
    if (rc != KVD_OK)
        return rc;
    ns_entry_t *e = &s->ns[slot];
    uint32_t gen = e->gen;
    memset(e, 0, sizeof(*e));
    e->gen = gen;
    memcpy(e->info.name, name, len + 1);
    e->info.tenant = tenant;
    e->info.object_bytes = object_bytes;
    e->info.rank_replicated = rank_replicated;
    e->pages = (uint32_t)((object_bytes + s->cfg.page_bytes - 1) / s->cfg.page_bytes);
    e->live = true;
    e->permanent = add_user && owner == KVD_OWNER_PERMANENT;
    s->n_ns++;
    ns_index_add(s, slot);
    t->use.namespaces++;
    persist_ns_added(s, slot);
    if (add_user && !e->permanent && !ns_use(s, owner, slot)) {
        ns_maybe_remove(s, slot);
        persist_commit(s);
        return KVD_ERR_NOMEM;
    }
    persist_commit(s);
    *ns_id = ns_id_of(s, slot);
    return KVD_OK;
}

int kvd_store_ns_register(kvd_store_t *s, uint32_t tenant, uint64_t owner,
                          const char *name, uint64_t object_bytes, bool rank_replicated,
                          uint32_t *ns_id)
{
    return ns_register(s, tenant, owner, name, object_bytes, rank_replicated, true,
                       ns_id);
}

int store_ns_ensure(kvd_store_t *s, uint32_t tenant, const char *name,
                    uint64_t object_bytes, bool rank_replicated, uint32_t *slot)
{
    uint32_t id;
    int rc = ns_register(s, tenant, KVD_OWNER_PERMANENT, name, object_bytes,
                         rank_replicated, false, &id);
    if (rc == KVD_OK)
        ns_slot(s, id, slot);
    return rc;
}

void ns_maybe_remove(kvd_store_t *s, uint32_t slot)
{
    ns_entry_t *e = &s->ns[slot];
    if (!e->live || e->permanent || e->info.users != 0 || e->info.objects_ready != 0 ||
        e->info.objects_writing != 0 || e->info.objects_ssd != 0)
        return;
    s->tenants[e->info.tenant].use.namespaces--;
    e->live = false;
    s->ns_index_n = UINT32_MAX; /* the name index is rebuilt at the next find */
    e->gen = (e->gen + 1) & NS_GEN_MASK;
    e->free_next = 0;
    if (s->ns_free_tail != 0)
        s->ns[s->ns_free_tail - 1].free_next = slot + 1;
    else
        s->ns_free_head = slot + 1;
    s->ns_free_tail = slot + 1;
    s->n_ns--;
    s->st.namespaces_removed++;
    persist_ns_removed(s, slot);
}

uint32_t kvd_store_ns_count(const kvd_store_t *s)
{
    return s->n_ns;
}

int kvd_store_ns_info(const kvd_store_t *s, uint32_t ns_id, kvd_ns_info_t *out)
{
    uint32_t slot;
    if (!ns_slot(s, ns_id, &slot))
        return KVD_ERR_NOT_FOUND;
    *out = s->ns[slot].info;
    return KVD_OK;
}

bool kvd_store_ns_next(const kvd_store_t *s, uint32_t *pos, uint32_t *ns_id)
{
    for (uint32_t i = *pos; i < s->n_slots; i++) {
        if (s->ns[i].live) {
            *ns_id = ns_id_of(s, i);
            *pos = i + 1;
            return true;
        }
    }
    *pos = s->n_slots;
    return false;
}

void kvd_store_set_presence(kvd_store_t *s, kvd_presence_fn fn, void *arg)
{
    s->presence = fn;
    s->presence_arg = arg;
}

void kvd_store_set_scrub(kvd_store_t *s, kvd_scrub_fn fn, void *arg)
{
    s->scrub = fn;
    s->scrub_arg = arg;
}

static uint32_t tenant_of(const kvd_store_t *s, uint32_t slot)
{
    return s->ns[slot].info.tenant;
}

/* ---------------------------------------------------------------- index */

/* A key's tag: a hash of the whole key, keyed with a seed drawn at start.
 * Clients choose the keys, so a fixed function of them would let one client
 * pile every key into one bucket; with the seed they cannot aim. The bucket
 * depends on the tag alone, so a parent is found from the tag a child
 * records. */
/* The folded 128-bit product: one multiply mixes both 64-bit halves. */
static inline uint64_t mum(uint64_t a, uint64_t b)
{
    __uint128_t r = (__uint128_t)a * b;
    return (uint64_t)r ^ (uint64_t)(r >> 64);
}

static uint64_t key_tag(const kvd_store_t *s, const uint8_t *key)
{
    _Static_assert(KVD_KEY_BYTES == 4 * sizeof(uint64_t) &&
                       KVD_KEY_TAG_BYTES == sizeof(uint64_t),
                   "the tag mixes a key as four words into one");
    uint64_t w[4];
    memcpy(w, key, sizeof(w));
    /* two independent products (they run in parallel), then one to fold */
    const uint64_t *k = s->secret;
    uint64_t h = mum(w[0] ^ k[0], w[1] ^ k[1]) ^ mum(w[2] ^ k[2], w[3] ^ k[3]);
    return mum(h ^ k[4], k[5]);
}

static uint64_t bucket_of(const kvd_store_t *s, uint32_t ns, uint64_t tag)
{
    uint64_t h = tag ^ (uint64_t)(ns + 1) * 0x9e3779b97f4a7c15ull;
    h ^= h >> 29;
    return h & (s->n_buckets - 1);
}

static int buckets_resize(kvd_store_t *s, uint64_t n_buckets)
{
    uint32_t *nb = kvd_mem_calloc(KVD_MEM_INDEX, n_buckets, sizeof(uint32_t));
    if (nb == NULL)
        return KVD_ERR_NOMEM;
    uint32_t *old = s->buckets;
    uint64_t old_n = s->n_buckets;
    s->buckets = nb;
    s->n_buckets = n_buckets;
    for (uint64_t b = 0; b < old_n; b++) {
        for (uint32_t i = old[b], next; i != NIL; i = next) {
            rec_t *r = R(s, i);
            next = r->hash_next;
            uint64_t nbk = bucket_of(s, r->ns, key_tag(s, r->key));
            r->hash_next = nb[nbk];
            nb[nbk] = i;
        }
    }
    kvd_mem_free(KVD_MEM_INDEX, old, old_n * sizeof(uint32_t));
    return KVD_OK;
}

static uint32_t index_find(const kvd_store_t *s, uint32_t ns, const uint8_t *key)
{
    for (uint32_t i = s->buckets[bucket_of(s, ns, key_tag(s, key))]; i != NIL;
         i = R(s, i)->hash_next) {
        const rec_t *r = R(s, i);
        if (r->ns == ns && memcmp(r->key, key, KVD_KEY_BYTES) == 0)
            return i;
    }
    return NIL;
}

static void index_insert(kvd_store_t *s, uint32_t i)
{
    rec_t *r = R(s, i);
    uint64_t b = bucket_of(s, r->ns, key_tag(s, r->key));
    r->hash_next = s->buckets[b];
    s->buckets[b] = i;
    s->n_objects++;
    /* grow at load 1; a failed growth only makes chains longer */
    if (s->n_objects > s->n_buckets && s->n_buckets < (1ull << 32))
        buckets_resize(s, s->n_buckets * 2);
}

static void index_remove(kvd_store_t *s, uint32_t i)
{
    rec_t *r = R(s, i);
    uint32_t *link = &s->buckets[bucket_of(s, r->ns, key_tag(s, r->key))];
    while (*link != i)
        link = &R(s, *link)->hash_next;
    *link = r->hash_next;
    r->hash_next = NIL;
    s->n_objects--;
}

/* ------------------------------------------------------------------ LRU */

/* A list of records through link_prev/link_next, head most recent: the
 * DRAM LRU and the SSD tier's. */
static void list_push_head(kvd_store_t *s, uint32_t *head, uint32_t *tail, uint32_t i)
{
    rec_t *r = R(s, i);
    r->link_prev = NIL;
    r->link_next = *head;
    if (*head != NIL)
        R(s, *head)->link_prev = i;
    else
        *tail = i;
    *head = i;
}

static void list_remove(kvd_store_t *s, uint32_t *head, uint32_t *tail, uint32_t i)
{
    rec_t *r = R(s, i);
    if (r->link_prev != NIL)
        R(s, r->link_prev)->link_next = r->link_next;
    else
        *head = r->link_next;
    if (r->link_next != NIL)
        R(s, r->link_next)->link_prev = r->link_prev;
    else
        *tail = r->link_prev;
    r->link_prev = r->link_next = NIL;
}

static void lru_push_head(kvd_store_t *s, uint32_t i)
{
    rec_t *r = R(s, i);
    s->lru_pages += r->size_pages;
    s->tenants[s->ns[r->ns].info.tenant].lru_pages += r->size_pages;
    list_push_head(s, &s->lru_head, &s->lru_tail, i);
}

static void lru_remove(kvd_store_t *s, uint32_t i)
{
    rec_t *r = R(s, i);
    s->lru_pages -= r->size_pages;
    s->tenants[s->ns[r->ns].info.tenant].lru_pages -= r->size_pages;
    list_remove(s, &s->lru_head, &s->lru_tail, i);
}

static uint32_t now_s(const kvd_store_t *s)
{
    uint64_t now = kvd_wall_ms();
    uint64_t secs = now > s->epoch_ms ? (now - s->epoch_ms) / 1000 + 1 : 1;
    return (uint32_t)KVD_MIN(secs, (uint64_t)UINT32_MAX);
}

/* ------------------------------------------------------------- eviction */

static uint64_t page_bytes_of(const kvd_store_t *s, uint64_t pages)
{
    return pages * s->cfg.page_bytes;
}

/* The record of ns whose key has this tag, or NIL. */
static uint32_t index_find_tag(const kvd_store_t *s, uint32_t ns, const uint8_t *tag8)
{
    uint64_t tag;
    memcpy(&tag, tag8, sizeof(tag));
    for (uint32_t i = s->buckets[bucket_of(s, ns, tag)]; i != NIL;
         i = R(s, i)->hash_next) {
        const rec_t *r = R(s, i);
        if (r->ns == ns && key_tag(s, r->key) == tag)
            return i;
    }
    return NIL;
}

/* Counts a published page in its parent's children (+1) or uncounts it (-1).
 * Saturating: a parent stored after its children, or re-stored after an
 * eviction, may undercount, which only makes it look like a leaf sooner. */
static void count_child(kvd_store_t *s, uint32_t i, int delta)
{
    const rec_t *r = R(s, i);
    if (!r->has_parent)
        return;
    uint32_t p = index_find_tag(s, r->ns, r->parent_tag);
    if (p == NIL)
        return;
    rec_t *pr = R(s, p);
    if (delta > 0 && pr->children < UINT16_MAX)
        pr->children++;
    else if (delta < 0 && pr->children > 0)
        pr->children--;
}

/* Frees an object (READY and off the LRU, or WRITING) and, when it was its
 * namespace's last and nobody uses that namespace, the namespace too. */
static void drop_object(kvd_store_t *s, uint32_t i)
{
    rec_t *r = R(s, i);
    uint32_t slot = r->ns;
    ns_entry_t *e = &s->ns[slot];
    if (r->state == REC_READY && s->presence != NULL)
        s->presence(s->presence_arg, ns_id_of(s, slot), r->key, false);
    if (r->state == REC_READY) {
        e->info.objects_ready--;
        count_child(s, i, -1);
    } else {
        e->info.objects_writing--;
    }
    index_remove(s, i);
    uint32_t t = e->info.tenant;
    s->tenants[t].use.bytes -= page_bytes_of(s, r->size_pages);
    persist_freed(s, i);
    extent_free(s, i, (uint16_t)(t + 1));
    ns_maybe_remove(s, slot);
}

/* The object eviction takes from a list's cold end (the DRAM LRU's or the
 * SSD tier's), of any tenant (tenant == UINT32_MAX) or of one; NIL when
 * there is none. For one
 * tenant the window and the leaf search count only its objects, and at
 * most EVICT_TENANT_SCAN objects of the LRU are looked at, so that a tenant
 * whose objects are all hot costs bounded work, not a walk of the pool. */
static uint32_t victim_of(const kvd_store_t *s, uint32_t tail, uint32_t tenant)
{
    uint32_t deepest = NIL, leaf = NIL;
    uint32_t i = tail;
    int seen = 0;
    int scan = tenant == UINT32_MAX ? EVICT_SCAN_MAX : EVICT_TENANT_SCAN;
    for (int n = 0; n < scan && i != NIL; n++, i = R(s, i)->link_prev) {
        const rec_t *r = R(s, i);
        if (tenant != UINT32_MAX && tenant_of(s, r->ns) != tenant)
            continue;
        if (seen < EVICT_WINDOW && (deepest == NIL || r->depth > R(s, deepest)->depth))
            deepest = i;
        if (r->children == 0 && (leaf == NIL || r->depth > R(s, leaf)->depth))
            leaf = i;
        seen++;
        if ((leaf != NIL && seen >= EVICT_WINDOW) || seen >= EVICT_SCAN_MAX)
            break;
    }
    return leaf != NIL ? leaf : deepest;
}

/* Evicts (frees) the victim of the DRAM LRU, of tenant or of any; false
 * when there is none. */
static bool evict_pick(kvd_store_t *s, uint32_t tenant)
{
    uint32_t best = victim_of(s, s->lru_tail, tenant);
    if (best == NIL)
        return false;
    rec_t *r = R(s, best);
    if (tenant != UINT32_MAX)
        s->tenants[tenant].use.quota_evictions++;
    s->ns[r->ns].info.evictions++;
    s->st.evictions++;
    s->st.evicted_bytes += page_bytes_of(s, r->size_pages);
    lru_remove(s, best);
    drop_object(s, best);
    return true;
}

/* Evicts one READY, unpinned object from the LRU's cold end (victim_of);
 * false when there is none. */
static bool evict_one(kvd_store_t *s)
{
    return evict_pick(s, UINT32_MAX);
}

static uint64_t used_pages(const kvd_store_t *s)
{
    return s->total_pages - s->free_pages;
}

/* Past the high watermark, evicts down to the low one; with an SSD tier,
 * spills instead (store_spill_pump). */
static void evict_watermarks(kvd_store_t *s)
{
    if (s->tier) {
        store_spill_pump(s);
        return;
    }
    if ((double)used_pages(s) <= s->cfg.evict_high * (double)s->total_pages)
        return;
    double low = s->cfg.evict_low * (double)s->total_pages;
    while ((double)used_pages(s) > low && evict_one(s))
        ;
}

/* Evictions one allocation may cost before it gives up: enough to free the
 * request's pages many times over from objects of one page, never the whole
 * cache for a hole that fragmentation keeps from forming. */
static uint64_t evict_budget(uint32_t pages)
{
    return 64 + 4ull * pages;
}

/* An extent for `pages`, evicting (within the budget) until one fits; NIL
 * when it cannot: then nothing was evicted if even every evictable page
 * beside the free ones would be too few. */
static uint32_t alloc_evicting(kvd_store_t *s, uint32_t pages)
{
    uint32_t i = extent_alloc(s, pages);
    if (i != NIL || s->free_pages + s->lru_pages < pages)
        return i;
    for (uint64_t budget = evict_budget(pages); budget > 0 && evict_one(s); budget--)
        if ((i = extent_alloc(s, pages)) != NIL)
            return i;
    return NIL;
}

/* ------------------------------------------------------------ SSD tier */

static void evict_rec(kvd_store_t *s, uint32_t i);

/* What an object keeps when it moves between the tiers (a new record):
 * its place in its chain and its use. */
static void copy_chain(rec_t *q, const rec_t *r)
{
    memcpy(q->parent_tag, r->parent_tag, KVD_KEY_TAG_BYTES);
    q->has_parent = r->has_parent;
    q->depth = r->depth;
    q->hits = r->hits;
    q->children = r->children;
}

/* The SSD LRU: objects on the tier that are not being promoted, head most
 * recent (store_int.h). */
static void ssd_lru_push_head(kvd_store_t *s, uint32_t i)
{
    list_push_head(s, &s->ssd_lru_head, &s->ssd_lru_tail, i);
}

static void ssd_lru_remove(kvd_store_t *s, uint32_t i)
{
    list_remove(s, &s->ssd_lru_head, &s->ssd_lru_tail, i);
}

/* Drops SSD object i (off the SSD LRU already): it leaves the index, its
 * place on the tier is dead, its namespace may go. */
static void drop_ssd(kvd_store_t *s, uint32_t i)
{
    rec_t *r = R(s, i);
    uint32_t slot = r->ns;
    if (s->presence != NULL)
        s->presence(s->presence_arg, ns_id_of(s, slot), r->key, false);
    s->ns[slot].info.objects_ssd--;
    count_child(s, i, -1);
    index_remove(s, i);
    tier_forget(s, i);
    s->ssd_objects--;
    s->ssd_pages -= r->size_pages;
    rec_put(s, i);
    ns_maybe_remove(s, slot);
}

void store_ssd_drop(kvd_store_t *s, uint32_t i)
{
    s->st.promote_failures++;
    ssd_lru_remove(s, i);
    drop_ssd(s, i);
    PARANOID(s, "ssd_drop");
}

void store_ssd_evict(kvd_store_t *s, uint32_t i)
{
    evict_rec(s, i);
    PARANOID(s, "ssd_evict");
}

bool store_ssd_evict_one(kvd_store_t *s)
{
    uint32_t i = victim_of(s, s->ssd_lru_tail, UINT32_MAX);
    if (i == NIL)
        return false;
    evict_rec(s, i);
    return true;
}

void store_spill_pump(kvd_store_t *s)
{
    double high = s->cfg.evict_high * (double)s->total_pages;
    double low = s->cfg.evict_low * (double)s->total_pages;
    /* once past the high watermark it goes on, call after call (the tier
     * takes a queue's worth at a time), until the low one is reached */
    if (!s->spilling_down && (double)(used_pages(s) - s->spilling_pages) <= high)
        return;
    s->spilling_down = true;
    while ((double)(used_pages(s) - s->spilling_pages) > low) {
        uint32_t i = victim_of(s, s->lru_tail, UINT32_MAX);
        if (i == NIL)
            return;
        rec_t *r = R(s, i);
        if (s->spill_policy == KVD_SPILL_HIT && r->hits == 0) {
            s->st.spill_drops++;
            evict_pick(s, UINT32_MAX); /* takes the same victim */
            continue;
        }
        if (!tier_spill_begin(s, i))
            return; /* the tier is busy or full: later, or on demand */
        lru_remove(s, i);
        r->spare |= REC_F_SPILLING;
        s->spilling_pages += r->size_pages;
    }
    s->spilling_down = false;
}

uint32_t store_spill_done(kvd_store_t *s, uint32_t i, int status, uint32_t loc, bool keep)
{
    rec_t *r = R(s, i);
    r->spare &= ~REC_F_SPILLING;
    s->spilling_pages -= r->size_pages;
    if (r->pins > 0) {
        /* read while it was written: it stays, its copy is not needed */
        s->st.spill_cancelled++;
        return NIL;
    }
    if (r->spare & REC_F_LOST) {
        /* its bytes were lost while they were written: neither copy is it */
        drop_object(s, i);
        persist_commit(s);
        PARANOID(s, "spill_lost");
        return NIL;
    }
    if (status != KVD_OK && keep) {
        /* the write failed, not the DRAM copy (tier.c's done_spill): not
         * counted in spill_failures, which counts objects dropped */
        lru_push_head(s, i);
        return NIL;
    }
    if (status != KVD_OK) {
        /* evicted as it would have been without a tier */
        s->st.spill_failures++;
        lru_push_head(s, i);
        evict_rec(s, i);
        persist_commit(s);
        PARANOID(s, "spill_failed");
        return NIL;
    }
    uint32_t j = rec_new(s);
    if (j == NIL) {
        lru_push_head(s, i); /* no record for it: it stays in DRAM */
        return NIL;
    }
    rec_t *q = R(s, j);
    memcpy(q->key, r->key, KVD_KEY_BYTES);
    copy_chain(q, r);
    q->last_access_s = r->last_access_s;
    q->ns = r->ns;
    q->off_pages = loc;
    q->size_pages = r->size_pages;
    q->state = REC_READY;
    q->tier = KVD_TIER_SSD;
    uint32_t slot = r->ns, t = tenant_of(s, slot);
    ns_entry_t *e = &s->ns[slot];
    index_remove(s, i);
    index_insert(s, j);
    e->info.objects_ready--;
    e->info.objects_ssd++;
    s->ssd_objects++;
    s->ssd_pages += q->size_pages;
    s->st.spills++;
    s->st.spilled_bytes += e->info.object_bytes;
    s->tenants[t].use.bytes -= page_bytes_of(s, r->size_pages);
    persist_freed(s, i);
    extent_free(s, i, (uint16_t)(t + 1));
    ssd_lru_push_head(s, j);
    persist_commit(s);
    PARANOID(s, "spill");
    return j;
}

static bool tenant_room(kvd_store_t *s, uint32_t t, uint32_t pages, bool *stuck);

/* Begins the promotion of SSD object i into a DRAM extent of its own;
 * KVD_INPROGRESS when it runs (or ran already), KVD_ERR_NO_SPACE when no
 * room can be made in DRAM (or in its tenant's max_bytes), KVD_ERR_BUSY
 * when the tier cannot take it now
 * (the caller asks again later either way). */
static int promote_begin(kvd_store_t *s, uint32_t i)
{
    rec_t *r = R(s, i);
    if (r->spare & REC_F_PROMOTING)
        return KVD_INPROGRESS;
    uint32_t slot = r->ns, t = tenant_of(s, slot);
    /* the object comes back into DRAM, which its tenant's max_bytes bounds
     * as for a Reserve: its own cold objects make room, or it stays out */
    bool stuck = false;
    if (!tenant_room(s, t, r->size_pages, &stuck)) {
        s->tenants[t].use.quota_refusals++;
        return KVD_ERR_NO_SPACE;
    }
    uint32_t j = alloc_evicting(s, r->size_pages);
    if (j == NIL)
        return KVD_ERR_NO_SPACE;
    rec_t *q = R(s, j);
    uint16_t tag = q->ns; /* whose bytes the extent held (extent_alloc) */
    memcpy(q->key, r->key, KVD_KEY_BYTES);
    q->ns = (uint16_t)slot;
    q->hits = tag; /* until the promotion ends */
    q->state = REC_WRITING;
    q->spare |= REC_F_PROMOTING;
    if (!tier_promote_begin(s, i, j)) {
        q->spare = 0;
        extent_free(s, j, tag);
        return KVD_ERR_BUSY;
    }
    s->tenants[t].use.bytes += page_bytes_of(s, q->size_pages);
    s->promoting_pages += q->size_pages;
    /* a restart while it runs finds a partial write, and quarantines it */
    persist_writing(s, j, NULL); /* the daemon itself: gone with it */
    ssd_lru_remove(s, i);
    r->spare |= REC_F_PROMOTING;
    r->phys_prev = j;
    return KVD_INPROGRESS;
}

/* Frees promotion extent j: its bytes are not an object. What it holds
 * now is tenant t's record where the read landed and the extent's former
 * bytes elsewhere (q->hits kept whose they were). */
static void promote_free(kvd_store_t *s, uint32_t j, uint32_t t)
{
    rec_t *q = R(s, j);
    uint16_t was = q->hits, mine = (uint16_t)(t + 1);
    s->promoting_pages -= q->size_pages;
    s->tenants[t].use.bytes -= page_bytes_of(s, q->size_pages);
    q->spare &= ~REC_F_PROMOTING;
    persist_freed(s, j);
    extent_free(s, j, was == SCRUB_CLEAN || was == mine ? mine : SCRUB_MIXED);
}

void store_promote_done(kvd_store_t *s, uint32_t i, int status)
{
    rec_t *r = R(s, i);
    uint32_t j = r->phys_prev, slot = r->ns, t = tenant_of(s, slot);
    rec_t *q = R(s, j);
    ns_entry_t *e = &s->ns[slot];
    r->spare &= ~REC_F_PROMOTING;
    r->phys_prev = NIL;
    uint32_t now = now_s(s);
    /* a promotion whose DRAM extent lost its bytes fails; the tier's copy
     * stays what serves the object */
    bool unjournaled = status == KVD_OK && (q->spare & REC_F_LOST);
    if (status == KVD_OK && !unjournaled) {
        uint16_t was = q->hits;
        copy_chain(q, r);
        /* not durable in DRAM: the tier's copy stays what serves it */
        if ((unjournaled = persist_published(s, &j, 1, now) != KVD_OK))
            q->hits = was;
    }
    if (status != KVD_OK || unjournaled) {
        promote_free(s, j, t);
        if (unjournaled) {
            ssd_lru_push_head(s, i);
        } else {
            s->st.promote_failures++;
            drop_ssd(s, i);
        }
        persist_commit(s);
        PARANOID(s, "promote_failed");
        return;
    }
    s->promoting_pages -= q->size_pages;
    q->spare &= ~REC_F_PROMOTING;
    q->state = REC_READY;
    q->last_access_s = now;
    index_remove(s, i);
    index_insert(s, j);
    tier_forget(s, i);
    s->ssd_objects--;
    s->ssd_pages -= r->size_pages;
    e->info.objects_ssd--;
    e->info.objects_ready++;
    s->st.promotions++;
    s->st.promoted_bytes += e->info.object_bytes;
    rec_put(s, i);
    lru_push_head(s, j);
    persist_commit(s);
    PARANOID(s, "promote");
}

bool store_ssd_insert(kvd_store_t *s, uint32_t slot, const uint8_t key[KVD_KEY_BYTES],
                      const uint8_t *parent_tag, uint32_t depth, uint32_t last_access_s,
                      uint16_t hits, uint32_t loc, uint32_t *out)
{
    if (index_find(s, slot, key) != NIL)
        return false;
    uint32_t j = rec_new(s);
    if (j == NIL)
        return false;
    rec_t *q = R(s, j);
    memcpy(q->key, key, KVD_KEY_BYTES);
    if (parent_tag) {
        memcpy(q->parent_tag, parent_tag, KVD_KEY_TAG_BYTES);
        q->has_parent = 1;
    }
    q->depth = KVD_MIN(depth, REC_DEPTH_MAX);
    q->last_access_s = last_access_s;
    q->hits = hits;
    q->ns = (uint16_t)slot;
    q->off_pages = loc;
    q->size_pages = s->ns[slot].pages;
    q->state = REC_READY;
    q->tier = KVD_TIER_SSD;
    index_insert(s, j);
    s->ns[slot].info.objects_ssd++;
    s->ssd_objects++;
    s->ssd_pages += q->size_pages;
    *out = j;
    return true;
}

void store_ssd_inserted(kvd_store_t *s, const uint32_t *recs, size_t n)
{
    uint64_t *refs = kvd_mem_calloc(KVD_MEM_STAGING, n ? 2 * n : 1, sizeof(uint64_t));
    for (size_t k = 0; k < n; k++)
        count_child(s, recs[k], +1);
    if (refs == NULL) {
        for (size_t k = 0; k < n; k++)
            ssd_lru_push_head(s, recs[k]);
        return;
    }
    /* oldest access first onto the head: the most recent ends there */
    for (size_t k = 0; k < n; k++)
        refs[k] = (uint64_t)R(s, recs[k])->last_access_s << 32 | recs[k];
    store_sort_high32(refs, refs + n, n);
    for (size_t k = 0; k < n; k++)
        ssd_lru_push_head(s, (uint32_t)refs[k]);
    kvd_mem_free(KVD_MEM_STAGING, refs, 2 * n * sizeof(uint64_t));
    PARANOID(s, "ssd_restore");
}

/* -------------------------------------------------------- held extents */

/*
 * A reservation whose writer is known (its process and token) is not put
 * in the TTL quarantine when its lease ends unpublished: the writer may be
 * stopped (SIGSTOP, swapped out, a long pause) and resume its copy at any
 * time, so its extent is held until that process is gone or says that
 * its copies are over. The writers table is small (one entry per writing
 * process and linker), searched linearly at each Reserve of a writer.
 */

static bool writer_same(const kvd_writer_t *a, const kvd_writer_t *b)
{
    return a->pid == b->pid && a->start_ticks == b->start_ticks && a->token == b->token;
}

static uint32_t writer_find(const kvd_store_t *s, const kvd_writer_t *w)
{
    for (uint32_t k = 0; k < s->n_writers; k++)
        if (s->writers[k].id.pid != 0 && writer_same(&s->writers[k].id, w))
            return k + 1;
    return 0;
}

uint32_t store_writer_get(kvd_store_t *s, const kvd_writer_t *w)
{
    uint32_t found = writer_find(s, w);
    if (found != 0)
        return found;
    uint32_t k = 0;
    while (k < s->n_writers && s->writers[k].id.pid != 0)
        k++;
    if (k == s->n_writers) {
        if (k == KVD_STORE_WRITERS_MAX)
            goto full;
        if (k == s->cap_writers) {
            uint32_t cap = s->cap_writers ? 2 * s->cap_writers : 16;
            writer_ent_t *n = kvd_mem_realloc(KVD_MEM_INDEX, s->writers,
                                              (size_t)s->cap_writers * sizeof(*n),
                                              (size_t)cap * sizeof(*n));
            if (n == NULL)
                goto full;
            s->writers = n;
            s->cap_writers = cap;
        }
        s->n_writers++;
    }
    s->writers[k] = (writer_ent_t){.id = *w, .held_head = NIL};
    return k + 1;
full:
    if (s->now_ms >= s->writers_full_logged_ms + 60000) {
        s->writers_full_logged_ms = s->now_ms;
        KVD_WARN("store",
                 "%u writer processes hold leases or extents already: the leases of pid "
                 "%u fall back to one lease TTL of quarantine",
                 s->n_writers, w->pid);
    }
    return 0;
}

/* Frees writer slot w once it counts nothing (the table shrinks from its
 * end). */
static void writer_maybe_free(kvd_store_t *s, writer_ent_t *w)
{
    if (w->leases != 0 || w->held_head != NIL)
        return;
    w->id.pid = 0;
    while (s->n_writers > 0 && s->writers[s->n_writers - 1].id.pid == 0)
        s->n_writers--;
}

/* Puts quarantined record i into writer slot w's held list. */
static void writer_hold(kvd_store_t *s, uint32_t w, uint32_t i)
{
    writer_ent_t *e = &s->writers[w - 1];
    rec_t *r = R(s, i);
    r->link_prev = NIL;
    r->link_next = e->held_head;
    e->held_head = i;
    e->held_pages += r->size_pages;
    s->held_pages += r->size_pages;
    s->quarantine_pages += r->size_pages;
}

/* Frees a quarantined extent (its grace over, or its writer gone). */
static void quarantine_free(kvd_store_t *s, uint32_t i)
{
    rec_t *r = R(s, i);
    s->quarantine_pages -= r->size_pages;
    uint16_t tag = r->hits;
    s->tenants[tag - 1].use.bytes -= page_bytes_of(s, r->size_pages);
    persist_freed(s, i);
    extent_free(s, i, tag);
}

/* Frees up to max of writer slot w's held extents; returns how many. */
static uint64_t writer_release(kvd_store_t *s, uint32_t w, uint64_t max)
{
    writer_ent_t *e = &s->writers[w - 1];
    uint64_t n = 0;
    while (e->held_head != NIL && n < max) {
        uint32_t i = e->held_head;
        rec_t *r = R(s, i);
        e->held_head = r->link_next;
        e->held_pages -= r->size_pages;
        s->held_pages -= r->size_pages;
        quarantine_free(s, i);
        n++;
    }
    writer_maybe_free(s, e);
    return n;
}

static void lease_unlink(kvd_store_t *s, lease_t *l);

uint64_t kvd_store_writer_done(kvd_store_t *s, const kvd_writer_t *writer, uint64_t owner)
{
    uint32_t w = writer->pid != 0 ? writer_find(s, writer) : 0;
    if (w == 0)
        return 0;
    uint64_t pages = 0;
    for (lease_t *l = s->oldest, *next; l != NULL; l = next) {
        next = l->newer;
        if (!l->write || l->writer != w || l->owner == owner)
            continue;
        /* revoked, as its writer would have: nothing copies into it */
        for (uint32_t k = 0; k < l->n; k++) {
            if (l->recs[k] == NIL)
                continue;
            pages += R(s, l->recs[k])->size_pages;
            drop_object(s, l->recs[k]);
            l->recs[k] = NIL;
        }
        lease_unlink(s, l);
    }
    /* the slot stays while it holds extents (lease_unlink frees it only
     * without) */
    pages += s->writers[w - 1].held_pages;
    writer_release(s, w, UINT64_MAX);
    persist_commit(s);
    PARANOID(s, "writer_done");
    return page_bytes_of(s, pages);
}

/* /proc is read for at most this many writers per sweep, each at most once
 * per WRITER_CHECK_MS; at most WRITER_FREE_MAX extents are freed per sweep
 * (the rest at the next). */
#define WRITER_CHECKS_MAX 8
#define WRITER_CHECK_MS   1000
#define WRITER_FREE_MAX   65536
#define HELD_LOG_MS       60000

/* Whether writer e's process is gone for sure (not there, or another
 * process under its pid); an error reading /proc counts as alive. */
static bool writer_gone(const writer_ent_t *e)
{
    uint64_t ticks;
    int rc = kvd_proc_start_ticks((int)e->id.pid, &ticks);
    return rc == KVD_ERR_NOT_FOUND || (rc == KVD_OK && ticks != e->id.start_ticks);
}

/* Frees the held extents of writers whose process is gone, within the
 * bounds above, going round the table from where the last sweep stopped. */
static void writers_sweep(kvd_store_t *s, uint64_t now_ms)
{
    uint32_t checks = 0;
    uint64_t freed = 0;
    for (uint32_t k = 0;
         k < s->n_writers && checks < WRITER_CHECKS_MAX && freed < WRITER_FREE_MAX; k++) {
        uint32_t w = s->writer_cursor++ % s->n_writers;
        writer_ent_t *e = &s->writers[w];
        if (e->id.pid == 0 || e->held_head == NIL)
            continue;
        if (!e->gone) {
            if (e->checked_ms != 0 && now_ms < e->checked_ms + WRITER_CHECK_MS)
                continue;
            e->checked_ms = now_ms;
            checks++;
            e->gone = writer_gone(e);
        }
        if (!e->gone) {
            /* each writer's first line at once, then one a minute in all */
            if (!e->logged || now_ms >= s->held_logged_ms + HELD_LOG_MS) {
                e->logged = true;
                s->held_logged_ms = now_ms;
                KVD_WARN(
                    "store",
                    "%llu bytes of unpublished reservations are held for writer pid "
                    "%u (%llu bytes held in all): its lease ended while it may still "
                    "copy into them; they are freed once it exits or reconnects "
                    "saying its copies are over",
                    (unsigned long long)page_bytes_of(s, e->held_pages), e->id.pid,
                    (unsigned long long)page_bytes_of(s, s->held_pages));
            }
            continue;
        }
        uint32_t pid = e->id.pid;
        uint64_t pages = e->held_pages;
        freed += writer_release(s, w + 1, WRITER_FREE_MAX - freed);
        if (e->held_head != NIL)
            s->writer_cursor = w; /* more of it next time */
        else
            KVD_INFO("store", "writer pid %u is gone: its %llu held bytes are free", pid,
                     (unsigned long long)page_bytes_of(s, pages));
    }
}

void store_foreach_held(const kvd_store_t *s,
                        void (*fn)(void *arg, uint32_t rec, const kvd_writer_t *w),
                        void *arg)
{
    for (uint32_t k = 0; k < s->n_writers; k++)
        for (uint32_t i = s->writers[k].held_head; i != NIL; i = R(s, i)->link_next)
            fn(arg, i, &s->writers[k].id);
    for (const lease_t *l = s->oldest; l != NULL; l = l->newer)
        if (l->write && l->writer != 0)
            for (uint32_t k = 0; k < l->n; k++)
                if (l->recs[k] != NIL)
                    fn(arg, l->recs[k], &s->writers[l->writer - 1].id);
}

/* --------------------------------------------------------------- leases */

static lease_t *lease_find(const kvd_store_t *s, uint64_t id)
{
    for (lease_t *l = s->lease_buckets[id & (s->n_lease_buckets - 1)]; l; l = l->hnext)
        if (l->id == id)
            return l;
    return NULL;
}

bool kvd_store_lease_live(const kvd_store_t *s, uint64_t owner, uint64_t lease_id)
{
    const lease_t *l = lease_id != 0 ? lease_find(s, lease_id) : NULL;
    return l != NULL && l->owner == owner;
}

/* Makes room for `more` holds in one allocation. */
static int lease_reserve(kvd_store_t *s, lease_t *l, size_t more)
{
    if (more > UINT32_MAX - l->n)
        return KVD_ERR_NOMEM;
    uint32_t need = l->n + (uint32_t)more;
    if (need <= l->cap)
        return KVD_OK;
    uint32_t *n =
        kvd_mem_realloc(KVD_MEM_INDEX, l->recs, (size_t)l->cap * 4, (size_t)need * 4);
    if (n == NULL)
        return KVD_ERR_NOMEM;
    s->lease_bytes += (uint64_t)(need - l->cap) * sizeof(uint32_t);
    l->recs = n;
    l->cap = need;
    return KVD_OK;
}

static int lease_add(kvd_store_t *s, lease_t *l, uint32_t rec)
{
    if (l->n == l->cap) {
        uint32_t cap = l->cap ? l->cap * 2 : 16;
        uint32_t *n =
            kvd_mem_realloc(KVD_MEM_INDEX, l->recs, (size_t)l->cap * 4, (size_t)cap * 4);
        if (n == NULL)
            return KVD_ERR_NOMEM;
        s->lease_bytes += (uint64_t)(cap - l->cap) * sizeof(uint32_t);
        l->recs = n;
        l->cap = cap;
    }
    l->recs[l->n++] = rec;
    return KVD_OK;
}

/*
 * A fresh lease id: random, non-zero and unused by any live lease, so that
 * an id tells nothing of the others (they were sequential: a client could
 * name its neighbours' leases). Drawn from getrandom 64 at a time; should
 * that fail, from a sequence mixed with the store's secret (a weaker
 * fallback that never fails).
 */
static uint64_t lease_id_new(kvd_store_t *s)
{
    for (;;) {
        if (s->lease_ids_left == 0) {
            ssize_t got = getrandom(s->lease_ids, sizeof(s->lease_ids), GRND_NONBLOCK);
            if (got == (ssize_t)sizeof(s->lease_ids)) {
                s->lease_ids_left = KVD_ARRAY_SIZE(s->lease_ids);
            } else {
                uint64_t x =
                    (s->lease_id_fallback += 0x9e3779b97f4a7c15ull) ^ s->secret[0];
                x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
                x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
                s->lease_ids[0] = (x ^ (x >> 31)) ^ s->secret[1];
                s->lease_ids_left = 1;
            }
        }
        uint64_t id = s->lease_ids[--s->lease_ids_left];
        if (id != 0 && lease_find(s, id) == NULL)
            return id;
    }
}

/* Whether tenant t may open one more lease (counting a refusal). */
static bool lease_quota_ok(kvd_store_t *s, uint32_t t)
{
    tenant_t *tn = &s->tenants[t];
    if (tn->lim.max_leases == 0 || tn->use.leases < tn->lim.max_leases)
        return true;
    tn->use.quota_refusals++;
    return false;
}

static lease_t *lease_new(kvd_store_t *s, uint64_t owner, bool write, uint64_t now_ms,
                          uint32_t tenant)
{
    if (s->n_leases >= s->n_lease_buckets * 2) {
        uint64_t nb = s->n_lease_buckets * 2;
        lease_t **b = kvd_mem_calloc(KVD_MEM_INDEX, nb, sizeof(lease_t *));
        if (b != NULL) {
            for (lease_t *l = s->oldest; l != NULL; l = l->newer) {
                l->hnext = b[l->id & (nb - 1)];
                b[l->id & (nb - 1)] = l;
            }
            kvd_mem_free(KVD_MEM_INDEX, s->lease_buckets,
                         s->n_lease_buckets * sizeof(lease_t *));
            s->lease_buckets = b;
            s->n_lease_buckets = nb;
        }
    }
    lease_t *l = kvd_mem_calloc(KVD_MEM_INDEX, 1, sizeof(*l));
    if (l == NULL)
        return NULL;
    s->lease_bytes += sizeof(*l);
    l->id = lease_id_new(s);
    l->owner = owner;
    l->write = write;
    l->tenant = tenant;
    s->tenants[tenant].use.leases++;
    l->expires_ms = now_ms + s->cfg.lease_ttl_ms;
    /* every lease has the same TTL: creation order is expiry order */
    l->older = s->newest;
    if (s->newest)
        s->newest->newer = l;
    else
        s->oldest = l;
    s->newest = l;
    lease_t **b = &s->lease_buckets[l->id & (s->n_lease_buckets - 1)];
    l->hnext = *b;
    *b = l;
    s->n_leases++;
    return l;
}

static void lease_unlink(kvd_store_t *s, lease_t *l)
{
    if (l->older)
        l->older->newer = l->newer;
    else
        s->oldest = l->newer;
    if (l->newer)
        l->newer->older = l->older;
    else
        s->newest = l->older;
    lease_t **b = &s->lease_buckets[l->id & (s->n_lease_buckets - 1)];
    while (*b != l)
        b = &(*b)->hnext;
    *b = l->hnext;
    s->n_leases--;
    s->tenants[l->tenant].use.leases--;
    if (l->writer != 0) {
        writer_ent_t *w = &s->writers[l->writer - 1];
        w->leases--;
        writer_maybe_free(s, w);
    }
    lease_free(s, l);
}

typedef struct depth_ref {
    uint32_t depth;
    uint32_t rec;
} depth_ref_t;

static int deeper_first(const void *a, const void *b)
{
    const depth_ref_t *x = a, *y = b;
    return x->depth != y->depth ? (x->depth > y->depth ? -1 : 1)
                                : (x->rec < y->rec ? -1 : x->rec > y->rec);
}

/* Puts records at the LRU's hot end, deepest first, so that of every chain
 * in the batch the root ends up most recent. Without memory for sorting
 * they go in the order given. */
static void lru_push_batch(kvd_store_t *s, const uint32_t *recs, size_t n)
{
    depth_ref_t *refs = n > 1 ? kvd_mem_calloc(KVD_MEM_STAGING, n, sizeof(*refs)) : NULL;
    if (refs == NULL) {
        for (size_t k = n; k-- > 0;)
            lru_push_head(s, recs[k]);
        return;
    }
    for (size_t k = 0; k < n; k++)
        refs[k] = (depth_ref_t){R(s, recs[k])->depth, recs[k]};
    qsort(refs, n, sizeof(*refs), deeper_first);
    for (size_t k = 0; k < n; k++)
        lru_push_head(s, refs[k].rec);
    kvd_mem_free(KVD_MEM_STAGING, refs, n * sizeof(*refs));
}

/*
 * Takes a reservation whose writer died or outlived its lease out of sight
 * (the key can be reserved again at once) but keeps its extent: held for
 * its writer (slot + 1; "held extents") when one is known, else for one
 * more lease TTL: a writer still copying into it then writes into nothing
 * live.
 */
static void quarantine(kvd_store_t *s, uint32_t i, uint32_t writer)
{
    rec_t *r = R(s, i);
    uint32_t slot = r->ns;
    s->ns[slot].info.objects_writing--;
    index_remove(s, i);
    r->quarantined = 1;
    /* the namespace may go (and its slot serve another tenant) before the
     * grace ends: the extent keeps whose bytes it holds itself */
    r->hits = (uint16_t)(tenant_of(s, slot) + 1);
    if (writer != 0) {
        r->last_access_s = 0;
        writer_hold(s, writer, i);
    } else {
        uint64_t release_ms = s->now_ms + s->cfg.lease_ttl_ms;
        r->last_access_s = (uint32_t)KVD_MIN(release_ms / 1000 + 1, (uint64_t)UINT32_MAX);
        r->link_prev = NIL;
        r->link_next = NIL;
        if (s->quarantine_tail != NIL)
            R(s, s->quarantine_tail)->link_next = i;
        else
            s->quarantine_head = i;
        s->quarantine_tail = i;
        s->quarantine_pages += r->size_pages;
    }
    /* before the namespace's removal is written; the writer, if any, the
     * journal has from the reservation's entry */
    persist_quarantined(s, i);
    ns_maybe_remove(s, slot);
}

/* Frees quarantined extents whose grace has passed by now_ms. */
static void quarantine_release(kvd_store_t *s, uint64_t now_ms)
{
    while (s->quarantine_head != NIL) {
        uint32_t i = s->quarantine_head;
        rec_t *r = R(s, i);
        if ((uint64_t)r->last_access_s * 1000 > now_ms)
            break;
        s->quarantine_head = r->link_next;
        if (s->quarantine_head == NIL)
            s->quarantine_tail = NIL;
        quarantine_free(s, i);
    }
}

/* Undoes what a lease still holds and frees it: reservations go to
 * quarantine (an explicit Revoke frees at once instead), pins are dropped,
 * and pages no longer pinned become evictable again. */
static void lease_end(kvd_store_t *s, lease_t *l)
{
    size_t n_free = 0;
    for (uint32_t k = 0; k < l->n; k++) {
        uint32_t i = l->recs[k];
        if (i == NIL)
            continue;
        if (l->write) {
            quarantine(s, i, l->writer);
            continue;
        }
        rec_t *r = R(s, i);
        s->pins--;
        s->tenants[l->tenant].use.pins--;
        if (--r->pins == 0) {
            s->ns[r->ns].info.objects_pinned--;
            if (r->spare & REC_F_SPILLING)
                continue; /* its spill's end decides */
            if (r->spare & REC_F_LOST)
                drop_object(s, i); /* off the LRU while pinned */
            else
                l->recs[n_free++] = i; /* reuse the array: k >= n_free */
        }
    }
    if (!l->write)
        lru_push_batch(s, l->recs, n_free);
    lease_unlink(s, l);
}

static int lease_get(kvd_store_t *s, uint64_t owner, uint64_t id, bool write,
                     lease_t **out)
{
    lease_t *l = lease_find(s, id);
    if (l == NULL)
        return KVD_ERR_NOT_FOUND;
    if (l->owner != owner)
        return KVD_ERR_NOT_FOUND; /* as a dead one: ids of others tell nothing */
    if (l->write != write)
        return KVD_ERR_STATE;
    *out = l;
    return KVD_OK;
}

size_t kvd_store_owner_gone(kvd_store_t *s, uint64_t owner)
{
    size_t n = 0;
    for (lease_t *l = s->oldest, *next; l != NULL; l = next) {
        next = l->newer;
        if (l->owner == owner) {
            lease_end(s, l);
            n++;
        }
    }
    if (owner != KVD_OWNER_PERMANENT)
        ns_owner_gone(s, owner);
    persist_commit(s);
    PARANOID(s, "owner_gone");
    return n;
}

/* Callers pass a monotonic clock; the store keeps the latest it saw. */
static void clock_seen(kvd_store_t *s, uint64_t now_ms)
{
    if (now_ms > s->now_ms)
        s->now_ms = now_ms;
}

size_t kvd_store_expire(kvd_store_t *s, uint64_t now_ms)
{
    clock_seen(s, now_ms);
    size_t n = 0;
    while (s->oldest != NULL && s->oldest->expires_ms <= now_ms) {
        lease_end(s, s->oldest);
        n++;
    }
    s->st.leases_expired += n;
    quarantine_release(s, now_ms);
    writers_sweep(s, now_ms);
    persist_commit(s);
    persist_tick(s);
    PARANOID(s, "expire");
    return n;
}

/* ------------------------------------------------------------ reserve */

static void fill_loc(const kvd_store_t *s, uint32_t i, kvd_loc_t *loc)
{
    const rec_t *r = R(s, i);
    loc->offset = page_bytes_of(s, r->off_pages);
    loc->size = s->ns[r->ns].info.object_bytes;
}

/* Whether `pages` more fit tenant t's max_bytes, evicting its own cold
 * objects (within the budget of one allocation) until they do. *stuck is
 * set once its eviction found nothing, so that the rest of the batch does
 * not scan again. */
static bool tenant_room(kvd_store_t *s, uint32_t t, uint32_t pages, bool *stuck)
{
    tenant_t *tn = &s->tenants[t];
    uint64_t max = tn->lim.max_bytes, need = page_bytes_of(s, pages);
    if (max == 0 || tn->use.bytes + need <= max)
        return true;
    /* even evicting every evictable object of it would not do */
    if (*stuck || need > max ||
        tn->use.bytes - page_bytes_of(s, tn->lru_pages) + need > max)
        return false;
    for (uint64_t budget = evict_budget(pages); tn->use.bytes + need > max; budget--) {
        if (budget == 0)
            return false;
        if (!evict_pick(s, t)) {
            *stuck = true;
            return false;
        }
    }
    return true;
}

static uint64_t scrub_budget(const kvd_store_t *s)
{
    return s->cfg.scrub_budget_bytes ? s->cfg.scrub_budget_bytes : 16ull << 20;
}

/* Reserves one key into lease *l (created on first need). */
static uint8_t reserve_one(kvd_store_t *s, uint64_t owner, uint32_t writer, uint32_t ns,
                           const kvd_put_t *it, uint64_t now_ms, lease_t **l,
                           kvd_loc_t *loc, bool *stuck, uint64_t *scrubbed)
{
    uint32_t found = index_find(s, ns, it->key);
    if (found != NIL)
        return R(s, found)->state == REC_READY ? KVD_RESERVE_EXISTS
                                               : KVD_RESERVE_IN_FLIGHT;
    uint32_t t = tenant_of(s, ns);
    uint32_t pages = s->ns[ns].pages;
    if (*l == NULL && !lease_quota_ok(s, t)) {
        s->st.reserve_quota++;
        return KVD_RESERVE_NO_SPACE;
    }
    if (!tenant_room(s, t, pages, stuck)) {
        s->tenants[t].use.quota_refusals++;
        s->st.reserve_quota++;
        return KVD_RESERVE_NO_SPACE;
    }
    if (*l == NULL) {
        if ((*l = lease_new(s, owner, true, now_ms, t)) == NULL)
            return KVD_RESERVE_NO_SPACE; /* no memory for a lease: no room either */
        (*l)->ns = ns;
        if (writer != 0) {
            (*l)->writer = writer;
            s->writers[writer - 1].leases++;
        }
    }
    uint32_t i = alloc_evicting(s, pages);
    if (i == NIL)
        return KVD_RESERVE_NO_SPACE;
    uint16_t tag = R(s, i)->ns; /* whose bytes the extent held */
    bool dirty = tag != SCRUB_CLEAN && tag != t + 1;
    /* the whole extent: its pages past object_bytes held the other
     * tenant's bytes too, and a later object of more bytes will use them */
    uint64_t size = page_bytes_of(s, pages);
    if (dirty && *scrubbed > 0 && *scrubbed + size > scrub_budget(s)) {
        /* the loop has zeroed enough for one call: later */
        extent_free(s, i, tag);
        return KVD_RESERVE_NO_SPACE;
    }
    if (lease_add(s, *l, i) != KVD_OK) {
        extent_free(s, i, tag);
        return KVD_RESERVE_NO_SPACE;
    }
    rec_t *r = R(s, i);
    /* the hold's place, for finding it from the key in O(1) */
    r->link_prev = (*l)->n - 1;
    r->link_next = (uint32_t)(*l)->id;
    memcpy(r->key, it->key, KVD_KEY_BYTES);
    r->has_parent = it->parent != NULL;
    if (it->parent)
        kvd_store_key_tag(s, it->parent, r->parent_tag);
    r->depth = KVD_MIN(it->depth, REC_DEPTH_MAX);
    r->ns = (uint16_t)ns;
    r->state = REC_WRITING;
    index_insert(s, i);
    s->ns[ns].info.objects_writing++;
    s->tenants[t].use.bytes += page_bytes_of(s, pages);
    persist_writing(s, i, writer != 0 ? &s->writers[writer - 1].id : NULL);
    fill_loc(s, i, loc);
    if (dirty) {
        /* another tenant's bytes: a Publish of what was never written must
         * not show them. The extent may have held an object evicted in
         * this call: its eviction is written before its bytes go, or a
         * restart would find it there, zeroed. */
        persist_commit(s);
        if (s->scrub != NULL)
            s->scrub(s->scrub_arg, loc->offset, size);
        s->st.scrubbed_bytes += size;
        *scrubbed += size;
    }
    return KVD_RESERVE_ALLOCATED;
}

int kvd_store_reserve(kvd_store_t *s, uint64_t owner, uint32_t ns, const kvd_put_t *items,
                      size_t n, uint64_t now_ms, uint64_t *lease_id, uint8_t *results,
                      kvd_loc_t *locs)
{
    return kvd_store_reserve_by(s, owner, NULL, ns, items, n, now_ms, lease_id, results,
                                locs);
}

int kvd_store_reserve_by(kvd_store_t *s, uint64_t owner, const kvd_writer_t *writer,
                         uint32_t ns, const kvd_put_t *items, size_t n, uint64_t now_ms,
                         uint64_t *lease_id, uint8_t *results, kvd_loc_t *locs)
{
    uint32_t id = ns;
    if (!ns_slot(s, id, &ns))
        return KVD_ERR_NOT_FOUND;
    clock_seen(s, now_ms);
    /* the slot is taken for the call (a lease counts on it below); a call
     * that allocates nothing gives it back at its end */
    uint32_t w = writer != NULL && writer->pid != 0 ? store_writer_get(s, writer) : 0;
    lease_t *l = NULL;
    bool stuck = false;
    uint64_t scrubbed = 0;
    /* eviction for room may take the namespace's last object: a user for
     * the call's length keeps it from being removed under the batch */
    s->ns[ns].info.users++;
    for (size_t k = 0; k < n; k++) {
        results[k] = reserve_one(s, owner, w, ns, &items[k], now_ms, &l, &locs[k], &stuck,
                                 &scrubbed);
        uint64_t *c[] = {&s->st.reserve_allocated, &s->st.reserve_exists,
                         &s->st.reserve_in_flight, &s->st.reserve_no_space};
        (*c[results[k]])++;
    }
    s->ns[ns].info.users--;
    if (l != NULL && l->n == 0) {
        lease_unlink(s, l);
        l = NULL;
    }
    *lease_id = l ? l->id : 0;
    if (w != 0)
        writer_maybe_free(s, &s->writers[w - 1]);
    evict_watermarks(s);
    ns_maybe_remove(s, ns);
    /* before the reply hands out any extent freed here (an eviction), the
     * journal says it is free */
    persist_commit(s);
    PARANOID(s, "reserve");
    return KVD_OK;
}

/* Index in l->recs of the live hold with this key, or -1: the record's
 * own note of its hold (link_prev, link_next), checked against the lease. */
static long lease_hold_of(const kvd_store_t *s, const lease_t *l, const uint8_t *key)
{
    uint32_t i = index_find(s, l->ns, key);
    if (i == NIL)
        return -1;
    const rec_t *r = R(s, i);
    if (r->state != REC_WRITING || r->link_next != (uint32_t)l->id ||
        r->link_prev >= l->n || l->recs[r->link_prev] != i)
        return -1;
    return (long)r->link_prev;
}

/* Publishes (publish = true) or revokes the lease's reservations: all, or
 * the given keys after checking that each is one of them. */
static int finish_writes(kvd_store_t *s, uint64_t owner, uint64_t lease_id,
                         const uint8_t (*keys)[KVD_KEY_BYTES], size_t n, bool publish)
{
    lease_t *l;
    int rc = lease_get(s, owner, lease_id, true, &l);
    if (rc != KVD_OK)
        return rc;
    if (keys != NULL) {
        /* validate every key before changing anything: atomic per batch */
        for (size_t k = 0; k < n; k++)
            if (lease_hold_of(s, l, keys[k]) < 0)
                return KVD_ERR_STATE;
    }
    size_t total = keys ? n : l->n;
    size_t cap = total ? total : 1;
    /* the records, and where each was in the lease (to put it back) */
    uint32_t *done = kvd_mem_calloc(KVD_MEM_STAGING, cap, 2 * sizeof(uint32_t));
    if (done == NULL)
        return KVD_ERR_NOMEM;
    uint32_t *held_at = done + cap;
    size_t n_done = 0;
    uint32_t now = now_s(s);
    for (size_t t = 0; t < total; t++) {
        long k = keys ? lease_hold_of(s, l, keys[t]) : (long)t;
        if (k < 0 || l->recs[k] == NIL)
            continue; /* a key named twice */
        held_at[n_done] = (uint32_t)k;
        done[n_done++] = l->recs[k];
        l->recs[k] = NIL;
    }
    if (!publish) {
        for (size_t k = 0; k < n_done; k++)
            drop_object(s, done[k]);
        n_done = 0;
        persist_commit(s);
    } else if (persist_published(s, done, n_done, now) != KVD_OK) {
        /* not written, so not acknowledged: nothing changes, the writer
         * may try again or revoke */
        for (size_t k = 0; k < n_done; k++)
            l->recs[held_at[k]] = done[k];
        kvd_mem_free(KVD_MEM_STAGING, done, cap * 2 * sizeof(uint32_t));
        return KVD_ERR_IO;
    }
    if (publish) {
        /* what lost its bytes while being written is not published: its
         * journaled publish is followed by its free (after the journal
         * took the batch, so that a failed one can be retried whole) */
        size_t kept = 0;
        for (size_t k = 0; k < n_done; k++) {
            if (R(s, done[k])->spare & REC_F_LOST) {
                drop_object(s, done[k]);
                continue;
            }
            done[kept++] = done[k];
        }
        if (kept != n_done)
            persist_commit(s);
        n_done = kept;
    }
    for (size_t k = 0; k < n_done; k++) {
        rec_t *r = R(s, done[k]);
        r->state = REC_READY;
        r->last_access_s = now;
        s->st.published_bytes += s->ns[r->ns].info.object_bytes;
        s->ns[r->ns].info.published_bytes += s->ns[r->ns].info.object_bytes;
        s->ns[r->ns].info.objects_writing--;
        s->ns[r->ns].info.objects_ready++;
        if (s->presence != NULL)
            s->presence(s->presence_arg, ns_id_of(s, r->ns), r->key, true);
    }
    /* children are counted once every page of the batch is READY, so a
     * chain published in one batch counts its own links too */
    for (size_t k = 0; k < n_done; k++)
        count_child(s, done[k], +1);
    lru_push_batch(s, done, n_done);
    kvd_mem_free(KVD_MEM_STAGING, done, cap * 2 * sizeof(uint32_t));
    bool empty = true;
    for (uint32_t k = 0; k < l->n && empty; k++)
        empty = l->recs[k] == NIL;
    if (empty)
        lease_unlink(s, l);
    PARANOID(s, publish ? "publish" : "revoke");
    return KVD_OK;
}

int kvd_store_publish(kvd_store_t *s, uint64_t owner, uint64_t lease_id,
                      const uint8_t (*keys)[KVD_KEY_BYTES], size_t n)
{
    return finish_writes(s, owner, lease_id, keys, n, true);
}

int kvd_store_revoke(kvd_store_t *s, uint64_t owner, uint64_t lease_id,
                     const uint8_t (*keys)[KVD_KEY_BYTES], size_t n)
{
    return finish_writes(s, owner, lease_id, keys, n, false);
}

/* ------------------------------------------------------------- acquire */

/* An Acquire naming keys on the SSD tier (the first at index `first`):
 * begins the promotion of each (at most ACQUIRE_PROMOTE_MAX per call) and
 * answers KVD_INPROGRESS, naming the first; KVD_ERR_NO_SPACE naming a key
 * that has no room in DRAM. Nothing is pinned: the caller asks again. */
#define ACQUIRE_PROMOTE_MAX 4096
static int acquire_promote(kvd_store_t *s, uint32_t ns,
                           const uint8_t (*keys)[KVD_KEY_BYTES], size_t n, size_t first,
                           size_t *first_bad)
{
    int rc = KVD_INPROGRESS;
    *first_bad = first;
    for (size_t k = first, begun = 0; k < n && begun < ACQUIRE_PROMOTE_MAX; k++) {
        uint32_t i = index_find(s, ns, keys[k]);
        if (i == NIL || R(s, i)->tier != KVD_TIER_SSD)
            continue;
        begun++;
        int one = promote_begin(s, i);
        if (one == KVD_ERR_NO_SPACE) {
            *first_bad = k;
            rc = one;
            s->st.acquire_failures++;
            s->ns[ns].info.acquire_failures++;
            break;
        }
        if (one == KVD_ERR_BUSY)
            break; /* the tier's queue is full: the next ask goes on */
    }
    persist_commit(s);
    PARANOID(s, "acquire_promote");
    return rc;
}

int kvd_store_acquire(kvd_store_t *s, uint64_t owner, uint32_t ns,
                      const uint8_t (*keys)[KVD_KEY_BYTES], size_t n, uint64_t now_ms,
                      uint64_t *lease_id, kvd_loc_t *locs, size_t *first_bad)
{
    uint32_t id = ns;
    if (!ns_slot(s, id, &ns))
        return KVD_ERR_NOT_FOUND;
    clock_seen(s, now_ms);
    if (n == 0) {
        *lease_id = 0; /* nothing to hold: no lease */
        return KVD_OK;
    }
    /* check everything first, all or nothing; the records found wait in
     * locs[].offset for the second pass */
    size_t on_ssd = SIZE_MAX;
    for (size_t k = 0; k < n; k++) {
        uint32_t i = index_find(s, ns, keys[k]);
        int rc = i == NIL || (R(s, i)->spare & REC_F_LOST) ? KVD_ERR_NOT_FOUND
                 : R(s, i)->state != REC_READY             ? KVD_ERR_BUSY
                 : R(s, i)->tier == KVD_TIER_SSD           ? KVD_INPROGRESS
                 : R(s, i)->pins == UINT16_MAX ? KVD_ERR_NO_SPACE /* pins saturated */
                                               : KVD_OK;
        if (rc == KVD_INPROGRESS) {
            on_ssd = KVD_MIN(on_ssd, k);
            continue;
        }
        if (rc != KVD_OK) {
            *first_bad = k;
            s->st.acquire_failures++;
            s->ns[ns].info.acquire_failures++;
            return rc;
        }
        locs[k].offset = i;
    }
    if (on_ssd != SIZE_MAX)
        return acquire_promote(s, ns, keys, n, on_ssd, first_bad);
    uint32_t t = tenant_of(s, ns);
    tenant_t *tn = &s->tenants[t];
    if ((tn->lim.max_pins != 0 && tn->use.pins + n > tn->lim.max_pins) ||
        !lease_quota_ok(s, t)) {
        if (tn->lim.max_pins != 0 && tn->use.pins + n > tn->lim.max_pins)
            tn->use.quota_refusals++;
        *first_bad = 0;
        s->st.acquire_failures++;
        s->ns[ns].info.acquire_failures++;
        return KVD_ERR_QUOTA;
    }
    lease_t *l = lease_new(s, owner, false, now_ms, t);
    if (l == NULL || lease_reserve(s, l, n) != KVD_OK) {
        if (l != NULL)
            lease_unlink(s, l);
        *first_bad = 0;
        s->st.acquire_failures++;
        return KVD_ERR_NOMEM;
    }
    uint32_t now = now_s(s);
    for (size_t k = 0; k < n; k++) {
        uint32_t i = (uint32_t)locs[k].offset;
        rec_t *r = R(s, i);
        if (r->pins == UINT16_MAX) {
            /* only a batch naming one key ~65535 times gets here */
            lease_end(s, l);
            *first_bad = k;
            s->st.acquire_failures++;
            return KVD_ERR_NO_SPACE;
        }
        lease_add(s, l, i); /* cannot fail: room was reserved */
        s->pins++;
        tn->use.pins++;
        if (r->pins++ == 0) {
            if (!(r->spare & REC_F_SPILLING)) /* a spilling one is off the LRU */
                lru_remove(s, i);
            s->ns[ns].info.objects_pinned++;
        }
        if (r->hits < UINT16_MAX)
            r->hits++;
        r->last_access_s = now;
        fill_loc(s, i, &locs[k]);
    }
    s->st.acquires++;
    s->st.acquired_bytes += (uint64_t)n * s->ns[ns].info.object_bytes;
    s->ns[ns].info.acquired_bytes += (uint64_t)n * s->ns[ns].info.object_bytes;
    *lease_id = l->id;
    PARANOID(s, "acquire");
    return KVD_OK;
}

int kvd_store_release(kvd_store_t *s, uint64_t owner, uint64_t lease_id)
{
    lease_t *l;
    int rc = lease_get(s, owner, lease_id, false, &l);
    if (rc != KVD_OK)
        return rc;
    lease_end(s, l);
    PARANOID(s, "release");
    return KVD_OK;
}

/* -------------------------------------------------------------- lookup */

/* Whether boundary b is restorable for a pool, given run_end[k] = the length
 * of the run of present pages ending at page k. */
static bool restorable(const uint32_t *run_end, size_t b, uint32_t trailing)
{
    uint32_t need = trailing == 0 ? (uint32_t)b : KVD_MIN(trailing, (uint32_t)b);
    return run_end[b - 1] >= need;
}

int kvd_store_lookup(kvd_store_t *s, const kvd_lookup_pool_t *pools, size_t n_pools,
                     uint32_t *boundaries, size_t *n_boundaries)
{
    return kvd_store_lookup_tiers(s, pools, n_pools, boundaries, NULL, n_boundaries);
}

/* Whether boundary b of a pool needs a page on the SSD tier, given
 * ssd_before[k] = the pool's SSD pages among pages 0..k-1. */
static bool needs_ssd(const uint32_t *ssd_before, size_t b, uint32_t trailing)
{
    size_t from = trailing == 0 || trailing >= b ? 0 : b - trailing;
    return ssd_before[b] > ssd_before[from];
}

static int lookup(kvd_store_t *s, const kvd_lookup_pool_t *pools, size_t n_pools,
                  uint32_t *boundaries, uint8_t *tiers, size_t *n_boundaries, bool count)
{
    if (n_pools == 0)
        return KVD_ERR_INVALID;
    size_t n = SIZE_MAX;
    for (size_t p = 0; p < n_pools; p++) {
        uint32_t slot;
        if (!ns_slot(s, pools[p].ns, &slot))
            return KVD_ERR_NOT_FOUND;
        n = KVD_MIN(n, pools[p].n_keys);
    }
    s->st.lookups += count;
    /* ok[b-1]: boundary b restorable for every pool so far */
    /* ok[b-1]: bit 0 restorable so far, bit 1 needs the SSD tier, bit 2
     * another daemon; run, ssd_before and remote_before share one
     * allocation */
    size_t cells = n ? n : 1;
    uint8_t *ok = kvd_mem_calloc(KVD_MEM_STAGING, cells, 1);
    uint32_t *run = kvd_mem_calloc(KVD_MEM_STAGING, 3 * cells + 2, sizeof(uint32_t));
    if (ok == NULL || run == NULL) {
        kvd_mem_free(KVD_MEM_STAGING, ok, cells);
        kvd_mem_free(KVD_MEM_STAGING, run, (3 * cells + 2) * sizeof(uint32_t));
        return KVD_ERR_NOMEM;
    }
    uint32_t *ssd_before = run + cells;
    uint32_t *remote_before = ssd_before + cells + 1;
    memset(ok, 1, n);
    for (size_t p = 0; p < n_pools; p++) {
        uint32_t slot = 0;
        ns_slot(s, pools[p].ns, &slot); /* checked above */
        ns_entry_t *e = &s->ns[slot];
        uint32_t len = 0;
        for (size_t k = 0; k < n; k++) {
            uint32_t i = index_find(s, slot, pools[p].keys[k]);
            bool present =
                i != NIL && R(s, i)->state == REC_READY && !(R(s, i)->spare & REC_F_LOST);
            bool remote = !present && pools[p].remote != NULL && pools[p].remote[k];
            len = present || remote ? len + 1 : 0;
            run[k] = len;
            ssd_before[k + 1] =
                ssd_before[k] + (present && R(s, i)->tier == KVD_TIER_SSD);
            remote_before[k + 1] = remote_before[k] + remote;
            if (!count)
                continue;
            e->info.lookup_pages++;
            e->info.hit_pages += present;
            s->st.lookup_pages++;
            s->st.hit_pages += present;
        }
        for (size_t b = 1; b <= n; b++) {
            uint32_t trailing = pools[p].trailing_pages;
            ok[b - 1] &= restorable(run, b, trailing) | 6;
            ok[b - 1] |= needs_ssd(ssd_before, b, trailing) ? 2 : 0;
            ok[b - 1] |= needs_ssd(remote_before, b, trailing) ? 4 : 0;
        }
    }
    size_t m = 0;
    for (size_t b = 1; b <= n; b++) {
        if (!(ok[b - 1] & 1))
            continue;
        if (tiers)
            tiers[m] = ok[b - 1] & 4   ? KVD_TIER_REMOTE
                       : ok[b - 1] & 2 ? KVD_TIER_SSD
                                       : KVD_TIER_DRAM;
        boundaries[m++] = (uint32_t)b;
    }
    *n_boundaries = m;
    kvd_mem_free(KVD_MEM_STAGING, ok, cells);
    kvd_mem_free(KVD_MEM_STAGING, run, (3 * cells + 2) * sizeof(uint32_t));
    return KVD_OK;
}

int kvd_store_lookup_tiers(kvd_store_t *s, const kvd_lookup_pool_t *pools, size_t n_pools,
                           uint32_t *boundaries, uint8_t *tiers, size_t *n_boundaries)
{
    return lookup(s, pools, n_pools, boundaries, tiers, n_boundaries, true);
}

int kvd_store_lookup_remote(kvd_store_t *s, const kvd_lookup_pool_t *pools,
                            size_t n_pools, uint32_t *boundaries, uint8_t *tiers,
                            size_t *n_boundaries)
{
    return lookup(s, pools, n_pools, boundaries, tiers, n_boundaries, false);
}

/* ---------------------------------------------------------- inspection */

static void info_of(const kvd_store_t *s, uint32_t i, kvd_obj_info_t *out)
{
    const rec_t *r = R(s, i);
    memset(out, 0, sizeof(*out));
    memcpy(out->key, r->key, KVD_KEY_BYTES);
    memcpy(out->parent_tag, r->parent_tag, KVD_KEY_TAG_BYTES);
    out->has_parent = r->has_parent;
    out->ns = ns_id_of(s, r->ns);
    out->depth = r->depth;
    out->state = (kvd_obj_state_t)r->state;
    out->tier = (kvd_tier_t)r->tier;
    out->pins = r->pins;
    out->hits = r->hits;
    out->children = r->children;
    out->last_access_ms =
        r->last_access_s ? s->epoch_ms + (uint64_t)(r->last_access_s - 1) * 1000 : 0;
    if (r->tier == KVD_TIER_SSD)
        out->loc =
            (kvd_loc_t){.offset = UINT64_MAX, .size = s->ns[r->ns].info.object_bytes};
    else
        fill_loc(s, i, &out->loc);
}

int kvd_store_tier_place(const kvd_store_t *s, uint32_t ns,
                         const uint8_t key[KVD_KEY_BYTES], uint32_t *seg, uint32_t *block)
{
    uint32_t i;
    if (s->tier == NULL || !ns_slot(s, ns, &ns) || (i = index_find(s, ns, key)) == NIL ||
        R(s, i)->tier != KVD_TIER_SSD)
        return KVD_ERR_NOT_FOUND;
    uint32_t seg_blocks = tier_seg_blocks(s);
    *seg = R(s, i)->off_pages / seg_blocks;
    *block = R(s, i)->off_pages % seg_blocks;
    return KVD_OK;
}

int kvd_store_inspect(const kvd_store_t *s, uint32_t ns, const uint8_t key[KVD_KEY_BYTES],
                      kvd_obj_info_t *out)
{
    if (!ns_slot(s, ns, &ns))
        return KVD_ERR_NOT_FOUND;
    uint32_t i = index_find(s, ns, key);
    if (i == NIL)
        return KVD_ERR_NOT_FOUND;
    info_of(s, i, out);
    return KVD_OK;
}

int kvd_store_find_tag(const kvd_store_t *s, uint32_t ns,
                       const uint8_t tag[KVD_KEY_TAG_BYTES], kvd_obj_info_t *out)
{
    if (!ns_slot(s, ns, &ns))
        return KVD_ERR_NOT_FOUND;
    uint32_t i = index_find_tag(s, ns, tag);
    if (i == NIL)
        return KVD_ERR_NOT_FOUND;
    info_of(s, i, out);
    return KVD_OK;
}

void kvd_store_key_tag(const kvd_store_t *s, const uint8_t key[KVD_KEY_BYTES],
                       uint8_t tag[KVD_KEY_TAG_BYTES])
{
    uint64_t t = key_tag(s, key);
    memcpy(tag, &t, sizeof(t));
}

int kvd_store_foreach(const kvd_store_t *s, uint32_t ns, kvd_obj_fn fn, void *arg)
{
    if (ns != UINT32_MAX && !ns_slot(s, ns, &ns))
        return 0; /* a namespace that is not there has no objects */
    kvd_obj_info_t info;
    for (uint32_t i = s->phys_head; i != NIL; i = R(s, i)->phys_next) {
        const rec_t *r = R(s, i);
        if ((r->state != REC_READY && r->state != REC_WRITING) || r->quarantined ||
            (r->spare & REC_F_PROMOTING) || (ns != UINT32_MAX && r->ns != ns))
            continue;
        info_of(s, i, &info);
        int rc = fn(&info, arg);
        if (rc != 0)
            return rc;
    }
    /* then the tier's, the SSD LRU's and those being promoted */
    for (uint32_t i = 1; s->ssd_objects > 0 && i <= s->rec_high; i++) {
        const rec_t *r = R(s, i);
        if (r->state != REC_READY || r->tier != KVD_TIER_SSD ||
            (ns != UINT32_MAX && r->ns != ns))
            continue;
        info_of(s, i, &info);
        int rc = fn(&info, arg);
        if (rc != 0)
            return rc;
    }
    return 0;
}

/* Evicts READY, unpinned object i (off its LRU, DRAM's or the tier's). */
static void evict_rec(kvd_store_t *s, uint32_t i)
{
    rec_t *r = R(s, i);
    s->ns[r->ns].info.evictions++;
    if (r->tier == KVD_TIER_SSD) {
        s->st.ssd_evictions++;
        ssd_lru_remove(s, i);
        drop_ssd(s, i);
        return;
    }
    s->st.evictions++;
    s->st.evicted_bytes += page_bytes_of(s, r->size_pages);
    lru_remove(s, i);
    drop_object(s, i);
}

/* Ends an operator's eviction: written to the journal; when it took
 * objects of the SSD tier, the tier's checkpoint begins at once, since only
 * a checkpoint makes a drop from the tier last across a crash (its records
 * are still in their segments). */
static void evict_done(kvd_store_t *s, uint64_t ssd_evictions_before)
{
    persist_commit(s);
    if (s->tier != NULL && s->st.ssd_evictions != ssd_evictions_before)
        tier_checkpoint_soon(s);
}

/* Whether record r (an extent) lies across pages [first, last]. */
static bool rec_overlaps(const rec_t *r, uint64_t first, uint64_t last)
{
    return r->off_pages <= last && (uint64_t)r->off_pages + r->size_pages > first;
}

/* Whether record r is an object (or a promotion's extent) of the pool that
 * lost bytes would touch: not free, not a dead writer's quarantined
 * extent, not marked already. */
static bool rec_losable(const rec_t *r)
{
    return (r->state == REC_READY || r->state == REC_WRITING) && !r->quarantined &&
           !(r->spare & REC_F_LOST);
}

uint64_t kvd_store_pool_lost(kvd_store_t *s, uint64_t offset, uint64_t bytes)
{
    kvd_pool_range_t r = {offset, bytes};
    return kvd_store_pool_lost_ranges(s, &r, 1);
}

/* From range *k on, the first with pages in the pool (of end bytes): its
 * pages [*first, *last] and true; false when none is left. */
static bool next_range(const kvd_store_t *s, uint64_t end, const kvd_pool_range_t *ranges,
                       size_t n, size_t *k, uint64_t *first, uint64_t *last)
{
    for (; *k < n; (*k)++) {
        const kvd_pool_range_t *rg = &ranges[*k];
        if (rg->bytes == 0 || rg->offset >= end)
            continue;
        *first = rg->offset / s->cfg.page_bytes;
        /* bytes may reach past the end (or past 2^64): cut at the end */
        uint64_t stop = rg->bytes > end - rg->offset ? end : rg->offset + rg->bytes;
        *last = (stop - 1) / s->cfg.page_bytes;
        return true;
    }
    return false;
}

uint64_t kvd_store_pool_lost_ranges(kvd_store_t *s, const kvd_pool_range_t *ranges,
                                    size_t n)
{
    uint64_t lost = 0, first = 0, last = 0, end = page_bytes_of(s, s->total_pages);
    size_t counted = 0, k = 0;
    for (size_t j = 0; j < n; j++)
        counted += ranges[j].bytes != 0 && ranges[j].offset < end;
    if (counted == 0)
        return 0;
    bool more = next_range(s, end, ranges, n, &k, &first, &last);
    /* one walk in offset order: the records and the ranges both ascend */
    for (uint32_t i = s->phys_head, next; i != NIL && more; i = next) {
        rec_t *r = R(s, i);
        /* a range that ends before this record cannot touch a later one */
        while (more && last < r->off_pages) {
            k++;
            more = next_range(s, end, ranges, n, &k, &first, &last);
        }
        if (!more)
            break;
        /* dropping i merges the free extents around it (recycling their
         * records), never an object's: the walk goes on from the next
         * record that is not free */
        next = r->phys_next;
        while (next != NIL && R(s, next)->state == REC_FREE)
            next = R(s, next)->phys_next;
        if (!rec_overlaps(r, first, last) || !rec_losable(r))
            continue;
        lost++;
        if (r->state == REC_READY && r->pins == 0 && !(r->spare & REC_F_SPILLING)) {
            lru_remove(s, i);
            drop_object(s, i);
        } else {
            r->spare |= REC_F_LOST;
            /* gone for a restart now, not at its drop: a crash while it is
             * pinned or spilled must not bring back what was lost (the
             * drop journals its free again; snapshots leave it out) */
            if (r->state == REC_READY)
                persist_freed(s, i);
            if (r->spare & REC_F_SPILLING)
                tier_spill_lost(s, i);
        }
    }
    s->st.pool_lost_ranges += counted;
    s->st.pool_lost_objects += lost;
    persist_commit(s);
    PARANOID(s, "pool_lost");
    return lost;
}

int kvd_store_evict_key(kvd_store_t *s, uint32_t ns, const uint8_t key[KVD_KEY_BYTES])
{
    if (!ns_slot(s, ns, &ns))
        return KVD_ERR_NOT_FOUND;
    uint32_t i = index_find(s, ns, key);
    if (i == NIL)
        return KVD_ERR_NOT_FOUND;
    rec_t *r = R(s, i);
    if (r->state != REC_READY || r->pins > 0 ||
        (r->spare & (REC_F_SPILLING | REC_F_PROMOTING)))
        return KVD_ERR_BUSY;
    uint64_t before = s->st.ssd_evictions;
    evict_rec(s, i);
    evict_done(s, before);
    PARANOID(s, "evict_key");
    return KVD_OK;
}

/* Evicts the objects of a list (the DRAM LRU or the SSD tier's) from
 * `head` on that are of slot ns, of tenant, or of any (UINT32_MAX);
 * returns how many. */
static uint64_t evict_list(kvd_store_t *s, uint32_t head, uint32_t ns, uint32_t tenant)
{
    uint64_t e = 0;
    for (uint32_t i = head, next; i != NIL; i = next) {
        next = R(s, i)->link_next;
        uint32_t slot = R(s, i)->ns;
        if ((ns == UINT32_MAX || slot == ns) &&
            (tenant == UINT32_MAX || tenant_of(s, slot) == tenant)) {
            evict_rec(s, i);
            e++;
        }
    }
    return e;
}

/* Evicts what is evictable of one slot (ns), one tenant, or all (both
 * UINT32_MAX); counts what went and what had to stay. */
static void evict_where(kvd_store_t *s, uint32_t ns, uint32_t tenant, uint64_t *evicted,
                        uint64_t *skipped)
{
    uint64_t e = 0, k = 0, before = s->st.ssd_evictions;
    /* what stays is counted first: an evicted namespace's last object may
     * remove it */
    for (uint32_t n = 0; n < s->n_slots; n++)
        if (s->ns[n].live && (ns == UINT32_MAX || n == ns) &&
            (tenant == UINT32_MAX || s->ns[n].info.tenant == tenant))
            k += s->ns[n].info.objects_writing + s->ns[n].info.objects_pinned;
    e += evict_list(s, s->lru_head, ns, tenant);
    e += evict_list(s, s->ssd_lru_head, ns, tenant);
    *evicted = e;
    *skipped = k;
    evict_done(s, before);
    PARANOID(s, "evict");
}

int kvd_store_evict_ns(kvd_store_t *s, uint32_t ns, uint64_t *evicted, uint64_t *skipped)
{
    if (ns != UINT32_MAX && !ns_slot(s, ns, &ns))
        return KVD_ERR_NOT_FOUND;
    evict_where(s, ns, UINT32_MAX, evicted, skipped);
    return KVD_OK;
}

int kvd_store_evict_tenant(kvd_store_t *s, uint32_t tenant, uint64_t *evicted,
                           uint64_t *skipped)
{
    if (tenant >= s->n_tenants)
        return KVD_ERR_NOT_FOUND;
    evict_where(s, UINT32_MAX, tenant, evicted, skipped);
    return KVD_OK;
}

/* -------------------------------------------------------------- stats */

void kvd_store_stats(const kvd_store_t *s, kvd_store_stats_t *out)
{
    *out = s->st;
    out->pool_bytes = page_bytes_of(s, s->total_pages);
    out->free_bytes = page_bytes_of(s, s->free_pages);
    out->free_extents = s->free_extents;
    out->leases = s->n_leases;
    out->objects_ready = out->objects_writing = out->objects_pinned = 0;
    out->ready_bytes = out->writing_bytes = out->pinned_bytes = 0;
    for (uint32_t n = 0; n < s->n_slots; n++) {
        const ns_entry_t *e = &s->ns[n];
        if (!e->live)
            continue;
        uint64_t bytes = page_bytes_of(s, e->pages);
        out->objects_ready += e->info.objects_ready;
        out->objects_writing += e->info.objects_writing;
        out->objects_pinned += e->info.objects_pinned;
        out->ready_bytes += e->info.objects_ready * bytes;
        out->writing_bytes += e->info.objects_writing * bytes;
        out->pinned_bytes += e->info.objects_pinned * bytes;
    }
    out->pins = s->pins;
    /* promotion extents are being written (by the tier), objects or not */
    out->promoting_bytes = page_bytes_of(s, s->promoting_pages);
    out->writing_bytes += out->promoting_bytes;
    out->spilling_bytes = page_bytes_of(s, s->spilling_pages);
    out->ssd_objects = s->ssd_objects;
    out->quarantined_bytes = page_bytes_of(s, s->quarantine_pages);
    out->largest_free_bytes = page_bytes_of(s, extent_largest_free(s));
    out->fragmentation =
        out->free_bytes ? 1.0 - (double)out->largest_free_bytes / (double)out->free_bytes
                        : 0.0;
    out->index_bytes = (uint64_t)s->n_chunks * REC_CHUNK * sizeof(rec_t) +
                       s->n_buckets * sizeof(uint32_t) +
                       s->n_lease_buckets * sizeof(lease_t *) +
                       (uint64_t)s->ns_cap * sizeof(ns_entry_t) + sizeof(*s) +
                       s->lease_bytes + s->owners_bytes;
    persist_stats(s, out);
    if (s->tier)
        tier_stats(s, out);
}

/* --------------------------------------------------------------- check */

#define FAIL(...)                                \
    do {                                         \
        if (why)                                 \
            snprintf(why, why_len, __VA_ARGS__); \
        return KVD_ERR_STATE;                    \
    } while (0)

/* Every tenant's usage (and namespace slots) agrees with what the records,
 * leases and namespaces hold. */
static int check_tenants(const kvd_store_t *s, char *why, size_t why_len)
{
    typedef struct {
        uint64_t bytes, lru, pins, leases, namespaces;
    } use_t;
    use_t *u = calloc(KVD_TENANTS_MAX, sizeof(*u));
    if (u == NULL)
        return KVD_OK; /* cannot check without memory; not a violation */
    int rc = KVD_OK;
    for (uint32_t i = s->phys_head; i != NIL; i = R(s, i)->phys_next) {
        const rec_t *r = R(s, i);
        if (r->state == REC_FREE)
            continue;
        uint32_t t = r->quarantined ? (uint32_t)r->hits - 1 : tenant_of(s, r->ns);
        if (t >= s->n_tenants) {
            rc = KVD_ERR_STATE;
            if (why)
                snprintf(why, why_len, "record %u belongs to no tenant (%u)", i, t);
            goto out;
        }
        u[t].bytes += page_bytes_of(s, r->size_pages);
        if (r->state == REC_READY && r->pins == 0 && !(r->spare & REC_F_SPILLING))
            u[t].lru += r->size_pages;
    }
    for (const lease_t *l = s->oldest; l != NULL; l = l->newer) {
        u[l->tenant].leases++;
        for (uint32_t k = 0; k < l->n && !l->write; k++)
            u[l->tenant].pins += l->recs[k] != NIL;
    }
    uint32_t live = 0, freed = 0;
    for (uint32_t n = 0; n < s->n_slots; n++) {
        if (s->ns[n].live) {
            live++;
            u[s->ns[n].info.tenant].namespaces++;
        }
    }
    for (uint32_t f = s->ns_free_head; f != 0 && freed <= s->n_slots;
         f = s->ns[f - 1].free_next)
        freed += !s->ns[f - 1].live;
    if (live != s->n_ns || live + freed != s->n_slots) {
        rc = KVD_ERR_STATE;
        if (why)
            snprintf(why, why_len, "%u live and %u free namespace slots of %u (count %u)",
                     live, freed, s->n_slots, s->n_ns);
        goto out;
    }
    for (uint32_t t = 0; t < s->n_tenants; t++) {
        const tenant_t *tn = &s->tenants[t];
        if (u[t].bytes != tn->use.bytes || u[t].lru != tn->lru_pages ||
            u[t].pins != tn->use.pins || u[t].leases != tn->use.leases ||
            u[t].namespaces != tn->use.namespaces) {
            rc = KVD_ERR_STATE;
            if (why)
                snprintf(
                    why, why_len,
                    "tenant %s holds %llu bytes, %llu evictable pages, %llu pins, "
                    "%llu leases, %llu namespaces; it counts %llu, %llu, %llu, "
                    "%llu, %llu",
                    tn->name, (unsigned long long)u[t].bytes,
                    (unsigned long long)u[t].lru, (unsigned long long)u[t].pins,
                    (unsigned long long)u[t].leases, (unsigned long long)u[t].namespaces,
                    (unsigned long long)tn->use.bytes, (unsigned long long)tn->lru_pages,
                    (unsigned long long)tn->use.pins, (unsigned long long)tn->use.leases,
                    (unsigned long long)tn->use.namespaces);
            goto out;
        }
    }
out:
    free(u);
    return rc;
}

/* The SSD tier's records agree with the index, the SSD LRU, the promotion
 * extents and the counters; adds them to *objects. NULL or what is wrong. */
static const char *check_ssd(const kvd_store_t *s, uint64_t *objects)
{
    static _Thread_local char why[160];
    uint64_t n = 0, pages = 0, promoting = 0, listed = 0;
    for (uint32_t i = 1; i <= s->rec_high && (s->ssd_objects > 0 || s->ssd_lru_head);
         i++) {
        const rec_t *r = R(s, i);
        if (r->state != REC_READY || r->tier != KVD_TIER_SSD)
            continue;
        n++;
        pages += r->size_pages;
        if (r->ns >= s->n_slots || !s->ns[r->ns].live ||
            r->size_pages != s->ns[r->ns].pages || index_find(s, r->ns, r->key) != i ||
            r->pins) {
            snprintf(why, sizeof(why),
                     "SSD object %u: bad namespace, size, index or pins", i);
            return why;
        }
        if (r->spare & REC_F_PROMOTING) {
            const rec_t *q = R(s, r->phys_prev);
            if (r->phys_prev == NIL || q->state != REC_WRITING ||
                !(q->spare & REC_F_PROMOTING) ||
                memcmp(q->key, r->key, KVD_KEY_BYTES) != 0) {
                snprintf(why, sizeof(why), "SSD object %u: its promotion extent is wrong",
                         i);
                return why;
            }
            promoting++;
        }
    }
    for (uint32_t i = s->ssd_lru_head, p = NIL; i != NIL; p = i, i = R(s, i)->link_next) {
        const rec_t *r = R(s, i);
        if (r->tier != KVD_TIER_SSD || r->state != REC_READY ||
            (r->spare & REC_F_PROMOTING) || r->link_prev != p || ++listed > n) {
            snprintf(why, sizeof(why), "the SSD LRU holds record %u wrongly or loops", i);
            return why;
        }
    }
    if (n != s->ssd_objects || pages != s->ssd_pages || listed + promoting != n) {
        snprintf(
            why, sizeof(why),
            "%llu SSD objects (%llu pages, %llu listed, %llu promoting), the counters "
            "say %llu (%llu pages)",
            (unsigned long long)n, (unsigned long long)pages, (unsigned long long)listed,
            (unsigned long long)promoting, (unsigned long long)s->ssd_objects,
            (unsigned long long)s->ssd_pages);
        return why;
    }
    *objects += n;
    return NULL;
}

/* The writers table against the leases and the held lists: each slot's
 * counts, each held record quarantined and listed once; adds the held
 * pages to *queued. NULL when right, else what is wrong. */
static const char *check_writers(const kvd_store_t *s, uint64_t *queued)
{
    static _Thread_local char bad[160];
    uint64_t held = 0;
    if (s->n_writers > s->cap_writers || s->n_writers > KVD_STORE_WRITERS_MAX)
        return "the writers table is larger than its room";
    for (uint32_t k = 0; k < s->n_writers; k++) {
        const writer_ent_t *e = &s->writers[k];
        uint64_t pages = 0, leases = 0;
        for (const lease_t *l = s->oldest; l != NULL; l = l->newer)
            leases += l->writer == k + 1;
        if (e->id.pid == 0) {
            if (leases != 0 || e->held_head != NIL)
                snprintf(bad, sizeof(bad), "free writer slot %u holds something", k);
            else
                continue;
            return bad;
        }
        for (uint32_t i = e->held_head; i != NIL; i = R(s, i)->link_next) {
            const rec_t *r = R(s, i);
            if (r->state != REC_WRITING || !r->quarantined ||
                (pages += r->size_pages) > s->quarantine_pages) {
                snprintf(bad, sizeof(bad),
                         "writer pid %u holds record %u wrongly, or its list loops",
                         e->id.pid, i);
                return bad;
            }
        }
        if (pages != e->held_pages || leases != e->leases) {
            snprintf(bad, sizeof(bad),
                     "writer pid %u: %llu held pages and %llu leases, it counts %llu and "
                     "%u",
                     e->id.pid, (unsigned long long)pages, (unsigned long long)leases,
                     (unsigned long long)e->held_pages, e->leases);
            return bad;
        }
        if (e->leases == 0 && e->held_head == NIL) {
            snprintf(bad, sizeof(bad), "writer slot %u counts nothing but is kept", k);
            return bad;
        }
        held += pages;
    }
    if (held != s->held_pages) {
        snprintf(bad, sizeof(bad), "%llu pages held for writers, the counter says %llu",
                 (unsigned long long)held, (unsigned long long)s->held_pages);
        return bad;
    }
    *queued += held;
    return NULL;
}

int kvd_store_check(const kvd_store_t *s, char *why, size_t why_len)
{
    uint64_t pages = 0, free_p = 0, writing = 0, ready = 0, lru_expect = 0, pins = 0,
             free_recs = 0, objects = 0, quarantined = 0, lru_pages = 0, promoting = 0,
             spilling = 0;
    uint32_t prev = NIL;
    bool prev_free = false;
    for (uint32_t i = s->phys_head; i != NIL; i = R(s, i)->phys_next) {
        const rec_t *r = R(s, i);
        if (r->phys_prev != prev)
            FAIL("record %u: phys_prev %u, expected %u", i, r->phys_prev, prev);
        if (r->off_pages != pages)
            FAIL("record %u at page %u, expected %llu", i, r->off_pages,
                 (unsigned long long)pages);
        pages += r->size_pages;
        if (r->state == REC_FREE) {
            if (prev_free)
                FAIL("two adjacent free extents at page %u", r->off_pages);
            free_p += r->size_pages;
            free_recs++;
        } else if (r->state == REC_WRITING && r->quarantined) {
            quarantined += r->size_pages;
            if (index_find(s, r->ns, r->key) == i)
                FAIL("quarantined record %u is still in the index", i);
        } else if (r->state == REC_WRITING && (r->spare & REC_F_PROMOTING)) {
            promoting += r->size_pages;
            if (index_find(s, r->ns, r->key) == i || r->pins)
                FAIL("promotion extent %u is in the index or pinned", i);
        } else if (r->tier == KVD_TIER_SSD) {
            FAIL("SSD object %u is in the pool's address order", i);
        } else if (r->state == REC_WRITING || r->state == REC_READY) {
            objects++;
            if (r->ns >= s->n_slots || !s->ns[r->ns].live ||
                r->size_pages != s->ns[r->ns].pages)
                FAIL("object %u: bad namespace or size", i);
            if (index_find(s, r->ns, r->key) != i)
                FAIL("object %u is not found through the index", i);
            if ((r->spare & REC_F_LOST) && r->state == REC_READY && r->pins == 0 &&
                !(r->spare & REC_F_SPILLING))
                FAIL("object %u lost its bytes but stays, unpinned", i);
            if (r->state == REC_WRITING) {
                writing += r->size_pages;
                if (r->pins)
                    FAIL("object %u is pinned while being written", i);
            } else {
                bool on_lru = r->pins == 0 && !(r->spare & REC_F_SPILLING);
                ready += r->size_pages;
                pins += r->pins;
                spilling += r->spare & REC_F_SPILLING ? r->size_pages : 0;
                lru_expect += on_lru;
                lru_pages += on_lru ? r->size_pages : 0;
            }
        } else {
            FAIL("record %u in the address order has state %u", i, r->state);
        }
        prev_free = r->state == REC_FREE;
        prev = i;
    }
    if (pages != s->total_pages)
        FAIL("extents cover %llu pages of %llu", (unsigned long long)pages,
             (unsigned long long)s->total_pages);
    if (free_p != s->free_pages ||
        free_p + writing + promoting + ready + quarantined != s->total_pages)
        FAIL("free %llu + writing %llu + promoting %llu + ready %llu + quarantined %llu "
             "!= pool %llu pages (free counter %llu)",
             (unsigned long long)free_p, (unsigned long long)writing,
             (unsigned long long)promoting, (unsigned long long)ready,
             (unsigned long long)quarantined, (unsigned long long)s->total_pages,
             (unsigned long long)s->free_pages);
    if (promoting != s->promoting_pages || spilling != s->spilling_pages)
        FAIL("%llu pages promoting and %llu spilling, the counters say %llu and %llu",
             (unsigned long long)promoting, (unsigned long long)spilling,
             (unsigned long long)s->promoting_pages,
             (unsigned long long)s->spilling_pages);
    const char *ssd_bad = check_ssd(s, &objects);
    if (ssd_bad)
        FAIL("%s", ssd_bad);
    if (quarantined != s->quarantine_pages)
        FAIL("%llu pages in quarantine, the counter says %llu",
             (unsigned long long)quarantined, (unsigned long long)s->quarantine_pages);
    uint64_t queued = 0;
    for (uint32_t i = s->quarantine_head; i != NIL; i = R(s, i)->link_next) {
        if (!R(s, i)->quarantined || (queued += R(s, i)->size_pages) > quarantined)
            FAIL("the quarantine list holds record %u wrongly or loops", i);
    }
    const char *held_bad = check_writers(s, &queued);
    if (held_bad)
        FAIL("%s", held_bad);
    if (queued != quarantined)
        FAIL("the quarantine and held lists hold %llu of %llu pages",
             (unsigned long long)queued, (unsigned long long)quarantined);
    if (pins != s->pins || lru_pages != s->lru_pages)
        FAIL("pins %llu / evictable pages %llu, the counters say %llu / %llu",
             (unsigned long long)pins, (unsigned long long)lru_pages,
             (unsigned long long)s->pins, (unsigned long long)s->lru_pages);
    if (objects != s->n_objects)
        FAIL("%llu objects in the pool, %llu in the index", (unsigned long long)objects,
             (unsigned long long)s->n_objects);
    uint64_t listed = 0;
    const char *bad = extent_check_lists(s, &listed);
    if (bad)
        FAIL("%s", bad);
    if (listed != free_recs || free_recs != s->free_extents)
        FAIL("%llu free extents, %llu on the free lists", (unsigned long long)free_recs,
             (unsigned long long)listed);
    uint64_t lru = 0;
    for (uint32_t i = s->lru_head, p = NIL; i != NIL; p = i, i = R(s, i)->link_next) {
        const rec_t *r = R(s, i);
        if (r->state != REC_READY || r->pins || r->link_prev != p)
            FAIL("LRU holds object %u that is not READY and unpinned", i);
        if (++lru > objects)
            FAIL("the LRU list loops");
    }
    if (lru != lru_expect)
        FAIL("LRU has %llu objects, %llu are evictable", (unsigned long long)lru,
             (unsigned long long)lru_expect);
    uint64_t held_pins = 0, held_writes = 0;
    for (const lease_t *l = s->oldest; l != NULL; l = l->newer) {
        for (uint32_t k = 0; k < l->n; k++) {
            if (l->recs[k] == NIL)
                continue;
            const rec_t *r = R(s, l->recs[k]);
            if (l->write && r->state != REC_WRITING)
                FAIL("write lease %llu holds a record that is not WRITING",
                     (unsigned long long)l->id);
            if (!l->write && (r->state != REC_READY || r->pins == 0))
                FAIL("read lease %llu holds an unpinned record",
                     (unsigned long long)l->id);
            if (l->write)
                held_writes += r->size_pages;
            else
                held_pins++;
        }
    }
    if (held_pins != pins)
        FAIL("objects carry %llu pins, leases hold %llu", (unsigned long long)pins,
             (unsigned long long)held_pins);
    if (held_writes != writing)
        FAIL("%llu pages being written, leases hold %llu", (unsigned long long)writing,
             (unsigned long long)held_writes);
    return check_tenants(s, why, why_len);
}

/* --------------------------------------------------- resumable iteration */

/*
 * A position is a record index: records never move, so an object keeps its
 * place for its whole life, and walking indices upwards visits each live
 * object once however the store changes around the walk (an object created
 * behind the position is not seen; one gone is simply absent).
 */
int kvd_store_foreach_from(const kvd_store_t *s, uint32_t ns, uint64_t *pos,
                           uint64_t max_visits, kvd_obj_fn fn, void *arg)
{
    if (ns != UINT32_MAX && !ns_slot(s, ns, &ns)) {
        *pos = KVD_STORE_POS_END; /* a namespace not there has no objects */
        return 0;
    }
    uint64_t i = *pos == 0 ? 1 : *pos;
    kvd_obj_info_t info;
    for (uint64_t n = 0; i <= s->rec_high; i++, n++) {
        if (n == max_visits) {
            *pos = i;
            return 0;
        }
        const rec_t *r = R(s, (uint32_t)i);
        if ((r->state != REC_READY && r->state != REC_WRITING) || r->quarantined ||
            (r->state == REC_WRITING && (r->spare & REC_F_PROMOTING)) ||
            (ns != UINT32_MAX && r->ns != ns))
            continue;
        info_of(s, (uint32_t)i, &info);
        int rc = fn(&info, arg);
        if (rc != 0) {
            *pos = i;
            return rc;
        }
    }
    *pos = KVD_STORE_POS_END;
    return 0;
}

uint64_t kvd_store_pos_check(const kvd_store_t *s, uint64_t pos, uint64_t salt)
{
    /* the index hash's keyed mixing, with the secret's words in another
     * order: a client knowing neither cannot make a value that passes */
    const uint64_t *k = s->secret;
    uint64_t h = mum(pos ^ k[3], salt ^ k[0]) ^ mum(pos ^ k[1], k[2]);
    return mum(h ^ k[4], k[5]);
}

/* Evicting a namespace in slices walks records the same way: an eviction
 * frees its record's extent and may retire its free neighbours' records,
 * none of which the walk needs again; it makes no record. */
/* Evicts, in a slice, what is evictable of one slot (ns), one tenant, or
 * all (both UINT32_MAX). */
static void evict_slice(kvd_store_t *s, uint32_t ns, uint32_t tenant, uint64_t *pos,
                        uint64_t max_visits, uint64_t *evicted)
{
    uint64_t i = *pos == 0 ? 1 : *pos, e = 0, before = s->st.ssd_evictions;
    for (uint64_t n = 0; i <= s->rec_high; i++, n++) {
        if (n == max_visits) {
            *pos = i;
            *evicted = e;
            evict_done(s, before);
            PARANOID(s, "evict_from");
            return;
        }
        rec_t *r = R(s, (uint32_t)i);
        if (r->state != REC_READY || r->pins > 0 || r->quarantined ||
            (r->spare & (REC_F_SPILLING | REC_F_PROMOTING)) ||
            (ns != UINT32_MAX && r->ns != ns) ||
            (tenant != UINT32_MAX && tenant_of(s, r->ns) != tenant))
            continue;
        evict_rec(s, (uint32_t)i);
        e++;
    }
    *pos = KVD_STORE_POS_END;
    *evicted = e;
    evict_done(s, before);
    PARANOID(s, "evict_from");
}

int kvd_store_evict_from(kvd_store_t *s, uint32_t ns, uint64_t *pos, uint64_t max_visits,
                         uint64_t *evicted)
{
    if (ns != UINT32_MAX && !ns_slot(s, ns, &ns))
        return KVD_ERR_NOT_FOUND;
    evict_slice(s, ns, UINT32_MAX, pos, max_visits, evicted);
    return KVD_OK;
}

int kvd_store_evict_tenant_from(kvd_store_t *s, uint32_t tenant, uint64_t *pos,
                                uint64_t max_visits, uint64_t *evicted)
{
    if (tenant >= s->n_tenants)
        return KVD_ERR_NOT_FOUND;
    evict_slice(s, UINT32_MAX, tenant, pos, max_visits, evicted);
    return KVD_OK;
}

/* ----------------------------------------------------- namespace names */

/* A name's hash keyed with the secret, a word at a time. */
static uint64_t name_hash(const kvd_store_t *s, const char *name)
{
    const uint64_t *k = s->secret;
    uint64_t h = k[4];
    size_t len = strlen(name);
    for (size_t at = 0; at < len; at += 8) {
        uint64_t w = 0;
        memcpy(&w, name + at, KVD_MIN((size_t)8, len - at));
        h = mum(h ^ w ^ k[1], k[3] ^ at);
    }
    return mum(h ^ len, k[5]);
}

#define NS_INDEX_MASK (2u * KVD_STORE_MAX_NAMESPACES - 1u)

/* Where (tenant, name) hashes to: one name in two tenants is two keys. */
static uint32_t ns_index_home(const kvd_store_t *s, uint32_t tenant, const char *name)
{
    return (uint32_t)mum(name_hash(s, name) ^ tenant, s->secret[2] | 1) & NS_INDEX_MASK;
}

/* The slot of tenant's live namespace `name`, or UINT32_MAX. The index
 * holds slot + 1 of live namespaces. */
static uint32_t ns_index_find(const kvd_store_t *s, uint32_t tenant, const char *name)
{
    for (uint32_t i = ns_index_home(s, tenant, name), n = 0;
         s->ns_index[i] != 0 && n <= NS_INDEX_MASK; i = (i + 1) & NS_INDEX_MASK, n++) {
        uint32_t slot = s->ns_index[i] - 1u;
        const ns_entry_t *e = &s->ns[slot];
        if (slot < s->n_slots && e->live && e->info.tenant == tenant &&
            strcmp(e->info.name, name) == 0)
            return slot;
    }
    return UINT32_MAX;
}

static void ns_index_put(kvd_store_t *s, uint32_t slot)
{
    const ns_entry_t *e = &s->ns[slot];
    uint32_t i = ns_index_home(s, e->info.tenant, e->info.name);
    while (s->ns_index[i] != 0)
        i = (i + 1) & NS_INDEX_MASK;
    s->ns_index[i] = (uint16_t)(slot + 1);
}

static void ns_index_add(kvd_store_t *s, uint32_t slot)
{
    if (s->ns_index_n + 1 != s->n_ns)
        return; /* stale already: the next find rebuilds it */
    ns_index_put(s, slot);
    s->ns_index_n = s->n_ns;
}

static void ns_index_rebuild(kvd_store_t *s)
{
    memset(s->ns_index, 0, sizeof(s->ns_index));
    for (uint32_t slot = 0; slot < s->n_slots; slot++)
        if (s->ns[slot].live)
            ns_index_put(s, slot);
    s->ns_index_n = s->n_ns;
}

/* -------------------------------------------------------------- restore */

/*
 * Rebuilding a store from what its journal recovered (persist.c): the
 * namespace table as it was (slots and generations, so ids stay), then the
 * extents in offset order carved out of the one free extent a new store
 * has, each object put back into the index and the LRU (oldest access
 * first, so the coldest is evicted first again), each partial write into
 * quarantine (a writer of the dead daemon may still be copying into it:
 * held for it, or for one lease TTL where the journal names no writer),
 * and the children counts from the parent tags.
 */

int store_restore_begin(kvd_store_t *s, const uint64_t secret[6], uint64_t epoch_ms)
{
    if (s->n_ns != 0 || s->n_slots != 0 || s->n_objects != 0 || s->n_leases != 0 ||
        s->quarantine_head != NIL || s->n_writers != 0 || s->free_pages != s->total_pages)
        return KVD_ERR_STATE;
    memcpy(s->secret, secret, sizeof(s->secret));
    s->secret[5] |= 1;
    s->epoch_ms = epoch_ms;
    s->ns_index_n = UINT32_MAX; /* names hash with the secret: rebuilt */
    return KVD_OK;
}

int store_restore_ns(kvd_store_t *s, const restore_ns_t *table, uint32_t n)
{
    if (n > KVD_STORE_MAX_NAMESPACES || s->n_slots != 0)
        return KVD_ERR_INVALID;
    if (n > s->ns_cap) {
        ns_entry_t *e =
            kvd_mem_realloc(KVD_MEM_INDEX, s->ns, (size_t)s->ns_cap * sizeof(ns_entry_t),
                            (size_t)n * sizeof(ns_entry_t));
        if (e == NULL)
            return KVD_ERR_NOMEM;
        s->ns = e;
        s->ns_cap = n;
    }
    for (uint32_t slot = 0; slot < n; slot++) {
        const restore_ns_t *t = &table[slot];
        ns_entry_t *e = &s->ns[slot];
        memset(e, 0, sizeof(*e));
        e->gen = t->gen & NS_GEN_MASK;
        s->n_slots = slot + 1;
        if (!t->live || t->tenant >= s->n_tenants || t->object_bytes == 0 ||
            t->object_bytes > page_bytes_of(s, s->total_pages) ||
            strnlen(t->name, KVD_NS_NAME_MAX) == 0 ||
            strnlen(t->name, KVD_NS_NAME_MAX) == KVD_NS_NAME_MAX) {
            /* a free slot, queued as the engine queues freed ones */
            if (s->ns_free_tail != 0)
                s->ns[s->ns_free_tail - 1].free_next = slot + 1;
            else
                s->ns_free_head = slot + 1;
            s->ns_free_tail = slot + 1;
            continue;
        }
        memcpy(e->info.name, t->name, strlen(t->name) + 1);
        e->info.tenant = t->tenant;
        e->info.object_bytes = t->object_bytes;
        e->info.rank_replicated = t->rank_replicated;
        e->pages =
            (uint32_t)((t->object_bytes + s->cfg.page_bytes - 1) / s->cfg.page_bytes);
        e->live = true;
        s->n_ns++;
        s->tenants[t->tenant].use.namespaces++;
    }
    s->ns_index_n = UINT32_MAX;
    return KVD_OK;
}

/* Whether o may become a record of s now; cursor is the first page not yet
 * taken (objects come in offset order). */
static bool restore_fits(const kvd_store_t *s, const restore_obj_t *o, uint64_t cursor)
{
    if (o->size_pages == 0 || o->off_pages < cursor ||
        (uint64_t)o->off_pages + o->size_pages > s->total_pages)
        return false;
    if (o->kind == RESTORE_QUAR)
        return o->tenant < s->n_tenants;
    if (o->kind != RESTORE_READY && o->kind != RESTORE_WRITING)
        return false;
    if (o->slot >= s->n_slots || !s->ns[o->slot].live ||
        s->ns[o->slot].pages != o->size_pages)
        return false;
    return true;
}

/* Puts record i (carved, REC_WRITING) into quarantine for tenant t: held
 * for its writer when the journal named one (and the table has room),
 * else to end at release_ms. Returns whether it is held. */
static bool restore_quarantine(kvd_store_t *s, uint32_t i, uint32_t t,
                               const kvd_writer_t *writer, uint64_t release_ms)
{
    rec_t *r = R(s, i);
    r->quarantined = 1;
    r->hits = (uint16_t)(t + 1);
    s->tenants[t].use.bytes += page_bytes_of(s, r->size_pages);
    uint32_t w = writer->pid != 0 ? store_writer_get(s, writer) : 0;
    if (w != 0) {
        r->last_access_s = 0;
        writer_hold(s, w, i);
        return true;
    }
    r->last_access_s = (uint32_t)KVD_MIN(release_ms / 1000 + 1, (uint64_t)UINT32_MAX);
    r->link_prev = r->link_next = NIL;
    if (s->quarantine_tail != NIL)
        R(s, s->quarantine_tail)->link_next = i;
    else
        s->quarantine_head = i;
    s->quarantine_tail = i;
    s->quarantine_pages += r->size_pages;
    return false;
}

void store_sort_high32(uint64_t *a, uint64_t *tmp, size_t n)
{
    for (int shift = 32; shift < 64; shift += 8) {
        size_t count[257] = {0};
        for (size_t k = 0; k < n; k++)
            count[((a[k] >> shift) & 0xff) + 1]++;
        for (int d = 0; d < 256; d++)
            count[d + 1] += count[d];
        for (size_t k = 0; k < n; k++)
            tmp[count[(a[k] >> shift) & 0xff]++] = a[k];
        uint64_t *t = a;
        a = tmp;
        tmp = t;
    }
    /* four passes: the sorted values are back in the caller's a */
}

/* Inserts record i into the index unless its key is there already (false
 * then): one walk of its bucket for both. */
static bool index_insert_unique(kvd_store_t *s, uint32_t i)
{
    rec_t *r = R(s, i);
    uint64_t b = bucket_of(s, r->ns, key_tag(s, r->key));
    for (uint32_t j = s->buckets[b]; j != NIL; j = R(s, j)->hash_next)
        if (R(s, j)->ns == r->ns && memcmp(R(s, j)->key, r->key, KVD_KEY_BYTES) == 0)
            return false;
    r->hash_next = s->buckets[b];
    s->buckets[b] = i;
    s->n_objects++;
    return true;
}

int store_restore_objects(kvd_store_t *s, const restore_obj_t *objs, size_t n,
                          uint16_t free_tag, uint64_t now_ms, restore_counts_t *out)
{
    memset(out, 0, sizeof(*out));
    if (s->n_objects != 0 || s->phys_head == NIL || R(s, s->phys_head)->phys_next != NIL)
        return KVD_ERR_STATE;
    clock_seen(s, now_ms);
    uint64_t nb = s->n_buckets;
    while (nb < n && nb < (1ull << 32))
        nb <<= 1;
    if (nb != s->n_buckets && buckets_resize(s, nb) != KVD_OK)
        return KVD_ERR_NOMEM;
    /* the READY records, by last access: (last_access_s << 32 | record) */
    size_t ref_bytes = (n ? n : 1) * sizeof(uint64_t);
    uint64_t *refs = kvd_mem_calloc(KVD_MEM_STAGING, 1, ref_bytes);
    uint64_t *tmp = kvd_mem_calloc(KVD_MEM_STAGING, 1, ref_bytes);
    if (refs == NULL || tmp == NULL) {
        kvd_mem_free(KVD_MEM_STAGING, refs, ref_bytes);
        kvd_mem_free(KVD_MEM_STAGING, tmp, ref_bytes);
        return KVD_ERR_NOMEM;
    }
    size_t n_ready = 0;
    uint32_t tail = s->phys_head; /* the free extent after everything placed */
    R(s, tail)->ns = free_tag;
    uint64_t cursor = 0, release_ms = now_ms + s->cfg.lease_ttl_ms;
    int rc = KVD_OK;
    for (size_t k = 0; k < n; k++) {
        const restore_obj_t *o = &objs[k];
        if (!restore_fits(s, o, cursor)) {
            out->discarded++;
            continue;
        }
        /* restore_fits keeps o past the cursor and inside the pool, so
         * tail (the rest of the pool) holds it */
        uint32_t i = extent_carve(s, tail, o->off_pages, o->size_pages);
        if (i == NIL) {
            rc = KVD_ERR_NOMEM;
            break;
        }
        cursor = (uint64_t)o->off_pages + o->size_pages;
        rec_t *r = R(s, i);
        tail = r->phys_next;
        if (o->kind == RESTORE_QUAR) {
            out->held += restore_quarantine(s, i, o->tenant, &o->writer, release_ms);
            out->quarantined++;
            continue;
        }
        memcpy(r->key, o->key, KVD_KEY_BYTES);
        memcpy(r->parent_tag, o->parent_tag, KVD_KEY_TAG_BYTES);
        r->has_parent = o->has_parent != 0;
        r->depth = KVD_MIN(o->depth, REC_DEPTH_MAX);
        r->ns = o->slot;
        uint32_t t = tenant_of(s, o->slot);
        uint64_t bytes = page_bytes_of(s, r->size_pages);
        if (o->kind == RESTORE_WRITING) {
            out->held += restore_quarantine(s, i, t, &o->writer, release_ms);
            out->writing++;
            out->writing_bytes += bytes;
            continue;
        }
        r->state = REC_READY;
        r->last_access_s = o->last_access_s;
        r->hits = o->hits;
        if (!index_insert_unique(s, i)) {
            /* a key twice: which extent holds its bytes is not known, so
             * neither stays. This one is free again at once (merged into
             * the free space before it, or taking in the free rest after
             * it: either way the tail); the first goes after the loop. */
            out->discarded++;
            R(s, index_find(s, o->slot, o->key))->spare |= REC_F_DOOMED;
            uint32_t prev = r->phys_prev;
            bool prev_free = prev != NIL && R(s, prev)->state == REC_FREE;
            extent_free(s, i, free_tag);
            tail = prev_free ? prev : i;
            continue;
        }
        s->ns[o->slot].info.objects_ready++;
        s->tenants[t].use.bytes += bytes;
        refs[n_ready++] = (uint64_t)o->last_access_s << 32 | i;
        out->ready++;
        out->ready_bytes += s->ns[o->slot].info.object_bytes;
    }
    if (rc == KVD_OK) {
        /* the first holders of keys found twice (marked in spare) go too */
        size_t kept = 0;
        for (size_t k = 0; k < n_ready; k++) {
            uint32_t i = (uint32_t)refs[k];
            rec_t *r = R(s, i);
            if (!(r->spare & REC_F_DOOMED)) {
                refs[kept++] = refs[k];
                continue;
            }
            r->spare &= ~REC_F_DOOMED;
            ns_entry_t *e = &s->ns[r->ns];
            e->info.objects_ready--;
            s->tenants[e->info.tenant].use.bytes -= page_bytes_of(s, r->size_pages);
            out->ready--;
            out->ready_bytes -= e->info.object_bytes;
            out->discarded++;
            index_remove(s, i);
            extent_free(s, i, free_tag);
        }
        n_ready = kept;
        /* oldest first, so that the most recent ends at the hot end */
        store_sort_high32(refs, tmp, n_ready);
        for (size_t k = 0; k < n_ready; k++)
            lru_push_head(s, (uint32_t)refs[k]);
        for (size_t k = 0; k < n_ready; k++)
            count_child(s, (uint32_t)refs[k], +1);
        for (uint32_t slot = 0; slot < s->n_slots; slot++)
            ns_maybe_remove(s, slot);
        out->namespaces = s->n_ns;
    }
    kvd_mem_free(KVD_MEM_STAGING, refs, ref_bytes);
    kvd_mem_free(KVD_MEM_STAGING, tmp, ref_bytes);
    PARANOID(s, "restore");
    return rc;
}
