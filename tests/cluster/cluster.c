/*
 * cluster.c - see cluster.h. JSON from the CLI is read with cJSON: the
 * tests check fields inside arrays of objects, which dtest.h's field finder
 * cannot tell apart.
 */
#include "cluster.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define ETCD_BIN "/usr/bin/etcd"

uint64_t kc_now_ms(void)
{
    return kvd_now_ns() / 1000000ull;
}

static char help_out[1 << 16];

bool kc_cli_has_flag(const char *cmd, const char *flag)
{
    char *argv[] = {(char *)kvd_test_bin("kvdock"), "--help", NULL};
    if (kvd_test_run(argv, help_out, sizeof(help_out), KC_CLI_MS) != 0)
        return false;
    char want[64];
    snprintf(want, sizeof(want), "\n  %s ", cmd);
    const char *line = strstr(help_out, want);
    if (line == NULL)
        return false;
    line++;
    const char *end = strchr(line, '\n');
    size_t len = end ? (size_t)(end - line) : strlen(line);
    const char *hit = strstr(line, flag);
    return hit != NULL && (size_t)(hit - line) < len;
}

/* ------------------------------------------------------------------ HTTP */

int kc_http(const char *host, int port, const char *method, const char *path,
            const char *body, char *out, size_t out_len, int timeout_ms)
{
    char port_s[16];
    snprintf(port_s, sizeof(port_s), "%d", port);
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM},
                    *ai = NULL;
    if (getaddrinfo(host, port_s, &hints, &ai) != 0)
        return -1;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        freeaddrinfo(ai);
        return -1;
    }
    uint64_t deadline = kc_now_ms() + (uint64_t)timeout_ms;
    int rc = connect(fd, ai->ai_addr, ai->ai_addrlen);
    freeaddrinfo(ai);
    if (rc != 0 && errno != EINPROGRESS)
        goto fail;
    struct pollfd p = {.fd = fd, .events = POLLOUT};
    if (poll(&p, 1, timeout_ms) != 1)
        goto fail;
    int err = 0;
    socklen_t el = sizeof(err);
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) != 0 || err != 0)
        goto fail;
    char req[2048];
    size_t blen = body ? strlen(body) : 0;
    int n = snprintf(req, sizeof(req),
                     "%s %s HTTP/1.0\r\nHost: %s:%d\r\nContent-Type: application/json\r\n"
                     "Content-Length: %zu\r\n\r\n%s",
                     method, path, host, port, blen, body ? body : "");
    if (n <= 0 || (size_t)n >= sizeof(req) || send(fd, req, (size_t)n, MSG_NOSIGNAL) != n)
        goto fail;
    static char buf[1 << 16];
    size_t used = 0;
    for (;;) {
        uint64_t now = kc_now_ms();
        if (now >= deadline)
            goto fail;
        p = (struct pollfd){.fd = fd, .events = POLLIN};
        if (poll(&p, 1, (int)(deadline - now)) != 1)
            goto fail;
        ssize_t r = recv(fd, buf + used, sizeof(buf) - 1 - used, 0);
        if (r < 0 && (errno == EAGAIN || errno == EINTR))
            continue;
        if (r < 0)
            goto fail;
        if (r == 0 || used + (size_t)r >= sizeof(buf) - 1) {
            used += (size_t)(r > 0 ? r : 0);
            break;
        }
        used += (size_t)r;
    }
    close(fd);
    buf[used] = '\0';
    int status = -1;
    if (sscanf(buf, "HTTP/%*s %d", &status) != 1)
        return -1;
    const char *b = strstr(buf, "\r\n\r\n");
    if (out != NULL && out_len > 0)
        kvd_strlcpy(out, b ? b + 4 : "", out_len);
    return status;
fail:
    close(fd);
    return -1;
}

/* ------------------------------------------------------------------ etcd */

bool kc_etcd_wait_healthy(const kc_etcd_t *e, int timeout_ms)
{
    uint64_t deadline = kc_now_ms() + (uint64_t)timeout_ms;
    char body[512];
    while (kc_now_ms() < deadline) {
        if (e->pid > 0 && waitpid(e->pid, NULL, WNOHANG) == e->pid)
            return false;
        if (kc_http(e->host, KC_ETCD_PORT, "GET", "/health", NULL, body, sizeof(body),
                    1000) == 200 &&
            strstr(body, "true") != NULL)
            return true;
        kvd_sleep_ns(100000000);
    }
    return false;
}

