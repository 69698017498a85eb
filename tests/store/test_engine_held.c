/*
 * Description: a lapsed writer's reservations (kvd_store.h kvd_writer_t).
 * A reservation of a known writer process whose lease ends unpublished
 * (its owner gone, its TTL passed) is held, whatever time passes, while
 * that process lives: its extent is never handed to another Reserve, even
 * with the pool full, and it counts in quarantined_bytes. It is freed once
 * the process is gone (exited and reaped, or a zombie), once the pid names
 * another process (another start time), or once the writer says its
 * copies are over (the same pid, start time and token; another token of
 * the same process frees nothing), which also revokes the reservations of
 * that writer's other connections still open (but not of the one that
 * said so). Without a writer the lease TTL rule
 * stays. A store restarted from its journal holds the extents of
 * reservations that were being written, and of held ones, for the same
 * writer; a journal of layout version 1 (without HELD entries) is read,
 * its partial writes under the TTL rule. The invariant holds throughout.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "engine_util.h"
#include "journal.h"
#include "kvd_store.h"

#define PAGE     4096u
#define POOL_PGS 64u
#define POOL     ((uint64_t)POOL_PGS * PAGE)
#define OWNER    5u
#define OTHER    6u
#define TTL_MS   1000u

static uint64_t now_ms;
static pid_t child = -1; /* the live writer process, killed by teardown */
static char dir[64], path[128];

static int setup(void **state)
{
    (void)state;
    now_ms = 1000;
    snprintf(dir, sizeof(dir), "/dev/shm/kvdock-held-XXXXXX");
    if (mkdtemp(dir) == NULL) {
        snprintf(dir, sizeof(dir), "/tmp/kvdock-held-XXXXXX");
        if (mkdtemp(dir) == NULL)
            return -1;
    }
    snprintf(path, sizeof(path), "%s/journal", dir);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    if (child > 0) { /* a check failed while it lived */
        kill(child, SIGKILL);
        waitpid(child, NULL, 0);
        child = -1;
    }
    char p[160];
    snprintf(p, sizeof(p), "%s.tmp", path);
    unlink(p);
    unlink(path);
    rmdir(dir);
    return 0;
}

/* A store of POOL_PGS pages, nothing evicted before it is full; attached
 * to the journal at `path` when journal (created: a new pool file). */
static kvd_store_t *open_store(bool journal, bool created, kvd_store_recovery_t *rec)
{
    kvd_store_config_t cfg;
    kvd_store_config_default(&cfg, POOL);
    cfg.evict_high = 1.0;
    cfg.evict_low = 1.0;
    cfg.lease_ttl_ms = TTL_MS;
    kvd_store_t *s = NULL;
    assert_int_equal(kvd_store_create(&cfg, &s), KVD_OK);
    if (journal) {
        kvd_store_journal_opts_t jo = {.path = path,
                                       .pool_dev = 1,
                                       .pool_ino = 2,
                                       .pool_created = created,
                                       .now_ms = now_ms};
        kvd_store_recovery_t r;
        char why[256] = "";
        int rc = kvd_store_journal_attach(s, &jo, rec ? rec : &r, why, sizeof(why));
        if (rc != KVD_OK)
            print_error("attach: %s\n", why);
        assert_int_equal(rc, KVD_OK);
    }
    check_ok(s);
    return s;
}

/* A child that does nothing until killed: a writer process whose life the
 * test decides. */
static pid_t child_start(kvd_writer_t *w, uint64_t token)
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlives the test */
        for (;;)
            pause();
    }
    child = pid;
    *w = (kvd_writer_t){.pid = (uint32_t)pid, .token = token};
    assert_int_equal(kvd_proc_start_ticks(pid, &w->start_ticks), KVD_OK);
    return pid;
}

