/*
 * Description: RPC messages of proto/: kvd_msg_pack then kvd_msg_decode
 * gives back every field of every method's request and reply and of an
 * error reply; malformed payloads (garbage, truncation, a body of the wrong
 * method, an unknown method, an over-long string) are refused with the
 * documented status; kvd_parse_host_port. Random and mutated payloads are
 * test_msg_fuzz.c.
 *
 * Hand-made payloads are written in protobuf wire format from kvdock.proto
 * (tag = field << 3 | wire type), not taken from the packer's output.
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

/* ------------------------------------------------------------ helpers */

/* Packs m, checks the frame header against the payload, decodes into out. */
static void round_trip(const kvd_msg_t *m, kvd_msg_t *out)
{
    kvd_buf_t b;
    kvd_buf_init(&b, KVD_MEM_OTHER);
    assert_int_equal(kvd_msg_pack(m, KVD_FRAME_DEFAULT_MAX, &b), KVD_OK);
    assert_true(b.len > KVD_FRAME_HEADER_BYTES);
    uint32_t hdr = (uint32_t)b.data[0] | (uint32_t)b.data[1] << 8 |
                   (uint32_t)b.data[2] << 16 | (uint32_t)b.data[3] << 24;
    assert_int_equal(hdr, b.len - KVD_FRAME_HEADER_BYTES);
    memset(out, 0xa5, sizeof(*out)); /* decode must set what it reports */
    assert_int_equal(kvd_msg_decode(b.data + 4, b.len - 4, out), KVD_OK);
    kvd_buf_free(&b);
}

static void assert_header(const kvd_msg_t *m, uint64_t id, kvd_method_t method,
                          bool reply, int32_t status)
{
    assert_true(m->id == id);
    assert_int_equal(m->method, method);
    assert_int_equal(m->reply, reply);
    assert_int_equal(m->status, status);
}

/* -------------------------------------------------------- round trips */

static void test_hello_request_round_trip(void **state)
{
    (void)state;
    kvd_msg_t m, out;
    kvd_msg_request(&m, 0x0123456789abcdefull, KVD_METHOD_HELLO);
    strcpy(m.body.hello_req.client_name, "sglang-worker-3");
    m.body.hello_req.pid = 4000000001u;
    m.body.hello_req.protocol_version = KVD_PROTOCOL_VERSION;
    m.body.hello_req.writer_token = 0xfedcba9876543210ull;
    m.body.hello_req.earlier_copies_over = true;
    round_trip(&m, &out);
    assert_header(&out, 0x0123456789abcdefull, KVD_METHOD_HELLO, false, KVD_OK);
    assert_string_equal(out.body.hello_req.client_name, "sglang-worker-3");
    assert_int_equal(out.body.hello_req.pid, 4000000001u);
    assert_int_equal(out.body.hello_req.protocol_version, KVD_PROTOCOL_VERSION);
    assert_true(out.body.hello_req.writer_token == 0xfedcba9876543210ull);
    assert_true(out.body.hello_req.earlier_copies_over);

    /* the longest name that fits the C field */
    kvd_msg_request(&m, 1, KVD_METHOD_HELLO);
    memset(m.body.hello_req.client_name, 'n', KVD_NAME_MAX - 1);
    round_trip(&m, &out);
    assert_int_equal(strlen(out.body.hello_req.client_name), KVD_NAME_MAX - 1);
    assert_memory_equal(out.body.hello_req.client_name, m.body.hello_req.client_name,
                        KVD_NAME_MAX);
}

static void test_hello_reply_round_trip(void **state)
{
    (void)state;
    kvd_msg_t m, out;
    kvd_msg_request(&m, 77, KVD_METHOD_HELLO);
    m.reply = true;
    kvd_hello_rep_t *h = &m.body.hello_rep;
    strcpy(h->daemon_version, "0.1.0");
    strcpy(h->instance, "gpu-node-7");
    h->protocol_version = 3;
    h->max_frame_bytes = 4194304;
    h->max_batch = 512;
    h->pool_bytes = 0x0000123456789000ull;
    h->connection_id = 0xfedcba9876543210ull;
    round_trip(&m, &out);
    assert_header(&out, 77, KVD_METHOD_HELLO, true, KVD_OK);
    const kvd_hello_rep_t *o = &out.body.hello_rep;
    assert_string_equal(o->daemon_version, "0.1.0");
    assert_string_equal(o->instance, "gpu-node-7");
    assert_int_equal(o->protocol_version, 3);
    assert_int_equal(o->max_frame_bytes, 4194304);
    assert_int_equal(o->max_batch, 512);
    assert_true(o->pool_bytes == 0x0000123456789000ull);
    assert_true(o->connection_id == 0xfedcba9876543210ull);
}

