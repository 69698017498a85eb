/*
 * Description: every string field kvd_msg_pack writes is valid UTF-8, as
 * proto3 requires, whatever the C buffers held: an error text of 255 bytes
 * cut inside a character by its buffer, an error text with a stray 0xff,
 * Stats' check_error and a namespace name that are not UTF-8, a Hello's
 * client_name cut short. The packed bytes are read back by a wire reader
 * and a UTF-8 checker of this file, not by proto/'s decoder. Decoding is
 * strict: a request whose string field is not UTF-8 (the frame of issue 11,
 * ListPrefixes of ns_name "\xff") is refused as malformed, and an error
 * text that is not UTF-8 reaches the reader cut between characters.
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

/* ------------------------------------------------- independent checkers */

/* UTF-8 per RFC 3629, decoded to code points and range-checked. */
static bool utf8_ok(const uint8_t *p, size_t n)
{
    size_t i = 0;
    while (i < n) {
        uint32_t c = p[i];
        size_t k = c < 0x80         ? 1
                   : (c >> 5) == 6  ? 2
                   : (c >> 4) == 14 ? 3
                   : (c >> 3) == 30 ? 4
                                    : 0;
        if (k == 0 || i + k > n)
            return false;
        if (k > 1)
            c &= 0x7f >> k;
        for (size_t j = 1; j < k; j++) {
            if ((p[i + j] & 0xc0) != 0x80)
                return false;
            c = (c << 6) | (p[i + j] & 0x3f);
        }
        static const uint32_t min[5] = {0, 0, 0x80, 0x800, 0x10000};
        if (c < min[k] || c > 0x10ffff || (c >= 0xd800 && c <= 0xdfff))
            return false;
        i += k;
    }
    return true;
}

static uint64_t rd_varint(const uint8_t *p, size_t len, size_t *off)
{
    uint64_t v = 0;
    for (int shift = 0; *off < len && shift < 64; shift += 7) {
        uint8_t b = p[(*off)++];
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80))
            return v;
    }
    fail_msg("bad varint");
    return 0;
}

/* The bytes of the n-th (from 0) length-delimited field `field` of the
 * message p[0..len); false when there are fewer. */
static bool find_field(const uint8_t *p, size_t len, uint32_t field, size_t nth,
                       const uint8_t **data, size_t *dlen)
{
    size_t off = 0;
    while (off < len) {
        uint64_t key = rd_varint(p, len, &off);
        uint32_t wire = key & 7;
        if (wire == 0) {
            rd_varint(p, len, &off);
        } else if (wire == 1) {
            off += 8;
        } else if (wire == 5) {
            off += 4;
        } else {
            assert_int_equal(wire, 2);
            uint64_t n = rd_varint(p, len, &off);
            assert_true(n <= len - off);
            if ((key >> 3) == field && nth-- == 0) {
                *data = p + off;
                *dlen = (size_t)n;
                return true;
            }
            off += (size_t)n;
        }
    }
    return false;
}

/* The string at a path of (field, nth) pairs below the Envelope. */
static void string_at(const uint8_t *p, size_t len, const uint32_t (*path)[2],
                      size_t depth, const uint8_t **s, size_t *n)
{
    for (size_t i = 0; i < depth; i++) {
        assert_true(find_field(p, len, path[i][0], path[i][1], &p, &len));
    }
    *s = p;
    *n = len;
}

/* ---------------------------------------------------------------- tests */

