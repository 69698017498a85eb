/*
 * peers.c - the requests of this daemon to its cluster's other daemons
 * (peers.h): a FIFO of jobs per peer, PEER_THREADS threads that call, one
 * list of ended jobs that the loop's kvd_peers_poll finishes.
 *
 * A peer is served by one thread at a time (busy), which keeps its
 * requests in order and its connection single-threaded; the other threads
 * serve the other peers meanwhile, so one peer that hangs until the
 * timeout delays only its own requests.
 *
 * Locks: `mu` guards every queue, the ended list and each peer's busy and
 * closing flags; a thread holds it only to take or hand back a job, never
 * across a call. A peer's connection belongs to the thread that holds the
 * peer busy (or, when none does, to whoever holds mu).
 */
#include "peers.h"
#include "kvd_transport.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#define PEERS_MAX        1024 /* peers one daemon keeps a queue and a connection for */
#define PEER_THREADS     4
#define PEER_UCX_RETRY_S 10 /* a peer without UCX: asked again after this */

typedef struct job {
    kvd_msg_t req;
    kvd_msg_t rep;
    int status;
    /* a read (kvd_peers_read): where each key goes in the pool */
    bool read;
    uint64_t *local;
    size_t n_keys;
    uint64_t object_bytes;
    kvd_peer_done_fn fn;
    void *arg;
    struct job *next;
} job_t;

typedef struct peer {
    char node_id[KVD_NODE_ID_BYTES];
    char address[KVD_ADDR_BYTES];
    kvd_client_t *c;
    job_t *head, *tail;
    bool busy;    /* a thread is calling it */
    bool closing; /* close its connection when the call in flight ends */
    /* the data path (reads): a connection whose Hello asked for UCX, the
     * transport connected to the peer's UCX server, the bytes its peer
     * description points into */
    kvd_client_t *dc;
    kvd_transport_t *t;
    kvd_region_t *region;
    uint8_t *ucx_bytes;
    uint64_t no_ucx_until_ns; /* the peer said it serves no UCX */
} peer_t;

struct kvd_peers {
    char self_id[KVD_NODE_ID_BYTES];
    uint8_t token[KVD_TOKEN_MAX];
    size_t token_len;
    int timeout_ms;
    int efd;
    pthread_t threads[PEER_THREADS];
    size_t n_threads;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool stop;
    peer_t *peers; /* PEERS_MAX */
    size_t n_peers;
    size_t next;  /* where the threads look first: fairness across peers */
    job_t *ended; /* for the loop (LIFO; poll reverses it) */
    _Atomic size_t pending;
    void *pool; /* this daemon's pool, where reads land (NULL: no reads) */
    uint64_t pool_bytes;
    _Atomic uint64_t ucx_bytes;
};

static void job_free(job_t *j)
{
    kvd_msg_clear(&j->req);
    kvd_msg_clear(&j->rep);
    if (j->local != NULL)
        kvd_mem_free(KVD_MEM_OTHER, j->local, (j->n_keys + 1) * sizeof(uint64_t));
    kvd_mem_free(KVD_MEM_OTHER, j, sizeof(*j));
}

/* Hands an ended job to the loop. Called with mu held. */
static void end_locked(kvd_peers_t *p, job_t *j, int status)
{
    j->status = status;
    j->next = p->ended;
    p->ended = j;
    uint64_t one = 1;
    ssize_t w = write(p->efd, &one, sizeof(one));
    (void)w;
}

static void data_close(peer_t *q);

/* The peer of node_id (made when missing; NULL when the table is full).
 * Called with mu held. */
static peer_t *peer_of(kvd_peers_t *p, const char *id, const char *address)
{
    for (size_t i = 0; i < p->n_peers; i++) {
        peer_t *q = &p->peers[i];
        if (strcmp(q->node_id, id) != 0)
            continue;
        if (strcmp(q->address, address) != 0) {
            /* it came back elsewhere: the next call reconnects */
            kvd_strlcpy(q->address, address, sizeof(q->address));
            if (q->busy) {
                q->closing = true;
            } else {
                kvd_client_close(q->c);
                q->c = NULL;
                data_close(q); /* its reads go to the new address too */
            }
        }
        return q;
    }
    /* a slot a forgotten peer left, else a new one */
    peer_t *q = NULL;
    for (size_t i = 0; i < p->n_peers && q == NULL; i++)
        if (p->peers[i].node_id[0] == '\0' && !p->peers[i].busy &&
            p->peers[i].head == NULL)
            q = &p->peers[i];
    if (q == NULL && p->n_peers == PEERS_MAX)
        return NULL;
    if (q == NULL)
        q = &p->peers[p->n_peers++];
    memset(q, 0, sizeof(*q));
    kvd_strlcpy(q->node_id, id, sizeof(q->node_id));
    kvd_strlcpy(q->address, address, sizeof(q->address));
    return q;
}

