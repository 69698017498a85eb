/*
 * kvd_common.h - the one public header of common/: status codes (the enum
 * itself in kvd_status.h), logging, clocks, child processes, size parsing
 * and formatting, memory accounting, and the SGLang compatible page-key
 * chain.
 *
 * Everything here is thread-safe: the logger serialises whole lines, the
 * memory counters are atomics, the rest keeps no state of its own.
 */
#ifndef KVD_COMMON_H
#define KVD_COMMON_H

#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "kvd_status.h"

/* ---------------------------------------------------------------- status */

/* kvd_status_t, the one status type (0 success, 1 in progress, negative
 * errors), lives in kvd_status.h, so that libkvdock's public header shares
 * it without the rest of this header. */

/* A short, static description of a status ("no space", ...). */
const char *kvd_status_str(int status);
/* Whether status is one of kvd_status_t's values (a peer's error code may
 * be anything). */
bool kvd_status_known(int status);

/* Converts a positive errno value into a kvd_status_t. The caller logs
 * strerror(err) first: the status alone loses the system's reason. EAGAIN
 * is an error here (KVD_ERR_IO, e.g. mlock or fork out of a resource);
 * a non-blocking call's "would block" is the caller's to handle before it
 * gets here. */
kvd_status_t kvd_status_from_errno(int err);

/* --------------------------------------------------------------- logging */

/* Every line is one event: a string a client chose (its name, a namespace
 * name, ...) goes into a log line through kvd_escape (below), and the
 * logger itself writes any control byte left in a message as \xNN. */

typedef enum kvd_log_level {
    KVD_LOG_ERROR = 0,
    KVD_LOG_WARN = 1,
    KVD_LOG_INFO = 2,
    KVD_LOG_DEBUG = 3,
} kvd_log_level_t;

/* Lines below `level` are dropped. Default: KVD_LOG_INFO. */
void kvd_log_set_level(kvd_log_level_t level);
kvd_log_level_t kvd_log_get_level(void);

/* Parses "error", "warn", "info", "debug". Returns KVD_ERR_INVALID otherwise. */
int kvd_log_level_parse(const char *name, kvd_log_level_t *out);

/* Writes one timestamped line "<time> <level> <component>: <message>" to
 * stderr, in one write so that lines of several threads do not interleave. */
