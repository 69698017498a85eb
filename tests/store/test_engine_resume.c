/*
 * Description: the engine's resumable walks (kvd_store.h: kvd_store_foreach_from,
 * kvd_store_pos_check, kvd_store_evict_from) and its namespace name index.
 *   - Walking 300 objects of two namespaces one visit at a time, and in
 *     slices of 7, visits each object of the namespace asked for exactly
 *     once (all of them for UINT32_MAX) and ends at KVD_STORE_POS_END.
 *   - A callback that stops returns its value with the position of that
 *     object: walking again from there starts with the same object.
 *   - Objects freed between slices are not visited; the others still are,
 *     once (a stale position continues).
 *   - pos_check: the same position and salt give the same value; another
 *     position or salt gives another one.
 *   - evict_from in slices of 10 visits evicts every READY unpinned object
 *     of the namespace, keeps a pinned one and the other namespace's, and
 *     the invariant holds.
 *   - 4,096 namespaces register and are each found by name; a name never
 *     registered is not found.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine_util.h"
#include "kvd_store.h"

#define PAGE  4096u
#define N_OBJ 300u

static kvd_store_t *s;
static uint32_t ns_a, ns_b;
static unsigned seen[2 * N_OBJ];

/* Key n: n < N_OBJ in namespace a, N_OBJ.. in b. */
static void fill(void)
{
    kvd_store_config_t cfg;
    kvd_store_config_default(&cfg, 1024 * PAGE);
    assert_int_equal(kvd_store_create(&cfg, &s), KVD_OK);
    ns_a = reg(s, "t/a/tp0", PAGE);
    ns_b = reg(s, "t/b/tp0", PAGE);
    for (uint32_t half = 0; half < 2; half++) {
        key_t32 keys[N_OBJ];
        kvd_put_t items[N_OBJ];
        uint8_t res[N_OBJ];
        kvd_loc_t locs[N_OBJ];
        for (uint32_t i = 0; i < N_OBJ; i++) {
            mkkey(keys[i], half * N_OBJ + i);
            items[i] = (kvd_put_t){.key = keys[i]};
        }
        uint64_t lease = 0;
        assert_int_equal(kvd_store_reserve(s, 1, half ? ns_b : ns_a, items, N_OBJ, 0,
                                           &lease, res, locs),
                         KVD_OK);
        assert_int_equal(kvd_store_publish(s, 1, lease, NULL, 0), KVD_OK);
    }
}

static uint32_t key_index(const uint8_t *key)
{
    for (uint32_t n = 0; n < 2 * N_OBJ; n++) {
        key_t32 k;
        mkkey(k, n);
        if (memcmp(k, key, KVD_KEY_BYTES) == 0)
            return n;
    }
    fail_msg("a key that was never stored");
    return 0;
}

static int count(const kvd_obj_info_t *info, void *arg)
{
    (void)arg;
    seen[key_index(info->key)]++;
    return 0;
}

static void walk(uint32_t ns, uint64_t slice)
{
    memset(seen, 0, sizeof(seen));
    uint64_t pos = 0;
    for (int i = 0; i < 100000 && pos != KVD_STORE_POS_END; i++)
        assert_int_equal(kvd_store_foreach_from(s, ns, &pos, slice, count, NULL), 0);
    assert_true(pos == KVD_STORE_POS_END);
}

static void test_slices(void **state)
{
    (void)state;
    fill();
    for (uint64_t slice = 1; slice <= 7; slice += 6) {
        walk(UINT32_MAX, slice);
        for (uint32_t n = 0; n < 2 * N_OBJ; n++)
            assert_int_equal(seen[n], 1);
        walk(ns_b, slice);
        for (uint32_t n = 0; n < 2 * N_OBJ; n++)
            assert_int_equal(seen[n], n >= N_OBJ ? 1 : 0);
    }
    kvd_store_destroy(s);
}

typedef struct stopper {
    uint32_t at; /* stop at the object of this key index */
    uint32_t first;
    bool started;
} stopper_t;

static int stop_at(const kvd_obj_info_t *info, void *arg)
{
    stopper_t *st = arg;
    uint32_t k = key_index(info->key);
    if (!st->started) {
        st->first = k;
        st->started = true;
    }
    return k == st->at ? 42 : 0;
}

