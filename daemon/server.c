/*
 * server.c - kvdockd's event loop: listeners, connections, RPC dispatch
 * (Hello, Health and Stats here, the store's methods in rpc_store.c),
 * signals, the UCX server process (ucxd.h) it starts and restarts, the
 * metrics endpoint's snapshots (metrics.h) and the periodic tick (pool
 * readiness, usage line, a fresh snapshot, drain deadline).
 *
 * One thread runs the loop (level-triggered epoll). Each connection owns a
 * framer for its input and a buffer for its output; requests are served in
 * arrival order and their replies appended to the output. A connection whose
 * output passes OUT_HIGH_WATER stops being read until it drains, so a client
 * that never reads cannot grow the daemon's memory.
 *
 * Every connection says Hello first: any other method before a Hello that
 * succeeded is refused (KVD_ERR_AUTH) and the connection closed, as it is
 * after a Hello that fails; the Hello's credential (auth.h) sets who the
 * connection is (conn_t.ctx) for everything after it. Refusals are counted
 * (auth_failures) and logged at a bounded rate, without the client's bytes.
 *
 * Protocol violations (oversize or zero-length frame, bytes that do not
 * decode, an unknown method, a reply sent as a request) get one error reply
 * where one can be sent and close that connection only; a truncated frame
 * (EOF inside a frame) just closes it. The daemon and its other clients
 * carry on.
 */
#include "server.h"
#include "auth.h"
#include "cluster.h"
#include "dirsvc.h"
#include "peers.h"
#include "remote.h"
#include "metrics.h"
#include "rpc_store.h"
#include "nics.h"
#include "ucxd.h"

#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/timerfd.h>
#include <sys/un.h>
#include <unistd.h>

#define OUT_HIGH_WATER (8u * 1024u * 1024u)
#define BUF_KEEP_BYTES (1u * 1024u * 1024u) /* buffers larger are freed when empty */
#define READ_CHUNK     (64u * 1024u)
/* Time one connection's pipelined frames may hold the loop in one turn. */
#define CONN_TURN_NS (2u * 1000u * 1000u)
#define TICK_MS      100
/* The largest frame of a connection that has not said Hello: a Hello of
 * --max-batch namespaces with long names fits (about 0.4 MiB at 4,096),
 * while unauthenticated connections cannot hold --max-frame of buffers
 * each against --max-conn-buffer, and so get others closed. */
#define HELLO_FRAME_MAX (1u * 1024u * 1024u)

typedef enum src_kind {
    SRC_UNIX_LISTEN,
    SRC_TCP_LISTEN,
    SRC_SIGNAL,
    SRC_TIMER,
    SRC_UCX,
    SRC_TIER,    /* the SSD tier's completions */
    SRC_POOL,    /* the pool file was modified (kvd_pool_watch_fd) */
    SRC_CLUSTER, /* the cluster's view changed (cluster.h) */
    SRC_PEERS,   /* requests to peer daemons ended (peers.h) */
    SRC_CONN,
} src_kind_t;

/* What an epoll event points at; first member of every watched object. */
typedef struct src {
    src_kind_t kind;
    int fd;
} src_t;

typedef struct conn {
    src_t src;
    uint64_t id;
    bool tcp;
    bool authed;       /* a Hello succeeded: ctx says who it is */
    bool closing;      /* close once the output is flushed */
    bool dead;         /* closed; freed after the current epoll batch */
    uint32_t events;   /* what epoll watches now */
    size_t fd_at;      /* offset in out where the pool fd rides; SIZE_MAX none */
    bool backlog;      /* whole frames left unserved when its turn ended */
    kvd_rpc_ctx_t ctx; /* who it is: its id, and the tenant of its credential */
    /* its UCX access, granted at a Hello with want_ucx (ucxd.h): the
     * capability and the UCX server generation it was granted by */
    bool ucx_granted;
    uint64_t ucx_gen;
    uint8_t ucx_cap[KVD_UCXD_CAP_BYTES];
    /* its reservation leases with open UCX write windows (ucxd.h): closed
     * when the lease is published, revoked or expires */
    uint64_t *ucx_leases;
    size_t n_ucx_leases, cap_ucx_leases;
    kvd_framer_t in;
    kvd_buf_t out;
    /* its Acquires held while their objects come into the pool
     * (acquire_park), oldest first; freed with it */
    struct acq_wait *acq_waits;
    size_t n_acq_waits;
    /* what a client may hold, and for how long (on_tick closes it): */
    uint64_t accepted_ns;
    bool hello_done;         /* a Hello was answered: no hello timeout */
    uint64_t frame_since_ns; /* the unfinished frame at the head began; 0 none */
    size_t buf_bytes;        /* in + out capacity, as counted in conn_buf_bytes */
    struct conn *prev, *next;
} conn_t;

struct kvd_server {
    kvd_opts_t opts;
    kvd_pool_t *pool;
    kvd_store_t *store;
    kvd_auth_t *auth;
    kvd_ratelimit_t auth_log; /* refusal lines: a few a minute */
    mode_t socket_mode;
    int epfd;
    src_t unix_listen, tcp_listen, sig, timer;
    /* UCX workers reach the pool through the UCX server process (see
     * ucxd.h); its control socket is watched as `ucx_src` */
    kvd_ucxd_t *ucxd;
    src_t ucx_src;
    src_t tier_src;
    src_t pool_src; /* inotify on the pool file; fd -1 without */
    /* the cluster (--cluster-etcd; NULL for a single-node store): its
     * thread's eventfd, and the view the loop last took */
    kvd_cluster_t *cluster;
    src_t cluster_src;
    kvd_cluster_view_t view;
    kvd_peers_t *peers; /* calls to the other daemons, and their ends */
    src_t peers_src;
    kvd_dirsvc_t *dirsvc; /* the directory: this daemon's share and announcements */
    kvd_remote_t *remote; /* remote loads: objects of other members fetched here */
    /* the UCX server started but may serve on none of the transports it
     * found: what it left out ("tcp/lo"), for the Hellos that ask */
    char ucx_refused[256];
    conn_t *conns;
    conn_t *dead; /* closed during this batch, freed after it */
    /* Acquires held by their connections (acquire_park): how many, the
     * bytes of their copies, the earliest time one must be answered, and
     * whether something that may end one completed since they were tried */
    size_t n_acq_waits;
    uint64_t acq_waits_total; /* held since the start (Stats) */
    size_t acq_wait_bytes;
    uint64_t acq_next_ns;
    bool acq_kick;
    bool backlog;            /* some connection has frames waiting for its next turn */
    uint64_t conn_buf_bytes; /* every connection's buffers (--max-conn-buffer) */
    uint64_t next_conn_id;
    kvd_counters_t counters;
    _Atomic int health;
    uint64_t start_ns;
    bool draining;
    bool accept_paused; /* out of descriptors: listeners unwatched a tick */
    uint64_t drain_deadline_ns;
    /* Stats' invariant check walks every record while the loop waits
     * (about 0.23 s per million objects, bench/RESULTS.md): a leaky
     * bucket of the checks' time (check_allowed) keeps them at most 1 % of
     * the loop's, with bursts of CHECK_FREE_NS */
    uint64_t check_took_ns; /* the last check's time */
    uint64_t check_debt_ns; /* checks' time not yet paid off, as of check_at_ns */
    uint64_t check_at_ns;
    uint64_t next_usage_ns;
    uint64_t usage_prev_calls;
    uint64_t usage_prev_ns;
    uint64_t usage_prev_published;
    uint64_t usage_prev_acquired;
    kvd_metrics_t *metrics;
    kvd_nic_list_t nics; /* RDMA ports found at start, for Stats */
    kvd_msg_t msgs[2];   /* the request being served and its reply */
    /* the socket file bound at --socket: only that one is ever removed */
    bool sock_bound;
    dev_t sock_dev;
    ino_t sock_ino;
};

/* Zeroes an extent handed to a tenant whose bytes were another tenant's
 * (kvd_store_set_scrub): measured in doc/TRUST.md, it is paid only when
 * a reservation crosses tenants. */
static void scrub_pool(void *arg, uint64_t offset, uint64_t bytes)
{
    kvd_pool_zero(arg, offset, bytes);
}

/* ------------------------------------------------------------ counters */

void kvd_counters_record(kvd_counters_t *c, kvd_method_t m, bool error,
                         uint64_t latency_ns)
{
    if ((unsigned)m >= KVD_METHOD_COUNT)
        m = KVD_METHOD_NONE;
    kvd_method_counters_t *mc = &c->methods[m];
    uint64_t us = latency_ns / 1000;
    atomic_fetch_add(&mc->calls, 1);
    if (error)
        atomic_fetch_add(&mc->errors, 1);
    atomic_fetch_add(&mc->latency_us_sum, us);
    size_t b = 0;
    while (b + 1 < KVD_LATENCY_BUCKETS && us > kvd_latency_bound_us(b))
        b++;
    atomic_fetch_add(&mc->buckets[b], 1);
}

static kvd_health_t server_health(kvd_server_t *s)
{
    return (kvd_health_t)atomic_load(&s->health);
}

/* The daemon's figures for Stats, the usage line and /metrics; without
 * the namespace table and the NICs. */
static void server_stats(kvd_server_t *s, kvd_stats_rep_t *out)
{
    memset(out, 0, sizeof(*out));
    kvd_strlcpy(out->daemon_version, KVD_VERSION, sizeof(out->daemon_version));
    kvd_strlcpy(out->instance, s->opts.instance, sizeof(out->instance));
    out->state = server_health(s);
    out->uptime_ms = (kvd_now_ns() - s->start_ns) / 1000000;

    kvd_mem_stats_t *m = &out->memory;
    m->pool_bytes = kvd_pool_size(s->pool);
    m->pool_populated_bytes = kvd_pool_populated_bytes(s->pool);
    m->hugepages = kvd_pool_hugepages(s->pool);
    m->mlocked = kvd_pool_mlocked(s->pool);
    kvd_proc_mem_t pm;
    if (kvd_proc_mem_read(&pm) == KVD_OK) {
        m->rss_bytes = pm.rss_bytes;
        m->rss_anon_bytes = pm.rss_anon_bytes;
        m->rss_file_bytes = pm.rss_file_bytes;
        m->rss_shmem_bytes = pm.rss_shmem_bytes;
    }
    m->conn_bytes = kvd_mem_bytes(KVD_MEM_CONN);
    m->index_bytes = kvd_mem_bytes(KVD_MEM_INDEX);
    m->staging_bytes = kvd_mem_bytes(KVD_MEM_STAGING);
    m->other_bytes = kvd_mem_bytes(KVD_MEM_OTHER);

    kvd_counters_t *k = &s->counters;
    out->connections_current = atomic_load(&k->connections_current);
    out->connections_total = atomic_load(&k->connections_total);
    out->connections_rejected = atomic_load(&k->connections_rejected);
    out->protocol_errors = atomic_load(&k->protocol_errors);
    out->auth_failures = atomic_load(&k->auth_failures);
    out->connections_timed_out = atomic_load(&k->connections_timed_out);
    out->connections_over_buffer = atomic_load(&k->connections_over_buffer);
    out->acquires_held = s->n_acq_waits;
    out->acquires_held_total = s->acq_waits_total;
    kvd_store_stats_t ss;
    kvd_store_stats(s->store, &ss);
    kvd_rpc_store_stats(&ss, &out->store);
    for (size_t i = 0; i < KVD_METHOD_COUNT; i++) {
        kvd_method_counters_t *mc = &k->methods[i];
        out->methods[i].calls = atomic_load(&mc->calls);
        out->methods[i].errors = atomic_load(&mc->errors);
        out->methods[i].latency_us_sum = atomic_load(&mc->latency_us_sum);
        for (size_t b = 0; b < KVD_LATENCY_BUCKETS; b++)
            out->methods[i].latency_buckets[b] = atomic_load(&mc->buckets[b]);
    }
}

/* ---------------------------------------------------------- connections */

static int watch(kvd_server_t *s, src_t *src, uint32_t events, int op)
{
    struct epoll_event ev = {.events = events, .data.ptr = src};
    if (epoll_ctl(s->epfd, op, src->fd, &ev) != 0) {
        int err = errno;
        KVD_ERROR("server", "epoll_ctl(fd %d): %s", src->fd, strerror(err));
        return kvd_status_from_errno(err);
    }
    return KVD_OK;
}

/* Brings conn_buf_bytes up to date with c's buffers (after they grew or
 * were freed). */
static void conn_account(kvd_server_t *s, conn_t *c)
{
    size_t now = c->in.buf.cap + c->out.cap;
    s->conn_buf_bytes = s->conn_buf_bytes - c->buf_bytes + now;
    c->buf_bytes = now;
}

/* Whether the connections' buffers are over --max-conn-buffer: then no
 * connection's input grows and replies wait (conn_serve_buffered). */
static bool conn_buffers_full(const kvd_server_t *s)
{
    return s->conn_buf_bytes > s->opts.max_conn_buffer_bytes;
}

/* Forgets the connection's write windows: its capability goes with them. */
static void ucx_leases_forget(conn_t *c)
{
    kvd_mem_free(KVD_MEM_OTHER, c->ucx_leases, c->cap_ucx_leases * sizeof(uint64_t));
    c->ucx_leases = NULL;
    c->n_ucx_leases = c->cap_ucx_leases = 0;
}

/* Closes lease's write windows, if it has any. */
static void ucx_lease_close(kvd_server_t *s, conn_t *c, uint64_t lease)
{
    for (size_t i = 0; i < c->n_ucx_leases; i++)
        if (c->ucx_leases[i] == lease) {
            kvd_ucxd_window_close(s->ucxd, c->ucx_gen, c->ucx_cap, lease);
            c->ucx_leases[i] = c->ucx_leases[--c->n_ucx_leases];
            return;
        }
}

/* Before a Publish or Revoke is served: its lease's windows close,
 * whatever its outcome (its writer has finished its copies when it asks),
 * so the close is in the UCX server's socket before the objects turn
 * READY. */
static void ucx_windows_finish(kvd_server_t *s, conn_t *c, const kvd_msg_t *req)
{
    if (c->ucx_granted &&
        (req->method == KVD_METHOD_PUBLISH || req->method == KVD_METHOD_REVOKE))
        ucx_lease_close(s, c, req->body.finish_req.lease_id);
}

/*
 * The UCX write windows of a Reserve reply about to be queued: its
 * allocated extents become writable through the connection's UCX grant
 * (the windows are in the UCX server's socket before the reply is
 * queued). Where they cannot be opened, the Reserve is undone and answered
 * BUSY: a reservation its writer cannot write is of no use to it.
 */
static void ucx_windows(kvd_server_t *s, conn_t *c, const kvd_msg_t *req, kvd_msg_t *rep)
{
    if (!c->ucx_granted)
        return;
    const kvd_reserve_rep_t *r = &rep->body.reserve_rep;
    if (req->method != KVD_METHOD_RESERVE || rep->status != KVD_OK || r->lease_id == 0)
        return;
    size_t n = 0;
    for (size_t i = 0; i < r->n; i++)
        n += r->results[i] == KVD_RESERVE_ALLOCATED;
    kvd_ucx_range_t *ranges = kvd_mem_calloc(KVD_MEM_OTHER, n + 1, sizeof(*ranges));
    int rc = ranges != NULL ? KVD_OK : KVD_ERR_NOMEM;
    if (rc == KVD_OK && c->n_ucx_leases == c->cap_ucx_leases) {
        size_t cap = KVD_MAX(2 * c->cap_ucx_leases, (size_t)16);
        uint64_t *l = kvd_mem_realloc(KVD_MEM_OTHER, c->ucx_leases,
                                      c->cap_ucx_leases * sizeof(*l), cap * sizeof(*l));
        if (l != NULL) {
            c->ucx_leases = l;
            c->cap_ucx_leases = cap;
        } else {
            rc = KVD_ERR_NOMEM;
        }
    }
    if (rc == KVD_OK) {
        for (size_t i = 0, k = 0; i < r->n; i++)
            if (r->results[i] == KVD_RESERVE_ALLOCATED)
                ranges[k++] = (kvd_ucx_range_t){r->offsets[i], r->object_bytes};
        c->ucx_leases[c->n_ucx_leases++] = r->lease_id;
        rc =
            kvd_ucxd_window_open(s->ucxd, c->ucx_gen, c->ucx_cap, r->lease_id, ranges, n);
    }
    kvd_mem_free(KVD_MEM_OTHER, ranges, (n + 1) * sizeof(*ranges));
    if (rc == KVD_OK)
        return;
    uint64_t lease = r->lease_id;
    ucx_lease_close(s, c, lease);
    kvd_store_revoke(s->store, c->id, lease, NULL, 0);
    kvd_msg_clear(rep);
    kvd_msg_error(rep, req->id, req->method, KVD_ERR_BUSY,
                  "the UCX server cannot take this reservation's write windows now (%s); "
                  "try again in a second",
                  kvd_status_str(rc));
}

