/*
 * chaos.c - kvdock-chaos, the chaos and soak driver (`make chaos`, `make
 * soak`; not part of `make test`). Not a meson test: it runs for minutes.
 *
 * chaos: one kvdockd of its own (a socket in a temporary directory, a
 * 256 MiB pool, a short lease TTL) and N worker engines (engine.c) doing
 * random lookups, layer-wise loads (ABORT now and then) and offloads over
 * a few shared prefixes, so they hit each other's pages. Each round the
 * driver injures at random points, a bounded number of times: SIGKILL of a
 * worker (restarted), SIGSTOP/SIGCONT of a worker (sometimes past the lease
 * TTL), SIGSTOP/SIGCONT of the daemon (shorter and longer than the linker's
 * timeout), and at most once a round (always once in even rounds, or in
 * every round with --kill-daemon-every-round) SIGKILL of the daemon and a
 * restart. --max-seconds bounds the whole run: no round starts past it.
 * Then it quiesces (stops injuring, asks every worker to finish) and
 * checks: the daemon's invariant (Stats with check), nothing leaked (no
 * lease, pin, reservation or quarantined extent once the grace passed;
 * the daemon's fds and heap bounded), and every acknowledged object
 * readable byte-exact (a verifier loads them all).
 *
 * What "acknowledged" can promise:
 *  - A daemon killed keeps its cache: it is started again on the same pool
 *    file and journal (--shm-dir, in a directory of the run's own under
 *    /dev/shm), so every object acknowledged before its death is verified
 *    like the others, and the restarted daemon must log what it recovered.
 *    (--no-persist runs the daemon with an anonymous pool, as before
 *    issue 14: then only offloads after its last death are verified.)
 *  - Nothing visible may be wrong: besides the acknowledged objects, every
 *    other key of the key set the store holds (a publish whose ack a
 *    killed worker never wrote, or a partial write a restart wrongly kept)
 *    is loaded and checked byte-exact.
 *  - An offload's ack counts pages another writer is still writing
 *    (IN_FLIGHT) as stored (kvdock.h, kvd_offload). When that writer is
 *    killed or stalled past its lease, such a page never lands although its
 *    ack said success. A missing page whose offload ran near a writer's
 *    injury is therefore counted as excused, not failed; every other
 *    missing page is a failure.
 *  - The key set is bounded (CH_SUFFIXES) and the pool sized so that nothing
 *    is evicted; if the daemon dropped objects anyway (its evictions, the
 *    tier's, failed promotions: drops()), losses count as evictions, never
 *    more of them than the round's drops.
 *
 * --ssd: the daemon gets an SSD tier (--ssd-path <run dir>/tier, --ssd-size,
 * 4 MiB segments) and, unless --pool says otherwise, an 8 MiB pool against
 * the workers' 27 MiB working set, so that the watermark spills objects to
 * the tier and loads wait for their promotion. The checks are the same
 * (every acknowledged object present, on either tier, and byte-exact; the
 * invariant; no leak); the verifier looks every object up before it loads
 * any (a load promotes, and the room it makes may drop another object: such
 * a loss is bounded by the drops counted meanwhile), and nothing may have
 * failed on the tier (no fault is injected: an I/O error, a checksum
 * failure or a failed promotion is a defect). The restarted daemon's line
 * "SSD tier ...: recovered N objects" must agree with its Stats.
 * --reboot (with --ssd): each daemon kill also deletes the pool file and
 * journal (a reboot empties tmpfs): then no acknowledged object is
 * required, every object present must be byte-exact, and as many must be
 * present as the tier held before the kill (reboot_bound_t).
 *
 * Bounds: a worker times each linker call (not counting a call during
 * which it was itself stopped); a call that outlasts the linker's
 * timeout_ms by more than 1 s (issue 11 hole 6: while the daemon is
 * stopped) is counted and listed at the end, and --strict-timeouts makes
 * one a failure (off by default until that hole is closed).
 *
 * soak: the same workload without injuries over a key set that cycles the
 * pool (eviction in steady state), for --duration seconds; every second
 * the daemon's VmRSS, RssAnon and RssShmem (/proc/PID/status) and the
 * pool's populated bytes (Stats) go to a CSV; after warm-up (the first
 * 10 %, and until the pool is full and the store evicts) the drift of the
 * daemon's own memory (VmRSS - RssShmem: the pool is shared memory) must
 * stay under --max-drift-mib and the slope of a linear fit under
 * --max-slope-kibs. Any error a worker sees fails it. Judge drift on the
 * normal tree: under ASan the allocator's quarantine keeps freed memory
 * by design (up to 256 MiB unless ASAN_OPTIONS=quarantine_size_mb=0).
 *
 * Nothing here signals a process it did not start (pids of its children
 * only); every wait is bounded.
 */
#include "chaos.h"
#include "kvd_common.h"
#include "kvd_proto.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAX_WORKERS 16
/* the defaults of --lease-ttl-ms and --timeout-ms: short, so that the
 * stops of a round outlast them */
#define LEASE_TTL_MS   3000
#define LINKER_TIMEOUT 1500
#define READY_MS       30000
#define WORKER_EXIT_MS 90000 /* a worker finishes within this of SIGTERM */
#define RPC_MS         5000

typedef struct opts {
    const char *kvdockd;
    const char *self;
    const char *pool;
    const char *csv;
    const char *only; /* --only: the injury kinds, comma-separated */
    int rounds, workers, round_s, max_injuries, duration_s, ttl_ms, timeout_ms;
    uint64_t seed;
    bool soak, keep;
    bool strict_timeouts; /* a call past timeout_ms + 1 s fails the run */
    bool no_persist;      /* the daemon's pool dies with it (the old behaviour) */
    bool kill_every_round;
    int max_seconds;      /* 0: no bound but the rounds' */
    bool ssd;             /* the daemon has an SSD tier in the run's directory */
    bool reboot;          /* with ssd: each daemon kill loses the pool and journal */
    const char *ssd_size; /* the tier's --ssd-size */
    bool pool_given;
    double max_drift_mib, max_slope_kibs;
} opts_t;

typedef struct run {
    opts_t o;
    char dir[128], socket[192], excuse[256];
    char shm[160]; /* the daemon's pool file, journal and lock (--shm-dir) */
    pid_t daemon;
    int daemon_gen;
    uint64_t since_ms; /* the last daemon death that lost the cache (0: none) */
    uint64_t death_ms; /* the daemon's last SIGKILL (0: none) */
    char tier[160];    /* the SSD tier's directory (--ssd) */
    /* the daemon's drops (drops()) after the driver's own evict-all, or 0
     * for a daemon started since: more than this is the store's own drop;
     * drops_prior adds those of this round's killed incarnations. A loss of
     * an acknowledged object is excused only when the round dropped objects,
     * and never more losses than drops */
    uint64_t drops_base, drops_prior;
    uint64_t fds_base, anon_base, staging_base;
    pid_t wpid[MAX_WORKERS];
    int wgen[MAX_WORKERS];
    uint64_t wrestart_at[MAX_WORKERS]; /* 0: not waiting for a restart */
    uint64_t rng;
    /* figures */
    uint64_t rounds, worker_kills, worker_stops, worker_stops_long, daemon_stops,
        daemon_stops_long, daemon_kills, failures, objects_verified, missing_excused,
        missing_evicted, objects_survived, unacked_verified, recovered;
    /* the SSD tier's figures, summed over the daemon's incarnations (each
     * one's counters when it was killed or stopped) */
    uint64_t spills, promotions, ssd_drops, ssd_recovered, reboots, lost_verifying;
} run_t;

static void fail(run_t *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail(run_t *r, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "chaos: FAIL ");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    r->failures++;
}

static uint64_t rnd(run_t *r, uint64_t lo, uint64_t hi)
{
    return lo + ch_rand(&r->rng) % (hi - lo + 1);
}

/* ------------------------------------------------------------- processes */

/* fork + exec argv with stdout and stderr into log; 0 on failure. */
static pid_t spawn(char *const argv[], const char *log)
{
    pid_t pid = fork();
    if (pid < 0)
        return 0;
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
            close(fd);
        }
        execv(argv[0], argv);
        _exit(127);
    }
    return pid;
}

/* Waits up to ms for our child pid; true with *st once reaped. */
static bool wait_child(pid_t pid, int ms, int *st)
{
    uint64_t until = ch_now_ms() + (uint64_t)ms;
    for (;;) {
        pid_t p = waitpid(pid, st, WNOHANG);
        if (p == pid)
            return true;
        if (p < 0 || ch_now_ms() > until)
            return false;
        ch_sleep_ms(10);
    }
}

