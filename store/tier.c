/*
 * tier.c - the SSD tier (kvd_store.h "the SSD tier"): its segments, the
 * places of its records, spills, promotions, compaction, its checkpoint
 * and the rebuild at start. The engine keeps the objects (store_int.h: an
 * SSD object is a record of its own, off_pages its place here); this file
 * decides where records go on disk and drives the executor (tier_io.h),
 * which moves and checks the bytes. The format is segment.h's.
 *
 * Space: the tier is n_segs segment files of seg_blocks blocks each. One
 * segment is the head, written at its end; the others are full, free or
 * being compacted. A place (loc) is seg * seg_blocks + block: the record's
 * header block, its value after it. Each segment counts its live and dead
 * blocks and lists the records written into it (entries go stale as
 * records leave; one is live there while it is an SSD object at a place
 * inside the segment).
 *
 * Reclaim, when the head is full and spills find no free segment: a full
 * segment without live blocks is free at once; one with at least half of
 * its blocks dead is compacted (its live records copied to the head,
 * TIO_COPY), one segment being held back for that; otherwise the tier
 * evicts its own objects, leaf-first from its LRU (store_ssd_evict_one),
 * until one of those holds.
 *
 * Crash safety: a record is written whole before the engine frees the
 * DRAM copy (store_spill_done), and segments are reused only whole, under
 * a new generation. The checkpoint (a clean stop, and every minute when
 * something changed) lists the live records, so a restart reads it and
 * scans only what each segment got after it. A record that stops being
 * its object's (evicted, dropped, promoted, copied by compaction, or
 * written for an object that stayed in DRAM) is named at once in the
 * dead-list (tier.dead: place and generation, CRC-32C each, appended with
 * write(2), so that a process killed at any point has it), and a restart
 * drops the records it names: an object evicted never comes back, nor an
 * older record of its key. A checkpoint written makes the entries made
 * before it began needless (it does not list those records, and its scans
 * begin past them): the file is rewritten without them.
 *
 * Threading: the caller's (the daemon's loop), as the engine's.
 */
#include "store_int.h"
#include "store_testing.h"
#include "tier_io.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#define CKPT_MAGIC    0x4b43564bu /* "KVCK" */
#define CKPT_NAME     "tier.ckpt"
#define DEAD_NAME     "tier.dead"
#define CKPT_EVERY_MS 60000u
#define NO_SEG        UINT32_MAX
#define NO_LOC        UINT32_MAX
/* tags of the group commit's syncs: this bit and a segment's id */
#define SYNC_TAG (1ull << 63)
/* ckpt_read: a segment free at the checkpoint and not begun since */
#define SCAN_NOTHING UINT32_MAX
/* The largest value compaction copies (a bounce buffer of the executor
 * per copy in flight); larger records of a compacted segment are evicted. */
#define COPY_MAX_BYTES (16u << 20)
/* Copies in flight at most, and their values' bytes at most: each holds a
 * bounce buffer of its value in the executor, so the copies' memory is at
 * most COPY_BYTES_MAX (plus a block each). Copies wait behind the spills
 * of a deep queue (~30 ms an op on a disk of 1 GB/s at depth 32), and a
 * segment is freed only once all its live records are copied: 16 of 1 MiB
 * reclaim faster than 4 (bench/RESULTS.md, "compaction"). */
#define COPIES_MAX     16
#define COPY_BYTES_MAX (4ull * COPY_MAX_BYTES)
/* Copies of one compaction that may be tried again after their write
 * failed (the source stays good): past it, what is left is evicted. */
#define COPY_RETRIES_MAX 8
/* Evictions one reclaim may make to create a segment worth compacting. */
#define RECLAIM_EVICT_MAX 256

typedef enum seg_state {
    SEG_FREE = 0,
    SEG_HEAD = 1,
    SEG_FULL = 2,
    SEG_COMPACTING = 3,
} seg_state_t;

typedef struct seg {
    int fd;
    uint64_t generation;
    seg_state_t state;
    uint32_t head;       /* next free block; block 0 is the file header */
    uint32_t live, dead; /* blocks of records, live or not */
    uint32_t reads;      /* ops reading it now (promotions, copies from it) */
    uint32_t writes;     /* ops writing into it now */
    uint32_t *recs;      /* records written into it (stale entries allowed) */
    uint32_t n_recs, cap_recs;
    uint32_t compact_pos;  /* next entry of recs a compaction copies */
    uint32_t copy_retries; /* ... and copies of it queued again (COPY_RETRIES_MAX) */
    bool broken;           /* a failed write's place could not be covered: */
    uint32_t broken_at;    /* ... this block; nothing after it is acknowledged */
    /* its summary (segment.h), built as places are taken, written once the
     * segment is closed and its last write ended (sum_done) */
    seg_sum_ent_t *sum;
    uint32_t n_sum, cap_sum;
    seg_sum_ns_t *sum_ns;
    uint32_t n_sum_ns, cap_sum_ns;
    bool sum_done;
    bool sum_pending; /* its .sum.tmp waits for the next checkpoint's rename */
    bool in_round;    /* its sync is part of the round in flight (group commit) */
    bool sync_failed; /* ... and it failed */
} seg_t;

/* An entry of the dead-list: the record at block `block` of segment `seg`
 * in its generation `generation` is no object's. crc: CRC-32C of the tier's
 * id and the bytes before it, so that a torn tail or another tier's file
 * is ignored. */
typedef struct dead_ent {
    uint32_t seg, block;
    uint64_t generation;
    uint32_t reserved, crc;
} dead_ent_t;

enum op_kind { OP_NONE = 0, OP_SPILL = 1, OP_PROMOTE = 2, OP_COPY = 3 };

typedef struct inflight {
    uint8_t kind;
    bool landed;       /* a write that ended, held until every place before it
                          in its segment is written (the file's comment) */
    int status;        /* ... how it ended */
    bool write_failed; /* copy: it failed writing, not reading (tio_done_t) */
    /* group commit (the file's comment): the write landed and its segment's
     * sync of the round in flight covers it (in_round), or one did (durable) */
    bool in_round, durable;
    bool written;     /* the device took the write (its sync may yet fail) */
    uint32_t rec;     /* the record: DRAM (spill), SSD (promote, copy) */
    uint32_t loc;     /* spill: the place written; promote, copy: read */
    uint32_t dst_loc; /* copy: the place written */
    uint32_t blocks;
    uint64_t t0_ns;
} inflight_t;

struct tier {
    char dir[PATH_MAX];
    int dir_fd, lock_fd;
    tio_t *io;
    bool direct; /* the files are open with O_DIRECT */
    uint64_t tier_id, seq;
    uint32_t seg_blocks, n_segs, page_blocks;
    seg_t *segs;
    uint32_t head;       /* the spills' head segment, or NO_SEG */
    uint32_t copy_head;  /* compaction's */
    uint32_t copies;     /* compaction copies in flight */
    uint64_t copy_bytes; /* ... the bytes of their values */
    /* promotions waiting for an executor slot (SSD records, REC_F_PROMOTING
     * set): started ahead of any copy or spill */
    uint32_t *promote_q, n_promote_q, cap_promote_q;
    uint32_t n_free;
    inflight_t *ops; /* queue_depth slots, by the executor's tag */
    /* n_ops = 2 x the executor's queue depth (qd): a write that landed
     * keeps its entry until those before it land (release_writes), and
     * must not keep the executor from the next. spills and copies count
     * those not landed yet. */
    uint32_t *free_ops, n_free_ops, n_ops, qd, spills;
    uint64_t spill_ns, promote_ns, compactions, copied_bytes;
    uint64_t last_ckpt_ms, changes; /* records added or gone since the checkpoint */
    uint64_t ckpt_every_ms;
    uint32_t ckpt_slice;
    /* the periodic checkpoint, built in slices, written on a thread (ckpt_step) */
    struct ckpt_job *ckpt;
    pthread_t ckpt_tid;
    bool ckpt_running;
    _Atomic bool ckpt_done;
    _Atomic int ckpt_rc;
    _Atomic uint64_t checkpoints; /* written */
    uint64_t recovered;
    bool closing;   /* tier_close: head segments get their summaries too */
    bool fail_pads; /* test hook (kvd_tier_opts_t.fail_pad_writes) */
    /* group commit: off (kvd_tier_opts_t.no_sync) makes a write durable as
     * it lands; hold_syncs is the test hook that submits no round */
    bool sync_on, hold_syncs;
    uint32_t round_syncs; /* syncs of the round in flight; 0: no round */
    bool dead_dirty;      /* the dead-list was appended since its last sync began */
    /* entries appended to the dead-list, those of them known durable (a
     * sync or rewrite that ended after them), and the count a round's sync
     * of it covers (kvd_store_tier_sync_dead) */
    uint64_t dead_appended, dead_durable, dead_round_mark;
    uint64_t dead_syncs;      /* kvd_store_tier_sync_dead's own fdatasyncs */
    uint32_t fail_dead_syncs; /* test hook: those of them still to fail (EIO) */
    /* the dead-list's fd the round's sync is on, or -1: a rewrite that
     * replaces it leaves it open until that sync ends */
    int dead_sync_fd;
    /* the dead-list: its file (appended) and what was appended since it
     * was last rewritten (dead_rewrite) */
    int dead_fd;
    dead_ent_t *dead;
    uint32_t n_dead, cap_dead;
    bool dead_lost; /* an entry is not in `dead` (memory): keep the file whole */
    char note[256];
};

static void write_pad(struct tier *t, uint32_t loc, uint32_t blocks);
static void seg_break(struct tier *t, uint32_t loc);
static bool ckpt_reap(struct tier *t, bool wait);
static void ckpt_step(kvd_store_t *s, bool due);

/* ------------------------------------------------------------- places */

static seg_t *seg_of(struct tier *t, uint32_t loc)
{
    return &t->segs[loc / t->seg_blocks];
}

static uint32_t rec_blocks(const struct tier *t, const rec_t *r)
{
    return 1 + r->size_pages * t->page_blocks;
}

static uint64_t block_bytes(uint64_t blocks)
{
    return blocks * SEG_BLOCK;
}

static void seg_push(seg_t *g, uint32_t rec)
{
    if (g->n_recs == g->cap_recs) {
        uint32_t cap = g->cap_recs ? 2 * g->cap_recs : 256;
        uint32_t *r = kvd_mem_realloc(KVD_MEM_INDEX, g->recs, (size_t)g->cap_recs * 4,
                                      (size_t)cap * 4);
        if (r == NULL)
            return; /* compaction then cannot find it: it stays until evicted */
        g->recs = r;
        g->cap_recs = cap;
    }
    g->recs[g->n_recs++] = rec;
}

/* ------------------------------------------------------------- dead-list */

static bool grow(void **v, uint32_t n, uint32_t *cap, size_t size);
static int write_all(int fd, const void *buf, size_t len);

static uint32_t dead_crc(const struct tier *t, const dead_ent_t *e)
{
    uint32_t crc = kvd_crc32c(0, &t->tier_id, sizeof(t->tier_id));
    return kvd_crc32c(crc, e, offsetof(dead_ent_t, crc));
}

/* Names the record at place loc dead (the file's comment): appended to the
 * file at once, and kept for the file's next rewrite. A write that fails is
 * logged: the record may come back at a restart. */
static void dead_add(struct tier *t, uint32_t loc)
{
    if (t->dead_fd < 0)
        return; /* an attach that failed undoes its restore: nothing to name */
    uint32_t id = loc / t->seg_blocks;
    dead_ent_t e = {
        .seg = id, .block = loc % t->seg_blocks, .generation = t->segs[id].generation};
    e.crc = dead_crc(t, &e);
    ssize_t n = write(t->dead_fd, &e, sizeof(e));
    t->dead_dirty = true; /* the next round syncs it */
    t->dead_appended++;
    if (n != (ssize_t)sizeof(e))
        KVD_WARN("tier", "%s/%s: %s: a record gone may come back at a restart", t->dir,
                 DEAD_NAME, n < 0 ? strerror(errno) : "short write");
    if (!grow((void **)&t->dead, t->n_dead, &t->cap_dead, sizeof(e))) {
        t->dead_lost = true;
        return;
    }
    t->dead[t->n_dead++] = e;
}

/* A checkpoint that began when `from` entries had been kept is written:
 * rewrites the dead-list with the entries made since (tmp file, fsync,
 * rename, fsync of the directory) and appends to it from now on. */
static void dead_rewrite(struct tier *t, uint32_t from)
{
    if (t->dead_lost || from > t->n_dead)
        return; /* what the file has beyond memory stays */
    int fd = openat(t->dir_fd, DEAD_NAME ".tmp",
                    O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0600);
    int rc = fd < 0 ? kvd_status_from_errno(errno)
                    : write_all(fd, t->dead + from,
                                (size_t)(t->n_dead - from) * sizeof(dead_ent_t));
    if (rc == KVD_OK &&
        (fsync(fd) != 0 ||
         renameat(t->dir_fd, DEAD_NAME ".tmp", t->dir_fd, DEAD_NAME) != 0 ||
         fsync(t->dir_fd) != 0))
        rc = kvd_status_from_errno(errno);
    if (rc != KVD_OK) {
        KVD_WARN("tier", "rewriting %s/%s: %s (it keeps its older entries)", t->dir,
                 DEAD_NAME, kvd_status_str(rc));
        if (fd >= 0)
            close(fd);
        unlinkat(t->dir_fd, DEAD_NAME ".tmp", 0);
        return;
    }
    if (t->dead_fd >= 0 && t->dead_fd != t->dead_sync_fd)
        close(t->dead_fd); /* (else closed as its sync ends) */
    t->dead_fd = fd;
    t->dead_dirty = false; /* what it holds was fsync'd just now */
    t->dead_durable = t->dead_appended;
    if (from > 0) /* (t->dead is NULL while nothing was named) */
        memmove(t->dead, t->dead + from, (size_t)(t->n_dead - from) * sizeof(dead_ent_t));
    t->n_dead -= from;
}

