/*
 * Description: libkvdock.so, the shared library a serving worker links,
 * against a live kvdockd: kvd_linker_open on the daemon's socket says Hello
 * and kvd_linker_health reports READY with the 64 MiB pool; a missing
 * socket gives KVD_ERR_UNAVAILABLE; kvd_page_keys has the chain's structure
 * (n_tokens / page_size keys, the prior changes every key, a shared prefix
 * shares its keys, deterministic); and `nm -D` shows the library exports
 * exactly the functions listed in linker/kvdock.map (no kvd_client_*, no
 * kvd_key_chain). The kvd_* calls here resolve to libkvdock.so (checked
 * with dladdr), so this proves the exports work.
 *
 * Arguments (from meson): the path of libkvdock.so and of kvdock.map.
 */
#include "harness.h"
#include "kvdock.h"

#include <dlfcn.h>
#include <stdbool.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#define POOL_BYTES (64ull * 1024 * 1024)

static void check_dladdr(void)
{
    Dl_info info;
    void *fn = (void *)kvd_linker_open;
    if (DT_CHECK(dladdr(fn, &info) != 0 && info.dli_fname != NULL,
                 "dladdr(kvd_linker_open)"))
        DT_CHECK(strstr(info.dli_fname, "libkvdock.so") != NULL,
                 "kvd_linker_open should come from libkvdock.so, not %s", info.dli_fname);
}

static void check_with_daemon(const kvd_test_daemon_t *d)
{
    kvd_linker_config_t cfg = {
        .socket_path = d->socket, .client_name = "linker-test", .timeout_ms = 5000};
    kvd_linker_t *l = NULL;
    int rc = kvd_linker_open(&cfg, &l);
    if (!DT_CHECK(rc == 0 && l != NULL, "kvd_linker_open(%s): %d (%s)", d->socket, rc,
                  kvd_strerror(rc)))
        return;
    kvd_linker_health_t state = 0;
    uint64_t pool = 0;
    rc = kvd_linker_health(l, &state, &pool);
    DT_CHECK(rc == 0, "kvd_linker_health: %d (%s)", rc, kvd_strerror(rc));
    DT_CHECK(state == KVD_LINKER_HEALTH_READY, "kvd_linker_health state %d, want READY",
             state);
    DT_CHECK(pool == POOL_BYTES, "kvd_linker_health pool %llu, want %llu",
             (unsigned long long)pool, POOL_BYTES);
    /* either output may be NULL */
    DT_CHECK(kvd_linker_health(l, NULL, NULL) == 0, "kvd_linker_health(NULL, NULL)");
    kvd_linker_close(l);
    DT_CHECK(kvd_test_file_contains(d->log, "hello from 'linker-test'"),
             "the daemon should log the linker's Hello with its client name");
}

static void check_errors(void)
{
    kvd_linker_config_t cfg = {.socket_path = "/nonexistent/kvdockd.sock",
                               .timeout_ms = 1000};
    kvd_linker_t *l = (kvd_linker_t *)&cfg; /* must stay untouched on failure */
    int rc = kvd_linker_open(&cfg, &l);
    DT_CHECK(rc == KVD_ERR_UNAVAILABLE,
             "kvd_linker_open on a missing socket: %d, want %d", rc, KVD_ERR_UNAVAILABLE);
    DT_CHECK(l == (kvd_linker_t *)&cfg, "kvd_linker_open must not set *out on failure");
    DT_CHECK(strcmp(kvd_strerror(KVD_ERR_UNAVAILABLE), "unavailable") == 0,
             "kvd_strerror(KVD_ERR_UNAVAILABLE) = '%s'",
             kvd_strerror(KVD_ERR_UNAVAILABLE));
    DT_CHECK(kvd_linker_open(NULL, &l) < 0, "kvd_linker_open(NULL config) should fail");
    DT_CHECK(kvd_linker_health(NULL, NULL, NULL) < 0,
             "kvd_linker_health(NULL) should fail");
    kvd_linker_close(NULL);
    DT_CHECK(strcmp(kvd_version(), KVD_VERSION) == 0, "kvd_version() '%s', want '%s'",
             kvd_version(), KVD_VERSION);
}

