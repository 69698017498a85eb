/*
 * fakegpu_core.c: a GPU on host memory, strict enough to catch the mistakes
 * a real GPU punishes only sometimes. The fake CUDA driver and HIP runtime
 * (fake_cuda.c, fake_hip.c) are thin front ends over it.
 *
 * Device memory is a memfd mapped twice: the address handed out is a
 * PROT_NONE view, so a caller that touches device memory from the CPU gets
 * SIGSEGV; the streams' threads copy through the read-write alias. A freed
 * allocation's addresses stay reserved (PROT_NONE), so a stale pointer
 * still faults and is never mistaken for host memory.
 *
 * Each stream is a worker thread running its queue in order: copies, event
 * records, waits for events recorded elsewhere, host functions. Copies run
 * only on those threads, never in the caller's call (even from pageable
 * memory, where a real driver may stage synchronously), and
 * FAKEGPU_COPY_DELAY_US makes each wait first, so a caller that takes a
 * copy for done before it synchronized reads stale bytes.
 *
 * Errors: a copy that leaves its allocation, or whose host side is device
 * memory, is refused (FG_ERR_INVALID_VALUE) and the stream keeps that error:
 * every later call on it and every event recorded on it after returns it
 * (sticky, as a real context is after a fault). A copy that fails while it
 * runs (FAKEGPU_FAIL_COPY, a write into read-only registered memory) makes
 * the stream sticky with FG_ERR_ILLEGAL_ADDRESS; a stream that waits for an
 * event of a failed stream takes the error over. The stream's later copies
 * do not run.
 *
 * Knobs, read from the environment on first use; a test changes them at
 * run time with fakegpu_set (fakegpu.h), never with setenv, which races
 * with the library's threads reading the environment:
 *   FAKEGPU_NO_DEVICE=1         no device: init fails (FG_ERR_NO_DEVICE)
 *   FAKEGPU_DEVICES=N           N devices (1 to FG_MAX_DEVICES; 1 default)
 *     (these two count only until the first init)
 *   FAKEGPU_COPY_DELAY_US=N     each async copy sleeps N us before it runs
 *   FAKEGPU_FAIL_COPY=N         the Nth async copy of the process fails
 *   FAKEGPU_REGISTER_FAIL=1     host registration fails (out of memory)
 *   FAKEGPU_REGISTER_MAX=N      a registration of more than N bytes fails
 *                               (default 512 GiB - 1: NVIDIA drivers from
 *                               r580 refuse one of 512 GiB or more)
 *   FAKEGPU_REGISTER_DELAY_US=N each registration takes N us
 *
 * Threading: one mutex (fg.lock) guards everything; every state change
 * that someone may wait for broadcasts fg.progress.
 */
#include "fakegpu_core.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define FG_MAX_DEVICES 16

typedef struct fg_alloc {
    struct fg_alloc *next;
    uintptr_t dev;     /* the PROT_NONE address the caller sees */
    char *rw;          /* the read-write alias the streams copy through */
    size_t size_bytes; /* what was asked for: the valid range */
    size_t mapped;     /* size_bytes rounded up to pages */
    int device;
    unsigned pending; /* queued copies that touch this allocation */
} fg_alloc_t;

/* The addresses of a freed allocation, kept reserved and faulting. */
typedef struct fg_freed {
    struct fg_freed *next;
    uintptr_t dev;
    size_t mapped;
} fg_freed_t;

typedef enum fg_host_kind { FG_HOST_REGISTERED, FG_HOST_ALLOCATED } fg_host_kind_t;

typedef struct fg_host {
    struct fg_host *next;
    uintptr_t base;
    size_t size_bytes;
    fg_host_kind_t kind;
    bool read_only;
} fg_host_t;

typedef enum fg_op_kind { OP_COPY, OP_RECORD, OP_WAIT, OP_HOST_FN, OP_STOP } fg_op_kind_t;

typedef struct fg_op {
    struct fg_op *next;
    fg_op_kind_t kind;
    /* OP_COPY */
    char *dst;       /* host pointer or read-write alias */
    const char *src; /* host pointer, read-write alias or snapshot */
    size_t size_bytes;
    fg_dir_t dir;
    fg_alloc_t *allocs[2]; /* the allocations it holds (pending), or NULL */
    char *snapshot;        /* the source, copied during the call; freed after */
    fg_err_t fail;         /* fail this way when it runs, instead of copying */
    unsigned delay_us;
    bool counted; /* an async copy (its bytes go to the stats) */
    /* OP_RECORD, OP_WAIT */
    fg_event_t *event;
    uint64_t gen;
    /* OP_HOST_FN */
    void (*fn)(void *arg, fg_err_t status);
    void *arg;
} fg_op_t;

