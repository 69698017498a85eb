/*
 * rpc_store.c - the store's RPC methods (DESIGN.md sections 4, 5 and 8):
 * RegisterNamespace, Lookup, Reserve, Publish, Revoke, Acquire, Release,
 * ListPrefixes, Inspect, Evict.
 *
 * Each request is checked here before the engine sees it: batch lengths
 * against --max-batch, namespace ids, object sizes a client states. A
 * refused request changes nothing and gets a typed error naming the item.
 * The connection id is the owner of every lease taken on its behalf, so the
 * server can undo them all when the connection goes.
 *
 * Tenancy: a connection sees and touches only its tenant's namespaces. An
 * id or name of another tenant's namespace answers exactly as one that does
 * not exist (same status, same text), so that tenants cannot probe each
 * other. Lookup, Reserve and Acquire are always scoped to the tenant;
 * operators see every tenant in the inspection methods (ListPrefixes,
 * Inspect, Evict, the namespace tables), and only they evict across tenants:
 * a non-operator's "evict --all" evicts its own tenant's objects. A
 * read-only connection may not Reserve, Publish, Revoke or Evict.
 */
#include "rpc_store.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void set_error(const kvd_msg_t *req, kvd_msg_t *rep, int status, uint32_t index,
                      const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static void set_error(const kvd_msg_t *req, kvd_msg_t *rep, int status, uint32_t index,
                      const char *fmt, ...)
{
    kvd_msg_clear(rep);
    rep->id = req->id;
    rep->method = req->method;
    rep->reply = true;
    rep->status = status;
    rep->error_index = index;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(rep->error, sizeof(rep->error), fmt, ap);
    va_end(ap);
}

static bool check_batch(const kvd_opts_t *opts, size_t n, const kvd_msg_t *req,
                        kvd_msg_t *rep)
{
    if (n <= opts->max_batch)
        return true;
    set_error(req, rep, KVD_ERR_TOO_LARGE, 0,
              "batch of %zu keys is over --max-batch %llu", n,
              (unsigned long long)opts->max_batch);
    return false;
}

/* Whether a namespace of `tenant` is within ctx's sight: its own tenant's,
 * or any for an operator where `operator_sees_all`. NULL ctx: everything
 * (the daemon's own views, such as /metrics). */
static bool ns_visible(const kvd_rpc_ctx_t *ctx, uint32_t tenant, bool operator_sees_all)
{
    return ctx == NULL || tenant == ctx->tenant ||
           (operator_sees_all && ctx->is_operator);
}

/* The namespace exists, is ctx's tenant's and, when the client states a
 * size, has it. Another tenant's answers as an unknown one. */
static bool check_ns(kvd_store_t *store, const kvd_rpc_ctx_t *ctx, uint32_t ns,
                     uint64_t object_bytes, const kvd_msg_t *req, kvd_msg_t *rep)
{
    kvd_ns_info_t info;
    if (kvd_store_ns_info(store, ns, &info) != KVD_OK ||
        !ns_visible(ctx, info.tenant, false)) {
        set_error(req, rep, KVD_ERR_NOT_FOUND, 0, "unknown namespace id %u", ns);
        return false;
    }
    if (object_bytes != 0 && object_bytes != info.object_bytes) {
        set_error(req, rep, KVD_ERR_INVALID, 0,
                  "namespace %s has objects of %llu bytes, not %llu", info.name,
                  (unsigned long long)info.object_bytes,
                  (unsigned long long)object_bytes);
        return false;
    }
    return true;
}

static bool name_ok(const char *name)
{
    if (*name == '\0')
        return false;
    for (const char *p = name; *p; p++)
        if (!isprint((unsigned char)*p))
            return false;
    return true;
}

/* The names of one batch, hashed once, so that finding a name's first
 * spec costs a probe rather than a comparison with every earlier spec (a
 * batch of 4,096 would compare millions of names while the loop waits).
 * Slot values: spec index + 1; 0 is empty. The hash is keyed with a value
 * only this store knows, so that clients cannot choose names that pile up
 * in one place. */
typedef struct name_set {
    uint32_t *slots;
    size_t mask;
    uint64_t key;
} name_set_t;

static uint64_t name_hash(const name_set_t *t, const char *s)
{
    uint64_t h = t->key;
    for (; *s; s++) {
        h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
        h ^= h >> 31;
    }
    return h * 0x9e3779b97f4a7c15ull ^ (h >> 29);
}

static int name_set_init(name_set_t *t, size_t n, uint64_t key)
{
    t->key = key;
    size_t cap = 16;
    while (cap < 2 * n)
        cap *= 2;
    t->slots = kvd_mem_calloc(KVD_MEM_STAGING, cap, sizeof(uint32_t));
    t->mask = cap - 1;
    return t->slots ? KVD_OK : KVD_ERR_NOMEM;
}

static void name_set_fini(name_set_t *t)
{
    kvd_mem_free(KVD_MEM_STAGING, t->slots, (t->mask + 1) * sizeof(uint32_t));
}

/* The slot for name: holding its value, or the empty one where it goes;
 * name_of(value) gives a stored value's name. */
static uint32_t *name_set_slot(name_set_t *t, const char *name,
                               const char *(*name_of)(const void *, uint32_t),
                               const void *arg)
{
    for (size_t i = name_hash(t, name) & t->mask;; i = (i + 1) & t->mask)
        if (t->slots[i] == 0 || strcmp(name_of(arg, t->slots[i] - 1), name) == 0)
            return &t->slots[i];
}

static const char *spec_name(const void *arg, uint32_t i)
{
    return ((const kvd_ns_spec_t *)arg)[i].name;
}

/* Why spec i cannot be registered beside the existing namespaces and the
 * earlier specs of its batch (first: the first spec of its name); false
 * when it can. */
static bool spec_refused(kvd_store_t *store, uint32_t tenant, const kvd_ns_spec_t *specs,
                         size_t i, size_t first, uint64_t pool_bytes,
                         const kvd_msg_t *req, kvd_msg_t *rep)
{
    const kvd_ns_spec_t *sp = &specs[i];
    uint32_t idx = (uint32_t)i + 1;
    if (!name_ok(sp->name)) {
        set_error(req, rep, KVD_ERR_INVALID, idx,
                  "namespace %zu: the name must be printable and non-empty", i);
        return true;
    }
    kvd_ns_info_t have = {0};
    uint32_t id;
    if (kvd_store_ns_find(store, tenant, sp->name, &id) == KVD_OK)
        kvd_store_ns_info(store, id, &have);
    else if (first < i)
        have = (kvd_ns_info_t){.object_bytes = specs[first].object_bytes,
                               .rank_replicated = specs[first].rank_replicated};
    if (have.object_bytes != 0 && (have.object_bytes != sp->object_bytes ||
                                   have.rank_replicated != sp->rank_replicated)) {
        set_error(req, rep, KVD_ERR_INVALID, idx,
                  "namespace %s exists with %llu-byte objects%s; cannot re-register it "
                  "with %llu%s",
                  sp->name, (unsigned long long)have.object_bytes,
                  have.rank_replicated ? " (rank-replicated)" : "",
                  (unsigned long long)sp->object_bytes,
                  sp->rank_replicated ? " (rank-replicated)" : "");
        return true;
    }
    if (sp->object_bytes == 0 || sp->object_bytes > pool_bytes) {
        set_error(req, rep, KVD_ERR_INVALID, idx,
                  "namespace %s: objects of %llu bytes; they must be 1 byte to the pool "
                  "size (%llu)",
                  sp->name, (unsigned long long)sp->object_bytes,
                  (unsigned long long)pool_bytes);
        return true;
    }
    return false;
}

