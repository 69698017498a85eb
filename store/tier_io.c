/*
 * tier_io.c - the SSD tier's I/O executor (tier_io.h): records (segment.h)
 * moved between the pool and segment files by an io_uring thread or by a
 * few pread/pwrite threads, their CRC-32Cs computed and checked there.
 *
 * What it owns: two queues of queue_depth entries under one mutex, the
 * ops submitted and not yet started (`pending`) and the completions not
 * yet polled (`done`); the completion eventfd; the backend's threads and
 * their aligned buffers (a header block per slot or worker, a bounce
 * buffer for each COPY while it runs); the ring and its registered
 * buffers (io_uring).
 *
 * Threads:
 *   the caller   tio_submit, tio_poll and the getters. It alone keeps
 *                in_flight (submitted and not yet polled), which bounds
 *                both queues: neither ever holds more than queue_depth.
 *   io_uring     one thread owns the ring (queue_depth SQEs, a CQ for
 *                every SQE that can be in flight: two per op and the wake
 *                poll): it takes pending ops into its slots, does their CPU
 *                work, submits their SQEs in batches, reaps the CQEs,
 *                resubmits what a short read or write left, and ends the
 *                ops. tio_submit wakes it through an eventfd the ring
 *                polls. Values move with READ_FIXED/WRITE_FIXED when the
 *                pool is registered and the value lies in one slice; header
 *                blocks and bounce buffers are plain.
 *   psync        min(queue_depth, 16) workers, each taking one op at a
 *                time from `pending` and doing it with pread/pwrite.
 * The executor's threads share nothing with the caller but the queues
 * (under the lock) and the stats (atomics).
 *
 * Invariants: every op taken by tio_submit ends with exactly one
 * completion in `done` (an op the executor cannot do ends with an error);
 * `signalled` (under the lock) is true exactly when the completion eventfd
 * has been written and not read since, and it is only read back when
 * `done` is empty, so the fd is readable whenever a completion waits.
 *
 * Shutdown (tio_destroy): `stopping` is set and the threads woken; they
 * do every op still pending or in the ring (disk ops: bounded), then
 * exit; completions are dropped with the queues. Memory: besides the
 * queues, a header block per slot or worker, and a bounce buffer of the
 * copied value + 4 KiB per COPY in flight (freed at its end; the tier
 * bounds the bytes of its copies in flight), all charged to
 * KVD_MEM_STAGING.
 */
#include "tier_io.h"

#include <errno.h>
#include <inttypes.h>
#include <liburing.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/uio.h>
#include <unistd.h>

#define TIO_QD_DEFAULT      32u
#define TIO_QD_MAX          4096u
#define TIO_PSYNC_THREADS   16u
#define TIO_SLICE_DEFAULT   (1ull << 30) /* also the kernel's most for one buffer */
#define TIO_REG_BUFFERS_MAX 16384u       /* the kernel's most registered buffers */
#define TIO_RW_MAX          (1ull << 30) /* one read or write SQE moves at most this */
#define TIO_WAKE_DATA       UINT64_MAX   /* user_data of the wake poll */
#define TIO_NOTE_BYTES      160

/* An aligned buffer of the executor's own, charged to staging memory. */
typedef struct tio_buf {
    void *raw;
    uint8_t *p; /* raw rounded up to SEG_BLOCK */
    size_t bytes;
} tio_buf_t;

/* The stats the executor's threads count. */
typedef struct tio_counters {
    _Atomic uint64_t reads, writes, copies, syncs, read_bytes, write_bytes;
    _Atomic uint64_t io_errors, checksum_failures, no_space;
} tio_counters_t;

typedef struct tio_uring tio_uring_t;
typedef struct tio_psync tio_psync_t;

/* A backend: its threads started, woken for new ops or to stop, joined. */
typedef struct tio_backend_ops {
    const char *name;
    int (*start)(tio_t *t);
    void (*kick)(tio_t *t);
    void (*stop)(tio_t *t);
} tio_backend_ops_t;

struct tio {
    tio_opts_t o; /* queue_depth and fixed_slice_bytes resolved */
    const tio_backend_ops_t *ops;
    pthread_mutex_t lock; /* the queues, stopping, signalled, the hooks' counts */
    pthread_cond_t cond;  /* psync workers wait on it for pending ops */
    tio_op_t *pending;
    uint32_t pending_head, pending_count;
    tio_done_t *done;
    uint32_t done_head, done_count;
    bool stopping;
    bool signalled;
    uint64_t read_ops;   /* READ and COPY ops started: fail_read_every counts them */
    uint64_t write_ops;  /* WRITE ops started: fail_writes counts them */
    uint32_t fail_syncs; /* SYNC ops still to fail (tio_fail_syncs) */
    _Atomic uint32_t copy_writes; /* COPY writes begun: fail_copy_writes counts them */
    int done_fd;
    uint32_t in_flight; /* the caller's thread only */
    bool fixed;         /* atomic: set on the ring's thread, read anywhere */
    bool want_register; /* atomic: tio_register_fixed asked */
    char note[TIO_NOTE_BYTES];
    tio_counters_t c;
    tio_uring_t *ur;
    tio_psync_t *ps;
};

/* ------------------------------------------------------------- buffers */

/* Allocates a zeroed buffer of `bytes` aligned to SEG_BLOCK: KVD_OK or
 * KVD_ERR_NOMEM. */
static int tio_buf_alloc(tio_buf_t *b, size_t bytes)
{
    b->raw = kvd_mem_calloc(KVD_MEM_STAGING, 1, bytes + SEG_BLOCK);
    if (b->raw == NULL)
        return KVD_ERR_NOMEM;
    b->p = (uint8_t *)kvd_align_up((uintptr_t)b->raw, SEG_BLOCK);
    b->bytes = bytes;
    return KVD_OK;
}

/* Frees b (never allocated is fine). */
static void tio_buf_free(tio_buf_t *b)
{
    if (b->raw != NULL)
        kvd_mem_free(KVD_MEM_STAGING, b->raw, b->bytes + SEG_BLOCK);
    memset(b, 0, sizeof(*b));
}

/* Gives the COPY bounce buffer of a slot or worker, allocated for each COPY
 * and freed at its end: header block and op's value (at most
 * max_value_bytes). NULL when out of memory or too large. */
static uint8_t *tio_bounce(const tio_t *t, const tio_op_t *op, tio_buf_t *b)
{
    if (op->value_bytes > t->o.max_value_bytes) {
        KVD_ERROR("tier_io", "a copy of %" PRIu64 " bytes, over the %" PRIu64 " allowed",
                  op->value_bytes, t->o.max_value_bytes);
        return NULL;
    }
    if (b->raw == NULL && tio_buf_alloc(b, SEG_BLOCK + op->value_bytes) != KVD_OK) {
        KVD_ERROR("tier_io", "no memory for a bounce buffer of %" PRIu64 " bytes",
                  SEG_BLOCK + op->value_bytes);
        return NULL;
    }
    return b->p;
}

/* ------------------------------------------------------------- records */

/* The status of an errno the device gave: no space for ENOSPC, EDQUOT and
 * EFBIG, an I/O error for anything else. */
