/*
 * options.c - flags and config file of kvdockd, from one table.
 *
 * Every option exists as "--name VALUE" (or "--name=VALUE") and as a
 * "name = VALUE" line of the --config file; '#' starts a comment. The config
 * file is read first, so flags override it. Errors name the option and the
 * value that was wrong.
 */
#include "options.h"
#include "kvd_proto.h"

#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

typedef enum opt_type {
    OPT_STRING,
    OPT_SIZE,
    OPT_FRACTION,
    OPT_U64,
    OPT_BOOL,
    OPT_HOSTPORT,
    OPT_LOGLEVEL,
    OPT_INSTANCE,
} opt_type_t;

typedef struct opt_def {
    const char *name;
    opt_type_t type;
    size_t offset;
    size_t size; /* string capacity */
    uint64_t min, max;
    const char *arg;
    const char *help;
} opt_def_t;

#define OFF(f) offsetof(kvd_opts_t, f)
#define SZ(f)  sizeof(((kvd_opts_t *)0)->f)

static const opt_def_t opt_defs[] = {
    {"instance", OPT_INSTANCE, OFF(instance), SZ(instance), 0, 0, "NAME",
     "instance name: names the pool file and the default socket (default: default)"},
    {"socket", OPT_STRING, OFF(socket_path), SZ(socket_path), 0, 0, "PATH",
     "Unix socket to serve (default: $XDG_RUNTIME_DIR/kvdockd-NAME.sock, else "
     "/tmp/kvdockd-NAME.sock)"},
    {"listen", OPT_HOSTPORT, OFF(listen), SZ(listen), 0, 0, "HOST:PORT",
     "also serve RPC over TCP on this address (off unless given)"},
    {"ucx", OPT_STRING, OFF(ucx), SZ(ucx), 0, 0, "auto|on|off",
     "serve the pool to UCX workers over RDMA (rc/dc; TCP only with --ucx-tcp; "
     "UCX_TLS and UCX_NET_DEVICES choose); auto: when UCX starts (default auto)"},
    {"ucx-tcp", OPT_BOOL, OFF(ucx_tcp), 0, 0, 0, NULL,
     "also serve UCX over TCP (and UD): any host that reaches the UCX TCP port can "
     "write into the UCX server process; use it only on a network where every host "
     "is trusted"},
    {"no-ucx-sandbox", OPT_BOOL, OFF(no_ucx_sandbox), 0, 0, 0, NULL,
     "run the UCX server process without its seccomp filter (by default it may not "
     "run programs, open files, reach other processes or use Unix sockets once it "
     "serves)"},
    {"metrics-listen", OPT_HOSTPORT, OFF(metrics_listen), SZ(metrics_listen), 0, 0,
     "HOST:PORT", "serve /metrics and /healthz over HTTP here (off unless given)"},
    {"pool-size", OPT_SIZE, OFF(pool_size_bytes), 0, 1, 0, "SIZE",
     "the pool's size, e.g. 64G, rounded down to whole pages (default 1G when "
     "--mem-fraction is not given)"},
    {"mem-fraction", OPT_FRACTION, OFF(mem_fraction), 0, 0, 0, "F",
     "pool = F x memory limit - reserve; limit = min(MemTotal, cgroup limit)"},
    {"reserve", OPT_SIZE, OFF(reserve_bytes), 0, 0, 0, "SIZE",
     "memory kept free for everything else (default 1G)"},
    {"object-size", OPT_SIZE, OFF(object_bytes), 0, 1, 0, "SIZE",
     "typical object size, for the objects-that-fit figure (default 1M)"},
    {"populate-rate", OPT_SIZE, OFF(populate_rate_bps), 0, 0, 0, "SIZE",
     "populate the pool at most this many bytes per second; 0 = unbounded (default 4G)"},
    {"hugepages", OPT_BOOL, OFF(hugepages), 0, 0, 0, NULL,
     "back the pool with 2 MiB hugetlb pages (reserve them with vm.nr_hugepages)"},
    {"mlock", OPT_BOOL, OFF(mlock), 0, 0, 0, NULL,
     "lock the pool in memory once populated"},
    {"shm-dir", OPT_STRING, OFF(shm_dir), SZ(shm_dir), 0, 0, "DIR",
     "where the pool file (kvdock-NAME.pool), its journal (.journal) and lock (.lock) "
     "live, in DIR/kvdock-UID when others can write to DIR; they outlive the daemon, so "
     "a restart finds its objects (default /dev/shm)"},
    {"hugepages-dir", OPT_STRING, OFF(hugepages_dir), SZ(hugepages_dir), 0, 0, "DIR",
     "with --hugepages: the hugetlbfs mount (2 MiB pages) of the pool file (default: the "
     "first one mounted)"},
    {"fresh", OPT_BOOL, OFF(fresh), 0, 0, 0, NULL,
     "start empty on purpose: remove the instance's pool file and journal first"},
    {"journal-compact", OPT_SIZE, OFF(journal_compact_bytes), 0, 4096, 0, "SIZE",
     "compact the metadata journal once it is past SIZE and twice what a snapshot "
     "takes (default 8M)"},
    {"no-persist", OPT_BOOL, OFF(no_persist), 0, 0, 0, NULL,
     "keep the pool in an anonymous memfd (sealed against resizing) that dies with the "
     "daemon: nothing survives a restart"},
    {"ssd-path", OPT_STRING, OFF(ssd_path), SZ(ssd_path), 0, 0, "DIR",
     "an SSD tier in DIR (segment files written with O_DIRECT): evicted objects spill "
     "there and come back on a load; it survives a restart and a reboot (off unless "
     "given)"},
    {"ssd-size", OPT_SIZE, OFF(ssd_size_bytes), 0, 0, 0, "SIZE",
     "the SSD tier's size, whole segments of it (needed with --ssd-path)"},
    {"ssd-segment-size", OPT_SIZE, OFF(ssd_segment_bytes), 0, 16384, 0, "SIZE",
     "the tier's segment files, freed whole by compaction (default 256M)"},
    {"ssd-io", OPT_STRING, OFF(ssd_io), SZ(ssd_io), 0, 0, "auto|io_uring|psync",
     "the tier's I/O path: io_uring, or pread/pwrite threads where io_uring is refused; "
     "auto: io_uring when it starts (default auto)"},
    {"ssd-spill", OPT_STRING, OFF(ssd_spill), SZ(ssd_spill), 0, 0, "all|hit",
     "which evicted objects go to the tier: all, or only those loaded at least once "
     "(the others are dropped) (default all)"},
    {"ssd-queue-depth", OPT_U64, OFF(ssd_queue_depth), 0, 1, 256, "N",
     "the tier's I/O operations in flight at most (default 32)"},
    {"ssd-sync", OPT_STRING, OFF(ssd_sync), SZ(ssd_sync), 0, 0, "on|off",
     "on: a spill frees its DRAM copy only once its record is synced to the device "
     "(fdatasync, grouped); off: as soon as it is written, faster, but a power loss may "
     "lose objects whose DRAM copies are gone (default on)"},
    {"ssd-no-fixed-buffers", OPT_BOOL, OFF(ssd_no_fixed_buffers), 0, 0, 0, NULL,
     "do not register the pool with io_uring as fixed buffers"},
    {"ssd-test-fail-read", OPT_U64, OFF(ssd_fail_read_every), 0, 0, 1u << 30, "N",
     "tests: every N-th read of the tier fails as if the device answered EIO"},
    {"max-frame", OPT_SIZE, OFF(max_frame_bytes), 0, 64, KVD_FRAME_LIMIT_MAX, "SIZE",
     "largest RPC frame accepted (default 4M)"},
    {"max-batch", OPT_U64, OFF(max_batch), 0, 1, 1u << 20, "N",
     "most keys in one batched RPC (default 4096)"},
    {"max-connections", OPT_U64, OFF(max_connections), 0, 1, 1u << 20, "N",
     "most concurrent client connections (default 1024)"},
    {"hello-timeout-ms", OPT_U64, OFF(hello_timeout_ms), 0, 0, 3600000, "MS",
     "close a connection that has not said Hello within MS; 0 = never (default 10000)"},
    {"frame-timeout-ms", OPT_U64, OFF(frame_timeout_ms), 0, 0, 3600000, "MS",
     "close a connection whose frame is not all there MS after it began; 0 = never "
     "(default 10000)"},
    {"max-conn-buffer", OPT_SIZE, OFF(max_conn_buffer_bytes), 0, 1, 0, "SIZE",
     "most bytes the connections' buffers hold together; a connection whose input "
     "would pass it is closed (default 1G)"},
    {"usage-interval", OPT_U64, OFF(usage_interval_s), 0, 0, 86400, "SECONDS",
     "seconds between usage lines; 0 = none (default 10)"},
    {"drain-timeout", OPT_U64, OFF(drain_timeout_ms), 0, 0, 600000, "MS",
     "on SIGTERM/SIGINT, serve connected clients this long before exiting (default "
     "1000)"},
    {"evict-high", OPT_FRACTION, OFF(evict_high), 0, 0, 0, "F",
     "start evicting when more than F of the pool is used (default 0.95)"},
    {"evict-low", OPT_FRACTION, OFF(evict_low), 0, 0, 0, "F",
     "evict down to F of the pool used (default 0.90)"},
    {"lease-ttl", OPT_U64, OFF(lease_ttl_ms), 0, 100, 86400000, "MS",
     "undo a reservation or pin not ended within MS (default 30000)"},
    {"log-level", OPT_LOGLEVEL, OFF(log_level), 0, 0, 0, "LEVEL",
     "error, warn, info or debug (default info)"},
    {"auth-token-file", OPT_STRING, OFF(auth_token_file), SZ(auth_token_file), 0, 0,
     "FILE",
     "the token clients present in Hello (the file's content, trailing newline "
     "trimmed; mode 0600, not empty): the default tenant's operator"},
    {"auth-config", OPT_STRING, OFF(auth_config), SZ(auth_config), 0, 0, "FILE",
     "tenants and the credentials that map to them (see below)"},
    {"allow-uid", OPT_STRING, OFF(allow_uid), SZ(allow_uid), 0, 0, "LIST",
     "Unix-socket peers (SO_PEERCRED) with these uids or user names are the default "
     "tenant's operator (default: the daemon's own uid, and root)"},
    {"allow-gid", OPT_STRING, OFF(allow_gid), SZ(allow_gid), 0, 0, "LIST",
     "likewise for peers in these groups; one group makes the socket 0660 and its "
     "own"},
    {"insecure-no-auth", OPT_BOOL, OFF(insecure_no_auth), 0, 0, 0, NULL,
     "serve TCP clients that present no token (as the default tenant's operator); "
     "without it --listen needs a token"},
    {"cluster-etcd", OPT_STRING, OFF(cluster_etcd), SZ(cluster_etcd), 0, 0, "URLS",
     "join the cluster whose membership lives in this etcd (comma-separated "
     "http://HOST:PORT endpoints); needs --advertise and --cluster-token-file"},
    {"advertise", OPT_HOSTPORT, OFF(advertise), SZ(advertise), 0, 0, "HOST:PORT",
     "the address the cluster's other daemons reach this one at (one of --listen's)"},
    {"node-id", OPT_STRING, OFF(node_id), SZ(node_id), 0, 0, "ID",
     "this daemon's name in the cluster (default: the --advertise address)"},
    {"cluster-name", OPT_STRING, OFF(cluster_name), SZ(cluster_name), 0, 0, "NAME",
     "the cluster's name: its etcd keys are under /kvdock/NAME/ (default: default)"},
    {"cluster-token-file", OPT_STRING, OFF(cluster_token_file), SZ(cluster_token_file), 0,
     0, "FILE",
     "the token the cluster's daemons present to each other (mode 0600); a TCP "
     "Hello with it is a peer daemon"},
    {"cluster-ttl", OPT_U64, OFF(cluster_ttl_s), 0, 2, 3600, "SECONDS",
     "the lease that keeps this daemon a member: gone from every lookup within it "
     "(and a watch round) after it dies (default 5)"},
    {"cluster-cache-ms", OPT_U64, OFF(cluster_cache_ms), 0, 0, 60000, "MS",
     "keep which member holds a key, as the directory's owners answered a lookup, "
     "this long: a shared prefix looked up again asks no owner (0: ask every time; "
     "default 1000). A key its holder evicted meanwhile makes the load fail "
     "cleanly, and is asked again"},
    {"cluster-once", OPT_STRING, OFF(cluster_once), SZ(cluster_once), 0, 0, "PATTERNS",
     "rank-replicated namespaces whose names match one of these comma-separated "
     "patterns (fnmatch: '*' every one) are stored once per cluster: a page another "
     "member holds is not written here (Reserve says it exists) and loads fetch it; "
     "default: none (the local copy is faster to load)"},
    {"meminfo-root", OPT_STRING, OFF(meminfo_root), SZ(meminfo_root), 0, 0, "DIR",
     "read /proc/meminfo and the cgroup files below DIR (for tests)"},
};

