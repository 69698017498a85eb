/*
 * Description: the journal file (store/journal.h) on its own, without the
 * engine: CRC-32C against its published check value and its table version
 * over every length and alignment; records read back in order and
 * byte-exact; a torn last record (the file cut at every byte inside it, or
 * a byte of it flipped) is dropped with every record before it intact; a
 * header of another version, byte order or checksum, a file that is not a
 * journal, and one not private to its owner are refused with a reason; a
 * rewrite (compaction) gets the snapshot and every commit made while it
 * ran, in order, and one aborted leaves the old file as it was; an
 * invalidated journal reads back flagged; a failed write (the file size
 * limit) leaves no torn record behind.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kvd_common.h"
#include "journal.h"

static char dir[64], path[128];

static int setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof(dir), "/dev/shm/kvdock-jt-XXXXXX");
    if (mkdtemp(dir) == NULL) {
        snprintf(dir, sizeof(dir), "/tmp/kvdock-jt-XXXXXX");
        if (mkdtemp(dir) == NULL)
            return -1;
    }
    snprintf(path, sizeof(path), "%s/j", dir);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    char p[160];
    snprintf(p, sizeof(p), "%s.tmp", path);
    unlink(p);
    unlink(path);
    rmdir(dir);
    return 0;
}

static jnl_header_t header(void)
{
    jnl_header_t h;
    jnl_header_init(&h);
    h.page_bytes = 4096;
    h.pool_bytes = 1 << 20;
    h.pool_dev = 7;
    h.pool_ino = 8;
    h.secret[0] = 0x1234;
    return h;
}

/* Record k's payload: k + 1 bytes of a pattern of k. */
static size_t payload(uint32_t k, uint8_t *out)
{
    for (uint32_t i = 0; i <= k; i++)
        out[i] = (uint8_t)(k * 31 + i);
    return k + 1;
}

static int write_records(jnl_t *j, uint32_t from, uint32_t n)
{
    uint8_t buf[512];
    for (uint32_t k = from; k < from + n; k++) {
        size_t len = payload(k, buf);
        uint8_t *p = jnl_put(j, len);
        if (p == NULL)
            return KVD_ERR_NOMEM;
        memcpy(p, buf, len);
        int rc = jnl_commit(j);
        if (rc != KVD_OK)
            return rc;
    }
    return KVD_OK;
}

/* What reading found: the payloads' record numbers, in order. */
typedef struct seen {
    uint32_t n;
    uint32_t k[4096];
    bool bad; /* a payload that is no record's */
} seen_t;

static int collect(void *arg, const uint8_t *p, size_t len)
{
    seen_t *s = arg;
    uint8_t want[512];
    uint32_t k = (uint32_t)len - 1;
    if (len == 0 || len > sizeof(want) || payload(k, want) != len ||
        memcmp(want, p, len) != 0)
        s->bad = true;
    if (s->n < 4096)
        s->k[s->n++] = k;
    return 0;
}

static int read_all(seen_t *s, jnl_header_t *h, jnl_scan_t *scan, char *why)
{
    memset(s, 0, sizeof(*s));
    return jnl_read(path, h, collect, s, scan, why, 256);
}

/* ------------------------------------------------------------- CRC */

static void test_crc32c(void **state)
{
    (void)state;
    assert_int_equal(kvd_crc32c(0, "123456789", 9), 0xe3069283u);
    assert_int_equal(kvd_crc32c_sw(0, "123456789", 9), 0xe3069283u);
    assert_int_equal(kvd_crc32c(0, "", 0), 0);
    /* incremental = whole */
    assert_int_equal(kvd_crc32c(kvd_crc32c(0, "1234", 4), "56789", 5), 0xe3069283u);
    static uint8_t buf[300];
    for (size_t i = 0; i < sizeof(buf); i++)
        buf[i] = (uint8_t)(i * 7 + 3);
    for (size_t off = 0; off < 9; off++)
        for (size_t len = 0; len + off <= sizeof(buf); len += 1 + len / 8)
            assert_int_equal(kvd_crc32c(0, buf + off, len),
                             kvd_crc32c_sw(0, buf + off, len));
}

/* ---------------------------------------------------------- records */

