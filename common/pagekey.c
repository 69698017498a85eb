/*
 * pagekey.c - the SGLang-compatible page-key chain (DESIGN.md section 3) and
 * hex conversion of keys. SHA-256 comes from OpenSSL's libcrypto.
 */
#include "kvd_common.h"

#include <openssl/evp.h>
#include <string.h>

int kvd_key_chain(const uint32_t *tokens, size_t n_tokens, size_t page_size,
                  const uint8_t *prior, uint8_t (*keys)[KVD_KEY_BYTES], size_t *n_keys)
{
    if (page_size == 0 || (tokens == NULL && n_tokens > 0))
        return KVD_ERR_INVALID;
    size_t pages = n_tokens / page_size;
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    if (ctx == NULL)
        return KVD_ERR_NOMEM;

    const uint8_t *prev = prior;
    uint8_t le[4];
    int rc = KVD_OK;
    for (size_t p = 0; p < pages; p++) {
        if (EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) != 1) {
            rc = KVD_ERR_IO;
            break;
        }
        if (prev != NULL)
            EVP_DigestUpdate(ctx, prev, KVD_KEY_BYTES);
        for (size_t t = 0; t < page_size; t++) {
            /* explicit little-endian, whatever the host's byte order */
            uint32_t v = tokens[p * page_size + t];
            le[0] = (uint8_t)v;
            le[1] = (uint8_t)(v >> 8);
            le[2] = (uint8_t)(v >> 16);
            le[3] = (uint8_t)(v >> 24);
            EVP_DigestUpdate(ctx, le, sizeof(le));
        }
        unsigned int len = 0;
        if (EVP_DigestFinal_ex(ctx, keys[p], &len) != 1 || len != KVD_KEY_BYTES) {
            rc = KVD_ERR_IO;
            break;
        }
        prev = keys[p];
    }
    EVP_MD_CTX_free(ctx);
    if (rc == KVD_OK)
        *n_keys = pages;
    return rc;
}

void kvd_key_to_hex(const uint8_t key[KVD_KEY_BYTES], char out[65])
{
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < KVD_KEY_BYTES; i++) {
        out[2 * i] = digits[key[i] >> 4];
        out[2 * i + 1] = digits[key[i] & 0xf];
    }
    out[64] = '\0';
}

static int hex_value(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

int kvd_key_from_hex(const char *hex, uint8_t key[KVD_KEY_BYTES])
{
    if (hex == NULL || strlen(hex) != 2 * KVD_KEY_BYTES)
        return KVD_ERR_INVALID;
    for (size_t i = 0; i < KVD_KEY_BYTES; i++) {
        int hi = hex_value(hex[2 * i]), lo = hex_value(hex[2 * i + 1]);
        if (hi < 0 || lo < 0)
            return KVD_ERR_INVALID;
        key[i] = (uint8_t)(hi << 4 | lo);
    }
    return KVD_OK;
}
