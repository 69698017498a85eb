/*
 * Description: kvdockd restarted after SIGKILL on the same pool file and
 * journal (--shm-dir) has every acknowledged object again and nothing
 * else. The first daemon stores 48 KV pages (a chain), then reserves and
 * revokes 8 more many times until its journal has been compacted (a small
 * --journal-compact), then stores 8 mamba slots, each object written
 * through the pool mapping and published; a client then
 * reserves and half-writes 8 more pages it never publishes and pins 4
 * stored ones, and the daemon is SIGKILLed by its pid. The second daemon
 * logs what it recovered; Stats says 56 objects recovered and ready, no
 * pin, lease or reservation, the 8 partial writes quarantined, the
 * invariant holds (Stats with check and `kvdock stats --check`); a client
 * gets the namespaces under their old ids, loads all 56 through its own
 * mapping byte-exact, and finds none of the 8 partial writes (Inspect,
 * Lookup), which it can reserve again. While it runs, a third daemon of
 * the instance is refused (exit 1, naming the holder's pid). After a clean
 * SIGTERM the objects are still there. A journal of another layout
 * version is refused (exit 2, naming --fresh) and left alone; another pool
 * size is refused the same way; --mem-fraction keeps the pool file at its
 * size where the fraction would give more (every object there), and is
 * refused the same way where it would give less; --fresh starts empty with
 * zeroed bytes.
 */
#include "test_store_util.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define PAGE_SIZE 64
#define N_KV      48
#define N_MAMBA   8
#define N_HALF    8
#define N_PINNED  4
#define SALT      0x70657273u

static kvd_key_t kv[N_KV], mamba[N_MAMBA], half[N_HALF];
static char shm[64];
static char instance[64];

/* Starts a daemon on the test's pool files (expecting it ready); the
 * harness gives each one a socket directory of its own. A small
 * compaction floor: the journal is compacted while the test churns. */
static int start(kvd_test_daemon_t *d, const char *extra)
{
    const char *args[] = {"--shm-dir", shm, "--journal-compact", "4K", extra, NULL};
    return dt_start(d, args);
}

static bool compacted(const ts_stats_t *s)
{
    return s->store.journal_compactions > 0;
}

/* Reserves and revokes the partial-write keys many times: the journal grows
 * while what it describes does not, until it is compacted (on the daemon's
 * ticks, in slices, while this goes on). */
static void churn(ts_client_t *t, const kvd_test_daemon_t *d)
{
    kvd_put_item_t items[N_HALF];
    ts_chain_items(half, N_HALF, kv[N_KV - 1], N_KV, items);
    ts_stats_t s;
    bool done = false;
    for (int round = 0; round < 2000 && !done; round++) {
        uint8_t res[N_HALF];
        uint64_t off[N_HALF], lease = 0;
        ts_err_t e;
        if (ts_reserve(t->c, t->ns[0], TS_KV_BYTES, items, N_HALF, &lease, res, off,
                       &e) != KVD_OK ||
            ts_finish(t->c, KVD_METHOD_REVOKE, lease, NULL, 0, &e) != KVD_OK) {
            DT_CHECK(false, "churn: %s", e.text);
            return;
        }
        if (round % 50 == 49)
            done = ts_wait_stats(d->socket, 0, compacted, &s);
    }
    if (!done)
        done = ts_wait_stats(d->socket, 10000, compacted, &s);
    DT_CHECK(done && s.store.journal_errors == 0,
             "the journal should be compacted while the client churns: %llu compactions, "
             "%llu errors, %llu bytes",
             (unsigned long long)s.store.journal_compactions,
             (unsigned long long)s.store.journal_errors,
             (unsigned long long)s.store.journal_bytes);
}

/* Starts a daemon that must refuse: returns its exit status (-1: it did
 * not exit within 30 s); its log stays in d->log until dt_stop. */
static int start_refused(kvd_test_daemon_t *d, const char *const *extra)
{
    const char *args[12] = {"--pool-size", DT_POOL,     "--usage-interval",
                            "0",           "--shm-dir", shm};
    size_t n = 6;
    for (size_t i = 0; extra && extra[i] && n < 11; i++)
        args[n++] = extra[i];
    args[n] = NULL;
    return kvd_test_daemon_exit_status(d, args, 30000);
}

static kvd_ns_spec_t specs[2];

