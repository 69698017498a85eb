/*
 * sim.h - a small serving engine in C that drives libkvdock the way SGLang
 * drives its external-cache linker: device pools
 * with their allocators, a page-aligned radix tree, prefill, offload, drop
 * from device, and the load flow LOOKUP -> LOAD -> PREPARE -> insert ->
 * COMMIT (or ABORT) -> layer-wise loading -> completed loads.
 *
 * Model: a layer string such as "AMAMA" (A full attention, M mamba, S
 * sliding window); layer i of the string has global layer id i. The
 * attention layers share one PAGED pool "kv" (K and V buffers), the sliding
 * window layers one PAGED pool "swa" (K and V), the mamba layers one SLOT
 * pool "mamba" (a temporal and a conv buffer). Every buffer is one array of
 * rows; row_stride = bytes_per_row + pad, and the pad bytes hold PAD_BYTE
 * for the life of the pool (a write past a row's end shows there).
 *
 * Memory: host memory, or with $KVDOCK_TEST_MEMORY=device device memory of
 * the runtime tests/gpu/gpu_test.h opens (a fake of tests/gpu/fake or a
 * GPU), registered as that memory kind; the simulator then reads and
 * writes rows only by copies, never by CPU access (see sim.c).
 *
 * Bytes: every row the "forward pass" writes is a deterministic function of
 * (prefix hash, layer id, buffer, row within page, byte index), where the
 * prefix hash covers every token up to the end of the page (paged pools) or
 * up to the node end (mamba state). sim_verify_tree() recomputes them for
 * every page and state the tree holds, so a misplaced, stale or unwritten
 * byte shows. Free units are poisoned (POISON_BYTE) when freed and checked
 * to stay poisoned: a copy into a freed slot shows too.
 *
 * Units: a PAGED pool allocates whole pages (page_size consecutive token
 * slots starting at a multiple of page_size), a SLOT pool one slot. Each
 * unit is FREE, REQ (held by a request or a load) or TREE (held by the
 * radix tree). Freeing a FREE unit (double free), a TREE unit or a unit out
 * of range is counted as an error, never performed; free_indices handed to
 * the linker goes through the same accounting. The idle-pool invariant:
 * available + cached (tree) + in use (requests) = total.
 *
 * Threading: the tree and the requests belong to the test's thread; the
 * allocators are locked, because the linker calls free_indices on the
 * thread that commits or aborts, which need not be the tree's. Failures
 * of unexpected calls are recorded with DT_CHECK (tests/daemon/dtest.h).
 * sim_fixture_t below is what each scenario program sets up: its daemon,
 * its tokens and the simulator.
 */
#ifndef KVD_TEST_SIM_H
#define KVD_TEST_SIM_H

#include "harness.h"
#include "kvdock.h"

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SIM_MAX_LAYERS 16
#define SIM_MAX_PAGES  64 /* pages of one prompt */
#define SIM_POISON     0xEE
#define SIM_PAD        0x5A

typedef enum sim_pool_kind {
    SIM_KV = 0,    /* full attention, PAGED, ALL_PAGES */
    SIM_SWA = 1,   /* sliding window, PAGED, TRAILING_PAGES(window) */
    SIM_MAMBA = 2, /* mamba state, SLOT, TRAILING_PAGES(1) */
    SIM_N_KINDS = 3,
} sim_pool_kind_t;

typedef enum sim_unit_state {
    SIM_UNIT_FREE = 0,
    SIM_UNIT_REQ = 1,
    SIM_UNIT_TREE = 2,
} sim_unit_state_t;

