/*
 * store_testing.h - calls into store/ that only its tests make: seams into a
 * module's private state, kept out of kvd_store.h so that no production
 * caller comes to depend on them. Production code does not include this
 * header (store/ itself includes it where it defines them).
 */
#ifndef KVD_STORE_TESTING_H
#define KVD_STORE_TESTING_H

#include "kvd_store.h"

/* The pool's mapping in the process that created it. The daemon hands out
 * the descriptor (kvd_pool_fd) instead; tests write through this mapping
 * and read through one of their own, or the other way round. */
void *kvd_pool_base(const kvd_pool_t *p);

#endif