/* Stores keys of ns (object_bytes each): reserve, write, publish. */
static void store(ts_client_t *t, uint32_t ns, uint64_t object_bytes,
                  const kvd_key_t *keys, size_t n, bool chain)
{
    kvd_put_item_t items[N_KV];
    ts_chain_items(keys, n, NULL, 0, items);
    if (!chain)
        for (size_t i = 0; i < n; i++)
            items[i].has_parent = false;
    uint8_t res[N_KV];
    uint64_t off[N_KV], lease = 0;
    ts_err_t e;
    int st = ts_reserve(t->c, ns, object_bytes, items, n, &lease, res, off, &e);
    if (!DT_CHECK(st == KVD_OK, "reserve: %s (%s)", kvd_status_str(st), e.text))
        return;
    for (size_t i = 0; i < n; i++)
        if (DT_CHECK(res[i] == KVD_RESERVE_ALLOCATED &&
                         ts_in_pool(off[i], object_bytes, t->pool_bytes),
                     "reserve %zu: %s", i, ts_result_name(res[i])))
            ts_fill(t->pool + off[i], object_bytes, keys[i], SALT);
    st = ts_publish(t->c, lease, NULL, 0, &e);
    DT_CHECK(st == KVD_OK, "publish: %s (%s)", kvd_status_str(st), e.text);
}

/* The first daemon's life: stores, leaves partial writes and pins, dies. */
static void first_life(kvd_test_daemon_t *d, uint32_t ids[2])
{
    ts_client_t t;
    if (ts_open(&t, d->socket, specs, 2, true) != 0)
        return;
    ids[0] = t.ns[0];
    ids[1] = t.ns[1];
    store(&t, t.ns[0], TS_KV_BYTES, kv, N_KV, true);
    churn(&t, d);
    store(&t, t.ns[1], TS_MAMBA_BYTES, mamba, N_MAMBA, false);

    kvd_put_item_t items[N_HALF];
    ts_chain_items(half, N_HALF, kv[N_KV - 1], N_KV, items);
    uint8_t res[N_HALF];
    uint64_t off[N_HALF], wlease = 0, rlease = 0;
    ts_err_t e;
    int st = ts_reserve(t.c, t.ns[0], TS_KV_BYTES, items, N_HALF, &wlease, res, off, &e);
    if (DT_CHECK(st == KVD_OK, "reserve the partial writes: %s", kvd_status_str(st)))
        for (size_t i = 0; i < N_HALF; i++)
            if (res[i] == KVD_RESERVE_ALLOCATED &&
                ts_in_pool(off[i], TS_KV_BYTES, t.pool_bytes))
                ts_fill(t.pool + off[i], TS_KV_BYTES / 2, half[i], SALT);
    st = ts_acquire(t.c, t.ns[0], TS_KV_BYTES, kv, N_PINNED, &rlease, NULL, &e);
    DT_CHECK(st == KVD_OK, "pin: %s (%s)", kvd_status_str(st), e.text);
    ts_stats_t s;
    if (DT_CHECK(ts_stats(t.c, false, &s) == KVD_OK, "stats"))
        DT_CHECK(s.store.pins == N_PINNED && s.store.objects_writing == N_HALF &&
                     s.store.objects_ready == N_KV + N_MAMBA,
                 "before the kill: %llu pins, %llu writing, %llu ready",
                 (unsigned long long)s.store.pins,
                 (unsigned long long)s.store.objects_writing,
                 (unsigned long long)s.store.objects_ready);
    /* killed while the client still holds its leases and its mapping */
    kill(d->pid, SIGKILL);
    int ws = 0;
    DT_CHECK(kvd_test_wait_pid(d->pid, 10000, &ws) == 0 && WIFSIGNALED(ws) &&
                 WTERMSIG(ws) == SIGKILL,
             "the daemon did not die of SIGKILL (0x%x)", ws);
    d->pid = 0;
    ts_close(&t);
}

/* Every stored object is there, byte-exact; returns how many were. */
static size_t check_objects(ts_client_t *t)
{
    size_t good = 0;
    const struct {
        uint32_t ns;
        uint64_t bytes;
        const kvd_key_t *keys;
        size_t n;
    } sets[] = {{t->ns[0], TS_KV_BYTES, kv, N_KV},
                {t->ns[1], TS_MAMBA_BYTES, mamba, N_MAMBA}};
    for (size_t k = 0; k < 2; k++) {
        uint64_t lease = 0, off[N_KV];
        ts_err_t e;
        int st = ts_acquire(t->c, sets[k].ns, sets[k].bytes, sets[k].keys, sets[k].n,
                            &lease, off, &e);
        if (!DT_CHECK(st == KVD_OK, "acquire set %zu: %s (%s, key %u)", k,
                      kvd_status_str(st), e.text, e.index))
            continue;
        for (size_t i = 0; i < sets[k].n; i++) {
            size_t bad =
                ts_in_pool(off[i], sets[k].bytes, t->pool_bytes)
                    ? ts_verify(t->pool + off[i], sets[k].bytes, sets[k].keys[i], SALT)
                    : 0;
            if (DT_CHECK(bad == SIZE_MAX, "set %zu object %zu differs at byte %zu", k, i,
                         bad))
                good++;
        }
        ts_release(t->c, lease, NULL);
    }
    return good;
}

