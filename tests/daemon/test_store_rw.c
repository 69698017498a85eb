/*
 * Description: a same-host client writes and a second process reads, through
 * the shared pool. Hello with want_pool_fd and two namespaces ("m/kv/tp0",
 * 64 KiB objects; "m/mamba/tp0", 16 KiB) gives their ids and the pool's
 * descriptor, which maps MAP_SHARED at the Hello's pool_bytes. The ten page
 * keys of tokens 0..639 (page size 64) are reserved as a chain: all
 * ALLOCATED, every extent inside the pool, 4 KiB aligned, none overlapping.
 * A pattern that is a function of (key, byte index) is written at each
 * offset and published (half by naming the keys, half with an empty list,
 * after which the lease is gone). A forked process says Hello, maps the pool
 * itself, acquires the ten keys and finds every byte; releasing twice gives
 * NOT_FOUND. Reserving again gives EXISTS and no lease. Lookup ALL_PAGES
 * answers 1..10 (1..5 when page 6 is replaced by an unknown key). Mamba
 * state stored at keys 3 and 7 makes kv ALL_PAGES + mamba TRAILING_PAGES(1)
 * answer {4, 8}. Stats then counts 12 ready objects, their bytes, both
 * namespaces with their object counts, no leases and no pins, and
 * `kvdock stats --check` exits 0 and says ok.
 */
#include "test_store_util.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define PAGE_SIZE  64
#define N_KEYS     10
#define KV_SALT    0x6b76u
#define MAMBA_SALT 0x6d61u

static kvd_key_t keys[N_KEYS];
static uint64_t kv_offsets[N_KEYS];

/* The same namespaces, in the same order, for every client. */
static const kvd_ns_spec_t *specs(void)
{
    static kvd_ns_spec_t s[2];
    s[0] = ts_spec(TS_KV_NS, TS_KV_BYTES);
    s[1] = ts_spec(TS_MAMBA_NS, TS_MAMBA_BYTES);
    return s;
}

/* Extents [off[i], off[i] + size) must not overlap each other. */
static void check_disjoint(const uint64_t *off, size_t n, uint64_t size, const char *what)
{
    for (size_t i = 0; i < n; i++)
        for (size_t j = i + 1; j < n; j++)
            DT_CHECK(off[i] + size <= off[j] || off[j] + size <= off[i],
                     "%s: objects %zu (offset %llu) and %zu (offset %llu) overlap", what,
                     i, (unsigned long long)off[i], j, (unsigned long long)off[j]);
}

/* The second process: its own Hello and mapping, Acquire, verify, Release.
 * Exits 0 when every check passed. */
static void reader_main(const char *socket, const uint32_t *writer_ns)
{
    ts_client_t r;
    if (ts_open(&r, socket, specs(), 2, true) != 0)
        _exit(1);
    DT_CHECK(r.ns[0] == writer_ns[0] && r.ns[1] == writer_ns[1],
             "reader: namespace ids %u %u, the writer got %u %u", r.ns[0], r.ns[1],
             writer_ns[0], writer_ns[1]);
    uint64_t lease = 0, off[N_KEYS];
    ts_err_t e;
    int st = ts_acquire(r.c, r.ns[0], TS_KV_BYTES, keys, N_KEYS, &lease, off, &e);
    if (DT_CHECK(st == KVD_OK, "reader: acquire %d keys: %s (%s)", N_KEYS,
                 kvd_status_str(st), e.text)) {
        DT_CHECK(lease != 0, "reader: acquire gave lease 0");
        DT_CHECK(ts_last_object_bytes == TS_KV_BYTES, "reader: acquire object_bytes %llu",
                 (unsigned long long)ts_last_object_bytes);
        for (size_t i = 0; i < N_KEYS; i++) {
            DT_CHECK(off[i] == kv_offsets[i],
                     "reader: key %zu at offset %llu, it was written at %llu", i,
                     (unsigned long long)off[i], (unsigned long long)kv_offsets[i]);
            if (!DT_CHECK(ts_in_pool(off[i], TS_KV_BYTES, r.pool_bytes),
                          "reader: key %zu offset %llu outside the pool", i,
                          (unsigned long long)off[i]))
                continue;
            size_t bad = ts_verify(r.pool + off[i], TS_KV_BYTES, keys[i], KV_SALT);
            DT_CHECK(bad == SIZE_MAX, "reader: key %zu differs at byte %zu", i, bad);
        }
        st = ts_release(r.c, lease, &e);
        DT_CHECK(st == KVD_OK, "reader: release: %s (%s)", kvd_status_str(st), e.text);
        st = ts_release(r.c, lease, &e);
        DT_CHECK(st == KVD_ERR_NOT_FOUND, "reader: second release: %s, want not found",
                 kvd_status_str(st));
    }
    ts_close(&r);
    _exit(dt_failure_count() == 0 ? 0 : 1);
}

