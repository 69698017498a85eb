/*
 * kvdock.c - the operator CLI.
 *
 *   kvdock [--socket PATH | --connect HOST:PORT | --instance NAME]
 *          [--timeout MS] COMMAND [--json]
 *   COMMAND: health | stats
 *
 * Exit status: 0 success (health: the daemon is ready); 1 the daemon is not
 * there or answered an error; 2 usage error; 3 health: reachable but not
 * ready (starting or draining).
 */
#include "cli.h"

#include <getopt.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f)
{
    fprintf(f,
            "Usage: kvdock [OPTIONS] COMMAND [ARGS] [--json]\n"
            "Inspect a running kvdockd and what it stores.\n\n"
            "Commands:\n"
            "  health                      the daemon's state (exit 0 ready, 3 starting "
            "or draining)\n"
            "  stats [--check]             memory, store, namespaces, connections, RPC "
            "counters,\n"
            "                              RDMA ports;\n"
            "                              --check runs the store's invariant (exit 1 "
            "when broken)\n"
            "  hash --page-size P [--prior HEX] (TOKENS... | --tokens-file F)\n"
            "                              the page-key chain (SGLang-compatible), one "
            "key per full page\n"
            "  prefixes [--namespace N] [--tree] [--limit L]\n"
            "                              stored prefixes: namespace, root, pages, "
            "bytes, which\n"
            "                              pools hold state at which boundaries, last "
            "access, hits\n"
            "  show KEY [--namespace N]    one stored key in every namespace holding it\n"
            "  lookup --namespace N [--namespace N2 ...] [--trailing T[,T2...]] KEYS...\n"
            "                              the restorable boundaries (pages) for these "
            "page keys;\n"
            "                              --trailing 0 = all pages must be present "
            "(default)\n"
            "  evict (--key K [--namespace N] | --namespace N | --all)\n"
            "                              drop stored objects (pinned or unfinished "
            "ones stay)\n\n"
            "Options:\n"
            "  --socket PATH    the daemon's Unix socket (default: that of --instance)\n"
            "  --connect H:P    reach the daemon over TCP instead\n"
            "  --instance NAME  the daemon instance (default: default)\n"
            "  --timeout MS     bound on connecting and each call (default 5000)\n"
            "  --json           machine-readable output\n"
            "  --help, --version\n\n"
            "Exit status: 0 ok, 1 daemon unreachable, error or not found, 2 usage, 3 not "
            "ready.\n");
}

static int connect_daemon(const cli_t *cli, kvd_client_t **out)
{
    int rc;
    const char *where = cli->connect ? cli->connect : cli->socket_path;
    if (cli->connect)
        rc = kvd_client_connect_tcp(cli->connect, cli->timeout_ms, out);
    else
        rc = kvd_client_connect_unix(cli->socket_path, cli->timeout_ms, out);
    if (rc != KVD_OK)
        fprintf(stderr, "kvdock: cannot reach kvdockd at %s: %s%s\n", where,
                kvd_status_str(rc),
                rc == KVD_ERR_UNAVAILABLE ? " (is the daemon running? see --socket)"
                                          : "");
    return rc;
}

int cli_call(const cli_t *cli, kvd_msg_t *req, kvd_msg_t *rep)
{
    kvd_client_t *c = NULL;
    int rc = connect_daemon(cli, &c);
    if (rc != KVD_OK)
        return rc;
    rc = kvd_client_call(c, req, rep, cli->timeout_ms);
    kvd_client_close(c);
    if (rc != KVD_OK) {
        fprintf(stderr, "kvdock: %s call failed: %s\n", kvd_method_name(req->method),
                kvd_status_str(rc));
        return rc;
    }
    if (rep->status != KVD_OK) {
        fprintf(stderr, "kvdock: %s: %s (%s)\n", kvd_method_name(req->method), rep->error,
                kvd_status_str(rep->status));
        return rep->status;
    }
    return KVD_OK;
}

/* Calls a method without a request body. */
static int call(const cli_t *cli, kvd_method_t method, kvd_msg_t *rep)
{
    kvd_msg_t req;
    kvd_msg_request(&req, 0, method);
    return cli_call(cli, &req, rep);
}

int cli_namespaces(const cli_t *cli, kvd_msg_t *rep, kvd_ns_msg_t **ns, size_t *n)
{
    int rc = call(cli, KVD_METHOD_STATS, rep);
    if (rc == KVD_OK) {
        *ns = rep->body.stats_rep.namespaces;
        *n = rep->body.stats_rep.n_namespaces;
    }
    return rc;
}

