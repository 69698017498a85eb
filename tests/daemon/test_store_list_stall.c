/*
 * Description: one ListPrefixes over a hostile store no longer stalls the
 * daemon (issue 11, hole 5). Set up through the RPC, as an attacker would:
 * 4,095 empty namespaces (of the same model as the one that holds data), a
 * 1,000-page chain C0..C999 in stall/kv/tp0, and 600 leaves L0..L599, Lj a
 * child of C(399+j) at depth 400+j; so 601 prefixes: Lj with 401+j pages
 * and C999 with 1,000, every one rooted at C0.
 *
 * While a second client does Health round trips back to back on its own
 * connection, the first lists every namespace, following next_cursor page
 * by page (at most 1,000 pages). Asserted, on work rather than time:
 *   - the listing comes in at least 2 pages; every page but the last says
 *     truncated and carries a cursor, the last says neither;
 *   - together the pages hold each of the 601 prefixes exactly once, each
 *     with its page count (401+j, 1000) and root C0, and nothing else;
 *   - Health replies came while the listing was going on (between its
 *     first request and its last reply), and every Health call succeeded.
 * The worst Health round trip during the listing is printed, not asserted.
 *
 * Cursors: a cursor with a changed byte (in its position, in its check
 * value), one of random bytes, one cut short, and a genuine one used for
 * another listing (another namespace) are each refused with
 * KVD_ERR_INVALID; the genuine one still continues. After 100 chain pages
 * are evicted, an old cursor still continues (OK) and the rest of the
 * listing still ends.
 *
 * `kvdock prefixes` (and --json) shows all 601 entries, following the
 * cursor; with --limit 100 it shows 100 and says truncated.
 *
 * Pipelining: 250 Inspects in one write, each probing 4,096 namespaces;
 * a second client's Stats is served between them (see check_pipeline).
 *
 * Then Health is ready, the invariant check (Stats) passes, the daemon exits 0 on
 * SIGTERM with a clean log.
 *
 * Before the fix the one call worked for about a minute: the call's 10 s
 * timeout and the Health thread's fail it.
 */
#include "test_store_util.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KV_NS      "stall/kv/tp0"
#define OBJ_BYTES  4096u
#define N_EMPTY    4095u
#define CHAIN      1000u
#define N_LEAVES   600u
#define LEAF_AT    399u /* Lj's parent is C(LEAF_AT + j) */
#define N_PREFIXES (N_LEAVES + 1u)
#define MAX_PAGES  1000u
#define CALL_MS    10000
#define HEALTH_MAX 1000000u /* Health calls at most (the loop's bound) */

static kvd_key_t chain[CHAIN], leaves[N_LEAVES];

/* ------------------------------------------------------------- setup */

static bool register_empty(kvd_client_t *c)
{
    kvd_ns_spec_t *specs = calloc(N_EMPTY, sizeof(*specs));
    uint32_t *ids = calloc(N_EMPTY, sizeof(*ids));
    bool ok = DT_CHECK(specs && ids, "out of memory");
    for (uint32_t i = 0; ok && i < N_EMPTY; i++) {
        snprintf(specs[i].name, sizeof(specs[i].name), "stall/empty%04u/tp0", i);
        specs[i].object_bytes = OBJ_BYTES;
    }
    ts_err_t e;
    int st = ok ? ts_register(c, specs, N_EMPTY, ids, &e) : KVD_ERR_NOMEM;
    ok = ok && DT_CHECK(st == KVD_OK, "register %u namespaces: %s (%s)", N_EMPTY,
                        kvd_status_str(st), e.text);
    free(specs);
    free(ids);
    return ok;
}

