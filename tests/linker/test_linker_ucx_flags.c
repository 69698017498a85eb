/*
 * Description: kvdockd's --ucx and the linker's transport choice.
 * `--ucx maybe` is refused (exit 2). `--ucx on` where UCX cannot start
 * (UCX_TLS names no transport) refuses to run (non-zero exit, no hang).
 * `--ucx off`, and `--ucx auto` where UCX cannot start, serve shared-memory
 * workers and answer a UCX worker's Hello with "unsupported" (the linker's
 * open returns -10, it does not hang or crash either side), and a shm
 * worker still round-trips byte-exact. An unknown transport name, or shm
 * to a daemon over TCP, is refused at open with -1 (invalid). Where UCX
 * would serve over TCP only (UCX_TLS=tcp) and the daemon has no --ucx-tcp:
 * `--ucx auto` serves shm workers and a UCX worker's open says -10, the
 * daemon's log naming the flag; `--ucx on` refuses to run.
 */
#include "dtest.h"
#include "harness.h"
#include "kvd_common.h"
#include "kvdock.h"
#include "ltest.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#define ROWS 16
#define BPR  256

static uint8_t kbuf[ROWS * BPR];

static int open_with(const char *socket, const char *connect, const char *transport,
                     kvd_linker_t **l)
{
    kvd_linker_config_t cfg = {.socket_path = socket,
                               .connect = connect,
                               .model_id = "flags",
                               .timeout_ms = 3000,
                               .transport = transport};
    return kvd_linker_open(&cfg, l);
}

