/*
 * Description: ABORT, for a load that never reached the insert (AMAMA,
 * page_size 64; a stored 1000-token prompt: 15 KV pages and one state).
 *
 *  - kvd_load pins exactly the 16 objects of the boundary (daemon Stats:
 *    objects_pinned 16); kvd_load_abort hands every device index back
 *    through free_indices (15 pages, 1 slot: the idle-pool invariant holds
 *    with nothing in use) and the pins drop to 0;
 *  - the same after kvd_load_prepare;
 *  - a second abort of the same rid, an abort of an unknown rid and a
 *    commit after the abort fail (negative) and free nothing;
 *  - an abort after COMMIT fails and frees nothing; that load still comes
 *    back once with success, byte-exact;
 *  - no aborted rid ever comes back from kvd_pop_completed_loads; an empty
 *    batch's waits return 0; nothing is written into the aborted slots;
 *  - a fresh load of the same prompt after all that restores it byte-exact.
 */
#include "dtest.h"
#include "sim.h"

#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N_TOKENS 1100

static uint64_t freed_total(sim_t *s)
{
    uint64_t n = 0;
    for (int k = 0; k < SIM_N_KINDS; k++)
        if (s->pools[k].present) {
            pthread_mutex_lock(&s->pools[k].lock);
            n += s->pools[k].linker_freed;
            pthread_mutex_unlock(&s->pools[k].lock);
        }
    return n;
}

static void check_pinned(const kvd_test_daemon_t *d, uint64_t want, const char *where)
{
    kvd_stats_rep_t *st = malloc(sizeof(*st));
    if (DT_CHECK(dt_stats_fresh(d->socket, st) == KVD_OK, "%s: Stats", where))
        DT_CHECK(st->store.objects_pinned == want,
                 "%s: the daemon has %" PRIu64 " objects pinned, want %" PRIu64, where,
                 st->store.objects_pinned, want);
    free(st);
}

/* lookup + load (+ prepare) + abort, with every check */
static void load_then_abort(sim_t *s, const kvd_test_daemon_t *d, const uint32_t *t,
                            bool prepare, uint64_t *rid_out)
{
    const char *where = prepare ? "load, prepare, abort" : "load, abort";
    sim_req_t *r = calloc(1, sizeof(*r));
    sim_req_init(s, r, t, N_TOKENS);
    *rid_out = r->rid;
    if (DT_CHECK(sim_req_lookup(s, r) == 0 && r->b == 15, "%s: lookup (b %u)", where,
                 r->b) &&
        DT_CHECK(sim_req_load(s, r) == 0, "%s: kvd_load %d", where, r->load_rc)) {
        check_pinned(d, 16, where);
        if (prepare)
            DT_CHECK(sim_req_prepare(s, r) == 0, "%s: prepare", where);
        int rc = sim_req_abort(s, r); /* checks 15 pages + 1 slot came back */
        DT_CHECK(rc == 0, "%s: kvd_load_abort: %d (%s)", where, rc, kvd_strerror(rc));
        sim_check_invariants(s, true, where);
        DT_CHECK(sim_wait_pins_zero(d->socket, 5000) == 0, "%s: pins stay after abort",
                 where);
        /* twice, and commit after abort: refused, nothing freed */
        uint64_t before = freed_total(s);
        rc = kvd_load_abort(s->linker, r->rid);
        DT_CHECK(rc < 0, "%s: a second abort returned %d", where, rc);
        kvd_commit_pool_t c[3] = {{0}};
        c[0].adopted_end = 15;
        rc = kvd_load_commit(s->linker, r->rid, c, r->n_tr);
        DT_CHECK(rc < 0, "%s: commit after abort returned %d", where, rc);
        DT_CHECK(freed_total(s) == before, "%s: a refused call freed indices", where);
        sim_check_invariants(s, true, where);
    }
    sim_req_fini(r);
    free(r);
}

int main(void)
{
    const sim_config_t cfg = {.model_id = "sim-abort",
                              .layers = "AMAMA",
                              .page_size = 64,
                              .mamba_chunk = 64,
                              .kv_pages = 64,
                              .mamba_slots = 8,
                              .pad = 16};
    sim_fixture_t f;
    if (sim_fixture_start(&f, "sim/abort", &cfg, 31, N_TOKENS) == 0) {
        sim_t *s = &f.s;
        const kvd_test_daemon_t *d = &f.d;
        const uint32_t *t = f.tokens;
        sim_prefill(s, t, 1000);
        sim_offload_tree(s, (1u << SIM_KV) | (1u << SIM_MAMBA), NULL);
        sim_drop_device(s);

        uint64_t aborted[2];
        load_then_abort(s, d, t, false, &aborted[0]);
        load_then_abort(s, d, t, true, &aborted[1]);

        uint64_t before = freed_total(s);
        DT_CHECK(kvd_load_abort(s->linker, 987654321) < 0, "abort of an unknown rid");
        DT_CHECK(freed_total(s) == before, "abort of an unknown rid freed indices");

        /* an empty batch */
        sim_run_batch(s, NULL, 0);

        /* abort after commit: refused; the load completes */
        sim_req_t *r = calloc(1, sizeof(*r));
        sim_req_init(s, r, t, N_TOKENS);
        if (DT_CHECK(sim_req_lookup(s, r) == 0 && r->b == 15, "commit: lookup") &&
            DT_CHECK(sim_req_load(s, r) == 0, "commit: kvd_load %d", r->load_rc)) {
            sim_req_prepare(s, r);
            sim_req_insert(s, r);
            sim_req_commit(s, r);
            before = freed_total(s);
            int rc = kvd_load_abort(s->linker, r->rid);
            DT_CHECK(rc < 0, "abort after commit returned %d", rc);
            DT_CHECK(freed_total(s) == before, "abort after commit freed indices");
            sim_req_t *batch[1] = {r};
            sim_run_batch(s, batch, 1);
            DT_CHECK(r->state == SIM_REQ_DONE, "the committed load did not come back");
            sim_verify_tree(s, "after abort-after-commit");
            sim_check_invariants(s, true, "after abort-after-commit");
        }
        sim_req_fini(r);
        free(r);

        DT_CHECK(sim_drain_loads(s, 50) == 0, "an aborted load came back");
        sim_check_poison(s, "after the aborts");
        sim_drop_device(s);

        /* the store is intact: a fresh load restores it */
        int restored = sim_load(s, t, N_TOKENS);
        DT_CHECK(restored == 960, "fresh load after aborts restored %d tokens, want 960",
                 restored);
        sim_verify_tree(s, "fresh load after aborts");
        sim_check_poison(s, "fresh load after aborts");
        sim_check_invariants(s, true, "fresh load after aborts");
        DT_CHECK(sim_wait_pins_zero(d->socket, 5000) == 0, "pins stay at the end");
        (void)aborted;
    }
    return sim_fixture_end(&f);
}
