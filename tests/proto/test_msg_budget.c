/*
 * Description: decoding bounds the memory protobuf-c may take for one
 * payload (KVD_DECODE_BUDGET_PER_BYTE * len + KVD_DECODE_BUDGET_EXTRA_BYTES,
 * charged to KVD_MEM_CONN). Payloads that make protobuf-c allocate far more
 * than that (a Stats reply of 100k empty MethodStats, a Hello of 200k empty
 * NamespaceSpecs) are refused with KVD_ERR_PROTOCOL, with or without item
 * limits, and leave KVD_MEM_CONN where it was. Ordinary messages, also large
 * ones, still decode, and clearing them balances the accounting.
 *
 * Hand-made payloads are written in protobuf wire format from kvdock.proto
 * (tag = field << 3 | wire type).
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

/* ------------------------------------------------------------ helpers */

/*
 * An Envelope {id, method, reply, body field `body_field` = a message made
 * of `count` empty submessages in its field `item_field`}: two bytes on the
 * wire per item, one struct (and more) for protobuf-c. Returns the payload
 * in a new block.
 */
static uint8_t *many_empty_items(uint64_t id, kvd_method_t method, bool reply,
                                 unsigned body_field, unsigned item_field, size_t count,
                                 size_t *len)
{
    size_t body_len = 2 * count;
    uint8_t *p = malloc(body_len + 32);
    assert_non_null(p);
    size_t n = 0;
    p[n++] = 0x08; /* id = 1 */
    n += put_varint(p + n, id);
    p[n++] = 0x10; /* method = 2 */
    p[n++] = (uint8_t)method;
    if (reply) {
        p[n++] = 0x18; /* reply = 3 */
        p[n++] = 0x01;
    }
    n += put_varint(p + n, (uint64_t)body_field << 3 | 2);
    n += put_varint(p + n, body_len);
    for (size_t i = 0; i < count; i++) {
        p[n++] = (uint8_t)(item_field << 3 | 2);
        p[n++] = 0x00;
    }
    *len = n;
    return p;
}

/* The payload is refused as malformed, with and without item limits, and
 * KVD_MEM_CONN is back where it was each time. */
static void assert_over_budget(const uint8_t *payload, size_t len)
{
    const kvd_msg_limits_t lim = {.max_items = SIZE_MAX, .max_pools = SIZE_MAX};
    uint64_t before = kvd_mem_bytes(KVD_MEM_CONN);
    kvd_msg_t out;
    assert_int_equal(kvd_msg_decode(payload, len, &out), KVD_ERR_PROTOCOL);
    assert_null(out.arena);
    assert_true(kvd_mem_bytes(KVD_MEM_CONN) == before);
    kvd_msg_clear(&out);
    assert_int_equal(kvd_msg_decode_limited(payload, len, &lim, &out), KVD_ERR_PROTOCOL);
    assert_true(kvd_mem_bytes(KVD_MEM_CONN) == before);
    kvd_msg_clear(&out);
}

/* Decodes payload (OK), checks the arena is what KVD_MEM_CONN grew by
 * (protobuf-c's blocks are all freed), clears and checks the balance. */
static void assert_decodes_balanced(const uint8_t *payload, size_t len, kvd_msg_t *out)
{
    uint64_t before = kvd_mem_bytes(KVD_MEM_CONN);
    assert_int_equal(kvd_msg_decode(payload, len, out), KVD_OK);
    assert_true(kvd_mem_bytes(KVD_MEM_CONN) >= before);
    kvd_msg_clear(out);
    assert_true(kvd_mem_bytes(KVD_MEM_CONN) == before);
}

/* -------------------------------------------------------------- tests */

static void test_stats_reply_of_empty_method_stats(void **state)
{
    (void)state;
    /* StatsReply (Envelope field 15) with 100k MethodStats (its field 10) */
    size_t len;
    uint8_t *p = many_empty_items(7, KVD_METHOD_STATS, true, 15, 10, 100000, &len);
    assert_over_budget(p, len);
    free(p);
}

static void test_hello_of_empty_namespace_specs(void **state)
{
    (void)state;
    /* HelloRequest (Envelope field 10) with 200k NamespaceSpec (field 4) */
    size_t len;
    uint8_t *p = many_empty_items(8, KVD_METHOD_HELLO, false, 10, 4, 200000, &len);
    assert_over_budget(p, len);
    free(p);

    /* the same shape, small, is an ordinary Hello */
    p = many_empty_items(8, KVD_METHOD_HELLO, false, 10, 4, 16, &len);
    kvd_msg_t out;
    uint64_t before = kvd_mem_bytes(KVD_MEM_CONN);
    assert_int_equal(kvd_msg_decode(p, len, &out), KVD_OK);
    assert_int_equal(out.body.hello_req.n_namespaces, 16);
    kvd_msg_clear(&out);
    assert_true(kvd_mem_bytes(KVD_MEM_CONN) == before);
    free(p);
}

