/*
 * msg.c - conversion between kvd_msg_t and the protobuf-c Envelope.
 *
 * Packing builds the generated structs pointing into the caller's kvd_msg_t;
 * what needs arrays of pointers (repeated messages, repeated bytes) is
 * built in a scratch arena freed before returning. Decoding unpacks with a
 * budgeted allocator (every block charged to KVD_MEM_CONN, the whole unpack
 * bounded by a multiple of the payload's size), checks the request limits,
 * copies into kvd_msg_t (variable parts into the message's arena) and frees
 * the unpacked tree. Anything that does not fit the C side (a key that is
 * not KVD_KEY_BYTES long, a string longer than its field) is a protocol
 * error, never a silent truncation.
 *
 * The flat messages (NamespaceSpec, StoreStats, NamespaceInfo, ObjectInfo,
 * Nic) are converted from their field lists (kvd_proto.h), never field by
 * field by hand: adding a field to a list and to kvdock.proto is all it
 * takes.
 */
#include "kvd_proto.h"
#include "kvdock.pb-c.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

const char *kvd_method_name(kvd_method_t m)
{
    static const char *const names[KVD_METHOD_COUNT] = {
        "none",    "hello",   "health",  "stats",        "register",   "lookup",
        "reserve", "publish", "revoke",  "acquire",      "release",    "list_prefixes",
        "inspect", "evict",   "cluster", "dir_announce", "dir_lookup", "fetch"};
    return (unsigned)m < KVD_METHOD_COUNT ? names[m] : "unknown";
}

const char *kvd_health_name(kvd_health_t h)
{
    switch (h) {
    case KVD_HEALTH_STARTING: return "starting";
    case KVD_HEALTH_READY: return "ready";
    case KVD_HEALTH_DRAINING: return "draining";
    default: return "unknown";
    }
}

const char *kvd_cluster_state_name(kvd_cluster_state_t c)
{
    switch (c) {
    case KVD_CLUSTER_OFF: return "off";
    case KVD_CLUSTER_JOINING: return "joining";
    case KVD_CLUSTER_READY: return "ready";
    case KVD_CLUSTER_DEGRADED: return "degraded";
    default: return "unknown";
    }
}

uint64_t kvd_latency_bound_us(size_t i)
{
    static const uint64_t bounds[KVD_LATENCY_BUCKETS] = {
        5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 50000, 250000, UINT64_MAX};
    return i < KVD_LATENCY_BUCKETS ? bounds[i] : UINT64_MAX;
}

/* ---------------------------------------------------------------- arena */

struct kvd_arena_block {
    kvd_arena_block_t *next;
    size_t bytes;
    max_align_t data[];
};

void *kvd_msg_alloc(kvd_msg_t *m, size_t bytes)
{
    if (bytes > SIZE_MAX - sizeof(kvd_arena_block_t))
        return NULL;
    size_t total = sizeof(kvd_arena_block_t) + (bytes ? bytes : 1);
    kvd_arena_block_t *b = kvd_mem_calloc(KVD_MEM_CONN, 1, total);
    if (b == NULL)
        return NULL;
    b->bytes = total;
    b->next = m->arena;
    m->arena = b;
    return b->data;
}

void kvd_msg_clear(kvd_msg_t *m)
{
    for (kvd_arena_block_t *b = m->arena, *next; b != NULL; b = next) {
        next = b->next;
        kvd_mem_free(KVD_MEM_CONN, b, b->bytes);
    }
    memset(m, 0, sizeof(*m));
}

void kvd_msg_request(kvd_msg_t *m, uint64_t id, kvd_method_t method)
{
    memset(m, 0, sizeof(*m));
    m->id = id;
    m->method = method;
}

void kvd_msg_error(kvd_msg_t *m, uint64_t id, kvd_method_t method, int status,
                   const char *fmt, ...)
{
    memset(m, 0, sizeof(*m));
    m->id = id;
    m->method = method;
    m->reply = true;
    m->status = status;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m->error, sizeof(m->error), fmt, ap);
    va_end(ap);
}

/* n zeroed elements of `size` in m's arena; NULL only when out of memory.
 * An empty array costs nothing: it points at a shared, never written
 * object, so a message without variable parts owns no memory. */
static void *arena_array(kvd_msg_t *m, size_t n, size_t size)
{
    static max_align_t empty;
    if (n == 0)
        return &empty;
    if (size && n > SIZE_MAX / size)
        return NULL;
    return kvd_msg_alloc(m, n * size);
}

/* -------------------------------------------------------- flat messages */

/* The messages of the field lists (kvd_proto.h), made field by field from
 * their lists: one function each way, and arrays of them. */

/* Copies a protobuf string into a fixed field; longer, or not UTF-8 (proto3
 * requires it of a string field, so a parser refuses the message), is a
 * protocol error. */
static int copy_str(char *dst, size_t dst_len, const char *src)
{
    if (src == NULL) {
        dst[0] = '\0';
        return KVD_OK;
    }
    size_t n = strlen(src);
    if (n >= dst_len || !kvd_utf8_valid(src, n))
        return KVD_ERR_PROTOCOL;
    memcpy(dst, src, n + 1);
    return KVD_OK;
}

/* Copies a protobuf bytes field into a fixed buffer; longer is a protocol
 * error. */
static int copy_bytes(uint8_t *dst, size_t dst_len, size_t *len, ProtobufCBinaryData b)
{
    if (b.len > dst_len)
        return KVD_ERR_PROTOCOL;
    if (b.len > 0)
        memcpy(dst, b.data, b.len);
    *len = b.len;
    return KVD_OK;
}

static int copy_key(uint8_t *dst, ProtobufCBinaryData b)
{
    if (b.len != KVD_KEY_BYTES)
        return KVD_ERR_PROTOCOL;
    memcpy(dst, b.data, KVD_KEY_BYTES);
    return KVD_OK;
}

/* One field of a field list (kvd_proto.h) from the kvdock struct s into
 * its protobuf-c message o; strings and keys point into s. */
#define FIELD_TO_PB(type, name, size, metric, help) FIELD_TO_PB_##type(name)
#define FIELD_TO_PB_U32(name)                       o->name = s->name;
#define FIELD_TO_PB_I32(name)                       o->name = s->name;
#define FIELD_TO_PB_U64(name)                       o->name = s->name;
#define FIELD_TO_PB_F64(name)                       o->name = s->name;
#define FIELD_TO_PB_BOOL(name)                      o->name = s->name;
#define FIELD_TO_PB_STR(name)                       o->name = (char *)s->name;
#define FIELD_TO_PB_KEY(name) \
    o->name = (ProtobufCBinaryData){KVD_KEY_BYTES, (uint8_t *)s->name};

static void ns_spec_to_pb(const void *in, void *pb)
{
    const kvd_ns_spec_t *s = in;
    Kvdock__NamespaceSpec *o = pb;
    kvdock__namespace_spec__init(o);
    KVD_NS_SPEC_FIELDS(FIELD_TO_PB)
}

static void ns_info_to_pb(const void *in, void *pb)
{
    const kvd_ns_msg_t *s = in;
    Kvdock__NamespaceInfo *o = pb;
    kvdock__namespace_info__init(o);
    KVD_NS_FIELDS(FIELD_TO_PB)
}

static void nic_to_pb(const void *in, void *pb)
{
    const kvd_nic_msg_t *s = in;
    Kvdock__Nic *o = pb;
    kvdock__nic__init(o);
    KVD_NIC_FIELDS(FIELD_TO_PB)
}

static void tenant_to_pb(const void *in, void *pb)
{
    const kvd_tenant_msg_t *s = in;
    Kvdock__TenantInfo *o = pb;
    kvdock__tenant_info__init(o);
    KVD_TENANT_FIELDS(FIELD_TO_PB)
}

static void member_to_pb(const void *in, void *pb)
{
    const kvd_member_msg_t *s = in;
    Kvdock__ClusterMember *o = pb;
    kvdock__cluster_member__init(o);
    KVD_MEMBER_FIELDS(FIELD_TO_PB)
}

static void obj_to_pb(const void *in, void *pb)
{
    const kvd_obj_msg_t *s = in;
    Kvdock__ObjectInfo *o = pb;
    kvdock__object_info__init(o);
    KVD_OBJ_FIELDS(FIELD_TO_PB)
    o->parent = (ProtobufCBinaryData){s->parent_len, (uint8_t *)s->parent};
}

static void store_stats_to_pb(const kvd_store_stats_msg_t *s, Kvdock__StoreStats *o)
{
    kvdock__store_stats__init(o);
    KVD_STORE_STATS_FIELDS(FIELD_TO_PB)
}

static void mem_stats_to_pb(const kvd_mem_stats_t *s, Kvdock__MemoryStats *o)
{
    kvdock__memory_stats__init(o);
    KVD_MEM_STATS_FIELDS(FIELD_TO_PB)
}

/* One field of a field list (kvd_proto.h) from the protobuf-c message o
 * into the kvdock struct s: a string longer than its field or a key that is
 * not KVD_KEY_BYTES long is a protocol error. */
#define FIELD_FROM_PB(type, name, size, metric, help) FIELD_FROM_PB_##type(name)
#define FIELD_FROM_PB_U32(name)                       s->name = o->name;
#define FIELD_FROM_PB_I32(name)                       s->name = o->name;
#define FIELD_FROM_PB_U64(name)                       s->name = o->name;
#define FIELD_FROM_PB_F64(name)                       s->name = o->name;
#define FIELD_FROM_PB_BOOL(name)                      s->name = o->name != 0;
#define FIELD_FROM_PB_STR(name)                                \
    if (copy_str(s->name, sizeof(s->name), o->name) != KVD_OK) \
        return KVD_ERR_PROTOCOL;
#define FIELD_FROM_PB_KEY(name)               \
    if (copy_key(s->name, o->name) != KVD_OK) \
        return KVD_ERR_PROTOCOL;

static int ns_spec_from_pb(const void *pb, void *out)
{
    const Kvdock__NamespaceSpec *o = pb;
    kvd_ns_spec_t *s = out;
    KVD_NS_SPEC_FIELDS(FIELD_FROM_PB)
    return KVD_OK;
}

static int ns_info_from_pb(const void *pb, void *out)
{
    const Kvdock__NamespaceInfo *o = pb;
    kvd_ns_msg_t *s = out;
    KVD_NS_FIELDS(FIELD_FROM_PB)
    return KVD_OK;
}

static int nic_from_pb(const void *pb, void *out)
{
    const Kvdock__Nic *o = pb;
    kvd_nic_msg_t *s = out;
    KVD_NIC_FIELDS(FIELD_FROM_PB)
    return KVD_OK;
}

static int tenant_from_pb(const void *pb, void *out)
{
    const Kvdock__TenantInfo *o = pb;
    kvd_tenant_msg_t *s = out;
    KVD_TENANT_FIELDS(FIELD_FROM_PB)
    return KVD_OK;
}

static int member_from_pb(const void *pb, void *out)
{
    const Kvdock__ClusterMember *o = pb;
    kvd_member_msg_t *s = out;
    KVD_MEMBER_FIELDS(FIELD_FROM_PB)
    return KVD_OK;
}

