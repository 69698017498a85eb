/*
 * Description: Evict of a namespace is bounded per call (issue 11, hole 5:
 * every request's work bounded). A client publishes N_BIG = 12,000 objects
 * in slice/big/tp0 and 10 in slice/small/tp0, pins one object of the big
 * namespace with Acquire, then:
 *   - Evict of the big namespace, without a cursor, evicts some but not all
 *     (the daemon walks at most 8,192 records a call) and returns
 *     next_cursor; skipped then counts what is still stored beside the
 *     pinned one;
 *   - following next_cursor, the calls end (at most 100) with a reply
 *     without a cursor; together they evicted N_BIG - 1 objects, and the
 *     last reply's skipped is 1 (the pinned object);
 *   - the small namespace kept its 10 objects; the pinned object is still
 *     there (Inspect);
 *   - forged cursors are refused with KVD_ERR_INVALID: a changed byte, one
 *     cut short, one of the listing's kind (ListPrefixes), one for another
 *     namespace; a cursor with a key is refused too;
 *   - `kvdock evict --namespace slice/small/tp0 --json` says evicted 10,
 *     complete; Stats' invariant check passes; the daemon exits 0 on
 *     SIGTERM with a clean log.
 * Before the fix one call evicted everything: no cursor came back.
 */
#include "test_store_util.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BIG_NS    "slice/big/tp0"
#define SMALL_NS  "slice/small/tp0"
#define OBJ_BYTES 4096u
#define N_BIG     12000u
#define N_SMALL   10u
#define CALLS_MAX 100u
#define CALL_MS   10000

static char out[1 << 16];

static void key_of(uint32_t i, uint8_t *key)
{
    memset(key, 0, KVD_KEY_BYTES);
    memcpy(key, &i, sizeof(i));
    key[31] = 0x3c;
}

/* Publishes keys first..first+n-1 in namespace ns, batches of 4,000. */
static bool fill(ts_client_t *t, uint32_t ns, uint32_t first, uint32_t n)
{
    kvd_put_item_t *items = calloc(4000, sizeof(*items));
    uint8_t *res = calloc(4000, 1);
    uint64_t *off = calloc(4000, sizeof(*off));
    bool ok = DT_CHECK(items && res && off, "out of memory");
    for (uint32_t done = 0; ok && done < n;) {
        uint32_t k = KVD_MIN(n - done, 4000u);
        for (uint32_t i = 0; i < k; i++) {
            memset(&items[i], 0, sizeof(items[i]));
            key_of(first + done + i, items[i].key);
        }
        uint64_t lease = 0;
        ts_err_t e;
        int st = ts_reserve(t->c, ns, OBJ_BYTES, items, k, &lease, res, off, &e);
        ok = DT_CHECK(st == KVD_OK, "reserve: %s (%s)", kvd_status_str(st), e.text);
        for (uint32_t i = 0; ok && i < k; i++)
            ok = DT_CHECK(res[i] == KVD_RESERVE_ALLOCATED, "reserve item %u: %s",
                          done + i, ts_result_name(res[i]));
        st = ok ? ts_publish(t->c, lease, NULL, 0, &e) : KVD_OK;
        ok = ok && DT_CHECK(st == KVD_OK, "publish: %s (%s)", kvd_status_str(st), e.text);
        done += k;
    }
    free(items);
    free(res);
    free(off);
    return ok;
}

/* One Evict call; the reply stays in rep (the caller clears it). */
static int evict(kvd_client_t *c, const char *ns_name, const uint8_t *key,
                 const uint8_t *cursor, size_t cursor_len, kvd_msg_t *rep)
{
    kvd_msg_t req;
    kvd_msg_request(&req, 0, KVD_METHOD_EVICT);
    kvd_evict_req_t *e = &req.body.evict_req;
    kvd_strlcpy(e->ns_name, ns_name, KVD_NS_NAME_BYTES);
    if (key != NULL) {
        memcpy(e->key, key, KVD_KEY_BYTES);
        e->has_key = true;
    }
    memcpy(e->cursor, cursor, cursor_len);
    e->cursor_len = cursor_len;
    int rc = kvd_client_call(c, &req, rep, CALL_MS);
    return rc != KVD_OK ? rc : rep->status;
}

static void check_forged(kvd_client_t *c, const uint8_t *cursor, size_t len)
{
    kvd_msg_t rep;
    uint8_t bad[KVD_CURSOR_MAX];
    for (size_t at = 0; at < len; at += len / 3) {
        memcpy(bad, cursor, len);
        bad[at] ^= 0x11;
        int st = evict(c, BIG_NS, NULL, bad, len, &rep);
        DT_CHECK(st == KVD_ERR_INVALID, "an Evict cursor with byte %zu changed: %s", at,
                 kvd_status_str(st));
        kvd_msg_clear(&rep);
    }
    int st = evict(c, BIG_NS, NULL, cursor, len - 1, &rep);
    DT_CHECK(st == KVD_ERR_INVALID, "an Evict cursor cut short: %s", kvd_status_str(st));
    kvd_msg_clear(&rep);
    st = evict(c, SMALL_NS, NULL, cursor, len, &rep);
    DT_CHECK(st == KVD_ERR_INVALID, "the big namespace's cursor for the small one: %s",
             kvd_status_str(st));
    kvd_msg_clear(&rep);
    uint8_t key[KVD_KEY_BYTES];
    key_of(0, key);
    st = evict(c, BIG_NS, key, cursor, len, &rep);
    DT_CHECK(st == KVD_ERR_INVALID, "a cursor with a key: %s", kvd_status_str(st));
    kvd_msg_clear(&rep);

    /* a listing's cursor is not an eviction's */
    kvd_msg_t req;
    kvd_msg_request(&req, 0, KVD_METHOD_LIST_PREFIXES);
    req.body.list_req.limit = 1;
    int rc = kvd_client_call(c, &req, &rep, CALL_MS);
    if (DT_CHECK(rc == KVD_OK && rep.status == KVD_OK &&
                     rep.body.list_rep.next_cursor_len > 0,
                 "ListPrefixes with limit 1 over %u objects: no cursor", N_BIG)) {
        size_t n = rep.body.list_rep.next_cursor_len;
        memcpy(bad, rep.body.list_rep.next_cursor, n);
        kvd_msg_clear(&rep);
        st = evict(c, "", NULL, bad, n, &rep);
        DT_CHECK(st == KVD_ERR_INVALID, "a ListPrefixes cursor given to Evict: %s",
                 kvd_status_str(st));
    }
    kvd_msg_clear(&rep);
}

