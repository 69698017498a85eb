/*
 * Description: the SSD tier's I/O executor (store/tier_io.h) on real
 * files in a temp dir (O_DIRECT where the file system has it), every case
 * once per backend (pread/pwrite threads, io_uring; the io_uring cases
 * are skipped with the reason when no ring can be set up): records of
 * 4 KiB .. 1 MiB written from a pool and read back byte-exact with their
 * headers; a flipped value byte, a flipped header byte, a wrong key and a
 * truncated file never read as valid; COPY to another file with a new
 * generation, and a COPY of a corrupt record leaving nothing valid behind;
 * the queue depth bounding what tio_submit takes; the fail_read_every test
 * hook failing exactly every second read-type op with EIO; a full file
 * system (a loop-mounted ext4 in a private mount namespace, root only)
 * ending writes with KVD_ERR_NO_SPACE; the pool registered as fixed buffers
 * when RLIMIT_MEMLOCK allows it, refused with the reason when it does not,
 * and values crossing registered slices; tio_destroy with ops in flight
 * finishing them without a leak or a hang; options and ops refused.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <liburing.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kvd_common.h"
#include "tier_io.h"

#define POOL_BYTES (8 * KVD_MiB)
#define HALF       (POOL_BYTES / 2) /* values are written from below, read above */
#define MAX_VALUE  KVD_MiB
#define WAIT_MS    10000
#define MAX_OPS    64

static tio_backend_t be_psync = TIO_PSYNC, be_uring = TIO_URING;
static char uring_missing[160]; /* why no ring can be had here; "" when one can */
static bool direct_missing_said;

/* One case's temp dir and pool, for one backend. */
typedef struct fx {
    tio_backend_t backend;
    char dir[64];
    uint8_t *pool;
} fx_t;

/* One record's place: in the file and (its value) in the pool. */
typedef struct rec {
    uint64_t file_off, pool_off, value_bytes;
} rec_t;

/* ------------------------------------------------------------- fixture */

