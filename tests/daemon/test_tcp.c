/*
 * Description: RPC over TCP with --listen 127.0.0.1:PORT and
 * --auth-token-file: a client connects with kvd_client_connect_tcp, says
 * Hello with the token (the daemon logs it "over tcp") and gets Health and
 * Stats; `kvdock --connect 127.0.0.1:PORT --token-file F health` exits 0
 * and prints ready; the Unix socket still serves alongside.
 */
#include "dtest.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char out[1 << 16];

#define TOKEN "tcp-test-token"

static void run(const kvd_test_daemon_t *d, const char *addr, const char *token_file)
{
    kvd_client_t *c = NULL;
    int rc = kvd_client_connect_tcp(addr, 5000, &c);
    if (!DT_CHECK(rc == KVD_OK, "kvd_client_connect_tcp(%s): %s", addr,
                  kvd_status_str(rc)))
        return;
    kvd_hello_rep_t h;
    rc = dt_hello_token(c, "tcp-test", TOKEN, &h, 5000);
    if (DT_CHECK(rc == KVD_OK, "hello over TCP: %s", kvd_status_str(rc))) {
        DT_CHECK(h.protocol_version == KVD_PROTOCOL_VERSION,
                 "hello: protocol %u, want %d", h.protocol_version, KVD_PROTOCOL_VERSION);
        DT_CHECK(h.pool_bytes == DT_POOL_BYTES, "hello: pool_bytes %llu, want %llu",
                 (unsigned long long)h.pool_bytes, (unsigned long long)DT_POOL_BYTES);
        DT_CHECK(strcmp(h.daemon_version, KVD_VERSION) == 0,
                 "hello: version '%s', want '%s'", h.daemon_version, KVD_VERSION);
        DT_CHECK(h.max_frame_bytes == KVD_FRAME_DEFAULT_MAX, "hello: max_frame_bytes %u",
                 h.max_frame_bytes);
        DT_CHECK(h.connection_id > 0, "hello: connection id 0");
    }
    for (int i = 0; i < 50; i++) {
        kvd_health_rep_t hr;
        int st = dt_health(c, &hr);
        if (!DT_CHECK(st == KVD_HEALTH_READY && hr.pool_bytes == DT_POOL_BYTES,
                      "health over TCP (call %d): %d, pool %llu", i, st,
                      (unsigned long long)hr.pool_bytes))
            break;
    }
    kvd_stats_rep_t st;
    rc = dt_stats(c, &st);
    DT_CHECK(rc == KVD_OK && st.connections_current >= 1 &&
                 st.methods[KVD_METHOD_HEALTH].calls >= 50,
             "stats over TCP: %s, current %llu, health calls %llu", kvd_status_str(rc),
             (unsigned long long)st.connections_current,
             (unsigned long long)st.methods[KVD_METHOD_HEALTH].calls);
    kvd_client_close(c);
    DT_CHECK(kvd_test_file_contains(d->log, "hello from 'tcp-test'") &&
                 kvd_test_file_contains(d->log, "over tcp"),
             "the daemon should log the Hello as coming over tcp");
    DT_CHECK(kvd_test_file_contains(d->log, "serving RPC over TCP on"),
             "the daemon should log its TCP listener");

    rc = dt_cli(
        out, sizeof(out),
        (const char *[]){"--connect", addr, "--token-file", token_file, "health", NULL});
    DT_CHECK(rc == 0 && strncmp(out, "ready", 5) == 0,
             "kvdock --connect %s health: exit %d, '%s'", addr, rc, out);
    rc = dt_cli(out, sizeof(out),
                (const char *[]){"--connect", addr, "--token-file", token_file, "stats",
                                 "--json", NULL});
    DT_CHECK(rc == 0 && dt_json_valid(out), "kvdock --connect stats --json: exit %d", rc);

    /* the Unix socket serves too */
    kvd_health_rep_t hr;
    DT_CHECK(dt_health_fresh(d->socket, &hr) == KVD_HEALTH_READY,
             "the Unix socket should serve alongside TCP");
}

int main(void)
{
    kvd_test_daemon_t d = {0};
    char addr[64] = "", token_file[64];
    if (dt_token_file(TOKEN, token_file, sizeof(token_file)) != 0)
        return dt_exit_status("daemon/tcp");
    bool up = false;
    for (int attempt = 0; attempt < 5 && !up; attempt++) {
        int port = dt_free_port();
        snprintf(addr, sizeof(addr), "127.0.0.1:%d", port);
        const char *args[] = {"--pool-size", DT_POOL, "--usage-interval",  "0",
                              "--listen",    addr,    "--auth-token-file", token_file,
                              NULL};
        up = port > 0 && kvd_test_daemon_start(&d, args, true, 30000) == 0;
        if (!up) {
            kvd_test_daemon_stop(&d, SIGKILL, 5000, NULL);
            d.pid = 0;
        }
    }
    if (DT_CHECK(up, "kvdockd --listen did not start on any free port"))
        run(&d, addr, token_file);
    dt_stop(&d, SIGTERM, 10000);
    unlink(token_file);
    return dt_exit_status("daemon/tcp");
}