static void test_records_round_trip(void **state)
{
    (void)state;
    jnl_header_t h = header(), got;
    jnl_t *j = NULL;
    assert_int_equal(jnl_create(path, &h, &j), KVD_OK);
    assert_int_equal(jnl_commit(j), KVD_OK); /* nothing open: writes nothing */
    assert_int_equal(jnl_bytes(j), sizeof(jnl_header_t));
    assert_int_equal(write_records(j, 0, 200), KVD_OK);
    /* a record of several entries is one record */
    memcpy(jnl_put(j, 3), "abc", 3);
    memcpy(jnl_put(j, 2), "de", 2);
    assert_true(jnl_pending(j));
    jnl_discard(j);
    assert_false(jnl_pending(j));
    jnl_close(j);

    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);

    seen_t *s = malloc(sizeof(*s));
    jnl_scan_t scan;
    char why[256] = "";
    assert_int_equal(read_all(s, &got, &scan, why), KVD_OK);
    assert_false(s->bad);
    assert_int_equal(s->n, 200);
    for (uint32_t k = 0; k < 200; k++)
        assert_int_equal(s->k[k], k);
    assert_int_equal(scan.records, 200);
    assert_int_equal(scan.torn_bytes, 0);
    assert_int_equal(scan.good_bytes, scan.file_bytes);
    assert_int_equal(got.pool_bytes, h.pool_bytes);
    assert_int_equal(got.pool_ino, 8);
    assert_int_equal(got.secret[0], 0x1234);
    free(s);
}

/* The file cut at every byte inside its last record, or that record's
 * bytes flipped one at a time: the last record is dropped, the others
 * read back whole; a record damaged with others after it: refused. */
static void test_torn_tail(void **state)
{
    (void)state;
    jnl_header_t h = header(), got;
    jnl_t *j = NULL;
    assert_int_equal(jnl_create(path, &h, &j), KVD_OK);
    assert_int_equal(write_records(j, 0, 10), KVD_OK);
    uint64_t before_last = jnl_bytes(j);
    assert_int_equal(write_records(j, 10, 1), KVD_OK); /* 11 bytes of payload */
    uint64_t whole = jnl_bytes(j);
    jnl_close(j);
    assert_int_equal(whole - before_last, JNL_RECORD_HDR + 11);

    int fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    uint8_t *copy = malloc(whole);
    assert_int_equal(pread(fd, copy, whole, 0), (ssize_t)whole);
    seen_t *s = malloc(sizeof(*s));
    jnl_scan_t scan;
    char why[256];
    for (uint64_t cut = before_last; cut < whole; cut++) {
        assert_int_equal(ftruncate(fd, (off_t)cut), 0);
        assert_int_equal(read_all(s, &got, &scan, why), KVD_OK);
        assert_false(s->bad);
        assert_int_equal(s->n, 10);
        assert_int_equal(scan.good_bytes, before_last);
        assert_int_equal(scan.torn_bytes, cut - before_last);
    }
    assert_int_equal(pwrite(fd, copy, whole, 0), (ssize_t)whole);
    for (uint64_t at = before_last; at < whole; at++) {
        uint8_t b = copy[at] ^ 0x40;
        assert_int_equal(pwrite(fd, &b, 1, (off_t)at), 1);
        assert_int_equal(read_all(s, &got, &scan, why), KVD_OK);
        assert_false(s->bad);
        assert_int_equal(s->n, 10);
        assert_int_equal(scan.torn_bytes, whole - before_last);
        assert_int_equal(pwrite(fd, copy + at, 1, (off_t)at), 1);
    }
    /* a flipped byte in the middle is damage, not a tear (a write cut
     * short leaves nothing after it): the journal is refused, since a
     * replay without the records after it (an extent's FREE before its
     * reuse) would serve wrong bytes */
    uint8_t b = copy[sizeof(jnl_header_t) + JNL_RECORD_HDR] ^ 1; /* record 0's payload */
    assert_int_equal(pwrite(fd, &b, 1, sizeof(jnl_header_t) + JNL_RECORD_HDR), 1);
    assert_int_equal(read_all(s, &got, &scan, why), KVD_ERR_STATE);
    assert_non_null(strstr(why, "damaged"));
    assert_int_equal(s->n, 0);
    close(fd);
    free(copy);
    free(s);
}