static int setup(void **state)
{
    fx_t *f = calloc(1, sizeof(*f));
    if (f == NULL)
        return -1;
    f->backend = *(tio_backend_t *)*state;
    snprintf(f->dir, sizeof(f->dir), "/tmp/kvdock-tio-XXXXXX");
    f->pool = mmap(NULL, POOL_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                   -1, 0);
    if (mkdtemp(f->dir) == NULL || f->pool == MAP_FAILED) {
        free(f);
        return -1;
    }
    uint64_t x = 0x9e3779b97f4a7c15ull; /* xorshift64: no two blocks alike */
    for (size_t i = 0; i < POOL_BYTES / 8; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        memcpy(f->pool + i * 8, &x, 8);
    }
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fx_t *f = *state;
    DIR *d = opendir(f->dir);
    struct dirent *e;
    char p[128];
    while (d != NULL && (e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        snprintf(p, sizeof(p), "%s/%.40s", f->dir, e->d_name);
        if (unlink(p) != 0)
            rmdir(p);
    }
    if (d != NULL)
        closedir(d);
    rmdir(f->dir);
    munmap(f->pool, POOL_BYTES);
    free(f);
    return 0;
}

/* The case's fixture; skips an io_uring case where no ring can be had. */
static fx_t *fx_get(void **state)
{
    fx_t *f = *state;
    if (f->backend == TIO_URING && uring_missing[0] != '\0') {
        print_message("io_uring cannot be tested here: %s\n", uring_missing);
        skip();
    }
    return f;
}

/* Opens (creates) a file of the temp dir with O_DIRECT, or without it on a
 * file system that refuses it (said once). */
static int fx_open_in(const char *dir, const char *name)
{
    char p[128];
    snprintf(p, sizeof(p), "%s/%.40s", dir, name);
    int fd = open(p, O_RDWR | O_CREAT | O_DIRECT, 0600);
    if (fd < 0 && errno == EINVAL) {
        if (!direct_missing_said)
            print_message("%s: no O_DIRECT here, testing through the page cache\n", dir);
        direct_missing_said = true;
        fd = open(p, O_RDWR | O_CREAT, 0600);
    }
    return fd;
}

static int fx_open(fx_t *f, const char *name)
{
    int fd = fx_open_in(f->dir, name);
    assert_true(fd >= 0);
    return fd;
}

static tio_opts_t fx_opts(const fx_t *f, uint32_t queue_depth)
{
    tio_opts_t o = {
        .backend = f->backend,
        .queue_depth = queue_depth,
        .pool_base = f->pool,
        .pool_bytes = POOL_BYTES,
        .max_value_bytes = MAX_VALUE,
    };
    return o;
}

/* An executor of the fixture's backend. */
static tio_t *fx_tio(const tio_opts_t *o)
{
    tio_t *t = NULL;
    assert_int_equal(tio_create(o, &t), KVD_OK);
    assert_string_equal(tio_backend_name(t),
                        o->backend == TIO_URING ? "io_uring" : "pread/pwrite");
    return t;
}

/* -------------------------------------------------------------- records */

static void key_of(uint32_t i, uint8_t key[KVD_KEY_BYTES])
{
    for (uint32_t j = 0; j < KVD_KEY_BYTES; j++)
        key[j] = (uint8_t)(i * 7 + j + 1);
}

/* Places n records of the given sizes one after another in a file from
 * file_off, their values in the pool from pool_off with a block between. */
static void lay_out(rec_t *r, const uint64_t *sizes, size_t n, uint64_t file_off,
                    uint64_t pool_off)
{
    for (size_t i = 0; i < n; i++) {
        r[i] = (rec_t){file_off, pool_off, sizes[i]};
        file_off += SEG_BLOCK + sizes[i];
        pool_off += sizes[i] + SEG_BLOCK;
    }
}

static tio_op_t op_write(uint64_t tag, int fd, const rec_t *r, uint32_t i)
{
    tio_op_t op = {.tag = tag, .kind = TIO_WRITE, .fd = fd};
    op.file_off = r->file_off;
    op.pool_off = r->pool_off;
    op.value_bytes = r->value_bytes;
    key_of(i, op.hdr.key);
    op.hdr.seq = 100 + i;
    op.hdr.generation = 1;
    op.hdr.value_bytes = r->value_bytes;
    op.hdr.object_bytes = r->value_bytes;
    snprintf(op.hdr.tenant, sizeof(op.hdr.tenant), "acme");
    snprintf(op.hdr.ns, sizeof(op.hdr.ns), "llama-%u", i);
    return op;
}

/* A READ of record i (its key expected) into the pool at pool_off. */
static tio_op_t op_read(uint64_t tag, int fd, const rec_t *r, uint32_t i,
                        uint64_t pool_off)
{
    tio_op_t op = {.tag = tag, .kind = TIO_READ, .fd = fd};
    op.file_off = r->file_off;
    op.pool_off = pool_off;
    op.value_bytes = r->value_bytes;
    key_of(i, op.key);
    return op;
}

static tio_op_t op_copy(uint64_t tag, int fd, const rec_t *r, uint32_t i, int dst_fd,
                        uint64_t dst_off, uint64_t generation)
{
    tio_op_t op = {.tag = tag, .kind = TIO_COPY, .fd = fd};
    op.file_off = r->file_off;
    op.value_bytes = r->value_bytes;
    key_of(i, op.key);
    op.dst_fd = dst_fd;
    op.dst_off = dst_off;
    op.dst_generation = generation;
    return op;
}

/* Runs ops (tags 0..n-1) to their ends, submitting as the queue depth
 * lets it: done[tag] is each op's completion. */
static void run_ops(tio_t *t, const tio_op_t *ops, size_t n, tio_done_t *done)
{
    tio_stats_t st;
    bool seen[MAX_OPS] = {false};
    size_t submitted = 0, ended = 0;
    assert_true(n <= MAX_OPS);
    tio_stats(t, &st);
    while (ended < n) {
        submitted += tio_submit(t, ops + submitted, n - submitted);
        assert_true(tio_in_flight(t) <= st.queue_depth);
        uint64_t start = kvd_now_ns();
        tio_done_t got[8];
        size_t k;
        while ((k = tio_poll(t, got, KVD_ARRAY_SIZE(got))) == 0) {
            tio_wait(t, WAIT_MS);
            assert_true(kvd_now_ns() - start < 3ull * WAIT_MS * 1000000);
        }
        for (size_t i = 0; i < k; i++) {
            assert_true(got[i].tag < n && !seen[got[i].tag]);
            seen[got[i].tag] = true;
            done[got[i].tag] = got[i];
        }
        ended += k;
    }
    assert_int_equal(tio_in_flight(t), 0);
}

/* Writes the records (all must end OK). */
static void write_recs(tio_t *t, int fd, const rec_t *r, size_t n)
{
    tio_op_t ops[MAX_OPS];
    tio_done_t done[MAX_OPS];
    for (size_t i = 0; i < n; i++)
        ops[i] = op_write(i, fd, &r[i], (uint32_t)i);
    run_ops(t, ops, n, done);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(done[i].status, KVD_OK);
        assert_int_equal(done[i].kind, TIO_WRITE);
    }
}

/* Checks a READ's completion of record i (read into dst) against what was
 * written from the pool at r->pool_off with generation `generation`. */
static void check_read(const fx_t *f, const tio_done_t *d, const rec_t *r, uint32_t i,
                       uint64_t dst, uint64_t generation)
{
    uint8_t key[KVD_KEY_BYTES];
    key_of(i, key);
    assert_int_equal(d->status, KVD_OK);
    assert_int_equal(d->kind, TIO_READ);
    assert_memory_equal(f->pool + dst, f->pool + r->pool_off, r->value_bytes);
    assert_memory_equal(d->hdr.key, key, KVD_KEY_BYTES);
    assert_int_equal(d->hdr.value_crc,
                     kvd_crc32c(0, f->pool + r->pool_off, r->value_bytes));
    assert_int_equal(d->hdr.value_bytes, r->value_bytes);
    assert_int_equal(d->hdr.seq, 100 + i);
    assert_int_equal(d->hdr.generation, generation);
    assert_string_equal(d->hdr.tenant, "acme");
}