/* "VmRSS:" and the like from /proc/PID/status, in bytes (0: unknown). */
static uint64_t proc_status_kb(pid_t pid, const char *field)
{
    char path[64], line[256];
    snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    uint64_t v = 0;
    size_t n = strlen(field);
    while (f && fgets(line, sizeof(line), f))
        if (strncmp(line, field, n) == 0) {
            v = strtoull(line + n, NULL, 10) * 1024;
            break;
        }
    if (f)
        fclose(f);
    return v;
}

static uint64_t proc_fds(pid_t pid)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
    DIR *d = opendir(path);
    uint64_t n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL)
        n += e->d_name[0] != '.';
    if (d)
        closedir(d);
    return n;
}

/* ---------------------------------------------------------------- the RPC */

/* A fresh connection to the daemon, Hello said (proto's kvd_client_open). */
static int driver_connect(const char *socket, kvd_client_t **c)
{
    bool refused;
    return kvd_client_open(socket, NULL, "chaos-driver", NULL, 0, RPC_MS, c, &refused,
                           NULL);
}

/* One RPC as proto's queries make them (a kvd_call_fn): the transport's
 * status, else the daemon's. */
static int driver_call(void *c, kvd_msg_t *req, kvd_msg_t *rep)
{
    int rc = kvd_client_call(c, req, rep, RPC_MS);
    return rc == KVD_OK ? rep->status : rc;
}

/* Stats (check: the store's invariant) on a fresh connection. */
static int daemon_stats(const char *socket, bool check, kvd_stats_rep_t *out)
{
    kvd_client_t *c = NULL;
    int rc = driver_connect(socket, &c);
    if (rc != KVD_OK)
        return rc;
    kvd_msg_t *m = calloc(2, sizeof(kvd_msg_t));
    if (m == NULL) {
        kvd_client_close(c);
        return KVD_ERR_NOMEM;
    }
    kvd_msg_request(&m[0], 0, KVD_METHOD_STATS);
    m[0].body.stats_req.check = check;
    rc = driver_call(c, &m[0], &m[1]);
    if (rc == KVD_OK) {
        *out = m[1].body.stats_rep;
        out->n_namespaces = 0;
        out->namespaces = NULL;
        out->n_nics = 0;
        out->nics = NULL;
    }
    kvd_msg_clear(&m[1]);
    free(m);
    kvd_client_close(c);
    return rc;
}

/* Evicts every object (Evict all, in the daemon's slices: proto's
 * kvd_evict_run) on a fresh connection; *evicted gets how many went. */
static int daemon_evict_all(const char *socket, uint64_t *evicted)
{
    *evicted = 0;
    kvd_client_t *c = NULL;
    int rc = driver_connect(socket, &c);
    if (rc != KVD_OK)
        return rc;
    kvd_evict_req_t all = {.all = true};
    uint64_t skipped;
    bool complete;
    rc = kvd_evict_run(driver_call, c, &all, 100000, evicted, &skipped, &complete);
    kvd_client_close(c);
    return rc;
}

/* ---------------------------------------------------------------- daemon */

/* The objects the store dropped, as its counters say: evicted from DRAM
 * (on demand, past the watermark without a tier, a spill that failed), from
 * the SSD tier (for room, or the driver's evict-all), and promotions that
 * failed (the object is dropped, never served wrong). */
static uint64_t drops(const kvd_stats_rep_t *st)
{
    return st->store.evictions + st->store.ssd_evictions + st->store.promote_failures;
}

/* The drops of this round so far, over every incarnation of the daemon
 * (st: the running one's Stats). */
static uint64_t round_drops(const run_t *r, const kvd_stats_rep_t *st)
{
    uint64_t now = drops(st);
    return r->drops_prior + (now > r->drops_base ? now - r->drops_base : 0);
}

/* N of the SSD tier's start-up line ("SSD tier DIR: ...; recovered N
 * objects ..."), or -1 when the log has no such line. */
static long long tier_recovered_logged(const char *log)
{
    FILE *f = fopen(log, "r");
    char line[2048];
    long long n = -1;
    while (f && n < 0 && fgets(line, sizeof(line), f)) {
        const char *t = strstr(line, "SSD tier ");
        const char *c = t ? strstr(t, "; recovered ") : NULL;
        if (c != NULL)
            n = strtoll(c + strlen("; recovered "), NULL, 10);
    }
    if (f)
        fclose(f);
    return n;
}

/* A daemon started again on the pool files must have read its journal:
 * its log says what it recovered, and Stats agrees. After a reboot (the
 * pool file and journal deleted) it must say it started on a new pool
 * file. With a tier, its line says what the tier recovered, and Stats
 * agrees. */
static void recovery_seen(run_t *r, const char *log, const kvd_stats_rep_t *st,
                          bool rebooted)
{
    FILE *f = fopen(log, "r");
    char line[2048];
    bool seen = false;
    while (f && !seen && fgets(line, sizeof(line), f))
        seen = rebooted ? strstr(line, "a new pool file: nothing to recover") != NULL
                        : strstr(line, "recovered ") != NULL &&
                              strstr(line, " namespaces from ") != NULL;
    if (f)
        fclose(f);
    if (!seen)
        fail(r, "the restarted daemon did not %s (log %s)",
             rebooted ? "start on a new pool file after the reboot"
                      : "recover its journal",
             log);
    printf("  daemon restarted: recovered %" PRIu64 " objects (%" PRIu64 " bytes)%s\n",
           st->store.recovered_objects, st->store.recovered_bytes,
           rebooted ? " from the journal of a new pool file (a reboot)" : "");
    r->recovered += st->store.recovered_objects;
    if (!r->o.ssd)
        return;
    long long n = tier_recovered_logged(log);
    printf("  SSD tier: recovered %lld objects (the daemon's start-up line), Stats "
           "ssd_recovered_objects %" PRIu64 ", ssd_objects %" PRIu64 "\n",
           n, st->store.ssd_recovered_objects, st->store.ssd_objects);
    if (n < 0)
        fail(r,
             "the restarted daemon has no \"SSD tier ...: recovered N objects\" "
             "line (log %s)",
             log);
    else if ((uint64_t)n != st->store.ssd_recovered_objects)
        fail(r,
             "the SSD tier's start-up line says %lld objects recovered, Stats %" PRIu64,
             n, st->store.ssd_recovered_objects);
    r->ssd_recovered += st->store.ssd_recovered_objects;
}

/* Adds what a daemon incarnation's tier did (its last Stats) to the run's
 * figures. */
static void tier_figures_add(run_t *r, const kvd_stats_rep_t *st)
{
    r->spills += st->store.spills;
    r->promotions += st->store.promotions;
    r->ssd_drops += st->store.ssd_evictions + st->store.promote_failures;
}

static int daemon_start(run_t *r, bool rebooted)
{
    char log[256], inst[64];
    r->daemon_gen++;
    snprintf(log, sizeof(log), "%s/kvdockd.%d.log", r->dir, r->daemon_gen);
    snprintf(inst, sizeof(inst), "chaos-%d", (int)getpid());
    char ttl[32];
    snprintf(ttl, sizeof(ttl), "%d", r->o.ttl_ms);
    char *argv[40];
    int a = 0;
    char *fixed[] = {(char *)r->o.kvdockd, "--socket", r->socket, "--instance", inst,
                     "--pool-size", (char *)r->o.pool, "--lease-ttl", ttl,
                     "--usage-interval", "0", "--shm-dir", r->shm,
                     /* the floor out of the way: compaction starts once a
                      * round's offloads and evictions make the journal twice
                      * what a snapshot takes */
                     "--journal-compact", "64K"};
    for (size_t i = 0; i < sizeof(fixed) / sizeof(fixed[0]); i++)
        argv[a++] = fixed[i];
    if (r->o.no_persist)
        argv[a++] = "--no-persist";
    if (r->o.ssd) {
        /* small segments, so that a round fills and compacts some; the
         * watermarks low, so that spills (asynchronous: a spill frees its
         * DRAM once written) keep room for the promotions of loads, and the
         * store rarely drops on demand */
        char *tier[] = {
            "--ssd-path",         r->tier, "--ssd-size",   (char *)r->o.ssd_size,
            "--ssd-segment-size", "4M",    "--evict-high", "0.75",
            "--evict-low",        "0.6"};
        for (size_t i = 0; i < sizeof(tier) / sizeof(tier[0]); i++)
            argv[a++] = tier[i];
    }
    argv[a] = NULL;
    r->daemon = spawn(argv, log);
    if (r->daemon == 0) {
        fail(r, "cannot start kvdockd: %s", strerror(errno));
        return -1;
    }
    uint64_t until = ch_now_ms() + READY_MS;
    kvd_stats_rep_t *st = malloc(sizeof(*st));
    while (ch_now_ms() < until) {
        int s;
        if (waitpid(r->daemon, &s, WNOHANG) == r->daemon) {
            r->daemon = 0;
            break;
        }
        if (daemon_stats(r->socket, false, st) == KVD_OK &&
            st->state == KVD_HEALTH_READY) {
            r->fds_base = proc_fds(r->daemon);
            r->anon_base = proc_status_kb(r->daemon, "RssAnon:");
            r->staging_base = st->memory.staging_bytes;
            r->drops_base = 0; /* a new process: its counters start anew */
            if (r->daemon_gen > 1 && !r->o.no_persist)
                recovery_seen(r, log, st, rebooted);
            free(st);
            return 0;
        }
        ch_sleep_ms(50);
    }
    free(st);
    fail(r, "kvdockd did not become ready within %d ms (log %s)", READY_MS, log);
    return -1;
}

