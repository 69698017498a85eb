/*
 * bench_gpu.c - the device runtime for kvdock-bench, through dlopen (see
 * bench_gpu.h). The CUDA driver API's and HIP's few types are declared
 * here (handles as pointers, CUdeviceptr as a 64-bit integer), so the
 * bench needs neither toolkit's headers; the symbols are the versioned
 * ones the libraries export (cuMemAlloc_v2, ...), which cuda.h's macros
 * name.
 */
#include "bench_gpu.h"
#include "kvd_common.h"

#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int gres_t; /* CUresult, hipError_t: 0 is success */
typedef void *ghandle_t;

static struct {
    kvd_memory_kind_t kind;
    void *lib;
    bool fake;
    char name[128];
    ghandle_t stream;
    /* CUDA driver API */
    gres_t (*cuInit)(unsigned);
    gres_t (*cuDeviceGet)(int *, int);
    gres_t (*cuDeviceGetName)(char *, int, int);
    gres_t (*cuDevicePrimaryCtxRetain)(ghandle_t *, int);
    gres_t (*cuCtxSetCurrent)(ghandle_t);
    gres_t (*cuMemAlloc)(uint64_t *, size_t);
    gres_t (*cuMemFree)(uint64_t);
    gres_t (*cuMemAllocHost)(void **, size_t);
    gres_t (*cuMemFreeHost)(void *);
    gres_t (*cuStreamCreate)(ghandle_t *, unsigned);
    gres_t (*cuStreamSynchronize)(ghandle_t);
    gres_t (*cuMemcpyHtoDAsync)(uint64_t, const void *, size_t, ghandle_t);
    gres_t (*cuMemcpyDtoHAsync)(void *, uint64_t, size_t, ghandle_t);
    gres_t (*cuGetErrorString)(gres_t, const char **);
    /* HIP */
    gres_t (*hipInit)(unsigned);
    gres_t (*hipSetDevice)(int);
    gres_t (*hipMalloc)(void **, size_t);
    gres_t (*hipFree)(void *);
    gres_t (*hipHostMalloc)(void **, size_t, unsigned);
    gres_t (*hipHostFree)(void *);
    gres_t (*hipStreamCreateWithFlags)(ghandle_t *, unsigned);
    gres_t (*hipStreamSynchronize)(ghandle_t);
    gres_t (*hipMemcpyAsync)(void *, const void *, size_t, int, ghandle_t);
    const char *(*hipGetErrorString)(gres_t);
} g;

#define CU_STREAM_NON_BLOCKING  0x1
#define HIP_STREAM_NON_BLOCKING 0x1
#define HIP_MEMCPY_H2D          1
#define HIP_MEMCPY_D2H          2

static const char *gerr(gres_t r)
{
    const char *s = NULL;
    if (g.kind == KVD_MEM_CUDA && g.cuGetErrorString)
        g.cuGetErrorString(r, &s);
    else if (g.kind == KVD_MEM_HIP && g.hipGetErrorString)
        s = g.hipGetErrorString(r);
    return s ? s : "unknown error";
}

static bool gok(gres_t r, const char *what)
{
    if (r == 0)
        return true;
    fprintf(stderr, "kvdock-bench: %s failed: %d (%s)\n", what, r, gerr(r));
    return false;
}

/* Every symbol named, or the first missing one in why. */
static int bind_syms(const char *const *names, void **slots, size_t n, char *why,
                     size_t why_len)
{
    for (size_t i = 0; i < n; i++)
        if ((slots[i] = dlsym(g.lib, names[i])) == NULL) {
            snprintf(why, why_len, "the runtime has no %s", names[i]);
            return -1;
        }
    return 0;
}

