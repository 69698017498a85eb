/*
 * segment.c - the SSD tier's record format (segment.h): sealing and
 * checking a record header block. Pure functions, no I/O.
 */
#include "segment.h"

#include <string.h>

void seg_rec_seal(void *block)
{
    seg_rec_hdr_t *h = block;
    h->hdr_crc = 0;
    h->hdr_crc = kvd_crc32c(0, block, SEG_BLOCK);
}

bool seg_rec_valid(const void *block)
{
    seg_rec_hdr_t h;
    memcpy(&h, block, sizeof(h));
    if (h.magic != SEG_REC_MAGIC || h.version != SEG_VERSION)
        return false;
    /* the CRC is of the block with its own field zero: continue around it */
    static const uint8_t zero[4];
    size_t at = offsetof(seg_rec_hdr_t, hdr_crc);
    uint32_t crc = kvd_crc32c(0, block, at);
    crc = kvd_crc32c(crc, zero, sizeof(zero));
    crc = kvd_crc32c(crc, (const uint8_t *)block + at + 4, SEG_BLOCK - at - 4);
    return crc == h.hdr_crc;
}