/* Reaps the daemon if it died; a death we did not cause is a failure. */
static void daemon_reap(run_t *r)
{
    int st;
    if (r->daemon > 0 && waitpid(r->daemon, &st, WNOHANG) == r->daemon) {
        fail(r, "kvdockd died on its own: %s %d (log %s/kvdockd.%d.log)",
             WIFEXITED(st) ? "exit" : "signal",
             WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st), r->dir, r->daemon_gen);
        r->daemon = 0;
        if (r->o.no_persist)
            r->since_ms = ch_now_ms();
        daemon_start(r, false);
    }
}

/* --------------------------------------------------------------- workers */

static void worker_start(run_t *r, int i)
{
    char idx[16], gen[16], seed[32], sfx[16], tmo[16], log[256];
    r->wgen[i]++;
    snprintf(idx, sizeof(idx), "%d", i);
    snprintf(gen, sizeof(gen), "%d", r->wgen[i]);
    snprintf(seed, sizeof(seed), "%" PRIu64,
             r->o.seed * 1000003u + (uint64_t)i * 7919u + (uint64_t)r->wgen[i] * 104729u);
    snprintf(sfx, sizeof(sfx), "%u", r->o.soak ? CH_WIDE_SUFFIXES : CH_SUFFIXES);
    snprintf(tmo, sizeof(tmo), "%d", r->o.timeout_ms);
    snprintf(log, sizeof(log), "%s/w%d.g%d.log", r->dir, i, r->wgen[i]);
    char *argv[] = {(char *)r->o.self,
                    "--worker",
                    "--socket",
                    r->socket,
                    "--dir",
                    r->dir,
                    "--index",
                    idx,
                    "--gen",
                    gen,
                    "--seed",
                    seed,
                    "--suffixes",
                    sfx,
                    "--timeout-ms",
                    tmo,
                    r->o.soak ? "--strict" : NULL,
                    NULL};
    r->wpid[i] = spawn(argv, log);
    r->wrestart_at[i] = 0;
    if (r->wpid[i] == 0)
        fail(r, "cannot start worker %d: %s", i, strerror(errno));
}

/* Reaps workers that died on their own (a crash, or an exit before we
 * asked: both failures) and restarts those due. */
static void supervise(run_t *r)
{
    daemon_reap(r);
    uint64_t now = ch_now_ms();
    for (int i = 0; i < r->o.workers; i++) {
        int st;
        if (r->wpid[i] > 0 && waitpid(r->wpid[i], &st, WNOHANG) == r->wpid[i]) {
            fail(r, "worker %d died on its own: %s %d (log %s/w%d.g%d.log)", i,
                 WIFEXITED(st) ? "exit" : "signal",
                 WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st), r->dir, i, r->wgen[i]);
            r->wpid[i] = 0;
            r->wrestart_at[i] = now + 200;
        }
        if (r->wpid[i] == 0 && r->wrestart_at[i] != 0 && now >= r->wrestart_at[i])
            worker_start(r, i);
    }
}

/* Sleeps ms while supervising. */
static void pause_ms(run_t *r, uint64_t ms)
{
    uint64_t until = ch_now_ms() + ms;
    while (ch_now_ms() < until) {
        supervise(r);
        ch_sleep_ms(20);
    }
}

/* An injury that may cost a writer its reservations: the verifier excuses
 * losses of pages offloaded near it. */
static void excuse(run_t *r, uint64_t start, uint64_t end)
{
    FILE *f = fopen(r->excuse, "a");
    if (f) {
        fprintf(f, "%" PRIu64 " %" PRIu64 "\n", start, end);
        fclose(f);
    }
}

/* One injury at random; returns when it is over (what it stopped runs). */
/* The kind of injury k (0..9) is: its name in --only. */
static const char *injury_kind(uint64_t k)
{
    return k <= 2   ? "kill-worker"
           : k <= 5 ? "stop-worker"
           : k <= 8 ? "stop-daemon"
                    : "kill-daemon";
}

/*
 * What a reboot must keep: the tier's objects at the last Stats before the
 * kill. The Stats say how many, not which, so the check is on counts:
 * after the restart the objects present (every one verified byte-exact,
 * plus those the verifier's own loads made room by dropping, bounded by
 * the drops counted) are at least ssd_objects - promoting. Exact but for
 * what the daemon does between those Stats and the kill, a few ms with the
 * workers stopped: spills that end (they only add to the tier) and
 * promotions in flight (subtracted: they move an object to DRAM, which
 * the reboot loses); tier eviction needs a spill short of room, and the
 * tier is sized for the key set several times over.
 */
typedef struct reboot_bound {
    bool known; /* the Stats before the kill answered */
    uint64_t ssd_objects, promoting;
} reboot_bound_t;

static void verify(run_t *r, const char *when, const reboot_bound_t *rb);

/* Removes the files of dir (not dir itself, nor its folders). */
static void rm_files(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        char path[512];
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        unlink(path);
    }
    if (d)
        closedir(d);
}

/* Appends the daemon's kill time to the run's deaths file. */
static void note_death(run_t *r)
{
    char path[300];
    snprintf(path, sizeof(path), "%s/deaths", r->dir);
    FILE *f = fopen(path, "a");
    if (f) {
        fprintf(f, "%" PRIu64 "\n", r->death_ms);
        fclose(f);
    }
}

/* Sends sig to every worker that runs. */
static void workers_signal(run_t *r, int sig)
{
    for (int i = 0; i < r->o.workers; i++)
        if (r->wpid[i] > 0)
            kill(r->wpid[i], sig);
}

/* SIGKILLs every worker that runs and reaps it; none is restarted until
 * the caller starts it. */
static void workers_kill(run_t *r)
{
    for (int i = 0; i < r->o.workers; i++) {
        int st;
        r->wrestart_at[i] = 0;
        if (r->wpid[i] <= 0)
            continue;
        kill(r->wpid[i], SIGKILL);
        wait_child(r->wpid[i], 5000, &st);
        r->wpid[i] = 0;
        r->worker_kills++;
    }
}