static bool store_pages(ts_client_t *t)
{
    if (ts_make_keys(7, CHAIN, 16, chain) != 0)
        return false;
    kvd_put_item_t *items = calloc(CHAIN, sizeof(*items));
    if (!DT_CHECK(items != NULL, "out of memory"))
        return false;
    ts_chain_items(chain, CHAIN, NULL, 0, items);
    bool ok = ts_put_items(t, t->ns[0], OBJ_BYTES, items, CHAIN, "the chain");
    for (uint32_t j = 0; j < N_LEAVES; j++) {
        memset(leaves[j], 0, KVD_KEY_BYTES);
        leaves[j][0] = 0xa5;
        leaves[j][1] = (uint8_t)(j >> 8);
        leaves[j][2] = (uint8_t)j;
        leaves[j][31] = 0x5a;
        memset(&items[j], 0, sizeof(items[j]));
        memcpy(items[j].key, leaves[j], KVD_KEY_BYTES);
        memcpy(items[j].parent, chain[LEAF_AT + j], KVD_KEY_BYTES);
        items[j].has_parent = true;
        items[j].depth = LEAF_AT + j + 1;
    }
    ok = ok && ts_put_items(t, t->ns[0], OBJ_BYTES, items, N_LEAVES, "the leaves");
    free(items);
    return ok;
}

/* ------------------------------------------------------- Health thread */

typedef struct health {
    const char *socket;
    atomic_bool stop;
    atomic_uint_fast64_t replies;
    atomic_uint_fast64_t failures;
    atomic_uint_fast64_t worst_ns; /* while measuring */
    atomic_bool measuring;
} health_t;

static void *health_main(void *arg)
{
    health_t *h = arg;
    kvd_client_t *c = dt_connect(h->socket, true);
    if (c == NULL)
        return NULL;
    for (uint32_t i = 0; i < HEALTH_MAX && !atomic_load(&h->stop); i++) {
        uint64_t t0 = kvd_now_ns();
        int st = dt_health(c, NULL);
        uint64_t dt = kvd_now_ns() - t0;
        if (st != KVD_HEALTH_READY) {
            atomic_fetch_add(&h->failures, 1);
            break; /* a timed-out connection is not reused */
        }
        atomic_fetch_add(&h->replies, 1);
        if (atomic_load(&h->measuring) && dt > atomic_load(&h->worst_ns))
            atomic_store(&h->worst_ns, dt);
    }
    kvd_client_close(c);
    return NULL;
}

/* ------------------------------------------------------------- listing */

/* One ListPrefixes page; *rep is the caller's to clear. Returns the
 * reply's status, or the call's. */
static int list_page(kvd_client_t *c, const char *ns_name, const uint8_t *cursor,
                     size_t cursor_len, kvd_msg_t *rep)
{
    kvd_msg_t req;
    kvd_msg_request(&req, 0, KVD_METHOD_LIST_PREFIXES);
    kvd_strlcpy(req.body.list_req.ns_name, ns_name, KVD_NS_NAME_BYTES);
    memcpy(req.body.list_req.cursor, cursor, cursor_len);
    req.body.list_req.cursor_len = cursor_len;
    int rc = kvd_client_call(c, &req, rep, CALL_MS);
    return rc != KVD_OK ? rc : rep->status;
}

/* Which prefix an entry is: 0..599 for Lj, 600 for C999, -1 otherwise. */
static int prefix_index(const kvd_prefix_msg_t *p)
{
    if (memcmp(p->leaf, chain[CHAIN - 1], KVD_KEY_BYTES) == 0)
        return (int)N_LEAVES;
    for (uint32_t j = 0; j < N_LEAVES; j++)
        if (memcmp(p->leaf, leaves[j], KVD_KEY_BYTES) == 0)
            return (int)j;
    return -1;
}

typedef struct listing {
    uint32_t pages;
    uint32_t seen[N_PREFIXES];
    uint8_t first_cursor[KVD_CURSOR_MAX];
    size_t first_cursor_len;
    bool ended;
} listing_t;

/* Follows the cursor from (cursor) to the end, at most MAX_PAGES pages,
 * checking each page; counts entries into L->seen. */