struct fg_stream {
    struct fg_stream *next; /* the live list */
    pthread_t thread;
    pthread_cond_t work;
    fg_op_t *head, *tail;
    uint64_t enqueued, done; /* ops; sync waits for done to reach enqueued */
    fg_err_t error;          /* sticky */
    int device;
    bool legacy;
};

struct fg_event {
    struct fg_event *next; /* the live list */
    uint64_t recorded;     /* records enqueued */
    uint64_t completed;    /* the highest record that has run */
    fg_err_t error;        /* of the record that completed last */
    unsigned refs;         /* queued ops that name it */
    bool destroyed;
};

static struct {
    pthread_mutex_t lock;
    pthread_cond_t progress;
    bool initialized;
    fg_err_t init_result;
    int devices;
    fg_alloc_t *allocs;
    fg_freed_t *freed;
    fg_host_t *hosts;
    fg_stream_t *streams;
    fg_event_t *events;
    fg_stream_t *legacy;
    uint64_t copy_seq; /* async copies so far, for FAKEGPU_FAIL_COPY */
    fakegpu_stats_t stats;
} fg = {
    .lock = PTHREAD_MUTEX_INITIALIZER,
    .progress = PTHREAD_COND_INITIALIZER,
};

/* The value of environment variable name as a number, def when unset or not
 * a number. */
static unsigned long long env_u64(const char *name, unsigned long long def)
{
    const char *v = getenv(name);
    if (v == NULL || *v == '\0')
        return def;
    char *end;
    errno = 0;
    unsigned long long n = strtoull(v, &end, 0);
    if (errno != 0 || *end != '\0') {
        fprintf(stderr, "fakegpu: %s=%s is not a number; ignored\n", name, v);
        return def;
    }
    return n;
}

static struct {
    const char *name;
    unsigned long long def;
    _Atomic unsigned long long value;
} knobs[FG_KNOB_COUNT] = {
    [FG_KNOB_NO_DEVICE] = {.name = "FAKEGPU_NO_DEVICE", .def = 0},
    [FG_KNOB_DEVICES] = {.name = "FAKEGPU_DEVICES", .def = 1},
    [FG_KNOB_COPY_DELAY_US] = {.name = "FAKEGPU_COPY_DELAY_US", .def = 0},
    [FG_KNOB_FAIL_COPY] = {.name = "FAKEGPU_FAIL_COPY", .def = 0},
    [FG_KNOB_REGISTER_FAIL] = {.name = "FAKEGPU_REGISTER_FAIL", .def = 0},
    [FG_KNOB_REGISTER_MAX] = {.name = "FAKEGPU_REGISTER_MAX", .def = (512ULL << 30) - 1},
    [FG_KNOB_REGISTER_DELAY_US] = {.name = "FAKEGPU_REGISTER_DELAY_US", .def = 0},
};
static pthread_once_t knobs_once = PTHREAD_ONCE_INIT;

static void knobs_read(void)
{
    for (int i = 0; i < FG_KNOB_COUNT; i++)
        knobs[i].value = env_u64(knobs[i].name, knobs[i].def);
}

/* The knob's value now. */
static unsigned long long knob(fg_knob_t k)
{
    pthread_once(&knobs_once, knobs_read);
    return knobs[k].value;
}

int fg_knob_set(const char *name, unsigned long long value)
{
    pthread_once(&knobs_once, knobs_read);
    for (int i = 0; i < FG_KNOB_COUNT; i++) {
        if (strcmp(knobs[i].name, name) == 0) {
            knobs[i].value = value;
            return 0;
        }
    }
    return -1;
}

fg_err_t fg_init(void)
{
    pthread_mutex_lock(&fg.lock);
    if (!fg.initialized) {
        fg.initialized = true;
        if (knob(FG_KNOB_NO_DEVICE) != 0) {
            fg.init_result = FG_ERR_NO_DEVICE;
        } else {
            unsigned long long n = knob(FG_KNOB_DEVICES);
            fg.devices = n < 1 ? 1 : n > FG_MAX_DEVICES ? FG_MAX_DEVICES : (int)n;
            fg.init_result = FG_OK;
        }
    }
    fg_err_t r = fg.init_result;
    pthread_mutex_unlock(&fg.lock);
    return r;
}

bool fg_initialized(void)
{
    pthread_mutex_lock(&fg.lock);
    bool r = fg.initialized && fg.init_result == FG_OK;
    pthread_mutex_unlock(&fg.lock);
    return r;
}

int fg_device_count(void)
{
    pthread_mutex_lock(&fg.lock);
    int n = fg.devices;
    pthread_mutex_unlock(&fg.lock);
    return n;
}