static void print_help(FILE *f)
{
    fprintf(f, "Usage: kvdockd [OPTIONS]\n"
               "kvdock's host-side daemon: holds KV pages and mamba state in a\n"
               "host-memory pool for the serving workers of this node.\n\n"
               "Options (each also a 'name = value' line of a --config file):\n");
    for (size_t i = 0; i < KVD_ARRAY_SIZE(opt_defs); i++) {
        char left[64];
        snprintf(left, sizeof(left), "--%s%s%s", opt_defs[i].name,
                 opt_defs[i].arg ? " " : "", opt_defs[i].arg ? opt_defs[i].arg : "");
        fprintf(f, "  %-28s %s\n", left, opt_defs[i].help);
    }
    fprintf(f, "  %-28s %s\n  %-28s %s\n  %-28s %s\n", "--config FILE",
            "read options from FILE first; flags given later override it", "--version",
            "print the version and exit", "--help", "print this help and exit");
    fprintf(f, "  %-28s %s\n", "--list-nics",
            "list the RDMA ports and the suggested UCX_NET_DEVICES, then exit");
    fprintf(f, "\nSIZE takes K, M, G, T (powers of 1024), e.g. 512M or 1.5G.\n");
    fprintf(f,
            "\nEvery connection says Hello first, with a credential: a token (TCP, or\n"
            "the Unix socket), or on the Unix socket its uid and groups. TCP is not\n"
            "encrypted: use it on a trusted network or through a tunnel.\n"
            "--auth-config FILE holds one rule a line ('#' starts a comment):\n"
            "  tenant NAME [max-bytes=SIZE] [max-pins=N] [max-leases=N] "
            "[max-namespaces=N]\n"
            "  token TENANT FILE [operator] [read-only]\n"
            "  uid TENANT UID|USER [operator] [read-only]\n"
            "  gid TENANT GID|GROUP [operator] [read-only]\n"
            "A tenant is defined before the lines naming it ('default' always exists).\n"
            "A relative FILE is relative to the config's directory. Unix peers match\n"
            "uid lines, then gid lines, then --allow-uid / --allow-gid.\n");
}

