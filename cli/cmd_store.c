/*
 * cmd_store.c - the kvdock commands that look at what is stored: hash,
 * prefixes, show, lookup, evict.
 *
 * Namespaces are named by the operator and resolved to ids through the
 * Stats reply's namespace table. Keys are 64 hex digits. The --json texts
 * are proto/'s (kvd_json_*, json.c), and so are the paged listing and the
 * lookup by namespace names (query.c): libkvdock's store client runs the
 * same code. An object in --json has the fields of its field list
 * (kvd_proto.h), its namespace's name and its parent.
 */
#include "cli.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void print_time(uint64_t ms)
{
    if (ms == 0) {
        printf("never");
        return;
    }
    time_t t = (time_t)(ms / 1000);
    struct tm tm;
    gmtime_r(&t, &tm);
    printf("%04d-%02d-%02dT%02d:%02d:%02dZ", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
           tm.tm_hour, tm.tm_min, tm.tm_sec);
}

static int parse_key(const char *hex, uint8_t key[KVD_KEY_BYTES])
{
    if (kvd_key_from_hex(hex, key) == KVD_OK)
        return 0;
    fprintf(stderr, "kvdock: '%s' is not a key (64 hex digits)\n", hex);
    return -1;
}

/* ------------------------------------------------------------------ hash */

/* Reads whitespace- or comma-separated token ids from a file. */
static int read_tokens_file(const char *path, uint32_t **out, size_t *n)
{
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        fprintf(stderr, "kvdock hash: %s: %s\n", path, strerror(errno));
        return -1;
    }
    size_t cap = 1024, len = 0;
    uint32_t *t = malloc(cap * sizeof(*t));
    char word[32];
    int c, wl = 0, rc = 0;
    while (t != NULL && rc == 0) {
        c = fgetc(f);
        bool sep =
            c == EOF || c == ',' || c == ' ' || c == '\n' || c == '\t' || c == '\r';
        if (!sep) {
            if (wl + 1 >= (int)sizeof(word))
                rc = -1;
            else
                word[wl++] = (char)c;
            continue;
        }
        if (wl > 0) {
            word[wl] = '\0';
            uint64_t v;
            if (kvd_u64_parse(word, 0, UINT32_MAX, &v) != KVD_OK) {
                rc = -1;
                break;
            }
            if (len == cap) {
                uint32_t *nt = realloc(t, cap * 2 * sizeof(*t));
                if (nt == NULL) {
                    rc = -1;
                    break;
                }
                t = nt;
                cap *= 2;
            }
            t[len++] = (uint32_t)v;
            wl = 0;
        }
        if (c == EOF)
            break;
    }
    fclose(f);
    if (t == NULL || rc != 0) {
        fprintf(stderr, "kvdock hash: %s: token ids must be integers 0..4294967295\n",
                path);
        free(t);
        return -1;
    }
    *out = t;
    *n = len;
    return 0;
}

