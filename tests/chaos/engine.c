/*
 * engine.c - the worker engine and the verifier of kvdock-chaos (chaos.h).
 *
 * A worker is a small serving engine against libkvdock: one paged device
 * pool of host memory with a block allocator (a unit is one page of token
 * slots; free units hold CH_POISON_BYTE, pads CH_PAD_BYTE, so a late or
 * misplaced copy shows), random prompts from a few shared prefixes, and per
 * request: LOOKUP, LOAD of a boundary it returned, PREPARE, then ABORT now
 * and then or COMMIT (sometimes adopting only part), the layer-wise copies,
 * the completion, every loaded byte checked against the key's derivation;
 * then an offload of the pages the store lacked, whose acknowledgement is
 * recorded. Offloads run beside the loads (their units are held until the
 * ack). Errors the injuries cause (timeouts, closed connections, a daemon
 * not up yet) are counted; anything else is a failure, written to
 * w<I>.fail.
 *
 * The verifier reads every worker's acknowledgements and loads each object
 * back through the same linker calls.
 *
 * Threading: one engine thread; the linker calls free_indices on the thread
 * that commits or aborts, which is that thread too, but the allocator is
 * locked anyway (cheap, and right if that ever changes).
 */
#include "chaos.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------- helpers */

static uint64_t mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

uint64_t ch_rand(uint64_t *state)
{
    return mix64((*state)++);
}

uint64_t ch_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

