/*
 * Description: SIGTERM in the middle of load: 8 threads call Health and
 * Stats in loops (some on one long connection, some reconnecting for every
 * call; each bounded to 5 s and every call to a timeout) when the daemon
 * gets SIGTERM. Clients already connected are served through the drain
 * and see Health say "draining"; then the daemon exits 0, removes its socket file and
 * logs that it drained; the client threads see errors or EOF and all finish. SIGINT on an
 * idle daemon exits 0 the same way. The daemon's log has no sanitizer report either time.
 */
#include "dtest.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define N_THREADS       8
#define RUN_NS          (5ull * 1000000000ull)
#define CALL_TIMEOUT_MS 2000

typedef struct hammer {
    const char *socket;
    bool reconnect; /* a new connection for every call */
    _Atomic uint64_t *total_ok;
    _Atomic uint64_t ok;
    int last_error;    /* the status that ended the loop, 0 = ran out of time */
    bool saw_draining; /* a Health reply said "draining" */
    atomic_bool done;
} hammer_t;

static void *hammer_main(void *arg)
{
    hammer_t *h = arg;
    uint64_t end = kvd_now_ns() + RUN_NS;
    kvd_client_t *c = NULL;
    kvd_msg_t *req = malloc(2 * sizeof(kvd_msg_t));
    if (req == NULL) {
        h->last_error = KVD_ERR_NOMEM;
        atomic_store(&h->done, true);
        return NULL;
    }
    kvd_msg_t *rep = req + 1;
    for (uint64_t i = 0; kvd_now_ns() < end; i++) {
        int rc = KVD_OK;
        if (c == NULL) {
            rc = kvd_client_connect_unix(h->socket, CALL_TIMEOUT_MS, &c);
            if (rc == KVD_OK) /* nothing is served before a Hello */
                rc = kvd_client_hello(c, "sigterm-test", NULL, 0, CALL_TIMEOUT_MS, NULL);
        }
        if (rc == KVD_OK) {
            kvd_msg_request(req, 0, i % 4 == 3 ? KVD_METHOD_STATS : KVD_METHOD_HEALTH);
            rc = kvd_client_call(c, req, rep, CALL_TIMEOUT_MS);
            if (rc == KVD_OK && rep->status != KVD_OK)
                rc = rep->status;
        }
        if (rc != KVD_OK) {
            h->last_error = rc;
            break;
        }
        if (rep->method == KVD_METHOD_HEALTH &&
            rep->body.health_rep.state == KVD_HEALTH_DRAINING)
            h->saw_draining = true;
        atomic_fetch_add(&h->ok, 1);
        atomic_fetch_add(h->total_ok, 1);
        if (h->reconnect) {
            kvd_client_close(c);
            c = NULL;
        }
    }
    kvd_client_close(c);
    free(req);
    atomic_store(&h->done, true);
    return NULL;
}

static bool socket_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

/* Waits for the daemon's exit by pid; checks status 0. */
static bool wait_exit_0(kvd_test_daemon_t *d, const char *sig)
{
    int st = 0;
    if (!DT_CHECK(kvd_test_wait_pid(d->pid, 15000, &st) == 0,
                  "kvdockd did not exit within 15 s of %s", sig)) {
        kvd_dump_file(d->log);
        return false; /* dt_stop kills it */
    }
    d->pid = 0;
    if (!DT_CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0,
                  "after %s kvdockd exited with %s %d", sig,
                  WIFEXITED(st) ? "status" : "signal",
                  WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st)))
        kvd_dump_file(d->log);
    return true;
}

