/*
 * Description: the SGLang-compatible page-key chain (kvd_key_chain) against
 * an independent SHA-256, and the hex form of keys (kvd_key_to_hex,
 * kvd_key_from_hex).
 *
 * The chain is key[i] = SHA256(key[i-1] || tokens of page i as uint32
 * little-endian), key[-1] = the prior digest or nothing. The reference
 * SHA-256 below is written from FIPS 180-4 in this file (not OpenSSL, which
 * the library uses), and is checked on the FIPS test vectors first.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvd_common.h"
#include "ref_sha256.h"

static void ref_digest_hex(const void *data, size_t len, char hex[65])
{
    ref_sha256_t c;
    uint8_t d[32];
    ref_sha256_init(&c);
    ref_sha256_update(&c, data, len);
    ref_sha256_final(&c, d);
    for (int i = 0; i < 32; i++)
        snprintf(hex + 2 * i, 3, "%02x", d[i]);
}

/* ------------------------------------------------------------ tests */

static void test_reference_sha256_fips_vectors(void **state)
{
    (void)state;
    char hex[65];
    ref_digest_hex("abc", 3, hex);
    assert_string_equal(
        hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    ref_digest_hex("", 0, hex);
    assert_string_equal(
        hex, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    const char *two_blocks = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    ref_digest_hex(two_blocks, strlen(two_blocks), hex);
    assert_string_equal(
        hex, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");

    /* one million 'a', fed in uneven pieces */
    ref_sha256_t c;
    uint8_t d[32];
    char piece[997];
    memset(piece, 'a', sizeof(piece));
    ref_sha256_init(&c);
    size_t left = 1000000;
    while (left > 0) {
        size_t n = left < sizeof(piece) ? left : sizeof(piece);
        ref_sha256_update(&c, piece, n);
        left -= n;
    }
    ref_sha256_final(&c, d);
    for (int i = 0; i < 32; i++)
        snprintf(hex + 2 * i, 3, "%02x", d[i]);
    assert_string_equal(
        hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

/* Runs both chains on the same input and compares every key. */
static void check_chain(const uint32_t *tokens, size_t n_tokens, size_t page_size,
                        const uint8_t *prior)
{
    size_t want_pages = n_tokens / page_size;
    size_t cap = want_pages + 1;
    uint8_t(*got)[KVD_KEY_BYTES] = calloc(cap, KVD_KEY_BYTES);
    uint8_t(*want)[KVD_KEY_BYTES] = calloc(cap, KVD_KEY_BYTES);
    assert_non_null(got);
    assert_non_null(want);
    memset(got, 0x5a, cap * KVD_KEY_BYTES);

    size_t n_keys = 12345;
    assert_int_equal(kvd_key_chain(tokens, n_tokens, page_size, prior, got, &n_keys),
                     KVD_OK);
    assert_int_equal(n_keys, want_pages);
    assert_int_equal(ref_page_chain(tokens, n_tokens, page_size, prior, want),
                     want_pages);
    for (size_t i = 0; i < want_pages; i++) {
        if (memcmp(got[i], want[i], KVD_KEY_BYTES) != 0)
            print_error("page size %zu: key %zu of %zu differs\n", page_size, i,
                        want_pages);
        assert_memory_equal(got[i], want[i], KVD_KEY_BYTES);
    }
    /* nothing is written past the last full page */
    for (size_t b = 0; b < KVD_KEY_BYTES; b++)
        assert_int_equal(got[want_pages][b], 0x5a);
    free(got);
    free(want);
}

static uint32_t *make_tokens(size_t n, uint32_t seed)
{
    uint32_t *t = malloc((n ? n : 1) * sizeof(*t));
    assert_non_null(t);
    uint32_t x = seed;
    for (size_t i = 0; i < n; i++) {
        x = x * 1664525u + 1013904223u;
        t[i] = x % 152064u; /* a vocabulary-sized id */
    }
    return t;
}

static void test_chain_matches_reference_page_sizes(void **state)
{
    (void)state;
    uint32_t *tokens = make_tokens(256, 1);
    check_chain(tokens, 1, 1, NULL);
    check_chain(tokens, 16, 1, NULL);
    check_chain(tokens, 16, 4, NULL);
    check_chain(tokens, 256, 4, NULL);
    check_chain(tokens, 64, 64, NULL);
    check_chain(tokens, 256, 64, NULL);
    free(tokens);
}

static void test_chain_single_page_is_plain_digest(void **state)
{
    (void)state;
    /* tokens {1, 2} -> SHA256(01 00 00 00 02 00 00 00), no prior */
    const uint32_t tokens[2] = {1, 2};
    const uint8_t bytes[8] = {1, 0, 0, 0, 2, 0, 0, 0};
    uint8_t keys[1][KVD_KEY_BYTES];
    size_t n = 0;
    assert_int_equal(kvd_key_chain(tokens, 2, 2, NULL, keys, &n), KVD_OK);
    assert_int_equal(n, 1);
    char got[65], want[65];
    kvd_key_to_hex(keys[0], got);
    ref_digest_hex(bytes, sizeof(bytes), want);
    assert_string_equal(got, want);
}

static void test_chain_partial_last_page_ignored(void **state)
{
    (void)state;
    uint32_t *tokens = make_tokens(70, 2);
    check_chain(tokens, 7, 4, NULL);   /* 1 key, 3 tokens left over */
    check_chain(tokens, 70, 64, NULL); /* 1 key */
    check_chain(tokens, 63, 64, NULL); /* no full page: 0 keys */
    check_chain(tokens, 0, 4, NULL);   /* no tokens: 0 keys */

    /* the leftover tokens do not change the full pages' keys */
    uint8_t a[2][KVD_KEY_BYTES], b[2][KVD_KEY_BYTES];
    size_t na = 0, nb = 0;
    assert_int_equal(kvd_key_chain(tokens, 8, 4, NULL, a, &na), KVD_OK);
    assert_int_equal(kvd_key_chain(tokens, 11, 4, NULL, b, &nb), KVD_OK);
    assert_int_equal(na, 2);
    assert_int_equal(nb, 2);
    assert_memory_equal(a, b, sizeof(a));
    free(tokens);
}

static void test_chain_with_prior(void **state)
{
    (void)state;
    uint32_t *tokens = make_tokens(128, 3);
    uint8_t prior[KVD_KEY_BYTES];
    for (int i = 0; i < KVD_KEY_BYTES; i++)
        prior[i] = (uint8_t)(0xa0 + i);
    check_chain(tokens, 128, 4, prior);
    check_chain(tokens, 128, 64, prior);
    check_chain(tokens, 5, 1, prior);

    /* continuing a chain from its last key gives the same keys as one chain */
    uint8_t whole[8][KVD_KEY_BYTES], first[4][KVD_KEY_BYTES], rest[4][KVD_KEY_BYTES];
    size_t n = 0;
    assert_int_equal(kvd_key_chain(tokens, 32, 4, NULL, whole, &n), KVD_OK);
    assert_int_equal(n, 8);
    assert_int_equal(kvd_key_chain(tokens, 16, 4, NULL, first, &n), KVD_OK);
    assert_int_equal(n, 4);
    assert_int_equal(kvd_key_chain(tokens + 16, 16, 4, first[3], rest, &n), KVD_OK);
    assert_int_equal(n, 4);
    assert_memory_equal(whole[0], first[0], 4 * KVD_KEY_BYTES);
    assert_memory_equal(whole[4], rest[0], 4 * KVD_KEY_BYTES);

    /* a prior changes the first key */
    uint8_t with[1][KVD_KEY_BYTES], without[1][KVD_KEY_BYTES];
    assert_int_equal(kvd_key_chain(tokens, 4, 4, prior, with, &n), KVD_OK);
    assert_int_equal(kvd_key_chain(tokens, 4, 4, NULL, without, &n), KVD_OK);
    assert_memory_not_equal(with[0], without[0], KVD_KEY_BYTES);
    free(tokens);
}

static void test_chain_large_token_ids_byte_order(void **state)
{
    (void)state;
    const uint32_t tokens[8] = {0x01000000u, 0x12345678u, 0xfffffffeu, 0x00ffffffu,
                                0x80000000u, 0x7f000001u, 16777216u,   4294967295u};
    check_chain(tokens, 8, 1, NULL);
    check_chain(tokens, 8, 4, NULL);
    check_chain(tokens, 8, 8, NULL);

    /* the page's bytes are 78 56 34 12: little-endian, whatever the host */
    const uint32_t one[1] = {0x12345678u};
    const uint8_t le[4] = {0x78, 0x56, 0x34, 0x12};
    uint8_t key[1][KVD_KEY_BYTES];
    size_t n = 0;
    assert_int_equal(kvd_key_chain(one, 1, 1, NULL, key, &n), KVD_OK);
    char got[65], want[65];
    kvd_key_to_hex(key[0], got);
    ref_digest_hex(le, 4, want);
    assert_string_equal(got, want);
}

static void test_chain_page_size_zero_invalid(void **state)
{
    (void)state;
    const uint32_t tokens[4] = {1, 2, 3, 4};
    uint8_t keys[4][KVD_KEY_BYTES];
    size_t n = 99;
    assert_int_equal(kvd_key_chain(tokens, 4, 0, NULL, keys, &n), KVD_ERR_INVALID);
    assert_int_equal(n, 99);
}

static void test_hex_round_trip(void **state)
{
    (void)state;
    uint8_t key[KVD_KEY_BYTES], back[KVD_KEY_BYTES];
    for (int i = 0; i < KVD_KEY_BYTES; i++)
        key[i] = (uint8_t)(i * 37 + 11);
    key[0] = 0x00;
    key[1] = 0xff;
    key[2] = 0xab;
    char hex[65];
    memset(hex, 'x', sizeof(hex));
    kvd_key_to_hex(key, hex);
    assert_int_equal(strlen(hex), 64);
    assert_memory_equal(hex, "00ffab", 6);
    for (int i = 0; i < 64; i++)
        assert_true((hex[i] >= '0' && hex[i] <= '9') || (hex[i] >= 'a' && hex[i] <= 'f'));
    assert_int_equal(kvd_key_from_hex(hex, back), KVD_OK);
    assert_memory_equal(key, back, KVD_KEY_BYTES);

    /* upper case is read too */
    const char *upper =
        "00FFAB0102030405060708090A0B0C0D0E0F101112131415161718191A1B1C1D";
    assert_int_equal(kvd_key_from_hex(upper, back), KVD_OK);
    assert_int_equal(back[0], 0x00);
    assert_int_equal(back[1], 0xff);
    assert_int_equal(back[2], 0xab);
    assert_int_equal(back[31], 0x1d);
}

static void test_hex_rejects_bad_input(void **state)
{
    (void)state;
    char good[65];
    memset(good, 'a', 64);
    good[64] = '\0';
    uint8_t key[KVD_KEY_BYTES];
    assert_int_equal(kvd_key_from_hex(good, key), KVD_OK);

    char buf[80];
    const char *bad_chars = "gG -x:\xff";
    for (const char *c = bad_chars; *c; c++) {
        for (size_t pos = 0; pos < 64; pos += 21) {
            memcpy(buf, good, 65);
            buf[pos] = *c;
            memset(key, 0x77, sizeof(key));
            assert_int_equal(kvd_key_from_hex(buf, key), KVD_ERR_INVALID);
        }
    }
    memcpy(buf, good, 65);
    buf[63] = 'z';
    assert_int_equal(kvd_key_from_hex(buf, key), KVD_ERR_INVALID);

    /* wrong lengths */
    memcpy(buf, good, 65);
    buf[63] = '\0';
    assert_int_equal(kvd_key_from_hex(buf, key), KVD_ERR_INVALID);
    memcpy(buf, good, 65);
    buf[64] = 'a';
    buf[65] = '\0';
    assert_int_equal(kvd_key_from_hex(buf, key), KVD_ERR_INVALID);
    assert_int_equal(kvd_key_from_hex("", key), KVD_ERR_INVALID);
    assert_int_equal(kvd_key_from_hex(NULL, key), KVD_ERR_INVALID);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reference_sha256_fips_vectors),
        cmocka_unit_test(test_chain_matches_reference_page_sizes),
        cmocka_unit_test(test_chain_single_page_is_plain_digest),
        cmocka_unit_test(test_chain_partial_last_page_ignored),
        cmocka_unit_test(test_chain_with_prior),
        cmocka_unit_test(test_chain_large_token_ids_byte_order),
        cmocka_unit_test(test_chain_page_size_zero_invalid),
        cmocka_unit_test(test_hex_round_trip),
        cmocka_unit_test(test_hex_rejects_bad_input),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