/* After leases expired: the windows of those that did are closed. */
static void ucx_windows_expired(kvd_server_t *s)
{
    for (conn_t *c = s->conns; c != NULL; c = c->next)
        for (size_t i = 0; i < c->n_ucx_leases;) {
            uint64_t lease = c->ucx_leases[i];
            if (kvd_store_lease_live(s->store, c->id, lease)) {
                i++;
                continue;
            }
            kvd_ucxd_window_close(s->ucxd, c->ucx_gen, c->ucx_cap, lease);
            c->ucx_leases[i] = c->ucx_leases[--c->n_ucx_leases];
        }
}

/*
 * An Acquire held while its objects come into the pool (read from the SSD
 * tier, fetched from another member) instead of an in-progress reply the
 * client would have to ask again after a pause it must guess: it is served
 * again whenever something that may end it completed, and answered when
 * it is no longer in progress or at its deadline (in progress then: the
 * client asks again). Nothing is pinned while it waits.
 */
typedef struct acq_wait {
    uint64_t t0;          /* when its first serve began (its counters) */
    uint64_t deadline_ns; /* the client's wait_ms, at most KVD_ACQUIRE_WAIT_MAX_MS */
    uint32_t probe;       /* a key the last serve found still coming; n: none known */
    size_t bytes;         /* what it holds: this and the copy's keys */
    kvd_msg_t req;        /* a copy; its arena holds the keys */
    struct acq_wait *next;
} acq_wait_t;

/* Bounds of the held Acquires besides KVD_ACQUIRE_WAIT_MAX_MS (a client
 * that waits longer asks again): how many one connection may have held
 * (one per load batch piece in flight is the linker's use), and the bytes
 * of all the copies (16 MiB: 128 requests of 4,096 keys); past a bound the
 * Acquire answers in progress at once, as when the client asks no wait. */
#define ACQ_WAITS_PER_CONN 64u
#define ACQ_WAIT_BYTES_MAX (16ull << 20)
/* A held Acquire is served again at least this often: a key its holder is
 * promoting is asked for again after remote.c's 20 ms, which no event
 * announces. */
#define ACQ_RESERVE_MS 20u

static void acq_wait_free(kvd_server_t *s, acq_wait_t *w)
{
    s->n_acq_waits--;
    s->acq_wait_bytes -= w->bytes;
    kvd_msg_clear(&w->req);
    kvd_mem_free(KVD_MEM_OTHER, w, sizeof(*w));
}

/* A closing connection's held Acquires go unanswered: nothing was pinned. */
static void acq_waits_drop(kvd_server_t *s, conn_t *c)
{
    while (c->acq_waits != NULL) {
        acq_wait_t *w = c->acq_waits;
        c->acq_waits = w->next;
        acq_wait_free(s, w);
    }
    c->n_acq_waits = 0;
}

static void conn_close(kvd_server_t *s, conn_t *c, const char *why)
{
    KVD_DEBUG("server", "connection %llu closed: %s", (unsigned long long)c->id, why);
    size_t undone = kvd_store_owner_gone(s->store, c->id);
    if (undone > 0)
        KVD_INFO("server",
                 "connection %llu closed (%s) holding %zu leases: their "
                 "reservations were revoked and pins released",
                 (unsigned long long)c->id, why, undone);
    if (c->ucx_granted) /* its capability dies with it, and its windows */
        kvd_ucxd_revoke(s->ucxd, c->ucx_gen, c->ucx_cap);
    c->ucx_granted = false;
    ucx_leases_forget(c);
    acq_waits_drop(s, c);
    epoll_ctl(s->epfd, EPOLL_CTL_DEL, c->src.fd, NULL);
    close(c->src.fd);
    kvd_framer_free(&c->in);
    kvd_buf_free(&c->out);
    conn_account(s, c);
    if (c->prev)
        c->prev->next = c->next;
    else
        s->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    atomic_fetch_sub(&s->counters.connections_current, 1);
    /* later events of the same epoll batch may still point at c */
    c->dead = true;
    c->next = s->dead;
    s->dead = c;
}

static void free_dead(kvd_server_t *s)
{
    while (s->dead) {
        conn_t *c = s->dead;
        s->dead = c->next;
        kvd_mem_free(KVD_MEM_CONN, c, sizeof(*c));
    }
}

/* Watches for input while the connection may send more and its output is
 * below the high-water mark, and for output while any is queued. */
static void conn_update_events(kvd_server_t *s, conn_t *c)
{
    uint32_t want = 0;
    if (!c->closing && c->out.len < OUT_HIGH_WATER &&
        !(c->out.len > 0 && conn_buffers_full(s)))
        want |= EPOLLIN;
    if (c->out.len > 0)
        want |= EPOLLOUT;
    /* the frame timeout runs while the client can send: from when a frame
     * began arriving, or from when reading resumed with one unfinished */
    if (!kvd_framer_partial(&c->in))
        c->frame_since_ns = 0;
    else if (c->frame_since_ns == 0 || ((want & EPOLLIN) && !(c->events & EPOLLIN)))
        c->frame_since_ns = kvd_now_ns();
    if (want != c->events) {
        c->events = want;
        watch(s, &c->src, want, EPOLL_CTL_MOD);
    }
}

/* The largest reply: --max-frame, but never below the default (a Stats
 * reply must always fit). */
static size_t reply_max(const kvd_server_t *s)
{
    return KVD_MAX(s->opts.max_frame_bytes, (uint64_t)KVD_FRAME_DEFAULT_MAX);
}

/* Queues one reply; a reply that cannot be packed becomes an error reply.
 * A Hello reply that promises the pool's descriptor marks where it rides. */
static void conn_reply(kvd_server_t *s, conn_t *c, const kvd_msg_t *rep)
{
    size_t before = c->out.len;
    if (rep->method == KVD_METHOD_HELLO && rep->status == KVD_OK &&
        rep->body.hello_rep.pool_fd_attached)
        c->fd_at = before;
    int rc = kvd_msg_pack(rep, reply_max(s), &c->out);
    if (rc != KVD_OK) {
        c->out.len = before;
        if (c->fd_at == before)
            c->fd_at = SIZE_MAX;
        kvd_msg_t err;
        kvd_msg_error(&err, rep->id, rep->method, rc,
                      rc == KVD_ERR_TOO_LARGE
                          ? "the reply would be over %zu bytes: ask for less"
                          : "the reply could not be encoded (%zu)",
                      reply_max(s));
        if (kvd_msg_pack(&err, KVD_FRAME_LIMIT_MAX, &c->out) != KVD_OK) {
            c->out.len = before;
            c->closing = true; /* out of memory: nothing sensible left to say */
        }
    }
    conn_account(s, c);
}

/* Sends an error reply and marks the connection for closing. */
static void conn_fail(kvd_server_t *s, conn_t *c, uint64_t id, kvd_method_t method,
                      int status, const char *what)
{
    atomic_fetch_add(&s->counters.protocol_errors, 1);
    KVD_WARN("server", "connection %llu: %s; closing it", (unsigned long long)c->id,
             what);
    kvd_msg_t rep;
    kvd_msg_error(&rep, id, method, status, "%s", what);
    conn_reply(s, c, &rep);
    c->closing = true;
}

/*
 * Refuses a request for want of a credential: counts it, logs it (a burst
 * of AUTH_LOG_BURST lines a minute, then a count of those left out; who the
 * peer is, never what it sent), replies KVD_ERR_AUTH and closes.
 */
#define AUTH_LOG_BURST     10
#define AUTH_LOG_WINDOW_NS (60ull * 1000000000ull)

static void auth_refuse(kvd_server_t *s, conn_t *c, const kvd_msg_t *req, kvd_msg_t *rep,
                        const char *why)
{
    atomic_fetch_add(&s->counters.auth_failures, 1);
    uint64_t skipped = 0;
    if (kvd_ratelimit_allow(&s->auth_log, kvd_now_ns(), AUTH_LOG_BURST,
                            AUTH_LOG_WINDOW_NS, &skipped)) {
        char peer[96] = "unix";
        if (c->tcp) {
            struct sockaddr_storage sa;
            socklen_t len = sizeof(sa);
            char host[64] = "?", port[8] = "?";
            if (getpeername(c->src.fd, (struct sockaddr *)&sa, &len) == 0)
                getnameinfo((struct sockaddr *)&sa, len, host, sizeof(host), port,
                            sizeof(port), NI_NUMERICHOST | NI_NUMERICSERV);
            snprintf(peer, sizeof(peer), "tcp %s port %s", host, port);
        } else {
            struct ucred cr;
            socklen_t len = sizeof(cr);
            if (getsockopt(c->src.fd, SOL_SOCKET, SO_PEERCRED, &cr, &len) == 0)
                snprintf(peer, sizeof(peer), "unix uid %u gid %u pid %d",
                         (unsigned)cr.uid, (unsigned)cr.gid, (int)cr.pid);
        }
        KVD_WARN("server", "connection %llu (%s): %s refused: %s; closing it",
                 (unsigned long long)c->id, peer, kvd_method_name(req->method), why);
        if (skipped > 0)
            KVD_WARN("server", "%llu more refusals were not logged",
                     (unsigned long long)skipped);
    }
    kvd_msg_error(rep, req->id, req->method, KVD_ERR_AUTH, "%s", why);
    c->closing = true;
}

/*
 * Checks the Hello's credential (auth.h) and sets *ctx to whom it maps:
 * the connection's tenant and role, narrowed to read-only when the Hello
 * asks. A later Hello on the same connection must map to the same tenant
 * and role; it may narrow, never widen. Returns false after auth_refuse.
 */
static bool hello_auth(kvd_server_t *s, conn_t *c, const kvd_msg_t *req, kvd_msg_t *rep,
                       kvd_rpc_ctx_t *ctx)
{
    const kvd_hello_req_t *h = &req->body.hello_req;
    kvd_auth_peer_t peer = {.tcp = c->tcp};
    kvd_writer_t writer = {.token = h->writer_token}; /* pid 0: none known */
    gid_t groups_small[64];
    gid_t *groups = groups_small;
    size_t groups_bytes = 0;
    if (!c->tcp) {
        struct ucred cr;
        socklen_t len = sizeof(cr);
        if (getsockopt(c->src.fd, SOL_SOCKET, SO_PEERCRED, &cr, &len) == 0) {
            peer.has_cred = true;
            peer.uid = cr.uid;
            peer.gid = cr.gid;
            writer.pid = cr.pid > 0 ? (uint32_t)cr.pid : 0;
        }
        /* the supplementary groups, as the kernel saw them at connect() */
        socklen_t glen = sizeof(groups_small);
        int rc = getsockopt(c->src.fd, SOL_SOCKET, SO_PEERGROUPS, groups, &glen);
        if (rc != 0 && errno == ERANGE && glen > 0) {
            groups_bytes = glen;
            groups = kvd_mem_calloc(KVD_MEM_CONN, 1, groups_bytes);
            rc = groups ? getsockopt(c->src.fd, SOL_SOCKET, SO_PEERGROUPS, groups, &glen)
                        : -1;
        }
        if (rc == 0 && groups) {
            peer.groups = groups;
            peer.n_groups = glen / sizeof(gid_t);
        }
    }
    kvd_auth_grant_t g;
    const char *why = NULL;
    int rc = kvd_auth_check(s->auth, &peer, h->auth_token, h->auth_token_len, &g, &why);
    if (groups != NULL && groups != groups_small)
        kvd_mem_free(KVD_MEM_CONN, groups, groups_bytes);
    if (rc != KVD_OK) {
        auth_refuse(s, c, req, rep, why);
        return false;
    }
    if (c->authed && (g.tenant != c->ctx.tenant || g.is_operator != c->ctx.is_operator)) {
        auth_refuse(s, c, req, rep,
                    "a second Hello with another credential than the first one");
        return false;
    }
    *ctx = (kvd_rpc_ctx_t){.conn_id = c->id,
                           .tenant = g.tenant,
                           .is_operator = g.is_operator,
                           .is_peer = g.is_peer,
                           .read_only = g.read_only || h->read_only ||
                                        (c->authed && c->ctx.read_only)};
    /* the writer is one process for its life: pid and start time (a pid
     * from another pid namespace reads 0, and its /proc entry is not ours) */
    if (writer.pid != 0 &&
        kvd_proc_start_ticks((int)writer.pid, &writer.start_ticks) == KVD_OK)
        ctx->writer = writer;
    return true;
}

/*
 * The UCX part of a Hello reply (want_ucx, once everything else of the
 * Hello succeeded): a capability granted to the UCX server for this
 * connection (the whole pool for now; read-only when the connection is),
 * which is in the server's control socket before this reply is queued, so
 * the client can never use it too early; the worker's address; and the
 * rkey and pool base only where the server offers one-sided RMA (over TCP
 * it does not: see ucxd.h). A second Hello replaces the first's grant.
 */
static void hello_ucx(kvd_server_t *s, conn_t *c, const kvd_msg_t *req, kvd_msg_t *rep)
{
    const kvd_hello_req_t *h = &req->body.hello_req;
    kvd_hello_rep_t *r = &rep->body.hello_rep;
    if (c->ucx_granted)
        kvd_ucxd_revoke(s->ucxd, c->ucx_gen, c->ucx_cap);
    c->ucx_granted = false;
    /* the windows went with the old capability: the leases they were for
     * are written no more through UCX (a linker that says Hello again
     * abandons its copies in flight) */
    ucx_leases_forget(c);
    bool read_only = c->ctx.read_only || h->read_only;
    int rc = kvd_ucxd_grant(s->ucxd, c->id, read_only, 0, kvd_pool_size(s->pool),
                            c->ucx_cap, &c->ucx_gen);
    if (rc != KVD_OK) {
        kvd_msg_error(rep, req->id, req->method, KVD_ERR_BUSY,
                      "the UCX server cannot take this connection's grant now (%s); "
                      "try again in a second",
                      kvd_status_str(rc));
        return;
    }
    c->ucx_granted = true;
    memcpy(r->ucx_token, c->ucx_cap, sizeof(c->ucx_cap));
    r->ucx_token_len = sizeof(c->ucx_cap);
    kvd_ucxd_peer(s->ucxd, &r->ucx_address, &r->ucx_address_len, &r->ucx_rkey,
                  &r->ucx_rkey_len, &r->ucx_pool_base);
}

/* Why a UCX Hello is refused when the UCX server serves nothing: which
 * transports it left out, and the flag that would serve TCP (and what
 * that costs), into text. */