typedef struct sim_pool {
    bool present;
    sim_pool_kind_t kind;
    const char *name;
    kvd_addressing_t addressing;
    uint32_t rows_per_unit; /* page_size (PAGED) or 1 (SLOT) */
    uint32_t trailing_pages;
    uint32_t n_units;
    uint32_t n_layers;
    uint32_t layer_ids[SIM_MAX_LAYERS];
    uint32_t n_bufs;
    uint64_t bytes_per_row[2];
    uint64_t row_stride[2];
    uint8_t *data[SIM_MAX_LAYERS][2];
    uint32_t pool_id;      /* the linker's */
    uint64_t object_bytes; /* kvd_pool_info */
    char ns_name[256];     /* kvd_pool_info */
    pthread_mutex_t lock;  /* guards everything below */
    uint32_t *free_stack;  /* LIFO */
    uint32_t n_free;
    uint8_t *state;        /* sim_unit_state_t per unit */
    uint64_t linker_freed; /* units handed back through free_indices */
    uint64_t linker_free_calls;
    uint64_t double_frees; /* frees of a FREE unit */
    uint64_t tree_frees;   /* frees of a unit the tree holds */
    uint64_t bad_frees;    /* out of range, or not whole aligned pages */
} sim_pool_t;

typedef struct sim_config {
    const char *model_id;      /* the linker's model id */
    const char *layers;        /* "AMAMA": A attention, M mamba, S sliding window */
    uint32_t page_size;        /* tokens per page */
    uint32_t mamba_chunk;      /* mamba checkpoint chunk (0: page_size) */
    uint32_t swa_window;       /* sliding window in pages (SWA models) */
    uint32_t kv_pages;         /* device pages of the kv (and swa) pool */
    uint32_t mamba_slots;      /* device slots of the mamba pool */
    uint32_t pad;              /* row_stride - bytes_per_row, every buffer */
    int layer_group_size;      /* the linker's; 0: 1 */
    uint32_t tp_rank, tp_size; /* the linker's; tp_size 0: 1 */
    bool kv_rank_replicated;   /* the kv pool's (an MLA pool: the same on every rank) */
} sim_config_t;

typedef struct sim_node sim_node_t;

typedef struct sim {
    sim_config_t cfg;
    uint32_t ps;   /* page_size */
    uint32_t grid; /* lcm(mamba_chunk, page_size) with mamba, else page_size */
    uint32_t n_layers;
    sim_pool_t pools[SIM_N_KINDS];
    sim_node_t *root;
    kvd_linker_t *linker;
    uint64_t next_rid;
} sim_t;

/* -------------------------------------------------------------- set up */

/*
 * Opens the pools' memory as $KVDOCK_TEST_MEMORY says ("host", the default,
 * or "device": gt_open of tests/gpu/gpu_test.h) once per process; later
 * calls return the first answer. 0, 77 (no runtime or device: the reason
 * printed; the program skips) or 1. sim_open calls it; a program that
 * starts anything before sim_open calls it first, to skip cleanly. A
 * forked process opens its own (a GPU runtime does not survive fork).
 */
int sim_memory_open(void);
/* The pools are in device memory (after sim_memory_open). */
bool sim_on_device(void);

/*
 * Allocates the pools, opens a linker on socket and registers every pool
 * (free_indices -> the pool's allocator). Returns 0, or -1 after recording
 * a failure (sim_close is still safe).
 */
int sim_open(sim_t *s, const sim_config_t *cfg, const char *socket);
void sim_close(sim_t *s);

/* Deterministic tokens: n ids from seed (distinct seeds diverge at once). */
void sim_tokens(uint32_t seed, uint32_t *out, size_t n);

/* ------------------------------------------------------------- fixture */

/*
 * What a scenario program sets up: a kvdockd of its own (dt_start's
 * defaults), the tokens of its prompt and the simulator opened on that
 * daemon with the scenario's model.
 */
typedef struct sim_fixture {
    const char *name; /* the test's name: "sim/abort" */
    kvd_test_daemon_t d;
    bool daemon_up; /* d started */
    sim_config_t cfg;
    sim_t s;          /* sim_close is safe on it whatever happened */
    uint32_t *tokens; /* n_tokens ids from the seed (sim_tokens) */
    size_t n_tokens;
} sim_fixture_t;

