/*
 * Description: COMMIT when the engine's tree already holds a mamba state at
 * the loaded node (mamba_exist), and its neighbours (AMAMA, page_size 64,
 * chunk 64; states stored at pages 8 and 15):
 *
 *  a. two loads of the same prompt interleaved (lookup, lookup, load, load,
 *     prepare, prepare, insert+commit, insert+commit): the second insert
 *     adopts nothing and finds the state: its COMMIT frees its 15 KV pages
 *     through free_indices and not its mamba slot (the tree freed it: the
 *     mamba free count is unchanged by the commit), and nothing of it is
 *     copied (load_bytes count only the first load; free slots stay
 *     poisoned).
 *  b. a prefill of the same prompt lands between LOAD and the insert; the
 *     freed slots are handed at once to another prompt's prefill before the
 *     batch runs: a copy into them would overwrite that prompt's bytes.
 *  c. loads of boundary 8 and 15 interleaved, 8 inserted first: the second
 *     adopts pages [8, 15) only (sliced) and its state at 15.
 *  d. the same, 15 inserted first: the boundary-8 insert splits the node and
 *     adopts no page but attaches its state (mamba_exist false): the state
 *     must be copied although no page was adopted.
 *
 * Every case: both loads come back once with success, every tree page and
 * state is byte-exact (no tree slot holds unwritten state), the idle-pool
 * invariant holds with no double free, and the daemon's pins drop to 0.
 */
#include "dtest.h"
#include "sim.h"

#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N_TOKENS 1100

typedef struct pair {
    sim_req_t *a, *b;
} pair_t;

static void pair_new(sim_t *s, pair_t *p, const uint32_t *ta, size_t la,
                     const uint32_t *tb, size_t lb)
{
    p->a = calloc(1, sizeof(sim_req_t));
    p->b = calloc(1, sizeof(sim_req_t));
    sim_req_init(s, p->a, ta, la);
    sim_req_init(s, p->b, tb, lb);
}

static void pair_free(pair_t *p)
{
    sim_req_fini(p->a);
    sim_req_fini(p->b);
    free(p->a);
    free(p->b);
}

/* lookup, lookup, load, load, prepare, prepare; false when one failed */
static bool both_loaded(sim_t *s, pair_t *p)
{
    bool ok = DT_CHECK(sim_req_lookup(s, p->a) == 0 && sim_req_lookup(s, p->b) == 0,
                       "lookup failed");
    ok = ok && DT_CHECK(p->a->b > p->a->cached && p->b->b > p->b->cached,
                        "nothing to load: boundaries %u, %u", p->a->b, p->b->b);
    ok = ok && DT_CHECK(sim_req_load(s, p->a) == 0 && sim_req_load(s, p->b) == 0,
                        "kvd_load failed: %d, %d", p->a->load_rc, p->b->load_rc);
    ok = ok && DT_CHECK(sim_req_prepare(s, p->a) == 0 && sim_req_prepare(s, p->b) == 0,
                        "kvd_load_prepare failed");
    return ok;
}

static void finish(sim_t *s, const kvd_test_daemon_t *d, pair_t *p, const char *where)
{
    sim_req_t *batch[2] = {p->a, p->b};
    sim_run_batch(s, batch, 2);
    DT_CHECK(p->a->state == SIM_REQ_DONE && p->b->state == SIM_REQ_DONE,
             "%s: the loads did not both come back", where);
    DT_CHECK(sim_drain_loads(s, 30) == 0, "%s: a load came back twice", where);
    sim_verify_tree(s, where);
    sim_check_poison(s, where);
    sim_check_invariants(s, true, where);
    DT_CHECK(sim_wait_pins_zero(d->socket, 5000) == 0, "%s: pins stay", where);
}

static uint64_t load_bytes(sim_t *s, sim_pool_kind_t k)
{
    return sim_stats(s, k).load_bytes;
}

