/*
 * bench_linker.c - mode `linker` of kvdock-bench: offload and load through
 * libkvdock's whole path (RPC + copies on its load and offload threads) for three
 * model layouts, against a kvdockd started here, with host memory standing
 * in for device memory. The reference in the same run is a single-core
 * memcpy of the same bytes from the device buffers, measured in every run
 * just before its load; the table shows the best load against the best
 * memcpy and the median over the runs of load / the memcpy before it.
 *
 * Layouts (page 64 tokens, bf16):
 *   mha:    32 layers, K and V of 8 heads x 128  (8 MiB per page object)
 *   mla:    61 layers, one 576-wide latent buffer, rank-replicated
 *   hybrid: 12 attention layers as mha plus 36 mamba layers with a 64 KiB
 *           temporal state and an 8 KiB conv state per node, one node
 *           every 8 pages
 * Each run offloads the pages of one prompt (fresh keys), waits for the
 * completion, wipes the device buffers, then loads them back layer-wise:
 * time to the first layer in place (the median over the runs), and the
 * whole load in GB/s (the best run).
 *
 * --spin-us sets the linker's spin_us (-1: its threads sleep at once).
 *
 * --beside-offload queues, right before each load, an offload of as many
 * fresh pages from other device rows (the attention pool's), so that the
 * load and its first layer are measured with an offload running beside
 * them.
 *
 * --pool SIZE sizes the daemon's pool (default 3G: every run lands on pool
 * memory nobody has written through the writer's mapping yet, which on
 * this VM is the slow case; a pool smaller than the runs' bytes, e.g.
 * 768M, recycles memory through eviction and measures the steady state).
 *
 * With --transport ucx the bytes move by UCX RMA (UCX_TLS chooses what
 * runs underneath) and the reference is ucx_perftest in the same run and
 * the same UCX_TLS: ucp_get and ucp_put_bw at the size of one operation of
 * the layout (one page's rows of one buffer: what the linker posts), and
 * ucp_am_bw at 8 MiB (the size of a message of the linker's message mode,
 * which KVDOCK_UCX_MODE / auto picks on TCP).
 */
#include "bench.h"
#include "kvdock.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define PAGE       64
#define MAX_LAYERS 64

typedef struct layout {
    const char *name;
    uint32_t attn_layers;
    uint32_t attn_buffers; /* 2 (K, V) or 1 (MLA latent) */
    uint64_t attn_row;     /* bytes per token row of one buffer */
    bool replicated;
    uint32_t mamba_layers;
    uint64_t mamba_a, mamba_b; /* bytes of the two state buffers */
    uint32_t pages_per_node;
} layout_t;

static const layout_t layouts[] = {
    {"mha", 32, 2, 8 * 128 * 2, false, 0, 0, 0, 0},
    {"mla", 61, 1, 576 * 2, true, 0, 0, 0, 0},
    {"hybrid", 12, 2, 8 * 128 * 2, false, 36, 64 * 1024, 8 * 1024, 8},
};

typedef struct dev {
    uint8_t *attn[MAX_LAYERS][2];
    uint8_t *mamba[MAX_LAYERS][2];
    uint64_t attn_bytes, mamba_bytes; /* per buffer */
    uint8_t *ref;                     /* the memcpy reference's destination */
    uint64_t total;                   /* bytes of all buffers */
} dev_t_;

static uint64_t mix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    return z ^ (z >> 27);
}

/* `halves` 2: each attention buffer holds the rows of twice the pages, the
 * second half for the offload beside the load. */
static int dev_alloc(const layout_t *lo, uint32_t pages, uint32_t halves, dev_t_ *d)
{
    memset(d, 0, sizeof(*d));
    d->attn_bytes = (uint64_t)pages * PAGE * lo->attn_row;
    uint32_t nodes = lo->pages_per_node ? pages / lo->pages_per_node : 0;
    for (uint32_t l = 0; l < lo->attn_layers; l++)
        for (uint32_t b = 0; b < lo->attn_buffers; b++) {
            if ((d->attn[l][b] = malloc(d->attn_bytes * halves)) == NULL)
                return -1;
            memset(d->attn[l][b], 3, d->attn_bytes * halves);
        }
    for (uint32_t l = 0; l < lo->mamba_layers; l++) {
        d->mamba[l][0] = malloc((uint64_t)nodes * lo->mamba_a);
        d->mamba[l][1] = malloc((uint64_t)nodes * lo->mamba_b);
        if (!d->mamba[l][0] || !d->mamba[l][1])
            return -1;
    }
    /* allocated and written once: measuring the reference maps nothing
     * new between runs (on this VM a fresh mapping slows what follows) */
    d->total = (uint64_t)lo->attn_layers * lo->attn_buffers * d->attn_bytes +
               (uint64_t)lo->mamba_layers * nodes * (lo->mamba_a + lo->mamba_b);
    if ((d->ref = malloc(d->total)) == NULL)
        return -1;
    memset(d->ref, 1, d->total);
    return 0;
}

