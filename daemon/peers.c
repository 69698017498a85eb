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

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#define PEERS_MAX    1024 /* peers one daemon keeps a queue and a connection for */
#define PEER_THREADS 4

typedef struct job {
    kvd_msg_t req;
    kvd_msg_t rep;
    int status;
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
};

static void job_free(job_t *j)
{
    kvd_msg_clear(&j->req);
    kvd_msg_clear(&j->rep);
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
            if (q->busy)
                q->closing = true;
            else if (q->c != NULL) {
                kvd_client_close(q->c);
                q->c = NULL;
            }
        }
        return q;
    }
    if (p->n_peers == PEERS_MAX)
        return NULL;
    peer_t *q = &p->peers[p->n_peers++];
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
        int rc = call(p, q, address, j);
        pthread_mutex_lock(&p->mu);
        q->busy = false;
        if (q->closing) {
            q->closing = false;
            kvd_client_close(q->c);
            q->c = NULL;
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
    }
    pthread_mutex_unlock(&p->mu);
    if (p->efd >= 0) {
        kvd_peers_poll(p);
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
        }
        break;
    }
    pthread_mutex_unlock(&p->mu);
}
