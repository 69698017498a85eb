/*
 * store_testing.h - calls into store/ that only its tests make: seams into a
 * module's private state, kept out of kvd_store.h so that no production
 * caller comes to depend on them. Production code does not include this
 * header (store/ itself includes it where it defines them).
 */
#ifndef KVD_STORE_TESTING_H
#define KVD_STORE_TESTING_H

#include "kvd_store.h"

/* (kvd_pool_base, once here, is public now: the daemon scrubs through it.) */

/* Where the tier holds ns's object `key`: its segment and the block of its
 * record's header there. KVD_ERR_NOT_FOUND when the object is not on the
 * tier (absent, or in DRAM). Tests of which record a restart keeps. */
int kvd_store_tier_place(const kvd_store_t *s, uint32_t ns,
                         const uint8_t key[KVD_KEY_BYTES], uint32_t *seg,
                         uint32_t *block);

/* Holds the tier's sync rounds back (hold) or lets them go: while held,
 * spills whose writes landed are not acknowledged (their DRAM copies stay,
 * their extents are not freed). kvd_tier_opts_t.hold_syncs holds from the
 * start. No-op without a tier. */
void kvd_store_tier_hold_syncs(kvd_store_t *s, bool hold);

/* Fails the tier's next n segment or dead-list syncs (TIO_SYNC) with EIO,
 * as a device whose cache flush fails: the round's writes in a segment
 * whose sync failed are not acknowledged (tier.c's sync_done). No-op
 * without a tier. */
void kvd_store_tier_fail_syncs(kvd_store_t *s, uint32_t n);

/* Fails the next n of kvd_store_tier_sync_dead's own syncs of the
 * dead-list (an operator's Evict waits for one; it does not go through the
 * I/O executor, so kvd_store_tier_fail_syncs does not reach it) with EIO.
 * No-op without a tier. */
void kvd_store_tier_fail_dead_syncs(kvd_store_t *s, uint32_t n);

/* The journal's next n cut-backs of a failed append fail (journal.h
 * jnl_fail_cuts). No-op without a journal. */
void kvd_store_journal_fail_cuts(kvd_store_t *s, uint32_t n);

#endif