static const opt_def_t *find_opt(const char *name)
{
    for (size_t i = 0; i < KVD_ARRAY_SIZE(opt_defs); i++)
        if (strcmp(opt_defs[i].name, name) == 0)
            return &opt_defs[i];
    return NULL;
}

static bool valid_instance(const char *s)
{
    if (*s == '\0')
        return false;
    for (; *s; s++)
        if (!isalnum((unsigned char)*s) && *s != '-' && *s != '_' && *s != '.')
            return false;
    return true;
}

/* Applies one option; prints the error (with `where`) and fails on bad input. */
static int apply_opt(const opt_def_t *d, const char *value, kvd_opts_t *o,
                     const char *where)
{
    void *field = (char *)o + d->offset;
    char host[128];
    uint16_t port;
    uint64_t u;
    double f;
    switch (d->type) {
    case OPT_STRING:
    case OPT_INSTANCE:
    case OPT_HOSTPORT:
        if (strlen(value) >= d->size) {
            fprintf(stderr, "kvdockd: %s--%s: value too long (at most %zu bytes)\n",
                    where, d->name, d->size - 1);
            return -1;
        }
        if (d->type == OPT_INSTANCE && !valid_instance(value)) {
            fprintf(stderr,
                    "kvdockd: %s--instance '%s': use letters, digits, '-', '_', '.'\n",
                    where, value);
            return -1;
        }
        if (d->type == OPT_HOSTPORT &&
            kvd_parse_host_port(value, host, sizeof(host), &port) != KVD_OK) {
            fprintf(stderr, "kvdockd: %s--%s '%s': expected HOST:PORT\n", where, d->name,
                    value);
            return -1;
        }
        strcpy(field, value);
        return 0;
    case OPT_SIZE:
        if (kvd_size_parse(value, &u) != KVD_OK || u < d->min || (d->max && u > d->max)) {
            fprintf(stderr, "kvdockd: %s--%s '%s': expected a size like 512M or 4G%s\n",
                    where, d->name, value, d->min ? " (non-zero)" : "");
            return -1;
        }
        *(uint64_t *)field = u;
        return 0;
    case OPT_U64:
        if (kvd_u64_parse(value, d->min, d->max, &u) != KVD_OK) {
            fprintf(stderr, "kvdockd: %s--%s '%s': expected an integer in [%llu, %llu]\n",
                    where, d->name, value, (unsigned long long)d->min,
                    (unsigned long long)d->max);
            return -1;
        }
        *(uint64_t *)field = u;
        return 0;
    case OPT_FRACTION:
        if (kvd_double_parse(value, 0.0, 1.0, &f) != KVD_OK || f <= 0.0) {
            fprintf(stderr, "kvdockd: %s--%s '%s': expected a number in (0, 1]\n", where,
                    d->name, value);
            return -1;
        }
        *(double *)field = f;
        return 0;
    case OPT_BOOL:
        if (value == NULL || strcasecmp(value, "true") == 0 || strcmp(value, "1") == 0 ||
            strcasecmp(value, "yes") == 0) {
            *(bool *)field = true;
        } else if (strcasecmp(value, "false") == 0 || strcmp(value, "0") == 0 ||
                   strcasecmp(value, "no") == 0) {
            *(bool *)field = false;
        } else {
            fprintf(stderr, "kvdockd: %s--%s '%s': expected true or false\n", where,
                    d->name, value);
            return -1;
        }
        return 0;
    case OPT_LOGLEVEL:
        if (kvd_log_level_parse(value, (kvd_log_level_t *)field) != KVD_OK) {
            fprintf(stderr,
                    "kvdockd: %s--log-level '%s': expected error, warn, info or debug\n",
                    where, value);
            return -1;
        }
        return 0;
    }
    return -1;
}