static void list_all(kvd_client_t *c, const uint8_t *cursor0, size_t len0, bool whole,
                     listing_t *L)
{
    uint8_t cursor[KVD_CURSOR_MAX];
    size_t cursor_len = len0;
    if (len0 > 0)
        memcpy(cursor, cursor0, len0);
    kvd_msg_t *rep = calloc(1, sizeof(*rep));
    if (!DT_CHECK(rep != NULL, "out of memory"))
        return;
    while (L->pages < MAX_PAGES) {
        int st = list_page(c, "", cursor, cursor_len, rep);
        if (!DT_CHECK(st == KVD_OK, "ListPrefixes page %u: %s (%s)", L->pages,
                      kvd_status_str(st), rep->error)) {
            kvd_msg_clear(rep);
            break;
        }
        L->pages++;
        const kvd_list_rep_t *l = &rep->body.list_rep;
        for (size_t i = 0; i < l->n_prefixes; i++) {
            const kvd_prefix_msg_t *p = &l->prefixes[i];
            int k = prefix_index(p);
            if (!DT_CHECK(k >= 0, "page %u: an entry for a leaf not stored as one",
                          L->pages))
                continue;
            L->seen[k]++;
            if (!whole)
                continue; /* chain pages were evicted: shorter prefixes */
            uint32_t want = k == (int)N_LEAVES ? CHAIN : LEAF_AT + (uint32_t)k + 2;
            DT_CHECK(p->pages == want && memcmp(p->root, chain[0], KVD_KEY_BYTES) == 0,
                     "prefix %d: %u pages (want %u), root %s C0", k, p->pages, want,
                     memcmp(p->root, chain[0], KVD_KEY_BYTES) ? "is not" : "is");
        }
        bool more = l->truncated;
        DT_CHECK(more == (l->next_cursor_len > 0),
                 "page %u: truncated %d but a cursor of %zu bytes", L->pages, more,
                 l->next_cursor_len);
        if (L->first_cursor_len == 0 && l->next_cursor_len > 0) {
            memcpy(L->first_cursor, l->next_cursor, l->next_cursor_len);
            L->first_cursor_len = l->next_cursor_len;
        }
        memcpy(cursor, l->next_cursor, l->next_cursor_len);
        cursor_len = l->next_cursor_len;
        kvd_msg_clear(rep);
        if (!more || cursor_len == 0) {
            L->ended = !more;
            break;
        }
    }
    free(rep);
}

static void check_listing(const char *socket, kvd_client_t *c, listing_t *L)
{
    health_t h = {.socket = socket};
    pthread_t th;
    if (!DT_CHECK(pthread_create(&th, NULL, health_main, &h) == 0, "pthread_create"))
        return;
    /* wait (bounded) until Health answers at all */
    for (int i = 0;
         i < 500 && atomic_load(&h.replies) == 0 && atomic_load(&h.failures) == 0; i++)
        kvd_sleep_ns(10 * 1000 * 1000);
    uint64_t before = atomic_load(&h.replies);
    atomic_store(&h.measuring, true);
    uint64_t t0 = kvd_now_ns();
    list_all(c, NULL, 0, true, L);
    uint64_t took = kvd_now_ns() - t0;
    atomic_store(&h.measuring, false);
    uint64_t during = atomic_load(&h.replies) - before;
    atomic_store(&h.stop, true);
    pthread_join(th, NULL);

    DT_CHECK(L->ended, "the listing did not end within %u pages", MAX_PAGES);
    DT_CHECK(L->pages >= 2,
             "the listing came in %u page(s); a bounded page cannot hold it", L->pages);
    uint32_t missing = 0, twice = 0;
    for (uint32_t k = 0; k < N_PREFIXES; k++) {
        missing += L->seen[k] == 0;
        twice += L->seen[k] > 1;
    }
    DT_CHECK(missing == 0 && twice == 0,
             "of %u prefixes, %u never listed and %u listed more than once", N_PREFIXES,
             missing, twice);
    DT_CHECK(during > 0, "no Health reply came while the listing ran (%u pages)",
             L->pages);
    DT_CHECK(atomic_load(&h.failures) == 0, "a Health call failed during the listing");
    printf("listing: %u pages in %.1f ms; %llu Health replies meanwhile, the worst "
           "round trip %.2f ms\n",
           L->pages, (double)took / 1e6, (unsigned long long)during,
           (double)atomic_load(&h.worst_ns) / 1e6);
}