static void test_error_cut_inside_a_character(void **state)
{
    (void)state;
    /* 19 ASCII bytes then euro signs: the 256-byte buffer ends inside one
     * for one of three offsets, whichever the formatter's cut falls on */
    for (int pad = 0; pad < 3; pad++) {
        char text[600] = "unknown namespace '";
        size_t n = strlen(text);
        for (int i = 0; i < pad; i++)
            text[n++] = 'x';
        while (n + 3 < sizeof(text) - 1) {
            memcpy(text + n, "\xe2\x82\xac", 3);
            n += 3;
        }
        text[n] = '\0';
        kvd_msg_t m;
        kvd_msg_error(&m, 9, KVD_METHOD_LIST_PREFIXES, KVD_ERR_NOT_FOUND, "%s", text);
        size_t len;
        uint8_t *payload = pack_payload(&m, &len);
        const uint32_t path[2][2] = {{4, 0}, {2, 0}};
        const uint8_t *s;
        size_t sn;
        string_at(payload, len, path, 2, &s, &sn);
        assert_true(utf8_ok(s, sn));
        /* cut between characters, not shortened further than that */
        assert_true(sn >= KVD_ERROR_MAX - 1 - 3 && sn <= KVD_ERROR_MAX - 1);
        assert_memory_equal(s, text, sn);
        kvd_msg_t out;
        assert_int_equal(decode_bytes(payload, len, &out), KVD_OK);
        assert_int_equal(out.status, KVD_ERR_NOT_FOUND);
        kvd_msg_clear(&out);
        free(payload);
    }
}

static void test_error_stray_byte(void **state)
{
    (void)state;
    kvd_msg_t m;
    kvd_msg_error(&m, 3, KVD_METHOD_INSPECT, KVD_ERR_NOT_FOUND, "no '%s' here", "\xff\n");
    size_t len;
    uint8_t *payload = pack_payload(&m, &len);
    const uint32_t path[2][2] = {{4, 0}, {2, 0}};
    const uint8_t *s;
    size_t sn;
    string_at(payload, len, path, 2, &s, &sn);
    assert_true(utf8_ok(s, sn));
    assert_int_equal(sn, strlen("no '?\n' here"));
    assert_memory_equal(s, "no '?\n' here", sn);
    free(payload);
}

static void test_reply_strings(void **state)
{
    (void)state;
    kvd_msg_t *m = calloc(1, sizeof(*m));
    assert_non_null(m);
    m->id = 5;
    m->method = KVD_METHOD_STATS;
    m->reply = true;
    kvd_stats_rep_t *st = &m->body.stats_rep;
    strcpy(st->daemon_version, "1.0");
    strcpy(st->instance, "i\xc3");               /* cut short */
    strcpy(st->check_error, "bad \xed\xa0\x80"); /* a surrogate */
    kvd_ns_msg_t ns[2] = {{.id = 0, .object_bytes = 1}, {.id = 1, .object_bytes = 1}};
    strcpy(ns[0].name, "ok-\xc3\xa9");
    strcpy(ns[1].name, "\xc0\xaf-overlong");
    st->namespaces = ns;
    st->n_namespaces = 2;
    size_t len;
    uint8_t *payload = pack_payload(m, &len);
    const uint8_t *s;
    size_t sn;
    const uint32_t inst[2][2] = {{15, 0}, {2, 0}};
    string_at(payload, len, inst, 2, &s, &sn);
    assert_true(utf8_ok(s, sn));
    assert_int_equal(sn, 1); /* "i": the cut character dropped */
    const uint32_t check[2][2] = {{15, 0}, {14, 0}};
    string_at(payload, len, check, 2, &s, &sn);
    assert_true(utf8_ok(s, sn));
    assert_memory_equal(s,
                        "bad ?"
                        "??",
                        sn);
    const uint32_t ns0[3][2] = {{15, 0}, {12, 0}, {2, 0}};
    string_at(payload, len, ns0, 3, &s, &sn);
    assert_int_equal(sn, strlen("ok-\xc3\xa9")); /* valid: untouched */
    assert_memory_equal(s, "ok-\xc3\xa9", sn);
    const uint32_t ns1[3][2] = {{15, 0}, {12, 1}, {2, 0}};
    string_at(payload, len, ns1, 3, &s, &sn);
    assert_true(utf8_ok(s, sn));
    assert_memory_equal(s,
                        "?"
                        "?-overlong",
                        sn);
    /* the caller's message is left as it was */
    assert_string_equal(ns[1].name, "\xc0\xaf-overlong");
    /* and a strict reader takes it */
    kvd_msg_t out;
    assert_int_equal(decode_bytes(payload, len, &out), KVD_OK);
    assert_string_equal(out.body.stats_rep.namespaces[1].name, "?"
                                                               "?-overlong");
    kvd_msg_clear(&out);
    free(payload);
    free(m);
}