/* a: two loads of one prompt */
static void case_same_prompt(sim_t *s, const kvd_test_daemon_t *d, const uint32_t *t)
{
    sim_pool_t *kv = &s->pools[SIM_KV], *mamba = &s->pools[SIM_MAMBA];
    uint64_t kv0 = load_bytes(s, SIM_KV), m0 = load_bytes(s, SIM_MAMBA);
    pair_t p;
    pair_new(s, &p, t, N_TOKENS, t, N_TOKENS);
    if (both_loaded(s, &p)) {
        DT_CHECK(p.a->b == 15 && p.b->b == 15, "a: boundaries %u, %u, want 15", p.a->b,
                 p.b->b);
        sim_req_insert(s, p.a);
        sim_req_commit(s, p.a);
        uint32_t kv_free = sim_free_count(kv);
        sim_req_insert(s, p.b);
        DT_CHECK(p.b->ins.mamba_exist && p.b->ins.adopted_end[SIM_KV] == 0,
                 "a: the second insert should find the state and adopt no page");
        uint32_t m_free = sim_free_count(mamba);
        sim_req_commit(s, p.b); /* checks 15 kv pages back, no mamba slot */
        DT_CHECK(sim_free_count(mamba) == m_free,
                 "a: commit changed the mamba free count");
        DT_CHECK(sim_free_count(kv) == kv_free + 15,
                 "a: kv free count %u after commit, want %u", sim_free_count(kv),
                 kv_free + 15);
        finish(s, d, &p, "a (same prompt)");
        DT_CHECK(load_bytes(s, SIM_KV) - kv0 == 15 * kv->object_bytes,
                 "a: kv load_bytes grew by %" PRIu64 ", want 15 pages' worth",
                 load_bytes(s, SIM_KV) - kv0);
        DT_CHECK(load_bytes(s, SIM_MAMBA) - m0 == mamba->object_bytes,
                 "a: mamba load_bytes grew by %" PRIu64 ", want one state (the dropped "
                 "transfer moved bytes?)",
                 load_bytes(s, SIM_MAMBA) - m0);
    }
    pair_free(&p);
    sim_drop_device(s);
}

/* b: a prefill lands between LOAD and the insert; the freed slots are reused */
static void case_prefill_races(sim_t *s, const kvd_test_daemon_t *d, const uint32_t *t,
                               const uint32_t *other)
{
    sim_pool_t *mamba = &s->pools[SIM_MAMBA];
    sim_req_t *r = calloc(1, sizeof(*r));
    sim_req_init(s, r, t, N_TOKENS);
    bool ok =
        DT_CHECK(sim_req_lookup(s, r) == 0 && r->b == 15, "b: lookup (b %u)", r->b) &&
        DT_CHECK(sim_req_load(s, r) == 0, "b: kvd_load %d", r->load_rc) &&
        DT_CHECK(sim_req_prepare(s, r) == 0, "b: prepare");
    if (ok) {
        sim_prefill(s, t, 1000); /* the same prefix, computed: state at 15 */
        int64_t slot = r->mamba_slot;
        sim_req_insert(s, r);
        DT_CHECK(r->ins.mamba_exist, "b: the insert should find the prefill's state");
        uint32_t m_free = sim_free_count(mamba);
        sim_req_commit(s, r);
        DT_CHECK(sim_free_count(mamba) == m_free,
                 "b: commit changed the mamba free count");
        /* another prompt takes the freed slots (LIFO: the same ones) */
        sim_prefill(s, other, 1000);
        sim_check_invariants(s, false, "b: before the batch");
        sim_req_t *batch[1] = {r};
        sim_run_batch(s, batch, 1);
        DT_CHECK(r->state == SIM_REQ_DONE, "b: the load did not come back");
        sim_verify_tree(s, "b (prefill raced, slots reused)");
        sim_check_poison(s, "b");
        sim_check_invariants(s, true, "b");
        DT_CHECK(sim_wait_pins_zero(d->socket, 5000) == 0, "b: pins stay");
        (void)slot;
    } else if (r->load_rc == 0) {
        sim_req_abort(s, r);
    }
    sim_req_fini(r);
    free(r);
    sim_drop_device(s);
}

