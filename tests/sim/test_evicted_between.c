/*
 * Description: stored objects evicted between kvd_lookup and kvd_load
 * (AMAMA, page_size 64, chunk 64), evicted with the CLI (`kvdock evict`):
 *
 *  a. `evict --all` after the lookup: kvd_load fails cleanly (negative),
 *     pins nothing; the engine ABORTs and every device index comes back
 *     through free_indices; the load never shows up in the completed
 *     loads; the engine recomputes the prompt, byte-exact.
 *  b. only the state at the boundary evicted (`evict --key K --namespace
 *     <mamba ns>`): all or nothing, kvd_load fails and pins no KV page; ABORT
 *     returns everything.
 *  c. `evict --all` after kvd_load: the pinned objects stay (evicted 0); the
 *     load completes byte-exact; once it is done, the same evict removes
 *     them.
 *
 * The idle-pool invariant holds after each; the daemon's pins end at 0.
 */
#include "dtest.h"
#include "sim.h"

#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N_TOKENS 1300

/* lookup; evict_fn; kvd_load must fail; abort returns everything; the
 * engine recomputes */
static void load_fails(sim_t *s, const kvd_test_daemon_t *d, const uint32_t *t,
                       size_t len, uint32_t want_b, bool only_state, const char *where)
{
    sim_req_t *r = calloc(1, sizeof(*r));
    sim_req_init(s, r, t, len);
    if (!DT_CHECK(sim_req_lookup(s, r) == 0 && r->b == want_b,
                  "%s: lookup (b %u, want %u)", where, r->b, want_b))
        goto out;
    if (only_state) {
        char hex[2 * KVD_PAGE_KEY_BYTES + 1];
        sim_key_hex(r->keys[r->b - 1], hex);
        uint64_t n =
            sim_evict(d->socket, (const char *[]){"--key", hex, "--namespace",
                                                  s->pools[SIM_MAMBA].ns_name, NULL});
        DT_CHECK(n == 1, "%s: evicted %" PRIu64 " objects, want the state", where, n);
    } else {
        uint64_t n = sim_evict(d->socket, (const char *[]){"--all", NULL});
        DT_CHECK(n != UINT64_MAX && n >= want_b + 1, "%s: evict --all evicted %" PRIu64,
                 where, n);
    }
    int rc = sim_req_load(s, r);
    DT_CHECK(rc < 0, "%s: kvd_load returned %d after the eviction", where, rc);
    DT_CHECK(sim_daemon_pins(d->socket) == 0,
             "%s: a failed kvd_load left %" PRIu64 " pins", where,
             sim_daemon_pins(d->socket));
    rc = sim_req_abort(s, r); /* checks every index came back */
    if (!DT_CHECK(rc == 0, "%s: kvd_load_abort after a failed load: %d (%s)", where, rc,
                  kvd_strerror(rc)))
        sim_req_free_units(s, r); /* recorded; keep the later checks meaningful */
    sim_check_invariants(s, true, where);
    DT_CHECK(sim_drain_loads(s, 30) == 0, "%s: a failed load came back as completed",
             where);
    /* recompute */
    int pages = sim_prefill(s, t, len);
    DT_CHECK(pages == (int)(len / 64), "%s: recompute: %d pages", where, pages);
    sim_verify_tree(s, where);
    sim_check_poison(s, where);
    sim_check_invariants(s, true, where);
out:
    sim_req_fini(r);
    free(r);
}

static void evict_while_pinned(sim_t *s, const kvd_test_daemon_t *d, const uint32_t *t,
                               size_t len, uint32_t want_b)
{
    const char *where = "c (evict --all while loading)";
    sim_req_t *r = calloc(1, sizeof(*r));
    sim_req_init(s, r, t, len);
    if (DT_CHECK(sim_req_lookup(s, r) == 0 && r->b == want_b, "%s: lookup (b %u)", where,
                 r->b) &&
        DT_CHECK(sim_req_load(s, r) == 0, "%s: kvd_load %d", where, r->load_rc)) {
        uint64_t n = sim_evict(d->socket, (const char *[]){"--all", NULL});
        DT_CHECK(n == 0, "%s: evicted %" PRIu64 " objects pinned by a load", where, n);
        sim_req_prepare(s, r);
        sim_req_insert(s, r);
        sim_req_commit(s, r);
        sim_req_t *batch[1] = {r};
        sim_run_batch(s, batch, 1);
        DT_CHECK(r->state == SIM_REQ_DONE, "%s: the load did not come back", where);
        sim_verify_tree(s, where);
        sim_check_poison(s, where);
        sim_check_invariants(s, true, where);
        DT_CHECK(sim_wait_pins_zero(d->socket, 5000) == 0, "%s: pins stay", where);
        n = sim_evict(d->socket, (const char *[]){"--all", NULL});
        DT_CHECK(n == want_b + 1,
                 "%s: after the load, evict --all removed %" PRIu64 ", want %u", where, n,
                 want_b + 1);
    }
    sim_req_fini(r);
    free(r);
}

int main(void)
{
    const sim_config_t cfg = {.model_id = "sim-evicted",
                              .layers = "AMAMA",
                              .page_size = 64,
                              .mamba_chunk = 64,
                              .kv_pages = 96,
                              .mamba_slots = 8,
                              .pad = 16};
    sim_fixture_t f;
    if (sim_fixture_start(&f, "sim/evicted_between", &cfg, 81, N_TOKENS) == 0) {
        sim_t *s = &f.s;
        const kvd_test_daemon_t *d = &f.d;
        const uint32_t *t = f.tokens;
        /* a: 15 pages + the state at 15 stored, all evicted after lookup */
        sim_prefill(s, t, 1000);
        sim_offload_tree(s, (1u << SIM_KV) | (1u << SIM_MAMBA), NULL);
        sim_drop_device(s);
        load_fails(s, d, t, 1100, 15, false, "a (evict --all)");

        /* b: the recompute stored 17 pages + the state at 17; only the
         * state goes */
        sim_offload_tree(s, (1u << SIM_KV) | (1u << SIM_MAMBA), NULL);
        sim_drop_device(s);
        load_fails(s, d, t, 1200, 17, true, "b (the state evicted)");

        /* c: the recompute of 1200 tokens holds 18 pages and the state at
         * 18; stored again */
        sim_offload_tree(s, (1u << SIM_KV) | (1u << SIM_MAMBA), NULL);
        sim_drop_device(s);
        evict_while_pinned(s, d, t, 1200, 18);

        sim_drop_device(s);
        sim_check_invariants(s, true, "at the end");
        DT_CHECK(sim_wait_pins_zero(d->socket, 5000) == 0, "pins stay at the end");
    }
    return sim_fixture_end(&f);
}
