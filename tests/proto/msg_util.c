/*
 * Description: helpers shared by the message tests of proto/; see
 * msg_util.h.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "msg_util.h"

uint8_t *pack_payload(const kvd_msg_t *m, size_t *len)
{
    kvd_buf_t b;
    kvd_buf_init(&b, KVD_MEM_OTHER);
    assert_int_equal(kvd_msg_pack(m, KVD_FRAME_DEFAULT_MAX, &b), KVD_OK);
    *len = b.len - KVD_FRAME_HEADER_BYTES;
    uint8_t *p = malloc(*len);
    assert_non_null(p);
    memcpy(p, b.data + KVD_FRAME_HEADER_BYTES, *len);
    kvd_buf_free(&b);
    return p;
}

/* A private copy of bytes[0..len), so that ASan sees any read past the end. */
static uint8_t *private_copy(const uint8_t *bytes, size_t len)
{
    uint8_t *copy = malloc(len ? len : 1);
    assert_non_null(copy);
    memcpy(copy, bytes, len);
    return copy;
}

int decode_bytes(const uint8_t *bytes, size_t len, kvd_msg_t *out)
{
    uint8_t *copy = private_copy(bytes, len);
    int rc = kvd_msg_decode(copy, len, out);
    free(copy);
    return rc;
}

int decode_with(const uint8_t *payload, size_t len, const kvd_msg_limits_t *lim,
                kvd_msg_t *out)
{
    uint8_t *copy = private_copy(payload, len);
    int rc = kvd_msg_decode_limited(copy, len, lim, out);
    free(copy);
    return rc;
}

size_t put_varint(uint8_t *p, uint64_t v)
{
    size_t n = 0;
    while (v >= 0x80) {
        p[n++] = (uint8_t)(0x80 | (v & 0x7f));
        v >>= 7;
    }
    p[n++] = (uint8_t)v;
    return n;
}
