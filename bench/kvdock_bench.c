/*
 * kvdock_bench.c - kvdock's benchmark runner: `kvdock-bench MODE [OPTIONS]`.
 *
 * Benchmarks measure, they do not assert: each mode prints what it measured
 * (a table for people, or one JSON object per line with --json) and exits 0
 * unless something broke (1) or the command line was wrong (2). Modes are
 * rows of bench_modes[]; a new mode is one function and one row.
 *
 * Mode `rpc`: N client threads, one connection each, do Health round trips
 * back to back against kvdockd, and N threads do round trips of a frame of
 * the same size against a bare echo server (one epoll thread in a forked
 * child), which is the floor any RPC over a Unix socket pays. The
 * ratio of the two medians is what kvdock's RPC layer (framing, protobuf,
 * dispatch, bookkeeping) adds over that floor. The echo clients make the
 * same system calls as kvd_client_call() (non-blocking send, recv, poll when
 * recv would block), so the client's waiting pattern cancels out. Each
 * point alternates kvdock and echo in --rounds slices with fresh connections
 * and a warm-up each, so background load on a shared machine hits both.
 * Besides latency it reports each server's CPU time per round trip (from
 * the server process's CPU clock over the measured window), which scheduling
 * noise on a small machine disturbs far less than a median does.
 *
 * Latencies go into one log-linear histogram per thread (128 linear
 * sub-buckets per power of two: at most 0.8% bucket width, values reported
 * at the bucket's middle), merged after the threads are joined.
 *
 * Processes: a kvdockd started here (unless --socket names a running one)
 * and the echo server are children of this process, each with
 * PR_SET_PDEATHSIG so that they cannot outlive it; they are stopped with
 * SIGTERM by their pid, waited for with a deadline and SIGKILLed past it.
 * Nothing else is ever signalled. Every wait has a deadline; the echo
 * server's loop ends on SIGTERM or when its parent is gone.
 *
 * Threading: the main thread parses options, starts the children and runs
 * the points; worker threads only touch their own rpc_worker_t and read the
 * shared rpc_point_t, which is written before the barrier that starts them.
 */