static int open_cuda(char *why, size_t why_len)
{
    const char *path = getenv("KVDOCK_CUDA_LIBRARY");
    if (path == NULL || path[0] == '\0')
        path = "libcuda.so.1";
    if ((g.lib = dlopen(path, RTLD_NOW | RTLD_LOCAL)) == NULL) {
        snprintf(why, why_len, "cannot load the CUDA driver %s: %s", path, dlerror());
        return -1;
    }
    static const char *const names[] = {"cuInit",
                                        "cuDeviceGet",
                                        "cuDevicePrimaryCtxRetain",
                                        "cuCtxSetCurrent",
                                        "cuMemAlloc_v2",
                                        "cuMemFree_v2",
                                        "cuMemAllocHost_v2",
                                        "cuMemFreeHost",
                                        "cuStreamCreate",
                                        "cuStreamSynchronize",
                                        "cuMemcpyHtoDAsync_v2",
                                        "cuMemcpyDtoHAsync_v2"};
    void *slots[KVD_ARRAY_SIZE(names)];
    if (bind_syms(names, slots, KVD_ARRAY_SIZE(names), why, why_len) != 0)
        return -1;
    size_t i = 0;
    *(void **)&g.cuInit = slots[i++];
    *(void **)&g.cuDeviceGet = slots[i++];
    *(void **)&g.cuDevicePrimaryCtxRetain = slots[i++];
    *(void **)&g.cuCtxSetCurrent = slots[i++];
    *(void **)&g.cuMemAlloc = slots[i++];
    *(void **)&g.cuMemFree = slots[i++];
    *(void **)&g.cuMemAllocHost = slots[i++];
    *(void **)&g.cuMemFreeHost = slots[i++];
    *(void **)&g.cuStreamCreate = slots[i++];
    *(void **)&g.cuStreamSynchronize = slots[i++];
    *(void **)&g.cuMemcpyHtoDAsync = slots[i++];
    *(void **)&g.cuMemcpyDtoHAsync = slots[i++];
    /* for messages only */
    *(void **)&g.cuGetErrorString = dlsym(g.lib, "cuGetErrorString");
    *(void **)&g.cuDeviceGetName = dlsym(g.lib, "cuDeviceGetName");
    int dev = 0;
    ghandle_t ctx = NULL;
    gres_t r = g.cuInit(0);
    if (r == 0)
        r = g.cuDeviceGet(&dev, 0);
    if (r == 0)
        r = g.cuDevicePrimaryCtxRetain(&ctx, dev);
    if (r == 0)
        r = g.cuCtxSetCurrent(ctx);
    if (r == 0)
        r = g.cuStreamCreate(&g.stream, CU_STREAM_NON_BLOCKING);
    if (r != 0) {
        snprintf(why, why_len, "no CUDA device through %s: %d (%s)", path, r, gerr(r));
        return -1;
    }
    if (g.cuDeviceGetName == NULL || g.cuDeviceGetName(g.name, sizeof(g.name), dev) != 0)
        snprintf(g.name, sizeof(g.name), "%s", path);
    return 0;
}

static int open_hip(char *why, size_t why_len)
{
    const char *env = getenv("KVDOCK_HIP_LIBRARY");
    static const char *const defaults[] = {"libamdhip64.so.6", "libamdhip64.so.5",
                                           "libamdhip64.so"};
    const char *path = NULL;
    if (env != NULL && env[0] != '\0') {
        path = env;
        g.lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    }
    for (size_t i = 0; g.lib == NULL && path != env && i < KVD_ARRAY_SIZE(defaults); i++)
        g.lib = dlopen(path = defaults[i], RTLD_NOW | RTLD_LOCAL);
    if (g.lib == NULL) {
        snprintf(why, why_len, "cannot load the HIP runtime %s: %s",
                 path == env ? env : "libamdhip64.so(.6, .5)", dlerror());
        return -1;
    }
    static const char *const names[] = {"hipInit",
                                        "hipSetDevice",
                                        "hipMalloc",
                                        "hipFree",
                                        "hipHostMalloc",
                                        "hipHostFree",
                                        "hipStreamCreateWithFlags",
                                        "hipStreamSynchronize",
                                        "hipMemcpyAsync"};
    void *slots[KVD_ARRAY_SIZE(names)];
    if (bind_syms(names, slots, KVD_ARRAY_SIZE(names), why, why_len) != 0)
        return -1;
    size_t i = 0;
    *(void **)&g.hipInit = slots[i++];
    *(void **)&g.hipSetDevice = slots[i++];
    *(void **)&g.hipMalloc = slots[i++];
    *(void **)&g.hipFree = slots[i++];
    *(void **)&g.hipHostMalloc = slots[i++];
    *(void **)&g.hipHostFree = slots[i++];
    *(void **)&g.hipStreamCreateWithFlags = slots[i++];
    *(void **)&g.hipStreamSynchronize = slots[i++];
    *(void **)&g.hipMemcpyAsync = slots[i++];
    *(void **)&g.hipGetErrorString = dlsym(g.lib, "hipGetErrorString");
    gres_t r = g.hipInit(0);
    if (r == 0)
        r = g.hipSetDevice(0);
    if (r == 0)
        r = g.hipStreamCreateWithFlags(&g.stream, HIP_STREAM_NON_BLOCKING);
    if (r != 0) {
        snprintf(why, why_len, "no HIP device through %s: %d (%s)", path, r, gerr(r));
        return -1;
    }
    snprintf(g.name, sizeof(g.name), "%s", path);
    return 0;
}

