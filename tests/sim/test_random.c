/*
 * Description: a randomized multi-request workload (scenario 10) on a hybrid
 * model (AMAMA: attention layers 0, 2, 4, mamba layers 1, 3; page_size 64)
 * against one real kvdockd. Three fixed seeds (the second with mamba chunk
 * 128, grid 128, and layer groups of 2), each at most STEPS steps and a wall
 * bound. Prompts come from four shared prefixes (two of them a prefix of one
 * another, none page-aligned) plus one of a few tails of random length, so
 * prompts share pages, extend one another and split tree nodes.
 *
 * Each step is one of, at random:
 *  - prefill a prompt (from the device-usable prefix on);
 *  - offload every node of the tree (KV pages and the state at each node
 *    end; each ack comes back once, with success);
 *  - drop from the device: the whole tree, or only its mamba states (the
 *    simulator has no per-node eviction; see below);
 *  - load one prompt or a batch of two through the whole flow: LOOKUP, the
 *    boundary on the grid, LOAD, PREPARE, insert, COMMIT, layer-wise waits
 *    (each layer byte-exact right after its wait), the completed loads (each
 *    committed rid exactly once, with success, no aborted rid ever); after
 *    it the tree holds the prompt up to the boundary and, half the time, the
 *    engine prefills the rest. Some loads are ABORTed instead of inserted
 *    (after LOAD or after PREPARE): every device index comes back through
 *    free_indices. Some lookups are followed by `kvdock evict --all` or
 *    `evict --namespace <kv or mamba ns>` before LOAD: kvd_load must fail
 *    (negative) and pin nothing, ABORT hands everything back, a fresh lookup
 *    finds no boundary, and the engine recomputes the prompt.
 *
 * After every step: the idle-pool invariant of each pool with nothing held
 * by a request (no double, tree-owned or malformed free), free units still
 * poisoned and pads intact, every page and state the tree holds byte-exact,
 * and no completed load or offload that nobody is waiting for.
 *
 * At the end of each seed: every load issued was committed or aborted, every
 * committed load came back exactly once; after dropping the tree every device
 * unit is free; kvd_stats shows no offload failure and mamba load bytes
 * whenever mamba lookup hits; the daemon's pins and objects_writing are 0,
 * and after closing the linker its leases are 0 and `kvdock stats --check`
 * exits 0 with "invariant check: ok".
 */
#include "dtest.h"
#include "sim.h"

#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define STEPS        150
#define SEED_WALL_MS 6000
#define MAX_TOKENS   1100 /* 17 full pages at most */
#define N_PREFIXES   4
#define N_TAILS      6
#define ROOM_KV      40 /* pages free before an op that allocates (two prompts) */
#define ROOM_MAMBA   3
/* step kinds, cumulative percent: the rest are loads */
#define P_PREFILL 22
#define P_OFFLOAD 38
#define P_DROP    47

typedef struct counters {
    uint64_t steps, prefills, offloads, drops, lookups, loads_issued, committed, done,
        aborted, evict_rounds, evict_failed_loads, restored_pages;
} counters_t;

typedef struct run_ctx {
    const kvd_test_daemon_t *d;
    sim_t *s;
    uint64_t rng;
    uint32_t base; /* token seed base of this run */
    counters_t c;
} run_ctx_t;

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static uint32_t rnd(run_ctx_t *x, uint32_t n)
{
    /* xorshift64* */
    x->rng ^= x->rng >> 12;
    x->rng ^= x->rng << 25;
    x->rng ^= x->rng >> 27;
    return (uint32_t)((x->rng * 0x2545F4914F6CDD1Dull) >> 33) % n;
}

/* A prompt: one of the shared prefixes, then one of its tails, of random
 * length. Prefixes 0 and 1 are the first 200 and 450 tokens of the same
 * stream. Returns the length. */
static size_t make_prompt(run_ctx_t *x, uint32_t *out)
{
    static const uint32_t prefix_len[N_PREFIXES] = {200, 450, 333, 320};
    uint32_t p = rnd(x, N_PREFIXES), t = rnd(x, N_TAILS);
    uint32_t plen = prefix_len[p];
    sim_tokens(x->base + (p < 2 ? 0 : p), out, plen);
    size_t len = plen + 1 + rnd(x, MAX_TOKENS - plen);
    sim_tokens(x->base + 100 + p * N_TAILS + t, out + plen, len - plen);
    return len;
}

