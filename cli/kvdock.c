/*
 * kvdock.c - the operator CLI: options, the command table, main().
 *
 *   kvdock [--socket PATH | --connect HOST:PORT | --instance NAME]
 *          [--token-file FILE] [--timeout MS] COMMAND [OPTIONS] [ARGS] [--json]
 *   COMMAND: health | stats | cluster | hash | prefixes | show | lookup | evict
 *
 * Each command is a row of `commands` below (its name, its synopsis and
 * help for --help, and the function in cmd_daemon.c or cmd_store.c that
 * runs it). Every command talks to the daemon over its RPC (kvd_proto.h),
 * saying Hello first on each connection, except hash, which needs no
 * daemon.
 *
 * Exit status: 0 success (health: the daemon is ready); 1 the daemon is not
 * there, answered an error, or has no such thing; 2 usage error; 3 health:
 * reachable but not ready (starting or draining).
 */
#include "cli.h"

#include <getopt.h>
#include <stdlib.h>
#include <string.h>

static const cli_cmd_t commands[] = {
    {"health", "", "the daemon's state (exit 0 ready, 3 starting or draining)",
     cmd_health},
    {"stats", "[--check]",
     "memory, connections, RPC counters, the store, its namespaces, RDMA ports;\n"
     "--check runs the store's invariant (exit 1 when broken); an operator's: the\n"
     "  daemon waits for it (about 0.23 s per million objects), at most 1 % of its time",
     cmd_stats},
    {"cluster", "",
     "the cluster this daemon is a member of: its state, epoch, and each member's\n"
     "address, pool, objects, directory share and last heartbeat",
     cmd_cluster},
    {"hash", "--page-size P [--prior HEX] (TOKENS... | --tokens-file F)",
     "the page-key chain (SGLang-compatible), one key per full page", cmd_hash},
    {"prefixes", "[--namespace N] [--tree] [--limit L] [--cluster]",
     "stored prefixes: namespace, root, pages, bytes, which pools hold state\n"
     "at which boundaries, last access, hits; --cluster: every member's, each\n"
     "asked at its address with the same credential",
     cmd_prefixes},
    {"show", "KEY [--namespace N] [--cluster [--tenant T]]",
     "one stored key in every namespace holding it;\n"
     "--cluster: which members of the cluster hold it (from the directory)",
     cmd_show},
    {"lookup", "--namespace N [--namespace N2 ...] [--trailing T[,T2...]] KEYS...",
     "the restorable boundaries (pages) for these page keys;\n"
     "--trailing 0 = all pages must be present (default)",
     cmd_lookup},
    {"evict", "(--key K [--namespace N] | --namespace N | --all)",
     "drop stored objects (pinned or unfinished ones stay)", cmd_evict},
};

/* Prints a help text indented under its command, line by line. */
static void print_help_lines(FILE *f, const char *text)
{
    for (const char *line = text; *line;) {
        const char *end = strchr(line, '\n');
        size_t n = end ? (size_t)(end - line) : strlen(line);
        fprintf(f, "      %.*s\n", (int)n, line);
        line += n + (end != NULL);
    }
}

static void usage(FILE *f)
{
    fprintf(f, "Usage: kvdock [OPTIONS] COMMAND [ARGS] [--json]\n"
               "Inspect a running kvdockd and what it stores.\n\nCommands:\n");
    for (size_t i = 0; i < KVD_ARRAY_SIZE(commands); i++) {
        fprintf(f, "  %s%s%s\n", commands[i].name, commands[i].synopsis[0] ? " " : "",
                commands[i].synopsis);
        print_help_lines(f, commands[i].help);
    }
    fprintf(f,
            "\nOptions:\n"
            "  --socket PATH    the daemon's Unix socket (default: that of --instance)\n"
            "  --connect H:P    reach the daemon over TCP instead (needs a token)\n"
            "  --token-file F   the token to present (default: $KVDOCK_AUTH_TOKEN_FILE)\n"
            "  --instance NAME  the daemon instance (default: default)\n"
            "  --timeout MS     bound on connecting and each call (default 5000)\n"
            "  --json           machine-readable output\n"
            "  --help, --version\n\n"
            "Exit status: 0 ok, 1 daemon unreachable, error or not found, 2 usage, 3 not "
            "ready.\n");
}

static const cli_cmd_t *find_command(const char *name)
{
    for (size_t i = 0; i < KVD_ARRAY_SIZE(commands); i++)
        if (strcmp(commands[i].name, name) == 0)
            return &commands[i];
    return NULL;
}

/* Parses the options before the command into *cli. Returns -1 to go on,
 * else the exit status (--help, --version, a bad option). */