void fg_count_error(void)
{
    pthread_mutex_lock(&fg.lock);
    fg.stats.errors++;
    pthread_mutex_unlock(&fg.lock);
}

/* ---- memory ---- */

/* The allocation that holds address p, or NULL. Caller holds fg.lock. */
static fg_alloc_t *alloc_find(uintptr_t p)
{
    for (fg_alloc_t *a = fg.allocs; a != NULL; a = a->next)
        if (p >= a->dev && p - a->dev < a->size_bytes)
            return a;
    return NULL;
}

/* Whether [p, p + n) overlaps any device allocation's mapping, live or
 * freed. Caller holds fg.lock. */
static bool overlaps_device(uintptr_t p, size_t n)
{
    for (fg_alloc_t *a = fg.allocs; a != NULL; a = a->next)
        if (p < a->dev + a->mapped && a->dev < p + n)
            return true;
    for (fg_freed_t *f = fg.freed; f != NULL; f = f->next)
        if (p < f->dev + f->mapped && f->dev < p + n)
            return true;
    return false;
}

/* The registered or host-allocated range that holds all of [p, p + n), or
 * NULL. Caller holds fg.lock. */
static fg_host_t *host_find(uintptr_t p, size_t n)
{
    for (fg_host_t *h = fg.hosts; h != NULL; h = h->next)
        if (p >= h->base && p - h->base < h->size_bytes &&
            n <= h->base + h->size_bytes - p)
            return h;
    return NULL;
}

static size_t page_round(size_t n)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    return (n + page - 1) / page * page;
}

fg_err_t fg_mem_alloc(int device, size_t size_bytes, void **out)
{
    if (size_bytes == 0 || out == NULL)
        return FG_ERR_INVALID_VALUE;
    size_t mapped = page_round(size_bytes);
    fg_alloc_t *a = calloc(1, sizeof(*a));
    int fd = memfd_create("fakegpu-device", MFD_CLOEXEC);
    if (a == NULL || fd < 0 || ftruncate(fd, (off_t)mapped) != 0) {
        if (fd >= 0)
            close(fd);
        free(a);
        return FG_ERR_OUT_OF_MEMORY;
    }
    void *view = mmap(NULL, mapped, PROT_NONE, MAP_SHARED, fd, 0);
    void *rw = mmap(NULL, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (view == MAP_FAILED || rw == MAP_FAILED) {
        if (view != MAP_FAILED)
            munmap(view, mapped);
        if (rw != MAP_FAILED)
            munmap(rw, mapped);
        free(a);
        return FG_ERR_OUT_OF_MEMORY;
    }
    a->dev = (uintptr_t)view;
    a->rw = rw;
    a->size_bytes = size_bytes;
    a->mapped = mapped;
    a->device = device;
    pthread_mutex_lock(&fg.lock);
    a->next = fg.allocs;
    fg.allocs = a;
    fg.stats.device_alloc_bytes += size_bytes;
    pthread_mutex_unlock(&fg.lock);
    *out = view;
    return FG_OK;
}

fg_err_t fg_mem_free(void *dev)
{
    fg_freed_t *f = calloc(1, sizeof(*f));
    if (f == NULL)
        return FG_ERR_OUT_OF_MEMORY;
    pthread_mutex_lock(&fg.lock);
    fg_alloc_t **pp = &fg.allocs;
    while (*pp != NULL && (*pp)->dev != (uintptr_t)dev)
        pp = &(*pp)->next;
    fg_alloc_t *a = *pp;
    if (a == NULL) {
        pthread_mutex_unlock(&fg.lock);
        free(f);
        return FG_ERR_INVALID_VALUE;
    }
    /* a real free waits for the device's work on it; so do we */
    while (a->pending > 0)
        pthread_cond_wait(&fg.progress, &fg.lock);
    *pp = a->next;
    fg.stats.device_alloc_bytes -= a->size_bytes;
    /* keep the addresses reserved and faulting: a stale pointer must never
     * land in memory that a later mmap or malloc hands out, and a copy that
     * names one is refused */
    if (mmap(dev, a->mapped, PROT_NONE,
             MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1,
             0) != MAP_FAILED) {
        f->dev = a->dev;
        f->mapped = a->mapped;
        f->next = fg.freed;
        fg.freed = f;
        f = NULL;
    } else {
        munmap(dev, a->mapped);
    }
    pthread_mutex_unlock(&fg.lock);
    free(f);
    munmap(a->rw, a->mapped);
    free(a);
    return FG_OK;
}

fg_err_t fg_host_alloc(size_t size_bytes, void **out)
{
    if (size_bytes == 0 || out == NULL)
        return FG_ERR_INVALID_VALUE;
    fg_host_t *h = calloc(1, sizeof(*h));
    void *p = mmap(NULL, size_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                   -1, 0);
    if (h == NULL || p == MAP_FAILED) {
        if (p != MAP_FAILED)
            munmap(p, size_bytes);
        free(h);
        return FG_ERR_OUT_OF_MEMORY;
    }
    h->base = (uintptr_t)p;
    h->size_bytes = size_bytes;
    h->kind = FG_HOST_ALLOCATED;
    pthread_mutex_lock(&fg.lock);
    h->next = fg.hosts;
    fg.hosts = h;
    fg.stats.host_alloc_bytes += size_bytes;
    pthread_mutex_unlock(&fg.lock);
    *out = p;
    return FG_OK;
}

/* Unlinks and returns the host range of kind starting at p, or NULL.
 * Caller holds fg.lock. */
static fg_host_t *host_unlink(uintptr_t p, fg_host_kind_t kind)
{
    for (fg_host_t **pp = &fg.hosts; *pp != NULL; pp = &(*pp)->next) {
        fg_host_t *h = *pp;
        if (h->base == p && h->kind == kind) {
            *pp = h->next;
            return h;
        }
    }
    return NULL;
}

fg_err_t fg_host_free(void *host)
{
    pthread_mutex_lock(&fg.lock);
    fg_host_t *h = host_unlink((uintptr_t)host, FG_HOST_ALLOCATED);
    if (h != NULL)
        fg.stats.host_alloc_bytes -= h->size_bytes;
    pthread_mutex_unlock(&fg.lock);
    if (h == NULL)
        return FG_ERR_INVALID_VALUE;
    munmap(host, h->size_bytes);
    free(h);
    return FG_OK;
}

/* Whether all of [p, p + n) is mapped (mincore fails with ENOMEM on a hole). */
static bool range_mapped(uintptr_t p, size_t n)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    uintptr_t start = p / page * page, end = p + n;
    unsigned char vec[4096];
    while (start < end) {
        size_t len = end - start;
        if (len > sizeof(vec) * page)
            len = sizeof(vec) * page;
        if (mincore((void *)start, len, vec) != 0 && errno == ENOMEM)
            return false;
        start += len;
    }
    return true;
}

