/*
 * Description: a stalled writer never corrupts reused memory (issue 14).
 * A writer process maps the pool, reserves one object, tells the test its
 * offset and stops itself (SIGSTOP) before copying, with --lease-ttl 300.
 * Its lease passes its TTL (and, in the second life, the daemon is killed
 * with SIGKILL and started again on the same pool file while the writer
 * is stopped). Once the daemon says it holds the writer's extent (its log
 * line naming the pid), or has freed it (the old one-TTL rule), another
 * client stores twice the pool's worth of objects, each with its own byte
 * pattern: none of them may be handed the stopped writer's extent. Then
 * the writer resumes and writes its pattern over its whole object: every
 * object of the other client still there reads back byte-exact. Once the
 * writer has exited its extent is free again (quarantined_bytes 0). A
 * writer whose connection closed and who says Hello again with
 * earlier_copies_over frees what it held at once. The store's invariant
 * (kvdock stats --check) holds after each part.
 */
#include "test_store_util.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define OBJ      (1024u * 1024u) /* 64 of them fill DT_POOL */
#define N_FILL   (2 * (DT_POOL_BYTES / OBJ))
#define W_SALT   0x57525452u
#define NS_NAME  "m/stall/tp0"
#define WAIT_MS  15000
#define TTL_ARGS "--lease-ttl", "300"

static char shm[64];
static kvd_key_t wkey[1], fill[N_FILL], w2key[1];

/* ------------------------------------------------------------ writer */

/* The writer: reserve key, report its offset on fd, stop, then copy its
 * pattern over the object and try to publish (its lease is long gone).
 * Runs in a child; exits 0, or 1 when it could not reserve. */
static void writer_main(const char *socket, int fd)
{
    kvd_ns_spec_t spec = ts_spec(NS_NAME, OBJ);
    ts_client_t t;
    uint64_t off = UINT64_MAX, lease = 0;
    if (ts_open(&t, socket, &spec, 1, true) == 0) {
        kvd_put_item_t item;
        ts_chain_items(wkey, 1, NULL, 0, &item);
        uint8_t res;
        ts_err_t e;
        if (ts_reserve(t.c, t.ns[0], OBJ, &item, 1, &lease, &res, &off, &e) != KVD_OK ||
            res != KVD_RESERVE_ALLOCATED)
            off = UINT64_MAX;
    }
    if (write(fd, &off, sizeof(off)) != (ssize_t)sizeof(off) || off == UINT64_MAX)
        _exit(1);
    raise(SIGSTOP); /* a long pause: swapped out, a GC, a debugger */
    ts_fill(t.pool + off, OBJ, wkey[0], W_SALT);
    ts_err_t e;
    ts_publish(t.c, lease, NULL, 0, &e); /* fails: the lease is gone */
    _exit(0);
}

/* Starts the writer; its object's offset in *off once it has stopped
 * itself. Returns its pid, or -1 after recording a failure. */
static pid_t writer_start(const char *socket, uint64_t *off)
{
    int p[2];
    if (!DT_CHECK(pipe(p) == 0, "pipe: %s", strerror(errno)))
        return -1;
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* a stopped writer never outlives the test */
        close(p[0]);
        writer_main(socket, p[1]);
    }
    close(p[1]);
    *off = UINT64_MAX;
    struct pollfd pfd = {.fd = p[0], .events = POLLIN};
    if (pid > 0 && poll(&pfd, 1, WAIT_MS) == 1 &&
        read(p[0], off, sizeof(*off)) != (ssize_t)sizeof(*off))
        *off = UINT64_MAX;
    close(p[0]);
    if (!DT_CHECK(pid > 0 && *off != UINT64_MAX,
                  "the writer did not reserve its object")) {
        if (pid > 0) {
            kill(pid, SIGKILL);
            kvd_test_wait_pid(pid, WAIT_MS, NULL);
        }
        return -1;
    }
    /* stopped before its copy (bounded wait) */
    int st = 0;
    pid_t r = 0;
    for (int k = 0; k < WAIT_MS / 5 && r == 0; k++) {
        r = waitpid(pid, &st, WNOHANG | WUNTRACED);
        if (r == 0)
            usleep(5000);
    }
    if (!DT_CHECK(r == pid && WIFSTOPPED(st), "the writer did not stop")) {
        kill(pid, SIGKILL);
        kvd_test_wait_pid(pid, WAIT_MS, NULL);
        return -1;
    }
    return pid;
}

/* Resumes the stopped writer and waits (bounded) for it to finish. */
static void writer_resume(pid_t pid)
{
    kill(pid, SIGCONT);
    int st = 0;
    if (!DT_CHECK(kvd_test_wait_pid(pid, WAIT_MS, &st) == 0 && WIFEXITED(st) &&
                      WEXITSTATUS(st) == 0,
                  "the resumed writer did not finish")) {
        kill(pid, SIGKILL);
        kvd_test_wait_pid(pid, WAIT_MS, NULL);
    }
}

