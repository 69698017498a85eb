/*
 * Description: a same-host writer punches many holes in the named pool
 * file at once (issue 14): one 4 KiB page inside each of 500 of 600
 * published objects, each hole apart from the next (the objects' other
 * pages stay data, so SEEK_HOLE sees 500 holes). The daemon finds them in
 * one damage check and hands them to the store in batches, not one walk
 * and one journal commit per hole:
 *   - Stats counts exactly 500 ranges and 500 objects lost;
 *   - every holed object is gone (Acquire: not found), every other one is
 *     there, byte-exact;
 *   - the file is whole again (allocated as sized);
 *   - the log names at most 8 holes and sums up the rest in one line
 *     ("500 holes in all"), with a few lines of the server, not one per
 *     hole;
 *   - the pool accounting and the invariant check hold.
 * The daemon is stopped (SIGSTOP) while the holes are punched, so that
 * its watch of the file cannot run a check between two punches: all 500
 * are there for the first check, as for a writer faster than the daemon.
 * How long the daemon took is printed, never asserted.
 */
#include "test_store_util.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define SALT    0x6d61u
#define N_OBJS  600 /* 600 x 64 KiB of the 64 MiB pool */
#define N_HOLES 500 /* every object but each sixth */
#define PAGE    4096u

static uint64_t want_ranges, want_objects;

static bool lost_seen(const ts_stats_t *st)
{
    return st->store.pool_lost_ranges >= want_ranges &&
           st->store.pool_lost_objects >= want_objects;
}

/* Whether object k gets a hole: 500 of the 600. */
static bool holed(int k)
{
    return k % 6 != 5;
}

static int punch(int fd, uint64_t off, uint64_t len)
{
    return fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)off,
                     (off_t)len);
}

