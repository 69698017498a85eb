/*
 * Description: long random sequences of store engine operations (reserve,
 * publish and revoke of all or some keys, acquire, release, owner gone,
 * expire, evict_key, evict_ns, lookup) by several owners over 2-3
 * namespaces of different object sizes and a small key space (so that keys
 * collide), checked after every step against a reference model written
 * here from the contracts of kvd_store.h and DESIGN.md section 4.
 *
 * The model is a plain table: per (namespace, key) its state (absent,
 * WRITING, READY), pin count and location; and the list of leases with what
 * each holds. The one freedom the store has: it may evict READY unpinned
 * objects during a reserve. The model accepts that, and only that: an
 * object the store no longer has must have been READY and unpinned, and
 * only a reserve (or an explicit evict) may remove it.
 *
 * After every step: kvd_store_check is OK; every key agrees (state, pins,
 * location); the stats agree (pins, objects, bytes, leases); no two live
 * objects overlap. At the end, with every owner gone: pins = 0,
 * writing = 0, leases = 0, free + ready = pool.
 *
 * Fixed seeds, bounded steps; a failure prints the seed, step and op.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvd_store.h"

#define PAGE        4096u
#define POOL_PGS    64u /* at most; 2-namespace runs use 40 */
#define N_KEYS      24u
#define MAX_NS      3u
#define N_OWNERS    3u
#define MAX_BATCH   4u
#define MAX_HOLDS   8u
#define MAX_LEASES  512u
#define TTL_MS      4000u
#define STEPS       20000u
#define RESERVE_PCT 18u

/* ------------------------------------------------------------ the model */

enum { M_ABSENT = 0 };

typedef struct mobj {
    uint8_t state; /* M_ABSENT, KVD_OBJ_WRITING, KVD_OBJ_READY */
    uint32_t pins;
    uint64_t off; /* bytes, while present */
} mobj_t;

typedef struct mlease {
    uint64_t id, owner, expires_ms;
    bool write;
    uint32_t ns;
    uint32_t n;
    uint32_t key[MAX_HOLDS];
    bool live[MAX_HOLDS];
} mlease_t;

typedef struct model {
    kvd_store_t *s;
    uint32_t n_ns;
    uint32_t pool_pgs;
    uint32_t ns_id[MAX_NS];
    uint64_t obj_bytes[MAX_NS];
    uint32_t obj_pages[MAX_NS];
    mobj_t obj[MAX_NS][N_KEYS];
    mlease_t leases[MAX_LEASES];
    uint32_t n_leases;
    uint64_t now_ms; /* even; expire() probes at now_ms + 1 */
    uint64_t rng;
    /* diagnostics */
    uint64_t seed;
    uint32_t step;
    const char *op;
    /* what happened, for the summary */
    uint64_t evictions_seen, no_space_seen;
} model_t;

static model_t M;

