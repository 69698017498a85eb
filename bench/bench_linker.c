/*
 * bench_linker.c - mode `linker` of kvdock-bench: offload and load through
 * libkvdock's whole path (RPC + copies on its load and offload threads) for
 * four model layouts, against a kvdockd started here.
 *
 * --memory host (default): host memory stands in for device memory. The
 * reference in the same run is a single-core memcpy of the same bytes from
 * the device buffers, measured in every run just before its load; the
 * table shows the best load against the best memcpy and the median over
 * the runs of load / the memcpy before it.
 *
 * --memory cuda|hip: the device buffers are device memory of the runtime
 * loaded with dlopen (bench_gpu.c; KVDOCK_CUDA_LIBRARY / KVDOCK_HIP_LIBRARY
 * name another library, the tests' fakes). The references, same run, just
 * before each load: one pinned host->device and one device->host copy of
 * the same bytes in one piece (cuMemAllocHost'd host memory, a stream of
 * the bench's, timed with the CPU clock around each copy and its sync).
 * The table: best load / best host->device, best offload / best
 * device->host, against the goals (0.9 contiguous, 0.7 scattered);
 * the first layer in place from kvd_start_layer_wise_loading, p50 and p99
 * over the runs (goal 0.5 ms), and its median from kvd_load; the pools'
 * stats (the store's pool pinned or not, DMA and bounce-ring bytes). The
 * bench waits up to 10 s for the pool to be pinned before its runs, and
 * counts one warm-up run per layout. Exit 77 where the runtime or a device
 * is not here.
 *
 * Layouts (bf16):
 *   mha:       32 layers, K and V of 8 heads x 128, page 64 tokens (8 MiB
 *              per page object)
 *   mla:       61 layers, one 576-wide latent buffer, rank-replicated
 *   hybrid:    12 attention layers as mha plus 36 mamba layers with a 64
 *              KiB temporal state and an 8 KiB conv state per node, one
 *              node every 8 pages
 *   scattered: 32 layers, K and V of 16 heads x 128: 4 KiB rows, pages of
 *              one row (a token-level allocator's pool, as SGLang's with
 *              page size 1), 16 rows per bench page, each run's rows drawn
 *              at random over four times as many: no two adjacent, so
 *              nothing coalesces
 * Each run offloads the pages of one prompt (fresh keys), waits for the
 * completion, overwrites the device buffers with other bytes, then loads
 * the pages back layer-wise: time to the first layer in place (the median
 * over the runs), and the whole load in GB/s (the best run). Every moved
 * row is then checked against the pattern the run wrote (a word of its
 * own per buffer and offset): a run that finds a difference fails.
 *
 * --layouts picks and orders them (default all four).
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
 * With --transport ucx (host memory only) the bytes move by UCX RMA
 * (UCX_TLS chooses what runs underneath) and the reference is ucx_perftest
 * in the same run and the same UCX_TLS: ucp_get and ucp_put_bw at the size
 * of one operation of the layout (one page's rows of one buffer: what the
 * linker posts), and ucp_am_bw at 8 MiB (the size of a message of the
 * linker's message mode, which KVDOCK_UCX_MODE / auto picks on TCP).
 */
#include "bench.h"
#include "bench_gpu.h"
#include "kvdock.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define PAGE       64 /* tokens of a bench page: --pages counts these */
#define MAX_LAYERS 64
#define MAX_RUNS   100
/* exit status when the memory kind's runtime or device is not here, as
 * the tests' skip */
#define BENCH_EXIT_NO_DEVICE 77

typedef struct layout {
    const char *name;
    uint32_t attn_layers;
    uint32_t attn_buffers; /* 2 (K, V) or 1 (MLA latent) */
    uint64_t attn_row;     /* bytes per token row of one buffer */
    bool replicated;
    uint32_t mamba_layers;
    uint64_t mamba_a, mamba_b; /* bytes of the two state buffers */
    uint32_t pages_per_node;
    /* the pool's page size (tokens), and the rows of one bench page: 64
     * and 64, but for scattered, whose pages are one 4 KiB row each */
    uint32_t page_size, rows_per_page;
    /* the attention buffers hold `spread` times the rows a run uses, and a
     * run's rows are drawn at random among them (1: rows 0.. in order) */
    uint32_t spread;
    bool contiguous; /* for the goal: 0.9 x the pinned copy, else 0.7 */
} layout_t;

static const layout_t layouts[] = {
    {"mha", 32, 2, 8 * 128 * 2, false, 0, 0, 0, 0, PAGE, PAGE, 1, true},
    {"mla", 61, 1, 576 * 2, true, 0, 0, 0, 0, PAGE, PAGE, 1, true},
    {"hybrid", 12, 2, 8 * 128 * 2, false, 36, 64 * 1024, 8 * 1024, 8, PAGE, PAGE, 1,
     true},
    {"scattered", 32, 2, 4096, false, 0, 0, 0, 0, 1, 16, 4, false},
};

