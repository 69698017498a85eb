/*
 * metrics.c - the Prometheus endpoint: GET /metrics (text exposition format
 * 0.0.4) and GET /healthz (200 "ready", 503 "starting"/"draining").
 *
 * libmicrohttpd serves on a pool of two threads. Both paths read the latest
 * snapshot the server handed over (kvd_metrics_publish), under a mutex that
 * guards only the pointer to it: a scrape never waits for the server's loop.
 * The store's figures and the namespaces' come from their field lists
 * (kvd_proto.h): kvdock_store_<field> and kvdock_ns_<field>{ns="..."}, a
 * counter with _total, the same names as in Stats and the CLI.
 */
#include "metrics.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netdb.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#if MHD_VERSION < 0x00097002
typedef int kvd_mhd_result;
#else
typedef enum MHD_Result kvd_mhd_result;
#endif

struct kvd_metrics {
    struct MHD_Daemon *mhd;
    pthread_mutex_t lock; /* guards snap */
    kvd_msg_t *snap;      /* the latest Stats snapshot; NULL before the first */
};

static int appendf(kvd_buf_t *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static int appendf(kvd_buf_t *b, const char *fmt, ...)
{
    for (;;) {
        size_t room = b->cap - b->len;
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(room ? (char *)b->data + b->len : NULL, room, fmt, ap);
        va_end(ap);
        if (n < 0)
            return KVD_ERR_INVALID;
        if ((size_t)n < room) {
            b->len += (size_t)n;
            return KVD_OK;
        }
        int rc = kvd_buf_reserve(b, (size_t)n + 1);
        if (rc != KVD_OK)
            return rc;
    }
}

/* The HELP and TYPE lines of a metric. */
static void header(kvd_buf_t *b, kvd_metric_kind_t kind, const char *name,
                   const char *help)
{
    appendf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name,
            kind == KVD_METRIC_COUNTER ? "counter" : "gauge");
}

/* A metric with one sample. */
static void single(kvd_buf_t *b, kvd_metric_kind_t kind, const char *name,
                   const char *help, uint64_t v)
{
    header(b, kind, name, help);
    appendf(b, "%s %llu\n", name, (unsigned long long)v);
}

/* A namespace's name as a label value: backslash and double quote escaped. */
static void ns_label(const char *name, char *label, size_t len)
{
    size_t o = 0;
    for (const char *c = name; *c && o + 2 < len; c++) {
        if (*c == '\\' || *c == '"')
            label[o++] = '\\';
        label[o++] = *c;
    }
    label[o] = '\0';
}

/* Every metric of a flat message's field list: the store's figures. */
static void render_fields(kvd_buf_t *b, const kvd_field_list_t *l, const void *obj)
{
    char name[96], value[64];
    for (size_t i = 0; i < l->n; i++) {
        const kvd_field_t *f = &l->fields[i];
        if (kvd_field_metric_name(l, f, name, sizeof(name)) != KVD_OK)
            continue;
        header(b, f->metric, name, f->help);
        appendf(b, "%s %s\n", name, kvd_field_text(f, obj, value, sizeof(value)));
    }
}

/* Every metric of the namespace list, one sample per namespace. */
static void render_namespaces(kvd_buf_t *b, const kvd_ns_msg_t *ns, size_t n_ns)
{
    const kvd_field_list_t *l = &kvd_ns_fields;
    char name[96], value[64], label[2 * KVD_NS_NAME_BYTES];
    for (size_t i = 0; i < l->n; i++) {
        const kvd_field_t *f = &l->fields[i];
        if (kvd_field_metric_name(l, f, name, sizeof(name)) != KVD_OK)
            continue;
        header(b, f->metric, name, f->help);
        for (size_t k = 0; k < n_ns; k++) {
            char tl[2 * KVD_TENANT_NAME_BYTES];
            ns_label(ns[k].name, label, sizeof(label));
            ns_label(ns[k].tenant, tl, sizeof(tl));
            /* one name may live in several tenants: both label a sample */
            appendf(b, "%s{tenant=\"%s\",ns=\"%s\"} %s\n", name, tl, label,
                    kvd_field_text(f, &ns[k], value, sizeof(value)));
        }
    }
}