static int tio_errno_status(int err)
{
    if (err == ENOSPC || err == EDQUOT || err == EFBIG)
        return KVD_ERR_NO_SPACE;
    return KVD_ERR_IO;
}

static const char *tio_kind_name(tio_kind_t kind)
{
    switch (kind) {
    case TIO_WRITE: return "write";
    case TIO_READ: return "read";
    case TIO_COPY: return "copy";
    case TIO_SYNC: return "sync";
    }
    return "op";
}

/* Fills the header block of a WRITE: the op's header with the format's
 * magic and version, its value's size and CRC-32C (from the pool), sealed. */
static void tio_rec_build(const tio_t *t, const tio_op_t *op, uint8_t *block)
{
    seg_rec_hdr_t h = op->hdr;
    const uint8_t *value = (const uint8_t *)t->o.pool_base + op->pool_off;
    h.magic = SEG_REC_MAGIC;
    h.version = SEG_VERSION;
    h.value_bytes = op->value_bytes;
    h.value_crc = kvd_crc32c(0, value, op->value_bytes);
    memset(block, 0, SEG_BLOCK);
    memcpy(block, &h, sizeof(h));
    seg_rec_seal(block);
}

/* Checks a record read for op (READ, COPY): a valid header of op's key
 * and size, and the value's CRC. KVD_OK with the header in *hdr, or
 * KVD_ERR_CORRUPT (logged). */
static int tio_rec_check(const tio_op_t *op, const uint8_t *block, const uint8_t *value,
                         seg_rec_hdr_t *hdr)
{
    const char *why = NULL;
    memcpy(hdr, block, sizeof(*hdr));
    if (!seg_rec_valid(block))
        why = "the header's magic, version or CRC is wrong";
    else if (memcmp(hdr->key, op->key, KVD_KEY_BYTES) != 0)
        why = "the header is of another key";
    else if (hdr->value_bytes != op->value_bytes)
        why = "the header's value size differs";
    else if (kvd_crc32c(0, value, op->value_bytes) != hdr->value_crc)
        why = "the value's CRC is wrong";
    if (why == NULL)
        return KVD_OK;
    KVD_WARN("tier_io", "%s of the record at offset %" PRIu64 " of fd %d: %s",
             tio_kind_name(op->kind), op->file_off, op->fd, why);
    return KVD_ERR_CORRUPT;
}

/* COPY: gives the checked record in `bounce` its new generation and
 * sequence number (tier_io.h) and reseals its header. */
static void tio_rec_regenerate(const tio_op_t *op, uint8_t *bounce)
{
    seg_rec_hdr_t h;
    memcpy(&h, bounce, sizeof(h));
    h.generation = op->dst_generation;
    if (op->dst_seq != 0)
        h.seq = op->dst_seq;
    memcpy(bounce, &h, sizeof(h));
    seg_rec_seal(bounce);
}

/* Whether op can be done at all: a known kind, block-aligned offsets and
 * size, its value inside the pool (WRITE, READ) or the bounce buffer
 * (COPY). Logs why not. */
static bool tio_op_valid(const tio_t *t, const tio_op_t *op)
{
    const char *why = NULL;
    bool in_pool = op->pool_off <= t->o.pool_bytes &&
                   op->value_bytes <= t->o.pool_bytes - op->pool_off;
    if (op->kind != TIO_WRITE && op->kind != TIO_READ && op->kind != TIO_COPY &&
        op->kind != TIO_SYNC)
        why = "unknown kind";
    else if (op->kind == TIO_SYNC)
        why = op->fd < 0 ? "sync of no file" : NULL;
    else if ((op->file_off | op->value_bytes) % SEG_BLOCK != 0)
        why = "offset or size not a multiple of the block";
    else if (op->kind != TIO_COPY && (op->pool_off % SEG_BLOCK != 0 || !in_pool))
        why = "value outside the pool or not block-aligned there";
    else if (op->kind == TIO_COPY &&
             (op->dst_off % SEG_BLOCK != 0 || op->value_bytes > t->o.max_value_bytes))
        why = "copy to an unaligned offset or larger than max_value_bytes";
    if (why == NULL)
        return true;
    KVD_ERROR("tier_io", "%s op (tag %" PRIu64 ") refused: %s", tio_kind_name(op->kind),
              op->tag, why);
    return false;
}

/* --------------------------------------------------------------- queues */

/* Puts a completion in `done` and makes the event fd readable if it was
 * not. Under t->lock. */
static void tio_post_locked(tio_t *t, const tio_done_t *d)
{
    uint32_t qd = t->o.queue_depth;
    t->done[(t->done_head + t->done_count) % qd] = *d;
    t->done_count++;
    if (!t->signalled) {
        uint64_t one = 1;
        if (write(t->done_fd, &one, sizeof(one)) != sizeof(one))
            KVD_ERROR("tier_io", "writing the completion eventfd: %s", strerror(errno));
        t->signalled = true;
    }
}

/* Counts an op's end in the stats (executor threads). */
static void tio_count(tio_t *t, const tio_op_t *op, int status)
{
    tio_counters_t *c = &t->c;
    if (status == KVD_OK && op->kind == TIO_SYNC) {
        atomic_fetch_add_explicit(&c->syncs, 1, memory_order_relaxed);
    } else if (status == KVD_OK) {
        if (op->kind == TIO_WRITE)
            atomic_fetch_add_explicit(&c->writes, 1, memory_order_relaxed);
        else if (op->kind == TIO_READ)
            atomic_fetch_add_explicit(&c->reads, 1, memory_order_relaxed);
        else
            atomic_fetch_add_explicit(&c->copies, 1, memory_order_relaxed);
        /* a COPY moves its value both ways */
        if (op->kind != TIO_READ)
            atomic_fetch_add_explicit(&c->write_bytes, op->value_bytes,
                                      memory_order_relaxed);
        if (op->kind != TIO_WRITE)
            atomic_fetch_add_explicit(&c->read_bytes, op->value_bytes,
                                      memory_order_relaxed);
    } else if (status == KVD_ERR_IO) {
        atomic_fetch_add_explicit(&c->io_errors, 1, memory_order_relaxed);
    } else if (status == KVD_ERR_CORRUPT) {
        atomic_fetch_add_explicit(&c->checksum_failures, 1, memory_order_relaxed);
    } else if (status == KVD_ERR_NO_SPACE) {
        atomic_fetch_add_explicit(&c->no_space, 1, memory_order_relaxed);
    }
}

/* Ends op: counts it and posts its completion (hdr: the header read, or
 * NULL). Executor threads. */
static void tio_finish(tio_t *t, const tio_op_t *op, int status, int sys_errno,
                       const seg_rec_hdr_t *hdr, bool write_failed)
{
    tio_done_t d = {.tag = op->tag,
                    .status = status,
                    .kind = op->kind,
                    .write_failed = status != KVD_OK && write_failed};
    if (status == KVD_ERR_IO || status == KVD_ERR_NO_SPACE)
        d.sys_errno = sys_errno;
    if (status == KVD_OK && hdr != NULL)
        d.hdr = *hdr;
    tio_count(t, op, status);
    pthread_mutex_lock(&t->lock);
    tio_post_locked(t, &d);
    pthread_mutex_unlock(&t->lock);
}

