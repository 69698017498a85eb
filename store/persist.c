/*
 * persist.c - the store's metadata journal (kvd_store.h "persistence"):
 * what the engine's changes look like as journal entries, the replay of a
 * journal at start into a store, the snapshots that compact it, and what
 * happens when it cannot be written. The file format is journal.c's; the
 * engine's side is a handful of hooks (store_int.h persist_*) and the
 * restore functions of engine.c.
 *
 * Entries (packed, native order) are keyed by extent (its first page), and
 * every entry that describes an extent is an upsert:
 *   NS       a namespace in its slot: generation, tenant name, name, size
 *   NS_DEL   its slot freed (the generation it left behind)
 *   WRITING  an extent reserved for a key (key, namespace, parent tag, depth)
 *   READY    an extent holding a published object (the same, access, hits)
 *   PUBLISH  the WRITING extent at a page became READY
 *   FREE     the extent at a page is free
 *   QUAR     an extent in quarantine (its tenant by name)
 *   HELD     the WRITING or QUAR extent at a page belongs to a writer
 *            process (pid, start time, token): a restart holds it until
 *            that process is gone or says its copies are over (kvd_store.h
 *            kvd_writer_t); without one, one lease TTL. Layout version 2
 *            (version 1 journals, which have none, are read as well).
 * A replay ignores what refers to an extent it does not know (a PUBLISH or
 * FREE whose WRITING came before the snapshot it reads). That is what lets
 * a snapshot be written in slices while commits go on: a slice writes each
 * record's state as it is then, commits after it in the file bring the
 * changes since, and a change that came before the slice reached a record
 * is in the state the slice wrote (journal.h, "Compaction").
 *
 * Tenants are journaled by name: a restart maps them to the ids of its own
 * configuration, and a namespace whose tenant is no longer configured is
 * not restored (its extents become free space, scrubbed before reuse).
 */
#include "journal.h"
#include "store_testing.h"
#include "store_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Compaction starts once the journal is past both of these. */
#define COMPACT_MIN_BYTES (8ull << 20)
#define COMPACT_FACTOR    2
/* Records one tick of kvd_store_expire snapshots: a few milliseconds. */
#define SLICE_RECORDS 65536u
/* A journal that failed is rewritten again at most this often. */
#define RETRY_MS     1000
#define RETRY_MAX_MS 60000

enum entry_type {
    E_NS = 1,
    E_NS_DEL = 2,
    E_WRITING = 3,
    E_READY = 4,
    E_PUBLISH = 5,
    E_FREE = 6,
    E_QUAR = 7,
    E_HELD = 8,
};

typedef struct __attribute__((packed)) e_ns {
    uint8_t type;
    uint16_t slot;
    uint32_t gen;
    uint64_t object_bytes;
    uint8_t rank_replicated;
    uint8_t tenant_len;
    uint16_t name_len;
    /* then tenant_len bytes of tenant name, name_len bytes of name */
} e_ns_t;

typedef struct __attribute__((packed)) e_ns_del {
    uint8_t type;
    uint16_t slot;
    uint32_t gen;
} e_ns_del_t;

typedef struct __attribute__((packed)) e_obj {
    uint8_t type; /* E_WRITING, or E_READY with the two fields after */
    uint32_t off, pages;
    uint16_t slot;
    uint8_t has_parent;
    uint32_t depth;
    uint8_t key[KVD_KEY_BYTES];
    uint8_t parent_tag[KVD_KEY_TAG_BYTES];
    uint32_t last_access_s; /* E_READY only */
    uint16_t hits;          /* E_READY only */
} e_obj_t;

#define E_WRITING_BYTES offsetof(e_obj_t, last_access_s)

typedef struct __attribute__((packed)) e_publish {
    uint8_t type;
    uint32_t off;
    uint32_t last_access_s;
} e_publish_t;

typedef struct __attribute__((packed)) e_free {
    uint8_t type;
    uint32_t off;
} e_free_t;

typedef struct __attribute__((packed)) e_quar {
    uint8_t type;
    uint32_t off, pages;
    uint8_t tenant_len;
    /* then the tenant's name */
} e_quar_t;

typedef struct __attribute__((packed)) e_held {
    uint8_t type;
    uint32_t off;
    uint32_t pid;
    uint64_t start_ticks;
    uint64_t token;
} e_held_t;

struct persist {
    jnl_t *j;
    jnl_header_t hdr;      /* of the journal file now */
    bool broken;           /* a write failed: the file is marked invalid */
    uint64_t retry_ms;     /* when a broken journal is rewritten next */
    uint64_t retry_gap_ms; /* ... and the wait after that try, doubling */
    uint32_t cursor;       /* compaction: the next record to snapshot; 0 none */
    uint32_t walk_end;     /* ... and the last one (rec_high when it began) */
    uint64_t next_size;    /* no compaction before the journal is this big */
    uint64_t compact_min_bytes;
    uint32_t slice_records;
    uint64_t compactions, errors;
    uint64_t repairs_skipped; /* repair tries left out: too little free space */
};

/* ------------------------------------------------------------ entries */

static void put_obj(uint8_t *p, const kvd_store_t *s, uint32_t i, bool ready)
{
    const rec_t *r = R(s, i);
    e_obj_t e = {.type = ready ? E_READY : E_WRITING,
                 .off = r->off_pages,
                 .pages = r->size_pages,
                 .slot = r->ns,
                 .has_parent = r->has_parent,
                 .depth = r->depth,
                 .last_access_s = r->last_access_s,
                 .hits = r->hits};
    memcpy(e.key, r->key, KVD_KEY_BYTES);
    memcpy(e.parent_tag, r->parent_tag, KVD_KEY_TAG_BYTES);
    memcpy(p, &e, ready ? sizeof(e) : E_WRITING_BYTES);
}

static size_t ns_entry_bytes(const kvd_store_t *s, uint32_t slot)
{
    const ns_entry_t *e = &s->ns[slot];
    return sizeof(e_ns_t) + strlen(s->tenants[e->info.tenant].name) +
           strlen(e->info.name);
}