/* One call on the peer's connection, opened (with Hello) first when there
 * is none; a failed call closes it, so the next job reopens. The caller
 * holds the peer busy. */
static int call(kvd_peers_t *p, peer_t *q, char *address, job_t *j)
{
    if (q->c == NULL) {
        char name[KVD_NAME_MAX];
        snprintf(name, sizeof(name), "kvdockd %s", p->self_id);
        bool refused = false;
        int rc = kvd_client_open(NULL, address, name, p->token, p->token_len,
                                 p->timeout_ms, &q->c, &refused, NULL);
        if (rc != KVD_OK) {
            q->c = NULL;
            return rc;
        }
    }
    int rc = kvd_client_call(q->c, &j->req, &j->rep, p->timeout_ms);
    if (rc != KVD_OK) {
        kvd_client_close(q->c);
        q->c = NULL;
    }
    return rc;
}

/* Drops a peer's data path (its transport first: then nothing of it
 * touches the pool). The caller holds the peer busy, or mu with no thread
 * on it. */
static void data_close(peer_t *q)
{
    if (q->t != NULL) {
        kvd_transport_destroy(q->t); /* disconnects and deregisters */
        q->t = NULL;
        q->region = NULL;
    }
    kvd_client_close(q->dc);
    q->dc = NULL;
    free(q->ucx_bytes);
    q->ucx_bytes = NULL;
}

/* Opens the peer's data path when there is none: a read-only Hello that
 * asks for UCX, a message-mode transport with the pool registered, a
 * connect to the peer's UCX server. KVD_ERR_UNSUPPORTED when the peer
 * serves no UCX (or this process cannot start it). */
static int data_open(kvd_peers_t *p, peer_t *q, const char *address)
{
    if (q->t != NULL && q->dc != NULL)
        return KVD_OK;
    data_close(q);
    if (kvd_now_ns() < q->no_ucx_until_ns)
        return KVD_ERR_UNSUPPORTED;
    int rc = kvd_client_connect_tcp(address, p->timeout_ms, &q->dc);
    if (rc != KVD_OK) {
        q->dc = NULL;
        return rc;
    }
    kvd_msg_t req, rep = {0};
    kvd_msg_request(&req, 0, KVD_METHOD_HELLO);
    kvd_hello_req_t *h = &req.body.hello_req;
    snprintf(h->client_name, sizeof(h->client_name), "kvdockd %s (reads)", p->self_id);
    h->pid = (uint32_t)getpid();
    h->protocol_version = KVD_PROTOCOL_VERSION;
    memcpy(h->auth_token, p->token, p->token_len);
    h->auth_token_len = p->token_len;
    h->want_ucx = true;
    h->read_only = true; /* a reader: its UCX grant cannot write the peer's pool */
    rc = kvd_client_call(q->dc, &req, &rep, p->timeout_ms);
    explicit_bzero(h->auth_token, sizeof(h->auth_token));
    if (rc == KVD_OK)
        rc = rep.status;
    const kvd_hello_rep_t *hr = &rep.body.hello_rep;
    if (rc == KVD_OK &&
        (hr->ucx_address_len == 0 || hr->ucx_token_len != KVD_UCX_CAP_BYTES))
        rc = KVD_ERR_UNSUPPORTED;
    if (rc == KVD_ERR_UNSUPPORTED)
        q->no_ucx_until_ns = kvd_now_ns() + PEER_UCX_RETRY_S * 1000000000ull;
    if (rc == KVD_OK) {
        q->ucx_bytes = malloc(hr->ucx_address_len + hr->ucx_token_len);
        rc = q->ucx_bytes ? KVD_OK : KVD_ERR_NOMEM;
    }
    if (rc == KVD_OK) {
        memcpy(q->ucx_bytes, hr->ucx_address, hr->ucx_address_len);
        memcpy(q->ucx_bytes + hr->ucx_address_len, hr->ucx_token, hr->ucx_token_len);
        kvd_peer_t desc = {.length = hr->pool_bytes, .connect_timeout_ms = p->timeout_ms};
        desc.ucx.address = q->ucx_bytes;
        desc.ucx.address_len = hr->ucx_address_len;
        desc.ucx.mode = KVD_UCX_MODE_AM;
        desc.ucx.cap = q->ucx_bytes + hr->ucx_address_len;
        desc.ucx.cap_len = hr->ucx_token_len;
        char name[KVD_NAME_MAX];
        snprintf(name, sizeof(name), "kvdockd-reads-%s", q->node_id);
        rc = kvd_transport_open_ucx_mode(name, KVD_UCX_MODE_AM, &q->t);
        if (rc != KVD_OK) {
            q->t = NULL;
            rc = KVD_ERR_UNSUPPORTED; /* UCX does not start here */
        }
        if (rc == KVD_OK)
            rc = kvd_transport_register(q->t, p->pool, p->pool_bytes, kvd_memkind_host(),
                                        &q->region);
        if (rc == KVD_OK)
            rc = kvd_transport_connect(q->t, &desc);
    }
    kvd_msg_clear(&rep);
    if (rc != KVD_OK)
        data_close(q);
    return rc;
}

