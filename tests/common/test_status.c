/*
 * Description: the errno boundary of common/ (kvd_status_from_errno). Each
 * errno the header's codes stand for maps to that code; EINPROGRESS is the
 * one "in progress"; EAGAIN is an error, never "in progress" (a failed
 * mlock, fork or pthread_create says EAGAIN: reporting that as work under
 * way hid the failure); errno values without a code of their own are
 * KVD_ERR_IO, never success. (The names of the codes are
 * tests/linker/test_linker_status.c's.)
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>

#include "kvd_common.h"

static void test_status_from_errno(void **state)
{
    (void)state;
    assert_int_equal(kvd_status_from_errno(0), KVD_OK);
    assert_int_equal(kvd_status_from_errno(EINVAL), KVD_ERR_INVALID);
    assert_int_equal(kvd_status_from_errno(ENOMEM), KVD_ERR_NOMEM);
    assert_int_equal(kvd_status_from_errno(ENOENT), KVD_ERR_NOT_FOUND);
    assert_int_equal(kvd_status_from_errno(EEXIST), KVD_ERR_EXISTS);
    assert_int_equal(kvd_status_from_errno(EBUSY), KVD_ERR_BUSY);
    assert_int_equal(kvd_status_from_errno(ENOSPC), KVD_ERR_NO_SPACE);
    assert_int_equal(kvd_status_from_errno(ETIMEDOUT), KVD_ERR_TIMEOUT);
    assert_int_equal(kvd_status_from_errno(EPROTO), KVD_ERR_PROTOCOL);
    assert_int_equal(kvd_status_from_errno(EOPNOTSUPP), KVD_ERR_UNSUPPORTED);
    assert_int_equal(kvd_status_from_errno(EPIPE), KVD_ERR_CLOSED);
    assert_int_equal(kvd_status_from_errno(ECONNRESET), KVD_ERR_CLOSED);
    assert_int_equal(kvd_status_from_errno(EACCES), KVD_ERR_PERMISSION);
    assert_int_equal(kvd_status_from_errno(EPERM), KVD_ERR_PERMISSION);
    assert_int_equal(kvd_status_from_errno(ECONNREFUSED), KVD_ERR_UNAVAILABLE);
    assert_int_equal(kvd_status_from_errno(EINPROGRESS), KVD_INPROGRESS);
    /* anything else is an i/o error, never success */
    assert_int_equal(kvd_status_from_errno(EIO), KVD_ERR_IO);
    assert_int_equal(kvd_status_from_errno(EXDEV), KVD_ERR_IO);
}

static void test_eagain_is_an_error(void **state)
{
    (void)state;
    int rc = kvd_status_from_errno(EAGAIN);
    assert_true(rc < 0);
    assert_int_not_equal(rc, KVD_INPROGRESS);
    assert_int_equal(rc, KVD_ERR_IO);
    assert_int_equal(kvd_status_from_errno(EWOULDBLOCK), rc);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_status_from_errno),
        cmocka_unit_test(test_eagain_is_an_error),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
