/*
 * gpu_test.c: the GPU tests' helpers (gpu_test.h) over the CUDA driver API
 * or the HIP runtime, called through dlsym'd pointers as libkvdock calls
 * them. No runtime header is needed: the few types are written out here
 * (handles as pointers, CUresult and hipError_t as int, CUdeviceptr as
 * unsigned long long), so this builds where neither toolkit is.
 *
 * Threading: gt_open once, from the test's main thread; the others from
 * any thread that called gt_bind (or gt_open).
 */
#include "gpu_test.h"

#include "kvdock.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef unsigned long long gt_devptr_t;

/* The calls, by runtime. The names are what the runtimes export. */
static struct {
    gt_runtime_t rt;
    void *lib;
    void *ctx; /* CUDA: device 0's primary context */
    /* CUDA driver */
    int (*cuInit)(unsigned);
    int (*cuDeviceGetCount)(int *);
    int (*cuDeviceGet)(int *, int);
    int (*cuDevicePrimaryCtxRetain)(void **, int);
    int (*cuCtxSetCurrent)(void *);
    int (*cuGetErrorName)(int, const char **);
    int (*cuMemAlloc)(gt_devptr_t *, size_t);
    int (*cuMemFree)(gt_devptr_t);
    int (*cuMemcpyHtoD)(gt_devptr_t, const void *, size_t);
    int (*cuMemcpyDtoH)(void *, gt_devptr_t, size_t);
    int (*cuMemcpyHtoDAsync)(gt_devptr_t, const void *, size_t, void *);
    int (*cuMemcpyDtoHAsync)(void *, gt_devptr_t, size_t, void *);
    int (*cuStreamCreate)(void **, unsigned);
    int (*cuStreamDestroy)(void *);
    int (*cuStreamSynchronize)(void *);
    int (*cuStreamWaitEvent)(void *, void *, unsigned);
    int (*cuEventCreate)(void **, unsigned);
    int (*cuEventDestroy)(void *);
    int (*cuEventRecord)(void *, void *);
    int (*cuEventQuery)(void *);
    int (*cuEventSynchronize)(void *);
    int (*cuMemHostRegister)(void *, size_t, unsigned);
    int (*cuMemHostUnregister)(void *);
    int (*cuLaunchHostFunc)(void *, void (*)(void *), void *);
    /* HIP runtime */
    int (*hipInit)(unsigned);
    int (*hipGetDeviceCount)(int *);
    int (*hipSetDevice)(int);
    const char *(*hipGetErrorName)(int);
    int (*hipMalloc)(void **, size_t);
    int (*hipFree)(void *);
    int (*hipMemcpy)(void *, const void *, size_t, int);
    int (*hipMemcpyAsync)(void *, const void *, size_t, int, void *);
    int (*hipStreamCreateWithFlags)(void **, unsigned);
    int (*hipStreamDestroy)(void *);
    int (*hipStreamSynchronize)(void *);
    int (*hipStreamWaitEvent)(void *, void *, unsigned);
    int (*hipEventCreateWithFlags)(void **, unsigned);
    int (*hipEventDestroy)(void *);
    int (*hipEventRecord)(void *, void *);
    int (*hipEventQuery)(void *);
    int (*hipEventSynchronize)(void *);
    int (*hipHostRegister)(void *, size_t, unsigned);
    int (*hipHostUnregister)(void *);
    int (*hipStreamAddCallback)(void *, void (*)(void *, int, void *), void *, unsigned);
    /* the fake's */
    fakegpu_stats_fn stats;
    fakegpu_stats_reset_fn stats_reset;
    fakegpu_set_fn set;
} gt;

/* The runtimes' numbers the helpers pass */
enum {
    CU_STREAM_NON_BLOCKING = 1,
    CU_EVENT_DISABLE_TIMING = 2,
    CU_MEMHOSTREGISTER_PORTABLE = 1,
    CUDA_ERROR_NOT_READY = 600,
    CUDA_ERROR_NO_DEVICE = 100,
    CUDA_ERROR_STUB_LIBRARY = 34,
    CUDA_ERROR_INSUFFICIENT_DRIVER = 35,
    hipMemcpyHostToDevice = 1,
    hipMemcpyDeviceToHost = 2,
    hipStreamNonBlocking = 1,
    hipEventDisableTiming = 2,
    hipHostRegisterPortable = 1,
    hipErrorNotReady = 600,
    hipErrorNoDevice = 100,
    hipErrorInvalidDevice = 101,
    hipErrorInsufficientDriver = 35,
};

