/*
 * remote.c - remote loads (remote.h): the fetch table, the directory
 * question, the Fetch requests to the holders and what their replies put
 * into the pool; and the holder's side of Fetch.
 *
 * The table is open addressing with linear probing and backward-shift
 * deletion (no tombstones), keyed by (namespace id, key) through a seeded
 * hash: keys are chosen by clients.
 */
#include "remote.h"

#include <string.h>
#include <sys/random.h>

#define FAIL_HOLD_MS 2000             /* a failed key answers NOT_FOUND this long */
#define FRAME_SLACK  (64u * 1024u)    /* a Fetch reply's frame beside its bytes */
#define OWNER_REMOTE (UINT64_MAX - 1) /* the owner of a fetch's reservations */

#define READ_KEYS_MAX 1024 /* keys one UCX read pins (its Fetch stays small) */
#define RETRY_MS      20   /* a key its holder is promoting: asked again */

enum { SLOT_EMPTY = 0, SLOT_BUSY, SLOT_FAILED, SLOT_RETRY };

typedef struct slot {
    uint8_t key[KVD_KEY_BYTES];
    uint32_t ns;
    uint8_t state;
    uint64_t until_ms; /* SLOT_FAILED: NOT_FOUND until then; SLOT_RETRY: in progress */
} slot_t;

struct kvd_remote {
    kvd_store_t *store;
    uint8_t *pool;
    kvd_dirsvc_t *dir;
    kvd_peers_t *peers;
    size_t max_frame;
    bool ucx; /* objects are read over UCX (kvd_peers_read) where peers serve it */
    uint64_t seed;
    slot_t *slots; /* KVD_REMOTE_SLOTS */
    size_t used;
    kvd_remote_stats_t st;
};

/* One Acquire's missing keys on their way: the directory's answer, then one
 * Fetch per holder (and per frame's worth of keys). */
typedef struct job {
    kvd_remote_t *r;
    uint32_t ns;
    char tenant[KVD_TENANT_NAME_BYTES];
    char ns_name[KVD_NS_NAME_BYTES];
    uint64_t object_bytes;
    size_t n;
    kvd_key_t *keys;
    size_t refs; /* Fetches in flight, plus one while the job is set up */
} job_t;

typedef struct fetch {
    job_t *job;
    char node[KVD_NODE_ID_BYTES]; /* the holder asked */
    size_t n;
    size_t *at; /* into job->keys */
} fetch_t;

/* ------------------------------------------------------------- table */

static size_t home(const kvd_remote_t *r, uint32_t ns, const uint8_t *key)
{
    uint64_t a, b;
    memcpy(&a, key, 8);
    memcpy(&b, key + 8, 8);
    return (size_t)(kvd_mix64(a ^ r->seed ^ ((uint64_t)ns << 32)) ^
                    kvd_mix64(b + r->seed)) &
           (KVD_REMOTE_SLOTS - 1);
}

static slot_t *slot_find(kvd_remote_t *r, uint32_t ns, const uint8_t *key)
{
    for (size_t i = home(r, ns, key), k = 0; k < KVD_REMOTE_SLOTS;
         i = (i + 1) & (KVD_REMOTE_SLOTS - 1), k++) {
        slot_t *s = &r->slots[i];
        if (s->state == SLOT_EMPTY)
            return NULL;
        if (s->ns == ns && memcmp(s->key, key, KVD_KEY_BYTES) == 0)
            return s;
    }
    return NULL;
}

static slot_t *slot_add(kvd_remote_t *r, uint32_t ns, const uint8_t *key)
{
    if (r->used >= KVD_REMOTE_SLOTS * 3 / 4)
        return NULL; /* a full table probes forever: keep it three quarters */
    size_t i = home(r, ns, key);
    while (r->slots[i].state != SLOT_EMPTY)
        i = (i + 1) & (KVD_REMOTE_SLOTS - 1);
    slot_t *s = &r->slots[i];
    memcpy(s->key, key, KVD_KEY_BYTES);
    s->ns = ns;
    s->state = SLOT_BUSY;
    r->used++;
    return s;
}

/* Deletes s and shifts back the slots its removal would cut off from home. */
static void slot_del(kvd_remote_t *r, slot_t *s)
{
    size_t i = (size_t)(s - r->slots);
    r->slots[i].state = SLOT_EMPTY;
    r->used--;
    for (size_t j = (i + 1) & (KVD_REMOTE_SLOTS - 1); r->slots[j].state != SLOT_EMPTY;
         j = (j + 1) & (KVD_REMOTE_SLOTS - 1)) {
        size_t h = home(r, r->slots[j].ns, r->slots[j].key);
        /* j may move to i when its home is not within (i, j] cyclically */
        bool stays = i <= j ? (h > i && h <= j) : (h > i || h <= j);
        if (stays)
            continue;
        r->slots[i] = r->slots[j];
        r->slots[j].state = SLOT_EMPTY;
        i = j;
    }
}

