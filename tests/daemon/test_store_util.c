/*
 * test_store_util.c - see test_store_util.h. Every decoded reply is cleared
 * with kvd_msg_clear() before a helper returns; nothing here signals or waits
 * for a process.
 */
#include "test_store_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

uint64_t ts_last_object_bytes;

const char *ts_result_name(unsigned r)
{
    static const char *const names[] = {"allocated", "exists", "in_flight", "no_space"};
    return r < KVD_ARRAY_SIZE(names) ? names[r] : "?";
}

kvd_ns_spec_t ts_spec(const char *name, uint64_t object_bytes)
{
    kvd_ns_spec_t s;
    memset(&s, 0, sizeof(s));
    kvd_strlcpy(s.name, name, sizeof(s.name));
    s.object_bytes = object_bytes;
    return s;
}

/* Sends req, fills err from the reply; returns the call's status. The
 * caller clears rep. */
static int call(kvd_client_t *c, kvd_msg_t *req, kvd_msg_t *rep, ts_err_t *err)
{
    memset(rep, 0, sizeof(*rep));
    int rc = kvd_client_call(c, req, rep, TS_RPC_TIMEOUT_MS);
    int status = rc != KVD_OK ? rc : rep->status;
    if (err != NULL) {
        memset(err, 0, sizeof(*err));
        err->status = status;
        if (rc == KVD_OK) {
            err->index = rep->error_index;
            kvd_strlcpy(err->text, rep->error, sizeof(err->text));
        } else {
            snprintf(err->text, sizeof(err->text), "call failed: %s", kvd_status_str(rc));
        }
    }
    return status;
}

/* ----------------------------------------------------------- the client */

int ts_open(ts_client_t *t, const char *socket, const kvd_ns_spec_t *specs, size_t n,
            bool map_pool)
{
    memset(t, 0, sizeof(*t));
    t->pool_fd = -1;
    if (!DT_CHECK(n <= TS_MAX_NS, "ts_open: %zu namespaces", n))
        return -1;
    int rc = kvd_client_connect_unix(socket, TS_RPC_TIMEOUT_MS, &t->c);
    if (!DT_CHECK(rc == KVD_OK, "connect %s: %s", socket, kvd_status_str(rc)))
        return -1;
    kvd_msg_t req, rep;
    kvd_msg_request(&req, 0, KVD_METHOD_HELLO);
    kvd_hello_req_t *h = &req.body.hello_req;
    kvd_strlcpy(h->client_name, "store-test", sizeof(h->client_name));
    h->pid = (uint32_t)getpid();
    h->protocol_version = KVD_PROTOCOL_VERSION;
    h->n_namespaces = n;
    h->namespaces = (kvd_ns_spec_t *)specs;
    h->want_pool_fd = map_pool;
    ts_err_t err;
    int st = call(t->c, &req, &rep, &err);
    if (st == KVD_OK) {
        const kvd_hello_rep_t *r = &rep.body.hello_rep;
        t->connection_id = r->connection_id;
        t->pool_bytes = r->pool_bytes;
        t->max_batch = r->max_batch;
        t->lease_ttl_ms = r->lease_ttl_ms;
        t->pool_fd_attached = r->pool_fd_attached;
        if (DT_CHECK(r->n_ns_ids == n, "hello: %zu namespace ids for %zu namespaces",
                     r->n_ns_ids, n)) {
            memcpy(t->ns, r->ns_ids, n * sizeof(uint32_t));
            t->n_ns = n;
        } else {
            st = KVD_ERR_PROTOCOL;
        }
    }
    kvd_msg_clear(&rep);
    if (!DT_CHECK(st == KVD_OK, "hello with %zu namespaces: %s (%s)", n,
                  kvd_status_str(st), err.text)) {
        ts_close(t);
        return -1;
    }
    if (!map_pool)
        return 0;
    t->pool_fd = kvd_client_take_fd(t->c);
    if (!DT_CHECK(t->pool_fd_attached && t->pool_fd >= 0,
                  "hello with want_pool_fd: attached %d, fd %d", t->pool_fd_attached,
                  t->pool_fd)) {
        ts_close(t);
        return -1;
    }
    struct stat sb;
    DT_CHECK(fstat(t->pool_fd, &sb) == 0 && (uint64_t)sb.st_size == t->pool_bytes,
             "the pool's descriptor has size %lld, hello says %llu",
             (long long)sb.st_size, (unsigned long long)t->pool_bytes);
    void *p =
        mmap(NULL, t->pool_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, t->pool_fd, 0);
    if (!DT_CHECK(p != MAP_FAILED, "mmap of the pool (%llu bytes) failed",
                  (unsigned long long)t->pool_bytes)) {
        ts_close(t);
        return -1;
    }
    t->pool = p;
    return 0;
}

