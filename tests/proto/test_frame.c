/*
 * Description: the incremental frame reader (kvd_framer_*) and the growable
 * buffer (kvd_buf_*) of proto/.
 *
 * A frame is a 4-byte little-endian payload length then the payload. The
 * tests build frames by hand from that definition and feed them the way a
 * non-blocking socket would deliver them: a byte at a time, several frames
 * in one read, a header split over reads.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "kvd_proto.h"

/* Builds header + payload (payload bytes derived from seed) into a new block. */
static uint8_t *make_frame(uint32_t payload_len, uint8_t seed, size_t *frame_len)
{
    uint8_t *f = malloc(4 + (size_t)payload_len);
    assert_non_null(f);
    f[0] = (uint8_t)payload_len;
    f[1] = (uint8_t)(payload_len >> 8);
    f[2] = (uint8_t)(payload_len >> 16);
    f[3] = (uint8_t)(payload_len >> 24);
    uint32_t x = seed * 2654435761u + 1;
    for (uint32_t i = 0; i < payload_len; i++) {
        x = x * 1103515245u + 12345u;
        f[4 + i] = (uint8_t)(x >> 16);
    }
    *frame_len = 4 + (size_t)payload_len;
    return f;
}

/* Copies len bytes into the framer as one read would. */
static void feed(kvd_framer_t *f, const uint8_t *data, size_t len)
{
    uint8_t *space = NULL;
    size_t avail = 0;
    assert_int_equal(kvd_framer_space(f, len, &space, &avail), KVD_OK);
    assert_non_null(space);
    assert_true(avail >= len);
    memcpy(space, data, len);
    kvd_framer_commit(f, len);
}

static void test_frame_fed_one_byte_at_a_time(void **state)
{
    (void)state;
    size_t flen;
    uint8_t *frame = make_frame(300, 1, &flen);
    kvd_framer_t f;
    kvd_framer_init(&f, KVD_FRAME_DEFAULT_MAX, KVD_MEM_CONN);
    int frames = 0;
    for (size_t i = 0; i < flen; i++) {
        feed(&f, frame + i, 1);
        const uint8_t *payload = NULL;
        size_t len = 0;
        int rc = kvd_framer_next(&f, &payload, &len);
        if (i + 1 < flen) {
            assert_int_equal(rc, 0);
            assert_int_equal(kvd_framer_pending(&f), i + 1);
        } else {
            assert_int_equal(rc, 1);
            assert_int_equal(len, 300);
            assert_memory_equal(payload, frame + 4, 300);
            frames++;
        }
    }
    assert_int_equal(frames, 1);
    const uint8_t *payload;
    size_t len;
    assert_int_equal(kvd_framer_next(&f, &payload, &len), 0);
    assert_int_equal(kvd_framer_pending(&f), 0);
    kvd_framer_free(&f);
    free(frame);
}

static void test_two_frames_in_one_feed(void **state)
{
    (void)state;
    size_t l1, l2;
    uint8_t *f1 = make_frame(10, 2, &l1);
    uint8_t *f2 = make_frame(1, 3, &l2);
    uint8_t both[64];
    memcpy(both, f1, l1);
    memcpy(both + l1, f2, l2);

    kvd_framer_t f;
    kvd_framer_init(&f, 1024, KVD_MEM_CONN);
    feed(&f, both, l1 + l2);
    const uint8_t *payload;
    size_t len;
    assert_int_equal(kvd_framer_next(&f, &payload, &len), 1);
    assert_int_equal(len, 10);
    assert_memory_equal(payload, f1 + 4, 10);
    assert_int_equal(kvd_framer_next(&f, &payload, &len), 1);
    assert_int_equal(len, 1);
    assert_memory_equal(payload, f2 + 4, 1);
    assert_int_equal(kvd_framer_next(&f, &payload, &len), 0);
    assert_int_equal(kvd_framer_pending(&f), 0);
    kvd_framer_free(&f);
    free(f1);
    free(f2);
}

