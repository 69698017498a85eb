/*
 * journal.c - the journal file (journal.h): header, records, reading with
 * torn-tail detection, appending in one write(2) per batch, compaction
 * through a second file and a rename.
 *
 * Files are created private (mode 0600, O_EXCL after removing a stale
 * one, O_NOFOLLOW): the journal holds the store's hash secret, and the
 * directory (/dev/shm) is shared with every user of the host. A journal
 * that is not a regular file of this user, private to it, is refused.
 */
#include "journal.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

/* Snapshot entries are written in records of about this much. */
#define SNAP_RECORD_BYTES (1u << 20)

/* A growable byte buffer whose first JNL_RECORD_HDR bytes are the record
 * header, filled in when it is written. */
typedef struct rbuf {
    uint8_t *data;
    size_t len, cap;
    bool failed; /* an allocation failed: the batch is incomplete */
} rbuf_t;

/* One file being appended to. */
typedef struct jfile {
    int fd;
    uint64_t size; /* bytes known whole: the next record goes here */
    bool damaged;  /* a torn write past size could not be cut off */
} jfile_t;

struct jnl {
    char path[PATH_MAX];
    char tmp[PATH_MAX];
    jfile_t main;
    jfile_t next; /* path.tmp while rewriting; fd -1 otherwise */
    rbuf_t batch, snap;
    uint64_t records;
    uint32_t fail_cuts; /* tests: cut-backs still to fail */
};

/* ----------------------------------------------------------- buffers */

static void rbuf_reset(rbuf_t *b)
{
    b->len = JNL_RECORD_HDR;
    b->failed = false;
}

static uint8_t *rbuf_put(rbuf_t *b, size_t bytes)
{
    if (b->failed)
        return NULL;
    if (b->len + bytes > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + bytes)
            cap *= 2;
        uint8_t *d = kvd_mem_realloc(KVD_MEM_OTHER, b->data, b->cap, cap);
        if (d == NULL) {
            b->failed = true;
            return NULL;
        }
        b->data = d;
        b->cap = cap;
    }
    uint8_t *p = b->data + b->len;
    b->len += bytes;
    return p;
}

static void rbuf_free(rbuf_t *b)
{
    kvd_mem_free(KVD_MEM_OTHER, b->data, b->cap);
    memset(b, 0, sizeof(*b));
}

/* Fills in the record header of b's payload. */
static void rbuf_seal(rbuf_t *b)
{
    uint32_t len = (uint32_t)(b->len - JNL_RECORD_HDR);
    uint32_t crc =
        kvd_crc32c(kvd_crc32c(0, &len, sizeof(len)), b->data + JNL_RECORD_HDR, len);
    memcpy(b->data, &len, sizeof(len));
    memcpy(b->data + 4, &crc, sizeof(crc));
}

/* ------------------------------------------------------------- files */

/* Writes all of buf at f->size; on failure cuts the file back to f->size
 * (so that no torn record stays for later records to follow) and returns
 * the error. */
static int jfile_append(jnl_t *j, jfile_t *f, const uint8_t *buf, size_t len)
{
    size_t done = 0;
    while (done < len) {
        ssize_t n = pwrite(f->fd, buf + done, len - done, (off_t)(f->size + done));
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            int err = n < 0 ? errno : ENOSPC;
            bool failed = j->fail_cuts > 0 ? (j->fail_cuts--, errno = EIO, true)
                                           : ftruncate(f->fd, (off_t)f->size) != 0;
            if (failed) {
                /* the torn bytes stay after f->size: the caller must not
                 * append here again (jnl_damaged) */
                KVD_ERROR("journal", "cutting back a failed write: %s", strerror(errno));
                f->damaged = true;
            }
            return kvd_status_from_errno(err);
        }
        done += (size_t)n;
    }
    f->size += len;
    return KVD_OK;
}

/* Creates `path` afresh, private to this user: a stale file of ours there
 * is removed first, and anything that then is there (another user's file,
 * in a shared directory) makes it fail rather than be written into. */
static int create_private(const char *path, int *fd_out)
{
    if (unlink(path) != 0 && errno != ENOENT) {
        int err = errno;
        KVD_ERROR("journal", "cannot remove the stale %s: %s", path, strerror(err));
        return kvd_status_from_errno(err);
    }
    int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) {
        int err = errno;
        KVD_ERROR("journal", "cannot create %s: %s", path, strerror(err));
        return kvd_status_from_errno(err);
    }
    *fd_out = fd;
    return KVD_OK;
}

static void header_seal(jnl_header_t *h)
{
    h->crc = kvd_crc32c(0, h, offsetof(jnl_header_t, crc));
}

