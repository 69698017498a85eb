/*
 * fuzz_parse.c - the CLI's parsers: sizes, integers, keys, host:port and
 * log levels (common/ and proto/), and the kvdock command line itself.
 *
 * Input: one byte, then
 *   even: a string (up to its first NUL) given to each parser; each is
 *         checked against a reference written here from its header's
 *         words (what it accepts and what it makes of it);
 *   odd:  a chunk (16-bit length, bytes): the content of a --tokens-file,
 *         then the words of a kvdock command line, NUL-separated, run
 *         through the CLI's main(). No daemon is reachable: --socket and
 *         --connect words are dropped, the default socket lies in an empty
 *         directory, and every word naming a path (a '/') names the tokens
 *         file instead. The CLI's output goes to /dev/null (sanitizer
 *         reports still reach stderr).
 */
#include "fuzz_util.h"
#include "kvd_common.h"
#include "kvd_proto.h"

#include <ctype.h>
#include <fcntl.h>
#include <getopt.h>
#include <sanitizer/common_interface_defs.h>
#include <strings.h>
#include <sys/mman.h>
#include <unistd.h>

#define MAX_WORDS 32

/* The CLI's main(), compiled for this target as kvd_cli_main (meson). */
int kvd_cli_main(int argc, char **argv);

static int devnull = -1, saved_out = -1, saved_err = -1, tokens_fd = -1;
static char tokens_path[64];

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    /* the default socket ($XDG_RUNTIME_DIR/kvdockd-NAME.sock) where no
     * daemon listens: an empty directory of our own */
    static char dir[] = "/tmp/kvd-fuzz-cli-XXXXXX";
    FUZZ_CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    setenv("XDG_RUNTIME_DIR", dir, 1);
    devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
    saved_out = dup(1);
    saved_err = dup(2);
    tokens_fd = memfd_create("kvd-fuzz-tokens", MFD_CLOEXEC);
    FUZZ_CHECK(devnull >= 0 && saved_out >= 0 && saved_err >= 0 && tokens_fd >= 0,
               "descriptors");
    snprintf(tokens_path, sizeof(tokens_path), "/proc/self/fd/%d", tokens_fd);
    /* reports of the sanitizers go to the real stderr, also while the CLI
     * writes to /dev/null */
    __sanitizer_set_report_fd((void *)(intptr_t)saved_err);
    return 0;
}

/* ------------------------------------------------------------ parsers */

static uint64_t suffix_mult(const char *s, size_t n)
{
    static const struct {
        const char *name;
        uint64_t mult;
    } t[] = {{"", 1},
             {"b", 1},
             {"k", 1ull << 10},
             {"kb", 1ull << 10},
             {"kib", 1ull << 10},
             {"m", 1ull << 20},
             {"mb", 1ull << 20},
             {"mib", 1ull << 20},
             {"g", 1ull << 30},
             {"gb", 1ull << 30},
             {"gib", 1ull << 30},
             {"t", 1ull << 40},
             {"tb", 1ull << 40},
             {"tib", 1ull << 40}};
    for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++)
        if (strlen(t[i].name) == n && strncasecmp(s, t[i].name, n) == 0)
            return t[i].mult;
    return 0;
}

/* kvd_size_parse against its header: a decimal number (fraction allowed)
 * with an optional binary suffix, no sign, no overflow; spaces around. */
static void check_size(const char *text)
{
    uint64_t v = 0;
    int rc = kvd_size_parse(text, &v);
    FUZZ_CHECK(rc == KVD_OK || rc == KVD_ERR_INVALID, "size: %d", rc);
    const char *p = text;
    while (isspace((unsigned char)*p))
        p++;
    unsigned __int128 whole = 0;
    bool big = false;
    size_t int_digits = 0, frac_digits = 0;
    bool frac_nonzero = false;
    for (; isdigit((unsigned char)*p); p++, int_digits++) {
        whole = whole * 10 + (unsigned)(*p - '0');
        if (whole > UINT64_MAX)
            big = true, whole = (unsigned __int128)UINT64_MAX + 1;
    }
    bool dot = *p == '.';
    if (dot)
        for (p++; isdigit((unsigned char)*p); p++, frac_digits++)
            frac_nonzero |= *p != '0';
    size_t n = strlen(p);
    while (n > 0 && isspace((unsigned char)p[n - 1]))
        n--;
    uint64_t mult = suffix_mult(p, n);
    bool syntax = (int_digits > 0 || frac_digits > 0) && mult != 0;
    if (!syntax || big || whole * mult > UINT64_MAX) {
        FUZZ_CHECK(rc == KVD_ERR_INVALID, "size '%s' accepted as %llu", text,
                   (unsigned long long)v);
        return;
    }
    unsigned __int128 lo = whole * mult, hi = lo + (frac_nonzero ? mult : 0);
    if (hi <= UINT64_MAX) /* near the top a fraction may go either way */
        FUZZ_CHECK(rc == KVD_OK, "size '%s' refused", text);
    if (rc == KVD_OK)
        FUZZ_CHECK(v >= lo && v <= hi, "size '%s' is %llu", text, (unsigned long long)v);
}

