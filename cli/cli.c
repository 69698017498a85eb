/*
 * cli.c - what every kvdock command uses: one RPC to the daemon (connect
 * and Hello through kvd_client_open, call, close; what failed is printed)
 * and printing: keys in hex, and the fields of a flat message from its
 * field list as table rows. JSON is proto/'s (kvd_json_*).
 */
#include "cli.h"

#include <string.h>

static int connect_daemon(const cli_t *cli, kvd_client_t **out)
{
    const char *where = cli->connect ? cli->connect : cli->socket_path;
    bool refused;
    int rc = kvd_client_open(cli->socket_path, cli->connect, "kvdock", cli->token,
                             cli->token_len, cli->timeout_ms, out, &refused);
    if (rc != KVD_OK && !refused)
        fprintf(stderr, "kvdock: cannot reach kvdockd at %s: %s%s\n", where,
                kvd_status_str(rc),
                rc == KVD_ERR_UNAVAILABLE ? " (is the daemon running? see --socket)"
                                          : "");
    else if (rc != KVD_OK)
        fprintf(stderr, "kvdock: kvdockd at %s refused the Hello: %s%s\n", where,
                kvd_status_str(rc),
                rc != KVD_ERR_AUTH   ? ""
                : cli->token_len > 0 ? " (is --token-file the daemon's token?)"
                : cli->connect       ? " (over TCP give --token-file FILE)"
                               : " (is this user allowed? see kvdockd --allow-uid)");
    return rc;
}

int cli_read_token(cli_t *cli, const char *path)
{
    char why[512];
    int rc = kvd_client_token_read(path, cli->token, sizeof(cli->token), &cli->token_len,
                                   why, sizeof(why));
    if (rc != KVD_OK)
        fprintf(stderr, "kvdock: token: %s\n", why);
    return rc;
}

int cli_call(const cli_t *cli, kvd_msg_t *req, kvd_msg_t *rep)
{
    kvd_client_t *c = NULL;
    memset(rep, 0, sizeof(*rep)); /* kvd_msg_clear is safe whatever happens */
    int rc = connect_daemon(cli, &c);
    if (rc != KVD_OK)
        return rc;
    rc = kvd_client_call(c, req, rep, cli->timeout_ms);
    kvd_client_close(c);
    if (rc != KVD_OK) {
        fprintf(stderr, "kvdock: %s call failed: %s\n", kvd_method_name(req->method),
                kvd_status_str(rc));
        return rc;
    }
    if (rep->status != KVD_OK) {
        fprintf(stderr, "kvdock: %s: %s (%s)\n", kvd_method_name(req->method), rep->error,
                kvd_status_str(rep->status));
        return rep->status;
    }
    return KVD_OK;
}

int cli_call_empty(const cli_t *cli, kvd_method_t method, kvd_msg_t *rep)
{
    kvd_msg_t req;
    kvd_msg_request(&req, 0, method);
    return cli_call(cli, &req, rep);
}

int cli_call_fn(void *cli, kvd_msg_t *req, kvd_msg_t *rep)
{
    return cli_call(cli, req, rep);
}

bool cli_no_args(const char *cmd, const cli_args_t *a)
{
    if (a->n_args == 0)
        return true;
    fprintf(stderr, "kvdock %s: unexpected argument '%s'\n", cmd, a->args[0]);
    return false;
}

void cli_print_hex(const uint8_t *bytes, size_t n)
{
    for (size_t i = 0; i < n; i++)
        printf("%02x", bytes[i]);
}

/* Whether a field counts bytes (its name says so). */
static bool is_bytes(const kvd_field_t *f)
{
    size_t n = strlen(f->name);
    return f->type == KVD_FIELD_U64 && n >= 6 && strcmp(f->name + n - 6, "_bytes") == 0;
}

void cli_table_rows(const kvd_field_list_t *l, const void *objs, size_t n, size_t size,
                    int indent)
{
    size_t width[32] = {0};
    char text[2 * KVD_KEY_BYTES + 1];
    size_t nf = KVD_MIN(l->n, KVD_ARRAY_SIZE(width));
    for (size_t k = 0; k < nf; k++) {
        width[k] = strlen(l->fields[k].name);
        for (size_t i = 0; i < n; i++)
            width[k] = KVD_MAX(width[k], strlen(kvd_field_text(
                                             &l->fields[k], (const char *)objs + i * size,
                                             text, sizeof(text))));
    }
    printf("%*s", indent, "");
    for (size_t k = 0; k < nf; k++)
        printf("%-*s%s", (int)width[k], l->fields[k].name, k + 1 < nf ? "  " : "\n");
    for (size_t i = 0; i < n; i++) {
        printf("%*s", indent, "");
        for (size_t k = 0; k < nf; k++) {
            kvd_field_text(&l->fields[k], (const char *)objs + i * size, text,
                           sizeof(text));
            printf("%-*s%s", (int)width[k], text[0] ? text : "-",
                   k + 1 < nf ? "  " : "\n");
        }
    }
}

void cli_table_fields(const kvd_field_list_t *l, const void *obj, int indent)
{
    char text[2 * KVD_KEY_BYTES + 1];
    for (size_t i = 0; i < l->n; i++) {
        const kvd_field_t *f = &l->fields[i];
        if (is_bytes(f))
            kvd_size_format(kvd_field_u64(f, obj), text, sizeof(text));
        else
            kvd_field_text(f, obj, text, sizeof(text));
        printf("%*s%-24s %s\n", indent, "", f->name, text[0] ? text : "-");
    }
}