/* Every metric of the tenant list, one sample per tenant. */
static void render_tenants(kvd_buf_t *b, const kvd_tenant_msg_t *t, size_t n)
{
    const kvd_field_list_t *l = &kvd_tenant_fields;
    char name[96], value[64], label[2 * KVD_TENANT_NAME_BYTES];
    for (size_t i = 0; i < l->n; i++) {
        const kvd_field_t *f = &l->fields[i];
        if (kvd_field_metric_name(l, f, name, sizeof(name)) != KVD_OK)
            continue;
        header(b, f->metric, name, f->help);
        for (size_t k = 0; k < n; k++) {
            ns_label(t[k].name, label, sizeof(label));
            appendf(b, "%s{tenant=\"%s\"} %s\n", name, label,
                    kvd_field_text(f, &t[k], value, sizeof(value)));
        }
    }
}

int kvd_metrics_render(const kvd_stats_rep_t *st, kvd_buf_t *b)
{
    const kvd_mem_stats_t *m = &st->memory;
    appendf(b,
            "# HELP kvdock_info Build and instance of this daemon.\n"
            "# TYPE kvdock_info gauge\nkvdock_info{version=\"%s\",instance=\"%s\"} 1\n",
            st->daemon_version, st->instance);
    appendf(b, "# HELP kvdock_health_state 1 for the daemon's current state.\n"
               "# TYPE kvdock_health_state gauge\n");
    for (int h = KVD_HEALTH_STARTING; h <= KVD_HEALTH_DRAINING; h++)
        appendf(b, "kvdock_health_state{state=\"%s\"} %d\n",
                kvd_health_name((kvd_health_t)h), st->state == (kvd_health_t)h);
    appendf(b,
            "# HELP kvdock_uptime_seconds Seconds since the daemon started.\n"
            "# TYPE kvdock_uptime_seconds gauge\nkvdock_uptime_seconds %.3f\n",
            (double)st->uptime_ms / 1000.0);
    single(b, KVD_METRIC_GAUGE, "kvdock_pool_bytes", "Size of the shared-memory pool.",
           m->pool_bytes);
    single(b, KVD_METRIC_GAUGE, "kvdock_pool_populated_bytes",
           "Bytes of the pool populated so far.", m->pool_populated_bytes);
    single(b, KVD_METRIC_GAUGE, "kvdock_pool_hugepages",
           "1 when the pool uses 2 MiB hugepages.", m->hugepages);
    single(b, KVD_METRIC_GAUGE, "kvdock_pool_mlocked",
           "1 when the pool is locked in memory.", m->mlocked);
    single(b, KVD_METRIC_GAUGE, "kvdock_process_rss_bytes",
           "Resident set of the daemon (VmRSS).", m->rss_bytes);
    single(b, KVD_METRIC_GAUGE, "kvdock_process_rss_anon_bytes",
           "Anonymous resident memory (RssAnon).", m->rss_anon_bytes);
    single(b, KVD_METRIC_GAUGE, "kvdock_process_rss_file_bytes",
           "File-backed resident memory (RssFile).", m->rss_file_bytes);
    single(b, KVD_METRIC_GAUGE, "kvdock_process_rss_shmem_bytes",
           "Shared-memory resident memory (RssShmem): the mapped pool.",
           m->rss_shmem_bytes);
    appendf(b, "# HELP kvdock_memory_bytes Heap bytes kvdock allocated, by purpose.\n"
               "# TYPE kvdock_memory_bytes gauge\n");
    const uint64_t own[KVD_MEM_CAT_COUNT] = {m->conn_bytes, m->index_bytes,
                                             m->staging_bytes, m->other_bytes};
    for (int c = 0; c < KVD_MEM_CAT_COUNT; c++)
        appendf(b, "kvdock_memory_bytes{category=\"%s\"} %llu\n",
                kvd_mem_cat_name((kvd_mem_cat_t)c), (unsigned long long)own[c]);
    /* the daemon's own counters, one sample each */
    const struct {
        kvd_metric_kind_t kind;
        const char *name, *help;
        uint64_t v;
    } own_counters[] = {
        {KVD_METRIC_GAUGE, "kvdock_connections", "Client connections open now.",
         st->connections_current},
        {KVD_METRIC_COUNTER, "kvdock_connections_total", "Client connections accepted.",
         st->connections_total},
        {KVD_METRIC_COUNTER, "kvdock_connections_rejected_total",
         "Connections refused over --max-connections.", st->connections_rejected},
        {KVD_METRIC_COUNTER, "kvdock_protocol_errors_total",
         "Connections closed for breaking the protocol.", st->protocol_errors},
        {KVD_METRIC_COUNTER, "kvdock_auth_failures_total",
         "Requests refused for want of a credential (before Hello, or refused).",
         st->auth_failures},
        {KVD_METRIC_COUNTER, "kvdock_connections_timed_out_total",
         "Connections closed: no Hello or an unfinished frame in time.",
         st->connections_timed_out},
        {KVD_METRIC_COUNTER, "kvdock_connections_over_buffer_total",
         "Connections closed: their input was over --max-conn-buffer.",
         st->connections_over_buffer},
        {KVD_METRIC_GAUGE, "kvdock_acquires_held",
         "Acquires held now while their objects come into the pool (wait_ms).",
         st->acquires_held},
        {KVD_METRIC_COUNTER, "kvdock_acquires_held_total",
         "Acquires held while their objects came into the pool.",
         st->acquires_held_total},
    };
    for (size_t i = 0; i < KVD_ARRAY_SIZE(own_counters); i++)
        single(b, own_counters[i].kind, own_counters[i].name, own_counters[i].help,
               own_counters[i].v);

    appendf(b, "# HELP kvdock_rpc_requests_total RPC requests served, by method.\n"
               "# TYPE kvdock_rpc_requests_total counter\n");
    for (size_t i = 1; i < KVD_METHOD_COUNT; i++)
        appendf(b, "kvdock_rpc_requests_total{method=\"%s\"} %llu\n",
                kvd_method_name((kvd_method_t)i),
                (unsigned long long)st->methods[i].calls);
    appendf(b, "# HELP kvdock_rpc_errors_total RPC requests answered with an error.\n"
               "# TYPE kvdock_rpc_errors_total counter\n");
    for (size_t i = 1; i < KVD_METHOD_COUNT; i++)
        appendf(b, "kvdock_rpc_errors_total{method=\"%s\"} %llu\n",
                kvd_method_name((kvd_method_t)i),
                (unsigned long long)st->methods[i].errors);
    appendf(b, "# HELP kvdock_rpc_latency_seconds Time from a request read to its "
               "reply queued.\n# TYPE kvdock_rpc_latency_seconds histogram\n");
    for (size_t i = 1; i < KVD_METHOD_COUNT; i++) {
        const kvd_method_stats_t *ms = &st->methods[i];
        const char *name = kvd_method_name((kvd_method_t)i);
        uint64_t cum = 0;
        for (size_t k = 0; k < KVD_LATENCY_BUCKETS; k++) {
            cum += ms->latency_buckets[k];
            uint64_t bound = kvd_latency_bound_us(k);
            if (bound == UINT64_MAX)
                appendf(
                    b,
                    "kvdock_rpc_latency_seconds_bucket{method=\"%s\",le=\"+Inf\"} %llu\n",
                    name, (unsigned long long)cum);
            else
                appendf(
                    b,
                    "kvdock_rpc_latency_seconds_bucket{method=\"%s\",le=\"%g\"} %llu\n",
                    name, (double)bound / 1e6, (unsigned long long)cum);
        }
        appendf(b, "kvdock_rpc_latency_seconds_sum{method=\"%s\"} %.6f\n", name,
                (double)ms->latency_us_sum / 1e6);
        appendf(b, "kvdock_rpc_latency_seconds_count{method=\"%s\"} %llu\n", name,
                (unsigned long long)ms->calls);
    }
    render_fields(b, &kvd_store_stats_fields, &st->store);
    render_namespaces(b, st->namespaces, st->n_namespaces);
    render_tenants(b, st->tenants, st->n_tenants);
    return b->data != NULL ? KVD_OK : KVD_ERR_NOMEM;
}

