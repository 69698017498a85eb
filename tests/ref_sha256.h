/*
 * ref_sha256.h - an independent SHA-256 (FIPS 180-4) for the tests, written
 * from the standard and checked on its vectors, so that the page-key chain
 * of common/ (OpenSSL's SHA-256) is checked against something it does not
 * share code with.
 */
#ifndef KVD_TEST_REF_SHA256_H
#define KVD_TEST_REF_SHA256_H

#include <stddef.h>
#include <stdint.h>

typedef struct ref_sha256 {
    uint32_t h[8];
    uint8_t block[64];
    size_t block_len;
    uint64_t total_bytes;
} ref_sha256_t;

void ref_sha256_init(ref_sha256_t *c);
void ref_sha256_update(ref_sha256_t *c, const void *data, size_t len);
void ref_sha256_final(ref_sha256_t *c, uint8_t out[32]);

/* The page-key chain from its definition: key[i] = SHA256(key[i-1] ||
 * page i's tokens as uint32 little-endian), key[-1] = prior or absent.
 * Returns the number of keys (full pages). */
size_t ref_page_chain(const uint32_t *tokens, size_t n_tokens, size_t page_size,
                      const uint8_t *prior, uint8_t (*keys)[32]);

#endif
