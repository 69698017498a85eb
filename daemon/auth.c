/*
 * auth.c - the credentials kvdockd accepts (see auth.h): reading them from
 * the options and the auth config, and matching a Hello against them.
 *
 * Rules live in one fixed table, in the order they are matched: the auth
 * config's lines, then the simple flags (--auth-token-file, --allow-uid,
 * --allow-gid or the default own-uid rule), which map to the default
 * tenant as operator. Tokens are kept only as SHA-256 digests; a check
 * digests the presented token and compares it with every token rule's
 * digest in constant time, so neither the position of the first differing
 * byte nor which rule matched shows in the time a check takes.
 */
#include "auth.h"
#include "kvd_proto.h"

#include <ctype.h>
#include <errno.h>
#include <grp.h>
#include <libgen.h>
#include <limits.h>
#include <openssl/evp.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define AUTH_RULES_MAX 1024
#define DIGEST_BYTES   32

typedef enum rule_kind { RULE_TOKEN, RULE_UID, RULE_GID } rule_kind_t;

typedef struct auth_rule {
    rule_kind_t kind;
    uint32_t tenant_ix; /* into kvd_auth.tenants */
    bool is_operator;
    bool read_only;
    bool is_peer; /* the cluster's token */
    uint32_t id;  /* uid or gid */
    uint8_t digest[DIGEST_BYTES];
    int line; /* of the auth config; 0 for a flag */
} auth_rule_t;

typedef struct auth_tenant {
    char name[KVD_TENANT_NAME_MAX];
    kvd_tenant_limits_t limits;
    uint32_t store_id; /* set by kvd_auth_bind */
} auth_tenant_t;

struct kvd_auth {
    bool insecure_no_auth;
    uid_t self_uid;
    size_t n_rules;
    auth_rule_t rules[AUTH_RULES_MAX];
    size_t n_tenants; /* tenants[0] is "default" */
    auth_tenant_t tenants[KVD_TENANTS_MAX];
    bool bound;
};

/* ------------------------------------------------------------ helpers */

static int fail(char *why, size_t why_len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int fail(char *why, size_t why_len, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, why_len, fmt, ap);
    va_end(ap);
    return KVD_ERR_INVALID;
}

static int digest(const uint8_t *data, size_t len, uint8_t out[DIGEST_BYTES])
{
    unsigned int n = 0;
    if (EVP_Digest(data, len, out, &n, EVP_sha256(), NULL) != 1 || n != DIGEST_BYTES)
        return KVD_ERR_NOMEM; /* libcrypto fails only out of memory */
    return KVD_OK;
}

static bool all_digits(const char *s)
{
    if (*s == '\0')
        return false;
    for (; *s; s++)
        if (!isdigit((unsigned char)*s))
            return false;
    return true;
}

/* A uid from digits or a user name. */
static int resolve_uid(const char *s, uint32_t *out)
{
    uint64_t v;
    if (all_digits(s))
        return kvd_u64_parse(s, 0, UINT32_MAX - 1, &v) == KVD_OK ? (*out = (uint32_t)v, 0)
                                                                 : -1;
    struct passwd pw, *res = NULL;
    char buf[4096];
    if (getpwnam_r(s, &pw, buf, sizeof(buf), &res) != 0 || res == NULL)
        return -1;
    *out = (uint32_t)pw.pw_uid;
    return 0;
}

/* A gid from digits or a group name. */
static int resolve_gid(const char *s, uint32_t *out)
{
    uint64_t v;
    if (all_digits(s))
        return kvd_u64_parse(s, 0, UINT32_MAX - 1, &v) == KVD_OK ? (*out = (uint32_t)v, 0)
                                                                 : -1;
    struct group gr, *res = NULL;
    char buf[16384];
    if (getgrnam_r(s, &gr, buf, sizeof(buf), &res) != 0 || res == NULL)
        return -1;
    *out = (uint32_t)gr.gr_gid;
    return 0;
}