static kvd_mhd_result respond(struct MHD_Connection *conn, unsigned status,
                              const char *type, void *data, size_t len,
                              enum MHD_ResponseMemoryMode mode)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(len, data, mode);
    if (r == NULL)
        return MHD_NO;
    MHD_add_response_header(r, "Content-Type", type);
    kvd_mhd_result ret = MHD_queue_response(conn, status, r);
    MHD_destroy_response(r);
    return ret;
}

static kvd_mhd_result handle(void *cls, struct MHD_Connection *conn, const char *url,
                             const char *method, const char *version,
                             const char *upload_data, size_t *upload_data_size,
                             void **req_cls)
{
    (void)version;
    (void)upload_data;
    (void)upload_data_size;
    (void)req_cls;
    kvd_metrics_t *m = cls;
    if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0)
        return respond(conn, 405, "text/plain", "method not allowed\n", 19,
                       MHD_RESPMEM_PERSISTENT);
    bool healthz = strcmp(url, "/healthz") == 0;
    if (!healthz && strcmp(url, "/metrics") != 0)
        return respond(conn, 404, "text/plain", "not found: try /metrics or /healthz\n",
                       36, MHD_RESPMEM_PERSISTENT);
    kvd_buf_t b;
    kvd_buf_init(&b, KVD_MEM_OTHER);
    int rc = KVD_OK;
    kvd_health_t h = KVD_HEALTH_STARTING;
    pthread_mutex_lock(&m->lock);
    if (m->snap != NULL) {
        h = m->snap->body.stats_rep.state;
        if (!healthz)
            rc = kvd_metrics_render(&m->snap->body.stats_rep, &b);
    }
    bool have = m->snap != NULL;
    pthread_mutex_unlock(&m->lock);
    kvd_mhd_result r;
    if (healthz) {
        char body[32];
        int n = snprintf(body, sizeof(body), "%s\n", kvd_health_name(h));
        r = respond(conn, h == KVD_HEALTH_READY ? 200 : 503, "text/plain", body,
                    (size_t)n, MHD_RESPMEM_MUST_COPY);
    } else if (!have) {
        r = respond(conn, 503, "text/plain", "starting\n", 9, MHD_RESPMEM_PERSISTENT);
    } else if (rc != KVD_OK) {
        r = respond(conn, 500, "text/plain", "out of memory\n", 14,
                    MHD_RESPMEM_PERSISTENT);
    } else {
        r = respond(conn, 200, "text/plain; version=0.0.4", b.data, b.len,
                    MHD_RESPMEM_MUST_COPY);
    }
    kvd_buf_free(&b);
    return r;
}

