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

/* Most objects one ListPrefixes scans: bounds the reply's cost on a huge
 * store; the reply says when it was truncated. */
#define LIST_SCAN_MAX (1u * 1024u * 1024u)
/* Most parent links one ListPrefixes follows, over all its entries. */
#define LIST_WALK_MAX (4u * 1024u * 1024u)

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

/* Why spec i cannot be registered beside the existing namespaces and the
 * earlier specs of its batch; false when it can. */
static bool spec_refused(kvd_store_t *store, uint32_t tenant, const kvd_ns_spec_t *specs,
                         size_t i, const kvd_msg_t *req, kvd_msg_t *rep)
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
    if (kvd_store_ns_find(store, tenant, sp->name, &id) == KVD_OK) {
        kvd_store_ns_info(store, id, &have);
    } else {
        for (size_t k = 0; k < i; k++)
            if (strcmp(specs[k].name, sp->name) == 0)
                have = (kvd_ns_info_t){.object_bytes = specs[k].object_bytes,
                                       .rank_replicated = specs[k].rank_replicated};
    }
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
    kvd_store_stats_t st;
    kvd_store_stats(store, &st);
    if (sp->object_bytes == 0 || sp->object_bytes > st.pool_bytes) {
        set_error(req, rep, KVD_ERR_INVALID, idx,
                  "namespace %s: objects of %llu bytes; they must be 1 byte to the pool "
                  "size (%llu)",
                  sp->name, (unsigned long long)sp->object_bytes,
                  (unsigned long long)st.pool_bytes);
        return true;
    }
    return false;
}

int kvd_rpc_register(kvd_store_t *store, const kvd_rpc_ctx_t *ctx,
                     const kvd_ns_spec_t *specs, size_t n, uint32_t *ids,
                     const kvd_msg_t *req, kvd_msg_t *rep)
{
    /* all checked before any is registered: a refused batch changes nothing */
    size_t fresh = 0;
    for (size_t i = 0; i < n; i++) {
        if (spec_refused(store, ctx->tenant, specs, i, req, rep))
            return rep->status;
        uint32_t id;
        bool seen = kvd_store_ns_find(store, ctx->tenant, specs[i].name, &id) == KVD_OK;
        for (size_t k = 0; k < i && !seen; k++)
            seen = strcmp(specs[k].name, specs[i].name) == 0;
        fresh += !seen;
    }
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
        int rc = kvd_store_ns_register(store, ctx->tenant, ctx->conn_id, specs[i].name,
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
    size_t nb = 0;
    int rc = b ? kvd_store_lookup(store, pools, r->n_pools, b, &nb) : KVD_ERR_NOMEM;
    if (rc != KVD_OK) {
        set_error(req, rep, rc, 0, "lookup failed: %s", kvd_status_str(rc));
        return;
    }
    rep->body.lookup_rep.n = nb;
    rep->body.lookup_rep.boundaries = b;
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
    int rc = kvd_store_reserve(store, owner, r->ns, puts, r->n, kvd_now_ns() / 1000000,
                               &lease, results, locs);
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
        set_error(req, rep, rc, 0, "%s: no lease %llu (never granted, ended or expired)",
                  what, (unsigned long long)r->lease_id);
        return;
    case KVD_ERR_PERMISSION:
        set_error(req, rep, rc, 0, "%s: lease %llu belongs to another connection", what,
                  (unsigned long long)r->lease_id);
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
                  rc == KVD_ERR_NOT_FOUND  ? "is not stored"
                  : rc == KVD_ERR_BUSY     ? "is still being written"
                  : rc == KVD_ERR_NO_SPACE ? "has as many pins as it can count (65535)"
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
    if (rc == KVD_ERR_NOT_FOUND)
        set_error(req, rep, rc, 0,
                  "release: no lease %llu (never granted, released or expired)",
                  (unsigned long long)id);
    else if (rc == KVD_ERR_PERMISSION)
        set_error(req, rep, rc, 0, "release: lease %llu belongs to another connection",
                  (unsigned long long)id);
    else if (rc == KVD_ERR_STATE)
        set_error(req, rep, rc, 0,
                  "release: lease %llu holds reservations; publish or revoke it",
                  (unsigned long long)id);
    else if (rc != KVD_OK)
        set_error(req, rep, rc, 0, "release failed: %s", kvd_status_str(rc));
}

/* ------------------------------------------------------------ inspection */

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
                  "namespace '%s' exists in %u tenants; ask by its id's tenant", name,
                  found);
    else
        set_error(req, rep, KVD_ERR_NOT_FOUND, 0, "unknown namespace '%s'", name);
    return false;
}

