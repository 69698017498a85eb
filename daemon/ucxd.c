/*
 * ucxd.c - the UCX server process (see ucxd.h): the parent side starts,
 * watches and restarts it, and grants and revokes the connections' access;
 * the child side maps the pool, starts UCX, sends its description up once
 * and then progresses its worker, applying grants, until the parent goes
 * away.
 *
 * The messages, on a SOCK_SEQPACKET pair (one record each):
 *
 * child to parent, once (its description):
 *   u32 magic "kvdx", u32 address length, u32 rkey length,
 *   u32 flags (bit 0: one-sided RMA offered), u64 pool base (0 without
 *   RMA), the address bytes, the rkey bytes (none without RMA).
 *   Or, when it may serve on none of the transports UCX would open (flags
 *   bit 1, "refused"; rkey length and base 0): in place of the address,
 *   the transports it left out as text ("tcp/lo,posix/memory"); it exits
 *   then.
 *
 * parent to child (ucxd_ctl_t, 48 bytes, host byte order: the same binary
 * on both ends):
 *   u32 magic "kvdc", u8 kind, u8 read_only, u16 0, u64 connection id,
 *   u64 offset, u64 length, u8 capability[16]
 *   kind 'R': the pool is populated (map its pages in); the rest is 0.
 *   kind 'G': grant: requests carrying `capability` may touch
 *             [offset, offset+length) of the pool, and write unless
 *             read_only. Sent when the parent answers a Hello with
 *             want_ucx, before the reply is queued.
 *   kind 'V': revoke `capability` (its connection closed, or said Hello
 *             again); offset and length 0.
 *   kind 'W': open write windows of `capability` (a grant's writes land
 *             only in its windows): the record is followed by `length`
 *             ranges (u64 offset, u64 length; at most UCXD_WIN_MAX), the
 *             extents a Reserve of the connection allocated, tagged with
 *             its lease id (in the connection id's place). Sent before the
 *             Reserve reply is queued, as a grant before the Hello reply.
 *   kind 'X': close every window of lease `connection id` of
 *             `capability` (its lease was published, revoked or expired);
 *             kept back and resent like a revoke when the socket is full.
 * The child reads them whenever it wakes, at least every millisecond while
 * it is busy, and, before it refuses a request for an unknown capability,
 * once more: a grant sent before the Hello reply was queued is always in
 * by then. A record of another size or magic is logged and dropped.
 * Hang-up (recv 0) means the parent is gone: the child exits.
 */
#include "ucxd.h"
#include "sandbox.h"
#include "kvd_proto.h"
#include "kvd_transport.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
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
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#define UCXD_MAGIC          0x6b766478u /* "kvdx" */
#define UCXD_CTL_MAGIC      0x6b766463u /* "kvdc" */
#define UCXD_FLAG_RMA       1u
#define UCXD_FLAG_REFUSED   2u
#define UCXD_REVOKES_MAX    4096 /* kept back; past it the child is restarted */
#define UCXD_WIN_MAX        4096 /* ranges in one 'W' record */
#define UCXD_CTL_EVERY_NS   (1000ull * 1000)
#define UCXD_SNDBUF         (4 << 20)
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
    uint32_t magic, addr_len, rkey_len, flags;
    uint64_t base;
} ucxd_hdr_t;

typedef struct ucxd_ctl {
    uint32_t magic;
    uint8_t kind; /* 'R', 'G', 'V', 'W', 'X' */
    uint8_t read_only;
    uint16_t zero;
    uint64_t conn_id;
    uint64_t offset, length;
    uint8_t cap[KVD_UCXD_CAP_BYTES];
} ucxd_ctl_t;

_Static_assert(sizeof(ucxd_ctl_t) == 48, "the control record's size is the protocol");
_Static_assert(sizeof(kvd_ucx_range_t) == 16, "a window's range on the control socket");