/* A key its holder is reading from its SSD tier: fetched again after
 * RETRY_MS (an Acquire meanwhile answers in progress). */
static void key_retry(kvd_remote_t *r, uint32_t ns, const uint8_t *key)
{
    slot_t *s = slot_find(r, ns, key);
    if (s == NULL)
        return;
    s->state = SLOT_RETRY;
    s->until_ms = kvd_now_ns() / 1000000 + RETRY_MS;
}

/* The end of one key's fetch. */
static void key_done(kvd_remote_t *r, uint32_t ns, const uint8_t *key, bool ok)
{
    slot_t *s = slot_find(r, ns, key);
    if (s == NULL)
        return;
    if (ok) {
        slot_del(r, s);
        return;
    }
    r->st.failed++;
    s->state = SLOT_FAILED;
    s->until_ms = kvd_now_ns() / 1000000 + FAIL_HOLD_MS;
}

/* ------------------------------------------------------------- jobs */

/* The end of a fetch's keys at[0..n) of j: a key the holder is promoting
 * is asked for again; every other one is done, and fetched when it is
 * here now (published by the fetch, or by another writer meanwhile).
 * fr: the answer of holder `node`, or NULL (it did not answer, or was not
 * asked). */
static void keys_settle(const job_t *j, const size_t *at, size_t n,
                        const kvd_fetch_rep_t *fr, const char *node)
{
    for (size_t i = 0; i < n; i++) {
        const uint8_t *key = j->keys[at[i]];
        if (fr != NULL && fr->present[i] == KVD_FETCH_PROMOTING) {
            key_retry(j->r, j->ns, key);
            continue;
        }
        kvd_obj_info_t info;
        bool here = kvd_store_inspect(j->r->store, j->ns, key, &info) == KVD_OK &&
                    info.state == KVD_OBJ_READY;
        if (!here) /* the holder named did not give it: not asked of it again */
            kvd_dirsvc_stale(j->r->dir, j->tenant, j->ns_name, key,
                             fr != NULL && fr->present[i] != KVD_FETCH_HERE ? node
                                                                            : NULL);
        key_done(j->r, j->ns, key, here);
    }
}

static void job_put(job_t *j)
{
    if (--j->refs > 0)
        return;
    kvd_mem_free(KVD_MEM_STAGING, j->keys, j->n * sizeof(kvd_key_t));
    kvd_mem_free(KVD_MEM_STAGING, j, sizeof(*j));
}

