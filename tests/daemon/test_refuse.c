/*
 * Description: kvdockd refuses what it cannot do, with exit 2 and a message
 * that names the flag, and starts on what fits:
 *  - --pool-size 100T on this host: "refusing to start", a --pool-size that
 *    would fit;
 *  - on the fixture host tests/fixtures/daemon-small-host (MemTotal 8 GiB,
 *    MemAvailable 2 GiB, no cgroup limit): --mem-fraction 0.9 and
 *    --mem-fraction 1.0 --reserve 0 refuse and suggest --mem-fraction 0.25;
 *    --mem-fraction 0.1 --reserve 256M starts with the budget computed by
 *    hand and Stats reports it;
 *  - bad flags (--pool-size abc, --nope, --mem-fraction 2, both --pool-size
 *    and --mem-fraction, --listen nohostport) exit 2 naming the flag;
 *  - --config with "pool-size = 80M" works (flags override it), an unknown
 *    key exits 2;
 *  - a second daemon on a socket a live one serves refuses, and the first
 *    keeps serving with its socket in place.
 */
#include "dtest.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char fixture[512];

/*
 * Runs kvdockd with args (harness adds --socket/--instance), expects it to
 * exit by itself with want_status and its log to contain every needle
 * (NULL-terminated). Returns the log (malloc'd) for more checks, or NULL.
 */
static char *expect_exit(const char *what, const char *const *args, int want_status,
                         const char *const *needles)
{
    kvd_test_daemon_t d;
    if (!DT_CHECK(kvd_test_daemon_start(&d, args, false, 0) == 0, "(%s) fork/exec", what))
        return NULL;
    int st = 0;
    char *log = NULL;
    if (DT_CHECK(kvd_test_wait_pid(d.pid, 15000, &st) == 0,
                 "(%s) kvdockd should exit by itself, still runs after 15 s", what)) {
        d.pid = 0;
        int status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        bool ok = want_status < 0 ? status != 0 : status == want_status;
        if (want_status < 0)
            DT_CHECK(ok, "(%s) exit status %d, want non-zero", what, status);
        else
            DT_CHECK(ok, "(%s) exit status %d, want %d", what, status, want_status);
        log = dt_read_file(d.log);
        for (size_t i = 0; log && needles && needles[i]; i++)
            ok &= DT_CHECK(strstr(log, needles[i]) != NULL,
                           "(%s) the log should say \"%s\"", what, needles[i]);
        if (!ok)
            kvd_dump_file(d.log);
        dt_check_log_clean(&d);
    }
    dt_stop(&d, SIGKILL, 5000);
    return log;
}

/* True when `flag` in text is followed by a space and a digit ("--pool-size 123K"). */
static bool suggests_value(const char *text, const char *flag)
{
    for (const char *p = text; (p = strstr(p, flag)) != NULL; p += strlen(flag)) {
        const char *v = p + strlen(flag);
        if (v[0] == ' ' && v[1] >= '0' && v[1] <= '9')
            return true;
    }
    return false;
}

static void refuse_too_big(void)
{
    char *log = expect_exit(
        "--pool-size 100T",
        (const char *[]){"--pool-size", "100T", "--usage-interval", "0", NULL}, 2,
        (const char *[]){"refusing to start", "does not fit", NULL});
    if (log) {
        const char *r = strstr(log, "refusing to start");
        DT_CHECK(r && suggests_value(r, "--pool-size"),
                 "the refusal should suggest a --pool-size value that fits");
        DT_CHECK(strstr(log, "ready: pool") == NULL,
                 "a refused daemon must not say ready");
    }
    free(log);
}

