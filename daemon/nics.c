/*
 * nics.c - RDMA NIC discovery (see nics.h).
 *
 * libibverbs lists the devices and, per port, the state, link layer, MTU,
 * rate and GID 0; sysfs (/sys/class/infiniband/<dev>) adds the NUMA node
 * and the netdev, and stands in for verbs where a device cannot be opened or
 * is not listed by it (ib_uverbs not loaded, no /dev/infiniband), so every
 * port the kernel knows gets a row. The list ends sorted by device (in
 * version order: mlx5_2 before mlx5_10), then port.
 *
 * Invariants: a list owns `cap` entries (charged to KVD_MEM_OTHER), `n` of
 * them used. Threading: none; each call works on its caller's list.
 */
#include "nics.h"
#include "daemon_testing.h"
#include "kvd_config.h"

#if KVD_HAVE_VERBS
#include <infiniband/verbs.h>
#endif

#include <arpa/inet.h>
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#define SYSFS_IB "/sys/class/infiniband"

/* ------------------------------------------------------------- the list */

void kvd_nics_free(kvd_nic_list_t *l)
{
    kvd_mem_free(KVD_MEM_OTHER, l->nics, l->cap * sizeof(*l->nics));
    memset(l, 0, sizeof(*l));
}

/* Appends a port with nothing known yet; NULL when out of memory. */
static kvd_nic_t *list_add(kvd_nic_list_t *l, const char *device, uint32_t port)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 8;
        kvd_nic_t *v = kvd_mem_realloc(KVD_MEM_OTHER, l->nics, l->cap * sizeof(*v),
                                       cap * sizeof(*v));
        if (v == NULL) {
            KVD_ERROR("nics", "out of memory listing %zu RDMA ports", cap);
            return NULL;
        }
        l->nics = v;
        l->cap = cap;
    }
    kvd_nic_t *nic = &l->nics[l->n++];
    memset(nic, 0, sizeof(*nic));
    kvd_strlcpy(nic->device, device, sizeof(nic->device));
    nic->port = port;
    nic->numa_node = -1;
    return nic;
}

static bool list_has_device(const kvd_nic_list_t *l, const char *device)
{
    for (size_t i = 0; i < l->n; i++)
        if (strcmp(l->nics[i].device, device) == 0)
            return true;
    return false;
}

static int nic_order(const void *a, const void *b)
{
    const kvd_nic_t *x = a, *y = b;
    int c = strverscmp(x->device, y->device);
    if (c != 0)
        return c;
    return x->port < y->port ? -1 : x->port > y->port;
}

/* ---------------------------------------------------------------- sysfs */

/* Reads the first line of a file, without its newline, into buf. Returns
 * KVD_OK, or the failure as a status (buf is then ""). */
static int sysfs_read_line(const char *path, char *buf, size_t len)
{
    buf[0] = '\0';
    FILE *f = fopen(path, "re");
    if (f == NULL) {
        int err = errno;
        if (err != ENOENT) /* an attribute a device lacks is no news */
            KVD_DEBUG("nics", "%s: %s", path, strerror(err));
        return kvd_status_from_errno(err);
    }
    int rc = KVD_OK;
    if (fgets(buf, (int)len, f) == NULL) {
        int err = errno;
        if (ferror(f))
            KVD_DEBUG("nics", "reading %s: %s", path, strerror(err));
        rc = ferror(f) ? kvd_status_from_errno(err) : KVD_ERR_NOT_FOUND;
        buf[0] = '\0';
    }
    fclose(f);
    buf[strcspn(buf, "\n")] = '\0';
    return rc;
}

/* The device's NUMA node, or -1 when sysfs does not say. */
static int sysfs_numa_node(const char *root, const char *dev)
{
    char path[PATH_MAX], buf[32];
    snprintf(path, sizeof(path), "%s/%s/device/numa_node", root, dev);
    if (sysfs_read_line(path, buf, sizeof(buf)) != KVD_OK)
        return -1;
    char *end;
    long v = strtol(buf, &end, 10);
    return end != buf && v >= -1 && v < 65536 ? (int)v : -1;
}

/* The port's netdev: the one behind GID 0 (RoCE), else the device's
 * network interface whose dev_port is port - 1 (IPoIB), else, when no
 * interface says its port, the first by name. "" when there is none. */
