/*
 * client.c - a blocking RPC client over a Unix or TCP stream socket.
 *
 * A call writes its request frames and waits until the replies with the
 * same ids arrive, all bounded by one deadline. Ids grow by one per
 * request. Several threads may call at once: each registers its ids
 * before it sends (under `mu`), frames go out whole one call after the
 * other (`send_mu`), and one waiting thread at a time reads the socket
 * (the reader) and hands each reply to the call that asked, waking it; a
 * reader whose deadline passes hands the socket to the next waiter. So a
 * short call never waits for another caller to be scheduled, only for the
 * daemon's replies to what was sent before it.
 *
 * A call that timed out leaves its request behind: the rest of a
 * half-written frame is sent before the next request (the daemon must see
 * whole frames), and its late reply, whose id no call waits for, is read
 * and dropped. An error reply with id 0 is the daemon refusing the
 * connection or a frame: it ends every call waiting.
 * Any other unexpected id (one never sent, or 0 without an error) is a
 * protocol error that fails the connection.
 *
 * Lock order: send_mu, then mu. Neither is held while a thread waits for
 * the socket to become readable; send_mu is held while a call's frames are
 * written (bounded by its deadline).
 */
#include "kvd_proto.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

/* One call waiting for its replies: ids [first, first + n). */
typedef struct waiter {
    uint64_t first;
    size_t n, got;
    kvd_msg_t *reps;
    const kvd_msg_t *reqs; /* their methods: a reply must be of its request's */
    bool done;
    struct waiter *next;
} waiter_t;

struct kvd_client {
    int fd;
    pthread_mutex_t send_mu; /* out, out_sent: one call's frames at a time */
    kvd_buf_t out;           /* frames to send */
    size_t out_sent;         /* bytes of out already sent */
    pthread_mutex_t mu;      /* what follows */
    pthread_cond_t cv;       /* a reply was handed over, or the reader left */
    uint64_t next_id;
    waiter_t *waiters;
    bool reading; /* a thread is the reader: it alone touches framer and
                   * received_fd */
    int dead;     /* the connection's failure; KVD_OK while it works */
    kvd_framer_t framer;
    int received_fd; /* from SCM_RIGHTS, until taken */
};

static int client_new(int fd, kvd_client_t **out)
{
    kvd_client_t *c = calloc(1, sizeof(*c));
    if (c == NULL) {
        close(fd);
        return KVD_ERR_NOMEM;
    }
    c->fd = fd;
    c->received_fd = -1;
    c->next_id = 1;
    pthread_mutex_init(&c->send_mu, NULL);
    pthread_mutex_init(&c->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* deadlines are kvd_now_ns */
    pthread_cond_init(&c->cv, &ca);
    pthread_condattr_destroy(&ca);
    /* a reply may be as large as the biggest frame a daemon may send */
    kvd_framer_init(&c->framer, KVD_FRAME_LIMIT_MAX, KVD_MEM_OTHER);
    kvd_buf_init(&c->out, KVD_MEM_OTHER);
    *out = c;
    return KVD_OK;
}

/* Waits for `events` on fd until deadline_ns. */
static int wait_fd(int fd, short events, uint64_t deadline_ns)
{
    for (;;) {
        uint64_t now = kvd_now_ns();
        if (now >= deadline_ns)
            return KVD_ERR_TIMEOUT;
        int ms = (int)KVD_MIN((deadline_ns - now + 999999) / 1000000, 60000ull);
        struct pollfd p = {.fd = fd, .events = events};
        int n = poll(&p, 1, ms);
        if (n > 0)
            return KVD_OK;
        if (n < 0 && errno != EINTR)
            return kvd_status_from_errno(errno);
    }
}

/* Finishes a non-blocking connect() within the deadline. */
static int finish_connect(int fd, int rc, uint64_t deadline_ns)
{
    if (rc == 0)
        return KVD_OK;
    if (errno != EINPROGRESS && errno != EAGAIN)
        return errno == ENOENT || errno == ECONNREFUSED ? KVD_ERR_UNAVAILABLE
                                                        : kvd_status_from_errno(errno);
    int st = wait_fd(fd, POLLOUT, deadline_ns);
    if (st != KVD_OK)
        return st;
    int err = 0;
    socklen_t len = sizeof(err);
    getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0)
        return err == ECONNREFUSED || err == ENOENT ? KVD_ERR_UNAVAILABLE
                                                    : kvd_status_from_errno(err);
    return KVD_OK;
}