static void run(kvd_test_daemon_t *d)
{
    kvd_ns_spec_t specs[2] = {ts_spec(BIG_NS, OBJ_BYTES), ts_spec(SMALL_NS, OBJ_BYTES)};
    ts_client_t t;
    if (ts_open(&t, d->socket, specs, 2, false) != 0)
        return;
    if (!fill(&t, t.ns[0], 0, N_BIG) || !fill(&t, t.ns[1], 1000000, N_SMALL)) {
        ts_close(&t);
        return;
    }
    kvd_key_t pinned;
    key_of(N_BIG / 2, pinned);
    uint64_t lease = 0, off = 0;
    ts_err_t e;
    int st = ts_acquire(t.c, t.ns[0], OBJ_BYTES, &pinned, 1, &lease, &off, &e);
    DT_CHECK(st == KVD_OK, "acquire: %s (%s)", kvd_status_str(st), e.text);

    kvd_msg_t rep;
    uint8_t cursor[KVD_CURSOR_MAX], first[KVD_CURSOR_MAX];
    size_t cursor_len = 0, first_len = 0;
    uint64_t evicted = 0, skipped = 0;
    uint32_t calls = 0;
    bool ended = false;
    while (calls < CALLS_MAX) {
        st = evict(t.c, BIG_NS, NULL, cursor, cursor_len, &rep);
        if (!DT_CHECK(st == KVD_OK, "Evict call %u: %s (%s)", calls, kvd_status_str(st),
                      rep.error)) {
            kvd_msg_clear(&rep);
            break;
        }
        const kvd_evict_rep_t *r = &rep.body.evict_rep;
        if (calls == 0) {
            DT_CHECK(r->evicted < N_BIG - 1 && r->next_cursor_len > 0,
                     "the first Evict of %u objects evicted %llu and %s a cursor: one "
                     "call is not bounded",
                     N_BIG, (unsigned long long)r->evicted,
                     r->next_cursor_len ? "returned" : "did not return");
            DT_CHECK(r->skipped == N_BIG - r->evicted,
                     "the first Evict: skipped %llu, want the %llu still stored",
                     (unsigned long long)r->skipped,
                     (unsigned long long)(N_BIG - r->evicted));
            memcpy(first, r->next_cursor, r->next_cursor_len);
            first_len = r->next_cursor_len;
        }
        calls++;
        evicted += r->evicted;
        skipped = r->skipped;
        cursor_len = r->next_cursor_len;
        memcpy(cursor, r->next_cursor, cursor_len);
        kvd_msg_clear(&rep);
        if (cursor_len == 0) {
            ended = true;
            break;
        }
    }
    DT_CHECK(ended && calls >= 2, "the eviction did not end in %u calls (%u made)",
             CALLS_MAX, calls);
    DT_CHECK(evicted == N_BIG - 1 && skipped == 1,
             "Evict of %u objects with one pinned: %llu evicted in %u calls, the last "
             "skipped %llu; want %u and 1",
             N_BIG, (unsigned long long)evicted, calls, (unsigned long long)skipped,
             N_BIG - 1);
    printf("Evict of %u objects: %u calls\n", N_BIG, calls);

    kvd_obj_msg_t objs[2];
    size_t n = 0;
    st = ts_inspect(t.c, BIG_NS, pinned, objs, 2, &n, &e);
    DT_CHECK(st == KVD_OK && n == 1, "the pinned object: %s, %zu found",
             kvd_status_str(st), n);
    ts_stats_t s;
    if (DT_CHECK(ts_stats(t.c, false, &s) == KVD_OK, "Stats")) {
        const kvd_ns_msg_t *small = ts_stats_ns(&s, SMALL_NS);
        DT_CHECK(small && small->objects_ready == N_SMALL,
                 "the small namespace has %llu objects, want %u",
                 small ? (unsigned long long)small->objects_ready : 0ull, N_SMALL);
    }
    if (first_len > 0)
        check_forged(t.c, first, first_len);
    DT_CHECK(ts_release(t.c, lease, &e) == KVD_OK, "release: %s", e.text);

    int rc =
        dt_cli_at(out, sizeof(out), d->socket,
                  (const char *[]){"evict", "--namespace", SMALL_NS, "--json", NULL});
    uint64_t v = 0;
    DT_CHECK(rc == 0 && dt_json_u64(out, NULL, "evicted", &v) && v == N_SMALL &&
                 strstr(out, "\"complete\":true") != NULL,
             "kvdock evict --namespace %s --json: exit %d, '%s'", SMALL_NS, rc, out);
    ts_close(&t);
    ts_cli_check(d->socket, "after the evictions");
}

int main(void)
{
    kvd_test_daemon_t d;
    memset(&d, 0, sizeof(d));
    if (dt_start(&d, NULL) == 0)
        run(&d);
    dt_stop(&d, SIGTERM, 10000);
    return dt_exit_status("store_evict_slices");
}