fg_err_t fg_host_register(void *host, size_t size_bytes, bool read_only)
{
    uintptr_t p = (uintptr_t)host;
    if (host == NULL || size_bytes == 0 || p + size_bytes < p)
        return FG_ERR_INVALID_VALUE;
    unsigned long long delay_us = knob(FG_KNOB_REGISTER_DELAY_US);
    if (delay_us > 0)
        usleep((useconds_t)delay_us);
    if (knob(FG_KNOB_REGISTER_FAIL) != 0 || size_bytes > knob(FG_KNOB_REGISTER_MAX))
        return FG_ERR_OUT_OF_MEMORY;
    if (!range_mapped(p, size_bytes))
        return FG_ERR_INVALID_VALUE;
    fg_host_t *h = calloc(1, sizeof(*h));
    if (h == NULL)
        return FG_ERR_OUT_OF_MEMORY;
    h->base = p;
    h->size_bytes = size_bytes;
    h->kind = FG_HOST_REGISTERED;
    h->read_only = read_only;
    pthread_mutex_lock(&fg.lock);
    fg_err_t r = FG_OK;
    if (overlaps_device(p, size_bytes)) {
        r = FG_ERR_INVALID_VALUE;
    } else {
        for (fg_host_t *o = fg.hosts; o != NULL; o = o->next)
            if (p < o->base + o->size_bytes && o->base < p + size_bytes)
                r = FG_ERR_ALREADY_REGISTERED;
    }
    if (r == FG_OK) {
        h->next = fg.hosts;
        fg.hosts = h;
        fg.stats.registered_bytes += size_bytes;
        fg.stats.host_registrations++;
    }
    pthread_mutex_unlock(&fg.lock);
    if (r != FG_OK)
        free(h);
    return r;
}

fg_err_t fg_host_unregister(void *host)
{
    pthread_mutex_lock(&fg.lock);
    fg_host_t *h = host_unlink((uintptr_t)host, FG_HOST_REGISTERED);
    if (h != NULL)
        fg.stats.registered_bytes -= h->size_bytes;
    pthread_mutex_unlock(&fg.lock);
    if (h == NULL)
        return FG_ERR_NOT_REGISTERED;
    free(h);
    return FG_OK;
}

