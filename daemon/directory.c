/*
 * directory.c - this daemon's share of the cluster's page directory
 * (directory.h): a hash table of (namespace, key) -> up to
 * KVD_DIR_HOLDERS_MAX holders.
 *
 * Namespaces are interned as (tenant, name) -> a small id; holders as node
 * id -> a small id, each with the count of entries naming it. Entries live
 * in one array (a free list threads the unused ones) chained from a
 * power-of-two bucket array, grown at a load of one. The bucket of an
 * entry comes from a keyed hash (a random seed per daemon): keys are
 * chosen by clients, who must not aim at one chain.
 *
 * A holder's reset or departure walks every entry once: these follow a
 * membership change, rare next to announcements and lookups.
 */
#include "directory.h"

#include <string.h>
#include <sys/random.h>

#define NIL         UINT32_MAX
#define HOLDER_NONE UINT16_MAX

typedef struct entry {
    uint8_t key[KVD_KEY_BYTES];
    uint32_t ns;   /* interned */
    uint32_t next; /* chain, or the free list */
    uint16_t holders[KVD_DIR_HOLDERS_MAX];
    uint8_t n_holders; /* 0: free */
} entry_t;

typedef struct ns_name {
    char tenant[KVD_TENANT_NAME_BYTES];
    char name[KVD_NS_NAME_BYTES];
} ns_name_t;

typedef struct holder {
    char id[KVD_NODE_ID_BYTES];
    uint64_t entries;
    bool live;
} holder_t;

struct kvd_dir {
    uint64_t seed;
    entry_t *e;
    uint32_t cap, used, free_head;
    uint32_t *buckets;
    uint32_t n_buckets; /* a power of two */
    ns_name_t *ns;
    uint32_t n_ns, ns_cap;
    holder_t *holders;
    uint32_t n_holders, holders_cap;
};

static uint32_t bucket_of(const kvd_dir_t *d, uint32_t ns, const uint8_t *key)
{
    uint64_t a, b;
    memcpy(&a, key, 8);
    memcpy(&b, key + 24, 8);
    uint64_t h = kvd_mix64(a ^ d->seed) ^ kvd_mix64(b + ns + (d->seed << 1));
    return (uint32_t)(kvd_mix64(h) & (d->n_buckets - 1));
}

int kvd_dir_create(kvd_dir_t **out)
{
    kvd_dir_t *d = kvd_mem_calloc(KVD_MEM_INDEX, 1, sizeof(*d));
    if (d == NULL)
        return KVD_ERR_NOMEM;
    if (getrandom(&d->seed, sizeof(d->seed), 0) != sizeof(d->seed))
        d->seed = (uint64_t)kvd_now_ns() * 0x9e3779b97f4a7c15ull;
    d->free_head = NIL;
    d->n_buckets = 1024;
    d->buckets = kvd_mem_calloc(KVD_MEM_INDEX, d->n_buckets, sizeof(uint32_t));
    if (d->buckets == NULL) {
        kvd_mem_free(KVD_MEM_INDEX, d, sizeof(*d));
        return KVD_ERR_NOMEM;
    }
    memset(d->buckets, 0xff, d->n_buckets * sizeof(uint32_t));
    *out = d;
    return KVD_OK;
}

void kvd_dir_destroy(kvd_dir_t *d)
{
    if (d == NULL)
        return;
    kvd_mem_free(KVD_MEM_INDEX, d->e, (size_t)d->cap * sizeof(*d->e));
    kvd_mem_free(KVD_MEM_INDEX, d->buckets, (size_t)d->n_buckets * sizeof(uint32_t));
    kvd_mem_free(KVD_MEM_INDEX, d->ns, (size_t)d->ns_cap * sizeof(*d->ns));
    kvd_mem_free(KVD_MEM_INDEX, d->holders, (size_t)d->holders_cap * sizeof(*d->holders));
    kvd_mem_free(KVD_MEM_INDEX, d, sizeof(*d));
}

uint64_t kvd_dir_entries(const kvd_dir_t *d)
{
    return d->used;
}