static void dev_fill(const layout_t *lo, uint32_t pages, dev_t_ *d, int byte)
{
    uint32_t nodes = lo->pages_per_node ? pages / lo->pages_per_node : 0;
    for (uint32_t l = 0; l < lo->attn_layers; l++)
        for (uint32_t b = 0; b < lo->attn_buffers; b++)
            memset(d->attn[l][b], byte + (int)l, d->attn_bytes);
    for (uint32_t l = 0; l < lo->mamba_layers; l++) {
        memset(d->mamba[l][0], byte + 1, (uint64_t)nodes * lo->mamba_a);
        memset(d->mamba[l][1], byte + 2, (uint64_t)nodes * lo->mamba_b);
    }
}

static void dev_free(const layout_t *lo, dev_t_ *d)
{
    for (uint32_t l = 0; l < lo->attn_layers; l++)
        for (uint32_t b = 0; b < 2; b++)
            free(d->attn[l][b]);
    for (uint32_t l = 0; l < lo->mamba_layers; l++) {
        free(d->mamba[l][0]);
        free(d->mamba[l][1]);
    }
    free(d->ref);
}

/* Registers the layout's pools; attention layers get even ids, mamba odd. */
static int register_pools(kvd_linker_t *lk, const layout_t *lo, uint32_t pages,
                          uint32_t halves, dev_t_ *d, uint32_t *attn_id,
                          uint32_t *mamba_id)
{
    kvd_pool_layer_t layers[MAX_LAYERS];
    memset(layers, 0, sizeof(layers));
    for (uint32_t l = 0; l < lo->attn_layers; l++) {
        layers[l].layer_id = 2 * l;
        layers[l].n_buffers = lo->attn_buffers;
        for (uint32_t b = 0; b < lo->attn_buffers; b++)
            layers[l].buffers[b] =
                (kvd_pool_buffer_t){d->attn[l][b], lo->attn_row, lo->attn_row};
    }
    kvd_pool_desc_t kv = {.name = "kv",
                          .addressing = KVD_ADDR_PAGED,
                          .page_size = PAGE,
                          .n_rows = (uint64_t)pages * PAGE * halves,
                          .rank_replicated = lo->replicated,
                          .memory = KVD_MEM_HOST,
                          .n_layers = lo->attn_layers,
                          .layers = layers};
    int rc = kvd_register_pool(lk, &kv, attn_id);
    if (rc != 0 || lo->mamba_layers == 0)
        return rc;
    for (uint32_t l = 0; l < lo->mamba_layers; l++) {
        layers[l].layer_id = 2 * l + 1;
        layers[l].n_buffers = 2;
        layers[l].buffers[0] =
            (kvd_pool_buffer_t){d->mamba[l][0], lo->mamba_a, lo->mamba_a};
        layers[l].buffers[1] =
            (kvd_pool_buffer_t){d->mamba[l][1], lo->mamba_b, lo->mamba_b};
    }
    kvd_pool_desc_t st = {.name = "mamba",
                          .addressing = KVD_ADDR_SLOT,
                          .n_rows = pages / lo->pages_per_node,
                          .trailing_pages = 1,
                          .memory = KVD_MEM_HOST,
                          .n_layers = lo->mamba_layers,
                          .layers = layers};
    return kvd_register_pool(lk, &st, mamba_id);
}

typedef struct lk_result {
    uint64_t bytes;
    double offload_gbs, load_gbs, first_layer_ms, memcpy_gbs;
} lk_result_t;

/* Pops one completion within 60 s. */
static int wait_done(kvd_linker_t *lk, bool load, uint64_t id)
{
    kvd_completion_t c;
    size_t n = 0;
    uint64_t until = kvd_now_ns() + 60000000000ull;
    while (kvd_now_ns() < until) {
        if (load)
            kvd_pop_completed_loads(lk, &c, 1, &n);
        else
            kvd_pop_completed_offloads(lk, &c, 1, &n);
        if (n == 1)
            return c.id == id && c.success ? 0 : -1;
        kvd_sleep_ns(20000);
    }
    return -1;
}

