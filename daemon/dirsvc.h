/*
 * dirsvc.h - the cluster directory as a service of this daemon: its share
 * (directory.h) served to peers, its store announced to the owners, and
 * lookups routed to the owners. Private to daemon/; runs on the event loop.
 *
 * Who owns an entry: kvd_rendezvous_owner over the live members (the
 * cluster view, sorted by id) while the cluster is READY; while it is not
 * (joining, degraded) nothing is announced or asked, and a routed lookup
 * answers from this daemon's own store alone.
 *
 * Announcing (the holder's side):
 *   - every key the store publishes or loses (kvd_store_set_presence) is
 *     queued and sent on the next tick, one DirAnnounce per owner, in the
 *     order the store told them;
 *   - after a membership change (a member joined, left, or restarted: a
 *     new start time under the same id), the store is walked in slices
 *     and every key whose owner changed is announced to its new owner;
 *   - the first announcement to each owner after this daemon started is
 *     a reset (the owner forgets what an earlier life of this daemon told
 *     it), and so is the first after that owner restarted.
 * Owning (the owner's side):
 *   - a member that leaves is taken out of every entry;
 *   - a member that joins takes the entries it now owns: this share drops
 *     them (their holders announce them to it).
 */
#ifndef KVD_DAEMON_DIRSVC_H
#define KVD_DAEMON_DIRSVC_H

#include "cluster.h"
#include "kvd_store.h"
#include "peers.h"

typedef struct kvd_dirsvc kvd_dirsvc_t;

/* Installs itself as the store's presence observer. */
int kvd_dirsvc_create(kvd_store_t *store, kvd_peers_t *peers, const char *self_id,
                      kvd_dirsvc_t **out);
void kvd_dirsvc_destroy(kvd_dirsvc_t *d);

/* The cluster's view changed (a copy the caller keeps alive until the
 * next call). */
void kvd_dirsvc_view(kvd_dirsvc_t *d, const kvd_cluster_view_t *view);
/* Sends what is queued and walks one slice of a re-announce. */
void kvd_dirsvc_tick(kvd_dirsvc_t *d);

/* The peer methods: DirAnnounce, and DirLookup with local set. */
void kvd_dirsvc_serve_announce(kvd_dirsvc_t *d, const kvd_msg_t *req, kvd_msg_t *rep);
void kvd_dirsvc_serve_local(kvd_dirsvc_t *d, const kvd_msg_t *req, kvd_msg_t *rep);

/*
 * A DirLookup without local: asks each key's owner once (one batched
 * request per owner), merges their answers with this daemon's own store,
 * and calls fn on the loop with the reply (rep's dir_lookup_rep, or an
 * error in it; fn takes nothing from rep after it returns). fn may run
 * before this returns (nothing to ask). Owners that fail or time out
 * count as knowing nothing.
 *
 * any: one holder per key is all the caller needs (a worker's Lookup, a
 * remote load). A key this daemon holds, or one the cache names a holder
 * of (kvd_dirsvc_set_cache), is then answered here and its owner is not
 * asked; without any (`kvdock show --cluster`, a Reserve stored once per
 * cluster) every owner is asked for every key, and the answer names every
 * holder the owners know.
 */
typedef void (*kvd_dirsvc_done_fn)(void *arg, kvd_msg_t *rep);
int kvd_dirsvc_route(kvd_dirsvc_t *d, const kvd_dir_lookup_req_t *req, bool any,
                     kvd_dirsvc_done_fn fn, void *arg);

/* Keeps what routed lookups learn of other members' keys for ttl_ms (0:
 * no cache), in 65,536 entries (3.5 MiB); cleared by any membership
 * change. dirsvc.c's "cache" says what it costs. */
int kvd_dirsvc_set_cache(kvd_dirsvc_t *d, uint64_t ttl_ms);
/* A remote load's fetch found key gone: member `holder` answered that it
 * does not have it (NULL: the fetch failed otherwise). The cache forgets
 * the key's holder, so the next lookup asks its owner, and, with a holder,
 * leaves that member out of routed answers for the key for a TTL (the
 * owners may not have heard yet). */
void kvd_dirsvc_stale(kvd_dirsvc_t *d, const char *tenant, const char *ns,
                      const uint8_t key[KVD_KEY_BYTES], const char *holder);

/* The RPC address of a live member (NULL when it is not one); whether an
 * id is this daemon's own; whether the cluster can be asked now. */
const char *kvd_dirsvc_address(const kvd_dirsvc_t *d, const char *node_id);
bool kvd_dirsvc_is_self(const kvd_dirsvc_t *d, const char *node_id);
/* Whether a holder a directory answer names can serve now: a live member
 * other than this daemon (an entry naming anyone else is stale). */
bool kvd_dirsvc_other_live(const kvd_dirsvc_t *d, const char *node_id);
bool kvd_dirsvc_ready(const kvd_dirsvc_t *d);

/* This daemon was asked for a key it does not hold (a stale entry of the
 * directory): its removal is announced again to the key's owner. */
void kvd_dirsvc_not_here(kvd_dirsvc_t *d, const char *tenant, const char *ns,
                         const uint8_t key[KVD_KEY_BYTES]);

/* Its counters (directory_entries, announced_keys, announce_failures,
 * announce_queued, peer_pending, dir_cache_*) into out; the others are
 * left alone. */
void kvd_dirsvc_counters(const kvd_dirsvc_t *d, kvd_cluster_counters_t *out);

/* Entries of this daemon's share; announcements waiting to go. */
uint64_t kvd_dirsvc_entries(const kvd_dirsvc_t *d);
uint64_t kvd_dirsvc_queued(const kvd_dirsvc_t *d);

#endif