static void child_kill(pid_t pid, bool reap)
{
    assert_int_equal(kill(pid, SIGKILL), 0);
    if (reap) {
        int st;
        assert_int_equal(waitpid(pid, &st, 0), pid);
        child = -1;
        return;
    }
    /* a zombie: dead, not reaped. Wait (bounded) until /proc says so. */
    uint64_t t;
    for (int k = 0; k < 2000 && kvd_proc_start_ticks(pid, &t) == KVD_OK; k++)
        usleep(1000);
    assert_int_equal(kvd_proc_start_ticks(pid, &t), KVD_ERR_NOT_FOUND);
}

/* Reserves keys [from, from + n) of ns for writer w (NULL: none); each must
 * answer `want`. Returns the lease. */
static uint64_t reserve(kvd_store_t *s, uint64_t owner, const kvd_writer_t *w,
                        uint32_t ns, uint32_t from, uint32_t n, uint8_t want)
{
    key_t32 keys[POOL_PGS + 1];
    kvd_put_t items[POOL_PGS + 1];
    uint8_t res[POOL_PGS + 1];
    kvd_loc_t locs[POOL_PGS + 1];
    assert_true(n <= POOL_PGS + 1);
    for (uint32_t k = 0; k < n; k++) {
        mkkey(keys[k], from + k);
        items[k] = (kvd_put_t){.key = keys[k], .depth = k};
    }
    uint64_t lease = 0;
    assert_int_equal(
        kvd_store_reserve_by(s, owner, w, ns, items, n, now_ms, &lease, res, locs),
        KVD_OK);
    for (uint32_t k = 0; k < n; k++) {
        if (res[k] != want)
            print_error("key %u: %s, not %s\n", from + k,
                        reserve_result_name((kvd_reserve_result_t)res[k]),
                        reserve_result_name((kvd_reserve_result_t)want));
        assert_int_equal(res[k], want);
    }
    return lease;
}

/* Lets `ms` pass, ticking the store as the daemon's loop does (several
 * ticks: a sweep reads /proc for a writer at most once a second). */
static void pass(kvd_store_t *s, uint64_t ms)
{
    for (uint64_t end = now_ms + ms; now_ms < end;) {
        now_ms += KVD_MIN(250, end - now_ms);
        kvd_store_expire(s, now_ms);
        check_ok(s);
    }
}

/* ------------------------------------------------------------- tests */

static void test_held_while_alive(void **state)
{
    (void)state;
    kvd_store_t *s = open_store(false, false, NULL);
    uint32_t ns = reg(s, "m/kv", PAGE);
    kvd_writer_t w;
    pid_t pid = child_start(&w, 42);
    /* the writer takes the whole pool, and its connection goes */
    reserve(s, OWNER, &w, ns, 0, POOL_PGS, KVD_RESERVE_ALLOCATED);
    assert_int_equal(kvd_store_owner_gone(s, OWNER), 1);
    check_ok(s);
    assert_int_equal(stats(s).quarantined_bytes, POOL);
    /* ten lease TTLs later nothing of it is free: a Reserve (the same keys
     * too, as they may be reserved again at once) finds no room */
    pass(s, 10 * TTL_MS);
    assert_int_equal(stats(s).quarantined_bytes, POOL);
    reserve(s, OTHER, NULL, ns, 0, 4, KVD_RESERVE_NO_SPACE);
    reserve(s, OTHER, NULL, ns, 1000, 4, KVD_RESERVE_NO_SPACE);
    /* the writer exits: the next sweeps free it all */
    child_kill(pid, true);
    pass(s, 2 * TTL_MS);
    assert_int_equal(stats(s).quarantined_bytes, 0);
    uint64_t lease = reserve(s, OTHER, NULL, ns, 0, POOL_PGS, KVD_RESERVE_ALLOCATED);
    assert_int_equal(kvd_store_publish(s, OTHER, lease, NULL, 0), KVD_OK);
    check_ok(s);
    kvd_store_destroy(s);
}