static void check_page_keys(void)
{
    enum { N = 100, PAGE = 16, PAGES = N / PAGE };
    uint32_t a[N], b[N];
    for (uint32_t i = 0; i < N; i++) {
        a[i] = 1000 + i * 7;
        b[i] = i < 2 * PAGE ? a[i] : a[i] + 1; /* same first two pages */
    }
    uint8_t ka[PAGES][KVD_PAGE_KEY_BYTES], ka2[PAGES][KVD_PAGE_KEY_BYTES];
    uint8_t kb[PAGES][KVD_PAGE_KEY_BYTES], kp[PAGES][KVD_PAGE_KEY_BYTES];
    size_t na = 0, na2 = 0, nb = 0, np = 0;
    DT_CHECK(kvd_page_keys(a, N, PAGE, NULL, ka, &na) == 0 && na == PAGES,
             "kvd_page_keys: %zu keys for %d tokens of pages of %d, want %d", na, N, PAGE,
             PAGES);
    DT_CHECK(kvd_page_keys(a, N, PAGE, NULL, ka2, &na2) == 0 && na2 == PAGES &&
                 memcmp(ka, ka2, sizeof(ka)) == 0,
             "kvd_page_keys is not deterministic");
    DT_CHECK(kvd_page_keys(b, N, PAGE, NULL, kb, &nb) == 0 && nb == PAGES,
             "kvd_page_keys(b)");
    DT_CHECK(memcmp(ka[0], kb[0], KVD_PAGE_KEY_BYTES) == 0 &&
                 memcmp(ka[1], kb[1], KVD_PAGE_KEY_BYTES) == 0,
             "a shared prefix of two pages should give the same first two keys");
    for (int i = 2; i < PAGES; i++)
        DT_CHECK(memcmp(ka[i], kb[i], KVD_PAGE_KEY_BYTES) != 0,
                 "pages that differ from page 2 on should differ in key %d", i);

    uint8_t prior[KVD_PAGE_KEY_BYTES];
    memset(prior, 0x5a, sizeof(prior));
    DT_CHECK(kvd_page_keys(a, N, PAGE, prior, kp, &np) == 0 && np == PAGES,
             "kvd_page_keys with a prior");
    for (int i = 0; i < PAGES; i++)
        DT_CHECK(memcmp(ka[i], kp[i], KVD_PAGE_KEY_BYTES) != 0,
                 "a prior should change key %d (the chain carries it)", i);
    for (int i = 1; i < PAGES; i++)
        DT_CHECK(memcmp(ka[i], ka[i - 1], KVD_PAGE_KEY_BYTES) != 0,
                 "keys %d and %d are equal", i - 1, i);

    /* fewer tokens than a page: no key; a partial last page: no key for it */
    size_t n = 99;
    DT_CHECK(kvd_page_keys(a, PAGE - 1, PAGE, NULL, ka2, &n) == 0 && n == 0,
             "%d tokens with pages of %d should give 0 keys, got %zu", PAGE - 1, PAGE, n);
    DT_CHECK(kvd_page_keys(a, 2 * PAGE + 1, PAGE, NULL, ka2, &n) == 0 && n == 2 &&
                 memcmp(ka2, ka, 2 * KVD_PAGE_KEY_BYTES) == 0,
             "33 tokens should give the same 2 keys as the longer sequence");
    n = 99;
    DT_CHECK(kvd_page_keys(a, N, 0, NULL, ka2, &n) == KVD_ERR_INVALID && n == 99,
             "page_size 0 should fail with %d and leave n_keys alone", KVD_ERR_INVALID);
}

