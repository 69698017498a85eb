/*
 * bench_cluster_sim.c - `kvdock-bench cluster-sim`: the cluster directory
 * on paper (issue 15). No daemon is started: for clusters of 64, 256 and
 * 1,024 members it places synthetic page keys on their directory owners
 * with the same rendezvous hash the daemons use (kvd_dir_hash,
 * kvd_node_hash, kvd_rendezvous_owner in common/), and reports
 *
 *   - directory entries per daemon (mean, max, max/mean) and the memory
 *     they take at DIR_ENTRY_BYTES each;
 *   - a member leaving: the entries whose owner changes (only the leaver's
 *     share should), and the bytes their holders re-announce to the new
 *     owners at ANNOUNCE_BYTES each;
 *   - a member joining: the entries it takes and from how many others;
 *
 * each against the ideal 1/N.
 *
 * Sampling: a full population (objects per node x N keys, 2^29 at 1,024
 * members) costs N score computations per key and pass, far beyond a small
 * machine; the simulator places --sample-keys keys (the same number for
 * every N) and scales the counts to the population. Shares (fractions) are
 * estimated well by a sample; the maximum over members is not (with m
 * sampled keys per member it carries the binomial noise of m, which a full
 * population of 2^19 per member does not), so next to max/mean it prints
 * what sampling alone gives (the mean of the maxima of N binomial draws,
 * approximated as 1 + sqrt(2 ln N / m)) and the ratio of the counts'
 * standard deviation to the binomial one (1.0: as even as random
 * placement; the hash adds no imbalance of its own).
 *
 * Members are named as the daemons name themselves by default (their
 * advertise address, "10.X.Y.Z:7400") and passed sorted by id, as the
 * daemons must (an owner tie goes to the lower index). Owners are compared
 * by member id, never by index: a leaver or joiner shifts the indices of
 * the members behind it.
 *
 * Benchmarks measure and do not assert, with one exception here: that only
 * the leaver's share moves when a member leaves, and only entries the
 * joiner takes move when one joins, is a property of the hash; when a
 * sampled key breaks it the mode says which and exits 1.
 */
#include "bench.h"

#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* What one directory entry costs its owner (the lead's estimate until the
 * daemon's table is measured): key 32, namespace and tenant ids 8, holder
 * set 16, hash-table slot 8. */
#define DIR_ENTRY_BYTES 64u
/* What a holder sends per entry it (re-)announces to an owner. */
#define ANNOUNCE_BYTES 48u

#define SIM_NAMESPACES_DEFAULT 4
#define SIM_NAMESPACES_MAX     64
#define SIM_NODES_MAX          65536
/* 1 TiB of 2 MiB objects */
#define SIM_OBJECTS_PER_NODE_DEFAULT (1ull << 19)
#define SIM_SAMPLE_KEYS_DEFAULT      (1ull << 20)

typedef struct sim_opts {
    uint64_t nodes[8];
    size_t n_points;
    uint64_t objects_per_node;
    uint64_t sample_keys;
    unsigned namespaces;
    uint64_t seed;
    bool json;
} sim_opts_t;

