/*
 * gpu_cuda.c - the CUDA front end of the device kinds: the driver API
 * (libcuda.so.1, which every NVIDIA driver installs; not the runtime
 * library, which engines bundle in versions of their own), loaded with
 * dlopen and called through the symbols the driver exports (the _v2 names
 * cuda.h maps its calls to). cuda.h is used for the types only.
 *
 * Contexts: the device's primary context (the one the CUDA runtime, and
 * so PyTorch, uses), retained once for the process and made current around
 * each call on threads that may be the engine's, then restored.
 *
 * cuMemcpyBatchAsync: CUDA 13 exports the form without failIdx as
 * cuMemcpyBatchAsync_v2; 12.8 exported it, with failIdx, as
 * cuMemcpyBatchAsync. The one found decides; neither: a loop of
 * cuMemcpy*Async.
 */
#include "gpu_int.h"

#include <cuda.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

typedef CUresult (*fn_init_t)(unsigned);
typedef CUresult (*fn_version_t)(int *);
typedef CUresult (*fn_errstr_t)(CUresult, const char **);
typedef CUresult (*fn_count_t)(int *);
typedef CUresult (*fn_devget_t)(CUdevice *, int);
typedef CUresult (*fn_retain_t)(CUcontext *, CUdevice);
typedef CUresult (*fn_ctxget_t)(CUcontext *);
typedef CUresult (*fn_ctxset_t)(CUcontext);
typedef CUresult (*fn_ptrattrs_t)(unsigned, CUpointer_attribute *, void **, CUdeviceptr);
typedef CUresult (*fn_streamcreate_t)(CUstream *, unsigned);
typedef CUresult (*fn_stream_t)(CUstream);
typedef CUresult (*fn_streamwait_t)(CUstream, CUevent, unsigned);
typedef CUresult (*fn_eventcreate_t)(CUevent *, unsigned);
typedef CUresult (*fn_event_t)(CUevent);
typedef CUresult (*fn_record_t)(CUevent, CUstream);
typedef CUresult (*fn_h2d_t)(CUdeviceptr, const void *, size_t, CUstream);
typedef CUresult (*fn_d2h_t)(void *, CUdeviceptr, size_t, CUstream);
typedef CUresult (*fn_batch13_t)(CUdeviceptr *, CUdeviceptr *, size_t *, size_t,
                                 CUmemcpyAttributes *, size_t *, size_t, CUstream);
typedef CUresult (*fn_batch128_t)(CUdeviceptr *, CUdeviceptr *, size_t *, size_t,
                                  CUmemcpyAttributes *, size_t *, size_t, size_t *,
                                  CUstream);
typedef CUresult (*fn_hostreg_t)(void *, size_t, unsigned);
typedef CUresult (*fn_hostunreg_t)(void *);
typedef CUresult (*fn_allochost_t)(void **, size_t);
typedef CUresult (*fn_capturing_t)(CUstream, CUstreamCaptureStatus *);
typedef CUresult (*fn_capmode_t)(CUstreamCaptureMode *);

static struct {
    fn_init_t init;
    fn_version_t version;
    fn_errstr_t err_name, err_string;
    fn_count_t count;
    fn_devget_t device_get;
    fn_retain_t retain;
    fn_ctxget_t ctx_get;
    fn_ctxset_t ctx_set;
    fn_ptrattrs_t ptr_attrs;
    fn_streamcreate_t stream_create;
    fn_stream_t stream_destroy, stream_sync;
    fn_streamwait_t stream_wait;
    fn_eventcreate_t event_create;
    fn_event_t event_destroy, event_query, event_sync;
    fn_record_t event_record;
    fn_h2d_t h2d;
    fn_d2h_t d2h;
    fn_batch13_t batch13;
    fn_batch128_t batch128;
    fn_hostreg_t host_register;
    fn_hostunreg_t host_unregister;
    fn_allochost_t alloc_host;
    fn_hostunreg_t free_host;
    fn_capturing_t capturing; /* optional */
    fn_capmode_t capmode;     /* optional */
    /* retained primary contexts, by ordinal (retained once each) */
    pthread_mutex_t dev_lock;
    CUcontext dev[64];
} cu = {.dev_lock = PTHREAD_MUTEX_INITIALIZER};