static void sysfs_netdev(const char *root, const char *dev, uint32_t port, char *out,
                         size_t len)
{
    char path[PATH_MAX], buf[32];
    snprintf(path, sizeof(path), "%s/%s/ports/%u/gid_attrs/ndevs/0", root, dev, port);
    if (sysfs_read_line(path, out, len) == KVD_OK && out[0] != '\0')
        return;
    out[0] = '\0';
    snprintf(path, sizeof(path), "%s/%s/device/net", root, dev);
    DIR *d = opendir(path);
    if (d == NULL)
        return;
    char first[KVD_NIC_NETDEV_BYTES] = "";
    bool any_dev_port = false;
    size_t dir_len = strlen(path);
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        if (e->d_name[0] == '.')
            continue;
        snprintf(path + dir_len, sizeof(path) - dir_len, "/%s/dev_port", e->d_name);
        if (sysfs_read_line(path, buf, sizeof(buf)) == KVD_OK) {
            any_dev_port = true;
            if (strtoul(buf, NULL, 10) == port - 1) {
                kvd_strlcpy(out, e->d_name, len);
                break;
            }
        }
        if (first[0] == '\0' || strcmp(e->d_name, first) < 0)
            kvd_strlcpy(first, e->d_name, sizeof(first));
    }
    closedir(d);
    if (out[0] == '\0' && !any_dev_port)
        kvd_strlcpy(out, first, len);
}

/* A GID as sysfs writes it (8 groups of 4 hex digits) in the short IPv6
 * form that inet_ntop writes for verbs' GIDs. */
static void gid_from_text(const char *text, char *out, size_t len)
{
    unsigned char raw[16];
    out[0] = '\0';
    if (inet_pton(AF_INET6, text, raw) == 1)
        inet_ntop(AF_INET6, raw, out, (socklen_t)len);
}

static int port_name_filter(const struct dirent *e)
{
    if (e->d_name[0] == '\0')
        return 0;
    for (const char *p = e->d_name; *p; p++)
        if (!isdigit((unsigned char)*p))
            return 0;
    return 1;
}

/* Fills what sysfs knows of a port that verbs could not query: state
 * ("4: ACTIVE" -> "active"), link layer, rate, GID 0. */
static void sysfs_port_fill(const char *root, kvd_nic_t *nic)
{
    char path[PATH_MAX], buf[128];
    int n = snprintf(path, sizeof(path), "%s/%s/ports/%u/", root, nic->device, nic->port);
    if (n < 0 || (size_t)n >= sizeof(path))
        return;
    size_t dir_len = (size_t)n;
    kvd_strlcpy(path + dir_len, "state", sizeof(path) - dir_len);
    sysfs_read_line(path, buf, sizeof(buf));
    const char *colon = strchr(buf, ':');
    const char *state = colon ? colon + 1 : buf;
    while (*state == ' ')
        state++;
    kvd_strlcpy(nic->state, *state ? state : "unknown", sizeof(nic->state));
    for (char *p = nic->state; *p; p++)
        *p = (char)tolower((unsigned char)*p);
    nic->active = strtol(buf, NULL, 10) == 4; /* IB_PORT_ACTIVE */
    kvd_strlcpy(path + dir_len, "link_layer", sizeof(path) - dir_len);
    sysfs_read_line(path, buf, sizeof(buf));
    kvd_strlcpy(nic->link_layer, buf[0] ? buf : "unknown", sizeof(nic->link_layer));
    kvd_strlcpy(path + dir_len, "rate", sizeof(path) - dir_len);
    sysfs_read_line(path, nic->rate, sizeof(nic->rate));
    kvd_strlcpy(path + dir_len, "gids/0", sizeof(path) - dir_len);
    if (sysfs_read_line(path, buf, sizeof(buf)) == KVD_OK)
        gid_from_text(buf, nic->gid, sizeof(nic->gid));
}

/* Adds a row per port of `dev` from sysfs alone. */
static int sysfs_add_device(const char *root, const char *dev, kvd_nic_list_t *l)
{
    char path[PATH_MAX];
    snprintf(path, sizeof(path), "%s/%s/ports", root, dev);
    struct dirent **ports = NULL;
    int n = scandir(path, &ports, port_name_filter, versionsort);
    if (n < 0) {
        KVD_WARN("nics", "%s: cannot list its ports in %s: %s", dev, path,
                 strerror(errno));
        return KVD_OK;
    }
    int rc = KVD_OK;
    for (int i = 0; i < n; i++) {
        kvd_nic_t *nic =
            rc == KVD_OK ? list_add(l, dev, (uint32_t)strtoul(ports[i]->d_name, NULL, 10))
                         : NULL;
        if (nic != NULL) {
            nic->numa_node = sysfs_numa_node(root, dev);
            sysfs_netdev(root, dev, nic->port, nic->netdev, sizeof(nic->netdev));
            sysfs_port_fill(root, nic);
        } else {
            rc = KVD_ERR_NOMEM;
        }
        free(ports[i]);
    }
    free(ports);
    return rc;
}

