/*
 * Description: a same-host writer destroys bytes of the named pool file
 * under the daemon (issue 14): it cuts the file short (ftruncate) and
 * punches holes (fallocate). The daemon lives on, grows the file back, and
 * drops every object whose bytes were lost, so that none is served with the
 * zeros that replaced them:
 *   - objects past the cut and in a hole are gone (Acquire: not found),
 *     the others are still there, byte-exact;
 *   - a pinned object in a hole is absent for a new Acquire at once, and
 *     gone once its pin is released;
 *   - an object being written into a hole is not stored by its Publish;
 *   - Stats counts the ranges and the objects; the store's invariant check
 *     and the pool accounting hold.
 */
#include "test_store_util.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define SALT 0x6461u
#define N    16 /* objects stored first */

static uint64_t want_ranges, want_objects;

static bool lost_seen(const ts_stats_t *st)
{
    return st->store.pool_lost_ranges >= want_ranges &&
           st->store.pool_lost_objects >= want_objects;
}

/* Waits until Stats counts `ranges` ranges and `objects` objects lost. */
static bool wait_lost(const char *socket, uint64_t ranges, uint64_t objects,
                      const char *what)
{
    want_ranges = ranges;
    want_objects = objects;
    ts_stats_t st;
    bool ok = ts_wait_stats(socket, 10000, lost_seen, &st);
    return DT_CHECK(
        ok, "%s: Stats shows %llu ranges and %llu objects lost, want %llu and %llu", what,
        (unsigned long long)st.store.pool_lost_ranges,
        (unsigned long long)st.store.pool_lost_objects, (unsigned long long)ranges,
        (unsigned long long)objects);
}

/* Acquire of one key: KVD_OK (its bytes checked, released again) or the
 * status. */
static int acquire_one(ts_client_t *w, const kvd_key_t *key, bool verify)
{
    uint64_t lease = 0, off = 0;
    ts_err_t e;
    int st = ts_acquire(w->c, w->ns[0], TS_KV_BYTES, key, 1, &lease, &off, &e);
    if (st != KVD_OK)
        return st;
    if (verify)
        DT_CHECK(ts_verify(w->pool + off, TS_KV_BYTES, *key, SALT) == SIZE_MAX,
                 "a kept object reads wrong after the damage");
    ts_release(w->c, lease, &e);
    return KVD_OK;
}

static int punch(int fd, uint64_t off, uint64_t len)
{
    return fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)off,
                     (off_t)len);
}