uint64_t kvd_dir_bytes(const kvd_dir_t *d)
{
    return sizeof(*d) + (uint64_t)d->cap * sizeof(*d->e) +
           (uint64_t)d->n_buckets * sizeof(uint32_t) +
           (uint64_t)d->ns_cap * sizeof(*d->ns) +
           (uint64_t)d->holders_cap * sizeof(*d->holders);
}

/* --------------------------------------------------------------- interning */

/* Grows an array of n_cap items of size bytes to hold one more. */
static int grow(void **arr, uint32_t *cap, uint32_t n, size_t size, uint32_t first)
{
    if (n < *cap)
        return KVD_OK;
    uint32_t ncap = *cap ? *cap * 2 : first;
    void *a =
        kvd_mem_realloc(KVD_MEM_INDEX, *arr, (size_t)*cap * size, (size_t)ncap * size);
    if (a == NULL)
        return KVD_ERR_NOMEM;
    memset((char *)a + (size_t)*cap * size, 0, (size_t)(ncap - *cap) * size);
    *arr = a;
    *cap = ncap;
    return KVD_OK;
}

/* The id of (tenant, name); with add, made when missing. NIL when absent
 * (or out of memory). A linear search: a daemon holds a few models. */
static uint32_t ns_intern(kvd_dir_t *d, const char *tenant, const char *name, bool add)
{
    for (uint32_t i = 0; i < d->n_ns; i++)
        if (strcmp(d->ns[i].name, name) == 0 && strcmp(d->ns[i].tenant, tenant) == 0)
            return i;
    if (!add || d->n_ns >= 65536 ||
        grow((void **)&d->ns, &d->ns_cap, d->n_ns, sizeof(*d->ns), 16) != KVD_OK)
        return NIL;
    kvd_strlcpy(d->ns[d->n_ns].tenant, tenant, sizeof(d->ns[0].tenant));
    kvd_strlcpy(d->ns[d->n_ns].name, name, sizeof(d->ns[0].name));
    return d->n_ns++;
}

static uint16_t holder_intern(kvd_dir_t *d, const char *id, bool add)
{
    uint32_t free_slot = NIL;
    for (uint32_t i = 0; i < d->n_holders; i++) {
        if (d->holders[i].live && strcmp(d->holders[i].id, id) == 0)
            return (uint16_t)i;
        if (!d->holders[i].live && free_slot == NIL)
            free_slot = i;
    }
    if (!add)
        return HOLDER_NONE;
    if (free_slot == NIL) {
        if (d->n_holders >= HOLDER_NONE ||
            grow((void **)&d->holders, &d->holders_cap, d->n_holders, sizeof(*d->holders),
                 16) != KVD_OK)
            return HOLDER_NONE;
        free_slot = d->n_holders++;
    }
    holder_t *h = &d->holders[free_slot];
    memset(h, 0, sizeof(*h));
    kvd_strlcpy(h->id, id, sizeof(h->id));
    h->live = true;
    return (uint16_t)free_slot;
}

/* ----------------------------------------------------------------- entries */

static uint32_t find(const kvd_dir_t *d, uint32_t ns, const uint8_t *key, uint32_t **link)
{
    uint32_t *l = &d->buckets[bucket_of(d, ns, key)];
    while (*l != NIL) {
        const entry_t *e = &d->e[*l];
        if (e->ns == ns && memcmp(e->key, key, KVD_KEY_BYTES) == 0)
            break;
        l = &d->e[*l].next;
    }
    if (link != NULL)
        *link = l;
    return *l;
}

static int rehash(kvd_dir_t *d, uint32_t n_buckets)
{
    uint32_t *b = kvd_mem_calloc(KVD_MEM_INDEX, n_buckets, sizeof(uint32_t));
    if (b == NULL)
        return KVD_ERR_NOMEM;
    memset(b, 0xff, (size_t)n_buckets * sizeof(uint32_t));
    kvd_mem_free(KVD_MEM_INDEX, d->buckets, (size_t)d->n_buckets * sizeof(uint32_t));
    d->buckets = b;
    d->n_buckets = n_buckets;
    for (uint32_t i = 0; i < d->cap; i++) {
        entry_t *e = &d->e[i];
        if (e->n_holders == 0)
            continue;
        uint32_t *head = &d->buckets[bucket_of(d, e->ns, e->key)];
        e->next = *head;
        *head = i;
    }
    return KVD_OK;
}

