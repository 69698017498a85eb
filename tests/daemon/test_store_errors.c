/*
 * Description: the store RPC's typed errors, each leaving the store as it
 * was and the connection open (daemon started with --max-batch 16).
 *   RegisterNamespace of an existing name with another size: INVALID, the
 *     message names both sizes, the namespace keeps its size; in a batch
 *     [new name, conflicting], item 2 is named and the new name is not
 *     registered either.
 *   Reserve / Acquire stating the wrong object size: INVALID.
 *   An unknown namespace id in Reserve, Acquire, Lookup: NOT_FOUND.
 *   Publish of a lease never granted: NOT_FOUND; of another connection's
 *     lease (Publish, Revoke, Release): PERMISSION; naming a key the lease
 *     does not hold: STATE, and its own key stays unpublished.
 *   Release of a write lease and Publish of a read lease: STATE.
 *   Release twice: NOT_FOUND.
 *   Acquire of a key still being written: BUSY with error_index = its
 *     position + 1; of a missing key: NOT_FOUND (index likewise); nothing
 *     pinned after either.
 *   Batches of 17 keys (Reserve, Acquire, Publish, Lookup): TOO_LARGE; 16 pass.
 * Every refusal leaves Stats' object, lease and pin counts as they were, and
 * Health still answers on the same connection. Then the wire: a hand-encoded
 * Acquire whose key is 32 bytes gets a typed NOT_FOUND on a raw socket that
 * stays open; the same frame with a 31-byte key gets a PROTOCOL error reply
 * and EOF; on another socket a hand-encoded Reserve takes a lease, then a
 * Reserve whose parent is 33 bytes gets a PROTOCOL error and EOF, and the
 * lease of that connection is undone (nothing left being written). Both
 * protocol errors are counted, the daemon keeps serving, and
 * `kvdock stats --check` is ok.
 */
#include "test_store_util.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define PAGE_SIZE 64
#define MAX_BATCH 16
#define N_STORED  4

static kvd_key_t stored[N_STORED];
static kvd_key_t many[MAX_BATCH + 1];

/* Checks a refusal: its status, and that the text has each needle. */
#define EXPECT_ERR(st, e, want, what)                                                    \
    DT_CHECK((st) == (want), "%s: got %s (%d, '%s'), want %s", what, kvd_status_str(st), \
             (st), (e).text, kvd_status_str(want))

/* The counts that a refused request must not change. */
typedef struct snapshot {
    uint64_t ready, writing, pinned, pins, leases, free_bytes;
} snapshot_t;

static snapshot_t snap(kvd_client_t *c)
{
    ts_stats_t s;
    snapshot_t n = {0};
    if (DT_CHECK(ts_stats(c, false, &s) == KVD_OK, "stats failed"))
        n = (snapshot_t){s.store.objects_ready,  s.store.objects_writing,
                         s.store.objects_pinned, s.store.pins,
                         s.store.leases,         s.store.free_bytes};
    return n;
}

static void expect_unchanged(kvd_client_t *c, const snapshot_t *before, const char *after)
{
    snapshot_t now = snap(c);
    DT_CHECK(memcmp(&now, before, sizeof(now)) == 0,
             "after %s the store changed: ready %llu->%llu, writing %llu->%llu, pinned "
             "%llu->%llu, pins %llu->%llu, leases %llu->%llu, free %llu->%llu",
             after, (unsigned long long)before->ready, (unsigned long long)now.ready,
             (unsigned long long)before->writing, (unsigned long long)now.writing,
             (unsigned long long)before->pinned, (unsigned long long)now.pinned,
             (unsigned long long)before->pins, (unsigned long long)now.pins,
             (unsigned long long)before->leases, (unsigned long long)now.leases,
             (unsigned long long)before->free_bytes, (unsigned long long)now.free_bytes);
    DT_CHECK(ts_health_ok(c) == KVD_OK, "after %s the connection no longer answers",
             after);
}