/* An object; its parent is a full key, a tag or nothing. */
static int obj_from_pb(const void *pb, void *out)
{
    const Kvdock__ObjectInfo *o = pb;
    kvd_obj_msg_t *s = out;
    KVD_OBJ_FIELDS(FIELD_FROM_PB)
    if (o->parent.len != 0 && o->parent.len != KVD_KEY_TAG_BYTES &&
        o->parent.len != KVD_KEY_BYTES)
        return KVD_ERR_PROTOCOL;
    if (o->parent.len > 0)
        memcpy(s->parent, o->parent.data, o->parent.len);
    s->parent_len = (uint8_t)o->parent.len;
    return KVD_OK;
}

static int store_stats_from_pb(const Kvdock__StoreStats *o, kvd_store_stats_msg_t *s)
{
    KVD_STORE_STATS_FIELDS(FIELD_FROM_PB)
    return KVD_OK;
}

static void mem_stats_from_pb(const Kvdock__MemoryStats *o, kvd_mem_stats_t *s)
{
    KVD_MEM_STATS_FIELDS(FIELD_FROM_PB)
}

/* How a flat message converts, for the repeated fields that hold it. */
typedef struct flat_msg {
    size_t c_size;  /* the kvdock struct */
    size_t pb_size; /* the protobuf-c message */
    void (*to_pb)(const void *c, void *pb);
    int (*from_pb)(const void *pb, void *c);
} flat_msg_t;

static const flat_msg_t ns_spec_msg = {
    sizeof(kvd_ns_spec_t), sizeof(Kvdock__NamespaceSpec), ns_spec_to_pb, ns_spec_from_pb};
static const flat_msg_t ns_info_msg = {
    sizeof(kvd_ns_msg_t), sizeof(Kvdock__NamespaceInfo), ns_info_to_pb, ns_info_from_pb};
static const flat_msg_t nic_msg = {sizeof(kvd_nic_msg_t), sizeof(Kvdock__Nic), nic_to_pb,
                                   nic_from_pb};
static const flat_msg_t tenant_msg = {
    sizeof(kvd_tenant_msg_t), sizeof(Kvdock__TenantInfo), tenant_to_pb, tenant_from_pb};
static const flat_msg_t member_msg = {sizeof(kvd_member_msg_t),
                                      sizeof(Kvdock__ClusterMember), member_to_pb,
                                      member_from_pb};
static const flat_msg_t obj_msg = {sizeof(kvd_obj_msg_t), sizeof(Kvdock__ObjectInfo),
                                   obj_to_pb, obj_from_pb};

/* A repeated field of n messages t made from the n structs at in: the
 * messages and the array of pointers to them in scr's arena (strings and
 * keys point into in). NULL when out of memory. */
static void **array_to_pb(kvd_msg_t *scr, const flat_msg_t *t, const void *in, size_t n)
{
    void **ptrs = arena_array(scr, n, sizeof(*ptrs));
    char *items = arena_array(scr, n, t->pb_size);
    if (ptrs == NULL || items == NULL)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        ptrs[i] = items + i * t->pb_size;
        t->to_pb((const char *)in + i * t->c_size, ptrs[i]);
    }
    return ptrs;
}

/* The n structs, in m's arena, of a repeated field of messages t. Sets *rc
 * to KVD_OK, KVD_ERR_NOMEM or a message's KVD_ERR_PROTOCOL (then returns
 * NULL). */
static void *array_from_pb(kvd_msg_t *m, const flat_msg_t *t, size_t n, void *const *pb,
                           int *rc)
{
    char *v = arena_array(m, n, t->c_size);
    *rc = v != NULL ? KVD_OK : KVD_ERR_NOMEM;
    for (size_t i = 0; i < n && *rc == KVD_OK; i++)
        *rc = t->from_pb(pb[i], v + i * t->c_size);
    return *rc == KVD_OK ? v : NULL;
}

/* ------------------------------------------------------ packing helpers */

/* A batch of keys as one packed bytes field: the C array already is. */
static ProtobufCBinaryData keys_to_pb(const kvd_key_t *keys, size_t n)
{
    return (ProtobufCBinaryData){.len = n * KVD_KEY_BYTES, .data = (uint8_t *)keys};
}

/* Directory key batches (kvd_dir_keys_t) as DirKeys messages in scr's
 * arena; keys and strings point into in. NULL when out of memory. */
static Kvdock__DirKeys **dir_keys_to_pb(kvd_msg_t *scr, const kvd_dir_keys_t *in,
                                        size_t n)
{
    Kvdock__DirKeys **ptrs = arena_array(scr, n, sizeof(*ptrs));
    Kvdock__DirKeys *items = arena_array(scr, n, sizeof(*items));
    if (ptrs == NULL || items == NULL)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        Kvdock__DirKeys *o = &items[i];
        kvdock__dir_keys__init(o);
        o->tenant = (char *)in[i].tenant;
        o->ns_name = (char *)in[i].ns_name;
        o->added = keys_to_pb(in[i].added, in[i].n_added);
        o->removed = keys_to_pb(in[i].removed, in[i].n_removed);
        ptrs[i] = o;
    }
    return ptrs;
}

static Kvdock__PrefixEntry **prefixes_to_pb(kvd_msg_t *scr, const kvd_prefix_msg_t *in,
                                            size_t n)
{
    Kvdock__PrefixEntry **ptrs = arena_array(scr, n, sizeof(*ptrs));
    Kvdock__PrefixEntry *items = arena_array(scr, n, sizeof(*items));
    if (ptrs == NULL || items == NULL)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        Kvdock__PrefixEntry *o = &items[i];
        kvdock__prefix_entry__init(o);
        o->ns = in[i].ns;
        o->root = (ProtobufCBinaryData){KVD_KEY_BYTES, (uint8_t *)in[i].root};
        o->leaf = (ProtobufCBinaryData){KVD_KEY_BYTES, (uint8_t *)in[i].leaf};
        o->pages = in[i].pages;
        o->bytes = in[i].bytes;
        o->last_access_ms = in[i].last_access_ms;
        o->hits = in[i].hits;
        size_t np = in[i].n_pools;
        o->pools = arena_array(scr, np, sizeof(*o->pools));
        Kvdock__PoolBoundaries *pb = arena_array(scr, np, sizeof(*pb));
        if (np && (o->pools == NULL || pb == NULL))
            return NULL;
        for (size_t k = 0; k < np; k++) {
            kvdock__pool_boundaries__init(&pb[k]);
            pb[k].ns = in[i].pools[k].ns;
            pb[k].n_boundaries = in[i].pools[k].n;
            pb[k].boundaries = in[i].pools[k].boundaries;
            o->pools[k] = &pb[k];
        }
        o->n_pools = np;
        ptrs[i] = o;
    }
    return ptrs;
}

/* Stats reply: the fixed parts plus the namespaces. */
static Kvdock__StatsReply *stats_to_pb(kvd_msg_t *scr, const kvd_stats_rep_t *s)
{
    Kvdock__StatsReply *r = arena_array(scr, 1, sizeof(*r));
    Kvdock__MemoryStats *mem = arena_array(scr, 1, sizeof(*mem));
    Kvdock__StoreStats *store = arena_array(scr, 1, sizeof(*store));
    Kvdock__MethodStats *ms = arena_array(scr, KVD_METHOD_COUNT, sizeof(*ms));
    Kvdock__MethodStats **msp = arena_array(scr, KVD_METHOD_COUNT, sizeof(*msp));
    if (!r || !mem || !store || !ms || !msp)
        return NULL;
    kvdock__stats_reply__init(r);
    kvdock__memory_stats__init(mem);
    r->daemon_version = (char *)s->daemon_version;
    r->instance = (char *)s->instance;
    r->state = (Kvdock__HealthState)s->state;
    r->uptime_ms = s->uptime_ms;
    r->connections_current = s->connections_current;
    r->connections_total = s->connections_total;
    r->connections_rejected = s->connections_rejected;
    r->protocol_errors = s->protocol_errors;
    r->auth_failures = s->auth_failures;
    r->connections_timed_out = s->connections_timed_out;
    r->connections_over_buffer = s->connections_over_buffer;
    r->acquires_held = s->acquires_held;
    r->acquires_held_total = s->acquires_held_total;
    mem_stats_to_pb(&s->memory, mem);
    r->memory = mem;
    size_t n = 0;
    for (size_t i = 1; i < KVD_METHOD_COUNT; i++, n++) {
        kvdock__method_stats__init(&ms[n]);
        ms[n].method = (Kvdock__Method)i;
        ms[n].calls = s->methods[i].calls;
        ms[n].errors = s->methods[i].errors;
        ms[n].latency_us_sum = s->methods[i].latency_us_sum;
        ms[n].n_latency_buckets = KVD_LATENCY_BUCKETS;
        ms[n].latency_buckets = (uint64_t *)s->methods[i].latency_buckets;
        msp[n] = &ms[n];
    }
    r->n_methods = n;
    r->methods = msp;
    store_stats_to_pb(&s->store, store);
    r->store = store;
    r->n_namespaces = s->n_namespaces;
    r->namespaces = (Kvdock__NamespaceInfo **)array_to_pb(scr, &ns_info_msg,
                                                          s->namespaces, s->n_namespaces);
    r->checked = s->checked;
    r->check_us = s->check_us;
    r->check_error = (char *)s->check_error;
    r->n_nics = s->n_nics;
    r->nics = (Kvdock__Nic **)array_to_pb(scr, &nic_msg, s->nics, s->n_nics);
    r->n_tenants = s->n_tenants;
    r->tenants =
        (Kvdock__TenantInfo **)array_to_pb(scr, &tenant_msg, s->tenants, s->n_tenants);
    if ((s->n_namespaces && r->namespaces == NULL) || (s->n_nics && r->nics == NULL) ||
        (s->n_tenants && r->tenants == NULL))
        return NULL;
    return r;
}

/* Sets env's body from the request m; false when out of memory or the
 * method has no request body. */
