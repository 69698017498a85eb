/*
 * status.c - names of kvd_status_t values (kvd_status.h) and the errno
 * boundary.
 *
 * The name switch has no default label, so that -Wswitch (in -Wall, an
 * error with -Werror) refuses a code added to the enum without its name.
 */
#include "kvd_common.h"

#include <errno.h>
#include <string.h>

const char *kvd_status_str(int status)
{
    switch ((kvd_status_t)status) {
    case KVD_OK: return "ok";
    case KVD_INPROGRESS: return "in progress";
    case KVD_ERR_INVALID: return "invalid argument";
    case KVD_ERR_NOMEM: return "out of memory";
    case KVD_ERR_IO: return "i/o error";
    case KVD_ERR_NOT_FOUND: return "not found";
    case KVD_ERR_EXISTS: return "already exists";
    case KVD_ERR_BUSY: return "busy";
    case KVD_ERR_NO_SPACE: return "no space";
    case KVD_ERR_TIMEOUT: return "timed out";
    case KVD_ERR_PROTOCOL: return "protocol error";
    case KVD_ERR_UNSUPPORTED: return "not supported";
    case KVD_ERR_CLOSED: return "connection closed";
    case KVD_ERR_TOO_LARGE: return "too large";
    case KVD_ERR_STATE: return "wrong state";
    case KVD_ERR_PERMISSION: return "permission denied";
    case KVD_ERR_UNAVAILABLE: return "unavailable";
    case KVD_ERR_UNKNOWN_METHOD: return "unknown method";
    case KVD_ERR_DRAINING: return "draining";
    case KVD_ERR_AUTH: return "not authenticated";
    case KVD_ERR_QUOTA: return "over quota";
    case KVD_ERR_CORRUPT: return "checksum mismatch";
    case KVD_ERR_NO_DEVICE: return "no device runtime or device";
    case KVD_ERR_NOT_DEVICE: return "not device memory";
    case KVD_ERR_DEVICE: return "device runtime error";
    }
    return "unknown status";
}

bool kvd_status_known(int status)
{
    return strcmp(kvd_status_str(status), "unknown status") != 0;
}

kvd_status_t kvd_status_from_errno(int err)
{
    switch (err) {
    case 0: return KVD_OK;
    case EINPROGRESS: return KVD_INPROGRESS;
    case EINVAL: return KVD_ERR_INVALID;
    case ENOMEM: return KVD_ERR_NOMEM;
    case ENOENT: return KVD_ERR_NOT_FOUND;
    case EEXIST: return KVD_ERR_EXISTS;
    case EBUSY: return KVD_ERR_BUSY;
    case ENOSPC: return KVD_ERR_NO_SPACE;
    case ETIMEDOUT: return KVD_ERR_TIMEOUT;
    case EPROTO: return KVD_ERR_PROTOCOL;
    case ENOSYS:
    case EOPNOTSUPP: return KVD_ERR_UNSUPPORTED;
    case EPIPE:
    case ECONNRESET: return KVD_ERR_CLOSED;
    case EMSGSIZE:
    case E2BIG:
    case EFBIG: return KVD_ERR_TOO_LARGE;
    case EPERM:
    case EACCES: return KVD_ERR_PERMISSION;
    case ECONNREFUSED: return KVD_ERR_UNAVAILABLE;
    /* EAGAIN too: mlock, fork or pthread_create out of a resource is a
     * failed call, not work under way (the caller logged why) */
    default: return KVD_ERR_IO;
    }
}