static void check_register(ts_client_t *a)
{
    snapshot_t before = snap(a->c);
    kvd_ns_spec_t spec = ts_spec(TS_KV_NS, 32768);
    uint32_t id = 0;
    ts_err_t e;
    int st = ts_register(a->c, &spec, 1, &id, &e);
    EXPECT_ERR(st, e, KVD_ERR_INVALID, "RegisterNamespace with another size");
    DT_CHECK(strstr(e.text, "65536") != NULL && strstr(e.text, "32768") != NULL,
             "the error should name both sizes (65536, 32768): '%s'", e.text);
    DT_CHECK(e.index == 1, "the error should name item 1, not %u", e.index);
    /* the same spec again is fine and gives the same id */
    spec.object_bytes = TS_KV_BYTES;
    st = ts_register(a->c, &spec, 1, &id, &e);
    DT_CHECK(st == KVD_OK && id == a->ns[0], "re-register with the same size: %s, id %u",
             kvd_status_str(st), id);
    ts_stats_t s;
    if (DT_CHECK(ts_stats(a->c, false, &s) == KVD_OK, "stats failed")) {
        const kvd_ns_msg_t *kv = ts_stats_ns(&s, TS_KV_NS);
        DT_CHECK(s.n_ns == 1 && kv != NULL && kv->object_bytes == TS_KV_BYTES,
                 "after the refused register: %zu namespaces, %s has %llu-byte objects",
                 s.n_ns, TS_KV_NS, kv ? (unsigned long long)kv->object_bytes : 0ull);
    }
    expect_unchanged(a->c, &before, "the refused RegisterNamespace");

    /* a batch whose second spec is refused registers nothing: rpc_store.c
     * says "A refused request changes nothing" */
    kvd_ns_spec_t two[2] = {ts_spec("m/other/tp0", 4096), ts_spec(TS_KV_NS, 32768)};
    uint32_t ids[2];
    st = ts_register(a->c, two, 2, ids, &e);
    EXPECT_ERR(st, e, KVD_ERR_INVALID, "RegisterNamespace [new, conflicting]");
    DT_CHECK(e.index == 2, "the error should name item 2, not %u", e.index);
    if (DT_CHECK(ts_stats(a->c, false, &s) == KVD_OK, "stats failed"))
        DT_CHECK(s.n_ns == 1 && ts_stats_ns(&s, "m/other/tp0") == NULL,
                 "after the refused RegisterNamespace [m/other/tp0, "
                 "%s with another size] there are %zu namespaces, m/other/tp0 %s",
                 TS_KV_NS, s.n_ns, ts_stats_ns(&s, "m/other/tp0") ? "exists" : "absent");
}

static void check_sizes_and_ids(ts_client_t *a)
{
    snapshot_t before = snap(a->c);
    kvd_put_item_t item;
    ts_chain_items(&many[0], 1, NULL, 0, &item);
    uint8_t res;
    uint64_t off, lease;
    ts_err_t e;
    int st = ts_reserve(a->c, a->ns[0], 32768, &item, 1, &lease, &res, &off, &e);
    EXPECT_ERR(st, e, KVD_ERR_INVALID, "Reserve with object_bytes 32768");
    DT_CHECK(strstr(e.text, "65536") && strstr(e.text, "32768"),
             "the size error should name both sizes: '%s'", e.text);
    st = ts_acquire(a->c, a->ns[0], 4096, stored, 1, &lease, NULL, &e);
    EXPECT_ERR(st, e, KVD_ERR_INVALID, "Acquire with object_bytes 4096");
    st = ts_reserve(a->c, 99, 0, &item, 1, &lease, &res, &off, &e);
    EXPECT_ERR(st, e, KVD_ERR_NOT_FOUND, "Reserve in namespace id 99");
    DT_CHECK(strstr(e.text, "99") != NULL, "the error should name id 99: '%s'", e.text);
    st = ts_acquire(a->c, 99, 0, stored, 1, &lease, NULL, &e);
    EXPECT_ERR(st, e, KVD_ERR_NOT_FOUND, "Acquire in namespace id 99");
    kvd_lookup_pool_msg_t pools[2] = {{.ns = a->ns[0], .n_keys = 1, .keys = stored},
                                      {.ns = 99, .n_keys = 1, .keys = stored}};
    uint32_t b[4];
    size_t nb;
    st = ts_lookup(a->c, pools, 2, b, 4, &nb, &e);
    EXPECT_ERR(st, e, KVD_ERR_NOT_FOUND, "Lookup naming namespace id 99");
    expect_unchanged(a->c, &before, "the refused sizes and namespace ids");
}