void ch_sleep_ms(int ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

void ch_row_bytes(const uint8_t *key, uint32_t layer, uint32_t buf, uint32_t row,
                  uint8_t *out)
{
    uint64_t a, b;
    memcpy(&a, key, 8);
    memcpy(&b, key + 8, 8);
    uint64_t base = mix64(mix64(a ^ mix64(b)) ^ ((uint64_t)layer << 48) ^
                          ((uint64_t)buf << 40) ^ ((uint64_t)row << 16));
    for (size_t i = 0; i < CH_ROW; i += 8) {
        uint64_t w = mix64(base + i);
        memcpy(out + i, &w, 8);
    }
}

uint64_t ch_object_checksum(const uint8_t *key)
{
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a over the object's bytes */
    uint8_t row[CH_ROW];
    for (uint32_t l = 0; l < CH_LAYERS; l++)
        for (uint32_t b = 0; b < CH_BUFS; b++)
            for (uint32_t r = 0; r < CH_PAGE; r++) {
                ch_row_bytes(key, l, b, r, row);
                for (size_t i = 0; i < CH_ROW; i++)
                    h = (h ^ row[i]) * 0x100000001b3ull;
            }
    return h;
}

void ch_prompt_tokens(uint32_t prefix, uint32_t suffix, uint32_t *out)
{
    size_t np = (size_t)CH_PREFIX_PAGES * CH_PAGE, ns = (size_t)CH_SUFFIX_PAGES * CH_PAGE;
    for (size_t i = 0; i < np; i++)
        out[i] = (uint32_t)(mix64(((uint64_t)(prefix + 1) << 32) ^ i) % 150000u);
    uint64_t s = ((uint64_t)(prefix + 1) << 40) ^ ((uint64_t)(suffix + 1) << 8) ^ 0x55;
    for (size_t i = 0; i < ns; i++)
        out[np + i] = (uint32_t)(mix64((s << 20) ^ i) % 150000u);
}

void ch_key_hex(const uint8_t *key, char hex[2 * KVD_PAGE_KEY_BYTES + 1])
{
    for (int i = 0; i < KVD_PAGE_KEY_BYTES; i++)
        snprintf(hex + 2 * i, 3, "%02x", key[i]);
}

bool ch_key_parse(const char *hex, uint8_t *key)
{
    for (int i = 0; i < KVD_PAGE_KEY_BYTES; i++) {
        unsigned v;
        if (sscanf(hex + 2 * i, "%2x", &v) != 1)
            return false;
        key[i] = (uint8_t)v;
    }
    return true;
}

void ch_stats_write(const char *path, const ch_stats_t *st)
{
    char tmp[512];
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (f == NULL)
        return;
#define CH_PUT(n) fprintf(f, "%s %" PRIu64 "\n", #n, st->n);
    CH_STATS(CH_PUT)
#undef CH_PUT
    if (fclose(f) == 0)
        rename(tmp, path);
}

bool ch_stats_add(const char *path, ch_stats_t *st)
{
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return false;
    char name[64];
    uint64_t v;
    while (fscanf(f, "%63s %" SCNu64, name, &v) == 2) {
        if (strcmp(name, "max_call_ms") == 0) {
            st->max_call_ms = v > st->max_call_ms ? v : st->max_call_ms;
            continue;
        }
#define CH_ADD(n)              \
    if (strcmp(name, #n) == 0) \
        st->n += v;
        CH_STATS(CH_ADD)
#undef CH_ADD
    }
    fclose(f);
    return true;
}

/* ------------------------------------------------------------ failures */

static int g_fail_fd = -1; /* w<I>.fail, O_APPEND */
static ch_stats_t g_st;

/* Records a failure: stderr and the worker's failure file (one write, so a
 * kill never leaves half a line). */
static void ch_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void ch_fail(const char *fmt, ...)
{
    char line[600];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof(line) - 1, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n > sizeof(line) - 2)
        n = (int)sizeof(line) - 2;
    line[n++] = '\n';
    line[n] = '\0';
    g_st.failures++;
    fputs(line, stderr);
    if (g_fail_fd >= 0 && write(g_fail_fd, line, (size_t)n) < 0)
        perror("chaos: write of a failure line");
}

/* ------------------------------------------------------- the device pool */

typedef struct dpool {
    uint32_t n_units;
    uint8_t *data[CH_LAYERS][CH_BUFS];
    uint8_t *held;        /* per unit: 1 held by the engine or the linker */
    uint32_t *free_stack; /* LIFO */
    uint32_t n_free;
    uint64_t linker_freed; /* units handed back through free_indices */
    uint64_t bad_frees;    /* double, out of range, not whole pages */
    pthread_mutex_t lock;
    uint32_t pool_id;
} dpool_t;

#define STRIDE (CH_ROW + CH_PAD)

static uint8_t *row_ptr(dpool_t *p, uint32_t l, uint32_t b, uint64_t row)
{
    return p->data[l][b] + row * STRIDE;
}

static void poison_unit(dpool_t *p, uint32_t u)
{
    for (uint32_t l = 0; l < CH_LAYERS; l++)
        for (uint32_t b = 0; b < CH_BUFS; b++)
            for (uint32_t r = 0; r < CH_PAGE; r++)
                memset(row_ptr(p, l, b, (uint64_t)u * CH_PAGE + r), CH_POISON_BYTE,
                       CH_ROW);
}

/* Writes the key's object into unit u: what the forward pass computed. */
static void fill_unit(dpool_t *p, uint32_t u, const uint8_t *key)
{
    for (uint32_t l = 0; l < CH_LAYERS; l++)
        for (uint32_t b = 0; b < CH_BUFS; b++)
            for (uint32_t r = 0; r < CH_PAGE; r++)
                ch_row_bytes(key, l, b, r, row_ptr(p, l, b, (uint64_t)u * CH_PAGE + r));
}

/* Whether unit u holds key's object byte-exact; the first difference in
 * what (when it does not). */
static bool check_unit(dpool_t *p, uint32_t u, const uint8_t *key, char *what, size_t n)
{
    uint8_t want[CH_ROW];
    for (uint32_t l = 0; l < CH_LAYERS; l++)
        for (uint32_t b = 0; b < CH_BUFS; b++)
            for (uint32_t r = 0; r < CH_PAGE; r++) {
                const uint8_t *got = row_ptr(p, l, b, (uint64_t)u * CH_PAGE + r);
                ch_row_bytes(key, l, b, r, want);
                if (memcmp(got, want, CH_ROW) == 0)
                    continue;
                size_t i = 0;
                while (got[i] == want[i])
                    i++;
                snprintf(what, n,
                         "layer %u buffer %u row %u byte %zu: 0x%02x, want 0x%02x%s", l,
                         b, r, i, got[i], want[i],
                         got[i] == CH_POISON_BYTE ? " (never written)" : "");
                return false;
            }
    return true;
}

static int dpool_init(dpool_t *p, uint32_t n_units)
{
    memset(p, 0, sizeof(*p));
    p->n_units = n_units;
    pthread_mutex_init(&p->lock, NULL);
    size_t bytes = (size_t)n_units * CH_PAGE * STRIDE;
    for (uint32_t l = 0; l < CH_LAYERS; l++)
        for (uint32_t b = 0; b < CH_BUFS; b++) {
            if ((p->data[l][b] = malloc(bytes)) == NULL)
                return -1;
            memset(p->data[l][b], CH_PAD_BYTE, bytes);
        }
    p->held = calloc(n_units, 1);
    p->free_stack = malloc(n_units * sizeof(uint32_t));
    if (p->held == NULL || p->free_stack == NULL)
        return -1;
    for (uint32_t i = 0; i < n_units; i++) {
        p->free_stack[i] = n_units - 1 - i;
        poison_unit(p, i);
    }
    p->n_free = n_units;
    return 0;
}

static void dpool_fini(dpool_t *p)
{
    for (uint32_t l = 0; l < CH_LAYERS; l++)
        for (uint32_t b = 0; b < CH_BUFS; b++)
            free(p->data[l][b]);
    free(p->held);
    free(p->free_stack);
    pthread_mutex_destroy(&p->lock);
}

/* n units into out; false (nothing taken) when fewer are free. */
static bool dpool_alloc(dpool_t *p, uint32_t n, int64_t *out)
{
    pthread_mutex_lock(&p->lock);
    bool ok = p->n_free >= n;
    for (uint32_t i = 0; ok && i < n; i++) {
        uint32_t u = p->free_stack[--p->n_free];
        p->held[u] = 1;
        out[i] = u;
    }
    pthread_mutex_unlock(&p->lock);
    return ok;
}

static void free_locked(dpool_t *p, int64_t u, const char *who)
{
    if (u < 0 || u >= (int64_t)p->n_units || !p->held[u]) {
        p->bad_frees++;
        ch_fail("%s freed unit %" PRId64 ", %s", who, u,
                u < 0 || u >= (int64_t)p->n_units ? "out of range" : "free already");
        return;
    }
    p->held[u] = 0;
    poison_unit(p, (uint32_t)u);
    p->free_stack[p->n_free++] = (uint32_t)u;
}

static void dpool_free(dpool_t *p, const int64_t *units, uint32_t n)
{
    pthread_mutex_lock(&p->lock);
    for (uint32_t i = 0; i < n; i++)
        free_locked(p, units[i], "the engine");
    pthread_mutex_unlock(&p->lock);
}

/* free_indices: token slots of whole pages, each from a page start. */
static void free_indices_cb(void *ctx, const int64_t *idx, size_t n)
{
    dpool_t *p = ctx;
    pthread_mutex_lock(&p->lock);
    if (n % CH_PAGE != 0) {
        p->bad_frees++;
        ch_fail("free_indices: %zu token slots, not whole pages", n);
    }
    for (size_t g = 0; g + CH_PAGE <= n; g += CH_PAGE) {
        bool whole = idx[g] >= 0 && idx[g] % CH_PAGE == 0;
        for (uint32_t j = 1; whole && j < CH_PAGE; j++)
            whole = idx[g + j] == idx[g] + j;
        if (!whole) {
            p->bad_frees++;
            ch_fail("free_indices: slots %zu.. are not one aligned page (first %" PRId64
                    ")",
                    g, idx[g]);
            continue;
        }
        free_locked(p, idx[g] / CH_PAGE, "free_indices");
        p->linker_freed++;
    }
    pthread_mutex_unlock(&p->lock);
}

static uint64_t dpool_linker_freed(dpool_t *p)
{
    pthread_mutex_lock(&p->lock);
    uint64_t n = p->linker_freed;
    pthread_mutex_unlock(&p->lock);
    return n;
}

static uint32_t dpool_free_count(dpool_t *p)
{
    pthread_mutex_lock(&p->lock);
    uint32_t n = p->n_free;
    pthread_mutex_unlock(&p->lock);
    return n;
}

/* Free units whose rows are not all poison, and pad bytes not PAD: each a
 * copy that landed where it must not. Returns how many units are bad. */
static int dpool_check_poison(dpool_t *p)
{
    int bad = 0;
    pthread_mutex_lock(&p->lock);
    for (uint32_t u = 0; u < p->n_units; u++) {
        bool ok = true;
        for (uint32_t l = 0; ok && l < CH_LAYERS; l++)
            for (uint32_t b = 0; ok && b < CH_BUFS; b++)
                for (uint32_t r = 0; ok && r < CH_PAGE; r++) {
                    const uint8_t *row = row_ptr(p, l, b, (uint64_t)u * CH_PAGE + r);
                    for (size_t i = CH_ROW; ok && i < STRIDE; i++)
                        ok = row[i] == CH_PAD_BYTE;
                    for (size_t i = 0; ok && !p->held[u] && i < CH_ROW; i++)
                        ok = row[i] == CH_POISON_BYTE;
                }
        if (!ok) {
            bad++;
            ch_fail("device unit %u (%s) was written: a copy outside its rows", u,
                    p->held[u] ? "held, in its pad" : "free");
            /* repair, so that one stray copy is reported once */
            for (uint32_t l = 0; l < CH_LAYERS; l++)
                for (uint32_t b = 0; b < CH_BUFS; b++)
                    for (uint32_t r = 0; r < CH_PAGE; r++)
                        memset(row_ptr(p, l, b, (uint64_t)u * CH_PAGE + r) + CH_ROW,
                               CH_PAD_BYTE, CH_PAD);
            if (!p->held[u])
                poison_unit(p, u);
        }
    }
    pthread_mutex_unlock(&p->lock);
    return bad;
}

static int64_t *token_slots(const int64_t *units, uint32_t n)
{
    int64_t *t = malloc(((size_t)n * CH_PAGE + 1) * sizeof(int64_t));
    if (t == NULL)
        return NULL;
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t j = 0; j < CH_PAGE; j++)
            t[(size_t)i * CH_PAGE + j] = units[i] * CH_PAGE + j;
    return t;
}

/* Opens a linker on socket and registers the model's pool over p. */
static int open_engine(const char *socket, const char *name, int timeout_ms, dpool_t *p,
                       kvd_linker_t **out)
{
    kvd_linker_config_t lc = {.socket_path = socket,
                              .client_name = name,
                              .model_id = CH_MODEL,
                              .tp_rank = 0,
                              .tp_size = 1,
                              .pp_rank = 0,
                              .pp_size = 1,
                              .cp_rank = 0,
                              .cp_size = 1,
                              .timeout_ms = timeout_ms};
    kvd_linker_t *lk = NULL;
    int rc = kvd_linker_open(&lc, &lk);
    if (rc != 0)
        return rc;
    kvd_pool_layer_t layers[CH_LAYERS];
    memset(layers, 0, sizeof(layers));
    for (uint32_t l = 0; l < CH_LAYERS; l++) {
        layers[l].layer_id = l;
        layers[l].n_buffers = CH_BUFS;
        for (uint32_t b = 0; b < CH_BUFS; b++)
            layers[l].buffers[b] = (kvd_pool_buffer_t){
                .base = p->data[l][b], .row_stride = STRIDE, .bytes_per_row = CH_ROW};
    }
    kvd_pool_desc_t d = {.name = "kv",
                         .addressing = KVD_ADDR_PAGED,
                         .page_size = CH_PAGE,
                         .n_rows = (uint64_t)p->n_units * CH_PAGE,
                         .memory = KVD_MEM_HOST,
                         .n_layers = CH_LAYERS,
                         .layers = layers,
                         .free_indices = free_indices_cb,
                         .free_ctx = p};
    rc = kvd_register_pool(lk, &d, &p->pool_id);
    uint64_t obj = 0;
    if (rc == 0)
        rc = kvd_pool_info(lk, p->pool_id, &obj, NULL, 0);
    if (rc == 0 && obj != CH_OBJECT_BYTES) {
        ch_fail("object of %" PRIu64 " bytes, want %" PRIu64, obj, CH_OBJECT_BYTES);
        rc = KVD_ERR_PROTOCOL;
    }
    if (rc != 0) {
        kvd_linker_close(lk);
        return rc;
    }
    *out = lk;
    return 0;
}

/* ------------------------------------------------------------- the worker */

#define W_UNITS       320   /* device pages of a worker */
#define W_MAX_PENDING 16    /* offloads awaiting their ack */
#define W_WAIT_MS     60000 /* a completion must come back within this */
#define W_BOUND_SLACK 1000  /* a call may take timeout_ms plus this */

typedef struct pending {
    bool used;
    uint64_t ack;
    uint64_t submit_ms;
    uint32_t n;
    int64_t units[CH_MAX_PAGES];
    ch_key_t keys[CH_MAX_PAGES];
} pending_t;

typedef struct worker {
    const ch_worker_opts_t *o;
    kvd_linker_t *lk;
    dpool_t pool;
    uint64_t rng;
    uint64_t next_rid;
    pending_t pend[W_MAX_PENDING];
    int ack_fd;
    int try_fd; /* w<I>.tries: every page of every offload, at submit */
    char stats_path[512];
} worker_t;

static volatile sig_atomic_t g_stop, g_conts;

static void on_term(int sig)
{
    (void)sig;
    g_stop = 1;
}

/* SIGCONT: this worker was stopped; a call it was in is not timed. */
static void on_cont(int sig)
{
    (void)sig;
    g_conts++;
}

typedef struct tstamp {
    uint64_t ms;
    sig_atomic_t conts;
} tstamp_t;

static tstamp_t tnow(void)
{
    return (tstamp_t){ch_now_ms(), g_conts};
}

/* Times one linker call: calls over the bound are counted (issue 11 hole 6:
 * timeout_ms is a bound on every call, also while the daemon hangs), except
 * those during which this worker itself was stopped. */
static void timed(worker_t *w, tstamp_t t0, const char *what)
{
    if (g_conts != t0.conts)
        return;
    uint64_t d = ch_now_ms() - t0.ms;
    if (d > g_st.max_call_ms)
        g_st.max_call_ms = d;
    if (d > (uint64_t)w->o->timeout_ms + W_BOUND_SLACK) {
        g_st.calls_over_bound++;
        fprintf(stderr, "chaos: worker %d: %s took %" PRIu64 " ms (timeout_ms %d)\n",
                w->o->index, what, d, w->o->timeout_ms);
    }
}

/* Counts an error a call returned; false (and a failure recorded) when
 * the injuries cannot explain it. not_found: the call may say NOT_FOUND. */
static bool expected_error(worker_t *w, int rc, bool not_found, const char *what)
{
    switch (rc) {
    case KVD_ERR_TIMEOUT: g_st.err_timeout++; break;
    case KVD_ERR_CLOSED: g_st.err_closed++; break;
    case KVD_ERR_UNAVAILABLE:
    case KVD_ERR_DRAINING: g_st.err_unavailable++; break;
    case KVD_ERR_NOT_FOUND:
        g_st.err_not_found++;
        if (not_found)
            return true;
        /* fall through */
    default:
        g_st.err_other++;
        ch_fail("worker %d: %s: %d (%s)", w->o->index, what, rc, kvd_strerror(rc));
        return false;
    }
    if (w->o->strict) {
        ch_fail("worker %d: %s: %d (%s) with no injury", w->o->index, what, rc,
                kvd_strerror(rc));
        return false;
    }
    return true;
}

/* Pops offload acks: successes are recorded (one line per page), every
 * ack frees its units. */
static void pump_offloads(worker_t *w)
{
    kvd_completion_t done[32];
    size_t n = 0;
    tstamp_t t0 = tnow();
    int rc = kvd_pop_completed_offloads(w->lk, done, 32, &n);
    timed(w, t0, "kvd_pop_completed_offloads");
    if (rc != 0) {
        ch_fail("worker %d: kvd_pop_completed_offloads: %d", w->o->index, rc);
        return;
    }
    uint64_t now = ch_now_ms();
    for (size_t i = 0; i < n; i++) {
        pending_t *p = NULL;
        for (int j = 0; j < W_MAX_PENDING && p == NULL; j++)
            if (w->pend[j].used && w->pend[j].ack == done[i].id)
                p = &w->pend[j];
        if (p == NULL) {
            ch_fail("worker %d: offload ack %" PRIu64 " unknown or twice", w->o->index,
                    done[i].id);
            continue;
        }
        if (done[i].success) {
            g_st.offloads_acked++;
            g_st.pages_acked += p->n;
            /* one write for the whole ack: lines land whole */
            char *buf = malloc((size_t)p->n * 128);
            size_t len = 0;
            for (uint32_t k = 0; buf && k < p->n; k++) {
                char hex[2 * KVD_PAGE_KEY_BYTES + 1];
                ch_key_hex(p->keys[k], hex);
                len += (size_t)snprintf(
                    buf + len, 128, "%" PRIu64 " %" PRIu64 " %s %016" PRIx64 "\n",
                    p->submit_ms, now, hex, ch_object_checksum(p->keys[k]));
            }
            if (buf && write(w->ack_fd, buf, len) != (ssize_t)len)
                ch_fail("worker %d: write of acks: %s", w->o->index, strerror(errno));
            free(buf);
        } else {
            g_st.offload_failures++;
            if (w->o->strict)
                ch_fail("worker %d: offload ack %" PRIu64 " failed with no injury",
                        w->o->index, done[i].id);
        }
        dpool_free(&w->pool, p->units, p->n);
        p->used = false;
    }
}

static int pending_count(worker_t *w)
{
    int n = 0;
    for (int j = 0; j < W_MAX_PENDING; j++)
        n += w->pend[j].used;
    return n;
}

/* Takes n units, waiting (bounded) for offload acks to give some back. */
static bool alloc_units(worker_t *w, uint32_t n, int64_t *out)
{
    uint64_t until = ch_now_ms() + W_WAIT_MS;
    while (!dpool_alloc(&w->pool, n, out)) {
        if (ch_now_ms() > until || pending_count(w) == 0) {
            g_st.starved++;
            return false;
        }
        pump_offloads(w);
        ch_sleep_ms(2);
    }
    return true;
}

/* Waits for rid's completion (bounded), pumping offload acks meanwhile.
 * Returns 1 success, 0 failed, -1 it never came (recorded). */
static int wait_load(worker_t *w, uint64_t rid)
{
    uint64_t until = ch_now_ms() + W_WAIT_MS;
    while (ch_now_ms() < until) {
        kvd_completion_t c[4];
        size_t n = 0;
        tstamp_t t0 = tnow();
        int rc = kvd_pop_completed_loads(w->lk, c, 4, &n);
        timed(w, t0, "kvd_pop_completed_loads");
        if (rc != 0) {
            ch_fail("worker %d: kvd_pop_completed_loads: %d", w->o->index, rc);
            return -1;
        }
        int out = -1;
        for (size_t i = 0; i < n; i++) {
            if (c[i].id != rid || out != -1)
                ch_fail("worker %d: completed load rid %" PRIu64 " (waiting for %" PRIu64
                        ") unknown or twice",
                        w->o->index, c[i].id, rid);
            else
                out = c[i].success ? 1 : 0;
        }
        if (out != -1)
            return out;
        pump_offloads(w);
        ch_sleep_ms(1);
    }
    ch_fail("worker %d: load rid %" PRIu64 " never completed within %d ms", w->o->index,
            rid, W_WAIT_MS);
    return -1;
}

/* ABORT of a load that holds units[0..n): every unit must come back
 * through free_indices; when nothing was recorded the engine frees them. */
static void abort_load(worker_t *w, uint64_t rid, int64_t *units, uint32_t n)
{
    uint64_t before = dpool_linker_freed(&w->pool);
    tstamp_t t0 = tnow();
    int rc = kvd_load_abort(w->lk, rid);
    timed(w, t0, "kvd_load_abort");
    if (rc == 0) {
        g_st.aborts++;
        uint64_t got = dpool_linker_freed(&w->pool) - before;
        if (got != n)
            ch_fail("worker %d: abort rid %" PRIu64 ": %" PRIu64 " units back, want %u",
                    w->o->index, rid, got, n);
        return;
    }
    ch_fail("worker %d: kvd_load_abort(rid %" PRIu64 "): %d (%s)", w->o->index, rid, rc,
            kvd_strerror(rc));
    dpool_free(&w->pool, units, n);
}

/* One request of the engine: lookup, load (maybe abort), the layer-wise
 * copies and their check, then the offload of what the store lacked. */
static void one_request(worker_t *w)
{
    static uint32_t tokens[CH_MAX_PAGES * CH_PAGE];
    ch_key_t keys[CH_MAX_PAGES];
    uint32_t prefix = (uint32_t)(ch_rand(&w->rng) % CH_PREFIXES);
    uint32_t suffix = (uint32_t)(ch_rand(&w->rng) % w->o->suffixes);
    uint32_t n = 1 + (uint32_t)(ch_rand(&w->rng) % CH_MAX_PAGES);
    ch_prompt_tokens(prefix, suffix, tokens);
    size_t nk = 0;
    int rc = kvd_page_keys(tokens, (size_t)n * CH_PAGE, CH_PAGE, NULL, keys, &nk);
    if (rc != 0 || nk != n) {
        ch_fail("worker %d: kvd_page_keys: %d, %zu keys of %u", w->o->index, rc, nk, n);
        return;
    }
    g_st.iterations++;
    uint64_t rid = w->next_rid++;

    /* LOOKUP */
    kvd_transfer_t lt = {.pool_id = w->pool.pool_id,
                         .keys = (const uint8_t(*)[KVD_PAGE_KEY_BYTES])keys,
                         .n_keys = n};
    uint32_t bnd[CH_MAX_PAGES];
    size_t nb = 0;
    tstamp_t t0 = tnow();
    rc = kvd_lookup(w->lk, rid, &lt, 1, bnd, &nb);
    timed(w, t0, "kvd_lookup");
    g_st.lookups++;
    if (rc != 0) {
        expected_error(w, rc, false, "kvd_lookup");
        ch_sleep_ms(10); /* the daemon is away: an engine backs off */
        return;
    }
    uint32_t b = 0;
    for (size_t i = 0; i < nb; i++)
        if (bnd[i] < 1 || bnd[i] > n || (i > 0 && bnd[i] <= bnd[i - 1]))
            ch_fail("worker %d: kvd_lookup: boundary %u out of order or range",
                    w->o->index, bnd[i]);
    if (nb > 0)
        b = ch_rand(&w->rng) % 5 == 0 ? bnd[ch_rand(&w->rng) % nb] : bnd[nb - 1];
    g_st.hit_pages += b;

    /* LOAD [0, b) */
    if (b > 0) {
        int64_t units[CH_MAX_PAGES];
        if (!alloc_units(w, b, units))
            return;
        int64_t *slots = token_slots(units, b);
        kvd_transfer_t t = {.pool_id = w->pool.pool_id,
                            .keys = (const uint8_t(*)[KVD_PAGE_KEY_BYTES])keys,
                            .n_keys = b,
                            .device_indices = slots,
                            .n_indices = (size_t)b * CH_PAGE};
        t0 = tnow();
        rc = kvd_load(w->lk, rid, &t, 1);
        timed(w, t0, "kvd_load");
        free(slots);
        g_st.loads++;
        if (rc != 0) {
            g_st.load_errors++;
            expected_error(w, rc, true, "kvd_load");
            abort_load(w, rid, units, b); /* a failed load stays recorded */
            return;
        }
        t0 = tnow();
        rc = kvd_load_prepare(w->lk, rid);
        timed(w, t0, "kvd_load_prepare");
        if (rc != 0) {
            ch_fail("worker %d: kvd_load_prepare: %d (%s)", w->o->index, rc,
                    kvd_strerror(rc));
            abort_load(w, rid, units, b);
            return;
        }
        if (ch_rand(&w->rng) % 10 == 0) { /* the engine gave up before its insert */
            abort_load(w, rid, units, b);
            goto offload;
        }
        /* the tree adopts all, or (one in five) a part: the rest was cached */
        kvd_commit_pool_t cp = {.adopted_begin = 0, .adopted_end = b};
        if (ch_rand(&w->rng) % 5 == 0) {
            uint32_t x = (uint32_t)(ch_rand(&w->rng) % (b + 1));
            uint32_t y = (uint32_t)(ch_rand(&w->rng) % (b + 1));
            cp.adopted_begin = x < y ? x : y;
            cp.adopted_end = x < y ? y : x;
            g_st.partial_commits++;
        }
        uint64_t before = dpool_linker_freed(&w->pool);
        t0 = tnow();
        rc = kvd_load_commit(w->lk, rid, &cp, 1);
        timed(w, t0, "kvd_load_commit");
        if (rc != 0) {
            ch_fail("worker %d: kvd_load_commit: %d (%s)", w->o->index, rc,
                    kvd_strerror(rc));
            abort_load(w, rid, units, b);
            return;
        }
        uint32_t adopted = cp.adopted_end - cp.adopted_begin;
        uint64_t got = dpool_linker_freed(&w->pool) - before;
        if (got != b - adopted)
            ch_fail("worker %d: commit rid %" PRIu64 ": %" PRIu64
                    " units back, want %u (not adopted)",
                    w->o->index, rid, got, b - adopted);
        uint32_t counter = 0;
        t0 = tnow();
        rc = kvd_start_layer_wise_loading(w->lk, &counter);
        timed(w, t0, "kvd_start_layer_wise_loading");
        if (rc != 0)
            ch_fail("worker %d: kvd_start_layer_wise_loading: %d", w->o->index, rc);
        for (uint32_t l = 0; rc == 0 && l < CH_LAYERS; l++) {
            t0 = tnow();
            int wrc = kvd_wait_layer(w->lk, counter, l);
            timed(w, t0, "kvd_wait_layer");
            if (wrc != 0 && wrc != KVD_ERR_TIMEOUT && wrc != KVD_ERR_CLOSED &&
                wrc != KVD_ERR_UNAVAILABLE)
                ch_fail("worker %d: kvd_wait_layer: %d (%s)", w->o->index, wrc,
                        kvd_strerror(wrc));
            else if (wrc != 0 && w->o->strict)
                ch_fail("worker %d: kvd_wait_layer: %d (%s) with no injury", w->o->index,
                        wrc, kvd_strerror(wrc));
        }
        int done = wait_load(w, rid);
        if (done == 1) {
            g_st.loads_completed++;
            for (uint32_t i = cp.adopted_begin; i < cp.adopted_end; i++) {
                char what[200];
                if (check_unit(&w->pool, (uint32_t)units[i], keys[i], what,
                               sizeof(what))) {
                    g_st.pages_verified++;
                } else {
                    char hex[2 * KVD_PAGE_KEY_BYTES + 1];
                    ch_key_hex(keys[i], hex);
                    ch_fail("worker %d: loaded page %u (key %s) differs: %s", w->o->index,
                            i, hex, what);
                }
            }
        } else if (done == 0) {
            g_st.load_failures++;
            if (w->o->strict)
                ch_fail("worker %d: load rid %" PRIu64 " failed with no injury",
                        w->o->index, rid);
        }
        /* the tree evicts at once (only a completed load's rows are ours
         * again; one that never completed stays held) */
        if (done != -1)
            dpool_free(&w->pool, units + cp.adopted_begin, adopted);
    }

offload:
    /* the engine computed [b, n): offload what the store lacked */
    if (b >= n || ch_rand(&w->rng) % 10 == 0)
        return;
    int slot = -1;
    for (int j = 0; j < W_MAX_PENDING && slot < 0; j++)
        if (!w->pend[j].used)
            slot = j;
    if (slot < 0)
        return;
    pending_t *p = &w->pend[slot];
    p->n = n - b;
    if (!alloc_units(w, p->n, p->units))
        return;
    for (uint32_t i = 0; i < p->n; i++) {
        memcpy(p->keys[i], keys[b + i], KVD_PAGE_KEY_BYTES);
        fill_unit(&w->pool, (uint32_t)p->units[i], p->keys[i]);
    }
    int64_t *slots = token_slots(p->units, p->n);
    kvd_transfer_t t = {.pool_id = w->pool.pool_id,
                        .keys = (const uint8_t(*)[KVD_PAGE_KEY_BYTES])p->keys,
                        .n_keys = p->n,
                        .device_indices = slots,
                        .n_indices = (size_t)p->n * CH_PAGE,
                        .first_depth = b,
                        .prior_key = b > 0 ? keys[b - 1] : NULL};
    p->submit_ms = ch_now_ms();
    /* written before the offload can reserve anything: a page another
     * writer's ack counts as stored (IN_FLIGHT) is one of these */
    char *buf = malloc((size_t)p->n * 96);
    size_t len = 0;
    for (uint32_t k = 0; buf && k < p->n; k++) {
        char hex[2 * KVD_PAGE_KEY_BYTES + 1];
        ch_key_hex(p->keys[k], hex);
        len += (size_t)snprintf(buf + len, 96, "%" PRIu64 " %s\n", p->submit_ms, hex);
    }
    if (buf == NULL || write(w->try_fd, buf, len) != (ssize_t)len)
        ch_fail("worker %d: write of tries: %s", w->o->index, strerror(errno));
    free(buf);
    t0 = tnow();
    rc = kvd_offload(w->lk, &t, 1, &p->ack);
    timed(w, t0, "kvd_offload");
    free(slots);
    g_st.offloads++;
    if (rc != 0) {
        g_st.offload_errors++;
        ch_fail("worker %d: kvd_offload: %d (%s)", w->o->index, rc, kvd_strerror(rc));
        dpool_free(&w->pool, p->units, p->n);
        return;
    }
    p->used = true;
}

int ch_worker_main(const ch_worker_opts_t *o)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/w%d.fail", o->dir, o->index);
    g_fail_fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    worker_t *w = calloc(1, sizeof(*w));
    if (w == NULL || g_fail_fd < 0)
        return 1;
    w->o = o;
    w->rng = o->seed;
    w->next_rid = 1;
    snprintf(w->stats_path, sizeof(w->stats_path), "%s/w%d.g%d.stats", o->dir, o->index,
             o->gen);
    snprintf(path, sizeof(path), "%s/w%d.acks", o->dir, o->index);
    w->ack_fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    snprintf(path, sizeof(path), "%s/w%d.tries", o->dir, o->index);
    w->try_fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    struct sigaction sa = {.sa_handler = on_term};
    sigaction(SIGTERM, &sa, NULL);
    struct sigaction sc = {.sa_handler = on_cont, .sa_flags = SA_RESTART};
    sigaction(SIGCONT, &sc, NULL);
    if (w->ack_fd < 0 || w->try_fd < 0 || dpool_init(&w->pool, W_UNITS) != 0) {
        ch_fail("worker %d: setup failed", o->index);
        return 1;
    }
    /* the daemon may be down (killed, restarting) or stopped: retry */
    char name[64];
    snprintf(name, sizeof(name), "chaos-w%d", o->index);
    int rc = KVD_ERR_UNAVAILABLE;
    uint64_t until = ch_now_ms() + W_WAIT_MS;
    while (!g_stop && ch_now_ms() < until &&
           (rc = open_engine(o->socket, name, o->timeout_ms, &w->pool, &w->lk)) != 0) {
        if (!expected_error(w, rc, false, "open"))
            break;
        ch_sleep_ms(100);
    }
    if (rc != 0 && !g_stop)
        ch_fail("worker %d: no linker within %d ms: %d (%s)", o->index, W_WAIT_MS, rc,
                kvd_strerror(rc));
    for (uint64_t i = 0; w->lk != NULL && !g_stop; i++) {
        one_request(w);
        pump_offloads(w);
        if (i % 16 == 0)
            dpool_check_poison(&w->pool);
        if (i % 32 == 0)
            ch_stats_write(w->stats_path, &g_st);
    }
    /* finish: every queued offload comes back (bounded), then close */
    until = ch_now_ms() + W_WAIT_MS;
    while (w->lk != NULL && pending_count(w) > 0 && ch_now_ms() < until) {
        pump_offloads(w);
        ch_sleep_ms(2);
    }
    if (pending_count(w) > 0)
        ch_fail("worker %d: %d offloads never acknowledged within %d ms", o->index,
                pending_count(w), W_WAIT_MS);
    kvd_linker_close(w->lk);
    for (int j = 0; j < W_MAX_PENDING; j++)
        if (w->pend[j].used)
            dpool_free(&w->pool, w->pend[j].units, w->pend[j].n);
    dpool_check_poison(&w->pool);
    if (dpool_free_count(&w->pool) != w->pool.n_units)
        ch_fail("worker %d: %u of %u device units never came back", o->index,
                w->pool.n_units - dpool_free_count(&w->pool), w->pool.n_units);
    ch_stats_write(w->stats_path, &g_st);
    dpool_fini(&w->pool);
    close(w->ack_fd);
    close(w->try_fd);
    free(w);
    return g_st.failures ? 1 : 0;
}

