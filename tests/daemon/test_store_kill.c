/*
 * Description: a client dies holding reservations and pins, and nothing
 * leaks. The parent stores 4 pages; a forked client reserves 8 other pages
 * (never publishes them) and acquires the 4 stored ones, tells the parent
 * through a pipe, and is SIGKILLed by the parent (by its pid) while holding
 * both leases. Polling Stats (at most 10 s) shows leases = 0; then pins = 0,
 * writing bytes = 0, objects writing = 0, nothing pinned, the 4 stored pages
 * still ready, Stats(check) and `kvdock stats --check` ok; the 8 half-written
 * keys are gone: Inspect answers NOT_FOUND (in the namespace and in all),
 * Lookup finds none of them, and Reserve hands them out as ALLOCATED again.
 * The daemon logs that the closed connection held 2 leases.
 */
#include "test_store_util.h"

#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define PAGE_SIZE 64
#define N_STORED  4
#define N_HALF    8
#define SALT      0x6b696c6cu

static kvd_key_t stored[N_STORED], half[N_HALF];

/* The doomed client: reserve, acquire, say so, then wait to be killed. */
static void victim_main(const char *socket, int ready_fd)
{
    ts_client_t t;
    kvd_ns_spec_t spec = ts_spec(TS_KV_NS, TS_KV_BYTES);
    if (ts_open(&t, socket, &spec, 1, true) != 0)
        _exit(1);
    kvd_put_item_t items[N_HALF];
    ts_chain_items(half, N_HALF, NULL, 0, items);
    uint8_t res[N_HALF];
    uint64_t off[N_HALF], wlease = 0, rlease = 0;
    ts_err_t e;
    int st = ts_reserve(t.c, t.ns[0], TS_KV_BYTES, items, N_HALF, &wlease, res, off, &e);
    bool ok = DT_CHECK(st == KVD_OK && wlease != 0, "victim: reserve: %s (%s)",
                       kvd_status_str(st), e.text);
    for (size_t i = 0; ok && i < N_HALF; i++) {
        ok = DT_CHECK(res[i] == KVD_RESERVE_ALLOCATED, "victim: reserve key %zu: %s", i,
                      ts_result_name(res[i]));
        /* half-write it, as a worker killed mid-copy would */
        if (ok && ts_in_pool(off[i], TS_KV_BYTES, t.pool_bytes))
            ts_fill(t.pool + off[i], TS_KV_BYTES / 2, half[i], SALT);
    }
    st = ts_acquire(t.c, t.ns[0], TS_KV_BYTES, stored, N_STORED, &rlease, NULL, &e);
    ok &= DT_CHECK(st == KVD_OK && rlease != 0, "victim: acquire: %s (%s)",
                   kvd_status_str(st), e.text);
    char c = ok ? 'y' : 'n';
    if (write(ready_fd, &c, 1) != 1)
        _exit(1);
    for (;;)
        pause(); /* holding everything until SIGKILL */
}

static bool no_leases(const ts_stats_t *s)
{
    return s->store.leases == 0;
}

static void store_pages(ts_client_t *t)
{
    kvd_put_item_t items[N_STORED];
    ts_chain_items(stored, N_STORED, NULL, 0, items);
    uint8_t res[N_STORED];
    uint64_t off[N_STORED], lease = 0;
    ts_err_t e;
    int st =
        ts_reserve(t->c, t->ns[0], TS_KV_BYTES, items, N_STORED, &lease, res, off, &e);
    if (!DT_CHECK(st == KVD_OK, "reserve: %s (%s)", kvd_status_str(st), e.text))
        return;
    for (size_t i = 0; i < N_STORED; i++)
        if (DT_CHECK(res[i] == KVD_RESERVE_ALLOCATED, "reserve %zu: %s", i,
                     ts_result_name(res[i])))
            ts_fill(t->pool + off[i], TS_KV_BYTES, stored[i], SALT);
    st = ts_publish(t->c, lease, NULL, 0, &e);
    DT_CHECK(st == KVD_OK, "publish: %s (%s)", kvd_status_str(st), e.text);
}

