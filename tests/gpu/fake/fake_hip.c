/*
 * fake_hip.c: libfakehip.so, the HIP runtime calls that libkvdock and the
 * GPU tests make, on the host-memory engine of fakegpu_core.c. Prototypes
 * come from Debian's ROCm 5.2 hip_runtime_api.h (built with
 * __HIP_PLATFORM_AMD__), so they match libamdhip64's; the memory type
 * values are 5.2's (hipMemoryTypeHost 0, hipMemoryTypeDevice 1).
 *
 * HIP initializes itself on the first call and keeps a current device per
 * thread (0 until hipSetDevice), so no call needs a context. Streams of
 * either flag behave as non-blocking ones (no implicit sync with the
 * legacy stream); hipMemcpy runs on the legacy stream and waits for no
 * other. The copy kind must match the pointers (hipMemcpyDefault infers
 * it); host to host is refused, since no caller here means it.
 * hipHostRegister takes flag 0x8 as read-only, as ROCm 6's
 * hipHostRegisterReadOnly.
 */
#pragma GCC visibility push(default)
#include <hip/hip_runtime_api.h>
#include "fakegpu.h"
#pragma GCC visibility pop

#include "fakegpu_core.h"

#include <stdlib.h>

#define FAKE_API                    __attribute__((visibility("default")))
#define FAKE_HIP_REGISTER_READ_ONLY 0x8

static _Thread_local int current_device;

static hipError_t to_hip(fg_err_t e)
{
    switch (e) {
    case FG_OK: return hipSuccess;
    case FG_ERR_INVALID_VALUE: return hipErrorInvalidValue;
    case FG_ERR_OUT_OF_MEMORY: return hipErrorOutOfMemory;
    case FG_ERR_NOT_INITIALIZED: return hipErrorNotInitialized;
    case FG_ERR_NO_DEVICE: return hipErrorNoDevice;
    case FG_ERR_INVALID_DEVICE: return hipErrorInvalidDevice;
    case FG_ERR_INVALID_HANDLE: return hipErrorInvalidHandle;
    case FG_ERR_INVALID_CONTEXT: return hipErrorInvalidContext;
    case FG_ERR_NOT_READY: return hipErrorNotReady;
    case FG_ERR_ILLEGAL_ADDRESS: return hipErrorIllegalAddress;
    case FG_ERR_ALREADY_REGISTERED: return hipErrorHostMemoryAlreadyRegistered;
    case FG_ERR_NOT_REGISTERED: return hipErrorHostMemoryNotRegistered;
    case FG_ERR_NOT_SUPPORTED: return hipErrorNotSupported;
    }
    return hipErrorUnknown;
}

/* Every call returns through here: the code, counted when it is an error. */
static hipError_t ret(fg_err_t e)
{
    if (e != FG_OK && e != FG_ERR_NOT_READY)
        fg_count_error();
    return to_hip(e);
}

/* The implicit initialization every call makes. */
static fg_err_t ready(void)
{
    return fg_init();
}