static bool request_to_pb(const kvd_msg_t *m, Kvdock__Envelope *env, kvd_msg_t *scr)
{
    switch (m->method) {
    case KVD_METHOD_HELLO: {
        Kvdock__HelloRequest *h = arena_array(scr, 1, sizeof(*h));
        if (!h)
            return false;
        kvdock__hello_request__init(h);
        const kvd_hello_req_t *in = &m->body.hello_req;
        h->client_name = (char *)in->client_name;
        h->pid = in->pid;
        h->protocol_version = in->protocol_version;
        h->want_pool_fd = in->want_pool_fd;
        h->want_ucx = in->want_ucx;
        h->auth_token =
            (ProtobufCBinaryData){in->auth_token_len, (uint8_t *)in->auth_token};
        h->read_only = in->read_only;
        h->writer_token = in->writer_token;
        h->earlier_copies_over = in->earlier_copies_over;
        h->n_namespaces = in->n_namespaces;
        h->namespaces = (Kvdock__NamespaceSpec **)array_to_pb(
            scr, &ns_spec_msg, in->namespaces, in->n_namespaces);
        env->body_case = KVDOCK__ENVELOPE__BODY_HELLO_REQUEST;
        env->hello_request = h;
        return !in->n_namespaces || h->namespaces;
    }
    case KVD_METHOD_FETCH: {
        const kvd_fetch_req_t *in = &m->body.fetch_req;
        Kvdock__FetchRequest *r = arena_array(scr, 1, sizeof(*r));
        if (!r)
            return false;
        kvdock__fetch_request__init(r);
        r->tenant = (char *)in->tenant;
        r->ns_name = (char *)in->ns_name;
        r->keys = keys_to_pb(in->keys, in->n);
        r->pin = in->pin;
        env->body_case = KVDOCK__ENVELOPE__BODY_FETCH_REQUEST;
        env->fetch_request = r;
        return true;
    }
    case KVD_METHOD_CLUSTER: {
        Kvdock__ClusterRequest *r = arena_array(scr, 1, sizeof(*r));
        if (!r)
            return false;
        kvdock__cluster_request__init(r);
        env->body_case = KVDOCK__ENVELOPE__BODY_CLUSTER_REQUEST;
        env->cluster_request = r;
        return true;
    }
    case KVD_METHOD_DIR_ANNOUNCE: {
        const kvd_dir_announce_req_t *in = &m->body.dir_announce_req;
        Kvdock__DirAnnounceRequest *r = arena_array(scr, 1, sizeof(*r));
        if (!r)
            return false;
        kvdock__dir_announce_request__init(r);
        r->holder = (char *)in->holder;
        r->holder_started_ms = in->holder_started_ms;
        r->reset = in->reset;
        r->n_batches = in->n;
        r->batches = dir_keys_to_pb(scr, in->batches, in->n);
        env->body_case = KVDOCK__ENVELOPE__BODY_DIR_ANNOUNCE_REQUEST;
        env->dir_announce_request = r;
        return in->n == 0 || r->batches != NULL;
    }
    case KVD_METHOD_DIR_LOOKUP: {
        const kvd_dir_lookup_req_t *in = &m->body.dir_lookup_req;
        Kvdock__DirLookupRequest *r = arena_array(scr, 1, sizeof(*r));
        if (!r)
            return false;
        kvdock__dir_lookup_request__init(r);
        r->n_queries = in->n;
        r->queries = dir_keys_to_pb(scr, in->queries, in->n);
        r->local = in->local;
        env->body_case = KVDOCK__ENVELOPE__BODY_DIR_LOOKUP_REQUEST;
        env->dir_lookup_request = r;
        return in->n == 0 || r->queries != NULL;
    }
    case KVD_METHOD_HEALTH: {
        Kvdock__HealthRequest *h = arena_array(scr, 1, sizeof(*h));
        if (!h)
            return false;
        kvdock__health_request__init(h);
        env->body_case = KVDOCK__ENVELOPE__BODY_HEALTH_REQUEST;
        env->health_request = h;
        return true;
    }
    case KVD_METHOD_STATS: {
        Kvdock__StatsRequest *r = arena_array(scr, 1, sizeof(*r));
        if (!r)
            return false;
        kvdock__stats_request__init(r);
        r->check = m->body.stats_req.check;
        env->body_case = KVDOCK__ENVELOPE__BODY_STATS_REQUEST;
        env->stats_request = r;
        return true;
    }
    case KVD_METHOD_REGISTER_NAMESPACE: {
        Kvdock__RegisterNamespaceRequest *r = arena_array(scr, 1, sizeof(*r));
        if (!r)
            return false;
        kvdock__register_namespace_request__init(r);
        r->n_namespaces = m->body.register_req.n;
        r->namespaces = (Kvdock__NamespaceSpec **)array_to_pb(
            scr, &ns_spec_msg, m->body.register_req.namespaces, r->n_namespaces);
        env->body_case = KVDOCK__ENVELOPE__BODY_REGISTER_REQUEST;
        env->register_request = r;
        return !r->n_namespaces || r->namespaces;
    }
    case KVD_METHOD_LOOKUP: {
        const kvd_lookup_req_t *in = &m->body.lookup_req;
        Kvdock__LookupRequest *r = arena_array(scr, 1, sizeof(*r));
        Kvdock__LookupPool *pools = arena_array(scr, in->n_pools, sizeof(*pools));
        Kvdock__LookupPool **ptrs = arena_array(scr, in->n_pools, sizeof(*ptrs));
        if (!r || !pools || !ptrs)
            return false;
        kvdock__lookup_request__init(r);
        for (size_t i = 0; i < in->n_pools; i++) {
            kvdock__lookup_pool__init(&pools[i]);
            pools[i].ns = in->pools[i].ns;
            pools[i].trailing_pages = in->pools[i].trailing_pages;
            pools[i].keys = keys_to_pb(in->pools[i].keys, in->pools[i].n_keys);
            ptrs[i] = &pools[i];
        }
        r->n_pools = in->n_pools;
        r->pools = ptrs;
        env->body_case = KVDOCK__ENVELOPE__BODY_LOOKUP_REQUEST;
        env->lookup_request = r;
        return true;
    }
    case KVD_METHOD_RESERVE: {
        const kvd_reserve_req_t *in = &m->body.reserve_req;
        Kvdock__ReserveRequest *r = arena_array(scr, 1, sizeof(*r));
        uint8_t *keys = arena_array(scr, in->n, KVD_KEY_BYTES);
        uint8_t *parents = arena_array(scr, in->n, KVD_KEY_BYTES);
        uint8_t *has_parent = arena_array(scr, in->n, 1);
        uint32_t *depths = arena_array(scr, in->n, sizeof(uint32_t));
        if (!r || !keys || !parents || !has_parent || !depths)
            return false;
        kvdock__reserve_request__init(r);
        r->ns = in->ns;
        r->object_bytes = in->object_bytes;
        bool any_parent = false;
        for (size_t i = 0; i < in->n; i++) {
            memcpy(keys + i * KVD_KEY_BYTES, in->items[i].key, KVD_KEY_BYTES);
            if (in->items[i].has_parent)
                memcpy(parents + i * KVD_KEY_BYTES, in->items[i].parent, KVD_KEY_BYTES);
            has_parent[i] = in->items[i].has_parent;
            any_parent |= in->items[i].has_parent;
            depths[i] = in->items[i].depth;
        }
        r->keys = (ProtobufCBinaryData){in->n * KVD_KEY_BYTES, keys};
        if (any_parent) {
            r->parents = (ProtobufCBinaryData){in->n * KVD_KEY_BYTES, parents};
            r->has_parent = (ProtobufCBinaryData){in->n, has_parent};
        }
        r->n_depths = in->n;
        r->depths = depths;
        env->body_case = KVDOCK__ENVELOPE__BODY_RESERVE_REQUEST;
        env->reserve_request = r;
        return true;
    }
    case KVD_METHOD_PUBLISH:
    case KVD_METHOD_REVOKE: {
        const kvd_finish_req_t *in = &m->body.finish_req;
        Kvdock__FinishRequest *r = arena_array(scr, 1, sizeof(*r));
        if (!r)
            return false;
        kvdock__finish_request__init(r);
        r->lease_id = in->lease_id;
        r->keys = keys_to_pb(in->keys, in->n);
        env->body_case = KVDOCK__ENVELOPE__BODY_FINISH_REQUEST;
        env->finish_request = r;
        return true;
    }
    case KVD_METHOD_ACQUIRE: {
        const kvd_acquire_req_t *in = &m->body.acquire_req;
        Kvdock__AcquireRequest *r = arena_array(scr, 1, sizeof(*r));
        if (!r)
            return false;
        kvdock__acquire_request__init(r);
        r->ns = in->ns;
        r->object_bytes = in->object_bytes;
        r->keys = keys_to_pb(in->keys, in->n);
        r->wait_ms = in->wait_ms;
        env->body_case = KVDOCK__ENVELOPE__BODY_ACQUIRE_REQUEST;
        env->acquire_request = r;
        return true;
    }
    case KVD_METHOD_RELEASE: {
        Kvdock__ReleaseRequest *r = arena_array(scr, 1, sizeof(*r));
        if (!r)
            return false;
        kvdock__release_request__init(r);
        r->lease_id = m->body.release_req.lease_id;
        env->body_case = KVDOCK__ENVELOPE__BODY_RELEASE_REQUEST;
        env->release_request = r;
        return true;
    }
    case KVD_METHOD_LIST_PREFIXES: {
        Kvdock__ListPrefixesRequest *r = arena_array(scr, 1, sizeof(*r));
        if (!r)
            return false;
        kvdock__list_prefixes_request__init(r);
        r->ns_name = (char *)m->body.list_req.ns_name;
        r->nodes = m->body.list_req.nodes;
        r->limit = m->body.list_req.limit;
        r->cursor = (ProtobufCBinaryData){m->body.list_req.cursor_len,
                                          (uint8_t *)m->body.list_req.cursor};
        env->body_case = KVDOCK__ENVELOPE__BODY_LIST_REQUEST;
        env->list_request = r;
        return true;
    }
    case KVD_METHOD_INSPECT: {
        Kvdock__InspectRequest *r = arena_array(scr, 1, sizeof(*r));
        if (!r)
            return false;
        kvdock__inspect_request__init(r);
        r->ns_name = (char *)m->body.inspect_req.ns_name;
        r->key = (ProtobufCBinaryData){KVD_KEY_BYTES, (uint8_t *)m->body.inspect_req.key};
        env->body_case = KVDOCK__ENVELOPE__BODY_INSPECT_REQUEST;
        env->inspect_request = r;
        return true;
    }
    case KVD_METHOD_EVICT: {
        const kvd_evict_req_t *in = &m->body.evict_req;
        Kvdock__EvictRequest *r = arena_array(scr, 1, sizeof(*r));
        if (!r)
            return false;
        kvdock__evict_request__init(r);
        r->ns_name = (char *)in->ns_name;
        if (in->has_key)
            r->key = (ProtobufCBinaryData){KVD_KEY_BYTES, (uint8_t *)in->key};
        r->all = in->all;
        r->cursor = (ProtobufCBinaryData){in->cursor_len, (uint8_t *)in->cursor};
        env->body_case = KVDOCK__ENVELOPE__BODY_EVICT_REQUEST;
        env->evict_request = r;
        return true;
    }
    default: return false;
    }
}