/* Takes the oldest pending op into *op, waiting for one when `wait`.
 * *fail says a test hook fails it (fail_read_every, fail_writes,
 * tio_fail_syncs; ops counted in order of taking). False when none is
 * pending (with `wait`: and stopping). */
static bool tio_take(tio_t *t, bool wait, tio_op_t *op, bool *fail)
{
    pthread_mutex_lock(&t->lock);
    while (wait && t->pending_count == 0 && !t->stopping)
        pthread_cond_wait(&t->cond, &t->lock);
    bool got = t->pending_count > 0;
    if (got) {
        *op = t->pending[t->pending_head];
        t->pending_head = (t->pending_head + 1) % t->o.queue_depth;
        t->pending_count--;
        *fail = false;
        if ((op->kind == TIO_READ || op->kind == TIO_COPY) && t->o.fail_read_every != 0)
            *fail = ++t->read_ops % t->o.fail_read_every == 0;
        if (op->kind == TIO_WRITE && t->o.fail_writes != 0)
            *fail = ++t->write_ops <= t->o.fail_writes;
        if (op->kind == TIO_SYNC && t->fail_syncs > 0) {
            t->fail_syncs--;
            *fail = true;
        }
    }
    pthread_mutex_unlock(&t->lock);
    return got;
}

/* Ends an op the test hook fails, as the device would with EIO. */
static void tio_fail_hooked(tio_t *t, const tio_op_t *op)
{
    KVD_DEBUG("tier_io", "%s (tag %" PRIu64 ") failed by a test hook",
              tio_kind_name(op->kind), op->tag);
    tio_finish(t, op, KVD_ERR_IO, EIO, NULL, false);
}

void tio_fail_syncs(tio_t *t, uint32_t n)
{
    pthread_mutex_lock(&t->lock);
    t->fail_syncs = n;
    pthread_mutex_unlock(&t->lock);
}

/* Whether the test hook fails this COPY's write (fail_copy_writes); logs it.
 * Executor threads. */
static bool tio_copy_write_hooked(tio_t *t, const tio_op_t *op)
{
    if (t->o.fail_copy_writes == 0 ||
        atomic_fetch_add(&t->copy_writes, 1) >= t->o.fail_copy_writes)
        return false;
    KVD_DEBUG("tier_io", "copy (tag %" PRIu64 ") write failed by fail_copy_writes",
              op->tag);
    return true;
}

/* Logs a failed read or write of op's. */
static void tio_log_io(const tio_op_t *op, bool is_write, int fd, uint64_t off, int err)
{
    if (err == 0)
        KVD_WARN("tier_io", "%s (tag %" PRIu64 "): fd %d ends before offset %" PRIu64,
                 tio_kind_name(op->kind), op->tag, fd, off);
    else
        KVD_WARN("tier_io", "%s (tag %" PRIu64 "): %s of fd %d at %" PRIu64 ": %s",
                 tio_kind_name(op->kind), op->tag, is_write ? "pwrite" : "pread", fd, off,
                 strerror(err));
}

/* ------------------------------------------------------- psync backend */

/* One pread/pwrite worker and its buffers. */
typedef struct psync_worker {
    tio_t *t;
    pthread_t thread;
    bool started;
    tio_buf_t block;  /* the header block of a WRITE or READ */
    tio_buf_t bounce; /* COPY, on first use */
} psync_worker_t;

struct tio_psync {
    psync_worker_t w[TIO_PSYNC_THREADS];
    uint32_t n;
};

/* Reads or writes all of buf[0, len) at off, resuming after short counts
 * and EINTR. KVD_OK; KVD_ERR_CORRUPT when a read meets the end of the
 * file (a truncated record); else the errno's status, the errno in *err.
 * Logs failures. */
/* A record's header block and its value in one call each time (pwritev,
 * preadv: they are neighbours in the file), looping for short counts. */
static int psync_rw2(const tio_op_t *op, bool is_write, int fd, uint8_t *block,
                     uint8_t *value, uint64_t value_len, uint64_t off, int *err)
{
    uint64_t len = SEG_BLOCK + value_len, done = 0;
    while (done < len) {
        struct iovec iov[2];
        int n_iov = 0;
        if (done < SEG_BLOCK)
            iov[n_iov++] = (struct iovec){block + done, SEG_BLOCK - done};
        uint64_t vdone = done < SEG_BLOCK ? 0 : done - SEG_BLOCK;
        if (vdone < value_len)
            iov[n_iov++] = (struct iovec){value + vdone,
                                          (size_t)KVD_MIN(value_len - vdone, TIO_RW_MAX)};
        ssize_t n = is_write ? pwritev(fd, iov, n_iov, (off_t)(off + done))
                             : preadv(fd, iov, n_iov, (off_t)(off + done));
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            *err = n < 0 ? errno : (is_write ? ENOSPC : 0);
            tio_log_io(op, is_write, fd, off + done, *err);
            return *err == 0 ? KVD_ERR_CORRUPT : tio_errno_status(*err);
        }
        done += (uint64_t)n;
    }
    return KVD_OK;
}

/* WRITE with pwrite: the sealed header block, then the value. */
static int psync_write(tio_t *t, psync_worker_t *w, const tio_op_t *op, int *err)
{
    tio_rec_build(t, op, w->block.p);
    return psync_rw2(op, true, op->fd, w->block.p,
                     (uint8_t *)t->o.pool_base + op->pool_off, op->value_bytes,
                     op->file_off, err);
}

/* READ with pread: header block and value, then the checks. */
static int psync_read(tio_t *t, psync_worker_t *w, const tio_op_t *op, int *err,
                      seg_rec_hdr_t *hdr)
{
    uint8_t *value = (uint8_t *)t->o.pool_base + op->pool_off;
    int rc = psync_rw2(op, false, op->fd, w->block.p, value, op->value_bytes,
                       op->file_off, err);
    if (rc == KVD_OK)
        rc = tio_rec_check(op, w->block.p, value, hdr);
    return rc;
}

/* COPY through the worker's bounce buffer: read, check, regenerate, write;
 * *write_failed says a failure was the write's. */
static int psync_copy(tio_t *t, psync_worker_t *w, const tio_op_t *op, int *err,
                      bool *write_failed)
{
    seg_rec_hdr_t hdr;
    uint8_t *b = tio_bounce(t, op, &w->bounce);
    if (b == NULL)
        return KVD_ERR_NOMEM;
    int rc = psync_rw2(op, false, op->fd, b, b + SEG_BLOCK, op->value_bytes, op->file_off,
                       err);
    if (rc == KVD_OK)
        rc = tio_rec_check(op, b, b + SEG_BLOCK, &hdr);
    if (rc == KVD_OK) {
        tio_rec_regenerate(op, b);
        *write_failed = true;
        if (tio_copy_write_hooked(t, op)) {
            *err = EIO;
            rc = KVD_ERR_IO;
        } else {
            rc = psync_rw2(op, true, op->dst_fd, b, b + SEG_BLOCK, op->value_bytes,
                           op->dst_off, err);
        }
    }
    tio_buf_free(&w->bounce); /* compaction is rare: no worker keeps one */
    return rc;
}