/* Offload 2 pages of 4 rows and load them back into other rows. */
static void round_trip(kvd_linker_t *l)
{
    kvd_pool_layer_t layer = {
        .layer_id = 0, .n_buffers = 1, .buffers = {{kbuf, BPR, BPR}}};
    kvd_pool_desc_t kv = {.name = "kv",
                          .addressing = KVD_ADDR_PAGED,
                          .page_size = 4,
                          .n_rows = ROWS,
                          .memory = KVD_MEM_HOST,
                          .n_layers = 1,
                          .layers = &layer};
    uint32_t pool = 0;
    if (!DT_CHECK(kvd_register_pool(l, &kv, &pool) == 0, "register"))
        return;
    for (size_t i = 0; i < sizeof(kbuf); i++)
        kbuf[i] = (uint8_t)(i * 11 + 5);
    uint32_t tokens[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    uint8_t keys[2][KVD_PAGE_KEY_BYTES];
    size_t nk = 0;
    kvd_page_keys(tokens, 8, 4, NULL, keys, &nk);
    int64_t src[8] = {0, 1, 2, 3, 4, 5, 6, 7}, dst[8] = {8, 9, 10, 11, 12, 13, 14, 15};
    kvd_transfer_t t = {.pool_id = pool,
                        .keys = (const uint8_t(*)[KVD_PAGE_KEY_BYTES])keys,
                        .n_keys = 2,
                        .device_indices = src,
                        .n_indices = 8};
    uint64_t ack = 0;
    bool ok = kvd_offload(l, &t, 1, &ack) == 0 && lt_wait_done(l, false, ack, 5000);
    DT_CHECK(ok, "the offload should succeed");
    t.device_indices = dst;
    int rc = lt_load_all(l, 7, &t, 2);
    ok = rc == 0 && lt_wait_done(l, true, 7, 5000);
    DT_CHECK(rc == 0 && ok, "the load should succeed (%d)", rc);
    DT_CHECK(memcmp(kbuf, kbuf + 8 * BPR, 8 * BPR) == 0,
             "rows 8..15 should equal rows 0..7");
}

/* A daemon that serves no UCX: a UCX worker is refused, a shm one works. */
static void no_ucx(const char *const *args, const char *why)
{
    kvd_test_daemon_t d = {0};
    if (dt_start(&d, args) != 0)
        return;
    setenv("UCX_TLS", "tcp", 1); /* the worker's own UCX can start */
    kvd_linker_t *l = NULL;
    int rc = open_with(d.socket, NULL, "ucx", &l);
    DT_CHECK(rc == KVD_ERR_UNSUPPORTED,
             "%s: a UCX worker's open should say unsupported, not %d", why, rc);
    kvd_linker_close(l);
    l = NULL;
    rc = open_with(d.socket, NULL, "shm", &l);
    if (DT_CHECK(rc == 0, "%s: a shm worker should open: %d", why, rc))
        round_trip(l);
    kvd_linker_close(l);
    DT_CHECK(dt_health_fresh(d.socket, NULL) == KVD_HEALTH_READY, "%s: still ready", why);
    dt_stop(&d, SIGTERM, 5000);
}

int main(void)
{
    /* a bad value: exit 2 */
    char out[4096];
    char *bad[] = {(char *)kvd_test_bin("kvdockd"), "--ucx", "maybe", NULL};
    int ex = kvd_test_run(bad, out, sizeof(out), 10000);
    DT_CHECK(ex == 2, "--ucx maybe should exit 2, not %d", ex);

    /* --ucx on where UCX cannot start: refuses to run */
    setenv("UCX_TLS", "no-such-transport", 1);
    kvd_test_daemon_t d = {0};
    const char *on[] = {"--pool-size", "64M", "--usage-interval", "0", "--ucx",
                        "on",          NULL};
    if (DT_CHECK(kvd_test_daemon_start(&d, on, false, 0) == 0, "fork")) {
        int ws = 0;
        bool exited = kvd_test_wait_pid(d.pid, 15000, &ws) == 0;
        DT_CHECK(exited && WIFEXITED(ws) && WEXITSTATUS(ws) != 0,
                 "--ucx on without UCX should exit non-zero (exited %d, status %d)",
                 exited, WIFEXITED(ws) ? WEXITSTATUS(ws) : -1);
        d.pid = exited ? 0 : d.pid;
        DT_CHECK(kvd_test_file_contains(d.log, "--ucx on, but UCX cannot serve the pool"),
                 "the log should say why");
        kvd_test_daemon_stop(&d, SIGKILL, 1000, NULL);
    }

    /* --ucx auto where UCX cannot start: serves shm workers */
    const char *autoargs[] = {"--ucx", "auto", NULL};
    no_ucx(autoargs, "auto without UCX");

    /* only TCP would serve, and no --ucx-tcp: as if UCX did not start,
     * and --ucx on refuses to run */
    unsetenv("KVDOCK_TEST_DAEMON_ARGS"); /* a -ucx-tcp variant's flag */
    setenv("UCX_TLS", "tcp", 1);
    no_ucx(autoargs, "auto, UCX_TLS=tcp, no --ucx-tcp");
    d = (kvd_test_daemon_t){0};
    if (DT_CHECK(kvd_test_daemon_start(&d, on, false, 0) == 0, "fork")) {
        int ws = 0;
        bool exited = kvd_test_wait_pid(d.pid, 15000, &ws) == 0;
        DT_CHECK(exited && WIFEXITED(ws) && WEXITSTATUS(ws) != 0,
                 "--ucx on, UCX_TLS=tcp, no --ucx-tcp should exit non-zero (exited %d, "
                 "status %d)",
                 exited, WIFEXITED(ws) ? WEXITSTATUS(ws) : -1);
        d.pid = exited ? 0 : d.pid;
        DT_CHECK(kvd_test_file_contains(d.log, "without kvdockd --ucx-tcp"),
                 "the log should name --ucx-tcp");
        kvd_test_daemon_stop(&d, SIGKILL, 1000, NULL);
    }
    /* --ucx off */
    unsetenv("UCX_TLS");
    const char *off[] = {"--ucx", "off", NULL};
    no_ucx(off, "off");

    /* names the linker refuses */
    kvd_linker_t *l = NULL;
    DT_CHECK(open_with("/nonexistent.sock", NULL, "carrier-pigeon", &l) ==
                 KVD_ERR_INVALID,
             "an unknown transport is invalid");
    DT_CHECK(open_with(NULL, "127.0.0.1:1", "shm", &l) == KVD_ERR_INVALID,
             "shm over TCP is invalid");
    return dt_exit_status("linker/ucx_flags");
}