/* Sets env's body from the successful reply m. */
static bool reply_to_pb(const kvd_msg_t *m, Kvdock__Envelope *env, kvd_msg_t *scr)
{
    switch (m->method) {
    case KVD_METHOD_HELLO: {
        const kvd_hello_rep_t *in = &m->body.hello_rep;
        Kvdock__HelloReply *h = arena_array(scr, 1, sizeof(*h));
        if (!h)
            return false;
        kvdock__hello_reply__init(h);
        h->daemon_version = (char *)in->daemon_version;
        h->instance = (char *)in->instance;
        h->protocol_version = in->protocol_version;
        h->max_frame_bytes = in->max_frame_bytes;
        h->max_batch = in->max_batch;
        h->pool_bytes = in->pool_bytes;
        h->connection_id = in->connection_id;
        h->n_ns_ids = in->n_ns_ids;
        h->ns_ids = in->ns_ids;
        h->pool_fd_attached = in->pool_fd_attached;
        h->lease_ttl_ms = in->lease_ttl_ms;
        h->ucx_address =
            (ProtobufCBinaryData){in->ucx_address_len, (uint8_t *)in->ucx_address};
        h->ucx_rkey = (ProtobufCBinaryData){in->ucx_rkey_len, (uint8_t *)in->ucx_rkey};
        h->ucx_pool_base = in->ucx_pool_base;
        h->ucx_token = (ProtobufCBinaryData){in->ucx_token_len, (uint8_t *)in->ucx_token};
        h->tenant = (char *)in->tenant;
        h->read_only = in->read_only;
        env->body_case = KVDOCK__ENVELOPE__BODY_HELLO_REPLY;
        env->hello_reply = h;
        return true;
    }
    case KVD_METHOD_HEALTH: {
        const kvd_health_rep_t *in = &m->body.health_rep;
        Kvdock__HealthReply *h = arena_array(scr, 1, sizeof(*h));
        if (!h)
            return false;
        kvdock__health_reply__init(h);
        h->state = (Kvdock__HealthState)in->state;
        h->pool_bytes = in->pool_bytes;
        h->populated_bytes = in->populated_bytes;
        h->uptime_ms = in->uptime_ms;
        h->cluster = (Kvdock__ClusterState)in->cluster;
        env->body_case = KVDOCK__ENVELOPE__BODY_HEALTH_REPLY;
        env->health_reply = h;
        return true;
    }
    case KVD_METHOD_STATS:
        env->body_case = KVDOCK__ENVELOPE__BODY_STATS_REPLY;
        env->stats_reply = stats_to_pb(scr, &m->body.stats_rep);
        return env->stats_reply != NULL;
    case KVD_METHOD_REGISTER_NAMESPACE: {
        Kvdock__RegisterNamespaceReply *r = arena_array(scr, 1, sizeof(*r));
        if (!r)
            return false;
        kvdock__register_namespace_reply__init(r);
        r->n_ns_ids = m->body.register_rep.n;
        r->ns_ids = m->body.register_rep.ids;
        env->body_case = KVDOCK__ENVELOPE__BODY_REGISTER_REPLY;
        env->register_reply = r;
        return true;
    }
    case KVD_METHOD_LOOKUP: {
        Kvdock__LookupReply *r = arena_array(scr, 1, sizeof(*r));
        if (!r)
            return false;
        kvdock__lookup_reply__init(r);
        r->n_boundaries = m->body.lookup_rep.n;
        r->boundaries = m->body.lookup_rep.boundaries;
        r->n_tiers = m->body.lookup_rep.tiers ? m->body.lookup_rep.n : 0;
        r->tiers = m->body.lookup_rep.tiers;
        env->body_case = KVDOCK__ENVELOPE__BODY_LOOKUP_REPLY;
        env->lookup_reply = r;
        return true;
    }
    case KVD_METHOD_RESERVE: {
        const kvd_reserve_rep_t *in = &m->body.reserve_rep;
        Kvdock__ReserveReply *r = arena_array(scr, 1, sizeof(*r));
        uint32_t *results = arena_array(scr, in->n, sizeof(uint32_t));
        if (!r || !results)
            return false;
        kvdock__reserve_reply__init(r);
        r->lease_id = in->lease_id;
        r->object_bytes = in->object_bytes;
        for (size_t i = 0; i < in->n; i++)
            results[i] = in->results[i];
        r->n_results = in->n;
        r->results = results;
        r->n_offsets = in->n;
        r->offsets = in->offsets;
        env->body_case = KVDOCK__ENVELOPE__BODY_RESERVE_REPLY;
        env->reserve_reply = r;
        return true;
    }
    case KVD_METHOD_PUBLISH:
    case KVD_METHOD_REVOKE: {
        Kvdock__FinishReply *r = arena_array(scr, 1, sizeof(*r));
        if (!r)
            return false;
        kvdock__finish_reply__init(r);
        env->body_case = KVDOCK__ENVELOPE__BODY_FINISH_REPLY;
        env->finish_reply = r;
        return true;
    }
    case KVD_METHOD_ACQUIRE: {
        const kvd_acquire_rep_t *in = &m->body.acquire_rep;
        Kvdock__AcquireReply *r = arena_array(scr, 1, sizeof(*r));
        if (!r)
            return false;
        kvdock__acquire_reply__init(r);
        r->lease_id = in->lease_id;
        r->object_bytes = in->object_bytes;
        r->n_offsets = in->n;
        r->offsets = in->offsets;
        env->body_case = KVDOCK__ENVELOPE__BODY_ACQUIRE_REPLY;
        env->acquire_reply = r;
        return true;
    }
    case KVD_METHOD_RELEASE: {
        Kvdock__ReleaseReply *r = arena_array(scr, 1, sizeof(*r));
        if (!r)
            return false;
        kvdock__release_reply__init(r);
        env->body_case = KVDOCK__ENVELOPE__BODY_RELEASE_REPLY;
        env->release_reply = r;
        return true;
    }
    case KVD_METHOD_LIST_PREFIXES: {
        const kvd_list_rep_t *in = &m->body.list_rep;
        Kvdock__ListPrefixesReply *r = arena_array(scr, 1, sizeof(*r));
        if (!r)
            return false;
        kvdock__list_prefixes_reply__init(r);
        r->n_prefixes = in->n_prefixes;
        r->prefixes = prefixes_to_pb(scr, in->prefixes, in->n_prefixes);
        r->n_nodes = in->n_nodes;
        r->nodes =
            (Kvdock__ObjectInfo **)array_to_pb(scr, &obj_msg, in->nodes, in->n_nodes);
        r->n_namespaces = in->n_namespaces;
        r->namespaces = (Kvdock__NamespaceInfo **)array_to_pb(
            scr, &ns_info_msg, in->namespaces, in->n_namespaces);
        r->truncated = in->truncated;
        r->next_cursor =
            (ProtobufCBinaryData){in->next_cursor_len, (uint8_t *)in->next_cursor};
        env->body_case = KVDOCK__ENVELOPE__BODY_LIST_REPLY;
        env->list_reply = r;
        return r->prefixes && r->nodes && r->namespaces;
    }
    case KVD_METHOD_INSPECT: {
        const kvd_inspect_rep_t *in = &m->body.inspect_rep;
        Kvdock__InspectReply *r = arena_array(scr, 1, sizeof(*r));
        if (!r)
            return false;
        kvdock__inspect_reply__init(r);
        r->n_objects = in->n_objects;
        r->objects =
            (Kvdock__ObjectInfo **)array_to_pb(scr, &obj_msg, in->objects, in->n_objects);
        r->n_namespaces = in->n_namespaces;
        r->namespaces = (Kvdock__NamespaceInfo **)array_to_pb(
            scr, &ns_info_msg, in->namespaces, in->n_namespaces);
        env->body_case = KVDOCK__ENVELOPE__BODY_INSPECT_REPLY;
        env->inspect_reply = r;
        return r->objects && r->namespaces;
    }
    case KVD_METHOD_EVICT: {
        Kvdock__EvictReply *r = arena_array(scr, 1, sizeof(*r));
        if (!r)
            return false;
        kvdock__evict_reply__init(r);
        r->evicted = m->body.evict_rep.evicted;
        r->skipped = m->body.evict_rep.skipped;
        r->next_cursor = (ProtobufCBinaryData){m->body.evict_rep.next_cursor_len,
                                               (uint8_t *)m->body.evict_rep.next_cursor};
        env->body_case = KVDOCK__ENVELOPE__BODY_EVICT_REPLY;
        env->evict_reply = r;
        return true;
    }
    case KVD_METHOD_CLUSTER: {
        const kvd_cluster_rep_t *in = &m->body.cluster_rep;
        Kvdock__ClusterReply *r = arena_array(scr, 1, sizeof(*r));
        if (!r)
            return false;
        kvdock__cluster_reply__init(r);
        r->state = (Kvdock__ClusterState)in->state;
        r->node_id = (char *)in->node_id;
        r->epoch = in->epoch;
        r->etcd = (char *)in->etcd;
        r->n_members = in->n_members;
        r->members = (Kvdock__ClusterMember **)array_to_pb(scr, &member_msg, in->members,
                                                           in->n_members);
        Kvdock__ClusterCounters *cc = arena_array(scr, 1, sizeof(*cc));
        if (!cc)
            return false;
        kvdock__cluster_counters__init(cc);
        {
            const kvd_cluster_counters_t *s = &in->counters;
            Kvdock__ClusterCounters *o = cc;
            KVD_CLUSTER_COUNTER_FIELDS(FIELD_TO_PB)
        }
        r->counters = cc;
        env->body_case = KVDOCK__ENVELOPE__BODY_CLUSTER_REPLY;
        env->cluster_reply = r;
        return in->n_members == 0 || r->members != NULL;
    }
    case KVD_METHOD_FETCH: {
        const kvd_fetch_rep_t *in = &m->body.fetch_rep;
        Kvdock__FetchReply *r = arena_array(scr, 1, sizeof(*r));
        if (!r)
            return false;
        kvdock__fetch_reply__init(r);
        r->object_bytes = in->object_bytes;
        r->present = (ProtobufCBinaryData){in->n, in->present};
        r->data = (ProtobufCBinaryData){in->data_len, (uint8_t *)in->data};
        r->n_depths = in->n_depths;
        r->depths = in->depths;
        r->lease_id = in->lease_id;
        r->n_offsets = in->n_offsets;
        r->offsets = in->offsets;
        env->body_case = KVDOCK__ENVELOPE__BODY_FETCH_REPLY;
        env->fetch_reply = r;
        return true;
    }
    case KVD_METHOD_DIR_ANNOUNCE: {
        Kvdock__DirAnnounceReply *r = arena_array(scr, 1, sizeof(*r));
        if (!r)
            return false;
        kvdock__dir_announce_reply__init(r);
        r->entries = m->body.dir_announce_rep.entries;
        env->body_case = KVDOCK__ENVELOPE__BODY_DIR_ANNOUNCE_REPLY;
        env->dir_announce_reply = r;
        return true;
    }
    case KVD_METHOD_DIR_LOOKUP: {
        const kvd_dir_lookup_rep_t *in = &m->body.dir_lookup_rep;
        Kvdock__DirLookupReply *r = arena_array(scr, 1, sizeof(*r));
        char **nodes = arena_array(scr, in->n_nodes, sizeof(*nodes));
        Kvdock__DirHolders *items = arena_array(scr, in->n, sizeof(*items));
        Kvdock__DirHolders **ptrs = arena_array(scr, in->n, sizeof(*ptrs));
        if (!r || (in->n_nodes && !nodes) || (in->n && (!items || !ptrs)))
            return false;
        kvdock__dir_lookup_reply__init(r);
        for (size_t i = 0; i < in->n_nodes; i++)
            nodes[i] = (char *)in->nodes[i];
        for (size_t i = 0; i < in->n; i++) {
            kvdock__dir_holders__init(&items[i]);
            items[i].n_holders = in->n_holders[i];
            items[i].holders = in->holders[i];
            ptrs[i] = &items[i];
        }
        r->n_nodes = in->n_nodes;
        r->nodes = nodes;
        r->n_answers = in->n;
        r->answers = ptrs;
        env->body_case = KVDOCK__ENVELOPE__BODY_DIR_LOOKUP_REPLY;
        env->dir_lookup_reply = r;
        return true;
    }
    default: return false;
    }
}

/*
 * proto3 requires every string field to be valid UTF-8, and a reply may
 * carry text a client chose or a C buffer cut at its size (an error text
 * of KVD_ERROR_MAX bytes ends inside a character as easily as not). So the
 * one place every message passes on its way out checks every string field
 * of the tree about to be packed, from the descriptors (a field added to
 * kvdock.proto is covered without a line here), and points an invalid one
 * at a copy in scr made by kvd_utf8_copy: cut between characters, '?' for a
 * stray byte. Only the generated structs (ours, in scr or on the stack)
 * change; the caller's message is const. False when out of memory.
 */