static uint32_t entry_new(kvd_dir_t *d)
{
    if (d->free_head == NIL) {
        uint32_t old = d->cap;
        if (old >= NIL / 2)
            return NIL;
        if (grow((void **)&d->e, &d->cap, d->cap, sizeof(*d->e), 1024) != KVD_OK)
            return NIL;
        for (uint32_t i = d->cap; i-- > old;) {
            d->e[i].next = d->free_head;
            d->free_head = i;
        }
    }
    uint32_t i = d->free_head;
    d->free_head = d->e[i].next;
    return i;
}

static void add(kvd_dir_t *d, uint32_t ns, const uint8_t *key, uint16_t h)
{
    uint32_t *link;
    uint32_t i = find(d, ns, key, &link);
    if (i != NIL) {
        entry_t *e = &d->e[i];
        for (uint8_t k = 0; k < e->n_holders; k++)
            if (e->holders[k] == h)
                return;
        if (e->n_holders == KVD_DIR_HOLDERS_MAX)
            return; /* named by enough holders already: a hint, not a census */
        e->holders[e->n_holders++] = h;
        d->holders[h].entries++;
        return;
    }
    if (d->used >= d->n_buckets && rehash(d, d->n_buckets * 2) == KVD_OK)
        find(d, ns, key, &link);
    i = entry_new(d);
    if (i == NIL)
        return; /* out of memory: the entry is missing, lookups miss it */
    entry_t *e = &d->e[i];
    memcpy(e->key, key, KVD_KEY_BYTES);
    e->ns = ns;
    e->holders[0] = h;
    e->n_holders = 1;
    e->next = *link;
    *link = i;
    d->used++;
    d->holders[h].entries++;
}

/* Takes holder index k out of entry i (reached through link); frees the
 * entry when nobody is left. */
static void drop_holder_at(kvd_dir_t *d, uint32_t *link, uint32_t i, uint8_t k)
{
    entry_t *e = &d->e[i];
    d->holders[e->holders[k]].entries--;
    e->holders[k] = e->holders[--e->n_holders];
    if (e->n_holders > 0)
        return;
    *link = e->next;
    e->next = d->free_head;
    d->free_head = i;
    d->used--;
}

static void del(kvd_dir_t *d, uint32_t ns, const uint8_t *key, uint16_t h)
{
    uint32_t *link;
    uint32_t i = find(d, ns, key, &link);
    if (i == NIL)
        return;
    for (uint8_t k = 0; k < d->e[i].n_holders; k++)
        if (d->e[i].holders[k] == h) {
            drop_holder_at(d, link, i, k);
            return;
        }
}

/* Takes holder h out of every entry: one walk of the chains. */
static void drop_holder_everywhere(kvd_dir_t *d, uint16_t h)
{
    for (uint32_t b = 0; b < d->n_buckets && d->holders[h].entries > 0; b++) {
        uint32_t *link = &d->buckets[b];
        while (*link != NIL) {
            uint32_t i = *link;
            entry_t *e = &d->e[i];
            bool gone = false;
            for (uint8_t k = 0; k < e->n_holders; k++)
                if (e->holders[k] == h) {
                    gone = e->n_holders == 1;
                    drop_holder_at(d, link, i, k);
                    break;
                }
            if (!gone)
                link = &e->next;
        }
    }
}

uint64_t kvd_dir_drop_moved(kvd_dir_t *d, uint64_t self_hash, const uint64_t *joiners,
                            size_t n)
{
    uint64_t moved = 0;
    for (uint32_t b = 0; b < d->n_buckets && n > 0; b++) {
        uint32_t *link = &d->buckets[b];
        while (*link != NIL) {
            uint32_t i = *link;
            entry_t *e = &d->e[i];
            const ns_name_t *nm = &d->ns[e->ns];
            uint64_t h = kvd_dir_hash(nm->tenant, nm->name, e->key);
            uint64_t mine = kvd_rendezvous_score(h, self_hash);
            bool lost = false;
            for (size_t j = 0; j < n && !lost; j++)
                lost = kvd_rendezvous_score(h, joiners[j]) > mine;
            if (!lost) {
                link = &e->next;
                continue;
            }
            while (e->n_holders > 0 && *link == i)
                drop_holder_at(d, link, i, 0);
            moved++;
        }
    }
    return moved;
}