static int tenant_index(const kvd_auth_t *a, const char *name, uint32_t *ix)
{
    for (size_t i = 0; i < a->n_tenants; i++)
        if (strcmp(a->tenants[i].name, name) == 0) {
            *ix = (uint32_t)i;
            return 0;
        }
    return -1;
}

/* Appends a rule; refuses a second rule for the same uid, gid or token
 * (which of two tenants would it be?). `where` names the new rule. */
static int add_rule(kvd_auth_t *a, const auth_rule_t *r, const char *where, char *why,
                    size_t why_len)
{
    if (a->n_rules == AUTH_RULES_MAX)
        return fail(why, why_len, "%smore than %d rules", where, AUTH_RULES_MAX);
    for (size_t i = 0; i < a->n_rules; i++) {
        const auth_rule_t *o = &a->rules[i];
        if (o->kind != r->kind)
            continue;
        bool same = r->kind == RULE_TOKEN ? kvd_const_time_equal(o->digest, DIGEST_BYTES,
                                                                 r->digest, DIGEST_BYTES)
                                          : o->id == r->id;
        if (!same)
            continue;
        const char *what = r->kind == RULE_TOKEN ? "token"
                           : r->kind == RULE_UID ? "uid"
                                                 : "gid";
        if (o->line > 0)
            return fail(why, why_len, "%sthe same %s as line %d", where, what, o->line);
        return fail(why, why_len, "%sthe same %s as a flag", where, what);
    }
    a->rules[a->n_rules++] = *r;
    return KVD_OK;
}

/* Reads a token file (private to its owner) into a rule's digest. */
static int token_rule(const char *path, auth_rule_t *r, const char *where, char *why,
                      size_t why_len)
{
    uint8_t tok[KVD_TOKEN_MAX];
    size_t len = 0;
    char e[512];
    int rc = kvd_token_read(path, true, tok, sizeof(tok), &len, e, sizeof(e));
    if (rc != KVD_OK) {
        snprintf(why, why_len, "%s%s", where, e);
        return rc;
    }
    rc = digest(tok, len, r->digest);
    explicit_bzero(tok, sizeof(tok));
    if (rc != KVD_OK)
        snprintf(why, why_len, "%scannot digest the token: out of memory", where);
    return rc;
}

/* ------------------------------------------------------- auth config */

/* Parses "key=value" limits of a tenant line. */
static int parse_limit(char *word, kvd_tenant_limits_t *lim, const char *where, char *why,
                       size_t why_len)
{
    char *eq = strchr(word, '=');
    if (eq == NULL)
        return fail(why, why_len,
                    "%s'%s': expected max-bytes=SIZE, max-pins=N, max-leases=N or "
                    "max-namespaces=N",
                    where, word);
    *eq = '\0';
    const char *v = eq + 1;
    uint64_t n;
    if (strcmp(word, "max-bytes") == 0) {
        if (kvd_size_parse(v, &n) != KVD_OK)
            return fail(why, why_len, "%smax-bytes '%s': expected a size like 8G", where,
                        v);
        lim->max_bytes = n;
        return KVD_OK;
    }
    uint64_t *field = strcmp(word, "max-pins") == 0         ? &lim->max_pins
                      : strcmp(word, "max-leases") == 0     ? &lim->max_leases
                      : strcmp(word, "max-namespaces") == 0 ? &lim->max_namespaces
                                                            : NULL;
    if (field == NULL)
        return fail(why, why_len, "%sunknown limit '%s'", where, word);
    if (kvd_u64_parse(v, 0, UINT32_MAX, &n) != KVD_OK)
        return fail(why, why_len, "%s%s '%s': expected an integer", where, word, v);
    *field = n;
    return KVD_OK;
}

