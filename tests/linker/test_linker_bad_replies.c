/*
 * Description: replies a daemon should never send do not crash the
 * client or the linker (both found by fuzz/fuzz_linker.c). Against a fake
 * daemon on a Unix socket (a mkdtemp directory, a thread):
 *  - a successful reply whose method is not its request's (its body would
 *    be read as the request's: a Lookup reading an Acquire reply took the
 *    lease id for its count and the object size for a pointer) is a
 *    protocol error of kvd_client_call; an error reply of another method
 *    is still handed over;
 *  - a Hello reply whose pool is larger than the descriptor attached to it
 *    (the linker mapped the pool's size and the first copy past the
 *    descriptor's end raised SIGBUS) makes kvd_linker_open fail with
 *    KVD_ERR_PROTOCOL;
 *  - a Lookup reply with a boundary outside 1..n_keys (0 here), or not
 *    increasing, makes kvd_lookup fail with KVD_ERR_PROTOCOL (the engine
 *    would take it for a hit of that many pages).
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "kvd_proto.h"
#include "kvdock.h"

#define PATIENT_MS 5000

/* How the fake daemon answers the first request. */
typedef enum answer {
    ANSWER_OTHER_METHOD, /* a Lookup reply, status OK, to whatever came */
    ANSWER_OTHER_ERROR,  /* an error reply of another method */
    ANSWER_SHORT_FD,     /* Hello: a 64 MiB pool, a 1 MiB descriptor */
    ANSWER_GOOD,         /* Hello (a 1 MiB pool), RegisterNamespace: sound */
    ANSWER_BAD_BOUNDS,   /* Lookup: boundaries {0, 2} */
} answer_t;

#define MAX_ANSWERS 4

typedef struct fake {
    char dir[64];
    char path[108];
    int listen_fd;
    answer_t answers[MAX_ANSWERS]; /* one per request, in order */
    size_t n_answers;
    pthread_t thread;
} fake_t;

static bool send_frame(int fd, const kvd_msg_t *m, int pass_fd)
{
    kvd_buf_t b;
    kvd_buf_init(&b, KVD_MEM_OTHER);
    bool ok = kvd_msg_pack(m, KVD_FRAME_DEFAULT_MAX, &b) == KVD_OK;
    struct iovec iov = {.iov_base = b.data, .iov_len = b.len};
    union {
        struct cmsghdr align;
        char buf[CMSG_SPACE(sizeof(int))];
    } ctl;
    memset(&ctl, 0, sizeof(ctl));
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
    if (pass_fd >= 0) {
        msg.msg_control = ctl.buf;
        msg.msg_controllen = sizeof(ctl.buf);
        struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(cm), &pass_fd, sizeof(int));
    }
    ok = ok && sendmsg(fd, &msg, MSG_NOSIGNAL) == (ssize_t)b.len;
    kvd_buf_free(&b);
    return ok;
}

/* Reads one request frame; false when the peer closed first. */
static bool read_request(int fd, kvd_msg_t *req)
{
    kvd_framer_t f;
    kvd_framer_init(&f, KVD_FRAME_DEFAULT_MAX, KVD_MEM_OTHER);
    bool ok = false;
    for (int rounds = 0; rounds < 1000; rounds++) {
        const uint8_t *p;
        size_t len;
        int got = kvd_framer_next(&f, &p, &len);
        if (got == 1) {
            ok = kvd_msg_decode(p, len, req) == KVD_OK;
            break;
        }
        uint8_t *space;
        size_t avail;
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        if (got < 0 || poll(&pfd, 1, PATIENT_MS) <= 0 ||
            kvd_framer_space(&f, 4096, &space, &avail) != KVD_OK)
            break;
        ssize_t n = recv(fd, space, avail, 0);
        if (n <= 0)
            break;
        kvd_framer_commit(&f, (size_t)n);
    }
    kvd_framer_free(&f);
    return ok;
}

