/*
 * Description: the etcd v3 gateway client (daemon/etcd.c) against a real
 * etcd that the test starts on free loopback ports in a temporary data
 * directory. Binary keys and values (NUL bytes, quotes, 0xff) round-trip
 * through put, get, get_prefix and delete, and a prefix that matches
 * nothing reads empty; compare-and-put succeeds once, then fails returning
 * the current value, and fails on a stale mod_revision; a lease keeps its
 * key while kept alive, loses it when not, then answers NOT_FOUND, and a
 * revoke deletes at once; a watch sees the puts and deletes under its
 * prefix in order, nothing else, and nothing is lost between a range and a
 * watch from its revision + 1; with etcd SIGKILLed a watch ends CLOSED
 * within bounded polls and calls answer UNAVAILABLE, and after a restart on
 * the same data they work again; a dead endpoint in front of a live one is
 * passed over. A fake gateway in a thread answers non-JSON, JSON without
 * the fields, JSON of the wrong types, bad base64, a 500, a close, silence
 * and an endless watch line: each call fails with PROTOCOL or UNAVAILABLE
 * and nothing crashes or hangs. Every byte the client charged is given
 * back. Skips (77) where /usr/bin/etcd is missing.
 */
#include "dtest.h"
#include "etcd.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define ETCD_BIN     "/usr/bin/etcd"
#define CALL_TIMEOUT 2000 /* ms: each client call */

/* ------------------------------------------------------------ real etcd */

typedef struct etcd_proc {
    pid_t pid;
    char dir[64];
    int client_port, peer_port;
    char url[64];
} etcd_proc_t;

/* Starts etcd on p's ports and data dir and waits (bounded) until /health
 * answers true. 0, or -1 (its log printed). */
static int etcd_spawn(etcd_proc_t *p)
{
    char data[128], log[128], client[64], peer[64], cluster[96];
    snprintf(data, sizeof(data), "%s/data", p->dir);
    snprintf(log, sizeof(log), "%s/etcd.log", p->dir);
    snprintf(client, sizeof(client), "http://127.0.0.1:%d", p->client_port);
    snprintf(peer, sizeof(peer), "http://127.0.0.1:%d", p->peer_port);
    snprintf(cluster, sizeof(cluster), "t=%s", peer);
    snprintf(p->url, sizeof(p->url), "%s", client);
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0600);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        execl(ETCD_BIN, ETCD_BIN, "--name", "t", "--data-dir", data,
              "--listen-client-urls", client, "--advertise-client-urls", client,
              "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
              "--initial-cluster", cluster, (char *)NULL);
        _exit(127);
    }
    p->pid = pid;
    char body[256];
    for (int i = 0; i < 300; i++) { /* 30 s at most */
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid) {
            p->pid = 0;
            fprintf(stderr, "etcd exited at start (status %d):\n", st);
            kvd_dump_file(log);
            return -1;
        }
        if (dt_http_get(p->client_port, "/health", body, sizeof(body), 500) == 200 &&
            strstr(body, "true"))
            return 0;
        usleep(100 * 1000);
    }
    fprintf(stderr, "etcd did not answer /health:\n");
    kvd_dump_file(log);
    return -1;
}

static int etcd_start(etcd_proc_t *p)
{
    memset(p, 0, sizeof(*p));
    snprintf(p->dir, sizeof(p->dir), "/tmp/kvd-etcd-XXXXXX");
    if (!mkdtemp(p->dir))
        return -1;
    p->client_port = dt_free_port();
    p->peer_port = dt_free_port();
    while (p->peer_port == p->client_port)
        p->peer_port = dt_free_port();
    return etcd_spawn(p);
}

/* Stops etcd by its pid: sig, then SIGKILL after a bound. */
static void etcd_kill(etcd_proc_t *p, int sig)
{
    if (p->pid <= 0)
        return;
    kill(p->pid, sig);
    if (kvd_test_wait_pid(p->pid, 10000, NULL) != 0) {
        kill(p->pid, SIGKILL);
        kvd_test_wait_pid(p->pid, 10000, NULL);
    }
    p->pid = 0;
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path);
}