static const char *ucx_refusal_text(const kvd_server_t *s, const char *refused,
                                    char text[KVD_ERROR_MAX])
{
    if (s->opts.ucx_tcp)
        snprintf(text, KVD_ERROR_MAX,
                 "the UCX server may serve on none of %.100s (not even with --ucx-tcp: "
                 "UCX's shared-memory transports are never served)",
                 refused);
    else
        snprintf(text, KVD_ERROR_MAX,
                 "UCX is not served without kvdockd --ucx-tcp: here it would serve on "
                 "%.60s only (any host that reaches the UCX TCP port can write into the "
                 "UCX server process)",
                 refused);
    return text;
}

static void serve_hello(kvd_server_t *s, conn_t *c, const kvd_msg_t *req, kvd_msg_t *rep)
{
    const kvd_hello_req_t *h = &req->body.hello_req;
    if (h->protocol_version != KVD_PROTOCOL_VERSION) {
        kvd_msg_error(rep, req->id, req->method, KVD_ERR_UNSUPPORTED,
                      "protocol version %u is not supported; this daemon speaks %d",
                      h->protocol_version, KVD_PROTOCOL_VERSION);
        c->closing = true;
        return;
    }
    /* the credential before anything else of the Hello (UCX included) */
    kvd_rpc_ctx_t ctx;
    if (!hello_auth(s, c, req, rep, &ctx))
        return;
    /* a later Hello that narrows to read-only takes back a writable UCX
     * grant at once, also when it does not ask for UCX again (a pool fd
     * already sent cannot be taken back: doc/TRUST.md) */
    if (ctx.read_only && !c->ctx.read_only && c->ucx_granted && !h->want_ucx) {
        kvd_ucxd_revoke(s->ucxd, c->ucx_gen, c->ucx_cap);
        c->ucx_granted = false;
        ucx_leases_forget(c);
    }
    if (h->want_ucx && !kvd_ucxd_up(s->ucxd)) {
        const char *refused =
            s->ucx_refused[0] ? s->ucx_refused : kvd_ucxd_refused(s->ucxd);
        char text[KVD_ERROR_MAX];
        if (refused != NULL)
            kvd_msg_error(rep, req->id, req->method, KVD_ERR_UNSUPPORTED, "%s",
                          ucx_refusal_text(s, refused, text));
        else if (s->ucxd != NULL)
            kvd_msg_error(rep, req->id, req->method, KVD_ERR_BUSY,
                          "the UCX server is restarting; try again in a second");
        else
            kvd_msg_error(rep, req->id, req->method, KVD_ERR_UNSUPPORTED,
                          "this daemon does not serve UCX (--ucx %s%s)", s->opts.ucx,
                          strcmp(s->opts.ucx, "off") ? ", and UCX did not start" : "");
        return;
    }
    if (h->n_namespaces > s->opts.max_batch) {
        kvd_msg_error(rep, req->id, req->method, KVD_ERR_TOO_LARGE,
                      "%zu namespaces in one Hello is over --max-batch", h->n_namespaces);
        return;
    }
    uint32_t *ids = kvd_msg_alloc(rep, h->n_namespaces * sizeof(uint32_t) + 1);
    if (ids == NULL) {
        kvd_msg_error(rep, req->id, req->method, KVD_ERR_NOMEM, "out of memory");
        return;
    }
    int rc =
        kvd_rpc_register(s->store, &ctx, h->namespaces, h->n_namespaces, ids, req, rep);
    if (rc != KVD_OK)
        return;
    /* held extents of this writer's earlier connections (kvd_store.h
     * kvd_writer_t): only a connection's first Hello speaks for them */
    if (h->earlier_copies_over && !c->authed && ctx.writer.pid != 0) {
        uint64_t freed = kvd_store_writer_done(s->store, &ctx.writer, c->id);
        if (freed > 0)
            KVD_INFO(
                "server",
                "connection %llu: pid %u says its earlier copies are over: %llu held "
                "bytes are free",
                (unsigned long long)c->id, ctx.writer.pid, (unsigned long long)freed);
    }
    c->ctx = ctx;
    c->authed = true;
    c->in.max_frame = s->opts.max_frame_bytes;
    const char *tenant = kvd_store_tenant_name(s->store, ctx.tenant);
    char name[KVD_ESCAPED_MAX(KVD_NAME_MAX)];
    KVD_INFO("server",
             "connection %llu: hello from '%s' pid %u%s, %zu namespaces, tenant %s%s%s",
             (unsigned long long)c->id,
             kvd_escape(name, sizeof(name), h->client_name, strlen(h->client_name)),
             h->pid, c->tcp ? " over tcp" : "", h->n_namespaces, tenant ? tenant : "?",
             ctx.is_operator ? " (operator)" : "", ctx.read_only ? " read-only" : "");
    kvd_hello_rep_t *r = &rep->body.hello_rep;
    r->n_ns_ids = h->n_namespaces;
    r->ns_ids = ids;
    r->lease_ttl_ms = s->opts.lease_ttl_ms;
    /* the pool's descriptor can only cross a Unix socket, and rides one
     * reply at a time (a second pipelined Hello gets none) */
    r->pool_fd_attached = h->want_pool_fd && !c->tcp && c->fd_at == SIZE_MAX;
    kvd_strlcpy(r->daemon_version, KVD_VERSION, sizeof(r->daemon_version));
    kvd_strlcpy(r->instance, s->opts.instance, sizeof(r->instance));
    kvd_strlcpy(r->tenant, tenant ? tenant : "", sizeof(r->tenant));
    r->read_only = ctx.read_only;
    r->protocol_version = KVD_PROTOCOL_VERSION;
    r->max_frame_bytes = (uint32_t)s->opts.max_frame_bytes;
    r->max_batch = (uint32_t)s->opts.max_batch;
    r->pool_bytes = kvd_pool_size(s->pool);
    r->connection_id = c->id;
    if (h->want_ucx)
        hello_ucx(s, c, req, rep);
    c->hello_done = true;
}

/* Hands the metrics endpoint a snapshot of Stats and the namespace table:
 * on every tick and when the health changes. Out of memory, it keeps
 * serving the previous one. */
static void metrics_publish(kvd_server_t *s)
{
    if (s->metrics == NULL)
        return;
    kvd_msg_t *snap = kvd_mem_calloc(KVD_MEM_OTHER, 1, sizeof(*snap));
    if (snap == NULL)
        return;
    kvd_stats_rep_t *st = &snap->body.stats_rep;
    server_stats(s, st);
    if (kvd_rpc_ns_table(s->store, NULL, snap, &st->namespaces, &st->n_namespaces) !=
            KVD_OK ||
        kvd_rpc_tenant_table(s->store, NULL, snap, &st->tenants, &st->n_tenants) !=
            KVD_OK) {
        kvd_msg_clear(snap);
        kvd_mem_free(KVD_MEM_OTHER, snap, sizeof(*snap));
        return;
    }
    kvd_metrics_publish(s->metrics, snap);
}

/* The checks' time may run this far ahead of the 1 % it is allowed: a
 * check or a few as short as any request pass at once. */
#define CHECK_FREE_NS  10000000ull
#define CHECK_DUTY_MAX 100 /* the checks' time at most 1/100 of the loop's */

/* The checks' time not yet paid off now: each nanosecond of check is paid
 * by CHECK_DUTY_MAX - 1 nanoseconds without one. */
static uint64_t check_debt(const kvd_server_t *s, uint64_t now)
{
    uint64_t paid = (now - s->check_at_ns) / (CHECK_DUTY_MAX - 1);
    return s->check_debt_ns > paid ? s->check_debt_ns - paid : 0;
}

/* May this connection's Stats run the invariant check now? Fills rep with
 * the refusal when not: the check is an operator's (it reads every
 * tenant's records), and it waits while the checks' debt is over
 * CHECK_FREE_NS. */
static bool check_allowed(kvd_server_t *s, const conn_t *c, const kvd_msg_t *req,
                          kvd_msg_t *rep)
{
    if (!c->ctx.is_operator) {
        kvd_msg_error(rep, req->id, req->method, KVD_ERR_PERMISSION,
                      "the invariant check reads every tenant's records while the "
                      "daemon waits: it needs an operator's credential");
        return false;
    }
    uint64_t now = kvd_now_ns(), debt = check_debt(s, now);
    if (debt >= CHECK_FREE_NS) {
        uint64_t wait_ns = (debt - CHECK_FREE_NS + 1) * (CHECK_DUTY_MAX - 1);
        kvd_msg_error(rep, req->id, req->method, KVD_ERR_BUSY,
                      "the last invariant check held the daemon %.1f ms; so that checks "
                      "take at most 1%% of its time, the next may run in %llu ms",
                      (double)s->check_took_ns / 1e6,
                      (unsigned long long)(wait_ns / 1000000 + 1));
        return false;
    }
    return true;
}

static void serve_stats(kvd_server_t *s, const conn_t *c, const kvd_msg_t *req,
                        kvd_msg_t *rep)
{
    if (req->body.stats_req.check && !check_allowed(s, c, req, rep))
        return;
    kvd_stats_rep_t *st = &rep->body.stats_rep;
    server_stats(s, st);
    /* a tenant's connection sees its own namespaces; an operator all */
    int rc = kvd_rpc_ns_table(s->store, &c->ctx, rep, &st->namespaces, &st->n_namespaces);
    if (rc == KVD_OK)
        rc = kvd_rpc_tenant_table(s->store, &c->ctx, rep, &st->tenants, &st->n_tenants);
    if (rc == KVD_OK)
        rc = kvd_nics_to_msg(&s->nics, rep, &st->nics, &st->n_nics);
    if (rc != KVD_OK) {
        kvd_msg_clear(rep); /* its arena: kvd_msg_error forgets it */
        kvd_msg_error(rep, req->id, req->method, rc, "out of memory");
        return;
    }
    if (req->body.stats_req.check) {
        uint64_t t0 = kvd_now_ns();
        st->checked = true;
        kvd_store_check(s->store, st->check_error, sizeof(st->check_error));
        uint64_t t1 = kvd_now_ns();
        s->check_took_ns = t1 - t0;
        st->check_us = s->check_took_ns / 1000;
        s->check_debt_ns = check_debt(s, t1) + s->check_took_ns;
        s->check_at_ns = t1;
    }
}

/* The cluster as this daemon sees it: a fresh copy of the view (the
 * heartbeat ages are as of now). */
static void serve_cluster(kvd_server_t *s, const kvd_msg_t *req, kvd_msg_t *rep)
{
    kvd_cluster_rep_t *r = &rep->body.cluster_rep;
    if (s->cluster == NULL) {
        r->state = KVD_CLUSTER_OFF;
        kvd_strlcpy(r->etcd, "no cluster: kvdockd runs without --cluster-etcd",
                    sizeof(r->etcd));
        return;
    }
    kvd_cluster_view_t v;
    if (kvd_cluster_view(s->cluster, &v) != KVD_OK) {
        kvd_msg_error(rep, req->id, req->method, KVD_ERR_NOMEM, "out of memory");
        return;
    }
    r->state = v.state;
    r->epoch = v.epoch;
    kvd_strlcpy(r->node_id, s->opts.node_id, sizeof(r->node_id));
    kvd_strlcpy(r->etcd, v.etcd, sizeof(r->etcd));
    r->members = kvd_msg_alloc(rep, v.n * sizeof(*r->members) + 1);
    if (r->members == NULL) {
        kvd_cluster_view_free(&v);
        kvd_msg_error(rep, req->id, req->method, KVD_ERR_NOMEM, "out of memory");
        return;
    }
    if (v.n > 0)
        memcpy(r->members, v.members, v.n * sizeof(*r->members));
    r->n_members = v.n;
    kvd_cluster_view_free(&v);
    kvd_dirsvc_counters(s->dirsvc, &r->counters);
    kvd_remote_stats_t rs;
    kvd_remote_stats(s->remote, &rs);
    r->counters.fetches = rs.fetches;
    r->counters.fetched_objects = rs.fetched;
    r->counters.fetched_bytes = rs.fetched_bytes;
    r->counters.fetched_ucx_objects = rs.fetched_ucx;
    r->counters.fetched_ucx_bytes = kvd_peers_ucx_bytes(s->peers);
    r->counters.fetch_failures = rs.failed;
    r->counters.served_objects = rs.served;
    r->counters.served_bytes = rs.served_bytes;
}

/* The cluster's thread says the view changed: take the new one. */
static void on_cluster(kvd_server_t *s)
{
    kvd_cluster_ack(s->cluster);
    kvd_cluster_view_t v;
    if (kvd_cluster_view(s->cluster, &v) != KVD_OK)
        return; /* the old view stays until the next change */
    bool changed = v.state != s->view.state || v.members_gen != s->view.members_gen ||
                   s->view.version == 0;
    kvd_cluster_view_free(&s->view);
    s->view = v;
    if (changed) /* the directory cares for members and state, not heartbeats */
        kvd_dirsvc_view(s->dirsvc, &s->view);
}

static void conn_flush(kvd_server_t *s, conn_t *c);

/* A routed DirLookup waiting for the owners' answers: the connection (by
 * id: it may be gone by then) and the request it answers. */
typedef struct deferred {
    kvd_server_t *s;
    uint64_t conn_id;
    uint64_t req_id;
    uint64_t t0;
} deferred_t;

static conn_t *conn_by_id(kvd_server_t *s, uint64_t id)
{
    for (conn_t *c = s->conns; c != NULL; c = c->next)
        if (c->id == id && !c->dead)
            return c;
    return NULL;
}

static void routed_done(void *arg, kvd_msg_t *rep)
{
    deferred_t *d = arg;
    kvd_server_t *s = d->s;
    conn_t *c = conn_by_id(s, d->conn_id);
    if (c != NULL) {
        rep->id = d->req_id;
        rep->method = KVD_METHOD_DIR_LOOKUP;
        rep->reply = true;
        conn_reply(s, c, rep);
        conn_flush(s, c);
    }
    kvd_counters_record(&s->counters, KVD_METHOD_DIR_LOOKUP, rep->status != KVD_OK,
                        kvd_now_ns() - d->t0);
    kvd_mem_free(KVD_MEM_OTHER, d, sizeof(*d));
}

/* ---- a worker's Lookup and Acquire across the cluster */

/* A Lookup that the local store could not answer in full, waiting for
 * the directory: its connection, its request's pools (copied), the time
 * it began. */
typedef struct lookup_wait {
    kvd_server_t *s;
    uint64_t conn_id;
    uint64_t req_id;
    uint64_t t0;
    size_t n_pools;
    kvd_lookup_pool_t pools[KVD_LOOKUP_POOLS_MAX];
    kvd_msg_t keep; /* its arena holds the pools' keys */
} lookup_wait_t;

