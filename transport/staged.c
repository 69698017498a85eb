/*
 * staged.c - device memory over a transport that moves host memory only
 * (UCX here: Debian's 1.13 is built without CUDA and ROCm). A decorator:
 * regions of host kinds go to the inner transport as they are; regions of
 * a device kind stay here, and their bytes pass through slots of pinned
 * host memory registered with the inner transport:
 *   READ:  peer -> slot (the inner transport), then slot -> device (the
 *          kind, on its stream); the batch is done once the kind's mark is
 *   WRITE: device -> slot (the kind), then, once its mark is done,
 *          slot -> peer (the inner transport)
 * STAGE_SLOTS slots of STAGE_SLOT_BYTES let the wire and the device copy
 * engine work on different slots at once. A batch is cut into parts of at
 * most one slot each; a part waits for a free slot at post (driving what
 * is outstanding meanwhile), so post may take as long as one part's trip.
 *
 * The slots are pinned with the device kind's runtime when its first
 * region comes (kvd_gpu_pin); where that fails the kind's own bounce ring
 * carries them, slower but right.
 */
#include "transport_int.h"

#include <sched.h>
#include <stdlib.h>
#include <string.h>

#define STAGE_SLOTS      4
#define STAGE_SLOT_BYTES (8u << 20)
#define MAX_COPIES       256 /* device copies of one part */

enum part_phase {
    PART_FREE = 0,
    PART_D2H,  /* WRITE: device -> slot running (mark) */
    PART_WIRE, /* the inner batch is out */
    PART_H2D,  /* READ: slot -> device running (mark) */
};

typedef struct stg_part {
    enum part_phase phase;
    struct stg_batch *batch;
    uint64_t inner_cookie;
    const kvd_memkind_t *kind;
    void *mark;
    kvd_copy_t copies[MAX_COPIES]; /* device side <-> slot */
    kvd_xfer_t wire[MAX_COPIES];   /* slot <-> peer */
    size_t n;
} stg_part_t;

typedef struct stg_batch {
    uint64_t cookie;
    kvd_xfer_dir_t dir;
    int status;
    unsigned outstanding;   /* parts and the direct inner batch not done */
    uint64_t direct_cookie; /* the host regions' inner batch (0: none) */
    struct stg_batch *next;
} stg_batch_t;

typedef struct stg_transport {
    kvd_transport_t base;
    kvd_transport_t *inner;
    uint8_t *slot_mem;
    kvd_region_t *slot_region; /* of inner */
    int pinned_rt;             /* the runtime the slots are pinned with (0: none) */
    stg_part_t parts[STAGE_SLOTS];
    stg_batch_t *batches; /* outstanding */
    size_t n_batches;
    kvd_done_ring_t done;
    uint64_t next_inner;
    kvd_xfer_t *direct; /* a batch's host transfers, for the inner */
    size_t cap_direct;
    int slot_wait_ms; /* how long a post waits for a free slot at most */
} stg_transport_t;

static int stg_reg(kvd_transport_t *t, kvd_region_t *r)
{
    stg_transport_t *s = (stg_transport_t *)t;
    if (!r->kind->async)
        return kvd_transport_register(s->inner, r->base, r->length, r->kind,
                                      (kvd_region_t **)&r->backend);
    if (s->pinned_rt == 0 && r->kind->runtime != 0) {
        /* best effort: unpinned, the kind bounces the slots' bytes */
        uint64_t pinned = 0;
        if (kvd_gpu_pin((kvd_gpu_runtime_t)r->kind->runtime, r->kind->ordinal,
                        s->slot_mem, (uint64_t)STAGE_SLOTS * STAGE_SLOT_BYTES, false,
                        NULL, &pinned, NULL, 0) == KVD_OK)
            s->pinned_rt = r->kind->runtime;
        else if (pinned > 0)
            kvd_gpu_unpin((kvd_gpu_runtime_t)r->kind->runtime, s->slot_mem);
    }
    return KVD_OK;
}

static void stg_dereg(kvd_transport_t *t, kvd_region_t *r)
{
    stg_transport_t *s = (stg_transport_t *)t;
    if (!r->kind->async)
        kvd_transport_deregister(s->inner, r->backend);
}