/* Opens the dead-list for appending (creating it). */
static int dead_open(struct tier *t)
{
    t->dead_fd =
        openat(t->dir_fd, DEAD_NAME, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    return t->dead_fd < 0 ? kvd_status_from_errno(errno) : KVD_OK;
}

static int loc_cmp(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

/* Reads the dead-list at start: the places it names in the segments'
 * present generations, sorted, into *out (NULL and 0 when none). A torn or
 * foreign entry ends it. */
static void dead_read(struct tier *t, uint32_t **out, size_t *n_out)
{
    *out = NULL;
    *n_out = 0;
    int fd = openat(t->dir_fd, DEAD_NAME, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    struct stat st;
    size_t n = fstat(fd, &st) == 0 ? (size_t)st.st_size / sizeof(dead_ent_t) : 0;
    dead_ent_t *v = malloc((n ? n : 1) * sizeof(dead_ent_t));
    uint32_t *locs = malloc((n ? n : 1) * sizeof(uint32_t));
    if (v != NULL && locs != NULL &&
        pread(fd, v, n * sizeof(dead_ent_t), 0) == (ssize_t)(n * sizeof(dead_ent_t))) {
        for (size_t k = 0; k < n && v[k].crc == dead_crc(t, &v[k]); k++)
            if (v[k].seg < t->n_segs && v[k].block < t->seg_blocks &&
                v[k].generation == t->segs[v[k].seg].generation &&
                t->segs[v[k].seg].state != SEG_FREE)
                locs[(*n_out)++] = v[k].seg * t->seg_blocks + v[k].block;
    }
    close(fd);
    free(v);
    if (*n_out == 0) {
        free(locs);
        return;
    }
    qsort(locs, *n_out, sizeof(uint32_t), loc_cmp);
    *out = locs;
}

/* ------------------------------------------------------------- summaries */

static void seg_name(uint32_t id, char *buf, size_t len);
static void sum_name(uint32_t id, char *buf, size_t len)
{
    snprintf(buf, len, "seg-%06u.sum", id);
}

/* Frees segment g's summary buffers. */
static void sum_free(seg_t *g)
{
    kvd_mem_free(KVD_MEM_INDEX, g->sum, (size_t)g->cap_sum * sizeof(*g->sum));
    kvd_mem_free(KVD_MEM_INDEX, g->sum_ns, (size_t)g->cap_sum_ns * sizeof(*g->sum_ns));
    g->sum = NULL;
    g->sum_ns = NULL;
    g->n_sum = g->cap_sum = g->n_sum_ns = g->cap_sum_ns = 0;
}

/* Grows an array of `size`-byte items to hold one more; false out of memory. */
static bool grow(void **v, uint32_t n, uint32_t *cap, size_t size)
{
    if (n < *cap)
        return true;
    uint32_t c = *cap ? 2 * *cap : 64;
    void *p = kvd_mem_realloc(KVD_MEM_INDEX, *v, (size_t)*cap * size, (size_t)c * size);
    if (p == NULL)
        return false;
    *v = p;
    *cap = c;
    return true;
}

/* Notes in segment g's summary the record of object r (of store s) at
 * place `block`. Out of memory the summary is given up: a restart then
 * scans the segment. */
static void sum_add(kvd_store_t *s, seg_t *g, uint32_t block, uint32_t blocks,
                    uint64_t seq, const rec_t *r)
{
    if (g->sum_done)
        return;
    const ns_entry_t *e = &s->ns[r->ns];
    const char *tenant = kvd_store_tenant_name(s, e->info.tenant);
    uint32_t k = 0;
    while (k < g->n_sum_ns && !(g->sum_ns[k].object_bytes == e->info.object_bytes &&
                                strcmp(g->sum_ns[k].name, e->info.name) == 0 &&
                                strcmp(g->sum_ns[k].tenant, tenant) == 0))
        k++;
    if (k == g->n_sum_ns) {
        if (k == UINT16_MAX ||
            !grow((void **)&g->sum_ns, g->n_sum_ns, &g->cap_sum_ns, sizeof(*g->sum_ns))) {
            sum_free(g);
            g->sum_done = true;
            return;
        }
        seg_sum_ns_t *x = &g->sum_ns[g->n_sum_ns++];
        memset(x, 0, sizeof(*x));
        snprintf(x->tenant, sizeof(x->tenant), "%s", tenant);
        memcpy(x->name, e->info.name, sizeof(x->name));
        x->object_bytes = e->info.object_bytes;
        x->rank_replicated = e->info.rank_replicated;
    }
    if (!grow((void **)&g->sum, g->n_sum, &g->cap_sum, sizeof(*g->sum))) {
        sum_free(g);
        g->sum_done = true;
        return;
    }
    seg_sum_ent_t *x = &g->sum[g->n_sum++];
    *x = (seg_sum_ent_t){.block = block,
                         .blocks = blocks,
                         .seq = seq,
                         .depth = r->depth,
                         .last_access_s = r->last_access_s,
                         .hits = r->hits,
                         .ns = (uint16_t)k,
                         .has_parent = r->has_parent};
    memcpy(x->key, r->key, KVD_KEY_BYTES);
    memcpy(x->parent_tag, r->parent_tag, KVD_KEY_TAG_BYTES);
}

/* The place at `block` was not written after all (given back, or covered
 * by a pad record). */
static void sum_unlist(seg_t *g, uint32_t block)
{
    if (g->n_sum > 0 && g->sum[g->n_sum - 1].block == block) {
        g->n_sum--;
        return;
    }
    uint32_t lo = 0, hi = g->n_sum;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (g->sum[mid].block < block)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo < g->n_sum && g->sum[lo].block == block)
        g->sum[lo].pad = 1;
}

/* Writes segment id's summary once it is closed and its writes ended, as
 * seg-NNNNNN.sum.tmp: the next checkpoint renames it in place after it
 * flushed the segments (ckpt_write), so that a summary never lists records
 * the device may not have (a power loss); until then a restart scans. */
static void sum_maybe_write(struct tier *t, uint32_t id)
{
    seg_t *g = &t->segs[id];
    if (g->sum_done || g->writes > 0 || g->state == SEG_FREE ||
        (g->state == SEG_HEAD && !t->closing))
        return;
    g->sum_done = true;
    seg_sum_hdr_t h = {.magic = SEG_SUM_MAGIC,
                       .version = SEG_VERSION,
                       .tier_id = t->tier_id,
                       .generation = g->generation,
                       .seg_id = id,
                       .end_block = g->head,
                       .n_ns = g->n_sum_ns,
                       .n_ent = g->n_sum};
    size_t ns_bytes = (size_t)g->n_sum_ns * sizeof(*g->sum_ns),
           ent_bytes = (size_t)g->n_sum * sizeof(*g->sum);
    uint32_t crc = kvd_crc32c(0, &h, offsetof(seg_sum_hdr_t, crc));
    crc = kvd_crc32c(crc, g->sum_ns, ns_bytes);
    h.crc = kvd_crc32c(crc, g->sum, ent_bytes);
    char name[32], tmp[40];
    sum_name(id, name, sizeof(name));
    snprintf(tmp, sizeof(tmp), "%s.tmp", name);
    int fd = openat(t->dir_fd, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    int rc = fd < 0 ? kvd_status_from_errno(errno) : write_all(fd, &h, sizeof(h));
    if (rc == KVD_OK && ns_bytes)
        rc = write_all(fd, g->sum_ns, ns_bytes);
    if (rc == KVD_OK && ent_bytes)
        rc = write_all(fd, g->sum, ent_bytes);
    if (fd >= 0)
        close(fd);
    if (rc != KVD_OK) {
        KVD_WARN("tier", "writing the summary of segment %u: %s (a restart scans it)", id,
                 kvd_status_str(rc));
        unlinkat(t->dir_fd, tmp, 0);
    } else {
        g->sum_pending = true;
    }
    sum_free(g);
}

/* A segment that holds nothing live and that nobody reads or writes
 * becomes free. */
static void seg_maybe_free(struct tier *t, uint32_t id)
{
    seg_t *g = &t->segs[id];
    if ((g->state != SEG_FULL && g->state != SEG_COMPACTING) || g->live || g->reads ||
        g->writes)
        return;
    if (g->state == SEG_COMPACTING)
        t->compactions++;
    g->state = SEG_FREE;
    g->head = g->live = g->dead = g->n_recs = g->compact_pos = g->copy_retries = 0;
    t->n_free++;
}

/* Writes a segment's header block (its new generation): synchronous, one
 * block, when a segment is begun. */
static int seg_begin(struct tier *t, uint32_t id)
{
    seg_t *g = &t->segs[id];
    void *blk;
    if (posix_memalign(&blk, SEG_BLOCK, SEG_BLOCK) != 0)
        return KVD_ERR_NOMEM;
    memset(blk, 0, SEG_BLOCK);
    seg_file_hdr_t *h = blk;
    *h = (seg_file_hdr_t){.magic = SEG_FILE_MAGIC,
                          .version = SEG_VERSION,
                          .seg_bytes = block_bytes(t->seg_blocks),
                          .seg_id = id,
                          .block = SEG_BLOCK,
                          .generation = g->generation + 1,
                          .tier_id = t->tier_id,
                          .created_ms = kvd_wall_ms()};
    h->crc = kvd_crc32c(0, h, offsetof(seg_file_hdr_t, crc));
    ssize_t n = pwrite(g->fd, blk, SEG_BLOCK, 0);
    int err = errno;
    free(blk);
    if (n != (ssize_t)SEG_BLOCK) {
        KVD_ERROR("tier", "segment %u: writing its header: %s", id,
                  n < 0 ? strerror(err) : "short write");
        return n < 0 ? kvd_status_from_errno(err) : KVD_ERR_IO;
    }
    g->generation++;
    g->state = SEG_HEAD;
    g->head = 1;
    char name[32], tmp[40];
    sum_name(id, name, sizeof(name));
    snprintf(tmp, sizeof(tmp), "%s.tmp", name);
    unlinkat(t->dir_fd, name, 0); /* of a generation gone */
    unlinkat(t->dir_fd, tmp, 0);
    sum_free(g);
    g->sum_done = g->sum_pending = false;
    g->live = g->dead = g->n_recs = g->compact_pos = g->copy_retries = 0;
    g->broken = false;
    t->n_free--;
    return KVD_OK;
}

/* A place for a record of `blocks` blocks at the end of a head segment:
 * spills' or compaction's (copy), each its own, so that spills never fill
 * what compaction needs. A full head gives way to a free segment; spills
 * leave the last free one to compaction. NO_LOC when there is none. */
static uint32_t place_take(struct tier *t, uint32_t blocks, bool copy)
{
    uint32_t *head = copy ? &t->copy_head : &t->head;
    if (blocks >= t->seg_blocks)
        return NO_LOC;
    for (int tries = 0; tries < 2; tries++) {
        if (*head != NO_SEG) {
            seg_t *g = &t->segs[*head];
            if (g->head + blocks <= t->seg_blocks) {
                uint32_t loc = *head * t->seg_blocks + g->head;
                g->head += blocks;
                g->writes++;
                return loc;
            }
            g->state = SEG_FULL;
            uint32_t was = *head;
            *head = NO_SEG;
            sum_maybe_write(t, was);
            seg_maybe_free(t, was);
        }
        if (t->n_free <= (copy ? 0u : 1u))
            return NO_LOC;
        uint32_t id = 0;
        while (t->segs[id].state != SEG_FREE)
            id++;
        if (seg_begin(t, id) != KVD_OK)
            return NO_LOC;
        *head = id;
    }
    return NO_LOC;
}

/* Slots spills and copies may take together: an eighth (at least one) is
 * left to promotions, which a load waits for; they also wait in a queue of
 * their own that goes before any spill (promote_pending). */
static uint32_t background_slots(const struct tier *t)
{
    return t->qd > 1 ? t->qd - KVD_MAX(1u, t->qd / 8) : 1;
}

/* Gives back the place place_take just gave (nothing was written there,
 * and nothing was taken after it): the head leaves no hole. */
static void place_untake(struct tier *t, uint32_t loc, uint32_t blocks)
{
    seg_t *g = seg_of(t, loc);
    g->writes--;
    if (loc % t->seg_blocks + blocks == g->head) {
        g->head -= blocks;
        sum_unlist(g, loc % t->seg_blocks);
    } else {
        write_pad(t, loc, blocks);
    }
}

/* ---------------------------------------------------------- executor */

static inflight_t *op_take(struct tier *t, uint64_t *tag)
{
    if (t->n_free_ops == 0)
        return NULL;
    uint32_t k = t->free_ops[--t->n_free_ops];
    *tag = k;
    t->ops[k] = (inflight_t){.t0_ns = kvd_now_ns()};
    return &t->ops[k];
}

static void op_put(struct tier *t, uint64_t tag)
{
    t->ops[tag].kind = OP_NONE;
    t->ops[tag].landed = false;
    t->ops[tag].write_failed = false;
    t->ops[tag].in_round = t->ops[tag].durable = t->ops[tag].written = false;
    t->free_ops[t->n_free_ops++] = (uint32_t)tag;
}

static bool submit(struct tier *t, const tio_op_t *op)
{
    return tio_submit(t->io, op, 1) == 1;
}

bool tier_spill_begin(kvd_store_t *s, uint32_t i)
{
    struct tier *t = s->tier;
    const rec_t *r = R(s, i);
    if (t->spills + t->copies >= background_slots(t) || t->n_promote_q > 0)
        return false;
    uint32_t blocks = rec_blocks(t, r);
    uint32_t loc = place_take(t, blocks, false);
    if (loc == NO_LOC)
        return false;
    sum_add(s, seg_of(t, loc), loc % t->seg_blocks, blocks, t->seq, r); /* seq: h->seq */
    uint64_t tag = 0;
    inflight_t *f = op_take(t, &tag);
    const ns_entry_t *e = &s->ns[r->ns];
    tio_op_t op = {.tag = tag,
                   .kind = TIO_WRITE,
                   .fd = seg_of(t, loc)->fd,
                   .file_off = block_bytes(loc % t->seg_blocks),
                   .pool_off = (uint64_t)r->off_pages * s->cfg.page_bytes,
                   .value_bytes = block_bytes(blocks - 1)};
    seg_rec_hdr_t *h = &op.hdr;
    h->magic = SEG_REC_MAGIC;
    h->version = SEG_VERSION;
    h->seq = t->seq++;
    h->generation = seg_of(t, loc)->generation;
    h->value_bytes = op.value_bytes;
    h->object_bytes = e->info.object_bytes;
    memcpy(h->key, r->key, KVD_KEY_BYTES);
    memcpy(h->parent_tag, r->parent_tag, KVD_KEY_TAG_BYTES);
    h->has_parent = r->has_parent;
    h->depth = r->depth;
    h->last_access_s = r->last_access_s;
    h->hits = r->hits;
    h->rank_replicated = e->info.rank_replicated;
    snprintf(h->tenant, sizeof(h->tenant), "%s",
             kvd_store_tenant_name(s, e->info.tenant));
    memcpy(h->ns, e->info.name, sizeof(h->ns));
    if (f == NULL || !submit(t, &op)) {
        if (f != NULL)
            op_put(t, tag);
        place_untake(t, loc, blocks);
        return false;
    }
    *f = (inflight_t){
        .kind = OP_SPILL, .rec = i, .loc = loc, .blocks = blocks, .t0_ns = f->t0_ns};
    t->spills++;
    return true;
}

/* Submits the read of SSD record i into DRAM extent j; false when the
 * executor has no slot. */
static bool promote_submit(kvd_store_t *s, uint32_t i, uint32_t j)
{
    struct tier *t = s->tier;
    const rec_t *r = R(s, i);
    uint64_t tag = 0;
    inflight_t *f = op_take(t, &tag);
    if (f == NULL)
        return false;
    uint32_t blocks = rec_blocks(t, r);
    tio_op_t op = {.tag = tag,
                   .kind = TIO_READ,
                   .fd = seg_of(t, r->off_pages)->fd,
                   .file_off = block_bytes(r->off_pages % t->seg_blocks),
                   .pool_off = (uint64_t)R(s, j)->off_pages * s->cfg.page_bytes,
                   .value_bytes = block_bytes(blocks - 1)};
    memcpy(op.key, r->key, KVD_KEY_BYTES);
    if (!submit(t, &op)) {
        op_put(t, tag);
        return false;
    }
    *f = (inflight_t){.kind = OP_PROMOTE,
                      .rec = i,
                      .loc = r->off_pages,
                      .blocks = blocks,
                      .t0_ns = f->t0_ns};
    return true;
}

bool tier_promote_begin(kvd_store_t *s, uint32_t i, uint32_t j)
{
    struct tier *t = s->tier;
    seg_t *g = seg_of(t, R(s, i)->off_pages);
    g->reads++; /* from here until the read ends: the segment stays */
    if (t->n_promote_q == 0 && promote_submit(s, i, j))
        return true;
    if (t->n_promote_q == t->cap_promote_q) {
        uint32_t cap = t->cap_promote_q ? 2 * t->cap_promote_q : 256;
        uint32_t *q = kvd_mem_realloc(KVD_MEM_STAGING, t->promote_q,
                                      (size_t)t->cap_promote_q * 4, (size_t)cap * 4);
        if (q == NULL) {
            g->reads--;
            return false;
        }
        t->promote_q = q;
        t->cap_promote_q = cap;
    }
    t->promote_q[t->n_promote_q++] = i;
    return true;
}

/* Starts the promotions waiting for a slot, oldest first. */
static void promote_pending(kvd_store_t *s)
{
    struct tier *t = s->tier;
    uint32_t k = 0;
    while (k < t->n_promote_q &&
           promote_submit(s, t->promote_q[k], R(s, t->promote_q[k])->phys_prev))
        k++;
    if (k == 0)
        return;
    memmove(t->promote_q, t->promote_q + k, (size_t)(t->n_promote_q - k) * 4);
    t->n_promote_q -= k;
}

void tier_checkpoint_soon(kvd_store_t *s)
{
    s->tier->changes++;
    s->tier->last_ckpt_ms = 0;
}

void tier_forget(kvd_store_t *s, uint32_t i)
{
    struct tier *t = s->tier;
    const rec_t *r = R(s, i);
    seg_t *g = seg_of(t, r->off_pages);
    uint32_t blocks = rec_blocks(t, r);
    g->live -= KVD_MIN(g->live, blocks);
    g->dead += blocks;
    t->changes++;
    dead_add(t, r->off_pages);
    seg_maybe_free(t, r->off_pages / t->seg_blocks);
}

void tier_spill_lost(kvd_store_t *s, uint32_t i)
{
    struct tier *t = s->tier;
    /* 2 x queue_depth slots, once per lost object being spilled */
    for (uint32_t k = 0; k < t->n_ops; k++)
        if (t->ops[k].kind == OP_SPILL && t->ops[k].rec == i) {
            /* done_spill names it again (store_spill_done drops it): a
             * checkpoint begun in between rewrites the dead-list without
             * this entry, and the record may land after that checkpoint's
             * scan limit */
            dead_add(t, t->ops[k].loc);
            return;
        }
}

/* ---------------------------------------------------------- reclaim */

/* Whether SSD record i is live at a place inside segment id. */
static bool live_in(const kvd_store_t *s, uint32_t i, uint32_t id)
{
    const rec_t *r = R(s, i);
    return i != NIL && i <= s->rec_high && r->state == REC_READY &&
           r->tier == KVD_TIER_SSD && r->off_pages / s->tier->seg_blocks == id;
}

/* Submits the copy of SSD record i (live in segment id) to compaction's
 * head: KVD_OK, KVD_ERR_BUSY when the executor or the copy limit has no
 * room now, KVD_ERR_NO_SPACE when no place can be had. */
static int copy_submit(kvd_store_t *s, uint32_t id, uint32_t i)
{
    struct tier *t = s->tier;
    seg_t *g = &t->segs[id];
    const rec_t *r = R(s, i);
    uint32_t blocks = rec_blocks(t, r);
    uint64_t value = block_bytes(blocks - 1);
    if (t->n_free_ops == 0 || t->copies >= COPIES_MAX ||
        t->copy_bytes + value > COPY_BYTES_MAX ||
        t->spills + t->copies >= background_slots(t))
        return KVD_ERR_BUSY;
    uint32_t dst = place_take(t, blocks, true);
    if (dst == NO_LOC)
        return KVD_ERR_NO_SPACE;
    /* the copy is a record of its own, newer than its source: a restart
     * that finds both (the source's segment not yet begun again) keeps it */
    uint64_t seq = t->seq++;
    sum_add(s, seg_of(t, dst), dst % t->seg_blocks, blocks, seq, r);
    uint64_t tag = 0;
    inflight_t *f = op_take(t, &tag);
    tio_op_t op = {.tag = tag,
                   .kind = TIO_COPY,
                   .fd = g->fd,
                   .file_off = block_bytes(r->off_pages % t->seg_blocks),
                   .value_bytes = block_bytes(blocks - 1),
                   .dst_fd = seg_of(t, dst)->fd,
                   .dst_off = block_bytes(dst % t->seg_blocks),
                   .dst_generation = seg_of(t, dst)->generation,
                   .dst_seq = seq};
    memcpy(op.key, r->key, KVD_KEY_BYTES);
    if (!submit(t, &op)) {
        op_put(t, tag);
        place_untake(t, dst, blocks);
        return KVD_ERR_BUSY;
    }
    *f = (inflight_t){.kind = OP_COPY,
                      .rec = i,
                      .loc = r->off_pages,
                      .dst_loc = dst,
                      .blocks = blocks,
                      .t0_ns = f->t0_ns};
    g->reads++;
    t->copies++;
    t->copy_bytes += value;
    return KVD_OK;
}

/* Queues copies of a compacting segment's live records, as far as the
 * executor and the copy limit take them. A record too large to copy
 * (COPY_MAX_BYTES), or one for which no place can be had, is evicted
 * instead: compaction always ends. Once the list is walked with nothing of
 * the segment in flight, what is still live there (a record the list
 * missed) is evicted too. */
static void compact_more(kvd_store_t *s, uint32_t id)
{
    struct tier *t = s->tier;
    seg_t *g = &t->segs[id];
    while (g->compact_pos < g->n_recs) {
        uint32_t i = g->recs[g->compact_pos];
        if (!live_in(s, i, id) || (R(s, i)->spare & REC_F_PROMOTING)) {
            g->compact_pos++; /* gone, or leaving (its promotion reads it) */
            continue;
        }
        int rc = block_bytes(rec_blocks(t, R(s, i)) - 1) > COPY_MAX_BYTES
                     ? KVD_ERR_NO_SPACE
                     : copy_submit(s, id, i);
        if (rc == KVD_ERR_BUSY)
            return;
        if (rc == KVD_ERR_NO_SPACE)
            store_ssd_evict(s, i);
        g->compact_pos++;
    }
    if (g->live == 0 || g->reads > 0 || g->writes > 0)
        return;
    for (uint32_t i = 1; i <= s->rec_high && g->live > 0; i++)
        if (live_in(s, i, id) && !(R(s, i)->spare & REC_F_PROMOTING))
            store_ssd_evict(s, i);
    if (g->live > 0 && g->reads == 0) {
        KVD_WARN("tier", "segment %u: %u blocks counted live that no record holds; freed",
                 id, g->live);
        g->live = 0;
        seg_maybe_free(t, id);
    }
}

/* Makes free segments when spills lack them (see the file's comment). */
static void reclaim(kvd_store_t *s)
{
    struct tier *t = s->tier;
    for (uint32_t id = 0; id < t->n_segs; id++) {
        if (t->segs[id].state == SEG_COMPACTING) {
            compact_more(s, id);
            return; /* one at a time */
        }
    }
    if (t->n_free >= 2)
        return;
    for (int round = 0; round <= RECLAIM_EVICT_MAX; round++) {
        uint32_t best = NO_SEG;
        for (uint32_t id = 0; id < t->n_segs; id++) {
            seg_t *g = &t->segs[id];
            if (g->state == SEG_FULL && (best == NO_SEG || g->dead > t->segs[best].dead))
                best = id;
        }
        if (best == NO_SEG)
            return;
        seg_t *g = &t->segs[best];
        if (g->live == 0) {
            seg_maybe_free(t, best);
            if (t->n_free >= 2)
                return;
            continue;
        }
        if (2ull * g->dead >= (uint64_t)g->live + g->dead) {
            g->state = SEG_COMPACTING;
            g->compact_pos = g->copy_retries = 0;
            compact_more(s, best);
            return;
        }
        if (!store_ssd_evict_one(s))
            return;
    }
}

/* ------------------------------------------------------- completions */

/* The place a write op writes. */
static uint32_t write_loc(const inflight_t *f)
{
    return f->kind == OP_COPY ? f->dst_loc : f->loc;
}

/* A hole at place loc (a write whose place could not be covered, or one
 * whose sync failed: either may be torn on the device): nothing more goes
 * into its segment, and what was written after it is not acknowledged, as
 * a scan at start stops at the hole. */
static void seg_break(struct tier *t, uint32_t loc)
{
    seg_t *g = seg_of(t, loc);
    uint32_t id = loc / t->seg_blocks;
    if (t->head == id || t->copy_head == id) {
        g->state = SEG_FULL;
        t->head = t->head == id ? NO_SEG : t->head;
        t->copy_head = t->copy_head == id ? NO_SEG : t->copy_head;
    }
    /* its summary must not claim what follows the hole */
    sum_free(g);
    g->sum_done = true;
    if (!g->broken || loc % t->seg_blocks < g->broken_at)
        g->broken_at = loc % t->seg_blocks;
    g->broken = true;
    t->changes++;
    t->last_ckpt_ms = 0; /* checkpoint at the next poll */
}

/* Covers a place whose write failed with a pad record, so that a scan at
 * start goes on past it; synchronous, one block (made durable by the next
 * sync round of its segment, before anything after it is acknowledged). */
static void write_pad(struct tier *t, uint32_t loc, uint32_t blocks)
{
    seg_t *g = seg_of(t, loc);
    sum_unlist(g, loc % t->seg_blocks);
    void *blk;
    if (posix_memalign(&blk, SEG_BLOCK, SEG_BLOCK) != 0)
        return;
    memset(blk, 0, SEG_BLOCK);
    seg_rec_hdr_t *h = blk;
    h->magic = SEG_REC_MAGIC;
    h->version = SEG_VERSION;
    h->generation = g->generation;
    h->seq = t->seq++;
    h->value_bytes = block_bytes(blocks - 1);
    h->flags = SEG_REC_PAD;
    seg_rec_seal(blk);
    if (t->fail_pads)
        errno = EIO; /* the test hook: as if the device refused it */
    if (t->fail_pads ||
        pwrite(g->fd, blk, SEG_BLOCK, (off_t)block_bytes(loc % t->seg_blocks)) !=
            (ssize_t)SEG_BLOCK) {
        /* the device refuses even that: nothing more goes into this
         * segment, and what follows the hole waits for the checkpoint */
        KVD_ERROR("tier",
                  "segment %u: cannot cover a failed write: %s; the segment is "
                  "closed",
                  loc / t->seg_blocks, strerror(errno));
        seg_break(t, loc);
    }
    free(blk);
}

/* A spill's write acknowledged (durable) or failed. `keep`: it failed
 * although the DRAM copy is good and the device wrote it (its place lies
 * past a hole, where a restart's scan stops): the object stays in DRAM,
 * and a later spill writes it elsewhere (the broken segment is closed). A
 * write the device refused drops the object, as eviction without a tier
 * would (a failing device must not keep a spill loop going). */
static void done_spill(kvd_store_t *s, const inflight_t *f, const tio_done_t *d,
                       bool keep)
{
    struct tier *t = s->tier;
    seg_t *g = seg_of(t, f->loc);
    g->writes--;
    uint32_t j = store_spill_done(s, f->rec, d->status, f->loc, keep);
    if (j != NIL) {
        g->live += f->blocks;
        seg_push(g, j);
        t->changes++;
        t->spill_ns += kvd_now_ns() - f->t0_ns;
    } else {
        g->dead += f->blocks;
        if (f->written)
            dead_add(t,
                     f->loc); /* written (perhaps), for an object that stayed in DRAM */
    }
    sum_maybe_write(t, f->loc / t->seg_blocks);
    seg_maybe_free(t, f->loc / t->seg_blocks);
}

static void done_promote(kvd_store_t *s, const inflight_t *f, const tio_done_t *d)
{
    struct tier *t = s->tier;
    seg_of(t, f->loc)->reads--; /* taken at tier_promote_begin */
    if (d->status == KVD_OK)
        t->promote_ns += kvd_now_ns() - f->t0_ns;
    else
        KVD_WARN("tier",
                 "promotion from segment %u block %u failed: %s; the object is "
                 "dropped",
                 f->loc / t->seg_blocks, f->loc % t->seg_blocks,
                 kvd_status_str(d->status));
    store_promote_done(s, f->rec, d->status); /* may forget f->loc: reads is down */
    seg_maybe_free(t, f->loc / t->seg_blocks);
}

/* A copy of a record still live at its source failed. A source that
 * failed its read or its check is dropped (a promotion would fail too).
 * Otherwise the copy was not made (its write failed, or it lies past a
 * hole where a restart's scan stops): the source is good and the object
 * stays readable there; the compaction tries it again (COPY_RETRIES_MAX)
 * and evicts what is still there when it is done (compact_more). */
static void copy_failed(kvd_store_t *s, const inflight_t *f, const tio_done_t *d)
{
    struct tier *t = s->tier;
    seg_t *from = seg_of(t, f->loc);
    if (d->status == KVD_ERR_CORRUPT || (d->status == KVD_ERR_IO && !d->write_failed)) {
        KVD_WARN("tier",
                 "compaction: the record at segment %u block %u failed: %s; the "
                 "object is dropped",
                 f->loc / t->seg_blocks, f->loc % t->seg_blocks,
                 kvd_status_str(d->status));
        store_ssd_drop(s, f->rec);
        return;
    }
    KVD_WARN("tier",
             "compaction: copying the record at segment %u block %u to segment %u "
             "block %u failed: %s; it stays where it is",
             f->loc / t->seg_blocks, f->loc % t->seg_blocks, f->dst_loc / t->seg_blocks,
             f->dst_loc % t->seg_blocks, kvd_status_str(d->status));
    if (from->state == SEG_COMPACTING && from->copy_retries < COPY_RETRIES_MAX) {
        from->copy_retries++;
        seg_push(from, f->rec);
    }
}

static void done_copy(kvd_store_t *s, const inflight_t *f, const tio_done_t *d)
{
    struct tier *t = s->tier;
    seg_t *from = seg_of(t, f->loc), *to = seg_of(t, f->dst_loc);
    from->reads--;
    to->writes--;
    rec_t *r = R(s, f->rec);
    bool still = live_in(s, f->rec, f->loc / t->seg_blocks) && r->off_pages == f->loc;
    if (d->status == KVD_OK && still && !(r->spare & REC_F_PROMOTING)) {
        r->off_pages = f->dst_loc;
        dead_add(t, f->loc); /* the source: the copy is the object's record now */
        from->live -= KVD_MIN(from->live, f->blocks);
        from->dead += f->blocks;
        to->live += f->blocks;
        seg_push(to, f->rec);
        t->copied_bytes += block_bytes(f->blocks);
        t->changes++;
    } else {
        to->dead += f->blocks;
        if (d->status == KVD_OK)
            dead_add(t, f->dst_loc); /* a copy of an object gone meanwhile */
        if (d->status != KVD_OK && still && !(r->spare & REC_F_PROMOTING))
            copy_failed(s, f, d);
    }
    sum_maybe_write(t, f->dst_loc / t->seg_blocks);
    seg_maybe_free(t, f->loc / t->seg_blocks);
    seg_maybe_free(t, f->dst_loc / t->seg_blocks);
}

/* ------------------------------------------------------ group commit
 *
 * A write that landed (O_DIRECT: in the device, perhaps only in its
 * volatile write cache) is not acknowledged until a sync of its segment
 * that began after it landed has ended: only then is the DRAM copy of a
 * spill freed, or a compaction's source named dead. The syncs go in rounds,
 * one at a time: a round begins at a poll that finds writes landed and not
 * yet in a round (what lands meanwhile waits for the next), with one
 * TIO_SYNC per segment holding such writes, and one of the dead-list when
 * it was appended since its last sync; the round ends when all of them
 * have, and then its writes are durable, or failed where their segment's
 * sync failed. A failed write's pad (write_pad) is written before its
 * round begins, so the round makes it durable too, and the writes after it
 * wait for that (earlier_pending).
 *
 * The dead-list's appends go in the same round, and the round's writes are
 * acknowledged only when it ended too. What depends on a tombstone being
 * durable: the promise the dead-list makes, that a record no object's
 * never comes back. Within the tier nothing breaks when one is lost (the
 * newest record of a key wins at a restart, and a place is written again
 * only in a new generation of its segment, which makes the old entries moot),
 * but an evicted object would return after a power loss, its chain parent
 * perhaps gone, its tenant's bytes counted again. With the round, a
 * tombstone appended before a spill is acknowledged is durable when the
 * spill is: what a power loss leaves is never ahead of the tombstones on
 * what was acknowledged after them, and a tombstone is at most one round
 * (a poll and a sync) from durable, not a checkpoint (a minute). A reply
 * that must not precede its tombstone's durability (an operator's Evict
 * of SSD objects) syncs the dead-list itself (kvd_store_tier_sync_dead),
 * on the caller's thread, when a round has not made its entries durable
 * already: one fdatasync of a small file per such reply, rare enough not
 * to be worth a deferred reply.
 *
 * A sync's tag is SYNC_TAG with the segment's id (n_segs: the dead-list):
 * syncs take no entry of t->ops, which the landed writes may hold all of. */

/* Begins a sync round when none is in flight and writes landed that are
 * in none (or the dead-list was appended), unless the test hook holds
 * rounds back. Waits for a later poll when the executor lacks room for all
 * of the round's syncs (its ops in flight end, and their poll comes). */
static void round_begin(struct tier *t)
{
    if (!t->sync_on || t->hold_syncs || t->round_syncs > 0 || t->io == NULL)
        return;
    uint32_t n = 0;
    for (uint32_t k = 0; k < t->n_ops; k++) {
        inflight_t *f = &t->ops[k];
        if ((f->kind == OP_SPILL || f->kind == OP_COPY) && f->landed && !f->durable) {
            seg_t *g = seg_of(t, write_loc(f));
            n += !g->in_round;
            g->in_round = true;
        }
    }
    bool dead = t->dead_dirty && t->dead_fd >= 0;
    if (n == 0 && !dead)
        return;
    tio_stats_t st;
    tio_stats(t->io, &st);
    if (st.in_flight + n + dead > st.queue_depth) {
        for (uint32_t id = 0; id < t->n_segs; id++)
            t->segs[id].in_round = false;
        return;
    }
    for (uint32_t k = 0; k < t->n_ops; k++) {
        inflight_t *f = &t->ops[k];
        if ((f->kind == OP_SPILL || f->kind == OP_COPY) && f->landed && !f->durable)
            f->in_round = true;
    }
    for (uint32_t id = 0; id <= t->n_segs; id++) {
        if (id < t->n_segs && !t->segs[id].in_round)
            continue;
        if (id == t->n_segs && !dead)
            continue;
        tio_op_t op = {.tag = SYNC_TAG | id,
                       .kind = TIO_SYNC,
                       .fd = id < t->n_segs ? t->segs[id].fd : t->dead_fd};
        if (id == t->n_segs) {
            t->dead_dirty = false;
            t->dead_sync_fd = t->dead_fd;
            t->dead_round_mark = t->dead_appended;
        }
        submit(t, &op); /* room checked above */
        t->round_syncs++;
    }
}

/* A sync of the round ended (id: a segment, or n_segs: the dead-list);
 * when it was the round's last, the round's writes are durable (or failed
 * with their segment's sync). */
static void sync_done(struct tier *t, uint32_t id, int status)
{
    if (id == t->n_segs) {
        if (status != KVD_OK)
            KVD_WARN("tier",
                     "%s/%s: sync: %s: a record gone may come back after a power loss",
                     t->dir, DEAD_NAME, kvd_status_str(status));
        else
            t->dead_durable = KVD_MAX(t->dead_durable, t->dead_round_mark);
        if (t->dead_sync_fd >= 0 && t->dead_sync_fd != t->dead_fd)
            close(t->dead_sync_fd); /* a rewrite replaced it meanwhile */
        t->dead_sync_fd = -1;
    } else if (status != KVD_OK) {
        KVD_ERROR("tier", "segment %u: sync: %s: its writes of the round fail", id,
                  kvd_status_str(status));
        t->segs[id].sync_failed = true;
    }
    if (--t->round_syncs > 0)
        return;
    for (uint32_t k = 0; k < t->n_ops; k++) {
        inflight_t *f = &t->ops[k];
        if (!f->in_round)
            continue;
        f->in_round = false;
        f->durable = true;
        if (seg_of(t, write_loc(f))->sync_failed && f->status == KVD_OK) {
            /* on the device or not: a hole, as a pad that failed */
            f->status = KVD_ERR_IO;
            f->write_failed = true;
            seg_break(t, write_loc(f));
        }
    }
    for (uint32_t g = 0; g < t->n_segs; g++)
        t->segs[g].in_round = t->segs[g].sync_failed = false;
}

/* Whether a write before `loc` in its segment is still in flight, or
 * landed and not yet durable. */
static bool earlier_pending(const struct tier *t, uint32_t loc)
{
    for (uint32_t k = 0; k < t->n_ops; k++) {
        const inflight_t *f = &t->ops[k];
        if ((f->kind == OP_SPILL || f->kind == OP_COPY) && !(f->landed && f->durable)) {
            uint32_t w = write_loc(f);
            if (w / t->seg_blocks == loc / t->seg_blocks && w < loc)
                return true;
        }
    }
    return false;
}

/* Acknowledges the writes that landed and have every place before them
 * written, in place order (the file's comment). */
static void release_writes(kvd_store_t *s)
{
    struct tier *t = s->tier;
    for (bool more = true; more;) {
        more = false;
        for (uint32_t k = 0; k < t->n_ops; k++) {
            inflight_t *f = &t->ops[k];
            if (!f->landed || !f->durable || earlier_pending(t, write_loc(f)))
                continue;
            inflight_t copy = *f;
            const seg_t *g = seg_of(t, write_loc(f));
            bool past_hole = g->broken && write_loc(f) % t->seg_blocks > g->broken_at;
            /* past a hole the write is lost to a restart: failed as a write */
            tio_done_t d = {.tag = k,
                            .status = past_hole ? KVD_ERR_IO : f->status,
                            .kind = TIO_WRITE,
                            .write_failed = past_hole || f->write_failed};
            op_put(t, k);
            if (copy.kind == OP_SPILL)
                done_spill(s, &copy, &d, past_hole && copy.status == KVD_OK);
            else
                done_copy(s, &copy, &d);
            more = true;
        }
    }
}

size_t kvd_store_tier_poll(kvd_store_t *s, uint64_t now_ms)
{
    struct tier *t = s->tier;
    if (t == NULL)
        return 0;
    tio_done_t done[64];
    size_t total = 0, n;
    while ((n = tio_poll(t->io, done, KVD_ARRAY_SIZE(done))) > 0) {
        for (size_t k = 0; k < n; k++) {
            if (done[k].tag & SYNC_TAG) {
                sync_done(t, (uint32_t)(done[k].tag & ~SYNC_TAG), done[k].status);
                continue;
            }
            inflight_t *f = &t->ops[done[k].tag];
            if (f->kind == OP_PROMOTE) {
                inflight_t copy = *f;
                op_put(t, done[k].tag);
                done_promote(s, &copy, &done[k]);
                continue;
            }
            f->landed = true;
            f->durable = !t->sync_on;
            f->written = done[k].status == KVD_OK;
            f->status = done[k].status;
            f->write_failed = done[k].write_failed;
            if (f->kind == OP_SPILL) {
                t->spills--;
            } else {
                t->copies--;
                t->copy_bytes -= block_bytes(f->blocks - 1);
            }
            if (done[k].status != KVD_OK)
                write_pad(t, write_loc(f), f->blocks);
        }
        total += n;
    }
    round_begin(t);
    release_writes(s);
    promote_pending(s);
    reclaim(s);
    store_spill_pump(s);
    persist_commit(s); /* what the pump's drops freed is written before any reuse */
    ckpt_reap(t, false);
    if (now_ms == 0)
        now_ms = kvd_now_ns() / 1000000;
    bool due = t->changes > 0 && now_ms - t->last_ckpt_ms >= t->ckpt_every_ms &&
               ckpt_reap(t, false);
    if (due && t->ckpt == NULL)
        t->last_ckpt_ms = now_ms;
    ckpt_step(s, due);
    return total;
}

void kvd_store_tier_hold_syncs(kvd_store_t *s, bool hold)
{
    if (s->tier != NULL)
        s->tier->hold_syncs = hold; /* a round begins at the next poll */
}

int kvd_store_tier_sync_dead(kvd_store_t *s)
{
    struct tier *t = s->tier;
    /* (--ssd-sync off: nothing is synced, tombstones included) */
    if (t == NULL || !t->sync_on || t->dead_fd < 0 || t->dead_durable >= t->dead_appended)
        return KVD_OK;
    uint64_t upto = t->dead_appended;
    t->dead_syncs++;
    int err = 0;
    if (t->fail_dead_syncs > 0) {
        t->fail_dead_syncs--;
        err = EIO; /* kvd_store_tier_fail_dead_syncs: as a failed cache flush */
    } else if (fdatasync(t->dead_fd) != 0) {
        err = errno;
    }
    if (err != 0) {
        /* dead_durable stays: the next sync (a round's or ours) covers
         * these entries again */
        KVD_ERROR("tier",
                  "%s/%s: sync: %s: a record gone may come back after a power loss",
                  t->dir, DEAD_NAME, strerror(err));
        return kvd_status_from_errno(err);
    }
    t->dead_durable = upto;
    return KVD_OK;
}

void kvd_store_tier_fail_dead_syncs(kvd_store_t *s, uint32_t n)
{
    if (s->tier != NULL)
        s->tier->fail_dead_syncs = n;
}

void kvd_store_tier_fail_syncs(kvd_store_t *s, uint32_t n)
{
    if (s->tier != NULL)
        tio_fail_syncs(s->tier->io, n);
}

int kvd_store_tier_fd(const kvd_store_t *s)
{
    return s->tier ? tio_event_fd(s->tier->io) : -1;
}

void kvd_store_tier_drain(kvd_store_t *s, int timeout_ms)
{
    if (s->tier == NULL)
        return;
    uint64_t end = kvd_now_ns() + (uint64_t)timeout_ms * 1000000;
    kvd_store_tier_poll(s, 0); /* begins the sync round of writes landed already */
    while ((tio_in_flight(s->tier->io) > 0 || s->tier->n_promote_q > 0) &&
           kvd_now_ns() < end) {
        tio_wait(s->tier->io, 10);
        kvd_store_tier_poll(s, 0);
    }
    kvd_store_tier_poll(s, 0);
}

void kvd_store_tier_pool_ready(kvd_store_t *s)
{
    if (s->tier)
        tio_register_fixed(s->tier->io);
}

const char *kvd_store_tier_io_path(const kvd_store_t *s)
{
    return s->tier ? tio_backend_name(s->tier->io) : "";
}

const char *kvd_store_tier_note(const kvd_store_t *s)
{
    return s->tier ? s->tier->note : "";
}

uint32_t tier_seg_blocks(const kvd_store_t *s)
{
    return s->tier->seg_blocks;
}

void tier_stats(const kvd_store_t *s, kvd_store_stats_t *out)
{
    const struct tier *t = s->tier;
    out->ssd_bytes = block_bytes((uint64_t)t->n_segs * t->seg_blocks);
    out->ssd_segments = t->n_segs;
    out->ssd_segments_free = t->n_free;
    uint64_t used = 0, live = 0;
    for (uint32_t id = 0; id < t->n_segs; id++) {
        used += t->segs[id].state == SEG_FREE ? 0 : t->segs[id].head;
        live += t->segs[id].live;
    }
    out->ssd_used_bytes = block_bytes(used);
    out->ssd_live_bytes = block_bytes(live);
    out->ssd_compactions = t->compactions;
    out->ssd_copied_bytes = t->copied_bytes;
    out->ssd_spill_ns = t->spill_ns;
    out->ssd_promote_ns = t->promote_ns;
    out->ssd_recovered_objects = t->recovered;
    out->ssd_checkpoints = atomic_load(&t->checkpoints);
    tio_stats_t io;
    tio_stats(t->io, &io);
    out->ssd_syncs = io.syncs;
    out->ssd_dead_syncs = t->dead_syncs;
    out->ssd_io_errors = io.io_errors;
    out->ssd_checksum_failures = io.checksum_failures;
    out->ssd_no_space = io.no_space;
    out->ssd_queue_depth = io.queue_depth;
    out->ssd_in_flight = io.in_flight;
    out->ssd_io_path = strcmp(tio_backend_name(t->io), "io_uring") == 0 ? 1 : 2;
    out->ssd_fixed_buffers = tio_fixed_buffers(t->io);
}

/* ----------------------------------------------------------- checkpoint */

/*
 * The checkpoint file: ckpt_hdr_t, then n_segs ckpt_seg_t (each segment's
 * generation and the place its scan at start begins), n_ns ckpt_ns_t,
 * n_recs ckpt_rec_t. hdr.crc is the CRC-32C of the header before it and of
 * everything after the header.
 */
typedef struct ckpt_hdr {
    uint32_t magic, version;
    uint64_t tier_id, seg_bytes;
    uint32_t n_segs, n_ns;
    uint64_t n_recs, seq, written_ms;
    uint32_t page_blocks, crc;
} ckpt_hdr_t;

typedef struct ckpt_seg {
    uint64_t generation;
    uint32_t scan_from; /* records before it are in the checkpoint */
    uint32_t used;      /* 0: the segment was free */
} ckpt_seg_t;

typedef seg_sum_ns_t ckpt_ns_t; /* a namespace by name, as summaries keep them */

typedef struct ckpt_rec {
    uint32_t loc, ns;
    uint8_t key[KVD_KEY_BYTES];
    uint8_t parent_tag[KVD_KEY_TAG_BYTES];
    uint32_t depth, last_access_s;
    uint16_t hits;
    uint8_t has_parent, reserved[5];
} ckpt_rec_t;

/* The lowest place of a write in flight in segment id, or its head. */
static uint32_t scan_from_of(const struct tier *t, uint32_t id)
{
    uint32_t from = t->segs[id].head;
    for (uint32_t k = 0; k < t->n_ops; k++) {
        const inflight_t *f = &t->ops[k];
        if ((f->kind == OP_SPILL || f->kind == OP_COPY) &&
            write_loc(f) / t->seg_blocks == id)
            from = KVD_MIN(from, write_loc(f) % t->seg_blocks);
    }
    return from;
}

static int write_all(int fd, const void *buf, size_t len)
{
    const uint8_t *p = buf;
    while (len > 0) {
        ssize_t n = write(fd, p, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return n < 0 ? kvd_status_from_errno(errno) : KVD_ERR_IO;
        p += n;
        len -= (size_t)n;
    }
    return KVD_OK;
}

/*
 * A checkpoint: built on the caller's thread in slices (CKPT_SLICE
 * records of the store per poll, so that no poll holds the loop long),
 * then written on any. It stays true to what a restart must find though
 * the store changes between slices: the segments' generations and where
 * each one's scan begins are taken when the build begins, so a record
 * written after that is found by the scan (or a summary); one that leaves
 * the tier after its slice comes back at a restart, which is harmless (a
 * key names immutable bytes; an operator's eviction begins a checkpoint of
 * its own); a record's namespace is the one of its slot at its slice (a
 * slot reused meanwhile, with a new generation, gets an entry of its own).
 */
#define CKPT_SLICE 65536u

typedef struct ckpt_job {
    ckpt_hdr_t h;
    ckpt_seg_t *segs;
    ckpt_ns_t *ns; /* KVD_STORE_MAX_NAMESPACES of room; h.n_ns used */
    ckpt_rec_t *recs;
    uint64_t cap_recs;
    uint32_t *sums, n_sums; /* segments whose summaries it puts in place */
    uint32_t dead_from;     /* the dead-list's entries kept when it began */
    /* building: the next record of the store to look at, and each slot's
     * entry (+ 1) with the slot's generation when it was made */
    uint32_t pos;
    uint32_t ns_of[KVD_STORE_MAX_NAMESPACES], ns_gen[KVD_STORE_MAX_NAMESPACES];
} ckpt_job_t;

static void ckpt_job_free(ckpt_job_t *j)
{
    free(j->segs);
    kvd_mem_free(KVD_MEM_STAGING, j->ns, KVD_STORE_MAX_NAMESPACES * sizeof(ckpt_ns_t));
    kvd_mem_free(KVD_MEM_STAGING, j->recs, j->cap_recs * sizeof(ckpt_rec_t));
    free(j->sums);
    free(j);
}

/* Begins a checkpoint: the header, the segments as they are now, the
 * summaries waiting for it. NULL out of memory. */
static ckpt_job_t *ckpt_begin(kvd_store_t *s)
{
    struct tier *t = s->tier;
    ckpt_job_t *j = calloc(1, sizeof(*j));
    if (j == NULL)
        return NULL;
    j->h = (ckpt_hdr_t){.magic = CKPT_MAGIC,
                        .version = SEG_VERSION,
                        .tier_id = t->tier_id,
                        .seg_bytes = block_bytes(t->seg_blocks),
                        .n_segs = t->n_segs,
                        .seq = t->seq,
                        .written_ms = kvd_wall_ms(),
                        .page_blocks = t->page_blocks};
    j->segs = calloc(t->n_segs, sizeof(ckpt_seg_t));
    j->ns = kvd_mem_calloc(KVD_MEM_STAGING, KVD_STORE_MAX_NAMESPACES, sizeof(ckpt_ns_t));
    j->sums = malloc(t->n_segs * sizeof(uint32_t));
    if (j->segs == NULL || j->ns == NULL || j->sums == NULL) {
        ckpt_job_free(j);
        return NULL;
    }
    for (uint32_t id = 0; id < t->n_segs; id++) {
        const seg_t *g = &t->segs[id];
        j->segs[id] =
            (ckpt_seg_t){.generation = g->generation,
                         .scan_from = g->state == SEG_FREE ? 0 : scan_from_of(t, id),
                         .used = g->state != SEG_FREE};
        if (g->sum_pending) {
            t->segs[id].sum_pending = false;
            j->sums[j->n_sums++] = id;
        }
    }
    j->pos = 1;
    j->dead_from = t->n_dead;
    return j;
}

/* Adds the SSD records among the next max_visits records of the store;
 * true once every record was looked at, false on (KVD_ERR_NOMEM in *rc)
 * or when more is left. */
static bool ckpt_slice(kvd_store_t *s, ckpt_job_t *j, uint64_t max_visits, int *rc)
{
    *rc = KVD_OK;
    for (uint64_t n = 0; j->pos <= s->rec_high && n < max_visits; j->pos++, n++) {
        const rec_t *r = R(s, j->pos);
        if (r->state != REC_READY || r->tier != KVD_TIER_SSD)
            continue;
        const ns_entry_t *e = &s->ns[r->ns];
        if (j->ns_of[r->ns] == 0 || j->ns_gen[r->ns] != e->gen) {
            if (j->h.n_ns == KVD_STORE_MAX_NAMESPACES)
                continue; /* more names than slots: left to the scan */
            ckpt_ns_t *x = &j->ns[j->h.n_ns];
            snprintf(x->tenant, sizeof(x->tenant), "%s",
                     kvd_store_tenant_name(s, e->info.tenant));
            memcpy(x->name, e->info.name, sizeof(x->name));
            x->object_bytes = e->info.object_bytes;
            x->rank_replicated = e->info.rank_replicated;
            j->ns_of[r->ns] = ++j->h.n_ns;
            j->ns_gen[r->ns] = e->gen;
        }
        if (j->h.n_recs == j->cap_recs) {
            uint64_t cap = j->cap_recs ? 2 * j->cap_recs : 4096;
            ckpt_rec_t *v = kvd_mem_realloc(KVD_MEM_STAGING, j->recs,
                                            j->cap_recs * sizeof(ckpt_rec_t),
                                            cap * sizeof(ckpt_rec_t));
            if (v == NULL) {
                *rc = KVD_ERR_NOMEM;
                return false;
            }
            j->recs = v;
            j->cap_recs = cap;
        }
        ckpt_rec_t *c = &j->recs[j->h.n_recs++];
        *c = (ckpt_rec_t){.loc = r->off_pages,
                          .ns = j->ns_of[r->ns] - 1,
                          .depth = r->depth,
                          .last_access_s = r->last_access_s,
                          .hits = r->hits,
                          .has_parent = r->has_parent};
        memcpy(c->key, r->key, KVD_KEY_BYTES);
        memcpy(c->parent_tag, r->parent_tag, KVD_KEY_TAG_BYTES);
    }
    return j->pos > s->rec_high;
}

/* Puts a built checkpoint in place: the segments' writes flushed to the
 * device first (what it lists must be there after a power loss too), the
 * summaries waiting for that renamed in place, then a tmp file (its CRC
 * computed here, off the loop), fsync, rename, fsync of the directory.
 * Blocking: the checkpoint thread's, or a clean stop's. */
static int ckpt_write(struct tier *t, ckpt_job_t *j)
{
    int rc = KVD_OK;
    for (uint32_t id = 0; id < t->n_segs && rc == KVD_OK; id++)
        if (t->segs[id].fd >= 0 && fdatasync(t->segs[id].fd) != 0)
            rc = kvd_status_from_errno(errno);
    /* the summaries of segments closed since the last checkpoint: their
     * records are on the device now. One whose segment was begun again
     * meanwhile carries the old generation, which a restart ignores. */
    for (uint32_t k = 0; k < j->n_sums && rc == KVD_OK; k++) {
        char name[32], tmp[40];
        sum_name(j->sums[k], name, sizeof(name));
        snprintf(tmp, sizeof(tmp), "%s.tmp", name);
        renameat(t->dir_fd, tmp, t->dir_fd, name);
    }
    size_t segs = (size_t)j->h.n_segs * sizeof(ckpt_seg_t),
           ns = (size_t)j->h.n_ns * sizeof(ckpt_ns_t),
           recs = (size_t)j->h.n_recs * sizeof(ckpt_rec_t);
    uint32_t crc = kvd_crc32c(0, &j->h, offsetof(ckpt_hdr_t, crc));
    crc = kvd_crc32c(crc, j->segs, segs);
    crc = kvd_crc32c(crc, j->ns, ns);
    j->h.crc = kvd_crc32c(crc, j->recs, recs);
    int fd = rc != KVD_OK ? -1
                          : openat(t->dir_fd, CKPT_NAME ".tmp",
                                   O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (rc != KVD_OK || fd < 0 || (rc = write_all(fd, &j->h, sizeof(j->h))) != KVD_OK ||
        (rc = write_all(fd, j->segs, segs)) != KVD_OK ||
        (rc = write_all(fd, j->ns, ns)) != KVD_OK ||
        (recs > 0 && (rc = write_all(fd, j->recs, recs)) != KVD_OK) || fsync(fd) != 0 ||
        renameat(t->dir_fd, CKPT_NAME ".tmp", t->dir_fd, CKPT_NAME) != 0 ||
        fsync(t->dir_fd) != 0) {
        if (rc == KVD_OK)
            rc = kvd_status_from_errno(errno);
        KVD_WARN("tier", "writing the checkpoint in %s: %s (a restart scans more)",
                 t->dir, kvd_status_str(rc));
        unlinkat(t->dir_fd, CKPT_NAME ".tmp", 0);
    } else {
        atomic_fetch_add(&t->checkpoints, 1);
    }
    if (fd >= 0)
        close(fd);
    return rc;
}

static void *ckpt_thread(void *arg)
{
    struct tier *t = arg;
    atomic_store(&t->ckpt_rc, ckpt_write(t, t->ckpt));
    atomic_store(&t->ckpt_done, true);
    return NULL;
}

/* A checkpoint that was not written: what it was to put in place waits
 * for the next, which comes a second after this one began rather than a
 * period (an operator's eviction is durable only once one is written). */
static void ckpt_failed(struct tier *t, const ckpt_job_t *j)
{
    t->changes++;
    for (uint32_t k = 0; j != NULL && k < j->n_sums; k++)
        t->segs[j->sums[k]].sum_pending = true;
    t->last_ckpt_ms = t->last_ckpt_ms > t->ckpt_every_ms
                          ? t->last_ckpt_ms - t->ckpt_every_ms + 1000
                          : 0;
}

/* Ends the checkpoint of t->ckpt once it was written on its thread (or at
 * once, `wait`), or drops one still being built (`wait`: a clean stop
 * builds its own). True when none is left. */
static bool ckpt_reap(struct tier *t, bool wait)
{
    if (t->ckpt == NULL)
        return true;
    if (!t->ckpt_running) {
        if (!wait)
            return false; /* being built */
        ckpt_failed(t, t->ckpt);
    } else {
        if (!wait && !atomic_load(&t->ckpt_done))
            return false;
        pthread_join(t->ckpt_tid, NULL);
        t->ckpt_running = false;
        if (atomic_load(&t->ckpt_rc) != KVD_OK)
            ckpt_failed(t, t->ckpt);
        else
            dead_rewrite(t, t->ckpt->dead_from);
    }
    ckpt_job_free(t->ckpt);
    t->ckpt = NULL;
    return true;
}

/* The periodic checkpoint: begun when due, built a slice per poll, then
 * written and synced on a thread of its own, so that the loop neither
 * walks the whole store at once nor waits for the disk. */
static void ckpt_step(kvd_store_t *s, bool due)
{
    struct tier *t = s->tier;
    if (t->ckpt == NULL) {
        if (!due)
            return;
        if ((t->ckpt = ckpt_begin(s)) == NULL) {
            ckpt_failed(t, NULL);
            return;
        }
        t->changes = 0;
    }
    if (t->ckpt_running)
        return;
    int rc;
    if (!ckpt_slice(s, t->ckpt, t->ckpt_slice, &rc)) {
        if (rc != KVD_OK)
            ckpt_reap(t, true); /* out of memory: dropped, tried again later */
        return;
    }
    atomic_store(&t->ckpt_done, false);
    if (pthread_create(&t->ckpt_tid, NULL, ckpt_thread, t) != 0) {
        ckpt_failed(t, t->ckpt);
        ckpt_job_free(t->ckpt);
        t->ckpt = NULL;
        return;
    }
    t->ckpt_running = true;
}

int kvd_store_tier_checkpoint(kvd_store_t *s)
{
    struct tier *t = s->tier;
    if (t == NULL)
        return KVD_OK;
    ckpt_reap(t, true);
    ckpt_job_t *j = ckpt_begin(s);
    int rc = j == NULL ? KVD_ERR_NOMEM : KVD_OK;
    if (j != NULL && !ckpt_slice(s, j, UINT64_MAX, &rc))
        ckpt_failed(t, j);
    uint64_t changes = t->changes;
    if (rc == KVD_OK) {
        t->changes = 0;
        if ((rc = ckpt_write(t, j)) != KVD_OK) {
            ckpt_failed(t, j);
            t->changes += changes;
        } else {
            dead_rewrite(t, j->dead_from);
        }
    }
    if (j != NULL)
        ckpt_job_free(j);
    return rc;
}

/* ------------------------------------------------------------- restore */

/* A record found at start, from the checkpoint or a segment's scan. */
typedef struct found {
    uint64_t seq;
    uint32_t loc, ns; /* ns: index into the restore's namespace list */
    uint8_t key[KVD_KEY_BYTES];
    uint8_t parent_tag[KVD_KEY_TAG_BYTES];
    uint32_t depth, last_access_s, blocks;
    uint16_t hits;
    uint8_t has_parent;
} found_t;

typedef struct restore {
    found_t *v;
    size_t n, cap;
    ckpt_ns_t *ns; /* namespaces named, deduplicated */
    uint32_t n_ns, cap_ns;
} restore_t;

static found_t *found_add(restore_t *rs)
{
    if (rs->n == rs->cap) {
        size_t cap = rs->cap ? 2 * rs->cap : 4096;
        found_t *v = kvd_mem_realloc(KVD_MEM_STAGING, rs->v, rs->cap * sizeof(found_t),
                                     cap * sizeof(found_t));
        if (v == NULL)
            return NULL;
        rs->v = v;
        rs->cap = cap;
    }
    memset(&rs->v[rs->n], 0, sizeof(found_t));
    return &rs->v[rs->n++];
}

/* The index of a namespace in the restore's list, added when new;
 * UINT32_MAX out of memory. */
static uint32_t ns_add(restore_t *rs, const char *tenant, const char *name,
                       uint64_t bytes, bool rr)
{
    for (uint32_t k = rs->n_ns; k-- > 0;)
        if (rs->ns[k].object_bytes == bytes && rs->ns[k].rank_replicated == rr &&
            strcmp(rs->ns[k].name, name) == 0 && strcmp(rs->ns[k].tenant, tenant) == 0)
            return k;
    if (rs->n_ns == rs->cap_ns) {
        uint32_t cap = rs->cap_ns ? 2 * rs->cap_ns : 16;
        ckpt_ns_t *v =
            kvd_mem_realloc(KVD_MEM_STAGING, rs->ns, rs->cap_ns * sizeof(ckpt_ns_t),
                            cap * sizeof(ckpt_ns_t));
        if (v == NULL)
            return UINT32_MAX;
        rs->ns = v;
        rs->cap_ns = cap;
    }
    ckpt_ns_t *x = &rs->ns[rs->n_ns];
    memset(x, 0, sizeof(*x));
    snprintf(x->tenant, sizeof(x->tenant), "%s", tenant);
    snprintf(x->name, sizeof(x->name), "%s", name);
    x->object_bytes = bytes;
    x->rank_replicated = rr;
    return rs->n_ns++;
}

/* The restore's index of each of n namespaces of a file (a checkpoint's,
 * a summary's), UINT32_MAX where memory ran out; NULL without memory. The
 * caller frees it. */
static uint32_t *ns_map(restore_t *rs, const seg_sum_ns_t *ns, uint32_t n)
{
    uint32_t *map = calloc(n ? n : 1, sizeof(uint32_t));
    for (uint32_t k = 0; map != NULL && k < n; k++)
        map[k] = ns_add(rs, ns[k].tenant, ns[k].name, ns[k].object_bytes,
                        ns[k].rank_replicated);
    return map;
}

/* Reads the checkpoint: its records go into rs, and scan_from[id] says
 * where each segment of the generation it names is to be scanned from
 * (0: from its start). Nothing usable is no error. */
static void ckpt_read(struct tier *t, restore_t *rs, uint32_t *scan_from,
                      kvd_tier_recovery_t *rec)
{
    int fd = openat(t->dir_fd, CKPT_NAME, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    struct stat st;
    ckpt_hdr_t h;
    uint8_t *body = NULL;
    size_t len = 0;
    if (fstat(fd, &st) != 0 || (size_t)st.st_size < sizeof(h) ||
        pread(fd, &h, sizeof(h), 0) != (ssize_t)sizeof(h) || h.magic != CKPT_MAGIC ||
        h.version != SEG_VERSION || h.tier_id != t->tier_id || h.n_segs != t->n_segs ||
        h.seg_bytes != block_bytes(t->seg_blocks) || h.page_blocks != t->page_blocks)
        goto out;
    len = (size_t)st.st_size - sizeof(h);
    if (len != (size_t)h.n_segs * sizeof(ckpt_seg_t) +
                   (size_t)h.n_ns * sizeof(ckpt_ns_t) + h.n_recs * sizeof(ckpt_rec_t) ||
        (body = malloc(len ? len : 1)) == NULL ||
        pread(fd, body, len, sizeof(h)) != (ssize_t)len ||
        kvd_crc32c(kvd_crc32c(0, &h, offsetof(ckpt_hdr_t, crc)), body, len) != h.crc) {
        KVD_WARN("tier",
                 "%s/%s is damaged or of another tier: the segments are scanned "
                 "instead",
                 t->dir, CKPT_NAME);
        goto out;
    }
    const ckpt_seg_t *cs = (const ckpt_seg_t *)body;
    const ckpt_ns_t *cn = (const ckpt_ns_t *)(cs + h.n_segs);
    const ckpt_rec_t *cr = (const ckpt_rec_t *)(cn + h.n_ns);
    uint32_t *map = ns_map(rs, cn, h.n_ns);
    if (map == NULL)
        goto out;
    for (uint64_t k = 0; k < h.n_recs; k++) {
        const ckpt_rec_t *c = &cr[k];
        uint32_t id = c->loc / t->seg_blocks;
        if (id >= t->n_segs || c->ns >= h.n_ns || map[c->ns] == UINT32_MAX ||
            t->segs[id].generation != cs[id].generation || !cs[id].used)
            continue; /* its segment was begun again since */
        found_t *f = found_add(rs);
        if (f == NULL)
            break;
        f->loc = c->loc;
        f->ns = map[c->ns];
        memcpy(f->key, c->key, KVD_KEY_BYTES);
        memcpy(f->parent_tag, c->parent_tag, KVD_KEY_TAG_BYTES);
        f->depth = c->depth;
        f->last_access_s = c->last_access_s;
        f->hits = c->hits;
        f->has_parent = c->has_parent;
        f->blocks = 0; /* from the namespace's size, at insertion */
        rec->checkpoint_records++;
    }
    for (uint32_t id = 0; id < t->n_segs; id++)
        if (t->segs[id].state != SEG_FREE && t->segs[id].generation == cs[id].generation)
            /* free at the checkpoint and not begun since: what it holds
             * was dropped (an eviction, a compaction), not to come back */
            scan_from[id] = cs[id].used ? cs[id].scan_from : SCAN_NOTHING;
    free(map);
    t->seq = KVD_MAX(t->seq, h.seq);
out:
    free(body);
    close(fd);
}

/* The header block of block b of a segment, through a window of the file
 * read in one go: SCAN_WINDOW_BYTES when records are small (so that one
 * read brings many headers), one block when they are large (so that a
 * scan does not read the values). NULL when it cannot be read whole. */
#define SCAN_WINDOW_BYTES (1u << 20)
typedef struct scan_window {
    uint8_t *buf;
    uint32_t first, blocks; /* what buf holds: blocks from block `first` */
} scan_window_t;

static const uint8_t *scan_block(struct tier *t, seg_t *g, scan_window_t *w, uint32_t b,
                                 uint32_t last_blocks)
{
    if (b >= w->first && b < w->first + w->blocks)
        return w->buf + block_bytes(b - w->first);
    uint32_t want = last_blocks <= 16 ? SCAN_WINDOW_BYTES / SEG_BLOCK : 1;
    want = KVD_MIN(want, t->seg_blocks - b);
    ssize_t n = pread(g->fd, w->buf, block_bytes(want), (off_t)block_bytes(b));
    if (n < (ssize_t)SEG_BLOCK) {
        w->blocks = 0;
        return NULL;
    }
    w->first = b;
    w->blocks = (uint32_t)((size_t)n / SEG_BLOCK);
    return w->buf;
}

/* Scans segment id's record headers from block `from` (1: its start) to
 * the first that is not a whole record of its generation: adds them to rs
 * and sets the segment's head there. */
static int seg_scan(struct tier *t, uint32_t id, uint32_t from, restore_t *rs,
                    kvd_tier_recovery_t *rec)
{
    seg_t *g = &t->segs[id];
    scan_window_t w = {0};
    if (posix_memalign((void **)&w.buf, SEG_BLOCK, SCAN_WINDOW_BYTES) != 0)
        return KVD_ERR_NOMEM;
    uint32_t b = KVD_MAX(from, 1u), last_blocks = 1;
    bool torn = false;
    while (b < t->seg_blocks) {
        const uint8_t *blk = scan_block(t, g, &w, b, last_blocks);
        const seg_rec_hdr_t *h = (const seg_rec_hdr_t *)blk;
        if (blk == NULL || !seg_rec_valid(blk) || h->generation != g->generation ||
            h->value_bytes % SEG_BLOCK != 0 ||
            h->value_bytes / SEG_BLOCK >= (uint64_t)t->seg_blocks - b) {
            /* a block of zeros is where the writing stopped; anything else
             * is a record cut short */
            for (size_t k = 0; blk != NULL && k < SEG_BLOCK && !torn; k++)
                torn = blk[k] != 0;
            break;
        }
        uint32_t blocks = 1 + (uint32_t)(h->value_bytes / SEG_BLOCK);
        if (!(h->flags & SEG_REC_PAD)) {
            char tenant[KVD_TENANT_NAME_MAX], name[KVD_NS_NAME_MAX];
            snprintf(tenant, sizeof(tenant), "%.*s", (int)sizeof(h->tenant) - 1,
                     h->tenant);
            snprintf(name, sizeof(name), "%.*s", (int)sizeof(h->ns) - 1, h->ns);
            uint32_t ns = ns_add(rs, tenant, name, h->object_bytes, h->rank_replicated);
            found_t *f = ns == UINT32_MAX ? NULL : found_add(rs);
            if (f == NULL) {
                free(w.buf);
                return KVD_ERR_NOMEM;
            }
            f->seq = h->seq;
            f->loc = id * t->seg_blocks + b;
            f->ns = ns;
            memcpy(f->key, h->key, KVD_KEY_BYTES);
            memcpy(f->parent_tag, h->parent_tag, KVD_KEY_TAG_BYTES);
            f->depth = h->depth;
            f->last_access_s = h->last_access_s;
            f->hits = h->hits;
            f->has_parent = h->has_parent;
            f->blocks = blocks;
            rec->scanned_records++;
        }
        t->seq = KVD_MAX(t->seq, h->seq + 1);
        b += blocks;
        last_blocks = blocks;
    }
    g->head = KVD_MAX(b, g->head);
    rec->torn += torn;
    free(w.buf);
    return KVD_OK;
}

/* Reads segment id's summary, when one of its generation is there: adds
 * the records of block `from` on to rs, sets the segment's head where
 * writing stopped and returns true; false (the caller scans) otherwise. */
static bool sum_read(struct tier *t, uint32_t id, uint32_t from, restore_t *rs,
                     kvd_tier_recovery_t *rec)
{
    seg_t *g = &t->segs[id];
    char name[32];
    sum_name(id, name, sizeof(name));
    int fd = openat(t->dir_fd, name, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return false;
    struct stat st;
    seg_sum_hdr_t h;
    uint8_t *body = NULL;
    bool ok = false;
    if (fstat(fd, &st) != 0 || (size_t)st.st_size < sizeof(h) ||
        pread(fd, &h, sizeof(h), 0) != (ssize_t)sizeof(h) || h.magic != SEG_SUM_MAGIC ||
        h.version != SEG_VERSION || h.tier_id != t->tier_id || h.seg_id != id ||
        h.generation != g->generation || h.end_block > t->seg_blocks)
        goto out;
    size_t len =
        (size_t)h.n_ns * sizeof(seg_sum_ns_t) + (size_t)h.n_ent * sizeof(seg_sum_ent_t);
    if ((size_t)st.st_size != sizeof(h) + len || (body = malloc(len ? len : 1)) == NULL ||
        pread(fd, body, len, sizeof(h)) != (ssize_t)len)
        goto out;
    uint32_t crc = kvd_crc32c(0, &h, offsetof(seg_sum_hdr_t, crc));
    if (kvd_crc32c(crc, body, len) != h.crc)
        goto out;
    const seg_sum_ns_t *ns = (const seg_sum_ns_t *)body;
    const seg_sum_ent_t *ent = (const seg_sum_ent_t *)(ns + h.n_ns);
    uint32_t *map = ns_map(rs, ns, h.n_ns);
    if (map == NULL)
        goto out;
    ok = true;
    for (uint32_t k = 0; k < h.n_ent && ok; k++) {
        const seg_sum_ent_t *x = &ent[k];
        if (x->pad || x->block < from || x->ns >= h.n_ns || map[x->ns] == UINT32_MAX ||
            x->block + x->blocks > h.end_block)
            continue;
        found_t *f = found_add(rs);
        if (f == NULL) {
            ok = false;
            break;
        }
        f->seq = x->seq;
        f->loc = id * t->seg_blocks + x->block;
        f->ns = map[x->ns];
        memcpy(f->key, x->key, KVD_KEY_BYTES);
        memcpy(f->parent_tag, x->parent_tag, KVD_KEY_TAG_BYTES);
        f->depth = x->depth;
        f->last_access_s = x->last_access_s;
        f->hits = x->hits;
        f->has_parent = x->has_parent;
        f->blocks = x->blocks;
        t->seq = KVD_MAX(t->seq, x->seq + 1);
        rec->summary_records++;
    }
    free(map);
    if (ok)
        g->head = KVD_MAX(g->head, h.end_block);
out:
    free(body);
    close(fd);
    return ok;
}

static int newest_first(const void *a, const void *b)
{
    const found_t *x = a, *y = b;
    return x->seq != y->seq ? (x->seq > y->seq ? -1 : 1)
                            : (x->loc > y->loc) - (x->loc < y->loc);
}

/* Puts what was found into the store: newest first, so that a key found
 * twice keeps its newest record (and one in DRAM already keeps DRAM's). */
static int restore_insert(kvd_store_t *s, restore_t *rs, const uint32_t *dead,
                          size_t n_dead, kvd_tier_recovery_t *rec)
{
    struct tier *t = s->tier;
    if (rs->n > 0)
        qsort(rs->v, rs->n, sizeof(found_t), newest_first);
    uint32_t *slot = malloc((rs->n_ns ? rs->n_ns : 1) * sizeof(uint32_t));
    uint32_t *recs = malloc((rs->n ? rs->n : 1) * sizeof(uint32_t));
    if (slot == NULL || recs == NULL) {
        free(slot);
        free(recs);
        return KVD_ERR_NOMEM;
    }
    for (uint32_t k = 0; k < rs->n_ns; k++) {
        uint32_t tenant;
        slot[k] = UINT32_MAX;
        if (kvd_store_tenant_find(s, rs->ns[k].tenant, &tenant) == KVD_OK &&
            store_ns_ensure(s, tenant, rs->ns[k].name, rs->ns[k].object_bytes,
                            rs->ns[k].rank_replicated, &slot[k]) != KVD_OK)
            slot[k] = UINT32_MAX;
    }
    size_t n_recs = 0;
    for (size_t k = 0; k < rs->n; k++) {
        const found_t *f = &rs->v[k];
        uint32_t sl = slot[f->ns], id = f->loc / t->seg_blocks, j;
        uint32_t blocks = sl == UINT32_MAX ? 0 : 1 + s->ns[sl].pages * t->page_blocks;
        if (n_dead > 0 && bsearch(&f->loc, dead, n_dead, sizeof(uint32_t), loc_cmp)) {
            rec->dead++;
            continue;
        }
        if (sl == UINT32_MAX || (f->blocks != 0 && f->blocks != blocks) ||
            f->loc % t->seg_blocks + blocks > t->segs[id].head) {
            rec->discarded++;
            continue;
        }
        if (!store_ssd_insert(s, sl, f->key, f->has_parent ? f->parent_tag : NULL,
                              f->depth, f->last_access_s, f->hits, f->loc, &j)) {
            rec->duplicates++;
            continue;
        }
        t->segs[id].live += blocks;
        seg_push(&t->segs[id], j);
        recs[n_recs++] = j;
        rec->objects++;
        rec->bytes += s->ns[sl].info.object_bytes;
    }
    store_ssd_inserted(s, recs, n_recs);
    /* what is not live in a used segment is dead */
    for (uint32_t id = 0; id < t->n_segs; id++) {
        seg_t *g = &t->segs[id];
        if (g->state != SEG_FREE)
            g->dead = g->head - 1 - KVD_MIN(g->live, g->head - 1);
    }
    /* namespaces the tier named but nothing kept */
    for (uint32_t k = 0; k < rs->n_ns; k++)
        if (slot[k] != UINT32_MAX)
            ns_maybe_remove(s, slot[k]);
    free(slot);
    free(recs);
    return KVD_OK;
}

/* --------------------------------------------------------------- attach */

#define FAIL_WHY(code, ...)                      \
    do {                                         \
        if (why)                                 \
            snprintf(why, why_len, __VA_ARGS__); \
        rc = (code);                             \
        goto fail;                               \
    } while (0)

static void seg_name(uint32_t id, char *buf, size_t len)
{
    snprintf(buf, len, "seg-%06u.kvs", id);
}

/* Opens (creating) segment id, O_DIRECT where the file system has it. */
static int seg_open(struct tier *t, uint32_t id)
{
    char name[32];
    seg_name(id, name, sizeof(name));
    int fd = openat(t->dir_fd, name, O_RDWR | O_CREAT | O_CLOEXEC | O_DIRECT, 0600);
    if (fd < 0 && errno == EINVAL) {
        fd = openat(t->dir_fd, name, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
        if (fd >= 0 && t->direct) {
            t->direct = false;
            snprintf(t->note, sizeof(t->note),
                     "the file system refuses O_DIRECT: the tier "
                     "goes through the page cache");
        }
    }
    t->segs[id].fd = fd;
    return fd < 0 ? kvd_status_from_errno(errno) : KVD_OK;
}

/* Reads segment id's header: its generation when it is one of this tier
 * (state FULL, scanned later), FREE for a file never begun (zeros).
 * KVD_ERR_STATE for a segment of another layout or tier. */
static int seg_read_header(struct tier *t, uint32_t id, bool *foreign_tier)
{
    seg_t *g = &t->segs[id];
    void *blk;
    if (posix_memalign(&blk, SEG_BLOCK, SEG_BLOCK) != 0)
        return KVD_ERR_NOMEM;
    ssize_t n = pread(g->fd, blk, SEG_BLOCK, 0);
    seg_file_hdr_t h;
    memcpy(&h, blk, sizeof(h));
    int rc = KVD_OK;
    g->state = SEG_FREE;
    if (n == (ssize_t)SEG_BLOCK && h.magic == SEG_FILE_MAGIC) {
        if (h.crc != kvd_crc32c(0, &h, offsetof(seg_file_hdr_t, crc)) ||
            h.version != SEG_VERSION || h.seg_bytes != block_bytes(t->seg_blocks) ||
            h.block != SEG_BLOCK || h.seg_id != id)
            rc = KVD_ERR_STATE;
        else if (t->tier_id != 0 && h.tier_id != t->tier_id)
            *foreign_tier = true, rc = KVD_ERR_STATE;
        else {
            t->tier_id = h.tier_id;
            g->generation = h.generation;
            g->state = SEG_FULL;
            g->head = 1;
        }
    }
    free(blk);
    return rc;
}

/* Removes what a tier directory holds (--fresh). */
static void tier_wipe(struct tier *t, uint32_t upto)
{
    char name[32];
    for (uint32_t id = 0; id < upto; id++) {
        seg_name(id, name, sizeof(name));
        unlinkat(t->dir_fd, name, 0);
    }
    unlinkat(t->dir_fd, CKPT_NAME, 0);
    unlinkat(t->dir_fd, CKPT_NAME ".tmp", 0);
    unlinkat(t->dir_fd, DEAD_NAME, 0);
    unlinkat(t->dir_fd, DEAD_NAME ".tmp", 0);
}

/* The segments of a tier already there: ids in a row from 0. */
static uint32_t segs_present(struct tier *t)
{
    char name[32];
    uint32_t id = 0;
    struct stat st;
    for (;; id++) {
        seg_name(id, name, sizeof(name));
        if (fstatat(t->dir_fd, name, &st, 0) != 0)
            return id;
    }
}

static void tier_free(struct tier *t)
{
    if (t == NULL)
        return;
    ckpt_reap(t, true);
    tio_destroy(t->io);
    for (uint32_t id = 0; t->segs && id < t->n_segs; id++) {
        if (t->segs[id].fd >= 0)
            close(t->segs[id].fd);
        kvd_mem_free(KVD_MEM_INDEX, t->segs[id].recs, (size_t)t->segs[id].cap_recs * 4);
        sum_free(&t->segs[id]);
    }
    kvd_mem_free(KVD_MEM_INDEX, t->segs, (size_t)t->n_segs * sizeof(seg_t));
    free(t->ops);
    free(t->free_ops);
    kvd_mem_free(KVD_MEM_STAGING, t->promote_q, (size_t)t->cap_promote_q * 4);
    kvd_mem_free(KVD_MEM_INDEX, t->dead, (size_t)t->cap_dead * sizeof(dead_ent_t));
    if (t->dead_fd >= 0)
        close(t->dead_fd);
    if (t->dead_sync_fd >= 0 && t->dead_sync_fd != t->dead_fd)
        close(t->dead_sync_fd); /* replaced while its sync was in flight */
    if (t->lock_fd >= 0)
        close(t->lock_fd); /* drops the flock */
    if (t->dir_fd >= 0)
        close(t->dir_fd);
    free(t);
}

int kvd_store_tier_attach(kvd_store_t *s, const kvd_tier_opts_t *o,
                          kvd_tier_recovery_t *rec, char *why, size_t why_len)
{
    uint64_t t0 = kvd_now_ns();
    memset(rec, 0, sizeof(*rec));
    int rc = KVD_OK;
    restore_t rs = {0};
    uint32_t *scan_from = NULL;
    if (s->tier != NULL || o->dir == NULL || s->cfg.page_bytes % SEG_BLOCK != 0)
        return KVD_ERR_INVALID;
    uint64_t seg_bytes = o->segment_bytes ? o->segment_bytes : SEG_BYTES_DEFAULT;
    struct tier *t = calloc(1, sizeof(*t));
    if (t == NULL)
        return KVD_ERR_NOMEM;
    t->dir_fd = t->lock_fd = t->dead_fd = t->dead_sync_fd = -1;
    t->direct = true;
    t->head = t->copy_head = NO_SEG;
    snprintf(t->dir, sizeof(t->dir), "%s", o->dir);
    if (seg_bytes % SEG_BLOCK != 0 || seg_bytes < 4ull * SEG_BLOCK ||
        seg_bytes / SEG_BLOCK > UINT32_MAX)
        FAIL_WHY(KVD_ERR_INVALID, "a segment of %llu bytes: it must be a multiple of %u",
                 (unsigned long long)seg_bytes, SEG_BLOCK);
    t->seg_blocks = (uint32_t)(seg_bytes / SEG_BLOCK);
    t->page_blocks = s->cfg.page_bytes / SEG_BLOCK;
    uint64_t n_segs = o->size_bytes / seg_bytes;
    if (n_segs < 3)
        FAIL_WHY(
            KVD_ERR_INVALID,
            "an SSD tier of %llu bytes holds fewer than 3 segments of %llu bytes (one "
            "is written, one is kept for compaction): give at least %llu",
            (unsigned long long)o->size_bytes, (unsigned long long)seg_bytes,
            (unsigned long long)(3 * seg_bytes));
    if (n_segs * t->seg_blocks > UINT32_MAX)
        FAIL_WHY(KVD_ERR_INVALID,
                 "an SSD tier of %llu bytes is over the %llu a tier may "
                 "address",
                 (unsigned long long)o->size_bytes,
                 (unsigned long long)block_bytes(UINT32_MAX));
    t->n_segs = (uint32_t)n_segs;
    if (mkdir(o->dir, 0700) != 0 && errno != EEXIST)
        FAIL_WHY(kvd_status_from_errno(errno),
                 "cannot create the tier's directory %s: %s", o->dir, strerror(errno));
    if ((t->dir_fd = open(o->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0)
        FAIL_WHY(kvd_status_from_errno(errno), "cannot open %s: %s", o->dir,
                 strerror(errno));
    char lock_path[PATH_MAX + 16], holder[32];
    snprintf(lock_path, sizeof(lock_path), "%s/tier.lock", o->dir);
    if ((rc = kvd_lock_file("tier", lock_path, &t->lock_fd, holder, sizeof(holder))) !=
        KVD_OK)
        FAIL_WHY(rc, "the SSD tier in %s %s%s (%s)", o->dir,
                 rc == KVD_ERR_BUSY ? "is in use by kvdockd pid " : "cannot be locked",
                 rc == KVD_ERR_BUSY ? holder : "", lock_path);
    uint32_t present = segs_present(t);
    if (o->fresh)
        tier_wipe(t, KVD_MAX(present, t->n_segs));
    else if (present > t->n_segs)
        FAIL_WHY(
            KVD_ERR_STATE,
            "%s holds %u segments, more than the %u of --ssd-size %llu: give the size it "
            "was made with, or --fresh to discard it",
            o->dir, present, t->n_segs, (unsigned long long)o->size_bytes);
    present = o->fresh ? 0 : present;
    /* the files still to be made must fit the file system now */
    struct statvfs vfs;
    if (fstatvfs(t->dir_fd, &vfs) == 0) {
        uint64_t avail = (uint64_t)vfs.f_bavail * vfs.f_frsize, have = 0, need = 0;
        char name[32];
        struct stat st;
        for (uint32_t id = 0; id < t->n_segs; id++) {
            seg_name(id, name, sizeof(name));
            uint64_t got =
                fstatat(t->dir_fd, name, &st, 0) == 0 ? (uint64_t)st.st_blocks * 512 : 0;
            have += KVD_MIN(got, seg_bytes);
            need += seg_bytes - KVD_MIN(got, seg_bytes);
        }
        if (need > avail) {
            uint64_t fits = (have + avail) / seg_bytes * seg_bytes;
            FAIL_WHY(
                KVD_ERR_NO_SPACE,
                "an SSD tier of %llu bytes does not fit %s: %llu more bytes are needed, "
                "%llu are free; --ssd-size %llu fits",
                (unsigned long long)(n_segs * seg_bytes), o->dir,
                (unsigned long long)need, (unsigned long long)avail,
                (unsigned long long)fits);
        }
    }
    t->segs = kvd_mem_calloc(KVD_MEM_INDEX, t->n_segs, sizeof(seg_t));
    scan_from = calloc(t->n_segs, sizeof(uint32_t));
    t->qd = o->queue_depth ? o->queue_depth : 32;
    t->n_ops = 2 * t->qd;
    t->ops = calloc(t->n_ops, sizeof(inflight_t));
    t->free_ops = calloc(t->n_ops, sizeof(uint32_t));
    if (t->segs == NULL || scan_from == NULL || t->ops == NULL || t->free_ops == NULL)
        FAIL_WHY(KVD_ERR_NOMEM, "out of memory");
    for (uint32_t id = 0; id < t->n_segs; id++)
        t->segs[id].fd = -1;
    for (uint32_t k = t->n_ops; k-- > 0;)
        t->free_ops[t->n_free_ops++] = k;
    bool foreign = false;
    for (uint32_t id = 0; id < t->n_segs; id++) {
        if ((rc = seg_open(t, id)) != KVD_OK)
            FAIL_WHY(rc, "cannot open segment %u in %s: %s", id, o->dir,
                     kvd_status_str(rc));
        struct stat st;
        if (fstat(t->segs[id].fd, &st) != 0 || (uint64_t)st.st_size != seg_bytes) {
            if ((uint64_t)st.st_size > seg_bytes && id < present)
                FAIL_WHY(KVD_ERR_STATE,
                         "segment %u in %s is of another size: --fresh "
                         "discards the tier",
                         id, o->dir);
            int err = posix_fallocate(t->segs[id].fd, 0, (off_t)seg_bytes);
            if (err != 0)
                FAIL_WHY(kvd_status_from_errno(err),
                         "cannot allocate segment %u in %s: %s", id, o->dir,
                         strerror(err));
        }
        if (id < present && seg_read_header(t, id, &foreign) != KVD_OK)
            FAIL_WHY(KVD_ERR_STATE, "segment %u in %s is %s: --fresh discards the tier",
                     id, o->dir,
                     foreign ? "of another tier"
                             : "of another layout or version, or damaged");
        if (t->segs[id].state == SEG_FREE)
            t->n_free++;
    }
    if (t->tier_id == 0 &&
        getrandom(&t->tier_id, sizeof(t->tier_id), 0) != sizeof(t->tier_id))
        t->tier_id = kvd_now_ns() ^ (uint64_t)getpid() << 32;
    if (t->tier_id == 0)
        t->tier_id = 1;
    s->tier = t;
    s->spill_policy = o->policy;
    /* the index: the checkpoint, then each segment's records after it */
    ckpt_read(t, &rs, scan_from, rec);
    for (uint32_t id = 0; id < t->n_segs; id++) {
        if (scan_from[id] == SCAN_NOTHING && t->segs[id].state != SEG_FREE) {
            t->segs[id].state = SEG_FREE;
            t->n_free++;
        }
        if (t->segs[id].state == SEG_FREE)
            continue;
        rec->segments++;
        t->segs[id].head = KVD_MAX(scan_from[id], 1u);
        /* a segment summarised needs no scan; one written here before (a
         * summary or not) gets none from this run */
        t->segs[id].sum_done = true;
        if (!sum_read(t, id, t->segs[id].head, &rs, rec) &&
            (rc = seg_scan(t, id, scan_from[id], &rs, rec)) != KVD_OK)
            FAIL_WHY(rc, "scanning segment %u: %s", id, kvd_status_str(rc));
    }
    t->seq = KVD_MAX(t->seq, 1u); /* 0 is no sequence number (a copy's dst_seq) */
    uint32_t *dead = NULL;
    size_t n_dead = 0;
    dead_read(t, &dead, &n_dead);
    rc = restore_insert(s, &rs, dead, n_dead, rec);
    free(dead);
    if (rc != KVD_OK)
        FAIL_WHY(rc, "rebuilding the tier's index: %s", kvd_status_str(rc));
    /* its entries still hold until a checkpoint of this run is written */
    if ((rc = dead_open(t)) != KVD_OK)
        FAIL_WHY(rc, "cannot open %s/%s: %s", o->dir, DEAD_NAME, kvd_status_str(rc));
    t->recovered = rec->objects;
    /* writing goes on in a segment begun anew: one written before, maybe
     * past a torn record, stays as it is until compaction frees it */
    tio_opts_t io = {.backend = o->io_path == 1   ? TIO_URING
                                : o->io_path == 2 ? TIO_PSYNC
                                                  : TIO_AUTO,
                     .queue_depth = t->qd,
                     .pool_base = o->pool_base,
                     .pool_bytes = o->pool_bytes,
                     .fixed_slice_bytes = o->no_fixed_buffers ? UINT64_MAX : 0,
                     /* compaction's bounce buffers, one per slot that copied:
                      * a record larger is dropped rather than copied */
                     .max_value_bytes = KVD_MIN(block_bytes(t->seg_blocks - 1),
                                                (uint64_t)COPY_MAX_BYTES),
                     .fail_read_every = o->fail_read_every,
                     .fail_copy_writes = o->fail_copy_writes,
                     .fail_writes = o->fail_spill_writes,
                     .defer_fixed = o->defer_fixed_buffers};
    if ((rc = tio_create(&io, &t->io)) != KVD_OK)
        FAIL_WHY(rc, "the SSD tier's I/O could not start (%s): see the log",
                 kvd_status_str(rc));
    if (t->note[0] == '\0')
        snprintf(t->note, sizeof(t->note), "%s", tio_note(t->io));
    t->fail_pads = o->fail_pad_writes;
    t->sync_on = !o->no_sync;
    t->hold_syncs = o->hold_syncs;
    t->last_ckpt_ms = o->now_ms ? o->now_ms : kvd_now_ns() / 1000000;
    t->ckpt_every_ms = o->checkpoint_ms ? o->checkpoint_ms : CKPT_EVERY_MS;
    t->ckpt_slice = o->checkpoint_slice ? o->checkpoint_slice : CKPT_SLICE;
    rec->elapsed_ns = kvd_now_ns() - t0;
    if (rec->objects == 0 && rec->note[0] == '\0')
        snprintf(rec->note, sizeof(rec->note), "%s",
                 o->fresh  ? "--fresh"
                 : present ? "no records"
                           : "a new tier");
    kvd_mem_free(KVD_MEM_STAGING, rs.v, rs.cap * sizeof(found_t));
    kvd_mem_free(KVD_MEM_STAGING, rs.ns, rs.cap_ns * sizeof(ckpt_ns_t));
    free(scan_from);
    return KVD_OK;
fail:
    if (s->tier == t) {
        /* nothing of it may stay in the store: drop what was inserted */
        while (store_ssd_evict_one(s))
            ;
        s->tier = NULL;
    }
    kvd_mem_free(KVD_MEM_STAGING, rs.v, rs.cap * sizeof(found_t));
    kvd_mem_free(KVD_MEM_STAGING, rs.ns, rs.cap_ns * sizeof(ckpt_ns_t));
    free(scan_from);
    tier_free(t);
    return rc;
}

void tier_close(kvd_store_t *s)
{
    struct tier *t = s->tier;
    /* what is in flight ends first: its records are on disk or not, and a
     * restart finds what is */
    tio_destroy(t->io);
    t->io = NULL;
    for (uint32_t k = 0; k < t->n_ops; k++) {
        if (t->ops[k].kind == OP_SPILL || t->ops[k].kind == OP_COPY) {
            /* how its write ended is not known: its segment's summary is
             * given up (the scan checks the headers) */
            seg_t *g = seg_of(t, write_loc(&t->ops[k]));
            g->writes--;
            sum_free(g);
            g->sum_done = true;
        }
        t->ops[k].kind = OP_NONE; /* a checkpoint starts its scans at the heads */
    }
    t->closing = true;
    for (uint32_t id = 0; id < t->n_segs; id++)
        sum_maybe_write(t, id);
    kvd_store_tier_checkpoint(s);
    tier_free(t);
    s->tier = NULL;
}