/* A cursor that is not the daemon's is refused; the genuine one works. */
static void check_cursors(kvd_client_t *c, const listing_t *L)
{
    if (!DT_CHECK(L->first_cursor_len > 0, "no cursor to test"))
        return;
    kvd_msg_t *rep = calloc(1, sizeof(*rep));
    if (!DT_CHECK(rep != NULL, "out of memory"))
        return;
    uint8_t bad[KVD_CURSOR_MAX];
    size_t n = L->first_cursor_len;
    struct {
        const char *what;
        size_t at; /* byte changed; SIZE_MAX: random bytes; n: cut short */
    } cases[] = {{"a changed first byte", 0},
                 {"a changed position", n / 2},
                 {"a changed last byte", n - 1},
                 {"random bytes", SIZE_MAX},
                 {"cut short", n}};
    for (size_t i = 0; i < KVD_ARRAY_SIZE(cases); i++) {
        size_t len = n;
        memcpy(bad, L->first_cursor, n);
        if (cases[i].at == SIZE_MAX) {
            for (size_t k = 0; k < n; k++)
                bad[k] = (uint8_t)(0x3b * (k + 1) ^ 0xc5);
        } else if (cases[i].at == n) {
            len = n / 2;
        } else {
            bad[cases[i].at] ^= 0x40;
        }
        int st = list_page(c, "", bad, len, rep);
        DT_CHECK(st == KVD_ERR_INVALID, "a cursor with %s: %s, want INVALID (%s)",
                 cases[i].what, kvd_status_str(st), rep->error);
        kvd_msg_clear(rep);
    }
    int st = list_page(c, KV_NS, L->first_cursor, n, rep);
    DT_CHECK(st == KVD_ERR_INVALID,
             "a cursor of the every-namespace listing used for %s: "
             "%s, want INVALID",
             KV_NS, kvd_status_str(st));
    kvd_msg_clear(rep);
    st = list_page(c, "", L->first_cursor, n, rep);
    DT_CHECK(st == KVD_OK, "the genuine cursor, again: %s (%s)", kvd_status_str(st),
             rep->error);
    kvd_msg_clear(rep);
    free(rep);
}

static char cli_out[1 << 20];

/* Occurrences of needle in text. */
static size_t count_of(const char *text, const char *needle)
{
    size_t n = 0;
    for (const char *p = strstr(text, needle); p; p = strstr(p + 1, needle))
        n++;
    return n;
}

/* kvdock prefixes follows the cursor: all 601 entries; --limit 100 gives
 * 100 and says truncated. */
static void check_cli(const char *socket)
{
    int rc = dt_cli_at(cli_out, sizeof(cli_out), socket,
                       (const char *[]){"prefixes", "--json", NULL});
    DT_CHECK(rc == 0 && dt_json_valid(cli_out), "kvdock prefixes --json: exit %d", rc);
    size_t n = count_of(cli_out, "\"leaf\":");
    DT_CHECK(n == N_PREFIXES && strstr(cli_out, "\"truncated\":false") != NULL,
             "kvdock prefixes --json: %zu entries (want %u), %s", n, N_PREFIXES,
             strstr(cli_out, "\"truncated\":false") ? "complete" : "truncated");
    rc = dt_cli_at(cli_out, sizeof(cli_out), socket,
                   (const char *[]){"prefixes", "--json", "--limit", "100", NULL});
    n = count_of(cli_out, "\"leaf\":");
    DT_CHECK(rc == 0 && n == 100 && strstr(cli_out, "\"truncated\":true") != NULL,
             "kvdock prefixes --json --limit 100: exit %d, %zu entries, %s", rc, n,
             strstr(cli_out, "\"truncated\":true") ? "truncated" : "not truncated");
    rc = dt_cli_at(cli_out, sizeof(cli_out), socket, (const char *[]){"prefixes", NULL});
    n = count_of(cli_out, " pages ");
    DT_CHECK(rc == 0 && n == N_PREFIXES, "kvdock prefixes: exit %d, %zu entries", rc, n);
}