void ts_close(ts_client_t *t)
{
    if (t->pool != NULL)
        munmap(t->pool, t->pool_bytes);
    if (t->pool_fd >= 0)
        close(t->pool_fd);
    kvd_client_close(t->c);
    t->pool = NULL;
    t->pool_fd = -1;
    t->c = NULL;
}

/* ----------------------------------------------------------------- RPCs */

int ts_register(kvd_client_t *c, const kvd_ns_spec_t *specs, size_t n, uint32_t *ids,
                ts_err_t *err)
{
    kvd_msg_t req, rep;
    kvd_msg_request(&req, 0, KVD_METHOD_REGISTER_NAMESPACE);
    req.body.register_req.n = n;
    req.body.register_req.namespaces = (kvd_ns_spec_t *)specs;
    int st = call(c, &req, &rep, err);
    if (st == KVD_OK && DT_CHECK(rep.body.register_rep.n == n,
                                 "register: %zu ids for %zu", rep.body.register_rep.n, n))
        memcpy(ids, rep.body.register_rep.ids, n * sizeof(uint32_t));
    kvd_msg_clear(&rep);
    return st;
}

void ts_chain_items(const kvd_key_t *keys, size_t n, const uint8_t *first_parent,
                    uint32_t first_depth, kvd_put_item_t *items)
{
    for (size_t i = 0; i < n; i++) {
        memset(&items[i], 0, sizeof(items[i]));
        memcpy(items[i].key, keys[i], KVD_KEY_BYTES);
        const uint8_t *parent = i == 0 ? first_parent : keys[i - 1];
        items[i].has_parent = parent != NULL;
        if (parent != NULL)
            memcpy(items[i].parent, parent, KVD_KEY_BYTES);
        items[i].depth = first_depth + (uint32_t)i;
    }
}

int ts_reserve(kvd_client_t *c, uint32_t ns, uint64_t object_bytes,
               const kvd_put_item_t *items, size_t n, uint64_t *lease, uint8_t *results,
               uint64_t *offsets, ts_err_t *err)
{
    kvd_msg_t req, rep;
    kvd_msg_request(&req, 0, KVD_METHOD_RESERVE);
    req.body.reserve_req = (kvd_reserve_req_t){
        .ns = ns, .object_bytes = object_bytes, .n = n, .items = (kvd_put_item_t *)items};
    int st = call(c, &req, &rep, err);
    *lease = 0;
    if (st == KVD_OK) {
        const kvd_reserve_rep_t *r = &rep.body.reserve_rep;
        if (DT_CHECK(r->n == n, "reserve: %zu results for %zu items", r->n, n)) {
            memcpy(results, r->results, n);
            memcpy(offsets, r->offsets, n * sizeof(uint64_t));
        } else {
            memset(results, 0xff, n);
        }
        *lease = r->lease_id;
        ts_last_object_bytes = r->object_bytes;
    }
    kvd_msg_clear(&rep);
    return st;
}

int ts_finish(kvd_client_t *c, kvd_method_t method, uint64_t lease, const kvd_key_t *keys,
              size_t n, ts_err_t *err)
{
    kvd_msg_t req, rep;
    kvd_msg_request(&req, 0, method);
    req.body.finish_req =
        (kvd_finish_req_t){.lease_id = lease, .n = n, .keys = (kvd_key_t *)keys};
    int st = call(c, &req, &rep, err);
    kvd_msg_clear(&rep);
    return st;
}

int ts_publish(kvd_client_t *c, uint64_t lease, const kvd_key_t *keys, size_t n,
               ts_err_t *err)
{
    return ts_finish(c, KVD_METHOD_PUBLISH, lease, keys, n, err);
}