int kvd_rpc_register(kvd_store_t *store, const kvd_rpc_ctx_t *ctx,
                     const kvd_ns_spec_t *specs, size_t n, uint32_t *ids,
                     const kvd_msg_t *req, kvd_msg_t *rep)
{
    kvd_store_stats_t st;
    kvd_store_stats(store, &st);
    /* first[i]: the first spec of the batch with spec i's name */
    name_set_t batch = {0};
    uint32_t *first = kvd_mem_calloc(KVD_MEM_STAGING, n + 1, sizeof(uint32_t));
    uint64_t key = kvd_store_pos_check(store, 0x6e616d6573ull /* "names" */, 0);
    if (first == NULL || name_set_init(&batch, n, key) != KVD_OK) {
        kvd_mem_free(KVD_MEM_STAGING, first, (n + 1) * sizeof(uint32_t));
        set_error(req, rep, KVD_ERR_NOMEM, 0, "out of memory");
        return KVD_ERR_NOMEM;
    }
    int rc = KVD_OK;
    /* all checked before any is registered: a refused batch changes nothing */
    size_t fresh = 0;
    for (size_t i = 0; i < n && rc == KVD_OK; i++) {
        uint32_t *slot = name_set_slot(&batch, specs[i].name, spec_name, specs);
        if (*slot == 0)
            *slot = (uint32_t)i + 1;
        first[i] = *slot - 1;
        if (spec_refused(store, ctx->tenant, specs, i, first[i], st.pool_bytes, req,
                         rep)) {
            rc = rep->status;
            break;
        }
        uint32_t id;
        fresh += first[i] == i &&
                 kvd_store_ns_find(store, ctx->tenant, specs[i].name, &id) != KVD_OK;
    }
    name_set_fini(&batch);
    kvd_mem_free(KVD_MEM_STAGING, first, (n + 1) * sizeof(uint32_t));
    if (rc != KVD_OK)
        return rc;
    if (kvd_store_ns_count(store) + fresh > KVD_STORE_MAX_NAMESPACES) {
        set_error(req, rep, KVD_ERR_NO_SPACE, 0, "too many namespaces (at most %d)",
                  KVD_STORE_MAX_NAMESPACES);
        return KVD_ERR_NO_SPACE;
    }
    kvd_tenant_limits_t lim;
    kvd_tenant_usage_t use;
    if (kvd_store_tenant_usage(store, ctx->tenant, &lim, &use) != KVD_OK) {
        set_error(req, rep, KVD_ERR_AUTH, 0, "this connection's tenant is not known");
        return KVD_ERR_AUTH;
    }
    if (lim.max_namespaces != 0 && use.namespaces + fresh > lim.max_namespaces) {
        set_error(req, rep, KVD_ERR_QUOTA, 0,
                  "%zu new namespaces would take tenant %s past its %llu (it has %llu)",
                  fresh, kvd_store_tenant_name(store, ctx->tenant),
                  (unsigned long long)lim.max_namespaces,
                  (unsigned long long)use.namespaces);
        return KVD_ERR_QUOTA;
    }
    for (size_t i = 0; i < n; i++) {
        rc = kvd_store_ns_register(store, ctx->tenant, ctx->conn_id, specs[i].name,
                                   specs[i].object_bytes, specs[i].rank_replicated,
                                   &ids[i]);
        if (rc != KVD_OK) { /* only out of memory is left */
            set_error(req, rep, rc, (uint32_t)i + 1, "namespace %s: %s", specs[i].name,
                      kvd_status_str(rc));
            return rc;
        }
    }
    return KVD_OK;
}

/* One field of a field list (kvd_proto.h) copied from the store's struct,
 * whose members have the same names. */
#define COPY_FIELD(type, name, size, metric, help) o->name = in->name;

int kvd_rpc_ns_table(kvd_store_t *store, const kvd_rpc_ctx_t *ctx, kvd_msg_t *rep,
                     kvd_ns_msg_t **out, size_t *n)
{
    uint32_t count = kvd_store_ns_count(store);
    kvd_ns_msg_t *t = kvd_msg_alloc(rep, (size_t)count * sizeof(*t) + 1);
    if (t == NULL)
        return KVD_ERR_NOMEM;
    size_t m = 0;
    for (uint32_t pos = 0, id; m < count && kvd_store_ns_next(store, &pos, &id);) {
        kvd_ns_info_t info;
        kvd_store_ns_info(store, id, &info);
        if (!ns_visible(ctx, info.tenant, true))
            continue;
        const kvd_ns_info_t *in = &info;
        kvd_ns_msg_t *o = &t[m++];
        o->id = id;
        kvd_strlcpy(o->name, in->name, sizeof(o->name));
        o->object_bytes = in->object_bytes;
        o->rank_replicated = in->rank_replicated;
        KVD_NS_COUNTER_FIELDS(COPY_FIELD)
        const char *tn = kvd_store_tenant_name(store, in->tenant);
        kvd_strlcpy(o->tenant, tn ? tn : "", sizeof(o->tenant));
    }
    *out = t;
    *n = m;
    return KVD_OK;
}

int kvd_rpc_tenant_table(kvd_store_t *store, const kvd_rpc_ctx_t *ctx, kvd_msg_t *rep,
                         kvd_tenant_msg_t **out, size_t *n)
{
    uint32_t count = kvd_store_tenant_count(store);
    kvd_tenant_msg_t *t = kvd_msg_alloc(rep, (size_t)count * sizeof(*t) + 1);
    if (t == NULL)
        return KVD_ERR_NOMEM;
    size_t m = 0;
    for (uint32_t id = 0; id < count; id++) {
        kvd_tenant_limits_t lim;
        kvd_tenant_usage_t use;
        if (!ns_visible(ctx, id, true) ||
            kvd_store_tenant_usage(store, id, &lim, &use) != KVD_OK)
            continue;
        kvd_tenant_msg_t *o = &t[m++];
        o->id = id;
        kvd_strlcpy(o->name, kvd_store_tenant_name(store, id), sizeof(o->name));
        o->bytes = use.bytes;
        o->max_bytes = lim.max_bytes;
        o->pins = use.pins;
        o->max_pins = lim.max_pins;
        o->leases = use.leases;
        o->max_leases = lim.max_leases;
        o->namespaces = use.namespaces;
        o->max_namespaces = lim.max_namespaces;
        o->quota_refusals = use.quota_refusals;
        o->quota_evictions = use.quota_evictions;
    }
    *out = t;
    *n = m;
    return KVD_OK;
}

void kvd_rpc_store_stats(const kvd_store_stats_t *in, kvd_store_stats_msg_t *o)
{
    KVD_STORE_STATS_FIELDS(COPY_FIELD)
}

/* --------------------------------------------------------------- methods */

