/*
 * Description: libkvdock's store client (kvdock.h, "store client")
 * against a live kvdockd (64 MiB pool) in which a linker offloaded, in
 * pool "kv" (model "sclient"), a chain A of 4 pages and a chain B of 2
 * pages, and in pool "swa" the pages A[1] and A[3] only:
 *   health: READY and the 64 MiB pool; either output may be NULL.
 *   stats: valid JSON; memory.pool_bytes is the pool; state ready; the kv
 *     namespace is listed with the object size of its layout (K and V
 *     rows of a page) and 6 objects ready.
 *   prefixes: valid JSON; the kv namespace holds two prefixes, A (root
 *     A[0], leaf A[3], 4 pages) and B (2 pages), each of pages x object
 *     bytes; limit 1 gives one entry, truncated; a namespace filter keeps
 *     only its own; an unknown namespace is KVD_ERR_NOT_FOUND; the text is
 *     `kvdock prefixes --json`'s, byte for byte.
 *   lookup: every boundary by the hit policies (DESIGN.md section 5): A's
 *     keys 1..4; a missing page 3 cuts ALL_PAGES at 2 while
 *     TRAILING_PAGES(1) still reaches 4; kv + swa(1) meet at 2 and 4;
 *     unknown keys none; the text is `kvdock lookup --json`'s; an unknown
 *     namespace is KVD_ERR_NOT_FOUND with nothing handed out.
 *   kvd_last_error: the reason of a failed call (the daemon's text naming
 *     the namespace, the unknown namespace of a lookup, the path nobody
 *     listens on, the refused Hello, the token file), "" after a success.
 *   errors: no daemon: KVD_ERR_UNAVAILABLE; NULL outputs, no namespace or
 *     key, 17 namespaces, a socket path too long: KVD_ERR_INVALID;
 *     kvd_free(NULL) is fine.
 *   auth: a daemon that lets no uid of ours in (--allow-uid 4242) but takes
 *     a token: the right --auth-token-file opens, a wrong one is
 *     KVD_ERR_AUTH, a missing file KVD_ERR_NOT_FOUND, none KVD_ERR_AUTH,
 *     $KVDOCK_AUTH_TOKEN_FILE stands in for the field; after that daemon is
 *     killed and another (same flags) starts on its socket, the open client
 *     answers the next call: it reconnects, with its token.
 */
#include "dtest.h"
#include "harness.h"
#include "kvdock.h"
#include "ltest.h"

#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#define PS     4  /* tokens per page */
#define BPR    32 /* bytes per row of K and of V */
#define ROWS   64
#define A_LEN  4               /* pages of chain A */
#define B_LEN  2               /* pages of chain B */
#define OBJECT (2u * PS * BPR) /* one page's K and V rows */

typedef uint8_t page_key_t[KVD_PAGE_KEY_BYTES];

static struct {
    kvd_test_daemon_t d;
    kvd_linker_t *l;
    char kv_ns[256], swa_ns[256];
    page_key_t a[A_LEN], b[B_LEN];
    uint8_t k[ROWS * BPR], v[ROWS * BPR], sk[ROWS * BPR], sv[ROWS * BPR];
} g;

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static void hex(const uint8_t *key, char out[65])
{
    for (int i = 0; i < KVD_PAGE_KEY_BYTES; i++)
        snprintf(out + 2 * i, 3, "%02x", key[i]);
}

static int count_of(const char *s, const char *needle)
{
    int n = 0;
    for (const char *p = strstr(s, needle); p; p = strstr(p + 1, needle))
        n++;
    return n;
}

static kvd_store_t *open_store(void)
{
    kvd_store_config_t cfg = {.socket_path = g.d.socket, .timeout_ms = 10000};
    kvd_store_t *s = NULL;
    assert_int_equal(kvd_store_open(&cfg, &s), KVD_OK);
    assert_non_null(s);
    return s;
}

