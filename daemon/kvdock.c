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
#include "kvd_common.h"
#include "kvd_proto.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { EXIT_USAGE = 2, EXIT_NOT_READY = 3 };

typedef struct cli {
    char socket_path[108];
    const char *connect;
    const char *instance;
    int timeout_ms;
    bool json;
} cli_t;

static void usage(FILE *f)
{
    fprintf(
        f,
        "Usage: kvdock [OPTIONS] COMMAND [--json]\n"
        "Inspect a running kvdockd.\n\n"
        "Commands:\n"
        "  health           the daemon's state (exit 0 ready, 3 starting or draining)\n"
        "  stats            memory, connections and RPC counters\n\n"
        "Options:\n"
        "  --socket PATH    the daemon's Unix socket (default: that of --instance)\n"
        "  --connect H:P    reach the daemon over TCP instead\n"
        "  --instance NAME  the daemon instance (default: default)\n"
        "  --timeout MS     bound on connecting and each call (default 5000)\n"
        "  --json           machine-readable output\n"
        "  --help, --version\n\n"
        "Exit status: 0 ok, 1 daemon unreachable or error, 2 usage, 3 not ready.\n");
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

/* Calls `method` and checks the reply; prints the failure. */
static int call(const cli_t *cli, kvd_method_t method, kvd_msg_t *rep)
{
    kvd_client_t *c = NULL;
    int rc = connect_daemon(cli, &c);
    if (rc != KVD_OK)
        return rc;
    kvd_msg_t req;
    kvd_msg_request(&req, 0, method);
    rc = kvd_client_call(c, &req, rep, cli->timeout_ms);
    kvd_client_close(c);
    if (rc != KVD_OK) {
        fprintf(stderr, "kvdock: %s call failed: %s\n", kvd_method_name(method),
                kvd_status_str(rc));
        return rc;
    }
    if (rep->status != KVD_OK) {
        fprintf(stderr, "kvdock: the daemon answered %s: %s (%s)\n",
                kvd_method_name(method), rep->error, kvd_status_str(rep->status));
        return rep->status;
    }
    return KVD_OK;
}

static int cmd_health(const cli_t *cli)
{
    kvd_msg_t rep;
    if (call(cli, KVD_METHOD_HEALTH, &rep) != KVD_OK)
        return 1;
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
static void json_str(const char *s)
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

static void stats_json(const kvd_stats_rep_t *st)
{
    const kvd_mem_stats_t *m = &st->memory;
    printf("{\"daemon_version\":");
    json_str(st->daemon_version);
    printf(",\"instance\":");
    json_str(st->instance);
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
    printf("}}\n");
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
}

static int cmd_stats(const cli_t *cli)
{
    kvd_msg_t *rep = malloc(sizeof(*rep));
    if (rep == NULL)
        return 1;
    int rc = call(cli, KVD_METHOD_STATS, rep);
    if (rc == KVD_OK) {
        if (cli->json)
            stats_json(&rep->body.stats_rep);
        else
            stats_table(&rep->body.stats_rep);
    }
    free(rep);
    return rc == KVD_OK ? 0 : 1;
}

int main(int argc, char **argv)
{
    cli_t cli = {.instance = "default", .timeout_ms = 5000};
    const char *socket_path = NULL;
    static const struct option longopts[] = {
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
    while ((c = getopt_long(argc, argv, "+", longopts, NULL)) != -1) {
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
    /* options may also follow the command: "kvdock stats --json" */
    while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        if (c == 'j') {
            cli.json = true;
        } else {
            fprintf(stderr, "kvdock: put connection options before the command\n");
            return EXIT_USAGE;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "kvdock: unexpected argument '%s'\n", argv[optind]);
        return EXIT_USAGE;
    }
    if (socket_path != NULL)
        kvd_strlcpy(cli.socket_path, socket_path, sizeof(cli.socket_path));
    else
        kvd_default_socket_path(cli.instance, cli.socket_path, sizeof(cli.socket_path));

    if (strcmp(cmd, "health") == 0)
        return cmd_health(&cli);
    if (strcmp(cmd, "stats") == 0)
        return cmd_stats(&cli);
    fprintf(stderr, "kvdock: unknown command '%s' (see kvdock --help)\n", cmd);
    return EXIT_USAGE;
}
