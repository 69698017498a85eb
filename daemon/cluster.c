/*
 * cluster.c - membership in etcd (cluster.h): the lease, the member key,
 * the epoch, the watch, and the view the event loop reads.
 *
 * The thread's round: grant a lease, put the member key under it, raise
 * the epoch, read every key of the cluster, watch from the revision after
 * that read; then keep the lease alive every TTL/3, re-put the member key
 * (the heartbeat) every TTL, and apply what the watch brings. A watch that
 * ends (etcd restarted, compaction) is followed by a new read and a new
 * watch; a keep-alive that finds the lease gone (etcd was away longer than
 * the TTL) starts the round again, which registers anew and is a join.
 */
#include "cluster.h"
#include "etcd.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#define POLL_SLICE_MS    200 /* the longest the thread waits before checking stop */
#define BACKOFF_MIN_MS   200 /* between tries while etcd is away */
#define BACKOFF_MAX_MS   2000
#define EPOCH_CAS_TRIES  8
#define MEMBER_VALUE_MAX 1024

typedef struct member {
    kvd_member_msg_t m;
    uint64_t seen_ns; /* when its last PUT arrived (our monotonic clock) */
} member_t;

struct kvd_cluster {
    /* configuration, fixed at start */
    char endpoints[512];
    char node_id[KVD_NODE_ID_BYTES];
    char advertise[KVD_ADDR_BYTES];
    char prefix[192];     /* /kvdock/NAME/ */
    char member_key[320]; /* prefix + members/ + node_id */
    char epoch_key[224];
    int ttl_s;
    int timeout_ms;
    uint64_t pool_bytes;
    uint64_t started_unix_ms;
    int efd; /* eventfd: the view changed */
    pthread_t thread;
    bool thread_started;
    _Atomic bool stop;
    pthread_mutex_t sleep_mu; /* with sleep_cv: an interruptible sleep */
    pthread_cond_t sleep_cv;
    _Atomic uint64_t load_objects, load_dir_entries;

    /* the thread's own state; the member table is also read by
     * kvd_cluster_view, under mu (the thread changes it only under mu) */
    kvd_etcd_t *etcd;
    int64_t lease;
    bool registered;
    bool ever_joined;
    uint64_t self_heartbeat_ns;
    member_t *tab; /* sorted by node_id */
    size_t n, cap;
    uint64_t epoch;
    uint64_t woke_gen, woke_epoch; /* what the loop was last woken for */

    /* the published state, under mu */
    pthread_mutex_t mu;
    _Atomic int state;    /* kvd_cluster_state_t */
    uint64_t version;     /* rises on every change, heartbeats included */
    uint64_t members_gen; /* rises when a member joins, leaves or restarts */
    char etcd_text[KVD_ERROR_MAX];
};

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t unix_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000ull + (uint64_t)ts.tv_nsec / 1000000ull;
}

/* Sleeps ms, or less when stop is asked for. */
static void nap(kvd_cluster_t *c, int ms)
{
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    until.tv_sec += ms / 1000;
    until.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&c->sleep_mu);
    while (!atomic_load(&c->stop) &&
           pthread_cond_timedwait(&c->sleep_cv, &c->sleep_mu, &until) != ETIMEDOUT) {
    }
    pthread_mutex_unlock(&c->sleep_mu);
}

/* ------------------------------------------------------------ the view */

/* Publishes the state and text; wakes the loop when the state, the epoch
 * or the members (not only their heartbeats) changed. */
static void publish(kvd_cluster_t *c, kvd_cluster_state_t state, const char *text)
{
    pthread_mutex_lock(&c->mu);
    bool wake = c->members_gen != c->woke_gen || c->epoch != c->woke_epoch;
    c->woke_gen = c->members_gen;
    c->woke_epoch = c->epoch;
    int old = atomic_exchange(&c->state, (int)state);
    wake |= old != (int)state;
    if (text != NULL)
        kvd_strlcpy(c->etcd_text, text, sizeof(c->etcd_text));
    c->version++;
    pthread_mutex_unlock(&c->mu);
    if (!wake)
        return;
    if (old != (int)state) {
        if (state == KVD_CLUSTER_DEGRADED)
            KVD_WARN("cluster", "cluster degraded: %s; serving local objects only",
                     text ? text : "");
        else if (state == KVD_CLUSTER_READY)
            KVD_INFO("cluster",
                     "cluster ready: node %s, epoch %llu, %zu members, etcd %s",
                     c->node_id, (unsigned long long)c->epoch, c->n, text ? text : "");
    }
    uint64_t one = 1;
    ssize_t w = write(c->efd, &one, sizeof(one));
    (void)w; /* a full counter already says "changed" */
}