static bool strings_to_utf8(ProtobufCMessage *msg, kvd_msg_t *scr)
{
    const ProtobufCMessageDescriptor *d = msg->descriptor;
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        if (f->type != PROTOBUF_C_TYPE_STRING && f->type != PROTOBUF_C_TYPE_MESSAGE)
            continue;
        char *base = (char *)msg;
        if ((f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) &&
            *(const uint32_t *)(base + f->quantifier_offset) != f->id)
            continue; /* another member of the oneof is set */
        size_t n = 1;
        void **slot = (void **)(base + f->offset);
        if (f->label == PROTOBUF_C_LABEL_REPEATED) {
            n = *(const size_t *)(base + f->quantifier_offset);
            slot = *(void ***)slot;
            if (n == 0 || slot == NULL)
                continue;
        }
        for (size_t k = 0; k < n; k++) {
            if (slot[k] == NULL)
                continue;
            if (f->type == PROTOBUF_C_TYPE_MESSAGE) {
                if (!strings_to_utf8(slot[k], scr))
                    return false;
                continue;
            }
            /* no repeated string in kvdock.proto: a repeated one would
             * need its array copied too (it may be the caller's) */
            if (f->label == PROTOBUF_C_LABEL_REPEATED)
                continue;
            const char *str = slot[k];
            size_t len = strlen(str);
            if (kvd_utf8_valid(str, len))
                continue;
            char *copy = kvd_msg_alloc(scr, len + 1);
            if (copy == NULL)
                return false;
            kvd_utf8_copy(copy, str, len + 1);
            slot[k] = copy;
        }
    }
    return true;
}

int kvd_msg_pack(const kvd_msg_t *m, size_t max_frame, kvd_buf_t *out)
{
    if ((unsigned)m->method == KVD_METHOD_NONE && !(m->reply && m->status != KVD_OK))
        return KVD_ERR_INVALID;
    if ((unsigned)m->method >= KVD_METHOD_COUNT)
        return KVD_ERR_INVALID;
    Kvdock__Envelope env = KVDOCK__ENVELOPE__INIT;
    Kvdock__Error err = KVDOCK__ERROR__INIT;
    kvd_msg_t scr = {0};
    env.id = m->id;
    env.method = (Kvdock__Method)m->method;
    env.reply = m->reply;

    int rc = KVD_OK;
    if (m->reply && m->status != KVD_OK) {
        err.code = m->status;
        err.message = (char *)m->error;
        err.index = m->error_index;
        env.error = &err;
    } else if (!(m->reply ? reply_to_pb(m, &env, &scr) : request_to_pb(m, &env, &scr))) {
        rc = KVD_ERR_NOMEM;
        goto done;
    }
    if (!strings_to_utf8(&env.base, &scr)) {
        rc = KVD_ERR_NOMEM;
        goto done;
    }
    size_t len = kvdock__envelope__get_packed_size(&env);
    if (len > max_frame) {
        rc = KVD_ERR_TOO_LARGE;
        goto done;
    }
    /* never zero: an error has a code, everything else a method. Room for
     * header and payload first: a failure leaves out unchanged. */
    rc = kvd_buf_reserve(out, KVD_FRAME_HEADER_BYTES + len);
    if (rc == KVD_OK)
        rc = kvd_frame_put_header(out, len);
    if (rc != KVD_OK)
        goto done;
    kvdock__envelope__pack(&env, out->data + out->len);
    out->len += len;
done:
    kvd_msg_clear(&scr);
    return rc;
}

/* ------------------------------------------------------------ decoding */

/* A packed batch of keys: a multiple of KVD_KEY_BYTES, copied in one go. */
static int keys_from_pb(kvd_msg_t *m, ProtobufCBinaryData pb, kvd_key_t **out, size_t *n)
{
    if (pb.len % KVD_KEY_BYTES != 0)
        return KVD_ERR_PROTOCOL;
    size_t count = pb.len / KVD_KEY_BYTES;
    kvd_key_t *keys = arena_array(m, count, sizeof(kvd_key_t));
    if (keys == NULL)
        return KVD_ERR_NOMEM;
    if (count > 0)
        memcpy(keys, pb.data, pb.len);
    *out = keys;
    *n = count;
    return KVD_OK;
}

/* Opaque bytes (a UCX address or rkey), copied into the message. */
static int bytes_from_pb(kvd_msg_t *m, ProtobufCBinaryData pb, const uint8_t **out,
                         size_t *n)
{
    *out = NULL;
    *n = 0;
    if (pb.len == 0)
        return KVD_OK;
    uint8_t *v = arena_array(m, pb.len, 1);
    if (v == NULL)
        return KVD_ERR_NOMEM;
    memcpy(v, pb.data, pb.len);
    *out = v;
    *n = pb.len;
    return KVD_OK;
}

static int u32s_from_pb(kvd_msg_t *m, size_t n, const uint32_t *pb, uint32_t **out)
{
    uint32_t *v = arena_array(m, n, sizeof(uint32_t));
    if (v == NULL)
        return KVD_ERR_NOMEM;
    if (n > 0)
        memcpy(v, pb, n * sizeof(uint32_t));
    *out = v;
    return KVD_OK;
}

static int u64s_from_pb(kvd_msg_t *m, size_t n, const uint64_t *pb, uint64_t **out)
{
    uint64_t *v = arena_array(m, n, sizeof(uint64_t));
    if (v == NULL)
        return KVD_ERR_NOMEM;
    if (n > 0)
        memcpy(v, pb, n * sizeof(uint64_t));
    *out = v;
    return KVD_OK;
}

static int prefixes_from_pb(kvd_msg_t *m, size_t n, Kvdock__PrefixEntry **pb,
                            kvd_prefix_msg_t **out)
{
    kvd_prefix_msg_t *v = arena_array(m, n, sizeof(*v));
    if (v == NULL)
        return KVD_ERR_NOMEM;
    for (size_t i = 0; i < n; i++) {
        const Kvdock__PrefixEntry *o = pb[i];
        if (copy_key(v[i].root, o->root) != KVD_OK ||
            copy_key(v[i].leaf, o->leaf) != KVD_OK)
            return KVD_ERR_PROTOCOL;
        v[i].ns = o->ns;
        v[i].pages = o->pages;
        v[i].bytes = o->bytes;
        v[i].last_access_ms = o->last_access_ms;
        v[i].hits = o->hits;
        v[i].n_pools = o->n_pools;
        v[i].pools = arena_array(m, o->n_pools, sizeof(kvd_pool_bounds_t));
        if (v[i].pools == NULL)
            return KVD_ERR_NOMEM;
        for (size_t k = 0; k < o->n_pools; k++) {
            v[i].pools[k].ns = o->pools[k]->ns;
            v[i].pools[k].n = o->pools[k]->n_boundaries;
            int rc = u32s_from_pb(m, o->pools[k]->n_boundaries, o->pools[k]->boundaries,
                                  &v[i].pools[k].boundaries);
            if (rc != KVD_OK)
                return rc;
        }
    }
    *out = v;
    return KVD_OK;
}

static int stats_from_pb(kvd_msg_t *m, const Kvdock__StatsReply *r, kvd_stats_rep_t *s)
{
    int rc = copy_str(s->daemon_version, sizeof(s->daemon_version), r->daemon_version);
    if (rc == KVD_OK)
        rc = copy_str(s->instance, sizeof(s->instance), r->instance);
    if (rc != KVD_OK)
        return rc;
    s->state = (kvd_health_t)r->state;
    s->uptime_ms = r->uptime_ms;
    s->connections_current = r->connections_current;
    s->connections_total = r->connections_total;
    s->connections_rejected = r->connections_rejected;
    s->protocol_errors = r->protocol_errors;
    s->auth_failures = r->auth_failures;
    s->connections_timed_out = r->connections_timed_out;
    s->connections_over_buffer = r->connections_over_buffer;
    s->acquires_held = r->acquires_held;
    s->acquires_held_total = r->acquires_held_total;
    if (r->memory != NULL)
        mem_stats_from_pb(r->memory, &s->memory);
    for (size_t i = 0; i < r->n_methods; i++) {
        const Kvdock__MethodStats *ms = r->methods[i];
        /* methods this build does not know are skipped, not an error:
         * a newer daemon may count more of them */
        if ((unsigned)ms->method == 0 || (unsigned)ms->method >= KVD_METHOD_COUNT)
            continue;
        kvd_method_stats_t *d = &s->methods[ms->method];
        d->calls = ms->calls;
        d->errors = ms->errors;
        d->latency_us_sum = ms->latency_us_sum;
        size_t nb = KVD_MIN(ms->n_latency_buckets, (size_t)KVD_LATENCY_BUCKETS);
        if (nb > 0)
            memcpy(d->latency_buckets, ms->latency_buckets, nb * sizeof(uint64_t));
    }
    s->n_namespaces = r->n_namespaces;
    rc = r->store != NULL ? store_stats_from_pb(r->store, &s->store) : KVD_OK;
    if (rc == KVD_OK)
        s->namespaces = array_from_pb(m, &ns_info_msg, r->n_namespaces,
                                      (void *const *)r->namespaces, &rc);
    if (rc == KVD_OK)
        s->nics = array_from_pb(m, &nic_msg, r->n_nics, (void *const *)r->nics, &rc);
    s->n_nics = rc == KVD_OK ? r->n_nics : 0;
    if (rc == KVD_OK)
        s->tenants =
            array_from_pb(m, &tenant_msg, r->n_tenants, (void *const *)r->tenants, &rc);
    s->n_tenants = rc == KVD_OK ? r->n_tenants : 0;
    s->checked = r->checked;
    s->check_us = r->check_us;
    kvd_utf8_copy(s->check_error, r->check_error ? r->check_error : "",
                  sizeof(s->check_error));
    return rc;
}

/* DirKeys messages into kvd_dir_keys_t in m's arena. */
static int dir_keys_from_pb(kvd_msg_t *m, size_t n, Kvdock__DirKeys *const *pb,
                            kvd_dir_keys_t **out)
{
    kvd_dir_keys_t *v = arena_array(m, n, sizeof(*v));
    if (v == NULL && n > 0)
        return KVD_ERR_NOMEM;
    for (size_t i = 0; i < n; i++) {
        int rc = copy_str(v[i].tenant, sizeof(v[i].tenant), pb[i]->tenant);
        if (rc == KVD_OK)
            rc = copy_str(v[i].ns_name, sizeof(v[i].ns_name), pb[i]->ns_name);
        if (rc == KVD_OK)
            rc = keys_from_pb(m, pb[i]->added, &v[i].added, &v[i].n_added);
        if (rc == KVD_OK)
            rc = keys_from_pb(m, pb[i]->removed, &v[i].removed, &v[i].n_removed);
        if (rc != KVD_OK)
            return rc;
    }
    *out = v;
    return KVD_OK;
}

