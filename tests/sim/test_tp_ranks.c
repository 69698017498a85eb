/*
 * Description: an MLA model under tensor parallelism: two TP ranks as two
 * processes (on one GPU in the device variant), each with its own linker
 * and pools, against one kvdockd. Layers "AMAMA", page_size 64, chunk 64:
 * the attention pool is rank-replicated (MLA: the same latent rows on every
 * rank), the mamba pool is per rank (its state carries the rank in its
 * bytes). Both ranks prefill the same 1000-token prompt and offload their
 * trees at once:
 *
 *  - the replicated pool's namespace has no tp suffix and is the same on
 *    both ranks; the state pools' are per rank;
 *  - the store holds each KV page once, in the replicated namespace, and
 *    one state per rank, each in its rank's namespace (`kvdock show`);
 *  - after both offloads, each rank drops its device tree and loads back a
 *    1100-token prompt that extends it: 960 tokens restored, byte-exact in
 *    every K, V, temporal and conv row, the state its own rank's (not the
 *    other's), nothing written into free slots or past a row's end; the
 *    idle-pool invariant holds and the daemon's pins drop to 0.
 *
 * The parent owns the daemon and the barrier (a pipe per rank); it never
 * opens a GPU runtime, which a forked child could not use.
 */
#include "dtest.h"
#include "sim.h"

#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define RANKS    2
#define PROMPT   1000
#define LONGER   1100
#define PAGES    (PROMPT / 64) /* 15: the state sits at page 15 */
#define MODEL    "sim-mla-tp"
#define RANK_OFF 'o' /* a rank's word to the parent: offloaded */
#define RANK_GO  'g' /* the parent's: every rank offloaded, the store checked */

static const sim_config_t base_cfg = {.model_id = MODEL,
                                      .layers = "AMAMA",
                                      .page_size = 64,
                                      .mamba_chunk = 64,
                                      .kv_pages = 64,
                                      .mamba_slots = 8,
                                      .pad = 16,
                                      .tp_size = RANKS,
                                      .kv_rank_replicated = true};

/* `kvdock show KEY --namespace NS` finds the object: true when it does. */
static bool stored(const char *socket, const char *ns, const uint8_t *key)
{
    char hex[2 * KVD_PAGE_KEY_BYTES + 1], out[2048] = "";
    sim_key_hex(key, hex);
    const char *args[] = {"--socket",    socket, "show",   hex,
                          "--namespace", ns,     "--json", NULL};
    return dt_cli(out, sizeof(out), args) == 0 && strstr(out, "\"depth\"") != NULL;
}

/* One rank's life: prefill, offload, tell the parent, wait, load back.
 * Returns the process's exit status (77: no device here). */
static int rank_main(const char *socket, uint32_t rank, int to_parent, int from_parent)
{
    int mem = sim_memory_open(); /* this process's own runtime, after the fork */
    if (mem != 0)
        return mem;
    char name[32];
    snprintf(name, sizeof(name), "sim/tp_ranks rank %u", rank);
    sim_config_t cfg = base_cfg;
    cfg.tp_rank = rank;
    sim_t s;
    uint32_t *t = malloc(LONGER * sizeof(uint32_t));
    sim_tokens(91, t, LONGER); /* the same prompt on every rank */
    if (sim_open(&s, &cfg, socket) == 0) {
        char want[64];
        DT_CHECK(strcmp(s.pools[SIM_KV].ns_name, MODEL "/kv/rep") == 0,
                 "rank %u: the replicated pool's namespace is %s", rank,
                 s.pools[SIM_KV].ns_name);
        snprintf(want, sizeof(want), MODEL "/mamba/tp%u", rank);
        DT_CHECK(strcmp(s.pools[SIM_MAMBA].ns_name, want) == 0,
                 "rank %u: the state pool's namespace is %s, want %s", rank,
                 s.pools[SIM_MAMBA].ns_name, want);
        DT_CHECK(sim_prefill(&s, t, PROMPT) == PAGES, "rank %u: prefill", rank);
        uint64_t units[SIM_N_KINDS] = {0};
        /* checks every ack succeeds: the other rank's writes of the same
         * pages are EXISTS or IN_FLIGHT, which count as success */
        sim_offload_tree(&s, (1u << SIM_KV) | (1u << SIM_MAMBA), units);
        DT_CHECK(units[SIM_KV] == PAGES && units[SIM_MAMBA] == 1,
                 "rank %u: offloaded %" PRIu64 " pages and %" PRIu64 " states", rank,
                 units[SIM_KV], units[SIM_MAMBA]);
    }
    char word = RANK_OFF;
    DT_CHECK(write(to_parent, &word, 1) == 1, "rank %u: cannot reach the parent", rank);
    bool go = read(from_parent, &word, 1) == 1 && word == RANK_GO;
    DT_CHECK(go, "rank %u: the parent did not say go", rank);
    if (go && s.linker != NULL) {
        sim_drop_device(&s);
        /* shift the allocators so that the load lands in other slots */
        int64_t hold_kv = sim_alloc_unit(&s.pools[SIM_KV]),
                hold_m = sim_alloc_unit(&s.pools[SIM_MAMBA]);
        int restored = sim_load(&s, t, LONGER);
        DT_CHECK(restored == PAGES * 64, "rank %u: restored %d tokens, want %d", rank,
                 restored, PAGES * 64);
        sim_verify_tree(&s, "after the load"); /* the state with this rank's bytes */
        sim_check_poison(&s, "after the load");
        DT_CHECK(sim_drain_loads(&s, 30) == 0, "rank %u: a load came back twice", rank);
        sim_free_unit(&s.pools[SIM_KV], hold_kv);
        sim_free_unit(&s.pools[SIM_MAMBA], hold_m);
        sim_check_invariants(&s, true, "after the load");
        sim_drop_device(&s);
    }
    sim_close(&s);
    free(t);
    return dt_exit_status(name);
}

