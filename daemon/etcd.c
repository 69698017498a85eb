/*
 * etcd.c - the etcd v3 gateway client (see etcd.h).
 *
 * Every call but the watch is one POST of a JSON body to /v3/<service>/<op>
 * on one easy handle that the client keeps (so the connection is reused),
 * tried on each endpoint in turn from the one that answered last, all of it
 * within the call's timeout. A watch is its own easy handle in its own multi
 * handle: the stream's lines (one JSON object each) are buffered until '\n'
 * and parsed as they come, and kvd_etcd_watch_poll waits on the multi
 * handle for at most its timeout.
 *
 * The gateway speaks protobuf's JSON mapping: bytes are base64, int64s are
 * strings, and a field at its default value (0, false, "", PUT) is left
 * out, so an absent number is 0. Whatever else does not have the expected
 * shape is KVD_ERR_PROTOCOL.
 *
 * Memory: the arrays of pairs and events, their keys and values and a
 * watch's line buffer are charged to KVD_MEM_OTHER; cJSON's and libcurl's
 * own allocations are not.
 *
 * Threading: a client and its watches belong to one thread at a time;
 * curl_global_init runs once per process (pthread_once).
 */
#include "etcd.h"

#include <cjson/cJSON.h>
#include <curl/curl.h>
#include <openssl/evp.h>

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ETCD_MAX_ENDPOINTS 16
#define ETCD_MAX_URL       256
/* A blocking call's reply and a watch's line are bounded: what kvdock keeps
 * in etcd is small, and a peer that streams without end must not grow us. */
#define ETCD_MAX_REPLY (16u << 20)
#define ETCD_MAX_LINE  (4u << 20)

struct kvd_etcd {
    char endpoints[ETCD_MAX_ENDPOINTS][ETCD_MAX_URL];
    int n_endpoints;
    int current; /* the endpoint that answered last: tried first */
    int timeout_ms;
    CURL *curl;
    struct curl_slist *headers;
    char err[512];
};

/* A growable byte buffer charged to KVD_MEM_OTHER. */
typedef struct etcd_buf {
    char *data;
    size_t len, cap, limit;
    bool overflow;
} etcd_buf_t;

struct kvd_etcd_watch {
    kvd_etcd_t *e;
    CURLM *multi;
    CURL *easy;
    etcd_buf_t line;
    kvd_etcd_event_t *pending; /* parsed, not yet handed out */
    size_t n_pending, cap_pending;
    int64_t revision;
    bool created;
    bool ended; /* the stream is over (closed, cancelled, or broken) */
    int end_status;
};

/* ------------------------------------------------------------- helpers */

static pthread_once_t etcd_curl_once = PTHREAD_ONCE_INIT;
static CURLcode etcd_curl_init_rc = CURLE_OK;

static void etcd_curl_init(void)
{
    etcd_curl_init_rc = curl_global_init(CURL_GLOBAL_DEFAULT);
}

static void etcd_set_err(kvd_etcd_t *e, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void etcd_set_err(kvd_etcd_t *e, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->err, sizeof(e->err), fmt, ap);
    va_end(ap);
}

/* Appends n bytes; false (and overflow set) past the limit or out of
 * memory. */
static bool etcd_buf_append(etcd_buf_t *b, const char *p, size_t n)
{
    if (b->len + n + 1 > b->limit) {
        b->overflow = true;
        return false;
    }
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n + 1)
            cap *= 2;
        if (cap > b->limit)
            cap = b->limit;
        char *d = kvd_mem_realloc(KVD_MEM_OTHER, b->data, b->cap, cap);
        if (!d) {
            b->overflow = true;
            return false;
        }
        b->data = d;
        b->cap = cap;
    }
    memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = '\0';
    return true;
}

static void etcd_buf_free(etcd_buf_t *b)
{
    kvd_mem_free(KVD_MEM_OTHER, b->data, b->cap);
    b->data = NULL;
    b->len = b->cap = 0;
}

static uint64_t etcd_now_ms(void)
{
    return kvd_now_ns() / 1000000u;
}

/* Base64 of n bytes, malloc'd, NUL-terminated; NULL when out of memory. */
static char *etcd_b64_encode(const char *p, size_t n)
{
    size_t out_len = 4 * ((n + 2) / 3) + 1;
    char *out = malloc(out_len);
    if (!out)
        return NULL;
    EVP_EncodeBlock((unsigned char *)out, (const unsigned char *)p, (int)n);
    return out;
}

/*
 * Decodes base64 text into a fresh buffer charged to KVD_MEM_OTHER (len + 1
 * bytes, NUL-terminated). EVP_DecodeBlock counts padding as zero bytes, so
 * the last quartet (the only one that may be padded) is decoded apart and
 * only its real bytes are kept. KVD_ERR_PROTOCOL for text not base64.
 */
static int etcd_b64_decode(const char *text, char **out, size_t *out_len)
{
    size_t n = strlen(text);
    if (n % 4 != 0 || n > INT32_MAX / 2)
        return KVD_ERR_PROTOCOL;
    size_t pad = n ? (text[n - 1] == '=') + (text[n - 2] == '=') : 0;
    size_t len = n / 4 * 3 - pad;
    char *buf = kvd_mem_calloc(KVD_MEM_OTHER, 1, len + 1);
    if (!buf)
        return KVD_ERR_NOMEM;
    bool ok = true;
    if (n > 4) {
        size_t head = (n - 4) / 4 * 3;
        ok = EVP_DecodeBlock((unsigned char *)buf, (const unsigned char *)text,
                             (int)(n - 4)) == (int)head;
        /* a '=' before the end is not base64 */
        ok = ok && !memchr(text, '=', n - 4);
    }
    if (ok && n >= 4) {
        unsigned char last[4];
        ok = EVP_DecodeBlock(last, (const unsigned char *)text + n - 4, 4) == 3;
        memcpy(buf + (n - 4) / 4 * 3, last, 3 - pad);
    }
    if (!ok) {
        kvd_mem_free(KVD_MEM_OTHER, buf, len + 1);
        return KVD_ERR_PROTOCOL;
    }
    buf[len] = '\0';
    *out = buf;
    *out_len = len;
    return KVD_OK;
}