static void sigterm_under_load(void)
{
    kvd_test_daemon_t d;
    if (dt_start(&d, NULL) != 0) {
        dt_stop(&d, SIGKILL, 5000);
        return;
    }
    static hammer_t hs[N_THREADS];
    pthread_t th[N_THREADS];
    bool started[N_THREADS];
    _Atomic uint64_t total_ok = 0;
    for (int i = 0; i < N_THREADS; i++) {
        hs[i] = (hammer_t){
            .socket = d.socket, .reconnect = i % 2 == 1, .total_ok = &total_ok};
        started[i] = DT_CHECK(pthread_create(&th[i], NULL, hammer_main, &hs[i]) == 0,
                              "pthread_create");
    }
    /* let the load build up before the signal: every thread under way */
    uint64_t wait_end = kvd_now_ns() + 3000000000ull;
    for (int i = 0; i < N_THREADS && kvd_now_ns() < wait_end; i++)
        while (started[i] && atomic_load(&hs[i].ok) < 20 && !atomic_load(&hs[i].done) &&
               kvd_now_ns() < wait_end)
            kvd_sleep_ns(1000000);
    DT_CHECK(atomic_load(&total_ok) > 0, "no call succeeded before SIGTERM");

    DT_CHECK(kill(d.pid, SIGTERM) == 0, "kill(SIGTERM)");
    bool exited = wait_exit_0(&d, "SIGTERM");

    /* every thread finishes: bounded loops, bounded calls */
    uint64_t join_end = kvd_now_ns() + 20000000000ull;
    int n_done = 0;
    while (kvd_now_ns() < join_end) {
        n_done = 0;
        for (int i = 0; i < N_THREADS; i++)
            n_done += !started[i] || atomic_load(&hs[i].done);
        if (n_done == N_THREADS)
            break;
        kvd_sleep_ns(10000000);
    }
    if (!DT_CHECK(n_done == N_THREADS, "%d of %d client threads still hang",
                  N_THREADS - n_done, N_THREADS)) {
        dt_stop(&d, SIGKILL, 5000);
        exit(dt_exit_status("daemon/sigterm"));
    }
    int saw_error = 0, saw_draining = 0;
    for (int i = 0; i < N_THREADS; i++) {
        if (!started[i])
            continue;
        pthread_join(th[i], NULL);
        DT_CHECK(atomic_load(&hs[i].ok) > 0, "thread %d made no successful call", i);
        saw_draining += hs[i].saw_draining;
        if (hs[i].last_error != 0) {
            saw_error++;
            int e = hs[i].last_error;
            DT_CHECK(e == KVD_ERR_CLOSED || e == KVD_ERR_UNAVAILABLE ||
                         e == KVD_ERR_DRAINING || e == KVD_ERR_NOT_FOUND ||
                         e == KVD_ERR_TIMEOUT,
                     "thread %d ended on an unexpected status %d (%s)", i, e,
                     kvd_status_str(e));
        }
    }
    /* connected clients are served through the drain (--drain-timeout,
     * 1 s by default) and told the state */
    DT_CHECK(saw_draining > 0, "no client on a long connection saw Health say draining");
    /* the daemon was gone well before the 5 s loops ran out */
    DT_CHECK(saw_error == N_THREADS, "only %d of %d threads saw the daemon go away",
             saw_error, N_THREADS);

    if (exited) {
        DT_CHECK(!socket_exists(d.socket), "the socket %s is still there after the exit",
                 d.socket);
        DT_CHECK(kvd_test_file_contains(d.log, "draining"),
                 "the log should say draining");
        DT_CHECK(kvd_test_file_contains(d.log, "drained:"), "the log should say drained");
        DT_CHECK(kvd_test_file_contains(d.log, "exiting with status 0"),
                 "the log should end with 'exiting with status 0'");
        dt_check_log_clean(&d);
    }
    dt_stop(&d, SIGKILL, 5000);
}

static void sigint_idle(void)
{
    kvd_test_daemon_t d;
    if (dt_start(&d, NULL) != 0) {
        dt_stop(&d, SIGKILL, 5000);
        return;
    }
    DT_CHECK(kill(d.pid, SIGINT) == 0, "kill(SIGINT)");
    if (wait_exit_0(&d, "SIGINT")) {
        DT_CHECK(!socket_exists(d.socket), "the socket is still there after SIGINT");
        DT_CHECK(kvd_test_file_contains(d.log, "Interrupt: draining"),
                 "the log should say 'Interrupt: draining'");
        DT_CHECK(kvd_test_file_contains(d.log, "all clients gone"),
                 "an idle daemon should drain with 'all clients gone'");
        dt_check_log_clean(&d);
    }
    dt_stop(&d, SIGKILL, 5000);
}

int main(void)
{
    sigterm_under_load();
    sigint_idle();
    return dt_exit_status("daemon/sigterm");
}
