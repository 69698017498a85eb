/*
 * Description: size and number parsing of common/ (kvd_size_parse,
 * kvd_size_format, kvd_u64_parse, kvd_double_parse).
 *
 * Expected values are the binary multiples the header documents (K = 1024,
 * M = 1024^2, ...), written out as literals; every rejected input must leave
 * the output untouched.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "kvd_common.h"

#define UNTOUCHED 0xdeadbeefcafef00dull

static void assert_size(const char *text, uint64_t want)
{
    uint64_t got = UNTOUCHED;
    int rc = kvd_size_parse(text, &got);
    if (rc != KVD_OK || got != want)
        print_error("kvd_size_parse(\"%s\"): rc %d, got %llu, want %llu\n", text, rc,
                    (unsigned long long)got, (unsigned long long)want);
    assert_int_equal(rc, KVD_OK);
    assert_true(got == want);
}

static void assert_size_rejected(const char *text)
{
    uint64_t got = UNTOUCHED;
    int rc = kvd_size_parse(text, &got);
    if (rc != KVD_ERR_INVALID)
        print_error("kvd_size_parse(\"%s\") should be rejected: rc %d, got %llu\n", text,
                    rc, (unsigned long long)got);
    assert_int_equal(rc, KVD_ERR_INVALID);
    assert_true(got == UNTOUCHED);
}

static void test_size_parse_plain_numbers(void **state)
{
    (void)state;
    assert_size("0", 0);
    assert_size("4096", 4096);
    assert_size("18446744073709551615", UINT64_MAX); /* the largest that fits */
}

static void test_size_parse_suffixes(void **state)
{
    (void)state;
    assert_size("1K", 1024);
    assert_size("1k", 1024);
    assert_size("1KiB", 1024);
    assert_size("1KB", 1024); /* documented as a power of 1024 too */
    assert_size("1kib", 1024);
    assert_size("7B", 7);
    assert_size("512M", 536870912ull);
    assert_size("512mb", 536870912ull);
    assert_size("3MiB", 3145728ull);
    assert_size("2G", 2147483648ull);
    assert_size("2GiB", 2147483648ull);
    assert_size("2T", 2199023255552ull);
    assert_size("2tb", 2199023255552ull);
    assert_size("16777215T", 18446742974197923840ull); /* (2^24 - 1) * 2^40 */
}

static void test_size_parse_fractions(void **state)
{
    (void)state;
    assert_size("1.5G", 1610612736ull);
    assert_size("0.5K", 512);
    assert_size("2.25M", 2359296ull);
    assert_size("0.5T", 549755813888ull);
    assert_size("16777215.5T", 18446743523953737728ull); /* 2^64 - 2^39 */
}

static void test_size_parse_whitespace(void **state)
{
    (void)state;
    assert_size(" 1G", 1073741824ull);
    assert_size("1G ", 1073741824ull);
    assert_size("\t64K\n", 65536);
}

static void test_size_parse_rejects_garbage(void **state)
{
    (void)state;
    assert_size_rejected("");
    assert_size_rejected("   ");
    assert_size_rejected("-1");
    assert_size_rejected("+1");
    assert_size_rejected("G");
    assert_size_rejected("1X");
    assert_size_rejected("1.2.3");
    assert_size_rejected("abc");
    assert_size_rejected("1 G"); /* a suffix follows the number directly */
    assert_size_rejected("1GG");
    assert_size_rejected("1KiBx");
    assert_size_rejected("0x10");
    assert_size_rejected("1e3"); /* no exponents: a decimal number */

    uint64_t got = UNTOUCHED;
    assert_int_equal(kvd_size_parse(NULL, &got), KVD_ERR_INVALID);
    assert_true(got == UNTOUCHED);
}

static void test_size_parse_rejects_overflow(void **state)
{
    (void)state;
    assert_size_rejected("18446744073709551616"); /* 2^64 */
    assert_size_rejected("99999999999999999999999");
    assert_size_rejected("16777216T");    /* 2^24 * 2^40 = 2^64 */
    assert_size_rejected("17179869184G"); /* 2^34 * 2^30 = 2^64 */
    assert_size_rejected("18446744073709551615K");
}

static void assert_format(uint64_t bytes, const char *want)
{
    char buf[32];
    memset(buf, 'x', sizeof(buf));
    const char *got = kvd_size_format(bytes, buf, sizeof(buf));
    assert_ptr_equal(got, buf);
    assert_string_equal(buf, want);
}

