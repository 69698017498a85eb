/*
 * fuzz_store.c - the store's request handlers (daemon/rpc_store.c) against
 * an in-memory store, as the daemon serves them: no daemon, no pool bytes
 * (the engine is bookkeeping only).
 *
 * Input: one byte that sizes the pool (64 KiB << (b % 8)), then steps.
 * A step is an opcode byte: (op & 15) < 12 is a request of connection
 * (op >> 4) % N_CONNS, a chunk (16-bit little-endian length, payload)
 * decoded with the daemon's limits and served as the daemon would (Hello
 * registers its namespaces); 12 and 13 close a connection (its leases go,
 * as when its socket closes) and it comes back with a new id; 14 and 15
 * let time pass (the next u8 times 32 ms, a lease TTL being 1 s), and the
 * store expires leases. The connections differ in tenant, operator and
 * read-only flags.
 * Ids the store hands out are reachable whatever their values: a
 * namespace id of 0x80000000 + k in a request means the k-th one a reply
 * gave (modulo how many), a lease id of 2^63 + k likewise; other values go
 * as they are. So the seed corpus holds whatever the ids turn out to be.
 * Checked after every step: the store's invariant (kvd_store_check), and
 * that every reply answers its request, encodes, and decodes again; at the
 * end, with every connection closed, that no lease or pin is left.
 */
#include "fuzz_util.h"
#include "kvd_proto.h"
#include "kvd_store.h"
#include "options.h"
#include "rpc_store.h"

#define N_CONNS   5
#define LEASE_TTL 1000 /* ms */

static kvd_opts_t opts;
/* Error texts must be valid UTF-8 (issue 11, item 8: the client's bytes
 * were echoed into them, and long ones cut inside a character). Checked
 * unless KVD_FUZZ_UTF8=0. */
static bool check_utf8;

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    char name[] = "kvdockd";
    char *args[] = {name, NULL};
    /* the daemon's defaults: --max-batch, --max-frame, ... */
    FUZZ_CHECK(kvd_opts_parse(1, args, &opts) == KVD_OPTS_RUN, "default options");
    opts.lease_ttl_ms = LEASE_TTL;
    const char *u = getenv("KVD_FUZZ_UTF8");
    check_utf8 = u == NULL || strcmp(u, "0") != 0;
    kvd_log_set_level(KVD_LOG_ERROR); /* the engine's warnings are expected here */
    return 0;
}

static void check_store(const kvd_store_t *store, const char *after)
{
    char why[512] = "";
    int rc = kvd_store_check(store, why, sizeof(why));
    FUZZ_CHECK(rc == KVD_OK, "store invariant broken after %s: %s", after, why);
}

/* Whether s is valid UTF-8 (what proto3 requires of a string field). */
static bool utf8_ok(const char *s)
{
    const unsigned char *p = (const unsigned char *)s;
    while (*p) {
        size_t n = *p < 0x80             ? 0
                   : (*p & 0xe0) == 0xc0 ? 1
                   : (*p & 0xf0) == 0xe0 ? 2
                   : (*p & 0xf8) == 0xf0 ? 3
                                         : 4;
        if (n == 4 || (n == 1 && *p < 0xc2))
            return false;
        for (size_t k = 1; k <= n; k++)
            if ((p[k] & 0xc0) != 0x80)
                return false;
        p += n + 1;
    }
    return true;
}

/* A reply the daemon would send: it answers req, encodes, decodes. */
static void check_reply(const kvd_msg_t *req, const kvd_msg_t *rep)
{
    FUZZ_CHECK(rep->reply && rep->id == req->id && rep->method == req->method,
               "the reply to %s does not answer it", kvd_method_name(req->method));
    FUZZ_CHECK(rep->status <= 0, "status %d", rep->status);
    FUZZ_CHECK(memchr(rep->error, '\0', sizeof(rep->error)) != NULL, "error text");
    kvd_buf_t b;
    kvd_buf_init(&b, KVD_MEM_OTHER);
    int rc = kvd_msg_pack(rep, opts.max_frame_bytes, &b);
    FUZZ_CHECK(rc == KVD_OK, "the reply to %s (status %d) does not encode: %d",
               kvd_method_name(req->method), rep->status, rc);
    kvd_msg_t back;
    rc = kvd_msg_decode(b.data + KVD_FRAME_HEADER_BYTES, b.len - KVD_FRAME_HEADER_BYTES,
                        &back);
    FUZZ_CHECK(rc == KVD_OK, "the reply to %s does not decode: %d",
               kvd_method_name(req->method), rc);
    FUZZ_CHECK(back.status == rep->status && back.id == rep->id, "reply changed");
    if (check_utf8)
        FUZZ_CHECK(utf8_ok(back.error), "the error text of %s is not UTF-8: %s",
                   kvd_method_name(req->method), back.error);
    kvd_msg_clear(&back);
    kvd_buf_free(&b);
}

