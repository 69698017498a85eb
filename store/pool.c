/*
 * pool.c - the daemon's memory pool: one shared-memory file mapped
 * MAP_SHARED, so that same-host workers can map the same pages from the
 * descriptor the daemon hands them. The file is either
 *   - a named file, dir/kvdock-<instance>.pool (/dev/shm, or a hugetlbfs
 *     mount with hugepages), that outlives the process: a daemon started
 *     again attaches to it with its bytes (the store's journal says what
 *     they are). It is created 0600 and refused when it is not a regular
 *     file of this user private to it. One process of an instance has it
 *     at a time: an exclusive flock on lock_dir/kvdock-<instance>.lock,
 *     taken before the pool file is looked at. The lock is on a file of
 *     its own, never handed on, because the pool's descriptor is: a flock
 *     on it would be held by every client that still has it after the
 *     daemon died. A tmpfs file cannot be sealed (only memfds can), see
 *     doc/TRUST.md.
 *   - or an anonymous memfd named after the instance, sealed against
 *     resizing, gone with the process.
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
#include <sys/file.h>
#include <sys/inotify.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
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
    char path[4096]; /* the named file; "" for a memfd */
    int lock_fd;     /* the instance's lock; -1 for a memfd */
    int own_fd;      /* the pool file once more, never handed out: its OFD lock */
    bool created;    /* made here (or a memfd): nothing to keep in it */
    bool attached;   /* a named file that was there, all of it allocated */
    uint64_t dev, ino;
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
    int watch_fd;         /* inotify on the file; -1 none */
};

/* Opens the anonymous memfd: sealable, so that once sized nobody holding
 * the descriptor (every same-host client does) can shrink or grow the file
 * under everyone's mappings. */
