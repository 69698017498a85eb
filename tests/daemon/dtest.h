/*
 * dtest.h - small helpers shared by the daemon integration tests (on top of
 * tests/harness.h, whose DT_CHECK counts failures without stopping): raw
 * sockets for speaking broken protocol, a
 * minimal reader of the Envelope wire format, RPC shortcuts, running the CLI
 * and a shell, a tiny JSON validator and field finder, a free loopback port,
 * an HTTP/1.0 GET.
 *
 * Threading: DT_CHECK may be used from several threads (the failure counter
 * is atomic); everything else belongs to the calling thread.
 */
#ifndef KVD_TEST_DTEST_H
#define KVD_TEST_DTEST_H

#include "harness.h"
#include "kvd_common.h"
#include "kvd_proto.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Checks (DT_CHECK, dt_fail, dt_exit_status) are the harness's. */

/* --------------------------------------------------------- daemons */

/* The pool size every test uses unless it needs another one. */
#define DT_POOL       "64M"
#define DT_POOL_BYTES (64ull * 1024 * 1024)

/*
 * Starts a daemon with `--pool-size 64M --usage-interval 0` in front of
 * `extra` (NULL-terminated, may be NULL) and waits until it is ready.
 * Returns 0, or -1 after recording a failure.
 */
int dt_start(kvd_test_daemon_t *d, const char *const *extra);

/*
 * Stops a daemon started by the harness with `sig` and checks that it
 * exited 0 within timeout_ms and that its log has no sanitizer report; then
 * removes its directory. Safe to call twice and on a daemon that never
 * started (pid 0). Returns 0 when every check passed.
 */
int dt_stop(kvd_test_daemon_t *d, int sig, int timeout_ms);

/* A test's whole main: starts a daemon with extra arguments (NULL none),
 * runs run on it when it started, stops it with SIGTERM (10 s), and
 * returns the exit status of test `name` (dt_exit_status). */
int dt_main(const char *name, const char *const *extra,
            void (*run)(const kvd_test_daemon_t *d));

/* Checks the log for "ERROR: AddressSanitizer", "runtime error:",
 * "LeakSanitizer"; records a failure per report found. */
void dt_check_log_clean(const kvd_test_daemon_t *d);

/* Copies the whole log into a malloc'd NUL-terminated string (or NULL). */
char *dt_read_file(const char *path);

/* --------------------------------------------------------------- RPC */

/* Connects, optionally says Hello; NULL after recording a failure. */
kvd_client_t *dt_connect(const char *socket, bool hello);

/* Hello on c with this process's pid and client_name, no namespaces;
 * fills *rep on success (without its variable parts). Returns KVD_OK, the
 * call's error or the daemon's refusal. */
int dt_hello(kvd_client_t *c, const char *client_name, kvd_hello_rep_t *rep,
             int timeout_ms);

/* Hello with a token (token_len bytes), as dt_hello. */
int dt_hello_token(kvd_client_t *c, const char *client_name, const char *token,
                   kvd_hello_rep_t *rep, int timeout_ms);

/*
 * Writes token (and a newline, which the daemon trims) to a fresh file
 * /tmp/kvdock-token-XXXXXX of mode 0600, for --auth-token-file and
 * --token-file; path gets its name. Returns 0, or -1 after recording a
 * failure. The caller unlinks it.
 */
int dt_token_file(const char *token, char *path, size_t path_len);

/* Calls Health on a fresh connection; returns the state or -1 (no
 * failure recorded: callers check). Fills *rep when not NULL. */
int dt_health_fresh(const char *socket, kvd_health_rep_t *rep);

/* Calls Health on c; returns the state or a negative status. */
int dt_health(kvd_client_t *c, kvd_health_rep_t *rep);

/* Stats on a fresh connection into *out (malloc-free: out is the caller's).
 * Returns KVD_OK or a negative status. */
int dt_stats_fresh(const char *socket, kvd_stats_rep_t *out);
int dt_stats(kvd_client_t *c, kvd_stats_rep_t *out);

/* ------------------------------------------------------- raw sockets */