/* Adds the devices below root that l does not hold yet; with
 * after_verbs, warns that verbs did not list them. */
static int sysfs_add_unlisted(const char *root, kvd_nic_list_t *l, bool after_verbs)
{
    struct dirent **devs = NULL;
    int n = scandir(root, &devs, NULL, versionsort);
    if (n < 0)
        return KVD_OK; /* no RDMA devices at all */
    int rc = KVD_OK;
    for (int i = 0; i < n; i++) {
        const char *dev = devs[i]->d_name;
        if (rc == KVD_OK && dev[0] != '.' && !list_has_device(l, dev)) {
            if (after_verbs)
                KVD_WARN("nics",
                         "%s: in %s but not listed by libibverbs (is ib_uverbs "
                         "loaded?); reporting it from sysfs",
                         dev, root);
            rc = sysfs_add_device(root, dev, l);
        }
        free(devs[i]);
    }
    free(devs);
    return rc;
}

/* Sorts a finished list, or frees it when discovery failed. */
static int list_finish(kvd_nic_list_t *l, int rc)
{
    if (rc != KVD_OK) {
        kvd_nics_free(l);
        return rc;
    }
    if (l->n > 1)
        qsort(l->nics, l->n, sizeof(*l->nics), nic_order);
    return KVD_OK;
}

int kvd_nics_discover_sysfs(const char *root, kvd_nic_list_t *out)
{
    memset(out, 0, sizeof(*out));
    return list_finish(out, sysfs_add_unlisted(root, out, false));
}

/* ---------------------------------------------------------------- verbs */

#if KVD_HAVE_VERBS

static const char *link_layer_name(uint8_t link_layer)
{
    switch (link_layer) {
    /* unspecified: kernels from before RoCE, where every port was IB */
    case IBV_LINK_LAYER_UNSPECIFIED:
    case IBV_LINK_LAYER_INFINIBAND: return "InfiniBand";
    case IBV_LINK_LAYER_ETHERNET: return "Ethernet";
    default: return "unknown";
    }
}

/* "200 Gb/s (4x HDR)" from the port's width and speed codes; "" for codes
 * this table does not know. Rates are the nominal per-lane ones. */
static void verbs_rate(uint8_t width, uint8_t speed, char *out, size_t len)
{
    static const struct {
        uint8_t code;
        unsigned lanes;
    } widths[] = {{1, 1}, {2, 4}, {4, 8}, {8, 12}, {16, 2}};
    static const struct {
        uint8_t code;
        double lane_gbps;
        const char *name;
    } speeds[] = {{1, 2.5, "SDR"}, {2, 5, "DDR"},   {4, 10, "QDR"},  {8, 10, "FDR10"},
                  {16, 14, "FDR"}, {32, 25, "EDR"}, {64, 50, "HDR"}, {128, 100, "NDR"}};
    out[0] = '\0';
    for (size_t w = 0; w < KVD_ARRAY_SIZE(widths); w++)
        for (size_t s = 0; s < KVD_ARRAY_SIZE(speeds); s++)
            if (widths[w].code == width && speeds[s].code == speed)
                snprintf(out, len, "%g Gb/s (%ux %s)",
                         widths[w].lanes * speeds[s].lane_gbps, widths[w].lanes,
                         speeds[s].name);
}