/*
 * Reads an int64 field: the gateway sends them as strings, a number is taken
 * too, and an absent field is 0 (protobuf's default). KVD_ERR_PROTOCOL for
 * anything else.
 */
static int etcd_json_i64(const cJSON *obj, const char *name, int64_t *out)
{
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(obj, name);
    *out = 0;
    if (!f || cJSON_IsNull(f))
        return KVD_OK;
    if (cJSON_IsNumber(f)) {
        double d = f->valuedouble;
        if (d < -9.2e18 || d > 9.2e18)
            return KVD_ERR_PROTOCOL;
        *out = (int64_t)d;
        return KVD_OK;
    }
    if (!cJSON_IsString(f) || !f->valuestring || !f->valuestring[0])
        return KVD_ERR_PROTOCOL;
    char *end = NULL;
    errno = 0;
    long long v = strtoll(f->valuestring, &end, 10);
    if (errno || *end)
        return KVD_ERR_PROTOCOL;
    *out = v;
    return KVD_OK;
}

/* Adds an int64 field as the gateway wants it (a string). */
static bool etcd_json_add_i64(cJSON *obj, const char *name, int64_t v)
{
    char text[32];
    snprintf(text, sizeof(text), "%" PRId64, v);
    return cJSON_AddStringToObject(obj, name, text) != NULL;
}

/* Adds a bytes field (base64). */
static bool etcd_json_add_bytes(cJSON *obj, const char *name, const char *p, size_t n)
{
    char *b64 = etcd_b64_encode(p, n);
    if (!b64)
        return false;
    bool ok = cJSON_AddStringToObject(obj, name, b64) != NULL;
    free(b64);
    return ok;
}

/* The end of the range of every key that starts with prefix: the prefix
 * with its last byte that is not 0xff incremented (and what follows it cut);
 * "\0" (every key) when there is none. Writes into end (prefix_len bytes at
 * least, or 1). */
static size_t etcd_prefix_end(const char *prefix, size_t prefix_len, char *end)
{
    size_t n = prefix_len;
    while (n > 0 && (unsigned char)prefix[n - 1] == 0xff)
        n--;
    if (n == 0) {
        end[0] = '\0';
        return 1;
    }
    memcpy(end, prefix, n);
    end[n - 1] = (char)((unsigned char)end[n - 1] + 1);
    return n;
}

/* ------------------------------------------------------------- pairs */

static void etcd_kv_clear(kvd_etcd_kv_t *kv)
{
    if (kv->key)
        kvd_mem_free(KVD_MEM_OTHER, kv->key, kv->key_len + 1);
    if (kv->value)
        kvd_mem_free(KVD_MEM_OTHER, kv->value, kv->value_len + 1);
    memset(kv, 0, sizeof(*kv));
}

/* Fills kv from one mvccpb.KeyValue object. The key is required; the value
 * may be absent (empty). */
static int etcd_kv_parse(kvd_etcd_t *e, const cJSON *o, kvd_etcd_kv_t *kv)
{
    memset(kv, 0, sizeof(*kv));
    if (!cJSON_IsObject(o)) {
        etcd_set_err(e, "a key-value that is not an object");
        return KVD_ERR_PROTOCOL;
    }
    const cJSON *key = cJSON_GetObjectItemCaseSensitive(o, "key");
    const cJSON *value = cJSON_GetObjectItemCaseSensitive(o, "value");
    if (!cJSON_IsString(key) || (value && !cJSON_IsString(value))) {
        etcd_set_err(e, "a key-value without a key, or with a key or value not a string");
        return KVD_ERR_PROTOCOL;
    }
    int rc = etcd_b64_decode(key->valuestring, &kv->key, &kv->key_len);
    if (rc == KVD_OK)
        rc = etcd_b64_decode(value ? value->valuestring : "", &kv->value, &kv->value_len);
    if (rc == KVD_OK)
        rc = etcd_json_i64(o, "create_revision", &kv->create_revision);
    if (rc == KVD_OK)
        rc = etcd_json_i64(o, "mod_revision", &kv->mod_revision);
    if (rc == KVD_OK)
        rc = etcd_json_i64(o, "version", &kv->version);
    if (rc == KVD_OK)
        rc = etcd_json_i64(o, "lease", &kv->lease);
    if (rc != KVD_OK) {
        etcd_kv_clear(kv);
        if (rc == KVD_ERR_PROTOCOL)
            etcd_set_err(e, "a key-value with a field of the wrong form");
        else
            etcd_set_err(e, "out of memory");
    }
    return rc;
}

void kvd_etcd_kvs_free(kvd_etcd_kvs_t *kvs)
{
    if (!kvs)
        return;
    for (size_t i = 0; i < kvs->n; i++)
        etcd_kv_clear(&kvs->kv[i]);
    if (kvs->kv)
        kvd_mem_free(KVD_MEM_OTHER, kvs->kv, kvs->n * sizeof(*kvs->kv));
    memset(kvs, 0, sizeof(*kvs));
}

/* Fills out from a RangeResponse-shaped object: its "kvs" (absent: none);
 * the revision comes from header (the caller's). */
