/*
 * sim.c - the engine simulator (see sim.h): pools and allocators, the
 * page-aligned radix tree, deterministic bytes, prefill, offload, the
 * load flow against libkvdock, the scenario programs' fixture (their
 * daemon, tokens and simulator) and their calls of the kvdock CLI. The
 * pools are host or device memory (sim_memory_open); every access of the
 * simulator to their rows goes through unit_map / span_map.
 *
 * Everything is bounded: waits poll with a deadline, arrays are sized by
 * SIM_MAX_PAGES. The tree is a plain first-child/next-sibling tree; a node
 * holds a run of whole pages, its kv (and swa) unit per page and at most one
 * mamba state, the state at its end.
 */
#include "sim.h"

#include "dtest.h"
#include "gpu_test.h"

#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAMBA_SALT    0x4d414d4241535431ull
#define WAIT_MS       10000
#define MAX_ACKS      1024
#define OFFLOAD_SLOTS 3

struct sim_node {
    sim_node_t *parent, *child, *next;
    uint32_t start;    /* page index of its first page */
    uint32_t n;        /* pages */
    uint32_t *tokens;  /* n * page_size */
    int64_t *units[2]; /* per page: kv unit, swa unit (-1: none) */
    int64_t mamba;     /* state at the node end, -1: none */
};

/* ------------------------------------------------------------- helpers */

static uint64_t mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