static void test_health_request_and_reply_round_trip(void **state)
{
    (void)state;
    kvd_msg_t m, out;
    kvd_msg_request(&m, 9, KVD_METHOD_HEALTH);
    round_trip(&m, &out);
    assert_header(&out, 9, KVD_METHOD_HEALTH, false, KVD_OK);

    kvd_msg_request(&m, 10, KVD_METHOD_HEALTH);
    m.reply = true;
    m.body.health_rep.state = KVD_HEALTH_STARTING;
    m.body.health_rep.pool_bytes = 8ull << 30;
    m.body.health_rep.populated_bytes = 3ull << 30;
    m.body.health_rep.uptime_ms = 123456789012ull;
    round_trip(&m, &out);
    assert_header(&out, 10, KVD_METHOD_HEALTH, true, KVD_OK);
    assert_int_equal(out.body.health_rep.state, KVD_HEALTH_STARTING);
    assert_true(out.body.health_rep.pool_bytes == 8ull << 30);
    assert_true(out.body.health_rep.populated_bytes == 3ull << 30);
    assert_true(out.body.health_rep.uptime_ms == 123456789012ull);

    /* a reply whose fields are all zero still carries its (empty) body */
    kvd_msg_request(&m, 11, KVD_METHOD_HEALTH);
    m.reply = true;
    round_trip(&m, &out);
    assert_header(&out, 11, KVD_METHOD_HEALTH, true, KVD_OK);
    assert_int_equal(out.body.health_rep.state, KVD_HEALTH_NONE);
    assert_true(out.body.health_rep.pool_bytes == 0);
    assert_true(out.body.health_rep.populated_bytes == 0);
    assert_true(out.body.health_rep.uptime_ms == 0);
}

static void fill_stats(kvd_stats_rep_t *s, bool hugepages, bool mlocked)
{
    uint64_t v = 1000;
    strcpy(s->daemon_version, "0.1.0-rc1");
    strcpy(s->instance, "instance-with-a-long-name");
    s->state = KVD_HEALTH_DRAINING;
    s->uptime_ms = v++;
    s->memory.pool_bytes = v++;
    s->memory.pool_populated_bytes = v++;
    s->memory.rss_bytes = v++;
    s->memory.rss_anon_bytes = v++;
    s->memory.rss_file_bytes = v++;
    s->memory.rss_shmem_bytes = v++;
    s->memory.conn_bytes = v++;
    s->memory.index_bytes = v++;
    s->memory.staging_bytes = v++;
    s->memory.other_bytes = v++;
    s->memory.hugepages = hugepages;
    s->memory.mlocked = mlocked;
    s->connections_current = v++;
    s->connections_total = v++;
    s->connections_rejected = v++;
    s->protocol_errors = (1ull << 63) + v++; /* a value needing 10 varint bytes */
    s->auth_failures = v++;
    /* methods[0] is METHOD_NONE: never counted, left zero */
    for (size_t i = 1; i < KVD_METHOD_COUNT; i++) {
        s->methods[i].calls = v++;
        s->methods[i].errors = v++;
        s->methods[i].latency_us_sum = v++;
        for (size_t k = 0; k < KVD_LATENCY_BUCKETS; k++)
            s->methods[i].latency_buckets[k] = v++;
    }
}