#include "bench.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* The pid of the process serving a Unix socket (SO_PEERCRED), or 0. */
static pid_t bench_socket_server_pid(const char *socket_path)
{
    kvd_client_t *c = NULL;
    if (kvd_client_connect_unix(socket_path, 1000, &c) != KVD_OK)
        return 0;
    struct ucred cred;
    socklen_t len = sizeof(cred);
    pid_t pid = 0;
    if (getsockopt(kvd_client_fd(c), SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0)
        pid = cred.pid;
    kvd_client_close(c);
    return pid;
}

/* ----------------------------------------------------------- echo server */

/*
 * The reference server: one thread, level-triggered epoll, many
 * connections. Per readiness event it reads once, copies every whole frame
 * (4-byte little-endian length + payload) to the output, and writes it back;
 * a connection with unsent output is not read until it drains. It runs in a
 * forked child until SIGTERM or until its parent is gone.
 */
#define ECHO_BUF_BYTES 4096
#define ECHO_MAX_CONNS BENCH_MAX_CLIENTS
#define ECHO_POLL_MS   100

typedef struct echo_conn {
    int fd;
    uint32_t events;
    size_t in_len;
    size_t out_off, out_len;
    uint8_t in[ECHO_BUF_BYTES];
    uint8_t out[ECHO_BUF_BYTES];
} echo_conn_t;

static volatile sig_atomic_t echo_stop;

static void echo_on_sigterm(int sig)
{
    (void)sig;
    echo_stop = 1;
}

static void echo_conn_close(int epfd, echo_conn_t *c, size_t *n_conns)
{
    epoll_ctl(epfd, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    free(c);
    (*n_conns)--;
}

/* Moves whole frames from input to output while the output has room.
 * Returns -1 for a frame that can never fit (the connection is closed). */
static int echo_copy_frames(echo_conn_t *c)
{
    size_t off = 0;
    while (c->in_len - off >= KVD_FRAME_HEADER_BYTES) {
        const uint8_t *p = c->in + off;
        size_t len =
            (size_t)p[0] | (size_t)p[1] << 8 | (size_t)p[2] << 16 | (size_t)p[3] << 24;
        size_t whole = KVD_FRAME_HEADER_BYTES + len;
        if (len == 0 || whole > ECHO_BUF_BYTES)
            return -1;
        if (c->in_len - off < whole || ECHO_BUF_BYTES - c->out_len < whole)
            break;
        memcpy(c->out + c->out_len, p, whole);
        c->out_len += whole;
        off += whole;
    }
    memmove(c->in, c->in + off, c->in_len - off);
    c->in_len -= off;
    return 0;
}

/* Sends what it can; watches for output while some is left. 0 or -1. */
static int echo_flush(int epfd, echo_conn_t *c)
{
    while (c->out_off < c->out_len) {
        ssize_t n =
            send(c->fd, c->out + c->out_off, c->out_len - c->out_off, MSG_NOSIGNAL);
        if (n > 0) {
            c->out_off += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN)
            break;
        return -1;
    }
    if (c->out_off == c->out_len)
        c->out_off = c->out_len = 0;
    uint32_t want = c->out_len > 0 ? EPOLLOUT : EPOLLIN;
    if (want != c->events) {
        struct epoll_event ev = {.events = want, .data.ptr = c};
        if (epoll_ctl(epfd, EPOLL_CTL_MOD, c->fd, &ev) != 0)
            return -1;
        c->events = want;
    }
    return 0;
}

/* One readiness event of a connection. Returns -1 to close it. */
static int echo_on_event(int epfd, echo_conn_t *c, uint32_t ev)
{
    if (ev & EPOLLIN) {
        ssize_t n = recv(c->fd, c->in + c->in_len, ECHO_BUF_BYTES - c->in_len, 0);
        if (n == 0)
            return -1;
        if (n < 0 && errno != EAGAIN && errno != EINTR)
            return -1;
        if (n > 0)
            c->in_len += (size_t)n;
        if (echo_copy_frames(c) != 0)
            return -1;
    } else if (ev & (EPOLLERR | EPOLLHUP)) {
        return -1;
    }
    if (echo_flush(epfd, c) != 0)
        return -1;
    /* output drained: frames that waited for room may go out now */
    if (c->out_len == 0 && c->in_len > 0 && echo_copy_frames(c) == 0 && c->out_len > 0)
        return echo_flush(epfd, c);
    return 0;
}

/* Accepts every pending connection, up to ECHO_MAX_CONNS. */
static void echo_accept_all(int epfd, int listen_fd, size_t *n_conns)
{
    for (size_t i = 0; i < ECHO_MAX_CONNS; i++) {
        int fd = accept4(listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0)
            return;
        echo_conn_t *c = *n_conns < ECHO_MAX_CONNS ? calloc(1, sizeof(*c)) : NULL;
        if (c == NULL) {
            close(fd);
            continue;
        }
        c->fd = fd;
        c->events = EPOLLIN;
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
        if (epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev) != 0) {
            close(fd);
            free(c);
            continue;
        }
        (*n_conns)++;
    }
}

/* The echo server's loop; returns the child's exit status. */
static int echo_serve(int listen_fd, pid_t parent)
{
    struct sigaction sa = {.sa_handler = echo_on_sigterm};
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    int epfd = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event lev = {.events = EPOLLIN, .data.ptr = NULL};
    if (epfd < 0 || epoll_ctl(epfd, EPOLL_CTL_ADD, listen_fd, &lev) != 0)
        return 1;
    size_t n_conns = 0;
    struct epoll_event events[64];
    while (!echo_stop) {
        int n = epoll_wait(epfd, events, (int)KVD_ARRAY_SIZE(events), ECHO_POLL_MS);
        /* PR_SET_PDEATHSIG covers a dying parent; this covers the rest,
         * off the hot path (only when idle) */
        if (n == 0 && getppid() != parent)
            break;
        for (int i = 0; i < n; i++) {
            echo_conn_t *c = events[i].data.ptr;
            if (c == NULL)
                echo_accept_all(epfd, listen_fd, &n_conns);
            else if (echo_on_event(epfd, c, events[i].events) != 0)
                echo_conn_close(epfd, c, &n_conns);
        }
    }
    return 0;
}

/* Binds the echo socket here (so it accepts at once) and forks its server. */
static int bench_echo_start(bench_env_t *env)
{
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    kvd_strlcpy(addr.sun_path, env->echo_socket, sizeof(addr.sun_path));
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0 || bind(fd, (struct sockaddr *)&addr, sizeof(addr)) != 0 ||
        listen(fd, 1024) != 0) {
        fprintf(stderr, "kvdock-bench: echo socket %s: %s\n", env->echo_socket,
                strerror(errno));
        if (fd >= 0)
            close(fd);
        return KVD_ERR_IO;
    }
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "kvdock-bench: fork: %s\n", strerror(errno));
        close(fd);
        return KVD_ERR_IO;
    }
    if (pid == 0) {
        if (bench_child_tie_to_parent(parent) != 0)
            _exit(1);
        _exit(echo_serve(fd, parent));
    }
    close(fd);
    env->echo_pid = pid;
    return KVD_OK;
}