static double memcpy_gbs(const layout_t *lo, uint32_t pages, dev_t_ *d);

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Queues the offload that runs beside a load: `pages` fresh pages from
 * the second half of the attention rows. *ack names it. */
static int offload_beside(kvd_linker_t *lk, uint32_t pages, uint32_t attn_id,
                          uint64_t seed, uint64_t *ack)
{
    size_t rows = (size_t)pages * PAGE, nk = 0;
    uint32_t *tokens = malloc(rows * sizeof(uint32_t));
    kvd_key_t *keys = malloc(pages * sizeof(kvd_key_t));
    int64_t *idx = malloc(rows * sizeof(int64_t));
    int rc = tokens && keys && idx ? 0 : -1;
    for (size_t i = 0; rc == 0 && i < rows; i++) {
        tokens[i] = (uint32_t)mix(&seed);
        idx[i] = (int64_t)(rows + i);
    }
    if (rc == 0)
        rc = kvd_page_keys(tokens, rows, PAGE, NULL, (uint8_t(*)[KVD_PAGE_KEY_BYTES])keys,
                           &nk);
    kvd_transfer_t t = {.pool_id = attn_id,
                        .keys = (const uint8_t(*)[KVD_PAGE_KEY_BYTES])keys,
                        .n_keys = pages,
                        .device_indices = idx,
                        .n_indices = rows};
    if (rc == 0)
        rc = kvd_offload(lk, &t, 1, ack); /* the arrays are copied */
    free(tokens);
    free(keys);
    free(idx);
    return rc;
}

/* One offload and load of a fresh prompt. With `ref`, the memcpy reference
 * is measured in between (after the offload, before the load), so that the
 * two see the same state of the machine. With `beside`, an offload of as
 * many other pages is queued right before the load. */
static int one_run(kvd_linker_t *lk, const layout_t *lo, uint32_t pages, dev_t_ *d,
                   uint32_t attn_id, uint32_t mamba_id, uint64_t seed, bool ref,
                   bool beside, lk_result_t *r)
{
    uint32_t *tokens = malloc((size_t)pages * PAGE * sizeof(uint32_t));
    kvd_key_t *keys = malloc(pages * sizeof(kvd_key_t));
    int64_t *idx = malloc((size_t)pages * PAGE * sizeof(int64_t));
    uint32_t nodes = lo->pages_per_node ? pages / lo->pages_per_node : 0;
    kvd_key_t *node_keys = malloc((nodes + 1) * sizeof(kvd_key_t));
    int64_t *slots = malloc((nodes + 1) * sizeof(int64_t));
    uint32_t *depths = malloc((nodes + 1) * sizeof(uint32_t));
    int rc = tokens && keys && idx && node_keys && slots && depths ? 0 : -1;
    size_t nk = 0;
    for (size_t i = 0; rc == 0 && i < (size_t)pages * PAGE; i++) {
        tokens[i] = (uint32_t)mix(&seed);
        idx[i] = (int64_t)i;
    }
    if (rc == 0)
        rc = kvd_page_keys(tokens, (size_t)pages * PAGE, PAGE, NULL,
                           (uint8_t(*)[KVD_PAGE_KEY_BYTES])keys, &nk);
    for (uint32_t n = 0; n < nodes; n++) {
        memcpy(node_keys[n], keys[(n + 1) * lo->pages_per_node - 1], sizeof(kvd_key_t));
        slots[n] = n;
        depths[n] = (n + 1) * lo->pages_per_node - 1;
    }
    kvd_transfer_t t[2] = {
        {.pool_id = attn_id,
         .keys = (const uint8_t(*)[KVD_PAGE_KEY_BYTES])keys,
         .n_keys = pages,
         .device_indices = idx,
         .n_indices = (size_t)pages * PAGE},
        {.pool_id = mamba_id,
         .keys = (const uint8_t(*)[KVD_PAGE_KEY_BYTES])node_keys,
         .n_keys = nodes,
         .device_indices = slots,
         .n_indices = nodes,
         .depths = depths},
    };
    size_t nt = nodes ? 2 : 1;
    dev_fill(lo, pages, d, (int)(seed & 0x3f));
    uint64_t ack = 0, t0 = kvd_now_ns();
    if (rc == 0)
        rc = kvd_offload(lk, t, nt, &ack);
    if (rc == 0)
        rc = wait_done(lk, false, ack);
    double off_s = (double)(kvd_now_ns() - t0) / 1e9;
    r->memcpy_gbs = ref && rc == 0 ? memcpy_gbs(lo, pages, d) : 0;
    dev_fill(lo, pages, d, 0);
    uint64_t rid = seed, beside_ack = 0;
    uint32_t counter = 0;
    if (rc == 0 && beside)
        rc = offload_beside(lk, pages, attn_id, seed ^ 0x5bd1e995u, &beside_ack);
    t0 = kvd_now_ns();
    if (rc == 0)
        rc = kvd_load(lk, rid, t, nt);
    if (rc == 0)
        rc = kvd_load_prepare(lk, rid);
    kvd_commit_pool_t c[2] = {{.adopted_begin = 0, .adopted_end = pages}, {0}};
    if (rc == 0)
        rc = kvd_load_commit(lk, rid, c, nt);
    if (rc == 0)
        rc = kvd_start_layer_wise_loading(lk, &counter);
    if (rc == 0)
        rc = kvd_wait_layer(lk, counter, 0);
    double first_ms = (double)(kvd_now_ns() - t0) / 1e6;
    uint32_t top = 2 * KVD_MAX(lo->attn_layers, lo->mamba_layers);
    for (uint32_t layer = 0; rc == 0 && layer < top; layer++)
        rc = kvd_wait_layer(lk, counter, layer);
    if (rc == 0)
        rc = wait_done(lk, true, rid);
    double load_s = (double)(kvd_now_ns() - t0) / 1e9;
    if (rc == 0 && beside)
        rc = wait_done(lk, false, beside_ack);
    uint64_t bytes =
        (uint64_t)lo->attn_layers * lo->attn_buffers * pages * PAGE * lo->attn_row +
        (uint64_t)lo->mamba_layers * nodes * (lo->mamba_a + lo->mamba_b);
    r->bytes = bytes;
    r->offload_gbs = (double)bytes / off_s / 1e9;
    r->load_gbs = (double)bytes / load_s / 1e9;
    r->first_layer_ms = first_ms;
    free(tokens);
    free(keys);
    free(idx);
    free(node_keys);
    free(slots);
    free(depths);
    return rc;
}