static void check_leases(ts_client_t *a, ts_client_t *b)
{
    ts_err_t e;
    snapshot_t before = snap(a->c);
    int st = ts_publish(a->c, 123456789, NULL, 0, &e);
    EXPECT_ERR(st, e, KVD_ERR_NOT_FOUND, "Publish of a lease never granted");
    st = ts_finish(a->c, KVD_METHOD_REVOKE, 123456789, NULL, 0, &e);
    EXPECT_ERR(st, e, KVD_ERR_NOT_FOUND, "Revoke of a lease never granted");
    st = ts_release(a->c, 123456789, &e);
    EXPECT_ERR(st, e, KVD_ERR_NOT_FOUND, "Release of a lease never granted");
    expect_unchanged(a->c, &before, "the unknown leases");

    /* B reserves one key; A may not finish B's lease */
    kvd_put_item_t item;
    ts_chain_items(&many[0], 1, NULL, 0, &item);
    uint8_t res;
    uint64_t off, blease = 0;
    st = ts_reserve(b->c, b->ns[0], TS_KV_BYTES, &item, 1, &blease, &res, &off, &e);
    if (!DT_CHECK(st == KVD_OK && res == KVD_RESERVE_ALLOCATED && blease != 0,
                  "B: reserve: %s (%s)", kvd_status_str(st), e.text))
        return;
    before = snap(a->c);
    st = ts_publish(a->c, blease, NULL, 0, &e);
    EXPECT_ERR(st, e, KVD_ERR_PERMISSION, "Publish of another connection's lease");
    st = ts_finish(a->c, KVD_METHOD_REVOKE, blease, NULL, 0, &e);
    EXPECT_ERR(st, e, KVD_ERR_PERMISSION, "Revoke of another connection's lease");
    st = ts_release(a->c, blease, &e);
    EXPECT_ERR(st, e, KVD_ERR_PERMISSION, "Release of another connection's lease");
    /* B names a key its lease does not hold: nothing is published */
    kvd_key_t two[2];
    memcpy(two[0], many[0], KVD_KEY_BYTES);
    memcpy(two[1], many[1], KVD_KEY_BYTES);
    st = ts_publish(b->c, blease, two, 2, &e);
    EXPECT_ERR(st, e, KVD_ERR_STATE, "Publish naming a key the lease does not hold");
    st = ts_release(b->c, blease, &e);
    EXPECT_ERR(st, e, KVD_ERR_STATE, "Release of a write lease");
    expect_unchanged(a->c, &before, "the refused lease operations");
    kvd_obj_msg_t o;
    size_t n = 0;
    st = ts_inspect(a->c, TS_KV_NS, many[0], &o, 1, &n, &e);
    DT_CHECK(st == KVD_OK && n == 1 && o.state == 1,
             "B's reserved key should still be being written: %s, state %u",
             kvd_status_str(st), n ? o.state : 0);

    /* Acquire while B still writes it: BUSY at position 3 (index 2 + 1) */
    kvd_key_t mix[3];
    memcpy(mix[0], stored[0], KVD_KEY_BYTES);
    memcpy(mix[1], stored[1], KVD_KEY_BYTES);
    memcpy(mix[2], many[0], KVD_KEY_BYTES);
    before = snap(a->c);
    uint64_t rlease = 0;
    st = ts_acquire(a->c, a->ns[0], TS_KV_BYTES, mix, 3, &rlease, NULL, &e);
    EXPECT_ERR(st, e, KVD_ERR_BUSY, "Acquire of a key being written");
    DT_CHECK(e.index == 3, "BUSY error_index %u, want 3 (position 2 + 1)", e.index);
    /* a missing key at position 2 */
    memset(mix[1], 0x5a, KVD_KEY_BYTES);
    st = ts_acquire(a->c, a->ns[0], TS_KV_BYTES, mix, 3, &rlease, NULL, &e);
    EXPECT_ERR(st, e, KVD_ERR_NOT_FOUND, "Acquire of a missing key");
    DT_CHECK(e.index == 2, "NOT_FOUND error_index %u, want 2 (position 1 + 1)", e.index);
    st = ts_acquire(a->c, a->ns[0], TS_KV_BYTES, &mix[1], 1, &rlease, NULL, &e);
    EXPECT_ERR(st, e, KVD_ERR_NOT_FOUND, "Acquire of one missing key");
    DT_CHECK(e.index == 1, "NOT_FOUND error_index %u, want 1", e.index);
    expect_unchanged(a->c, &before, "the refused Acquires");

    /* B publishes; then the read-lease errors */
    st = ts_publish(b->c, blease, NULL, 0, &e);
    DT_CHECK(st == KVD_OK, "B: publish: %s (%s)", kvd_status_str(st), e.text);
    st = ts_acquire(a->c, a->ns[0], TS_KV_BYTES, stored, N_STORED, &rlease, NULL, &e);
    if (!DT_CHECK(st == KVD_OK, "acquire: %s (%s)", kvd_status_str(st), e.text))
        return;
    before = snap(a->c);
    st = ts_publish(a->c, rlease, NULL, 0, &e);
    EXPECT_ERR(st, e, KVD_ERR_STATE, "Publish of a read lease");
    st = ts_release(b->c, rlease, &e);
    EXPECT_ERR(st, e, KVD_ERR_PERMISSION, "Release of another connection's read lease");
    expect_unchanged(a->c, &before, "the refused read-lease operations");
    st = ts_release(a->c, rlease, &e);
    DT_CHECK(st == KVD_OK, "release: %s (%s)", kvd_status_str(st), e.text);
    before = snap(a->c);
    st = ts_release(a->c, rlease, &e);
    EXPECT_ERR(st, e, KVD_ERR_NOT_FOUND, "Release twice");
    expect_unchanged(a->c, &before, "the second Release");
}