/* A holder's Fetch reply: reserve, write and publish what came. */
static void on_fetch(void *arg, int status, kvd_msg_t *rep)
{
    fetch_t *f = arg;
    job_t *j = f->job;
    kvd_remote_t *r = j->r;
    /* the peer's answer to a plain Fetch carries the bytes of every key it
     * says is here (decode checked the counts agree), never a pin */
    const kvd_fetch_rep_t *fr =
        status == KVD_OK && rep->status == KVD_OK && rep->body.fetch_rep.n == f->n &&
                rep->body.fetch_rep.object_bytes == j->object_bytes &&
                rep->body.fetch_rep.lease_id == 0 && rep->body.fetch_rep.n_offsets == 0 &&
                rep->body.fetch_rep.data_len ==
                    rep->body.fetch_rep.n_depths * j->object_bytes
            ? &rep->body.fetch_rep
            : NULL;
    size_t n_in = 0;
    kvd_put_t *puts = kvd_mem_calloc(KVD_MEM_STAGING, f->n + 1, sizeof(*puts));
    size_t *src = kvd_mem_calloc(KVD_MEM_STAGING, f->n + 1, sizeof(*src));
    uint8_t *results = kvd_mem_calloc(KVD_MEM_STAGING, f->n + 1, 1);
    kvd_loc_t *locs = kvd_mem_calloc(KVD_MEM_STAGING, f->n + 1, sizeof(*locs));
    if (fr != NULL && puts && src && results && locs) {
        size_t d = 0;
        for (size_t i = 0; i < f->n; i++) {
            if (fr->present[i] != KVD_FETCH_HERE)
                continue;
            const uint8_t *key = j->keys[f->at[i]];
            /* the chain: the key before it in the Acquire, when the holder
             * says it is one deeper */
            const uint8_t *parent = i > 0 && fr->present[i - 1] == KVD_FETCH_HERE &&
                                            d > 0 &&
                                            fr->depths[d] == fr->depths[d - 1] + 1
                                        ? j->keys[f->at[i - 1]]
                                        : NULL;
            puts[n_in] =
                (kvd_put_t){.key = key, .parent = parent, .depth = fr->depths[d]};
            src[n_in++] = d++;
        }
    }
    if (n_in > 0) {
        uint64_t lease = 0;
        int rc = kvd_store_reserve(r->store, OWNER_REMOTE, j->ns, puts, n_in,
                                   kvd_now_ns() / 1000000, &lease, results, locs);
        size_t n_pub = 0;
        kvd_key_t *pub =
            rc == KVD_OK ? kvd_mem_calloc(KVD_MEM_STAGING, n_in, sizeof(*pub)) : NULL;
        for (size_t k = 0; k < n_in; k++) {
            if (rc != KVD_OK || results[k] != KVD_RESERVE_ALLOCATED || pub == NULL ||
                locs[k].size < j->object_bytes)
                continue;
            memcpy(r->pool + locs[k].offset, fr->data + src[k] * j->object_bytes,
                   j->object_bytes);
            memcpy(pub[n_pub++], puts[k].key, KVD_KEY_BYTES);
        }
        if (lease != 0 && n_pub > 0 &&
            kvd_store_publish(r->store, OWNER_REMOTE, lease,
                              (const uint8_t(*)[KVD_KEY_BYTES])pub, n_pub) == KVD_OK) {
            r->st.fetched += n_pub;
            r->st.fetched_bytes += n_pub * j->object_bytes;
        }
        if (lease != 0) /* what was not published (EXISTS needs nothing) */
            kvd_store_revoke(r->store, OWNER_REMOTE, lease, NULL, 0);
        if (pub != NULL)
            kvd_mem_free(KVD_MEM_STAGING, pub, n_in * sizeof(*pub));
    }
    keys_settle(j, f->at, f->n, fr, f->node);
    kvd_mem_free(KVD_MEM_STAGING, puts, (f->n + 1) * sizeof(*puts));
    kvd_mem_free(KVD_MEM_STAGING, src, (f->n + 1) * sizeof(*src));
    kvd_mem_free(KVD_MEM_STAGING, results, f->n + 1);
    kvd_mem_free(KVD_MEM_STAGING, locs, (f->n + 1) * sizeof(*locs));
    kvd_mem_free(KVD_MEM_STAGING, f->at, f->n * sizeof(size_t));
    kvd_mem_free(KVD_MEM_STAGING, f, sizeof(*f));
    job_put(j);
}

/* Sends keys at[0..n) of j to holder node. */
static void send_fetch(job_t *j, const char *node, const size_t *at, size_t n)
{
    kvd_remote_t *r = j->r;
    const char *addr = kvd_dirsvc_address(r->dir, node);
    fetch_t *f = kvd_mem_calloc(KVD_MEM_STAGING, 1, sizeof(*f));
    size_t *fat = kvd_mem_calloc(KVD_MEM_STAGING, n, sizeof(size_t));
    kvd_msg_t req = {0};
    kvd_msg_request(&req, 0, KVD_METHOD_FETCH);
    kvd_fetch_req_t *fq = &req.body.fetch_req;
    fq->keys = kvd_msg_alloc(&req, n * sizeof(kvd_key_t));
    if (addr == NULL || f == NULL || fat == NULL || fq->keys == NULL) {
        for (size_t i = 0; i < n; i++)
            key_done(r, j->ns, j->keys[at[i]], false);
        kvd_msg_clear(&req);
        kvd_mem_free(KVD_MEM_STAGING, f, sizeof(*f));
        kvd_mem_free(KVD_MEM_STAGING, fat, n * sizeof(size_t));
        return;
    }
    kvd_strlcpy(fq->tenant, j->tenant, sizeof(fq->tenant));
    kvd_strlcpy(fq->ns_name, j->ns_name, sizeof(fq->ns_name));
    for (size_t i = 0; i < n; i++) {
        memcpy(fq->keys[i], j->keys[at[i]], KVD_KEY_BYTES);
        fat[i] = at[i];
    }
    fq->n = n;
    *f = (fetch_t){.job = j, .n = n, .at = fat};
    kvd_strlcpy(f->node, node, sizeof(f->node));
    j->refs++;
    r->st.fetches++;
    kvd_peers_send(r->peers, node, addr, &req, on_fetch, f);
}