static void lookup_done(void *arg, kvd_msg_t *dir)
{
    lookup_wait_t *w = arg;
    kvd_server_t *s = w->s;
    kvd_msg_t rep = {0};
    rep.id = w->req_id;
    rep.method = KVD_METHOD_LOOKUP;
    rep.reply = true;
    const kvd_dir_lookup_rep_t *d =
        dir->status == KVD_OK ? &dir->body.dir_lookup_rep : NULL;
    size_t n_min = SIZE_MAX;
    for (size_t p = 0; p < w->n_pools; p++) {
        n_min = KVD_MIN(n_min, w->pools[p].n_keys);
        uint8_t *remote = kvd_msg_alloc(&w->keep, w->pools[p].n_keys + 1);
        for (size_t k = 0;
             remote && d && p < d->n && k < w->pools[p].n_keys && k < d->n_holders[p];
             k++) {
            uint64_t bits = d->holders[p][k];
            /* held by a member other than this daemon */
            for (size_t b = 0; b < d->n_nodes && !remote[k]; b++)
                remote[k] =
                    bits >> b & 1 && kvd_dirsvc_other_live(s->dirsvc, d->nodes[b]);
        }
        w->pools[p].remote = remote;
    }
    uint32_t *b = kvd_msg_alloc(&rep, n_min * sizeof(uint32_t) + 1);
    uint8_t *tiers = kvd_msg_alloc(&rep, n_min + 1);
    uint32_t *t32 = kvd_msg_alloc(&rep, n_min * sizeof(uint32_t) + 1);
    size_t nb = 0;
    int rc = b && tiers && t32
                 ? kvd_store_lookup_remote(s->store, w->pools, w->n_pools, b, tiers, &nb)
                 : KVD_ERR_NOMEM;
    if (rc != KVD_OK) {
        kvd_msg_clear(&rep);
        kvd_msg_error(&rep, w->req_id, KVD_METHOD_LOOKUP, rc, "lookup failed: %s",
                      kvd_status_str(rc));
    } else {
        bool any = false;
        for (size_t k = 0; k < nb; k++)
            any |= (t32[k] = tiers[k]) != KVD_TIER_DRAM;
        rep.body.lookup_rep.n = nb;
        rep.body.lookup_rep.boundaries = b;
        rep.body.lookup_rep.tiers = any ? t32 : NULL;
    }
    conn_t *c = conn_by_id(s, w->conn_id);
    if (c != NULL) {
        conn_reply(s, c, &rep);
        conn_flush(s, c);
    }
    kvd_counters_record(&s->counters, KVD_METHOD_LOOKUP, rep.status != KVD_OK,
                        kvd_now_ns() - w->t0);
    kvd_msg_clear(&rep);
    kvd_msg_clear(&w->keep);
    kvd_mem_free(KVD_MEM_OTHER, w, sizeof(*w));
}

/*
 * After the local store answered a worker's Lookup (rep): when the cluster
 * is ready and the answer does not reach the end of the keys, asks the
 * directory who holds them and answers with what local and remote objects
 * restore together (tier KVD_TIER_REMOTE where a boundary needs another
 * member; its Acquire then fetches them here). Returns true when the reply
 * is deferred.
 */
static bool lookup_cluster(kvd_server_t *s, conn_t *c, const kvd_msg_t *req,
                           const kvd_msg_t *rep, uint64_t t0)
{
    if (s->dirsvc == NULL || c->ctx.is_peer || rep->status != KVD_OK ||
        !kvd_dirsvc_ready(s->dirsvc))
        return false;
    const kvd_lookup_req_t *r = &req->body.lookup_req;
    size_t n_min = SIZE_MAX;
    for (size_t p = 0; p < r->n_pools; p++)
        n_min = KVD_MIN(n_min, r->pools[p].n_keys);
    const kvd_lookup_rep_t *lr = &rep->body.lookup_rep;
    if (n_min == 0 || (lr->n > 0 && lr->boundaries[lr->n - 1] == n_min))
        return false; /* everything restorable here already */
    lookup_wait_t *w = kvd_mem_calloc(KVD_MEM_OTHER, 1, sizeof(*w));
    kvd_msg_t q = {0};
    kvd_dir_keys_t *dk = kvd_msg_alloc(&q, r->n_pools * sizeof(*dk) + 1);
    bool ok = w != NULL && dk != NULL && r->n_pools <= KVD_LOOKUP_POOLS_MAX;
    for (size_t p = 0; ok && p < r->n_pools; p++) {
        kvd_ns_info_t info;
        const char *tenant = NULL;
        ok = kvd_store_ns_info(s->store, r->pools[p].ns, &info) == KVD_OK &&
             (tenant = kvd_store_tenant_name(s->store, info.tenant)) != NULL;
        kvd_key_t *keys =
            ok ? kvd_msg_alloc(&w->keep, r->pools[p].n_keys * sizeof(kvd_key_t) + 1)
               : NULL;
        ok = ok && keys != NULL;
        if (!ok)
            break;
        memcpy(keys, r->pools[p].keys, r->pools[p].n_keys * sizeof(kvd_key_t));
        w->pools[p] = (kvd_lookup_pool_t){.ns = r->pools[p].ns,
                                          .keys = (const uint8_t(*)[KVD_KEY_BYTES])keys,
                                          .n_keys = r->pools[p].n_keys,
                                          .trailing_pages = r->pools[p].trailing_pages};
        kvd_strlcpy(dk[p].tenant, tenant, sizeof(dk[p].tenant));
        kvd_strlcpy(dk[p].ns_name, info.name, sizeof(dk[p].ns_name));
        dk[p].added = keys;
        dk[p].n_added = r->pools[p].n_keys;
    }
    if (ok) {
        w->s = s;
        w->conn_id = c->id;
        w->req_id = req->id;
        w->t0 = t0;
        w->n_pools = r->n_pools;
        kvd_dir_lookup_req_t dq = {.n = r->n_pools, .queries = dk};
        ok = kvd_dirsvc_route(s->dirsvc, &dq, true, lookup_done, w) == KVD_OK;
    }
    kvd_msg_clear(&q);
    if (!ok && w != NULL) {
        kvd_msg_clear(&w->keep);
        kvd_mem_free(KVD_MEM_OTHER, w, sizeof(*w));
    }
    return ok; /* the local answer stands when the cluster cannot be asked */
}

/* Whether namespace ns is stored once per cluster (--cluster-once: a
 * rank-replicated one whose name matches a pattern). */
static bool stored_once(kvd_server_t *s, uint32_t ns, kvd_ns_info_t *info)
{
    if (s->opts.cluster_once[0] == '\0' ||
        kvd_store_ns_info(s->store, ns, info) != KVD_OK || !info->rank_replicated)
        return false;
    char pats[sizeof(s->opts.cluster_once)];
    kvd_strlcpy(pats, s->opts.cluster_once, sizeof(pats));
    char *save = NULL;
    for (char *p = strtok_r(pats, ",", &save); p != NULL; p = strtok_r(NULL, ",", &save))
        if (fnmatch(p, info->name, 0) == 0)
            return true;
    return false;
}

/* A Reserve of a namespace stored once per cluster, waiting for the
 * directory: who asked (its identity, copied: the connection may go), and
 * the request (copied). */
typedef struct reserve_wait {
    kvd_server_t *s;
    kvd_rpc_ctx_t ctx;
    uint64_t t0;
    kvd_msg_t req; /* a copy; its arena holds the items */
} reserve_wait_t;

static void reserve_done(void *arg, kvd_msg_t *dir)
{
    reserve_wait_t *w = arg;
    kvd_server_t *s = w->s;
    const kvd_reserve_req_t *r = &w->req.body.reserve_req;
    const kvd_dir_lookup_rep_t *d =
        dir->status == KVD_OK && dir->body.dir_lookup_rep.n == 1
            ? &dir->body.dir_lookup_rep
            : NULL;
    /* the keys no other member holds are reserved here; the others exist */
    bool *held = kvd_mem_calloc(KVD_MEM_OTHER, r->n + 1, sizeof(bool));
    kvd_msg_t sub = {0}, subrep = {0}, rep = {0};
    kvd_msg_request(&sub, w->req.id, KVD_METHOD_RESERVE);
    kvd_reserve_req_t *sr = &sub.body.reserve_req;
    *sr = (kvd_reserve_req_t){.ns = r->ns, .object_bytes = r->object_bytes};
    sr->items = kvd_msg_alloc(&sub, r->n * sizeof(*sr->items) + 1);
    for (size_t i = 0; held != NULL && sr->items != NULL && i < r->n; i++) {
        uint64_t bits = d && i < d->n_holders[0] ? d->holders[0][i] : 0;
        for (size_t b = 0; bits && b < d->n_nodes && !held[i]; b++) /* bits: d is set */
            held[i] = bits >> b & 1 && kvd_dirsvc_other_live(s->dirsvc, d->nodes[b]);
        if (!held[i])
            sr->items[sr->n++] = r->items[i];
    }
    conn_t *c = conn_by_id(s, w->ctx.conn_id);
    if (held == NULL || sr->items == NULL) {
        kvd_msg_error(&rep, w->req.id, KVD_METHOD_RESERVE, KVD_ERR_NOMEM,
                      "out of memory");
    } else if (c == NULL) {
        /* its writer is gone: nothing to reserve for it */
    } else {
        if (sr->n > 0)
            kvd_rpc_store_serve(s->store, &s->opts, &w->ctx, &sub, &subrep);
        const kvd_reserve_rep_t *sp = &subrep.body.reserve_rep;
        uint8_t *results = kvd_msg_alloc(&rep, r->n + 1);
        uint64_t *offsets = kvd_msg_alloc(&rep, r->n * sizeof(uint64_t) + 1);
        kvd_ns_info_t info = {0};
        kvd_store_ns_info(s->store, r->ns, &info);
        if (subrep.status != KVD_OK) {
            rep = subrep; /* its error, moved */
            memset(&subrep, 0, sizeof(subrep));
        } else if (results == NULL || offsets == NULL) {
            kvd_msg_clear(&rep);
            kvd_msg_error(&rep, w->req.id, KVD_METHOD_RESERVE, KVD_ERR_NOMEM,
                          "out of memory");
        } else {
            for (size_t i = 0, k = 0; i < r->n; i++) {
                results[i] = held[i] ? KVD_RESERVE_EXISTS : sp->results[k];
                offsets[i] = held[i] ? 0 : sp->offsets[k];
                k += !held[i];
            }
            rep.body.reserve_rep = (kvd_reserve_rep_t){.lease_id = sp->lease_id,
                                                       .object_bytes = info.object_bytes,
                                                       .n = r->n,
                                                       .results = results,
                                                       .offsets = offsets};
        }
        rep.id = w->req.id;
        rep.method = KVD_METHOD_RESERVE;
        rep.reply = true;
        ucx_windows(s, c, &w->req, &rep);
        conn_reply(s, c, &rep);
        conn_flush(s, c);
    }
    kvd_counters_record(&s->counters, KVD_METHOD_RESERVE, rep.status != KVD_OK,
                        kvd_now_ns() - w->t0);
    kvd_mem_free(KVD_MEM_OTHER, held, (r->n + 1) * sizeof(bool));
    kvd_msg_clear(&sub);
    kvd_msg_clear(&subrep);
    kvd_msg_clear(&rep);
    kvd_msg_clear(&w->req);
    kvd_mem_free(KVD_MEM_OTHER, w, sizeof(*w));
}

/*
 * A worker's Reserve in a namespace stored once per cluster: asks the
 * directory first, and answers EXISTS for keys another member holds (the
 * writer skips them; a load here fetches them). Returns true when the
 * reply is deferred; false to serve it locally as usual.
 */
static bool reserve_cluster(kvd_server_t *s, conn_t *c, const kvd_msg_t *req, uint64_t t0)
{
    const kvd_reserve_req_t *r = &req->body.reserve_req;
    kvd_ns_info_t info;
    if (s->dirsvc == NULL || c->ctx.is_peer || !kvd_dirsvc_ready(s->dirsvc) ||
        r->n == 0 || r->n > s->opts.max_batch || !stored_once(s, r->ns, &info))
        return false;
    const char *tenant = kvd_store_tenant_name(s->store, info.tenant);
    if (tenant == NULL || info.tenant != c->ctx.tenant)
        return false; /* the local path says what is wrong */
    reserve_wait_t *w = kvd_mem_calloc(KVD_MEM_OTHER, 1, sizeof(*w));
    if (w == NULL)
        return false;
    *w = (reserve_wait_t){.s = s, .ctx = c->ctx, .t0 = t0};
    kvd_msg_request(&w->req, req->id, KVD_METHOD_RESERVE);
    kvd_reserve_req_t *cr = &w->req.body.reserve_req;
    *cr = *r;
    cr->items = kvd_msg_alloc(&w->req, r->n * sizeof(*cr->items));
    kvd_key_t *keys = kvd_msg_alloc(&w->req, r->n * sizeof(kvd_key_t));
    if (cr->items == NULL || keys == NULL) {
        kvd_msg_clear(&w->req);
        kvd_mem_free(KVD_MEM_OTHER, w, sizeof(*w));
        return false;
    }
    memcpy(cr->items, r->items, r->n * sizeof(*cr->items));
    for (size_t i = 0; i < r->n; i++)
        memcpy(keys[i], r->items[i].key, KVD_KEY_BYTES);
    kvd_dir_keys_t q = {.n_added = r->n, .added = keys};
    kvd_strlcpy(q.tenant, tenant, sizeof(q.tenant));
    kvd_strlcpy(q.ns_name, info.name, sizeof(q.ns_name));
    kvd_dir_lookup_req_t dq = {.n = 1, .queries = &q};
    if (kvd_dirsvc_route(s->dirsvc, &dq, false, reserve_done, w) != KVD_OK) {
        kvd_msg_clear(&w->req);
        kvd_mem_free(KVD_MEM_OTHER, w, sizeof(*w));
        return false;
    }
    return true;
}

/* After the local store refused a worker's Acquire (rep): keys another
 * member holds are fetched here, and the Acquire answers KVD_INPROGRESS
 * (ask again) while they come. */
static void acquire_cluster(kvd_server_t *s, conn_t *c, const kvd_msg_t *req,
                            kvd_msg_t *rep)
{
    /* NOT_FOUND: missing here; BUSY: maybe a fetch of ours being written */
    if (s->remote == NULL || c->ctx.is_peer ||
        (rep->status != KVD_ERR_NOT_FOUND && rep->status != KVD_ERR_BUSY) ||
        !kvd_dirsvc_ready(s->dirsvc))
        return;
    const kvd_acquire_req_t *r = &req->body.acquire_req;
    int rc = kvd_remote_want(s->remote, r->ns, r->keys, r->n, kvd_now_ns() / 1000000);
    if (rc != KVD_INPROGRESS)
        return; /* nobody has them, or nothing of ours: the store's refusal stands */
    kvd_msg_clear(rep);
    kvd_msg_error(rep, req->id, req->method, KVD_INPROGRESS,
                  "acquire: keys held by other members of the cluster are being "
                  "fetched into this pool; nothing pinned, ask again");
}

/* The key index of an in-progress answer's error_index (1-based: the
 * store's refusal names the key), or n when it names none. */
static uint32_t acq_probe(uint32_t error_index, size_t n)
{
    return error_index > 0 && error_index <= n ? error_index - 1 : (uint32_t)n;
}

/* Whether the held Acquire w is sure to be in progress still: the key its
 * last serve named is here but not yet a READY object in DRAM (being
 * written by the fetch, or on the SSD tier). Saves serving all its keys
 * again on every completion of anything. */
static bool acq_still_coming(kvd_server_t *s, const acq_wait_t *w)
{
    const kvd_acquire_req_t *r = &w->req.body.acquire_req;
    kvd_obj_info_t info;
    if (w->probe >= r->n ||
        kvd_store_inspect(s->store, r->ns, r->keys[w->probe], &info) != KVD_OK)
        return false; /* not known, or not here at all: served to see */
    return info.state != KVD_OBJ_READY || info.tier != KVD_TIER_DRAM;
}

/* The next time w must be looked at: its deadline, or sooner. */
static void acq_next(kvd_server_t *s, const acq_wait_t *w, uint64_t now)
{
    uint64_t at = KVD_MIN(w->deadline_ns, now + ACQ_RESERVE_MS * 1000000ull);
    if (s->acq_next_ns == 0 || at < s->acq_next_ns)
        s->acq_next_ns = at;
}

/* Holds an Acquire that answered in progress (rep) when its client said it
 * would wait; true when held (the reply is then acquire_waits_run's).
 * probe: the key the store's own answer named (acq_probe). */