/* The same bytes, one core: every device buffer copied into its own place
 * of one buffer as large as all of them (written once before, so neither
 * side is fresh memory nor stays in a cache between copies). */
static double memcpy_gbs(const layout_t *lo, uint32_t pages, dev_t_ *d)
{
    uint32_t nodes = lo->pages_per_node ? pages / lo->pages_per_node : 0;
    uint8_t *dst = d->ref;
    uint64_t off = 0, t0 = kvd_now_ns();
    for (uint32_t l = 0; l < lo->attn_layers; l++)
        for (uint32_t b = 0; b < lo->attn_buffers; b++) {
            memcpy(dst + off, d->attn[l][b], d->attn_bytes);
            off += d->attn_bytes;
        }
    for (uint32_t l = 0; l < lo->mamba_layers; l++) {
        memcpy(dst + off, d->mamba[l][0], (uint64_t)nodes * lo->mamba_a);
        off += (uint64_t)nodes * lo->mamba_a;
        memcpy(dst + off, d->mamba[l][1], (uint64_t)nodes * lo->mamba_b);
        off += (uint64_t)nodes * lo->mamba_b;
    }
    __asm__ volatile("" ::: "memory");
    double s = (double)(kvd_now_ns() - t0) / 1e9;
    return (double)d->total / s / 1e9;
}

/* The size of one linker operation for the layout: a page's rows of one
 * attention buffer (contiguous on the device and in the object). */
static uint64_t op_bytes(const layout_t *lo)
{
    return (uint64_t)PAGE * lo->attn_row;
}

/* ucx_perftest's bandwidth (GB/s) for `test` at `size` bytes, between a
 * server and a client started here on loopback; 0 when it failed. */