/*
 * Starts the daemon, makes the tokens and opens the simulator with cfg (kept
 * by value). Returns 0 when all of it is ready, -1 after recording a
 * failure; sim_fixture_end is due either way. Where the pools' memory is a
 * device that is missing, exits 77 (the reason printed) before starting
 * anything.
 */
int sim_fixture_start(sim_fixture_t *f, const char *name, const sim_config_t *cfg,
                      uint32_t seed, size_t n_tokens);

/* Closes the simulator and opens a fresh one (a new linker, new device
 * pools) on the same daemon with the same config. Returns 0, or -1 (the
 * failure recorded, or no daemon to open on). */
int sim_fixture_reopen(sim_fixture_t *f);

/* Closes the simulator, frees the tokens, stops the daemon with SIGTERM
 * (dt_stop's checks: exit 0, a clean log) and returns the program's exit
 * status (dt_exit_status). */
int sim_fixture_end(sim_fixture_t *f);

/* ------------------------------------------------------ the daemon's CLI */

/* Lower-case hex of a page key into hex (2 * KVD_PAGE_KEY_BYTES + 1). */
void sim_key_hex(const uint8_t *key, char *hex);

/* Runs `kvdock --socket SOCKET evict ARGS... --json` (args NULL-terminated)
 * and returns how many objects it evicted; UINT64_MAX after recording the
 * failure (a non-zero exit, no "evicted" in its output). */
uint64_t sim_evict(const char *socket, const char *const *args);

/* --------------------------------------------------------- allocators */

/* One unit, FREE -> REQ; -1 when the pool is exhausted. */
int64_t sim_alloc_unit(sim_pool_t *p);
/* The engine's own free (REQ -> FREE); errors are counted as for the
 * linker's. */
void sim_free_unit(sim_pool_t *p, int64_t unit);
/* Units FREE now (the allocator's free count). */
uint32_t sim_free_count(sim_pool_t *p);
/* Units in state st now. */
uint32_t sim_count_state(sim_pool_t *p, sim_unit_state_t st);

/*
 * The idle-pool invariant of every pool: free count = FREE units, tree
 * references = TREE units (each once), available + cached + in use = total,
 * no double, tree-owned or malformed free; with quiescent, nothing is held
 * by a request. Records a failure for each violation (labelled with
 * where); returns how many.
 */
int sim_check_invariants(sim_t *s, bool quiescent, const char *where);

/* Free units whose rows are not all POISON, plus pad bytes not PAD, over
 * every pool (each recorded as a failure). Returns how many. */
int sim_check_poison(sim_t *s, const char *where);

/* ---------------------------------------------------------- radix tree */

typedef struct sim_insert_result {
    /* absolute pages [begin, end) adopted, per paged pool; begin == end:
     * none */
    uint32_t adopted_begin[SIM_N_KINDS], adopted_end[SIM_N_KINDS];
    bool mamba_exist; /* the tree had a state at the end: it freed ours */
    bool mamba_adopted;
} sim_insert_result_t;

/*
 * Inserts tokens' first n_pages pages; pages [0, first) must be in the tree
 * already. kv[i], swa[i] are the units of page first + i (swa may be NULL,
 * or hold -1 for pages without a window slot), mamba the state at the end
 * (-1 none). Adopted units become TREE; when the tree already has a state at
 * the end it frees `mamba` itself (mamba_exist). Frees nothing else: the
 * caller frees the units of pages not adopted. Returns 0 or -1 (recorded).
 */
int sim_tree_insert(sim_t *s, const uint32_t *tokens, uint32_t n_pages, uint32_t first,
                    const int64_t *kv, const int64_t *swa, int64_t mamba,
                    sim_insert_result_t *res);