static void put_ns(uint8_t *p, const kvd_store_t *s, uint32_t slot)
{
    const ns_entry_t *e = &s->ns[slot];
    const char *tenant = s->tenants[e->info.tenant].name;
    e_ns_t h = {.type = E_NS,
                .slot = (uint16_t)slot,
                .gen = e->gen,
                .object_bytes = e->info.object_bytes,
                .rank_replicated = e->info.rank_replicated,
                .tenant_len = (uint8_t)strlen(tenant),
                .name_len = (uint16_t)strlen(e->info.name)};
    memcpy(p, &h, sizeof(h));
    memcpy(p + sizeof(h), tenant, h.tenant_len);
    memcpy(p + sizeof(h) + h.tenant_len, e->info.name, h.name_len);
}

static void put_ns_del(uint8_t *p, const kvd_store_t *s, uint32_t slot)
{
    e_ns_del_t e = {.type = E_NS_DEL, .slot = (uint16_t)slot, .gen = s->ns[slot].gen};
    memcpy(p, &e, sizeof(e));
}

/* A quarantined record's entry: its tenant (+1) is kept in `hits`. */
static size_t quar_entry_bytes(const kvd_store_t *s, uint32_t i)
{
    return sizeof(e_quar_t) + strlen(s->tenants[R(s, i)->hits - 1].name);
}

static void put_quar(uint8_t *p, const kvd_store_t *s, uint32_t i)
{
    const rec_t *r = R(s, i);
    const char *tenant = s->tenants[r->hits - 1].name;
    e_quar_t e = {.type = E_QUAR,
                  .off = r->off_pages,
                  .pages = r->size_pages,
                  .tenant_len = (uint8_t)strlen(tenant)};
    memcpy(p, &e, sizeof(e));
    memcpy(p + sizeof(e), tenant, e.tenant_len);
}

/* ------------------------------------------------------------- hooks */

/* Room in the open batch; on NULL the batch is marked failed and its commit
 * fails (the journal is then invalidated: nothing half-recorded stays). */
static uint8_t *batch_put(kvd_store_t *s, size_t bytes)
{
    return s->persist->broken ? NULL : jnl_put(s->persist->j, bytes);
}

void persist_ns_added_(kvd_store_t *s, uint32_t slot)
{
    uint8_t *p = batch_put(s, ns_entry_bytes(s, slot));
    if (p)
        put_ns(p, s, slot);
}

void persist_ns_removed_(kvd_store_t *s, uint32_t slot)
{
    uint8_t *p = batch_put(s, sizeof(e_ns_del_t));
    if (p)
        put_ns_del(p, s, slot);
}

static void put_held(uint8_t *p, const kvd_store_t *s, uint32_t i, const kvd_writer_t *w)
{
    e_held_t e = {.type = E_HELD,
                  .off = R(s, i)->off_pages,
                  .pid = w->pid,
                  .start_ticks = w->start_ticks,
                  .token = w->token};
    memcpy(p, &e, sizeof(e));
}

void persist_writing_(kvd_store_t *s, uint32_t i, const kvd_writer_t *w)
{
    uint8_t *p = batch_put(s, E_WRITING_BYTES + (w ? sizeof(e_held_t) : 0));
    if (p == NULL)
        return;
    put_obj(p, s, i, false);
    if (w)
        put_held(p + E_WRITING_BYTES, s, i, w);
}

void persist_quarantined_(kvd_store_t *s, uint32_t i)
{
    uint8_t *p = batch_put(s, quar_entry_bytes(s, i));
    if (p)
        put_quar(p, s, i);
}

void persist_freed_(kvd_store_t *s, uint32_t i)
{
    e_free_t e = {.type = E_FREE, .off = R(s, i)->off_pages};
    uint8_t *p = batch_put(s, sizeof(e));
    if (p)
        memcpy(p, &e, sizeof(e));
}

/* The journal could not be written: mark it invalid at once (a restart
 * then discards it instead of finding an extent free in the pool but used
 * in the file, or the other way round) and stop writing until a rewrite
 * succeeds. */
static void persist_break(kvd_store_t *s, int rc)
{
    struct persist *p = s->persist;
    p->errors++;
    if (p->broken)
        return;
    jnl_discard(p->j);
    jnl_rewrite_abort(p->j);
    p->cursor = 0;
    int inv = jnl_invalidate(p->j);
    KVD_ERROR("persist",
              "writing the journal %s failed (%s): it is marked invalid%s, so a restart "
              "starts empty; publishes fail until it can be rewritten",
              jnl_path(p->j), kvd_status_str(rc),
              inv == KVD_OK
                  ? ""
                  : " (no: its header, its bytes and its name all stayed: start the "
                    "next daemon with --fresh)");
    p->broken = true;
    p->retry_ms = kvd_now_ns() / 1000000 + RETRY_MS;
    p->retry_gap_ms = 2 * RETRY_MS;
}

int persist_published_(kvd_store_t *s, const uint32_t *recs, size_t n, uint32_t now_s)
{
    struct persist *p = s->persist;
    if (p->broken)
        return KVD_ERR_IO;
    for (size_t k = 0; k < n; k++) {
        e_publish_t e = {
            .type = E_PUBLISH, .off = R(s, recs[k])->off_pages, .last_access_s = now_s};
        uint8_t *b = jnl_put(p->j, sizeof(e));
        if (b)
            memcpy(b, &e, sizeof(e));
    }
    int rc = jnl_commit(p->j);
    if (rc != KVD_OK && jnl_damaged(p->j)) {
        /* the torn record could not be cut back: nothing more may follow
         * it, so the journal goes invalid until it is rewritten */
        persist_break(s, rc);
        return KVD_ERR_IO;
    }
    if (rc != KVD_OK) {
        /* the record was cut back and nothing was freed: the journal is
         * still right, only this publish fails */
        p->errors++;
        KVD_WARN("persist", "a publish of %zu objects was not journaled (%s): refused", n,
                 kvd_status_str(rc));
        return KVD_ERR_IO;
    }
    return KVD_OK;
}

