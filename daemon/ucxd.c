/*
 * ucxd.c - the UCX server process (see ucxd.h): the parent side starts,
 * watches and restarts it; the child side maps the pool, starts UCX, sends
 * its description up once and then progresses its worker until the parent
 * goes away.
 *
 * The one message, child to parent, on a SOCK_SEQPACKET pair:
 *   u32 magic, u32 address length, u32 rkey length, u32 0, u64 pool base,
 *   the address bytes, the rkey bytes.
 */
#include "ucxd.h"
#include "kvd_transport.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define UCXD_MAGIC          0x6b766478u /* "kvdx" */
#define UCXD_MSG_MAX        65536
#define UCXD_RESTART_NS     1000000000ull
#define UCXD_STOP_MS        2000
#define UCXD_CHILD_POOL     3 /* the fds the child finds its pool and socket on */
#define UCXD_CHILD_SOCK     4
#define UCXD_POPULATE_CHUNK (64ull << 20)
#define UCXD_SPIN_NS        (200ull * 1000)
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14 */
#endif

typedef struct ucxd_hdr {
    uint32_t magic, addr_len, rkey_len, zero;
    uint64_t base;
} ucxd_hdr_t;

struct kvd_ucxd {
    int pool_fd;
    uint64_t pool_bytes;
    int timeout_ms;
    pid_t pid;    /* 0: none running */
    int sock;     /* -1: none */
    uint8_t *msg; /* the child's description (header, address, rkey) */
    size_t msg_len;
    uint64_t last_start_ns;
    unsigned restarts;
    bool pool_ready; /* told to every child, which then maps the pages */
};

/* ------------------------------------------------------------- parent */

static void reap(kvd_ucxd_t *x, int timeout_ms)
{
    if (x->pid <= 0)
        return;
    int ws = 0;
    if (kvd_wait_pid(x->pid, timeout_ms, &ws) != KVD_OK) {
        kill(x->pid, SIGKILL);
        kvd_wait_pid(x->pid, UCXD_STOP_MS, &ws);
    }
    if (WIFSIGNALED(ws))
        KVD_WARN("ucx", "UCX server (pid %d) died of signal %d (%s)", (int)x->pid,
                 WTERMSIG(ws), strsignal(WTERMSIG(ws)));
    else if (WIFEXITED(ws) && WEXITSTATUS(ws) != 0)
        KVD_WARN("ucx", "UCX server (pid %d) exited with status %d", (int)x->pid,
                 WEXITSTATUS(ws));
    x->pid = 0;
}

static void drop_child(kvd_ucxd_t *x, int timeout_ms)
{
    if (x->sock >= 0)
        close(x->sock); /* the child sees the hang-up and exits */
    x->sock = -1;
    free(x->msg);
    x->msg = NULL;
    x->msg_len = 0;
    reap(x, timeout_ms);
}

/* Reads the child's description, waiting up to timeout_ms (0: it is
 * there, the socket said so). */
static int read_description(kvd_ucxd_t *x, int timeout_ms)
{
    struct pollfd p = {.fd = x->sock, .events = POLLIN};
    int n = poll(&p, 1, timeout_ms);
    if (n < 0) {
        int err = errno;
        KVD_ERROR("ucxd", "poll on the UCX server's socket: %s", strerror(err));
        return kvd_status_from_errno(err);
    }
    if (n == 0)
        return KVD_ERR_TIMEOUT;
    uint8_t *buf = malloc(UCXD_MSG_MAX);
    if (buf == NULL)
        return KVD_ERR_NOMEM;
    ssize_t r = recv(x->sock, buf, UCXD_MSG_MAX, MSG_TRUNC);
    ucxd_hdr_t h;
    if (r < (ssize_t)sizeof(h) || r > UCXD_MSG_MAX) {
        free(buf);
        return KVD_ERR_UNAVAILABLE; /* it exited before saying anything */
    }
    memcpy(&h, buf, sizeof(h));
    if (h.magic != UCXD_MAGIC || h.addr_len == 0 || h.rkey_len == 0 ||
        (uint64_t)r != sizeof(h) + (uint64_t)h.addr_len + h.rkey_len) {
        free(buf);
        return KVD_ERR_PROTOCOL;
    }
    x->msg = buf;
    x->msg_len = (size_t)r;
    return KVD_OK;
}