/* The largest control record: a 'W' with every range it may carry. */
#define UCXD_CTL_BYTES (sizeof(ucxd_ctl_t) + UCXD_WIN_MAX * sizeof(kvd_ucx_range_t))
_Static_assert(KVD_UCXD_CAP_BYTES == KVD_UCX_CAP_BYTES, "one capability size");
_Static_assert(KVD_UCXD_CAP_BYTES <= KVD_UCX_TOKEN_MAX, "it fits HelloReply.ucx_token");

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
    bool pool_ready;     /* told to every child, which then maps the pages */
    char devices[512];   /* UCX_NET_DEVICES for the child; "" its own */
    bool allow_tcp;      /* --ucx-tcp: TCP and UD too */
    bool no_sandbox;     /* --no-ucx-sandbox */
    char refused[256];   /* a child refused: what it left out; "" none */
    uint64_t gen;        /* the child's generation: one per spawn */
    ucxd_ctl_t *revokes; /* kept back while its socket was full */
    size_t n_revokes;
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
    /* its grants die with it */
    kvd_mem_free(KVD_MEM_OTHER, x->revokes, UCXD_REVOKES_MAX * sizeof(*x->revokes));
    x->revokes = NULL;
    x->n_revokes = 0;
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
    if (h.magic == UCXD_MAGIC && h.flags == UCXD_FLAG_REFUSED && h.rkey_len == 0 &&
        h.base == 0 && (uint64_t)r == sizeof(h) + (uint64_t)h.addr_len) {
        /* nothing it may serve on: what it left out, for the Hellos */
        size_t n = KVD_MIN((size_t)h.addr_len, sizeof(x->refused) - 1);
        memcpy(x->refused, buf + sizeof(h), n);
        x->refused[n] = '\0';
        for (size_t i = 0; i < n; i++)
            if (x->refused[i] < 0x20 || x->refused[i] > 0x7e)
                x->refused[i] = '?';
        free(buf);
        return KVD_ERR_UNSUPPORTED;
    }
    bool rma = h.flags & UCXD_FLAG_RMA;
    if (h.magic != UCXD_MAGIC || h.addr_len == 0 || (h.flags & ~UCXD_FLAG_RMA) != 0 ||
        rma != (h.rkey_len != 0) || (!rma && h.base != 0) ||
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
    /* grants must not wait behind a busy child: room for thousands */
    int sndbuf = UCXD_SNDBUF;
    setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof(sndbuf));
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
        /* nothing else of the parent's (a listener, a connection, what
         * kvdockd itself inherited): the child holds the pool and its
         * socket, no more */
        if (syscall(SYS_close_range, UCXD_CHILD_SOCK + 1, ~0u, 0) != 0)
            for (int fd = UCXD_CHILD_SOCK + 1; fd < 65536; fd++)
                close(fd);
        /* this very binary, also once it was replaced or removed on disk
         * (an upgrade): the child must speak the parent's protocol */
        char *argv[] = {"kvdockd",
                        "--ucx-serve",
                        pool_fd,
                        sock_fd,
                        bytes,
                        x->devices[0] ? x->devices : "-",
                        x->allow_tcp ? "tcp" : "rdma",
                        x->no_sandbox ? "open" : "sandbox",
                        NULL};
        execv("/proc/self/exe", argv);
        _exit(127);
    }
    close(sv[1]);
    x->pid = pid;
    x->sock = sv[0];
    x->gen++;
    return KVD_OK;
}

/* Sends one control record without waiting: KVD_OK, KVD_ERR_BUSY (the
 * socket is full), KVD_ERR_CLOSED. */
static int ctl_send(kvd_ucxd_t *x, const ucxd_ctl_t *m)
{
    if (x->sock < 0)
        return KVD_ERR_CLOSED;
    for (;;) {
        ssize_t n = send(x->sock, m, sizeof(*m), MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n == (ssize_t)sizeof(*m))
            return KVD_OK;
        if (n < 0 && errno == EINTR)
            continue;
        return n < 0 && (errno == EAGAIN || errno == ENOBUFS) ? KVD_ERR_BUSY
                                                              : KVD_ERR_CLOSED;
    }
}

/* Sends the revokes kept back, oldest first, while the socket takes them. */
static void flush_revokes(kvd_ucxd_t *x)
{
    if (x->n_revokes == 0)
        return;
    size_t sent = 0;
    while (sent < x->n_revokes && ctl_send(x, &x->revokes[sent]) == KVD_OK)
        sent++;
    memmove(x->revokes, x->revokes + sent, (x->n_revokes - sent) * sizeof(*x->revokes));
    x->n_revokes -= sent;
}

/* The child's description is in (or it failed): up, or dropped. */
static int take_description(kvd_ucxd_t *x, int timeout_ms)
{
    int rc = read_description(x, timeout_ms);
    if (rc == KVD_ERR_UNSUPPORTED) {
        KVD_WARN("ucx", "UCX server (pid %d) serves nothing: it may not serve on %s",
                 (int)x->pid, x->refused);
        drop_child(x, UCXD_STOP_MS); /* it exits by itself */
        return rc;
    }
    if (rc != KVD_OK) {
        KVD_WARN("ucx", "UCX server (pid %d) did not start: %s", (int)x->pid,
                 kvd_status_str(rc));
        if (x->pid > 0)
            kill(x->pid, SIGKILL); /* alive but useless, or dead already */
        drop_child(x, UCXD_STOP_MS);
        return rc == KVD_ERR_PROTOCOL ? rc : KVD_ERR_UNAVAILABLE;
    }
    if (x->pool_ready)
        ctl_send(x, &(ucxd_ctl_t){.magic = UCXD_CTL_MAGIC, .kind = 'R'});
    const ucxd_hdr_t *h = (const ucxd_hdr_t *)x->msg;
    KVD_INFO("ucx", "UCX server pid %d serves the pool (address %u bytes; %s)",
             (int)x->pid, h->addr_len,
             h->flags & UCXD_FLAG_RMA ? "one-sided RMA offered"
                                      : "message mode only, no RMA offered");
    return KVD_OK;
}

