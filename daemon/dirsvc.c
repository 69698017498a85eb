/*
 * dirsvc.c - the cluster directory service (dirsvc.h): the store's
 * presence events queued and announced to their owners, the re-announce
 * walks after membership changes, the share's peer methods, and lookups
 * routed to the owners.
 *
 * The queue holds (name, key, present) in the order the store told them;
 * names (tenant, namespace) are interned when the event comes, since a
 * namespace may be gone by the time its last object's removal is sent. A
 * flush turns the queue into one or more DirAnnounce frames per owner, each
 * frame a list of batches of one name and one direction in queue order, so
 * that a key published and evicted within one tick ends absent.
 */
#include "dirsvc.h"
#include "directory.h"

#include <string.h>
#include <sys/random.h>

#define FRAME_KEYS_MAX    65536      /* keys in one DirAnnounce (2 MiB of keys) */
#define FRAME_BATCHES_MAX 1024       /* batches in one DirAnnounce (under --max-batch) */
#define QUEUE_MAX         (1u << 20) /* events queued before a full re-announce instead */
#define WALK_SLICE        65536      /* records one tick's walk looks at */
/* A routed lookup answers by then with what came: a worker's Lookup waits
 * on it, and an owner that hangs must not hold that up for a peer call's
 * whole timeout. */
#define ROUTE_DEADLINE_NS (200ull * 1000 * 1000)
/* The asker's cache (kvd_dirsvc_set_cache): 4-way sets of 56-byte entries,
 * 65,536 entries (3.5 MiB) in all. */
#define CACHE_WAYS 4
#define CACHE_SETS (1u << 14)

typedef struct hname {
    char tenant[KVD_TENANT_NAME_BYTES];
    char ns[KVD_NS_NAME_BYTES];
} hname_t;

typedef struct event {
    uint8_t key[KVD_KEY_BYTES];
    uint32_t name;
    bool present;
} event_t;

/* A member as the service sees it: its id, its life (start time), its
 * node hash, and whether this life got our reset. */
typedef struct mem {
    char id[KVD_NODE_ID_BYTES];
    char address[KVD_ADDR_BYTES];
    uint64_t started_ms;
    uint64_t hash;
    uint64_t reset_gen; /* the full round whose reset it got */
} mem_t;

typedef enum walk_mode { WALK_NONE, WALK_FULL, WALK_CHANGED } walk_mode_t;

/* What a routed lookup learned: key (of interned name) is held by member
 * `holder` of the view `view` (its index in mem; UINT32_MAX none), until
 * expires_ns; and, until then too, which member was found without it
 * (gone: 1 + its index; 0 none), whatever the owners still say. */
typedef struct centry {
    uint8_t key[KVD_KEY_BYTES];
    uint32_t name;
    uint32_t view; /* 0: empty */
    uint32_t holder;
    uint32_t gone;
    uint64_t expires_ns;
} centry_t;

struct kvd_dirsvc {
    kvd_store_t *store;
    kvd_peers_t *peers;
    char self[KVD_NODE_ID_BYTES];
    uint64_t self_hash;
    kvd_dir_t *share;
    hname_t *names;
    uint32_t n_names, names_cap;
    event_t *q;
    size_t n_q, q_cap;
    bool ready;
    mem_t *mem; /* current members, sorted by id (the view's order) */
    size_t n_mem;
    uint64_t *hashes; /* mem[i].hash, for kvd_rendezvous_owner */
    mem_t *old;       /* the members before the change a WALK_CHANGED is for */
    size_t n_old;
    uint64_t *old_hashes;
    uint64_t full_gen;
    walk_mode_t walk;
    uint64_t walk_pos;
    bool redo_full;       /* an announcement failed: a full round once the walk ends */
    struct route *routes; /* routed lookups not yet answered */
    uint64_t announced, announce_failures;
    /* the cache of holders other members have (NULL: off) */
    centry_t *cache; /* CACHE_SETS x CACHE_WAYS */
    uint64_t cache_ttl_ns;
    uint64_t cache_seed; /* keys are chosen by clients: sets by a secret */
    uint32_t view_gen;   /* rises when the members (mem's indices) change */
    uint64_t cache_hits, cache_misses, cache_stale;
};

/* ------------------------------------------------------------- names */

static uint32_t name_intern(kvd_dirsvc_t *d, const char *tenant, const char *ns)
{
    for (uint32_t i = d->n_names; i-- > 0;)
        if (strcmp(d->names[i].ns, ns) == 0 && strcmp(d->names[i].tenant, tenant) == 0)
            return i;
    if (d->n_names == d->names_cap) {
        uint32_t cap = d->names_cap ? 2 * d->names_cap : 16;
        hname_t *n = kvd_mem_realloc(KVD_MEM_OTHER, d->names, d->names_cap * sizeof(*n),
                                     cap * sizeof(*n));
        if (n == NULL)
            return UINT32_MAX;
        d->names = n;
        d->names_cap = cap;
    }
    kvd_strlcpy(d->names[d->n_names].tenant, tenant, sizeof(d->names[0].tenant));
    kvd_strlcpy(d->names[d->n_names].ns, ns, sizeof(d->names[0].ns));
    return d->n_names++;
}

/* The interned name of a store namespace id (UINT32_MAX: none). */
static uint32_t name_of_ns(kvd_dirsvc_t *d, uint32_t ns_id)
{
    kvd_ns_info_t info;
    if (kvd_store_ns_info(d->store, ns_id, &info) != KVD_OK)
        return UINT32_MAX;
    const char *t = kvd_store_tenant_name(d->store, info.tenant);
    return name_intern(d, t ? t : "", info.name);
}

/* ------------------------------------------------------------- queue */

static void start_full(kvd_dirsvc_t *d);
static void routes_expire(kvd_dirsvc_t *d, uint64_t now_ns);

