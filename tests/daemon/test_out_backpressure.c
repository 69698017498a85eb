/*
 * Description: a client that sends without reading cannot grow the daemon.
 * Against one live kvdockd (--pool-size 64M --usage-interval 0) with 64
 * namespaces of ~200-character names registered (so that one Stats reply
 * is some 14 KiB), a raw Unix connection pipelines up to 60000 Stats
 * requests (hand-encoded: 4-byte LE length + Envelope{1: id, 2: method 3},
 * ids 1..N) from a writer thread that stops once the socket has not taken a
 * byte for 2 s, and reads no reply meanwhile. While it runs and stalls:
 *   - the daemon's VmRSS (/proc/<pid>/status) grows by less than 200 MB
 *     (the output high-water mark is 8 MiB) and its connection buffers
 *     (Stats memory.conn_bytes) stay under 32 MiB: an output buffer
 *     that crossed the mark once (16 MiB of capacity) and the input. A
 *     daemon that serves every frame of a 64 KiB read before looking at its
 *     output queues ~7000 replies (~100 MB) per read; one that reads on
 *     regardless queues them all;
 *   - another client's Health answers ready, every time it is asked.
 * Then the replies are read back on the raw socket (a frame the writer left
 * half-sent is completed meanwhile): exactly one reply per request, each
 * decoding (kvd_msg_decode) as a Stats reply with status OK and the 64
 * namespaces, ids in order 1..N; after the burst, with the connection still
 * open, the connection buffers are back under 4 MiB (the big buffers given
 * back once drained). The daemon exits 0 on SIGTERM with a clean log.
 *
 * Nothing is timed: the 2 s stall ends the writer, and the other waits are
 * deadlines on reads that fail the test when they pass.
 */
#include "test_store_util.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define N_NAMESPACES    64
#define NAME_CHARS      200
#define N_REQUESTS      60000
#define STALL_MS        2000
#define RSS_GROWTH_MAX  (200ull * 1000 * 1000)
#define CONN_BUSY_MAX   (32ull << 20)
#define CONN_IDLE_MAX   (4ull << 20)
#define READ_IDLE_MS    10000
#define REPLY_FRAME_MAX (4u << 20)
#define SNDBUF_BYTES    32768

/* ------------------------------------------------------------ requests */

/* The request stream: every frame back to back, and where each ends. */
typedef struct stream {
    uint8_t *bytes;
    size_t len;
    size_t *frame_end; /* frame_end[i]: offset just past request id i + 1 */
    size_t n;
} stream_t;

