/*
 * Description: a sliding-window pool (layers "ASAS": 0 and 2 full attention,
 * 1 and 3 sliding window of 2 pages; page_size 64) with TRAILING_PAGES(2).
 * A 640-token prompt is stored (10 KV and 10 SWA pages), then the SWA
 * objects of pages 0..5 are evicted (`kvdock evict --key`):
 *
 *  - a 700-token prompt's lookup returns exactly the boundaries {8, 9, 10}:
 *    a boundary needs every KV page before it but only the 2 SWA pages
 *    before it; the load of boundary 10 restores KV pages 0..9 and SWA
 *    pages 8, 9 only, byte-exact, the tree keeps no window slot for 0..7;
 *  - after evicting SWA page 8 too, exactly {8}; the load restores 512
 *    tokens with SWA pages 6, 7;
 *  - load bytes per pool are exactly the objects copied; the idle-pool
 *    invariant holds; pins drop to 0.
 */
#include "dtest.h"
#include "sim.h"

#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N_TOKENS 700

static void evict_key(const sim_t *s, const kvd_test_daemon_t *d, const uint8_t *key)
{
    char hex[2 * KVD_PAGE_KEY_BYTES + 1];
    sim_key_hex(key, hex);
    uint64_t evicted =
        sim_evict(d->socket, (const char *[]){"--key", hex, "--namespace",
                                              s->pools[SIM_SWA].ns_name, NULL});
    DT_CHECK(evicted == 1, "kvdock evict --key %s --namespace %s evicted %" PRIu64, hex,
             s->pools[SIM_SWA].ns_name, evicted);
}

static void check_load(sim_t *s, const kvd_test_daemon_t *d, const uint32_t *t,
                       const uint32_t *want_b, size_t n_want, const char *where)
{
    sim_req_t *r = calloc(1, sizeof(*r));
    sim_req_init(s, r, t, N_TOKENS);
    int restored = sim_load_req(s, r);
    bool exact = r->n_boundaries == n_want;
    for (size_t i = 0; exact && i < n_want; i++)
        exact = r->boundaries[i] == want_b[i];
    DT_CHECK(exact, "%s: %zu boundaries (first %u, last %u), want %zu from %u to %u",
             where, r->n_boundaries, r->n_boundaries ? r->boundaries[0] : 0,
             r->n_boundaries ? r->boundaries[r->n_boundaries - 1] : 0, n_want, want_b[0],
             want_b[n_want - 1]);
    uint32_t b = want_b[n_want - 1];
    DT_CHECK(restored == (int)(b * 64), "%s: restored %d tokens, want %u", where,
             restored, b * 64);
    DT_CHECK(sim_tree_units(s, SIM_KV) == b && sim_tree_units(s, SIM_SWA) == 2,
             "%s: the tree holds %u kv and %u swa pages, want %u and 2", where,
             sim_tree_units(s, SIM_KV), sim_tree_units(s, SIM_SWA), b);
    /* the window's pages are usable on the device: the prefix counts as cached */
    DT_CHECK(sim_tree_cached(s, t, (N_TOKENS - 1) / 64) == b,
             "%s: the device prefix after the load is %u pages, want %u", where,
             sim_tree_cached(s, t, (N_TOKENS - 1) / 64), b);
    sim_verify_tree(s, where);
    sim_check_poison(s, where);
    sim_check_invariants(s, true, where);
    DT_CHECK(sim_wait_pins_zero(d->socket, 5000) == 0, "%s: pins stay", where);
    sim_req_fini(r);
    free(r);
    sim_drop_device(s);
}

int main(void)
{
    const sim_config_t cfg = {.model_id = "sim-swa",
                              .layers = "ASAS",
                              .page_size = 64,
                              .swa_window = 2,
                              .kv_pages = 48,
                              .pad = 8};
    sim_fixture_t f;
    if (sim_fixture_start(&f, "sim/swa", &cfg, 61, N_TOKENS) == 0) {
        sim_t *s = &f.s;
        const kvd_test_daemon_t *d = &f.d;
        const uint32_t *t = f.tokens;
        sim_pool_t *kv = &s->pools[SIM_KV], *swa = &s->pools[SIM_SWA];
        DT_CHECK(sim_prefill(s, t, 640) == 10, "prefill: not 10 pages");
        uint64_t units[SIM_N_KINDS] = {0};
        sim_offload_tree(s, (1u << SIM_KV) | (1u << SIM_SWA), units);
        DT_CHECK(units[SIM_KV] == 10 && units[SIM_SWA] == 10,
                 "offloaded %" PRIu64 " kv and %" PRIu64 " swa pages", units[SIM_KV],
                 units[SIM_SWA]);
        sim_drop_device(s);

        uint8_t keys[10][KVD_PAGE_KEY_BYTES];
        size_t nk = 0;
        DT_CHECK(kvd_page_keys(t, 640, 64, NULL, keys, &nk) == 0 && nk == 10,
                 "page keys");
        for (int q = 0; q < 6; q++)
            evict_key(s, d, keys[q]);

        static const uint32_t first[] = {8, 9, 10}, second[] = {8};
        check_load(s, d, t, first, 3, "SWA pages 0..5 evicted");
        evict_key(s, d, keys[8]);
        check_load(s, d, t, second, 1, "SWA pages 0..5 and 8 evicted");

        kvd_pool_stats_t kst = sim_stats(s, SIM_KV), sst = sim_stats(s, SIM_SWA);
        DT_CHECK(kst.load_bytes == 18 * kv->object_bytes,
                 "kv load_bytes %" PRIu64 ", want 18 pages (10 + 8)", kst.load_bytes);
        DT_CHECK(sst.load_bytes == 4 * swa->object_bytes,
                 "swa load_bytes %" PRIu64 ", want 4 pages (2 + 2)", sst.load_bytes);
        DT_CHECK(sst.lookup_hit_pages > 0, "swa lookup_hit_pages 0");
        sim_check_invariants(s, true, "at the end");
    }
    return sim_fixture_end(&f);
}