/* splitmix64: the synthetic keys and the choice of leaver, from --seed */
static uint64_t sim_rand(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

typedef struct sim_member {
    char id[32];
    uint64_t hash;
    uint32_t who; /* which member this is, whatever its index in a list */
} sim_member_t;

static int member_cmp(const void *a, const void *b)
{
    return strcmp(((const sim_member_t *)a)->id, ((const sim_member_t *)b)->id);
}

/* n members with distinct advertise addresses, sorted by id; their hashes
 * into hashes[] in that order. */
static void make_members(sim_member_t *m, size_t n, uint64_t *rng)
{
    for (size_t i = 0; i < n; i++) {
        /* distinct: the index decides Y.Z, the random part only X */
        snprintf(m[i].id, sizeof(m[i].id), "10.%u.%u.%u:7400",
                 (unsigned)(sim_rand(rng) % 200) + 16, (unsigned)(i >> 8) & 0xff,
                 (unsigned)(i & 0xff));
        m[i].who = (uint32_t)i;
    }
    qsort(m, n, sizeof(*m), member_cmp);
    for (size_t i = 0; i < n; i++)
        m[i].hash = kvd_node_hash(m[i].id);
}

/* The owner (its `who`) of every sampled key among the members m[0..n),
 * sorted by id as the daemons pass them. */
static void place(const uint64_t *dir_hashes, size_t n_keys, const sim_member_t *m,
                  size_t n, uint64_t *scratch, uint32_t *owner)
{
    for (size_t i = 0; i < n; i++)
        scratch[i] = m[i].hash;
    for (size_t k = 0; k < n_keys; k++)
        owner[k] = m[kvd_rendezvous_owner(dir_hashes[k], scratch, n)].who;
}

typedef struct sim_point {
    uint64_t nodes;
    uint64_t population; /* objects_per_node x nodes */
    double scale;        /* population / sampled keys */
    /* entries per daemon, scaled to the population */
    double mean, max, max_over_mean, noise_max_over_mean, sd_over_binomial;
    /* a member leaving */
    double leave_share, leave_ideal, leave_bytes;
    uint64_t leave_moved_sampled, leave_wrong;
    /* a member joining */
    double join_share, join_ideal;
    uint64_t join_from, join_wrong;
    double join_from_max_over_mean; /* of the per-member contributions */
} sim_point_t;

static int sim_point(const sim_opts_t *o, uint64_t n, sim_point_t *p)
{
    memset(p, 0, sizeof(*p));
    p->nodes = n;
    p->population = o->objects_per_node * n;
    size_t keys = (size_t)o->sample_keys;
    p->scale = (double)p->population / (double)keys;

    uint64_t rng = o->seed ^ (n * 0x2545f4914f6cdd1dull);
    sim_member_t *m = calloc(n + 1, sizeof(*m));
    sim_member_t *less = calloc(n, sizeof(*less));
    uint64_t *scratch = calloc(n + 1, sizeof(*scratch));
    uint64_t *dir = calloc(keys, sizeof(*dir));
    uint32_t *before = calloc(keys, sizeof(*before));
    uint32_t *after = calloc(keys, sizeof(*after));
    uint64_t *count = calloc(n + 1, sizeof(*count));
    if (!m || !less || !scratch || !dir || !before || !after || !count) {
        fprintf(stderr, "cluster-sim: out of memory at %llu nodes\n",
                (unsigned long long)n);
        free(m), free(less), free(scratch), free(dir), free(before), free(after);
        free(count);
        return -1;
    }
    make_members(m, n, &rng);

    /* synthetic keys: 32 random bytes in one of a few namespaces */
    char ns_names[SIM_NAMESPACES_MAX][KVD_NS_NAME_BYTES];
    for (unsigned i = 0; i < o->namespaces; i++)
        snprintf(ns_names[i], sizeof(ns_names[i]), "model-%u/kv/tp0", i);
    for (size_t k = 0; k < keys; k++) {
        uint8_t key[KVD_KEY_BYTES];
        for (size_t j = 0; j < KVD_KEY_BYTES; j += 8) {
            uint64_t r = sim_rand(&rng);
            memcpy(key + j, &r, 8);
        }
        dir[k] = kvd_dir_hash("default", ns_names[sim_rand(&rng) % o->namespaces], key);
    }

    /* entries per daemon */
    place(dir, keys, m, n, scratch, before);
    for (size_t k = 0; k < keys; k++)
        count[before[k]]++;
    double per = (double)keys / (double)n, sum_sq = 0, max = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)count[i] - per;
        sum_sq += d * d;
        if ((double)count[i] > max)
            max = (double)count[i];
    }
    double binomial_sd = sqrt(per * (1.0 - 1.0 / (double)n));
    p->mean = per * p->scale;
    p->max = max * p->scale;
    p->max_over_mean = max / per;
    p->noise_max_over_mean = 1.0 + sqrt(2.0 * log((double)n) / per);
    p->sd_over_binomial = sqrt(sum_sq / (double)n) / binomial_sd;

    /* a member leaves: the others, in id order, without it */
    size_t leaver = (size_t)(sim_rand(&rng) % n);
    for (size_t i = 0, j = 0; i < n; i++)
        if (i != leaver)
            less[j++] = m[i];
    place(dir, keys, less, n - 1, scratch, after);
    for (size_t k = 0; k < keys; k++) {
        if (before[k] == after[k])
            continue;
        p->leave_moved_sampled++;
        if (before[k] != m[leaver].who)
            p->leave_wrong++;
    }
    p->leave_share = (double)p->leave_moved_sampled / (double)keys;
    p->leave_ideal = 1.0 / (double)n;
    p->leave_bytes = (double)p->leave_moved_sampled * p->scale * ANNOUNCE_BYTES;

    /* a member joins: a fresh id sorted in among the others */
    sim_member_t joiner;
    /* X of 216.. is no other member's */
    snprintf(joiner.id, sizeof(joiner.id), "10.%u.%u.%u:7400",
             (unsigned)(sim_rand(&rng) % 30) + 216, (unsigned)(sim_rand(&rng) % 256),
             (unsigned)(sim_rand(&rng) % 256));
    joiner.hash = kvd_node_hash(joiner.id);
    joiner.who = (uint32_t)n;
    m[n] = joiner;
    qsort(m, n + 1, sizeof(*m), member_cmp);
    place(dir, keys, m, n + 1, scratch, after);
    memset(count, 0, (n + 1) * sizeof(*count));
    uint64_t taken = 0;
    for (size_t k = 0; k < keys; k++) {
        if (before[k] == after[k])
            continue;
        taken++;
        if (after[k] != joiner.who)
            p->join_wrong++;
        else
            count[before[k]]++;
    }
    uint64_t from_max = 0;
    for (size_t i = 0; i < n + 1; i++) {
        if (count[i] > 0)
            p->join_from++;
        if (count[i] > from_max)
            from_max = count[i];
    }
    p->join_share = (double)taken / (double)keys;
    p->join_ideal = 1.0 / (double)(n + 1);
    p->join_from_max_over_mean =
        p->join_from ? (double)from_max / ((double)taken / (double)p->join_from) : 0;

    free(m), free(less), free(scratch), free(dir), free(before), free(after);
    free(count);
    return 0;
}