/* ------------------------------------------------------- pipelining */

/* Inspects in one write (about 15 KiB, one read). Each probes 4,096
 * namespaces, about a millisecond here and twenty under ThreadSanitizer,
 * so 250 of them are a hundred and more of the loop's 2 ms turns: what the
 * check needs. (1,000 took past the call's 60 s in the TSan tree while the
 * cluster tests' TSan daemons shared the two CPUs.) */
#define PIPELINE 250u

typedef struct watcher {
    const char *socket;
    atomic_bool stop;
    uint64_t base;               /* Inspect calls before the pipeline */
    atomic_uint_fast64_t inside; /* Stats replies seeing base < calls < base+N */
    atomic_uint_fast64_t replies;
} watcher_t;

static void *watch_main(void *arg)
{
    watcher_t *w = arg;
    kvd_client_t *c = dt_connect(w->socket, true);
    if (c == NULL)
        return NULL;
    static ts_stats_t st;
    for (uint32_t i = 0; i < 100000 && !atomic_load(&w->stop); i++) {
        if (ts_stats(c, false, &st) != KVD_OK)
            break;
        uint64_t calls = st.methods[KVD_METHOD_INSPECT].calls;
        atomic_fetch_add(&w->replies, 1);
        if (calls > w->base && calls < w->base + PIPELINE)
            atomic_fetch_add(&w->inside, 1);
    }
    kvd_client_close(c);
    return NULL;
}

/*
 * A client pipelines 250 Inspects (each probes 4,096 namespaces, so the
 * lot is far more than one turn of the loop) in one write. Each is bounded,
 * but together they would hold the loop; the daemon serves a connection's
 * frames a turn at a time, so a second client's Stats is served between
 * them: some Stats reply counts more Inspects than before the pipeline and
 * fewer than after. (Served in one go, every Stats sees all or none.)
 */
static void check_pipeline(const char *socket, kvd_client_t *c)
{
    static ts_stats_t st;
    if (!DT_CHECK(ts_stats(c, false, &st) == KVD_OK, "Stats"))
        return;
    watcher_t w = {.socket = socket, .base = st.methods[KVD_METHOD_INSPECT].calls};
    kvd_msg_t *reqs = calloc(PIPELINE, sizeof(*reqs)),
              *reps = calloc(PIPELINE, sizeof(*reps));
    pthread_t th;
    if (!DT_CHECK(reqs && reps, "out of memory") ||
        !DT_CHECK(pthread_create(&th, NULL, watch_main, &w) == 0, "pthread_create")) {
        free(reqs);
        free(reps);
        return;
    }
    for (int i = 0; i < 500 && atomic_load(&w.replies) == 0; i++)
        kvd_sleep_ns(10 * 1000 * 1000);
    for (uint32_t i = 0; i < PIPELINE; i++) {
        kvd_msg_request(&reqs[i], 0, KVD_METHOD_INSPECT);
        memset(reqs[i].body.inspect_req.key, 0xee, KVD_KEY_BYTES); /* not stored */
    }
    int rc = kvd_client_call_many(c, reqs, reps, PIPELINE, 60000);
    atomic_store(&w.stop, true);
    pthread_join(th, NULL);
    uint32_t not_found = 0;
    for (uint32_t i = 0; rc == KVD_OK && i < PIPELINE; i++) {
        not_found += reps[i].status == KVD_ERR_NOT_FOUND;
        kvd_msg_clear(&reps[i]);
    }
    DT_CHECK(rc == KVD_OK && not_found == PIPELINE,
             "%u pipelined Inspects: %s, %u answered not found", PIPELINE,
             kvd_status_str(rc), not_found);
    DT_CHECK(atomic_load(&w.inside) > 0,
             "none of %llu Stats replies came while the %u pipelined Inspects were "
             "served: one connection's frames held the loop",
             (unsigned long long)atomic_load(&w.replies), PIPELINE);
    printf("pipeline: %llu Stats replies, %llu of them between the Inspects\n",
           (unsigned long long)atomic_load(&w.replies),
           (unsigned long long)atomic_load(&w.inside));
    free(reqs);
    free(reps);
}