int kvd_client_connect_unix(const char *path, int timeout_ms, kvd_client_t **out)
{
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if (path == NULL || strlen(path) >= sizeof(addr.sun_path))
        return KVD_ERR_INVALID;
    strcpy(addr.sun_path, path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return kvd_status_from_errno(errno);
    uint64_t deadline = kvd_now_ns() + (uint64_t)timeout_ms * 1000000ull;
    /* A Unix socket's connect() says EAGAIN while the listener's backlog
     * is full (a daemon that stopped accepting): nothing is in progress
     * then, and the socket would poll writable without being connected,
     * so connect() is tried again until the deadline. */
    int st = connect(fd, (struct sockaddr *)&addr, sizeof(addr));
    while (st != 0 && errno == EAGAIN && kvd_now_ns() < deadline) {
        kvd_sleep_ns(KVD_MIN(5000000ull, deadline - kvd_now_ns()));
        st = connect(fd, (struct sockaddr *)&addr, sizeof(addr));
    }
    if (st != 0 && errno == EAGAIN) {
        close(fd);
        return KVD_ERR_TIMEOUT;
    }
    int rc = finish_connect(fd, st, deadline);
    if (rc != KVD_OK) {
        close(fd);
        return rc;
    }
    return client_new(fd, out);
}

void kvd_default_socket_path(const char *instance, char *buf, size_t len)
{
    const char *dir = getenv("XDG_RUNTIME_DIR");
    if (dir == NULL || dir[0] == '\0')
        dir = "/tmp";
    snprintf(buf, len, "%s/kvdockd-%s.sock", dir, instance);
}

int kvd_parse_host_port(const char *text, char *host, size_t host_len, uint16_t *port)
{
    if (text == NULL)
        return KVD_ERR_INVALID;
    const char *colon;
    const char *h = text;
    size_t hlen;
    if (text[0] == '[') {
        const char *close_br = strchr(text, ']');
        if (close_br == NULL || close_br[1] != ':')
            return KVD_ERR_INVALID;
        h = text + 1;
        hlen = (size_t)(close_br - h);
        colon = close_br + 1;
    } else {
        colon = strrchr(text, ':');
        if (colon == NULL)
            return KVD_ERR_INVALID;
        hlen = (size_t)(colon - text);
    }
    if (hlen == 0 || hlen >= host_len)
        return KVD_ERR_INVALID;
    uint64_t p;
    if (kvd_u64_parse(colon + 1, 1, 65535, &p) != KVD_OK)
        return KVD_ERR_INVALID;
    memcpy(host, h, hlen);
    host[hlen] = '\0';
    *port = (uint16_t)p;
    return KVD_OK;
}

int kvd_client_connect_tcp(const char *host_port, int timeout_ms, kvd_client_t **out)
{
    char host[256], port_s[8];
    uint16_t port;
    if (kvd_parse_host_port(host_port, host, sizeof(host), &port) != KVD_OK)
        return KVD_ERR_INVALID;
    snprintf(port_s, sizeof(port_s), "%u", port);
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV};
    struct addrinfo *res = NULL;
    if (getaddrinfo(host, port_s, &hints, &res) != 0)
        return KVD_ERR_NOT_FOUND;
    uint64_t deadline = kvd_now_ns() + (uint64_t)timeout_ms * 1000000ull;
    int rc = KVD_ERR_UNAVAILABLE;
    int fd = -1;
    for (struct addrinfo *ai = res; ai != NULL; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK,
                    ai->ai_protocol);
        if (fd < 0)
            continue;
        rc = finish_connect(fd, connect(fd, ai->ai_addr, ai->ai_addrlen), deadline);
        if (rc == KVD_OK)
            break;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    if (fd < 0)
        return rc;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return client_new(fd, out);
}

void kvd_client_close(kvd_client_t *c)
{
    if (c == NULL)
        return;
    close(c->fd);
    if (c->received_fd >= 0)
        close(c->received_fd);
    kvd_framer_free(&c->framer);
    kvd_buf_free(&c->out);
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
    pthread_mutex_destroy(&c->send_mu);
    free(c);
}

