/*
 * Description: the UCX transport, over whatever UCX_TLS names (meson runs
 * it over tcp and over shared memory): a posted batch of WRITEs (local ->
 * remote) or READs (remote -> local) moves exactly the bytes asked for,
 * with or without a mapped local buffer, and is reported once with its
 * cookie; a batch with any transfer outside the peer's region is refused
 * whole and moves nothing; a batch for a peer that went away ends, never
 * with KVD_OK, in bounded time; destroy returns in bounded time, also with
 * batches outstanding, and UCX no longer writes local memory after it.
 *
 * Each test has a "server" kvd_ucx_t (with a wakeup fd, as the daemon has)
 * that maps a 1 MiB region, and a "client" kvd_ucx_t with a transport to
 * it. Over tcp and over UCX 1.13's shared memory the server's worker
 * serves every get and put (RMA is emulated), so a server thread drives it
 * from its wakeup fd while it runs; the server's UCX objects are touched
 * only by that thread then (created before it starts, destroyed after it
 * is joined). The test thread drives the client.
 *
 * KVD_TEST_UCX_MODE=am runs every test in the message mode instead of
 * one-sided RMA: the server then also serves messages for its region
 * (kvd_ucx_serve_messages), and the same behaviour is required.
 *
 * Where UCX cannot start, or cannot reach the server, with this UCX_TLS,
 * the program prints why and exits 77 (meson: SKIP).
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
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include "kvd_transport.h"

#define REMOTE_BYTES (1024 * 1024)
#define LOCAL_BYTES  (512 * 1024)
#define WAIT_MS      5000 /* a batch that takes longer has failed */
#define SKIP_EXIT    77
/* How long a READ from a peer that went away may take to fail: UCX over
 * tcp notices at once; shared memory cannot notice, and times out. */
#define PEER_GONE_WAIT_MS 3000
/* What destroy may take: ucx.c waits up to 10 s for cancelled batches */
#define DESTROY_MAX_MS 12000

typedef struct server {
    kvd_ucx_t *ucx;
    uint8_t *region; /* REMOTE_BYTES, mmap'ed; outlives the server's UCX */
    kvd_ucx_mem_t *mem;
    kvd_ucx_peer_t peer; /* what a client needs, taken before the thread runs */
    int stop_fd;         /* eventfd: written to stop the thread */
    pthread_t thread;
    bool running;
    int thread_error; /* errno of a failed poll in the thread, 0 while fine */
} server_t;

typedef struct fixture {
    server_t srv;
    kvd_ucx_t *ucx; /* the client's */
    kvd_transport_t *t;
    uint8_t *local; /* LOCAL_BYTES, heap */
} fixture_t;

static void fill(uint8_t *p, size_t len, uint32_t seed)
{
    uint32_t x = seed;
    for (size_t i = 0; i < len; i++) {
        x = x * 1664525u + 1013904223u;
        p[i] = (uint8_t)(x >> 24);
    }
}

static uint64_t addr_of(const void *p)
{
    return (uint64_t)(uintptr_t)p;
}

static const char *tls_name(void)
{
    const char *tls = getenv("UCX_TLS");
    return tls != NULL ? tls : "(UCX_TLS unset)";
}

/* ------------------------------------------------------------- server */

/* The server thread: sleeps on the worker's wakeup fd and drives the
 * worker whenever it fires, until stop_fd is written. */
static void *server_main(void *arg)
{
    server_t *s = arg;
    struct pollfd fds[2] = {
        {.fd = kvd_ucx_efd(s->ucx), .events = POLLIN},
        {.fd = s->stop_fd, .events = POLLIN},
    };
    kvd_ucx_drive(s->ucx);
    for (;;) {
        int n = poll(fds, 2, -1);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            s->thread_error = errno;
            return NULL;
        }
        if (fds[1].revents != 0)
            return NULL;
        kvd_ucx_drive(s->ucx);
    }
}

/* Stops the thread: the server's worker is no longer driven (a stalled
 * peer) until server_resume. */
static void server_pause(server_t *s)
{
    if (!s->running)
        return;
    uint64_t one = 1;
    if (write(s->stop_fd, &one, sizeof(one)) != sizeof(one))
        abort(); /* an eventfd write cannot fail here */
    pthread_join(s->thread, NULL);
    s->running = false;
    if (read(s->stop_fd, &one, sizeof(one)) != sizeof(one))
        abort(); /* it was just written */
}

