/*
 * ltest.h - what the linker tests share on top of kvdock.h: waiting for a
 * completion and a whole layer-wise load.
 */
#ifndef KVD_TEST_LTEST_H
#define KVD_TEST_LTEST_H

#include "kvdock.h"

#include <stdbool.h>

/* Pops completions (loads or offloads), skipping others, until id comes
 * back or timeout_ms passes; true when it came back successful. */
bool lt_wait_done(kvd_linker_t *l, bool loads, uint64_t id, int timeout_ms);

/* LOAD, PREPARE, COMMIT with pages [0, adopted) of the one transfer t
 * adopted, start layer-wise loading and wait for layer 0. Returns 0 or the
 * first error; the completion is for lt_wait_done. */
int lt_load_all(kvd_linker_t *l, uint64_t rid, const kvd_transfer_t *t, uint32_t adopted);

#endif
