/*
 * gpu_hip.c - the ROCm HIP front end of the device kinds: libamdhip64
 * loaded with dlopen, called through dlsym'd pointers; the header is used
 * for the types only (with __HIP_PLATFORM_AMD__).
 *
 * The current device is per thread (hipSetDevice), set around each call
 * and restored, since the calling thread may be the engine's.
 *
 * hipPointerGetAttribute's memory type changed its numbering in ROCm 6
 * (hipMemoryTypeUnregistered 0, Host 1, Device 2, as CUDA's); before, Host
 * was 0 and Device 1. The runtime's version decides which is meant.
 */
#define __HIP_PLATFORM_AMD__ 1
#include "gpu_int.h"

#include <dlfcn.h>
#include <hip/hip_runtime_api.h>
#include <pthread.h>
#include <stdio.h>

static struct {
    hipError_t (*init)(unsigned);
    hipError_t (*version)(int *);
    const char *(*err_name)(hipError_t);
    const char *(*err_string)(hipError_t);
    hipError_t (*count)(int *);
    hipError_t (*set_device)(int);
    hipError_t (*get_device)(int *);
    hipError_t (*ptr_attr)(void *, hipPointer_attribute, hipDeviceptr_t);
    hipError_t (*stream_create)(hipStream_t *, unsigned);
    hipError_t (*stream_destroy)(hipStream_t);
    hipError_t (*stream_sync)(hipStream_t);
    hipError_t (*stream_wait)(hipStream_t, hipEvent_t, unsigned);
    hipError_t (*event_create)(hipEvent_t *, unsigned);
    hipError_t (*event_destroy)(hipEvent_t);
    hipError_t (*event_record)(hipEvent_t, hipStream_t);
    hipError_t (*event_query)(hipEvent_t);
    hipError_t (*event_sync)(hipEvent_t);
    hipError_t (*memcpy_async)(void *, const void *, size_t, hipMemcpyKind, hipStream_t);
    hipError_t (*host_register)(void *, size_t, unsigned);
    hipError_t (*host_unregister)(void *);
    hipError_t (*host_malloc)(void **, size_t, unsigned);
    hipError_t (*host_free)(void *);
    hipError_t (*last_error)(void);                                 /* optional */
    hipError_t (*capturing)(hipStream_t, hipStreamCaptureStatus *); /* optional */
    hipError_t (*capmode)(hipStreamCaptureMode *);                  /* optional */
    unsigned device_type; /* the memory type value of device memory */
} hp;

static void hip_err(int rc, char *buf, size_t cap)
{
    const char *name = hp.err_name ? hp.err_name((hipError_t)rc) : NULL;
    const char *text = hp.err_string ? hp.err_string((hipError_t)rc) : NULL;
    if (name != NULL)
        snprintf(buf, cap, "%s (%s)", name, text ? text : "no text");
    else
        snprintf(buf, cap, "HIP error %d", rc);
}

static int hip_pointer(const void *p, kvd_gpu_pointer_t *out)
{
    *out = (kvd_gpu_pointer_t){.ordinal = -1};
    unsigned type = 0;
    hipDeviceptr_t dp = (hipDeviceptr_t)(uintptr_t)p;
    /* memory HIP does not know is an error here: not device memory (and
     * the thread's last error is cleared, or the engine's next launch
     * check would report it) */
    if (hp.ptr_attr(&type, HIP_POINTER_ATTRIBUTE_MEMORY_TYPE, dp) != hipSuccess) {
        if (hp.last_error != NULL)
            (void)hp.last_error();
        return 0;
    }
    int ordinal = -1;
    void *start = NULL;
    size_t size = 0;
    if (hp.ptr_attr(&ordinal, HIP_POINTER_ATTRIBUTE_DEVICE_ORDINAL, dp) != hipSuccess)
        ordinal = -1;
    if (hp.ptr_attr(&start, HIP_POINTER_ATTRIBUTE_RANGE_START_ADDR, dp) != hipSuccess ||
        hp.ptr_attr(&size, HIP_POINTER_ATTRIBUTE_RANGE_SIZE, dp) != hipSuccess) {
        start = NULL;
        size = 0;
    }
    *out = (kvd_gpu_pointer_t){.device = type == hp.device_type,
                               .ordinal = ordinal,
                               .alloc_base = (uintptr_t)start,
                               .alloc_len = size};
    return 0;
}