int cmd_hash(const cli_t *cli, const cli_args_t *a)
{
    uint64_t page;
    if (a->page_size == NULL ||
        kvd_u64_parse(a->page_size, 1, 1u << 24, &page) != KVD_OK) {
        fprintf(stderr, "kvdock hash: --page-size P (a positive integer) is required\n");
        return EXIT_USAGE;
    }
    uint8_t prior[KVD_KEY_BYTES];
    if (a->prior != NULL && parse_key(a->prior, prior) != 0)
        return EXIT_USAGE;
    if ((a->tokens_file != NULL) == (a->n_args > 0)) {
        fprintf(stderr,
                "kvdock hash: give the token ids as arguments or --tokens-file\n");
        return EXIT_USAGE;
    }
    uint32_t *tokens = NULL;
    size_t n = 0;
    if (a->tokens_file != NULL) {
        if (read_tokens_file(a->tokens_file, &tokens, &n) != 0)
            return EXIT_USAGE;
    } else {
        tokens = calloc(a->n_args, sizeof(*tokens));
        for (size_t i = 0; tokens && i < a->n_args; i++) {
            uint64_t v;
            if (kvd_u64_parse(a->args[i], 0, UINT32_MAX, &v) != KVD_OK) {
                fprintf(stderr,
                        "kvdock hash: token '%s' is not an integer 0..4294967295\n",
                        a->args[i]);
                free(tokens);
                return EXIT_USAGE;
            }
            tokens[i] = (uint32_t)v;
        }
        n = a->n_args;
    }
    size_t pages = n / page, n_keys = 0;
    uint8_t(*keys)[KVD_KEY_BYTES] = calloc(pages ? pages : 1, KVD_KEY_BYTES);
    int rc = tokens && keys
                 ? kvd_key_chain(tokens, n, page, a->prior ? prior : NULL, keys, &n_keys)
                 : KVD_ERR_NOMEM;
    if (rc == KVD_OK) {
        if (cli->json)
            printf("[");
        for (size_t i = 0; i < n_keys; i++) {
            char hex[65];
            kvd_key_to_hex(keys[i], hex);
            if (cli->json)
                printf("%s\"%s\"", i ? "," : "", hex);
            else
                printf("%s\n", hex);
        }
        if (cli->json)
            printf("]\n");
        if (n % page != 0 && !cli->json)
            fprintf(stderr,
                    "kvdock hash: %zu trailing tokens of a partial page have no key\n",
                    n % page);
    }
    free(keys);
    free(tokens);
    return rc == KVD_OK ? 0 : 1;
}

/* -------------------------------------------------------------- prefixes */

static void print_pools(const kvd_prefix_msg_t *p, const kvd_ns_msg_t *ns, size_t n_ns)
{
    for (size_t k = 0; k < p->n_pools; k++) {
        printf("    %s at boundaries", kvd_ns_msg_name(ns, n_ns, p->pools[k].ns));
        for (size_t b = 0; b < p->pools[k].n; b++)
            printf("%s%u", b ? "," : " ", p->pools[k].boundaries[b]);
        printf("\n");
    }
}

/* Prints the subtree under node i (its children: nodes whose parent is i's
 * key), folding runs of single children into one line. */
static void tree_print(const kvd_list_rep_t *l, size_t i, int indent, int budget)
{
    size_t run = 1, cur = i;
    for (;;) {
        size_t only = SIZE_MAX, kids = 0;
        for (size_t k = 0; k < l->n_nodes; k++) {
            const kvd_obj_msg_t *o = &l->nodes[k];
            if (o->ns == l->nodes[cur].ns && o->parent_len == KVD_KEY_BYTES &&
                memcmp(o->parent, l->nodes[cur].key, KVD_KEY_BYTES) == 0) {
                only = k;
                kids++;
            }
        }
        if (kids != 1)
            break;
        cur = only;
        run++;
    }
    printf("%*s", indent, "");
    cli_print_hex(l->nodes[i].key, 8);
    printf(" depth %u", l->nodes[i].depth);
    if (run > 1) {
        printf(" .. ");
        cli_print_hex(l->nodes[cur].key, 8);
        printf(" depth %u (%zu pages)", l->nodes[cur].depth, run);
    }
    printf("\n");
    if (budget <= 0)
        return;
    for (size_t k = 0; k < l->n_nodes; k++) {
        const kvd_obj_msg_t *o = &l->nodes[k];
        if (o->ns == l->nodes[cur].ns && o->parent_len == KVD_KEY_BYTES &&
            memcmp(o->parent, l->nodes[cur].key, KVD_KEY_BYTES) == 0)
            tree_print(l, k, indent + 2, budget - 1);
    }
}