static void queue_push(kvd_dirsvc_t *d, uint32_t name, const uint8_t *key, bool present)
{
    if (d->n_q == QUEUE_MAX) {
        /* the owners cannot keep up (or are away): forget the queue and
         * tell everything again from a reset */
        d->n_q = 0;
        start_full(d);
        return;
    }
    if (d->n_q == d->q_cap) {
        size_t cap = d->q_cap ? 2 * d->q_cap : 1024;
        event_t *q = kvd_mem_realloc(KVD_MEM_STAGING, d->q, d->q_cap * sizeof(*q),
                                     cap * sizeof(*q));
        if (q == NULL) {
            d->n_q = 0;
            start_full(d);
            return;
        }
        d->q = q;
        d->q_cap = cap;
    }
    event_t *e = &d->q[d->n_q++];
    memcpy(e->key, key, KVD_KEY_BYTES);
    e->name = name;
    e->present = present;
}

static void on_presence(void *arg, uint32_t ns, const uint8_t key[KVD_KEY_BYTES],
                        bool present)
{
    kvd_dirsvc_t *d = arg;
    if (!d->ready)
        return; /* nothing to tell yet: the full walk when ready tells it */
    uint32_t name = name_of_ns(d, ns);
    if (name != UINT32_MAX)
        queue_push(d, name, key, present);
}

/* ------------------------------------------------------------ owners */

/* The index in hashes[0..n) (members sorted by id) of the owner of a
 * queued key (name interned). */
static size_t owner_of(const kvd_dirsvc_t *d, const uint64_t *hashes, size_t n,
                       uint32_t name, const uint8_t *key)
{
    const hname_t *nm = &d->names[name];
    return kvd_rendezvous_owner(kvd_dir_hash(nm->tenant, nm->ns, key), hashes, n);
}

/* ------------------------------------------------------------- frames */

/* One DirAnnounce being built for one owner. */
typedef struct frame {
    kvd_msg_t msg;
    kvd_dir_keys_t *batches; /* in msg's arena, FRAME_BATCHES_MAX of them */
    uint32_t *batch_name;
    uint8_t *batch_present;
    size_t keys;
    bool used;
} frame_t;

/* An announcement that did not arrive leaves its owner behind: once the
 * walk under way (if any) ends, everything is told again from a reset.
 * One that failed because its owner left needs nothing (the new owners
 * get it from the walk after the change). */
static void announce_done(void *arg, int status, kvd_msg_t *rep)
{
    kvd_dirsvc_t *d = arg;
    if (status == KVD_OK && rep->status == KVD_OK)
        return;
    d->announce_failures++;
    if (status != KVD_ERR_DRAINING && d->ready)
        d->redo_full = true;
}

/* Sends (or, for this daemon's own share, applies) owner o's frame. */
static void frame_send(kvd_dirsvc_t *d, size_t o, frame_t *f)
{
    if (!f->used)
        return;
    kvd_dir_announce_req_t *r = &f->msg.body.dir_announce_req;
    d->announced += f->keys;
    if (strcmp(d->mem[o].id, d->self) == 0) {
        uint64_t entries;
        kvd_dir_announce(d->share, r, &entries);
        kvd_msg_clear(&f->msg);
    } else {
        kvd_peers_send(d->peers, d->mem[o].id, d->mem[o].address, &f->msg, announce_done,
                       d);
    }
    memset(f, 0, sizeof(*f));
}

static int frame_open(kvd_dirsvc_t *d, size_t o, frame_t *f)
{
    memset(f, 0, sizeof(*f));
    kvd_msg_request(&f->msg, 0, KVD_METHOD_DIR_ANNOUNCE);
    kvd_dir_announce_req_t *r = &f->msg.body.dir_announce_req;
    kvd_strlcpy(r->holder, d->self, sizeof(r->holder));
    f->batches = kvd_msg_alloc(&f->msg, FRAME_BATCHES_MAX * sizeof(*f->batches));
    f->batch_name = kvd_msg_alloc(&f->msg, FRAME_BATCHES_MAX * sizeof(uint32_t));
    f->batch_present = kvd_msg_alloc(&f->msg, FRAME_BATCHES_MAX);
    if (!f->batches || !f->batch_name || !f->batch_present) {
        kvd_msg_clear(&f->msg);
        return KVD_ERR_NOMEM;
    }
    r->batches = f->batches;
    /* the first frame to this life of the owner in this full round forgets
     * what it heard from us before */
    if (d->mem[o].reset_gen != d->full_gen) {
        r->reset = true;
        d->mem[o].reset_gen = d->full_gen;
    }
    f->used = true;
    return KVD_OK;
}

/*
 * Sends the events ev[0..n) to their owners: frames per owner, batches of
 * one name and one direction in order. Keys of a batch live in the frame's
 * arena (copied).
 */