void fg_pointer_info(const void *p, fg_ptr_info_t *out)
{
    memset(out, 0, sizeof(*out));
    pthread_mutex_lock(&fg.lock);
    fg_alloc_t *a = alloc_find((uintptr_t)p);
    fg_host_t *h = a == NULL ? host_find((uintptr_t)p, 1) : NULL;
    if (a != NULL) {
        out->kind = FG_PTR_DEVICE;
        out->device = a->device;
        out->base = a->dev;
        out->size = a->size_bytes;
    } else if (h != NULL) {
        out->kind = FG_PTR_HOST_PINNED;
        out->base = h->base;
        out->size = h->size_bytes;
    }
    pthread_mutex_unlock(&fg.lock);
}

/* ---- streams ---- */

static void event_unref(fg_event_t *e)
{
    if (--e->refs == 0 && e->destroyed)
        free(e);
}

/* Runs op on stream s. Called and returns with fg.lock held; drops it while
 * it sleeps, copies or calls out. */
static void op_run(fg_stream_t *s, fg_op_t *op)
{
    switch (op->kind) {
    case OP_COPY:
        if (s->error == FG_OK && op->fail != FG_OK)
            s->error = op->fail;
        if (s->error == FG_OK) {
            pthread_mutex_unlock(&fg.lock);
            if (op->delay_us > 0)
                usleep(op->delay_us);
            memcpy(op->dst, op->src, op->size_bytes);
            pthread_mutex_lock(&fg.lock);
            if (op->counted && op->dir == FG_DIR_H2D)
                fg.stats.bytes_h2d += op->size_bytes;
            if (op->counted && op->dir == FG_DIR_D2H)
                fg.stats.bytes_d2h += op->size_bytes;
        }
        for (int i = 0; i < 2; i++)
            if (op->allocs[i] != NULL)
                op->allocs[i]->pending--;
        free(op->snapshot);
        break;
    case OP_RECORD:
        if (op->gen > op->event->completed) {
            op->event->completed = op->gen;
            op->event->error = s->error;
        }
        event_unref(op->event);
        break;
    case OP_WAIT:
        while (op->event->completed < op->gen)
            pthread_cond_wait(&fg.progress, &fg.lock);
        if (s->error == FG_OK)
            s->error = op->event->error;
        event_unref(op->event);
        break;
    case OP_HOST_FN: {
        fg_err_t status = s->error;
        pthread_mutex_unlock(&fg.lock);
        op->fn(op->arg, status);
        pthread_mutex_lock(&fg.lock);
        break;
    }
    case OP_STOP: break;
    }
}

static void *stream_main(void *arg)
{
    fg_stream_t *s = arg;
    pthread_mutex_lock(&fg.lock);
    for (;;) {
        while (s->head == NULL)
            pthread_cond_wait(&s->work, &fg.lock);
        fg_op_t *op = s->head;
        s->head = op->next;
        if (s->head == NULL)
            s->tail = NULL;
        bool stop = op->kind == OP_STOP;
        op_run(s, op);
        free(op);
        s->done++;
        pthread_cond_broadcast(&fg.progress);
        if (stop)
            break;
    }
    pthread_mutex_unlock(&fg.lock);
    return NULL;
}

/* Appends op to s's queue. Caller holds fg.lock. */
static void stream_push(fg_stream_t *s, fg_op_t *op)
{
    op->next = NULL;
    if (s->tail != NULL)
        s->tail->next = op;
    else
        s->head = op;
    s->tail = op;
    s->enqueued++;
    pthread_cond_signal(&s->work);
}

static fg_err_t stream_start(fg_stream_t *s)
{
    pthread_cond_init(&s->work, NULL);
    if (pthread_create(&s->thread, NULL, stream_main, s) != 0) {
        pthread_cond_destroy(&s->work);
        return FG_ERR_OUT_OF_MEMORY;
    }
    return FG_OK;
}

fg_stream_t *fg_stream_legacy(void)
{
    pthread_mutex_lock(&fg.lock);
    if (fg.legacy == NULL) {
        fg_stream_t *s = calloc(1, sizeof(*s));
        if (s != NULL && stream_start(s) == FG_OK) {
            s->legacy = true;
            fg.legacy = s;
        } else {
            free(s);
        }
    }
    fg_stream_t *s = fg.legacy;
    pthread_mutex_unlock(&fg.lock);
    return s;
}

fg_err_t fg_stream_create(int device, fg_stream_t **out)
{
    fg_stream_t *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return FG_ERR_OUT_OF_MEMORY;
    s->device = device;
    if (stream_start(s) != FG_OK) {
        free(s);
        return FG_ERR_OUT_OF_MEMORY;
    }
    pthread_mutex_lock(&fg.lock);
    s->next = fg.streams;
    fg.streams = s;
    fg.stats.streams++;
    pthread_mutex_unlock(&fg.lock);
    *out = s;
    return FG_OK;
}