/* ------------------------------------------------------------ the verifier */

#define V_BATCH 128
#define V_RETRY 1 /* verify_batch: the load failed, try again */
#define V_TRIES 3

typedef struct vrec {
    ch_key_t key;
    uint64_t checksum;
    bool required;     /* one record of it no injury excuses */
    bool before_death; /* one record of it acknowledged before the daemon's last kill */
} vrec_t;

typedef struct excuse {
    uint64_t start_ms, end_ms;
} excuse_t;

/* One line of a w<I>.acks or w<I>.tries file. */
typedef struct aline {
    ch_key_t key;
    int worker;
    uint64_t submit_ms, ack_ms; /* ack_ms: acks only */
} aline_t;

static int cmp_aline_key(const void *a, const void *b)
{
    return memcmp(((const aline_t *)a)->key, ((const aline_t *)b)->key,
                  KVD_PAGE_KEY_BYTES);
}

/* By worker, submit time, key: how an offload's ack is found. */
static int cmp_aline_offload(const void *a, const void *b)
{
    const aline_t *x = a, *y = b;
    if (x->worker != y->worker)
        return x->worker < y->worker ? -1 : 1;
    if (x->submit_ms != y->submit_ms)
        return x->submit_ms < y->submit_ms ? -1 : 1;
    return memcmp(x->key, y->key, KVD_PAGE_KEY_BYTES);
}