/* Forks the reader and waits for it (killed by its pid past 30 s). */
static void run_reader(const char *socket, const uint32_t *ns)
{
    fflush(NULL);
    pid_t pid = fork();
    if (!DT_CHECK(pid >= 0, "fork failed"))
        return;
    if (pid == 0)
        reader_main(socket, ns);
    int wst = 0;
    if (!DT_CHECK(kvd_test_wait_pid(pid, 30000, &wst) == 0,
                  "the reader did not finish")) {
        kill(pid, SIGKILL);
        kvd_test_wait_pid(pid, 5000, NULL);
        return;
    }
    DT_CHECK(WIFEXITED(wst) && WEXITSTATUS(wst) == 0,
             "the reader process failed (status 0x%x; its checks above)", wst);
}

/* Reserve as a chain, write, publish; the offsets go to kv_offsets. */
static void write_kv(ts_client_t *w)
{
    kvd_put_item_t items[N_KEYS];
    ts_chain_items(keys, N_KEYS, NULL, 0, items);
    uint8_t res[N_KEYS];
    uint64_t lease = 0;
    ts_err_t e;
    int st = ts_reserve(w->c, w->ns[0], TS_KV_BYTES, items, N_KEYS, &lease, res,
                        kv_offsets, &e);
    if (!DT_CHECK(st == KVD_OK, "reserve %d kv keys: %s (%s)", N_KEYS, kvd_status_str(st),
                  e.text))
        return;
    DT_CHECK(lease != 0, "reserve: lease 0 for allocated keys");
    DT_CHECK(ts_last_object_bytes == TS_KV_BYTES, "reserve: object_bytes %llu",
             (unsigned long long)ts_last_object_bytes);
    for (size_t i = 0; i < N_KEYS; i++) {
        if (!DT_CHECK(res[i] == KVD_RESERVE_ALLOCATED, "reserve: key %zu got %s", i,
                      ts_result_name(res[i])))
            return;
        if (!DT_CHECK(ts_in_pool(kv_offsets[i], TS_KV_BYTES, w->pool_bytes),
                      "reserve: key %zu at %llu + %u is outside the pool of %llu", i,
                      (unsigned long long)kv_offsets[i], TS_KV_BYTES,
                      (unsigned long long)w->pool_bytes))
            return;
        DT_CHECK(kv_offsets[i] % 4096 == 0, "reserve: key %zu offset %llu not aligned", i,
                 (unsigned long long)kv_offsets[i]);
    }
    check_disjoint(kv_offsets, N_KEYS, TS_KV_BYTES, "kv reservations");

    ts_stats_t s;
    if (DT_CHECK(ts_stats(w->c, false, &s) == KVD_OK, "stats failed")) {
        DT_CHECK(s.store.objects_writing == N_KEYS &&
                     s.store.writing_bytes == N_KEYS * (uint64_t)TS_KV_BYTES &&
                     s.store.objects_ready == 0 && s.store.leases == 1,
                 "before publish: %llu writing (%llu bytes), %llu ready, %llu leases",
                 (unsigned long long)s.store.objects_writing,
                 (unsigned long long)s.store.writing_bytes,
                 (unsigned long long)s.store.objects_ready,
                 (unsigned long long)s.store.leases);
        ts_check_accounting(&s, "before publish");
    }

    for (size_t i = 0; i < N_KEYS; i++)
        ts_fill(w->pool + kv_offsets[i], TS_KV_BYTES, keys[i], KV_SALT);
    /* half by naming the keys, the rest with an empty list (= all left) */
    st = ts_publish(w->c, lease, keys, N_KEYS / 2, &e);
    DT_CHECK(st == KVD_OK, "publish of keys 0..4: %s (%s)", kvd_status_str(st), e.text);
    kvd_lookup_pool_msg_t pool = {.ns = w->ns[0], .n_keys = N_KEYS, .keys = keys};
    uint32_t b[N_KEYS];
    size_t nb = 0;
    st = ts_lookup(w->c, &pool, 1, b, N_KEYS, &nb, &e);
    DT_CHECK(st == KVD_OK && nb == N_KEYS / 2 && b[nb - 1] == N_KEYS / 2,
             "after publishing half: lookup %s, %zu boundaries (want 1..%d)",
             kvd_status_str(st), nb, N_KEYS / 2);
    st = ts_publish(w->c, lease, NULL, 0, &e);
    DT_CHECK(st == KVD_OK, "publish of the rest: %s (%s)", kvd_status_str(st), e.text);
    st = ts_publish(w->c, lease, NULL, 0, &e);
    DT_CHECK(st == KVD_ERR_NOT_FOUND,
             "a lease whose reservations are all published has ended: publish again "
             "gave %s, want not found",
             kvd_status_str(st));
}