/* Hello as serve_hello does it (the store's part: its namespaces). */
static void serve_hello(kvd_store_t *store, const kvd_rpc_ctx_t *ctx,
                        const kvd_msg_t *req, kvd_msg_t *rep)
{
    const kvd_hello_req_t *h = &req->body.hello_req;
    if (h->n_namespaces > opts.max_batch) {
        kvd_msg_error(rep, req->id, req->method, KVD_ERR_TOO_LARGE, "too many");
        return;
    }
    uint32_t *ids = kvd_msg_alloc(rep, h->n_namespaces * sizeof(uint32_t) + 1);
    FUZZ_CHECK(ids != NULL, "out of memory");
    int rc = kvd_rpc_register(store, ctx, h->namespaces, h->n_namespaces, ids, req, rep);
    if (rc != KVD_OK) {
        FUZZ_CHECK(rep->status == rc, "register said %d, its reply %d", rc, rep->status);
        return;
    }
    rep->body.hello_rep.n_ns_ids = h->n_namespaces;
    rep->body.hello_rep.ns_ids = ids;
    rep->body.hello_rep.protocol_version = KVD_PROTOCOL_VERSION;
}

#define NS_REF    0x80000000u
#define LEASE_REF (1ull << 63)
#define SEEN_MAX  64

typedef struct seen {
    uint32_t ns[SEEN_MAX];
    size_t n_ns;
    uint64_t leases[SEEN_MAX];
    size_t n_leases;
} seen_t;

static seen_t seen;

static void map_ns(uint32_t *ns)
{
    if (*ns >= NS_REF && seen.n_ns > 0)
        *ns = seen.ns[(*ns - NS_REF) % seen.n_ns];
}

static void map_lease(uint64_t *id)
{
    if (*id >= LEASE_REF && seen.n_leases > 0)
        *id = seen.leases[(*id - LEASE_REF) % seen.n_leases];
}

static void see_ns(const uint32_t *ids, size_t n)
{
    for (size_t i = 0; i < n && seen.n_ns < SEEN_MAX; i++)
        seen.ns[seen.n_ns++] = ids[i];
}

static void see_lease(uint64_t id)
{
    if (id != 0 && seen.n_leases < SEEN_MAX)
        seen.leases[seen.n_leases++] = id;
}

static void map_ids(kvd_msg_t *req)
{
    switch (req->method) {
    case KVD_METHOD_RESERVE: map_ns(&req->body.reserve_req.ns); break;
    case KVD_METHOD_ACQUIRE: map_ns(&req->body.acquire_req.ns); break;
    case KVD_METHOD_LOOKUP:
        for (size_t i = 0; i < req->body.lookup_req.n_pools; i++)
            map_ns(&req->body.lookup_req.pools[i].ns);
        break;
    case KVD_METHOD_PUBLISH:
    case KVD_METHOD_REVOKE: map_lease(&req->body.finish_req.lease_id); break;
    case KVD_METHOD_RELEASE: map_lease(&req->body.release_req.lease_id); break;
    default: break;
    }
}

static void see_ids(const kvd_msg_t *rep)
{
    if (rep->status != KVD_OK)
        return;
    switch (rep->method) {
    case KVD_METHOD_HELLO:
        see_ns(rep->body.hello_rep.ns_ids, rep->body.hello_rep.n_ns_ids);
        break;
    case KVD_METHOD_REGISTER_NAMESPACE:
        see_ns(rep->body.register_rep.ids, rep->body.register_rep.n);
        break;
    case KVD_METHOD_RESERVE: see_lease(rep->body.reserve_rep.lease_id); break;
    case KVD_METHOD_ACQUIRE: see_lease(rep->body.acquire_rep.lease_id); break;
    default: break;
    }
}

