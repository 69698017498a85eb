/*
 * token.c - reading an authentication token from its file, for the daemon
 * (which also insists that only its owner can read the file) and for every
 * client (linker, CLI, benchmarks, tests). A token is the file's bytes with
 * the trailing line break(s) removed, so that `echo SECRET > FILE` and an
 * editor that ends the last line both give "SECRET".
 */
#include "kvd_common.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int kvd_token_read(const char *path, bool owner_only, uint8_t *buf, size_t cap,
                   size_t *len, char *why, size_t why_len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
    if (fd < 0) {
        int err = errno;
        snprintf(why, why_len, "cannot open %s: %s", path, strerror(err));
        return kvd_status_from_errno(err);
    }
    struct stat st;
    int rc = KVD_OK;
    if (fstat(fd, &st) != 0) {
        rc = kvd_status_from_errno(errno);
        snprintf(why, why_len, "cannot stat %s: %s", path, strerror(errno));
    } else if (!S_ISREG(st.st_mode)) {
        rc = KVD_ERR_INVALID;
        snprintf(why, why_len, "%s is not a regular file", path);
    } else if (owner_only && (st.st_mode & 077) != 0) {
        /* a token others can read is no secret: say so rather than serve */
        rc = KVD_ERR_INVALID;
        snprintf(why, why_len,
                 "%s is open to its group or others (mode %04o): chmod 600 it", path,
                 (unsigned)(st.st_mode & 07777));
    } else if ((uint64_t)st.st_size > cap + 2) {
        rc = KVD_ERR_TOO_LARGE;
        snprintf(why, why_len, "%s is over %zu bytes: not a token", path, cap);
    }
    size_t n = 0;
    while (rc == KVD_OK) {
        /* one more byte than fits, to tell a long file from a full one */
        uint8_t tmp[512];
        ssize_t r = read(fd, tmp, sizeof(tmp));
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            rc = kvd_status_from_errno(errno);
            snprintf(why, why_len, "cannot read %s: %s", path, strerror(errno));
            break;
        }
        if (r == 0)
            break;
        for (ssize_t i = 0; i < r && rc == KVD_OK; i++) {
            if (n == cap + 2) {
                rc = KVD_ERR_TOO_LARGE;
                snprintf(why, why_len, "%s is over %zu bytes: not a token", path, cap);
            } else if (n < cap) {
                buf[n++] = tmp[i];
            } else {
                n++; /* past cap: only line breaks may follow */
                if (tmp[i] != '\n' && tmp[i] != '\r') {
                    rc = KVD_ERR_TOO_LARGE;
                    snprintf(why, why_len, "%s is over %zu bytes: not a token", path,
                             cap);
                }
            }
        }
        explicit_bzero(tmp, sizeof(tmp));
    }
    close(fd);
    if (n > cap)
        n = cap; /* the extra bytes were line breaks, dropped below */
    while (rc == KVD_OK && n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r'))
        n--;
    if (rc == KVD_OK && n == 0) {
        rc = KVD_ERR_INVALID;
        snprintf(why, why_len, "%s is empty: a token needs at least one byte", path);
    }
    if (rc != KVD_OK) {
        explicit_bzero(buf, cap);
        return rc;
    }
    *len = n;
    return KVD_OK;
}

bool kvd_const_time_equal(const void *a, size_t a_len, const void *b, size_t b_len)
{
    /* every byte of the longer one is looked at, whatever differs first */
    const volatile uint8_t *x = a, *y = b;
    size_t n = KVD_MAX(a_len, b_len);
    uint8_t diff = a_len != b_len;
    for (size_t i = 0; i < n; i++) {
        uint8_t xi = i < a_len ? x[i] : 0;
        uint8_t yi = i < b_len ? y[i] : 0;
        diff |= (uint8_t)(xi ^ yi);
    }
    return diff == 0;
}