static void etcd_stop(etcd_proc_t *p)
{
    etcd_kill(p, SIGTERM);
    if (p->dir[0])
        nftw(p->dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    p->dir[0] = '\0';
}

/* ------------------------------------------------------------ helpers */

static bool kv_is(const kvd_etcd_kv_t *kv, const char *key, size_t key_len,
                  const char *value, size_t value_len)
{
    return kv->key_len == key_len && memcmp(kv->key, key, key_len) == 0 &&
           kv->key[key_len] == '\0' && kv->value_len == value_len &&
           memcmp(kv->value, value, value_len) == 0 && kv->value[value_len] == '\0';
}

#define S(lit) lit, sizeof(lit) - 1

/* ------------------------------------------------------------ kv */

static void test_kv(kvd_etcd_t *e)
{
    static const char k1[] = "t/kv/a \"b\\\n\0c";
    static const char v1[] = "\0bin\0\xff\x01\"}";
    static const char k2[] = "t/kv/b";
    int64_t rev1 = 0, rev2 = 0, deleted = -1;
    DT_CHECK(kvd_etcd_put(e, S(k1), S(v1), 0, &rev1) == KVD_OK, "put: %s",
             kvd_etcd_error(e));
    DT_CHECK(kvd_etcd_put(e, S(k2), "", 0, 0, &rev2) == KVD_OK, "put empty value");
    DT_CHECK(rev1 > 0 && rev2 > rev1, "revisions %lld then %lld", (long long)rev1,
             (long long)rev2);
    /* neighbours of the prefix that must stay out of it */
    DT_CHECK(kvd_etcd_put(e, S("t/kv0"), S("x"), 0, NULL) == KVD_OK, "put t/kv0");
    DT_CHECK(kvd_etcd_put(e, S("t/kv"), S("x"), 0, NULL) == KVD_OK, "put t/kv");

    kvd_etcd_kvs_t got;
    DT_CHECK(kvd_etcd_get(e, S(k1), &got) == KVD_OK, "get: %s", kvd_etcd_error(e));
    if (DT_CHECK(got.n == 1, "get: %zu pairs", got.n)) {
        DT_CHECK(kv_is(&got.kv[0], S(k1), S(v1)), "get: the bytes that were put");
        DT_CHECK(got.kv[0].mod_revision == rev1 && got.kv[0].create_revision == rev1 &&
                     got.kv[0].version == 1 && got.kv[0].lease == 0,
                 "get: revisions of the put");
        DT_CHECK(got.revision >= rev2 + 2, "get: read at revision %lld",
                 (long long)got.revision);
    }
    kvd_etcd_kvs_free(&got);

    DT_CHECK(kvd_etcd_get_prefix(e, S("t/kv/"), &got) == KVD_OK, "get_prefix");
    if (DT_CHECK(got.n == 2, "get_prefix: %zu pairs, want 2", got.n)) {
        DT_CHECK(kv_is(&got.kv[0], S(k1), S(v1)), "get_prefix: first by key");
        DT_CHECK(kv_is(&got.kv[1], S(k2), "", 0), "get_prefix: second, empty value");
    }
    kvd_etcd_kvs_free(&got);

    DT_CHECK(kvd_etcd_get_prefix(e, S("t/nothing/"), &got) == KVD_OK && got.n == 0 &&
                 got.kv == NULL && got.revision > 0,
             "a prefix that matches nothing: empty, with a revision");
    kvd_etcd_kvs_free(&got);
    DT_CHECK(kvd_etcd_get(e, S("t/absent"), &got) == KVD_OK && got.n == 0, "absent key");
    kvd_etcd_kvs_free(&got);

    /* a prefix ending in 0xff: its range ends past the byte before it */
    DT_CHECK(kvd_etcd_put(e, S("t/\xff\xff"), S("1"), 0, NULL) == KVD_OK, "put 0xff key");
    DT_CHECK(kvd_etcd_put(e, S("t0"), S("1"), 0, NULL) == KVD_OK, "put t0");
    DT_CHECK(kvd_etcd_get_prefix(e, S("t/\xff"), &got) == KVD_OK && got.n == 1 &&
                 kv_is(&got.kv[0], S("t/\xff\xff"), S("1")),
             "prefix t/0xff: only t/0xff0xff (%zu)", got.n);
    kvd_etcd_kvs_free(&got);

    DT_CHECK(kvd_etcd_delete(e, S(k1), &deleted) == KVD_OK && deleted == 1,
             "delete: %lld", (long long)deleted);
    DT_CHECK(kvd_etcd_get(e, S(k1), &got) == KVD_OK && got.n == 0, "deleted key is gone");
    kvd_etcd_kvs_free(&got);
    DT_CHECK(kvd_etcd_delete(e, S(k1), &deleted) == KVD_OK && deleted == 0,
             "delete of an absent key: 0");

    DT_CHECK(kvd_etcd_put(e, NULL, 0, S("x"), 0, NULL) == KVD_ERR_INVALID, "empty key");
}

/* ------------------------------------------------------------ cas */

static void test_cas(kvd_etcd_t *e)
{
    bool done = false;
    kvd_etcd_kvs_t cur;
    DT_CHECK(kvd_etcd_cas(e, S("t/cas"), 0, S("v1"), 0, &done, &cur) == KVD_OK && done,
             "put-if-absent on an absent key: %s", kvd_etcd_error(e));
    kvd_etcd_kvs_free(&cur);
    DT_CHECK(kvd_etcd_cas(e, S("t/cas"), 0, S("v2"), 0, &done, &cur) == KVD_OK && !done,
             "second put-if-absent fails");
    int64_t mod1 = 0;
    if (DT_CHECK(cur.n == 1 && kv_is(&cur.kv[0], S("t/cas"), S("v1")),
                 "failed cas returns the current value"))
        mod1 = cur.kv[0].mod_revision;
    DT_CHECK(cur.revision >= mod1, "current read at a revision");
    kvd_etcd_kvs_free(&cur);

    DT_CHECK(kvd_etcd_cas(e, S("t/cas"), mod1, S("v3"), 0, &done, NULL) == KVD_OK && done,
             "cas on the current mod_revision");
    DT_CHECK(kvd_etcd_cas(e, S("t/cas"), mod1, S("v4"), 0, &done, &cur) == KVD_OK &&
                 !done,
             "cas on a stale mod_revision fails");
    DT_CHECK(cur.n == 1 && kv_is(&cur.kv[0], S("t/cas"), S("v3")) &&
                 cur.kv[0].mod_revision > mod1,
             "and returns the value now");
    kvd_etcd_kvs_free(&cur);
}

/* ------------------------------------------------------------ leases */

static void test_leases(kvd_etcd_t *e)
{
    int64_t id = 0;
    int ttl = 0;
    if (!DT_CHECK(kvd_etcd_lease_grant(e, 2, &id, &ttl) == KVD_OK && id != 0 && ttl >= 2,
                  "grant: %s", kvd_etcd_error(e)))
        return;
    DT_CHECK(kvd_etcd_put(e, S("t/lease/a"), S("x"), id, NULL) == KVD_OK,
             "put with lease");
    kvd_etcd_kvs_t got;
    DT_CHECK(kvd_etcd_get(e, S("t/lease/a"), &got) == KVD_OK && got.n == 1 &&
                 got.kv[0].lease == id,
             "the key carries the lease");
    kvd_etcd_kvs_free(&got);
    int left = 0;
    DT_CHECK(kvd_etcd_lease_keepalive(e, id, &left) == KVD_OK && left > 0,
             "keepalive: %d (%s)", left, kvd_etcd_error(e));

    /* not kept alive: the key goes (bounded wait on the condition) */
    bool gone = false;
    for (int i = 0; i < 300 && !gone; i++) {
        if (kvd_etcd_get(e, S("t/lease/a"), &got) == KVD_OK && got.n == 0)
            gone = true;
        kvd_etcd_kvs_free(&got);
        if (!gone)
            usleep(100 * 1000);
    }
    DT_CHECK(gone, "the key of a lapsed lease disappears");
    DT_CHECK(kvd_etcd_lease_keepalive(e, id, &left) == KVD_ERR_NOT_FOUND,
             "keepalive of a lapsed lease: NOT_FOUND");

    int64_t id2 = 0;
    DT_CHECK(kvd_etcd_lease_grant(e, 30, &id2, NULL) == KVD_OK, "grant 30 s");
    DT_CHECK(kvd_etcd_put(e, S("t/lease/b"), S("y"), id2, NULL) == KVD_OK,
             "put with lease 2");
    DT_CHECK(kvd_etcd_lease_revoke(e, id2) == KVD_OK, "revoke: %s", kvd_etcd_error(e));
    DT_CHECK(kvd_etcd_get(e, S("t/lease/b"), &got) == KVD_OK && got.n == 0,
             "revoke deletes the key at once");
    kvd_etcd_kvs_free(&got);
    DT_CHECK(kvd_etcd_lease_revoke(e, id2) == KVD_ERR_NOT_FOUND,
             "second revoke: NOT_FOUND");
    DT_CHECK(kvd_etcd_lease_keepalive(e, id2, NULL) == KVD_ERR_NOT_FOUND,
             "keepalive of a revoked lease: NOT_FOUND");
    DT_CHECK(kvd_etcd_put(e, S("t/lease/c"), S("z"), id2, NULL) == KVD_ERR_NOT_FOUND,
             "put with a revoked lease: NOT_FOUND (%s)", kvd_etcd_error(e));
}

/* ------------------------------------------------------------ watch */

/* Polls until want events came (bounded), appending them to all. Returns
 * the last poll's status. */
static int collect(kvd_etcd_watch_t *w, kvd_etcd_event_t *all, size_t cap, size_t *n_all,
                   size_t want)
{
    int rc = KVD_OK;
    for (int i = 0; i < 100 && *n_all < want && rc == KVD_OK; i++) {
        kvd_etcd_event_t *ev = NULL;
        size_t n = 0;
        rc = kvd_etcd_watch_poll(w, 100, &ev, &n);
        for (size_t j = 0; j < n; j++) {
            if (*n_all < cap) {
                all[*n_all] = ev[j];
                memset(&ev[j].kv, 0, sizeof(ev[j].kv)); /* moved */
            }
            (*n_all)++;
        }
        kvd_etcd_events_free(ev, n);
    }
    return rc;
}

static void events_clear(kvd_etcd_event_t *all, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        kvd_etcd_kv_t *kv = &all[i].kv;
        if (kv->key)
            kvd_mem_free(KVD_MEM_OTHER, kv->key, kv->key_len + 1);
        if (kv->value)
            kvd_mem_free(KVD_MEM_OTHER, kv->value, kv->value_len + 1);
    }
}