static bool no_args(const char *cmd, const cli_args_t *a)
{
    if (a->n_args == 0)
        return true;
    fprintf(stderr, "kvdock %s: unexpected argument '%s'\n", cmd, a->args[0]);
    return false;
}

static int cmd_health(const cli_t *cli)
{
    kvd_msg_t rep;
    if (call(cli, KVD_METHOD_HEALTH, &rep) != KVD_OK) {
        kvd_msg_clear(&rep);
        return 1;
    }
    const kvd_health_rep_t *h = &rep.body.health_rep;
    if (cli->json) {
        printf("{\"state\":\"%s\",\"pool_bytes\":%llu,\"populated_bytes\":%llu,"
               "\"uptime_ms\":%llu}\n",
               kvd_health_name(h->state), (unsigned long long)h->pool_bytes,
               (unsigned long long)h->populated_bytes, (unsigned long long)h->uptime_ms);
    } else {
        char a[32], b[32];
        printf("%s (pool %s of %s populated, up %.1f s)\n", kvd_health_name(h->state),
               kvd_size_format(h->populated_bytes, a, sizeof(a)),
               kvd_size_format(h->pool_bytes, b, sizeof(b)),
               (double)h->uptime_ms / 1000.0);
    }
    return h->state == KVD_HEALTH_READY ? 0 : EXIT_NOT_READY;
}

/* Prints a JSON string literal (the fields here are plain, but escape anyway). */
void cli_json_str(const char *s)
{
    putchar('"');
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            printf("\\%c", *s);
        else if ((unsigned char)*s < 0x20)
            printf("\\u%04x", (unsigned char)*s);
        else
            putchar(*s);
    }
    putchar('"');
}

/* ,"nics":[...] of stats --json: the daemon's RDMA ports. */
static void nics_json(const kvd_stats_rep_t *st)
{
    printf(",\"nics\":[");
    for (size_t i = 0; i < st->n_nics; i++) {
        const kvd_nic_msg_t *n = &st->nics[i];
        printf("%s{\"device\":", i ? "," : "");
        cli_json_str(n->device);
        printf(",\"port\":%u,\"state\":", n->port);
        cli_json_str(n->state);
        printf(",\"link_layer\":");
        cli_json_str(n->link_layer);
        printf(",\"gid\":");
        cli_json_str(n->gid);
        printf(",\"numa_node\":%d,\"netdev\":", (int)n->numa_node);
        cli_json_str(n->netdev);
        printf(",\"active_mtu\":%u}", n->active_mtu);
    }
    printf("]");
}

