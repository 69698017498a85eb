/*
 * Description: a rate-bounded population is visible from outside.
 * --pool-size 256M --populate-rate 64M takes about four seconds to fill;
 * right after the start Health answers "starting" with populated_bytes
 * below pool_bytes, `kvdock health` exits 3 then (and --json says
 * "starting"), populated_bytes never goes down, and within 30 s the daemon
 * becomes "ready" with the whole pool populated; `kvdock health` then exits
 * 0. /healthz follows: 503 "starting", then 200 "ready". The log has the progress lines
 * ("populated ... of 256.00 MiB") and the ready line.
 */
#include "dtest.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define POOL_BYTES (256ull * 1024 * 1024)

static char out[1 << 16];
static char body[1 << 20];

static void run(const kvd_test_daemon_t *d, int metrics_port)
{
    /* the socket appears once the pool is mapped; Health answers from then */
    kvd_health_rep_t h = {0};
    int st = -1;
    uint64_t deadline = kvd_now_ns() + 30000000000ull;
    while (kvd_now_ns() < deadline && kill(d->pid, 0) == 0) {
        st = dt_health_fresh(d->socket, &h);
        if (st >= 0)
            break;
        kvd_sleep_ns(5000000);
    }
    if (!DT_CHECK(st >= 0, "kvdockd never answered Health"))
        return;
    DT_CHECK(st == KVD_HEALTH_STARTING, "the first Health said %s, want starting",
             kvd_health_name((kvd_health_t)st));
    DT_CHECK(h.pool_bytes == POOL_BYTES, "Health pool_bytes %llu, want %llu",
             (unsigned long long)h.pool_bytes, POOL_BYTES);
    DT_CHECK(h.populated_bytes < h.pool_bytes,
             "while starting, populated_bytes %llu should be below pool_bytes %llu",
             (unsigned long long)h.populated_bytes, (unsigned long long)h.pool_bytes);

    int rc =
        dt_cli(out, sizeof(out), (const char *[]){"--socket", d->socket, "health", NULL});
    DT_CHECK(rc == 3, "kvdock health while starting: exit %d, want 3 ('%s')", rc, out);
    DT_CHECK(strncmp(out, "starting", 8) == 0,
             "kvdock health while starting printed '%s'", out);
    rc = dt_cli(out, sizeof(out),
                (const char *[]){"--socket", d->socket, "health", "--json", NULL});
    DT_CHECK(rc == 3 && strstr(out, "\"state\":\"starting\"") != NULL,
             "kvdock health --json while starting: exit %d, '%s'", rc, out);

    int code = dt_http_get(metrics_port, "/healthz", body, sizeof(body), 10000);
    DT_CHECK(code == 503 && strncmp(body, "starting", 8) == 0,
             "GET /healthz while starting: %d '%s', want 503 'starting'", code, body);
    code = dt_http_get(metrics_port, "/metrics", body, sizeof(body), 10000);
    DT_CHECK(code == 200 && strstr(body, "kvdock_health_state{state=\"starting\"} 1") &&
                 strstr(body, "\nkvdock_pool_bytes 268435456\n"),
             "GET /metrics while starting: %d, should show state starting and the pool",
             code);

    /* then ready, with progress that never goes back */
    uint64_t last = h.populated_bytes;
    int starting_seen = 1;
    deadline = kvd_now_ns() + 30000000000ull;
    while (kvd_now_ns() < deadline) {
        st = dt_health_fresh(d->socket, &h);
        if (!DT_CHECK(st >= 0, "Health failed while populating"))
            return;
        DT_CHECK(h.populated_bytes >= last, "populated_bytes went down: %llu after %llu",
                 (unsigned long long)h.populated_bytes, (unsigned long long)last);
        last = h.populated_bytes;
        if (st == KVD_HEALTH_READY)
            break;
        DT_CHECK(st == KVD_HEALTH_STARTING, "Health said %s while populating",
                 kvd_health_name((kvd_health_t)st));
        starting_seen++;
        kvd_sleep_ns(50000000);
    }
    if (!DT_CHECK(st == KVD_HEALTH_READY,
                  "not ready within 30 s (populated %llu of %llu)",
                  (unsigned long long)h.populated_bytes, POOL_BYTES))
        return;
    DT_CHECK(h.populated_bytes == POOL_BYTES, "ready with %llu of %llu populated",
             (unsigned long long)h.populated_bytes, POOL_BYTES);
    rc =
        dt_cli(out, sizeof(out), (const char *[]){"--socket", d->socket, "health", NULL});
    DT_CHECK(rc == 0 && strncmp(out, "ready", 5) == 0,
             "kvdock health once ready: exit %d, '%s'", rc, out);
    printf("Health said starting %d times before ready\n", starting_seen);
    code = dt_http_get(metrics_port, "/healthz", body, sizeof(body), 10000);
    DT_CHECK(code == 200 && strncmp(body, "ready", 5) == 0,
             "GET /healthz once ready: %d '%s', want 200 'ready'", code, body);

    DT_CHECK(kvd_test_file_contains(d->log, "populated 64.00 MiB of 256.00 MiB (25%)"),
             "the log should have the first progress line (25%%)");
    DT_CHECK(kvd_test_file_contains(d->log, "populated 256.00 MiB of 256.00 MiB (100%)"),
             "the log should have the last progress line (100%%)");
    DT_CHECK(kvd_test_file_contains(d->log, "ready: pool 256.00 MiB populated"),
             "the log should have the ready line");
}

/* Starts the daemon without waiting for ready; retries when the metrics
 * port was taken in the meantime (the daemon then exits at once). */
static int start(kvd_test_daemon_t *d)
{
    for (int attempt = 0; attempt < 5; attempt++) {
        int port = dt_free_port();
        char listen[64];
        snprintf(listen, sizeof(listen), "127.0.0.1:%d", port);
        const char *args[] = {"--pool-size",
                              "256M",
                              "--populate-rate",
                              "64M",
                              "--usage-interval",
                              "0",
                              "--metrics-listen",
                              listen,
                              NULL};
        if (port <= 0 || kvd_test_daemon_start(d, args, false, 0) != 0)
            continue;
        /* up once Health answers (the metrics endpoint starts before the
         * loop serves), gone if it exited */
        for (int i = 0; i < 6000; i++) {
            int st;
            if (kvd_test_wait_pid(d->pid, 0, &st) == 0) {
                d->pid = 0;
                break;
            }
            if (dt_health_fresh(d->socket, NULL) >= 0)
                return port;
            kvd_sleep_ns(5000000);
        }
        fprintf(stderr, "kvdockd with --metrics-listen %s did not come up; retrying\n",
                listen);
        kvd_test_daemon_stop(d, SIGKILL, 5000, NULL);
    }
    return -1;
}

int main(void)
{
    kvd_test_daemon_t d = {0};
    int port = start(&d);
    if (DT_CHECK(port > 0, "cannot start kvdockd"))
        run(&d, port);
    dt_stop(&d, SIGTERM, 10000);
    return dt_exit_status("daemon/populate");
}