/* While the victim lives: its two leases, 4 pins, 8 objects being written. */
static void check_held(const kvd_test_daemon_t *d)
{
    ts_stats_t s;
    if (!DT_CHECK(ts_stats_fresh(d->socket, false, &s) == KVD_OK, "stats failed"))
        return;
    const kvd_store_stats_msg_t *st = &s.store;
    DT_CHECK(st->leases == 2 && st->pins == N_STORED && st->objects_pinned == N_STORED &&
                 st->objects_writing == N_HALF &&
                 st->writing_bytes == N_HALF * (uint64_t)TS_KV_BYTES,
             "while the victim holds them: %llu leases, %llu pins, %llu pinned, %llu "
             "writing (%llu bytes)",
             (unsigned long long)st->leases, (unsigned long long)st->pins,
             (unsigned long long)st->objects_pinned,
             (unsigned long long)st->objects_writing,
             (unsigned long long)st->writing_bytes);
}

static void check_after(const kvd_test_daemon_t *d, ts_client_t *t)
{
    ts_stats_t s;
    bool gone = ts_wait_stats(d->socket, 10000, no_leases, &s);
    if (!DT_CHECK(gone, "leases still %llu 10 s after the client was killed",
                  (unsigned long long)s.store.leases))
        return;
    const kvd_store_stats_msg_t *st = &s.store;
    DT_CHECK(st->pins == 0 && st->objects_pinned == 0 && st->pinned_bytes == 0,
             "after the kill: pins %llu, pinned objects %llu (%llu bytes)",
             (unsigned long long)st->pins, (unsigned long long)st->objects_pinned,
             (unsigned long long)st->pinned_bytes);
    DT_CHECK(st->writing_bytes == 0 && st->objects_writing == 0,
             "after the kill: writing %llu objects, %llu bytes",
             (unsigned long long)st->objects_writing,
             (unsigned long long)st->writing_bytes);
    DT_CHECK(st->objects_ready == N_STORED &&
                 st->ready_bytes == N_STORED * (uint64_t)TS_KV_BYTES,
             "after the kill: %llu ready (%llu bytes), want the %d stored",
             (unsigned long long)st->objects_ready, (unsigned long long)st->ready_bytes,
             N_STORED);
    ts_check_accounting(&s, "after the kill");
    ts_stats_t chk;
    if (DT_CHECK(ts_stats(t->c, true, &chk) == KVD_OK, "stats(check) failed"))
        DT_CHECK(chk.checked && chk.check_error[0] == '\0', "Stats(check): '%s'",
                 chk.check_error);
    ts_cli_check(d->socket, "after the kill");

    ts_err_t e;
    for (size_t i = 0; i < N_HALF; i++) {
        kvd_obj_msg_t o;
        size_t n = 0;
        int r = ts_inspect(t->c, TS_KV_NS, half[i], &o, 1, &n, &e);
        DT_CHECK(r == KVD_ERR_NOT_FOUND, "inspect half-written key %zu in %s: %s", i,
                 TS_KV_NS, kvd_status_str(r));
        r = ts_inspect(t->c, "", half[i], &o, 1, &n, &e);
        DT_CHECK(r == KVD_ERR_NOT_FOUND, "inspect half-written key %zu anywhere: %s", i,
                 kvd_status_str(r));
    }
    kvd_lookup_pool_msg_t pool = {.ns = t->ns[0], .n_keys = N_HALF, .keys = half};
    uint32_t b[N_HALF];
    size_t nb = 99;
    int r = ts_lookup(t->c, &pool, 1, b, N_HALF, &nb, &e);
    DT_CHECK(r == KVD_OK && nb == 0,
             "lookup of the half-written chain: %s, %zu boundaries", kvd_status_str(r),
             nb);
    /* trailing 1: no single page of it is present either */
    pool.trailing_pages = 1;
    r = ts_lookup(t->c, &pool, 1, b, N_HALF, &nb, &e);
    DT_CHECK(r == KVD_OK && nb == 0,
             "lookup (trailing 1) of the half-written chain: %s, %zu boundaries",
             kvd_status_str(r), nb);

    /* the stored pages are intact and loadable */
    uint64_t lease = 0, off[N_STORED];
    r = ts_acquire(t->c, t->ns[0], TS_KV_BYTES, stored, N_STORED, &lease, off, &e);
    if (DT_CHECK(r == KVD_OK, "acquire the stored pages: %s (%s)", kvd_status_str(r),
                 e.text)) {
        for (size_t i = 0; i < N_STORED; i++)
            DT_CHECK(ts_verify(t->pool + off[i], TS_KV_BYTES, stored[i], SALT) ==
                         SIZE_MAX,
                     "stored page %zu changed", i);
        ts_release(t->c, lease, NULL);
    }

    kvd_put_item_t items[N_HALF];
    ts_chain_items(half, N_HALF, NULL, 0, items);
    uint8_t res[N_HALF];
    uint64_t roff[N_HALF];
    r = ts_reserve(t->c, t->ns[0], TS_KV_BYTES, items, N_HALF, &lease, res, roff, &e);
    if (DT_CHECK(r == KVD_OK, "reserve again: %s (%s)", kvd_status_str(r), e.text)) {
        for (size_t i = 0; i < N_HALF; i++)
            DT_CHECK(res[i] == KVD_RESERVE_ALLOCATED,
                     "reserve again, key %zu: %s, want allocated", i,
                     ts_result_name(res[i]));
        r = ts_finish(t->c, KVD_METHOD_REVOKE, lease, NULL, 0, &e);
        DT_CHECK(r == KVD_OK, "revoke: %s (%s)", kvd_status_str(r), e.text);
    }
    DT_CHECK(kvd_test_file_contains(d->log, "holding 2 leases"),
             "the daemon should log that the closed connection held 2 leases");
}