/* The device buffers of one layout, in the memory of the run's kind. */
typedef struct dev {
    kvd_memory_kind_t mem;
    uint8_t *attn[MAX_LAYERS][2];
    uint8_t *mamba[MAX_LAYERS][2];
    uint64_t attn_rows;               /* rows of one attention buffer */
    uint64_t attn_bytes, mamba_bytes; /* per buffer (mamba: both states) */
    uint64_t run_rows;                /* attention rows one run moves */
    uint32_t nodes;
    uint64_t total; /* bytes one run moves */
    /* host: the memcpy reference's destination; device: the pinned host
     * side and the device side of the one-piece copies */
    uint8_t *ref, *ref_dev;
    /* device kinds: a pinned buffer as large as the largest device buffer,
     * through which the buffers are filled and read back */
    uint8_t *stage;
    uint64_t stage_bytes;
} dev_t_;

static uint64_t mix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    return z ^ (z >> 27);
}

/* The 8 bytes at byte offset `off` of buffer `buf` for fill `seed`: every
 * word of every buffer differs, so a row copied to the wrong place, or not
 * at all, shows. */
static uint64_t pattern(uint64_t seed, uint32_t buf, uint64_t off)
{
    uint64_t s = seed * 0xff51afd7ed558ccdull ^ ((uint64_t)buf << 40) ^ off;
    return mix(&s);
}

static uint8_t *mem_alloc(kvd_memory_kind_t mem, uint64_t n)
{
    return mem == KVD_MEM_HOST ? malloc(n) : bgpu_alloc(n);
}

static void mem_free(kvd_memory_kind_t mem, uint8_t *p)
{
    if (mem == KVD_MEM_HOST)
        free(p);
    else
        bgpu_free(p);
}

/* `halves` 2: each attention buffer holds the rows of twice the pages, the
 * second half for the offload beside the load. */
static int dev_alloc(const layout_t *lo, kvd_memory_kind_t mem, uint32_t pages,
                     uint32_t halves, dev_t_ *d)
{
    memset(d, 0, sizeof(*d));
    d->mem = mem;
    d->run_rows = (uint64_t)pages * lo->rows_per_page;
    d->attn_rows = d->run_rows * lo->spread * halves;
    d->attn_bytes = d->attn_rows * lo->attn_row;
    d->nodes = lo->pages_per_node ? pages / lo->pages_per_node : 0;
    d->mamba_bytes = (uint64_t)d->nodes * KVD_MAX(lo->mamba_a, lo->mamba_b);
    for (uint32_t l = 0; l < lo->attn_layers; l++)
        for (uint32_t b = 0; b < lo->attn_buffers; b++)
            if ((d->attn[l][b] = mem_alloc(mem, d->attn_bytes)) == NULL)
                return -1;
    for (uint32_t l = 0; l < lo->mamba_layers; l++) {
        d->mamba[l][0] = mem_alloc(mem, (uint64_t)d->nodes * lo->mamba_a);
        d->mamba[l][1] = mem_alloc(mem, (uint64_t)d->nodes * lo->mamba_b);
        if (!d->mamba[l][0] || !d->mamba[l][1])
            return -1;
    }
    d->total = (uint64_t)lo->attn_layers * lo->attn_buffers * d->run_rows * lo->attn_row +
               (uint64_t)lo->mamba_layers * d->nodes * (lo->mamba_a + lo->mamba_b);
    if (mem == KVD_MEM_HOST) {
        /* allocated and written once: measuring the reference maps nothing
         * new between runs (on this VM a fresh mapping slows what follows) */
        if ((d->ref = malloc(d->total)) == NULL)
            return -1;
        memset(d->ref, 1, d->total);
        return 0;
    }
    d->stage_bytes = KVD_MAX(d->attn_bytes, d->mamba_bytes);
    if ((d->stage = bgpu_alloc_host(d->stage_bytes)) == NULL ||
        (d->ref = bgpu_alloc_host(d->total)) == NULL ||
        (d->ref_dev = bgpu_alloc(d->total)) == NULL)
        return -1;
    /* not zeros: copies of zeros can run faster than of data */
    memset(d->ref, 0x5a, d->total);
    return bgpu_h2d(d->ref_dev, d->ref, d->total);
}