static void serve_register(kvd_store_t *store, const kvd_opts_t *opts,
                           const kvd_rpc_ctx_t *ctx, const kvd_msg_t *req, kvd_msg_t *rep)
{
    const kvd_register_req_t *r = &req->body.register_req;
    if (!check_batch(opts, r->n, req, rep))
        return;
    uint32_t *ids = kvd_msg_alloc(rep, r->n * sizeof(uint32_t) + 1);
    if (ids == NULL) {
        set_error(req, rep, KVD_ERR_NOMEM, 0, "out of memory");
        return;
    }
    if (kvd_rpc_register(store, ctx, r->namespaces, r->n, ids, req, rep) != KVD_OK)
        return;
    rep->body.register_rep.n = r->n;
    rep->body.register_rep.ids = ids;
}

static void serve_lookup(kvd_store_t *store, const kvd_opts_t *opts,
                         const kvd_rpc_ctx_t *ctx, const kvd_msg_t *req, kvd_msg_t *rep)
{
    const kvd_lookup_req_t *r = &req->body.lookup_req;
    if (r->n_pools == 0 || r->n_pools > KVD_LOOKUP_POOLS_MAX) {
        set_error(req, rep, KVD_ERR_INVALID, 0, "a lookup names 1 to %d pools, not %zu",
                  KVD_LOOKUP_POOLS_MAX, r->n_pools);
        return;
    }
    kvd_lookup_pool_t pools[KVD_LOOKUP_POOLS_MAX];
    size_t n_min = SIZE_MAX;
    for (size_t p = 0; p < r->n_pools; p++) {
        if (!check_batch(opts, r->pools[p].n_keys, req, rep) ||
            !check_ns(store, ctx, r->pools[p].ns, 0, req, rep))
            return;
        pools[p] =
            (kvd_lookup_pool_t){.ns = r->pools[p].ns,
                                .keys = (const uint8_t(*)[KVD_KEY_BYTES])r->pools[p].keys,
                                .n_keys = r->pools[p].n_keys,
                                .trailing_pages = r->pools[p].trailing_pages};
        n_min = KVD_MIN(n_min, r->pools[p].n_keys);
    }
    uint32_t *b = kvd_msg_alloc(rep, n_min * sizeof(uint32_t) + 1);
    uint8_t *tiers = kvd_msg_alloc(rep, n_min + 1);
    size_t nb = 0;
    int rc = b && tiers ? kvd_store_lookup_tiers(store, pools, r->n_pools, b, tiers, &nb)
                        : KVD_ERR_NOMEM;
    if (rc != KVD_OK) {
        set_error(req, rep, rc, 0, "lookup failed: %s", kvd_status_str(rc));
        return;
    }
    rep->body.lookup_rep.n = nb;
    rep->body.lookup_rep.boundaries = b;
    bool any_ssd = false;
    for (size_t k = 0; k < nb && !any_ssd; k++)
        any_ssd = tiers[k] != KVD_TIER_DRAM;
    uint32_t *t32 = any_ssd ? kvd_msg_alloc(rep, nb * sizeof(uint32_t)) : NULL;
    for (size_t k = 0; t32 != NULL && k < nb; k++)
        t32[k] = tiers[k];
    rep->body.lookup_rep.tiers = t32;
}

static void serve_reserve(kvd_store_t *store, const kvd_opts_t *opts,
                          const kvd_rpc_ctx_t *ctx, const kvd_msg_t *req, kvd_msg_t *rep)
{
    const kvd_reserve_req_t *r = &req->body.reserve_req;
    uint64_t owner = ctx->conn_id;
    if (!check_batch(opts, r->n, req, rep) ||
        !check_ns(store, ctx, r->ns, r->object_bytes, req, rep))
        return;
    kvd_put_t *puts = kvd_msg_alloc(rep, r->n * sizeof(*puts) + 1);
    kvd_loc_t *locs = kvd_msg_alloc(rep, r->n * sizeof(*locs) + 1);
    uint8_t *results = kvd_msg_alloc(rep, r->n + 1);
    uint64_t *offsets = kvd_msg_alloc(rep, r->n * sizeof(uint64_t) + 1);
    if (!puts || !locs || !results || !offsets) {
        set_error(req, rep, KVD_ERR_NOMEM, 0, "out of memory");
        return;
    }
    for (size_t i = 0; i < r->n; i++)
        puts[i] =
            (kvd_put_t){.key = r->items[i].key,
                        .parent = r->items[i].has_parent ? r->items[i].parent : NULL,
                        .depth = r->items[i].depth};
    /* taken before: eviction for room may empty (and so remove) a
     * namespace nobody uses */
    kvd_ns_info_t info = {0};
    kvd_store_ns_info(store, r->ns, &info);
    uint64_t lease = 0;
    /* keys over the tenant's quota answer NO_SPACE, as a full pool does:
     * the writer skips them; the tenant's quota_refusals count them */
    int rc = kvd_store_reserve_by(store, owner, &ctx->writer, r->ns, puts, r->n,
                                  kvd_now_ns() / 1000000, &lease, results, locs);
    if (rc != KVD_OK) {
        set_error(req, rep, rc, 0, "reserve failed: %s", kvd_status_str(rc));
        return;
    }
    for (size_t i = 0; i < r->n; i++)
        offsets[i] = results[i] == KVD_RESERVE_ALLOCATED ? locs[i].offset : 0;
    rep->body.reserve_rep = (kvd_reserve_rep_t){.lease_id = lease,
                                                .object_bytes = info.object_bytes,
                                                .n = r->n,
                                                .results = results,
                                                .offsets = offsets};
}

/* The one reply for a lease id this connection does not hold: never
 * granted, ended, expired or another connection's are not told apart, and
 * the text does not repeat the id. */
#define NO_SUCH_LEASE "no such lease on this connection (never granted, ended or expired)"

static void serve_finish(kvd_store_t *store, const kvd_opts_t *opts, uint64_t owner,
                         const kvd_msg_t *req, kvd_msg_t *rep)
{
    const kvd_finish_req_t *r = &req->body.finish_req;
    if (!check_batch(opts, r->n, req, rep))
        return;
    const uint8_t(*keys)[KVD_KEY_BYTES] =
        r->n ? (const uint8_t(*)[KVD_KEY_BYTES])r->keys : NULL;
    bool publish = req->method == KVD_METHOD_PUBLISH;
    int rc = publish ? kvd_store_publish(store, owner, r->lease_id, keys, r->n)
                     : kvd_store_revoke(store, owner, r->lease_id, keys, r->n);
    const char *what = publish ? "publish" : "revoke";
    switch (rc) {
    case KVD_OK: return;
    case KVD_ERR_NOT_FOUND:
    case KVD_ERR_PERMISSION:
        /* another connection's lease gets the reply of one that never
         * existed: the reply must not tell a live id from a dead one */
        set_error(req, rep, KVD_ERR_NOT_FOUND, 0, "%s: %s", what, NO_SUCH_LEASE);
        return;
    case KVD_ERR_STATE:
        set_error(req, rep, rc, 0,
                  "%s: lease %llu is not a reservation lease, or a key is not one of its "
                  "reservations; nothing changed",
                  what, (unsigned long long)r->lease_id);
        return;
    default: set_error(req, rep, rc, 0, "%s failed: %s", what, kvd_status_str(rc));
    }
}