static void check_batches(ts_client_t *a)
{
    /* 16 items (many[1..16], all new): at the limit, allowed; revoked again */
    kvd_put_item_t items[MAX_BATCH + 1];
    ts_chain_items(many, MAX_BATCH + 1, NULL, 0, items);
    uint8_t res[MAX_BATCH + 1];
    uint64_t off[MAX_BATCH + 1], lease = 0;
    ts_err_t e;
    int st = ts_reserve(a->c, a->ns[0], TS_KV_BYTES, &items[1], MAX_BATCH, &lease, res,
                        off, &e);
    if (DT_CHECK(st == KVD_OK, "reserve of %d items (the limit): %s (%s)", MAX_BATCH,
                 kvd_status_str(st), e.text) &&
        lease != 0) {
        st = ts_finish(a->c, KVD_METHOD_REVOKE, lease, NULL, 0, &e);
        DT_CHECK(st == KVD_OK, "revoke: %s (%s)", kvd_status_str(st), e.text);
    }
    snapshot_t before = snap(a->c);
    kvd_put_item_t big[MAX_BATCH + 1];
    kvd_key_t bigkeys[MAX_BATCH + 1];
    for (int i = 0; i <= MAX_BATCH; i++)
        memset(bigkeys[i], 0x10 + i, KVD_KEY_BYTES);
    ts_chain_items(bigkeys, MAX_BATCH + 1, NULL, 0, big);
    st =
        ts_reserve(a->c, a->ns[0], TS_KV_BYTES, big, MAX_BATCH + 1, &lease, res, off, &e);
    EXPECT_ERR(st, e, KVD_ERR_TOO_LARGE, "Reserve of 17 items over --max-batch 16");
    st =
        ts_acquire(a->c, a->ns[0], TS_KV_BYTES, bigkeys, MAX_BATCH + 1, &lease, NULL, &e);
    EXPECT_ERR(st, e, KVD_ERR_TOO_LARGE, "Acquire of 17 keys");
    st = ts_publish(a->c, 1, bigkeys, MAX_BATCH + 1, &e);
    EXPECT_ERR(st, e, KVD_ERR_TOO_LARGE, "Publish naming 17 keys");
    kvd_lookup_pool_msg_t pool = {
        .ns = a->ns[0], .n_keys = MAX_BATCH + 1, .keys = bigkeys};
    uint32_t b[MAX_BATCH + 1];
    size_t nb;
    st = ts_lookup(a->c, &pool, 1, b, MAX_BATCH + 1, &nb, &e);
    EXPECT_ERR(st, e, KVD_ERR_TOO_LARGE, "Lookup of 17 keys");
    expect_unchanged(a->c, &before, "the oversize batches");
    /* none of the 17 keys was stored */
    kvd_obj_msg_t o;
    size_t n;
    st = ts_inspect(a->c, "", bigkeys[0], &o, 1, &n, &e);
    EXPECT_ERR(st, e, KVD_ERR_NOT_FOUND, "Inspect of a key of the refused batch");
}