static void test_lease_expiry_held_zombie_frees(void **state)
{
    (void)state;
    kvd_store_t *s = open_store(false, false, NULL);
    uint32_t ns = reg(s, "m/kv", 2 * PAGE);
    kvd_writer_t w;
    pid_t pid = child_start(&w, 1);
    reserve(s, OWNER, &w, ns, 0, 8, KVD_RESERVE_ALLOCATED);
    /* the connection stays; the lease outlives its TTL */
    pass(s, 3 * TTL_MS);
    assert_int_equal(stats(s).quarantined_bytes, 8 * 2 * PAGE);
    /* dead but not reaped: it copies nothing any more */
    child_kill(pid, false);
    pass(s, 2 * TTL_MS);
    assert_int_equal(stats(s).quarantined_bytes, 0);
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    child = -1;
    kvd_store_destroy(s);
}

static void test_writer_done_and_pid_reuse(void **state)
{
    (void)state;
    kvd_store_t *s = open_store(false, false, NULL);
    uint32_t ns = reg(s, "m/kv", PAGE);
    kvd_writer_t me = {.pid = (uint32_t)getpid(), .token = 7};
    assert_int_equal(kvd_proc_start_ticks(getpid(), &me.start_ticks), KVD_OK);
    reserve(s, OWNER, &me, ns, 0, 4, KVD_RESERVE_ALLOCATED);
    kvd_writer_t me2 = me;
    me2.token = 8; /* another linker of the same process */
    reserve(s, OTHER, &me2, ns, 100, 2, KVD_RESERVE_ALLOCATED);
    kvd_store_owner_gone(s, OWNER);
    kvd_store_owner_gone(s, OTHER);
    pass(s, 3 * TTL_MS); /* alive: held */
    assert_int_equal(stats(s).quarantined_bytes, 6 * PAGE);
    /* the other token's word frees only its own */
    assert_int_equal(kvd_store_writer_done(s, &me2, OWNER + 100), 2 * PAGE);
    check_ok(s);
    assert_int_equal(stats(s).quarantined_bytes, 4 * PAGE);
    kvd_writer_t stranger = me;
    stranger.start_ticks++; /* the pid, but not this process */
    assert_int_equal(kvd_store_writer_done(s, &stranger, OWNER + 100), 0);
    assert_int_equal(stats(s).quarantined_bytes, 4 * PAGE);
    assert_int_equal(kvd_store_writer_done(s, &me, OWNER + 100), 4 * PAGE);
    assert_int_equal(stats(s).quarantined_bytes, 0);
    check_ok(s);

    /* an earlier connection whose close is not seen yet: its reservation
     * goes too (revoked: nothing copies into it); the new connection's
     * own stays */
    reserve(s, OWNER, &me, ns, 400, 2, KVD_RESERVE_ALLOCATED);
    uint64_t mine = reserve(s, OTHER, &me, ns, 410, 1, KVD_RESERVE_ALLOCATED);
    assert_int_equal(kvd_store_writer_done(s, &me, OTHER), 2 * PAGE);
    check_ok(s);
    assert_int_equal(stats(s).writing_bytes, PAGE);
    assert_int_equal(stats(s).quarantined_bytes, 0);
    assert_int_equal(kvd_store_owner_gone(s, OWNER), 0);        /* nothing left of it */
    reserve(s, OWNER, NULL, ns, 400, 2, KVD_RESERVE_ALLOCATED); /* free again */
    assert_int_equal(kvd_store_publish(s, OTHER, mine, NULL, 0), KVD_OK);
    kvd_store_owner_gone(s, OWNER);
    pass(s, 3 * TTL_MS);
    check_ok(s);

    /* a writer whose pid now names another process (its start time
     * differs): gone, its extents freed at the next sweeps */
    reserve(s, OWNER, &stranger, ns, 200, 3, KVD_RESERVE_ALLOCATED);
    kvd_store_owner_gone(s, OWNER);
    assert_int_equal(stats(s).quarantined_bytes, 3 * PAGE);
    pass(s, 2 * TTL_MS);
    assert_int_equal(stats(s).quarantined_bytes, 0);

    /* no writer: the lease TTL rule */
    reserve(s, OWNER, NULL, ns, 300, 3, KVD_RESERVE_ALLOCATED);
    kvd_store_owner_gone(s, OWNER);
    assert_int_equal(stats(s).quarantined_bytes, 3 * PAGE);
    pass(s, 3 * TTL_MS);
    assert_int_equal(stats(s).quarantined_bytes, 0);
    check_ok(s);
    kvd_store_destroy(s);
}