/* The body case that (method, reply) must carry. */
static Kvdock__Envelope__BodyCase expected_body(kvd_method_t method, bool reply)
{
    static const Kvdock__Envelope__BodyCase req[KVD_METHOD_COUNT] = {
        [KVD_METHOD_HELLO] = KVDOCK__ENVELOPE__BODY_HELLO_REQUEST,
        [KVD_METHOD_HEALTH] = KVDOCK__ENVELOPE__BODY_HEALTH_REQUEST,
        [KVD_METHOD_STATS] = KVDOCK__ENVELOPE__BODY_STATS_REQUEST,
        [KVD_METHOD_REGISTER_NAMESPACE] = KVDOCK__ENVELOPE__BODY_REGISTER_REQUEST,
        [KVD_METHOD_LOOKUP] = KVDOCK__ENVELOPE__BODY_LOOKUP_REQUEST,
        [KVD_METHOD_RESERVE] = KVDOCK__ENVELOPE__BODY_RESERVE_REQUEST,
        [KVD_METHOD_PUBLISH] = KVDOCK__ENVELOPE__BODY_FINISH_REQUEST,
        [KVD_METHOD_REVOKE] = KVDOCK__ENVELOPE__BODY_FINISH_REQUEST,
        [KVD_METHOD_ACQUIRE] = KVDOCK__ENVELOPE__BODY_ACQUIRE_REQUEST,
        [KVD_METHOD_RELEASE] = KVDOCK__ENVELOPE__BODY_RELEASE_REQUEST,
        [KVD_METHOD_LIST_PREFIXES] = KVDOCK__ENVELOPE__BODY_LIST_REQUEST,
        [KVD_METHOD_INSPECT] = KVDOCK__ENVELOPE__BODY_INSPECT_REQUEST,
        [KVD_METHOD_EVICT] = KVDOCK__ENVELOPE__BODY_EVICT_REQUEST,
        [KVD_METHOD_CLUSTER] = KVDOCK__ENVELOPE__BODY_CLUSTER_REQUEST,
        [KVD_METHOD_DIR_ANNOUNCE] = KVDOCK__ENVELOPE__BODY_DIR_ANNOUNCE_REQUEST,
        [KVD_METHOD_DIR_LOOKUP] = KVDOCK__ENVELOPE__BODY_DIR_LOOKUP_REQUEST,
        [KVD_METHOD_FETCH] = KVDOCK__ENVELOPE__BODY_FETCH_REQUEST,
    };
    static const Kvdock__Envelope__BodyCase rep[KVD_METHOD_COUNT] = {
        [KVD_METHOD_HELLO] = KVDOCK__ENVELOPE__BODY_HELLO_REPLY,
        [KVD_METHOD_HEALTH] = KVDOCK__ENVELOPE__BODY_HEALTH_REPLY,
        [KVD_METHOD_STATS] = KVDOCK__ENVELOPE__BODY_STATS_REPLY,
        [KVD_METHOD_REGISTER_NAMESPACE] = KVDOCK__ENVELOPE__BODY_REGISTER_REPLY,
        [KVD_METHOD_LOOKUP] = KVDOCK__ENVELOPE__BODY_LOOKUP_REPLY,
        [KVD_METHOD_RESERVE] = KVDOCK__ENVELOPE__BODY_RESERVE_REPLY,
        [KVD_METHOD_PUBLISH] = KVDOCK__ENVELOPE__BODY_FINISH_REPLY,
        [KVD_METHOD_REVOKE] = KVDOCK__ENVELOPE__BODY_FINISH_REPLY,
        [KVD_METHOD_ACQUIRE] = KVDOCK__ENVELOPE__BODY_ACQUIRE_REPLY,
        [KVD_METHOD_RELEASE] = KVDOCK__ENVELOPE__BODY_RELEASE_REPLY,
        [KVD_METHOD_LIST_PREFIXES] = KVDOCK__ENVELOPE__BODY_LIST_REPLY,
        [KVD_METHOD_INSPECT] = KVDOCK__ENVELOPE__BODY_INSPECT_REPLY,
        [KVD_METHOD_EVICT] = KVDOCK__ENVELOPE__BODY_EVICT_REPLY,
        [KVD_METHOD_CLUSTER] = KVDOCK__ENVELOPE__BODY_CLUSTER_REPLY,
        [KVD_METHOD_DIR_ANNOUNCE] = KVDOCK__ENVELOPE__BODY_DIR_ANNOUNCE_REPLY,
        [KVD_METHOD_DIR_LOOKUP] = KVDOCK__ENVELOPE__BODY_DIR_LOOKUP_REPLY,
        [KVD_METHOD_FETCH] = KVDOCK__ENVELOPE__BODY_FETCH_REPLY,
    };
    return reply ? rep[method] : req[method];
}

static int request_from_pb(const Kvdock__Envelope *env, kvd_msg_t *out)
{
    switch (env->body_case) {
    case KVDOCK__ENVELOPE__BODY_HELLO_REQUEST: {
        kvd_hello_req_t *h = &out->body.hello_req;
        const Kvdock__HelloRequest *r = env->hello_request;
        h->pid = r->pid;
        h->protocol_version = r->protocol_version;
        h->want_pool_fd = r->want_pool_fd;
        h->want_ucx = r->want_ucx;
        h->read_only = r->read_only;
        h->writer_token = r->writer_token;
        h->earlier_copies_over = r->earlier_copies_over;
        h->n_namespaces = r->n_namespaces;
        int rc = copy_str(h->client_name, sizeof(h->client_name), r->client_name);
        if (rc == KVD_OK)
            rc = copy_bytes(h->auth_token, sizeof(h->auth_token), &h->auth_token_len,
                            r->auth_token);
        if (rc == KVD_OK)
            h->namespaces = array_from_pb(out, &ns_spec_msg, r->n_namespaces,
                                          (void *const *)r->namespaces, &rc);
        return rc;
    }
    case KVDOCK__ENVELOPE__BODY_STATS_REQUEST:
        out->body.stats_req.check = env->stats_request->check;
        return KVD_OK;
    case KVDOCK__ENVELOPE__BODY_CLUSTER_REQUEST: return KVD_OK;
    case KVDOCK__ENVELOPE__BODY_FETCH_REQUEST: {
        const Kvdock__FetchRequest *r = env->fetch_request;
        kvd_fetch_req_t *l = &out->body.fetch_req;
        int rc = copy_str(l->tenant, sizeof(l->tenant), r->tenant);
        if (rc == KVD_OK)
            rc = copy_str(l->ns_name, sizeof(l->ns_name), r->ns_name);
        l->pin = r->pin;
        return rc != KVD_OK ? rc : keys_from_pb(out, r->keys, &l->keys, &l->n);
    }
    case KVDOCK__ENVELOPE__BODY_DIR_ANNOUNCE_REQUEST: {
        const Kvdock__DirAnnounceRequest *r = env->dir_announce_request;
        kvd_dir_announce_req_t *l = &out->body.dir_announce_req;
        int rc = copy_str(l->holder, sizeof(l->holder), r->holder);
        l->holder_started_ms = r->holder_started_ms;
        l->reset = r->reset;
        l->n = r->n_batches;
        return rc != KVD_OK
                   ? rc
                   : dir_keys_from_pb(out, r->n_batches, r->batches, &l->batches);
    }
    case KVDOCK__ENVELOPE__BODY_DIR_LOOKUP_REQUEST: {
        const Kvdock__DirLookupRequest *r = env->dir_lookup_request;
        out->body.dir_lookup_req.n = r->n_queries;
        out->body.dir_lookup_req.local = r->local;
        return dir_keys_from_pb(out, r->n_queries, r->queries,
                                &out->body.dir_lookup_req.queries);
    }
    case KVDOCK__ENVELOPE__BODY_REGISTER_REQUEST: {
        const Kvdock__RegisterNamespaceRequest *r = env->register_request;
        int rc;
        out->body.register_req.n = r->n_namespaces;
        out->body.register_req.namespaces = array_from_pb(
            out, &ns_spec_msg, r->n_namespaces, (void *const *)r->namespaces, &rc);
        return rc;
    }
    case KVDOCK__ENVELOPE__BODY_LOOKUP_REQUEST: {
        const Kvdock__LookupRequest *r = env->lookup_request;
        kvd_lookup_req_t *l = &out->body.lookup_req;
        l->pools = arena_array(out, r->n_pools, sizeof(*l->pools));
        if (l->pools == NULL)
            return KVD_ERR_NOMEM;
        l->n_pools = r->n_pools;
        for (size_t i = 0; i < r->n_pools; i++) {
            l->pools[i].ns = r->pools[i]->ns;
            l->pools[i].trailing_pages = r->pools[i]->trailing_pages;
            int rc = keys_from_pb(out, r->pools[i]->keys, &l->pools[i].keys,
                                  &l->pools[i].n_keys);
            if (rc != KVD_OK)
                return rc;
        }
        return KVD_OK;
    }
    case KVDOCK__ENVELOPE__BODY_RESERVE_REQUEST: {
        const Kvdock__ReserveRequest *r = env->reserve_request;
        kvd_reserve_req_t *q = &out->body.reserve_req;
        q->ns = r->ns;
        q->object_bytes = r->object_bytes;
        if (r->keys.len % KVD_KEY_BYTES != 0)
            return KVD_ERR_PROTOCOL;
        size_t n = r->keys.len / KVD_KEY_BYTES;
        bool parents = r->parents.len != 0 || r->has_parent.len != 0;
        if ((parents && (r->parents.len != r->keys.len || r->has_parent.len != n)) ||
            (r->n_depths != 0 && r->n_depths != n))
            return KVD_ERR_PROTOCOL;
        q->items = arena_array(out, n, sizeof(*q->items));
        if (q->items == NULL)
            return KVD_ERR_NOMEM;
        q->n = n;
        for (size_t i = 0; i < n; i++) {
            kvd_put_item_t *it = &q->items[i];
            memcpy(it->key, r->keys.data + i * KVD_KEY_BYTES, KVD_KEY_BYTES);
            it->has_parent = parents && r->has_parent.data[i] != 0;
            if (it->has_parent)
                memcpy(it->parent, r->parents.data + i * KVD_KEY_BYTES, KVD_KEY_BYTES);
            it->depth = r->n_depths ? r->depths[i] : 0;
        }
        return KVD_OK;
    }
    case KVDOCK__ENVELOPE__BODY_FINISH_REQUEST: {
        const Kvdock__FinishRequest *r = env->finish_request;
        out->body.finish_req.lease_id = r->lease_id;
        return keys_from_pb(out, r->keys, &out->body.finish_req.keys,
                            &out->body.finish_req.n);
    }
    case KVDOCK__ENVELOPE__BODY_ACQUIRE_REQUEST: {
        const Kvdock__AcquireRequest *r = env->acquire_request;
        out->body.acquire_req.ns = r->ns;
        out->body.acquire_req.object_bytes = r->object_bytes;
        out->body.acquire_req.wait_ms = r->wait_ms;
        return keys_from_pb(out, r->keys, &out->body.acquire_req.keys,
                            &out->body.acquire_req.n);
    }
    case KVDOCK__ENVELOPE__BODY_RELEASE_REQUEST:
        out->body.release_req.lease_id = env->release_request->lease_id;
        return KVD_OK;
    case KVDOCK__ENVELOPE__BODY_LIST_REQUEST: {
        const Kvdock__ListPrefixesRequest *r = env->list_request;
        out->body.list_req.nodes = r->nodes;
        out->body.list_req.limit = r->limit;
        int rc = copy_bytes(out->body.list_req.cursor, sizeof(out->body.list_req.cursor),
                            &out->body.list_req.cursor_len, r->cursor);
        if (rc != KVD_OK)
            return rc;
        return copy_str(out->body.list_req.ns_name, sizeof(out->body.list_req.ns_name),
                        r->ns_name);
    }
    case KVDOCK__ENVELOPE__BODY_INSPECT_REQUEST: {
        const Kvdock__InspectRequest *r = env->inspect_request;
        int rc = copy_key(out->body.inspect_req.key, r->key);
        return rc ? rc
                  : copy_str(out->body.inspect_req.ns_name,
                             sizeof(out->body.inspect_req.ns_name), r->ns_name);
    }
    case KVDOCK__ENVELOPE__BODY_EVICT_REQUEST: {
        const Kvdock__EvictRequest *r = env->evict_request;
        kvd_evict_req_t *e = &out->body.evict_req;
        e->all = r->all;
        e->has_key = r->key.len != 0;
        if (e->has_key && copy_key(e->key, r->key) != KVD_OK)
            return KVD_ERR_PROTOCOL;
        if (copy_bytes(e->cursor, sizeof(e->cursor), &e->cursor_len, r->cursor) != KVD_OK)
            return KVD_ERR_PROTOCOL;
        return copy_str(e->ns_name, sizeof(e->ns_name), r->ns_name);
    }
    default: return KVD_OK; /* empty request bodies */
    }
}