/* The namespaces one request may look at: ids in slot order, and by slot
 * whether a namespace is in sight and whose it is. */
typedef struct ns_scope {
    uint32_t n;
    uint32_t ids[KVD_STORE_MAX_NAMESPACES];
    uint32_t tenant[KVD_STORE_MAX_NAMESPACES]; /* by slot */
} ns_scope_t;

#define NS_SLOT(id) ((id) & (KVD_STORE_MAX_NAMESPACES - 1))

static ns_scope_t *scope_new(kvd_store_t *store, const kvd_rpc_ctx_t *ctx)
{
    ns_scope_t *sc = kvd_mem_calloc(KVD_MEM_STAGING, 1, sizeof(*sc));
    if (sc == NULL)
        return NULL;
    for (uint32_t pos = 0, id; kvd_store_ns_next(store, &pos, &id);) {
        kvd_ns_info_t info;
        kvd_store_ns_info(store, id, &info);
        if (ns_visible(ctx, info.tenant, true)) {
            sc->ids[sc->n++] = id;
            sc->tenant[NS_SLOT(id)] = info.tenant;
        }
    }
    return sc;
}

static void scope_free(ns_scope_t *sc)
{
    kvd_mem_free(KVD_MEM_STAGING, sc, sizeof(*sc));
}

/* The parent of an object by its tag: in its own namespace first, then in
 * any other of its tenant's (a mamba slot's parent page lives in the KV
 * namespace). */
static int find_parent(kvd_store_t *store, const ns_scope_t *sc, const kvd_obj_info_t *in,
                       kvd_obj_info_t *out)
{
    if (kvd_store_find_tag(store, in->ns, in->parent_tag, out) == KVD_OK)
        return KVD_OK;
    uint32_t tenant = sc->tenant[NS_SLOT(in->ns)];
    for (uint32_t k = 0; k < sc->n; k++) {
        uint32_t ns = sc->ids[k];
        if (ns != in->ns && sc->tenant[NS_SLOT(ns)] == tenant &&
            kvd_store_find_tag(store, ns, in->parent_tag, out) == KVD_OK)
            return KVD_OK;
    }
    return KVD_ERR_NOT_FOUND;
}