int kvd_cluster_fd(const kvd_cluster_t *c)
{
    return c->efd;
}

void kvd_cluster_ack(kvd_cluster_t *c)
{
    uint64_t v;
    ssize_t r = read(c->efd, &v, sizeof(v));
    (void)r;
}

kvd_cluster_state_t kvd_cluster_state(kvd_cluster_t *c)
{
    return c ? (kvd_cluster_state_t)atomic_load(&c->state) : KVD_CLUSTER_OFF;
}

void kvd_cluster_set_load(kvd_cluster_t *c, uint64_t objects, uint64_t directory_entries)
{
    atomic_store(&c->load_objects, objects);
    atomic_store(&c->load_dir_entries, directory_entries);
}

int kvd_cluster_view(kvd_cluster_t *c, kvd_cluster_view_t *out)
{
    memset(out, 0, sizeof(*out));
    uint64_t now = mono_ns();
    pthread_mutex_lock(&c->mu);
    out->state = (kvd_cluster_state_t)atomic_load(&c->state);
    out->epoch = c->woke_epoch;
    out->version = c->version;
    out->members_gen = c->members_gen;
    kvd_strlcpy(out->etcd, c->etcd_text, sizeof(out->etcd));
    if (c->n > 0) {
        out->members = kvd_mem_calloc(KVD_MEM_OTHER, c->n, sizeof(*out->members));
        if (out->members == NULL) {
            pthread_mutex_unlock(&c->mu);
            return KVD_ERR_NOMEM;
        }
        for (size_t i = 0; i < c->n; i++) {
            out->members[i] = c->tab[i].m;
            out->members[i].heartbeat_ms_ago =
                now > c->tab[i].seen_ns ? (now - c->tab[i].seen_ns) / 1000000ull : 0;
        }
        out->n = c->n;
    }
    pthread_mutex_unlock(&c->mu);
    return KVD_OK;
}

void kvd_cluster_view_free(kvd_cluster_view_t *v)
{
    if (v->members != NULL)
        kvd_mem_free(KVD_MEM_OTHER, v->members, v->n * sizeof(*v->members));
    v->members = NULL;
    v->n = 0;
}

/* ------------------------------------------------------------ the table */

static size_t tab_find(const kvd_cluster_t *c, const char *id, bool *found)
{
    size_t lo = 0, hi = c->n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        int cmp = strcmp(c->tab[mid].m.node_id, id);
        if (cmp == 0) {
            *found = true;
            return mid;
        }
        if (cmp < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    *found = false;
    return lo;
}

/* tab_put with mu held. */
static void tab_put_locked(kvd_cluster_t *c, const kvd_member_msg_t *m)
{
    bool found;
    size_t at = tab_find(c, m->node_id, &found);
    if (!found || c->tab[at].m.started_unix_ms != m->started_unix_ms ||
        strcmp(c->tab[at].m.address, m->address) != 0)
        c->members_gen++; /* a join, a restart or a move: not a heartbeat */
    if (!found) {
        if (c->n == c->cap) {
            size_t cap = c->cap ? 2 * c->cap : 16;
            member_t *t = kvd_mem_realloc(KVD_MEM_OTHER, c->tab, c->cap * sizeof(*t),
                                          cap * sizeof(*t));
            if (t == NULL)
                return; /* this member stays unknown until the next read */
            c->tab = t;
            c->cap = cap;
        }
        memmove(&c->tab[at + 1], &c->tab[at], (c->n - at) * sizeof(*c->tab));
        c->n++;
    }
    c->tab[at].m = *m;
    c->tab[at].m.self = strcmp(m->node_id, c->node_id) == 0;
    c->tab[at].seen_ns = mono_ns();
}

static void tab_put(kvd_cluster_t *c, const kvd_member_msg_t *m)
{
    pthread_mutex_lock(&c->mu);
    tab_put_locked(c, m);
    pthread_mutex_unlock(&c->mu);
}

static bool tab_del(kvd_cluster_t *c, const char *id)
{
    bool found;
    size_t at = tab_find(c, id, &found);
    if (!found)
        return false;
    pthread_mutex_lock(&c->mu);
    memmove(&c->tab[at], &c->tab[at + 1], (c->n - at - 1) * sizeof(*c->tab));
    c->n--;
    c->members_gen++;
    pthread_mutex_unlock(&c->mu);
    return true;
}

/* The member a key names ("" when the key is not a member key). */
static const char *member_id_of(const kvd_cluster_t *c, const char *key)
{
    size_t plen = strlen(c->prefix);
    if (strncmp(key, c->prefix, plen) != 0 || strncmp(key + plen, "members/", 8) != 0)
        return "";
    return key + plen + 8;
}

static uint64_t json_u64(const cJSON *o, const char *name)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    return cJSON_IsNumber(v) && v->valuedouble > 0 ? (uint64_t)v->valuedouble : 0;
}