/* Adds a row for one port of an open device. */
static int verbs_add_port(struct ibv_context *ctx, const char *dev, uint32_t port,
                          kvd_nic_list_t *l)
{
    kvd_nic_t *nic = list_add(l, dev, port);
    if (nic == NULL)
        return KVD_ERR_NOMEM;
    nic->numa_node = sysfs_numa_node(SYSFS_IB, dev);
    sysfs_netdev(SYSFS_IB, dev, port, nic->netdev, sizeof(nic->netdev));
    struct ibv_port_attr pa;
    int err = ibv_query_port(ctx, (uint8_t)port, &pa);
    if (err != 0) {
        KVD_WARN("nics", "%s port %u: ibv_query_port: %s", dev, port, strerror(err));
        kvd_strlcpy(nic->state, "unknown", sizeof(nic->state));
        kvd_strlcpy(nic->link_layer, "unknown", sizeof(nic->link_layer));
        return KVD_OK;
    }
    nic->verbs_ok = true;
    nic->active = pa.state == IBV_PORT_ACTIVE;
    kvd_strlcpy(nic->state, ibv_port_state_str(pa.state), sizeof(nic->state));
    kvd_strlcpy(nic->link_layer, link_layer_name(pa.link_layer), sizeof(nic->link_layer));
    if (pa.active_mtu >= IBV_MTU_256 && pa.active_mtu <= IBV_MTU_4096)
        nic->active_mtu_bytes = 256u << (pa.active_mtu - IBV_MTU_256);
    verbs_rate(pa.active_width, pa.active_speed, nic->rate, sizeof(nic->rate));
    union ibv_gid gid;
    if (ibv_query_gid(ctx, (uint8_t)port, 0, &gid) == 0)
        inet_ntop(AF_INET6, gid.raw, nic->gid, sizeof(nic->gid));
    return KVD_OK;
}

/* Adds a row per port of dev. KVD_ERR_UNAVAILABLE (nothing added) when the
 * device cannot be opened or queried; KVD_ERR_NOMEM. */
static int verbs_add_device(struct ibv_device *dev, kvd_nic_list_t *l)
{
    const char *name = ibv_get_device_name(dev);
    struct ibv_context *ctx = ibv_open_device(dev);
    if (ctx == NULL) {
        KVD_WARN("nics", "%s: libibverbs cannot open it (%s); reporting it from sysfs",
                 name, strerror(errno));
        return KVD_ERR_UNAVAILABLE;
    }
    struct ibv_device_attr attr;
    int err = ibv_query_device(ctx, &attr);
    if (err != 0) {
        KVD_WARN("nics", "%s: ibv_query_device: %s; reporting it from sysfs", name,
                 strerror(err));
        ibv_close_device(ctx);
        return KVD_ERR_UNAVAILABLE;
    }
    int rc = KVD_OK;
    for (uint32_t p = 1; p <= attr.phys_port_cnt && rc == KVD_OK; p++)
        rc = verbs_add_port(ctx, name, p, l);
    ibv_close_device(ctx);
    return rc;
}
#endif /* KVD_HAVE_VERBS */

int kvd_nics_discover(kvd_nic_list_t *out)
{
    memset(out, 0, sizeof(*out));
#if KVD_HAVE_VERBS
    int n = 0;
    struct ibv_device **devs = ibv_get_device_list(&n);
    if (devs == NULL) {
        /* ENOSYS: no RDMA subsystem in this kernel */
        KVD_DEBUG("nics", "ibv_get_device_list: %s", strerror(errno));
        n = 0;
    }
    int rc = KVD_OK;
    for (int i = 0; i < n && rc == KVD_OK; i++) {
        rc = verbs_add_device(devs[i], out);
        if (rc == KVD_ERR_UNAVAILABLE)
            rc = sysfs_add_device(SYSFS_IB, ibv_get_device_name(devs[i]), out);
    }
    if (devs != NULL)
        ibv_free_device_list(devs);
    if (rc == KVD_OK)
        rc = sysfs_add_unlisted(SYSFS_IB, out, true);
    return list_finish(out, rc);
#else
    return KVD_ERR_UNSUPPORTED;
#endif
}

/* ------------------------------------------------------------- reports */

int kvd_nics_ucx_devices(const kvd_nic_t *nics, size_t n, char *buf, size_t buf_len)
{
    if (buf_len == 0)
        return KVD_ERR_INVALID;
    buf[0] = '\0';
    size_t used = 0;
    int count = 0;
    for (size_t i = 0; i < n; i++) {
        if (!nics[i].active || !nics[i].verbs_ok)
            continue;
        int w = snprintf(buf + used, buf_len - used, "%s%s:%u", count ? "," : "",
                         nics[i].device, nics[i].port);
        if (w < 0 || (size_t)w >= buf_len - used) {
            buf[0] = '\0';
            return KVD_ERR_TOO_LARGE;
        }
        used += (size_t)w;
        count++;
    }
    return count;
}