/* Does one op and posts its completion. */
static void psync_exec(tio_t *t, psync_worker_t *w, const tio_op_t *op)
{
    seg_rec_hdr_t hdr;
    int err = 0, rc;
    bool write_failed = false;
    if (op->kind == TIO_SYNC) {
        rc = KVD_OK;
        if (fdatasync(op->fd) != 0) {
            err = errno;
            KVD_WARN("tier_io", "sync (tag %" PRIu64 "): fdatasync of fd %d: %s", op->tag,
                     op->fd, strerror(err));
            rc = tio_errno_status(err);
        }
    } else if (op->kind == TIO_WRITE)
        rc = psync_write(t, w, op, &err);
    else if (op->kind == TIO_READ)
        rc = psync_read(t, w, op, &err, &hdr);
    else
        rc = psync_copy(t, w, op, &err, &write_failed);
    tio_finish(t, op, rc, err, op->kind == TIO_READ ? &hdr : NULL, write_failed);
}

/* A worker: takes ops until the executor stops and none is pending. */
static void *psync_main(void *arg)
{
    psync_worker_t *w = arg;
    tio_op_t op;
    bool fail;
    while (tio_take(w->t, true, &op, &fail)) {
        if (fail)
            tio_fail_hooked(w->t, &op);
        else
            psync_exec(w->t, w, &op);
    }
    return NULL;
}

/* Wakes the workers: ops are pending, or the executor stops. */
static void psync_kick(tio_t *t)
{
    pthread_mutex_lock(&t->lock);
    pthread_cond_broadcast(&t->cond);
    pthread_mutex_unlock(&t->lock);
}

/* Joins the workers (stopping is set) and frees them. */
static void psync_stop(tio_t *t)
{
    tio_psync_t *ps = t->ps;
    if (ps == NULL)
        return;
    psync_kick(t);
    for (uint32_t i = 0; i < ps->n; i++) {
        if (ps->w[i].started)
            pthread_join(ps->w[i].thread, NULL);
        tio_buf_free(&ps->w[i].block);
        tio_buf_free(&ps->w[i].bounce);
    }
    kvd_mem_free(KVD_MEM_OTHER, ps, sizeof(*ps));
    t->ps = NULL;
}

/* Starts min(queue_depth, 16) workers. KVD_OK or KVD_ERR_NOMEM (memory or
 * a thread; logged), with nothing left running on failure. */
static int psync_start(tio_t *t)
{
    tio_psync_t *ps = kvd_mem_calloc(KVD_MEM_OTHER, 1, sizeof(*ps));
    if (ps == NULL)
        return KVD_ERR_NOMEM;
    t->ps = ps;
    ps->n = KVD_MIN(t->o.queue_depth, TIO_PSYNC_THREADS);
    for (uint32_t i = 0; i < ps->n; i++) {
        psync_worker_t *w = &ps->w[i];
        w->t = t;
        if (tio_buf_alloc(&w->block, SEG_BLOCK) != KVD_OK)
            goto fail_stop;
        int err = pthread_create(&w->thread, NULL, psync_main, w);
        if (err != 0) {
            KVD_ERROR("tier_io", "starting a pread/pwrite worker: %s", strerror(err));
            goto fail_stop;
        }
        w->started = true;
    }
    return KVD_OK;
fail_stop:
    pthread_mutex_lock(&t->lock);
    t->stopping = true;
    pthread_mutex_unlock(&t->lock);
    psync_stop(t);
    return KVD_ERR_NOMEM;
}

static const tio_backend_ops_t psync_ops = {
    .name = "pread/pwrite",
    .start = psync_start,
    .kick = psync_kick,
    .stop = psync_stop,
};

/* ---------------------------------------------------- io_uring backend */

/* One read or write of an op: a header block, a value, or a COPY's whole
 * record in its bounce buffer. */
typedef struct ur_part {
    uint8_t *buf;
    uint64_t len, done, off;
    int fd;
    int buf_index; /* the registered buffer holding buf; -1: a plain one */
    bool is_write;
    bool is_sync; /* an fdatasync: no buffer, res 0 is its success */
    /* a header block and a value in one readv/writev (plain buffers: they
     * are neighbours in the file): buf is then the block, len counts both */
    uint8_t *value;
    struct iovec iov[2]; /* of the SQE in flight */
} ur_part_t;

/* An op in the ring: its parts, the first failure among them, its buffers. */
typedef struct ur_slot {
    tio_op_t op;
    ur_part_t part[2];
    uint32_t n_parts, pending; /* parts in this phase; those not ended */
    int status, err;
    bool copy_writing; /* COPY: checked and being written to dst */
    tio_buf_t block, bounce;
    uint32_t next_free;
} ur_slot_t;

struct tio_uring {
    struct io_uring ring;
    bool ring_up;
    pthread_t thread;
    bool thread_up;
    int wake_fd; /* tio_submit and tio_destroy write it; the ring polls it */
    bool wake_armed;
    ur_slot_t *slots; /* queue_depth of them */
    uint32_t free_head, active;
    uint64_t slice_bytes; /* of the registered buffers; 0: none */
};

/* An SQE, submitting what is queued when the SQ is full. */
static struct io_uring_sqe *uring_sqe(tio_uring_t *u)
{
    struct io_uring_sqe *sqe;
    while ((sqe = io_uring_get_sqe(&u->ring)) == NULL) {
        int rc = io_uring_submit(&u->ring);
        if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY) {
            KVD_ERROR("tier_io", "io_uring_submit: %s", strerror(-rc));
            kvd_sleep_ns(1000000);
        }
    }
    return sqe;
}

/* The registered buffer holding pool[pool_off, + bytes), or -1 when the
 * pool is not registered or the range crosses two slices. */
static int uring_buf_index(const tio_t *t, uint64_t pool_off, uint64_t bytes)
{
    uint64_t slice = t->ur->slice_bytes;
    if (slice == 0 || bytes == 0)
        return -1;
    uint64_t k = pool_off / slice;
    return (pool_off + bytes - 1) / slice == k ? (int)k : -1;
}