void sim_sleep_ms(int ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

void sim_tokens(uint32_t seed, uint32_t *out, size_t n)
{
    for (size_t i = 0; i < n; i++)
        out[i] = (uint32_t)(mix64(((uint64_t)seed << 32) ^ i) % 150000u);
}

void sim_row_bytes(uint64_t h, uint32_t layer, uint32_t buf, uint32_t row, uint8_t *out,
                   size_t n)
{
    uint64_t base = mix64(h ^ mix64(((uint64_t)layer << 48) ^ ((uint64_t)buf << 40) ^
                                    ((uint64_t)row << 16)));
    for (size_t i = 0; i < n; i += 8) {
        uint64_t w = mix64(base + i);
        size_t m = n - i < 8 ? n - i : 8;
        memcpy(out + i, &w, m);
    }
}

static uint64_t page_hash(uint64_t prev, const uint32_t *tokens, uint32_t ps)
{
    uint64_t h = mix64(prev ^ 0x7061676568617368ull);
    for (uint32_t i = 0; i < ps; i++)
        h = mix64(h ^ tokens[i]);
    return h;
}

void sim_prefix_hashes(const sim_t *s, const uint32_t *tokens, uint32_t n_pages,
                       uint64_t *out)
{
    uint64_t h = 0x5eed;
    for (uint32_t q = 0; q < n_pages; q++) {
        h = page_hash(h, tokens + (size_t)q * s->ps, s->ps);
        out[q] = h;
    }
}

/* A mamba state is per TP rank (its heads are the rank's): the rank is in
 * its bytes, so a rank given another rank's state shows (rank 0: as
 * before there were ranks). */
static uint64_t state_hash(const sim_t *s, uint64_t h_end_page)
{
    return mix64(h_end_page ^ MAMBA_SALT ^ ((uint64_t)s->cfg.tp_rank << 56));
}

static bool has_mamba(const sim_t *s)
{
    return s->pools[SIM_MAMBA].present;
}

static bool has_swa(const sim_t *s)
{
    return s->pools[SIM_SWA].present;
}

/* ---------------------------------------------------------------- pools */

/*
 * Where the pools live. $KVDOCK_TEST_MEMORY=device: every buffer is device
 * memory of the runtime gpu_test.h opens (the fake here, a GPU on the device
 * check), registered as that memory kind; otherwise host memory, as an
 * engine without a GPU has. The CPU never touches device memory: whatever
 * the simulator writes or checks goes through a host copy of the rows
 * (unit_map / unit_unmap, one synchronous copy each way per unit and
 * buffer), so the assertions are the same on both and hold of the bytes
 * where the engine's kernels would find them.
 */
static struct {
    int state; /* 0: not opened yet, 1: host, 2: device; -1: device unusable */
} g_mem;

int sim_memory_open(void)
{
    if (g_mem.state != 0)
        return g_mem.state > 0 ? 0 : 1;
    const char *m = getenv("KVDOCK_TEST_MEMORY");
    if (m == NULL || *m == '\0' || strcmp(m, "host") == 0) {
        g_mem.state = 1;
        return 0;
    }
    if (strcmp(m, "device") != 0) {
        fprintf(stderr, "sim: KVDOCK_TEST_MEMORY=%s: want host or device\n", m);
        g_mem.state = -1;
        return 1;
    }
    int rc = gt_open(); /* 77 with the reason printed: no runtime or device */
    g_mem.state = rc == 0 ? 2 : -1;
    return rc;
}

bool sim_on_device(void)
{
    return g_mem.state == 2;
}

/* n bytes for a pool buffer, holding img (n bytes): device memory or host
 * memory by the mode. Host: img itself is the buffer. */
static uint8_t *buf_new(uint8_t *img, size_t n)
{
    if (!sim_on_device())
        return img;
    uint8_t *dev = gt_alloc(n);
    gt_write(dev, img, n);
    free(img);
    return dev;
}

static void buf_free(uint8_t *buf)
{
    if (buf == NULL)
        return;
    if (sim_on_device())
        gt_free(buf);
    else
        free(buf);
}

/* n bytes of buffer (l, b) from byte off, for the CPU: in host memory the
 * pool's own bytes, on a device a host copy read now. unit_unmap ends the
 * view; with write_back, the copy (pad bytes included, as read) goes back
 * to the device. A device write of these bytes by someone else between
 * the map and the unmap is lost: the simulator maps only what it owns (a
 * unit it frees, fills or checks), where no copy of the linker's belongs. */
static uint8_t *span_map(sim_pool_t *p, uint32_t l, uint32_t b, uint64_t off, size_t n)
{
    uint8_t *at = p->data[l][b] + off;
    if (!sim_on_device())
        return at;
    uint8_t *h = malloc(n);
    if (h == NULL) {
        fprintf(stderr, "sim: out of host memory for a %zu-byte view\n", n);
        exit(1);
    }
    gt_read(h, at, n);
    return h;
}

static void span_unmap(sim_pool_t *p, uint32_t l, uint32_t b, uint64_t off, size_t n,
                       uint8_t *view, bool write_back)
{
    if (!sim_on_device())
        return;
    if (write_back)
        gt_write(p->data[l][b] + off, view, n);
    free(view);
}

static size_t unit_span(const sim_pool_t *p, uint32_t b)
{
    return (size_t)p->rows_per_unit * p->row_stride[b];
}

static uint64_t unit_off(const sim_pool_t *p, uint32_t b, uint32_t u)
{
    return (uint64_t)u * unit_span(p, b);
}

/* The rows of unit u in buffer (l, b), row r at r * row_stride[b]. */
static uint8_t *unit_map(sim_pool_t *p, uint32_t l, uint32_t b, uint32_t u)
{
    return span_map(p, l, b, unit_off(p, b, u), unit_span(p, b));
}

static void unit_unmap(sim_pool_t *p, uint32_t l, uint32_t b, uint32_t u, uint8_t *view,
                       bool write_back)
{
    span_unmap(p, l, b, unit_off(p, b, u), unit_span(p, b), view, write_back);
}

/* Writes POISON over the rows of unit u (caller holds the lock or owns u). */
static void poison_unit(sim_pool_t *p, uint32_t u)
{
    for (uint32_t l = 0; l < p->n_layers; l++)
        for (uint32_t b = 0; b < p->n_bufs; b++) {
            uint8_t *rows = unit_map(p, l, b, u);
            for (uint32_t r = 0; r < p->rows_per_unit; r++)
                memset(rows + r * p->row_stride[b], SIM_POISON, p->bytes_per_row[b]);
            unit_unmap(p, l, b, u, rows, true);
        }
}

/* Writes the deterministic bytes of hash h into unit u. */
static void fill_unit(sim_pool_t *p, uint32_t u, uint64_t h)
{
    for (uint32_t l = 0; l < p->n_layers; l++)
        for (uint32_t b = 0; b < p->n_bufs; b++) {
            uint8_t *rows = unit_map(p, l, b, u);
            for (uint32_t r = 0; r < p->rows_per_unit; r++)
                sim_row_bytes(h, p->layer_ids[l], b, r, rows + r * p->row_stride[b],
                              p->bytes_per_row[b]);
            unit_unmap(p, l, b, u, rows, true);
        }
}

/* Number of rows of unit u that differ from hash h's bytes; the first bad
 * one is described in what (when not NULL). */
static int check_unit(sim_pool_t *p, uint32_t u, uint64_t h, int64_t layer, char *what,
                      size_t what_len)
{
    uint8_t want[1024];
    int bad = 0;
    for (uint32_t l = 0; l < p->n_layers; l++)
        for (uint32_t b = 0; b < p->n_bufs; b++) {
            if (layer >= 0 && p->layer_ids[l] != layer)
                continue;
            uint8_t *rows = unit_map(p, l, b, u);
            for (uint32_t r = 0; r < p->rows_per_unit; r++) {
                const uint8_t *got = rows + r * p->row_stride[b];
                sim_row_bytes(h, p->layer_ids[l], b, r, want, p->bytes_per_row[b]);
                if (memcmp(got, want, p->bytes_per_row[b]) == 0)
                    continue;
                if (bad++ == 0 && what != NULL) {
                    size_t i = 0;
                    while (got[i] == want[i])
                        i++;
                    snprintf(what, what_len,
                             "layer %u buffer %u row %u byte %zu: 0x%02x, want 0x%02x%s",
                             p->layer_ids[l], b, r, i, got[i], want[i],
                             got[i] == SIM_POISON ? " (never written)" : "");
                }
            }
            unit_unmap(p, l, b, u, rows, false);
        }
    return bad;
}

static void pool_init(sim_pool_t *p, sim_pool_kind_t kind, uint32_t n_units,
                      uint32_t rows_per_unit, const uint64_t *bpr, uint32_t pad)
{
    static const char *names[] = {"kv", "swa", "mamba"};
    p->present = true;
    p->kind = kind;
    p->name = names[kind];
    p->addressing = kind == SIM_MAMBA ? KVD_ADDR_SLOT : KVD_ADDR_PAGED;
    p->rows_per_unit = rows_per_unit;
    p->n_units = n_units;
    p->n_bufs = 2;
    pthread_mutex_init(&p->lock, NULL);
    for (uint32_t b = 0; b < 2; b++) {
        p->bytes_per_row[b] = bpr[b];
        p->row_stride[b] = bpr[b] + pad;
    }
    /* every row poisoned (every unit is free), every pad byte PAD: built
     * on the host and written to the buffer in one piece */
    uint64_t rows = (uint64_t)n_units * rows_per_unit;
    for (uint32_t l = 0; l < p->n_layers; l++)
        for (uint32_t b = 0; b < 2; b++) {
            size_t n = rows * p->row_stride[b];
            uint8_t *img = malloc(n);
            memset(img, SIM_PAD, n);
            for (uint64_t r = 0; r < rows; r++)
                memset(img + r * p->row_stride[b], SIM_POISON, bpr[b]);
            p->data[l][b] = buf_new(img, n);
        }
    p->free_stack = malloc(n_units * sizeof(uint32_t));
    p->state = calloc(n_units, 1);
    /* LIFO, unit 0 handed out first */
    for (uint32_t i = 0; i < n_units; i++)
        p->free_stack[i] = n_units - 1 - i;
    p->n_free = n_units;
}

static void pool_fini(sim_pool_t *p)
{
    if (!p->present)
        return;
    for (uint32_t l = 0; l < p->n_layers; l++)
        for (uint32_t b = 0; b < 2; b++)
            buf_free(p->data[l][b]);
    free(p->free_stack);
    free(p->state);
    pthread_mutex_destroy(&p->lock);
    memset(p, 0, sizeof(*p));
}

int64_t sim_alloc_unit(sim_pool_t *p)
{
    pthread_mutex_lock(&p->lock);
    int64_t u = -1;
    if (p->n_free > 0) {
        u = p->free_stack[--p->n_free];
        if (p->state[u] != SIM_UNIT_FREE)
            dt_fail(__FILE__, __LINE__,
                    "%s: free stack held unit %" PRId64 " in state %u", p->name, u,
                    p->state[u]);
        p->state[u] = SIM_UNIT_REQ;
    }
    pthread_mutex_unlock(&p->lock);
    return u;
}

/* REQ -> FREE; anything else is counted as an error and not performed.
 * Caller holds the lock. */
static void free_locked(sim_pool_t *p, int64_t u, const char *who)
{
    if (u < 0 || u >= (int64_t)p->n_units) {
        p->bad_frees++;
        fprintf(stderr, "sim: %s freed %s unit %" PRId64 " out of range\n", who, p->name,
                u);
        return;
    }
    if (p->state[u] == SIM_UNIT_FREE) {
        p->double_frees++;
        fprintf(stderr, "sim: %s double-freed %s unit %" PRId64 "\n", who, p->name, u);
        return;
    }
    if (p->state[u] == SIM_UNIT_TREE) {
        p->tree_frees++;
        fprintf(stderr, "sim: %s freed %s unit %" PRId64 " that the tree holds\n", who,
                p->name, u);
        return;
    }
    p->state[u] = SIM_UNIT_FREE;
    poison_unit(p, (uint32_t)u);
    p->free_stack[p->n_free++] = (uint32_t)u;
}

void sim_free_unit(sim_pool_t *p, int64_t unit)
{
    pthread_mutex_lock(&p->lock);
    free_locked(p, unit, "the engine");
    pthread_mutex_unlock(&p->lock);
}

/* TREE -> FREE (eviction from the device tree). */
static void tree_release(sim_pool_t *p, int64_t u)
{
    pthread_mutex_lock(&p->lock);
    if (u < 0 || u >= (int64_t)p->n_units || p->state[u] != SIM_UNIT_TREE) {
        dt_fail(__FILE__, __LINE__, "%s: tree released unit %" PRId64 " not in the tree",
                p->name, u);
    } else {
        p->state[u] = SIM_UNIT_REQ;
        free_locked(p, u, "the tree");
    }
    pthread_mutex_unlock(&p->lock);
}

/* REQ -> TREE (the tree adopts a unit). */
static void tree_adopt(sim_pool_t *p, int64_t u)
{
    pthread_mutex_lock(&p->lock);
    if (u < 0 || u >= (int64_t)p->n_units || p->state[u] != SIM_UNIT_REQ)
        dt_fail(__FILE__, __LINE__,
                "%s: tree adopted unit %" PRId64 " not held (state %d)", p->name, u,
                u < 0 || u >= (int64_t)p->n_units ? -1 : p->state[u]);
    else
        p->state[u] = SIM_UNIT_TREE;
    pthread_mutex_unlock(&p->lock);
}

/* free_indices: the linker hands device indices back. PAGED: token slots,
 * whole pages of consecutive slots from a page start; SLOT: slot ids. */
static void free_indices_cb(void *ctx, const int64_t *idx, size_t n)
{
    sim_pool_t *p = ctx;
    if (sim_on_device())
        gt_bind(); /* the freed units are poisoned on the device, from this thread */
    pthread_mutex_lock(&p->lock);
    p->linker_free_calls++;
    if (p->addressing == KVD_ADDR_SLOT) {
        for (size_t i = 0; i < n; i++) {
            free_locked(p, idx[i], "free_indices");
            p->linker_freed++;
        }
        pthread_mutex_unlock(&p->lock);
        return;
    }
    uint32_t ps = p->rows_per_unit;
    if (n % ps != 0) {
        p->bad_frees++;
        fprintf(stderr, "sim: free_indices(%s) got %zu token slots, not whole pages\n",
                p->name, n);
    }
    for (size_t g = 0; g + ps <= n; g += ps) {
        bool whole = idx[g] >= 0 && idx[g] % ps == 0;
        for (uint32_t j = 1; whole && j < ps; j++)
            whole = idx[g + j] == idx[g] + j;
        if (!whole) {
            p->bad_frees++;
            fprintf(stderr,
                    "sim: free_indices(%s): slots %zu.. are not one aligned page "
                    "(first %" PRId64 ")\n",
                    p->name, g, idx[g]);
            continue;
        }
        free_locked(p, idx[g] / ps, "free_indices");
        p->linker_freed++;
    }
    pthread_mutex_unlock(&p->lock);
}

uint32_t sim_free_count(sim_pool_t *p)
{
    pthread_mutex_lock(&p->lock);
    uint32_t n = p->n_free;
    pthread_mutex_unlock(&p->lock);
    return n;
}

uint32_t sim_count_state(sim_pool_t *p, sim_unit_state_t st)
{
    pthread_mutex_lock(&p->lock);
    uint32_t n = 0;
    for (uint32_t u = 0; u < p->n_units; u++)
        n += p->state[u] == st;
    pthread_mutex_unlock(&p->lock);
    return n;
}

static uint64_t linker_freed(sim_pool_t *p)
{
    pthread_mutex_lock(&p->lock);
    uint64_t n = p->linker_freed;
    pthread_mutex_unlock(&p->lock);
    return n;
}

/* ---------------------------------------------------------------- open */

int sim_open(sim_t *s, const sim_config_t *cfg, const char *socket)
{
    memset(s, 0, sizeof(*s));
    s->cfg = *cfg;
    int mem = sim_memory_open();
    if (!DT_CHECK(mem == 0, "sim: the pools' memory cannot be opened (%d)%s", mem,
                  mem == 77 ? ": a program on a device calls sim_memory_open first" : ""))
        return -1;
    s->ps = cfg->page_size;
    s->n_layers = (uint32_t)strlen(cfg->layers);
    s->next_rid = 1000;
    s->root = calloc(1, sizeof(sim_node_t));
    s->root->mamba = -1;
    if (!DT_CHECK(s->ps > 0 && s->ps <= 256 && s->n_layers <= SIM_MAX_LAYERS,
                  "sim: bad config"))
        return -1;
    for (uint32_t i = 0; i < s->n_layers; i++) {
        sim_pool_kind_t k = cfg->layers[i] == 'M'   ? SIM_MAMBA
                            : cfg->layers[i] == 'S' ? SIM_SWA
                                                    : SIM_KV;
        s->pools[k].layer_ids[s->pools[k].n_layers++] = i;
    }
    /* K, V: 2 heads x 16 dims x 2 bytes; mamba: temporal 256, conv 64 */
    const uint64_t kv_bpr[2] = {64, 64}, mamba_bpr[2] = {256, 64};
    if (s->pools[SIM_KV].n_layers)
        pool_init(&s->pools[SIM_KV], SIM_KV, cfg->kv_pages, s->ps, kv_bpr, cfg->pad);
    if (s->pools[SIM_SWA].n_layers) {
        pool_init(&s->pools[SIM_SWA], SIM_SWA, cfg->kv_pages, s->ps, kv_bpr, cfg->pad);
        s->pools[SIM_SWA].trailing_pages = cfg->swa_window;
    }
    if (s->pools[SIM_MAMBA].n_layers) {
        pool_init(&s->pools[SIM_MAMBA], SIM_MAMBA, cfg->mamba_slots, 1, mamba_bpr,
                  cfg->pad);
        s->pools[SIM_MAMBA].trailing_pages = 1;
    }
    uint32_t chunk = cfg->mamba_chunk ? cfg->mamba_chunk : s->ps;
    uint32_t a = chunk, b = s->ps;
    while (b) {
        uint32_t t = a % b;
        a = b;
        b = t;
    }
    s->grid = has_mamba(s) ? chunk / a * s->ps : s->ps;

    kvd_linker_config_t lc = {.socket_path = socket,
                              .client_name = "sim",
                              .model_id = cfg->model_id,
                              .tp_rank = cfg->tp_rank,
                              .tp_size = cfg->tp_size ? cfg->tp_size : 1,
                              .pp_rank = 0,
                              .pp_size = 1,
                              .cp_rank = 0,
                              .cp_size = 1,
                              .layer_group_size = cfg->layer_group_size,
                              .timeout_ms = 5000};
    int rc = kvd_linker_open(&lc, &s->linker);
    if (!DT_CHECK(rc == 0, "kvd_linker_open: %d (%s)", rc, kvd_strerror(rc)))
        return -1;
    for (int k = 0; k < SIM_N_KINDS; k++) {
        sim_pool_t *p = &s->pools[k];
        if (!p->present)
            continue;
        kvd_pool_layer_t layers[SIM_MAX_LAYERS];
        memset(layers, 0, sizeof(layers));
        for (uint32_t l = 0; l < p->n_layers; l++) {
            layers[l].layer_id = p->layer_ids[l];
            layers[l].n_buffers = p->n_bufs;
            for (uint32_t b2 = 0; b2 < p->n_bufs; b2++)
                layers[l].buffers[b2] =
                    (kvd_pool_buffer_t){.base = p->data[l][b2],
                                        .row_stride = p->row_stride[b2],
                                        .bytes_per_row = p->bytes_per_row[b2]};
        }
        kvd_pool_desc_t d = {.name = p->name,
                             .addressing = p->addressing,
                             .page_size = p->addressing == KVD_ADDR_PAGED ? s->ps : 0,
                             .n_rows = (uint64_t)p->n_units * p->rows_per_unit,
                             .trailing_pages = p->trailing_pages,
                             .rank_replicated = k == SIM_KV && cfg->kv_rank_replicated,
                             .memory = sim_on_device()
                                           ? (kvd_memory_kind_t)gt_memory_kind()
                                           : KVD_MEM_HOST,
                             .n_layers = p->n_layers,
                             .layers = layers,
                             .free_indices = free_indices_cb,
                             .free_ctx = p};
        rc = kvd_register_pool(s->linker, &d, &p->pool_id);
        if (!DT_CHECK(rc == 0, "kvd_register_pool(%s): %d (%s)", p->name, rc,
                      kvd_strerror(rc)))
            return -1;
        rc = kvd_pool_info(s->linker, p->pool_id, &p->object_bytes, p->ns_name,
                           sizeof(p->ns_name));
        DT_CHECK(rc == 0, "kvd_pool_info(%s): %d", p->name, rc);
        uint64_t want = 0;
        for (uint32_t b2 = 0; b2 < p->n_bufs; b2++)
            want += p->bytes_per_row[b2] * p->rows_per_unit;
        want *= p->n_layers;
        DT_CHECK(p->object_bytes == want, "%s: object_bytes %" PRIu64 ", want %" PRIu64,
                 p->name, p->object_bytes, want);
    }
    return 0;
}

static void node_free(sim_node_t *n)
{
    if (n == NULL)
        return;
    for (sim_node_t *c = n->child, *next; c != NULL; c = next) {
        next = c->next;
        node_free(c);
    }
    free(n->tokens);
    free(n->units[0]);
    free(n->units[1]);
    free(n);
}

void sim_close(sim_t *s)
{
    kvd_linker_close(s->linker);
    s->linker = NULL;
    node_free(s->root);
    s->root = NULL;
    for (int k = 0; k < SIM_N_KINDS; k++)
        pool_fini(&s->pools[k]);
}

/* ---------------------------------------------------------------- tree */

static sim_node_t *node_new(sim_t *s, sim_node_t *parent, uint32_t start, uint32_t n,
                            const uint32_t *tokens)
{
    sim_node_t *x = calloc(1, sizeof(*x));
    x->parent = parent;
    x->start = start;
    x->n = n;
    x->tokens = malloc((size_t)n * s->ps * sizeof(uint32_t));
    memcpy(x->tokens, tokens, (size_t)n * s->ps * sizeof(uint32_t));
    for (int k = 0; k < 2; k++) {
        x->units[k] = malloc(n * sizeof(int64_t));
        for (uint32_t i = 0; i < n; i++)
            x->units[k][i] = -1;
    }
    x->mamba = -1;
    return x;
}

static sim_node_t *find_child(sim_t *s, sim_node_t *node, const uint32_t *page)
{
    for (sim_node_t *c = node->child; c != NULL; c = c->next)
        if (memcmp(c->tokens, page, s->ps * sizeof(uint32_t)) == 0)
            return c;
    return NULL;
}

/* Splits x after k pages: returns the new parent holding x's first k pages
 * (no state at its end); x keeps the rest and its state. */
static sim_node_t *node_split(sim_t *s, sim_node_t *x, uint32_t k)
{
    sim_node_t *mid = node_new(s, x->parent, x->start, k, x->tokens);
    for (int u = 0; u < 2; u++)
        memcpy(mid->units[u], x->units[u], k * sizeof(int64_t));
    /* mid takes x's place among its siblings */
    sim_node_t **pp = &x->parent->child;
    while (*pp != x)
        pp = &(*pp)->next;
    *pp = mid;
    mid->next = x->next;
    mid->child = x;
    x->next = NULL;
    x->parent = mid;
    uint32_t rest = x->n - k;
    memmove(x->tokens, x->tokens + (size_t)k * s->ps,
            (size_t)rest * s->ps * sizeof(uint32_t));
    for (int u = 0; u < 2; u++)
        memmove(x->units[u], x->units[u] + k, rest * sizeof(int64_t));
    x->start += k;
    x->n = rest;
    return mid;
}

/* Pages of x (from its first) matching tokens' pages from page p, at most
 * max_pages - p. */
static uint32_t node_match(sim_t *s, const sim_node_t *x, const uint32_t *tokens,
                           uint32_t p, uint32_t max_pages)
{
    uint32_t k = 0;
    while (k < x->n && p + k < max_pages &&
           memcmp(x->tokens + (size_t)k * s->ps, tokens + (size_t)(p + k) * s->ps,
                  s->ps * sizeof(uint32_t)) == 0)
        k++;
    return k;
}

int sim_tree_insert(sim_t *s, const uint32_t *tokens, uint32_t n_pages, uint32_t first,
                    const int64_t *kv, const int64_t *swa, int64_t mamba,
                    sim_insert_result_t *res)
{
    bool adopted[2][SIM_MAX_PAGES] = {{false}};
    memset(res, 0, sizeof(*res));
    if (!DT_CHECK(n_pages <= SIM_MAX_PAGES && first <= n_pages && n_pages > 0,
                  "sim_tree_insert: bad range %u..%u", first, n_pages))
        return -1;
    sim_node_t *node = s->root;
    uint32_t p = 0;
    while (p < n_pages) {
        sim_node_t *c = find_child(s, node, tokens + (size_t)p * s->ps);
        if (c == NULL) {
            if (!DT_CHECK(p >= first, "sim_tree_insert: page %u below first %u missing",
                          p, first))
                return -1;
            sim_node_t *x = node_new(s, node, p, n_pages - p, tokens + (size_t)p * s->ps);
            for (uint32_t q = p; q < n_pages; q++) {
                x->units[0][q - p] = kv[q - first];
                tree_adopt(&s->pools[SIM_KV], kv[q - first]);
                adopted[0][q] = true;
                if (swa != NULL && swa[q - first] >= 0) {
                    x->units[1][q - p] = swa[q - first];
                    tree_adopt(&s->pools[SIM_SWA], swa[q - first]);
                    adopted[1][q] = true;
                }
            }
            x->next = node->child;
            node->child = x;
            node = x;
            p = n_pages;
            break;
        }
        uint32_t k = node_match(s, c, tokens, p, n_pages);
        if (k < c->n)
            c = node_split(s, c, k);
        for (uint32_t q = p; q < p + k; q++)
            if (swa != NULL && q >= first && swa[q - first] >= 0 &&
                c->units[1][q - p] < 0) {
                c->units[1][q - p] = swa[q - first];
                tree_adopt(&s->pools[SIM_SWA], swa[q - first]);
                adopted[1][q] = true;
            }
        node = c;
        p += k;
    }
    if (mamba >= 0) {
        if (node->mamba >= 0) {
            res->mamba_exist = true;
            sim_free_unit(&s->pools[SIM_MAMBA], mamba);
        } else {
            node->mamba = mamba;
            tree_adopt(&s->pools[SIM_MAMBA], mamba);
            res->mamba_adopted = true;
        }
    }
    for (int k = 0; k < 2; k++) {
        uint32_t b = n_pages, e = 0;
        for (uint32_t q = 0; q < n_pages; q++)
            if (adopted[k][q]) {
                b = q < b ? q : b;
                e = q + 1;
            }
        if (e == 0)
            b = e = 0;
        for (uint32_t q = b; q < e; q++)
            DT_CHECK(adopted[k][q], "sim_tree_insert: adopted range %u..%u has a hole", b,
                     e);
        res->adopted_begin[k] = b;
        res->adopted_end[k] = e;
    }
    return 0;
}

/* Walks tokens' path (at most max_pages); calls back at each page end p with
 * the node holding page p-1 and whether p is that node's end. */
typedef void (*walk_fn)(sim_t *s, uint32_t p, const sim_node_t *x, bool node_end,
                        const int64_t *path_swa, void *ctx);

static uint32_t walk_path(sim_t *s, const uint32_t *tokens, uint32_t max_pages,
                          walk_fn fn, void *ctx)
{
    int64_t path_swa[SIM_MAX_PAGES];
    sim_node_t *node = s->root;
    uint32_t p = 0;
    while (p < max_pages) {
        sim_node_t *c = find_child(s, node, tokens + (size_t)p * s->ps);
        if (c == NULL)
            break;
        uint32_t k = node_match(s, c, tokens, p, max_pages);
        for (uint32_t j = 0; j < k; j++) {
            path_swa[p + j] = c->units[1][j];
            if (fn)
                fn(s, p + j + 1, c, j + 1 == c->n, path_swa, ctx);
        }
        p += k;
        if (k < c->n)
            break;
        node = c;
    }
    return p;
}

static void cached_cb(sim_t *s, uint32_t p, const sim_node_t *x, bool node_end,
                      const int64_t *path_swa, void *ctx)
{
    uint32_t *best = ctx;
    if (has_mamba(s) && !(node_end && x->mamba >= 0))
        return;
    if (has_swa(s)) {
        uint32_t w = s->cfg.swa_window, from = p > w ? p - w : 0;
        for (uint32_t q = from; q < p; q++)
            if (path_swa[q] < 0)
                return;
    }
    if ((p * s->ps) % s->grid == 0)
        *best = p;
}

uint32_t sim_tree_cached(sim_t *s, const uint32_t *tokens, uint32_t max_pages)
{
    uint32_t best = 0;
    walk_path(s, tokens, max_pages, cached_cb, &best);
    return best;
}

uint32_t sim_tree_match(sim_t *s, const uint32_t *tokens, uint32_t max_pages)
{
    return walk_path(s, tokens, max_pages, NULL, NULL);
}

static void node_release(sim_t *s, sim_node_t *x)
{
    for (sim_node_t *c = x->child, *next; c != NULL; c = next) {
        next = c->next;
        node_release(s, c);
    }
    for (uint32_t i = 0; i < x->n; i++) {
        if (x->units[0][i] >= 0)
            tree_release(&s->pools[SIM_KV], x->units[0][i]);
        if (x->units[1][i] >= 0)
            tree_release(&s->pools[SIM_SWA], x->units[1][i]);
    }
    if (x->mamba >= 0)
        tree_release(&s->pools[SIM_MAMBA], x->mamba);
    if (x != s->root) {
        free(x->tokens);
        free(x->units[0]);
        free(x->units[1]);
        free(x);
    }
}

void sim_drop_device(sim_t *s)
{
    node_release(s, s->root);
    s->root->child = NULL;
}

static void drop_mamba(sim_t *s, sim_node_t *x)
{
    for (sim_node_t *c = x->child; c != NULL; c = c->next)
        drop_mamba(s, c);
    if (x->mamba >= 0)
        tree_release(&s->pools[SIM_MAMBA], x->mamba);
    x->mamba = -1;
}

void sim_drop_mamba(sim_t *s)
{
    drop_mamba(s, s->root);
}

/* Depth-first over the tree with the path's tokens and page hashes. */
typedef void (*visit_fn)(sim_t *s, sim_node_t *x, const uint32_t *path,
                         const uint64_t *hashes, void *ctx);

static void visit(sim_t *s, sim_node_t *x, uint32_t *path, uint64_t *hashes, visit_fn fn,
                  void *ctx)
{
    if (x != s->root) {
        if (!DT_CHECK(x->start + x->n <= SIM_MAX_PAGES, "sim: tree deeper than %d pages",
                      SIM_MAX_PAGES))
            return;
        memcpy(path + (size_t)x->start * s->ps, x->tokens,
               (size_t)x->n * s->ps * sizeof(uint32_t));
        uint64_t h = x->start ? hashes[x->start - 1] : 0x5eed;
        for (uint32_t q = x->start; q < x->start + x->n; q++) {
            h = page_hash(h, path + (size_t)q * s->ps, s->ps);
            hashes[q] = h;
        }
        fn(s, x, path, hashes, ctx);
    }
    for (sim_node_t *c = x->child; c != NULL; c = c->next)
        visit(s, c, path, hashes, fn, ctx);
}

static void visit_tree(sim_t *s, visit_fn fn, void *ctx)
{
    uint32_t *path = malloc((size_t)SIM_MAX_PAGES * s->ps * sizeof(uint32_t));
    uint64_t hashes[SIM_MAX_PAGES];
    visit(s, s->root, path, hashes, fn, ctx);
    free(path);
}

typedef struct verify_ctx {
    const char *where;
    int64_t layer; /* -1: every layer */
    int bad;
} verify_ctx_t;

static void verify_node(sim_t *s, sim_node_t *x, const uint32_t *path,
                        const uint64_t *hashes, void *ctx)
{
    (void)path;
    verify_ctx_t *v = ctx;
    char what[200];
    for (uint32_t i = 0; i < x->n; i++) {
        uint32_t q = x->start + i;
        for (int k = 0; k < 2; k++) {
            if (x->units[k][i] < 0)
                continue;
            sim_pool_t *p = &s->pools[k];
            if (check_unit(p, (uint32_t)x->units[k][i], hashes[q], v->layer, what,
                           sizeof(what))) {
                v->bad++;
                dt_fail(__FILE__, __LINE__, "%s: tree page %u (%s unit %" PRId64 "): %s",
                        v->where, q, p->name, x->units[k][i], what);
            }
        }
    }
    if (x->mamba >= 0) {
        uint32_t end = x->start + x->n;
        sim_pool_t *p = &s->pools[SIM_MAMBA];
        if (check_unit(p, (uint32_t)x->mamba, state_hash(s, hashes[end - 1]), v->layer,
                       what, sizeof(what))) {
            v->bad++;
            dt_fail(__FILE__, __LINE__,
                    "%s: mamba state at page %u (slot %" PRId64 "): %s", v->where, end,
                    x->mamba, what);
        }
    }
}

int sim_verify_tree(sim_t *s, const char *where)
{
    verify_ctx_t v = {.where = where, .layer = -1};
    visit_tree(s, verify_node, &v);
    return v.bad;
}

int sim_verify_tree_layer(sim_t *s, uint32_t layer_id, const char *where)
{
    verify_ctx_t v = {.where = where, .layer = layer_id};
    visit_tree(s, verify_node, &v);
    return v.bad;
}

typedef struct count_ctx {
    uint8_t *seen[SIM_N_KINDS];
    uint32_t n[SIM_N_KINDS];
    uint32_t dup[SIM_N_KINDS];
} count_ctx_t;

static void count_one(sim_t *s, count_ctx_t *c, int k, int64_t u)
{
    if (u < 0)
        return;
    if (u >= s->pools[k].n_units || c->seen[k][u]++) {
        c->dup[k]++;
        return;
    }
    c->n[k]++;
}

static void count_node(sim_t *s, sim_node_t *x, const uint32_t *path,
                       const uint64_t *hashes, void *ctx)
{
    (void)path;
    (void)hashes;
    for (uint32_t i = 0; i < x->n; i++) {
        count_one(s, ctx, SIM_KV, x->units[0][i]);
        count_one(s, ctx, SIM_SWA, x->units[1][i]);
    }
    count_one(s, ctx, SIM_MAMBA, x->mamba);
}

static void count_tree(sim_t *s, count_ctx_t *c)
{
    memset(c, 0, sizeof(*c));
    for (int k = 0; k < SIM_N_KINDS; k++)
        c->seen[k] = calloc(s->pools[k].n_units + 1, 1);
    visit_tree(s, count_node, c);
}

static void count_free(count_ctx_t *c)
{
    for (int k = 0; k < SIM_N_KINDS; k++)
        free(c->seen[k]);
}

uint32_t sim_tree_units(sim_t *s, sim_pool_kind_t k)
{
    count_ctx_t c;
    count_tree(s, &c);
    uint32_t n = c.n[k];
    count_free(&c);
    return n;
}

int sim_check_invariants(sim_t *s, bool quiescent, const char *where)
{
    count_ctx_t c;
    count_tree(s, &c);
    int bad = 0;
    for (int k = 0; k < SIM_N_KINDS; k++) {
        sim_pool_t *p = &s->pools[k];
        if (!p->present)
            continue;
        pthread_mutex_lock(&p->lock);
        uint32_t n_free = 0, n_req = 0, n_tree = 0, tree_bad = 0;
        for (uint32_t u = 0; u < p->n_units; u++) {
            n_free += p->state[u] == SIM_UNIT_FREE;
            n_req += p->state[u] == SIM_UNIT_REQ;
            n_tree += p->state[u] == SIM_UNIT_TREE;
            tree_bad += (p->state[u] == SIM_UNIT_TREE) != (c.seen[k][u] != 0);
        }
        uint32_t available = p->n_free, total = p->n_units;
        uint64_t dbl = p->double_frees, tf = p->tree_frees, bf = p->bad_frees;
        pthread_mutex_unlock(&p->lock);
        bad += !DT_CHECK(available + c.n[k] + n_req == total,
                         "%s: %s: available %u + cached %u + in use %u != total %u",
                         where, p->name, available, c.n[k], n_req, total);
        bad += !DT_CHECK(available == n_free, "%s: %s: free count %u, FREE units %u",
                         where, p->name, available, n_free);
        bad += !DT_CHECK(tree_bad == 0 && c.dup[k] == 0 && n_tree == c.n[k],
                         "%s: %s: tree holds %u units (%u twice), %u marked TREE, %u "
                         "disagree",
                         where, p->name, c.n[k], c.dup[k], n_tree, tree_bad);
        bad += !DT_CHECK(dbl == 0 && tf == 0 && bf == 0,
                         "%s: %s: %" PRIu64 " double frees, %" PRIu64
                         " frees of tree-held units, %" PRIu64 " malformed frees",
                         where, p->name, dbl, tf, bf);
        if (quiescent)
            bad += !DT_CHECK(n_req == 0, "%s: %s: %u units still held by requests", where,
                             p->name, n_req);
    }
    count_free(&c);
    return bad;
}

int sim_check_poison(sim_t *s, const char *where)
{
    int bad = 0;
    for (int k = 0; k < SIM_N_KINDS; k++) {
        sim_pool_t *p = &s->pools[k];
        if (!p->present)
            continue;
        pthread_mutex_lock(&p->lock);
        uint32_t bad_free = 0, bad_pad = 0, first_free = UINT32_MAX;
        uint64_t rows = (uint64_t)p->n_units * p->rows_per_unit;
        for (uint32_t l = 0; l < p->n_layers; l++)
            for (uint32_t b = 0; b < p->n_bufs; b++) {
                size_t n = rows * p->row_stride[b];
                uint8_t *all = span_map(p, l, b, 0, n);
                for (uint64_t r = 0; r < rows; r++) {
                    const uint8_t *row = all + r * p->row_stride[b];
                    for (uint64_t i = p->bytes_per_row[b]; i < p->row_stride[b]; i++)
                        bad_pad += row[i] != SIM_PAD;
                    uint32_t u = (uint32_t)(r / p->rows_per_unit);
                    if (p->state[u] != SIM_UNIT_FREE)
                        continue;
                    for (uint64_t i = 0; i < p->bytes_per_row[b]; i++)
                        if (row[i] != SIM_POISON) {
                            bad_free++;
                            first_free = first_free == UINT32_MAX ? u : first_free;
                            break;
                        }
                }
                span_unmap(p, l, b, 0, n, all, false);
            }
        pthread_mutex_unlock(&p->lock);
        bad += !DT_CHECK(bad_free == 0,
                         "%s: %s: %u rows of free units were written (first unit %u)",
                         where, p->name, bad_free, first_free);
        bad += !DT_CHECK(bad_pad == 0, "%s: %s: %u pad bytes past row ends were written",
                         where, p->name, bad_pad);
    }
    return bad;
}

/* -------------------------------------------------------------- prefill */

int sim_prefill(sim_t *s, const uint32_t *tokens, size_t n_tokens)
{
    uint32_t n_full = (uint32_t)(n_tokens / s->ps);
    if (!DT_CHECK(n_full <= SIM_MAX_PAGES && n_tokens > 0, "sim_prefill: %zu tokens",
                  n_tokens))
        return -1;
    uint32_t probe = (uint32_t)((n_tokens - 1) / s->ps);
    uint32_t c = sim_tree_cached(s, tokens, probe);
    uint32_t g = has_mamba(s) ? (uint32_t)(n_tokens / s->grid * s->grid / s->ps) : n_full;
    uint64_t h[SIM_MAX_PAGES];
    sim_prefix_hashes(s, tokens, n_full, h);
    /* two inserts: [c, g) with the state at g, then [max(c, g), n_full) */
    uint32_t from[2] = {c, g > c ? g : c}, to[2] = {g, n_full};
    for (int step = 0; step < 2; step++) {
        if (to[step] <= from[step])
            continue;
        int64_t kv[SIM_MAX_PAGES], swa[SIM_MAX_PAGES], mamba = -1;
        uint32_t n = to[step] - from[step];
        for (uint32_t i = 0; i < n; i++) {
            uint32_t q = from[step] + i;
            kv[i] = sim_alloc_unit(&s->pools[SIM_KV]);
            if (!DT_CHECK(kv[i] >= 0, "sim_prefill: kv pool exhausted"))
                return -1;
            fill_unit(&s->pools[SIM_KV], (uint32_t)kv[i], h[q]);
            swa[i] = -1;
            if (has_swa(s)) {
                swa[i] = sim_alloc_unit(&s->pools[SIM_SWA]);
                if (!DT_CHECK(swa[i] >= 0, "sim_prefill: swa pool exhausted"))
                    return -1;
                fill_unit(&s->pools[SIM_SWA], (uint32_t)swa[i], h[q]);
            }
        }
        if (step == 0 && has_mamba(s)) {
            mamba = sim_alloc_unit(&s->pools[SIM_MAMBA]);
            if (!DT_CHECK(mamba >= 0, "sim_prefill: mamba pool exhausted"))
                return -1;
            fill_unit(&s->pools[SIM_MAMBA], (uint32_t)mamba, state_hash(s, h[to[0] - 1]));
        }
        sim_insert_result_t res;
        if (sim_tree_insert(s, tokens, to[step], from[step], kv, has_swa(s) ? swa : NULL,
                            mamba, &res) != 0)
            return -1;
        for (uint32_t i = 0; i < n; i++) {
            uint32_t q = from[step] + i;
            if (q < res.adopted_begin[0] || q >= res.adopted_end[0])
                sim_free_unit(&s->pools[SIM_KV], kv[i]);
            if (swa[i] >= 0 && (q < res.adopted_begin[1] || q >= res.adopted_end[1]))
                sim_free_unit(&s->pools[SIM_SWA], swa[i]);
        }
    }
    return (int)sim_tree_match(s, tokens, n_full);
}

/* -------------------------------------------------------------- offload */

typedef struct offload_job {
    uint64_t ack;
    bool seen;
    int64_t *slots[OFFLOAD_SLOTS];
    uint8_t (*keys)[KVD_PAGE_KEY_BYTES];
} offload_job_t;

typedef struct offload_ctx {
    offload_job_t *jobs;
    size_t n_jobs;
    unsigned mask;
    uint64_t units[SIM_N_KINDS];
    int bad;
} offload_ctx_t;

static int64_t *token_slots(uint32_t ps, const int64_t *units, uint32_t n)
{
    int64_t *t = malloc(((size_t)n * ps + 1) * sizeof(int64_t));
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t j = 0; j < ps; j++)
            t[(size_t)i * ps + j] = units[i] * ps + j;
    return t;
}

