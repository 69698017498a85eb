/*
 * Description: hole 2 of issue 11, over a real daemon. (a) Hello first: on
 * the Unix socket, Health, Stats and Evict{all} sent before any Hello are
 * each answered KVD_ERR_AUTH and the connection closed; a Hello with a
 * token that matches nothing is refused and closes too; Stats counts the
 * refusals (auth_failures) and the log names them without the client's
 * bytes. (b) TCP with --auth-token-file: a Hello without a token, with a
 * wrong one or a prefix of the right one is refused and closes; Evict{all}
 * before Hello is refused; the right token is served (Health, Stats);
 * `kvdock --connect ... evict --all` without a token fails and nothing was
 * evicted, with --token-file or $KVDOCK_AUTH_TOKEN_FILE it succeeds.
 * (c) --listen without a token refuses to start (exit 2, saying why),
 * and so does a token file open to others; with --insecure-no-auth it
 * starts and serves TCP without a token.
 */
#include "dtest.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define TOKEN      "the-right-token-0123456789"
#define EVIL_NAME  "EVIL-CLIENT-NAME-7f3a"
#define WRONG_TOK  "WRONG-TOKEN-BYTES-91c2"
#define TIMEOUT_MS 5000

static uint8_t frame[1 << 16];
static char out[1 << 16];

/* Sends m on fd; expects one error reply with status want, then EOF. */
static void expect_refused(int fd, const kvd_msg_t *m, int want, const char *what)
{
    kvd_buf_t b;
    int rc = dt_pack(m, &b);
    if (rc == KVD_OK)
        rc = dt_send_all(fd, b.data, b.len);
    kvd_buf_free(&b);
    if (!DT_CHECK(rc == 0, "(%s) send: %d", what, rc))
        return;
    size_t len = 0;
    dt_wire_env_t env;
    rc = dt_read_frame(fd, frame, sizeof(frame), &len, TIMEOUT_MS);
    if (DT_CHECK(rc == 1 && dt_wire_parse(frame, len, &env) == 0,
                 "(%s) no reply frame: %d", what, rc))
        DT_CHECK(env.reply && env.has_error && env.error_code == want &&
                     env.method == m->method,
                 "(%s) reply: method %llu error %d %lld '%s', want method %d error %d",
                 what, (unsigned long long)env.method, env.has_error,
                 (long long)env.error_code, env.error_message, (int)m->method, want);
    DT_CHECK(dt_expect_eof(fd, TIMEOUT_MS) == 0, "(%s) the connection should close",
             what);
}

static kvd_msg_t hello_msg(const char *name, const char *token)
{
    kvd_msg_t m;
    kvd_msg_request(&m, 1, KVD_METHOD_HELLO);
    kvd_strlcpy(m.body.hello_req.client_name, name, sizeof(m.body.hello_req.client_name));
    m.body.hello_req.pid = (uint32_t)getpid();
    m.body.hello_req.protocol_version = KVD_PROTOCOL_VERSION;
    if (token) {
        memcpy(m.body.hello_req.auth_token, token, strlen(token));
        m.body.hello_req.auth_token_len = strlen(token);
    }
    return m;
}

static kvd_msg_t evict_all_msg(void)
{
    kvd_msg_t m;
    kvd_msg_request(&m, 5, KVD_METHOD_EVICT);
    m.body.evict_req.all = true;
    return m;
}

/* (a) the Unix socket: Hello first */
static void hello_first(const kvd_test_daemon_t *d)
{
    kvd_stats_rep_t s0;
    if (!DT_CHECK(dt_stats_fresh(d->socket, &s0) == KVD_OK, "stats"))
        return;
    kvd_method_t methods[] = {KVD_METHOD_HEALTH, KVD_METHOD_STATS};
    for (size_t i = 0; i < 2; i++) {
        int fd = dt_raw_connect_unix(d->socket);
        if (!DT_CHECK(fd >= 0, "connect"))
            return;
        kvd_msg_t m;
        kvd_msg_request(&m, 3, methods[i]);
        expect_refused(fd, &m, KVD_ERR_AUTH, kvd_method_name(methods[i]));
        close(fd);
    }
    int fd = dt_raw_connect_unix(d->socket);
    if (DT_CHECK(fd >= 0, "connect")) {
        kvd_msg_t m = evict_all_msg();
        expect_refused(fd, &m, KVD_ERR_AUTH, "unix Evict{all} before Hello");
        close(fd);
    }
    /* a token that matches nothing is refused, even from the daemon's uid */
    fd = dt_raw_connect_unix(d->socket);
    if (DT_CHECK(fd >= 0, "connect")) {
        kvd_msg_t m = hello_msg(EVIL_NAME, WRONG_TOK);
        expect_refused(fd, &m, KVD_ERR_AUTH, "unix Hello with a wrong token");
        close(fd);
    }
    kvd_stats_rep_t s1;
    if (DT_CHECK(dt_stats_fresh(d->socket, &s1) == KVD_OK, "stats"))
        DT_CHECK(s1.auth_failures == s0.auth_failures + 4,
                 "auth_failures %llu -> %llu, want +4",
                 (unsigned long long)s0.auth_failures,
                 (unsigned long long)s1.auth_failures);
    /* /metrics is not up here; the log says what was refused, not what was sent */
    DT_CHECK(kvd_test_file_contains(d->log, "health refused: say Hello first"),
             "the log should name the refused Health");
    DT_CHECK(kvd_test_file_contains(d->log, "hello refused: the token matches none"),
             "the log should name the refused Hello");
    DT_CHECK(!kvd_test_file_contains(d->log, EVIL_NAME) &&
                 !kvd_test_file_contains(d->log, WRONG_TOK),
             "the log should not echo a refused client's bytes");
}