/* ------------------------------------------------------------- waits */

static const kvd_test_daemon_t *cur;
static pid_t cur_writer;

/* The daemon holds the writer's extent (it says so, naming the pid), or
 * it freed it (the one-TTL rule this test is against): either way the
 * other client's turn. With the lease of a live daemon: once it expired. */
static bool held_or_freed(const ts_stats_t *s)
{
    char line[64];
    snprintf(line, sizeof(line), "held for writer pid %d", (int)cur_writer);
    return s->store.leases == 0 &&
           (s->store.quarantined_bytes == 0 || kvd_test_file_contains(cur->log, line));
}

static bool nothing_quarantined(const ts_stats_t *s)
{
    return s->store.quarantined_bytes == 0;
}

/* ------------------------------------------------------------- parts */

/* Another client stores N_FILL objects, none of them in [woff, woff +
 * OBJ); then the writer resumes; then every fill object still there reads
 * back as it was written. */
static void fill_resume_verify(const kvd_test_daemon_t *d, pid_t writer, uint64_t woff,
                               const char *when)
{
    kvd_ns_spec_t spec = ts_spec(NS_NAME, OBJ);
    ts_client_t t;
    if (ts_open(&t, d->socket, &spec, 1, true) != 0) {
        writer_resume(writer);
        return;
    }
    size_t overlaps = 0, stored = 0;
    for (uint32_t i = 0; i < N_FILL; i++) {
        kvd_put_item_t item;
        ts_chain_items(&fill[i], 1, NULL, 0, &item);
        uint8_t res;
        uint64_t off = 0, lease = 0;
        ts_err_t e;
        int st = ts_reserve(t.c, t.ns[0], OBJ, &item, 1, &lease, &res, &off, &e);
        if (!DT_CHECK(st == KVD_OK, "%s: reserve %u: %s (%s)", when, i,
                      kvd_status_str(st), e.text))
            break;
        if (res != KVD_RESERVE_ALLOCATED)
            continue; /* no room (everything else held): fine, nothing to check */
        if (off < woff + OBJ && woff < off + OBJ)
            overlaps++;
        ts_fill(t.pool + off, OBJ, fill[i], i);
        st = ts_publish(t.c, lease, NULL, 0, &e);
        DT_CHECK(st == KVD_OK, "%s: publish %u: %s", when, i, kvd_status_str(st));
        stored++;
    }
    DT_CHECK(overlaps == 0,
             "%s: %zu objects were handed the stopped writer's extent at offset %llu",
             when, overlaps, (unsigned long long)woff);
    DT_CHECK(stored >= N_FILL / 2, "%s: only %zu of %u objects stored", when, stored,
             (unsigned)N_FILL);
    writer_resume(writer);
    size_t present = 0, corrupt = 0;
    for (uint32_t i = 0; i < N_FILL; i++) {
        uint64_t lease = 0, off = 0;
        ts_err_t e;
        if (ts_acquire(t.c, t.ns[0], OBJ, &fill[i], 1, &lease, &off, &e) != KVD_OK)
            continue; /* evicted for a later one */
        present++;
        if (ts_verify(t.pool + off, OBJ, fill[i], i) != SIZE_MAX)
            corrupt++;
        ts_release(t.c, lease, &e);
    }
    DT_CHECK(present > 0, "%s: none of the stored objects is there", when);
    DT_CHECK(corrupt == 0, "%s: %zu of %zu objects do not read back as written", when,
             corrupt, present);
    ts_close(&t);
    ts_stats_t s;
    DT_CHECK(ts_wait_stats(d->socket, WAIT_MS, nothing_quarantined, &s),
             "%s: the writer exited, but %llu bytes stay quarantined", when,
             (unsigned long long)s.store.quarantined_bytes);
    ts_cli_check(d->socket, when);
}

/* The lease of a stopped writer passes its TTL on a live daemon. */
static void stalled_on_live_daemon(const kvd_test_daemon_t *d)
{
    uint64_t woff;
    pid_t w = writer_start(d->socket, &woff);
    if (w < 0)
        return;
    cur = d;
    cur_writer = w;
    ts_stats_t s;
    if (!DT_CHECK(ts_wait_stats(d->socket, WAIT_MS, held_or_freed, &s),
                  "live: the writer's lease did not end")) {
        kill(w, SIGKILL);
        kvd_test_wait_pid(w, WAIT_MS, NULL);
        return;
    }
    fill_resume_verify(d, w, woff, "live");
}

/* A writer whose connection closed says Hello again with
 * earlier_copies_over: what it held is free at once. */