static size_t put_varint(uint8_t *p, uint64_t v)
{
    size_t n = 0;
    do {
        p[n++] = (uint8_t)((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
        v >>= 7;
    } while (v != 0);
    return n;
}

/* Builds n Stats requests with ids 1..n, encoded by hand. */
static int stream_build(stream_t *s, size_t n)
{
    s->bytes = malloc(n * 20);
    s->frame_end = calloc(n, sizeof(size_t));
    if (s->bytes == NULL || s->frame_end == NULL)
        return -1;
    size_t off = 0;
    for (size_t i = 0; i < n; i++) {
        uint8_t payload[16];
        size_t len = 0;
        payload[len++] = 0x08; /* field 1 (id), varint */
        len += put_varint(payload + len, i + 1);
        payload[len++] = 0x10; /* field 2 (method), varint */
        payload[len++] = KVD_METHOD_STATS;
        uint8_t *f = s->bytes + off;
        f[0] = (uint8_t)len;
        f[1] = f[2] = f[3] = 0;
        memcpy(f + 4, payload, len);
        off += 4 + len;
        s->frame_end[i] = off;
    }
    s->len = off;
    s->n = n;
    return 0;
}

/* Requests whose frame is wholly within the first `sent` bytes. */
static size_t frames_in(const stream_t *s, size_t sent)
{
    size_t lo = 0, hi = s->n; /* frame_end is increasing: binary search */
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (s->frame_end[mid] <= sent)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* -------------------------------------------------------------- writer */

typedef struct writer {
    int fd;
    const stream_t *s;
    _Atomic size_t sent; /* bytes the socket took */
    atomic_bool done;
    bool stalled; /* stopped because the socket took nothing for STALL_MS */
    int error;    /* errno of a failed send, 0 if none */
} writer_t;

/* Sends the stream until it is all out or the socket stalls. */
static void *writer_main(void *arg)
{
    writer_t *w = arg;
    size_t off = 0;
    while (off < w->s->len) {
        size_t chunk = KVD_MIN(w->s->len - off, (size_t)65536);
        ssize_t n = send(w->fd, w->s->bytes + off, chunk, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
            off += (size_t)n;
            atomic_store(&w->sent, off);
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno != EAGAIN) {
            w->error = errno;
            break;
        }
        struct pollfd p = {.fd = w->fd, .events = POLLOUT};
        int r = poll(&p, 1, STALL_MS);
        if (r == 0) {
            w->stalled = true;
            break;
        }
        if (r < 0 && errno != EINTR) {
            w->error = errno;
            break;
        }
    }
    atomic_store(&w->done, true);
    return NULL;
}

/* ------------------------------------------------------------- helpers */

/* VmRSS of pid in bytes; 0 when it cannot be read. */
static uint64_t rss_of(pid_t pid)
{
    char path[64], line[256];
    snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return 0;
    uint64_t kb = 0;
    while (fgets(line, sizeof(line), f))
        if (sscanf(line, "VmRSS: %llu kB", (unsigned long long *)&kb) == 1)
            break;
    fclose(f);
    return kb * 1024;
}

/* The daemon's connection-buffer bytes (Stats memory.conn_bytes), or
 * UINT64_MAX when Stats failed. */
static uint64_t conn_bytes(const char *socket)
{
    kvd_stats_rep_t st;
    int rc = dt_stats_fresh(socket, &st);
    if (!DT_CHECK(rc == KVD_OK, "Stats on a fresh connection: %s", kvd_status_str(rc)))
        return UINT64_MAX;
    return st.memory.conn_bytes;
}

static bool register_namespaces(const char *socket)
{
    ts_client_t t;
    if (ts_open(&t, socket, NULL, 0, false) != 0)
        return false;
    static kvd_ns_spec_t specs[N_NAMESPACES];
    for (int i = 0; i < N_NAMESPACES; i++) {
        char name[NAME_CHARS + 1];
        int n = snprintf(name, sizeof(name), "backpressure/%02d/", i);
        memset(name + n, 'a' + i % 26, NAME_CHARS - (size_t)n);
        name[NAME_CHARS] = '\0';
        specs[i] = ts_spec(name, 4096);
    }
    uint32_t ids[N_NAMESPACES];
    ts_err_t e;
    int rc = ts_register(t.c, specs, N_NAMESPACES, ids, &e);
    ts_close(&t);
    return DT_CHECK(rc == KVD_OK, "register %d namespaces: %s (%s)", N_NAMESPACES,
                    kvd_status_str(rc), e.text);
}

/* ------------------------------------------------------------- reading */

typedef struct reader {
    int fd;
    uint8_t *buf;
    size_t cap, len;
    size_t got;       /* replies read */
    uint64_t bytes;   /* reply bytes read */
    size_t max_frame; /* the largest reply frame seen */
    bool failed;      /* a reply was wrong: stop checking the rest */
} reader_t;

/* Checks one reply payload: a Stats reply, status OK, id = got + 1. */
static void check_reply(reader_t *r, const uint8_t *p, size_t len)
{
    kvd_msg_t *m = calloc(1, sizeof(*m));
    if (!DT_CHECK(m != NULL, "out of memory"))
        return;
    int rc = kvd_msg_decode(p, len, m);
    uint64_t want = r->got + 1;
    if (!DT_CHECK(rc == KVD_OK, "reply %llu (%zu bytes) does not decode: %s",
                  (unsigned long long)want, len, kvd_status_str(rc)) ||
        !DT_CHECK(m->reply && m->method == KVD_METHOD_STATS,
                  "reply %llu: reply %d method %d, want a Stats reply",
                  (unsigned long long)want, m->reply, m->method) ||
        !DT_CHECK(m->id == want, "reply with id %llu where %llu was due (out of order)",
                  (unsigned long long)m->id, (unsigned long long)want) ||
        !DT_CHECK(m->status == KVD_OK, "reply %llu: status %s (%s)",
                  (unsigned long long)want, kvd_status_str(m->status), m->error) ||
        !DT_CHECK(m->body.stats_rep.n_namespaces == N_NAMESPACES,
                  "reply %llu: %zu namespaces, want %d", (unsigned long long)want,
                  m->body.stats_rep.n_namespaces, N_NAMESPACES))
        r->failed = true;
    kvd_msg_clear(m);
    free(m);
    r->got++;
}

/* Parses the whole frames in r->buf, keeping a partial one. */
static void parse_frames(reader_t *r)
{
    size_t off = 0;
    while (!r->failed && r->len - off >= 4) {
        const uint8_t *h = r->buf + off;
        size_t n =
            (size_t)h[0] | (size_t)h[1] << 8 | (size_t)h[2] << 16 | (size_t)h[3] << 24;
        if (!DT_CHECK(n > 0 && n <= REPLY_FRAME_MAX, "reply frame of %zu bytes", n)) {
            r->failed = true;
            return;
        }
        if (r->len - off - 4 < n)
            break;
        check_reply(r, h + 4, n);
        r->max_frame = KVD_MAX(r->max_frame, n + 4);
        r->bytes += n + 4;
        off += 4 + n;
    }
    memmove(r->buf, r->buf + off, r->len - off);
    r->len -= off;
}

/*
 * Reads replies until `want` came (or a check failed, or nothing came for
 * READ_IDLE_MS), writing the rest of the stream from *sent meanwhile: the
 * daemon only reads again once its output drained.
 */
static void read_replies(reader_t *r, const stream_t *s, size_t *sent, size_t want)
{
    while (!r->failed && r->got < want) {
        struct pollfd p = {.fd = r->fd,
                           .events = (short)(POLLIN | (*sent < s->len ? POLLOUT : 0))};
        int pr = poll(&p, 1, READ_IDLE_MS);
        if (pr < 0 && errno == EINTR)
            continue;
        if (!DT_CHECK(pr > 0, "no reply for %d ms after %zu of %zu replies", READ_IDLE_MS,
                      r->got, want))
            return;
        if ((p.revents & POLLOUT) && *sent < s->len) {
            ssize_t n = send(r->fd, s->bytes + *sent, s->len - *sent,
                             MSG_NOSIGNAL | MSG_DONTWAIT);
            if (n > 0)
                *sent += (size_t)n;
        }
        if (!(p.revents & (POLLIN | POLLHUP | POLLERR)))
            continue;
        if (r->cap - r->len < 65536) {
            r->cap *= 2;
            r->buf = realloc(r->buf, r->cap);
            if (!DT_CHECK(r->buf != NULL, "out of memory"))
                return;
        }
        ssize_t n = recv(r->fd, r->buf + r->len, r->cap - r->len, MSG_DONTWAIT);
        if (n < 0 && (errno == EAGAIN || errno == EINTR))
            continue;
        if (!DT_CHECK(n > 0, "the connection ended (%s) after %zu of %zu replies",
                      n == 0 ? "EOF" : strerror(errno), r->got, want))
            return;
        r->len += (size_t)n;
        parse_frames(r);
    }
}

/* ---------------------------------------------------------------- test */

static void run(kvd_test_daemon_t *d)
{
    if (!register_namespaces(d->socket))
        return;
    uint64_t rss0 = rss_of(d->pid);
    uint64_t conn0 = conn_bytes(d->socket);
    if (!DT_CHECK(rss0 > 0, "cannot read VmRSS of the daemon (pid %d)", (int)d->pid))
        return;

    static stream_t s;
    if (!DT_CHECK(stream_build(&s, N_REQUESTS) == 0, "out of memory"))
        return;
    int fd = dt_raw_connect_unix(d->socket);
    if (!DT_CHECK(fd >= 0, "raw connect to %s failed", d->socket))
        return;
    if (dt_raw_hello(fd) != 0) {
        close(fd);
        return;
    }
    /* a small send buffer: the requests the daemon holds back wait in the
     * daemon, not in the kernel, and fewer replies are owed at the end (a
     * daemon that reads on regardless takes every request at once) */
    int sndbuf = SNDBUF_BYTES;
    DT_CHECK(setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof(sndbuf)) == 0,
             "SO_SNDBUF: %s", strerror(errno));

    static writer_t w;
    w.fd = fd;
    w.s = &s;
    pthread_t th;
    if (!DT_CHECK(pthread_create(&th, NULL, writer_main, &w) == 0, "pthread_create")) {
        close(fd);
        return;
    }

    /* while the writer runs and stalls: memory and another client's health */
    uint64_t rss_max = rss0, conn_max = 0;
    int health_calls = 0, health_bad = 0;
    while (!atomic_load(&w.done)) {
        rss_max = KVD_MAX(rss_max, rss_of(d->pid));
        kvd_health_rep_t h;
        int state = dt_health_fresh(d->socket, &h);
        health_calls++;
        if (state != KVD_HEALTH_READY)
            health_bad++;
        uint64_t cb = conn_bytes(d->socket);
        if (cb != UINT64_MAX)
            conn_max = KVD_MAX(conn_max, cb);
        kvd_sleep_ns(100 * 1000000ull);
    }
    pthread_join(th, NULL);
    rss_max = KVD_MAX(rss_max, rss_of(d->pid));
    uint64_t cb = conn_bytes(d->socket);
    if (cb != UINT64_MAX)
        conn_max = KVD_MAX(conn_max, cb);
    kvd_health_rep_t h;
    health_calls++;
    if (dt_health_fresh(d->socket, &h) != KVD_HEALTH_READY)
        health_bad++;

    size_t sent = atomic_load(&w.sent);
    size_t n_sent = frames_in(&s, sent);
    printf("writer: %zu of %d requests (%zu bytes) taken, %s; daemon RSS %llu -> max "
           "%llu KiB, connection buffers max %llu KiB; %d health calls\n",
           n_sent, N_REQUESTS, sent, w.stalled ? "then stalled" : "all sent",
           (unsigned long long)(rss0 >> 10), (unsigned long long)(rss_max >> 10),
           (unsigned long long)(conn_max >> 10), health_calls);
    DT_CHECK(w.error == 0, "the writer's send failed: %s", strerror(w.error));
    DT_CHECK(n_sent > 0, "the daemon took no request at all");
    DT_CHECK(rss_max - rss0 < RSS_GROWTH_MAX,
             "the daemon's RSS grew by %llu bytes (from %llu) with a client not reading "
             "its replies; the bound is %llu",
             (unsigned long long)(rss_max - rss0), (unsigned long long)rss0,
             (unsigned long long)RSS_GROWTH_MAX);
    DT_CHECK(conn_max < CONN_BUSY_MAX,
             "connection buffers reached %llu bytes with a client not reading; the bound "
             "is %llu",
             (unsigned long long)conn_max, (unsigned long long)CONN_BUSY_MAX);
    DT_CHECK(health_bad == 0,
             "%d of %d Health calls from another client did not answer "
             "ready while the burst was held back",
             health_bad, health_calls);

    /* every request gets its reply, in order; a half-sent frame is
     * completed while reading */
    size_t want = n_sent;
    if (sent > (n_sent ? s.frame_end[n_sent - 1] : 0))
        want++; /* the writer stopped inside this one */
    size_t target_bytes = want == 0 ? 0 : s.frame_end[want - 1];
    static reader_t r;
    r.fd = fd;
    r.cap = 1 << 20;
    r.buf = malloc(r.cap);
    if (DT_CHECK(r.buf != NULL, "out of memory")) {
        stream_t part = s;
        part.len = target_bytes; /* write no request beyond the half-sent one */
        read_replies(&r, &part, &sent, want);
    }
    printf("read %zu replies of %zu, %llu bytes, largest frame %zu bytes\n", r.got, want,
           (unsigned long long)r.bytes, r.max_frame);
    DT_CHECK(r.got == want, "%zu replies for %zu requests", r.got, want);
    DT_CHECK(r.len == 0, "%zu bytes after the last reply", r.len);
    if (!w.stalled)
        printf("(the socket took all %d requests without stalling: the kernel held them "
               "in its socket buffers)\n",
               N_REQUESTS);

    /* after the burst, the connection still open: its buffers given back */
    uint64_t conn_after = conn_bytes(d->socket);
    printf("connection buffers: %llu KiB before, %llu KiB after the burst\n",
           (unsigned long long)(conn0 >> 10), (unsigned long long)(conn_after >> 10));
    DT_CHECK(conn_after < CONN_IDLE_MAX,
             "after the burst the daemon still holds %llu bytes of connection buffers "
             "(bound %llu)",
             (unsigned long long)conn_after, (unsigned long long)CONN_IDLE_MAX);
    DT_CHECK(dt_health_fresh(d->socket, &h) == KVD_HEALTH_READY,
             "Health after the burst did not answer ready");
    free(r.buf);
    close(fd);
    free(s.bytes);
    free(s.frame_end);
}

int main(void)
{
    kvd_test_daemon_t d;
    memset(&d, 0, sizeof(d));
    if (dt_start(&d, NULL) == 0)
        run(&d);
    dt_stop(&d, SIGTERM, 10000);
    return dt_exit_status("out_backpressure");
}
