/*
 * Description: UCX over TCP is the operator's explicit choice (issue 11,
 * hole 1: UCT's tcp transport writes a raw PUT request's bytes wherever
 * the peer says, below anything UCP or kvdock checks). With UCX_TLS=tcp
 * and --listen 127.0.0.1:PORT:
 *   (a) without --ucx-tcp (the default --ucx auto): a Hello with want_ucx,
 *       over TCP and over the Unix socket, is refused with
 *       KVD_ERR_UNSUPPORTED and an error naming --ucx-tcp; the daemon has
 *       no UCX server child left, and no TCP listener but the RPC's (so
 *       nothing of UCX listens); its log says why; a plain Hello works.
 *   (b) `--ucx on` without --ucx-tcp refuses to run (non-zero exit), its
 *       log naming the flag.
 *   (c) with --ucx-tcp: the Hello gets the worker address and a
 *       capability, the UCX server child listens on loopback TCP, and the
 *       log carries the warning of what that costs.
 * Skips (77) when UCX cannot start here over tcp (the daemon says so).
 * Every wait is bounded; no timing is asserted.
 */
#include "dtest.h"

#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define TEST_NAME "daemon/ucx_tcp_optin"
#define WAIT_MS   5000
#define FLAG      "--ucx-tcp"
#define COST \
    "any host that reaches the UCX TCP port can write into the UCX server process"

/* Hello with want_ucx on c: the status, the error text, the UCX reply. */
static int hello_ucx(kvd_client_t *c, char *error, size_t cap, size_t *addr_len,
                     size_t *token_len)
{
    kvd_msg_t req, rep;
    kvd_msg_request(&req, 0, KVD_METHOD_HELLO);
    kvd_hello_req_t *h = &req.body.hello_req;
    kvd_strlcpy(h->client_name, "ucx-tcp-optin", sizeof(h->client_name));
    h->pid = (uint32_t)getpid();
    h->protocol_version = KVD_PROTOCOL_VERSION;
    h->want_ucx = true;
    int rc = kvd_client_call(c, &req, &rep, WAIT_MS);
    error[0] = '\0';
    *addr_len = *token_len = 0;
    if (rc == KVD_OK) {
        rc = rep.status;
        kvd_strlcpy(error, rep.error, cap);
        if (rc == KVD_OK) {
            *addr_len = rep.body.hello_rep.ucx_address_len;
            *token_len = rep.body.hello_rep.ucx_token_len;
        }
    }
    kvd_msg_clear(&rep);
    return rc;
}

/* Starts a daemon on --listen (plus extra, NULL-terminated, up to 4). */
static int start(kvd_test_daemon_t *d, const char *listen, const char *extra)
{
    /* the RPC's own authentication is not what this test is about */
    const char *args[] = {"--listen", listen, "--insecure-no-auth", extra, NULL};
    return dt_start(d, args);
}

/* (c) */
static bool case_opted_in(const char *listen)
{
    kvd_test_daemon_t d = {0};
    if (start(&d, listen, FLAG) != 0)
        return false;
    if (!kvd_test_file_contains(d.log, "UCX server pid")) {
        printf(
            "SKIP: UCX cannot start here over tcp (UCX_TLS=%s): see the daemon's log\n",
            getenv("UCX_TLS"));
        dt_stop(&d, SIGTERM, 10000);
        return false;
    }
    kvd_client_t *c = NULL;
    char err[KVD_ERROR_MAX];
    size_t alen = 0, tlen = 0;
    int rc = kvd_client_connect_tcp(listen, WAIT_MS, &c);
    if (rc == KVD_OK)
        rc = hello_ucx(c, err, sizeof(err), &alen, &tlen);
    DT_CHECK(rc == KVD_OK && alen > 0 && tlen == 16,
             "with " FLAG ": the UCX Hello should be served (%s: %s; address %zu bytes, "
             "capability %zu)",
             kvd_status_str(rc), err, alen, tlen);
    kvd_client_close(c);
    pid_t child = dt_child_of(d.pid);
    int lo = 0, n = child > 0 ? dt_tcp_listeners(child, &lo) : -1;
    printf("with " FLAG ": the UCX server (pid %d) listens on %d TCP sockets (%d on "
           "loopback)\n",
           (int)child, n, lo);
    DT_CHECK(n > 0 && lo == n,
             "with " FLAG
             ": the UCX server should listen on loopback TCP only (%d of %d)",
             lo, n);
    DT_CHECK(kvd_test_file_contains(d.log, COST),
             "with " FLAG ": the log should say what serving UCX over TCP costs");
    dt_stop(&d, SIGTERM, 10000);
    return true;
}