/* Offloads transfer t and waits (bounded) for its success. */
static int offload(const kvd_transfer_t *t)
{
    uint64_t ack = 0;
    int rc = kvd_offload(g.l, t, 1, &ack);
    if (rc != KVD_OK)
        return rc;
    return lt_wait_done(g.l, false, ack, 20000) ? KVD_OK : KVD_ERR_IO;
}

/* Offloads a whole chain of n pages into the kv pool. */
static int offload_chain(uint32_t pool, page_key_t *keys, size_t n)
{
    int64_t idx[A_LEN * PS];
    for (size_t i = 0; i < n * PS; i++)
        idx[i] = (int64_t)i;
    kvd_transfer_t t = {.pool_id = pool,
                        .keys = (const uint8_t(*)[KVD_PAGE_KEY_BYTES])keys,
                        .n_keys = n,
                        .device_indices = idx,
                        .n_indices = n * PS};
    return offload(&t);
}

/* Offloads page i of chain A alone into the swa pool. */
static int offload_swa_page(uint32_t pool, size_t i)
{
    int64_t idx[PS];
    for (size_t j = 0; j < PS; j++)
        idx[j] = (int64_t)j;
    kvd_transfer_t t = {.pool_id = pool,
                        .keys = (const uint8_t(*)[KVD_PAGE_KEY_BYTES])g.a[i],
                        .n_keys = 1,
                        .device_indices = idx,
                        .n_indices = PS,
                        .first_depth = (uint32_t)i,
                        .prior_key = i ? g.a[i - 1] : NULL};
    return offload(&t);
}

static int chain(uint32_t first_token, page_key_t *keys, size_t n)
{
    uint32_t tokens[A_LEN * PS];
    for (size_t i = 0; i < n * PS; i++)
        tokens[i] = first_token + (uint32_t)i;
    size_t got = 0;
    int rc = kvd_page_keys(tokens, n * PS, PS, NULL, keys, &got);
    return rc == KVD_OK && got == n ? KVD_OK : KVD_ERR_INVALID;
}

static int setup(void **state)
{
    (void)state;
    unsetenv("KVDOCK_AUTH_TOKEN_FILE");
    if (dt_start(&g.d, NULL) != 0)
        return -1;
    kvd_linker_config_t cfg = {
        .socket_path = g.d.socket, .model_id = "sclient", .timeout_ms = 10000};
    uint32_t kv = 0, swa = 0;
    int rc = kvd_linker_open(&cfg, &g.l);
    if (rc == KVD_OK)
        rc = lt_register_kv(g.l, "kv", g.k, g.v, BPR, PS, ROWS, NULL, &kv);
    if (rc == KVD_OK)
        rc = lt_register_kv(g.l, "swa", g.sk, g.sv, BPR, PS, ROWS, NULL, &swa);
    if (rc == KVD_OK)
        rc = kvd_pool_info(g.l, kv, NULL, g.kv_ns, sizeof(g.kv_ns));
    if (rc == KVD_OK)
        rc = kvd_pool_info(g.l, swa, NULL, g.swa_ns, sizeof(g.swa_ns));
    if (rc == KVD_OK)
        rc = chain(1000, g.a, A_LEN);
    if (rc == KVD_OK)
        rc = chain(2000, g.b, B_LEN);
    if (rc == KVD_OK)
        rc = offload_chain(kv, g.a, A_LEN);
    if (rc == KVD_OK)
        rc = offload_chain(kv, g.b, B_LEN);
    if (rc == KVD_OK)
        rc = offload_swa_page(swa, 1);
    if (rc == KVD_OK)
        rc = offload_swa_page(swa, 3);
    if (rc != KVD_OK)
        fprintf(stderr, "setup: %s\n", kvd_strerror(rc));
    return rc == KVD_OK ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    kvd_linker_close(g.l);
    return dt_stop(&g.d, SIGTERM, 10000) == 0 ? 0 : -1;
}

/* ---------------------------------------------------------------- health */

static void test_health(void **state)
{
    (void)state;
    kvd_store_t *s = open_store();
    kvd_linker_health_t h = 0;
    uint64_t pool = 0;
    assert_int_equal(kvd_store_health(s, &h, &pool), KVD_OK);
    assert_int_equal(h, KVD_LINKER_HEALTH_READY);
    assert_int_equal(pool, DT_POOL_BYTES);
    assert_int_equal(kvd_store_health(s, NULL, NULL), KVD_OK);
    kvd_store_close(s);
}

