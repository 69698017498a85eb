/*
 * Description: the Unix socket's rules (hole 2 of issue 11). By default
 * the socket is mode 0600; with --allow-gid G it is 0660 and of group G.
 * As root (otherwise that part is skipped, saying why), a child that drops
 * to uid and gid 65534 (nobody) connects: to a daemon with --allow-uid
 * 0,4242 (socket 0666: the file mode lets it in) its Hello is refused with
 * KVD_ERR_AUTH and the connection closed, and so is a Stats before Hello;
 * with --allow-gid 65534 (0660, group 65534) it is served as the default
 * tenant; with an --auth-config mapping uid 65534 to tenant t1 read-only,
 * its HelloReply names t1 and says read-only, and a Hello that asks
 * read-only narrows the daemon's own uid too.
 */
#include "dtest.h"

#include <errno.h>
#include <grp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define NOBODY     65534
#define TIMEOUT_MS 5000

/* The child's verdicts (exit statuses). */
enum { C_SERVED = 0, C_REFUSED = 10, C_NO_CONNECT = 11, C_OTHER = 12, C_NO_DROP = 13 };

/* In the child: become nobody, connect, Hello; served only when the reply
 * names want_tenant with want_ro. A refusal must close the connection. */
static int child_main(const char *socket, const char *want_tenant, bool want_ro)
{
    if (setgroups(0, NULL) != 0 || setresgid(NOBODY, NOBODY, NOBODY) != 0 ||
        setresuid(NOBODY, NOBODY, NOBODY) != 0 || getuid() != NOBODY)
        return C_NO_DROP;
    kvd_client_t *c = NULL;
    if (kvd_client_connect_unix(socket, TIMEOUT_MS, &c) != KVD_OK)
        return C_NO_CONNECT;
    kvd_hello_rep_t h;
    int rc = kvd_client_hello(c, "nobody", NULL, 0, TIMEOUT_MS, &h);
    int verdict = C_OTHER;
    if (rc == KVD_ERR_AUTH) {
        /* closed after the refusal: the next call finds no daemon */
        kvd_msg_t req, rep;
        kvd_msg_request(&req, 0, KVD_METHOD_HEALTH);
        int after = kvd_client_call(c, &req, &rep, TIMEOUT_MS);
        kvd_msg_clear(&rep);
        verdict = after == KVD_ERR_CLOSED ? C_REFUSED : C_OTHER;
    } else if (rc == KVD_OK) {
        verdict = strcmp(h.tenant, want_tenant) == 0 && h.read_only == want_ro ? C_SERVED
                                                                               : C_OTHER;
        if (verdict != C_SERVED)
            fprintf(stderr, "child: tenant '%s' read_only %d, want '%s' %d\n", h.tenant,
                    h.read_only, want_tenant, want_ro);
    }
    kvd_client_close(c);
    return verdict;
}

