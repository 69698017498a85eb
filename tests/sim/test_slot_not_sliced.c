/*
 * Description: a slot-addressed component is never page-sliced at COMMIT
 * (AMAMA, page_size 64, chunk 64; states stored at pages 8 and 15). The
 * engine hands the mamba transfer's commit entry adopted_begin/end values
 * that would slice a paged transfer; the linker must copy the state whole:
 *
 *  i.  the device holds [0, 8) with its state; the load of [8, 15) adopts
 *      every page; the SLOT entry says adopted [1, 7) (a slice of a
 *      one-index transfer would leave nothing or read past it);
 *  ii. the device holds every KV page of [0, 15) but no state (the states
 *      were dropped): the load adopts no page, attaches its state
 *      (mamba_exist false); the SLOT entry says adopted [0, 0), what an
 *      "adopted range" test would read as "drop it" (the hybrid-mamba PR's
 *      pitfall: the node would hold a slot never written).
 *
 * Checks: the state is restored byte-exact in both; the mamba pool's
 * load_bytes grow by exactly one state each time; the KV pages not adopted
 * come back through free_indices; the idle-pool invariant holds.
 */
#include "dtest.h"
#include "sim.h"

#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N_TOKENS 1100

static void load_with_slot_entry(sim_t *s, const kvd_test_daemon_t *d, const uint32_t *t,
                                 uint32_t want_cached, uint32_t begin, uint32_t end,
                                 const char *where)
{
    sim_pool_t *mamba = &s->pools[SIM_MAMBA];
    uint64_t m0 = sim_stats(s, SIM_MAMBA).load_bytes;
    sim_req_t *r = calloc(1, sizeof(*r));
    sim_req_init(s, r, t, N_TOKENS);
    r->slot_override = true;
    r->slot_adopted_begin = begin;
    r->slot_adopted_end = end;
    int restored = sim_load_req(s, r);
    DT_CHECK(r->cached == want_cached, "%s: device cached %u pages, want %u", where,
             r->cached, want_cached);
    DT_CHECK(r->b == 15 && restored == (int)((15 - want_cached) * 64),
             "%s: boundary %u, restored %d tokens", where, r->b, restored);
    DT_CHECK(r->n_tr == 2 && r->tr_kind[1] == SIM_MAMBA &&
                 r->commit[1].adopted_begin == begin && r->commit[1].adopted_end == end &&
                 !r->commit[1].mamba_exist,
             "%s: the SLOT commit entry is not what the scenario wants", where);
    DT_CHECK(r->state == SIM_REQ_DONE, "%s: the load did not come back", where);
    DT_CHECK(sim_tree_units(s, SIM_MAMBA) >= 1, "%s: no state in the tree", where);
    sim_verify_tree(s, where); /* the state at 15 is the prefix's, not poison */
    sim_check_poison(s, where);
    sim_check_invariants(s, true, where);
    uint64_t grew = sim_stats(s, SIM_MAMBA).load_bytes - m0;
    DT_CHECK(grew == mamba->object_bytes,
             "%s: mamba load_bytes grew by %" PRIu64 ", want %" PRIu64 " (one state)",
             where, grew, mamba->object_bytes);
    DT_CHECK(sim_wait_pins_zero(d->socket, 5000) == 0, "%s: pins stay", where);
    sim_req_fini(r);
    free(r);
}

int main(void)
{
    const sim_config_t cfg = {.model_id = "sim-slot",
                              .layers = "AMAMA",
                              .page_size = 64,
                              .mamba_chunk = 64,
                              .kv_pages = 96,
                              .mamba_slots = 8,
                              .pad = 16};
    sim_fixture_t f;
    sim_t *s = &f.s;
    const kvd_test_daemon_t *d = &f.d;
    /* each case on its own linker (same model: the stored objects are
     * shared), so that a load one case leaves stuck cannot pin for the next */
    if (sim_fixture_start(&f, "sim/slot_not_sliced", &cfg, 41, N_TOKENS) == 0) {
        sim_prefill(s, f.tokens, 512);
        sim_prefill(s, f.tokens, 1000);
        sim_offload_tree(s, (1u << SIM_KV) | (1u << SIM_MAMBA), NULL);
        sim_drop_device(s);
    }
    const uint32_t *t = f.tokens;

    /* i: [0, 8) on the device with its state; [8, 15) loaded */
    if (sim_fixture_reopen(&f) == 0) {
        sim_prefill(s, t, 512);
        load_with_slot_entry(s, d, t, 8, 1, 7, "i (adopted 1..7 on the SLOT entry)");
        DT_CHECK(sim_tree_units(s, SIM_MAMBA) == 2, "i: %u states in the tree, want 2",
                 sim_tree_units(s, SIM_MAMBA));
        sim_drop_device(s);
    }

    /* ii: every KV page on the device, no state */
    if (sim_fixture_reopen(&f) == 0) {
        sim_prefill(s, t, 1000);
        sim_drop_mamba(s);
        uint64_t kv_freed = s->pools[SIM_KV].linker_freed;
        load_with_slot_entry(s, d, t, 0, 0, 0, "ii (no page adopted, state attached)");
        DT_CHECK(s->pools[SIM_KV].linker_freed - kv_freed == 15,
                 "ii: %" PRIu64 " kv pages came back, want 15 (none adopted)",
                 s->pools[SIM_KV].linker_freed - kv_freed);
        DT_CHECK(sim_tree_units(s, SIM_MAMBA) == 1, "ii: %u states in the tree, want 1",
                 sim_tree_units(s, SIM_MAMBA));
        sim_drop_device(s);
        sim_check_invariants(s, true, "at the end");
    }
    return sim_fixture_end(&f);
}