/* Rewrites the header with f applied; with reseal, a valid checksum. */
static void patch_header(void (*f)(jnl_header_t *), bool reseal)
{
    int fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    jnl_header_t h;
    assert_int_equal(pread(fd, &h, sizeof(h), 0), (ssize_t)sizeof(h));
    f(&h);
    if (reseal)
        h.crc = kvd_crc32c(0, &h, offsetof(jnl_header_t, crc));
    assert_int_equal(pwrite(fd, &h, sizeof(h), 0), (ssize_t)sizeof(h));
    close(fd);
}

/* a layout newer than this build's: refused, never misread */
static void set_version_next(jnl_header_t *h)
{
    h->version = JNL_VERSION + 1;
}
/* older than the oldest it reads */
static void set_version_0(jnl_header_t *h)
{
    h->version = 0;
}
static void swap_order(jnl_header_t *h)
{
    h->byte_order = 0x04030201u;
}
static void grow_pool(jnl_header_t *h)
{
    h->pool_bytes *= 2;
}
static void no_magic(jnl_header_t *h)
{
    h->magic[0] = 'X';
}

static void expect_refusal(const char *needle)
{
    seen_t *s = malloc(sizeof(*s));
    jnl_header_t got;
    jnl_scan_t scan;
    char why[256] = "";
    assert_int_equal(read_all(s, &got, &scan, why), KVD_ERR_STATE);
    if (strstr(why, needle) == NULL)
        print_error("why '%s' lacks '%s'\n", why, needle);
    assert_non_null(strstr(why, needle));
    assert_int_equal(s->n, 0);
    free(s);
}

static void test_header_refused(void **state)
{
    (void)state;
    jnl_header_t h = header();
    jnl_t *j = NULL;
    assert_int_equal(jnl_create(path, &h, &j), KVD_OK);
    assert_int_equal(write_records(j, 0, 3), KVD_OK);
    jnl_close(j);

    patch_header(set_version_next, true);
    expect_refusal("version 3");
    assert_int_equal(jnl_create(path, &h, &j), KVD_OK);
    jnl_close(j);
    patch_header(set_version_0, true);
    expect_refusal("version 0");
    assert_int_equal(jnl_create(path, &h, &j), KVD_OK);
    jnl_close(j);
    patch_header(swap_order, true);
    expect_refusal("byte order");
    assert_int_equal(jnl_create(path, &h, &j), KVD_OK);
    jnl_close(j);
    patch_header(grow_pool, false); /* any change without a new checksum */
    expect_refusal("checksum");
    assert_int_equal(jnl_create(path, &h, &j), KVD_OK);
    jnl_close(j);
    patch_header(no_magic, true);
    expect_refusal("not a kvdock journal");

    /* a file too short for a header */
    int fd = open(path, O_WRONLY | O_TRUNC);
    assert_int_equal(write(fd, "KVDJ", 4), 4);
    close(fd);
    expect_refusal("not a kvdock journal");

    /* open to others */
    assert_int_equal(jnl_create(path, &h, &j), KVD_OK);
    jnl_close(j);
    assert_int_equal(chmod(path, 0644), 0);
    expect_refusal("private");

    /* none there */
    unlink(path);
    jnl_header_t got;
    jnl_scan_t scan;
    assert_int_equal(jnl_read(path, &got, collect, NULL, &scan, NULL, 0),
                     KVD_ERR_NOT_FOUND);
}

/* ------------------------------------------------------------ rewrite */

