/*
 * gen_corpus.c - writes the seed corpus of the fuzz targets, one folder per
 * target under the directory given (fuzz/corpus), from valid messages of
 * every method:
 *   fuzz-gen-corpus fuzz/corpus
 * The files are small (a few hundred bytes each) and their names say what
 * they hold. Regression inputs (what a fuzzer once crashed on) live beside
 * them as crash-<what>, written by hand, never by this program.
 */
#include "kvd_common.h"
#include "kvd_proto.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char *root;

typedef struct out {
    uint8_t data[65536];
    size_t len;
} out_t;

static void put(out_t *o, const void *p, size_t n)
{
    if (o->len + n > sizeof(o->data)) {
        fprintf(stderr, "gen-corpus: a seed over %zu bytes\n", sizeof(o->data));
        exit(1);
    }
    memcpy(o->data + o->len, p, n);
    o->len += n;
}

static void put_u8(out_t *o, uint8_t v)
{
    put(o, &v, 1);
}

static void put_u16(out_t *o, size_t v)
{
    uint8_t b[2] = {(uint8_t)v, (uint8_t)(v >> 8)};
    put(o, b, 2);
}

static void write_seed(const char *target, const char *name, const out_t *o)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/%s", root, target);
    if (mkdir(path, 0755) != 0 && errno != EEXIST) {
        perror(path);
        exit(1);
    }
    snprintf(path, sizeof(path), "%s/%s/%s", root, target, name);
    FILE *f = fopen(path, "wb");
    if (f == NULL || fwrite(o->data, 1, o->len, f) != o->len || fclose(f) != 0) {
        perror(path);
        exit(1);
    }
}

/* The payload of m (no frame header). */
static void payload(const kvd_msg_t *m, kvd_buf_t *b)
{
    b->len = 0;
    if (kvd_msg_pack(m, KVD_FRAME_LIMIT_MAX, b) != KVD_OK) {
        fprintf(stderr, "gen-corpus: cannot encode %s\n", kvd_method_name(m->method));
        exit(1);
    }
    kvd_buf_consume(b, KVD_FRAME_HEADER_BYTES);
}

/* --------------------------------------------------------- messages */

static kvd_key_t keys[8];
static kvd_ns_spec_t specs[2];
static kvd_put_item_t items[3];
static kvd_lookup_pool_msg_t lpools[2];
static uint32_t ids[2] = {0, 1};
static uint64_t offsets[3] = {0, 4096, 8192};
static uint8_t results[3] = {KVD_RESERVE_ALLOCATED, KVD_RESERVE_EXISTS,
                             KVD_RESERVE_NO_SPACE};
static uint32_t bounds[2] = {1, 3};

static void init_data(void)
{
    for (size_t i = 0; i < 8; i++)
        memset(keys[i], (int)(0x11 * (i + 1)), KVD_KEY_BYTES);
    specs[0] = (kvd_ns_spec_t){.name = "model/kv", .object_bytes = 4096};
    specs[1] = (kvd_ns_spec_t){
        .name = "model/mla", .object_bytes = 8192, .rank_replicated = true};
    for (size_t i = 0; i < 3; i++) {
        memcpy(items[i].key, keys[i], KVD_KEY_BYTES);
        if (i > 0) {
            memcpy(items[i].parent, keys[i - 1], KVD_KEY_BYTES);
            items[i].has_parent = true;
        }
        items[i].depth = (uint32_t)i;
    }
}

static kvd_dir_keys_t dkeys[1];

/* A request of each method; ns and lease are what the fuzzer's maps take
 * (fuzz_store.c: 0x80000000 + k, 2^63 + k), or plain ids elsewhere. */