int kvd_client_fd(const kvd_client_t *c)
{
    return c->fd;
}

/* Writes the rest of c->out before the deadline. On a timeout what was
 * sent stays counted in c->out_sent, so the next call can finish the frame. */
static int flush_out(kvd_client_t *c, uint64_t deadline)
{
    while (c->out_sent < c->out.len) {
        ssize_t n = send(c->fd, c->out.data + c->out_sent, c->out.len - c->out_sent,
                         MSG_NOSIGNAL);
        if (n > 0) {
            c->out_sent += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN) {
            int rc = wait_fd(c->fd, POLLOUT, deadline);
            if (rc != KVD_OK)
                return rc;
            continue;
        }
        return KVD_ERR_CLOSED;
    }
    c->out.len = 0;
    c->out_sent = 0;
    return KVD_OK;
}

/* recv() that also takes a descriptor passed with SCM_RIGHTS (the daemon
 * sends its pool's fd with the Hello reply); a plain recv() would close it. */
static ssize_t recv_with_fd(kvd_client_t *c, uint8_t *buf, size_t len)
{
    struct iovec iov = {.iov_base = buf, .iov_len = len};
    union {
        struct cmsghdr align;
        char buf[CMSG_SPACE(sizeof(int))];
    } ctl;
    struct msghdr msg = {.msg_iov = &iov,
                         .msg_iovlen = 1,
                         .msg_control = ctl.buf,
                         .msg_controllen = sizeof(ctl.buf)};
    ssize_t n = recvmsg(c->fd, &msg, MSG_CMSG_CLOEXEC);
    if (n <= 0)
        return n;
    for (struct cmsghdr *cm = CMSG_FIRSTHDR(&msg); cm != NULL;
         cm = CMSG_NXTHDR(&msg, cm)) {
        if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS) {
            int fd;
            memcpy(&fd, CMSG_DATA(cm), sizeof(fd));
            if (c->received_fd >= 0)
                close(c->received_fd); /* only the newest is kept */
            c->received_fd = fd;
        }
    }
    return n;
}

int kvd_client_take_fd(kvd_client_t *c)
{
    int fd = c->received_fd;
    c->received_fd = -1;
    return fd;
}

/* Reads frames until one decodes into m (the reader's). KVD_OK,
 * KVD_ERR_PROTOCOL for a frame that does not decode, KVD_ERR_TIMEOUT,
 * KVD_ERR_CLOSED. */
static int read_frame(kvd_client_t *c, kvd_msg_t *m, uint64_t deadline)
{
    /* a reply to a request just sent is not there yet: wait first rather
     * than pay a recv() that would say EAGAIN */
    bool wait_first = kvd_framer_pending(&c->framer) == 0;
    for (;;) {
        if (wait_first) {
            wait_first = false;
            int rc = wait_fd(c->fd, POLLIN, deadline);
            if (rc != KVD_OK)
                return rc;
        }
        const uint8_t *payload;
        size_t len;
        int got = kvd_framer_next(&c->framer, &payload, &len);
        if (got < 0)
            return KVD_ERR_PROTOCOL;
        if (got == 1) {
            int rc = kvd_msg_decode(payload, len, m);
            if (rc != KVD_OK) {
                kvd_msg_clear(m);
                return KVD_ERR_PROTOCOL;
            }
            return KVD_OK;
        }
        uint8_t *space;
        size_t avail;
        int rc = kvd_framer_space(&c->framer, 4096, &space, &avail);
        if (rc != KVD_OK)
            return rc;
        ssize_t n = recv_with_fd(c, space, avail);
        if (n > 0) {
            kvd_framer_commit(&c->framer, (size_t)n);
            continue;
        }
        if (n == 0)
            return KVD_ERR_CLOSED;
        if (errno == EINTR)
            continue;
        if (errno != EAGAIN)
            return KVD_ERR_CLOSED;
        rc = wait_fd(c->fd, POLLIN, deadline);
        if (rc != KVD_OK)
            return rc;
    }
}

/* The daemon refused the connection or a frame (an error reply with id
 * 0): the first request still without a reply gets it, every other one
 * its status, and every waiting call ends (a daemon that ends the
 * connection too closes it, which the next call sees). */