void persist_commit_(kvd_store_t *s)
{
    struct persist *p = s->persist;
    if (p->broken) {
        jnl_discard(p->j);
        return;
    }
    int rc = jnl_commit(p->j);
    if (rc != KVD_OK)
        persist_break(s, rc);
}

/* ---------------------------------------------------------- snapshots */

/* Writes the namespace table into the new file. */
static int snap_namespaces(kvd_store_t *s)
{
    jnl_t *j = s->persist->j;
    for (uint32_t slot = 0; slot < s->n_slots; slot++) {
        const ns_entry_t *e = &s->ns[slot];
        bool live = e->live;
        if (!live && e->gen == 0)
            continue; /* never removed: nothing to remember */
        size_t bytes = live ? ns_entry_bytes(s, slot) : sizeof(e_ns_del_t);
        uint8_t *b = jnl_rewrite_put(j, bytes);
        if (b == NULL)
            return KVD_ERR_NOMEM;
        if (live)
            put_ns(b, s, slot);
        else
            put_ns_del(b, s, slot);
    }
    return KVD_OK;
}

/* Writes the state of records [from, to] into the new file. */
static int snap_records(kvd_store_t *s, uint32_t from, uint32_t to)
{
    jnl_t *j = s->persist->j;
    for (uint32_t i = from; i <= to && i != 0; i++) {
        const rec_t *r = R(s, i);
        uint8_t *b;
        if (r->tier == KVD_TIER_SSD) {
            /* on the SSD tier: its segment's record says it, not the pool */
        } else if (r->state == REC_READY && (r->spare & REC_F_LOST)) {
            /* its bytes were lost: journaled free (kvd_store_pool_lost) */
        } else if (r->state == REC_READY) {
            if ((b = jnl_rewrite_put(j, sizeof(e_obj_t))) == NULL)
                return KVD_ERR_NOMEM;
            put_obj(b, s, i, true);
        } else if (r->state == REC_WRITING && r->quarantined) {
            if ((b = jnl_rewrite_put(j, quar_entry_bytes(s, i))) == NULL)
                return KVD_ERR_NOMEM;
            put_quar(b, s, i);
        } else if (r->state == REC_WRITING) {
            if ((b = jnl_rewrite_put(j, E_WRITING_BYTES)) == NULL)
                return KVD_ERR_NOMEM;
            put_obj(b, s, i, false);
        }
        if (i == UINT32_MAX)
            break;
    }
    return jnl_rewrite_flush(j);
}

static jnl_header_t next_header(const struct persist *p)
{
    jnl_header_t h = p->hdr;
    h.flags &= ~JNL_F_INVALID;
    h.written_ms = kvd_wall_ms();
    return h;
}

typedef struct snap_held {
    jnl_t *j;
    const kvd_store_t *s;
    int rc;
} snap_held_t;

static void snap_held_one(void *arg, uint32_t rec, const kvd_writer_t *w)
{
    snap_held_t *h = arg;
    uint8_t *b = h->rc == KVD_OK ? jnl_rewrite_put(h->j, sizeof(e_held_t)) : NULL;
    if (b == NULL)
        h->rc = KVD_ERR_NOMEM;
    else
        put_held(b, h->s, rec, w);
}

/* Writes whose writer holds each extent held or reserved now, after every
 * slice: an extent's entry (WRITING or QUAR) is in the new file before
 * this, and an extent reserved or freed since came through the commits. */
static int snap_held(kvd_store_t *s)
{
    snap_held_t h = {.j = s->persist->j, .s = s, .rc = KVD_OK};
    store_foreach_held(s, snap_held_one, &h);
    return h.rc != KVD_OK ? h.rc : jnl_rewrite_flush(h.j);
}

/* Writes a whole snapshot and puts it in place of the journal, now (at
 * attach, and to repair a broken journal). */
static int snapshot_now(kvd_store_t *s)
{
    struct persist *p = s->persist;
    jnl_header_t h = next_header(p);
    int rc = jnl_rewrite_begin(p->j, &h);
    if (rc == KVD_OK)
        rc = snap_namespaces(s);
    if (rc == KVD_OK)
        rc = snap_records(s, 1, s->rec_high);
    if (rc == KVD_OK)
        rc = snap_held(s);
    if (rc == KVD_OK)
        rc = jnl_rewrite_finish(p->j);
    else
        jnl_rewrite_abort(p->j);
    if (rc == KVD_OK)
        p->hdr = h;
    return rc;
}

/* What a snapshot of the store now would take, about. */
static uint64_t snapshot_estimate(const kvd_store_t *s)
{
    return sizeof(jnl_header_t) + (s->n_objects + 1) * sizeof(e_obj_t) +
           (uint64_t)s->n_slots * (sizeof(e_ns_t) + 64);
}

uint64_t kvd_store_journal_bound_bytes(uint64_t pool_bytes, uint64_t object_bytes,
                                       uint64_t compact_min_bytes)
{
    uint64_t objects = pool_bytes / KVD_MAX(object_bytes, (uint64_t)1) + 1;
    uint64_t snap = sizeof(jnl_header_t) + objects * sizeof(e_obj_t) +
                    (uint64_t)KVD_STORE_MAX_NAMESPACES * (sizeof(e_ns_t) + 64);
    uint64_t bound = KVD_MAX(compact_min_bytes ? compact_min_bytes : COMPACT_MIN_BYTES,
                             COMPACT_FACTOR * snap);
    /* at the bound the rewrite begins: its file takes a snapshot, and what
     * is journaled while it runs goes into both */
    return bound + 2 * snap;
}

/* One step of compaction: begins one when the journal outgrew its bound,
 * snapshots a slice of records, finishes when the walk is through. */