static char *trim(char *s)
{
    while (isspace((unsigned char)*s))
        s++;
    size_t n = strlen(s);
    while (n > 0 && isspace((unsigned char)s[n - 1]))
        s[--n] = '\0';
    return s;
}

static int read_config(const char *path, kvd_opts_t *o)
{
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        fprintf(stderr, "kvdockd: --config %s: %s\n", path, strerror(errno));
        return -1;
    }
    char line[1024];
    int lineno = 0, rc = 0;
    while (rc == 0 && fgets(line, sizeof(line), f) != NULL) {
        lineno++;
        char *hash = strchr(line, '#');
        if (hash)
            *hash = '\0';
        char *s = trim(line);
        if (*s == '\0')
            continue;
        char *eq = strchr(s, '=');
        char *value = NULL;
        if (eq != NULL) {
            *eq = '\0';
            value = trim(eq + 1);
        }
        char *key = trim(s);
        char where[300];
        snprintf(where, sizeof(where), "%s:%d: ", path, lineno);
        const opt_def_t *d = find_opt(key);
        if (d == NULL) {
            fprintf(stderr, "kvdockd: %sunknown key '%s'\n", where, key);
            rc = -1;
        } else if (value == NULL && d->type != OPT_BOOL) {
            fprintf(stderr, "kvdockd: %s'%s' needs '= value'\n", where, key);
            rc = -1;
        } else {
            rc = apply_opt(d, value, o, where);
        }
    }
    fclose(f);
    return rc;
}