int bgpu_open(kvd_memory_kind_t kind, char *why, size_t why_len)
{
    memset(&g, 0, sizeof(g));
    g.kind = kind;
    int rc = kind == KVD_MEM_CUDA  ? open_cuda(why, why_len)
             : kind == KVD_MEM_HIP ? open_hip(why, why_len)
                                   : -1;
    if (rc != 0)
        return -1;
    /* the tests' fake runtimes export their counters (tests/gpu/fake) */
    g.fake = dlsym(g.lib, "fakegpu_stats") != NULL;
    return 0;
}

const char *bgpu_name(void)
{
    return g.fake ? "fake runtime (tests/gpu/fake): the figures mean nothing" : g.name;
}

bool bgpu_is_fake(void)
{
    return g.fake;
}

void *bgpu_alloc(size_t n)
{
    if (g.kind == KVD_MEM_CUDA) {
        uint64_t d = 0;
        return gok(g.cuMemAlloc(&d, n), "cuMemAlloc") ? (void *)(uintptr_t)d : NULL;
    }
    void *p = NULL;
    return gok(g.hipMalloc(&p, n), "hipMalloc") ? p : NULL;
}

void bgpu_free(void *p)
{
    if (p == NULL)
        return;
    if (g.kind == KVD_MEM_CUDA)
        gok(g.cuMemFree((uint64_t)(uintptr_t)p), "cuMemFree");
    else
        gok(g.hipFree(p), "hipFree");
}

void *bgpu_alloc_host(size_t n)
{
    void *p = NULL;
    if (g.kind == KVD_MEM_CUDA)
        return gok(g.cuMemAllocHost(&p, n), "cuMemAllocHost") ? p : NULL;
    return gok(g.hipHostMalloc(&p, n, 0), "hipHostMalloc") ? p : NULL;
}

void bgpu_free_host(void *p)
{
    if (p == NULL)
        return;
    if (g.kind == KVD_MEM_CUDA)
        gok(g.cuMemFreeHost(p), "cuMemFreeHost");
    else
        gok(g.hipHostFree(p), "hipHostFree");
}

int bgpu_h2d(void *dev, const void *host, size_t n)
{
    if (g.kind == KVD_MEM_CUDA)
        return gok(g.cuMemcpyHtoDAsync((uint64_t)(uintptr_t)dev, host, n, g.stream),
                   "cuMemcpyHtoDAsync") &&
                       gok(g.cuStreamSynchronize(g.stream), "cuStreamSynchronize")
                   ? 0
                   : -1;
    return gok(g.hipMemcpyAsync(dev, host, n, HIP_MEMCPY_H2D, g.stream),
               "hipMemcpyAsync") &&
                   gok(g.hipStreamSynchronize(g.stream), "hipStreamSynchronize")
               ? 0
               : -1;
}

int bgpu_d2h(void *host, const void *dev, size_t n)
{
    if (g.kind == KVD_MEM_CUDA)
        return gok(g.cuMemcpyDtoHAsync(host, (uint64_t)(uintptr_t)dev, n, g.stream),
                   "cuMemcpyDtoHAsync") &&
                       gok(g.cuStreamSynchronize(g.stream), "cuStreamSynchronize")
                   ? 0
                   : -1;
    return gok(g.hipMemcpyAsync(host, dev, n, HIP_MEMCPY_D2H, g.stream),
               "hipMemcpyAsync") &&
                   gok(g.hipStreamSynchronize(g.stream), "hipStreamSynchronize")
               ? 0
               : -1;
}
