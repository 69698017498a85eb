/*
 * directory.h - the cluster's page directory: which members hold which
 * (tenant, namespace, key). Private to daemon/.
 *
 * Each live member owns the entries that rendezvous hashing
 * (kvd_rendezvous_owner over the members sorted by id) gives it; holders
 * tell the owners what they hold (DirAnnounce) and the owners answer who
 * holds what (DirLookup). Two halves, both on the event loop:
 *
 *   the share    (kvd_dir_*): this daemon's entries as an owner, filled
 *                by the announcements it receives, emptied of a holder
 *                when the holder resets (a full re-announce) or leaves;
 *   the holder   (kvd_dir_holder_*): what this daemon's store tells it
 *                (kvd_store_set_presence) queued per owner and sent in
 *                batches on the tick; after a membership change, its whole
 *                store walked in slices and re-announced to the new owners,
 *                each owner's first frame a reset.
 *
 * A directory entry is a hint: a key held by more than
 * KVD_DIR_HOLDERS_MAX members names the first ones; an entry may outlive
 * its object for one batching interval. Whoever acts on it (a load) must
 * check with the holder.
 *
 * Memory: entries are charged to KVD_MEM_INDEX; queued announcements to
 * KVD_MEM_STAGING.
 */
#ifndef KVD_DAEMON_DIRECTORY_H
#define KVD_DAEMON_DIRECTORY_H

#include "kvd_common.h"
#include "kvd_proto.h"

#include <stdbool.h>
#include <stdint.h>

#define KVD_DIR_HOLDERS_MAX 4 /* holders one entry names */

typedef struct kvd_dir kvd_dir_t;

int kvd_dir_create(kvd_dir_t **out);
void kvd_dir_destroy(kvd_dir_t *d);

/* Applies one announcement from holder req->holder; *entries gets the
 * entries naming that holder afterwards. */
int kvd_dir_announce(kvd_dir_t *d, const kvd_dir_announce_req_t *req, uint64_t *entries);
/* Answers a lookup from this share: rep's dir_lookup_rep, in rep's arena. */
int kvd_dir_lookup_local(kvd_dir_t *d, const kvd_dir_lookup_req_t *req, kvd_msg_t *rep);
/* Forgets every entry of a holder (it left the cluster). */
void kvd_dir_holder_gone(kvd_dir_t *d, const char *node_id);
/* Members joined: drops the entries that one of them (joiners[0..n), node
 * hashes) now owns rather than this daemon (self_hash), by rendezvous;
 * their holders announce them to it. Returns how many went. */
uint64_t kvd_dir_drop_moved(kvd_dir_t *d, uint64_t self_hash, const uint64_t *joiners,
                            size_t n);
/* Entries in this share. */
uint64_t kvd_dir_entries(const kvd_dir_t *d);
/* Heap bytes of the share (its tables). */
uint64_t kvd_dir_bytes(const kvd_dir_t *d);

#endif