static void serve(kvd_store_t *store, const kvd_rpc_ctx_t *ctx, const uint8_t *payload,
                  size_t len)
{
    kvd_msg_limits_t lim = {.max_items = opts.max_batch,
                            .max_pools = KVD_LOOKUP_POOLS_MAX};
    kvd_msg_t req, rep;
    int rc = kvd_msg_decode_limited(payload, len, &lim, &req);
    if (rc != KVD_OK || req.reply || req.status != KVD_OK) {
        kvd_msg_clear(&req); /* the daemon refuses it before the store sees it */
        return;
    }
    map_ids(&req);
    memset(&rep, 0, sizeof(rep));
    rep.id = req.id;
    rep.method = req.method;
    rep.reply = true;
    switch (req.method) {
    case KVD_METHOD_HELLO: serve_hello(store, ctx, &req, &rep); break;
    case KVD_METHOD_HEALTH:
    case KVD_METHOD_STATS: break; /* the server's, not the store's */
    default: kvd_rpc_store_serve(store, &opts, ctx, &req, &rep); break;
    }
    check_reply(&req, &rep);
    see_ids(&rep);
    check_store(store, kvd_method_name(req.method));
    kvd_msg_clear(&req);
    kvd_msg_clear(&rep);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_in_t in = {data, size};
    memset(&seen, 0, sizeof(seen));
    kvd_store_config_t cfg;
    kvd_store_config_default(&cfg, (64ull << 10) << (fuzz_u8(&in) % 8));
    cfg.lease_ttl_ms = LEASE_TTL;
    cfg.index_hint = 256;
    kvd_store_t *store = NULL;
    FUZZ_CHECK(kvd_store_create(&cfg, &store) == KVD_OK, "store");
    /* a second tenant, with small quotas */
    uint32_t t1 = 0;
    kvd_tenant_limits_t lim = {
        .max_bytes = 256u << 10, .max_pins = 64, .max_leases = 8, .max_namespaces = 4};
    FUZZ_CHECK(kvd_store_tenant_add(store, "t1", &lim, &t1) == KVD_OK, "tenant");
    kvd_rpc_ctx_t conns[N_CONNS] = {
        {.conn_id = 1, .tenant = 0},
        {.conn_id = 2, .tenant = 0},
        {.conn_id = 3, .tenant = t1},
        {.conn_id = 4, .tenant = 0, .is_operator = true},
        {.conn_id = 5, .tenant = t1, .read_only = true},
    };
    uint64_t next_conn = N_CONNS + 1;
    uint64_t now_ms = kvd_now_ns() / 1000000;
    while (fuzz_left(&in)) {
        uint8_t op = fuzz_u8(&in);
        kvd_rpc_ctx_t *c = &conns[(op >> 4) % N_CONNS];
        switch (op & 15) {
        case 12:
        case 13:
            kvd_store_owner_gone(store, c->conn_id);
            c->conn_id = next_conn++;
            check_store(store, "a connection closed");
            break;
        case 14:
        case 15: {
            uint64_t real = kvd_now_ns() / 1000000;
            now_ms = (now_ms > real ? now_ms : real) + (uint64_t)fuzz_u8(&in) * 32;
            kvd_store_expire(store, now_ms);
            check_store(store, "leases expired");
            break;
        }
        default: {
            size_t len;
            const uint8_t *payload = fuzz_chunk(&in, &len);
            if (len > 0)
                serve(store, c, payload, len);
        }
        }
    }
    for (size_t i = 0; i < N_CONNS; i++)
        kvd_store_owner_gone(store, conns[i].conn_id);
    check_store(store, "every connection closed");
    kvd_store_stats_t st;
    kvd_store_stats(store, &st);
    FUZZ_CHECK(st.leases == 0 && st.pins == 0 && st.objects_pinned == 0,
               "with every connection gone: %llu leases, %llu pins",
               (unsigned long long)st.leases, (unsigned long long)st.pins);
    kvd_store_destroy(store);
    return 0;
}