static int server_resume(server_t *s)
{
    if (pthread_create(&s->thread, NULL, server_main, s) != 0)
        return KVD_ERR_IO;
    s->running = true;
    return KVD_OK;
}

/* The peer description a client needs to reach s's region. */
static kvd_ucx_peer_t peer_of(const server_t *s)
{
    const char *mode = getenv("KVD_TEST_UCX_MODE");
    kvd_ucx_peer_t p = {.remote_base = addr_of(s->region),
                        .remote_length = REMOTE_BYTES,
                        .mode = mode && strcmp(mode, "am") == 0 ? KVD_UCX_MODE_AM
                                                                : KVD_UCX_MODE_RMA};
    kvd_ucx_address(s->ucx, &p.address, &p.address_len);
    kvd_ucx_mem_rkey(s->mem, &p.rkey, &p.rkey_len);
    return p;
}

/* Creates the server's UCX, maps its region (filled with a pattern) and
 * starts its thread. Returns a kvd status; KVD_ERR_UNAVAILABLE when UCX
 * cannot start here. */
static int server_start(server_t *s)
{
    *s = (server_t){.stop_fd = -1};
    void *region = mmap(NULL, REMOTE_BYTES, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (region == MAP_FAILED)
        return KVD_ERR_NOMEM;
    s->region = region;
    fill(s->region, REMOTE_BYTES, 2);
    int rc = kvd_ucx_create("test-ucx-server", true, &s->ucx);
    if (rc != KVD_OK)
        return rc;
    if (kvd_ucx_efd(s->ucx) < 0)
        return KVD_ERR_STATE;
    rc = kvd_ucx_mem_map(s->ucx, s->region, REMOTE_BYTES, &s->mem);
    if (rc != KVD_OK)
        return rc;
    rc = kvd_ucx_serve_messages(s->ucx, s->mem);
    if (rc != KVD_OK)
        return rc;
    s->peer = peer_of(s);
    s->stop_fd = eventfd(0, EFD_CLOEXEC);
    if (s->stop_fd < 0)
        return KVD_ERR_IO;
    return server_resume(s);
}

/* Stops the thread, then unmaps and destroys the server's UCX: the peer
 * is gone. The region stays mapped. */
static void server_stop(server_t *s)
{
    server_pause(s);
    kvd_ucx_mem_unmap(s->mem);
    s->mem = NULL;
    kvd_ucx_destroy(s->ucx);
    s->ucx = NULL;
    if (s->stop_fd >= 0)
        close(s->stop_fd);
    s->stop_fd = -1;
}

static void server_free(server_t *s)
{
    server_stop(s);
    if (s->region != NULL)
        munmap(s->region, REMOTE_BYTES);
    s->region = NULL;
}

/* ------------------------------------------------------------- client */

/* Starts a server and opens a client transport to it. *what says which
 * step failed. */
static int fixture_open(fixture_t *f, const char **what)
{
    *what = "allocating the local buffer";
    f->local = malloc(LOCAL_BYTES);
    if (f->local == NULL)
        return KVD_ERR_NOMEM;
    fill(f->local, LOCAL_BYTES, 1);
    *what = "starting the server";
    int rc = server_start(&f->srv);
    if (rc != KVD_OK)
        return rc;
    *what = "creating the client's UCX";
    rc = kvd_ucx_create("test-ucx-client", false, &f->ucx);
    if (rc != KVD_OK)
        return rc;
    *what = "opening the transport to the server";
    return kvd_transport_open_ucx(f->ucx, &f->srv.peer, &f->t);
}

static void fixture_close(fixture_t *f)
{
    kvd_transport_destroy(f->t);
    f->t = NULL;
    /* answers the server still sends (message mode) finish only with the
     * client's worker driven: drive it a while, as a live worker would */
    for (uint64_t end = kvd_now_ns() + 100000000ull; f->ucx && kvd_now_ns() < end;)
        kvd_ucx_progress(f->ucx);
    /* the server first: it may still answer the client's worker */
    server_free(&f->srv);
    kvd_ucx_destroy(f->ucx);
    f->ucx = NULL;
    free(f->local);
    f->local = NULL;
}

static int setup(void **state)
{
    fixture_t *f = calloc(1, sizeof(*f));
    if (f == NULL)
        return -1;
    f->srv.stop_fd = -1;
    *state = f;
    const char *what = "";
    int rc = fixture_open(f, &what);
    if (rc != KVD_OK) {
        print_error("%s over %s: %s\n", what, tls_name(), kvd_status_str(rc));
        return -1;
    }
    return 0;
}

static int teardown(void **state)
{
    fixture_t *f = *state;
    fixture_close(f);
    int thread_error = f->srv.thread_error;
    free(f);
    if (thread_error != 0) {
        print_error("server thread: poll failed: %s\n", strerror(thread_error));
        return -1;
    }
    return 0;
}

/* Posts a batch and waits for it: both must say KVD_OK. */
static void post_and_wait(fixture_t *f, kvd_xfer_dir_t dir, const kvd_xfer_t *x, size_t n,
                          uint64_t cookie)
{
    assert_int_equal(kvd_transport_post(f->t, dir, x, n, cookie), KVD_OK);
    assert_int_equal(kvd_transport_wait(f->t, cookie, WAIT_MS), KVD_OK);
}

/* Drives t and polls until `count` batches were reported or WAIT_MS ran
 * out; returns how many were reported into done[]. */
static size_t collect(kvd_transport_t *t, kvd_xfer_done_t *done, size_t count)
{
    uint64_t deadline = kvd_now_ns() + (uint64_t)WAIT_MS * 1000000ull;
    size_t got = 0;
    while (got < count && kvd_now_ns() < deadline) {
        size_t n = 0;
        assert_int_equal(kvd_transport_poll(t, done + got, count - got, &n), KVD_OK);
        got += n;
        if (n == 0)
            kvd_transport_progress(t);
    }
    return got;
}

/* Drives t for ms milliseconds without polling it. */
static void drive_for_ms(kvd_transport_t *t, unsigned ms)
{
    uint64_t end = kvd_now_ns() + (uint64_t)ms * 1000000ull;
    while (kvd_now_ns() < end)
        kvd_transport_progress(t);
}

/* Drives t a while and expects nothing more to be reported. */
static void expect_no_more(kvd_transport_t *t)
{
    drive_for_ms(t, 20);
    kvd_xfer_done_t done[4];
    size_t n = 99;
    assert_int_equal(kvd_transport_poll(t, done, 4, &n), KVD_OK);
    if (n != 0)
        print_error("unexpected report: cookie %llu status %d\n",
                    (unsigned long long)done[0].cookie, done[0].status);
    assert_int_equal(n, 0);
}

/* ---------------------------------------------------------------- tests */

static void test_name_is_ucx(void **state)
{
    fixture_t *f = *state;
    assert_string_equal(kvd_transport_name(f->t), "ucx");
    /* the server's, asked for, was checked before its thread started */
    assert_int_equal(kvd_ucx_efd(f->ucx), -1); /* not asked for */
}

static void test_write_batch_moves_exact_bytes(void **state)
{
    fixture_t *f = *state;
    uint8_t *want = malloc(REMOTE_BYTES), *local_before = malloc(LOCAL_BYTES);
    assert_non_null(want);
    assert_non_null(local_before);
    memcpy(want, f->srv.region, REMOTE_BYTES);
    memcpy(local_before, f->local, LOCAL_BYTES);

    uint8_t *l = f->local;
    const kvd_xfer_t x[] = {
        {.local_offset = addr_of(l), .remote_offset = 1000, .length = 4096},
        {.local_offset = addr_of(l + 12345), .remote_offset = 50000, .length = 777},
        {.local_offset = addr_of(l + LOCAL_BYTES - 1), .remote_offset = 0, .length = 1},
        /* large enough for UCX's zero-copy paths */
        {.local_offset = addr_of(l + 4096),
         .remote_offset = 300000,
         .length = 256 * 1024},
        /* ends exactly at the end of the region */
        {.local_offset = addr_of(l + 100),
         .remote_offset = REMOTE_BYTES - 300,
         .length = 300},
        {.local_offset = addr_of(l + 5), .remote_offset = 6, .length = 0},
    };
    const size_t n = sizeof(x) / sizeof(x[0]);
    for (size_t i = 0; i < n; i++)
        memcpy(want + x[i].remote_offset, (const void *)(uintptr_t)x[i].local_offset,
               x[i].length);

    post_and_wait(f, KVD_XFER_WRITE, x, n, 0xc0ffee);
    assert_memory_equal(f->srv.region, want, REMOTE_BYTES);
    assert_memory_equal(f->local, local_before, LOCAL_BYTES); /* source unchanged */
    expect_no_more(f->t);
    free(want);
    free(local_before);
}

static void test_read_batch_moves_exact_bytes(void **state)
{
    fixture_t *f = *state;
    uint8_t *want = malloc(LOCAL_BYTES), *remote_before = malloc(REMOTE_BYTES);
    assert_non_null(want);
    assert_non_null(remote_before);
    memcpy(want, f->local, LOCAL_BYTES);
    memcpy(remote_before, f->srv.region, REMOTE_BYTES);

    uint8_t *l = f->local;
    const kvd_xfer_t x[] = {
        {.local_offset = addr_of(l + 100),
         .remote_offset = REMOTE_BYTES - 8192,
         .length = 8192},
        {.local_offset = addr_of(l + 40000), .remote_offset = 3, .length = 1500},
        {.local_offset = addr_of(l), .remote_offset = 0, .length = 64},
        {.local_offset = addr_of(l + 65536), .remote_offset = 400001, .length = 200000},
        {.local_offset = addr_of(l + LOCAL_BYTES - 1), .remote_offset = 77, .length = 1},
        {.local_offset = addr_of(l + 9), .remote_offset = REMOTE_BYTES, .length = 0},
    };
    const size_t n = sizeof(x) / sizeof(x[0]);
    for (size_t i = 0; i < n; i++)
        memcpy(want + (x[i].local_offset - addr_of(l)),
               f->srv.region + x[i].remote_offset, x[i].length);

    post_and_wait(f, KVD_XFER_READ, x, n, UINT64_MAX);
    assert_memory_equal(f->local, want, LOCAL_BYTES);
    assert_memory_equal(f->srv.region, remote_before, REMOTE_BYTES);
    expect_no_more(f->t);
    free(want);
    free(remote_before);
}

/* Local memory mapped on the client side is used with its handle; a
 * transfer that is only partly (or not at all) inside a mapping still
 * works. Two mappings, added out of order. */
static void test_mapped_local_buffer(void **state)
{
    fixture_t *f = *state;
    uint8_t *l = f->local;
    const uint64_t lo = 0, hi = 256 * 1024, mapped = 128 * 1024;
    kvd_ucx_mem_t *m_hi = NULL, *m_lo = NULL;
    assert_int_equal(kvd_ucx_mem_map(f->ucx, l + hi, mapped, &m_hi), KVD_OK);
    assert_int_equal(kvd_ucx_mem_map(f->ucx, l + lo, mapped, &m_lo), KVD_OK);
    assert_int_equal(kvd_transport_ucx_add_local(f->t, m_hi), KVD_OK);
    assert_int_equal(kvd_transport_ucx_add_local(f->t, m_lo), KVD_OK);

    const kvd_xfer_t x[] = {
        /* inside the low mapping */
        {.local_offset = addr_of(l + 1000), .remote_offset = 0, .length = 8192},
        /* inside the high one */
        {.local_offset = addr_of(l + hi + 100),
         .remote_offset = 10000,
         .length = mapped - 200},
        /* across the end of the low mapping */
        {.local_offset = addr_of(l + mapped - 100),
         .remote_offset = 200000,
         .length = 300},
        /* between the mappings */
        {.local_offset = addr_of(l + 200000), .remote_offset = 210000, .length = 4096},
        /* across the start of the high mapping */
        {.local_offset = addr_of(l + hi - 50), .remote_offset = 220000, .length = 100},
        /* across the end of the high mapping */
        {.local_offset = addr_of(l + hi + mapped - 10),
         .remote_offset = 230000,
         .length = 5000},
    };
    const size_t n = sizeof(x) / sizeof(x[0]);

    /* WRITE: the region gets exactly those bytes */
    uint8_t *want = malloc(REMOTE_BYTES);
    assert_non_null(want);
    memcpy(want, f->srv.region, REMOTE_BYTES);
    for (size_t i = 0; i < n; i++)
        memcpy(want + x[i].remote_offset, (const void *)(uintptr_t)x[i].local_offset,
               x[i].length);
    post_and_wait(f, KVD_XFER_WRITE, x, n, 1);
    assert_memory_equal(f->srv.region, want, REMOTE_BYTES);

    /* READ the same shape from elsewhere in the region: the local buffer
     * gets exactly those bytes */
    fill(f->srv.region + 512 * 1024, 256 * 1024, 3); /* the server only serves */
    kvd_xfer_t y[sizeof(x) / sizeof(x[0])];
    uint8_t *want_local = malloc(LOCAL_BYTES);
    assert_non_null(want_local);
    memcpy(want_local, f->local, LOCAL_BYTES);
    for (size_t i = 0; i < n; i++) {
        y[i] = x[i];
        y[i].remote_offset = 512 * 1024 + x[i].remote_offset / 2;
        memcpy(want_local + (y[i].local_offset - addr_of(l)),
               f->srv.region + y[i].remote_offset, y[i].length);
    }
    /* sources overlap between transfers; destinations do not */
    post_and_wait(f, KVD_XFER_READ, y, n, 2);
    assert_memory_equal(f->local, want_local, LOCAL_BYTES);
    expect_no_more(f->t);

    kvd_transport_destroy(f->t); /* before the handles it uses go */
    f->t = NULL;
    kvd_ucx_mem_unmap(m_lo);
    kvd_ucx_mem_unmap(m_hi);
    free(want);
    free(want_local);
}

/* Several batches posted (and finished) before anyone polls: each cookie
 * is reported exactly once, with KVD_OK, and every byte moved. */
static void test_batches_posted_before_polling_reported_once(void **state)
{
    fixture_t *f = *state;
    enum { ROUNDS = 3, PER_ROUND = 24, BATCHES = ROUNDS * PER_ROUND, SLOT = 64 };
    uint8_t *l = f->local;
    uint8_t *r = f->srv.region;
    const uint64_t write_from = 256 * 1024, write_to = 512 * 1024;
    for (uint64_t i = 0; i < BATCHES; i++) {
        kvd_xfer_dir_t dir = (i % 2 == 0) ? KVD_XFER_READ : KVD_XFER_WRITE;
        /* a READ brings remote slot i to local slot i; a WRITE takes local
         * slot i (of a second area) to remote slot i (of a second area) */
        kvd_xfer_t x = {.local_offset = addr_of(l + i * SLOT),
                        .remote_offset = i * SLOT,
                        .length = SLOT};
        if (dir == KVD_XFER_WRITE)
            x = (kvd_xfer_t){.local_offset = addr_of(l + write_from + i * SLOT),
                             .remote_offset = write_to + i * SLOT,
                             .length = SLOT};
        assert_int_equal(kvd_transport_post(f->t, dir, &x, 1, 5000 + i), KVD_OK);
        /* between rounds, let them finish unpolled */
        if (i % PER_ROUND == PER_ROUND - 1)
            drive_for_ms(f->t, 50);
    }
    kvd_xfer_done_t done[BATCHES];
    size_t got = collect(f->t, done, BATCHES);
    unsigned seen[BATCHES] = {0};
    for (size_t i = 0; i < got; i++) {
        uint64_t k = done[i].cookie - 5000;
        if (done[i].cookie < 5000 || k >= BATCHES) {
            print_error("report %zu: unknown cookie %llu\n", i,
                        (unsigned long long)done[i].cookie);
            fail();
        }
        seen[k]++;
        assert_int_equal(done[i].status, KVD_OK);
    }
    for (size_t k = 0; k < BATCHES; k++) {
        if (seen[k] != 1)
            print_error("cookie %zu reported %u times (%zu reports in all)\n", 5000 + k,
                        seen[k], got);
        assert_int_equal(seen[k], 1);
    }
    assert_int_equal(got, BATCHES);
    for (uint64_t i = 0; i < BATCHES; i++) {
        if (i % 2 == 0)
            assert_memory_equal(l + i * SLOT, r + i * SLOT, SLOT);
        else
            assert_memory_equal(r + write_to + i * SLOT, l + write_from + i * SLOT, SLOT);
    }
    expect_no_more(f->t);
}

/* Batches of only zero-length transfers move nothing, and each is still
 * reported exactly once (a READ one finishes while it is posted). */
static void test_zero_length_batches_reported_once(void **state)
{
    fixture_t *f = *state;
    enum { BATCHES = 40 };
    const kvd_xfer_t x = {.local_offset = addr_of(f->local + 7), .remote_offset = 11};
    for (uint64_t i = 0; i < BATCHES; i++)
        assert_int_equal(
            kvd_transport_post(f->t, i < BATCHES / 2 ? KVD_XFER_READ : KVD_XFER_WRITE, &x,
                               1, 100 + i),
            KVD_OK);
    kvd_xfer_done_t done[BATCHES];
    size_t got = collect(f->t, done, BATCHES);
    unsigned seen[BATCHES] = {0};
    for (size_t i = 0; i < got; i++) {
        assert_true(done[i].cookie >= 100 && done[i].cookie < 100 + BATCHES);
        seen[done[i].cookie - 100]++;
        assert_int_equal(done[i].status, KVD_OK);
    }
    for (size_t k = 0; k < BATCHES; k++) {
        if (seen[k] != 1)
            print_error("cookie %zu reported %u times (%zu reports in all)\n", 100 + k,
                        seen[k], got);
        assert_int_equal(seen[k], 1);
    }
    assert_int_equal(got, BATCHES);
    expect_no_more(f->t);
}

static void test_out_of_region_refused_nothing_moved(void **state)
{
    fixture_t *f = *state;
    uint8_t *local_before = malloc(LOCAL_BYTES), *remote_before = malloc(REMOTE_BYTES);
    assert_non_null(local_before);
    assert_non_null(remote_before);
    memcpy(local_before, f->local, LOCAL_BYTES);
    memcpy(remote_before, f->srv.region, REMOTE_BYTES);

    const uint64_t l = addr_of(f->local);
    const kvd_xfer_t good = {.local_offset = l, .remote_offset = 0, .length = 4096};
    const kvd_xfer_t bad[] = {
        /* one byte past the end */
        {.local_offset = l, .remote_offset = REMOTE_BYTES - 100, .length = 101},
        /* starts past the end */
        {.local_offset = l, .remote_offset = REMOTE_BYTES + 1, .length = 0},
        {.local_offset = l, .remote_offset = REMOTE_BYTES + 4096, .length = 1},
        {.local_offset = l, .remote_offset = UINT64_MAX, .length = 1},
        {.local_offset = l, .remote_offset = UINT64_MAX, .length = 0},
        /* offset + length wraps around 2^64 */
        {.local_offset = l, .remote_offset = 16, .length = UINT64_MAX - 8},
        {.local_offset = l, .remote_offset = UINT64_MAX - 10, .length = 20},
        /* longer than the region */
        {.local_offset = l, .remote_offset = 0, .length = REMOTE_BYTES + 1},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        for (int dir = KVD_XFER_READ; dir <= KVD_XFER_WRITE; dir++) {
            /* the bad transfer after a good one: the good one must not move */
            kvd_xfer_t batch[2] = {good, bad[i]};
            int rc = kvd_transport_post(f->t, (kvd_xfer_dir_t)dir, batch, 2, 100 + i);
            if (rc != KVD_ERR_INVALID)
                print_error("bad transfer %zu (dir %d) accepted: %d\n", i, dir, rc);
            assert_int_equal(rc, KVD_ERR_INVALID);
            rc = kvd_transport_post(f->t, (kvd_xfer_dir_t)dir, &bad[i], 1, 200 + i);
            assert_int_equal(rc, KVD_ERR_INVALID);
        }
    }
    /* a refused batch is never reported */
    expect_no_more(f->t);
    assert_memory_equal(f->local, local_before, LOCAL_BYTES);
    assert_memory_equal(f->srv.region, remote_before, REMOTE_BYTES);

    /* zero-length transfers at the edges are fine */
    const kvd_xfer_t edges[] = {
        {.local_offset = l, .remote_offset = 0, .length = 0},
        {.local_offset = l, .remote_offset = REMOTE_BYTES, .length = 0},
    };
    post_and_wait(f, KVD_XFER_READ, edges, 2, 300);
    post_and_wait(f, KVD_XFER_WRITE, edges, 2, 301);
    assert_memory_equal(f->local, local_before, LOCAL_BYTES);
    assert_memory_equal(f->srv.region, remote_before, REMOTE_BYTES);
    free(local_before);
    free(remote_before);
}

/* The peer goes away (its UCX destroyed, its memory no longer readable):
 * a READ fails in bounded time, never with KVD_OK; once the transport
 * said KVD_ERR_CLOSED it keeps saying it; destroy returns. */
static void test_peer_gone_fails_batches(void **state)
{
    fixture_t *f = *state;
    /* one good batch first, so the endpoint is fully up */
    const kvd_xfer_t x = {
        .local_offset = addr_of(f->local), .remote_offset = 4096, .length = 65536};
    post_and_wait(f, KVD_XFER_READ, &x, 1, 1);

    server_stop(&f->srv);
    /* where UCX reads the peer's pages itself (cma), a dead peer's pages
     * are gone: PROT_NONE stands in for that */
    assert_int_equal(mprotect(f->srv.region, REMOTE_BYTES, PROT_NONE), 0);

    bool closed = false; /* a post said KVD_ERR_CLOSED */
    for (uint64_t cookie = 2; cookie < 6; cookie++) {
        uint64_t t0 = kvd_now_ns();
        int rc = kvd_transport_post(f->t, KVD_XFER_READ, &x, 1, cookie);
        if (closed)
            assert_int_equal(rc, KVD_ERR_CLOSED);
        if (rc == KVD_ERR_CLOSED) {
            if (!closed)
                print_message("post %llu after the peer went: %s\n",
                              (unsigned long long)cookie, kvd_status_str(rc));
            closed = true;
            continue;
        }
        assert_int_equal(rc, KVD_OK);
        rc = kvd_transport_wait(f->t, cookie, PEER_GONE_WAIT_MS);
        uint64_t ms = (kvd_now_ns() - t0) / 1000000;
        print_message("read %llu after the peer went: %s after %llu ms\n",
                      (unsigned long long)cookie, kvd_status_str(rc),
                      (unsigned long long)ms);
        assert_int_not_equal(rc, KVD_OK);
        assert_true(ms < PEER_GONE_WAIT_MS + 2000);
        if (rc == KVD_ERR_TIMEOUT)
            break; /* UCX did not notice; destroy must still return */
    }

    uint64_t t0 = kvd_now_ns();
    kvd_transport_destroy(f->t);
    f->t = NULL;
    uint64_t ms = (kvd_now_ns() - t0) / 1000000;
    print_message("destroy took %llu ms\n", (unsigned long long)ms);
    assert_true(ms < DESTROY_MAX_MS);
}

/* The peer stalls (its worker not driven) with a READ outstanding; the
 * caller gives up and destroys the transport, then reuses the buffer.
 * When the peer comes back, UCX must not write that buffer any more. */
static void test_destroy_while_peer_stalled(void **state)
{
    fixture_t *f = *state;
    const kvd_xfer_t x = {
        .local_offset = addr_of(f->local), .remote_offset = 0, .length = 65536};
    post_and_wait(f, KVD_XFER_READ, &x, 1, 1); /* the endpoint is up */

    server_pause(&f->srv);
    assert_int_equal(kvd_transport_post(f->t, KVD_XFER_READ, &x, 1, 2), KVD_OK);
    int rc = kvd_transport_wait(f->t, 2, 200);
    /* on RDMA the read needs no help from the peer: then nothing is left */
    if (rc != KVD_OK)
        assert_int_equal(rc, KVD_ERR_TIMEOUT);

    uint64_t t0 = kvd_now_ns();
    kvd_transport_destroy(f->t);
    f->t = NULL;
    uint64_t ms = (kvd_now_ns() - t0) / 1000000;
    print_message("read with the peer stalled: %s; destroy took %llu ms\n",
                  kvd_status_str(rc), (unsigned long long)ms);
    assert_true(ms < DESTROY_MAX_MS);

    memset(f->local, 0x5a, LOCAL_BYTES); /* reused by the caller */
    assert_int_equal(server_resume(&f->srv), KVD_OK);
    uint64_t end = kvd_now_ns() + 300ull * 1000000ull;
    while (kvd_now_ns() < end)
        kvd_ucx_progress(f->ucx);
    for (size_t i = 0; i < LOCAL_BYTES; i++)
        if (f->local[i] != 0x5a)
            fail_msg("local byte %zu written after destroy returned", i);
}

/* Destroy with batches still outstanding returns, and UCX no longer
 * writes the local buffer afterwards (the client's worker keeps running). */
static void test_destroy_with_outstanding_batches(void **state)
{
    fixture_t *f = *state;
    const kvd_xfer_t rd = {
        .local_offset = addr_of(f->local), .remote_offset = 0, .length = LOCAL_BYTES};
    const kvd_xfer_t wr = {.local_offset = addr_of(f->local),
                           .remote_offset = REMOTE_BYTES - LOCAL_BYTES,
                           .length = LOCAL_BYTES};
    for (uint64_t i = 0; i < 4; i++) {
        assert_int_equal(kvd_transport_post(f->t, KVD_XFER_READ, &rd, 1, 10 + i), KVD_OK);
        assert_int_equal(kvd_transport_post(f->t, KVD_XFER_WRITE, &wr, 1, 20 + i),
                         KVD_OK);
    }
    kvd_transport_destroy(f->t);
    f->t = NULL;
    memset(f->local, 0x5a, LOCAL_BYTES);
    uint64_t end = kvd_now_ns() + 200ull * 1000000ull;
    while (kvd_now_ns() < end)
        kvd_ucx_progress(f->ucx);
    for (size_t i = 0; i < LOCAL_BYTES; i++)
        if (f->local[i] != 0x5a)
            fail_msg("local byte %zu written after destroy returned", i);
}

static void test_invalid_arguments(void **state)
{
    fixture_t *f = *state;
    kvd_ucx_mem_t *m = (kvd_ucx_mem_t *)(uintptr_t)0x1234;
    assert_int_equal(kvd_ucx_mem_map(f->ucx, NULL, 4096, &m), KVD_ERR_INVALID);
    assert_int_equal(kvd_ucx_mem_map(f->ucx, f->local, 0, &m), KVD_ERR_INVALID);
    assert_ptr_equal(m, (kvd_ucx_mem_t *)(uintptr_t)0x1234);

    kvd_transport_t *t = (kvd_transport_t *)(uintptr_t)0x1234;
    const kvd_ucx_peer_t good = f->srv.peer;
    kvd_ucx_peer_t p = good;
    assert_int_equal(kvd_transport_open_ucx(f->ucx, NULL, &t), KVD_ERR_INVALID);
    p.address = NULL;
    assert_int_equal(kvd_transport_open_ucx(f->ucx, &p, &t), KVD_ERR_INVALID);
    p = good;
    p.address_len = 0;
    assert_int_equal(kvd_transport_open_ucx(f->ucx, &p, &t), KVD_ERR_INVALID);
    p = good;
    p.rkey = NULL;
    assert_int_equal(kvd_transport_open_ucx(f->ucx, &p, &t), KVD_ERR_INVALID);
    p = good;
    p.rkey_len = 0;
    assert_int_equal(kvd_transport_open_ucx(f->ucx, &p, &t), KVD_ERR_INVALID);
    assert_ptr_equal(t, (kvd_transport_t *)(uintptr_t)0x1234);

    /* add_local wants a ucx transport and a mapping */
    assert_int_equal(kvd_transport_ucx_add_local(f->t, NULL), KVD_ERR_INVALID);
    kvd_ucx_mem_t *lm = NULL;
    assert_int_equal(kvd_ucx_mem_map(f->ucx, f->local, 4096, &lm), KVD_OK);
    assert_int_equal(kvd_transport_ucx_add_local(NULL, lm), KVD_ERR_INVALID);
    kvd_region_t a = {.base = f->local, .length = 64};
    kvd_region_t b = {.base = f->local + 64, .length = 64};
    kvd_transport_t *shm = NULL;
    assert_int_equal(kvd_transport_open_shm(&a, &b, &shm), KVD_OK);
    assert_int_equal(kvd_transport_ucx_add_local(shm, lm), KVD_ERR_INVALID);
    kvd_transport_destroy(shm);
    kvd_ucx_mem_unmap(lm);
    kvd_ucx_mem_unmap(NULL);
    kvd_ucx_destroy(NULL);
}

/* Whether UCX starts and reaches a peer with this UCX_TLS; prints why not.
 * KVD_TEST_NEEDS_RDMA: the variant that asks for verbs transports skips,
 * saying why, on a machine without an RDMA device. */
static bool ucx_usable(void)
{
    if (getenv("KVD_TEST_NEEDS_RDMA") && !kvd_rdma_device_present()) {
        fprintf(stderr, "SKIP: no RDMA device (/sys/class/infiniband is empty or "
                        "absent): UCX RMA over verbs cannot be tested here\n");
        return false;
    }
    fixture_t f = {.srv.stop_fd = -1};
    const char *what = "";
    int rc = fixture_open(&f, &what);
    fixture_close(&f);
    if (rc == KVD_ERR_UNAVAILABLE) {
        fprintf(stderr, "SKIP: %s over %s: %s\n", what, tls_name(), kvd_status_str(rc));
        return false;
    }
    return true; /* anything else is for the tests to report */
}

int main(void)
{
    if (!ucx_usable())
        return SKIP_EXIT;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_name_is_ucx, setup, teardown),
        cmocka_unit_test_setup_teardown(test_write_batch_moves_exact_bytes, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_read_batch_moves_exact_bytes, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_mapped_local_buffer, setup, teardown),
        cmocka_unit_test_setup_teardown(test_batches_posted_before_polling_reported_once,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_zero_length_batches_reported_once, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_out_of_region_refused_nothing_moved, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_peer_gone_fails_batches, setup, teardown),
        cmocka_unit_test_setup_teardown(test_destroy_with_outstanding_batches, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_destroy_while_peer_stalled, setup, teardown),
        cmocka_unit_test_setup_teardown(test_invalid_arguments, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