static void set_defaults(kvd_opts_t *o)
{
    memset(o, 0, sizeof(*o));
    strcpy(o->instance, "default");
    strcpy(o->ucx, "auto");
    strcpy(o->ssd_io, "auto");
    strcpy(o->ssd_spill, "all");
    strcpy(o->ssd_sync, "on");
    strcpy(o->shm_dir, "/dev/shm");
    o->journal_compact_bytes = 8 * KVD_MiB;
    o->reserve_bytes = KVD_GiB;
    o->object_bytes = KVD_MiB;
    o->populate_rate_bps = 4 * KVD_GiB;
    o->max_frame_bytes = KVD_FRAME_DEFAULT_MAX;
    o->max_batch = 4096;
    o->max_connections = 1024;
    o->hello_timeout_ms = 10000;
    o->frame_timeout_ms = 10000;
    o->max_conn_buffer_bytes = KVD_GiB;
    o->usage_interval_s = 10;
    o->drain_timeout_ms = 1000;
    o->evict_high = 0.95;
    o->evict_low = 0.90;
    o->lease_ttl_ms = 30000;
    o->log_level = KVD_LOG_INFO;
    strcpy(o->cluster_name, "default");
    o->cluster_ttl_s = 5;
    o->cluster_cache_ms = 1000;
}

