/*
 * Description: leases end by their TTL while the connection stays open.
 * With --lease-ttl 300 the Hello reply says 300 ms. A client stores one page,
 * then reserves two more and pins the stored one, and keeps the connection
 * open without publishing or releasing. Polling Stats (at most 10 s) shows
 * leases = 0 and leases_expired >= 2; then nothing is pinned or being
 * written, publishing the expired write lease answers NOT_FOUND (the text
 * says it may have expired), releasing the expired read lease answers
 * NOT_FOUND, the two reserved keys are absent (Inspect NOT_FOUND) and can be
 * reserved again, the stored page is still there, the connection still
 * answers, and the daemon's log has the TTL warning line.
 */
#include "test_store_util.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PAGE_SIZE 64

static kvd_key_t keys[3]; /* keys[0] stored; keys[1], keys[2] reserved */

static bool all_expired(const ts_stats_t *s)
{
    return s->store.leases == 0 && s->store.leases_expired >= 2;
}

static void run(const kvd_test_daemon_t *d)
{
    if (ts_make_keys(300, 3, PAGE_SIZE, keys) != 0)
        return;
    kvd_ns_spec_t spec = ts_spec(TS_KV_NS, TS_KV_BYTES);
    ts_client_t t;
    if (ts_open(&t, d->socket, &spec, 1, false) != 0)
        return;
    DT_CHECK(t.lease_ttl_ms == 300, "hello: lease_ttl_ms %llu, want 300",
             (unsigned long long)t.lease_ttl_ms);

    kvd_put_item_t items[3];
    ts_chain_items(keys, 3, NULL, 0, items);
    uint8_t res[3];
    uint64_t off[3], first = 0, wlease = 0, rlease = 0;
    ts_err_t e;
    int st = ts_reserve(t.c, t.ns[0], TS_KV_BYTES, items, 1, &first, res, off, &e);
    if (DT_CHECK(st == KVD_OK && first != 0, "reserve key 0: %s (%s)", kvd_status_str(st),
                 e.text)) {
        st = ts_publish(t.c, first, NULL, 0, &e);
        DT_CHECK(st == KVD_OK, "publish key 0: %s (%s)", kvd_status_str(st), e.text);
    }
    st = ts_reserve(t.c, t.ns[0], TS_KV_BYTES, &items[1], 2, &wlease, res, off, &e);
    DT_CHECK(st == KVD_OK && wlease != 0 && res[0] == KVD_RESERVE_ALLOCATED &&
                 res[1] == KVD_RESERVE_ALLOCATED,
             "reserve keys 1, 2: %s (%s)", kvd_status_str(st), e.text);
    st = ts_acquire(t.c, t.ns[0], TS_KV_BYTES, keys, 1, &rlease, NULL, &e);
    DT_CHECK(st == KVD_OK && rlease != 0, "acquire key 0: %s (%s)", kvd_status_str(st),
             e.text);
    if (dt_failure_count() > 0) {
        ts_close(&t);
        return;
    }

    ts_stats_t s;
    bool expired = ts_wait_stats(d->socket, 10000, all_expired, &s);
    DT_CHECK(expired, "after 10 s: leases %llu, leases_expired %llu; want 0 and >= 2",
             (unsigned long long)s.store.leases,
             (unsigned long long)s.store.leases_expired);
    DT_CHECK(s.store.pins == 0 && s.store.objects_pinned == 0 &&
                 s.store.objects_writing == 0 && s.store.writing_bytes == 0,
             "after expiry: pins %llu, pinned %llu, writing %llu (%llu bytes)",
             (unsigned long long)s.store.pins, (unsigned long long)s.store.objects_pinned,
             (unsigned long long)s.store.objects_writing,
             (unsigned long long)s.store.writing_bytes);
    DT_CHECK(s.store.objects_ready == 1, "after expiry: %llu ready, want the stored 1",
             (unsigned long long)s.store.objects_ready);
    ts_check_accounting(&s, "after expiry");

    st = ts_publish(t.c, wlease, NULL, 0, &e);
    DT_CHECK(st == KVD_ERR_NOT_FOUND,
             "publish of the expired lease: %s (%s), want not found", kvd_status_str(st),
             e.text);
    DT_CHECK(strstr(e.text, "expired") != NULL,
             "the publish error should say the lease may have expired: '%s'", e.text);
    st = ts_release(t.c, rlease, &e);
    DT_CHECK(st == KVD_ERR_NOT_FOUND, "release of the expired read lease: %s (%s)",
             kvd_status_str(st), e.text);
    for (int i = 1; i <= 2; i++) {
        kvd_obj_msg_t o;
        size_t n;
        st = ts_inspect(t.c, "", keys[i], &o, 1, &n, &e);
        DT_CHECK(st == KVD_ERR_NOT_FOUND, "inspect of expired reservation %d: %s", i,
                 kvd_status_str(st));
    }
    uint64_t again = 0;
    st = ts_reserve(t.c, t.ns[0], TS_KV_BYTES, &items[1], 2, &again, res, off, &e);
    DT_CHECK(st == KVD_OK && res[0] == KVD_RESERVE_ALLOCATED &&
                 res[1] == KVD_RESERVE_ALLOCATED,
             "reserve keys 1, 2 again: %s, %s %s", kvd_status_str(st),
             ts_result_name(res[0]), ts_result_name(res[1]));
    if (again != 0) {
        st = ts_publish(t.c, again, NULL, 0, &e);
        DT_CHECK(st == KVD_OK, "publish keys 1, 2: %s (%s)", kvd_status_str(st), e.text);
    }
    DT_CHECK(ts_health_ok(t.c) == KVD_OK, "the connection should survive its leases");
    ts_close(&t);
    DT_CHECK(kvd_test_file_contains(d->log, "passed their TTL of 300 ms"),
             "the daemon's log should have the TTL warning line");
    ts_cli_check(d->socket, "after the TTL");
}

int main(void)
{
    kvd_test_daemon_t d = {0};
    if (dt_start(&d, (const char *const[]){"--lease-ttl", "300", NULL}) == 0)
        run(&d);
    dt_stop(&d, SIGTERM, 10000);
    return dt_exit_status("daemon/store_lease_ttl");
}