static int etcd_kvs_parse(kvd_etcd_t *e, const cJSON *range, int64_t revision,
                          kvd_etcd_kvs_t *out)
{
    memset(out, 0, sizeof(*out));
    out->revision = revision;
    const cJSON *kvs = cJSON_GetObjectItemCaseSensitive(range, "kvs");
    if (!kvs || cJSON_IsNull(kvs))
        return KVD_OK;
    if (!cJSON_IsArray(kvs)) {
        etcd_set_err(e, "\"kvs\" is not an array");
        return KVD_ERR_PROTOCOL;
    }
    size_t n = (size_t)cJSON_GetArraySize(kvs);
    if (n == 0)
        return KVD_OK;
    out->kv = kvd_mem_calloc(KVD_MEM_OTHER, n, sizeof(*out->kv));
    if (!out->kv) {
        etcd_set_err(e, "out of memory");
        return KVD_ERR_NOMEM;
    }
    const cJSON *item;
    cJSON_ArrayForEach(item, kvs)
    {
        int rc = etcd_kv_parse(e, item, &out->kv[out->n]);
        if (rc != KVD_OK) {
            /* free what was parsed, and the array at its full size */
            for (size_t i = 0; i < out->n; i++)
                etcd_kv_clear(&out->kv[i]);
            kvd_mem_free(KVD_MEM_OTHER, out->kv, n * sizeof(*out->kv));
            memset(out, 0, sizeof(*out));
            return rc;
        }
        out->n++;
    }
    return KVD_OK;
}

/* The "revision" of a reply's "header", which every kv reply has. */
static int etcd_header_revision(kvd_etcd_t *e, const cJSON *reply, int64_t *revision)
{
    const cJSON *h = cJSON_GetObjectItemCaseSensitive(reply, "header");
    if (!cJSON_IsObject(h) || etcd_json_i64(h, "revision", revision) != KVD_OK) {
        etcd_set_err(e, "a reply without a header or with a bad revision");
        return KVD_ERR_PROTOCOL;
    }
    return KVD_OK;
}

/* ---------------------------------------------------------- the client */

int kvd_etcd_create(const char *endpoints, int timeout_ms, kvd_etcd_t **out)
{
    if (!endpoints || !out || timeout_ms <= 0)
        return KVD_ERR_INVALID;
    pthread_once(&etcd_curl_once, etcd_curl_init);
    if (etcd_curl_init_rc != CURLE_OK)
        return KVD_ERR_UNSUPPORTED;
    kvd_etcd_t *e = kvd_mem_calloc(KVD_MEM_OTHER, 1, sizeof(*e));
    if (!e)
        return KVD_ERR_NOMEM;
    e->timeout_ms = timeout_ms;
    const char *p = endpoints;
    int rc = KVD_OK;
    while (rc == KVD_OK && *p) {
        while (*p == ' ' || *p == ',')
            p++;
        size_t n = strcspn(p, ", ");
        if (n == 0)
            break;
        while (n > 0 && p[n - 1] == '/')
            n--; /* "http://h:p/" is "http://h:p" */
        bool scheme = (n > 7 && strncmp(p, "http://", 7) == 0) ||
                      (n > 8 && strncmp(p, "https://", 8) == 0);
        if (!scheme || n >= ETCD_MAX_URL || e->n_endpoints == ETCD_MAX_ENDPOINTS) {
            rc = KVD_ERR_INVALID;
            break;
        }
        memcpy(e->endpoints[e->n_endpoints], p, n);
        e->endpoints[e->n_endpoints][n] = '\0';
        e->n_endpoints++;
        p += strcspn(p, ", ");
    }
    if (rc == KVD_OK && e->n_endpoints == 0)
        rc = KVD_ERR_INVALID;
    if (rc == KVD_OK) {
        e->curl = curl_easy_init();
        e->headers = curl_slist_append(NULL, "Content-Type: application/json");
        /* no "Expect: 100-continue" round trip before a larger body */
        struct curl_slist *h =
            e->headers ? curl_slist_append(e->headers, "Expect:") : NULL;
        if (h)
            e->headers = h;
        if (!e->curl || !h)
            rc = KVD_ERR_NOMEM;
    }
    if (rc != KVD_OK) {
        kvd_etcd_destroy(e);
        return rc;
    }
    *out = e;
    return KVD_OK;
}

void kvd_etcd_destroy(kvd_etcd_t *e)
{
    if (!e)
        return;
    if (e->curl)
        curl_easy_cleanup(e->curl);
    curl_slist_free_all(e->headers);
    kvd_mem_free(KVD_MEM_OTHER, e, sizeof(*e));
}

const char *kvd_etcd_error(const kvd_etcd_t *e)
{
    return e ? e->err : "";
}

const char *kvd_etcd_endpoint(const kvd_etcd_t *e)
{
    return e ? e->endpoints[e->current] : "";
}

static size_t etcd_write_reply(char *p, size_t size, size_t n, void *arg)
{
    etcd_buf_t *b = arg;
    return etcd_buf_append(b, p, size * n) ? size * n : 0;
}

/* The options every request has: no proxy, no signals, TCP keep-alive so
 * that a peer gone silent is noticed on a long stream. */
static void etcd_curl_common(CURL *c, const char *url, struct curl_slist *headers,
                             const char *body)
{
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_NOPROXY, "*");
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(c, CURLOPT_COPYPOSTFIELDS, body);
    curl_easy_setopt(c, CURLOPT_TCP_KEEPALIVE, 1L);
    curl_easy_setopt(c, CURLOPT_TCP_KEEPIDLE, 5L);
    curl_easy_setopt(c, CURLOPT_TCP_KEEPINTVL, 2L);
}

/* Maps a gateway error body ({"error", "message", "code": a gRPC code}) of
 * a 4xx reply to a status; its message goes to the error string. */
static int etcd_error_reply(kvd_etcd_t *e, const char *url, long http, const char *body)
{
    cJSON *j = cJSON_Parse(body);
    const cJSON *msg = j ? cJSON_GetObjectItemCaseSensitive(j, "message") : NULL;
    const cJSON *code = j ? cJSON_GetObjectItemCaseSensitive(j, "code") : NULL;
    int grpc = cJSON_IsNumber(code) ? code->valueint : -1;
    etcd_set_err(e, "%s: HTTP %ld: %.300s", url, http,
                 cJSON_IsString(msg) ? msg->valuestring : "(no message)");
    cJSON_Delete(j);
    switch (grpc) {
    case 3: /* InvalidArgument */
    case 11: /* OutOfRange */ return KVD_ERR_INVALID;
    case 5: /* NotFound: the lease is gone */ return KVD_ERR_NOT_FOUND;
    default: return KVD_ERR_PROTOCOL;
    }
}

