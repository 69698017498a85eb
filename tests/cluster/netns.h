/*
 * netns.h - network namespaces for the cluster tests: N namespaces joined
 * by a bridge in the root namespace, so that daemons on "different nodes"
 * reach each other over real TCP on one machine.
 *
 * Names are unique per run and at most 15 characters (IFNAMSIZ): the
 * prefix is "kvc" and the run's pid mod 10^5 in five digits ("kvc01234"),
 * then "b" for the bridge, "n<i>" for namespace i and "h<i>" / "p<i>" for
 * the two ends of its veth pair (the root end on the bridge, the other
 * inside namespace i). Addresses: 10.X.Y.(i+1)/24 in namespace i and
 * 10.X.Y.254 on the bridge, X.Y from the pid and moved on past any subnet
 * the machine already has an address in, so that two runs at once (and the
 * machine's own networks) never collide.
 *
 * Teardown removes all of it: kc_net_destroy, and also at exit and on
 * SIGINT, SIGTERM, SIGHUP and SIGQUIT (the handlers also SIGKILL the
 * processes registered with kc_net_track, by their pid); SIGPIPE is
 * ignored. Only SIGKILL leaves something behind, which the next run of
 * the same pid mod 10^5 removes. A create that finds leftovers of its own
 * prefix (a crashed run of the same pid mod 10^5) removes them first.
 *
 * Threading: one net per process, made and destroyed by the main thread.
 */
#ifndef KVD_TEST_NETNS_H
#define KVD_TEST_NETNS_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#define KC_MAX_NODES  8
#define KC_NAME_MAX   16 /* IFNAMSIZ */
#define KC_PREFIX_MAX 9  /* "kvc" and five digits */

typedef struct kc_net {
    int n;
    char prefix[KC_PREFIX_MAX];
    char bridge[KC_NAME_MAX];
    char ns[KC_MAX_NODES][KC_NAME_MAX];
    char veth_root[KC_MAX_NODES][KC_NAME_MAX];
    char veth_ns[KC_MAX_NODES][KC_NAME_MAX];
    char addr[KC_MAX_NODES][16]; /* "10.X.Y.(i+1)" */
    char bridge_addr[16];        /* "10.X.Y.254" */
    bool made;
} kc_net_t;

/* The `ip` binary, or NULL when the machine has none. */
const char *kc_ip_path(void);

/* Runs `ip ARGS...` (NULL-terminated), its output into out (may be NULL),
 * within a few seconds. Returns its exit status, -1 if it did not run. */
int kc_ip(char *out, size_t out_len, const char *const *args);

/* The prefix of the names a process of this pid uses ("kvc01234"). */
void kc_net_prefix(pid_t pid, char *out, size_t out_len);

/*
 * Makes n namespaces (1..KC_MAX_NODES), the bridge and the veth pairs, and
 * registers the teardown. Returns 0; KVD_TEST_SKIP (77) with the reason in
 * why when this machine cannot make them (not root, no CAP_NET_ADMIN, no
 * `ip`, no bridge or veth support); -1 with the reason on another failure
 * (what was made is removed again).
 */
int kc_net_create(kc_net_t *net, int n, char *why, size_t why_len);

/* Removes everything kc_net_create made (after SIGKILLing the tracked
 * processes still alive). Safe to call twice. */
void kc_net_destroy(kc_net_t *net);

/* Removes every namespace and link whose name starts with prefix
 * followed by one of the suffix letters above. Returns how many it
 * removed. */
int kc_net_remove_prefix(const char *prefix);

/* True when a namespace or a link of that prefix exists. */
bool kc_net_prefix_exists(const char *prefix);

/*
 * Forks; the child joins namespace ns (NULL: stays in this one), redirects
 * stdout and stderr to log_path (appending; NULL: /dev/null), dies with
 * this process (PR_SET_PDEATHSIG) and execs argv[0]. The pid returned is
 * the exec'd program's own; the caller stops it by that pid. -1 on fork
 * failure.
 */
pid_t kc_spawn(const char *ns, const char *const *argv, const char *log_path);

/* Runs fn(arg) in a forked child inside namespace ns and returns its
 * result (0..255), or -1 when the child could not join or did not finish
 * within timeout_ms (it is killed then). */
int kc_run_in(const char *ns, int (*fn)(void *arg), void *arg, int timeout_ms);

/* Processes the teardown SIGKILLs (a daemon, etcd) if still running; a
 * stopped one is untracked. At most 32. */
void kc_net_track(pid_t pid);
void kc_net_untrack(pid_t pid);

/* A function the exit and signal paths call after the tracked processes
 * are killed and before the namespaces go (the cluster's directories and
 * token files: a pool file in /dev/shm is memory). One at a time; NULL
 * clears it. */
void kc_net_at_teardown(void (*fn)(void));

#endif
