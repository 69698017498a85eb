/*
 * Description: NIC discovery from a hand-made /sys/class/infiniband tree
 * (kvd_nics_discover_sysfs, what kvdockd falls back to for a device verbs
 * cannot open) and the --list-nics table (kvd_nics_print). Every port
 * directory gives one row, sorted by device in version order (mlx5_2 before
 * mlx5_10) then port; "4: ACTIVE" reads as state "active" and active; the
 * netdev comes from gid_attrs/ndevs/0, else from device/net/<if>/dev_port
 * = port - 1; the NUMA node from device/numa_node (-1 when absent); the GID
 * prints in the short IPv6 form. No row is verbs_ok, so none is suggested
 * for UCX_NET_DEVICES. A missing root is no devices, not an error.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "daemon_testing.h"

static char root[64];

/* Writes text to root/rel, making the directories on the way. */
static void put(const char *rel, const char *text)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/%s", root, rel);
    for (char *p = path + strlen(root) + 1; (p = strchr(p, '/')) != NULL; p++) {
        *p = '\0';
        mkdir(path, 0755);
        *p = '/';
    }
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static int setup(void **state)
{
    (void)state;
    strcpy(root, "/tmp/kvd-nics-sysfs-XXXXXX");
    if (mkdtemp(root) == NULL)
        return -1;
    /* an InfiniBand port with IPoIB: netdev through device/net */
    put("mlx5_0/device/numa_node", "1\n");
    put("mlx5_0/device/net/ib0/dev_port", "0\n");
    put("mlx5_0/ports/1/state", "4: ACTIVE\n");
    put("mlx5_0/ports/1/link_layer", "InfiniBand\n");
    put("mlx5_0/ports/1/rate", "200 Gb/sec (4X HDR)\n");
    put("mlx5_0/ports/1/gids/0", "fe80:0000:0000:0000:ba59:9f03:000c:0001\n");
    /* a dual-port RoCE device: port 1 names its netdev through GID 0,
     * port 2 does not and is found by dev_port 1 */
    put("mlx5_10/device/numa_node", "-1\n");
    put("mlx5_10/device/net/enp1s0f1np1/dev_port", "0\n");
    put("mlx5_10/device/net/enp1s0f1np2/dev_port", "1\n");
    put("mlx5_10/ports/1/state", "1: DOWN\n");
    put("mlx5_10/ports/1/link_layer", "Ethernet\n");
    put("mlx5_10/ports/1/gids/0", "fe80:0000:0000:0000:0000:0000:0000:0001\n");
    put("mlx5_10/ports/1/gid_attrs/ndevs/0", "enp1s0f1np1\n");
    put("mlx5_10/ports/2/state", "4: ACTIVE\n");
    put("mlx5_10/ports/2/link_layer", "Ethernet\n");
    /* a port with little to say */
    put("mlx5_2/ports/1/state", "2: INIT\n");
    return 0;
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

static int teardown(void **state)
{
    (void)state;
    return nftw(root, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

static void assert_port(const kvd_nic_t *n, const char *dev, uint32_t port,
                        const char *st, bool active, const char *link, const char *gid,
                        int numa, const char *netdev)
{
    assert_string_equal(n->device, dev);
    assert_int_equal(n->port, port);
    assert_string_equal(n->state, st);
    assert_int_equal(n->active, active);
    assert_false(n->verbs_ok);
    assert_string_equal(n->link_layer, link);
    assert_string_equal(n->gid, gid);
    assert_int_equal(n->numa_node, numa);
    assert_string_equal(n->netdev, netdev);
    assert_int_equal(n->active_mtu_bytes, 0);
}

static void test_discover(void **state)
{
    (void)state;
    kvd_nic_list_t l;
    assert_int_equal(kvd_nics_discover_sysfs(root, &l), KVD_OK);
    assert_int_equal(l.n, 4);
    assert_port(&l.nics[0], "mlx5_0", 1, "active", true, "InfiniBand",
                "fe80::ba59:9f03:c:1", 1, "ib0");
    assert_string_equal(l.nics[0].rate, "200 Gb/sec (4X HDR)");
    assert_port(&l.nics[1], "mlx5_2", 1, "init", false, "unknown", "", -1, "");
    assert_port(&l.nics[2], "mlx5_10", 1, "down", false, "Ethernet", "fe80::1", -1,
                "enp1s0f1np1");
    assert_port(&l.nics[3], "mlx5_10", 2, "active", true, "Ethernet", "", -1,
                "enp1s0f1np2");

    char buf[64];
    assert_int_equal(kvd_nics_ucx_devices(l.nics, l.n, buf, sizeof(buf)), 0);
    assert_string_equal(buf, "");
    kvd_nics_free(&l);
    assert_null(l.nics);
    assert_int_equal(l.n, 0);
    kvd_nics_free(&l); /* twice is fine */
}

static size_t count(const char *text, const char *needle)
{
    size_t n = 0;
    for (const char *p = text; (p = strstr(p, needle)) != NULL; p += strlen(needle))
        n++;
    return n;
}

/* What kvd_nics_print writes for l (free it). */
static char *printed(const kvd_nic_list_t *l)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    assert_non_null(f);
    assert_int_equal(kvd_nics_print(f, l), KVD_OK);
    fclose(f);
    return text;
}

static void test_print(void **state)
{
    (void)state;
    kvd_nic_list_t l;
    assert_int_equal(kvd_nics_discover_sysfs(root, &l), KVD_OK);
    char *text = printed(&l);
    /* header, 4 rows, 4 notes, an empty line, the UCX line */
    assert_int_equal(count(text, "\n"), 11);
    assert_non_null(strstr(text, "DEVICE"));
    assert_non_null(strstr(text, "\nmlx5_0 "));
    assert_non_null(strstr(text, "\nmlx5_2 "));
    assert_int_equal(count(text, "\nmlx5_10 "), 2);
    assert_int_equal(count(text, "note: "), 4);
    assert_non_null(strstr(text, "no active RDMA port"));
    assert_null(strstr(text, "UCX_NET_DEVICES="));
    free(text);
    kvd_nics_free(&l);
}

static void test_missing_root(void **state)
{
    (void)state;
    char missing[128];
    snprintf(missing, sizeof(missing), "%s/absent", root);
    kvd_nic_list_t l;
    assert_int_equal(kvd_nics_discover_sysfs(missing, &l), KVD_OK);
    assert_int_equal(l.n, 0);
    char *text = printed(&l);
    assert_non_null(strstr(text, "no RDMA devices"));
    assert_non_null(strstr(text, "TCP and shared memory"));
    free(text);
    kvd_nics_free(&l);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_discover),
        cmocka_unit_test(test_print),
        cmocka_unit_test(test_missing_root),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