static void dev_free(const layout_t *lo, dev_t_ *d)
{
    for (uint32_t l = 0; l < lo->attn_layers; l++)
        for (uint32_t b = 0; b < 2; b++)
            mem_free(d->mem, d->attn[l][b]);
    for (uint32_t l = 0; l < lo->mamba_layers; l++) {
        mem_free(d->mem, d->mamba[l][0]);
        mem_free(d->mem, d->mamba[l][1]);
    }
    if (d->mem == KVD_MEM_HOST) {
        free(d->ref);
    } else {
        bgpu_free_host(d->ref);
        bgpu_free_host(d->stage);
        bgpu_free(d->ref_dev);
    }
}

/* Buffer i of the layout (attention buffers first, then the two states of
 * each mamba layer), its size and its row size. */
static uint32_t n_bufs(const layout_t *lo)
{
    return lo->attn_layers * lo->attn_buffers + 2 * lo->mamba_layers;
}

static uint8_t *buf_at(const layout_t *lo, dev_t_ *d, uint32_t i, uint64_t *bytes,
                       uint64_t *row)
{
    uint32_t na = lo->attn_layers * lo->attn_buffers;
    if (i < na) {
        *bytes = d->attn_bytes;
        *row = lo->attn_row;
        return d->attn[i / lo->attn_buffers][i % lo->attn_buffers];
    }
    i -= na;
    *row = i % 2 ? lo->mamba_b : lo->mamba_a;
    *bytes = (uint64_t)d->nodes * *row;
    return d->mamba[i / 2][i % 2];
}

/* Writes fill `seed` into every buffer, all of it (device kinds: through
 * the pinned stage, each copy done before the next fill). */
static int dev_fill(const layout_t *lo, dev_t_ *d, uint64_t seed)
{
    for (uint32_t i = 0; i < n_bufs(lo); i++) {
        uint64_t bytes, row;
        uint8_t *p = buf_at(lo, d, i, &bytes, &row);
        uint64_t *w = (uint64_t *)(d->mem == KVD_MEM_HOST ? p : d->stage);
        for (uint64_t off = 0; off < bytes; off += 8)
            w[off / 8] = pattern(seed, i, off);
        if (d->mem != KVD_MEM_HOST && bgpu_h2d(p, d->stage, bytes) != 0)
            return -1;
    }
    return 0;
}

/* Whether the rows a run moved (attention rows idx[0..run_rows), mamba
 * slots 0..nodes) hold fill `seed` again; the first difference on stderr. */
static bool dev_verify(const layout_t *lo, dev_t_ *d, const int64_t *idx, uint64_t seed)
{
    for (uint32_t i = 0; i < n_bufs(lo); i++) {
        uint64_t bytes, row;
        uint8_t *p = buf_at(lo, d, i, &bytes, &row);
        const uint8_t *h = p;
        if (d->mem != KVD_MEM_HOST) {
            if (bgpu_d2h(d->stage, p, bytes) != 0)
                return false;
            h = d->stage;
        }
        bool attn = i < lo->attn_layers * lo->attn_buffers;
        uint64_t rows = attn ? d->run_rows : d->nodes;
        for (uint64_t r = 0; r < rows; r++) {
            uint64_t base = (attn ? (uint64_t)idx[r] : r) * row;
            for (uint64_t off = base; off < base + row; off += 8) {
                uint64_t got;
                memcpy(&got, h + off, 8);
                if (got != pattern(seed, i, off)) {
                    fprintf(stderr,
                            "kvdock-bench linker: %s buffer %u row %llu: byte %llu "
                            "differs after the load\n",
                            lo->name, i, (unsigned long long)(base / row),
                            (unsigned long long)(off - base));
                    return false;
                }
            }
        }
    }
    return true;
}

/* Registers the layout's pools; attention layers get even ids, mamba odd. */
static int register_pools(kvd_linker_t *lk, const layout_t *lo, dev_t_ *d,
                          uint32_t *attn_id, uint32_t *mamba_id)
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
                          .page_size = lo->page_size,
                          .n_rows = d->attn_rows,
                          .rank_replicated = lo->replicated,
                          .memory = d->mem,
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
                          .n_rows = d->nodes,
                          .trailing_pages = 1,
                          .memory = d->mem,
                          .n_layers = lo->mamba_layers,
                          .layers = layers};
    return kvd_register_pool(lk, &st, mamba_id);
}