static void run(const kvd_test_daemon_t *d)
{
    if (ts_make_keys(100, N_STORED, PAGE_SIZE, stored) != 0 ||
        ts_make_keys(50000, N_HALF, PAGE_SIZE, half) != 0)
        return;
    ts_client_t t;
    kvd_ns_spec_t spec = ts_spec(TS_KV_NS, TS_KV_BYTES);
    if (ts_open(&t, d->socket, &spec, 1, true) != 0)
        return;
    store_pages(&t);
    int pfd[2];
    if (!DT_CHECK(pipe(pfd) == 0, "pipe failed")) {
        ts_close(&t);
        return;
    }
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        close(pfd[0]);
        victim_main(d->socket, pfd[1]);
    }
    close(pfd[1]);
    if (DT_CHECK(pid > 0, "fork failed")) {
        struct pollfd p = {.fd = pfd[0], .events = POLLIN};
        char c = 0;
        bool ready = poll(&p, 1, 20000) == 1 && read(pfd[0], &c, 1) == 1 && c == 'y';
        DT_CHECK(ready, "the victim did not get its leases (answer '%c')", c ? c : '-');
        if (ready)
            check_held(d);
        kill(pid, SIGKILL);
        int wst = 0;
        DT_CHECK(kvd_test_wait_pid(pid, 10000, &wst) == 0 && WIFSIGNALED(wst) &&
                     WTERMSIG(wst) == SIGKILL,
                 "the victim did not die of SIGKILL (status 0x%x)", wst);
        if (ready)
            check_after(d, &t);
    }
    close(pfd[0]);
    ts_close(&t);
}

int main(void)
{
    kvd_test_daemon_t d = {0};
    if (dt_start(&d, NULL) == 0)
        run(&d);
    dt_stop(&d, SIGTERM, 10000);
    return dt_exit_status("daemon/store_kill");
}