/* (a) */
static void case_default(const char *listen)
{
    kvd_test_daemon_t d = {0};
    if (start(&d, listen, NULL) != 0)
        return;
    char err[KVD_ERROR_MAX];
    size_t alen = 0, tlen = 0;
    for (int unix_socket = 0; unix_socket <= 1; unix_socket++) {
        const char *how = unix_socket ? "over the Unix socket" : "over TCP";
        kvd_client_t *c = NULL;
        int rc = unix_socket ? kvd_client_connect_unix(d.socket, WAIT_MS, &c)
                             : kvd_client_connect_tcp(listen, WAIT_MS, &c);
        if (rc == KVD_OK)
            rc = hello_ucx(c, err, sizeof(err), &alen, &tlen);
        printf("without " FLAG ", %s: %s: %s\n", how, kvd_status_str(rc), err);
        DT_CHECK(rc == KVD_ERR_UNSUPPORTED,
                 "without " FLAG ", %s: the UCX Hello should be unsupported, not %s", how,
                 kvd_status_str(rc));
        DT_CHECK(strstr(err, FLAG) != NULL && strstr(err, "tcp") != NULL,
                 "without " FLAG ", %s: the error should name the flag and tcp: '%s'",
                 how, err);
        DT_CHECK(alen == 0 && tlen == 0, "%s: a refused Hello carries no UCX address",
                 how);
        kvd_client_close(c);
    }
    /* the RPC still serves */
    kvd_client_t *c = dt_connect(d.socket, true);
    DT_CHECK(c != NULL, "a plain Hello should still work");
    kvd_client_close(c);
    /* nothing of UCX listens: no child, and the daemon's only TCP listener
     * is the RPC's */
    pid_t child = dt_child_of(d.pid);
    int lo = 0;
    DT_CHECK(child <= 0, "without " FLAG ": a UCX server child (pid %d) is still there",
             (int)child);
    if (child > 0) {
        int n = dt_tcp_listeners(child, &lo);
        DT_CHECK(n == 0,
                 "without " FLAG ": the UCX server (pid %d) listens on %d TCP "
                 "sockets",
                 (int)child, n);
    }
    int n = dt_tcp_listeners(d.pid, &lo);
    DT_CHECK(n == 1,
             "without " FLAG ": the daemon should have one TCP listener (the "
             "RPC's), not %d",
             n);
    DT_CHECK(kvd_test_file_contains(d.log, "is not served without kvdockd " FLAG),
             "without " FLAG ": the log should name the flag");
    dt_stop(&d, SIGTERM, 10000);
}

/* (b) */
static void case_required(const char *listen)
{
    kvd_test_daemon_t d = {0};
    const char *args[] = {
        "--pool-size", DT_POOL, "--usage-interval",   "0", "--listen", listen,
        "--ucx",       "on",    "--insecure-no-auth", NULL};
    if (!DT_CHECK(kvd_test_daemon_start(&d, args, false, 0) == 0, "fork/exec"))
        return;
    int ws = 0;
    bool exited = kvd_test_wait_pid(d.pid, 30000, &ws) == 0;
    DT_CHECK(exited && WIFEXITED(ws) && WEXITSTATUS(ws) != 0,
             "--ucx on without " FLAG " should exit non-zero (exited %d, status %d)",
             exited, exited && WIFEXITED(ws) ? WEXITSTATUS(ws) : -1);
    if (exited)
        d.pid = 0;
    DT_CHECK(kvd_test_file_contains(d.log, "is not served without kvdockd " FLAG),
             "--ucx on without " FLAG ": the log should name the flag");
    kvd_test_daemon_stop(&d, SIGKILL, 1000, NULL);
}

int main(void)
{
    setenv("UCX_TLS", "tcp", 1);
    unsetenv("KVDOCK_TEST_DAEMON_ARGS"); /* this test says which flags */
    char listen[32];
    snprintf(listen, sizeof(listen), "127.0.0.1:%d", dt_free_port());
    if (!case_opted_in(listen)) {
        int st = dt_exit_status(TEST_NAME);
        return st != 0 ? st : KVD_TEST_SKIP;
    }
    case_default(listen);
    case_required(listen);
    return dt_exit_status(TEST_NAME);
}