kvd_opts_result_t kvd_opts_parse(int argc, char **argv, kvd_opts_t *o)
{
    set_defaults(o);
    /* getopt_long table from opt_defs, plus config/help/version/list-nics */
    struct option longopts[KVD_ARRAY_SIZE(opt_defs) + 5];
    size_t n = 0;
    for (; n < KVD_ARRAY_SIZE(opt_defs); n++)
        longopts[n] = (struct option){opt_defs[n].name,
                                      opt_defs[n].type == OPT_BOOL ? no_argument
                                                                   : required_argument,
                                      NULL, (int)(1000 + n)};
    longopts[n++] = (struct option){"config", required_argument, NULL, 'c'};
    longopts[n++] = (struct option){"help", no_argument, NULL, 'h'};
    longopts[n++] = (struct option){"version", no_argument, NULL, 'V'};
    longopts[n++] = (struct option){"list-nics", no_argument, NULL, 'N'};
    longopts[n] = (struct option){NULL, 0, NULL, 0};

    /* pass 1: --help, --version, --list-nics, --config */
    opterr = 0;
    optind = 1;
    int c;
    const char *config = NULL;
    while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        if (c == 'h') {
            print_help(stdout);
            return KVD_OPTS_EXIT_OK;
        }
        if (c == 'V') {
            printf("kvdockd %s (protocol %d)\n", KVD_VERSION, KVD_PROTOCOL_VERSION);
            return KVD_OPTS_EXIT_OK;
        }
        if (c == 'N')
            return KVD_OPTS_LIST_NICS;
        if (c == 'c')
            config = optarg;
    }
    if (config != NULL && read_config(config, o) != 0)
        return KVD_OPTS_ERROR;

    /* pass 2: every flag, overriding the file */
    opterr = 0;
    optind = 1;
    bool size_flag = false, fraction_flag = false;
    while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        if (c == '?' || c == ':') {
            const char *bad = argv[optind - 1];
            fprintf(stderr,
                    "kvdockd: unknown option or missing value: '%s' "
                    "(see kvdockd --help)\n",
                    bad);
            return KVD_OPTS_ERROR;
        }
        if (c < 1000)
            continue;
        const opt_def_t *d = &opt_defs[c - 1000];
        if (apply_opt(d, optarg, o, "") != 0)
            return KVD_OPTS_ERROR;
        size_flag |= strcmp(d->name, "pool-size") == 0;
        fraction_flag |= strcmp(d->name, "mem-fraction") == 0;
    }
    if (optind < argc) {
        fprintf(stderr, "kvdockd: unexpected argument '%s' (see kvdockd --help)\n",
                argv[optind]);
        return KVD_OPTS_ERROR;
    }
    /* a flag overrides the file, also across the two ways of sizing */
    if (size_flag && !fraction_flag)
        o->mem_fraction = 0;
    if (fraction_flag && !size_flag)
        o->pool_size_bytes = 0;
    bool pool_size_given = o->pool_size_bytes > 0;
    if (pool_size_given && o->mem_fraction > 0) {
        fprintf(stderr,
                "kvdockd: give one of --pool-size and --mem-fraction, not both\n");
        return KVD_OPTS_ERROR;
    }
    if (strcmp(o->ucx, "auto") != 0 && strcmp(o->ucx, "on") != 0 &&
        strcmp(o->ucx, "off") != 0) {
        fprintf(stderr, "kvdockd: --ucx '%s': expected auto, on or off\n", o->ucx);
        return KVD_OPTS_ERROR;
    }
    if (o->evict_low > o->evict_high) {
        fprintf(stderr, "kvdockd: --evict-low %.3f is above --evict-high %.3f\n",
                o->evict_low, o->evict_high);
        return KVD_OPTS_ERROR;
    }
    /* a frame of --max-frame needs a buffer of up to twice its size (they
     * grow by doubling): below that no client could send one */
    if (o->max_conn_buffer_bytes < 2 * o->max_frame_bytes) {
        fprintf(stderr,
                "kvdockd: --max-conn-buffer %llu is below twice --max-frame %llu: no "
                "connection could receive a whole frame\n",
                (unsigned long long)o->max_conn_buffer_bytes,
                (unsigned long long)o->max_frame_bytes);
        return KVD_OPTS_ERROR;
    }
    if (o->fresh && o->no_persist) {
        fprintf(stderr, "kvdockd: --fresh and --no-persist: with --no-persist there is "
                        "nothing to start fresh from\n");
        return KVD_OPTS_ERROR;
    }
    if (o->shm_dir[0] != '/') {
        fprintf(stderr, "kvdockd: --shm-dir '%s': give an absolute path\n", o->shm_dir);
        return KVD_OPTS_ERROR;
    }
    if ((o->ssd_path[0] != '\0') != (o->ssd_size_bytes != 0)) {
        fprintf(stderr, "kvdockd: --ssd-path and --ssd-size go together\n");
        return KVD_OPTS_ERROR;
    }
    if (strcmp(o->ssd_io, "auto") != 0 && strcmp(o->ssd_io, "io_uring") != 0 &&
        strcmp(o->ssd_io, "psync") != 0) {
        fprintf(stderr, "kvdockd: --ssd-io '%s': expected auto, io_uring or psync\n",
                o->ssd_io);
        return KVD_OPTS_ERROR;
    }
    if (strcmp(o->ssd_sync, "on") != 0 && strcmp(o->ssd_sync, "off") != 0) {
        fprintf(stderr, "kvdockd: --ssd-sync '%s': expected on or off\n", o->ssd_sync);
        return KVD_OPTS_ERROR;
    }
    if (strcmp(o->ssd_spill, "all") != 0 && strcmp(o->ssd_spill, "hit") != 0) {
        fprintf(stderr, "kvdockd: --ssd-spill '%s': expected all or hit\n", o->ssd_spill);
        return KVD_OPTS_ERROR;
    }
    if (o->cluster_etcd[0] != '\0') {
        if (o->advertise[0] == '\0' || o->listen[0] == '\0' ||
            o->cluster_token_file[0] == '\0') {
            fprintf(stderr, "kvdockd: --cluster-etcd needs --listen, --advertise (the "
                            "address peers reach it at) and --cluster-token-file\n");
            return KVD_OPTS_ERROR;
        }
        if (strncmp(o->cluster_etcd, "http://", 7) != 0) {
            fprintf(stderr,
                    "kvdockd: --cluster-etcd '%s': expected http://HOST:PORT "
                    "endpoints, comma-separated\n",
                    o->cluster_etcd);
            return KVD_OPTS_ERROR;
        }
        if (o->node_id[0] == '\0')
            kvd_strlcpy(o->node_id, o->advertise, sizeof(o->node_id));
        for (const char *p = o->node_id; *p; p++) {
            if (!isalnum((unsigned char)*p) && strchr(".-_:", *p) == NULL) {
                fprintf(stderr,
                        "kvdockd: --node-id '%s': use letters, digits and .-_: "
                        "only\n",
                        o->node_id);
                return KVD_OPTS_ERROR;
            }
        }
        for (const char *p = o->cluster_name; *p; p++) {
            if (!isalnum((unsigned char)*p) && strchr(".-_", *p) == NULL) {
                fprintf(stderr,
                        "kvdockd: --cluster-name '%s': use letters, digits and "
                        ".-_ only\n",
                        o->cluster_name);
                return KVD_OPTS_ERROR;
            }
        }
    } else if (o->advertise[0] != '\0' || o->cluster_token_file[0] != '\0') {
        fprintf(stderr, "kvdockd: --advertise and --cluster-token-file are for a "
                        "cluster: give --cluster-etcd too\n");
        return KVD_OPTS_ERROR;
    }
    if (!pool_size_given && o->mem_fraction == 0)
        o->pool_size_bytes = KVD_GiB; /* the modest embedded default */
    if (o->socket_path[0] == '\0')
        kvd_default_socket_path(o->instance, o->socket_path, sizeof(o->socket_path));
    return KVD_OPTS_RUN;
}