static void check_half_gone(ts_client_t *t)
{
    ts_err_t e;
    for (size_t i = 0; i < N_HALF; i++) {
        kvd_obj_msg_t o;
        size_t n = 0;
        int r = ts_inspect(t->c, TS_KV_NS, half[i], &o, 1, &n, &e);
        DT_CHECK(r == KVD_ERR_NOT_FOUND, "partial write %zu: inspect %s", i,
                 kvd_status_str(r));
    }
    kvd_lookup_pool_msg_t pool = {
        .ns = t->ns[0], .n_keys = N_HALF, .keys = half, .trailing_pages = 1};
    uint32_t b[N_HALF];
    size_t nb = 99;
    int r = ts_lookup(t->c, &pool, 1, b, N_HALF, &nb, &e);
    DT_CHECK(r == KVD_OK && nb == 0, "lookup of the partial writes: %s, %zu boundaries",
             kvd_status_str(r), nb);
    kvd_put_item_t items[N_HALF];
    ts_chain_items(half, N_HALF, kv[N_KV - 1], N_KV, items);
    uint8_t res[N_HALF];
    uint64_t off[N_HALF], lease = 0;
    r = ts_reserve(t->c, t->ns[0], TS_KV_BYTES, items, N_HALF, &lease, res, off, &e);
    if (DT_CHECK(r == KVD_OK, "reserve the partial writes again: %s",
                 kvd_status_str(r))) {
        for (size_t i = 0; i < N_HALF; i++)
            DT_CHECK(res[i] == KVD_RESERVE_ALLOCATED, "key %zu: %s, want allocated", i,
                     ts_result_name(res[i]));
        ts_finish(t->c, KVD_METHOD_REVOKE, lease, NULL, 0, &e);
    }
}

static void second_life(kvd_test_daemon_t *d, const uint32_t ids[2])
{
    DT_CHECK(kvd_test_file_contains(d->log, "recovered 56 objects"),
             "the log should say that 56 objects were recovered");
    DT_CHECK(kvd_test_file_contains(d->log, "discarded 8 partial writes"),
             "the log should say that the 8 partial writes were discarded");
    ts_stats_t s;
    if (DT_CHECK(ts_stats_fresh(d->socket, true, &s) == KVD_OK, "stats")) {
        const kvd_store_stats_msg_t *st = &s.store;
        DT_CHECK(st->recovered_objects == N_KV + N_MAMBA &&
                     st->recovered_bytes == N_KV * (uint64_t)TS_KV_BYTES +
                                                N_MAMBA * (uint64_t)TS_MAMBA_BYTES,
                 "recovered %llu objects, %llu bytes",
                 (unsigned long long)st->recovered_objects,
                 (unsigned long long)st->recovered_bytes);
        DT_CHECK(st->objects_ready == N_KV + N_MAMBA && st->pins == 0 &&
                     st->leases == 0 && st->objects_writing == 0 &&
                     st->writing_bytes == 0,
                 "after the restart: %llu ready, %llu pins, %llu leases, %llu writing",
                 (unsigned long long)st->objects_ready, (unsigned long long)st->pins,
                 (unsigned long long)st->leases, (unsigned long long)st->objects_writing);
        DT_CHECK(st->quarantined_bytes == N_HALF * (uint64_t)TS_KV_BYTES,
                 "the partial writes' %llu bytes quarantined, want %llu",
                 (unsigned long long)st->quarantined_bytes,
                 (unsigned long long)(N_HALF * (uint64_t)TS_KV_BYTES));
        DT_CHECK(s.checked && s.check_error[0] == '\0', "Stats(check): '%s'",
                 s.check_error);
        ts_check_accounting(&s, "after the restart");
    }
    ts_cli_check(d->socket, "after the restart");
    ts_client_t t;
    if (ts_open(&t, d->socket, specs, 2, true) != 0)
        return;
    DT_CHECK(t.ns[0] == ids[0] && t.ns[1] == ids[1],
             "namespace ids %u, %u after the restart; they were %u, %u", t.ns[0], t.ns[1],
             ids[0], ids[1]);
    DT_CHECK(check_objects(&t) == N_KV + N_MAMBA, "every stored object, byte-exact");
    check_half_gone(&t);
    ts_close(&t);
}