static void injure(run_t *r, bool may_kill_daemon, bool kill_daemon)
{
    uint64_t k = 9;
    while (!kill_daemon) { /* --only names the kinds allowed (main checks one is) */
        k = rnd(r, 0, may_kill_daemon ? 9 : 8);
        if (r->o.only == NULL || strstr(r->o.only, injury_kind(k)) != NULL ||
            (!may_kill_daemon && strcmp(r->o.only, "kill-daemon") == 0))
            break;
    }
    if (r->o.only != NULL && strstr(r->o.only, injury_kind(k)) == NULL)
        return; /* only daemon kills, and this round had its one */
    int i = (int)rnd(r, 0, (uint64_t)r->o.workers - 1);
    uint64_t t0 = ch_now_ms();
    if (k <= 2) { /* SIGKILL a worker; it comes back in a moment */
        if (r->wpid[i] <= 0)
            return;
        kill(r->wpid[i], SIGKILL);
        int st;
        wait_child(r->wpid[i], 5000, &st);
        r->wpid[i] = 0;
        r->wrestart_at[i] = ch_now_ms() + rnd(r, 100, 1000);
        r->worker_kills++;
        excuse(r, t0, ch_now_ms());
        printf("  kill worker %d\n", i);
    } else if (k <= 5) { /* SIGSTOP a worker, sometimes past the lease TTL */
        if (r->wpid[i] <= 0)
            return;
        bool lng = k == 5;
        uint64_t d = lng ? (uint64_t)r->o.ttl_ms + rnd(r, 500, 1500) : rnd(r, 100, 1000);
        kill(r->wpid[i], SIGSTOP);
        pause_ms(r, d);
        kill(r->wpid[i], SIGCONT);
        r->worker_stops++;
        r->worker_stops_long += lng;
        excuse(r, t0, ch_now_ms());
        printf("  stop worker %d for %" PRIu64 " ms\n", i, d);
    } else if (k <= 8) { /* SIGSTOP the daemon: shorter, longer than the timeout */
        if (r->daemon <= 0)
            return;
        bool lng = k == 8;
        uint64_t d = lng ? (uint64_t)r->o.timeout_ms + rnd(r, 500, 2500)
                         : rnd(r, 100, (uint64_t)r->o.timeout_ms / 2);
        kill(r->daemon, SIGSTOP);
        pause_ms(r, d);
        kill(r->daemon, SIGCONT);
        r->daemon_stops++;
        r->daemon_stops_long += lng;
        excuse(r, t0, ch_now_ms());
        printf("  stop daemon for %" PRIu64 " ms\n", d);
    } else { /* SIGKILL the daemon and start another on its pool files */
        if (r->daemon <= 0)
            return;
        /* the workers wait (SIGSTOP) from just before the kill until the
         * restarted daemon was checked: otherwise they would offload again
         * what the restart lost, before anyone looked */
        bool check = !r->o.no_persist;
        reboot_bound_t rb = {0};
        if (check) {
            kvd_stats_rep_t *st = malloc(sizeof(*st));
            if (r->o.ssd) {
                /* killed first (restarted once the restart was checked),
                 * and a moment for what they asked to be served: the Stats
                 * then see the tier as the kill finds it. Not stopped: a
                 * worker stopped across the restart and the verifier
                 * (seconds, with promotions) outlasts its lease and the
                 * restart's quarantine of its partial writes, and its
                 * copy, resumed, lands in a freed extent the small pool
                 * has given another object since (seed 1: another key's
                 * bytes spilled with a valid CRC). Its offloads running at
                 * the kill are excused as the daemon's kill excuses them
                 * (kill_excuses: no ack before it) */
                workers_kill(r);
                pause_ms(r, 200);
            }
            if (st && daemon_stats(r->socket, false, st) == KVD_OK) {
                r->drops_prior = round_drops(r, st);
                tier_figures_add(r, st);
                rb.ssd_objects = st->store.ssd_objects;
                rb.promoting =
                    (st->store.promoting_bytes + CH_OBJECT_BYTES - 1) / CH_OBJECT_BYTES;
                rb.known = true;
            }
            free(st);
            if (!r->o.ssd)
                workers_signal(r, SIGSTOP);
        }
        kill(r->daemon, SIGKILL);
        int st;
        wait_child(r->daemon, 5000, &st);
        r->daemon = 0;
        r->death_ms = ch_now_ms();
        if (r->o.no_persist)
            r->since_ms = r->death_ms; /* its cache went with it */
        else
            note_death(r);
        r->daemon_kills++;
        bool rebooted = r->o.reboot && check;
        if (rebooted) {
            /* a reboot: tmpfs is gone, with the pool file and the journal
             * (and the lock); the tier on its disk stays */
            rm_files(r->shm);
            r->since_ms = r->death_ms; /* DRAM's objects went with it */
            r->drops_prior = 0;
            r->reboots++;
        }
        pause_ms(r, rnd(r, 100, 1000));
        daemon_start(r, rebooted);
        printf("  kill daemon%s, restarted\n",
               rebooted ? ", its pool file and journal deleted (a reboot)" : "");
        if (check) {
            /* every object acknowledged before the kill is there, byte-exact,
             * and nothing else the store holds is wrong; a loss is excused
             * only for a page whose writer was still at it when the kill
             * came (the verifier reads the kill times and every offload).
             * After a reboot nothing acknowledged is required (DRAM's
             * objects are gone), every object present must be byte-exact,
             * and the tier's must be there (verify, reboot_bound_t) */
            verify(r, "after the daemon's restart", rebooted ? &rb : NULL);
            if (r->o.ssd) {
                for (int i = 0; i < r->o.workers; i++)
                    worker_start(r, i);
                /* time to take their SIGTERM handler: a round may end now */
                pause_ms(r, 1000);
            } else
                workers_signal(r, SIGCONT);
        } else {
            excuse(r, t0, ch_now_ms());
        }
    }
}

/* Asks every worker to finish (SIGTERM) and reaps them; a worker that does
 * not exit in time, or exits by a signal, is a failure. */
static void workers_finish(run_t *r)
{
    for (int i = 0; i < r->o.workers; i++) {
        r->wrestart_at[i] = 0;
        if (r->wpid[i] > 0)
            kill(r->wpid[i], SIGTERM);
    }
    for (int i = 0; i < r->o.workers; i++) {
        int st = 0;
        if (r->wpid[i] <= 0)
            continue;
        if (!wait_child(r->wpid[i], WORKER_EXIT_MS, &st)) {
            fail(r, "worker %d did not finish within %d ms of SIGTERM", i,
                 WORKER_EXIT_MS);
            kill(r->wpid[i], SIGKILL);
            wait_child(r->wpid[i], 5000, &st);
        } else if (!WIFEXITED(st)) {
            fail(r, "worker %d died of signal %d while finishing", i, WTERMSIG(st));
        }
        /* exit 1: its failures are in w<I>.fail, counted at the end */
        r->wpid[i] = 0;
    }
}

/* After quiesce: the store holds nothing for anyone (bounded wait: pins
 * and reservations of killed or stalled workers end with their lease or
 * connection, quarantined extents after one more TTL), and its invariant
 * holds. Fills *st. */
static bool store_quiet(run_t *r, kvd_stats_rep_t *st, const char *when)
{
    uint64_t until = ch_now_ms() + 3 * (uint64_t)r->o.ttl_ms + 10000;
    int rc;
    bool quiet = false;
    do {
        rc = daemon_stats(r->socket, true, st);
        quiet = rc == KVD_OK && st->store.leases == 0 && st->store.pins == 0 &&
                st->store.writing_bytes == 0 && st->store.objects_writing == 0 &&
                st->store.quarantined_bytes == 0 && st->connections_current <= 1;
        if (!quiet)
            ch_sleep_ms(100);
    } while (!quiet && ch_now_ms() < until);
    if (rc != KVD_OK) {
        fail(r, "%s: Stats: %d (%s)", when, rc, kvd_status_str(rc));
        return false;
    }
    if (!quiet)
        fail(r,
             "%s: the store is not quiet: leases %" PRIu64 ", pins %" PRIu64
             ", writing %" PRIu64 " bytes (%" PRIu64 " objects), quarantined %" PRIu64
             " bytes, connections %" PRIu64,
             when, st->store.leases, st->store.pins, st->store.writing_bytes,
             st->store.objects_writing, st->store.quarantined_bytes,
             st->connections_current);
    if (!st->checked || st->check_error[0] != '\0')
        fail(r, "%s: the store's invariant: %s", when,
             st->checked ? st->check_error : "not checked");
    uint64_t sum = st->store.free_bytes + st->store.writing_bytes +
                   st->store.ready_bytes + st->store.quarantined_bytes;
    if (sum != st->store.pool_bytes)
        fail(r,
             "%s: free + writing + ready + quarantined = %" PRIu64
             " bytes, pool %" PRIu64,
             when, sum, st->store.pool_bytes);
    return quiet;
}

/* The daemon's fds and heap after quiesce, against their values at start:
 * every connection closed, so fds are back to the start's (a few spare).
 * The heap may grow by 64 MiB, and by what the daemon's Stats count as
 * staging since its start (st): the SSD tier's buffers in use then (its
 * executor's header blocks, the promotion queue, a checkpoint being
 * written) are bounded and accounted, not a leak (all of it is resident
 * where calloc writes it: glibc does under MALLOC_PERTURB_, which meson
 * test sets). */
static void check_leaks(run_t *r, const kvd_stats_rep_t *st, const char *when)
{
    uint64_t fds = proc_fds(r->daemon), anon = proc_status_kb(r->daemon, "RssAnon:");
    uint64_t staged = st->memory.staging_bytes > r->staging_base
                          ? st->memory.staging_bytes - r->staging_base
                          : 0;
    printf("  daemon: fds %" PRIu64 " (at start %" PRIu64
           "), RssAnon %.1f MiB (at start %.1f), staging %.1f MiB (at start %.1f)\n",
           fds, r->fds_base, anon / 1048576.0, r->anon_base / 1048576.0,
           st->memory.staging_bytes / 1048576.0, r->staging_base / 1048576.0);
    if (fds > r->fds_base + 4)
        fail(r, "%s: the daemon holds %" PRIu64 " fds, %" PRIu64 " at its start", when,
             fds, r->fds_base);
    if (anon > r->anon_base + (64ull << 20) + staged)
        fail(r,
             "%s: the daemon's heap grew from %.1f to %.1f MiB (staging buffers grew by "
             "%.1f MiB)",
             when, r->anon_base / 1048576.0, anon / 1048576.0, staged / 1048576.0);
}