static void assert_stats_equal(const kvd_stats_rep_t *a, const kvd_stats_rep_t *b)
{
    assert_string_equal(a->daemon_version, b->daemon_version);
    assert_string_equal(a->instance, b->instance);
    assert_int_equal(a->state, b->state);
    assert_true(a->uptime_ms == b->uptime_ms);
    assert_true(a->memory.pool_bytes == b->memory.pool_bytes);
    assert_true(a->memory.pool_populated_bytes == b->memory.pool_populated_bytes);
    assert_true(a->memory.rss_bytes == b->memory.rss_bytes);
    assert_true(a->memory.rss_anon_bytes == b->memory.rss_anon_bytes);
    assert_true(a->memory.rss_file_bytes == b->memory.rss_file_bytes);
    assert_true(a->memory.rss_shmem_bytes == b->memory.rss_shmem_bytes);
    assert_true(a->memory.conn_bytes == b->memory.conn_bytes);
    assert_true(a->memory.index_bytes == b->memory.index_bytes);
    assert_true(a->memory.staging_bytes == b->memory.staging_bytes);
    assert_true(a->memory.other_bytes == b->memory.other_bytes);
    assert_int_equal(a->memory.hugepages, b->memory.hugepages);
    assert_int_equal(a->memory.mlocked, b->memory.mlocked);
    assert_true(a->connections_current == b->connections_current);
    assert_true(a->connections_total == b->connections_total);
    assert_true(a->connections_rejected == b->connections_rejected);
    assert_true(a->protocol_errors == b->protocol_errors);
    assert_true(a->auth_failures == b->auth_failures);
    for (size_t i = 0; i < KVD_METHOD_COUNT; i++) {
        const kvd_method_stats_t *x = &a->methods[i], *y = &b->methods[i];
        assert_true(x->calls == y->calls);
        assert_true(x->errors == y->errors);
        assert_true(x->latency_us_sum == y->latency_us_sum);
        for (size_t k = 0; k < KVD_LATENCY_BUCKETS; k++) {
            if (x->latency_buckets[k] != y->latency_buckets[k])
                print_error("method %zu bucket %zu differs\n", i, k);
            assert_true(x->latency_buckets[k] == y->latency_buckets[k]);
        }
    }
}

static void test_stats_request_and_reply_round_trip(void **state)
{
    (void)state;
    kvd_msg_t *m = calloc(1, sizeof(*m)), *out = calloc(1, sizeof(*out));
    assert_non_null(m);
    assert_non_null(out);

    kvd_msg_request(m, 20, KVD_METHOD_STATS);
    round_trip(m, out);
    assert_header(out, 20, KVD_METHOD_STATS, false, KVD_OK);

    for (int flags = 0; flags < 4; flags++) {
        kvd_msg_request(m, 21 + (uint64_t)flags, KVD_METHOD_STATS);
        m->reply = true;
        fill_stats(&m->body.stats_rep, flags & 1, flags & 2);
        round_trip(m, out);
        assert_header(out, 21 + (uint64_t)flags, KVD_METHOD_STATS, true, KVD_OK);
        assert_stats_equal(&out->body.stats_rep, &m->body.stats_rep);
    }
    free(m);
    free(out);
}

static void test_error_reply_round_trip(void **state)
{
    (void)state;
    kvd_msg_t m, out;
    kvd_msg_error(&m, 42, KVD_METHOD_STATS, KVD_ERR_NO_SPACE, "pool full: %d of %s", 7,
                  "8 GiB");
    round_trip(&m, &out);
    assert_header(&out, 42, KVD_METHOD_STATS, true, KVD_ERR_NO_SPACE);
    assert_string_equal(out.error, "pool full: 7 of 8 GiB");

    /* the most negative status of the enum, on a hello reply */
    kvd_msg_error(&m, 43, KVD_METHOD_HELLO, KVD_ERR_DRAINING, "shutting down");
    round_trip(&m, &out);
    assert_header(&out, 43, KVD_METHOD_HELLO, true, KVD_ERR_DRAINING);
    assert_string_equal(out.error, "shutting down");
}

/* Found by fuzz/fuzz_linker.c in CI: a daemon's error code that is no
 * kvd_status_t (-47) went through the linker to the engine as a stray int.
 * Decoded, it is a protocol error; the text stays. */