static void remove_shm(void)
{
    DIR *dp = opendir(shm);
    struct dirent *e;
    while (dp != NULL && (e = readdir(dp)) != NULL) {
        char p[400];
        if (e->d_name[0] != '.') {
            snprintf(p, sizeof(p), "%s/%s", shm, e->d_name);
            unlink(p);
        }
    }
    if (dp)
        closedir(dp);
    rmdir(shm);
}

/* Rewrites the journal's layout version (keeping its checksum valid), so
 * that only the version is wrong. */
static bool set_journal_version(uint32_t version)
{
    char path[200];
    snprintf(path, sizeof(path), "%s/kvdock-%s.journal", shm, instance);
    int fd = open(path, O_RDWR);
    uint8_t h[256];
    uint32_t hb = 0;
    bool ok = fd >= 0 && pread(fd, h, sizeof(h), 0) > 20;
    if (ok)
        memcpy(&hb, h + 16, 4); /* magic 8, byte order 4, version 4, size 4 */
    ok = ok && hb >= 24 && hb <= sizeof(h);
    if (ok) {
        memcpy(h + 12, &version, 4);
        uint32_t crc = kvd_crc32c(0, h, hb - 4);
        memcpy(h + hb - 4, &crc, 4);
        ok = pwrite(fd, h, hb, 0) == (ssize_t)hb;
    }
    if (fd >= 0)
        close(fd);
    return ok;
}