static void hand_refusal(kvd_client_t *c, kvd_msg_t *m)
{
    bool placed = false;
    for (waiter_t *w = c->waiters; w; w = w->next) {
        for (size_t k = 0; k < w->n; k++) {
            if (w->reps[k].reply)
                continue;
            if (!placed)
                w->reps[k] = *m;
            else
                w->reps[k].status = m->status;
            placed = true;
        }
        w->done = true;
    }
    if (!placed)
        kvd_msg_clear(m);
}

/* Hands m to the call whose id it carries. Caller holds mu. KVD_OK, or
 * KVD_ERR_PROTOCOL for an id nobody asked for (m is cleared then). */
static int hand_over(kvd_client_t *c, kvd_msg_t *m)
{
    if (m->id == 0 && m->status < 0) {
        hand_refusal(c, m);
        return KVD_OK;
    }
    for (waiter_t *w = c->waiters; m->reply && w; w = w->next) {
        if (m->id < w->first || m->id - w->first >= w->n)
            continue;
        kvd_msg_t *slot = &w->reps[m->id - w->first];
        /* a second reply to one request, or a body of another method (read
         * as the one asked for, its counts and pointers would be garbage) */
        if (slot->reply ||
            (m->status == KVD_OK && m->method != w->reqs[m->id - w->first].method)) {
            kvd_msg_clear(m);
            return KVD_ERR_PROTOCOL;
        }
        *slot = *m;
        w->done = ++w->got == w->n;
        return KVD_OK;
    }
    bool late = m->reply && m->id != 0 && m->id < c->next_id;
    kvd_msg_clear(m);
    /* the late reply to a call that gave up: dropped */
    return late ? KVD_OK : KVD_ERR_PROTOCOL;
}

static struct timespec monotonic_ts(uint64_t ns)
{
    return (struct timespec){.tv_sec = (time_t)(ns / 1000000000ull),
                             .tv_nsec = (long)(ns % 1000000000ull)};
}

/* Waits until w's replies are in: as the reader when nobody reads, else
 * asleep until the reader hands something over. */
static int wait_replies(kvd_client_t *c, waiter_t *w, uint64_t deadline)
{
    int rc = KVD_OK;
    pthread_mutex_lock(&c->mu);
    while (!w->done) {
        if (c->dead != KVD_OK) {
            rc = c->dead;
            break;
        }
        if (!c->reading) {
            c->reading = true;
            pthread_mutex_unlock(&c->mu);
            kvd_msg_t m;
            int got = read_frame(c, &m, deadline);
            pthread_mutex_lock(&c->mu);
            c->reading = false;
            if (got == KVD_OK)
                got = hand_over(c, &m);
            pthread_cond_broadcast(&c->cv); /* a reply, or the socket is free */
            if (got == KVD_ERR_TIMEOUT) {
                rc = got; /* this call's deadline; the connection is fine */
                break;
            }
            if (got != KVD_OK)
                c->dead = got;
            continue;
        }
        struct timespec ts = monotonic_ts(deadline);
        if (pthread_cond_timedwait(&c->cv, &c->mu, &ts) == ETIMEDOUT && !w->done) {
            rc = KVD_ERR_TIMEOUT;
            break;
        }
    }
    if (w->done)
        rc = KVD_OK;
    for (waiter_t **pp = &c->waiters; *pp; pp = &(*pp)->next)
        if (*pp == w) {
            *pp = w->next;
            break;
        }
    pthread_mutex_unlock(&c->mu);
    return rc;
}

