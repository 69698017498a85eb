/*
 * Description: where the UCX server listens and when it may offer RMA, as
 * pure rules (ucxd.h, kvd_transport.h).
 *
 * kvd_ucxd_net_devices: without --listen the network interfaces are the
 * loopback one ("lo" on Linux); --listen 127.0.0.1:P or localhost:P is lo
 * too; 0.0.0.0:P and [::]:P leave UCX's own choice (""); a host that is on
 * no interface here (198.51.100.7, TEST-NET-2) is refused. RDMA ports
 * follow the interfaces: when the operator set UCX_NET_DEVICES (not "all"),
 * its entries of the form DEVICE:PORT (none if it names only interfaces;
 * its interface names that --listen does not name are dropped), else the
 * active ports found. A buffer too
 * small gives KVD_ERR_TOO_LARGE.
 *
 * kvd_ucx_tl_enforces_rma: rc_verbs, rc_mlx5, dc_mlx5 and self; not tcp,
 * the shared-memory ones, nor ud (software put), nor a prefix of a name.
 * Skips (77) without a loopback interface named lo.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <net/if.h>
#include <stdio.h>
#include <string.h>

#include "kvd_transport.h"
#include "ucxd.h"

static char out[512];

static void expect(const char *listen, const char *env, const char *ports, int rc,
                   const char *want)
{
    memset(out, 'x', sizeof(out) - 1);
    out[sizeof(out) - 1] = '\0';
    int got = kvd_ucxd_net_devices(listen, env, ports, out, sizeof(out));
    print_message("listen '%s' env '%s' ports '%s': %d '%s'\n", listen ? listen : "",
                  env ? env : "(unset)", ports ? ports : "", got, out);
    assert_int_equal(got, rc);
    if (rc == KVD_OK)
        assert_string_equal(out, want);
}

static void test_interfaces(void **state)
{
    (void)state;
    expect("", NULL, "", KVD_OK, "lo");
    expect(NULL, NULL, NULL, KVD_OK, "lo");
    expect("127.0.0.1:7000", NULL, "", KVD_OK, "lo");
    expect("localhost:7000", NULL, "", KVD_OK, "lo");
    expect("0.0.0.0:7000", NULL, "mlx5_0:1", KVD_OK, "");
    expect("[::]:7000", "eth0", "", KVD_OK, "");
    expect("198.51.100.7:7000", NULL, "", KVD_ERR_INVALID, "");
    expect("no-port", NULL, "", KVD_ERR_INVALID, "");
}

static void test_rdma_ports(void **state)
{
    (void)state;
    /* the active ports found, when the operator names none */
    expect("", NULL, "mlx5_0:1,mlx5_2:1", KVD_OK, "lo,mlx5_0:1,mlx5_2:1");
    expect("", "all", "mlx5_0:1", KVD_OK, "lo,mlx5_0:1");
    /* the operator's ports instead; its interfaces only where --listen is */
    expect("", "mlx5_3:1,eth7", "mlx5_0:1", KVD_OK, "lo,mlx5_3:1");
    expect("", "lo,mlx5_3:1", "", KVD_OK, "lo,mlx5_3:1");
    expect("", "eth7", "mlx5_0:1", KVD_OK, "lo");
    /* too small */
    char small[3];
    assert_int_equal(kvd_ucxd_net_devices("", NULL, "mlx5_0:1", small, sizeof(small)),
                     KVD_ERR_TOO_LARGE);
    assert_string_equal(small, "");
}

static void test_rma_transports(void **state)
{
    (void)state;
    const char *yes[] = {"rc_verbs", "rc_mlx5", "dc_mlx5", "self"};
    const char *no[] = {"tcp",      "posix",   "sysv", "cma", "knem", "xpmem",
                        "ud_verbs", "ud_mlx5", "rc",   "rc_", "",     "rc_mlx5x"};
    for (size_t i = 0; i < sizeof(yes) / sizeof(yes[0]); i++)
        assert_true(kvd_ucx_tl_enforces_rma(yes[i]));
    for (size_t i = 0; i < sizeof(no) / sizeof(no[0]); i++)
        assert_false(kvd_ucx_tl_enforces_rma(no[i]));
}

int main(void)
{
    if (if_nametoindex("lo") == 0) {
        printf("SKIP: no loopback interface named lo\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_interfaces),
        cmocka_unit_test(test_rdma_ports),
        cmocka_unit_test(test_rma_transports),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