/* (b) TCP with a token */
static void tcp_token(const kvd_test_daemon_t *d, const char *addr,
                      const char *token_file)
{
    const char *bad[] = {NULL, WRONG_TOK, "the-right-token", TOKEN "x"};
    const char *what[] = {"tcp Hello without a token", "tcp Hello with a wrong token",
                          "tcp Hello with a prefix of the token",
                          "tcp Hello with the token and more"};
    for (size_t i = 0; i < 4; i++) {
        kvd_client_t *c = NULL;
        if (!DT_CHECK(kvd_client_connect_tcp(addr, TIMEOUT_MS, &c) == KVD_OK, "connect"))
            return;
        kvd_msg_t m = hello_msg("tcp-auth-test", bad[i]);
        expect_refused(kvd_client_fd(c), &m, KVD_ERR_AUTH, what[i]);
        kvd_client_close(c);
    }
    kvd_client_t *c = NULL;
    if (DT_CHECK(kvd_client_connect_tcp(addr, TIMEOUT_MS, &c) == KVD_OK, "connect")) {
        kvd_msg_t m = evict_all_msg();
        expect_refused(kvd_client_fd(c), &m, KVD_ERR_AUTH, "tcp Evict{all} before Hello");
        kvd_client_close(c);
    }
    /* the right token is served */
    c = NULL;
    if (DT_CHECK(kvd_client_connect_tcp(addr, TIMEOUT_MS, &c) == KVD_OK, "connect")) {
        kvd_hello_rep_t h;
        int rc = dt_hello_token(c, "tcp-auth-test", TOKEN, &h, TIMEOUT_MS);
        if (DT_CHECK(rc == KVD_OK, "tcp Hello with the token: %s", kvd_status_str(rc))) {
            DT_CHECK(strcmp(h.tenant, "default") == 0 && !h.read_only,
                     "HelloReply: tenant '%s' read_only %d, want default, 0", h.tenant,
                     h.read_only);
            DT_CHECK(dt_health(c, NULL) == KVD_HEALTH_READY, "Health after the Hello");
        }
        kvd_client_close(c);
    }
    /* the CLI: without the token refused before it sends anything */
    kvd_stats_rep_t s0, s1;
    DT_CHECK(dt_stats_fresh(d->socket, &s0) == KVD_OK, "stats");
    int rc = dt_cli(out, sizeof(out),
                    (const char *[]){"--connect", addr, "evict", "--all", NULL});
    DT_CHECK(rc == 1, "kvdock --connect %s evict --all without a token: exit %d, want 1",
             addr, rc);
    DT_CHECK(dt_stats_fresh(d->socket, &s1) == KVD_OK, "stats");
    DT_CHECK(s1.methods[KVD_METHOD_EVICT].calls == s0.methods[KVD_METHOD_EVICT].calls,
             "an Evict was served for a client without a token (%llu -> %llu)",
             (unsigned long long)s0.methods[KVD_METHOD_EVICT].calls,
             (unsigned long long)s1.methods[KVD_METHOD_EVICT].calls);
    rc = dt_cli(out, sizeof(out),
                (const char *[]){"--connect", addr, "--token-file", token_file, "evict",
                                 "--all", NULL});
    DT_CHECK(rc == 0, "kvdock --connect --token-file evict --all: exit %d", rc);
    char script[512];
    snprintf(script, sizeof(script),
             "KVDOCK_AUTH_TOKEN_FILE='%s' \"$KVDOCK\" --connect %s health", token_file,
             addr);
    rc = dt_sh(out, sizeof(out), script);
    DT_CHECK(rc == 0 && strncmp(out, "ready", 5) == 0,
             "kvdock with $KVDOCK_AUTH_TOKEN_FILE health: exit %d '%s'", rc, out);
}

