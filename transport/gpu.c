/*
 * gpu.c - the device memory kinds (CUDA, HIP) over a runtime's table of
 * calls (gpu_int.h): the pointer check, the registry of host memory pinned
 * for DMA, and the kind object: a stream of its own, marks as events, and
 * a ring of pinned slots for host memory that is not pinned.
 *
 * Why a ring: a copy between device memory and pageable host memory is
 * staged by the driver through buffers of its own and is synchronous with
 * the host, and so slow and silent. Until the store's pool is registered
 * (in the background, about 0.1 s per GB), or when registering it fails,
 * the kind stages itself: host -> slot (memcpy) -> device on the stream;
 * device -> slot on the stream, then slot -> host once the slot's event is
 * done (at the slot's reuse, a mark or a sync). Four slots of 2 MiB keep
 * the copy engine busy while the CPU fills the next one.
 *
 * Contexts are made current around every call and restored after, since
 * marks and waits come from the engine's threads.
 */
#include "gpu_int.h"

#include <dlfcn.h>
#include <stdatomic.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RING_SLOTS      4
#define RING_SLOT_BYTES (2u << 20)

/* ------------------------------------------------------------- loading */

void *kvd_gpu_dlopen(const char *env_var, const char *const *names, char *why, size_t cap)
{
    const char *forced = getenv(env_var);
    if (forced != NULL && forced[0] != '\0') {
        /* named by the operator: that one or nothing */
        void *lib = dlopen(forced, RTLD_NOW | RTLD_LOCAL);
        if (lib == NULL && why != NULL)
            snprintf(why, cap, "cannot load %s=%s: %s", env_var, forced, dlerror());
        return lib;
    }
    size_t off = 0;
    if (why != NULL && cap > 0)
        why[0] = '\0';
    for (size_t i = 0; names[i] != NULL; i++) {
        void *lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (lib != NULL)
            return lib;
        const char *e = dlerror();
        if (why != NULL && off < cap)
            off += (size_t)snprintf(why + off, cap - off, "%scannot load %s (%s)",
                                    i ? "; " : "", names[i], e ? e : "?");
    }
    return NULL;
}

const char *kvd_gpu_name(kvd_gpu_runtime_t rt)
{
    return rt == KVD_GPU_CUDA ? "CUDA" : rt == KVD_GPU_HIP ? "HIP" : "unknown runtime";
}

static const gpu_api_t *api_of(kvd_gpu_runtime_t rt, int *status, char *why, size_t cap)
{
    *status = KVD_ERR_UNSUPPORTED;
#ifdef KVD_HAVE_CUDA
    if (rt == KVD_GPU_CUDA)
        return kvd_gpu_cuda_load(status, why, cap);
#endif
#ifdef KVD_HAVE_HIP
    if (rt == KVD_GPU_HIP)
        return kvd_gpu_hip_load(status, why, cap);
#endif
    if (why != NULL && cap > 0)
        snprintf(why, cap, "%s support is not built into this libkvdock",
                 kvd_gpu_name(rt));
    return NULL;
}

int kvd_gpu_load(kvd_gpu_runtime_t rt, char *why, size_t cap)
{
    int status;
    return api_of(rt, &status, why, cap) != NULL ? KVD_OK : status;
}

/* A failed runtime call, in the log and in why. */
static int gpu_failed(const gpu_api_t *api, const char *call, int code, char *why,
                      size_t cap)
{
    char e[160];
    api->err(code, e, sizeof(e));
    if (why != NULL && cap > 0)
        snprintf(why, cap, "%s %s: %s", api->name, call, e);
    KVD_WARN("gpu", "%s %s: %s", api->name, call, e);
    return KVD_ERR_DEVICE;
}

