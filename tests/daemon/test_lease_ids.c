/*
 * Description: lease ids tell nothing. Issue 11: ids were sequential (a
 * client could name its neighbours' leases) and the reply to another
 * connection's live lease (PERMISSION, "belongs to another connection")
 * differed from a dead or unknown one (NOT_FOUND). Here connection A takes
 * 16 write leases: their ids are non-zero, distinct, and not a sequence
 * (they spread over more than 2^40, which 16 random 64-bit ids miss with
 * odds of about 2^-360). A keeps one lease live and revokes one (dead).
 * Connection B then calls Publish, Revoke and Release on A's live id, on
 * the dead id and on a random id: for each method the three replies have
 * the same code (NOT_FOUND) and the same text, and the text does not
 * contain the id. A's live lease is untouched: A still publishes it.
 */
#include "test_store_util.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#define N_LEASES 16

int main(void)
{
    kvd_test_daemon_t d;
    ts_client_t a = {.pool_fd = -1}, b = {.pool_fd = -1};
    const kvd_ns_spec_t spec = ts_spec(TS_KV_NS, TS_KV_BYTES);
    if (dt_start(&d, NULL) != 0 || ts_open(&a, d.socket, &spec, 1, false) != 0 ||
        ts_open(&b, d.socket, &spec, 1, false) != 0)
        goto out;

    kvd_key_t keys[N_LEASES];
    if (ts_make_keys(1000, N_LEASES, 16, keys) != 0)
        goto out;
    uint64_t ids[N_LEASES];
    ts_err_t e;
    for (size_t i = 0; i < N_LEASES; i++) {
        kvd_put_item_t item;
        ts_chain_items(&keys[i], 1, NULL, (uint32_t)i, &item);
        uint8_t res;
        uint64_t off;
        int st = ts_reserve(a.c, a.ns[0], TS_KV_BYTES, &item, 1, &ids[i], &res, &off, &e);
        if (!DT_CHECK(st == KVD_OK && res == KVD_RESERVE_ALLOCATED && ids[i] != 0,
                      "A: reserve %zu: %s (%s)", i, kvd_status_str(st), e.text))
            goto out;
    }
    uint64_t lo = UINT64_MAX, hi = 0;
    for (size_t i = 0; i < N_LEASES; i++) {
        lo = KVD_MIN(lo, ids[i]);
        hi = KVD_MAX(hi, ids[i]);
        for (size_t k = 0; k < i; k++)
            DT_CHECK(ids[i] != ids[k], "lease ids %zu and %zu are both %llu", k, i,
                     (unsigned long long)ids[i]);
    }
    DT_CHECK(hi - lo > (1ull << 40),
             "16 lease ids within %llu of each other (%llu..%llu): a sequence",
             (unsigned long long)(hi - lo), (unsigned long long)lo,
             (unsigned long long)hi);

    uint64_t live = ids[0], dead = ids[1];
    int st = ts_finish(a.c, KVD_METHOD_REVOKE, dead, NULL, 0, &e);
    DT_CHECK(st == KVD_OK, "A: revoke: %s (%s)", kvd_status_str(st), e.text);
    uint64_t random_id = 0;
    while (random_id == 0 || random_id == live || random_id == dead)
        if (getrandom(&random_id, sizeof(random_id), 0) != sizeof(random_id))
            random_id = 0x5eed5eed5eed5eedull;

    const kvd_method_t methods[] = {KVD_METHOD_PUBLISH, KVD_METHOD_REVOKE,
                                    KVD_METHOD_RELEASE};
    const uint64_t tried[3] = {live, dead, random_id};
    const char *names[3] = {"A's live lease", "a dead lease", "a random id"};
    for (size_t m = 0; m < KVD_ARRAY_SIZE(methods); m++) {
        ts_err_t got[3];
        for (size_t t = 0; t < 3; t++) {
            int rc = methods[m] == KVD_METHOD_RELEASE
                         ? ts_release(b.c, tried[t], &got[t])
                         : ts_finish(b.c, methods[m], tried[t], NULL, 0, &got[t]);
            DT_CHECK(rc == KVD_ERR_NOT_FOUND && got[t].status == KVD_ERR_NOT_FOUND,
                     "B: %s of %s: %s, want not found (%s)", kvd_method_name(methods[m]),
                     names[t], kvd_status_str(rc), got[t].text);
            char id[24];
            snprintf(id, sizeof(id), "%llu", (unsigned long long)tried[t]);
            DT_CHECK(strstr(got[t].text, id) == NULL,
                     "B: %s of %s: the text repeats the id: %s",
                     kvd_method_name(methods[m]), names[t], got[t].text);
        }
        for (size_t t = 1; t < 3; t++)
            DT_CHECK(
                got[t].status == got[0].status && strcmp(got[t].text, got[0].text) == 0,
                "B: %s: the reply for %s (%d \"%s\") differs from the one for %s (%d "
                "\"%s\")",
                kvd_method_name(methods[m]), names[t], got[t].status, got[t].text,
                names[0], got[0].status, got[0].text);
    }
    st = ts_publish(a.c, live, NULL, 0, &e);
    DT_CHECK(st == KVD_OK, "A: publish of its live lease after B's tries: %s (%s)",
             kvd_status_str(st), e.text);
out:
    ts_close(&a);
    ts_close(&b);
    dt_stop(&d, SIGTERM, 10000);
    return dt_exit_status("daemon/lease_ids");
}
