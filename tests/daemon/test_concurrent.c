/*
 * Description: 64 clients at once, each on its own thread and connection:
 * Hello, then 200 Health and 5 Stats calls. Every call succeeds with the
 * reply's id matching its request (the client checks ids; this test checks
 * the reply's method and body as well), and afterwards Stats counts at least
 * 64 x 200 Health calls, 64 Hellos, 64 x 5 Stats calls and 64 connections.
 */
#include "dtest.h"

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N_CLIENTS  64
#define N_HEALTH   200
#define N_STATS    5
#define TIMEOUT_MS 10000

typedef struct worker {
    const char *socket;
    int index;
    int ok_health, ok_stats;
    uint64_t connection_id;
    char error[256];
} worker_t;

static void *worker_main(void *arg)
{
    worker_t *w = arg;
    kvd_client_t *c = NULL;
    int rc = kvd_client_connect_unix(w->socket, TIMEOUT_MS, &c);
    if (rc != KVD_OK) {
        snprintf(w->error, sizeof(w->error), "connect: %s", kvd_status_str(rc));
        return NULL;
    }
    char name[32];
    snprintf(name, sizeof(name), "concurrent-%d", w->index);
    kvd_hello_rep_t hello;
    rc = dt_hello(c, name, &hello, TIMEOUT_MS);
    if (rc != KVD_OK) {
        snprintf(w->error, sizeof(w->error), "hello: %s", kvd_status_str(rc));
        goto out;
    }
    w->connection_id = hello.connection_id;

    kvd_msg_t *req = malloc(2 * sizeof(kvd_msg_t));
    if (req == NULL)
        goto out;
    kvd_msg_t *rep = req + 1;
    memset(rep, 0, sizeof(*rep)); /* cleared below even when no call was made */
    for (int i = 0; i < N_HEALTH + N_STATS; i++) {
        /* interleave: a Stats call every 40 Health calls */
        kvd_method_t m = (i % 41 == 40) ? KVD_METHOD_STATS : KVD_METHOD_HEALTH;
        kvd_msg_request(req, 0, m);
        rc = kvd_client_call(c, req, rep, TIMEOUT_MS);
        if (rc != KVD_OK || rep->status != KVD_OK || rep->id != req->id ||
            rep->method != m || !rep->reply) {
            snprintf(
                w->error, sizeof(w->error),
                "call %d (%s): rc %s, status %d, id %llu for request %llu, method %d", i,
                kvd_method_name(m), kvd_status_str(rc), rep->status,
                (unsigned long long)rep->id, (unsigned long long)req->id, rep->method);
            break;
        }
        if (m == KVD_METHOD_HEALTH) {
            if (rep->body.health_rep.state != KVD_HEALTH_READY ||
                rep->body.health_rep.pool_bytes != DT_POOL_BYTES) {
                snprintf(w->error, sizeof(w->error), "health: state %d pool %llu",
                         rep->body.health_rep.state,
                         (unsigned long long)rep->body.health_rep.pool_bytes);
                break;
            }
            w->ok_health++;
        } else {
            if (rep->body.stats_rep.memory.pool_bytes != DT_POOL_BYTES ||
                rep->body.stats_rep.connections_current < 1) {
                snprintf(w->error, sizeof(w->error), "stats: pool %llu, current %llu",
                         (unsigned long long)rep->body.stats_rep.memory.pool_bytes,
                         (unsigned long long)rep->body.stats_rep.connections_current);
                break;
            }
            w->ok_stats++;
        }
        /* a Stats reply's tables live in its arena */
        kvd_msg_clear(rep);
    }
    kvd_msg_clear(rep);
    free(req);
out:
    kvd_client_close(c);
    return NULL;
}

