/*
 * Description: the kvdock operator CLI against a live kvdockd: `health` and
 * `health --json` report ready (exit 0); `stats --json` is well-formed JSON
 * with the 64 MiB pool, state ready and this connection counted; the human
 * `stats` table names the pool as "64.00 MiB"; an absent daemon gives exit 1
 * with the reason on stderr (not stdout); usage errors give exit 2;
 * --version and --help exit 0 (for kvdock and kvdockd).
 */
#include "dtest.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char out[1 << 16];

static void check_health(const kvd_test_daemon_t *d)
{
    int rc =
        dt_cli(out, sizeof(out), (const char *[]){"--socket", d->socket, "health", NULL});
    DT_CHECK(rc == 0, "kvdock health: exit %d, want 0", rc);
    DT_CHECK(strncmp(out, "ready", 5) == 0,
             "kvdock health should print \"ready\" first: '%s'", out);
    DT_CHECK(strstr(out, "64.00 MiB") != NULL, "kvdock health should name the pool: '%s'",
             out);

    rc = dt_cli(out, sizeof(out),
                (const char *[]){"--socket", d->socket, "health", "--json", NULL});
    DT_CHECK(rc == 0, "kvdock health --json: exit %d, want 0", rc);
    DT_CHECK(dt_json_valid(out), "health --json is not valid JSON: '%s'", out);
    DT_CHECK(strstr(out, "\"state\":\"ready\"") != NULL,
             "health --json: no \"state\":\"ready\": '%s'", out);
    uint64_t v = 0;
    DT_CHECK(dt_json_u64(out, NULL, "pool_bytes", &v) && v == DT_POOL_BYTES,
             "health --json pool_bytes %llu, want %llu", (unsigned long long)v,
             (unsigned long long)DT_POOL_BYTES);

    /* the option may also come before the command */
    rc = dt_cli(out, sizeof(out),
                (const char *[]){"--socket", d->socket, "--json", "health", NULL});
    DT_CHECK(rc == 0 && strstr(out, "\"state\":\"ready\"") != NULL,
             "kvdock --json health: exit %d, '%s'", rc, out);
}

static void check_stats(const kvd_test_daemon_t *d)
{
    int rc = dt_cli(out, sizeof(out),
                    (const char *[]){"--socket", d->socket, "stats", "--json", NULL});
    DT_CHECK(rc == 0, "kvdock stats --json: exit %d, want 0", rc);
    DT_CHECK(dt_json_valid(out), "stats --json is not valid JSON: '%s'", out);
    uint64_t v = 0;
    DT_CHECK(dt_json_u64(out, "\"memory\":", "pool_bytes", &v) && v == DT_POOL_BYTES,
             "stats --json memory.pool_bytes %llu, want %llu", (unsigned long long)v,
             (unsigned long long)DT_POOL_BYTES);
    DT_CHECK(
        dt_json_u64(out, "\"memory\":", "pool_populated_bytes", &v) && v == DT_POOL_BYTES,
        "stats --json memory.pool_populated_bytes %llu, want the whole pool once ready",
        (unsigned long long)v);
    DT_CHECK(strstr(out, "\"state\":\"ready\"") != NULL,
             "stats --json: no \"state\":\"ready\"");
    v = 0;
    DT_CHECK(dt_json_u64(out, "\"connections\":", "current", &v) && v >= 1,
             "stats --json connections.current %llu, want >= 1 (the CLI itself)",
             (unsigned long long)v);
    DT_CHECK(dt_json_u64(out, "\"connections\":", "total", &v) && v >= 1,
             "stats --json connections.total %llu, want >= 1", (unsigned long long)v);
    /* the harness's readiness probes and the health calls above were counted */
    DT_CHECK(dt_json_u64(out, "\"health\":{", "calls", &v) && v >= 3,
             "stats --json methods.health.calls %llu, want >= 3", (unsigned long long)v);
    DT_CHECK(strstr(out, "\"instance\":\"test-") != NULL,
             "stats --json: instance missing");

    rc = dt_cli(out, sizeof(out), (const char *[]){"--socket", d->socket, "stats", NULL});
    DT_CHECK(rc == 0, "kvdock stats: exit %d, want 0", rc);
    DT_CHECK(strstr(out, "64.00 MiB") != NULL,
             "kvdock stats table should show \"64.00 MiB\":\n%s", out);
    DT_CHECK(strstr(out, "ready") != NULL,
             "kvdock stats table should show the state:\n%s", out);
}