/* Starts a daemon with --listen on a free port plus extra; 0 or -1. */
static int start_tcp(kvd_test_daemon_t *d, char *addr, size_t addr_len,
                     const char *const *extra)
{
    for (int attempt = 0; attempt < 5; attempt++) {
        int port = dt_free_port();
        snprintf(addr, addr_len, "127.0.0.1:%d", port);
        const char *args[16] = {"--pool-size", DT_POOL,    "--usage-interval",
                                "0",           "--listen", addr};
        size_t n = 6;
        for (size_t i = 0; extra && extra[i] && n < 15; i++)
            args[n++] = extra[i];
        args[n] = NULL;
        if (port > 0 && kvd_test_daemon_start(d, args, true, 30000) == 0)
            return 0;
        kvd_test_daemon_stop(d, SIGKILL, 5000, NULL);
        d->pid = 0;
    }
    return DT_CHECK(false, "kvdockd --listen did not start on any free port") ? 0 : -1;
}

/* Runs kvdockd, expects exit 2 with every needle in its log. */
static void expect_no_start(const char *what, const char *const *args,
                            const char *const *needles)
{
    kvd_test_daemon_t d;
    if (!DT_CHECK(kvd_test_daemon_start(&d, args, false, 0) == 0, "(%s) fork/exec", what))
        return;
    int st = 0;
    if (DT_CHECK(kvd_test_wait_pid(d.pid, 15000, &st) == 0, "(%s) kvdockd still runs",
                 what)) {
        d.pid = 0;
        DT_CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 2, "(%s) exit %d, want 2", what,
                 WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
        for (size_t i = 0; needles[i]; i++)
            if (!DT_CHECK(kvd_test_file_contains(d.log, needles[i]),
                          "(%s) the log should say \"%s\"", what, needles[i]))
                kvd_dump_file(d.log);
    }
    dt_stop(&d, SIGKILL, 5000);
}

/* (c) starting */
static void listen_rules(const char *open_token_file)
{
    char port[32];
    snprintf(port, sizeof(port), "127.0.0.1:%d", dt_free_port());
    expect_no_start("--listen without a token",
                    (const char *[]){"--pool-size", DT_POOL, "--listen", port, NULL},
                    (const char *[]){"refusing to start", "--listen without a token",
                                     "--insecure-no-auth", NULL});
    expect_no_start("--auth-token-file open to others",
                    (const char *[]){"--pool-size", DT_POOL, "--listen", port,
                                     "--auth-token-file", open_token_file, NULL},
                    (const char *[]){"refusing to start", "mode 0644", NULL});

    kvd_test_daemon_t d = {0};
    char addr[64];
    if (start_tcp(&d, addr, sizeof(addr), (const char *[]){"--insecure-no-auth", NULL}) ==
        0) {
        kvd_client_t *c = NULL;
        if (DT_CHECK(kvd_client_connect_tcp(addr, TIMEOUT_MS, &c) == KVD_OK, "connect")) {
            kvd_hello_rep_t h;
            DT_CHECK(dt_hello(c, "insecure", &h, TIMEOUT_MS) == KVD_OK,
                     "--insecure-no-auth: a Hello without a token should be served");
            kvd_client_close(c);
        }
        DT_CHECK(kvd_test_file_contains(d.log, "--insecure-no-auth: TCP clients"),
                 "the daemon should warn about --insecure-no-auth");
    }
    dt_stop(&d, SIGTERM, 10000);
}

int main(void)
{
    char token_file[64], open_file[64];
    if (dt_token_file(TOKEN, token_file, sizeof(token_file)) != 0 ||
        dt_token_file("open", open_file, sizeof(open_file)) != 0)
        return dt_exit_status("daemon/auth_tcp");
    chmod(open_file, 0644);
    /* a daemon as deployed today, with no auth flag at all */
    kvd_test_daemon_t d = {0};
    if (dt_start(&d, NULL) == 0)
        hello_first(&d);
    dt_stop(&d, SIGTERM, 10000);
    char addr[64];
    if (start_tcp(&d, addr, sizeof(addr),
                  (const char *[]){"--auth-token-file", token_file, NULL}) == 0)
        tcp_token(&d, addr, token_file);
    dt_stop(&d, SIGTERM, 10000);
    listen_rules(open_file);
    unlink(token_file);
    unlink(open_file);
    return dt_exit_status("daemon/auth_tcp");
}
