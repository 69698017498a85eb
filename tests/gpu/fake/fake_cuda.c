/*
 * fake_cuda.c: libfakecuda.so.1, the CUDA driver API's calls that libkvdock
 * and the GPU tests make, on the host-memory engine of fakegpu_core.c.
 * Prototypes come from the toolkit's cuda.h, so they match libcuda's
 * exactly, and cuda.h's renames give each export libcuda's own name
 * (cuMemcpyHtoDAsync is cuMemcpyHtoDAsync_v2, and so on).
 *
 * Strict where a real driver is only sometimes unforgiving: every call
 * but cuInit, cuDriverGetVersion, cuGetError*, cuDevice* and cuCtx* needs
 * cuInit and a context current on the calling thread (a retained primary
 * context), else CUDA_ERROR_NOT_INITIALIZED or CUDA_ERROR_INVALID_CONTEXT:
 * a library thread that forgot to bind is caught. Streams of either flag
 * behave as CU_STREAM_NON_BLOCKING ones (no implicit sync with the legacy
 * stream), the synchronous copies run on the legacy stream and wait for no
 * other. cuMemcpyBatchAsync_v2 takes device-host pairs and device to
 * device, not host to host, and refuses the legacy stream, as the driver
 * documents.
 */
#pragma GCC visibility push(default)
#include <cuda.h>
#include "fakegpu.h"
#pragma GCC visibility pop

#include "fakegpu_core.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FAKE_API __attribute__((visibility("default")))

/* One primary context per device, retained by count. */
struct CUctx_st {
    int device;
    int refs;
};

static struct CUctx_st contexts[16];
static pthread_mutex_t ctx_lock = PTHREAD_MUTEX_INITIALIZER;
static _Thread_local CUcontext current;

static CUresult to_cu(fg_err_t e)
{
    switch (e) {
    case FG_OK: return CUDA_SUCCESS;
    case FG_ERR_INVALID_VALUE: return CUDA_ERROR_INVALID_VALUE;
    case FG_ERR_OUT_OF_MEMORY: return CUDA_ERROR_OUT_OF_MEMORY;
    case FG_ERR_NOT_INITIALIZED: return CUDA_ERROR_NOT_INITIALIZED;
    case FG_ERR_NO_DEVICE: return CUDA_ERROR_NO_DEVICE;
    case FG_ERR_INVALID_DEVICE: return CUDA_ERROR_INVALID_DEVICE;
    case FG_ERR_INVALID_HANDLE: return CUDA_ERROR_INVALID_HANDLE;
    case FG_ERR_INVALID_CONTEXT: return CUDA_ERROR_INVALID_CONTEXT;
    case FG_ERR_NOT_READY: return CUDA_ERROR_NOT_READY;
    case FG_ERR_ILLEGAL_ADDRESS: return CUDA_ERROR_ILLEGAL_ADDRESS;
    case FG_ERR_ALREADY_REGISTERED: return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
    case FG_ERR_NOT_REGISTERED: return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
    case FG_ERR_NOT_SUPPORTED: return CUDA_ERROR_NOT_SUPPORTED;
    }
    return CUDA_ERROR_UNKNOWN;
}

/* Every call returns through here: the code, counted when it is an error. */
static CUresult ret(fg_err_t e)
{
    if (e != FG_OK && e != FG_ERR_NOT_READY)
        fg_count_error();
    return to_cu(e);
}

/* FG_OK when the driver is initialized and the calling thread has a live
 * context current. */
static fg_err_t need_ctx(void)
{
    if (!fg_initialized())
        return FG_ERR_NOT_INITIALIZED;
    pthread_mutex_lock(&ctx_lock);
    bool live = current != NULL && current->refs > 0;
    pthread_mutex_unlock(&ctx_lock);
    return live ? FG_OK : FG_ERR_INVALID_CONTEXT;
}

/* The engine's stream for h: the legacy stream for NULL, CU_STREAM_LEGACY
 * and CU_STREAM_PER_THREAD. */
static fg_stream_t *stream_of(CUstream h)
{
    if (h == NULL || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD)
        return fg_stream_legacy();
    return (fg_stream_t *)h;
}

FAKE_API void fakegpu_stats(fakegpu_stats_t *out)
{
    fg_stats(out);
}

FAKE_API void fakegpu_stats_reset(void)
{
    fg_stats_reset();
}

FAKE_API int fakegpu_set(const char *knob, unsigned long long value)
{
    return fg_knob_set(knob, value);
}

