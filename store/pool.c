/*
 * pool.c - the daemon's memory pool: one shared-memory file (memfd, named
 * after the instance) mapped MAP_SHARED, so that same-host workers can map
 * the same pages from the descriptor the daemon hands them.
 *
 * Population runs on its own thread, chunk by chunk: fallocate() allocates
 * the chunk's pages (a full host answers ENOSPC here instead of a SIGBUS at
 * first touch), MADV_POPULATE_WRITE maps them into this process (so the OS
 * reports them as RssShmem), then the thread sleeps as long as the rate bound
 * asks. The loop thread reads progress through atomics. A failure of the
 * thread is kept as a status and a text with the system's reason (written
 * before the status is stored, so a reader that sees the status sees the
 * text).
 *
 * Two descriptors of the one file: the daemon's own (read-write, also the
 * writers') and a read-only one, opened once at creation through
 * /proc/self/fd, for connections that only load: a mapping of it with
 * PROT_WRITE, a write() and fallocate (hole punching) through it all fail.
 * The file's mode is then 0400, so that a client of another uid cannot
 * reopen its read-only descriptor read-write through /proc (a client of the
 * daemon's own uid can chmod it back: it is no boundary, as it could ptrace
 * the daemon too).
 */
#include "kvd_store.h"
#include "store_testing.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <fcntl.h>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
#ifndef MFD_HUGETLB
#define MFD_HUGETLB 0x0004U
#endif

#define POOL_CHUNK_BYTES (64ull * KVD_MiB)
#define HUGE_PAGE_BYTES  (2ull * KVD_MiB)

struct kvd_pool {
    kvd_pool_opts_t opts;
    char name[160];
    int fd;
    int ro_fd; /* the same file, O_RDONLY */
    uint8_t *base;
    uint64_t size_bytes;
    uint64_t page_bytes;
    pthread_t thread;
    bool thread_started;
    atomic_bool stop;
    atomic_bool ready;
    atomic_bool mlocked;
    _Atomic uint64_t populated_bytes;
    atomic_int error;
    char error_text[256]; /* why, once error is set; "" before */
};