/* The tier's figures (--ssd): one line. */
static void print_tier(const kvd_stats_rep_t *st)
{
    printf("  SSD tier: %" PRIu64 " objects (%" PRIu64 " of %" PRIu64
           " segments free), %" PRIu64 " spills (%" PRIu64 " failed, %" PRIu64
           " cancelled), %" PRIu64 " promotions (%" PRIu64 " failed), %" PRIu64
           " tier evictions, %" PRIu64 " compactions, %" PRIu64
           " checksum failures, %" PRIu64 " I/O errors; DRAM evictions %" PRIu64 "\n",
           st->store.ssd_objects, st->store.ssd_segments_free, st->store.ssd_segments,
           st->store.spills, st->store.spill_failures, st->store.spill_cancelled,
           st->store.promotions, st->store.promote_failures, st->store.ssd_evictions,
           st->store.ssd_compactions, st->store.ssd_checksum_failures,
           st->store.ssd_io_errors, st->store.evictions);
}

/* Nothing in a run injures the tier's I/O: an I/O error, a record failing
 * its checksum or a failed promotion (an acknowledged object dropped) is a
 * defect. */
static void check_tier(run_t *r, const kvd_stats_rep_t *st, const char *when)
{
    if (st->store.ssd_io_errors || st->store.ssd_checksum_failures ||
        st->store.promote_failures || st->store.spill_failures)
        fail(r,
             "%s: the SSD tier failed with no I/O fault injected: %" PRIu64
             " I/O errors, %" PRIu64 " checksum failures, %" PRIu64
             " failed promotions, %" PRIu64 " failed spills",
             when, st->store.ssd_io_errors, st->store.ssd_checksum_failures,
             st->store.promote_failures, st->store.spill_failures);
}

/* Runs the verifier over every acknowledgement since the last daemon
 * death that lost the cache (and every other object of the key set the
 * store holds); adds its figures. A loss of an acknowledged object is
 * excused as a drop only when this round dropped objects, and then there
 * are at most as many such losses as drops; an object present at the
 * verifier's lookup and gone by its load (its own loads promote, and make
 * room) only while the daemon dropped that many meanwhile. rb: after a
 * reboot, what the tier must have kept (reboot_bound_t). */
static void verify(run_t *r, const char *when, const reboot_bound_t *rb)
{
    kvd_stats_rep_t *st = malloc(sizeof(*st));
    bool before_ok = st && daemon_stats(r->socket, false, st) == KVD_OK;
    uint64_t dropped = before_ok ? round_drops(r, st) : 0;
    uint64_t drops0 = before_ok ? drops(st) : 0;
    bool evicted = dropped > 0;
    if (!before_ok)
        fail(r, "%s: Stats before the verifier failed", when);
    char workers[16], since[32], window[32], out[256], log[256], death[32], sfx[16],
        deaths[300], batch[16];
    snprintf(workers, sizeof(workers), "%d", r->o.workers);
    snprintf(since, sizeof(since), "%" PRIu64, r->since_ms);
    snprintf(death, sizeof(death), "%" PRIu64, r->death_ms);
    snprintf(deaths, sizeof(deaths), "%s/deaths", r->dir);
    snprintf(sfx, sizeof(sfx), "%u", r->o.soak ? 0u : CH_SUFFIXES);
    /* each load over a tier promotes its objects into the small pool */
    snprintf(batch, sizeof(batch), "%d", r->o.ssd ? 16 : 128);
    /* the page's writer reserved within one TTL before the ack, and lost
     * it within one TTL after; a linker timeout either side for slack */
    snprintf(window, sizeof(window), "%d", r->o.ttl_ms + 2 * r->o.timeout_ms + 1000);
    snprintf(out, sizeof(out), "%s/verify.stats", r->dir);
    snprintf(log, sizeof(log), "%s/verify.log", r->dir);
    unlink(out);
    char *argv[32];
    int a = 0;
    char *fixed[] = {
        (char *)r->o.self, "--verify", "--socket", r->socket, "--dir",      r->dir,
        "--workers",       workers,    "--since",  since,     "--excuse",   r->excuse,
        "--window-ms",     window,     "--out",    out,       "--death-ms", death,
        "--all-keys",      sfx,        "--deaths", deaths,    "--batch",    batch};
    for (size_t i = 0; i < sizeof(fixed) / sizeof(fixed[0]); i++)
        argv[a++] = fixed[i];
    if (evicted)
        argv[a++] = "--evicted";
    argv[a] = NULL;
    pid_t pid = spawn(argv, log);
    int wst = 0;
    if (pid == 0 || !wait_child(pid, 300000, &wst)) {
        fail(r, "%s: the verifier did not finish", when);
        if (pid > 0) {
            kill(pid, SIGKILL);
            wait_child(pid, 5000, &wst);
        }
        free(st);
        return;
    }
    ch_stats_t v = {0};
    if (!ch_stats_add(out, &v)) {
        fail(r, "%s: the verifier left no figures (status %d, log %s)", when, wst, log);
        free(st);
        return;
    }
    uint64_t during = 0;
    if (st && daemon_stats(r->socket, false, st) == KVD_OK)
        during = drops(st) > drops0 ? drops(st) - drops0 : 0;
    else
        fail(r, "%s: Stats after the verifier failed", when);
    printf("  verified %" PRIu64 " objects byte-exact (records %" PRIu64 ", %" PRIu64
           " before a start that lost the cache; %" PRIu64
           " acknowledged before the daemon's last kill), %" PRIu64
           " present without an ack; missing: %" PRIu64 " required, %" PRIu64
           " excused, %" PRIu64 " evicted (%" PRIu64 " drops this round)",
           v.objects_verified, v.records_read, v.records_old, v.objects_survived,
           v.unacked_verified, v.missing_required, v.missing_excused, v.missing_evicted,
           dropped);
    if (r->o.ssd)
        printf("; %" PRIu64 " gone between lookup and load (%" PRIu64 " drops meanwhile)",
               v.lost_verifying, during);
    printf("\n");
    r->objects_verified += v.objects_verified;
    r->objects_survived += v.objects_survived;
    r->unacked_verified += v.unacked_verified;
    r->missing_excused += v.missing_excused;
    r->missing_evicted += v.missing_evicted;
    r->lost_verifying += v.lost_verifying;
    if (v.failures || !WIFEXITED(wst) || WEXITSTATUS(wst) != 0)
        fail(r, "%s: the verifier found %" PRIu64 " failures (log %s)", when, v.failures,
             log);
    if (v.missing_evicted > dropped)
        fail(r,
             "%s: %" PRIu64 " acknowledged objects missing, the daemon dropped %" PRIu64
             " this round (log %s)",
             when, v.missing_evicted, dropped, log);
    if (v.lost_verifying > during)
        fail(r,
             "%s: %" PRIu64 " objects present at the verifier's lookup were gone by its "
             "load; the daemon dropped %" PRIu64 " meanwhile (log %s)",
             when, v.lost_verifying, during, log);
    if (rb != NULL && rb->known) {
        uint64_t want =
            rb->ssd_objects > rb->promoting ? rb->ssd_objects - rb->promoting : 0;
        uint64_t got = v.objects_verified + v.unacked_verified + v.lost_verifying;
        printf("  after the reboot: %" PRIu64 " objects present (all on the tier), the "
               "tier held %" PRIu64 " at the Stats before the kill (%" PRIu64
               " being promoted)\n",
               got, rb->ssd_objects, rb->promoting);
        if (got < want)
            fail(r,
                 "%s: %" PRIu64
                 " objects present after the reboot, the tier held %" PRIu64 " (%" PRIu64
                 " being promoted) before the kill",
                 when, got, rb->ssd_objects, rb->promoting);
        if (rb->ssd_objects > 0 && got == 0)
            fail(r, "%s: nothing present after the reboot", when);
    }
    if (r->o.ssd && st != NULL) {
        print_tier(st);
        check_tier(r, st, when);
    }
    free(st);
}

/* Quiesce, then every check of a round. */
static void quiesce_and_check(run_t *r, const char *when)
{
    workers_finish(r);
    daemon_reap(r);
    kvd_stats_rep_t *st = malloc(sizeof(*st));
    store_quiet(r, st, when);
    bool evicted = round_drops(r, st) > 0;
    if (!r->o.no_persist)
        printf("  journal: %" PRIu64 " bytes, %" PRIu64 " records and %" PRIu64
               " compactions since the daemon's start, %" PRIu64 " errors\n",
               st->store.journal_bytes, st->store.journal_records,
               st->store.journal_compactions, st->store.journal_errors);
    if (st->store.journal_errors > 0)
        fail(r, "%s: %" PRIu64 " journal writes failed", when, st->store.journal_errors);
    if (evicted && !r->o.soak)
        printf("  note: the daemon evicted %" PRIu64
               " objects (the pool is too small for "
               "the key set)\n",
               st->store.evictions);
    if (evicted && r->o.ssd)
        printf("  note: the daemon dropped %" PRIu64 " objects this round (%" PRIu64
               " from DRAM, %" PRIu64 " from the tier, since its start)\n",
               round_drops(r, st), st->store.evictions, st->store.ssd_evictions);
    check_leaks(r, st, when);
    verify(r, when, NULL);
    store_quiet(r, st, "after the verifier");
    free(st);
}