static bool acquire_park(kvd_server_t *s, conn_t *c, const kvd_msg_t *req,
                         const kvd_msg_t *rep, uint64_t t0, uint32_t probe)
{
    const kvd_acquire_req_t *r = &req->body.acquire_req;
    size_t bytes = sizeof(acq_wait_t) + r->n * sizeof(kvd_key_t);
    if (rep->status != KVD_INPROGRESS || r->wait_ms == 0 || s->draining ||
        c->n_acq_waits >= ACQ_WAITS_PER_CONN ||
        s->acq_wait_bytes + bytes > ACQ_WAIT_BYTES_MAX)
        return false;
    acq_wait_t *w = kvd_mem_calloc(KVD_MEM_OTHER, 1, sizeof(*w));
    if (w == NULL)
        return false;
    uint64_t wait_ms = KVD_MIN(r->wait_ms, KVD_ACQUIRE_WAIT_MAX_MS);
    *w = (acq_wait_t){.t0 = t0,
                      .deadline_ns = t0 + wait_ms * 1000000ull,
                      .probe = probe,
                      .bytes = bytes};
    kvd_msg_request(&w->req, req->id, KVD_METHOD_ACQUIRE);
    kvd_acquire_req_t *cr = &w->req.body.acquire_req;
    *cr = *r;
    cr->keys = kvd_msg_alloc(&w->req, r->n * sizeof(kvd_key_t) + 1);
    if (cr->keys == NULL) {
        kvd_msg_clear(&w->req);
        kvd_mem_free(KVD_MEM_OTHER, w, sizeof(*w));
        return false;
    }
    memcpy(cr->keys, r->keys, r->n * sizeof(kvd_key_t));
    acq_wait_t **tail = &c->acq_waits;
    while (*tail != NULL)
        tail = &(*tail)->next;
    *tail = w;
    c->n_acq_waits++;
    s->n_acq_waits++;
    s->acq_waits_total++;
    s->acq_wait_bytes += bytes;
    acq_next(s, w, kvd_now_ns());
    return true;
}

/*
 * Serves the held Acquires again, when something that may end one
 * completed since (acq_kick: the tier's or the peers' completions, the
 * tick, a drain) or ACQ_RESERVE_MS passed or one's deadline came: each
 * still in progress before its deadline stays held; every other is
 * answered with what its serve gave (a lease, or in progress at its
 * deadline, or the store's refusal), or, once the daemon is no longer
 * ready (draining), with the refusal a new Acquire would get.
 */
static void acquire_waits_run(kvd_server_t *s)
{
    uint64_t now = kvd_now_ns();
    if (s->n_acq_waits == 0 || (!s->acq_kick && now < s->acq_next_ns))
        return;
    s->acq_kick = false;
    s->acq_next_ns = 0;
    for (conn_t *c = s->conns, *next; c != NULL; c = next) {
        next = c->next;
        if (c->acq_waits == NULL)
            continue;
        bool replied = false;
        for (acq_wait_t **at = &c->acq_waits; *at != NULL;) {
            acq_wait_t *w = *at;
            bool ready = server_health(s) == KVD_HEALTH_READY;
            if (ready && now < w->deadline_ns && acq_still_coming(s, w)) {
                acq_next(s, w, now);
                at = &w->next;
                continue;
            }
            kvd_msg_t rep = {0};
            rep.id = w->req.id;
            rep.method = KVD_METHOD_ACQUIRE;
            rep.reply = true;
            if (!ready) {
                kvd_msg_error(&rep, w->req.id, KVD_METHOD_ACQUIRE,
                              s->draining ? KVD_ERR_DRAINING : KVD_ERR_UNAVAILABLE,
                              "the daemon is %s; retry when it is ready",
                              kvd_health_name(server_health(s)));
            } else {
                kvd_rpc_store_serve(s->store, &s->opts, &c->ctx, &w->req, &rep);
                uint32_t probe = acq_probe(rep.error_index, w->req.body.acquire_req.n);
                acquire_cluster(s, c, &w->req, &rep);
                if (rep.status == KVD_INPROGRESS && now < w->deadline_ns) {
                    kvd_msg_clear(&rep);
                    w->probe = probe;
                    acq_next(s, w, now);
                    at = &w->next;
                    continue;
                }
            }
            conn_reply(s, c, &rep);
            kvd_counters_record(&s->counters, KVD_METHOD_ACQUIRE, rep.status != KVD_OK,
                                now - w->t0);
            kvd_msg_clear(&rep);
            *at = w->next;
            c->n_acq_waits--;
            acq_wait_free(s, w);
            replied = true;
        }
        if (replied)
            conn_flush(s, c); /* may close c: next was taken before */
    }
}

/* How long the loop may sleep: a tick, less when a held Acquire's
 * deadline comes sooner. */
static int loop_timeout_ms(kvd_server_t *s)
{
    if (s->backlog)
        return 0;
    if (s->n_acq_waits == 0)
        return TICK_MS;
    uint64_t now = kvd_now_ns();
    if (s->acq_next_ns <= now)
        return 0;
    return (int)KVD_MIN((s->acq_next_ns - now + 999999) / 1000000, (uint64_t)TICK_MS);
}

/*
 * The directory's methods. DirAnnounce and DirLookup with local come from
 * peer daemons only (the cluster's token); a routed DirLookup (the CLI's
 * `show --cluster`) from a peer or an operator, or from a tenant about its
 * own namespaces. Returns true when the reply is deferred (a routed
 * lookup: routed_done sends it).
 */
static bool serve_dir(kvd_server_t *s, conn_t *c, const kvd_msg_t *req, kvd_msg_t *rep,
                      uint64_t t0)
{
    if (s->dirsvc == NULL) {
        kvd_msg_error(rep, req->id, req->method, KVD_ERR_UNSUPPORTED,
                      "no cluster: kvdockd runs without --cluster-etcd");
        return false;
    }
    bool local = req->method != KVD_METHOD_DIR_LOOKUP || req->body.dir_lookup_req.local;
    if (local && !c->ctx.is_peer) {
        kvd_msg_error(rep, req->id, req->method, KVD_ERR_PERMISSION,
                      "%s is for the cluster's daemons (their token) only",
                      kvd_method_name(req->method));
        return false;
    }
    if (req->method == KVD_METHOD_DIR_ANNOUNCE) {
        kvd_dirsvc_serve_announce(s->dirsvc, req, rep);
        return false;
    }
    if (req->method == KVD_METHOD_FETCH) {
        kvd_remote_serve_fetch(s->remote, c->ctx.conn_id, req, rep);
        return false;
    }
    if (local) {
        kvd_dirsvc_serve_local(s->dirsvc, req, rep);
        return false;
    }
    const kvd_dir_lookup_req_t *r = &req->body.dir_lookup_req;
    if (!c->ctx.is_operator) {
        const char *mine = kvd_store_tenant_name(s->store, c->ctx.tenant);
        for (size_t q = 0; q < r->n; q++)
            if (mine == NULL || strcmp(r->queries[q].tenant, mine) != 0) {
                kvd_msg_error(rep, req->id, req->method, KVD_ERR_PERMISSION,
                              "a lookup names another tenant's namespace");
                return false;
            }
    }
    deferred_t *d = kvd_mem_calloc(KVD_MEM_OTHER, 1, sizeof(*d));
    if (d == NULL) {
        kvd_msg_error(rep, req->id, req->method, KVD_ERR_NOMEM, "out of memory");
        return false;
    }
    *d = (deferred_t){s, c->id, req->id, t0};
    int rc = kvd_dirsvc_route(s->dirsvc, r, false, routed_done, d);
    if (rc != KVD_OK) {
        kvd_mem_free(KVD_MEM_OTHER, d, sizeof(*d));
        kvd_msg_error(rep, req->id, req->method, rc, "directory: %s", kvd_status_str(rc));
        return false;
    }
    return true;
}

static int start_cluster(kvd_server_t *s)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    kvd_cluster_cfg_t cfg = {.endpoints = s->opts.cluster_etcd,
                             .cluster_name = s->opts.cluster_name,
                             .node_id = s->opts.node_id,
                             .advertise = s->opts.advertise,
                             .ttl_s = (int)s->opts.cluster_ttl_s,
                             .pool_bytes = kvd_pool_size(s->pool),
                             .started_unix_ms = (uint64_t)ts.tv_sec * 1000ull +
                                                (uint64_t)ts.tv_nsec / 1000000ull};
    int rc = kvd_cluster_start(&cfg, &s->cluster);
    if (rc != KVD_OK) {
        KVD_ERROR("server", "cannot start the cluster membership: %s",
                  kvd_status_str(rc));
        return rc;
    }
    uint8_t tok[KVD_TOKEN_MAX];
    size_t tok_len = 0;
    char why[256];
    rc = kvd_token_read(s->opts.cluster_token_file, true, tok, sizeof(tok), &tok_len, why,
                        sizeof(why));
    if (rc != KVD_OK) {
        KVD_ERROR("server", "--cluster-token-file: %s", why);
        return rc;
    }
    rc = kvd_peers_start(s->opts.node_id, tok, tok_len, 1000, &s->peers);
    explicit_bzero(tok, sizeof(tok));
    if (rc == KVD_OK)
        rc = kvd_dirsvc_create(s->store, s->peers, s->opts.node_id, &s->dirsvc);
    if (rc == KVD_OK)
        rc = kvd_dirsvc_set_cache(s->dirsvc, s->opts.cluster_cache_ms);
    if (rc == KVD_OK)
        rc = kvd_remote_create(s->store, kvd_pool_base(s->pool), s->dirsvc, s->peers,
                               s->opts.max_frame_bytes, &s->remote);
    /* remote loads over UCX where this daemon runs UCX at all (holders
     * that do not serve it get the RPC) */
    if (rc == KVD_OK && strcmp(s->opts.ucx, "off") != 0 &&
        kvd_peers_set_pool(s->peers, kvd_pool_base(s->pool), kvd_pool_size(s->pool)) ==
            KVD_OK)
        kvd_remote_use_ucx(s->remote, true);
    if (rc != KVD_OK) {
        KVD_ERROR("server", "cannot start the cluster directory: %s", kvd_status_str(rc));
        return rc;
    }
    s->peers_src = (src_t){SRC_PEERS, kvd_peers_fd(s->peers)};
    if ((rc = watch(s, &s->peers_src, EPOLLIN, EPOLL_CTL_ADD)) != KVD_OK)
        return rc;
    s->cluster_src = (src_t){SRC_CLUSTER, kvd_cluster_fd(s->cluster)};
    KVD_INFO("server", "cluster '%s': joining as %s (%s) through etcd %s",
             s->opts.cluster_name, s->opts.node_id, s->opts.advertise,
             s->opts.cluster_etcd);
    return watch(s, &s->cluster_src, EPOLLIN, EPOLL_CTL_ADD);
}

/* Serves one request frame. */
static void conn_serve(kvd_server_t *s, conn_t *c, const uint8_t *payload, size_t len)
{
    uint64_t t0 = kvd_now_ns();
    /* the loop serves one request at a time: one pair of messages does */
    kvd_msg_t *req = &s->msgs[0], *rep = &s->msgs[1];
    /* batch limits are checked before the batch is copied anywhere */
    kvd_msg_limits_t lim = {.max_items = s->opts.max_batch,
                            .max_pools = KVD_LOOKUP_POOLS_MAX};
    int rc = kvd_msg_decode_limited(payload, len, &lim, req);
    if (rc == KVD_ERR_TOO_LARGE && !req->reply) {
        /* a typed refusal: the request was well formed, only too long */
        kvd_msg_error(rep, req->id, req->method, rc,
                      "a batch of more than %llu items (--max-batch) or %d pools",
                      (unsigned long long)s->opts.max_batch, KVD_LOOKUP_POOLS_MAX);
        conn_reply(s, c, rep);
        kvd_counters_record(&s->counters, req->method, true, kvd_now_ns() - t0);
        goto done;
    }
    if (rc == KVD_ERR_UNKNOWN_METHOD) {
        conn_fail(s, c, req->id, KVD_METHOD_NONE, rc, "unknown method");
        goto done;
    }
    if (rc != KVD_OK) {
        conn_fail(s, c, 0, KVD_METHOD_NONE, KVD_ERR_PROTOCOL,
                  "malformed frame: the payload is not a valid request");
        goto done;
    }
    if (req->reply) {
        conn_fail(s, c, req->id, req->method, KVD_ERR_PROTOCOL,
                  "a reply was sent where a request was expected");
        goto done;
    }
    memset(rep, 0, sizeof(*rep));
    rep->id = req->id;
    rep->method = req->method;
    rep->reply = true;
    if (!c->authed && req->method != KVD_METHOD_HELLO) {
        auth_refuse(s, c, req, rep, "say Hello first: every other method needs one");
        conn_reply(s, c, rep);
        kvd_counters_record(&s->counters, req->method, true, kvd_now_ns() - t0);
        goto done;
    }
    switch (req->method) {
    case KVD_METHOD_HELLO: serve_hello(s, c, req, rep); break;
    case KVD_METHOD_HEALTH:
        rep->body.health_rep.state = server_health(s);
        rep->body.health_rep.pool_bytes = kvd_pool_size(s->pool);
        rep->body.health_rep.populated_bytes = kvd_pool_populated_bytes(s->pool);
        rep->body.health_rep.uptime_ms = (kvd_now_ns() - s->start_ns) / 1000000;
        rep->body.health_rep.cluster = kvd_cluster_state(s->cluster);
        break;
    case KVD_METHOD_STATS: serve_stats(s, c, req, rep); break;
    case KVD_METHOD_CLUSTER: serve_cluster(s, req, rep); break;
    case KVD_METHOD_DIR_ANNOUNCE:
    case KVD_METHOD_DIR_LOOKUP:
    case KVD_METHOD_FETCH:
        if (serve_dir(s, c, req, rep, t0)) {
            kvd_msg_clear(req);
            kvd_msg_clear(rep);
            return; /* answered when the owners have */
        }
        break;
    case KVD_METHOD_RESERVE:
    case KVD_METHOD_ACQUIRE:
        if (server_health(s) != KVD_HEALTH_READY) {
            kvd_msg_error(rep, req->id, req->method,
                          s->draining ? KVD_ERR_DRAINING : KVD_ERR_UNAVAILABLE,
                          "the daemon is %s; retry when it is ready",
                          kvd_health_name(server_health(s)));
            break;
        }
        if (req->method == KVD_METHOD_RESERVE && reserve_cluster(s, c, req, t0)) {
            kvd_msg_clear(req);
            kvd_msg_clear(rep);
            return; /* answered when the directory has */
        }
        /* fall through */
    case KVD_METHOD_REGISTER_NAMESPACE:
    case KVD_METHOD_LOOKUP:
    case KVD_METHOD_PUBLISH:
    case KVD_METHOD_REVOKE:
    case KVD_METHOD_RELEASE:
    case KVD_METHOD_LIST_PREFIXES:
    case KVD_METHOD_INSPECT:
    case KVD_METHOD_EVICT:
        ucx_windows_finish(s, c, req);
        kvd_rpc_store_serve(s->store, &s->opts, &c->ctx, req, rep);
        if (req->method == KVD_METHOD_ACQUIRE) {
            uint32_t probe = acq_probe(rep->error_index, req->body.acquire_req.n);
            acquire_cluster(s, c, req, rep);
            if (acquire_park(s, c, req, rep, t0, probe)) {
                kvd_msg_clear(req);
                kvd_msg_clear(rep);
                return; /* answered by acquire_waits_run */
            }
        }
        if (req->method == KVD_METHOD_LOOKUP && lookup_cluster(s, c, req, rep, t0)) {
            kvd_msg_clear(req);
            kvd_msg_clear(rep);
            return; /* answered when the directory has */
        }
        break;
    default:
        kvd_msg_error(rep, req->id, req->method, KVD_ERR_UNKNOWN_METHOD,
                      "unknown method");
        c->closing = true;
        break;
    }
    /* a connection whose first Hello failed has nothing left to say */
    if (req->method == KVD_METHOD_HELLO && rep->status != KVD_OK && !c->authed)
        c->closing = true;
    ucx_windows(s, c, req, rep);
    conn_reply(s, c, rep);
    kvd_counters_record(&s->counters, req->method, rep->status != KVD_OK,
                        kvd_now_ns() - t0);
done:
    kvd_msg_clear(req);
    kvd_msg_clear(rep);
}

