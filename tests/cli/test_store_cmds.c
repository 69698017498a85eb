/*
 * Description: the kvdock commands that look at the store.
 *   hash: `hash --page-size 4 1 2 3 4 5 6 7 8 9` prints exactly two lines of
 *     64 hex digits, equal to the chain computed here with an independent
 *     SHA-256 (FIPS 180-4, written in this file and checked on its test
 *     vectors): SHA256(tokens as uint32 LE), then SHA256(previous || tokens);
 *     --prior HEX starts the chain from that digest; --tokens-file gives what
 *     the arguments give; --json is a JSON array of the same keys; no
 *     --page-size, a bad token or a bad --prior exit 2.
 *   With a chain of 6 pages stored in "m/kv/tp0" and mamba state at
 *   boundaries 2 and 6 in "m/mamba/tp0":
 *   prefixes: one prefix, in m/kv/tp0, root = page 1, leaf = page 6, 6 pages,
 *     and the line "m/mamba/tp0 at boundaries 2,6"; the mamba objects are not
 *     prefixes of their own; --json parses and has pages 6, bytes 6 x 64 KiB,
 *     the full root and leaf keys and the pools entry; --tree prints the root.
 *   show KEY: namespace, full key, depth, parent (the previous page's full
 *     key), state ready; a key held by both namespaces shows both (--json);
 *     an unknown key exits 1, a malformed one 2.
 *   lookup: kv alone answers 1..6; kv + mamba with --trailing 0,1 answers
 *     2 6 (and --json {"boundaries":[2,6],"longest":6}); an unknown namespace
 *     exits 1.
 *   evict: --key K6 --namespace m/kv/tp0 evicts 1 (lookup then answers 1..5);
 *     --namespace m/mamba/tp0 evicts 2; --all evicts the remaining 5;
 *     `stats --json` then shows store.objects_ready 0; no selector, or two,
 *     exit 2.
 *   stats: --json has every field of the store's and the namespaces' field
 *     lists (kvd_proto.h) under its list name, each number equal to that
 *     field in a Stats reply taken beside it; the table has a row named
 *     after each field.
 */
#include "ref_sha256.h"
#include "test_store_util.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define PAGE_SIZE 64
#define N_PAGES   6

static char out[1 << 16];

static void to_hex(const uint8_t *d, char hex[65])
{
    for (int i = 0; i < KVD_KEY_BYTES; i++)
        snprintf(hex + 2 * i, 3, "%02x", d[i]);
}

/* The page-key chain of the reference SHA-256, as hex. */
static size_t ref_chain(const uint32_t *tokens, size_t n, size_t page,
                        const uint8_t *prior, char hex[][65])
{
    uint8_t(*keys)[KVD_KEY_BYTES] = calloc(n / page + 1, KVD_KEY_BYTES);
    size_t pages = keys ? ref_page_chain(tokens, n, page, prior, keys) : 0;
    for (size_t p = 0; p < pages; p++)
        to_hex(keys[p], hex[p]);
    free(keys);
    return pages;
}