/* ------------------------------------------------------ RPC client kinds */

/*
 * What a worker does per round trip, as an ops table: one for kvdock's
 * Health RPC through the public blocking client, one for the echo frame.
 */
typedef int (*rpc_connect_fn)(const char *socket_path, const uint8_t *frame,
                              size_t frame_bytes, void **conn);
typedef int (*rpc_round_trip_fn)(void *conn);
typedef void (*rpc_close_fn)(void *conn);

typedef struct rpc_target_ops {
    const char *name;
    rpc_connect_fn connect;
    rpc_round_trip_fn round_trip;
    rpc_close_fn close;
} rpc_target_ops_t;

static int kvdock_connect(const char *socket_path, const uint8_t *frame,
                          size_t frame_bytes, void **conn)
{
    (void)frame;
    (void)frame_bytes;
    kvd_client_t *c = NULL;
    int rc = kvd_client_connect_unix(socket_path, BENCH_CALL_TIMEOUT_MS, &c);
    if (rc == KVD_OK) /* nothing is served before a Hello */
        rc = kvd_client_hello(c, "kvdock-bench", NULL, 0, BENCH_CALL_TIMEOUT_MS, NULL);
    if (rc == KVD_OK)
        *conn = c;
    else
        kvd_client_close(c);
    return rc;
}

/* One Health call; an error reply or another method's reply is a failure. */
static int kvdock_round_trip(void *conn)
{
    kvd_msg_t req, rep;
    kvd_msg_request(&req, 0, KVD_METHOD_HEALTH);
    int rc = kvd_client_call(conn, &req, &rep, BENCH_CALL_TIMEOUT_MS);
    if (rc != KVD_OK)
        return rc;
    if (rep.status != KVD_OK)
        return rep.status;
    return rep.method == KVD_METHOD_HEALTH ? KVD_OK : KVD_ERR_PROTOCOL;
}

static void kvdock_close(void *conn)
{
    kvd_client_close(conn);
}

#define ECHO_FRAME_MAX 64

/* An echo connection: the frame it sends, room for the frame it gets. */
typedef struct echo_client {
    int fd;
    size_t frame_bytes;
    uint8_t frame[ECHO_FRAME_MAX];
    uint8_t reply[ECHO_FRAME_MAX];
} echo_client_t;

/* Waits for `events` on fd until the deadline, like kvd_client does. */
static int echo_client_wait(int fd, short events, uint64_t deadline_ns)
{
    for (;;) {
        uint64_t now = kvd_now_ns();
        if (now >= deadline_ns)
            return KVD_ERR_TIMEOUT;
        struct pollfd p = {.fd = fd, .events = events};
        int n = poll(&p, 1, (int)((deadline_ns - now + 999999) / 1000000));
        if (n > 0)
            return KVD_OK;
        if (n < 0 && errno != EINTR)
            return kvd_status_from_errno(errno);
    }
}

static int echo_client_connect(const char *socket_path, const uint8_t *frame,
                               size_t frame_bytes, void **conn)
{
    if (frame_bytes > ECHO_FRAME_MAX)
        return KVD_ERR_TOO_LARGE;
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    kvd_strlcpy(addr.sun_path, socket_path, sizeof(addr.sun_path));
    echo_client_t *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return KVD_ERR_NOMEM;
    /* blocking connect: the listener is up before any client starts */
    c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (c->fd < 0 || connect(c->fd, (struct sockaddr *)&addr, sizeof(addr)) != 0 ||
        fcntl(c->fd, F_SETFL, O_NONBLOCK) != 0) {
        int rc = kvd_status_from_errno(errno);
        if (c->fd >= 0)
            close(c->fd);
        free(c);
        return rc;
    }
    memcpy(c->frame, frame, frame_bytes);
    c->frame_bytes = frame_bytes;
    *conn = c;
    return KVD_OK;
}

/*
 * Sends the frame and reads it back, with kvd_client_call's system calls:
 * a non-blocking send, then recv, and poll() whenever recv would block.
 */
