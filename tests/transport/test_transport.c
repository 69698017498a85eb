/*
 * Description: the transport contract (kvd_transport.h), run over one
 * backend per test program run: argv[1] names it, as meson's
 * tests/transport/meson.build does once per backend built:
 *
 *   test_transport shm        the same-host backend
 *   test_transport ucx rma    UCX, one-sided get/put (over what UCX_TLS names)
 *   test_transport ucx am     UCX, active messages the peer's worker serves
 *
 * Every backend must: move exactly the bytes a READ or WRITE batch asks
 * for (random offsets and lengths, several regions of different sizes in
 * one batch, 72-byte rows gathered into staged messages, a 64 MiB
 * transfer, 10,000 small ones, a batch larger than KVD_UCX_STAGE_BYTES);
 * report each batch exactly once with its cookie; refuse whole, with
 * KVD_ERR_INVALID and nothing moved, a batch with any transfer outside its
 * local region or the peer's, naming another transport's region, or NULL;
 * refuse posts without a peer (KVD_ERR_CLOSED); move later batches to the
 * peer it was connected to last; register again after deregister; keep, in
 * kvd_transport_wait, the other batches reported meanwhile; time out a
 * wait, bounded; and destroy with batches outstanding.
 *
 * Backends whose peer is a worker of its own (ucx) must also: time out a
 * wait on a stalled peer and then disconnect in bounded time, fail that
 * batch and refuse later posts, and never write local memory for it
 * again; fail outstanding and later batches when the peer goes away, or
 * refuse to connect to it. Their serving side (kvd_ucx_*, the daemon's)
 * must refuse, in the message mode, ranges it does not serve, and outlive
 * clients that go away mid-transfer or right after connecting. On shm
 * there is no peer that could stall or go away: those cases skip, saying
 * so. Where UCX emulates RMA (rma over tcp), UCX 1.13 aborts a serving
 * worker that answers a get for a client whose worker is gone: the cases
 * that would make it do so skip that step, saying so.
 *
 * The peer: shm, a shared anonymous mapping passed as kvd_peer_t.mapping.
 * ucx, a "server" kvd_ucx_t (with a wakeup fd, as the daemon's) that maps
 * the region and serves messages for it; over tcp the server's worker
 * serves every get and put (RMA is emulated), so a server thread drives it
 * from its wakeup fd while it runs. The server's UCX objects are touched
 * only by that thread while it runs (set up before it starts, torn down
 * after it is joined); the test thread reads and writes the region's bytes
 * to check them, between batches.
 *
 * Exit 77 (meson: SKIP), the reason printed: KVD_TEST_NEEDS_RDMA is set and
 * the machine has no RDMA device, or UCX cannot start or reach a peer with
 * this UCX_TLS (UCX 1.13's shared-memory transports cannot report a dead
 * peer, which the ucx backend requires). Every wait is bounded; the only
 * timing assertions are generous "does not hang" bounds.
 *
 * KVD_TEST_FILTER / KVD_TEST_SKIP (cmocka patterns) run only, or all but,
 * the cases they match.
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

#define SKIP_EXIT 77

/* Local memory of the default fixture: regions of different sizes. */
#define A_BYTES     (512 * 1024) /* region A */
#define B_BYTES     12345        /* region B, an odd size */
#define C1_BYTES    4096         /* regions C1 and C2: adjacent in memory */
#define C2_BYTES    8192
#define PEER_BYTES  (1024 * 1024)
#define PEER2_BYTES (256 * 1024 + 100) /* the second peer of the reconnect case */

/* The large fixture: a 64 MiB transfer and batches over the staging size. */
#define BIG_LOCAL_BYTES (80ull << 20)
#define BIG_PEER_BYTES  (80ull << 20)
#define BIG_XFER_BYTES  (64ull << 20)

#define WAIT_MS       30000 /* "does not hang": a batch that takes longer failed */
#define STALL_WAIT_MS 300   /* how long a wait on a stalled peer runs before timing out */
/* How long a wait for a batch on a peer that went away may run: UCX over
 * tcp notices at once; a transport that cannot notice times out. */
#define PEER_GONE_WAIT_MS 3000
#define HANG_MS           30000 /* what disconnect and destroy may take at most */
#define REPORTS_MAX       20000 /* batches reported within one case, at most */

/* ------------------------------------------------------------- helpers */

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

static uint64_t ms_since(uint64_t t0_ns)
{
    return (kvd_now_ns() - t0_ns) / 1000000ull;
}

