/*
 * Description: NIC discovery from outside, right on hosts with and without
 * RDMA devices, with /sys/class/infiniband/<dev>/ports/<p> as the truth:
 * `kvdockd --list-nics` exits 0 and prints one table row per such port (and
 * a UCX_NET_DEVICES line or says no port is active), or, with none, says
 * there are no RDMA devices and that UCX will use TCP and shared memory; a
 * running daemon's Stats reply carries one Nic per port, with the device and
 * port sysfs names; `kvdock stats` has a "nics:" section ("no RDMA devices"
 * when none) and `stats --json` a "nics" array of the same length. Built
 * without libibverbs: --list-nics says so and exits 1, Stats has no nics.
 */
#include "dtest.h"
#include "kvd_config.h"

#include <glob.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char out[1 << 16];

/* The ports the kernel lists, as "DEVICE PORT" strings. */
typedef struct sysfs_ports {
    size_t n;
    char names[256][96];
} sysfs_ports_t;

static void sysfs_ports_read(sysfs_ports_t *p)
{
    p->n = 0;
    glob_t g;
    if (glob("/sys/class/infiniband/*/ports/*", 0, NULL, &g) != 0)
        return;
    for (size_t i = 0; i < g.gl_pathc && p->n < KVD_ARRAY_SIZE(p->names); i++) {
        char dev[64], port[16];
        if (sscanf(g.gl_pathv[i], "/sys/class/infiniband/%63[^/]/ports/%15s", dev,
                   port) == 2)
            snprintf(p->names[p->n++], sizeof(p->names[0]), "%s %s", dev, port);
    }
    globfree(&g);
}

static bool sysfs_has(const sysfs_ports_t *p, const char *dev, unsigned port)
{
    char want[96];
    snprintf(want, sizeof(want), "%s %u", dev, port);
    for (size_t i = 0; i < p->n; i++)
        if (strcmp(p->names[i], want) == 0)
            return true;
    return false;
}

/* The rows of the --list-nics table: the lines after the "DEVICE" header
 * up to the first note or the UCX_NET_DEVICES line. Each must name a sysfs
 * port. */
static size_t table_rows(char *text, const sysfs_ports_t *p)
{
    char *header = strstr(text, "DEVICE");
    if (!DT_CHECK(header != NULL, "--list-nics: no table header:\n%s", text))
        return 0;
    size_t rows = 0;
    char *rest = strchr(header, '\n');
    if (!DT_CHECK(rest != NULL, "--list-nics: nothing after the header:\n%s", text))
        return 0;
    char *save = NULL;
    char *line = strtok_r(rest, "\n", &save);
    for (; line != NULL; line = strtok_r(NULL, "\n", &save)) {
        char dev[64];
        unsigned port;
        if (strncmp(line, "note:", 5) == 0 ||
            strncmp(line, "UCX_NET_DEVICES=", 16) == 0 ||
            strncmp(line, "no active", 9) == 0)
            break;
        if (!DT_CHECK(sscanf(line, "%63s %u", dev, &port) == 2,
                      "--list-nics: a row without device and port: '%s'", line))
            continue;
        DT_CHECK(sysfs_has(p, dev, port),
                 "--list-nics: row '%s' names no port of /sys/class/infiniband", line);
        rows++;
    }
    return rows;
}

static void check_list_nics(const sysfs_ports_t *p)
{
    char *argv[] = {(char *)kvd_test_bin("kvdockd"), "--list-nics", NULL};
    int rc = kvd_test_run(argv, out, sizeof(out), 20000);
    if (!KVD_HAVE_VERBS) {
        DT_CHECK(rc == 1, "kvdockd --list-nics without libibverbs: exit %d, want 1", rc);
        DT_CHECK(strstr(out, "built without libibverbs") != NULL,
                 "kvdockd --list-nics should say it was built without libibverbs: '%s'",
                 out);
        return;
    }
    DT_CHECK(rc == 0, "kvdockd --list-nics: exit %d, want 0", rc);
    if (p->n == 0) {
        DT_CHECK(strstr(out, "no RDMA devices") != NULL &&
                     strstr(out, "TCP and shared memory") != NULL,
                 "kvdockd --list-nics on a host without RDMA devices should say so and "
                 "that UCX uses TCP and shared memory: '%s'",
                 out);
        DT_CHECK(strstr(out, "DEVICE") == NULL, "no table expected: '%s'", out);
        return;
    }
    DT_CHECK(strstr(out, "UCX_NET_DEVICES=") != NULL ||
                 strstr(out, "no active RDMA port") != NULL,
             "--list-nics: no UCX_NET_DEVICES line nor 'no active RDMA port':\n%s", out);
    char copy[sizeof(out)];
    memcpy(copy, out, sizeof(copy));
    size_t rows = table_rows(copy, p);
    DT_CHECK(rows == p->n,
             "--list-nics: %zu table rows, /sys/class/infiniband has %zu ports", rows,
             p->n);
}