static void compact_step(kvd_store_t *s)
{
    struct persist *p = s->persist;
    jnl_t *j = p->j;
    if (p->cursor == 0) {
        uint64_t bound =
            KVD_MAX(p->compact_min_bytes, COMPACT_FACTOR * snapshot_estimate(s));
        if (jnl_bytes(j) < KVD_MAX(bound, p->next_size) || s->rec_high == 0)
            return;
        jnl_header_t h = next_header(p);
        if (jnl_rewrite_begin(j, &h) != KVD_OK || snap_namespaces(s) != KVD_OK ||
            jnl_rewrite_flush(j) != KVD_OK) {
            jnl_rewrite_abort(j);
            p->next_size = jnl_bytes(j) * 2; /* not again at once */
            return;
        }
        p->hdr = h;
        p->cursor = 1;
        p->walk_end = s->rec_high;
        return;
    }
    if (!jnl_rewriting(j)) { /* a commit to the new file failed: it was dropped */
        p->cursor = 0;
        p->next_size = jnl_bytes(j) * 2;
        return;
    }
    uint32_t to =
        (uint32_t)KVD_MIN((uint64_t)p->cursor + p->slice_records - 1, p->walk_end);
    if (snap_records(s, p->cursor, to) != KVD_OK) {
        jnl_rewrite_abort(j);
        p->cursor = 0;
        p->next_size = jnl_bytes(j) * 2;
        return;
    }
    if (to < p->walk_end) {
        p->cursor = to + 1;
        return;
    }
    uint64_t before = jnl_bytes(j);
    p->cursor = 0;
    if (snap_held(s) != KVD_OK) {
        jnl_rewrite_abort(j);
        p->next_size = before * 2;
        return;
    }
    if (jnl_rewrite_finish(j) != KVD_OK) {
        p->next_size = before * 2;
        return;
    }
    p->compactions++;
    p->next_size = 0;
    KVD_DEBUG("persist", "journal compacted: %llu bytes, was %llu",
              (unsigned long long)jnl_bytes(j), (unsigned long long)before);
}

void persist_tick_(kvd_store_t *s)
{
    struct persist *p = s->persist;
    if (!p->broken) {
        compact_step(s);
        return;
    }
    uint64_t now = kvd_now_ns() / 1000000;
    if (now < p->retry_ms)
        return;
    /* a whole snapshot, written on this thread: tried less and less often
     * while it keeps failing, and not at all while it could not fit */
    p->retry_ms = now + p->retry_gap_ms;
    uint64_t gap_s = p->retry_gap_ms / 1000;
    p->retry_gap_ms = KVD_MIN(2 * p->retry_gap_ms, (uint64_t)RETRY_MAX_MS);
    uint64_t need = snapshot_estimate(s), avail = jnl_free_bytes(p->j);
    if (avail < need) {
        p->repairs_skipped++;
        KVD_WARN("persist",
                 "the journal %s needs about %llu bytes and its file system has %llu "
                 "free: publishes still fail; next try in %llu s",
                 jnl_path(p->j), (unsigned long long)need, (unsigned long long)avail,
                 (unsigned long long)gap_s);
        return;
    }
    int rc = snapshot_now(s);
    if (rc == KVD_OK) {
        p->broken = false;
        KVD_INFO("persist", "the journal %s is written again (%llu bytes)",
                 jnl_path(p->j), (unsigned long long)jnl_bytes(p->j));
        return;
    }
    p->errors++;
    KVD_WARN("persist", "rewriting the journal %s failed (%s): next try in %llu s",
             jnl_path(p->j), kvd_status_str(rc), (unsigned long long)gap_s);
}

void persist_close(kvd_store_t *s)
{
    struct persist *p = s->persist;
    if (p == NULL)
        return;
    jnl_close(p->j);
    kvd_mem_free(KVD_MEM_OTHER, p, sizeof(*p));
    s->persist = NULL;
}

void kvd_store_journal_fail_cuts(kvd_store_t *s, uint32_t n)
{
    if (s->persist != NULL)
        jnl_fail_cuts(s->persist->j, n);
}

void persist_stats(const kvd_store_t *s, kvd_store_stats_t *out)
{
    const struct persist *p = s->persist;
    if (p == NULL)
        return;
    out->journal_bytes = jnl_bytes(p->j) + jnl_rewrite_bytes(p->j);
    out->journal_records = jnl_records_written(p->j);
    out->journal_compactions = p->compactions;
    out->journal_errors = p->errors;
    out->journal_broken = p->broken;
    out->journal_repairs_skipped = p->repairs_skipped;
}

/* ------------------------------------------------------------- replay */

/* What a journal says, as it is read: the namespace table, and the extents
 * in a table keyed by first page (open addressing, linear probing; each
 * entry is the page << 32 | objs index + 1, so that a probe reads the
 * table alone). */
typedef struct replay {
    restore_ns_t *ns;                       /* KVD_STORE_MAX_NAMESPACES slots */
    char (*ns_tenant)[KVD_TENANT_NAME_MAX]; /* each slot's tenant, by name */
    restore_obj_t *objs;                    /* kind 0: freed since (a hole, skipped) */
    uint32_t n_objs, cap_objs;
    uint64_t *table; /* 0: empty */
    uint64_t mask;   /* table size - 1 */
    uint64_t used;   /* entries in the table */
    /* the tenants quarantine entries name; an extent's `tenant` is an
     * index here until the build maps it to an id */
    char (*quar_tenant)[KVD_TENANT_NAME_MAX];
    uint32_t n_quar_tenants;
    uint64_t records;
    char error[192];
} replay_t;

static uint64_t slot_of(const replay_t *rp, uint32_t off)
{
    return ((uint64_t)off * 0x9e3779b97f4a7c15ull >> 20) & rp->mask;
}

static uint32_t entry_off(uint64_t e)
{
    return (uint32_t)(e >> 32);
}

static uint32_t entry_idx(uint64_t e)
{
    return (uint32_t)e - 1;
}

/* The table position holding off, or the empty one where it would go. */
static uint64_t table_pos(const replay_t *rp, uint32_t off)
{
    uint64_t h = slot_of(rp, off);
    while (rp->table[h] != 0 && entry_off(rp->table[h]) != off)
        h = (h + 1) & rp->mask;
    return h;
}