/* send() that attaches fd (SCM_RIGHTS) to the first byte sent. */
static ssize_t send_with_fd(int sock, const uint8_t *buf, size_t len, int fd)
{
    struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
    union {
        struct cmsghdr align;
        char buf[CMSG_SPACE(sizeof(int))];
    } ctl;
    memset(&ctl, 0, sizeof(ctl));
    struct msghdr msg = {.msg_iov = &iov,
                         .msg_iovlen = 1,
                         .msg_control = ctl.buf,
                         .msg_controllen = sizeof(ctl.buf)};
    struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cm), &fd, sizeof(int));
    return sendmsg(sock, &msg, MSG_NOSIGNAL);
}

static void conn_serve_buffered(kvd_server_t *s, conn_t *c);

/* Writes what is queued; returns false when the peer is gone (c closed). */
static bool conn_send_out(kvd_server_t *s, conn_t *c)
{
    size_t off = 0;
    while (off < c->out.len) {
        bool with_fd = c->fd_at == off;
        size_t end = c->fd_at != SIZE_MAX && c->fd_at > off ? c->fd_at : c->out.len;
        /* a read-only connection gets the read-only descriptor: it cannot
         * map the pool writable nor punch holes in it */
        int pool_fd = c->ctx.read_only ? kvd_pool_fd_ro(s->pool) : kvd_pool_fd(s->pool);
        ssize_t n = with_fd
                        ? send_with_fd(c->src.fd, c->out.data + off, end - off, pool_fd)
                        : send(c->src.fd, c->out.data + off, end - off, MSG_NOSIGNAL);
        if (n > 0) {
            off += (size_t)n;
            if (with_fd)
                c->fd_at = SIZE_MAX;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN)
            break;
        char why[96];
        snprintf(why, sizeof(why), "send failed: %s",
                 n < 0 ? strerror(errno) : "peer gone");
        conn_close(s, c, why);
        return false;
    }
    kvd_buf_consume(&c->out, off);
    if (c->fd_at != SIZE_MAX)
        c->fd_at -= off;
    return true;
}

/*
 * Writes queued output; closes a closing connection once it is all out.
 * The pool's descriptor goes with the first byte of the reply at fd_at.
 * Once the output is drained, frames held back while the client was not
 * reading are served, and their replies written, until either runs out.
 */
static void conn_flush(kvd_server_t *s, conn_t *c)
{
    for (;;) {
        if (!conn_send_out(s, c))
            return;
        if (c->closing && c->out.len == 0) {
            conn_close(s, c, "closed after error reply");
            return;
        }
        if (c->out.len > 0 || c->closing || kvd_framer_pending(&c->in) == 0 || c->backlog)
            break;
        size_t before = kvd_framer_pending(&c->in);
        conn_serve_buffered(s, c);
        if (kvd_framer_pending(&c->in) == before && c->out.len == 0)
            break; /* only a partial frame is left: wait for its bytes */
        if (c->backlog)
            break; /* its turn is over */
    }
    if (c->out.len == 0) {
        /* a burst can leave megabytes of buffer behind: give them back */
        if (c->out.cap > BUF_KEEP_BYTES)
            kvd_buf_free(&c->out);
        if (kvd_framer_pending(&c->in) == 0 && c->in.buf.cap > BUF_KEEP_BYTES)
            kvd_framer_free(&c->in);
        conn_account(s, c);
    }
    conn_update_events(s, c);
}

/*
 * Serves the whole frames already read, in order, while the output stays
 * under the high-water mark: the rest wait in the framer until the client
 * has read its replies (conn_flush comes back here), so a client that sends
 * without reading stalls itself, not the daemon's memory.
 */
static void conn_serve_buffered(kvd_server_t *s, conn_t *c)
{
    /* a turn: a client that pipelines many requests, each bounded, still
     * gets at most CONN_TURN_NS of the loop before the others' turns; what
     * is left waits in the framer for the next pass of the loop */
    uint64_t t0 = kvd_now_ns();
    for (bool first = true; !c->closing && c->out.len < OUT_HIGH_WATER &&
                            !(c->out.len > 0 && conn_buffers_full(s));
         first = false) {
        if (!first && kvd_framer_pending(&c->in) > 0 &&
            kvd_now_ns() - t0 >= CONN_TURN_NS) {
            c->backlog = s->backlog = true;
            return;
        }
        const uint8_t *payload;
        size_t len;
        int got = kvd_framer_next(&c->in, &payload, &len);
        if (got == 0)
            return;
        c->frame_since_ns = 0; /* the next frame's time starts afresh */
        if (got == KVD_ERR_TOO_LARGE) {
            char what[128];
            snprintf(what, sizeof(what), "frame larger than the maximum of %llu bytes",
                     (unsigned long long)s->opts.max_frame_bytes);
            conn_fail(s, c, 0, KVD_METHOD_NONE, KVD_ERR_TOO_LARGE, what);
            return;
        }
        if (got < 0) {
            conn_fail(s, c, 0, KVD_METHOD_NONE, KVD_ERR_PROTOCOL, "zero-length frame");
            return;
        }
        conn_serve(s, c, payload, len);
    }
}

/*
 * Ends a connection the daemon will not wait for or hold more for: says why
 * in one best-effort error frame when nothing else is queued (a client that
 * does not read must not keep the connection open by not reading it), logs
 * it and closes.
 */
static void conn_drop(kvd_server_t *s, conn_t *c, int status, const char *why)
{
    KVD_WARN("server", "connection %llu: %s; closing it", (unsigned long long)c->id, why);
    if (c->out.len == 0) {
        kvd_buf_t b;
        kvd_buf_init(&b, KVD_MEM_CONN);
        kvd_msg_t rep;
        kvd_msg_error(&rep, 0, KVD_METHOD_NONE, status, "%s", why);
        if (kvd_msg_pack(&rep, KVD_FRAME_LIMIT_MAX, &b) == KVD_OK) {
            ssize_t w = send(c->src.fd, b.data, b.len, MSG_NOSIGNAL | MSG_DONTWAIT);
            (void)w;
        }
        kvd_buf_free(&b);
    }
    conn_close(s, c, why);
}

/* The input of c would take the connections' buffers over the cap. */
static void conn_over_buffer(kvd_server_t *s, conn_t *c, size_t grow)
{
    atomic_fetch_add(&s->counters.connections_over_buffer, 1);
    char why[192], a[32], b[32], m[32];
    snprintf(why, sizeof(why),
             "its input needs %s more, and the connections' buffers hold %s of "
             "--max-conn-buffer %s",
             kvd_size_format(grow, a, sizeof(a)),
             kvd_size_format(s->conn_buf_bytes, b, sizeof(b)),
             kvd_size_format(s->opts.max_conn_buffer_bytes, m, sizeof(m)));
    conn_drop(s, c, KVD_ERR_NO_SPACE, why);
}

/* Closes the connections that took too long: no Hello within
 * --hello-timeout-ms of accept, a frame unfinished --frame-timeout-ms after
 * it began. Connections that said Hello may stay idle as long as they
 * like (engines keep theirs open between requests). */
static void conn_timeouts(kvd_server_t *s, uint64_t now)
{
    uint64_t hello_ns = s->opts.hello_timeout_ms * 1000000ull;
    uint64_t frame_ns = s->opts.frame_timeout_ms * 1000000ull;
    for (conn_t *c = s->conns, *next; c != NULL; c = next) {
        next = c->next;
        char why[128];
        if (hello_ns && !c->hello_done && now - c->accepted_ns > hello_ns)
            snprintf(why, sizeof(why), "no Hello within %llu ms (--hello-timeout-ms)",
                     (unsigned long long)s->opts.hello_timeout_ms);
        else if (frame_ns && c->frame_since_ns && (c->events & EPOLLIN) &&
                 now - c->frame_since_ns > frame_ns)
            snprintf(why, sizeof(why),
                     "a frame not all there %llu ms after it began (--frame-timeout-ms)",
                     (unsigned long long)s->opts.frame_timeout_ms);
        else
            continue;
        atomic_fetch_add(&s->counters.connections_timed_out, 1);
        conn_drop(s, c, KVD_ERR_TIMEOUT, why);
    }
}

static void conn_on_readable(kvd_server_t *s, conn_t *c)
{
    for (;;) {
        conn_serve_buffered(s, c);
        if (c->closing || c->out.len >= OUT_HIGH_WATER || c->backlog)
            break;
        uint8_t *space;
        size_t avail;
        size_t grow = kvd_framer_space_cap(&c->in, READ_CHUNK) - c->in.buf.cap;
        if (grow > 0 && s->conn_buf_bytes + grow > s->opts.max_conn_buffer_bytes) {
            conn_over_buffer(s, c, grow);
            return;
        }
        if (kvd_framer_space(&c->in, READ_CHUNK, &space, &avail) != KVD_OK) {
            conn_close(s, c, "out of memory for input");
            return;
        }
        conn_account(s, c);
        ssize_t n = recv(c->src.fd, space, avail, 0);
        if (n == 0) {
            if (kvd_framer_pending(&c->in) > 0) {
                atomic_fetch_add(&s->counters.protocol_errors, 1);
                KVD_WARN("server",
                         "connection %llu: closed inside a frame (%zu bytes of "
                         "truncated or unserved frames dropped)",
                         (unsigned long long)c->id, kvd_framer_pending(&c->in));
            }
            conn_close(s, c, "peer closed");
            return;
        }
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN)
                break;
            char why[96];
            snprintf(why, sizeof(why), "recv failed: %s", strerror(errno));
            conn_close(s, c, why);
            return;
        }
        kvd_framer_commit(&c->in, (size_t)n);
        /* a short read emptied the socket: serve it, then wait for epoll
         * rather than pay one more recv() that would say EAGAIN */
        if ((size_t)n < avail) {
            conn_serve_buffered(s, c);
            break;
        }
    }
    conn_flush(s, c);
}

static void accept_all(kvd_server_t *s, src_t *listener)
{
    for (;;) {
        int fd = accept4(listener->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS ||
                errno == ENOMEM) {
                /* the pending connection stays queued and the listener
                 * readable: stop watching it for a tick instead of spinning */
                KVD_WARN("server", "accept: %s; not accepting for %d ms", strerror(errno),
                         TICK_MS);
                watch(s, listener, 0, EPOLL_CTL_MOD);
                s->accept_paused = true;
            } else if (errno != EAGAIN) {
                KVD_WARN("server", "accept: %s", strerror(errno));
            }
            return;
        }
        if (atomic_load(&s->counters.connections_current) >= s->opts.max_connections) {
            atomic_fetch_add(&s->counters.connections_rejected, 1);
            /* best effort: say why before closing; a full socket buffer on a
             * fresh connection is impossible */
            kvd_buf_t b;
            kvd_buf_init(&b, KVD_MEM_CONN);
            kvd_msg_t rep;
            kvd_msg_error(&rep, 0, KVD_METHOD_NONE, KVD_ERR_NO_SPACE,
                          "too many connections (limit %llu)",
                          (unsigned long long)s->opts.max_connections);
            if (kvd_msg_pack(&rep, KVD_FRAME_LIMIT_MAX, &b) == KVD_OK) {
                ssize_t w = send(fd, b.data, b.len, MSG_NOSIGNAL);
                (void)w;
            }
            kvd_buf_free(&b);
            close(fd);
            continue;
        }
        conn_t *c = kvd_mem_calloc(KVD_MEM_CONN, 1, sizeof(*c));
        if (c == NULL) {
            close(fd);
            continue;
        }
        c->src.kind = SRC_CONN;
        c->src.fd = fd;
        c->id = ++s->next_conn_id;
        c->ctx = (kvd_rpc_ctx_t){.conn_id = c->id};
        c->tcp = listener->kind == SRC_TCP_LISTEN;
        if (c->tcp) {
            int one = 1;
            setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        }
        /* before Hello, only what a Hello can take: --max-frame of input
         * is for authenticated clients (see HELLO_FRAME_MAX) */
        kvd_framer_init(&c->in, KVD_MIN(s->opts.max_frame_bytes, HELLO_FRAME_MAX),
                        KVD_MEM_CONN);
        kvd_buf_init(&c->out, KVD_MEM_CONN);
        c->events = EPOLLIN;
        c->fd_at = SIZE_MAX;
        c->accepted_ns = kvd_now_ns();
        if (watch(s, &c->src, c->events, EPOLL_CTL_ADD) != KVD_OK) {
            close(fd);
            kvd_mem_free(KVD_MEM_CONN, c, sizeof(*c));
            continue;
        }
        c->next = s->conns;
        if (s->conns)
            s->conns->prev = c;
        s->conns = c;
        atomic_fetch_add(&s->counters.connections_current, 1);
        atomic_fetch_add(&s->counters.connections_total, 1);
        KVD_DEBUG("server", "connection %llu accepted", (unsigned long long)c->id);
    }
}

/* ------------------------------------------------------------ listeners */

/*
 * Whether the path may be cleared for our socket: nothing there, or a
 * socket of ours nobody serves (a crash left it). Anything else (a
 * regular file, a directory, a symbolic link, another user's socket) is
 * never removed: --socket may name a path by mistake, and the daemon must
 * not delete what it did not make. Logs why not.
 */
static int clear_stale_socket(const char *path)
{
    struct stat st;
    if (lstat(path, &st) != 0) {
        if (errno == ENOENT)
            return KVD_OK;
        int err = errno;
        KVD_ERROR("server", "--socket %s: %s", path, strerror(err));
        return kvd_status_from_errno(err);
    }
    if (!S_ISSOCK(st.st_mode) || st.st_uid != geteuid()) {
        KVD_ERROR("server",
                  "--socket %s exists and is %s: refusing to replace it; remove it or "
                  "pick another --socket",
                  path,
                  S_ISREG(st.st_mode)     ? "a regular file"
                  : S_ISDIR(st.st_mode)   ? "a directory"
                  : S_ISLNK(st.st_mode)   ? "a symbolic link"
                  : !S_ISSOCK(st.st_mode) ? "not a socket"
                                          : "a socket of another user");
        return KVD_ERR_EXISTS;
    }
    if (unlink(path) != 0 && errno != ENOENT) {
        int err = errno;
        KVD_ERROR("server", "cannot remove the stale socket %s: %s", path, strerror(err));
        return kvd_status_from_errno(err);
    }
    return KVD_OK;
}

/* Removes the socket file at exit, only if it is still the one we bound
 * (same device and inode): someone may have replaced the path since. */
static void remove_our_socket(kvd_server_t *s)
{
    if (!s->sock_bound)
        return;
    s->sock_bound = false;
    struct stat st;
    const char *path = s->opts.socket_path;
    if (lstat(path, &st) != 0)
        return;
    if (!S_ISSOCK(st.st_mode) || st.st_dev != s->sock_dev || st.st_ino != s->sock_ino) {
        KVD_WARN("server", "%s is no longer the socket this daemon made: leaving it",
                 path);
        return;
    }
    unlink(path);
}

/* Binds the Unix socket; a live daemon on the path is an error, a stale
 * socket file of ours left by a crash is replaced, anything else at the
 * path is refused (clear_stale_socket). */