/* Stats on the daemon's socket: one Nic per sysfs port. */
static void check_stats_rpc(const kvd_test_daemon_t *d, const sysfs_ports_t *p)
{
    kvd_client_t *c = dt_connect(d->socket, true);
    if (c == NULL)
        return;
    kvd_msg_t *req = calloc(2, sizeof(kvd_msg_t));
    if (!DT_CHECK(req != NULL, "out of memory")) {
        kvd_client_close(c);
        return;
    }
    kvd_msg_t *rep = req + 1;
    kvd_msg_request(req, 0, KVD_METHOD_STATS);
    int rc = kvd_client_call(c, req, rep, 5000);
    if (DT_CHECK(rc == KVD_OK && rep->status == KVD_OK, "Stats: %s / %d",
                 kvd_status_str(rc), rep->status)) {
        const kvd_stats_rep_t *st = &rep->body.stats_rep;
        size_t want = KVD_HAVE_VERBS ? p->n : 0;
        DT_CHECK(st->n_nics == want, "Stats: %zu nics, want %zu (ports in sysfs: %zu)",
                 st->n_nics, want, p->n);
        for (size_t i = 0; i < st->n_nics; i++) {
            const kvd_nic_msg_t *n = &st->nics[i];
            DT_CHECK(sysfs_has(p, n->device, n->port),
                     "Stats: nic %s port %u is no port of /sys/class/infiniband",
                     n->device, n->port);
            DT_CHECK(n->state[0] != '\0' && n->link_layer[0] != '\0',
                     "Stats: nic %s port %u without state or link layer", n->device,
                     n->port);
        }
    }
    kvd_msg_clear(rep);
    free(req);
    kvd_client_close(c);
}

static void check_stats_cli(const kvd_test_daemon_t *d, const sysfs_ports_t *p)
{
    size_t want = KVD_HAVE_VERBS ? p->n : 0;
    int rc =
        dt_cli(out, sizeof(out), (const char *[]){"--socket", d->socket, "stats", NULL});
    DT_CHECK(rc == 0, "kvdock stats: exit %d", rc);
    DT_CHECK(strstr(out, "\nnics:") != NULL, "kvdock stats: no 'nics:' section:\n%s",
             out);
    if (want == 0)
        DT_CHECK(strstr(out, "nics: no RDMA devices") != NULL,
                 "kvdock stats: want 'nics: no RDMA devices':\n%s", out);

    rc = dt_cli(out, sizeof(out),
                (const char *[]){"--socket", d->socket, "stats", "--json", NULL});
    DT_CHECK(rc == 0 && dt_json_valid(out), "kvdock stats --json: exit %d, '%s'", rc,
             out);
    const char *nics = strstr(out, "\"nics\":[");
    if (!DT_CHECK(nics != NULL, "stats --json: no \"nics\" array: '%s'", out))
        return;
    size_t entries = 0;
    for (const char *q = nics; (q = strstr(q, "\"device\":")) != NULL; q++)
        entries++;
    DT_CHECK(entries == want, "stats --json: %zu nics, want %zu", entries, want);
}

int main(void)
{
    sysfs_ports_t *ports = calloc(1, sizeof(*ports));
    if (ports == NULL)
        return 1;
    sysfs_ports_read(ports);
    printf("/sys/class/infiniband lists %zu ports; built %s libibverbs\n", ports->n,
           KVD_HAVE_VERBS ? "with" : "without");
    check_list_nics(ports);
    kvd_test_daemon_t d;
    if (dt_start(&d, NULL) == 0) {
        check_stats_rpc(&d, ports);
        check_stats_cli(&d, ports);
    }
    dt_stop(&d, SIGTERM, 10000);
    free(ports);
    return dt_exit_status("daemon/list_nics");
}