/* Reads the records back into the upper half of the pool (scribbled over
 * first) and checks every byte and header. */
static void read_check(const fx_t *f, tio_t *t, int fd, const rec_t *r, size_t n,
                       uint64_t generation)
{
    tio_op_t ops[MAX_OPS];
    tio_done_t done[MAX_OPS];
    memset(f->pool + HALF, 0xee, HALF);
    for (size_t i = 0; i < n; i++)
        ops[i] = op_read(i, fd, &r[i], (uint32_t)i, HALF + r[i].pool_off);
    run_ops(t, ops, n, done);
    for (size_t i = 0; i < n; i++)
        check_read(f, &done[i], &r[i], (uint32_t)i, HALF + r[i].pool_off, generation);
}

/* Reads a record expecting the key of record as_key: the status it ended
 * with. */
static int read_status(tio_t *t, int fd, const rec_t *r, uint32_t as_key)
{
    tio_op_t op = op_read(0, fd, r, as_key, HALF + r->pool_off);
    tio_done_t d;
    run_ops(t, &op, 1, &d);
    return d.status;
}

/* Flips one byte of a file through a plain descriptor (past the
 * executor, as a bad disk would). */
static void flip_byte(const fx_t *f, const char *name, uint64_t off)
{
    char p[128];
    uint8_t b;
    snprintf(p, sizeof(p), "%s/%.40s", f->dir, name);
    int fd = open(p, O_RDWR);
    assert_true(fd >= 0);
    assert_int_equal(pread(fd, &b, 1, (off_t)off), 1);
    b ^= 0x5a;
    assert_int_equal(pwrite(fd, &b, 1, (off_t)off), 1);
    assert_int_equal(fsync(fd), 0);
    close(fd);
}

/* ---------------------------------------------------------------- cases */

static void test_round_trip(void **state)
{
    fx_t *f = fx_get(state);
    static const uint64_t sizes[] = {
        4 * KVD_KiB,   8 * KVD_KiB,   16 * KVD_KiB, 64 * KVD_KiB, 128 * KVD_KiB,
        256 * KVD_KiB, 512 * KVD_KiB, KVD_MiB,      4 * KVD_KiB,  KVD_MiB - 4 * KVD_KiB};
    rec_t r[KVD_ARRAY_SIZE(sizes)];
    size_t n = KVD_ARRAY_SIZE(sizes);
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++)
        total += sizes[i];
    lay_out(r, sizes, n, SEG_BLOCK, 0);
    int fd = fx_open(f, "seg-000001.kvs");
    tio_opts_t o = fx_opts(f, 0);
    tio_t *t = fx_tio(&o);
    write_recs(t, fd, r, n);
    read_check(f, t, fd, r, n, 1);

    tio_stats_t st;
    tio_stats(t, &st);
    assert_int_equal(st.writes, n);
    assert_int_equal(st.reads, n);
    assert_int_equal(st.copies, 0);
    assert_int_equal(st.write_bytes, total);
    assert_int_equal(st.read_bytes, total);
    assert_int_equal(st.io_errors + st.checksum_failures + st.no_space, 0);
    assert_int_equal(st.queue_depth, 32);
    assert_int_equal(st.in_flight, 0);
    /* all polled: the event fd is not readable any more */
    struct pollfd p = {.fd = tio_event_fd(t), .events = POLLIN};
    assert_int_equal(poll(&p, 1, 0), 0);
    tio_done_t d;
    assert_int_equal(tio_poll(t, &d, 1), 0);
    tio_destroy(t);
    close(fd);
}

