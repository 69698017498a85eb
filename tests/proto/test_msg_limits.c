/*
 * Description: kvd_msg_decode_limited() refuses a request whose batch is
 * over max_items (namespaces of Hello and RegisterNamespace, keys of each
 * Lookup pool, of Reserve, Publish, Revoke and Acquire, Reserve's depths) or
 * a Lookup with more than max_pools pools, with KVD_ERR_TOO_LARGE, the
 * request's id and method set and nothing of the message's arena allocated;
 * the same request at exactly the limit decodes. kvd_msg_decode() and NULL
 * limits do not limit; replies are never limited.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvd_proto.h"
#include "msg_util.h"

#define MAX_ITEMS 8
#define MAX_POOLS 3

static const kvd_msg_limits_t limits = {.max_items = MAX_ITEMS, .max_pools = MAX_POOLS};

/* ------------------------------------------------------------ helpers */

/* m is over the limits: refused with TOO_LARGE, named, nothing allocated,
 * nothing of KVD_MEM_CONN left; without limits it decodes. */
static void assert_refused(const kvd_msg_t *m)
{
    size_t len;
    uint8_t *payload = pack_payload(m, &len);
    uint64_t conn_before = kvd_mem_bytes(KVD_MEM_CONN);
    kvd_msg_t out;
    memset(&out, 0xa5, sizeof(out));
    assert_int_equal(decode_with(payload, len, &limits, &out), KVD_ERR_TOO_LARGE);
    assert_true(out.id == m->id);
    assert_int_equal(out.method, m->method);
    assert_false(out.reply);
    assert_int_equal(out.status, KVD_OK);
    assert_null(out.arena);
    assert_true(kvd_mem_bytes(KVD_MEM_CONN) == conn_before);
    kvd_msg_clear(&out);

    assert_int_equal(decode_with(payload, len, NULL, &out), KVD_OK);
    kvd_msg_clear(&out);
    assert_int_equal(kvd_msg_decode(payload, len, &out), KVD_OK);
    kvd_msg_clear(&out);
    free(payload);
}

/* m is within the limits: decodes into out (the caller clears it). */
static void decode_accepted(const kvd_msg_t *m, kvd_msg_t *out)
{
    size_t len;
    uint8_t *payload = pack_payload(m, &len);
    assert_int_equal(decode_with(payload, len, &limits, out), KVD_OK);
    assert_true(out->id == m->id);
    assert_int_equal(out->method, m->method);
    free(payload);
}

static void fill_specs(kvd_ns_spec_t *specs, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        snprintf(specs[i].name, sizeof(specs[i].name), "model-%zu/tp2/rank0", i);
        specs[i].object_bytes = 65536;
    }
}

static void fill_keys(kvd_key_t *keys, size_t n, uint8_t seed)
{
    for (size_t i = 0; i < n; i++)
        memset(keys[i], (int)(seed + i), KVD_KEY_BYTES);
}

/* -------------------------------------------------------------- tests */

static void test_hello_namespaces(void **state)
{
    (void)state;
    kvd_ns_spec_t specs[MAX_ITEMS + 1] = {0};
    fill_specs(specs, MAX_ITEMS + 1);
    kvd_msg_t m, out;
    kvd_msg_request(&m, 41, KVD_METHOD_HELLO);
    strcpy(m.body.hello_req.client_name, "limits");
    m.body.hello_req.protocol_version = KVD_PROTOCOL_VERSION;
    m.body.hello_req.namespaces = specs;
    m.body.hello_req.n_namespaces = MAX_ITEMS;
    decode_accepted(&m, &out);
    assert_int_equal(out.body.hello_req.n_namespaces, MAX_ITEMS);
    assert_string_equal(out.body.hello_req.namespaces[MAX_ITEMS - 1].name,
                        specs[MAX_ITEMS - 1].name);
    kvd_msg_clear(&out);

    m.body.hello_req.n_namespaces = MAX_ITEMS + 1;
    assert_refused(&m);
}

