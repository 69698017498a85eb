/*
 * Description: kvdockd SIGKILLed with loads in flight (AMAMA, page_size 64,
 * chunk 64). A 1000-token prompt is stored (15 KV pages and the state at
 * 15) and dropped from the device; two loads of prompts extending it are
 * committed into the tree as one batch, its layer-wise loading started, and
 * the daemon killed at once (in the device variant each device copy is
 * slowed by the fake, so the copies are still running):
 *
 *  - every kvd_wait_layer returns (in place or a negative status), none
 *    hangs;
 *  - each load comes back exactly once; one that succeeded left its pages
 *    and states byte-exact; the engine drops from its tree what a failed
 *    one was to fill;
 *  - once the loads are back and the engine freed their slots, nothing
 *    writes into them (free slots stay poisoned, pad bytes untouched, also
 *    a while later);
 *  - without a daemon a lookup finds nothing to load and does not hang;
 *    the engine recomputes the prompt byte-exact; the idle-pool invariant
 *    holds with no double free, and the linker closes.
 */
#include "dtest.h"
#include "gpu_test.h"
#include "sim.h"

#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N_TOKENS 1100

/* Pops completed loads until both came back (bounded by the linker's
 * timeout and more); each must come back once. */
static void collect(sim_t *s, sim_req_t **reqs, bool *ok)
{
    int seen = 0;
    for (int i = 0; i < 2000 && seen < 2; i++) {
        kvd_completion_t c[8];
        size_t n = 0;
        DT_CHECK(kvd_pop_completed_loads(s->linker, c, 8, &n) == 0, "pop loads");
        for (size_t k = 0; k < n; k++) {
            int j = reqs[0]->rid == c[k].id ? 0 : reqs[1]->rid == c[k].id ? 1 : -1;
            if (!DT_CHECK(j >= 0 && reqs[j]->state == SIM_REQ_COMMITTED,
                          "load rid %" PRIu64 " unknown or back twice", c[k].id))
                continue;
            reqs[j]->state = SIM_REQ_DONE;
            ok[j] = c[k].success;
            seen++;
            printf("load rid %" PRIu64 " after the daemon's death: %s\n", c[k].id,
                   c[k].success ? "in place" : "failed");
        }
        if (n == 0)
            sim_sleep_ms(10);
    }
    DT_CHECK(seen == 2, "%d of 2 loads came back after the daemon died", seen);
}

int main(void)
{
    const sim_config_t cfg = {.model_id = "sim-death",
                              .layers = "AMAMA",
                              .page_size = 64,
                              .mamba_chunk = 64,
                              .kv_pages = 96,
                              .mamba_slots = 8,
                              /* rows without pad: each page's rows are one
                               * device copy per buffer, so that the fake's
                               * slow copies (the device variant) keep the
                               * offload short and the load in flight */
                              .pad = 0};
    sim_fixture_t f;
    if (sim_fixture_start(&f, "sim/daemon_death", &cfg, 71, N_TOKENS) == 0) {
        sim_t *s = &f.s;
        const uint32_t *t = f.tokens;
        sim_prefill(s, t, 1000);
        sim_offload_tree(s, (1u << SIM_KV) | (1u << SIM_MAMBA), NULL);
        sim_drop_device(s);

        /* two prompts on the stored prefix: the first adopts pages 0..14
         * and the state; the second (a longer prompt, the same boundary)
         * finds them in the tree and adopts nothing (its slots come back
         * through free_indices at commit) */
        sim_req_t *a = calloc(1, sizeof(*a)), *b = calloc(1, sizeof(*b));
        sim_req_init(s, a, t, N_TOKENS);
        sim_req_init(s, b, t, N_TOKENS);
        bool ready =
            DT_CHECK(sim_req_lookup(s, a) == 0 && sim_req_lookup(s, b) == 0, "lookups") &&
            DT_CHECK(a->b == 15 && b->b == 15, "boundaries %u, %u", a->b, b->b) &&
            DT_CHECK(sim_req_load(s, a) == 0 && sim_req_load(s, b) == 0,
                     "kvd_load: %d, %d", a->load_rc, b->load_rc) &&
            DT_CHECK(sim_req_prepare(s, a) == 0 && sim_req_prepare(s, b) == 0,
                     "kvd_load_prepare") &&
            DT_CHECK(sim_req_insert(s, a) == 0 && sim_req_commit(s, a) == 0 &&
                         sim_req_insert(s, b) == 0 && sim_req_commit(s, b) == 0,
                     "inserts and commits");
        uint32_t counter = 0;
        if (ready)
            ready = DT_CHECK(kvd_start_layer_wise_loading(s->linker, &counter) == 0,
                             "kvd_start_layer_wise_loading");
        /* the daemon dies under the batch's copies */
        fakegpu_stats_t f0 = {0}, f1 = {0};
        bool fake = sim_on_device() && gt_fake_stats(&f0);
        kill(f.d.pid, SIGKILL);
        int st = 0;
        kvd_test_daemon_stop(&f.d, SIGKILL, 10000, &st);
        f.daemon_up = false;
        if (ready) {
            for (uint32_t l = 0; l < s->n_layers; l++) {
                int rc = kvd_wait_layer(s->linker, counter, l);
                DT_CHECK(rc <= 0, "kvd_wait_layer(layer %u) after the death: %d", l, rc);
            }
            sim_req_t *reqs[2] = {a, b};
            bool ok[2] = {false, false};
            collect(s, reqs, ok);
            /* what the fake's copies had moved when the daemon died and
             * when the loads were back (said, not asserted: timing) */
            if (fake && gt_fake_stats(&f1))
                printf("device bytes loaded: %" PRIu64 " when the daemon died, %" PRIu64
                       " when the loads were back\n",
                       f0.bytes_h2d, f1.bytes_h2d);
            if (ok[0])
                sim_verify_tree(s, "a load in place although the daemon died");
            /* the engine drops what it loaded (had it failed, it must) */
            sim_drop_device(s);
            sim_check_poison(s, "right after the loads came back");
            sim_sleep_ms(300);
            sim_check_poison(s, "a while after the loads came back");
        }
        sim_check_invariants(s, true, "after the daemon died");

        /* no daemon: the next calls fail cleanly, without hanging */
        sim_req_t *c = calloc(1, sizeof(*c));
        sim_req_init(s, c, t, N_TOKENS);
        DT_CHECK(sim_req_lookup(s, c) < 0 || c->b == c->cached,
                 "a lookup without a daemon found boundary %u", c->b);
        sim_req_fini(c);
        free(c);
        /* the engine recomputes on its own */
        sim_prefill(s, t, 1000);
        sim_verify_tree(s, "recomputed without a daemon");
        sim_drop_device(s);
        sim_check_poison(s, "at the end");
        sim_check_invariants(s, true, "at the end");
        sim_req_fini(a);
        sim_req_fini(b);
        free(a);
        free(b);
    }
    return sim_fixture_end(&f);
}