static void serve_acquire(kvd_store_t *store, const kvd_opts_t *opts,
                          const kvd_rpc_ctx_t *ctx, const kvd_msg_t *req, kvd_msg_t *rep)
{
    const kvd_acquire_req_t *r = &req->body.acquire_req;
    uint64_t owner = ctx->conn_id;
    if (!check_batch(opts, r->n, req, rep) ||
        !check_ns(store, ctx, r->ns, r->object_bytes, req, rep))
        return;
    kvd_loc_t *locs = kvd_msg_alloc(rep, r->n * sizeof(*locs) + 1);
    uint64_t *offsets = kvd_msg_alloc(rep, r->n * sizeof(uint64_t) + 1);
    if (!locs || !offsets) {
        set_error(req, rep, KVD_ERR_NOMEM, 0, "out of memory");
        return;
    }
    uint64_t lease = 0;
    size_t bad = 0;
    int rc =
        kvd_store_acquire(store, owner, r->ns, (const uint8_t(*)[KVD_KEY_BYTES])r->keys,
                          r->n, kvd_now_ns() / 1000000, &lease, locs, &bad);
    if (rc == KVD_INPROGRESS) {
        set_error(req, rep, rc, (uint32_t)bad + 1,
                  "acquire: key %zu is on the SSD tier and being read into the pool; "
                  "nothing pinned, ask again",
                  bad);
        return;
    }
    if (rc == KVD_ERR_QUOTA) {
        set_error(req, rep, rc, 1,
                  "acquire: %zu pins would take tenant %s past its limit of pins or "
                  "leases; nothing pinned",
                  r->n, kvd_store_tenant_name(store, ctx->tenant));
        return;
    }
    if (rc != KVD_OK) {
        char hex[65] = "";
        if (bad < r->n)
            kvd_key_to_hex(r->keys[bad], hex);
        set_error(req, rep, rc, (uint32_t)bad + 1,
                  "acquire: key %zu (%.16s...) %s; nothing pinned", bad, hex,
                  rc == KVD_ERR_NOT_FOUND ? "is not stored"
                  : rc == KVD_ERR_BUSY    ? "is still being written"
                  : rc == KVD_ERR_NO_SPACE
                      ? "has as many pins as it can count (65535), or "
                        "no room in the pool to come back from the "
                        "SSD tier"
                      : kvd_status_str(rc));
        return;
    }
    kvd_ns_info_t info = {0};
    kvd_store_ns_info(store, r->ns, &info);
    for (size_t i = 0; i < r->n; i++)
        offsets[i] = locs[i].offset;
    rep->body.acquire_rep = (kvd_acquire_rep_t){.lease_id = lease,
                                                .object_bytes = info.object_bytes,
                                                .n = r->n,
                                                .offsets = offsets};
}

static void serve_release(kvd_store_t *store, uint64_t owner, const kvd_msg_t *req,
                          kvd_msg_t *rep)
{
    uint64_t id = req->body.release_req.lease_id;
    int rc = kvd_store_release(store, owner, id);
    if (rc == KVD_ERR_NOT_FOUND || rc == KVD_ERR_PERMISSION) /* as in serve_finish */
        set_error(req, rep, KVD_ERR_NOT_FOUND, 0, "release: %s", NO_SUCH_LEASE);
    else if (rc == KVD_ERR_STATE)
        set_error(req, rep, rc, 0,
                  "release: lease %llu holds reservations; publish or revoke it",
                  (unsigned long long)id);
    else if (rc != KVD_OK)
        set_error(req, rep, rc, 0, "release failed: %s", kvd_status_str(rc));
}

/* ------------------------------------------------------------ inspection */

/*
 * The inspection methods (Inspect, ListPrefixes) walk what clients wrote:
 * chains of any depth, parents anywhere, thousands of namespaces. Each call
 * is given a budget of index operations (a probe of the index, a parent
 * followed, a record looked at, a namespace considered) and stops, or stops
 * looking further, when it is spent, so that no call holds the event loop
 * for more than a few milliseconds whatever the store holds. A listing that
 * stops early says so (truncated) and hands back a cursor to go on from.
 *
 * Where a page's key is looked for in other namespaces (the state a mamba
 * pool saved at a KV page's boundary, a slot's parent page), only the
 * namespaces of the same model that hold objects at all are probed: the
 * linker names a namespace model/pool/rank-suffix, so the model is the name
 * without its last two components (names not of that form share the empty
 * model). Empty namespaces, however many, cost nothing.
 */

/* Index operations one ListPrefixes page may spend before it stops between
 * two entries: about 2 ms on the 2-vCPU reference machine (bench
 * list-stall). One entry, once begun, is finished, so a page costs at most
 * this plus one entry (LIST_CHAIN_MAX + LIST_POOL_PROBES_MAX). */
#define LIST_BUDGET (32u * 1024u)
/* Parent links one entry follows: a longer chain is listed by its last
 * LIST_CHAIN_MAX pages (the root shown is where the walk stopped). 16 Ki
 * pages is a 256k-token prompt at 16 tokens a page. */
#define LIST_CHAIN_MAX (16u * 1024u)
/* Probes one entry spends on other namespaces' boundaries; past it, the
 * namespaces left are not shown for that entry (kvdock lookup answers for
 * any one of them). */
#define LIST_POOL_PROBES_MAX (32u * 1024u)
/* Index operations an Inspect may spend looking for parents in other
 * namespaces, after one probe per namespace for the key itself. */
#define INSPECT_BUDGET (64u * 1024u)

/* Records one Evict of a namespace (or all) visits: a slice of a few
 * milliseconds however many objects go; the reply carries next_cursor when
 * there is more, and kvdock evict goes on with it. */
#define EVICT_VISITS (8u * 1024u)

/* A cursor (ListPrefixes, Evict): two letters naming the method, version,
 * flags (ListPrefixes: bit 0 nodes), the namespace filter, the engine
 * position, and the position's check value. */
#define CURSOR_BYTES   24
#define CURSOR_VERSION 1

/* Resolves a namespace name ("" = every namespace: UINT32_MAX) within
 * ctx's sight: its own tenant's first; an operator's name may also be the
 * one namespace of that name of another tenant (several: refused, as
 * ambiguous). */
static bool ns_by_name(kvd_store_t *store, const kvd_rpc_ctx_t *ctx, const char *name,
                       uint32_t *ns, const kvd_msg_t *req, kvd_msg_t *rep)
{
    if (name[0] == '\0') {
        *ns = UINT32_MAX;
        return true;
    }
    if (kvd_store_ns_find(store, ctx->tenant, name, ns) == KVD_OK)
        return true;
    /* the client's bytes, escaped: an error text is one line of UTF-8 */
    char esc[KVD_ESCAPED_MAX(48)];
    uint32_t found = 0, n_tenants = ctx->is_operator ? kvd_store_tenant_count(store) : 0;
    for (uint32_t t = 0; t < n_tenants; t++) {
        uint32_t id;
        if (kvd_store_ns_find(store, t, name, &id) == KVD_OK && found++ == 0)
            *ns = id;
    }
    if (found == 1)
        return true;
    if (found > 1)
        set_error(req, rep, KVD_ERR_INVALID, 0,
                  "namespace '%s' exists in %u tenants; ask by its id's tenant",
                  kvd_escape(esc, sizeof(esc), name, strlen(name)), found);
    else
        set_error(req, rep, KVD_ERR_NOT_FOUND, 0, "unknown namespace '%s'",
                  kvd_escape(esc, sizeof(esc), name, strlen(name)));
    return false;
}