/* Runs child_main in a fork; returns its exit status or -1. */
static int as_nobody(const char *socket, const char *want_tenant, bool want_ro)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0)
        _exit(child_main(socket, want_tenant, want_ro));
    int st = 0;
    if (!DT_CHECK(pid > 0, "fork: %s", strerror(errno)) ||
        !DT_CHECK(kvd_test_wait_pid(pid, 20000, &st) == 0, "the child did not finish")) {
        if (pid > 0) {
            kill(pid, SIGKILL);
            kvd_test_wait_pid(pid, 5000, NULL);
        }
        return -1;
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static unsigned socket_mode(const kvd_test_daemon_t *d, gid_t *gid)
{
    struct stat st;
    if (!DT_CHECK(stat(d->socket, &st) == 0, "stat %s: %s", d->socket, strerror(errno)))
        return 0;
    if (gid)
        *gid = st.st_gid;
    return st.st_mode & 07777;
}

/* Starts a daemon with extra and lets everyone through its directory (the
 * socket's own mode is what is tested). */
static int start(kvd_test_daemon_t *d, const char *const *extra)
{
    if (dt_start(d, extra) != 0)
        return -1;
    return DT_CHECK(chmod(d->dir, 0711) == 0, "chmod %s", d->dir) ? 0 : -1;
}

static void modes(void)
{
    kvd_test_daemon_t d = {0};
    if (dt_start(&d, NULL) == 0) {
        unsigned m = socket_mode(&d, NULL);
        DT_CHECK(m == 0600, "default socket mode %04o, want 0600", m);
    }
    dt_stop(&d, SIGTERM, 10000);
    char gid[16];
    snprintf(gid, sizeof(gid), "%u", (unsigned)getegid());
    if (dt_start(&d, (const char *[]){"--allow-gid", gid, NULL}) == 0) {
        gid_t g = 0;
        unsigned m = socket_mode(&d, &g);
        DT_CHECK(m == 0660 && g == getegid(),
                 "--allow-gid %s: mode %04o group %u, want 0660 %s", gid, m, (unsigned)g,
                 gid);
    }
    dt_stop(&d, SIGTERM, 10000);
}

static void peers(void)
{
    kvd_test_daemon_t d = {0};
    /* nobody reaches the socket (0666) but is not on the allow list */
    if (start(&d, (const char *[]){"--allow-uid", "0,4242", NULL}) == 0) {
        unsigned m = socket_mode(&d, NULL);
        DT_CHECK(m == 0666, "--allow-uid 0,4242: mode %04o, want 0666", m);
        int v = as_nobody(d.socket, "default", false);
        DT_CHECK(v == C_REFUSED,
                 "uid %d not allowed: child verdict %d, want %d (refused, "
                 "then closed)",
                 NOBODY, v, C_REFUSED);
        kvd_stats_rep_t st;
        DT_CHECK(dt_stats_fresh(d.socket, &st) == KVD_OK && st.auth_failures == 1,
                 "auth_failures %llu, want 1", (unsigned long long)st.auth_failures);
        DT_CHECK(kvd_test_file_contains(&d.log[0], "unix uid 65534"),
                 "the refusal's log line should name the peer's uid");
    }
    dt_stop(&d, SIGTERM, 10000);
    /* by its group */
    if (start(&d, (const char *[]){"--allow-gid", "65534", NULL}) == 0) {
        gid_t g = 0;
        unsigned m = socket_mode(&d, &g);
        DT_CHECK(m == 0660 && g == NOBODY, "--allow-gid 65534: mode %04o group %u", m,
                 (unsigned)g);
        int v = as_nobody(d.socket, "default", false);
        DT_CHECK(v == C_SERVED, "gid %d allowed: child verdict %d, want served", NOBODY,
                 v);
    }
    dt_stop(&d, SIGTERM, 10000);
    /* mapped to a tenant by the auth config */
    char conf[64];
    snprintf(conf, sizeof(conf), "/tmp/kvdock-auth-conf-XXXXXX");
    int fd = mkstemp(conf);
    if (!DT_CHECK(fd >= 0, "mkstemp"))
        return;
    const char *text = "tenant t1 max-namespaces=4\nuid t1 65534 read-only\n";
    DT_CHECK(write(fd, text, strlen(text)) == (ssize_t)strlen(text), "write %s", conf);
    close(fd);
    if (start(&d, (const char *[]){"--auth-config", conf, NULL}) == 0) {
        int v = as_nobody(d.socket, "t1", true);
        DT_CHECK(v == C_SERVED, "uid %d mapped to t1: child verdict %d, want served",
                 NOBODY, v);
        /* our own uid is the default tenant's operator; read_only narrows it */
        kvd_client_t *c = dt_connect(d.socket, false);
        if (c) {
            kvd_msg_t req, rep;
            kvd_msg_request(&req, 0, KVD_METHOD_HELLO);
            req.body.hello_req.protocol_version = KVD_PROTOCOL_VERSION;
            req.body.hello_req.read_only = true;
            int rc = kvd_client_call(c, &req, &rep, TIMEOUT_MS);
            DT_CHECK(rc == KVD_OK && rep.status == KVD_OK &&
                         strcmp(rep.body.hello_rep.tenant, "default") == 0 &&
                         rep.body.hello_rep.read_only,
                     "a read-only Hello: %s/%d tenant '%s' read_only %d",
                     kvd_status_str(rc), rep.status, rep.body.hello_rep.tenant,
                     rep.body.hello_rep.read_only);
            kvd_msg_clear(&rep);
            kvd_client_close(c);
        }
    }
    dt_stop(&d, SIGTERM, 10000);
    unlink(conf);
}

int main(void)
{
    modes();
    if (geteuid() != 0)
        printf("skipping the other-uid checks: they need root to become uid %d "
               "(running as uid %u)\n",
               NOBODY, (unsigned)geteuid());
    else
        peers();
    return dt_exit_status("daemon/auth_unix");
}
