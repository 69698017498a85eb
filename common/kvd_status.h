/*
 * kvd_status.h - kvd_status_t, the one status type of kvdock: what every
 * function of the project returns and what libkvdock's API returns
 * (kvdock.h includes this header, and it is installed beside it).
 *
 * 0 is success, 1 "in progress", negative values are errors. A system
 * call's errno is converted once, at the boundary (kvd_status_from_errno()
 * in kvd_common.h), by the function that also logs the system's reason. The
 * values travel over the wire in error replies, so they are part of the
 * protocol: never renumber them; a new code takes the next free number.
 * kvd_strerror() (kvdock.h) and kvd_status_str() (kvd_common.h) name each.
 *
 * Self-contained on purpose: no includes, nothing but the enum.
 */
#ifndef KVD_STATUS_H
#define KVD_STATUS_H

typedef enum kvd_status {
    KVD_OK = 0,
    KVD_INPROGRESS = 1,
    KVD_ERR_INVALID = -1,         /* bad argument or malformed input */
    KVD_ERR_NOMEM = -2,           /* an allocation failed */
    KVD_ERR_IO = -3,              /* a system call failed */
    KVD_ERR_NOT_FOUND = -4,       /* no such key, namespace, file */
    KVD_ERR_EXISTS = -5,          /* already there */
    KVD_ERR_BUSY = -6,            /* held by someone else (in flight) */
    KVD_ERR_NO_SPACE = -7,        /* the pool or a table is full */
    KVD_ERR_TIMEOUT = -8,         /* a bounded wait ran out */
    KVD_ERR_PROTOCOL = -9,        /* a frame or message broke the protocol */
    KVD_ERR_UNSUPPORTED = -10,    /* not built in or not available here */
    KVD_ERR_CLOSED = -11,         /* the peer closed the connection */
    KVD_ERR_TOO_LARGE = -12,      /* over a configured limit */
    KVD_ERR_STATE = -13,          /* not allowed in the current state */
    KVD_ERR_PERMISSION = -14,     /* the OS said no */
    KVD_ERR_UNAVAILABLE = -15,    /* the daemon is not there or not ready */
    KVD_ERR_UNKNOWN_METHOD = -16, /* an RPC method this daemon does not know */
    KVD_ERR_DRAINING = -17,       /* the daemon is shutting down */
    KVD_ERR_AUTH = -18,           /* no credential, or one the daemon refuses */
    KVD_ERR_QUOTA = -19,          /* over the tenant's quota */
    KVD_ERR_CORRUPT = -20,        /* stored bytes failed their checksum */
    KVD_ERR_NO_DEVICE = -21,      /* the memory kind's runtime or device is not here */
    KVD_ERR_NOT_DEVICE = -22,     /* memory declared of a device kind is not */
    KVD_ERR_DEVICE = -23,         /* a device runtime call failed */
} kvd_status_t;

#endif /* KVD_STATUS_H */