/* Prints one daemon's listing as prefixes does. */
static void print_listing(const cli_t *cli, const cli_args_t *a, const kvd_list_rep_t *l)
{
    if (cli->json) {
        kvd_json_list(stdout, l);
    } else if (a->tree) {
        for (size_t i = 0; i < l->n_nodes; i++) {
            const kvd_obj_msg_t *o = &l->nodes[i];
            if (o->parent_len == KVD_KEY_BYTES)
                continue; /* not a root: printed under its parent */
            printf("%s\n", kvd_ns_msg_name(l->namespaces, l->n_namespaces, o->ns));
            tree_print(l, i, 2, 64);
        }
    } else {
        if (l->n_prefixes == 0)
            printf("no stored prefixes\n");
        for (size_t i = 0; i < l->n_prefixes; i++) {
            const kvd_prefix_msg_t *p = &l->prefixes[i];
            char b[32];
            printf("%s  root ", kvd_ns_msg_name(l->namespaces, l->n_namespaces, p->ns));
            cli_print_hex(p->root, 8);
            printf("  leaf ");
            cli_print_hex(p->leaf, 8);
            printf("  %u pages  %s  hits %llu  last ", p->pages,
                   kvd_size_format(p->bytes, b, sizeof(b)), (unsigned long long)p->hits);
            print_time(p->last_access_ms);
            printf("\n");
            print_pools(p, l->namespaces, l->n_namespaces);
        }
    }
    if (l->truncated && !cli->json)
        printf("(truncated at %zu entries: use --namespace or a larger --limit)\n",
               l->n_prefixes);
}

/* Fetches and prints one daemon's listing; false when it could not. */
static bool one_listing(const cli_t *cli, const cli_args_t *a, uint64_t limit)
{
    kvd_list_pages_t pages;
    int rc =
        kvd_list_fetch(cli_call_fn, (void *)cli,
                       a->n_namespaces ? a->namespaces[0] : NULL, a->tree, limit, &pages);
    if (rc == KVD_ERR_NOMEM)
        fprintf(stderr, "kvdock prefixes: out of memory\n");
    if (rc == KVD_OK)
        print_listing(cli, a, &pages.all);
    kvd_list_pages_free(&pages);
    return rc == KVD_OK;
}

/*
 * prefixes --cluster: the listing of every member, each asked at its own
 * address (from the daemon's `cluster` view) with the same credential.
 * A member that cannot be reached is named, and the exit status is 1.
 */
static int prefixes_cluster(const cli_t *cli, const cli_args_t *a, uint64_t limit)
{
    kvd_msg_t rep = {0};
    if (cli_call_empty(cli, KVD_METHOD_CLUSTER, &rep) != KVD_OK) {
        kvd_msg_clear(&rep);
        return 1;
    }
    const kvd_cluster_rep_t *c = &rep.body.cluster_rep;
    if (c->state == KVD_CLUSTER_OFF) {
        fprintf(stderr, "kvdock prefixes --cluster: %s\n", c->etcd);
        kvd_msg_clear(&rep);
        return 1;
    }
    bool all = true;
    if (cli->json)
        fputs("{\"members\":[", stdout);
    for (size_t i = 0; i < c->n_members; i++) {
        const kvd_member_msg_t *m = &c->members[i];
        cli_t one = *cli;
        one.connect = m->address;
        one.socket_path[0] = '\0';
        if (cli->json) {
            printf("%s{\"node\":", i ? "," : "");
            kvd_json_str(stdout, m->node_id);
            fputs(",\"address\":", stdout);
            kvd_json_str(stdout, m->address);
            fputs(",\"listing\":", stdout);
        } else {
            printf("%s== %s (%s)\n", i ? "\n" : "", m->node_id, m->address);
        }
        /* the member itself is asked where this CLI reached it */
        bool ok = one_listing(m->self ? cli : &one, a, limit);
        if (!ok && cli->json)
            fputs("null", stdout);
        if (!ok && !cli->json)
            printf("(not reachable)\n");
        if (cli->json)
            fputs("}", stdout);
        all &= ok;
    }
    if (cli->json)
        fputs("]}\n", stdout);
    kvd_msg_clear(&rep);
    return all ? 0 : 1;
}