int kvd_nics_to_msg(const kvd_nic_list_t *l, kvd_msg_t *m, kvd_nic_msg_t **out, size_t *n)
{
    *out = NULL;
    *n = 0;
    if (l->n == 0)
        return KVD_OK;
    kvd_nic_msg_t *v = kvd_msg_alloc(m, l->n * sizeof(*v));
    if (v == NULL)
        return KVD_ERR_NOMEM;
    for (size_t i = 0; i < l->n; i++) {
        const kvd_nic_t *s = &l->nics[i];
        kvd_strlcpy(v[i].device, s->device, sizeof(v[i].device));
        v[i].port = s->port;
        kvd_strlcpy(v[i].state, s->state, sizeof(v[i].state));
        kvd_strlcpy(v[i].link_layer, s->link_layer, sizeof(v[i].link_layer));
        kvd_strlcpy(v[i].gid, s->gid, sizeof(v[i].gid));
        v[i].numa_node = s->numa_node;
        kvd_strlcpy(v[i].netdev, s->netdev, sizeof(v[i].netdev));
        v[i].active_mtu = s->active_mtu_bytes;
    }
    *out = v;
    *n = l->n;
    return KVD_OK;
}

static const char *or_dash(const char *s)
{
    return s[0] ? s : "-";
}

/* The table of --list-nics: a header, one line per port, then a note per
 * port that verbs could not open. */
static void print_table(FILE *f, const kvd_nic_list_t *l)
{
    int dev_w = 6;
    for (size_t i = 0; i < l->n; i++)
        dev_w = KVD_MAX(dev_w, (int)strlen(l->nics[i].device));
    fprintf(f, "%-*s %4s  %-12s %-10s %5s  %-20s %4s  %-16s %s\n", dev_w, "DEVICE",
            "PORT", "STATE", "LINK", "MTU", "RATE", "NUMA", "NETDEV", "GID");
    for (size_t i = 0; i < l->n; i++) {
        const kvd_nic_t *n = &l->nics[i];
        char mtu[16] = "-", numa[16] = "-";
        if (n->active_mtu_bytes)
            snprintf(mtu, sizeof(mtu), "%u", n->active_mtu_bytes);
        if (n->numa_node >= 0)
            snprintf(numa, sizeof(numa), "%d", n->numa_node);
        fprintf(f, "%-*s %4u  %-12s %-10s %5s  %-20s %4s  %-16s %s\n", dev_w, n->device,
                n->port, or_dash(n->state), or_dash(n->link_layer), mtu, or_dash(n->rate),
                numa, or_dash(n->netdev), or_dash(n->gid));
    }
    for (size_t i = 0; i < l->n; i++)
        if (!l->nics[i].verbs_ok)
            fprintf(f,
                    "note: %s port %u was not queried through libibverbs (read from "
                    "sysfs); it is left out of UCX_NET_DEVICES\n",
                    l->nics[i].device, l->nics[i].port);
}

int kvd_nics_print(FILE *f, const kvd_nic_list_t *l)
{
    if (l->n == 0) {
        fprintf(f, "no RDMA devices on this host: UCX will use TCP and shared memory\n");
        return KVD_OK;
    }
    print_table(f, l);
    /* every name fits: at most the name, ':', a 10-digit port and ',' each */
    size_t len = l->n * (KVD_NIC_NAME_BYTES + 12) + 1;
    char *ucx = malloc(len);
    int named = ucx ? kvd_nics_ucx_devices(l->nics, l->n, ucx, len) : KVD_ERR_NOMEM;
    if (named > 0)
        fprintf(f, "\nUCX_NET_DEVICES=%s\n", ucx);
    else if (named == 0)
        fprintf(f, "\nno active RDMA port usable through libibverbs: UCX will use TCP "
                   "and shared memory\n");
    free(ucx);
    return named >= 0 ? KVD_OK : named;
}

int kvd_nics_list_main(FILE *f)
{
    kvd_nic_list_t l;
    int rc = kvd_nics_discover(&l);
    if (rc == KVD_ERR_UNSUPPORTED) {
        fprintf(f, "kvdockd was built without libibverbs: it cannot list RDMA devices "
                   "(UCX may still use them; see ucx_info -d)\n");
        return 1;
    }
    if (rc == KVD_OK)
        rc = kvd_nics_print(f, &l);
    kvd_nics_free(&l);
    if (rc != KVD_OK) {
        fprintf(stderr, "kvdockd: cannot list RDMA devices: %s\n", kvd_status_str(rc));
        return 1;
    }
    return 0;
}