/* Counts the failure lines workers wrote and their sanitizer reports. */
static uint64_t count_worker_failures(run_t *r)
{
    uint64_t n = 0;
    char path[512], line[700];
    for (int i = 0; i < r->o.workers; i++) {
        snprintf(path, sizeof(path), "%s/w%d.fail", r->dir, i);
        FILE *f = fopen(path, "r");
        while (f && fgets(line, sizeof(line), f)) {
            if (n < 20)
                fprintf(stderr, "chaos: FAIL (worker) %s", line);
            n++;
        }
        if (f)
            fclose(f);
    }
    return n;
}

static bool log_has_report(const char *path)
{
    static const char *const reports[] = {"ERROR: AddressSanitizer",
                                          "runtime error:", "ERROR: LeakSanitizer"};
    FILE *f = fopen(path, "r");
    char line[1024];
    bool bad = false;
    while (f && !bad && fgets(line, sizeof(line), f))
        for (size_t i = 0; i < sizeof(reports) / sizeof(reports[0]); i++)
            bad |= strstr(line, reports[i]) != NULL;
    if (f)
        fclose(f);
    return bad;
}

/* Prints the calls a worker saw outlast timeout_ms (its "took" lines). */
static void show_slow_calls(const char *path)
{
    FILE *f = fopen(path, "r");
    char line[512];
    while (f && fgets(line, sizeof(line), f))
        if (strstr(line, " took ") != NULL)
            printf("  slow call: %s", line);
    if (f)
        fclose(f);
}

/* Stops the daemon (SIGTERM: exit 0 within 10 s) and scans every log. */
static void finish(run_t *r, ch_stats_t *ws)
{
    kvd_stats_rep_t *last = r->o.ssd && r->daemon > 0 ? malloc(sizeof(*last)) : NULL;
    if (last && daemon_stats(r->socket, false, last) == KVD_OK)
        tier_figures_add(r, last);
    free(last);
    if (r->daemon > 0) {
        kill(r->daemon, SIGTERM);
        int st = 0;
        if (!wait_child(r->daemon, 10000, &st)) {
            fail(r, "kvdockd did not exit within 10 s of SIGTERM");
            kill(r->daemon, SIGKILL);
            wait_child(r->daemon, 5000, &st);
        } else if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            fail(r, "kvdockd exited %s %d on SIGTERM",
                 WIFEXITED(st) ? "with" : "by signal",
                 WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
        }
        r->daemon = 0;
    }
    DIR *d = opendir(r->dir);
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL) {
        char path[512];
        snprintf(path, sizeof(path), "%s/%s", r->dir, e->d_name);
        size_t n = strlen(e->d_name);
        if (n > 4 && strcmp(e->d_name + n - 4, ".log") == 0 && log_has_report(path))
            fail(r, "%s has a sanitizer report", path);
        if (e->d_name[0] == 'w' && n > 4 && strcmp(e->d_name + n - 4, ".log") == 0)
            show_slow_calls(path);
        if (n > 6 && strcmp(e->d_name + n - 6, ".stats") == 0 && e->d_name[0] == 'w')
            ch_stats_add(path, ws);
    }
    if (d)
        closedir(d);
    r->failures += count_worker_failures(r);
}

static void print_workers(const ch_stats_t *w)
{
    printf("workers: %" PRIu64 " requests, %" PRIu64 " lookups (%" PRIu64
           " hit pages), %" PRIu64 " loads (%" PRIu64 " refused), %" PRIu64
           " completed (%" PRIu64 " failed), %" PRIu64 " aborts, %" PRIu64
           " partial commits, %" PRIu64 " loaded pages verified; %" PRIu64
           " offloads, %" PRIu64 " acked (%" PRIu64 " pages), %" PRIu64 " failed\n",
           w->iterations, w->lookups, w->hit_pages, w->loads, w->load_errors,
           w->loads_completed, w->load_failures, w->aborts, w->partial_commits,
           w->pages_verified, w->offloads, w->offloads_acked, w->pages_acked,
           w->offload_failures);
    printf("errors seen: timeout %" PRIu64 ", closed %" PRIu64 ", unavailable %" PRIu64
           ", not found %" PRIu64 ", other %" PRIu64 "; starved %" PRIu64
           "; calls past timeout_ms + 1 s: %" PRIu64 " (longest %" PRIu64 " ms)\n",
           w->err_timeout, w->err_closed, w->err_unavailable, w->err_not_found,
           w->err_other, w->starved, w->calls_over_bound, w->max_call_ms);
}

/* ---------------------------------------------------------------- chaos */

static int run_chaos(run_t *r)
{
    if (daemon_start(r, false) != 0)
        return 1;
    uint64_t deadline = r->o.max_seconds > 0
                            ? ch_now_ms() + (uint64_t)r->o.max_seconds * 1000
                            : UINT64_MAX;
    for (int round = 1; round <= r->o.rounds; round++) {
        if (ch_now_ms() >= deadline) {
            printf("--max-seconds %d reached after %d rounds\n", r->o.max_seconds,
                   round - 1);
            break;
        }
        printf("round %d\n", round);
        if (round > 1) {
            /* the key set is small: empty the store, so that this round
             * offloads (and kills the daemon under offloads) again; what
             * was acknowledged before is no longer required */
            uint64_t n = 0;
            int rc = daemon_evict_all(r->socket, &n);
            kvd_stats_rep_t *st = malloc(sizeof(*st));
            if (rc == KVD_OK && st && daemon_stats(r->socket, false, st) == KVD_OK) {
                r->drops_base = drops(st);
                r->drops_prior = 0;
            } else
                fail(r, "round %d: evicting the store: %d (%s)", round, rc,
                     kvd_status_str(rc));
            free(st);
            r->since_ms = ch_now_ms();
            printf("  store emptied: %" PRIu64 " objects evicted\n", n);
        }
        fflush(stdout);
        for (int i = 0; i < r->o.workers; i++)
            worker_start(r, i);
        uint64_t end = ch_now_ms() + (uint64_t)r->o.round_s * 1000;
        int injuries = 0;
        bool daemon_killed = false;
        /* every other round kills the daemon once, at a random point */
        bool kill_due = (round % 2 == 0 || r->o.kill_every_round) &&
                        r->o.max_injuries > 0 &&
                        (r->o.only == NULL || strstr(r->o.only, "kill-daemon") != NULL);
        int kill_at = kill_due ? (int)rnd(r, 0, (uint64_t)r->o.max_injuries - 1) : -1;
        pause_ms(r, rnd(r, 500, 2000));
        while (ch_now_ms() < end && injuries < r->o.max_injuries) {
            uint64_t before = r->daemon_kills;
            injure(r, !daemon_killed, injuries == kill_at && !daemon_killed);
            daemon_killed |= r->daemon_kills != before;
            injuries++;
            fflush(stdout);
            pause_ms(r, rnd(r, 300, 2500));
        }
        /* the round's kill is due: the injuries before it ran out of time
         * (long stops on a busy host), so it comes now, under the workers */
        if (kill_due && !daemon_killed)
            injure(r, true, true);
        if (ch_now_ms() < end)
            pause_ms(r, end - ch_now_ms());
        char when[32];
        snprintf(when, sizeof(when), "round %d", round);
        quiesce_and_check(r, when);
        r->rounds++;
        fflush(stdout);
    }
    ch_stats_t w = {0};
    finish(r, &w);
    print_workers(&w);
    if (r->o.strict_timeouts && w.calls_over_bound > 0)
        fail(r,
             "%" PRIu64 " calls outlasted timeout_ms + 1 s (the longest %" PRIu64 " ms)",
             w.calls_over_bound, w.max_call_ms);
    printf("chaos: %" PRIu64 " rounds, %" PRIu64 " worker kills, %" PRIu64
           " worker stops (%" PRIu64 " past the lease TTL), %" PRIu64
           " daemon stops (%" PRIu64 " past the linker timeout), %" PRIu64
           " daemon kills (%" PRIu64 " objects recovered by the restarts); %" PRIu64
           " objects verified (summed over rounds), %" PRIu64
           " of them acknowledged before a daemon kill, %" PRIu64
           " present without an ack; %" PRIu64 " excused losses; %" PRIu64 " failures\n",
           r->rounds, r->worker_kills, r->worker_stops, r->worker_stops_long,
           r->daemon_stops, r->daemon_stops_long, r->daemon_kills, r->recovered,
           r->objects_verified, r->objects_survived, r->unacked_verified,
           r->missing_excused, r->failures);
    if (r->o.ssd)
        printf(
            "chaos: SSD tier: %" PRIu64 " spills, %" PRIu64 " promotions, %" PRIu64
            " objects dropped by the tier (evictions, the driver's evict-all included, "
            "and failed promotions), %" PRIu64
            " objects recovered from the tier by the restarts (%" PRIu64
            " of them reboots: pool file and journal deleted), %" PRIu64
            " objects gone between the verifier's lookup and load, %" PRIu64
            " losses excused by drops\n",
            r->spills, r->promotions, r->ssd_drops, r->ssd_recovered, r->reboots,
            r->lost_verifying, r->missing_evicted);
    return r->failures ? 1 : 0;
}