static bool reference_ok(void)
{
    static const struct {
        const char *msg, *hex;
    } vec[] = {
        {"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
        {"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
        {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
         "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
    };
    bool ok = true;
    for (size_t i = 0; i < KVD_ARRAY_SIZE(vec); i++) {
        ref_sha256_t c;
        uint8_t d[KVD_KEY_BYTES];
        char hex[65];
        ref_sha256_init(&c);
        ref_sha256_update(&c, vec[i].msg, strlen(vec[i].msg));
        ref_sha256_final(&c, d);
        to_hex(d, hex);
        ok &= DT_CHECK(strcmp(hex, vec[i].hex) == 0,
                       "the test's own SHA-256 of '%s' is %s, FIPS says %s", vec[i].msg,
                       hex, vec[i].hex);
    }
    return ok;
}

/* ------------------------------------------------------------------ hash */

/* Runs kvdock with socket-less args; returns the exit status. */
static int cli(const char *const *args)
{
    return dt_cli(out, sizeof(out), args);
}

/* Runs kvdock --socket S args...; returns the exit status. */
static int cli_s(const char *socket, const char *const *args)
{
    return dt_cli_at(out, sizeof(out), socket, args);
}

static int count_lines(const char *s)
{
    int n = 0;
    for (; *s; s++)
        n += *s == '\n';
    return n;
}

static int count_of(const char *s, const char *needle)
{
    int n = 0;
    for (const char *p = strstr(s, needle); p; p = strstr(p + 1, needle))
        n++;
    return n;
}

static void check_hash(void)
{
    if (!reference_ok())
        return;
    const uint32_t tokens[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    char ref[2][65], expect[200];
    ref_chain(tokens, 9, 4, NULL, ref);
    snprintf(expect, sizeof(expect), "%s\n%s\n", ref[0], ref[1]);
    int rc = cli((const char *[]){"hash", "--page-size", "4", "1", "2", "3", "4", "5",
                                  "6", "7", "8", "9", NULL});
    DT_CHECK(rc == 0, "kvdock hash: exit %d", rc);
    DT_CHECK(count_lines(out) == 2 && strlen(out) == 2 * 65,
             "kvdock hash should print exactly 2 lines of 64 hex digits:\n%s", out);
    DT_CHECK(strcmp(out, expect) == 0,
             "kvdock hash printed\n%swant (reference SHA-256)\n%s", out, expect);

    /* --prior: key[-1] = the given digest */
    uint8_t prior[KVD_KEY_BYTES];
    for (int i = 0; i < KVD_KEY_BYTES; i++)
        prior[i] = (uint8_t)(0xa0 + i);
    char prior_hex[65], pref[2][65];
    to_hex(prior, prior_hex);
    ref_chain(tokens, 9, 4, prior, pref);
    snprintf(expect, sizeof(expect), "%s\n%s\n", pref[0], pref[1]);
    rc = cli((const char *[]){"hash", "--page-size", "4", "--prior", prior_hex, "1", "2",
                              "3", "4", "5", "6", "7", "8", "9", NULL});
    DT_CHECK(rc == 0 && strcmp(out, expect) == 0,
             "kvdock hash --prior: exit %d, printed\n%swant\n%s", rc, out, expect);
    DT_CHECK(strcmp(pref[0], ref[0]) != 0, "--prior should change the first key");

    /* --tokens-file: the same keys as the arguments */
    char path[] = "/tmp/kvdock-tokens-XXXXXX";
    int fd = mkstemp(path);
    if (DT_CHECK(fd >= 0, "mkstemp failed")) {
        const char *text = "1 2, 3\n4\t5,6 7\n8 9\n";
        DT_CHECK(write(fd, text, strlen(text)) == (ssize_t)strlen(text), "write failed");
        close(fd);
        snprintf(expect, sizeof(expect), "%s\n%s\n", ref[0], ref[1]);
        rc = cli(
            (const char *[]){"hash", "--page-size", "4", "--tokens-file", path, NULL});
        DT_CHECK(rc == 0 && strcmp(out, expect) == 0,
                 "kvdock hash --tokens-file: exit %d, printed\n%swant\n%s", rc, out,
                 expect);
        unlink(path);
    }
    rc = cli((const char *[]){"hash", "--page-size", "4", "--json", "1", "2", "3", "4",
                              "5", "6", "7", "8", "9", NULL});
    DT_CHECK(rc == 0 && dt_json_valid(out) && strstr(out, ref[0]) && strstr(out, ref[1]),
             "kvdock hash --json: exit %d, '%s'", rc, out);

    /* the option after the tokens ("in any order with its arguments") */
    snprintf(expect, sizeof(expect), "%s\n%s\n", ref[0], ref[1]);
    rc = cli((const char *[]){"hash", "1", "2", "3", "4", "5", "6", "7", "8", "9",
                              "--page-size", "4", NULL});
    DT_CHECK(rc == 0 && strcmp(out, expect) == 0,
             "kvdock hash TOKENS --page-size 4: exit %d, printed\n%s", rc, out);

    rc = cli((const char *[]){"hash", "1", "2", "3", "4", NULL});
    DT_CHECK(rc == 2, "kvdock hash without --page-size: exit %d, want 2", rc);
    rc = cli((const char *[]){"hash", "--page-size", "4", "1", "x", "3", "4", NULL});
    DT_CHECK(rc == 2, "kvdock hash with a bad token: exit %d, want 2", rc);
    rc = cli((const char *[]){"hash", "--page-size", "4", "--prior", "abc", "1", "2", "3",
                              "4", NULL});
    DT_CHECK(rc == 2, "kvdock hash with a bad --prior: exit %d, want 2", rc);
}

/* ---------------------------------------------------------------- store */

static kvd_key_t keys[N_PAGES];
static char hex[N_PAGES][65];

/* The kv chain, and mamba state at boundaries 2 and 6 (keys[1], keys[5]). */
static bool store(ts_client_t *t)
{
    kvd_put_item_t items[N_PAGES];
    ts_chain_items(keys, N_PAGES, NULL, 0, items);
    uint8_t res[N_PAGES];
    uint64_t off[N_PAGES], lease = 0;
    ts_err_t e;
    int st =
        ts_reserve(t->c, t->ns[0], TS_KV_BYTES, items, N_PAGES, &lease, res, off, &e);
    if (!DT_CHECK(st == KVD_OK && lease != 0, "reserve kv: %s (%s)", kvd_status_str(st),
                  e.text))
        return false;
    st = ts_publish(t->c, lease, NULL, 0, &e);
    if (!DT_CHECK(st == KVD_OK, "publish kv: %s (%s)", kvd_status_str(st), e.text))
        return false;
    kvd_put_item_t m[2];
    ts_chain_items(&keys[1], 1, keys[0], 1, &m[0]);
    ts_chain_items(&keys[5], 1, keys[4], 5, &m[1]);
    st = ts_reserve(t->c, t->ns[1], TS_MAMBA_BYTES, m, 2, &lease, res, off, &e);
    if (!DT_CHECK(st == KVD_OK && lease != 0 && res[0] == KVD_RESERVE_ALLOCATED &&
                      res[1] == KVD_RESERVE_ALLOCATED,
                  "reserve mamba: %s (%s)", kvd_status_str(st), e.text))
        return false;
    st = ts_publish(t->c, lease, NULL, 0, &e);
    return DT_CHECK(st == KVD_OK, "publish mamba: %s (%s)", kvd_status_str(st), e.text);
}

static void check_prefixes(const char *socket)
{
    char h0[17], h5[17], want[160];
    ts_hex8(keys[0], h0);
    ts_hex8(keys[5], h5);
    int rc = cli_s(socket, (const char *[]){"prefixes", NULL});
    DT_CHECK(rc == 0, "kvdock prefixes: exit %d", rc);
    DT_CHECK(count_of(out, " root ") == 1, "kvdock prefixes should list one prefix:\n%s",
             out);
    snprintf(want, sizeof(want), "%s  root %s  leaf %s  6 pages", TS_KV_NS, h0, h5);
    DT_CHECK(strncmp(out, want, strlen(want)) == 0,
             "kvdock prefixes should start with '%s':\n%s", want, out);
    snprintf(want, sizeof(want), "\n    %s at boundaries 2,6\n", TS_MAMBA_NS);
    DT_CHECK(strstr(out, want) != NULL, "kvdock prefixes should say '%s':\n%s", want + 1,
             out);
    DT_CHECK(strstr(out, "\n" TS_MAMBA_NS "  root") == NULL,
             "the mamba state should not be listed as prefixes of its own:\n%s", out);

    rc = cli_s(socket, (const char *[]){"prefixes", "--json", NULL});
    DT_CHECK(rc == 0 && dt_json_valid(out), "kvdock prefixes --json: exit %d, '%s'", rc,
             out);
    uint64_t v = 0;
    DT_CHECK(dt_json_u64(out, NULL, "pages", &v) && v == N_PAGES,
             "prefixes --json: pages %llu, want %d", (unsigned long long)v, N_PAGES);
    DT_CHECK(dt_json_u64(out, NULL, "bytes", &v) && v == N_PAGES * (uint64_t)TS_KV_BYTES,
             "prefixes --json: bytes %llu, want %llu", (unsigned long long)v,
             (unsigned long long)(N_PAGES * (uint64_t)TS_KV_BYTES));
    DT_CHECK(count_of(out, "\"root\":") == 1, "prefixes --json: %d prefixes, want 1",
             count_of(out, "\"root\":"));
    char field[120];
    snprintf(field, sizeof(field), "\"root\":\"%s\"", hex[0]);
    DT_CHECK(strstr(out, field) != NULL, "prefixes --json: no %s in '%s'", field, out);
    snprintf(field, sizeof(field), "\"leaf\":\"%s\"", hex[N_PAGES - 1]);
    DT_CHECK(strstr(out, field) != NULL, "prefixes --json: no %s in '%s'", field, out);
    DT_CHECK(strstr(out, "\"pools\":[{\"namespace\":\"" TS_MAMBA_NS
                         "\",\"boundaries\":[2,6]}]") != NULL,
             "prefixes --json: no pools entry for %s at [2,6]: '%s'", TS_MAMBA_NS, out);

    rc = cli_s(socket, (const char *[]){"prefixes", "--tree", NULL});
    snprintf(want, sizeof(want), "%s depth 0", h0);
    DT_CHECK(rc == 0 && strstr(out, TS_KV_NS "\n") && strstr(out, want),
             "kvdock prefixes --tree: exit %d, should print the root '%s':\n%s", rc, want,
             out);
    DT_CHECK(strstr(out, "(6 pages)") != NULL,
             "kvdock prefixes --tree should fold the 6-page chain:\n%s", out);
}

static void check_show(const char *socket)
{
    int rc = cli_s(socket, (const char *[]){"show", hex[3], NULL});
    DT_CHECK(rc == 0, "kvdock show: exit %d", rc);
    char want[160];
    const char *lines[5];
    char l0[100], l1[100], l2[100];
    snprintf(l0, sizeof(l0), "namespace    %s\n", TS_KV_NS);
    snprintf(l1, sizeof(l1), "key          %s\n", hex[3]);
    snprintf(l2, sizeof(l2), "parent       %s\n", hex[2]);
    lines[0] = l0;
    lines[1] = l1;
    lines[2] = l2;
    lines[3] = "depth        3\n";
    lines[4] = "state        ready\n";
    for (size_t i = 0; i < KVD_ARRAY_SIZE(lines); i++)
        DT_CHECK(strstr(out, lines[i]) != NULL, "kvdock show should have '%.*s':\n%s",
                 (int)strlen(lines[i]) - 1, lines[i], out);

    rc = cli_s(socket, (const char *[]){"show", "--json", hex[1], NULL});
    DT_CHECK(rc == 0 && dt_json_valid(out), "kvdock show --json: exit %d, '%s'", rc, out);
    snprintf(want, sizeof(want), "\"namespace\":\"%s\"", TS_KV_NS);
    DT_CHECK(strstr(out, want) != NULL, "show --json of page 2 lacks %s: '%s'", want,
             out);
    snprintf(want, sizeof(want), "\"namespace\":\"%s\"", TS_MAMBA_NS);
    DT_CHECK(strstr(out, want) != NULL, "show --json of page 2 lacks %s: '%s'", want,
             out);

    char unknown[65];
    memset(unknown, 'e', 64);
    unknown[64] = '\0';
    rc = cli_s(socket, (const char *[]){"show", unknown, NULL});
    DT_CHECK(rc == 1, "kvdock show of an unknown key: exit %d, want 1", rc);
    rc = cli_s(socket, (const char *[]){"show", "xyz", NULL});
    DT_CHECK(rc == 2, "kvdock show of a malformed key: exit %d, want 2", rc);
}

static void check_lookup(const char *socket, int n_pages, const char *want_line)
{
    const char *args[20];
    size_t n = 0;
    args[n++] = "lookup";
    args[n++] = "--namespace";
    args[n++] = TS_KV_NS;
    for (int i = 0; i < N_PAGES; i++)
        args[n++] = hex[i];
    args[n] = NULL;
    int rc = cli_s(socket, args);
    DT_CHECK(rc == 0 && strstr(out, want_line) != NULL,
             "kvdock lookup of %d stored pages: exit %d, want '%s':\n%s", n_pages, rc,
             want_line, out);
}

static void check_lookups(const char *socket)
{
    check_lookup(socket, N_PAGES, "restorable boundaries (pages): 1 2 3 4 5 6\n");
    const char *args[20];
    size_t n = 0;
    args[n++] = "lookup";
    args[n++] = "--namespace";
    args[n++] = TS_KV_NS;
    args[n++] = "--namespace";
    args[n++] = TS_MAMBA_NS;
    args[n++] = "--trailing";
    args[n++] = "0,1";
    for (int i = 0; i < N_PAGES; i++)
        args[n++] = hex[i];
    args[n] = NULL;
    int rc = cli_s(socket, args);
    DT_CHECK(rc == 0 && strstr(out, "restorable boundaries (pages): 2 6\n") &&
                 strstr(out, "longest: 6 of 6 pages"),
             "kvdock lookup kv + mamba --trailing 0,1: exit %d, want boundaries 2 6:\n%s",
             rc, out);
    /* --json before the keys */
    const char *jargs[20] = {"lookup", "--json"};
    memcpy(&jargs[2], &args[1], (n - 1) * sizeof(char *));
    jargs[n + 1] = NULL;
    rc = cli_s(socket, jargs);
    DT_CHECK(rc == 0 && dt_json_valid(out) &&
                 strstr(out, "{\"boundaries\":[2,6],\"longest\":6}") != NULL,
             "kvdock lookup --json KEYS: exit %d, '%s'", rc, out);
    /* ... and after them: kvdock.c says a command's options come "in any
     * order with its arguments" */
    args[n++] = "--json";
    args[n] = NULL;
    rc = cli_s(socket, args);
    DT_CHECK(rc == 0 && dt_json_valid(out) &&
                 strstr(out, "{\"boundaries\":[2,6],\"longest\":6}") != NULL,
             "kvdock lookup KEYS --json: exit %d, '%s'", rc, out);
    rc = cli_s(socket,
               (const char *[]){"lookup", "--namespace", "no/such/ns", hex[0], NULL});
    DT_CHECK(rc == 1, "kvdock lookup in an unknown namespace: exit %d, want 1", rc);
}

static void check_evict(const char *socket)
{
    int rc = cli_s(socket, (const char *[]){"evict", "--key", hex[5], "--namespace",
                                            TS_KV_NS, NULL});
    DT_CHECK(rc == 0 && strncmp(out, "evicted 1 objects", 17) == 0,
             "kvdock evict --key K6 --namespace %s: exit %d, '%s'", TS_KV_NS, rc, out);
    check_lookup(socket, N_PAGES - 1, "restorable boundaries (pages): 1 2 3 4 5\n");
    rc = cli_s(socket, (const char *[]){"evict", "--namespace", TS_MAMBA_NS, NULL});
    DT_CHECK(rc == 0 && strncmp(out, "evicted 2 objects", 17) == 0,
             "kvdock evict --namespace %s: exit %d, '%s'", TS_MAMBA_NS, rc, out);
    rc = cli_s(socket, (const char *[]){"evict", "--all", NULL});
    DT_CHECK(rc == 0 && strncmp(out, "evicted 5 objects", 17) == 0,
             "kvdock evict --all: exit %d, '%s' (want the remaining 5)", rc, out);
    rc = cli_s(socket, (const char *[]){"stats", "--json", NULL});
    uint64_t v = 99;
    DT_CHECK(rc == 0 && dt_json_valid(out) &&
                 dt_json_u64(out, "\"store\":{", "objects_ready", &v) && v == 0,
             "kvdock stats --json after evicting everything: exit %d, objects_ready %llu",
             rc, (unsigned long long)v);
    DT_CHECK(dt_json_u64(out, "\"store\":{", "evictions", &v) && v == N_PAGES + 2,
             "stats --json: evictions %llu, want %d", (unsigned long long)v, N_PAGES + 2);
    rc = cli_s(socket, (const char *[]){"evict", NULL});
    DT_CHECK(rc == 2, "kvdock evict without a selector: exit %d, want 2", rc);
    rc = cli_s(socket, (const char *[]){"evict", "--all", "--namespace", TS_KV_NS, NULL});
    DT_CHECK(rc == 2, "kvdock evict --all --namespace: exit %d, want 2", rc);
    rc = cli_s(socket, (const char *[]){"prefixes", NULL});
    DT_CHECK(rc == 0 && strstr(out, "no stored prefixes") != NULL,
             "kvdock prefixes after evicting everything: exit %d, '%s'", rc, out);
}

/* Every field of list l as a key after `after` in json, a number equal to
 * obj's field (strings and flags only present); and as a row of table. */
static void expect_list(const char *json, const char *table, const char *after,
                        const kvd_field_list_t *l, const void *obj, const char *what)
{
    for (size_t i = 0; i < l->n; i++) {
        const kvd_field_t *f = &l->fields[i];
        char key[96], row[96];
        snprintf(key, sizeof(key), "\"%s\":", f->name);
        snprintf(row, sizeof(row), "  %s ", f->name);
        const char *from = strstr(json, after);
        DT_CHECK(from != NULL && strstr(from, key) != NULL, "stats --json: %s lacks %s",
                 what, key);
        DT_CHECK(strstr(table, row) != NULL, "stats table: no row '%s' for %s", f->name,
                 what);
        uint64_t v = 0;
        if (f->type == KVD_FIELD_U64 || f->type == KVD_FIELD_U32)
            DT_CHECK(dt_json_u64(json, after, f->name, &v) && v == kvd_field_u64(f, obj),
                     "stats --json: %s.%s is %llu, Stats says %llu", what, f->name,
                     (unsigned long long)v, (unsigned long long)kvd_field_u64(f, obj));
    }
}

static void check_stats(const char *socket)
{
    ts_stats_t st;
    if (!DT_CHECK(ts_stats_fresh(socket, false, &st) == KVD_OK, "stats failed"))
        return;
    static char json[1 << 16];
    int rc = cli_s(socket, (const char *[]){"stats", "--json", NULL});
    DT_CHECK(rc == 0 && dt_json_valid(out), "kvdock stats --json: exit %d", rc);
    kvd_strlcpy(json, out, sizeof(json));
    rc = cli_s(socket, (const char *[]){"stats", NULL});
    DT_CHECK(rc == 0, "kvdock stats: exit %d", rc);
    expect_list(json, out, "\"store\":{", &kvd_store_stats_fields, &st.store, "store");
    for (size_t i = 0; i < st.n_ns; i++) {
        char after[KVD_NS_NAME_BYTES + 16];
        snprintf(after, sizeof(after), "\"name\":\"%s\"", st.ns[i].name);
        /* id and name come first in a namespace's object: look from its id */
        char from[64];
        snprintf(from, sizeof(from), "{\"id\":%u,", st.ns[i].id);
        expect_list(json, out, from, &kvd_ns_fields, &st.ns[i], st.ns[i].name);
        DT_CHECK(strstr(json, after) != NULL, "stats --json: no namespace %s",
                 st.ns[i].name);
    }
    const kvd_ns_msg_t *kv = ts_stats_ns(&st, TS_KV_NS);
    DT_CHECK(kv != NULL && kv->published_bytes == N_PAGES * (uint64_t)TS_KV_BYTES,
             "Stats: %s published_bytes %llu, want %d pages", TS_KV_NS,
             kv ? (unsigned long long)kv->published_bytes : 0ull, N_PAGES);
}

static void run(const kvd_test_daemon_t *d)
{
    if (ts_make_keys(0, N_PAGES, PAGE_SIZE, keys) != 0)
        return;
    for (int i = 0; i < N_PAGES; i++)
        kvd_key_to_hex(keys[i], hex[i]);
    kvd_ns_spec_t specs[2] = {ts_spec(TS_KV_NS, TS_KV_BYTES),
                              ts_spec(TS_MAMBA_NS, TS_MAMBA_BYTES)};
    ts_client_t t;
    if (ts_open(&t, d->socket, specs, 2, false) != 0)
        return;
    bool stored = store(&t);
    ts_close(&t);
    if (!stored)
        return;
    check_stats(d->socket);
    check_prefixes(d->socket);
    check_show(d->socket);
    check_lookups(d->socket);
    check_evict(d->socket);
    ts_cli_check(d->socket, "after the CLI commands");
}

int main(void)
{
    check_hash();
    kvd_test_daemon_t d = {0};
    if (dt_start(&d, NULL) == 0)
        run(&d);
    dt_stop(&d, SIGTERM, 10000);
    return dt_exit_status("cli/store_cmds");
}