int cmd_prefixes(const cli_t *cli, const cli_args_t *a)
{
    if (a->n_args > 0 || a->n_namespaces > 1) {
        fprintf(stderr,
                "kvdock prefixes: takes at most one --namespace and no arguments\n");
        return EXIT_USAGE;
    }
    uint64_t limit = 0;
    if (a->limit && kvd_u64_parse(a->limit, 1, UINT32_MAX, &limit) != KVD_OK) {
        fprintf(stderr, "kvdock prefixes: --limit must be a positive integer\n");
        return EXIT_USAGE;
    }
    if (a->cluster)
        return prefixes_cluster(cli, a, limit);
    /* every page the daemon has, up to --limit entries */
    bool ok = one_listing(cli, a, limit);
    if (ok && cli->json)
        putchar('\n');
    return ok ? 0 : 1;
}

/* ------------------------------------------------------------------ show */

/*
 * show KEY --cluster: asks the daemon to look the key up in the cluster's
 * directory (a routed DirLookup), in the namespace given (of --tenant,
 * default "default") or in every namespace the daemon knows (its Stats).
 */
static int show_cluster(const cli_t *cli, const cli_args_t *a)
{
    kvd_key_t key;
    if (parse_key(a->args[0], key) != 0)
        return EXIT_USAGE;
    kvd_msg_t req, rep = {0}, st = {0};
    kvd_msg_request(&req, 0, KVD_METHOD_DIR_LOOKUP);
    kvd_dir_lookup_req_t *r = &req.body.dir_lookup_req;
    if (a->n_namespaces == 1) {
        r->queries = kvd_msg_alloc(&req, sizeof(*r->queries));
        if (r->queries == NULL)
            return 1;
        kvd_strlcpy(r->queries[0].tenant, a->tenant ? a->tenant : "default",
                    sizeof(r->queries[0].tenant));
        kvd_strlcpy(r->queries[0].ns_name, a->namespaces[0],
                    sizeof(r->queries[0].ns_name));
        r->n = 1;
    } else {
        if (cli_call_empty(cli, KVD_METHOD_STATS, &st) != KVD_OK) {
            kvd_msg_clear(&st);
            kvd_msg_clear(&req);
            return 1;
        }
        const kvd_stats_rep_t *s = &st.body.stats_rep;
        r->queries = kvd_msg_alloc(&req, (s->n_namespaces + 1) * sizeof(*r->queries));
        if (r->queries == NULL) {
            kvd_msg_clear(&st);
            kvd_msg_clear(&req);
            return 1;
        }
        for (size_t i = 0; i < s->n_namespaces; i++) {
            if (a->tenant && strcmp(s->namespaces[i].tenant, a->tenant) != 0)
                continue;
            kvd_strlcpy(r->queries[r->n].tenant, s->namespaces[i].tenant,
                        sizeof(r->queries[0].tenant));
            kvd_strlcpy(r->queries[r->n].ns_name, s->namespaces[i].name,
                        sizeof(r->queries[0].ns_name));
            r->n++;
        }
    }
    for (size_t q = 0; q < r->n; q++) {
        r->queries[q].added = (kvd_key_t *)key;
        r->queries[q].n_added = 1;
    }
    int rc = cli_call(cli, &req, &rep);
    kvd_msg_clear(&st);
    if (rc != KVD_OK) {
        kvd_msg_clear(&rep);
        kvd_msg_clear(&req);
        return 1;
    }
    const kvd_dir_lookup_rep_t *d = &rep.body.dir_lookup_rep;
    size_t found = 0;
    if (cli->json) {
        fputs("{\"key\":\"", stdout);
        cli_print_hex(key, KVD_KEY_BYTES);
        fputs("\",\"holders\":[", stdout);
    }
    for (size_t q = 0; q < r->n && q < d->n; q++) {
        uint64_t bits = d->n_holders[q] ? d->holders[q][0] : 0;
        if (bits == 0)
            continue;
        if (cli->json) {
            printf("%s{\"tenant\":", found ? "," : "");
            kvd_json_str(stdout, r->queries[q].tenant);
            fputs(",\"namespace\":", stdout);
            kvd_json_str(stdout, r->queries[q].ns_name);
            fputs(",\"nodes\":[", stdout);
        } else {
            printf("namespace %s (tenant %s):", r->queries[q].ns_name,
                   r->queries[q].tenant);
        }
        bool first = true;
        for (size_t b = 0; b < d->n_nodes; b++) {
            if (!(bits >> b & 1))
                continue;
            if (cli->json) {
                fputs(first ? "" : ",", stdout);
                kvd_json_str(stdout, d->nodes[b]);
            } else {
                printf(" %s", d->nodes[b]);
            }
            first = false;
        }
        fputs(cli->json ? "]}" : "\n", stdout);
        found++;
    }
    if (cli->json)
        fputs("]}\n", stdout);
    else if (found == 0)
        printf("no member of the cluster holds it\n");
    kvd_msg_clear(&rep);
    kvd_msg_clear(&req);
    return found ? 0 : 1;
}