/* The length of a namespace name's model part: up to the slash before its
 * last two components ("m/kv/tp0" -> 1), 0 when it has fewer. */
static size_t model_len(const char *name)
{
    const char *last = strrchr(name, '/');
    if (last == NULL)
        return 0;
    for (const char *p = last; p-- > name;)
        if (*p == '/')
            return (size_t)(p - name);
    return 0;
}

#define NS_SLOT(id) ((id) & (KVD_STORE_MAX_NAMESPACES - 1))

/* One call's budget and the namespaces it may look in: those in ctx's
 * sight (kvd_rpc_ctx_t), and for a page's family only its own tenant's. */
typedef struct work {
    kvd_store_t *store;
    const kvd_rpc_ctx_t *ctx;
    uint8_t sight[KVD_STORE_MAX_NAMESPACES / 8]; /* by slot */
    uint64_t left;                               /* index operations left */
    uint32_t *live;                              /* namespaces holding READY objects */
    uint32_t n_live;
    uint32_t *fam; /* those of the model of namespace fam_of */
    uint32_t n_fam;
    uint32_t fam_of;                            /* UINT32_MAX: fam not computed */
    uint32_t cap;                               /* entries of live and fam */
    uint8_t used[KVD_STORE_MAX_NAMESPACES / 8]; /* by slot: namespaces a reply names */
} work_t;

static bool bit_of(const uint8_t *bits, uint32_t ns)
{
    return (bits[NS_SLOT(ns) / 8] >> (NS_SLOT(ns) % 8)) & 1u;
}

/* Whether the call may show namespace ns (an id of a live namespace). */
static bool work_sees(const work_t *w, uint32_t ns)
{
    return bit_of(w->sight, ns);
}

static void work_charge(work_t *w, uint64_t n)
{
    w->left = w->left > n ? w->left - n : 0;
}

static int work_init(work_t *w, kvd_store_t *store, const kvd_rpc_ctx_t *ctx,
                     uint64_t budget)
{
    memset(w, 0, sizeof(*w));
    w->store = store;
    w->ctx = ctx;
    w->left = budget;
    w->fam_of = UINT32_MAX;
    uint32_t count = kvd_store_ns_count(store);
    w->cap = count + 1;
    w->live = kvd_mem_calloc(KVD_MEM_STAGING, w->cap, sizeof(uint32_t));
    w->fam = kvd_mem_calloc(KVD_MEM_STAGING, w->cap, sizeof(uint32_t));
    if (w->live == NULL || w->fam == NULL)
        return KVD_ERR_NOMEM;
    for (uint32_t pos = 0, ns;
         w->n_live < count && kvd_store_ns_next(store, &pos, &ns);) {
        kvd_ns_info_t info;
        if (kvd_store_ns_info(store, ns, &info) != KVD_OK ||
            !ns_visible(ctx, info.tenant, true))
            continue;
        w->sight[NS_SLOT(ns) / 8] |= (uint8_t)(1u << (NS_SLOT(ns) % 8));
        if (info.objects_ready > 0)
            w->live[w->n_live++] = ns;
    }
    work_charge(w, count / 8); /* a look at each counter: cheap */
    return KVD_OK;
}

static void work_fini(work_t *w)
{
    kvd_mem_free(KVD_MEM_STAGING, w->live, (size_t)w->cap * sizeof(uint32_t));
    kvd_mem_free(KVD_MEM_STAGING, w->fam, (size_t)w->cap * sizeof(uint32_t));
}

static void work_use(work_t *w, uint32_t ns)
{
    w->used[NS_SLOT(ns) / 8] |= (uint8_t)(1u << (NS_SLOT(ns) % 8));
}

/* The namespaces other than ns, of its model, that hold objects; computed
 * once for consecutive uses with the same ns. */
static void work_family(work_t *w, uint32_t ns)
{
    if (w->fam_of == ns)
        return;
    w->fam_of = ns;
    w->n_fam = 0;
    kvd_ns_info_t me;
    if (kvd_store_ns_info(w->store, ns, &me) != KVD_OK)
        return;
    size_t ml = model_len(me.name);
    for (uint32_t i = 0; i < w->n_live; i++) {
        kvd_ns_info_t o;
        if (w->live[i] == ns || kvd_store_ns_info(w->store, w->live[i], &o) != KVD_OK)
            continue;
        if (o.tenant == me.tenant && model_len(o.name) == ml &&
            memcmp(o.name, me.name, ml) == 0)
            w->fam[w->n_fam++] = w->live[i];
    }
    work_charge(w, w->n_live);
}

/* The parent of an object by its tag: in its own namespace first, then in
 * the others of its model (a mamba slot's parent page lives in the KV
 * namespace) while the budget lasts. */
static int find_parent(work_t *w, const kvd_obj_info_t *in, kvd_obj_info_t *out)
{
    work_charge(w, 1);
    if (kvd_store_find_tag(w->store, in->ns, in->parent_tag, out) == KVD_OK)
        return KVD_OK;
    work_family(w, in->ns);
    for (uint32_t i = 0; i < w->n_fam && w->left > 0; i++) {
        work_charge(w, 1);
        if (kvd_store_find_tag(w->store, w->fam[i], in->parent_tag, out) == KVD_OK)
            return KVD_OK;
    }
    return KVD_ERR_NOT_FOUND;
}

/* An object's wire form, with the parent's full key where it is found. */
static void obj_msg(work_t *w, const kvd_obj_info_t *in, kvd_obj_msg_t *o)
{
    memset(o, 0, sizeof(*o));
    o->ns = in->ns;
    work_use(w, in->ns);
    memcpy(o->key, in->key, KVD_KEY_BYTES);
    if (in->has_parent) {
        kvd_obj_info_t parent;
        if (find_parent(w, in, &parent) == KVD_OK) {
            memcpy(o->parent, parent.key, KVD_KEY_BYTES);
            o->parent_len = KVD_KEY_BYTES;
        } else {
            memcpy(o->parent, in->parent_tag, KVD_KEY_TAG_BYTES);
            o->parent_len = KVD_KEY_TAG_BYTES;
        }
    }
    o->depth = in->depth;
    o->state = in->state;
    o->tier = in->tier;
    o->pins = in->pins;
    o->hits = in->hits;
    o->last_access_ms = in->last_access_ms;
    o->offset = in->loc.offset;
    o->size = in->loc.size;
}

/* The namespace table of a reply: only the namespaces it names (a table of
 * 4,096 names in every page would cost more than the page). */
