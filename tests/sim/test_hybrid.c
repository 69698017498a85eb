/*
 * Description: a hybrid model (attention layers 0, 2, 4; mamba layers 1, 3;
 * page_size 64) through the whole engine flow against a real kvdockd:
 * prefill a 1000-token prompt, offload every node (KV pages and the state
 * at each node end), drop it from the device, then load back a 1100-token
 * prompt that extends it. Run twice: mamba chunk 64 (grid 64: the state
 * sits at page 15, 960 tokens) and chunk 128 (grid 128: at page 14, 896
 * tokens, page 14 stored as KV only), the second with layer groups of 2.
 *
 * Checks: the store recorded each page at its depth with the previous page
 * as parent (across the node split of the second run) and the state under
 * the key of the page ending its node; the lookup's boundaries are exactly the state's
 * page; the load restores exactly those tokens, byte-exact in every K, V, temporal and
 * conv row (into other device slots than the offload's), nothing written into free slots
 * or past a row's end; the load comes back once, with success; kvd_stats: offload and
 * load bytes are exactly the objects moved, and the mamba pool's load_bytes > 0 whenever
 * its lookup_hit_pages > 0; the idle-pool invariant holds and the daemon's pins drop to
 * 0.
 */
#include "dtest.h"
#include "sim.h"

#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PROMPT 1000
#define LONGER 1100

/* `kvdock show KEY --namespace NS`: the stored object's depth, size and
 * (when parent is not NULL) its parent key, as the offload recorded them. */
static void check_stored(const kvd_test_daemon_t *d, const sim_pool_t *p,
                         const uint8_t *key, uint32_t depth, const uint8_t *parent)
{
    char hex[2 * KVD_PAGE_KEY_BYTES + 1], phex[2 * KVD_PAGE_KEY_BYTES + 1],
        want[2 * KVD_PAGE_KEY_BYTES + 16], out[2048] = "";
    sim_key_hex(key, hex);
    const char *args[] = {"--socket",    d->socket,  "show",   hex,
                          "--namespace", p->ns_name, "--json", NULL};
    int rc = dt_cli(out, sizeof(out), args);
    uint64_t got_depth = UINT64_MAX, size = 0;
    if (!DT_CHECK(rc == 0 && dt_json_u64(out, NULL, "depth", &got_depth) &&
                      dt_json_u64(out, NULL, "size", &size),
                  "kvdock show %s --namespace %s: exit %d, %s", hex, p->ns_name, rc, out))
        return;
    DT_CHECK(got_depth == depth && size == p->object_bytes,
             "%s object at depth %" PRIu64 " (want %u), %" PRIu64 " bytes (want %" PRIu64
             ")",
             p->name, got_depth, depth, size, p->object_bytes);
    if (parent != NULL) {
        sim_key_hex(parent, phex);
        snprintf(want, sizeof(want), "\"parent\":\"%s\"", phex);
        DT_CHECK(strstr(out, want) != NULL && strstr(out, "\"parent_stored\":true"),
                 "%s object at depth %u: its parent is not the previous page: %s",
                 p->name, depth, out);
    }
}