/* Queues one kvd_offload for the transfers built so far into a new job. */
static void offload_submit(sim_t *s, offload_ctx_t *o, offload_job_t *job,
                           const kvd_transfer_t *tr, size_t n_tr)
{
    if (n_tr == 0) {
        for (int i = 0; i < OFFLOAD_SLOTS; i++)
            free(job->slots[i]);
        free(job->keys);
        return;
    }
    int rc = kvd_offload(s->linker, tr, n_tr, &job->ack);
    if (!DT_CHECK(rc == 0, "kvd_offload: %d (%s)", rc, kvd_strerror(rc)) ||
        !DT_CHECK(o->n_jobs < MAX_ACKS, "too many offloads")) {
        o->bad++;
        for (int i = 0; i < OFFLOAD_SLOTS; i++)
            free(job->slots[i]);
        free(job->keys);
        return;
    }
    /* the arrays stay alive until the ack comes back */
    o->jobs[o->n_jobs++] = *job;
}

static void offload_node(sim_t *s, sim_node_t *x, const uint32_t *path,
                         const uint64_t *hashes, void *ctx)
{
    (void)hashes;
    offload_ctx_t *o = ctx;
    uint32_t end = x->start + x->n;
    offload_job_t job = {0};
    job.keys = malloc((size_t)end * KVD_PAGE_KEY_BYTES);
    size_t nk = 0;
    int rc = kvd_page_keys(path, (size_t)end * s->ps, s->ps, NULL, job.keys, &nk);
    if (!DT_CHECK(rc == 0 && nk == end, "kvd_page_keys: %d, %zu keys", rc, nk)) {
        free(job.keys);
        o->bad++;
        return;
    }
    kvd_transfer_t tr[OFFLOAD_SLOTS];
    size_t n_tr = 0;
    if (o->mask & (1u << SIM_KV)) {
        job.slots[0] = token_slots(s->ps, x->units[0], x->n);
        tr[n_tr++] = (kvd_transfer_t){
            .pool_id = s->pools[SIM_KV].pool_id,
            .keys = (const uint8_t(*)[KVD_PAGE_KEY_BYTES])(job.keys + x->start),
            .n_keys = x->n,
            .device_indices = job.slots[0],
            .n_indices = (size_t)x->n * s->ps,
            .first_depth = x->start,
            .prior_key = x->start ? job.keys[x->start - 1] : NULL};
        o->units[SIM_KV] += x->n;
    }
    if (has_swa(s) && (o->mask & (1u << SIM_SWA))) {
        /* one transfer per run of pages holding a window slot; runs after
         * the first go in their own offloads */
        uint32_t i = 0;
        while (i < x->n) {
            while (i < x->n && x->units[1][i] < 0)
                i++;
            uint32_t j = i;
            while (j < x->n && x->units[1][j] >= 0)
                j++;
            if (j == i)
                break;
            kvd_transfer_t t = {
                .pool_id = s->pools[SIM_SWA].pool_id,
                .keys = (const uint8_t(*)[KVD_PAGE_KEY_BYTES])(job.keys + x->start + i),
                .n_keys = j - i,
                .n_indices = (size_t)(j - i) * s->ps,
                .first_depth = x->start + i,
                .prior_key = x->start + i ? job.keys[x->start + i - 1] : NULL};
            o->units[SIM_SWA] += j - i;
            if (job.slots[1] == NULL) {
                job.slots[1] = token_slots(s->ps, x->units[1] + i, j - i);
                t.device_indices = job.slots[1];
                tr[n_tr++] = t;
            } else {
                offload_job_t extra = {0};
                extra.slots[0] = token_slots(s->ps, x->units[1] + i, j - i);
                extra.keys = malloc((size_t)end * KVD_PAGE_KEY_BYTES);
                memcpy(extra.keys, job.keys, (size_t)end * KVD_PAGE_KEY_BYTES);
                t.keys =
                    (const uint8_t(*)[KVD_PAGE_KEY_BYTES])(extra.keys + x->start + i);
                t.prior_key = x->start + i ? extra.keys[x->start + i - 1] : NULL;
                t.device_indices = extra.slots[0];
                offload_submit(s, o, &extra, &t, 1);
            }
            i = j;
        }
    }
    if (x->mamba >= 0 && (o->mask & (1u << SIM_MAMBA))) {
        job.slots[2] = malloc(sizeof(int64_t));
        job.slots[2][0] = x->mamba;
        tr[n_tr++] = (kvd_transfer_t){
            .pool_id = s->pools[SIM_MAMBA].pool_id,
            .keys = (const uint8_t(*)[KVD_PAGE_KEY_BYTES])(job.keys + end - 1),
            .n_keys = 1,
            .device_indices = job.slots[2],
            .n_indices = 1,
            .first_depth = end - 1,
            .prior_key = end >= 2 ? job.keys[end - 2] : NULL};
        o->units[SIM_MAMBA]++;
    }
    offload_submit(s, o, &job, tr, n_tr);
}

