/*
 * chaos.h - what the parts of kvdock-chaos share: the model every process
 * agrees on (one paged pool, its object layout, the bytes of an object as a
 * function of its key), the prompts, the files a run leaves in its
 * directory, and the two child modes (a worker engine, the verifier).
 *
 * Processes: the driver (chaos.c) starts one kvdockd and N workers, each a
 * fresh exec of this program with --worker; after each round a verifier
 * (--verify) loads every acknowledged object and checks it byte-exact.
 * They talk through files only (append-only logs written with write(2), so
 * a SIGKILL loses at most the record being written), never through memory.
 */
#ifndef KVD_CHAOS_H
#define KVD_CHAOS_H

#include "kvdock.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ------------------------------------------------------------ the model */

#define CH_PAGE          16 /* tokens per page */
#define CH_LAYERS        4  /* layer ids 0..3, each a K and a V buffer */
#define CH_BUFS          2
#define CH_ROW           128 /* bytes per token row of one buffer */
#define CH_PAD           16  /* row_stride - CH_ROW: holds CH_PAD_BYTE */
#define CH_OBJECT_BYTES  ((uint64_t)CH_LAYERS * CH_BUFS * CH_PAGE * CH_ROW) /* 16 KiB */
#define CH_PREFIXES      6 /* shared prefixes: workers hit each other's pages */
#define CH_PREFIX_PAGES  32
#define CH_SUFFIX_PAGES  16
#define CH_MAX_PAGES     (CH_PREFIX_PAGES + CH_SUFFIX_PAGES)
#define CH_SUFFIXES      16      /* chaos: a bounded key set, nothing evicted */
#define CH_WIDE_SUFFIXES 1000000 /* soak: keys enough to cycle the pool */
#define CH_MODEL         "chaos-model"
#define CH_POISON_BYTE   0xEE
#define CH_PAD_BYTE      0x5A

typedef uint8_t ch_key_t[KVD_PAGE_KEY_BYTES];

/* The expected bytes of one row of the object stored under key. */
void ch_row_bytes(const uint8_t *key, uint32_t layer, uint32_t buf, uint32_t row,
                  uint8_t *out);
/* A 64-bit checksum of the whole object of key (its expected bytes, in
 * the object's layer-major order). */
uint64_t ch_object_checksum(const uint8_t *key);
/* The tokens of prompt (prefix, suffix): CH_MAX_PAGES * CH_PAGE ids. */
void ch_prompt_tokens(uint32_t prefix, uint32_t suffix, uint32_t *out);
/* Monotonic milliseconds (CLOCK_MONOTONIC: one clock for every process). */
uint64_t ch_now_ms(void);
void ch_sleep_ms(int ms);
/* splitmix64 step. */
uint64_t ch_rand(uint64_t *state);
void ch_key_hex(const uint8_t *key, char hex[2 * KVD_PAGE_KEY_BYTES + 1]);
bool ch_key_parse(const char *hex, uint8_t *key);

/* ------------------------------------------------------------ the files */

/*
 * In the run directory:
 *   w<I>.acks     one line per page of an offload acknowledged with
 *                 success: "<submit_ms> <ack_ms> <key hex> <checksum hex>"
 *   w<I>.tries    one line per page of every offload, written before it is
 *                 submitted: "<submit_ms> <key hex>"
 *   deaths        the daemon's SIGKILL times (ms), one a line
 *   w<I>.fail     one line per failure a worker found
 *   w<I>.g<G>.stats  the counters of incarnation G of worker I
 *   w<I>.g<G>.log    its stderr
 * (I: worker index, G: its incarnation: a killed worker is restarted.)
 */

/* What a worker or the verifier counts; summed by the driver. */
/* clang-format off */
#define CH_STATS(X) \
    X(iterations) \
    X(lookups) \
    X(hit_pages) \
    X(loads) \
    X(load_errors) \
    X(aborts) \
    X(partial_commits) \
    X(loads_completed) \
    X(load_failures) \
    X(pages_verified) \
    X(offloads) \
    X(offload_errors) \
    X(offloads_acked) \
    X(offload_failures) \
    X(pages_acked) \
    X(err_timeout) \
    X(err_closed) \
    X(err_unavailable) \
    X(err_not_found) \
    X(err_other) \
    X(starved) \
    X(calls_over_bound) \
    X(max_call_ms) \
    X(failures) \
    X(objects_verified) \
    X(missing_required) \
    X(missing_excused) \
    X(missing_evicted) \
    X(records_read) \
    X(records_old) \
    X(objects_survived) \
    X(unacked_verified) \
    X(lost_verifying)
/* clang-format on */

typedef struct ch_stats {
#define CH_FIELD(n) uint64_t n;
    CH_STATS(CH_FIELD)
#undef CH_FIELD
} ch_stats_t;

/* Writes st as "name value" lines to path (through a rename: a reader
 * never sees half a file). */
void ch_stats_write(const char *path, const ch_stats_t *st);
/* Adds the counters of path into st (max_call_ms: the larger); false when
 * the file is missing. */
bool ch_stats_add(const char *path, ch_stats_t *st);

/* ------------------------------------------------------------ the modes */

typedef struct ch_worker_opts {
    const char *socket;
    const char *dir;
    int index, gen;
    uint64_t seed;
    uint32_t suffixes; /* CH_SUFFIXES or CH_WIDE_SUFFIXES */
    int timeout_ms;    /* the linker's */
    bool strict;       /* no injuries: every error is a failure */
} ch_worker_opts_t;

/* Runs a worker engine until SIGTERM; returns its exit status (0: no
 * failure found). */
int ch_worker_main(const ch_worker_opts_t *o);

typedef struct ch_verify_opts {
    const char *socket;
    const char *dir;
    int workers;
    uint64_t since_ms;  /* records submitted before (the daemon's start) are old */
    const char *excuse; /* file of "start_ms end_ms" writer injuries (may be absent) */
    uint64_t window_ms; /* how far from an injury a loss is excused */
    bool evicted;       /* the daemon evicted since since_ms: a loss is eviction */
    const char *out;    /* the verifier's counters (ch_stats_write) */
    uint64_t death_ms;  /* the daemon's last SIGKILL (0: none): acks before it
                           that are verified count as objects_survived */
    const char *deaths; /* file of the daemon's SIGKILL times, one a line: a
                           page lost to one is excused only when an offload
                           of it was running then (see kill_excuses) */
    /* every key of every prompt (suffixes of them, 0: none) that the store
     * holds and no ack names is loaded and checked byte-exact too: nothing
     * visible may hold other bytes (a partial write recovered as published) */
    uint32_t all_keys_suffixes;
    /* objects per load (at most 128; 0: 128): small over an SSD tier, where
     * each load promotes its objects into a small pool */
    uint32_t batch;
} ch_verify_opts_t;

/* Looks up every object acknowledged since since_ms, then (all_keys_suffixes)
 * every other object of the key set; then loads those present and checks
 * each byte-exact (lost_verifying: present at the lookup, gone by the load);
 * returns the exit status (0: every required object present and exact,
 * and every present one exact). */
int ch_verify_main(const ch_verify_opts_t *o);

#endif