/* Whether every thread of pid is stopped ('T' in /proc/PID/task/T/stat). */
static bool all_stopped(pid_t pid)
{
    char dir[64];
    snprintf(dir, sizeof(dir), "/proc/%d/task", (int)pid);
    DIR *d = opendir(dir);
    if (d == NULL)
        return false;
    bool stopped = true;
    struct dirent *e;
    while (stopped && (e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        char path[64 + sizeof(e->d_name) + 8], buf[512];
        snprintf(path, sizeof(path), "%s/%s/stat", dir, e->d_name);
        FILE *f = fopen(path, "r");
        if (f == NULL)
            continue; /* a thread that just ended */
        size_t n = fread(buf, 1, sizeof(buf) - 1, f);
        fclose(f);
        buf[n] = '\0';
        const char *close = strrchr(buf, ')'); /* after "pid (comm)" */
        stopped =
            close != NULL && close[1] == ' ' && (close[2] == 'T' || close[2] == 't');
    }
    closedir(d);
    return stopped;
}

/* SIGSTOP to pid, then waits (at most 5 s) until all its threads stopped. */
static bool stop_daemon(pid_t pid)
{
    if (kill(pid, SIGSTOP) != 0)
        return false;
    for (int i = 0; i < 500; i++) {
        if (all_stopped(pid))
            return true;
        usleep(10000);
    }
    return false;
}

/* Acquire of one key: KVD_OK (its bytes checked against the pattern when
 * verify, released again) or the status. */
static int acquire_one(ts_client_t *w, const kvd_key_t *key, bool verify, int k)
{
    uint64_t lease = 0, off = 0;
    ts_err_t e;
    int st = ts_acquire(w->c, w->ns[0], TS_KV_BYTES, key, 1, &lease, &off, &e);
    if (st != KVD_OK)
        return st;
    if (verify) {
        size_t bad = ts_verify(w->pool + off, TS_KV_BYTES, *key, SALT);
        DT_CHECK(bad == SIZE_MAX, "object %d, never holed, differs at byte %zu", k, bad);
    }
    ts_release(w->c, lease, &e);
    return KVD_OK;
}

/* Lines of text containing needle; the last such line into last (cut). */
static int count_lines(const char *text, const char *needle, char *last, size_t last_len)
{
    int n = 0;
    for (const char *bol = text; *bol != '\0';) {
        const char *eol = strchr(bol, '\n');
        size_t len = eol ? (size_t)(eol - bol) : strlen(bol);
        const char *hit = strstr(bol, needle);
        if (hit != NULL && hit < bol + len) {
            n++;
            if (last != NULL)
                snprintf(last, last_len, "%.*s", (int)len, bol);
        }
        bol += len + (eol != NULL);
    }
    return n;
}

/* The server's lines "N objects lost their bytes in M ranges": how many,
 * their N and M summed. */
static int server_lines(const char *text, uint64_t *objects, uint64_t *ranges)
{
    const char *needle = " objects lost their bytes in ";
    int lines = 0;
    *objects = *ranges = 0;
    for (const char *p = text; (p = strstr(p, needle)) != NULL; p++) {
        const char *q = p;
        while (q > text && q[-1] >= '0' && q[-1] <= '9')
            q--;
        *objects += strtoull(q, NULL, 10);
        *ranges += strtoull(p + strlen(needle), NULL, 10);
        lines++;
    }
    return lines;
}

/* The log, once it has the summary line (the daemon writes it before the
 * last batch reaches the store, so it should be there at once). */
static char *log_with_summary(const kvd_test_daemon_t *d)
{
    for (int i = 0; i < 200; i++) {
        char *text = dt_read_file(d->log);
        if (text != NULL && strstr(text, "holes in all") != NULL)
            return text;
        if (i == 199)
            return text;
        free(text);
        usleep(10000);
    }
    return NULL;
}

static void check_log(const kvd_test_daemon_t *d)
{
    char *text = log_with_summary(d);
    if (!DT_CHECK(text != NULL, "cannot read the log %s", d->log))
        return;
    int named = count_lines(text, "has a hole of", NULL, 0);
    char summary[512] = "";
    int summaries = count_lines(text, "holes in all", summary, sizeof(summary));
    uint64_t objects = 0, ranges = 0;
    int server = server_lines(text, &objects, &ranges);
    printf("log: %d holes named, %d summary lines (\"%s\"), %d server lines for %llu "
           "objects in %llu ranges\n",
           named, summaries, summary, server, (unsigned long long)objects,
           (unsigned long long)ranges);
    DT_CHECK(named >= 1 && named <= 8, "%d log lines name a hole, want 1 to 8", named);
    DT_CHECK(summaries == 1, "%d log lines say \"holes in all\", want 1", summaries);
    char want[64];
    snprintf(want, sizeof(want), ": %d holes in all", N_HOLES);
    DT_CHECK(strstr(summary, want) != NULL, "the summary line \"%s\" lacks \"%s\"",
             summary, want);
    /* a few lines, not one per hole; together they drop the 500 */
    DT_CHECK(server >= 1 && server <= 8,
             "%d server lines about lost objects, want a few, not one per hole", server);
    DT_CHECK(objects == N_HOLES && ranges == N_HOLES,
             "the server's lines count %llu objects in %llu ranges, want %d and %d",
             (unsigned long long)objects, (unsigned long long)ranges, N_HOLES, N_HOLES);
    free(text);
}

/* Reserves, fills (pattern of key and SALT) and publishes the objects. */
static bool put_all(ts_client_t *w, const kvd_key_t *keys, uint64_t *off)
{
    kvd_put_item_t *items = calloc(N_OBJS, sizeof(*items));
    uint8_t *res = calloc(N_OBJS, 1);
    bool ok = DT_CHECK(items != NULL && res != NULL, "out of memory");
    if (!ok)
        goto out;
    ts_chain_items(keys, N_OBJS, NULL, 0, items);
    uint64_t lease = 0;
    ts_err_t e;
    int st = ts_reserve(w->c, w->ns[0], TS_KV_BYTES, items, N_OBJS, &lease, res, off, &e);
    ok = DT_CHECK(st == KVD_OK, "reserve: %s (%s)", kvd_status_str(st), e.text);
    for (int k = 0; ok && k < N_OBJS; k++)
        ok =
            DT_CHECK(res[k] == KVD_RESERVE_ALLOCATED, "reserve item %d: %s", k,
                     ts_result_name(res[k])) &&
            DT_CHECK(ts_in_pool(off[k], TS_KV_BYTES, w->pool_bytes) && off[k] % PAGE == 0,
                     "item %d at %llu", k, (unsigned long long)off[k]);
    for (int k = 0; ok && k < N_OBJS; k++)
        ts_fill(w->pool + off[k], TS_KV_BYTES, keys[k], SALT);
    if (ok) {
        st = ts_publish(w->c, lease, NULL, 0, &e);
        ok = DT_CHECK(st == KVD_OK, "publish: %s (%s)", kvd_status_str(st), e.text);
    }
out:
    free(items);
    free(res);
    return ok;
}

/* Punches one page inside each holed object: page 1 to 14 of its 16, so
 * that data stays between any two holes. Returns how many failed. */
static int punch_all(const ts_client_t *w, const uint64_t *off)
{
    int failed = 0;
    for (int k = 0; k < N_OBJS; k++) {
        if (!holed(k))
            continue;
        uint64_t page = 1 + (uint64_t)k % 14;
        if (punch(w->pool_fd, off[k] + page * PAGE, PAGE) != 0 && failed++ == 0)
            dt_fail(__FILE__, __LINE__, "punch in object %d: %s", k, strerror(errno));
    }
    return failed;
}

static void run(const kvd_test_daemon_t *d)
{
    ts_client_t w;
    kvd_ns_spec_t spec = ts_spec(TS_KV_NS, TS_KV_BYTES);
    if (ts_open(&w, d->socket, &spec, 1, true) != 0)
        return;
    kvd_key_t *keys = calloc(N_OBJS, sizeof(*keys));
    uint64_t *off = calloc(N_OBJS, sizeof(*off));
    if (!DT_CHECK(keys != NULL && off != NULL, "out of memory") ||
        ts_make_keys(31, N_OBJS, 64, keys) != 0 || !put_all(&w, keys, off))
        goto out;
    ts_stats_t before, after;
    if (!DT_CHECK(ts_stats(w.c, false, &before) == KVD_OK, "stats before the holes"))
        goto out;
    DT_CHECK(before.store.objects_ready == N_OBJS, "%llu objects ready, want %d",
             (unsigned long long)before.store.objects_ready, N_OBJS);

    /* the holes, all of them before the daemon looks */
    if (!DT_CHECK(stop_daemon(d->pid), "the daemon did not stop on SIGSTOP")) {
        kill(d->pid, SIGCONT);
        goto out;
    }
    uint64_t t0 = kvd_now_ns();
    int failed = punch_all(&w, off);
    uint64_t t1 = kvd_now_ns();
    /* the holes are there (before the daemon runs again and fills them) */
    struct stat sb;
    DT_CHECK(fstat(w.pool_fd, &sb) == 0 &&
                 (uint64_t)sb.st_blocks * 512 <= w.pool_bytes - N_HOLES * PAGE,
             "the pool file has %llu bytes allocated after the punches, want %d pages "
             "fewer than %llu",
             (unsigned long long)sb.st_blocks * 512, N_HOLES,
             (unsigned long long)w.pool_bytes);
    DT_CHECK(kill(d->pid, SIGCONT) == 0, "SIGCONT: %s", strerror(errno));
    if (!DT_CHECK(failed == 0, "%d punches failed", failed))
        goto out;
    want_ranges = before.store.pool_lost_ranges + N_HOLES;
    want_objects = before.store.pool_lost_objects + N_HOLES;
    bool seen = ts_wait_stats(d->socket, 10000, lost_seen, &after);
    uint64_t t2 = kvd_now_ns();
    printf("%d holes: punched in %.1f ms (daemon stopped), all counted by Stats "
           "%.1f ms after the first punch (%.1f ms after SIGCONT)\n",
           N_HOLES, (double)(t1 - t0) / 1e6, (double)(t2 - t0) / 1e6,
           (double)(t2 - t1) / 1e6);
    DT_CHECK(seen, "Stats shows %llu ranges and %llu objects lost, want %llu and %llu",
             (unsigned long long)after.store.pool_lost_ranges,
             (unsigned long long)after.store.pool_lost_objects,
             (unsigned long long)want_ranges, (unsigned long long)want_objects);
    if (!seen)
        goto out;
    DT_CHECK(kill(d->pid, 0) == 0 && ts_health_ok(w.c) == KVD_OK,
             "the daemon died of the holes");

    /* each holed object is gone, every other one is there, byte-exact */
    int kept = 0, gone = 0;
    for (int k = 0; k < N_OBJS; k++) {
        int st = acquire_one(&w, &keys[k], true, k);
        if (holed(k))
            gone += DT_CHECK(st == KVD_ERR_NOT_FOUND,
                             "object %d, holed, can still be acquired (%s)", k,
                             kvd_status_str(st));
        else
            kept += DT_CHECK(st == KVD_OK, "object %d, never holed, is gone (%s)", k,
                             kvd_status_str(st));
    }
    DT_CHECK(gone == N_HOLES && kept == N_OBJS - N_HOLES, "%d gone and %d kept", gone,
             kept);
    /* the holes are allocated again: the pool stays as populated as sized */
    DT_CHECK(fstat(w.pool_fd, &sb) == 0 && (uint64_t)sb.st_blocks * 512 >= w.pool_bytes,
             "the pool file has %llu bytes allocated, want %llu",
             (unsigned long long)sb.st_blocks * 512, (unsigned long long)w.pool_bytes);

    check_log(d);
    /* exactly 500 each, also once the daemon had time to count more */
    ts_stats(w.c, false, &after);
    DT_CHECK(after.store.pool_lost_ranges == want_ranges &&
                 after.store.pool_lost_objects == want_objects,
             "Stats shows %llu ranges and %llu objects lost, want exactly %llu and %llu",
             (unsigned long long)after.store.pool_lost_ranges,
             (unsigned long long)after.store.pool_lost_objects,
             (unsigned long long)want_ranges, (unsigned long long)want_objects);
    DT_CHECK(after.store.objects_ready == N_OBJS - N_HOLES, "%llu objects ready, want %d",
             (unsigned long long)after.store.objects_ready, N_OBJS - N_HOLES);
    ts_check_accounting(&after, "after the holes");
    ts_cli_check(d->socket, "after the holes");
out:
    free(keys);
    free(off);
    ts_close(&w);
}

int main(void)
{
    return dt_main("daemon/pool_damage_many", NULL, run);
}