static int stg_connect(kvd_transport_t *t, const kvd_peer_t *peer)
{
    stg_transport_t *s = (stg_transport_t *)t;
    return kvd_transport_connect(s->inner, peer);
}

static void batch_part_done(stg_batch_t *b, int rc)
{
    if (b->status == KVD_OK)
        b->status = rc;
    b->outstanding--;
}

/* Moves finished batches to the done ring. */
static void reap(stg_transport_t *s)
{
    for (stg_batch_t **pp = &s->batches; *pp != NULL;) {
        stg_batch_t *b = *pp;
        if (b->outstanding > 0) {
            pp = &b->next;
            continue;
        }
        *pp = b->next;
        kvd_done_ring_push(&s->done, b->cookie, b->status); /* room reserved at post */
        s->n_batches--;
        free(b);
    }
}

static void part_free(stg_part_t *p)
{
    if (p->mark != NULL)
        kvd_memkind_mark_free(p->kind, p->mark);
    p->mark = NULL;
    p->phase = PART_FREE;
    p->n = 0;
}

/* A part's inner batch is reported. */
static void wire_done(stg_part_t *p, int rc)
{
    if (rc == KVD_OK && p->batch->dir == KVD_XFER_READ) {
        rc = kvd_memkind_copy_batch(p->kind, p->copies, p->n, true);
        if (rc == KVD_OK)
            rc = kvd_memkind_mark(p->kind, &p->mark);
        if (rc == KVD_OK) {
            p->phase = PART_H2D;
            return;
        }
        (void)p->kind->sync(p->kind); /* what was issued ends before the slot is reused */
    }
    batch_part_done(p->batch, rc);
    part_free(p);
}

/* Posts a WRITE part's slot to the peer. */
static void send_part(stg_transport_t *s, stg_part_t *p)
{
    p->inner_cookie = ++s->next_inner;
    int rc = kvd_transport_post(s->inner, KVD_XFER_WRITE, p->wire, p->n, p->inner_cookie);
    if (rc == KVD_OK) {
        p->phase = PART_WIRE;
        return;
    }
    batch_part_done(p->batch, rc);
    part_free(p);
}

/* One look at everything outstanding; how many steps moved on. */
static unsigned drive(stg_transport_t *s)
{
    unsigned moved = kvd_transport_progress(s->inner);
    kvd_xfer_done_t done[16];
    size_t n = 0;
    do {
        kvd_transport_poll(s->inner, done, KVD_ARRAY_SIZE(done), &n);
        for (size_t i = 0; i < n; i++) {
            moved++;
            bool found = false;
            for (int k = 0; !found && k < STAGE_SLOTS; k++) {
                stg_part_t *p = &s->parts[k];
                if (p->phase == PART_WIRE && p->inner_cookie == done[i].cookie) {
                    found = true;
                    wire_done(p, done[i].status);
                }
            }
            for (stg_batch_t *b = s->batches; !found && b != NULL; b = b->next)
                if (b->direct_cookie == done[i].cookie) {
                    found = true;
                    b->direct_cookie = 0;
                    batch_part_done(b, done[i].status);
                }
        }
    } while (n > 0);
    for (int k = 0; k < STAGE_SLOTS; k++) {
        stg_part_t *p = &s->parts[k];
        if (p->phase != PART_D2H && p->phase != PART_H2D)
            continue;
        int rc = kvd_memkind_mark_query(p->kind, p->mark);
        if (rc == KVD_INPROGRESS)
            continue;
        moved++;
        kvd_memkind_mark_free(p->kind, p->mark);
        p->mark = NULL;
        if (p->phase == PART_D2H && rc == KVD_OK) {
            send_part(s, p);
            continue;
        }
        batch_part_done(p->batch, rc);
        part_free(p);
    }
    reap(s);
    return moved;
}

static unsigned stg_progress(kvd_transport_t *t)
{
    return drive((stg_transport_t *)t);
}

/* A free slot, driving what is outstanding until one is; -1 when the
 * inner transport failed meanwhile (every part then ends), -2 past
 * slot_wait_ms (a peer that neither answers nor fails: the caller's wait
 * for the batch then fails it, and its disconnect ends the rest). */
