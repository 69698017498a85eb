/*
 * Description: the status codes of libkvdock's public header. kvdock.h
 * names every code the API returns (kvd_status_t, from kvd_status.h, the
 * header installed beside it) without pulling in kvdock's internal headers,
 * and kvd_strerror, called through the shared library, gives each code its
 * own text: non-empty, different from every other code's, and not the
 * fallback. A value outside the enum (just past either end of it, far
 * away, INT_MIN, INT_MAX) gets a text that says "unknown status". Scanning
 * a wide range of values finds exactly the named codes, so the enum and
 * kvd_strerror agree (common/status.c's switch fails to compile when a code
 * lacks its text).
 */
#include "kvdock.h"

#include <limits.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <string.h>

#ifdef KVD_COMMON_H
#error "kvdock.h must not include kvd_common.h (an internal header)"
#endif

/* Every code of the enum, by name. */
static const kvd_status_t codes[] = {
    KVD_OK,
    KVD_INPROGRESS,
    KVD_ERR_INVALID,
    KVD_ERR_NOMEM,
    KVD_ERR_IO,
    KVD_ERR_NOT_FOUND,
    KVD_ERR_EXISTS,
    KVD_ERR_BUSY,
    KVD_ERR_NO_SPACE,
    KVD_ERR_TIMEOUT,
    KVD_ERR_PROTOCOL,
    KVD_ERR_UNSUPPORTED,
    KVD_ERR_CLOSED,
    KVD_ERR_TOO_LARGE,
    KVD_ERR_STATE,
    KVD_ERR_PERMISSION,
    KVD_ERR_UNAVAILABLE,
    KVD_ERR_UNKNOWN_METHOD,
    KVD_ERR_DRAINING,
    KVD_ERR_AUTH,
    KVD_ERR_QUOTA,
    KVD_ERR_CORRUPT,
    KVD_ERR_NO_DEVICE,
    KVD_ERR_NOT_DEVICE,
    KVD_ERR_DEVICE,
};
#define N_CODES (sizeof(codes) / sizeof(codes[0]))

static bool is_unknown(const char *text)
{
    return strstr(text, "unknown status") != NULL;
}

static void test_every_code_has_its_own_text(void **state)
{
    (void)state;
    for (size_t i = 0; i < N_CODES; i++) {
        const char *text = kvd_strerror(codes[i]);
        assert_non_null(text);
        if (text[0] == '\0' || is_unknown(text))
            print_error("code %d has the text '%s'\n", (int)codes[i], text);
        assert_true(text[0] != '\0');
        assert_false(is_unknown(text));
        for (size_t k = 0; k < i; k++) {
            assert_int_not_equal(codes[i], codes[k]);
            if (strcmp(text, kvd_strerror(codes[k])) == 0)
                print_error("codes %d and %d share the text '%s'\n", (int)codes[i],
                            (int)codes[k], text);
            assert_string_not_equal(text, kvd_strerror(codes[k]));
        }
    }
    /* the success code is zero and the errors are negative: the header's
     * promise ("0 or a negative kvd status") */
    for (size_t i = 0; i < N_CODES; i++)
        if (codes[i] != KVD_OK && codes[i] != KVD_INPROGRESS)
            assert_true(codes[i] < 0);
    assert_int_equal(KVD_OK, 0);
}

static void test_unknown_codes_say_so(void **state)
{
    (void)state;
    int lowest = 0, highest = 0;
    for (size_t i = 0; i < N_CODES; i++) {
        lowest = codes[i] < lowest ? codes[i] : lowest;
        highest = codes[i] > highest ? codes[i] : highest;
    }
    const int unknown[] = {lowest - 1, highest + 1, -1000, 1000, INT_MIN, INT_MAX};
    for (size_t i = 0; i < sizeof(unknown) / sizeof(unknown[0]); i++) {
        const char *text = kvd_strerror(unknown[i]);
        assert_non_null(text);
        if (!is_unknown(text))
            print_error("kvd_strerror(%d) = '%s', want 'unknown status'\n", unknown[i],
                        text);
        assert_true(is_unknown(text));
    }
}

static void test_the_named_codes_are_all_there_is(void **state)
{
    (void)state;
    size_t known = 0;
    for (int v = -4096; v <= 4096; v++) {
        if (is_unknown(kvd_strerror(v)))
            continue;
        known++;
        bool named = false;
        for (size_t i = 0; i < N_CODES; i++)
            named |= codes[i] == v;
        if (!named)
            print_error("kvd_strerror knows %d ('%s'), kvdock.h's enum does not\n", v,
                        kvd_strerror(v));
        assert_true(named);
    }
    assert_int_equal(known, N_CODES);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_code_has_its_own_text),
        cmocka_unit_test(test_unknown_codes_say_so),
        cmocka_unit_test(test_the_named_codes_are_all_there_is),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