static void sim_print(const sim_opts_t *o, const sim_point_t *p)
{
    const double mib = 1024.0 * 1024.0;
    if (o->json) {
        printf("{\"mode\":\"cluster-sim\",\"nodes\":%llu,\"objects_per_node\":%llu,"
               "\"sample_keys\":%llu,\"entries_mean\":%.0f,\"entries_max\":%.0f,"
               "\"max_over_mean\":%.4f,\"sampling_max_over_mean\":%.4f,"
               "\"sd_over_binomial\":%.3f,\"dir_entry_bytes\":%u,"
               "\"dir_bytes_mean\":%.0f,\"dir_bytes_max\":%.0f,"
               "\"leave_share\":%.6f,\"leave_ideal\":%.6f,\"leave_only_leaver\":%s,"
               "\"announce_bytes\":%u,\"leave_reannounce_bytes\":%.0f,"
               "\"join_share\":%.6f,\"join_ideal\":%.6f,\"join_only_joiner\":%s,"
               "\"join_from\":%llu,\"join_from_max_over_mean\":%.3f}\n",
               (unsigned long long)p->nodes, (unsigned long long)o->objects_per_node,
               (unsigned long long)o->sample_keys, p->mean, p->max, p->max_over_mean,
               p->noise_max_over_mean, p->sd_over_binomial, DIR_ENTRY_BYTES,
               p->mean * DIR_ENTRY_BYTES, p->max * DIR_ENTRY_BYTES, p->leave_share,
               p->leave_ideal, p->leave_wrong ? "false" : "true", ANNOUNCE_BYTES,
               p->leave_bytes, p->join_share, p->join_ideal,
               p->join_wrong ? "false" : "true", (unsigned long long)p->join_from,
               p->join_from_max_over_mean);
        return;
    }
    printf("%6llu %10.0f %10.0f %6.3f (%5.3f) %5.2f %9.1f %9.1f | %6.3f%% %6.3f%% %4s "
           "%9.1f | %6.3f%% %6.3f%% %4s %5llu %5.2f\n",
           (unsigned long long)p->nodes, p->mean, p->max, p->max_over_mean,
           p->noise_max_over_mean, p->sd_over_binomial, p->mean * DIR_ENTRY_BYTES / mib,
           p->max * DIR_ENTRY_BYTES / mib, 100.0 * p->leave_share, 100.0 * p->leave_ideal,
           p->leave_wrong ? "NO" : "yes", p->leave_bytes / mib, 100.0 * p->join_share,
           100.0 * p->join_ideal, p->join_wrong ? "NO" : "yes",
           (unsigned long long)p->join_from, p->join_from_max_over_mean);
}

static void sim_usage(FILE *f)
{
    fprintf(f,
            "Usage: kvdock-bench cluster-sim [--nodes N[,N...]] [--objects-per-node N]\n"
            "         [--sample-keys N] [--namespaces N] [--seed S] [--json]\n"
            "The cluster directory on paper: entries per daemon, and what a member\n"
            "leaving or joining moves, with the daemons' rendezvous hash.\n"
            "  --nodes             cluster sizes (default 64,256,1024)\n"
            "  --objects-per-node  objects each member holds (default 2^19: 1 TiB of\n"
            "                      2 MiB objects)\n"
            "  --sample-keys       keys placed per size, scaled to the population\n"
            "                      (default 2^20)\n"
            "  --namespaces        namespaces the keys are spread over (default 4)\n"
            "  --seed              the keys' and members' seed (default 1)\n"
            "Exit 1 when a key moves that the hash should not move.\n");
}