int kvd_ucxd_start(const kvd_ucxd_opts_t *o, kvd_ucxd_t **out, char *refused,
                   size_t refused_cap)
{
    if (o->net_devices != NULL &&
        strlen(o->net_devices) >= sizeof(((kvd_ucxd_t *)0)->devices))
        return KVD_ERR_TOO_LARGE;
    kvd_ucxd_t *x = calloc(1, sizeof(*x));
    if (x == NULL)
        return KVD_ERR_NOMEM;
    *x = (kvd_ucxd_t){.pool_fd = o->pool_fd,
                      .pool_bytes = o->pool_bytes,
                      .timeout_ms = o->timeout_ms,
                      .allow_tcp = o->allow_tcp,
                      .no_sandbox = o->no_sandbox,
                      .sock = -1};
    if (o->net_devices != NULL)
        kvd_strlcpy(x->devices, o->net_devices, sizeof(x->devices));
    /* the first start is waited for (kvdockd is not serving yet); restarts
     * are not (see kvd_ucxd_on_event) */
    int rc = spawn(x);
    if (rc == KVD_OK)
        rc = take_description(x, o->timeout_ms);
    if (rc != KVD_OK) {
        if (refused != NULL && refused_cap > 0)
            kvd_strlcpy(refused, rc == KVD_ERR_UNSUPPORTED ? x->refused : "",
                        refused_cap);
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

const char *kvd_ucxd_refused(const kvd_ucxd_t *x)
{
    return x != NULL && x->refused[0] ? x->refused : NULL;
}

bool kvd_ucxd_rma(const kvd_ucxd_t *x)
{
    return kvd_ucxd_up(x) && (((const ucxd_hdr_t *)x->msg)->flags & UCXD_FLAG_RMA);
}

void kvd_ucxd_peer(const kvd_ucxd_t *x, const uint8_t **addr, size_t *addr_len,
                   const uint8_t **rkey, size_t *rkey_len, uint64_t *base)
{
    const ucxd_hdr_t *h = (const ucxd_hdr_t *)x->msg;
    *addr = x->msg + sizeof(*h);
    *addr_len = h->addr_len;
    *rkey = h->rkey_len ? x->msg + sizeof(*h) + h->addr_len : NULL;
    *rkey_len = h->rkey_len;
    *base = h->base;
}

int kvd_ucxd_grant(kvd_ucxd_t *x, uint64_t conn_id, bool read_only, uint64_t offset,
                   uint64_t length, uint8_t cap[KVD_UCXD_CAP_BYTES], uint64_t *gen)
{
    if (!kvd_ucxd_up(x))
        return KVD_ERR_UNAVAILABLE;
    flush_revokes(x); /* in order: what closed before goes first */
    ucxd_ctl_t m = {.magic = UCXD_CTL_MAGIC,
                    .kind = 'G',
                    .read_only = read_only,
                    .conn_id = conn_id,
                    .offset = offset,
                    .length = length};
    /* a credential: no weaker fallback when the kernel has no randomness */
    if (getrandom(m.cap, sizeof(m.cap), 0) != (ssize_t)sizeof(m.cap)) {
        KVD_ERROR("ucx", "getrandom: %s: no UCX capability for connection %llu",
                  strerror(errno), (unsigned long long)conn_id);
        return KVD_ERR_IO;
    }
    int rc = ctl_send(x, &m);
    if (rc != KVD_OK) {
        KVD_WARN("ucx", "cannot grant connection %llu UCX access now: %s",
                 (unsigned long long)conn_id, kvd_status_str(rc));
        return rc == KVD_ERR_BUSY ? rc : KVD_ERR_UNAVAILABLE;
    }
    memcpy(cap, m.cap, sizeof(m.cap));
    *gen = x->gen;
    return KVD_OK;
}

/* Sends a record that takes access away ('V', 'X'), or keeps it back,
 * in order, when the socket is full. */
static void send_or_keep(kvd_ucxd_t *x, const ucxd_ctl_t *rec)
{
    ucxd_ctl_t m = *rec;
    if (x->n_revokes == 0 && ctl_send(x, &m) != KVD_ERR_BUSY)
        return; /* sent, or the child is gone */
    if (x->revokes == NULL)
        x->revokes = kvd_mem_calloc(KVD_MEM_OTHER, UCXD_REVOKES_MAX, sizeof(*x->revokes));
    if (x->revokes == NULL || x->n_revokes == UCXD_REVOKES_MAX) {
        /* a grant that cannot be revoked must not live on: a new child
         * starts with none (its workers say Hello again) */
        KVD_WARN("ucx", "UCX server (pid %d) does not read its revokes: restarting it",
                 (int)x->pid);
        if (x->pid > 0)
            kill(x->pid, SIGKILL);
        return; /* its socket fires; on_event reaps it */
    }
    x->revokes[x->n_revokes++] = m;
}

void kvd_ucxd_revoke(kvd_ucxd_t *x, uint64_t gen, const uint8_t cap[KVD_UCXD_CAP_BYTES])
{
    if (x == NULL || gen != x->gen || x->sock < 0)
        return; /* that child is gone, and its grants with it */
    ucxd_ctl_t m = {.magic = UCXD_CTL_MAGIC, .kind = 'V'};
    memcpy(m.cap, cap, sizeof(m.cap));
    send_or_keep(x, &m);
}

int kvd_ucxd_window_open(kvd_ucxd_t *x, uint64_t gen,
                         const uint8_t cap[KVD_UCXD_CAP_BYTES], uint64_t lease,
                         const kvd_ucx_range_t *r, size_t n)
{
    if (x == NULL || gen != x->gen || x->sock < 0)
        return KVD_ERR_UNAVAILABLE; /* that child is gone, and its grant */
    flush_revokes(x);
    if (x->n_revokes > 0)
        return KVD_ERR_BUSY;            /* after what closed before, never ahead of it */
    static uint8_t buf[UCXD_CTL_BYTES]; /* the daemon's loop is one thread */
    for (size_t at = 0; at < n;) {
        size_t k = KVD_MIN(n - at, (size_t)UCXD_WIN_MAX);
        ucxd_ctl_t m = {
            .magic = UCXD_CTL_MAGIC, .kind = 'W', .conn_id = lease, .length = k};
        memcpy(m.cap, cap, sizeof(m.cap));
        memcpy(buf, &m, sizeof(m));
        memcpy(buf + sizeof(m), r + at, k * sizeof(*r));
        size_t len = sizeof(m) + k * sizeof(*r);
        ssize_t w;
        do
            w = send(x->sock, buf, len, MSG_NOSIGNAL | MSG_DONTWAIT);
        while (w < 0 && errno == EINTR);
        if (w != (ssize_t)len)
            /* what went in is closed by the caller's kvd_ucxd_window_close */
            return w < 0 && (errno == EAGAIN || errno == ENOBUFS) ? KVD_ERR_BUSY
                                                                  : KVD_ERR_UNAVAILABLE;
        at += k;
    }
    return KVD_OK;
}

void kvd_ucxd_window_close(kvd_ucxd_t *x, uint64_t gen,
                           const uint8_t cap[KVD_UCXD_CAP_BYTES], uint64_t lease)
{
    if (x == NULL || gen != x->gen || x->sock < 0)
        return; /* that child is gone, and its windows with it */
    ucxd_ctl_t m = {.magic = UCXD_CTL_MAGIC, .kind = 'X', .conn_id = lease};
    memcpy(m.cap, cap, sizeof(m.cap));
    send_or_keep(x, &m);
}

void kvd_ucxd_pool_ready(kvd_ucxd_t *x)
{
    if (x == NULL || x->pool_ready)
        return;
    x->pool_ready = true;
    if (x->sock >= 0)
        ctl_send(x, &(ucxd_ctl_t){.magic = UCXD_CTL_MAGIC, .kind = 'R'});
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
    if (x->n_revokes > 0)
        flush_revokes(x);
    if (x->pid > 0 && x->msg == NULL &&
        now_ns - x->last_start_ns > (uint64_t)x->timeout_ms * 1000000ull) {
        KVD_WARN("ucx", "UCX server (pid %d) said nothing in %d ms: stopping it",
                 (int)x->pid, x->timeout_ms);
        kill(x->pid, SIGKILL);
        drop_child(x, UCXD_STOP_MS);
        return -1;
    }
    /* a child that refused is not started again: the transports it would
     * find are the same */
    if (x->pid > 0 || x->refused[0] || now_ns - x->last_start_ns < UCXD_RESTART_NS)
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

/* ------------------------------------------------------ net devices */

/* Appends `item` to the comma list in out (unless it is there). */
static int list_add(char *out, size_t cap, const char *item)
{
    size_t n = strlen(item), used = strlen(out);
    for (const char *at = out; *at;) {
        size_t len = strcspn(at, ",");
        if (len == n && strncmp(at, item, n) == 0)
            return KVD_OK;
        at += len + (at[len] == ',');
    }
    if (used + (used ? 1 : 0) + n + 1 > cap)
        return KVD_ERR_TOO_LARGE;
    snprintf(out + used, cap - used, "%s%s", used ? "," : "", item);
    return KVD_OK;
}

static bool sockaddr_equal(const struct sockaddr *a, const struct sockaddr *b)
{
    if (a == NULL || b == NULL || a->sa_family != b->sa_family)
        return false;
    if (a->sa_family == AF_INET)
        return ((const struct sockaddr_in *)a)->sin_addr.s_addr ==
               ((const struct sockaddr_in *)b)->sin_addr.s_addr;
    if (a->sa_family == AF_INET6)
        return memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr,
                      &((const struct sockaddr_in6 *)b)->sin6_addr,
                      sizeof(struct in6_addr)) == 0;
    return false;
}

static bool sockaddr_wildcard(const struct sockaddr *a)
{
    if (a->sa_family == AF_INET)
        return ((const struct sockaddr_in *)a)->sin_addr.s_addr == htonl(INADDR_ANY);
    if (a->sa_family == AF_INET6)
        return IN6_IS_ADDR_UNSPECIFIED(&((const struct sockaddr_in6 *)a)->sin6_addr);
    return false;
}

/* The interfaces of this host that hold one of host's addresses (host
 * NULL: the loopback ones) into out; *wildcard when host is 0.0.0.0 or ::. */
static int interfaces_of(const char *host, char *out, size_t cap, bool *wildcard)
{
    struct addrinfo *res = NULL;
    *wildcard = false;
    if (host != NULL) {
        struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE};
        int gai = getaddrinfo(host[0] ? host : NULL, "0", &hints, &res);
        if (gai != 0) {
            KVD_ERROR("ucx", "--listen host %s: %s", host, gai_strerror(gai));
            return KVD_ERR_INVALID;
        }
        for (struct addrinfo *a = res; a; a = a->ai_next)
            *wildcard |= sockaddr_wildcard(a->ai_addr);
        if (*wildcard) {
            freeaddrinfo(res);
            return KVD_OK;
        }
    }
    struct ifaddrs *ifs = NULL;
    if (getifaddrs(&ifs) != 0) {
        int err = errno;
        freeaddrinfo(res);
        KVD_ERROR("ucx", "getifaddrs: %s", strerror(err));
        return kvd_status_from_errno(err);
    }
    int rc = KVD_OK;
    for (struct ifaddrs *i = ifs; rc == KVD_OK && i; i = i->ifa_next) {
        if (i->ifa_addr == NULL || i->ifa_name == NULL)
            continue;
        bool take = false;
        if (host == NULL)
            take = (i->ifa_flags & IFF_LOOPBACK) != 0;
        else
            for (struct addrinfo *a = res; a && !take; a = a->ai_next)
                take = sockaddr_equal(i->ifa_addr, a->ai_addr);
        if (take)
            rc = list_add(out, cap, i->ifa_name);
    }
    freeifaddrs(ifs);
    freeaddrinfo(res);
    return rc;
}

int kvd_ucxd_net_devices(const char *listen, const char *env_value,
                         const char *rdma_ports, char *out, size_t cap)
{
    if (cap == 0)
        return KVD_ERR_INVALID;
    out[0] = '\0';
    char host[256];
    uint16_t port = 0;
    bool has_listen = listen != NULL && listen[0] != '\0';
    if (has_listen && kvd_parse_host_port(listen, host, sizeof(host), &port) != KVD_OK)
        return KVD_ERR_INVALID;
    char ifs[256] = "";
    bool wildcard = false;
    int rc = interfaces_of(has_listen ? host : NULL, ifs, sizeof(ifs), &wildcard);
    if (rc != KVD_OK)
        return rc;
    if (wildcard)
        return KVD_OK; /* every interface: UCX's own choice */
    if (ifs[0] == '\0') {
        KVD_ERROR("ucx", "%s%s is on no interface of this host",
                  has_listen ? "--listen " : "loopback", has_listen ? host : "");
        return KVD_ERR_INVALID;
    }
    /* the network interfaces --listen names */
    for (const char *at = ifs; rc == KVD_OK && *at;) {
        size_t len = strcspn(at, ",");
        char name[IF_NAMESIZE + 1];
        kvd_strlcpy(name, at, KVD_MIN(len + 1, sizeof(name)));
        rc = list_add(out, cap, name);
        at += len + (at[len] == ',');
    }
    /* RDMA ports (DEVICE:PORT): the operator's, else every active one */
    bool operator_ports =
        env_value != NULL && env_value[0] != '\0' && strcmp(env_value, "all") != 0;
    const char *ports = operator_ports ? env_value : rdma_ports ? rdma_ports : "";
    for (const char *at = ports; rc == KVD_OK && *at;) {
        size_t len = strcspn(at, ",");
        char item[128];
        kvd_strlcpy(item, at, KVD_MIN(len + 1, sizeof(item)));
        if (strchr(item, ':') != NULL)
            rc = list_add(out, cap, item);
        else if (operator_ports && strstr(out, item) == NULL)
            KVD_WARN("ucx",
                     "UCX_NET_DEVICES names %s, which --listen does not: the UCX "
                     "server does not listen there",
                     item);
        at += len + (at[len] == ',');
    }
    if (rc != KVD_OK)
        out[0] = '\0';
    return rc;
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

/* The child's state while it serves. */
typedef struct child {
    kvd_ucx_t *u;
    int sock;
    uint64_t pool_bytes;
    populator_t pop;
    pthread_t pop_thread;
    bool pop_started;
    bool parent_gone;
    uint64_t ctl_ns; /* when the control socket was last read */
} child_t;

static void ctl_apply(child_t *c, const ucxd_ctl_t *m, const kvd_ucx_range_t *ranges)
{
    switch (m->kind) {
    case 'R':
        if (!c->pop_started)
            c->pop_started =
                pthread_create(&c->pop_thread, NULL, populate_main, &c->pop) == 0;
        break;
    case 'G': {
        kvd_ucx_grant_t g = {.read_only = m->read_only != 0,
                             .windowed = true, /* writes only where it reserved */
                             .offset = m->offset,
                             .length = m->length,
                             .conn_id = m->conn_id};
        memcpy(g.cap, m->cap, sizeof(g.cap));
        if (!kvd_range_ok(g.offset, g.length, c->pool_bytes))
            KVD_ERROR("ucxd", "a grant outside the pool for connection %llu: dropped",
                      (unsigned long long)m->conn_id);
        else if (kvd_ucx_grant(c->u, &g) != KVD_OK)
            KVD_ERROR("ucxd", "out of memory: no grant for connection %llu",
                      (unsigned long long)m->conn_id);
        break;
    }
    case 'V': kvd_ucx_revoke(c->u, m->cap); break;
    case 'W': {
        int rc = kvd_ucx_window_open(c->u, m->cap, m->conn_id, ranges, (size_t)m->length);
        if (rc != KVD_OK && rc != KVD_ERR_NOT_FOUND) /* not found: revoked since */
            KVD_ERROR("ucxd", "write windows of lease %llu not opened: %s",
                      (unsigned long long)m->conn_id, kvd_status_str(rc));
        break;
    }
    case 'X': kvd_ucx_window_close(c->u, m->cap, m->conn_id); break;
    default: KVD_WARN("ucxd", "control record of kind %u: dropped", m->kind); break;
    }
}

/* Reads every control record waiting (never waits itself). */
static void ctl_drain(void *arg)
{
    child_t *c = arg;
    c->ctl_ns = kvd_now_ns();
    static uint8_t buf[UCXD_CTL_BYTES]; /* the serving loop's thread only */
    while (!c->parent_gone) {
        ucxd_ctl_t m;
        ssize_t n = recv(c->sock, buf, sizeof(buf), MSG_DONTWAIT | MSG_TRUNC);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return; /* EAGAIN: nothing more now */
        if (n == 0) {
            c->parent_gone = true; /* the parent closed its end */
            return;
        }
        if (n < (ssize_t)sizeof(m) || n > (ssize_t)sizeof(buf)) {
            KVD_WARN("ucxd", "control record of %zd bytes: dropped", n);
            continue;
        }
        memcpy(&m, buf, sizeof(m));
        size_t want = sizeof(m) + (m.kind == 'W' && m.length <= UCXD_WIN_MAX
                                       ? (size_t)m.length * sizeof(kvd_ucx_range_t)
                                       : 0);
        if (m.magic != UCXD_CTL_MAGIC || (size_t)n != want ||
            (m.kind == 'W' && m.length > UCXD_WIN_MAX)) {
            KVD_WARN("ucxd", "control record of %zd bytes: dropped", n);
            continue;
        }
        ctl_apply(c, &m, (const kvd_ucx_range_t *)(buf + sizeof(m)));
    }
}

/* Progresses the worker until the parent closes the socket, reading the
 * control socket whenever it wakes and every UCXD_CTL_EVERY_NS while busy
 * (so that a revoke is not held up by traffic). Once the parent says the
 * pool is populated ('R'), the populator thread maps it here too (waiting
 * for the parent keeps --populate-rate the pool's pace). */
static int serve(child_t *c)
{
    int ep = epoll_create1(EPOLL_CLOEXEC);
    if (ep < 0) {
        KVD_ERROR("ucxd", "epoll_create1: %s", strerror(errno));
        return 1;
    }
    struct epoll_event ev = {.events = EPOLLIN};
    ev.data.fd = kvd_ucx_efd(c->u);
    epoll_ctl(ep, EPOLL_CTL_ADD, ev.data.fd, &ev);
    ev.data.fd = c->sock;
    epoll_ctl(ep, EPOLL_CTL_ADD, c->sock, &ev);
    uint64_t active_ns = 0;
    int status = 1;
    while (!c->parent_gone) {
        /* while requests keep coming, poll rather than sleep: over TCP a
         * rendezvous takes several round trips, each a wake-up otherwise */
        uint64_t now = kvd_now_ns();
        if (now - c->ctl_ns >= UCXD_CTL_EVERY_NS)
            ctl_drain(c);
        if (kvd_ucx_progress(c->u) > 0) {
            active_ns = kvd_now_ns();
            continue;
        }
        if (now - active_ns < UCXD_SPIN_NS)
            continue;
        kvd_ucx_drive(c->u);
        struct epoll_event got[4];
        int n = epoll_wait(ep, got, 4, 1000);
        if (n < 0 && errno != EINTR) {
            KVD_ERROR("ucxd", "epoll_wait: %s", strerror(errno));
            break;
        }
        ctl_drain(c);
    }
    if (c->parent_gone)
        status = 0;
    if (c->pop_started) {
        atomic_store(&c->pop.stop, true);
        pthread_join(c->pop_thread, NULL);
    }
    close(ep);
    return status;
}

/* Starts UCX for the pool on the transports the UCX server may open (see
 * ucxd.h): those that hold a peer to what this process registered, in the
 * NIC (kvd_ucx_tl_enforces_rma: rc, dc; self reaches only this process),
 * and with --ucx-tcp also TCP and UD (kvd_ucx_tl_network), which write a
 * raw put request's bytes wherever the peer says (UCT's own, below UCP).
 * Never UCX's shared-memory ones: next to a network transport, a peer that
 * claims to share this host makes the server attach the segment its
 * address names (posix: /proc/PID/fd/FD of any process of this user;
 * cma: process_vm_readv/writev of the PID it names), and in UCX 1.13 they
 * cannot report a dead peer, which a kvdock worker's endpoint requires.
 * Without RMA first; with it only where every transport the context opened enforces
 * the registration (see ucxd.h), checked again on the context that has
 * it. KVD_ERR_UNSUPPORTED (what was left out in dropped) when none of
 * them is here. */
static int start_ucx(const char *devices, bool allow_tcp, kvd_ucx_t **out, bool *rma,
                     char *dropped, size_t dropped_cap)
{
    kvd_ucx_opts_t o = {.name = "kvdockd",
                        .wakeup = true,
                        .rma = false,
                        .net_devices = devices,
                        .untrusted_peers = true,
                        .tl_allowed =
                            allow_tcp ? kvd_ucx_tl_network : kvd_ucx_tl_enforces_rma,
                        .dropped = dropped,
                        .dropped_cap = dropped_cap};
    kvd_ucx_t *u = NULL;
    int rc = kvd_ucx_create_with(&o, &u);
    if (rc != KVD_OK)
        return rc;
    char why[128] = "";
    *rma = kvd_ucx_rma_enforced(u, why, sizeof(why));
    if (*rma) {
        kvd_ucx_destroy(u);
        u = NULL;
        o.rma = true;
        rc = kvd_ucx_create_with(&o, &u);
        if (rc == KVD_OK && !kvd_ucx_rma_enforced(u, why, sizeof(why))) {
            /* it opened something else this time: never RMA there */
            kvd_ucx_destroy(u);
            u = NULL;
            o.rma = *rma = false;
            rc = kvd_ucx_create_with(&o, &u);
        }
        if (rc != KVD_OK)
            return rc;
    }
    char res[1024];
    kvd_ucx_resources(u, res, sizeof(res));
    KVD_INFO("ucxd", "UCX server serves on %s (UCX_NET_DEVICES %s); one-sided RMA %s%s%s",
             res[0] ? res : "no transport", devices ? devices : "UCX's own",
             *rma ? "offered (the NIC enforces the registration)" : "not offered (",
             *rma ? "" : why,
             *rma ? "" : " does not enforce the registration): message mode");
    if (dropped[0])
        KVD_INFO("ucxd", "UCX server left out %s (%s)", dropped,
                 allow_tcp ? "UCX's shared-memory transports are never served"
                           : "it serves RDMA rc/dc only without --ucx-tcp");
    if (allow_tcp && strstr(res, "tcp/") != NULL)
        KVD_WARN("ucxd",
                 "--ucx-tcp: UCX serves over TCP: any host that reaches the UCX TCP port "
                 "can write into the UCX server process; use it only on a network where "
                 "every host is trusted");
    *out = u;
    return KVD_OK;
}

int kvd_ucxd_main(int argc, char **argv)
{
    uint64_t pool_fd = 0, sock = 0, bytes = 0;
    if (argc != 8 || kvd_u64_parse(argv[2], 0, 1024, &pool_fd) != KVD_OK ||
        kvd_u64_parse(argv[3], 0, 1024, &sock) != KVD_OK ||
        kvd_u64_parse(argv[4], 1, UINT64_MAX, &bytes) != KVD_OK ||
        (strcmp(argv[6], "tcp") != 0 && strcmp(argv[6], "rdma") != 0) ||
        (strcmp(argv[7], "sandbox") != 0 && strcmp(argv[7], "open") != 0)) {
        fprintf(stderr, "kvdockd --ucx-serve: started by kvdockd only\n");
        return 2;
    }
    const char *devices = strcmp(argv[5], "-") == 0 ? NULL : argv[5];
    bool allow_tcp = strcmp(argv[6], "tcp") == 0;
    bool sandbox = strcmp(argv[7], "sandbox") == 0;
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    void *pool = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, (int)pool_fd, 0);
    if (pool == MAP_FAILED) {
        KVD_ERROR("ucxd", "cannot map the pool: %s", strerror(errno));
        return 1;
    }
    /* a same-host writer may cut the pool file short while a get is read
     * out of it here: the guard grows it back instead of this process
     * dying of the SIGBUS (the daemon drops the objects that were there) */
    int grc = kvd_pool_guard_add(pool, bytes, (int)pool_fd, false);
    if (grc != KVD_OK)
        KVD_WARN("ucxd", "cannot guard the pool's mapping (%s)", kvd_status_str(grc));
    close((int)pool_fd);
    kvd_ucx_t *u = NULL;
    kvd_ucx_mem_t *mem = NULL;
    bool rma = false;
    /* what the process may open, while it has one thread (Landlock does
     * not reach threads that run already): UCX then starts inside it */
    if (sandbox) {
        char why[160];
        int ll = kvd_sandbox_confine_files(why, sizeof(why));
        if (ll == KVD_ERR_UNSUPPORTED) {
            KVD_WARN("ucxd", "UCX server may read any file of its uid: %s", why);
        } else if (ll != KVD_OK) {
            KVD_ERROR("ucxd",
                      "UCX server cannot confine its files: %s (%s); --no-ucx-sandbox "
                      "runs it without",
                      why, kvd_status_str(ll));
            munmap(pool, bytes);
            return 1;
        }
    }
    kvd_ucx_quiet_strangers(); /* before UCX starts: its warnings are peers' to cause */
    char dropped[256] = "";
    int rc = start_ucx(devices, allow_tcp, &u, &rma, dropped, sizeof(dropped));
    if (rc == KVD_ERR_UNSUPPORTED) {
        /* no worker was made, so nothing listened: say what was left out */
        if (dropped[0] == '\0')
            kvd_strlcpy(dropped, "no transport", sizeof(dropped));
        ucxd_hdr_t h = {.magic = UCXD_MAGIC,
                        .addr_len = (uint32_t)strlen(dropped),
                        .flags = UCXD_FLAG_REFUSED};
        struct iovec iov[2] = {{&h, sizeof(h)}, {dropped, strlen(dropped)}};
        struct msghdr m = {.msg_iov = iov, .msg_iovlen = 2};
        KVD_INFO("ucxd", "UCX server serves nothing: it may not serve on %s", dropped);
        munmap(pool, bytes);
        return sendmsg((int)sock, &m, MSG_NOSIGNAL) > 0 ? 0 : 1;
    }
    /* the pool is registered (for remote access) only where RMA is
     * offered: elsewhere a guessed rkey must find nothing to open */
    if (rc == KVD_OK && rma)
        rc = kvd_ucx_mem_map(u, pool, bytes, &mem);
    if (rc == KVD_OK)
        rc = rma ? kvd_ucx_serve_messages(u, mem) : kvd_ucx_serve_region(u, pool, bytes);
    if (rc != KVD_OK) {
        KVD_ERROR("ucxd", "UCX cannot serve the pool: %s", kvd_status_str(rc));
        kvd_ucx_mem_unmap(mem);
        kvd_ucx_destroy(u);
        return 1;
    }
    /* UCX's files are open and its threads run: from here on what a peer
     * sends is parsed inside the filter (sandbox.h). Where the kernel or
     * the architecture has none, the server runs without it and says so;
     * any other failure is a broken promise and the server does not run. */
    if (sandbox) {
        char why[160];
        int sb = kvd_sandbox_enter(why, sizeof(why));
        if (sb == KVD_ERR_UNSUPPORTED) {
            KVD_WARN("ucxd", "UCX server runs without its seccomp filter: %s", why);
            sandbox = false;
        } else if (sb != KVD_OK) {
            KVD_ERROR("ucxd",
                      "UCX server cannot enter its seccomp filter: %s (%s); "
                      "--no-ucx-sandbox runs it without one",
                      why, kvd_status_str(sb));
            kvd_ucx_mem_unmap(mem);
            kvd_ucx_destroy(u);
            return 1;
        }
    }
    child_t c = {.u = u, .sock = (int)sock, .pool_bytes = bytes};
    c.pop = (populator_t){.pool = pool, .bytes = bytes};
    kvd_ucx_on_unknown_cap(u, ctl_drain, &c);
    const void *a, *k = NULL;
    size_t alen, klen = 0;
    kvd_ucx_address(u, &a, &alen);
    if (rma)
        kvd_ucx_mem_rkey(mem, &k, &klen);
    ucxd_hdr_t h = {.magic = UCXD_MAGIC,
                    .addr_len = (uint32_t)alen,
                    .rkey_len = (uint32_t)klen,
                    .flags = rma ? UCXD_FLAG_RMA : 0,
                    .base = rma ? (uint64_t)(uintptr_t)pool : 0};
    struct iovec iov[3] = {{&h, sizeof(h)}, {(void *)a, alen}, {(void *)k, klen}};
    struct msghdr m = {.msg_iov = iov, .msg_iovlen = rma ? 3 : 2};
    int status = 1;
    if (sizeof(h) + alen + klen <= UCXD_MSG_MAX &&
        sendmsg((int)sock, &m, MSG_NOSIGNAL) > 0)
        status = serve(&c);
    kvd_ucx_mem_unmap(mem);
    kvd_ucx_destroy(u);
    munmap(pool, bytes);
    /* Inside the filter the process ends here: what exit() runs after
     * main may need what the filter refuses (LeakSanitizer's check of a
     * sanitizer build stops the world with clone and ptrace, and fails) */
    if (sandbox)
        _exit(status);
    return status;
}