const char *gt_status_name(int status)
{
    const char *name = NULL;
    if (gt.rt == GT_CUDA && gt.cuGetErrorName != NULL)
        gt.cuGetErrorName(status, &name);
    else if (gt.rt == GT_HIP && gt.hipGetErrorName != NULL)
        name = gt.hipGetErrorName(status);
    return name != NULL ? name : "(unnamed status)";
}

/* Aborts the test when status, the result of call, is an error. */
static void check(int status, const char *call)
{
    if (status == 0)
        return;
    fprintf(stderr, "gpu_test: %s failed: %d %s\n", call, status, gt_status_name(status));
    exit(1);
}

#define CHECK(call) check((call), #call)

/* Opens the first library of names that loads: its handle, or NULL with
 * every dlerror printed. */
static void *open_first(const char *const *names, size_t count)
{
    for (size_t i = 0; i < count; i++) {
        void *h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (h != NULL)
            return h;
        fprintf(stderr, "gpu_test: %s\n", dlerror());
    }
    return NULL;
}

/* Looks up each symbol; false (the missing one printed) when one is not
 * there. */
#define SYM(field, name) (*(void **)&gt.field = dlsym(gt.lib, name))
static bool need(void *p, const char *name)
{
    if (p == NULL)
        fprintf(stderr, "gpu_test: the runtime lacks %s\n", name);
    return p != NULL;
}
#define NEED(field, name) (need(SYM(field, name), name))

