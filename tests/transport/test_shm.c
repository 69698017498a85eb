/*
 * Description: the same-host (shm) transport: a posted batch of WRITEs
 * (local -> remote) or READs (remote -> local) moves exactly the bytes
 * asked for and completes once, in posting order, with its cookie; a batch
 * with any transfer outside a region is refused whole and moves nothing.
 *
 * Both regions are plain heap blocks here; the backend does not care how
 * they are mapped.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "kvd_transport.h"

#define LOCAL_BYTES  65536
#define REMOTE_BYTES 98304

typedef struct fixture {
    uint8_t *local;
    uint8_t *remote;
    kvd_transport_t *t;
} fixture_t;

static void fill(uint8_t *p, size_t len, uint32_t seed)
{
    uint32_t x = seed;
    for (size_t i = 0; i < len; i++) {
        x = x * 1664525u + 1013904223u;
        p[i] = (uint8_t)(x >> 24);
    }
}

static int setup(void **state)
{
    fixture_t *f = calloc(1, sizeof(*f));
    if (f == NULL)
        return -1;
    f->local = malloc(LOCAL_BYTES);
    f->remote = malloc(REMOTE_BYTES);
    if (f->local == NULL || f->remote == NULL)
        return -1;
    fill(f->local, LOCAL_BYTES, 1);
    fill(f->remote, REMOTE_BYTES, 2);
    kvd_region_t l = {.base = f->local, .length = LOCAL_BYTES};
    kvd_region_t r = {.base = f->remote, .length = REMOTE_BYTES};
    if (kvd_transport_open_shm(&l, &r, &f->t) != KVD_OK)
        return -1;
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture_t *f = *state;
    kvd_transport_destroy(f->t);
    free(f->local);
    free(f->remote);
    free(f);
    return 0;
}

/* Polls once and expects exactly one completion: cookie, KVD_OK. */
static void expect_one_done(kvd_transport_t *t, uint64_t cookie)
{
    kvd_xfer_done_t done[4];
    memset(done, 0xee, sizeof(done));
    size_t n = 99;
    assert_int_equal(kvd_transport_poll(t, done, 4, &n), KVD_OK);
    assert_int_equal(n, 1);
    assert_true(done[0].cookie == cookie);
    assert_int_equal(done[0].status, KVD_OK);
    /* and only once */
    assert_int_equal(kvd_transport_poll(t, done, 4, &n), KVD_OK);
    assert_int_equal(n, 0);
}

static void test_name_is_shm(void **state)
{
    fixture_t *f = *state;
    assert_string_equal(kvd_transport_name(f->t), "shm");
}

static void test_write_batch_moves_exact_bytes(void **state)
{
    fixture_t *f = *state;
    uint8_t *want = malloc(REMOTE_BYTES);
    assert_non_null(want);
    memcpy(want, f->remote, REMOTE_BYTES);

    const kvd_xfer_t x[] = {
        {.local_offset = 0, .remote_offset = 1000, .length = 4096},
        {.local_offset = 12345, .remote_offset = 50000, .length = 777},
        {.local_offset = LOCAL_BYTES - 1, .remote_offset = 0, .length = 1},
        /* ends exactly at the end of both regions */
        {.local_offset = LOCAL_BYTES - 300,
         .remote_offset = REMOTE_BYTES - 300,
         .length = 300},
        {.local_offset = 5, .remote_offset = 6, .length = 0},
    };
    for (size_t i = 0; i < sizeof(x) / sizeof(x[0]); i++)
        memcpy(want + x[i].remote_offset, f->local + x[i].local_offset, x[i].length);
    uint8_t *local_before = malloc(LOCAL_BYTES);
    assert_non_null(local_before);
    memcpy(local_before, f->local, LOCAL_BYTES);

    assert_int_equal(
        kvd_transport_post(f->t, KVD_XFER_WRITE, x, sizeof(x) / sizeof(x[0]), 0xc0ffee),
        KVD_OK);
    expect_one_done(f->t, 0xc0ffee);
    assert_memory_equal(f->remote, want, REMOTE_BYTES);
    assert_memory_equal(f->local, local_before, LOCAL_BYTES); /* source unchanged */
    free(want);
    free(local_before);
}