/* A read: the pin, the UCX read of what it pinned, the release. Leaves the
 * pin reply in j->rep. The caller holds the peer busy. */
static int read_job(kvd_peers_t *p, peer_t *q, const char *address, job_t *j)
{
    int rc = data_open(p, q, address);
    if (rc != KVD_OK)
        return rc;
    rc = kvd_client_call(q->dc, &j->req, &j->rep, p->timeout_ms);
    if (rc != KVD_OK) {
        data_close(q);
        return rc;
    }
    if (j->rep.status != KVD_OK)
        return KVD_OK; /* the peer's answer says what was wrong */
    kvd_fetch_rep_t *f = &j->rep.body.fetch_rep;
    if (f->n != j->n_keys || f->n_offsets != f->n_depths ||
        (f->n_offsets > 0 && f->object_bytes != j->object_bytes))
        rc = KVD_ERR_PROTOCOL;
    kvd_xfer_t *x = rc == KVD_OK ? calloc(f->n_offsets + 1, sizeof(*x)) : NULL;
    size_t nx = 0;
    for (size_t i = 0, k = 0; x != NULL && i < f->n; i++) {
        if (f->present[i] != KVD_FETCH_HERE)
            continue;
        uint64_t remote = f->offsets[k++];
        if (j->local[i] == UINT64_MAX)
            continue; /* pinned for nothing: not wanted here after all */
        x[nx++] = (kvd_xfer_t){q->region, j->local[i], remote, j->object_bytes};
    }
    if (rc == KVD_OK && x == NULL)
        rc = KVD_ERR_NOMEM;
    if (rc == KVD_OK && nx > 0) {
        rc = kvd_transport_post(q->t, KVD_XFER_READ, x, nx, 1);
        /* the bytes at 50 MB/s beside the timeout: a slow link is no dead peer */
        uint64_t ms = (uint64_t)p->timeout_ms + nx * j->object_bytes / 50000u;
        if (rc == KVD_OK)
            rc = kvd_transport_wait(q->t, 1, (int)KVD_MIN(ms, (uint64_t)INT32_MAX), NULL,
                                    NULL, 0);
        if (rc == KVD_OK)
            atomic_fetch_add(&p->ucx_bytes, nx * j->object_bytes);
    }
    free(x);
    if (f->lease_id != 0) {
        /* a release that fails leaves the lease to end with the connection */
        kvd_msg_t rel, rrep;
        kvd_msg_request(&rel, 0, KVD_METHOD_RELEASE);
        rel.body.release_req.lease_id = f->lease_id;
        kvd_client_call(q->dc, &rel, &rrep, p->timeout_ms);
        kvd_msg_clear(&rrep);
    }
    if (rc != KVD_OK)
        data_close(q); /* a read that did not end: nothing of it may land later */
    return rc;
}

/* A peer with a job and no thread on it, round-robin; NULL when none.
 * Called with mu held. */
static peer_t *next_peer(kvd_peers_t *p)
{
    for (size_t k = 0; k < p->n_peers; k++) {
        size_t i = (p->next + k) % p->n_peers;
        if (p->peers[i].head != NULL && !p->peers[i].busy) {
            p->next = i + 1;
            return &p->peers[i];
        }
    }
    return NULL;
}