#define REQUIRE(c)                                                               \
    do {                                                                         \
        if (!(c)) {                                                              \
            print_error("seed %llu step %u op %s: %s (line %d)\n",               \
                        (unsigned long long)M.seed, M.step, M.op, #c, __LINE__); \
            fail();                                                              \
        }                                                                        \
    } while (0)

static uint64_t rnd(void)
{
    uint64_t x = M.rng;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    M.rng = x;
    return x * 0x2545f4914f6cdd1dull;
}

static uint32_t rnd_below(uint32_t n)
{
    return (uint32_t)(rnd() % n);
}

static void mkkey(uint8_t key[KVD_KEY_BYTES], uint32_t k)
{
    memset(key, 0, KVD_KEY_BYTES);
    memcpy(key, &k, sizeof(k));
}

static mlease_t *lease_of(uint64_t id)
{
    for (uint32_t i = 0; i < M.n_leases; i++)
        if (M.leases[i].id == id)
            return &M.leases[i];
    return NULL;
}

static void lease_drop(mlease_t *l)
{
    *l = M.leases[--M.n_leases];
}

static bool lease_empty(const mlease_t *l)
{
    for (uint32_t i = 0; i < l->n; i++)
        if (l->live[i])
            return false;
    return true;
}

/* Ends a lease as the store must: reservations freed, pins released. */
static void lease_end(mlease_t *l)
{
    for (uint32_t i = 0; i < l->n; i++) {
        if (!l->live[i])
            continue;
        mobj_t *o = &M.obj[l->ns][l->key[i]];
        if (l->write) {
            REQUIRE(o->state == KVD_OBJ_WRITING);
            o->state = M_ABSENT;
        } else {
            REQUIRE(o->state == KVD_OBJ_READY && o->pins > 0);
            o->pins--;
        }
    }
    lease_drop(l);
}

static mlease_t *random_lease(bool write)
{
    uint32_t cand[MAX_LEASES], n = 0;
    for (uint32_t i = 0; i < M.n_leases; i++)
        if (M.leases[i].write == write)
            cand[n++] = i;
    return n ? &M.leases[cand[rnd_below(n)]] : NULL;
}

static uint64_t other_owner(uint64_t owner)
{
    return owner % N_OWNERS + 1;
}

/* ------------------------------------------------------- verification */

static bool store_has(uint32_t n, uint32_t k, kvd_obj_info_t *info)
{
    uint8_t key[KVD_KEY_BYTES];
    mkkey(key, k);
    return kvd_store_inspect(M.s, M.ns_id[n], key, info) == KVD_OK;
}

/* Accepts the evictions the store may have made: READY unpinned objects
 * only. Returns how many. */
static uint64_t sync_evictions(void)
{
    uint64_t n_ev = 0;
    for (uint32_t n = 0; n < M.n_ns; n++)
        for (uint32_t k = 0; k < N_KEYS; k++) {
            mobj_t *o = &M.obj[n][k];
            kvd_obj_info_t info;
            if (o->state == KVD_OBJ_READY && o->pins == 0 && !store_has(n, k, &info)) {
                o->state = M_ABSENT;
                n_ev++;
            }
        }
    return n_ev;
}

static void verify(void)
{
    char why[256] = "";
    int rc = kvd_store_check(M.s, why, sizeof(why));
    if (rc != KVD_OK)
        print_error("kvd_store_check: %s\n", why);
    REQUIRE(rc == KVD_OK);

    uint64_t pins = 0, ready = 0, writing = 0, pinned = 0, ready_b = 0, writing_b = 0,
             pinned_b = 0;
    uint8_t used[POOL_PGS] = {0};
    for (uint32_t n = 0; n < M.n_ns; n++) {
        uint64_t nr = 0, nw = 0, np = 0;
        for (uint32_t k = 0; k < N_KEYS; k++) {
            const mobj_t *o = &M.obj[n][k];
            kvd_obj_info_t info;
            bool has = store_has(n, k, &info);
            if (o->state == M_ABSENT) {
                if (has)
                    print_error("ns %u key %u: store has it (state %d), model not\n", n,
                                k, info.state);
                REQUIRE(!has);
                continue;
            }
            if (!has)
                print_error("ns %u key %u: model %s pins %u, store absent\n", n, k,
                            o->state == KVD_OBJ_READY ? "READY" : "WRITING", o->pins);
            REQUIRE(has);
            REQUIRE(info.state == o->state);
            REQUIRE(info.pins == o->pins);
            REQUIRE(info.loc.offset == o->off);
            REQUIRE(info.loc.size == M.obj_bytes[n]);
            REQUIRE(info.ns == M.ns_id[n]);
            uint64_t first = o->off / PAGE;
            for (uint64_t p = first; p < first + M.obj_pages[n]; p++) {
                REQUIRE(p < M.pool_pgs);
                REQUIRE(!used[p]); /* two live objects overlap */
                used[p] = 1;
            }
            pins += o->pins;
            if (o->state == KVD_OBJ_READY) {
                nr++;
                ready_b += (uint64_t)M.obj_pages[n] * PAGE;
                if (o->pins) {
                    np++;
                    pinned_b += (uint64_t)M.obj_pages[n] * PAGE;
                }
            } else {
                nw++;
                writing_b += (uint64_t)M.obj_pages[n] * PAGE;
            }
        }
        kvd_ns_info_t ni;
        REQUIRE(kvd_store_ns_info(M.s, M.ns_id[n], &ni) == KVD_OK);
        REQUIRE(ni.objects_ready == nr);
        REQUIRE(ni.objects_writing == nw);
        REQUIRE(ni.objects_pinned == np);
        ready += nr;
        writing += nw;
        pinned += np;
    }
    kvd_store_stats_t st;
    kvd_store_stats(M.s, &st);
    REQUIRE(st.pins == pins);
    REQUIRE(st.objects_ready == ready);
    REQUIRE(st.objects_writing == writing);
    REQUIRE(st.objects_pinned == pinned);
    REQUIRE(st.ready_bytes == ready_b);
    REQUIRE(st.writing_bytes == writing_b);
    REQUIRE(st.pinned_bytes == pinned_b);
    REQUIRE(st.leases == M.n_leases);
    REQUIRE(st.free_bytes + st.writing_bytes + st.ready_bytes + st.quarantined_bytes ==
            st.pool_bytes);
    REQUIRE(st.pool_bytes == (uint64_t)M.pool_pgs * PAGE);
}

/* ------------------------------------------------------------ the ops */

static void op_reserve(double evict_high)
{
    M.op = "reserve";
    uint64_t owner = 1 + rnd_below(N_OWNERS);
    uint32_t n = rnd_below(M.n_ns), cnt = 1 + rnd_below(MAX_BATCH);
    uint32_t k[MAX_BATCH];
    uint8_t keys[MAX_BATCH][KVD_KEY_BYTES], parents[MAX_BATCH][KVD_KEY_BYTES];
    kvd_put_t items[MAX_BATCH];
    for (uint32_t i = 0; i < cnt; i++) {
        k[i] = rnd_below(N_KEYS);
        mkkey(keys[i], k[i]);
        uint32_t depth = k[i] % 6;
        if (depth)
            mkkey(parents[i], k[i] - 1);
        items[i] = (kvd_put_t){
            .key = keys[i], .parent = depth ? parents[i] : NULL, .depth = depth};
    }
    kvd_store_stats_t before;
    kvd_store_stats(M.s, &before);
    uint8_t res[MAX_BATCH];
    kvd_loc_t locs[MAX_BATCH];
    uint64_t lease = 12345;
    REQUIRE(kvd_store_reserve(M.s, owner, M.ns_id[n], items, cnt, M.now_ms, &lease, res,
                              locs) == KVD_OK);

    mlease_t nl = {
        .owner = owner, .write = true, .ns = n, .expires_ms = M.now_ms + TTL_MS};
    uint64_t ev = 0;
    bool no_space = false;
    for (uint32_t i = 0; i < cnt; i++) {
        mobj_t *o = &M.obj[n][k[i]];
        if (o->state == KVD_OBJ_READY && o->pins == 0 && res[i] != KVD_RESERVE_EXISTS) {
            /* evicted to make room for an earlier key of this batch: now
             * absent, it is allocated again or finds no room */
            o->state = M_ABSENT;
            ev++;
        }
        switch (o->state) {
        case KVD_OBJ_WRITING: REQUIRE(res[i] == KVD_RESERVE_IN_FLIGHT); break;
        case KVD_OBJ_READY: REQUIRE(res[i] == KVD_RESERVE_EXISTS); break;
        default:
            REQUIRE(res[i] == KVD_RESERVE_ALLOCATED || res[i] == KVD_RESERVE_NO_SPACE);
            if (res[i] == KVD_RESERVE_NO_SPACE) {
                no_space = true;
                break;
            }
            REQUIRE(!no_space); /* nothing was freed since there was no room */
            REQUIRE(locs[i].offset % PAGE == 0);
            REQUIRE(locs[i].size == M.obj_bytes[n]);
            REQUIRE(locs[i].offset + (uint64_t)M.obj_pages[n] * PAGE <=
                    (uint64_t)M.pool_pgs * PAGE);
            o->state = KVD_OBJ_WRITING;
            o->pins = 0;
            o->off = locs[i].offset;
            REQUIRE(nl.n < MAX_HOLDS);
            nl.key[nl.n] = k[i];
            nl.live[nl.n++] = true;
        }
    }
    if (nl.n == 0) {
        REQUIRE(lease == 0);
    } else {
        REQUIRE(lease != 0);
        REQUIRE(lease_of(lease) == NULL);
        nl.id = lease;
        REQUIRE(M.n_leases < MAX_LEASES);
        M.leases[M.n_leases++] = nl;
    }
    ev += sync_evictions();
    M.evictions_seen += ev;
    kvd_store_stats_t after;
    kvd_store_stats(M.s, &after);
    REQUIRE(after.evictions - before.evictions == ev);
    if (no_space) {
        M.no_space_seen++;
        /* no room: no free extent holds an object of this namespace, and
         * either everything evictable went, or even every evictable byte
         * beside the free ones is too few (eviction frees what it takes, so
         * this sum does not change with it), or the request spent its
         * eviction budget (kvd_store.h) */
        uint64_t need = (uint64_t)M.obj_pages[n] * PAGE;
        uint64_t evictable = after.ready_bytes - after.pinned_bytes;
        REQUIRE(after.largest_free_bytes < need);
        REQUIRE(after.objects_ready == after.objects_pinned ||
                after.free_bytes + evictable < need || ev >= 64);
    }
    /* above the high watermark only when nothing more can go */
    if ((double)(after.pool_bytes - after.free_bytes) >
        evict_high * (double)after.pool_bytes)
        REQUIRE(after.objects_ready == after.objects_pinned);
}

/* Publish (publish = true) or revoke. */
static void op_finish(bool publish)
{
    M.op = publish ? "publish" : "revoke";
    int (*fn)(kvd_store_t *, uint64_t, uint64_t, const uint8_t(*)[KVD_KEY_BYTES],
              size_t) = publish ? kvd_store_publish : kvd_store_revoke;
    uint32_t dice = rnd_below(100);
    mlease_t *l = random_lease(true);
    if (l == NULL || dice < 5) {
        /* an unknown lease, or a read lease */
        mlease_t *r = random_lease(false);
        if (r && dice % 2) {
            REQUIRE(fn(M.s, r->owner, r->id, NULL, 0) == KVD_ERR_STATE);
        } else {
            REQUIRE(fn(M.s, 1, 1ull << 40, NULL, 0) == KVD_ERR_NOT_FOUND);
        }
        return;
    }
    if (dice < 12) {
        REQUIRE(fn(M.s, other_owner(l->owner), l->id, NULL, 0) == KVD_ERR_NOT_FOUND);
        return;
    }
    if (dice < 50) { /* all */
        REQUIRE(fn(M.s, l->owner, l->id, NULL, 0) == KVD_OK);
        for (uint32_t i = 0; i < l->n; i++) {
            if (!l->live[i])
                continue;
            mobj_t *o = &M.obj[l->ns][l->key[i]];
            o->state = publish ? KVD_OBJ_READY : M_ABSENT;
            o->pins = 0;
            l->live[i] = false;
        }
        lease_drop(l);
        return;
    }
    /* some of the live holds, maybe one named twice, maybe a stranger */
    uint8_t keys[MAX_HOLDS + 2][KVD_KEY_BYTES];
    uint32_t kk[MAX_HOLDS + 2], cnt = 0;
    for (uint32_t i = 0; i < l->n; i++)
        if (l->live[i] && rnd_below(2))
            kk[cnt++] = l->key[i];
    if (cnt && rnd_below(8) == 0)
        kk[cnt++] = kk[0];
    bool stranger = rnd_below(8) == 0;
    if (stranger) {
        uint32_t s = rnd_below(N_KEYS);
        for (uint32_t i = 0; i < l->n; i++)
            if (l->live[i] && l->key[i] == s)
                stranger = false; /* it is one of the lease's after all */
        if (stranger)
            kk[cnt++] = s;
    }
    for (uint32_t i = 0; i < cnt; i++)
        mkkey(keys[i], kk[i]);
    int rc = fn(M.s, l->owner, l->id, (const uint8_t(*)[KVD_KEY_BYTES])keys, cnt);
    if (stranger) {
        REQUIRE(rc == KVD_ERR_STATE); /* and nothing changed: verify() */
        return;
    }
    REQUIRE(rc == KVD_OK);
    for (uint32_t j = 0; j < cnt; j++)
        for (uint32_t i = 0; i < l->n; i++)
            if (l->live[i] && l->key[i] == kk[j]) {
                mobj_t *o = &M.obj[l->ns][l->key[i]];
                o->state = publish ? KVD_OBJ_READY : M_ABSENT;
                o->pins = 0;
                l->live[i] = false;
            }
    if (lease_empty(l)) {
        REQUIRE(lease_of(l->id) == l);
        lease_drop(l);
    }
}

static void op_acquire(void)
{
    M.op = "acquire";
    uint64_t owner = 1 + rnd_below(N_OWNERS);
    uint32_t n = rnd_below(M.n_ns), cnt = 1 + rnd_below(5);
    uint8_t keys[5][KVD_KEY_BYTES];
    uint32_t k[5];
    for (uint32_t i = 0; i < cnt; i++) {
        /* mostly keys that exist, so that acquires succeed often */
        k[i] = rnd_below(N_KEYS);
        for (int t = 0; t < 12 && rnd_below(8) && M.obj[n][k[i]].state != KVD_OBJ_READY;
             t++)
            k[i] = rnd_below(N_KEYS);
        mkkey(keys[i], k[i]);
    }
    size_t bad_want = SIZE_MAX;
    int rc_want = KVD_OK;
    for (uint32_t i = 0; i < cnt && bad_want == SIZE_MAX; i++) {
        if (M.obj[n][k[i]].state == M_ABSENT) {
            bad_want = i;
            rc_want = KVD_ERR_NOT_FOUND;
        } else if (M.obj[n][k[i]].state == KVD_OBJ_WRITING) {
            bad_want = i;
            rc_want = KVD_ERR_BUSY;
        }
    }
    uint64_t lease = 0;
    size_t bad = 999;
    kvd_loc_t locs[5];
    int rc =
        kvd_store_acquire(M.s, owner, M.ns_id[n], (const uint8_t(*)[KVD_KEY_BYTES])keys,
                          cnt, M.now_ms, &lease, locs, &bad);
    REQUIRE(rc == rc_want);
    if (rc != KVD_OK) {
        REQUIRE(bad == bad_want);
        return;
    }
    REQUIRE(lease != 0 && lease_of(lease) == NULL);
    mlease_t nl = {.id = lease,
                   .owner = owner,
                   .write = false,
                   .ns = n,
                   .expires_ms = M.now_ms + TTL_MS,
                   .n = cnt};
    for (uint32_t i = 0; i < cnt; i++) {
        mobj_t *o = &M.obj[n][k[i]];
        REQUIRE(locs[i].offset == o->off);
        REQUIRE(locs[i].size == M.obj_bytes[n]);
        o->pins++;
        nl.key[i] = k[i];
        nl.live[i] = true;
    }
    REQUIRE(M.n_leases < MAX_LEASES);
    M.leases[M.n_leases++] = nl;
}

static void op_release(void)
{
    M.op = "release";
    uint32_t dice = rnd_below(100);
    mlease_t *l = random_lease(false);
    if (dice < 5 || (l == NULL && dice < 50)) {
        mlease_t *w = random_lease(true);
        if (w)
            REQUIRE(kvd_store_release(M.s, w->owner, w->id) == KVD_ERR_STATE);
        return;
    }
    if (l == NULL || dice < 10) {
        REQUIRE(kvd_store_release(M.s, 2, (1ull << 41) + dice) == KVD_ERR_NOT_FOUND);
        return;
    }
    if (dice < 18) {
        REQUIRE(kvd_store_release(M.s, other_owner(l->owner), l->id) ==
                KVD_ERR_NOT_FOUND);
        return;
    }
    uint64_t id = l->id, owner = l->owner;
    REQUIRE(kvd_store_release(M.s, owner, id) == KVD_OK);
    lease_end(l);
    REQUIRE(kvd_store_release(M.s, owner, id) == KVD_ERR_NOT_FOUND);
}

static void op_owner_gone(void)
{
    M.op = "owner_gone";
    uint64_t owner = 1 + rnd_below(N_OWNERS);
    size_t want = 0;
    for (uint32_t i = 0; i < M.n_leases;) {
        if (M.leases[i].owner == owner) {
            lease_end(&M.leases[i]); /* moves the last lease into slot i */
            want++;
        } else {
            i++;
        }
    }
    REQUIRE(kvd_store_owner_gone(M.s, owner) == want);
}

static void op_expire(void)
{
    M.op = "expire";
    uint64_t probe = M.now_ms + 1; /* odd: never equal to an expiry */
    size_t want = 0;
    for (uint32_t i = 0; i < M.n_leases;) {
        if (M.leases[i].expires_ms < probe) {
            lease_end(&M.leases[i]);
            want++;
        } else {
            i++;
        }
    }
    kvd_store_stats_t before, after;
    kvd_store_stats(M.s, &before);
    REQUIRE(kvd_store_expire(M.s, probe) == want);
    kvd_store_stats(M.s, &after);
    REQUIRE(after.leases_expired - before.leases_expired == want);
}

static void op_evict_key(void)
{
    M.op = "evict_key";
    uint32_t n = rnd_below(M.n_ns), k = rnd_below(N_KEYS);
    mobj_t *o = &M.obj[n][k];
    uint8_t key[KVD_KEY_BYTES];
    mkkey(key, k);
    int want = o->state == M_ABSENT                         ? KVD_ERR_NOT_FOUND
               : o->state == KVD_OBJ_WRITING || o->pins > 0 ? KVD_ERR_BUSY
                                                            : KVD_OK;
    REQUIRE(kvd_store_evict_key(M.s, M.ns_id[n], key) == want);
    if (want == KVD_OK)
        o->state = M_ABSENT;
}

static void op_evict_ns(void)
{
    M.op = "evict_ns";
    bool all = rnd_below(4) == 0;
    uint32_t pick = rnd_below(M.n_ns);
    uint64_t ev_want = 0, sk_want = 0;
    for (uint32_t n = 0; n < M.n_ns; n++) {
        if (!all && n != pick)
            continue;
        for (uint32_t k = 0; k < N_KEYS; k++) {
            mobj_t *o = &M.obj[n][k];
            if (o->state == KVD_OBJ_READY && o->pins == 0) {
                o->state = M_ABSENT;
                ev_want++;
            } else if (o->state != M_ABSENT) {
                sk_want++;
            }
        }
    }
    uint64_t ev = 0, sk = 0;
    REQUIRE(kvd_store_evict_ns(M.s, all ? UINT32_MAX : M.ns_id[pick], &ev, &sk) ==
            KVD_OK);
    REQUIRE(ev == ev_want);
    REQUIRE(sk == sk_want);
}

static void op_lookup(void)
{
    M.op = "lookup";
    uint32_t n_pools = 1 + rnd_below(3);
    kvd_lookup_pool_t pools[3];
    uint8_t keys[3][8][KVD_KEY_BYTES];
    uint32_t k[3][8], pn[3];
    size_t min_n = SIZE_MAX;
    for (uint32_t p = 0; p < n_pools; p++) {
        pn[p] = rnd_below(M.n_ns);
        uint32_t cnt = rnd_below(9);
        /* a prefix-like run: consecutive keys from a random start, so that
         * long runs of present pages happen */
        uint32_t start = rnd_below(N_KEYS);
        for (uint32_t i = 0; i < cnt; i++) {
            k[p][i] = rnd_below(4) ? (start + i) % N_KEYS : rnd_below(N_KEYS);
            mkkey(keys[p][i], k[p][i]);
        }
        pools[p] = (kvd_lookup_pool_t){.ns = M.ns_id[pn[p]],
                                       .keys = (const uint8_t(*)[KVD_KEY_BYTES])keys[p],
                                       .n_keys = cnt,
                                       .trailing_pages = rnd_below(3)};
        min_n = cnt < min_n ? cnt : min_n;
    }
    uint32_t want[8];
    size_t n_want = 0;
    for (size_t b = 1; b <= min_n; b++) {
        bool ok = true;
        for (uint32_t p = 0; p < n_pools && ok; p++) {
            uint32_t t = pools[p].trailing_pages;
            size_t from = t == 0 || t >= b ? 0 : b - t;
            for (size_t i = from; i < b && ok; i++)
                ok = M.obj[pn[p]][k[p][i]].state == KVD_OBJ_READY;
        }
        if (ok)
            want[n_want++] = (uint32_t)b;
    }
    kvd_ns_info_t before[MAX_NS], after;
    for (uint32_t n = 0; n < M.n_ns; n++)
        kvd_store_ns_info(M.s, M.ns_id[n], &before[n]);
    uint32_t got[8];
    size_t n_got = 99;
    REQUIRE(kvd_store_lookup(M.s, pools, n_pools, got, &n_got) == KVD_OK);
    REQUIRE(n_got == n_want);
    for (size_t i = 0; i < n_want; i++)
        REQUIRE(got[i] == want[i]);
    for (uint32_t n = 0; n < M.n_ns; n++) {
        uint64_t probed = 0, hits = 0;
        for (uint32_t p = 0; p < n_pools; p++)
            if (pn[p] == n)
                for (size_t i = 0; i < min_n; i++) {
                    probed++;
                    hits += M.obj[n][k[p][i]].state == KVD_OBJ_READY;
                }
        kvd_store_ns_info(M.s, M.ns_id[n], &after);
        REQUIRE(after.lookup_pages - before[n].lookup_pages == probed);
        REQUIRE(after.hit_pages - before[n].hit_pages == hits);
    }
}

/* ------------------------------------------------------------ the run */

static void run_seed(uint64_t seed)
{
    memset(&M, 0, sizeof(M));
    M.seed = seed;
    M.rng = seed * 0x9e3779b97f4a7c15ull + 1;
    static const uint64_t sizes[MAX_NS] = {PAGE, 2 * PAGE - 1, 5 * PAGE - 100};
    static const char *names[MAX_NS] = {"m/kv/tp0", "m/kv/tp1", "m/mamba/tp0"};
    M.n_ns = 2 + seed % 2 + (seed % 3 == 0);
    if (M.n_ns > MAX_NS)
        M.n_ns = MAX_NS;
    /* about a third of what all keys would take, so that eviction and
     * NO_SPACE both happen */
    M.pool_pgs = M.n_ns == 2 ? 40 : POOL_PGS;
    kvd_store_config_t cfg;
    kvd_store_config_default(&cfg, (uint64_t)M.pool_pgs * PAGE);
    /* odd seeds: eviction on demand only; even seeds: watermarks too */
    cfg.evict_high = seed % 2 ? 1.0 : 0.8;
    cfg.evict_low = seed % 2 ? 1.0 : 0.6;
    cfg.lease_ttl_ms = TTL_MS;
    cfg.index_hint = 16;
    REQUIRE(kvd_store_create(&cfg, &M.s) == KVD_OK);
    for (uint32_t n = 0; n < M.n_ns; n++) {
        REQUIRE(kvd_store_ns_register(M.s, KVD_TENANT_DEFAULT, KVD_OWNER_PERMANENT,
                                      names[n], sizes[n], false, &M.ns_id[n]) == KVD_OK);
        M.obj_bytes[n] = sizes[n];
        M.obj_pages[n] = (uint32_t)((sizes[n] + PAGE - 1) / PAGE);
    }
    M.now_ms = 1000;
    for (M.step = 0; M.step < STEPS; M.step++) {
        M.now_ms += 2 * rnd_below(12);
        uint32_t d = rnd_below(100);
        if (d < RESERVE_PCT)
            op_reserve(cfg.evict_high);
        else if (d < 42)
            op_finish(true);
        else if (d < 47)
            op_finish(false);
        else if (d < 65)
            op_acquire();
        else if (d < 77)
            op_release();
        else if (d < 79)
            op_owner_gone();
        else if (d < 82)
            op_expire();
        else if (d < 85)
            op_evict_key();
        else if (d < 86)
            op_evict_ns();
        else
            op_lookup();
        if (d >= RESERVE_PCT) /* no eviction outside a reserve: strict agreement */
            REQUIRE(sync_evictions() == 0);
        verify();
    }
    M.op = "final owner_gone";
    for (uint64_t o = 1; o <= N_OWNERS; o++) {
        size_t want = 0;
        for (uint32_t i = 0; i < M.n_leases;)
            if (M.leases[i].owner == o) {
                lease_end(&M.leases[i]);
                want++;
            } else {
                i++;
            }
        REQUIRE(kvd_store_owner_gone(M.s, o) == want);
        verify();
    }
    /* quarantined extents of dead writers come back after their grace */
    kvd_store_expire(M.s, UINT64_MAX / 2);
    REQUIRE(kvd_store_check(M.s, NULL, 0) == KVD_OK);
    kvd_store_stats_t st;
    kvd_store_stats(M.s, &st);
    REQUIRE(st.quarantined_bytes == 0);
    REQUIRE(st.pins == 0);
    REQUIRE(st.writing_bytes == 0);
    REQUIRE(st.objects_writing == 0);
    REQUIRE(st.objects_pinned == 0);
    REQUIRE(st.leases == 0);
    REQUIRE(st.free_bytes + st.ready_bytes == st.pool_bytes);
    uint64_t ev, sk;
    REQUIRE(kvd_store_evict_ns(M.s, UINT32_MAX, &ev, &sk) == KVD_OK);
    REQUIRE(sk == 0);
    kvd_store_stats(M.s, &st);
    REQUIRE(st.free_bytes == st.pool_bytes);
    REQUIRE(st.free_extents == 1);
    print_message("seed %llu: %u namespaces, %llu evictions seen, %llu reserves with "
                  "NO_SPACE, %llu acquires (%llu failed), %llu lookups\n",
                  (unsigned long long)seed, M.n_ns, (unsigned long long)M.evictions_seen,
                  (unsigned long long)M.no_space_seen, (unsigned long long)st.acquires,
                  (unsigned long long)st.acquire_failures,
                  (unsigned long long)st.lookups);
    /* the run exercised what it is meant to */
    REQUIRE(M.evictions_seen > 0);
    REQUIRE(M.no_space_seen > 0);
    kvd_store_destroy(M.s);
}

static void test_seed_1(void **state)
{
    (void)state;
    run_seed(1);
}
static void test_seed_2(void **state)
{
    (void)state;
    run_seed(2);
}
static void test_seed_3(void **state)
{
    (void)state;
    run_seed(3);
}
static void test_seed_4(void **state)
{
    (void)state;
    run_seed(4);
}
static void test_seed_5(void **state)
{
    (void)state;
    run_seed(5);
}
static void test_seed_20240607(void **state)
{
    (void)state;
    run_seed(20240607);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_seed_1), cmocka_unit_test(test_seed_2),
        cmocka_unit_test(test_seed_3), cmocka_unit_test(test_seed_4),
        cmocka_unit_test(test_seed_5), cmocka_unit_test(test_seed_20240607),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
