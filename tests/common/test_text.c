/*
 * Description: the text helpers of common/text.c. kvd_utf8_valid accepts
 * UTF-8 of one to four bytes and refuses stray continuation bytes, overlong
 * forms, surrogates, code points above U+10FFFF and sequences cut short.
 * kvd_utf8_copy never writes invalid UTF-8: it cuts a long string between
 * characters, drops a character cut short at the end and writes '?' for a
 * stray byte. kvd_escape turns control bytes, DEL, bytes above 0x7f and the
 * backslash into escapes (a newline cannot start a new log line), keeps
 * printable ASCII and never cuts an escape in half. Expected values are
 * written out by hand.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <string.h>

#include "kvd_common.h"

static bool valid(const char *s)
{
    return kvd_utf8_valid(s, strlen(s));
}

static void test_utf8_valid(void **state)
{
    (void)state;
    assert_true(valid(""));
    assert_true(valid("plain ascii"));
    assert_true(valid("\xc3\xa9"));         /* U+00E9 */
    assert_true(valid("\xe2\x82\xac"));     /* U+20AC */
    assert_true(valid("\xf0\x9f\x98\x80")); /* U+1F600 */
    assert_true(valid("\xf4\x8f\xbf\xbf")); /* U+10FFFF */
    assert_true(valid("\xed\x9f\xbf"));     /* U+D7FF, below the surrogates */
    assert_false(valid("\xff"));
    assert_false(valid("\x80"));             /* stray continuation */
    assert_false(valid("a\xc3"));            /* cut short */
    assert_false(valid("\xe2\x82"));         /* cut short */
    assert_false(valid("\xc0\xaf"));         /* overlong '/' */
    assert_false(valid("\xc1\xbf"));         /* overlong */
    assert_false(valid("\xe0\x80\xaf"));     /* overlong */
    assert_false(valid("\xf0\x80\x80\xaf")); /* overlong */
    assert_false(valid("\xed\xa0\x80"));     /* U+D800, a surrogate */
    assert_false(valid("\xf4\x90\x80\x80")); /* U+110000 */
    assert_false(valid("\xf5\x80\x80\x80"));
    assert_false(valid("\xc3\x28")); /* the second byte is no continuation */
    /* a NUL inside the counted bytes is U+0000: valid */
    assert_true(kvd_utf8_valid("a\0b", 3));
}

static void test_utf8_copy(void **state)
{
    (void)state;
    char out[8];
    kvd_utf8_copy(out, "abc", sizeof(out));
    assert_string_equal(out, "abc");
    /* "aaaaa" + U+20AC: the euro sign does not fit whole in 7 bytes */
    kvd_utf8_copy(out, "aaaaa\xe2\x82\xac", sizeof(out));
    assert_string_equal(out, "aaaaa");
    /* ... in 8 bytes it does */
    char out9[9];
    kvd_utf8_copy(out9, "aaaaa\xe2\x82\xac", sizeof(out9));
    assert_string_equal(out9, "aaaaa\xe2\x82\xac");
    /* cut short at the end: dropped */
    kvd_utf8_copy(out, "ab\xe2\x82", sizeof(out));
    assert_string_equal(out, "ab");
    /* stray bytes become '?' */
    kvd_utf8_copy(out,
                  "a\xff"
                  "b\x80",
                  sizeof(out));
    assert_string_equal(out, "a?b?");
    kvd_utf8_copy(out, "\xc0\xaf", sizeof(out));
    assert_string_equal(out, "??");
    char one[1] = {'x'};
    kvd_utf8_copy(one, "abc", sizeof(one));
    assert_string_equal(one, "");
}

static void test_escape(void **state)
{
    (void)state;
    char out[64];
    const char forged[] = "w1\n2026-01-01T00:00:00.000Z error server: forged";
    kvd_escape(out, sizeof(out), forged, strlen(forged));
    assert_null(strchr(out, '\n'));
    assert_string_equal(out, "w1\\x0a2026-01-01T00:00:00.000Z error server: forged");
    kvd_escape(out, sizeof(out), "a\\b\r\t\x7f\xc3\xa9", 8);
    assert_string_equal(out, "a\\\\b\\x0d\\x09\\x7f\\xc3\\xa9");
    /* counted bytes: a NUL is escaped, not an end */
    kvd_escape(out, sizeof(out), "a\0b", 3);
    assert_string_equal(out, "a\\x00b");
    /* never half an escape: "ab" fits, "\x0a" (4 bytes) does not in 6 */
    char small[6];
    kvd_escape(small, sizeof(small), "ab\ncd", 5);
    assert_string_equal(small, "ab");
    assert_string_equal(kvd_escape(small, sizeof(small), "", 0), "");
    /* the room KVD_ESCAPED_MAX promises holds the worst case */
    char worst[KVD_ESCAPED_MAX(3)];
    kvd_escape(worst, sizeof(worst), "\x01\x02\x03", 3);
    assert_string_equal(worst, "\\x01\\x02\\x03");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_utf8_valid),
        cmocka_unit_test(test_utf8_copy),
        cmocka_unit_test(test_escape),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