int kc_etcd_start(kc_cluster_t *c)
{
    kc_etcd_t *e = &c->etcd;
    char client[64], peer[64], initial[128];
    snprintf(client, sizeof(client), "http://%s:%d", e->host, KC_ETCD_PORT);
    snprintf(peer, sizeof(peer), "http://%s:%d", e->host, KC_ETCD_PEER);
    snprintf(initial, sizeof(initial), "%s=%s", e->name, peer);
    const char *argv[] = {ETCD_BIN, "--name",
                          e->name,  "--data-dir",
                          e->data,  "--listen-client-urls",
                          client,   "--advertise-client-urls",
                          client,   "--listen-peer-urls",
                          peer,     "--initial-advertise-peer-urls",
                          peer,     "--initial-cluster",
                          initial,  "--initial-cluster-state",
                          "new",    "--logger",
                          "zap",    "--log-outputs",
                          "stderr", NULL};
    e->pid = kc_spawn(NULL, argv, e->log);
    if (!DT_CHECK(e->pid > 0, "fork etcd"))
        return -1;
    kc_net_track(e->pid);
    if (!DT_CHECK(kc_etcd_wait_healthy(e, KC_READY_MS), "etcd at %s not healthy",
                  e->url)) {
        kvd_dump_file(e->log);
        return -1;
    }
    return 0;
}

void kc_etcd_stop(kc_cluster_t *c, int sig)
{
    kc_etcd_t *e = &c->etcd;
    if (e->pid <= 0)
        return;
    kill(e->pid, sig);
    if (kvd_wait_pid(e->pid, 10000, NULL) != 0) {
        kill(e->pid, SIGKILL);
        kvd_wait_pid(e->pid, 5000, NULL);
    }
    kc_net_untrack(e->pid);
    e->pid = 0;
}

/* --------------------------------------------------------------- set up */

static int remove_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    remove(path);
    return 0;
}

static void remove_tree(const char *dir)
{
    if (dir[0])
        nftw(dir, remove_one, 16, FTW_DEPTH | FTW_PHYS);
}

/* The cluster whose files the exit and signal paths remove. */
static kc_cluster_t *active;

static void remove_files(kc_cluster_t *c)
{
    for (int i = 0; i < c->n; i++) {
        remove_tree(c->node[i].dir);
        c->node[i].dir[0] = '\0';
    }
    remove_tree(c->etcd.dir);
    c->etcd.dir[0] = '\0';
    if (c->client_token_file[0])
        unlink(c->client_token_file);
    if (c->peer_token_file[0])
        unlink(c->peer_token_file);
    c->client_token_file[0] = c->peer_token_file[0] = '\0';
}

static void remove_active_files(void)
{
    if (active != NULL)
        remove_files(active);
}

int kc_setup(kc_cluster_t *c, int n, bool with_etcd)
{
    memset(c, 0, sizeof(*c));
    active = c;
    kc_net_at_teardown(remove_active_files);
    char why[512];
    int rc = kc_net_create(&c->net, n, why, sizeof(why));
    if (rc == KVD_TEST_SKIP) {
        printf("SKIP: %s\n", why);
        return KVD_TEST_SKIP;
    }
    if (!DT_CHECK(rc == 0, "network namespaces: %s", why))
        return -1;
    c->n = n;
    c->ttl_s = 3;
    kvd_strlcpy(c->name, c->net.prefix, sizeof(c->name));
    if (dt_token_file(KC_CLIENT_TOKEN, c->client_token_file,
                      sizeof(c->client_token_file)) ||
        dt_token_file(KC_PEER_TOKEN, c->peer_token_file, sizeof(c->peer_token_file)))
        return -1;
    for (int i = 0; i < n; i++) {
        kc_node_t *d = &c->node[i];
        kvd_strlcpy(d->ns, c->net.ns[i], sizeof(d->ns));
        snprintf(d->addr, sizeof(d->addr), "%s:%d", c->net.addr[i], KC_DAEMON_PORT);
        snprintf(d->node_id, sizeof(d->node_id), "node-%d", i);
        snprintf(d->instance, sizeof(d->instance), "%sd%d", c->net.prefix, i);
    }
    kc_etcd_t *e = &c->etcd;
    kvd_strlcpy(e->host, c->net.bridge_addr, sizeof(e->host));
    snprintf(e->url, sizeof(e->url), "http://%s:%d", e->host, KC_ETCD_PORT);
    snprintf(e->name, sizeof(e->name), "%se", c->net.prefix);
    if (!with_etcd)
        return 0;
    if (access(ETCD_BIN, X_OK) != 0) {
        printf("SKIP: no etcd at %s (Debian's etcd-server)\n", ETCD_BIN);
        return KVD_TEST_SKIP;
    }
    snprintf(e->dir, sizeof(e->dir), "/tmp/kvdock-etcd-XXXXXX");
    if (!DT_CHECK(mkdtemp(e->dir) != NULL, "mkdtemp: %s", strerror(errno))) {
        e->dir[0] = '\0';
        return -1;
    }
    snprintf(e->log, sizeof(e->log), "%s/etcd.log", e->dir);
    snprintf(e->data, sizeof(e->data), "%s/data", e->dir);
    return kc_etcd_start(c);
}