/* Queues an SQE for what is left of part k of slot s. */
static void uring_part_submit(tio_uring_t *u, ur_slot_t *s, uint32_t k)
{
    ur_part_t *p = &s->part[k];
    struct io_uring_sqe *sqe = uring_sqe(u);
    uint8_t *buf = p->buf + p->done;
    unsigned len = (unsigned)KVD_MIN(p->len - p->done, TIO_RW_MAX);
    uint64_t off = p->off + p->done;
    if (p->is_sync) {
        io_uring_prep_fsync(sqe, p->fd, IORING_FSYNC_DATASYNC);
    } else if (p->value != NULL) {
        unsigned n = 0;
        if (p->done < SEG_BLOCK)
            p->iov[n++] = (struct iovec){p->buf + p->done, SEG_BLOCK - p->done};
        uint64_t vdone = p->done < SEG_BLOCK ? 0 : p->done - SEG_BLOCK;
        if (vdone < p->len - SEG_BLOCK)
            p->iov[n++] =
                (struct iovec){p->value + vdone,
                               (size_t)KVD_MIN(p->len - SEG_BLOCK - vdone, TIO_RW_MAX)};
        if (p->is_write)
            io_uring_prep_writev(sqe, p->fd, p->iov, n, off);
        else
            io_uring_prep_readv(sqe, p->fd, p->iov, n, off);
    } else if (p->buf_index >= 0 && p->is_write)
        io_uring_prep_write_fixed(sqe, p->fd, buf, len, off, p->buf_index);
    else if (p->buf_index >= 0)
        io_uring_prep_read_fixed(sqe, p->fd, buf, len, off, p->buf_index);
    else if (p->is_write)
        io_uring_prep_write(sqe, p->fd, buf, len, off);
    else
        io_uring_prep_read(sqe, p->fd, buf, len, off);
    io_uring_sqe_set_data64(sqe, ((uint64_t)(s - u->slots) << 1) | k);
}

/* Sets part k of slot s and queues its first SQE. */
static void uring_part_start(tio_uring_t *u, ur_slot_t *s, uint32_t k, ur_part_t part)
{
    s->part[k] = part;
    uring_part_submit(u, s, k);
}

/* Starts the first phase of op in a free slot: WRITE (its header sealed
 * here) and READ as a header block and a value, COPY as one read of the
 * whole record into the slot's bounce buffer. */
static void uring_start_op(tio_t *t, const tio_op_t *op)
{
    tio_uring_t *u = t->ur;
    ur_slot_t *s = &u->slots[u->free_head];
    uint8_t *value = (uint8_t *)t->o.pool_base + op->pool_off;
    bool w = op->kind == TIO_WRITE;
    if (op->kind == TIO_COPY && tio_bounce(t, op, &s->bounce) == NULL) {
        tio_finish(t, op, KVD_ERR_NOMEM, 0, NULL, false);
        return;
    }
    u->free_head = s->next_free;
    u->active++;
    s->op = *op;
    s->status = KVD_OK;
    s->err = 0;
    s->copy_writing = false;
    if (op->kind == TIO_SYNC) {
        s->n_parts = s->pending = 1;
        uring_part_start(u, s, 0,
                         (ur_part_t){.fd = op->fd, .buf_index = -1, .is_sync = true});
        return;
    }
    if (op->kind == TIO_COPY) {
        s->n_parts = s->pending = 1;
        uring_part_start(u, s, 0,
                         (ur_part_t){.buf = s->bounce.p,
                                     .len = SEG_BLOCK + op->value_bytes,
                                     .off = op->file_off,
                                     .fd = op->fd,
                                     .buf_index = -1});
        return;
    }
    if (w)
        tio_rec_build(t, op, s->block.p);
    int index = uring_buf_index(t, op->pool_off, op->value_bytes);
    if (op->value_bytes > 0 && index < 0) {
        /* plain buffers: header and value in one SQE */
        s->n_parts = s->pending = 1;
        uring_part_start(u, s, 0,
                         (ur_part_t){.buf = s->block.p,
                                     .len = SEG_BLOCK + op->value_bytes,
                                     .off = op->file_off,
                                     .fd = op->fd,
                                     .buf_index = -1,
                                     .is_write = w,
                                     .value = value});
        return;
    }
    s->n_parts = s->pending = op->value_bytes > 0 ? 2 : 1;
    uring_part_start(u, s, 0,
                     (ur_part_t){.buf = s->block.p,
                                 .len = SEG_BLOCK,
                                 .off = op->file_off,
                                 .fd = op->fd,
                                 .buf_index = -1,
                                 .is_write = w});
    if (s->n_parts == 2)
        uring_part_start(u, s, 1,
                         (ur_part_t){.buf = value,
                                     .len = op->value_bytes,
                                     .off = op->file_off + SEG_BLOCK,
                                     .fd = op->fd,
                                     .buf_index = index,
                                     .is_write = w});
}

/* Ends the op of slot s and frees the slot. */
static void uring_end_op(tio_t *t, ur_slot_t *s, int status, const seg_rec_hdr_t *hdr)
{
    tio_uring_t *u = t->ur;
    tio_finish(t, &s->op, status, s->err, hdr, s->copy_writing);
    tio_buf_free(&s->bounce); /* compaction is rare: no slot keeps one */
    s->next_free = u->free_head;
    u->free_head = (uint32_t)(s - u->slots);
    u->active--;
}

/* All parts of slot s's phase ended: checks a READ, turns a checked COPY
 * around to its destination, or ends the op. */
static void uring_phase_done(tio_t *t, ur_slot_t *s)
{
    seg_rec_hdr_t hdr;
    const tio_op_t *op = &s->op;
    int rc = s->status;
    if (rc != KVD_OK || op->kind == TIO_WRITE || op->kind == TIO_SYNC ||
        s->copy_writing) {
        uring_end_op(t, s, rc, NULL);
    } else if (op->kind == TIO_READ) {
        rc =
            tio_rec_check(op, s->block.p, (uint8_t *)t->o.pool_base + op->pool_off, &hdr);
        uring_end_op(t, s, rc, &hdr);
    } else if ((rc = tio_rec_check(op, s->bounce.p, s->bounce.p + SEG_BLOCK, &hdr)) !=
               KVD_OK) {
        uring_end_op(t, s, rc, NULL);
    } else if (tio_copy_write_hooked(t, op)) {
        s->copy_writing = true;
        s->err = EIO;
        uring_end_op(t, s, KVD_ERR_IO, NULL);
    } else {
        tio_rec_regenerate(op, s->bounce.p);
        s->copy_writing = true;
        s->n_parts = s->pending = 1;
        uring_part_start(t->ur, s, 0,
                         (ur_part_t){.buf = s->bounce.p,
                                     .len = SEG_BLOCK + op->value_bytes,
                                     .off = op->dst_off,
                                     .fd = op->dst_fd,
                                     .buf_index = -1,
                                     .is_write = true});
    }
}

/* A CQE of part k of slot s: counts the bytes, queues the rest of a short
 * read or write, keeps the first failure (a read that meets the end of
 * the file: a truncated record), and moves the op on when its parts are
 * all done. */
static void uring_part_done(tio_t *t, ur_slot_t *s, uint32_t k, int res)
{
    ur_part_t *p = &s->part[k];
    if (p->is_sync && res < 0 && s->status == KVD_OK) {
        KVD_WARN("tier_io", "sync (tag %" PRIu64 "): fdatasync of fd %d: %s", s->op.tag,
                 p->fd, strerror(-res));
        s->status = tio_errno_status(-res);
        s->err = -res;
    } else if (p->is_sync) {
        /* ended: res 0 */
    } else if (res > 0) {
        p->done += (uint64_t)res;
        if (p->done < p->len) {
            uring_part_submit(t->ur, s, k);
            return;
        }
    } else if (s->status == KVD_OK) {
        int err = res < 0 ? -res : (p->is_write ? ENOSPC : 0);
        tio_log_io(&s->op, p->is_write, p->fd, p->off + p->done, err);
        s->status = err == 0 ? KVD_ERR_CORRUPT : tio_errno_status(err);
        s->err = err;
    }
    if (--s->pending == 0)
        uring_phase_done(t, s);
}

