/*
 * Description: ListPrefixes over parent links a client wrote to hurt it.
 * Depths and parents come from clients, so the daemon may trust neither to
 * be acyclic or small. In one namespace a client reserves and publishes:
 *   - A (parent B, depth 5) and B (parent A, depth 5): a cycle;
 *   - C (parent A, depth 0xffffff): a leaf claiming a huge depth;
 *   - S (parent S, depth 7): a page that is its own parent;
 *   - G0, G1, G2: a genuine chain (depths 0, 1, 2, each the parent of the
 *     next).
 * Then ListPrefixes (the RPC, once for every namespace and once for this
 * one, with and without nodes) completes within the call's 5 s timeout
 * (not a timing assertion: a call that never ends fails it) with status OK;
 * every entry has 1 to 7 pages (never more than the objects stored) and
 * bytes = pages x object size; G2's entry has exactly 3 pages, root G0;
 * C's entry stops at C (A is not at depth 0xfffffe); no more nodes than
 * objects. `kvdock prefixes`, `--json` and `--tree` exit 0 with the same
 * picture (the 3-page chain, no page count above 7). The daemon then still
 * answers Health ready, `stats --check` passes, and it exits 0 on SIGTERM
 * with a clean log.
 */
#include "test_store_util.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NS_NAME      "hostile/kv"
#define OBJ_BYTES    4096u
#define N_OBJECTS    7u
#define CALL_TIMEOUT 5000

enum { K_A, K_B, K_C, K_S, K_G0, K_G1, K_G2, K_COUNT };
static const char *const key_names[K_COUNT] = {"A", "B", "C", "S", "G0", "G1", "G2"};

static kvd_key_t keys[K_COUNT];
static char out[1 << 16];

static void mkkeys(void)
{
    for (int i = 0; i < K_COUNT; i++) {
        memset(keys[i], 0, KVD_KEY_BYTES);
        keys[i][0] = 0xc0;
        keys[i][1] = (uint8_t)(i + 1);
        keys[i][31] = 0x77;
    }
}

static kvd_put_item_t item(int k, int parent, uint32_t depth)
{
    kvd_put_item_t it;
    memset(&it, 0, sizeof(it));
    memcpy(it.key, keys[k], KVD_KEY_BYTES);
    it.has_parent = parent >= 0;
    if (parent >= 0)
        memcpy(it.parent, keys[parent], KVD_KEY_BYTES);
    it.depth = depth;
    return it;
}

/* Reserves and publishes the hostile pages and the genuine chain. */
static bool store_pages(ts_client_t *t)
{
    kvd_put_item_t items[K_COUNT] = {
        item(K_A, K_B, 5),   item(K_B, K_A, 5), item(K_C, K_A, 0xffffffu),
        item(K_S, K_S, 7),   item(K_G0, -1, 0), item(K_G1, K_G0, 1),
        item(K_G2, K_G1, 2),
    };
    uint8_t res[K_COUNT];
    uint64_t off[K_COUNT], lease = 0;
    ts_err_t e;
    int st = ts_reserve(t->c, t->ns[0], OBJ_BYTES, items, K_COUNT, &lease, res, off, &e);
    if (!DT_CHECK(st == KVD_OK && lease != 0, "reserve: %s (%s)", kvd_status_str(st),
                  e.text))
        return false;
    bool ok = true;
    for (int i = 0; i < K_COUNT; i++)
        ok &= DT_CHECK(res[i] == KVD_RESERVE_ALLOCATED, "reserve of %s: %s", key_names[i],
                       ts_result_name(res[i]));
    st = ts_publish(t->c, lease, NULL, 0, &e);
    return DT_CHECK(st == KVD_OK, "publish: %s (%s)", kvd_status_str(st), e.text) && ok;
}

/* The name of a key of ours, or "?". */
static const char *name_of(const uint8_t *key)
{
    for (int i = 0; i < K_COUNT; i++)
        if (memcmp(key, keys[i], KVD_KEY_BYTES) == 0)
            return key_names[i];
    return "?";
}