static void test_header_split_across_feeds(void **state)
{
    (void)state;
    size_t flen;
    uint8_t *frame = make_frame(70000, 4, &flen); /* length uses 3 header bytes */
    kvd_framer_t f;
    kvd_framer_init(&f, KVD_FRAME_DEFAULT_MAX, KVD_MEM_CONN);
    const uint8_t *payload;
    size_t len;

    feed(&f, frame, 1);
    assert_int_equal(kvd_framer_next(&f, &payload, &len), 0);
    feed(&f, frame + 1, 2);
    assert_int_equal(kvd_framer_next(&f, &payload, &len), 0);
    feed(&f, frame + 3, 5); /* last header byte and 4 payload bytes */
    assert_int_equal(kvd_framer_next(&f, &payload, &len), 0);
    assert_int_equal(kvd_framer_pending(&f), 8);
    feed(&f, frame + 8, flen - 8);
    assert_int_equal(kvd_framer_next(&f, &payload, &len), 1);
    assert_int_equal(len, 70000);
    assert_memory_equal(payload, frame + 4, 70000);
    kvd_framer_free(&f);
    free(frame);
}

static void test_frame_then_partial_frame_across_reads(void **state)
{
    (void)state;
    /* frame 1 whole plus half of frame 2 in one read; the rest of frame 2
     * arrives after frame 1 was taken (the framer slides its tail then) */
    size_t l1, l2;
    uint8_t *f1 = make_frame(5000, 5, &l1);
    uint8_t *f2 = make_frame(9000, 6, &l2);
    uint8_t *first = malloc(l1 + l2 / 2);
    assert_non_null(first);
    memcpy(first, f1, l1);
    memcpy(first + l1, f2, l2 / 2);

    kvd_framer_t f;
    kvd_framer_init(&f, 16384, KVD_MEM_CONN);
    feed(&f, first, l1 + l2 / 2);
    const uint8_t *payload;
    size_t len;
    assert_int_equal(kvd_framer_next(&f, &payload, &len), 1);
    assert_int_equal(len, 5000);
    assert_memory_equal(payload, f1 + 4, 5000);
    assert_int_equal(kvd_framer_next(&f, &payload, &len), 0);
    assert_int_equal(kvd_framer_pending(&f), l2 / 2);
    feed(&f, f2 + l2 / 2, l2 - l2 / 2);
    assert_int_equal(kvd_framer_next(&f, &payload, &len), 1);
    assert_int_equal(len, 9000);
    assert_memory_equal(payload, f2 + 4, 9000);
    assert_int_equal(kvd_framer_pending(&f), 0);
    kvd_framer_free(&f);
    free(first);
    free(f1);
    free(f2);
}

static void test_length_over_max_too_large(void **state)
{
    (void)state;
    kvd_framer_t f;
    const uint8_t *payload;
    size_t len;

    /* exactly the maximum is fine */
    size_t flen;
    uint8_t *frame = make_frame(1024, 7, &flen);
    kvd_framer_init(&f, 1024, KVD_MEM_CONN);
    feed(&f, frame, flen);
    assert_int_equal(kvd_framer_next(&f, &payload, &len), 1);
    assert_int_equal(len, 1024);
    kvd_framer_free(&f);
    free(frame);

    /* one more is refused as soon as the header is in, before the payload */
    const uint8_t hdr[4] = {0x01, 0x04, 0x00, 0x00}; /* 1025 */
    kvd_framer_init(&f, 1024, KVD_MEM_CONN);
    feed(&f, hdr, 4);
    assert_int_equal(kvd_framer_next(&f, &payload, &len), KVD_ERR_TOO_LARGE);
    kvd_framer_free(&f);

    const uint8_t huge[4] = {0xff, 0xff, 0xff, 0xff};
    kvd_framer_init(&f, KVD_FRAME_DEFAULT_MAX, KVD_MEM_CONN);
    feed(&f, huge, 4);
    assert_int_equal(kvd_framer_next(&f, &payload, &len), KVD_ERR_TOO_LARGE);
    kvd_framer_free(&f);
}

static void test_zero_length_protocol_error(void **state)
{
    (void)state;
    kvd_framer_t f;
    kvd_framer_init(&f, 1024, KVD_MEM_CONN);
    const uint8_t zero[8] = {0, 0, 0, 0, 1, 2, 3, 4};
    feed(&f, zero, sizeof(zero));
    const uint8_t *payload;
    size_t len;
    assert_int_equal(kvd_framer_next(&f, &payload, &len), KVD_ERR_PROTOCOL);
    kvd_framer_free(&f);
}

