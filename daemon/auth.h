/*
 * auth.h - who a connection is: the credentials kvdockd accepts and the
 * tenant each maps to. Private to daemon/.
 *
 * A connection is served only after a Hello whose credential passes
 * kvd_auth_check:
 *   - a token (HelloRequest.auth_token), on TCP or the Unix socket: it must
 *     equal one of the configured tokens (--auth-token-file, `token` lines
 *     of --auth-config); tokens are kept as SHA-256 digests and compared in
 *     constant time, every configured one on every check;
 *   - without a token, on the Unix socket: the peer's uid and gids
 *     (SO_PEERCRED, SO_PEERGROUPS) against the `uid` / `gid` lines of
 *     --auth-config, then --allow-uid / --allow-gid (default: the daemon's
 *     own uid and root);
 *   - without a token, on TCP: only with --insecure-no-auth;
 *   - the cluster's token (--cluster-token-file) makes the connection a
 *     peer daemon: an operator of every tenant that may also call the
 *     peer-only methods (the directory's).
 * The simple flags map to the default tenant as its operator, so a daemon
 * without --auth-config is the single tenant it always was.
 *
 * The auth config (--auth-config FILE), one rule a line, '#' a comment:
 *   tenant NAME [max-bytes=SIZE] [max-pins=N] [max-leases=N] [max-namespaces=N]
 *   token  TENANT FILE       [operator] [read-only]
 *   uid    TENANT UID|USER   [operator] [read-only]
 *   gid    TENANT GID|GROUP  [operator] [read-only]
 * A tenant is defined before the lines that name it ("default" always
 * exists and takes no limits). A relative FILE is relative to the config
 * file's directory; token files, like --auth-token-file, must be private to
 * their owner (mode 0600 or stricter) and not empty. Errors name the file
 * and the line.
 *
 * Threading: built before the event loop starts, then read by it alone.
 */
#ifndef KVD_DAEMON_AUTH_H
#define KVD_DAEMON_AUTH_H

#include "kvd_common.h"
#include "kvd_store.h"

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

typedef struct kvd_auth kvd_auth_t;

/* What the options say (daemon/options.h); strings "" when not given. */
typedef struct kvd_auth_opts {
    const char *token_file;      /* --auth-token-file */
    const char *allow_uid;       /* --allow-uid LIST ("" = own uid and root) */
    const char *allow_gid;       /* --allow-gid LIST */
    const char *config_file;     /* --auth-config */
    const char *peer_token_file; /* --cluster-token-file: peer daemons */
    bool insecure_no_auth;       /* --insecure-no-auth */
    bool tcp;                    /* --listen was given */
    uid_t self_uid;              /* the daemon's own uid */
} kvd_auth_opts_t;

/* The identity of a connection's peer, as the kernel tells it. */
typedef struct kvd_auth_peer {
    bool tcp;
    bool has_cred; /* Unix: SO_PEERCRED answered */
    uid_t uid;
    gid_t gid;
    const gid_t *groups; /* supplementary groups (SO_PEERGROUPS); may be none */
    size_t n_groups;
} kvd_auth_peer_t;

/* What a credential grants: the store's tenant id and its role. */
typedef struct kvd_auth_grant {
    uint32_t tenant;
    bool is_operator;
    bool read_only;
    bool is_peer; /* another daemon of the cluster (--cluster-token-file) */
} kvd_auth_grant_t;

/*
 * Reads the credentials the options name (token files, the auth config,
 * user and group names). Refuses, with why set (naming the file and line
 * or the flag), what would leave the daemon open by mistake: --listen
 * without any token unless --insecure-no-auth, token files readable by
 * others or empty, unknown users or groups, duplicate rules. Returns
 * KVD_OK or KVD_ERR_INVALID (or the error reading a file).
 */
int kvd_auth_create(const kvd_auth_opts_t *o, kvd_auth_t **out, char *why,
                    size_t why_len);
void kvd_auth_destroy(kvd_auth_t *a);

/* Adds the configured tenants to the store (kvd_store_tenant_add) and
 * binds the rules to their ids; once, before the first check. */
int kvd_auth_bind(kvd_auth_t *a, kvd_store_t *store, char *why, size_t why_len);

/*
 * Checks one Hello's credential. Returns KVD_OK with *out set, or
 * KVD_ERR_AUTH with *why a fixed text saying which check failed (for the
 * log and the reply; it never contains the client's bytes).
 */
int kvd_auth_check(const kvd_auth_t *a, const kvd_auth_peer_t *peer, const uint8_t *token,
                   size_t token_len, kvd_auth_grant_t *out, const char **why);

/*
 * The Unix socket's mode, from whom the rules let in: 0600 when only the
 * daemon's own uid (and root) may connect; 0660 and *group when exactly one
 * group may; 0666 when other users or several groups may (SO_PEERCRED then
 * is the check). *group is (gid_t)-1 when the group stays as created.
 */
mode_t kvd_auth_socket_mode(const kvd_auth_t *a, gid_t *group);

/* Number of tokens configured (for the start-up log line). */
size_t kvd_auth_token_count(const kvd_auth_t *a);

/* --- a rate limit for refusal log lines */

typedef struct kvd_ratelimit {
    uint64_t window_start_ns;
    uint32_t in_window;
    uint64_t suppressed; /* events not logged since the last one logged */
} kvd_ratelimit_t;

/*
 * Whether an event at now_ns may be logged: at most `burst` per window_ns.
 * When it may, *suppressed is how many were dropped since the last logged
 * one (and the count restarts).
 */
bool kvd_ratelimit_allow(kvd_ratelimit_t *r, uint64_t now_ns, uint32_t burst,
                         uint64_t window_ns, uint64_t *suppressed);

#endif
