/*
 * store_client.c - libkvdock's store client (kvdock.h, "store client"): a
 * daemon's health, statistics, stored prefixes and lookups by namespace
 * name for operators and tests, the last three as JSON texts.
 *
 * It runs the CLI's code, not a copy of it: proto/'s kvd_client_open
 * (connect and Hello), kvd_list_fetch (the paged ListPrefixes),
 * kvd_lookup_named and the kvd_json_* writers, here into an
 * open_memstream. What is this file's own: one connection kept across
 * calls and opened again when the daemon closed it or a call failed on
 * it, and one deadline per public call that every wait of the call
 * shares (the lock, the reconnection, each RPC).
 *
 * Threading: `mu` serialises the calls on one handle; nothing else is
 * shared. It uses none of the linker's state or locks.
 */
#include "linker_int.h" /* lk_set_last_error: kvd_last_error's reason */

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

_Static_assert(KVD_PAGE_KEY_BYTES == KVD_KEY_BYTES, "a page key is a store key");
_Static_assert(KVD_MAX_POOLS == KVD_LOOKUP_POOLS_MAX, "one lookup: as many pools");

/* What kvd_store_prefixes_json lists when the caller says 0. */
#define STORE_PREFIXES_DEFAULT 100

struct kvd_store {
    pthread_mutex_t mu; /* one call at a time; guards what follows */
    char socket_path[108];
    char connect[256]; /* "" over the Unix socket */
    char client_name[KVD_NAME_MAX];
    uint8_t token[KVD_TOKEN_MAX]; /* sent in every Hello; none: len 0 */
    size_t token_len;
    int timeout_ms;
    kvd_client_t *client; /* NULL: (re)connect at the next RPC */
    uint64_t deadline;    /* of the public call in progress (kvd_now_ns) */
};

/* Records why the call fails (kvd_last_error: the first reason of a call
 * stays) and returns rc. */
static int store_fail(int rc, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int store_fail(int rc, const char *fmt, ...)
{
    char why[KVD_ERROR_MAX + 128];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof(why), fmt, ap);
    va_end(ap);
    lk_set_last_error("%s", why);
    return rc;
}

/* Milliseconds left until the deadline, rounded up; 0 once passed. */
static int ms_left(uint64_t deadline)
{
    uint64_t now = kvd_now_ns();
    return now < deadline ? (int)((deadline - now + 999999) / 1000000) : 0;
}

/* The connection for the next RPC: the one kept, unless the daemon ended
 * it; else a new one (connect and Hello) within the call's deadline. */
static int store_connect(kvd_store_t *s)
{
    if (s->client != NULL && !kvd_client_ended(s->client))
        return KVD_OK;
    kvd_client_close(s->client);
    s->client = NULL;
    bool refused;
    const char *where = s->connect[0] ? s->connect : s->socket_path;
    int rc = kvd_client_open(s->socket_path, s->connect[0] ? s->connect : NULL,
                             s->client_name, s->token, s->token_len, ms_left(s->deadline),
                             &s->client, &refused);
    if (rc != KVD_OK)
        return store_fail(rc,
                          refused ? "kvdockd at %s refused the Hello"
                                  : "cannot reach kvdockd at %s",
                          where);
    return KVD_OK;
}

/* One RPC of the call in progress (a kvd_call_fn; ctx: the handle). A
 * transport failure drops the connection: the next RPC opens another. */
static int store_call(void *ctx, kvd_msg_t *req, kvd_msg_t *rep)
{
    kvd_store_t *s = ctx;
    memset(rep, 0, sizeof(*rep));
    int rc = store_connect(s);
    if (rc != KVD_OK)
        return rc;
    rc = kvd_client_call_many_until(s->client, req, rep, 1, s->deadline);
    if (rc != KVD_OK) {
        kvd_client_close(s->client);
        s->client = NULL;
        return store_fail(rc, "%s call failed", kvd_method_name(req->method));
    }
    if (rep->status != KVD_OK)
        return store_fail(rep->status, "%s: %s", kvd_method_name(req->method),
                          rep->error[0] ? rep->error : kvd_status_str(rep->status));
    return KVD_OK;
}

/* Starts a public call: its deadline, then the handle's lock by then. */
static int store_begin(kvd_store_t *s)
{
    uint64_t deadline = kvd_now_ns() + (uint64_t)s->timeout_ms * 1000000ull;
    if (!kvd_mutex_lock_until(&s->mu, deadline))
        return store_fail(KVD_ERR_TIMEOUT, "another call on this store client ran on");
    s->deadline = deadline;
    return KVD_OK;
}

static void store_end(kvd_store_t *s)
{
    pthread_mutex_unlock(&s->mu);
}