/* Drops the whole tree when a prompt (or two) might not fit. */
static void ensure_room(run_ctx_t *x)
{
    sim_t *s = x->s;
    if (sim_free_count(&s->pools[SIM_KV]) < ROOM_KV ||
        sim_free_count(&s->pools[SIM_MAMBA]) < ROOM_MAMBA)
        sim_drop_device(s);
}

static void check_step(run_ctx_t *x, const char *where)
{
    sim_t *s = x->s;
    sim_check_invariants(s, true, where);
    sim_check_poison(s, where);
    sim_verify_tree(s, where);
    kvd_completion_t c[8];
    size_t n = 0;
    int rc = kvd_pop_completed_loads(s->linker, c, 8, &n);
    DT_CHECK(rc == 0 && n == 0,
             "%s: %zu completed loads nobody waits for (first rid %" PRIu64 ", rc %d)",
             where, n, n ? c[0].id : 0, rc);
    n = 0;
    rc = kvd_pop_completed_offloads(s->linker, c, 8, &n);
    DT_CHECK(rc == 0 && n == 0,
             "%s: %zu completed offloads nobody waits for (first ack %" PRIu64 ", rc %d)",
             where, n, n ? c[0].id : 0, rc);
}

static void do_prefill(run_ctx_t *x, const char *where)
{
    uint32_t *t = malloc(MAX_TOKENS * sizeof(uint32_t));
    size_t len = make_prompt(x, t);
    ensure_room(x);
    int pages = sim_prefill(x->s, t, len);
    DT_CHECK(pages == (int)(len / 64),
             "%s: prefill of %zu tokens: the tree holds %d pages", where, len, pages);
    x->c.prefills++;
    free(t);
}

static void do_offload(run_ctx_t *x, const char *where)
{
    uint64_t units[SIM_N_KINDS] = {0};
    int rc = sim_offload_tree(x->s, (1u << SIM_KV) | (1u << SIM_MAMBA), units);
    DT_CHECK(rc == 0, "%s: offload of the tree failed", where);
    DT_CHECK(units[SIM_KV] == sim_tree_units(x->s, SIM_KV) &&
                 units[SIM_MAMBA] == sim_tree_units(x->s, SIM_MAMBA),
             "%s: offloaded %" PRIu64 " pages and %" PRIu64
             " states, the tree holds %u and %u",
             where, units[SIM_KV], units[SIM_MAMBA], sim_tree_units(x->s, SIM_KV),
             sim_tree_units(x->s, SIM_MAMBA));
    x->c.offloads++;
}

static void do_drop(run_ctx_t *x)
{
    if (rnd(x, 2))
        sim_drop_device(x->s);
    else
        sim_drop_mamba(x->s);
    x->c.drops++;
}

