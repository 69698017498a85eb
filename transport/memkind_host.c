/*
 * memkind_host.c - the `host` memory kind: a region of ordinary host
 * memory; a copy is a memcpy that is complete when it returns.
 */
#include "kvd_transport.h"

#include <string.h>

static int host_copy(void *dst, const void *src, size_t n, bool into_region)
{
    (void)into_region;
    memcpy(dst, src, n);
    return KVD_OK;
}

static int host_sync(void)
{
    return KVD_OK;
}

static const kvd_memkind_t host_kind = {
    .name = "host",
    .copy = host_copy,
    .sync = host_sync,
};

const kvd_memkind_t *kvd_memkind_host(void)
{
    return &host_kind;
}