/* What tells whether a daemon kill excuses the loss of an acked page:
 * every try and every ack (sorted), and the kills. */
typedef struct kill_ctx {
    aline_t *tries; /* by key */
    size_t n_tries;
    aline_t *acks; /* by offload */
    size_t n_acks;
    uint64_t *deaths;
    size_t n_deaths;
} kill_ctx_t;

/* Reads every worker's w<I>.<ext> ("tries": submit key; "acks": submit
 * ack key checksum). */
static aline_t *read_alines(const ch_verify_opts_t *o, const char *ext, size_t *n_out)
{
    aline_t *v = NULL;
    size_t n = 0, cap = 0;
    bool acks = strcmp(ext, "acks") == 0;
    for (int i = 0; i < o->workers; i++) {
        char path[512], hex[128];
        snprintf(path, sizeof(path), "%s/w%d.%s", o->dir, i, ext);
        FILE *f = fopen(path, "r");
        uint64_t submit, ack = 0, sum;
        while (f && (acks ? fscanf(f, "%" SCNu64 " %" SCNu64 " %127s %" SCNx64, &submit,
                                   &ack, hex, &sum) == 4
                          : fscanf(f, "%" SCNu64 " %127s", &submit, hex) == 2)) {
            if (n == cap) {
                cap = cap ? 2 * cap : 4096;
                v = realloc(v, cap * sizeof(*v));
            }
            if (v == NULL || !ch_key_parse(hex, v[n].key))
                continue;
            v[n].worker = i;
            v[n].submit_ms = submit;
            v[n].ack_ms = ack;
            n++;
        }
        if (f)
            fclose(f);
    }
    *n_out = n;
    return v;
}