int sim_offload_tree(sim_t *s, unsigned kinds_mask, uint64_t units[SIM_N_KINDS])
{
    offload_ctx_t o = {.mask = kinds_mask};
    o.jobs = calloc(MAX_ACKS, sizeof(offload_job_t));
    visit_tree(s, offload_node, &o);
    size_t seen = 0;
    uint64_t deadline = now_ms() + WAIT_MS;
    while (seen < o.n_jobs && now_ms() < deadline) {
        kvd_completion_t done[64];
        size_t n = 0;
        int rc = kvd_pop_completed_offloads(s->linker, done, 64, &n);
        if (!DT_CHECK(rc == 0, "kvd_pop_completed_offloads: %d", rc))
            break;
        for (size_t i = 0; i < n; i++) {
            size_t j = 0;
            while (j < o.n_jobs && o.jobs[j].ack != done[i].id)
                j++;
            if (!DT_CHECK(j < o.n_jobs && !o.jobs[j].seen,
                          "offload ack %" PRIu64 " unknown or came back twice",
                          done[i].id)) {
                o.bad++;
                continue;
            }
            o.jobs[j].seen = true;
            seen++;
            if (!DT_CHECK(done[i].success, "offload ack %" PRIu64 " failed", done[i].id))
                o.bad++;
        }
        if (n == 0)
            sim_sleep_ms(1);
    }
    if (!DT_CHECK(seen == o.n_jobs, "%zu of %zu offloads came back within %d ms", seen,
                  o.n_jobs, WAIT_MS))
        o.bad++;
    /* a little more: nothing else may come back */
    kvd_completion_t extra[8];
    size_t n_extra = 0;
    kvd_pop_completed_offloads(s->linker, extra, 8, &n_extra);
    if (!DT_CHECK(n_extra == 0, "%zu offload completions beyond those queued", n_extra))
        o.bad++;
    for (size_t j = 0; j < o.n_jobs; j++) {
        for (int i = 0; i < OFFLOAD_SLOTS; i++)
            free(o.jobs[j].slots[i]);
        free(o.jobs[j].keys);
    }
    free(o.jobs);
    if (units)
        memcpy(units, o.units, sizeof(o.units));
    return o.bad ? -1 : 0;
}