static void test_watch(kvd_etcd_t *e)
{
    kvd_etcd_kvs_t got;
    DT_CHECK(kvd_etcd_put(e, S("t/w/0"), S("before"), 0, NULL) == KVD_OK, "put t/w/0");
    if (!DT_CHECK(kvd_etcd_get_prefix(e, S("t/w/"), &got) == KVD_OK && got.n == 1,
                  "range"))
        return;
    int64_t range_rev = got.revision;
    kvd_etcd_kvs_free(&got);
    /* between the range and the watch: must not be missed */
    int64_t rev_a = 0, rev_del = 0;
    DT_CHECK(kvd_etcd_put(e, S("t/w/a"), S("A\0a"), 0, &rev_a) == KVD_OK, "put t/w/a");

    kvd_etcd_watch_t *w = NULL;
    if (!DT_CHECK(kvd_etcd_watch_start(e, S("t/w/"), range_rev + 1, &w) == KVD_OK,
                  "watch_start: %s", kvd_etcd_error(e)))
        return;
    DT_CHECK(kvd_etcd_put(e, S("t/x"), S("other"), 0, NULL) == KVD_OK, "put t/x");
    DT_CHECK(kvd_etcd_put(e, S("t/w"), S("other"), 0, NULL) == KVD_OK, "put t/w");
    DT_CHECK(kvd_etcd_put(e, S("t/w/b"), S("B"), 0, NULL) == KVD_OK, "put t/w/b");
    DT_CHECK(kvd_etcd_delete(e, S("t/w/a"), NULL) == KVD_OK, "delete t/w/a");
    DT_CHECK(kvd_etcd_put(e, S("t/w/end"), S("E"), 0, &rev_del) == KVD_OK, "put t/w/end");

    kvd_etcd_event_t all[8];
    size_t n = 0;
    int rc = collect(w, all, 8, &n, 4);
    DT_CHECK(rc == KVD_OK, "polls: %s", kvd_status_str(rc));
    if (DT_CHECK(n == 4, "4 events under the prefix, got %zu", n)) {
        DT_CHECK(!all[0].is_delete && kv_is(&all[0].kv, S("t/w/a"), S("A\0a")) &&
                     all[0].kv.mod_revision == rev_a,
                 "1: the put between range and watch");
        DT_CHECK(!all[1].is_delete && kv_is(&all[1].kv, S("t/w/b"), S("B")),
                 "2: put t/w/b");
        DT_CHECK(all[2].is_delete && all[2].kv.key_len == 5 &&
                     memcmp(all[2].kv.key, "t/w/a", 5) == 0 &&
                     all[2].kv.mod_revision > all[1].kv.mod_revision,
                 "3: delete t/w/a");
        DT_CHECK(!all[3].is_delete && kv_is(&all[3].kv, S("t/w/end"), S("E")),
                 "4: put t/w/end");
    }
    events_clear(all, n < 8 ? n : 8);
    DT_CHECK(kvd_etcd_watch_revision(w) == rev_del, "watch revision %lld, want %lld",
             (long long)kvd_etcd_watch_revision(w), (long long)rev_del);
    /* nothing more: an idle poll returns OK and no events */
    kvd_etcd_event_t *ev = (kvd_etcd_event_t *)1;
    size_t k = 99;
    DT_CHECK(kvd_etcd_watch_poll(w, 200, &ev, &k) == KVD_OK && k == 0 && ev == NULL,
             "idle poll: no events (%zu)", k);
    kvd_etcd_watch_stop(w);
}