static void test_corrupt(void **state)
{
    fx_t *f = fx_get(state);
    static const uint64_t sizes[] = {64 * KVD_KiB, 64 * KVD_KiB, 64 * KVD_KiB,
                                     64 * KVD_KiB, 64 * KVD_KiB};
    rec_t r[5];
    lay_out(r, sizes, 5, SEG_BLOCK, 0);
    int fd = fx_open(f, "seg-000001.kvs");
    tio_opts_t o = fx_opts(f, 0);
    tio_t *t = fx_tio(&o);
    write_recs(t, fd, r, 5);
    read_check(f, t, fd, r, 5, 1);

    flip_byte(f, "seg-000001.kvs", r[0].file_off + SEG_BLOCK + 1000); /* value */
    flip_byte(f, "seg-000001.kvs", r[1].file_off + 2000); /* header's padding */
    /* into record 4's value, at a block boundary and not */
    assert_int_equal(ftruncate(fd, (off_t)(r[4].file_off + SEG_BLOCK + 8192)), 0);
    assert_int_equal(read_status(t, fd, &r[0], 0), KVD_ERR_CORRUPT);
    assert_int_equal(read_status(t, fd, &r[1], 1), KVD_ERR_CORRUPT);
    assert_int_equal(read_status(t, fd, &r[2], 99), KVD_ERR_CORRUPT); /* another key */
    int rc = read_status(t, fd, &r[4], 4);
    assert_true(rc == KVD_ERR_CORRUPT || rc == KVD_ERR_IO);
    uint64_t truncated_corrupt = rc == KVD_ERR_CORRUPT;
    assert_int_equal(ftruncate(fd, (off_t)(r[4].file_off + SEG_BLOCK + 8192 + 100)), 0);
    rc = read_status(t, fd, &r[4], 4);
    assert_true(rc == KVD_ERR_CORRUPT || rc == KVD_ERR_IO);
    truncated_corrupt += rc == KVD_ERR_CORRUPT;
    /* the record between them is intact */
    tio_op_t op = op_read(0, fd, &r[3], 3, HALF + r[3].pool_off);
    tio_done_t d;
    run_ops(t, &op, 1, &d);
    check_read(f, &d, &r[3], 3, HALF + r[3].pool_off, 1);

    tio_stats_t st;
    tio_stats(t, &st);
    assert_int_equal(st.checksum_failures, 3 + truncated_corrupt);
    assert_int_equal(st.reads, 5 + 1);
    tio_destroy(t);
    close(fd);
}

static void test_copy(void **state)
{
    fx_t *f = fx_get(state);
    static const uint64_t sizes[] = {8 * KVD_KiB, 256 * KVD_KiB, KVD_MiB};
    rec_t r[3], c[3];
    lay_out(r, sizes, 3, SEG_BLOCK, 0);
    lay_out(c, sizes, 3, 5 * SEG_BLOCK, 0); /* same pool places, other file places */
    int a = fx_open(f, "seg-000001.kvs"), b = fx_open(f, "seg-000002.kvs");
    tio_opts_t o = fx_opts(f, 4);
    tio_t *t = fx_tio(&o);
    write_recs(t, a, r, 3);

    tio_op_t ops[3];
    tio_done_t done[3];
    for (uint32_t i = 0; i < 3; i++)
        ops[i] = op_copy(i, a, &r[i], i, b, c[i].file_off, 7);
    run_ops(t, ops, 3, done);
    for (uint32_t i = 0; i < 3; i++) {
        assert_int_equal(done[i].status, KVD_OK);
        assert_int_equal(done[i].kind, TIO_COPY);
    }
    read_check(f, t, b, c, 3, 7);
    tio_stats_t st;
    tio_stats(t, &st);
    assert_int_equal(st.copies, 3);

    /* a corrupt source: refused, and nothing valid where it would have gone */
    flip_byte(f, "seg-000001.kvs", r[1].file_off + SEG_BLOCK + 5);
    uint64_t dst = c[2].file_off + SEG_BLOCK + c[2].value_bytes + 3 * SEG_BLOCK;
    ops[0] = op_copy(0, a, &r[1], 1, b, dst, 8);
    run_ops(t, ops, 1, done);
    assert_int_equal(done[0].status, KVD_ERR_CORRUPT);
    rec_t at = {dst, r[1].pool_off, r[1].value_bytes};
    assert_int_equal(read_status(t, b, &at, 1), KVD_ERR_CORRUPT);
    uint8_t *block = aligned_alloc(SEG_BLOCK, SEG_BLOCK);
    assert_non_null(block);
    memset(block, 0, SEG_BLOCK);
    ssize_t got = pread(b, block, SEG_BLOCK, (off_t)dst);
    assert_true(got < (ssize_t)SEG_BLOCK || !seg_rec_valid(block));
    free(block);
    tio_stats(t, &st);
    assert_int_equal(st.copies, 3);
    assert_int_equal(st.checksum_failures, 2);
    tio_destroy(t);
    close(a);
    close(b);
}

static void test_queue_depth(void **state)
{
    fx_t *f = fx_get(state);
    enum { QD = 4, N = 3 * QD };
    uint64_t sizes[N];
    rec_t r[N];
    for (size_t i = 0; i < N; i++)
        sizes[i] = 64 * KVD_KiB;
    lay_out(r, sizes, N, SEG_BLOCK, 0);
    int fd = fx_open(f, "seg-000001.kvs");
    tio_opts_t o = fx_opts(f, QD);
    tio_t *t = fx_tio(&o);
    tio_op_t ops[N];
    for (uint32_t i = 0; i < N; i++)
        ops[i] = op_write(i, fd, &r[i], i);

    size_t submitted = tio_submit(t, ops, N);
    assert_int_equal(submitted, QD);
    assert_int_equal(tio_submit(t, ops + submitted, N - submitted), 0);
    assert_int_equal(tio_in_flight(t), QD);
    tio_stats_t st;
    tio_stats(t, &st);
    assert_int_equal(st.queue_depth, QD);
    assert_int_equal(st.in_flight, QD);
    size_t ended = 0;
    uint64_t start = kvd_now_ns();
    while (ended < N) {
        tio_done_t got[2]; /* fewer than there are, some polls */
        tio_wait(t, WAIT_MS);
        size_t k = tio_poll(t, got, 2);
        for (size_t i = 0; i < k; i++)
            assert_int_equal(got[i].status, KVD_OK);
        ended += k;
        submitted += tio_submit(t, ops + submitted, N - submitted);
        assert_true(tio_in_flight(t) <= QD);
        assert_int_equal(tio_in_flight(t), submitted - ended);
        assert_true(kvd_now_ns() - start < 3ull * WAIT_MS * 1000000);
    }
    assert_int_equal(submitted, N);
    read_check(f, t, fd, r, N, 1);
    tio_destroy(t);
    close(fd);
}