/* Sizes the table for `entries` at a load of at most one half. */
static int table_resize(replay_t *rp, uint64_t entries)
{
    uint64_t n = 4096;
    while (n < 2 * entries)
        n *= 2;
    if (rp->table != NULL && n <= rp->mask + 1)
        return KVD_OK;
    uint64_t old_n = rp->table ? rp->mask + 1 : 0, *old = rp->table;
    rp->table = kvd_mem_calloc(KVD_MEM_STAGING, n, sizeof(uint64_t));
    if (rp->table == NULL) {
        rp->table = old;
        return KVD_ERR_NOMEM;
    }
    rp->mask = n - 1;
    for (uint64_t k = 0; k < old_n; k++)
        if (old[k] != 0)
            rp->table[table_pos(rp, entry_off(old[k]))] = old[k];
    kvd_mem_free(KVD_MEM_STAGING, old, old_n * sizeof(uint64_t));
    return KVD_OK;
}

/* Room for cap extents in objs. */
static int objs_reserve(replay_t *rp, uint64_t cap)
{
    if (cap <= rp->cap_objs)
        return KVD_OK;
    if (cap >= UINT32_MAX)
        return KVD_ERR_NOMEM;
    restore_obj_t *o = kvd_mem_realloc(
        KVD_MEM_STAGING, rp->objs, rp->cap_objs * sizeof(*o), (size_t)cap * sizeof(*o));
    if (o == NULL)
        return KVD_ERR_NOMEM;
    rp->objs = o;
    rp->cap_objs = (uint32_t)cap;
    return KVD_OK;
}

/* The extent at off, to be (over)written: an existing one, or a new one. */
static restore_obj_t *replay_upsert(replay_t *rp, uint32_t off)
{
    if ((rp->used + 1) * 2 > rp->mask + 1 &&
        table_resize(rp, 2 * (rp->used + 1)) != KVD_OK)
        return NULL;
    uint64_t h = table_pos(rp, off);
    if (rp->table[h] != 0)
        return &rp->objs[entry_idx(rp->table[h])];
    if (rp->n_objs == rp->cap_objs &&
        objs_reserve(rp, rp->cap_objs ? 2ull * rp->cap_objs : 4096) != KVD_OK)
        return NULL;
    uint32_t idx = rp->n_objs++;
    rp->table[h] = (uint64_t)off << 32 | (idx + 1);
    rp->used++;
    restore_obj_t *o = &rp->objs[idx];
    memset(o, 0, sizeof(*o));
    o->off_pages = off;
    return o;
}

static restore_obj_t *replay_find(replay_t *rp, uint32_t off)
{
    uint64_t h = table_pos(rp, off);
    return rp->table[h] != 0 ? &rp->objs[entry_idx(rp->table[h])] : NULL;
}

/* Forgets the extent at off (linear probing: later entries of its run move
 * back into the gap). */
static void replay_remove(replay_t *rp, uint32_t off)
{
    uint64_t h = table_pos(rp, off);
    if (rp->table[h] == 0)
        return;
    rp->objs[entry_idx(rp->table[h])].kind = 0;
    rp->table[h] = 0;
    rp->used--;
    for (uint64_t k = (h + 1) & rp->mask; rp->table[k] != 0; k = (k + 1) & rp->mask) {
        uint64_t home = slot_of(rp, entry_off(rp->table[k]));
        /* does k's entry belong at or before the gap (cyclically)? */
        bool move = h <= k ? (home <= h || home > k) : (home <= h && home > k);
        if (move) {
            rp->table[h] = rp->table[k];
            rp->table[k] = 0;
            h = k;
        }
    }
}

/* The index of a tenant name quarantine entries use (UINT32_MAX: more
 * names than tenants can be; such extents count as the default tenant's). */
static uint32_t quar_tenant_index(replay_t *rp, const char *name)
{
    for (uint32_t k = 0; k < rp->n_quar_tenants; k++)
        if (strcmp(rp->quar_tenant[k], name) == 0)
            return k;
    if (rp->n_quar_tenants == KVD_TENANTS_MAX)
        return UINT32_MAX;
    kvd_strlcpy(rp->quar_tenant[rp->n_quar_tenants], name, KVD_TENANT_NAME_MAX);
    return rp->n_quar_tenants++;
}

#define BAD(...)                                                                 \
    do {                                                                         \
        int n_ = snprintf(rp->error, sizeof(rp->error),                          \
                          "record %llu: ", (unsigned long long)rp->records + 1); \
        snprintf(rp->error + n_, sizeof(rp->error) - (size_t)n_, __VA_ARGS__);   \
        return KVD_ERR_STATE;                                                    \
    } while (0)

/* Applies one whole record's entries. A record that passed its CRC but
 * does not parse was not written by this layout: an error, not a tear. */
