/*
 * cmd_daemon.c - the kvdock commands about the daemon itself: health and
 * stats (memory, connections, RPC counters, the store, its namespaces, the
 * RDMA ports).
 *
 * The store's figures, the namespaces and the ports are printed from their
 * field lists (kvd_proto.h): --json (proto/'s kvd_json_*) and the table
 * name each field as kvdock.proto and /metrics do.
 */
#include "cli.h"

#include <stdlib.h>

int cmd_health(const cli_t *cli, const cli_args_t *a)
{
    if (!cli_no_args("health", a))
        return EXIT_USAGE;
    kvd_msg_t rep = {0};
    if (cli_call_empty(cli, KVD_METHOD_HEALTH, &rep) != KVD_OK) {
        kvd_msg_clear(&rep);
        return 1;
    }
    const kvd_health_rep_t *h = &rep.body.health_rep;
    if (cli->json) {
        kvd_json_health(stdout, h);
        putchar('\n');
    } else {
        char a1[32], b1[32];
        printf("%s (pool %s of %s populated, up %.1f s)%s%s\n", kvd_health_name(h->state),
               kvd_size_format(h->populated_bytes, a1, sizeof(a1)),
               kvd_size_format(h->pool_bytes, b1, sizeof(b1)),
               (double)h->uptime_ms / 1000.0,
               h->cluster != KVD_CLUSTER_OFF ? ", cluster " : "",
               h->cluster != KVD_CLUSTER_OFF ? kvd_cluster_state_name(h->cluster) : "");
    }
    int status = h->state == KVD_HEALTH_READY ? 0 : EXIT_NOT_READY;
    kvd_msg_clear(&rep);
    return status;
}

int cmd_cluster(const cli_t *cli, const cli_args_t *a)
{
    if (!cli_no_args("cluster", a))
        return EXIT_USAGE;
    kvd_msg_t rep = {0};
    if (cli_call_empty(cli, KVD_METHOD_CLUSTER, &rep) != KVD_OK) {
        kvd_msg_clear(&rep);
        return 1;
    }
    const kvd_cluster_rep_t *c = &rep.body.cluster_rep;
    if (cli->json) {
        kvd_json_cluster(stdout, c);
        putchar('\n');
    } else if (c->state == KVD_CLUSTER_OFF) {
        printf("no cluster (%s)\n", c->etcd);
    } else {
        printf("cluster %s, node %s, epoch %llu, etcd %s\n",
               kvd_cluster_state_name(c->state), c->node_id, (unsigned long long)c->epoch,
               c->etcd);
        printf("%-24s %-22s %10s %10s %10s %10s\n", "member", "address", "pool",
               "objects", "directory", "heartbeat");
        for (size_t i = 0; i < c->n_members; i++) {
            const kvd_member_msg_t *m = &c->members[i];
            char p[32], hb[32];
            snprintf(hb, sizeof(hb), "%.1f s ago", (double)m->heartbeat_ms_ago / 1000.0);
            printf("%-24s %-22s %10s %10llu %10llu %10s%s\n", m->node_id, m->address,
                   kvd_size_format(m->pool_bytes, p, sizeof(p)),
                   (unsigned long long)m->objects,
                   (unsigned long long)m->directory_entries, hb,
                   m->self ? "  (this daemon)" : "");
        }
    }
    kvd_msg_clear(&rep);
    return 0;
}

static void memory_table(const kvd_mem_stats_t *m)
{
    char a[32], b[32];
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
    const uint64_t own[KVD_MEM_CAT_COUNT] = {m->conn_bytes, m->index_bytes,
                                             m->staging_bytes, m->other_bytes};
    for (int c = 0; c < KVD_MEM_CAT_COUNT; c++) {
        char label[40];
        snprintf(label, sizeof(label), "allocated: %s",
                 kvd_mem_cat_name((kvd_mem_cat_t)c));
        printf("%-26s %s\n", label, kvd_size_format(own[c], a, sizeof(a)));
    }
}

