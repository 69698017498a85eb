/*
 * Description: helpers shared by the store engine tests
 * (test_engine_*.c): hand-made keys, the engine's self-check, a stats
 * snapshot, namespace registration and reserve results' names. They check with cmocka's
 * assertions, so include this after <cmocka.h>.
 */
#ifndef KVD_TEST_ENGINE_UTIL_H
#define KVD_TEST_ENGINE_UTIL_H

#include <stdint.h>

#include "kvd_store.h"

typedef uint8_t key_t32[KVD_KEY_BYTES];

/* A hand-made key: the counter in bytes 0..3, the rest zero. */
void mkkey(uint8_t key[KVD_KEY_BYTES], uint32_t n);

/* kvd_store_check() passes; prints its reason when it does not. */
void check_ok(const kvd_store_t *s);

/* A snapshot of kvd_store_stats(). */
kvd_store_stats_t stats(const kvd_store_t *s);

/* Registers namespace name of object size bytes; returns its id. */
uint32_t reg(kvd_store_t *s, const char *name, uint64_t bytes);

/* A reserve result's name for messages ("no_space"), "?" for others. */
const char *reserve_result_name(kvd_reserve_result_t r);

#endif