static void request(kvd_msg_t *m, kvd_method_t method, uint32_t ns, uint64_t lease)
{
    kvd_msg_request(m, 7, method);
    switch (method) {
    case KVD_METHOD_HELLO: {
        kvd_hello_req_t *h = &m->body.hello_req;
        strcpy(h->client_name, "seed");
        h->pid = 42;
        h->protocol_version = KVD_PROTOCOL_VERSION;
        h->n_namespaces = 2;
        h->namespaces = specs;
        h->want_pool_fd = true;
        memcpy(h->auth_token, "secret", 6);
        h->auth_token_len = 6;
        break;
    }
    case KVD_METHOD_STATS: m->body.stats_req.check = true; break;
    case KVD_METHOD_REGISTER_NAMESPACE:
        m->body.register_req = (kvd_register_req_t){.n = 1, .namespaces = &specs[0]};
        break;
    case KVD_METHOD_LOOKUP:
        lpools[0] = (kvd_lookup_pool_msg_t){.ns = ns, .n_keys = 3, .keys = keys};
        lpools[1] = (kvd_lookup_pool_msg_t){
            .ns = ns, .trailing_pages = 1, .n_keys = 3, .keys = keys};
        m->body.lookup_req = (kvd_lookup_req_t){.n_pools = 2, .pools = lpools};
        break;
    case KVD_METHOD_RESERVE:
        m->body.reserve_req =
            (kvd_reserve_req_t){.ns = ns, .object_bytes = 4096, .n = 3, .items = items};
        break;
    case KVD_METHOD_PUBLISH:
    case KVD_METHOD_REVOKE:
        m->body.finish_req = (kvd_finish_req_t){.lease_id = lease};
        break;
    case KVD_METHOD_ACQUIRE:
        m->body.acquire_req =
            (kvd_acquire_req_t){.ns = ns, .object_bytes = 4096, .n = 2, .keys = keys};
        break;
    case KVD_METHOD_RELEASE: m->body.release_req.lease_id = lease; break;
    case KVD_METHOD_LIST_PREFIXES: m->body.list_req.nodes = true; break;
    case KVD_METHOD_INSPECT:
        memcpy(m->body.inspect_req.key, keys[1], KVD_KEY_BYTES);
        break;
    case KVD_METHOD_EVICT: m->body.evict_req.all = true; break;
    case KVD_METHOD_DIR_ANNOUNCE:
        dkeys[0] = (kvd_dir_keys_t){
            .n_added = 2, .added = keys, .n_removed = 1, .removed = keys + 2};
        strcpy(dkeys[0].tenant, "default");
        strcpy(dkeys[0].ns_name, "m/kv");
        m->body.dir_announce_req = (kvd_dir_announce_req_t){.holder = "node-1",
                                                            .holder_started_ms = 1,
                                                            .reset = true,
                                                            .n = 1,
                                                            .batches = dkeys};
        break;
    case KVD_METHOD_DIR_LOOKUP:
        dkeys[0] = (kvd_dir_keys_t){.n_added = 3, .added = keys};
        strcpy(dkeys[0].tenant, "default");
        strcpy(dkeys[0].ns_name, "m/kv");
        m->body.dir_lookup_req = (kvd_dir_lookup_req_t){.n = 1, .queries = dkeys};
        break;
    case KVD_METHOD_FETCH:
        m->body.fetch_req = (kvd_fetch_req_t){
            .tenant = "default", .ns_name = "m/kv", .n = 2, .keys = keys};
        break;
    default: break;
    }
}

/* A reply of each method, as a daemon sends it. */
static void reply(kvd_msg_t *m, kvd_method_t method)
{
    memset(m, 0, sizeof(*m));
    m->id = 7;
    m->method = method;
    m->reply = true;
    switch (method) {
    case KVD_METHOD_HELLO: {
        kvd_hello_rep_t *h = &m->body.hello_rep;
        strcpy(h->daemon_version, "0.1.0");
        strcpy(h->instance, "default");
        strcpy(h->tenant, "default");
        h->protocol_version = KVD_PROTOCOL_VERSION;
        h->max_frame_bytes = KVD_FRAME_DEFAULT_MAX;
        h->max_batch = 4096;
        h->pool_bytes = 1 << 20;
        h->connection_id = 3;
        h->n_ns_ids = 2;
        h->ns_ids = ids;
        h->pool_fd_attached = true;
        h->lease_ttl_ms = 30000;
        break;
    }
    case KVD_METHOD_HEALTH:
        m->body.health_rep =
            (kvd_health_rep_t){KVD_HEALTH_READY, 1 << 20, 4096, 100, KVD_CLUSTER_READY};
        break;
    case KVD_METHOD_STATS:
        strcpy(m->body.stats_rep.daemon_version, "0.1.0");
        m->body.stats_rep.state = KVD_HEALTH_READY;
        m->body.stats_rep.store.pool_bytes = 1 << 20;
        m->body.stats_rep.checked = true;
        break;
    case KVD_METHOD_REGISTER_NAMESPACE:
        m->body.register_rep = (kvd_ids_rep_t){.n = 1, .ids = ids};
        break;
    case KVD_METHOD_LOOKUP:
        m->body.lookup_rep = (kvd_lookup_rep_t){.n = 2, .boundaries = bounds};
        break;
    case KVD_METHOD_RESERVE:
        m->body.reserve_rep = (kvd_reserve_rep_t){.lease_id = 5,
                                                  .object_bytes = 4096,
                                                  .n = 3,
                                                  .results = results,
                                                  .offsets = offsets};
        break;
    case KVD_METHOD_ACQUIRE:
        m->body.acquire_rep = (kvd_acquire_rep_t){
            .lease_id = 6, .object_bytes = 4096, .n = 2, .offsets = offsets};
        break;
    case KVD_METHOD_EVICT: m->body.evict_rep.evicted = 2; break;
    case KVD_METHOD_LIST_PREFIXES: m->body.list_rep.truncated = true; break;
    default: break;
    }
}