/* One read over UCX: its keys (at, into the job's), the local reservations
 * the bytes land in, the holder (for the fallback to the RPC). */
typedef struct readop {
    job_t *job;
    char node[KVD_NODE_ID_BYTES];
    size_t n;
    size_t *at;
    uint64_t lease;
    uint8_t *results; /* kvd_reserve_result_t per key */
} readop_t;

static void readop_free(readop_t *op)
{
    kvd_mem_free(KVD_MEM_STAGING, op->at, op->n * sizeof(size_t));
    kvd_mem_free(KVD_MEM_STAGING, op->results, op->n + 1);
    kvd_mem_free(KVD_MEM_STAGING, op, sizeof(*op));
}

/* A read's end: publishes what arrived, revokes the rest; a holder without
 * UCX gets the RPC instead. */
static void on_read(void *arg, int status, kvd_msg_t *rep)
{
    readop_t *op = arg;
    job_t *j = op->job;
    kvd_remote_t *r = j->r;
    if (status == KVD_ERR_UNSUPPORTED) {
        if (op->lease != 0)
            kvd_store_revoke(r->store, OWNER_REMOTE, op->lease, NULL, 0);
        send_fetch(j, op->node, op->at, op->n);
        readop_free(op);
        job_put(j);
        return;
    }
    const kvd_fetch_rep_t *fr =
        status == KVD_OK && rep->status == KVD_OK && rep->body.fetch_rep.n == op->n
            ? &rep->body.fetch_rep
            : NULL;
    if (fr == NULL)
        KVD_WARN("cluster", "a read of %zu objects from %s over UCX failed: %s%s%s",
                 op->n, op->node, kvd_status_str(status == KVD_OK ? rep->status : status),
                 status == KVD_OK && rep->error[0] ? ": " : "",
                 status == KVD_OK ? rep->error : "");
    kvd_key_t *pub = kvd_mem_calloc(KVD_MEM_STAGING, op->n + 1, sizeof(*pub));
    size_t n_pub = 0;
    for (size_t i = 0; fr != NULL && pub != NULL && i < op->n; i++)
        if (op->results[i] == KVD_RESERVE_ALLOCATED && fr->present[i] == KVD_FETCH_HERE)
            memcpy(pub[n_pub++], j->keys[op->at[i]], KVD_KEY_BYTES);
    if (n_pub > 0 &&
        kvd_store_publish(r->store, OWNER_REMOTE, op->lease,
                          (const uint8_t(*)[KVD_KEY_BYTES])pub, n_pub) == KVD_OK) {
        r->st.fetched += n_pub;
        r->st.fetched_bytes += n_pub * j->object_bytes;
        r->st.fetched_ucx += n_pub;
    }
    if (op->lease != 0)
        kvd_store_revoke(r->store, OWNER_REMOTE, op->lease, NULL, 0);
    kvd_mem_free(KVD_MEM_STAGING, pub, (op->n + 1) * sizeof(*pub));
    keys_settle(j, op->at, op->n, fr, op->node);
    readop_free(op);
    job_put(j);
}

/* Reads keys at[0..n) of j from holder node over UCX: their room
 * reserved here first (the chain as the Acquire orders it: each key the
 * parent of the next), then the holder pins them and their bytes land in
 * it. */