/* Issue 11: a Hello of 2,048 namespaces with two-character names, within
 * a max_items of 4,096, ran out of the decoding budget and was refused as
 * malformed. Every count up to the limit decodes, with the shortest valid
 * names (one character, objects of 1 byte); one more is TOO_LARGE, not
 * malformed. */
static void test_hello_many_short_names(void **state)
{
    (void)state;
    const size_t limit = 4096;
    const kvd_msg_limits_t lim = {.max_items = limit, .max_pools = MAX_POOLS};
    kvd_ns_spec_t *specs = calloc(limit + 1, sizeof(*specs));
    assert_non_null(specs);
    for (size_t i = 0; i <= limit; i++) {
        /* two characters of 64 each: 4,096 unique names */
        specs[i].name[0] = (char)('0' + i % 64);
        specs[i].name[1] = (char)('0' + (i / 64) % 64);
        specs[i].object_bytes = 4096;
    }
    specs[limit].name[2] = '!'; /* the 4,097th is unique too */
    const size_t counts[] = {2048, limit};
    for (int shortest = 0; shortest < 2; shortest++) {
        for (size_t c = 0; c < KVD_ARRAY_SIZE(counts); c++) {
            size_t n = counts[c];
            kvd_ns_spec_t *sp = specs;
            kvd_ns_spec_t *one = NULL;
            if (shortest) { /* one-character names, 1-byte objects: 7 bytes */
                one = calloc(n, sizeof(*one));
                assert_non_null(one);
                for (size_t i = 0; i < n; i++) {
                    one[i].name[0] = 'a';
                    one[i].object_bytes = 1;
                }
                sp = one;
            }
            kvd_msg_t m, out;
            kvd_msg_request(&m, 43, KVD_METHOD_HELLO);
            m.body.hello_req.protocol_version = KVD_PROTOCOL_VERSION;
            m.body.hello_req.namespaces = sp;
            m.body.hello_req.n_namespaces = n;
            size_t len;
            uint8_t *payload = pack_payload(&m, &len);
            uint64_t conn_before = kvd_mem_bytes(KVD_MEM_CONN);
            assert_int_equal(decode_with(payload, len, &lim, &out), KVD_OK);
            assert_int_equal(out.body.hello_req.n_namespaces, n);
            assert_string_equal(out.body.hello_req.namespaces[n - 1].name,
                                sp[n - 1].name);
            kvd_msg_clear(&out);
            assert_true(kvd_mem_bytes(KVD_MEM_CONN) == conn_before);
            free(payload);
            free(one);
        }
    }
    kvd_msg_t m, out;
    kvd_msg_request(&m, 44, KVD_METHOD_HELLO);
    m.body.hello_req.protocol_version = KVD_PROTOCOL_VERSION;
    m.body.hello_req.namespaces = specs;
    m.body.hello_req.n_namespaces = limit + 1;
    size_t len;
    uint8_t *payload = pack_payload(&m, &len);
    assert_int_equal(decode_with(payload, len, &lim, &out), KVD_ERR_TOO_LARGE);
    assert_true(out.id == 44);
    kvd_msg_clear(&out);
    free(payload);
    free(specs);
}

static void test_register_namespaces(void **state)
{
    (void)state;
    kvd_ns_spec_t specs[MAX_ITEMS + 1] = {0};
    fill_specs(specs, MAX_ITEMS + 1);
    kvd_msg_t m, out;
    kvd_msg_request(&m, 42, KVD_METHOD_REGISTER_NAMESPACE);
    m.body.register_req.namespaces = specs;
    m.body.register_req.n = MAX_ITEMS;
    decode_accepted(&m, &out);
    assert_int_equal(out.body.register_req.n, MAX_ITEMS);
    kvd_msg_clear(&out);

    m.body.register_req.n = MAX_ITEMS + 1;
    assert_refused(&m);
}