int kvd_gpu_pointer(kvd_gpu_runtime_t rt, const void *p, kvd_gpu_pointer_t *out,
                    char *why, size_t cap)
{
    int status;
    const gpu_api_t *api = api_of(rt, &status, why, cap);
    if (api == NULL)
        return status;
    /* on the caller's current device first (an engine thread has one):
     * making device 0 current would create a context there, hundreds of
     * MB on a GPU another worker uses */
    int rc = api->pointer(p, out);
    if (rc == 0)
        return KVD_OK;
    void *dev = NULL, *saved = NULL;
    rc = api->device(0, &dev); /* some device current: device 0's */
    if (rc != 0)
        return gpu_failed(api, "device 0", rc, why, cap);
    rc = api->bind(dev, &saved);
    if (rc != 0)
        return gpu_failed(api, "bind", rc, why, cap);
    rc = api->pointer(p, out);
    api->unbind(saved);
    return rc != 0 ? gpu_failed(api, "pointer attributes", rc, why, cap) : KVD_OK;
}

/* ------------------------------------------------------------- pinning */

typedef struct pin_range {
    uintptr_t base; /* this registration */
    uint64_t len;
    uintptr_t owner; /* the base kvd_gpu_pin was given */
    void *dev;
} pin_range_t;

static struct pins {
    pthread_rwlock_t lock;
    pin_range_t *v;
    size_t n, cap;
} pins[3] = {{.lock = PTHREAD_RWLOCK_INITIALIZER},
             {.lock = PTHREAD_RWLOCK_INITIALIZER},
             {.lock = PTHREAD_RWLOCK_INITIALIZER}};

static struct pins *pins_of(kvd_gpu_runtime_t rt)
{
    return &pins[rt == KVD_GPU_CUDA ? 1 : 2];
}

bool kvd_gpu_pinned(kvd_gpu_runtime_t rt, const void *p, size_t n)
{
    struct pins *t = pins_of(rt);
    uintptr_t a = (uintptr_t)p, end = a + n;
    pthread_rwlock_rdlock(&t->lock);
    /* a copy may span two chunks of one registration */
    bool found = true;
    while (found && a < end) {
        found = false;
        for (size_t i = 0; i < t->n; i++)
            if (a >= t->v[i].base && a - t->v[i].base < t->v[i].len) {
                a = t->v[i].base + t->v[i].len;
                found = true;
                break;
            }
    }
    pthread_rwlock_unlock(&t->lock);
    return a >= end;
}

/* How many bytes from p (at most n) lie in the one registration p is in;
 * 0 when p is not pinned. A DMA copy stays within one registration: the
 * driver may take one that spans two for pageable memory. */
static size_t pinned_span(kvd_gpu_runtime_t rt, const void *p, size_t n)
{
    struct pins *t = pins_of(rt);
    uintptr_t a = (uintptr_t)p;
    size_t span = 0;
    pthread_rwlock_rdlock(&t->lock);
    for (size_t i = 0; i < t->n; i++)
        if (a >= t->v[i].base && a - t->v[i].base < t->v[i].len) {
            span = (size_t)KVD_MIN((uint64_t)n, t->v[i].len - (a - t->v[i].base));
            break;
        }
    pthread_rwlock_unlock(&t->lock);
    return span;
}

static bool overlaps(const struct pins *t, uintptr_t a, uint64_t len)
{
    for (size_t i = 0; i < t->n; i++)
        if (a < t->v[i].base + t->v[i].len && t->v[i].base < a + len)
            return true;
    return false;
}