/* One ListPrefixes call (ns_name "" = every namespace) and its checks. */
static void check_list(kvd_client_t *c, const char *ns_name, bool nodes)
{
    kvd_msg_t *req = calloc(2, sizeof(kvd_msg_t));
    if (!DT_CHECK(req != NULL, "out of memory"))
        return;
    kvd_msg_t *rep = req + 1;
    kvd_msg_request(req, 0, KVD_METHOD_LIST_PREFIXES);
    kvd_strlcpy(req->body.list_req.ns_name, ns_name, KVD_NS_NAME_BYTES);
    req->body.list_req.nodes = nodes;
    int rc = kvd_client_call(c, req, rep, CALL_TIMEOUT);
    const char *what = ns_name[0] ? ns_name : "(all)";
    if (!DT_CHECK(rc == KVD_OK, "ListPrefixes %s nodes=%d: the call failed: %s", what,
                  nodes, kvd_status_str(rc)) ||
        !DT_CHECK(rep->status == KVD_OK, "ListPrefixes %s nodes=%d: %s (%s)", what, nodes,
                  kvd_status_str(rep->status), rep->error))
        goto done;
    const kvd_list_rep_t *l = &rep->body.list_rep;
    bool saw_chain = false, saw_c = false;
    for (size_t i = 0; i < l->n_prefixes; i++) {
        const kvd_prefix_msg_t *p = &l->prefixes[i];
        const char *leaf = name_of(p->leaf), *root = name_of(p->root);
        DT_CHECK(p->pages >= 1 && p->pages <= N_OBJECTS,
                 "ListPrefixes %s: entry leaf %s root %s has %u pages; %u objects are "
                 "stored",
                 what, leaf, root, p->pages, N_OBJECTS);
        DT_CHECK(p->bytes == (uint64_t)p->pages * OBJ_BYTES,
                 "ListPrefixes %s: entry leaf %s: %llu bytes for %u pages", what, leaf,
                 (unsigned long long)p->bytes, p->pages);
        if (memcmp(p->leaf, keys[K_G2], KVD_KEY_BYTES) == 0) {
            saw_chain = true;
            DT_CHECK(p->pages == 3 && memcmp(p->root, keys[K_G0], KVD_KEY_BYTES) == 0,
                     "ListPrefixes %s: the genuine chain lists as %u pages from root %s, "
                     "want 3 from G0",
                     what, p->pages, root);
        }
        if (memcmp(p->leaf, keys[K_C], KVD_KEY_BYTES) == 0) {
            saw_c = true;
            DT_CHECK(p->pages == 1 && memcmp(p->root, keys[K_C], KVD_KEY_BYTES) == 0,
                     "ListPrefixes %s: C (depth 0xffffff over A at depth 5) lists as %u "
                     "pages from root %s, want 1 from C",
                     what, p->pages, root);
        }
    }
    DT_CHECK(saw_chain,
             "ListPrefixes %s: no entry for the genuine chain (leaf G2) among "
             "%zu entries",
             what, l->n_prefixes);
    DT_CHECK(saw_c, "ListPrefixes %s: no entry for the leaf C among %zu entries", what,
             l->n_prefixes);
    DT_CHECK(l->n_prefixes <= N_OBJECTS, "ListPrefixes %s: %zu entries for %u objects",
             what, l->n_prefixes, N_OBJECTS);
    DT_CHECK(l->n_nodes <= (nodes ? N_OBJECTS : 0), "ListPrefixes %s nodes=%d: %zu nodes",
             what, nodes, l->n_nodes);
    DT_CHECK(!l->truncated, "ListPrefixes %s: truncated for %u objects", what, N_OBJECTS);
    printf("ListPrefixes %s nodes=%d: %zu entries, %zu nodes\n", what, nodes,
           l->n_prefixes, l->n_nodes);
done:
    kvd_msg_clear(rep);
    free(req);
}