typedef struct lk_result {
    uint64_t bytes;
    double offload_gbs, load_gbs;
    double first_layer_ms;   /* from kvd_load */
    double first_start_ms;   /* from kvd_start_layer_wise_loading */
    double memcpy_gbs;       /* host: the memcpy reference */
    double h2d_gbs, d2h_gbs; /* device: the one-piece pinned copies */
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

static double memcpy_gbs(const layout_t *lo, dev_t_ *d);

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The q-quantile of n sorted values (the nearest rank). */
static double quantile(const double *v, size_t n, double q)
{
    if (n == 0)
        return 0;
    size_t rank = (size_t)(q * (double)n + 0.999999);
    return v[rank == 0 ? 0 : KVD_MIN(rank, n) - 1];
}

/* Queues the offload that runs beside a load: a run's worth of fresh
 * pages from the second half of the attention rows. *ack names it. */
static int offload_beside(kvd_linker_t *lk, const layout_t *lo, const dev_t_ *d,
                          uint32_t attn_id, uint64_t seed, uint64_t *ack)
{
    size_t rows = d->run_rows, nk = 0, pages = rows / lo->page_size;
    uint32_t *tokens = malloc(rows * sizeof(uint32_t));
    kvd_key_t *keys = malloc(pages * sizeof(kvd_key_t));
    int64_t *idx = malloc(rows * sizeof(int64_t));
    int rc = tokens && keys && idx ? 0 : -1;
    for (size_t i = 0; rc == 0 && i < rows; i++) {
        tokens[i] = (uint32_t)mix(&seed);
        idx[i] = (int64_t)(d->attn_rows / 2 + i);
    }
    if (rc == 0)
        rc = kvd_page_keys(tokens, rows, lo->page_size, NULL,
                           (uint8_t(*)[KVD_PAGE_KEY_BYTES])keys, &nk);
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

/* The run's attention rows: 0.. in order, or (spread > 1) run_rows
 * distinct rows drawn at random from the first half of the buffer. */
static int pick_rows(const layout_t *lo, const dev_t_ *d, uint32_t halves, uint64_t seed,
                     int64_t *idx)
{
    if (lo->spread == 1) {
        for (uint64_t i = 0; i < d->run_rows; i++)
            idx[i] = (int64_t)i;
        return 0;
    }
    uint64_t n = d->attn_rows / halves;
    int64_t *all = malloc(n * sizeof(int64_t));
    if (all == NULL)
        return -1;
    for (uint64_t i = 0; i < n; i++)
        all[i] = (int64_t)i;
    /* a partial Fisher-Yates shuffle: the first run_rows are the draw */
    for (uint64_t i = 0; i < d->run_rows; i++) {
        uint64_t j = i + mix(&seed) % (n - i);
        int64_t t = all[i];
        all[i] = all[j];
        all[j] = t;
        idx[i] = all[i];
    }
    free(all);
    return 0;
}

/* One offload and load of a fresh prompt. With `ref`, the reference (host:
 * the memcpy; device: the pinned copies) is measured in between (after the
 * offload, before the load), so that the two see the same state of the
 * machine. With `beside`, an offload of as many other pages is queued
 * right before the load. Then the moved rows are checked. */
static int one_run(kvd_linker_t *lk, const layout_t *lo, dev_t_ *d, uint32_t halves,
                   uint32_t attn_id, uint32_t mamba_id, uint64_t seed, bool ref,
                   bool beside, lk_result_t *r)
{
    size_t rows = d->run_rows, pages = rows / lo->page_size;
    uint32_t *tokens = malloc(rows * sizeof(uint32_t));
    kvd_key_t *keys = malloc(pages * sizeof(kvd_key_t));
    int64_t *idx = malloc(rows * sizeof(int64_t));
    uint32_t nodes = d->nodes;
    kvd_key_t *node_keys = malloc((nodes + 1) * sizeof(kvd_key_t));
    int64_t *slots = malloc((nodes + 1) * sizeof(int64_t));
    uint32_t *depths = malloc((nodes + 1) * sizeof(uint32_t));
    int rc = tokens && keys && idx && node_keys && slots && depths ? 0 : -1;
    size_t nk = 0;
    uint64_t tseed = seed;
    for (size_t i = 0; rc == 0 && i < rows; i++)
        tokens[i] = (uint32_t)mix(&tseed);
    if (rc == 0)
        rc = pick_rows(lo, d, halves, seed ^ 0x2545f4914f6cdd1dull, idx);
    if (rc == 0)
        rc = kvd_page_keys(tokens, rows, lo->page_size, NULL,
                           (uint8_t(*)[KVD_PAGE_KEY_BYTES])keys, &nk);
    /* a mamba node every pages_per_node bench pages (of PAGE tokens) */
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
         .n_indices = rows},
        {.pool_id = mamba_id,
         .keys = (const uint8_t(*)[KVD_PAGE_KEY_BYTES])node_keys,
         .n_keys = nodes,
         .device_indices = slots,
         .n_indices = nodes,
         .depths = depths},
    };
    size_t nt = nodes ? 2 : 1;
    uint64_t fill = seed * 2 + 1, poison = seed * 2 + 2;
    if (rc == 0)
        rc = dev_fill(lo, d, fill);
    uint64_t ack = 0, t0 = kvd_now_ns();
    if (rc == 0)
        rc = kvd_offload(lk, t, nt, &ack);
    if (rc == 0)
        rc = wait_done(lk, false, ack);
    double off_s = (double)(kvd_now_ns() - t0) / 1e9;
    r->memcpy_gbs = r->h2d_gbs = r->d2h_gbs = 0;
    if (rc == 0 && ref && d->mem == KVD_MEM_HOST) {
        r->memcpy_gbs = memcpy_gbs(lo, d);
    } else if (rc == 0 && ref) {
        /* the same bytes in one piece, pinned on the host; each call
         * returns once its stream is synchronised */
        uint64_t c0 = kvd_now_ns();
        rc = bgpu_h2d(d->ref_dev, d->ref, d->total);
        uint64_t c1 = kvd_now_ns();
        if (rc == 0)
            rc = bgpu_d2h(d->ref, d->ref_dev, d->total);
        uint64_t c2 = kvd_now_ns();
        r->h2d_gbs = (double)d->total / ((double)(c1 - c0) / 1e9) / 1e9;
        r->d2h_gbs = (double)d->total / ((double)(c2 - c1) / 1e9) / 1e9;
    }
    /* other bytes where the load must write, so that it shows that it did */
    if (rc == 0)
        rc = dev_fill(lo, d, poison);
    uint64_t rid = seed, beside_ack = 0;
    uint32_t counter = 0;
    if (rc == 0 && beside)
        rc = offload_beside(lk, lo, d, attn_id, seed ^ 0x5bd1e995u, &beside_ack);
    t0 = kvd_now_ns();
    if (rc == 0)
        rc = kvd_load(lk, rid, t, nt);
    if (rc == 0)
        rc = kvd_load_prepare(lk, rid);
    kvd_commit_pool_t c[2] = {{.adopted_begin = 0, .adopted_end = (uint32_t)pages}, {0}};
    if (rc == 0)
        rc = kvd_load_commit(lk, rid, c, nt);
    uint64_t ts = kvd_now_ns();
    if (rc == 0)
        rc = kvd_start_layer_wise_loading(lk, &counter);
    if (rc == 0)
        rc = kvd_wait_layer(lk, counter, 0);
    uint64_t tf = kvd_now_ns();
    uint32_t top = 2 * KVD_MAX(lo->attn_layers, lo->mamba_layers);
    for (uint32_t layer = 0; rc == 0 && layer < top; layer++)
        rc = kvd_wait_layer(lk, counter, layer);
    if (rc == 0)
        rc = wait_done(lk, true, rid);
    double load_s = (double)(kvd_now_ns() - t0) / 1e9;
    if (rc == 0 && beside)
        rc = wait_done(lk, false, beside_ack);
    if (rc == 0 && !dev_verify(lo, d, idx, fill))
        rc = -1;
    r->bytes = d->total;
    r->offload_gbs = (double)d->total / off_s / 1e9;
    r->load_gbs = (double)d->total / load_s / 1e9;
    r->first_layer_ms = (double)(tf - t0) / 1e6;
    r->first_start_ms = (double)(tf - ts) / 1e6;
    free(tokens);
    free(keys);
    free(idx);
    free(node_keys);
    free(slots);
    free(depths);
    return rc;
}