/* ------------------------------------------------------------------ the API */

int kvd_dir_announce(kvd_dir_t *d, const kvd_dir_announce_req_t *req, uint64_t *entries)
{
    if (req->holder[0] == '\0')
        return KVD_ERR_INVALID;
    uint16_t h = holder_intern(d, req->holder, true);
    if (h == HOLDER_NONE)
        return KVD_ERR_NOMEM;
    if (req->reset)
        drop_holder_everywhere(d, h);
    for (size_t b = 0; b < req->n; b++) {
        const kvd_dir_keys_t *k = &req->batches[b];
        uint32_t ns = ns_intern(d, k->tenant, k->ns_name, k->n_added > 0);
        if (ns == NIL)
            continue;
        for (size_t i = 0; i < k->n_removed; i++)
            del(d, ns, k->removed[i], h);
        for (size_t i = 0; i < k->n_added; i++)
            add(d, ns, k->added[i], h);
    }
    *entries = d->holders[h].entries;
    return KVD_OK;
}

void kvd_dir_holder_gone(kvd_dir_t *d, const char *node_id)
{
    uint16_t h = holder_intern(d, node_id, false);
    if (h == HOLDER_NONE)
        return;
    drop_holder_everywhere(d, h);
    d->holders[h].live = false;
}

int kvd_dir_lookup_local(kvd_dir_t *d, const kvd_dir_lookup_req_t *req, kvd_msg_t *rep)
{
    kvd_dir_lookup_rep_t *r = &rep->body.dir_lookup_rep;
    /* the reply's node list: the holders met, at most KVD_DIR_NODES_MAX */
    uint16_t node_of[KVD_DIR_NODES_MAX];
    r->nodes = kvd_msg_alloc(rep, KVD_DIR_NODES_MAX * sizeof(*r->nodes));
    r->n_holders = kvd_msg_alloc(rep, req->n * sizeof(size_t) + 1);
    r->holders = kvd_msg_alloc(rep, req->n * sizeof(uint64_t *) + 1);
    if (!r->nodes || !r->n_holders || !r->holders)
        return KVD_ERR_NOMEM;
    r->n = req->n;
    r->n_nodes = 0;
    for (size_t q = 0; q < req->n; q++) {
        const kvd_dir_keys_t *k = &req->queries[q];
        uint64_t *bits = kvd_msg_alloc(rep, k->n_added * sizeof(uint64_t) + 1);
        if (bits == NULL)
            return KVD_ERR_NOMEM;
        memset(bits, 0, k->n_added * sizeof(uint64_t));
        r->holders[q] = bits;
        r->n_holders[q] = k->n_added;
        uint32_t ns = ns_intern(d, k->tenant, k->ns_name, false);
        if (ns == NIL)
            continue;
        for (size_t i = 0; i < k->n_added; i++) {
            uint32_t e = find(d, ns, k->added[i], NULL);
            if (e == NIL)
                continue;
            for (uint8_t h = 0; h < d->e[e].n_holders; h++) {
                uint16_t hid = d->e[e].holders[h];
                size_t bit = 0;
                while (bit < r->n_nodes && node_of[bit] != hid)
                    bit++;
                if (bit == r->n_nodes) {
                    if (r->n_nodes == KVD_DIR_NODES_MAX)
                        continue; /* more holders than one reply names */
                    node_of[bit] = hid;
                    kvd_strlcpy(r->nodes[bit], d->holders[hid].id, sizeof(r->nodes[bit]));
                    r->n_nodes++;
                }
                bits[i] |= 1ull << bit;
            }
        }
    }
    return KVD_OK;
}
