/*
 * msg.c - conversion between kvd_msg_t and the protobuf-c Envelope.
 *
 * Packing builds the generated structs on the stack, pointing into the
 * caller's kvd_msg_t (no copies, no allocation except the output frame).
 * Decoding unpacks with protobuf-c's allocator, copies into kvd_msg_t and
 * frees; strings longer than the C fields are a protocol error, not a
 * silent truncation.
 */
#include "kvd_proto.h"
#include "kvdock.pb-c.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

const char *kvd_method_name(kvd_method_t m)
{
    static const char *const names[KVD_METHOD_COUNT] = {"none", "hello", "health",
                                                        "stats"};
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

uint64_t kvd_latency_bound_us(size_t i)
{
    static const uint64_t bounds[KVD_LATENCY_BUCKETS] = {
        5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 50000, 250000, UINT64_MAX};
    return i < KVD_LATENCY_BUCKETS ? bounds[i] : UINT64_MAX;
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

/* ------------------------------------------------------------- packing */

/* Everything one Stats reply needs on the stack while it is packed. */
typedef struct stats_pack {
    Kvdock__StatsReply reply;
    Kvdock__MemoryStats memory;
    Kvdock__MethodStats methods[KVD_METHOD_COUNT];
    Kvdock__MethodStats *method_ptrs[KVD_METHOD_COUNT];
    uint64_t buckets[KVD_METHOD_COUNT][KVD_LATENCY_BUCKETS];
} stats_pack_t;

static void stats_to_pb(const kvd_stats_rep_t *s, stats_pack_t *p)
{
    kvdock__stats_reply__init(&p->reply);
    kvdock__memory_stats__init(&p->memory);
    p->reply.daemon_version = (char *)s->daemon_version;
    p->reply.instance = (char *)s->instance;
    p->reply.state = (Kvdock__HealthState)s->state;
    p->reply.uptime_ms = s->uptime_ms;
    p->reply.connections_current = s->connections_current;
    p->reply.connections_total = s->connections_total;
    p->reply.connections_rejected = s->connections_rejected;
    p->reply.protocol_errors = s->protocol_errors;

    const kvd_mem_stats_t *m = &s->memory;
    p->memory.pool_bytes = m->pool_bytes;
    p->memory.pool_populated_bytes = m->pool_populated_bytes;
    p->memory.rss_bytes = m->rss_bytes;
    p->memory.rss_anon_bytes = m->rss_anon_bytes;
    p->memory.rss_file_bytes = m->rss_file_bytes;
    p->memory.rss_shmem_bytes = m->rss_shmem_bytes;
    p->memory.conn_bytes = m->cat_bytes[KVD_MEM_CONN];
    p->memory.index_bytes = m->cat_bytes[KVD_MEM_INDEX];
    p->memory.staging_bytes = m->cat_bytes[KVD_MEM_STAGING];
    p->memory.other_bytes = m->cat_bytes[KVD_MEM_OTHER];
    p->memory.hugepages = m->hugepages;
    p->memory.mlocked = m->mlocked;
    p->reply.memory = &p->memory;

    size_t n = 0;
    for (size_t i = 1; i < KVD_METHOD_COUNT; i++) {
        Kvdock__MethodStats *ms = &p->methods[n];
        kvdock__method_stats__init(ms);
        ms->method = (Kvdock__Method)i;
        ms->calls = s->methods[i].calls;
        ms->errors = s->methods[i].errors;
        ms->latency_us_sum = s->methods[i].latency_us_sum;
        memcpy(p->buckets[n], s->methods[i].latency_buckets, sizeof(p->buckets[n]));
        ms->n_latency_buckets = KVD_LATENCY_BUCKETS;
        ms->latency_buckets = p->buckets[n];
        p->method_ptrs[n] = ms;
        n++;
    }
    p->reply.n_methods = n;
    p->reply.methods = p->method_ptrs;
}

int kvd_msg_pack(const kvd_msg_t *m, size_t max_frame, kvd_buf_t *out)
{
    Kvdock__Envelope env = KVDOCK__ENVELOPE__INIT;
    Kvdock__Error err = KVDOCK__ERROR__INIT;
    Kvdock__HelloRequest hello_req = KVDOCK__HELLO_REQUEST__INIT;
    Kvdock__HelloReply hello_rep = KVDOCK__HELLO_REPLY__INIT;
    Kvdock__HealthRequest health_req = KVDOCK__HEALTH_REQUEST__INIT;
    Kvdock__HealthReply health_rep = KVDOCK__HEALTH_REPLY__INIT;
    Kvdock__StatsRequest stats_req = KVDOCK__STATS_REQUEST__INIT;
    stats_pack_t stats;

    env.id = m->id;
    env.method = (Kvdock__Method)m->method;
    env.reply = m->reply;

    if (m->reply && m->status != KVD_OK) {
        err.code = m->status;
        err.message = (char *)m->error;
        env.error = &err;
    } else if (!m->reply) {
        switch (m->method) {
        case KVD_METHOD_HELLO:
            hello_req.client_name = (char *)m->body.hello_req.client_name;
            hello_req.pid = m->body.hello_req.pid;
            hello_req.protocol_version = m->body.hello_req.protocol_version;
            env.body_case = KVDOCK__ENVELOPE__BODY_HELLO_REQUEST;
            env.hello_request = &hello_req;
            break;
        case KVD_METHOD_HEALTH:
            env.body_case = KVDOCK__ENVELOPE__BODY_HEALTH_REQUEST;
            env.health_request = &health_req;
            break;
        case KVD_METHOD_STATS:
            env.body_case = KVDOCK__ENVELOPE__BODY_STATS_REQUEST;
            env.stats_request = &stats_req;
            break;
        default: return KVD_ERR_INVALID;
        }
    } else {
        switch (m->method) {
        case KVD_METHOD_HELLO: {
            const kvd_hello_rep_t *h = &m->body.hello_rep;
            hello_rep.daemon_version = (char *)h->daemon_version;
            hello_rep.instance = (char *)h->instance;
            hello_rep.protocol_version = h->protocol_version;
            hello_rep.max_frame_bytes = h->max_frame_bytes;
            hello_rep.max_batch = h->max_batch;
            hello_rep.pool_bytes = h->pool_bytes;
            hello_rep.connection_id = h->connection_id;
            env.body_case = KVDOCK__ENVELOPE__BODY_HELLO_REPLY;
            env.hello_reply = &hello_rep;
            break;
        }
        case KVD_METHOD_HEALTH: {
            const kvd_health_rep_t *h = &m->body.health_rep;
            health_rep.state = (Kvdock__HealthState)h->state;
            health_rep.pool_bytes = h->pool_bytes;
            health_rep.populated_bytes = h->populated_bytes;
            health_rep.uptime_ms = h->uptime_ms;
            env.body_case = KVDOCK__ENVELOPE__BODY_HEALTH_REPLY;
            env.health_reply = &health_rep;
            break;
        }
        case KVD_METHOD_STATS:
            stats_to_pb(&m->body.stats_rep, &stats);
            env.body_case = KVDOCK__ENVELOPE__BODY_STATS_REPLY;
            env.stats_reply = &stats.reply;
            break;
        default: return KVD_ERR_INVALID;
        }
    }

    size_t len = kvdock__envelope__get_packed_size(&env);
    if (len > max_frame)
        return KVD_ERR_TOO_LARGE;
    /* An envelope with every field at its default packs to zero bytes, which
     * framing reserves as an error; a request always has a method and an
     * error reply a code. */
    if (len == 0)
        return KVD_ERR_INVALID;
    /* room for header and payload first: a failure leaves out unchanged */
    int rc = kvd_buf_reserve(out, KVD_FRAME_HEADER_BYTES + len);
    if (rc == KVD_OK)
        rc = kvd_frame_put_header(out, len);
    if (rc != KVD_OK)
        return rc;
    kvdock__envelope__pack(&env, out->data + out->len);
    out->len += len;
    return KVD_OK;
}

/* ------------------------------------------------------------ decoding */

/* Copies a protobuf string into a fixed field; longer is a protocol error. */
static int copy_str(char *dst, size_t dst_len, const char *src)
{
    if (src == NULL) {
        dst[0] = '\0';
        return KVD_OK;
    }
    size_t n = strlen(src);
    if (n >= dst_len)
        return KVD_ERR_PROTOCOL;
    memcpy(dst, src, n + 1);
    return KVD_OK;
}

static int stats_from_pb(const Kvdock__StatsReply *r, kvd_stats_rep_t *s)
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
    if (r->memory != NULL) {
        const Kvdock__MemoryStats *pm = r->memory;
        kvd_mem_stats_t *m = &s->memory;
        m->pool_bytes = pm->pool_bytes;
        m->pool_populated_bytes = pm->pool_populated_bytes;
        m->rss_bytes = pm->rss_bytes;
        m->rss_anon_bytes = pm->rss_anon_bytes;
        m->rss_file_bytes = pm->rss_file_bytes;
        m->rss_shmem_bytes = pm->rss_shmem_bytes;
        m->cat_bytes[KVD_MEM_CONN] = pm->conn_bytes;
        m->cat_bytes[KVD_MEM_INDEX] = pm->index_bytes;
        m->cat_bytes[KVD_MEM_STAGING] = pm->staging_bytes;
        m->cat_bytes[KVD_MEM_OTHER] = pm->other_bytes;
        m->hugepages = pm->hugepages;
        m->mlocked = pm->mlocked;
    }
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
    return KVD_OK;
}

/* Fills out's body from env; the body must be the one of (method, reply). */
static int body_from_pb(const Kvdock__Envelope *env, kvd_msg_t *out)
{
    Kvdock__Envelope__BodyCase want;
    switch (out->method) {
    case KVD_METHOD_HELLO:
        want = out->reply ? KVDOCK__ENVELOPE__BODY_HELLO_REPLY
                          : KVDOCK__ENVELOPE__BODY_HELLO_REQUEST;
        break;
    case KVD_METHOD_HEALTH:
        want = out->reply ? KVDOCK__ENVELOPE__BODY_HEALTH_REPLY
                          : KVDOCK__ENVELOPE__BODY_HEALTH_REQUEST;
        break;
    case KVD_METHOD_STATS:
        want = out->reply ? KVDOCK__ENVELOPE__BODY_STATS_REPLY
                          : KVDOCK__ENVELOPE__BODY_STATS_REQUEST;
        break;
    default: return KVD_ERR_PROTOCOL;
    }
    /* Empty request bodies pack to nothing a receiver can tell from "not
     * set" when the sender omits them, so those are accepted either way. */
    bool empty_ok = !out->reply && out->method != KVD_METHOD_HELLO;
    if (env->body_case != want &&
        !(empty_ok && env->body_case == KVDOCK__ENVELOPE__BODY__NOT_SET))
        return KVD_ERR_PROTOCOL;

    switch (env->body_case) {
    case KVDOCK__ENVELOPE__BODY_HELLO_REQUEST: {
        kvd_hello_req_t *h = &out->body.hello_req;
        h->pid = env->hello_request->pid;
        h->protocol_version = env->hello_request->protocol_version;
        return copy_str(h->client_name, sizeof(h->client_name),
                        env->hello_request->client_name);
    }
    case KVDOCK__ENVELOPE__BODY_HELLO_REPLY: {
        kvd_hello_rep_t *h = &out->body.hello_rep;
        const Kvdock__HelloReply *r = env->hello_reply;
        h->protocol_version = r->protocol_version;
        h->max_frame_bytes = r->max_frame_bytes;
        h->max_batch = r->max_batch;
        h->pool_bytes = r->pool_bytes;
        h->connection_id = r->connection_id;
        int rc =
            copy_str(h->daemon_version, sizeof(h->daemon_version), r->daemon_version);
        return rc ? rc : copy_str(h->instance, sizeof(h->instance), r->instance);
    }
    case KVDOCK__ENVELOPE__BODY_HEALTH_REPLY: {
        kvd_health_rep_t *h = &out->body.health_rep;
        h->state = (kvd_health_t)env->health_reply->state;
        h->pool_bytes = env->health_reply->pool_bytes;
        h->populated_bytes = env->health_reply->populated_bytes;
        h->uptime_ms = env->health_reply->uptime_ms;
        return KVD_OK;
    }
    case KVDOCK__ENVELOPE__BODY_STATS_REPLY:
        return stats_from_pb(env->stats_reply, &out->body.stats_rep);
    default: return KVD_OK; /* empty request bodies */
    }
}

int kvd_msg_decode(const uint8_t *payload, size_t len, kvd_msg_t *out)
{
    memset(out, 0, sizeof(*out));
    Kvdock__Envelope *env = kvdock__envelope__unpack(NULL, len, payload);
    if (env == NULL)
        return KVD_ERR_PROTOCOL;

    int rc = KVD_OK;
    out->id = env->id;
    out->reply = env->reply;
    if ((unsigned)env->method == KVD_METHOD_NONE ||
        (unsigned)env->method >= KVD_METHOD_COUNT) {
        out->method = KVD_METHOD_NONE;
        /* the daemon's error reply to a frame it could not attribute to a
         * method (oversize, garbage, connection refused) has no method */
        if (env->reply && (unsigned)env->method == KVD_METHOD_NONE &&
            env->error != NULL && env->error->code < 0 &&
            env->body_case == KVDOCK__ENVELOPE__BODY__NOT_SET) {
            out->status = env->error->code;
            kvd_strlcpy(out->error, env->error->message ? env->error->message : "",
                        sizeof(out->error));
            goto free_env;
        }
        rc = KVD_ERR_UNKNOWN_METHOD;
        goto free_env;
    }
    out->method = (kvd_method_t)env->method;

    if (env->error != NULL && env->error->code != 0) {
        if (!out->reply || env->error->code > 0 ||
            env->body_case != KVDOCK__ENVELOPE__BODY__NOT_SET) {
            rc = KVD_ERR_PROTOCOL;
            goto free_env;
        }
        out->status = env->error->code;
        /* error texts are for people: truncate rather than refuse */
        kvd_strlcpy(out->error, env->error->message ? env->error->message : "",
                    sizeof(out->error));
        goto free_env;
    }
    rc = body_from_pb(env, out);

free_env:
    kvdock__envelope__free_unpacked(env, NULL);
    return rc;
}