static void stats_json(const kvd_stats_rep_t *st)
{
    const kvd_mem_stats_t *m = &st->memory;
    printf("{\"daemon_version\":");
    cli_json_str(st->daemon_version);
    printf(",\"instance\":");
    cli_json_str(st->instance);
    printf(",\"state\":\"%s\",\"uptime_ms\":%llu,", kvd_health_name(st->state),
           (unsigned long long)st->uptime_ms);
    printf("\"memory\":{\"pool_bytes\":%llu,\"pool_populated_bytes\":%llu,"
           "\"rss_bytes\":%llu,\"rss_anon_bytes\":%llu,\"rss_file_bytes\":%llu,"
           "\"rss_shmem_bytes\":%llu,",
           (unsigned long long)m->pool_bytes, (unsigned long long)m->pool_populated_bytes,
           (unsigned long long)m->rss_bytes, (unsigned long long)m->rss_anon_bytes,
           (unsigned long long)m->rss_file_bytes, (unsigned long long)m->rss_shmem_bytes);
    for (int c = 0; c < KVD_MEM_CAT_COUNT; c++)
        printf("\"%s_bytes\":%llu,", kvd_mem_cat_name((kvd_mem_cat_t)c),
               (unsigned long long)m->cat_bytes[c]);
    printf("\"hugepages\":%s,\"mlocked\":%s},", m->hugepages ? "true" : "false",
           m->mlocked ? "true" : "false");
    printf("\"connections\":{\"current\":%llu,\"total\":%llu,\"rejected\":%llu},"
           "\"protocol_errors\":%llu,\"methods\":{",
           (unsigned long long)st->connections_current,
           (unsigned long long)st->connections_total,
           (unsigned long long)st->connections_rejected,
           (unsigned long long)st->protocol_errors);
    for (size_t i = 1; i < KVD_METHOD_COUNT; i++) {
        const kvd_method_stats_t *ms = &st->methods[i];
        printf("%s\"%s\":{\"calls\":%llu,\"errors\":%llu,\"latency_us_sum\":%llu,"
               "\"latency_buckets\":[",
               i > 1 ? "," : "", kvd_method_name((kvd_method_t)i),
               (unsigned long long)ms->calls, (unsigned long long)ms->errors,
               (unsigned long long)ms->latency_us_sum);
        for (size_t b = 0; b < KVD_LATENCY_BUCKETS; b++)
            printf("%s%llu", b ? "," : "", (unsigned long long)ms->latency_buckets[b]);
        printf("]}");
    }
    const kvd_store_stats_msg_t *ss = &st->store;
    printf(
        "},\"store\":{\"pool_bytes\":%llu,\"free_bytes\":%llu,\"writing_bytes\":%llu,"
        "\"ready_bytes\":%llu,\"pinned_bytes\":%llu,\"objects_ready\":%llu,"
        "\"objects_writing\":%llu,\"objects_pinned\":%llu,\"pins\":%llu,\"leases\":%llu,"
        "\"free_extents\":%llu,\"largest_free_bytes\":%llu,\"fragmentation\":%.6f,"
        "\"index_bytes\":%llu,\"evictions\":%llu,\"evicted_bytes\":%llu,"
        "\"reserve_allocated\":%llu,\"reserve_exists\":%llu,\"reserve_in_flight\":%llu,"
        "\"reserve_no_space\":%llu,\"lookups\":%llu,\"lookup_pages\":%llu,"
        "\"hit_pages\":%llu,\"acquires\":%llu,\"acquire_failures\":%llu,"
        "\"leases_expired\":%llu,\"published_bytes\":%llu,\"acquired_bytes\":%llu,"
        "\"quarantined_bytes\":%llu},",
        (unsigned long long)ss->pool_bytes, (unsigned long long)ss->free_bytes,
        (unsigned long long)ss->writing_bytes, (unsigned long long)ss->ready_bytes,
        (unsigned long long)ss->pinned_bytes, (unsigned long long)ss->objects_ready,
        (unsigned long long)ss->objects_writing, (unsigned long long)ss->objects_pinned,
        (unsigned long long)ss->pins, (unsigned long long)ss->leases,
        (unsigned long long)ss->free_extents, (unsigned long long)ss->largest_free_bytes,
        ss->fragmentation, (unsigned long long)ss->index_bytes,
        (unsigned long long)ss->evictions, (unsigned long long)ss->evicted_bytes,
        (unsigned long long)ss->reserve_allocated, (unsigned long long)ss->reserve_exists,
        (unsigned long long)ss->reserve_in_flight,
        (unsigned long long)ss->reserve_no_space, (unsigned long long)ss->lookups,
        (unsigned long long)ss->lookup_pages, (unsigned long long)ss->hit_pages,
        (unsigned long long)ss->acquires, (unsigned long long)ss->acquire_failures,
        (unsigned long long)ss->leases_expired, (unsigned long long)ss->published_bytes,
        (unsigned long long)ss->acquired_bytes,
        (unsigned long long)ss->quarantined_bytes);
    printf("\"namespaces\":[");
    for (size_t i = 0; i < st->n_namespaces; i++) {
        const kvd_ns_msg_t *n = &st->namespaces[i];
        printf("%s{\"id\":%u,\"name\":", i ? "," : "", n->id);
        cli_json_str(n->name);
        printf(
            ",\"object_bytes\":%llu,\"rank_replicated\":%s,\"objects_ready\":%llu,"
            "\"objects_writing\":%llu,\"objects_pinned\":%llu,\"lookup_pages\":%llu,"
            "\"hit_pages\":%llu,\"evictions\":%llu,\"offload_bytes\":%llu,"
            "\"load_bytes\":%llu,\"load_failures\":%llu}",
            (unsigned long long)n->object_bytes, n->rank_replicated ? "true" : "false",
            (unsigned long long)n->objects_ready, (unsigned long long)n->objects_writing,
            (unsigned long long)n->objects_pinned, (unsigned long long)n->lookup_pages,
            (unsigned long long)n->hit_pages, (unsigned long long)n->evictions,
            (unsigned long long)n->published_bytes, (unsigned long long)n->acquired_bytes,
            (unsigned long long)n->acquire_failures);
    }
    printf("]");
    nics_json(st);
    if (st->checked) {
        printf(",\"check\":{\"ok\":%s,\"error\":", st->check_error[0] ? "false" : "true");
        cli_json_str(st->check_error);
        printf("}");
    }
    printf("}\n");
}