static int echo_client_round_trip(void *conn)
{
    echo_client_t *c = conn;
    uint64_t deadline = kvd_now_ns() + BENCH_CALL_TIMEOUT_MS * 1000000ull;
    size_t off = 0;
    while (off < c->frame_bytes) {
        ssize_t n = send(c->fd, c->frame + off, c->frame_bytes - off, MSG_NOSIGNAL);
        if (n > 0)
            off += (size_t)n;
        else if (n < 0 && errno == EAGAIN) {
            int rc = echo_client_wait(c->fd, POLLOUT, deadline);
            if (rc != KVD_OK)
                return rc;
        } else if (!(n < 0 && errno == EINTR))
            return KVD_ERR_CLOSED;
    }
    off = 0;
    while (off < c->frame_bytes) {
        ssize_t n = recv(c->fd, c->reply + off, c->frame_bytes - off, 0);
        if (n > 0)
            off += (size_t)n;
        else if (n < 0 && errno == EAGAIN) {
            int rc = echo_client_wait(c->fd, POLLIN, deadline);
            if (rc != KVD_OK)
                return rc;
        } else if (!(n < 0 && errno == EINTR))
            return KVD_ERR_CLOSED;
    }
    return memcmp(c->reply, c->frame, c->frame_bytes) == 0 ? KVD_OK : KVD_ERR_PROTOCOL;
}

static void echo_client_close(void *conn)
{
    echo_client_t *c = conn;
    close(c->fd);
    free(c);
}

static const rpc_target_ops_t rpc_kvdock_ops = {"kvdock", kvdock_connect,
                                                kvdock_round_trip, kvdock_close};
static const rpc_target_ops_t rpc_echo_ops = {"echo", echo_client_connect,
                                              echo_client_round_trip, echo_client_close};

/* ---------------------------------------------------------------- points */

/* One measured point: N clients against one target. Shared, read-only to
 * the workers once the start barrier has passed. */
typedef struct rpc_point {
    const rpc_target_ops_t *ops;
    const char *socket_path;
    const uint8_t *frame;
    size_t frame_bytes;
    pid_t server_pid;            /* whose CPU time is measured; 0: unknown */
    pthread_barrier_t connected; /* workers + main: every client connected */
    pthread_barrier_t start;     /* workers + main: times are set */
    bool abort;                  /* set before `start` when a connect failed */
    uint64_t measure_start_ns;   /* warm-up ends, recording begins */
    uint64_t end_ns;             /* no round trip starts after this */
} rpc_point_t;

typedef struct rpc_worker {
    pthread_t thread;
    rpc_point_t *point;
    int status;            /* KVD_OK or the first failure */
    uint64_t last_done_ns; /* when the last recorded round trip finished */
    bench_hist_t hist;     /* recorded round trips (count = ops) */
} rpc_worker_t;

/* What one server measured at one client count, summed over its slices. */
typedef struct rpc_tally {
    bench_hist_t hist;
    double seconds;         /* measured seconds, summed over the slices */
    uint64_t server_cpu_ns; /* server CPU time in them; UINT64_MAX: unknown */
} rpc_tally_t;

/* What a point measured. */
typedef struct rpc_result {
    uint64_t ops;
    double seconds;
    double ops_per_s;
    double p50_us, p99_us, max_us;
    double server_cpu_us; /* server CPU time per round trip; < 0: unknown */
} rpc_result_t;

/* A worker: connect, wait for the start, round trips until end_ns. */
static void *rpc_worker_main(void *arg)
{
    rpc_worker_t *w = arg;
    rpc_point_t *p = w->point;
    void *conn = NULL;
    w->status = p->ops->connect(p->socket_path, p->frame, p->frame_bytes, &conn);
    pthread_barrier_wait(&p->connected);
    pthread_barrier_wait(&p->start);
    if (w->status != KVD_OK || p->abort) {
        if (conn != NULL)
            p->ops->close(conn);
        return NULL;
    }
    for (;;) {
        uint64_t t0 = kvd_now_ns();
        if (t0 >= p->end_ns)
            break;
        int rc = p->ops->round_trip(conn);
        uint64_t t1 = kvd_now_ns();
        if (rc != KVD_OK) {
            w->status = rc;
            break;
        }
        if (t0 >= p->measure_start_ns) {
            hist_add(&w->hist, t1 - t0);
            w->last_done_ns = t1;
        }
    }
    p->ops->close(conn);
    return NULL;
}

/*
 * Runs one slice: n_clients fresh connections, warm-up, then `seconds` of
 * recorded round trips, added to *tally. Returns KVD_OK or the first failure.
 */