/* The wake poll fired: clears the eventfd so it can be polled again. */
static void uring_woken(tio_uring_t *u)
{
    uint64_t v;
    if (read(u->wake_fd, &v, sizeof(v)) < 0 && errno != EAGAIN)
        KVD_ERROR("tier_io", "reading the wake eventfd: %s", strerror(errno));
    u->wake_armed = false;
}

/* Handles every CQE waiting in the ring, each marked seen before it is
 * handled (handling may queue SQEs, and the CQ then has room for theirs). */
static void uring_reap(tio_t *t)
{
    tio_uring_t *u = t->ur;
    struct io_uring_cqe *cqe;
    while (io_uring_peek_cqe(&u->ring, &cqe) == 0) {
        uint64_t data = io_uring_cqe_get_data64(cqe);
        int res = cqe->res;
        io_uring_cqe_seen(&u->ring, cqe);
        if (data == TIO_WAKE_DATA)
            uring_woken(u);
        else
            uring_part_done(t, &u->slots[data >> 1], (uint32_t)(data & 1), res);
    }
}

/* Moves pending ops into free slots (never short of one: no more than
 * queue_depth ops are in flight). */
static void uring_take_pending(tio_t *t)
{
    tio_op_t op;
    bool fail;
    while (t->ur->active < t->o.queue_depth && tio_take(t, false, &op, &fail)) {
        if (fail)
            tio_fail_hooked(t, &op);
        else
            uring_start_op(t, &op);
    }
}

/* True when the executor stops and has nothing left to do. */
static bool uring_finished(tio_t *t)
{
    pthread_mutex_lock(&t->lock);
    bool done = t->stopping && t->pending_count == 0;
    pthread_mutex_unlock(&t->lock);
    return done && t->ur->active == 0;
}

static void uring_register_pool(tio_t *t, char *note);

/* The ring's thread: takes ops, submits their SQEs in one batch, waits for
 * at least one CQE (an op's or the wake poll's) and handles them all. */
static void *uring_main(void *arg)
{
    tio_t *t = arg;
    tio_uring_t *u = t->ur;
    for (;;) {
        if (__atomic_exchange_n(&t->want_register, false, __ATOMIC_ACQ_REL) &&
            !__atomic_load_n(&t->fixed, __ATOMIC_ACQUIRE)) {
            /* the loop may read t->note: this thread keeps its own */
            char note[TIO_NOTE_BYTES] = "";
            uring_register_pool(t, note);
            char slice[32];
            if (__atomic_load_n(&t->fixed, __ATOMIC_ACQUIRE))
                KVD_INFO("tier_io",
                         "the pool is registered: fixed buffers (slices of %s at "
                         "most)",
                         kvd_size_format(t->o.fixed_slice_bytes, slice, sizeof(slice)));
            else
                KVD_INFO("tier_io", "the pool stays in plain buffers: %s", note);
        }
        uring_take_pending(t);
        if (uring_finished(t))
            break;
        if (!u->wake_armed) {
            struct io_uring_sqe *sqe = uring_sqe(u);
            io_uring_prep_poll_add(sqe, u->wake_fd, POLLIN);
            io_uring_sqe_set_data64(sqe, TIO_WAKE_DATA);
            u->wake_armed = true;
        }
        int rc = io_uring_submit_and_wait(&u->ring, 1);
        if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY) {
            KVD_ERROR("tier_io", "io_uring_submit_and_wait: %s", strerror(-rc));
            kvd_sleep_ns(1000000);
        }
        uring_reap(t);
    }
    return NULL;
}

/* Wakes the ring's thread: ops are pending, or the executor stops. */
static void uring_kick(tio_t *t)
{
    uint64_t one = 1;
    if (write(t->ur->wake_fd, &one, sizeof(one)) != sizeof(one))
        KVD_ERROR("tier_io", "writing the wake eventfd: %s", strerror(errno));
}

/* Whether RLIMIT_MEMLOCK lets the whole pool be pinned; the note says why
 * not. (A process with CAP_IPC_LOCK is not charged by the kernel, but the
 * limit is what the operator set: it is respected regardless.) */