/* Whether s is a live stream. Caller holds fg.lock. */
static bool stream_live(fg_stream_t *s)
{
    if (s != NULL && s == fg.legacy)
        return true;
    for (fg_stream_t *o = fg.streams; o != NULL; o = o->next)
        if (o == s)
            return true;
    return false;
}

fg_err_t fg_stream_check(fg_stream_t *s)
{
    pthread_mutex_lock(&fg.lock);
    bool live = stream_live(s);
    pthread_mutex_unlock(&fg.lock);
    return live ? FG_OK : FG_ERR_INVALID_HANDLE;
}

fg_err_t fg_stream_destroy(fg_stream_t *s)
{
    fg_op_t *stop = calloc(1, sizeof(*stop));
    if (stop == NULL)
        return FG_ERR_OUT_OF_MEMORY;
    stop->kind = OP_STOP;
    pthread_mutex_lock(&fg.lock);
    fg_stream_t **pp = &fg.streams;
    while (*pp != NULL && *pp != s)
        pp = &(*pp)->next;
    if (*pp == NULL) {
        pthread_mutex_unlock(&fg.lock);
        free(stop);
        return FG_ERR_INVALID_HANDLE;
    }
    *pp = s->next;
    fg.stats.streams--;
    /* as on a real device, the work already queued still runs */
    stream_push(s, stop);
    pthread_mutex_unlock(&fg.lock);
    pthread_join(s->thread, NULL);
    pthread_cond_destroy(&s->work);
    free(s);
    return FG_OK;
}

fg_err_t fg_stream_sync(fg_stream_t *s)
{
    pthread_mutex_lock(&fg.lock);
    if (!stream_live(s)) {
        pthread_mutex_unlock(&fg.lock);
        return FG_ERR_INVALID_HANDLE;
    }
    uint64_t target = s->enqueued;
    while (s->done < target)
        pthread_cond_wait(&fg.progress, &fg.lock);
    fg_err_t r = s->error;
    pthread_mutex_unlock(&fg.lock);
    return r;
}

/* Whether e is a live event. Caller holds fg.lock. */
static bool event_live(fg_event_t *e)
{
    for (fg_event_t *o = fg.events; o != NULL; o = o->next)
        if (o == e)
            return true;
    return false;
}

/* Queues an op of kind on s naming event e (record or wait). */
static fg_err_t stream_event_op(fg_stream_t *s, fg_event_t *e, fg_op_kind_t kind)
{
    fg_op_t *op = calloc(1, sizeof(*op));
    if (op == NULL)
        return FG_ERR_OUT_OF_MEMORY;
    op->kind = kind;
    op->event = e;
    pthread_mutex_lock(&fg.lock);
    fg_err_t r = FG_OK;
    if (!stream_live(s) || !event_live(e))
        r = FG_ERR_INVALID_HANDLE;
    else if (s->error != FG_OK)
        r = s->error;
    if (r == FG_OK && kind == OP_RECORD) {
        fg.stats.event_records++;
        op->gen = ++e->recorded;
    } else if (r == FG_OK) {
        fg.stats.stream_waits++;
        op->gen = e->recorded; /* the record last enqueued; none: no wait */
    }
    if (r == FG_OK) {
        e->refs++;
        stream_push(s, op);
        op = NULL;
    }
    pthread_mutex_unlock(&fg.lock);
    free(op);
    return r;
}

fg_err_t fg_stream_wait_event(fg_stream_t *s, fg_event_t *e)
{
    return stream_event_op(s, e, OP_WAIT);
}

fg_err_t fg_stream_host_fn(fg_stream_t *s, void (*fn)(void *arg, fg_err_t status),
                           void *arg)
{
    if (fn == NULL)
        return FG_ERR_INVALID_VALUE;
    fg_op_t *op = calloc(1, sizeof(*op));
    if (op == NULL)
        return FG_ERR_OUT_OF_MEMORY;
    op->kind = OP_HOST_FN;
    op->fn = fn;
    op->arg = arg;
    pthread_mutex_lock(&fg.lock);
    bool live = stream_live(s);
    if (live)
        stream_push(s, op);
    pthread_mutex_unlock(&fg.lock);
    if (!live) {
        free(op);
        return FG_ERR_INVALID_HANDLE;
    }
    return FG_OK;
}

/* ---- events ---- */

fg_err_t fg_event_create(fg_event_t **out)
{
    fg_event_t *e = calloc(1, sizeof(*e));
    if (e == NULL)
        return FG_ERR_OUT_OF_MEMORY;
    e->refs = 1; /* the caller's */
    pthread_mutex_lock(&fg.lock);
    e->next = fg.events;
    fg.events = e;
    fg.stats.events++;
    pthread_mutex_unlock(&fg.lock);
    *out = e;
    return FG_OK;
}