int kvd_gpu_pin(kvd_gpu_runtime_t rt, int ordinal, void *base, uint64_t len,
                bool read_only, const _Atomic bool *stop, uint64_t *pinned, char *why,
                size_t cap)
{
    *pinned = 0;
    int status;
    const gpu_api_t *api = api_of(rt, &status, why, cap);
    if (api == NULL)
        return status;
    struct pins *t = pins_of(rt);
    pthread_rwlock_rdlock(&t->lock);
    bool clash = overlaps(t, (uintptr_t)base, len);
    pthread_rwlock_unlock(&t->lock);
    if (clash)
        return KVD_ERR_INVALID;
    void *dev = NULL, *saved = NULL;
    int rc = api->device(ordinal, &dev);
    if (rc != 0)
        return gpu_failed(api, "device", rc, why, cap);
    rc = api->bind(dev, &saved);
    if (rc != 0)
        return gpu_failed(api, "bind", rc, why, cap);
    /* an engine capturing a graph meanwhile must not make the driver
     * refuse this thread's registration */
    int mode = -1;
    if (api->relaxed != NULL)
        api->relaxed(&mode);
    int ret = KVD_OK;
    for (uint64_t off = 0; off < len; off += KVD_GPU_PIN_CHUNK) {
        if (stop != NULL && atomic_load(stop))
            break;
        uint64_t n = KVD_MIN(KVD_GPU_PIN_CHUNK, len - off);
        /* outside the lock: a registration takes a while, copies go on */
        rc = api->host_register((uint8_t *)base + off, n, read_only);
        if (rc != 0) {
            ret = gpu_failed(api, "host register", rc, why, cap);
            break;
        }
        /* listed in one step with the room for it: another pin may run
         * beside this one */
        pthread_rwlock_wrlock(&t->lock);
        if (t->n == t->cap) {
            size_t nc = t->cap ? t->cap * 2 : 16;
            pin_range_t *v = realloc(t->v, nc * sizeof(*v));
            if (v != NULL) {
                t->v = v;
                t->cap = nc;
            }
        }
        bool listed = t->n < t->cap;
        if (listed)
            t->v[t->n++] = (pin_range_t){.base = (uintptr_t)base + off,
                                         .len = n,
                                         .owner = (uintptr_t)base,
                                         .dev = dev};
        pthread_rwlock_unlock(&t->lock);
        if (!listed) {
            (void)api->host_unregister((uint8_t *)base + off);
            ret = KVD_ERR_NOMEM;
            break;
        }
        *pinned += n;
    }
    if (api->restore != NULL)
        api->restore(mode);
    api->unbind(saved);
    return ret;
}

void kvd_gpu_unpin(kvd_gpu_runtime_t rt, void *base)
{
    int status;
    const gpu_api_t *api = api_of(rt, &status, NULL, 0);
    if (api == NULL)
        return;
    struct pins *t = pins_of(rt);
    pthread_rwlock_wrlock(&t->lock);
    for (size_t i = 0; i < t->n;) {
        if (t->v[i].owner != (uintptr_t)base) {
            i++;
            continue;
        }
        void *saved = NULL;
        if (api->bind(t->v[i].dev, &saved) == 0) {
            int mode = -1;
            if (api->relaxed != NULL)
                api->relaxed(&mode);
            int rc = api->host_unregister((void *)t->v[i].base);
            if (rc != 0)
                (void)gpu_failed(api, "host unregister", rc, NULL, 0);
            if (api->restore != NULL)
                api->restore(mode);
            api->unbind(saved);
        }
        t->v[i] = t->v[--t->n];
    }
    pthread_rwlock_unlock(&t->lock);
}

/* --------------------------------------------------------------- kinds */

typedef struct gpu_slot {
    void *event;
    bool busy;      /* a copy through it may be running */
    void *host_dst; /* device -> slot copy whose bytes go here once done */
    size_t n;
} gpu_slot_t;

typedef struct gpu_kind {
    kvd_memkind_t base;
    kvd_gpu_runtime_t rt;
    const gpu_api_t *api;
    void *dev;
    int ordinal;
    void *stream;
    uint8_t *ring;
    gpu_slot_t slots[RING_SLOTS];
    unsigned next_slot;
    /* events of marks handed back, to reuse (any thread) */
    pthread_mutex_t free_lock;
    void **free_events;
    size_t n_free, cap_free;
    _Atomic uint64_t dma_bytes, bounce_bytes;
} gpu_kind_t;

static gpu_kind_t *gk(const kvd_memkind_t *k)
{
    return (gpu_kind_t *)(uintptr_t)k; /* kinds of gpu.c are never const objects */
}