static const char *or_dash(const char *s)
{
    return s[0] ? s : "-";
}

/* The "nics:" section of the stats table: the daemon's RDMA ports. */
static void nics_table(const kvd_stats_rep_t *st)
{
    if (st->n_nics == 0) {
        printf("\nnics: no RDMA devices\n");
        return;
    }
    printf("\nnics:\n  %-12s %4s  %-12s %-10s %5s %4s  %-16s %s\n", "device", "port",
           "state", "link", "mtu", "numa", "netdev", "gid");
    for (size_t i = 0; i < st->n_nics; i++) {
        const kvd_nic_msg_t *n = &st->nics[i];
        char mtu[16] = "-", numa[16] = "-";
        if (n->active_mtu)
            snprintf(mtu, sizeof(mtu), "%u", n->active_mtu);
        if (n->numa_node >= 0)
            snprintf(numa, sizeof(numa), "%d", (int)n->numa_node);
        printf("  %-12s %4u  %-12s %-10s %5s %4s  %-16s %s\n", n->device, n->port,
               or_dash(n->state), or_dash(n->link_layer), mtu, numa, or_dash(n->netdev),
               or_dash(n->gid));
    }
}

static void stats_table(const kvd_stats_rep_t *st)
{
    const kvd_mem_stats_t *m = &st->memory;
    char a[32], b[32];
    printf("kvdockd %s, instance %s: %s, up %.1f s\n\n", st->daemon_version, st->instance,
           kvd_health_name(st->state), (double)st->uptime_ms / 1000.0);
    printf("%-26s %s\n", "pool", kvd_size_format(m->pool_bytes, a, sizeof(a)));
    printf("%-26s %s (%.0f%%)\n", "pool populated",
           kvd_size_format(m->pool_populated_bytes, a, sizeof(a)),
           m->pool_bytes ? 100.0 * (double)m->pool_populated_bytes / (double)m->pool_bytes
                         : 0.0);
    printf("%-26s %s%s\n", "pool pages", m->hugepages ? "2 MiB hugepages" : "base pages",
           m->mlocked ? ", locked" : "");
    printf("%-26s %s\n", "process rss", kvd_size_format(m->rss_bytes, a, sizeof(a)));
    printf("%-26s %s shmem, %s anon, ", "  of which",
           kvd_size_format(m->rss_shmem_bytes, a, sizeof(a)),
           kvd_size_format(m->rss_anon_bytes, b, sizeof(b)));
    printf("%s file\n", kvd_size_format(m->rss_file_bytes, a, sizeof(a)));
    for (int c = 0; c < KVD_MEM_CAT_COUNT; c++) {
        char label[40];
        snprintf(label, sizeof(label), "allocated: %s",
                 kvd_mem_cat_name((kvd_mem_cat_t)c));
        printf("%-26s %s\n", label, kvd_size_format(m->cat_bytes[c], a, sizeof(a)));
    }
    printf("%-26s %llu open, %llu accepted, %llu rejected\n", "connections",
           (unsigned long long)st->connections_current,
           (unsigned long long)st->connections_total,
           (unsigned long long)st->connections_rejected);
    printf("%-26s %llu\n\n", "protocol errors", (unsigned long long)st->protocol_errors);
    printf("%-10s %12s %10s %14s\n", "method", "calls", "errors", "mean latency");
    for (size_t i = 1; i < KVD_METHOD_COUNT; i++) {
        const kvd_method_stats_t *ms = &st->methods[i];
        char mean[32] = "-";
        if (ms->calls)
            snprintf(mean, sizeof(mean), "%.1f us",
                     (double)ms->latency_us_sum / (double)ms->calls);
        printf("%-10s %12llu %10llu %14s\n", kvd_method_name((kvd_method_t)i),
               (unsigned long long)ms->calls, (unsigned long long)ms->errors, mean);
    }
    const kvd_store_stats_msg_t *ss = &st->store;
    char a2[32], b2[32], c2[32], d2[32];
    uint64_t used = ss->pool_bytes - ss->free_bytes;
    printf("\nstore: %s used of %s (%.1f%%): %s ready, %s writing, %s pinned, %s "
           "quarantined\n",
           kvd_size_format(used, a, sizeof(a)),
           kvd_size_format(ss->pool_bytes, b, sizeof(b)),
           ss->pool_bytes ? 100.0 * (double)used / (double)ss->pool_bytes : 0.0,
           kvd_size_format(ss->ready_bytes, a2, sizeof(a2)),
           kvd_size_format(ss->writing_bytes, b2, sizeof(b2)),
           kvd_size_format(ss->pinned_bytes, c2, sizeof(c2)),
           kvd_size_format(ss->quarantined_bytes, d2, sizeof(d2)));
    printf("  objects %llu ready, %llu writing, %llu pinned; %llu leases; index %s\n",
           (unsigned long long)ss->objects_ready, (unsigned long long)ss->objects_writing,
           (unsigned long long)ss->objects_pinned, (unsigned long long)ss->leases,
           kvd_size_format(ss->index_bytes, a, sizeof(a)));
    printf("  free %s in %llu extents, largest %s, fragmentation %.3f\n",
           kvd_size_format(ss->free_bytes, a, sizeof(a)),
           (unsigned long long)ss->free_extents,
           kvd_size_format(ss->largest_free_bytes, b, sizeof(b)), ss->fragmentation);
    printf("  lookups %llu, hit pages %llu of %llu; evictions %llu (%s)\n",
           (unsigned long long)ss->lookups, (unsigned long long)ss->hit_pages,
           (unsigned long long)ss->lookup_pages, (unsigned long long)ss->evictions,
           kvd_size_format(ss->evicted_bytes, a, sizeof(a)));
    printf("  reserve: %llu allocated, %llu exists, %llu in flight, %llu no space\n",
           (unsigned long long)ss->reserve_allocated,
           (unsigned long long)ss->reserve_exists,
           (unsigned long long)ss->reserve_in_flight,
           (unsigned long long)ss->reserve_no_space);
    if (st->n_namespaces > 0)
        printf("\n%-4s %-40s %12s %10s %10s %15s %12s %12s %8s\n", "id", "namespace",
               "object", "ready", "pinned", "hit pages", "offloaded", "loaded", "failed");
    for (size_t i = 0; i < st->n_namespaces; i++) {
        const kvd_ns_msg_t *n = &st->namespaces[i];
        char off[32], ld[32];
        printf("%-4u %-40s %12s %10llu %10llu %7llu/%-7llu %12s %12s %8llu\n", n->id,
               n->name, kvd_size_format(n->object_bytes, a, sizeof(a)),
               (unsigned long long)n->objects_ready,
               (unsigned long long)n->objects_pinned, (unsigned long long)n->hit_pages,
               (unsigned long long)n->lookup_pages,
               kvd_size_format(n->published_bytes, off, sizeof(off)),
               kvd_size_format(n->acquired_bytes, ld, sizeof(ld)),
               (unsigned long long)n->acquire_failures);
    }
    nics_table(st);
}