static int parse_nodes(const char *text, sim_opts_t *o)
{
    char buf[128];
    kvd_strlcpy(buf, text, sizeof(buf));
    o->n_points = 0;
    char *save = NULL;
    for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        uint64_t v;
        if (o->n_points >= KVD_ARRAY_SIZE(o->nodes) ||
            kvd_u64_parse(t, 2, SIM_NODES_MAX, &v) != KVD_OK)
            return -1;
        o->nodes[o->n_points++] = v;
    }
    return o->n_points ? 0 : -1;
}

int bench_mode_cluster_sim(int argc, char **argv)
{
    sim_opts_t o = {.nodes = {64, 256, 1024},
                    .n_points = 3,
                    .objects_per_node = SIM_OBJECTS_PER_NODE_DEFAULT,
                    .sample_keys = SIM_SAMPLE_KEYS_DEFAULT,
                    .namespaces = SIM_NAMESPACES_DEFAULT,
                    .seed = 1};
    static const struct option longopts[] = {
        {"nodes", required_argument, NULL, 'n'},
        {"objects-per-node", required_argument, NULL, 'o'},
        {"sample-keys", required_argument, NULL, 'k'},
        {"namespaces", required_argument, NULL, 's'},
        {"seed", required_argument, NULL, 'S'},
        {"json", no_argument, NULL, 'j'},
        {"help", no_argument, NULL, 'h'},
        {0, 0, 0, 0},
    };
    int c;
    uint64_t v;
    while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        switch (c) {
        case 'n':
            if (parse_nodes(optarg, &o) != 0) {
                fprintf(stderr,
                        "cluster-sim: --nodes takes sizes 2..%u, comma-separated\n",
                        SIM_NODES_MAX);
                return BENCH_EXIT_USAGE;
            }
            break;
        case 'o':
        case 'k':
        case 's':
        case 'S':
            if (kvd_u64_parse(optarg, c == 'S' ? 0 : 1,
                              c == 's'   ? SIM_NAMESPACES_MAX
                              : c == 'k' ? (1ull << 32)
                                         : UINT64_MAX / SIM_NODES_MAX,
                              &v) != KVD_OK) {
                fprintf(stderr, "cluster-sim: bad value '%s'\n", optarg);
                sim_usage(stderr);
                return BENCH_EXIT_USAGE;
            }
            if (c == 'o')
                o.objects_per_node = v;
            else if (c == 'k')
                o.sample_keys = v;
            else if (c == 's')
                o.namespaces = (unsigned)v;
            else
                o.seed = v;
            break;
        case 'j': o.json = true; break;
        case 'h': sim_usage(stdout); return BENCH_EXIT_OK;
        default: sim_usage(stderr); return BENCH_EXIT_USAGE;
        }
    }
    if (optind != argc) {
        sim_usage(stderr);
        return BENCH_EXIT_USAGE;
    }
    if (!o.json) {
        printf("cluster-sim: %llu objects per node, %llu sampled keys per size in %u "
               "namespaces, seed %llu\n"
               "directory entry %u B (key 32, namespace and tenant ids 8, holder set 16, "
               "hash-table slot 8: an estimate); announce %u B per entry\n"
               "max/mean in (): what sampling alone gives; sd/bin: the counts' standard "
               "deviation over the binomial one\n\n",
               (unsigned long long)o.objects_per_node, (unsigned long long)o.sample_keys,
               o.namespaces, (unsigned long long)o.seed, DIR_ENTRY_BYTES, ANNOUNCE_BYTES);
        printf("%6s %10s %10s %14s %5s %9s %9s | %7s %7s %4s %9s | %7s %7s %4s %5s %5s\n",
               "nodes", "entries", "max", "max/mean", "sd/bn", "MiB/dmn", "max MiB",
               "leave", "ideal", "only", "reann MiB", "join", "ideal", "only", "from",
               "f.max");
    }
    int status = BENCH_EXIT_OK;
    for (size_t i = 0; i < o.n_points; i++) {
        sim_point_t p;
        if (sim_point(&o, o.nodes[i], &p) != 0)
            return BENCH_EXIT_FAIL;
        sim_print(&o, &p);
        fflush(stdout);
        if (p.leave_wrong || p.join_wrong) {
            fprintf(stderr,
                    "cluster-sim: at %llu nodes %llu sampled keys moved between members "
                    "that neither left nor joined (leave %llu, join %llu)\n",
                    (unsigned long long)p.nodes,
                    (unsigned long long)(p.leave_wrong + p.join_wrong),
                    (unsigned long long)p.leave_wrong, (unsigned long long)p.join_wrong);
            status = BENCH_EXIT_FAIL;
        }
    }
    return status;
}
