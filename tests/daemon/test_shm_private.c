/*
 * Description: kvdockd keeps its pool file, journal and lock in a
 * directory private to its uid (issue 14), so that other local users
 * cannot squat their names in a shared /dev/shm:
 *  - --shm-dir a shared sticky directory (mode 1777, as /dev/shm) where a
 *    FIFO sits at the lock's old name (and, as root, files of another uid
 *    at the pool's and the journal rewrite's): the daemon starts, its
 *    files are in DIR/kvdock-<euid> (a 0700 directory of its uid), and a
 *    restart after SIGKILL has the chain it stored;
 *  - DIR/kvdock-<euid> a symlink to a directory of ours, or (as root) a
 *    directory of another uid: refused, exit 2, naming it; nothing is
 *    created through the symlink;
 *  - a world-writable directory without the sticky bit: refused, exit 2;
 *  - an upgrade: a daemon that kept its files straight in DIR (then
 *    private) stores a chain and stops; DIR becomes shared; the next
 *    daemon moves the pool file and journal into DIR/kvdock-<euid>, says
 *    so, and has the chain; while a daemon still runs on the old files, a
 *    new one is refused (exit 1) and moves nothing.
 */
#include "test_store_util.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define N_KEYS    16
#define PAGE_SIZE 64
#define SALT      0x73686d70u
#define NOBODY    65534

static char instance[64];
static kvd_key_t keys[N_KEYS];
static kvd_ns_spec_t spec;

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