static void test_size_format(void **state)
{
    (void)state;
    assert_format(0, "0 B");
    assert_format(512, "512 B");
    assert_format(1023, "1023 B");
    assert_format(1024, "1.00 KiB");
    assert_format(1536, "1.50 KiB");
    assert_format(1610612736ull, "1.50 GiB");
    assert_format(8ull << 20, "8.00 MiB");
    assert_format(3ull << 40, "3.00 TiB");

    /* a short buffer is truncated and terminated, never overrun */
    char small[6];
    memset(small, 'x', sizeof(small));
    kvd_size_format(1610612736ull, small, 5);
    assert_string_equal(small, "1.50");
    assert_int_equal(small[5], 'x');
}

static void test_u64_parse_ranges(void **state)
{
    (void)state;
    uint64_t v = 0;
    assert_int_equal(kvd_u64_parse("0", 0, 10, &v), KVD_OK);
    assert_true(v == 0);
    assert_int_equal(kvd_u64_parse("10", 0, 10, &v), KVD_OK);
    assert_true(v == 10);
    assert_int_equal(kvd_u64_parse("1", 1, 1, &v), KVD_OK);
    assert_true(v == 1);
    assert_int_equal(kvd_u64_parse("18446744073709551615", 0, UINT64_MAX, &v), KVD_OK);
    assert_true(v == UINT64_MAX);

    const struct {
        const char *text;
        uint64_t min, max;
    } bad[] = {
        {"11", 0, 10},  {"4", 5, 10},
        {"", 0, 10},    {"-1", 0, UINT64_MAX},
        {"+1", 0, 10},  {" 1", 0, 10},
        {"1 ", 0, 10},  {"1x", 0, 10},
        {"1.0", 0, 10}, {"18446744073709551616", 0, UINT64_MAX},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        v = 42;
        int rc = kvd_u64_parse(bad[i].text, bad[i].min, bad[i].max, &v);
        if (rc != KVD_ERR_INVALID)
            print_error("kvd_u64_parse(\"%s\", %llu, %llu) accepted\n", bad[i].text,
                        (unsigned long long)bad[i].min, (unsigned long long)bad[i].max);
        assert_int_equal(rc, KVD_ERR_INVALID);
        assert_true(v == 42);
    }
    assert_int_equal(kvd_u64_parse(NULL, 0, 10, &v), KVD_ERR_INVALID);
}

static void test_double_parse_ranges(void **state)
{
    (void)state;
    double d = 0;
    assert_int_equal(kvd_double_parse("0.5", 0.0, 1.0, &d), KVD_OK);
    assert_true(d == 0.5);
    assert_int_equal(kvd_double_parse("1", 0.0, 1.0, &d), KVD_OK);
    assert_true(d == 1.0);
    assert_int_equal(kvd_double_parse("0", 0.0, 1.0, &d), KVD_OK);
    assert_true(d == 0.0);
    assert_int_equal(kvd_double_parse("-2.5", -3.0, 0.0, &d), KVD_OK);
    assert_true(d == -2.5);

    const struct {
        const char *text;
        double min, max;
    } bad[] = {
        {"1.01", 0.0, 1.0},  {"-0.1", 0.0, 1.0},    {"", 0.0, 1.0},
        {"abc", 0.0, 1.0},   {"0.5x", 0.0, 1.0},    {"nan", -1e9, 1e9},
        {"inf", 0.0, 1e308}, {"1e999", 0.0, 1e308},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        d = 42.0;
        int rc = kvd_double_parse(bad[i].text, bad[i].min, bad[i].max, &d);
        if (rc != KVD_ERR_INVALID)
            print_error("kvd_double_parse(\"%s\", %g, %g) accepted\n", bad[i].text,
                        bad[i].min, bad[i].max);
        assert_int_equal(rc, KVD_ERR_INVALID);
        assert_true(d == 42.0);
    }
    assert_int_equal(kvd_double_parse(NULL, 0.0, 1.0, &d), KVD_ERR_INVALID);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_size_parse_plain_numbers),
        cmocka_unit_test(test_size_parse_suffixes),
        cmocka_unit_test(test_size_parse_fractions),
        cmocka_unit_test(test_size_parse_whitespace),
        cmocka_unit_test(test_size_parse_rejects_garbage),
        cmocka_unit_test(test_size_parse_rejects_overflow),
        cmocka_unit_test(test_size_format),
        cmocka_unit_test(test_u64_parse_ranges),
        cmocka_unit_test(test_double_parse_ranges),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