static void test_unknown_error_code_is_protocol_error(void **state)
{
    (void)state;
    kvd_msg_t m, out;
    kvd_msg_error(&m, 44, KVD_METHOD_REGISTER_NAMESPACE, -47, "from a stranger");
    round_trip(&m, &out);
    assert_header(&out, 44, KVD_METHOD_REGISTER_NAMESPACE, true, KVD_ERR_PROTOCOL);
    assert_string_equal(out.error, "from a stranger");
    kvd_msg_error(&m, 45, KVD_METHOD_NONE, -1000, "unattributed");
    round_trip(&m, &out);
    assert_int_equal(out.status, KVD_ERR_PROTOCOL);
}

/* ---------------------------------------------------- refused input */

static void test_garbage_is_protocol_error(void **state)
{
    (void)state;
    kvd_msg_t out;
    /* field 1 with wire type 7 (no such wire type) */
    const uint8_t bad_wire_type[] = {0x0f, 0x01, 0x02, 0x03};
    assert_int_equal(decode_bytes(bad_wire_type, sizeof(bad_wire_type), &out),
                     KVD_ERR_PROTOCOL);
    /* a varint that never ends */
    const uint8_t endless_varint[] = {0x08, 0xff, 0xff, 0xff, 0xff, 0xff};
    assert_int_equal(decode_bytes(endless_varint, sizeof(endless_varint), &out),
                     KVD_ERR_PROTOCOL);
    /* field 10 (hello_request) claiming 16 bytes, holding 1 */
    const uint8_t short_body[] = {0x08, 0x01, 0x10, 0x01, 0x52, 0x10, 0x0a};
    assert_int_equal(decode_bytes(short_body, sizeof(short_body), &out),
                     KVD_ERR_PROTOCOL);
    /* text */
    const char *text = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    assert_int_equal(decode_bytes((const uint8_t *)text, strlen(text), &out),
                     KVD_ERR_PROTOCOL);
    /* random bytes after an impossible first tag */
    uint32_t x = 12345;
    uint8_t junk[64];
    for (int round = 0; round < 200; round++) {
        junk[0] = 0x07; /* field 0, wire type 7 */
        for (size_t i = 1; i < sizeof(junk); i++) {
            x = x * 1103515245u + 12345u;
            junk[i] = (uint8_t)(x >> 16);
        }
        assert_int_equal(decode_bytes(junk, 1 + (size_t)round % 63, &out),
                         KVD_ERR_PROTOCOL);
    }
}

static void test_truncated_payload_is_protocol_error(void **state)
{
    (void)state;
    kvd_msg_t *m = calloc(1, sizeof(*m)), *out = calloc(1, sizeof(*out));
    assert_non_null(m);
    assert_non_null(out);
    kvd_msg_request(m, 5, KVD_METHOD_STATS);
    m->reply = true;
    fill_stats(&m->body.stats_rep, true, true);
    size_t len;
    uint8_t *payload = pack_payload(m, &len);

    /* protobuf wire format of the Envelope's leading fields:
     * id = 5 (08 05), method = STATS (10 03), reply = true (18 01); the
     * stats_reply body (field 15) is the last field and the longest */
    const uint8_t lead[6] = {0x08, 0x05, 0x10, 0x03, 0x18, 0x01};
    assert_true(len > 100);
    assert_memory_equal(payload, lead, sizeof(lead));

    /* cut inside a leading field */
    assert_int_equal(decode_bytes(payload, 1, out), KVD_ERR_PROTOCOL);
    assert_int_equal(decode_bytes(payload, 3, out), KVD_ERR_PROTOCOL);
    assert_int_equal(decode_bytes(payload, 5, out), KVD_ERR_PROTOCOL);
    /* a reply cut anywhere from the end of its header to one byte short */
    for (size_t cut = sizeof(lead); cut < len; cut++) {
        int rc = decode_bytes(payload, cut, out);
        if (rc != KVD_ERR_PROTOCOL)
            print_error("payload cut to %zu of %zu bytes: rc %d\n", cut, len, rc);
        assert_int_equal(rc, KVD_ERR_PROTOCOL);
    }
    assert_int_equal(decode_bytes(payload, len, out), KVD_OK);
    free(payload);
    free(m);
    free(out);
}

