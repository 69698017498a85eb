/*
 * fakegpu.h: the counters of the fake GPU runtimes (libfakecuda.so.1 and
 * libfakehip.so, tests/gpu/fake/). Both fakes export
 *
 *   void fakegpu_stats(fakegpu_stats_t *out);
 *   void fakegpu_stats_reset(void);
 *   int fakegpu_set(const char *knob, unsigned long long value);
 *
 * which a test finds with dlsym in the runtime it loaded: their presence is
 * how a test knows it runs on a fake (gt_is_fake). Each library keeps its
 * own counters and knobs.
 *
 * The knobs are environment variables, read once, on first use;
 * fakegpu_set changes one at run time (by its variable's name; 0, or -1
 * for a name that is no knob), safe while other threads call the fake:
 *   FAKEGPU_NO_DEVICE=1         no device (cuInit: CUDA_ERROR_NO_DEVICE,
 *                               hipInit: hipErrorNoDevice)
 *   FAKEGPU_DEVICES=N           N devices, 1 by default (these two count
 *                               only until the runtime initialized)
 *   FAKEGPU_COPY_DELAY_US=N     each async copy waits N us before it runs
 *   FAKEGPU_FAIL_COPY=N         the Nth async copy since the library loaded
 *                               fails while it runs (ILLEGAL_ADDRESS, sticky)
 *   FAKEGPU_REGISTER_FAIL=1     host registration fails (OUT_OF_MEMORY)
 *   FAKEGPU_REGISTER_MAX=N      a registration of more than N bytes fails
 *                               (OUT_OF_MEMORY; default 512 GiB - 1)
 *   FAKEGPU_REGISTER_DELAY_US=N each registration takes N us Counters of calls are taken
 * when the call is made; byte counters when a copy has run. The fields marked "now" are
 * gauges, which fakegpu_stats_reset leaves alone; it zeroes the others.
 */
#ifndef KVD_FAKEGPU_H
#define KVD_FAKEGPU_H

#include <stdint.h>

typedef struct fakegpu_stats {
    uint64_t async_copies;        /* async copies enqueued; a batch's copies each count */
    uint64_t async_copies_pinned; /* of them, host side registered or host-allocated */
    uint64_t async_copies_pageable; /* of them, host side ordinary (pageable) memory */
    uint64_t async_copies_d2d;      /* of them, device to device (no host side) */
    uint64_t bytes_h2d;             /* bytes of async host-to-device copies that ran */
    uint64_t bytes_d2h;             /* bytes of async device-to-host copies that ran */
    uint64_t sync_copies;           /* cuMemcpyHtoD/DtoH, hipMemcpy (the tests' side) */
    uint64_t batch_calls;           /* cuMemcpyBatchAsync calls enqueued */
    uint64_t stream_waits;          /* cuStreamWaitEvent / hipStreamWaitEvent calls */
    uint64_t event_records;         /* cuEventRecord / hipEventRecord calls */
    uint64_t host_registrations;    /* successful cuMemHostRegister / hipHostRegister */
    uint64_t errors;                /* calls that returned an error (NOT_READY is none) */
    uint64_t registered_bytes;      /* now: bytes of host memory registered */
    uint64_t host_alloc_bytes;      /* now: bytes of cuMemAllocHost / hipHostMalloc */
    uint64_t device_alloc_bytes;    /* now: bytes of device memory allocated */
    uint64_t streams;               /* now: streams created and not destroyed */
    uint64_t events;                /* now: events created and not destroyed */
} fakegpu_stats_t;

void fakegpu_stats(fakegpu_stats_t *out);
void fakegpu_stats_reset(void);
int fakegpu_set(const char *knob, unsigned long long value);

/* Their types, for dlsym. */
typedef void (*fakegpu_stats_fn)(fakegpu_stats_t *out);
typedef void (*fakegpu_stats_reset_fn)(void);
typedef int (*fakegpu_set_fn)(const char *knob, unsigned long long value);

#endif
