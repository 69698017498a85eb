/*
 * log.c - one-line, timestamped logging to stderr.
 *
 * Each line is formatted into a stack buffer and written with one write(2),
 * so lines from several threads never interleave. The level is an atomic.
 */
#include "kvd_common.h"

#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

static _Atomic int log_level = KVD_LOG_INFO;

static const char *const level_names[] = {"error", "warn", "info", "debug"};

void kvd_log_set_level(kvd_log_level_t level)
{
    atomic_store(&log_level, (int)level);
}

kvd_log_level_t kvd_log_get_level(void)
{
    return (kvd_log_level_t)atomic_load(&log_level);
}

int kvd_log_level_parse(const char *name, kvd_log_level_t *out)
{
    for (size_t i = 0; i < KVD_ARRAY_SIZE(level_names); i++) {
        if (strcasecmp(name, level_names[i]) == 0) {
            *out = (kvd_log_level_t)i;
            return KVD_OK;
        }
    }
    return KVD_ERR_INVALID;
}

void kvd_log(kvd_log_level_t level, const char *component, const char *fmt, ...)
{
    if ((int)level > atomic_load(&log_level))
        return;

    char line[2048];
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    int n = snprintf(line, sizeof(line),
                     "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %-5s %s: ", tm.tm_year + 1900,
                     tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                     ts.tv_nsec / 1000000, level_names[level], component);
    if (n < 0)
        return;
    char msg[sizeof(line)];
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    size_t mlen = m < 0 ? 0 : KVD_MIN((size_t)m, sizeof(msg) - 1);
    /* one event, one line: a control byte that reached the text (a
     * client's string someone forgot to pass through kvd_escape) is
     * written as \xNN, so no newline or terminal escape gets through */
    size_t len = (size_t)n;
    for (size_t i = 0; i < mlen && len + 4 < sizeof(line) - 1; i++) {
        unsigned char c = (unsigned char)msg[i];
        if (c < 0x20 || c == 0x7f)
            len += (size_t)snprintf(line + len, 5, "\\x%02x", c);
        else
            line[len++] = (char)c;
    }
    line[len++] = '\n';
    ssize_t w = write(STDERR_FILENO, line, len);
    (void)w; /* nowhere left to report a failed log write */
}