static int ns_table_used(const work_t *w, kvd_msg_t *rep, kvd_ns_msg_t **out, size_t *n)
{
    uint32_t k = 0;
    for (uint32_t i = 0; i < KVD_STORE_MAX_NAMESPACES; i++)
        k += (w->used[i / 8] >> (i % 8)) & 1u;
    kvd_ns_msg_t *t = kvd_msg_alloc(rep, (size_t)k * sizeof(*t) + 1);
    if (t == NULL)
        return KVD_ERR_NOMEM;
    size_t m = 0;
    for (uint32_t pos = 0, id; m < k && kvd_store_ns_next(w->store, &pos, &id);) {
        if (!bit_of(w->used, id))
            continue;
        kvd_ns_info_t info;
        kvd_store_ns_info(w->store, id, &info);
        const kvd_ns_info_t *in = &info;
        kvd_ns_msg_t *o = &t[m++];
        o->id = id;
        kvd_strlcpy(o->name, in->name, sizeof(o->name));
        o->object_bytes = in->object_bytes;
        o->rank_replicated = in->rank_replicated;
        KVD_NS_COUNTER_FIELDS(COPY_FIELD)
        const char *tn = kvd_store_tenant_name(w->store, in->tenant);
        kvd_strlcpy(o->tenant, tn ? tn : "", sizeof(o->tenant));
    }
    *out = t;
    *n = m;
    return KVD_OK;
}

static void serve_inspect(kvd_store_t *store, const kvd_rpc_ctx_t *ctx,
                          const kvd_msg_t *req, kvd_msg_t *rep)
{
    const kvd_inspect_req_t *r = &req->body.inspect_req;
    uint32_t only;
    if (!ns_by_name(store, ctx, r->ns_name, &only, req, rep))
        return;
    uint32_t count = kvd_store_ns_count(store);
    kvd_obj_msg_t *objs = kvd_msg_alloc(rep, (size_t)count * sizeof(*objs) + 1);
    work_t *w = kvd_mem_calloc(KVD_MEM_STAGING, 1, sizeof(*w));
    if (objs == NULL || w == NULL || work_init(w, store, ctx, INSPECT_BUDGET) != KVD_OK) {
        if (w != NULL)
            work_fini(w);
        kvd_mem_free(KVD_MEM_STAGING, w, sizeof(*w));
        set_error(req, rep, KVD_ERR_NOMEM, 0, "out of memory");
        return;
    }
    /* one probe per namespace (at most 4,096) finds the key; parents in
     * other namespaces are looked for within the budget */
    size_t n = 0;
    for (uint32_t pos = 0, ns; n < count && kvd_store_ns_next(store, &pos, &ns);) {
        kvd_obj_info_t info;
        if ((only == UINT32_MAX || ns == only) && work_sees(w, ns) &&
            kvd_store_inspect(store, ns, r->key, &info) == KVD_OK)
            obj_msg(w, &info, &objs[n++]);
    }
    if (n == 0) {
        char hex[65];
        kvd_key_to_hex(r->key, hex);
        set_error(req, rep, KVD_ERR_NOT_FOUND, 0, "key %s is not stored%s%s", hex,
                  r->ns_name[0] ? " in " : "", r->ns_name);
    } else {
        kvd_inspect_rep_t *o = &rep->body.inspect_rep;
        o->n_objects = n;
        o->objects = objs;
        if (ns_table_used(w, rep, &o->namespaces, &o->n_namespaces) != KVD_OK)
            set_error(req, rep, KVD_ERR_NOMEM, 0, "out of memory");
    }
    work_fini(w);
    kvd_mem_free(KVD_MEM_STAGING, w, sizeof(*w));
}

/* ------------------------------------------------------------ prefixes */

/*
 * ListPrefixes pages through the store in the engine's order
 * (kvd_store_foreach_from). A leaf is a READY page no stored page names as
 * its parent (the engine's count of children, which eviction goes by too;
 * a parent stored after its children is counted short and then also lists
 * as the leaf of a shorter prefix). Each leaf becomes one entry: its chain
 * walked up to the root, and the boundaries at which the other namespaces
 * of its model hold the chain's keys. A page ends when the budget, the
 * limit or the reply's room is spent; it then says truncated and carries
 * next_cursor, the position of the first object it did not take.
 */
typedef struct list_page {
    work_t *w;
    const kvd_opts_t *opts;
    uint32_t only;
    bool nodes;
    size_t limit;
    uint64_t reply_room; /* estimated encoded bytes left */
    kvd_msg_t *rep;
    kvd_key_t *chain; /* LIST_CHAIN_MAX keys */
    int rc;
} list_page_t;

/* True when the key exists in a namespace of ns's model other than ns. */
static bool key_elsewhere(work_t *w, uint32_t ns, const uint8_t *key)
{
    work_family(w, ns);
    kvd_obj_info_t info;
    for (uint32_t i = 0; i < w->n_fam; i++) {
        work_charge(w, 1);
        if (kvd_store_inspect(w->store, w->fam[i], key, &info) == KVD_OK)
            return true;
    }
    return false;
}

/*
 * Builds one prefix entry: walks from the leaf to its root through parent
 * tags, following a link only when the parent's depth is one less (which
 * also ends any cycle a client could write), at most LIST_CHAIN_MAX pages,
 * then finds which other namespaces of its model hold the chain's keys,
 * within LIST_POOL_PROBES_MAX probes.
 */
static int prefix_entry(list_page_t *pg, const kvd_obj_info_t *leaf, kvd_prefix_msg_t *e)
{
    work_t *w = pg->w;
    kvd_store_t *store = w->store;
    kvd_key_t *chain = pg->chain;
    size_t len = 0;
    memset(e, 0, sizeof(*e));
    kvd_obj_info_t cur = *leaf;
    for (;;) {
        memcpy(chain[len++], cur.key, KVD_KEY_BYTES);
        e->hits += cur.hits;
        e->last_access_ms = KVD_MAX(e->last_access_ms, cur.last_access_ms);
        e->bytes += cur.loc.size;
        kvd_obj_info_t parent;
        if (len == LIST_CHAIN_MAX || !cur.has_parent || cur.depth == 0)
            break;
        work_charge(w, 1);
        if (kvd_store_find_tag(store, cur.ns, cur.parent_tag, &parent) != KVD_OK ||
            parent.depth + 1 != cur.depth)
            break;
        cur = parent;
    }
    e->ns = leaf->ns;
    work_use(w, leaf->ns);
    memcpy(e->root, chain[len - 1], KVD_KEY_BYTES);
    memcpy(e->leaf, leaf->key, KVD_KEY_BYTES);
    e->pages = (uint32_t)len;
    work_family(w, leaf->ns);
    if (w->n_fam == 0)
        return KVD_OK;
    e->pools = kvd_msg_alloc(pg->rep, (size_t)w->n_fam * sizeof(kvd_pool_bounds_t));
    if (e->pools == NULL)
        return KVD_ERR_NOMEM;
    /* chain[] runs leaf to root; boundary b = pages 0..b-1, i.e. index len-b */
    uint64_t probes = 0;
    for (uint32_t f = 0; f < w->n_fam && probes + len <= LIST_POOL_PROBES_MAX; f++) {
        uint32_t ns = w->fam[f];
        uint32_t *b = NULL;
        size_t nb = 0;
        probes += len;
        work_charge(w, len);
        for (size_t k = len; k-- > 0;) {
            kvd_obj_info_t info;
            if (kvd_store_inspect(store, ns, chain[k], &info) != KVD_OK ||
                info.state != KVD_OBJ_READY)
                continue;
            if (b == NULL && (b = kvd_msg_alloc(pg->rep, len * sizeof(uint32_t))) == NULL)
                return KVD_ERR_NOMEM;
            b[nb++] = (uint32_t)(len - k);
        }
        if (nb > 0) {
            e->pools[e->n_pools++] =
                (kvd_pool_bounds_t){.ns = ns, .n = nb, .boundaries = b};
            work_use(w, ns);
        }
    }
    return KVD_OK;
}