static int reply_from_pb(const Kvdock__Envelope *env, kvd_msg_t *out)
{
    switch (env->body_case) {
    case KVDOCK__ENVELOPE__BODY_HELLO_REPLY: {
        kvd_hello_rep_t *h = &out->body.hello_rep;
        const Kvdock__HelloReply *r = env->hello_reply;
        h->protocol_version = r->protocol_version;
        h->max_frame_bytes = r->max_frame_bytes;
        h->max_batch = r->max_batch;
        h->pool_bytes = r->pool_bytes;
        h->connection_id = r->connection_id;
        h->pool_fd_attached = r->pool_fd_attached;
        h->lease_ttl_ms = r->lease_ttl_ms;
        h->n_ns_ids = r->n_ns_ids;
        h->ucx_pool_base = r->ucx_pool_base;
        h->read_only = r->read_only;
        int rc =
            copy_str(h->daemon_version, sizeof(h->daemon_version), r->daemon_version);
        if (rc == KVD_OK)
            rc = copy_str(h->tenant, sizeof(h->tenant), r->tenant);
        if (rc == KVD_OK)
            rc = copy_bytes(h->ucx_token, sizeof(h->ucx_token), &h->ucx_token_len,
                            r->ucx_token);
        if (rc == KVD_OK)
            rc = bytes_from_pb(out, r->ucx_address, &h->ucx_address, &h->ucx_address_len);
        if (rc == KVD_OK)
            rc = bytes_from_pb(out, r->ucx_rkey, &h->ucx_rkey, &h->ucx_rkey_len);
        if (rc == KVD_OK)
            rc = copy_str(h->instance, sizeof(h->instance), r->instance);
        return rc ? rc : u32s_from_pb(out, r->n_ns_ids, r->ns_ids, &h->ns_ids);
    }
    case KVDOCK__ENVELOPE__BODY_HEALTH_REPLY: {
        kvd_health_rep_t *h = &out->body.health_rep;
        h->state = (kvd_health_t)env->health_reply->state;
        h->pool_bytes = env->health_reply->pool_bytes;
        h->populated_bytes = env->health_reply->populated_bytes;
        h->uptime_ms = env->health_reply->uptime_ms;
        h->cluster = (kvd_cluster_state_t)env->health_reply->cluster;
        return KVD_OK;
    }
    case KVDOCK__ENVELOPE__BODY_CLUSTER_REPLY: {
        const Kvdock__ClusterReply *r = env->cluster_reply;
        kvd_cluster_rep_t *c = &out->body.cluster_rep;
        c->state = (kvd_cluster_state_t)r->state;
        c->epoch = r->epoch;
        int rc = copy_str(c->node_id, sizeof(c->node_id), r->node_id);
        if (rc == KVD_OK)
            kvd_utf8_copy(c->etcd, r->etcd ? r->etcd : "", sizeof(c->etcd));
        if (rc == KVD_OK)
            c->members = array_from_pb(out, &member_msg, r->n_members,
                                       (void *const *)r->members, &rc);
        c->n_members = rc == KVD_OK ? r->n_members : 0;
        if (rc == KVD_OK && r->counters != NULL) {
            const Kvdock__ClusterCounters *o = r->counters;
            kvd_cluster_counters_t *s = &c->counters;
            KVD_CLUSTER_COUNTER_FIELDS(FIELD_FROM_PB)
        }
        return rc;
    }
    case KVDOCK__ENVELOPE__BODY_FETCH_REPLY: {
        const Kvdock__FetchReply *r = env->fetch_reply;
        kvd_fetch_rep_t *f = &out->body.fetch_rep;
        f->object_bytes = r->object_bytes;
        const uint8_t *p = NULL;
        int rc = bytes_from_pb(out, r->present, &p, &f->n);
        f->present = (uint8_t *)p;
        size_t n_present = 0;
        for (size_t i = 0; rc == KVD_OK && i < f->n; i++) {
            if (f->present[i] > KVD_FETCH_PROMOTING)
                rc = KVD_ERR_PROTOCOL;
            n_present += f->present[i] == KVD_FETCH_HERE;
        }
        /* every present key's depth, and its bytes or (pinned) its offset,
         * nothing more or less */
        bool pinned = r->n_offsets > 0 || r->lease_id != 0;
        size_t want_data = pinned ? 0 : n_present;
        if (rc == KVD_OK && (r->n_depths != n_present ||
                             (pinned && (r->n_offsets != n_present || r->data.len != 0))))
            rc = KVD_ERR_PROTOCOL;
        if (rc == KVD_OK && want_data > 0 &&
            (f->object_bytes == 0 || r->data.len / f->object_bytes != want_data ||
             r->data.len % f->object_bytes))
            rc = KVD_ERR_PROTOCOL;
        if (rc == KVD_OK && want_data == 0 && r->data.len != 0)
            rc = KVD_ERR_PROTOCOL;
        if (rc == KVD_OK)
            rc = bytes_from_pb(out, r->data, &f->data, &f->data_len);
        if (rc == KVD_OK)
            rc = u32s_from_pb(out, r->n_depths, r->depths, &f->depths);
        f->n_depths = r->n_depths;
        f->lease_id = r->lease_id;
        if (rc == KVD_OK)
            rc = u64s_from_pb(out, r->n_offsets, r->offsets, &f->offsets);
        f->n_offsets = r->n_offsets;
        return rc;
    }
    case KVDOCK__ENVELOPE__BODY_DIR_ANNOUNCE_REPLY:
        out->body.dir_announce_rep.entries = env->dir_announce_reply->entries;
        return KVD_OK;
    case KVDOCK__ENVELOPE__BODY_DIR_LOOKUP_REPLY: {
        const Kvdock__DirLookupReply *r = env->dir_lookup_reply;
        kvd_dir_lookup_rep_t *d = &out->body.dir_lookup_rep;
        if (r->n_nodes > KVD_DIR_NODES_MAX)
            return KVD_ERR_PROTOCOL;
        d->nodes = arena_array(out, r->n_nodes, sizeof(*d->nodes));
        d->n_holders = arena_array(out, r->n_answers, sizeof(*d->n_holders));
        d->holders = arena_array(out, r->n_answers, sizeof(*d->holders));
        if ((r->n_nodes && !d->nodes) || (r->n_answers && (!d->n_holders || !d->holders)))
            return KVD_ERR_NOMEM;
        d->n_nodes = r->n_nodes;
        for (size_t i = 0; i < r->n_nodes; i++)
            if (copy_str(d->nodes[i], sizeof(d->nodes[i]), r->nodes[i]) != KVD_OK)
                return KVD_ERR_PROTOCOL;
        d->n = r->n_answers;
        for (size_t i = 0; i < r->n_answers; i++) {
            d->n_holders[i] = r->answers[i]->n_holders;
            int rc = u64s_from_pb(out, r->answers[i]->n_holders, r->answers[i]->holders,
                                  &d->holders[i]);
            if (rc != KVD_OK)
                return rc;
        }
        return KVD_OK;
    }
    case KVDOCK__ENVELOPE__BODY_STATS_REPLY:
        return stats_from_pb(out, env->stats_reply, &out->body.stats_rep);
    case KVDOCK__ENVELOPE__BODY_REGISTER_REPLY:
        out->body.register_rep.n = env->register_reply->n_ns_ids;
        return u32s_from_pb(out, env->register_reply->n_ns_ids,
                            env->register_reply->ns_ids, &out->body.register_rep.ids);
    case KVDOCK__ENVELOPE__BODY_LOOKUP_REPLY:
        out->body.lookup_rep.n = env->lookup_reply->n_boundaries;
        if (env->lookup_reply->n_tiers != 0 &&
            env->lookup_reply->n_tiers != env->lookup_reply->n_boundaries)
            return KVD_ERR_PROTOCOL;
        if (env->lookup_reply->n_tiers != 0) {
            int rc = u32s_from_pb(out, env->lookup_reply->n_tiers,
                                  env->lookup_reply->tiers, &out->body.lookup_rep.tiers);
            if (rc != KVD_OK)
                return rc;
        }
        return u32s_from_pb(out, env->lookup_reply->n_boundaries,
                            env->lookup_reply->boundaries,
                            &out->body.lookup_rep.boundaries);
    case KVDOCK__ENVELOPE__BODY_RESERVE_REPLY: {
        const Kvdock__ReserveReply *r = env->reserve_reply;
        kvd_reserve_rep_t *q = &out->body.reserve_rep;
        if (r->n_offsets != r->n_results)
            return KVD_ERR_PROTOCOL;
        q->lease_id = r->lease_id;
        q->object_bytes = r->object_bytes;
        q->n = r->n_results;
        q->results = arena_array(out, r->n_results, 1);
        if (q->results == NULL)
            return KVD_ERR_NOMEM;
        for (size_t i = 0; i < r->n_results; i++) {
            if (r->results[i] >= KVD_RESERVE_RESULT_COUNT)
                return KVD_ERR_PROTOCOL;
            q->results[i] = (uint8_t)r->results[i];
        }
        return u64s_from_pb(out, r->n_offsets, r->offsets, &q->offsets);
    }
    case KVDOCK__ENVELOPE__BODY_ACQUIRE_REPLY: {
        const Kvdock__AcquireReply *r = env->acquire_reply;
        out->body.acquire_rep.lease_id = r->lease_id;
        out->body.acquire_rep.object_bytes = r->object_bytes;
        out->body.acquire_rep.n = r->n_offsets;
        return u64s_from_pb(out, r->n_offsets, r->offsets,
                            &out->body.acquire_rep.offsets);
    }
    case KVDOCK__ENVELOPE__BODY_LIST_REPLY: {
        const Kvdock__ListPrefixesReply *r = env->list_reply;
        kvd_list_rep_t *l = &out->body.list_rep;
        l->truncated = r->truncated;
        int rc0 = copy_bytes(l->next_cursor, sizeof(l->next_cursor), &l->next_cursor_len,
                             r->next_cursor);
        if (rc0 != KVD_OK)
            return rc0;
        l->n_prefixes = r->n_prefixes;
        l->n_nodes = r->n_nodes;
        l->n_namespaces = r->n_namespaces;
        int rc = prefixes_from_pb(out, r->n_prefixes, r->prefixes, &l->prefixes);
        if (rc == KVD_OK)
            l->nodes =
                array_from_pb(out, &obj_msg, r->n_nodes, (void *const *)r->nodes, &rc);
        if (rc == KVD_OK)
            l->namespaces = array_from_pb(out, &ns_info_msg, r->n_namespaces,
                                          (void *const *)r->namespaces, &rc);
        return rc;
    }
    case KVDOCK__ENVELOPE__BODY_INSPECT_REPLY: {
        const Kvdock__InspectReply *r = env->inspect_reply;
        kvd_inspect_rep_t *l = &out->body.inspect_rep;
        l->n_objects = r->n_objects;
        l->n_namespaces = r->n_namespaces;
        int rc;
        l->objects =
            array_from_pb(out, &obj_msg, r->n_objects, (void *const *)r->objects, &rc);
        if (rc == KVD_OK)
            l->namespaces = array_from_pb(out, &ns_info_msg, r->n_namespaces,
                                          (void *const *)r->namespaces, &rc);
        return rc;
    }
    case KVDOCK__ENVELOPE__BODY_EVICT_REPLY:
        out->body.evict_rep.evicted = env->evict_reply->evicted;
        out->body.evict_rep.skipped = env->evict_reply->skipped;
        return copy_bytes(
            out->body.evict_rep.next_cursor, sizeof(out->body.evict_rep.next_cursor),
            &out->body.evict_rep.next_cursor_len, env->evict_reply->next_cursor);
    default: return KVD_OK; /* empty reply bodies */
    }
}