/* ------------------------------------------------------ the wire, by hand */

typedef struct wbuf {
    uint8_t b[512];
    size_t n;
} wbuf_t;

static void put_varint(wbuf_t *w, uint64_t v)
{
    while (v >= 0x80 && w->n < sizeof(w->b)) {
        w->b[w->n++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    if (w->n < sizeof(w->b))
        w->b[w->n++] = (uint8_t)v;
}

static void put_uint(wbuf_t *w, uint32_t field, uint64_t v)
{
    put_varint(w, (uint64_t)field << 3 | 0);
    put_varint(w, v);
}

static void put_bytes(wbuf_t *w, uint32_t field, const void *p, size_t len)
{
    put_varint(w, (uint64_t)field << 3 | 2);
    put_varint(w, len);
    if (w->n + len <= sizeof(w->b)) {
        memcpy(w->b + w->n, p, len);
        w->n += len;
    }
}

/* Envelope{id, method, body field = inner}, framed (4-byte LE length). */
static void frame(wbuf_t *out, uint64_t id, uint32_t method, uint32_t body_field,
                  const wbuf_t *inner)
{
    wbuf_t env = {.n = 0};
    put_uint(&env, 1, id);
    put_uint(&env, 2, method);
    put_bytes(&env, body_field, inner->b, inner->n);
    out->n = 0;
    for (int i = 0; i < 4; i++)
        out->b[out->n++] = (uint8_t)(env.n >> (8 * i));
    memcpy(out->b + out->n, env.b, env.n);
    out->n += env.n;
}

/* AcquireRequest{ns, keys = [key of key_len bytes]} (field 24 of Envelope). */
static void acquire_frame(wbuf_t *out, uint64_t id, uint32_t ns, size_t key_len)
{
    uint8_t key[40];
    memset(key, 0x77, sizeof(key));
    wbuf_t req = {.n = 0};
    put_uint(&req, 1, ns);
    put_bytes(&req, 3, key, key_len);
    frame(out, id, KVD_METHOD_ACQUIRE, 24, &req);
}

/* ReserveRequest{ns, keys = one 32-byte key, parents = parent_len bytes
 * with has_parent = {1} when parent_len > 0, depths = [1]} (field 20). */
static void reserve_frame(wbuf_t *out, uint64_t id, uint32_t ns, size_t parent_len)
{
    uint8_t key[40];
    memset(key, 0x78, sizeof(key));
    const uint8_t one = 1;
    wbuf_t req = {.n = 0};
    put_uint(&req, 1, ns);
    put_bytes(&req, 3, key, KVD_KEY_BYTES);
    if (parent_len > 0) {
        put_bytes(&req, 4, key, parent_len);
        put_bytes(&req, 5, &one, 1);
    }
    put_uint(&req, 6, 1);
    frame(out, id, KVD_METHOD_RESERVE, 20, &req);
}

/* Sends f on fd, reads one reply frame and parses its envelope. */
static bool exchange(int fd, const wbuf_t *f, dt_wire_env_t *env, const char *what)
{
    uint8_t buf[4096];
    size_t len = 0;
    if (!DT_CHECK(dt_send_all(fd, f->b, f->n) == 0, "%s: send failed", what))
        return false;
    int rc = dt_read_frame(fd, buf, sizeof(buf), &len, 5000);
    if (!DT_CHECK(rc == 1, "%s: no reply frame (%d)", what, rc))
        return false;
    return DT_CHECK(dt_wire_parse(buf, len, env) == 0, "%s: the reply is not protobuf",
                    what);
}

static void check_wire(const kvd_test_daemon_t *d, ts_client_t *a)
{
    ts_stats_t s0;
    if (!DT_CHECK(ts_stats(a->c, false, &s0) == KVD_OK, "stats failed"))
        return;
    int fd = dt_raw_connect_unix(d->socket);
    if (!DT_CHECK(fd >= 0, "raw connect failed"))
        return;
    if (dt_raw_hello(fd) != 0) {
        close(fd);
        return;
    }
    /* the control: the encoder is right, a 32-byte key is a typed miss */
    wbuf_t f;
    dt_wire_env_t env;
    acquire_frame(&f, 41, a->ns[0], KVD_KEY_BYTES);
    if (exchange(fd, &f, &env, "hand-encoded Acquire (32-byte key)"))
        DT_CHECK(env.reply && env.id == 41 && env.method == KVD_METHOD_ACQUIRE &&
                     env.has_error && env.error_code == KVD_ERR_NOT_FOUND,
                 "hand-encoded Acquire (32-byte key): id %llu method %llu error %lld "
                 "'%s', want id 41, acquire, not found",
                 (unsigned long long)env.id, (unsigned long long)env.method,
                 (long long)env.error_code, env.error_message);
    acquire_frame(&f, 42, a->ns[0], KVD_KEY_BYTES);
    if (exchange(fd, &f, &env, "second hand-encoded Acquire"))
        DT_CHECK(env.id == 42 && env.error_code == KVD_ERR_NOT_FOUND,
                 "after a typed error the raw connection should still be served: id "
                 "%llu error %lld",
                 (unsigned long long)env.id, (long long)env.error_code);
    /* a 31-byte key: protocol error, then the daemon closes this connection */
    acquire_frame(&f, 43, a->ns[0], KVD_KEY_BYTES - 1);
    if (exchange(fd, &f, &env, "Acquire with a 31-byte key"))
        DT_CHECK(env.reply && env.has_error && env.error_code == KVD_ERR_PROTOCOL,
                 "Acquire with a 31-byte key: error %lld '%s', want protocol error",
                 (long long)env.error_code, env.error_message);
    DT_CHECK(dt_expect_eof(fd, 5000) == 0,
             "the connection should be closed after the protocol error");
    close(fd);

    fd = dt_raw_connect_unix(d->socket);
    if (DT_CHECK(fd >= 0, "raw connect failed") && dt_raw_hello(fd) == 0) {
        /* a well-formed Reserve first: this connection now holds a lease */
        reserve_frame(&f, 44, a->ns[0], 0);
        if (exchange(fd, &f, &env, "hand-encoded Reserve"))
            DT_CHECK(env.reply && env.id == 44 && env.method == KVD_METHOD_RESERVE &&
                         !env.has_error,
                     "hand-encoded Reserve: id %llu method %llu error %lld '%s', want a "
                     "reply without error",
                     (unsigned long long)env.id, (unsigned long long)env.method,
                     (long long)env.error_code, env.error_message);
        ts_stats_t mid;
        if (DT_CHECK(ts_stats(a->c, false, &mid) == KVD_OK, "stats failed"))
            DT_CHECK(mid.store.objects_writing == 1 && mid.store.leases == 1,
                     "after the raw Reserve: writing %llu, leases %llu; want 1, 1",
                     (unsigned long long)mid.store.objects_writing,
                     (unsigned long long)mid.store.leases);
        reserve_frame(&f, 45, a->ns[0], KVD_KEY_BYTES + 1);
        if (exchange(fd, &f, &env, "Reserve with a 33-byte parent"))
            DT_CHECK(env.has_error && env.error_code == KVD_ERR_PROTOCOL,
                     "Reserve with a 33-byte parent: error %lld '%s', want protocol",
                     (long long)env.error_code, env.error_message);
        DT_CHECK(dt_expect_eof(fd, 5000) == 0,
                 "the connection should be closed after the protocol error");
        close(fd);
    }

    /* the daemon and the typed-error connection carry on */
    DT_CHECK(ts_health_ok(a->c) == KVD_OK, "the first connection stopped answering");
    ts_stats_t s1;
    if (DT_CHECK(ts_stats_fresh(d->socket, true, &s1) == KVD_OK,
                 "a fresh connection is not served after the protocol errors")) {
        DT_CHECK(s1.protocol_errors == s0.protocol_errors + 2,
                 "protocol_errors %llu -> %llu, want +2",
                 (unsigned long long)s0.protocol_errors,
                 (unsigned long long)s1.protocol_errors);
        DT_CHECK(s1.store.objects_writing == 0 && s1.store.leases == 0 &&
                     s1.store.objects_ready == s0.store.objects_ready,
                 "the malformed frames changed the store: writing %llu, leases %llu, "
                 "ready %llu -> %llu",
                 (unsigned long long)s1.store.objects_writing,
                 (unsigned long long)s1.store.leases,
                 (unsigned long long)s0.store.objects_ready,
                 (unsigned long long)s1.store.objects_ready);
        DT_CHECK(s1.checked && s1.check_error[0] == '\0', "Stats(check): '%s'",
                 s1.check_error);
    }
}

static void store_pages(ts_client_t *a)
{
    kvd_put_item_t items[N_STORED];
    ts_chain_items(stored, N_STORED, NULL, 0, items);
    uint8_t res[N_STORED];
    uint64_t off[N_STORED], lease = 0;
    ts_err_t e;
    int st =
        ts_reserve(a->c, a->ns[0], TS_KV_BYTES, items, N_STORED, &lease, res, off, &e);
    DT_CHECK(st == KVD_OK && lease != 0, "reserve: %s (%s)", kvd_status_str(st), e.text);
    st = ts_publish(a->c, lease, NULL, 0, &e);
    DT_CHECK(st == KVD_OK, "publish: %s (%s)", kvd_status_str(st), e.text);
}

static void run(const kvd_test_daemon_t *d)
{
    if (ts_make_keys(0, N_STORED, PAGE_SIZE, stored) != 0 ||
        ts_make_keys(90000, MAX_BATCH + 1, PAGE_SIZE, many) != 0)
        return;
    kvd_ns_spec_t spec = ts_spec(TS_KV_NS, TS_KV_BYTES);
    ts_client_t a, b;
    if (ts_open(&a, d->socket, &spec, 1, false) != 0)
        return;
    if (ts_open(&b, d->socket, &spec, 1, false) != 0) {
        ts_close(&a);
        return;
    }
    DT_CHECK(a.max_batch == MAX_BATCH, "hello: max_batch %u, want %d", a.max_batch,
             MAX_BATCH);
    store_pages(&a);
    check_register(&a);
    check_sizes_and_ids(&a);
    check_leases(&a, &b);
    check_batches(&a);
    check_wire(d, &a);
    DT_CHECK(ts_health_ok(a.c) == KVD_OK && ts_health_ok(b.c) == KVD_OK,
             "the connections should survive every typed error");
    ts_stats_t s;
    if (DT_CHECK(ts_stats(a.c, false, &s) == KVD_OK, "stats failed"))
        DT_CHECK(s.connections_current == 2, "connections_current %llu, want 2 (a, b)",
                 (unsigned long long)s.connections_current);
    ts_close(&b);
    ts_close(&a);
    ts_cli_check(d->socket, "after every error");
}

int main(void)
{
    kvd_test_daemon_t d = {0};
    if (dt_start(&d, (const char *const[]){"--max-batch", "16", NULL}) == 0)
        run(&d);
    dt_stop(&d, SIGTERM, 10000);
    return dt_exit_status("daemon/store_errors");
}