static int listen_unix(kvd_server_t *s)
{
    const char *path = s->opts.socket_path;
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof(addr.sun_path)) {
        KVD_ERROR("server", "socket path too long: %s", path);
        return KVD_ERR_INVALID;
    }
    strcpy(addr.sun_path, path);
    kvd_client_t *probe = NULL;
    if (kvd_client_connect_unix(path, 500, &probe) == KVD_OK) {
        kvd_client_close(probe);
        KVD_ERROR("server",
                  "another daemon serves %s; stop it or pick another "
                  "--socket / --instance",
                  path);
        return KVD_ERR_EXISTS;
    }
    int rc0 = clear_stale_socket(path);
    if (rc0 != KVD_OK)
        return rc0;
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        int err = errno;
        KVD_ERROR("server", "socket(AF_UNIX): %s", strerror(err));
        return kvd_status_from_errno(err);
    }
    /* The mode the rules call for (auth.h) from the start: bind creates the
     * file under the umask, and its group and exact mode are set before
     * listen(), while every connect() is still refused. */
    gid_t group;
    mode_t mode = kvd_auth_socket_mode(s->auth, &group);
    s->socket_mode = mode;
    mode_t old = umask(~mode & 0777);
    int rc = bind(fd, (struct sockaddr *)&addr, sizeof(addr));
    umask(old);
    const char *step = "bind";
    if (rc == 0 && group != (gid_t)-1 &&
        (step = "chown", chown(path, (uid_t)-1, group)) != 0)
        rc = -1;
    if (rc == 0 && (step = "chmod", chmod(path, mode)) != 0)
        rc = -1;
    if (rc == 0 && (step = "listen", listen(fd, 1024)) != 0)
        rc = -1;
    if (rc != 0) {
        int err = errno;
        if (strcmp(step, "chown") == 0)
            KVD_ERROR("server",
                      "cannot give %s to group %u (--allow-gid): %s; the daemon's user "
                      "must be in that group",
                      path, (unsigned)group, strerror(err));
        else
            KVD_ERROR("server", "cannot listen on %s (%s): %s", path, step,
                      strerror(err));
        close(fd);
        if (strcmp(step, "bind") != 0)
            unlink(path);
        return kvd_status_from_errno(err);
    }
    /* remembered, so that only this socket is ever removed (at exit) */
    struct stat st;
    if (lstat(path, &st) == 0 && S_ISSOCK(st.st_mode)) {
        s->sock_bound = true;
        s->sock_dev = st.st_dev;
        s->sock_ino = st.st_ino;
    }
    s->unix_listen = (src_t){SRC_UNIX_LISTEN, fd};
    return watch(s, &s->unix_listen, EPOLLIN, EPOLL_CTL_ADD);
}

static int listen_tcp(kvd_server_t *s)
{
    char host[128], port_s[8];
    uint16_t port;
    if (kvd_parse_host_port(s->opts.listen, host, sizeof(host), &port) != KVD_OK)
        return KVD_ERR_INVALID;
    snprintf(port_s, sizeof(port_s), "%u", port);
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *res = NULL;
    int gai = getaddrinfo(host, port_s, &hints, &res);
    if (gai != 0) {
        KVD_ERROR("server", "--listen %s: %s", s->opts.listen, gai_strerror(gai));
        return KVD_ERR_INVALID;
    }
    int fd = socket(res->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1, rc = KVD_OK;
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0 ||
        bind(fd, res->ai_addr, res->ai_addrlen) != 0 || listen(fd, 1024) != 0) {
        int err = errno;
        KVD_ERROR("server", "cannot listen on %s: %s", s->opts.listen, strerror(err));
        rc = kvd_status_from_errno(err);
        if (fd >= 0)
            close(fd);
    }
    freeaddrinfo(res);
    if (rc != KVD_OK)
        return rc;
    s->tcp_listen = (src_t){SRC_TCP_LISTEN, fd};
    KVD_INFO("server", "serving RPC over TCP on %s", s->opts.listen);
    return watch(s, &s->tcp_listen, EPOLLIN, EPOLL_CTL_ADD);
}

static void close_listeners(kvd_server_t *s)
{
    if (s->unix_listen.fd >= 0) {
        epoll_ctl(s->epfd, EPOLL_CTL_DEL, s->unix_listen.fd, NULL);
        close(s->unix_listen.fd);
        remove_our_socket(s);
        s->unix_listen.fd = -1;
    }
    if (s->tcp_listen.fd >= 0) {
        epoll_ctl(s->epfd, EPOLL_CTL_DEL, s->tcp_listen.fd, NULL);
        close(s->tcp_listen.fd);
        s->tcp_listen.fd = -1;
    }
}

/* ------------------------------------------------------------- lifecycle */

/* Starts the UCX server process, as --ucx says: auto goes on without UCX
 * when it cannot start, on refuses to run without it. */
static int start_ucx(kvd_server_t *s)
{
    if (strcmp(s->opts.ucx, "off") == 0)
        return KVD_OK;
    bool required = strcmp(s->opts.ucx, "on") == 0;
    /* the UCX server listens only where the RPC does: loopback (and shared
     * memory) without --listen, the interface of --listen's host with it */
    char ports[256] = "", devices[512];
    kvd_nics_ucx_devices(s->nics.nics, s->nics.n, ports, sizeof(ports));
    int rc = kvd_ucxd_net_devices(s->opts.listen, getenv("UCX_NET_DEVICES"), ports,
                                  devices, sizeof(devices));
    if (rc == KVD_OK) {
        KVD_INFO("server", "UCX serves on network devices %s",
                 devices[0] ? devices
                            : "of UCX's own choice (--listen on every interface)");
        const kvd_ucxd_opts_t o = {.pool_fd = kvd_pool_fd(s->pool),
                                   .pool_bytes = kvd_pool_size(s->pool),
                                   .net_devices = devices,
                                   .allow_tcp = s->opts.ucx_tcp,
                                   .no_sandbox = s->opts.no_ucx_sandbox,
                                   .timeout_ms = 10000};
        rc = kvd_ucxd_start(&o, &s->ucxd, s->ucx_refused, sizeof(s->ucx_refused));
    }
    if (rc == KVD_OK) {
        s->ucx_src = (src_t){SRC_UCX, kvd_ucxd_fd(s->ucxd)};
        rc = watch(s, &s->ucx_src, EPOLLIN, EPOLL_CTL_ADD);
    }
    if (rc == KVD_OK) {
        KVD_INFO("server", "UCX serves the pool (%s)",
                 getenv("UCX_TLS") ? getenv("UCX_TLS") : "UCX_TLS unset: UCX picks");
        return KVD_OK;
    }
    kvd_ucxd_stop(s->ucxd);
    s->ucxd = NULL;
    s->ucx_src.fd = -1;
    if (rc == KVD_ERR_UNSUPPORTED && s->ucx_refused[0]) {
        /* a refusal, not a failure: said once here, and to every Hello */
        char text[KVD_ERROR_MAX];
        kvd_log(required ? KVD_LOG_ERROR : KVD_LOG_WARN, "server", "%s",
                ucx_refusal_text(s, s->ucx_refused, text));
        if (required) {
            KVD_ERROR("server", "--ucx on, but UCX cannot serve the pool: %s",
                      kvd_status_str(rc));
            return rc;
        }
        KVD_WARN("server", "UCX serves nothing: shared-memory workers only");
        return KVD_OK;
    }
    if (required) {
        KVD_ERROR("server", "--ucx on, but UCX cannot serve the pool: %s",
                  kvd_status_str(rc));
        return rc;
    }
    KVD_WARN("server", "UCX cannot serve the pool (%s): shared-memory workers only",
             kvd_status_str(rc));
    return KVD_OK;
}

/* The store's journal beside the pool file (kvd_store.h "persistence"):
 * what it recovers is logged in one line. A journal of another layout or
 * pool is refused (KVD_ERR_STATE): the daemon does not start, and the
 * line says --fresh discards it. */
static int attach_journal(kvd_server_t *s)
{
    char path[sizeof(s->opts.shm_dir) + sizeof(s->opts.instance) + 32];
    snprintf(path, sizeof(path), "%s/kvdock-%s.journal", s->opts.shm_dir,
             s->opts.instance);
    kvd_store_journal_opts_t jo = {.path = path,
                                   .pool_created = kvd_pool_created(s->pool),
                                   .fresh = s->opts.fresh,
                                   .hugepages = kvd_pool_hugepages(s->pool),
                                   .compact_min_bytes = s->opts.journal_compact_bytes};
    kvd_pool_identity(s->pool, &jo.pool_dev, &jo.pool_ino);
    kvd_store_recovery_t rec;
    char why[768] = "";
    int rc = kvd_store_journal_attach(s->store, &jo, &rec, why, sizeof(why));
    if (rc == KVD_ERR_STATE) {
        KVD_ERROR("server",
                  "refusing to start: %s. Start with --fresh to discard the objects of "
                  "instance '%s' (or with the --pool-size, --hugepages and kvdockd "
                  "version that made them, to keep them)",
                  why, s->opts.instance);
        return rc;
    }
    if (rc != KVD_OK) {
        KVD_ERROR("server", "cannot attach the journal %s: %s (%s)", path,
                  kvd_status_str(rc), why);
        return rc;
    }
    char a[32], b[32], c[32];
    if (!rec.found) {
        KVD_INFO("server", "journal %s: %s; starting empty (%.1f ms)", path, rec.note,
                 (double)rec.elapsed_ns / 1e6);
        return KVD_OK;
    }
    if (rec.note[0] != '\0') {
        KVD_WARN("server", "journal %s: %s; starting empty", path, rec.note);
        return KVD_OK;
    }
    char extra[160] = "";
    if (rec.discarded > 0)
        snprintf(extra, sizeof(extra),
                 ", %llu objects of namespaces or tenants no longer there",
                 (unsigned long long)rec.discarded);
    if (rec.torn_bytes > 0)
        snprintf(extra + strlen(extra), sizeof(extra) - strlen(extra),
                 ", a torn last record of %llu bytes",
                 (unsigned long long)rec.torn_bytes);
    KVD_INFO("server",
             "recovered %llu objects (%s) in %llu namespaces from %s (%s, %llu records) "
             "in %.1f ms (read %.1f, rebuilt %.1f, written anew %.1f); discarded %llu "
             "partial writes (%s, free after one lease TTL)%s",
             (unsigned long long)rec.objects, kvd_size_format(rec.bytes, a, sizeof(a)),
             (unsigned long long)rec.namespaces, path,
             kvd_size_format(rec.journal_bytes, b, sizeof(b)),
             (unsigned long long)rec.records, (double)rec.elapsed_ns / 1e6,
             (double)rec.read_ns / 1e6, (double)rec.rebuild_ns / 1e6,
             (double)rec.write_ns / 1e6, (unsigned long long)rec.writing_discarded,
             kvd_size_format(rec.writing_bytes, c, sizeof(c)), extra);
    return KVD_OK;
}

/* The SSD tier (kvd_store.h "the SSD tier"), after the journal: what it
 * found is logged in one line, with its I/O path. */
static int attach_tier(kvd_server_t *s)
{
    const kvd_opts_t *o = &s->opts;
    kvd_tier_opts_t to = {.dir = o->ssd_path,
                          .size_bytes = o->ssd_size_bytes,
                          .segment_bytes = o->ssd_segment_bytes,
                          .io_path = strcmp(o->ssd_io, "io_uring") == 0 ? 1
                                     : strcmp(o->ssd_io, "psync") == 0  ? 2
                                                                        : 0,
                          .queue_depth = (uint32_t)o->ssd_queue_depth,
                          .policy = strcmp(o->ssd_spill, "hit") == 0 ? KVD_SPILL_HIT
                                                                     : KVD_SPILL_ALL,
                          .pool_base = kvd_pool_base(s->pool),
                          .pool_bytes = kvd_pool_size(s->pool),
                          .fresh = o->fresh,
                          .no_fixed_buffers = o->ssd_no_fixed_buffers,
                          .no_sync = strcmp(o->ssd_sync, "off") == 0,
                          .defer_fixed_buffers = true, /* kvd_store_tier_pool_ready */
                          .fail_read_every = (uint32_t)o->ssd_fail_read_every};
    kvd_tier_recovery_t rec;
    char why[512] = "";
    int rc = kvd_store_tier_attach(s->store, &to, &rec, why, sizeof(why));
    if (rc != KVD_OK) {
        KVD_ERROR("server", "refusing to start: the SSD tier: %s (%s)",
                  why[0] ? why : "see above", kvd_status_str(rc));
        return rc;
    }
    kvd_store_stats_t st;
    kvd_store_stats(s->store, &st);
    char a[32], b[32];
    KVD_INFO("server",
             "SSD tier %s: %s in %llu segments, %s; I/O %s, queue depth %llu%s; "
             "recovered %llu objects (%s) in %.1f ms (%llu from the checkpoint, %llu "
             "from segment summaries, %llu record headers read in %llu segments, %llu "
             "torn, %llu already in DRAM or "
             "twice, %llu of namespaces or tenants no longer there, %llu gone before "
             "the stop)%s%s",
             o->ssd_path, kvd_size_format(st.ssd_bytes, a, sizeof(a)),
             (unsigned long long)st.ssd_segments,
             o->ssd_spill[0] == 'h' ? "spilling objects loaded once"
                                    : "spilling every evicted object",
             kvd_store_tier_io_path(s->store), (unsigned long long)st.ssd_queue_depth,
             st.ssd_fixed_buffers ? ", pool registered" : "",
             (unsigned long long)rec.objects, kvd_size_format(rec.bytes, b, sizeof(b)),
             (double)rec.elapsed_ns / 1e6, (unsigned long long)rec.checkpoint_records,
             (unsigned long long)rec.summary_records,
             (unsigned long long)rec.scanned_records, (unsigned long long)rec.segments,
             (unsigned long long)rec.torn, (unsigned long long)rec.duplicates,
             (unsigned long long)rec.discarded, (unsigned long long)rec.dead,
             rec.objects == 0 ? ": " : "", rec.objects == 0 ? rec.note : "");
    if (kvd_store_tier_note(s->store)[0])
        KVD_INFO("server", "SSD tier: %s", kvd_store_tier_note(s->store));
    return KVD_OK;
}