/* A member's value into m; false when it is not ours to read. */
static bool member_parse(const char *id, const char *value, size_t len,
                         kvd_member_msg_t *m)
{
    memset(m, 0, sizeof(*m));
    if (strlen(id) == 0 || strlen(id) >= sizeof(m->node_id))
        return false;
    cJSON *o = cJSON_ParseWithLength(value, len);
    if (o == NULL)
        return false;
    const cJSON *addr = cJSON_GetObjectItemCaseSensitive(o, "address");
    bool ok = cJSON_IsString(addr) && strlen(addr->valuestring) < sizeof(m->address);
    if (ok) {
        kvd_strlcpy(m->node_id, id, sizeof(m->node_id));
        kvd_strlcpy(m->address, addr->valuestring, sizeof(m->address));
        m->pool_bytes = json_u64(o, "pool_bytes");
        m->objects = json_u64(o, "objects");
        m->directory_entries = json_u64(o, "directory_entries");
        m->started_unix_ms = json_u64(o, "started_unix_ms");
    }
    cJSON_Delete(o);
    return ok;
}

static int member_value(kvd_cluster_t *c, char *buf, size_t cap)
{
    int n =
        snprintf(buf, cap,
                 "{\"address\":\"%s\",\"pool_bytes\":%llu,\"objects\":%llu,"
                 "\"directory_entries\":%llu,\"started_unix_ms\":%llu,"
                 "\"heartbeat_unix_ms\":%llu}",
                 c->advertise, (unsigned long long)c->pool_bytes,
                 (unsigned long long)atomic_load(&c->load_objects),
                 (unsigned long long)atomic_load(&c->load_dir_entries),
                 (unsigned long long)c->started_unix_ms, (unsigned long long)unix_ms());
    return n > 0 && (size_t)n < cap ? n : -1;
}

static uint64_t parse_epoch(const char *v, size_t len)
{
    char buf[32];
    if (len == 0 || len >= sizeof(buf))
        return 0;
    memcpy(buf, v, len);
    buf[len] = '\0';
    return strtoull(buf, NULL, 10);
}

/* ------------------------------------------------------------ etcd steps */

static void degraded(kvd_cluster_t *c, const char *what)
{
    char text[KVD_ERROR_MAX];
    snprintf(text, sizeof(text), "%s: %s", what, kvd_etcd_error(c->etcd));
    publish(c, c->ever_joined ? KVD_CLUSTER_DEGRADED : KVD_CLUSTER_JOINING, text);
}

/* Puts the member key under the lease (registration and heartbeat). */
static int put_self(kvd_cluster_t *c)
{
    char v[MEMBER_VALUE_MAX];
    int n = member_value(c, v, sizeof(v));
    if (n < 0)
        return KVD_ERR_TOO_LARGE;
    int rc = kvd_etcd_put(c->etcd, c->member_key, strlen(c->member_key), v, (size_t)n,
                          c->lease, NULL);
    if (rc == KVD_OK) {
        c->self_heartbeat_ns = mono_ns();
        kvd_member_msg_t m;
        if (member_parse(c->node_id, v, (size_t)n, &m))
            tab_put(c, &m);
    }
    return rc;
}