static void send_read(job_t *j, const char *node, const size_t *at, size_t n)
{
    kvd_remote_t *r = j->r;
    const char *addr = kvd_dirsvc_address(r->dir, node);
    readop_t *op = kvd_mem_calloc(KVD_MEM_STAGING, 1, sizeof(*op));
    kvd_put_t *puts = kvd_mem_calloc(KVD_MEM_STAGING, n + 1, sizeof(*puts));
    kvd_loc_t *locs = kvd_mem_calloc(KVD_MEM_STAGING, n + 1, sizeof(*locs));
    uint64_t *local = kvd_mem_calloc(KVD_MEM_STAGING, n + 1, sizeof(*local));
    kvd_msg_t req = {0};
    kvd_msg_request(&req, 0, KVD_METHOD_FETCH);
    kvd_fetch_req_t *fq = &req.body.fetch_req;
    fq->keys = kvd_msg_alloc(&req, n * sizeof(kvd_key_t) + 1);
    bool ok = addr && op && puts && locs && local && fq->keys;
    if (ok) {
        op->at = kvd_mem_calloc(KVD_MEM_STAGING, n, sizeof(size_t));
        op->results = kvd_mem_calloc(KVD_MEM_STAGING, n + 1, 1);
        op->n = n; /* the size both were allocated with, for readop_free */
        ok = op->at && op->results;
    }
    int rc = KVD_ERR_NOMEM;
    if (ok) {
        op->job = j;
        kvd_strlcpy(op->node, node, sizeof(op->node));
        for (size_t i = 0; i < n; i++) {
            op->at[i] = at[i];
            puts[i] = (kvd_put_t){
                .key = j->keys[at[i]],
                .parent = i > 0 && at[i] == at[i - 1] + 1 ? j->keys[at[i - 1]] : NULL,
                .depth = (uint32_t)at[i]};
            memcpy(fq->keys[i], j->keys[at[i]], KVD_KEY_BYTES);
        }
        rc = kvd_store_reserve(r->store, OWNER_REMOTE, j->ns, puts, n,
                               kvd_now_ns() / 1000000, &op->lease, op->results, locs);
    }
    size_t wanted = 0;
    for (size_t i = 0; rc == KVD_OK && i < n; i++) {
        bool mine =
            op->results[i] == KVD_RESERVE_ALLOCATED && locs[i].size >= j->object_bytes;
        local[i] = mine ? locs[i].offset : UINT64_MAX;
        wanted += mine;
    }
    if (rc == KVD_OK && wanted > 0) {
        kvd_strlcpy(fq->tenant, j->tenant, sizeof(fq->tenant));
        kvd_strlcpy(fq->ns_name, j->ns_name, sizeof(fq->ns_name));
        fq->n = n;
        fq->pin = true;
        j->refs++;
        r->st.fetches++;
        rc = kvd_peers_read(r->peers, node, addr, &req, local, n, j->object_bytes,
                            on_read, op);
        if (rc != KVD_OK) { /* not queued: the job is not in flight */
            j->refs--;
            if (op->lease != 0)
                kvd_store_revoke(r->store, OWNER_REMOTE, op->lease, NULL, 0);
        } else {
            op = NULL; /* on_read's */
        }
    }
    if (op != NULL) {
        /* nothing in flight: what is here is here, the rest failed */
        keys_settle(j, at, n, NULL, NULL);
        readop_free(op);
    }
    kvd_msg_clear(&req);
    kvd_mem_free(KVD_MEM_STAGING, puts, (n + 1) * sizeof(*puts));
    kvd_mem_free(KVD_MEM_STAGING, locs, (n + 1) * sizeof(*locs));
    kvd_mem_free(KVD_MEM_STAGING, local, (n + 1) * sizeof(*local));
}

/* The directory's answer: the keys grouped by a holder each, fetched. */
static void on_holders(void *arg, kvd_msg_t *rep)
{
    job_t *j = arg;
    kvd_remote_t *r = j->r;
    const kvd_dir_lookup_rep_t *d =
        rep->status == KVD_OK && rep->body.dir_lookup_rep.n == 1
            ? &rep->body.dir_lookup_rep
            : NULL;
    /* over UCX a request carries only keys and answers offsets: a batch's
     * worth at a time; over the RPC a frame's worth of bytes */
    size_t per_frame = r->ucx ? READ_KEYS_MAX
                       : j->object_bytes + FRAME_SLACK <= r->max_frame
                           ? (r->max_frame - FRAME_SLACK) / j->object_bytes
                           : 0;
    size_t *at = kvd_mem_calloc(KVD_MEM_STAGING, j->n + 1, sizeof(size_t));
    bool *done = kvd_mem_calloc(KVD_MEM_STAGING, j->n + 1, sizeof(bool));
    for (size_t i = 0; i < j->n; i++) {
        if (done != NULL && done[i])
            continue;
        /* the holder of key i: the first one named that is not this daemon */
        int holder = -1;
        uint64_t bits = d && i < d->n_holders[0] ? d->holders[0][i] : 0;
        for (size_t b = 0; bits && b < d->n_nodes; b++) /* bits: d is set */
            if (bits >> b & 1 && kvd_dirsvc_other_live(r->dir, d->nodes[b])) {
                holder = (int)b;
                break;
            }
        if (holder < 0 || per_frame == 0 || at == NULL || done == NULL) {
            key_done(r, j->ns, j->keys[i], false);
            continue;
        }
        /* every later key the same holder has, up to a frame's worth */
        size_t n = 0;
        for (size_t k = i; k < j->n && n < per_frame; k++) {
            uint64_t kb = k < d->n_holders[0] ? d->holders[0][k] : 0;
            if (!done[k] && kb >> holder & 1) {
                at[n++] = k;
                done[k] = true;
            }
        }
        if (r->ucx)
            send_read(j, d->nodes[holder], at, n);
        else
            send_fetch(j, d->nodes[holder], at, n);
    }
    kvd_mem_free(KVD_MEM_STAGING, at, (j->n + 1) * sizeof(size_t));
    kvd_mem_free(KVD_MEM_STAGING, done, (j->n + 1) * sizeof(bool));
    job_put(j); /* the set-up's reference */
}