static void test_lookup_pools_and_keys(void **state)
{
    (void)state;
    kvd_key_t keys[MAX_ITEMS + 1];
    fill_keys(keys, MAX_ITEMS + 1, 1);
    kvd_lookup_pool_msg_t pools[MAX_POOLS + 1];
    for (size_t p = 0; p < MAX_POOLS + 1; p++)
        pools[p] = (kvd_lookup_pool_msg_t){.ns = (uint32_t)p, .keys = keys, .n_keys = 2};
    kvd_msg_t m, out;
    kvd_msg_request(&m, 43, KVD_METHOD_LOOKUP);
    m.body.lookup_req.pools = pools;

    /* pools: the limit decodes, one more is refused */
    m.body.lookup_req.n_pools = MAX_POOLS;
    decode_accepted(&m, &out);
    assert_int_equal(out.body.lookup_req.n_pools, MAX_POOLS);
    kvd_msg_clear(&out);
    m.body.lookup_req.n_pools = MAX_POOLS + 1;
    assert_refused(&m);

    /* keys of a pool that is not the first */
    m.body.lookup_req.n_pools = 2;
    pools[1].n_keys = MAX_ITEMS;
    decode_accepted(&m, &out);
    assert_int_equal(out.body.lookup_req.pools[1].n_keys, MAX_ITEMS);
    assert_memory_equal(out.body.lookup_req.pools[1].keys, keys,
                        MAX_ITEMS * KVD_KEY_BYTES);
    kvd_msg_clear(&out);
    pools[1].n_keys = MAX_ITEMS + 1;
    assert_refused(&m);
}

static void test_reserve_keys(void **state)
{
    (void)state;
    kvd_put_item_t items[MAX_ITEMS + 1] = {0};
    for (size_t i = 0; i < MAX_ITEMS + 1; i++) {
        memset(items[i].key, (int)i + 1, KVD_KEY_BYTES);
        items[i].has_parent = i > 0;
        if (i > 0)
            memcpy(items[i].parent, items[i - 1].key, KVD_KEY_BYTES);
        items[i].depth = (uint32_t)i;
    }
    kvd_msg_t m, out;
    kvd_msg_request(&m, 44, KVD_METHOD_RESERVE);
    m.body.reserve_req.ns = 1;
    m.body.reserve_req.items = items;
    m.body.reserve_req.n = MAX_ITEMS;
    decode_accepted(&m, &out);
    assert_int_equal(out.body.reserve_req.n, MAX_ITEMS);
    assert_int_equal(out.body.reserve_req.items[MAX_ITEMS - 1].depth, MAX_ITEMS - 1);
    kvd_msg_clear(&out);

    m.body.reserve_req.n = MAX_ITEMS + 1;
    assert_refused(&m);
}

static void test_reserve_depths(void **state)
{
    (void)state;
    /* Hand-made: a Reserve of MAX_ITEMS keys but MAX_ITEMS + 1 packed
     * depths. Over the limit is TOO_LARGE (not the count mismatch's
     * PROTOCOL): nothing is sized from the bigger count. */
    uint8_t body[512], env[600];
    size_t n = 0;
    body[n++] = 0x1a; /* keys = 3, length-delimited */
    n += put_varint(body + n, MAX_ITEMS * KVD_KEY_BYTES);
    memset(body + n, 0x33, MAX_ITEMS * KVD_KEY_BYTES);
    n += MAX_ITEMS * KVD_KEY_BYTES;
    body[n++] = 0x32; /* depths = 6, packed */
    n += put_varint(body + n, MAX_ITEMS + 1);
    for (size_t i = 0; i < MAX_ITEMS + 1; i++)
        body[n++] = (uint8_t)i;
    size_t e = 0;
    env[e++] = 0x08; /* id = 1 */
    env[e++] = 45;
    env[e++] = 0x10; /* method = 2 */
    env[e++] = KVD_METHOD_RESERVE;
    env[e++] = 0xa2; /* reserve_request = 20, length-delimited */
    env[e++] = 0x01;
    e += put_varint(env + e, n);
    memcpy(env + e, body, n);
    e += n;

    kvd_msg_t out;
    assert_int_equal(decode_with(env, e, &limits, &out), KVD_ERR_TOO_LARGE);
    assert_true(out.id == 45);
    assert_int_equal(out.method, KVD_METHOD_RESERVE);
    assert_null(out.arena);
    kvd_msg_clear(&out);
    /* unlimited, the mismatch is what is wrong */
    assert_int_equal(decode_with(env, e, NULL, &out), KVD_ERR_PROTOCOL);
    kvd_msg_clear(&out);
}