static void test_unknown_method_keeps_id(void **state)
{
    (void)state;
    kvd_msg_t out;
    /* id = 7, method = 99 */
    const uint8_t bytes[] = {0x08, 0x07, 0x10, 0x63};
    assert_int_equal(decode_bytes(bytes, sizeof(bytes), &out), KVD_ERR_UNKNOWN_METHOD);
    assert_true(out.id == 7);

    /* id = 300 (ac 02), method = one past this build's last, a body */
    _Static_assert(KVD_METHOD_COUNT < 128, "the method must fit one varint byte");
    const uint8_t next[] = {0x08, 0xac, 0x02, 0x10, (uint8_t)KVD_METHOD_COUNT,
                            0x72, 0x00};
    assert_int_equal(decode_bytes(next, sizeof(next), &out), KVD_ERR_UNKNOWN_METHOD);
    assert_true(out.id == 300);
}

static void test_body_of_wrong_method_is_protocol_error(void **state)
{
    (void)state;
    kvd_msg_t out;
    /* id 1, method HELLO, body stats_request (field 14, empty) */
    const uint8_t hello_with_stats[] = {0x08, 0x01, 0x10, 0x01, 0x72, 0x00};
    assert_int_equal(decode_bytes(hello_with_stats, sizeof(hello_with_stats), &out),
                     KVD_ERR_PROTOCOL);
    /* id 1, method HEALTH, request, body health_reply (field 13): a reply's
     * body on a request */
    const uint8_t health_req_with_reply[] = {0x08, 0x01, 0x10, 0x02, 0x6a, 0x00};
    assert_int_equal(
        decode_bytes(health_req_with_reply, sizeof(health_req_with_reply), &out),
        KVD_ERR_PROTOCOL);
    /* id 1, method STATS, reply, body hello_reply (field 11, empty) */
    const uint8_t stats_rep_with_hello[] = {0x08, 0x01, 0x10, 0x03,
                                            0x18, 0x01, 0x5a, 0x00};
    assert_int_equal(
        decode_bytes(stats_rep_with_hello, sizeof(stats_rep_with_hello), &out),
        KVD_ERR_PROTOCOL);
    /* the matching body is accepted: id 1, method HEALTH, reply, health_reply
     * with state READY (08 02) */
    const uint8_t health_rep[] = {0x08, 0x01, 0x10, 0x02, 0x18,
                                  0x01, 0x6a, 0x02, 0x08, 0x02};
    assert_int_equal(decode_bytes(health_rep, sizeof(health_rep), &out), KVD_OK);
    assert_header(&out, 1, KVD_METHOD_HEALTH, true, KVD_OK);
    assert_int_equal(out.body.health_rep.state, KVD_HEALTH_READY);
}

static void test_error_with_positive_code_is_protocol_error(void **state)
{
    (void)state;
    kvd_msg_t out;
    /* id 1, method HEALTH, reply, error { code: sint32 7 (zigzag 0e) } */
    const uint8_t positive[] = {0x08, 0x01, 0x10, 0x02, 0x18,
                                0x01, 0x22, 0x02, 0x08, 0x0e};
    assert_int_equal(decode_bytes(positive, sizeof(positive), &out), KVD_ERR_PROTOCOL);
    /* the same with code -7 (zigzag 0d) and message "x" is an error reply */
    const uint8_t negative[] = {0x08, 0x01, 0x10, 0x02, 0x18, 0x01, 0x22,
                                0x05, 0x08, 0x0d, 0x12, 0x01, 'x'};
    assert_int_equal(decode_bytes(negative, sizeof(negative), &out), KVD_OK);
    assert_header(&out, 1, KVD_METHOD_HEALTH, true, KVD_ERR_NO_SPACE);
    assert_string_equal(out.error, "x");
}

/* Hand-encodes a Hello request whose client_name has name_len 'a' bytes. */
static size_t hello_with_name(uint8_t *buf, size_t name_len)
{
    uint8_t len_bytes[10];
    size_t name_len_bytes = put_varint(len_bytes, name_len);
    size_t n = 0;
    buf[n++] = 0x08; /* id = 1 */
    buf[n++] = 0x01;
    buf[n++] = 0x10; /* method = HELLO */
    buf[n++] = 0x01;
    buf[n++] = 0x52; /* field 10, length-delimited */
    n += put_varint(buf + n, 1 + name_len_bytes + name_len);
    buf[n++] = 0x0a; /* client_name = field 1, length-delimited */
    n += put_varint(buf + n, name_len);
    memset(buf + n, 'a', name_len);
    return n + name_len;
}