static int replay_record(void *arg, const uint8_t *p, size_t len)
{
    replay_t *rp = arg;
    size_t at = 0;
    while (at < len) {
        uint8_t type = p[at];
        size_t left = len - at;
        if (type == E_NS) {
            e_ns_t e;
            if (left < sizeof(e))
                BAD("a namespace entry cut short");
            memcpy(&e, p + at, sizeof(e));
            size_t bytes = sizeof(e) + e.tenant_len + e.name_len;
            if (left < bytes || e.slot >= KVD_STORE_MAX_NAMESPACES ||
                e.tenant_len >= KVD_TENANT_NAME_MAX || e.name_len == 0 ||
                e.name_len >= KVD_NS_NAME_MAX)
                BAD("a namespace entry that does not parse");
            restore_ns_t *t = &rp->ns[e.slot];
            memset(t, 0, sizeof(*t));
            t->live = true;
            t->gen = e.gen;
            t->object_bytes = e.object_bytes;
            t->rank_replicated = e.rank_replicated != 0;
            memcpy(rp->ns_tenant[e.slot], p + at + sizeof(e), e.tenant_len);
            rp->ns_tenant[e.slot][e.tenant_len] = '\0';
            memcpy(t->name, p + at + sizeof(e) + e.tenant_len, e.name_len);
            t->name[e.name_len] = '\0';
            at += bytes;
        } else if (type == E_NS_DEL) {
            e_ns_del_t e;
            if (left < sizeof(e))
                BAD("a namespace removal cut short");
            memcpy(&e, p + at, sizeof(e));
            if (e.slot >= KVD_STORE_MAX_NAMESPACES)
                BAD("a namespace removal of slot %u", e.slot);
            rp->ns[e.slot].live = false;
            rp->ns[e.slot].gen = e.gen;
            at += sizeof(e);
        } else if (type == E_WRITING || type == E_READY) {
            size_t bytes = type == E_READY ? sizeof(e_obj_t) : E_WRITING_BYTES;
            e_obj_t e = {0};
            if (left < bytes)
                BAD("an object entry cut short");
            memcpy(&e, p + at, bytes);
            if (e.pages == 0 || e.slot >= KVD_STORE_MAX_NAMESPACES)
                BAD("an object entry of %u pages in slot %u", e.pages, e.slot);
            restore_obj_t *o = replay_upsert(rp, e.off);
            if (o == NULL)
                BAD("out of memory");
            if (o->kind != 0 && type == E_WRITING)
                memset(&o->writer, 0, sizeof(o->writer)); /* a new reservation */
            o->kind = type == E_READY ? RESTORE_READY : RESTORE_WRITING;
            o->size_pages = e.pages;
            o->slot = e.slot;
            o->has_parent = e.has_parent;
            o->depth = e.depth;
            o->last_access_s = e.last_access_s;
            o->hits = e.hits;
            memcpy(o->key, e.key, KVD_KEY_BYTES);
            memcpy(o->parent_tag, e.parent_tag, KVD_KEY_TAG_BYTES);
            at += bytes;
        } else if (type == E_PUBLISH) {
            e_publish_t e;
            if (left < sizeof(e))
                BAD("a publish entry cut short");
            memcpy(&e, p + at, sizeof(e));
            restore_obj_t *o = replay_find(rp, e.off);
            if (o != NULL && o->kind == RESTORE_WRITING) {
                o->kind = RESTORE_READY;
                o->last_access_s = e.last_access_s;
            }
            at += sizeof(e);
        } else if (type == E_FREE) {
            e_free_t e;
            if (left < sizeof(e))
                BAD("a free entry cut short");
            memcpy(&e, p + at, sizeof(e));
            replay_remove(rp, e.off);
            at += sizeof(e);
        } else if (type == E_QUAR) {
            e_quar_t e;
            if (left < sizeof(e))
                BAD("a quarantine entry cut short");
            memcpy(&e, p + at, sizeof(e));
            if (left < sizeof(e) + e.tenant_len || e.pages == 0 ||
                e.tenant_len >= KVD_TENANT_NAME_MAX)
                BAD("a quarantine entry that does not parse");
            char tenant[KVD_TENANT_NAME_MAX];
            memcpy(tenant, p + at + sizeof(e), e.tenant_len);
            tenant[e.tenant_len] = '\0';
            restore_obj_t *o = replay_upsert(rp, e.off);
            if (o == NULL)
                BAD("out of memory");
            o->kind = RESTORE_QUAR;
            o->size_pages = e.pages;
            o->tenant = quar_tenant_index(rp, tenant);
            at += sizeof(e) + e.tenant_len;
        } else if (type == E_HELD) {
            e_held_t e;
            if (left < sizeof(e))
                BAD("a held-extent entry cut short");
            memcpy(&e, p + at, sizeof(e));
            restore_obj_t *o = replay_find(rp, e.off);
            if (o != NULL && (o->kind == RESTORE_WRITING || o->kind == RESTORE_QUAR))
                o->writer = (kvd_writer_t){
                    .pid = e.pid, .start_ticks = e.start_ticks, .token = e.token};
            at += sizeof(e);
        } else {
            BAD("an entry of unknown type %u", type);
        }
    }
    rp->records++;
    return KVD_OK;
}

static void replay_free(replay_t *rp)
{
    kvd_mem_free(KVD_MEM_STAGING, rp->ns, KVD_STORE_MAX_NAMESPACES * sizeof(*rp->ns));
    kvd_mem_free(KVD_MEM_STAGING, rp->ns_tenant,
                 KVD_STORE_MAX_NAMESPACES * sizeof(*rp->ns_tenant));
    kvd_mem_free(KVD_MEM_STAGING, rp->quar_tenant,
                 KVD_TENANTS_MAX * sizeof(*rp->quar_tenant));
    kvd_mem_free(KVD_MEM_STAGING, rp->objs, rp->cap_objs * sizeof(*rp->objs));
    kvd_mem_free(KVD_MEM_STAGING, rp->table, (rp->mask + 1) * sizeof(uint64_t));
}

static int replay_init(replay_t *rp)
{
    memset(rp, 0, sizeof(*rp));
    rp->ns = kvd_mem_calloc(KVD_MEM_STAGING, KVD_STORE_MAX_NAMESPACES, sizeof(*rp->ns));
    rp->ns_tenant =
        kvd_mem_calloc(KVD_MEM_STAGING, KVD_STORE_MAX_NAMESPACES, sizeof(*rp->ns_tenant));
    rp->quar_tenant =
        kvd_mem_calloc(KVD_MEM_STAGING, KVD_TENANTS_MAX, sizeof(*rp->quar_tenant));
    if (rp->ns == NULL || rp->ns_tenant == NULL || rp->quar_tenant == NULL ||
        table_resize(rp, 0) != KVD_OK) {
        replay_free(rp);
        return KVD_ERR_NOMEM;
    }
    return KVD_OK;
}

/* The indices of the live extents in the order of their first page:
 * order[0..*n), as (first page << 32 | index) sorted. */