static void run(const kvd_test_daemon_t *d)
{
    ts_client_t w;
    kvd_ns_spec_t spec = ts_spec(TS_KV_NS, TS_KV_BYTES);
    if (ts_open(&w, d->socket, &spec, 1, true) != 0)
        return;
    kvd_key_t keys[N + 2];
    ts_make_keys(11, N + 2, 64, keys);
    kvd_put_item_t items[N + 2];
    ts_chain_items(keys, N + 2, NULL, 0, items);
    uint64_t lease = 0, off[N + 2];
    uint8_t res[N + 2];
    ts_err_t e;
    int st = ts_reserve(w.c, w.ns[0], TS_KV_BYTES, items, N, &lease, res, off, &e);
    if (!DT_CHECK(st == KVD_OK, "reserve: %s (%s)", kvd_status_str(st), e.text))
        goto out;
    for (int k = 0; k < N; k++)
        ts_fill(w.pool + off[k], TS_KV_BYTES, keys[k], SALT);
    st = ts_publish(w.c, lease, NULL, 0, &e);
    if (!DT_CHECK(st == KVD_OK, "publish: %s (%s)", kvd_status_str(st), e.text))
        goto out;

    /* 1. cut the file at the highest object: it alone lies past the cut */
    int top = 0;
    for (int k = 1; k < N; k++)
        if (off[k] > off[top])
            top = k;
    if (!DT_CHECK(ftruncate(w.pool_fd, (off_t)off[top]) == 0, "ftruncate: %s",
                  strerror(errno)))
        goto out;
    if (!wait_lost(d->socket, 1, 1, "the cut"))
        goto out;
    struct stat sb;
    DT_CHECK(fstat(w.pool_fd, &sb) == 0 && (uint64_t)sb.st_size == w.pool_bytes,
             "the pool file is %lld bytes after the cut, want it grown back to %llu",
             (long long)sb.st_size, (unsigned long long)w.pool_bytes);
    DT_CHECK(kill(d->pid, 0) == 0 && ts_health_ok(w.c) == KVD_OK,
             "the daemon died of the cut");
    DT_CHECK(acquire_one(&w, &keys[top], false) == KVD_ERR_NOT_FOUND,
             "the object past the cut can still be acquired");

    /* 2. a hole punched through one object */
    int holed = top == 0 ? 1 : 0;
    DT_CHECK(punch(w.pool_fd, off[holed], TS_KV_BYTES) == 0, "punch: %s",
             strerror(errno));
    if (!wait_lost(d->socket, 2, 2, "the hole"))
        goto out;
    DT_CHECK(acquire_one(&w, &keys[holed], false) == KVD_ERR_NOT_FOUND,
             "the punched object can still be acquired");

    /* 3. a pinned object in a hole: absent at once, gone at its release */
    int pinned = -1;
    for (int k = 0; k < N && pinned < 0; k++)
        if (k != top && k != holed)
            pinned = k;
    uint64_t plea = 0, poff = 0;
    st = ts_acquire(w.c, w.ns[0], TS_KV_BYTES, &keys[pinned], 1, &plea, &poff, &e);
    if (!DT_CHECK(st == KVD_OK, "acquire to pin: %s", kvd_status_str(st)))
        goto out;
    DT_CHECK(punch(w.pool_fd, poff, TS_KV_BYTES) == 0, "punch: %s", strerror(errno));
    if (!wait_lost(d->socket, 3, 3, "the pinned hole"))
        goto out;
    DT_CHECK(acquire_one(&w, &keys[pinned], false) == KVD_ERR_NOT_FOUND,
             "a lost object under a pin can still be acquired");
    ts_stats_t before, after;
    ts_stats(w.c, false, &before);
    ts_release(w.c, plea, &e);
    ts_stats(w.c, false, &after);
    DT_CHECK(after.store.objects_ready + 1 == before.store.objects_ready,
             "the lost pinned object stays after its release (%llu -> %llu ready)",
             (unsigned long long)before.store.objects_ready,
             (unsigned long long)after.store.objects_ready);

    /* 4. an object being written into a hole: its Publish does not store it */
    uint64_t wlea = 0, woff = 0;
    uint8_t wres = 0;
    st = ts_reserve(w.c, w.ns[0], TS_KV_BYTES, &items[N], 1, &wlea, &wres, &woff, &e);
    if (!DT_CHECK(st == KVD_OK && wres == KVD_RESERVE_ALLOCATED, "reserve: %s",
                  kvd_status_str(st)))
        goto out;
    ts_fill(w.pool + woff, TS_KV_BYTES, keys[N], SALT);
    DT_CHECK(punch(w.pool_fd, woff, TS_KV_BYTES) == 0, "punch: %s", strerror(errno));
    if (!wait_lost(d->socket, 4, 4, "the hole under a write"))
        goto out;
    st = ts_publish(w.c, wlea, NULL, 0, &e);
    DT_CHECK(st == KVD_OK, "publish over a hole: %s (%s)", kvd_status_str(st), e.text);
    DT_CHECK(acquire_one(&w, &keys[N], false) == KVD_ERR_NOT_FOUND,
             "an object written into a hole was stored");

    /* 5. everything else is there, byte-exact */
    for (int k = 0; k < N; k++)
        if (k != top && k != holed && k != pinned)
            DT_CHECK(acquire_one(&w, &keys[k], true) == KVD_OK,
                     "object %d, untouched, is gone", k);
    /* the hole is allocated again: the pool stays as populated as sized */
    DT_CHECK(fstat(w.pool_fd, &sb) == 0 && (uint64_t)sb.st_blocks * 512 >= w.pool_bytes,
             "the pool file has %llu bytes allocated, want %llu",
             (unsigned long long)sb.st_blocks * 512, (unsigned long long)w.pool_bytes);
    ts_stats(w.c, false, &after);
    ts_check_accounting(&after, "after the damage");
    ts_cli_check(d->socket, "after the damage");
out:
    ts_close(&w);
}

int main(void)
{
    return dt_main("daemon/pool_damage", NULL, run);
}