void kc_teardown(kc_cluster_t *c)
{
    bool failed = dt_failure_count() > 0;
    for (int i = 0; i < c->n; i++) {
        if (c->node[i].pid > 0)
            kc_node_stop(c, i, SIGTERM, 10000, true);
    }
    failed = failed || dt_failure_count() > 0;
    for (int i = 0; failed && i < c->n; i++)
        if (c->node[i].log[0]) {
            fprintf(stderr, "---- log of %s (%s, %s)\n", c->node[i].node_id,
                    c->node[i].ns, c->node[i].addr);
            kvd_dump_file(c->node[i].log);
        }
    kc_etcd_stop(c, SIGTERM);
    if (failed && c->etcd.log[0]) {
        fprintf(stderr, "---- log of etcd (%s)\n", c->etcd.url);
        kvd_dump_file(c->etcd.log);
    }
    remove_files(c);
    kc_net_at_teardown(NULL);
    active = NULL;
    kc_net_destroy(&c->net);
}

/* -------------------------------------------------------------- daemons */

void kc_node_default_id(kc_cluster_t *c, int i)
{
    c->node[i].default_id = true;
    kvd_strlcpy(c->node[i].node_id, c->node[i].addr, sizeof(c->node[i].node_id));
}

int kc_node_start(kc_cluster_t *c, int i, bool cluster, const char *const *extra)
{
    kc_node_t *d = &c->node[i];
    if (d->dir[0] == '\0') {
        snprintf(d->dir, sizeof(d->dir), "/dev/shm/kvdock-clt-XXXXXX");
        if (!DT_CHECK(mkdtemp(d->dir) != NULL, "mkdtemp: %s", strerror(errno))) {
            d->dir[0] = '\0';
            return -1;
        }
        char dir[sizeof(d->dir)];
        kvd_strlcpy(dir, d->dir, sizeof(dir));
        snprintf(d->socket, sizeof(d->socket), "%s/kvdockd.sock", dir);
        snprintf(d->log, sizeof(d->log), "%s/kvdockd.log", dir);
    }
    d->cluster = cluster;
    char ttl[16];
    snprintf(ttl, sizeof(ttl), "%d", c->ttl_s);
    const char *argv[64];
    size_t n = 0;
    argv[n++] = kvd_test_bin("kvdockd");
    const char *base[] = {"--socket",
                          d->socket,
                          "--instance",
                          d->instance,
                          "--shm-dir",
                          d->dir,
                          "--pool-size",
                          DT_POOL,
                          "--usage-interval",
                          "0",
                          "--ucx",
                          "off",
                          "--listen",
                          d->addr,
                          "--auth-token-file",
                          c->client_token_file,
                          NULL};
    for (size_t k = 0; base[k]; k++)
        argv[n++] = base[k];
    if (cluster) {
        const char *cl[] = {"--cluster-etcd",
                            c->etcd.url,
                            "--advertise",
                            d->addr,
                            "--cluster-token-file",
                            c->peer_token_file,
                            "--cluster-name",
                            c->name,
                            "--cluster-ttl",
                            ttl,
                            NULL};
        for (size_t k = 0; cl[k]; k++)
            argv[n++] = cl[k];
        if (!d->default_id) {
            argv[n++] = "--node-id";
            argv[n++] = d->node_id;
        }
    }
    for (size_t k = 0; extra && extra[k] && n < 62; k++)
        argv[n++] = extra[k];
    argv[n] = NULL;
    {
        FILE *f = fopen(d->log, "a");
        if (f != NULL) {
            fprintf(f, "==== harness: starting %s in %s\n", d->node_id, d->ns);
            fclose(f);
        }
    }
    d->pid = kc_spawn(d->ns, argv, d->log);
    if (!DT_CHECK(d->pid > 0, "fork"))
        return -1;
    kc_net_track(d->pid);
    uint64_t deadline = kc_now_ms() + KC_READY_MS;
    while (kc_now_ms() < deadline) {
        int st;
        if (waitpid(d->pid, &st, WNOHANG) == d->pid) {
            kc_net_untrack(d->pid);
            d->pid = 0;
            DT_CHECK(false, "%s exited early (status %d)", d->node_id,
                     WIFEXITED(st) ? WEXITSTATUS(st) : -1);
            kvd_dump_file(d->log);
            return -1;
        }
        if (kvd_client_health_once(d->socket, 200, 1000) == KVD_HEALTH_READY)
            return 0;
        kvd_sleep_ns(20000000);
    }
    DT_CHECK(false, "%s not ready after %d ms", d->node_id, KC_READY_MS);
    kvd_dump_file(d->log);
    return -1;
}