/* ----------------------------------------------------------------- stats */

static void test_stats_json(void **state)
{
    (void)state;
    kvd_store_t *s = open_store();
    char *json = NULL;
    assert_int_equal(kvd_store_stats_json(s, &json), KVD_OK);
    assert_non_null(json);
    assert_true(dt_json_valid(json));
    uint64_t v = 0;
    assert_true(dt_json_u64(json, "\"memory\":", "pool_bytes", &v));
    assert_int_equal(v, DT_POOL_BYTES);
    assert_non_null(strstr(json, "\"state\":\"ready\""));
    char name[300];
    snprintf(name, sizeof(name), "\"name\":\"%s\"", g.kv_ns);
    assert_true(dt_json_u64(json, name, "object_bytes", &v));
    assert_int_equal(v, OBJECT);
    assert_true(dt_json_u64(json, name, "objects_ready", &v));
    assert_int_equal(v, A_LEN + B_LEN);
    kvd_free(json);
    kvd_store_close(s);
}

/* -------------------------------------------------------------- prefixes */

/* `"namespace":"NS","root":` : how a prefix entry (not a pool's) begins. */
static void prefix_of(const char *ns, char *out, size_t len)
{
    snprintf(out, len, "\"namespace\":\"%s\",\"root\":", ns);
}

static void test_prefixes_json(void **state)
{
    (void)state;
    kvd_store_t *s = open_store();
    char *json = NULL, at[512], root[65], leaf[65], kv_entry[300];
    assert_int_equal(kvd_store_prefixes_json(s, NULL, 0, &json), KVD_OK);
    assert_true(dt_json_valid(json));
    assert_non_null(strstr(json, "\"truncated\":false"));
    prefix_of(g.kv_ns, kv_entry, sizeof(kv_entry));
    assert_int_equal(count_of(json, kv_entry), 2);
    /* chain A: from its first page to its last */
    hex(g.a[0], root);
    hex(g.a[A_LEN - 1], leaf);
    snprintf(at, sizeof(at), "%s\"%s\",\"leaf\":\"%s\"", kv_entry, root, leaf);
    assert_non_null(strstr(json, at));
    uint64_t v = 0;
    assert_true(dt_json_u64(json, at, "pages", &v));
    assert_int_equal(v, A_LEN);
    assert_true(dt_json_u64(json, at, "bytes", &v));
    assert_int_equal(v, A_LEN * OBJECT);
    hex(g.b[0], root);
    snprintf(at, sizeof(at), "%s\"%s\"", kv_entry, root);
    assert_true(dt_json_u64(json, at, "pages", &v));
    assert_int_equal(v, B_LEN);
    assert_true(dt_json_u64(json, at, "bytes", &v));
    assert_int_equal(v, B_LEN * OBJECT);

    /* the CLI prints the same text (and a newline) */
    char out[1 << 16], want[(1 << 16) + 2];
    int rc = dt_cli_at(out, sizeof(out), g.d.socket,
                       (const char *[]){"prefixes", "--json", NULL});
    assert_int_equal(rc, 0);
    snprintf(want, sizeof(want), "%s\n", json);
    assert_string_equal(out, want);
    kvd_free(json);

    /* limit 1: one entry, and the listing says there is more */
    json = NULL;
    assert_int_equal(kvd_store_prefixes_json(s, NULL, 1, &json), KVD_OK);
    assert_true(dt_json_valid(json));
    assert_int_equal(count_of(json, "\"root\":"), 1);
    assert_non_null(strstr(json, "\"truncated\":true"));
    kvd_free(json);

    /* a namespace's own prefixes only */
    json = NULL;
    assert_int_equal(kvd_store_prefixes_json(s, g.kv_ns, 0, &json), KVD_OK);
    assert_true(dt_json_valid(json));
    assert_int_equal(count_of(json, "\"root\":"), 2);
    assert_int_equal(count_of(json, kv_entry), 2);
    kvd_free(json);

    json = NULL;
    assert_int_equal(kvd_store_prefixes_json(s, "sclient/no-such-pool", 0, &json),
                     KVD_ERR_NOT_FOUND);
    assert_null(json);
    /* the daemon's reason, the namespace named */
    assert_non_null(strstr(kvd_last_error(), "'sclient/no-such-pool'"));
    /* the connection serves on after the daemon's error reply; a call
     * that succeeds has no reason */
    assert_int_equal(kvd_store_health(s, NULL, NULL), KVD_OK);
    assert_string_equal(kvd_last_error(), "");
    kvd_store_close(s);
}