/* kvd_u64_parse: an unsigned decimal integer in [min, max], nothing else. */
static void check_u64(const char *text)
{
    uint64_t v = 0;
    int rc = kvd_u64_parse(text, 0, UINT64_MAX, &v);
    bool digits = text[0] != '\0';
    unsigned __int128 ref = 0;
    for (const char *p = text; *p && digits; p++) {
        digits = isdigit((unsigned char)*p);
        ref = ref * 10 + (unsigned)(*p - '0');
        if (ref > UINT64_MAX)
            digits = false;
    }
    FUZZ_CHECK((rc == KVD_OK) == digits, "u64 '%s': %d", text, rc);
    if (rc == KVD_OK)
        FUZZ_CHECK(v == (uint64_t)ref, "u64 '%s' is %llu", text, (unsigned long long)v);
    uint64_t b;
    if (kvd_u64_parse(text, 10, 1000, &b) == KVD_OK)
        FUZZ_CHECK(rc == KVD_OK && b == v && b >= 10 && b <= 1000, "u64 range");
}

/* kvd_key_from_hex: 64 hex digits exactly; kvd_key_to_hex gives them back
 * in lower case. */
static void check_key(const char *text)
{
    uint8_t key[KVD_KEY_BYTES];
    int rc = kvd_key_from_hex(text, key);
    bool ok = strlen(text) == 2 * KVD_KEY_BYTES;
    for (size_t i = 0; ok && text[i]; i++)
        ok = isxdigit((unsigned char)text[i]);
    FUZZ_CHECK((rc == KVD_OK) == ok, "key '%s': %d", text, rc);
    if (rc != KVD_OK)
        return;
    char hex[65];
    kvd_key_to_hex(key, hex);
    for (size_t i = 0; i < 2 * KVD_KEY_BYTES; i++)
        FUZZ_CHECK(hex[i] == tolower((unsigned char)text[i]), "key '%s' back as %s", text,
                   hex);
    FUZZ_CHECK(hex[64] == '\0', "hex NUL");
}

static void check_host_port(const char *text)
{
    char host[64];
    uint16_t port = 0;
    memset(host, 'x', sizeof(host));
    if (kvd_parse_host_port(text, host, sizeof(host), &port) != KVD_OK)
        return;
    size_t n = strnlen(host, sizeof(host));
    FUZZ_CHECK(n > 0 && n < sizeof(host), "host of '%s'", text);
    FUZZ_CHECK(port >= 1, "port of '%s'", text);
    FUZZ_CHECK(strstr(text, host) != NULL, "host '%s' is not in '%s'", host, text);
}

static void check_parsers(const char *text)
{
    check_size(text);
    check_u64(text);
    check_key(text);
    check_host_port(text);
    double d;
    if (kvd_double_parse(text, -1e6, 1e6, &d) == KVD_OK)
        FUZZ_CHECK(d >= -1e6 && d <= 1e6, "double '%s' is %g", text, d);
    kvd_log_level_t lvl;
    if (kvd_log_level_parse(text, &lvl) == KVD_OK)
        FUZZ_CHECK(lvl >= KVD_LOG_ERROR && lvl <= KVD_LOG_DEBUG, "level");
    uint64_t bytes = 0;
    if (kvd_size_parse(text, &bytes) == KVD_OK) {
        char buf[32];
        kvd_size_format(bytes, buf, sizeof(buf));
        FUZZ_CHECK(memchr(buf, '\0', sizeof(buf)) != NULL, "format");
    }
}

/* ------------------------------------------------------- command line */

/* --socket and --connect (or a prefix of them, getopt takes those too) */
static bool reaches_daemon(const char *w)
{
    if (strncmp(w, "--", 2) != 0 || w[2] == '\0')
        return false;
    size_t n = strcspn(w + 2, "=");
    return strncmp(w + 2, "socket", n) == 0 || strncmp(w + 2, "connect", n) == 0;
}

static void run_cli(fuzz_in_t *in)
{
    size_t flen;
    const uint8_t *file = fuzz_chunk(in, &flen);
    FUZZ_CHECK(ftruncate(tokens_fd, 0) == 0, "truncate");
    if (flen > 0)
        FUZZ_CHECK(pwrite(tokens_fd, file, flen, 0) == (ssize_t)flen, "write");
    /* the words, each NUL-terminated in a copy */
    char *text = malloc(in->n + 1);
    FUZZ_CHECK(text != NULL, "malloc");
    memcpy(text, in->p, in->n);
    text[in->n] = '\0';
    char name[] = "kvdock";
    char *argv[MAX_WORDS + 2] = {name};
    int argc = 1;
    for (size_t off = 0; off < in->n && argc <= MAX_WORDS;) {
        char *w = text + off;
        off += strlen(w) + 1;
        if (reaches_daemon(w))
            continue;
        argv[argc++] = strchr(w, '/') != NULL ? tokens_path : w;
    }
    argv[argc] = NULL;
    fflush(stdout);
    fflush(stderr);
    dup2(devnull, 1);
    dup2(devnull, 2);
    optind = 0; /* a fresh getopt scan, as at a process start */
    int rc = kvd_cli_main(argc, argv);
    fflush(stdout);
    fflush(stderr);
    dup2(saved_out, 1);
    dup2(saved_err, 2);
    FUZZ_CHECK(rc >= 0 && rc <= 3, "exit status %d", rc);
    free(text);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_in_t in = {data, size};
    if (!fuzz_left(&in))
        return 0;
    if (fuzz_u8(&in) & 1) {
        run_cli(&in);
        return 0;
    }
    char *text = malloc(in.n + 1);
    FUZZ_CHECK(text != NULL, "malloc");
    memcpy(text, in.p, in.n);
    text[in.n] = '\0';
    check_parsers(text);
    free(text);
    return 0;
}
