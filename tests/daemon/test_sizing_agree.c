/*
 * Description: the three places that report the pool's size agree with
 * --pool-size 96M = 100663296 bytes: the startup "sizing:" log line, Stats
 * (memory.pool_bytes through `kvdock stats --json`) and GET /metrics
 * (kvdock_pool_bytes). Also: /healthz answers 200 "ready", an unknown path
 * 404, and the startup log has the population progress lines and the
 * "ready" line.
 */
#include "dtest.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define POOL_BYTES 100663296ull /* 96 MiB */

static char out[1 << 16];
static char body[1 << 20];

/* The line of `log` that contains every needle, copied into line. */
static bool find_line(const char *log, const char *a, const char *b, char *line,
                      size_t len)
{
    for (const char *p = log; p && *p;) {
        const char *nl = strchr(p, '\n');
        size_t n = nl ? (size_t)(nl - p) : strlen(p);
        char tmp[4096];
        kvd_strlcpy(tmp, p, KVD_MIN(n + 1, sizeof(tmp)));
        if (strstr(tmp, a) && (b == NULL || strstr(tmp, b))) {
            kvd_strlcpy(line, tmp, len);
            return true;
        }
        p = nl ? nl + 1 : NULL;
    }
    return false;
}

static void check_log(const kvd_test_daemon_t *d)
{
    char *log = dt_read_file(d->log);
    if (!DT_CHECK(log != NULL, "cannot read %s", d->log))
        return;
    char line[4096];
    if (DT_CHECK(find_line(log, "sizing:", "budget=", line, sizeof(line)),
                 "no startup line with \"sizing:\" and \"budget=\"")) {
        DT_CHECK(strstr(line, "(100663296 bytes)") != NULL,
                 "the sizing line should name 100663296 bytes: %s", line);
        DT_CHECK(strstr(line, "source=pool-size") != NULL,
                 "the sizing line should say source=pool-size: %s", line);
        DT_CHECK(strstr(line, "budget=96.00 MiB") != NULL,
                 "the sizing line should say budget=96.00 MiB: %s", line);
    }
    DT_CHECK(find_line(log, "populated ", "(100%)", line, sizeof(line)) &&
                 strstr(line, "of 96.00 MiB") != NULL,
             "no population progress line reaching 100%% of 96.00 MiB");
    /* 96 MiB in 64 MiB chunks: a line at 66% before the one at 100% */
    DT_CHECK(find_line(log, "populated 64.00 MiB of 96.00 MiB", NULL, line, sizeof(line)),
             "no intermediate progress line (populated 64.00 MiB of 96.00 MiB)");
    DT_CHECK(find_line(log, "ready: pool 96.00 MiB populated", NULL, line, sizeof(line)),
             "no \"ready: pool 96.00 MiB populated\" line");
    DT_CHECK(find_line(log, "serving /metrics and /healthz", NULL, line, sizeof(line)),
             "no line announcing the metrics endpoint");
    free(log);
}

static void check_stats(const kvd_test_daemon_t *d)
{
    int rc = dt_cli(out, sizeof(out),
                    (const char *[]){"--socket", d->socket, "stats", "--json", NULL});
    DT_CHECK(rc == 0, "kvdock stats --json: exit %d", rc);
    uint64_t v = 0;
    DT_CHECK(dt_json_u64(out, "\"memory\":", "pool_bytes", &v) && v == POOL_BYTES,
             "stats memory.pool_bytes = %llu, want %llu", (unsigned long long)v,
             POOL_BYTES);

    kvd_stats_rep_t st;
    rc = dt_stats_fresh(d->socket, &st);
    DT_CHECK(rc == KVD_OK && st.memory.pool_bytes == POOL_BYTES,
             "Stats RPC: %s, pool_bytes %llu", kvd_status_str(rc),
             (unsigned long long)st.memory.pool_bytes);
}

static void check_http(int port)
{
    int code = dt_http_get(port, "/metrics", body, sizeof(body), 10000);
    DT_CHECK(code == 200, "GET /metrics: status %d, want 200", code);
    DT_CHECK(strstr(body, "\nkvdock_pool_bytes 100663296\n") != NULL,
             "/metrics should have \"kvdock_pool_bytes 100663296\"");
    DT_CHECK(strstr(body, "\nkvdock_pool_populated_bytes 100663296\n") != NULL,
             "/metrics should show the pool fully populated");
    DT_CHECK(strstr(body, "kvdock_health_state{state=\"ready\"} 1") != NULL,
             "/metrics should show health_state ready = 1");
    DT_CHECK(strstr(body, "# TYPE kvdock_rpc_latency_seconds histogram") != NULL,
             "/metrics should have the latency histogram");

    code = dt_http_get(port, "/healthz", body, sizeof(body), 10000);
    DT_CHECK(code == 200, "GET /healthz: status %d, want 200", code);
    DT_CHECK(strncmp(body, "ready", 5) == 0, "/healthz body '%s', want 'ready'", body);

    code = dt_http_get(port, "/nope", body, sizeof(body), 10000);
    DT_CHECK(code == 404, "GET /nope: status %d, want 404", code);
}

int main(void)
{
    kvd_test_daemon_t d = {0};
    int port = -1;
    /* the free port may be taken between our probe and the daemon's bind:
     * try a few */
    for (int attempt = 0; attempt < 5; attempt++) {
        port = dt_free_port();
        char listen[64];
        snprintf(listen, sizeof(listen), "127.0.0.1:%d", port);
        const char *args[] = {
            "--pool-size", "96M", "--usage-interval", "0", "--metrics-listen",
            listen,        NULL};
        if (kvd_test_daemon_start(&d, args, true, 30000) == 0)
            break;
        kvd_test_daemon_stop(&d, SIGTERM, 5000, NULL);
        d.pid = 0;
        port = -1;
    }
    if (DT_CHECK(port > 0, "kvdockd with --metrics-listen did not start")) {
        check_log(&d);
        check_stats(&d);
        check_http(port);
    }
    dt_stop(&d, SIGTERM, 10000);
    return dt_exit_status("daemon/sizing_agree");
}