/* ---------------------------------------------------------------- lookup */

/* The lookup's JSON text for these keys; asserts it succeeded. */
static char *lookup(kvd_store_t *s, const char *const *ns, const uint32_t *trailing,
                    size_t n_ns, page_key_t *keys, size_t n_keys)
{
    char *json = NULL;
    assert_int_equal(kvd_store_lookup_json(s, ns, trailing, n_ns,
                                           (const uint8_t(*)[KVD_PAGE_KEY_BYTES])keys,
                                           n_keys, &json),
                     KVD_OK);
    assert_non_null(json);
    return json;
}

static void expect_lookup(kvd_store_t *s, const char *const *ns, const uint32_t *trailing,
                          size_t n_ns, page_key_t *keys, size_t n_keys, const char *want)
{
    char *json = lookup(s, ns, trailing, n_ns, keys, n_keys);
    assert_string_equal(json, want);
    kvd_free(json);
}

static void test_lookup_json(void **state)
{
    (void)state;
    kvd_store_t *s = open_store();
    const char *kv[] = {g.kv_ns}, *both[] = {g.kv_ns, g.swa_ns};
    page_key_t keys[A_LEN], unknown[2];
    memcpy(keys, g.a, sizeof(keys));
    assert_int_equal(chain(9000, unknown, 2), KVD_OK);

    expect_lookup(s, kv, NULL, 1, keys, A_LEN,
                  "{\"boundaries\":[1,2,3,4],\"longest\":4}");
    /* page 3 missing: every page before b (ALL_PAGES) stops at 2; the last
     * page before b (TRAILING_PAGES(1)) is there at 1, 2 and 4 */
    memcpy(keys[2], unknown[0], sizeof(keys[2]));
    expect_lookup(s, kv, NULL, 1, keys, A_LEN, "{\"boundaries\":[1,2],\"longest\":2}");
    expect_lookup(s, kv, (const uint32_t[]){1}, 1, keys, A_LEN,
                  "{\"boundaries\":[1,2,4],\"longest\":4}");
    /* kv (every page) and swa (its last page: A[1] and A[3] stored) */
    memcpy(keys, g.a, sizeof(keys));
    expect_lookup(s, both, (const uint32_t[]){0, 1}, 2, keys, A_LEN,
                  "{\"boundaries\":[2,4],\"longest\":4}");
    expect_lookup(s, kv, NULL, 1, unknown, 2, "{\"boundaries\":[],\"longest\":0}");

    /* the CLI prints the same text (and a newline) */
    char *json = lookup(s, both, (const uint32_t[]){0, 1}, 2, keys, A_LEN);
    char hexes[A_LEN][65], out[4096], want[4096];
    const char *args[16] = {"lookup",      "--json", "--namespace", g.kv_ns,
                            "--namespace", g.swa_ns, "--trailing",  "0,1"};
    for (size_t i = 0; i < A_LEN; i++) {
        hex(keys[i], hexes[i]);
        args[8 + i] = hexes[i];
    }
    assert_int_equal(dt_cli_at(out, sizeof(out), g.d.socket, args), 0);
    snprintf(want, sizeof(want), "%s\n", json);
    assert_string_equal(out, want);
    kvd_free(json);

    /* a namespace the daemon does not know: nothing handed out */
    const char *bad[] = {g.kv_ns, "sclient/no-such-pool"};
    json = NULL;
    assert_int_equal(kvd_store_lookup_json(s, bad, NULL, 2,
                                           (const uint8_t(*)[KVD_PAGE_KEY_BYTES])keys,
                                           A_LEN, &json),
                     KVD_ERR_NOT_FOUND);
    assert_null(json);
    assert_non_null(strstr(kvd_last_error(), "unknown namespace 'sclient/no-such-pool'"));
    kvd_store_close(s);
}

