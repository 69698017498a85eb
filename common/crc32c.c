/*
 * crc32c.c - CRC-32C (Castagnoli, the polynomial of iSCSI, ext4 and NVMe):
 * what the store's journal (and the SSD tier's records) check their bytes
 * with. The SSE4.2 crc32 instruction where the CPU has it (chosen once, at
 * the first call), else slicing-by-8 tables built at the first call.
 *
 * Threading: safe from any thread; the one-time setup is a pthread_once.
 */
#include "kvd_common.h"

#include <pthread.h>
#include <string.h>

#define CRC32C_POLY 0x82f63b78u /* reflected */

static uint32_t table[8][256];
static bool use_hw;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void crc_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = c & 1 ? (c >> 1) ^ CRC32C_POLY : c >> 1;
        table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            table[t][i] = (table[t - 1][i] >> 8) ^ table[0][table[t - 1][i] & 0xff];
#if defined(__x86_64__)
    use_hw = __builtin_cpu_supports("sse4.2");
#endif
}

/* Slicing-by-8 over the raw (inverted) register. */
static uint32_t crc_sw(uint32_t c, const uint8_t *p, size_t n)
{
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        w ^= c;
        c = table[7][w & 0xff] ^ table[6][(w >> 8) & 0xff] ^ table[5][(w >> 16) & 0xff] ^
            table[4][(w >> 24) & 0xff] ^ table[3][(w >> 32) & 0xff] ^
            table[2][(w >> 40) & 0xff] ^ table[1][(w >> 48) & 0xff] ^ table[0][w >> 56];
        p += 8;
        n -= 8;
    }
    while (n-- > 0)
        c = (c >> 8) ^ table[0][(c ^ *p++) & 0xff];
    return c;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) static uint32_t crc_hw(uint32_t c, const uint8_t *p,
                                                         size_t n)
{
    uint64_t c64 = c;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        c64 = __builtin_ia32_crc32di(c64, w);
        p += 8;
        n -= 8;
    }
    c = (uint32_t)c64;
    while (n-- > 0)
        c = __builtin_ia32_crc32qi(c, *p++);
    return c;
}
#endif

uint32_t kvd_crc32c(uint32_t crc, const void *buf, size_t len)
{
    pthread_once(&once, crc_init);
    uint32_t c = ~crc;
#if defined(__x86_64__)
    if (use_hw)
        return ~crc_hw(c, buf, len);
#endif
    return ~crc_sw(c, buf, len);
}

uint32_t kvd_crc32c_sw(uint32_t crc, const void *buf, size_t len)
{
    pthread_once(&once, crc_init);
    return ~crc_sw(~crc, buf, len);
}