static void test_fail_read_every(void **state)
{
    fx_t *f = fx_get(state);
    static const uint64_t sizes[] = {4 * KVD_KiB,  8 * KVD_KiB,  12 * KVD_KiB,
                                     16 * KVD_KiB, 20 * KVD_KiB, 24 * KVD_KiB};
    rec_t r[6];
    lay_out(r, sizes, 6, SEG_BLOCK, 0);
    int fd = fx_open(f, "seg-000001.kvs"), b = fx_open(f, "seg-000002.kvs");
    tio_opts_t o = fx_opts(f, 0);
    o.fail_read_every = 2;
    tio_t *t = fx_tio(&o);
    write_recs(t, fd, r, 6); /* writes are not counted */

    tio_op_t ops[6];
    tio_done_t done[6];
    memset(f->pool + HALF, 0xee, HALF);
    for (uint32_t i = 0; i < 6; i++)
        ops[i] = op_read(i, fd, &r[i], i, HALF + r[i].pool_off);
    run_ops(t, ops, 6, done);
    for (uint32_t i = 0; i < 6; i++) {
        if (i % 2 == 1) { /* reads 2, 4, 6 */
            assert_int_equal(done[i].status, KVD_ERR_IO);
            assert_int_equal(done[i].sys_errno, EIO);
        } else {
            check_read(f, &done[i], &r[i], i, HALF + r[i].pool_off, 1);
        }
    }
    /* a COPY is a read too: the 7th (OK), then the 8th (a READ, failed) */
    ops[0] = op_copy(0, fd, &r[0], 0, b, SEG_BLOCK, 2);
    ops[1] = op_read(1, fd, &r[1], 1, HALF + r[1].pool_off);
    run_ops(t, ops, 2, done);
    assert_int_equal(done[0].status, KVD_OK);
    assert_int_equal(done[1].status, KVD_ERR_IO);
    assert_int_equal(done[1].sys_errno, EIO);

    tio_stats_t st;
    tio_stats(t, &st);
    assert_int_equal(st.io_errors, 4);
    assert_int_equal(st.reads, 3);
    assert_int_equal(st.copies, 1);
    assert_int_equal(st.checksum_failures, 0);
    tio_destroy(t);
    close(fd);
    close(b);
}

/* run_ops without cmocka's asserts (for a child process): false when the
 * ops did not all end in time. */
static bool run_ops_plain(tio_t *t, const tio_op_t *ops, size_t n, tio_done_t *done)
{
    size_t submitted = 0, ended = 0;
    uint64_t deadline = kvd_now_ns() + 3ull * WAIT_MS * 1000000;
    while (ended < n && kvd_now_ns() < deadline) {
        submitted += tio_submit(t, ops + submitted, n - submitted);
        tio_wait(t, WAIT_MS);
        tio_done_t got[8];
        size_t k = tio_poll(t, got, KVD_ARRAY_SIZE(got));
        for (size_t i = 0; i < k && got[i].tag < n; i++)
            done[got[i].tag] = got[i];
        ended += k;
    }
    return ended == n;
}

/* The no-space case proper, in a child with its own mount namespace:
 * exits 0 when it passed, 77 when this machine cannot make the file
 * system (the reason printed), 1 when it failed. */