static int parse_tenant(kvd_auth_t *a, char **w, size_t n, const char *where, char *why,
                        size_t why_len)
{
    if (n < 2)
        return fail(why, why_len, "%s'tenant' needs a NAME", where);
    const char *name = w[1];
    size_t len = strlen(name);
    if (len >= KVD_TENANT_NAME_MAX)
        return fail(why, why_len, "%stenant name '%s' is over %d bytes", where, name,
                    KVD_TENANT_NAME_MAX - 1);
    for (const char *p = name; *p; p++)
        if (!isalnum((unsigned char)*p) && *p != '-' && *p != '_' && *p != '.')
            return fail(why, why_len,
                        "%stenant name '%s': use letters, digits, '-', '_', '.'", where,
                        name);
    uint32_t ix;
    if (tenant_index(a, name, &ix) == 0) {
        if (ix == 0)
            return fail(why, why_len,
                        "%sthe tenant 'default' always exists and takes no limits",
                        where);
        return fail(why, why_len, "%stenant '%s' is defined twice", where, name);
    }
    if (a->n_tenants == KVD_TENANTS_MAX)
        return fail(why, why_len, "%smore than %d tenants", where, KVD_TENANTS_MAX);
    auth_tenant_t *t = &a->tenants[a->n_tenants];
    memset(t, 0, sizeof(*t));
    kvd_strlcpy(t->name, name, sizeof(t->name));
    for (size_t i = 2; i < n; i++) {
        int rc = parse_limit(w[i], &t->limits, where, why, why_len);
        if (rc != KVD_OK)
            return rc;
    }
    a->n_tenants++;
    return KVD_OK;
}

/* token|uid|gid TENANT WHAT [operator] [read-only] */
static int parse_mapping(kvd_auth_t *a, char **w, size_t n, const char *dir, int line,
                         const char *where, char *why, size_t why_len)
{
    const char *kind = w[0];
    const char *what = strcmp(kind, "token") == 0 ? "FILE"
                       : strcmp(kind, "uid") == 0 ? "UID|USER"
                                                  : "GID|GROUP";
    if (n < 3)
        return fail(why, why_len, "%s'%s' needs a TENANT and a %s", where, kind, what);
    auth_rule_t r = {.line = line};
    if (tenant_index(a, w[1], &r.tenant_ix) != 0)
        return fail(why, why_len,
                    "%stenant '%s' is not defined (a 'tenant %s' line must come first)",
                    where, w[1], w[1]);
    for (size_t i = 3; i < n; i++) {
        if (strcmp(w[i], "operator") == 0)
            r.is_operator = true;
        else if (strcmp(w[i], "read-only") == 0)
            r.read_only = true;
        else
            return fail(why, why_len,
                        "%sunknown flag '%s': expected operator or read-only", where,
                        w[i]);
    }
    int rc = KVD_OK;
    if (strcmp(kind, "token") == 0) {
        r.kind = RULE_TOKEN;
        char path[PATH_MAX];
        if (w[2][0] == '/')
            snprintf(path, sizeof(path), "%s", w[2]);
        else
            snprintf(path, sizeof(path), "%s/%s", dir, w[2]);
        rc = token_rule(path, &r, where, why, why_len);
    } else if (strcmp(kind, "uid") == 0) {
        r.kind = RULE_UID;
        if (resolve_uid(w[2], &r.id) != 0)
            rc = fail(why, why_len, "%sno such user '%s'", where, w[2]);
    } else {
        r.kind = RULE_GID;
        if (resolve_gid(w[2], &r.id) != 0)
            rc = fail(why, why_len, "%sno such group '%s'", where, w[2]);
    }
    return rc != KVD_OK ? rc : add_rule(a, &r, where, why, why_len);
}

/* Splits a line into words at blanks; returns their count (at most max). */
static size_t split_words(char *s, char **w, size_t max)
{
    size_t n = 0;
    for (;;) {
        while (*s == ' ' || *s == '\t' || *s == '\r' || *s == '\n')
            s++;
        if (*s == '\0' || n == max)
            return n;
        w[n++] = s;
        while (*s && *s != ' ' && *s != '\t' && *s != '\r' && *s != '\n')
            s++;
        if (*s)
            *s++ = '\0';
    }
}

