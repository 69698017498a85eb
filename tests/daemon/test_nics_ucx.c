/*
 * Description: kvd_nics_ucx_devices, the suggested UCX_NET_DEVICES value,
 * on hand-built port lists. The rule (nics.h): "DEVICE:PORT" of every port
 * that is active and that verbs could open, in list order, joined by
 * commas; the count is returned; a buffer too small gives
 * KVD_ERR_TOO_LARGE and "", a zero-length one KVD_ERR_INVALID. The expected
 * strings below are written from that rule, port by port.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <string.h>

#include "nics.h"

static kvd_nic_t port_of(const char *dev, uint32_t port, const char *state, bool verbs_ok)
{
    kvd_nic_t n;
    memset(&n, 0, sizeof(n));
    strcpy(n.device, dev);
    n.port = port;
    strcpy(n.state, state);
    n.active = strcmp(state, "active") == 0;
    n.verbs_ok = verbs_ok;
    strcpy(n.link_layer, "InfiniBand");
    n.numa_node = -1;
    return n;
}

/* mlx5_0:1 active, mlx5_1:1 down, mlx5_2 ports 1 and 2 active, mlx5_3:1
 * active but not opened through verbs, mlx5_10:1 init, mlx5_11:1 active. */
static void test_mixed(void **state)
{
    (void)state;
    kvd_nic_t nics[] = {
        port_of("mlx5_0", 1, "active", true),  port_of("mlx5_1", 1, "down", true),
        port_of("mlx5_2", 1, "active", true),  port_of("mlx5_2", 2, "active", true),
        port_of("mlx5_3", 1, "active", false), port_of("mlx5_10", 1, "init", true),
        port_of("mlx5_11", 1, "active", true),
    };
    char buf[256];
    int n = kvd_nics_ucx_devices(nics, KVD_ARRAY_SIZE(nics), buf, sizeof(buf));
    assert_int_equal(n, 4);
    assert_string_equal(buf, "mlx5_0:1,mlx5_2:1,mlx5_2:2,mlx5_11:1");
}

static void test_one_port(void **state)
{
    (void)state;
    kvd_nic_t nics[] = {port_of("rocep1s0f0", 1, "active", true)};
    char buf[64];
    assert_int_equal(kvd_nics_ucx_devices(nics, 1, buf, sizeof(buf)), 1);
    assert_string_equal(buf, "rocep1s0f0:1");
}

static void test_none_active(void **state)
{
    (void)state;
    kvd_nic_t nics[] = {port_of("mlx5_0", 1, "down", true),
                        port_of("mlx5_1", 1, "armed", true),
                        port_of("mlx5_2", 1, "active", false)};
    char buf[64];
    memset(buf, 'x', sizeof(buf));
    assert_int_equal(kvd_nics_ucx_devices(nics, KVD_ARRAY_SIZE(nics), buf, sizeof(buf)),
                     0);
    assert_string_equal(buf, "");
    memset(buf, 'x', sizeof(buf));
    assert_int_equal(kvd_nics_ucx_devices(NULL, 0, buf, sizeof(buf)), 0);
    assert_string_equal(buf, "");
}

/* "mlx5_0:1,mlx5_1:1" is 17 characters: 18 bytes fit, 17 do not. */
static void test_buffer_bounds(void **state)
{
    (void)state;
    kvd_nic_t nics[] = {port_of("mlx5_0", 1, "active", true),
                        port_of("mlx5_1", 1, "active", true)};
    char buf[18];
    assert_int_equal(kvd_nics_ucx_devices(nics, 2, buf, 18), 2);
    assert_string_equal(buf, "mlx5_0:1,mlx5_1:1");
    memset(buf, 'x', sizeof(buf));
    assert_int_equal(kvd_nics_ucx_devices(nics, 2, buf, 17), KVD_ERR_TOO_LARGE);
    assert_string_equal(buf, "");
    memset(buf, 'x', sizeof(buf));
    assert_int_equal(kvd_nics_ucx_devices(nics, 2, buf, 1), KVD_ERR_TOO_LARGE);
    assert_string_equal(buf, "");
    assert_int_equal(kvd_nics_ucx_devices(nics, 2, buf, 0), KVD_ERR_INVALID);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mixed),
        cmocka_unit_test(test_one_port),
        cmocka_unit_test(test_none_active),
        cmocka_unit_test(test_buffer_bounds),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
