/*
 * netns.c - see netns.h. Everything goes through the `ip` binary (iproute2)
 * rather than netlink by hand: it is what an operator would type, and its
 * error text is what a skip prints. Processes are only ever signalled by
 * the pids this file started or was given.
 */
#include "netns.h"

#include "harness.h"
#include "kvd_common.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#define IP_TIMEOUT_MS 10000
#define TRACK_MAX     32

/* The suffix letters of kc_net_t's names (netns.h). */
static const char SUFFIXES[] = "bnhp";

static kc_net_t *active_net; /* what the exit and signal paths tear down */
static pid_t tracked[TRACK_MAX];
static void (*teardown_hook)(void);

void kc_net_at_teardown(void (*fn)(void))
{
    teardown_hook = fn;
}

const char *kc_ip_path(void)
{
    static const char *const candidates[] = {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip",
                                             "/bin/ip"};
    for (size_t i = 0; i < KVD_ARRAY_SIZE(candidates); i++)
        if (access(candidates[i], X_OK) == 0)
            return candidates[i];
    return NULL;
}

int kc_ip(char *out, size_t out_len, const char *const *args)
{
    const char *ip = kc_ip_path();
    if (ip == NULL)
        return -1;
    const char *argv[32];
    size_t n = 0;
    argv[n++] = ip;
    for (size_t i = 0; args[i] && n < 31; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    int status = kvd_test_run_out((char *const *)argv, out, out_len, IP_TIMEOUT_MS, true);
    size_t used = out != NULL && out_len > 0 ? strlen(out) : 0;
    if (out != NULL && out_len > 0) {
        out[used] = '\0';
        /* one line for a message */
        while (used > 0 && (out[used - 1] == '\n' || out[used - 1] == ' '))
            out[--used] = '\0';
    }
    return status;
}

void kc_net_prefix(pid_t pid, char *out, size_t out_len)
{
    snprintf(out, out_len, "kvc%05u", (unsigned)(pid % 100000) % 100000u);
}

/* True when name is prefix plus one suffix letter and digits (or nothing). */
static bool has_prefix(const char *name, const char *prefix)
{
    size_t n = strlen(prefix);
    if (strncmp(name, prefix, n) != 0 || name[n] == '\0' ||
        strchr(SUFFIXES, name[n]) == NULL)
        return false;
    for (const char *p = name + n + 1; *p; p++)
        if (*p < '0' || *p > '9')
            return false;
    return true;
}

/* Calls fn(name) for every namespace (/run/netns) and link of the prefix;
 * returns how many. Links: `ip -o link` lines are "N: NAME[@PEER]: ...". */
static int for_each_prefixed(const char *prefix, bool remove)
{
    int count = 0;
    DIR *d = opendir("/run/netns");
    struct dirent *e;
    while (d != NULL && (e = readdir(d)) != NULL) {
        if (!has_prefix(e->d_name, prefix))
            continue;
        count++;
        if (remove)
            kc_ip(NULL, 0, (const char *[]){"netns", "del", e->d_name, NULL});
    }
    if (d != NULL)
        closedir(d);
    static char out[1 << 16];
    if (kc_ip(out, sizeof(out), (const char *[]){"-o", "link", "show", NULL}) != 0)
        return count;
    char *save = NULL;
    for (char *line = strtok_r(out, "\n", &save); line;
         line = strtok_r(NULL, "\n", &save)) {
        char *name = strchr(line, ':');
        if (name == NULL)
            continue;
        name++;
        while (*name == ' ')
            name++;
        char buf[KC_NAME_MAX * 2];
        size_t len = strcspn(name, "@:");
        if (len == 0 || len >= sizeof(buf))
            continue;
        memcpy(buf, name, len);
        buf[len] = '\0';
        if (!has_prefix(buf, prefix))
            continue;
        count++;
        /* deleting one end of a veth deletes the other: a failure for the
         * second end is expected */
        if (remove)
            kc_ip(NULL, 0, (const char *[]){"link", "del", buf, NULL});
    }
    return count;
}

int kc_net_remove_prefix(const char *prefix)
{
    return for_each_prefixed(prefix, true);
}

bool kc_net_prefix_exists(const char *prefix)
{
    return for_each_prefixed(prefix, false) > 0;
}

void kc_net_track(pid_t pid)
{
    for (size_t i = 0; i < TRACK_MAX; i++)
        if (tracked[i] == 0) {
            tracked[i] = pid;
            return;
        }
}

void kc_net_untrack(pid_t pid)
{
    for (size_t i = 0; i < TRACK_MAX; i++)
        if (tracked[i] == pid)
            tracked[i] = 0;
}

/* SIGKILLs the tracked processes (ours: their pids) and reaps them, so
 * that no namespace is held by a process when it is deleted. */
static void kill_tracked(void)
{
    for (size_t i = 0; i < TRACK_MAX; i++) {
        if (tracked[i] <= 0)
            continue;
        kill(tracked[i], SIGKILL);
        kvd_wait_pid(tracked[i], 5000, NULL);
        tracked[i] = 0;
    }
}

void kc_net_destroy(kc_net_t *net)
{
    kill_tracked();
    if (net == NULL || !net->made)
        return;
    for (int i = 0; i < net->n; i++)
        kc_ip(NULL, 0, (const char *[]){"netns", "del", net->ns[i], NULL});
    for (int i = 0; i < net->n; i++)
        kc_ip(NULL, 0, (const char *[]){"link", "del", net->veth_root[i], NULL});
    kc_ip(NULL, 0, (const char *[]){"link", "del", net->bridge, NULL});
    /* anything a half-finished create left */
    kc_net_remove_prefix(net->prefix);
    net->made = false;
    if (active_net == net)
        active_net = NULL;
}

static void teardown_at_exit(void)
{
    kill_tracked();
    if (teardown_hook != NULL) {
        void (*fn)(void) = teardown_hook;
        teardown_hook = NULL;
        fn();
    }
    if (active_net != NULL)
        kc_net_destroy(active_net);
    else
        kill_tracked();
}

static void teardown_on_signal(int sig)
{
    /* not async-signal-safe in the letter (kc_ip forks and polls), but the
     * process ends here and a namespace left behind outlives it */
    teardown_at_exit();
    signal(sig, SIG_DFL);
    raise(sig);
}

static void install_teardown(void)
{
    static bool installed;
    if (installed)
        return;
    installed = true;
    atexit(teardown_at_exit);
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = teardown_on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    sigaction(SIGQUIT, &sa, NULL);
    /* a reader of the test's output that goes away (`| head`) must not end
     * it without its teardown: writes fail with EPIPE instead */
    signal(SIGPIPE, SIG_IGN);
}

/* Picks 10.X.Y.0/24 from the pid, moved on past subnets that have an
 * address on this machine already (another run, the machine's own). */
static void pick_subnet(kc_net_t *net, pid_t pid)
{
    static char addrs[1 << 16];
    if (kc_ip(addrs, sizeof(addrs), (const char *[]){"-o", "-4", "addr", "show", NULL}) !=
        0)
        addrs[0] = '\0';
    unsigned p = (unsigned)(pid % 100000);
    unsigned x = 100 + (p >> 8) % 150, y = p & 0xff;
    for (int tries = 0; tries < 1000; tries++) {
        char probe[24];
        snprintf(probe, sizeof(probe), " 10.%u.%u.", x, y);
        if (strstr(addrs, probe) == NULL)
            break;
        if (++y > 255) {
            y = 0;
            x = x >= 249 ? 100 : x + 1;
        }
    }
    for (int i = 0; i < net->n; i++)
        snprintf(net->addr[i], sizeof(net->addr[i]), "10.%u.%u.%u", x & 0xffu, y & 0xffu,
                 (unsigned)(i + 1) & 0xffu);
    snprintf(net->bridge_addr, sizeof(net->bridge_addr), "10.%u.%u.254", x & 0xffu,
             y & 0xffu);
}

/* One `ip` step; on failure the reason goes to why. */
static int step(char *why, size_t why_len, const char *const *args)
{
    char out[512];
    int rc = kc_ip(out, sizeof(out), args);
    if (rc == 0)
        return 0;
    char cmd[256] = "ip";
    for (size_t i = 0; args[i]; i++) {
        kvd_strlcpy(cmd + strlen(cmd), " ", sizeof(cmd) - strlen(cmd));
        kvd_strlcpy(cmd + strlen(cmd), args[i], sizeof(cmd) - strlen(cmd));
    }
    snprintf(why, why_len, "`%s` failed (exit %d): %s", cmd, rc,
             out[0] ? out : "no output");
    return -1;
}

int kc_net_create(kc_net_t *net, int n, char *why, size_t why_len)
{
    memset(net, 0, sizeof(*net));
    if (n < 1 || n > KC_MAX_NODES) {
        snprintf(why, why_len, "kc_net_create: %d namespaces (1..%d)", n, KC_MAX_NODES);
        return -1;
    }
    if (kc_ip_path() == NULL) {
        snprintf(why, why_len, "no `ip` binary (iproute2) on this machine");
        return KVD_TEST_SKIP;
    }
    if (geteuid() != 0) {
        snprintf(why, why_len,
                 "network namespaces need root (CAP_NET_ADMIN and CAP_SYS_ADMIN); "
                 "running as uid %d",
                 (int)geteuid());
        return KVD_TEST_SKIP;
    }
    net->n = n;
    pid_t pid = getpid();
    kc_net_prefix(pid, net->prefix, sizeof(net->prefix));
    int stale = kc_net_remove_prefix(net->prefix);
    if (stale > 0)
        fprintf(stderr, "netns: removed %d leftovers of %s (a crashed run)\n", stale,
                net->prefix);
    snprintf(net->bridge, sizeof(net->bridge), "%sb", net->prefix);
    for (int i = 0; i < n; i++) {
        snprintf(net->ns[i], KC_NAME_MAX, "%sn%d", net->prefix, i);
        snprintf(net->veth_root[i], KC_NAME_MAX, "%sh%d", net->prefix, i);
        snprintf(net->veth_ns[i], KC_NAME_MAX, "%sp%d", net->prefix, i);
    }
    pick_subnet(net, pid);
    install_teardown();
    net->made = true;
    active_net = net;

    /* the first namespace and the first link of each kind say whether this
     * machine can make them at all: a failure there is a skip */
    if (step(why, why_len, (const char *[]){"netns", "add", net->ns[0], NULL}) != 0 ||
        step(why, why_len,
             (const char *[]){"link", "add", net->bridge, "type", "bridge", NULL}) != 0 ||
        step(why, why_len,
             (const char *[]){"link", "add", net->veth_root[0], "type", "veth", "peer",
                              "name", net->veth_ns[0], NULL}) != 0) {
        kc_net_destroy(net);
        return KVD_TEST_SKIP;
    }
    char cidr[24];
    snprintf(cidr, sizeof(cidr), "%s/24", net->bridge_addr);
    if (step(why, why_len,
             (const char *[]){"addr", "add", cidr, "dev", net->bridge, NULL}) ||
        step(why, why_len, (const char *[]){"link", "set", net->bridge, "up", NULL}))
        goto fail;
    for (int i = 0; i < n; i++) {
        snprintf(cidr, sizeof(cidr), "%s/24", net->addr[i]);
        if ((i > 0 &&
             step(why, why_len, (const char *[]){"netns", "add", net->ns[i], NULL})) ||
            (i > 0 &&
             step(why, why_len,
                  (const char *[]){"link", "add", net->veth_root[i], "type", "veth",
                                   "peer", "name", net->veth_ns[i], NULL})) ||
            step(why, why_len,
                 (const char *[]){"link", "set", net->veth_ns[i], "netns", net->ns[i],
                                  NULL}) ||
            step(why, why_len,
                 (const char *[]){"link", "set", net->veth_root[i], "master", net->bridge,
                                  NULL}) ||
            step(why, why_len,
                 (const char *[]){"link", "set", net->veth_root[i], "up", NULL}) ||
            step(why, why_len,
                 (const char *[]){"-n", net->ns[i], "addr", "add", cidr, "dev",
                                  net->veth_ns[i], NULL}) ||
            step(why, why_len,
                 (const char *[]){"-n", net->ns[i], "link", "set", net->veth_ns[i], "up",
                                  NULL}) ||
            step(why, why_len,
                 (const char *[]){"-n", net->ns[i], "link", "set", "lo", "up", NULL}))
            goto fail;
    }
    return 0;
fail:
    kc_net_destroy(net);
    return -1;
}

/* In a fresh child: join ns (NULL: none). 0, or -1 with errno. */
static int join_ns(const char *ns)
{
    if (ns == NULL)
        return 0;
    char path[64];
    snprintf(path, sizeof(path), "/run/netns/%s", ns);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    int rc = setns(fd, CLONE_NEWNET);
    close(fd);
    if (rc != 0)
        return rc;
    /* /sys as the namespace sees it, as `ip netns exec` does: sysfs shows
     * the network devices of the namespace that mounted it, and UCX finds
     * its interfaces (UCX_NET_DEVICES) under /sys/class/net. A mount
     * namespace of this process's own keeps the test's /sys as it is. */
    if (unshare(CLONE_NEWNS) != 0 || mount("", "/", NULL, MS_SLAVE | MS_REC, NULL) != 0)
        return -1;
    umount2("/sys", MNT_DETACH);
    return mount(ns, "/sys", "sysfs", 0, NULL);
}

pid_t kc_spawn(const char *ns, const char *const *argv, const char *log_path)
{
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid != 0)
        return pid;
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent)
        _exit(127);
    int fd = open(log_path ? log_path : "/dev/null", O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
        dup2(fd, STDOUT_FILENO);
        dup2(fd, STDERR_FILENO);
        close(fd);
    }
    if (join_ns(ns) != 0) {
        fprintf(stderr, "netns: cannot join %s: %s\n", ns, strerror(errno));
        _exit(126);
    }
    execv(argv[0], (char *const *)argv);
    fprintf(stderr, "netns: exec %s: %s\n", argv[0], strerror(errno));
    _exit(127);
}

int kc_run_in(const char *ns, int (*fn)(void *arg), void *arg, int timeout_ms)
{
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (join_ns(ns) != 0)
            _exit(255);
        /* _exit: the child must not run the parent's teardown at exit */
        int rc = fn(arg);
        fflush(NULL);
        _exit(rc & 0xff);
    }
    int st;
    if (kvd_wait_pid(pid, timeout_ms, &st) != 0) {
        kill(pid, SIGKILL);
        kvd_wait_pid(pid, 5000, NULL);
        return -1;
    }
    if (!WIFEXITED(st) || WEXITSTATUS(st) == 255)
        return -1;
    return WEXITSTATUS(st);
}