void kvd_log(kvd_log_level_t level, const char *component, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define KVD_ERROR(comp, ...) kvd_log(KVD_LOG_ERROR, comp, __VA_ARGS__)
#define KVD_WARN(comp, ...)  kvd_log(KVD_LOG_WARN, comp, __VA_ARGS__)
#define KVD_INFO(comp, ...)  kvd_log(KVD_LOG_INFO, comp, __VA_ARGS__)
#define KVD_DEBUG(comp, ...)                           \
    do {                                               \
        if (kvd_log_get_level() >= KVD_LOG_DEBUG)      \
            kvd_log(KVD_LOG_DEBUG, comp, __VA_ARGS__); \
    } while (0)

/* ---------------------------------------------------------------- clocks */

/* CLOCK_MONOTONIC in nanoseconds: for intervals and deadlines. */
uint64_t kvd_now_ns(void);

/* CLOCK_REALTIME in milliseconds since the epoch: for "last access". */
uint64_t kvd_wall_ms(void);

/* Sleeps for `ns` nanoseconds, resuming after signals. */
void kvd_sleep_ns(uint64_t ns);

/*
 * Locks m, waiting until the kvd_now_ns() deadline at most: true when it
 * was taken. pthread_mutex_clocklock on CLOCK_MONOTONIC, except under
 * ThreadSanitizer, whose runtime (gcc 12's) does not intercept clocklock
 * and so reports every unlock of a mutex taken that way: there,
 * pthread_mutex_timedlock with the deadline moved to CLOCK_REALTIME.
 */
bool kvd_mutex_lock_until(pthread_mutex_t *m, uint64_t deadline_ns);

/* ------------------------------------------------------------- processes */

/*
 * Takes the lock file at path: opened (created 0600, never through a
 * symlink), a regular file of this uid, flocked and holding our pid, so
 * that one process of an instance or a tier has it at a time. *fd keeps
 * the lock until closed. KVD_ERR_BUSY when another process holds it (its
 * pid, as the file says, in holder); KVD_ERR_STATE for a file that is not
 * a regular file of this uid; the system's error otherwise; each but BUSY
 * logged under `comp`, whose caller logs the refusal in its own words.
 */
int kvd_lock_file(const char *comp, const char *path, int *fd, char *holder,
                  size_t holder_len);

/* Reaps child `pid`, polling up to timeout_ms: KVD_OK (its wait status in
 * *wstatus, may be NULL), KVD_ERR_NOT_FOUND (not our child, or already
 * reaped), KVD_ERR_TIMEOUT, or KVD_ERR_IO. For tools and tests. */
int kvd_wait_pid(pid_t pid, int timeout_ms, int *wstatus);

/*
 * The start time of live process pid (/proc/PID/stat field 22, clock ticks
 * since boot): with the pid it names one process for its whole life, which
 * a pid alone does not (pids are reused). KVD_OK with *ticks;
 * KVD_ERR_NOT_FOUND when no such process runs: none with that pid, or a
 * zombie whose every thread has exited (it writes nothing any more); the
 * system's error when /proc cannot say (then the caller must assume it is
 * alive).
 */
int kvd_proc_start_ticks(int pid, uint64_t *ticks);

/* Copies a file to stderr between markers (a failed daemon's log). */
void kvd_dump_file(const char *path);

/* True when the kernel lists an RDMA device (/sys/class/infiniband). */
bool kvd_rdma_device_present(void);

/* ----------------------------------------------------------------- sizes */

#define KVD_KiB ((uint64_t)1 << 10)
#define KVD_MiB ((uint64_t)1 << 20)
#define KVD_GiB ((uint64_t)1 << 30)
#define KVD_TiB ((uint64_t)1 << 40)

/*
 * Parses a byte size: a decimal number (fractions allowed) with an optional
 * binary suffix K, M, G, T (also KiB, MiB, GiB, TiB, KB, MB, GB, TB, all
 * powers of 1024, any case) or B. "1.5G" = 1610612736. Rejects negative
 * numbers, garbage, and values that overflow 64 bits (KVD_ERR_INVALID).
 */
int kvd_size_parse(const char *text, uint64_t *out_bytes);

/* Formats bytes as "1.50 GiB" into buf; returns buf. */
const char *kvd_size_format(uint64_t bytes, char *buf, size_t buf_len);

/* Parses an unsigned decimal integer in [min, max]. */
int kvd_u64_parse(const char *text, uint64_t min, uint64_t max, uint64_t *out);

/* Parses a floating point number in [min, max]. */
int kvd_double_parse(const char *text, double min, double max, double *out);

/* Rounds down / up to a power-of-two alignment. */
static inline uint64_t kvd_align_down(uint64_t v, uint64_t align)
{
    return v & ~(align - 1);
}
static inline uint64_t kvd_align_up(uint64_t v, uint64_t align)
{
    return (v + align - 1) & ~(align - 1);
}

/* ---------------------------------------------------- memory accounting */

/*
 * Every heap allocation the daemon makes on purpose is charged to one of
 * these categories, so that the parts add up to what the OS reports
 * (DESIGN.md section 9). The pool itself is accounted by store/.
 */
typedef enum kvd_mem_cat {
    KVD_MEM_CONN = 0, /* connection buffers */
    KVD_MEM_INDEX,    /* the store index */
    KVD_MEM_STAGING,  /* staging and bounce buffers */
    KVD_MEM_OTHER,    /* everything else we allocate ourselves */
    KVD_MEM_CAT_COUNT
} kvd_mem_cat_t;

/* calloc / realloc / free with the bytes charged to `cat`. kvd_mem_free and
 * kvd_mem_realloc need the size the block was allocated with. */
void *kvd_mem_calloc(kvd_mem_cat_t cat, size_t count, size_t size);
void *kvd_mem_realloc(kvd_mem_cat_t cat, void *ptr, size_t old_bytes, size_t new_bytes);
void kvd_mem_free(kvd_mem_cat_t cat, void *ptr, size_t bytes);

/* Bytes currently charged to `cat`. */
uint64_t kvd_mem_bytes(kvd_mem_cat_t cat);
const char *kvd_mem_cat_name(kvd_mem_cat_t cat);

/* The process's resident memory, from /proc/self/status (bytes). */
typedef struct kvd_proc_mem {
    uint64_t rss_bytes;
    uint64_t rss_anon_bytes;
    uint64_t rss_file_bytes;
    uint64_t rss_shmem_bytes;
} kvd_proc_mem_t;
int kvd_proc_mem_read(kvd_proc_mem_t *out);

/* ------------------------------------------------------------ page keys */

#define KVD_KEY_BYTES 32
/* A key's short tag (store/'s seeded hash of it): what an object records of
 * a parent, and what Inspect shows of a parent that is not stored. */
#define KVD_KEY_TAG_BYTES 8

/*
 * What Reserve answers per key (DESIGN.md section 4). Here, below store/ and
 * proto/, because both speak it: the store decides it, the RPC carries it
 * (ReserveReply.results), the linker acts on it. Wire values: never
 * renumber them.
 */
typedef enum kvd_reserve_result {
    KVD_RESERVE_ALLOCATED = 0, /* yours: write it at loc, then Publish */
    KVD_RESERVE_EXISTS = 1,    /* already stored and readable */
    KVD_RESERVE_IN_FLIGHT = 2, /* another writer holds it */
    KVD_RESERVE_NO_SPACE = 3,  /* no room, even after eviction */
} kvd_reserve_result_t;

/* How many results there are: a value >= this is not a result. */
#define KVD_RESERVE_RESULT_COUNT 4

/*
 * The page-key chain of DESIGN.md section 3, compatible with SGLang:
 *   key[i] = SHA256(key[i-1] || tokens of page i as uint32 little-endian)
 * with key[-1] = `prior` when given (32 bytes), absent otherwise. Only full
 * pages get a key: n_keys = n_tokens / page_size. `keys` must hold that many.
 * Returns KVD_OK or KVD_ERR_INVALID (page_size 0).
 */
int kvd_key_chain(const uint32_t *tokens, size_t n_tokens, size_t page_size,
                  const uint8_t *prior, uint8_t (*keys)[KVD_KEY_BYTES], size_t *n_keys);

/* Lower-case hex of a 32-byte key into out (65 bytes with the NUL). */
void kvd_key_to_hex(const uint8_t key[KVD_KEY_BYTES], char out[65]);

/* Parses 64 hex digits. Returns KVD_ERR_INVALID on anything else. */
int kvd_key_from_hex(const char *hex, uint8_t key[KVD_KEY_BYTES]);

/* ------------------------------------------------------------ pool guard */

/*
 * Keeps this process alive when the shared pool file it maps at base
 * (bytes long, from descriptor fd) is cut short under it: the named pool
 * file cannot be sealed, and any same-host writer may ftruncate it. A
 * SIGBUS past the file's end inside a guarded mapping waits up to 3 s for
 * the daemon to grow the file back (then grows it itself, through a
 * duplicate of fd, where that is writable), or, for the daemon's own
 * mapping (owner), grows it back at once and keeps the size it saw
 * (kvd_pool_guard_take_cut). Then the access runs again: the lost bytes
 * read as zeros, and the daemon drops the objects that were there. Other
 * SIGBUS go to the handler that was installed before the first add, or
 * kill as by default. Up to 16 mappings; KVD_ERR_NO_SPACE beyond. Remove
 * before unmapping. The handler is process-wide and installed once: a
 * SIGBUS handler installed after it takes the signal first.
 */
int kvd_pool_guard_add(void *base, uint64_t bytes, int fd, bool owner);
void kvd_pool_guard_remove(void *base);
/* The smallest size an owner's handler found the file cut to since the
 * last call (UINT64_MAX: none), reset. */
uint64_t kvd_pool_guard_take_cut(void *base);
/* Faults the guard repaired in this process, since it started. */
uint64_t kvd_pool_guard_repairs(void);

/* ------------------------------------------------------------- checksums */

/*
 * CRC-32C (Castagnoli) of buf, continuing from crc (0 to start): the
 * journal's and the SSD tier's check. kvd_crc32c(0, "123456789", 9) is
 * 0xe3069283. Uses the CPU's instruction where it has one;
 * kvd_crc32c_sw is the table version, always (for tests to compare).
 */
uint32_t kvd_crc32c(uint32_t crc, const void *buf, size_t len);
uint32_t kvd_crc32c_sw(uint32_t crc, const void *buf, size_t len);

/* ------------------------------------------------------------- helpers */

#define KVD_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define KVD_MIN(a, b)     ((a) < (b) ? (a) : (b))
#define KVD_MAX(a, b)     ((a) > (b) ? (a) : (b))

/* Copies at most dst_len-1 bytes and always terminates. */
void kvd_strlcpy(char *dst, const char *src, size_t dst_len);

/* ---------------------------------------------------------- credentials */

/*
 * Reads a token file into buf (at most cap bytes): its content with the
 * trailing line breaks removed. With owner_only (the daemon), a file its
 * group or others may open is refused. Errors (why says which, naming the
 * file): cannot open or read, not a regular file, KVD_ERR_INVALID for open
 * to others or empty, KVD_ERR_TOO_LARGE over cap. buf is wiped on failure.
 */
int kvd_token_read(const char *path, bool owner_only, uint8_t *buf, size_t cap,
                   size_t *len, char *why, size_t why_len);

/* Whether a and b hold the same bytes, in time that depends only on the
 * longer length (no early exit at the first difference). */
bool kvd_const_time_equal(const void *a, size_t a_len, const void *b, size_t b_len);
/* ---------------------------------------------------------------- text */

/* Whether s[0..n) is valid UTF-8 (RFC 3629: no overlong forms, no
 * surrogates, nothing above U+10FFFF). */
bool kvd_utf8_valid(const char *s, size_t n);

/*
 * kvd_strlcpy that writes valid UTF-8: cuts only between characters (a
 * character that does not fit whole, or is cut short at the end of src, is
 * dropped) and writes '?' for each byte that is not part of a valid one.
 */
void kvd_utf8_copy(char *dst, const char *src, size_t dst_len);

/*
 * Bytes someone else chose (a client's name, a namespace name), made safe
 * for a log line or an error text: printable ASCII stays, a backslash
 * becomes "\\" and every other byte "\xNN", so the result is one line of
 * printable ASCII (valid UTF-8) that tells the bytes apart. Truncated to
 * dst_len-1 bytes, never inside an escape; always terminated. Returns dst,
 * for use as a printf argument. KVD_ESCAPED_MAX(n) bytes hold n escaped.
 */
const char *kvd_escape(char *dst, size_t dst_len, const char *src, size_t src_len);
#define KVD_ESCAPED_MAX(n) (4 * (size_t)(n) + 1)

/* ------------------------------------------------------------- cluster */

/*
 * The cluster's page directory is sharded across the live daemons by
 * rendezvous (highest-random-weight) hashing: the owner of an entry is the
 * member whose score for it is highest. A member that leaves moves only
 * its own share (to the members that scored next), one that joins takes
 * about 1/N of every other's; no table is shared. Daemons, tools and the
 * simulator in bench/ all call these, so they agree on every owner.
 *
 * kvd_dir_hash hashes what names an entry (the tenant's and the
 * namespace's names and the page key); kvd_node_hash a member's id;
 * kvd_rendezvous_score mixes the two (64-bit, well spread even for ids
 * that differ in one byte).
 */
uint64_t kvd_dir_hash(const char *tenant, const char *ns,
                      const uint8_t key[KVD_KEY_BYTES]);
uint64_t kvd_node_hash(const char *node_id);
uint64_t kvd_rendezvous_score(uint64_t dir_hash, uint64_t node_hash);
/* The splitmix64 finaliser: every input bit moves about half the output's
 * (the hashes above, and the keyed hash tables of the daemon's cluster). */
uint64_t kvd_mix64(uint64_t z);
/* The index in node_hashes[0..n) of the owner of dir_hash (the highest
 * score; a tie goes to the lower index, so callers pass members in one
 * order, sorted by id). SIZE_MAX when n is 0. */
size_t kvd_rendezvous_owner(uint64_t dir_hash, const uint64_t *node_hashes, size_t n);

#endif /* KVD_COMMON_H */
