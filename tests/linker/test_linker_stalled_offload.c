/*
 * Description: a linker's reservations that a daemon restart caught in
 * flight are held for the linker's process while it lives, and freed by
 * the linker's own next Hello (earlier_copies_over) once its offload copy
 * of the lost connection has ended (issue 14). A child process offloads
 * without pause (eight jobs queued at a time, 2 MiB each) through the
 * shared-memory pool. Each round the test stops the child (SIGSTOP),
 * SIGKILLs the daemon and starts a new one on the same pool file and
 * journal, and notes the bytes held (quarantined_bytes) while the child
 * is stopped; then it lets the child go on: once the child has had three
 * more offloads acknowledged by the new daemon, nothing is held any more,
 * though the child lives on, and where something was held the daemon's
 * log says the child's pid said its copies were over (--lease-ttl 1000).
 * Then the same without a restart: the child stopped until its leases
 * lapsed (Stats: no lease) holds what it had reserved; once it goes on,
 * its Publish of the lapsed lease makes it reconnect, and after three more
 * offloads nothing is held. Rounds go on until
 * three have caught a reservation in flight, at most 40, and at least one
 * must have (the child spends much of its time between a Reserve and its
 * Publish: a third to four fifths of the rounds here). The store's
 * invariant (Stats with check) holds after each round.
 */
#include "dtest.h"
#include "harness.h"
#include "kvd_common.h"
#include "kvdock.h"
#include "ltest.h"

#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define PS       4
#define PAGES    4
#define ROWS     (PAGES * PS)
#define BPR      (64u * 1024u) /* a page object: 2 x 4 rows x 64 KiB = 512 KiB */
#define QUEUED   8
#define ROUNDS   40 /* at most; it stops after HITS rounds that caught one */
#define HITS     3
#define WAIT_MS  20000
#define TTL_ARGS "--lease-ttl", "1000"

static _Atomic uint64_t *acked; /* shared with the child: offloads it had acknowledged */

static void nap(void)
{
    struct timespec ts = {0, 5000000};
    nanosleep(&ts, NULL);
}

/* Queues the offload of the chain of tokens [base, base + ROWS). */
static int offload_one(kvd_linker_t *l, uint32_t pool, uint32_t base, uint64_t *ack)
{
    uint32_t tokens[ROWS];
    for (int i = 0; i < ROWS; i++)
        tokens[i] = base + (uint32_t)i;
    uint8_t keys[PAGES][KVD_PAGE_KEY_BYTES];
    size_t n = 0;
    kvd_page_keys(tokens, ROWS, PS, NULL, keys, &n);
    int64_t idx[ROWS];
    for (int i = 0; i < ROWS; i++)
        idx[i] = i;
    kvd_transfer_t t = {.pool_id = pool,
                        .keys = (const uint8_t(*)[KVD_PAGE_KEY_BYTES])keys,
                        .n_keys = PAGES,
                        .device_indices = idx,
                        .n_indices = ROWS};
    return kvd_offload(l, &t, 1, ack);
}

/* The child: offloads for ever, QUEUED jobs in flight, counting the
 * acknowledged ones in *acked. Reconnects by itself after each restart. */
static void child_main(const char *socket)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    kvd_linker_config_t cfg = {
        .socket_path = socket, .model_id = "stall", .timeout_ms = 2000};
    kvd_linker_t *l = NULL;
    if (kvd_linker_open(&cfg, &l) != 0)
        _exit(1);
    uint8_t *k = calloc(ROWS, BPR), *v = calloc(ROWS, BPR);
    uint32_t pool = 0;
    if (k == NULL || v == NULL ||
        lt_register_kv(l, "kv", k, v, BPR, PS, ROWS, NULL, &pool))
        _exit(1);
    memset(k, 0x6b, (size_t)ROWS * BPR);
    memset(v, 0x76, (size_t)ROWS * BPR);
    uint32_t base = 1000;
    size_t in_flight = 0;
    for (;;) {
        while (in_flight < QUEUED) {
            uint64_t ack;
            if (offload_one(l, pool, base, &ack) != 0)
                break;
            base += ROWS;
            in_flight++;
        }
        kvd_completion_t c[QUEUED];
        size_t n = 0;
        kvd_pop_completed_offloads(l, c, QUEUED, &n);
        for (size_t j = 0; j < n; j++)
            if (c[j].success)
                atomic_fetch_add(acked, 1);
        in_flight -= n;
        if (n == 0) { /* a short nap: the offload thread must not run dry */
            struct timespec ts = {0, 200000};
            nanosleep(&ts, NULL);
        }
    }
}

