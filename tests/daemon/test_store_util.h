/*
 * test_store_util.h - what the store integration tests (test_store_*.c)
 * share, on top of dtest.h: a store client (Hello with namespaces, the pool's
 * descriptor mapped), one helper per store RPC that hands back the reply's
 * typed error, Stats without leaking the reply's arena, page-key chains and a
 * byte pattern that is a function of (key, byte index).
 *
 * Every helper returns the call's status: the transport's when the call
 * itself failed (KVD_ERR_CLOSED, KVD_ERR_TIMEOUT, ...), else the reply's
 * (KVD_OK or the daemon's typed error). Decoded replies are always cleared
 * here: what callers get back is copied into their own memory.
 *
 * Threading: a ts_client_t belongs to one thread (and one process: a child
 * made by fork() opens its own).
 */
#ifndef KVD_TEST_STORE_UTIL_H
#define KVD_TEST_STORE_UTIL_H

#include "dtest.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TS_RPC_TIMEOUT_MS 10000
#define TS_MAX_NS         8

/* The namespaces most tests use. */
#define TS_KV_NS       "m/kv/tp0"
#define TS_KV_BYTES    (64u * 1024u)
#define TS_MAMBA_NS    "m/mamba/tp0"
#define TS_MAMBA_BYTES (16u * 1024u)

/* ReserveReply.results are kvd_reserve_result_t (kvd_common.h).
 * "allocated", "exists", "in_flight", "no_space" or "?". */
const char *ts_result_name(unsigned r);

/* A typed error reply: status, the failed batch item + 1, the text. */
typedef struct ts_err {
    int status;
    uint32_t index;
    char text[KVD_ERROR_MAX];
} ts_err_t;

/* A connection that said Hello (with namespaces), maybe with the pool mapped. */
typedef struct ts_client {
    kvd_client_t *c;
    uint64_t connection_id;
    uint64_t pool_bytes;
    uint32_t max_batch;
    uint64_t lease_ttl_ms;
    bool pool_fd_attached;
    uint32_t ns[TS_MAX_NS]; /* one id per namespace given to ts_open */
    size_t n_ns;
    int pool_fd;   /* -1 when none came */
    uint8_t *pool; /* MAP_SHARED mapping of pool_bytes, or NULL */
} ts_client_t;

/* A namespace spec for ts_open / ts_register. */
kvd_ns_spec_t ts_spec(const char *name, uint64_t object_bytes);

/*
 * Connects to the socket, says Hello with the namespaces (and want_pool_fd
 * when map_pool), takes the descriptor and maps it read-write. Records a
 * failure and returns non-zero when any of it fails (t is closed then).
 */
int ts_open(ts_client_t *t, const char *socket, const kvd_ns_spec_t *specs, size_t n,
            bool map_pool);
/* Unmaps, closes the descriptor and the connection. Safe on a closed t. */
void ts_close(ts_client_t *t);

/*
 * A writer's whole offload of one chain on the daemon at socket: Hello
 * with spec (pool mapped), Reserve keys[0..n) as a chain (at most
 * TS_CHAIN_MAX), the pattern of (key, salt) written into each, Publish.
 * Records a failure (naming `where`) for each step that goes wrong, a key
 * not allocated included. Returns 0 when every key was published.
 */
#define TS_CHAIN_MAX 64
int ts_put_chain(const char *socket, const kvd_ns_spec_t *spec, const kvd_key_t *keys,
                 size_t n, uint32_t salt, const char *where);

/* --- RPCs (see the top of this file for the return value) */

int ts_register(kvd_client_t *c, const kvd_ns_spec_t *specs, size_t n, uint32_t *ids,
                ts_err_t *err);

/* Items of a chain: key[i] with parent key[i-1] (first_parent for i = 0,
 * NULL = none) and depth first_depth + i. */
void ts_chain_items(const kvd_key_t *keys, size_t n, const uint8_t *first_parent,
                    uint32_t first_depth, kvd_put_item_t *items);

/* Reserve: results[i] (kvd_reserve_result_t) and offsets[i] for each item;
 * *lease the write lease (0 when nothing was allocated). Records a failure
 * when a successful reply does not have one result per item. The reply's
 * object size goes to ts_last_object_bytes. */
int ts_reserve(kvd_client_t *c, uint32_t ns, uint64_t object_bytes,
               const kvd_put_item_t *items, size_t n, uint64_t *lease, uint8_t *results,
               uint64_t *offsets, ts_err_t *err);

/* Reserve of items in ns (each must be allocated), then Publish of the
 * whole lease; each failure recorded, naming `what`. True when all went. */
bool ts_put_items(ts_client_t *t, uint32_t ns, uint64_t object_bytes,
                  const kvd_put_item_t *items, size_t n, const char *what);