int kc_node_stop(kc_cluster_t *c, int i, int sig, int timeout_ms, bool check)
{
    kc_node_t *d = &c->node[i];
    if (d->pid <= 0)
        return 0;
    kill(d->pid, sig);
    int st = 0, rc = 0;
    if (kvd_wait_pid(d->pid, timeout_ms, &st) != 0) {
        kill(d->pid, SIGKILL);
        kvd_wait_pid(d->pid, 5000, NULL);
        rc = -1;
        if (check)
            DT_CHECK(false, "%s did not exit within %d ms of signal %d", d->node_id,
                     timeout_ms, sig);
    } else if (check) {
        DT_CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0,
                 "%s exit status %d after signal %d", d->node_id,
                 WIFEXITED(st) ? WEXITSTATUS(st) : -1, sig);
    }
    kc_net_untrack(d->pid);
    d->pid = 0;
    if (check) {
        kvd_test_daemon_t t;
        memset(&t, 0, sizeof(t));
        kvd_strlcpy(t.log, d->log, sizeof(t.log));
        dt_check_log_clean(&t);
    }
    return rc;
}

/* ------------------------------------------------------------------ CLI */

int kc_cli(const kc_cluster_t *c, int i, char *out, size_t out_len,
           const char *const *args)
{
    const char *argv[40];
    size_t n = 0;
    argv[n++] = kvd_test_bin("kvdock");
    argv[n++] = "--connect";
    argv[n++] = c->node[i].addr;
    argv[n++] = "--token-file";
    argv[n++] = c->client_token_file;
    for (size_t k = 0; args[k] && n < 39; k++)
        argv[n++] = args[k];
    argv[n] = NULL;
    return kvd_test_run((char *const *)argv, out, out_len, KC_CLI_MS);
}

static const char *json_str(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static bool json_u64(const cJSON *o, const char *key, uint64_t *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsNumber(v) || v->valuedouble < 0)
        return false;
    *out = (uint64_t)v->valuedouble;
    return true;
}

int kc_view(const kc_cluster_t *c, int i, kc_view_t *v, char *why, size_t why_len)
{
    static char out[1 << 16];
    memset(v, 0, sizeof(*v));
    int rc = kc_cli(c, i, out, sizeof(out), (const char *[]){"cluster", "--json", NULL});
    if (rc != 0) {
        snprintf(why, why_len, "kvdock cluster --json on %s: exit %d", c->node[i].node_id,
                 rc);
        return -1;
    }
    cJSON *j = cJSON_Parse(out);
    const char *s;
    if (j == NULL || (s = json_str(j, "state")) == NULL) {
        snprintf(why, why_len, "%s: not the cluster JSON: %.300s", c->node[i].node_id,
                 out);
        cJSON_Delete(j);
        return -1;
    }
    kvd_strlcpy(v->state, s, sizeof(v->state));
    if ((s = json_str(j, "node")) != NULL)
        kvd_strlcpy(v->node, s, sizeof(v->node));
    bool ok = json_u64(j, "epoch", &v->epoch);
    const cJSON *members = cJSON_GetObjectItemCaseSensitive(j, "members");
    ok = ok && cJSON_IsArray(members);
    const cJSON *m;
    v->sorted = true;
    if (!ok)
        members = NULL;
    cJSON_ArrayForEach(m, members)
    {
        if (v->n >= KC_VIEW_MAX) {
            ok = false;
            break;
        }
        kc_member_t *x = &v->m[v->n];
        const char *node = json_str(m, "node"), *addr = json_str(m, "address");
        const cJSON *self = cJSON_GetObjectItemCaseSensitive(m, "self");
        if (node == NULL || addr == NULL || !cJSON_IsBool(self)) {
            ok = false;
            break;
        }
        kvd_strlcpy(x->node, node, sizeof(x->node));
        kvd_strlcpy(x->address, addr, sizeof(x->address));
        x->self = cJSON_IsTrue(self);
        json_u64(m, "pool_bytes", &x->pool_bytes);
        json_u64(m, "objects", &x->objects);
        json_u64(m, "directory_entries", &x->directory_entries);
        if (v->n > 0 && strcmp(v->m[v->n - 1].node, x->node) >= 0)
            v->sorted = false;
        v->n++;
    }
    if (!ok)
        snprintf(why, why_len, "%s: cluster JSON without epoch or members: %.300s",
                 c->node[i].node_id, out);
    cJSON_Delete(j);
    return ok ? 0 : -1;
}