static void test_stop_and_resume(void **state)
{
    (void)state;
    fill();
    stopper_t st = {.at = 123};
    uint64_t pos = 0;
    assert_int_equal(
        kvd_store_foreach_from(s, UINT32_MAX, &pos, UINT64_MAX, stop_at, &st), 42);
    stopper_t again = {.at = UINT32_MAX};
    uint64_t p2 = pos;
    assert_int_equal(
        kvd_store_foreach_from(s, UINT32_MAX, &p2, UINT64_MAX, stop_at, &again), 0);
    assert_int_equal(again.first, 123);
    assert_true(p2 == KVD_STORE_POS_END);
    /* the check value */
    assert_true(kvd_store_pos_check(s, pos, 1) == kvd_store_pos_check(s, pos, 1));
    assert_true(kvd_store_pos_check(s, pos, 1) != kvd_store_pos_check(s, pos + 1, 1));
    assert_true(kvd_store_pos_check(s, pos, 1) != kvd_store_pos_check(s, pos, 2));
    kvd_store_destroy(s);
}

static void test_stale(void **state)
{
    (void)state;
    fill();
    memset(seen, 0, sizeof(seen));
    uint64_t pos = 0;
    assert_int_equal(kvd_store_foreach_from(s, UINT32_MAX, &pos, 50, count, NULL), 0);
    /* evict keys 100..199 (namespace a) between slices */
    for (uint32_t n = 100; n < 200; n++) {
        key_t32 k;
        mkkey(k, n);
        assert_int_equal(kvd_store_evict_key(s, ns_a, k), KVD_OK);
    }
    unsigned before[2 * N_OBJ];
    memcpy(before, seen, sizeof(seen));
    for (int i = 0; i < 100000 && pos != KVD_STORE_POS_END; i++)
        assert_int_equal(kvd_store_foreach_from(s, UINT32_MAX, &pos, 50, count, NULL), 0);
    for (uint32_t n = 0; n < 2 * N_OBJ; n++) {
        bool gone = n >= 100 && n < 200;
        assert_true(seen[n] <= 1);
        if (!gone)
            assert_int_equal(seen[n], 1);
        else
            assert_int_equal(seen[n], before[n]); /* not visited after it went */
    }
    check_ok(s);
    kvd_store_destroy(s);
}

static void test_evict_from(void **state)
{
    (void)state;
    fill();
    key_t32 pinned;
    mkkey(pinned, 7);
    uint64_t lease = 0;
    kvd_loc_t loc;
    size_t bad = 0;
    assert_int_equal(kvd_store_acquire(s, 2, ns_a,
                                       (const uint8_t(*)[KVD_KEY_BYTES])pinned, 1, 0,
                                       &lease, &loc, &bad),
                     KVD_OK);
    uint64_t pos = 0, total = 0;
    int calls = 0;
    for (; calls < 100000 && pos != KVD_STORE_POS_END; calls++) {
        uint64_t e = 0;
        assert_int_equal(kvd_store_evict_from(s, ns_a, &pos, 10, &e), KVD_OK);
        assert_true(e <= 10);
        total += e;
    }
    assert_true(calls > 1);
    assert_int_equal(total, N_OBJ - 1);
    kvd_ns_info_t a, b;
    assert_int_equal(kvd_store_ns_info(s, ns_a, &a), KVD_OK);
    assert_int_equal(kvd_store_ns_info(s, ns_b, &b), KVD_OK);
    assert_int_equal(a.objects_ready, 1);
    assert_int_equal(b.objects_ready, N_OBJ);
    check_ok(s);
    assert_int_equal(kvd_store_release(s, 2, lease), KVD_OK);
    kvd_store_destroy(s);
}

static void test_names(void **state)
{
    (void)state;
    kvd_store_config_t cfg;
    kvd_store_config_default(&cfg, 64 * PAGE);
    assert_int_equal(kvd_store_create(&cfg, &s), KVD_OK);
    char name[64];
    for (uint32_t i = 0; i < KVD_STORE_MAX_NAMESPACES; i++) {
        snprintf(name, sizeof(name), "m/pool%u/tp0", i);
        uint32_t id = UINT32_MAX;
        assert_int_equal(kvd_store_ns_register(s, name, PAGE, false, &id), KVD_OK);
        assert_int_equal(id, i);
    }
    for (uint32_t i = 0; i < KVD_STORE_MAX_NAMESPACES; i++) {
        snprintf(name, sizeof(name), "m/pool%u/tp0", i);
        uint32_t id = UINT32_MAX;
        assert_int_equal(kvd_store_ns_find(s, name, &id), KVD_OK);
        assert_int_equal(id, i);
    }
    uint32_t id;
    assert_int_equal(kvd_store_ns_find(s, "m/pool4096/tp0", &id), KVD_ERR_NOT_FOUND);
    assert_int_equal(kvd_store_ns_register(s, "m/pool4096/tp0", PAGE, false, &id),
                     KVD_ERR_NO_SPACE);
    kvd_store_destroy(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_slices), cmocka_unit_test(test_stop_and_resume),
        cmocka_unit_test(test_stale),  cmocka_unit_test(test_evict_from),
        cmocka_unit_test(test_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
