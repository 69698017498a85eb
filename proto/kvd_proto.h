/*
 * kvd_proto.h - the one public header of proto/: framing of messages on a
 * byte stream, the RPC messages as plain C structs, and a small blocking
 * client used by the CLI, the linker, tests and benchmarks.
 *
 * The generated protobuf-c types never leave proto/: callers fill and read
 * kvd_msg_t, and kvd_msg_pack()/kvd_msg_decode() convert.
 *
 * Frame format: a 4-byte little-endian payload length, then the payload (one
 * encoded Envelope of kvdock.proto). A length of zero or above the configured
 * maximum is a protocol error.
 *
 * Threading: a framer, a buffer and a client belong to one thread at a time.
 */
#ifndef KVD_PROTO_H
#define KVD_PROTO_H

#include "kvd_common.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KVD_PROTOCOL_VERSION   1
#define KVD_FRAME_HEADER_BYTES 4
#define KVD_FRAME_DEFAULT_MAX  (4u * 1024u * 1024u)
/* The hard ceiling for --max-frame: a frame must fit a 32-bit length and
 * one connection must not pin a large part of the daemon's heap. */
#define KVD_FRAME_LIMIT_MAX (256u * 1024u * 1024u)
#define KVD_NAME_MAX        128
#define KVD_VERSION_MAX     32
#define KVD_ERROR_MAX       256

/* --------------------------------------------------------------- buffer */

/* A growable byte buffer, charged to a memory category. */
typedef struct kvd_buf {
    uint8_t *data;
    size_t len;
    size_t cap;
    kvd_mem_cat_t cat;
} kvd_buf_t;

void kvd_buf_init(kvd_buf_t *b, kvd_mem_cat_t cat);
void kvd_buf_free(kvd_buf_t *b);
/* Makes room for `extra` more bytes. KVD_ERR_NOMEM on failure. */
int kvd_buf_reserve(kvd_buf_t *b, size_t extra);
int kvd_buf_append(kvd_buf_t *b, const void *data, size_t len);
/* Drops the first n bytes (they were written out). */
void kvd_buf_consume(kvd_buf_t *b, size_t n);

/* --------------------------------------------------------------- framer */

/*
 * Incremental frame reader for non-blocking sockets: read into the space
 * kvd_framer_space() hands out, kvd_framer_commit() what arrived, then take
 * whole frames with kvd_framer_next() until it answers 0.
 */
typedef struct kvd_framer {
    kvd_buf_t buf;
    size_t start;     /* first unconsumed byte in buf */
    size_t max_frame; /* largest payload accepted */
} kvd_framer_t;

void kvd_framer_init(kvd_framer_t *f, size_t max_frame, kvd_mem_cat_t cat);
void kvd_framer_free(kvd_framer_t *f);
/* Hands out at least `min` writable bytes at *space (*avail may be more). */
int kvd_framer_space(kvd_framer_t *f, size_t min, uint8_t **space, size_t *avail);
void kvd_framer_commit(kvd_framer_t *f, size_t n);
/*
 * Returns 1 and the next whole payload (valid until the next call on f),
 * 0 when more bytes are needed, KVD_ERR_TOO_LARGE for a length over the
 * maximum, KVD_ERR_PROTOCOL for a zero length.
 */
int kvd_framer_next(kvd_framer_t *f, const uint8_t **payload, size_t *len);
/* Bytes of a started but unfinished frame: non-zero at EOF = truncated. */
size_t kvd_framer_pending(const kvd_framer_t *f);

/* Appends a frame header for a payload of `len` bytes. */
int kvd_frame_put_header(kvd_buf_t *b, size_t len);

/* ------------------------------------------------------------- messages */

typedef enum kvd_method {
    KVD_METHOD_NONE = 0,
    KVD_METHOD_HELLO = 1,
    KVD_METHOD_HEALTH = 2,
    KVD_METHOD_STATS = 3,
    KVD_METHOD_COUNT
} kvd_method_t;

/* "hello", "health", ...; "unknown" outside the enum. */
const char *kvd_method_name(kvd_method_t m);

typedef enum kvd_health {
    KVD_HEALTH_NONE = 0,
    KVD_HEALTH_STARTING = 1,
    KVD_HEALTH_READY = 2,
    KVD_HEALTH_DRAINING = 3,
} kvd_health_t;

const char *kvd_health_name(kvd_health_t h);

/* Latency histogram bounds (microseconds), shared by daemon and readers. */
#define KVD_LATENCY_BUCKETS 14
/* Upper bound of bucket i in microseconds; UINT64_MAX for the last one. */
uint64_t kvd_latency_bound_us(size_t i);

typedef struct kvd_hello_req {
    char client_name[KVD_NAME_MAX];
    uint32_t pid;
    uint32_t protocol_version;
} kvd_hello_req_t;

typedef struct kvd_hello_rep {
    char daemon_version[KVD_VERSION_MAX];
    char instance[KVD_NAME_MAX];
    uint32_t protocol_version;
    uint32_t max_frame_bytes;
    uint32_t max_batch;
    uint64_t pool_bytes;
    uint64_t connection_id;
} kvd_hello_rep_t;