static void check_absent_daemon(void)
{
    /* stdout alone: nothing about the failure there */
    int rc = dt_cli(out, sizeof(out),
                    (const char *[]){"--socket", "/nonexistent/x.sock", "health", NULL});
    DT_CHECK(rc == 1, "kvdock health on a missing socket: exit %d, want 1", rc);
    DT_CHECK(out[0] == '\0',
             "kvdock should print nothing on stdout when unreachable: '%s'", out);

    /* stderr alone (stdout thrown away): the reason */
    rc = dt_sh(out, sizeof(out),
               "\"$KVDOCK\" --socket /nonexistent/x.sock health 2>&1 >/dev/null");
    DT_CHECK(rc == 1, "kvdock health on a missing socket (via sh): exit %d, want 1", rc);
    DT_CHECK(strstr(out, "cannot reach kvdockd") != NULL &&
                 strstr(out, "/nonexistent/x.sock"),
             "stderr should say the daemon is not there and where: '%s'", out);
    DT_CHECK(strstr(out, "unavailable") != NULL, "stderr should say 'unavailable': '%s'",
             out);

    rc = dt_cli(
        out, sizeof(out),
        (const char *[]){"--socket", "/nonexistent/x.sock", "stats", "--json", NULL});
    DT_CHECK(rc == 1, "kvdock stats on a missing socket: exit %d, want 1", rc);
}

static void check_usage(const kvd_test_daemon_t *d)
{
    int rc = dt_cli(out, sizeof(out),
                    (const char *[]){"--socket", d->socket, "frobnicate", NULL});
    DT_CHECK(rc == 2, "unknown command: exit %d, want 2", rc);
    rc = dt_sh(out, sizeof(out),
               "\"$KVDOCK\" --socket /tmp/x.sock frobnicate 2>&1 >/dev/null");
    DT_CHECK(strstr(out, "unknown command 'frobnicate'") != NULL,
             "unknown command: stderr should name it: '%s'", out);

    rc = dt_cli(out, sizeof(out), (const char *[]){NULL});
    DT_CHECK(rc == 2, "no command: exit %d, want 2", rc);
    rc = dt_cli(out, sizeof(out), (const char *[]){"--bogus-option", "health", NULL});
    DT_CHECK(rc == 2, "unknown option: exit %d, want 2", rc);
    rc = dt_cli(out, sizeof(out), (const char *[]){"--timeout", "abc", "health", NULL});
    DT_CHECK(rc == 2, "--timeout abc: exit %d, want 2", rc);
    rc = dt_cli(out, sizeof(out),
                (const char *[]){"--socket", d->socket, "health", "extra", NULL});
    DT_CHECK(rc == 2, "an extra argument: exit %d, want 2", rc);

    rc = dt_cli(out, sizeof(out), (const char *[]){"--version", NULL});
    DT_CHECK(rc == 0, "kvdock --version: exit %d, want 0", rc);
    DT_CHECK(strncmp(out, "kvdock " KVD_VERSION, strlen("kvdock " KVD_VERSION)) == 0,
             "kvdock --version printed '%s', want 'kvdock %s ...'", out, KVD_VERSION);
    rc = dt_cli(out, sizeof(out), (const char *[]){"--help", NULL});
    DT_CHECK(rc == 0, "kvdock --help: exit %d, want 0", rc);
    DT_CHECK(strstr(out, "Usage: kvdock") && strstr(out, "health") &&
                 strstr(out, "stats"),
             "kvdock --help should show the usage and commands: '%s'", out);

    char *argv[] = {(char *)kvd_test_bin("kvdockd"), "--version", NULL};
    rc = kvd_test_run(argv, out, sizeof(out), 20000);
    DT_CHECK(rc == 0 && strstr(out, "kvdockd " KVD_VERSION) != NULL,
             "kvdockd --version: exit %d, '%s'", rc, out);
    argv[1] = "--help";
    rc = kvd_test_run(argv, out, sizeof(out), 20000);
    DT_CHECK(rc == 0 && strstr(out, "--pool-size") && strstr(out, "--mem-fraction"),
             "kvdockd --help: exit %d, should list the flags", rc);
}

int main(void)
{
    kvd_test_daemon_t d;
    if (dt_start(&d, NULL) == 0) {
        check_health(&d);
        check_stats(&d);
        check_usage(&d);
    }
    check_absent_daemon();
    dt_stop(&d, SIGTERM, 10000);
    return dt_exit_status("cli/daemon_cmds");
}
