/*
 * Description: the cluster tests' harness itself (tests/cluster/netns.c,
 * cluster.c), with what exists before the daemons form a cluster:
 * (a) teardown: a run that exits without tearing down, and one killed by
 *     SIGTERM, leave no namespace or link of their prefix behind; a run
 *     that finds leftovers of its own prefix removes them;
 * (b) three namespaces: each daemon runs in its own (its /proc/PID/ns/net
 *     is the namespace's, not the test's), a namespace has its own address
 *     and not the others', and a daemon in namespace 0 is reached over TCP
 *     from namespace 1 (Hello with the token, Health) and from the root
 *     namespace over the bridge (`kvdock --connect`);
 * (c) etcd on the bridge address answers from inside a namespace; a key
 *     put through its v3 gateway survives a SIGKILL and a restart on the
 *     same data directory;
 * (d) after the teardown nothing of this run's prefix is left.
 * Skips (77) where namespaces cannot be made or etcd is missing.
 */
#include "cluster.h"

#include <errno.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static kc_cluster_t cl;

/* ------------------------------------------------- (a) the teardown */

enum { EXIT_NO_NET = 40, EXIT_LEFTOVER_STAYED = 41 };

/* In a child: make a stray namespace and link of this pid's prefix, then
 * the net (which must remove them), then leave by `how`. */
static void child_run(const char *how)
{
    char prefix[KC_PREFIX_MAX], stray_ns[KC_NAME_MAX], stray_link[KC_NAME_MAX];
    kc_net_prefix(getpid(), prefix, sizeof(prefix));
    snprintf(stray_ns, sizeof(stray_ns), "%sn7", prefix);
    snprintf(stray_link, sizeof(stray_link), "%sh7", prefix);
    if (kc_ip(NULL, 0, (const char *[]){"netns", "add", stray_ns, NULL}) != 0)
        _exit(EXIT_NO_NET);
    char stray_peer[KC_NAME_MAX];
    snprintf(stray_peer, sizeof(stray_peer), "%sp7", prefix);
    if (kc_ip(NULL, 0,
              (const char *[]){"link", "add", stray_link, "type", "veth", "peer", "name",
                               stray_peer, NULL}) != 0)
        _exit(EXIT_NO_NET);
    static kc_net_t net;
    char why[512];
    if (kc_net_create(&net, 2, why, sizeof(why)) != 0) {
        fprintf(stderr, "child: %s\n", why);
        _exit(EXIT_NO_NET);
    }
    char path[64];
    snprintf(path, sizeof(path), "/run/netns/%s", stray_ns);
    char out[4096];
    kc_ip(out, sizeof(out), (const char *[]){"-o", "link", "show", NULL});
    if (access(path, F_OK) == 0 || strstr(out, stray_link) != NULL)
        _exit(EXIT_LEFTOVER_STAYED);
    if (strcmp(how, "sigterm") == 0) {
        kill(getpid(), SIGTERM);
        for (;;)
            pause();
    }
    exit(1); /* a failed check: exit without kc_net_destroy */
}

static void teardown_paths(void)
{
    const char *ways[] = {"exit", "sigterm"};
    for (size_t w = 0; w < 2; w++) {
        pid_t pid = fork();
        if (pid == 0)
            child_run(ways[w]);
        int st = 0;
        if (!DT_CHECK(pid > 0 && kvd_wait_pid(pid, 60000, &st) == 0, "(%s) child",
                      ways[w]))
            continue;
        if (w == 0)
            DT_CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 1, "(exit) child status %d: %s",
                     WIFEXITED(st) ? WEXITSTATUS(st) : -1,
                     WIFEXITED(st) && WEXITSTATUS(st) == EXIT_LEFTOVER_STAYED
                         ? "leftovers of its prefix were not removed"
                         : "see above");
        else
            DT_CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGTERM,
                     "(sigterm) child should die by SIGTERM: exited %d",
                     WIFEXITED(st) ? WEXITSTATUS(st) : -1);
        char prefix[KC_PREFIX_MAX];
        kc_net_prefix(pid, prefix, sizeof(prefix));
        DT_CHECK(!kc_net_prefix_exists(prefix),
                 "(%s) namespaces or links of %s left behind", ways[w], prefix);
        kc_net_remove_prefix(prefix);
    }
}

/* ------------------------------------------ (b) namespaces and daemons */

static bool same_netns(pid_t pid, const char *ns)
{
    char p1[64], p2[64];
    snprintf(p1, sizeof(p1), "/proc/%d/ns/net", (int)pid);
    snprintf(p2, sizeof(p2), "/run/netns/%s", ns);
    struct stat a, b;
    return stat(p1, &a) == 0 && stat(p2, &b) == 0 && a.st_ino == b.st_ino &&
           a.st_dev == b.st_dev;
}

/* Binding an address says whether this namespace has it. */
static int bind_result(const char *addr)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET};
    inet_pton(AF_INET, addr, &sa.sin_addr);
    int rc = bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0 ? 0 : errno;
    close(fd);
    return rc;
}

/* In namespace 1: its own address binds, node 0's does not. */
static int own_addresses(void *arg)
{
    (void)arg;
    if (bind_result(cl.net.addr[1]) != 0)
        return 1;
    return bind_result(cl.net.addr[0]) == EADDRNOTAVAIL ? 0 : 2;
}

/* In namespace 1: Hello with the token to node 0 over TCP, then Health. */
static int reach_node0(void *arg)
{
    (void)arg;
    kvd_client_t *c = NULL;
    if (kvd_client_connect_tcp(cl.node[0].addr, 5000, &c) != KVD_OK)
        return 1;
    kvd_hello_rep_t h;
    int rc = dt_hello_token(c, "cluster-harness", KC_CLIENT_TOKEN, &h, 5000);
    int st = rc == KVD_OK ? dt_health(c, NULL) : -1;
    kvd_client_close(c);
    return rc != KVD_OK ? 2 : st == KVD_HEALTH_READY ? 0 : 3;
}