static int no_space_child(const fx_t *f)
{
    char img[128], mnt[128], cmd[400];
    if (geteuid() != 0) {
        printf("not root: no loop-mounted file system to fill\n");
        return 77;
    }
    if (unshare(CLONE_NEWNS) != 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL)) {
        printf("no private mount namespace: %s\n", strerror(errno));
        return 77;
    }
    snprintf(img, sizeof(img), "%s/fs.img", f->dir);
    snprintf(mnt, sizeof(mnt), "%s/mnt", f->dir);
    int fd = open(img, O_RDWR | O_CREAT, 0600);
    if (fd < 0 || ftruncate(fd, 16 * KVD_MiB) != 0 || mkdir(mnt, 0700) != 0)
        return 1;
    close(fd);
    snprintf(cmd, sizeof(cmd), "mkfs.ext4 -q -F %s >/dev/null", img);
    if (system(cmd) != 0) {
        printf("mkfs.ext4 failed: no file system to fill\n");
        return 77;
    }
    snprintf(cmd, sizeof(cmd), "mount -o loop %s %s", img, mnt);
    if (system(cmd) != 0) {
        printf("mount -o loop failed: no file system to fill\n");
        return 77;
    }
    fd = fx_open_in(mnt, "seg-000001.kvs");
    if (fd < 0)
        return 1;
    tio_opts_t o = fx_opts(f, 4);
    tio_t *t = NULL;
    if (tio_create(&o, &t) != KVD_OK)
        return 1;
    /* 1 MiB records, four at a time, until the 16 MiB file system is full */
    uint64_t ok = 0, full = 0, other = 0;
    for (uint32_t batch = 0; batch < 8 && full == 0 && other == 0; batch++) {
        tio_op_t ops[4];
        tio_done_t done[4];
        for (uint32_t i = 0; i < 4; i++) {
            uint32_t k = batch * 4 + i;
            rec_t r = {k * (SEG_BLOCK + KVD_MiB), i * KVD_MiB, KVD_MiB};
            ops[i] = op_write(i, fd, &r, k);
        }
        if (!run_ops_plain(t, ops, 4, done))
            return 1;
        for (uint32_t i = 0; i < 4; i++) {
            ok += done[i].status == KVD_OK;
            full += done[i].status == KVD_ERR_NO_SPACE && done[i].sys_errno == ENOSPC;
            other += done[i].status != KVD_OK && done[i].status != KVD_ERR_NO_SPACE;
        }
    }
    tio_stats_t st;
    tio_stats(t, &st);
    tio_destroy(t);
    close(fd);
    umount2(mnt, 0);
    printf("full file system: %" PRIu64 " records written, %" PRIu64 " refused\n", ok,
           full);
    return ok > 0 && full > 0 && other == 0 && st.no_space == full && st.writes == ok ? 0
                                                                                      : 1;
}

static void test_no_space(void **state)
{
    fx_t *f = fx_get(state);
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int code = no_space_child(f);
        fflush(stdout);
        exit(code);
    }
    int ws = 0;
    assert_int_equal(waitpid(pid, &ws, 0), pid);
    assert_true(WIFEXITED(ws));
    if (WEXITSTATUS(ws) == 77)
        skip();
    assert_int_equal(WEXITSTATUS(ws), 0);
}

/* Records whose values cross 1 MiB slices of the pool, or fill one. */
static void lay_out_slices(rec_t *r)
{
    r[0] = (rec_t){SEG_BLOCK, KVD_MiB - 8 * KVD_KiB, 16 * KVD_KiB}; /* crosses 1 MiB */
    r[1] = (rec_t){0, 2 * KVD_MiB, KVD_MiB};                        /* slice 2 whole */
    r[2] = (rec_t){0, 0, 64 * KVD_KiB};
    r[3] = (rec_t){0, 3 * KVD_MiB + 4 * KVD_KiB, 512 * KVD_KiB};
    r[4] =
        (rec_t){0, KVD_MiB + 64 * KVD_KiB, KVD_MiB - 64 * KVD_KiB}; /* to slice 1's end */
    for (int i = 1; i < 5; i++)
        r[i].file_off = r[i - 1].file_off + SEG_BLOCK + r[i - 1].value_bytes;
}

/* A round trip of the slice-crossing records through an executor. */
static void slices_round_trip(fx_t *f, tio_t *t, const char *name)
{
    rec_t r[5];
    lay_out_slices(r);
    int fd = fx_open(f, name);
    write_recs(t, fd, r, 5);
    read_check(f, t, fd, r, 5, 1);
    close(fd);
}

/* Checks that an executor registered the pool exactly when it should:
 * io_uring with the pool under RLIMIT_MEMLOCK (fits). */
static void check_fixed(tio_t *t, bool uring, bool fits)
{
    if (!uring || !fits) {
        assert_false(tio_fixed_buffers(t));
        if (uring)
            assert_non_null(strstr(tio_note(t), "RLIMIT_MEMLOCK"));
    } else if (!tio_fixed_buffers(t)) {
        /* the kernel charges a user without CAP_IPC_LOCK for more than the
         * pool (what it has locked already): a fall back, not a failure */
        print_message("fixed buffers refused: %s\n", tio_note(t));
        assert_true(geteuid() != 0);
        assert_non_null(strstr(tio_note(t), "io_uring_register_buffers"));
    }
}

