/*
 * peers.c - the requests of this daemon to its cluster's other daemons
 * (peers.h): one FIFO of jobs, one thread that calls, one list of ended
 * jobs that the loop's kvd_peers_poll finishes.
 *
 * Locks: `mu` guards the queue, the ended list and the close requests;
 * the thread holds it only to take or hand back a job, never across a
 * call. Connections belong to the thread alone.
 */
#include "peers.h"

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#define CONNS_MAX 1024 /* peers one daemon keeps a connection to */

typedef struct job {
    char node_id[KVD_NODE_ID_BYTES];
    char address[KVD_ADDR_BYTES];
    kvd_msg_t req;
    kvd_msg_t rep;
    int status;
    kvd_peer_done_fn fn;
    void *arg;
    struct job *next;
} job_t;

typedef struct conn {
    char node_id[KVD_NODE_ID_BYTES];
    char address[KVD_ADDR_BYTES];
    kvd_client_t *c;
} conn_t;

struct kvd_peers {
    char self_id[KVD_NODE_ID_BYTES];
    uint8_t token[KVD_TOKEN_MAX];
    size_t token_len;
    int timeout_ms;
    int efd;
    pthread_t thread;
    bool started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool stop;
    job_t *head, *tail; /* queued */
    job_t *ended;       /* for the loop (LIFO; each carries its own outcome) */
    /* node ids whose connection the thread closes before its next job */
    char closing[16][KVD_NODE_ID_BYTES];
    size_t n_closing;
    _Atomic size_t pending;
    /* the thread's */
    conn_t *conns;
    size_t n_conns;
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

static conn_t *conn_of(kvd_peers_t *p, const char *id, const char *address)
{
    for (size_t i = 0; i < p->n_conns; i++)
        if (strcmp(p->conns[i].node_id, id) == 0) {
            if (strcmp(p->conns[i].address, address) != 0) {
                /* it came back elsewhere: start over */
                kvd_client_close(p->conns[i].c);
                p->conns[i].c = NULL;
                kvd_strlcpy(p->conns[i].address, address, sizeof(p->conns[i].address));
            }
            return &p->conns[i];
        }
    if (p->n_conns == CONNS_MAX)
        return NULL;
    conn_t *c = &p->conns[p->n_conns++];
    memset(c, 0, sizeof(*c));
    kvd_strlcpy(c->node_id, id, sizeof(c->node_id));
    kvd_strlcpy(c->address, address, sizeof(c->address));
    return c;
}

static void conn_close_id(kvd_peers_t *p, const char *id)
{
    for (size_t i = 0; i < p->n_conns; i++)
        if (strcmp(p->conns[i].node_id, id) == 0) {
            kvd_client_close(p->conns[i].c);
            p->conns[i] = p->conns[--p->n_conns];
            return;
        }
}

/* One call on the peer's connection, opened (and said Hello on) first
 * when there is none; a failed call closes it, so the next job reopens. */
static int call(kvd_peers_t *p, job_t *j)
{
    conn_t *c = conn_of(p, j->node_id, j->address);
    if (c == NULL)
        return KVD_ERR_NO_SPACE;
    if (c->c == NULL) {
        char name[KVD_NAME_MAX];
        snprintf(name, sizeof(name), "kvdockd %s", p->self_id);
        bool refused = false;
        int rc = kvd_client_open(NULL, c->address, name, p->token, p->token_len,
                                 p->timeout_ms, &c->c, &refused, NULL);
        if (rc != KVD_OK) {
            c->c = NULL;
            return rc;
        }
    }
    int rc = kvd_client_call(c->c, &j->req, &j->rep, p->timeout_ms);
    if (rc != KVD_OK) {
        kvd_client_close(c->c);
        c->c = NULL;
    }
    return rc;
}

static void *peers_main(void *arg)
{
    kvd_peers_t *p = arg;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (p->n_closing > 0) {
            char id[KVD_NODE_ID_BYTES];
            kvd_strlcpy(id, p->closing[--p->n_closing], sizeof(id));
            pthread_mutex_unlock(&p->mu);
            conn_close_id(p, id);
            pthread_mutex_lock(&p->mu);
        }
        if (p->stop)
            break;
        job_t *j = p->head;
        if (j == NULL) {
            pthread_cond_wait(&p->cv, &p->mu);
            continue;
        }
        p->head = j->next;
        if (p->head == NULL)
            p->tail = NULL;
        pthread_mutex_unlock(&p->mu);
        int rc = call(p, j);
        pthread_mutex_lock(&p->mu);
        end_locked(p, j, rc);
    }
    /* what is still queued fails: the loop frees it in its last poll */
    while (p->head != NULL) {
        job_t *j = p->head;
        p->head = j->next;
        end_locked(p, j, KVD_ERR_DRAINING);
    }
    p->tail = NULL;
    pthread_mutex_unlock(&p->mu);
    for (size_t i = 0; i < p->n_conns; i++)
        kvd_client_close(p->conns[i].c);
    p->n_conns = 0;
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
    p->conns = kvd_mem_calloc(KVD_MEM_OTHER, CONNS_MAX, sizeof(*p->conns));
    p->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    kvd_strlcpy(p->self_id, self_id, sizeof(p->self_id));
    memcpy(p->token, token, token_len);
    p->token_len = token_len;
    p->timeout_ms = timeout_ms;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    if (p->conns == NULL || p->efd < 0 ||
        pthread_create(&p->thread, NULL, peers_main, p) != 0) {
        kvd_peers_stop(p);
        return KVD_ERR_NOMEM;
    }
    p->started = true;
    *out = p;
    return KVD_OK;
}

void kvd_peers_stop(kvd_peers_t *p)
{
    if (p == NULL)
        return;
    if (p->started) {
        pthread_mutex_lock(&p->mu);
        p->stop = true;
        pthread_cond_signal(&p->cv);
        pthread_mutex_unlock(&p->mu);
        pthread_join(p->thread, NULL);
        kvd_peers_poll(p); /* every callback runs once, failed ones too */
    }
    if (p->efd >= 0)
        close(p->efd);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    explicit_bzero(p->token, sizeof(p->token));
    if (p->conns != NULL)
        kvd_mem_free(KVD_MEM_OTHER, p->conns, CONNS_MAX * sizeof(*p->conns));
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
    kvd_strlcpy(j->node_id, node_id, sizeof(j->node_id));
    kvd_strlcpy(j->address, address, sizeof(j->address));
    j->req = *req;
    memset(req, 0, sizeof(*req));
    j->fn = fn;
    j->arg = arg;
    atomic_fetch_add(&p->pending, 1);
    pthread_mutex_lock(&p->mu);
    if (p->stop) {
        end_locked(p, j, KVD_ERR_DRAINING);
    } else {
        if (p->tail != NULL)
            p->tail->next = j;
        else
            p->head = j;
        p->tail = j;
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
    job_t **link = &p->head, *last = NULL;
    while (*link != NULL) {
        job_t *j = *link;
        if (strcmp(j->node_id, node_id) == 0) {
            *link = j->next;
            end_locked(p, j, KVD_ERR_DRAINING);
        } else {
            last = j;
            link = &j->next;
        }
    }
    p->tail = last;
    if (p->n_closing < KVD_ARRAY_SIZE(p->closing))
        kvd_strlcpy(p->closing[p->n_closing++], node_id, sizeof(p->closing[0]));
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);
}