static double perftest_gbs(const char *test, uint64_t size)
{
    int port = 20000 + (int)(getpid() % 20000);
    char ports[16];
    snprintf(ports, sizeof(ports), "%d", port);
    pid_t parent = getpid();
    pid_t srv = fork();
    if (srv < 0)
        return 0;
    if (srv == 0) {
        if (bench_child_tie_to_parent(parent) != 0)
            _exit(127);
        int null = open("/dev/null", O_WRONLY);
        if (null >= 0) {
            dup2(null, STDOUT_FILENO);
            dup2(null, STDERR_FILENO);
        }
        execlp("ucx_perftest", "ucx_perftest", "-p", ports, (char *)NULL);
        _exit(127);
    }
    /* enough iterations for ~1 GiB, at least 200 */
    uint64_t iters = KVD_MAX((1ull << 30) / size, 200ull);
    char cmd[256];
    snprintf(cmd, sizeof(cmd),
             "timeout 60 ucx_perftest 127.0.0.1 -p %d -t %s -s %llu -n %llu 2>/dev/null",
             port, test, (unsigned long long)size, (unsigned long long)iters);
    double mbs = 0;
    for (int attempt = 0; attempt < 50 && mbs == 0; attempt++) {
        usleep(100 * 1000); /* the server listens within a few 100 ms */
        FILE *f = popen(cmd, "r");
        if (f == NULL)
            break;
        char line[512];
        while (fgets(line, sizeof(line), f)) {
            double v[8];
            /* Final: iters, lat typical, avg, overall, BW avg, overall, rate... */
            if (sscanf(line, " Final: %lf %lf %lf %lf %lf %lf", &v[0], &v[1], &v[2],
                       &v[3], &v[4], &v[5]) == 6)
                mbs = v[5];
        }
        pclose(f);
        if (mbs == 0 && waitpid(srv, NULL, WNOHANG) == srv) {
            srv = 0; /* the server died: nothing to retry against */
            break;
        }
    }
    if (srv > 0)
        bench_stop_child(&srv, "ucx_perftest");
    return mbs * 1048576.0 / 1e9; /* ucx_perftest's MB is 2^20 bytes */
}

