/*
 * gpu_test.h: runtime-agnostic helpers for the GPU tests, so that one test
 * source runs on the fakes of fake/ here and on a real device. The runtime
 * is the one $KVDOCK_TEST_GPU names ("cuda", the default, or "hip"), loaded
 * as libkvdock loads it: $KVDOCK_CUDA_LIBRARY, else libcuda.so.1;
 * $KVDOCK_HIP_LIBRARY, else libamdhip64.so.5, .so.6, .so.
 *
 * Every helper but gt_open aborts the test (exit 1, the call and its error
 * printed) when the runtime call fails: a test states its expectations,
 * not error handling. CUDA: gt_open retains device 0's primary context and
 * makes it current on the calling thread; another thread of the test calls
 * gt_bind first. Streams are non-blocking, events without timing; the
 * synchronous gt_write and gt_read wait for no stream.
 */
#ifndef KVD_GPU_TEST_H
#define KVD_GPU_TEST_H

#include "fakegpu.h"

#include <stdbool.h>
#include <stddef.h>

typedef enum { GT_CUDA = 1, GT_HIP = 2 } gt_runtime_t;

/* Loads and initializes the runtime: 0, or prints why and returns 77 (the
 * test's exit: skip) when the library or a device is missing, or 1 when it
 * is there and fails otherwise. */
int gt_open(void);
gt_runtime_t gt_runtime(void);
const char *gt_runtime_name(void); /* "cuda" or "hip" */
/* The runtime's symbol name, or NULL (for calls the helpers do not wrap). */
void *gt_symbol(const char *name);
/* Binds the calling thread to device 0 (CUDA: makes the context current). */
void gt_bind(void);
/* CUDA: makes no context current on the calling thread (HIP: nothing). */
void gt_unbind(void);
int gt_memory_kind(void); /* KVD_MEM_CUDA or KVD_MEM_HIP */
bool gt_is_fake(void);    /* fakegpu_stats is in the loaded library */
/* The fake's counters: false (out untouched) on a real runtime. */
bool gt_fake_stats(fakegpu_stats_t *out);
void gt_fake_stats_reset(void);
/* Sets a knob of the fake (fakegpu.h: FAKEGPU_COPY_DELAY_US, ...) while it
 * runs; aborts the test on a real runtime or for a name that is no knob. */
void gt_fake_set(const char *knob, unsigned long long value);

void *gt_alloc(size_t n); /* device memory, zeroed */
void gt_free(void *p);
void gt_write(void *dev, const void *host, size_t n); /* synchronous */
void gt_read(void *host, const void *dev, size_t n);  /* synchronous */

void *gt_stream_create(void);
void gt_stream_destroy(void *s);
void gt_stream_sync(void *s);
void gt_stream_wait_event(void *s, void *e);
void *gt_event_create(void);
void gt_event_record(void *e, void *s);
bool gt_event_done(void *e); /* query: true when ready, false when not yet */
void gt_event_sync(void *e);
void gt_event_destroy(void *e);
/* an async H2D on s (a stand-in for an engine kernel writing rows) */
void gt_write_async(void *dev, const void *host, size_t n, void *s);
void gt_read_async(void *host, const void *dev, size_t n, void *s);

/* The runtime's status of the call (0 success), for tests of failures. */
int gt_try_write_async(void *dev, const void *host, size_t n, void *s);
int gt_try_stream_sync(void *s);
int gt_host_register(void *p, size_t n); /* portable, read-write */
int gt_host_unregister(void *p);
/* The runtime's name of status (cuGetErrorName, hipGetErrorName). */
const char *gt_status_name(int status);

/* A gate holds stream s at this point of its order until gt_gate_open:
 * everything queued on s after it waits, deterministically (a host
 * function blocked on a condition variable). gt_gate_open frees it. */
typedef struct gt_gate gt_gate_t;
gt_gate_t *gt_gate(void *s);
void gt_gate_open(gt_gate_t *g);

#endif