/*
 * Raises the epoch by one: for a join (after_revision 0), or for the
 * departure deleted at after_revision, only if nobody raised it since
 * then (one change, one rise).
 */
static void raise_epoch(kvd_cluster_t *c, int64_t after_revision)
{
    for (int i = 0; i < EPOCH_CAS_TRIES && !atomic_load(&c->stop); i++) {
        kvd_etcd_kvs_t cur = {0};
        if (kvd_etcd_get(c->etcd, c->epoch_key, strlen(c->epoch_key), &cur) != KVD_OK)
            return;
        int64_t mod = cur.n ? cur.kv[0].mod_revision : 0;
        uint64_t e = cur.n ? parse_epoch(cur.kv[0].value, cur.kv[0].value_len) : 0;
        kvd_etcd_kvs_free(&cur);
        if (after_revision != 0 && mod > after_revision)
            return; /* someone saw this departure first */
        char v[32];
        int n = snprintf(v, sizeof(v), "%llu", (unsigned long long)(e + 1));
        bool done = false;
        if (kvd_etcd_cas(c->etcd, c->epoch_key, strlen(c->epoch_key), mod, v, (size_t)n,
                         0, &done, NULL) != KVD_OK)
            return;
        if (done) {
            if (e + 1 > c->epoch)
                c->epoch = e + 1;
            return;
        }
    }
}

/* Reads every key of the cluster into the table; *revision for the watch. */
static int read_all(kvd_cluster_t *c, int64_t *revision)
{
    kvd_etcd_kvs_t kvs = {0};
    int rc = kvd_etcd_get_prefix(c->etcd, c->prefix, strlen(c->prefix), &kvs);
    if (rc != KVD_OK)
        return rc;
    /* parsed first, then put in place at once: a reader of the table
     * never sees half of it */
    kvd_member_msg_t *ms = kvd_mem_calloc(KVD_MEM_OTHER, kvs.n + 1, sizeof(*ms));
    if (ms == NULL) {
        kvd_etcd_kvs_free(&kvs);
        return KVD_ERR_NOMEM;
    }
    size_t nm = 0;
    for (size_t i = 0; i < kvs.n; i++) {
        const kvd_etcd_kv_t *kv = &kvs.kv[i];
        if (strcmp(kv->key, c->epoch_key) == 0)
            c->epoch = parse_epoch(kv->value, kv->value_len);
        else if (member_parse(member_id_of(c, kv->key), kv->value, kv->value_len,
                              &ms[nm]))
            nm++;
    }
    pthread_mutex_lock(&c->mu);
    c->n = 0;
    for (size_t i = 0; i < nm; i++)
        tab_put_locked(c, &ms[i]);
    c->members_gen++; /* read anew: whatever it holds now */
    pthread_mutex_unlock(&c->mu);
    kvd_mem_free(KVD_MEM_OTHER, ms, (kvs.n + 1) * sizeof(*ms));
    *revision = kvs.revision;
    kvd_etcd_kvs_free(&kvs);
    return KVD_OK;
}

/* Applies the watch's events; true when this daemon's own key went. */
static bool apply(kvd_cluster_t *c, const kvd_etcd_event_t *ev, size_t n, bool *changed)
{
    bool self_gone = false;
    for (size_t i = 0; i < n; i++) {
        const kvd_etcd_kv_t *kv = &ev[i].kv;
        if (strcmp(kv->key, c->epoch_key) == 0) {
            if (!ev[i].is_delete) {
                uint64_t e = parse_epoch(kv->value, kv->value_len);
                *changed |= e != c->epoch;
                c->epoch = e;
            }
            continue;
        }
        const char *id = member_id_of(c, kv->key);
        if (id[0] == '\0')
            continue;
        if (ev[i].is_delete) {
            if (tab_del(c, id)) {
                *changed = true;
                KVD_INFO("cluster", "member %s left", id);
            }
            if (strcmp(id, c->node_id) == 0)
                self_gone = true;
            else
                raise_epoch(c, kv->mod_revision);
            continue;
        }
        kvd_member_msg_t m;
        if (member_parse(id, kv->value, kv->value_len, &m)) {
            bool found;
            tab_find(c, id, &found);
            if (!found)
                KVD_INFO("cluster", "member %s joined (%s)", id, m.address);
            tab_put(c, &m);
            *changed = true; /* a heartbeat changes the counts shown */
        }
    }
    return self_gone;
}