/* Waits (bounded) until the child has had `more` offloads acknowledged. */
static bool child_progress(uint64_t more)
{
    uint64_t want = atomic_load(acked) + more;
    for (int k = 0; k < WAIT_MS / 5; k++) {
        if (atomic_load(acked) >= want)
            return true;
        nap();
    }
    return false;
}

static bool child_stop(pid_t pid)
{
    kill(pid, SIGSTOP);
    for (int k = 0; k < WAIT_MS / 5; k++) {
        int st = 0;
        pid_t r = waitpid(pid, &st, WNOHANG | WUNTRACED);
        if (r == pid && WIFSTOPPED(st))
            return true;
        if (r != 0)
            return false;
        nap();
    }
    return false;
}

/* Waits (bounded) until the daemon at socket answers Health ready. */
static bool daemon_ready(const char *socket)
{
    for (int k = 0; k < 2 * WAIT_MS / 5; k++) {
        kvd_health_rep_t h;
        if (dt_health_fresh(socket, &h) == KVD_HEALTH_READY)
            return true;
        nap();
    }
    return false;
}

/* quarantined_bytes of the daemon at socket (with the invariant checked
 * when check), or UINT64_MAX. */
static uint64_t held_bytes(const char *socket, bool check)
{
    kvd_client_t *c = dt_connect(socket, true);
    if (c == NULL)
        return UINT64_MAX;
    kvd_msg_t req, rep;
    kvd_msg_request(&req, 0, KVD_METHOD_STATS);
    req.body.stats_req.check = check;
    uint64_t q = UINT64_MAX;
    if (kvd_client_call(c, &req, &rep, 10000) == KVD_OK && rep.status == KVD_OK) {
        q = rep.body.stats_rep.store.quarantined_bytes;
        DT_CHECK(!check || rep.body.stats_rep.check_error[0] == '\0',
                 "the store's invariant: %s", rep.body.stats_rep.check_error);
    }
    kvd_msg_clear(&rep);
    kvd_client_close(c);
    return q;
}

static bool no_leases(const char *socket)
{
    for (int k = 0; k < WAIT_MS / 5; k++) {
        kvd_stats_rep_t st;
        if (dt_stats_fresh(socket, &st) == KVD_OK && st.store.leases == 0)
            return true;
        nap();
    }
    return false;
}

/* The child stopped past its leases' TTL on a live daemon (its connection
 * stays): what it had reserved is held; once it goes on, its Publish of a
 * lapsed lease makes it reconnect, and its Hello frees them. Rounds until
 * one caught a reservation in flight, at most ROUNDS. */
static void lapse_rounds(pid_t child, const char *socket)
{
    int hits = 0;
    for (int r = 0; r < ROUNDS && hits == 0; r++) {
        if (!DT_CHECK(child_stop(child), "lapse %d: the child did not stop", r))
            return;
        bool ended = no_leases(socket);
        uint64_t held = held_bytes(socket, false);
        hits += held != 0 && held != UINT64_MAX;
        kill(child, SIGCONT);
        if (!DT_CHECK(ended, "lapse %d: the stopped child's leases did not end", r) ||
            !DT_CHECK(child_progress(3), "lapse %d: the child does not offload again", r))
            return;
        uint64_t after = held_bytes(socket, true);
        DT_CHECK(after == 0,
                 "lapse %d: %llu bytes held for the live linker after it went on (%llu "
                 "while it was stopped)",
                 r, (unsigned long long)after, (unsigned long long)held);
    }
    DT_CHECK(hits > 0, "no lapse round of %d caught a reservation in flight", ROUNDS);
    printf("a lapse caught a reservation in flight: %s\n", hits ? "yes" : "no");
}