static void test_read_batch_moves_exact_bytes(void **state)
{
    fixture_t *f = *state;
    uint8_t *want = malloc(LOCAL_BYTES);
    assert_non_null(want);
    memcpy(want, f->local, LOCAL_BYTES);

    const kvd_xfer_t x[] = {
        {.local_offset = 100, .remote_offset = REMOTE_BYTES - 8192, .length = 8192},
        {.local_offset = 40000, .remote_offset = 3, .length = 1500},
        {.local_offset = 0, .remote_offset = 0, .length = 64},
    };
    for (size_t i = 0; i < sizeof(x) / sizeof(x[0]); i++)
        memcpy(want + x[i].local_offset, f->remote + x[i].remote_offset, x[i].length);
    uint8_t *remote_before = malloc(REMOTE_BYTES);
    assert_non_null(remote_before);
    memcpy(remote_before, f->remote, REMOTE_BYTES);

    assert_int_equal(kvd_transport_post(f->t, KVD_XFER_READ, x, 3, UINT64_MAX), KVD_OK);
    expect_one_done(f->t, UINT64_MAX);
    assert_memory_equal(f->local, want, LOCAL_BYTES);
    assert_memory_equal(f->remote, remote_before, REMOTE_BYTES);
    free(want);
    free(remote_before);
}

static void test_out_of_region_refused_nothing_copied(void **state)
{
    fixture_t *f = *state;
    uint8_t *local_before = malloc(LOCAL_BYTES), *remote_before = malloc(REMOTE_BYTES);
    assert_non_null(local_before);
    assert_non_null(remote_before);
    memcpy(local_before, f->local, LOCAL_BYTES);
    memcpy(remote_before, f->remote, REMOTE_BYTES);

    const kvd_xfer_t good = {.local_offset = 0, .remote_offset = 0, .length = 4096};
    const kvd_xfer_t bad[] = {
        /* one byte past the local end */
        {.local_offset = LOCAL_BYTES - 100, .remote_offset = 0, .length = 101},
        /* one byte past the remote end */
        {.local_offset = 0, .remote_offset = REMOTE_BYTES - 100, .length = 101},
        /* starts past the end */
        {.local_offset = LOCAL_BYTES + 1, .remote_offset = 0, .length = 0},
        {.local_offset = 0, .remote_offset = REMOTE_BYTES + 4096, .length = 1},
        /* offset + length wraps around 2^64 */
        {.local_offset = UINT64_MAX - 10, .remote_offset = 0, .length = 20},
        {.local_offset = 16, .remote_offset = 16, .length = UINT64_MAX - 8},
        /* longer than either region */
        {.local_offset = 0, .remote_offset = 0, .length = REMOTE_BYTES},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        for (int dir = KVD_XFER_READ; dir <= KVD_XFER_WRITE; dir++) {
            /* the bad transfer after a good one: the good one must not move */
            kvd_xfer_t batch[2] = {good, bad[i]};
            int rc = kvd_transport_post(f->t, (kvd_xfer_dir_t)dir, batch, 2, 100 + i);
            if (rc != KVD_ERR_INVALID)
                print_error("bad transfer %zu (dir %d) accepted: %d\n", i, dir, rc);
            assert_int_equal(rc, KVD_ERR_INVALID);
            rc = kvd_transport_post(f->t, (kvd_xfer_dir_t)dir, &bad[i], 1, 200 + i);
            assert_int_equal(rc, KVD_ERR_INVALID);
        }
    }
    assert_memory_equal(f->local, local_before, LOCAL_BYTES);
    assert_memory_equal(f->remote, remote_before, REMOTE_BYTES);

    /* a refused batch never completes */
    kvd_xfer_done_t done[4];
    size_t n = 99;
    assert_int_equal(kvd_transport_poll(f->t, done, 4, &n), KVD_OK);
    assert_int_equal(n, 0);
    free(local_before);
    free(remote_before);
}

static void test_poll_without_completions(void **state)
{
    fixture_t *f = *state;
    kvd_xfer_done_t done[8];
    size_t n = 99;
    assert_int_equal(kvd_transport_poll(f->t, done, 8, &n), KVD_OK);
    assert_int_equal(n, 0);
    n = 99;
    assert_int_equal(kvd_transport_poll(f->t, done, 0, &n), KVD_OK);
    assert_int_equal(n, 0);
}