static int spawn(kvd_ucxd_t *x)
{
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) {
        int err = errno;
        KVD_ERROR("ucxd", "socketpair: %s", strerror(err));
        return kvd_status_from_errno(err);
    }
    char bytes[32], pool_fd[8], sock_fd[8];
    snprintf(bytes, sizeof(bytes), "%llu", (unsigned long long)x->pool_bytes);
    snprintf(pool_fd, sizeof(pool_fd), "%d", UCXD_CHILD_POOL);
    snprintf(sock_fd, sizeof(sock_fd), "%d", UCXD_CHILD_SOCK);
    pid_t parent = getpid();
    x->last_start_ns = kvd_now_ns();
    pid_t pid = fork();
    if (pid < 0) {
        int err = errno;
        KVD_ERROR("ucxd", "cannot start the UCX server: fork: %s", strerror(err));
        int rc = kvd_status_from_errno(err);
        close(sv[0]);
        close(sv[1]);
        return rc;
    }
    if (pid == 0) {
        /* only async-signal-safe calls until exec */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(127);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        /* the pool and the socket on fds 3 and 4, without CLOEXEC */
        int pfd = fcntl(x->pool_fd, F_DUPFD, 10), sfd = fcntl(sv[1], F_DUPFD, 10);
        if (pfd < 0 || sfd < 0 || dup2(pfd, UCXD_CHILD_POOL) < 0 ||
            dup2(sfd, UCXD_CHILD_SOCK) < 0)
            _exit(127);
        close(pfd);
        close(sfd);
        /* this very binary, also once it was replaced or removed on disk
         * (an upgrade): the child must speak the parent's protocol */
        char *argv[] = {"kvdockd", "--ucx-serve", pool_fd, sock_fd, bytes, NULL};
        execv("/proc/self/exe", argv);
        _exit(127);
    }
    close(sv[1]);
    x->pid = pid;
    x->sock = sv[0];
    return KVD_OK;
}

/* The child's description is in (or it failed): up, or dropped. */
static int take_description(kvd_ucxd_t *x, int timeout_ms)
{
    int rc = read_description(x, timeout_ms);
    if (rc != KVD_OK) {
        KVD_WARN("ucx", "UCX server (pid %d) did not start: %s", (int)x->pid,
                 kvd_status_str(rc));
        if (x->pid > 0)
            kill(x->pid, SIGKILL); /* alive but useless, or dead already */
        drop_child(x, UCXD_STOP_MS);
        return rc == KVD_ERR_PROTOCOL ? rc : KVD_ERR_UNAVAILABLE;
    }
    if (x->pool_ready)
        send(x->sock, "R", 1, MSG_NOSIGNAL);
    const ucxd_hdr_t *h = (const ucxd_hdr_t *)x->msg;
    KVD_INFO("ucx", "UCX server pid %d serves the pool (address %u bytes, rkey %u bytes)",
             (int)x->pid, h->addr_len, h->rkey_len);
    return KVD_OK;
}

int kvd_ucxd_start(int pool_fd, uint64_t pool_bytes, int timeout_ms, kvd_ucxd_t **out)
{
    kvd_ucxd_t *x = calloc(1, sizeof(*x));
    if (x == NULL)
        return KVD_ERR_NOMEM;
    *x = (kvd_ucxd_t){.pool_fd = pool_fd,
                      .pool_bytes = pool_bytes,
                      .timeout_ms = timeout_ms,
                      .sock = -1};
    /* the first start is waited for (kvdockd is not serving yet); restarts
     * are not (see kvd_ucxd_on_event) */
    int rc = spawn(x);
    if (rc == KVD_OK)
        rc = take_description(x, timeout_ms);
    if (rc != KVD_OK) {
        free(x);
        return rc;
    }
    *out = x;
    return KVD_OK;
}

int kvd_ucxd_fd(const kvd_ucxd_t *x)
{
    return x->sock;
}