/* Parses the names under "global:" of the version script. */
static int read_map(const char *path, char names[][128], int max)
{
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return -1;
    char line[256];
    int n = 0;
    bool global = false;
    while (fgets(line, sizeof(line), f)) {
        char *s = line;
        while (*s == ' ' || *s == '\t')
            s++;
        if (strncmp(s, "global:", 7) == 0) {
            global = true;
            continue;
        }
        if (strncmp(s, "local:", 6) == 0)
            global = false;
        if (!global)
            continue;
        char name[64];
        if (sscanf(s, "%63[A-Za-z0-9_];", name) == 1 && n < max)
            snprintf(names[n++], 128, "%s", name);
    }
    fclose(f);
    return n;
}

static bool in_list(char list[][128], int n, const char *name)
{
    for (int i = 0; i < n; i++)
        if (strcmp(list[i], name) == 0)
            return true;
    return false;
}

static void check_exports(const char *lib, const char *map)
{
    char want[32][128];
    int n_want = read_map(map, want, 32);
    if (!DT_CHECK(n_want > 0, "cannot read the exports of %s", map))
        return;
    static char out[1 << 16];
    char *argv[] = {"/usr/bin/nm", "-D", "--defined-only", (char *)lib, NULL};
    int rc = kvd_test_run(argv, out, sizeof(out), 20000);
    if (!DT_CHECK(rc == 0, "nm -D %s: exit %d", lib, rc))
        return;

    char got[256][128];
    int n_got = 0;
    for (char *save = NULL, *line = strtok_r(out, "\n", &save); line;
         line = strtok_r(NULL, "\n", &save)) {
        char type, name[128];
        if (sscanf(line, "%*s %c %127s", &type, name) != 2)
            continue;
        if (type == 'A') /* the version node KVDOCK_0.1 */
            continue;
        char *at = strchr(name, '@');
        if (at)
            *at = '\0';
        if (n_got < 256)
            snprintf(got[n_got++], 128, "%s", name);
    }
    for (int i = 0; i < n_want; i++)
        DT_CHECK(in_list(got, n_got, want[i]), "%s does not export %s (listed in %s)",
                 lib, want[i], map);
    for (int i = 0; i < n_got; i++)
        DT_CHECK(in_list(want, n_want, got[i]), "%s exports %s, which %s does not list",
                 lib, got[i], map);
    DT_CHECK(n_got == n_want, "%s exports %d symbols, the map lists %d", lib, n_got,
             n_want);
    for (int i = 0; i < n_got; i++)
        DT_CHECK(strncmp(got[i], "kvd_client_", 11) != 0 &&
                     strcmp(got[i], "kvd_key_chain") != 0,
                 "internal %s leaks out of %s", got[i], lib);
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: %s LIBKVDOCK_SO KVDOCK_MAP (run through meson test)\n",
                argv[0]);
        return 1;
    }
    check_dladdr();
    check_errors();
    check_page_keys();
    check_exports(argv[1], argv[2]);

    kvd_test_daemon_t d;
    const char *args[] = {"--pool-size", "64M", "--usage-interval", "0", NULL};
    if (DT_CHECK(kvd_test_daemon_start(&d, args, true, 30000) == 0,
                 "kvdockd did not start"))
        check_with_daemon(&d);
    if (d.pid > 0) {
        int st = 0;
        kill(d.pid, SIGTERM);
        if (DT_CHECK(kvd_test_wait_pid(d.pid, 10000, &st) == 0,
                     "kvdockd did not exit on SIGTERM")) {
            d.pid = 0;
            DT_CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0,
                     "kvdockd should exit 0 on SIGTERM");
            DT_CHECK(!kvd_test_file_contains(d.log, "ERROR: AddressSanitizer") &&
                         !kvd_test_file_contains(d.log, "runtime error:") &&
                         !kvd_test_file_contains(d.log, "ERROR: LeakSanitizer"),
                     "kvdockd's log has a sanitizer report");
        }
    }
    /* removes the directory; SIGKILLs by pid a daemon that did not exit */
    kvd_test_daemon_stop(&d, SIGKILL, 5000, NULL);
    return dt_exit_status("linker/open");
}