static void test_rewrite(void **state)
{
    (void)state;
    jnl_header_t h = header();
    jnl_t *j = NULL;
    assert_int_equal(jnl_create(path, &h, &j), KVD_OK);
    assert_int_equal(write_records(j, 0, 50), KVD_OK);

    /* an aborted rewrite changes nothing */
    assert_int_equal(jnl_rewrite_begin(j, &h), KVD_OK);
    assert_true(jnl_rewriting(j));
    memcpy(jnl_rewrite_put(j, 1), "\x00", 1);
    jnl_rewrite_abort(j);
    assert_false(jnl_rewriting(j));
    char tmp[160];
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    assert_int_equal(access(tmp, F_OK), -1);

    /* a snapshot (records 100..102 stand for it), then a commit while it
     * is being written, then more snapshot, then the rename */
    jnl_header_t h2 = h;
    h2.written_ms = 99;
    assert_int_equal(jnl_rewrite_begin(j, &h2), KVD_OK);
    uint8_t buf[512];
    for (uint32_t k = 100; k < 102; k++) {
        size_t len = payload(k, buf);
        memcpy(jnl_rewrite_put(j, len), buf, len);
        assert_int_equal(jnl_rewrite_flush(j), KVD_OK);
    }
    assert_int_equal(write_records(j, 50, 1), KVD_OK); /* to both files */
    size_t len = payload(102, buf);
    memcpy(jnl_rewrite_put(j, len), buf, len);
    assert_int_equal(jnl_rewrite_finish(j), KVD_OK);
    assert_false(jnl_rewriting(j));
    assert_int_equal(write_records(j, 51, 1), KVD_OK); /* to the new file */
    jnl_close(j);

    seen_t *s = malloc(sizeof(*s));
    jnl_header_t got;
    jnl_scan_t scan;
    char why[256];
    assert_int_equal(read_all(s, &got, &scan, why), KVD_OK);
    assert_false(s->bad);
    assert_int_equal(got.written_ms, 99);
    uint32_t want[] = {100, 101, 50, 102, 51};
    assert_int_equal(s->n, 5);
    for (size_t k = 0; k < 5; k++)
        assert_int_equal(s->k[k], want[k]);
    free(s);
}

static void test_invalidate(void **state)
{
    (void)state;
    jnl_header_t h = header(), got;
    jnl_t *j = NULL;
    assert_int_equal(jnl_create(path, &h, &j), KVD_OK);
    assert_int_equal(write_records(j, 0, 5), KVD_OK);
    assert_int_equal(jnl_invalidate(j), KVD_OK);
    jnl_close(j);
    seen_t *s = malloc(sizeof(*s));
    jnl_scan_t scan;
    char why[256];
    assert_int_equal(read_all(s, &got, &scan, why), KVD_OK);
    assert_true(got.flags & JNL_F_INVALID);
    free(s);
}

/* A write past RLIMIT_FSIZE fails (EFBIG): the commit reports it and the
 * file holds no part of that record. */
static void test_failed_write_cut_back(void **state)
{
    (void)state;
    jnl_header_t h = header(), got;
    jnl_t *j = NULL;
    assert_int_equal(jnl_create(path, &h, &j), KVD_OK);
    assert_int_equal(write_records(j, 0, 20), KVD_OK);
    uint64_t size = jnl_bytes(j);
    struct rlimit old, lim;
    getrlimit(RLIMIT_FSIZE, &old);
    lim = old;
    lim.rlim_cur = size + 100; /* a record of 200 bytes straddles it */
    signal(SIGXFSZ, SIG_IGN);
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &lim), 0);
    uint8_t buf[512];
    size_t len = payload(199, buf);
    memcpy(jnl_put(j, len), buf, len);
    int rc = jnl_commit(j);
    setrlimit(RLIMIT_FSIZE, &old);
    assert_int_not_equal(rc, KVD_OK);
    assert_int_equal(jnl_bytes(j), size);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal((uint64_t)st.st_size, size);
    /* and later records follow the whole ones */
    assert_int_equal(write_records(j, 20, 2), KVD_OK);
    jnl_close(j);
    seen_t *s = malloc(sizeof(*s));
    jnl_scan_t scan;
    char why[256];
    assert_int_equal(read_all(s, &got, &scan, why), KVD_OK);
    assert_int_equal(s->n, 22);
    assert_int_equal(scan.torn_bytes, 0);
    free(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_crc32c, setup, teardown),
        cmocka_unit_test_setup_teardown(test_records_round_trip, setup, teardown),
        cmocka_unit_test_setup_teardown(test_torn_tail, setup, teardown),
        cmocka_unit_test_setup_teardown(test_header_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_rewrite, setup, teardown),
        cmocka_unit_test_setup_teardown(test_invalidate, setup, teardown),
        cmocka_unit_test_setup_teardown(test_failed_write_cut_back, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
