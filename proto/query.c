/*
 * query.c - what an operator's client asks the daemon, shared by the
 * kvdock CLI and libkvdock's store client: reaching the daemon (connect,
 * then Hello with the credential), a listing of the stored prefixes
 * followed page by page through the daemon's cursors, and a Lookup by
 * namespace names.
 *
 * The queries make their RPCs through the caller's kvd_call_fn, so each
 * caller keeps its own way to connect and to report: the CLI one
 * connection per call printing what failed, the store client one
 * connection it keeps, reconnects and bounds by one deadline per call.
 * Nothing here keeps state; the caller's thread owns what it passes.
 */
#include "kvd_proto.h"

#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------ reaching */

int kvd_client_token_read(const char *path, uint8_t *buf, size_t cap, size_t *len,
                          char *why, size_t why_len)
{
    if (path == NULL)
        path = getenv("KVDOCK_AUTH_TOKEN_FILE");
    *len = 0;
    if (path == NULL || path[0] == '\0')
        return KVD_OK;
    return kvd_token_read(path, false, buf, cap, len, why, why_len);
}

int kvd_client_open(const char *socket_path, const char *connect, const char *client_name,
                    const uint8_t *token, size_t token_len, int timeout_ms,
                    kvd_client_t **out, bool *refused)
{
    uint64_t deadline = kvd_now_ns() + (uint64_t)KVD_MAX(timeout_ms, 0) * 1000000ull;
    kvd_client_t *c = NULL;
    *refused = false;
    int rc = connect ? kvd_client_connect_tcp(connect, timeout_ms, &c)
                     : kvd_client_connect_unix(socket_path, timeout_ms, &c);
    if (rc != KVD_OK)
        return rc;
    /* the daemon serves nothing before a Hello; it has what is left of
     * the time */
    uint64_t now = kvd_now_ns();
    int left_ms = now < deadline ? (int)((deadline - now + 999999) / 1000000) : 0;
    rc = kvd_client_hello(c, client_name, token, token_len, left_ms, NULL);
    if (rc != KVD_OK) {
        *refused = true;
        kvd_client_close(c);
        return rc;
    }
    *out = c;
    return KVD_OK;
}

/* ------------------------------------------------------------ namespaces */

const char *kvd_ns_msg_name(const kvd_ns_msg_t *ns, size_t n, uint32_t id)
{
    for (size_t i = 0; i < n; i++)
        if (ns[i].id == id)
            return ns[i].name;
    return "?";
}

int kvd_ns_msg_find(const kvd_ns_msg_t *ns, size_t n, const char *name, uint32_t *id)
{
    for (size_t i = 0; i < n; i++) {
        if (strcmp(ns[i].name, name) == 0) {
            *id = ns[i].id;
            return KVD_OK;
        }
    }
    return KVD_ERR_NOT_FOUND;
}

/* -------------------------------------------------------------- prefixes */

void kvd_list_pages_free(kvd_list_pages_t *p)
{
    for (size_t i = 0; i < p->n; i++) {
        kvd_msg_clear(p->msgs[i]);
        free(p->msgs[i]);
    }
    free(p->msgs);
    free(p->all.prefixes);
    free(p->all.nodes);
    free(p->all.namespaces);
    memset(p, 0, sizeof(*p));
}

/* Joins the pages' entries, nodes and namespace tables into p->all (each
 * page names only its own namespaces). */
static int pages_join(kvd_list_pages_t *p)
{
    size_t np = 0, nn = 0, ns = 0;
    for (size_t i = 0; i < p->n; i++) {
        const kvd_list_rep_t *l = &p->msgs[i]->body.list_rep;
        np += l->n_prefixes;
        nn += l->n_nodes;
        ns += l->n_namespaces;
    }
    kvd_list_rep_t *a = &p->all;
    a->prefixes = calloc(np + 1, sizeof(*a->prefixes));
    a->nodes = calloc(nn + 1, sizeof(*a->nodes));
    a->namespaces = calloc(ns + 1, sizeof(*a->namespaces));
    if (!a->prefixes || !a->nodes || !a->namespaces)
        return KVD_ERR_NOMEM;
    for (size_t i = 0; i < p->n; i++) {
        const kvd_list_rep_t *l = &p->msgs[i]->body.list_rep;
        memcpy(a->prefixes + a->n_prefixes, l->prefixes,
               l->n_prefixes * sizeof(*l->prefixes));
        a->n_prefixes += l->n_prefixes;
        memcpy(a->nodes + a->n_nodes, l->nodes, l->n_nodes * sizeof(*l->nodes));
        a->n_nodes += l->n_nodes;
        for (size_t k = 0; k < l->n_namespaces; k++) {
            bool seen = false;
            for (size_t j = 0; j < a->n_namespaces && !seen; j++)
                seen = a->namespaces[j].id == l->namespaces[k].id;
            if (!seen)
                a->namespaces[a->n_namespaces++] = l->namespaces[k];
        }
    }
    return KVD_OK;
}