/* ---- initialization, errors, devices, contexts ---- */

CUresult cuInit(unsigned int flags)
{
    if (flags != 0)
        return ret(FG_ERR_INVALID_VALUE);
    return ret(fg_init());
}

CUresult cuDriverGetVersion(int *version)
{
    if (version == NULL)
        return ret(FG_ERR_INVALID_VALUE);
    *version = 13000;
    return CUDA_SUCCESS;
}

static const struct {
    CUresult code;
    const char *name, *text;
} error_texts[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
    {CUDA_ERROR_ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS",
     "an illegal memory access was encountered"},
    {CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED,
     "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED",
     "part or all of the requested memory range is already mapped"},
    {CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED",
     "pointer does not correspond to a registered memory region"},
    {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

/* The entry of error_texts for code, or NULL. */
static int error_index(CUresult code)
{
    for (size_t i = 0; i < sizeof(error_texts) / sizeof(error_texts[0]); i++)
        if (error_texts[i].code == code)
            return (int)i;
    return -1;
}

CUresult cuGetErrorName(CUresult error, const char **str)
{
    int i = error_index(error);
    if (str == NULL)
        return ret(FG_ERR_INVALID_VALUE);
    *str = i < 0 ? NULL : error_texts[i].name;
    return i < 0 ? ret(FG_ERR_INVALID_VALUE) : CUDA_SUCCESS;
}

CUresult cuGetErrorString(CUresult error, const char **str)
{
    int i = error_index(error);
    if (str == NULL)
        return ret(FG_ERR_INVALID_VALUE);
    *str = i < 0 ? NULL : error_texts[i].text;
    return i < 0 ? ret(FG_ERR_INVALID_VALUE) : CUDA_SUCCESS;
}

CUresult cuDeviceGetCount(int *count)
{
    if (count == NULL)
        return ret(FG_ERR_INVALID_VALUE);
    if (!fg_initialized())
        return ret(FG_ERR_NOT_INITIALIZED);
    *count = fg_device_count();
    return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice *device, int ordinal)
{
    if (device == NULL)
        return ret(FG_ERR_INVALID_VALUE);
    if (!fg_initialized())
        return ret(FG_ERR_NOT_INITIALIZED);
    if (ordinal < 0 || ordinal >= fg_device_count())
        return ret(FG_ERR_INVALID_DEVICE);
    *device = ordinal;
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    if (pctx == NULL)
        return ret(FG_ERR_INVALID_VALUE);
    if (!fg_initialized())
        return ret(FG_ERR_NOT_INITIALIZED);
    if (dev < 0 || dev >= fg_device_count())
        return ret(FG_ERR_INVALID_DEVICE);
    pthread_mutex_lock(&ctx_lock);
    contexts[dev].device = dev;
    contexts[dev].refs++;
    pthread_mutex_unlock(&ctx_lock);
    *pctx = &contexts[dev];
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease(CUdevice dev)
{
    if (!fg_initialized())
        return ret(FG_ERR_NOT_INITIALIZED);
    if (dev < 0 || dev >= fg_device_count())
        return ret(FG_ERR_INVALID_DEVICE);
    pthread_mutex_lock(&ctx_lock);
    bool held = contexts[dev].refs > 0;
    if (held)
        contexts[dev].refs--;
    pthread_mutex_unlock(&ctx_lock);
    return held ? CUDA_SUCCESS : ret(FG_ERR_INVALID_CONTEXT);
}

CUresult cuCtxGetCurrent(CUcontext *pctx)
{
    if (pctx == NULL)
        return ret(FG_ERR_INVALID_VALUE);
    if (!fg_initialized())
        return ret(FG_ERR_NOT_INITIALIZED);
    *pctx = current;
    return CUDA_SUCCESS;
}

CUresult cuCtxSetCurrent(CUcontext ctx)
{
    if (!fg_initialized())
        return ret(FG_ERR_NOT_INITIALIZED);
    if (ctx != NULL && (ctx < &contexts[0] || ctx >= &contexts[16]))
        return ret(FG_ERR_INVALID_CONTEXT);
    current = ctx;
    return CUDA_SUCCESS;
}

/* ---- pointers and memory ---- */

CUresult cuPointerGetAttributes(unsigned int count, CUpointer_attribute *attributes,
                                void **data, CUdeviceptr ptr)
{
    fg_err_t e = need_ctx();
    if (e != FG_OK)
        return ret(e);
    if (count == 0 || attributes == NULL || data == NULL)
        return ret(FG_ERR_INVALID_VALUE);
    fg_ptr_info_t info;
    fg_pointer_info((const void *)(uintptr_t)ptr, &info);
    /* an unknown pointer is no error: type 0, everything else 0 */
    bool known = info.kind != FG_PTR_UNKNOWN;
    for (unsigned i = 0; i < count; i++) {
        if (data[i] == NULL)
            return ret(FG_ERR_INVALID_VALUE);
        switch (attributes[i]) {
        case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
            *(unsigned int *)data[i] = info.kind == FG_PTR_DEVICE ? CU_MEMORYTYPE_DEVICE
                                       : info.kind == FG_PTR_HOST_PINNED
                                           ? CU_MEMORYTYPE_HOST
                                           : 0;
            break;
        case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: *(int *)data[i] = info.device; break;
        case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
            *(CUdeviceptr *)data[i] = known ? (CUdeviceptr)info.base : 0;
            break;
        case CU_POINTER_ATTRIBUTE_RANGE_SIZE: *(size_t *)data[i] = info.size; break;
        case CU_POINTER_ATTRIBUTE_CONTEXT:
            *(CUcontext *)data[i] = known ? &contexts[info.device] : NULL;
            break;
        case CU_POINTER_ATTRIBUTE_IS_MANAGED: *(int *)data[i] = 0; break;
        /* cuMemAlloc'd memory, as cudaMalloc's: shareable by legacy IPC
         * (memory mapped with cuMemMap is not) */
        case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
            *(int *)data[i] = known;
            break;
        default:
            fprintf(stderr, "fakecuda: cuPointerGetAttributes: attribute %d not faked\n",
                    (int)attributes[i]);
            return ret(FG_ERR_NOT_SUPPORTED);
        }
    }
    return CUDA_SUCCESS;
}

CUresult cuMemAlloc(CUdeviceptr *dptr, size_t bytesize)
{
    fg_err_t e = need_ctx();
    if (e != FG_OK)
        return ret(e);
    if (dptr == NULL)
        return ret(FG_ERR_INVALID_VALUE);
    void *p;
    e = fg_mem_alloc(current->device, bytesize, &p);
    if (e == FG_OK)
        *dptr = (CUdeviceptr)(uintptr_t)p;
    return ret(e);
}

CUresult cuMemFree(CUdeviceptr dptr)
{
    fg_err_t e = need_ctx();
    if (e != FG_OK)
        return ret(e);
    return ret(fg_mem_free((void *)(uintptr_t)dptr));
}

CUresult cuMemAllocHost(void **pp, size_t bytesize)
{
    fg_err_t e = need_ctx();
    return ret(e != FG_OK ? e : fg_host_alloc(bytesize, pp));
}

CUresult cuMemFreeHost(void *p)
{
    fg_err_t e = need_ctx();
    return ret(e != FG_OK ? e : fg_host_free(p));
}

CUresult cuMemHostRegister(void *p, size_t bytesize, unsigned int flags)
{
    fg_err_t e = need_ctx();
    if (e != FG_OK)
        return ret(e);
    const unsigned known = CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP |
                           CU_MEMHOSTREGISTER_IOMEMORY | CU_MEMHOSTREGISTER_READ_ONLY;
    if ((flags & ~known) != 0)
        return ret(FG_ERR_INVALID_VALUE);
    return ret(
        fg_host_register(p, bytesize, (flags & CU_MEMHOSTREGISTER_READ_ONLY) != 0));
}

CUresult cuMemHostUnregister(void *p)
{
    fg_err_t e = need_ctx();
    return ret(e != FG_OK ? e : fg_host_unregister(p));
}

/* ---- streams and events ---- */

CUresult cuStreamCreate(CUstream *phStream, unsigned int flags)
{
    fg_err_t e = need_ctx();
    if (e != FG_OK)
        return ret(e);
    if (phStream == NULL || (flags & ~(unsigned)CU_STREAM_NON_BLOCKING) != 0)
        return ret(FG_ERR_INVALID_VALUE);
    fg_stream_t *s;
    e = fg_stream_create(current->device, &s);
    if (e == FG_OK)
        *phStream = (CUstream)s;
    return ret(e);
}

CUresult cuStreamDestroy(CUstream hStream)
{
    fg_err_t e = need_ctx();
    if (e != FG_OK)
        return ret(e);
    if (hStream == NULL || hStream == CU_STREAM_LEGACY || hStream == CU_STREAM_PER_THREAD)
        return ret(FG_ERR_INVALID_HANDLE);
    return ret(fg_stream_destroy((fg_stream_t *)hStream));
}

CUresult cuStreamSynchronize(CUstream hStream)
{
    fg_err_t e = need_ctx();
    return ret(e != FG_OK ? e : fg_stream_sync(stream_of(hStream)));
}

CUresult cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int flags)
{
    fg_err_t e = need_ctx();
    if (e != FG_OK)
        return ret(e);
    if (flags != CU_EVENT_WAIT_DEFAULT)
        return ret(FG_ERR_INVALID_VALUE);
    return ret(fg_stream_wait_event(stream_of(hStream), (fg_event_t *)hEvent));
}

/* Graph capture, as far as a caller can see it: a stream is marked
 * capturing between cuStreamBeginCapture and cuStreamEndCapture (no graph
 * is built: the fake captures nothing), so that callers' checks of
 * cuStreamIsCapturing can be tested. The capture modes are recorded per
 * thread and exchanged. */
#define CAPTURING_MAX 16
static pthread_mutex_t capture_lock = PTHREAD_MUTEX_INITIALIZER;
static CUstream capturing[CAPTURING_MAX];
static _Thread_local CUstreamCaptureMode thread_capture_mode =
    CU_STREAM_CAPTURE_MODE_GLOBAL;

CUresult cuStreamBeginCapture(CUstream hStream, CUstreamCaptureMode mode)
{
    (void)mode;
    fg_err_t e = need_ctx();
    if (e != FG_OK)
        return ret(e);
    if (hStream == NULL || hStream == CU_STREAM_LEGACY || hStream == CU_STREAM_PER_THREAD)
        return ret(FG_ERR_INVALID_VALUE); /* the legacy stream cannot capture */
    pthread_mutex_lock(&capture_lock);
    int slot = -1;
    for (int i = 0; i < CAPTURING_MAX; i++) {
        if (capturing[i] == hStream) {
            pthread_mutex_unlock(&capture_lock);
            return ret(FG_ERR_INVALID_VALUE); /* capturing already */
        }
        if (capturing[i] == NULL && slot < 0)
            slot = i;
    }
    if (slot >= 0)
        capturing[slot] = hStream;
    pthread_mutex_unlock(&capture_lock);
    return ret(slot >= 0 ? FG_OK : FG_ERR_NOT_SUPPORTED);
}

CUresult cuStreamEndCapture(CUstream hStream, CUgraph *phGraph)
{
    fg_err_t e = need_ctx();
    if (e != FG_OK)
        return ret(e);
    bool found = false;
    pthread_mutex_lock(&capture_lock);
    for (int i = 0; i < CAPTURING_MAX; i++)
        if (capturing[i] == hStream) {
            capturing[i] = NULL;
            found = true;
        }
    pthread_mutex_unlock(&capture_lock);
    if (phGraph != NULL)
        *phGraph = NULL;
    return ret(found ? FG_OK : FG_ERR_INVALID_VALUE);
}

CUresult cuStreamIsCapturing(CUstream hStream, CUstreamCaptureStatus *captureStatus)
{
    fg_err_t e = need_ctx();
    if (e != FG_OK)
        return ret(e);
    if (captureStatus == NULL)
        return ret(FG_ERR_INVALID_VALUE);
    bool yes = false;
    pthread_mutex_lock(&capture_lock);
    for (int i = 0; i < CAPTURING_MAX; i++)
        yes |= capturing[i] != NULL && capturing[i] == hStream;
    pthread_mutex_unlock(&capture_lock);
    *captureStatus =
        yes ? CU_STREAM_CAPTURE_STATUS_ACTIVE : CU_STREAM_CAPTURE_STATUS_NONE;
    return CUDA_SUCCESS;
}

CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode *mode)
{
    if (mode == NULL)
        return ret(FG_ERR_INVALID_VALUE);
    CUstreamCaptureMode was = thread_capture_mode;
    thread_capture_mode = *mode;
    *mode = was;
    return CUDA_SUCCESS;
}

/* Adapts a CUhostFn to the engine's host function. */
struct host_fn_call {
    CUhostFn fn;
    void *user;
};

static void host_fn_run(void *arg, fg_err_t status)
{
    (void)status;
    struct host_fn_call call = *(struct host_fn_call *)arg;
    free(arg);
    call.fn(call.user);
}

CUresult cuLaunchHostFunc(CUstream hStream, CUhostFn fn, void *userData)
{
    fg_err_t e = need_ctx();
    if (e != FG_OK)
        return ret(e);
    if (fn == NULL)
        return ret(FG_ERR_INVALID_VALUE);
    struct host_fn_call *call = malloc(sizeof(*call));
    if (call == NULL)
        return ret(FG_ERR_OUT_OF_MEMORY);
    *call = (struct host_fn_call){fn, userData};
    e = fg_stream_host_fn(stream_of(hStream), host_fn_run, call);
    if (e != FG_OK)
        free(call);
    return ret(e);
}

CUresult cuEventCreate(CUevent *phEvent, unsigned int flags)
{
    fg_err_t e = need_ctx();
    if (e != FG_OK)
        return ret(e);
    const unsigned known = CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING;
    if (phEvent == NULL || (flags & ~known) != 0)
        return ret(FG_ERR_INVALID_VALUE);
    fg_event_t *ev;
    e = fg_event_create(&ev);
    if (e == FG_OK)
        *phEvent = (CUevent)ev;
    return ret(e);
}

CUresult cuEventDestroy(CUevent hEvent)
{
    fg_err_t e = need_ctx();
    return ret(e != FG_OK ? e : fg_event_destroy((fg_event_t *)hEvent));
}

CUresult cuEventRecord(CUevent hEvent, CUstream hStream)
{
    fg_err_t e = need_ctx();
    return ret(e != FG_OK ? e
                          : fg_event_record((fg_event_t *)hEvent, stream_of(hStream)));
}

CUresult cuEventQuery(CUevent hEvent)
{
    fg_err_t e = need_ctx();
    return ret(e != FG_OK ? e : fg_event_query((fg_event_t *)hEvent));
}

CUresult cuEventSynchronize(CUevent hEvent)
{
    fg_err_t e = need_ctx();
    return ret(e != FG_OK ? e : fg_event_sync((fg_event_t *)hEvent));
}

/* ---- copies ---- */

/* One copy through the engine, async on s or (s NULL) synchronous. */
static CUresult copy_one(void *dst, const void *src, size_t n, fg_dir_t dir, CUstream s,
                         bool async)
{
    fg_err_t e = need_ctx();
    if (e != FG_OK)
        return ret(e);
    if (!async)
        return ret(fg_copy_sync(dst, src, n, dir));
    if (n == 0)
        return ret(fg_stream_check(stream_of(s)));
    fg_copy_t c = {.dst = dst, .src = src, .size_bytes = n};
    return ret(fg_copy_async(stream_of(s), &c, 1, dir, false));
}

CUresult cuMemcpyHtoD(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount)
{
    return copy_one((void *)(uintptr_t)dstDevice, srcHost, ByteCount, FG_DIR_H2D, NULL,
                    false);
}

CUresult cuMemcpyDtoH(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount)
{
    return copy_one(dstHost, (const void *)(uintptr_t)srcDevice, ByteCount, FG_DIR_D2H,
                    NULL, false);
}

CUresult cuMemcpyHtoDAsync(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount,
                           CUstream hStream)
{
    return copy_one((void *)(uintptr_t)dstDevice, srcHost, ByteCount, FG_DIR_H2D, hStream,
                    true);
}

CUresult cuMemcpyDtoHAsync(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount,
                           CUstream hStream)
{
    return copy_one(dstHost, (const void *)(uintptr_t)srcDevice, ByteCount, FG_DIR_D2H,
                    hStream, true);
}

CUresult cuMemcpyBatchAsync(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes,
                            size_t count, CUmemcpyAttributes *attrs, size_t *attrsIdxs,
                            size_t numAttrs, CUstream hStream)
{
    fg_err_t e = need_ctx();
    if (e != FG_OK)
        return ret(e);
    if (hStream == NULL || hStream == CU_STREAM_LEGACY)
        return ret(FG_ERR_INVALID_VALUE); /* "must not be legacy NULL stream" */
    if (count == 0 || dsts == NULL || srcs == NULL || sizes == NULL || attrs == NULL ||
        attrsIdxs == NULL || numAttrs == 0 || numAttrs > count || attrsIdxs[0] != 0)
        return ret(FG_ERR_INVALID_VALUE);
    for (size_t k = 0; k < numAttrs; k++) {
        if ((k > 0 && attrsIdxs[k] <= attrsIdxs[k - 1]) || attrsIdxs[k] >= count)
            return ret(FG_ERR_INVALID_VALUE);
        CUmemcpySrcAccessOrder order = attrs[k].srcAccessOrder;
        if (order != CU_MEMCPY_SRC_ACCESS_ORDER_STREAM &&
            order != CU_MEMCPY_SRC_ACCESS_ORDER_DURING_API_CALL &&
            order != CU_MEMCPY_SRC_ACCESS_ORDER_ANY)
            return ret(FG_ERR_INVALID_VALUE);
    }
    fg_copy_t *copies = calloc(count, sizeof(*copies));
    if (copies == NULL)
        return ret(FG_ERR_OUT_OF_MEMORY);
    size_t k = 0;
    for (size_t i = 0; i < count; i++) {
        while (k + 1 < numAttrs && attrsIdxs[k + 1] <= i)
            k++;
        copies[i].dst = (void *)(uintptr_t)dsts[i];
        copies[i].src = (const void *)(uintptr_t)srcs[i];
        copies[i].size_bytes = sizes[i];
        copies[i].src_now =
            attrs[k].srcAccessOrder == CU_MEMCPY_SRC_ACCESS_ORDER_DURING_API_CALL;
    }
    e = fg_copy_async(stream_of(hStream), copies, count, FG_DIR_ANY, true);
    free(copies);
    return ret(e);
}

/* CUDA 12.8's signature, which libcuda keeps exporting under the plain
 * name beside the _v2 one: the index of the failing copy in failIdx. The
 * engine checks a batch as a whole, so a refused batch reports SIZE_MAX
 * (no particular copy), as the driver does for errors that name none. */
#undef cuMemcpyBatchAsync
FAKE_API CUresult cuMemcpyBatchAsync(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes,
                                     size_t count, CUmemcpyAttributes *attrs,
                                     size_t *attrsIdxs, size_t numAttrs, size_t *failIdx,
                                     CUstream hStream);

CUresult cuMemcpyBatchAsync(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes,
                            size_t count, CUmemcpyAttributes *attrs, size_t *attrsIdxs,
                            size_t numAttrs, size_t *failIdx, CUstream hStream)
{
    CUresult r = cuMemcpyBatchAsync_v2(dsts, srcs, sizes, count, attrs, attrsIdxs,
                                       numAttrs, hStream);
    if (failIdx != NULL)
        *failIdx = SIZE_MAX;
    return r;
}

/* cuGetProcAddress (cuda.h's name for cuGetProcAddress_v2): the entry point
 * of a base name as a caller built for cudaVersion sees it. The one that
 * differs by version here is cuMemcpyBatchAsync: 12.8's signature (with
 * failIdx) below 13000, the _v2 one from 13000. Every other name resolves
 * to its _v2 export where there is one, else to the plain name. */
CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion,
                          cuuint64_t flags, CUdriverProcAddressQueryResult *symbolStatus)
{
    (void)flags; /* no per-thread default stream variants are faked */
    if (symbol == NULL || pfn == NULL)
        return ret(FG_ERR_INVALID_VALUE);
    *pfn = NULL;
    if (symbolStatus != NULL)
        *symbolStatus = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    if (strcmp(symbol, "cuMemcpyBatchAsync") == 0) {
        if (cudaVersion < 12080) {
            if (symbolStatus != NULL)
                *symbolStatus = CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
            return ret(FG_ERR_NOT_SUPPORTED);
        }
        *pfn = cudaVersion >= 13000 ? (void *)cuMemcpyBatchAsync_v2
                                    : (void *)cuMemcpyBatchAsync;
    } else {
        Dl_info self;
        void *lib = NULL;
        if (dladdr((void *)cuInit, &self) != 0)
            lib = dlopen(self.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
        char v2[128];
        if (lib != NULL && snprintf(v2, sizeof(v2), "%s_v2", symbol) < (int)sizeof(v2))
            *pfn = dlsym(lib, v2);
        if (lib != NULL && *pfn == NULL)
            *pfn = dlsym(lib, symbol);
        if (lib != NULL)
            dlclose(lib);
    }
    if (*pfn == NULL)
        return ret(FG_ERR_NOT_SUPPORTED);
    if (symbolStatus != NULL)
        *symbolStatus = CU_GET_PROC_ADDRESS_SUCCESS;
    return CUDA_SUCCESS;
}