/*
 * Whether a daemon kill excuses the loss of a page acknowledged at ack_ms.
 * An ack counts a page another writer held (IN_FLIGHT) as stored; the kill
 * ends that writer's reservation, so the page never lands. That writer's
 * offload of the page was submitted before the ack and was not done (no
 * successful ack) when the kill came. A page published before the kill
 * (its writer's ack came first, or the reserve found it stored) has no
 * such offload and must have survived.
 */
static bool kill_excuses(const kill_ctx_t *k, const uint8_t *key, uint64_t ack_ms)
{
    aline_t probe;
    memcpy(probe.key, key, KVD_PAGE_KEY_BYTES);
    aline_t *t = bsearch(&probe, k->tries, k->n_tries, sizeof(*t), cmp_aline_key);
    if (t == NULL)
        return false;
    while (t > k->tries && memcmp(t[-1].key, key, KVD_PAGE_KEY_BYTES) == 0)
        t--;
    for (size_t d = 0; d < k->n_deaths; d++) {
        uint64_t kill_ms = k->deaths[d];
        if (kill_ms <= ack_ms)
            continue;
        for (aline_t *x = t;
             x < k->tries + k->n_tries && memcmp(x->key, key, KVD_PAGE_KEY_BYTES) == 0;
             x++) {
            if (x->submit_ms > ack_ms)
                continue;
            aline_t *a = bsearch(x, k->acks, k->n_acks, sizeof(*a), cmp_aline_offload);
            if (a == NULL || a->ack_ms >= kill_ms)
                return true; /* that offload was still running at the kill */
        }
    }
    return false;
}