/* ---------------------------------------------------------- load flow */

void sim_req_init(sim_t *s, sim_req_t *r, const uint32_t *tokens, size_t n_tokens)
{
    memset(r, 0, sizeof(*r));
    r->rid = s->next_rid++;
    r->tokens = tokens;
    r->n_tokens = n_tokens;
    r->mamba_slot = -1;
}

void sim_req_fini(sim_req_t *r)
{
    free(r->kv_tokens);
    free(r->swa_tokens);
    r->kv_tokens = r->swa_tokens = NULL;
}

int sim_req_lookup(sim_t *s, sim_req_t *r)
{
    uint32_t probe = r->n_tokens ? (uint32_t)((r->n_tokens - 1) / s->ps) : 0;
    if (!DT_CHECK(probe <= SIM_MAX_PAGES, "prompt of %zu tokens too long", r->n_tokens))
        return -1;
    r->n_probe = probe;
    size_t nk = 0;
    if (probe > 0) {
        int rc =
            kvd_page_keys(r->tokens, (size_t)probe * s->ps, s->ps, NULL, r->keys, &nk);
        if (!DT_CHECK(rc == 0 && nk == probe, "kvd_page_keys: %d (%zu keys)", rc, nk))
            return rc ? rc : -1;
    }
    r->cached = sim_tree_cached(s, r->tokens, probe);
    r->b = r->cached;
    r->n_boundaries = 0;
    r->state = SIM_REQ_LOOKED_UP;
    if (r->cached >= probe)
        return 0;
    kvd_transfer_t tr[SIM_N_KINDS];
    size_t n_tr = 0;
    for (int k = 0; k < SIM_N_KINDS; k++)
        if (s->pools[k].present)
            tr[n_tr++] = (kvd_transfer_t){
                .pool_id = s->pools[k].pool_id,
                .keys = (const uint8_t(*)[KVD_PAGE_KEY_BYTES])(r->keys + r->cached),
                .n_keys = probe - r->cached};
    uint32_t bnd[SIM_MAX_PAGES + 1];
    size_t nb = SIM_MAX_PAGES + 1;
    int rc = kvd_lookup(s->linker, r->rid, tr, n_tr, bnd, &nb);
    if (rc != 0)
        return rc;
    if (!DT_CHECK(nb <= probe - r->cached, "kvd_lookup: %zu boundaries for %u keys", nb,
                  probe - r->cached))
        return -1;
    for (size_t i = 0; i < nb; i++) {
        DT_CHECK(bnd[i] >= 1 && bnd[i] <= probe - r->cached &&
                     (i == 0 || bnd[i] > bnd[i - 1]),
                 "kvd_lookup: boundary %u out of order or range", bnd[i]);
        r->boundaries[i] = r->cached + bnd[i];
        if ((r->boundaries[i] * s->ps) % s->grid == 0)
            r->b = r->boundaries[i];
    }
    r->n_boundaries = nb;
    return 0;
}