static void *fake_main(void *arg)
{
    fake_t *fk = arg;
    struct pollfd p = {.fd = fk->listen_fd, .events = POLLIN};
    if (poll(&p, 1, PATIENT_MS) <= 0)
        return NULL;
    int fd = accept4(fk->listen_fd, NULL, NULL, SOCK_CLOEXEC);
    if (fd < 0)
        return NULL;
    kvd_msg_t req = {0}, rep;
    for (size_t k = 0; k < fk->n_answers && read_request(fd, &req); k++) {
        memset(&rep, 0, sizeof(rep));
        rep.id = req.id;
        rep.method = req.method;
        rep.reply = true;
        int pool = -1;
        uint64_t pool_bytes = 1u << 20, fd_bytes = 1u << 20;
        static uint32_t bounds[2] = {0, 2};
        static uint32_t ids[KVD_MAX_POOLS] = {0};
        answer_t a = fk->answers[k];
        if (a == ANSWER_OTHER_METHOD) {
            rep.method = KVD_METHOD_LOOKUP;
            rep.body.lookup_rep = (kvd_lookup_rep_t){.n = 2, .boundaries = bounds};
        } else if (a == ANSWER_OTHER_ERROR) {
            kvd_msg_error(&rep, req.id, KVD_METHOD_NONE, KVD_ERR_UNKNOWN_METHOD,
                          "unknown method");
        } else if (a == ANSWER_BAD_BOUNDS) {
            rep.body.lookup_rep = (kvd_lookup_rep_t){.n = 2, .boundaries = bounds};
        } else if (req.method == KVD_METHOD_REGISTER_NAMESPACE) {
            rep.body.register_rep =
                (kvd_ids_rep_t){.n = req.body.register_req.n, .ids = ids};
        } else if (req.method == KVD_METHOD_HELLO) {
            if (a == ANSWER_SHORT_FD)
                pool_bytes = 64u << 20;
            kvd_hello_rep_t *h = &rep.body.hello_rep;
            h->protocol_version = KVD_PROTOCOL_VERSION;
            h->pool_bytes = pool_bytes;
            h->lease_ttl_ms = 30000;
            h->max_batch = 4096;
            h->max_frame_bytes = KVD_FRAME_DEFAULT_MAX;
            h->n_ns_ids = req.body.hello_req.n_namespaces;
            h->ns_ids = ids;
            h->pool_fd_attached = true;
            pool = memfd_create("pool", MFD_CLOEXEC);
            if (pool >= 0 && ftruncate(pool, (off_t)fd_bytes) != 0) {
                close(pool);
                pool = -1;
            }
        }
        send_frame(fd, &rep, pool);
        if (pool >= 0)
            close(pool);
        kvd_msg_clear(&req);
    }
    kvd_msg_clear(&req);
    /* wait for the peer to close (it reads the reply first) */
    struct pollfd q = {.fd = fd, .events = POLLIN};
    poll(&q, 1, PATIENT_MS);
    close(fd);
    return NULL;
}

