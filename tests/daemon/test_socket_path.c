/*
 * Description: --socket never removes what the daemon did not make. Issue
 * 11: --socket naming a regular file replaced it with the socket and
 * deleted it at exit. Now: (a) a regular file, (b) a directory and (c) a
 * symbolic link to a regular file at the path: the daemon refuses to start
 * (a non-zero exit, the log saying what is there) and the file, its bytes,
 * the directory and the link's target survive. (d) A stale socket file of
 * ours (nobody listening: a crashed daemon's) is still replaced and the
 * daemon serves. (e) A daemon whose socket path was replaced while it ran
 * (the socket moved away, a regular file put there) leaves that file at
 * exit.
 */
#include "dtest.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

static const char content[] = "precious bytes\n";

static void write_file(const char *path)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (!DT_CHECK(fd >= 0, "create %s: %s", path, strerror(errno)))
        return;
    DT_CHECK(write(fd, content, strlen(content)) == (ssize_t)strlen(content), "write");
    close(fd);
}

static void check_file(const char *path, const char *what)
{
    char *got = dt_read_file(path);
    DT_CHECK(got != NULL && strcmp(got, content) == 0,
             "(%s) %s should survive with its bytes: %s", what, path,
             got ? got : strerror(errno));
    free(got);
}

/* Starts a daemon at --socket path and expects it to refuse: exits non-zero
 * and its log says what is at the path. */
static void expect_refusal(const char *path, const char *what, const char *log_says)
{
    const char *extra[] = {"--socket",         path, "--pool-size", DT_POOL,
                           "--usage-interval", "0",  NULL};
    kvd_test_daemon_t d;
    if (!DT_CHECK(kvd_test_daemon_start(&d, extra, false, 0) == 0, "(%s) spawn", what))
        return;
    int st = 0;
    if (DT_CHECK(kvd_test_wait_pid(d.pid, 20000, &st) == 0,
                 "(%s) the daemon should refuse to start, and it runs", what)) {
        d.pid = 0;
        DT_CHECK(WIFEXITED(st) && WEXITSTATUS(st) != 0,
                 "(%s) exit status %d, want non-zero", what,
                 WIFEXITED(st) ? WEXITSTATUS(st) : -1);
        DT_CHECK(kvd_test_file_contains(d.log, log_says),
                 "(%s) the log should say \"%s\"", what, log_says);
        DT_CHECK(kvd_test_file_contains(d.log, "refusing to replace it"),
                 "(%s) the log should say it refuses", what);
    }
    dt_stop(&d, SIGTERM, 10000);
}

int main(void)
{
    char dir[] = "/tmp/kvdock-sockpath-XXXXXX";
    if (!DT_CHECK(mkdtemp(dir) != NULL, "mkdtemp: %s", strerror(errno)))
        return dt_exit_status("daemon/socket_path");
    char file[96], sub[96], link[96], stale[96], moved[96];
    snprintf(file, sizeof(file), "%s/file", dir);
    snprintf(sub, sizeof(sub), "%s/dir", dir);
    snprintf(link, sizeof(link), "%s/link", dir);
    snprintf(stale, sizeof(stale), "%s/stale.sock", dir);

    /* (a) a regular file */
    write_file(file);
    expect_refusal(file, "a: regular file", "is a regular file");
    check_file(file, "a");

    /* (b) a directory */
    DT_CHECK(mkdir(sub, 0700) == 0, "mkdir: %s", strerror(errno));
    expect_refusal(sub, "b: directory", "is a directory");
    struct stat st;
    DT_CHECK(stat(sub, &st) == 0 && S_ISDIR(st.st_mode), "(b) the directory is gone");

    /* (c) a symbolic link to the regular file */
    DT_CHECK(symlink(file, link) == 0, "symlink: %s", strerror(errno));
    expect_refusal(link, "c: symbolic link", "is a symbolic link");
    check_file(file, "c");
    DT_CHECK(lstat(link, &st) == 0 && S_ISLNK(st.st_mode), "(c) the link is gone");

    /* (d) a stale socket of ours: bound, never listened on, closed */
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", stale);
    DT_CHECK(fd >= 0 && bind(fd, (struct sockaddr *)&addr, sizeof(addr)) == 0,
             "bind the stale socket: %s", strerror(errno));
    if (fd >= 0)
        close(fd);
    const char *extra_d[] = {"--socket",         stale, "--pool-size", DT_POOL,
                             "--usage-interval", "0",   NULL};
    kvd_test_daemon_t d;
    if (DT_CHECK(kvd_test_daemon_start(&d, extra_d, false, 0) == 0, "(d) spawn")) {
        int state = -1;
        for (int i = 0; i < 300 && state != KVD_HEALTH_READY && kill(d.pid, 0) == 0;
             i++) {
            state = dt_health_fresh(stale, NULL);
            if (state != KVD_HEALTH_READY)
                kvd_sleep_ns(100000000);
        }
        if (!DT_CHECK(state == KVD_HEALTH_READY,
                      "(d) the daemon should serve at the stale socket's path"))
            kvd_dump_file(d.log);
    }
    dt_stop(&d, SIGTERM, 10000);
    DT_CHECK(lstat(stale, &st) != 0 && errno == ENOENT,
             "(d) the daemon should remove its own socket at exit");

    /* (e) the path replaced while the daemon runs */
    if (dt_start(&d, NULL) == 0) {
        /* beside it: the daemon's directory may be on another file system
         * (/dev/shm) than ours, and a rename does not cross them */
        snprintf(moved, sizeof(moved), "%s/moved.sock", d.dir);
        DT_CHECK(rename(d.socket, moved) == 0, "rename: %s", strerror(errno));
        write_file(d.socket);
        kill(d.pid, SIGTERM);
        int ws = 0;
        if (DT_CHECK(kvd_test_wait_pid(d.pid, 10000, &ws) == 0, "(e) no exit"))
            d.pid = 0;
        check_file(d.socket, "e");
        DT_CHECK(kvd_test_file_contains(d.log, "no longer the socket this daemon made"),
                 "(e) the log should say why the path was left");
        unlink(d.socket);
        unlink(moved);
    }
    dt_stop(&d, SIGTERM, 10000);

    unlink(link);
    unlink(file);
    rmdir(sub);
    unlink(stale);
    rmdir(dir);
    return dt_exit_status("daemon/socket_path");
}