/*
 * The engine's usable device prefix of tokens, in pages, at most max_pages:
 * the longest matched prefix p where (mamba) a node ends at p with a state
 * and (swa) the window's pages before p hold slots; 0 always qualifies.
 */
uint32_t sim_tree_cached(sim_t *s, const uint32_t *tokens, uint32_t max_pages);

/* Pages of tokens the tree holds (KV), at most max_pages. */
uint32_t sim_tree_match(sim_t *s, const uint32_t *tokens, uint32_t max_pages);

/* Drop from device: evicts the whole tree, freeing every unit. */
void sim_drop_device(sim_t *s);
/* Frees every mamba state the tree holds (KV stays). */
void sim_drop_mamba(sim_t *s);

/*
 * Checks every page (kv, swa) and every state the tree holds against the
 * deterministic bytes of its prefix; records a failure per bad unit and
 * returns how many.
 */
int sim_verify_tree(sim_t *s, const char *where);
/* The same for one layer only (what kvd_wait_layer promises). */
int sim_verify_tree_layer(sim_t *s, uint32_t layer_id, const char *where);

/* Units the tree holds in pool kind k. */
uint32_t sim_tree_units(sim_t *s, sim_pool_kind_t k);

/* ------------------------------------------------------------- engine */

/*
 * Prefill: computes the prompt from the device-cached prefix on, writes the
 * deterministic bytes of every full page (and the state at the last grid
 * point), inserts them into the tree and frees what the tree did not adopt.
 * Returns the number of full pages the tree holds for it after, or -1.
 */
int sim_prefill(sim_t *s, const uint32_t *tokens, size_t n_tokens);

/*
 * Offloads every node of the tree (pools in kinds_mask, bit = 1 << kind):
 * paged pages with their chain depth and prior key, the state at each node
 * end keyed by the page that ends it; waits (bounded) for every ack and
 * checks each comes back once with success. Returns the units offloaded per
 * kind in units[] (may be NULL); 0 or -1 (recorded).
 */
int sim_offload_tree(sim_t *s, unsigned kinds_mask, uint64_t units[SIM_N_KINDS]);

/* ---------------------------------------------------- the load flow */

typedef enum sim_req_state {
    SIM_REQ_NEW = 0,
    SIM_REQ_LOOKED_UP,
    SIM_REQ_LOADED, /* kvd_load succeeded */
    SIM_REQ_PREPARED,
    SIM_REQ_INSERTED,
    SIM_REQ_COMMITTED,
    SIM_REQ_ABORTED,
    SIM_REQ_DONE, /* its completion came back */
} sim_req_state_t;

typedef struct sim_req {
    uint64_t rid;
    const uint32_t *tokens;
    size_t n_tokens;
    sim_req_state_t state;
    uint32_t n_probe; /* floor((L-1)/page_size) pages */
    uint32_t cached;  /* device-usable prefix at lookup, pages */
    uint8_t keys[SIM_MAX_PAGES][KVD_PAGE_KEY_BYTES]; /* pages 0..n_probe-1 */
    uint32_t boundaries[SIM_MAX_PAGES + 1];          /* absolute pages */
    size_t n_boundaries;
    uint32_t b; /* chosen boundary (absolute pages); <= cached: none */
    /* the load: transfers in pool order kv, swa, mamba (those present) */
    size_t n_tr;
    sim_pool_kind_t tr_kind[SIM_N_KINDS];
    kvd_transfer_t tr[SIM_N_KINDS];
    int64_t kv_units[SIM_MAX_PAGES];  /* pages [cached, b) */
    int64_t swa_units[SIM_MAX_PAGES]; /* pages [swa_first, b) */
    int64_t *kv_tokens;               /* token slots of kv_units (malloc'd) */
    int64_t *swa_tokens;              /* token slots of swa_units (malloc'd) */
    uint32_t swa_first;
    int64_t mamba_slot;
    uint8_t mamba_key[1][KVD_PAGE_KEY_BYTES];
    int load_rc;
    sim_insert_result_t ins;
    kvd_commit_pool_t commit[SIM_N_KINDS];
    /* scenario 4: commit the SLOT entry with these adopted values */
    bool slot_override;
    uint32_t slot_adopted_begin, slot_adopted_end;
} sim_req_t;