/* One load step: one request or a batch of two. */
static void do_load(run_ctx_t *x, const char *where)
{
    sim_t *s = x->s;
    size_t n = rnd(x, 4) == 0 ? 2 : 1;
    uint32_t *tok[2] = {NULL, NULL};
    sim_req_t *r[2] = {NULL, NULL};
    size_t len[2] = {0, 0};
    ensure_room(x);
    bool any_load = false;
    for (size_t i = 0; i < n; i++) {
        tok[i] = malloc(MAX_TOKENS * sizeof(uint32_t));
        len[i] = make_prompt(x, tok[i]);
        r[i] = calloc(1, sizeof(sim_req_t));
        sim_req_init(s, r[i], tok[i], len[i]);
        int rc = sim_req_lookup(s, r[i]);
        x->c.lookups++;
        if (!DT_CHECK(rc == 0, "%s: kvd_lookup: %d (%s)", where, rc, kvd_strerror(rc)))
            r[i]->b = r[i]->cached; /* nothing to load */
        DT_CHECK(r[i]->b >= r[i]->cached && r[i]->b <= r[i]->n_probe &&
                     (r[i]->b * 64) % s->grid == 0,
                 "%s: boundary %u (cached %u, probe %u, grid %u)", where, r[i]->b,
                 r[i]->cached, r[i]->n_probe, s->grid);
        any_load |= r[i]->b > r[i]->cached;
    }

    /* sometimes the daemon loses the objects between lookup and load */
    int evict_mode = any_load && rnd(x, 100) < 12 ? 1 + (int)rnd(x, 3) : 0;
    if (evict_mode) {
        const char *all[] = {"--all", NULL},
                   *kv_ns[] = {"--namespace", s->pools[SIM_KV].ns_name, NULL},
                   *mamba_ns[] = {"--namespace", s->pools[SIM_MAMBA].ns_name, NULL};
        uint64_t e = sim_evict(x->d->socket, evict_mode == 1   ? all
                                             : evict_mode == 2 ? kv_ns
                                                               : mamba_ns);
        DT_CHECK(e != UINT64_MAX && e > 0, "%s: evict (mode %d) evicted %" PRIu64, where,
                 evict_mode, e);
        x->c.evict_rounds++;
    }

    for (size_t i = 0; i < n; i++) {
        if (r[i]->b <= r[i]->cached)
            continue;
        int rc = sim_req_load(s, r[i]);
        x->c.loads_issued++;
        if (evict_mode) {
            DT_CHECK(rc < 0, "%s: kvd_load returned %d after evict (mode %d)", where, rc,
                     evict_mode);
            if (rc < 0) {
                DT_CHECK(sim_daemon_pins(x->d->socket) == 0,
                         "%s: a failed kvd_load left %" PRIu64 " pins", where,
                         sim_daemon_pins(x->d->socket));
                x->c.evict_failed_loads++;
            }
        } else {
            DT_CHECK(rc == 0, "%s: kvd_load(rid %" PRIu64 "): %d (%s)", where, r[i]->rid,
                     rc, kvd_strerror(rc));
        }
        bool abort_it = evict_mode || rc != 0 || rnd(x, 100) < 12;
        if (!abort_it) {
            rc = sim_req_prepare(s, r[i]);
            DT_CHECK(rc == 0, "%s: kvd_load_prepare: %d (%s)", where, rc,
                     kvd_strerror(rc));
            if (rc != 0 || rnd(x, 100) < 6)
                abort_it = true; /* aborted after PREPARE */
        }
        if (abort_it) {
            rc = sim_req_abort(s, r[i]); /* checks every index came back */
            if (!DT_CHECK(rc == 0, "%s: kvd_load_abort(rid %" PRIu64 "): %d (%s)", where,
                          r[i]->rid, rc, kvd_strerror(rc)))
                sim_req_free_units(s, r[i]);
            x->c.aborted++;
        }
    }

    if (evict_mode) {
        /* nothing is left to find; the engine recomputes */
        for (size_t i = 0; i < n; i++) {
            if (r[i]->b <= r[i]->cached)
                continue;
            sim_req_t *again = calloc(1, sizeof(*again));
            sim_req_init(s, again, tok[i], len[i]);
            int rc = sim_req_lookup(s, again);
            DT_CHECK(rc == 0 && again->n_boundaries == 0,
                     "%s: after evict (mode %d) a lookup found %zu boundaries (rc %d)",
                     where, evict_mode, again->n_boundaries, rc);
            sim_req_fini(again);
            free(again);
            int pages = sim_prefill(s, tok[i], len[i]);
            DT_CHECK(pages == (int)(len[i] / 64), "%s: recompute: %d pages", where,
                     pages);
        }
    } else {
        /* insert and commit the loads not aborted, then the batch */
        size_t n_committed = 0;
        for (size_t i = 0; i < n; i++) {
            if (r[i]->state != SIM_REQ_PREPARED)
                continue;
            if (sim_req_insert(s, r[i]) == 0 && sim_req_commit(s, r[i]) == 0)
                n_committed++;
        }
        x->c.committed += n_committed;
        if (any_load) {
            sim_req_t *batch[2] = {r[0], r[1]};
            sim_run_batch(s, batch, n);
        }
        for (size_t i = 0; i < n; i++) {
            if (r[i]->b <= r[i]->cached || r[i]->state == SIM_REQ_ABORTED)
                continue;
            if (!DT_CHECK(r[i]->state == SIM_REQ_DONE,
                          "%s: load rid %" PRIu64 " did not come back (state %d)", where,
                          r[i]->rid, r[i]->state))
                continue;
            x->c.done++;
            x->c.restored_pages += r[i]->b - r[i]->cached;
            uint32_t m = sim_tree_match(s, tok[i], r[i]->b),
                     c = sim_tree_cached(s, tok[i], r[i]->n_probe);
            DT_CHECK(
                m == r[i]->b && c >= r[i]->b,
                "%s: after loading %u pages (from %u) the tree matches %u, usable %u",
                where, r[i]->b, r[i]->cached, m, c);
        }
        /* half the time the engine computes the rest */
        for (size_t i = 0; i < n; i++)
            if (rnd(x, 2)) {
                int pages = sim_prefill(s, tok[i], len[i]);
                DT_CHECK(pages == (int)(len[i] / 64), "%s: prefill after load: %d pages",
                         where, pages);
            }
    }
    for (size_t i = 0; i < n; i++) {
        sim_req_fini(r[i]);
        free(r[i]);
        free(tok[i]);
    }
}