int kvd_pool_create(const kvd_pool_opts_t *opts, kvd_pool_t **out)
{
    uint64_t page = opts->hugepages ? HUGE_PAGE_BYTES : (uint64_t)sysconf(_SC_PAGESIZE);
    if (opts->size_bytes == 0 || opts->size_bytes % page != 0) {
        KVD_ERROR("pool",
                  "pool size %llu is not a positive multiple of the %llu-byte page",
                  (unsigned long long)opts->size_bytes, (unsigned long long)page);
        return KVD_ERR_INVALID;
    }
    kvd_pool_t *p = calloc(1, sizeof(*p));
    if (p == NULL)
        return KVD_ERR_NOMEM;
    p->opts = *opts;
    p->size_bytes = opts->size_bytes;
    p->page_bytes = page;
    snprintf(p->name, sizeof(p->name), "kvdock-%s", opts->instance);

    /* sealable: once sized, nobody holding the descriptor (every same-host
     * client does) can shrink or grow the file under everyone's mappings */
    unsigned flags =
        MFD_CLOEXEC | MFD_ALLOW_SEALING | (opts->hugepages ? MFD_HUGETLB : 0);
    p->fd = memfd_create(p->name, flags);
    if (p->fd < 0) {
        int err = errno;
        KVD_ERROR("pool", "memfd_create(%s%s): %s", p->name,
                  opts->hugepages ? ", hugetlb" : "", strerror(err));
        free(p);
        return opts->hugepages ? KVD_ERR_UNSUPPORTED : kvd_status_from_errno(err);
    }
    int err = 0;
    if (ftruncate(p->fd, (off_t)p->size_bytes) != 0) {
        err = errno;
        KVD_ERROR("pool", "ftruncate(%s, %llu): %s", p->name,
                  (unsigned long long)p->size_bytes, strerror(err));
        goto close_fd;
    }
    if (fcntl(p->fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
        err = errno;
        KVD_ERROR("pool", "sealing %s: %s", p->name, strerror(err));
        goto close_fd;
    }
    p->base = mmap(NULL, p->size_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, p->fd, 0);
    if (p->base == MAP_FAILED) {
        err = errno;
        KVD_ERROR("pool", "mmap(%s, %llu): %s%s", p->name,
                  (unsigned long long)p->size_bytes, strerror(err),
                  opts->hugepages && err == ENOMEM
                      ? " (not enough free hugepages: raise vm.nr_hugepages)"
                      : "");
        goto close_fd;
    }
    char path[64];
    snprintf(path, sizeof(path), "/proc/self/fd/%d", p->fd);
    p->ro_fd = open(path, O_RDONLY | O_CLOEXEC);
    if (p->ro_fd < 0) {
        err = errno;
        KVD_ERROR("pool", "reopening %s read-only (%s): %s", p->name, path,
                  strerror(err));
        munmap(p->base, p->size_bytes);
        goto close_fd;
    }
    if (fchmod(p->fd, 0400) != 0)
        KVD_WARN("pool",
                 "chmod 0400 of %s: %s; read-only clients of other uids may "
                 "reopen it read-write",
                 p->name, strerror(errno));
    *out = p;
    return KVD_OK;

close_fd:
    close(p->fd);
    free(p);
    return kvd_status_from_errno(err);
}

/* The population failed with status rc: logs why (with the system's
 * reason, in the text) and keeps both for kvd_pool_error and
 * kvd_pool_error_text. */
static void __attribute__((format(printf, 3, 4)))
pool_fail(kvd_pool_t *p, int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->error_text, sizeof(p->error_text), fmt, ap);
    va_end(ap);
    KVD_ERROR("pool", "%s", p->error_text);
    atomic_store(&p->error, rc);
}

/* Allocates and maps [off, off+len); returns a status (pool_fail said why). */
static int populate_chunk(kvd_pool_t *p, uint64_t off, uint64_t len)
{
    if (fallocate(p->fd, 0, (off_t)off, (off_t)len) != 0) {
        int err = errno;
        int rc = err == ENOSPC || err == ENOMEM ? KVD_ERR_NO_SPACE
                                                : kvd_status_from_errno(err);
        if (err == ENOSPC && p->opts.hugepages)
            pool_fail(p, rc,
                      "out of hugepages at %llu of %llu bytes: reserve "
                      "more with sysctl vm.nr_hugepages=%llu",
                      (unsigned long long)off, (unsigned long long)p->size_bytes,
                      (unsigned long long)(p->size_bytes / HUGE_PAGE_BYTES));
        else
            pool_fail(p, rc, "fallocate at %llu (+%llu): %s", (unsigned long long)off,
                      (unsigned long long)len, strerror(err));
        return rc;
    }
    if (madvise(p->base + off, len, MADV_POPULATE_WRITE) != 0) {
        /* older kernels: touch one byte per page; the pages exist already,
         * so this cannot fault for lack of memory */
        for (uint64_t o = 0; o < len; o += p->page_bytes)
            ((volatile uint8_t *)p->base)[off + o] = 0;
    }
    return KVD_OK;
}