fg_err_t fg_event_destroy(fg_event_t *e)
{
    pthread_mutex_lock(&fg.lock);
    fg_event_t **pp = &fg.events;
    while (*pp != NULL && *pp != e)
        pp = &(*pp)->next;
    if (*pp == NULL) {
        pthread_mutex_unlock(&fg.lock);
        return FG_ERR_INVALID_HANDLE;
    }
    *pp = e->next;
    fg.stats.events--;
    /* records and waits still queued keep it until they have run */
    e->destroyed = true;
    event_unref(e);
    pthread_mutex_unlock(&fg.lock);
    return FG_OK;
}

fg_err_t fg_event_record(fg_event_t *e, fg_stream_t *s)
{
    return stream_event_op(s, e, OP_RECORD);
}

fg_err_t fg_event_query(fg_event_t *e)
{
    pthread_mutex_lock(&fg.lock);
    fg_err_t r;
    if (!event_live(e))
        r = FG_ERR_INVALID_HANDLE;
    else if (e->completed < e->recorded)
        r = FG_ERR_NOT_READY;
    else
        r = e->error;
    pthread_mutex_unlock(&fg.lock);
    return r;
}

fg_err_t fg_event_sync(fg_event_t *e)
{
    pthread_mutex_lock(&fg.lock);
    if (!event_live(e)) {
        pthread_mutex_unlock(&fg.lock);
        return FG_ERR_INVALID_HANDLE;
    }
    uint64_t target = e->recorded;
    e->refs++; /* a destroy meanwhile must not free it under us */
    while (e->completed < target)
        pthread_cond_wait(&fg.progress, &fg.lock);
    fg_err_t r = e->error;
    event_unref(e);
    pthread_mutex_unlock(&fg.lock);
    return r;
}

/* ---- copies ---- */

/* Checks copy c against the memory the fake knows and fills op: the
 * direction, the read-write aliases, the allocations it holds, and whether
 * it fails when it runs. Caller holds fg.lock. */
static fg_err_t copy_prepare(const fg_copy_t *c, fg_dir_t want, fg_op_t *op)
{
    uintptr_t dst = (uintptr_t)c->dst, src = (uintptr_t)c->src;
    size_t n = c->size_bytes;
    if (c->dst == NULL || c->src == NULL || dst + n < dst || src + n < src)
        return FG_ERR_INVALID_VALUE;
    fg_alloc_t *da = alloc_find(dst), *sa = alloc_find(src);
    bool dst_dev = da != NULL || overlaps_device(dst, n);
    bool src_dev = sa != NULL || overlaps_device(src, n);
    fg_dir_t dir = dst_dev && src_dev ? FG_DIR_D2D
                   : dst_dev          ? FG_DIR_H2D
                   : src_dev          ? FG_DIR_D2H
                                      : FG_DIR_ANY; /* host to host: not a device copy */
    if (dir == FG_DIR_ANY || (want != FG_DIR_ANY && dir != want))
        return FG_ERR_INVALID_VALUE;
    /* the device side must lie inside one allocation */
    if (dst_dev && (da == NULL || n > da->dev + da->size_bytes - dst))
        return FG_ERR_INVALID_VALUE;
    if (src_dev && (sa == NULL || n > sa->dev + sa->size_bytes - src))
        return FG_ERR_INVALID_VALUE;
    op->kind = OP_COPY;
    op->dir = dir;
    op->size_bytes = n;
    op->dst = dst_dev ? da->rw + (dst - da->dev) : c->dst;
    op->src = src_dev ? sa->rw + (src - sa->dev) : c->src;
    op->allocs[0] = da;
    op->allocs[1] = sa;
    if (dir == FG_DIR_D2H) {
        fg_host_t *h = host_find(dst, n);
        if (h != NULL && h->read_only)
            op->fail = FG_ERR_ILLEGAL_ADDRESS; /* the device may not write there */
    }
    return FG_OK;
}

/* Counts an async copy of direction dir whose host side is [p, p + n).
 * Caller holds fg.lock. */
static void copy_count(fg_dir_t dir, uintptr_t host, size_t n)
{
    fg.stats.async_copies++;
    if (dir == FG_DIR_D2D)
        fg.stats.async_copies_d2d++;
    else if (host_find(host, n) != NULL)
        fg.stats.async_copies_pinned++;
    else
        fg.stats.async_copies_pageable++;
}