/*
 * POSTs body to path on each endpoint in turn, from the one that answered
 * last, within the client's timeout. An endpoint that cannot be reached or
 * answers 5xx gives way to the next; any other answer ends the call. *reply
 * gets the parsed JSON of a 200 (the caller deletes it).
 */
static int etcd_call(kvd_etcd_t *e, const char *path, cJSON *req, cJSON **reply)
{
    *reply = NULL;
    char *body = req ? cJSON_PrintUnformatted(req) : NULL;
    if (!body) {
        etcd_set_err(e, "out of memory");
        return KVD_ERR_NOMEM;
    }
    uint64_t deadline = etcd_now_ms() + (uint64_t)e->timeout_ms;
    int rc = KVD_ERR_UNAVAILABLE;
    char url[ETCD_MAX_URL + 64];
    e->err[0] = '\0';
    for (int tried = 0; tried < e->n_endpoints; tried++) {
        uint64_t now = etcd_now_ms();
        if (now >= deadline) {
            if (!e->err[0])
                etcd_set_err(e, "%s: timed out", path);
            break;
        }
        int idx = (e->current + tried) % e->n_endpoints;
        snprintf(url, sizeof(url), "%s%s", e->endpoints[idx], path);
        long left = (long)(deadline - now);
        /* the connect of one endpoint may not take the time of the others */
        long connect = left / (e->n_endpoints - tried);
        etcd_buf_t b = {.limit = ETCD_MAX_REPLY};
        curl_easy_reset(e->curl);
        etcd_curl_common(e->curl, url, e->headers, body);
        curl_easy_setopt(e->curl, CURLOPT_TIMEOUT_MS, left > 0 ? left : 1L);
        curl_easy_setopt(e->curl, CURLOPT_CONNECTTIMEOUT_MS, connect > 0 ? connect : 1L);
        curl_easy_setopt(e->curl, CURLOPT_WRITEFUNCTION, etcd_write_reply);
        curl_easy_setopt(e->curl, CURLOPT_WRITEDATA, &b);
        CURLcode cc = curl_easy_perform(e->curl);
        long http = 0;
        curl_easy_getinfo(e->curl, CURLINFO_RESPONSE_CODE, &http);
        if (cc == CURLE_WRITE_ERROR && b.overflow) {
            etcd_set_err(e, "%s: a reply over %u bytes", url, ETCD_MAX_REPLY);
            etcd_buf_free(&b);
            rc = KVD_ERR_PROTOCOL;
            break;
        }
        if (cc != CURLE_OK || http >= 500 || http < 200) {
            if (cc != CURLE_OK)
                etcd_set_err(e, "%s: %s", url, curl_easy_strerror(cc));
            else
                etcd_set_err(e, "%s: HTTP %ld", url, http);
            etcd_buf_free(&b);
            continue;
        }
        e->current = idx;
        if (http != 200) {
            rc = etcd_error_reply(e, url, http, b.data ? b.data : "");
        } else {
            *reply = b.data ? cJSON_Parse(b.data) : NULL;
            if (!cJSON_IsObject(*reply)) {
                etcd_set_err(e, "%s: a reply that is not a JSON object", url);
                cJSON_Delete(*reply);
                *reply = NULL;
                rc = KVD_ERR_PROTOCOL;
            } else {
                rc = KVD_OK;
            }
        }
        etcd_buf_free(&b);
        break;
    }
    cJSON_free(body);
    return rc;
}

/* ---------------------------------------------------------------- leases */

int kvd_etcd_lease_grant(kvd_etcd_t *e, int ttl_s, int64_t *id, int *granted_ttl_s)
{
    if (!e || ttl_s <= 0 || !id)
        return KVD_ERR_INVALID;
    cJSON *req = cJSON_CreateObject(), *reply = NULL;
    if (!req || !etcd_json_add_i64(req, "TTL", ttl_s)) {
        cJSON_Delete(req);
        return KVD_ERR_NOMEM;
    }
    int rc = etcd_call(e, "/v3/lease/grant", req, &reply);
    cJSON_Delete(req);
    if (rc != KVD_OK)
        return rc;
    int64_t got_id = 0, got_ttl = 0;
    const cJSON *error = cJSON_GetObjectItemCaseSensitive(reply, "error");
    if (cJSON_IsString(error) && error->valuestring[0]) {
        etcd_set_err(e, "lease grant: %.300s", error->valuestring);
        rc = KVD_ERR_UNAVAILABLE;
    } else if (etcd_json_i64(reply, "ID", &got_id) != KVD_OK ||
               etcd_json_i64(reply, "TTL", &got_ttl) != KVD_OK || got_id == 0 ||
               got_ttl <= 0 || got_ttl > INT32_MAX) {
        etcd_set_err(e, "lease grant: a reply without an ID and a TTL");
        rc = KVD_ERR_PROTOCOL;
    } else {
        *id = got_id;
        if (granted_ttl_s)
            *granted_ttl_s = (int)got_ttl;
    }
    cJSON_Delete(reply);
    return rc;
}

/* A request of just {"ID": id}. */
static cJSON *etcd_id_request(int64_t id)
{
    cJSON *req = cJSON_CreateObject();
    if (req && !etcd_json_add_i64(req, "ID", id)) {
        cJSON_Delete(req);
        req = NULL;
    }
    return req;
}