static void test_finish_and_acquire_keys(void **state)
{
    (void)state;
    kvd_key_t keys[MAX_ITEMS + 1];
    fill_keys(keys, MAX_ITEMS + 1, 7);
    static const kvd_method_t finish[] = {KVD_METHOD_PUBLISH, KVD_METHOD_REVOKE};
    for (size_t k = 0; k < 2; k++) {
        kvd_msg_t m, out;
        kvd_msg_request(&m, 46 + k, finish[k]);
        m.body.finish_req.lease_id = 9;
        m.body.finish_req.keys = keys;
        m.body.finish_req.n = MAX_ITEMS;
        decode_accepted(&m, &out);
        assert_int_equal(out.body.finish_req.n, MAX_ITEMS);
        kvd_msg_clear(&out);
        m.body.finish_req.n = MAX_ITEMS + 1;
        assert_refused(&m);
    }

    kvd_msg_t m, out;
    kvd_msg_request(&m, 48, KVD_METHOD_ACQUIRE);
    m.body.acquire_req.ns = 2;
    m.body.acquire_req.keys = keys;
    m.body.acquire_req.n = MAX_ITEMS;
    m.body.acquire_req.wait_ms = 250;
    decode_accepted(&m, &out);
    assert_int_equal(out.body.acquire_req.n, MAX_ITEMS);
    assert_int_equal(out.body.acquire_req.wait_ms, 250);
    assert_memory_equal(out.body.acquire_req.keys, keys, MAX_ITEMS * KVD_KEY_BYTES);
    kvd_msg_clear(&out);
    m.body.acquire_req.n = MAX_ITEMS + 1;
    assert_refused(&m);
}

static void test_unlimited_fields_and_replies(void **state)
{
    (void)state;
    /* SIZE_MAX is no limit */
    kvd_key_t keys[MAX_ITEMS + 1];
    fill_keys(keys, MAX_ITEMS + 1, 3);
    kvd_msg_t m, out;
    kvd_msg_request(&m, 50, KVD_METHOD_ACQUIRE);
    m.body.acquire_req.keys = keys;
    m.body.acquire_req.n = MAX_ITEMS + 1;
    size_t len;
    uint8_t *payload = pack_payload(&m, &len);
    const kvd_msg_limits_t none = {.max_items = SIZE_MAX, .max_pools = SIZE_MAX};
    assert_int_equal(decode_with(payload, len, &none, &out), KVD_OK);
    assert_int_equal(out.body.acquire_req.n, MAX_ITEMS + 1);
    kvd_msg_clear(&out);
    free(payload);

    /* a reply with more items than max_items decodes */
    uint64_t offsets[MAX_ITEMS + 1];
    for (size_t i = 0; i < MAX_ITEMS + 1; i++)
        offsets[i] = i * 4096;
    kvd_msg_request(&m, 51, KVD_METHOD_ACQUIRE);
    m.reply = true;
    m.body.acquire_rep.offsets = offsets;
    m.body.acquire_rep.n = MAX_ITEMS + 1;
    payload = pack_payload(&m, &len);
    assert_int_equal(decode_with(payload, len, &limits, &out), KVD_OK);
    assert_int_equal(out.body.acquire_rep.n, MAX_ITEMS + 1);
    kvd_msg_clear(&out);
    free(payload);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hello_namespaces),
        cmocka_unit_test(test_hello_many_short_names),
        cmocka_unit_test(test_register_namespaces),
        cmocka_unit_test(test_lookup_pools_and_keys),
        cmocka_unit_test(test_reserve_keys),
        cmocka_unit_test(test_reserve_depths),
        cmocka_unit_test(test_finish_and_acquire_keys),
        cmocka_unit_test(test_unlimited_fields_and_replies),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
