/*
 * Description: a connection cannot hold a slot or buffers for ever. Issue
 * 11: there was no Hello, idle or partial-frame timeout and the buffers
 * were uncapped. Daemon 1 (--hello-timeout-ms 300, --frame-timeout-ms
 * 300): (a) a client that connects and sends nothing, (b) one that sends
 * half a Hello frame and (c) one that says Hello and then sends half a
 * frame are each closed (EOF, within a bounded wait, after at most an
 * error frame); the log says which limit; (d) a client that said Hello and
 * stays idle, and one connected throughout, still answer Health; Stats
 * counts the timeouts. Daemon 2 (--max-frame 1M, --max-conn-buffer 3M, no
 * timeouts): three clients each say Hello and send 900 KiB of a 1 MiB
 * frame; the buffers of the first two fit (about 1 MiB each), the third
 * would pass 3 MiB and is closed with a NO_SPACE error frame, counted in
 * Stats; the other connections and a fresh client still work.
 */
#include "dtest.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static uint8_t frame[1 << 16];

/* Waits (bounded) for the daemon to end the connection: an error frame
 * with `status` may come first; then EOF or a reset. */
static void expect_closed(int fd, int status, const char *what)
{
    size_t len = 0;
    int rc = dt_read_frame(fd, frame, sizeof(frame), &len, 20000);
    if (rc == 1) {
        dt_wire_env_t w;
        DT_CHECK(dt_wire_parse(frame, len, &w) == 0 && w.has_error &&
                     w.error_code == status,
                 "(%s) the frame before the close should be error %d", what, status);
        rc = dt_expect_eof(fd, 20000);
    }
    DT_CHECK(rc == 0 || rc == -ECONNRESET, "(%s) the daemon should close it: %s", what,
             rc == -ETIMEDOUT ? "still open" : strerror(-rc));
}

/* A raw connection that has said Hello (its reply read). */
static int raw_hello(const char *socket, const char *name)
{
    int fd = dt_raw_connect_unix(socket);
    if (!DT_CHECK(fd >= 0, "(%s) connect: %s", name, strerror(errno)))
        return -1;
    kvd_msg_t m;
    kvd_msg_request(&m, 1, KVD_METHOD_HELLO);
    kvd_strlcpy(m.body.hello_req.client_name, name, sizeof(m.body.hello_req.client_name));
    m.body.hello_req.protocol_version = KVD_PROTOCOL_VERSION;
    kvd_buf_t b;
    size_t len = 0;
    int rc = dt_pack(&m, &b);
    if (rc == KVD_OK)
        rc = dt_send_all(fd, b.data, b.len);
    kvd_buf_free(&b);
    if (rc == 0)
        rc = dt_read_frame(fd, frame, sizeof(frame), &len, 10000) == 1 ? 0 : -1;
    dt_wire_env_t w;
    if (!DT_CHECK(rc == 0 && dt_wire_parse(frame, len, &w) == 0 && !w.has_error,
                  "(%s) hello failed", name)) {
        close(fd);
        return -1;
    }
    return fd;
}

