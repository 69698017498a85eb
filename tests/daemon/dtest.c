/*
 * dtest.c - see dtest.h. Nothing here signals or waits for a process it
 * did not start; every blocking read and every child has a timeout.
 */
#include "dtest.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#define RPC_TIMEOUT_MS 5000

/* ------------------------------------------------------------- checks */

/* --------------------------------------------------------- daemons */

int dt_start(kvd_test_daemon_t *d, const char *const *extra)
{
    const char *args[48];
    size_t n = 0;
    args[n++] = "--pool-size";
    args[n++] = DT_POOL;
    args[n++] = "--usage-interval";
    args[n++] = "0";
    for (size_t i = 0; extra && extra[i] && n < KVD_ARRAY_SIZE(args) - 1; i++)
        args[n++] = extra[i];
    args[n] = NULL;
    if (kvd_test_daemon_start(d, args, true, 30000) != 0) {
        dt_fail(__FILE__, __LINE__, "kvdockd did not start (log above)");
        return -1;
    }
    return 0;
}

char *dt_read_file(const char *path)
{
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return NULL;
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    size_t n;
    while (buf != NULL && (n = fread(buf + len, 1, cap - len - 1, f)) > 0) {
        len += n;
        if (cap - len < 1024) {
            char *nb = realloc(buf, cap * 2);
            if (nb == NULL) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
    }
    fclose(f);
    if (buf)
        buf[len] = '\0';
    return buf;
}

void dt_check_log_clean(const kvd_test_daemon_t *d)
{
    static const char *const reports[] = {"ERROR: AddressSanitizer",
                                          "runtime error:", "ERROR: LeakSanitizer"};
    for (size_t i = 0; i < KVD_ARRAY_SIZE(reports); i++) {
        if (!DT_CHECK(!kvd_test_file_contains(d->log, reports[i]),
                      "kvdockd's log has a sanitizer report (\"%s\")", reports[i]))
            kvd_dump_file(d->log);
    }
}

int dt_stop(kvd_test_daemon_t *d, int sig, int timeout_ms)
{
    int before = dt_failure_count();
    if (d->pid > 0) {
        kill(d->pid, sig);
        int st = 0;
        if (kvd_test_wait_pid(d->pid, timeout_ms, &st) != 0) {
            dt_fail(__FILE__, __LINE__, "kvdockd %d did not exit within %d ms of %s",
                    (int)d->pid, timeout_ms, strsignal(sig));
            kvd_dump_file(d->log);
            /* the harness SIGKILLs it by pid */
            kvd_test_daemon_stop(d, SIGKILL, 5000, NULL);
            return -1;
        }
        d->pid = 0;
        if (!DT_CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0,
                      "kvdockd should exit 0 on %s, got %s %d", strsignal(sig),
                      WIFEXITED(st) ? "status" : "signal",
                      WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st)))
            kvd_dump_file(d->log);
        dt_check_log_clean(d);
    }
    if (d->dir[0])
        kvd_test_daemon_stop(d, SIGTERM, 1000, NULL);
    d->dir[0] = '\0';
    return dt_failure_count() == before ? 0 : -1;
}

int dt_main(const char *name, const char *const *extra,
            void (*run)(const kvd_test_daemon_t *d))
{
    kvd_test_daemon_t d = {0};
    if (dt_start(&d, extra) == 0)
        run(&d);
    dt_stop(&d, SIGTERM, 10000);
    return dt_exit_status(name);
}

/* --------------------------------------------------------------- RPC */

kvd_client_t *dt_connect(const char *socket, bool hello)
{
    kvd_client_t *c = NULL;
    int rc = kvd_client_connect_unix(socket, RPC_TIMEOUT_MS, &c);
    if (!DT_CHECK(rc == KVD_OK, "connect to %s: %s", socket, kvd_status_str(rc)))
        return NULL;
    if (hello) {
        kvd_hello_rep_t h;
        rc = dt_hello(c, "kvdock-test", &h, RPC_TIMEOUT_MS);
        if (!DT_CHECK(rc == KVD_OK, "hello: %s", kvd_status_str(rc))) {
            kvd_client_close(c);
            return NULL;
        }
    }
    return c;
}