int sim_req_load(sim_t *s, sim_req_t *r)
{
    r->n_tr = 0;
    if (r->b <= r->cached) {
        r->state = SIM_REQ_LOADED;
        return r->load_rc = 0;
    }
    uint32_t n = r->b - r->cached;
    sim_pool_t *kv = &s->pools[SIM_KV];
    for (uint32_t i = 0; i < n; i++) {
        r->kv_units[i] = sim_alloc_unit(kv);
        if (!DT_CHECK(r->kv_units[i] >= 0, "kv pool exhausted"))
            return -1;
    }
    free(r->kv_tokens);
    r->kv_tokens = token_slots(s->ps, r->kv_units, n);
    r->tr_kind[r->n_tr] = SIM_KV;
    r->tr[r->n_tr++] = (kvd_transfer_t){
        .pool_id = kv->pool_id,
        .keys = (const uint8_t(*)[KVD_PAGE_KEY_BYTES])(r->keys + r->cached),
        .n_keys = n,
        .device_indices = r->kv_tokens,
        .n_indices = (size_t)n * s->ps};
    if (has_swa(s)) {
        uint32_t w = s->cfg.swa_window;
        r->swa_first = r->b > r->cached + w ? r->b - w : r->cached;
        uint32_t m = r->b - r->swa_first;
        for (uint32_t i = 0; i < m; i++) {
            r->swa_units[i] = sim_alloc_unit(&s->pools[SIM_SWA]);
            if (!DT_CHECK(r->swa_units[i] >= 0, "swa pool exhausted"))
                return -1;
        }
        free(r->swa_tokens);
        r->swa_tokens = token_slots(s->ps, r->swa_units, m);
        r->tr_kind[r->n_tr] = SIM_SWA;
        r->tr[r->n_tr++] = (kvd_transfer_t){
            .pool_id = s->pools[SIM_SWA].pool_id,
            .keys = (const uint8_t(*)[KVD_PAGE_KEY_BYTES])(r->keys + r->swa_first),
            .n_keys = m,
            .device_indices = r->swa_tokens,
            .n_indices = (size_t)m * s->ps};
    }
    if (has_mamba(s)) {
        r->mamba_slot = sim_alloc_unit(&s->pools[SIM_MAMBA]);
        if (!DT_CHECK(r->mamba_slot >= 0, "mamba pool exhausted"))
            return -1;
        memcpy(r->mamba_key[0], r->keys[r->b - 1], KVD_PAGE_KEY_BYTES);
        r->tr_kind[r->n_tr] = SIM_MAMBA;
        r->tr[r->n_tr++] =
            (kvd_transfer_t){.pool_id = s->pools[SIM_MAMBA].pool_id,
                             .keys = (const uint8_t(*)[KVD_PAGE_KEY_BYTES])r->mamba_key,
                             .n_keys = 1,
                             .device_indices = &r->mamba_slot,
                             .n_indices = 1};
    }
    r->load_rc = kvd_load(s->linker, r->rid, r->tr, r->n_tr);
    if (r->load_rc == 0)
        r->state = SIM_REQ_LOADED;
    return r->load_rc;
}