/* A new request on tokens (kept by pointer); sim_req_fini frees its
 * arrays (not its units). */
void sim_req_init(sim_t *s, sim_req_t *r, const uint32_t *tokens, size_t n_tokens);
void sim_req_fini(sim_req_t *r);

/*
 * LOOKUP: page keys of the probe range, the device-usable prefix, then
 * kvd_lookup over the uncached tail for every pool; chooses r->b, the
 * largest returned boundary on the grid. Returns 0 or the lookup's status.
 */
int sim_req_lookup(sim_t *s, sim_req_t *r);

/* Allocates the device units for [cached, b) and calls kvd_load. Returns
 * kvd_load's status (r->load_rc); on failure the units stay held (the
 * engine aborts). 0 with nothing to do when b <= cached. */
int sim_req_load(sim_t *s, sim_req_t *r);
int sim_req_prepare(sim_t *s, sim_req_t *r);
/* The tree insert of [0, b) with the request's units. */
int sim_req_insert(sim_t *s, sim_req_t *r);
/* COMMIT with the insert result; checks that exactly the units of pages not
 * adopted came back through free_indices and that no mamba slot did. */
int sim_req_commit(sim_t *s, sim_req_t *r);
/* ABORT; checks every unit of the load came back through free_indices.
 * Returns kvd_load_abort's status. */
int sim_req_abort(sim_t *s, sim_req_t *r);

/* The engine frees every unit the request still holds itself (REQ ->
 * FREE): the fallback when the linker cannot hand them back. */
void sim_req_free_units(sim_t *s, sim_req_t *r);

/*
 * Runs one batch: kvd_start_layer_wise_loading, kvd_wait_layer for every
 * layer (each must return 0, and right after it that layer of every tree
 * page and state must be byte-exact), then pops completed loads (bounded) until the
 * n requests came back; checks each comes back exactly once, with
 * success, and nothing else. Returns 0 or -1 (recorded).
 */
int sim_run_batch(sim_t *s, sim_req_t **reqs, size_t n);

/*
 * The whole flow for one prompt (lookup .. batch). Returns the tokens
 * restored (b - cached pages), or -1 (recorded).
 */
int sim_load(sim_t *s, const uint32_t *tokens, size_t n_tokens);
/* The same on a request the caller initialised (and finishes). */
int sim_load_req(sim_t *s, sim_req_t *r);

/* Pops completed loads for a while (bounded, short) and returns how many
 * came back (for "nothing more comes back" checks). */
size_t sim_drain_loads(sim_t *s, int wait_ms);

/* kvd_stats of a pool kind (zeroed when the call fails, recorded). */
kvd_pool_stats_t sim_stats(sim_t *s, sim_pool_kind_t k);

/* Polls the daemon's Stats until pins == 0 (bounded); returns the last
 * pins value seen (0 on success) or UINT64_MAX when Stats failed. */
uint64_t sim_wait_pins_zero(const char *socket, int timeout_ms);
/* The daemon's pins now (UINT64_MAX on error). */
uint64_t sim_daemon_pins(const char *socket);

/* The expected bytes of one row. */
void sim_row_bytes(uint64_t h, uint32_t layer, uint32_t buf, uint32_t row, uint8_t *out,
                   size_t n);
/* Prefix hashes of pages 0..n_pages-1 of tokens. */
void sim_prefix_hashes(const sim_t *s, const uint32_t *tokens, uint32_t n_pages,
                       uint64_t *out);

/* Milliseconds sleep (for bounded polling). */
void sim_sleep_ms(int ms);

#endif