/* Copies a caller's string into a buffer of cap bytes: KVD_ERR_INVALID
 * when it does not fit. */
static int copy_arg(char *dst, size_t cap, const char *src, const char *what)
{
    if (strlen(src) >= cap)
        return store_fail(KVD_ERR_INVALID, "%s is over %zu bytes", what, cap - 1);
    kvd_strlcpy(dst, src, cap);
    return KVD_OK;
}

/* Takes the configuration's strings and reads the credential into s. */
static int store_configure(kvd_store_t *s, const kvd_store_config_t *cfg)
{
    int rc = KVD_OK;
    if (cfg->socket_path)
        rc = copy_arg(s->socket_path, sizeof(s->socket_path), cfg->socket_path,
                      "socket_path");
    else
        kvd_default_socket_path("default", s->socket_path, sizeof(s->socket_path));
    if (rc == KVD_OK && cfg->connect)
        rc = copy_arg(s->connect, sizeof(s->connect), cfg->connect, "connect");
    if (rc == KVD_OK)
        kvd_strlcpy(s->client_name, cfg->client_name ? cfg->client_name : "kvdock-client",
                    sizeof(s->client_name));
    s->timeout_ms = cfg->timeout_ms > 0 ? cfg->timeout_ms : 5000;
    char why[512];
    if (rc == KVD_OK) {
        rc = kvd_client_token_read(cfg->auth_token_file, s->token, sizeof(s->token),
                                   &s->token_len, why, sizeof(why));
        if (rc != KVD_OK)
            store_fail(rc, "auth_token_file: %s", why);
    }
    return rc;
}

/* Frees s and what it holds (kvd_store_close without its clearing). */
static void store_free(kvd_store_t *s)
{
    kvd_client_close(s->client);
    pthread_mutex_destroy(&s->mu);
    explicit_bzero(s->token, sizeof(s->token));
    free(s);
}

KVD_API int kvd_store_open(const kvd_store_config_t *config, kvd_store_t **out)
{
    static const kvd_store_config_t defaults = {0};
    lk_clear_last_error();
    if (out == NULL)
        return store_fail(KVD_ERR_INVALID, "kvd_store_open: out is NULL");
    kvd_store_t *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return store_fail(KVD_ERR_NOMEM, "kvd_store_open");
    pthread_mutex_init(&s->mu, NULL);
    int rc = store_configure(s, config ? config : &defaults);
    if (rc == KVD_OK && (rc = store_begin(s)) == KVD_OK) {
        rc = store_connect(s);
        store_end(s);
    }
    if (rc != KVD_OK) {
        store_free(s);
        return rc;
    }
    *out = s;
    return KVD_OK;
}

KVD_API void kvd_store_close(kvd_store_t *s)
{
    lk_clear_last_error();
    if (s != NULL)
        store_free(s);
}

KVD_API void kvd_free(void *p)
{
    /* a plain helper: this thread's kvd_last_error stays */
    free(p);
}

KVD_API int kvd_store_health(kvd_store_t *s, kvd_linker_health_t *state,
                             uint64_t *pool_bytes)
{
    lk_clear_last_error();
    if (s == NULL)
        return store_fail(KVD_ERR_INVALID, "kvd_store_health: no store client");
    int rc = store_begin(s);
    if (rc != KVD_OK)
        return rc;
    kvd_msg_t req, rep;
    kvd_msg_request(&req, 0, KVD_METHOD_HEALTH);
    rc = store_call(s, &req, &rep);
    if (rc == KVD_OK && state)
        *state = (kvd_linker_health_t)rep.body.health_rep.state;
    if (rc == KVD_OK && pool_bytes)
        *pool_bytes = rep.body.health_rep.pool_bytes;
    kvd_msg_clear(&rep);
    store_end(s);
    return rc;
}

/* ------------------------------------------------------------ JSON texts */

/* A JSON text being written: kvd_json_* write into f, which fills text. */
typedef struct json_out {
    FILE *f;
    char *text;
    size_t len;
} json_out_t;

static int json_begin(json_out_t *j)
{
    j->text = NULL;
    j->f = open_memstream(&j->text, &j->len);
    return j->f ? KVD_OK : store_fail(KVD_ERR_NOMEM, "open_memstream");
}

/* Ends the text begun by json_begin after kvd_json_* returned rc: hands
 * it to *json on success, frees it otherwise. */