/* Drops the lease (lost or never got): the next round registers anew. */
static void lose_lease(kvd_cluster_t *c)
{
    c->lease = 0;
    c->registered = false;
}

/* The outcome of a call that needs the lease (a keep-alive, a heartbeat):
 * true when it went; otherwise the state says why, and a lease found gone
 * is dropped (the next round registers anew). */
static bool lease_call_ok(kvd_cluster_t *c, int rc, const char *what)
{
    if (rc == KVD_OK)
        return true;
    if (rc == KVD_ERR_NOT_FOUND) {
        lose_lease(c);
        degraded(c, "the member lease expired");
    } else {
        degraded(c, what);
    }
    return false;
}

/* One registration and watch, until it ends (stop, lease lost, watch
 * ended, etcd away). */
static void one_round(kvd_cluster_t *c)
{
    if (c->lease == 0) {
        int ttl = 0;
        if (kvd_etcd_lease_grant(c->etcd, c->ttl_s, &c->lease, &ttl) != KVD_OK) {
            c->lease = 0;
            degraded(c, "cannot grant the member lease");
            return;
        }
    }
    if (!c->registered) {
        int rc = put_self(c);
        if (rc == KVD_ERR_NOT_FOUND) {
            lose_lease(c);
            return;
        }
        if (rc != KVD_OK) {
            degraded(c, "cannot register");
            return;
        }
        c->registered = true;
        raise_epoch(c, 0);
        KVD_INFO("cluster", "registered as %s (%s) in %s, lease ttl %d s", c->node_id,
                 c->advertise, c->prefix, c->ttl_s);
    }
    int64_t rev = 0;
    if (read_all(c, &rev) != KVD_OK) {
        degraded(c, "cannot read the members");
        return;
    }
    kvd_etcd_watch_t *w = NULL;
    if (kvd_etcd_watch_start(c->etcd, c->prefix, strlen(c->prefix), rev + 1, &w) !=
        KVD_OK) {
        degraded(c, "cannot watch the members");
        return;
    }
    c->ever_joined = true;
    publish(c, KVD_CLUSTER_READY, kvd_etcd_endpoint(c->etcd));
    uint64_t ka_every = (uint64_t)c->ttl_s * 1000000000ull / 3;
    uint64_t hb_every = (uint64_t)c->ttl_s * 1000000000ull;
    uint64_t next_ka = mono_ns() + ka_every, next_hb = mono_ns() + hb_every;
    bool ok = true;
    while (ok && !atomic_load(&c->stop)) {
        uint64_t now = mono_ns();
        uint64_t due = KVD_MIN(next_ka, next_hb);
        int wait = due > now ? (int)KVD_MIN((due - now) / 1000000ull, POLL_SLICE_MS) : 0;
        kvd_etcd_event_t *ev = NULL;
        size_t n = 0;
        int rc = kvd_etcd_watch_poll(w, wait, &ev, &n);
        bool changed = false;
        bool self_gone = apply(c, ev, n, &changed);
        kvd_etcd_events_free(ev, n);
        if (changed)
            publish(c, KVD_CLUSTER_READY, NULL);
        if (self_gone) {
            /* our key went (the lease expired while etcd was away from us):
             * register again at once */
            lose_lease(c);
            degraded(c, "this member's key was deleted");
            break;
        }
        if (rc != KVD_OK) {
            degraded(c, "the watch ended");
            break;
        }
        now = mono_ns();
        if (now >= next_ka) {
            int ttl = 0;
            ok = lease_call_ok(c, kvd_etcd_lease_keepalive(c->etcd, c->lease, &ttl),
                               "cannot keep the member lease alive");
            next_ka = now + ka_every;
        }
        if (ok && now >= next_hb) {
            ok = lease_call_ok(c, put_self(c), "cannot put the heartbeat");
            next_hb = now + hb_every;
        }
    }
    kvd_etcd_watch_stop(w);
}