/* Binds k's device for one call; KVD_ERR_DEVICE when it cannot. */
static int enter(gpu_kind_t *g, void **saved)
{
    int rc = g->api->bind(g->dev, saved);
    return rc != 0 ? gpu_failed(g->api, "bind", rc, NULL, 0) : KVD_OK;
}

static void leave(gpu_kind_t *g, void *saved)
{
    g->api->unbind(saved);
}

/* Waits for slot s's copy and moves a device -> slot copy's bytes on. */
static int slot_finish(gpu_kind_t *g, unsigned s)
{
    gpu_slot_t *sl = &g->slots[s];
    if (!sl->busy)
        return KVD_OK;
    int rc = g->api->event_sync(sl->event);
    sl->busy = false;
    if (rc != 0) {
        sl->host_dst = NULL;
        return gpu_failed(g->api, "event synchronize", rc, NULL, 0);
    }
    if (sl->host_dst != NULL)
        memcpy(sl->host_dst, g->ring + (size_t)s * RING_SLOT_BYTES, sl->n);
    sl->host_dst = NULL;
    return KVD_OK;
}

/* Finishes the device -> host copies still in slots. */
static int drain_out(gpu_kind_t *g)
{
    int rc = KVD_OK;
    for (unsigned s = 0; s < RING_SLOTS; s++)
        if (g->slots[s].host_dst != NULL) {
            int one = slot_finish(g, s);
            if (rc == KVD_OK)
                rc = one;
        }
    return rc;
}

static int bounce(gpu_kind_t *g, const kvd_copy_t *c, bool h2d)
{
    for (size_t off = 0; off < c->n;) {
        size_t n = KVD_MIN((size_t)RING_SLOT_BYTES, c->n - off);
        unsigned s = g->next_slot;
        g->next_slot = (s + 1) % RING_SLOTS;
        int rc = slot_finish(g, s);
        if (rc != KVD_OK)
            return rc;
        uint8_t *slot = g->ring + (size_t)s * RING_SLOT_BYTES;
        const char *call;
        if (h2d) {
            memcpy(slot, (const uint8_t *)c->src + off, n);
            call = "copy host to device";
            rc = g->api->h2d((uint8_t *)c->dst + off, slot, n, g->stream);
        } else {
            call = "copy device to host";
            rc = g->api->d2h(slot, (const uint8_t *)c->src + off, n, g->stream);
        }
        if (rc == 0)
            rc = g->api->event_record(g->slots[s].event, g->stream);
        if (rc != 0)
            return gpu_failed(g->api, call, rc, NULL, 0);
        g->slots[s] = (gpu_slot_t){.event = g->slots[s].event,
                                   .busy = true,
                                   .host_dst = h2d ? NULL : (uint8_t *)c->dst + off,
                                   .n = n};
        off += n;
    }
    atomic_fetch_add(&g->bounce_bytes, c->n);
    return KVD_OK;
}

/* Copies v[0..n) whose host side is pinned, by DMA: one batch call where
 * the runtime has one. */
static int dma(gpu_kind_t *g, const kvd_copy_t *v, size_t n, bool h2d)
{
    int rc = 0;
    uint64_t bytes = 0;
    if (n > 1 && g->api->batch != NULL) {
        rc = g->api->batch(v, n, h2d, g->ordinal, g->stream);
        if (rc != 0)
            return gpu_failed(g->api, "batched copy", rc, NULL, 0);
        for (size_t i = 0; i < n; i++)
            bytes += v[i].n;
    } else {
        for (size_t i = 0; rc == 0 && i < n; i++) {
            rc = h2d ? g->api->h2d(v[i].dst, v[i].src, v[i].n, g->stream)
                     : g->api->d2h(v[i].dst, v[i].src, v[i].n, g->stream);
            bytes += v[i].n;
        }
        if (rc != 0)
            return gpu_failed(g->api, h2d ? "copy host to device" : "copy device to host",
                              rc, NULL, 0);
    }
    atomic_fetch_add(&g->dma_bytes, bytes);
    return KVD_OK;
}

#define DMA_RUN 64 /* pinned copies gathered for one batch call */