static int parse_global(int argc, char **argv, cli_t *cli)
{
    static const struct option opts[] = {
        {"socket", required_argument, NULL, 's'},
        {"connect", required_argument, NULL, 'c'},
        {"instance", required_argument, NULL, 'i'},
        {"timeout", required_argument, NULL, 't'},
        {"token-file", required_argument, NULL, 'k'},
        {"json", no_argument, NULL, 'j'},
        {"help", no_argument, NULL, 'h'},
        {"version", no_argument, NULL, 'V'},
        {NULL, 0, NULL, 0},
    };
    const char *socket_path = NULL;
    const char *token_file = NULL; /* NULL: $KVDOCK_AUTH_TOKEN_FILE */
    int c;
    uint64_t v;
    while ((c = getopt_long(argc, argv, "+", opts, NULL)) != -1) {
        switch (c) {
        case 's': socket_path = optarg; break;
        case 'c': cli->connect = optarg; break;
        case 'i': cli->instance = optarg; break;
        case 'k': token_file = optarg; break;
        case 'j': cli->json = true; break;
        case 't':
            if (kvd_u64_parse(optarg, 1, 3600000, &v) != KVD_OK) {
                fprintf(stderr, "kvdock: --timeout '%s': expected milliseconds\n",
                        optarg);
                return EXIT_USAGE;
            }
            cli->timeout_ms = (int)v;
            break;
        case 'h': usage(stdout); return 0;
        case 'V':
            printf("kvdock %s (protocol %d)\n", KVD_VERSION, KVD_PROTOCOL_VERSION);
            return 0;
        default: usage(stderr); return EXIT_USAGE;
        }
    }
    if (socket_path != NULL)
        kvd_strlcpy(cli->socket_path, socket_path, sizeof(cli->socket_path));
    else
        kvd_default_socket_path(cli->instance, cli->socket_path,
                                sizeof(cli->socket_path));
    if (cli_read_token(cli, token_file) != 0)
        return 1;
    return -1;
}

/*
 * Parses the command's words (argv[0] is the command) into *a and --json
 * into *cli: options and arguments in any order, the arguments permuted to
 * the end. Returns -1 to go on, else EXIT_USAGE.
 */
static int parse_command(int argc, char **argv, cli_t *cli, cli_args_t *a)
{
    static const struct option opts[] = {
        {"json", no_argument, NULL, 'j'},
        {"check", no_argument, NULL, 'C'},
        {"namespace", required_argument, NULL, 'n'},
        {"tree", no_argument, NULL, 'T'},
        {"key", required_argument, NULL, 'k'},
        {"all", no_argument, NULL, 'a'},
        {"page-size", required_argument, NULL, 'p'},
        {"prior", required_argument, NULL, 'P'},
        {"tokens-file", required_argument, NULL, 'f'},
        {"trailing", required_argument, NULL, 'r'},
        {"limit", required_argument, NULL, 'l'},
        {"cluster", no_argument, NULL, 'c'},
        {"tenant", required_argument, NULL, 'e'},
        {NULL, 0, NULL, 0},
    };
    /* a fresh scan: optind = 0 makes glibc forget the "+" of the first one */
    optind = 0;
    int c;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'j': cli->json = true; break;
        case 'C': a->check = true; break;
        case 'n':
            if (a->n_namespaces == KVD_ARRAY_SIZE(a->namespaces)) {
                fprintf(stderr, "kvdock: at most %zu --namespace\n",
                        KVD_ARRAY_SIZE(a->namespaces));
                return EXIT_USAGE;
            }
            a->namespaces[a->n_namespaces++] = optarg;
            break;
        case 'T': a->tree = true; break;
        case 'k': a->key = optarg; break;
        case 'a': a->all = true; break;
        case 'p': a->page_size = optarg; break;
        case 'P': a->prior = optarg; break;
        case 'f': a->tokens_file = optarg; break;
        case 'r': a->trailing = optarg; break;
        case 'l': a->limit = optarg; break;
        case 'c': a->cluster = true; break;
        case 'e': a->tenant = optarg; break;
        default:
            fprintf(stderr, "kvdock %s: unknown option (see kvdock --help)\n", argv[0]);
            return EXIT_USAGE;
        }
    }
    a->args = argv + optind;
    a->n_args = (size_t)(argc - optind);
    return -1;
}

int main(int argc, char **argv)
{
    cli_t cli = {.instance = "default", .timeout_ms = 5000};
    int rc = parse_global(argc, argv, &cli);
    if (rc >= 0)
        return rc;
    if (optind >= argc) {
        usage(stderr);
        return EXIT_USAGE;
    }
    int cmd_at = optind;
    cli_args_t a = {0};
    rc = parse_command(argc - cmd_at, argv + cmd_at, &cli, &a);
    if (rc >= 0)
        return rc;
    const cli_cmd_t *command = find_command(argv[cmd_at]);
    if (command == NULL) {
        fprintf(stderr, "kvdock: unknown command '%s' (see kvdock --help)\n",
                argv[cmd_at]);
        return EXIT_USAGE;
    }
    return command->run(&cli, &a);
}