/* POSTs body to 127.0.0.1:port/path (HTTP/1.0, bounded): the status, or
 * -1. For what the client has no call for (a compaction). */
static int http_post(int port, const char *path, const char *body)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    char req[512], resp[512];
    int n = snprintf(
        req, sizeof(req),
        "POST %s HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        "Content-Length: %zu\r\n\r\n%s",
        path, strlen(body), body);
    int status = -1;
    if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
        send(fd, req, (size_t)n, MSG_NOSIGNAL) == n) {
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        ssize_t r = poll(&pf, 1, 5000) > 0 ? recv(fd, resp, sizeof(resp) - 1, 0) : -1;
        if (r > 0) {
            resp[r] = '\0';
            if (sscanf(resp, "HTTP/%*s %d", &status) != 1)
                status = -1;
        }
    }
    if (fd >= 0)
        close(fd);
    return status;
}

/* A watch from a compacted revision ends CLOSED. */
static void test_watch_compacted(etcd_proc_t *p, kvd_etcd_t *e)
{
    int64_t rev = 0;
    DT_CHECK(kvd_etcd_put(e, S("t/c/1"), S("1"), 0, NULL) == KVD_OK, "put");
    DT_CHECK(kvd_etcd_put(e, S("t/c/2"), S("2"), 0, &rev) == KVD_OK, "put");
    char body[64];
    snprintf(body, sizeof(body), "{\"revision\":\"%lld\"}", (long long)rev);
    if (!DT_CHECK(http_post(p->client_port, "/v3/kv/compaction", body) == 200,
                  "compaction"))
        return;
    kvd_etcd_watch_t *w = NULL;
    int rc = kvd_etcd_watch_start(e, S("t/c/"), 2, &w);
    if (rc == KVD_OK) {
        kvd_etcd_event_t all[4];
        size_t n = 0;
        rc = collect(w, all, 4, &n, 1000);
        events_clear(all, n < 4 ? n : 4);
        kvd_etcd_watch_stop(w);
    }
    DT_CHECK(rc == KVD_ERR_CLOSED, "a watch from a compacted revision: CLOSED, got %s",
             kvd_status_str(rc));
}