static void check_exists(ts_client_t *w)
{
    kvd_put_item_t items[N_KEYS];
    ts_chain_items(keys, N_KEYS, NULL, 0, items);
    uint8_t res[N_KEYS];
    uint64_t off[N_KEYS], lease = 1;
    ts_err_t e;
    int st = ts_reserve(w->c, w->ns[0], TS_KV_BYTES, items, N_KEYS, &lease, res, off, &e);
    if (!DT_CHECK(st == KVD_OK, "second reserve: %s (%s)", kvd_status_str(st), e.text))
        return;
    DT_CHECK(lease == 0, "second reserve: lease %llu, want 0 (nothing allocated)",
             (unsigned long long)lease);
    for (size_t i = 0; i < N_KEYS; i++)
        DT_CHECK(res[i] == KVD_RESERVE_EXISTS,
                 "second reserve: key %zu got %s, want exists", i,
                 ts_result_name(res[i]));
}

static void check_lookup_kv(ts_client_t *w)
{
    kvd_lookup_pool_msg_t pool = {.ns = w->ns[0], .n_keys = N_KEYS, .keys = keys};
    uint32_t b[N_KEYS];
    size_t nb = 0;
    ts_err_t e;
    int st = ts_lookup(w->c, &pool, 1, b, N_KEYS, &nb, &e);
    if (DT_CHECK(st == KVD_OK && nb == N_KEYS, "lookup ALL_PAGES: %s, %zu boundaries",
                 kvd_status_str(st), nb))
        for (size_t i = 0; i < nb; i++)
            DT_CHECK(b[i] == i + 1, "lookup ALL_PAGES: boundary %zu is %u, want %zu", i,
                     b[i], i + 1);

    /* a hole at page 6 (index 5): ALL_PAGES stops at 5 */
    kvd_key_t holed[N_KEYS];
    memcpy(holed, keys, sizeof(holed));
    memset(holed[5], 0xab, KVD_KEY_BYTES);
    pool.keys = holed;
    st = ts_lookup(w->c, &pool, 1, b, N_KEYS, &nb, &e);
    DT_CHECK(st == KVD_OK && nb == 5 && b[0] == 1 && b[4] == 5,
             "lookup with page 6 missing: %s, %zu boundaries (want 1..5)",
             kvd_status_str(st), nb);
}