/* ------------------------------------------------------------ proto */

static void gen_proto(void)
{
    kvd_buf_t b;
    kvd_buf_init(&b, KVD_MEM_OTHER);
    for (int m = 1; m < KVD_METHOD_COUNT; m++) {
        for (int rep = 0; rep < 2; rep++) {
            kvd_msg_t msg;
            if (rep)
                reply(&msg, (kvd_method_t)m);
            else
                request(&msg, (kvd_method_t)m, 0, 5);
            b.len = 0;
            if (kvd_msg_pack(&msg, KVD_FRAME_LIMIT_MAX, &b) != KVD_OK)
                exit(1);
            out_t o = {.len = 0};
            put_u8(&o, rep ? 7 : 0); /* arriving in 7-byte pieces, or whole */
            put(&o, b.data, b.len);
            char name[64];
            snprintf(name, sizeof(name), "%s-%s", kvd_method_name((kvd_method_t)m),
                     rep ? "reply" : "request");
            write_seed("proto", name, &o);
        }
    }
    /* an error reply, one with no method (the daemon refusing a frame) */
    kvd_msg_t e;
    kvd_msg_error(&e, 0, KVD_METHOD_NONE, KVD_ERR_PROTOCOL, "malformed frame");
    b.len = 0;
    kvd_msg_pack(&e, KVD_FRAME_LIMIT_MAX, &b);
    out_t o = {.len = 0};
    put_u8(&o, 1);
    put(&o, b.data, b.len);
    write_seed("proto", "error-no-method", &o);
    kvd_buf_free(&b);
}

/* ------------------------------------------------------------ store */

static void store_req(out_t *o, uint8_t conn, kvd_method_t method, uint32_t ns,
                      uint64_t lease)
{
    kvd_msg_t m;
    request(&m, method, ns, lease);
    kvd_buf_t b;
    kvd_buf_init(&b, KVD_MEM_OTHER);
    payload(&m, &b);
    put_u8(o, (uint8_t)(conn << 4)); /* op < 12: a request of connection conn */
    put_u16(o, b.len);
    put(o, b.data, b.len);
    kvd_buf_free(&b);
}

#define NS(k)    (0x80000000u + (k))
#define LEASE(k) ((1ull << 63) + (k))