/* etcd SIGKILLed under a watch, then restarted on the same data. */
static void test_kill_restart(etcd_proc_t *p, kvd_etcd_t *e)
{
    kvd_etcd_watch_t *w = NULL;
    DT_CHECK(kvd_etcd_put(e, S("t/k/keep"), S("kept"), 0, NULL) == KVD_OK, "put");
    if (!DT_CHECK(kvd_etcd_watch_start(e, S("t/k/"), 0, &w) == KVD_OK, "watch_start now"))
        return;
    etcd_kill(p, SIGKILL);
    kvd_etcd_event_t all[4];
    size_t n = 0;
    int rc = collect(w, all, 4, &n, 1000);
    events_clear(all, n < 4 ? n : 4);
    DT_CHECK(rc == KVD_ERR_CLOSED, "watch of a killed etcd: CLOSED, got %s",
             kvd_status_str(rc));
    kvd_etcd_watch_stop(w);

    /* down: every call says UNAVAILABLE, and returns (no hang) */
    uint64_t t0 = kvd_now_ns();
    kvd_etcd_kvs_t got;
    int64_t id;
    DT_CHECK(kvd_etcd_put(e, S("t/k/x"), S("x"), 0, NULL) == KVD_ERR_UNAVAILABLE,
             "put down");
    DT_CHECK(kvd_etcd_get(e, S("t/k/x"), &got) == KVD_ERR_UNAVAILABLE, "get down");
    DT_CHECK(kvd_etcd_lease_grant(e, 5, &id, NULL) == KVD_ERR_UNAVAILABLE, "grant down");
    DT_CHECK(kvd_etcd_watch_start(e, S("t/k/"), 0, &w) == KVD_ERR_UNAVAILABLE,
             "watch down");
    DT_CHECK(kvd_etcd_error(e)[0] != '\0', "an error string: %s", kvd_etcd_error(e));
    /* a hang check, not a timing claim: 4 calls of 2 s each at most */
    DT_CHECK(kvd_now_ns() - t0 < 30ull * 1000000000ull, "calls while down returned");

    if (!DT_CHECK(etcd_spawn(p) == 0, "etcd restarts on its data"))
        return;
    bool back = false;
    for (int i = 0; i < 100 && !back; i++) { /* the leader may take a moment */
        back = kvd_etcd_get(e, S("t/k/keep"), &got) == KVD_OK;
        if (back)
            DT_CHECK(got.n == 1 && kv_is(&got.kv[0], S("t/k/keep"), S("kept")),
                     "the key from before the kill");
        kvd_etcd_kvs_free(&got);
        if (!back)
            usleep(100 * 1000);
    }
    DT_CHECK(back, "calls work after the restart: %s", kvd_etcd_error(e));
    DT_CHECK(kvd_etcd_put(e, S("t/k/y"), S("y"), 0, NULL) == KVD_OK, "put after restart");
    DT_CHECK(kvd_etcd_watch_start(e, S("t/k/"), 0, &w) == KVD_OK, "watch after restart");
    kvd_etcd_watch_stop(w);
}