int cmd_show(const cli_t *cli, const cli_args_t *a)
{
    if (a->n_args != 1 || a->n_namespaces > 1) {
        fprintf(stderr, "kvdock show: takes one KEY and at most one --namespace\n");
        return EXIT_USAGE;
    }
    if (a->cluster)
        return show_cluster(cli, a);
    kvd_msg_t req, rep = {0};
    kvd_msg_request(&req, 0, KVD_METHOD_INSPECT);
    if (parse_key(a->args[0], req.body.inspect_req.key) != 0)
        return EXIT_USAGE;
    if (a->n_namespaces)
        kvd_strlcpy(req.body.inspect_req.ns_name, a->namespaces[0], KVD_NS_NAME_BYTES);
    if (cli_call(cli, &req, &rep) != KVD_OK) {
        kvd_msg_clear(&rep);
        return 1;
    }
    const kvd_inspect_rep_t *r = &rep.body.inspect_rep;
    if (cli->json) {
        kvd_json_inspect(stdout, r);
        putchar('\n');
    }
    for (size_t i = 0; !cli->json && i < r->n_objects; i++) {
        const kvd_obj_msg_t *o = &r->objects[i];
        const char *state = o->state == 1 /* writing */ ? "writing"
                            : o->pins                   ? "pinned"
                                                        : "ready";
        printf("namespace    %s\nkey          ",
               kvd_ns_msg_name(r->namespaces, r->n_namespaces, o->ns));
        cli_print_hex(o->key, KVD_KEY_BYTES);
        printf("\nparent       ");
        if (o->parent_len == 0)
            printf("(none: first page of its chain)");
        else if (o->parent_len == KVD_KEY_BYTES)
            cli_print_hex(o->parent, o->parent_len);
        else
            printf("(not stored)");
        printf("\ndepth        %u\nstate        %s\ntier         %s\npins         %u\n"
               "hits         %u\nlast access  ",
               o->depth, state, o->tier ? "ssd" : "dram", o->pins, o->hits);
        print_time(o->last_access_ms);
        printf("\nlocation     offset %llu, %llu bytes\n%s",
               (unsigned long long)o->offset, (unsigned long long)o->size,
               i + 1 < r->n_objects ? "\n" : "");
    }
    kvd_msg_clear(&rep);
    return 0;
}

/* ---------------------------------------------------------------- lookup */

/* Parses "--trailing 0,1,..." into one value per namespace (default 0). */
static int parse_trailing(const char *text, uint32_t *out, size_t n)
{
    for (size_t i = 0; i < n; i++)
        out[i] = 0;
    if (text == NULL)
        return 0;
    char buf[256];
    kvd_strlcpy(buf, text, sizeof(buf));
    char *save = NULL;
    size_t i = 0;
    for (char *tok = strtok_r(buf, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save), i++) {
        uint64_t v;
        if (i >= n || kvd_u64_parse(tok, 0, UINT32_MAX, &v) != KVD_OK) {
            fprintf(stderr,
                    "kvdock lookup: --trailing takes one integer per --namespace\n");
            return -1;
        }
        out[i] = (uint32_t)v;
    }
    return 0;
}

