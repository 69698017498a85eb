/*
 * Description: a kvd_client_t recovers from a call that timed out. Against
 * a fake server on a Unix socket (in a mkdtemp directory under /tmp, on a
 * thread): the late reply to the abandoned call is read and dropped by the
 * next call, which returns its own reply; a request abandoned half-written
 * is finished before the next one, so the server sees whole frames; an
 * error reply with id 0 is still returned to the waiting call, and a reply
 * with an id the client never sent is a protocol error. Pipelined calls
 * (kvd_client_call_many) send every request before reading a reply and
 * put each reply where its id says, whatever order they come in; a refusal
 * fails the requests after it too. kvd_client_ended says true once the
 * peer has closed, and not for a frame that waits unread.
 * Calls from several threads share one client: a call whose reply comes
 * first returns while an earlier call from another thread still waits for
 * its own (held back by the server until then), each gets its own reply,
 * and 8 threads x 200 calls answered in scrambled order all match.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "kvd_proto.h"

#define CLIENT_TIMEOUT_MS 100 /* the call that is abandoned */
#define SERVER_DELAY_MS   300 /* how late the server answers it */
#define PATIENT_MS        5000

/* ---------------------------------------------------------- fake server */

typedef struct fake_server fake_server_t;
typedef void (*script_fn)(fake_server_t *s, int fd);

struct fake_server {
    char dir[64];
    char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
    int listen_fd;
    _Atomic int conn_fd; /* the accepted connection, -1 before and after */
    pthread_t thread;
    bool running; /* thread not joined yet */
    script_fn script;
    char failure[256]; /* the first check that failed on the server thread */
};

/* Records a failed check (cmocka's asserts belong to the main thread). */
static void server_fail(fake_server_t *s, const char *what)
{
    if (s->failure[0] == '\0')
        snprintf(s->failure, sizeof(s->failure), "server: %s", what);
}