/* Evicts C0..C99 (READY, unpinned), then continues an old cursor: the store
 * changed under it; it still continues and the listing still ends. */
static void check_stale(kvd_client_t *c, const listing_t *L)
{
    kvd_msg_t req, rep;
    for (uint32_t i = 0; i < 100; i++) {
        kvd_msg_request(&req, 0, KVD_METHOD_EVICT);
        kvd_strlcpy(req.body.evict_req.ns_name, KV_NS, KVD_NS_NAME_BYTES);
        memcpy(req.body.evict_req.key, chain[i], KVD_KEY_BYTES);
        req.body.evict_req.has_key = true;
        int rc = kvd_client_call(c, &req, &rep, CALL_MS);
        DT_CHECK(rc == KVD_OK && rep.status == KVD_OK, "evict C%u: %s", i,
                 kvd_status_str(rc ? rc : rep.status));
        kvd_msg_clear(&rep);
    }
    listing_t rest = {0};
    list_all(c, L->first_cursor, L->first_cursor_len, false, &rest);
    DT_CHECK(rest.ended, "the listing from an old cursor did not end");
    for (uint32_t k = 0; k < N_PREFIXES; k++)
        DT_CHECK(rest.seen[k] <= 1, "after the evictions prefix %u listed %u times", k,
                 rest.seen[k]);
}

static void run(kvd_test_daemon_t *d)
{
    kvd_ns_spec_t spec = ts_spec(KV_NS, OBJ_BYTES);
    ts_client_t t;
    if (ts_open(&t, d->socket, &spec, 1, false) != 0)
        return;
    static listing_t L;
    if (register_empty(t.c) && store_pages(&t)) {
        check_listing(d->socket, t.c, &L);
        if (L.ended && L.first_cursor_len > 0) { /* else the daemon is stuck */
            check_cursors(t.c, &L);
            check_cli(d->socket);
            check_pipeline(d->socket, t.c);
            check_stale(t.c, &L);
        }
    }
    DT_CHECK(ts_health_ok(t.c) == KVD_OK, "Health on the listing's connection");
    ts_close(&t);
    kvd_health_rep_t h;
    DT_CHECK(dt_health_fresh(d->socket, &h) == KVD_HEALTH_READY,
             "Health on a fresh connection did not answer ready");
    /* (kvdock stats prints 4,096 namespaces: the check's own reply instead) */
    ts_stats_t st;
    int rc = ts_stats_fresh(d->socket, true, &st);
    DT_CHECK(rc == KVD_OK && st.checked && st.check_error[0] == '\0',
             "Stats with the invariant check: %s, '%s'", kvd_status_str(rc),
             st.check_error);
}

int main(void)
{
    kvd_test_daemon_t d;
    memset(&d, 0, sizeof(d));
    if (dt_start(&d, NULL) == 0)
        run(&d);
    dt_stop(&d, SIGTERM, 10000);
    return dt_exit_status("store_list_stall");
}