static void refuse_fraction_on_fixture(void)
{
    /* budget = 0.9 x 8 GiB - 1 GiB = 6.2 GiB > 2 GiB available - 1 GiB reserve;
     * the largest fitting fraction is (1 GiB + 1 GiB) / 8 GiB = 0.25 */
    char *log = expect_exit(
        "--mem-fraction 0.9 on the 8 GiB fixture",
        (const char *[]){"--meminfo-root", fixture, "--mem-fraction", "0.9",
                         "--usage-interval", "0", NULL},
        2,
        (const char *[]){"refusing to start", "and so would --mem-fraction 0.250",
                         "--pool-size 1048576K would fit", "mem_total=8.00 GiB",
                         "mem_available=2.00 GiB", NULL});
    free(log);

    /* all of it and no reserve: 8 GiB > 2 GiB available; (2 GiB + 0) / 8 GiB */
    log = expect_exit("--mem-fraction 1.0 --reserve 0 on the fixture",
                      (const char *[]){"--meminfo-root", fixture, "--mem-fraction", "1.0",
                                       "--reserve", "0", "--usage-interval", "0", NULL},
                      2,
                      (const char *[]){"refusing to start",
                                       "and so would --mem-fraction 0.250",
                                       "--pool-size 2097152K would fit", NULL});
    free(log);
}

static void start_fraction_on_fixture(void)
{
    /* floor(0.1 x 8589934592) = 858993459; minus 256 MiB (268435456) =
     * 590558003; aligned down to the page: 590557184 with 4 KiB pages */
    uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
    uint64_t want = kvd_align_down(858993459ull - 268435456ull, page);
    if (page == 4096)
        DT_CHECK(want == 590557184ull, "hand-computed budget");
    kvd_test_daemon_t d;
    const char *args[] = {"--meminfo-root",
                          fixture,
                          "--mem-fraction",
                          "0.1",
                          "--reserve",
                          "256M",
                          "--usage-interval",
                          "0",
                          NULL};
    if (kvd_test_daemon_start(&d, args, true, 60000) == 0) {
        kvd_stats_rep_t st;
        int rc = dt_stats_fresh(d.socket, &st);
        DT_CHECK(
            rc == KVD_OK && st.memory.pool_bytes == want,
            "fraction 0.1 reserve 256M on 8 GiB: Stats %s pool_bytes %llu, want %llu",
            kvd_status_str(rc), (unsigned long long)st.memory.pool_bytes,
            (unsigned long long)want);
        char needle[64];
        snprintf(needle, sizeof(needle), "(%llu bytes)", (unsigned long long)want);
        DT_CHECK(kvd_test_file_contains(d.log, needle) &&
                     kvd_test_file_contains(d.log, "source=mem-fraction"),
                 "the sizing line should name %s and source=mem-fraction", needle);
    } else {
        DT_CHECK(false, "--mem-fraction 0.1 --reserve 256M on the fixture should start");
    }
    dt_stop(&d, SIGTERM, 10000);
}

static void bad_flags(void)
{
    free(expect_exit("--pool-size abc", (const char *[]){"--pool-size", "abc", NULL}, 2,
                     (const char *[]){"--pool-size 'abc'", NULL}));
    free(expect_exit("--nope", (const char *[]){"--nope", NULL}, 2,
                     (const char *[]){"'--nope'", NULL}));
    free(expect_exit("--mem-fraction 2", (const char *[]){"--mem-fraction", "2", NULL}, 2,
                     (const char *[]){"--mem-fraction '2'", NULL}));
    free(expect_exit(
        "--pool-size 1G --mem-fraction 0.5",
        (const char *[]){"--pool-size", "1G", "--mem-fraction", "0.5", NULL}, 2,
        (const char *[]){"--pool-size", "--mem-fraction", "not both", NULL}));
    free(expect_exit("--listen nohostport",
                     (const char *[]){"--listen", "nohostport", NULL}, 2,
                     (const char *[]){"--listen 'nohostport'", "HOST:PORT", NULL}));
    free(expect_exit("--pool-size without a value", (const char *[]){"--pool-size", NULL},
                     2, (const char *[]){"--pool-size", NULL}));
    free(expect_exit("a stray argument", (const char *[]){"stray", NULL}, 2,
                     (const char *[]){"unexpected argument 'stray'", NULL}));
}

/* Writes text into a new temporary file; returns its path in buf. */
static bool write_temp(char *buf, size_t len, const char *text)
{
    snprintf(buf, len, "/tmp/kvdock-test-conf-XXXXXX");
    int fd = mkstemp(buf);
    if (fd < 0)
        return false;
    size_t n = strlen(text);
    bool ok = write(fd, text, n) == (ssize_t)n;
    close(fd);
    return ok;
}