/* ----------------------------------------------------------------- soak */

typedef struct sample {
    double t_s;
    double own;    /* VmRSS - RssShmem */
    bool evicting; /* the pool is full: the store evicted by now */
} sample_t;

/* Least-squares slope of own over t for samples[from..n). */
static double slope(const sample_t *s, size_t from, size_t n)
{
    double st = 0, so = 0, stt = 0, sto = 0, m = (double)(n - from);
    for (size_t i = from; i < n; i++) {
        st += s[i].t_s;
        so += s[i].own;
        stt += s[i].t_s * s[i].t_s;
        sto += s[i].t_s * s[i].own;
    }
    double den = m * stt - st * st;
    return den > 0 ? (m * sto - st * so) / den : 0;
}

static int run_soak(run_t *r)
{
    if (daemon_start(r, false) != 0)
        return 1;
    FILE *csv = fopen(r->o.csv, "w");
    if (csv == NULL) {
        fail(r, "cannot write %s: %s", r->o.csv, strerror(errno));
        return 1;
    }
    fprintf(csv, "t_s,vmrss_bytes,rss_anon_bytes,rss_shmem_bytes,pool_populated_bytes,"
                 "ready_bytes,objects_ready,index_bytes,evictions,fds,connections\n");
    for (int i = 0; i < r->o.workers; i++)
        worker_start(r, i);
    size_t cap = (size_t)r->o.duration_s + 16, n = 0;
    sample_t *s = calloc(cap, sizeof(*s));
    kvd_stats_rep_t *st = malloc(sizeof(*st));
    uint64_t t0 = ch_now_ms(), next = t0;
    while (ch_now_ms() < t0 + (uint64_t)r->o.duration_s * 1000 && n < cap) {
        supervise(r);
        if (ch_now_ms() < next) {
            ch_sleep_ms(10);
            continue;
        }
        next += 1000;
        uint64_t rss = proc_status_kb(r->daemon, "VmRSS:");
        uint64_t anon = proc_status_kb(r->daemon, "RssAnon:");
        uint64_t shm = proc_status_kb(r->daemon, "RssShmem:");
        memset(st, 0, sizeof(*st));
        if (daemon_stats(r->socket, false, st) != KVD_OK)
            fail(r, "soak: Stats failed at %.0f s", (ch_now_ms() - t0) / 1000.0);
        double t = (ch_now_ms() - t0) / 1000.0;
        fprintf(csv,
                "%.1f,%" PRIu64 ",%" PRIu64 ",%" PRIu64 ",%" PRIu64 ",%" PRIu64
                ",%" PRIu64 ",%" PRIu64 ",%" PRIu64 ",%" PRIu64 ",%" PRIu64 "\n",
                t, rss, anon, shm, st->memory.pool_populated_bytes, st->store.ready_bytes,
                st->store.objects_ready, st->store.index_bytes, st->store.evictions,
                proc_fds(r->daemon), st->connections_current);
        fflush(csv);
        s[n++] = (sample_t){t, (double)(rss - shm), st->store.evictions > 0};
    }
    fclose(csv);
    free(st);
    quiesce_and_check(r, "soak");
    ch_stats_t w = {0};
    finish(r, &w);
    print_workers(&w);
    /* drift after warm-up: the first 10 % of the run (at least 5 samples)
     * and until the pool is full (the store's index and the daemon's
     * buffers grow while objects are added; flat is for the steady state,
     * where eviction makes room for every new object) */
    size_t from = n / 10 > 5 ? n / 10 : 5;
    while (from < n && !s[from].evicting)
        from++;
    if (n < from + 10) {
        fail(r,
             "soak: %zu samples, %zu of them in the steady state (evicting): too few "
             "to judge drift; run longer",
             n, n > from ? n - from : 0);
    } else {
        double at = 0, end = 0;
        for (size_t i = from; i < from + 5; i++)
            at += s[i].own / 5;
        for (size_t i = n - 5; i < n; i++)
            end += s[i].own / 5;
        double drift = (end - at) / 1048576.0, k = slope(s, from, n) / 1024.0;
        printf("soak: %.0f s, %zu samples (%s); the daemon's own memory (VmRSS - "
               "RssShmem) %.2f MiB at %.0f s, %.2f MiB at the end: drift %+.2f MiB "
               "(limit %.1f), slope %+.3f KiB/s (limit %.1f)\n",
               s[n - 1].t_s, n, r->o.csv, at / 1048576.0, s[from].t_s, end / 1048576.0,
               drift, r->o.max_drift_mib, k, r->o.max_slope_kibs);
        if (drift > r->o.max_drift_mib)
            fail(r, "soak: memory drift %.2f MiB over the limit %.1f", drift,
                 r->o.max_drift_mib);
        if (k > r->o.max_slope_kibs)
            fail(r, "soak: memory slope %.3f KiB/s over the limit %.1f", k,
                 r->o.max_slope_kibs);
    }
    free(s);
    printf("soak: %" PRIu64 " objects verified, %" PRIu64 " gone by eviction; %" PRIu64
           " failures\n",
           r->objects_verified, r->missing_evicted, r->failures);
    return r->failures ? 1 : 0;
}

/* ----------------------------------------------------------------- main */

static void usage(void)
{
    fprintf(
        stderr,
        "usage: kvdock-chaos --kvdockd PATH [--rounds N] [--workers N] "
        "[--round-seconds S]\n"
        "                    [--max-injuries N] [--seed N] [--pool SIZE] [--keep]\n"
        "                    [--lease-ttl-ms MS] [--timeout-ms MS]\n"
        "                    [--only kill-worker,stop-worker,stop-daemon,kill-daemon]\n"
        "                    [--strict-timeouts] [--no-persist] "
        "[--kill-daemon-every-round]\n"
        "                    [--max-seconds S] [--ssd [--ssd-size SIZE] [--reboot]]\n"
        "       kvdock-chaos --kvdockd PATH --soak --duration S [--csv FILE]\n"
        "                    [--max-drift-mib F] [--max-slope-kibs F]\n");
}

static void rm_dir(const char *dir)
{
    rm_files(dir);
    rmdir(dir);
}