static void *cluster_main(void *arg)
{
    kvd_cluster_t *c = arg;
    int backoff = BACKOFF_MIN_MS;
    while (!atomic_load(&c->stop)) {
        uint64_t t0 = mono_ns();
        one_round(c);
        if (atomic_load(&c->stop))
            break;
        /* a round that ran a while was a good one: start the backoff over */
        if (mono_ns() - t0 > 5ull * 1000000000ull)
            backoff = BACKOFF_MIN_MS;
        nap(c, backoff);
        backoff = KVD_MIN(backoff * 2, BACKOFF_MAX_MS);
    }
    if (c->lease != 0 && kvd_etcd_lease_revoke(c->etcd, c->lease) == KVD_OK)
        KVD_INFO("cluster", "left the cluster (lease revoked)");
    return NULL;
}

/* ------------------------------------------------------------ lifecycle */

int kvd_cluster_start(const kvd_cluster_cfg_t *cfg, kvd_cluster_t **out)
{
    kvd_cluster_t *c = kvd_mem_calloc(KVD_MEM_OTHER, 1, sizeof(*c));
    if (c == NULL)
        return KVD_ERR_NOMEM;
    kvd_strlcpy(c->endpoints, cfg->endpoints, sizeof(c->endpoints));
    kvd_strlcpy(c->node_id, cfg->node_id, sizeof(c->node_id));
    kvd_strlcpy(c->advertise, cfg->advertise, sizeof(c->advertise));
    snprintf(c->prefix, sizeof(c->prefix), "/kvdock/%s/", cfg->cluster_name);
    snprintf(c->member_key, sizeof(c->member_key), "%smembers/%s", c->prefix, c->node_id);
    snprintf(c->epoch_key, sizeof(c->epoch_key), "%sepoch", c->prefix);
    c->ttl_s = cfg->ttl_s;
    c->timeout_ms = (int)KVD_MAX(500, KVD_MIN(2000, cfg->ttl_s * 1000 / 3));
    c->pool_bytes = cfg->pool_bytes;
    c->started_unix_ms = cfg->started_unix_ms;
    atomic_store(&c->state, (int)KVD_CLUSTER_JOINING);
    kvd_strlcpy(c->etcd_text, "joining", sizeof(c->etcd_text));
    pthread_mutex_init(&c->mu, NULL);
    pthread_mutex_init(&c->sleep_mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&c->sleep_cv, &ca);
    pthread_condattr_destroy(&ca);
    c->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    int rc =
        c->efd < 0 ? KVD_ERR_IO : kvd_etcd_create(c->endpoints, c->timeout_ms, &c->etcd);
    if (rc == KVD_OK && pthread_create(&c->thread, NULL, cluster_main, c) != 0)
        rc = KVD_ERR_NOMEM;
    if (rc != KVD_OK) {
        kvd_cluster_stop(c);
        return rc;
    }
    c->thread_started = true;
    *out = c;
    return KVD_OK;
}

void kvd_cluster_stop(kvd_cluster_t *c)
{
    if (c == NULL)
        return;
    if (c->thread_started) {
        pthread_mutex_lock(&c->sleep_mu);
        atomic_store(&c->stop, true);
        pthread_cond_broadcast(&c->sleep_cv);
        pthread_mutex_unlock(&c->sleep_mu);
        pthread_join(c->thread, NULL);
    }
    if (c->etcd != NULL)
        kvd_etcd_destroy(c->etcd);
    if (c->efd >= 0)
        close(c->efd);
    if (c->tab != NULL)
        kvd_mem_free(KVD_MEM_OTHER, c->tab, c->cap * sizeof(*c->tab));
    pthread_mutex_destroy(&c->mu);
    pthread_mutex_destroy(&c->sleep_mu);
    pthread_cond_destroy(&c->sleep_cv);
    kvd_mem_free(KVD_MEM_OTHER, c, sizeof(*c));
}
