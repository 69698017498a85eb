/*
 * Description: eight processes race to write the same 32 pages. Each forked
 * process connects, says Hello (one namespace, 64 KiB objects) and maps the
 * pool, then waits at a pipe barrier; released together, each reserves the
 * 32 keys in four batches of eight, starting at a different batch, and sends
 * its results to the parent through its own pipe. Across all processes every
 * key is ALLOCATED exactly once, and every other answer is EXISTS or
 * IN_FLIGHT. Each writer fills its keys' bytes with a pattern of the key and
 * publishes; after a second barrier (everyone published) every process
 * acquires all 32 keys, finds every byte as the pattern says, and releases.
 * Stats then counts 32 allocations, 7 x 32 exists/in-flight answers, 32 ready
 * objects, no leases and no pins, and `kvdock stats --check` is ok.
 */
#include "test_store_util.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define N_PROCS   8
#define N_KEYS    32
#define BATCH     8
#define PAGE_SIZE 64
#define SALT      0x72616365u
#define WAIT_MS   20000

static kvd_key_t keys[N_KEYS];

/* What a process reports after its Reserve calls (one write, < PIPE_BUF). */
typedef struct report {
    int32_t status; /* KVD_OK or the failing Reserve's status */
    uint8_t results[N_KEYS];
} report_t;

/* The pipes of the two barriers and of the reports. */
typedef struct pipes {
    int ready[2];     /* children -> parent: one byte each when set up */
    int go[2];        /* parent closes the write end: go */
    int published[2]; /* children -> parent: one byte each when published */
    int go_read[2];   /* parent closes the write end: read everything */
    int report[N_PROCS][2];
} pipes_t;

/* Blocks until the parent closes the write end of p (EOF), up to WAIT_MS. */
static bool wait_closed(int fd)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int rc;
    do
        rc = poll(&p, 1, WAIT_MS);
    while (rc < 0 && errno == EINTR);
    char c;
    return rc == 1 && read(fd, &c, 1) == 0;
}

static void signal_byte(int fd)
{
    char c = 1;
    ssize_t n = write(fd, &c, 1);
    (void)n;
}