/* Mamba state at keys 3 and 7 (the state saved at boundaries 4 and 8). */
static void write_mamba(ts_client_t *w)
{
    static const size_t at[2] = {3, 7};
    kvd_key_t mk[2];
    kvd_put_item_t items[2];
    for (size_t i = 0; i < 2; i++) {
        memcpy(mk[i], keys[at[i]], KVD_KEY_BYTES);
        ts_chain_items(&mk[i], 1, keys[at[i] - 1], (uint32_t)at[i], &items[i]);
    }
    uint8_t res[2];
    uint64_t off[2], lease = 0;
    ts_err_t e;
    int st = ts_reserve(w->c, w->ns[1], TS_MAMBA_BYTES, items, 2, &lease, res, off, &e);
    if (!DT_CHECK(st == KVD_OK, "reserve mamba: %s (%s)", kvd_status_str(st), e.text))
        return;
    DT_CHECK(ts_last_object_bytes == TS_MAMBA_BYTES, "reserve mamba: object_bytes %llu",
             (unsigned long long)ts_last_object_bytes);
    for (size_t i = 0; i < 2; i++) {
        if (!DT_CHECK(res[i] == KVD_RESERVE_ALLOCATED &&
                          ts_in_pool(off[i], TS_MAMBA_BYTES, w->pool_bytes),
                      "reserve mamba key %zu: %s at %llu", at[i], ts_result_name(res[i]),
                      (unsigned long long)off[i]))
            return;
        for (size_t k = 0; k < N_KEYS; k++)
            DT_CHECK(off[i] + TS_MAMBA_BYTES <= kv_offsets[k] ||
                         kv_offsets[k] + TS_KV_BYTES <= off[i],
                     "mamba state %zu at %llu overlaps kv page %zu at %llu", at[i],
                     (unsigned long long)off[i], k, (unsigned long long)kv_offsets[k]);
        ts_fill(w->pool + off[i], TS_MAMBA_BYTES, mk[i], MAMBA_SALT);
    }
    check_disjoint(off, 2, TS_MAMBA_BYTES, "mamba reservations");
    st = ts_publish(w->c, lease, NULL, 0, &e);
    DT_CHECK(st == KVD_OK, "publish mamba: %s (%s)", kvd_status_str(st), e.text);
    /* the kv bytes are untouched by the mamba writes */
    for (size_t k = 0; k < N_KEYS; k++) {
        size_t bad = ts_verify(w->pool + kv_offsets[k], TS_KV_BYTES, keys[k], KV_SALT);
        DT_CHECK(bad == SIZE_MAX, "kv page %zu changed at byte %zu", k, bad);
    }
}

static void check_lookup_hybrid(ts_client_t *w)
{
    kvd_lookup_pool_msg_t pools[2] = {
        {.ns = w->ns[0], .trailing_pages = 0, .n_keys = N_KEYS, .keys = keys},
        {.ns = w->ns[1], .trailing_pages = 1, .n_keys = N_KEYS, .keys = keys},
    };
    uint32_t b[N_KEYS];
    size_t nb = 0;
    ts_err_t e;
    int st = ts_lookup(w->c, pools, 2, b, N_KEYS, &nb, &e);
    DT_CHECK(st == KVD_OK && nb == 2 && b[0] == 4 && b[1] == 8,
             "lookup kv ALL_PAGES + mamba TRAILING_PAGES(1): %s, %zu boundaries "
             "(%u, %u), want {4, 8}",
             kvd_status_str(st), nb, nb > 0 ? b[0] : 0, nb > 1 ? b[1] : 0);
    /* a prompt of 6 pages: only boundary 4 */
    pools[0].n_keys = pools[1].n_keys = 6;
    st = ts_lookup(w->c, pools, 2, b, N_KEYS, &nb, &e);
    DT_CHECK(st == KVD_OK && nb == 1 && b[0] == 4,
             "hybrid lookup over 6 pages: %s, %zu boundaries, want {4}",
             kvd_status_str(st), nb);
}