bool kvd_ucxd_up(const kvd_ucxd_t *x)
{
    return x != NULL && x->msg != NULL;
}

void kvd_ucxd_peer(const kvd_ucxd_t *x, const uint8_t **addr, size_t *addr_len,
                   const uint8_t **rkey, size_t *rkey_len, uint64_t *base)
{
    const ucxd_hdr_t *h = (const ucxd_hdr_t *)x->msg;
    *addr = x->msg + sizeof(*h);
    *addr_len = h->addr_len;
    *rkey = x->msg + sizeof(*h) + h->addr_len;
    *rkey_len = h->rkey_len;
    *base = h->base;
}

void kvd_ucxd_pool_ready(kvd_ucxd_t *x)
{
    if (x == NULL || x->pool_ready)
        return;
    x->pool_ready = true;
    if (x->sock >= 0)
        send(x->sock, "R", 1, MSG_NOSIGNAL);
}

bool kvd_ucxd_on_event(kvd_ucxd_t *x)
{
    if (x->msg == NULL && x->pid > 0)
        return take_description(x, 0) != KVD_OK; /* a restarted child reports */
    /* the child never writes after its description: readable means gone */
    KVD_WARN("ucx", "UCX server (pid %d) went away; UCX workers reconnect to the next",
             (int)x->pid);
    drop_child(x, UCXD_STOP_MS);
    return true;
}

int kvd_ucxd_tick(kvd_ucxd_t *x, uint64_t now_ns)
{
    if (x->pid > 0 && x->msg == NULL &&
        now_ns - x->last_start_ns > (uint64_t)x->timeout_ms * 1000000ull) {
        KVD_WARN("ucx", "UCX server (pid %d) said nothing in %d ms: stopping it",
                 (int)x->pid, x->timeout_ms);
        kill(x->pid, SIGKILL);
        drop_child(x, UCXD_STOP_MS);
        return -1;
    }
    if (x->pid > 0 || now_ns - x->last_start_ns < UCXD_RESTART_NS)
        return 0;
    x->restarts++;
    KVD_INFO("ucx", "starting UCX server again (restart %u)", x->restarts);
    return spawn(x) == KVD_OK ? 1 : 0;
}

void kvd_ucxd_stop(kvd_ucxd_t *x)
{
    if (x == NULL)
        return;
    drop_child(x, UCXD_STOP_MS);
    free(x);
}

/* -------------------------------------------------------------- child */

/* Maps the pool's pages into this process, on a thread of its own: the
 * pages exist already (the parent populated them), but a write through
 * this mapping would otherwise fault once per 4 KiB (measured: offloads
 * over TCP spent 14% of this process in page faults), and on this VM a
 * fault costs ~5 us, so the whole pool takes seconds; done from the serving
 * loop, each chunk stalled every transfer in flight. */
typedef struct populator {
    uint8_t *pool;
    uint64_t bytes;
    atomic_bool stop;
} populator_t;

static void *populate_main(void *arg)
{
    populator_t *p = arg;
    for (uint64_t at = 0; at < p->bytes && !atomic_load(&p->stop);) {
        uint64_t len = KVD_MIN(p->bytes - at, UCXD_POPULATE_CHUNK);
        if (madvise(p->pool + at, len, MADV_POPULATE_WRITE) != 0)
            break; /* an older kernel: pages fault in on first use */
        at += len;
    }
    return NULL;
}

/* Progresses the worker until the parent closes the socket. Once the
 * parent says the pool is populated ('R'), the populator thread maps it
 * here too (waiting for the parent keeps --populate-rate the pool's pace). */