static int read_config(kvd_auth_t *a, const char *path, char *why, size_t why_len)
{
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return fail(why, why_len, "--auth-config %s: %s", path, strerror(errno));
    char dirbuf[PATH_MAX];
    kvd_strlcpy(dirbuf, path, sizeof(dirbuf));
    const char *dir = dirname(dirbuf);
    char line[2048];
    int lineno = 0, rc = KVD_OK;
    while (rc == KVD_OK && fgets(line, sizeof(line), f) != NULL) {
        lineno++;
        char where[PATH_MAX + 32];
        snprintf(where, sizeof(where), "%s:%d: ", path, lineno);
        size_t len = strlen(line);
        if (len == sizeof(line) - 1 && line[len - 1] != '\n') {
            rc = fail(why, why_len, "%sline over %zu bytes", where, sizeof(line) - 2);
            break;
        }
        char *hash = strchr(line, '#');
        if (hash)
            *hash = '\0';
        char *w[16];
        size_t n = split_words(line, w, KVD_ARRAY_SIZE(w));
        if (n == 0)
            continue;
        if (n == KVD_ARRAY_SIZE(w))
            rc = fail(why, why_len, "%stoo many words", where);
        else if (strcmp(w[0], "tenant") == 0)
            rc = parse_tenant(a, w, n, where, why, why_len);
        else if (strcmp(w[0], "token") == 0 || strcmp(w[0], "uid") == 0 ||
                 strcmp(w[0], "gid") == 0)
            rc = parse_mapping(a, w, n, dir, lineno, where, why, why_len);
        else
            rc = fail(why, why_len,
                      "%sunknown rule '%s': expected tenant, token, uid or gid", where,
                      w[0]);
    }
    fclose(f);
    return rc;
}

/* ------------------------------------------------------ simple flags */

/* Adds one default-operator rule per entry of a comma-separated list. */
static int list_rules(kvd_auth_t *a, const char *flag, const char *list, rule_kind_t kind,
                      char *why, size_t why_len)
{
    char buf[1024];
    if (strlen(list) >= sizeof(buf))
        return fail(why, why_len, "%s: list too long", flag);
    kvd_strlcpy(buf, list, sizeof(buf));
    char *save = NULL;
    size_t n = 0;
    for (char *t = strtok_r(buf, ", ", &save); t; t = strtok_r(NULL, ", ", &save)) {
        auth_rule_t r = {.kind = kind, .tenant_ix = 0, .is_operator = true};
        int bad = kind == RULE_UID ? resolve_uid(t, &r.id) : resolve_gid(t, &r.id);
        if (bad)
            return fail(why, why_len, "%s '%s': no such %s", flag, t,
                        kind == RULE_UID ? "user" : "group");
        char where[64];
        snprintf(where, sizeof(where), "%s %s: ", flag, t);
        /* a uid named twice, or also in the config, is kept once */
        bool dup = false;
        for (size_t i = 0; i < a->n_rules; i++)
            dup |= a->rules[i].kind == kind && a->rules[i].id == r.id;
        if (!dup) {
            int rc = add_rule(a, &r, where, why, why_len);
            if (rc != KVD_OK)
                return rc;
        }
        n++;
    }
    if (n == 0)
        return fail(why, why_len, "%s: empty list", flag);
    return KVD_OK;
}

