/*
 * Description: the daemon's credentials (daemon/auth.c) without a daemon.
 * Auth configs with mistakes are refused naming the file and the line;
 * token files open to others, empty or too long are refused; --listen
 * without a token is refused unless --insecure-no-auth. A token maps to
 * its tenant and role (trailing newline trimmed), a wrong or truncated one
 * to nothing; the constant-time compare agrees with memcmp on equal,
 * unequal, prefix and different-length inputs. Unix peers match uid lines,
 * then gid lines (primary and supplementary groups), then the default
 * own-uid-and-root rule; others are refused. The socket mode follows the
 * rules (0600, 0660 and the group, 0666), and the refusal log's rate limit
 * lets a burst through and counts the rest.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "auth.h"
#include "kvd_proto.h"
#include "kvd_store.h"

static char dir[64];

/* Writes text to dir/name with the given mode; returns the path (static
 * storage, one of four rotating buffers). */
static const char *put(const char *name, const char *text, mode_t mode)
{
    static char paths[4][128];
    static int next;
    char *p = paths[next++ % 4];
    snprintf(p, 128, "%s/%s", dir, name);
    unlink(p);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    assert_int_equal(chmod(p, mode), 0);
    return p;
}

/* kvd_auth_create with a config text; returns its status, why filled. */
static int create_with(const char *config_text, kvd_auth_opts_t o, kvd_auth_t **a,
                       char *why, size_t why_len)
{
    if (config_text != NULL)
        o.config_file = put("auth.conf", config_text, 0600);
    why[0] = '\0';
    *a = NULL;
    return kvd_auth_create(&o, a, why, why_len);
}

/* The config must be refused with a message containing want. */
static void refused(const char *config_text, const char *want)
{
    char why[1024];
    kvd_auth_t *a;
    int rc = create_with(config_text, (kvd_auth_opts_t){.self_uid = 1000}, &a, why,
                         sizeof(why));
    if (rc == KVD_OK || strstr(why, want) == NULL)
        fail_msg("config:\n%s\nwant refused with '%s', got %d '%s'", config_text, want,
                 rc, why);
    assert_null(a);
}

static void test_parse_errors(void **state)
{
    (void)state;
    put("good.token", "s3cret\n", 0600);
    put("open.token", "s3cret-open\n", 0644);
    put("empty.token", "\n", 0600);
    char where[160];
    snprintf(where, sizeof(where), "%s/auth.conf:3: unknown rule 'tenatn'", dir);
    refused("# comment\n\ntenatn a\n", where);
    snprintf(where, sizeof(where), "%s/auth.conf:2: tenant 'b' is not defined", dir);
    refused("tenant a\nuid b 1234\n", where);
    snprintf(where, sizeof(where), "%s/auth.conf:1: unknown limit 'max-cats'", dir);
    refused("tenant a max-cats=3\n", where);
    snprintf(where, sizeof(where), "%s/auth.conf:1: max-bytes 'lots'", dir);
    refused("tenant a max-bytes=lots\n", where);
    snprintf(where, sizeof(where), "%s/auth.conf:2: tenant 'a' is defined twice", dir);
    refused("tenant a\ntenant a\n", where);
    refused("tenant default max-bytes=1G\n",
            "auth.conf:1: the tenant 'default' always exists");
    snprintf(where, sizeof(where), "%s/auth.conf:3: the same uid as line 2", dir);
    refused("tenant a\nuid a 1234\nuid default 1234\n", where);
    refused("tenant a\nuid a 1234 admin\n", "auth.conf:2: unknown flag 'admin'");
    refused("tenant a\nuid a no-such-user-here-kvd\n",
            "auth.conf:2: no such user 'no-such-user-here-kvd'");
    refused("tenant a\ngid a no-such-group-here-kvd\n",
            "auth.conf:2: no such group 'no-such-group-here-kvd'");
    refused("tenant a\ntoken a\n", "auth.conf:2: 'token' needs a TENANT and a FILE");
    refused("tenant a\ntoken a open.token\n", "open to its group or others (mode 0644)");
    refused("tenant a\ntoken a empty.token\n", "empty.token is empty");
    refused("tenant a\ntoken a missing.token\n", "auth.conf:2: cannot open");
    refused("tenant a\ntenant b\ntoken a good.token\ntoken b good.token\n",
            "auth.conf:4: the same token as line 3");
    refused("tenant a/b\n", "auth.conf:1: tenant name 'a/b'");
}