static void rm_tree(const char *dir)
{
    nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* A fresh directory under /dev/shm (or /tmp) of the given mode. */
static int make_dir(char *dir, size_t len, const char *tag, mode_t mode)
{
    snprintf(dir, len, "/dev/shm/kvdock-%s-XXXXXX", tag);
    if (mkdtemp(dir) == NULL) {
        snprintf(dir, len, "/tmp/kvdock-%s-XXXXXX", tag);
        if (mkdtemp(dir) == NULL)
            return -1;
    }
    return chmod(dir, mode);
}

/* path = dir/name for this test's instance: "kvdock-<instance><suffix>" */
static void inst_path(char *out, size_t len, const char *dir, const char *suffix)
{
    snprintf(out, len, "%s/kvdock-%s%s", dir, instance, suffix);
}

static void private_of(char *out, size_t len, const char *dir)
{
    snprintf(out, len, "%s/kvdock-%u", dir, (unsigned)geteuid());
}

static int start(kvd_test_daemon_t *d, const char *dir)
{
    const char *args[] = {"--shm-dir", dir, NULL};
    return dt_start(d, args);
}

/* Starts a daemon on dir that must exit by itself: its exit status (-1:
 * still running after 30 s); the log stays in d->log until dt_stop. */
static int start_refused(kvd_test_daemon_t *d, const char *dir)
{
    const char *args[] = {"--pool-size", DT_POOL, "--usage-interval", "0", "--shm-dir",
                          dir,           NULL};
    return kvd_test_daemon_exit_status(d, args, 30000);
}

static uint64_t objects_ready(const kvd_test_daemon_t *d)
{
    ts_stats_t s;
    return ts_stats_fresh(d->socket, false, &s) == KVD_OK ? s.store.objects_ready : 0;
}

static void kill9(kvd_test_daemon_t *d)
{
    kill(d->pid, SIGKILL);
    kvd_test_wait_pid(d->pid, 10000, NULL);
    d->pid = 0;
    dt_stop(d, SIGTERM, 1000); /* removes its socket directory */
}

/* A regular file of our uid at path. */
static bool ours(const char *path)
{
    struct stat st;
    return lstat(path, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid();
}

static void squatted_names(void)
{
    char dir[64], p[256], priv[128];
    if (!DT_CHECK(make_dir(dir, sizeof(dir), "shq", 01777) == 0, "mkdtemp: %s",
                  strerror(errno)))
        return;
    inst_path(p, sizeof(p), dir, ".lock");
    DT_CHECK(mkfifo(p, 0666) == 0, "mkfifo %s: %s", p, strerror(errno));
    bool root = geteuid() == 0;
    if (root) {
        const char *names[] = {".pool", ".journal.tmp", ".journal"};
        for (size_t i = 0; i < 3; i++) {
            inst_path(p, sizeof(p), dir, names[i]);
            int fd = open(p, O_WRONLY | O_CREAT | O_EXCL, 0644);
            DT_CHECK(fd >= 0 && fchown(fd, NOBODY, NOBODY) == 0, "squat %s: %s", p,
                     strerror(errno));
            if (fd >= 0)
                close(fd);
        }
    } else {
        printf("not root: only the FIFO squats (no files of another uid)\n");
    }
    kvd_test_daemon_t d = {0};
    if (start(&d, dir) == 0) {
        private_of(priv, sizeof(priv), dir);
        struct stat st;
        DT_CHECK(lstat(priv, &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == geteuid() &&
                     (st.st_mode & 07777) == 0700,
                 "%s should be a 0700 directory of uid %u (mode %04o, owner %u)", priv,
                 (unsigned)geteuid(), (unsigned)(st.st_mode & 07777),
                 (unsigned)st.st_uid);
        const char *names[] = {".pool", ".journal", ".lock"};
        for (size_t i = 0; i < 3; i++) {
            inst_path(p, sizeof(p), priv, names[i]);
            DT_CHECK(ours(p), "%s should be a file of the daemon's", p);
        }
        ts_put_chain(d.socket, &spec, keys, N_KEYS, SALT, "squatted: put");
        kill9(&d);
        if (start(&d, dir) == 0) {
            uint64_t n = objects_ready(&d);
            DT_CHECK(n == N_KEYS, "after SIGKILL and restart: %llu objects, want %d",
                     (unsigned long long)n, N_KEYS);
            dt_stop(&d, SIGTERM, 10000);
        }
    }
    rm_tree(dir);
}

static void bad_private_dir(void)
{
    char dir[64], priv[128], elsewhere[64], p[256];
    if (!DT_CHECK(make_dir(dir, sizeof(dir), "shs", 01777) == 0 &&
                      make_dir(elsewhere, sizeof(elsewhere), "she", 0700) == 0,
                  "mkdtemp: %s", strerror(errno)))
        return;
    private_of(priv, sizeof(priv), dir);
    DT_CHECK(symlink(elsewhere, priv) == 0, "symlink: %s", strerror(errno));
    kvd_test_daemon_t d = {0};
    int st = start_refused(&d, dir);
    DT_CHECK(st == 2, "kvdock-<uid> a symlink: exit %d, want 2", st);
    DT_CHECK(kvd_test_file_contains(d.log, priv) &&
                 kvd_test_file_contains(d.log, "not a directory of uid"),
             "the refusal should name %s", priv);
    inst_path(p, sizeof(p), elsewhere, ".lock");
    DT_CHECK(access(p, F_OK) != 0, "nothing should be made through the symlink (%s)", p);
    dt_stop(&d, SIGKILL, 5000);
    unlink(priv);

    if (geteuid() == 0) {
        DT_CHECK(mkdir(priv, 0700) == 0 && chown(priv, NOBODY, NOBODY) == 0,
                 "a squatted %s: %s", priv, strerror(errno));
        st = start_refused(&d, dir);
        DT_CHECK(st == 2, "kvdock-<uid> of another uid: exit %d, want 2", st);
        DT_CHECK(kvd_test_file_contains(d.log, "not a directory private to uid") &&
                     kvd_test_file_contains(d.log, "owner uid 65534"),
                 "the refusal should name the owner");
        dt_stop(&d, SIGKILL, 5000);
    } else {
        printf("not root: no directory of another uid to squat with\n");
    }
    rm_tree(dir);
    rm_tree(elsewhere);

    if (!DT_CHECK(make_dir(dir, sizeof(dir), "shw", 0777) == 0, "mkdtemp"))
        return;
    st = start_refused(&d, dir);
    DT_CHECK(st == 2,
             "a world-writable directory without the sticky bit: exit %d, want 2", st);
    DT_CHECK(kvd_test_file_contains(d.log, "no sticky bit"),
             "the refusal should say the sticky bit is missing");
    dt_stop(&d, SIGKILL, 5000);
    rm_tree(dir);
}

static void upgrade(void)
{
    char dir[64], priv[128], p[256];
    if (!DT_CHECK(make_dir(dir, sizeof(dir), "shu", 0700) == 0, "mkdtemp"))
        return;
    private_of(priv, sizeof(priv), dir);
    kvd_test_daemon_t d = {0}, old = {0};
    /* a private directory holds the files itself, as every directory did
     * before */
    if (start(&d, dir) != 0)
        goto out;
    inst_path(p, sizeof(p), dir, ".pool");
    DT_CHECK(ours(p) && access(priv, F_OK) != 0,
             "in a private directory the pool file should be %s itself", p);
    ts_put_chain(d.socket, &spec, keys, N_KEYS, SALT, "upgrade: put");
    dt_stop(&d, SIGTERM, 10000);

    /* shared now, with an older daemon still on the files: refused */
    DT_CHECK(chmod(dir, 0700) == 0, "chmod");
    if (start(&old, dir) != 0)
        goto out;
    DT_CHECK(chmod(dir, 01777) == 0, "chmod 1777: %s", strerror(errno));
    int st = start_refused(&d, dir);
    DT_CHECK(st == 1,
             "a new daemon beside an older one on the same files: exit %d, want 1", st);
    DT_CHECK(kvd_test_file_contains(d.log, "started from an older version"),
             "the refusal should name the older daemon");
    DT_CHECK(ours(p), "nothing should move while the older daemon runs (%s)", p);
    dt_stop(&d, SIGKILL, 5000);
    dt_stop(&old, SIGTERM, 10000);

    if (start(&d, dir) != 0)
        goto out;
    DT_CHECK(kvd_test_file_contains(d.log, "moved the pool file and journal"),
             "the daemon should say it moved the older files");
    uint64_t n = objects_ready(&d);
    DT_CHECK(n == N_KEYS, "after the move: %llu objects, want %d", (unsigned long long)n,
             N_KEYS);
    DT_CHECK(access(p, F_OK) != 0, "%s should be gone", p);
    inst_path(p, sizeof(p), priv, ".pool");
    DT_CHECK(ours(p), "%s should hold the pool", p);
    inst_path(p, sizeof(p), priv, ".journal");
    DT_CHECK(ours(p), "%s should hold the journal", p);
    dt_stop(&d, SIGTERM, 10000);
out:
    dt_stop(&d, SIGKILL, 5000);
    dt_stop(&old, SIGKILL, 5000);
    rm_tree(dir);
}

int main(void)
{
    snprintf(instance, sizeof(instance), "test-%d", (int)getpid());
    spec = ts_spec(TS_KV_NS, TS_KV_BYTES);
    if (ts_make_keys(500, N_KEYS, PAGE_SIZE, keys) != 0)
        return 1;
    squatted_names();
    bad_private_dir();
    upgrade();
    return dt_exit_status("daemon/shm_private");
}
