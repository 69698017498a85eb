/*
 * devmem.h - how the linker moves bytes to and from device memory: an ops
 * table per memory kind (DESIGN.md section 2: device-memory backends
 * `host`, later `hip`). Private to linker/.
 *
 * A copy may be asynchronous; sync returns once every copy issued on that
 * context is complete (the completion event a layer group waits for before
 * it is marked in place, and an offload waits for before it reads rows the
 * engine may still be writing).
 */
#ifndef KVD_LINKER_DEVMEM_H
#define KVD_LINKER_DEVMEM_H

#include <stdbool.h>
#include <stddef.h>

typedef struct kvd_devmem_ops {
    const char *name;
    /* dst <- src, n bytes; to_device says which side is device memory */
    int (*copy)(void *dst, const void *src, size_t n, bool to_device);
    /* every copy issued so far is complete (and the device's own writes
     * before it, for reads from the device) */
    int (*sync)(void);
} kvd_devmem_ops_t;

/* Ordinary host memory: memcpy, nothing to wait for. */
const kvd_devmem_ops_t *kvd_devmem_host(void);

#endif