int kvd_etcd_lease_keepalive(kvd_etcd_t *e, int64_t id, int *ttl_s)
{
    if (!e || id == 0)
        return KVD_ERR_INVALID;
    cJSON *req = etcd_id_request(id), *reply = NULL;
    if (!req)
        return KVD_ERR_NOMEM;
    /* a streaming call in gRPC; the gateway answers one POST with one
     * line {"result": LeaseKeepAliveResponse} or {"error": ...} */
    int rc = etcd_call(e, "/v3/lease/keepalive", req, &reply);
    cJSON_Delete(req);
    if (rc != KVD_OK)
        return rc;
    const cJSON *result = cJSON_GetObjectItemCaseSensitive(reply, "result");
    int64_t ttl = 0;
    if (!cJSON_IsObject(result)) {
        const cJSON *error = cJSON_GetObjectItemCaseSensitive(reply, "error");
        etcd_set_err(e, "lease keepalive: %s",
                     error ? "the gateway answered an error"
                           : "a reply without a result");
        rc = error ? KVD_ERR_UNAVAILABLE : KVD_ERR_PROTOCOL;
    } else if (etcd_json_i64(result, "TTL", &ttl) != KVD_OK || ttl > INT32_MAX) {
        etcd_set_err(e, "lease keepalive: a TTL of the wrong form");
        rc = KVD_ERR_PROTOCOL;
    } else if (ttl <= 0) {
        etcd_set_err(e, "lease %" PRId64 " has expired or was revoked", id);
        rc = KVD_ERR_NOT_FOUND;
    } else if (ttl_s) {
        *ttl_s = (int)ttl;
    }
    cJSON_Delete(reply);
    return rc;
}

int kvd_etcd_lease_revoke(kvd_etcd_t *e, int64_t id)
{
    if (!e || id == 0)
        return KVD_ERR_INVALID;
    cJSON *req = etcd_id_request(id), *reply = NULL;
    if (!req)
        return KVD_ERR_NOMEM;
    int rc = etcd_call(e, "/v3/lease/revoke", req, &reply);
    cJSON_Delete(req);
    int64_t revision;
    if (rc == KVD_OK)
        rc = etcd_header_revision(e, reply, &revision);
    cJSON_Delete(reply);
    return rc;
}

/* ------------------------------------------------------------------- kv */

/* {"key", "value", "lease"}: a PutRequest. */
static cJSON *etcd_put_request(const char *key, size_t key_len, const char *value,
                               size_t value_len, int64_t lease)
{
    cJSON *put = cJSON_CreateObject();
    if (!put || !etcd_json_add_bytes(put, "key", key, key_len) ||
        !etcd_json_add_bytes(put, "value", value, value_len) ||
        (lease != 0 && !etcd_json_add_i64(put, "lease", lease))) {
        cJSON_Delete(put);
        return NULL;
    }
    return put;
}

static bool etcd_key_ok(const char *key, size_t key_len)
{
    return key && key_len > 0;
}

int kvd_etcd_put(kvd_etcd_t *e, const char *key, size_t key_len, const char *value,
                 size_t value_len, int64_t lease, int64_t *revision)
{
    if (!e || !etcd_key_ok(key, key_len) || (!value && value_len))
        return KVD_ERR_INVALID;
    cJSON *req = etcd_put_request(key, key_len, value ? value : "", value_len, lease);
    cJSON *reply = NULL;
    if (!req)
        return KVD_ERR_NOMEM;
    int rc = etcd_call(e, "/v3/kv/put", req, &reply);
    cJSON_Delete(req);
    int64_t rev = 0;
    if (rc == KVD_OK)
        rc = etcd_header_revision(e, reply, &rev);
    if (rc == KVD_OK && revision)
        *revision = rev;
    cJSON_Delete(reply);
    return rc;
}

int kvd_etcd_cas(kvd_etcd_t *e, const char *key, size_t key_len,
                 int64_t expect_mod_revision, const char *value, size_t value_len,
                 int64_t lease, bool *done, kvd_etcd_kvs_t *current)
{
    if (!e || !etcd_key_ok(key, key_len) || (!value && value_len) || !done ||
        expect_mod_revision < 0)
        return KVD_ERR_INVALID;
    if (current)
        memset(current, 0, sizeof(*current)); /* freeable whatever happens */
    /* a key that does not exist has mod_revision 0 in a compare */
    cJSON *req = cJSON_CreateObject();
    cJSON *compare = cJSON_AddArrayToObject(req, "compare");
    cJSON *cmp = cJSON_CreateObject();
    cJSON_AddItemToArray(compare, cmp);
    cJSON_AddStringToObject(cmp, "target", "MOD");
    cJSON_AddStringToObject(cmp, "result", "EQUAL");
    etcd_json_add_bytes(cmp, "key", key, key_len);
    etcd_json_add_i64(cmp, "mod_revision", expect_mod_revision);
    cJSON *success = cJSON_AddArrayToObject(req, "success");
    cJSON *op = cJSON_CreateObject();
    cJSON_AddItemToArray(success, op);
    cJSON_AddItemToObject(
        op, "request_put",
        etcd_put_request(key, key_len, value ? value : "", value_len, lease));
    cJSON *failure = cJSON_AddArrayToObject(req, "failure");
    cJSON *fop = cJSON_CreateObject();
    cJSON_AddItemToArray(failure, fop);
    cJSON *range = cJSON_AddObjectToObject(fop, "request_range");
    etcd_json_add_bytes(range, "key", key, key_len);
    /* cJSON's adders take NULL and return NULL: one check at the end */
    if (!cJSON_GetObjectItemCaseSensitive(cmp, "mod_revision") ||
        !cJSON_GetObjectItemCaseSensitive(op, "request_put") ||
        !cJSON_GetObjectItemCaseSensitive(range, "key")) {
        cJSON_Delete(req);
        return KVD_ERR_NOMEM;
    }
    cJSON *reply = NULL;
    int rc = etcd_call(e, "/v3/kv/txn", req, &reply);
    cJSON_Delete(req);
    if (rc != KVD_OK)
        return rc;
    int64_t rev = 0;
    rc = etcd_header_revision(e, reply, &rev);
    const cJSON *succeeded = cJSON_GetObjectItemCaseSensitive(reply, "succeeded");
    if (rc == KVD_OK && succeeded && !cJSON_IsBool(succeeded)) {
        etcd_set_err(e, "txn: \"succeeded\" is not a boolean");
        rc = KVD_ERR_PROTOCOL;
    }
    if (rc == KVD_OK) {
        *done = cJSON_IsTrue(succeeded);
        if (!*done && current) {
            /* responses[0].response_range: the key as it is now */
            const cJSON *resp = cJSON_GetObjectItemCaseSensitive(reply, "responses");
            const cJSON *r0 = cJSON_IsArray(resp) ? cJSON_GetArrayItem(resp, 0) : NULL;
            const cJSON *rr = cJSON_GetObjectItemCaseSensitive(r0, "response_range");
            if (!cJSON_IsObject(rr)) {
                etcd_set_err(e, "txn: a failed compare without the range of the key");
                rc = KVD_ERR_PROTOCOL;
            } else {
                rc = etcd_kvs_parse(e, rr, rev, current);
            }
        }
    }
    cJSON_Delete(reply);
    return rc;
}