static void test_fixed_buffers(void **state)
{
    fx_t *f = fx_get(state);
    bool uring = f->backend == TIO_URING;
    struct rlimit rl;
    assert_int_equal(getrlimit(RLIMIT_MEMLOCK, &rl), 0);
    bool fits = rl.rlim_cur == RLIM_INFINITY || POOL_BYTES <= rl.rlim_cur;

    /* default slices: the pool registers where the limit lets it */
    tio_opts_t o = fx_opts(f, 0);
    tio_t *t = fx_tio(&o);
    check_fixed(t, uring, fits);
    slices_round_trip(f, t, "seg-000001.kvs");
    tio_destroy(t);

    /* a limit under the pool's size: plain buffers, the reason noted */
    struct rlimit low = {KVD_MiB, rl.rlim_max};
    if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < low.rlim_cur)
        low.rlim_cur = rl.rlim_max;
    assert_int_equal(setrlimit(RLIMIT_MEMLOCK, &low), 0);
    t = fx_tio(&o);
    assert_int_equal(setrlimit(RLIMIT_MEMLOCK, &rl), 0);
    assert_false(tio_fixed_buffers(t));
    if (uring) {
        print_message("note: %s\n", tio_note(t));
        assert_non_null(
            strstr(tio_note(t), "fixed buffers need 8.00 MiB of RLIMIT_MEMLOCK"));
    }
    slices_round_trip(f, t, "seg-000002.kvs");
    tio_destroy(t);

    /* 1 MiB slices: values inside one, filling one, crossing two */
    o.fixed_slice_bytes = KVD_MiB;
    t = fx_tio(&o);
    check_fixed(t, uring, fits);
    slices_round_trip(f, t, "seg-000003.kvs");
    tio_destroy(t);

    /* none asked for */
    o.fixed_slice_bytes = UINT64_MAX;
    t = fx_tio(&o);
    assert_false(tio_fixed_buffers(t));
    assert_string_equal(tio_note(t), "");
    slices_round_trip(f, t, "seg-000004.kvs");
    tio_destroy(t);
}

static void test_destroy_in_flight(void **state)
{
    fx_t *f = fx_get(state);
    enum { N = 8 };
    uint64_t sizes[N];
    rec_t r[N];
    for (size_t i = 0; i < N; i++)
        sizes[i] = 512 * KVD_KiB - SEG_BLOCK;
    lay_out(r, sizes, N, SEG_BLOCK, 0);
    int fd = fx_open(f, "seg-000001.kvs"), b = fx_open(f, "seg-000002.kvs");
    tio_opts_t o = fx_opts(f, N);
    tio_op_t ops[N];

    /* writes in flight: destroy waits for them, so they are all there after */
    tio_t *t = fx_tio(&o);
    for (uint32_t i = 0; i < N; i++)
        ops[i] = op_write(i, fd, &r[i], i);
    assert_int_equal(tio_submit(t, ops, N), N);
    tio_destroy(t);
    t = fx_tio(&o);
    read_check(f, t, fd, r, N, 1);

    /* reads and copies in flight, some completions polled, some not */
    for (uint32_t i = 0; i < N; i++)
        ops[i] = i % 2 ? op_copy(i, fd, &r[i], i, b, r[i].file_off, 3)
                       : op_read(i, fd, &r[i], i, HALF + r[i].pool_off);
    assert_int_equal(tio_submit(t, ops, N), N);
    tio_wait(t, WAIT_MS);
    tio_done_t d;
    (void)tio_poll(t, &d, 1);
    tio_destroy(t);

    /* and one that never did anything */
    t = fx_tio(&o);
    tio_destroy(t);
    tio_destroy(NULL);
    close(fd);
    close(b);
}

static void test_refused(void **state)
{
    fx_t *f = fx_get(state);
    tio_t *t = NULL;
    tio_opts_t o = fx_opts(f, 0);
    o.pool_base = NULL;
    assert_int_equal(tio_create(&o, &t), KVD_ERR_INVALID);
    o = fx_opts(f, 0);
    o.pool_bytes = POOL_BYTES - 1;
    assert_int_equal(tio_create(&o, &t), KVD_ERR_INVALID);
    o = fx_opts(f, 0);
    o.queue_depth = 1u << 20;
    assert_int_equal(tio_create(&o, &t), KVD_ERR_INVALID);
    assert_null(t);

    o = fx_opts(f, 2);
    t = fx_tio(&o);
    int fd = fx_open(f, "seg-000001.kvs");
    rec_t bad[3] = {
        {SEG_BLOCK + 512, 0, SEG_BLOCK},                    /* unaligned file offset */
        {SEG_BLOCK, POOL_BYTES - SEG_BLOCK, 2 * SEG_BLOCK}, /* past the pool */
        {SEG_BLOCK, 0, 2 * MAX_VALUE}, /* a COPY over max_value_bytes */
    };
    tio_op_t ops[3] = {op_write(0, fd, &bad[0], 0),
                       op_read(1, fd, &bad[1], 1, bad[1].pool_off),
                       op_copy(2, fd, &bad[2], 2, fd, 0, 1)};
    tio_done_t done[3];
    run_ops(t, ops, 3, done);
    for (int i = 0; i < 3; i++)
        assert_int_equal(done[i].status, KVD_ERR_INVALID);
    tio_stats_t st;
    tio_stats(t, &st);
    assert_int_equal(st.writes + st.reads + st.copies + st.io_errors, 0);
    tio_destroy(t);
    close(fd);
}