static int gpu_copy_batch(const kvd_memkind_t *k, const kvd_copy_t *v, size_t n,
                          bool into_region)
{
    gpu_kind_t *g = gk(k);
    void *saved;
    int rc = enter(g, &saved);
    kvd_copy_t run[DMA_RUN];
    size_t n_run = 0;
    for (size_t i = 0; rc == KVD_OK && i < n; i++) {
        /* by DMA piece by piece, each within one registration; what is not
         * pinned through the ring */
        for (size_t off = 0; rc == KVD_OK && off < v[i].n;) {
            kvd_copy_t c = {.dst = (uint8_t *)v[i].dst + off,
                            .src = (const uint8_t *)v[i].src + off,
                            .n = v[i].n - off};
            size_t span = pinned_span(g->rt, into_region ? c.src : c.dst, c.n);
            if (span == 0) {
                rc = bounce(g, &c, into_region);
                break;
            }
            c.n = span;
            run[n_run++] = c;
            if (n_run == DMA_RUN) {
                rc = dma(g, run, n_run, into_region);
                n_run = 0;
            }
            off += span;
        }
    }
    if (rc == KVD_OK && n_run > 0)
        rc = dma(g, run, n_run, into_region);
    leave(g, saved);
    return rc;
}

static int gpu_copy(const kvd_memkind_t *k, void *dst, const void *src, size_t n,
                    bool into_region)
{
    const kvd_copy_t c = {.dst = dst, .src = src, .n = n};
    return gpu_copy_batch(k, &c, 1, into_region);
}

static int gpu_sync(const kvd_memkind_t *k)
{
    gpu_kind_t *g = gk(k);
    void *saved;
    int rc = enter(g, &saved);
    if (rc != KVD_OK)
        return rc;
    int code = g->api->stream_sync(g->stream);
    rc = code != 0 ? gpu_failed(g->api, "stream synchronize", code, NULL, 0) : KVD_OK;
    int out = drain_out(g); /* the events are done: no wait */
    for (unsigned s = 0; s < RING_SLOTS; s++)
        g->slots[s].busy = false;
    leave(g, saved);
    return rc != KVD_OK ? rc : out;
}

static int take_event(gpu_kind_t *g, void **ev)
{
    pthread_mutex_lock(&g->free_lock);
    *ev = g->n_free > 0 ? g->free_events[--g->n_free] : NULL;
    pthread_mutex_unlock(&g->free_lock);
    if (*ev != NULL)
        return KVD_OK;
    int rc = g->api->event_create(ev);
    return rc != 0 ? gpu_failed(g->api, "event create", rc, NULL, 0) : KVD_OK;
}

static void give_event(gpu_kind_t *g, void *ev)
{
    pthread_mutex_lock(&g->free_lock);
    if (g->n_free == g->cap_free) {
        size_t cap = g->cap_free ? g->cap_free * 2 : 16;
        void **v = realloc(g->free_events, cap * sizeof(*v));
        if (v != NULL) {
            g->free_events = v;
            g->cap_free = cap;
        }
    }
    bool kept = g->n_free < g->cap_free;
    if (kept)
        g->free_events[g->n_free++] = ev;
    pthread_mutex_unlock(&g->free_lock);
    if (!kept)
        (void)g->api->event_destroy(ev); /* freed once the device is past it */
}

static int gpu_mark(const kvd_memkind_t *k, void **mark)
{
    gpu_kind_t *g = gk(k);
    void *saved;
    *mark = NULL;
    int rc = enter(g, &saved);
    /* a staged device -> host copy is done only once its bytes left the
     * slot: the mark cannot say that, so they leave now */
    if (rc == KVD_OK)
        rc = drain_out(g);
    void *ev = NULL;
    if (rc == KVD_OK)
        rc = take_event(g, &ev);
    if (rc == KVD_OK) {
        int code = g->api->event_record(ev, g->stream);
        if (code != 0) {
            give_event(g, ev);
            rc = gpu_failed(g->api, "event record", code, NULL, 0);
        } else {
            *mark = ev;
        }
    }
    leave(g, saved);
    return rc;
}