static void test_failover(etcd_proc_t *p)
{
    char eps[160];
    snprintf(eps, sizeof(eps), "http://127.0.0.1:%d,%s/", dt_free_port(), p->url);
    kvd_etcd_t *e = NULL;
    if (!DT_CHECK(kvd_etcd_create(eps, CALL_TIMEOUT, &e) == KVD_OK, "create %s", eps))
        return;
    kvd_etcd_kvs_t got;
    DT_CHECK(kvd_etcd_put(e, S("t/f"), S("f"), 0, NULL) == KVD_OK,
             "put through the live one: %s", kvd_etcd_error(e));
    DT_CHECK(strcmp(kvd_etcd_endpoint(e), p->url) == 0, "endpoint %s",
             kvd_etcd_endpoint(e));
    DT_CHECK(kvd_etcd_get(e, S("t/f"), &got) == KVD_OK && got.n == 1, "get");
    kvd_etcd_kvs_free(&got);
    kvd_etcd_watch_t *w = NULL;
    DT_CHECK(kvd_etcd_watch_start(e, S("t/f"), 0, &w) == KVD_OK, "watch");
    kvd_etcd_watch_stop(w);
    kvd_etcd_destroy(e);

    DT_CHECK(kvd_etcd_create("ftp://x", CALL_TIMEOUT, &e) == KVD_ERR_INVALID,
             "bad scheme");
    DT_CHECK(kvd_etcd_create("", CALL_TIMEOUT, &e) == KVD_ERR_INVALID, "no endpoint");
}

/* ------------------------------------------------------------ fake gateway */

enum fake_mode {
    FAKE_NOT_JSON,
    FAKE_EMPTY_OBJECT,
    FAKE_WRONG_TYPES,
    FAKE_BAD_BASE64,
    FAKE_500,
    FAKE_CLOSE,
    FAKE_SILENT,
    FAKE_HUGE_LINE,
    FAKE_MODES
};

typedef struct fake {
    int listen_fd, port;
    atomic_int mode;
    atomic_bool stop;
    pthread_t thread;
} fake_t;

static void fake_send(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w <= 0)
            return;
        p += w;
        n -= (size_t)w;
    }
}

static void fake_reply(int fd, int status, const char *body)
{
    char head[256];
    int n = snprintf(
        head, sizeof(head),
        "HTTP/1.1 %d X\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n"
        "Connection: close\r\n\r\n",
        status, strlen(body));
    fake_send(fd, head, (size_t)n);
    fake_send(fd, body, strlen(body));
}

/* Reads the request's head (bounded); the body is not needed. */
static void fake_read_request(fake_t *f, int fd)
{
    char buf[8192];
    size_t used = 0;
    for (int i = 0; i < 50 && !atomic_load(&f->stop); i++) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 100) <= 0)
            continue;
        ssize_t r = recv(fd, buf + used, sizeof(buf) - 1 - used, 0);
        if (r <= 0)
            return;
        used += (size_t)r;
        buf[used] = '\0';
        if (strstr(buf, "\r\n\r\n") || used == sizeof(buf) - 1)
            return;
    }
}