int kvd_remote_want(kvd_remote_t *r, uint32_t ns, const kvd_key_t *keys, size_t n,
                    uint64_t now_ms)
{
    kvd_ns_info_t info;
    if (kvd_store_ns_info(r->store, ns, &info) != KVD_OK)
        return KVD_ERR_NOT_FOUND;
    const char *tenant = kvd_store_tenant_name(r->store, info.tenant);
    bool busy = false, missing = false;
    job_t *j = NULL;
    for (size_t i = 0; i < n; i++) {
        slot_t *s = slot_find(r, ns, keys[i]);
        if (s != NULL && s->state == SLOT_BUSY) {
            busy = true; /* ours, on its way (its room reserved here already) */
            continue;
        }
        kvd_obj_info_t o;
        if (kvd_store_inspect(r->store, ns, keys[i], &o) == KVD_OK)
            continue; /* here (or being written here by a worker) */
        missing = true;
        if (s != NULL && s->state != SLOT_BUSY && s->until_ms <= now_ms) {
            slot_del(r, s); /* a failure forgotten, or a retry due: asked anew */
            s = NULL;
        }
        if (s != NULL) {
            busy |= s->state != SLOT_FAILED;
            continue;
        }
        if (j == NULL) {
            j = kvd_mem_calloc(KVD_MEM_STAGING, 1, sizeof(*j));
            kvd_key_t *k = kvd_mem_calloc(KVD_MEM_STAGING, n, sizeof(kvd_key_t));
            if (j == NULL || k == NULL) {
                kvd_mem_free(KVD_MEM_STAGING, j, sizeof(*j));
                kvd_mem_free(KVD_MEM_STAGING, k, n * sizeof(kvd_key_t));
                return busy ? KVD_INPROGRESS : KVD_ERR_NOT_FOUND;
            }
            *j = (job_t){.r = r,
                         .ns = ns,
                         .object_bytes = info.object_bytes,
                         .keys = k,
                         .refs = 1};
            kvd_strlcpy(j->tenant, tenant ? tenant : "", sizeof(j->tenant));
            kvd_strlcpy(j->ns_name, info.name, sizeof(j->ns_name));
        }
        if (slot_add(r, ns, keys[i]) == NULL)
            continue; /* the table is full: this key is not fetched */
        memcpy(j->keys[j->n++], keys[i], KVD_KEY_BYTES);
        busy = true;
    }
    if (j != NULL && j->n == 0) {
        job_put(j);
        j = NULL;
    }
    if (j != NULL) {
        kvd_dir_keys_t q = {.n_added = j->n, .added = j->keys};
        kvd_strlcpy(q.tenant, j->tenant, sizeof(q.tenant));
        kvd_strlcpy(q.ns_name, j->ns_name, sizeof(q.ns_name));
        kvd_dir_lookup_req_t dq = {.n = 1, .queries = &q};
        if (kvd_dirsvc_route(r->dir, &dq, true, on_holders, j) != KVD_OK) {
            for (size_t i = 0; i < j->n; i++)
                key_done(r, ns, j->keys[i], false);
            job_put(j);
            return KVD_ERR_NOT_FOUND;
        }
    }
    if (busy)
        return KVD_INPROGRESS;
    return missing ? KVD_ERR_NOT_FOUND : KVD_OK;
}

/* ------------------------------------------------------------- holder */

/* A Fetch with pin: the present keys (f->present, o their info) pinned
 * under one lease of owner, their offsets answered. A pin refused (a key
 * evicted meanwhile cannot be: the loop runs this whole; the quota of
 * pins, memory can) answers those keys "ask again", never absent: the
 * asker would take this member for one without them. */