static int gpu_mark_query(const kvd_memkind_t *k, void *mark)
{
    gpu_kind_t *g = gk(k);
    void *saved;
    int rc = enter(g, &saved);
    if (rc != KVD_OK)
        return rc;
    int code = g->api->event_query(mark);
    leave(g, saved);
    if (code == 0)
        return KVD_OK;
    if (code == g->api->not_ready)
        return KVD_INPROGRESS;
    return gpu_failed(g->api, "event query", code, NULL, 0);
}

static int gpu_mark_wait(const kvd_memkind_t *k, void *mark)
{
    gpu_kind_t *g = gk(k);
    void *saved;
    int rc = enter(g, &saved);
    if (rc != KVD_OK)
        return rc;
    int code = g->api->event_sync(mark);
    leave(g, saved);
    return code != 0 ? gpu_failed(g->api, "event synchronize", code, NULL, 0) : KVD_OK;
}

/* The engine's stream as the runtime names it. */
static void *engine_stream(const gpu_kind_t *g, void *stream)
{
    return stream == KVD_GPU_STREAM_LEGACY ? g->api->legacy_stream : stream;
}

/* KVD_ERR_UNSUPPORTED when s is being captured into a graph: a wait there
 * would become a graph node naming an event kvdock reuses for other
 * batches, and a record there would pull kvdock's stream into the
 * capture. Capture-safe waits (events of a fixed layer, recorded by each
 * batch) are not built. */
static int refuse_capture(gpu_kind_t *g, void *s)
{
    bool yes = false;
    if (g->api->capturing == NULL || g->api->capturing(s, &yes) != 0 || !yes)
        return KVD_OK;
    KVD_WARN("gpu",
             "%s: a stream being captured into a graph cannot wait for kvdock "
             "(wait before the capture, or use kvd_wait_layer)",
             g->api->name);
    return KVD_ERR_UNSUPPORTED;
}

static int gpu_mark_stream_wait(const kvd_memkind_t *k, void *mark, void *stream)
{
    gpu_kind_t *g = gk(k);
    void *saved;
    int rc = enter(g, &saved);
    if (rc != KVD_OK)
        return rc;
    stream = engine_stream(g, stream);
    rc = refuse_capture(g, stream);
    int code = rc == KVD_OK ? g->api->stream_wait(stream, mark) : 0;
    leave(g, saved);
    if (code != 0)
        return gpu_failed(g->api, "stream wait", code, NULL, 0);
    return rc;
}

static void gpu_mark_free(const kvd_memkind_t *k, void *mark)
{
    give_event(gk(k), mark);
}

static int gpu_after(const kvd_memkind_t *k, void *stream, void *event, void **mark)
{
    gpu_kind_t *g = gk(k);
    if (stream == NULL && event == NULL)
        return KVD_ERR_INVALID;
    void *saved;
    int rc = enter(g, &saved);
    if (rc != KVD_OK)
        return rc;
    stream = engine_stream(g, stream);
    if (event == NULL)
        rc = refuse_capture(g, stream);
    void *ev = event;
    if (rc == KVD_OK && ev == NULL) {
        /* what the stream holds now: an event of ours recorded there */
        rc = take_event(g, &ev);
        int code = rc == KVD_OK ? g->api->event_record(ev, stream) : 0;
        if (code != 0)
            rc = gpu_failed(g->api, "event record", code, NULL, 0);
    }
    if (rc == KVD_OK) {
        /* the wait takes the event's record as it stands now: reusing or
         * re-recording it later changes nothing for it */
        int code = g->api->stream_wait(g->stream, ev);
        if (code != 0)
            rc = gpu_failed(g->api, "stream wait", code, NULL, 0);
    }
    if (event == NULL && ev != NULL)
        give_event(g, ev);
    /* a mark of our stream past the wait: done once the engine's work is */
    void *m = NULL;
    if (rc == KVD_OK && mark != NULL && (rc = take_event(g, &m)) == KVD_OK) {
        int code = g->api->event_record(m, g->stream);
        if (code != 0) {
            give_event(g, m);
            rc = gpu_failed(g->api, "event record", code, NULL, 0);
        } else {
            *mark = m;
        }
    }
    leave(g, saved);
    return rc;
}

