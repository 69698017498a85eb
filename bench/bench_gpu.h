/*
 * bench_gpu.h - the device runtime for kvdock-bench's GPU modes, loaded with
 * dlopen as libkvdock loads it (KVDOCK_CUDA_LIBRARY or libcuda.so.1;
 * KVDOCK_HIP_LIBRARY or libamdhip64.so.6/.5/.so), so that the bench links
 * no GPU library and builds and runs where none is installed. Only what
 * the bench needs: device and pinned host memory, and copies on one stream
 * of its own that return once done.
 */
#ifndef KVD_BENCH_GPU_H
#define KVD_BENCH_GPU_H

#include "kvdock.h"

#include <stdbool.h>
#include <stddef.h>

/* Loads the runtime of `kind` (KVD_MEM_CUDA or KVD_MEM_HIP), device 0 made
 * current on the calling thread. 0, or -1 with the reason in why. */
int bgpu_open(kvd_memory_kind_t kind, char *why, size_t why_len);
/* The device's name ("NVIDIA H200"), or the library's when it has none to
 * give; "fake" is in it for the tests' fake runtimes. */
const char *bgpu_name(void);
bool bgpu_is_fake(void);
/* Device memory; NULL on failure (the reason on stderr). */
void *bgpu_alloc(size_t n);
void bgpu_free(void *p);
/* Pinned host memory (cuMemAllocHost, hipHostMalloc). */
void *bgpu_alloc_host(size_t n);
void bgpu_free_host(void *p);
/* One copy on the bench's stream, then a sync of that stream: it returns
 * once the bytes are in place. 0, or -1 (the runtime's error on stderr). */
int bgpu_h2d(void *dev, const void *host, size_t n);
int bgpu_d2h(void *host, const void *dev, size_t n);

#endif