static int cmp_key(const void *a, const void *b)
{
    return memcmp(((const vrec_t *)a)->key, ((const vrec_t *)b)->key, KVD_PAGE_KEY_BYTES);
}

/* Whether a writer injury began near the offload [submit, ack]: the ack
 * counts pages another writer was still writing (IN_FLIGHT) as stored, and
 * that writer may have died since. */
static bool excused(const excuse_t *ex, size_t n_ex, uint64_t submit, uint64_t ack,
                    uint64_t window)
{
    for (size_t i = 0; i < n_ex; i++)
        if (ex[i].end_ms + window >= submit && ex[i].start_ms <= ack + window)
            return true;
    return false;
}

/* Reads every worker's ack records submitted since since_ms, one per key. */
static vrec_t *read_records(const ch_verify_opts_t *o, size_t *n_out)
{
    kill_ctx_t kc = {0};
    size_t cap_d = 0;
    FILE *df = o->deaths ? fopen(o->deaths, "r") : NULL;
    uint64_t death;
    while (df && fscanf(df, "%" SCNu64, &death) == 1) {
        if (kc.n_deaths == cap_d) {
            cap_d = cap_d ? 2 * cap_d : 16;
            kc.deaths = realloc(kc.deaths, cap_d * sizeof(*kc.deaths));
        }
        kc.deaths[kc.n_deaths++] = death;
    }
    if (df)
        fclose(df);
    if (kc.n_deaths > 0) {
        kc.tries = read_alines(o, "tries", &kc.n_tries);
        kc.acks = read_alines(o, "acks", &kc.n_acks);
        if (kc.n_tries > 0)
            qsort(kc.tries, kc.n_tries, sizeof(*kc.tries), cmp_aline_key);
        if (kc.n_acks > 0)
            qsort(kc.acks, kc.n_acks, sizeof(*kc.acks), cmp_aline_offload);
    }
    excuse_t *ex = NULL;
    size_t n_ex = 0, cap_ex = 0;
    FILE *f = o->excuse ? fopen(o->excuse, "r") : NULL;
    uint64_t a, b;
    while (f && fscanf(f, "%" SCNu64 " %" SCNu64, &a, &b) == 2) {
        if (n_ex == cap_ex) {
            cap_ex = cap_ex ? 2 * cap_ex : 64;
            ex = realloc(ex, cap_ex * sizeof(*ex));
        }
        ex[n_ex++] = (excuse_t){a, b};
    }
    if (f)
        fclose(f);
    vrec_t *recs = NULL;
    size_t n = 0, cap = 0;
    for (int i = 0; i < o->workers; i++) {
        char path[512], hex[128];
        snprintf(path, sizeof(path), "%s/w%d.acks", o->dir, i);
        f = fopen(path, "r");
        uint64_t submit, ack, sum;
        while (f && fscanf(f, "%" SCNu64 " %" SCNu64 " %127s %" SCNx64, &submit, &ack,
                           hex, &sum) == 4) {
            g_st.records_read++;
            if (submit < o->since_ms) {
                g_st.records_old++;
                continue;
            }
            if (n == cap) {
                cap = cap ? 2 * cap : 1024;
                recs = realloc(recs, cap * sizeof(*recs));
            }
            if (!ch_key_parse(hex, recs[n].key)) {
                ch_fail("verify: %s: a malformed record", path);
                continue;
            }
            recs[n].checksum = sum;
            recs[n].required = !excused(ex, n_ex, submit, ack, o->window_ms) &&
                               !kill_excuses(&kc, recs[n].key, ack);
            recs[n].before_death = o->death_ms != 0 && ack < o->death_ms;
            n++;
        }
        if (f)
            fclose(f);
    }
    free(ex);
    free(kc.tries);
    free(kc.acks);
    free(kc.deaths);
    if (n > 0)
        qsort(recs, n, sizeof(*recs), cmp_key);
    size_t m = 0; /* one per key: required if any record is */
    for (size_t i = 0; i < n; i++) {
        if (m > 0 && memcmp(recs[m - 1].key, recs[i].key, KVD_PAGE_KEY_BYTES) == 0) {
            recs[m - 1].required |= recs[i].required;
            recs[m - 1].before_death |= recs[i].before_death;
            if (recs[m - 1].checksum != recs[i].checksum)
                ch_fail("verify: two records of one key disagree on its checksum");
            continue;
        }
        recs[m++] = recs[i];
    }
    *n_out = m;
    return recs;
}