static void methods_table(const kvd_stats_rep_t *st)
{
    printf("%-14s %12s %10s %14s\n", "method", "calls", "errors", "mean latency");
    for (size_t i = 1; i < KVD_METHOD_COUNT; i++) {
        const kvd_method_stats_t *ms = &st->methods[i];
        char mean[32] = "-";
        if (ms->calls)
            snprintf(mean, sizeof(mean), "%.1f us",
                     (double)ms->latency_us_sum / (double)ms->calls);
        printf("%-14s %12llu %10llu %14s\n", kvd_method_name((kvd_method_t)i),
               (unsigned long long)ms->calls, (unsigned long long)ms->errors, mean);
    }
}

/* The store, each namespace and the RDMA ports, field by field. */
static void store_table(const kvd_stats_rep_t *st)
{
    const kvd_store_stats_msg_t *ss = &st->store;
    char a[32], b[32];
    uint64_t used = ss->pool_bytes - ss->free_bytes;
    printf("\nstore: %s used of %s (%.1f%%), hit rate %.1f%%\n",
           kvd_size_format(used, a, sizeof(a)),
           kvd_size_format(ss->pool_bytes, b, sizeof(b)),
           ss->pool_bytes ? 100.0 * (double)used / (double)ss->pool_bytes : 0.0,
           ss->lookup_pages ? 100.0 * (double)ss->hit_pages / (double)ss->lookup_pages
                            : 0.0);
    cli_table_fields(&kvd_store_stats_fields, ss, 2);
    for (size_t i = 0; i < st->n_namespaces; i++) {
        printf("\nnamespace %s:\n", st->namespaces[i].name);
        cli_table_fields(&kvd_ns_fields, &st->namespaces[i], 2);
    }
    if (st->n_nics == 0) {
        printf("\nnics: no RDMA devices\n");
        return;
    }
    printf("\nnics:\n");
    cli_table_rows(&kvd_nic_fields, st->nics, st->n_nics, sizeof(*st->nics), 2);
}

static void stats_table(const kvd_stats_rep_t *st)
{
    printf("kvdockd %s, instance %s: %s, up %.1f s\n\n", st->daemon_version, st->instance,
           kvd_health_name(st->state), (double)st->uptime_ms / 1000.0);
    memory_table(&st->memory);
    printf("%-26s %llu open, %llu accepted, %llu rejected\n", "connections",
           (unsigned long long)st->connections_current,
           (unsigned long long)st->connections_total,
           (unsigned long long)st->connections_rejected);
    printf("%-26s %llu\n", "protocol errors", (unsigned long long)st->protocol_errors);
    printf("%-26s %llu\n", "auth failures", (unsigned long long)st->auth_failures);
    printf("%-26s %llu now, %llu since the start\n\n", "acquires held",
           (unsigned long long)st->acquires_held,
           (unsigned long long)st->acquires_held_total);
    methods_table(st);
    store_table(st);
}

int cmd_stats(const cli_t *cli, const cli_args_t *a)
{
    if (!cli_no_args("stats", a))
        return EXIT_USAGE;
    kvd_msg_t *req = calloc(2, sizeof(kvd_msg_t));
    if (req == NULL)
        return 1;
    kvd_msg_t *rep = req + 1;
    kvd_msg_request(req, 0, KVD_METHOD_STATS);
    req->body.stats_req.check = a->check;
    int rc = cli_call(cli, req, rep);
    bool broken = false;
    if (rc == KVD_OK) {
        const kvd_stats_rep_t *st = &rep->body.stats_rep;
        if (cli->json) {
            kvd_json_stats(stdout, st);
            putchar('\n');
        } else {
            stats_table(st);
        }
        broken = a->check && (!st->checked || st->check_error[0] != '\0');
        if (a->check && !cli->json)
            printf("\ninvariant check: %s%s (the daemon waited %.1f ms)\n",
                   broken ? "FAILED: " : "ok", broken ? st->check_error : "",
                   (double)st->check_us / 1000.0);
    }
    kvd_msg_clear(rep);
    free(req);
    return rc == KVD_OK && !broken ? 0 : 1;
}