static void cu_err(int rc, char *buf, size_t cap)
{
    const char *name = NULL, *text = NULL;
    if (cu.err_name == NULL || cu.err_name((CUresult)rc, &name) != CUDA_SUCCESS)
        name = NULL;
    if (cu.err_string == NULL || cu.err_string((CUresult)rc, &text) != CUDA_SUCCESS)
        text = NULL;
    if (name != NULL)
        snprintf(buf, cap, "%s (%s)", name, text ? text : "no text");
    else
        snprintf(buf, cap, "CUDA error %d", rc);
}

static int cu_pointer(const void *p, kvd_gpu_pointer_t *out)
{
    CUpointer_attribute attrs[] = {
        CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
        CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, CU_POINTER_ATTRIBUTE_RANGE_SIZE};
    unsigned type = 0;
    int ordinal = -1;
    CUdeviceptr start = 0;
    size_t size = 0;
    void *data[] = {&type, &ordinal, &start, &size};
    /* unlike cuPointerGetAttribute, a pointer the driver does not know is
     * no error: its attributes read as zero */
    CUresult rc = cu.ptr_attrs(4, attrs, data, (CUdeviceptr)(uintptr_t)p);
    if (rc != CUDA_SUCCESS)
        return (int)rc;
    *out = (kvd_gpu_pointer_t){.device = type == CU_MEMORYTYPE_DEVICE,
                               .ordinal = ordinal,
                               .alloc_base = (uintptr_t)start,
                               .alloc_len = size};
    /* cudaMalloc'd memory can be shared by legacy IPC, memory mapped
     * with cuMemMap cannot: asked alone, since a driver that lacks the
     * attribute fails the whole query */
    CUpointer_attribute ipc_attr = CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE;
    int ipc = 1;
    void *ipc_data = &ipc;
    if (out->device &&
        cu.ptr_attrs(1, &ipc_attr, &ipc_data, (CUdeviceptr)(uintptr_t)p) == CUDA_SUCCESS)
        out->pieces = ipc == 0;
    return 0;
}

static int cu_device(int ordinal, void **dev)
{
    if (ordinal < 0 || ordinal >= 64)
        return (int)CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&cu.dev_lock);
    CUresult rc = CUDA_SUCCESS;
    if (cu.dev[ordinal] == NULL) {
        CUdevice d;
        rc = cu.device_get(&d, ordinal);
        CUcontext ctx = NULL;
        if (rc == CUDA_SUCCESS)
            rc = cu.retain(&ctx, d); /* kept for the process: engines share it */
        if (rc == CUDA_SUCCESS)
            cu.dev[ordinal] = ctx;
    }
    *dev = cu.dev[ordinal];
    pthread_mutex_unlock(&cu.dev_lock);
    return (int)rc;
}

static int cu_capturing(void *s, bool *yes)
{
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    CUresult rc = cu.capturing((CUstream)s, &st);
    /* the legacy stream while another one captures: its use would join
     * the capture (the status is unspecified then) */
    *yes = rc == CUDA_ERROR_STREAM_CAPTURE_IMPLICIT ||
           (rc == CUDA_SUCCESS && st != CU_STREAM_CAPTURE_STATUS_NONE);
    return rc == CUDA_ERROR_STREAM_CAPTURE_IMPLICIT ? 0 : (int)rc;
}

static void cu_relaxed(int *old)
{
    CUstreamCaptureMode m = CU_STREAM_CAPTURE_MODE_RELAXED;
    *old = cu.capmode(&m) == CUDA_SUCCESS ? (int)m : -1;
}

static void cu_restore(int old)
{
    CUstreamCaptureMode m = (CUstreamCaptureMode)old;
    if (old >= 0)
        (void)cu.capmode(&m);
}

static int cu_bind(void *dev, void **saved)
{
    CUcontext cur = NULL;
    CUresult rc = cu.ctx_get(&cur);
    if (rc != CUDA_SUCCESS)
        return (int)rc;
    *saved = cur;
    return cur == (CUcontext)dev ? 0 : (int)cu.ctx_set((CUcontext)dev);
}

static void cu_unbind(void *saved)
{
    CUcontext cur = NULL;
    if (cu.ctx_get(&cur) == CUDA_SUCCESS && cur != (CUcontext)saved)
        (void)cu.ctx_set((CUcontext)saved);
}

static int cu_stream_create(void **s)
{
    return (int)cu.stream_create((CUstream *)s, CU_STREAM_NON_BLOCKING);
}

static int cu_stream_destroy(void *s)
{
    return (int)cu.stream_destroy((CUstream)s);
}

static int cu_stream_sync(void *s)
{
    return (int)cu.stream_sync((CUstream)s);
}

static int cu_stream_wait(void *s, void *ev)
{
    return (int)cu.stream_wait((CUstream)s, (CUevent)ev, 0);
}