/* Connects a plain blocking Unix stream socket; -1 on failure. */
int dt_raw_connect_unix(const char *path);

/* Says Hello (id 1, no namespaces, no token) on a raw socket and reads its
 * reply: the daemon serves nothing else before it. 0, or -1 after
 * recording a failure. */
int dt_raw_hello(int fd);

/* The TCP sockets in LISTEN state that pid holds (by the inodes of its
 * fds in /proc/PID/net/tcp and tcp6); how many of them are on loopback
 * into *on_lo. -1 when its fds cannot be read. */
int dt_tcp_listeners(pid_t pid, int *on_lo);

/* The first child of pid (a daemon's UCX server), or -1. */
pid_t dt_child_of(pid_t pid);

/* Writes all of buf (MSG_NOSIGNAL); 0 or -errno. */
int dt_send_all(int fd, const void *buf, size_t len);

/*
 * Reads one frame within timeout_ms: returns 1 with the payload in buf
 * (*len its length), 0 on a clean EOF before any byte of a frame, or a
 * negative value: -ETIMEDOUT, -EPROTO (EOF inside a frame or a frame bigger
 * than cap), -errno.
 */
int dt_read_frame(int fd, uint8_t *buf, size_t cap, size_t *len, int timeout_ms);

/* Waits up to timeout_ms for EOF: 0 on EOF, 1 when data came instead,
 * -ETIMEDOUT, -errno. */
int dt_expect_eof(int fd, int timeout_ms);

/* A request frame (header + payload) built with kvd_msg_pack. */
int dt_pack(const kvd_msg_t *m, kvd_buf_t *out);

/*
 * The top-level fields of an Envelope read straight from the wire, without
 * proto/'s decoder: so a test can tell what the daemon sent apart from
 * whether kvd_msg_decode accepts it.
 */
typedef struct dt_wire_env {
    uint64_t id;
    uint64_t method;
    bool reply;
    bool has_error;
    int64_t error_code;
    char error_message[KVD_ERROR_MAX];
    size_t error_message_len; /* on the wire (error_message may be cut) */
    bool error_message_utf8;  /* the whole text on the wire, by dt_utf8_valid */
    int body_field;           /* field number of the oneof body, 0 = none */
} dt_wire_env_t;

/* UTF-8 per RFC 3629 (no overlong forms, surrogates or code points above
 * U+10FFFF), checked here rather than by common/'s helper. */
bool dt_utf8_valid(const uint8_t *p, size_t n);

/* Returns 0, or -1 when the bytes are not well-formed protobuf. */
int dt_wire_parse(const uint8_t *p, size_t len, dt_wire_env_t *out);

/* ------------------------------------------------------ processes */

/* Runs `kvdock` with the NULL-terminated args; stdout into out. Returns the
 * exit status, -1 when it did not exit in time. */
int dt_cli(char *out, size_t out_len, const char *const *args);

/* dt_cli with `--socket socket` before args. */
int dt_cli_at(char *out, size_t out_len, const char *socket, const char *const *args);

/* Runs `/bin/sh -c script`, stdout into out; exit status or -1. The
 * variables KVDOCK and KVDOCKD are in its environment. */
int dt_sh(char *out, size_t out_len, const char *script);

/* --------------------------------------------------------------- JSON */

/* True when text is one well-formed JSON value (trailing whitespace ok). */
bool dt_json_valid(const char *text);

/*
 * Finds `"key":` in json at or after the first occurrence of `after` (NULL:
 * from the start) and parses the unsigned number behind it. Returns true
 * with *out set; false when absent or not a number.
 */
bool dt_json_u64(const char *json, const char *after, const char *key, uint64_t *out);

/* ------------------------------------------------------------ network */

/* A TCP port on 127.0.0.1 that was free a moment ago (bind port 0). */
int dt_free_port(void);

/*
 * HTTP/1.0 GET of `path` from 127.0.0.1:port. Returns the status code (and
 * the body, NUL-terminated, in body), or -1 on a transport failure.
 */
int dt_http_get(int port, const char *path, char *body, size_t body_len, int timeout_ms);

#endif