/* Counts a key the store lacks: excused when an injury near its offload
 * explains it (an IN_FLIGHT page whose writer died), evicted when the
 * daemon dropped objects since (the driver bounds how many), else a
 * failure. */
static void missing(const ch_verify_opts_t *o, const vrec_t *r)
{
    char hex[2 * KVD_PAGE_KEY_BYTES + 1];
    ch_key_hex(r->key, hex);
    if (!r->required) {
        g_st.missing_excused++;
        fprintf(stderr,
                "verify: object %s missing, acknowledged near a writer's injury\n", hex);
    } else if (o->evicted) {
        g_st.missing_evicted++;
        fprintf(stderr, "verify: object %s missing, the daemon dropped objects\n", hex);
    } else {
        g_st.missing_required++;
        ch_fail("verify: acknowledged object %s is missing", hex);
    }
}

/* Loads recs[0..n) (all present) and checks each byte-exact. */
static int verify_batch(kvd_linker_t *lk, dpool_t *p, uint64_t rid, vrec_t **recs,
                        size_t n)
{
    int64_t units[V_BATCH];
    ch_key_t keys[V_BATCH];
    if (!dpool_alloc(p, (uint32_t)n, units))
        return -1;
    for (size_t i = 0; i < n; i++)
        memcpy(keys[i], recs[i]->key, KVD_PAGE_KEY_BYTES);
    int64_t *slots = token_slots(units, (uint32_t)n);
    kvd_transfer_t t = {.pool_id = p->pool_id,
                        .keys = (const uint8_t(*)[KVD_PAGE_KEY_BYTES])keys,
                        .n_keys = n,
                        .device_indices = slots,
                        .n_indices = n * CH_PAGE};
    int rc = kvd_load(lk, rid, &t, 1);
    free(slots);
    if (rc == KVD_ERR_NOT_FOUND) { /* one went missing since the lookup */
        kvd_load_abort(lk, rid);
        return rc;
    }
    if (rc == 0)
        rc = kvd_load_prepare(lk, rid);
    kvd_commit_pool_t cp = {.adopted_begin = 0, .adopted_end = (uint32_t)n};
    if (rc == 0)
        rc = kvd_load_commit(lk, rid, &cp, 1);
    if (rc != 0) {
        ch_fail("verify: load of %zu objects: %d (%s)", n, rc, kvd_strerror(rc));
        kvd_load_abort(lk, rid);
        return rc;
    }
    uint32_t counter;
    rc = kvd_start_layer_wise_loading(lk, &counter);
    for (uint32_t l = 0; rc == 0 && l < CH_LAYERS; l++)
        rc = kvd_wait_layer(lk, counter, l);
    if (rc != 0)
        ch_fail("verify: layer-wise loading: %d (%s)", rc, kvd_strerror(rc));
    int done = -1;
    uint64_t until = ch_now_ms() + W_WAIT_MS;
    while (done == -1 && ch_now_ms() < until) {
        kvd_completion_t c;
        size_t got = 0;
        kvd_pop_completed_loads(lk, &c, 1, &got);
        if (got == 1)
            done = c.id == rid && c.success;
        else
            ch_sleep_ms(1);
    }
    if (done == 0) {
        /* its pins lapsed before the last byte was in place (a slow
         * transport on a busy host, with a short lease TTL): the caller
         * tries again; a failed load says nothing of the bytes */
        fprintf(stderr, "verify: load rid %" PRIu64 " of %zu objects failed\n", rid, n);
        dpool_free(p, units, (uint32_t)n);
        return V_RETRY;
    }
    if (done != 1) {
        ch_fail("verify: load rid %" PRIu64 " never completed", rid);
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        char what[200], hex[2 * KVD_PAGE_KEY_BYTES + 1];
        if (check_unit(p, (uint32_t)units[i], keys[i], what, sizeof(what)) &&
            ch_object_checksum(keys[i]) == recs[i]->checksum) {
            g_st.objects_verified++;
            g_st.objects_survived += recs[i]->before_death;
            continue;
        }
        ch_key_hex(keys[i], hex);
        ch_fail("verify: object %s differs: %s", hex, what);
    }
    dpool_free(p, units, (uint32_t)n);
    return 0;
}

/* Whether the store holds key now (a one-page lookup: on either tier; it
 * promotes nothing). */