static void send_events(kvd_dirsvc_t *d, const event_t *ev, size_t n)
{
    if (n == 0 || d->n_mem == 0)
        return;
    frame_t *frames = kvd_mem_calloc(KVD_MEM_STAGING, d->n_mem, sizeof(*frames));
    /* keys per (owner) counted first, so that each batch's array is sized once */
    if (frames == NULL)
        return;
    for (size_t i = 0; i < n;) {
        size_t o = owner_of(d, d->hashes, d->n_mem, ev[i].name, ev[i].key);
        /* the run of events of one owner, name and direction */
        size_t j = i + 1;
        while (j < n && j - i < FRAME_KEYS_MAX && ev[j].name == ev[i].name &&
               ev[j].present == ev[i].present &&
               owner_of(d, d->hashes, d->n_mem, ev[j].name, ev[j].key) == o)
            j++;
        frame_t *f = &frames[o];
        kvd_dir_announce_req_t *r = &f->msg.body.dir_announce_req;
        if (f->used && (r->n == FRAME_BATCHES_MAX || f->keys + (j - i) > FRAME_KEYS_MAX))
            frame_send(d, o, f);
        if (!f->used && frame_open(d, o, f) != KVD_OK) {
            i = j;
            continue;
        }
        r = &f->msg.body.dir_announce_req;
        kvd_key_t *keys = kvd_msg_alloc(&f->msg, (j - i) * sizeof(kvd_key_t));
        if (keys == NULL) {
            i = j;
            continue;
        }
        for (size_t k = i; k < j; k++)
            memcpy(keys[k - i], ev[k].key, KVD_KEY_BYTES);
        kvd_dir_keys_t *b = &f->batches[r->n++];
        kvd_strlcpy(b->tenant, d->names[ev[i].name].tenant, sizeof(b->tenant));
        kvd_strlcpy(b->ns_name, d->names[ev[i].name].ns, sizeof(b->ns_name));
        if (ev[i].present) {
            b->added = keys;
            b->n_added = j - i;
        } else {
            b->removed = keys;
            b->n_removed = j - i;
        }
        f->keys += j - i;
        i = j;
    }
    for (size_t o = 0; o < d->n_mem; o++)
        frame_send(d, o, &frames[o]);
    kvd_mem_free(KVD_MEM_STAGING, frames, d->n_mem * sizeof(*frames));
}

/* ------------------------------------------------------------- walks */

static void start_full(kvd_dirsvc_t *d)
{
    d->full_gen++;
    d->walk = WALK_FULL;
    d->walk_pos = 0;
}

typedef struct walk_ctx {
    kvd_dirsvc_t *d;
    uint32_t last_ns, last_name;
} walk_ctx_t;

static int walk_one(const kvd_obj_info_t *o, void *arg)
{
    walk_ctx_t *w = arg;
    kvd_dirsvc_t *d = w->d;
    if (o->state != KVD_OBJ_READY)
        return 0;
    if (o->ns != w->last_ns) {
        w->last_ns = o->ns;
        w->last_name = name_of_ns(d, o->ns);
    }
    if (w->last_name == UINT32_MAX)
        return 0;
    if (d->walk == WALK_CHANGED) {
        /* only keys whose owner is another member, or another life of it */
        size_t now = owner_of(d, d->hashes, d->n_mem, w->last_name, o->key);
        size_t was = d->n_old ? owner_of(d, d->old_hashes, d->n_old, w->last_name, o->key)
                              : SIZE_MAX;
        if (was != SIZE_MAX && strcmp(d->old[was].id, d->mem[now].id) == 0 &&
            d->old[was].started_ms == d->mem[now].started_ms)
            return 0;
    }
    queue_push(d, w->last_name, o->key, true);
    return 0;
}

static void walk_slice(kvd_dirsvc_t *d)
{
    if (d->walk == WALK_NONE)
        return;
    walk_ctx_t w = {.d = d, .last_ns = UINT32_MAX, .last_name = UINT32_MAX};
    kvd_store_foreach_from(d->store, UINT32_MAX, &d->walk_pos, WALK_SLICE, walk_one, &w);
    if (d->walk_pos == KVD_STORE_POS_END) {
        if (d->walk == WALK_FULL)
            KVD_INFO("cluster", "directory: announced every stored key to its owner");
        d->walk = WALK_NONE;
    }
}

void kvd_dirsvc_tick(kvd_dirsvc_t *d)
{
    routes_expire(d, kvd_now_ns());
    if (!d->ready)
        return;
    if (d->redo_full && d->walk == WALK_NONE) {
        d->redo_full = false;
        KVD_WARN("cluster",
                 "directory: an announcement failed (%llu so far); telling "
                 "every owner everything again",
                 (unsigned long long)d->announce_failures);
        start_full(d);
    }
    walk_slice(d);
    send_events(d, d->q, d->n_q);
    d->n_q = 0;
}

/* ------------------------------------------------------------- the view */

static int mems_of(const kvd_cluster_view_t *v, mem_t **out, uint64_t **hashes)
{
    *out = NULL;
    *hashes = NULL;
    if (v->n == 0)
        return KVD_OK;
    mem_t *m = kvd_mem_calloc(KVD_MEM_OTHER, v->n, sizeof(*m));
    uint64_t *h = kvd_mem_calloc(KVD_MEM_OTHER, v->n, sizeof(*h));
    if (m == NULL || h == NULL) {
        kvd_mem_free(KVD_MEM_OTHER, m, v->n * sizeof(*m));
        kvd_mem_free(KVD_MEM_OTHER, h, v->n * sizeof(*h));
        return KVD_ERR_NOMEM;
    }
    for (size_t i = 0; i < v->n; i++) {
        kvd_strlcpy(m[i].id, v->members[i].node_id, sizeof(m[i].id));
        kvd_strlcpy(m[i].address, v->members[i].address, sizeof(m[i].address));
        m[i].started_ms = v->members[i].started_unix_ms;
        m[i].hash = h[i] = kvd_node_hash(m[i].id);
    }
    *out = m;
    *hashes = h;
    return KVD_OK;
}

static void mems_free(mem_t **m, uint64_t **h, size_t *n)
{
    if (*m != NULL)
        kvd_mem_free(KVD_MEM_OTHER, *m, *n * sizeof(**m));
    if (*h != NULL)
        kvd_mem_free(KVD_MEM_OTHER, *h, *n * sizeof(**h));
    *m = NULL;
    *h = NULL;
    *n = 0;
}