static void timeouts(void)
{
    const char *extra[] = {"--hello-timeout-ms", "300", "--frame-timeout-ms", "300",
                           NULL};
    kvd_test_daemon_t d;
    if (dt_start(&d, extra) != 0) {
        dt_stop(&d, SIGTERM, 10000);
        return;
    }
    kvd_client_t *steady = dt_connect(d.socket, true);
    int idle = raw_hello(d.socket, "idle-after-hello");

    /* (a) connects, sends nothing */
    int a = dt_raw_connect_unix(d.socket);
    /* (b) half a Hello frame: its header and 3 of its bytes */
    int b = dt_raw_connect_unix(d.socket);
    if (b >= 0) {
        static const uint8_t half[] = {20, 0, 0, 0, 0x08, 0x01, 0x10};
        DT_CHECK(dt_send_all(b, half, sizeof(half)) == 0, "(b) send");
    }
    /* (c) Hello, then half a frame */
    int c = raw_hello(d.socket, "half-a-frame");
    if (c >= 0) {
        static const uint8_t half[] = {100, 0, 0, 0, 0x08, 0x02};
        DT_CHECK(dt_send_all(c, half, sizeof(half)) == 0, "(c) send");
    }
    if (DT_CHECK(a >= 0, "(a) connect"))
        expect_closed(a, KVD_ERR_TIMEOUT, "a: silent");
    if (DT_CHECK(b >= 0, "(b) connect"))
        expect_closed(b, KVD_ERR_TIMEOUT, "b: half a hello");
    if (c >= 0)
        expect_closed(c, KVD_ERR_TIMEOUT, "c: half a frame after hello");
    DT_CHECK(kvd_test_file_contains(d.log, "--hello-timeout-ms"),
             "the log should name --hello-timeout-ms");
    DT_CHECK(kvd_test_file_contains(d.log, "--frame-timeout-ms"),
             "the log should name --frame-timeout-ms");

    /* (d) the others are unaffected: idle after Hello is fine */
    kvd_health_rep_t h;
    if (steady != NULL)
        DT_CHECK(dt_health(steady, &h) == KVD_HEALTH_READY,
                 "(d) the long-lived client should still be served");
    if (idle >= 0) {
        kvd_msg_t m;
        kvd_msg_request(&m, 2, KVD_METHOD_HEALTH);
        kvd_buf_t buf;
        size_t len = 0;
        int rc = dt_pack(&m, &buf);
        if (rc == KVD_OK)
            rc = dt_send_all(idle, buf.data, buf.len);
        kvd_buf_free(&buf);
        dt_wire_env_t w;
        DT_CHECK(rc == 0 && dt_read_frame(idle, frame, sizeof(frame), &len, 10000) == 1 &&
                     dt_wire_parse(frame, len, &w) == 0 && !w.has_error && w.id == 2,
                 "(d) the idle client that said Hello should still be served");
        close(idle);
    }
    kvd_stats_rep_t st;
    if (DT_CHECK(dt_stats_fresh(d.socket, &st) == KVD_OK, "stats"))
        DT_CHECK(st.connections_timed_out >= 3,
                 "Stats connections_timed_out %llu, want 3",
                 (unsigned long long)st.connections_timed_out);
    if (a >= 0)
        close(a);
    if (b >= 0)
        close(b);
    if (c >= 0)
        close(c);
    kvd_client_close(steady);
    dt_stop(&d, SIGTERM, 10000);
}

static void buffer_cap(void)
{
    const char *extra[] = {"--max-frame",
                           "1M",
                           "--max-conn-buffer",
                           "3M",
                           "--hello-timeout-ms",
                           "0",
                           "--frame-timeout-ms",
                           "0",
                           NULL};
    kvd_test_daemon_t d;
    if (dt_start(&d, extra) != 0) {
        dt_stop(&d, SIGTERM, 10000);
        return;
    }
    kvd_client_t *steady = dt_connect(d.socket, true);
    enum { PART = 900 * 1024 };
    uint8_t *part = calloc(1, 4 + PART);
    int fds[3] = {-1, -1, -1};
    if (part == NULL)
        goto out;
    part[2] = 0x10; /* a header for 1 MiB (0x100000), then 900 KiB of it */
    for (int i = 0; i < 3; i++) {
        char name[16];
        snprintf(name, sizeof(name), "holder-%d", i);
        fds[i] = raw_hello(d.socket, name);
        if (fds[i] < 0)
            continue;
        int rc = dt_send_all(fds[i], part, 4 + PART);
        /* the third may be closed while it sends */
        if (i < 2)
            DT_CHECK(rc == 0, "(%s) send: %s", name, strerror(-rc));
        /* a Health round trip on the steady connection: the daemon has
         * read what it will read of this one before the next starts */
        kvd_health_rep_t h;
        if (steady != NULL)
            DT_CHECK(dt_health(steady, &h) == KVD_HEALTH_READY, "(%s) steady health",
                     name);
    }
    if (fds[2] >= 0)
        expect_closed(fds[2], KVD_ERR_NO_SPACE, "the third holder");
    for (int i = 0; i < 2; i++)
        if (fds[i] >= 0)
            DT_CHECK(dt_expect_eof(fds[i], 200) == -ETIMEDOUT,
                     "holder %d should stay open: its buffer fits", i);
    DT_CHECK(kvd_test_file_contains(d.log, "--max-conn-buffer"),
             "the log should name --max-conn-buffer");
    kvd_stats_rep_t st;
    if (DT_CHECK(dt_stats_fresh(d.socket, &st) == KVD_OK, "a fresh client's stats"))
        DT_CHECK(st.connections_over_buffer == 1,
                 "Stats connections_over_buffer %llu, want 1",
                 (unsigned long long)st.connections_over_buffer);
out:
    for (int i = 0; i < 3; i++)
        if (fds[i] >= 0)
            close(fds[i]);
    free(part);
    kvd_client_close(steady);
    dt_stop(&d, SIGTERM, 10000);
}

int main(void)
{
    timeouts();
    buffer_cap();
    return dt_exit_status("daemon/conn_limits");
}