static fg_stream_t *stream_of(hipStream_t h)
{
    return h == NULL ? fg_stream_legacy() : (fg_stream_t *)h;
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

/* ---- initialization, errors, devices ---- */

hipError_t hipInit(unsigned int flags)
{
    if (flags != 0)
        return ret(FG_ERR_INVALID_VALUE);
    return ret(ready());
}

hipError_t hipRuntimeGetVersion(int *runtimeVersion)
{
    if (runtimeVersion == NULL)
        return ret(FG_ERR_INVALID_VALUE);
    *runtimeVersion = 50221153; /* ROCm 5.2's HIP 5.2.21153 */
    return hipSuccess;
}

hipError_t hipDriverGetVersion(int *driverVersion)
{
    return hipRuntimeGetVersion(driverVersion);
}

const char *hipGetErrorName(hipError_t e)
{
    switch (e) {
    case hipSuccess: return "hipSuccess";
    case hipErrorInvalidValue: return "hipErrorInvalidValue";
    case hipErrorOutOfMemory: return "hipErrorOutOfMemory";
    case hipErrorNotInitialized: return "hipErrorNotInitialized";
    case hipErrorNoDevice: return "hipErrorNoDevice";
    case hipErrorInvalidDevice: return "hipErrorInvalidDevice";
    case hipErrorInvalidHandle: return "hipErrorInvalidHandle";
    case hipErrorInvalidContext: return "hipErrorInvalidContext";
    case hipErrorNotReady: return "hipErrorNotReady";
    case hipErrorIllegalAddress: return "hipErrorIllegalAddress";
    case hipErrorHostMemoryAlreadyRegistered:
        return "hipErrorHostMemoryAlreadyRegistered";
    case hipErrorHostMemoryNotRegistered: return "hipErrorHostMemoryNotRegistered";
    case hipErrorNotSupported: return "hipErrorNotSupported";
    default: return "hipErrorUnknown";
    }
}

const char *hipGetErrorString(hipError_t e)
{
    switch (e) {
    case hipSuccess: return "no error";
    case hipErrorInvalidValue: return "invalid argument";
    case hipErrorOutOfMemory: return "out of memory";
    case hipErrorNotInitialized: return "initialization error";
    case hipErrorNoDevice: return "no ROCm-capable device is detected";
    case hipErrorInvalidDevice: return "invalid device ordinal";
    case hipErrorInvalidHandle: return "invalid resource handle";
    case hipErrorInvalidContext: return "invalid device context";
    case hipErrorNotReady: return "device not ready";
    case hipErrorIllegalAddress: return "an illegal memory access was encountered";
    case hipErrorHostMemoryAlreadyRegistered:
        return "part or all of the requested memory range is already mapped";
    case hipErrorHostMemoryNotRegistered:
        return "pointer does not correspond to a registered memory region";
    case hipErrorNotSupported: return "operation not supported";
    default: return "unknown error";
    }
}

hipError_t hipGetDeviceCount(int *count)
{
    if (count == NULL)
        return ret(FG_ERR_INVALID_VALUE);
    fg_err_t e = ready();
    *count = e == FG_OK ? fg_device_count() : 0;
    return ret(e);
}

hipError_t hipSetDevice(int deviceId)
{
    fg_err_t e = ready();
    if (e != FG_OK)
        return ret(e);
    if (deviceId < 0 || deviceId >= fg_device_count())
        return ret(FG_ERR_INVALID_DEVICE);
    current_device = deviceId;
    return hipSuccess;
}

hipError_t hipGetDevice(int *deviceId)
{
    fg_err_t e = ready();
    if (e != FG_OK)
        return ret(e);
    if (deviceId == NULL)
        return ret(FG_ERR_INVALID_VALUE);
    *deviceId = current_device;
    return hipSuccess;
}

/* ---- pointers and memory ---- */

hipError_t hipPointerGetAttribute(void *data, hipPointer_attribute attribute,
                                  hipDeviceptr_t ptr)
{
    fg_err_t e = ready();
    if (e != FG_OK)
        return ret(e);
    if (data == NULL)
        return ret(FG_ERR_INVALID_VALUE);
    fg_ptr_info_t info;
    fg_pointer_info(ptr, &info);
    if (info.kind == FG_PTR_UNKNOWN)
        return ret(FG_ERR_INVALID_VALUE); /* ROCm knows no such pointer */
    switch (attribute) {
    case HIP_POINTER_ATTRIBUTE_MEMORY_TYPE:
        *(unsigned int *)data =
            info.kind == FG_PTR_DEVICE ? hipMemoryTypeDevice : hipMemoryTypeHost;
        break;
    case HIP_POINTER_ATTRIBUTE_DEVICE_ORDINAL: *(int *)data = info.device; break;
    case HIP_POINTER_ATTRIBUTE_RANGE_START_ADDR:
        *(void **)data = (void *)info.base;
        break;
    case HIP_POINTER_ATTRIBUTE_RANGE_SIZE: *(size_t *)data = info.size; break;
    case HIP_POINTER_ATTRIBUTE_IS_MANAGED: *(int *)data = 0; break;
    default: return ret(FG_ERR_NOT_SUPPORTED);
    }
    return hipSuccess;
}

hipError_t hipMalloc(void **ptr, size_t size)
{
    fg_err_t e = ready();
    if (e != FG_OK)
        return ret(e);
    if (ptr == NULL)
        return ret(FG_ERR_INVALID_VALUE);
    if (size == 0) {
        *ptr = NULL; /* HIP's answer to a zero-byte request */
        return hipSuccess;
    }
    return ret(fg_mem_alloc(current_device, size, ptr));
}

hipError_t hipFree(void *ptr)
{
    fg_err_t e = ready();
    if (e != FG_OK)
        return ret(e);
    return ptr == NULL ? hipSuccess : ret(fg_mem_free(ptr));
}

hipError_t hipHostMalloc(void **ptr, size_t size, unsigned int flags)
{
    (void)flags; /* coherence and NUMA hints change nothing on host memory */
    fg_err_t e = ready();
    return ret(e != FG_OK ? e : fg_host_alloc(size, ptr));
}

hipError_t hipHostFree(void *ptr)
{
    fg_err_t e = ready();
    if (e != FG_OK)
        return ret(e);
    return ptr == NULL ? hipSuccess : ret(fg_host_free(ptr));
}

hipError_t hipHostRegister(void *hostPtr, size_t sizeBytes, unsigned int flags)
{
    fg_err_t e = ready();
    if (e != FG_OK)
        return ret(e);
    const unsigned known = hipHostRegisterPortable | hipHostRegisterMapped |
                           hipHostRegisterIoMemory | FAKE_HIP_REGISTER_READ_ONLY;
    if ((flags & ~known) != 0)
        return ret(FG_ERR_INVALID_VALUE);
    return ret(
        fg_host_register(hostPtr, sizeBytes, (flags & FAKE_HIP_REGISTER_READ_ONLY) != 0));
}

hipError_t hipHostUnregister(void *hostPtr)
{
    fg_err_t e = ready();
    return ret(e != FG_OK ? e : fg_host_unregister(hostPtr));
}

/* ---- streams and events ---- */

hipError_t hipStreamCreateWithFlags(hipStream_t *stream, unsigned int flags)
{
    fg_err_t e = ready();
    if (e != FG_OK)
        return ret(e);
    if (stream == NULL || (flags & ~(unsigned)hipStreamNonBlocking) != 0)
        return ret(FG_ERR_INVALID_VALUE);
    fg_stream_t *s;
    e = fg_stream_create(current_device, &s);
    if (e == FG_OK)
        *stream = (hipStream_t)s;
    return ret(e);
}

hipError_t hipStreamDestroy(hipStream_t stream)
{
    fg_err_t e = ready();
    if (e != FG_OK)
        return ret(e);
    if (stream == NULL)
        return ret(FG_ERR_INVALID_HANDLE);
    return ret(fg_stream_destroy((fg_stream_t *)stream));
}

hipError_t hipStreamSynchronize(hipStream_t stream)
{
    fg_err_t e = ready();
    return ret(e != FG_OK ? e : fg_stream_sync(stream_of(stream)));
}

hipError_t hipStreamWaitEvent(hipStream_t stream, hipEvent_t event, unsigned int flags)
{
    fg_err_t e = ready();
    if (e != FG_OK)
        return ret(e);
    if (flags != 0)
        return ret(FG_ERR_INVALID_VALUE);
    return ret(fg_stream_wait_event(stream_of(stream), (fg_event_t *)event));
}

/* Adapts a hipStreamCallback_t to the engine's host function. */
struct callback_call {
    hipStreamCallback_t fn;
    hipStream_t stream;
    void *user;
};

static void callback_run(void *arg, fg_err_t status)
{
    struct callback_call call = *(struct callback_call *)arg;
    free(arg);
    call.fn(call.stream, to_hip(status), call.user);
}

hipError_t hipStreamAddCallback(hipStream_t stream, hipStreamCallback_t callback,
                                void *userData, unsigned int flags)
{
    fg_err_t e = ready();
    if (e != FG_OK)
        return ret(e);
    if (callback == NULL || flags != 0)
        return ret(FG_ERR_INVALID_VALUE);
    struct callback_call *call = malloc(sizeof(*call));
    if (call == NULL)
        return ret(FG_ERR_OUT_OF_MEMORY);
    *call = (struct callback_call){callback, stream, userData};
    e = fg_stream_host_fn(stream_of(stream), callback_run, call);
    if (e != FG_OK)
        free(call);
    return ret(e);
}

hipError_t hipEventCreateWithFlags(hipEvent_t *event, unsigned flags)
{
    fg_err_t e = ready();
    if (e != FG_OK)
        return ret(e);
    const unsigned known = hipEventBlockingSync | hipEventDisableTiming;
    if (event == NULL || (flags & ~known) != 0)
        return ret(FG_ERR_INVALID_VALUE);
    fg_event_t *ev;
    e = fg_event_create(&ev);
    if (e == FG_OK)
        *event = (hipEvent_t)ev;
    return ret(e);
}

hipError_t hipEventDestroy(hipEvent_t event)
{
    fg_err_t e = ready();
    return ret(e != FG_OK ? e : fg_event_destroy((fg_event_t *)event));
}

hipError_t hipEventRecord(hipEvent_t event, hipStream_t stream)
{
    fg_err_t e = ready();
    return ret(e != FG_OK ? e : fg_event_record((fg_event_t *)event, stream_of(stream)));
}

hipError_t hipEventQuery(hipEvent_t event)
{
    fg_err_t e = ready();
    return ret(e != FG_OK ? e : fg_event_query((fg_event_t *)event));
}

hipError_t hipEventSynchronize(hipEvent_t event)
{
    fg_err_t e = ready();
    return ret(e != FG_OK ? e : fg_event_sync((fg_event_t *)event));
}

/* ---- copies ---- */

/* The engine's direction for kind; FG_DIR_ANY for hipMemcpyDefault, and
 * false for host to host or an unknown kind. */
static bool dir_of(hipMemcpyKind kind, fg_dir_t *dir)
{
    switch (kind) {
    case hipMemcpyHostToDevice: *dir = FG_DIR_H2D; return true;
    case hipMemcpyDeviceToHost: *dir = FG_DIR_D2H; return true;
    case hipMemcpyDeviceToDevice: *dir = FG_DIR_D2D; return true;
    case hipMemcpyDefault: *dir = FG_DIR_ANY; return true;
    default: return false;
    }
}

hipError_t hipMemcpy(void *dst, const void *src, size_t sizeBytes, hipMemcpyKind kind)
{
    fg_err_t e = ready();
    if (e != FG_OK)
        return ret(e);
    fg_dir_t dir;
    if (!dir_of(kind, &dir))
        return ret(FG_ERR_INVALID_VALUE);
    return ret(fg_copy_sync(dst, src, sizeBytes, dir));
}

hipError_t hipMemcpyAsync(void *dst, const void *src, size_t sizeBytes,
                          hipMemcpyKind kind, hipStream_t stream)
{
    fg_err_t e = ready();
    if (e != FG_OK)
        return ret(e);
    fg_dir_t dir;
    if (!dir_of(kind, &dir))
        return ret(FG_ERR_INVALID_VALUE);
    if (sizeBytes == 0)
        return ret(fg_stream_check(stream_of(stream)));
    fg_copy_t c = {.dst = dst, .src = src, .size_bytes = sizeBytes};
    return ret(fg_copy_async(stream_of(stream), &c, 1, dir, false));
}
