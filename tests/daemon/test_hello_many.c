/*
 * Description: a Hello naming many namespaces with short names, against a
 * live kvdockd. Issue 11: 2,048 unique two-character names, within the
 * default --max-batch of 4,096, were refused as a malformed frame (the
 * decoding budget ran out) and the connection closed. Now: 2,048 and
 * exactly 4,096 (the --max-batch boundary) are accepted with one id per
 * namespace; 4,097 get a typed TOO_LARGE naming --max-batch, on a
 * connection that stays usable. The same at a --max-batch of 100 (100
 * accepted, 101 TOO_LARGE).
 */
#include "dtest.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Hello with n namespaces named from base (two characters each below 4,096,
 * unique); returns the status and checks the ids of an accepted one. */
static int hello_n(kvd_client_t *c, size_t n, char *err, size_t err_len)
{
    kvd_ns_spec_t *specs = calloc(n, sizeof(*specs));
    kvd_msg_t *req = calloc(1, sizeof(*req)), *rep = calloc(1, sizeof(*rep));
    int rc = KVD_ERR_NOMEM;
    if (specs == NULL || req == NULL || rep == NULL)
        goto out;
    for (size_t i = 0; i < n; i++) {
        specs[i].name[0] = (char)('0' + i % 64);
        specs[i].name[1] = (char)('0' + (i / 64) % 64);
        if (i >= 4096)
            specs[i].name[2] = '!';
        specs[i].object_bytes = 4096;
    }
    kvd_msg_request(req, 0, KVD_METHOD_HELLO);
    kvd_strlcpy(req->body.hello_req.client_name, "many-names",
                sizeof(req->body.hello_req.client_name));
    req->body.hello_req.pid = (uint32_t)getpid();
    req->body.hello_req.protocol_version = KVD_PROTOCOL_VERSION;
    req->body.hello_req.namespaces = specs;
    req->body.hello_req.n_namespaces = n;
    rc = kvd_client_call(c, req, rep, 20000);
    if (rc == KVD_OK) {
        rc = rep->status;
        kvd_strlcpy(err, rep->error, err_len);
        if (rc == KVD_OK)
            DT_CHECK(rep->body.hello_rep.n_ns_ids == n, "hello of %zu: %zu ids", n,
                     rep->body.hello_rep.n_ns_ids);
    }
    kvd_msg_clear(rep);
out:
    free(specs);
    free(req);
    free(rep);
    return rc;
}

static void boundary(const char *max_batch, size_t limit, const size_t *ok, size_t n_ok)
{
    const char *extra[] = {"--max-batch", max_batch, NULL};
    kvd_test_daemon_t d;
    if (dt_start(&d, extra) == 0) {
        kvd_client_t *c = dt_connect(d.socket, false);
        char err[KVD_ERROR_MAX] = "";
        for (size_t i = 0; c != NULL && i < n_ok; i++) {
            int rc = hello_n(c, ok[i], err, sizeof(err));
            DT_CHECK(rc == KVD_OK, "--max-batch %s: hello of %zu namespaces: %s (%s)",
                     max_batch, ok[i], kvd_status_str(rc), err);
        }
        if (c != NULL) {
            int rc = hello_n(c, limit + 1, err, sizeof(err));
            DT_CHECK(rc == KVD_ERR_TOO_LARGE,
                     "--max-batch %s: hello of %zu namespaces: %s (%s), want too large",
                     max_batch, limit + 1, kvd_status_str(rc), err);
            DT_CHECK(strstr(err, "--max-batch") != NULL,
                     "the refusal should name --max-batch: %s", err);
            kvd_health_rep_t h;
            DT_CHECK(dt_health(c, &h) == KVD_HEALTH_READY,
                     "the connection should stay usable after the refusal");
            kvd_client_close(c);
        }
    }
    dt_stop(&d, SIGTERM, 10000);
}

int main(void)
{
    const size_t big[] = {2048, 4096};
    boundary("4096", 4096, big, 2);
    const size_t small[] = {100};
    boundary("100", 100, small, 1);
    return dt_exit_status("daemon/hello_many");
}