static void test_pending_for_truncated_frame(void **state)
{
    (void)state;
    kvd_framer_t f;
    kvd_framer_init(&f, 1024, KVD_MEM_CONN);
    assert_int_equal(kvd_framer_pending(&f), 0);

    size_t flen;
    uint8_t *frame = make_frame(100, 8, &flen);
    const uint8_t *payload;
    size_t len;

    feed(&f, frame, 2); /* half a header */
    assert_int_equal(kvd_framer_next(&f, &payload, &len), 0);
    assert_int_equal(kvd_framer_pending(&f), 2);

    feed(&f, frame + 2, 50); /* header and part of the payload */
    assert_int_equal(kvd_framer_next(&f, &payload, &len), 0);
    assert_int_equal(kvd_framer_pending(&f), 52);

    feed(&f, frame + 52, flen - 52);
    assert_int_equal(kvd_framer_next(&f, &payload, &len), 1);
    assert_int_equal(kvd_framer_pending(&f), 0);
    kvd_framer_free(&f);
    free(frame);
}

static void test_large_frame_byte_exact(void **state)
{
    (void)state;
    const uint32_t big = 3u * 1024u * 1024u;
    size_t flen;
    uint8_t *frame = make_frame(big, 9, &flen);
    kvd_framer_t f;
    kvd_framer_init(&f, 4u * 1024u * 1024u, KVD_MEM_CONN);
    const uint8_t *payload = NULL;
    size_t len = 0;
    /* uneven reads, as a socket would give */
    size_t off = 0, step = 1;
    int rc = 0;
    while (off < flen) {
        size_t n = step < flen - off ? step : flen - off;
        feed(&f, frame + off, n);
        off += n;
        step = step * 3 + 7;
        if (step > 200000)
            step = 65521;
        rc = kvd_framer_next(&f, &payload, &len);
        if (off < flen)
            assert_int_equal(rc, 0);
    }
    assert_int_equal(rc, 1);
    assert_int_equal(len, big);
    assert_memory_equal(payload, frame + 4, big);
    kvd_framer_free(&f);
    free(frame);
}

static void test_put_header_little_endian(void **state)
{
    (void)state;
    kvd_buf_t b;
    kvd_buf_init(&b, KVD_MEM_OTHER);
    assert_int_equal(kvd_frame_put_header(&b, 0x01020304u), KVD_OK);
    assert_int_equal(b.len, 4);
    const uint8_t want[4] = {0x04, 0x03, 0x02, 0x01};
    assert_memory_equal(b.data, want, 4);
    /* a zero-length payload cannot be framed */
    assert_int_not_equal(kvd_frame_put_header(&b, 0), KVD_OK);
    assert_int_equal(b.len, 4);
    kvd_buf_free(&b);
}

static void test_buf_append_consume(void **state)
{
    (void)state;
    uint64_t before = kvd_mem_bytes(KVD_MEM_STAGING);
    kvd_buf_t b;
    kvd_buf_init(&b, KVD_MEM_STAGING);
    assert_int_equal(b.len, 0);

    assert_int_equal(kvd_buf_append(&b, "hello", 5), KVD_OK);
    assert_int_equal(kvd_buf_append(&b, " world", 6), KVD_OK);
    assert_int_equal(b.len, 11);
    assert_true(b.cap >= 11);
    assert_memory_equal(b.data, "hello world", 11);
    /* the buffer's memory is charged to its category */
    assert_true(kvd_mem_bytes(KVD_MEM_STAGING) >= before + 11);

    kvd_buf_consume(&b, 6);
    assert_int_equal(b.len, 5);
    assert_memory_equal(b.data, "world", 5);
    kvd_buf_consume(&b, 0);
    assert_int_equal(b.len, 5);
    assert_memory_equal(b.data, "world", 5);

    /* growing keeps what is there */
    uint8_t chunk[10000];
    for (size_t i = 0; i < sizeof(chunk); i++)
        chunk[i] = (uint8_t)(i * 7);
    assert_int_equal(kvd_buf_append(&b, chunk, sizeof(chunk)), KVD_OK);
    assert_int_equal(b.len, 5 + sizeof(chunk));
    assert_memory_equal(b.data, "world", 5);
    assert_memory_equal(b.data + 5, chunk, sizeof(chunk));

    assert_int_equal(kvd_buf_reserve(&b, 100000), KVD_OK);
    assert_true(b.cap - b.len >= 100000);
    assert_memory_equal(b.data + 5, chunk, sizeof(chunk));

    kvd_buf_consume(&b, b.len + 10); /* more than there is: empty */
    assert_int_equal(b.len, 0);

    kvd_buf_free(&b);
    assert_null(b.data);
    assert_int_equal(b.len, 0);
    assert_true(kvd_mem_bytes(KVD_MEM_STAGING) == before);
}

