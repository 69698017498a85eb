/*
 * kvdock.h - libkvdock, the worker-side linker: the library a serving
 * worker links to reach its node's kvdockd.
 *
 * Conventions: every function returns 0 (KVD_OK) or a negative kvd status
 * (kvd_strerror() names it); handles are opaque and owned by the caller
 * until the matching close; outputs are set only on success.
 *
 * This version opens a connection (Hello), asks the daemon's health and
 * computes page keys. Device pools, LOAD / PREPARE / COMMIT / ABORT and the
 * completion queues extend this header without changing what is here.
 */
#ifndef KVDOCK_H
#define KVDOCK_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KVD_API __attribute__((visibility("default")))

#define KVD_PAGE_KEY_BYTES 32

typedef struct kvd_linker kvd_linker_t;

typedef struct kvd_linker_config {
    /* Unix socket of the daemon (NULL: the default instance's socket). */
    const char *socket_path;
    /* "HOST:PORT" of a daemon's TCP listener; used instead of socket_path. */
    const char *connect;
    /* Shows up in the daemon's log. NULL: "libkvdock". */
    const char *client_name;
    /* Bound on every RPC; 0: 5000 ms. */
    int timeout_ms;
} kvd_linker_config_t;

typedef enum kvd_linker_health {
    KVD_LINKER_HEALTH_STARTING = 1,
    KVD_LINKER_HEALTH_READY = 2,
    KVD_LINKER_HEALTH_DRAINING = 3,
} kvd_linker_health_t;

/* Connects to the daemon and says Hello. Errors: -15 (unavailable) when no
 * daemon listens, -10 (unsupported) for a protocol version mismatch. */
KVD_API int kvd_linker_open(const kvd_linker_config_t *config, kvd_linker_t **out);

/* Closes the connection and frees the handle. NULL is fine. */
KVD_API void kvd_linker_close(kvd_linker_t *linker);

/* The daemon's health and its pool size in bytes (either may be NULL). */
KVD_API int kvd_linker_health(kvd_linker_t *linker, kvd_linker_health_t *state,
                              uint64_t *pool_bytes);

/*
 * The SGLang-compatible page-key chain: one 32-byte key per full page of
 * `page_size` tokens, key[i] = SHA256(key[i-1] || page i's tokens as uint32
 * little-endian), key[-1] = prior (32 bytes) or nothing when prior is NULL.
 * `keys` must hold n_tokens / page_size keys; *n_keys says how many.
 */
KVD_API int kvd_page_keys(const uint32_t *tokens, size_t n_tokens, size_t page_size,
                          const uint8_t *prior, uint8_t (*keys)[KVD_PAGE_KEY_BYTES],
                          size_t *n_keys);

/* A short description of a status code. */
KVD_API const char *kvd_strerror(int status);

/* The library's version, "MAJOR.MINOR.PATCH". */
KVD_API const char *kvd_version(void);

#ifdef __cplusplus
}
#endif

#endif /* KVDOCK_H */