static void writer_says_done(const kvd_test_daemon_t *d)
{
    kvd_ns_spec_t spec = ts_spec(NS_NAME, OBJ);
    ts_client_t t;
    if (ts_open(&t, d->socket, &spec, 1, false) != 0)
        return;
    kvd_put_item_t item;
    ts_chain_items(w2key, 1, NULL, 0, &item);
    uint8_t res;
    uint64_t off, lease;
    ts_err_t e;
    int st = ts_reserve(t.c, t.ns[0], OBJ, &item, 1, &lease, &res, &off, &e);
    DT_CHECK(st == KVD_OK && res == KVD_RESERVE_ALLOCATED, "done: reserve: %s",
             kvd_status_str(st));
    ts_close(&t); /* the connection is lost with its reservation */
    ts_stats_t s;
    cur = d;
    cur_writer = getpid();
    DT_CHECK(ts_wait_stats(d->socket, WAIT_MS, held_or_freed, &s) &&
                 s.store.quarantined_bytes == OBJ,
             "done: the lost connection's reservation should be held while this process "
             "lives: %llu bytes quarantined",
             (unsigned long long)s.store.quarantined_bytes);
    kvd_client_t *c = dt_connect(d->socket, false);
    if (c == NULL)
        return;
    kvd_msg_t req, rep;
    kvd_msg_request(&req, 0, KVD_METHOD_HELLO);
    kvd_strlcpy(req.body.hello_req.client_name, "stall-test",
                sizeof(req.body.hello_req.client_name));
    req.body.hello_req.pid = (uint32_t)getpid();
    req.body.hello_req.protocol_version = KVD_PROTOCOL_VERSION;
    req.body.hello_req.earlier_copies_over = true;
    st = kvd_client_call(c, &req, &rep, TS_RPC_TIMEOUT_MS);
    DT_CHECK(st == KVD_OK && rep.status == KVD_OK, "done: hello: %s",
             kvd_status_str(st == KVD_OK ? rep.status : st));
    kvd_msg_clear(&rep);
    /* the Hello's reply came after the daemon freed them */
    DT_CHECK(ts_stats(c, false, &s) == KVD_OK && s.store.quarantined_bytes == 0,
             "done: after the Hello, %llu bytes stay quarantined",
             (unsigned long long)s.store.quarantined_bytes);
    kvd_client_close(c);
    ts_cli_check(d->socket, "done");
}

static int start(kvd_test_daemon_t *d)
{
    const char *args[] = {"--shm-dir", shm, TTL_ARGS, NULL};
    return dt_start(d, args);
}

static void remove_shm(void)
{
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf -- '%s'", shm);
    if (system(cmd) != 0)
        fprintf(stderr, "cannot remove %s\n", shm);
}

int main(void)
{
    snprintf(shm, sizeof(shm), "/dev/shm/kvdock-stall-XXXXXX");
    if (mkdtemp(shm) == NULL) {
        snprintf(shm, sizeof(shm), "/tmp/kvdock-stall-XXXXXX");
        if (mkdtemp(shm) == NULL)
            return 1;
    }
    if (ts_make_keys(100, 1, 64, wkey) != 0 || ts_make_keys(200, 1, 64, w2key) != 0 ||
        ts_make_keys(1000, N_FILL, 64, fill) != 0)
        return 1;
    kvd_test_daemon_t d1 = {0}, d2 = {0}, d3 = {0};

    if (start(&d1) == 0) {
        stalled_on_live_daemon(&d1);
        writer_says_done(&d1);
    }
    dt_stop(&d1, SIGTERM, 10000);

    /* the daemon dies while the writer is stopped: the next one, on the
     * same pool file, must know whose reservation it was */
    if (start(&d2) == 0) {
        uint64_t woff;
        pid_t w = writer_start(d2.socket, &woff);
        kill(d2.pid, SIGKILL);
        int ws = 0;
        DT_CHECK(kvd_test_wait_pid(d2.pid, 10000, &ws) == 0 && WIFSIGNALED(ws),
                 "the daemon did not die of SIGKILL (0x%x)", ws);
        d2.pid = 0;
        dt_stop(&d2, SIGTERM, 1000); /* dead already: removes its directory */
        if (w > 0 && start(&d3) == 0) {
            cur = &d3;
            cur_writer = w;
            ts_stats_t s;
            if (DT_CHECK(ts_wait_stats(d3.socket, WAIT_MS, held_or_freed, &s),
                         "restart: no word of the writer's reservation")) {
                fill_resume_verify(&d3, w, woff, "restart");
            } else {
                kill(w, SIGKILL);
                kvd_test_wait_pid(w, WAIT_MS, NULL);
            }
        } else if (w > 0) {
            kill(w, SIGKILL);
            kvd_test_wait_pid(w, WAIT_MS, NULL);
        }
    }
    dt_stop(&d3, SIGTERM, 10000);
    remove_shm();
    return dt_exit_status("daemon/store_stalled_writer");
}
