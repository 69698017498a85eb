/*
 * Description: the reachable-prefix rule (DESIGN.md section 5) for a hybrid
 * model, page_size 64, mamba chunk 128 (grid 128). The engine probes
 * floor((L-1)/64) pages and can use only boundaries on the grid where a
 * state is stored.
 *
 *  A. One stored 512-token prompt (its only state at 512): replayed at
 *     exactly 512 tokens, the lookup returns no boundary although the KV
 *     pool alone has boundaries 1..7 (the mamba filter vetoes) and nothing
 *     is restored; with one more token it restores exactly 512.
 *  B. A 1024-token prompt stored with a state at every grid point (prefills
 *     of 128, 256, ..., 1024 tokens): for L in 100 .. 1200 the boundaries
 *     are exactly the even pages up to floor((L-1)/64) and the load
 *     restores exactly min(floor((L-1)/128)*128, 1024) tokens, byte-exact.
 *  C. Partial-prefix reuse: prompts sharing 600 (and 640) tokens with it
 *     then diverging restore the shared grid-aligned part, 512 (and 640);
 *     the engine then computes the rest, and the tree is byte-exact.
 */
#include "dtest.h"
#include "sim.h"

#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N_TOKENS 1300

static void part_a(sim_t *s)
{
    uint32_t *q = malloc(600 * sizeof(uint32_t));
    sim_tokens(51, q, 600);
    sim_prefill(s, q, 512);
    sim_offload_tree(s, (1u << SIM_KV) | (1u << SIM_MAMBA), NULL);
    sim_drop_device(s);

    sim_req_t *r = calloc(1, sizeof(*r));
    sim_req_init(s, r, q, 512);
    int restored = sim_load_req(s, r);
    DT_CHECK(r->n_probe == 7, "A: a 512-token prompt probes %u pages, want 7",
             r->n_probe);
    DT_CHECK(r->n_boundaries == 0,
             "A: replay at the cached length: %zu boundaries, want 0", r->n_boundaries);
    DT_CHECK(restored == 0, "A: replay at the cached length restored %d tokens",
             restored);
    DT_CHECK(sim_tree_units(s, SIM_KV) == 0, "A: the replay put pages on the device");

    /* the KV pool alone would restore 7 pages: the veto is the state's */
    kvd_transfer_t kv_only = {.pool_id = s->pools[SIM_KV].pool_id,
                              .keys = (const uint8_t(*)[KVD_PAGE_KEY_BYTES])r->keys,
                              .n_keys = 7};
    uint32_t bnd[8];
    size_t nb = 8;
    int rc = kvd_lookup(s->linker, r->rid, &kv_only, 1, bnd, &nb);
    DT_CHECK(rc == 0 && nb == 7 && bnd[0] == 1 && bnd[6] == 7,
             "A: kv-only lookup: rc %d, %zu boundaries, want 1..7", rc, nb);
    sim_req_fini(r);
    free(r);

    restored = sim_load(s, q, 513);
    DT_CHECK(restored == 512, "A: 513 tokens restored %d, want 512", restored);
    sim_verify_tree(s, "A: 513 tokens");
    sim_drop_device(s);
    free(q);
}

static void part_b(sim_t *s, const uint32_t *p)
{
    for (uint32_t n = 128; n <= 1024; n += 128)
        sim_prefill(s, p, n);
    DT_CHECK(sim_tree_units(s, SIM_MAMBA) == 8, "B: %u states, want 8",
             sim_tree_units(s, SIM_MAMBA));
    sim_verify_tree(s, "B: after the prefills");
    sim_offload_tree(s, (1u << SIM_KV) | (1u << SIM_MAMBA), NULL);
    sim_drop_device(s);

    static const uint32_t lens[] = {100, 128,  129,  200,  256, 257,
                                    640, 1000, 1024, 1025, 1200};
    for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
        uint32_t L = lens[i], probe = (L - 1) / 64, want = (L - 1) / 128 * 128;
        want = want > 1024 ? 1024 : want;
        char where[48];
        snprintf(where, sizeof(where), "B: L=%u", L);
        sim_req_t *r = calloc(1, sizeof(*r));
        sim_req_init(s, r, p, L);
        int restored = sim_load_req(s, r);
        uint32_t top = probe < 16 ? probe : 16, n_want = top / 2;
        bool exact = r->n_boundaries == n_want;
        for (size_t j = 0; exact && j < r->n_boundaries; j++)
            exact = r->boundaries[j] == 2 * (j + 1);
        DT_CHECK(exact, "%s: %zu boundaries (last %u), want the %u even pages up to %u",
                 where, r->n_boundaries,
                 r->n_boundaries ? r->boundaries[r->n_boundaries - 1] : 0, n_want, top);
        DT_CHECK(restored == (int)want, "%s: restored %d tokens, want %u", where,
                 restored, want);
        sim_req_fini(r);
        free(r);
        sim_verify_tree(s, where);
        sim_check_invariants(s, true, where);
        sim_drop_device(s);
    }
}

static void part_c(sim_t *s, const uint32_t *p, uint32_t shared, uint32_t want,
                   uint32_t seed)
{
    uint32_t *t = malloc(1000 * sizeof(uint32_t));
    memcpy(t, p, shared * sizeof(uint32_t));
    sim_tokens(seed, t + shared, 1000 - shared);
    char where[48];
    snprintf(where, sizeof(where), "C: %u shared tokens", shared);
    int restored = sim_load(s, t, 1000);
    DT_CHECK(restored == (int)want, "%s: restored %d, want %u", where, restored, want);
    sim_verify_tree(s, where);
    int pages = sim_prefill(s, t, 1000); /* the engine computes the rest */
    DT_CHECK(pages == 15, "%s: the tree holds %d pages of the prompt, want 15", where,
             pages);
    sim_verify_tree(s, where);
    sim_check_invariants(s, true, where);
    sim_drop_device(s);
    free(t);
}

int main(void)
{
    const sim_config_t cfg = {.model_id = "sim-reachable",
                              .layers = "AMAMA",
                              .page_size = 64,
                              .mamba_chunk = 128,
                              .kv_pages = 96,
                              .mamba_slots = 24,
                              .pad = 0};
    sim_fixture_t f;
    if (sim_fixture_start(&f, "sim/reachable", &cfg, 52, N_TOKENS) == 0) {
        sim_t *s = &f.s;
        const uint32_t *p = f.tokens;
        DT_CHECK(s->grid == 128, "grid %u, want 128", s->grid);
        part_a(s);
        part_b(s, p);
        part_c(s, p, 600, 512, 53);
        part_c(s, p, 640, 640, 54);
        sim_check_poison(s, "at the end");
        DT_CHECK(sim_wait_pins_zero(f.d.socket, 5000) == 0, "pins stay at the end");
    }
    return sim_fixture_end(&f);
}
