/*
 * etcd.h - a small client of etcd's v3 HTTP/JSON gateway (etcd 3.4: the
 * /v3/kv, /v3/lease and /v3/watch endpoints), over libcurl. Private to
 * daemon/: the cluster membership (cluster.h) is its only user.
 *
 * What kvdock keeps in etcd is small (one key per daemon, the cluster
 * epoch), so every call but the watch is one blocking HTTP request, bounded
 * by the timeout given at creation. Keys and values are bytes; the client
 * encodes them as the gateway wants (base64 in JSON) and decodes replies.
 *
 * Endpoints: a comma-separated list of http://HOST:PORT URLs. A call that
 * cannot reach one endpoint (connect refused, timeout, an HTTP 5xx) tries
 * the next one, within the same timeout; the client remembers the endpoint
 * that answered last and starts there.
 *
 * Threading: a kvd_etcd_t and every watch made from it belong to one
 * thread at a time (the cluster thread).
 *
 * Errors (kvd_status_t): KVD_ERR_UNAVAILABLE no endpoint answered (etcd
 * down, partitioned, or the timeout ran out); KVD_ERR_NOT_FOUND the lease
 * is gone (expired or revoked); KVD_ERR_PROTOCOL a reply that is not what
 * the gateway sends; KVD_ERR_INVALID bad arguments; KVD_ERR_NOMEM.
 * kvd_etcd_error() says what went wrong last, for the log.
 */
#ifndef KVD_DAEMON_ETCD_H
#define KVD_DAEMON_ETCD_H

#include "kvd_common.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct kvd_etcd kvd_etcd_t;

/* One key-value pair as etcd returns it. key and value are NUL-terminated
 * for convenience (the NUL is not counted in the lengths). */
typedef struct kvd_etcd_kv {
    char *key;
    size_t key_len;
    char *value;
    size_t value_len;
    int64_t create_revision;
    int64_t mod_revision;
    int64_t version;
    int64_t lease; /* 0: none */
} kvd_etcd_kv_t;

/* The answer of a range: its pairs, and the store's revision it was read
 * at (a watch started at revision + 1 misses nothing after it). */
typedef struct kvd_etcd_kvs {
    kvd_etcd_kv_t *kv;
    size_t n;
    int64_t revision;
} kvd_etcd_kvs_t;

/* Endpoints as "http://127.0.0.1:2379,http://10.0.0.2:2379"; timeout_ms
 * bounds each call (all endpoints it tries together). */
int kvd_etcd_create(const char *endpoints, int timeout_ms, kvd_etcd_t **out);
void kvd_etcd_destroy(kvd_etcd_t *e);
/* What went wrong in the last call that failed ("" if none). */
const char *kvd_etcd_error(const kvd_etcd_t *e);
/* The endpoint the last successful call reached (for the log). */
const char *kvd_etcd_endpoint(const kvd_etcd_t *e);

/* ---------------------------------------------------------------- leases */

/* Grants a lease of ttl_s seconds; *id gets its id, *granted_ttl_s (may be
 * NULL) the TTL etcd granted. */
int kvd_etcd_lease_grant(kvd_etcd_t *e, int ttl_s, int64_t *id, int *granted_ttl_s);
/* One keep-alive of the lease; *ttl_s (may be NULL) gets the TTL left.
 * KVD_ERR_NOT_FOUND when the lease has expired or was revoked (etcd
 * answers a TTL of 0 or less): its keys are gone, grant a new one. */
int kvd_etcd_lease_keepalive(kvd_etcd_t *e, int64_t id, int *ttl_s);
/* Revokes the lease (its keys are deleted at once). */
int kvd_etcd_lease_revoke(kvd_etcd_t *e, int64_t id);

/* ------------------------------------------------------------------- kv */

/* Puts key = value, attached to lease (0: none). *revision (may be NULL)
 * gets the revision of the put. */
int kvd_etcd_put(kvd_etcd_t *e, const char *key, size_t key_len, const char *value,
                 size_t value_len, int64_t lease, int64_t *revision);
/*
 * Compare-and-put in one transaction: puts key = value (with lease, 0
 * none) only if the key's mod_revision is expect_mod_revision (0: only if
 * the key does not exist). *done says whether it was put; when it was not,
 * *current (may be NULL) gets the key as it is now (n = 0 if absent),
 * which the caller frees with kvd_etcd_kvs_free.
 */
int kvd_etcd_cas(kvd_etcd_t *e, const char *key, size_t key_len,
                 int64_t expect_mod_revision, const char *value, size_t value_len,
                 int64_t lease, bool *done, kvd_etcd_kvs_t *current);
/* Reads one key (n = 0 if absent). */
int kvd_etcd_get(kvd_etcd_t *e, const char *key, size_t key_len, kvd_etcd_kvs_t *out);
/* Reads every key that starts with prefix, sorted by key. */
int kvd_etcd_get_prefix(kvd_etcd_t *e, const char *prefix, size_t prefix_len,
                        kvd_etcd_kvs_t *out);
/* Deletes one key; *deleted (may be NULL) gets how many were deleted. */
int kvd_etcd_delete(kvd_etcd_t *e, const char *key, size_t key_len, int64_t *deleted);
void kvd_etcd_kvs_free(kvd_etcd_kvs_t *kvs);

/* ---------------------------------------------------------------- watch */

typedef struct kvd_etcd_watch kvd_etcd_watch_t;

typedef struct kvd_etcd_event {
    bool is_delete; /* DELETE (kv has only key and mod_revision), else PUT */
    kvd_etcd_kv_t kv;
} kvd_etcd_event_t;

/*
 * Watches every key under prefix from start_revision (the revision of a
 * range plus one, so nothing between the range and the watch is missed).
 * The watch is one streaming HTTP request, read without blocking in
 * kvd_etcd_watch_poll. Returns KVD_OK once the gateway confirmed the
 * watch, or an error (nothing to stop).
 */
int kvd_etcd_watch_start(kvd_etcd_t *e, const char *prefix, size_t prefix_len,
                         int64_t start_revision, kvd_etcd_watch_t **out);
/*
 * Waits at most timeout_ms for events and appends what arrived to *events
 * (*n of them, malloc'd; free with kvd_etcd_events_free; *n = 0 and
 * *events = NULL when none came). Returns KVD_OK, or KVD_ERR_CLOSED when
 * the stream ended (etcd went away, or the watch was cancelled or its
 * start revision compacted): the caller stops this watch, reads the keys
 * again and starts a new one. Events delivered before the end are still
 * returned with it.
 */
int kvd_etcd_watch_poll(kvd_etcd_watch_t *w, int timeout_ms, kvd_etcd_event_t **events,
                        size_t *n);
/* The revision the watch has seen up to (its last event's or its last
 * progress header's); a new watch starts at this plus one. */
int64_t kvd_etcd_watch_revision(const kvd_etcd_watch_t *w);
void kvd_etcd_watch_stop(kvd_etcd_watch_t *w);
void kvd_etcd_events_free(kvd_etcd_event_t *events, size_t n);

#endif
