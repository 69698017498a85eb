/*
 * cli.h - what the kvdock CLI's files share. Private to cli/.
 *
 * kvdock.c parses the options and runs a command of its table; the commands
 * live in cmd_daemon.c (health, stats) and cmd_store.c (hash, prefixes,
 * show, lookup, evict); cli.c is what they share: reaching the daemon, and
 * printing the rows of a flat message from its field list (kvd_proto.h),
 * so that a field has the same name in --json (written by proto/'s
 * kvd_json_*, as libkvdock's store client writes it), in the tables and in
 * the daemon's /metrics. Calls go one way: kvdock.c -> cmd_*.c -> cli.c.
 * Single-threaded.
 */
#ifndef KVD_CLI_H
#define KVD_CLI_H

#include "kvd_common.h"
#include "kvd_proto.h"

#include <stdbool.h>
#include <stdio.h>

enum { EXIT_USAGE = 2, EXIT_NOT_READY = 3 };

typedef struct cli {
    char socket_path[108];
    const char *connect;
    const char *instance;
    int timeout_ms;
    bool json;
    /* the credential every Hello carries (--token-file or
     * $KVDOCK_AUTH_TOKEN_FILE); none: token_len 0 */
    uint8_t token[KVD_TOKEN_MAX];
    size_t token_len;
} cli_t;

/* A command's own options and its positional arguments. */
typedef struct cli_args {
    bool check, tree, all;
    const char *namespaces[KVD_LOOKUP_POOLS_MAX];
    size_t n_namespaces;
    const char *key, *page_size, *prior, *tokens_file, *trailing, *limit;
    char **args;
    size_t n_args;
} cli_args_t;

/* One command: its name, what it does, and the function that runs it (its
 * exit status: 0 ok, 1 failed or not found, EXIT_USAGE, EXIT_NOT_READY). */
typedef struct cli_cmd {
    const char *name;
    const char *synopsis; /* its arguments, for --help */
    const char *help;     /* one line or more, for --help */
    int (*run)(const cli_t *cli, const cli_args_t *a);
} cli_cmd_t;

/* ------------------------------------------------------------- cli.c */

/* Reads the token file (NULL: $KVDOCK_AUTH_TOKEN_FILE's; none: no token)
 * into cli->token; prints why and returns non-zero when it cannot. */
int cli_read_token(cli_t *cli, const char *path);

/*
 * Connects, says Hello (with the token, if any), sends req, waits for the
 * reply into rep (which the caller
 * clears with kvd_msg_clear). Prints what went wrong and returns non-zero:
 * a transport failure or the daemon's error reply.
 */
int cli_call(const cli_t *cli, kvd_msg_t *req, kvd_msg_t *rep);

/* Calls a method without a request body. */
int cli_call_empty(const cli_t *cli, kvd_method_t method, kvd_msg_t *rep);

/* cli_call as a kvd_call_fn (ctx: the cli_t), for proto/'s queries. */
int cli_call_fn(void *cli, kvd_msg_t *req, kvd_msg_t *rep);

/* True when the command got no positional arguments; else says so. */
bool cli_no_args(const char *cmd, const cli_args_t *a);

/* Prints the hex digits of n bytes (a key, or the first bytes of one). */
void cli_print_hex(const uint8_t *bytes, size_t n);

/* Prints every field of obj as a table row "<indent><name> <value>",
 * sizes (a name ending in _bytes) in binary units. */
void cli_table_fields(const kvd_field_list_t *l, const void *obj, int indent);

/* Prints n objects (of size bytes each, at objs) as a table: a header of
 * the field names, then one row per object. */
void cli_table_rows(const kvd_field_list_t *l, const void *objs, size_t n, size_t size,
                    int indent);

/* ------------------------------------------------------ the commands */

int cmd_health(const cli_t *cli, const cli_args_t *a);
int cmd_cluster(const cli_t *cli, const cli_args_t *a);
int cmd_stats(const cli_t *cli, const cli_args_t *a);
int cmd_hash(const cli_t *cli, const cli_args_t *a);
int cmd_prefixes(const cli_t *cli, const cli_args_t *a);
int cmd_show(const cli_t *cli, const cli_args_t *a);
int cmd_lookup(const cli_t *cli, const cli_args_t *a);
int cmd_evict(const cli_t *cli, const cli_args_t *a);

#endif