/* The same bytes, one core: every device buffer's moved rows copied into
 * their own place of one buffer as large as all of them (written once
 * before, so neither side is fresh memory nor stays in a cache between
 * copies). For scattered rows: as many bytes from the start of each
 * buffer, in one piece. */
static double memcpy_gbs(const layout_t *lo, dev_t_ *d)
{
    uint8_t *dst = d->ref;
    uint64_t off = 0, t0 = kvd_now_ns();
    uint64_t attn_run = d->run_rows * lo->attn_row;
    for (uint32_t l = 0; l < lo->attn_layers; l++)
        for (uint32_t b = 0; b < lo->attn_buffers; b++) {
            memcpy(dst + off, d->attn[l][b], attn_run);
            off += attn_run;
        }
    for (uint32_t l = 0; l < lo->mamba_layers; l++) {
        memcpy(dst + off, d->mamba[l][0], (uint64_t)d->nodes * lo->mamba_a);
        off += (uint64_t)d->nodes * lo->mamba_a;
        memcpy(dst + off, d->mamba[l][1], (uint64_t)d->nodes * lo->mamba_b);
        off += (uint64_t)d->nodes * lo->mamba_b;
    }
    __asm__ volatile("" ::: "memory");
    double s = (double)(kvd_now_ns() - t0) / 1e9;
    return (double)d->total / s / 1e9;
}

/* The size of one linker operation for the layout: a page's rows of one
 * attention buffer (contiguous on the device and in the object). */