int dt_hello(kvd_client_t *c, const char *client_name, kvd_hello_rep_t *rep,
             int timeout_ms)
{
    kvd_msg_t req, r;
    kvd_msg_request(&req, 0, KVD_METHOD_HELLO);
    kvd_strlcpy(req.body.hello_req.client_name, client_name,
                sizeof(req.body.hello_req.client_name));
    req.body.hello_req.pid = (uint32_t)getpid();
    req.body.hello_req.protocol_version = KVD_PROTOCOL_VERSION;
    int rc = kvd_client_call(c, &req, &r, timeout_ms);
    if (rc != KVD_OK)
        return rc;
    rc = r.status;
    if (rc == KVD_OK) {
        *rep = r.body.hello_rep;
        rep->n_ns_ids = 0;
        rep->ns_ids = NULL;
    }
    kvd_msg_clear(&r);
    return rc;
}

int dt_hello_token(kvd_client_t *c, const char *client_name, const char *token,
                   kvd_hello_rep_t *rep, int timeout_ms)
{
    return kvd_client_hello(c, client_name, (const uint8_t *)token, strlen(token),
                            timeout_ms, rep);
}

int dt_token_file(const char *token, char *path, size_t path_len)
{
    snprintf(path, path_len, "/tmp/kvdock-token-XXXXXX");
    int fd = mkstemp(path); /* mode 0600 */
    if (!DT_CHECK(fd >= 0, "mkstemp %s: %s", path, strerror(errno)))
        return -1;
    size_t n = strlen(token);
    bool ok = write(fd, token, n) == (ssize_t)n && write(fd, "\n", 1) == 1;
    close(fd);
    if (!DT_CHECK(ok, "writing the token file %s", path)) {
        unlink(path);
        return -1;
    }
    return 0;
}

int dt_health(kvd_client_t *c, kvd_health_rep_t *out)
{
    kvd_msg_t req, rep;
    kvd_msg_request(&req, 0, KVD_METHOD_HEALTH);
    int rc = kvd_client_call(c, &req, &rep, RPC_TIMEOUT_MS);
    if (rc != KVD_OK)
        return rc;
    if (rep.status != KVD_OK)
        return rep.status;
    if (out)
        *out = rep.body.health_rep;
    return (int)rep.body.health_rep.state;
}

int dt_health_fresh(const char *socket, kvd_health_rep_t *out)
{
    kvd_client_t *c = NULL;
    if (kvd_client_connect_unix(socket, RPC_TIMEOUT_MS, &c) != KVD_OK)
        return -1;
    kvd_hello_rep_t h;
    if (dt_hello(c, "kvdock-test", &h, RPC_TIMEOUT_MS) != KVD_OK) {
        kvd_client_close(c);
        return -1;
    }
    int st = dt_health(c, out);
    kvd_client_close(c);
    return st < 0 ? -1 : st;
}

int dt_stats(kvd_client_t *c, kvd_stats_rep_t *out)
{
    kvd_msg_t *req = malloc(2 * sizeof(kvd_msg_t));
    if (req == NULL)
        return KVD_ERR_NOMEM;
    kvd_msg_t *rep = req + 1;
    kvd_msg_request(req, 0, KVD_METHOD_STATS);
    int rc = kvd_client_call(c, req, rep, RPC_TIMEOUT_MS);
    if (rc == KVD_OK && rep->status != KVD_OK)
        rc = rep->status;
    if (rc == KVD_OK) {
        *out = rep->body.stats_rep;
        /* the namespace table and the nics live in rep's arena: not kept */
        out->n_namespaces = 0;
        out->namespaces = NULL;
        out->n_nics = 0;
        out->nics = NULL;
    }
    kvd_msg_clear(rep);
    free(req);
    return rc;
}

int dt_stats_fresh(const char *socket, kvd_stats_rep_t *out)
{
    kvd_client_t *c = NULL;
    int rc = kvd_client_connect_unix(socket, RPC_TIMEOUT_MS, &c);
    if (rc != KVD_OK)
        return rc;
    kvd_hello_rep_t h;
    rc = dt_hello(c, "kvdock-test", &h, RPC_TIMEOUT_MS);
    if (rc == KVD_OK)
        rc = dt_stats(c, out);
    kvd_client_close(c);
    return rc;
}

/* ------------------------------------------------------- raw sockets */