static void gen_store(void)
{
    /* each method alone, after a Hello that registers the namespaces */
    for (int m = 1; m < KVD_METHOD_COUNT; m++) {
        out_t o = {.len = 0};
        put_u8(&o, 4);
        store_req(&o, 0, KVD_METHOD_HELLO, 0, 0);
        store_req(&o, 0, (kvd_method_t)m, NS(0), LEASE(0));
        write_seed("store", kvd_method_name((kvd_method_t)m), &o);
    }
    /* a page's life: reserve, publish, look up, acquire, release, list,
     * inspect, evict */
    out_t o = {.len = 0};
    put_u8(&o, 4);
    store_req(&o, 0, KVD_METHOD_HELLO, 0, 0);
    store_req(&o, 0, KVD_METHOD_RESERVE, NS(0), 0);
    store_req(&o, 0, KVD_METHOD_PUBLISH, 0, LEASE(0));
    store_req(&o, 1, KVD_METHOD_LOOKUP, NS(0), 0);
    store_req(&o, 1, KVD_METHOD_ACQUIRE, NS(0), 0);
    store_req(&o, 1, KVD_METHOD_LIST_PREFIXES, 0, 0);
    store_req(&o, 1, KVD_METHOD_INSPECT, 0, 0);
    store_req(&o, 1, KVD_METHOD_RELEASE, 0, LEASE(1));
    store_req(&o, 3, KVD_METHOD_EVICT, 0, 0);
    write_seed("store", "lifecycle", &o);
    /* a writer that goes away, a reader whose lease lapses, other tenants */
    o.len = 0;
    put_u8(&o, 2);
    store_req(&o, 0, KVD_METHOD_HELLO, 0, 0);
    store_req(&o, 2, KVD_METHOD_HELLO, 0, 0);
    store_req(&o, 0, KVD_METHOD_RESERVE, NS(0), 0);
    put_u8(&o, 12); /* connection 0 closes */
    store_req(&o, 2, KVD_METHOD_RESERVE, NS(2), 0);
    store_req(&o, 2, KVD_METHOD_PUBLISH, 0, LEASE(1));
    store_req(&o, 4, KVD_METHOD_ACQUIRE, NS(2), 0);
    put_u8(&o, 14); /* time passes: 2 s, over the 1 s TTL */
    put_u8(&o, 64);
    store_req(&o, 4, KVD_METHOD_RELEASE, 0, LEASE(2));
    store_req(&o, 3, KVD_METHOD_EVICT, 0, 0);
    write_seed("store", "owner-gone-ttl", &o);
    /* a namespace name that is not UTF-8, echoed by the error text (run
     * with KVD_FUZZ_UTF8=1, fuzz_store.c) */
    o.len = 0;
    put_u8(&o, 4);
    kvd_msg_t m;
    request(&m, KVD_METHOD_INSPECT, 0, 0);
    strcpy(m.body.inspect_req.ns_name, "\xff\xfe");
    kvd_buf_t b;
    kvd_buf_init(&b, KVD_MEM_OTHER);
    payload(&m, &b);
    put_u8(&o, 0);
    put_u16(&o, b.len);
    put(&o, b.data, b.len);
    kvd_buf_free(&b);
    write_seed("store", "inspect-ns-not-utf8", &o);
}

/* ----------------------------------------------------------- linker */

static void script(out_t *o, uint8_t op, const kvd_msg_t *m)
{
    put_u8(o, op);
    if (m == NULL) {
        put_u16(o, 0);
        return;
    }
    kvd_buf_t b;
    kvd_buf_init(&b, KVD_MEM_OTHER);
    payload(m, &b);
    put_u16(o, b.len);
    put(o, b.data, b.len);
    kvd_buf_free(&b);
}

enum { GOOD = 2, GOOD_FD = 2 | 8, AS_IS = 0 };

static void gen_linker(void)
{
    /* the linker's RPCs in order: Hello, RegisterNamespace, Lookup,
     * Acquire, Release, Reserve, Publish (some steps are skipped when an
     * earlier one failed) */
    out_t o = {.len = 0};
    put_u8(&o, 0);
    script(&o, GOOD_FD, NULL);
    for (int i = 0; i < 8; i++)
        script(&o, GOOD, NULL);
    write_seed("linker", "all-good", &o);
    /* one garbled reply at each step, the others good */
    static const kvd_method_t garble[] = {
        KVD_METHOD_HELLO,   KVD_METHOD_REGISTER_NAMESPACE,
        KVD_METHOD_LOOKUP,  KVD_METHOD_ACQUIRE,
        KVD_METHOD_RELEASE, KVD_METHOD_RESERVE,
        KVD_METHOD_PUBLISH};
    for (size_t k = 0; k < KVD_ARRAY_SIZE(garble); k++) {
        o.len = 0;
        put_u8(&o, 0);
        for (size_t i = 0; i < 8; i++) {
            if (i != k) {
                script(&o, i == 0 ? GOOD_FD : GOOD, NULL);
                continue;
            }
            kvd_msg_t m;
            reply(&m, garble[k]);
            script(&o, i == 0 ? AS_IS | 8 : AS_IS, &m);
        }
        char name[64];
        snprintf(name, sizeof(name), "reply-%s", kvd_method_name(garble[k]));
        write_seed("linker", name, &o);
    }
    /* a Hello reply whose pool is larger than the descriptor attached,
     * then offsets past the descriptor's end (inside the pool said) */
    o.len = 0;
    put_u8(&o, 0);
    kvd_msg_t h;
    reply(&h, KVD_METHOD_HELLO);
    h.body.hello_rep.n_ns_ids = 0;
    h.body.hello_rep.pool_bytes = 64u << 20;
    script(&o, AS_IS | 8, &h);
    script(&o, GOOD, NULL); /* register */
    script(&o, GOOD, NULL); /* lookup */
    static uint64_t far[4] = {32u << 20, (32u << 20) + 4096, (32u << 20) + 8192,
                              (32u << 20) + 12288};
    kvd_msg_t a;
    reply(&a, KVD_METHOD_ACQUIRE);
    a.body.acquire_rep.n = 4;
    a.body.acquire_rep.object_bytes = 0;
    a.body.acquire_rep.offsets = far;
    script(&o, AS_IS, &a);
    for (int i = 0; i < 4; i++)
        script(&o, GOOD, NULL);
    write_seed("linker", "pool-larger-than-fd", &o);
    /* the reply to a Lookup is an Acquire reply (another method's body) */
    o.len = 0;
    put_u8(&o, 0);
    script(&o, GOOD_FD, NULL);
    script(&o, GOOD, NULL);
    reply(&a, KVD_METHOD_ACQUIRE);
    a.body.acquire_rep.lease_id = 2; /* read as the Lookup's count */
    script(&o, AS_IS | 4, &a);
    for (int i = 0; i < 4; i++)
        script(&o, GOOD, NULL);
    write_seed("linker", "reply-of-another-method", &o);
    /* an error reply, a refusal (id 0), a cut frame, a close */
    o.len = 0;
    put_u8(&o, 0);
    script(&o, GOOD_FD, NULL);
    kvd_msg_t e;
    kvd_msg_error(&e, 0, KVD_METHOD_REGISTER_NAMESPACE, KVD_ERR_EXISTS, "exists");
    script(&o, AS_IS, &e);
    write_seed("linker", "error-reply", &o);
    o.len = 0;
    put_u8(&o, 1 | 2 << 1); /* the client alone, three calls */
    reply(&e, KVD_METHOD_HEALTH);
    script(&o, AS_IS, &e);
    put_u8(&o, 1);
    put_u16(&o, 3);
    put(&o, "\x10\x00\x00", 3);
    script(&o, 3, NULL);
    write_seed("linker", "client-cut-frame", &o);
}

