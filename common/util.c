/*
 * util.c - clocks, size and number parsing, string helpers, memory
 * accounting, the /proc/self/status reader, and the process helpers of
 * tools and tests (reaping a child within a timeout, dumping a log, the RDMA
 * device check).
 */
#include "kvd_common.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

bool kvd_mutex_lock_until(pthread_mutex_t *m, uint64_t deadline_ns)
{
#if defined(__SANITIZE_THREAD__)
    uint64_t now = kvd_now_ns(), left = deadline_ns > now ? deadline_ns - now : 0;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t at = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec + left;
    ts.tv_sec = (time_t)(at / 1000000000ull);
    ts.tv_nsec = (long)(at % 1000000000ull);
    return pthread_mutex_timedlock(m, &ts) == 0;
#else
    struct timespec ts = {.tv_sec = (time_t)(deadline_ns / 1000000000ull),
                          .tv_nsec = (long)(deadline_ns % 1000000000ull)};
    return pthread_mutex_clocklock(m, CLOCK_MONOTONIC, &ts) == 0;
#endif
}

uint64_t kvd_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t kvd_wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000ull + (uint64_t)ts.tv_nsec / 1000000ull;
}

void kvd_sleep_ns(uint64_t ns)
{
    struct timespec req = {.tv_sec = (time_t)(ns / 1000000000ull),
                           .tv_nsec = (long)(ns % 1000000000ull)};
    while (nanosleep(&req, &req) != 0 && errno == EINTR)
        ;
}

void kvd_strlcpy(char *dst, const char *src, size_t dst_len)
{
    if (dst_len == 0)
        return;
    size_t n = strnlen(src, dst_len - 1);
    memcpy(dst, src, n);
    dst[n] = '\0';
}

/* Returns the multiplier of a size suffix, 0 when the suffix is unknown. */
static uint64_t size_suffix_multiplier(const char *s)
{
    static const struct {
        const char *name;
        uint64_t mult;
    } suffixes[] = {
        {"", 1},          {"b", 1},         {"k", KVD_KiB},   {"kb", KVD_KiB},
        {"kib", KVD_KiB}, {"m", KVD_MiB},   {"mb", KVD_MiB},  {"mib", KVD_MiB},
        {"g", KVD_GiB},   {"gb", KVD_GiB},  {"gib", KVD_GiB}, {"t", KVD_TiB},
        {"tb", KVD_TiB},  {"tib", KVD_TiB},
    };
    for (size_t i = 0; i < KVD_ARRAY_SIZE(suffixes); i++)
        if (strcasecmp(s, suffixes[i].name) == 0)
            return suffixes[i].mult;
    return 0;
}

int kvd_size_parse(const char *text, uint64_t *out_bytes)
{
    if (text == NULL)
        return KVD_ERR_INVALID;
    while (isspace((unsigned char)*text))
        text++;
    if (!isdigit((unsigned char)*text) && *text != '.')
        return KVD_ERR_INVALID; /* no sign, no empty string */

    char *end = NULL;
    errno = 0;
    /* Integers are parsed exactly; only fractions go through a double. */
    unsigned long long whole = strtoull(text, &end, 10);
    if (errno != 0)
        return KVD_ERR_INVALID;
    double frac = 0.0;
    if (*end == '.') {
        /* digits only: strtod would also take an exponent ("1.5e3") */
        const char *d = end + 1;
        double scale = 0.1;
        while (isdigit((unsigned char)*d)) {
            frac += (*d - '0') * scale;
            scale /= 10.0;
            d++;
        }
        if (d == end + 1 && end == text)
            return KVD_ERR_INVALID; /* "." alone */
        end = (char *)d;
    }
    char suffix[8];
    size_t slen = strlen(end);
    while (slen > 0 && isspace((unsigned char)end[slen - 1]))
        slen--;
    if (slen >= sizeof(suffix))
        return KVD_ERR_INVALID;
    memcpy(suffix, end, slen);
    suffix[slen] = '\0';
    uint64_t mult = size_suffix_multiplier(suffix);
    if (mult == 0)
        return KVD_ERR_INVALID;

    if (whole > UINT64_MAX / mult)
        return KVD_ERR_INVALID;
    uint64_t bytes = (uint64_t)whole * mult;
    if (frac > 0.0) {
        double extra = floor(frac * (double)mult);
        if ((double)(UINT64_MAX - bytes) < extra)
            return KVD_ERR_INVALID;
        bytes += (uint64_t)extra;
    }
    *out_bytes = bytes;
    return KVD_OK;
}