/* A range of [key, range_end) (range_end NULL: the one key). */
static int etcd_range(kvd_etcd_t *e, const char *key, size_t key_len,
                      const char *range_end, size_t end_len, kvd_etcd_kvs_t *out)
{
    cJSON *req = cJSON_CreateObject(), *reply = NULL;
    if (!req || !etcd_json_add_bytes(req, "key", key, key_len) ||
        (range_end && !etcd_json_add_bytes(req, "range_end", range_end, end_len))) {
        cJSON_Delete(req);
        return KVD_ERR_NOMEM;
    }
    int rc = etcd_call(e, "/v3/kv/range", req, &reply);
    cJSON_Delete(req);
    if (rc != KVD_OK)
        return rc;
    int64_t rev = 0;
    rc = etcd_header_revision(e, reply, &rev);
    if (rc == KVD_OK)
        rc = etcd_kvs_parse(e, reply, rev, out);
    cJSON_Delete(reply);
    return rc;
}

int kvd_etcd_get(kvd_etcd_t *e, const char *key, size_t key_len, kvd_etcd_kvs_t *out)
{
    if (!e || !etcd_key_ok(key, key_len) || !out)
        return KVD_ERR_INVALID;
    memset(out, 0, sizeof(*out));
    return etcd_range(e, key, key_len, NULL, 0, out);
}

int kvd_etcd_get_prefix(kvd_etcd_t *e, const char *prefix, size_t prefix_len,
                        kvd_etcd_kvs_t *out)
{
    if (!e || (!prefix && prefix_len) || !out)
        return KVD_ERR_INVALID;
    memset(out, 0, sizeof(*out));
    if (prefix_len == 0) /* every key: ["\0", "\0") in etcd's terms */
        return etcd_range(e, "", 1, "", 1, out);
    char *end = malloc(prefix_len);
    if (!end)
        return KVD_ERR_NOMEM;
    size_t end_len = etcd_prefix_end(prefix, prefix_len, end);
    int rc = etcd_range(e, prefix, prefix_len, end, end_len, out);
    free(end);
    return rc;
}

int kvd_etcd_delete(kvd_etcd_t *e, const char *key, size_t key_len, int64_t *deleted)
{
    if (!e || !etcd_key_ok(key, key_len))
        return KVD_ERR_INVALID;
    cJSON *req = cJSON_CreateObject(), *reply = NULL;
    if (!req || !etcd_json_add_bytes(req, "key", key, key_len)) {
        cJSON_Delete(req);
        return KVD_ERR_NOMEM;
    }
    int rc = etcd_call(e, "/v3/kv/deleterange", req, &reply);
    cJSON_Delete(req);
    int64_t rev = 0, n = 0;
    if (rc == KVD_OK)
        rc = etcd_header_revision(e, reply, &rev);
    if (rc == KVD_OK && (etcd_json_i64(reply, "deleted", &n) != KVD_OK || n < 0)) {
        etcd_set_err(e, "deleterange: \"deleted\" of the wrong form");
        rc = KVD_ERR_PROTOCOL;
    }
    if (rc == KVD_OK && deleted)
        *deleted = n;
    cJSON_Delete(reply);
    return rc;
}

/* ---------------------------------------------------------------- watch */

void kvd_etcd_events_free(kvd_etcd_event_t *events, size_t n)
{
    if (!events)
        return;
    for (size_t i = 0; i < n; i++)
        etcd_kv_clear(&events[i].kv);
    kvd_mem_free(KVD_MEM_OTHER, events, n * sizeof(*events));
}

/* Ends the watch with status (the first end wins). */
static void etcd_watch_end(kvd_etcd_watch_t *w, int status, const char *why)
{
    if (w->ended)
        return;
    w->ended = true;
    w->end_status = status;
    etcd_set_err(w->e, "watch: %s", why);
}

/* Appends the events of one WatchResponse to the pending ones. */
static int etcd_watch_events(kvd_etcd_watch_t *w, const cJSON *events)
{
    size_t k = (size_t)cJSON_GetArraySize(events);
    if (w->n_pending + k > w->cap_pending) {
        size_t cap = w->cap_pending ? w->cap_pending : 16;
        while (cap < w->n_pending + k)
            cap *= 2;
        kvd_etcd_event_t *p = kvd_mem_realloc(
            KVD_MEM_OTHER, w->pending, w->cap_pending * sizeof(*p), cap * sizeof(*p));
        if (!p)
            return KVD_ERR_NOMEM;
        w->pending = p;
        w->cap_pending = cap;
    }
    const cJSON *ev;
    cJSON_ArrayForEach(ev, events)
    {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(ev, "type");
        if (!cJSON_IsObject(ev) || (type && !cJSON_IsString(type)))
            return KVD_ERR_PROTOCOL;
        bool is_delete = type && strcmp(type->valuestring, "DELETE") == 0;
        if (type && !is_delete && strcmp(type->valuestring, "PUT") != 0)
            return KVD_ERR_PROTOCOL;
        kvd_etcd_event_t *out = &w->pending[w->n_pending];
        memset(out, 0, sizeof(*out));
        int rc =
            etcd_kv_parse(w->e, cJSON_GetObjectItemCaseSensitive(ev, "kv"), &out->kv);
        if (rc != KVD_OK)
            return rc;
        out->is_delete = is_delete;
        w->n_pending++;
        if (out->kv.mod_revision > w->revision)
            w->revision = out->kv.mod_revision;
    }
    return KVD_OK;
}

