/*
 * Description: --max-connections 4: four clients connect and are served;
 * a fifth gets one error reply (id 0, KVD_ERR_NO_SPACE, "too many
 * connections") and EOF, checked on the wire and through kvd_msg_decode;
 * Stats counts it in connections_rejected. Once one of the four closes, a
 * new client is served, and the limit still holds after that.
 */
#include "dtest.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define LIMIT 4

static uint8_t frame[1 << 16];

/* Waits until the daemon counts `want` open connections (asked over c). */
static bool wait_current(kvd_client_t *c, uint64_t want, kvd_stats_rep_t *st)
{
    for (int i = 0; i < 500; i++) {
        if (dt_stats(c, st) != KVD_OK)
            return false;
        if (st->connections_current == want)
            return true;
        kvd_sleep_ns(10000000);
    }
    return false;
}

/* Connects one client too many; checks the refusal. */
static void check_refused(const kvd_test_daemon_t *d, const char *when)
{
    int fd = dt_raw_connect_unix(d->socket);
    if (!DT_CHECK(fd >= 0, "(%s) connect: %s", when, strerror(errno)))
        return;
    size_t len = 0;
    int rc = dt_read_frame(fd, frame, sizeof(frame), &len, 5000);
    if (DT_CHECK(rc == 1, "(%s) the refused client should get an error reply: %s", when,
                 rc == 0 ? "EOF" : strerror(-rc))) {
        dt_wire_env_t w;
        if (DT_CHECK(dt_wire_parse(frame, len, &w) == 0, "(%s) reply is not protobuf",
                     when)) {
            DT_CHECK(w.reply && w.has_error && w.error_code == KVD_ERR_NO_SPACE,
                     "(%s) wire: error code %lld, want %d (no space)", when,
                     (long long)w.error_code, KVD_ERR_NO_SPACE);
            DT_CHECK(w.id == 0, "(%s) wire: id %llu, want 0", when,
                     (unsigned long long)w.id);
            DT_CHECK(strstr(w.error_message, "too many connections") != NULL &&
                         strstr(w.error_message, "4") != NULL,
                     "(%s) wire: message '%s' should say too many connections (limit 4)",
                     when, w.error_message);
        }
        kvd_msg_t *m = malloc(sizeof(*m));
        if (m != NULL) {
            rc = kvd_msg_decode(frame, len, m);
            /* a refusal has no method; a proto/ client must read it */
            if (DT_CHECK(rc == KVD_OK, "(%s) kvd_msg_decode of the refusal: %s, want ok",
                         when, kvd_status_str(rc)))
                DT_CHECK(m->status == KVD_ERR_NO_SPACE && m->id == 0,
                         "(%s) decoded status %d id %llu", when, m->status,
                         (unsigned long long)m->id);
            free(m);
        }
        rc = dt_expect_eof(fd, 5000);
        DT_CHECK(rc == 0, "(%s) the refused connection should be closed: %s", when,
                 rc == 1 ? "more data" : strerror(-rc));
    }
    close(fd);
}

static void run(const kvd_test_daemon_t *d)
{
    kvd_client_t *c[LIMIT] = {NULL};
    for (int i = 0; i < LIMIT; i++)
        if ((c[i] = dt_connect(d->socket, true)) == NULL)
            goto out;
    kvd_stats_rep_t st;
    if (!DT_CHECK(wait_current(c[0], LIMIT, &st),
                  "Stats should count %d open connections, "
                  "not %llu",
                  LIMIT, (unsigned long long)st.connections_current))
        goto out;

    check_refused(d, "fifth client");
    for (int i = 0; i < LIMIT; i++) {
        kvd_health_rep_t h;
        DT_CHECK(dt_health(c[i], &h) == KVD_HEALTH_READY,
                 "client %d should still be served after the refusal", i);
    }
    int rc = dt_stats(c[0], &st);
    DT_CHECK(rc == KVD_OK && st.connections_rejected >= 1,
             "Stats: %s, connections_rejected %llu, want >= 1", kvd_status_str(rc),
             (unsigned long long)st.connections_rejected);
    DT_CHECK(kvd_test_file_contains(d->log, "max 4 connections"),
             "the log should state the limit");

    /* one leaves: room for exactly one more */
    kvd_client_close(c[LIMIT - 1]);
    c[LIMIT - 1] = NULL;
    if (!DT_CHECK(wait_current(c[0], LIMIT - 1, &st), "the daemon should see the close"))
        goto out;
    c[LIMIT - 1] = dt_connect(d->socket, true);
    if (c[LIMIT - 1] != NULL) {
        kvd_health_rep_t h;
        DT_CHECK(dt_health(c[LIMIT - 1], &h) == KVD_HEALTH_READY,
                 "the client that took the freed slot should be served");
    }
    check_refused(d, "fifth client again");
    rc = dt_stats(c[0], &st);
    DT_CHECK(rc == KVD_OK && st.connections_rejected >= 2,
             "Stats: connections_rejected %llu, want >= 2",
             (unsigned long long)st.connections_rejected);
out:
    for (int i = 0; i < LIMIT; i++)
        kvd_client_close(c[i]);
}

int main(void)
{
    kvd_test_daemon_t d;
    if (dt_start(&d, (const char *[]){"--max-connections", "4", NULL}) == 0)
        run(&d);
    dt_stop(&d, SIGTERM, 10000);
    return dt_exit_status("daemon/max_conn");
}
