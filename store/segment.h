/*
 * segment.h - the on-disk format of the SSD tier: segment files of
 * checksummed records, and the checkpoint of the tier's index. Format
 * only: the I/O is tier_io.c's, the index and the policy tier.c's.
 * Private to store/.
 *
 * A tier is a directory holding
 *   seg-NNNNNN.kvs   segment files, SEG_BYTES_DEFAULT each (a few hundred
 *                    MiB), written append-only with O_DIRECT;
 *   seg-NNNNNN.sum   a closed segment's summary: every record written into
 *                    it (seg_sum_hdr_t, then namespaces, then entries,
 *                    CRC-32C), written when its last write has ended, so
 *                    that a restart reads it instead of the segment's
 *                    headers (a scan of small records reads the whole tier);
 *                    one of an older generation is ignored, one missing
 *                    (a crash before it was written) means a scan;
 *   tier.ckpt        the checkpoint: every live record as of when it was
 *                    written (tmp file, fsync, rename, fsync of the
 *                    directory), so a restart reads it and scans only what
 *                    each segment got after it;
 *   tier.dead        the dead-list: records no object's since the checkpoint
 *                    began (tier.c's dead_ent_t, appended), which a restart
 *                    drops, so that an object gone does not come back;
 *   tier.lock        one daemon per tier (flock), holding its pid.
 *
 * A segment file starts with one block (SEG_BLOCK bytes), seg_file_hdr_t,
 * then records, each block-aligned:
 *
 *   block 0      seg_rec_hdr_t, padded to SEG_BLOCK: the key, namespace
 *                (tenant and name: tenant ids are not stable across
 *                configurations, names are), sizes, a sequence number, the
 *                chain metadata, the CRC-32C of the value and of the
 *                header itself
 *   blocks 1..n  the value, value_bytes (a multiple of SEG_BLOCK)
 *
 * A record is valid when its header's magic, version and CRC hold and its
 * value's CRC matches when it is read (a promotion checks it; a scan at
 * start checks only headers, which is what makes it fast). Records are
 * never changed in place; a segment is reused only whole, with a new
 * generation in its header, so a checkpoint entry of an older generation
 * is known stale. A write cut short (a crash) or a torn block fails a CRC
 * and ends that segment's scan; a place whose write failed is covered by a
 * pad record (SEG_REC_PAD), so that the scan goes on past it. The tier
 * acknowledges a record (frees its DRAM copy) only once every place before
 * it in its segment is written, so a scan that stops at a torn record has
 * seen every acknowledged one.
 *
 * Byte order: native, as the journal's; a foreign order fails the magic.
 */
#ifndef KVD_STORE_SEGMENT_H
#define KVD_STORE_SEGMENT_H

#include "kvd_common.h"
#include "kvd_store.h"

#include <stdint.h>

#define SEG_BLOCK         4096u /* O_DIRECT alignment and the record grain */
#define SEG_VERSION       1u
#define SEG_FILE_MAGIC    0x4753564bu /* "KVSG" */
#define SEG_REC_MAGIC     0x4352564bu /* "KVRC" */
#define SEG_BYTES_DEFAULT (256ull << 20)
#define SEG_REC_PAD       1u /* seg_rec_hdr_t.flags: a place whose write failed */

typedef struct seg_file_hdr {
    uint32_t magic; /* SEG_FILE_MAGIC */
    uint32_t version;
    uint64_t seg_bytes;  /* the file's size */
    uint32_t seg_id;     /* its number in the directory */
    uint32_t block;      /* SEG_BLOCK */
    uint64_t generation; /* bumped each time the segment is begun again */
    uint64_t tier_id;    /* random, per tier: a segment of another tier is refused */
    uint64_t created_ms; /* wall clock */
    uint32_t reserved;
    uint32_t crc; /* CRC-32C of every byte above */
} seg_file_hdr_t;

typedef struct seg_rec_hdr {
    uint32_t magic; /* SEG_REC_MAGIC */
    uint32_t version;
    uint32_t hdr_crc;    /* CRC-32C of the whole block with this field 0 */
    uint32_t value_crc;  /* CRC-32C of the value's bytes */
    uint64_t seq;        /* the tier's write order: the newest of a key wins */
    uint64_t generation; /* its segment's, when written */
    uint64_t value_bytes;
    uint64_t object_bytes; /* the namespace's object size (<= value_bytes) */
    uint8_t key[KVD_KEY_BYTES];
    uint8_t parent_tag[KVD_KEY_TAG_BYTES];
    uint32_t depth;
    uint32_t last_access_s; /* the store's clock (seconds since its epoch) */
    uint16_t hits;
    uint8_t has_parent;
    uint8_t rank_replicated;
    uint32_t flags; /* SEG_REC_PAD: no object, value_bytes of nothing to skip */
    char tenant[KVD_TENANT_NAME_MAX];
    char ns[KVD_NS_NAME_MAX];
} seg_rec_hdr_t;

_Static_assert(sizeof(seg_rec_hdr_t) <= SEG_BLOCK, "a record header fits its block");
_Static_assert(sizeof(seg_file_hdr_t) <= SEG_BLOCK, "a segment header fits its block");

#define SEG_SUM_MAGIC 0x4d53564bu /* "KVSM" */

typedef struct seg_sum_hdr {
    uint32_t magic; /* SEG_SUM_MAGIC */
    uint32_t version;
    uint64_t tier_id;
    uint64_t generation; /* the segment's, when the summary was written */
    uint32_t seg_id;
    uint32_t end_block; /* where writing stopped: the segment's head */
    uint32_t n_ns, n_ent;
    uint32_t reserved, crc; /* CRC-32C of the bytes before it and the body */
} seg_sum_hdr_t;

/* A namespace of a summary (tier.c's checkpoint has the same). */
typedef struct seg_sum_ns {
    char tenant[KVD_TENANT_NAME_MAX];
    char name[KVD_NS_NAME_MAX];
    uint64_t object_bytes;
    uint32_t rank_replicated, reserved;
} seg_sum_ns_t;

/* One record written into a segment, in block order. */
typedef struct seg_sum_ent {
    uint32_t block, blocks; /* its header block, and its length */
    uint64_t seq;           /* its header's (a copy's is its own, newer) */
    uint8_t key[KVD_KEY_BYTES];
    uint8_t parent_tag[KVD_KEY_TAG_BYTES];
    uint32_t depth, last_access_s;
    uint16_t hits, ns;       /* ns: index into the summary's namespaces */
    uint8_t has_parent, pad; /* pad: its write failed (a pad record) */
    uint8_t reserved[2];
} seg_sum_ent_t;

/* Fills hdr_crc of a block (SEG_BLOCK bytes starting with a seg_rec_hdr_t). */
void seg_rec_seal(void *block);
/* True when the block holds a record header of this version whose CRC holds. */
bool seg_rec_valid(const void *block);

#endif
