/*
 * Description: kvd_pool_create() reports the mapping's own error.
 *
 * kvd_store.h: kvd_pool_create fails with "... or the mapping's error", and
 * kvd_common.h: errno is converted by kvd_status_from_errno() at the
 * boundary. A 2^62-byte pool (a page multiple; the memfd can be that large)
 * cannot be mapped in a 47-bit or 56-bit address space: mmap answers
 * ENOMEM, so the status must be KVD_ERR_NOMEM, not a generic KVD_ERR_IO
 * that loses the reason. (The same path is taken on a host without free
 * hugepages, where the shared hugetlb mapping fails with ENOMEM.)
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "kvd_store.h"

static void test_pool_unmappable_size_is_nomem(void **state)
{
    (void)state;
    kvd_pool_opts_t o = {.instance = "unit-map-error", .size_bytes = 1ull << 62};
    kvd_pool_t *p = NULL;
    int rc = kvd_pool_create(&o, &p);
    if (rc == KVD_OK)
        kvd_pool_destroy(p);
    print_message("kvd_pool_create(2^62 bytes): %d (%s)\n", rc, kvd_status_str(rc));
    /* ENOMEM from mmap; a kernel refusing the file size (EFBIG) instead
     * would make it KVD_ERR_TOO_LARGE, which keeps the reason as well */
    assert_true(rc == KVD_ERR_NOMEM || rc == KVD_ERR_TOO_LARGE);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pool_unmappable_size_is_nomem),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
