/*
 * Description: namespaces with neither users nor objects are removed, so
 * the table of 4,096 cannot fill for ever (issue 11 item 3). One
 * connection registers the whole table and closes: another can register
 * again. A namespace with an object outlives the connection that made it,
 * until its last object is evicted; its old id is then unknown, and the
 * name registered again gets a new id.
 */
#include "test_store_util.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define N_FILL 4096 /* KVD_STORE_MAX_NAMESPACES of the store */

static int reg_one(kvd_client_t *c, const char *name, uint32_t *id, ts_err_t *e)
{
    kvd_ns_spec_t spec = ts_spec(name, TS_KV_BYTES);
    return ts_register(c, &spec, 1, id, e);
}

static bool ns_count_is(const char *socket, uint64_t removed_at_least, uint64_t *removed)
{
    ts_stats_t st;
    if (ts_stats_fresh(socket, false, &st) != KVD_OK)
        return false;
    *removed = st.store.namespaces_removed;
    return st.store.namespaces_removed >= removed_at_least;
}

static void run(kvd_test_daemon_t *d)
{
    /* the whole table, by one connection, no objects */
    static kvd_ns_spec_t specs[N_FILL];
    static uint32_t ids[N_FILL];
    for (int i = 0; i < N_FILL; i++) {
        char name[32];
        snprintf(name, sizeof(name), "fill/%04d", i);
        specs[i] = ts_spec(name, 4096);
    }
    ts_client_t a;
    if (ts_open(&a, d->socket, NULL, 0, false) != 0)
        return;
    ts_err_t e;
    int st = ts_register(a.c, specs, N_FILL, ids, &e);
    DT_CHECK(st == KVD_OK, "registering %d namespaces: %s (%s)", N_FILL,
             kvd_status_str(st), e.text);
    ts_client_t b;
    if (ts_open(&b, d->socket, NULL, 0, false) != 0) {
        ts_close(&a);
        return;
    }
    uint32_t id = 0;
    st = reg_one(b.c, "model/kv/tp0", &id, &e);
    DT_CHECK(st == KVD_ERR_NO_SPACE, "the table is full: %s, want no space",
             kvd_status_str(st));
    ts_close(&a);
    /* the server tells the store a connection went; wait (bounded) */
    uint64_t removed = 0;
    for (int i = 0; i < 500 && !ns_count_is(d->socket, N_FILL, &removed); i++)
        usleep(10000);
    DT_CHECK(removed >= N_FILL, "%llu namespaces removed after their user left, want %d",
             (unsigned long long)removed, N_FILL);
    st = reg_one(b.c, "model/kv/tp0", &id, &e);
    DT_CHECK(st == KVD_OK, "registering after the filler left: %s (%s)",
             kvd_status_str(st), e.text);

    /* a namespace with an object outlives its user */
    ts_client_t w;
    kvd_ns_spec_t spec = ts_spec("kept/kv", TS_KV_BYTES);
    if (ts_open(&w, d->socket, &spec, 1, false) != 0)
        goto out;
    uint32_t kept = w.ns[0];
    kvd_key_t key;
    ts_make_keys(3, 1, 64, &key);
    kvd_put_item_t item;
    ts_chain_items(&key, 1, NULL, 0, &item);
    uint64_t lease = 0, off = 0;
    uint8_t res = 0;
    st = ts_reserve(w.c, kept, TS_KV_BYTES, &item, 1, &lease, &res, &off, &e);
    DT_CHECK(st == KVD_OK && res == KVD_RESERVE_ALLOCATED, "reserve: %s (%s)",
             kvd_status_str(st), e.text);
    st = ts_publish(w.c, lease, NULL, 0, &e);
    DT_CHECK(st == KVD_OK, "publish: %s (%s)", kvd_status_str(st), e.text);
    ts_close(&w);
    uint64_t before = removed;
    usleep(100000);
    kvd_obj_msg_t o;
    size_t n = 0;
    st = ts_inspect(b.c, "kept/kv", key, &o, 1, &n, &e);
    DT_CHECK(st == KVD_OK && n == 1, "the object outlives its writer: %s (%s)",
             kvd_status_str(st), e.text);
    /* its last object evicted, nobody using it: gone */
    char out[4096];
    const char *args[] = {"evict", "--namespace", "kept/kv", NULL};
    dt_cli_at(out, sizeof(out), d->socket, args);
    for (int i = 0; i < 500 && !ns_count_is(d->socket, before + 1, &removed); i++)
        usleep(10000);
    DT_CHECK(removed == before + 1, "evicting its last object removed %llu namespaces",
             (unsigned long long)(removed - before));
    st = ts_reserve(b.c, kept, TS_KV_BYTES, &item, 1, &lease, &res, &off, &e);
    DT_CHECK(st == KVD_ERR_NOT_FOUND, "Reserve with the removed id: %s, want not found",
             kvd_status_str(st));
    uint32_t again = 0;
    st = reg_one(b.c, "kept/kv", &again, &e);
    DT_CHECK(st == KVD_OK && again != kept, "registered again: %s, id %u (was %u)",
             kvd_status_str(st), again, kept);
out:
    ts_close(&b);
}

int main(void)
{
    kvd_test_daemon_t d = {0};
    if (dt_start(&d, NULL) == 0)
        run(&d);
    dt_stop(&d, SIGTERM, 10000);
    return dt_exit_status("daemon/ns_lifetime");
}