/* Frees a snapshot handed over by kvd_metrics_publish. */
static void snap_free(kvd_msg_t *snap)
{
    if (snap == NULL)
        return;
    kvd_msg_clear(snap);
    kvd_mem_free(KVD_MEM_OTHER, snap, sizeof(*snap));
}

void kvd_metrics_publish(kvd_metrics_t *m, kvd_msg_t *snap)
{
    pthread_mutex_lock(&m->lock);
    kvd_msg_t *old = m->snap;
    m->snap = snap;
    pthread_mutex_unlock(&m->lock);
    snap_free(old);
}

int kvd_metrics_start(const char *host_port, kvd_metrics_t **out)
{
    char host[128], port_s[8];
    uint16_t port;
    if (kvd_parse_host_port(host_port, host, sizeof(host), &port) != KVD_OK)
        return KVD_ERR_INVALID;
    snprintf(port_s, sizeof(port_s), "%u", port);
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *res = NULL;
    if (getaddrinfo(host, port_s, &hints, &res) != 0) {
        KVD_ERROR("metrics", "--metrics-listen %s: cannot resolve", host_port);
        return KVD_ERR_INVALID;
    }
    kvd_metrics_t *m = kvd_mem_calloc(KVD_MEM_OTHER, 1, sizeof(*m));
    if (m == NULL) {
        freeaddrinfo(res);
        return KVD_ERR_NOMEM;
    }
    pthread_mutex_init(&m->lock, NULL);
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG;
    if (res->ai_family == AF_INET6)
        flags |= MHD_USE_IPv6;
    /* two threads: /healthz answers while a /metrics scrape renders */
    m->mhd = MHD_start_daemon(flags, port, NULL, NULL, handle, m, MHD_OPTION_SOCK_ADDR,
                              res->ai_addr, MHD_OPTION_CONNECTION_LIMIT, 64u,
                              MHD_OPTION_CONNECTION_TIMEOUT, 10u,
                              MHD_OPTION_THREAD_POOL_SIZE, 2u, MHD_OPTION_END);
    freeaddrinfo(res);
    if (m->mhd == NULL) {
        KVD_ERROR("metrics", "cannot serve metrics on %s (port in use?)", host_port);
        pthread_mutex_destroy(&m->lock);
        kvd_mem_free(KVD_MEM_OTHER, m, sizeof(*m));
        return KVD_ERR_IO;
    }
    KVD_INFO("metrics", "serving /metrics and /healthz on http://%s", host_port);
    *out = m;
    return KVD_OK;
}

void kvd_metrics_stop(kvd_metrics_t *m)
{
    if (m == NULL)
        return;
    MHD_stop_daemon(m->mhd);
    snap_free(m->snap);
    pthread_mutex_destroy(&m->lock);
    kvd_mem_free(KVD_MEM_OTHER, m, sizeof(*m));
}
