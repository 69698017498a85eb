/*
 * journal.h - the journal file of the store's metadata: its format and its
 * I/O, nothing of the engine (persist.c turns engine events into entries
 * and entries back into a store). Private to store/.
 *
 * A journal is a header and a sequence of records:
 *
 *   header   jnl_header_t, fixed size, with a CRC-32C of its bytes: the
 *            layout version, the pool it describes (size, page size, the
 *            pool file's device and inode), the store's hash secret and
 *            clock epoch
 *   record   u32 payload length, u32 CRC-32C (of the length's 4 bytes and
 *            the payload), the payload: entries (persist.c) written by one
 *            write(2), so that one record is one batch of one RPC
 *
 * Reading stops at the first record that is not whole or whose CRC fails: a
 * write cut short by the process's death (SIGKILL lands between the pages a
 * write copies) leaves a torn last record, which is dropped with all it
 * described (nothing is ever appended after it: a restart writes a new
 * journal, persist.c). A write that fails (ENOSPC, EFBIG) is cut back to
 * the last whole record at once, so a record is either all there or not at
 * all, and later records follow whole ones.
 *
 * Durability: a write(2) to a file in /dev/shm (tmpfs) or hugetlbfs is in
 * the page cache, which outlives the process: a SIGKILL, an OOM kill or a
 * crash of the daemon loses nothing written. Nothing here fsyncs: the pool's
 * bytes live in the same memory and do not survive a reboot either, so a
 * disk-grade flush would buy nothing.
 *
 * Compaction: a new file, path.tmp, gets a fresh header and a snapshot
 * written in slices (jnl_rewrite_*), while every commit goes to both files;
 * once the snapshot is whole, a rename(2) puts it in the old one's place
 * (atomic: a crash leaves either file whole, and a stale .tmp is removed at
 * the next start). Entries are upserts keyed by extent (persist.c), which
 * is what makes a snapshot taken in slices under commits read back right.
 *
 * Byte order: native; the file never leaves its host, and a foreign order
 * fails the header's byte-order mark.
 *
 * Threading: none; the store's caller serialises.
 */
#ifndef KVD_STORE_JOURNAL_H
#define KVD_STORE_JOURNAL_H

#include "kvd_common.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define JNL_MAGIC      "KVDJRNL" /* 8 bytes with its NUL */
#define JNL_BYTE_ORDER 0x01020304u
/* 2: HELD entries (persist.c). A version 1 file reads the same, without
 * them; what is written is always the newest version. */
#define JNL_VERSION        2u
#define JNL_VERSION_OLDEST 1u
/* The largest record a reader accepts: a batch of 2^20 keys fits. */
#define JNL_RECORD_MAX (256u << 20)
#define JNL_RECORD_HDR 8u

/* header flags */
#define JNL_F_INVALID      1u /* a write failed: the records are not to be trusted */
#define JNL_F_MULTI_TENANT 2u /* the pool has held bytes of several tenants */
#define JNL_F_HUGEPAGES    4u /* the pool is of 2 MiB hugetlb pages */

typedef struct jnl_header {
    char magic[8];
    uint32_t byte_order;
    uint32_t version;
    uint32_t header_bytes; /* sizeof(jnl_header_t) */
    uint32_t page_bytes;   /* the store's allocation unit: object alignment */
    uint64_t pool_bytes;
    uint64_t pool_dev, pool_ino; /* the pool file this journal describes */
    uint64_t epoch_ms;           /* the store's clock base (last access times) */
    uint64_t secret[6];          /* the store's hash secret: tags stay valid */
    uint64_t written_ms;         /* wall clock when this file was begun */
    uint32_t flags;              /* JNL_F_* */
    uint32_t crc;                /* CRC-32C of every byte above */
} jnl_header_t;

/* What reading a journal found. */
typedef struct jnl_scan {
    uint64_t file_bytes;
    uint64_t good_bytes; /* the header and every whole record */
    uint64_t records;
    uint64_t torn_bytes; /* after the last whole record */
} jnl_scan_t;

typedef struct jnl jnl_t;

/* Called with each whole record's payload; non-zero stops the reading and
 * is returned. */