/*
 * One line of the stream: {"result": WatchResponse} or {"error": ...}. The
 * first result says "created"; one that says "canceled" ends the watch
 * (compacted start revision, or cancelled by etcd); one with neither events
 * nor either flag is a progress notification, whose header revision the
 * watch has seen up to. An events reply's header may be ahead of its last
 * event (etcd sends a catching-up watcher its events in batches), so only
 * the events move the revision there.
 */
static void etcd_watch_line(kvd_etcd_watch_t *w, const char *line)
{
    cJSON *j = cJSON_Parse(line);
    const cJSON *result = j ? cJSON_GetObjectItemCaseSensitive(j, "result") : NULL;
    if (!cJSON_IsObject(result)) {
        bool error = j && cJSON_GetObjectItemCaseSensitive(j, "error");
        if (error)
            etcd_watch_end(w, KVD_ERR_CLOSED,
                           "the gateway ended the stream with an error");
        else
            etcd_watch_end(w, KVD_ERR_PROTOCOL, "a line that is not {\"result\": ...}");
        cJSON_Delete(j);
        return;
    }
    const cJSON *h = cJSON_GetObjectItemCaseSensitive(result, "header");
    const cJSON *events = cJSON_GetObjectItemCaseSensitive(result, "events");
    int64_t header_rev = 0;
    if ((h &&
         (!cJSON_IsObject(h) || etcd_json_i64(h, "revision", &header_rev) != KVD_OK)) ||
        (events && !cJSON_IsArray(events))) {
        etcd_watch_end(w, KVD_ERR_PROTOCOL, "a reply with a bad header or events");
    } else if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(result, "canceled"))) {
        int64_t compact = 0;
        etcd_json_i64(result, "compact_revision", &compact);
        etcd_watch_end(w, KVD_ERR_CLOSED,
                       compact ? "cancelled: the start revision was compacted"
                               : "cancelled by etcd");
    } else if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(result, "created"))) {
        if (!w->created && w->revision < 0)
            w->revision = header_rev; /* started "now": from the header on */
        w->created = true;
    } else if (!w->created) {
        etcd_watch_end(w, KVD_ERR_PROTOCOL, "a reply before the watch was created");
    } else if (events && cJSON_GetArraySize(events) > 0) {
        int rc = etcd_watch_events(w, events);
        if (rc != KVD_OK)
            etcd_watch_end(w, rc,
                           rc == KVD_ERR_NOMEM ? "out of memory" : "a malformed event");
    } else if (header_rev > w->revision) {
        w->revision = header_rev;
    }
    cJSON_Delete(j);
}

/* The stream's bytes: complete lines are parsed at once, the rest kept. */
static size_t etcd_watch_write(char *p, size_t size, size_t n, void *arg)
{
    kvd_etcd_watch_t *w = arg;
    size_t total = size * n;
    if (w->ended)
        return 0;
    long http = 0;
    curl_easy_getinfo(w->easy, CURLINFO_RESPONSE_CODE, &http);
    if (http != 200) {
        etcd_watch_end(w, http >= 500 ? KVD_ERR_UNAVAILABLE : KVD_ERR_PROTOCOL,
                       "the gateway refused the watch");
        return 0;
    }
    if (!etcd_buf_append(&w->line, p, total)) {
        etcd_watch_end(w, KVD_ERR_PROTOCOL, "a line over 4 MiB, or out of memory");
        return 0;
    }
    char *start = w->line.data, *nl;
    while (!w->ended &&
           (nl = memchr(start, '\n', w->line.len - (size_t)(start - w->line.data)))) {
        *nl = '\0';
        if (nl > start)
            etcd_watch_line(w, start);
        start = nl + 1;
    }
    size_t rest = w->line.len - (size_t)(start - w->line.data);
    memmove(w->line.data, start, rest);
    w->line.len = rest;
    w->line.data[rest] = '\0';
    return w->ended ? 0 : total;
}

/* Runs the transfer without blocking; a finished transfer ends the watch. */
static void etcd_watch_pump(kvd_etcd_watch_t *w)
{
    int running = 0;
    if (curl_multi_perform(w->multi, &running) != CURLM_OK) {
        etcd_watch_end(w, KVD_ERR_CLOSED, "the transfer failed");
        return;
    }
    CURLMsg *m;
    int left;
    while ((m = curl_multi_info_read(w->multi, &left)))
        if (m->msg == CURLMSG_DONE) {
            /* what came after the last '\n' is the last line (or a torn
             * one, which then fails to parse) */
            if (!w->ended && w->line.len > 0) {
                etcd_watch_line(w, w->line.data);
                w->line.len = 0;
            }
            char why[300];
            snprintf(why, sizeof(why), "the stream ended (%s)",
                     curl_easy_strerror(m->data.result));
            etcd_watch_end(w, w->created ? KVD_ERR_CLOSED : KVD_ERR_UNAVAILABLE, why);
        }
    if (!running)
        etcd_watch_end(w, w->created ? KVD_ERR_CLOSED : KVD_ERR_UNAVAILABLE,
                       "the stream ended");
}

static void etcd_watch_free(kvd_etcd_watch_t *w)
{
    if (w->multi && w->easy)
        curl_multi_remove_handle(w->multi, w->easy);
    if (w->easy)
        curl_easy_cleanup(w->easy);
    if (w->multi)
        curl_multi_cleanup(w->multi);
    etcd_buf_free(&w->line);
    for (size_t i = 0; i < w->n_pending; i++)
        etcd_kv_clear(&w->pending[i].kv);
    if (w->pending)
        kvd_mem_free(KVD_MEM_OTHER, w->pending, w->cap_pending * sizeof(*w->pending));
    kvd_mem_free(KVD_MEM_OTHER, w, sizeof(*w));
}