static int memfd_open(kvd_pool_t *p)
{
    unsigned flags =
        MFD_CLOEXEC | MFD_ALLOW_SEALING | (p->opts.hugepages ? MFD_HUGETLB : 0);
    p->fd = memfd_create(p->name, flags);
    if (p->fd < 0) {
        int err = errno;
        KVD_ERROR("pool", "memfd_create(%s%s): %s", p->name,
                  p->opts.hugepages ? ", hugetlb" : "", strerror(err));
        return p->opts.hugepages ? KVD_ERR_UNSUPPORTED : kvd_status_from_errno(err);
    }
    p->created = true;
    if (ftruncate(p->fd, (off_t)p->size_bytes) != 0) {
        int err = errno;
        KVD_ERROR("pool", "ftruncate(%s, %llu): %s", p->name,
                  (unsigned long long)p->size_bytes, strerror(err));
        return kvd_status_from_errno(err);
    }
    if (fcntl(p->fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
        int err = errno;
        KVD_ERROR("pool", "sealing %s: %s", p->name, strerror(err));
        return kvd_status_from_errno(err);
    }
    return KVD_OK;
}

/* Takes the instance's lock: lock_dir/kvdock-<instance>.lock, flocked and
 * holding our pid. KVD_ERR_BUSY (logged, naming the holder) when another
 * process has it. */
static int lock_take(kvd_pool_t *p)
{
    char path[4096];
    const char *dir = p->opts.lock_dir ? p->opts.lock_dir : p->opts.dir;
    snprintf(path, sizeof(path), "%s/kvdock-%s.lock", dir, p->opts.instance);
    char holder[32];
    int rc = kvd_lock_file("pool", path, &p->lock_fd, holder, sizeof(holder));
    if (rc == KVD_ERR_BUSY)
        KVD_ERROR("pool",
                  "instance '%s' is in use: kvdockd pid %s holds %s; stop it first, "
                  "or start this one with another --instance",
                  p->opts.instance, holder, path);
    return rc;
}

#ifndef HUGETLBFS_MAGIC
#define HUGETLBFS_MAGIC 0x958458f6
#endif
#ifndef TMPFS_MAGIC
#define TMPFS_MAGIC 0x01021994
#endif

/* Whether the pool fits the file system of dir: a tmpfs mount's size (a
 * container's /dev/shm is often 64 MiB) would otherwise show as SIGBUS or
 * ENOSPC in the middle of population. `have` bytes of it are allocated. */
static int space_check(kvd_pool_t *p, uint64_t have)
{
    struct statfs fs;
    if (statfs(p->opts.dir, &fs) != 0 || fs.f_type == HUGETLBFS_MAGIC)
        return KVD_OK; /* hugetlbfs: vm.nr_hugepages decides, checked by population */
    uint64_t avail = (uint64_t)fs.f_bavail * (uint64_t)fs.f_bsize;
    uint64_t need =
        (p->size_bytes > have ? p->size_bytes - have : 0) + p->opts.beside_bytes;
    if (avail >= need)
        return KVD_OK;
    char a[32], b[32], c[32];
    KVD_ERROR("pool",
              "the pool of %s and its journal (up to %s) do not fit in %s, which has %s "
              "free: free space there (a tmpfs mount's size=, or a container's "
              "--shm-size), choose a smaller pool, or put it elsewhere (--shm-dir)",
              kvd_size_format(p->size_bytes, a, sizeof(a)),
              kvd_size_format(p->opts.beside_bytes, c, sizeof(c)), p->opts.dir,
              kvd_size_format(avail, b, sizeof(b)));
    return KVD_ERR_NO_SPACE;
}

/* A regular file of this user that nobody else may open, seen without
 * following a symlink; false when absent or anything else. */
static bool own_private_file(const char *path)
{
    struct stat st;
    return lstat(path, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid() &&
           (st.st_mode & 077) == 0;
}

/* Moves an older daemon's files of this instance from the shared
 * directory it used into the private ones (kvd_pool_opts_t.legacy_dir),
 * under the instance's lock. An older daemon that still runs holds an OFD
 * lock on its pool file (file_open's own_fd): then nothing moves and the
 * start is refused, since both would serve one pool. Anything not ours
 * stays where it is, unread. */
static int legacy_adopt(kvd_pool_t *p)
{
    const char *odir = p->opts.legacy_dir;
    if (odir == NULL || p->opts.fresh)
        return KVD_OK;
    const char *oldj_dir = p->opts.legacy_lock_dir ? p->opts.legacy_lock_dir : odir;
    const char *newj_dir = p->opts.lock_dir ? p->opts.lock_dir : p->opts.dir;
    char from[4096], to[4096], jfrom[4096], jto[4096];
    snprintf(from, sizeof(from), "%s/%s.pool", odir, p->name);
    snprintf(to, sizeof(to), "%s/%s.pool", p->opts.dir, p->name);
    snprintf(jfrom, sizeof(jfrom), "%s/%s.journal", oldj_dir, p->name);
    snprintf(jto, sizeof(jto), "%s/%s.journal", newj_dir, p->name);
    struct stat st;
    bool move_pool = strcmp(from, to) != 0 && lstat(to, &st) != 0 && errno == ENOENT &&
                     own_private_file(from);
    bool move_journal = strcmp(jfrom, jto) != 0 && lstat(jto, &st) != 0 &&
                        errno == ENOENT && own_private_file(jfrom);
    if (!move_pool && !move_journal)
        return KVD_OK;
    /* the pool file the journal describes, wherever it is now: an older
     * daemon that still runs holds its OFD lock */
    const char *pool = move_pool ? from : to;
    int fd = open(pool, O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return KVD_OK; /* no pool file: a journal alone describes nothing */
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
    if (fcntl(fd, F_OFD_SETLK, &fl) != 0) {
        int err = errno;
        close(fd);
        if (err == EAGAIN || err == EACCES) {
            KVD_ERROR("pool",
                      "%s is in use by a kvdockd of the instance '%s' started from an "
                      "older version: stop it first",
                      pool, p->opts.instance);
            return KVD_ERR_BUSY;
        }
        KVD_ERROR("pool", "locking %s: %s", pool, strerror(err));
        return kvd_status_from_errno(err);
    }
    int rc = KVD_OK;
    if (move_pool && rename(from, to) != 0) {
        int err = errno;
        KVD_ERROR("pool", "moving the older pool file %s to %s: %s", from, to,
                  strerror(err));
        rc = kvd_status_from_errno(err);
    } else {
        /* the journal names the pool file by device and inode, which a
         * rename keeps; one left behind makes the restart start empty, as
         * a missing one does */
        move_journal = move_journal && rename(jfrom, jto) == 0;
        snprintf(jfrom, sizeof(jfrom), "%s/%s.lock", oldj_dir, p->name);
        if (strcmp(oldj_dir, newj_dir) != 0 && own_private_file(jfrom))
            unlink(jfrom);
        KVD_INFO("pool", "moved the %s of an older kvdockd of the instance '%s' into %s",
                 move_pool && move_journal ? "pool file and journal"
                 : move_pool               ? "pool file"
                                           : "journal",
                 p->opts.instance, move_pool ? p->opts.dir : newj_dir);
    }
    close(fd);
    return rc;
}

int kvd_private_dir(const char *dir, char *out, size_t out_len)
{
    struct stat st;
    if (stat(dir, &st) != 0) {
        int err = errno;
        KVD_ERROR("pool", "%s: %s", dir, strerror(err));
        return kvd_status_from_errno(err);
    }
    if (!S_ISDIR(st.st_mode)) {
        KVD_ERROR("pool", "%s is not a directory", dir);
        return KVD_ERR_STATE;
    }
    uid_t me = geteuid();
    bool trusted_owner = st.st_uid == me || st.st_uid == 0;
    bool shared = (st.st_mode & 022) != 0;
    if (trusted_owner && !shared) {
        if (strlen(dir) >= out_len)
            return KVD_ERR_INVALID;
        kvd_strlcpy(out, dir, out_len);
        return KVD_OK;
    }
    if (!trusted_owner || !(st.st_mode & S_ISVTX)) {
        KVD_ERROR("pool",
                  "%s (owner uid %u, mode %04o) can be written by other users%s: they "
                  "could replace what kvdockd keeps there; choose a directory of your "
                  "own, or a shared one with the sticky bit such as /dev/shm",
                  dir, (unsigned)st.st_uid, (unsigned)(st.st_mode & 07777),
                  trusted_owner ? " and has no sticky bit" : " and its owner is not you");
        return KVD_ERR_STATE;
    }
    int n = snprintf(out, out_len, "%s%skvdock-%u", dir,
                     dir[strlen(dir) - 1] == '/' ? "" : "/", (unsigned)me);
    if (n < 0 || (size_t)n >= out_len)
        return KVD_ERR_INVALID;
    if (mkdir(out, 0700) != 0 && errno != EEXIST) {
        int err = errno;
        KVD_ERROR("pool", "cannot make the private directory %s: %s", out, strerror(err));
        return kvd_status_from_errno(err);
    }
    int fd = open(out, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0 || fstat(fd, &st) != 0 || st.st_uid != me || (st.st_mode & 077) != 0) {
        int err = fd < 0 ? errno : 0;
        if (fd >= 0)
            KVD_ERROR(
                "pool",
                "%s is not a directory private to uid %u (owner uid %u, mode %04o): "
                "someone else made it; remove it (its owner or root can), or "
                "choose another --shm-dir",
                out, (unsigned)me, (unsigned)st.st_uid, (unsigned)(st.st_mode & 07777));
        else
            KVD_ERROR("pool",
                      "%s is not a directory of uid %u (%s): someone else put it there; "
                      "remove it (its owner or root can), or choose another --shm-dir",
                      out, (unsigned)me, strerror(err));
        if (fd >= 0)
            close(fd);
        return KVD_ERR_STATE;
    }
    close(fd);
    return KVD_OK;
}

/* Opens (or creates) the named pool file, after taking the lock. */
static int file_open(kvd_pool_t *p)
{
    int rc = lock_take(p);
    if (rc != KVD_OK || (rc = legacy_adopt(p)) != KVD_OK)
        return rc;
    if (p->opts.hugepages) {
        struct statfs fs;
        if (statfs(p->opts.dir, &fs) != 0 || fs.f_type != HUGETLBFS_MAGIC ||
            (uint64_t)fs.f_bsize != HUGE_PAGE_BYTES) {
            KVD_ERROR("pool",
                      "hugepages: the pool file needs a hugetlbfs mount of 2 MiB pages, "
                      "and %s is none (mount one: mount -t hugetlbfs -o pagesize=2M none "
                      "/dev/hugepages, and name it with --hugepages-dir; or drop "
                      "--hugepages)",
                      p->opts.dir);
            return KVD_ERR_UNSUPPORTED;
        }
    } else {
        /* the journal is written without fsync: it is true to the pool's
         * bytes across a process's death only where both are memory that
         * dies with the host (tmpfs). On a disk, a reboot could keep a
         * journal newer than the pool's pages: wrong bytes served */
        struct statfs fs;
        if (statfs(p->opts.dir, &fs) != 0 || fs.f_type != TMPFS_MAGIC) {
            KVD_ERROR(
                "pool",
                "the pool file and its journal need a tmpfs directory (such as "
                "/dev/shm), and %s is none: the journal is not synced to a disk, "
                "so a reboot could leave it ahead of the pool's bytes (choose a tmpfs "
                "--shm-dir, or --no-persist)",
                p->opts.dir);
            return KVD_ERR_UNSUPPORTED;
        }
    }
    if (snprintf(p->path, sizeof(p->path), "%s/%s.pool", p->opts.dir, p->name) >=
        (int)sizeof(p->path))
        return KVD_ERR_INVALID;
    if (p->opts.fresh && unlink(p->path) != 0 && errno != ENOENT) {
        int err = errno;
        KVD_ERROR("pool", "--fresh: cannot remove %s: %s", p->path, strerror(err));
        return kvd_status_from_errno(err);
    }
    p->fd = open(p->path, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
    if (p->fd < 0 && errno == ENOENT) {
        p->fd = open(p->path, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
        p->created = p->fd >= 0;
    }
    if (p->fd < 0) {
        int err = errno;
        KVD_ERROR("pool", "cannot open the pool file %s: %s", p->path, strerror(err));
        return kvd_status_from_errno(err);
    }
    struct stat st;
    if (fstat(p->fd, &st) != 0) {
        int err = errno;
        KVD_ERROR("pool", "fstat %s: %s", p->path, strerror(err));
        return kvd_status_from_errno(err);
    }
    p->dev = (uint64_t)st.st_dev;
    p->ino = (uint64_t)st.st_ino;
    /* the lock file names the holder, but can be removed (an operator, a
     * cleaner of /dev/shm) while its daemon runs: the pool file itself is
     * locked too, by an open file description of its own that no client
     * ever gets (they get p->fd's over SCM_RIGHTS), so it goes with this
     * process and with nothing else */
    p->own_fd = open(p->path, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
    if (p->own_fd < 0 || fcntl(p->own_fd, F_OFD_SETLK, &fl) != 0) {
        int err = errno;
        if (err == EAGAIN || err == EACCES) {
            KVD_ERROR("pool",
                      "the pool file %s is in use by another kvdockd (its lock file was "
                      "removed?): stop that one first",
                      p->path);
            return KVD_ERR_BUSY;
        }
        KVD_ERROR("pool", "locking %s: %s", p->path, strerror(err));
        return kvd_status_from_errno(err);
    }
    if (!S_ISREG(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 077) != 0) {
        KVD_ERROR("pool",
                  "the pool file %s is not a regular file private to uid %u (owner %u, "
                  "mode %04o): remove it, or start with --fresh",
                  p->path, (unsigned)geteuid(), (unsigned)st.st_uid,
                  (unsigned)(st.st_mode & 07777));
        return KVD_ERR_STATE;
    }
    if (!p->created && (uint64_t)st.st_size != p->size_bytes) {
        char a[32], b[32];
        KVD_ERROR("pool",
                  "the pool file %s holds a pool of %s (%llu bytes); this start asks for "
                  "%s (%llu bytes): start with --pool-size %llu to keep what it holds, "
                  "or with --fresh to discard it",
                  p->path, kvd_size_format((uint64_t)st.st_size, a, sizeof(a)),
                  (unsigned long long)st.st_size,
                  kvd_size_format(p->size_bytes, b, sizeof(b)),
                  (unsigned long long)p->size_bytes, (unsigned long long)st.st_size);
        return KVD_ERR_STATE;
    }
    uint64_t have = (uint64_t)st.st_blocks * 512;
    if ((rc = space_check(p, p->created ? 0 : have)) != KVD_OK)
        return rc;
    if (p->created && ftruncate(p->fd, (off_t)p->size_bytes) != 0) {
        int err = errno;
        KVD_ERROR("pool", "ftruncate(%s, %llu): %s", p->path,
                  (unsigned long long)p->size_bytes, strerror(err));
        return kvd_status_from_errno(err);
    }
    /* an attached pool whose pages are all there: population only maps
     * them, and needs no rate bound */
    p->attached = !p->created && have >= p->size_bytes;
    return KVD_OK;
}

/* Undoes what kvd_pool_create did before it failed. */
static void pool_abandon(kvd_pool_t *p)
{
    if (p->fd >= 0) {
        close(p->fd);
        if (p->created && p->path[0] != '\0')
            unlink(p->path); /* ours, and of no use */
    }
    if (p->lock_fd >= 0)
        close(p->lock_fd);
    if (p->own_fd >= 0)
        close(p->own_fd);
    free(p);
}

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
    p->fd = p->ro_fd = p->lock_fd = p->own_fd = p->watch_fd = -1;
    snprintf(p->name, sizeof(p->name), "kvdock-%s", opts->instance);

    int rc = opts->dir != NULL ? file_open(p) : memfd_open(p);
    if (rc != KVD_OK) {
        pool_abandon(p);
        return rc;
    }
    const char *what = p->path[0] ? p->path : p->name;
    p->base = mmap(NULL, p->size_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, p->fd, 0);
    if (p->base == MAP_FAILED) {
        int err = errno;
        KVD_ERROR("pool", "mmap(%s, %llu): %s%s", what, (unsigned long long)p->size_bytes,
                  strerror(err),
                  opts->hugepages && err == ENOMEM
                      ? " (not enough free hugepages: raise vm.nr_hugepages)"
                      : "");
        pool_abandon(p);
        return kvd_status_from_errno(err);
    }
    char path[64];
    snprintf(path, sizeof(path), "/proc/self/fd/%d", p->fd);
    p->ro_fd = open(path, O_RDONLY | O_CLOEXEC);
    if (p->ro_fd < 0) {
        int err = errno;
        KVD_ERROR("pool", "reopening %s read-only (%s): %s", what, path, strerror(err));
        munmap(p->base, p->size_bytes);
        pool_abandon(p);
        return kvd_status_from_errno(err);
    }
    /* a writer may cut the named file short under this mapping: the spill's
     * checksum, the cluster's reads and population read through it */
    int grc = kvd_pool_guard_add(p->base, p->size_bytes, p->fd, true);
    if (grc != KVD_OK)
        KVD_WARN("pool",
                 "cannot guard the mapping of %s (%s): a writer that cuts the file "
                 "short can kill this process",
                 what, kvd_status_str(grc));
    /* a memfd is made 0777: 0400 keeps clients of other uids from reopening

     * the read-only descriptor read-write through /proc. A named file is
     * 0600 (the daemon opens it read-write again when it restarts), which
     * does the same for other uids. */
    if (p->path[0] == '\0' && fchmod(p->fd, 0400) != 0)
        KVD_WARN("pool",
                 "chmod 0400 of %s: %s; read-only clients of other uids may "
                 "reopen it read-write",
                 p->name, strerror(errno));
    if (p->path[0] == '\0') {
        struct stat st;
        if (fstat(p->fd, &st) == 0) {
            p->dev = (uint64_t)st.st_dev;
            p->ino = (uint64_t)st.st_ino;
        }
    }
    *out = p;
    return KVD_OK;
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

/* Allocates the file's pages of [off, off+len) and maps them into this
 * process (so the OS reports them as RssShmem): 0, or the errno of the
 * allocation that failed. *mapped says whether the mapping was done (not
 * on kernels without MADV_POPULATE_WRITE). */
static int alloc_pages(kvd_pool_t *p, uint64_t off, uint64_t len, bool *mapped)
{
    if (fallocate(p->fd, 0, (off_t)off, (off_t)len) != 0)
        return errno;
    *mapped = madvise(p->base + off, len, MADV_POPULATE_WRITE) == 0;
    return 0;
}

/* Allocates and maps [off, off+len); returns a status (pool_fail said why). */
static int populate_chunk(kvd_pool_t *p, uint64_t off, uint64_t len)
{
    bool mapped = false;
    int err = alloc_pages(p, off, len, &mapped);
    if (err != 0) {
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
    if (!mapped) {
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
    /* the pages of an attached pool exist: mapping them allocates nothing */
    uint64_t rate = p->attached ? 0 : p->opts.populate_rate_bps;
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
    /* an attached pool whose pages all exist is ready now: nothing is left
     * to allocate, and the thread only maps them (for the RSS figures) */
    if (p->attached && !p->opts.mlock)
        atomic_store(&p->ready, true);
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
    kvd_pool_guard_remove(p->base);
    munmap(p->base, p->size_bytes);
    if (p->watch_fd >= 0)
        close(p->watch_fd);
    close(p->fd);
    close(p->ro_fd);
    if (p->lock_fd >= 0)
        close(p->lock_fd); /* the lock goes with it; the files stay */
    if (p->own_fd >= 0)
        close(p->own_fd);
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

bool kvd_pool_persistent(const kvd_pool_t *p)
{
    return p->path[0] != '\0';
}

void kvd_pool_zero(const kvd_pool_t *p, uint64_t offset, uint64_t bytes)
{
    static const uint8_t zeros[64 * 1024];
    if (p->path[0] == '\0' || p->opts.hugepages) {
        /* a sealed memfd cannot shrink; hugetlbfs has no write() */
        memset(p->base + offset, 0, bytes);
        return;
    }
    while (bytes > 0) {
        size_t n = bytes < sizeof(zeros) ? (size_t)bytes : sizeof(zeros);
        ssize_t w = pwrite(p->fd, zeros, n, (off_t)offset);
        if (w <= 0) {
            if (w < 0 && errno == EINTR)
                continue;
            /* ENOSPC on a tmpfs shrunk under us: the bytes there are
             * gone (holes read as zeros) or still ours; never a SIGBUS */
            KVD_WARN("pool", "zeroing %llu bytes at %llu of %s: %s",
                     (unsigned long long)bytes, (unsigned long long)offset, p->path,
                     w < 0 ? strerror(errno) : "nothing written");
            return;
        }
        offset += (uint64_t)w;
        bytes -= (uint64_t)w;
    }
}

bool kvd_pool_created(const kvd_pool_t *p)
{
    return p->created;
}

bool kvd_pool_attached(const kvd_pool_t *p)
{
    return p->attached;
}

const char *kvd_pool_path(const kvd_pool_t *p)
{
    return p->path;
}

void kvd_pool_identity(const kvd_pool_t *p, uint64_t *dev, uint64_t *ino)
{
    *dev = p->dev;
    *ino = p->ino;
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

/* Gives [off, end) its pages again, in this process's mapping too (the
 * population's work for that range). */
static void repopulate(kvd_pool_t *p, uint64_t off, uint64_t end)
{
    /* not mapped here on an older kernel: only the RSS figures miss it
     * (population's fallback, a store per page, could overwrite what a
     * writer put there since) */
    bool mapped = false;
    int err = alloc_pages(p, off, end - off, &mapped);
    if (err != 0)
        KVD_WARN("pool", "re-allocating %llu bytes at %llu of %s: %s",
                 (unsigned long long)(end - off), (unsigned long long)off, p->path,
                 strerror(err));
}

/* The ranges a damage check found and has not handed on yet. */
typedef struct lost_batch {
    kvd_pool_t *p;
    kvd_pool_lost_fn fn;
    void *arg;
    kvd_pool_range_t r[KVD_POOL_LOST_BATCH];
    size_t n;
    size_t holes; /* every hole of this check, for its log lines */
    uint64_t hole_bytes;
} lost_batch_t;

/* Hands the ranges on (the objects there dropped first), then gives them
 * their pages back: in that order, so that nothing reads the new zeros as
 * an object's bytes. */
static void lost_flush(lost_batch_t *b)
{
    if (b->n == 0)
        return;
    b->fn(b->arg, b->r, b->n);
    for (size_t i = 0; i < b->n; i++)
        repopulate(b->p, b->r[i].offset, b->r[i].offset + b->r[i].bytes);
    b->n = 0;
}

static void lost_add(lost_batch_t *b, uint64_t off, uint64_t end)
{
    if (b->n == KVD_POOL_LOST_BATCH)
        lost_flush(b);
    b->r[b->n++] = (kvd_pool_range_t){off, end - off};
}

/* How many holes a check names one by one before it only counts them. */
#define HOLES_LOGGED 8

size_t kvd_pool_damage_check(kvd_pool_t *p, kvd_pool_lost_fn fn, void *arg)
{
    /* read before the fstat: what population allocated is in st_blocks */
    uint64_t populated = atomic_load(&p->populated_bytes);
    if (atomic_load(&p->ready))
        populated = p->size_bytes;
    const char *what = p->path[0] ? p->path : p->name;
    struct stat st;
    if (fstat(p->fd, &st) != 0)
        return 0;
    size_t ranges = 0;
    /* holes are looked for below the cut only: past it, all is lost */
    uint64_t scan_end = populated;
    uint64_t cut = p->size_bytes;
    /* a cut this process's own guard grew back first (a spill's checksum,
     * the cluster's reads) is a cut all the same */
    uint64_t seen = KVD_MIN((uint64_t)st.st_size, kvd_pool_guard_take_cut(p->base));
    if (seen < p->size_bytes) {
        cut = seen / p->page_bytes * p->page_bytes;
        char a[32], b[32], c[32];
        KVD_WARN("pool",
                 "%s was cut to %s of %s by a process holding it read-write (a "
                 "same-host writer): growing it back; the objects in the %s lost are "
                 "dropped",
                 what, kvd_size_format(seen, a, sizeof(a)),
                 kvd_size_format(p->size_bytes, b, sizeof(b)),
                 kvd_size_format(p->size_bytes - cut, c, sizeof(c)));
        if ((uint64_t)st.st_size < p->size_bytes &&
            ftruncate(p->fd, (off_t)p->size_bytes) != 0)
            KVD_WARN("pool", "growing %s back: %s", what, strerror(errno));
        scan_end = KVD_MIN(scan_end, cut);
    }
    /* holes within what is populated: st_blocks falls short of it (a
     * hugetlbfs file shows no holes to SEEK_HOLE); a cut grown back is one
     * big hole past scan_end, handed on whole below */
    bool holes = !p->opts.hugepages && (uint64_t)st.st_blocks * 512 < populated;
    if (!holes && cut == p->size_bytes)
        return 0;
    lost_batch_t batch = {.p = p, .fn = fn, .arg = arg}, *b = &batch;
    for (off_t pos = 0; holes && (uint64_t)pos < scan_end;) {
        off_t hole = lseek(p->fd, pos, SEEK_HOLE);
        if (hole < 0 || (uint64_t)hole >= scan_end)
            break;
        off_t data = lseek(p->fd, hole, SEEK_DATA);
        uint64_t end = data < 0 ? scan_end : KVD_MIN((uint64_t)data, scan_end);
        if (end <= (uint64_t)hole)
            break;
        if (b->holes < HOLES_LOGGED) {
            char a[32];
            KVD_WARN("pool",
                     "%s has a hole of %s at %llu, punched by a process holding it "
                     "read-write (a same-host writer): the objects there are dropped",
                     what, kvd_size_format(end - (uint64_t)hole, a, sizeof(a)),
                     (unsigned long long)hole);
        }
        b->holes++;
        b->hole_bytes += end - (uint64_t)hole;
        lost_add(b, (uint64_t)hole, end);
        ranges++;
        pos = (off_t)end;
    }
    if (b->holes > HOLES_LOGGED) {
        char a[32];
        KVD_WARN("pool", "%s: %zu holes in all, %s (the first %d named above)", what,
                 b->holes, kvd_size_format(b->hole_bytes, a, sizeof(a)), HOLES_LOGGED);
    }
    if (cut < p->size_bytes) {
        /* its pages come back only as far as population had gone */
        lost_add(b, cut, p->size_bytes);
        ranges++;
        size_t last = b->n - 1;
        b->fn(b->arg, b->r, b->n);
        for (size_t i = 0; i < last; i++)
            repopulate(p, b->r[i].offset, b->r[i].offset + b->r[i].bytes);
        if (cut < populated)
            repopulate(p, cut, populated);
        b->n = 0;
    }
    lost_flush(b);
    return ranges;
}

int kvd_pool_watch_fd(kvd_pool_t *p)
{
    if (p->watch_fd >= 0)
        return p->watch_fd;
    int fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    if (fd < 0)
        return -1;
    char path[64];
    snprintf(path, sizeof(path), "/proc/self/fd/%d", p->fd);
    if (inotify_add_watch(fd, path, IN_MODIFY) < 0) {
        close(fd);
        return -1;
    }
    p->watch_fd = fd;
    return fd;
}

void kvd_pool_watch_drain(kvd_pool_t *p)
{
    char buf[4096] __attribute__((aligned(__alignof__(struct inotify_event))));
    if (p->watch_fd < 0)
        return;
    while (read(p->watch_fd, buf, sizeof(buf)) > 0) {
    }
}