static int cu_event_create(void **ev)
{
    return (int)cu.event_create((CUevent *)ev, CU_EVENT_DISABLE_TIMING);
}

static int cu_event_destroy(void *ev)
{
    return (int)cu.event_destroy((CUevent)ev);
}

static int cu_event_record(void *ev, void *s)
{
    return (int)cu.event_record((CUevent)ev, (CUstream)s);
}

static int cu_event_query(void *ev)
{
    return (int)cu.event_query((CUevent)ev);
}

static int cu_event_sync(void *ev)
{
    return (int)cu.event_sync((CUevent)ev);
}

static int cu_h2d(void *dst, const void *src, size_t n, void *s)
{
    return (int)cu.h2d((CUdeviceptr)(uintptr_t)dst, src, n, (CUstream)s);
}

static int cu_d2h(void *dst, const void *src, size_t n, void *s)
{
    return (int)cu.d2h(dst, (CUdeviceptr)(uintptr_t)src, n, (CUstream)s);
}

#define CU_BATCH_MAX 256 /* copies per cuMemcpyBatchAsync call (arrays on the stack) */

static int cu_batch(const kvd_copy_t *v, size_t n, bool h2d, int ordinal, void *s)
{
    CUdeviceptr dsts[CU_BATCH_MAX], srcs[CU_BATCH_MAX];
    size_t sizes[CU_BATCH_MAX];
    /* one attribute for every copy: the source is read in stream order
     * (the rows a copy reads were written before it on this stream or one
     * it waits for), the locations as hints */
    CUmemcpyAttributes attr = {0};
    attr.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
    attr.srcLocHint.type = h2d ? CU_MEM_LOCATION_TYPE_HOST : CU_MEM_LOCATION_TYPE_DEVICE;
    attr.srcLocHint.id = h2d ? 0 : ordinal;
    attr.dstLocHint.type = h2d ? CU_MEM_LOCATION_TYPE_DEVICE : CU_MEM_LOCATION_TYPE_HOST;
    attr.dstLocHint.id = h2d ? ordinal : 0;
    size_t attr_idx = 0;
    for (size_t done = 0; done < n;) {
        size_t k = n - done < CU_BATCH_MAX ? n - done : CU_BATCH_MAX;
        for (size_t i = 0; i < k; i++) {
            dsts[i] = (CUdeviceptr)(uintptr_t)v[done + i].dst;
            srcs[i] = (CUdeviceptr)(uintptr_t)v[done + i].src;
            sizes[i] = v[done + i].n;
        }
        CUresult rc;
        if (cu.batch13 != NULL) {
            rc = cu.batch13(dsts, srcs, sizes, k, &attr, &attr_idx, 1, (CUstream)s);
        } else {
            size_t fail_idx = 0;
            rc = cu.batch128(dsts, srcs, sizes, k, &attr, &attr_idx, 1, &fail_idx,
                             (CUstream)s);
        }
        if (rc != CUDA_SUCCESS)
            return (int)rc;
        done += k;
    }
    return 0;
}

static int cu_host_register(void *p, size_t n, bool read_only)
{
    /* PORTABLE: every context may use it; READ_ONLY for a mapping the
     * daemon gave read-only (the device only reads it) */
    unsigned flags = CU_MEMHOSTREGISTER_PORTABLE;
    if (read_only)
        flags |= CU_MEMHOSTREGISTER_READ_ONLY;
    return (int)cu.host_register(p, n, flags);
}

static int cu_host_unregister(void *p)
{
    return (int)cu.host_unregister(p);
}

static int cu_host_alloc(void **p, size_t n)
{
    return (int)cu.alloc_host(p, n);
}

static int cu_host_free(void *p)
{
    return (int)cu.free_host(p);
}

static gpu_api_t cuda_api = {
    .name = "CUDA",
    .pointer = cu_pointer,
    .device = cu_device,
    .bind = cu_bind,
    .unbind = cu_unbind,
    .stream_create = cu_stream_create,
    .stream_destroy = cu_stream_destroy,
    .stream_sync = cu_stream_sync,
    .stream_wait = cu_stream_wait,
    .event_create = cu_event_create,
    .event_destroy = cu_event_destroy,
    .event_record = cu_event_record,
    .event_query = cu_event_query,
    .not_ready = CUDA_ERROR_NOT_READY,
    .event_sync = cu_event_sync,
    .h2d = cu_h2d,
    .d2h = cu_d2h,
    .batch = NULL, /* set when the driver has it */
    .host_register = cu_host_register,
    .host_unregister = cu_host_unregister,
    .host_alloc = cu_host_alloc,
    .host_free = cu_host_free,
    .err = cu_err,
    .legacy_stream = CU_STREAM_LEGACY,
};