void jnl_header_init(jnl_header_t *h)
{
    memset(h, 0, sizeof(*h));
    memcpy(h->magic, JNL_MAGIC, sizeof(h->magic));
    h->byte_order = JNL_BYTE_ORDER;
    h->version = JNL_VERSION;
    h->header_bytes = sizeof(*h);
}

/* Starts a new file at path with hdr: f is open on it, its size the
 * header's. */
static int jfile_begin(jnl_t *j, const char *path, const jnl_header_t *hdr, jfile_t *f)
{
    jnl_header_t h = *hdr;
    header_seal(&h);
    int rc = create_private(path, &f->fd);
    if (rc != KVD_OK)
        return rc;
    f->size = 0;
    f->damaged = false;
    rc = jfile_append(j, f, (const uint8_t *)&h, sizeof(h));
    if (rc != KVD_OK) {
        KVD_ERROR("journal", "writing the header of %s: %s", path, kvd_status_str(rc));
        close(f->fd);
        f->fd = -1;
        unlink(path);
    }
    return rc;
}

static jnl_t *jnl_alloc(const char *path)
{
    jnl_t *j = kvd_mem_calloc(KVD_MEM_OTHER, 1, sizeof(*j));
    if (j == NULL)
        return NULL;
    if (snprintf(j->path, sizeof(j->path), "%s", path) >= (int)sizeof(j->path) ||
        snprintf(j->tmp, sizeof(j->tmp), "%s.tmp", path) >= (int)sizeof(j->tmp)) {
        kvd_mem_free(KVD_MEM_OTHER, j, sizeof(*j));
        return NULL;
    }
    j->main.fd = j->next.fd = -1;
    rbuf_reset(&j->batch);
    rbuf_reset(&j->snap);
    return j;
}

int jnl_new(const char *path, jnl_t **out)
{
    jnl_t *j = jnl_alloc(path);
    if (j == NULL)
        return KVD_ERR_NOMEM;
    *out = j;
    return KVD_OK;
}

int jnl_create(const char *path, const jnl_header_t *hdr, jnl_t **out)
{
    jnl_t *j = NULL;
    int rc = jnl_new(path, &j);
    if (rc == KVD_OK)
        rc = jnl_rewrite_begin(j, hdr);
    if (rc == KVD_OK)
        rc = jnl_rewrite_finish(j);
    if (rc != KVD_OK) {
        jnl_close(j);
        return rc;
    }
    *out = j;
    return KVD_OK;
}

void jnl_close(jnl_t *j)
{
    if (j == NULL)
        return;
    if (j->next.fd >= 0)
        jnl_rewrite_abort(j);
    if (j->main.fd >= 0)
        close(j->main.fd);
    rbuf_free(&j->batch);
    rbuf_free(&j->snap);
    kvd_mem_free(KVD_MEM_OTHER, j, sizeof(*j));
}

/* ----------------------------------------------------------- reading */

#define WHY(...)                                 \
    do {                                         \
        if (why)                                 \
            snprintf(why, why_len, __VA_ARGS__); \
    } while (0)

/* Checks the header at the start of the file's n bytes. */
static int header_check(const uint8_t *p, size_t n, const char *path, jnl_header_t *hdr,
                        char *why, size_t why_len)
{
    if (n < sizeof(jnl_header_t) || memcmp(p, JNL_MAGIC, sizeof(JNL_MAGIC)) != 0) {
        WHY("%s is not a kvdock journal (%s)", path,
            n < sizeof(jnl_header_t) ? "too short for a header" : "no magic");
        return KVD_ERR_STATE;
    }
    memcpy(hdr, p, sizeof(*hdr));
    if (hdr->byte_order != JNL_BYTE_ORDER) {
        WHY("%s was written with another byte order", path);
        return KVD_ERR_STATE;
    }
    if (hdr->version < JNL_VERSION_OLDEST || hdr->version > JNL_VERSION ||
        hdr->header_bytes != sizeof(*hdr)) {
        WHY("%s is a journal of layout version %u (header %u bytes); this kvdockd "
            "reads versions %u to %u (%zu bytes)",
            path, hdr->version, hdr->header_bytes, JNL_VERSION_OLDEST, JNL_VERSION,
            sizeof(*hdr));
        return KVD_ERR_STATE;
    }
    if (kvd_crc32c(0, hdr, offsetof(jnl_header_t, crc)) != hdr->crc) {
        WHY("%s: the header's checksum does not match (the file is damaged)", path);
        return KVD_ERR_STATE;
    }
    return KVD_OK;
}

static bool all_zero(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] != 0)
            return false;
    return true;
}