static int serve(kvd_ucx_t *u, int sock, uint8_t *pool, uint64_t bytes)
{
    populator_t pop = {.pool = pool, .bytes = bytes};
    pthread_t pop_thread;
    bool pop_started = false;
    int status = 1;
    int ep = epoll_create1(EPOLL_CLOEXEC);
    if (ep < 0) {
        KVD_ERROR("ucxd", "epoll_create1: %s", strerror(errno));
        return 1;
    }
    struct epoll_event ev = {.events = EPOLLIN};
    ev.data.fd = kvd_ucx_efd(u);
    epoll_ctl(ep, EPOLL_CTL_ADD, ev.data.fd, &ev);
    ev.data.fd = sock;
    epoll_ctl(ep, EPOLL_CTL_ADD, sock, &ev);
    uint64_t active_ns = 0;
    for (;;) {
        /* while requests keep coming, poll rather than sleep: over TCP a
         * rendezvous takes several round trips, each a wake-up otherwise */
        if (kvd_ucx_progress(u) > 0) {
            active_ns = kvd_now_ns();
            continue;
        }
        if (kvd_now_ns() - active_ns < UCXD_SPIN_NS)
            continue;
        kvd_ucx_drive(u);
        struct epoll_event got[4];
        int n = epoll_wait(ep, got, 4, 1000);
        if (n < 0 && errno != EINTR) {
            KVD_ERROR("ucxd", "epoll_wait: %s", strerror(errno));
            break;
        }
        bool done = false;
        for (int i = 0; i < n; i++) {
            if (got[i].data.fd != sock)
                continue;
            char c = 0;
            if (recv(sock, &c, 1, MSG_DONTWAIT) == 1 && c == 'R') {
                if (!pop_started)
                    pop_started =
                        pthread_create(&pop_thread, NULL, populate_main, &pop) == 0;
                continue;
            }
            done = true; /* the parent closed its end */
        }
        if (done) {
            status = 0;
            break;
        }
    }
    if (pop_started) {
        atomic_store(&pop.stop, true);
        pthread_join(pop_thread, NULL);
    }
    close(ep);
    return status;
}

int kvd_ucxd_main(int argc, char **argv)
{
    uint64_t pool_fd = 0, sock = 0, bytes = 0;
    if (argc != 5 || kvd_u64_parse(argv[2], 0, 1024, &pool_fd) != KVD_OK ||
        kvd_u64_parse(argv[3], 0, 1024, &sock) != KVD_OK ||
        kvd_u64_parse(argv[4], 1, UINT64_MAX, &bytes) != KVD_OK) {
        fprintf(stderr, "kvdockd --ucx-serve: started by kvdockd only\n");
        return 2;
    }
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    void *pool = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, (int)pool_fd, 0);
    close((int)pool_fd);
    if (pool == MAP_FAILED) {
        KVD_ERROR("ucxd", "cannot map the pool: %s", strerror(errno));
        return 1;
    }
    kvd_ucx_t *u = NULL;
    kvd_ucx_mem_t *mem = NULL;
    int rc = kvd_ucx_create("kvdockd", true, &u);
    if (rc == KVD_OK)
        rc = kvd_ucx_mem_map(u, pool, bytes, &mem);
    if (rc == KVD_OK)
        rc = kvd_ucx_serve_messages(u, mem); /* for workers on TCP */
    if (rc != KVD_OK) {
        KVD_ERROR("ucxd", "UCX cannot serve the pool: %s", kvd_status_str(rc));
        kvd_ucx_destroy(u);
        return 1;
    }
    const void *a, *k;
    size_t alen, klen;
    kvd_ucx_address(u, &a, &alen);
    kvd_ucx_mem_rkey(mem, &k, &klen);
    ucxd_hdr_t h = {.magic = UCXD_MAGIC,
                    .addr_len = (uint32_t)alen,
                    .rkey_len = (uint32_t)klen,
                    .base = (uint64_t)(uintptr_t)pool};
    struct iovec iov[3] = {{&h, sizeof(h)}, {(void *)a, alen}, {(void *)k, klen}};
    struct msghdr m = {.msg_iov = iov, .msg_iovlen = 3};
    int status = 1;
    if (sizeof(h) + alen + klen <= UCXD_MSG_MAX &&
        sendmsg((int)sock, &m, MSG_NOSIGNAL) > 0)
        status = serve(u, (int)sock, pool, bytes);
    kvd_ucx_mem_unmap(mem);
    kvd_ucx_destroy(u);
    munmap(pool, bytes);
    return status;
}
