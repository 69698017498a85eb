/*
 * text.c - text that leaves the daemon: UTF-8 checks for the protocol's
 * string fields (proto3 requires valid UTF-8) and the one escape for bytes a
 * client chose, before they reach a log line or an error text.
 */
#include "kvd_common.h"

#include <stdio.h>
#include <string.h>

/* The length of the UTF-8 sequence at s[0..n) (RFC 3629: no overlong
 * forms, no surrogates, nothing above U+10FFFF); 0 when it is not one.
 * *incomplete is set when the bytes are a valid start cut short by n. */
static size_t utf8_seq(const unsigned char *s, size_t n, bool *incomplete)
{
    *incomplete = false;
    unsigned char c = s[0];
    size_t len;
    unsigned char lo = 0x80, hi = 0xbf; /* allowed range of the second byte */
    if (c < 0x80)
        return 1;
    if (c >= 0xc2 && c <= 0xdf) {
        len = 2;
    } else if (c >= 0xe0 && c <= 0xef) {
        len = 3;
        if (c == 0xe0)
            lo = 0xa0; /* overlong */
        else if (c == 0xed)
            hi = 0x9f; /* surrogates */
    } else if (c >= 0xf0 && c <= 0xf4) {
        len = 4;
        if (c == 0xf0)
            lo = 0x90; /* overlong */
        else if (c == 0xf4)
            hi = 0x8f; /* above U+10FFFF */
    } else {
        return 0;
    }
    for (size_t i = 1; i < len; i++) {
        if (i >= n) {
            *incomplete = true;
            return 0;
        }
        unsigned char b = s[i];
        if (i == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xbf))
            return 0;
    }
    return len;
}

bool kvd_utf8_valid(const char *s, size_t n)
{
    const unsigned char *p = (const unsigned char *)s;
    bool incomplete;
    for (size_t i = 0; i < n;) {
        size_t k = utf8_seq(p + i, n - i, &incomplete);
        if (k == 0)
            return false;
        i += k;
    }
    return true;
}

void kvd_utf8_copy(char *dst, const char *src, size_t dst_len)
{
    if (dst_len == 0)
        return;
    const unsigned char *p = (const unsigned char *)src;
    size_t n = strlen(src), out = 0;
    bool incomplete;
    for (size_t i = 0; i < n && out + 1 < dst_len;) {
        size_t k = utf8_seq(p + i, n - i, &incomplete);
        if (k == 0) {
            if (incomplete)
                break; /* a character cut short at the end: drop it */
            dst[out++] = '?';
            i++;
            continue;
        }
        if (out + k >= dst_len)
            break; /* it does not fit whole: cut before it */
        memcpy(dst + out, p + i, k);
        out += k;
        i += k;
    }
    dst[out] = '\0';
}

const char *kvd_escape(char *dst, size_t dst_len, const char *src, size_t src_len)
{
    if (dst_len == 0)
        return dst;
    size_t out = 0;
    for (size_t i = 0; i < src_len; i++) {
        unsigned char c = (unsigned char)src[i];
        char esc[5];
        size_t k;
        if (c == '\\') {
            memcpy(esc, "\\\\", 2);
            k = 2;
        } else if (c >= 0x20 && c < 0x7f) {
            esc[0] = (char)c;
            k = 1;
        } else {
            snprintf(esc, sizeof(esc), "\\x%02x", c);
            k = 4;
        }
        if (out + k >= dst_len)
            break; /* never half an escape */
        memcpy(dst + out, esc, k);
        out += k;
    }
    dst[out] = '\0';
    return dst;
}