int kc_health_cluster(const kc_cluster_t *c, int i, char *state, size_t state_len)
{
    static char out[1 << 14];
    int rc = kc_cli(c, i, out, sizeof(out), (const char *[]){"health", "--json", NULL});
    /* 3: reachable but not ready; the cluster field is there all the same */
    if (rc != 0 && rc != 3)
        return -1;
    cJSON *j = cJSON_Parse(out);
    const char *s = j ? json_str(j, "cluster") : NULL;
    if (s != NULL)
        kvd_strlcpy(state, s, state_len);
    cJSON_Delete(j);
    return s != NULL ? 0 : -1;
}

bool kc_view_is(const kc_cluster_t *c, const kc_view_t *v, int self, unsigned want)
{
    size_t n_want = 0;
    for (int i = 0; i < c->n; i++)
        n_want += (want >> i) & 1u;
    if (v->n != n_want || !v->sorted || strcmp(v->node, c->node[self].node_id) != 0)
        return false;
    for (size_t k = 0; k < v->n; k++) {
        int who = -1;
        for (int i = 0; i < c->n; i++)
            if (((want >> i) & 1u) && strcmp(v->m[k].node, c->node[i].node_id) == 0)
                who = i;
        if (who < 0 || strcmp(v->m[k].address, c->node[who].addr) != 0 ||
            v->m[k].self != (who == self))
            return false;
    }
    return true;
}

bool kc_wait_members(const kc_cluster_t *c, unsigned want, int timeout_ms,
                     uint64_t *epoch, uint64_t *waited_ms)
{
    uint64_t t0 = kc_now_ms(), deadline = t0 + (uint64_t)timeout_ms;
    kc_view_t last[KC_MAX_NODES];
    char why[KC_MAX_NODES][512];
    memset(last, 0, sizeof(last));
    memset(why, 0, sizeof(why));
    for (;;) {
        bool all = true;
        uint64_t e = 0;
        bool first = true;
        for (int i = 0; i < c->n; i++) {
            if (!((want >> i) & 1u) || c->node[i].pid <= 0)
                continue;
            why[i][0] = '\0';
            if (kc_view(c, i, &last[i], why[i], sizeof(why[i])) != 0 ||
                strcmp(last[i].state, "ready") != 0 ||
                !kc_view_is(c, &last[i], i, want) || (!first && last[i].epoch != e)) {
                all = false;
                break;
            }
            e = last[i].epoch;
            first = false;
        }
        if (all) {
            if (epoch)
                *epoch = e;
            if (waited_ms)
                *waited_ms = kc_now_ms() - t0;
            return true;
        }
        if (kc_now_ms() >= deadline)
            break;
        kvd_sleep_ns(200000000);
    }
    fprintf(stderr, "cluster: members 0x%x not converged after %d ms; last views:\n",
            want, timeout_ms);
    for (int i = 0; i < c->n; i++) {
        if (!((want >> i) & 1u))
            continue;
        fprintf(stderr, "  %s: state '%s' node '%s' epoch %llu members",
                c->node[i].node_id, last[i].state, last[i].node,
                (unsigned long long)last[i].epoch);
        for (size_t k = 0; k < last[i].n; k++)
            fprintf(stderr, " %s@%s%s", last[i].m[k].node, last[i].m[k].address,
                    last[i].m[k].self ? "(self)" : "");
        fprintf(stderr, "%s%s\n", why[i][0] ? "; " : "", why[i]);
    }
    if (waited_ms)
        *waited_ms = kc_now_ms() - t0;
    return false;
}