static void namespaces_and_daemons(void)
{
    for (int i = 0; i < cl.n; i++) {
        DT_CHECK(strlen(cl.net.ns[i]) < KC_NAME_MAX &&
                     strlen(cl.net.veth_root[i]) < KC_NAME_MAX,
                 "names longer than 15: %s %s", cl.net.ns[i], cl.net.veth_root[i]);
        if (kc_node_start(&cl, i, false, NULL) != 0)
            return;
        DT_CHECK(same_netns(cl.node[i].pid, cl.net.ns[i]),
                 "daemon %d (pid %d) is not in namespace %s", i, (int)cl.node[i].pid,
                 cl.net.ns[i]);
        DT_CHECK(!same_netns(getpid(), cl.net.ns[i]), "the test itself is in %s",
                 cl.net.ns[i]);
    }
    DT_CHECK(kc_run_in(cl.net.ns[1], own_addresses, NULL, 10000) == 0,
             "namespace 1 should have %s and not %s", cl.net.addr[1], cl.net.addr[0]);
    int rc = kc_run_in(cl.net.ns[1], reach_node0, NULL, 20000);
    DT_CHECK(rc == 0, "from namespace 1, node 0 at %s over TCP: step %d failed",
             cl.node[0].addr, rc);
    char out[4096];
    for (int i = 0; i < cl.n; i++) {
        rc = kc_cli(&cl, i, out, sizeof(out), (const char *[]){"health", NULL});
        DT_CHECK(rc == 0 && strncmp(out, "ready", 5) == 0,
                 "kvdock --connect %s health from the root namespace: exit %d '%s'",
                 cl.node[i].addr, rc, out);
    }
    /* the token is still required across the bridge */
    const char *argv[] = {kvd_test_bin("kvdock"), "--connect", cl.node[2].addr, "health",
                          NULL};
    rc = kvd_test_run((char *const *)argv, out, sizeof(out), KC_CLI_MS);
    DT_CHECK(rc == 1, "kvdock --connect without a token: exit %d, want 1", rc);
}

/* ---------------------------------------------------------- (c) etcd */

/* base64 of "kvc-key" and "kvc-value", as the v3 gateway wants them */
#define KEY_B64 "a3ZjLWtleQ=="
#define VAL_B64 "a3ZjLXZhbHVl"

static int etcd_health_from_ns(void *arg)
{
    (void)arg;
    char body[512];
    int st = kc_http(cl.etcd.host, KC_ETCD_PORT, "GET", "/health", NULL, body,
                     sizeof(body), 5000);
    return st == 200 && strstr(body, "true") ? 0 : 1;
}

static int etcd_put_from_ns(void *arg)
{
    (void)arg;
    char body[1024];
    int st = kc_http(cl.etcd.host, KC_ETCD_PORT, "POST", "/v3/kv/put",
                     "{\"key\":\"" KEY_B64 "\",\"value\":\"" VAL_B64 "\"}", body,
                     sizeof(body), 5000);
    return st == 200 ? 0 : 1;
}

static bool etcd_has_key(void)
{
    char body[4096];
    int st = kc_http(cl.etcd.host, KC_ETCD_PORT, "POST", "/v3/kv/range",
                     "{\"key\":\"" KEY_B64 "\"}", body, sizeof(body), 5000);
    return st == 200 && strstr(body, VAL_B64) != NULL;
}

static void etcd_restart(void)
{
    DT_CHECK(kc_run_in(cl.net.ns[2], etcd_health_from_ns, NULL, 10000) == 0,
             "etcd at %s not healthy from namespace 2", cl.etcd.url);
    DT_CHECK(kc_run_in(cl.net.ns[2], etcd_put_from_ns, NULL, 10000) == 0,
             "put through the v3 gateway from namespace 2 failed");
    DT_CHECK(etcd_has_key(), "the key put is not read back");
    pid_t old = cl.etcd.pid;
    kc_etcd_stop(&cl, SIGKILL);
    DT_CHECK(kill(old, 0) != 0, "etcd %d still alive after SIGKILL", (int)old);
    char body[256];
    DT_CHECK(kc_http(cl.etcd.host, KC_ETCD_PORT, "GET", "/health", NULL, body,
                     sizeof(body), 2000) == -1,
             "etcd still answers after its SIGKILL");
    if (kc_etcd_start(&cl) != 0)
        return;
    DT_CHECK(cl.etcd.pid != old, "a new etcd process");
    DT_CHECK(etcd_has_key(),
             "the key is gone after a restart on the same data directory");
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (geteuid() != 0 || kc_ip_path() == NULL) {
        printf("SKIP: network namespaces need root and `ip` (uid %d, ip %s)\n",
               (int)geteuid(), kc_ip_path() ? kc_ip_path() : "missing");
        return KVD_TEST_SKIP;
    }
    /* (a) first: a child forked now inherits no teardown of ours */
    teardown_paths();
    int rc = kc_setup(&cl, 3, true);
    if (rc == KVD_TEST_SKIP)
        return KVD_TEST_SKIP;
    if (rc == 0) {
        namespaces_and_daemons();
        etcd_restart();
    }
    char prefix[KC_PREFIX_MAX];
    kvd_strlcpy(prefix, cl.net.prefix, sizeof(prefix));
    kc_teardown(&cl);
    DT_CHECK(!kc_net_prefix_exists(prefix),
             "(d) namespaces or links of %s left after teardown", prefix);
    return dt_exit_status("cluster/harness");
}