int main(void)
{
    acked = mmap(NULL, sizeof(*acked), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                 -1, 0);
    if (acked == MAP_FAILED)
        return 1;
    atomic_init(acked, 0);
    kvd_test_daemon_t d1, dn[ROUNDS];
    memset(dn, 0, sizeof(dn));
    const char *args[] = {"--pool-size", "64M", "--usage-interval", "0", TTL_ARGS, NULL};
    if (kvd_test_daemon_start(&d1, args, true, 30000) != 0)
        return 1;
    pid_t child = fork();
    if (child == 0)
        child_main(d1.socket);
    kvd_test_daemon_t *cur = &d1;
    int hits = 0;
    if (DT_CHECK(child > 0 && child_progress(10), "the child does not offload")) {
        for (int r = 0; r < ROUNDS && hits < HITS; r++) {
            if (!DT_CHECK(child_stop(child), "round %d: the child did not stop", r))
                break;
            kill(cur->pid, SIGKILL);
            kvd_test_wait_pid(cur->pid, 10000, NULL);
            cur->pid = 0;
            /* the same socket, the same pool file and journal */
            const char *again[] = {"--pool-size", "64M",     "--usage-interval", "0",
                                   "--socket",    d1.socket, "--shm-dir",        d1.dir,
                                   TTL_ARGS,      NULL};
            if (!DT_CHECK(kvd_test_daemon_start(&dn[r], again, false, 0) == 0,
                          "round %d: the daemon did not start again", r))
                break;
            cur = &dn[r];
            /* it serves d1's socket, not the one of its own directory */
            snprintf(cur->socket, sizeof(cur->socket), "%s", d1.socket);
            if (!DT_CHECK(daemon_ready(cur->socket), "round %d: the daemon is not ready",
                          r))
                break;
            uint64_t held = held_bytes(cur->socket, false);
            hits += held != 0 && held != UINT64_MAX;
            kill(child, SIGCONT);
            if (!DT_CHECK(child_progress(3), "round %d: the child does not offload again",
                          r))
                break;
            uint64_t after = held_bytes(cur->socket, true);
            DT_CHECK(after == 0,
                     "round %d: %llu bytes held for the live linker after it reconnected "
                     "(%llu while it was stopped)",
                     r, (unsigned long long)after, (unsigned long long)held);
            char line[80];
            snprintf(line, sizeof(line), "pid %d says its earlier copies are over",
                     (int)child);
            DT_CHECK(held == 0 || kvd_test_file_contains(cur->log, line),
                     "round %d: the log should say '%s'", r, line);
        }
        DT_CHECK(hits > 0, "no round of %d caught a reservation in flight", ROUNDS);
        lapse_rounds(child, cur->socket);
    }
    if (child > 0) {
        kill(child, SIGKILL);
        kvd_test_wait_pid(child, 10000, NULL);
    }
    int rounds = 0;
    while (rounds < ROUNDS && dn[rounds].dir[0] != '\0')
        rounds++;
    for (int r = 0; r < rounds; r++) {
        if (dn[r].pid > 0)
            DT_CHECK(kvd_test_daemon_stop(&dn[r], SIGTERM, 10000, NULL) == 0,
                     "a daemon did not exit on SIGTERM");
        else
            kvd_test_daemon_stop(&dn[r], SIGTERM, 1000, NULL); /* its directory */
    }
    kvd_test_daemon_stop(&d1, SIGKILL, 5000, NULL); /* its directory, the files */
    printf("%d of %d rounds caught a reservation in flight\n", hits, rounds);
    return dt_exit_status("linker/stalled_offload");
}