static void *populate_main(void *arg)
{
    kvd_pool_t *p = arg;
    uint64_t start_ns = kvd_now_ns();
    uint64_t rate = p->opts.populate_rate_bps;
    unsigned next_decile = 1;
    char a[32], b[32];

    for (uint64_t off = 0; off < p->size_bytes && !atomic_load(&p->stop);) {
        uint64_t len = KVD_MIN(POOL_CHUNK_BYTES, p->size_bytes - off);
        if (populate_chunk(p, off, len) != KVD_OK)
            return NULL;
        off += len;
        atomic_store(&p->populated_bytes, off);
        /* one line per 10% crossed (a big chunk of a small pool may cross
         * several at once; it still gets one line) */
        unsigned decile = (unsigned)(off * 10 / p->size_bytes);
        if (decile >= next_decile) {
            double secs = (double)(kvd_now_ns() - start_ns) / 1e9;
            KVD_INFO("pool", "populated %s of %s (%u%%) in %.2f s, %.2f GiB/s",
                     kvd_size_format(off, a, sizeof(a)),
                     kvd_size_format(p->size_bytes, b, sizeof(b)),
                     (unsigned)(off * 100 / p->size_bytes), secs,
                     secs > 0 ? (double)off / (double)KVD_GiB / secs : 0.0);
            next_decile = decile + 1;
        }
        if (rate > 0) {
            /* sleep until the average rate since the start is back at the bound */
            uint64_t due_ns = start_ns + (uint64_t)((double)off / (double)rate * 1e9);
            uint64_t now = kvd_now_ns();
            while (now < due_ns && !atomic_load(&p->stop)) {
                kvd_sleep_ns(KVD_MIN(due_ns - now, 50000000ull));
                now = kvd_now_ns();
            }
        }
    }
    if (atomic_load(&p->stop))
        return NULL;
    if (p->opts.mlock) {
        if (mlock(p->base, p->size_bytes) != 0) {
            int err = errno;
            pool_fail(p, kvd_status_from_errno(err),
                      "mlock of %s failed: %s (raise RLIMIT_MEMLOCK, e.g. "
                      "ulimit -l unlimited, or drop --mlock)",
                      kvd_size_format(p->size_bytes, a, sizeof(a)), strerror(err));
            return NULL;
        }
        atomic_store(&p->mlocked, true);
    }
    atomic_store(&p->ready, true);
    return NULL;
}

int kvd_pool_populate_start(kvd_pool_t *p)
{
    if (p->thread_started)
        return KVD_ERR_STATE;
    int rc = pthread_create(&p->thread, NULL, populate_main, p);
    if (rc != 0) {
        KVD_ERROR("pool", "cannot start the population thread: %s", strerror(rc));
        return kvd_status_from_errno(rc);
    }
    p->thread_started = true;
    return KVD_OK;
}

void kvd_pool_destroy(kvd_pool_t *p)
{
    if (p == NULL)
        return;
    atomic_store(&p->stop, true);
    if (p->thread_started)
        pthread_join(p->thread, NULL);
    if (atomic_load(&p->mlocked))
        munlock(p->base, p->size_bytes);
    munmap(p->base, p->size_bytes);
    close(p->fd);
    close(p->ro_fd);
    free(p);
}

bool kvd_pool_ready(const kvd_pool_t *p)
{
    return atomic_load(&((kvd_pool_t *)p)->ready);
}

int kvd_pool_error(const kvd_pool_t *p)
{
    return atomic_load(&((kvd_pool_t *)p)->error);
}

const char *kvd_pool_error_text(const kvd_pool_t *p)
{
    /* the text is final before the status is stored */
    return atomic_load(&((kvd_pool_t *)p)->error) != KVD_OK ? p->error_text : "";
}

uint64_t kvd_pool_populated_bytes(const kvd_pool_t *p)
{
    return atomic_load(&((kvd_pool_t *)p)->populated_bytes);
}

uint64_t kvd_pool_size(const kvd_pool_t *p)
{
    return p->size_bytes;
}

bool kvd_pool_hugepages(const kvd_pool_t *p)
{
    return p->opts.hugepages;
}

bool kvd_pool_mlocked(const kvd_pool_t *p)
{
    return atomic_load(&((kvd_pool_t *)p)->mlocked);
}

int kvd_pool_fd_ro(const kvd_pool_t *p)
{
    return p->ro_fd;
}

int kvd_pool_fd(const kvd_pool_t *p)
{
    return p->fd;
}

void *kvd_pool_base(const kvd_pool_t *p)
{
    return p->base;
}