void kvd_memkind_gpu_close(kvd_memkind_t *k)
{
    if (k == NULL)
        return;
    gpu_kind_t *g = gk(k);
    void *saved;
    bool bound = enter(g, &saved) == KVD_OK;
    if (bound) {
        int mode = -1;
        if (g->api->relaxed != NULL)
            g->api->relaxed(&mode);
        if (g->stream != NULL) /* never the legacy stream's sync */
            (void)gpu_sync(k);
        for (unsigned s = 0; s < RING_SLOTS; s++)
            if (g->slots[s].event != NULL)
                (void)g->api->event_destroy(g->slots[s].event);
        for (size_t i = 0; i < g->n_free; i++)
            (void)g->api->event_destroy(g->free_events[i]);
        if (g->stream != NULL)
            (void)g->api->stream_destroy(g->stream);
        if (g->ring != NULL)
            (void)g->api->host_free(g->ring);
        if (g->api->restore != NULL)
            g->api->restore(mode);
        leave(g, saved);
    }
    free(g->free_events);
    pthread_mutex_destroy(&g->free_lock);
    free(g);
}

int kvd_memkind_gpu_open(kvd_gpu_runtime_t rt, int ordinal, kvd_memkind_t **out,
                         char *why, size_t cap)
{
    int status;
    const gpu_api_t *api = api_of(rt, &status, why, cap);
    if (api == NULL)
        return status;
    gpu_kind_t *g = calloc(1, sizeof(*g));
    if (g == NULL)
        return KVD_ERR_NOMEM;
    g->base = (kvd_memkind_t){
        .name = rt == KVD_GPU_CUDA ? "cuda" : "hip",
        .async = true,
        .runtime = rt,
        .ordinal = ordinal,
        .copy = gpu_copy,
        .copy_batch = gpu_copy_batch,
        .sync = gpu_sync,
        .mark = gpu_mark,
        .mark_query = gpu_mark_query,
        .mark_wait = gpu_mark_wait,
        .mark_stream_wait = gpu_mark_stream_wait,
        .mark_free = gpu_mark_free,
        .after = gpu_after,
    };
    g->rt = rt;
    g->api = api;
    g->ordinal = ordinal;
    pthread_mutex_init(&g->free_lock, NULL);
    int code = api->device(ordinal, &g->dev);
    void *saved;
    const char *call = "device";
    if (code == 0) {
        call = "bind";
        code = api->bind(g->dev, &saved);
    }
    if (code != 0) {
        pthread_mutex_destroy(&g->free_lock);
        free(g);
        return gpu_failed(api, call, code, why, cap);
    }
    int mode = -1;
    if (api->relaxed != NULL)
        api->relaxed(&mode);
    call = "stream create";
    code = api->stream_create(&g->stream);
    if (code == 0) {
        call = "pinned host alloc";
        code = api->host_alloc((void **)&g->ring, (size_t)RING_SLOTS * RING_SLOT_BYTES);
    }
    for (unsigned s = 0; code == 0 && s < RING_SLOTS; s++) {
        call = "event create";
        code = api->event_create(&g->slots[s].event);
    }
    if (api->restore != NULL)
        api->restore(mode);
    leave(g, saved);
    if (code != 0) {
        int rc = gpu_failed(api, call, code, why, cap);
        kvd_memkind_gpu_close(&g->base);
        return rc;
    }
    *out = &g->base;
    return KVD_OK;
}

void kvd_memkind_gpu_counts(const kvd_memkind_t *k, uint64_t *dma_bytes,
                            uint64_t *bounce_bytes)
{
    gpu_kind_t *g = gk(k);
    *dma_bytes = atomic_load(&g->dma_bytes);
    *bounce_bytes = atomic_load(&g->bounce_bytes);
}