static pthread_once_t once = PTHREAD_ONCE_INIT;
static const gpu_api_t *loaded;
static int load_status;
static char load_why[512];

#define SYM(field, name)                         \
    do {                                         \
        *(void **)&cu.field = dlsym(lib, name);  \
        if (cu.field == NULL && missing == NULL) \
            missing = name;                      \
    } while (0)

static void load_once(void)
{
    static const char *const names[] = {"libcuda.so.1", "libcuda.so", NULL};
    void *lib = kvd_gpu_dlopen("KVDOCK_CUDA_LIBRARY", names, load_why, sizeof(load_why));
    load_status = KVD_ERR_NO_DEVICE;
    if (lib == NULL)
        return;
    const char *missing = NULL;
    SYM(init, "cuInit");
    SYM(version, "cuDriverGetVersion");
    SYM(err_name, "cuGetErrorName");
    SYM(err_string, "cuGetErrorString");
    SYM(count, "cuDeviceGetCount");
    SYM(device_get, "cuDeviceGet");
    SYM(retain, "cuDevicePrimaryCtxRetain");
    SYM(ctx_get, "cuCtxGetCurrent");
    SYM(ctx_set, "cuCtxSetCurrent");
    SYM(ptr_attrs, "cuPointerGetAttributes");
    SYM(stream_create, "cuStreamCreate");
    SYM(stream_destroy, "cuStreamDestroy_v2");
    SYM(stream_sync, "cuStreamSynchronize");
    SYM(stream_wait, "cuStreamWaitEvent");
    SYM(event_create, "cuEventCreate");
    SYM(event_destroy, "cuEventDestroy_v2");
    SYM(event_record, "cuEventRecord");
    SYM(event_query, "cuEventQuery");
    SYM(event_sync, "cuEventSynchronize");
    SYM(h2d, "cuMemcpyHtoDAsync_v2");
    SYM(d2h, "cuMemcpyDtoHAsync_v2");
    SYM(host_register, "cuMemHostRegister_v2");
    SYM(host_unregister, "cuMemHostUnregister");
    SYM(alloc_host, "cuMemAllocHost_v2");
    SYM(free_host, "cuMemFreeHost");
    if (missing != NULL) {
        snprintf(load_why, sizeof(load_why), "the CUDA driver library lacks %s", missing);
        return;
    }
    CUresult rc = cu.init(0);
    int count = 0, version = 0;
    if (rc == CUDA_SUCCESS)
        rc = cu.count(&count);
    if (rc != CUDA_SUCCESS) {
        char e[160];
        cu_err((int)rc, e, sizeof(e));
        snprintf(load_why, sizeof(load_why), "CUDA: cuInit: %s", e);
        return;
    }
    if (count == 0) {
        snprintf(load_why, sizeof(load_why), "CUDA: the driver sees no device");
        return;
    }
    (void)cu.version(&version);
    *(void **)&cu.capturing = dlsym(lib, "cuStreamIsCapturing");
    *(void **)&cu.capmode = dlsym(lib, "cuThreadExchangeStreamCaptureMode");
    if (cu.capturing != NULL)
        cuda_api.capturing = cu_capturing;
    if (cu.capmode != NULL) {
        cuda_api.relaxed = cu_relaxed;
        cuda_api.restore = cu_restore;
    }
    *(void **)&cu.batch13 = dlsym(lib, "cuMemcpyBatchAsync_v2");
    if (cu.batch13 == NULL && version >= 12080)
        *(void **)&cu.batch128 = dlsym(lib, "cuMemcpyBatchAsync");
    if (cu.batch13 != NULL || cu.batch128 != NULL)
        cuda_api.batch = cu_batch;
    load_status = KVD_OK;
    loaded = &cuda_api;
    snprintf(load_why, sizeof(load_why), "CUDA driver %d.%d, %d device(s)%s",
             version / 1000, version % 1000 / 10, count,
             cuda_api.batch ? ", cuMemcpyBatchAsync" : "");
}

const gpu_api_t *kvd_gpu_cuda_load(int *status, char *why, size_t cap)
{
    pthread_once(&once, load_once);
    *status = load_status;
    if (why != NULL && cap > 0)
        snprintf(why, cap, "%s", load_why);
    return loaded;
}