int cmd_lookup(const cli_t *cli, const cli_args_t *a)
{
    if (a->n_namespaces == 0 || a->n_args == 0) {
        fprintf(stderr,
                "kvdock lookup: --namespace N and at least one KEY are required\n");
        return EXIT_USAGE;
    }
    uint32_t trailing[KVD_LOOKUP_POOLS_MAX];
    if (parse_trailing(a->trailing, trailing, a->n_namespaces) != 0)
        return EXIT_USAGE;
    kvd_msg_t rep = {0};
    kvd_key_t *keys = calloc(a->n_args, sizeof(kvd_key_t));
    int status = 1;
    if (keys == NULL)
        goto out;
    for (size_t i = 0; i < a->n_args; i++)
        if (parse_key(a->args[i], keys[i]) != 0) {
            status = EXIT_USAGE;
            goto out;
        }
    size_t unknown;
    int rc = kvd_lookup_named(cli_call_fn, (void *)cli, a->namespaces, trailing,
                              a->n_namespaces, keys, a->n_args, &rep, &unknown);
    if (rc == KVD_ERR_NOT_FOUND && unknown < a->n_namespaces)
        fprintf(stderr, "kvdock: unknown namespace '%s' (see kvdock stats)\n",
                a->namespaces[unknown]);
    if (rc != KVD_OK)
        goto out;
    const kvd_lookup_rep_t *r = &rep.body.lookup_rep;
    if (cli->json) {
        kvd_json_lookup(stdout, r);
        putchar('\n');
    } else if (r->n == 0) {
        printf("nothing restorable (0 of %zu pages)\n", a->n_args);
    } else {
        printf("restorable boundaries (pages):");
        for (size_t i = 0; i < r->n; i++)
            printf(" %u", r->boundaries[i]);
        printf("\nlongest: %u of %zu pages\n", r->boundaries[r->n - 1], a->n_args);
    }
    status = 0;
out:
    kvd_msg_clear(&rep);
    free(keys);
    return status;
}

/* ----------------------------------------------------------------- evict */

/* Calls one `kvdock evict` makes at most: each evicts a slice of the
 * store's records (thousands), so this covers any pool. */
#define EVICT_CALLS_MAX 1000000u

int cmd_evict(const cli_t *cli, const cli_args_t *a)
{
    bool by_key = a->key != NULL, by_ns = a->n_namespaces == 1 && !by_key;
    if (a->n_args > 0 || a->n_namespaces > 1 || by_key + by_ns + a->all != 1) {
        fprintf(stderr,
                "kvdock evict: give one of --key K [--namespace N], --namespace N, "
                "--all\n");
        return EXIT_USAGE;
    }
    kvd_evict_req_t e = {.has_key = by_key, .all = a->all};
    if (by_key && parse_key(a->key, e.key) != 0)
        return EXIT_USAGE;
    if (a->n_namespaces)
        kvd_strlcpy(e.ns_name, a->namespaces[0], sizeof(e.ns_name));
    /* the daemon evicts a namespace in bounded slices: go on with each
     * reply's cursor until there is none (at most EVICT_CALLS_MAX calls) */
    uint64_t evicted, skipped;
    bool complete;
    if (kvd_evict_run(cli_call_fn, (void *)cli, &e, EVICT_CALLS_MAX, &evicted, &skipped,
                      &complete) != KVD_OK)
        return 1;
    bool more = !complete;
    if (cli->json)
        printf("{\"evicted\":%llu,\"skipped\":%llu,\"complete\":%s}\n",
               (unsigned long long)evicted, (unsigned long long)skipped,
               more ? "false" : "true");
    else
        printf("evicted %llu objects; %llu stayed (pinned or being written%s)\n",
               (unsigned long long)evicted, (unsigned long long)skipped,
               more ? ", or not reached: stopped after too many calls" : "");
    return 0;
}