int kvd_client_call_many_until(kvd_client_t *c, kvd_msg_t *reqs, kvd_msg_t *reps,
                               size_t n, uint64_t deadline)
{
    for (size_t i = 0; i < n; i++)
        memset(&reps[i], 0, sizeof(reps[i])); /* kvd_msg_clear is safe whatever happens */
    if (n == 0)
        return KVD_OK;
    waiter_t w = {.n = n, .reps = reps, .reqs = reqs};
    /* the frames of the call before may be stuck in a full socket (a
     * daemon that stopped reading) until that call's deadline, which may
     * be later than this one's */
    if (!kvd_mutex_lock_until(&c->send_mu, deadline))
        return KVD_ERR_TIMEOUT;
    /* what is left of a request abandoned mid-write goes out first */
    kvd_buf_consume(&c->out, c->out_sent);
    c->out_sent = 0;
    size_t before = c->out.len;
    pthread_mutex_lock(&c->mu);
    int rc = c->dead;
    w.first = c->next_id;
    for (size_t i = 0; i < n && rc == KVD_OK; i++) {
        reqs[i].id = c->next_id++;
        reqs[i].reply = false;
        rc = kvd_msg_pack(&reqs[i], KVD_FRAME_LIMIT_MAX, &c->out);
    }
    if (rc == KVD_OK) { /* listed before a byte goes: its replies find it */
        w.next = c->waiters;
        c->waiters = &w;
    }
    pthread_mutex_unlock(&c->mu);
    if (rc != KVD_OK) {
        c->out.len = before; /* none of them goes out later either */
        pthread_mutex_unlock(&c->send_mu);
        return rc;
    }
    rc = flush_out(c, deadline);
    pthread_mutex_unlock(&c->send_mu);
    /* a daemon that refused the connection (too many clients) closed it after
     * its error reply: read that reply rather than report the broken pipe */
    if (rc == KVD_OK || rc == KVD_ERR_CLOSED)
        rc = wait_replies(c, &w, deadline);
    else
        wait_replies(c, &w, kvd_now_ns()); /* takes w off the list */
    if (rc != KVD_OK)
        for (size_t i = 0; i < n; i++)
            kvd_msg_clear(&reps[i]);
    return rc;
}

int kvd_client_call_many(kvd_client_t *c, kvd_msg_t *reqs, kvd_msg_t *reps, size_t n,
                         int timeout_ms)
{
    return kvd_client_call_many_until(c, reqs, reps, n,
                                      kvd_now_ns() + (uint64_t)timeout_ms * 1000000ull);
}

int kvd_client_call(kvd_client_t *c, kvd_msg_t *req, kvd_msg_t *rep, int timeout_ms)
{
    return kvd_client_call_many(c, req, rep, 1, timeout_ms);
}

bool kvd_client_ended(const kvd_client_t *c)
{
    struct pollfd p = {.fd = c->fd, .events = POLLRDHUP};
    return poll(&p, 1, 0) != 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

int kvd_client_health_once(const char *path, int connect_ms, int call_ms)
{
    kvd_client_t *c = NULL;
    int rc = kvd_client_connect_unix(path, connect_ms, &c);
    if (rc != KVD_OK)
        return rc;
    rc = kvd_client_hello(c, "kvdock-health", NULL, 0, call_ms, NULL);
    if (rc != KVD_OK) {
        kvd_client_close(c);
        return rc;
    }
    kvd_msg_t req, rep;
    kvd_msg_request(&req, 0, KVD_METHOD_HEALTH);
    rc = kvd_client_call(c, &req, &rep, call_ms);
    kvd_client_close(c);
    if (rc == KVD_OK)
        rc = rep.status != KVD_OK ? rep.status : (int)rep.body.health_rep.state;
    kvd_msg_clear(&rep);
    return rc;
}

int kvd_client_hello(kvd_client_t *c, const char *client_name, const uint8_t *token,
                     size_t token_len, int timeout_ms, kvd_hello_rep_t *out)
{
    if (token_len > KVD_TOKEN_MAX)
        return KVD_ERR_INVALID;
    kvd_msg_t req, rep;
    kvd_msg_request(&req, 0, KVD_METHOD_HELLO);
    kvd_hello_req_t *h = &req.body.hello_req;
    kvd_strlcpy(h->client_name, client_name ? client_name : "kvdock",
                sizeof(h->client_name));
    h->pid = (uint32_t)getpid();
    h->protocol_version = KVD_PROTOCOL_VERSION;
    if (token_len > 0)
        memcpy(h->auth_token, token, token_len);
    h->auth_token_len = token_len;
    int rc = kvd_client_call(c, &req, &rep, timeout_ms);
    explicit_bzero(h->auth_token, sizeof(h->auth_token));
    if (rc != KVD_OK)
        return rc;
    rc = rep.status;
    if (rc == KVD_OK && out != NULL) {
        *out = rep.body.hello_rep;
        out->n_ns_ids = 0;
        out->ns_ids = NULL;
        out->ucx_address = out->ucx_rkey = NULL;
        out->ucx_address_len = out->ucx_rkey_len = 0;
    }
    kvd_msg_clear(&rep);
    return rc;
}