const char *kvd_size_format(uint64_t bytes, char *buf, size_t buf_len)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    double v = (double)bytes;
    size_t u = 0;
    while (v >= 1024.0 && u + 1 < KVD_ARRAY_SIZE(units)) {
        v /= 1024.0;
        u++;
    }
    if (u == 0)
        snprintf(buf, buf_len, "%llu B", (unsigned long long)bytes);
    else
        snprintf(buf, buf_len, "%.2f %s", v, units[u]);
    return buf;
}

int kvd_u64_parse(const char *text, uint64_t min, uint64_t max, uint64_t *out)
{
    if (text == NULL || !isdigit((unsigned char)text[0]))
        return KVD_ERR_INVALID;
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 10);
    if (errno != 0 || *end != '\0' || v < min || v > max)
        return KVD_ERR_INVALID;
    *out = v;
    return KVD_OK;
}

int kvd_double_parse(const char *text, double min, double max, double *out)
{
    if (text == NULL || *text == '\0')
        return KVD_ERR_INVALID;
    char *end = NULL;
    errno = 0;
    double v = strtod(text, &end);
    if (errno != 0 || *end != '\0' || !isfinite(v) || v < min || v > max)
        return KVD_ERR_INVALID;
    *out = v;
    return KVD_OK;
}

/* ---------------------------------------------------- memory accounting */

static _Atomic uint64_t mem_bytes[KVD_MEM_CAT_COUNT];

void *kvd_mem_calloc(kvd_mem_cat_t cat, size_t count, size_t size)
{
    void *p = calloc(count, size);
    if (p != NULL)
        atomic_fetch_add(&mem_bytes[cat], (uint64_t)count * size);
    return p;
}

void *kvd_mem_realloc(kvd_mem_cat_t cat, void *ptr, size_t old_bytes, size_t new_bytes)
{
    void *p = realloc(ptr, new_bytes);
    if (p == NULL)
        return NULL;
    atomic_fetch_sub(&mem_bytes[cat], (uint64_t)old_bytes);
    atomic_fetch_add(&mem_bytes[cat], (uint64_t)new_bytes);
    return p;
}

void kvd_mem_free(kvd_mem_cat_t cat, void *ptr, size_t bytes)
{
    if (ptr == NULL)
        return;
    free(ptr);
    atomic_fetch_sub(&mem_bytes[cat], (uint64_t)bytes);
}

uint64_t kvd_mem_bytes(kvd_mem_cat_t cat)
{
    return atomic_load(&mem_bytes[cat]);
}

const char *kvd_mem_cat_name(kvd_mem_cat_t cat)
{
    static const char *const names[KVD_MEM_CAT_COUNT] = {"conn", "index", "staging",
                                                         "other"};
    return (unsigned)cat < KVD_MEM_CAT_COUNT ? names[cat] : "?";
}

int kvd_proc_mem_read(kvd_proc_mem_t *out)
{
    FILE *f = fopen("/proc/self/status", "r");
    if (f == NULL)
        return kvd_status_from_errno(errno);
    static const struct {
        const char *key;
        size_t offset;
    } fields[] = {
        {"VmRSS:", offsetof(kvd_proc_mem_t, rss_bytes)},
        {"RssAnon:", offsetof(kvd_proc_mem_t, rss_anon_bytes)},
        {"RssFile:", offsetof(kvd_proc_mem_t, rss_file_bytes)},
        {"RssShmem:", offsetof(kvd_proc_mem_t, rss_shmem_bytes)},
    };
    kvd_proc_mem_t m = {0};
    char line[256];
    while (fgets(line, sizeof(line), f) != NULL) {
        for (size_t i = 0; i < KVD_ARRAY_SIZE(fields); i++) {
            size_t klen = strlen(fields[i].key);
            if (strncmp(line, fields[i].key, klen) == 0) {
                unsigned long long kib = strtoull(line + klen, NULL, 10);
                *(uint64_t *)((char *)&m + fields[i].offset) = kib * 1024ull;
            }
        }
    }
    fclose(f);
    *out = m;
    return KVD_OK;
}

