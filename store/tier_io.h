/*
 * tier_io.h - the SSD tier's I/O executor: moves records (segment.h)
 * between the pool's memory and segment files, and checks them. It keeps
 * no index and makes no decision: tier.c says what goes where, the
 * executor moves the bytes, computes and verifies the CRC-32Cs, and
 * reports each op's end. Private to store/.
 *
 * Two backends, chosen at creation and shown in stats:
 *   io_uring   one thread owns a ring (liburing) of queue_depth entries,
 *              submits ops in batches and reaps their completions; the
 *              pool is registered as fixed buffers in slices of at most
 *              1 GiB when RLIMIT_MEMLOCK allows it (registered buffers
 *              count against it: 8 MiB for a plain user on many hosts),
 *              else plain buffers, and the reason is kept for the log;
 *   psync      queue_depth threads (at most 16) doing pread/pwrite: where
 *              io_uring is refused (container seccomp profiles often do,
 *              kernel.io_uring_disabled) or asked for.
 * TIO_AUTO takes io_uring when a ring can be set up and psync otherwise.
 *
 * Files are opened by the caller (O_DIRECT where the file system has it);
 * every offset and length is a multiple of SEG_BLOCK and every memory
 * address the executor hands the kernel is SEG_BLOCK-aligned (the pool is
 * page-aligned; header blocks and bounce buffers are the executor's own).
 *
 * Threading: tio_submit, tio_poll and the getters are for one caller
 * thread (the daemon's loop); the executor's threads never call back. A
 * completion makes tio_event_fd readable (an eventfd), so the loop polls
 * it with everything else. CRCs are computed on the executor's threads:
 * the loop thread never touches values.
 */
#ifndef KVD_STORE_TIER_IO_H
#define KVD_STORE_TIER_IO_H

#include "segment.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum tio_backend {
    TIO_AUTO = 0,
    TIO_URING = 1,
    TIO_PSYNC = 2,
} tio_backend_t;

typedef struct tio_opts {
    tio_backend_t backend;
    uint32_t queue_depth; /* ops in flight at most; 0: 32 */
    void *pool_base;      /* the pool's mapping: values move from and to it */
    uint64_t pool_bytes;
    uint64_t fixed_slice_bytes; /* fixed-buffer slices: 0: 1 GiB; UINT64_MAX: none */
    uint64_t max_value_bytes;   /* largest value a COPY moves (bounce buffers) */
    /* register the pool as fixed buffers only at tio_register_fixed (once
     * it is populated: registering faults in and pins every page, which
     * would populate it at once, past its bounded rate) */
    bool defer_fixed;
    /* Test hook standing in for a failing device: every fail_every-th read
     * (READ and COPY ops, counted from 1) ends with KVD_ERR_IO as if the
     * device had answered EIO. 0: never. */
    uint32_t fail_read_every;
    /* Test hook standing in for a device that refuses writes: the first
     * fail_copy_writes COPY ops read and check their source, then end with
     * KVD_ERR_IO and write_failed as if writing the copy had met EIO
     * (nothing is written). 0: never. */
    uint32_t fail_copy_writes;
    /* Test hook standing in for a device that refuses a spill: the first
     * fail_writes WRITE ops end with KVD_ERR_IO (EIO) and write nothing.
     * 0: never. */
    uint32_t fail_writes;
} tio_opts_t;

typedef struct tio tio_t;

/* Starts the backend and its threads. KVD_ERR_UNSUPPORTED when TIO_URING
 * is asked for and no ring can be had (the reason in the log); else
 * KVD_OK, KVD_ERR_NOMEM, KVD_ERR_INVALID. */
int tio_create(const tio_opts_t *o, tio_t **out);
/* Waits for the ops in flight (their completions are dropped), stops the
 * threads and frees. NULL is fine. */
void tio_destroy(tio_t *t);