int kvd_auth_create(const kvd_auth_opts_t *o, kvd_auth_t **out, char *why, size_t why_len)
{
    kvd_auth_t *a = kvd_mem_calloc(KVD_MEM_OTHER, 1, sizeof(*a));
    if (a == NULL)
        return fail(why, why_len, "out of memory");
    a->insecure_no_auth = o->insecure_no_auth;
    a->self_uid = o->self_uid;
    a->n_tenants = 1;
    kvd_strlcpy(a->tenants[0].name, "default", sizeof(a->tenants[0].name));
    int rc = KVD_OK;
    if (o->config_file && o->config_file[0])
        rc = read_config(a, o->config_file, why, why_len);
    if (rc == KVD_OK && o->token_file && o->token_file[0]) {
        auth_rule_t r = {.kind = RULE_TOKEN, .tenant_ix = 0, .is_operator = true};
        rc = token_rule(o->token_file, &r, "--auth-token-file: ", why, why_len);
        if (rc == KVD_OK)
            rc = add_rule(a, &r, "--auth-token-file: ", why, why_len);
    }
    if (rc == KVD_OK && o->peer_token_file && o->peer_token_file[0]) {
        auth_rule_t r = {
            .kind = RULE_TOKEN, .tenant_ix = 0, .is_operator = true, .is_peer = true};
        rc = token_rule(o->peer_token_file, &r, "--cluster-token-file: ", why, why_len);
        if (rc == KVD_OK)
            rc = add_rule(a, &r, "--cluster-token-file: ", why, why_len);
    }
    if (rc == KVD_OK) {
        if (o->allow_uid && o->allow_uid[0]) {
            rc = list_rules(a, "--allow-uid", o->allow_uid, RULE_UID, why, why_len);
        } else {
            /* the default: the daemon's own user, and root */
            char self[32];
            snprintf(self, sizeof(self), "%u,0", (unsigned)o->self_uid);
            rc = list_rules(a, "the daemon's own uid", self, RULE_UID, why, why_len);
        }
    }
    if (rc == KVD_OK && o->allow_gid && o->allow_gid[0])
        rc = list_rules(a, "--allow-gid", o->allow_gid, RULE_GID, why, why_len);
    if (rc == KVD_OK && o->tcp && !o->insecure_no_auth && kvd_auth_token_count(a) == 0)
        rc = fail(why, why_len,
                  "--listen without a token: anyone who reaches the port (every local "
                  "user, on loopback too) would be served. Give --auth-token-file FILE "
                  "(or token lines in --auth-config), or --insecure-no-auth to serve "
                  "TCP without authentication");
    if (rc != KVD_OK) {
        kvd_auth_destroy(a);
        return rc;
    }
    *out = a;
    return KVD_OK;
}

void kvd_auth_destroy(kvd_auth_t *a)
{
    if (a == NULL)
        return;
    explicit_bzero(a->rules, sizeof(a->rules));
    kvd_mem_free(KVD_MEM_OTHER, a, sizeof(*a));
}

int kvd_auth_bind(kvd_auth_t *a, kvd_store_t *store, char *why, size_t why_len)
{
    a->tenants[0].store_id = KVD_TENANT_DEFAULT;
    for (size_t i = 1; i < a->n_tenants; i++) {
        auth_tenant_t *t = &a->tenants[i];
        int rc = kvd_store_tenant_add(store, t->name, &t->limits, &t->store_id);
        if (rc != KVD_OK) {
            snprintf(why, why_len, "cannot add tenant '%s': %s", t->name,
                     kvd_status_str(rc));
            return rc;
        }
    }
    a->bound = true;
    return KVD_OK;
}

size_t kvd_auth_token_count(const kvd_auth_t *a)
{
    size_t n = 0;
    for (size_t i = 0; i < a->n_rules; i++)
        n += a->rules[i].kind == RULE_TOKEN;
    return n;
}

/* ------------------------------------------------------------ checks */

static void grant_of(const kvd_auth_t *a, const auth_rule_t *r, kvd_auth_grant_t *out)
{
    *out = (kvd_auth_grant_t){.tenant = a->tenants[r->tenant_ix].store_id,
                              .is_operator = r->is_operator,
                              .read_only = r->read_only,
                              .is_peer = r->is_peer};
}