static int take_slot(stg_transport_t *s)
{
    uint64_t deadline = kvd_now_ns() + (uint64_t)s->slot_wait_ms * 1000000ull;
    for (unsigned idle = 0, pass = 0;; pass++) {
        for (int k = 0; k < STAGE_SLOTS; k++)
            if (s->parts[k].phase == PART_FREE)
                return k;
        if (s->inner->remote_length == 0)
            return -1;
        if ((pass & 63) == 63 && kvd_now_ns() >= deadline)
            return -2;
        idle = drive(s) > 0 ? 0 : idle + 1;
        if (idle >= 64) {
            idle = 0;
            sched_yield();
        }
    }
}

/* Starts part p (filled): a READ goes on the wire, a WRITE copies out of
 * the device first. */
static void start_part(stg_transport_t *s, stg_part_t *p)
{
    int rc = KVD_OK;
    if (p->batch->dir == KVD_XFER_READ) {
        p->inner_cookie = ++s->next_inner;
        rc = kvd_transport_post(s->inner, KVD_XFER_READ, p->wire, p->n, p->inner_cookie);
        if (rc == KVD_OK) {
            p->phase = PART_WIRE;
            return;
        }
    } else {
        rc = kvd_memkind_copy_batch(p->kind, p->copies, p->n, false);
        if (rc == KVD_OK)
            rc = kvd_memkind_mark(p->kind, &p->mark);
        if (rc == KVD_OK) {
            p->phase = PART_D2H;
            return;
        }
        (void)p->kind->sync(p->kind);
    }
    batch_part_done(p->batch, rc);
    part_free(p);
}

static int stg_post(kvd_transport_t *t, kvd_xfer_dir_t dir, const kvd_xfer_t *xfers,
                    size_t n, uint64_t cookie)
{
    stg_transport_t *s = (stg_transport_t *)t;
    stg_batch_t *b = calloc(1, sizeof(*b));
    /* every outstanding batch has room in the ring when it ends */
    if (b == NULL ||
        kvd_done_ring_reserve(&s->done, s->done.len + s->n_batches + 1) != KVD_OK) {
        free(b);
        return KVD_ERR_NOMEM;
    }
    size_t n_direct = 0;
    for (size_t i = 0; i < n; i++)
        n_direct += !xfers[i].local->kind->async;
    if (n_direct > s->cap_direct) {
        kvd_xfer_t *v = realloc(s->direct, n_direct * sizeof(*v));
        if (v == NULL) {
            free(b);
            return KVD_ERR_NOMEM;
        }
        s->direct = v;
        s->cap_direct = n_direct;
    }
    *b = (stg_batch_t){.cookie = cookie, .dir = dir, .outstanding = 1};
    b->next = s->batches;
    s->batches = b;
    s->n_batches++;
    /* the host regions' transfers in one inner batch */
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (!xfers[i].local->kind->async) {
            s->direct[k] = xfers[i];
            s->direct[k++].local = xfers[i].local->backend;
        }
    if (k > 0) {
        b->direct_cookie = ++s->next_inner;
        b->outstanding++;
        int rc = kvd_transport_post(s->inner, dir, s->direct, k, b->direct_cookie);
        if (rc != KVD_OK) {
            b->direct_cookie = 0;
            batch_part_done(b, rc);
        }
    }
    /* the device regions' transfers through slots, a slot's worth a part */
    stg_part_t *p = NULL;
    uint64_t used = 0;
    for (size_t i = 0; i < n && b->status == KVD_OK; i++) {
        const kvd_xfer_t *x = &xfers[i];
        if (!x->local->kind->async)
            continue;
        for (uint64_t off = 0; off < x->length && b->status == KVD_OK;) {
            if (p != NULL && (used == STAGE_SLOT_BYTES || p->n == MAX_COPIES ||
                              p->kind != x->local->kind)) {
                start_part(s, p);
                p = NULL;
            }
            if (p == NULL) {
                int slot = take_slot(s);
                if (slot < 0) { /* the rest is not sent */
                    b->status = slot == -1 ? KVD_ERR_CLOSED : KVD_ERR_TIMEOUT;
                    break;
                }
                p = &s->parts[slot];
                *p = (stg_part_t){.phase = PART_FREE, .batch = b, .kind = x->local->kind};
                b->outstanding++;
                used = 0;
            }
            uint64_t len = KVD_MIN(x->length - off, STAGE_SLOT_BYTES - used);
            uint64_t slot_off = (uint64_t)(p - s->parts) * STAGE_SLOT_BYTES + used;
            uint8_t *dev = x->local->base + x->local_offset + off;
            uint8_t *host = s->slot_mem + slot_off;
            p->copies[p->n] = dir == KVD_XFER_READ
                                  ? (kvd_copy_t){.dst = dev, .src = host, .n = len}
                                  : (kvd_copy_t){.dst = host, .src = dev, .n = len};
            p->wire[p->n] = (kvd_xfer_t){.local = s->slot_region,
                                         .local_offset = slot_off,
                                         .remote_offset = x->remote_offset + off,
                                         .length = len};
            p->n++;
            used += len;
            off += len;
        }
    }
    if (p != NULL)
        start_part(s, p);
    batch_part_done(b, KVD_OK); /* the post's own hold */
    reap(s);
    return KVD_OK;
}