typedef int (*jnl_record_fn)(void *arg, const uint8_t *payload, size_t len);

/* Fills the fixed fields of a header (magic, byte order, version, size);
 * the caller sets the rest. */
void jnl_header_init(jnl_header_t *h);

/*
 * Reads the journal at path: the header into *hdr, then every whole record
 * to fn, in order. Returns KVD_OK (scan filled); KVD_ERR_NOT_FOUND when
 * there is no file; KVD_ERR_STATE when it is not a journal of this layout
 * (magic, byte order, version, size, CRC: `why` says which); KVD_ERR_IO
 * and the like when it cannot be read; fn's non-zero value.
 */
int jnl_read(const char *path, jnl_header_t *hdr, jnl_record_fn fn, void *arg,
             jnl_scan_t *scan, char *why, size_t why_len);

/* A journal at path with no file yet: its first file comes from
 * jnl_rewrite_begin .. jnl_rewrite_finish (a snapshot written whole before
 * the rename puts it in place of what was there). */
int jnl_new(const char *path, jnl_t **out);

/* Creates a journal of hdr alone at path (written at path.tmp, renamed)
 * and opens it for appending. */
int jnl_create(const char *path, const jnl_header_t *hdr, jnl_t **out);

/* Closes (NULL is fine). Nothing pending is written. */
void jnl_close(jnl_t *j);

/* --- the open batch: entries of one engine call, written by jnl_commit */

/* Room for `bytes` of entry at the end of the open batch (valid until the
 * next call); NULL out of memory (the batch is then lost: jnl_commit fails). */
uint8_t *jnl_put(jnl_t *j, size_t bytes);
bool jnl_pending(const jnl_t *j);
/* Writes the open batch as one record, to the journal and (while a rewrite
 * runs) to the new file: KVD_OK, or the error after cutting the file back
 * to its last whole record. An empty batch writes nothing. */
int jnl_commit(jnl_t *j);
/* Drops the open batch without writing it. */
void jnl_discard(jnl_t *j);

/* --- compaction */

/* Begins path.tmp with hdr; commits go to both files from now on. */
int jnl_rewrite_begin(jnl_t *j, const jnl_header_t *hdr);
bool jnl_rewriting(const jnl_t *j);
/* Appends snapshot entries to the new file only (buffered; written in
 * records of up to 1 MiB, and at jnl_rewrite_flush). */
uint8_t *jnl_rewrite_put(jnl_t *j, size_t bytes);
int jnl_rewrite_flush(jnl_t *j);
/* Flushes, renames path.tmp over path: the new file is the journal. */
int jnl_rewrite_finish(jnl_t *j);
/* Removes path.tmp; the old file stays the journal. */
void jnl_rewrite_abort(jnl_t *j);

/* Marks the journal's header JNL_F_INVALID (in place: the header's page
 * exists, so this does not need new space): a restart then discards it.
 * The records after the header are cut off: they are of no use any more,
 * and on a full file system their space is what the rewrite needs. */
int jnl_invalidate(jnl_t *j);

/* A failed append whose torn bytes could not be cut back (ftruncate
 * failed): the file may end in part of a record, so it must not be
 * appended to again; the caller invalidates it and rewrites. Cleared when
 * a rewrite replaces the file. */
bool jnl_damaged(const jnl_t *j);

/* Free bytes on the journal's file system (for a plain user: f_bavail);
 * UINT64_MAX when it cannot be told. */
uint64_t jnl_free_bytes(const jnl_t *j);

/* Tests: the next n cut-backs of a failed append fail as if ftruncate
 * had (EIO). */
void jnl_fail_cuts(jnl_t *j, uint32_t n);

/* Bytes of the journal file (and of the new one while rewriting). */
uint64_t jnl_bytes(const jnl_t *j);
uint64_t jnl_rewrite_bytes(const jnl_t *j);
/* Records written (commits and snapshot records), counting both files. */
uint64_t jnl_records_written(const jnl_t *j);
/* What the journal holds in memory (the batch buffers). */
uint64_t jnl_mem_bytes(const jnl_t *j);
const char *jnl_path(const jnl_t *j);

#endif