static int open_cuda(void)
{
    const char *path = getenv("KVDOCK_CUDA_LIBRARY");
    const char *names[] = {path != NULL && *path ? path : "libcuda.so.1"};
    if ((gt.lib = open_first(names, 1)) == NULL) {
        printf("SKIP: no CUDA driver library (%s)\n", names[0]);
        return 77;
    }
    bool ok =
        NEED(cuInit, "cuInit") && NEED(cuDeviceGetCount, "cuDeviceGetCount") &&
        NEED(cuDeviceGet, "cuDeviceGet") &&
        NEED(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain") &&
        NEED(cuCtxSetCurrent, "cuCtxSetCurrent") &&
        NEED(cuGetErrorName, "cuGetErrorName") && NEED(cuMemAlloc, "cuMemAlloc_v2") &&
        NEED(cuMemFree, "cuMemFree_v2") && NEED(cuMemcpyHtoD, "cuMemcpyHtoD_v2") &&
        NEED(cuMemcpyDtoH, "cuMemcpyDtoH_v2") &&
        NEED(cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2") &&
        NEED(cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2") &&
        NEED(cuStreamCreate, "cuStreamCreate") &&
        NEED(cuStreamDestroy, "cuStreamDestroy_v2") &&
        NEED(cuStreamSynchronize, "cuStreamSynchronize") &&
        NEED(cuStreamWaitEvent, "cuStreamWaitEvent") &&
        NEED(cuEventCreate, "cuEventCreate") &&
        NEED(cuEventDestroy, "cuEventDestroy_v2") &&
        NEED(cuEventRecord, "cuEventRecord") && NEED(cuEventQuery, "cuEventQuery") &&
        NEED(cuEventSynchronize, "cuEventSynchronize") &&
        NEED(cuMemHostRegister, "cuMemHostRegister_v2") &&
        NEED(cuMemHostUnregister, "cuMemHostUnregister") &&
        NEED(cuLaunchHostFunc, "cuLaunchHostFunc");
    if (!ok)
        return 1;
    int r = gt.cuInit(0);
    if (r == CUDA_ERROR_NO_DEVICE || r == CUDA_ERROR_STUB_LIBRARY ||
        r == CUDA_ERROR_INSUFFICIENT_DRIVER) {
        printf("SKIP: cuInit: %s (no usable CUDA device)\n", gt_status_name(r));
        return 77;
    }
    check(r, "cuInit");
    int count = 0;
    CHECK(gt.cuDeviceGetCount(&count));
    if (count == 0) {
        printf("SKIP: no CUDA device\n");
        return 77;
    }
    int dev;
    CHECK(gt.cuDeviceGet(&dev, 0));
    CHECK(gt.cuDevicePrimaryCtxRetain(&gt.ctx, dev));
    CHECK(gt.cuCtxSetCurrent(gt.ctx));
    return 0;
}

static int open_hip(void)
{
    const char *path = getenv("KVDOCK_HIP_LIBRARY");
    const char *defaults[] = {"libamdhip64.so.5", "libamdhip64.so.6", "libamdhip64.so"};
    const char *named[] = {path};
    bool by_path = path != NULL && *path;
    gt.lib = by_path ? open_first(named, 1) : open_first(defaults, 3);
    if (gt.lib == NULL) {
        printf("SKIP: no HIP runtime library (%s)\n",
               by_path ? path : "libamdhip64.so.*");
        return 77;
    }
    bool ok =
        NEED(hipInit, "hipInit") && NEED(hipGetDeviceCount, "hipGetDeviceCount") &&
        NEED(hipSetDevice, "hipSetDevice") && NEED(hipGetErrorName, "hipGetErrorName") &&
        NEED(hipMalloc, "hipMalloc") && NEED(hipFree, "hipFree") &&
        NEED(hipMemcpy, "hipMemcpy") && NEED(hipMemcpyAsync, "hipMemcpyAsync") &&
        NEED(hipStreamCreateWithFlags, "hipStreamCreateWithFlags") &&
        NEED(hipStreamDestroy, "hipStreamDestroy") &&
        NEED(hipStreamSynchronize, "hipStreamSynchronize") &&
        NEED(hipStreamWaitEvent, "hipStreamWaitEvent") &&
        NEED(hipEventCreateWithFlags, "hipEventCreateWithFlags") &&
        NEED(hipEventDestroy, "hipEventDestroy") &&
        NEED(hipEventRecord, "hipEventRecord") && NEED(hipEventQuery, "hipEventQuery") &&
        NEED(hipEventSynchronize, "hipEventSynchronize") &&
        NEED(hipHostRegister, "hipHostRegister") &&
        NEED(hipHostUnregister, "hipHostUnregister") &&
        NEED(hipStreamAddCallback, "hipStreamAddCallback");
    if (!ok)
        return 1;
    /* ROCm without a GPU answers hipErrorNoDevice or, in 5.2,
     * hipErrorInvalidDevice */
    int r = gt.hipInit(0);
    const char *call = "hipInit";
    int count = 0;
    if (r == 0) {
        r = gt.hipGetDeviceCount(&count);
        call = "hipGetDeviceCount";
    }
    if (r == hipErrorNoDevice || r == hipErrorInvalidDevice ||
        r == hipErrorInsufficientDriver || (r == 0 && count == 0)) {
        printf("SKIP: no HIP device (%s: %s)\n", call, gt_status_name(r));
        return 77;
    }
    check(r, call);
    CHECK(gt.hipSetDevice(0));
    return 0;
}

int gt_open(void)
{
    const char *want = getenv("KVDOCK_TEST_GPU");
    if (want == NULL || *want == '\0' || strcmp(want, "cuda") == 0) {
        gt.rt = GT_CUDA;
    } else if (strcmp(want, "hip") == 0) {
        gt.rt = GT_HIP;
    } else {
        fprintf(stderr, "gpu_test: KVDOCK_TEST_GPU=%s: want cuda or hip\n", want);
        return 1;
    }
    int r = gt.rt == GT_CUDA ? open_cuda() : open_hip();
    if (r != 0)
        return r;
    SYM(stats, "fakegpu_stats");
    SYM(stats_reset, "fakegpu_stats_reset");
    SYM(set, "fakegpu_set");
    printf("gpu_test: %s runtime%s\n", gt_runtime_name(),
           gt_is_fake() ? " (the fake)" : "");
    return 0;
}

gt_runtime_t gt_runtime(void)
{
    return gt.rt;
}

const char *gt_runtime_name(void)
{
    return gt.rt == GT_HIP ? "hip" : "cuda";
}

void *gt_symbol(const char *name)
{
    return dlsym(gt.lib, name);
}

void gt_bind(void)
{
    if (gt.rt == GT_CUDA)
        CHECK(gt.cuCtxSetCurrent(gt.ctx));
    else
        CHECK(gt.hipSetDevice(0));
}

void gt_unbind(void)
{
    if (gt.rt == GT_CUDA)
        CHECK(gt.cuCtxSetCurrent(NULL));
}

int gt_memory_kind(void)
{
    return gt.rt == GT_HIP ? KVD_MEM_HIP : KVD_MEM_CUDA;
}

bool gt_is_fake(void)
{
    return gt.stats != NULL;
}

bool gt_fake_stats(fakegpu_stats_t *out)
{
    if (gt.stats == NULL)
        return false;
    gt.stats(out);
    return true;
}

void gt_fake_stats_reset(void)
{
    if (gt.stats_reset != NULL)
        gt.stats_reset();
}

void gt_fake_set(const char *knob, unsigned long long value)
{
    if (gt.set == NULL || gt.set(knob, value) != 0) {
        fprintf(stderr, "gpu_test: cannot set %s: %s\n", knob,
                gt.set == NULL ? "not a fake runtime" : "no such knob");
        exit(1);
    }
}

void gt_write(void *dev, const void *host, size_t n)
{
    if (gt.rt == GT_CUDA)
        CHECK(gt.cuMemcpyHtoD((gt_devptr_t)(uintptr_t)dev, host, n));
    else
        CHECK(gt.hipMemcpy(dev, host, n, hipMemcpyHostToDevice));
}

void gt_read(void *host, const void *dev, size_t n)
{
    if (gt.rt == GT_CUDA)
        CHECK(gt.cuMemcpyDtoH(host, (gt_devptr_t)(uintptr_t)dev, n));
    else
        CHECK(gt.hipMemcpy(host, dev, n, hipMemcpyDeviceToHost));
}

void *gt_alloc(size_t n)
{
    void *p = NULL;
    if (gt.rt == GT_CUDA) {
        gt_devptr_t d = 0;
        CHECK(gt.cuMemAlloc(&d, n));
        p = (void *)(uintptr_t)d;
    } else {
        CHECK(gt.hipMalloc(&p, n));
    }
    /* a real device's fresh memory holds whatever it held */
    void *zero = calloc(1, n);
    if (zero == NULL) {
        fprintf(stderr, "gpu_test: out of host memory\n");
        exit(1);
    }
    gt_write(p, zero, n);
    free(zero);
    return p;
}

void gt_free(void *p)
{
    if (gt.rt == GT_CUDA)
        CHECK(gt.cuMemFree((gt_devptr_t)(uintptr_t)p));
    else
        CHECK(gt.hipFree(p));
}

void *gt_stream_create(void)
{
    void *s = NULL;
    if (gt.rt == GT_CUDA)
        CHECK(gt.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    else
        CHECK(gt.hipStreamCreateWithFlags(&s, hipStreamNonBlocking));
    return s;
}

void gt_stream_destroy(void *s)
{
    CHECK(gt.rt == GT_CUDA ? gt.cuStreamDestroy(s) : gt.hipStreamDestroy(s));
}

int gt_try_stream_sync(void *s)
{
    return gt.rt == GT_CUDA ? gt.cuStreamSynchronize(s) : gt.hipStreamSynchronize(s);
}

void gt_stream_sync(void *s)
{
    CHECK(gt_try_stream_sync(s));
}

void gt_stream_wait_event(void *s, void *e)
{
    CHECK(gt.rt == GT_CUDA ? gt.cuStreamWaitEvent(s, e, 0)
                           : gt.hipStreamWaitEvent(s, e, 0));
}

void *gt_event_create(void)
{
    void *e = NULL;
    if (gt.rt == GT_CUDA)
        CHECK(gt.cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
    else
        CHECK(gt.hipEventCreateWithFlags(&e, hipEventDisableTiming));
    return e;
}

void gt_event_record(void *e, void *s)
{
    CHECK(gt.rt == GT_CUDA ? gt.cuEventRecord(e, s) : gt.hipEventRecord(e, s));
}

bool gt_event_done(void *e)
{
    int r = gt.rt == GT_CUDA ? gt.cuEventQuery(e) : gt.hipEventQuery(e);
    if (r == (gt.rt == GT_CUDA ? CUDA_ERROR_NOT_READY : hipErrorNotReady))
        return false;
    CHECK(r);
    return true;
}

void gt_event_sync(void *e)
{
    CHECK(gt.rt == GT_CUDA ? gt.cuEventSynchronize(e) : gt.hipEventSynchronize(e));
}

void gt_event_destroy(void *e)
{
    CHECK(gt.rt == GT_CUDA ? gt.cuEventDestroy(e) : gt.hipEventDestroy(e));
}

int gt_try_write_async(void *dev, const void *host, size_t n, void *s)
{
    if (gt.rt == GT_CUDA)
        return gt.cuMemcpyHtoDAsync((gt_devptr_t)(uintptr_t)dev, host, n, s);
    return gt.hipMemcpyAsync(dev, host, n, hipMemcpyHostToDevice, s);
}

void gt_write_async(void *dev, const void *host, size_t n, void *s)
{
    CHECK(gt_try_write_async(dev, host, n, s));
}

void gt_read_async(void *host, const void *dev, size_t n, void *s)
{
    if (gt.rt == GT_CUDA)
        CHECK(gt.cuMemcpyDtoHAsync(host, (gt_devptr_t)(uintptr_t)dev, n, s));
    else
        CHECK(gt.hipMemcpyAsync(host, dev, n, hipMemcpyDeviceToHost, s));
}

int gt_host_register(void *p, size_t n)
{
    if (gt.rt == GT_CUDA)
        return gt.cuMemHostRegister(p, n, CU_MEMHOSTREGISTER_PORTABLE);
    return gt.hipHostRegister(p, n, hipHostRegisterPortable);
}

int gt_host_unregister(void *p)
{
    return gt.rt == GT_CUDA ? gt.cuMemHostUnregister(p) : gt.hipHostUnregister(p);
}

/* ---- gates ---- */

struct gt_gate {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    bool open;   /* set by gt_gate_open */
    bool passed; /* set by the stream's host function once it has seen open */
};

/* The host function on the stream: blocks until the gate opens, then tells
 * the opener it no longer touches the gate. */
static void gate_hold(void *arg)
{
    struct gt_gate *g = arg;
    pthread_mutex_lock(&g->lock);
    while (!g->open)
        pthread_cond_wait(&g->cond, &g->lock);
    g->passed = true;
    pthread_cond_broadcast(&g->cond);
    pthread_mutex_unlock(&g->lock);
}

static void gate_hold_hip(void *stream, int status, void *arg)
{
    (void)stream;
    (void)status;
    gate_hold(arg);
}

gt_gate_t *gt_gate(void *s)
{
    struct gt_gate *g = calloc(1, sizeof(*g));
    if (g == NULL) {
        fprintf(stderr, "gpu_test: out of host memory\n");
        exit(1);
    }
    pthread_mutex_init(&g->lock, NULL);
    pthread_cond_init(&g->cond, NULL);
    if (gt.rt == GT_CUDA)
        CHECK(gt.cuLaunchHostFunc(s, gate_hold, g));
    else
        CHECK(gt.hipStreamAddCallback(s, gate_hold_hip, g, 0));
    return g;
}

void gt_gate_open(gt_gate_t *g)
{
    pthread_mutex_lock(&g->lock);
    g->open = true;
    pthread_cond_broadcast(&g->cond);
    while (!g->passed)
        pthread_cond_wait(&g->cond, &g->lock);
    pthread_mutex_unlock(&g->lock);
    pthread_cond_destroy(&g->cond);
    pthread_mutex_destroy(&g->lock);
    free(g);
}