static int rpc_run_slice(rpc_point_t *p, size_t n_clients, double warmup_s,
                         double seconds, rpc_tally_t *tally)
{
    rpc_worker_t *w = calloc(n_clients, sizeof(*w));
    if (w == NULL)
        return KVD_ERR_NOMEM;
    pthread_barrier_init(&p->connected, NULL, (unsigned)n_clients + 1);
    pthread_barrier_init(&p->start, NULL, (unsigned)n_clients + 1);
    p->abort = false;
    size_t started = 0;
    int rc = KVD_OK;
    for (; started < n_clients; started++) {
        w[started].point = p;
        int err = pthread_create(&w[started].thread, NULL, rpc_worker_main, &w[started]);
        if (err != 0) {
            fprintf(stderr, "kvdock-bench: pthread_create: %s\n", strerror(err));
            rc = kvd_status_from_errno(err);
            break;
        }
    }
    if (started < n_clients) {
        /* the barriers count on every thread: too late to run this point
         * with fewer, so end the run; the started threads stay blocked */
        return rc;
    }
    pthread_barrier_wait(&p->connected);
    for (size_t i = 0; i < n_clients; i++)
        if (w[i].status != KVD_OK) {
            fprintf(stderr, "kvdock-bench: %s client %zu cannot connect to %s: %s\n",
                    p->ops->name, i, p->socket_path, kvd_status_str(w[i].status));
            p->abort = true;
            rc = w[i].status;
            break;
        }
    uint64_t now = kvd_now_ns();
    p->measure_start_ns = now + (uint64_t)(warmup_s * 1e9);
    p->end_ns = p->measure_start_ns + (uint64_t)(seconds * 1e9);
    pthread_barrier_wait(&p->start);

    /* the server's CPU clock over the measured window */
    uint64_t cpu0 = UINT64_MAX, cpu1 = UINT64_MAX;
    if (rc == KVD_OK) {
        now = kvd_now_ns();
        if (now < p->measure_start_ns)
            kvd_sleep_ns(p->measure_start_ns - now);
        cpu0 = bench_proc_cpu_ns(p->server_pid);
        now = kvd_now_ns();
        if (now < p->end_ns)
            kvd_sleep_ns(p->end_ns - now);
        cpu1 = bench_proc_cpu_ns(p->server_pid);
    }
    if (cpu0 == UINT64_MAX || cpu1 == UINT64_MAX || cpu1 < cpu0)
        tally->server_cpu_ns = UINT64_MAX;
    else if (tally->server_cpu_ns != UINT64_MAX)
        tally->server_cpu_ns += cpu1 - cpu0;

    uint64_t last = p->measure_start_ns;
    for (size_t i = 0; i < n_clients; i++) {
        pthread_join(w[i].thread, NULL);
        if (rc == KVD_OK && w[i].status != KVD_OK) {
            fprintf(stderr, "kvdock-bench: %s client %zu: round trip failed: %s\n",
                    p->ops->name, i, kvd_status_str(w[i].status));
            rc = w[i].status;
        }
        hist_merge(&tally->hist, &w[i].hist);
        last = KVD_MAX(last, w[i].last_done_ns);
    }
    pthread_barrier_destroy(&p->connected);
    pthread_barrier_destroy(&p->start);
    tally->seconds += (double)(last - p->measure_start_ns) / 1e9;
    free(w);
    return rc;
}

/* Turns a tally into throughput and latency figures. */
static void rpc_tally_result(const rpc_tally_t *t, rpc_result_t *out)
{
    out->ops = t->hist.count;
    out->seconds = t->seconds;
    out->ops_per_s = t->seconds > 0 ? (double)t->hist.count / t->seconds : 0.0;
    out->p50_us = (double)hist_quantile_ns(&t->hist, 0.50) / 1e3;
    out->p99_us = (double)hist_quantile_ns(&t->hist, 0.99) / 1e3;
    out->max_us = (double)t->hist.max_ns / 1e3;
    out->server_cpu_us = t->server_cpu_ns == UINT64_MAX || t->hist.count == 0
                             ? -1.0
                             : (double)t->server_cpu_ns / 1e3 / (double)t->hist.count;
}

/* ------------------------------------------------------------ mode: rpc */

typedef struct rpc_opts {
    const char *kvdockd_path;
    const char *socket_path;
    size_t clients[BENCH_MAX_POINTS];
    size_t n_points;
    double seconds;  /* measured per point and server */
    uint64_t rounds; /* slices each server's seconds are split into */
    bool json;
} rpc_opts_t;

static void rpc_usage(FILE *f)
{
    fprintf(
        f,
        "Usage: kvdock-bench rpc [--kvdockd PATH | --socket PATH] [--clients LIST]\n"
        "                        [--seconds S] [--rounds R] [--json]\n"
        "Health round trips to kvdockd from N client threads (one connection\n"
        "each), against the same round trips to a bare epoll echo server.\n\n"
        "  --kvdockd PATH   start this kvdockd (temp socket, --pool-size 64M)\n"
        "  --socket PATH    use the kvdockd already serving PATH instead\n"
        "  --clients LIST   client counts, comma separated (default "
        "1,2,4,8,16,32,64)\n"
        "  --seconds S      measured seconds per point and server (default 3)\n"
        "  --rounds R       alternate kvdock and echo in R slices of S/R seconds\n"
        "                   each, so that background load hits both alike (default 3)\n"
        "  --json           one JSON object per point instead of a table\n");
}