static void test_restart_holds(void **state)
{
    (void)state;
    kvd_store_t *s = open_store(true, true, NULL);
    uint32_t ns = reg(s, "m/kv", PAGE);
    kvd_writer_t w;
    pid_t pid = child_start(&w, 99);
    /* one reservation still being written, one already held, one of no
     * known writer, and a published object */
    reserve(s, OWNER, &w, ns, 0, 5, KVD_RESERVE_ALLOCATED);
    reserve(s, OTHER, &w, ns, 10, 3, KVD_RESERVE_ALLOCATED);
    kvd_store_owner_gone(s, OTHER);
    reserve(s, OTHER, NULL, ns, 20, 2, KVD_RESERVE_ALLOCATED);
    uint64_t pub = reserve(s, OTHER, NULL, ns, 30, 4, KVD_RESERVE_ALLOCATED);
    assert_int_equal(kvd_store_publish(s, OTHER, pub, NULL, 0), KVD_OK);
    kvd_store_destroy(s); /* as a SIGKILL */

    kvd_store_recovery_t rec;
    s = open_store(true, false, &rec);
    assert_int_equal(rec.objects, 4);
    assert_int_equal(stats(s).quarantined_bytes, (5 + 3 + 2) * PAGE);
    /* past the TTL: the writer-less one is free, the writer's are not */
    pass(s, 3 * TTL_MS);
    assert_int_equal(stats(s).quarantined_bytes, (5 + 3) * PAGE);
    /* and stay so across another restart (the new journal's snapshot
     * names their writer again) */
    kvd_store_destroy(s);
    s = open_store(true, false, &rec);
    pass(s, 3 * TTL_MS);
    assert_int_equal(stats(s).quarantined_bytes, (5 + 3) * PAGE);
    child_kill(pid, true);
    pass(s, 2 * TTL_MS);
    assert_int_equal(stats(s).quarantined_bytes, 0);
    assert_int_equal(stats(s).objects_ready, 4);
    kvd_store_destroy(s);
}

/* A journal written by the layout before HELD entries (version 1) reads
 * back: its partial writes under the TTL rule. Made by writing a store
 * without writers and stamping the header version 1, which is the whole
 * difference between the two layouts for such a file. */
static void test_reads_version_1(void **state)
{
    (void)state;
    kvd_store_t *s = open_store(true, true, NULL);
    uint32_t ns = reg(s, "m/kv", PAGE);
    uint64_t pub = reserve(s, OWNER, NULL, ns, 0, 3, KVD_RESERVE_ALLOCATED);
    assert_int_equal(kvd_store_publish(s, OWNER, pub, NULL, 0), KVD_OK);
    reserve(s, OWNER, NULL, ns, 10, 2, KVD_RESERVE_ALLOCATED);
    kvd_store_destroy(s);
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    jnl_header_t h;
    assert_int_equal(fread(&h, sizeof(h), 1, f), 1);
    assert_int_equal(h.version, JNL_VERSION);
    h.version = 1;
    h.crc = kvd_crc32c(0, &h, offsetof(jnl_header_t, crc));
    assert_int_equal(fseek(f, 0, SEEK_SET), 0);
    assert_int_equal(fwrite(&h, sizeof(h), 1, f), 1);
    fclose(f);
    kvd_store_recovery_t rec;
    s = open_store(true, false, &rec);
    assert_int_equal(rec.objects, 3);
    assert_int_equal(rec.writing_discarded, 2);
    pass(s, 3 * TTL_MS);
    assert_int_equal(stats(s).quarantined_bytes, 0);
    kvd_store_destroy(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_held_while_alive, setup, teardown),
        cmocka_unit_test_setup_teardown(test_lease_expiry_held_zombie_frees, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_writer_done_and_pid_reuse, setup, teardown),
        cmocka_unit_test_setup_teardown(test_restart_holds, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reads_version_1, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