int sim_req_prepare(sim_t *s, sim_req_t *r)
{
    if (r->n_tr == 0)
        return 0;
    int rc = kvd_load_prepare(s->linker, r->rid);
    if (rc == 0)
        r->state = SIM_REQ_PREPARED;
    return rc;
}

int sim_req_insert(sim_t *s, sim_req_t *r)
{
    if (r->n_tr == 0)
        return 0;
    int64_t swa[SIM_MAX_PAGES];
    for (uint32_t q = r->cached; q < r->b; q++)
        swa[q - r->cached] =
            has_swa(s) && q >= r->swa_first ? r->swa_units[q - r->swa_first] : -1;
    int rc = sim_tree_insert(s, r->tokens, r->b, r->cached, r->kv_units,
                             has_swa(s) ? swa : NULL, r->mamba_slot, &r->ins);
    if (rc != 0)
        return rc;
    for (size_t t = 0; t < r->n_tr; t++) {
        kvd_commit_pool_t *c = &r->commit[t];
        memset(c, 0, sizeof(*c));
        sim_pool_kind_t k = r->tr_kind[t];
        if (k == SIM_MAMBA) {
            c->mamba_exist = r->ins.mamba_exist;
            if (r->slot_override) {
                c->adopted_begin = r->slot_adopted_begin;
                c->adopted_end = r->slot_adopted_end;
            }
            continue;
        }
        uint32_t base = k == SIM_KV ? r->cached : r->swa_first;
        uint32_t b = r->ins.adopted_begin[k], e = r->ins.adopted_end[k];
        if (b < e) {
            DT_CHECK(b >= base, "adopted page %u below the transfer's first %u", b, base);
            c->adopted_begin = b - base;
            c->adopted_end = e - base;
        }
    }
    r->state = SIM_REQ_INSERTED;
    return 0;
}

int sim_req_commit(sim_t *s, sim_req_t *r)
{
    if (r->n_tr == 0)
        return 0;
    uint64_t before[SIM_N_KINDS], want[SIM_N_KINDS] = {0};
    for (int k = 0; k < SIM_N_KINDS; k++)
        before[k] = s->pools[k].present ? linker_freed(&s->pools[k]) : 0;
    for (size_t t = 0; t < r->n_tr; t++)
        if (r->tr_kind[t] != SIM_MAMBA)
            want[r->tr_kind[t]] =
                r->tr[t].n_keys - (r->commit[t].adopted_end - r->commit[t].adopted_begin);
    uint32_t mamba_free_before = has_mamba(s) ? sim_free_count(&s->pools[SIM_MAMBA]) : 0;
    int rc = kvd_load_commit(s->linker, r->rid, r->commit, r->n_tr);
    if (!DT_CHECK(rc == 0, "kvd_load_commit(rid %" PRIu64 "): %d (%s)", r->rid, rc,
                  kvd_strerror(rc)))
        return rc;
    r->state = SIM_REQ_COMMITTED;
    for (int k = 0; k < SIM_N_KINDS; k++) {
        if (!s->pools[k].present)
            continue;
        uint64_t got = linker_freed(&s->pools[k]) - before[k];
        DT_CHECK(got == want[k],
                 "commit rid %" PRIu64 ": %s: %" PRIu64
                 " units came back through free_indices, want %" PRIu64 " (not adopted)",
                 r->rid, s->pools[k].name, got, want[k]);
    }
    if (has_mamba(s))
        DT_CHECK(sim_free_count(&s->pools[SIM_MAMBA]) == mamba_free_before,
                 "commit rid %" PRIu64 " changed the mamba free count %u -> %u", r->rid,
                 mamba_free_before, sim_free_count(&s->pools[SIM_MAMBA]));
    return 0;
}

int sim_req_abort(sim_t *s, sim_req_t *r)
{
    uint64_t before[SIM_N_KINDS], want[SIM_N_KINDS] = {0};
    for (int k = 0; k < SIM_N_KINDS; k++)
        before[k] = s->pools[k].present ? linker_freed(&s->pools[k]) : 0;
    for (size_t t = 0; t < r->n_tr; t++)
        want[r->tr_kind[t]] = r->tr_kind[t] == SIM_MAMBA ? 1 : r->tr[t].n_keys;
    int rc = kvd_load_abort(s->linker, r->rid);
    if (rc != 0)
        return rc;
    r->state = SIM_REQ_ABORTED;
    for (int k = 0; k < SIM_N_KINDS; k++) {
        if (!s->pools[k].present)
            continue;
        uint64_t got = linker_freed(&s->pools[k]) - before[k];
        DT_CHECK(got == want[k],
                 "abort rid %" PRIu64 ": %s: %" PRIu64
                 " units came back through free_indices, want %" PRIu64,
                 r->rid, s->pools[k].name, got, want[k]);
    }
    return 0;
}