/* An object's wire form, with the parent's full key where it is stored. */
static void obj_msg(kvd_store_t *store, const ns_scope_t *sc, const kvd_obj_info_t *in,
                    kvd_obj_msg_t *o)
{
    memset(o, 0, sizeof(*o));
    o->ns = in->ns;
    memcpy(o->key, in->key, KVD_KEY_BYTES);
    if (in->has_parent) {
        kvd_obj_info_t parent;
        if (find_parent(store, sc, in, &parent) == KVD_OK) {
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

static void serve_inspect(kvd_store_t *store, const kvd_rpc_ctx_t *ctx,
                          const kvd_msg_t *req, kvd_msg_t *rep)
{
    const kvd_inspect_req_t *r = &req->body.inspect_req;
    uint32_t only;
    if (!ns_by_name(store, ctx, r->ns_name, &only, req, rep))
        return;
    ns_scope_t *sc = scope_new(store, ctx);
    kvd_obj_msg_t *objs =
        sc ? kvd_msg_alloc(rep, (size_t)sc->n * sizeof(*objs) + 1) : NULL;
    if (objs == NULL) {
        scope_free(sc);
        set_error(req, rep, KVD_ERR_NOMEM, 0, "out of memory");
        return;
    }
    size_t n = 0;
    for (uint32_t k = 0; k < sc->n; k++) {
        uint32_t ns = sc->ids[k];
        kvd_obj_info_t info;
        if ((only == UINT32_MAX || ns == only) &&
            kvd_store_inspect(store, ns, r->key, &info) == KVD_OK)
            obj_msg(store, sc, &info, &objs[n++]);
    }
    scope_free(sc);
    if (n == 0) {
        char hex[65];
        kvd_key_to_hex(r->key, hex);
        set_error(req, rep, KVD_ERR_NOT_FOUND, 0, "key %s is not stored%s%s", hex,
                  r->ns_name[0] ? " in " : "", r->ns_name);
        return;
    }
    kvd_inspect_rep_t *o = &rep->body.inspect_rep;
    o->n_objects = n;
    o->objects = objs;
    if (kvd_rpc_ns_table(store, ctx, rep, &o->namespaces, &o->n_namespaces) != KVD_OK)
        set_error(req, rep, KVD_ERR_NOMEM, 0, "out of memory");
}

/* Evict: "all" evicts every tenant's objects for an operator and only its
 * own tenant's for anyone else (what "all" can mean to somebody who sees
 * nothing else); a namespace or key of another tenant is not found. */
static void serve_evict(kvd_store_t *store, const kvd_rpc_ctx_t *ctx,
                        const kvd_msg_t *req, kvd_msg_t *rep)
{
    const kvd_evict_req_t *r = &req->body.evict_req;
    uint32_t ns;
    if (r->all + r->has_key + (r->ns_name[0] != '\0' && !r->has_key) != 1) {
        set_error(
            req, rep, KVD_ERR_INVALID, 0,
            "evict takes one of: a key (with or without a namespace), a namespace, all");
        return;
    }
    if (!ns_by_name(store, ctx, r->all ? "" : r->ns_name, &ns, req, rep))
        return;
    kvd_evict_rep_t *o = &rep->body.evict_rep;
    if (!r->has_key) {
        if (ns == UINT32_MAX && !ctx->is_operator)
            kvd_store_evict_tenant(store, ctx->tenant, &o->evicted, &o->skipped);
        else
            kvd_store_evict_ns(store, ns, &o->evicted, &o->skipped);
        return;
    }
    ns_scope_t *sc = scope_new(store, ctx);
    if (sc == NULL) {
        set_error(req, rep, KVD_ERR_NOMEM, 0, "out of memory");
        return;
    }
    bool found = false;
    for (uint32_t k = 0; k < sc->n; k++) {
        uint32_t n = sc->ids[k];
        if (ns != UINT32_MAX && n != ns)
            continue;
        int rc = kvd_store_evict_key(store, n, r->key);
        found |= rc != KVD_ERR_NOT_FOUND;
        o->evicted += rc == KVD_OK;
        o->skipped += rc == KVD_ERR_BUSY;
    }
    scope_free(sc);
    if (!found)
        set_error(req, rep, KVD_ERR_NOT_FOUND, 0, "the key is not stored%s%s",
                  r->ns_name[0] ? " in " : "", r->ns_name);
}

/* ------------------------------------------------------------ prefixes */

typedef struct list_ctx {
    kvd_store_t *store;
    const ns_scope_t *scope; /* objects of namespaces out of it are skipped */
    const uint8_t *in_sight; /* by slot */
    kvd_obj_info_t *objs;
    size_t n, cap;
    bool truncated;
} list_ctx_t;

static int collect(const kvd_obj_info_t *info, void *arg)
{
    list_ctx_t *c = arg;
    if (info->state != KVD_OBJ_READY || !c->in_sight[NS_SLOT(info->ns)])
        return 0; /* being written: not a stored prefix yet; or not ours */
    if (c->n == c->cap) {
        if (c->cap >= LIST_SCAN_MAX) {
            c->truncated = true;
            return 1;
        }
        size_t cap = c->cap ? c->cap * 2 : 1024;
        kvd_obj_info_t *n = kvd_mem_realloc(KVD_MEM_STAGING, c->objs, c->cap * sizeof(*n),
                                            cap * sizeof(*n));
        if (n == NULL) {
            c->truncated = true;
            return 1;
        }
        c->objs = n;
        c->cap = cap;
    }
    c->objs[c->n++] = *info;
    return 0;
}

/* Orders (ns, parent tag) for the "is somebody's parent" search. */
typedef struct tag_ref {
    uint32_t ns;
    uint8_t tag[KVD_KEY_TAG_BYTES];
} tag_ref_t;

static int tag_cmp(const void *a, const void *b)
{
    const tag_ref_t *x = a, *y = b;
    if (x->ns != y->ns)
        return x->ns < y->ns ? -1 : 1;
    return memcmp(x->tag, y->tag, KVD_KEY_TAG_BYTES);
}

/* True when the key exists in another namespace than ns, of ns's tenant. */
static bool key_elsewhere(kvd_store_t *store, const ns_scope_t *sc, uint32_t ns,
                          const uint8_t *key)
{
    kvd_obj_info_t info;
    uint32_t tenant = sc->tenant[NS_SLOT(ns)];
    for (uint32_t k = 0; k < sc->n; k++) {
        uint32_t n = sc->ids[k];
        if (n != ns && sc->tenant[NS_SLOT(n)] == tenant &&
            kvd_store_inspect(store, n, key, &info) == KVD_OK)
            return true;
    }
    return false;
}

/* The work one ListPrefixes may do and the room its reply may take: the
 * depths and parents it walks are what clients wrote, so neither is
 * trusted to be small or acyclic. */
typedef struct list_budget {
    uint64_t steps;       /* parent links left to follow */
    uint64_t reply_bytes; /* estimated encoded size left */
} list_budget_t;

/*
 * Builds one prefix entry: walks from the leaf to its root through parent
 * tags, following a link only when the parent's depth is one less (which
 * also ends any cycle a client could write), then finds which other
 * namespaces hold the chain's keys. KVD_ERR_TOO_LARGE when the budget runs
 * out (the entry is not added).
 */
static int prefix_entry(kvd_store_t *store, const ns_scope_t *sc,
                        const kvd_obj_info_t *leaf, kvd_msg_t *rep, list_budget_t *budget,
                        kvd_prefix_msg_t *e)
{
    size_t cap = 64, len = 0;
    kvd_key_t *chain = kvd_mem_calloc(KVD_MEM_STAGING, cap, sizeof(kvd_key_t));
    if (chain == NULL)
        return KVD_ERR_NOMEM;
    memset(e, 0, sizeof(*e));
    kvd_obj_info_t cur = *leaf;
    int rc = KVD_OK;
    for (;;) {
        if (len == cap) {
            kvd_key_t *more =
                kvd_mem_realloc(KVD_MEM_STAGING, chain, cap * sizeof(kvd_key_t),
                                2 * cap * sizeof(kvd_key_t));
            if (more == NULL) {
                rc = KVD_ERR_NOMEM;
                break;
            }
            chain = more;
            cap *= 2;
        }
        memcpy(chain[len++], cur.key, KVD_KEY_BYTES);
        e->hits += cur.hits;
        e->last_access_ms = KVD_MAX(e->last_access_ms, cur.last_access_ms);
        e->bytes += cur.loc.size;
        kvd_obj_info_t parent;
        if (!cur.has_parent || cur.depth == 0 ||
            kvd_store_find_tag(store, cur.ns, cur.parent_tag, &parent) != KVD_OK ||
            parent.depth + 1 != cur.depth)
            break;
        if (budget->steps == 0) {
            rc = KVD_ERR_TOO_LARGE;
            break;
        }
        budget->steps--;
        cur = parent;
    }
    uint32_t count = sc->n;
    uint32_t tenant = sc->tenant[NS_SLOT(leaf->ns)];
    uint64_t size = 96 + (uint64_t)len * 2; /* the entry, its boundaries */
    if (rc == KVD_OK && size > budget->reply_bytes)
        rc = KVD_ERR_TOO_LARGE;
    if (rc == KVD_OK) {
        budget->reply_bytes -= size;
        e->ns = leaf->ns;
        memcpy(e->root, chain[len - 1], KVD_KEY_BYTES);
        memcpy(e->leaf, leaf->key, KVD_KEY_BYTES);
        e->pages = (uint32_t)len;
        e->pools = kvd_msg_alloc(rep, (size_t)count * sizeof(kvd_pool_bounds_t) + 1);
        rc = e->pools ? KVD_OK : KVD_ERR_NOMEM;
    }
    /* chain[] runs leaf to root; boundary b = pages 0..b-1, i.e. index len-b */
    for (uint32_t k = 0; rc == KVD_OK && k < count; k++) {
        uint32_t ns = sc->ids[k];
        if (ns == leaf->ns || sc->tenant[NS_SLOT(ns)] != tenant)
            continue;
        uint32_t *b = NULL;
        size_t nb = 0;
        for (size_t j = len; j-- > 0;) {
            kvd_obj_info_t info;
            if (kvd_store_inspect(store, ns, chain[j], &info) != KVD_OK ||
                info.state != KVD_OBJ_READY)
                continue;
            if (b == NULL && (b = kvd_msg_alloc(rep, len * sizeof(uint32_t))) == NULL) {
                rc = KVD_ERR_NOMEM;
                break;
            }
            b[nb++] = (uint32_t)(len - j);
        }
        if (nb > 0)
            e->pools[e->n_pools++] =
                (kvd_pool_bounds_t){.ns = ns, .n = nb, .boundaries = b};
    }
    kvd_mem_free(KVD_MEM_STAGING, chain, cap * sizeof(kvd_key_t));
    return rc;
}

static void serve_list(kvd_store_t *store, const kvd_opts_t *opts,
                       const kvd_rpc_ctx_t *ctx, const kvd_msg_t *req, kvd_msg_t *rep)
{
    const kvd_list_req_t *r = &req->body.list_req;
    uint32_t only;
    if (!ns_by_name(store, ctx, r->ns_name, &only, req, rep))
        return;
    ns_scope_t *sc = scope_new(store, ctx);
    uint8_t *in_sight = kvd_mem_calloc(KVD_MEM_STAGING, KVD_STORE_MAX_NAMESPACES, 1);
    if (sc == NULL || in_sight == NULL) {
        scope_free(sc);
        kvd_mem_free(KVD_MEM_STAGING, in_sight, KVD_STORE_MAX_NAMESPACES);
        set_error(req, rep, KVD_ERR_NOMEM, 0, "out of memory");
        return;
    }
    for (uint32_t k = 0; k < sc->n; k++)
        in_sight[NS_SLOT(sc->ids[k])] = 1;
    size_t limit =
        r->limit ? KVD_MIN((uint64_t)r->limit, opts->max_batch) : opts->max_batch;
    list_ctx_t c = {.store = store, .scope = sc, .in_sight = in_sight};
    kvd_store_foreach(store, only, collect, &c);
    list_budget_t budget = {.steps = LIST_WALK_MAX,
                            .reply_bytes = opts->max_frame_bytes / 2};
    /* a node costs about 120 bytes of reply */
    limit = KVD_MIN(limit, (size_t)(opts->max_frame_bytes / 2 / 128));
    tag_ref_t *parents = kvd_mem_calloc(KVD_MEM_STAGING, c.n + 1, sizeof(*parents));
    kvd_list_rep_t *o = &rep->body.list_rep;
    o->prefixes = kvd_msg_alloc(rep, KVD_MIN(c.n, limit) * sizeof(kvd_prefix_msg_t) + 1);
    o->nodes = kvd_msg_alloc(
        rep, (r->nodes ? KVD_MIN(c.n, limit) : 0) * sizeof(kvd_obj_msg_t) + 1);
    int rc = parents && o->prefixes && o->nodes ? KVD_OK : KVD_ERR_NOMEM;
    size_t np = 0;
    for (size_t i = 0; rc == KVD_OK && i < c.n; i++)
        if (c.objs[i].has_parent) {
            parents[np].ns = c.objs[i].ns;
            memcpy(parents[np++].tag, c.objs[i].parent_tag, KVD_KEY_TAG_BYTES);
        }
    if (rc == KVD_OK)
        qsort(parents, np, sizeof(*parents), tag_cmp);
    for (size_t i = 0; rc == KVD_OK && i < c.n; i++) {
        const kvd_obj_info_t *obj = &c.objs[i];
        kvd_obj_info_t parent;
        /* no stored parent in its own namespace (none named, or not here) */
        bool orphan =
            !obj->has_parent ||
            kvd_store_find_tag(store, obj->ns, obj->parent_tag, &parent) != KVD_OK;
        /* state saved at a boundary of another namespace's chain (mamba
         * slots) is shown as that chain's pool, not as a prefix of its own,
         * unless its namespace is the one asked for */
        if (only == UINT32_MAX && orphan && obj->depth > 0 &&
            key_elsewhere(store, sc, obj->ns, obj->key))
            continue;
        if (r->nodes) {
            if (o->n_nodes < limit)
                obj_msg(store, sc, obj, &o->nodes[o->n_nodes++]);
            else
                o->truncated = true;
        }
        tag_ref_t me = {.ns = obj->ns};
        kvd_store_key_tag(store, obj->key, me.tag);
        if (bsearch(&me, parents, np, sizeof(*parents), tag_cmp) != NULL)
            continue; /* not a leaf */
        if (o->n_prefixes >= limit) {
            o->truncated = true;
            continue;
        }
        rc = prefix_entry(store, sc, obj, rep, &budget, &o->prefixes[o->n_prefixes]);
        if (rc == KVD_OK)
            o->n_prefixes++;
        if (rc == KVD_ERR_TOO_LARGE) {
            o->truncated = true;
            rc = KVD_OK;
            break;
        }
    }
    o->truncated |= c.truncated;
    if (rc == KVD_OK)
        rc = kvd_rpc_ns_table(store, ctx, rep, &o->namespaces, &o->n_namespaces);
    kvd_mem_free(KVD_MEM_STAGING, parents, (c.n + 1) * sizeof(*parents));
    kvd_mem_free(KVD_MEM_STAGING, in_sight, KVD_STORE_MAX_NAMESPACES);
    scope_free(sc);
    kvd_mem_free(KVD_MEM_STAGING, c.objs, c.cap * sizeof(*c.objs));
    if (rc != KVD_OK)
        set_error(req, rep, rc, 0, "list prefixes failed: %s", kvd_status_str(rc));
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