static void test_many_posts_complete_in_order_once(void **state)
{
    fixture_t *f = *state;
    enum { POSTS = 100 };
    /* each post writes its own 64-byte slot */
    for (uint64_t i = 0; i < POSTS; i++) {
        kvd_xfer_t x = {
            .local_offset = i * 64, .remote_offset = 8192 + i * 64, .length = 64};
        assert_int_equal(kvd_transport_post(f->t, KVD_XFER_WRITE, &x, 1, 1000 + i),
                         KVD_OK);
    }
    kvd_xfer_done_t done[POSTS + 5];
    size_t n = 0;
    assert_int_equal(kvd_transport_poll(f->t, done, POSTS + 5, &n), KVD_OK);
    assert_int_equal(n, POSTS);
    for (uint64_t i = 0; i < POSTS; i++) {
        assert_true(done[i].cookie == 1000 + i);
        assert_int_equal(done[i].status, KVD_OK);
    }
    assert_int_equal(kvd_transport_poll(f->t, done, POSTS, &n), KVD_OK);
    assert_int_equal(n, 0);
    assert_memory_equal(f->remote + 8192, f->local, POSTS * 64);
}

static void test_partial_polls_interleaved_with_posts(void **state)
{
    fixture_t *f = *state;
    /* polls taking a few at a time while more are posted, so the ring wraps
     * and then grows with its contents wrapped */
    kvd_xfer_t x = {.local_offset = 0, .remote_offset = 0, .length = 8};
    uint64_t next_post = 0, next_done = 0;
    kvd_xfer_done_t done[7];
    for (int round = 0; round < 60; round++) {
        int posts = 1 + round % 5;
        for (int k = 0; k < posts; k++)
            assert_int_equal(kvd_transport_post(f->t, KVD_XFER_READ, &x, 1, next_post++),
                             KVD_OK);
        size_t n = 0;
        size_t max = 1 + (size_t)round % 4;
        assert_int_equal(kvd_transport_poll(f->t, done, max, &n), KVD_OK);
        assert_true(n == (max < next_post - next_done ? max : next_post - next_done));
        for (size_t i = 0; i < n; i++)
            assert_true(done[i].cookie == next_done++);
    }
    while (next_done < next_post) {
        size_t n = 0;
        assert_int_equal(kvd_transport_poll(f->t, done, 7, &n), KVD_OK);
        assert_true(n > 0);
        for (size_t i = 0; i < n; i++)
            assert_true(done[i].cookie == next_done++);
    }
    size_t n = 99;
    assert_int_equal(kvd_transport_poll(f->t, done, 7, &n), KVD_OK);
    assert_int_equal(n, 0);
}

static void test_open_rejects_missing_regions(void **state)
{
    (void)state;
    uint8_t buf[16];
    kvd_region_t ok = {.base = buf, .length = sizeof(buf)};
    kvd_region_t null_base = {.base = NULL, .length = 16};
    kvd_transport_t *t = (kvd_transport_t *)(uintptr_t)0x1234;
    assert_int_equal(kvd_transport_open_shm(NULL, &ok, &t), KVD_ERR_INVALID);
    assert_int_equal(kvd_transport_open_shm(&ok, NULL, &t), KVD_ERR_INVALID);
    assert_int_equal(kvd_transport_open_shm(&null_base, &ok, &t), KVD_ERR_INVALID);
    assert_int_equal(kvd_transport_open_shm(&ok, &null_base, &t), KVD_ERR_INVALID);
    assert_ptr_equal(t, (kvd_transport_t *)(uintptr_t)0x1234);
    kvd_transport_destroy(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_name_is_shm, setup, teardown),
        cmocka_unit_test_setup_teardown(test_write_batch_moves_exact_bytes, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_read_batch_moves_exact_bytes, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_out_of_region_refused_nothing_copied, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_poll_without_completions, setup, teardown),
        cmocka_unit_test_setup_teardown(test_many_posts_complete_in_order_once, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_partial_polls_interleaved_with_posts, setup,
                                        teardown),
        cmocka_unit_test(test_open_rejects_missing_regions),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