int ts_acquire(kvd_client_t *c, uint32_t ns, uint64_t object_bytes, const kvd_key_t *keys,
               size_t n, uint64_t *lease, uint64_t *offsets, ts_err_t *err)
{
    return ts_acquire_wait(c, ns, object_bytes, keys, n, 0, lease, offsets, err);
}

int ts_acquire_wait(kvd_client_t *c, uint32_t ns, uint64_t object_bytes,
                    const kvd_key_t *keys, size_t n, uint32_t wait_ms, uint64_t *lease,
                    uint64_t *offsets, ts_err_t *err)
{
    kvd_msg_t req, rep;
    kvd_msg_request(&req, 0, KVD_METHOD_ACQUIRE);
    req.body.acquire_req = (kvd_acquire_req_t){.ns = ns,
                                               .object_bytes = object_bytes,
                                               .n = n,
                                               .keys = (kvd_key_t *)keys,
                                               .wait_ms = wait_ms};
    int st = call(c, &req, &rep, err);
    *lease = 0;
    if (st == KVD_OK) {
        const kvd_acquire_rep_t *r = &rep.body.acquire_rep;
        if (DT_CHECK(r->n == n, "acquire: %zu offsets for %zu keys", r->n, n) &&
            offsets != NULL)
            memcpy(offsets, r->offsets, n * sizeof(uint64_t));
        *lease = r->lease_id;
        ts_last_object_bytes = r->object_bytes;
    }
    kvd_msg_clear(&rep);
    return st;
}

int ts_release(kvd_client_t *c, uint64_t lease, ts_err_t *err)
{
    kvd_msg_t req, rep;
    kvd_msg_request(&req, 0, KVD_METHOD_RELEASE);
    req.body.release_req.lease_id = lease;
    int st = call(c, &req, &rep, err);
    kvd_msg_clear(&rep);
    return st;
}

int ts_lookup(kvd_client_t *c, const kvd_lookup_pool_msg_t *pools, size_t n_pools,
              uint32_t *b, size_t cap, size_t *nb, ts_err_t *err)
{
    kvd_msg_t req, rep;
    kvd_msg_request(&req, 0, KVD_METHOD_LOOKUP);
    req.body.lookup_req.n_pools = n_pools;
    req.body.lookup_req.pools = (kvd_lookup_pool_msg_t *)pools;
    int st = call(c, &req, &rep, err);
    *nb = 0;
    if (st == KVD_OK) {
        const kvd_lookup_rep_t *r = &rep.body.lookup_rep;
        DT_CHECK(r->n <= cap, "lookup: %zu boundaries, room for %zu", r->n, cap);
        *nb = KVD_MIN(r->n, cap);
        memcpy(b, r->boundaries, *nb * sizeof(uint32_t));
    }
    kvd_msg_clear(&rep);
    return st;
}

int ts_inspect(kvd_client_t *c, const char *ns_name, const uint8_t *key,
               kvd_obj_msg_t *objs, size_t cap, size_t *n, ts_err_t *err)
{
    kvd_msg_t req, rep;
    kvd_msg_request(&req, 0, KVD_METHOD_INSPECT);
    kvd_strlcpy(req.body.inspect_req.ns_name, ns_name, KVD_NS_NAME_BYTES);
    memcpy(req.body.inspect_req.key, key, KVD_KEY_BYTES);
    int st = call(c, &req, &rep, err);
    *n = 0;
    if (st == KVD_OK) {
        const kvd_inspect_rep_t *r = &rep.body.inspect_rep;
        *n = KVD_MIN(r->n_objects, cap);
        memcpy(objs, r->objects, *n * sizeof(*objs));
    }
    kvd_msg_clear(&rep);
    return st;
}