static void pin_present(kvd_remote_t *r, uint64_t owner, uint32_t ns,
                        const kvd_fetch_req_t *q, kvd_fetch_rep_t *f,
                        const kvd_obj_info_t *o, size_t want, uint64_t object_bytes,
                        kvd_msg_t *rep, const kvd_msg_t *req)
{
    size_t cap = want + 1; /* as allocated: want may drop to 0 below */
    kvd_key_t *keys = kvd_mem_calloc(KVD_MEM_STAGING, cap, sizeof(kvd_key_t));
    kvd_loc_t *locs = kvd_mem_calloc(KVD_MEM_STAGING, cap, sizeof(kvd_loc_t));
    f->offsets = kvd_msg_alloc(rep, want * sizeof(uint64_t) + 1);
    f->depths = kvd_msg_alloc(rep, want * sizeof(uint32_t) + 1);
    if (keys == NULL || locs == NULL || f->offsets == NULL || f->depths == NULL) {
        kvd_mem_free(KVD_MEM_STAGING, keys, cap * sizeof(kvd_key_t));
        kvd_mem_free(KVD_MEM_STAGING, locs, cap * sizeof(kvd_loc_t));
        kvd_msg_clear(rep); /* what the reply held so far */
        kvd_msg_error(rep, req->id, req->method, KVD_ERR_NOMEM, "out of memory");
        return;
    }
    size_t k = 0;
    for (size_t i = 0; i < q->n; i++)
        if (f->present[i] == KVD_FETCH_HERE)
            memcpy(keys[k++], q->keys[i], KVD_KEY_BYTES);
    uint64_t lease = 0;
    size_t bad = 0;
    int rc = want == 0 ? KVD_OK
                       : kvd_store_acquire(r->store, owner, ns,
                                           (const uint8_t(*)[KVD_KEY_BYTES])keys, want,
                                           kvd_now_ns() / 1000000, &lease, locs, &bad);
    f->n = q->n;
    f->object_bytes = object_bytes;
    if (rc != KVD_OK) {
        for (size_t i = 0; i < q->n; i++)
            if (f->present[i] == KVD_FETCH_HERE)
                f->present[i] = KVD_FETCH_PROMOTING;
        want = 0;
    }
    for (size_t i = 0, d = 0; i < q->n && want > 0; i++) {
        if (f->present[i] != KVD_FETCH_HERE)
            continue;
        f->offsets[d] = locs[d].offset;
        f->depths[d] = o[i].depth;
        d++;
    }
    f->lease_id = lease;
    f->n_offsets = want;
    f->n_depths = want;
    r->st.served += want;
    r->st.served_bytes += want * object_bytes;
    kvd_mem_free(KVD_MEM_STAGING, keys, cap * sizeof(kvd_key_t));
    kvd_mem_free(KVD_MEM_STAGING, locs, cap * sizeof(kvd_loc_t));
}

void kvd_remote_use_ucx(kvd_remote_t *r, bool on)
{
    r->ucx = on;
}