static int hip_device(int ordinal, void **dev)
{
    *dev = (void *)(intptr_t)(ordinal + 1); /* never NULL */
    return 0;
}

static int hip_bind(void *dev, void **saved)
{
    int want = (int)(intptr_t)dev - 1, cur = -1;
    hipError_t rc = hp.get_device(&cur);
    if (rc != hipSuccess)
        return (int)rc;
    *saved = (void *)(intptr_t)(cur + 1);
    return cur == want ? 0 : (int)hp.set_device(want);
}

static void hip_unbind(void *saved)
{
    int was = (int)(intptr_t)saved - 1, cur = -1;
    if (was >= 0 && hp.get_device(&cur) == hipSuccess && cur != was)
        (void)hp.set_device(was);
}

static int hip_stream_create(void **s)
{
    return (int)hp.stream_create((hipStream_t *)s, hipStreamNonBlocking);
}

static int hip_stream_destroy(void *s)
{
    return (int)hp.stream_destroy((hipStream_t)s);
}

static int hip_stream_sync(void *s)
{
    return (int)hp.stream_sync((hipStream_t)s);
}

static int hip_stream_wait(void *s, void *ev)
{
    return (int)hp.stream_wait((hipStream_t)s, (hipEvent_t)ev, 0);
}

static int hip_event_create(void **ev)
{
    return (int)hp.event_create((hipEvent_t *)ev, hipEventDisableTiming);
}

static int hip_event_destroy(void *ev)
{
    return (int)hp.event_destroy((hipEvent_t)ev);
}

static int hip_event_record(void *ev, void *s)
{
    return (int)hp.event_record((hipEvent_t)ev, (hipStream_t)s);
}

static int hip_event_query(void *ev)
{
    return (int)hp.event_query((hipEvent_t)ev);
}

static int hip_event_sync(void *ev)
{
    return (int)hp.event_sync((hipEvent_t)ev);
}

static int hip_h2d(void *dst, const void *src, size_t n, void *s)
{
    return (int)hp.memcpy_async(dst, src, n, hipMemcpyHostToDevice, (hipStream_t)s);
}

static int hip_d2h(void *dst, const void *src, size_t n, void *s)
{
    return (int)hp.memcpy_async(dst, src, n, hipMemcpyDeviceToHost, (hipStream_t)s);
}

static int hip_host_register(void *p, size_t n, bool read_only)
{
    (void)
        read_only; /* ROCm 5 has no read-only flag: a read-only mapping may be refused */
    return (int)hp.host_register(p, n, hipHostRegisterDefault);
}

static int hip_host_unregister(void *p)
{
    return (int)hp.host_unregister(p);
}

static int hip_host_alloc(void **p, size_t n)
{
    return (int)hp.host_malloc(p, n, 0);
}

static int hip_host_free(void *p)
{
    return (int)hp.host_free(p);
}

static int hip_capturing(void *s, bool *yes)
{
    hipStreamCaptureStatus st = hipStreamCaptureStatusNone;
    hipError_t rc = hp.capturing((hipStream_t)s, &st);
    *yes = rc == hipSuccess && st != hipStreamCaptureStatusNone;
    return (int)rc;
}

static void hip_relaxed(int *old)
{
    hipStreamCaptureMode m = hipStreamCaptureModeRelaxed;
    *old = hp.capmode(&m) == hipSuccess ? (int)m : -1;
}

static void hip_restore(int old)
{
    hipStreamCaptureMode m = (hipStreamCaptureMode)old;
    if (old >= 0)
        (void)hp.capmode(&m);
}