/* The member of that id in m (sorted by id, as the view is), or NULL. */
static const mem_t *mem_find(const mem_t *m, size_t n, const char *id)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int cmp = strcmp(m[mid].id, id);
        if (cmp == 0)
            return &m[mid];
        if (cmp < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

void kvd_dirsvc_view(kvd_dirsvc_t *d, const kvd_cluster_view_t *v)
{
    bool ready = v->state == KVD_CLUSTER_READY;
    if (!ready) {
        if (d->ready)
            KVD_INFO("cluster", "directory: paused while the cluster is %s",
                     kvd_cluster_state_name(v->state));
        d->ready = false;
        d->n_q = 0;
        d->walk = WALK_NONE;
        d->view_gen++; /* nothing cached is trusted when back */
        return;        /* the members stay as they were, for the comparison when back */
    }
    mem_t *m;
    uint64_t *h;
    if (mems_of(v, &m, &h) != KVD_OK)
        return; /* the next view tries again */
    /* what changed: members gone (or restarted), members new (or restarted) */
    uint64_t *joiners = kvd_mem_calloc(KVD_MEM_STAGING, v->n + 1, sizeof(uint64_t));
    size_t n_join = 0, n_gone = 0;
    for (size_t i = 0; i < d->n_mem; i++) {
        const mem_t *now = mem_find(m, v->n, d->mem[i].id);
        if (now == NULL || now->started_ms != d->mem[i].started_ms) {
            kvd_dir_holder_gone(d->share, d->mem[i].id);
            if (now == NULL)
                kvd_peers_forget(d->peers, d->mem[i].id);
            n_gone++;
        }
    }
    for (size_t i = 0; i < v->n; i++) {
        const mem_t *was = mem_find(d->mem, d->n_mem, m[i].id);
        if (was == NULL || was->started_ms != m[i].started_ms) {
            if (joiners != NULL && strcmp(m[i].id, d->self) != 0)
                joiners[n_join] = m[i].hash;
            n_join += joiners != NULL && strcmp(m[i].id, d->self) != 0;
        } else {
            m[i].reset_gen = was->reset_gen; /* the same life got it already */
        }
    }
    if (n_join > 0 && d->ready)
        kvd_dir_drop_moved(d->share, d->self_hash, joiners, n_join);
    kvd_mem_free(KVD_MEM_STAGING, joiners, (v->n + 1) * sizeof(uint64_t));
    bool changed = n_gone > 0 || n_join > 0;
    if (changed || !d->ready)
        d->view_gen++; /* mem's indices change: the cache's entries are void */
    if (!d->ready || d->walk != WALK_NONE) {
        /* back from degraded or joining, or a change in the middle of a
         * walk: tell everything again */
        mems_free(&d->old, &d->old_hashes, &d->n_old);
        mems_free(&d->mem, &d->hashes, &d->n_mem);
        d->mem = m;
        d->hashes = h;
        d->n_mem = v->n;
        d->n_q = 0;
        start_full(d);
    } else if (changed) {
        mems_free(&d->old, &d->old_hashes, &d->n_old);
        d->old = d->mem;
        d->old_hashes = d->hashes;
        d->n_old = d->n_mem;
        d->mem = m;
        d->hashes = h;
        d->n_mem = v->n;
        d->walk = WALK_CHANGED;
        d->walk_pos = 0;
    } else {
        mems_free(&d->mem, &d->hashes, &d->n_mem);
        d->mem = m;
        d->hashes = h;
        d->n_mem = v->n;
    }
    d->ready = true;
}

/* ------------------------------------------------------------- serving */

void kvd_dirsvc_serve_announce(kvd_dirsvc_t *d, const kvd_msg_t *req, kvd_msg_t *rep)
{
    uint64_t entries = 0;
    int rc = kvd_dir_announce(d->share, &req->body.dir_announce_req, &entries);
    if (rc != KVD_OK) {
        kvd_msg_clear(rep); /* what the reply held so far */
        kvd_msg_error(rep, req->id, req->method, rc, "directory: %s", kvd_status_str(rc));
        return;
    }
    rep->body.dir_announce_rep.entries = entries;
}

void kvd_dirsvc_serve_local(kvd_dirsvc_t *d, const kvd_msg_t *req, kvd_msg_t *rep)
{
    int rc = kvd_dir_lookup_local(d->share, &req->body.dir_lookup_req, rep);
    if (rc != KVD_OK) {
        kvd_msg_clear(rep); /* what the reply held so far */
        kvd_msg_error(rep, req->id, req->method, rc, "directory: %s", kvd_status_str(rc));
    }
}

uint64_t kvd_dirsvc_entries(const kvd_dirsvc_t *d)
{
    return kvd_dir_entries(d->share);
}

const char *kvd_dirsvc_address(const kvd_dirsvc_t *d, const char *node_id)
{
    const mem_t *m = d->ready ? mem_find(d->mem, d->n_mem, node_id) : NULL;
    return m ? m->address : NULL;
}

bool kvd_dirsvc_is_self(const kvd_dirsvc_t *d, const char *node_id)
{
    return strcmp(d->self, node_id) == 0;
}

void kvd_dirsvc_not_here(kvd_dirsvc_t *d, const char *tenant, const char *ns,
                         const uint8_t key[KVD_KEY_BYTES])
{
    if (!d->ready)
        return;
    uint32_t name = name_intern(d, tenant, ns);
    if (name != UINT32_MAX)
        queue_push(d, name, key, false);
}

void kvd_dirsvc_counters(const kvd_dirsvc_t *d, kvd_cluster_counters_t *out)
{
    out->directory_entries = kvd_dir_entries(d->share);
    out->announced_keys = d->announced;
    out->announce_failures = d->announce_failures;
    out->announce_queued = d->n_q;
    out->peer_pending = kvd_peers_pending(d->peers);
    out->dir_cache_hits = d->cache_hits;
    out->dir_cache_misses = d->cache_misses;
    out->dir_cache_stale = d->cache_stale;
}

bool kvd_dirsvc_other_live(const kvd_dirsvc_t *d, const char *node_id)
{
    return !kvd_dirsvc_is_self(d, node_id) && kvd_dirsvc_address(d, node_id) != NULL;
}

bool kvd_dirsvc_ready(const kvd_dirsvc_t *d)
{
    return d->ready;
}

uint64_t kvd_dirsvc_queued(const kvd_dirsvc_t *d)
{
    return d->n_q;
}

/* ------------------------------------------------------------- cache */

/*
 * The asker's cache: a routed lookup that may take any holder (the Lookup
 * and Acquire of this daemon's workers) answers each key a member other
 * than this one was found to hold, at most cache_ttl_ns ago in the same
 * membership, from here, and asks the owners only for the others. So a
 * prefix that many requests share (a system prompt) costs one round trip
 * to the owners per TTL, not one per Lookup. The price is the TTL: a key
 * its holder evicted meanwhile is still named here, so the Acquire's fetch
 * finds it gone and fails cleanly (kvd_dirsvc_stale drops the entry), as
 * it does for an owner's entry whose removal is not announced yet. That
 * member is then remembered as without the key for a TTL, and taken out
 * of every routed answer for it: the owners may not have heard of the
 * eviction yet, and would otherwise name it again (and the cache learn it
 * again for a whole TTL). A member that publishes the key again meanwhile
 * is passed over until then: a missed hit, never a failed load.
 * Entries are never trusted across a membership change (view_gen).
 */

static uint64_t mix64(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static centry_t *cache_set(const kvd_dirsvc_t *d, uint64_t dir_hash)
{
    return &d->cache[(mix64(dir_hash ^ d->cache_seed) & (CACHE_SETS - 1)) * CACHE_WAYS];
}

static centry_t *cache_find(const kvd_dirsvc_t *d, uint32_t name, uint64_t dir_hash,
                            const uint8_t *key)
{
    centry_t *set = cache_set(d, dir_hash);
    for (int w = 0; w < CACHE_WAYS; w++)
        if (set[w].view == d->view_gen && set[w].name == name &&
            memcmp(set[w].key, key, KVD_KEY_BYTES) == 0)
            return &set[w];
    return NULL;
}

/* The live member index that holds key, or -1. */
static int cache_get(kvd_dirsvc_t *d, uint32_t name, uint64_t dir_hash,
                     const uint8_t *key, uint64_t now_ns)
{
    centry_t *e = cache_find(d, name, dir_hash, key);
    if (e == NULL || e->expires_ns <= now_ns || e->holder >= d->n_mem) {
        d->cache_misses++;
        return -1;
    }
    d->cache_hits++;
    return (int)e->holder;
}

/* key's entry: the one there is, else a fresh one (no holder, nothing
 * gone, expired) in an empty way, or in the one that expires first. */
static centry_t *cache_slot(kvd_dirsvc_t *d, uint32_t name, uint64_t dir_hash,
                            const uint8_t *key)
{
    centry_t *e = cache_find(d, name, dir_hash, key);
    if (e != NULL)
        return e;
    centry_t *set = cache_set(d, dir_hash);
    e = &set[0];
    for (int w = 0; w < CACHE_WAYS; w++) {
        if (set[w].view != d->view_gen) {
            e = &set[w];
            break;
        }
        if (set[w].expires_ns < e->expires_ns)
            e = &set[w];
    }
    memcpy(e->key, key, KVD_KEY_BYTES);
    e->name = name;
    e->view = d->view_gen;
    e->holder = UINT32_MAX;
    e->gone = 0;
    e->expires_ns = 0;
    return e;
}

/* A live entry's member found without the key (UINT32_MAX: none). */
static uint32_t cache_gone(const kvd_dirsvc_t *d, uint32_t name, uint64_t dir_hash,
                           const uint8_t *key, uint64_t now_ns)
{
    const centry_t *e = cache_find(d, name, dir_hash, key);
    return e != NULL && e->gone != 0 && e->expires_ns > now_ns ? e->gone - 1 : UINT32_MAX;
}

/* Learns that member `holder` has key; false when it was found without it
 * within the TTL (not learned: the owners' word is older than that). */
static bool cache_put(kvd_dirsvc_t *d, uint32_t name, uint64_t dir_hash,
                      const uint8_t *key, uint32_t holder, uint64_t now_ns)
{
    centry_t *e = cache_slot(d, name, dir_hash, key);
    bool gone_live = e->gone != 0 && e->expires_ns > now_ns;
    if (gone_live && e->gone - 1 == holder)
        return false;
    e->holder = holder;
    if (!gone_live) { /* a live one keeps its end: it is not renewed here */
        e->gone = 0;
        e->expires_ns = now_ns + d->cache_ttl_ns;
    }
    return true;
}

int kvd_dirsvc_set_cache(kvd_dirsvc_t *d, uint64_t ttl_ms)
{
    if (ttl_ms == 0 || d->cache != NULL)
        return KVD_OK;
    d->cache =
        kvd_mem_calloc(KVD_MEM_OTHER, (size_t)CACHE_SETS * CACHE_WAYS, sizeof(centry_t));
    if (d->cache == NULL)
        return KVD_ERR_NOMEM;
    if (getrandom(&d->cache_seed, sizeof(d->cache_seed), 0) != sizeof(d->cache_seed))
        d->cache_seed = kvd_now_ns() * 0x9e3779b97f4a7c15ull;
    d->cache_ttl_ns = ttl_ms * 1000000ull;
    return KVD_OK;
}

void kvd_dirsvc_stale(kvd_dirsvc_t *d, const char *tenant, const char *ns,
                      const uint8_t key[KVD_KEY_BYTES], const char *holder)
{
    if (d->cache == NULL || !d->ready)
        return;
    uint32_t name = name_intern(d, tenant, ns);
    if (name == UINT32_MAX)
        return;
    uint64_t h = kvd_dir_hash(tenant, ns, key);
    const mem_t *m = holder != NULL ? mem_find(d->mem, d->n_mem, holder) : NULL;
    if (m == NULL) { /* no member said so: only what was learned goes */
        centry_t *e = cache_find(d, name, h, key);
        if (e != NULL && e->holder != UINT32_MAX) {
            e->holder = UINT32_MAX;
            d->cache_stale++;
        }
        return;
    }
    centry_t *e = cache_slot(d, name, h, key);
    e->holder = UINT32_MAX;
    e->gone = (uint32_t)(m - d->mem) + 1;
    e->expires_ns = kvd_now_ns() + d->cache_ttl_ns;
    d->cache_stale++;
}

/* ------------------------------------------------------------- routing */

/* One routed lookup: the merged answer being built, and how many owners
 * are still to answer. */
typedef struct route {
    kvd_dirsvc_t *d;
    kvd_dirsvc_done_fn fn;
    void *arg;
    bool answered;             /* fn ran (all answers in, or the deadline) */
    uint64_t deadline_ns;      /* fn runs by then with what came */
    struct route *prev, *next; /* the service's routes not yet answered */
    kvd_msg_t rep;             /* the merged reply; its arena holds everything below */
    size_t waiting;
    /* per sub-request (one per remote owner): where its keys came from */
    size_t n_subs;
    size_t **sub_q;  /* [sub][sub query] -> query */
    size_t ***sub_k; /* [sub][sub query][key] -> key index */
    size_t **sub_nk; /* [sub][sub query] -> keys asked (sub_k's length) */
    size_t *sub_nq;
    /* per query and key, for the cache: what the owners were asked */
    bool any;      /* any one holder answers a key (kvd_dirsvc_route) */
    uint32_t view; /* d->view_gen when asked */
    size_t n_q;
    uint32_t *names;  /* [query] -> interned name (UINT32_MAX: none) */
    kvd_key_t **keys; /* [query] -> its keys (copies) */
    uint64_t **dh;    /* [query][key] -> kvd_dir_hash */
    uint32_t **own;   /* [query][key] -> owner asked (UINT32_MAX: none) */
} route_t;

/* Bit of node id in the merged reply (added when new); -1 when full. */
static int node_bit(kvd_dir_lookup_rep_t *r, const char *id)
{
    for (size_t i = 0; i < r->n_nodes; i++)
        if (strcmp(r->nodes[i], id) == 0)
            return (int)i;
    if (r->n_nodes == KVD_DIR_NODES_MAX)
        return -1;
    kvd_strlcpy(r->nodes[r->n_nodes], id, sizeof(r->nodes[0]));
    return (int)r->n_nodes++;
}

/* Takes out of the owners' answers the members found without a key since
 * (cache_gone), and puts into the cache what remains: for each key asked,
 * the first holder that is a live member other than this one. */
static void route_learn(route_t *rt)
{
    kvd_dirsvc_t *d = rt->d;
    if (d->cache == NULL || !d->ready || rt->view != d->view_gen)
        return;
    const kvd_dir_lookup_rep_t *r = &rt->rep.body.dir_lookup_rep;
    int idx[KVD_DIR_NODES_MAX];
    for (size_t b = 0; b < r->n_nodes && b < KVD_DIR_NODES_MAX; b++) {
        const mem_t *m = strcmp(r->nodes[b], d->self) == 0
                             ? NULL
                             : mem_find(d->mem, d->n_mem, r->nodes[b]);
        idx[b] = m != NULL ? (int)(m - d->mem) : -1;
    }
    uint64_t now = kvd_now_ns();
    for (size_t q = 0; q < rt->n_q; q++) {
        if (rt->names[q] == UINT32_MAX)
            continue;
        for (size_t i = 0; i < r->n_holders[q]; i++) {
            if (rt->own[q][i] == UINT32_MAX)
                continue; /* not asked: this store's, or the cache's */
            uint32_t gone =
                cache_gone(d, rt->names[q], rt->dh[q][i], rt->keys[q][i], now);
            for (size_t b = 0;
                 gone != UINT32_MAX && b < r->n_nodes && b < KVD_DIR_NODES_MAX; b++)
                if (idx[b] >= 0 && (uint32_t)idx[b] == gone)
                    r->holders[q][i] &= ~(1ull << b);
            uint64_t bits = r->holders[q][i];
            for (size_t b = 0; bits != 0 && b < r->n_nodes && b < KVD_DIR_NODES_MAX; b++)
                if (bits >> b & 1 && idx[b] >= 0 &&
                    cache_put(d, rt->names[q], rt->dh[q][i], rt->keys[q][i],
                              (uint32_t)idx[b], now))
                    break;
        }
    }
}

/* Answers (once: all owners answered, or the deadline came); frees the
 * route when no owner's answer is still to come. */
static void route_answer(route_t *rt)
{
    if (!rt->answered) {
        rt->answered = true;
        route_learn(rt);
        kvd_dirsvc_t *d = rt->d;
        if (rt->prev != NULL)
            rt->prev->next = rt->next;
        else
            d->routes = rt->next;
        if (rt->next != NULL)
            rt->next->prev = rt->prev;
        rt->fn(rt->arg, &rt->rep);
    }
    if (rt->waiting == 0) {
        kvd_msg_clear(&rt->rep);
        kvd_mem_free(KVD_MEM_STAGING, rt, sizeof(*rt));
    }
}

/* Answers the routes whose deadline passed with what their owners said so
 * far (those late count as knowing nothing). */
static void routes_expire(kvd_dirsvc_t *d, uint64_t now_ns)
{
    for (route_t *rt = d->routes, *next; rt != NULL; rt = next) {
        next = rt->next;
        if (rt->deadline_ns <= now_ns) {
            route_answer(rt);
        }
    }
}

/* Merges a sub-request's answer (ans, for sub s) into the reply. */
static void route_merge(route_t *rt, size_t s, const kvd_dir_lookup_rep_t *ans)
{
    kvd_dir_lookup_rep_t *r = &rt->rep.body.dir_lookup_rep;
    int map[KVD_DIR_NODES_MAX];
    for (size_t i = 0; i < ans->n_nodes && i < KVD_DIR_NODES_MAX; i++)
        map[i] = node_bit(r, ans->nodes[i]);
    for (size_t sq = 0; sq < ans->n && sq < rt->sub_nq[s]; sq++) {
        size_t q = rt->sub_q[s][sq];
        /* an answer is the peer's: never more keys than were asked */
        size_t nk = KVD_MIN(ans->n_holders[sq], rt->sub_nk[s][sq]);
        for (size_t k = 0; k < nk; k++) {
            uint64_t bits = ans->holders[sq][k];
            uint64_t out = 0;
            for (size_t b = 0; b < ans->n_nodes && b < KVD_DIR_NODES_MAX; b++)
                if (bits >> b & 1 && map[b] >= 0)
                    out |= 1ull << map[b];
            r->holders[q][rt->sub_k[s][sq][k]] |= out;
        }
    }
}

typedef struct sub_arg {
    route_t *rt;
    size_t s;
} sub_arg_t;

static void route_sub_done(void *arg, int status, kvd_msg_t *rep)
{
    sub_arg_t *sa = arg;
    route_t *rt = sa->rt;
    if (status == KVD_OK && rep->status == KVD_OK && !rt->answered)
        route_merge(rt, sa->s, &rep->body.dir_lookup_rep);
    if (--rt->waiting == 0)
        route_answer(rt);
}

int kvd_dirsvc_route(kvd_dirsvc_t *d, const kvd_dir_lookup_req_t *req, bool any,
                     kvd_dirsvc_done_fn fn, void *arg)
{
    route_t *rt = kvd_mem_calloc(KVD_MEM_STAGING, 1, sizeof(*rt));
    if (rt == NULL)
        return KVD_ERR_NOMEM;
    rt->d = d;
    rt->fn = fn;
    rt->arg = arg;
    rt->any = any;
    rt->view = d->view_gen;
    uint64_t now = kvd_now_ns();
    rt->deadline_ns = now + ROUTE_DEADLINE_NS;
    rt->next = d->routes;
    if (d->routes != NULL)
        d->routes->prev = rt;
    d->routes = rt;
    kvd_msg_t *m = &rt->rep;
    kvd_dir_lookup_rep_t *r = &m->body.dir_lookup_rep;
    size_t nm = d->ready ? d->n_mem : 0;
    r->nodes = kvd_msg_alloc(m, KVD_DIR_NODES_MAX * sizeof(*r->nodes));
    r->n_holders = kvd_msg_alloc(m, req->n * sizeof(size_t) + 1);
    r->holders = kvd_msg_alloc(m, req->n * sizeof(uint64_t *) + 1);
    rt->sub_q = kvd_msg_alloc(m, (nm + 1) * sizeof(size_t *));
    rt->sub_k = kvd_msg_alloc(m, (nm + 1) * sizeof(size_t **));
    rt->sub_nk = kvd_msg_alloc(m, (nm + 1) * sizeof(size_t *));
    rt->sub_nq = kvd_msg_alloc(m, (nm + 1) * sizeof(size_t));
    rt->names = kvd_msg_alloc(m, req->n * sizeof(uint32_t) + 1);
    rt->keys = kvd_msg_alloc(m, req->n * sizeof(kvd_key_t *) + 1);
    rt->dh = kvd_msg_alloc(m, req->n * sizeof(uint64_t *) + 1);
    rt->own = kvd_msg_alloc(m, req->n * sizeof(uint32_t *) + 1);
    bool ok = r->nodes && r->n_holders && r->holders && rt->sub_q && rt->sub_k &&
              rt->sub_nk && rt->sub_nq && rt->names && rt->keys && rt->dh && rt->own;
    r->n = req->n;
    /* per key: this daemon's own store first (what it holds it knows for
     * sure), then, when any holder will do, the cache; the owner of each
     * key still unknown is asked */
    for (size_t q = 0; ok && q < req->n; q++) {
        const kvd_dir_keys_t *k = &req->queries[q];
        size_t nk = k->n_added;
        r->holders[q] = kvd_msg_alloc(m, nk * sizeof(uint64_t) + 1);
        rt->keys[q] = kvd_msg_alloc(m, nk * sizeof(kvd_key_t) + 1);
        rt->dh[q] = kvd_msg_alloc(m, nk * sizeof(uint64_t) + 1);
        rt->own[q] = kvd_msg_alloc(m, nk * sizeof(uint32_t) + 1);
        ok = r->holders[q] && rt->keys[q] && rt->dh[q] && rt->own[q];
        if (!ok)
            break;
        rt->n_q = q + 1;
        r->n_holders[q] = nk;
        memset(r->holders[q], 0, nk * sizeof(uint64_t));
        memcpy(rt->keys[q], k->added, nk * sizeof(kvd_key_t));
        rt->names[q] =
            d->cache != NULL ? name_intern(d, k->tenant, k->ns_name) : UINT32_MAX;
        uint32_t tenant, ns;
        bool local = kvd_store_tenant_find(d->store, k->tenant, &tenant) == KVD_OK &&
                     kvd_store_ns_find(d->store, tenant, k->ns_name, &ns) == KVD_OK;
        int bit = -1;
        for (size_t i = 0; i < nk; i++) {
            uint64_t h = kvd_dir_hash(k->tenant, k->ns_name, k->added[i]);
            rt->dh[q][i] = h;
            kvd_obj_info_t info;
            if (local && kvd_store_inspect(d->store, ns, k->added[i], &info) == KVD_OK &&
                info.state == KVD_OBJ_READY) {
                if (bit < 0)
                    bit = node_bit(r, d->self);
                if (bit >= 0)
                    r->holders[q][i] |= 1ull << bit;
            }
            if (any && r->holders[q][i] == 0 && nm > 0 && rt->names[q] != UINT32_MAX) {
                int c = cache_get(d, rt->names[q], h, k->added[i], now);
                int b = c >= 0 ? node_bit(r, d->mem[c].id) : -1;
                if (b >= 0)
                    r->holders[q][i] |= 1ull << b;
            }
            rt->own[q][i] = nm == 0 || (any && r->holders[q][i] != 0)
                                ? UINT32_MAX
                                : (uint32_t)kvd_rendezvous_owner(h, d->hashes, d->n_mem);
        }
    }
    if (!ok) {
        d->routes = rt->next;
        if (rt->next != NULL)
            rt->next->prev = NULL;
        kvd_msg_clear(m);
        kvd_mem_free(KVD_MEM_STAGING, rt, sizeof(*rt));
        return KVD_ERR_NOMEM;
    }
    /* then one request per owner: this daemon's share is asked in place */
    rt->waiting = 1; /* held until every request is out */
    for (size_t o = 0; o < nm; o++) {
        kvd_msg_t sub = {0};
        kvd_msg_request(&sub, 0, KVD_METHOD_DIR_LOOKUP);
        kvd_dir_lookup_req_t *sr = &sub.body.dir_lookup_req;
        sr->local = true;
        sr->queries = kvd_msg_alloc(&sub, req->n * sizeof(*sr->queries) + 1);
        size_t *sq = kvd_msg_alloc(m, req->n * sizeof(size_t) + 1);
        size_t **sk = kvd_msg_alloc(m, req->n * sizeof(size_t *) + 1);
        size_t *snk = kvd_msg_alloc(m, req->n * sizeof(size_t) + 1);
        if (!sr->queries || !sq || !sk || !snk) {
            kvd_msg_clear(&sub);
            continue;
        }
        for (size_t q = 0; q < req->n; q++) {
            const kvd_dir_keys_t *k = &req->queries[q];
            size_t cnt = 0;
            for (size_t i = 0; i < k->n_added; i++)
                cnt += rt->own[q][i] == o;
            if (cnt == 0)
                continue;
            kvd_dir_keys_t *dk = &sr->queries[sr->n];
            kvd_strlcpy(dk->tenant, k->tenant, sizeof(dk->tenant));
            kvd_strlcpy(dk->ns_name, k->ns_name, sizeof(dk->ns_name));
            dk->added = kvd_msg_alloc(&sub, cnt * sizeof(kvd_key_t));
            size_t *map = kvd_msg_alloc(m, cnt * sizeof(size_t));
            if (!dk->added || !map)
                break;
            for (size_t i = 0; i < k->n_added; i++) {
                if (rt->own[q][i] != o)
                    continue;
                memcpy(dk->added[dk->n_added], k->added[i], KVD_KEY_BYTES);
                map[dk->n_added++] = i;
            }
            sq[sr->n] = q;
            sk[sr->n] = map;
            snk[sr->n] = dk->n_added;
            sr->n++;
        }
        if (sr->n == 0) {
            kvd_msg_clear(&sub);
            continue;
        }
        size_t s = rt->n_subs++;
        rt->sub_q[s] = sq;
        rt->sub_k[s] = sk;
        rt->sub_nk[s] = snk;
        rt->sub_nq[s] = sr->n;
        if (strcmp(d->mem[o].id, d->self) == 0) {
            kvd_msg_t ans = {0};
            if (kvd_dir_lookup_local(d->share, sr, &ans) == KVD_OK)
                route_merge(rt, s, &ans.body.dir_lookup_rep);
            kvd_msg_clear(&ans);
            kvd_msg_clear(&sub);
            continue;
        }
        sub_arg_t *sa = kvd_msg_alloc(m, sizeof(*sa));
        if (sa == NULL) {
            kvd_msg_clear(&sub);
            continue;
        }
        *sa = (sub_arg_t){rt, s};
        rt->waiting++;
        kvd_peers_send(d->peers, d->mem[o].id, d->mem[o].address, &sub, route_sub_done,
                       sa);
    }
    if (--rt->waiting == 0)
        route_answer(rt);
    return KVD_OK;
}

/* ------------------------------------------------------------- lifecycle */

int kvd_dirsvc_create(kvd_store_t *store, kvd_peers_t *peers, const char *self_id,
                      kvd_dirsvc_t **out)
{
    kvd_dirsvc_t *d = kvd_mem_calloc(KVD_MEM_OTHER, 1, sizeof(*d));
    if (d == NULL)
        return KVD_ERR_NOMEM;
    int rc = kvd_dir_create(&d->share);
    if (rc != KVD_OK) {
        kvd_mem_free(KVD_MEM_OTHER, d, sizeof(*d));
        return rc;
    }
    d->store = store;
    d->peers = peers;
    kvd_strlcpy(d->self, self_id, sizeof(d->self));
    d->self_hash = kvd_node_hash(self_id);
    d->view_gen = 1;
    kvd_store_set_presence(store, on_presence, d);
    *out = d;
    return KVD_OK;
}

void kvd_dirsvc_destroy(kvd_dirsvc_t *d)
{
    if (d == NULL)
        return;
    kvd_store_set_presence(d->store, NULL, NULL);
    kvd_dir_destroy(d->share);
    mems_free(&d->mem, &d->hashes, &d->n_mem);
    mems_free(&d->old, &d->old_hashes, &d->n_old);
    kvd_mem_free(KVD_MEM_OTHER, d->names, d->names_cap * sizeof(*d->names));
    kvd_mem_free(KVD_MEM_STAGING, d->q, d->q_cap * sizeof(*d->q));
    kvd_mem_free(KVD_MEM_OTHER, d->cache,
                 (size_t)CACHE_SETS * CACHE_WAYS * sizeof(centry_t));
    kvd_mem_free(KVD_MEM_OTHER, d, sizeof(*d));
}
