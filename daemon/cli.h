/*
 * cli.h - what the kvdock CLI's files share. Private to daemon/.
 */
#ifndef KVD_DAEMON_CLI_H
#define KVD_DAEMON_CLI_H

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
} cli_t;

/* A command's own options and its positional arguments. */
typedef struct cli_args {
    bool check, tree, all;
    const char *namespaces[16];
    size_t n_namespaces;
    const char *key, *page_size, *prior, *tokens_file, *trailing, *limit;
    char **args;
    size_t n_args;
} cli_args_t;

/*
 * Connects, sends req, waits for the reply into rep (which the caller
 * clears with kvd_msg_clear). Prints what went wrong and returns non-zero:
 * a transport failure or the daemon's error reply.
 */
int cli_call(const cli_t *cli, kvd_msg_t *req, kvd_msg_t *rep);

/* Prints s as a JSON string literal. */
void cli_json_str(const char *s);
/* Prints 64 hex digits of a key, or the first bytes of one. */
void cli_print_hex(const uint8_t *bytes, size_t n);

/* The namespace table, for name <-> id (in rep's arena). */
int cli_namespaces(const cli_t *cli, kvd_msg_t *rep, kvd_ns_msg_t **ns, size_t *n);

int cmd_hash(const cli_t *cli, const cli_args_t *a);
int cmd_prefixes(const cli_t *cli, const cli_args_t *a);
int cmd_show(const cli_t *cli, const cli_args_t *a);
int cmd_lookup(const cli_t *cli, const cli_args_t *a);
int cmd_evict(const cli_t *cli, const cli_args_t *a);

#endif