static gpu_api_t hip_api = {
    .name = "HIP",
    .pointer = hip_pointer,
    .device = hip_device,
    .bind = hip_bind,
    .unbind = hip_unbind,
    .stream_create = hip_stream_create,
    .stream_destroy = hip_stream_destroy,
    .stream_sync = hip_stream_sync,
    .stream_wait = hip_stream_wait,
    .event_create = hip_event_create,
    .event_destroy = hip_event_destroy,
    .event_record = hip_event_record,
    .event_query = hip_event_query,
    .not_ready = hipErrorNotReady,
    .event_sync = hip_event_sync,
    .h2d = hip_h2d,
    .d2h = hip_d2h,
    .batch = NULL, /* hipMemcpyAsync per run */
    .host_register = hip_host_register,
    .host_unregister = hip_host_unregister,
    .host_alloc = hip_host_alloc,
    .host_free = hip_host_free,
    .err = hip_err,
    .legacy_stream = NULL, /* HIP's null stream is its default one */
};

static pthread_once_t once = PTHREAD_ONCE_INIT;
static const gpu_api_t *loaded;
static int load_status;
static char load_why[512];

#define SYM(field, name)                         \
    do {                                         \
        *(void **)&hp.field = dlsym(lib, name);  \
        if (hp.field == NULL && missing == NULL) \
            missing = name;                      \
    } while (0)

static void load_once(void)
{
    static const char *const names[] = {"libamdhip64.so.6", "libamdhip64.so.5",
                                        "libamdhip64.so", NULL};
    void *lib = kvd_gpu_dlopen("KVDOCK_HIP_LIBRARY", names, load_why, sizeof(load_why));
    load_status = KVD_ERR_NO_DEVICE;
    if (lib == NULL)
        return;
    const char *missing = NULL;
    SYM(init, "hipInit");
    SYM(version, "hipRuntimeGetVersion");
    SYM(err_name, "hipGetErrorName");
    SYM(err_string, "hipGetErrorString");
    SYM(count, "hipGetDeviceCount");
    SYM(set_device, "hipSetDevice");
    SYM(get_device, "hipGetDevice");
    SYM(ptr_attr, "hipPointerGetAttribute");
    SYM(stream_create, "hipStreamCreateWithFlags");
    SYM(stream_destroy, "hipStreamDestroy");
    SYM(stream_sync, "hipStreamSynchronize");
    SYM(stream_wait, "hipStreamWaitEvent");
    SYM(event_create, "hipEventCreateWithFlags");
    SYM(event_destroy, "hipEventDestroy");
    SYM(event_record, "hipEventRecord");
    SYM(event_query, "hipEventQuery");
    SYM(event_sync, "hipEventSynchronize");
    SYM(memcpy_async, "hipMemcpyAsync");
    SYM(host_register, "hipHostRegister");
    SYM(host_unregister, "hipHostUnregister");
    SYM(host_malloc, "hipHostMalloc");
    SYM(host_free, "hipHostFree");
    if (missing != NULL) {
        snprintf(load_why, sizeof(load_why), "the HIP runtime library lacks %s", missing);
        return;
    }
    int count = 0, version = 0;
    hipError_t rc = hp.init(0);
    if (rc == hipSuccess)
        rc = hp.count(&count);
    if (rc != hipSuccess || count == 0) {
        char e[160] = "no device";
        if (rc != hipSuccess)
            hip_err((int)rc, e, sizeof(e));
        snprintf(load_why, sizeof(load_why), "HIP: %s", e);
        return;
    }
    *(void **)&hp.last_error = dlsym(lib, "hipGetLastError");
    *(void **)&hp.capturing = dlsym(lib, "hipStreamIsCapturing");
    *(void **)&hp.capmode = dlsym(lib, "hipThreadExchangeStreamCaptureMode");
    if (hp.capturing != NULL)
        hip_api.capturing = hip_capturing;
    if (hp.capmode != NULL) {
        hip_api.relaxed = hip_relaxed;
        hip_api.restore = hip_restore;
    }
    (void)hp.version(&version);
    /* HIP_VERSION = major * 10000000 + minor * 100000 + patch */
    hp.device_type = version / 10000000 >= 6 ? 2 : 1;
    load_status = KVD_OK;
    loaded = &hip_api;
    snprintf(load_why, sizeof(load_why), "HIP runtime %d.%d, %d device(s)",
             version / 10000000, version / 100000 % 100, count);
}

const gpu_api_t *kvd_gpu_hip_load(int *status, char *why, size_t cap)
{
    pthread_once(&once, load_once);
    *status = load_status;
    if (why != NULL && cap > 0)
        snprintf(why, cap, "%s", load_why);
    return loaded;
}
