/*
 * gpu_int.h - what the device kinds (gpu.c) need of a GPU runtime: a table
 * of calls, filled by each runtime's front end (gpu_cuda.c: the CUDA driver
 * API; gpu_hip.c: ROCm HIP) from the library it loaded with dlopen. Every
 * call returns the runtime's own code, 0 for success; err names one.
 * Private to transport/.
 */
#ifndef KVD_GPU_INT_H
#define KVD_GPU_INT_H

#include "kvd_transport.h"

typedef struct gpu_api {
    const char *name; /* "CUDA", "HIP" */
    /* what the runtime says of p (device false where it does not know p) */
    int (*pointer)(const void *p, kvd_gpu_pointer_t *out);
    /* a handle making device `ordinal` current (CUDA: its primary
     * context, retained for the process) */
    int (*device)(int ordinal, void **dev);
    /* makes dev current on this thread; *saved: what was, for unbind */
    int (*bind)(void *dev, void **saved);
    void (*unbind)(void *saved);
    int (*stream_create)(void **s); /* non-blocking */
    int (*stream_destroy)(void *s);
    int (*stream_sync)(void *s);
    int (*stream_wait)(void *s, void *ev);
    int (*event_create)(void **ev); /* without timing */
    int (*event_destroy)(void *ev);
    int (*event_record)(void *ev, void *s);
    /* 0 done, not_ready while pending, another code on failure */
    int (*event_query)(void *ev);
    int not_ready;
    int (*event_sync)(void *ev);
    int (*h2d)(void *dst, const void *src, size_t n, void *s);
    int (*d2h)(void *dst, const void *src, size_t n, void *s);
    /* n copies in one call (NULL: the runtime has none); h2d: the
     * direction of all of them */
    int (*batch)(const kvd_copy_t *v, size_t n, bool h2d, int ordinal, void *s);
    int (*host_register)(void *p, size_t n, bool read_only);
    int (*host_unregister)(void *p);
    int (*host_alloc)(void **p, size_t n);
    int (*host_free)(void *p);
    /* "CUDA_ERROR_OUT_OF_MEMORY (out of memory)" for code rc */
    void (*err)(int rc, char *buf, size_t cap);
    /* the runtime's legacy default stream, as a handle (CUDA:
     * CU_STREAM_LEGACY; HIP: the null stream) */
    void *legacy_stream;
    /* Optional (NULL where the library lacks the call): whether stream s
     * is being captured into a graph; the calling thread's capture mode
     * set to relaxed (*old: what it was) and back, so that kvdock's own
     * threads may register host memory while an engine captures. */
    int (*capturing)(void *s, bool *yes);
    void (*relaxed)(int *old);
    void (*restore)(int old);
} gpu_api_t;

/* Each front end loads its library once; NULL and why on failure.
 * KVD_ERR_NO_DEVICE or KVD_ERR_UNSUPPORTED in *status then. */
const gpu_api_t *kvd_gpu_cuda_load(int *status, char *why, size_t cap);
const gpu_api_t *kvd_gpu_hip_load(int *status, char *why, size_t cap);

/* For the front ends: dlopen of the first name that loads, the library
 * named by env_var first when set; NULL with why (each tried, its error). */
void *kvd_gpu_dlopen(const char *env_var, const char *const *names, char *why,
                     size_t cap);

#endif