static int cmd_stats(const cli_t *cli, bool check)
{
    kvd_msg_t *req = calloc(2, sizeof(kvd_msg_t));
    if (req == NULL)
        return 1;
    kvd_msg_t *rep = req + 1;
    kvd_msg_request(req, 0, KVD_METHOD_STATS);
    req->body.stats_req.check = check;
    int rc = cli_call(cli, req, rep);
    bool broken = false;
    if (rc == KVD_OK) {
        const kvd_stats_rep_t *st = &rep->body.stats_rep;
        if (cli->json)
            stats_json(st);
        else
            stats_table(st);
        broken = check && (!st->checked || st->check_error[0] != '\0');
        if (check && !cli->json)
            printf("\ninvariant check: %s%s\n", broken ? "FAILED: " : "ok",
                   broken ? st->check_error : "");
    }
    kvd_msg_clear(rep);
    free(req);
    return rc == KVD_OK && !broken ? 0 : 1;
}

int main(int argc, char **argv)
{
    cli_t cli = {.instance = "default", .timeout_ms = 5000};
    const char *socket_path = NULL;
    static const struct option global_opts[] = {
        {"socket", required_argument, NULL, 's'},
        {"connect", required_argument, NULL, 'c'},
        {"instance", required_argument, NULL, 'i'},
        {"timeout", required_argument, NULL, 't'},
        {"json", no_argument, NULL, 'j'},
        {"help", no_argument, NULL, 'h'},
        {"version", no_argument, NULL, 'V'},
        {NULL, 0, NULL, 0},
    };
    int c;
    uint64_t v;
    while ((c = getopt_long(argc, argv, "+", global_opts, NULL)) != -1) {
        switch (c) {
        case 's': socket_path = optarg; break;
        case 'c': cli.connect = optarg; break;
        case 'i': cli.instance = optarg; break;
        case 'j': cli.json = true; break;
        case 't':
            if (kvd_u64_parse(optarg, 1, 3600000, &v) != KVD_OK) {
                fprintf(stderr, "kvdock: --timeout '%s': expected milliseconds\n",
                        optarg);
                return EXIT_USAGE;
            }
            cli.timeout_ms = (int)v;
            break;
        case 'h': usage(stdout); return 0;
        case 'V':
            printf("kvdock %s (protocol %d)\n", KVD_VERSION, KVD_PROTOCOL_VERSION);
            return 0;
        default: usage(stderr); return EXIT_USAGE;
        }
    }
    if (optind >= argc) {
        usage(stderr);
        return EXIT_USAGE;
    }
    const char *cmd = argv[optind++];
    if (socket_path != NULL)
        kvd_strlcpy(cli.socket_path, socket_path, sizeof(cli.socket_path));
    else
        kvd_default_socket_path(cli.instance, cli.socket_path, sizeof(cli.socket_path));

    /* the command's own options, in any order with its arguments */
    cli_args_t a = {0};
    static const struct option cmd_opts[] = {
        {"json", no_argument, NULL, 'j'},
        {"check", no_argument, NULL, 'C'},
        {"namespace", required_argument, NULL, 'n'},
        {"tree", no_argument, NULL, 'T'},
        {"key", required_argument, NULL, 'k'},
        {"all", no_argument, NULL, 'a'},
        {"page-size", required_argument, NULL, 'p'},
        {"prior", required_argument, NULL, 'P'},
        {"tokens-file", required_argument, NULL, 'f'},
        {"trailing", required_argument, NULL, 'r'},
        {"limit", required_argument, NULL, 'l'},
        {NULL, 0, NULL, 0},
    };
    /* The command's words start a fresh scan (optind = 0 makes glibc forget
     * the "+" of the first one): options and arguments in any order, the
     * arguments permuted to the end. */
    int sub_argc = argc - optind + 1;
    char **sub_argv = argv + optind - 1; /* sub_argv[0] is the command */
    optind = 0;
    while ((c = getopt_long(sub_argc, sub_argv, "", cmd_opts, NULL)) != -1) {
        switch (c) {
        case 'j': cli.json = true; break;
        case 'C': a.check = true; break;
        case 'n':
            if (a.n_namespaces == KVD_ARRAY_SIZE(a.namespaces)) {
                fprintf(stderr, "kvdock: at most %zu --namespace\n",
                        KVD_ARRAY_SIZE(a.namespaces));
                return EXIT_USAGE;
            }
            a.namespaces[a.n_namespaces++] = optarg;
            break;
        case 'T': a.tree = true; break;
        case 'k': a.key = optarg; break;
        case 'a': a.all = true; break;
        case 'p': a.page_size = optarg; break;
        case 'P': a.prior = optarg; break;
        case 'f': a.tokens_file = optarg; break;
        case 'r': a.trailing = optarg; break;
        case 'l': a.limit = optarg; break;
        default:
            fprintf(stderr, "kvdock %s: unknown option (see kvdock --help)\n", cmd);
            return EXIT_USAGE;
        }
    }
    a.args = sub_argv + optind;
    a.n_args = (size_t)(sub_argc - optind);

    if (strcmp(cmd, "health") == 0)
        return no_args(cmd, &a) ? cmd_health(&cli) : EXIT_USAGE;
    if (strcmp(cmd, "stats") == 0)
        return no_args(cmd, &a) ? cmd_stats(&cli, a.check) : EXIT_USAGE;
    if (strcmp(cmd, "hash") == 0)
        return cmd_hash(&cli, &a);
    if (strcmp(cmd, "prefixes") == 0)
        return cmd_prefixes(&cli, &a);
    if (strcmp(cmd, "show") == 0)
        return cmd_show(&cli, &a);
    if (strcmp(cmd, "lookup") == 0)
        return cmd_lookup(&cli, &a);
    if (strcmp(cmd, "evict") == 0)
        return cmd_evict(&cli, &a);
    fprintf(stderr, "kvdock: unknown command '%s' (see kvdock --help)\n", cmd);
    return EXIT_USAGE;
}