static int present(kvd_linker_t *lk, dpool_t *p, uint64_t rid, const uint8_t *key)
{
    ch_key_t k;
    memcpy(k, key, KVD_PAGE_KEY_BYTES);
    kvd_transfer_t t = {.pool_id = p->pool_id,
                        .keys = (const uint8_t(*)[KVD_PAGE_KEY_BYTES])k,
                        .n_keys = 1};
    uint32_t bnd[1];
    size_t nb = 0;
    int rc = kvd_lookup(lk, rid, &t, 1, bnd, &nb);
    if (rc != 0)
        return rc;
    return nb == 1 ? 1 : 0;
}

/* Loads recs[0..n) in batches of o->batch (tried V_TRIES times) and checks
 * each byte-exact. Every one was present at its lookup, before any load:
 * one gone by its load (a load promotes from the SSD tier, and the room it
 * takes may drop another object) is counted in lost_verifying, which the
 * driver bounds by the drops the daemon counted meanwhile; it is tried
 * alone when the load of its batch said NOT_FOUND for another. */
static void load_present(const ch_verify_opts_t *o, kvd_linker_t *lk, dpool_t *p,
                         uint64_t *rid, vrec_t **recs, size_t n, const char *what)
{
    size_t batch = o->batch > 0 && o->batch < V_BATCH ? o->batch : V_BATCH;
    for (size_t i = 0; i < n;) {
        size_t m = n - i < batch ? n - i : batch;
        int vrc = V_RETRY;
        for (int t = 0; vrc == V_RETRY && t < V_TRIES; t++)
            vrc = verify_batch(lk, p, (*rid)++, recs + i, m);
        if (vrc == V_RETRY)
            ch_fail("verify: the load of %zu %s objects failed %d times", m, what,
                    V_TRIES);
        for (size_t j = 0; vrc == KVD_ERR_NOT_FOUND && j < m; j++) {
            char hex[2 * KVD_PAGE_KEY_BYTES + 1];
            if (present(lk, p, (*rid)++, recs[i + j]->key) == 1) {
                int one = V_RETRY;
                for (int t = 0; one == V_RETRY && t < V_TRIES; t++)
                    one = verify_batch(lk, p, (*rid)++, recs + i + j, 1);
                if (one == 0)
                    continue;
                if (one != KVD_ERR_NOT_FOUND) {
                    ch_fail("verify: the load of one %s object: %d", what, one);
                    continue;
                }
            }
            g_st.lost_verifying++;
            ch_key_hex(recs[i + j]->key, hex);
            fprintf(stderr,
                    "verify: %s object %s present at its lookup, gone by its load\n",
                    what, hex);
        }
        i += m;
    }
}

/* Every key of every prompt (CH_PREFIXES x suffixes, all CH_MAX_PAGES
 * pages) that no ack names and the store holds: the store may hold objects
 * whose ack was lost (a worker killed after the publish), never other
 * bytes. Returns them (*n_out of them, the caller loads them). */
static vrec_t *unacked_present(const ch_verify_opts_t *o, kvd_linker_t *lk, dpool_t *p,
                               uint64_t *rid, const vrec_t *acked, size_t n_acked,
                               size_t *n_out)
{
    size_t cap = (size_t)CH_PREFIXES * o->all_keys_suffixes * CH_MAX_PAGES, n = 0;
    vrec_t *all = calloc(cap ? cap : 1, sizeof(*all));
    static uint32_t tokens[CH_MAX_PAGES * CH_PAGE];
    ch_key_t keys[CH_MAX_PAGES];
    for (uint32_t pre = 0; all && pre < CH_PREFIXES; pre++) {
        for (uint32_t suf = 0; suf < o->all_keys_suffixes; suf++) {
            ch_prompt_tokens(pre, suf, tokens);
            size_t nk = 0;
            if (kvd_page_keys(tokens, sizeof(tokens) / sizeof(tokens[0]), CH_PAGE, NULL,
                              keys, &nk) != 0)
                continue;
            for (size_t k = 0; k < nk && n < cap; k++) {
                memcpy(all[n].key, keys[k], KVD_PAGE_KEY_BYTES);
                all[n++].checksum = ch_object_checksum(keys[k]);
            }
        }
    }
    if (n > 0)
        qsort(all, n, sizeof(*all), cmp_key);
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        bool dup = m > 0 && memcmp(all[m - 1].key, all[i].key, KVD_PAGE_KEY_BYTES) == 0;
        bool is_acked = n_acked > 0 &&
                        bsearch(&all[i], acked, n_acked, sizeof(*acked), cmp_key) != NULL;
        if (!dup && !is_acked && present(lk, p, (*rid)++, all[i].key) == 1)
            all[m++] = all[i];
    }
    *n_out = m;
    return all;
}

/* Pointers to recs[0..n) that are flagged in here. */
static vrec_t **pick(vrec_t *recs, size_t n, const bool *here, size_t *n_out)
{
    vrec_t **v = calloc(n ? n : 1, sizeof(*v));
    size_t m = 0;
    for (size_t i = 0; v && i < n; i++)
        if (here == NULL || here[i])
            v[m++] = &recs[i];
    *n_out = m;
    return v;
}

int ch_verify_main(const ch_verify_opts_t *o)
{
    size_t n = 0;
    vrec_t *recs = read_records(o, &n);
    dpool_t *p = calloc(1, sizeof(*p));
    kvd_linker_t *lk = NULL;
    int rc = p && dpool_init(p, V_BATCH) == 0
                 ? open_engine(o->socket, "chaos-verify", 10000, p, &lk)
                 : KVD_ERR_NOMEM;
    if (rc != 0) {
        ch_fail("verify: no linker: %d (%s)", rc, kvd_strerror(rc));
        n = 0;
    }
    uint64_t rid = 1;
    /* first every presence, by lookups only: what is missing is judged on
     * the store as the restart (or the round) left it, before a load moves
     * anything between the tiers */
    bool *here = calloc(n ? n : 1, sizeof(*here));
    for (size_t i = 0; here && i < n; i++) {
        int pr = present(lk, p, rid++, recs[i].key);
        if (pr < 0)
            ch_fail("verify: lookup: %d (%s)", pr, kvd_strerror(pr));
        else if (pr == 0)
            missing(o, &recs[i]);
        here[i] = pr == 1;
    }
    size_t n_un = 0, n_here = 0, n_un_here = 0;
    vrec_t *un = rc == 0 && o->all_keys_suffixes > 0
                     ? unacked_present(o, lk, p, &rid, recs, n, &n_un)
                     : NULL;
    vrec_t **acked_here = pick(recs, n, here, &n_here);
    vrec_t **un_here = pick(un, n_un, NULL, &n_un_here);
    if (acked_here)
        load_present(o, lk, p, &rid, acked_here, n_here, "acknowledged");
    /* load_present counts them as verified; they are counted apart */
    uint64_t before = g_st.objects_verified;
    if (un_here)
        load_present(o, lk, p, &rid, un_here, n_un_here, "unacknowledged");
    g_st.unacked_verified += g_st.objects_verified - before;
    g_st.objects_verified = before;
    free(acked_here);
    free(un_here);
    free(un);
    free(here);
    kvd_linker_close(lk);
    if (p != NULL && dpool_free_count(p) != p->n_units)
        ch_fail("verify: %u device units never came back",
                p->n_units - dpool_free_count(p));
    if (p != NULL)
        dpool_fini(p);
    free(p);
    free(recs);
    ch_stats_write(o->out, &g_st);
    return g_st.failures ? 1 : 0;
}