/* object_bytes of the last successful Reserve or Acquire reply. */
extern uint64_t ts_last_object_bytes;

/* Publish (method KVD_METHOD_PUBLISH) or Revoke the keys (n = 0: all). */
int ts_finish(kvd_client_t *c, kvd_method_t method, uint64_t lease, const kvd_key_t *keys,
              size_t n, ts_err_t *err);
int ts_publish(kvd_client_t *c, uint64_t lease, const kvd_key_t *keys, size_t n,
               ts_err_t *err);

int ts_acquire(kvd_client_t *c, uint32_t ns, uint64_t object_bytes, const kvd_key_t *keys,
               size_t n, uint64_t *lease, uint64_t *offsets, ts_err_t *err);
/* ts_acquire with wait_ms: the daemon may hold the reply that long while
 * the objects come into its pool (an SSD promotion, a fetch from another
 * member), answering OK when they are there; 0 is ts_acquire. */
int ts_acquire_wait(kvd_client_t *c, uint32_t ns, uint64_t object_bytes,
                    const kvd_key_t *keys, size_t n, uint32_t wait_ms, uint64_t *lease,
                    uint64_t *offsets, ts_err_t *err);
int ts_release(kvd_client_t *c, uint64_t lease, ts_err_t *err);

/* Lookup: at most cap boundaries into b, their number in *nb. */
int ts_lookup(kvd_client_t *c, const kvd_lookup_pool_msg_t *pools, size_t n_pools,
              uint32_t *b, size_t cap, size_t *nb, ts_err_t *err);

/* Inspect (ns_name "" = every namespace): at most cap objects into objs. */
int ts_inspect(kvd_client_t *c, const char *ns_name, const uint8_t *key,
               kvd_obj_msg_t *objs, size_t cap, size_t *n, ts_err_t *err);

/* What a Stats reply says, copied out of the reply. */
typedef struct ts_stats {
    kvd_store_stats_msg_t store;
    size_t n_ns;
    kvd_ns_msg_t ns[TS_MAX_NS];
    uint64_t connections_current;
    uint64_t protocol_errors;
    kvd_method_stats_t methods[KVD_METHOD_COUNT];
    bool checked;
    char check_error[KVD_ERROR_MAX];
    uint64_t check_us;         /* how long the check held the daemon */
    char error[KVD_ERROR_MAX]; /* the refusal's text, when the call was refused */
} ts_stats_t;

int ts_stats(kvd_client_t *c, bool check, ts_stats_t *out);
/* The same on a fresh connection (closed again). */
int ts_stats_fresh(const char *socket, bool check, ts_stats_t *out);
/* The namespace of that name in a Stats copy, or NULL. */
const kvd_ns_msg_t *ts_stats_ns(const ts_stats_t *s, const char *name);

/* Health on c: KVD_OK when it answered ready. */
int ts_health_ok(kvd_client_t *c);

/*
 * Waits (polling Stats every 20 ms, at most timeout_ms) until pred(stats)
 * holds; returns true then, false at the deadline (last stats in *out).
 */
bool ts_wait_stats(const char *socket, int timeout_ms, bool (*pred)(const ts_stats_t *),
                   ts_stats_t *out);

/* Records failures unless free + writing + ready = pool bytes. */
void ts_check_accounting(const ts_stats_t *s, const char *when);

/* Runs `kvdock --socket S stats --check`; records failures unless it exits
 * 0 and says "invariant check: ok". */
void ts_cli_check(const char *socket, const char *when);

/* --- keys and bytes */

/* The chain of n_pages page keys of the tokens first_token, first_token+1,
 * ... (page_size per page). Records a failure and returns -1 on error. */
int ts_make_keys(uint32_t first_token, size_t n_pages, size_t page_size, kvd_key_t *keys);

/* Byte j of the pattern for (key, salt). */
static inline uint8_t ts_pattern_byte(const uint8_t *key, uint32_t salt, size_t j)
{
    uint32_t x = (uint32_t)j * 2654435761u ^ salt;
    return (uint8_t)(key[j % KVD_KEY_BYTES] ^ (x >> 24) ^ (uint8_t)(j >> 12));
}

void ts_fill(uint8_t *dst, size_t len, const uint8_t *key, uint32_t salt);
/* Index of the first byte that differs from the pattern; SIZE_MAX if none. */
size_t ts_verify(const uint8_t *src, size_t len, const uint8_t *key, uint32_t salt);

/* True when [offset, offset + size) lies in a pool of pool_bytes. */
bool ts_in_pool(uint64_t offset, uint64_t size, uint64_t pool_bytes);

/* 16 hex digits of the first 8 bytes of a key (17 bytes with the NUL). */
void ts_hex8(const uint8_t *key, char out[17]);

#endif