/* Parses "1,2,4" into o->clients. Returns 0 or -1. */
static int rpc_parse_clients(const char *text, rpc_opts_t *o)
{
    char buf[256];
    if (strlen(text) >= sizeof(buf))
        return -1;
    kvd_strlcpy(buf, text, sizeof(buf));
    o->n_points = 0;
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok != NULL;
         tok = strtok_r(NULL, ",", &save)) {
        uint64_t n;
        if (o->n_points == BENCH_MAX_POINTS ||
            kvd_u64_parse(tok, 1, BENCH_MAX_CLIENTS, &n) != KVD_OK)
            return -1;
        o->clients[o->n_points++] = (size_t)n;
    }
    return o->n_points > 0 ? 0 : -1;
}

/* Returns BENCH_EXIT_OK to run, or the exit status to leave with. */
static int rpc_parse_opts(int argc, char **argv, rpc_opts_t *o)
{
    static const struct option longopts[] = {
        {"kvdockd", required_argument, NULL, 'k'},
        {"socket", required_argument, NULL, 's'},
        {"clients", required_argument, NULL, 'c'},
        {"seconds", required_argument, NULL, 't'},
        {"rounds", required_argument, NULL, 'r'},
        {"json", no_argument, NULL, 'j'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    memset(o, 0, sizeof(*o));
    rpc_parse_clients("1,2,4,8,16,32,64", o);
    o->seconds = 3.0;
    o->rounds = 3;
    opterr = 0;
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        switch (c) {
        case 'k': o->kvdockd_path = optarg; break;
        case 's': o->socket_path = optarg; break;
        case 'c':
            if (rpc_parse_clients(optarg, o) != 0) {
                fprintf(stderr,
                        "kvdock-bench rpc: --clients '%s': expected up to %d "
                        "counts in [1, %d], comma separated\n",
                        optarg, BENCH_MAX_POINTS, BENCH_MAX_CLIENTS);
                return BENCH_EXIT_USAGE;
            }
            break;
        case 't':
            if (kvd_double_parse(optarg, 0.1, 3600.0, &o->seconds) != KVD_OK) {
                fprintf(stderr,
                        "kvdock-bench rpc: --seconds '%s': expected a number "
                        "in [0.1, 3600]\n",
                        optarg);
                return BENCH_EXIT_USAGE;
            }
            break;
        case 'r':
            if (kvd_u64_parse(optarg, 1, 100, &o->rounds) != KVD_OK) {
                fprintf(stderr,
                        "kvdock-bench rpc: --rounds '%s': expected an integer "
                        "in [1, 100]\n",
                        optarg);
                return BENCH_EXIT_USAGE;
            }
            break;
        case 'j': o->json = true; break;
        case 'h': rpc_usage(stdout); return -1;
        default:
            fprintf(stderr, "kvdock-bench rpc: unknown option or missing value '%s'\n",
                    argv[optind - 1]);
            rpc_usage(stderr);
            return BENCH_EXIT_USAGE;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "kvdock-bench rpc: unexpected argument '%s'\n", argv[optind]);
        return BENCH_EXIT_USAGE;
    }
    if ((o->kvdockd_path == NULL) == (o->socket_path == NULL)) {
        fprintf(stderr,
                "kvdock-bench rpc: give one of --kvdockd PATH and --socket PATH\n");
        return BENCH_EXIT_USAGE;
    }
    return BENCH_EXIT_OK;
}

/* The echo frame: a packed Health request whose id has the varint length
 * that most ids of a run have (3 bytes: ids 16384 .. 2097151). */
static int rpc_health_frame(kvd_buf_t *frame)
{
    kvd_msg_t req;
    kvd_msg_request(&req, 1u << 16, KVD_METHOD_HEALTH);
    return kvd_msg_pack(&req, KVD_FRAME_DEFAULT_MAX, frame);
}

static void rpc_print_header(const rpc_opts_t *o, const char *target, size_t frame_bytes,
                             double warmup_s)
{
    printf("RPC round trips (Health) over a Unix socket: kvdockd %s\n", target);
    printf("echo reference: 1-thread epoll echo server, %zu-byte frames "
           "(a packed Health request)\n",
           frame_bytes);
    printf("%.1f s measured per point and server, in %llu alternating slices, each "
           "after %.2f s warm-up;\nlatency in us; %ld online CPUs\n",
           o->seconds, (unsigned long long)o->rounds, warmup_s,
           sysconf(_SC_NPROCESSORS_ONLN));
    printf("cpu = the server process's CPU time per round trip, in us\n\n");
    printf("%7s | %12s %8s %8s %6s | %12s %8s %8s %6s | %9s %9s\n", "clients",
           "kvdock ops/s", "p50", "p99", "cpu", "echo ops/s", "p50", "p99", "cpu",
           "p50 ratio", "cpu ratio");
    printf("--------+----------------------------------------+"
           "----------------------------------------+--------------------\n");
}

static void rpc_print_point(const rpc_opts_t *o, size_t n, const rpc_result_t *k,
                            const rpc_result_t *e, size_t frame_bytes)
{
    double ratio = e->p50_us > 0 ? k->p50_us / e->p50_us : 0.0;
    double cpu_ratio = k->server_cpu_us > 0 && e->server_cpu_us > 0
                           ? k->server_cpu_us / e->server_cpu_us
                           : -1.0;
    if (!o->json) {
        printf(
            "%7zu | %12.0f %8.1f %8.1f %6.2f | %12.0f %8.1f %8.1f %6.2f | %9.2f %9.2f\n",
            n, k->ops_per_s, k->p50_us, k->p99_us, k->server_cpu_us, e->ops_per_s,
            e->p50_us, e->p99_us, e->server_cpu_us, ratio, cpu_ratio);
    } else {
        printf("{\"bench\":\"rpc\",\"method\":\"health\",\"clients\":%zu,"
               "\"seconds\":%.3f,\"rounds\":%llu,\"frame_bytes\":%zu,"
               "\"kvdock_ops\":%llu,\"kvdock_ops_per_s\":%.1f,\"kvdock_p50_us\":%.2f,"
               "\"kvdock_p99_us\":%.2f,\"kvdock_max_us\":%.2f,\"kvdock_cpu_us\":%.3f,"
               "\"echo_ops\":%llu,\"echo_ops_per_s\":%.1f,\"echo_p50_us\":%.2f,"
               "\"echo_p99_us\":%.2f,\"echo_max_us\":%.2f,\"echo_cpu_us\":%.3f,"
               "\"p50_ratio\":%.3f,\"cpu_ratio\":%.3f}\n",
               n, o->seconds, (unsigned long long)o->rounds, frame_bytes,
               (unsigned long long)k->ops, k->ops_per_s, k->p50_us, k->p99_us, k->max_us,
               k->server_cpu_us, (unsigned long long)e->ops, e->ops_per_s, e->p50_us,
               e->p99_us, e->max_us, e->server_cpu_us, ratio, cpu_ratio);
    }
    fflush(stdout);
}

/*
 * Runs every point: at each N, kvdock and the echo server take turns, one
 * slice of S/R seconds each, R times, and each server's slices are summed.
 */
static int rpc_run_points(const rpc_opts_t *o, const bench_env_t *env,
                          const char *daemon_socket, const kvd_buf_t *frame)
{
    double slice_s = o->seconds / (double)o->rounds;
    double warmup_s = KVD_MIN(1.0, KVD_MAX(0.2, slice_s / 5.0));
    if (!o->json)
        rpc_print_header(o, o->socket_path ? o->socket_path : o->kvdockd_path, frame->len,
                         warmup_s);
    rpc_point_t kp = {.ops = &rpc_kvdock_ops,
                      .socket_path = daemon_socket,
                      .server_pid = bench_socket_server_pid(daemon_socket)};
    rpc_point_t ep = {.ops = &rpc_echo_ops,
                      .server_pid = env->echo_pid,
                      .socket_path = env->echo_socket,
                      .frame = frame->data,
                      .frame_bytes = frame->len};
    rpc_tally_t *kt = malloc(sizeof(*kt));
    rpc_tally_t *et = malloc(sizeof(*et));
    int rc = kt != NULL && et != NULL ? KVD_OK : KVD_ERR_NOMEM;
    for (size_t i = 0; rc == KVD_OK && i < o->n_points; i++) {
        memset(kt, 0, sizeof(*kt));
        memset(et, 0, sizeof(*et));
        for (uint64_t r = 0; rc == KVD_OK && r < o->rounds; r++) {
            rc = rpc_run_slice(&kp, o->clients[i], warmup_s, slice_s, kt);
            if (rc == KVD_OK)
                rc = rpc_run_slice(&ep, o->clients[i], warmup_s, slice_s, et);
        }
        if (rc != KVD_OK)
            break;
        rpc_result_t k, e;
        rpc_tally_result(kt, &k);
        rpc_tally_result(et, &e);
        rpc_print_point(o, o->clients[i], &k, &e, frame->len);
    }
    free(kt);
    free(et);
    return rc;
}

/* `kvdock-bench rpc`: see rpc_usage(). */
int bench_mode_rpc(int argc, char **argv)
{
    rpc_opts_t o;
    int rc = rpc_parse_opts(argc, argv, &o);
    if (rc != BENCH_EXIT_OK)
        return rc < 0 ? BENCH_EXIT_OK : rc;
    kvd_buf_t frame;
    kvd_buf_init(&frame, KVD_MEM_OTHER);
    if (rpc_health_frame(&frame) != KVD_OK) {
        fprintf(stderr, "kvdock-bench rpc: cannot pack a Health request\n");
        return BENCH_EXIT_FAIL;
    }
    bench_env_t env;
    rc = bench_env_init(&env);
    if (rc == KVD_OK)
        rc = bench_echo_start(&env);
    const char *daemon_socket = o.socket_path;
    if (rc == KVD_OK && o.kvdockd_path != NULL) {
        rc = bench_daemon_start(&env, o.kvdockd_path, "64M", false);
        daemon_socket = env.daemon_socket;
    } else if (rc == KVD_OK) {
        pid_t none = 0;
        rc = bench_wait_ready(o.socket_path, &none, 2000);
    }
    if (rc == KVD_OK)
        rc = rpc_run_points(&o, &env, daemon_socket, &frame);
    bench_env_cleanup(&env);
    kvd_buf_free(&frame);
    return rc == KVD_OK ? BENCH_EXIT_OK : BENCH_EXIT_FAIL;
}

/* ----------------------------------------------------------------- modes */

#ifndef KVD_BENCH_CLUSTER
/* bench_cluster.c needs the cluster tests' harness, built with the tests */
int bench_mode_cluster(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "kvdock-bench cluster: not built (it needs the tests: "
                    "meson configure -Dtests=enabled)\n");
    return BENCH_EXIT_FAIL;
}
#endif