static void test_overlong_string_is_protocol_error(void **state)
{
    (void)state;
    kvd_msg_t out;
    uint8_t buf[512];
    /* the longest name the C field holds is accepted */
    size_t len = hello_with_name(buf, KVD_NAME_MAX - 1);
    assert_int_equal(decode_bytes(buf, len, &out), KVD_OK);
    assert_int_equal(strlen(out.body.hello_req.client_name), KVD_NAME_MAX - 1);
    /* one more is refused, not truncated */
    len = hello_with_name(buf, KVD_NAME_MAX);
    assert_int_equal(decode_bytes(buf, len, &out), KVD_ERR_PROTOCOL);
    len = hello_with_name(buf, 400);
    assert_int_equal(decode_bytes(buf, len, &out), KVD_ERR_PROTOCOL);

    /* a hello reply whose daemon_version (field 1) is KVD_VERSION_MAX long */
    size_t n = 0;
    const uint8_t head[] = {0x08, 0x01,
                            0x10, 0x01,
                            0x18, 0x01,
                            0x5a, (uint8_t)(2 + KVD_VERSION_MAX),
                            0x0a, (uint8_t)KVD_VERSION_MAX};
    memcpy(buf, head, sizeof(head));
    n = sizeof(head);
    memset(buf + n, 'v', KVD_VERSION_MAX);
    n += KVD_VERSION_MAX;
    assert_int_equal(decode_bytes(buf, n, &out), KVD_ERR_PROTOCOL);
}

static void test_pack_too_large_for_max_frame(void **state)
{
    (void)state;
    kvd_msg_t m;
    kvd_msg_request(&m, 1, KVD_METHOD_HELLO);
    strcpy(m.body.hello_req.client_name, "a-client-with-a-name");
    m.body.hello_req.pid = 1234;

    kvd_buf_t b;
    kvd_buf_init(&b, KVD_MEM_OTHER);
    assert_int_equal(kvd_msg_pack(&m, KVD_FRAME_DEFAULT_MAX, &b), KVD_OK);
    size_t payload_len = b.len - 4;

    /* append after what is in the buffer already */
    assert_int_equal(kvd_msg_pack(&m, payload_len, &b), KVD_OK);
    assert_int_equal(b.len, 2 * (payload_len + 4));
    assert_memory_equal(b.data, b.data + payload_len + 4, payload_len + 4);

    size_t before = b.len;
    assert_int_equal(kvd_msg_pack(&m, payload_len - 1, &b), KVD_ERR_TOO_LARGE);
    assert_int_equal(b.len, before);
    assert_int_equal(kvd_msg_pack(&m, 4, &b), KVD_ERR_TOO_LARGE);
    assert_int_equal(b.len, before);
    kvd_buf_free(&b);
}

static void test_pack_rejects_unknown_method(void **state)
{
    (void)state;
    kvd_msg_t m;
    kvd_buf_t b;
    kvd_buf_init(&b, KVD_MEM_OTHER);
    kvd_msg_request(&m, 1, KVD_METHOD_NONE);
    assert_int_equal(kvd_msg_pack(&m, KVD_FRAME_DEFAULT_MAX, &b), KVD_ERR_INVALID);
    kvd_msg_request(&m, 1, (kvd_method_t)99);
    assert_int_equal(kvd_msg_pack(&m, KVD_FRAME_DEFAULT_MAX, &b), KVD_ERR_INVALID);
    m.reply = true;
    assert_int_equal(kvd_msg_pack(&m, KVD_FRAME_DEFAULT_MAX, &b), KVD_ERR_INVALID);
    assert_int_equal(b.len, 0);
    kvd_buf_free(&b);
}

