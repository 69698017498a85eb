/*
 * Description: the linker's credential. A daemon that lets no uid of ours
 * in (--allow-uid 4242) but takes a token (--auth-token-file): a linker
 * opened with auth_token_file naming it is served; one with a wrong token,
 * or none, is refused at open with KVD_ERR_AUTH; $KVDOCK_AUTH_TOKEN_FILE
 * stands in for the field; a token file that does not exist fails the
 * open with not-found. After the daemon is killed and a new one (same
 * flags) starts on the socket, the open linker reconnects: its token goes
 * in every Hello, not only the first.
 */
#include "dtest.h"
#include "harness.h"
#include "kvdock.h"
#include "ltest.h"

#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static int open_with(const char *socket, const char *token_file, kvd_linker_t **l)
{
    kvd_linker_config_t cfg = {.socket_path = socket,
                               .model_id = "auth",
                               .timeout_ms = 3000,
                               .transport = "shm",
                               .auth_token_file = token_file};
    *l = NULL;
    return kvd_linker_open(&cfg, l);
}

/* Waits (bounded) for a linker with the token to open: the daemon was
 * started without the harness's readiness poll, which has no token. */
static int open_when_up(const char *socket, const char *token_file, kvd_linker_t **l)
{
    int rc = KVD_ERR_UNAVAILABLE;
    for (int i = 0; i < 400 && rc == KVD_ERR_UNAVAILABLE; i++) {
        rc = open_with(socket, token_file, l);
        if (rc == KVD_ERR_UNAVAILABLE)
            sleep_ms(50);
    }
    return rc;
}

int main(void)
{
    unsetenv("KVDOCK_AUTH_TOKEN_FILE");
    char good[64], bad[64];
    if (dt_token_file("linker-auth-token", good, sizeof(good)) != 0 ||
        dt_token_file("not-the-token", bad, sizeof(bad)) != 0)
        return dt_exit_status("linker/auth");
    kvd_test_daemon_t d1 = {0}, d2 = {0};
    const char *args[] = {"--pool-size", "64M",  "--usage-interval",  "0",
                          "--allow-uid", "4242", "--auth-token-file", good,
                          NULL};
    kvd_linker_t *l = NULL, *x = NULL;
    bool up = DT_CHECK(kvd_test_daemon_start(&d1, args, false, 0) == 0, "start") &&
              DT_CHECK(open_when_up(d1.socket, good, &l) == KVD_OK,
                       "a linker with the token should open");
    if (up) {
        int rc = open_with(d1.socket, bad, &x);
        DT_CHECK(rc == KVD_ERR_AUTH && x == NULL, "a wrong token: open %d, want %d", rc,
                 KVD_ERR_AUTH);
        rc = open_with(d1.socket, NULL, &x);
        DT_CHECK(rc == KVD_ERR_AUTH && x == NULL, "no token, uid not allowed: open %d",
                 rc);
        setenv("KVDOCK_AUTH_TOKEN_FILE", good, 1);
        rc = open_with(d1.socket, NULL, &x);
        DT_CHECK(rc == KVD_OK, "$KVDOCK_AUTH_TOKEN_FILE: open %d", rc);
        kvd_linker_close(x);
        unsetenv("KVDOCK_AUTH_TOKEN_FILE");
        rc = open_with(d1.socket, "/nonexistent/kvdock-token", &x);
        DT_CHECK(rc == KVD_ERR_NOT_FOUND && x == NULL, "a missing token file: open %d",
                 rc);
    }
    if (up) {
        kill(d1.pid, SIGKILL);
        kvd_test_wait_pid(d1.pid, 5000, NULL);
        d1.pid = 0;
        const char *args2[] = {"--pool-size",
                               "64M",
                               "--usage-interval",
                               "0",
                               "--allow-uid",
                               "4242",
                               "--auth-token-file",
                               good,
                               "--socket",
                               d1.socket,
                               NULL};
        up = DT_CHECK(kvd_test_daemon_start(&d2, args2, false, 0) == 0,
                      "the second daemon started");
    }
    if (up) {
        kvd_linker_health_t h = 0;
        bool back = false;
        for (int i = 0; i < 400 && !back; i++) {
            back = kvd_linker_health(l, &h, NULL) == 0 && h == KVD_LINKER_HEALTH_READY;
            if (!back)
                sleep_ms(50);
        }
        DT_CHECK(back, "the linker should reconnect to the new daemon with its token");
    }
    kvd_linker_close(l);
    dt_stop(&d2, SIGTERM, 10000);
    dt_stop(&d1, SIGTERM, 10000);
    unlink(good);
    unlink(bad);
    return dt_exit_status("linker/auth");
}