void kvd_remote_serve_fetch(kvd_remote_t *r, uint64_t owner, const kvd_msg_t *req,
                            kvd_msg_t *rep)
{
    const kvd_fetch_req_t *q = &req->body.fetch_req;
    kvd_fetch_rep_t *f = &rep->body.fetch_rep;
    uint32_t tenant, ns;
    kvd_ns_info_t info;
    if (kvd_store_tenant_find(r->store, q->tenant, &tenant) != KVD_OK ||
        kvd_store_ns_find(r->store, tenant, q->ns_name, &ns) != KVD_OK ||
        kvd_store_ns_info(r->store, ns, &info) != KVD_OK) {
        /* nothing of that namespace here: every key absent */
        f->present = kvd_msg_alloc(rep, q->n + 1);
        f->n = q->n;
        f->object_bytes = 1;
        if (f->present == NULL) {
            kvd_msg_clear(rep); /* what the reply held so far */
            kvd_msg_error(rep, req->id, req->method, KVD_ERR_NOMEM, "out of memory");
        }
        return;
    }
    /* the bytes of the reply bound how many it answers; a pin sends none */
    size_t room = q->pin ? q->n
                  : r->max_frame > FRAME_SLACK + info.object_bytes
                      ? (r->max_frame - FRAME_SLACK) / info.object_bytes
                      : 0;
    size_t want = 0;
    kvd_obj_info_t *o = kvd_mem_calloc(KVD_MEM_STAGING, q->n + 1, sizeof(*o));
    f->present = kvd_msg_alloc(rep, q->n + 1);
    if (o == NULL || f->present == NULL) {
        kvd_mem_free(KVD_MEM_STAGING, o, (q->n + 1) * sizeof(*o));
        kvd_msg_clear(rep); /* what the reply held so far */
        kvd_msg_error(rep, req->id, req->method, KVD_ERR_NOMEM, "out of memory");
        return;
    }
    uint64_t now_ms = kvd_now_ns() / 1000000;
    size_t i = 0;
    for (; i < q->n && want < room; i++) {
        if (kvd_store_inspect(r->store, ns, q->keys[i], &o[i]) != KVD_OK ||
            o[i].state != KVD_OBJ_READY) {
            /* a stale directory entry (or one being written): tell the
             * owner again that it is not here */
            kvd_dirsvc_not_here(r->dir, q->tenant, q->ns_name, q->keys[i]);
            continue;
        }
        if (o[i].tier != KVD_TIER_DRAM) {
            /* on the SSD tier: an Acquire starts its promotion; the asker
             * asks again */
            uint64_t lease = 0;
            kvd_loc_t loc;
            size_t bad;
            if (kvd_store_acquire(r->store, OWNER_REMOTE, ns,
                                  (const uint8_t(*)[KVD_KEY_BYTES])q->keys[i], 1, now_ms,
                                  &lease, &loc, &bad) == KVD_OK)
                kvd_store_release(r->store, OWNER_REMOTE, lease);
            f->present[i] = KVD_FETCH_PROMOTING;
            continue;
        }
        if (o[i].loc.size >= info.object_bytes) {
            f->present[i] = KVD_FETCH_HERE;
            want++;
        }
    }
    /* past what the reply carries: not looked at, so not said absent */
    for (; room > 0 && i < q->n; i++)
        f->present[i] = KVD_FETCH_PROMOTING;
    if (q->pin) {
        pin_present(r, owner, ns, q, f, o, want, info.object_bytes, rep, req);
        kvd_mem_free(KVD_MEM_STAGING, o, (q->n + 1) * sizeof(*o));
        return;
    }
    uint8_t *data = kvd_msg_alloc(rep, want * info.object_bytes + 1);
    f->depths = kvd_msg_alloc(rep, want * sizeof(uint32_t) + 1);
    if (data == NULL || f->depths == NULL) {
        kvd_mem_free(KVD_MEM_STAGING, o, (q->n + 1) * sizeof(*o));
        kvd_msg_clear(rep); /* what the reply held so far */
        kvd_msg_error(rep, req->id, req->method, KVD_ERR_NOMEM, "out of memory");
        return;
    }
    size_t d = 0;
    for (size_t i = 0; i < q->n; i++) {
        if (f->present[i] != KVD_FETCH_HERE)
            continue;
        memcpy(data + d * info.object_bytes, r->pool + o[i].loc.offset,
               info.object_bytes);
        f->depths[d++] = o[i].depth;
    }
    kvd_mem_free(KVD_MEM_STAGING, o, (q->n + 1) * sizeof(*o));
    f->n = q->n;
    f->object_bytes = info.object_bytes;
    f->data = data;
    f->data_len = want * info.object_bytes;
    f->n_depths = want;
    r->st.served += want;
    r->st.served_bytes += want * info.object_bytes;
}

/* ------------------------------------------------------------- lifecycle */

int kvd_remote_create(kvd_store_t *store, uint8_t *pool_base, kvd_dirsvc_t *dir,
                      kvd_peers_t *peers, size_t max_frame, kvd_remote_t **out)
{
    kvd_remote_t *r = kvd_mem_calloc(KVD_MEM_INDEX, 1, sizeof(*r));
    if (r == NULL)
        return KVD_ERR_NOMEM;
    r->slots = kvd_mem_calloc(KVD_MEM_INDEX, KVD_REMOTE_SLOTS, sizeof(*r->slots));
    if (r->slots == NULL) {
        kvd_mem_free(KVD_MEM_INDEX, r, sizeof(*r));
        return KVD_ERR_NOMEM;
    }
    if (getrandom(&r->seed, sizeof(r->seed), 0) != sizeof(r->seed))
        r->seed = kvd_now_ns() * 0x9e3779b97f4a7c15ull;
    r->store = store;
    r->pool = pool_base;
    r->dir = dir;
    r->peers = peers;
    r->max_frame = max_frame;
    *out = r;
    return KVD_OK;
}

void kvd_remote_destroy(kvd_remote_t *r)
{
    if (r == NULL)
        return;
    kvd_mem_free(KVD_MEM_INDEX, r->slots, KVD_REMOTE_SLOTS * sizeof(*r->slots));
    kvd_mem_free(KVD_MEM_INDEX, r, sizeof(*r));
}

void kvd_remote_stats(const kvd_remote_t *r, kvd_remote_stats_t *out)
{
    *out = r->st;
}