static uint64_t op_bytes(const layout_t *lo)
{
    return (uint64_t)lo->page_size * lo->attn_row;
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

/* The pool's stats summed over the layout's pools. */
static void pool_stats(kvd_linker_t *lk, const layout_t *lo, uint32_t attn_id,
                       uint32_t mamba_id, kvd_pool_stats_t *sum)
{
    memset(sum, 0, sizeof(*sum));
    sum->pinned = true;
    for (int i = 0; i < (lo->mamba_layers ? 2 : 1); i++) {
        kvd_pool_stats_t s;
        if (kvd_stats(lk, i == 0 ? attn_id : mamba_id, &s) != 0) {
            sum->pinned = false;
            continue;
        }
        sum->memory = s.memory;
        sum->pinned = sum->pinned && s.pinned;
        sum->dma_bytes += s.dma_bytes;
        sum->bounce_bytes += s.bounce_bytes;
    }
}

/* Device kinds: waits until the linker has the store's pool pinned (it
 * registers it with the device in the background), at most 10 s, so that
 * the runs measure the DMA path; says how long it took, or that the copies
 * will go through the bounce ring. */
static void wait_pinned(kvd_linker_t *lk, const layout_t *lo, uint32_t attn_id,
                        uint32_t mamba_id)
{
    uint64_t t0 = kvd_now_ns(), until = t0 + 10000000000ull;
    kvd_pool_stats_t s;
    do {
        pool_stats(lk, lo, attn_id, mamba_id, &s);
        if (s.pinned) {
            printf("%s: store pool pinned %.2f s after registration\n", lo->name,
                   (double)(kvd_now_ns() - t0) / 1e9);
            return;
        }
        kvd_sleep_ns(5000000);
    } while (kvd_now_ns() < until);
    printf("%s: store pool not pinned 10 s after registration: the runs copy through "
           "the bounce ring\n",
           lo->name);
}

static const layout_t *find_layout(const char *name, size_t len)
{
    for (size_t i = 0; i < KVD_ARRAY_SIZE(layouts); i++)
        if (strlen(layouts[i].name) == len && strncmp(layouts[i].name, name, len) == 0)
            return &layouts[i];
    return NULL;
}

int bench_mode_linker(int argc, char **argv)
{
    const char *kvdockd = NULL;
    const char *transport = "shm", *pool_size = "3G", *memory = "host";
    const char *names = "mha,mla,hybrid,scattered";
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
                                             {"memory", required_argument, NULL, 'm'},
                                             {"layouts", required_argument, NULL, 'l'},
                                             {NULL, 0, NULL, 0}};
    int c;
    uint64_t sp = 0;
    bool bad = false;
    optind = 1;
    while (!bad && (c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        if (c == 'k')
            kvdockd = optarg;
        else if (c == 'B')
            beside = true;
        else if (c == 't' && (strcmp(optarg, "shm") == 0 || strcmp(optarg, "ucx") == 0))
            transport = optarg;
        else if (c == 'm' && (strcmp(optarg, "host") == 0 ||
                              strcmp(optarg, "cuda") == 0 || strcmp(optarg, "hip") == 0))
            memory = optarg;
        else if (c == 'l')
            names = optarg;
        else if (c == 'P')
            pool_size = optarg; /* kvdockd checks it */
        else if (c == 'p' && kvd_u64_parse(optarg, 8, 1024, &pages) == KVD_OK)
            continue;
        else if (c == 'r' && kvd_u64_parse(optarg, 1, MAX_RUNS, &runs) == KVD_OK)
            continue;
        else if (c == 's' && strcmp(optarg, "-1") == 0)
            spin_us = -1;
        else if (c == 's' && kvd_u64_parse(optarg, 1, 1000000, &sp) == KVD_OK)
            spin_us = (int)sp;
        else
            bad = true;
    }
    /* the layouts asked for, in the order given */
    const layout_t *run_layouts[KVD_ARRAY_SIZE(layouts)];
    size_t n_layouts = 0;
    for (const char *p = names; !bad && *p;) {
        size_t len = strcspn(p, ",");
        const layout_t *lo = find_layout(p, len);
        if (lo == NULL || n_layouts == KVD_ARRAY_SIZE(layouts))
            bad = true;
        else
            run_layouts[n_layouts++] = lo;
        p += len + (p[len] == ',');
    }
    kvd_memory_kind_t mem = strcmp(memory, "cuda") == 0  ? KVD_MEM_CUDA
                            : strcmp(memory, "hip") == 0 ? KVD_MEM_HIP
                                                         : KVD_MEM_HOST;
    bool ucx = strcmp(transport, "ucx") == 0;
    if (kvdockd == NULL || bad || n_layouts == 0 || (mem != KVD_MEM_HOST && ucx)) {
        fprintf(stderr,
                "Usage: kvdock-bench linker --kvdockd PATH [--memory host|cuda|hip] "
                "[--layouts mha,mla,hybrid,scattered] [--pages N] [--runs R] "
                "[--transport shm|ucx] [--pool SIZE] [--spin-us US|-1] "
                "[--beside-offload]\n"
                "(--memory cuda|hip: shm only)\n");
        return BENCH_EXIT_USAGE;
    }
    if (mem != KVD_MEM_HOST) {
        char why[512];
        if (bgpu_open(mem, why, sizeof(why)) != 0) {
            fprintf(stderr, "kvdock-bench linker --memory %s: %s\n", memory, why);
            return BENCH_EXIT_NO_DEVICE;
        }
    }
    bench_env_t env;
    if (bench_env_init(&env) != KVD_OK ||
        bench_daemon_start(&env, kvdockd, pool_size, ucx) != KVD_OK) {
        bench_env_cleanup(&env);
        return BENCH_EXIT_FAIL;
    }
    printf("memory %s%s%s, transport %s%s%s%s\n", memory, mem != KVD_MEM_HOST ? ": " : "",
           mem != KVD_MEM_HOST ? bgpu_name() : "", transport, ucx ? ", UCX_TLS=" : "",
           ucx ? (getenv("UCX_TLS") ? getenv("UCX_TLS") : "(unset)") : "",
           beside ? ", an offload of as many pages beside each load" : "");
    bool header = false;
    int status = BENCH_EXIT_OK;
    for (size_t i = 0; i < n_layouts && status == BENCH_EXIT_OK; i++) {
        const layout_t *lo = run_layouts[i];
        kvd_linker_config_t cfg = {.socket_path = env.daemon_socket,
                                   .model_id = lo->name,
                                   .timeout_ms = 30000,
                                   .spin_us = spin_us,
                                   .transport = transport};
        kvd_linker_t *lk = NULL;
        dev_t_ d;
        uint32_t attn_id = 0, mamba_id = 0;
        uint32_t halves = beside ? 2 : 1;
        int rc = dev_alloc(lo, mem, (uint32_t)pages, halves, &d);
        if (rc == 0)
            rc = kvd_linker_open(&cfg, &lk);
        if (rc == 0)
            rc = register_pools(lk, lo, &d, &attn_id, &mamba_id);
        if (rc != 0) {
            fprintf(stderr, "kvdock-bench linker: cannot set up %s: %s%s%s\n", lo->name,
                    rc < 0 && rc != -1 ? kvd_strerror(rc) : "allocation failed",
                    kvd_last_error()[0] ? ": " : "", kvd_last_error());
            status = rc == KVD_ERR_NO_DEVICE ? BENCH_EXIT_NO_DEVICE : BENCH_EXIT_FAIL;
        }
        if (status == BENCH_EXIT_OK && mem != KVD_MEM_HOST)
            wait_pinned(lk, lo, attn_id, mamba_id);
        if (status == BENCH_EXIT_OK && !header) {
            header = true;
            if (ucx)
                printf("%-9s %10s %10s %12s %12s %14s %9s %9s %9s %8s %8s\n", "layout",
                       "bytes", "op", "offload GB/s", "load GB/s", "first layer ms",
                       "get GB/s", "put GB/s", "am GB/s", "load/ref", "off/ref");
            else if (mem == KVD_MEM_HOST)
                printf("%-9s %10s %12s %12s %14s %12s %10s %10s\n", "layout", "bytes",
                       "offload GB/s", "load GB/s", "first layer ms", "memcpy GB/s",
                       "load/cpy", "run median");
            else
                printf("%-9s %10s %8s %8s %8s %8s %8s %8s %5s %8s %8s %8s %6s %9s %9s "
                       "%s\n",
                       "layout", "bytes", "off GB/s", "load", "h2d", "d2h", "load/h2d",
                       "off/d2h", "goal", "1st p50", "1st p99", "from ld", "pinned",
                       "dma", "bounce", "goals");
        }
        lk_result_t best = {0};
        double best_cpy = 0, best_h2d = 0, best_d2h = 0, best_off = 0, ratio[MAX_RUNS];
        double first[MAX_RUNS], first_start[MAX_RUNS];
        size_t n_ratio = 0, n_first = 0;
        /* device kinds: one run first that is not counted, so that the
         * runtime's first-use costs (its module loads, the first use of
         * each stream and pinned range) stay out of the figures */
        uint64_t warm = mem != KVD_MEM_HOST ? 1 : 0;
        for (uint64_t r = 0; status == BENCH_EXIT_OK && r < runs + warm; r++) {
            lk_result_t one;
            if (one_run(lk, lo, &d, halves, attn_id, mamba_id,
                        1000 * (uint64_t)(lo - layouts + 1) + r, !ucx, beside,
                        &one) != 0) {
                fprintf(stderr, "kvdock-bench linker: run %llu of %s failed%s%s\n",
                        (unsigned long long)r, lo->name, kvd_last_error()[0] ? ": " : "",
                        kvd_last_error());
                status = BENCH_EXIT_FAIL;
                break;
            }
            if (r < warm)
                continue;
            if (one.load_gbs > best.load_gbs)
                best = one;
            best_off = KVD_MAX(best_off, one.offload_gbs);
            best_cpy = KVD_MAX(best_cpy, one.memcpy_gbs);
            best_h2d = KVD_MAX(best_h2d, one.h2d_gbs);
            best_d2h = KVD_MAX(best_d2h, one.d2h_gbs);
            if (one.memcpy_gbs > 0)
                ratio[n_ratio++] = one.load_gbs / one.memcpy_gbs;
            first[n_first] = one.first_layer_ms;
            first_start[n_first++] = one.first_start_ms;
        }
        /* the first layer: the median over the runs (the best load's run
         * may be one whose first layer came late), and the 99th percentile */
        qsort(first, n_first, sizeof(first[0]), cmp_double);
        qsort(first_start, n_first, sizeof(first_start[0]), cmp_double);
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
            printf("%-9s %10s %10s %12.2f %12.2f %14.2f %9.2f %9.2f %9.2f %8.2f %8.2f\n",
                   lo->name, kvd_size_format(best.bytes, b, sizeof(b)),
                   kvd_size_format(op_bytes(lo), o, sizeof(o)), best.offload_gbs,
                   best.load_gbs, best.first_layer_ms, get, put, am,
                   ref > 0 ? best.load_gbs / ref : 0.0,
                   ref > 0 ? best.offload_gbs / ref : 0.0);
        } else if (status == BENCH_EXIT_OK && mem == KVD_MEM_HOST) {
            /* best load against best memcpy, and the median of each run's
             * load against the memcpy measured just before it */
            qsort(ratio, n_ratio, sizeof(ratio[0]), cmp_double);
            char b[32];
            printf("%-9s %10s %12.2f %12.2f %14.2f %12.2f %10.2f %10.2f\n", lo->name,
                   kvd_size_format(best.bytes, b, sizeof(b)), best.offload_gbs,
                   best.load_gbs, best.first_layer_ms, best_cpy,
                   best_cpy > 0 ? best.load_gbs / best_cpy : 0.0,
                   n_ratio ? ratio[n_ratio / 2] : 0.0);
        } else if (status == BENCH_EXIT_OK) {
            /* best load against the best host->device copy (a load moves
             * store -> device), best offload against the best
             * device->host (each the best of the runs); the first layer
             * from kvd_start_layer_wise_loading (p50, p99) and, median,
             * from kvd_load (its Acquire included) */
            kvd_pool_stats_t s;
            pool_stats(lk, lo, attn_id, mamba_id, &s);
            double lr = best_h2d > 0 ? best.load_gbs / best_h2d : 0;
            double orr = best_d2h > 0 ? best_off / best_d2h : 0;
            double goal = lo->contiguous ? 0.9 : 0.7;
            double p50 = quantile(first_start, n_first, 0.5);
            double p99 = quantile(first_start, n_first, 0.99);
            char b[32], dma[32], bounce[32], missed[64] = "";
            if (lr < goal)
                strcat(missed, ",load");
            if (orr < goal)
                strcat(missed, ",offload");
            if (p50 > 0.5)
                strcat(missed, ",first layer");
            printf(
                "%-9s %10s %8.2f %8.2f %8.2f %8.2f %8.2f %8.2f %5.1f %8.3f %8.3f %8.3f "
                "%6s %9s %9s %s%s\n",
                lo->name, kvd_size_format(best.bytes, b, sizeof(b)), best_off,
                best.load_gbs, best_h2d, best_d2h, lr, orr, goal, p50, p99,
                best.first_layer_ms, s.pinned ? "yes" : "no",
                kvd_size_format(s.dma_bytes, dma, sizeof(dma)),
                kvd_size_format(s.bounce_bytes, bounce, sizeof(bounce)),
                missed[0] ? "missed: " : "met", missed[0] ? missed + 1 : "");
        }
        fflush(stdout);
        kvd_linker_close(lk);
        dev_free(lo, &d);
    }
    if (mem != KVD_MEM_HOST && status == BENCH_EXIT_OK)
        printf(
            "goals: load >= goal x h2d and offload >= goal x d2h (the one-piece pinned "
            "copies of the same bytes, same run; 0.9 contiguous, 0.7 scattered), "
            "first layer in place <= 0.5 ms (p50, from kvd_start_layer_wise_loading); "
            "bytes checked after every load%s\n",
            bgpu_is_fake() ? "; fake runtime: the figures mean nothing" : "");
    bench_env_cleanup(&env);
    return status;
}