static void *peers_main(void *arg)
{
    kvd_peers_t *p = arg;
    pthread_mutex_lock(&p->mu);
    while (!p->stop) {
        peer_t *q = next_peer(p);
        if (q == NULL) {
            pthread_cond_wait(&p->cv, &p->mu);
            continue;
        }
        job_t *j = q->head;
        q->head = j->next;
        if (q->head == NULL)
            q->tail = NULL;
        q->busy = true;
        char address[KVD_ADDR_BYTES];
        kvd_strlcpy(address, q->address, sizeof(address));
        pthread_mutex_unlock(&p->mu);
        int rc = j->read ? read_job(p, q, address, j) : call(p, q, address, j);
        pthread_mutex_lock(&p->mu);
        q->busy = false;
        if (q->closing) {
            q->closing = false;
            kvd_client_close(q->c);
            q->c = NULL;
            data_close(q);
        }
        end_locked(p, j, rc);
        pthread_cond_broadcast(&p->cv); /* its next job may go now */
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

int kvd_peers_start(const char *self_id, const uint8_t *token, size_t token_len,
                    int timeout_ms, kvd_peers_t **out)
{
    if (token_len > KVD_TOKEN_MAX)
        return KVD_ERR_TOO_LARGE;
    kvd_peers_t *p = kvd_mem_calloc(KVD_MEM_OTHER, 1, sizeof(*p));
    if (p == NULL)
        return KVD_ERR_NOMEM;
    p->peers = kvd_mem_calloc(KVD_MEM_OTHER, PEERS_MAX, sizeof(*p->peers));
    p->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    kvd_strlcpy(p->self_id, self_id, sizeof(p->self_id));
    memcpy(p->token, token, token_len);
    p->token_len = token_len;
    p->timeout_ms = timeout_ms;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    bool ok = p->peers != NULL && p->efd >= 0;
    for (size_t i = 0; ok && i < PEER_THREADS; i++) {
        ok = pthread_create(&p->threads[i], NULL, peers_main, p) == 0;
        p->n_threads += ok;
    }
    if (!ok) {
        kvd_peers_stop(p);
        return KVD_ERR_NOMEM;
    }
    *out = p;
    return KVD_OK;
}

void kvd_peers_stop(kvd_peers_t *p)
{
    if (p == NULL)
        return;
    pthread_mutex_lock(&p->mu);
    p->stop = true;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    for (size_t i = 0; i < p->n_threads; i++)
        pthread_join(p->threads[i], NULL);
    /* what is still queued fails; every callback runs once */
    pthread_mutex_lock(&p->mu);
    for (size_t i = 0; p->peers != NULL && i < p->n_peers; i++) {
        peer_t *q = &p->peers[i];
        while (q->head != NULL) {
            job_t *j = q->head;
            q->head = j->next;
            end_locked(p, j, KVD_ERR_DRAINING);
        }
        kvd_client_close(q->c);
        q->c = NULL;
        data_close(q);
    }
    pthread_mutex_unlock(&p->mu);
    if (p->efd >= 0) {
        /* a callback may queue more (a fallback to the RPC): it ends at
         * once, failed, and is finished here too */
        for (;;) {
            pthread_mutex_lock(&p->mu);
            bool more = p->ended != NULL;
            pthread_mutex_unlock(&p->mu);
            if (!more)
                break;
            kvd_peers_poll(p);
        }
        close(p->efd);
    }
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    explicit_bzero(p->token, sizeof(p->token));
    if (p->peers != NULL)
        kvd_mem_free(KVD_MEM_OTHER, p->peers, PEERS_MAX * sizeof(*p->peers));
    kvd_mem_free(KVD_MEM_OTHER, p, sizeof(*p));
}

int kvd_peers_fd(const kvd_peers_t *p)
{
    return p->efd;
}

size_t kvd_peers_pending(const kvd_peers_t *p)
{
    return atomic_load(&p->pending);
}

static int enqueue(kvd_peers_t *p, const char *node_id, const char *address, job_t *j);

int kvd_peers_send(kvd_peers_t *p, const char *node_id, const char *address,
                   kvd_msg_t *req, kvd_peer_done_fn fn, void *arg)
{
    job_t *j = kvd_mem_calloc(KVD_MEM_OTHER, 1, sizeof(*j));
    if (j == NULL) {
        kvd_msg_clear(req);
        return KVD_ERR_NOMEM;
    }
    j->req = *req;
    memset(req, 0, sizeof(*req));
    j->fn = fn;
    j->arg = arg;
    return enqueue(p, node_id, address, j);
}

int kvd_peers_set_pool(kvd_peers_t *p, void *base, uint64_t bytes)
{
    if (base == NULL || bytes == 0)
        return KVD_ERR_INVALID;
    pthread_mutex_lock(&p->mu);
    p->pool = base;
    p->pool_bytes = bytes;
    pthread_mutex_unlock(&p->mu);
    return KVD_OK;
}

uint64_t kvd_peers_ucx_bytes(const kvd_peers_t *p)
{
    return atomic_load(&p->ucx_bytes);
}

int kvd_peers_read(kvd_peers_t *p, const char *node_id, const char *address,
                   kvd_msg_t *req, const uint64_t *local, size_t n, uint64_t object_bytes,
                   kvd_peer_done_fn fn, void *arg)
{
    if (p->pool == NULL) {
        kvd_msg_clear(req);
        return KVD_ERR_UNSUPPORTED;
    }
    job_t *j = kvd_mem_calloc(KVD_MEM_OTHER, 1, sizeof(*j));
    uint64_t *l = kvd_mem_calloc(KVD_MEM_OTHER, n + 1, sizeof(uint64_t));
    if (j == NULL || l == NULL) {
        kvd_mem_free(KVD_MEM_OTHER, j, sizeof(*j));
        kvd_mem_free(KVD_MEM_OTHER, l, (n + 1) * sizeof(uint64_t));
        kvd_msg_clear(req);
        return KVD_ERR_NOMEM;
    }
    memcpy(l, local, n * sizeof(uint64_t));
    j->req = *req;
    memset(req, 0, sizeof(*req));
    j->read = true;
    j->local = l;
    j->n_keys = n;
    j->object_bytes = object_bytes;
    j->fn = fn;
    j->arg = arg;
    return enqueue(p, node_id, address, j);
}

static int enqueue(kvd_peers_t *p, const char *node_id, const char *address, job_t *j)
{
    atomic_fetch_add(&p->pending, 1);
    pthread_mutex_lock(&p->mu);
    peer_t *q = p->stop ? NULL : peer_of(p, node_id, address);
    if (q == NULL) {
        end_locked(p, j, p->stop ? KVD_ERR_DRAINING : KVD_ERR_NO_SPACE);
    } else {
        if (q->tail != NULL)
            q->tail->next = j;
        else
            q->head = j;
        q->tail = j;
        pthread_cond_signal(&p->cv);
    }
    pthread_mutex_unlock(&p->mu);
    return KVD_OK;
}

void kvd_peers_poll(kvd_peers_t *p)
{
    uint64_t v;
    ssize_t r = read(p->efd, &v, sizeof(v));
    (void)r;
    pthread_mutex_lock(&p->mu);
    job_t *list = p->ended;
    p->ended = NULL;
    pthread_mutex_unlock(&p->mu);
    /* ended in reverse; callbacks in the order the jobs ended */
    job_t *fwd = NULL;
    while (list != NULL) {
        job_t *n = list->next;
        list->next = fwd;
        fwd = list;
        list = n;
    }
    while (fwd != NULL) {
        job_t *j = fwd;
        fwd = j->next;
        atomic_fetch_sub(&p->pending, 1);
        if (j->fn != NULL)
            j->fn(j->arg, j->status, j->status == KVD_OK ? &j->rep : NULL);
        job_free(j);
    }
}

void kvd_peers_forget(kvd_peers_t *p, const char *node_id)
{
    pthread_mutex_lock(&p->mu);
    for (size_t i = 0; i < p->n_peers; i++) {
        peer_t *q = &p->peers[i];
        if (strcmp(q->node_id, node_id) != 0)
            continue;
        while (q->head != NULL) {
            job_t *j = q->head;
            q->head = j->next;
            end_locked(p, j, KVD_ERR_DRAINING);
        }
        q->tail = NULL;
        if (q->busy) {
            q->closing = true;
        } else {
            kvd_client_close(q->c);
            q->c = NULL;
            data_close(q);
            q->node_id[0] = '\0'; /* the slot is free for another peer */
        }
        break;
    }
    pthread_mutex_unlock(&p->mu);
}