/* splitmix64: the random offsets and lengths, reproducible per seed. */
static uint64_t rnd(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* A number in [lo, hi]. */
static uint64_t rnd_in(uint64_t *s, uint64_t lo, uint64_t hi)
{
    return lo + rnd(s) % (hi - lo + 1);
}

/* Fails the case, naming the first differing byte and how many differ,
 * when got and want differ (assert_memory_equal would print each one). */
static void expect_bytes(const uint8_t *got, const uint8_t *want, size_t n,
                         const char *what)
{
    if (memcmp(got, want, n) == 0)
        return;
    size_t first = 0, count = 0;
    for (size_t i = 0; i < n; i++)
        if (got[i] != want[i] && count++ == 0)
            first = i;
    fail_msg("%s: %zu of %zu bytes differ, the first at %zu (0x%02x, want 0x%02x)", what,
             count, n, first, got[first], want[first]);
}

static uint8_t *dup_bytes(const uint8_t *p, size_t n)
{
    uint8_t *d = malloc(n);
    assert_non_null(d);
    memcpy(d, p, n);
    return d;
}

/* ---------------------------------------------------------------- peers */

/*
 * A peer region and, for ucx, the server that serves it. `bytes` is
 * mmap'ed and outlives the server; `served` bytes of it are what the
 * server maps (the rest lets a case claim more than is served).
 */
typedef struct peer {
    uint8_t *bytes;
    uint64_t length;  /* mapped here */
    uint64_t served;  /* mapped and served by the server (ucx) */
    uint64_t claimed; /* what describe tells the transport; 0: served */
    /* ucx only */
    kvd_ucx_t *ucx;
    kvd_ucx_mem_t *mem;
    uint8_t cap[KVD_UCX_CAP_BYTES]; /* granted the whole served region */
    int stop_fd;                    /* eventfd: written to stop the thread */
    pthread_t thread;
    bool running;
    int thread_error; /* errno of a failed poll in the thread, 0 while fine */
} peer_t;

/* A backend under test: how to open it and how to make its peers. */
typedef struct backend {
    const char *label; /* in messages */
    const char *name;  /* what kvd_transport_name says */
    /* the peer is a worker of its own: it can stall and go away */
    bool remote;
    /* every batch is done when post returns: reported in posting order */
    bool completes_at_post;
    /* copies go through the region's memory kind (its copy and sync) */
    bool uses_kind_copy;
    kvd_ucx_mode_t mode;
    int (*open)(kvd_transport_t **out);
    /* maps a region of `length` bytes, filled from seed, and serves
     * `served` of them; KVD_ERR_UNAVAILABLE when the backend cannot */
    int (*peer_start)(peer_t *p, uint64_t length, uint64_t served, uint32_t seed);
    kvd_peer_t (*describe)(const peer_t *p);
    /* remote only: the peer's worker stops being driven, then again */
    void (*peer_pause)(peer_t *p);
    int (*peer_resume)(peer_t *p);
    /* remote only: the peer goes away; its bytes stay mapped, PROT_NONE */
    void (*peer_kill)(peer_t *p);
    void (*peer_free)(peer_t *p);
} backend_t;

static const backend_t *g_be; /* the one this run tests */

static const char *tls_name(void)
{
    const char *tls = getenv("UCX_TLS");
    return tls != NULL ? tls : "(UCX_TLS unset)";
}

static uint8_t *map_region(uint64_t length)
{
    void *p =
        mmap(NULL, length, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

/* ---- shm: the peer's region is a shared mapping of this process */

static int shm_open_transport(kvd_transport_t **out)
{
    return kvd_transport_open_shm(out);
}

static int shm_peer_start(peer_t *p, uint64_t length, uint64_t served, uint32_t seed)
{
    *p = (peer_t){.stop_fd = -1, .length = length, .served = served};
    p->bytes = map_region(length);
    if (p->bytes == NULL)
        return KVD_ERR_NOMEM;
    fill(p->bytes, length, seed);
    return KVD_OK;
}

static kvd_peer_t shm_describe(const peer_t *p)
{
    return (kvd_peer_t){.length = p->claimed ? p->claimed : p->served,
                        .mapping = p->bytes};
}

static void shm_peer_free(peer_t *p)
{
    if (p->bytes != NULL)
        munmap(p->bytes, p->length);
    p->bytes = NULL;
}

/* ---- ucx: a server thread with a kvd_ucx_t of its own */

static int ucx_open_transport(kvd_transport_t **out)
{
    return kvd_transport_open_ucx("test-transport-client", out);
}

/* The server thread: sleeps on the worker's wakeup fd and drives the
 * worker whenever it fires, until stop_fd is written. */
static void *server_main(void *arg)
{
    peer_t *s = arg;
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
 * peer) until ucx_peer_resume. */
static void ucx_peer_pause(peer_t *s)
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

static int ucx_peer_resume(peer_t *s)
{
    if (s->running || s->ucx == NULL)
        return KVD_ERR_STATE;
    if (pthread_create(&s->thread, NULL, server_main, s) != 0)
        return KVD_ERR_IO;
    s->running = true;
    return KVD_OK;
}

/* Creates the server's UCX, maps its region (filled from seed), serves
 * messages for it and starts its thread. */
static int ucx_peer_start(peer_t *s, uint64_t length, uint64_t served, uint32_t seed)
{
    *s = (peer_t){.stop_fd = -1, .length = length, .served = served};
    s->bytes = map_region(length);
    if (s->bytes == NULL)
        return KVD_ERR_NOMEM;
    fill(s->bytes, length, seed);
    int rc = kvd_ucx_create("test-transport-server", true, &s->ucx);
    if (rc != KVD_OK)
        return rc;
    if (kvd_ucx_efd(s->ucx) < 0)
        return KVD_ERR_STATE; /* asked for: the daemon's epoll needs it */
    rc = kvd_ucx_mem_map(s->ucx, s->bytes, served, &s->mem);
    if (rc != KVD_OK)
        return rc;
    rc = kvd_ucx_serve_messages(s->ucx, s->mem);
    if (rc != KVD_OK)
        return rc;
    /* the message mode serves only a granted capability */
    kvd_ucx_grant_t g = {.offset = 0, .length = served};
    fill(g.cap, sizeof(g.cap), seed ^ 0x5eed);
    memcpy(s->cap, g.cap, sizeof(s->cap));
    rc = kvd_ucx_grant(s->ucx, &g);
    if (rc != KVD_OK)
        return rc;
    s->stop_fd = eventfd(0, EFD_CLOEXEC);
    if (s->stop_fd < 0)
        return KVD_ERR_IO;
    return ucx_peer_resume(s);
}

/* What a client needs to reach s's region (taken while the thread runs:
 * the address and rkey do not change). */
static kvd_peer_t ucx_describe(const peer_t *s)
{
    kvd_peer_t p = {.length = s->claimed ? s->claimed : s->served};
    kvd_ucx_address(s->ucx, &p.ucx.address, &p.ucx.address_len);
    kvd_ucx_mem_rkey(s->mem, &p.ucx.rkey, &p.ucx.rkey_len);
    p.ucx.base = addr_of(s->bytes);
    p.ucx.mode = g_be->mode;
    p.ucx.cap = s->cap;
    p.ucx.cap_len = sizeof(s->cap);
    return p;
}

/* Stops the thread, then unmaps and destroys the server's UCX: the peer
 * is gone. Where UCX reads the peer's pages itself (cma), a dead peer's
 * pages are gone too: PROT_NONE stands in for that. */
static void ucx_peer_kill(peer_t *s)
{
    ucx_peer_pause(s);
    kvd_ucx_mem_unmap(s->mem);
    s->mem = NULL;
    kvd_ucx_destroy(s->ucx);
    s->ucx = NULL;
    if (s->stop_fd >= 0)
        close(s->stop_fd);
    s->stop_fd = -1;
    if (s->bytes != NULL && mprotect(s->bytes, s->length, PROT_NONE) != 0)
        abort(); /* a mapping of ours */
}

static void ucx_peer_free(peer_t *s)
{
    if (s->ucx != NULL || s->stop_fd >= 0)
        ucx_peer_kill(s);
    shm_peer_free(s);
}

static const backend_t backend_shm = {
    .label = "shm",
    .name = "shm",
    .completes_at_post = true,
    .uses_kind_copy = true,
    .open = shm_open_transport,
    .peer_start = shm_peer_start,
    .describe = shm_describe,
    .peer_free = shm_peer_free,
};

static const backend_t backend_ucx_rma = {
    .label = "ucx (rma)",
    .name = "ucx",
    .remote = true,
    .mode = KVD_UCX_MODE_RMA,
    .open = ucx_open_transport,
    .peer_start = ucx_peer_start,
    .describe = ucx_describe,
    .peer_pause = ucx_peer_pause,
    .peer_resume = ucx_peer_resume,
    .peer_kill = ucx_peer_kill,
    .peer_free = ucx_peer_free,
};

static const backend_t backend_ucx_am = {
    .label = "ucx (am)",
    .name = "ucx",
    .remote = true,
    .mode = KVD_UCX_MODE_AM,
    .open = ucx_open_transport,
    .peer_start = ucx_peer_start,
    .describe = ucx_describe,
    .peer_pause = ucx_peer_pause,
    .peer_resume = ucx_peer_resume,
    .peer_kill = ucx_peer_kill,
    .peer_free = ucx_peer_free,
};

/* Skips the running case, saying why, where cond does not hold. */
#define SKIP_UNLESS(cond, why)                                   \
    do {                                                         \
        if (!(cond)) {                                           \
            print_message("SKIP on %s: %s\n", g_be->label, why); \
            skip();                                              \
        }                                                        \
    } while (0)

/* -------------------------------------------------------------- fixture */

typedef struct config {
    uint64_t a_bytes;    /* local region A */
    uint64_t peer_bytes; /* the peer's region */
} config_t;

static const config_t config_default = {.a_bytes = A_BYTES, .peer_bytes = PEER_BYTES};
static const config_t config_big = {.a_bytes = BIG_LOCAL_BYTES,
                                    .peer_bytes = BIG_PEER_BYTES};

/* Reports collected within a case, from polls and from kvd_transport_wait. */
typedef struct reports {
    kvd_xfer_done_t v[REPORTS_MAX];
    size_t n;
} reports_t;

typedef struct fixture {
    const config_t *cfg;
    kvd_transport_t *t;
    peer_t peer;
    /* local memory: A (cfg->a_bytes), B (B_BYTES), C (C1 then C2) */
    uint8_t *a, *b, *c;
    kvd_region_t *ra, *rb, *rc1, *rc2;
    reports_t rep;
} fixture_t;

/* Opens a transport, registers the local regions, starts a peer and
 * connects to it. *what says which step failed. */
static int fixture_open(fixture_t *f, const char **what)
{
    const uint64_t a_bytes = f->cfg->a_bytes;
    *what = "allocating local memory";
    f->a = aligned_alloc(4096, a_bytes);
    f->b = malloc(B_BYTES);
    f->c = aligned_alloc(4096, C1_BYTES + C2_BYTES);
    if (f->a == NULL || f->b == NULL || f->c == NULL)
        return KVD_ERR_NOMEM;
    fill(f->a, a_bytes, 1);
    fill(f->b, B_BYTES, 3);
    fill(f->c, C1_BYTES + C2_BYTES, 4);
    *what = "opening the transport";
    int rc = g_be->open(&f->t);
    if (rc != KVD_OK)
        return rc;
    *what = "registering the local regions";
    const kvd_memkind_t *host = kvd_memkind_host();
    rc = kvd_transport_register(f->t, f->a, a_bytes, host, &f->ra);
    if (rc == KVD_OK)
        rc = kvd_transport_register(f->t, f->b, B_BYTES, host, &f->rb);
    if (rc == KVD_OK)
        rc = kvd_transport_register(f->t, f->c, C1_BYTES, host, &f->rc1);
    if (rc == KVD_OK)
        rc = kvd_transport_register(f->t, f->c + C1_BYTES, C2_BYTES, host, &f->rc2);
    if (rc != KVD_OK)
        return rc;
    *what = "starting the peer";
    rc = g_be->peer_start(&f->peer, f->cfg->peer_bytes, f->cfg->peer_bytes, 2);
    if (rc != KVD_OK)
        return rc;
    *what = "connecting to the peer";
    kvd_peer_t d = g_be->describe(&f->peer);
    rc = kvd_transport_connect(f->t, &d);
    if (rc != KVD_OK)
        return rc;
    /* one READ, so that the endpoint is wired up both ways before a case
     * runs (test_connect_then_destroy_without_traffic is the case without
     * it); its bytes are put back */
    *what = "a first READ from the peer";
    uint8_t keep[64];
    memcpy(keep, f->a, sizeof(keep));
    const kvd_xfer_t x = {.local = f->ra, .length = sizeof(keep)};
    rc = kvd_transport_post(f->t, KVD_XFER_READ, &x, 1, UINT64_MAX - 1);
    if (rc == KVD_OK)
        rc = kvd_transport_wait(f->t, UINT64_MAX - 1, WAIT_MS, NULL, NULL, 0);
    memcpy(f->a, keep, sizeof(keep));
    return rc;
}

static void fixture_close(fixture_t *f)
{
    kvd_transport_destroy(f->t); /* deregisters the regions left */
    f->t = NULL;
    g_be->peer_free(&f->peer); /* after the transport: it may still answer it */
    free(f->a);
    free(f->b);
    free(f->c);
    f->a = f->b = f->c = NULL;
}

static int setup(void **state)
{
    const config_t *cfg = *state != NULL ? *state : &config_default;
    fixture_t *f = calloc(1, sizeof(*f));
    if (f == NULL)
        return -1;
    f->cfg = cfg;
    f->peer.stop_fd = -1;
    *state = f;
    const char *what = "";
    int rc = fixture_open(f, &what);
    if (rc != KVD_OK) {
        print_error("%s on %s (UCX_TLS %s): %s\n", what, g_be->label, tls_name(),
                    kvd_status_str(rc));
        return -1;
    }
    return 0;
}

static int teardown(void **state)
{
    fixture_t *f = *state;
    fixture_close(f);
    int thread_error = f->peer.thread_error;
    free(f);
    if (thread_error != 0) {
        print_error("server thread: poll failed: %s\n", strerror(thread_error));
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------ posts and waits */

static void note(fixture_t *f, uint64_t cookie, int status)
{
    if (f->rep.n == REPORTS_MAX)
        fail_msg("more than %d reports in one case", REPORTS_MAX);
    f->rep.v[f->rep.n++] = (kvd_xfer_done_t){.cookie = cookie, .status = status};
}

/* How many times cookie was reported in this case; *status the last. */
static unsigned times_reported(const fixture_t *f, uint64_t cookie, int *status)
{
    unsigned k = 0;
    for (size_t i = 0; i < f->rep.n; i++)
        if (f->rep.v[i].cookie == cookie) {
            k++;
            if (status != NULL)
                *status = f->rep.v[i].status;
        }
    return k;
}

/* Waits for `cookie`, keeping what else is reported; returns what the
 * wait returned, or the status it was reported with already (kept by an
 * earlier wait). A batch it returns (not a timeout) is noted too. */
static int wait_keep(fixture_t *f, uint64_t cookie, int ms)
{
    int rc = KVD_OK;
    if (times_reported(f, cookie, &rc) > 0)
        return rc;
    rc = kvd_transport_wait(f->t, cookie, ms, f->rep.v, &f->rep.n, (size_t)REPORTS_MAX);
    if (rc != KVD_ERR_TIMEOUT)
        note(f, cookie, rc);
    return rc;
}

static void post_ok(fixture_t *f, kvd_xfer_dir_t dir, const kvd_xfer_t *x, size_t n,
                    uint64_t cookie)
{
    int rc = kvd_transport_post(f->t, dir, x, n, cookie);
    if (rc != KVD_OK)
        fail_msg("post of batch %llu (%zu transfers, %s): %s", (unsigned long long)cookie,
                 n, dir == KVD_XFER_READ ? "READ" : "WRITE", kvd_status_str(rc));
}

static void wait_ok(fixture_t *f, uint64_t cookie)
{
    uint64_t t0 = kvd_now_ns();
    int rc = wait_keep(f, cookie, WAIT_MS);
    if (rc != KVD_OK)
        fail_msg("batch %llu: %s after %llu ms", (unsigned long long)cookie,
                 kvd_status_str(rc), (unsigned long long)ms_since(t0));
}

/* Posts a batch and waits for it: both must say KVD_OK. */
static void run_batch(fixture_t *f, kvd_xfer_dir_t dir, const kvd_xfer_t *x, size_t n,
                      uint64_t cookie)
{
    post_ok(f, dir, x, n, cookie);
    wait_ok(f, cookie);
}

/* Drives and polls t for ms milliseconds, noting every report. */
static void drain_for_ms(fixture_t *f, unsigned ms)
{
    uint64_t end = kvd_now_ns() + (uint64_t)ms * 1000000ull;
    do {
        kvd_xfer_done_t done[16];
        size_t n = 0;
        assert_int_equal(kvd_transport_poll(f->t, done, 16, &n), KVD_OK);
        assert_true(n <= 16);
        for (size_t i = 0; i < n; i++)
            note(f, done[i].cookie, done[i].status);
        if (n == 0)
            kvd_transport_progress(f->t);
    } while (kvd_now_ns() < end);
}

/* Drives and polls until the batches [first, first+count) were all
 * reported (WAIT_MS at most), then expects each exactly once with
 * KVD_OK, and no report of any other cookie. */
static void expect_all_once_ok(fixture_t *f, uint64_t first, uint64_t count)
{
    uint64_t deadline = kvd_now_ns() + (uint64_t)WAIT_MS * 1000000ull;
    for (;;) {
        uint64_t missing = 0;
        for (uint64_t c = first; c < first + count; c++)
            missing += times_reported(f, c, NULL) == 0;
        if (missing == 0)
            break;
        if (kvd_now_ns() >= deadline)
            fail_msg("%llu of %llu batches not reported after %d ms",
                     (unsigned long long)missing, (unsigned long long)count, WAIT_MS);
        drain_for_ms(f, 1);
    }
    drain_for_ms(f, 20); /* a second report would come now */
    for (size_t i = 0; i < f->rep.n; i++) {
        uint64_t c = f->rep.v[i].cookie;
        if (c < first || c - first >= count)
            fail_msg("report %zu: cookie %llu, never posted in this round", i,
                     (unsigned long long)c);
        int status = KVD_OK;
        unsigned k = times_reported(f, c, &status);
        if (k != 1)
            fail_msg("batch %llu reported %u times", (unsigned long long)c, k);
        if (f->rep.v[i].status != KVD_OK)
            fail_msg("batch %llu: %s", (unsigned long long)c,
                     kvd_status_str(f->rep.v[i].status));
    }
}

/* Drives t a while and expects nothing to be reported. */
static void expect_no_more(fixture_t *f)
{
    size_t before = f->rep.n;
    drain_for_ms(f, 20);
    if (f->rep.n != before)
        fail_msg("unexpected report: cookie %llu status %s",
                 (unsigned long long)f->rep.v[before].cookie,
                 kvd_status_str(f->rep.v[before].status));
}

/* --------------------------------------------------------- local memory */

/* The three local blocks, to snapshot and compare them as a whole. */
typedef struct local_image {
    uint8_t *a, *b, *c;
} local_image_t;

static local_image_t local_snapshot(const fixture_t *f)
{
    return (local_image_t){.a = dup_bytes(f->a, f->cfg->a_bytes),
                           .b = dup_bytes(f->b, B_BYTES),
                           .c = dup_bytes(f->c, C1_BYTES + C2_BYTES)};
}

/* Where in img the local address p of f's blocks is. */
static uint8_t *local_image_at(const fixture_t *f, const local_image_t *img,
                               const uint8_t *p)
{
    if (p >= f->a && p < f->a + f->cfg->a_bytes)
        return img->a + (p - f->a);
    if (p >= f->b && p < f->b + B_BYTES)
        return img->b + (p - f->b);
    if (p >= f->c && p < f->c + C1_BYTES + C2_BYTES)
        return img->c + (p - f->c);
    fail_msg("address %p is in none of the local blocks", (const void *)p);
    return NULL;
}

static void expect_local(const fixture_t *f, const local_image_t *want)
{
    expect_bytes(f->a, want->a, f->cfg->a_bytes, "local region A");
    expect_bytes(f->b, want->b, B_BYTES, "local region B");
    expect_bytes(f->c, want->c, C1_BYTES + C2_BYTES, "local regions C1, C2");
}

static void local_image_free(local_image_t *img)
{
    free(img->a);
    free(img->b);
    free(img->c);
}

static const uint8_t *xfer_local(const kvd_xfer_t *x)
{
    return (const uint8_t *)kvd_region_base(x->local) + x->local_offset;
}

/* What the peer's region and the local blocks must hold after the batch x
 * (destinations disjoint) moved dir: applied to the images. */
static void apply_batch(const fixture_t *f, kvd_xfer_dir_t dir, const kvd_xfer_t *x,
                        size_t n, uint8_t *peer_img, const local_image_t *local_img)
{
    for (size_t i = 0; i < n; i++) {
        if (x[i].length == 0)
            continue;
        if (dir == KVD_XFER_WRITE)
            memcpy(peer_img + x[i].remote_offset, xfer_local(&x[i]), x[i].length);
        else
            memcpy(local_image_at(f, local_img, xfer_local(&x[i])),
                   f->peer.bytes + x[i].remote_offset, x[i].length);
    }
}

/* Posts x, waits for it, and checks that exactly its bytes moved: the
 * destination side holds what apply_batch says, the source side is as it
 * was. */
static void run_and_check(fixture_t *f, kvd_xfer_dir_t dir, const kvd_xfer_t *x, size_t n,
                          uint64_t cookie)
{
    const uint64_t peer_len = f->peer.length;
    uint8_t *peer_img = dup_bytes(f->peer.bytes, peer_len);
    local_image_t local_img = local_snapshot(f);
    apply_batch(f, dir, x, n, peer_img, &local_img);
    run_batch(f, dir, x, n, cookie);
    expect_bytes(f->peer.bytes, peer_img, peer_len, "the peer's region");
    expect_local(f, &local_img);
    free(peer_img);
    local_image_free(&local_img);
}

/* True when [o1, o1+l1) and [o2, o2+l2) of the same memory overlap. */
static bool overlaps(uint64_t o1, uint64_t l1, uint64_t o2, uint64_t l2)
{
    return l1 > 0 && l2 > 0 && o1 < o2 + l2 && o2 < o1 + l1;
}

/* A random batch over the regions rs: offsets and lengths of every size
 * class (zero, a few bytes, pages, 256 KiB for UCX's zero-copy paths),
 * destinations disjoint so that the result does not depend on order. */
static size_t random_batch(uint64_t *seed, kvd_xfer_dir_t dir, kvd_region_t *const *rs,
                           size_t nr, uint64_t peer_len, kvd_xfer_t *x, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        for (int attempt = 0;; attempt++) {
            kvd_region_t *r = rs[rnd(seed) % nr];
            uint64_t rlen = kvd_region_length(r);
            uint64_t cap = KVD_MIN(rlen, peer_len), len;
            uint64_t cls = rnd(seed) % 20;
            if (attempt > 40 || cls == 0)
                len = attempt > 80 ? 0 : rnd_in(seed, 0, 8);
            else if (cls < 9)
                len = rnd_in(seed, 1, 128);
            else if (cls < 17)
                len = rnd_in(seed, 129, 8192);
            else
                len = rnd_in(seed, 8193, 256 * 1024);
            len = KVD_MIN(len, cap);
            kvd_xfer_t c = {.local = r,
                            .local_offset = rnd_in(seed, 0, rlen - len),
                            .remote_offset = rnd_in(seed, 0, peer_len - len),
                            .length = len};
            bool clash = false;
            for (size_t j = 0; j < i && !clash; j++) {
                if (dir == KVD_XFER_WRITE)
                    clash =
                        overlaps(c.remote_offset, len, x[j].remote_offset, x[j].length);
                else
                    clash = x[j].local == r &&
                            overlaps(c.local_offset, len, x[j].local_offset, x[j].length);
            }
            if (!clash) {
                x[i] = c;
                break;
            }
        }
    }
    return n;
}

/* ------------------------------------------------------- the cases: bytes */

static void test_name(void **state)
{
    fixture_t *f = *state;
    assert_string_equal(kvd_transport_name(f->t), g_be->name);
    assert_ptr_equal(kvd_region_base(f->ra), f->a);
    assert_int_equal(kvd_region_length(f->ra), f->cfg->a_bytes);
    assert_ptr_equal(kvd_region_base(f->rc2), f->c + C1_BYTES);
    assert_int_equal(kvd_region_length(f->rb), B_BYTES);
    assert_int_equal(kvd_region_length(f->rc2), C2_BYTES);
}

/* Fixed WRITE and READ batches at the edges of the regions: the first and
 * last byte, ranges ending exactly at a region's end, zero-length ones. */
static void test_batches_at_region_edges(void **state)
{
    fixture_t *f = *state;
    const kvd_xfer_t w[] = {
        {.local = f->ra, .local_offset = 0, .remote_offset = 1000, .length = 4096},
        {.local = f->ra, .local_offset = 12345, .remote_offset = 50000, .length = 777},
        {.local = f->ra, .local_offset = A_BYTES - 1, .remote_offset = 0, .length = 1},
        /* large enough for UCX's zero-copy paths */
        {.local = f->ra,
         .local_offset = 4096,
         .remote_offset = 300000,
         .length = 256 << 10},
        /* ends exactly at the end of the peer's region and of B */
        {.local = f->rb,
         .local_offset = B_BYTES - 300,
         .remote_offset = PEER_BYTES - 300,
         .length = 300},
        {.local = f->rc1, .local_offset = 0, .remote_offset = 700000, .length = C1_BYTES},
        {.local = f->rc2, .local_offset = 0, .remote_offset = 710000, .length = C2_BYTES},
        {.local = f->ra, .local_offset = 5, .remote_offset = 6, .length = 0},
    };
    run_and_check(f, KVD_XFER_WRITE, w, KVD_ARRAY_SIZE(w), 0xc0ffee);
    fill(f->peer.bytes + 512 * 1024, 256 * 1024, 9); /* the server only serves */
    const kvd_xfer_t r[] = {
        {.local = f->ra,
         .local_offset = 100,
         .remote_offset = PEER_BYTES - 8192,
         .length = 8192},
        {.local = f->ra, .local_offset = 40000, .remote_offset = 3, .length = 1500},
        {.local = f->ra, .local_offset = 0, .remote_offset = 0, .length = 64},
        {.local = f->ra,
         .local_offset = 65536,
         .remote_offset = 400001,
         .length = 200000},
        {.local = f->ra, .local_offset = A_BYTES - 1, .remote_offset = 77, .length = 1},
        /* ends exactly at the end of C1, then C2 right after it */
        {.local = f->rc1, .local_offset = 96, .remote_offset = 600000, .length = 4000},
        {.local = f->rc2, .local_offset = 0, .remote_offset = 520000, .length = 8192},
        {.local = f->rb, .local_offset = 0, .remote_offset = 530000, .length = B_BYTES},
        {.local = f->ra, .local_offset = 9, .remote_offset = PEER_BYTES, .length = 0},
        {.local = f->rb, .local_offset = B_BYTES, .remote_offset = 0, .length = 0},
    };
    run_and_check(f, KVD_XFER_READ, r, KVD_ARRAY_SIZE(r), UINT64_MAX);
    expect_no_more(f);
    assert_int_equal(times_reported(f, 0xc0ffee, NULL), 1);
    assert_int_equal(times_reported(f, UINT64_MAX, NULL), 1);
}

/* Random batches over all four regions, both directions: each moves
 * exactly its bytes and is reported once. READ sources may overlap. */
static void test_random_batches_move_exact_bytes(void **state)
{
    fixture_t *f = *state;
    kvd_region_t *const rs[] = {f->ra, f->rb, f->rc1, f->rc2};
    uint64_t seed = 0x5eed;
    kvd_xfer_t x[64];
    for (uint64_t round = 0; round < 24; round++) {
        kvd_xfer_dir_t dir = round % 2 ? KVD_XFER_READ : KVD_XFER_WRITE;
        size_t n = 1 + rnd(&seed) % KVD_ARRAY_SIZE(x);
        random_batch(&seed, dir, rs, KVD_ARRAY_SIZE(rs), PEER_BYTES, x, n);
        run_and_check(f, dir, x, n, 1000 + round);
        if (dir == KVD_XFER_READ) {
            /* fresh bytes to read; the peer's thread read the old ones, and
             * pausing it (a join) orders those reads before these writes,
             * for ThreadSanitizer as for the hardware */
            if (g_be->remote)
                g_be->peer_pause(&f->peer);
            fill(f->peer.bytes, PEER_BYTES, (uint32_t)round);
            if (g_be->remote)
                assert_int_equal(g_be->peer_resume(&f->peer), KVD_OK);
        }
    }
    expect_all_once_ok(f, 1000, 24);
}

/* Many batches posted (and finished) before anyone polls: each cookie is
 * reported exactly once, with KVD_OK, and every byte moved; where batches
 * finish at post, in posting order. */
static void test_batches_posted_before_polling_reported_once(void **state)
{
    fixture_t *f = *state;
    enum { ROUNDS = 3, PER_ROUND = 34, BATCHES = ROUNDS * PER_ROUND, SLOT = 64 };
    uint8_t *r = f->peer.bytes;
    const uint64_t write_from = 256 * 1024, write_to = 512 * 1024;
    for (uint64_t i = 0; i < BATCHES; i++) {
        /* a READ brings remote slot i to local slot i; a WRITE takes local
         * slot i (of a second area) to remote slot i (of a second area) */
        kvd_xfer_dir_t dir = (i % 2 == 0) ? KVD_XFER_READ : KVD_XFER_WRITE;
        kvd_xfer_t x = {.local = f->ra,
                        .local_offset = i * SLOT,
                        .remote_offset = i * SLOT,
                        .length = SLOT};
        if (dir == KVD_XFER_WRITE)
            x = (kvd_xfer_t){.local = f->ra,
                             .local_offset = write_from + i * SLOT,
                             .remote_offset = write_to + i * SLOT,
                             .length = SLOT};
        post_ok(f, dir, &x, 1, 5000 + i);
        /* between rounds, let them finish unpolled */
        if (i % PER_ROUND == PER_ROUND - 1) {
            uint64_t end = kvd_now_ns() + 50000000ull;
            while (kvd_now_ns() < end)
                kvd_transport_progress(f->t);
        }
    }
    if (g_be->completes_at_post) {
        kvd_xfer_done_t done[BATCHES + 5];
        size_t n = 0;
        assert_int_equal(kvd_transport_poll(f->t, done, BATCHES + 5, &n), KVD_OK);
        assert_int_equal(n, BATCHES);
        for (uint64_t i = 0; i < BATCHES; i++) {
            assert_true(done[i].cookie == 5000 + i);
            note(f, done[i].cookie, done[i].status);
        }
    }
    expect_all_once_ok(f, 5000, BATCHES);
    for (uint64_t i = 0; i < BATCHES; i++) {
        if (i % 2 == 0)
            expect_bytes(f->a + i * SLOT, r + i * SLOT, SLOT, "a READ slot");
        else
            expect_bytes(r + write_to + i * SLOT, f->a + write_from + i * SLOT, SLOT,
                         "a WRITE slot");
    }
}

/* Polls taking a few at a time while more are posted (the backend's ring
 * of reports wraps, then grows with its contents wrapped): each batch is
 * reported once; where batches finish at post, a poll returns as many as
 * it may and in posting order. */
static void test_partial_polls_interleaved_with_posts(void **state)
{
    fixture_t *f = *state;
    kvd_xfer_t x = {.local = f->ra, .local_offset = 0, .remote_offset = 0, .length = 8};
    uint64_t next_post = 0, next_done = 0;
    kvd_xfer_done_t done[7];
    for (int round = 0; round < 60; round++) {
        int posts = 1 + round % 5;
        for (int k = 0; k < posts; k++)
            post_ok(f, KVD_XFER_READ, &x, 1, next_post++);
        size_t n = 99;
        size_t max = 1 + (size_t)round % 4;
        kvd_transport_progress(f->t);
        assert_int_equal(kvd_transport_poll(f->t, done, max, &n), KVD_OK);
        assert_true(n <= max);
        if (g_be->completes_at_post)
            assert_true(n == KVD_MIN(max, next_post - next_done));
        for (size_t i = 0; i < n; i++) {
            if (g_be->completes_at_post)
                assert_true(done[i].cookie == next_done);
            next_done++;
            note(f, done[i].cookie, done[i].status);
        }
    }
    expect_all_once_ok(f, 0, next_post);
}

static void test_poll_without_reports(void **state)
{
    fixture_t *f = *state;
    kvd_xfer_done_t done[8];
    size_t n = 99;
    assert_int_equal(kvd_transport_poll(f->t, done, 8, &n), KVD_OK);
    assert_int_equal(n, 0);
    n = 99;
    assert_int_equal(kvd_transport_poll(f->t, done, 0, &n), KVD_OK);
    assert_int_equal(n, 0);
    /* a batch done, polled with room for none: still there for the next */
    kvd_xfer_t x = {.local = f->ra, .local_offset = 0, .remote_offset = 0, .length = 8};
    post_ok(f, KVD_XFER_READ, &x, 1, 77);
    kvd_transport_progress(f->t);
    n = 99;
    assert_int_equal(kvd_transport_poll(f->t, done, 0, &n), KVD_OK);
    assert_int_equal(n, 0);
    expect_all_once_ok(f, 77, 1);
}

/* Batches of only zero-length transfers move nothing, and each is still
 * reported exactly once (also those that finish while they are posted). */
static void test_zero_length_batches_reported_once(void **state)
{
    fixture_t *f = *state;
    enum { BATCHES = 40 };
    local_image_t before = local_snapshot(f);
    uint8_t *peer_before = dup_bytes(f->peer.bytes, PEER_BYTES);
    const kvd_xfer_t x[] = {
        {.local = f->ra, .local_offset = 7, .remote_offset = 11},
        {.local = f->rb, .local_offset = B_BYTES, .remote_offset = PEER_BYTES},
        {.local = f->rc2, .local_offset = 0, .remote_offset = 0},
    };
    for (uint64_t i = 0; i < BATCHES; i++)
        post_ok(f, i < BATCHES / 2 ? KVD_XFER_READ : KVD_XFER_WRITE, x, 1 + i % 3,
                100 + i);
    expect_all_once_ok(f, 100, BATCHES);
    expect_local(f, &before);
    expect_bytes(f->peer.bytes, peer_before, PEER_BYTES, "the peer's region");
    local_image_free(&before);
    free(peer_before);
}

/* 1,000 rows of 72 bytes from scattered local places (two regions) to
 * consecutive offsets of the peer's region, then a second run after a
 * gap, in one WRITE batch: in the ucx message mode the backend gathers
 * the runs into staged messages; the peer's region must get exactly the
 * rows, in their places. Then the same shape READ back, scattered. */
static void test_adjacent_rows_gathered(void **state)
{
    fixture_t *f = *state;
    enum { ROWS = 1000, ROW = 72, SLOTS_A = A_BYTES / ROW, SLOTS_B = B_BYTES / ROW };
    static kvd_xfer_t x[ROWS + 3];
    uint64_t seed = 72;
    uint64_t remote = 4000;
    for (size_t i = 0; i < ROWS; i++) {
        bool from_b = rnd(&seed) % 8 == 0;
        x[i] = (kvd_xfer_t){
            .local = from_b ? f->rb : f->ra,
            .local_offset = (rnd(&seed) % (from_b ? SLOTS_B : SLOTS_A)) * ROW,
            .remote_offset = remote,
            .length = ROW,
        };
        remote += ROW;
        if (i == ROWS / 2)
            remote += 4096; /* a gap: a second run */
    }
    /* a zero-length row inside the run, and a run of other sizes */
    x[ROWS] = (kvd_xfer_t){.local = f->rc1, .local_offset = 0, .remote_offset = remote};
    x[ROWS + 1] = (kvd_xfer_t){
        .local = f->rc1, .local_offset = 1, .remote_offset = remote, .length = 3000};
    x[ROWS + 2] = (kvd_xfer_t){.local = f->rc2,
                               .local_offset = 5,
                               .remote_offset = remote + 3000,
                               .length = 8000};
    run_and_check(f, KVD_XFER_WRITE, x, KVD_ARRAY_SIZE(x), 1);

    /* READ: adjacent remote rows to scattered, disjoint local rows */
    fill(f->peer.bytes, PEER_BYTES, 11);
    uint32_t *perm = malloc(SLOTS_A * sizeof(*perm));
    assert_non_null(perm);
    for (uint32_t i = 0; i < SLOTS_A; i++)
        perm[i] = i;
    for (uint32_t i = SLOTS_A - 1; i > 0; i--) {
        uint32_t j = (uint32_t)(rnd(&seed) % (i + 1));
        uint32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    for (size_t i = 0; i < ROWS; i++) {
        x[i].local = f->ra;
        x[i].local_offset = (uint64_t)perm[i] * ROW;
    }
    run_and_check(f, KVD_XFER_READ, x, KVD_ARRAY_SIZE(x), 2);
    free(perm);
    expect_all_once_ok(f, 1, 2);
}

/* 10,000 small transfers in one batch, each way, not adjacent in the
 * peer's region. */
static void test_ten_thousand_small_transfers(void **state)
{
    fixture_t *f = *state;
    enum { N = 10000, LEN = 40, STRIDE = 100 };
    kvd_xfer_t *x = calloc(N, sizeof(*x));
    assert_non_null(x);
    uint64_t seed = 10000;
    for (size_t i = 0; i < N; i++)
        x[i] = (kvd_xfer_t){.local = f->ra,
                            .local_offset = rnd(&seed) % (A_BYTES - LEN),
                            .remote_offset = i * STRIDE + rnd(&seed) % (STRIDE - LEN),
                            .length = LEN};
    run_and_check(f, KVD_XFER_WRITE, x, N, 1);
    for (size_t i = 0; i < N; i++)
        x[i].local_offset = i * (A_BYTES / N); /* READ: destinations disjoint */
    run_and_check(f, KVD_XFER_READ, x, N, 2);
    free(x);
    expect_all_once_ok(f, 1, 2);
}

/* A region of a memory kind of the test's own (host memory behind it):
 * the bytes still move exactly; backends that copy through the kind use
 * its copy, in the right direction, and its sync. */
static struct {
    unsigned copies_in, copies_out, syncs;
} kind_calls;

static int counting_copy(const kvd_memkind_t *k, void *dst, const void *src, size_t n,
                         bool into_region)
{
    (void)k;
    if (into_region)
        kind_calls.copies_in++;
    else
        kind_calls.copies_out++;
    memcpy(dst, src, n);
    return KVD_OK;
}

static int counting_sync(const kvd_memkind_t *k)
{
    (void)k;
    kind_calls.syncs++;
    return KVD_OK;
}

static const kvd_memkind_t counting_kind = {
    .name = "test-counting", .copy = counting_copy, .sync = counting_sync};

static void test_region_of_another_memory_kind(void **state)
{
    fixture_t *f = *state;
    uint8_t *mem = aligned_alloc(4096, 65536);
    assert_non_null(mem);
    fill(mem, 65536, 21);
    kvd_region_t *r = NULL;
    int rc = kvd_transport_register(f->t, mem, 65536, &counting_kind, &r);
    if (rc != KVD_OK) {
        free(mem);
        print_message("a region of kind %s: %s\n", counting_kind.name,
                      kvd_status_str(rc));
        SKIP_UNLESS(rc == KVD_OK, "the backend takes no region of a kind of its own");
    }
    memset(&kind_calls, 0, sizeof(kind_calls));
    const kvd_xfer_t w[] = {
        {.local = r, .local_offset = 0, .remote_offset = 0, .length = 1000},
        {.local = f->ra, .local_offset = 0, .remote_offset = 2000, .length = 1000},
        {.local = r, .local_offset = 60000, .remote_offset = 10000, .length = 5536},
    };
    uint8_t *want = dup_bytes(f->peer.bytes, PEER_BYTES);
    memcpy(want, mem, 1000);
    memcpy(want + 2000, f->a, 1000);
    memcpy(want + 10000, mem + 60000, 5536);
    run_batch(f, KVD_XFER_WRITE, w, KVD_ARRAY_SIZE(w), 1);
    expect_bytes(f->peer.bytes, want, PEER_BYTES, "the peer's region");
    if (g_be->uses_kind_copy) {
        assert_true(kind_calls.copies_out >= 2);
        assert_int_equal(kind_calls.copies_in, 0);
        assert_true(kind_calls.syncs >= 1); /* before the bytes left the region */
    }
    memset(&kind_calls, 0, sizeof(kind_calls));
    const kvd_xfer_t rd = {
        .local = r, .local_offset = 100, .remote_offset = 300000, .length = 30000};
    memcpy(want, mem, 65536);
    memcpy(want + 100, f->peer.bytes + 300000, 30000);
    run_batch(f, KVD_XFER_READ, &rd, 1, 2);
    expect_bytes(mem, want, 65536, "the region of the test's kind");
    if (g_be->uses_kind_copy) {
        assert_true(kind_calls.copies_in >= 1);
        assert_int_equal(kind_calls.copies_out, 0);
        assert_true(kind_calls.syncs >= 1); /* before the batch was reported */
    }
    kvd_transport_deregister(f->t, r);
    free(want);
    free(mem);
    expect_all_once_ok(f, 1, 2);
}

/* ------------------------------------------------ the cases: large batches */

/* 64 MiB in one transfer, each way. */
static void test_one_64_mib_transfer(void **state)
{
    fixture_t *f = *state;
    const kvd_xfer_t w = {.local = f->ra,
                          .local_offset = 4096,
                          .remote_offset = BIG_PEER_BYTES - BIG_XFER_BYTES - 12,
                          .length = BIG_XFER_BYTES};
    run_and_check(f, KVD_XFER_WRITE, &w, 1, 1);
    fill(f->peer.bytes, BIG_PEER_BYTES, 64);
    const kvd_xfer_t r = {.local = f->ra,
                          .local_offset = 3,
                          .remote_offset = 8 << 20,
                          .length = BIG_XFER_BYTES};
    run_and_check(f, KVD_XFER_READ, &r, 1, 2);
    expect_all_once_ok(f, 1, 2);
}

/* Rows of assorted sizes (72 bytes to more than one staged message) from
 * scattered local places to consecutive remote offsets, more than
 * KVD_UCX_STAGE_BYTES in all. */
static size_t staged_run(uint64_t *seed, kvd_region_t *r, uint64_t remote, uint64_t total,
                         kvd_xfer_t *x, size_t max)
{
    static const uint64_t sizes[] = {72, 4096, 65536 + 8, 1 << 20,
                                     KVD_UCX_STAGE_CHUNK + 5};
    uint64_t rlen = kvd_region_length(r), moved = 0;
    size_t n = 0;
    while (moved < total && n < max) {
        uint64_t len = sizes[rnd(seed) % KVD_ARRAY_SIZE(sizes)];
        len = KVD_MIN(len, total - moved);
        x[n++] = (kvd_xfer_t){.local = r,
                              .local_offset = rnd(seed) % (rlen - len),
                              .remote_offset = remote + moved,
                              .length = len};
        moved += len;
    }
    return n;
}

/* Two WRITE batches of adjacent rows, each larger than the staging
 * buffer, posted back to back before either is waited for. */
static void test_batches_larger_than_staging(void **state)
{
    fixture_t *f = *state;
    enum { MAX = 4096 };
    const uint64_t total = KVD_UCX_STAGE_BYTES + (3 << 20) + 77;
    static kvd_xfer_t x1[MAX], x2[MAX];
    uint64_t seed = 32;
    size_t n1 = staged_run(&seed, f->ra, 100, total, x1, MAX);
    size_t n2 = staged_run(&seed, f->ra, total + 4096, total, x2, MAX);
    assert_true(total + 4096 + total <= BIG_PEER_BYTES);
    uint8_t *want = dup_bytes(f->peer.bytes, BIG_PEER_BYTES);
    apply_batch(f, KVD_XFER_WRITE, x1, n1, want, NULL);
    apply_batch(f, KVD_XFER_WRITE, x2, n2, want, NULL);
    post_ok(f, KVD_XFER_WRITE, x1, n1, 1);
    post_ok(f, KVD_XFER_WRITE, x2, n2, 2);
    wait_ok(f, 2);
    wait_ok(f, 1);
    expect_bytes(f->peer.bytes, want, BIG_PEER_BYTES, "the peer's region");
    free(want);
    /* and read back the same way, scattered over disjoint local places */
    fill(f->peer.bytes, BIG_PEER_BYTES, 33);
    uint64_t local = 0;
    for (size_t i = 0; i < n1; i++) {
        x1[i].local_offset = local;
        local += x1[i].length + 8;
    }
    assert_true(local <= BIG_LOCAL_BYTES);
    run_and_check(f, KVD_XFER_READ, x1, n1, 3);
    expect_all_once_ok(f, 1, 3);
}

/* ------------------------------------------------ the cases: refusals */

/* Every way a batch can be wrong: refused whole (also when a good
 * transfer comes first), never reported, nothing moved. */
static void test_bad_batches_refused_nothing_moved(void **state)
{
    fixture_t *f = *state;
    local_image_t before = local_snapshot(f);
    uint8_t *peer_before = dup_bytes(f->peer.bytes, PEER_BYTES);

    /* a region of another transport (same backend), and one of shm */
    kvd_transport_t *other = NULL, *shm = NULL;
    kvd_region_t *r_other = NULL, *r_shm = NULL;
    assert_int_equal(g_be->open(&other), KVD_OK);
    assert_int_equal(kvd_transport_open_shm(&shm), KVD_OK);
    assert_int_equal(
        kvd_transport_register(other, f->a, 4096, kvd_memkind_host(), &r_other), KVD_OK);
    assert_int_equal(kvd_transport_register(shm, f->a, 4096, kvd_memkind_host(), &r_shm),
                     KVD_OK);

    kvd_region_t *ra = f->ra, *rb = f->rb, *rc1 = f->rc1;
    const kvd_xfer_t good = {
        .local = ra, .local_offset = 0, .remote_offset = 0, .length = 4096};
    const kvd_xfer_t bad[] = {
        /* one byte past the end of the local region */
        {.local = ra, .local_offset = A_BYTES - 100, .remote_offset = 0, .length = 101},
        {.local = rb, .local_offset = 0, .remote_offset = 0, .length = B_BYTES + 1},
        /* across from C1 into C2: the memory is there, the region ends */
        {.local = rc1, .local_offset = C1_BYTES - 10, .remote_offset = 0, .length = 20},
        /* starts past the end of the local region */
        {.local = ra, .local_offset = A_BYTES + 1, .remote_offset = 0, .length = 0},
        {.local = rb, .local_offset = UINT64_MAX, .remote_offset = 0, .length = 1},
        /* local offset + length wraps around 2^64 */
        {.local = ra, .local_offset = UINT64_MAX - 10, .remote_offset = 0, .length = 20},
        /* one byte past the end of the peer's region */
        {.local = ra,
         .local_offset = 0,
         .remote_offset = PEER_BYTES - 100,
         .length = 101},
        /* starts past the end of the peer's region */
        {.local = ra, .local_offset = 0, .remote_offset = PEER_BYTES + 1, .length = 0},
        {.local = ra, .local_offset = 0, .remote_offset = PEER_BYTES + 4096, .length = 1},
        {.local = ra, .local_offset = 0, .remote_offset = UINT64_MAX, .length = 1},
        {.local = ra, .local_offset = 0, .remote_offset = UINT64_MAX, .length = 0},
        /* remote offset + length wraps around 2^64 */
        {.local = ra, .local_offset = 16, .remote_offset = 16, .length = UINT64_MAX - 8},
        {.local = ra, .local_offset = 0, .remote_offset = UINT64_MAX - 10, .length = 20},
        /* longer than the peer's region (inside A: A is smaller) */
        {.local = ra, .local_offset = 0, .remote_offset = 0, .length = PEER_BYTES + 1},
        /* no region, a region of another transport, of another backend */
        {.local = NULL, .local_offset = 0, .remote_offset = 0, .length = 64},
        {.local = NULL, .local_offset = 0, .remote_offset = 0, .length = 0},
        {.local = r_other, .local_offset = 0, .remote_offset = 0, .length = 64},
        {.local = r_shm, .local_offset = 0, .remote_offset = 0, .length = 64},
        {.local = r_other, .local_offset = 0, .remote_offset = 0, .length = 0},
    };
    for (size_t i = 0; i < KVD_ARRAY_SIZE(bad); i++) {
        for (int dir = KVD_XFER_READ; dir <= KVD_XFER_WRITE; dir++) {
            /* the bad transfer after good ones: the good ones must not move */
            kvd_xfer_t batch[3] = {good, bad[i], good};
            batch[2].local = rb;
            batch[2].remote_offset = 8192;
            int rc = kvd_transport_post(f->t, (kvd_xfer_dir_t)dir, batch, 3, 100 + i);
            if (rc != KVD_ERR_INVALID)
                fail_msg("bad transfer %zu (%s) after a good one: %s, want invalid", i,
                         dir == KVD_XFER_READ ? "READ" : "WRITE", kvd_status_str(rc));
            rc = kvd_transport_post(f->t, (kvd_xfer_dir_t)dir, &bad[i], 1, 200 + i);
            if (rc != KVD_ERR_INVALID)
                fail_msg("bad transfer %zu (%s) alone: %s, want invalid", i,
                         dir == KVD_XFER_READ ? "READ" : "WRITE", kvd_status_str(rc));
        }
    }
    /* a refused batch is never reported, and moved nothing */
    expect_no_more(f);
    expect_local(f, &before);
    expect_bytes(f->peer.bytes, peer_before, PEER_BYTES, "the peer's region");
    /* nor did the other transports see any of it */
    kvd_xfer_done_t done[4];
    size_t n = 99;
    assert_int_equal(kvd_transport_poll(shm, done, 4, &n), KVD_OK);
    assert_int_equal(n, 0);

    /* and the transport still works */
    kvd_xfer_t ok = good;
    run_and_check(f, KVD_XFER_WRITE, &ok, 1, 300);
    kvd_transport_destroy(other); /* with its region still registered */
    kvd_transport_deregister(shm, r_shm);
    kvd_transport_destroy(shm);
    local_image_free(&before);
    free(peer_before);
}

/* register refuses what cannot be a region, leaving *out alone;
 * deregister takes NULL; destroy takes NULL. */
static void test_register_refuses_bad_ranges(void **state)
{
    fixture_t *f = *state;
    kvd_region_t *sentinel = (kvd_region_t *)(uintptr_t)0x1234, *r = sentinel;
    const kvd_memkind_t *host = kvd_memkind_host();
    assert_int_equal(kvd_transport_register(f->t, NULL, 4096, host, &r), KVD_ERR_INVALID);
    assert_int_equal(kvd_transport_register(f->t, f->a, 0, host, &r), KVD_ERR_INVALID);
    assert_int_equal(
        kvd_transport_register(f->t, (void *)(UINTPTR_MAX - 4095), 8192, host, &r),
        KVD_ERR_INVALID);
    assert_ptr_equal(r, sentinel);
    kvd_transport_deregister(f->t, NULL);
    kvd_transport_destroy(NULL);
    /* two regions over the same memory are fine */
    kvd_region_t *again = NULL;
    assert_int_equal(kvd_transport_register(f->t, f->a, 4096, host, &again), KVD_OK);
    assert_ptr_not_equal(again, f->ra);
    const kvd_xfer_t x = {
        .local = again, .local_offset = 0, .remote_offset = 0, .length = 4096};
    run_and_check(f, KVD_XFER_WRITE, &x, 1, 1);
    kvd_transport_deregister(f->t, again);
}

/* Deregister, then register the same memory again (and new memory): the
 * new regions work. */
static void test_deregister_then_register_again(void **state)
{
    fixture_t *f = *state;
    const kvd_memkind_t *host = kvd_memkind_host();
    for (uint64_t round = 0; round < 3; round++) {
        kvd_transport_deregister(f->t, f->rb);
        f->rb = NULL;
        assert_int_equal(kvd_transport_register(f->t, f->b, B_BYTES, host, &f->rb),
                         KVD_OK);
        const kvd_xfer_t x[] = {
            {.local = f->rb, .local_offset = 0, .remote_offset = 1000, .length = B_BYTES},
            {.local = f->ra, .local_offset = 0, .remote_offset = 20000, .length = 100},
        };
        run_and_check(f, KVD_XFER_WRITE, x, 2, 10 + round);
        run_and_check(f, KVD_XFER_READ, x, 1, 20 + round);
    }
    /* a region of its own memory, used, deregistered, its memory freed */
    uint8_t *mem = malloc(100000);
    assert_non_null(mem);
    fill(mem, 100000, 5);
    kvd_region_t *r = NULL;
    assert_int_equal(kvd_transport_register(f->t, mem, 100000, host, &r), KVD_OK);
    const kvd_xfer_t y = {
        .local = r, .local_offset = 3, .remote_offset = 500000, .length = 99990};
    uint8_t *want = dup_bytes(f->peer.bytes, PEER_BYTES);
    memcpy(want + 500000, mem + 3, 99990);
    run_batch(f, KVD_XFER_WRITE, &y, 1, 30);
    expect_bytes(f->peer.bytes, want, PEER_BYTES, "the peer's region");
    kvd_transport_deregister(f->t, r);
    free(mem);
    free(want);
    /* the others are untouched by that */
    const kvd_xfer_t z = {
        .local = f->rc2, .local_offset = 0, .remote_offset = 0, .length = C2_BYTES};
    run_and_check(f, KVD_XFER_READ, &z, 1, 31);
}

/* ------------------------------------------------- the cases: peers */

/* Without a peer a post says KVD_ERR_CLOSED; connected, it works;
 * disconnected, KVD_ERR_CLOSED again; a connect that fails leaves the
 * transport disconnected; and a disconnect of a transport with no peer
 * is fine. */
static void test_post_without_peer_closed(void **state)
{
    fixture_t *f = *state;
    kvd_transport_t *t = NULL;
    kvd_region_t *r = NULL;
    assert_int_equal(g_be->open(&t), KVD_OK);
    assert_int_equal(kvd_transport_register(t, f->a, 65536, kvd_memkind_host(), &r),
                     KVD_OK);
    const kvd_xfer_t x = {
        .local = r, .local_offset = 0, .remote_offset = 0, .length = 4096};
    const kvd_xfer_t empty = {.local = r};
    assert_int_equal(kvd_transport_post(t, KVD_XFER_READ, &x, 1, 1), KVD_ERR_CLOSED);
    assert_int_equal(kvd_transport_post(t, KVD_XFER_WRITE, &x, 1, 2), KVD_ERR_CLOSED);
    assert_int_equal(kvd_transport_post(t, KVD_XFER_READ, &empty, 1, 3), KVD_ERR_CLOSED);
    kvd_transport_disconnect(t); /* none: fine */
    kvd_xfer_done_t done[4];
    size_t n = 99;
    assert_int_equal(kvd_transport_poll(t, done, 4, &n), KVD_OK);
    assert_int_equal(n, 0);
    assert_int_equal(kvd_transport_wait(t, 1, 0, NULL, NULL, 0), KVD_ERR_TIMEOUT);

    /* connected, then disconnected */
    kvd_peer_t d = g_be->describe(&f->peer);
    assert_int_equal(kvd_transport_connect(t, &d), KVD_OK);
    assert_int_equal(kvd_transport_post(t, KVD_XFER_READ, &x, 1, 4), KVD_OK);
    assert_int_equal(kvd_transport_wait(t, 4, WAIT_MS, NULL, NULL, 0), KVD_OK);
    expect_bytes(f->a, f->peer.bytes, 4096, "the bytes read");
    kvd_transport_disconnect(t);
    assert_int_equal(kvd_transport_post(t, KVD_XFER_READ, &x, 1, 5), KVD_ERR_CLOSED);
    kvd_transport_disconnect(t); /* twice: fine */

    /* a connect that fails leaves it disconnected, also when it had a peer */
    assert_int_equal(kvd_transport_connect(t, &d), KVD_OK);
    kvd_peer_t bad = d;
    bad.length = 0;
    assert_int_equal(kvd_transport_connect(t, &bad), KVD_ERR_INVALID);
    int rc = kvd_transport_post(t, KVD_XFER_READ, &x, 1, 6);
    if (rc != KVD_ERR_CLOSED)
        fail_msg("post after a failed connect: %s, want closed (a failed connect leaves "
                 "the transport disconnected)",
                 kvd_status_str(rc));
    assert_int_equal(kvd_transport_connect(t, &d), KVD_OK);
    assert_int_equal(kvd_transport_post(t, KVD_XFER_WRITE, &x, 1, 7), KVD_OK);
    assert_int_equal(kvd_transport_wait(t, 7, WAIT_MS, NULL, NULL, 0), KVD_OK);
    n = 99;
    assert_int_equal(kvd_transport_poll(t, done, 4, &n), KVD_OK);
    assert_int_equal(n, 0);
    kvd_transport_destroy(t); /* connected, with a region: destroy undoes both */
}

/* connect refuses descriptions the backend cannot use. */
static void test_connect_refuses_bad_peers(void **state)
{
    fixture_t *f = *state;
    const kvd_peer_t good = g_be->describe(&f->peer);
    kvd_peer_t p = good;
    assert_int_equal(kvd_transport_connect(f->t, NULL), KVD_ERR_INVALID);
    p.length = 0;
    assert_int_equal(kvd_transport_connect(f->t, &p), KVD_ERR_INVALID);
    if (!g_be->remote) {
        p = good;
        p.mapping = NULL;
        assert_int_equal(kvd_transport_connect(f->t, &p), KVD_ERR_INVALID);
    } else {
        p = good;
        p.ucx.address = NULL;
        assert_int_equal(kvd_transport_connect(f->t, &p), KVD_ERR_INVALID);
        p = good;
        p.ucx.address_len = 0;
        assert_int_equal(kvd_transport_connect(f->t, &p), KVD_ERR_INVALID);
        /* RMA needs the rkey, the message mode its capability */
        p = good;
        *(g_be->mode == KVD_UCX_MODE_RMA ? &p.ucx.rkey : &p.ucx.cap) = NULL;
        assert_int_equal(kvd_transport_connect(f->t, &p), KVD_ERR_INVALID);
        p = good;
        *(g_be->mode == KVD_UCX_MODE_RMA ? &p.ucx.rkey_len : &p.ucx.cap_len) = 0;
        assert_int_equal(kvd_transport_connect(f->t, &p), KVD_ERR_INVALID);
        if (g_be->mode == KVD_UCX_MODE_AM) {
            p = good;
            p.ucx.cap_len = KVD_UCX_CAP_BYTES - 1;
            assert_int_equal(kvd_transport_connect(f->t, &p), KVD_ERR_INVALID);
        }
        p = good;
        p.ucx.mode = (kvd_ucx_mode_t)7;
        assert_int_equal(kvd_transport_connect(f->t, &p), KVD_ERR_INVALID);
    }
    /* the description's bytes were copied by connect: a good one, then
     * its buffers scribbled over */
    kvd_peer_t copy = good;
    uint8_t *addr = NULL, *rkey = NULL, *cap = NULL;
    if (g_be->remote) {
        addr = dup_bytes(good.ucx.address, good.ucx.address_len);
        rkey = dup_bytes(good.ucx.rkey, good.ucx.rkey_len);
        cap = dup_bytes(good.ucx.cap, good.ucx.cap_len);
        copy.ucx.address = addr;
        copy.ucx.rkey = rkey;
        copy.ucx.cap = cap;
    }
    assert_int_equal(kvd_transport_connect(f->t, &copy), KVD_OK);
    if (g_be->remote) {
        memset(addr, 0xa5, good.ucx.address_len);
        memset(rkey, 0xa5, good.ucx.rkey_len);
        memset(cap, 0xa5, good.ucx.cap_len);
    }
    const kvd_xfer_t x = {
        .local = f->ra, .local_offset = 0, .remote_offset = 0, .length = 65536};
    run_and_check(f, KVD_XFER_WRITE, &x, 1, 1);
    run_and_check(f, KVD_XFER_READ, &x, 1, 2);
    free(addr);
    free(rkey);
    free(cap);
}

/* Connecting to another peer region makes later batches go there (its
 * length is the limit now); connecting back works too. Where the peer is
 * remote, a batch outstanding on the old peer (stalled) is reported
 * failed first. */
static void test_connect_again_moves_to_new_peer(void **state)
{
    fixture_t *f = *state;
    peer_t p2 = {.stop_fd = -1};
    assert_int_equal(g_be->peer_start(&p2, PEER2_BYTES, PEER2_BYTES, 77), KVD_OK);
    const kvd_xfer_t x = {
        .local = f->ra, .local_offset = 100, .remote_offset = 1000, .length = 50000};
    /* batch 1 may still land on peer 1 late (it was stalled): its bytes
     * are there already, so that a late landing changes nothing */
    memcpy(f->peer.bytes + 1000, f->a + 100, 50000);
    uint8_t *p1_before = dup_bytes(f->peer.bytes, PEER_BYTES);

    if (g_be->remote) {
        /* outstanding on peer 1 while it is stalled */
        g_be->peer_pause(&f->peer);
        post_ok(f, KVD_XFER_WRITE, &x, 1, 1);
    }
    kvd_peer_t d2 = g_be->describe(&p2);
    assert_int_equal(kvd_transport_connect(f->t, &d2), KVD_OK);
    if (g_be->remote) {
        drain_for_ms(f, 0);
        int status = KVD_OK;
        unsigned k = times_reported(f, 1, &status);
        if (k != 1 || status == KVD_OK)
            fail_msg("the batch outstanding on the old peer: reported %u times, %s; want "
                     "once, failed (closed) before connect returned",
                     k, kvd_status_str(status));
        if (status != KVD_ERR_CLOSED)
            print_message("the batch outstanding on the old peer failed with %s\n",
                          kvd_status_str(status));
        f->rep.n = 0;
    }

    /* peer 2's length is the limit now */
    const kvd_xfer_t past = {
        .local = f->ra, .remote_offset = PEER2_BYTES - 10, .length = 11};
    assert_int_equal(kvd_transport_post(f->t, KVD_XFER_WRITE, &past, 1, 2),
                     KVD_ERR_INVALID);
    uint8_t *want2 = dup_bytes(p2.bytes, PEER2_BYTES);
    memcpy(want2 + 1000, f->a + 100, 50000);
    run_batch(f, KVD_XFER_WRITE, &x, 1, 3);
    const kvd_xfer_t edge = {.local = f->rb,
                             .local_offset = 0,
                             .remote_offset = PEER2_BYTES - 1000,
                             .length = 1000};
    memcpy(want2 + PEER2_BYTES - 1000, f->b, 1000);
    run_batch(f, KVD_XFER_WRITE, &edge, 1, 4);
    expect_bytes(p2.bytes, want2, PEER2_BYTES, "the second peer's region");
    const kvd_xfer_t rd = {
        .local = f->rc1, .local_offset = 0, .remote_offset = 1000, .length = C1_BYTES};
    run_batch(f, KVD_XFER_READ, &rd, 1, 5);
    expect_bytes(f->c, p2.bytes + 1000, C1_BYTES, "bytes read from the second peer");

    if (g_be->remote) {
        assert_int_equal(g_be->peer_resume(&f->peer), KVD_OK);
        /* whatever of batch 1 the old peer still does, it must not be
         * reported again */
        drain_for_ms(f, 100);
    }
    /* peer 1 got none of it */
    expect_bytes(f->peer.bytes, p1_before, PEER_BYTES, "the first peer's region");

    /* and back to peer 1 */
    kvd_peer_t d1 = g_be->describe(&f->peer);
    assert_int_equal(kvd_transport_connect(f->t, &d1), KVD_OK);
    const kvd_xfer_t far = {
        .local = f->ra, .local_offset = 0, .remote_offset = 900000, .length = 4096};
    run_and_check(f, KVD_XFER_WRITE, &far, 1, 6);
    expect_bytes(p2.bytes, want2, PEER2_BYTES, "the second peer's region");
    kvd_transport_disconnect(f->t); /* before peer 2 goes */
    for (size_t i = 0; i < f->rep.n; i++)
        assert_true(f->rep.v[i].cookie != 1 && f->rep.v[i].cookie != 2);
    g_be->peer_free(&p2);
    free(p1_before);
    free(want2);
}

/* ------------------------------------------------------ the cases: waits */

/* kvd_transport_wait keeps the other batches reported meanwhile, after
 * those already in kept, and reports each batch once in all; with kept
 * NULL it drops them; kept never grows past cap. */
static void test_wait_keeps_other_reports(void **state)
{
    fixture_t *f = *state;
    kvd_xfer_t x = {
        .local = f->ra, .local_offset = 0, .remote_offset = 0, .length = 4096};
    for (uint64_t c = 1; c <= 5; c++) {
        x.local_offset = c * 8192;
        post_ok(f, c % 2 ? KVD_XFER_READ : KVD_XFER_WRITE, &x, 1, c);
    }
    kvd_xfer_done_t kept[8];
    memset(kept, 0xee, sizeof(kept));
    kept[0] = (kvd_xfer_done_t){.cookie = 999, .status = 12345};
    size_t n_kept = 1;
    assert_int_equal(kvd_transport_wait(f->t, 5, WAIT_MS, kept, &n_kept, 8), KVD_OK);
    assert_true(n_kept >= 1 && n_kept <= 5);
    assert_true(kept[0].cookie == 999 && kept[0].status == 12345);
    for (size_t i = 1; i < n_kept; i++) {
        assert_true(kept[i].cookie >= 1 && kept[i].cookie <= 4);
        note(f, kept[i].cookie, kept[i].status);
    }
    if (g_be->completes_at_post)
        assert_int_equal(n_kept, 5); /* 1-4 were all done before 5 */
    note(f, 5, KVD_OK);
    expect_all_once_ok(f, 1, 5);

    /* kept NULL: the others are dropped, at most reported once later */
    f->rep.n = 0;
    post_ok(f, KVD_XFER_READ, &x, 1, 6);
    post_ok(f, KVD_XFER_READ, &x, 1, 7);
    assert_int_equal(kvd_transport_wait(f->t, 7, WAIT_MS, NULL, NULL, 0), KVD_OK);
    drain_for_ms(f, 50);
    assert_true(times_reported(f, 6, NULL) <= 1);
    assert_int_equal(times_reported(f, 7, NULL), 0);
    if (g_be->completes_at_post)
        assert_int_equal(times_reported(f, 6, NULL), 0);

    /* a small cap: never written past */
    f->rep.n = 0;
    for (uint64_t c = 10; c < 30; c++)
        post_ok(f, KVD_XFER_READ, &x, 1, c);
    kvd_xfer_done_t small[3];
    memset(small, 0xee, sizeof(small));
    n_kept = 0;
    assert_int_equal(kvd_transport_wait(f->t, 29, WAIT_MS, small, &n_kept, 2), KVD_OK);
    assert_true(n_kept <= 2);
    assert_true(small[2].cookie == 0xeeeeeeeeeeeeeeeeull);
    for (size_t i = 0; i < n_kept; i++)
        assert_true(small[i].cookie >= 10 && small[i].cookie < 29);
    drain_for_ms(f, 50);
    assert_int_equal(times_reported(f, 29, NULL), 0);
}

/* A wait for a batch never posted times out, bounded; also with 0 ms. */
static void test_wait_for_unknown_batch_times_out(void **state)
{
    fixture_t *f = *state;
    uint64_t t0 = kvd_now_ns();
    assert_int_equal(kvd_transport_wait(f->t, 424242, 0, NULL, NULL, 0), KVD_ERR_TIMEOUT);
    assert_int_equal(kvd_transport_wait(f->t, 424242, 100, NULL, NULL, 0),
                     KVD_ERR_TIMEOUT);
    assert_true(ms_since(t0) < HANG_MS);
    /* a batch done meanwhile is kept, not lost */
    const kvd_xfer_t x = {
        .local = f->ra, .local_offset = 0, .remote_offset = 0, .length = 64};
    post_ok(f, KVD_XFER_READ, &x, 1, 1);
    kvd_xfer_done_t kept[4];
    size_t n_kept = 0;
    assert_int_equal(kvd_transport_wait(f->t, 424242, 200, kept, &n_kept, 4),
                     KVD_ERR_TIMEOUT);
    for (size_t i = 0; i < n_kept; i++)
        note(f, kept[i].cookie, kept[i].status);
    if (g_be->completes_at_post)
        assert_int_equal(n_kept, 1);
    expect_all_once_ok(f, 1, 1);
}

/* The peer stalls (its worker not driven): a wait for a READ times out;
 * once the peer is driven again the same batch finishes, reported once. */
static void test_wait_times_out_on_stalled_peer(void **state)
{
    fixture_t *f = *state;
    SKIP_UNLESS(g_be->remote,
                "the peer's region is mapped here: no peer worker to stall");
    const kvd_xfer_t x = {
        .local = f->ra, .local_offset = 0, .remote_offset = 4096, .length = 65536};
    run_batch(f, KVD_XFER_READ, &x, 1, 1); /* the endpoint is up */
    g_be->peer_pause(&f->peer);
    fill(f->peer.bytes, PEER_BYTES, 99);
    post_ok(f, KVD_XFER_READ, &x, 1, 2);
    uint64_t t0 = kvd_now_ns();
    int rc = wait_keep(f, 2, STALL_WAIT_MS);
    print_message("READ with the peer stalled: %s after %llu ms\n", kvd_status_str(rc),
                  (unsigned long long)ms_since(t0));
    /* one-sided RMA on RDMA needs no help from the peer */
    if (!(rc == KVD_OK && g_be->mode == KVD_UCX_MODE_RMA))
        assert_int_equal(rc, KVD_ERR_TIMEOUT);
    assert_true(ms_since(t0) < HANG_MS);
    assert_int_equal(g_be->peer_resume(&f->peer), KVD_OK);
    if (rc == KVD_ERR_TIMEOUT)
        wait_ok(f, 2);
    expect_bytes(f->a, f->peer.bytes + 4096, 65536, "the bytes read");
    expect_all_once_ok(f, 1, 2);
}

/* The peer stalls with a READ and a WRITE outstanding; the wait times
 * out; disconnect returns, bounded, and reports both failed (once); later
 * posts say KVD_ERR_CLOSED; when the peer comes back, the transport does
 * not write local memory for them any more; connecting again works. */
static void test_disconnect_from_stalled_peer(void **state)
{
    fixture_t *f = *state;
    SKIP_UNLESS(g_be->remote,
                "the peer's region is mapped here: no peer worker to stall");
    const kvd_xfer_t x = {
        .local = f->ra, .local_offset = 0, .remote_offset = 0, .length = 65536};
    const kvd_xfer_t w = {
        .local = f->rb, .local_offset = 0, .remote_offset = 700000, .length = B_BYTES};
    run_batch(f, KVD_XFER_READ, &x, 1, 1); /* the endpoint is up */
    /* the WRITE may still land late, after the peer is driven again: its
     * bytes are there already, so that a late landing changes nothing */
    memcpy(f->peer.bytes + 700000, f->b, B_BYTES);

    g_be->peer_pause(&f->peer);
    post_ok(f, KVD_XFER_READ, &x, 1, 2);
    post_ok(f, KVD_XFER_WRITE, &w, 1, 3);
    int rc = wait_keep(f, 2, STALL_WAIT_MS);
    if (!(rc == KVD_OK && g_be->mode == KVD_UCX_MODE_RMA))
        assert_int_equal(rc, KVD_ERR_TIMEOUT);

    uint64_t t0 = kvd_now_ns();
    kvd_transport_disconnect(f->t);
    uint64_t ms = ms_since(t0);
    print_message("READ with the peer stalled: %s; disconnect took %llu ms\n",
                  kvd_status_str(rc), (unsigned long long)ms);
    assert_true(ms < HANG_MS);
    drain_for_ms(f, 0);
    for (uint64_t c = 2; c <= 3; c++) {
        int status = KVD_OK;
        unsigned k = times_reported(f, c, &status);
        if (k != 1)
            fail_msg("batch %llu reported %u times by the end of disconnect, want once",
                     (unsigned long long)c, k);
        if (status != KVD_ERR_CLOSED &&
            !(status == KVD_OK && g_be->mode == KVD_UCX_MODE_RMA))
            fail_msg("batch %llu outstanding at disconnect: %s, want closed",
                     (unsigned long long)c, kvd_status_str(status));
    }
    assert_int_equal(kvd_transport_post(f->t, KVD_XFER_READ, &x, 1, 4), KVD_ERR_CLOSED);
    assert_int_equal(kvd_transport_post(f->t, KVD_XFER_WRITE, &w, 1, 5), KVD_ERR_CLOSED);

    memset(f->a, 0x5a, A_BYTES); /* reused by the caller */
    assert_int_equal(g_be->peer_resume(&f->peer), KVD_OK);
    drain_for_ms(f, 300);
    for (size_t i = 0; i < A_BYTES; i++)
        if (f->a[i] != 0x5a)
            fail_msg("local byte %zu written after disconnect returned", i);
    expect_no_more(f);

    kvd_peer_t d = g_be->describe(&f->peer);
    assert_int_equal(kvd_transport_connect(f->t, &d), KVD_OK);
    run_and_check(f, KVD_XFER_READ, &x, 1, 6);
    run_and_check(f, KVD_XFER_WRITE, &w, 1, 7);
}

/* The peer goes away (its UCX destroyed, its memory no longer readable)
 * with a batch outstanding: that batch and later ones fail in bounded
 * time, never with KVD_OK; once a post said KVD_ERR_CLOSED it keeps
 * saying it; disconnect and destroy return. */
static void test_peer_gone_fails_batches(void **state)
{
    fixture_t *f = *state;
    SKIP_UNLESS(g_be->remote, "the peer's region is mapped here: it cannot go away");
    const kvd_xfer_t x = {
        .local = f->ra, .local_offset = 0, .remote_offset = 4096, .length = 65536};
    run_batch(f, KVD_XFER_READ, &x, 1, 1); /* the endpoint is up */
    g_be->peer_pause(&f->peer);
    post_ok(f, KVD_XFER_READ, &x, 1, 2);
    g_be->peer_kill(&f->peer);

    uint64_t t0 = kvd_now_ns();
    int rc = wait_keep(f, 2, PEER_GONE_WAIT_MS);
    print_message("READ outstanding when the peer went: %s after %llu ms\n",
                  kvd_status_str(rc), (unsigned long long)ms_since(t0));
    assert_int_not_equal(rc, KVD_OK);

    bool closed = false; /* a post said KVD_ERR_CLOSED */
    for (uint64_t cookie = 3; cookie < 7; cookie++) {
        t0 = kvd_now_ns();
        rc = kvd_transport_post(f->t, KVD_XFER_READ, &x, 1, cookie);
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
        rc = wait_keep(f, cookie, PEER_GONE_WAIT_MS);
        print_message("READ %llu after the peer went: %s after %llu ms\n",
                      (unsigned long long)cookie, kvd_status_str(rc),
                      (unsigned long long)ms_since(t0));
        assert_int_not_equal(rc, KVD_OK);
        if (rc == KVD_ERR_TIMEOUT)
            break; /* UCX did not notice; disconnect must still return */
    }
    for (size_t i = 0; i < f->rep.n; i++)
        if (f->rep.v[i].cookie != 1 && f->rep.v[i].status == KVD_OK)
            fail_msg("batch %llu reported done after the peer went",
                     (unsigned long long)f->rep.v[i].cookie);

    t0 = kvd_now_ns();
    kvd_transport_disconnect(f->t);
    uint64_t ms = ms_since(t0);
    print_message("disconnect took %llu ms\n", (unsigned long long)ms);
    assert_true(ms < HANG_MS);
    assert_int_equal(kvd_transport_post(f->t, KVD_XFER_READ, &x, 1, 9), KVD_ERR_CLOSED);
    t0 = kvd_now_ns();
    kvd_transport_destroy(f->t);
    f->t = NULL;
    assert_true(ms_since(t0) < HANG_MS);
}

/* The peer goes away while it is being driven, between batches: the next
 * batches fail, bounded, and destroy returns. */
static void test_peer_gone_between_batches(void **state)
{
    fixture_t *f = *state;
    SKIP_UNLESS(g_be->remote, "the peer's region is mapped here: it cannot go away");
    const kvd_xfer_t x = {
        .local = f->ra, .local_offset = 0, .remote_offset = 0, .length = 4096};
    run_batch(f, KVD_XFER_WRITE, &x, 1, 1);
    g_be->peer_kill(&f->peer);
    for (uint64_t cookie = 2; cookie < 5; cookie++) {
        int rc = kvd_transport_post(f->t, cookie % 2 ? KVD_XFER_READ : KVD_XFER_WRITE, &x,
                                    1, cookie);
        if (rc == KVD_ERR_CLOSED)
            continue;
        assert_int_equal(rc, KVD_OK);
        rc = wait_keep(f, cookie, PEER_GONE_WAIT_MS);
        print_message("batch %llu after the peer went: %s\n", (unsigned long long)cookie,
                      kvd_status_str(rc));
        assert_int_not_equal(rc, KVD_OK);
        if (rc == KVD_ERR_TIMEOUT)
            break;
    }
    uint64_t t0 = kvd_now_ns();
    kvd_transport_destroy(f->t);
    f->t = NULL;
    assert_true(ms_since(t0) < HANG_MS);
}

/* In the message mode the peer checks each range against the region it
 * serves: a transport told the region is longer than what is served gets
 * a failed batch for a range past it, never a hang, and the bytes past
 * it are not written. */
static void test_peer_refuses_ranges_it_does_not_serve(void **state)
{
    fixture_t *f = *state;
    SKIP_UNLESS(g_be->remote && g_be->mode == KVD_UCX_MODE_AM,
                "only the ucx message mode's peer checks ranges (RMA: the NIC does)");
    peer_t p = {.stop_fd = -1};
    assert_int_equal(g_be->peer_start(&p, 2 * PEER_BYTES, PEER_BYTES, 8), KVD_OK);
    p.claimed = 2 * PEER_BYTES;
    kvd_peer_t d = g_be->describe(&p);
    assert_int_equal(kvd_transport_connect(f->t, &d), KVD_OK);
    uint8_t *before = dup_bytes(p.bytes, 2 * PEER_BYTES);
    const kvd_xfer_t in = {
        .local = f->ra, .local_offset = 0, .remote_offset = 1000, .length = 1000};
    const kvd_xfer_t past = {.local = f->ra,
                             .local_offset = 0,
                             .remote_offset = PEER_BYTES + 1000,
                             .length = 1000};
    const kvd_xfer_t across = {.local = f->ra,
                               .local_offset = 0,
                               .remote_offset = PEER_BYTES - 10,
                               .length = 20};
    const kvd_xfer_t *bad[] = {&past, &across};
    uint64_t cookie = 1;
    for (size_t i = 0; i < KVD_ARRAY_SIZE(bad); i++)
        for (int dir = KVD_XFER_READ; dir <= KVD_XFER_WRITE; dir++) {
            post_ok(f, (kvd_xfer_dir_t)dir, bad[i], 1, cookie);
            int rc = wait_keep(f, cookie, WAIT_MS);
            print_message("%s of a range the peer does not serve: %s\n",
                          dir == KVD_XFER_READ ? "READ" : "WRITE", kvd_status_str(rc));
            assert_int_not_equal(rc, KVD_OK);
            assert_int_not_equal(rc, KVD_ERR_TIMEOUT);
            cookie++;
        }
    expect_bytes(p.bytes + PEER_BYTES - 10, before + PEER_BYTES - 10, PEER_BYTES + 10,
                 "the peer's bytes past what it serves");
    /* the transport and the peer still work */
    memcpy(before + 1000, f->a, 1000);
    int rc = kvd_transport_post(f->t, KVD_XFER_WRITE, &in, 1, 10);
    if (rc == KVD_OK)
        rc = wait_keep(f, 10, WAIT_MS);
    print_message("a good WRITE after the refusals: %s\n", kvd_status_str(rc));
    assert_int_equal(rc, KVD_OK);
    expect_bytes(p.bytes, before, PEER_BYTES, "the peer's region");
    kvd_transport_disconnect(f->t);
    g_be->peer_free(&p);
    free(before);
}

/* The message mode's peer serves only requests whose capability it
 * granted, within the grant's range, and writes only for a grant that is
 * not read-only: a wrong capability, a revoked one, a write under a
 * read-only grant and a range outside a narrower grant each fail (not a
 * timeout) and move no byte; the transport and peer still work after. */
static void test_peer_refuses_without_its_grant(void **state)
{
    fixture_t *f = *state;
    SKIP_UNLESS(g_be->remote && g_be->mode == KVD_UCX_MODE_AM,
                "only the ucx message mode's peer checks capabilities");
    peer_t p = {.stop_fd = -1};
    assert_int_equal(g_be->peer_start(&p, PEER_BYTES, PEER_BYTES, 9), KVD_OK);
    uint8_t *before = dup_bytes(p.bytes, PEER_BYTES);
    const kvd_xfer_t x = {
        .local = f->ra, .local_offset = 0, .remote_offset = 4096, .length = 4096};
    const kvd_xfer_t far = {
        .local = f->ra, .local_offset = 0, .remote_offset = 65536, .length = 4096};
    uint8_t *local_before = dup_bytes(f->a, 4096);
    uint64_t cookie = 100;
    /* 1: a capability never granted; 2: the granted one, revoked; 3: a
     * read-only grant (writes refused, reads served); 4: a grant of the
     * first 64 KiB only (a range past it refused) */
    uint8_t wrong[KVD_UCX_CAP_BYTES];
    memcpy(wrong, p.cap, sizeof(wrong));
    wrong[0] ^= 1;
    for (int step = 1; step <= 4; step++) {
        kvd_peer_t d = g_be->describe(&p);
        ucx_peer_pause(&p); /* the grants are the server thread's while it runs */
        if (step == 1)
            d.ucx.cap = wrong;
        if (step == 2)
            assert_true(kvd_ucx_revoke(p.ucx, p.cap));
        kvd_ucx_grant_t g = {.read_only = step == 3,
                             .length = step == 4 ? 65536 : PEER_BYTES};
        memcpy(g.cap, p.cap, sizeof(g.cap));
        if (step >= 3)
            assert_int_equal(kvd_ucx_grant(p.ucx, &g), KVD_OK);
        assert_int_equal(ucx_peer_resume(&p), KVD_OK);
        assert_int_equal(kvd_transport_connect(f->t, &d), KVD_OK);
        for (int dir = KVD_XFER_READ; dir <= KVD_XFER_WRITE; dir++) {
            bool served = step == 3 && dir == KVD_XFER_READ;
            const kvd_xfer_t *t = step == 4 ? &far : &x;
            memset(f->a, 0x3c, 4096);
            memcpy(local_before, f->a, 4096);
            post_ok(f, (kvd_xfer_dir_t)dir, t, 1, cookie);
            int rc = wait_keep(f, cookie, WAIT_MS);
            cookie++;
            print_message("step %d, %s: %s\n", step,
                          dir == KVD_XFER_READ ? "READ" : "WRITE", kvd_status_str(rc));
            if (served) {
                assert_int_equal(rc, KVD_OK);
                expect_bytes(f->a, p.bytes + x.remote_offset, 4096, "a read-only read");
                continue;
            }
            assert_int_not_equal(rc, KVD_OK);
            assert_int_not_equal(rc, KVD_ERR_TIMEOUT);
            assert_int_equal(rc, step == 4 ? KVD_ERR_INVALID : KVD_ERR_AUTH);
            if (dir == KVD_XFER_READ)
                expect_bytes(f->a, local_before, 4096, "local bytes of a refused read");
            /* as the linker does after a failed batch */
            kvd_transport_disconnect(f->t);
            assert_int_equal(kvd_transport_connect(f->t, &d), KVD_OK);
        }
        expect_bytes(p.bytes, before, PEER_BYTES, "the peer's region");
        kvd_transport_disconnect(f->t);
    }
    kvd_ucx_refused_t r;
    ucx_peer_pause(&p);
    kvd_ucx_refused(p.ucx, &r);
    print_message("refused: %llu without a capability, %llu read-only, %llu range\n",
                  (unsigned long long)r.no_cap, (unsigned long long)r.read_only,
                  (unsigned long long)r.range);
    assert_int_equal(r.no_cap, 4);
    assert_int_equal(r.read_only, 1);
    assert_int_equal(r.range, 2);
    g_be->peer_free(&p);
    free(before);
    free(local_before);
}

/* A windowed grant (the daemon's UCX server's kind) writes only within its
 * open windows: windows that touch are joined (a write crosses from one
 * into the next), one over an open window or outside the grant is refused
 * whole, closing a tag closes its windows only; reads stay served across
 * the grant. Writes refused fail (not a timeout), move no byte and count
 * as `window`. */
static void test_peer_windows(void **state)
{
    fixture_t *f = *state;
    SKIP_UNLESS(g_be->remote && g_be->mode == KVD_UCX_MODE_AM,
                "only the ucx message mode's peer has write windows");
    peer_t p = {.stop_fd = -1};
    assert_int_equal(g_be->peer_start(&p, PEER_BYTES, PEER_BYTES, 9), KVD_OK);
    kvd_peer_t d = g_be->describe(&p);
    ucx_peer_pause(&p);
    kvd_ucx_grant_t g = {.windowed = true, .length = PEER_BYTES};
    memcpy(g.cap, p.cap, sizeof(g.cap));
    assert_int_equal(kvd_ucx_grant(p.ucx, &g), KVD_OK);
    /* tag 7: two that touch, given out of order; tag 8: one apart */
    const kvd_ucx_range_t seven[] = {{8192, 4096}, {4096, 4096}};
    const kvd_ucx_range_t eight[] = {{65536, 4096}};
    assert_int_equal(kvd_ucx_window_open(p.ucx, p.cap, 7, seven, 2), KVD_OK);
    assert_int_equal(kvd_ucx_window_open(p.ucx, p.cap, 8, eight, 1), KVD_OK);
    const kvd_ucx_range_t over[] = {{0, 4096}, {6144, 4096}};
    const kvd_ucx_range_t outside[] = {{PEER_BYTES - 4096, 8192}};
    const kvd_ucx_range_t self_over[] = {{200000, 4096}, {202000, 4096}};
    assert_int_equal(kvd_ucx_window_open(p.ucx, p.cap, 9, over, 2), KVD_ERR_INVALID);
    assert_int_equal(kvd_ucx_window_open(p.ucx, p.cap, 9, outside, 1), KVD_ERR_INVALID);
    assert_int_equal(kvd_ucx_window_open(p.ucx, p.cap, 9, self_over, 2), KVD_ERR_INVALID);
    uint8_t wrong[KVD_UCX_CAP_BYTES];
    memcpy(wrong, p.cap, sizeof(wrong));
    wrong[0] ^= 1;
    assert_int_equal(kvd_ucx_window_open(p.ucx, wrong, 9, eight, 1), KVD_ERR_NOT_FOUND);
    assert_int_equal(ucx_peer_resume(&p), KVD_OK);
    assert_int_equal(kvd_transport_connect(f->t, &d), KVD_OK);

    uint64_t cookie = 500;
    /* [from, from + len) written with fill: whether it was served */
    struct {
        uint64_t at, len;
        bool served;
        const char *what;
    } w[] = {
        {4096, 8192, true, "across two joined windows of tag 7"},
        {65536, 4096, true, "the window of tag 8"},
        {0, 4096, false, "before every window"},
        {8192, 8192, false, "past the end of tag 7's windows"},
        {16384, 4096, false, "between the windows"},
        {200000, 4096, false, "where the refused open would have been"},
    };
    for (size_t i = 0; i < sizeof(w) / sizeof(w[0]); i++) {
        uint8_t *before = dup_bytes(p.bytes, PEER_BYTES);
        memset(f->a, (int)(0x40 + i), (size_t)w[i].len);
        kvd_xfer_t x = {.local = f->ra, .remote_offset = w[i].at, .length = w[i].len};
        post_ok(f, KVD_XFER_WRITE, &x, 1, cookie);
        int rc = wait_keep(f, cookie++, WAIT_MS);
        print_message("WRITE %s: %s\n", w[i].what, kvd_status_str(rc));
        if (w[i].served) {
            assert_int_equal(rc, KVD_OK);
            expect_bytes(p.bytes + w[i].at, f->a, (size_t)w[i].len, w[i].what);
        } else {
            assert_int_equal(rc, KVD_ERR_AUTH);
            expect_bytes(p.bytes, before, PEER_BYTES, w[i].what);
            kvd_transport_disconnect(f->t);
            assert_int_equal(kvd_transport_connect(f->t, &d), KVD_OK);
        }
        free(before);
    }
    /* a read outside every window: served */
    kvd_xfer_t r = {.local = f->ra, .remote_offset = 131072, .length = 4096};
    post_ok(f, KVD_XFER_READ, &r, 1, cookie);
    assert_int_equal(wait_keep(f, cookie++, WAIT_MS), KVD_OK);
    expect_bytes(f->a, p.bytes + 131072, 4096, "a read outside every window");
    /* tag 7 closed: its windows refuse, tag 8's still serves */
    kvd_transport_disconnect(f->t);
    ucx_peer_pause(&p);
    assert_int_equal(kvd_ucx_window_close(p.ucx, p.cap, 7), 1); /* joined: one */
    assert_int_equal(kvd_ucx_window_close(p.ucx, p.cap, 7), 0);
    assert_int_equal(ucx_peer_resume(&p), KVD_OK);
    assert_int_equal(kvd_transport_connect(f->t, &d), KVD_OK);
    uint8_t *before = dup_bytes(p.bytes, PEER_BYTES);
    kvd_xfer_t x7 = {.local = f->ra, .remote_offset = 4096, .length = 4096};
    post_ok(f, KVD_XFER_WRITE, &x7, 1, cookie);
    assert_int_equal(wait_keep(f, cookie++, WAIT_MS), KVD_ERR_AUTH);
    expect_bytes(p.bytes, before, PEER_BYTES, "a write into a closed window");
    kvd_transport_disconnect(f->t);
    assert_int_equal(kvd_transport_connect(f->t, &d), KVD_OK);
    kvd_xfer_t x8 = {.local = f->ra, .remote_offset = 65536, .length = 4096};
    memset(f->a, 0x77, 4096);
    post_ok(f, KVD_XFER_WRITE, &x8, 1, cookie);
    assert_int_equal(wait_keep(f, cookie++, WAIT_MS), KVD_OK);
    expect_bytes(p.bytes + 65536, f->a, 4096, "tag 8's window after tag 7 closed");
    kvd_transport_disconnect(f->t);
    kvd_ucx_refused_t rf;
    ucx_peer_pause(&p);
    kvd_ucx_refused(p.ucx, &rf);
    assert_int_equal(rf.window, 5);
    free(before);
    g_be->peer_free(&p);
}

/* ------------------------------------------------- the cases: destroy */

/* Whether UCX emulates RMA in software here (TCP): the peer's worker then
 * serves each get and put itself. */
static bool rma_emulated(void)
{
    const char *tls = getenv("UCX_TLS");
    return g_be->remote && g_be->mode == KVD_UCX_MODE_RMA &&
           (tls == NULL || strstr(tls, "tcp") != NULL);
}

#define RMA_EMULATED_WHY                                                             \
    "UCX 1.13 aborts the serving worker (ucp_request.inl: \"Fatal: unexpected "      \
    "error: Endpoint timeout\" in ucp_get_req_handler) when it answers an emulated " \
    "get for a client whose worker is gone"

/* Destroy with batches still outstanding (and regions registered, reports
 * unpolled) returns, bounded; the local memory is the caller's again. */
static void test_destroy_with_outstanding_batches(void **state)
{
    fixture_t *f = *state;
    const kvd_xfer_t rd = {
        .local = f->ra, .local_offset = 0, .remote_offset = 0, .length = A_BYTES};
    const kvd_xfer_t wr = {.local = f->ra,
                           .local_offset = 0,
                           .remote_offset = PEER_BYTES - A_BYTES,
                           .length = A_BYTES};
    if (rma_emulated()) {
        /* the peer must not be answering when the client goes: */
        print_message("the peer is stalled first: " RMA_EMULATED_WHY "\n");
        g_be->peer_pause(&f->peer);
    }
    for (uint64_t i = 0; i < 4; i++) {
        post_ok(f, KVD_XFER_READ, &rd, 1, 10 + i);
        post_ok(f, KVD_XFER_WRITE, &wr, 1, 20 + i);
    }
    uint64_t t0 = kvd_now_ns();
    kvd_transport_destroy(f->t);
    f->t = NULL;
    uint64_t ms = ms_since(t0);
    print_message("destroy with 8 batches outstanding took %llu ms\n",
                  (unsigned long long)ms);
    assert_true(ms < HANG_MS);
    memset(f->a, 0x5a, A_BYTES);
    usleep(100000); /* the peer keeps running */
    for (size_t i = 0; i < A_BYTES; i++)
        if (f->a[i] != 0x5a)
            fail_msg("local byte %zu written after destroy returned", i);
}

/* The peer stalls with a READ outstanding; the caller gives up and
 * destroys the transport (bounded), then reuses the buffer; when the peer
 * comes back, nothing writes that buffer any more. */
static void test_destroy_while_peer_stalled(void **state)
{
    fixture_t *f = *state;
    SKIP_UNLESS(g_be->remote,
                "the peer's region is mapped here: no peer worker to stall");
    const kvd_xfer_t x = {
        .local = f->ra, .local_offset = 0, .remote_offset = 0, .length = 65536};
    run_batch(f, KVD_XFER_READ, &x, 1, 1); /* the endpoint is up */
    g_be->peer_pause(&f->peer);
    post_ok(f, KVD_XFER_READ, &x, 1, 2);
    int rc = wait_keep(f, 2, STALL_WAIT_MS);
    if (!(rc == KVD_OK && g_be->mode == KVD_UCX_MODE_RMA))
        assert_int_equal(rc, KVD_ERR_TIMEOUT);
    uint64_t t0 = kvd_now_ns();
    kvd_transport_destroy(f->t);
    f->t = NULL;
    uint64_t ms = ms_since(t0);
    print_message("READ with the peer stalled: %s; destroy took %llu ms\n",
                  kvd_status_str(rc), (unsigned long long)ms);
    assert_true(ms < HANG_MS);
    memset(f->a, 0x5a, A_BYTES); /* reused by the caller */
    if (rma_emulated()) {
        /* the peer is not driven again: see test_peer_survives_client_gone */
        print_message("the stalled peer is not resumed: " RMA_EMULATED_WHY "\n");
        return;
    }
    assert_int_equal(g_be->peer_resume(&f->peer), KVD_OK);
    usleep(300000);
    for (size_t i = 0; i < A_BYTES; i++)
        if (f->a[i] != 0x5a)
            fail_msg("local byte %zu written after destroy returned", i);
}

/* A client goes away (its transport destroyed) with a READ and a WRITE
 * outstanding at a stalled peer; the peer, driven again, answers into the
 * void and keeps serving: a new transport moves bytes through it. This is
 * the daemon's side of a worker process that exits mid-transfer. */
static void test_peer_survives_client_gone(void **state)
{
    fixture_t *f = *state;
    SKIP_UNLESS(g_be->remote,
                "the peer's region is mapped here: there is no serving side");
    SKIP_UNLESS(!rma_emulated(), RMA_EMULATED_WHY);
    const kvd_xfer_t x = {
        .local = f->ra, .local_offset = 0, .remote_offset = 0, .length = 65536};
    const kvd_xfer_t w = {
        .local = f->ra, .local_offset = 65536, .remote_offset = 65536, .length = 65536};
    run_batch(f, KVD_XFER_READ, &x, 1, 1); /* the endpoint is up */
    g_be->peer_pause(&f->peer);
    post_ok(f, KVD_XFER_READ, &x, 1, 2);
    post_ok(f, KVD_XFER_WRITE, &w, 1, 3);
    drain_for_ms(f, 100);
    kvd_transport_destroy(f->t);
    f->t = NULL;
    assert_int_equal(g_be->peer_resume(&f->peer), KVD_OK);
    usleep(300000); /* the peer answers the client that went */

    f->rep.n = 0;
    assert_int_equal(g_be->open(&f->t), KVD_OK);
    assert_int_equal(
        kvd_transport_register(f->t, f->a, A_BYTES, kvd_memkind_host(), &f->ra), KVD_OK);
    f->rb = f->rc1 = f->rc2 = NULL;
    kvd_peer_t d = g_be->describe(&f->peer);
    assert_int_equal(kvd_transport_connect(f->t, &d), KVD_OK);
    const kvd_xfer_t y = {
        .local = f->ra, .local_offset = 1000, .remote_offset = 500000, .length = 100000};
    run_and_check(f, KVD_XFER_WRITE, &y, 1, 4);
    fill(f->peer.bytes + 500000, 100000, 44);
    run_and_check(f, KVD_XFER_READ, &y, 1, 5);
}

/* A transport connected and destroyed (or disconnected) before any batch
 * moved, many times, after driving it 0-15 ms: returns, and the peer keeps
 * serving. (A linker that connects and exits at once; the endpoint may
 * still be wiring up.) */
static void test_connect_then_destroy_without_traffic(void **state)
{
    fixture_t *f = *state;
    kvd_peer_t d = g_be->describe(&f->peer);
    for (int i = 0; i < 60; i++) {
        kvd_transport_t *t = NULL;
        kvd_region_t *r = NULL;
        assert_int_equal(g_be->open(&t), KVD_OK);
        assert_int_equal(kvd_transport_register(t, f->a, 4096, kvd_memkind_host(), &r),
                         KVD_OK);
        uint64_t t0 = kvd_now_ns();
        assert_int_equal(kvd_transport_connect(t, &d), KVD_OK);
        /* drive it 0-14.5 ms first, in steps of 0.5 ms: the endpoint's
         * wireup is then at different steps */
        uint64_t until = kvd_now_ns() + (uint64_t)(i % 30) * 500000ull;
        while (kvd_now_ns() < until)
            kvd_transport_progress(t);
        if (i % 2)
            kvd_transport_disconnect(t);
        kvd_transport_destroy(t);
        assert_true(ms_since(t0) < HANG_MS);
    }
    usleep(100000); /* the peer handles what the endpoints left */
    const kvd_xfer_t x = {
        .local = f->ra, .local_offset = 0, .remote_offset = 1000, .length = 5000};
    run_and_check(f, KVD_XFER_WRITE, &x, 1, 1);
    run_and_check(f, KVD_XFER_READ, &x, 1, 2);
}

/* Connecting to a peer that went away: connect says KVD_ERR_UNAVAILABLE,
 * or it succeeds and the first batch fails, bounded, never with KVD_OK;
 * then disconnect returns and the transport connects to a live peer. */
static void test_connect_to_gone_peer(void **state)
{
    fixture_t *f = *state;
    SKIP_UNLESS(g_be->remote, "the peer's region is mapped here: it cannot go away");
    peer_t p = {.stop_fd = -1};
    assert_int_equal(g_be->peer_start(&p, PEER2_BYTES, PEER2_BYTES, 5), KVD_OK);
    kvd_peer_t d = g_be->describe(&p);
    /* connect copies the description: keep copies past the peer's end */
    uint8_t *addr = dup_bytes(d.ucx.address, d.ucx.address_len);
    uint8_t *rkey = dup_bytes(d.ucx.rkey, d.ucx.rkey_len);
    d.ucx.address = addr;
    d.ucx.rkey = rkey;
    g_be->peer_kill(&p);
    uint64_t t0 = kvd_now_ns();
    int rc = kvd_transport_connect(f->t, &d);
    print_message("connect to a peer that went away: %s after %llu ms\n",
                  kvd_status_str(rc), (unsigned long long)ms_since(t0));
    assert_true(ms_since(t0) < HANG_MS);
    if (rc == KVD_OK) {
        const kvd_xfer_t x = {
            .local = f->ra, .local_offset = 0, .remote_offset = 0, .length = 4096};
        t0 = kvd_now_ns();
        rc = kvd_transport_post(f->t, KVD_XFER_READ, &x, 1, 1);
        if (rc == KVD_OK)
            rc = wait_keep(f, 1, PEER_GONE_WAIT_MS);
        print_message("the first READ from it: %s after %llu ms\n", kvd_status_str(rc),
                      (unsigned long long)ms_since(t0));
        assert_int_not_equal(rc, KVD_OK);
    } else {
        assert_int_equal(rc, KVD_ERR_UNAVAILABLE);
    }
    t0 = kvd_now_ns();
    kvd_transport_disconnect(f->t);
    assert_true(ms_since(t0) < HANG_MS);
    g_be->peer_free(&p);
    free(addr);
    free(rkey);
    kvd_peer_t live = g_be->describe(&f->peer);
    assert_int_equal(kvd_transport_connect(f->t, &live), KVD_OK);
    const kvd_xfer_t y = {
        .local = f->rb, .local_offset = 0, .remote_offset = 0, .length = B_BYTES};
    run_and_check(f, KVD_XFER_READ, &y, 1, 2);
}

/* ------------------------------------------- the cases: the ucx serving side */

static void test_ucx_serving_side_arguments(void **state)
{
    fixture_t *f = *state;
    SKIP_UNLESS(g_be->remote, "kvd_ucx_* is the ucx backend's serving side");
    kvd_ucx_t *u = NULL;
    assert_int_equal(kvd_ucx_create("test-transport-args", false, &u), KVD_OK);
    assert_int_equal(kvd_ucx_efd(u), -1); /* no wakeup asked for */
    kvd_ucx_mem_t *m = (kvd_ucx_mem_t *)(uintptr_t)0x1234;
    assert_int_equal(kvd_ucx_mem_map(u, NULL, 4096, &m), KVD_ERR_INVALID);
    assert_int_equal(kvd_ucx_mem_map(u, f->a, 0, &m), KVD_ERR_INVALID);
    assert_ptr_equal(m, (kvd_ucx_mem_t *)(uintptr_t)0x1234);
    assert_int_equal(kvd_ucx_serve_messages(u, NULL), KVD_ERR_INVALID);
    assert_int_equal(kvd_ucx_mem_map(u, f->a, 4096, &m), KVD_OK);
    const void *rkey = NULL;
    size_t rkey_len = 0;
    kvd_ucx_mem_rkey(m, &rkey, &rkey_len);
    assert_non_null(rkey);
    assert_true(rkey_len > 0);
    const void *addr = NULL;
    size_t addr_len = 0;
    kvd_ucx_address(u, &addr, &addr_len);
    assert_non_null(addr);
    assert_true(addr_len > 0);
    kvd_ucx_progress(u);
    kvd_ucx_drive(u);
    kvd_ucx_mem_unmap(m);
    kvd_ucx_mem_unmap(NULL);
    kvd_ucx_destroy(u);
    kvd_ucx_destroy(NULL);
}

/* ----------------------------------------------------------------- main */

/* Picks the backend from argv; NULL (usage printed) when none fits. */
static const backend_t *backend_from_args(int argc, char **argv)
{
    if (argc == 2 && strcmp(argv[1], "shm") == 0)
        return &backend_shm;
    if (argc == 3 && strcmp(argv[1], "ucx") == 0 && strcmp(argv[2], "rma") == 0)
        return &backend_ucx_rma;
    if (argc == 3 && strcmp(argv[1], "ucx") == 0 && strcmp(argv[2], "am") == 0)
        return &backend_ucx_am;
    fprintf(stderr, "usage: %s shm | ucx rma | ucx am\n", argc > 0 ? argv[0] : "test");
    return NULL;
}

/* Whether the backend starts and reaches a peer here; prints why not.
 * KVD_TEST_NEEDS_RDMA: the variant that asks for verbs transports skips,
 * saying why, on a machine without an RDMA device. */
static bool backend_usable(void)
{
    if (getenv("KVD_TEST_NEEDS_RDMA") && !kvd_rdma_device_present()) {
        fprintf(stderr, "SKIP: no RDMA device (/sys/class/infiniband is empty or "
                        "absent): UCX RMA over verbs cannot be tested here\n");
        return false;
    }
    fixture_t f = {.cfg = &config_default, .peer.stop_fd = -1};
    const char *what = "";
    int rc = fixture_open(&f, &what);
    fixture_close(&f);
    if (rc == KVD_ERR_UNAVAILABLE) {
        fprintf(stderr, "SKIP: %s on %s over %s: %s\n", what, g_be->label, tls_name(),
                kvd_status_str(rc));
        return false;
    }
    return true; /* anything else is for the cases to report */
}

#define CASE(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)
#define BIG_CASE(fn) \
    cmocka_unit_test_prestate_setup_teardown(fn, setup, teardown, (void *)&config_big)

int main(int argc, char **argv)
{
    g_be = backend_from_args(argc, argv);
    if (g_be == NULL)
        return 1;
    if (!backend_usable())
        return SKIP_EXIT;
    const struct CMUnitTest tests[] = {
        CASE(test_name),
        CASE(test_batches_at_region_edges),
        CASE(test_random_batches_move_exact_bytes),
        CASE(test_batches_posted_before_polling_reported_once),
        CASE(test_partial_polls_interleaved_with_posts),
        CASE(test_poll_without_reports),
        CASE(test_zero_length_batches_reported_once),
        CASE(test_adjacent_rows_gathered),
        CASE(test_ten_thousand_small_transfers),
        CASE(test_region_of_another_memory_kind),
        BIG_CASE(test_one_64_mib_transfer),
        BIG_CASE(test_batches_larger_than_staging),
        CASE(test_bad_batches_refused_nothing_moved),
        CASE(test_register_refuses_bad_ranges),
        CASE(test_deregister_then_register_again),
        CASE(test_post_without_peer_closed),
        CASE(test_connect_refuses_bad_peers),
        CASE(test_connect_again_moves_to_new_peer),
        CASE(test_wait_keeps_other_reports),
        CASE(test_wait_for_unknown_batch_times_out),
        CASE(test_wait_times_out_on_stalled_peer),
        CASE(test_disconnect_from_stalled_peer),
        CASE(test_peer_gone_fails_batches),
        CASE(test_peer_gone_between_batches),
        CASE(test_peer_refuses_ranges_it_does_not_serve),
        CASE(test_peer_refuses_without_its_grant),
        CASE(test_peer_windows),
        CASE(test_destroy_with_outstanding_batches),
        CASE(test_destroy_while_peer_stalled),
        CASE(test_ucx_serving_side_arguments),
        CASE(test_connect_to_gone_peer),
        /* last: where the serving side breaks, it may take the program down */
        CASE(test_peer_survives_client_gone),
        CASE(test_connect_then_destroy_without_traffic),
    };
    /* KVD_TEST_FILTER: run only the cases matching it; KVD_TEST_SKIP: not
     * those matching it (cmocka's patterns) */
    if (getenv("KVD_TEST_FILTER") != NULL)
        cmocka_set_test_filter(getenv("KVD_TEST_FILTER"));
    if (getenv("KVD_TEST_SKIP") != NULL)
        cmocka_set_skip_filter(getenv("KVD_TEST_SKIP"));
    char group[64];
    snprintf(group, sizeof(group), "transport contract: %s", g_be->label);
    return cmocka_run_group_tests_name(group, tests, NULL, NULL);
}