/* ------------------------------------------------------------ parse */

static void parse_str(const char *name, const char *s)
{
    out_t o = {.len = 0};
    put_u8(&o, 0);
    put(&o, s, strlen(s));
    write_seed("parse", name, &o);
}

/* words separated by '|' become NUL-separated */
static void parse_cli(const char *name, const char *file, const char *words)
{
    out_t o = {.len = 0};
    put_u8(&o, 1);
    put_u16(&o, strlen(file));
    put(&o, file, strlen(file));
    for (const char *p = words; *p; p++)
        put_u8(&o, *p == '|' ? 0 : (uint8_t)*p);
    write_seed("parse", name, &o);
}

static void gen_parse(void)
{
    char hex[65];
    kvd_key_to_hex(keys[2], hex);
    parse_str("size-fraction", "1.5G");
    parse_str("size-spaces", " 2 KiB ");
    parse_str("size-dot", ".5k");
    parse_str("u64-max", "18446744073709551615");
    parse_str("u64-over", "18446744073709551616");
    parse_str("key", hex);
    parse_str("host-v6", "[::1]:7070");
    parse_str("host-v4", "127.0.0.1:9");
    parse_str("level", "debug");
    char line[512];
    parse_cli("cli-hash", "", "hash|--page-size|2|1|2|3|4|5");
    parse_cli("cli-hash-file", "1,2 3\n4\t5,6",
              "--json|hash|--page-size=3|--tokens-file|/f");
    snprintf(line, sizeof(line), "hash|--page-size|1|--prior|%s|7|8", hex);
    parse_cli("cli-hash-prior", "", line);
    snprintf(line, sizeof(line), "lookup|--namespace|a|--namespace|b|--trailing|0,1|%s",
             hex);
    parse_cli("cli-lookup", "", line);
    snprintf(line, sizeof(line), "--timeout|50|show|%s|--namespace|a", hex);
    parse_cli("cli-show", "", line);
    parse_cli("cli-evict", "", "evict|--all");
    parse_cli("cli-prefixes", "", "prefixes|--tree|--limit|5|--json");
    parse_cli("cli-stats", "", "--instance|x|stats|--check");
    parse_cli("cli-help", "", "--help");
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: fuzz-gen-corpus DIR (fuzz/corpus)\n");
        return 2;
    }
    root = argv[1];
    mkdir(root, 0755);
    init_data();
    gen_proto();
    gen_store();
    gen_linker();
    gen_parse();
    return 0;
}
