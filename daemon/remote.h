/*
 * remote.h - remote loads: objects another daemon of the cluster holds,
 * brought into this daemon's pool so that a local worker can load them.
 * Private to daemon/; runs on the event loop.
 *
 * The path: a worker's Acquire names keys this store lacks; the keys'
 * holders are asked for through the directory (kvd_dirsvc_route), and
 * from one holder each the objects come into this daemon's pool: over UCX
 * where the holder serves it (their room reserved here, then the holder
 * pins them, METHOD_FETCH with pin, and their bytes are read by UCX
 * through the holder's UCX server straight into the reservations), else
 * over the RPC (METHOD_FETCH: the holder copies them out of its pool into
 * the reply, and they are written here); then published. Meanwhile the Acquire
 * answers KVD_INPROGRESS and the linker asks again within its timeout,
 * as for an SSD promotion; then the objects are local, and stay (a later
 * load of the same prefix is a local hit; they are evicted like any other).
 *
 * A holder asked for a key on its SSD tier starts its promotion and says
 * so; the key is asked for again after RETRY_MS (the Acquire answers in
 * progress meanwhile). A holder asked for a key it does not hold (a stale
 * directory entry) announces its removal to the key's owner again.
 * A key that no live member holds, or whose fetch failed (the holder died,
 * dropped it, answered garbage), is remembered as failed for FAIL_HOLD_MS:
 * Acquires of it answer KVD_ERR_NOT_FOUND, so the load fails (rid, false)
 * rather than waiting for its timeout. Fetched bytes are taken only when
 * their size is the namespace's object size.
 *
 * Memory: the fetch table is fixed (KVD_REMOTE_SLOTS keys in flight or
 * remembered failed, KVD_MEM_INDEX); past it an Acquire gets NOT_FOUND.
 */
#ifndef KVD_DAEMON_REMOTE_H
#define KVD_DAEMON_REMOTE_H

#include "dirsvc.h"
#include "kvd_store.h"
#include "peers.h"

#define KVD_REMOTE_SLOTS 65536

typedef struct kvd_remote kvd_remote_t;

typedef struct kvd_remote_stats {
    uint64_t fetches; /* Fetch requests sent */
    uint64_t fetched; /* objects brought in */
    uint64_t fetched_bytes;
    uint64_t fetched_ucx; /* of the objects, those read over UCX */
    uint64_t failed;      /* keys whose fetch failed or had no holder */
    uint64_t served;      /* objects this daemon's Fetch replies carried */
    uint64_t served_bytes;
} kvd_remote_stats_t;

/* pool_base: this daemon's mapping of its pool (objects are copied in and
 * out at their offsets); max_frame: the largest frame a reply may be. */
int kvd_remote_create(kvd_store_t *store, uint8_t *pool_base, kvd_dirsvc_t *dir,
                      kvd_peers_t *peers, size_t max_frame, kvd_remote_t **out);
void kvd_remote_destroy(kvd_remote_t *r);

/*
 * An Acquire of keys[0..n) of namespace ns (tenant's) found some missing:
 * starts fetching those not local and not under way. Returns
 * KVD_INPROGRESS when any missing key is being fetched (now or already),
 * KVD_ERR_NOT_FOUND when every missing key failed lately (or the table is
 * full), KVD_OK when none is missing any more.
 */
int kvd_remote_want(kvd_remote_t *r, uint32_t ns, const kvd_key_t *keys, size_t n,
                    uint64_t now_ms);

/* Objects are read over UCX (peers.h kvd_peers_read, the pool set there)
 * from holders that serve it, over the RPC from the others. */
void kvd_remote_use_ucx(kvd_remote_t *r, bool on);

/* The holder's side: a peer's Fetch, answered from this pool: the bytes,
 * or with pin, the keys pinned under a lease of owner (the asking
 * connection) and their offsets. */
void kvd_remote_serve_fetch(kvd_remote_t *r, uint64_t owner, const kvd_msg_t *req,
                            kvd_msg_t *rep);

void kvd_remote_stats(const kvd_remote_t *r, kvd_remote_stats_t *out);

#endif