/* c, d: boundaries 8 and 15 interleaved, in both insert orders */
static void case_nested(sim_t *s, const kvd_test_daemon_t *d, const uint32_t *t,
                        bool short_first)
{
    const char *where = short_first ? "c (8 then 15)" : "d (15 then 8)";
    sim_pool_t *mamba = &s->pools[SIM_MAMBA];
    uint64_t m0 = load_bytes(s, SIM_MAMBA);
    pair_t p;
    pair_new(s, &p, t, 520, t, N_TOKENS); /* a: boundary 8, b: boundary 15 */
    if (both_loaded(s, &p)) {
        DT_CHECK(p.a->b == 8 && p.b->b == 15, "%s: boundaries %u, %u, want 8, 15", where,
                 p.a->b, p.b->b);
        sim_req_t *first = short_first ? p.a : p.b, *second = short_first ? p.b : p.a;
        sim_req_insert(s, first);
        sim_req_commit(s, first);
        sim_req_insert(s, second);
        DT_CHECK(!second->ins.mamba_exist && second->ins.mamba_adopted,
                 "%s: the second insert should attach its state", where);
        if (short_first)
            DT_CHECK(second->commit[0].adopted_begin == 8 &&
                         second->commit[0].adopted_end == 15,
                     "%s: adopted %u..%u, want 8..15", where,
                     second->commit[0].adopted_begin, second->commit[0].adopted_end);
        else
            DT_CHECK(second->commit[0].adopted_begin == second->commit[0].adopted_end,
                     "%s: the boundary-8 insert should adopt no page", where);
        sim_req_commit(s, second);
        finish(s, d, &p, where);
        DT_CHECK(sim_tree_units(s, SIM_MAMBA) == 2, "%s: %u states in the tree, want 2",
                 where, sim_tree_units(s, SIM_MAMBA));
        DT_CHECK(load_bytes(s, SIM_MAMBA) - m0 == 2 * mamba->object_bytes,
                 "%s: mamba load_bytes grew by %" PRIu64 ", want two states", where,
                 load_bytes(s, SIM_MAMBA) - m0);
    }
    pair_free(&p);
    sim_drop_device(s);
}

int main(void)
{
    const sim_config_t cfg = {.model_id = "sim-mamba-exist",
                              .layers = "AMAMA",
                              .page_size = 64,
                              .mamba_chunk = 64,
                              .kv_pages = 128,
                              .mamba_slots = 16,
                              .pad = 16};
    sim_fixture_t f;
    uint32_t *other = malloc(N_TOKENS * sizeof(uint32_t));
    sim_tokens(22, other, N_TOKENS);
    if (sim_fixture_start(&f, "sim/mamba_exist", &cfg, 21, N_TOKENS) == 0) {
        sim_t *s = &f.s;
        const kvd_test_daemon_t *d = &f.d;
        const uint32_t *t = f.tokens;
        /* states stored at pages 8 and 15 */
        sim_prefill(s, t, 512);
        sim_prefill(s, t, 1000);
        DT_CHECK(sim_tree_units(s, SIM_MAMBA) == 2, "setup: %u states",
                 sim_tree_units(s, SIM_MAMBA));
        sim_offload_tree(s, (1u << SIM_KV) | (1u << SIM_MAMBA), NULL);
        sim_drop_device(s);
        case_same_prompt(s, d, t);
        case_prefill_races(s, d, t, other);
        case_nested(s, d, t, true);
        case_nested(s, d, t, false);
        sim_check_invariants(s, true, "at the end");
    }
    free(other);
    return sim_fixture_end(&f);
}