int jnl_read(const char *path, jnl_header_t *hdr, jnl_record_fn fn, void *arg,
             jnl_scan_t *scan, char *why, size_t why_len)
{
    memset(scan, 0, sizeof(*scan));
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
        int err = errno;
        if (err == ENOENT)
            return KVD_ERR_NOT_FOUND;
        WHY("cannot open %s: %s", path, strerror(err));
        return kvd_status_from_errno(err);
    }
    struct stat st;
    int rc = KVD_OK;
    if (fstat(fd, &st) != 0) {
        int err = errno;
        WHY("cannot stat %s: %s", path, strerror(err));
        rc = kvd_status_from_errno(err);
    } else if (!S_ISREG(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 077)) {
        WHY("%s is not a regular file private to uid %u (owner %u, mode %04o)", path,
            (unsigned)geteuid(), (unsigned)st.st_uid, (unsigned)(st.st_mode & 07777));
        rc = KVD_ERR_STATE;
    }
    if (rc != KVD_OK) {
        close(fd);
        return rc;
    }
    size_t n = (size_t)st.st_size;
    scan->file_bytes = n;
    const uint8_t *p = NULL;
    if (n > 0) {
        p = mmap(NULL, n, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            int err = errno;
            close(fd);
            WHY("cannot map %s: %s", path, strerror(err));
            return kvd_status_from_errno(err);
        }
    }
    close(fd);
    if (n == 0) {
        /* what jnl_invalidate leaves when it could not rewrite the header */
        jnl_header_init(hdr);
        hdr->flags = JNL_F_INVALID;
        return KVD_OK;
    }
    rc = header_check(p, n, path, hdr, why, why_len);
    if (rc != KVD_OK) {
        munmap((void *)p, n);
        return rc;
    }
    size_t off = sizeof(jnl_header_t);
    while (rc == KVD_OK && n - off >= JNL_RECORD_HDR) {
        uint32_t len, crc;
        memcpy(&len, p + off, 4);
        memcpy(&crc, p + off + 4, 4);
        if (len > JNL_RECORD_MAX || len > n - off - JNL_RECORD_HDR)
            break; /* torn: its length runs past the end, or is garbage */
        const uint8_t *payload = p + off + JNL_RECORD_HDR;
        if (kvd_crc32c(kvd_crc32c(0, &len, 4), payload, len) != crc) {
            /* the last record: torn (dropping it loses at most that one
             * batch: any later change would have a record after it). A
             * record with more after it is damage, not a tear (a write
             * cut short never leaves bytes behind it): the records after
             * it, such as an extent's FREE before its reuse, would be
             * lost, and a replay without them would serve wrong bytes */
            if (off + JNL_RECORD_HDR + len == n || all_zero(p + off, n - off))
                break; /* (a tail of zeros: a file extended past its records) */
            WHY("%s: record %llu (at byte %zu) fails its checksum with %zu bytes after "
                "it: "
                "the journal is damaged (--fresh starts without it)",
                path, (unsigned long long)scan->records, off,
                n - off - JNL_RECORD_HDR - len);
            rc = KVD_ERR_STATE;
            break;
        }
        rc = fn(arg, payload, len);
        off += JNL_RECORD_HDR + len;
        scan->records++;
    }
    scan->good_bytes = off;
    scan->torn_bytes = n - off;
    munmap((void *)p, n);
    return rc;
}

/* ------------------------------------------------------------- batch */

uint8_t *jnl_put(jnl_t *j, size_t bytes)
{
    return rbuf_put(&j->batch, bytes);
}

bool jnl_pending(const jnl_t *j)
{
    return j->batch.len > JNL_RECORD_HDR || j->batch.failed;
}

void jnl_discard(jnl_t *j)
{
    rbuf_reset(&j->batch);
}

int jnl_commit(jnl_t *j)
{
    if (j->batch.failed) {
        rbuf_reset(&j->batch);
        return KVD_ERR_NOMEM;
    }
    if (j->batch.len == JNL_RECORD_HDR)
        return KVD_OK;
    if (j->main.fd < 0) {
        rbuf_reset(&j->batch);
        return KVD_ERR_STATE; /* no file yet (jnl_new before its first rewrite) */
    }
    if (j->main.damaged) {
        rbuf_reset(&j->batch);
        return KVD_ERR_IO;
    }
    /* the snapshot so far goes before this batch in the new file: a slice
     * reflects the store as it was before the batch's changes */
    if (j->next.fd >= 0 && jnl_rewrite_flush(j) != KVD_OK)
        jnl_rewrite_abort(j);
    /* a record the reader would refuse must not be written: the caller
     * breaks the journal instead */
    if (j->batch.len > (size_t)JNL_RECORD_HDR + JNL_RECORD_MAX) {
        rbuf_reset(&j->batch);
        return KVD_ERR_TOO_LARGE;
    }
    rbuf_seal(&j->batch);
    int rc = jfile_append(j, &j->main, j->batch.data, j->batch.len);
    if (rc == KVD_OK) {
        j->records++;
        if (j->next.fd >= 0) {
            if (jfile_append(j, &j->next, j->batch.data, j->batch.len) == KVD_OK)
                j->records++;
            else
                jnl_rewrite_abort(j);
        }
    }
    rbuf_reset(&j->batch);
    return rc;
}