int bench_mode_linker(int argc, char **argv)
{
    const char *kvdockd = NULL;
    const char *transport = "shm", *pool_size = "3G";
    uint64_t pages = 32, runs = 3;
    int spin_us = 0; /* the linker's default */
    bool beside = false;
    static const struct option longopts[] = {{"kvdockd", required_argument, NULL, 'k'},
                                             {"pages", required_argument, NULL, 'p'},
                                             {"runs", required_argument, NULL, 'r'},
                                             {"transport", required_argument, NULL, 't'},
                                             {"pool", required_argument, NULL, 'P'},
                                             {"spin-us", required_argument, NULL, 's'},
                                             {"beside-offload", no_argument, NULL, 'B'},
                                             {NULL, 0, NULL, 0}};
    int c;
    uint64_t sp = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        if (c == 'k')
            kvdockd = optarg;
        else if (c == 'B')
            beside = true;
        else if (c == 't' && (strcmp(optarg, "shm") == 0 || strcmp(optarg, "ucx") == 0))
            transport = optarg;
        else if (c == 'P')
            pool_size = optarg; /* kvdockd checks it */
        else if (c == 'p' && kvd_u64_parse(optarg, 8, 1024, &pages) == KVD_OK)
            continue;
        else if (c == 'r' && kvd_u64_parse(optarg, 1, 100, &runs) == KVD_OK)
            continue;
        else if (c == 's' && strcmp(optarg, "-1") == 0)
            spin_us = -1;
        else if (c == 's' && kvd_u64_parse(optarg, 1, 1000000, &sp) == KVD_OK)
            spin_us = (int)sp;
        else
            break;
    }
    if (kvdockd == NULL) {
        fprintf(stderr,
                "Usage: kvdock-bench linker --kvdockd PATH [--pages N] [--runs R] "
                "[--transport shm|ucx] [--pool SIZE] [--spin-us US|-1] "
                "[--beside-offload]\n");
        return BENCH_EXIT_USAGE;
    }
    bench_env_t env;
    if (bench_env_init(&env) != KVD_OK ||
        bench_daemon_start(&env, kvdockd, pool_size, strcmp(transport, "ucx") == 0) !=
            KVD_OK) {
        bench_env_cleanup(&env);
        return BENCH_EXIT_FAIL;
    }
    bool ucx = strcmp(transport, "ucx") == 0;
    printf("transport %s%s%s%s\n", transport, ucx ? ", UCX_TLS=" : "",
           ucx ? (getenv("UCX_TLS") ? getenv("UCX_TLS") : "(unset)") : "",
           beside ? ", an offload of as many pages beside each load" : "");
    if (ucx)
        printf("%-7s %10s %8s %12s %12s %14s %9s %9s %9s %8s %8s\n", "layout", "bytes",
               "op", "offload GB/s", "load GB/s", "first layer ms", "get GB/s",
               "put GB/s", "am GB/s", "load/ref", "off/ref");
    else
        printf("%-7s %10s %12s %12s %14s %12s %10s %10s\n", "layout", "bytes",
               "offload GB/s", "load GB/s", "first layer ms", "memcpy GB/s", "load/cpy",
               "run median");
    int status = BENCH_EXIT_OK;
    for (size_t i = 0; i < KVD_ARRAY_SIZE(layouts) && status == BENCH_EXIT_OK; i++) {
        const layout_t *lo = &layouts[i];
        kvd_linker_config_t cfg = {.socket_path = env.daemon_socket,
                                   .model_id = lo->name,
                                   .timeout_ms = 30000,
                                   .spin_us = spin_us,
                                   .transport = transport};
        kvd_linker_t *lk = NULL;
        dev_t_ d;
        uint32_t attn_id = 0, mamba_id = 0;
        uint32_t halves = beside ? 2 : 1;
        if (dev_alloc(lo, (uint32_t)pages, halves, &d) != 0 ||
            kvd_linker_open(&cfg, &lk) != 0 ||
            register_pools(lk, lo, (uint32_t)pages, halves, &d, &attn_id, &mamba_id) !=
                0) {
            fprintf(stderr, "kvdock-bench linker: cannot set up %s\n", lo->name);
            status = BENCH_EXIT_FAIL;
        }
        lk_result_t best = {0};
        double best_cpy = 0, ratio[100], first[100];
        size_t n_ratio = 0, n_first = 0;
        for (uint64_t r = 0; status == BENCH_EXIT_OK && r < runs; r++) {
            lk_result_t one;
            if (one_run(lk, lo, (uint32_t)pages, &d, attn_id, mamba_id,
                        1000 * (i + 1) + r, !ucx, beside, &one) != 0) {
                fprintf(stderr, "kvdock-bench linker: run %llu of %s failed\n",
                        (unsigned long long)r, lo->name);
                status = BENCH_EXIT_FAIL;
                break;
            }
            if (one.load_gbs > best.load_gbs)
                best = one;
            best_cpy = KVD_MAX(best_cpy, one.memcpy_gbs);
            if (one.memcpy_gbs > 0 && n_ratio < KVD_ARRAY_SIZE(ratio))
                ratio[n_ratio++] = one.load_gbs / one.memcpy_gbs;
            if (n_first < KVD_ARRAY_SIZE(first))
                first[n_first++] = one.first_layer_ms;
        }
        /* the first layer: the median over the runs (the best load's run
         * may be one whose first layer came late) */
        qsort(first, n_first, sizeof(first[0]), cmp_double);
        best.first_layer_ms = n_first ? first[n_first / 2] : 0.0;
        if (status == BENCH_EXIT_OK && ucx) {
            /* the reference: the better of get and put at the op size */
            double get = perftest_gbs("ucp_get", op_bytes(lo));
            double put = perftest_gbs("ucp_put_bw", op_bytes(lo));
            /* and, for the message mode, active messages at 8 MiB (the
             * size of its messages); not part of the ratio */
            double am = perftest_gbs("ucp_am_bw", 8u << 20);
            double ref = KVD_MAX(get, put);
            char b[32], o[32];
            printf("%-7s %10s %8s %12.2f %12.2f %14.2f %9.2f %9.2f %9.2f %8.2f %8.2f\n",
                   lo->name, kvd_size_format(best.bytes, b, sizeof(b)),
                   kvd_size_format(op_bytes(lo), o, sizeof(o)), best.offload_gbs,
                   best.load_gbs, best.first_layer_ms, get, put, am,
                   ref > 0 ? best.load_gbs / ref : 0.0,
                   ref > 0 ? best.offload_gbs / ref : 0.0);
            fflush(stdout);
        } else if (status == BENCH_EXIT_OK) {
            /* best load against best memcpy, and the median of each run's
             * load against the memcpy measured just before it */
            qsort(ratio, n_ratio, sizeof(ratio[0]), cmp_double);
            char b[32];
            printf("%-7s %10s %12.2f %12.2f %14.2f %12.2f %10.2f %10.2f\n", lo->name,
                   kvd_size_format(best.bytes, b, sizeof(b)), best.offload_gbs,
                   best.load_gbs, best.first_layer_ms, best_cpy,
                   best_cpy > 0 ? best.load_gbs / best_cpy : 0.0,
                   n_ratio ? ratio[n_ratio / 2] : 0.0);
            fflush(stdout);
        }
        kvd_linker_close(lk);
        dev_free(lo, &d);
    }
    bench_env_cleanup(&env);
    return status;
}