/* TIO_SYNC: a sync of a segment the records were written to ends OK and is
 * counted; one of a file that cannot be synced (a pipe: EINVAL) ends with
 * KVD_ERR_IO and its errno; one of no file is refused. Reads and writes
 * around it are not held up. */
static void test_sync(void **state)
{
    fx_t *f = fx_get(state);
    static const uint64_t sizes[] = {4 * KVD_KiB, 64 * KVD_KiB, 4 * KVD_KiB};
    rec_t r[KVD_ARRAY_SIZE(sizes)];
    lay_out(r, sizes, KVD_ARRAY_SIZE(sizes), SEG_BLOCK, 0);
    int fd = fx_open(f, "seg-000001.kvs");
    tio_opts_t o = fx_opts(f, 0);
    tio_t *t = fx_tio(&o);
    write_recs(t, fd, r, KVD_ARRAY_SIZE(sizes));
    int pipe_fd[2];
    assert_int_equal(pipe(pipe_fd), 0);
    tio_op_t ops[3] = {{.tag = 0, .kind = TIO_SYNC, .fd = fd},
                       {.tag = 1, .kind = TIO_SYNC, .fd = pipe_fd[0]},
                       {.tag = 2, .kind = TIO_SYNC, .fd = -1}};
    tio_done_t done[3];
    run_ops(t, ops, 3, done);
    assert_int_equal(done[0].status, KVD_OK);
    assert_int_equal(done[0].kind, TIO_SYNC);
    assert_int_equal(done[1].status, KVD_ERR_IO);
    assert_int_equal(done[1].sys_errno, EINVAL);
    assert_int_equal(done[2].status, KVD_ERR_INVALID);
    tio_stats_t st;
    tio_stats(t, &st);
    assert_int_equal(st.syncs, 1);
    assert_int_equal(st.io_errors, 1);
    assert_int_equal(st.writes, KVD_ARRAY_SIZE(sizes));
    read_check(f, t, fd, r, KVD_ARRAY_SIZE(sizes), 1);
    tio_destroy(t);
    close(pipe_fd[0]);
    close(pipe_fd[1]);
    close(fd);
}

/* TIO_AUTO: io_uring where a ring can be had, else pread/pwrite with the
 * reason in the note. */
static void test_auto(void **state)
{
    fx_t *f = *state;
    tio_opts_t o = fx_opts(f, 0);
    o.backend = TIO_AUTO;
    tio_t *t = NULL;
    assert_int_equal(tio_create(&o, &t), KVD_OK);
    if (uring_missing[0] == '\0') {
        assert_string_equal(tio_backend_name(t), "io_uring");
    } else {
        assert_string_equal(tio_backend_name(t), "pread/pwrite");
        assert_non_null(strstr(tio_note(t), "io_uring_queue_init"));
        /* asked for by name: refused */
        tio_t *u = NULL;
        o.backend = TIO_URING;
        assert_int_equal(tio_create(&o, &u), KVD_ERR_UNSUPPORTED);
        assert_null(u);
    }
    print_message("TIO_AUTO: %s%s%s\n", tio_backend_name(t), tio_note(t)[0] ? ", " : "",
                  tio_note(t));
    slices_round_trip(f, t, "seg-000001.kvs");
    tio_destroy(t);
}

/* Whether a ring can be set up here; else why not, in uring_missing. */
static void probe_uring(void)
{
    struct io_uring ring;
    int rc = io_uring_queue_init(4, &ring, 0);
    if (rc < 0) {
        snprintf(uring_missing, sizeof(uring_missing), "io_uring_queue_init: %s",
                 strerror(-rc));
        return;
    }
    io_uring_queue_exit(&ring);
}

/* A case of one backend, and a case of both. */
#define CASE_NAME(f, suffix) #f "/" suffix
#define CASE(f, suffix, backend)                             \
    {                                                        \
        CASE_NAME(f, suffix), f, setup, teardown, &(backend) \
    }
#define BOTH(f) CASE(f, "pread-pwrite", be_psync), CASE(f, "io_uring", be_uring)

int main(void)
{
    probe_uring();
    if (uring_missing[0] != '\0')
        print_message("io_uring cases will be skipped: %s\n", uring_missing);
    static tio_backend_t be_auto = TIO_AUTO;
    const struct CMUnitTest tests[] = {
        BOTH(test_round_trip),
        BOTH(test_corrupt),
        BOTH(test_copy),
        BOTH(test_queue_depth),
        BOTH(test_fail_read_every),
        BOTH(test_no_space),
        BOTH(test_fixed_buffers),
        BOTH(test_destroy_in_flight),
        BOTH(test_refused),
        BOTH(test_sync),
        {"test_auto", test_auto, setup, teardown, &be_auto},
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