static void test_large_ordinary_messages_decode(void **state)
{
    (void)state;
    kvd_msg_t *m = calloc(1, sizeof(*m)), *out = calloc(1, sizeof(*out));
    assert_non_null(m);
    assert_non_null(out);
    size_t len;
    uint8_t *p;

    /* a Hello of 4096 namespaces named as deployments name them (protobuf-c
     * needs about 5 bytes per payload byte for it; names of a few
     * characters need more than the budget's 8 at this count) */
    enum { N_NS = 4096 };
    kvd_ns_spec_t *specs = calloc(N_NS, sizeof(*specs));
    assert_non_null(specs);
    for (size_t i = 0; i < N_NS; i++) {
        snprintf(specs[i].name, sizeof(specs[i].name), "llama-3-8b/tp2/pp1/rank%zu", i);
        specs[i].object_bytes = 4096;
    }
    kvd_msg_request(m, 1, KVD_METHOD_HELLO);
    m->body.hello_req.namespaces = specs;
    m->body.hello_req.n_namespaces = N_NS;
    p = pack_payload(m, &len);
    assert_decodes_balanced(p, len, out);
    free(p);
    free(specs);

    /* a Reserve of 32768 keys with parents and depths */
    enum { N_KEYS = 32768 };
    kvd_put_item_t *items = calloc(N_KEYS, sizeof(*items));
    assert_non_null(items);
    for (size_t i = 0; i < N_KEYS; i++) {
        memcpy(items[i].key, &i, sizeof(i));
        items[i].has_parent = true;
        items[i].depth = (uint32_t)i;
    }
    kvd_msg_request(m, 2, KVD_METHOD_RESERVE);
    m->body.reserve_req.items = items;
    m->body.reserve_req.n = N_KEYS;
    p = pack_payload(m, &len);
    uint64_t before = kvd_mem_bytes(KVD_MEM_CONN);
    assert_int_equal(kvd_msg_decode(p, len, out), KVD_OK);
    assert_int_equal(out->body.reserve_req.n, N_KEYS);
    assert_int_equal(out->body.reserve_req.items[N_KEYS - 1].depth, N_KEYS - 1);
    kvd_msg_clear(out);
    assert_true(kvd_mem_bytes(KVD_MEM_CONN) == before);
    free(p);
    free(items);

    /* an Inspect reply of 10000 objects */
    enum { N_OBJ = 10000 };
    kvd_obj_msg_t *objs = calloc(N_OBJ, sizeof(*objs));
    assert_non_null(objs);
    for (size_t i = 0; i < N_OBJ; i++) {
        objs[i].ns = 1;
        memcpy(objs[i].key, &i, sizeof(i));
        objs[i].parent_len = KVD_KEY_BYTES;
        objs[i].depth = (uint32_t)i;
        objs[i].state = 2;
    }
    kvd_msg_request(m, 3, KVD_METHOD_INSPECT);
    m->reply = true;
    m->body.inspect_rep.objects = objs;
    m->body.inspect_rep.n_objects = N_OBJ;
    p = pack_payload(m, &len);
    assert_decodes_balanced(p, len, out);
    free(p);
    free(objs);

    /* a full Stats reply */
    kvd_msg_request(m, 4, KVD_METHOD_STATS);
    m->reply = true;
    strcpy(m->body.stats_rep.daemon_version, "0.1.0");
    for (size_t i = 1; i < KVD_METHOD_COUNT; i++)
        for (size_t k = 0; k < KVD_LATENCY_BUCKETS; k++)
            m->body.stats_rep.methods[i].latency_buckets[k] = 1000 * i + k;
    p = pack_payload(m, &len);
    assert_int_equal(kvd_msg_decode(p, len, out), KVD_OK);
    assert_true(out->body.stats_rep.methods[KVD_METHOD_EVICT].latency_buckets[3] ==
                1000 * KVD_METHOD_EVICT + 3);
    kvd_msg_clear(out);
    free(p);

    free(m);
    free(out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stats_reply_of_empty_method_stats),
        cmocka_unit_test(test_hello_of_empty_namespace_specs),
        cmocka_unit_test(test_large_ordinary_messages_decode),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
