/*
 * devmem_host.c - the `host` device-memory backend: the "device" buffers
 * are host memory, a copy is a memcpy that is complete when it returns.
 */
#include "devmem.h"
#include "kvd_common.h"

#include <string.h>

static int host_copy(void *dst, const void *src, size_t n, bool to_device)
{
    (void)to_device;
    memcpy(dst, src, n);
    return KVD_OK;
}

static int host_sync(void)
{
    return KVD_OK;
}

static const kvd_devmem_ops_t host_ops = {
    .name = "host",
    .copy = host_copy,
    .sync = host_sync,
};

const kvd_devmem_ops_t *kvd_devmem_host(void)
{
    return &host_ops;
}