/* The encoded size of an entry, near enough: keys, counters, boundaries. */
static uint64_t entry_bytes(const kvd_prefix_msg_t *e)
{
    uint64_t n = 96;
    for (size_t k = 0; k < e->n_pools; k++)
        n += 8 + (uint64_t)e->pools[k].n * 3;
    return n;
}

#define NODE_BYTES 128 /* an ObjectInfo, encoded, at most */

/* foreach_from's callback: takes one object into the page, or stops the
 * page before it (1) so that the next page starts with it. */
static int list_one(const kvd_obj_info_t *obj, void *arg)
{
    list_page_t *pg = arg;
    work_t *w = pg->w;
    kvd_list_rep_t *o = &pg->rep->body.list_rep;
    bool empty = o->n_prefixes == 0 && o->n_nodes == 0;
    if (!empty && (w->left == 0 || pg->reply_room < NODE_BYTES + 96))
        return 1;
    if (obj->state != KVD_OBJ_READY || !work_sees(w, obj->ns))
        return 0; /* being written: not a stored prefix yet; or not in sight */
    bool leaf = obj->children == 0;
    if ((leaf && o->n_prefixes >= pg->limit) || (pg->nodes && o->n_nodes >= pg->limit))
        return 1;
    /* state saved at a boundary of another namespace's chain (mamba slots)
     * is shown as that chain's pool, not as a prefix of its own, unless its
     * namespace is the one asked for */
    if (pg->only == UINT32_MAX && obj->depth > 0) {
        kvd_obj_info_t parent;
        work_charge(w, 1);
        bool orphan =
            !obj->has_parent ||
            kvd_store_find_tag(w->store, obj->ns, obj->parent_tag, &parent) != KVD_OK;
        if (orphan && key_elsewhere(w, obj->ns, obj->key))
            return 0;
    }
    if (pg->nodes) {
        obj_msg(w, obj, &o->nodes[o->n_nodes++]);
        pg->reply_room -= KVD_MIN(pg->reply_room, NODE_BYTES);
    }
    if (!leaf)
        return 0;
    kvd_prefix_msg_t *e = &o->prefixes[o->n_prefixes];
    int rc = prefix_entry(pg, obj, e);
    if (rc != KVD_OK) {
        pg->rc = rc;
        return -1;
    }
    uint64_t size = entry_bytes(e);
    if (size > pg->reply_room) {
        if (!empty) {
            if (pg->nodes)
                o->n_nodes--; /* taken again, with its entry, next page */
            return 1;
        }
        e->n_pools = 0; /* alone in a page too small for it: without pools */
        size = entry_bytes(e);
    }
    pg->reply_room -= KVD_MIN(pg->reply_room, size);
    o->n_prefixes++;
    return 0;
}

static uint64_t cursor_salt(const char *magic, uint32_t only, uint8_t flags)
{
    return ((uint64_t)only << 8 | flags) ^ (uint64_t)(uint8_t)magic[0] << 56 ^
           (uint64_t)(uint8_t)magic[1] << 48;
}