int main(void)
{
    snprintf(shm, sizeof(shm), "/dev/shm/kvdock-persist-XXXXXX");
    if (mkdtemp(shm) == NULL) {
        snprintf(shm, sizeof(shm), "/tmp/kvdock-persist-XXXXXX");
        if (mkdtemp(shm) == NULL)
            return 1;
    }
    snprintf(instance, sizeof(instance), "test-%d", (int)getpid());
    specs[0] = ts_spec(TS_KV_NS, TS_KV_BYTES);
    specs[1] = ts_spec(TS_MAMBA_NS, TS_MAMBA_BYTES);
    if (ts_make_keys(1000, N_KV, PAGE_SIZE, kv) != 0 ||
        ts_make_keys(30000, N_MAMBA, PAGE_SIZE, mamba) != 0 ||
        ts_make_keys(60000, N_HALF, PAGE_SIZE, half) != 0)
        return 1;
    uint32_t ids[2] = {0, 0};
    kvd_test_daemon_t d1 = {0}, d2 = {0}, d3 = {0}, d4 = {0}, d5 = {0}, d6 = {0};

    if (start(&d1, NULL) == 0)
        first_life(&d1, ids);
    dt_stop(&d1, SIGTERM, 1000); /* dead already: removes its directory */

    if (start(&d2, NULL) == 0) {
        second_life(&d2, ids);
        /* a second daemon of the instance, while this one runs */
        int st = start_refused(&d3, NULL);
        DT_CHECK(st == 1, "a second daemon of the instance should exit 1, got %d", st);
        char want[64];
        snprintf(want, sizeof(want), "kvdockd pid %d holds", (int)d2.pid);
        if (!DT_CHECK(kvd_test_file_contains(d3.log, want),
                      "its log should name the holder ('%s')", want))
            kvd_dump_file(d3.log);
        dt_stop(&d3, SIGTERM, 1000);
    }
    dt_stop(&d2, SIGTERM, 10000); /* a clean stop keeps them too */

    if (start(&d4, NULL) == 0) {
        ts_client_t t;
        if (ts_open(&t, d4.socket, specs, 2, true) == 0) {
            DT_CHECK(check_objects(&t) == N_KV + N_MAMBA,
                     "after a clean stop every object is there");
            ts_close(&t);
        }
    }
    dt_stop(&d4, SIGTERM, 10000);

    /* a journal of another layout version: refused, left alone */
    if (DT_CHECK(set_journal_version(99), "cannot patch the journal")) {
        int st = start_refused(&d5, NULL);
        DT_CHECK(st == 2, "a journal of version 99 should make it exit 2, got %d", st);
        if (!DT_CHECK(kvd_test_file_contains(d5.log, "layout version 99") &&
                          kvd_test_file_contains(d5.log, "--fresh"),
                      "the log should name the version and --fresh"))
            kvd_dump_file(d5.log);
        dt_stop(&d5, SIGTERM, 1000);
        set_journal_version(2); /* what it was (the layout this daemon writes) */
    }
    /* another pool size */
    const char *bigger[] = {"--pool-size", "128M", NULL};
    int st = start_refused(&d5, bigger);
    DT_CHECK(st == 2, "another pool size should make it exit 2, got %d", st);
    if (!DT_CHECK(kvd_test_file_contains(d5.log, "--pool-size 67108864") &&
                      kvd_test_file_contains(d5.log, "--fresh"),
                  "the log should name the size that keeps them and --fresh"))
        kvd_dump_file(d5.log);
    dt_stop(&d5, SIGTERM, 1000);

    /* --mem-fraction on a host (tests/fixtures/daemon-small-host: 8 GiB,
     * 2 GiB available) where the fraction gives more than the pool file
     * holds (0.25 x 8 GiB - 1 GiB): the file is kept at its size, the
     * objects with it; where it gives less (a reserve that leaves 58 MiB),
     * refused as above */
    char host[512];
    snprintf(host, sizeof(host), "%s/daemon-small-host",
             getenv("KVD_FIXTURES") ? getenv("KVD_FIXTURES") : "tests/fixtures");
    kvd_test_daemon_t d7 = {0};
    const char *by_fraction[] = {
        "--meminfo-root",   host, "--mem-fraction", "0.25", "--shm-dir", shm,
        "--usage-interval", "0",  "--reserve",      "1G",   NULL};
    if (DT_CHECK(kvd_test_daemon_start(&d7, by_fraction, true, 30000) == 0,
                 "--mem-fraction 0.25 on the pool file of 64 MiB did not start")) {
        DT_CHECK(kvd_test_file_contains(d7.log, "kept at its size"),
                 "the log should say the pool file keeps its size");
        ts_client_t t;
        if (ts_open(&t, d7.socket, specs, 2, true) == 0) {
            DT_CHECK(t.pool_bytes == DT_POOL_BYTES, "a pool of %llu bytes",
                     (unsigned long long)t.pool_bytes);
            DT_CHECK(check_objects(&t) == N_KV + N_MAMBA,
                     "under --mem-fraction every object is there");
            ts_close(&t);
        }
    } else {
        kvd_dump_file(d7.log);
    }
    dt_stop(&d7, SIGTERM, 10000);
    kvd_test_daemon_t d8 = {0};
    const char *too_small[] = {
        "--meminfo-root",   host, "--mem-fraction", "0.25",  "--shm-dir", shm,
        "--usage-interval", "0",  "--reserve",      "1990M", NULL};
    if (kvd_test_daemon_start(&d8, too_small, false, 0) == 0) {
        int st8 = 0;
        DT_CHECK(kvd_test_wait_pid(d8.pid, 30000, &st8) == 0 && WIFEXITED(st8) &&
                     WEXITSTATUS(st8) == 2,
                 "a fraction that gives less than the pool file should make it exit 2");
        d8.pid = 0;
        if (!DT_CHECK(kvd_test_file_contains(d8.log, "--pool-size 67108864") &&
                          kvd_test_file_contains(d8.log, "--fresh"),
                      "the log should name the size that keeps them and --fresh"))
            kvd_dump_file(d8.log);
    }
    dt_stop(&d8, SIGTERM, 1000);

    /* --fresh: empty on purpose, zeroes where the objects were */
    if (start(&d6, "--fresh") == 0) {
        ts_stats_t s;
        if (DT_CHECK(ts_stats_fresh(d6.socket, true, &s) == KVD_OK, "stats"))
            DT_CHECK(s.store.objects_ready == 0 && s.store.recovered_objects == 0 &&
                         s.store.quarantined_bytes == 0,
                     "--fresh: %llu ready, %llu recovered",
                     (unsigned long long)s.store.objects_ready,
                     (unsigned long long)s.store.recovered_objects);
        DT_CHECK(kvd_test_file_contains(d6.log, "started fresh"),
                 "the log should say it started fresh");
        ts_client_t t;
        if (ts_open(&t, d6.socket, specs, 2, true) == 0) {
            bool zero = true;
            for (uint64_t i = 0; i < t.pool_bytes && zero; i += 4096)
                zero = t.pool[i] == 0;
            DT_CHECK(zero, "--fresh: the pool's bytes are zero");
            ts_close(&t);
        }
    }
    dt_stop(&d6, SIGTERM, 10000);
    remove_shm();
    return dt_exit_status("daemon/persist_restart");
}