static bool in_groups(const kvd_auth_peer_t *p, uint32_t gid)
{
    if (p->gid == (gid_t)gid)
        return true;
    for (size_t i = 0; i < p->n_groups; i++)
        if (p->groups[i] == (gid_t)gid)
            return true;
    return false;
}

int kvd_auth_check(const kvd_auth_t *a, const kvd_auth_peer_t *peer, const uint8_t *token,
                   size_t token_len, kvd_auth_grant_t *out, const char **why)
{
    if (token_len > 0) {
        uint8_t d[DIGEST_BYTES];
        if (digest(token, token_len, d) != KVD_OK) {
            *why = "out of memory checking the token";
            return KVD_ERR_AUTH;
        }
        /* every token rule is compared, whichever matches */
        const auth_rule_t *hit = NULL;
        for (size_t i = 0; i < a->n_rules; i++) {
            const auth_rule_t *r = &a->rules[i];
            bool eq = r->kind == RULE_TOKEN &&
                      kvd_const_time_equal(r->digest, DIGEST_BYTES, d, DIGEST_BYTES);
            hit = eq ? r : hit;
        }
        explicit_bzero(d, sizeof(d));
        if (hit == NULL) {
            *why = "the token matches none the daemon accepts";
            return KVD_ERR_AUTH;
        }
        grant_of(a, hit, out);
        return KVD_OK;
    }
    if (peer->tcp) {
        if (a->insecure_no_auth) {
            *out = (kvd_auth_grant_t){.tenant = KVD_TENANT_DEFAULT, .is_operator = true};
            return KVD_OK;
        }
        *why = "a TCP client needs a token (HelloRequest.auth_token)";
        return KVD_ERR_AUTH;
    }
    if (!peer->has_cred) {
        *why = "the peer's credentials (SO_PEERCRED) are unknown";
        return KVD_ERR_AUTH;
    }
    /* uids first (a user's own rule beats a group's), then groups; within
     * each the auth config's lines come before the flags' */
    for (size_t i = 0; i < a->n_rules; i++)
        if (a->rules[i].kind == RULE_UID && a->rules[i].id == (uint32_t)peer->uid) {
            grant_of(a, &a->rules[i], out);
            return KVD_OK;
        }
    for (size_t i = 0; i < a->n_rules; i++)
        if (a->rules[i].kind == RULE_GID && in_groups(peer, a->rules[i].id)) {
            grant_of(a, &a->rules[i], out);
            return KVD_OK;
        }
    *why = "the peer's uid and groups are not allowed (--allow-uid, --allow-gid, "
           "--auth-config)";
    return KVD_ERR_AUTH;
}

mode_t kvd_auth_socket_mode(const kvd_auth_t *a, gid_t *group)
{
    bool foreign_uid = false;
    size_t n_gids = 0;
    gid_t gid = (gid_t)-1;
    for (size_t i = 0; i < a->n_rules; i++) {
        const auth_rule_t *r = &a->rules[i];
        if (r->kind == RULE_UID && r->id != (uint32_t)a->self_uid && r->id != 0)
            foreign_uid = true;
        if (r->kind == RULE_GID && (gid_t)r->id != gid) {
            n_gids++;
            gid = (gid_t)r->id;
        }
    }
    *group = (gid_t)-1;
    if (foreign_uid || n_gids > 1)
        return 0666;
    if (n_gids == 1) {
        *group = gid;
        return 0660;
    }
    return 0600;
}

bool kvd_ratelimit_allow(kvd_ratelimit_t *r, uint64_t now_ns, uint32_t burst,
                         uint64_t window_ns, uint64_t *suppressed)
{
    if (now_ns - r->window_start_ns >= window_ns || r->window_start_ns == 0) {
        r->window_start_ns = now_ns;
        r->in_window = 0;
    }
    if (r->in_window >= burst) {
        r->suppressed++;
        return false;
    }
    r->in_window++;
    *suppressed = r->suppressed;
    r->suppressed = 0;
    return true;
}