/* One racing process. Exits 0 when every check passed. */
static void racer_main(int me, const char *socket, pipes_t *p)
{
    /* keep only what this process uses */
    close(p->ready[0]);
    close(p->go[1]);
    close(p->published[0]);
    close(p->go_read[1]);
    for (int i = 0; i < N_PROCS; i++) {
        close(p->report[i][0]);
        if (i != me)
            close(p->report[i][1]);
    }
    ts_client_t t;
    kvd_ns_spec_t spec = ts_spec(TS_KV_NS, TS_KV_BYTES);
    if (ts_open(&t, socket, &spec, 1, true) != 0)
        _exit(1);
    signal_byte(p->ready[1]);
    if (!DT_CHECK(wait_closed(p->go[0]), "racer %d: no go from the parent", me))
        _exit(1);

    kvd_put_item_t items[N_KEYS];
    ts_chain_items(keys, N_KEYS, NULL, 0, items);
    report_t rep = {.status = KVD_OK};
    uint64_t offsets[N_KEYS], leases[N_KEYS / BATCH] = {0};
    for (int k = 0; k < N_KEYS / BATCH; k++) {
        int b = (me + k) % (N_KEYS / BATCH); /* a different first batch each */
        ts_err_t e;
        int st = ts_reserve(t.c, t.ns[0], TS_KV_BYTES, &items[b * BATCH], BATCH,
                            &leases[b], &rep.results[b * BATCH], &offsets[b * BATCH], &e);
        if (!DT_CHECK(st == KVD_OK, "racer %d: reserve batch %d: %s (%s)", me, b,
                      kvd_status_str(st), e.text))
            rep.status = st;
    }
    ssize_t n = write(p->report[me][1], &rep, sizeof(rep));
    DT_CHECK(n == (ssize_t)sizeof(rep), "racer %d: report not written", me);
    close(p->report[me][1]);

    /* write and publish what this process got */
    for (int b = 0; b < N_KEYS / BATCH; b++) {
        bool mine = false;
        for (int i = b * BATCH; i < (b + 1) * BATCH; i++) {
            if (rep.results[i] != KVD_RESERVE_ALLOCATED)
                continue;
            mine = true;
            if (DT_CHECK(ts_in_pool(offsets[i], TS_KV_BYTES, t.pool_bytes),
                         "racer %d: key %d at %llu outside the pool", me, i,
                         (unsigned long long)offsets[i]))
                ts_fill(t.pool + offsets[i], TS_KV_BYTES, keys[i], SALT);
        }
        DT_CHECK(mine == (leases[b] != 0), "racer %d: batch %d: allocated %d, lease %llu",
                 me, b, mine, (unsigned long long)leases[b]);
        if (leases[b] != 0) {
            ts_err_t e;
            int st = ts_publish(t.c, leases[b], NULL, 0, &e);
            DT_CHECK(st == KVD_OK, "racer %d: publish batch %d: %s (%s)", me, b,
                     kvd_status_str(st), e.text);
        }
    }
    signal_byte(p->published[1]);
    if (!DT_CHECK(wait_closed(p->go_read[0]), "racer %d: no go to read", me))
        _exit(1);

    uint64_t lease = 0, off[N_KEYS];
    ts_err_t e;
    int st = ts_acquire(t.c, t.ns[0], TS_KV_BYTES, keys, N_KEYS, &lease, off, &e);
    if (DT_CHECK(st == KVD_OK, "racer %d: acquire all: %s (%s)", me, kvd_status_str(st),
                 e.text)) {
        for (int i = 0; i < N_KEYS; i++) {
            if (!DT_CHECK(ts_in_pool(off[i], TS_KV_BYTES, t.pool_bytes),
                          "racer %d: acquired key %d outside the pool", me, i))
                continue;
            size_t bad = ts_verify(t.pool + off[i], TS_KV_BYTES, keys[i], SALT);
            DT_CHECK(bad == SIZE_MAX, "racer %d: key %d differs at byte %zu", me, i, bad);
        }
        st = ts_release(t.c, lease, &e);
        DT_CHECK(st == KVD_OK, "racer %d: release: %s (%s)", me, kvd_status_str(st),
                 e.text);
    }
    ts_close(&t);
    _exit(dt_failure_count() == 0 ? 0 : 1);
}

/* Reads `want` bytes of barrier signals within WAIT_MS; false otherwise. */
static bool collect_bytes(int fd, int want)
{
    uint64_t deadline = kvd_now_ns() + (uint64_t)WAIT_MS * 1000000ull;
    int got = 0;
    while (got < want && kvd_now_ns() < deadline) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 100) <= 0)
            continue;
        char buf[N_PROCS];
        ssize_t n = read(fd, buf, sizeof(buf));
        if (n <= 0)
            break; /* every writer gone */
        got += (int)n;
    }
    return got >= want;
}

static bool read_report(int fd, report_t *r)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, WAIT_MS) != 1)
        return false;
    return read(fd, r, sizeof(*r)) == (ssize_t)sizeof(*r);
}

static void check_results(const report_t *reports)
{
    for (int i = 0; i < N_KEYS; i++) {
        int allocated = 0, other = 0;
        for (int p = 0; p < N_PROCS; p++) {
            unsigned r = reports[p].results[i];
            allocated += r == KVD_RESERVE_ALLOCATED;
            other += r == KVD_RESERVE_EXISTS || r == KVD_RESERVE_IN_FLIGHT;
            DT_CHECK(r <= KVD_RESERVE_IN_FLIGHT, "key %d: process %d got %s", i, p,
                     ts_result_name(r));
        }
        DT_CHECK(allocated == 1, "key %d was ALLOCATED %d times across %d processes", i,
                 allocated, N_PROCS);
        DT_CHECK(other == N_PROCS - 1, "key %d: %d EXISTS/IN_FLIGHT answers, want %d", i,
                 other, N_PROCS - 1);
    }
}