static void test_flags(void **state)
{
    (void)state;
    char why[1024];
    kvd_auth_t *a;
    /* --listen with no token at all: refused, naming the way out */
    int rc = create_with(NULL, (kvd_auth_opts_t){.tcp = true, .self_uid = 1000}, &a, why,
                         sizeof(why));
    assert_int_equal(rc, KVD_ERR_INVALID);
    assert_non_null(strstr(why, "--listen without a token"));
    assert_non_null(strstr(why, "--insecure-no-auth"));
    /* ... unless the operator says so */
    rc = create_with(
        NULL, (kvd_auth_opts_t){.tcp = true, .insecure_no_auth = true, .self_uid = 1000},
        &a, why, sizeof(why));
    assert_int_equal(rc, KVD_OK);
    kvd_auth_grant_t g;
    const char *w;
    kvd_auth_peer_t tcp = {.tcp = true};
    assert_int_equal(kvd_auth_check(a, &tcp, NULL, 0, &g, &w), KVD_OK);
    assert_true(g.is_operator && g.tenant == KVD_TENANT_DEFAULT);
    kvd_auth_destroy(a);
    /* --auth-token-file open to others, or empty: refused */
    const char *open_tok = put("flag-open.token", "abc\n", 0640);
    rc = create_with(
        NULL, (kvd_auth_opts_t){.tcp = true, .token_file = open_tok, .self_uid = 1000},
        &a, why, sizeof(why));
    assert_int_equal(rc, KVD_ERR_INVALID);
    assert_non_null(strstr(why, "--auth-token-file: "));
    assert_non_null(strstr(why, "mode 0640"));
    const char *empty = put("flag-empty.token", "", 0600);
    rc = create_with(
        NULL, (kvd_auth_opts_t){.tcp = true, .token_file = empty, .self_uid = 1000}, &a,
        why, sizeof(why));
    assert_int_equal(rc, KVD_ERR_INVALID);
    assert_non_null(strstr(why, "is empty"));
    char big[KVD_TOKEN_MAX + 8];
    memset(big, 'x', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    const char *toolong = put("flag-big.token", big, 0600);
    rc = create_with(
        NULL, (kvd_auth_opts_t){.tcp = true, .token_file = toolong, .self_uid = 1000}, &a,
        why, sizeof(why));
    assert_int_equal(rc, KVD_ERR_TOO_LARGE);
    rc = create_with(NULL,
                     (kvd_auth_opts_t){.allow_uid = "12,nobody-kvd-x", .self_uid = 1}, &a,
                     why, sizeof(why));
    assert_int_equal(rc, KVD_ERR_INVALID);
    assert_non_null(strstr(why, "--allow-uid 'nobody-kvd-x': no such user"));
}

static void test_const_time_equal(void **state)
{
    (void)state;
    const char *a = "correct horse battery staple";
    assert_true(kvd_const_time_equal(a, strlen(a), "correct horse battery staple", 28));
    assert_false(kvd_const_time_equal(a, strlen(a), "correct horse battery stapl", 27));
    assert_false(kvd_const_time_equal(a, strlen(a), "Correct horse battery staple", 28));
    assert_false(kvd_const_time_equal(a, strlen(a), "correct horse battery staplf", 28));
    assert_false(kvd_const_time_equal("", 0, "x", 1));
    assert_true(kvd_const_time_equal("", 0, "", 0));
    /* a zero byte past the shorter one is still a difference */
    assert_false(kvd_const_time_equal("ab", 2, "ab\0", 3));
    uint8_t x[64], y[64];
    for (int i = 0; i < 64; i++)
        x[i] = y[i] = (uint8_t)(i * 7);
    for (int i = 0; i < 64; i++) {
        y[i] ^= 0x80;
        assert_false(kvd_const_time_equal(x, 64, y, 64));
        y[i] ^= 0x80;
        assert_true(kvd_const_time_equal(x, 64, y, 64));
    }
}

static void test_tokens_to_tenants(void **state)
{
    (void)state;
    put("a.token", "token-of-a\n", 0600);
    put("ops.token", "token-of-ops\r\n", 0600);
    const char *flag = put("flag.token", "the-flag-token", 0600);
    char why[1024];
    kvd_auth_t *a;
    int rc =
        create_with("tenant a max-bytes=1G max-pins=10\n"
                    "tenant b max-leases=5 max-namespaces=2\n"
                    "token a a.token read-only\n"
                    "token b ops.token operator\n",
                    (kvd_auth_opts_t){.tcp = true, .token_file = flag, .self_uid = 1000},
                    &a, why, sizeof(why));
    assert_int_equal(rc, KVD_OK);
    assert_int_equal(kvd_auth_token_count(a), 3);
    kvd_store_config_t scfg;
    kvd_store_config_default(&scfg, 64ull << 20);
    kvd_store_t *store = NULL;
    assert_int_equal(kvd_store_create(&scfg, &store), KVD_OK);
    assert_int_equal(kvd_auth_bind(a, store, why, sizeof(why)), KVD_OK);
    uint32_t ta, tb;
    assert_int_equal(kvd_store_tenant_find(store, "a", &ta), KVD_OK);
    assert_int_equal(kvd_store_tenant_find(store, "b", &tb), KVD_OK);
    assert_true(ta != KVD_TENANT_DEFAULT && tb != KVD_TENANT_DEFAULT && ta != tb);

    kvd_auth_peer_t tcp = {.tcp = true};
    kvd_auth_grant_t g;
    const char *w = NULL;
    const char *t = "token-of-a";
    assert_int_equal(kvd_auth_check(a, &tcp, (const uint8_t *)t, strlen(t), &g, &w),
                     KVD_OK);
    assert_true(g.tenant == ta && !g.is_operator && g.read_only);
    t = "token-of-ops"; /* "\r\n" trimmed */
    assert_int_equal(kvd_auth_check(a, &tcp, (const uint8_t *)t, strlen(t), &g, &w),
                     KVD_OK);
    assert_true(g.tenant == tb && g.is_operator && !g.read_only);
    t = "the-flag-token"; /* the flag's: default tenant, operator */
    assert_int_equal(kvd_auth_check(a, &tcp, (const uint8_t *)t, strlen(t), &g, &w),
                     KVD_OK);
    assert_true(g.tenant == KVD_TENANT_DEFAULT && g.is_operator && !g.read_only);
    const char *bad[] = {"token-of-", "token-of-a\n", "token-of-b", "TOKEN-OF-A", "x"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        w = NULL;
        rc = kvd_auth_check(a, &tcp, (const uint8_t *)bad[i], strlen(bad[i]), &g, &w);
        assert_int_equal(rc, KVD_ERR_AUTH);
        assert_non_null(w);
        assert_null(strstr(w, bad[i])); /* the reason never echoes the bytes */
    }
    /* TCP without a token: refused (tokens are configured) */
    assert_int_equal(kvd_auth_check(a, &tcp, NULL, 0, &g, &w), KVD_ERR_AUTH);
    /* a token over the Unix socket: its mapping applies, not the uid's */
    kvd_auth_peer_t self = {.has_cred = true, .uid = 1000, .gid = 1000};
    t = "token-of-a";
    assert_int_equal(kvd_auth_check(a, &self, (const uint8_t *)t, strlen(t), &g, &w),
                     KVD_OK);
    assert_true(g.tenant == ta && g.read_only);
    /* and a wrong one there is refused, even for the daemon's own uid */
    t = "nope";
    assert_int_equal(kvd_auth_check(a, &self, (const uint8_t *)t, strlen(t), &g, &w),
                     KVD_ERR_AUTH);
    kvd_auth_destroy(a);
    kvd_store_destroy(store);
}

static void test_peers(void **state)
{
    (void)state;
    char why[1024];
    kvd_auth_t *a;
    int rc = create_with("tenant a\ntenant b\n"
                         "uid a 2001\n"
                         "gid b 3001 read-only\n"
                         "uid b 2002 operator\n",
                         (kvd_auth_opts_t){.self_uid = 1000}, &a, why, sizeof(why));
    assert_int_equal(rc, KVD_OK);
    kvd_store_config_t scfg;
    kvd_store_config_default(&scfg, 64ull << 20);
    kvd_store_t *store = NULL;
    assert_int_equal(kvd_store_create(&scfg, &store), KVD_OK);
    assert_int_equal(kvd_auth_bind(a, store, why, sizeof(why)), KVD_OK);
    uint32_t ta, tb;
    assert_int_equal(kvd_store_tenant_find(store, "a", &ta), KVD_OK);
    assert_int_equal(kvd_store_tenant_find(store, "b", &tb), KVD_OK);

    kvd_auth_grant_t g;
    const char *w;
    kvd_auth_peer_t p = {.has_cred = true, .uid = 2001, .gid = 3001};
    /* the uid line beats the gid line */
    assert_int_equal(kvd_auth_check(a, &p, NULL, 0, &g, &w), KVD_OK);
    assert_true(g.tenant == ta && !g.is_operator && !g.read_only);
    p = (kvd_auth_peer_t){.has_cred = true, .uid = 2002, .gid = 5};
    assert_int_equal(kvd_auth_check(a, &p, NULL, 0, &g, &w), KVD_OK);
    assert_true(g.tenant == tb && g.is_operator);
    /* the primary group */
    p = (kvd_auth_peer_t){.has_cred = true, .uid = 2999, .gid = 3001};
    assert_int_equal(kvd_auth_check(a, &p, NULL, 0, &g, &w), KVD_OK);
    assert_true(g.tenant == tb && g.read_only && !g.is_operator);
    /* a supplementary group */
    gid_t groups[] = {7, 3001, 9};
    p = (kvd_auth_peer_t){
        .has_cred = true, .uid = 2999, .gid = 4, .groups = groups, .n_groups = 3};
    assert_int_equal(kvd_auth_check(a, &p, NULL, 0, &g, &w), KVD_OK);
    assert_true(g.tenant == tb && g.read_only);
    /* the default rule: own uid and root, as the default tenant's operator */
    p = (kvd_auth_peer_t){.has_cred = true, .uid = 1000, .gid = 1000};
    assert_int_equal(kvd_auth_check(a, &p, NULL, 0, &g, &w), KVD_OK);
    assert_true(g.tenant == KVD_TENANT_DEFAULT && g.is_operator && !g.read_only);
    p = (kvd_auth_peer_t){.has_cred = true, .uid = 0, .gid = 0};
    assert_int_equal(kvd_auth_check(a, &p, NULL, 0, &g, &w), KVD_OK);
    assert_true(g.tenant == KVD_TENANT_DEFAULT && g.is_operator);
    /* anyone else, or a peer whose credentials are unknown: refused */
    gid_t other[] = {7, 9};
    p = (kvd_auth_peer_t){
        .has_cred = true, .uid = 65534, .gid = 65534, .groups = other, .n_groups = 2};
    assert_int_equal(kvd_auth_check(a, &p, NULL, 0, &g, &w), KVD_ERR_AUTH);
    assert_non_null(strstr(w, "not allowed"));
    p = (kvd_auth_peer_t){.has_cred = false, .uid = 1000};
    assert_int_equal(kvd_auth_check(a, &p, NULL, 0, &g, &w), KVD_ERR_AUTH);
    /* TCP has no uid: without a token and --insecure-no-auth, refused */
    p = (kvd_auth_peer_t){.tcp = true, .has_cred = true, .uid = 1000};
    assert_int_equal(kvd_auth_check(a, &p, NULL, 0, &g, &w), KVD_ERR_AUTH);
    /* other users may connect: the file mode cannot tell them apart */
    gid_t grp;
    assert_int_equal(kvd_auth_socket_mode(a, &grp), 0666);
    kvd_auth_destroy(a);
    kvd_store_destroy(store);

    /* --allow-uid replaces the default rule */
    rc = create_with(NULL, (kvd_auth_opts_t){.allow_uid = "1000", .self_uid = 1000}, &a,
                     why, sizeof(why));
    assert_int_equal(rc, KVD_OK);
    p = (kvd_auth_peer_t){.has_cred = true, .uid = 0, .gid = 0};
    assert_int_equal(kvd_auth_check(a, &p, NULL, 0, &g, &w), KVD_ERR_AUTH);
    assert_int_equal(kvd_auth_socket_mode(a, &grp), 0600);
    kvd_auth_destroy(a);
}

static void test_socket_modes(void **state)
{
    (void)state;
    char why[1024];
    kvd_auth_t *a;
    gid_t grp;
    assert_int_equal(
        create_with(NULL, (kvd_auth_opts_t){.self_uid = 1000}, &a, why, sizeof(why)),
        KVD_OK);
    assert_int_equal(kvd_auth_socket_mode(a, &grp), 0600);
    assert_true(grp == (gid_t)-1);
    kvd_auth_destroy(a);
    assert_int_equal(create_with(NULL,
                                 (kvd_auth_opts_t){.allow_gid = "4242", .self_uid = 1000},
                                 &a, why, sizeof(why)),
                     KVD_OK);
    assert_int_equal(kvd_auth_socket_mode(a, &grp), 0660);
    assert_int_equal(grp, 4242);
    kvd_auth_destroy(a);
    assert_int_equal(
        create_with(NULL, (kvd_auth_opts_t){.allow_gid = "4242,4243", .self_uid = 1000},
                    &a, why, sizeof(why)),
        KVD_OK);
    assert_int_equal(kvd_auth_socket_mode(a, &grp), 0666);
    kvd_auth_destroy(a);
}

static void test_ratelimit(void **state)
{
    (void)state;
    kvd_ratelimit_t r = {0};
    uint64_t skipped = 99, t = 1000;
    const uint64_t window = 1000000000ull;
    for (int i = 0; i < 3; i++) {
        assert_true(kvd_ratelimit_allow(&r, t + (uint64_t)i, 3, window, &skipped));
        assert_int_equal(skipped, 0);
    }
    for (int i = 0; i < 5; i++)
        assert_false(kvd_ratelimit_allow(&r, t + 10 + (uint64_t)i, 3, window, &skipped));
    /* the next window lets one through and says how many were not logged */
    assert_true(kvd_ratelimit_allow(&r, t + window, 3, window, &skipped));
    assert_int_equal(skipped, 5);
    assert_true(kvd_ratelimit_allow(&r, t + window + 1, 3, window, &skipped));
    assert_int_equal(skipped, 0);
}

static int setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof(dir), "/tmp/kvd-test-auth-XXXXXX");
    return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : -1;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_errors),
        cmocka_unit_test(test_flags),
        cmocka_unit_test(test_const_time_equal),
        cmocka_unit_test(test_tokens_to_tenants),
        cmocka_unit_test(test_peers),
        cmocka_unit_test(test_socket_modes),
        cmocka_unit_test(test_ratelimit),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
