/*
 * Description: kvd_size_parse must not read an exponent in the fraction.
 *
 * The header promises "a decimal number (fractions allowed) with an optional
 * binary suffix". "1.5e3" is not that; it must be refused (or, at the very
 * least, mean 1500). It must never mean 1 + 500 = 501 bytes, which is what
 * reading the fraction ".5e3" on its own gives. The same goes for "1.5e3G"
 * (not 501 GiB) and "1.5e-3" (not 1 byte).
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "kvd_common.h"

#define UNTOUCHED 0xdeadbeefcafef00dull

static void assert_rejected(const char *text)
{
    uint64_t got = UNTOUCHED;
    int rc = kvd_size_parse(text, &got);
    if (rc != KVD_ERR_INVALID)
        print_error("kvd_size_parse(\"%s\"): rc %d, value %llu; want KVD_ERR_INVALID\n",
                    text, rc, (unsigned long long)got);
    assert_int_equal(rc, KVD_ERR_INVALID);
    assert_true(got == UNTOUCHED);
}

static void test_size_parse_rejects_exponent(void **state)
{
    (void)state;
    assert_rejected("1.5e3");
    assert_rejected("1.5E2");
    assert_rejected("1.5e3G");
    assert_rejected("1.5e-3");
    assert_rejected("1.0e0");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_size_parse_rejects_exponent),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