/* Runs kvdock --socket S args...; returns the exit status. */
static int cli_s(const char *socket, const char *const *args)
{
    return dt_cli_at(out, sizeof(out), socket, args);
}

/* Every "pages": N in the JSON is at most N_OBJECTS; returns how many. */
static int json_pages_ok(const char *json, const char *what)
{
    int n = 0;
    for (const char *p = strstr(json, "\"pages\":"); p; p = strstr(p + 1, "\"pages\":")) {
        unsigned long v = strtoul(p + 8, NULL, 10);
        DT_CHECK(v >= 1 && v <= N_OBJECTS, "%s: an entry with %lu pages (%u objects)",
                 what, v, N_OBJECTS);
        n++;
    }
    return n;
}

static void check_cli(const char *socket)
{
    char g0[17], g2[17], want[120];
    ts_hex8(keys[K_G0], g0);
    ts_hex8(keys[K_G2], g2);
    int rc = cli_s(socket, (const char *[]){"prefixes", NULL});
    DT_CHECK(rc == 0, "kvdock prefixes: exit %d:\n%s", rc, out);
    snprintf(want, sizeof(want), "%s  root %s  leaf %s  3 pages", NS_NAME, g0, g2);
    DT_CHECK(strstr(out, want) != NULL, "kvdock prefixes should list '%s':\n%s", want,
             out);
    for (const char *p = strstr(out, " pages "); p; p = strstr(p + 1, " pages ")) {
        const char *q = p;
        while (q > out && q[-1] >= '0' && q[-1] <= '9')
            q--;
        unsigned long v = strtoul(q, NULL, 10);
        DT_CHECK(v >= 1 && v <= N_OBJECTS, "kvdock prefixes: an entry of %lu pages:\n%s",
                 v, out);
    }

    rc = cli_s(socket, (const char *[]){"prefixes", "--json", NULL});
    DT_CHECK(rc == 0 && dt_json_valid(out), "kvdock prefixes --json: exit %d, '%s'", rc,
             out);
    DT_CHECK(json_pages_ok(out, "kvdock prefixes --json") >= 2,
             "kvdock prefixes --json should have the chain and C: '%s'", out);

    rc = cli_s(socket,
               (const char *[]){"prefixes", "--tree", "--namespace", NS_NAME, NULL});
    snprintf(want, sizeof(want), "%s depth 0", g0);
    DT_CHECK(rc == 0 && strstr(out, want) != NULL,
             "kvdock prefixes --tree: exit %d, should print the root '%s':\n%s", rc, want,
             out);
}

static void run(kvd_test_daemon_t *d)
{
    mkkeys();
    kvd_ns_spec_t spec = ts_spec(NS_NAME, OBJ_BYTES);
    ts_client_t t;
    if (ts_open(&t, d->socket, &spec, 1, false) != 0)
        return;
    if (store_pages(&t)) {
        check_list(t.c, "", false);
        check_list(t.c, "", true);
        check_list(t.c, NS_NAME, false);
        check_list(t.c, NS_NAME, true);
        check_cli(d->socket);
    }
    DT_CHECK(ts_health_ok(t.c) == KVD_OK, "Health on the client's connection");
    ts_close(&t);
    kvd_health_rep_t h;
    DT_CHECK(dt_health_fresh(d->socket, &h) == KVD_HEALTH_READY,
             "Health on a fresh connection did not answer ready");
    ts_stats_t st;
    if (DT_CHECK(ts_stats_fresh(d->socket, false, &st) == KVD_OK, "Stats failed"))
        DT_CHECK(st.store.objects_ready == N_OBJECTS, "%llu objects ready, want %u",
                 (unsigned long long)st.store.objects_ready, N_OBJECTS);
    ts_cli_check(d->socket, "after the hostile listings");
}

int main(void)
{
    kvd_test_daemon_t d;
    memset(&d, 0, sizeof(d));
    if (dt_start(&d, NULL) == 0)
        run(&d);
    dt_stop(&d, SIGTERM, 10000);
    return dt_exit_status("store_list_hostile");
}