/* ----------------------------------------------------- request limits */

/* Whether a packed batch of keys holds at most max keys. */
static bool keys_within(ProtobufCBinaryData keys, size_t max)
{
    return keys.len / KVD_KEY_BYTES <= max;
}

/* Whether the request body of env is within lim (replies always are).
 * Looks only at the counts protobuf-c parsed: nothing of the message's
 * arena exists yet. */
static bool within_limits(const Kvdock__Envelope *env, const kvd_msg_limits_t *lim)
{
    size_t max = lim->max_items;
    switch (env->body_case) {
    case KVDOCK__ENVELOPE__BODY_HELLO_REQUEST:
        return env->hello_request->n_namespaces <= max;
    case KVDOCK__ENVELOPE__BODY_REGISTER_REQUEST:
        return env->register_request->n_namespaces <= max;
    case KVDOCK__ENVELOPE__BODY_LOOKUP_REQUEST: {
        const Kvdock__LookupRequest *r = env->lookup_request;
        if (r->n_pools > lim->max_pools)
            return false;
        for (size_t i = 0; i < r->n_pools; i++)
            if (!keys_within(r->pools[i]->keys, max))
                return false;
        return true;
    }
    case KVDOCK__ENVELOPE__BODY_RESERVE_REQUEST: {
        const Kvdock__ReserveRequest *r = env->reserve_request;
        return keys_within(r->keys, max) && keys_within(r->parents, max) &&
               r->has_parent.len <= max && r->n_depths <= max;
    }
    case KVDOCK__ENVELOPE__BODY_FINISH_REQUEST:
        return keys_within(env->finish_request->keys, max);
    case KVDOCK__ENVELOPE__BODY_ACQUIRE_REQUEST:
        return keys_within(env->acquire_request->keys, max);
    case KVDOCK__ENVELOPE__BODY_FETCH_REQUEST:
        return keys_within(env->fetch_request->keys, max);
    case KVDOCK__ENVELOPE__BODY_DIR_ANNOUNCE_REQUEST: {
        /* a batch per namespace; keys across the whole frame bounded by the
         * frame size itself (each is 32 bytes on the wire) */
        return env->dir_announce_request->n_batches <= max;
    }
    case KVDOCK__ENVELOPE__BODY_DIR_LOOKUP_REQUEST: {
        const Kvdock__DirLookupRequest *r = env->dir_lookup_request;
        if (r->n_queries > lim->max_pools * 64)
            return false;
        for (size_t i = 0; i < r->n_queries; i++)
            if (!keys_within(r->queries[i]->added, max))
                return false;
        return true;
    }
    default: return true;
    }
}

/* Fills out's body from env; the body must be the one of (method, reply)
 * and, for a request, within lim (NULL = unlimited). */
static int body_from_pb(const Kvdock__Envelope *env, const kvd_msg_limits_t *lim,
                        kvd_msg_t *out)
{
    Kvdock__Envelope__BodyCase want = expected_body(out->method, out->reply);
    /* Empty bodies (Health, Stats without check, Publish/Revoke/Release
     * replies) may be omitted by a sender: "not set" is accepted for them. */
    bool may_omit = env->body_case == KVDOCK__ENVELOPE__BODY__NOT_SET &&
                    ((!out->reply && (out->method == KVD_METHOD_HEALTH ||
                                      out->method == KVD_METHOD_STATS ||
                                      out->method == KVD_METHOD_CLUSTER)) ||
                     (out->reply && (out->method == KVD_METHOD_PUBLISH ||
                                     out->method == KVD_METHOD_REVOKE ||
                                     out->method == KVD_METHOD_RELEASE)));
    if (env->body_case != want && !may_omit)
        return KVD_ERR_PROTOCOL;
    if (out->reply)
        return reply_from_pb(env, out);
    if (lim != NULL && !within_limits(env, lim))
        return KVD_ERR_TOO_LARGE;
    return request_from_pb(env, out);
}

/* ----------------------------------------------------- unpack allocator */

/*
 * protobuf-c's allocator for one unpack: every block is charged to
 * KVD_MEM_CONN and carries a header with its size (protobuf-c's free does
 * not pass it); once the live bytes would exceed the budget, allocation
 * fails and so does the unpack.
 */
typedef union unpack_block_hdr {
    size_t bytes; /* the whole block, header included */
    max_align_t align;
} unpack_block_hdr_t;

typedef struct unpack_budget {
    size_t live_bytes;
    size_t max_bytes;
} unpack_budget_t;

static void *unpack_alloc(void *data, size_t size)
{
    unpack_budget_t *b = data;
    if (size > SIZE_MAX - sizeof(unpack_block_hdr_t))
        return NULL;
    size_t total = sizeof(unpack_block_hdr_t) + size;
    if (total > b->max_bytes - b->live_bytes) /* live_bytes <= max_bytes */
        return NULL;
    unpack_block_hdr_t *h = kvd_mem_calloc(KVD_MEM_CONN, 1, total);
    if (h == NULL)
        return NULL;
    h->bytes = total;
    b->live_bytes += total;
    return h + 1;
}

static void unpack_free(void *data, void *ptr)
{
    if (ptr == NULL)
        return;
    unpack_budget_t *b = data;
    unpack_block_hdr_t *h = (unpack_block_hdr_t *)ptr - 1;
    b->live_bytes -= h->bytes;
    kvd_mem_free(KVD_MEM_CONN, h, h->bytes);
}

/*
 * The budget for unpacking a payload of len bytes under lim, saturating.
 * Per byte alone is not enough for a valid request: a namespace of a Hello
 * with a two-character name takes 9 bytes on the wire and about 170 while
 * unpacked (its struct, its name, its pointer and protobuf-c's scan
 * records), so a Hello of 2,048 such names, well within --max-batch, ran
 * out. Each item a request may hold (lim->max_items, and no more than one
 * per KVD_DECODE_ITEM_MIN_BYTES of payload: the shortest valid namespace)
 * brings KVD_DECODE_BUDGET_PER_ITEM more; a bomb of empty submessages is
 * still held to the per-byte budget plus that. Without a limit on items
 * (none, or SIZE_MAX) there is no such allowance.
 */
static size_t unpack_budget_bytes(size_t len, const kvd_msg_limits_t *lim)
{
    size_t extra = KVD_DECODE_BUDGET_EXTRA_BYTES;
    if (lim != NULL && lim->max_items != SIZE_MAX) {
        size_t items = KVD_MIN(lim->max_items, len / KVD_DECODE_ITEM_MIN_BYTES);
        if (items > (SIZE_MAX - extra) / KVD_DECODE_BUDGET_PER_ITEM)
            return SIZE_MAX;
        extra += items * KVD_DECODE_BUDGET_PER_ITEM;
    }
    if (len > (SIZE_MAX - extra) / KVD_DECODE_BUDGET_PER_BYTE)
        return SIZE_MAX;
    return len * KVD_DECODE_BUDGET_PER_BYTE + extra;
}

int kvd_msg_decode(const uint8_t *payload, size_t len, kvd_msg_t *out)
{
    return kvd_msg_decode_limited(payload, len, NULL, out);
}

int kvd_msg_decode_limited(const uint8_t *payload, size_t len,
                           const kvd_msg_limits_t *lim, kvd_msg_t *out)
{
    memset(out, 0, sizeof(*out));
    unpack_budget_t budget = {.live_bytes = 0,
                              .max_bytes = unpack_budget_bytes(len, lim)};
    ProtobufCAllocator alloc = {
        .alloc = unpack_alloc, .free = unpack_free, .allocator_data = &budget};
    Kvdock__Envelope *env = kvdock__envelope__unpack(&alloc, len, payload);
    if (env == NULL)
        return KVD_ERR_PROTOCOL;

    int rc = KVD_OK;
    out->id = env->id;
    out->reply = env->reply;
    if ((unsigned)env->method == KVD_METHOD_NONE ||
        (unsigned)env->method >= KVD_METHOD_COUNT) {
        /* an error reply to a frame the daemon could not attribute has no
         * method; anything else without a known method is refused */
        if (env->reply && env->error != NULL && env->error->code < 0 &&
            (unsigned)env->method == KVD_METHOD_NONE) {
            out->method = KVD_METHOD_NONE;
            /* a code this side does not know (a newer or a broken peer)
             * reaches callers as a protocol error, never as a stray int */
            out->status =
                kvd_status_known(env->error->code) ? env->error->code : KVD_ERR_PROTOCOL;
            out->error_index = env->error->index;
            kvd_utf8_copy(out->error, env->error->message ? env->error->message : "",
                          sizeof(out->error));
            goto free_env;
        }
        out->method = KVD_METHOD_NONE;
        rc = KVD_ERR_UNKNOWN_METHOD;
        goto free_env;
    }
    out->method = (kvd_method_t)env->method;

    if (env->error != NULL && env->error->code != 0) {
        /* "in progress" is the one positive code: an Acquire of objects
         * being promoted from the SSD tier, to be asked again */
        if (!out->reply || (env->error->code > 0 && env->error->code != KVD_INPROGRESS) ||
            env->body_case != KVDOCK__ENVELOPE__BODY__NOT_SET) {
            rc = KVD_ERR_PROTOCOL;
            goto free_env;
        }
        out->status =
            kvd_status_known(env->error->code) ? env->error->code : KVD_ERR_PROTOCOL;
        out->error_index = env->error->index;
        /* error texts are for people: truncate (between characters) rather
         * than refuse, also one that is not UTF-8 */
        kvd_utf8_copy(out->error, env->error->message ? env->error->message : "",
                      sizeof(out->error));
        goto free_env;
    }
    rc = body_from_pb(env, lim, out);

free_env:
    kvdock__envelope__free_unpacked(env, &alloc);
    return rc;
}