/* ------------------------------------------------------- compaction */

int jnl_rewrite_begin(jnl_t *j, const jnl_header_t *hdr)
{
    if (j->next.fd >= 0)
        return KVD_ERR_STATE;
    rbuf_reset(&j->snap);
    return jfile_begin(j, j->tmp, hdr, &j->next);
}

bool jnl_rewriting(const jnl_t *j)
{
    return j->next.fd >= 0;
}

uint8_t *jnl_rewrite_put(jnl_t *j, size_t bytes)
{
    if (j->snap.len - JNL_RECORD_HDR + bytes > SNAP_RECORD_BYTES &&
        jnl_rewrite_flush(j) != KVD_OK)
        return NULL;
    return rbuf_put(&j->snap, bytes);
}

int jnl_rewrite_flush(jnl_t *j)
{
    if (j->next.fd < 0)
        return KVD_ERR_STATE;
    if (j->snap.failed) {
        rbuf_reset(&j->snap);
        return KVD_ERR_NOMEM;
    }
    if (j->snap.len == JNL_RECORD_HDR)
        return KVD_OK;
    rbuf_seal(&j->snap);
    int rc = jfile_append(j, &j->next, j->snap.data, j->snap.len);
    if (rc == KVD_OK)
        j->records++;
    rbuf_reset(&j->snap);
    return rc;
}

int jnl_rewrite_finish(jnl_t *j)
{
    int rc = jnl_rewrite_flush(j);
    if (rc != KVD_OK) {
        jnl_rewrite_abort(j);
        return rc;
    }
    if (rename(j->tmp, j->path) != 0) {
        int err = errno;
        KVD_ERROR("journal", "rename %s to %s: %s", j->tmp, j->path, strerror(err));
        jnl_rewrite_abort(j);
        return kvd_status_from_errno(err);
    }
    if (j->main.fd >= 0)
        close(j->main.fd);
    j->main = j->next;
    j->next.fd = -1;
    j->next.size = 0;
    return KVD_OK;
}

void jnl_rewrite_abort(jnl_t *j)
{
    if (j->next.fd < 0)
        return;
    close(j->next.fd);
    unlink(j->tmp);
    j->next.fd = -1;
    j->next.size = 0;
    rbuf_reset(&j->snap);
}

int jnl_invalidate(jnl_t *j)
{
    if (j->main.fd < 0)
        return KVD_OK;
    /* the flag in the header; else no bytes (read as no journal); else
     * no file: whatever worked, a restart trusts none of its records.
     * Only when all three fail does a stale journal stay: KVD_ERR_IO */
    jnl_header_t h;
    if (pread(j->main.fd, &h, sizeof(h), 0) == (ssize_t)sizeof(h)) {
        h.flags |= JNL_F_INVALID;
        header_seal(&h);
        if (pwrite(j->main.fd, &h, sizeof(h), 0) == (ssize_t)sizeof(h)) {
            /* the records are dead now: their space goes back (a failure
             * here only keeps it) */
            if (ftruncate(j->main.fd, (off_t)sizeof(h)) == 0)
                j->main.size = sizeof(h);
            return KVD_OK;
        }
    }
    if (ftruncate(j->main.fd, 0) == 0) {
        j->main.size = 0;
        return KVD_OK;
    }
    if (unlink(j->path) == 0)
        return KVD_OK;
    return KVD_ERR_IO;
}

/* ------------------------------------------------------------- figures */

uint64_t jnl_bytes(const jnl_t *j)
{
    return j->main.size;
}

bool jnl_damaged(const jnl_t *j)
{
    return j->main.damaged;
}

uint64_t jnl_free_bytes(const jnl_t *j)
{
    struct statvfs fs;
    if (j->main.fd < 0 || fstatvfs(j->main.fd, &fs) != 0)
        return UINT64_MAX;
    return (uint64_t)fs.f_bavail * (uint64_t)fs.f_frsize;
}

void jnl_fail_cuts(jnl_t *j, uint32_t n)
{
    j->fail_cuts = n;
}

uint64_t jnl_rewrite_bytes(const jnl_t *j)
{
    return j->next.fd >= 0 ? j->next.size : 0;
}

uint64_t jnl_records_written(const jnl_t *j)
{
    return j->records;
}

uint64_t jnl_mem_bytes(const jnl_t *j)
{
    return sizeof(*j) + j->batch.cap + j->snap.cap;
}

const char *jnl_path(const jnl_t *j)
{
    return j->path;
}