bool ts_put_items(ts_client_t *t, uint32_t ns, uint64_t object_bytes,
                  const kvd_put_item_t *items, size_t n, const char *what)
{
    uint8_t *res = calloc(n, 1);
    uint64_t *off = calloc(n, sizeof(*off));
    uint64_t lease = 0;
    ts_err_t e;
    bool ok = DT_CHECK(res && off, "out of memory");
    int st = ok ? ts_reserve(t->c, ns, object_bytes, items, n, &lease, res, off, &e)
                : KVD_ERR_NOMEM;
    ok = ok &&
         DT_CHECK(st == KVD_OK, "reserve %s: %s (%s)", what, kvd_status_str(st), e.text);
    for (size_t i = 0; ok && i < n; i++)
        ok = DT_CHECK(res[i] == KVD_RESERVE_ALLOCATED, "reserve %s item %zu: %s", what, i,
                      ts_result_name(res[i]));
    if (ok) {
        st = ts_publish(t->c, lease, NULL, 0, &e);
        ok = DT_CHECK(st == KVD_OK, "publish %s: %s (%s)", what, kvd_status_str(st),
                      e.text);
    }
    free(res);
    free(off);
    return ok;
}

int ts_stats(kvd_client_t *c, bool check, ts_stats_t *out)
{
    kvd_msg_t *req = calloc(2, sizeof(kvd_msg_t));
    if (req == NULL)
        return KVD_ERR_NOMEM;
    kvd_msg_t *rep = req + 1;
    kvd_msg_request(req, 0, KVD_METHOD_STATS);
    req->body.stats_req.check = check;
    ts_err_t e;
    int st = call(c, req, rep, &e);
    memset(out, 0, sizeof(*out));
    kvd_strlcpy(out->error, e.text, sizeof(out->error));
    if (st == KVD_OK) {
        const kvd_stats_rep_t *r = &rep->body.stats_rep;
        out->store = r->store;
        out->n_ns = KVD_MIN(r->n_namespaces, (size_t)TS_MAX_NS);
        memcpy(out->ns, r->namespaces, out->n_ns * sizeof(kvd_ns_msg_t));
        out->connections_current = r->connections_current;
        out->protocol_errors = r->protocol_errors;
        memcpy(out->methods, r->methods, sizeof(out->methods));
        out->checked = r->checked;
        kvd_strlcpy(out->check_error, r->check_error, sizeof(out->check_error));
        out->check_us = r->check_us;
    }
    kvd_msg_clear(rep);
    free(req);
    return st;
}

int ts_stats_fresh(const char *socket, bool check, ts_stats_t *out)
{
    kvd_client_t *c = NULL;
    int rc = kvd_client_connect_unix(socket, TS_RPC_TIMEOUT_MS, &c);
    if (rc != KVD_OK)
        return rc;
    rc = kvd_client_hello(c, "store-test", NULL, 0, TS_RPC_TIMEOUT_MS, NULL);
    if (rc == KVD_OK)
        rc = ts_stats(c, check, out);
    kvd_client_close(c);
    return rc;
}

const kvd_ns_msg_t *ts_stats_ns(const ts_stats_t *s, const char *name)
{
    for (size_t i = 0; i < s->n_ns; i++)
        if (strcmp(s->ns[i].name, name) == 0)
            return &s->ns[i];
    return NULL;
}

int ts_health_ok(kvd_client_t *c)
{
    kvd_msg_t req, rep;
    kvd_msg_request(&req, 0, KVD_METHOD_HEALTH);
    int st = call(c, &req, &rep, NULL);
    if (st == KVD_OK && rep.body.health_rep.state != KVD_HEALTH_READY)
        st = KVD_ERR_UNAVAILABLE;
    kvd_msg_clear(&rep);
    return st;
}

bool ts_wait_stats(const char *socket, int timeout_ms, bool (*pred)(const ts_stats_t *),
                   ts_stats_t *out)
{
    uint64_t deadline = kvd_now_ns() + (uint64_t)timeout_ms * 1000000ull;
    for (;;) {
        int rc = ts_stats_fresh(socket, false, out);
        if (rc == KVD_OK && pred(out))
            return true;
        if (kvd_now_ns() >= deadline)
            return false;
        kvd_sleep_ns(20000000);
    }
}

void ts_check_accounting(const ts_stats_t *s, const char *when)
{
    const kvd_store_stats_msg_t *st = &s->store;
    DT_CHECK(
        st->free_bytes + st->writing_bytes + st->ready_bytes + st->quarantined_bytes ==
            st->pool_bytes,
        "%s: free %llu + writing %llu + ready %llu + quarantined %llu != pool %llu", when,
        (unsigned long long)st->free_bytes, (unsigned long long)st->writing_bytes,
        (unsigned long long)st->ready_bytes, (unsigned long long)st->quarantined_bytes,
        (unsigned long long)st->pool_bytes);
}