/* Starts the watch's stream on one endpoint and waits, until deadline, for
 * the gateway to confirm it. */
static int etcd_watch_try(kvd_etcd_watch_t *w, const char *url, const char *body,
                          uint64_t deadline)
{
    w->multi = curl_multi_init();
    w->easy = curl_easy_init();
    if (!w->multi || !w->easy)
        return KVD_ERR_NOMEM;
    etcd_curl_common(w->easy, url, w->e->headers, body);
    long left = (long)(deadline - etcd_now_ms());
    curl_easy_setopt(w->easy, CURLOPT_CONNECTTIMEOUT_MS, left > 0 ? left : 1L);
    curl_easy_setopt(w->easy, CURLOPT_WRITEFUNCTION, etcd_watch_write);
    curl_easy_setopt(w->easy, CURLOPT_WRITEDATA, w);
    if (curl_multi_add_handle(w->multi, w->easy) != CURLM_OK)
        return KVD_ERR_NOMEM;
    for (;;) {
        etcd_watch_pump(w);
        if (w->created || w->ended)
            break;
        uint64_t now = etcd_now_ms();
        if (now >= deadline) {
            etcd_watch_end(w, KVD_ERR_UNAVAILABLE, "no confirmation within the timeout");
            break;
        }
        curl_multi_poll(w->multi, NULL, 0, (int)(deadline - now), NULL);
    }
    /* a watch created and at once cancelled (compacted) still starts: its
     * first poll says so */
    return w->created ? KVD_OK : w->end_status;
}

int kvd_etcd_watch_start(kvd_etcd_t *e, const char *prefix, size_t prefix_len,
                         int64_t start_revision, kvd_etcd_watch_t **out)
{
    if (!e || (!prefix && prefix_len) || !out)
        return KVD_ERR_INVALID;
    cJSON *req = cJSON_CreateObject();
    cJSON *create = cJSON_AddObjectToObject(req, "create_request");
    char *end = malloc(prefix_len ? prefix_len : 1);
    size_t end_len = prefix_len ? etcd_prefix_end(prefix, prefix_len, end) : 1;
    if (end && !prefix_len)
        end[0] = '\0';
    bool ok = create && end &&
              etcd_json_add_bytes(create, "key", prefix_len ? prefix : "",
                                  prefix_len ? prefix_len : 1) &&
              etcd_json_add_bytes(create, "range_end", end, end_len) &&
              (start_revision <= 0 ||
               etcd_json_add_i64(create, "start_revision", start_revision)) &&
              cJSON_AddTrueToObject(create, "progress_notify");
    free(end);
    char *body = ok ? cJSON_PrintUnformatted(req) : NULL;
    cJSON_Delete(req);
    if (!body)
        return KVD_ERR_NOMEM;
    uint64_t deadline = etcd_now_ms() + (uint64_t)e->timeout_ms;
    int rc = KVD_ERR_UNAVAILABLE;
    e->err[0] = '\0';
    char url[ETCD_MAX_URL + 64];
    for (int tried = 0; tried < e->n_endpoints && etcd_now_ms() < deadline; tried++) {
        int idx = (e->current + tried) % e->n_endpoints;
        snprintf(url, sizeof(url), "%s/v3/watch", e->endpoints[idx]);
        kvd_etcd_watch_t *w = kvd_mem_calloc(KVD_MEM_OTHER, 1, sizeof(*w));
        if (!w) {
            rc = KVD_ERR_NOMEM;
            break;
        }
        w->e = e;
        w->line.limit = ETCD_MAX_LINE;
        w->revision = start_revision > 0 ? start_revision - 1 : -1;
        rc = etcd_watch_try(w, url, body, deadline);
        if (rc == KVD_OK) {
            e->current = idx;
            *out = w;
            break;
        }
        if (!e->err[0])
            etcd_set_err(e, "%s: the watch could not start", url);
        etcd_watch_free(w);
        if (rc != KVD_ERR_UNAVAILABLE)
            break; /* an endpoint answered, with something else */
    }
    cJSON_free(body);
    return rc;
}

int kvd_etcd_watch_poll(kvd_etcd_watch_t *w, int timeout_ms, kvd_etcd_event_t **events,
                        size_t *n)
{
    if (!w || !events || !n)
        return KVD_ERR_INVALID;
    *events = NULL;
    *n = 0;
    uint64_t deadline = etcd_now_ms() + (uint64_t)(timeout_ms > 0 ? timeout_ms : 0);
    for (;;) {
        if (!w->ended)
            etcd_watch_pump(w);
        if (w->n_pending > 0 || w->ended)
            break;
        uint64_t now = etcd_now_ms();
        if (now >= deadline)
            break;
        curl_multi_poll(w->multi, NULL, 0, (int)(deadline - now), NULL);
    }
    if (w->n_pending > 0) {
        /* hand the array out at its exact size (the size it is freed with) */
        kvd_etcd_event_t *p =
            kvd_mem_realloc(KVD_MEM_OTHER, w->pending, w->cap_pending * sizeof(*p),
                            w->n_pending * sizeof(*p));
        if (!p)
            return KVD_ERR_NOMEM; /* kept: the next poll tries again */
        *events = p;
        *n = w->n_pending;
        w->pending = NULL;
        w->n_pending = w->cap_pending = 0;
    }
    return w->ended
               ? (w->end_status == KVD_ERR_UNAVAILABLE ? KVD_ERR_CLOSED : w->end_status)
               : KVD_OK;
}

int64_t kvd_etcd_watch_revision(const kvd_etcd_watch_t *w)
{
    return w ? (w->revision > 0 ? w->revision : 0) : 0;
}

void kvd_etcd_watch_stop(kvd_etcd_watch_t *w)
{
    if (w)
        etcd_watch_free(w);
}