static void sleep_ms(long ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static bool read_full(int fd, uint8_t *buf, size_t n)
{
    size_t off = 0;
    while (off < n) {
        ssize_t r = recv(fd, buf + off, n - off, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return false;
        off += (size_t)r;
    }
    return true;
}

/* Reads one frame from the blocking fd and decodes it into m. */
static bool server_recv(int fd, kvd_msg_t *m)
{
    uint8_t hdr[KVD_FRAME_HEADER_BYTES];
    memset(m, 0, sizeof(*m));
    if (!read_full(fd, hdr, sizeof(hdr)))
        return false;
    size_t len = (size_t)hdr[0] | (size_t)hdr[1] << 8 | (size_t)hdr[2] << 16 |
                 (size_t)hdr[3] << 24;
    uint8_t *payload = malloc(len ? len : 1);
    bool ok = payload != NULL && read_full(fd, payload, len) &&
              kvd_msg_decode(payload, len, m) == KVD_OK;
    free(payload);
    return ok;
}

static bool server_send(int fd, const kvd_msg_t *m)
{
    kvd_buf_t b;
    kvd_buf_init(&b, KVD_MEM_OTHER);
    bool ok = kvd_msg_pack(m, KVD_FRAME_DEFAULT_MAX, &b) == KVD_OK;
    for (size_t off = 0; ok && off < b.len;) {
        ssize_t n = send(fd, b.data + off, b.len - off, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        ok = n > 0;
        off += ok ? (size_t)n : 0;
    }
    kvd_buf_free(&b);
    return ok;
}

/* Receives a request and checks its id and method. */
static bool expect_request(fake_server_t *s, int fd, uint64_t id, kvd_method_t method,
                           kvd_msg_t *m)
{
    if (!server_recv(fd, m)) {
        server_fail(s, "a request did not arrive whole or did not decode");
        return false;
    }
    if (m->reply || m->id != id || m->method != method) {
        server_fail(s, "unexpected request id or method");
        return false;
    }
    return true;
}

/* Sends a Health reply to id, told apart by its uptime. */
static bool send_health(fake_server_t *s, int fd, uint64_t id, uint64_t uptime_ms)
{
    kvd_msg_t rep;
    kvd_msg_request(&rep, id, KVD_METHOD_HEALTH);
    rep.reply = true;
    rep.body.health_rep.state = KVD_HEALTH_READY;
    rep.body.health_rep.uptime_ms = uptime_ms;
    if (!server_send(fd, &rep)) {
        server_fail(s, "a reply could not be sent");
        return false;
    }
    return true;
}

static void *server_main(void *arg)
{
    fake_server_t *s = arg;
    int fd = accept(s->listen_fd, NULL, NULL);
    if (fd < 0) {
        server_fail(s, "accept failed");
        return NULL;
    }
    atomic_store(&s->conn_fd, fd);
    s->script(s, fd);
    atomic_store(&s->conn_fd, -1);
    close(fd);
    return NULL;
}

/* Binds a socket in a new directory under /tmp and runs script on a thread
 * for the first connection. */
static void server_start(fake_server_t *s, script_fn script)
{
    s->script = script;
    s->listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(s->listen_fd >= 0);
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    strcpy(addr.sun_path, s->path);
    assert_int_equal(bind(s->listen_fd, (struct sockaddr *)&addr, sizeof(addr)), 0);
    assert_int_equal(listen(s->listen_fd, 1), 0);
    assert_int_equal(pthread_create(&s->thread, NULL, server_main, s), 0);
    s->running = true;
}

/* Waits for the script to end and fails the test if a check of it did. */
static void server_finish(fake_server_t *s)
{
    pthread_join(s->thread, NULL);
    s->running = false;
    if (s->failure[0] != '\0')
        fail_msg("%s", s->failure);
}

/* Per test: a fresh directory for the socket. */
static int setup_server(void **state)
{
    fake_server_t *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return -1;
    s->listen_fd = -1;
    atomic_init(&s->conn_fd, -1);
    strcpy(s->dir, "/tmp/kvd-client-test-XXXXXX");
    if (mkdtemp(s->dir) == NULL) {
        free(s);
        return -1;
    }
    snprintf(s->path, sizeof(s->path), "%s/s.sock", s->dir);
    *state = s;
    return 0;
}

/* Also after a failed test: wakes a server still blocked in accept or
 * recv, then removes socket and directory. */
static int teardown_server(void **state)
{
    fake_server_t *s = *state;
    if (s->running) {
        int fd = atomic_load(&s->conn_fd);
        if (fd >= 0)
            shutdown(fd, SHUT_RDWR);
        shutdown(s->listen_fd, SHUT_RDWR);
        pthread_join(s->thread, NULL);
    }
    if (s->listen_fd >= 0)
        close(s->listen_fd);
    unlink(s->path);
    int rc = rmdir(s->dir);
    free(s);
    return rc;
}

static kvd_client_t *connect_client(const fake_server_t *s)
{
    kvd_client_t *c = NULL;
    assert_int_equal(kvd_client_connect_unix(s->path, PATIENT_MS, &c), KVD_OK);
    return c;
}

static int call_health(kvd_client_t *c, kvd_msg_t *rep, int timeout_ms)
{
    kvd_msg_t req;
    kvd_msg_request(&req, 0, KVD_METHOD_HEALTH);
    return kvd_client_call(c, &req, rep, timeout_ms);
}

/* -------------------------------------------------------------- tests */

/* Answers request 1 late, request 2 at once, request 3 too. */
static void late_reply_script(fake_server_t *s, int fd)
{
    kvd_msg_t m;
    if (!expect_request(s, fd, 1, KVD_METHOD_HEALTH, &m))
        return;
    sleep_ms(SERVER_DELAY_MS);
    if (!send_health(s, fd, 1, 111))
        return;
    for (uint64_t id = 2; id <= 3; id++)
        if (!expect_request(s, fd, id, KVD_METHOD_HEALTH, &m) ||
            !send_health(s, fd, id, id * 111))
            return;
}

static void test_late_reply_is_dropped(void **state)
{
    fake_server_t *s = *state;
    server_start(s, late_reply_script);
    kvd_client_t *c = connect_client(s);
    kvd_msg_t rep;

    assert_int_equal(call_health(c, &rep, CLIENT_TIMEOUT_MS), KVD_ERR_TIMEOUT);
    kvd_msg_clear(&rep);

    /* the late reply to 1 arrives first: dropped, 2's own reply returned */
    assert_int_equal(call_health(c, &rep, PATIENT_MS), KVD_OK);
    assert_true(rep.reply);
    assert_true(rep.id == 2);
    assert_int_equal(rep.status, KVD_OK);
    assert_true(rep.body.health_rep.uptime_ms == 222);
    kvd_msg_clear(&rep);

    /* and the connection stays in step */
    assert_int_equal(call_health(c, &rep, PATIENT_MS), KVD_OK);
    assert_true(rep.id == 3);
    assert_true(rep.body.health_rep.uptime_ms == 333);
    kvd_msg_clear(&rep);

    kvd_client_close(c);
    server_finish(s);
}

/* Keys of the big Acquire: far more than a socket buffer holds. */
#define BIG_KEYS 100000

static void key_of(kvd_key_t key, size_t i)
{
    memset(key, 0, KVD_KEY_BYTES);
    memcpy(key, &i, sizeof(i));
}

/* Reads nothing for a while (the client's first write stalls), then checks
 * both frames arrive whole and answers them in order. */
static void half_written_script(fake_server_t *s, int fd)
{
    sleep_ms(SERVER_DELAY_MS);
    kvd_msg_t m;
    if (!expect_request(s, fd, 1, KVD_METHOD_ACQUIRE, &m))
        return;
    kvd_key_t last;
    key_of(last, BIG_KEYS - 1);
    bool whole = m.body.acquire_req.n == BIG_KEYS &&
                 memcmp(m.body.acquire_req.keys[BIG_KEYS - 1], last, KVD_KEY_BYTES) == 0;
    kvd_msg_clear(&m);
    if (!whole) {
        server_fail(s, "the abandoned Acquire did not arrive whole");
        return;
    }
    kvd_msg_t rep;
    kvd_msg_request(&rep, 1, KVD_METHOD_ACQUIRE);
    rep.reply = true;
    rep.body.acquire_rep.lease_id = 77;
    if (!server_send(fd, &rep)) {
        server_fail(s, "a reply could not be sent");
        return;
    }
    if (expect_request(s, fd, 2, KVD_METHOD_HEALTH, &m))
        send_health(s, fd, 2, 222);
}

static void test_half_written_request_is_finished(void **state)
{
    fake_server_t *s = *state;
    kvd_key_t *keys = calloc(BIG_KEYS, sizeof(kvd_key_t));
    assert_non_null(keys);
    for (size_t i = 0; i < BIG_KEYS; i++)
        key_of(keys[i], i);
    server_start(s, half_written_script);
    kvd_client_t *c = connect_client(s);

    kvd_msg_t req, rep;
    kvd_msg_request(&req, 0, KVD_METHOD_ACQUIRE);
    req.body.acquire_req.keys = keys;
    req.body.acquire_req.n = BIG_KEYS;
    assert_int_equal(kvd_client_call(c, &req, &rep, CLIENT_TIMEOUT_MS), KVD_ERR_TIMEOUT);
    kvd_msg_clear(&rep);

    assert_int_equal(call_health(c, &rep, PATIENT_MS), KVD_OK);
    assert_true(rep.id == 2);
    assert_int_equal(rep.method, KVD_METHOD_HEALTH);
    assert_true(rep.body.health_rep.uptime_ms == 222);
    kvd_msg_clear(&rep);

    kvd_client_close(c);
    server_finish(s);
    free(keys);
}

/* Refuses request 1 with an error of id 0; answers request 2 with an id
 * the client never used. */
static void other_ids_script(fake_server_t *s, int fd)
{
    kvd_msg_t m, rep;
    if (!expect_request(s, fd, 1, KVD_METHOD_HEALTH, &m))
        return;
    kvd_msg_error(&rep, 0, KVD_METHOD_NONE, KVD_ERR_TOO_LARGE, "frame refused");
    if (!server_send(fd, &rep)) {
        server_fail(s, "a reply could not be sent");
        return;
    }
    if (expect_request(s, fd, 2, KVD_METHOD_HEALTH, &m))
        send_health(s, fd, 99, 999);
}

static void test_id_zero_error_and_unknown_ids(void **state)
{
    fake_server_t *s = *state;
    server_start(s, other_ids_script);
    kvd_client_t *c = connect_client(s);
    kvd_msg_t rep;

    assert_int_equal(call_health(c, &rep, PATIENT_MS), KVD_OK);
    assert_true(rep.id == 0);
    assert_int_equal(rep.status, KVD_ERR_TOO_LARGE);
    assert_string_equal(rep.error, "frame refused");
    kvd_msg_clear(&rep);

    assert_int_equal(call_health(c, &rep, PATIENT_MS), KVD_ERR_PROTOCOL);
    kvd_msg_clear(&rep);

    kvd_client_close(c);
    server_finish(s);
}

/* Reads three requests before it answers any (a client that waited for
 * each reply before sending the next would time out here), answers them
 * out of order (3, 1, 2), then sends one frame nobody asked for. */
static void pipelined_script(fake_server_t *s, int fd)
{
    kvd_msg_t m;
    for (uint64_t id = 1; id <= 3; id++)
        if (!expect_request(s, fd, id, KVD_METHOD_HEALTH, &m))
            return;
    static const uint64_t order[3] = {3, 1, 2};
    for (int i = 0; i < 3; i++)
        if (!send_health(s, fd, order[i], order[i] * 1000))
            return;
}

static void test_call_many_pipelines(void **state)
{
    fake_server_t *s = *state;
    server_start(s, pipelined_script);
    kvd_client_t *c = connect_client(s);
    kvd_msg_t req[3], rep[3];
    for (int i = 0; i < 3; i++)
        kvd_msg_request(&req[i], 0, KVD_METHOD_HEALTH);
    assert_int_equal(kvd_client_call_many(c, req, rep, 3, CLIENT_TIMEOUT_MS * 10),
                     KVD_OK);
    for (int i = 0; i < 3; i++) {
        assert_true(rep[i].id == (uint64_t)i + 1);
        assert_int_equal(rep[i].status, KVD_OK);
        assert_true(rep[i].body.health_rep.uptime_ms == (uint64_t)(i + 1) * 1000);
        kvd_msg_clear(&rep[i]);
    }
    server_finish(s);
    kvd_client_close(c);
}

/* Closes the connection after a while, having sent nothing. */
static void close_script(fake_server_t *s, int fd)
{
    (void)s;
    (void)fd;
    sleep_ms(SERVER_DELAY_MS);
}

/* A frame waiting unread is not an end; the close is. */
static void unread_then_close_script(fake_server_t *s, int fd)
{
    send_health(s, fd, 0, 7);
    sleep_ms(SERVER_DELAY_MS);
}

static void test_ended_sees_close(void **state)
{
    fake_server_t *s = *state;
    server_start(s, close_script);
    kvd_client_t *c = connect_client(s);
    assert_false(kvd_client_ended(c)); /* open, nothing sent yet */
    bool ended = false;
    for (int waited = 0; !ended && waited < PATIENT_MS; waited += 10) {
        sleep_ms(10);
        ended = kvd_client_ended(c);
    }
    assert_true(ended); /* the peer closed: no frame, just the end */
    server_finish(s);
    kvd_client_close(c);
}

static void test_unread_frame_is_no_end(void **state)
{
    fake_server_t *s = *state;
    server_start(s, unread_then_close_script);
    kvd_client_t *c = connect_client(s);
    sleep_ms(SERVER_DELAY_MS / 3); /* the frame is there, the close is not */
    assert_false(kvd_client_ended(c));
    bool ended = false;
    for (int waited = 0; !ended && waited < PATIENT_MS; waited += 10) {
        sleep_ms(10);
        ended = kvd_client_ended(c);
    }
    assert_true(ended); /* unread, and closed after it */
    server_finish(s);
    kvd_client_close(c);
}

/* Refuses the first of two pipelined requests with an error of id 0 and
 * closes the connection. */
static void refuse_many_script(fake_server_t *s, int fd)
{
    kvd_msg_t m, rep;
    if (!expect_request(s, fd, 1, KVD_METHOD_HEALTH, &m) ||
        !expect_request(s, fd, 2, KVD_METHOD_HEALTH, &m))
        return;
    kvd_msg_error(&rep, 0, KVD_METHOD_NONE, KVD_ERR_BUSY, "too many connections");
    if (!server_send(fd, &rep))
        server_fail(s, "a reply could not be sent");
}

static void test_call_many_refused(void **state)
{
    fake_server_t *s = *state;
    server_start(s, refuse_many_script);
    kvd_client_t *c = connect_client(s);
    kvd_msg_t req[2], rep[2];
    for (int i = 0; i < 2; i++)
        kvd_msg_request(&req[i], 0, KVD_METHOD_HEALTH);
    assert_int_equal(kvd_client_call_many(c, req, rep, 2, PATIENT_MS), KVD_OK);
    assert_int_equal(rep[0].status, KVD_ERR_BUSY);
    assert_int_equal(rep[1].status, KVD_ERR_BUSY); /* never answered: refused too */
    kvd_msg_clear(&rep[0]);
    kvd_msg_clear(&rep[1]);
    server_finish(s);
    kvd_client_close(c);
}

/* ------------------------------------------------- calls from threads */

/* Set when the server got request 1, and by the test when request 2's
 * caller has its reply (then request 1 is answered). */
static _Atomic int got_first, second_done;

static void wait_flag(_Atomic int *flag)
{
    for (int i = 0; i < 10000 && atomic_load(flag) == 0; i++)
        sleep_ms(1);
}

/* Request 1 is answered only after request 2's caller returned. */
static void held_back_script(fake_server_t *s, int fd)
{
    kvd_msg_t m;
    if (!expect_request(s, fd, 1, KVD_METHOD_HEALTH, &m))
        return;
    atomic_store(&got_first, 1);
    if (!expect_request(s, fd, 2, KVD_METHOD_HEALTH, &m) || !send_health(s, fd, 2, 222))
        return;
    wait_flag(&second_done);
    if (atomic_load(&second_done) == 0)
        server_fail(s, "the second call never returned while the first waited");
    send_health(s, fd, 1, 111);
}

typedef struct caller {
    kvd_client_t *c;
    int rc;
    kvd_msg_t rep;
    _Atomic int done;
} caller_t;

static void *call_main(void *arg)
{
    caller_t *k = arg;
    k->rc = call_health(k->c, &k->rep, PATIENT_MS);
    atomic_store(&k->done, 1);
    return NULL;
}

static void test_threads_do_not_wait_for_each_other(void **state)
{
    fake_server_t *s = *state;
    atomic_store(&got_first, 0);
    atomic_store(&second_done, 0);
    server_start(s, held_back_script);
    kvd_client_t *c = connect_client(s);
    caller_t first = {.c = c};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, call_main, &first), 0);
    wait_flag(&got_first);
    assert_int_equal(atomic_load(&got_first), 1);

    kvd_msg_t rep;
    assert_int_equal(call_health(c, &rep, PATIENT_MS), KVD_OK);
    assert_true(rep.id == 2);
    assert_true(rep.body.health_rep.uptime_ms == 222);
    kvd_msg_clear(&rep);
    assert_int_equal(atomic_load(&first.done), 0); /* still waiting for its own */
    atomic_store(&second_done, 1);

    pthread_join(t, NULL);
    assert_int_equal(first.rc, KVD_OK);
    assert_true(first.rep.id == 1);
    assert_true(first.rep.body.health_rep.uptime_ms == 111);
    kvd_msg_clear(&first.rep);
    kvd_client_close(c);
    server_finish(s);
}

#define MANY_THREADS 8
#define MANY_CALLS   200

/* Answers every request, a few at a time in reverse order; each reply's
 * uptime is its request's id times 3. */
static void scrambled_script(fake_server_t *s, int fd)
{
    kvd_msg_t m;
    uint64_t ids[4];
    for (int done = 0; done < MANY_THREADS * MANY_CALLS;) {
        int k = 0;
        /* as many as are there, up to 4 (one at least) */
        do {
            if (!server_recv(fd, &m)) {
                server_fail(s, "a request did not arrive whole");
                return;
            }
            ids[k++] = m.id;
            kvd_msg_clear(&m);
        } while (k < 4 && done + k < MANY_THREADS * MANY_CALLS &&
                 recv(fd, &(uint8_t){0}, 1, MSG_PEEK | MSG_DONTWAIT) == 1);
        for (int i = k - 1; i >= 0; i--)
            if (!send_health(s, fd, ids[i], ids[i] * 3))
                return;
        done += k;
    }
}

static void *many_main(void *arg)
{
    caller_t *k = arg;
    for (int i = 0; i < MANY_CALLS && k->rc == KVD_OK; i++) {
        kvd_msg_t req, rep;
        kvd_msg_request(&req, 0, KVD_METHOD_HEALTH);
        k->rc = kvd_client_call(k->c, &req, &rep, PATIENT_MS);
        if (k->rc == KVD_OK &&
            (rep.id != req.id || rep.body.health_rep.uptime_ms != req.id * 3))
            k->rc = KVD_ERR_PROTOCOL; /* someone else's reply */
        kvd_msg_clear(&rep);
    }
    return NULL;
}

static void test_many_threads_get_their_own_replies(void **state)
{
    fake_server_t *s = *state;
    server_start(s, scrambled_script);
    kvd_client_t *c = connect_client(s);
    caller_t k[MANY_THREADS];
    pthread_t t[MANY_THREADS];
    for (int i = 0; i < MANY_THREADS; i++) {
        k[i] = (caller_t){.c = c};
        assert_int_equal(pthread_create(&t[i], NULL, many_main, &k[i]), 0);
    }
    for (int i = 0; i < MANY_THREADS; i++) {
        pthread_join(t[i], NULL);
        assert_int_equal(k[i].rc, KVD_OK);
    }
    kvd_client_close(c);
    server_finish(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_late_reply_is_dropped, setup_server,
                                        teardown_server),
        cmocka_unit_test_setup_teardown(test_half_written_request_is_finished,
                                        setup_server, teardown_server),
        cmocka_unit_test_setup_teardown(test_id_zero_error_and_unknown_ids, setup_server,
                                        teardown_server),
        cmocka_unit_test_setup_teardown(test_call_many_pipelines, setup_server,
                                        teardown_server),
        cmocka_unit_test_setup_teardown(test_call_many_refused, setup_server,
                                        teardown_server),
        cmocka_unit_test_setup_teardown(test_ended_sees_close, setup_server,
                                        teardown_server),
        cmocka_unit_test_setup_teardown(test_unread_frame_is_no_end, setup_server,
                                        teardown_server),
        cmocka_unit_test_setup_teardown(test_threads_do_not_wait_for_each_other,
                                        setup_server, teardown_server),
        cmocka_unit_test_setup_teardown(test_many_threads_get_their_own_replies,
                                        setup_server, teardown_server),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