static int stg_poll(kvd_transport_t *t, kvd_xfer_done_t *done, size_t max, size_t *n_done)
{
    stg_transport_t *s = (stg_transport_t *)t;
    drive(s);
    *n_done = kvd_done_ring_pop(&s->done, done, max);
    return KVD_OK;
}

static void stg_disconnect(kvd_transport_t *t)
{
    stg_transport_t *s = (stg_transport_t *)t;
    /* the inner reports what it had failed, once it no longer touches the slots */
    kvd_transport_disconnect(s->inner);
    drive(s);
    for (int k = 0; k < STAGE_SLOTS; k++) {
        stg_part_t *p = &s->parts[k];
        if (p->phase == PART_FREE)
            continue;
        if (p->mark != NULL)
            (void)kvd_memkind_mark_wait(p->kind,
                                        p->mark); /* no device copy lands later */
        batch_part_done(p->batch, KVD_ERR_CLOSED);
        part_free(p);
    }
    for (stg_batch_t *b = s->batches; b != NULL; b = b->next)
        if (b->direct_cookie != 0) {
            b->direct_cookie = 0;
            batch_part_done(b, KVD_ERR_CLOSED);
        }
    reap(s);
}

static void stg_destroy(kvd_transport_t *t)
{
    stg_transport_t *s = (stg_transport_t *)t;
    kvd_transport_deregister(s->inner, s->slot_region);
    kvd_transport_destroy(s->inner);
    if (s->pinned_rt != 0)
        kvd_gpu_unpin((kvd_gpu_runtime_t)s->pinned_rt, s->slot_mem);
    free(s->slot_mem);
    free(s->direct);
    kvd_done_ring_free(&s->done);
    free(s);
}

static const kvd_transport_ops_t stg_ops = {
    .name = "staged",
    .reg = stg_reg,
    .dereg = stg_dereg,
    .connect = stg_connect,
    .disconnect = stg_disconnect,
    .post = stg_post,
    .poll = stg_poll,
    .progress = stg_progress,
    .destroy = stg_destroy,
};

int kvd_transport_open_staged(kvd_transport_t *inner, int slot_wait_ms,
                              kvd_transport_t **out)
{
    if (inner == NULL || out == NULL || slot_wait_ms <= 0)
        return KVD_ERR_INVALID;
    stg_transport_t *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return KVD_ERR_NOMEM;
    size_t bytes = (size_t)STAGE_SLOTS * STAGE_SLOT_BYTES;
    if (posix_memalign((void **)&s->slot_mem, 4096, bytes) != 0) {
        free(s);
        return KVD_ERR_NOMEM;
    }
    memset(s->slot_mem, 0, bytes); /* faulted in now, not under a copy */
    int rc = kvd_transport_register(inner, s->slot_mem, bytes, kvd_memkind_host(),
                                    &s->slot_region);
    if (rc != KVD_OK) {
        free(s->slot_mem);
        free(s);
        return rc;
    }
    s->base.ops = &stg_ops;
    s->inner = inner;
    s->slot_wait_ms = slot_wait_ms;
    *out = &s->base;
    return KVD_OK;
}
