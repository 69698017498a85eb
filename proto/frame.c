/*
 * frame.c - growable buffers and the incremental frame reader.
 *
 * Invariant of a framer: buf.data[start .. buf.len) are bytes received and
 * not yet handed out as frames. Space is made by sliding that tail to the
 * front before growing, so a connection's buffer stays near one frame.
 */
#include "kvd_proto.h"

#include <string.h>

void kvd_buf_init(kvd_buf_t *b, kvd_mem_cat_t cat)
{
    b->data = NULL;
    b->len = 0;
    b->cap = 0;
    b->cat = cat;
}

void kvd_buf_free(kvd_buf_t *b)
{
    kvd_mem_free(b->cat, b->data, b->cap);
    b->data = NULL;
    b->len = b->cap = 0;
}

int kvd_buf_reserve(kvd_buf_t *b, size_t extra)
{
    if (extra > SIZE_MAX - b->len)
        return KVD_ERR_TOO_LARGE;
    size_t need = b->len + extra;
    if (need <= b->cap)
        return KVD_OK;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < need)
        cap = cap > SIZE_MAX / 2 ? need : cap * 2;
    uint8_t *p = kvd_mem_realloc(b->cat, b->data, b->cap, cap);
    if (p == NULL)
        return KVD_ERR_NOMEM;
    b->data = p;
    b->cap = cap;
    return KVD_OK;
}

int kvd_buf_append(kvd_buf_t *b, const void *data, size_t len)
{
    if (len == 0)
        return KVD_OK; /* an empty buffer's data is NULL: no NULL + 0 */
    int rc = kvd_buf_reserve(b, len);
    if (rc != KVD_OK)
        return rc;
    memcpy(b->data + b->len, data, len);
    b->len += len;
    return KVD_OK;
}

void kvd_buf_consume(kvd_buf_t *b, size_t n)
{
    if (n >= b->len) {
        b->len = 0;
        return;
    }
    memmove(b->data, b->data + n, b->len - n);
    b->len -= n;
}

void kvd_framer_init(kvd_framer_t *f, size_t max_frame, kvd_mem_cat_t cat)
{
    kvd_buf_init(&f->buf, cat);
    f->start = 0;
    f->max_frame = max_frame;
}

void kvd_framer_free(kvd_framer_t *f)
{
    kvd_buf_free(&f->buf);
    f->start = 0;
}

int kvd_framer_space(kvd_framer_t *f, size_t min, uint8_t **space, size_t *avail)
{
    if (f->start > 0) {
        kvd_buf_consume(&f->buf, f->start);
        f->start = 0;
    }
    int rc = kvd_buf_reserve(&f->buf, min);
    if (rc != KVD_OK)
        return rc;
    *space = f->buf.data + f->buf.len;
    *avail = f->buf.cap - f->buf.len;
    return KVD_OK;
}

void kvd_framer_commit(kvd_framer_t *f, size_t n)
{
    f->buf.len += n;
}

static uint32_t read_le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
           (uint32_t)p[3] << 24;
}

int kvd_framer_next(kvd_framer_t *f, const uint8_t **payload, size_t *len)
{
    size_t have = f->buf.len - f->start;
    if (have < KVD_FRAME_HEADER_BYTES)
        return 0;
    uint32_t n = read_le32(f->buf.data + f->start);
    if (n == 0)
        return KVD_ERR_PROTOCOL;
    if (n > f->max_frame)
        return KVD_ERR_TOO_LARGE;
    if (have - KVD_FRAME_HEADER_BYTES < n)
        return 0;
    *payload = f->buf.data + f->start + KVD_FRAME_HEADER_BYTES;
    *len = n;
    f->start += KVD_FRAME_HEADER_BYTES + n;
    return 1;
}

size_t kvd_framer_pending(const kvd_framer_t *f)
{
    return f->buf.len - f->start;
}

bool kvd_framer_partial(const kvd_framer_t *f)
{
    size_t have = f->buf.len - f->start;
    if (have == 0)
        return false;
    if (have < KVD_FRAME_HEADER_BYTES)
        return true;
    uint32_t n = read_le32(f->buf.data + f->start);
    return n != 0 && n <= f->max_frame && have - KVD_FRAME_HEADER_BYTES < n;
}

/* kvd_buf_reserve's growth: doubling from 256. */
size_t kvd_framer_space_cap(const kvd_framer_t *f, size_t min)
{
    size_t keep = f->buf.len - f->start;
    if (min > SIZE_MAX - keep)
        return SIZE_MAX;
    size_t need = keep + min;
    if (need <= f->buf.cap)
        return f->buf.cap;
    size_t cap = f->buf.cap ? f->buf.cap : 256;
    while (cap < need)
        cap = cap > SIZE_MAX / 2 ? need : cap * 2;
    return cap;
}

int kvd_frame_put_header(kvd_buf_t *b, size_t len)
{
    if (len == 0 || len > UINT32_MAX)
        return KVD_ERR_TOO_LARGE;
    uint8_t h[KVD_FRAME_HEADER_BYTES] = {(uint8_t)len, (uint8_t)(len >> 8),
                                         (uint8_t)(len >> 16), (uint8_t)(len >> 24)};
    return kvd_buf_append(b, h, sizeof(h));
}
