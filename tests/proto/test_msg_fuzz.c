/*
 * Description: kvd_msg_decode() on hostile payloads never crashes, never
 * reads out of bounds and never hits undefined behaviour (run it under
 * ASan+UBSan), answers only documented statuses, and what it accepts is
 * well formed. Inputs: random bytes, a valid Stats reply with bytes
 * overwritten at random, and a Stats reply whose MethodStats carries no
 * latency buckets (a repeated field may legitimately be empty on the wire).
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "kvd_proto.h"
#include "msg_util.h"

static void fill_stats(kvd_stats_rep_t *s)
{
    uint64_t v = 1000;
    strcpy(s->daemon_version, "0.1.0-rc1");
    strcpy(s->instance, "fuzz");
    s->state = KVD_HEALTH_READY;
    s->uptime_ms = v++;
    s->memory.pool_bytes = v++;
    s->memory.rss_bytes = v++;
    s->memory.conn_bytes = v++;
    s->memory.index_bytes = v++;
    s->memory.staging_bytes = v++;
    s->memory.other_bytes = v++;
    s->memory.hugepages = true;
    s->connections_total = v++;
    for (size_t i = 1; i < KVD_METHOD_COUNT; i++) {
        s->methods[i].calls = v++;
        s->methods[i].errors = v++;
        s->methods[i].latency_us_sum = v++;
        for (size_t k = 0; k < KVD_LATENCY_BUCKETS; k++)
            s->methods[i].latency_buckets[k] = v++;
    }
}

static void test_method_stats_without_buckets(void **state)
{
    (void)state;
    /* Envelope { id 1, method STATS, reply, stats_reply (field 15) {
     *   methods (field 10) { method HELLO (08 01), calls 5 (10 05) } } } */
    const uint8_t bytes[] = {0x08, 0x01, 0x10, 0x03, 0x18, 0x01, 0x7a,
                             0x06, 0x52, 0x04, 0x08, 0x01, 0x10, 0x05};
    kvd_msg_t out;
    assert_int_equal(decode_bytes(bytes, sizeof(bytes), &out), KVD_OK);
    assert_int_equal(out.method, KVD_METHOD_STATS);
    assert_true(out.reply);
    const kvd_method_stats_t *h = &out.body.stats_rep.methods[KVD_METHOD_HELLO];
    assert_true(h->calls == 5);
    assert_true(h->errors == 0);
    for (size_t k = 0; k < KVD_LATENCY_BUCKETS; k++)
        assert_true(h->latency_buckets[k] == 0);
}

static void test_random_bytes_never_crash(void **state)
{
    (void)state;
    /* Fully random payloads may happen to be valid protobuf; what must hold
     * is that decoding never crashes or reads out of bounds (ASan), answers
     * only documented statuses, and whatever it accepts is well formed. */
    kvd_msg_t out;
    uint32_t x = 99;
    uint8_t junk[256];
    for (int round = 0; round < 5000; round++) {
        size_t len = 1 + (size_t)round % sizeof(junk);
        for (size_t i = 0; i < len; i++) {
            x = x * 1103515245u + 12345u;
            junk[i] = (uint8_t)(x >> 16);
        }
        int rc = decode_bytes(junk, len, &out);
        assert_true(rc == KVD_OK || rc == KVD_ERR_PROTOCOL ||
                    rc == KVD_ERR_UNKNOWN_METHOD);
        if (rc == KVD_OK) {
            assert_true(out.method > KVD_METHOD_NONE && out.method < KVD_METHOD_COUNT);
            assert_true(out.status <= 0);
            assert_true(memchr(out.error, '\0', sizeof(out.error)) != NULL);
        }
        kvd_msg_clear(&out); /* the caller's, after any result (kvd_proto.h) */
    }
}

static void test_mutated_valid_payload_never_crash(void **state)
{
    (void)state;
    kvd_msg_t *m = calloc(1, sizeof(*m)), *out = calloc(1, sizeof(*out));
    assert_non_null(m);
    assert_non_null(out);
    kvd_msg_request(m, 5, KVD_METHOD_STATS);
    m->reply = true;
    fill_stats(&m->body.stats_rep);
    size_t len;
    uint8_t *payload = pack_payload(m, &len);
    uint8_t *mut = malloc(len);
    assert_non_null(mut);
    uint32_t x = 7;
    for (int round = 0; round < 3000; round++) {
        memcpy(mut, payload, len);
        for (int k = 0; k < 1 + round % 4; k++) {
            x = x * 1103515245u + 12345u;
            size_t pos = (x >> 8) % len;
            x = x * 1103515245u + 12345u;
            mut[pos] = (uint8_t)(x >> 16);
        }
        int rc = decode_bytes(mut, len, out);
        assert_true(rc == KVD_OK || rc == KVD_ERR_PROTOCOL ||
                    rc == KVD_ERR_UNKNOWN_METHOD);
        if (rc == KVD_OK) {
            assert_true(memchr(out->error, '\0', sizeof(out->error)) != NULL);
            if (out->method == KVD_METHOD_STATS && out->reply && out->status == 0) {
                const kvd_stats_rep_t *s = &out->body.stats_rep;
                assert_true(memchr(s->daemon_version, '\0', KVD_VERSION_MAX) != NULL);
                assert_true(memchr(s->instance, '\0', KVD_NAME_MAX) != NULL);
            }
        }
        kvd_msg_clear(out); /* the caller's, after any result (kvd_proto.h) */
    }
    free(mut);
    free(payload);
    free(m);
    free(out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_method_stats_without_buckets),
        cmocka_unit_test(test_random_bytes_never_crash),
        cmocka_unit_test(test_mutated_valid_payload_never_crash),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