int kvd_server_create(const kvd_opts_t *opts, kvd_pool_t *pool, kvd_auth_t *auth,
                      kvd_server_t **out)
{
    kvd_server_t *s = kvd_mem_calloc(KVD_MEM_OTHER, 1, sizeof(*s));
    if (s == NULL) {
        kvd_auth_destroy(auth);
        return KVD_ERR_NOMEM;
    }
    s->opts = *opts;
    s->pool = pool;
    s->auth = auth;
    s->start_ns = kvd_now_ns();
    s->usage_prev_ns = s->start_ns;
    s->unix_listen.fd = s->tcp_listen.fd = s->sig.fd = s->timer.fd = s->ucx_src.fd = -1;
    s->tier_src.fd = s->cluster_src.fd = s->peers_src.fd = -1;
    atomic_store(&s->health, KVD_HEALTH_STARTING);
    kvd_nics_discover(&s->nics); /* empty when none, or without libibverbs */
    kvd_store_config_t scfg;
    kvd_store_config_default(&scfg, kvd_pool_size(pool));
    scfg.evict_high = opts->evict_high;
    scfg.evict_low = opts->evict_low;
    scfg.lease_ttl_ms = opts->lease_ttl_ms;
    scfg.index_hint = kvd_pool_size(pool) / KVD_MAX(opts->object_bytes, 4096ull);
    int rc = kvd_store_create(&scfg, &s->store);
    if (rc != KVD_OK) {
        KVD_ERROR("server", "cannot create the store: %s", kvd_status_str(rc));
        s->epfd = -1;
        goto fail;
    }
    kvd_store_set_scrub(s->store, scrub_pool, pool);
    char why[256];
    if ((rc = kvd_auth_bind(s->auth, s->store, why, sizeof(why))) != KVD_OK) {
        KVD_ERROR("server", "%s", why);
        s->epfd = -1;
        goto fail;
    }

    if (kvd_pool_persistent(pool) && (rc = attach_journal(s)) != KVD_OK) {
        s->epfd = -1;
        goto fail;
    }
    if (opts->ssd_path[0] && (rc = attach_tier(s)) != KVD_OK) {
        s->epfd = -1;
        goto fail;
    }

    s->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (s->epfd < 0) {
        int err = errno;
        KVD_ERROR("server", "epoll_create1: %s", strerror(err));
        rc = kvd_status_from_errno(err);
        goto fail;
    }
    /* SIGTERM/SIGINT arrive through a signalfd; they were blocked in main()
     * before any thread started, so every thread inherits the mask */
    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGTERM);
    sigaddset(&mask, SIGINT);
    s->sig = (src_t){SRC_SIGNAL, signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC)};
    int err = errno;
    s->timer =
        (src_t){SRC_TIMER, timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC)};
    if (s->sig.fd < 0 || s->timer.fd < 0) {
        err = s->sig.fd < 0 ? err : errno;
        KVD_ERROR("server", "%s: %s", s->sig.fd < 0 ? "signalfd" : "timerfd_create",
                  strerror(err));
        rc = kvd_status_from_errno(err);
        goto fail;
    }
    struct itimerspec its = {.it_interval = {0, TICK_MS * 1000000L},
                             .it_value = {0, TICK_MS * 1000000L}};
    timerfd_settime(s->timer.fd, 0, &its, NULL);
    s->tier_src = (src_t){SRC_TIER, kvd_store_tier_fd(s->store)};
    s->pool_src = (src_t){SRC_POOL, kvd_pool_watch_fd(s->pool)};
    if (s->pool_src.fd < 0)
        KVD_WARN("server",
                 "no inotify watch of the pool file (%s): a writer that "
                 "destroys bytes of it is found at the next tick",
                 strerror(errno));
    else if ((rc = watch(s, &s->pool_src, EPOLLIN, EPOLL_CTL_ADD)) != KVD_OK)
        goto fail;
    if ((rc = watch(s, &s->sig, EPOLLIN, EPOLL_CTL_ADD)) != KVD_OK ||
        (rc = watch(s, &s->timer, EPOLLIN, EPOLL_CTL_ADD)) != KVD_OK ||
        (s->tier_src.fd >= 0 &&
         (rc = watch(s, &s->tier_src, EPOLLIN, EPOLL_CTL_ADD)) != KVD_OK))
        goto fail;
    if ((rc = start_ucx(s)) != KVD_OK)
        goto fail;
    if ((rc = listen_unix(s)) != KVD_OK)
        goto fail;
    if (opts->listen[0] && (rc = listen_tcp(s)) != KVD_OK)
        goto fail;
    if (opts->metrics_listen[0] &&
        (rc = kvd_metrics_start(opts->metrics_listen, &s->metrics)) != KVD_OK)
        goto fail;
    if (opts->cluster_etcd[0] && (rc = start_cluster(s)) != KVD_OK)
        goto fail;
    metrics_publish(s);
    s->next_usage_ns = s->start_ns + opts->usage_interval_s * 1000000000ull;
    *out = s;
    return KVD_OK;

fail:
    kvd_server_destroy(s);
    return rc;
}

void kvd_server_destroy(kvd_server_t *s)
{
    if (s == NULL)
        return;
    kvd_metrics_stop(s->metrics);
    /* leave first: the others stop sending lookups here at once */
    kvd_cluster_stop(s->cluster);
    kvd_cluster_view_free(&s->view);
    while (s->conns)
        conn_close(s, s->conns, "daemon exiting");
    free_dead(s);
    /* the peers' last callbacks find no connection to answer */
    kvd_peers_stop(s->peers);
    kvd_remote_destroy(s->remote);
    kvd_dirsvc_destroy(s->dirsvc);
    close_listeners(s);
    if (s->sig.fd >= 0)
        close(s->sig.fd);
    if (s->timer.fd >= 0)
        close(s->timer.fd);
    if (s->epfd >= 0)
        close(s->epfd);
    kvd_ucxd_stop(s->ucxd);
    kvd_store_destroy(s->store);
    kvd_auth_destroy(s->auth);
    kvd_nics_free(&s->nics);
    kvd_mem_free(KVD_MEM_OTHER, s, sizeof(*s));
}

static void log_usage(kvd_server_t *s, uint64_t now)
{
    kvd_stats_rep_t st;
    server_stats(s, &st);
    uint64_t calls = 0, errors = 0;
    for (size_t i = 0; i < KVD_METHOD_COUNT; i++) {
        calls += st.methods[i].calls;
        errors += st.methods[i].errors;
    }
    double secs = (double)(now - s->usage_prev_ns) / 1e9;
    double rate = secs > 0 ? (double)(calls - s->usage_prev_calls) / secs : 0.0;
    const kvd_store_stats_msg_t *ss = &st.store;
    double load_gbs =
        secs > 0 ? (double)(ss->acquired_bytes - s->usage_prev_acquired) / secs / 1e9 : 0;
    double offload_gbs =
        secs > 0 ? (double)(ss->published_bytes - s->usage_prev_published) / secs / 1e9
                 : 0;
    s->usage_prev_calls = calls;
    s->usage_prev_ns = now;
    s->usage_prev_acquired = ss->acquired_bytes;
    s->usage_prev_published = ss->published_bytes;
    uint64_t used = ss->pool_bytes - ss->free_bytes;
    char u[32], t[32], pin[32];
    KVD_INFO(
        "usage",
        "store: used %s of %s (%.1f%%), pinned %s, objects %llu ready %llu writing, "
        "hit rate %.1f%% (%llu of %llu pages), load %.2f GB/s, offload %.2f GB/s, "
        "%llu leases, %llu evictions, fragmentation %.2f",
        kvd_size_format(used, u, sizeof(u)),
        kvd_size_format(ss->pool_bytes, t, sizeof(t)),
        ss->pool_bytes ? 100.0 * (double)used / (double)ss->pool_bytes : 0.0,
        kvd_size_format(ss->pinned_bytes, pin, sizeof(pin)),
        (unsigned long long)ss->objects_ready, (unsigned long long)ss->objects_writing,
        ss->lookup_pages ? 100.0 * (double)ss->hit_pages / (double)ss->lookup_pages : 0.0,
        (unsigned long long)ss->hit_pages, (unsigned long long)ss->lookup_pages, load_gbs,
        offload_gbs, (unsigned long long)ss->leases, (unsigned long long)ss->evictions,
        ss->fragmentation);
    uint64_t ours = st.memory.conn_bytes + st.memory.index_bytes +
                    st.memory.staging_bytes + st.memory.other_bytes;
    char pool[32], pop[32], rss[32], shm[32], anon[32], own[32];
    KVD_INFO("usage",
             "%s: pool %s populated of %s (%.0f%%), connections %llu, rpc %llu "
             "calls (%.1f/s), %llu errors, %llu protocol errors, rss %s (shmem %s, "
             "anon %s; kvdock's own allocations %s)",
             kvd_health_name(st.state),
             kvd_size_format(st.memory.pool_populated_bytes, pop, sizeof(pop)),
             kvd_size_format(st.memory.pool_bytes, pool, sizeof(pool)),
             100.0 * (double)st.memory.pool_populated_bytes /
                 (double)st.memory.pool_bytes,
             (unsigned long long)st.connections_current, (unsigned long long)calls, rate,
             (unsigned long long)errors, (unsigned long long)st.protocol_errors,
             kvd_size_format(st.memory.rss_bytes, rss, sizeof(rss)),
             kvd_size_format(st.memory.rss_shmem_bytes, shm, sizeof(shm)),
             kvd_size_format(st.memory.rss_anon_bytes, anon, sizeof(anon)),
             kvd_size_format(ours, own, sizeof(own)));
}

static void start_drain(kvd_server_t *s, int signo)
{
    if (s->draining) {
        KVD_WARN("server", "second signal (%s): exiting now", strsignal(signo));
        s->drain_deadline_ns = 0;
        return;
    }
    s->draining = true;
    s->acq_kick = true; /* held Acquires are answered now */
    atomic_store(&s->health, KVD_HEALTH_DRAINING);
    metrics_publish(s);
    s->drain_deadline_ns = kvd_now_ns() + s->opts.drain_timeout_ms * 1000000ull;
    close_listeners(s);
    KVD_INFO("server",
             "%s: draining, no new connections; exiting when clients "
             "close or in %llu ms",
             strsignal(signo), (unsigned long long)s->opts.drain_timeout_ms);
}

static void pool_lost(void *arg, const kvd_pool_range_t *ranges, size_t n)
{
    kvd_server_t *s = arg;
    uint64_t lost = kvd_store_pool_lost_ranges(s->store, ranges, n);
    if (lost > 0)
        KVD_WARN("server",
                 "%llu objects lost their bytes in %zu ranges from %llu to %llu: dropped",
                 (unsigned long long)lost, n, (unsigned long long)ranges[0].offset,
                 (unsigned long long)(ranges[n - 1].offset + ranges[n - 1].bytes));
}

/* Bytes of the pool file a same-host writer destroyed (cut short, holes
 * punched): the file made whole again, the objects there dropped. */
static void pool_damage_check(kvd_server_t *s)
{
    kvd_pool_damage_check(s->pool, pool_lost, s);
}

/* Returns 0 to go on, 1 on a fatal pool error. */
static int on_tick(kvd_server_t *s)
{
    uint64_t expirations;
    ssize_t r = read(s->timer.fd, &expirations, sizeof(expirations));
    (void)r;
    uint64_t now = kvd_now_ns();
    if (s->accept_paused && !s->draining) {
        s->accept_paused = false;
        if (s->unix_listen.fd >= 0)
            watch(s, &s->unix_listen, EPOLLIN, EPOLL_CTL_MOD);
        if (s->tcp_listen.fd >= 0)
            watch(s, &s->tcp_listen, EPOLLIN, EPOLL_CTL_MOD);
    }
    int perr = kvd_pool_error(s->pool);
    if (perr != KVD_OK) {
        KVD_ERROR("server", "the pool could not be populated (%s: %s); exiting",
                  kvd_status_str(perr), kvd_pool_error_text(s->pool));
        return 1;
    }
    int ticked = s->ucxd != NULL && !s->draining ? kvd_ucxd_tick(s->ucxd, now) : 0;
    if (ticked > 0) {
        s->ucx_src = (src_t){SRC_UCX, kvd_ucxd_fd(s->ucxd)};
        watch(s, &s->ucx_src, EPOLLIN, EPOLL_CTL_ADD);
    } else if (ticked < 0) {
        s->ucx_src.fd = -1; /* closed: epoll forgot it */
    }
    conn_timeouts(s, now);
    pool_damage_check(s); /* one fstat; a change the watch raced */
    kvd_store_tier_poll(s->store, now / 1000000); /* reclaim, spills, checkpoints */
    size_t expired = kvd_store_expire(s->store, now / 1000000);
    if (expired > 0)
        ucx_windows_expired(s);
    if (expired > 0)
        KVD_WARN("server",
                 "%zu leases passed their TTL of %llu ms: reservations "
                 "revoked, pins released",
                 expired, (unsigned long long)s->opts.lease_ttl_ms);
    if (!s->draining && server_health(s) == KVD_HEALTH_STARTING &&
        kvd_pool_ready(s->pool)) {
        atomic_store(&s->health, KVD_HEALTH_READY);
        kvd_ucxd_pool_ready(s->ucxd);
        kvd_store_tier_pool_ready(s->store);
        char a[32];
        if (kvd_pool_attached(s->pool))
            KVD_INFO("server",
                     "ready: pool %s attached in %.2f s (its pages were all there; "
                     "they are mapped in the background), serving %s",
                     kvd_size_format(kvd_pool_size(s->pool), a, sizeof(a)),
                     (double)(now - s->start_ns) / 1e9, s->opts.socket_path);
        else
            KVD_INFO("server", "ready: pool %s populated in %.2f s, serving %s",
                     kvd_size_format(kvd_pool_size(s->pool), a, sizeof(a)),
                     (double)(now - s->start_ns) / 1e9, s->opts.socket_path);
    }
    if (s->opts.usage_interval_s > 0 && now >= s->next_usage_ns) {
        log_usage(s, now);
        s->next_usage_ns = now + s->opts.usage_interval_s * 1000000000ull;
    }
    if (s->cluster != NULL) {
        kvd_store_stats_t st;
        kvd_store_stats(s->store, &st);
        kvd_dirsvc_tick(s->dirsvc);
        kvd_cluster_set_load(s->cluster, st.objects_ready + st.ssd_objects,
                             kvd_dirsvc_entries(s->dirsvc));
    }
    metrics_publish(s);
    return 0;
}

/* One more turn for each connection whose frames outlasted its turn. */
static void serve_backlog(kvd_server_t *s)
{
    s->backlog = false;
    for (conn_t *c = s->conns, *next; c != NULL; c = next) {
        next = c->next;
        if (!c->backlog || c->dead)
            continue;
        c->backlog = false;
        conn_serve_buffered(s, c);
        conn_flush(s, c); /* may close c */
    }
}

int kvd_server_run(kvd_server_t *s)
{
    KVD_INFO("server", "serving %s (socket mode %04o, max %llu connections, %zu tokens)",
             s->opts.socket_path, (unsigned)s->socket_mode,
             (unsigned long long)s->opts.max_connections, kvd_auth_token_count(s->auth));
    struct epoll_event events[64];
    for (;;) {
        if (s->draining && (s->conns == NULL || kvd_now_ns() >= s->drain_deadline_ns))
            break;
        int n =
            epoll_wait(s->epfd, events, (int)KVD_ARRAY_SIZE(events), loop_timeout_ms(s));
        if (n < 0) {
            if (errno == EINTR)
                continue;
            KVD_ERROR("server", "epoll_wait: %s", strerror(errno));
            return 1;
        }
        for (int i = 0; i < n; i++) {
            src_t *src = events[i].data.ptr;
            switch (src->kind) {
            case SRC_UNIX_LISTEN:
            case SRC_TCP_LISTEN: accept_all(s, src); break;
            case SRC_SIGNAL: {
                struct signalfd_siginfo si;
                while (read(s->sig.fd, &si, sizeof(si)) == sizeof(si))
                    start_drain(s, (int)si.ssi_signo);
                break;
            }
            case SRC_TIMER:
                if (on_tick(s) != 0)
                    return 1;
                s->acq_kick = true; /* it polls the tier and ends leases */
                break;
            case SRC_TIER:
                kvd_store_tier_poll(s->store, kvd_now_ns() / 1000000);
                s->acq_kick = true;
                break;
            case SRC_POOL:
                kvd_pool_watch_drain(s->pool);
                pool_damage_check(s);
                break;
            case SRC_CLUSTER:
                on_cluster(s);
                s->acq_kick = true; /* a member gone: its fetches failed */
                break;
            case SRC_PEERS:
                kvd_peers_poll(s->peers); /* fetches completed or failed */
                s->acq_kick = true;
                break;
            case SRC_UCX:
                /* a restarted UCX server reports, or one died (reaped
                 * here; on_tick starts the next) */
                if (s->ucx_src.fd >= 0) {
                    int fd = s->ucx_src.fd;
                    if (kvd_ucxd_on_event(s->ucxd)) {
                        epoll_ctl(s->epfd, EPOLL_CTL_DEL, fd, NULL);
                        s->ucx_src.fd = -1;
                    }
                }
                break;
            case SRC_CONN: {
                conn_t *c = (conn_t *)src;
                uint32_t ev = events[i].events;
                if (c->dead)
                    break;
                if (ev & (EPOLLERR | EPOLLHUP) && !(ev & EPOLLIN))
                    conn_close(s, c, "hang-up");
                else if (ev & EPOLLIN)
                    conn_on_readable(s, c); /* flushes, may close c */
                else if (ev & EPOLLOUT)
                    conn_flush(s, c);
                break;
            }
            }
        }
        if (s->backlog)
            serve_backlog(s);
        acquire_waits_run(s);
        free_dead(s);
    }
    KVD_INFO("server", "drained: %s",
             s->conns ? "drain timeout, closing clients" : "all clients gone");
    return 0;
}