int kvd_lock_file(const char *comp, const char *path, int *fd, char *holder,
                  size_t holder_len)
{
    holder[0] = '\0';
    *fd = open(path, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (*fd < 0) {
        int err = errno;
        KVD_ERROR(comp, "cannot open the lock %s: %s", path, strerror(err));
        return kvd_status_from_errno(err);
    }
    struct stat st;
    if (fstat(*fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid()) {
        KVD_ERROR(comp, "the lock %s is not a regular file of uid %u: remove it", path,
                  (unsigned)geteuid());
        return KVD_ERR_STATE;
    }
    if (flock(*fd, LOCK_EX | LOCK_NB) != 0) {
        int err = errno;
        if (err != EWOULDBLOCK) {
            KVD_ERROR(comp, "flock %s: %s", path, strerror(err));
            return kvd_status_from_errno(err);
        }
        ssize_t n = holder_len > 1 ? pread(*fd, holder, holder_len - 1, 0) : 0;
        holder[n > 0 ? n : 0] = '\0';
        holder[strcspn(holder, "\n")] = '\0';
        if (holder[0] == '\0')
            snprintf(holder, holder_len, "(unknown)");
        return KVD_ERR_BUSY;
    }
    char pid[32];
    int len = snprintf(pid, sizeof(pid), "%d\n", (int)getpid());
    if (ftruncate(*fd, 0) != 0 || pwrite(*fd, pid, (size_t)len, 0) != len)
        KVD_WARN(comp, "writing our pid into %s: %s", path, strerror(errno));
    return KVD_OK;
}

int kvd_wait_pid(pid_t pid, int timeout_ms, int *wstatus)
{
    uint64_t deadline = kvd_now_ns() + (uint64_t)timeout_ms * 1000000ull;
    for (;;) {
        int st;
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid) {
            if (wstatus)
                *wstatus = st;
            return KVD_OK;
        }
        if (r < 0 && errno == ECHILD)
            return KVD_ERR_NOT_FOUND;
        if (r < 0 && errno != EINTR)
            return KVD_ERR_IO;
        if (kvd_now_ns() >= deadline)
            return KVD_ERR_TIMEOUT;
        kvd_sleep_ns(5000000);
    }
}

int kvd_proc_start_ticks(int pid, uint64_t *ticks)
{
    if (pid <= 0)
        return KVD_ERR_INVALID;
    char path[64], buf[1024];
    snprintf(path, sizeof(path), "/proc/%d/stat", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOENT || errno == ESRCH ? KVD_ERR_NOT_FOUND
                                                 : kvd_status_from_errno(errno);
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    int err = errno;
    close(fd);
    if (n < 0)
        return err == ESRCH ? KVD_ERR_NOT_FOUND : kvd_status_from_errno(err);
    buf[n] = '\0';
    /* "pid (comm) state ...": comm may hold spaces and parentheses, so the
     * fields start after its last ')' */
    char *p = strrchr(buf, ')');
    if (p == NULL || p[1] != ' ')
        return KVD_ERR_PROTOCOL;
    p += 2;
    char state = *p;
    /* fields 3 (state) .. 22 (starttime); 20 is num_threads */
    unsigned long long threads = 0, start = 0;
    char *save = NULL;
    int field = 3;
    for (char *t = strtok_r(p, " ", &save); t != NULL; t = strtok_r(NULL, " ", &save)) {
        if (field == 20)
            threads = strtoull(t, NULL, 10);
        if (field == 22) {
            start = strtoull(t, NULL, 10);
            break;
        }
        field++;
    }
    if (field != 22)
        return KVD_ERR_PROTOCOL;
    /* a zombie leader still counts itself until reaped; more threads mean
     * some still run (the leader called pthread_exit) */
    if ((state == 'Z' || state == 'X') && threads <= 1)
        return KVD_ERR_NOT_FOUND;
    *ticks = start;
    return KVD_OK;
}

void kvd_dump_file(const char *path)
{
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return;
    fprintf(stderr, "---- %s ----\n", path);
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), f)) > 0)
        fwrite(buf, 1, n, stderr);
    fprintf(stderr, "---- end ----\n");
    fclose(f);
}

bool kvd_rdma_device_present(void)
{
    DIR *d = opendir("/sys/class/infiniband");
    bool any = false;
    for (struct dirent *e; d && (e = readdir(d)) != NULL;)
        any |= e->d_name[0] != '.';
    if (d)
        closedir(d);
    return any;
}