static bool uring_memlock_allows(tio_t *t, char *note)
{
    struct rlimit rl;
    char need[32], have[32];
    if (getrlimit(RLIMIT_MEMLOCK, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY ||
        t->o.pool_bytes <= rl.rlim_cur)
        return true;
    snprintf(note, TIO_NOTE_BYTES, "fixed buffers need %s of RLIMIT_MEMLOCK, %s allowed",
             kvd_size_format(t->o.pool_bytes, need, sizeof(need)),
             kvd_size_format(rl.rlim_cur, have, sizeof(have)));
    return false;
}

/* Notes why registering failed: the kernel's ENOMEM mostly means the
 * pinned pages went over RLIMIT_MEMLOCK with what this user has locked
 * already (the kernel charges more than the pool alone), so it names the
 * limit. */
static void uring_note_register_failed(tio_t *t, int err, char *note)
{
    struct rlimit rl;
    char need[32], have[32];
    if (err != ENOMEM || getrlimit(RLIMIT_MEMLOCK, &rl) != 0 ||
        rl.rlim_cur == RLIM_INFINITY) {
        snprintf(note, TIO_NOTE_BYTES, "io_uring_register_buffers: %s", strerror(err));
        return;
    }
    snprintf(note, TIO_NOTE_BYTES,
             "io_uring_register_buffers: %s (pinning %s, RLIMIT_MEMLOCK %s)",
             strerror(err), kvd_size_format(t->o.pool_bytes, need, sizeof(need)),
             kvd_size_format(rl.rlim_cur, have, sizeof(have)));
}

/* Registers the pool as fixed buffers of fixed_slice_bytes each when it is
 * asked for and allowed; else leaves it plain with the reason in the
 * note. */
static void uring_register_pool(tio_t *t, char *note)
{
    uint64_t slice = t->o.fixed_slice_bytes;
    if (slice == UINT64_MAX)
        return;
    uint64_t n = (t->o.pool_bytes + slice - 1) / slice;
    if (n > TIO_REG_BUFFERS_MAX) {
        snprintf(note, TIO_NOTE_BYTES,
                 "fixed buffers: %" PRIu64 " slices, the kernel takes %u", n,
                 TIO_REG_BUFFERS_MAX);
        return;
    }
    if (!uring_memlock_allows(t, note))
        return;
    struct iovec *iov = kvd_mem_calloc(KVD_MEM_OTHER, n, sizeof(*iov));
    if (iov == NULL) {
        snprintf(note, TIO_NOTE_BYTES, "fixed buffers: no memory");
        return;
    }
    for (uint64_t k = 0; k < n; k++) {
        iov[k].iov_base = (uint8_t *)t->o.pool_base + k * slice;
        iov[k].iov_len = KVD_MIN(slice, t->o.pool_bytes - k * slice);
    }
    int rc = io_uring_register_buffers(&t->ur->ring, iov, (unsigned)n);
    kvd_mem_free(KVD_MEM_OTHER, iov, n * sizeof(*iov));
    if (rc < 0) {
        uring_note_register_failed(t, -rc, note);
        return;
    }
    t->ur->slice_bytes = slice;
    __atomic_store_n(&t->fixed, true, __ATOMIC_RELEASE);
}

/* Sets up the ring: queue_depth SQ entries, a CQ for every SQE that can be
 * in flight (two per op and the wake poll). KVD_OK or KVD_ERR_UNSUPPORTED
 * with the reason in the note. */
static int uring_ring_init(tio_t *t)
{
    struct io_uring_params p;
    memset(&p, 0, sizeof(p));
    p.flags = IORING_SETUP_CQSIZE;
    p.cq_entries = 2 * t->o.queue_depth + 1;
    int rc = io_uring_queue_init_params(t->o.queue_depth, &t->ur->ring, &p);
    if (rc < 0) {
        snprintf(t->note, sizeof(t->note), "io_uring_queue_init: %s", strerror(-rc));
        return KVD_ERR_UNSUPPORTED;
    }
    t->ur->ring_up = true;
    return KVD_OK;
}

/* Allocates the slots and their header blocks, chained free. */
static int uring_slots_init(tio_t *t)
{
    tio_uring_t *u = t->ur;
    uint32_t qd = t->o.queue_depth;
    u->slots = kvd_mem_calloc(KVD_MEM_OTHER, qd, sizeof(*u->slots));
    if (u->slots == NULL)
        return KVD_ERR_NOMEM;
    for (uint32_t i = 0; i < qd; i++) {
        if (tio_buf_alloc(&u->slots[i].block, SEG_BLOCK) != KVD_OK)
            return KVD_ERR_NOMEM;
        u->slots[i].next_free = i + 1;
    }
    u->free_head = 0;
    return KVD_OK;
}

/* Joins the ring's thread (stopping is set), tears the ring down and
 * frees the slots. Also undoes a uring_start that failed midway. */
static void uring_stop(tio_t *t)
{
    tio_uring_t *u = t->ur;
    if (u == NULL)
        return;
    if (u->thread_up) {
        uring_kick(t);
        pthread_join(u->thread, NULL);
    }
    if (u->ring_up)
        io_uring_queue_exit(&u->ring);
    if (u->wake_fd >= 0)
        close(u->wake_fd);
    for (uint32_t i = 0; u->slots != NULL && i < t->o.queue_depth; i++) {
        tio_buf_free(&u->slots[i].block);
        tio_buf_free(&u->slots[i].bounce);
    }
    if (u->slots != NULL)
        kvd_mem_free(KVD_MEM_OTHER, u->slots, t->o.queue_depth * sizeof(*u->slots));
    kvd_mem_free(KVD_MEM_OTHER, u, sizeof(*u));
    t->ur = NULL;
    t->fixed = false;
}

/* Sets up the ring, the pool's registration, the slots and the thread.
 * KVD_OK; KVD_ERR_UNSUPPORTED (no ring: the note says why) or
 * KVD_ERR_NOMEM (memory, an fd or a thread; logged), with everything
 * undone. */
static int uring_start(tio_t *t)
{
    t->ur = kvd_mem_calloc(KVD_MEM_OTHER, 1, sizeof(*t->ur));
    if (t->ur == NULL)
        return KVD_ERR_NOMEM;
    tio_uring_t *u = t->ur;
    int rc = KVD_OK;
    u->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (u->wake_fd < 0) {
        KVD_ERROR("tier_io", "eventfd: %s", strerror(errno));
        rc = KVD_ERR_NOMEM;
    }
    if (rc == KVD_OK)
        rc = uring_ring_init(t);
    if (rc == KVD_OK)
        rc = uring_slots_init(t);
    if (rc == KVD_OK) {
        if (!t->o.defer_fixed)
            uring_register_pool(t, t->note); /* before the ring's thread starts */
        else if (t->o.fixed_slice_bytes != UINT64_MAX)
            snprintf(t->note, sizeof(t->note),
                     "fixed buffers once the pool is populated");
        int err = pthread_create(&u->thread, NULL, uring_main, t);
        if (err != 0) {
            KVD_ERROR("tier_io", "starting the io_uring thread: %s", strerror(err));
            rc = KVD_ERR_NOMEM;
        }
        u->thread_up = err == 0;
    }
    if (rc != KVD_OK)
        uring_stop(t);
    return rc;
}

static const tio_backend_ops_t uring_ops = {
    .name = "io_uring",
    .start = uring_start,
    .kick = uring_kick,
    .stop = uring_stop,
};

/* ------------------------------------------------------------ lifecycle */

/* Whether the options can make an executor; logs why not. */
static bool tio_opts_valid(const tio_opts_t *o)
{
    const char *why = NULL;
    if (o->backend != TIO_AUTO && o->backend != TIO_URING && o->backend != TIO_PSYNC)
        why = "unknown backend";
    else if (o->queue_depth > TIO_QD_MAX)
        why = "queue depth over 4096";
    else if (o->pool_base == NULL || (uintptr_t)o->pool_base % SEG_BLOCK != 0)
        why = "no pool, or one not block-aligned";
    else if (o->pool_bytes == 0 || o->pool_bytes % SEG_BLOCK != 0)
        why = "the pool's size is not a multiple of the block";
    if (why == NULL)
        return true;
    KVD_ERROR("tier_io", "options refused: %s", why);
    return false;
}

/* Copies the options with their defaults filled in: queue depth, and the
 * slice size (a multiple of the block, at most 1 GiB). */
static void tio_opts_resolve(tio_t *t, const tio_opts_t *o)
{
    t->o = *o;
    if (t->o.queue_depth == 0)
        t->o.queue_depth = TIO_QD_DEFAULT;
    uint64_t slice = t->o.fixed_slice_bytes;
    if (slice == 0 || (slice > TIO_SLICE_DEFAULT && slice != UINT64_MAX))
        slice = TIO_SLICE_DEFAULT;
    if (slice != UINT64_MAX)
        slice = KVD_MAX(kvd_align_down(slice, SEG_BLOCK), SEG_BLOCK);
    t->o.fixed_slice_bytes = slice;
}

/* Frees what tio_alloc made (the backend already stopped). */
static void tio_free(tio_t *t)
{
    uint32_t qd = t->o.queue_depth;
    if (t->done_fd >= 0)
        close(t->done_fd);
    kvd_mem_free(KVD_MEM_OTHER, t->pending, qd * sizeof(*t->pending));
    kvd_mem_free(KVD_MEM_OTHER, t->done, qd * sizeof(*t->done));
    pthread_cond_destroy(&t->cond);
    pthread_mutex_destroy(&t->lock);
    kvd_mem_free(KVD_MEM_OTHER, t, sizeof(*t));
}

/* The executor without a backend: options, queues, lock, event fd. NULL
 * when out of memory or fds (logged). */
static tio_t *tio_alloc(const tio_opts_t *o)
{
    tio_t *t = kvd_mem_calloc(KVD_MEM_OTHER, 1, sizeof(*t));
    if (t == NULL)
        return NULL;
    tio_opts_resolve(t, o);
    pthread_mutex_init(&t->lock, NULL);
    pthread_cond_init(&t->cond, NULL);
    t->pending = kvd_mem_calloc(KVD_MEM_OTHER, t->o.queue_depth, sizeof(*t->pending));
    t->done = kvd_mem_calloc(KVD_MEM_OTHER, t->o.queue_depth, sizeof(*t->done));
    t->done_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (t->done_fd < 0)
        KVD_ERROR("tier_io", "eventfd: %s", strerror(errno));
    if (t->pending == NULL || t->done == NULL || t->done_fd < 0) {
        tio_free(t);
        return NULL;
    }
    return t;
}

/* Starts the backend asked for; TIO_AUTO falls back to psync when no ring
 * can be had. */
static int tio_start_backend(tio_t *t)
{
    if (t->o.backend != TIO_PSYNC) {
        int rc = uring_start(t);
        if (rc == KVD_OK) {
            t->ops = &uring_ops;
            return KVD_OK;
        }
        if (rc != KVD_ERR_UNSUPPORTED || t->o.backend == TIO_URING) {
            if (rc == KVD_ERR_UNSUPPORTED)
                KVD_ERROR("tier_io", "io_uring asked for: %s", t->note);
            return rc;
        }
        KVD_WARN("tier_io", "%s: using pread/pwrite threads", t->note);
    }
    t->ops = &psync_ops;
    return psync_start(t);
}

/* Logs what tio_create made: backend, queue depth, buffers and why. */
static void tio_log_created(const tio_t *t)
{
    char slice[32];
    if (t->fixed)
        KVD_INFO("tier_io", "%s, queue depth %u, fixed buffers (slices of %s at most)",
                 t->ops->name, t->o.queue_depth,
                 kvd_size_format(t->o.fixed_slice_bytes, slice, sizeof(slice)));
    else
        KVD_INFO("tier_io", "%s, queue depth %u, plain buffers%s%s", t->ops->name,
                 t->o.queue_depth, t->note[0] ? ": " : "", t->note);
}

int tio_create(const tio_opts_t *o, tio_t **out)
{
    if (o == NULL || out == NULL || !tio_opts_valid(o))
        return KVD_ERR_INVALID;
    tio_t *t = tio_alloc(o);
    if (t == NULL)
        return KVD_ERR_NOMEM;
    int rc = tio_start_backend(t);
    if (rc != KVD_OK) {
        tio_free(t);
        return rc;
    }
    tio_log_created(t);
    *out = t;
    return KVD_OK;
}

void tio_destroy(tio_t *t)
{
    if (t == NULL)
        return;
    pthread_mutex_lock(&t->lock);
    t->stopping = true;
    pthread_mutex_unlock(&t->lock);
    t->ops->stop(t);
    tio_free(t);
}

/* ------------------------------------------------------------ the loop */

size_t tio_submit(tio_t *t, const tio_op_t *ops, size_t n)
{
    size_t take = KVD_MIN(n, (size_t)(t->o.queue_depth - t->in_flight));
    size_t queued = 0;
    if (take == 0)
        return 0;
    pthread_mutex_lock(&t->lock);
    for (size_t i = 0; i < take; i++) {
        if (!tio_op_valid(t, &ops[i])) {
            tio_done_t d = {
                .tag = ops[i].tag, .status = KVD_ERR_INVALID, .kind = ops[i].kind};
            tio_post_locked(t, &d);
            continue;
        }
        uint32_t at = (t->pending_head + t->pending_count) % t->o.queue_depth;
        t->pending[at] = ops[i];
        t->pending_count++;
        queued++;
    }
    pthread_mutex_unlock(&t->lock);
    t->in_flight += (uint32_t)take;
    if (queued > 0)
        t->ops->kick(t);
    return take;
}

size_t tio_poll(tio_t *t, tio_done_t *out, size_t max)
{
    size_t n = 0;
    pthread_mutex_lock(&t->lock);
    while (n < max && t->done_count > 0) {
        out[n++] = t->done[t->done_head];
        t->done_head = (t->done_head + 1) % t->o.queue_depth;
        t->done_count--;
    }
    if (t->done_count == 0 && t->signalled) {
        uint64_t v;
        if (read(t->done_fd, &v, sizeof(v)) < 0 && errno != EAGAIN)
            KVD_ERROR("tier_io", "reading the completion eventfd: %s", strerror(errno));
        t->signalled = false;
    }
    pthread_mutex_unlock(&t->lock);
    t->in_flight -= (uint32_t)n;
    return n;
}

void tio_wait(tio_t *t, int timeout_ms)
{
    uint64_t deadline = kvd_now_ns() + (uint64_t)KVD_MAX(timeout_ms, 0) * 1000000;
    struct pollfd p = {.fd = t->done_fd, .events = POLLIN};
    for (;;) {
        int rc = poll(&p, 1, timeout_ms < 0 ? -1 : timeout_ms);
        if (rc >= 0 || errno != EINTR)
            return;
        uint64_t now = kvd_now_ns();
        if (timeout_ms >= 0)
            timeout_ms = now >= deadline ? 0 : (int)((deadline - now) / 1000000);
    }
}

/* ------------------------------------------------------------- getters */

uint32_t tio_in_flight(const tio_t *t)
{
    return t->in_flight;
}

int tio_event_fd(const tio_t *t)
{
    return t->done_fd;
}

const char *tio_backend_name(const tio_t *t)
{
    return t->ops->name;
}

bool tio_fixed_buffers(const tio_t *t)
{
    return __atomic_load_n(&t->fixed, __ATOMIC_ACQUIRE);
}

void tio_register_fixed(tio_t *t)
{
    if (t->ur == NULL || t->o.fixed_slice_bytes == UINT64_MAX)
        return;
    __atomic_store_n(&t->want_register, true, __ATOMIC_RELEASE);
    uring_kick(t);
}

const char *tio_note(const tio_t *t)
{
    return t->note;
}

void tio_stats(const tio_t *t, tio_stats_t *out)
{
    const tio_counters_t *c = &t->c;
    memset(out, 0, sizeof(*out));
    out->reads = atomic_load_explicit(&c->reads, memory_order_relaxed);
    out->writes = atomic_load_explicit(&c->writes, memory_order_relaxed);
    out->copies = atomic_load_explicit(&c->copies, memory_order_relaxed);
    out->syncs = atomic_load_explicit(&c->syncs, memory_order_relaxed);
    out->read_bytes = atomic_load_explicit(&c->read_bytes, memory_order_relaxed);
    out->write_bytes = atomic_load_explicit(&c->write_bytes, memory_order_relaxed);
    out->io_errors = atomic_load_explicit(&c->io_errors, memory_order_relaxed);
    out->checksum_failures =
        atomic_load_explicit(&c->checksum_failures, memory_order_relaxed);
    out->no_space = atomic_load_explicit(&c->no_space, memory_order_relaxed);
    out->queue_depth = t->o.queue_depth;
    out->in_flight = t->in_flight;
}