typedef enum tio_kind {
    /* hdr (the tier's header, value_crc and hdr_crc not yet filled) and
     * the value pool[pool_off, + value_bytes) are written at file_off and
     * file_off + SEG_BLOCK; the executor computes value_crc from the pool,
     * sets magic, version and value_bytes, and seals the header. */
    TIO_WRITE = 1,
    /* the record at file_off is read: its header into hdr, its value into
     * pool[pool_off, + value_bytes); the header must be valid, of `key` and
     * value_bytes, and the value's CRC must match, else KVD_ERR_CORRUPT
     * (the pool's bytes there are then garbage, to be discarded). */
    TIO_READ = 2,
    /* the record at (fd, file_off), checked as READ does, is written to
     * (dst_fd, dst_off) through a bounce buffer, its header's generation
     * set to dst_generation and its seq to dst_seq (0: the source's), and
     * resealed: compaction. The copy is a newer record of its key than
     * its source, so that a restart finding both keeps the copy. */
    TIO_COPY = 3,
    /* fdatasync of fd (io_uring: IORING_OP_FSYNC with IORING_FSYNC_DATASYNC):
     * the writes into it that ended before this op was submitted are on
     * the device's stable storage once it ends OK. O_DIRECT alone leaves
     * them in the device's write cache. Only fd and tag are read. */
    TIO_SYNC = 4,
} tio_kind_t;

typedef struct tio_op {
    uint64_t tag; /* the caller's: given back in the completion */
    tio_kind_t kind;
    int fd;
    uint64_t file_off;
    uint64_t pool_off;          /* WRITE, READ */
    uint64_t value_bytes;       /* multiple of SEG_BLOCK */
    uint8_t key[KVD_KEY_BYTES]; /* READ, COPY: the key expected */
    int dst_fd;                 /* COPY */
    uint64_t dst_off;
    uint64_t dst_generation;
    uint64_t dst_seq;
    seg_rec_hdr_t hdr; /* WRITE: in; READ: out */
} tio_op_t;

typedef struct tio_done {
    uint64_t tag;
    int status;    /* KVD_OK, KVD_ERR_IO (the system said no), KVD_ERR_CORRUPT,
                      KVD_ERR_NO_SPACE (ENOSPC, EDQUOT, EFBIG); KVD_ERR_INVALID
                      (an op out of the pool, the block grain or max_value_bytes:
                      refused by tio_submit, logged), KVD_ERR_NOMEM (no bounce
                      buffer for a COPY) */
    int sys_errno; /* the errno behind KVD_ERR_IO / NO_SPACE; 0 else */
    tio_kind_t kind;
    /* COPY: the source was read and checked, writing the copy failed (the
     * source is still good); a COPY failing without it failed reading */
    bool write_failed;
    seg_rec_hdr_t hdr; /* READ: the header read (when status is KVD_OK) */
} tio_done_t;

/* Queues up to n ops (copied) and returns how many were taken: fewer when
 * queue_depth ops are in flight already (the caller keeps the rest for
 * later). */
size_t tio_submit(tio_t *t, const tio_op_t *ops, size_t n);
/* Takes up to max completions, in any order; 0 when none waits. Clears
 * the event fd's readiness once none is left. */
size_t tio_poll(tio_t *t, tio_done_t *out, size_t max);
/* Ops submitted and not yet taken by tio_poll. */
uint32_t tio_in_flight(const tio_t *t);
/* Blocks until a completion waits or timeout_ms passed (tests, shutdown). */
void tio_wait(tio_t *t, int timeout_ms);

/* Test hook standing in for a device whose cache flush fails: the next n
 * SYNC ops taken end with KVD_ERR_IO (EIO), syncing nothing. Any thread. */
void tio_fail_syncs(tio_t *t, uint32_t n);

/* Registers the pool as fixed buffers now (io_uring, when it was deferred
 * and is allowed); asynchronous: on the ring's thread, between batches,
 * with the outcome in the log. No-op for pread/pwrite. */
void tio_register_fixed(tio_t *t);

int tio_event_fd(const tio_t *t);
const char *tio_backend_name(const tio_t *t); /* "io_uring" or "pread/pwrite" */
bool tio_fixed_buffers(const tio_t *t);       /* the pool is registered */
/* Why the backend or the buffers are what they are: "" or e.g.
 * "io_uring_queue_init: Operation not permitted" or "fixed buffers need
 * 1.00 GiB of RLIMIT_MEMLOCK, 8.00 MiB allowed". */
const char *tio_note(const tio_t *t);

typedef struct tio_stats {
    uint64_t reads, writes, copies;   /* ops ended OK */
    uint64_t syncs;                   /* ... TIO_SYNC */
    uint64_t read_bytes, write_bytes; /* values moved */
    uint64_t io_errors, checksum_failures, no_space;
    uint32_t queue_depth; /* its limit */
    uint32_t in_flight;
} tio_stats_t;
void tio_stats(const tio_t *t, tio_stats_t *out);

#endif