static void put_le(uint8_t *p, uint64_t v, int n)
{
    for (int i = 0; i < n; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get_le(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static void cursor_make(kvd_store_t *store, const char *magic, uint32_t only,
                        uint8_t flags, uint64_t pos, uint8_t *c, size_t *len)
{
    c[0] = (uint8_t)magic[0];
    c[1] = (uint8_t)magic[1];
    c[2] = CURSOR_VERSION;
    c[3] = flags;
    put_le(c + 4, only, 4);
    put_le(c + 8, pos, 8);
    put_le(c + 16, kvd_store_pos_check(store, pos, cursor_salt(magic, only, flags)), 8);
    *len = CURSOR_BYTES;
}

/* The position a request's cursor names (0 without one): KVD_ERR_INVALID
 * for one this daemon did not make, or made for another method, namespace
 * or flags. */
static int cursor_read(kvd_store_t *store, const char *magic, const uint8_t *c,
                       size_t len, uint32_t only, uint8_t flags, uint64_t *pos)
{
    if (len == 0) {
        *pos = 0;
        return KVD_OK;
    }
    if (len != CURSOR_BYTES || c[0] != (uint8_t)magic[0] || c[1] != (uint8_t)magic[1] ||
        c[2] != CURSOR_VERSION)
        return KVD_ERR_INVALID;
    uint64_t p = get_le(c + 8, 8);
    uint64_t salt = cursor_salt(magic, (uint32_t)get_le(c + 4, 4), c[3]);
    if (get_le(c + 16, 8) != kvd_store_pos_check(store, p, salt) ||
        get_le(c + 4, 4) != only || c[3] != flags || p == 0 || p == KVD_STORE_POS_END)
        return KVD_ERR_INVALID;
    *pos = p;
    return KVD_OK;
}

static void serve_list(kvd_store_t *store, const kvd_opts_t *opts,
                       const kvd_rpc_ctx_t *ctx, const kvd_msg_t *req, kvd_msg_t *rep)
{
    const kvd_list_req_t *r = &req->body.list_req;
    uint32_t only;
    if (!ns_by_name(store, ctx, r->ns_name, &only, req, rep))
        return;
    uint8_t flags = r->nodes ? 1 : 0;
    uint64_t pos;
    if (cursor_read(store, "LP", r->cursor, r->cursor_len, only, flags, &pos) != KVD_OK) {
        set_error(req, rep, KVD_ERR_INVALID, 0,
                  "list prefixes: the cursor is not one this daemon gave for this "
                  "listing (same namespace and nodes); start again without one");
        return;
    }
    uint64_t room = opts->max_frame_bytes / 2;
    size_t limit =
        r->limit ? KVD_MIN((uint64_t)r->limit, opts->max_batch) : opts->max_batch;
    limit = KVD_MAX((size_t)1, KVD_MIN(limit, (size_t)(room / NODE_BYTES)));
    work_t *w = kvd_mem_calloc(KVD_MEM_STAGING, 1, sizeof(*w));
    kvd_key_t *chain = kvd_mem_calloc(KVD_MEM_STAGING, LIST_CHAIN_MAX, sizeof(kvd_key_t));
    kvd_list_rep_t *o = &rep->body.list_rep;
    o->prefixes = kvd_msg_alloc(rep, limit * sizeof(kvd_prefix_msg_t));
    o->nodes = kvd_msg_alloc(rep, (r->nodes ? limit : 0) * sizeof(kvd_obj_msg_t) + 1);
    int rc = w && chain && o->prefixes && o->nodes ? KVD_OK : KVD_ERR_NOMEM;
    if (rc == KVD_OK)
        rc = work_init(w, store, ctx, LIST_BUDGET);
    list_page_t pg = {.w = w,
                      .opts = opts,
                      .only = only,
                      .nodes = r->nodes,
                      .limit = limit,
                      .reply_room = room,
                      .rep = rep,
                      .chain = chain};
    /* records are looked at in slices, each charged to the budget, so a
     * store of empty or other namespaces' records pages too */
    while (rc == KVD_OK && pos != KVD_STORE_POS_END && w->left > 0) {
        uint64_t slice = KVD_MIN(w->left, (uint64_t)4096);
        int stop = kvd_store_foreach_from(store, only, &pos, slice, list_one, &pg);
        work_charge(w, slice);
        if (stop < 0)
            rc = pg.rc;
        if (stop != 0)
            break;
    }
    if (rc == KVD_OK && pos != KVD_STORE_POS_END) {
        o->truncated = true;
        cursor_make(store, "LP", only, flags, pos, o->next_cursor, &o->next_cursor_len);
    }
    if (rc == KVD_OK)
        rc = ns_table_used(w, rep, &o->namespaces, &o->n_namespaces);
    if (w != NULL)
        work_fini(w);
    kvd_mem_free(KVD_MEM_STAGING, w, sizeof(*w));
    kvd_mem_free(KVD_MEM_STAGING, chain, LIST_CHAIN_MAX * sizeof(kvd_key_t));
    if (rc != KVD_OK)
        set_error(req, rep, rc, 0, "list prefixes failed: %s", kvd_status_str(rc));
}

/* An Evict's reply comes after the tombstones of the objects it removed
 * from the SSD tier are durable (kvd_store_tier_sync_dead): an operator
 * told they are gone must not see them back after a power loss. When the
 * sync fails the reply says so (they are gone from the index either way). */
static void evict_sync(kvd_store_t *store, const kvd_msg_t *req, kvd_msg_t *rep)
{
    if (rep->body.evict_rep.evicted == 0)
        return;
    int rc = kvd_store_tier_sync_dead(store);
    if (rc != KVD_OK)
        set_error(req, rep, rc, 0,
                  "evicted %llu objects, but the SSD tier's dead-list could not be "
                  "synced (%s): those on the tier may come back after a power loss",
                  (unsigned long long)rep->body.evict_rep.evicted, kvd_status_str(rc));
}

/* Evict of a namespace (or all) goes in slices of EVICT_VISITS records;
 * skipped counts what stayed: pinned or being written objects, and while
 * next_cursor is set, those not reached yet. A key is looked for in each
 * namespace (at most 4,096 probes). */
static void serve_evict(kvd_store_t *store, const kvd_rpc_ctx_t *ctx,
                        const kvd_msg_t *req, kvd_msg_t *rep)
{
    const kvd_evict_req_t *r = &req->body.evict_req;
    uint32_t ns;
    if (r->all + r->has_key + (r->ns_name[0] != '\0' && !r->has_key) != 1 ||
        (r->has_key && r->cursor_len > 0)) {
        set_error(req, rep, KVD_ERR_INVALID, 0,
                  "evict takes one of: a key (with or without a namespace), a namespace, "
                  "all (a cursor only with the last two)");
        return;
    }
    if (!ns_by_name(store, ctx, r->all ? "" : r->ns_name, &ns, req, rep))
        return;
    /* "all" is every tenant's for an operator, its own tenant's otherwise */
    uint32_t tenant = ns == UINT32_MAX && !ctx->is_operator ? ctx->tenant : UINT32_MAX;
    kvd_evict_rep_t *o = &rep->body.evict_rep;
    if (!r->has_key) {
        uint64_t pos;
        if (cursor_read(store, "EV", r->cursor, r->cursor_len, ns, 0, &pos) != KVD_OK) {
            set_error(req, rep, KVD_ERR_INVALID, 0,
                      "evict: the cursor is not one this daemon gave for this namespace "
                      "(or all); start again without one");
            return;
        }
        if (tenant != UINT32_MAX)
            kvd_store_evict_tenant_from(store, tenant, &pos, EVICT_VISITS, &o->evicted);
        else
            kvd_store_evict_from(store, ns, &pos, EVICT_VISITS, &o->evicted);
        for (uint32_t at = 0, n; kvd_store_ns_next(store, &at, &n);) {
            kvd_ns_info_t info;
            if ((ns != UINT32_MAX && n != ns) ||
                kvd_store_ns_info(store, n, &info) != KVD_OK ||
                !ns_visible(ctx, info.tenant, true))
                continue;
            o->skipped += pos == KVD_STORE_POS_END
                              ? info.objects_writing + info.objects_pinned
                              : info.objects_writing + info.objects_ready;
        }
        if (pos != KVD_STORE_POS_END)
            cursor_make(store, "EV", ns, 0, pos, o->next_cursor, &o->next_cursor_len);
        evict_sync(store, req, rep);
        return;
    }
    bool found = false;
    for (uint32_t at = 0, n; kvd_store_ns_next(store, &at, &n);) {
        kvd_ns_info_t info;
        if ((ns != UINT32_MAX && n != ns) ||
            kvd_store_ns_info(store, n, &info) != KVD_OK ||
            !ns_visible(ctx, info.tenant, true))
            continue;
        int rc = kvd_store_evict_key(store, n, r->key);
        found |= rc != KVD_ERR_NOT_FOUND;
        o->evicted += rc == KVD_OK;
        o->skipped += rc == KVD_ERR_BUSY;
    }
    if (!found)
        set_error(req, rep, KVD_ERR_NOT_FOUND, 0, "the key is not stored%s%s",
                  r->ns_name[0] ? " in " : "", r->ns_name);
    else
        evict_sync(store, req, rep);
}

void kvd_rpc_store_serve(kvd_store_t *store, const kvd_opts_t *opts,
                         const kvd_rpc_ctx_t *ctx, const kvd_msg_t *req, kvd_msg_t *rep)
{
    uint64_t owner = ctx->conn_id;
    switch (req->method) {
    case KVD_METHOD_RESERVE:
    case KVD_METHOD_PUBLISH:
    case KVD_METHOD_REVOKE:
    case KVD_METHOD_EVICT:
        if (ctx->read_only) {
            set_error(req, rep, KVD_ERR_PERMISSION, 0,
                      "this connection is read-only: it may look up and load, not %s",
                      kvd_method_name(req->method));
            return;
        }
        break;
    default: break;
    }
    switch (req->method) {
    case KVD_METHOD_REGISTER_NAMESPACE: serve_register(store, opts, ctx, req, rep); break;
    case KVD_METHOD_LOOKUP: serve_lookup(store, opts, ctx, req, rep); break;
    case KVD_METHOD_RESERVE: serve_reserve(store, opts, ctx, req, rep); break;
    case KVD_METHOD_PUBLISH:
    case KVD_METHOD_REVOKE: serve_finish(store, opts, owner, req, rep); break;
    case KVD_METHOD_ACQUIRE: serve_acquire(store, opts, ctx, req, rep); break;
    case KVD_METHOD_RELEASE: serve_release(store, owner, req, rep); break;
    case KVD_METHOD_LIST_PREFIXES: serve_list(store, opts, ctx, req, rep); break;
    case KVD_METHOD_INSPECT: serve_inspect(store, ctx, req, rep); break;
    case KVD_METHOD_EVICT: serve_evict(store, ctx, req, rep); break;
    default: set_error(req, rep, KVD_ERR_UNKNOWN_METHOD, 0, "not a store method");
    }
}
