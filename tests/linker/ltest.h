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

/* Asks the linker's health every 10 ms (errors while the daemon is not
 * there yet) until the daemon says ready or timeout_ms passes; true when
 * it did. */
bool lt_wait_ready(kvd_linker_t *l, int timeout_ms);

/* LOAD, PREPARE, COMMIT with pages [0, adopted) of the one transfer t
 * adopted, start layer-wise loading and wait for layer 0. Returns 0 or the
 * first error; the completion is for lt_wait_done. */
int lt_load_all(kvd_linker_t *l, uint64_t rid, const kvd_transfer_t *t, uint32_t adopted);

/* Registers a paged pool `name` in host memory: one layer (id 0) of a K
 * and a V buffer, `rows` rows of bytes_per_row each, packed; free_indices
 * may be NULL. */
int lt_register_kv(kvd_linker_t *l, const char *name, uint8_t *k, uint8_t *v,
                   uint32_t bytes_per_row, uint32_t page_size, uint64_t rows,
                   kvd_free_indices_fn free_indices, uint32_t *pool_id);

/* The main of a test that needs one daemon of its own (64 MiB pool): starts
 * it, runs run(socket), checks it exits on SIGTERM; returns the test's exit
 * status under `name`. */
int lt_main(const char *name, void (*run)(const char *socket));

#endif
