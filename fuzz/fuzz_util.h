/*
 * fuzz_util.h - what the libFuzzer targets of fuzz/ share: a check that
 * aborts (libFuzzer keeps the input that reached it), and a reader that
 * takes values from the front of the input.
 */
#ifndef KVD_FUZZ_UTIL_H
#define KVD_FUZZ_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A property the code under test promised did not hold: say which, and
 * abort so that libFuzzer records the input as a crash. */
#define FUZZ_CHECK(cond, ...)                                                       \
    do {                                                                            \
        if (!(cond)) {                                                              \
            fprintf(stderr, "fuzz check failed at %s:%d: %s: ", __FILE__, __LINE__, \
                    #cond);                                                         \
            fprintf(stderr, __VA_ARGS__);                                           \
            fprintf(stderr, "\n");                                                  \
            abort();                                                                \
        }                                                                           \
    } while (0)

/* The input, consumed from the front; reads past its end give zeroes. */
typedef struct fuzz_in {
    const uint8_t *p;
    size_t n;
} fuzz_in_t;

static inline bool fuzz_left(const fuzz_in_t *in)
{
    return in->n > 0;
}

static inline uint8_t fuzz_u8(fuzz_in_t *in)
{
    if (in->n == 0)
        return 0;
    in->n--;
    return *in->p++;
}

static inline uint16_t fuzz_u16(fuzz_in_t *in)
{
    uint16_t v = fuzz_u8(in);
    return (uint16_t)(v | (uint16_t)fuzz_u8(in) << 8);
}

static inline uint32_t fuzz_u32(fuzz_in_t *in)
{
    uint32_t v = fuzz_u16(in);
    return v | (uint32_t)fuzz_u16(in) << 16;
}

/* Up to `want` bytes of the input (fewer at its end). */
static inline const uint8_t *fuzz_bytes(fuzz_in_t *in, size_t want, size_t *got)
{
    *got = want < in->n ? want : in->n;
    const uint8_t *p = in->p;
    in->p += *got;
    in->n -= *got;
    return p;
}

/* A chunk: a 16-bit little-endian length, then that many bytes. */
static inline const uint8_t *fuzz_chunk(fuzz_in_t *in, size_t *got)
{
    size_t want = fuzz_u16(in);
    return fuzz_bytes(in, want, got);
}

#endif
