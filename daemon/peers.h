/*
 * peers.h - requests from this daemon to the other daemons of its cluster
 * (the directory's announcements and lookups). Private to daemon/.
 *
 * The event loop never waits on a peer: it queues a request with
 * kvd_peers_send and gets the reply later, on the loop, through the
 * callback that kvd_peers_poll runs (when kvd_peers_fd is readable). One
 * thread of its own does the calls, over one TCP connection per peer
 * (opened on first use, Hello with the cluster's token, reopened after a
 * failure), each call bounded by the timeout given at start; requests to
 * one peer are sent in the order they were queued.
 *
 * A peer that cannot be reached fails its requests (the callback gets the
 * status) within the timeout; kvd_peers_forget (it left the cluster) fails
 * what is queued for it at once.
 *
 * Threading: kvd_peers_send, _poll, _forget and _stop belong to the loop.
 */
#ifndef KVD_DAEMON_PEERS_H
#define KVD_DAEMON_PEERS_H

#include "kvd_common.h"
#include "kvd_proto.h"

typedef struct kvd_peers kvd_peers_t;

/* Runs on the loop: status KVD_OK with rep the peer's reply (status
 * inside it may be an error the peer answered), or the call's error with
 * rep NULL. rep is freed after the callback returns. */
typedef void (*kvd_peer_done_fn)(void *arg, int status, kvd_msg_t *rep);

int kvd_peers_start(const char *self_id, const uint8_t *token, size_t token_len,
                    int timeout_ms, kvd_peers_t **out);
void kvd_peers_stop(kvd_peers_t *p);
int kvd_peers_fd(const kvd_peers_t *p);

/* Queues req (its contents, arena included, become the queue's: req is
 * left empty) for node_id at address. fn may be NULL (nobody waits). */
int kvd_peers_send(kvd_peers_t *p, const char *node_id, const char *address,
                   kvd_msg_t *req, kvd_peer_done_fn fn, void *arg);
/* Runs the callbacks of the requests that ended. */
void kvd_peers_poll(kvd_peers_t *p);
/*
 * Reading objects over UCX (the remote loads' data path): with a pool set,
 * kvd_peers_read pins keys on a peer (req: a Fetch with pin set), reads
 * their bytes over UCX straight into this daemon's pool at local[i]
 * (object_bytes each; UINT64_MAX: not wanted), and releases the pin. Each
 * peer gets a data connection of its own for it (a read-only Hello that
 * asks for UCX: the peer's UCX server answers only what that grant
 * allows) and a UCX transport in the message mode connected to the peer's
 * UCX server. fn gets the pin reply (the keys present in it are in place
 * now) or an error: KVD_ERR_UNSUPPORTED when the peer or this daemon has
 * no UCX (the caller asks for the bytes over the RPC instead; a peer
 * without UCX is not asked again for PEER_UCX_RETRY_S). local is copied.
 */
int kvd_peers_set_pool(kvd_peers_t *p, void *base, uint64_t bytes);
int kvd_peers_read(kvd_peers_t *p, const char *node_id, const char *address,
                   kvd_msg_t *req, const uint64_t *local, size_t n, uint64_t object_bytes,
                   kvd_peer_done_fn fn, void *arg);
/* Bytes read over UCX so far. */
uint64_t kvd_peers_ucx_bytes(const kvd_peers_t *p);

/* node_id left: its queued requests fail (KVD_ERR_DRAINING), its
 * connection closes. */
void kvd_peers_forget(kvd_peers_t *p, const char *node_id);
/* Requests queued or in flight (for the stats). */
size_t kvd_peers_pending(const kvd_peers_t *p);

#endif