typedef struct kvd_health_rep {
    kvd_health_t state;
    uint64_t pool_bytes;
    uint64_t populated_bytes;
    uint64_t uptime_ms;
} kvd_health_rep_t;

typedef struct kvd_method_stats {
    uint64_t calls;
    uint64_t errors;
    uint64_t latency_us_sum;
    uint64_t latency_buckets[KVD_LATENCY_BUCKETS];
} kvd_method_stats_t;

typedef struct kvd_mem_stats {
    uint64_t pool_bytes;
    uint64_t pool_populated_bytes;
    uint64_t rss_bytes;
    uint64_t rss_anon_bytes;
    uint64_t rss_file_bytes;
    uint64_t rss_shmem_bytes;
    uint64_t cat_bytes[KVD_MEM_CAT_COUNT]; /* by kvd_mem_cat_t */
    bool hugepages;
    bool mlocked;
} kvd_mem_stats_t;

typedef struct kvd_stats_rep {
    char daemon_version[KVD_VERSION_MAX];
    char instance[KVD_NAME_MAX];
    kvd_health_t state;
    uint64_t uptime_ms;
    kvd_mem_stats_t memory;
    uint64_t connections_current;
    uint64_t connections_total;
    uint64_t connections_rejected;
    uint64_t protocol_errors;
    kvd_method_stats_t methods[KVD_METHOD_COUNT]; /* index = kvd_method_t */
} kvd_stats_rep_t;

/*
 * One RPC message. A request has reply = false and the body of its method
 * (Health and Stats requests have none). A reply has reply = true, the id
 * and method of its request, and either status = KVD_OK and the body of its
 * method, or a negative status, an error text and no body.
 */
typedef struct kvd_msg {
    uint64_t id;
    kvd_method_t method;
    bool reply;
    int32_t status;
    char error[KVD_ERROR_MAX];
    union {
        kvd_hello_req_t hello_req;
        kvd_hello_rep_t hello_rep;
        kvd_health_rep_t health_rep;
        kvd_stats_rep_t stats_rep;
    } body;
} kvd_msg_t;

/* Clears m and sets a request header. */
void kvd_msg_request(kvd_msg_t *m, uint64_t id, kvd_method_t method);
/* Clears m and sets an error reply to (id, method). */
void kvd_msg_error(kvd_msg_t *m, uint64_t id, kvd_method_t method, int status,
                   const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/*
 * Encodes m as one frame (header + payload) appended to out. Fails with
 * KVD_ERR_TOO_LARGE when the payload exceeds max_frame, KVD_ERR_INVALID for
 * a method or body that cannot be encoded, KVD_ERR_NOMEM.
 */
int kvd_msg_pack(const kvd_msg_t *m, size_t max_frame, kvd_buf_t *out);

/*
 * Decodes one payload into out. Returns KVD_OK; KVD_ERR_PROTOCOL when the
 * bytes are not an Envelope or the body does not belong to the method;
 * KVD_ERR_UNKNOWN_METHOD when the method is outside this build's enum (out->id
 * is set then, so the error reply can name the request).
 */
int kvd_msg_decode(const uint8_t *payload, size_t len, kvd_msg_t *out);

/* --------------------------------------------------------------- client */

/*
 * A blocking RPC client: one connection, one call at a time. Used by the
 * CLI, the linker, tests and benchmarks. Owned by one thread.
 */
typedef struct kvd_client kvd_client_t;

/* Connects to a Unix socket path. KVD_ERR_UNAVAILABLE when nobody listens. */
int kvd_client_connect_unix(const char *path, int timeout_ms, kvd_client_t **out);
/* Connects to "HOST:PORT" ("[v6]:PORT" for IPv6) over TCP. */
int kvd_client_connect_tcp(const char *host_port, int timeout_ms, kvd_client_t **out);
void kvd_client_close(kvd_client_t *c);
int kvd_client_fd(const kvd_client_t *c);

/*
 * Sends req (its id is assigned here) and waits up to timeout_ms for the
 * reply with the same id. Returns KVD_OK with *rep filled (check rep->status
 * for an error reply), KVD_ERR_TIMEOUT, KVD_ERR_CLOSED, KVD_ERR_PROTOCOL.
 */
int kvd_client_call(kvd_client_t *c, kvd_msg_t *req, kvd_msg_t *rep, int timeout_ms);

/* Hello with this process's pid and name; fills *rep on success. */
int kvd_client_hello(kvd_client_t *c, const char *client_name, kvd_hello_rep_t *rep,
                     int timeout_ms);

/* The default Unix socket of a daemon instance:
 * $XDG_RUNTIME_DIR/kvdockd-INSTANCE.sock, or /tmp/kvdockd-INSTANCE.sock. */
void kvd_default_socket_path(const char *instance, char *buf, size_t len);

/* Splits "HOST:PORT" / "[V6]:PORT" into host and port. */
int kvd_parse_host_port(const char *text, char *host, size_t host_len, uint16_t *port);

#endif /* KVD_PROTO_H */