static void run(const kvd_test_daemon_t *d)
{
    kvd_stats_rep_t before;
    int rc = dt_stats_fresh(d->socket, &before);
    if (!DT_CHECK(rc == KVD_OK, "Stats before: %s", kvd_status_str(rc)))
        return;

    static worker_t workers[N_CLIENTS];
    pthread_t threads[N_CLIENTS];
    bool started[N_CLIENTS] = {false};
    for (int i = 0; i < N_CLIENTS; i++) {
        workers[i] = (worker_t){.socket = d->socket, .index = i};
        started[i] =
            DT_CHECK(pthread_create(&threads[i], NULL, worker_main, &workers[i]) == 0,
                     "pthread_create %d", i);
    }
    int n_ok = 0;
    for (int i = 0; i < N_CLIENTS; i++) {
        if (!started[i])
            continue;
        pthread_join(threads[i], NULL);
        worker_t *w = &workers[i];
        if (DT_CHECK(w->error[0] == '\0', "client %d: %s", i, w->error) &&
            DT_CHECK(w->ok_health == N_HEALTH && w->ok_stats == N_STATS,
                     "client %d: %d health and %d stats calls, want %d and %d", i,
                     w->ok_health, w->ok_stats, N_HEALTH, N_STATS))
            n_ok++;
    }
    DT_CHECK(n_ok == N_CLIENTS, "%d of %d clients completed", n_ok, N_CLIENTS);
    /* every connection got its own id */
    for (int i = 0; i < N_CLIENTS; i++)
        for (int j = i + 1; j < N_CLIENTS; j++)
            DT_CHECK(workers[i].connection_id == 0 ||
                         workers[i].connection_id != workers[j].connection_id,
                     "clients %d and %d share connection id %llu", i, j,
                     (unsigned long long)workers[i].connection_id);

    kvd_stats_rep_t st;
    rc = dt_stats_fresh(d->socket, &st);
    if (!DT_CHECK(rc == KVD_OK, "Stats after: %s", kvd_status_str(rc)))
        return;
    uint64_t health = st.methods[KVD_METHOD_HEALTH].calls;
    uint64_t stats = st.methods[KVD_METHOD_STATS].calls;
    uint64_t hello = st.methods[KVD_METHOD_HELLO].calls;
    DT_CHECK(health >= (uint64_t)N_CLIENTS * N_HEALTH,
             "Stats: %llu health calls, want >= %d", (unsigned long long)health,
             N_CLIENTS * N_HEALTH);
    DT_CHECK(health - before.methods[KVD_METHOD_HEALTH].calls ==
                 (uint64_t)N_CLIENTS * N_HEALTH,
             "Stats: health calls grew by %llu during the run, want exactly %d",
             (unsigned long long)(health - before.methods[KVD_METHOD_HEALTH].calls),
             N_CLIENTS * N_HEALTH);
    DT_CHECK(stats >= (uint64_t)N_CLIENTS * N_STATS,
             "Stats: %llu stats calls, want >= %d", (unsigned long long)stats,
             N_CLIENTS * N_STATS);
    DT_CHECK(hello >= N_CLIENTS, "Stats: %llu hello calls, want >= %d",
             (unsigned long long)hello, N_CLIENTS);
    DT_CHECK(st.connections_total >= N_CLIENTS,
             "Stats: connections_total %llu, want >= %d",
             (unsigned long long)st.connections_total, N_CLIENTS);
    DT_CHECK(st.connections_total - before.connections_total >= N_CLIENTS,
             "Stats: connections_total grew by %llu, want >= %d",
             (unsigned long long)(st.connections_total - before.connections_total),
             N_CLIENTS);
    for (int m = KVD_METHOD_HELLO; m < KVD_METHOD_COUNT; m++)
        DT_CHECK(st.methods[m].errors == 0, "Stats: %llu errors for %s, want 0",
                 (unsigned long long)st.methods[m].errors,
                 kvd_method_name((kvd_method_t)m));
    DT_CHECK(st.protocol_errors == 0, "Stats: %llu protocol errors, want 0",
             (unsigned long long)st.protocol_errors);
}

int main(void)
{
    kvd_test_daemon_t d;
    if (dt_start(&d, NULL) == 0)
        run(&d);
    dt_stop(&d, SIGTERM, 10000);
    return dt_exit_status("daemon/concurrent");
}
