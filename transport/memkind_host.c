/*
 * memkind_host.c - the `host` memory kind: a region of ordinary host
 * memory; a copy is complete when it returns.
 *
 * Large copies whose source and destination are not aligned alike (their
 * distance not a multiple of 64 bytes) go through a loop of 16-byte moves
 * instead of memcpy: glibc's memcpy uses `rep movsb` there, which on this
 * project's machines (AMD EPYC, ERMS and FSRM) ran at 2.9 GB/s copying
 * 128 KiB rows out of the pool into malloc'd buffers 16 bytes past a page
 * boundary, against 9.7 GB/s for the loop and 9.2 GB/s for memcpy between
 * buffers aligned alike. In `kvdock-bench linker` the mha load went from
 * 2.8 GB/s (0.32 x memcpy) to 8.9-9.1 GB/s (bench/RESULTS.md). Co-aligned
 * copies keep memcpy.
 */
#include "kvd_transport.h"

#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#define LOOP_MIN_BYTES 4096

/* dst <- src, n bytes, by 64-byte steps of unaligned 16-byte moves. */
static void copy_unaligned(uint8_t *d, const uint8_t *s, size_t n)
{
#if defined(__SSE2__)
    for (; n >= 64; s += 64, d += 64, n -= 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)s);
        __m128i b = _mm_loadu_si128((const __m128i *)(s + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(s + 32));
        __m128i e = _mm_loadu_si128((const __m128i *)(s + 48));
        _mm_storeu_si128((__m128i *)d, a);
        _mm_storeu_si128((__m128i *)(d + 16), b);
        _mm_storeu_si128((__m128i *)(d + 32), c);
        _mm_storeu_si128((__m128i *)(d + 48), e);
    }
#endif
    memcpy(d, s, n);
}

static int host_copy(const kvd_memkind_t *k, void *dst, const void *src, size_t n,
                     bool into_region)
{
    (void)k;
    (void)into_region;
    if (n >= LOOP_MIN_BYTES && (((uintptr_t)dst - (uintptr_t)src) & 63) != 0)
        copy_unaligned(dst, src, n);
    else
        memcpy(dst, src, n);
    return KVD_OK;
}

static int host_sync(const kvd_memkind_t *k)
{
    (void)k;
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

/* ------------------------------------------------- calls through a kind */

int kvd_memkind_copy_batch(const kvd_memkind_t *k, const kvd_copy_t *v, size_t n,
                           bool into_region)
{
    if (k->copy_batch != NULL)
        return k->copy_batch(k, v, n, into_region);
    int rc = KVD_OK;
    for (size_t i = 0; rc == KVD_OK && i < n; i++)
        rc = k->copy(k, v[i].dst, v[i].src, v[i].n, into_region);
    return rc;
}

int kvd_memkind_mark(const kvd_memkind_t *k, void **mark)
{
    *mark = NULL;
    return k->mark != NULL ? k->mark(k, mark) : KVD_OK;
}

/* A NULL mark is one that was never pending (a kind without marks). */
int kvd_memkind_mark_query(const kvd_memkind_t *k, void *mark)
{
    return mark != NULL ? k->mark_query(k, mark) : KVD_OK;
}

int kvd_memkind_mark_wait(const kvd_memkind_t *k, void *mark)
{
    return mark != NULL ? k->mark_wait(k, mark) : KVD_OK;
}

int kvd_memkind_mark_stream_wait(const kvd_memkind_t *k, void *mark, void *stream)
{
    return mark != NULL ? k->mark_stream_wait(k, mark, stream) : KVD_OK;
}

void kvd_memkind_mark_free(const kvd_memkind_t *k, void *mark)
{
    if (mark != NULL)
        k->mark_free(k, mark);
}

int kvd_memkind_after(const kvd_memkind_t *k, void *stream, void *event, void **mark)
{
    if (mark != NULL)
        *mark = NULL;
    return k->after != NULL ? k->after(k, stream, event, mark) : KVD_ERR_INVALID;
}