int dt_raw_connect_unix(const char *path)
{
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof(addr.sun_path))
        return -1;
    strcpy(addr.sun_path, path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    if (connect(fd, (struct sockaddr *)&addr, sizeof(addr)) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

int dt_send_all(int fd, const void *buf, size_t len)
{
    const uint8_t *p = buf;
    while (len > 0) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

/* Reads exactly len bytes before the deadline. 1 done, 0 EOF before any
 * byte, -EPROTO EOF after some, -ETIMEDOUT, -errno. */
static int read_exact(int fd, uint8_t *buf, size_t len, uint64_t deadline_ns)
{
    size_t got = 0;
    while (got < len) {
        uint64_t now = kvd_now_ns();
        if (now >= deadline_ns)
            return -ETIMEDOUT;
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int pr = poll(&p, 1, (int)((deadline_ns - now) / 1000000 + 1));
        if (pr < 0 && errno == EINTR)
            continue;
        if (pr < 0)
            return -errno;
        if (pr == 0)
            return -ETIMEDOUT;
        ssize_t n = recv(fd, buf + got, len - got, 0);
        if (n < 0) {
            if (errno == EINTR || errno == EAGAIN)
                continue;
            return -errno;
        }
        if (n == 0)
            return got == 0 ? 0 : -EPROTO;
        got += (size_t)n;
    }
    return 1;
}

int dt_read_frame(int fd, uint8_t *buf, size_t cap, size_t *len, int timeout_ms)
{
    uint64_t deadline = kvd_now_ns() + (uint64_t)timeout_ms * 1000000ull;
    uint8_t h[4];
    int rc = read_exact(fd, h, sizeof(h), deadline);
    if (rc <= 0)
        return rc;
    uint32_t n = (uint32_t)h[0] | (uint32_t)h[1] << 8 | (uint32_t)h[2] << 16 |
                 (uint32_t)h[3] << 24;
    if (n == 0 || n > cap)
        return -EPROTO;
    rc = read_exact(fd, buf, n, deadline);
    if (rc == 0)
        return -EPROTO;
    if (rc < 0)
        return rc;
    *len = n;
    return 1;
}

int dt_expect_eof(int fd, int timeout_ms)
{
    uint64_t deadline = kvd_now_ns() + (uint64_t)timeout_ms * 1000000ull;
    uint8_t b;
    int rc = read_exact(fd, &b, 1, deadline);
    return rc == 1 ? 1 : rc;
}

int dt_pack(const kvd_msg_t *m, kvd_buf_t *out)
{
    kvd_buf_init(out, KVD_MEM_OTHER);
    return kvd_msg_pack(m, KVD_FRAME_LIMIT_MAX, out);
}

int dt_raw_hello(int fd)
{
    kvd_msg_t req;
    kvd_msg_request(&req, 1, KVD_METHOD_HELLO);
    kvd_strlcpy(req.body.hello_req.client_name, "kvdock-test-raw",
                sizeof(req.body.hello_req.client_name));
    req.body.hello_req.pid = (uint32_t)getpid();
    req.body.hello_req.protocol_version = KVD_PROTOCOL_VERSION;
    kvd_buf_t b;
    int rc = dt_pack(&req, &b);
    if (rc == KVD_OK)
        rc = dt_send_all(fd, b.data, b.len);
    kvd_buf_free(&b);
    if (!DT_CHECK(rc == 0, "raw Hello: cannot send it (%d)", rc))
        return -1;
    static uint8_t frame[1 << 16];
    size_t len = 0;
    dt_wire_env_t env;
    rc = dt_read_frame(fd, frame, sizeof(frame), &len, RPC_TIMEOUT_MS);
    if (!DT_CHECK(rc == 1 && dt_wire_parse(frame, len, &env) == 0,
                  "raw Hello: no reply frame (%d)", rc))
        return -1;
    if (!DT_CHECK(env.reply && env.id == 1 && !env.has_error,
                  "raw Hello: id %llu error %lld '%s'", (unsigned long long)env.id,
                  (long long)env.error_code, env.error_message))
        return -1;
    return 0;
}

/* Reads a base-128 varint; returns bytes used or 0 on malformed input. */
static size_t varint(const uint8_t *p, size_t len, uint64_t *out)
{
    uint64_t v = 0;
    for (size_t i = 0; i < len && i < 10; i++) {
        v |= (uint64_t)(p[i] & 0x7f) << (7 * i);
        if (!(p[i] & 0x80)) {
            *out = v;
            return i + 1;
        }
    }
    return 0;
}

/* Walks the fields of one message; calls fn for each. -1 if malformed. */
typedef void (*field_fn)(void *ctx, uint32_t field, uint32_t wire, uint64_t v,
                         const uint8_t *data, size_t data_len);

static int walk_fields(const uint8_t *p, size_t len, field_fn fn, void *ctx)
{
    size_t off = 0;
    while (off < len) {
        uint64_t key, v = 0;
        size_t k = varint(p + off, len - off, &key);
        if (k == 0)
            return -1;
        off += k;
        uint32_t field = (uint32_t)(key >> 3), wire = (uint32_t)(key & 7);
        const uint8_t *data = NULL;
        size_t dlen = 0;
        switch (wire) {
        case 0:
            k = varint(p + off, len - off, &v);
            if (k == 0)
                return -1;
            off += k;
            break;
        case 1:
            if (len - off < 8)
                return -1;
            off += 8;
            break;
        case 2:
            k = varint(p + off, len - off, &v);
            if (k == 0 || v > len - off - k)
                return -1;
            data = p + off + k;
            dlen = (size_t)v;
            off += k + (size_t)v;
            break;
        case 5:
            if (len - off < 4)
                return -1;
            off += 4;
            break;
        default: return -1;
        }
        if (field == 0)
            return -1;
        fn(ctx, field, wire, v, data, dlen);
    }
    return 0;
}

static void error_field(void *ctx, uint32_t field, uint32_t wire, uint64_t v,
                        const uint8_t *data, size_t dlen)
{
    dt_wire_env_t *e = ctx;
    if (field == 1 && wire == 0) /* sint32: zigzag */
        e->error_code = (int64_t)(v >> 1) ^ -(int64_t)(v & 1);
    if (field == 2 && wire == 2) {
        e->error_message_len = dlen;
        e->error_message_utf8 = dt_utf8_valid(data, dlen);
        size_t n = KVD_MIN(dlen, sizeof(e->error_message) - 1);
        memcpy(e->error_message, data, n);
        e->error_message[n] = '\0';
    }
}

/* What walking an Envelope collects: the fields and whether the nested
 * Error was well-formed. */
typedef struct env_walk {
    dt_wire_env_t *env;
    bool bad;
} env_walk_t;

static void env_field(void *ctx, uint32_t field, uint32_t wire, uint64_t v,
                      const uint8_t *data, size_t dlen)
{
    env_walk_t *w = ctx;
    dt_wire_env_t *e = w->env;
    if (field == 1 && wire == 0)
        e->id = v;
    else if (field == 2 && wire == 0)
        e->method = v;
    else if (field == 3 && wire == 0)
        e->reply = v != 0;
    else if (field == 4 && wire == 2) {
        e->has_error = true;
        if (walk_fields(data, dlen, error_field, e) != 0)
            w->bad = true;
    } else if (field >= 10 && field <= 15)
        e->body_field = (int)field;
}

bool dt_utf8_valid(const uint8_t *p, size_t n)
{
    static const uint32_t min_of_len[5] = {0, 0, 0x80, 0x800, 0x10000};
    for (size_t i = 0; i < n;) {
        uint32_t c = p[i];
        size_t k = c < 0x80             ? 1
                   : (c & 0xe0) == 0xc0 ? 2
                   : (c & 0xf0) == 0xe0 ? 3
                   : (c & 0xf8) == 0xf0 ? 4
                                        : 0;
        if (k == 0 || k > n - i)
            return false;
        if (k > 1)
            c &= 0x7fu >> k;
        for (size_t j = 1; j < k; j++) {
            if ((p[i + j] & 0xc0) != 0x80)
                return false;
            c = c << 6 | (p[i + j] & 0x3fu);
        }
        if (c < min_of_len[k] || c > 0x10ffff || (c >= 0xd800 && c <= 0xdfff))
            return false;
        i += k;
    }
    return true;
}

int dt_wire_parse(const uint8_t *p, size_t len, dt_wire_env_t *out)
{
    memset(out, 0, sizeof(*out));
    env_walk_t w = {.env = out, .bad = false};
    if (walk_fields(p, len, env_field, &w) != 0 || w.bad)
        return -1;
    return 0;
}

/* ------------------------------------------------------ processes */

int dt_cli(char *out, size_t out_len, const char *const *args)
{
    char *argv[32];
    size_t n = 0;
    argv[n++] = (char *)kvd_test_bin("kvdock");
    for (size_t i = 0; args[i] && n < KVD_ARRAY_SIZE(argv) - 1; i++)
        argv[n++] = (char *)args[i];
    argv[n] = NULL;
    return kvd_test_run(argv, out, out_len, 20000);
}

int dt_cli_at(char *out, size_t out_len, const char *socket, const char *const *args)
{
    const char *argv[30];
    size_t n = 0;
    argv[n++] = "--socket";
    argv[n++] = socket;
    for (size_t i = 0; args[i] && n < KVD_ARRAY_SIZE(argv) - 1; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    return dt_cli(out, out_len, argv);
}

int dt_sh(char *out, size_t out_len, const char *script)
{
    char *argv[] = {"/bin/sh", "-c", (char *)script, NULL};
    return kvd_test_run(argv, out, out_len, 30000);
}

/* --------------------------------------------------------------- JSON */

static const char *json_ws(const char *p)
{
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
        p++;
    return p;
}

static const char *json_value(const char *p, int depth);

static const char *json_string(const char *p)
{
    if (*p != '"')
        return NULL;
    for (p++; *p && *p != '"'; p++) {
        if ((unsigned char)*p < 0x20)
            return NULL;
        if (*p == '\\') {
            p++;
            if (*p == 'u') {
                for (int i = 1; i <= 4; i++)
                    if (!strchr("0123456789abcdefABCDEF", p[i]) || p[i] == '\0')
                        return NULL;
                p += 4;
            } else if (!*p || !strchr("\"\\/bfnrt", *p)) {
                return NULL;
            }
        }
    }
    return *p == '"' ? p + 1 : NULL;
}

static const char *json_number(const char *p)
{
    const char *s = p;
    if (*p == '-')
        p++;
    if (*p < '0' || *p > '9')
        return NULL;
    if (*p == '0')
        p++;
    else
        while (*p >= '0' && *p <= '9')
            p++;
    if (*p == '.') {
        p++;
        if (*p < '0' || *p > '9')
            return NULL;
        while (*p >= '0' && *p <= '9')
            p++;
    }
    if (*p == 'e' || *p == 'E') {
        p++;
        if (*p == '+' || *p == '-')
            p++;
        if (*p < '0' || *p > '9')
            return NULL;
        while (*p >= '0' && *p <= '9')
            p++;
    }
    return p > s ? p : NULL;
}

static const char *json_container(const char *p, int depth, char close, bool object)
{
    p = json_ws(p + 1);
    if (*p == close)
        return p + 1;
    for (;;) {
        if (object) {
            p = json_string(json_ws(p));
            if (p == NULL)
                return NULL;
            p = json_ws(p);
            if (*p++ != ':')
                return NULL;
        }
        p = json_value(p, depth + 1);
        if (p == NULL)
            return NULL;
        p = json_ws(p);
        if (*p == close)
            return p + 1;
        if (*p++ != ',')
            return NULL;
    }
}

static const char *json_value(const char *p, int depth)
{
    if (depth > 64)
        return NULL;
    p = json_ws(p);
    switch (*p) {
    case '{': return json_container(p, depth, '}', true);
    case '[': return json_container(p, depth, ']', false);
    case '"': return json_string(p);
    case 't': return strncmp(p, "true", 4) == 0 ? p + 4 : NULL;
    case 'f': return strncmp(p, "false", 5) == 0 ? p + 5 : NULL;
    case 'n': return strncmp(p, "null", 4) == 0 ? p + 4 : NULL;
    default: return json_number(p);
    }
}

bool dt_json_valid(const char *text)
{
    const char *end = json_value(text, 0);
    return end != NULL && *json_ws(end) == '\0';
}

bool dt_json_u64(const char *json, const char *after, const char *key, uint64_t *out)
{
    const char *p = json;
    if (after != NULL) {
        p = strstr(json, after);
        if (p == NULL)
            return false;
    }
    char pat[128];
    snprintf(pat, sizeof(pat), "\"%s\":", key);
    p = strstr(p, pat);
    if (p == NULL)
        return false;
    p = json_ws(p + strlen(pat));
    if (*p < '0' || *p > '9')
        return false;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(p, &end, 10);
    if (errno != 0)
        return false;
    *out = v;
    return true;
}

/* ------------------------------------------------------------ network */

int dt_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_in a = {
        .sin_family = AF_INET, .sin_port = 0, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(a);
    int port = -1;
    if (bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    close(fd);
    return port;
}

int dt_http_get(int port, const char *path, char *body, size_t body_len, int timeout_ms)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    char req[256];
    int n = snprintf(req, sizeof(req), "GET %s HTTP/1.0\r\nHost: 127.0.0.1:%d\r\n\r\n",
                     path, port);
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0 ||
        dt_send_all(fd, req, (size_t)n) != 0) {
        close(fd);
        return -1;
    }
    /* read the whole response: HTTP/1.0 ends it with EOF */
    size_t cap = 1 << 20, used = 0;
    char *resp = malloc(cap);
    uint64_t deadline = kvd_now_ns() + (uint64_t)timeout_ms * 1000000ull;
    int status = -1;
    while (resp != NULL && used < cap - 1) {
        uint64_t now = kvd_now_ns();
        if (now >= deadline)
            break;
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int pr = poll(&p, 1, (int)((deadline - now) / 1000000 + 1));
        if (pr < 0 && errno == EINTR)
            continue;
        if (pr <= 0)
            break;
        ssize_t r = recv(fd, resp + used, cap - 1 - used, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            if (r == 0)
                status = 0; /* complete */
            break;
        }
        used += (size_t)r;
    }
    close(fd);
    if (resp == NULL)
        return -1;
    resp[used] = '\0';
    int code = -1;
    if (status == 0 && sscanf(resp, "HTTP/1.%*d %d", &code) == 1) {
        const char *b = strstr(resp, "\r\n\r\n");
        kvd_strlcpy(body, b ? b + 4 : "", body_len);
    } else {
        code = -1;
    }
    free(resp);
    return code;
}

/* The TCP sockets in LISTEN state that pid holds (by the inodes of its
 * fds in /proc/PID/net/tcp and tcp6); how many of them are on loopback
 * into *on_lo. -1 when its fds cannot be read. */
int dt_tcp_listeners(pid_t pid, int *on_lo)
{
    char path[128], link[128];
    unsigned long inodes[512];
    size_t n = 0;
    *on_lo = 0;
    snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
    DIR *d = opendir(path);
    if (d == NULL)
        return -1;
    for (struct dirent *e; (e = readdir(d)) != NULL && n < KVD_ARRAY_SIZE(inodes);) {
        char fp[512];
        snprintf(fp, sizeof(fp), "%s/%s", path, e->d_name);
        ssize_t k = readlink(fp, link, sizeof(link) - 1);
        if (k <= 0)
            continue;
        link[k] = '\0';
        unsigned long ino;
        if (sscanf(link, "socket:[%lu]", &ino) == 1)
            inodes[n++] = ino;
    }
    closedir(d);
    int found = 0;
    for (int v6 = 0; v6 <= 1; v6++) {
        snprintf(path, sizeof(path), "/proc/%d/net/tcp%s", (int)pid, v6 ? "6" : "");
        FILE *f = fopen(path, "r");
        if (f == NULL)
            continue;
        char line[512];
        while (fgets(line, sizeof(line), f) != NULL) {
            char local[64], remote[64];
            unsigned st;
            unsigned long ino;
            if (sscanf(line, " %*d: %63s %63s %x %*s %*s %*s %*s %*s %lu", local, remote,
                       &st, &ino) != 4 ||
                st != 0x0A)
                continue;
            bool ours = false;
            for (size_t i = 0; i < n && !ours; i++)
                ours = inodes[i] == ino;
            if (!ours)
                continue;
            found++;
            /* 127.x.x.x little-endian ("..7F"), ::1, ::ffff:127.x */
            bool lo = v6 ? strncmp(local, "00000000000000000000000001000000", 32) == 0 ||
                               (strncmp(local, "0000000000000000FFFF0000", 24) == 0 &&
                                strncmp(local + 30, "7F", 2) == 0)
                         : strncmp(local + 6, "7F", 2) == 0;
            *on_lo += lo;
        }
        fclose(f);
    }
    return found;
}

pid_t dt_child_of(pid_t pid)
{
    char path[64], buf[256] = "";
    snprintf(path, sizeof(path), "/proc/%d/task/%d/children", (int)pid, (int)pid);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return -1;
    int child = -1;
    if (fgets(buf, sizeof(buf), f) == NULL || sscanf(buf, "%d", &child) != 1)
        child = -1;
    fclose(f);
    return child;
}