static void check_after(const kvd_test_daemon_t *d)
{
    ts_stats_t s;
    if (!DT_CHECK(ts_stats_fresh(d->socket, true, &s) == KVD_OK, "stats failed"))
        return;
    const kvd_store_stats_msg_t *st = &s.store;
    DT_CHECK(st->reserve_allocated == N_KEYS, "stats: reserve_allocated %llu, want %d",
             (unsigned long long)st->reserve_allocated, N_KEYS);
    DT_CHECK(st->reserve_exists + st->reserve_in_flight == (N_PROCS - 1) * N_KEYS,
             "stats: exists %llu + in flight %llu, want %d",
             (unsigned long long)st->reserve_exists,
             (unsigned long long)st->reserve_in_flight, (N_PROCS - 1) * N_KEYS);
    DT_CHECK(st->reserve_no_space == 0, "stats: reserve_no_space %llu",
             (unsigned long long)st->reserve_no_space);
    DT_CHECK(st->objects_ready == N_KEYS && st->objects_writing == 0 && st->leases == 0 &&
                 st->pins == 0,
             "stats: %llu ready, %llu writing, %llu leases, %llu pins",
             (unsigned long long)st->objects_ready,
             (unsigned long long)st->objects_writing, (unsigned long long)st->leases,
             (unsigned long long)st->pins);
    DT_CHECK(st->acquired_bytes == (uint64_t)N_PROCS * N_KEYS * TS_KV_BYTES,
             "stats: acquired_bytes %llu", (unsigned long long)st->acquired_bytes);
    DT_CHECK(s.checked && s.check_error[0] == '\0', "Stats(check): '%s'", s.check_error);
    ts_check_accounting(&s, "after the race");
    ts_cli_check(d->socket, "after the race");
}

static void run(const kvd_test_daemon_t *d)
{
    if (ts_make_keys(7000, N_KEYS, PAGE_SIZE, keys) != 0)
        return;
    pipes_t p;
    if (pipe(p.ready) || pipe(p.go) || pipe(p.published) || pipe(p.go_read)) {
        DT_CHECK(false, "pipe failed");
        return;
    }
    for (int i = 0; i < N_PROCS; i++)
        if (!DT_CHECK(pipe(p.report[i]) == 0, "pipe failed"))
            return;
    pid_t pids[N_PROCS] = {0};
    fflush(NULL);
    for (int i = 0; i < N_PROCS; i++) {
        pids[i] = fork();
        if (pids[i] == 0)
            racer_main(i, d->socket, &p);
        DT_CHECK(pids[i] > 0, "fork %d failed", i);
    }
    close(p.ready[1]);
    close(p.published[1]);
    for (int i = 0; i < N_PROCS; i++)
        close(p.report[i][1]);

    /* barrier 1: everyone connected and mapped, then go at once */
    DT_CHECK(collect_bytes(p.ready[0], N_PROCS), "not every process got ready");
    close(p.go[1]);
    report_t reports[N_PROCS];
    memset(reports, 0xff, sizeof(reports));
    bool all = true;
    for (int i = 0; i < N_PROCS; i++)
        all &= DT_CHECK(read_report(p.report[i][0], &reports[i]) &&
                            reports[i].status == KVD_OK,
                        "no report (or a failed Reserve) from process %d", i);
    if (all)
        check_results(reports);
    /* barrier 2: everyone published, then everyone reads */
    DT_CHECK(collect_bytes(p.published[0], N_PROCS), "not every process published");
    close(p.go_read[1]);

    for (int i = 0; i < N_PROCS; i++) {
        if (pids[i] <= 0)
            continue;
        int wst = 0;
        if (!DT_CHECK(kvd_test_wait_pid(pids[i], WAIT_MS, &wst) == 0,
                      "process %d did not finish", i)) {
            kill(pids[i], SIGKILL);
            kvd_test_wait_pid(pids[i], 5000, NULL);
            continue;
        }
        DT_CHECK(WIFEXITED(wst) && WEXITSTATUS(wst) == 0,
                 "process %d failed (status 0x%x; its checks above)", i, wst);
    }
    close(p.ready[0]);
    close(p.published[0]);
    close(p.go[0]);
    close(p.go_read[0]);
    for (int i = 0; i < N_PROCS; i++)
        close(p.report[i][0]);
    check_after(d);
}

int main(void)
{
    kvd_test_daemon_t d = {0};
    if (dt_start(&d, NULL) == 0)
        run(&d);
    dt_stop(&d, SIGTERM, 10000);
    return dt_exit_status("daemon/store_race");
}