static void test_names_and_latency_bounds(void **state)
{
    (void)state;
    assert_string_equal(kvd_method_name(KVD_METHOD_HELLO), "hello");
    assert_string_equal(kvd_method_name(KVD_METHOD_HEALTH), "health");
    assert_string_equal(kvd_method_name(KVD_METHOD_STATS), "stats");
    assert_string_equal(kvd_method_name((kvd_method_t)99), "unknown");
    assert_string_equal(kvd_health_name(KVD_HEALTH_READY), "ready");
    assert_string_equal(kvd_health_name(KVD_HEALTH_STARTING), "starting");
    assert_string_equal(kvd_health_name(KVD_HEALTH_DRAINING), "draining");
    /* bounds rise strictly; the last bucket takes everything above */
    for (size_t i = 1; i < KVD_LATENCY_BUCKETS; i++)
        assert_true(kvd_latency_bound_us(i) > kvd_latency_bound_us(i - 1));
    assert_true(kvd_latency_bound_us(KVD_LATENCY_BUCKETS - 1) == UINT64_MAX);
}

/* ------------------------------------------------------ host:port */

static void assert_host_port(const char *text, const char *host, uint16_t port)
{
    char h[64];
    uint16_t p = 0;
    int rc = kvd_parse_host_port(text, h, sizeof(h), &p);
    if (rc != KVD_OK)
        print_error("kvd_parse_host_port(\"%s\"): rc %d\n", text, rc);
    assert_int_equal(rc, KVD_OK);
    assert_string_equal(h, host);
    assert_int_equal(p, port);
}

static void assert_host_port_rejected(const char *text)
{
    char h[64] = "untouched";
    uint16_t p = 4242;
    int rc = kvd_parse_host_port(text, h, sizeof(h), &p);
    if (rc != KVD_ERR_INVALID)
        print_error("kvd_parse_host_port(\"%s\") accepted: \"%s\" %u\n", text, h, p);
    assert_int_equal(rc, KVD_ERR_INVALID);
    assert_string_equal(h, "untouched");
    assert_int_equal(p, 4242);
}

static void test_parse_host_port(void **state)
{
    (void)state;
    assert_host_port("127.0.0.1:80", "127.0.0.1", 80);
    assert_host_port("[::1]:9000", "::1", 9000);
    assert_host_port("localhost:1", "localhost", 1);
    assert_host_port("h:65535", "h", 65535);
    assert_host_port("[fe80::1%eth0]:7000", "fe80::1%eth0", 7000);

    assert_host_port_rejected("nohost");
    assert_host_port_rejected(":80");
    assert_host_port_rejected("h:0");
    assert_host_port_rejected("h:65536");
    assert_host_port_rejected("[::1]80");
    assert_host_port_rejected("h:");
    assert_host_port_rejected("h:-1");
    assert_host_port_rejected("h:80x");
    assert_host_port_rejected("[]:80");
    assert_host_port_rejected("[::1:80");
    assert_host_port_rejected("");

    /* a host longer than the caller's buffer is refused, not cut */
    char small[4] = "abc";
    uint16_t p = 1;
    assert_int_equal(kvd_parse_host_port("abcd:80", small, sizeof(small), &p),
                     KVD_ERR_INVALID);
    assert_int_equal(kvd_parse_host_port("abc:80", small, sizeof(small), &p), KVD_OK);
    assert_string_equal(small, "abc");
    assert_int_equal(p, 80);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hello_request_round_trip),
        cmocka_unit_test(test_hello_reply_round_trip),
        cmocka_unit_test(test_health_request_and_reply_round_trip),
        cmocka_unit_test(test_stats_request_and_reply_round_trip),
        cmocka_unit_test(test_error_reply_round_trip),
        cmocka_unit_test(test_unknown_error_code_is_protocol_error),
        cmocka_unit_test(test_garbage_is_protocol_error),
        cmocka_unit_test(test_truncated_payload_is_protocol_error),
        cmocka_unit_test(test_unknown_method_keeps_id),
        cmocka_unit_test(test_body_of_wrong_method_is_protocol_error),
        cmocka_unit_test(test_error_with_positive_code_is_protocol_error),
        cmocka_unit_test(test_overlong_string_is_protocol_error),
        cmocka_unit_test(test_pack_too_large_for_max_frame),
        cmocka_unit_test(test_pack_rejects_unknown_method),
        cmocka_unit_test(test_names_and_latency_bounds),
        cmocka_unit_test(test_parse_host_port),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