typedef int (*bench_mode_fn)(int argc, char **argv);

typedef struct bench_mode {
    const char *name;
    bench_mode_fn run; /* argv[0] is the mode's name */
    const char *help;
} bench_mode_t;

static const bench_mode_t bench_modes[] = {
    {"rpc", bench_mode_rpc,
     "Health round trips to kvdockd vs. a bare Unix-socket echo, by client count"},
    {"store", bench_mode_store,
     "the store engine in process: insert+publish/s, key probes/s, index bytes/object"},
    {"linker", bench_mode_linker,
     "offload and load through libkvdock (MHA, MLA, hybrid, scattered rows), host or GPU "
     "memory, vs memcpy or pinned copies"},
    {"store-rpc", bench_mode_store_rpc,
     "Lookup of 256 keys over the socket; the 8 MiB object cycle vs. memcpy"},
    {"list-stall", bench_mode_list_stall,
     "Health round trips while one client lists a hostile store (pages, worst wait)"},
    {"ucx", bench_mode_ucx,
     "the UCX transport alone against kvdockd's UCX server: GB/s by mode and size"},
    {"persist", bench_mode_persist,
     "the journal's cost on Publish (vs --no-persist) and the restart with 1M objects"},
    {"ssd", bench_mode_ssd,
     "the SSD tier in process: spill and promote GB/s vs fio, SSD load latency, restart"},
    {"cluster", bench_mode_cluster,
     "three daemons in namespaces: lookup local vs cluster, remote load GB/s, leave "
     "time"},
    {"cluster-sim", bench_mode_cluster_sim,
     "the cluster directory on paper: entries per daemon, what a member leaving moves"},
};

static void bench_usage(FILE *f)
{
    fprintf(f, "Usage: kvdock-bench MODE [OPTIONS]   (kvdock-bench MODE --help)\n"
               "Benchmarks of kvdock; they measure and print, they do not assert.\n\n"
               "Modes:\n");
    for (size_t i = 0; i < KVD_ARRAY_SIZE(bench_modes); i++)
        fprintf(f, "  %-11s %s\n", bench_modes[i].name, bench_modes[i].help);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        bench_usage(stderr);
        return BENCH_EXIT_USAGE;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "help") == 0) {
        bench_usage(stdout);
        return BENCH_EXIT_OK;
    }
    signal(SIGPIPE, SIG_IGN);
    for (size_t i = 0; i < KVD_ARRAY_SIZE(bench_modes); i++)
        if (strcmp(argv[1], bench_modes[i].name) == 0)
            return bench_modes[i].run(argc - 1, argv + 1);
    fprintf(stderr, "kvdock-bench: unknown mode '%s'\n", argv[1]);
    bench_usage(stderr);
    return BENCH_EXIT_USAGE;
}