/* A fresh reply slot at the end of p->msgs. */
static kvd_msg_t *pages_add(kvd_list_pages_t *p)
{
    if (p->n == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 8;
        kvd_msg_t **m = realloc(p->msgs, cap * sizeof(*m));
        if (m == NULL)
            return NULL;
        p->msgs = m;
        p->cap = cap;
    }
    kvd_msg_t *rep = calloc(1, sizeof(*rep));
    if (rep != NULL)
        p->msgs[p->n++] = rep;
    return rep;
}

/*
 * Asks for pages until the daemon says there is no more (a reply without
 * next_cursor), limit entries are in, or KVD_LIST_PAGES_MAX pages came:
 * the daemon bounds each page's work, the caller still gets everything.
 */
static int pages_fetch(kvd_call_fn call, void *ctx, const kvd_list_req_t *first,
                       uint64_t limit, kvd_list_pages_t *p)
{
    uint64_t got = 0;
    kvd_msg_t req;
    kvd_msg_request(&req, 0, KVD_METHOD_LIST_PREFIXES);
    kvd_list_req_t *r = &req.body.list_req;
    *r = *first;
    for (;;) {
        if (p->n == KVD_LIST_PAGES_MAX || (limit && got >= limit)) {
            p->all.truncated = true;
            return KVD_OK;
        }
        kvd_msg_t *rep = pages_add(p);
        if (rep == NULL)
            return KVD_ERR_NOMEM;
        r->limit = (uint32_t)(limit ? limit - got : 0);
        int rc = call(ctx, &req, rep);
        if (rc != KVD_OK)
            return rc;
        const kvd_list_rep_t *l = &rep->body.list_rep;
        got += l->n_prefixes;
        if (!l->truncated || l->next_cursor_len == 0 ||
            l->next_cursor_len > sizeof(r->cursor)) {
            /* a daemon that truncates without a cursor cannot be continued */
            p->all.truncated = l->truncated;
            return KVD_OK;
        }
        memcpy(r->cursor, l->next_cursor, l->next_cursor_len);
        r->cursor_len = l->next_cursor_len;
    }
}

int kvd_list_fetch(kvd_call_fn call, void *ctx, const char *ns_name, bool nodes,
                   uint64_t limit, kvd_list_pages_t *p)
{
    memset(p, 0, sizeof(*p));
    kvd_list_req_t first = {.nodes = nodes};
    if (ns_name != NULL)
        kvd_strlcpy(first.ns_name, ns_name, sizeof(first.ns_name));
    int rc = pages_fetch(call, ctx, &first, KVD_MIN(limit, (uint64_t)UINT32_MAX), p);
    return rc == KVD_OK ? pages_join(p) : rc;
}

/* ---------------------------------------------------------------- lookup */

int kvd_lookup_named(kvd_call_fn call, void *ctx, const char *const *ns_names,
                     const uint32_t *trailing, size_t n_ns, const kvd_key_t *keys,
                     size_t n_keys, kvd_msg_t *rep, size_t *unknown)
{
    memset(rep, 0, sizeof(*rep));
    *unknown = n_ns;
    if (n_ns == 0 || n_ns > KVD_LOOKUP_POOLS_MAX || n_keys == 0)
        return KVD_ERR_INVALID;
    kvd_msg_t *table = calloc(1, sizeof(*table)), req;
    if (table == NULL)
        return KVD_ERR_NOMEM;
    /* the Stats reply's namespace table turns names into ids */
    kvd_msg_request(&req, 0, KVD_METHOD_STATS);
    int rc = call(ctx, &req, table);
    kvd_lookup_pool_msg_t pools[KVD_LOOKUP_POOLS_MAX];
    const kvd_stats_rep_t *st = &table->body.stats_rep;
    for (size_t p = 0; rc == KVD_OK && p < n_ns; p++) {
        pools[p] = (kvd_lookup_pool_msg_t){.trailing_pages = trailing ? trailing[p] : 0,
                                           .n_keys = n_keys,
                                           .keys = (kvd_key_t *)keys};
        rc = kvd_ns_msg_find(st->namespaces, st->n_namespaces, ns_names[p], &pools[p].ns);
        if (rc != KVD_OK)
            *unknown = p;
    }
    kvd_msg_clear(table);
    free(table);
    if (rc != KVD_OK)
        return rc;
    kvd_msg_request(&req, 0, KVD_METHOD_LOOKUP);
    req.body.lookup_req.n_pools = n_ns;
    req.body.lookup_req.pools = pools;
    return call(ctx, &req, rep);
}