/* ---------------------------------------------------------------- errors */

static void test_errors(void **state)
{
    (void)state;
    static int sentinel;
    kvd_store_t *s = (kvd_store_t *)&sentinel; /* not written over on failure */
    kvd_store_config_t none = {.socket_path = "/nonexistent/kvdock-store-client.sock",
                               .timeout_ms = 5000};
    assert_int_equal(kvd_store_open(&none, &s), KVD_ERR_UNAVAILABLE);
    assert_ptr_equal(s, (kvd_store_t *)&sentinel);
    assert_non_null(strstr(kvd_last_error(), none.socket_path));
    char long_path[300];
    memset(long_path, 'x', sizeof(long_path) - 1);
    long_path[sizeof(long_path) - 1] = '\0';
    kvd_store_config_t too_long = {.socket_path = long_path};
    assert_int_equal(kvd_store_open(&too_long, &s), KVD_ERR_INVALID);
    kvd_store_config_t cfg = {.socket_path = g.d.socket};
    assert_int_equal(kvd_store_open(&cfg, NULL), KVD_ERR_INVALID);

    s = open_store();
    char *json = NULL;
    const char *kv[KVD_MAX_POOLS + 1];
    for (size_t i = 0; i < KVD_ARRAY_SIZE(kv); i++)
        kv[i] = g.kv_ns;
    const uint8_t(*keys)[KVD_PAGE_KEY_BYTES] = (const uint8_t(*)[KVD_PAGE_KEY_BYTES])g.a;
    assert_int_equal(kvd_store_stats_json(s, NULL), KVD_ERR_INVALID);
    assert_int_equal(kvd_store_stats_json(NULL, &json), KVD_ERR_INVALID);
    assert_int_equal(kvd_store_prefixes_json(s, NULL, 0, NULL), KVD_ERR_INVALID);
    assert_int_equal(kvd_store_health(NULL, NULL, NULL), KVD_ERR_INVALID);
    assert_int_equal(kvd_store_lookup_json(s, kv, NULL, 0, keys, A_LEN, &json),
                     KVD_ERR_INVALID);
    assert_int_equal(kvd_store_lookup_json(s, kv, NULL, 1, keys, 0, &json),
                     KVD_ERR_INVALID);
    assert_int_equal(kvd_store_lookup_json(s, kv, NULL, 1, NULL, A_LEN, &json),
                     KVD_ERR_INVALID);
    assert_int_equal(
        kvd_store_lookup_json(s, kv, NULL, KVD_MAX_POOLS + 1, keys, A_LEN, &json),
        KVD_ERR_INVALID);
    const char *null_name[] = {NULL};
    assert_int_equal(kvd_store_lookup_json(s, null_name, NULL, 1, keys, A_LEN, &json),
                     KVD_ERR_INVALID);
    assert_null(json);
    kvd_free(NULL);
    kvd_store_close(NULL);
    kvd_store_close(s);
}

/* ------------------------------------------------------------------ auth */

static int open_token(const char *socket, const char *token_file, kvd_store_t **s)
{
    kvd_store_config_t cfg = {
        .socket_path = socket, .auth_token_file = token_file, .timeout_ms = 5000};
    *s = NULL;
    return kvd_store_open(&cfg, s);
}

/* Waits (bounded) until the daemon answers ready to a store client with
 * the token: as the harness waits for a daemon, which has no token. */