static int replay_order(const replay_t *rp, uint64_t **order_out, size_t *n_out)
{
    size_t n = 0, bytes = ((size_t)rp->n_objs + 1) * sizeof(uint64_t);
    uint64_t *a = kvd_mem_calloc(KVD_MEM_STAGING, 1, bytes);
    uint64_t *b = kvd_mem_calloc(KVD_MEM_STAGING, 1, bytes);
    if (a == NULL || b == NULL) {
        kvd_mem_free(KVD_MEM_STAGING, a, bytes);
        kvd_mem_free(KVD_MEM_STAGING, b, bytes);
        return KVD_ERR_NOMEM;
    }
    for (uint32_t i = 0; i < rp->n_objs; i++)
        if (rp->objs[i].kind != 0)
            a[n++] = (uint64_t)rp->objs[i].off_pages << 32 | i;
    store_sort_high32(a, b, n);
    kvd_mem_free(KVD_MEM_STAGING, b, bytes);
    *order_out = a;
    *n_out = n;
    return KVD_OK;
}

/* ------------------------------------------------------------- attach */

#define WHY(...)                                 \
    do {                                         \
        if (why)                                 \
            snprintf(why, why_len, __VA_ARGS__); \
    } while (0)

/* Whether the journal's header describes this store and its pool file. */
static int header_matches(const kvd_store_t *s, const kvd_store_journal_opts_t *o,
                          const jnl_header_t *h, char *why, size_t why_len)
{
    uint64_t pool = s->total_pages * s->cfg.page_bytes;
    if (h->pool_bytes != pool || h->page_bytes != s->cfg.page_bytes) {
        WHY("%s describes a pool of %llu bytes with %u-byte pages; this pool has %llu "
            "bytes with %u-byte pages",
            o->path, (unsigned long long)h->pool_bytes, h->page_bytes,
            (unsigned long long)pool, s->cfg.page_bytes);
        return KVD_ERR_STATE;
    }
    if (!(h->flags & JNL_F_HUGEPAGES) != !o->hugepages) {
        WHY("%s describes a pool of %s pages; this pool has %s pages", o->path,
            h->flags & JNL_F_HUGEPAGES ? "2 MiB huge" : "base",
            o->hugepages ? "2 MiB huge" : "base");
        return KVD_ERR_STATE;
    }
    if (h->pool_dev != o->pool_dev || h->pool_ino != o->pool_ino) {
        WHY("%s describes another pool file (device %llu inode %llu; this one is "
            "device %llu inode %llu)",
            o->path, (unsigned long long)h->pool_dev, (unsigned long long)h->pool_ino,
            (unsigned long long)o->pool_dev, (unsigned long long)o->pool_ino);
        return KVD_ERR_STATE;
    }
    return KVD_OK;
}

/* Rebuilds s from what rp read; fills the recovery's counts. */
static int rebuild(kvd_store_t *s, replay_t *rp, const jnl_header_t *h, uint16_t free_tag,
                   uint64_t now_ms, kvd_store_recovery_t *rec)
{
    int rc = store_restore_begin(s, h->secret, h->epoch_ms);
    if (rc != KVD_OK)
        return rc;
    uint32_t n_slots = 0;
    for (uint32_t slot = 0; slot < KVD_STORE_MAX_NAMESPACES; slot++) {
        restore_ns_t *t = &rp->ns[slot];
        if (t->live || t->gen != 0)
            n_slots = slot + 1;
        if (t->live &&
            kvd_store_tenant_find(s, rp->ns_tenant[slot], &t->tenant) != KVD_OK) {
            char name[KVD_ESCAPED_MAX(KVD_NS_NAME_MAX)];
            KVD_WARN("persist",
                     "namespace '%s' belongs to tenant '%s', which this configuration "
                     "does not have: its objects are not restored",
                     kvd_escape(name, sizeof(name), t->name, strlen(t->name)),
                     rp->ns_tenant[slot]);
            t->live = false;
            t->gen = (t->gen + 1) & NS_GEN_MASK;
            free_tag = SCRUB_MIXED; /* its bytes are now free space */
        }
    }
    if ((rc = store_restore_ns(s, rp->ns, n_slots)) != KVD_OK)
        return rc;
    /* quarantined extents name their tenant; an unknown one counts as the
     * default tenant's (only the accounting of its grace needs one) */
    for (uint32_t i = 0; i < rp->n_objs; i++) {
        restore_obj_t *o = &rp->objs[i];
        if (o->kind != RESTORE_QUAR)
            continue;
        if (o->tenant == UINT32_MAX ||
            kvd_store_tenant_find(s, rp->quar_tenant[o->tenant], &o->tenant) != KVD_OK)
            o->tenant = KVD_TENANT_DEFAULT;
    }
    uint64_t *order = NULL;
    size_t n = 0;
    if ((rc = replay_order(rp, &order, &n)) != KVD_OK)
        return rc;
    restore_obj_t *sorted = kvd_mem_calloc(KVD_MEM_STAGING, n ? n : 1, sizeof(*sorted));
    if (sorted == NULL) {
        kvd_mem_free(KVD_MEM_STAGING, order, (rp->n_objs + 1) * sizeof(uint64_t));
        return KVD_ERR_NOMEM;
    }
    for (size_t k = 0; k < n; k++)
        sorted[k] = rp->objs[(uint32_t)order[k]];
    kvd_mem_free(KVD_MEM_STAGING, order, (rp->n_objs + 1) * sizeof(uint64_t));
    restore_counts_t c;
    rc = store_restore_objects(s, sorted, n, free_tag, now_ms, &c);
    kvd_mem_free(KVD_MEM_STAGING, sorted, (n ? n : 1) * sizeof(*sorted));
    if (rc != KVD_OK)
        return rc;
    rec->objects = c.ready;
    rec->bytes = c.ready_bytes;
    rec->writing_discarded = c.writing;
    rec->writing_bytes = c.writing_bytes;
    rec->discarded = c.discarded;
    rec->namespaces = c.namespaces;
    return KVD_OK;
}

