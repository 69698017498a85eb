/*
 * fakegpu_core.h: the engine both fake runtimes share (fakegpu_core.c).
 * The CUDA and HIP front ends (fake_cuda.c, fake_hip.c) translate their
 * API to these calls and the fg_err_t codes back to their own. Everything
 * here is hidden in the shared libraries; only the front ends' API and
 * fakegpu_stats are exported.
 *
 * Threading: every call may come from any thread; one mutex guards the
 * whole state, and each stream's worker thread drops it while it copies.
 */
#ifndef KVD_FAKEGPU_CORE_H
#define KVD_FAKEGPU_CORE_H

#include "fakegpu.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum fg_err {
    FG_OK = 0,
    FG_ERR_INVALID_VALUE,
    FG_ERR_OUT_OF_MEMORY,
    FG_ERR_NOT_INITIALIZED,
    FG_ERR_NO_DEVICE,
    FG_ERR_INVALID_DEVICE,
    FG_ERR_INVALID_HANDLE,
    FG_ERR_INVALID_CONTEXT,
    FG_ERR_NOT_READY,
    FG_ERR_ILLEGAL_ADDRESS,
    FG_ERR_ALREADY_REGISTERED,
    FG_ERR_NOT_REGISTERED,
    FG_ERR_NOT_SUPPORTED,
} fg_err_t;

typedef struct fg_stream fg_stream_t;
typedef struct fg_event fg_event_t;

typedef enum fg_ptr_kind {
    FG_PTR_UNKNOWN = 0, /* not memory the fake handed out or registered */
    FG_PTR_DEVICE,      /* inside a device allocation */
    FG_PTR_HOST_PINNED, /* inside a registered or host-allocated range */
} fg_ptr_kind_t;

typedef struct fg_ptr_info {
    fg_ptr_kind_t kind;
    int device;     /* the allocation's device; 0 for host memory */
    uintptr_t base; /* the allocation's or range's start */
    size_t size;    /* its size in bytes */
} fg_ptr_info_t;

/* What a copy call says its pointers are; FG_DIR_ANY infers it (a batch). */
typedef enum fg_dir { FG_DIR_ANY = 0, FG_DIR_H2D, FG_DIR_D2H, FG_DIR_D2D } fg_dir_t;

typedef struct fg_copy {
    void *dst;
    const void *src;
    size_t size_bytes;
    bool src_now; /* read the source during the call (CUDA's DURING_API_CALL order) */
} fg_copy_t;

/* Reads FAKEGPU_NO_DEVICE and FAKEGPU_DEVICES once; later calls return the
 * first answer. FG_ERR_NO_DEVICE when there is none. */
fg_err_t fg_init(void);
bool fg_initialized(void);
int fg_device_count(void);

fg_err_t fg_mem_alloc(int device, size_t size_bytes, void **out);
fg_err_t fg_mem_free(void *dev);
fg_err_t fg_host_alloc(size_t size_bytes, void **out);
fg_err_t fg_host_free(void *host);
fg_err_t fg_host_register(void *host, size_t size_bytes, bool read_only);
fg_err_t fg_host_unregister(void *host);
void fg_pointer_info(const void *p, fg_ptr_info_t *out);

/* The legacy (NULL) stream, made on first use. */
fg_stream_t *fg_stream_legacy(void);
fg_err_t fg_stream_create(int device, fg_stream_t **out);
fg_err_t fg_stream_destroy(fg_stream_t *s);
/* FG_OK when s is a live stream (the legacy one included). */
fg_err_t fg_stream_check(fg_stream_t *s);
fg_err_t fg_stream_sync(fg_stream_t *s);
fg_err_t fg_stream_wait_event(fg_stream_t *s, fg_event_t *e);
/* fn(arg) runs on the stream's thread in stream order, even after an error;
 * status is the stream's sticky error at that point. */
fg_err_t fg_stream_host_fn(fg_stream_t *s, void (*fn)(void *arg, fg_err_t status),
                           void *arg);

fg_err_t fg_event_create(fg_event_t **out);
fg_err_t fg_event_destroy(fg_event_t *e);
fg_err_t fg_event_record(fg_event_t *e, fg_stream_t *s);
fg_err_t fg_event_query(fg_event_t *e);
fg_err_t fg_event_sync(fg_event_t *e);

/* Enqueues count copies on s, all or none. batch: one batch call. */
fg_err_t fg_copy_async(fg_stream_t *s, const fg_copy_t *copies, size_t count,
                       fg_dir_t dir, bool batch);
/* A copy on the legacy stream, returning when it has run. */
fg_err_t fg_copy_sync(void *dst, const void *src, size_t size_bytes, fg_dir_t dir);

typedef enum fg_knob {
    FG_KNOB_NO_DEVICE,
    FG_KNOB_DEVICES,
    FG_KNOB_COPY_DELAY_US,
    FG_KNOB_FAIL_COPY,
    FG_KNOB_REGISTER_FAIL,
    FG_KNOB_REGISTER_MAX,
    FG_KNOB_REGISTER_DELAY_US,
    FG_KNOB_COUNT
} fg_knob_t;

/* Sets the knob of environment name name (fakegpu_set): 0, or -1 when no
 * knob has that name. */
int fg_knob_set(const char *name, unsigned long long value);

/* Counts an error returned to a caller. */
void fg_count_error(void);
void fg_stats(fakegpu_stats_t *out);
void fg_stats_reset(void);

#endif