/* kvd_framer_partial: a frame begun and not all there (what the daemon's
 * frame timeout looks at), never whole frames waiting to be taken. */
static void test_partial(void **state)
{
    (void)state;
    kvd_framer_t f;
    kvd_framer_init(&f, 1024, KVD_MEM_OTHER);
    assert_false(kvd_framer_partial(&f));
    size_t n1, n2;
    uint8_t *a = make_frame(10, 1, &n1), *b = make_frame(20, 2, &n2);
    feed(&f, a, 2); /* half a header */
    assert_true(kvd_framer_partial(&f));
    feed(&f, a + 2, n1 - 3); /* all but the last byte */
    assert_true(kvd_framer_partial(&f));
    feed(&f, a + n1 - 1, 1);
    assert_false(kvd_framer_partial(&f)); /* whole, not yet taken */
    feed(&f, b, 5);
    const uint8_t *p;
    size_t len;
    assert_int_equal(kvd_framer_next(&f, &p, &len), 1);
    assert_true(kvd_framer_partial(&f)); /* the second has begun */
    feed(&f, b + 5, n2 - 5);
    assert_int_equal(kvd_framer_next(&f, &p, &len), 1);
    assert_false(kvd_framer_partial(&f));
    free(a);
    free(b);
    kvd_framer_free(&f);
}

/* kvd_framer_space_cap says what kvd_framer_space will make the buffer. */
static void test_space_cap(void **state)
{
    (void)state;
    kvd_framer_t f;
    kvd_framer_init(&f, 1u << 20, KVD_MEM_OTHER);
    const size_t mins[] = {1, 300, 65536, 70000, 1, 200000, 10};
    for (size_t i = 0; i < sizeof(mins) / sizeof(mins[0]); i++) {
        size_t want = kvd_framer_space_cap(&f, mins[i]);
        uint8_t *space;
        size_t avail;
        assert_int_equal(kvd_framer_space(&f, mins[i], &space, &avail), KVD_OK);
        assert_true(f.buf.cap == want);
        assert_true(avail >= mins[i]);
        size_t fill = avail / 2; /* leave the buffer part full */
        memset(space, 0x11, fill);
        kvd_framer_commit(&f, fill);
    }
    kvd_framer_free(&f);
}

/* Found by fuzz/fuzz_linker.c: appending nothing to a buffer that never
 * held anything computed NULL + 0 and called memcpy(NULL, p, 0), both
 * undefined (UBSan in the clang tree). Nothing is appended, nothing
 * allocated. */
static void test_buf_append_nothing_to_empty(void **state)
{
    (void)state;
    kvd_buf_t b;
    kvd_buf_init(&b, KVD_MEM_OTHER);
    assert_int_equal(kvd_buf_append(&b, "x", 0), KVD_OK);
    assert_true(b.len == 0);
    assert_null(b.data);
    assert_int_equal(kvd_buf_append(&b, "ab", 2), KVD_OK);
    assert_int_equal(kvd_buf_append(&b, NULL, 0), KVD_OK);
    assert_true(b.len == 2 && memcmp(b.data, "ab", 2) == 0);
    kvd_buf_free(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_frame_fed_one_byte_at_a_time),
        cmocka_unit_test(test_two_frames_in_one_feed),
        cmocka_unit_test(test_header_split_across_feeds),
        cmocka_unit_test(test_frame_then_partial_frame_across_reads),
        cmocka_unit_test(test_length_over_max_too_large),
        cmocka_unit_test(test_zero_length_protocol_error),
        cmocka_unit_test(test_pending_for_truncated_frame),
        cmocka_unit_test(test_large_frame_byte_exact),
        cmocka_unit_test(test_put_header_little_endian),
        cmocka_unit_test(test_buf_append_consume),
        cmocka_unit_test(test_partial),
        cmocka_unit_test(test_space_cap),
        cmocka_unit_test(test_buf_append_nothing_to_empty),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
