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

#endif