fg_err_t fg_copy_async(fg_stream_t *s, const fg_copy_t *copies, size_t count,
                       fg_dir_t dir, bool batch)
{
    if (count == 0 || copies == NULL)
        return FG_ERR_INVALID_VALUE;
    fg_op_t **ops = calloc(count, sizeof(*ops));
    if (ops == NULL)
        return FG_ERR_OUT_OF_MEMORY;
    fg_err_t r = FG_OK;
    for (size_t i = 0; i < count && r == FG_OK; i++)
        if ((ops[i] = calloc(1, sizeof(fg_op_t))) == NULL)
            r = FG_ERR_OUT_OF_MEMORY;
    unsigned delay_us = (unsigned)knob(FG_KNOB_COPY_DELAY_US);
    unsigned long long fail_at = knob(FG_KNOB_FAIL_COPY);
    pthread_mutex_lock(&fg.lock);
    if (r == FG_OK && !stream_live(s))
        r = FG_ERR_INVALID_HANDLE;
    if (r == FG_OK)
        r = s->error;
    for (size_t i = 0; i < count && r == FG_OK; i++)
        r = copy_prepare(&copies[i], dir, ops[i]);
    /* a refused copy leaves the stream in error, as a fault leaves a context */
    if (r == FG_ERR_INVALID_VALUE && s->error == FG_OK)
        s->error = r;
    for (size_t i = 0; i < count && r == FG_OK; i++) {
        fg_op_t *op = ops[i];
        if (copies[i].src_now) {
            /* the source is read now, out of stream order, as the caller
             * asked; the device side through its alias */
            if ((op->snapshot = malloc(op->size_bytes)) == NULL) {
                r = FG_ERR_OUT_OF_MEMORY;
                break;
            }
            memcpy(op->snapshot, op->src, op->size_bytes);
            op->src = op->snapshot;
        }
    }
    if (r == FG_OK) {
        if (batch)
            fg.stats.batch_calls++;
        for (size_t i = 0; i < count; i++) {
            fg_op_t *op = ops[i];
            uintptr_t host =
                (uintptr_t)(op->dir == FG_DIR_H2D ? copies[i].src : copies[i].dst);
            copy_count(op->dir, host, op->size_bytes);
            op->counted = true;
            op->delay_us = delay_us;
            if (++fg.copy_seq == fail_at)
                op->fail = FG_ERR_ILLEGAL_ADDRESS;
            for (int k = 0; k < 2; k++)
                if (op->allocs[k] != NULL)
                    op->allocs[k]->pending++;
            stream_push(s, op);
            ops[i] = NULL;
        }
    }
    pthread_mutex_unlock(&fg.lock);
    for (size_t i = 0; i < count; i++) {
        if (ops[i] != NULL)
            free(ops[i]->snapshot);
        free(ops[i]);
    }
    free(ops);
    return r;
}

fg_err_t fg_copy_sync(void *dst, const void *src, size_t size_bytes, fg_dir_t dir)
{
    if (size_bytes == 0)
        return FG_OK;
    fg_stream_t *s = fg_stream_legacy();
    if (s == NULL)
        return FG_ERR_OUT_OF_MEMORY;
    fg_op_t *op = calloc(1, sizeof(*op));
    if (op == NULL)
        return FG_ERR_OUT_OF_MEMORY;
    fg_copy_t c = {.dst = dst, .src = src, .size_bytes = size_bytes};
    pthread_mutex_lock(&fg.lock);
    fg_err_t r = s->error;
    if (r == FG_OK)
        r = copy_prepare(&c, dir, op);
    if (r == FG_OK) {
        fg.stats.sync_copies++;
        for (int k = 0; k < 2; k++)
            if (op->allocs[k] != NULL)
                op->allocs[k]->pending++;
        stream_push(s, op);
        op = NULL;
        uint64_t target = s->enqueued;
        while (s->done < target)
            pthread_cond_wait(&fg.progress, &fg.lock);
        r = s->error;
    }
    pthread_mutex_unlock(&fg.lock);
    free(op);
    return r;
}

/* ---- stats ---- */

void fg_stats(fakegpu_stats_t *out)
{
    pthread_mutex_lock(&fg.lock);
    *out = fg.stats;
    pthread_mutex_unlock(&fg.lock);
}

void fg_stats_reset(void)
{
    pthread_mutex_lock(&fg.lock);
    fakegpu_stats_t keep = fg.stats;
    memset(&fg.stats, 0, sizeof(fg.stats));
    fg.stats.registered_bytes = keep.registered_bytes;
    fg.stats.host_alloc_bytes = keep.host_alloc_bytes;
    fg.stats.device_alloc_bytes = keep.device_alloc_bytes;
    fg.stats.streams = keep.streams;
    fg.stats.events = keep.events;
    pthread_mutex_unlock(&fg.lock);
}