static void fake_serve(fake_t *f, int fd)
{
    fake_read_request(f, fd);
    switch (atomic_load(&f->mode)) {
    case FAKE_NOT_JSON: fake_reply(fd, 200, "this is not JSON {"); break;
    case FAKE_EMPTY_OBJECT: fake_reply(fd, 200, "{}"); break;
    case FAKE_WRONG_TYPES:
        fake_reply(
            fd, 200,
            "{\"header\":{\"revision\":{}},\"kvs\":\"no\",\"ID\":\"abc\",\"TTL\":[],"
            "\"succeeded\":\"yes\",\"deleted\":\"-\",\"result\":{\"TTL\":\"zz\","
            "\"created\":1}}\n");
        break;
    case FAKE_BAD_BASE64:
        fake_reply(fd, 200,
                   "{\"header\":{\"revision\":\"7\"},\"kvs\":[{\"key\":\"@@@\"}],"
                   "\"succeeded\":false,\"responses\":[{\"response_range\":{\"kvs\":"
                   "[{\"key\":\"YQ\"}]}}],\"result\":{\"created\":true}}\n"
                   "{\"result\":{\"events\":[{\"kv\":{\"key\":\"@@@@\"}}]}}\n");
        break;
    case FAKE_500: fake_reply(fd, 500, "{\"error\":\"down\"}"); break;
    case FAKE_CLOSE: break;
    case FAKE_SILENT: /* hold the connection until the client gives up */
        for (int i = 0; i < 100 && !atomic_load(&f->stop); i++) {
            struct pollfd p = {.fd = fd, .events = POLLIN};
            char c[256];
            if (poll(&p, 1, 100) > 0 && recv(fd, c, sizeof(c), 0) <= 0)
                break;
        }
        break;
    case FAKE_HUGE_LINE: {
        const char *head =
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            "Connection: close\r\n\r\n"
            "{\"result\":{\"header\":{\"revision\":\"3\"},\"created\":true}}\n";
        fake_send(fd, head, strlen(head));
        static char chunk[65536];
        memset(chunk, 'x', sizeof(chunk));
        for (int i = 0; i < 100 && !atomic_load(&f->stop); i++) /* 6.4 MiB */
            fake_send(fd, chunk, sizeof(chunk));
        break;
    }
    }
    close(fd);
}

static void *fake_main(void *arg)
{
    fake_t *f = arg;
    while (!atomic_load(&f->stop)) {
        struct pollfd p = {.fd = f->listen_fd, .events = POLLIN};
        if (poll(&p, 1, 100) <= 0)
            continue;
        int fd = accept4(f->listen_fd, NULL, NULL, SOCK_CLOEXEC);
        if (fd >= 0)
            fake_serve(f, fd);
    }
    return NULL;
}

static int fake_start(fake_t *f)
{
    memset(f, 0, sizeof(*f));
    f->listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(a);
    if (f->listen_fd < 0 || bind(f->listen_fd, (struct sockaddr *)&a, sizeof(a)) != 0 ||
        listen(f->listen_fd, 16) != 0 ||
        getsockname(f->listen_fd, (struct sockaddr *)&a, &len) != 0)
        return -1;
    f->port = ntohs(a.sin_port);
    return pthread_create(&f->thread, NULL, fake_main, f) == 0 ? 0 : -1;
}

static void fake_stop(fake_t *f)
{
    atomic_store(&f->stop, true);
    pthread_join(f->thread, NULL);
    close(f->listen_fd);
}

/* What a call gets from the fake in each mode. In FAKE_BAD_BASE64 the
 * replies are right but for their keys, so only the calls that decode
 * keys fail: put and delete succeed, keepalive finds no TTL (the lease is
 * gone) and grant no ID. */
static bool bad_status(int rc, int mode)
{
    if (mode == FAKE_500 || mode == FAKE_CLOSE || mode == FAKE_SILENT)
        return rc == KVD_ERR_UNAVAILABLE;
    return rc == KVD_ERR_PROTOCOL;
}