void ts_cli_check(const char *socket, const char *when)
{
    static char out[1 << 16];
    int rc = dt_cli(out, sizeof(out),
                    (const char *[]){"--socket", socket, "stats", "--check", NULL});
    DT_CHECK(rc == 0, "%s: kvdock stats --check exited %d, want 0:\n%s", when, rc, out);
    DT_CHECK(strstr(out, "invariant check: ok (the daemon waited ") != NULL,
             "%s: kvdock stats --check does not say \"invariant check: ok\":\n%s", when,
             out);
}

/* ------------------------------------------------------- keys and bytes */

int ts_make_keys(uint32_t first_token, size_t n_pages, size_t page_size, kvd_key_t *keys)
{
    size_t n_tokens = n_pages * page_size;
    uint32_t *tokens = calloc(n_tokens ? n_tokens : 1, sizeof(uint32_t));
    if (!DT_CHECK(tokens != NULL, "out of memory"))
        return -1;
    for (size_t i = 0; i < n_tokens; i++)
        tokens[i] = first_token + (uint32_t)i;
    size_t n = 0;
    int rc = kvd_key_chain(tokens, n_tokens, page_size, NULL, keys, &n);
    free(tokens);
    if (!DT_CHECK(rc == KVD_OK && n == n_pages,
                  "kvd_key_chain: %s, %zu keys for %zu pages", kvd_status_str(rc), n,
                  n_pages))
        return -1;
    return 0;
}

void ts_fill(uint8_t *dst, size_t len, const uint8_t *key, uint32_t salt)
{
    for (size_t j = 0; j < len; j++)
        dst[j] = ts_pattern_byte(key, salt, j);
}

size_t ts_verify(const uint8_t *src, size_t len, const uint8_t *key, uint32_t salt)
{
    for (size_t j = 0; j < len; j++)
        if (src[j] != ts_pattern_byte(key, salt, j))
            return j;
    return SIZE_MAX;
}

bool ts_in_pool(uint64_t offset, uint64_t size, uint64_t pool_bytes)
{
    return size <= pool_bytes && offset <= pool_bytes - size;
}

void ts_hex8(const uint8_t *key, char out[17])
{
    char hex[65];
    kvd_key_to_hex(key, hex);
    memcpy(out, hex, 16);
    out[16] = '\0';
}

int ts_put_chain(const char *socket, const kvd_ns_spec_t *spec, const kvd_key_t *keys,
                 size_t n, uint32_t salt, const char *where)
{
    if (!DT_CHECK(n <= TS_CHAIN_MAX, "%s: a chain of %zu keys is over %d", where, n,
                  TS_CHAIN_MAX))
        return -1;
    ts_client_t t;
    if (ts_open(&t, socket, spec, 1, true) != 0)
        return -1;
    kvd_put_item_t items[TS_CHAIN_MAX];
    ts_chain_items(keys, n, NULL, 0, items);
    uint64_t lease = 0, offsets[TS_CHAIN_MAX];
    uint8_t results[TS_CHAIN_MAX];
    ts_err_t err;
    int rc = ts_reserve(t.c, t.ns[0], spec->object_bytes, items, n, &lease, results,
                        offsets, &err);
    bool ok = DT_CHECK(rc == KVD_OK, "%s: reserve: %s", where, err.text);
    for (size_t i = 0; ok && i < n; i++) {
        bool mine = DT_CHECK(results[i] == KVD_RESERVE_ALLOCATED && t.pool &&
                                 ts_in_pool(offsets[i], spec->object_bytes, t.pool_bytes),
                             "%s: reserve %zu: %s", where, i, ts_result_name(results[i]));
        if (mine)
            ts_fill(t.pool + offsets[i], spec->object_bytes, keys[i], salt);
        ok = mine;
    }
    if (rc == KVD_OK)
        ok &= DT_CHECK(ts_publish(t.c, lease, keys, n, &err) == KVD_OK, "%s: publish: %s",
                       where, err.text);
    ts_close(&t);
    return ok ? 0 : -1;
}