int main(int argc, char **argv)
{
    enum {
        O_WORKER = 256,
        O_VERIFY,
        O_SOCKET,
        O_DIR,
        O_INDEX,
        O_GEN,
        O_SUFFIXES,
        O_TMO,
        O_STRICT,
        O_WORKERS,
        O_SINCE,
        O_EXCUSE,
        O_WINDOW,
        O_EVICTED,
        O_OUT,
        O_KVDOCKD,
        O_ROUNDS,
        O_ROUND_S,
        O_MAXINJ,
        O_SEED,
        O_POOL,
        O_KEEP,
        O_SOAK,
        O_DURATION,
        O_CSV,
        O_DRIFT,
        O_SLOPE,
        O_TTL,
        O_ONLY,
        O_STRICT_TMO,
        O_DEATH,
        O_ALL_KEYS,
        O_NO_PERSIST,
        O_KILL_EVERY,
        O_MAX_SECONDS,
        O_DEATHS,
        O_SSD,
        O_SSD_SIZE,
        O_REBOOT,
        O_BATCH
    };
    static const struct option lo[] = {
        {"worker", no_argument, 0, O_WORKER},
        {"verify", no_argument, 0, O_VERIFY},
        {"socket", required_argument, 0, O_SOCKET},
        {"dir", required_argument, 0, O_DIR},
        {"index", required_argument, 0, O_INDEX},
        {"gen", required_argument, 0, O_GEN},
        {"suffixes", required_argument, 0, O_SUFFIXES},
        {"timeout-ms", required_argument, 0, O_TMO},
        {"strict", no_argument, 0, O_STRICT},
        {"workers", required_argument, 0, O_WORKERS},
        {"since", required_argument, 0, O_SINCE},
        {"excuse", required_argument, 0, O_EXCUSE},
        {"window-ms", required_argument, 0, O_WINDOW},
        {"evicted", no_argument, 0, O_EVICTED},
        {"out", required_argument, 0, O_OUT},
        {"kvdockd", required_argument, 0, O_KVDOCKD},
        {"rounds", required_argument, 0, O_ROUNDS},
        {"round-seconds", required_argument, 0, O_ROUND_S},
        {"max-injuries", required_argument, 0, O_MAXINJ},
        {"seed", required_argument, 0, O_SEED},
        {"pool", required_argument, 0, O_POOL},
        {"keep", no_argument, 0, O_KEEP},
        {"soak", no_argument, 0, O_SOAK},
        {"duration", required_argument, 0, O_DURATION},
        {"csv", required_argument, 0, O_CSV},
        {"max-drift-mib", required_argument, 0, O_DRIFT},
        {"max-slope-kibs", required_argument, 0, O_SLOPE},
        {"lease-ttl-ms", required_argument, 0, O_TTL},
        {"only", required_argument, 0, O_ONLY},
        {"strict-timeouts", no_argument, 0, O_STRICT_TMO},
        {"death-ms", required_argument, 0, O_DEATH},
        {"deaths", required_argument, 0, O_DEATHS},
        {"all-keys", required_argument, 0, O_ALL_KEYS},
        {"no-persist", no_argument, 0, O_NO_PERSIST},
        {"kill-daemon-every-round", no_argument, 0, O_KILL_EVERY},
        {"max-seconds", required_argument, 0, O_MAX_SECONDS},
        {"pool-size", required_argument, 0, O_POOL},
        {"ssd", no_argument, 0, O_SSD},
        {"ssd-size", required_argument, 0, O_SSD_SIZE},
        {"reboot", no_argument, 0, O_REBOOT},
        {"batch", required_argument, 0, O_BATCH},
        {0, 0, 0, 0}};
    bool worker = false, verifier = false;
    ch_worker_opts_t wo = {.suffixes = CH_SUFFIXES, .timeout_ms = LINKER_TIMEOUT};
    ch_verify_opts_t vo = {0};
    run_t *r = calloc(1, sizeof(*r));
    r->o = (opts_t){.pool = "256M",
                    .rounds = 5,
                    .workers = 4,
                    .round_s = 25,
                    .max_injuries = 8,
                    .duration_s = 600,
                    .seed = 1,
                    .csv = "soak.csv",
                    .max_drift_mib = 8,
                    .max_slope_kibs = 8,
                    .ttl_ms = LEASE_TTL_MS,
                    .timeout_ms = LINKER_TIMEOUT,
                    .ssd_size = "64M"};
    int c;
    while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (c) {
        case O_WORKER: worker = true; break;
        case O_VERIFY: verifier = true; break;
        case O_SOCKET: wo.socket = vo.socket = optarg; break;
        case O_DIR: wo.dir = vo.dir = optarg; break;
        case O_INDEX: wo.index = atoi(optarg); break;
        case O_GEN: wo.gen = atoi(optarg); break;
        case O_SUFFIXES: wo.suffixes = (uint32_t)strtoul(optarg, NULL, 10); break;
        case O_TMO: wo.timeout_ms = r->o.timeout_ms = atoi(optarg); break;
        case O_STRICT: wo.strict = true; break;
        case O_WORKERS: vo.workers = r->o.workers = atoi(optarg); break;
        case O_SINCE: vo.since_ms = strtoull(optarg, NULL, 10); break;
        case O_EXCUSE: vo.excuse = optarg; break;
        case O_WINDOW: vo.window_ms = strtoull(optarg, NULL, 10); break;
        case O_EVICTED: vo.evicted = true; break;
        case O_OUT: vo.out = optarg; break;
        case O_KVDOCKD: r->o.kvdockd = optarg; break;
        case O_ROUNDS: r->o.rounds = atoi(optarg); break;
        case O_ROUND_S: r->o.round_s = atoi(optarg); break;
        case O_MAXINJ: r->o.max_injuries = atoi(optarg); break;
        case O_SEED: wo.seed = r->o.seed = strtoull(optarg, NULL, 10); break;
        case O_POOL:
            r->o.pool = optarg;
            r->o.pool_given = true;
            break;
        case O_SSD: r->o.ssd = true; break;
        case O_SSD_SIZE: r->o.ssd_size = optarg; break;
        case O_REBOOT: r->o.reboot = true; break;
        case O_BATCH: vo.batch = (uint32_t)strtoul(optarg, NULL, 10); break;
        case O_KEEP: r->o.keep = true; break;
        case O_SOAK: r->o.soak = true; break;
        case O_DURATION: r->o.duration_s = atoi(optarg); break;
        case O_CSV: r->o.csv = optarg; break;
        case O_DRIFT: r->o.max_drift_mib = atof(optarg); break;
        case O_SLOPE: r->o.max_slope_kibs = atof(optarg); break;
        case O_TTL: r->o.ttl_ms = atoi(optarg); break;
        case O_ONLY: r->o.only = optarg; break;
        case O_STRICT_TMO: r->o.strict_timeouts = true; break;
        case O_DEATH: vo.death_ms = strtoull(optarg, NULL, 10); break;
        case O_DEATHS: vo.deaths = optarg; break;
        case O_ALL_KEYS:
            vo.all_keys_suffixes = (uint32_t)strtoul(optarg, NULL, 10);
            break;
        case O_NO_PERSIST: r->o.no_persist = true; break;
        case O_KILL_EVERY: r->o.kill_every_round = true; break;
        case O_MAX_SECONDS: r->o.max_seconds = atoi(optarg); break;
        default: usage(); return 2;
        }
    }
    if (worker || verifier) {
        free(r);
        if (worker)
            return wo.socket && wo.dir ? ch_worker_main(&wo) : 2;
        return vo.socket && vo.dir && vo.out ? ch_verify_main(&vo) : 2;
    }
    if (r->o.kvdockd == NULL || r->o.workers < 1 || r->o.workers > MAX_WORKERS ||
        r->o.rounds < 1 || r->o.duration_s < 1 || (r->o.reboot && !r->o.ssd) ||
        (r->o.ssd && r->o.no_persist) ||
        (r->o.only != NULL && strstr(r->o.only, "-worker") == NULL &&
         strstr(r->o.only, "-daemon") == NULL)) {
        usage();
        return 2;
    }
    /* our children are found by this path (a fresh exec each) */
    static char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n <= 0)
        return 1;
    self[n] = '\0';
    r->o.self = self;
    r->rng = r->o.seed;
    signal(SIGPIPE, SIG_IGN);
    snprintf(r->dir, sizeof(r->dir), "/tmp/kvdock-chaos.XXXXXX");
    if (mkdtemp(r->dir) == NULL) {
        perror("mkdtemp");
        return 1;
    }
    snprintf(r->socket, sizeof(r->socket), "%s/kvdockd.sock", r->dir);
    /* the pool file and journal in memory (tmpfs), removed at the end
     * whatever happens: they are as big as the pool */
    snprintf(r->shm, sizeof(r->shm), "/dev/shm/kvdock-chaos.XXXXXX");
    if (mkdtemp(r->shm) == NULL) {
        snprintf(r->shm, sizeof(r->shm), "%s/shm", r->dir);
        if (mkdir(r->shm, 0700) != 0) {
            perror("mkdir");
            return 1;
        }
    }
    snprintf(r->excuse, sizeof(r->excuse), "%s/injuries", r->dir);
    /* the tier on the disk of the run's directory (O_DIRECT: not tmpfs);
     * the pool a fraction of the workers' working set (CH_PREFIXES x
     * (CH_PREFIX_PAGES + CH_SUFFIXES x CH_SUFFIX_PAGES) objects of 16 KiB:
     * 27 MiB), so that objects spill and loads promote */
    snprintf(r->tier, sizeof(r->tier), "%s/tier", r->dir);
    if (r->o.ssd && !r->o.pool_given)
        r->o.pool = "8M";
    printf("%s: %d workers, pool %s, lease TTL %d ms, linker timeout %d ms, seed %" PRIu64
           ", files in %s",
           r->o.soak ? "soak" : "chaos", r->o.workers, r->o.pool, r->o.ttl_ms,
           r->o.timeout_ms, r->o.seed, r->dir);
    if (r->o.ssd)
        printf("; SSD tier %s in %s%s", r->o.ssd_size, r->tier,
               r->o.reboot ? ", each daemon kill a reboot" : "");
    printf("\n");
    fflush(stdout);
    int rc = r->o.soak ? run_soak(r) : run_chaos(r);
    if (r->daemon > 0) { /* a run that gave up early: ours to stop */
        kill(r->daemon, SIGKILL);
        int st;
        wait_child(r->daemon, 5000, &st);
        r->daemon = 0;
    }
    rm_dir(r->shm);
    if (rc == 0 && !r->o.keep) {
        rm_dir(r->tier);
        rm_dir(r->dir);
    } else
        printf("files kept in %s\n", r->dir);
    free(r);
    return rc;
}