static int wait_ready_with(const char *socket, const char *token_file)
{
    for (int i = 0; i < 600; i++) {
        kvd_store_t *s = NULL;
        kvd_linker_health_t h = 0;
        int rc = open_token(socket, token_file, &s);
        if (rc == KVD_OK)
            rc = kvd_store_health(s, &h, NULL);
        kvd_store_close(s);
        if (rc == KVD_OK && h == KVD_LINKER_HEALTH_READY)
            return KVD_OK;
        sleep_ms(50);
    }
    return KVD_ERR_TIMEOUT;
}

/* Starts a daemon that takes the token in `good` and no uid of ours. */
static int start_auth_daemon(kvd_test_daemon_t *d, const char *good, const char *socket)
{
    const char *args[] = {"--pool-size",
                          "64M",
                          "--usage-interval",
                          "0",
                          "--allow-uid",
                          "4242",
                          "--auth-token-file",
                          good,
                          socket ? "--socket" : NULL,
                          socket,
                          NULL};
    return kvd_test_daemon_start(d, args, false, 0);
}

/* What test_auth starts, stopped by auth_teardown whatever happened. */
static struct {
    char good[64], bad[64];
    kvd_test_daemon_t d1, d2;
    kvd_store_t *s;
} au;

static void test_auth(void **state)
{
    (void)state;
    kvd_store_t *x = NULL;
    assert_int_equal(dt_token_file("store-client-token", au.good, sizeof(au.good)), 0);
    assert_int_equal(dt_token_file("not-the-token", au.bad, sizeof(au.bad)), 0);
    assert_int_equal(start_auth_daemon(&au.d1, au.good, NULL), 0);
    assert_int_equal(wait_ready_with(au.d1.socket, au.good), KVD_OK);
    assert_int_equal(open_token(au.d1.socket, au.good, &au.s), KVD_OK);
    assert_int_equal(kvd_store_health(au.s, NULL, NULL), KVD_OK);

    assert_int_equal(open_token(au.d1.socket, au.bad, &x), KVD_ERR_AUTH);
    assert_null(x);
    assert_non_null(strstr(kvd_last_error(), "refused the Hello"));
    assert_int_equal(open_token(au.d1.socket, NULL, &x), KVD_ERR_AUTH);
    assert_int_equal(open_token(au.d1.socket, "/nonexistent/kvdock-token", &x),
                     KVD_ERR_NOT_FOUND);
    assert_non_null(strstr(kvd_last_error(), "/nonexistent/kvdock-token"));
    setenv("KVDOCK_AUTH_TOKEN_FILE", au.good, 1);
    int rc = open_token(au.d1.socket, NULL, &x);
    unsetenv("KVDOCK_AUTH_TOKEN_FILE");
    assert_int_equal(rc, KVD_OK);
    rc = kvd_store_health(x, NULL, NULL);
    kvd_store_close(x);
    assert_int_equal(rc, KVD_OK);

    /* the daemon goes; another takes its socket: the next call reconnects */
    kill(au.d1.pid, SIGKILL);
    assert_int_equal(kvd_test_wait_pid(au.d1.pid, 10000, NULL), 0);
    au.d1.pid = 0;
    assert_int_equal(start_auth_daemon(&au.d2, au.good, au.d1.socket), 0);
    assert_int_equal(wait_ready_with(au.d1.socket, au.good), KVD_OK);
    kvd_linker_health_t h = 0;
    assert_int_equal(kvd_store_health(au.s, &h, NULL), KVD_OK);
    assert_int_equal(h, KVD_LINKER_HEALTH_READY);
}

static int auth_teardown(void **state)
{
    (void)state;
    kvd_store_close(au.s);
    dt_stop(&au.d2, SIGTERM, 10000);
    dt_stop(&au.d1, SIGTERM, 10000);
    if (au.good[0])
        unlink(au.good);
    if (au.bad[0])
        unlink(au.bad);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_health),
        cmocka_unit_test(test_stats_json),
        cmocka_unit_test(test_prefixes_json),
        cmocka_unit_test(test_lookup_json),
        cmocka_unit_test(test_errors),
        cmocka_unit_test_teardown(test_auth, auth_teardown),
    };
    int failed = cmocka_run_group_tests(tests, setup, teardown);
    return failed || dt_failure_count() ? 1 : 0;
}