static void check_stats(const kvd_test_daemon_t *d, ts_client_t *w)
{
    ts_stats_t s;
    if (!DT_CHECK(ts_stats(w->c, true, &s) == KVD_OK, "stats failed"))
        return;
    const kvd_store_stats_msg_t *st = &s.store;
    DT_CHECK(st->objects_ready == 12, "stats: objects_ready %llu, want 12",
             (unsigned long long)st->objects_ready);
    DT_CHECK(st->ready_bytes == N_KEYS * (uint64_t)TS_KV_BYTES + 2 * TS_MAMBA_BYTES,
             "stats: ready_bytes %llu, want %llu", (unsigned long long)st->ready_bytes,
             (unsigned long long)(N_KEYS * (uint64_t)TS_KV_BYTES + 2 * TS_MAMBA_BYTES));
    DT_CHECK(st->objects_writing == 0 && st->writing_bytes == 0 && st->leases == 0 &&
                 st->pins == 0 && st->objects_pinned == 0,
             "stats: writing %llu (%llu bytes), leases %llu, pins %llu, pinned %llu; "
             "want all 0",
             (unsigned long long)st->objects_writing,
             (unsigned long long)st->writing_bytes, (unsigned long long)st->leases,
             (unsigned long long)st->pins, (unsigned long long)st->objects_pinned);
    DT_CHECK(st->pool_bytes == DT_POOL_BYTES, "stats: pool_bytes %llu",
             (unsigned long long)st->pool_bytes);
    DT_CHECK(st->published_bytes == N_KEYS * (uint64_t)TS_KV_BYTES + 2 * TS_MAMBA_BYTES,
             "stats: published_bytes %llu", (unsigned long long)st->published_bytes);
    DT_CHECK(st->acquired_bytes == N_KEYS * (uint64_t)TS_KV_BYTES,
             "stats: acquired_bytes %llu, want the reader's %llu",
             (unsigned long long)st->acquired_bytes,
             (unsigned long long)(N_KEYS * (uint64_t)TS_KV_BYTES));
    ts_check_accounting(&s, "stats");
    DT_CHECK(s.checked && s.check_error[0] == '\0', "Stats(check): checked %d, '%s'",
             s.checked, s.check_error);
    DT_CHECK(s.n_ns == 2, "stats lists %zu namespaces, want 2", s.n_ns);
    const kvd_ns_msg_t *kv = ts_stats_ns(&s, TS_KV_NS),
                       *mb = ts_stats_ns(&s, TS_MAMBA_NS);
    if (DT_CHECK(kv != NULL, "stats does not list %s", TS_KV_NS))
        DT_CHECK(kv->id == w->ns[0] && kv->object_bytes == TS_KV_BYTES &&
                     kv->objects_ready == N_KEYS && kv->objects_pinned == 0,
                 "%s: id %u, %llu-byte objects, %llu ready, %llu pinned", TS_KV_NS,
                 kv->id, (unsigned long long)kv->object_bytes,
                 (unsigned long long)kv->objects_ready,
                 (unsigned long long)kv->objects_pinned);
    if (DT_CHECK(mb != NULL, "stats does not list %s", TS_MAMBA_NS))
        DT_CHECK(mb->id == w->ns[1] && mb->object_bytes == TS_MAMBA_BYTES &&
                     mb->objects_ready == 2,
                 "%s: id %u, %llu-byte objects, %llu ready", TS_MAMBA_NS, mb->id,
                 (unsigned long long)mb->object_bytes,
                 (unsigned long long)mb->objects_ready);
    ts_cli_check(d->socket, "after the writes and reads");
}

static void run(const kvd_test_daemon_t *d)
{
    if (ts_make_keys(0, N_KEYS, PAGE_SIZE, keys) != 0)
        return;
    ts_client_t w;
    if (ts_open(&w, d->socket, specs(), 2, true) != 0)
        return;
    DT_CHECK(w.pool_bytes == DT_POOL_BYTES, "hello: pool_bytes %llu, want %llu",
             (unsigned long long)w.pool_bytes, (unsigned long long)DT_POOL_BYTES);
    DT_CHECK(w.ns[0] != w.ns[1], "the two namespaces got the same id %u", w.ns[0]);
    write_kv(&w);
    if (dt_failure_count() == 0) {
        run_reader(d->socket, w.ns);
        check_exists(&w);
        check_lookup_kv(&w);
        write_mamba(&w);
        check_lookup_hybrid(&w);
        check_stats(d, &w);
    }
    ts_close(&w);
}

int main(void)
{
    kvd_test_daemon_t d = {0};
    if (dt_start(&d, NULL) == 0)
        run(&d);
    dt_stop(&d, SIGTERM, 10000);
    return dt_exit_status("daemon/store_rw");
}