static void fake_start(fake_t *fk, const answer_t *answers, size_t n)
{
    memset(fk, 0, sizeof(*fk));
    memcpy(fk->answers, answers, n * sizeof(*answers));
    fk->n_answers = n;
    strcpy(fk->dir, "/tmp/kvd-bad-replies-XXXXXX");
    assert_non_null(mkdtemp(fk->dir));
    snprintf(fk->path, sizeof(fk->path), "%s/d.sock", fk->dir);
    fk->listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(fk->listen_fd >= 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    strcpy(a.sun_path, fk->path);
    assert_int_equal(bind(fk->listen_fd, (struct sockaddr *)&a, sizeof(a)), 0);
    assert_int_equal(listen(fk->listen_fd, 4), 0);
    assert_int_equal(pthread_create(&fk->thread, NULL, fake_main, fk), 0);
}

static void fake_stop(fake_t *fk)
{
    pthread_join(fk->thread, NULL);
    close(fk->listen_fd);
    unlink(fk->path);
    rmdir(fk->dir);
}

static void test_reply_of_another_method_refused(void **state)
{
    (void)state;
    fake_t fk;
    fake_start(&fk, (answer_t[]){ANSWER_OTHER_METHOD}, 1);
    kvd_client_t *c = NULL;
    assert_int_equal(kvd_client_connect_unix(fk.path, PATIENT_MS, &c), KVD_OK);
    kvd_msg_t req, rep;
    kvd_msg_request(&req, 0, KVD_METHOD_ACQUIRE);
    assert_int_equal(kvd_client_call(c, &req, &rep, PATIENT_MS), KVD_ERR_PROTOCOL);
    kvd_msg_clear(&rep);
    kvd_client_close(c);
    fake_stop(&fk);
}

static void test_error_of_another_method_handed_over(void **state)
{
    (void)state;
    fake_t fk;
    fake_start(&fk, (answer_t[]){ANSWER_OTHER_ERROR}, 1);
    kvd_client_t *c = NULL;
    assert_int_equal(kvd_client_connect_unix(fk.path, PATIENT_MS, &c), KVD_OK);
    kvd_msg_t req, rep;
    kvd_msg_request(&req, 0, KVD_METHOD_ACQUIRE);
    assert_int_equal(kvd_client_call(c, &req, &rep, PATIENT_MS), KVD_OK);
    assert_int_equal(rep.status, KVD_ERR_UNKNOWN_METHOD);
    kvd_msg_clear(&rep);
    kvd_client_close(c);
    fake_stop(&fk);
}

static void test_pool_larger_than_its_descriptor(void **state)
{
    (void)state;
    fake_t fk;
    fake_start(&fk, (answer_t[]){ANSWER_SHORT_FD}, 1);
    kvd_linker_config_t cfg = {.socket_path = fk.path,
                               .tp_size = 1,
                               .pp_size = 1,
                               .cp_size = 1,
                               .timeout_ms = PATIENT_MS,
                               .transport = "shm"};
    kvd_linker_t *l = NULL;
    assert_int_equal(kvd_linker_open(&cfg, &l), KVD_ERR_PROTOCOL);
    assert_null(l);
    fake_stop(&fk);
}

static void test_lookup_boundary_outside_keys(void **state)
{
    (void)state;
    fake_t fk;
    fake_start(&fk, (answer_t[]){ANSWER_GOOD, ANSWER_GOOD, ANSWER_BAD_BOUNDS}, 3);
    kvd_linker_config_t cfg = {.socket_path = fk.path,
                               .tp_size = 1,
                               .pp_size = 1,
                               .cp_size = 1,
                               .timeout_ms = PATIENT_MS,
                               .lazy_pool_mapping = true,
                               .transport = "shm"};
    kvd_linker_t *l = NULL;
    assert_int_equal(kvd_linker_open(&cfg, &l), KVD_OK);
    static uint8_t rows[2][4 * 64];
    kvd_pool_layer_t layer = {
        .layer_id = 0, .n_buffers = 2, .buffers = {{rows[0], 64, 64}, {rows[1], 64, 64}}};
    kvd_pool_desc_t d = {.name = "kv",
                         .addressing = KVD_ADDR_PAGED,
                         .page_size = 1,
                         .n_rows = 4,
                         .memory = KVD_MEM_HOST,
                         .n_layers = 1,
                         .layers = &layer};
    uint32_t pool = 0;
    assert_int_equal(kvd_register_pool(l, &d, &pool), KVD_OK);
    uint8_t keys[2][KVD_PAGE_KEY_BYTES];
    memset(keys, 7, sizeof(keys));
    kvd_transfer_t t = {
        .pool_id = pool, .keys = (const uint8_t(*)[KVD_PAGE_KEY_BYTES])keys, .n_keys = 2};
    uint32_t b[2] = {0};
    size_t nb = 0;
    assert_int_equal(kvd_lookup(l, 1, &t, 1, b, &nb), KVD_ERR_PROTOCOL);
    kvd_linker_close(l);
    fake_stop(&fk);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reply_of_another_method_refused),
        cmocka_unit_test(test_error_of_another_method_handed_over),
        cmocka_unit_test(test_pool_larger_than_its_descriptor),
        cmocka_unit_test(test_lookup_boundary_outside_keys),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