int kvd_store_journal_attach(kvd_store_t *s, const kvd_store_journal_opts_t *o,
                             kvd_store_recovery_t *rec, char *why, size_t why_len)
{
    uint64_t t0 = kvd_now_ns();
    memset(rec, 0, sizeof(*rec));
    if (s->persist != NULL || s->n_slots != 0 || s->n_objects != 0) {
        WHY("the store is not empty");
        return KVD_ERR_STATE;
    }
    uint64_t now_ms = o->now_ms ? o->now_ms : kvd_now_ns() / 1000000;
    char tmp[4096 + 8];
    snprintf(tmp, sizeof(tmp), "%s.tmp", o->path);
    unlink(tmp); /* a compaction the daemon died in */
    if (o->fresh && unlink(o->path) != 0 && errno != ENOENT) {
        WHY("cannot remove %s: %s", o->path, strerror(errno));
        return kvd_status_from_errno(errno);
    }

    jnl_header_t old;
    uint64_t t_read = t0, t_built = t0;
    uint32_t flags = (s->n_tenants > 1 ? JNL_F_MULTI_TENANT : 0) |
                     (o->hugepages ? JNL_F_HUGEPAGES : 0);
    /* free space of a pool file that was there holds old bytes of unknown
     * owners, unless the journal accounts for every extent */
    uint16_t free_tag = o->pool_created ? SCRUB_CLEAN : SCRUB_MIXED;
    replay_t rp;
    int rc = replay_init(&rp);
    if (rc != KVD_OK)
        return rc;
    jnl_scan_t scan;
    struct stat st;
    if (o->pool_created && !o->fresh && stat(o->path, &st) == 0) {
        /* the bytes it describes are gone: nothing in it can be right */
        snprintf(rec->note, sizeof(rec->note),
                 "the pool file was gone (a reboot?): the journal there is discarded");
        rc = KVD_ERR_NOT_FOUND;
    } else if (o->fresh || o->pool_created) {
        rc = KVD_ERR_NOT_FOUND;
    } else {
        /* room for as many extents as the file could describe, at once:
         * growing the tables while reading would copy and rehash them */
        if (stat(o->path, &st) == 0 && st.st_size > 0) {
            uint64_t most = (uint64_t)st.st_size / E_WRITING_BYTES;
            most = KVD_MIN(most, s->total_pages);
            if (objs_reserve(&rp, most) != KVD_OK || table_resize(&rp, most) != KVD_OK)
                KVD_DEBUG("persist", "no room to presize the replay of %llu extents",
                          (unsigned long long)most);
        }
        rc = jnl_read(o->path, &old, replay_record, &rp, &scan, why, why_len);
    }
    if (rc == KVD_ERR_STATE && rp.error[0] != '\0')
        WHY("%s is damaged: %s", o->path, rp.error);
    if (rc == KVD_ERR_NOT_FOUND) {
        if (rec->note[0] == '\0')
            snprintf(rec->note, sizeof(rec->note), "%s",
                     o->fresh ? "started fresh: the old pool and journal removed"
                     : o->pool_created
                         ? "a new pool file: nothing to recover"
                         : "no journal: the pool's old bytes are not trusted");
        rc = KVD_OK;
    } else if (rc == KVD_OK) {
        rec->found = true;
        rec->journal_bytes = scan.file_bytes;
        rec->records = scan.records;
        rec->torn_bytes = scan.torn_bytes;
        if (old.flags & JNL_F_INVALID) {
            snprintf(rec->note, sizeof(rec->note),
                     "the journal was marked invalid after a write failed: its objects "
                     "are discarded");
        } else if ((rc = header_matches(s, o, &old, why, why_len)) == KVD_OK) {
            flags |= old.flags & JNL_F_MULTI_TENANT;
            if ((old.flags & JNL_F_MULTI_TENANT) == 0 && s->n_tenants == 1)
                free_tag = (uint16_t)(KVD_TENANT_DEFAULT + 1); /* its own bytes only */
            t_read = kvd_now_ns();
            rc = rebuild(s, &rp, &old, free_tag, now_ms, rec);
            t_built = kvd_now_ns();
        }
    }
    replay_free(&rp);
    if (rc != KVD_OK)
        return rc;
    s->st.recovered_objects = rec->objects;
    s->st.recovered_bytes = rec->bytes;

    /* a fresh journal of what the store holds now, in place of the old */
    struct persist *p = kvd_mem_calloc(KVD_MEM_OTHER, 1, sizeof(*p));
    if (p == NULL)
        return KVD_ERR_NOMEM;
    jnl_header_init(&p->hdr);
    p->hdr.page_bytes = s->cfg.page_bytes;
    p->hdr.pool_bytes = s->total_pages * s->cfg.page_bytes;
    p->hdr.pool_dev = o->pool_dev;
    p->hdr.pool_ino = o->pool_ino;
    p->hdr.epoch_ms = s->epoch_ms;
    memcpy(p->hdr.secret, s->secret, sizeof(p->hdr.secret));
    p->hdr.flags = flags;
    p->compact_min_bytes =
        o->compact_min_bytes ? o->compact_min_bytes : COMPACT_MIN_BYTES;
    p->slice_records = o->slice_records ? o->slice_records : SLICE_RECORDS;
    rc = jnl_new(o->path, &p->j);
    if (rc != KVD_OK) {
        kvd_mem_free(KVD_MEM_OTHER, p, sizeof(*p));
        return rc;
    }
    s->persist = p;
    uint64_t t_snap = kvd_now_ns();
    rc = snapshot_now(s);
    if (rc != KVD_OK) {
        WHY("cannot write the journal %s: %s", o->path, kvd_status_str(rc));
        persist_close(s);
        return rc;
    }
    uint64_t t_end = kvd_now_ns();
    rec->elapsed_ns = t_end - t0;
    rec->read_ns = t_read - t0;
    rec->rebuild_ns = t_built - t_read;
    rec->write_ns = t_end - t_snap;
    return KVD_OK;
}