static int json_end(json_out_t *j, int rc, char **json)
{
    if (fclose(j->f) != 0 && rc == KVD_OK)
        rc = KVD_ERR_NOMEM;
    if (rc == KVD_ERR_IO || (rc == KVD_OK && j->text == NULL))
        rc = KVD_ERR_NOMEM; /* a memory stream fails only for want of memory */
    if (rc != KVD_OK) {
        free(j->text);
        return store_fail(rc, "writing the JSON text");
    }
    *json = j->text;
    return KVD_OK;
}

KVD_API int kvd_store_stats_json(kvd_store_t *s, char **json)
{
    lk_clear_last_error();
    if (s == NULL || json == NULL)
        return store_fail(KVD_ERR_INVALID, "kvd_store_stats_json: NULL argument");
    /* a Stats reply is a few KiB: off the caller's stack */
    kvd_msg_t *req = calloc(2, sizeof(kvd_msg_t)), *rep = req + 1;
    if (req == NULL)
        return store_fail(KVD_ERR_NOMEM, "kvd_store_stats_json");
    kvd_msg_request(req, 0, KVD_METHOD_STATS);
    int rc = store_begin(s);
    if (rc == KVD_OK) {
        rc = store_call(s, req, rep);
        store_end(s);
    }
    json_out_t j;
    if (rc == KVD_OK && (rc = json_begin(&j)) == KVD_OK)
        rc = json_end(&j, kvd_json_stats(j.f, &rep->body.stats_rep), json);
    kvd_msg_clear(rep);
    free(req);
    return rc;
}

KVD_API int kvd_store_prefixes_json(kvd_store_t *s, const char *ns_name, size_t limit,
                                    char **json)
{
    lk_clear_last_error();
    if (s == NULL || json == NULL)
        return store_fail(KVD_ERR_INVALID, "kvd_store_prefixes_json: NULL argument");
    if (ns_name != NULL && strlen(ns_name) >= KVD_NS_NAME_BYTES)
        return store_fail(KVD_ERR_INVALID, "a namespace name is at most %d bytes",
                          KVD_NS_NAME_BYTES - 1);
    int rc = store_begin(s);
    if (rc != KVD_OK)
        return rc;
    kvd_list_pages_t pages;
    rc = kvd_list_fetch(store_call, s, ns_name, false,
                        limit ? (uint64_t)limit : STORE_PREFIXES_DEFAULT, &pages);
    store_end(s);
    if (rc == KVD_ERR_NOMEM)
        store_fail(rc, "listing the prefixes");
    json_out_t j;
    if (rc == KVD_OK && (rc = json_begin(&j)) == KVD_OK)
        rc = json_end(&j, kvd_json_list(j.f, &pages.all), json);
    kvd_list_pages_free(&pages);
    return rc;
}

/* Whether the arguments of a lookup can make one. */
static int lookup_args_check(const char *const *ns_names, size_t n_ns,
                             const uint8_t (*keys)[KVD_PAGE_KEY_BYTES], size_t n_keys)
{
    if (ns_names == NULL || n_ns == 0 || n_ns > KVD_MAX_POOLS)
        return store_fail(KVD_ERR_INVALID, "a lookup names 1 to %d namespaces",
                          KVD_MAX_POOLS);
    if (keys == NULL || n_keys == 0)
        return store_fail(KVD_ERR_INVALID, "a lookup needs at least one key");
    for (size_t i = 0; i < n_ns; i++)
        if (ns_names[i] == NULL)
            return store_fail(KVD_ERR_INVALID, "namespace name %zu is NULL", i);
    return KVD_OK;
}

KVD_API int kvd_store_lookup_json(kvd_store_t *s, const char *const *ns_names,
                                  const uint32_t *trailing, size_t n_ns,
                                  const uint8_t (*keys)[KVD_PAGE_KEY_BYTES],
                                  size_t n_keys, char **json)
{
    lk_clear_last_error();
    if (s == NULL || json == NULL)
        return store_fail(KVD_ERR_INVALID, "kvd_store_lookup_json: NULL argument");
    int rc = lookup_args_check(ns_names, n_ns, keys, n_keys);
    if (rc != KVD_OK || (rc = store_begin(s)) != KVD_OK)
        return rc;
    kvd_msg_t rep;
    size_t unknown;
    rc = kvd_lookup_named(store_call, s, ns_names, trailing, n_ns,
                          (const kvd_key_t *)keys, n_keys, &rep, &unknown);
    store_end(s);
    if (rc == KVD_ERR_NOT_FOUND && unknown < n_ns)
        store_fail(rc, "unknown namespace '%s'", ns_names[unknown]);
    json_out_t j;
    if (rc == KVD_OK && (rc = json_begin(&j)) == KVD_OK)
        rc = json_end(&j, kvd_json_lookup(j.f, &rep.body.lookup_rep), json);
    kvd_msg_clear(&rep);
    return rc;
}