static void config_file(void)
{
    char path[64];
    if (!DT_CHECK(write_temp(path, sizeof(path),
                             "# kvdockd test config\n"
                             "pool-size = 80M\n"
                             "usage-interval = 0   # no usage lines\n"),
                  "cannot write a config file"))
        return;
    kvd_test_daemon_t d;
    if (DT_CHECK(kvd_test_daemon_start(&d, (const char *[]){"--config", path, NULL}, true,
                                       30000) == 0,
                 "--config with pool-size = 80M should start")) {
        kvd_stats_rep_t st;
        int rc = dt_stats_fresh(d.socket, &st);
        DT_CHECK(rc == KVD_OK && st.memory.pool_bytes == 83886080ull,
                 "--config pool-size = 80M: Stats %s pool_bytes %llu, want 83886080",
                 kvd_status_str(rc), (unsigned long long)st.memory.pool_bytes);
    }
    dt_stop(&d, SIGTERM, 10000);

    /* a flag overrides the file */
    if (DT_CHECK(kvd_test_daemon_start(
                     &d, (const char *[]){"--config", path, "--pool-size", "72M", NULL},
                     true, 30000) == 0,
                 "--config with --pool-size 72M should start")) {
        kvd_stats_rep_t st;
        int rc = dt_stats_fresh(d.socket, &st);
        DT_CHECK(rc == KVD_OK && st.memory.pool_bytes == 75497472ull,
                 "--pool-size 72M over the config's 80M: Stats %s pool_bytes %llu, want "
                 "75497472",
                 kvd_status_str(rc), (unsigned long long)st.memory.pool_bytes);
    }
    dt_stop(&d, SIGTERM, 10000);
    unlink(path);

    char bad[64];
    if (!DT_CHECK(write_temp(bad, sizeof(bad), "pool-size = 80M\nno-such-key = 1\n"),
                  "cannot write a config file"))
        return;
    char needle[128];
    snprintf(needle, sizeof(needle), "%s:2: unknown key 'no-such-key'", bad);
    free(expect_exit("config with an unknown key",
                     (const char *[]){"--config", bad, NULL}, 2,
                     (const char *[]){needle, NULL}));
    unlink(bad);

    free(expect_exit("--config of a missing file",
                     (const char *[]){"--config", "/nonexistent/kvdockd.conf", NULL}, 2,
                     (const char *[]){"--config /nonexistent/kvdockd.conf", NULL}));
}

static void second_daemon(void)
{
    kvd_test_daemon_t first;
    if (dt_start(&first, NULL) != 0) {
        dt_stop(&first, SIGKILL, 5000);
        return;
    }
    /* the later --socket wins over the harness's own */
    free(expect_exit("a second daemon on a live socket",
                     (const char *[]){"--pool-size", DT_POOL, "--usage-interval", "0",
                                      "--socket", first.socket, NULL},
                     -1, (const char *[]){"another daemon serves", NULL}));
    struct stat sb;
    DT_CHECK(stat(first.socket, &sb) == 0 && S_ISSOCK(sb.st_mode),
             "the first daemon's socket file must stay in place");
    kvd_health_rep_t h;
    DT_CHECK(dt_health_fresh(first.socket, &h) == KVD_HEALTH_READY,
             "the first daemon should keep serving");
    DT_CHECK(kill(first.pid, 0) == 0, "the first daemon should still run");
    dt_stop(&first, SIGTERM, 10000);
}

int main(void)
{
    const char *fx = getenv("KVD_FIXTURES");
    if (fx == NULL) {
        fprintf(stderr, "KVD_FIXTURES is not set (run through meson test)\n");
        return 1;
    }
    snprintf(fixture, sizeof(fixture), "%s/daemon-small-host", fx);

    refuse_too_big();
    refuse_fraction_on_fixture();
    bad_flags();
    config_file();
    second_daemon();
    start_fraction_on_fixture();
    return dt_exit_status("daemon/refuse");
}
