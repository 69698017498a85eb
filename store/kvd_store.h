/*
 * kvd_store.h - the one public header of store/.
 *
 * This part of the store: how big the pool is (the sizing rule of
 * DESIGN.md section 9, a pure function of the host's memory figures so that
 * it can be tested on fixtures) and the pool itself, a shared-memory file the
 * daemon maps and populates at a bounded rate.
 *
 * Threading: kvd_pool_* may be called from the daemon's loop thread while the
 * population thread runs; the progress counters are atomics.
 */
#ifndef KVD_STORE_H
#define KVD_STORE_H

#include "kvd_common.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---------------------------------------------------------------- sizing */

/* What the host has, read from /proc/meminfo and the memory cgroup. */
typedef struct kvd_host_mem {
    uint64_t mem_total_bytes;     /* MemTotal */
    uint64_t mem_available_bytes; /* MemAvailable */
    uint64_t cgroup_limit_bytes;  /* UINT64_MAX when unlimited or absent */
    uint64_t cgroup_usage_bytes;  /* 0 when absent */
    int cgroup_version;           /* 0 (none found), 1 or 2 */
} kvd_host_mem_t;

/*
 * Reads the memory figures below `root` ("" or "/" for the live system, a
 * fixture directory in tests): root/proc/meminfo, root/proc/self/cgroup and
 * the cgroup files under root/sys/fs/cgroup. The tightest limit on the path
 * from the process's cgroup up to the root counts. Returns KVD_OK, or
 * KVD_ERR_NOT_FOUND / KVD_ERR_INVALID when meminfo is missing or unreadable.
 */
int kvd_host_mem_probe(const char *root, kvd_host_mem_t *out);

typedef struct kvd_sizing_req {
    uint64_t pool_size_bytes; /* --pool-size; 0 when not given */
    double mem_fraction;      /* --mem-fraction; 0 when not given */
    uint64_t reserve_bytes;   /* --reserve: kept free for everything else */
    uint64_t object_bytes;    /* a typical object, for the "fits" figure */
    uint64_t align_bytes;     /* the pool's page size (4 KiB, 2 MiB) */
} kvd_sizing_req_t;

typedef struct kvd_sizing {
    uint64_t limit_bytes;      /* min(MemTotal, cgroup limit) */
    uint64_t can_give_bytes;   /* min(MemAvailable, cgroup limit - usage) */
    uint64_t budget_bytes;     /* the pool's size, aligned */
    uint64_t max_budget_bytes; /* the largest pool that fits now */
    double max_fraction;       /* the --mem-fraction giving max_budget */
    uint64_t objects_fit;      /* budget / object_bytes */
    const char *source;        /* "pool-size" or "mem-fraction" */
} kvd_sizing_t;

/*
 * The sizing rule. The budget is --pool-size exactly, or
 * floor(mem_fraction * limit) - reserve: a function of the limit, which does
 * not change between starts, never of a free-memory snapshot. The snapshot
 * (can_give) only decides whether the budget plus the reserve fits now.
 *
 * Returns KVD_OK with *out filled; KVD_ERR_INVALID when both or neither of
 * pool size and fraction are given, or the budget is below one page or one
 * object; KVD_ERR_NO_SPACE when it does not fit. On error `why` (may be NULL)
 * says what is wrong and which value would work.
 */
int kvd_sizing_compute(const kvd_host_mem_t *host, const kvd_sizing_req_t *req,
                       kvd_sizing_t *out, char *why, size_t why_len);

/* The one startup line with every input and the result. */
void kvd_sizing_format(const kvd_host_mem_t *host, const kvd_sizing_req_t *req,
                       const kvd_sizing_t *s, char *buf, size_t buf_len);

/* ------------------------------------------------------------------ pool */

typedef struct kvd_pool_opts {
    const char *instance;       /* names the memfd: "kvdock-<instance>" */
    uint64_t size_bytes;        /* from kvd_sizing_t.budget_bytes */
    bool hugepages;             /* 2 MiB hugetlb pages */
    bool mlock;                 /* lock the pool once populated */
    uint64_t populate_rate_bps; /* bytes per second; 0 = no bound */
} kvd_pool_opts_t;

typedef struct kvd_pool kvd_pool_t;

/*
 * Creates the shared-memory file and maps it. Nothing is populated yet.
 * Errors: KVD_ERR_INVALID (size not a multiple of the page size),
 * KVD_ERR_UNSUPPORTED (no hugetlb memfd), or the mapping's error.
 */
int kvd_pool_create(const kvd_pool_opts_t *opts, kvd_pool_t **out);

/* Starts the population thread: fallocate then map each chunk, at most
 * populate_rate_bps, with a progress line per 10%. */
int kvd_pool_populate_start(kvd_pool_t *p);

/* Stops population (if running), unmaps and closes. NULL is fine. */
void kvd_pool_destroy(kvd_pool_t *p);

/* True once the whole pool is populated (and locked, if asked). */
bool kvd_pool_ready(const kvd_pool_t *p);
/* KVD_OK while fine; the population's error once it failed. */
int kvd_pool_error(const kvd_pool_t *p);
uint64_t kvd_pool_populated_bytes(const kvd_pool_t *p);
uint64_t kvd_pool_size(const kvd_pool_t *p);
bool kvd_pool_hugepages(const kvd_pool_t *p);
bool kvd_pool_mlocked(const kvd_pool_t *p);
int kvd_pool_fd(const kvd_pool_t *p);
void *kvd_pool_base(const kvd_pool_t *p);

#endif /* KVD_STORE_H */