/* The store's view once both ranks offloaded: each page once in the shared
 * namespace, one state per rank in its own. */
static void check_store(const kvd_test_daemon_t *d)
{
    uint32_t *t = malloc(PROMPT * sizeof(uint32_t));
    sim_tokens(91, t, PROMPT);
    uint8_t keys[PAGES][KVD_PAGE_KEY_BYTES];
    size_t nk = 0;
    if (DT_CHECK(kvd_page_keys(t, PAGES * 64, 64, NULL, keys, &nk) == 0 && nk == PAGES,
                 "page keys")) {
        for (uint32_t q = 0; q < PAGES; q++)
            DT_CHECK(stored(d->socket, MODEL "/kv/rep", keys[q]),
                     "page %u is not in the replicated namespace", q);
        for (uint32_t r = 0; r < RANKS; r++) {
            char ns[64];
            snprintf(ns, sizeof(ns), MODEL "/mamba/tp%u", r);
            DT_CHECK(stored(d->socket, ns, keys[PAGES - 1]),
                     "rank %u's state is not in %s", r, ns);
        }
    }
    free(t);
}

int main(void)
{
    kvd_test_daemon_t d = {0};
    if (dt_start(&d, NULL) != 0)
        return dt_exit_status("sim/tp_ranks");
    int up[RANKS][2], down[RANKS][2];
    pid_t pids[RANKS];
    for (uint32_t r = 0; r < RANKS; r++) {
        if (pipe(up[r]) != 0 || pipe(down[r]) != 0) {
            DT_CHECK(false, "pipe");
            return 1;
        }
        fflush(NULL);
        pids[r] = fork();
        if (pids[r] == 0) {
            close(up[r][0]);
            close(down[r][1]);
            exit(rank_main(d.socket, r, up[r][1], down[r][0]));
        }
        DT_CHECK(pids[r] > 0, "fork");
        close(up[r][1]);
        close(down[r][0]);
    }
    /* every rank offloaded (or exited: EOF) before the store is looked at */
    int offloaded = 0;
    for (uint32_t r = 0; r < RANKS; r++) {
        char word = 0;
        offloaded += read(up[r][0], &word, 1) == 1 && word == RANK_OFF;
    }
    if (offloaded == RANKS)
        check_store(&d);
    signal(SIGPIPE, SIG_IGN); /* a rank that exited early reads nothing */
    for (uint32_t r = 0; r < RANKS; r++) {
        char word = RANK_GO;
        if (offloaded == RANKS && write(down[r][1], &word, 1) != 1)
            DT_CHECK(false, "rank %u: cannot say go", r);
        close(down[r][1]);
        close(up[r][0]);
    }
    int skipped = 0;
    for (uint32_t r = 0; r < RANKS; r++) {
        int st = 0;
        bool exited =
            pids[r] > 0 && kvd_test_wait_pid(pids[r], 60000, &st) == 0 && WIFEXITED(st);
        skipped += exited && WEXITSTATUS(st) == 77;
        DT_CHECK(exited && (WEXITSTATUS(st) == 0 || WEXITSTATUS(st) == 77),
                 "rank %u failed (status 0x%x)", r, st);
    }
    if (offloaded == RANKS)
        DT_CHECK(sim_wait_pins_zero(d.socket, 5000) == 0, "the daemon still holds pins");
    dt_stop(&d, SIGTERM, 10000);
    if (skipped == RANKS && dt_failure_count() == 0)
        return 77; /* both ranks said why */
    DT_CHECK(skipped == 0, "%d of %d ranks skipped", skipped, RANKS);
    return dt_exit_status("sim/tp_ranks");
}