void sim_req_free_units(sim_t *s, sim_req_t *r)
{
    for (size_t t = 0; t < r->n_tr; t++) {
        sim_pool_kind_t k = r->tr_kind[t];
        sim_pool_t *p = &s->pools[k];
        size_t n = k == SIM_MAMBA ? 1 : r->tr[t].n_keys;
        for (size_t i = 0; i < n; i++) {
            int64_t u = k == SIM_MAMBA ? r->mamba_slot
                        : k == SIM_KV  ? r->kv_units[i]
                                       : r->swa_units[i];
            if (u >= 0 && p->state[u] == SIM_UNIT_REQ)
                sim_free_unit(p, u);
        }
    }
}

int sim_run_batch(sim_t *s, sim_req_t **reqs, size_t n)
{
    uint32_t counter = 0;
    int rc = kvd_start_layer_wise_loading(s->linker, &counter);
    if (!DT_CHECK(rc == 0, "kvd_start_layer_wise_loading: %d (%s)", rc, kvd_strerror(rc)))
        return -1;
    int bad = 0;
    for (uint32_t l = 0; l < s->n_layers; l++) {
        rc = kvd_wait_layer(s->linker, counter, l);
        bad += !DT_CHECK(rc == 0, "kvd_wait_layer(%u, layer %u): %d (%s)", counter, l, rc,
                         kvd_strerror(rc));
        /* once its wait returns, the layer's bytes are in place (later
         * layers may still be copying) */
        char where[64];
        snprintf(where, sizeof(where), "batch %u, right after waiting for layer %u",
                 counter, l);
        bad += sim_verify_tree_layer(s, l, where) != 0;
    }
    size_t expect = 0;
    for (size_t i = 0; i < n; i++)
        expect += reqs[i]->state == SIM_REQ_COMMITTED;
    size_t seen = 0;
    uint64_t deadline = now_ms() + WAIT_MS;
    while (seen < expect && now_ms() < deadline) {
        kvd_completion_t done[16];
        size_t got = 0;
        rc = kvd_pop_completed_loads(s->linker, done, 16, &got);
        if (!DT_CHECK(rc == 0, "kvd_pop_completed_loads: %d", rc))
            return -1;
        for (size_t i = 0; i < got; i++) {
            size_t j = 0;
            while (j < n && reqs[j]->rid != done[i].id)
                j++;
            if (!DT_CHECK(j < n && reqs[j]->state == SIM_REQ_COMMITTED,
                          "completed load rid %" PRIu64
                          " unknown, not committed or twice",
                          done[i].id)) {
                bad++;
                continue;
            }
            reqs[j]->state = SIM_REQ_DONE;
            seen++;
            bad += !DT_CHECK(done[i].success, "load rid %" PRIu64 " failed", done[i].id);
        }
        if (got == 0)
            sim_sleep_ms(1);
    }
    bad +=
        !DT_CHECK(seen == expect, "%zu of %zu committed loads came back", seen, expect);
    return bad ? -1 : 0;
}

size_t sim_drain_loads(sim_t *s, int wait_ms)
{
    size_t total = 0;
    uint64_t deadline = now_ms() + (uint64_t)wait_ms;
    do {
        kvd_completion_t done[16];
        size_t got = 0;
        if (kvd_pop_completed_loads(s->linker, done, 16, &got) != 0)
            break;
        for (size_t i = 0; i < got; i++)
            fprintf(stderr, "sim: completed load rid %" PRIu64 " (%s)\n", done[i].id,
                    done[i].success ? "success" : "failed");
        total += got;
        sim_sleep_ms(1);
    } while (now_ms() < deadline);
    return total;
}

int sim_load_req(sim_t *s, sim_req_t *r)
{
    int rc = sim_req_lookup(s, r);
    if (!DT_CHECK(rc == 0, "kvd_lookup: %d (%s)", rc, kvd_strerror(rc)))
        return -1;
    if (r->b <= r->cached)
        return 0;
    rc = sim_req_load(s, r);
    if (!DT_CHECK(rc == 0, "kvd_load(rid %" PRIu64 "): %d (%s)", r->rid, rc,
                  kvd_strerror(rc))) {
        sim_req_abort(s, r);
        return -1;
    }
    rc = sim_req_prepare(s, r);
    if (!DT_CHECK(rc == 0, "kvd_load_prepare: %d (%s)", rc, kvd_strerror(rc))) {
        sim_req_abort(s, r);
        return -1;
    }
    if (sim_req_insert(s, r) != 0 || sim_req_commit(s, r) != 0)
        return -1;
    sim_req_t *batch[1] = {r};
    if (sim_run_batch(s, batch, 1) != 0)
        return -1;
    return (int)((r->b - r->cached) * s->ps);
}

int sim_load(sim_t *s, const uint32_t *tokens, size_t n_tokens)
{
    sim_req_t *r = calloc(1, sizeof(*r));
    sim_req_init(s, r, tokens, n_tokens);
    int out = sim_load_req(s, r);
    sim_req_fini(r);
    free(r);
    return out;
}

kvd_pool_stats_t sim_stats(sim_t *s, sim_pool_kind_t k)
{
    kvd_pool_stats_t st;
    memset(&st, 0, sizeof(st));
    int rc = kvd_stats(s->linker, s->pools[k].pool_id, &st);
    DT_CHECK(rc == 0, "kvd_stats(%s): %d", s->pools[k].name, rc);
    return st;
}

uint64_t sim_daemon_pins(const char *socket)
{
    kvd_stats_rep_t *st = malloc(sizeof(*st));
    uint64_t pins = UINT64_MAX;
    if (dt_stats_fresh(socket, st) == KVD_OK)
        pins = st->store.pins;
    free(st);
    return pins;
}

uint64_t sim_wait_pins_zero(const char *socket, int timeout_ms)
{
    uint64_t deadline = now_ms() + (uint64_t)timeout_ms, pins;
    while ((pins = sim_daemon_pins(socket)) != 0 && pins != UINT64_MAX &&
           now_ms() < deadline)
        sim_sleep_ms(5);
    return pins;
}

/* -------------------------------------------------------------- fixture */

int sim_fixture_start(sim_fixture_t *f, const char *name, const sim_config_t *cfg,
                      uint32_t seed, size_t n_tokens)
{
    memset(f, 0, sizeof(*f));
    f->name = name;
    f->cfg = *cfg;
    f->n_tokens = n_tokens;
    int mem = sim_memory_open();
    if (mem == 77)
        exit(77); /* no device here (gt_open said why); nothing started yet */
    if (!DT_CHECK(mem == 0, "%s: the pools' memory cannot be opened", name))
        return -1;
    if (dt_start(&f->d, NULL) != 0)
        return -1;
    f->daemon_up = true;
    f->tokens = malloc(n_tokens * sizeof(uint32_t));
    if (!DT_CHECK(f->tokens != NULL, "%s: no memory for %zu tokens", name, n_tokens))
        return -1;
    sim_tokens(seed, f->tokens, n_tokens);
    return sim_open(&f->s, &f->cfg, f->d.socket);
}

int sim_fixture_reopen(sim_fixture_t *f)
{
    sim_close(&f->s);
    if (!f->daemon_up)
        return -1;
    return sim_open(&f->s, &f->cfg, f->d.socket);
}

int sim_fixture_end(sim_fixture_t *f)
{
    sim_close(&f->s);
    free(f->tokens);
    f->tokens = NULL;
    if (f->daemon_up)
        dt_stop(&f->d, SIGTERM, 10000);
    f->daemon_up = false;
    return dt_exit_status(f->name);
}

/* ------------------------------------------------------- the daemon's CLI */

void sim_key_hex(const uint8_t *key, char *hex)
{
    for (int i = 0; i < KVD_PAGE_KEY_BYTES; i++)
        snprintf(hex + 2 * i, 3, "%02x", key[i]);
}

uint64_t sim_evict(const char *socket, const char *const *args)
{
    const char *argv[16] = {"--socket", socket, "evict"};
    size_t n = 3;
    char shown[256] = "";
    for (size_t i = 0; args[i] != NULL && n < KVD_ARRAY_SIZE(argv) - 2; i++) {
        argv[n++] = args[i];
        size_t at = strlen(shown);
        snprintf(shown + at, sizeof(shown) - at, "%s%s", at ? " " : "", args[i]);
    }
    argv[n++] = "--json";
    argv[n] = NULL;
    char out[256] = "";
    int rc = dt_cli(out, sizeof(out), argv);
    uint64_t evicted = UINT64_MAX;
    if (!DT_CHECK(rc == 0 && dt_json_u64(out, NULL, "evicted", &evicted),
                  "kvdock evict %s: exit %d, output %s", shown, rc, out))
        return UINT64_MAX;
    return evicted;
}