static void run(const kvd_test_daemon_t *d, uint32_t chunk, int layer_group)
{
    char model[32];
    snprintf(model, sizeof(model), "sim-hybrid-c%u", chunk);
    sim_config_t cfg = {.model_id = model,
                        .layers = "AMAMA",
                        .page_size = 64,
                        .mamba_chunk = chunk,
                        .kv_pages = 96,
                        .mamba_slots = 16,
                        .pad = 32,
                        .layer_group_size = layer_group};
    sim_t s;
    if (sim_open(&s, &cfg, d->socket) != 0) {
        sim_close(&s);
        return;
    }
    sim_pool_t *kv = &s.pools[SIM_KV], *mamba = &s.pools[SIM_MAMBA];
    DT_CHECK(s.grid == (chunk == 64 ? 64u : 128u), "grid %u for chunk %u", s.grid, chunk);
    const uint32_t state_page = PROMPT / s.grid * s.grid / 64; /* 15 or 14 */

    uint32_t *tokens = malloc(LONGER * sizeof(uint32_t));
    sim_tokens(chunk, tokens, LONGER);

    /* prefill and offload */
    int pages = sim_prefill(&s, tokens, PROMPT);
    DT_CHECK(pages == PROMPT / 64, "prefill: the tree holds %d pages, want %d", pages,
             PROMPT / 64);
    DT_CHECK(sim_tree_units(&s, SIM_MAMBA) == 1, "prefill: %u states in the tree, want 1",
             sim_tree_units(&s, SIM_MAMBA));
    sim_verify_tree(&s, "after prefill");
    sim_check_invariants(&s, true, "after prefill");
    uint64_t units[SIM_N_KINDS] = {0};
    sim_offload_tree(&s, (1u << SIM_KV) | (1u << SIM_MAMBA), units);
    DT_CHECK(units[SIM_KV] == PROMPT / 64 && units[SIM_MAMBA] == 1,
             "offloaded %" PRIu64 " kv pages and %" PRIu64 " states", units[SIM_KV],
             units[SIM_MAMBA]);
    kvd_pool_stats_t kst = sim_stats(&s, SIM_KV), mst = sim_stats(&s, SIM_MAMBA);
    DT_CHECK(kst.offload_bytes == units[SIM_KV] * kv->object_bytes,
             "kv offload_bytes %" PRIu64 ", want %" PRIu64, kst.offload_bytes,
             units[SIM_KV] * kv->object_bytes);
    DT_CHECK(mst.offload_bytes == mamba->object_bytes,
             "mamba offload_bytes %" PRIu64 ", want %" PRIu64, mst.offload_bytes,
             mamba->object_bytes);
    DT_CHECK(kst.offload_failures == 0 && mst.offload_failures == 0, "offload failures");
    /* the chain as the store recorded it: depth = page index, parent = the
     * previous page (across nodes too); the state at the page ending it */
    uint8_t keys[PROMPT / 64][KVD_PAGE_KEY_BYTES];
    size_t nk = 0;
    if (DT_CHECK(kvd_page_keys(tokens, PROMPT / 64 * 64, 64, NULL, keys, &nk) == 0 &&
                     nk == PROMPT / 64,
                 "kvd_page_keys")) {
        check_stored(d, kv, keys[0], 0, NULL);
        for (uint32_t q = 1; q < PROMPT / 64; q++)
            check_stored(d, kv, keys[q], q, keys[q - 1]);
        check_stored(d, mamba, keys[state_page - 1], state_page - 1, NULL);
    }

    /* drop from device; shift the allocators so the load lands elsewhere */
    sim_drop_device(&s);
    DT_CHECK(sim_tree_units(&s, SIM_KV) == 0, "drop: the tree still holds pages");
    sim_check_invariants(&s, true, "after drop");
    int64_t hold_kv[3], hold_m = sim_alloc_unit(mamba);
    for (int i = 0; i < 3; i++)
        hold_kv[i] = sim_alloc_unit(kv);

    /* load back a prompt that extends it */
    sim_req_t *r = calloc(1, sizeof(*r));
    sim_req_init(&s, r, tokens, LONGER);
    int restored = sim_load_req(&s, r);
    DT_CHECK(r->cached == 0, "the device had %u pages cached after the drop", r->cached);
    DT_CHECK(r->n_boundaries == 1 && r->boundaries[0] == state_page,
             "lookup: %zu boundaries (first %u), want exactly {%u}", r->n_boundaries,
             r->n_boundaries ? r->boundaries[0] : 0, state_page);
    DT_CHECK(restored == (int)(state_page * 64), "restored %d tokens, want %u", restored,
             state_page * 64);
    DT_CHECK(r->state == SIM_REQ_DONE, "the load did not come back (state %d)", r->state);
    sim_req_fini(r);
    free(r);
    DT_CHECK(sim_tree_units(&s, SIM_KV) == state_page &&
                 sim_tree_units(&s, SIM_MAMBA) == 1,
             "after load: the tree holds %u pages and %u states",
             sim_tree_units(&s, SIM_KV), sim_tree_units(&s, SIM_MAMBA));
    sim_verify_tree(&s, "after load");
    sim_check_poison(&s, "after load");
    DT_CHECK(sim_drain_loads(&s, 50) == 0, "a load came back twice");

    kst = sim_stats(&s, SIM_KV);
    mst = sim_stats(&s, SIM_MAMBA);
    DT_CHECK(kst.load_bytes == state_page * kv->object_bytes,
             "kv load_bytes %" PRIu64 ", want %" PRIu64, kst.load_bytes,
             state_page * kv->object_bytes);
    DT_CHECK(mst.lookup_hit_pages > 0, "mamba lookup_hit_pages 0 after a mamba hit");
    DT_CHECK(mst.lookup_hit_pages == 0 || mst.load_bytes > 0,
             "mamba: %" PRIu64 " lookup hit pages but load_bytes 0",
             mst.lookup_hit_pages);
    DT_CHECK(mst.load_bytes == mamba->object_bytes,
             "mamba load_bytes %" PRIu64 ", want %" PRIu64, mst.load_bytes,
             mamba->object_bytes);
    DT_CHECK(kst.load_failures == 0 && mst.load_failures == 0, "load failures counted");

    for (int i = 0; i < 3; i++)
        sim_free_unit(kv, hold_kv[i]);
    sim_free_unit(mamba, hold_m);
    sim_check_invariants(&s, true, "after load");
    DT_CHECK(sim_wait_pins_zero(d->socket, 5000) == 0, "the daemon still holds pins");
    sim_drop_device(&s);
    sim_check_invariants(&s, true, "at the end");
    free(tokens);
    sim_close(&s);
}

int main(void)
{
    int mem = sim_memory_open();
    if (mem != 0)
        return mem; /* 77: the device pools have no device here (said why) */
    kvd_test_daemon_t d = {0};
    if (dt_start(&d, NULL) == 0) {
        run(&d, 64, 1);
        run(&d, 128, 2);
    }
    dt_stop(&d, SIGTERM, 10000);
    return dt_exit_status("sim/hybrid");
}