static void test_garbage(void)
{
    fake_t f;
    if (!DT_CHECK(fake_start(&f) == 0, "fake gateway"))
        return;
    char url[64];
    snprintf(url, sizeof(url), "http://127.0.0.1:%d", f.port);
    kvd_etcd_t *e = NULL;
    if (!DT_CHECK(kvd_etcd_create(url, 500, &e) == KVD_OK, "create"))
        goto out;
    for (int mode = 0; mode < FAKE_HUGE_LINE; mode++) {
        atomic_store(&f.mode, mode);
        kvd_etcd_kvs_t got;
        int64_t id = 0, rev = 0;
        int ttl = 0;
        bool done = false;
        int rc;
        uint64_t t0 = kvd_now_ns();
        bool b64 = mode == FAKE_BAD_BASE64;
        rc = kvd_etcd_put(e, S("k"), S("v"), 0, &rev);
        DT_CHECK(b64 ? rc == KVD_OK && rev == 7 : bad_status(rc, mode), "mode %d put: %s",
                 mode, kvd_status_str(rc));
        rc = kvd_etcd_get(e, S("k"), &got);
        DT_CHECK(bad_status(rc, mode) && got.n == 0, "mode %d get: %s", mode,
                 kvd_status_str(rc));
        kvd_etcd_kvs_free(&got);
        rc = kvd_etcd_get_prefix(e, S("k"), &got);
        DT_CHECK(bad_status(rc, mode), "mode %d get_prefix: %s", mode,
                 kvd_status_str(rc));
        kvd_etcd_kvs_free(&got);
        rc = kvd_etcd_lease_grant(e, 5, &id, &ttl);
        DT_CHECK(bad_status(rc, mode), "mode %d grant: %s", mode, kvd_status_str(rc));
        rc = kvd_etcd_lease_keepalive(e, 42, &ttl);
        DT_CHECK(b64 ? rc == KVD_ERR_NOT_FOUND : bad_status(rc, mode),
                 "mode %d keepalive: %s", mode, kvd_status_str(rc));
        rc = kvd_etcd_cas(e, S("k"), 0, S("v"), 0, &done, &got);
        DT_CHECK(bad_status(rc, mode), "mode %d cas: %s", mode, kvd_status_str(rc));
        kvd_etcd_kvs_free(&got);
        rc = kvd_etcd_delete(e, S("k"), NULL);
        DT_CHECK(b64 ? rc == KVD_OK : bad_status(rc, mode), "mode %d delete: %s", mode,
                 kvd_status_str(rc));
        kvd_etcd_watch_t *w = NULL;
        rc = kvd_etcd_watch_start(e, S("k"), 0, &w);
        if (b64) {
            /* created, then an event whose key is not base64 */
            DT_CHECK(rc == KVD_OK, "mode %d watch: %s", mode, kvd_status_str(rc));
            kvd_etcd_event_t all[2];
            size_t n = 0;
            rc = collect(w, all, 2, &n, 1000);
            DT_CHECK(rc == KVD_ERR_PROTOCOL && n == 0, "its poll: %s",
                     kvd_status_str(rc));
            kvd_etcd_watch_stop(w);
        } else {
            DT_CHECK(bad_status(rc, mode) && w == NULL, "mode %d watch: %s", mode,
                     kvd_status_str(rc));
        }
        DT_CHECK(kvd_now_ns() - t0 < 60ull * 1000000000ull, "mode %d: calls returned",
                 mode);
    }

    /* an endless line: the watch ends with PROTOCOL, not a growing buffer */
    atomic_store(&f.mode, FAKE_HUGE_LINE);
    kvd_etcd_watch_t *w = NULL;
    int rc = kvd_etcd_watch_start(e, S("k"), 0, &w);
    if (DT_CHECK(rc == KVD_OK, "huge line: watch_start %s", kvd_status_str(rc))) {
        kvd_etcd_event_t all[2];
        size_t n = 0;
        rc = collect(w, all, 2, &n, 1000);
        DT_CHECK(rc == KVD_ERR_PROTOCOL, "a line over 4 MiB: PROTOCOL, got %s",
                 kvd_status_str(rc));
        kvd_etcd_watch_stop(w);
    }
    kvd_etcd_destroy(e);
out:
    fake_stop(&f);
}

int main(void)
{
    if (access(ETCD_BIN, X_OK) != 0) {
        printf("SKIP: %s is missing (Debian package etcd-server)\n", ETCD_BIN);
        return KVD_TEST_SKIP;
    }
    uint64_t mem0 = kvd_mem_bytes(KVD_MEM_OTHER);
    test_garbage();

    etcd_proc_t p;
    if (etcd_start(&p) != 0) {
        DT_CHECK(false, "etcd starts");
        etcd_stop(&p);
        return dt_exit_status("etcd");
    }
    kvd_etcd_t *e = NULL;
    if (DT_CHECK(kvd_etcd_create(p.url, CALL_TIMEOUT, &e) == KVD_OK, "create")) {
        test_kv(e);
        test_cas(e);
        test_watch(e);
        test_watch_compacted(&p, e);
        test_leases(e);
        test_failover(&p);
        test_kill_restart(&p, e);
        kvd_etcd_destroy(e);
    }
    etcd_stop(&p);
    DT_CHECK(kvd_mem_bytes(KVD_MEM_OTHER) == mem0,
             "every charged byte given back (%llu left)",
             (unsigned long long)(kvd_mem_bytes(KVD_MEM_OTHER) - mem0));
    return dt_exit_status("etcd");
}