static void test_request_strings(void **state)
{
    (void)state;
    kvd_msg_t m;
    kvd_msg_request(&m, 1, KVD_METHOD_HELLO);
    m.body.hello_req.protocol_version = KVD_PROTOCOL_VERSION;
    strcpy(m.body.hello_req.client_name, "w\xe2\x82");
    kvd_ns_spec_t spec = {.object_bytes = 4096};
    strcpy(spec.name, "m\xff");
    m.body.hello_req.namespaces = &spec;
    m.body.hello_req.n_namespaces = 1;
    size_t len;
    uint8_t *payload = pack_payload(&m, &len);
    const uint8_t *s;
    size_t sn;
    const uint32_t name[2][2] = {{10, 0}, {1, 0}};
    string_at(payload, len, name, 2, &s, &sn);
    assert_true(utf8_ok(s, sn));
    assert_memory_equal(s, "w", sn);
    const uint32_t ns[3][2] = {{10, 0}, {4, 0}, {1, 0}};
    string_at(payload, len, ns, 3, &s, &sn);
    assert_memory_equal(s, "m?", sn);
    free(payload);
}

/* The frame of issue 11 without its header: id 7, ListPrefixes,
 * list_request {ns_name = "\xff"}. */
static void test_decode_refuses_invalid_request_string(void **state)
{
    (void)state;
    const uint8_t bad[] = {0x08, 0x07, 0x10, 0x0b, 0xe2, 0x01, 0x03, 0x0a, 0x01, 0xff};
    kvd_msg_t out;
    assert_int_equal(decode_bytes(bad, sizeof(bad), &out), KVD_ERR_PROTOCOL);
    kvd_msg_clear(&out);
    /* the same with a valid name decodes */
    const uint8_t good[] = {0x08, 0x07, 0x10, 0x0b, 0xe2, 0x01,
                            0x04, 0x0a, 0x02, 0xc3, 0xa9};
    assert_int_equal(decode_bytes(good, sizeof(good), &out), KVD_OK);
    assert_string_equal(out.body.list_req.ns_name, "\xc3\xa9");
    kvd_msg_clear(&out);
}

/* An error reply whose text is not UTF-8 (an older daemon's): the reader
 * gets the error, its text cut between characters with '?' for stray
 * bytes. */
static void test_decode_error_text(void **state)
{
    (void)state;
    uint8_t p[600];
    size_t n = 0;
    p[n++] = 0x08; /* id 4 */
    p[n++] = 4;
    p[n++] = 0x10; /* method: Inspect */
    p[n++] = KVD_METHOD_INSPECT;
    p[n++] = 0x18; /* reply */
    p[n++] = 1;
    uint8_t err[520];
    size_t e = 0;
    err[e++] = 0x08; /* code: zigzag of NOT_FOUND */
    e += put_varint(err + e, (uint64_t)(-2 * (int64_t)KVD_ERR_NOT_FOUND - 1));
    err[e++] = 0x12;
    uint8_t text[300];
    text[0] = 0xff;
    size_t t = 1;
    while (t + 3 <= sizeof(text)) {
        memcpy(text + t, "\xe2\x82\xac", 3);
        t += 3;
    }
    e += put_varint(err + e, t);
    memcpy(err + e, text, t);
    e += t;
    p[n++] = 0x22; /* error */
    n += put_varint(p + n, e);
    memcpy(p + n, err, e);
    n += e;
    kvd_msg_t out;
    assert_int_equal(decode_bytes(p, n, &out), KVD_OK);
    assert_int_equal(out.status, KVD_ERR_NOT_FOUND);
    size_t got = strlen(out.error);
    assert_true(utf8_ok((const uint8_t *)out.error, got));
    assert_int_equal(out.error[0], '?');
    assert_int_equal(got, 1 + 3 * ((KVD_ERROR_MAX - 2) / 3));
    kvd_msg_clear(&out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_error_cut_inside_a_character),
        cmocka_unit_test(test_error_stray_byte),
        cmocka_unit_test(test_reply_strings),
        cmocka_unit_test(test_request_strings),
        cmocka_unit_test(test_decode_refuses_invalid_request_string),
        cmocka_unit_test(test_decode_error_text),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