static void run(const kvd_test_daemon_t *d, uint64_t seed, uint32_t chunk, int group)
{
    char model[48];
    snprintf(model, sizeof(model), "sim-random-%" PRIu64, seed);
    sim_config_t cfg = {.model_id = model,
                        .layers = "AMAMA",
                        .page_size = 64,
                        .mamba_chunk = chunk,
                        .kv_pages = 160,
                        .mamba_slots = 24,
                        .pad = 16,
                        .layer_group_size = group};
    sim_t s;
    if (sim_open(&s, &cfg, d->socket) != 0) {
        sim_close(&s);
        return;
    }
    run_ctx_t x = {.d = d,
                   .s = &s,
                   .rng = seed * 0x9E3779B97F4A7C15ull + 1,
                   .base = (uint32_t)seed * 1000};
    uint64_t deadline = now_ms() + SEED_WALL_MS;
    int failures_before = dt_failure_count();
    for (int step = 0; step < STEPS; step++) {
        if (now_ms() > deadline) {
            fprintf(stderr, "sim/random seed %" PRIu64 ": wall bound after %d steps\n",
                    seed, step);
            break;
        }
        char where[96];
        uint32_t op = rnd(&x, 100);
        const char *what = op < P_PREFILL   ? "prefill"
                           : op < P_OFFLOAD ? "offload"
                           : op < P_DROP    ? "drop"
                                            : "load";
        snprintf(where, sizeof(where), "seed %" PRIu64 " step %d (%s)", seed, step, what);
        if (op < P_PREFILL)
            do_prefill(&x, where);
        else if (op < P_OFFLOAD)
            do_offload(&x, where);
        else if (op < P_DROP)
            do_drop(&x);
        else
            do_load(&x, where);
        x.c.steps++;
        check_step(&x, where);
        if (dt_failure_count() > failures_before) {
            fprintf(stderr,
                    "sim/random seed %" PRIu64 ": stopping after the first "
                    "failing step %d (%s)\n",
                    seed, step, what);
            break;
        }
    }
    counters_t *c = &x.c;
    fprintf(stderr,
            "sim/random seed %" PRIu64 " (chunk %u): %" PRIu64 " steps, %" PRIu64
            " prefills, %" PRIu64 " offloads, %" PRIu64 " drops, %" PRIu64
            " lookups, %" PRIu64 " loads issued, %" PRIu64 " committed, %" PRIu64
            " done (%" PRIu64 " pages), %" PRIu64 " aborted, %" PRIu64
            " evict rounds (%" PRIu64 " loads failed by them)\n",
            seed, chunk, c->steps, c->prefills, c->offloads, c->drops, c->lookups,
            c->loads_issued, c->committed, c->done, c->restored_pages, c->aborted,
            c->evict_rounds, c->evict_failed_loads);

    /* every load issued was committed or aborted; each commit came back once */
    DT_CHECK(c->loads_issued == c->committed + c->aborted,
             "seed %" PRIu64 ": %" PRIu64 " loads issued, %" PRIu64
             " committed + %" PRIu64 " aborted",
             seed, c->loads_issued, c->committed, c->aborted);
    DT_CHECK(c->committed == c->done,
             "seed %" PRIu64 ": %" PRIu64 " committed, %" PRIu64 " came back", seed,
             c->committed, c->done);
    DT_CHECK(sim_drain_loads(&s, 20) == 0, "seed %" PRIu64 ": a load came back late",
             seed);
    /* the workload did what it is meant to */
    if (c->steps == STEPS)
        DT_CHECK(c->done > 0 && c->aborted > c->evict_failed_loads &&
                     c->evict_failed_loads > 0 && c->offloads > 0,
                 "seed %" PRIu64 ": the workload missed a path (done %" PRIu64
                 ", aborted %" PRIu64 ", failed by evict %" PRIu64 ")",
                 seed, c->done, c->aborted, c->evict_failed_loads);

    kvd_pool_stats_t kst = sim_stats(&s, SIM_KV), mst = sim_stats(&s, SIM_MAMBA);
    DT_CHECK(kst.offload_failures == 0 && mst.offload_failures == 0,
             "seed %" PRIu64 ": offload failures kv %" PRIu64 ", mamba %" PRIu64, seed,
             kst.offload_failures, mst.offload_failures);
    DT_CHECK(mst.lookup_hit_pages == 0 || mst.load_bytes > 0,
             "seed %" PRIu64 ": mamba lookup hits %" PRIu64 " but load_bytes 0", seed,
             mst.lookup_hit_pages);

    /* no leaked device unit */
    sim_drop_device(&s);
    sim_check_invariants(&s, true, "at the end");
    for (int k = 0; k < SIM_N_KINDS; k++)
        if (s.pools[k].present)
            DT_CHECK(sim_free_count(&s.pools[k]) == s.pools[k].n_units,
                     "seed %" PRIu64 ": %s: %u of %u units free after dropping the tree",
                     seed, s.pools[k].name, sim_free_count(&s.pools[k]),
                     s.pools[k].n_units);

    /* the daemon: no pin, nothing half-written */
    DT_CHECK(sim_wait_pins_zero(d->socket, 5000) == 0, "seed %" PRIu64 ": pins stay",
             seed);
    kvd_stats_rep_t *st = malloc(sizeof(*st));
    int rc = dt_stats_fresh(d->socket, st);
    if (DT_CHECK(rc == KVD_OK, "Stats: %d", rc))
        DT_CHECK(st->store.pins == 0 && st->store.objects_writing == 0,
                 "seed %" PRIu64 ": pins %" PRIu64 ", objects_writing %" PRIu64, seed,
                 st->store.pins, st->store.objects_writing);
    sim_close(&s);

    /* with the linker gone: no lease, the store's own check passes */
    uint64_t until = now_ms() + 5000;
    while ((rc = dt_stats_fresh(d->socket, st)) == KVD_OK && st->store.leases != 0 &&
           now_ms() < until)
        sim_sleep_ms(10);
    if (DT_CHECK(rc == KVD_OK, "Stats: %d", rc))
        DT_CHECK(st->store.leases == 0 && st->store.pins == 0 &&
                     st->store.objects_writing == 0,
                 "seed %" PRIu64 ": after close: leases %" PRIu64 ", pins %" PRIu64
                 ", objects_writing %" PRIu64,
                 seed, st->store.leases, st->store.pins, st->store.objects_writing);
    free(st);
    /* the whole table: with every seed's namespaces it passes 4 KiB */
    static char out[1 << 16];
    rc = dt_cli(out, sizeof(out),
                (const char *[]){"--socket", d->socket, "stats", "--check", NULL});
    DT_CHECK(rc == 0 && strstr(out, "invariant check: ok") != NULL,
             "seed %" PRIu64 ": kvdock stats --check exited %d:\n%s", seed, rc, out);
}

int main(void)
{
    kvd_test_daemon_t d = {0};
    if (dt_start(&d, NULL) == 0) {
        run(&d, 1, 64, 1);
        run(&d, 2, 128, 2);
        run(&d, 3, 64, 1);
    }
    dt_stop(&d, SIGTERM, 10000);
    return dt_exit_status("sim/random");
}
