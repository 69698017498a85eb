/*
 * bench_ucx.c - mode `ucx` of kvdock-bench: the UCX transport alone, no
 * linker: against a kvdockd started here, one Hello asks for the UCX
 * server's address and the pool's rkey, then batches of READs or WRITEs of
 * --size bytes each move 512 MiB between a local buffer (one region of the
 * transport) and scattered places of the pool, --batch transfers per batch
 * (a batch is posted, then waited for), in the mode given. What the linker
 * adds on top (RPCs, layer-by-layer batches, device rows) is the
 * difference to `linker --transport ucx`.
 */
#include "bench.h"
#include "kvd_transport.h"

#include <getopt.h>
#include <stdlib.h>
#include <string.h>

#define UCXB_BYTES (512ull << 20)

static int hello_ucx(const char *socket, kvd_client_t **c, kvd_msg_t *rep)
{
    int rc = kvd_client_connect_unix(socket, BENCH_CALL_TIMEOUT_MS, c);
    if (rc != KVD_OK)
        return rc;
    kvd_msg_t req;
    kvd_msg_request(&req, 0, KVD_METHOD_HELLO);
    req.body.hello_req.protocol_version = KVD_PROTOCOL_VERSION;
    req.body.hello_req.want_ucx = true;
    kvd_strlcpy(req.body.hello_req.client_name, "kvdock-bench-ucx", KVD_NAME_MAX);
    rc = kvd_client_call(*c, &req, rep, BENCH_CALL_TIMEOUT_MS);
    return rc != KVD_OK ? rc : rep->status;
}

/* One pass over the buffer; GB/s, or 0 when a batch failed. */
static double one_pass(kvd_transport_t *t, kvd_xfer_dir_t dir, const kvd_xfer_t *x,
                       size_t n, size_t batch)
{
    uint64_t t0 = kvd_now_ns();
    for (size_t i = 0; i < n; i += batch) {
        size_t k = KVD_MIN(batch, n - i);
        if (kvd_transport_post(t, dir, x + i, k, i + 1) != KVD_OK ||
            kvd_transport_wait(t, i + 1, 30000, NULL, NULL, 0) != KVD_OK)
            return 0;
    }
    return (double)UCXB_BYTES / ((double)(kvd_now_ns() - t0) / 1e9) / 1e9;
}

int bench_mode_ucx(int argc, char **argv)
{
    const char *kvdockd = NULL, *mode = "am";
    uint64_t size = 128 * 1024, batch = 64, passes = 3;
    static const struct option longopts[] = {{"kvdockd", required_argument, NULL, 'k'},
                                             {"mode", required_argument, NULL, 'm'},
                                             {"size", required_argument, NULL, 's'},
                                             {"batch", required_argument, NULL, 'b'},
                                             {"passes", required_argument, NULL, 'p'},
                                             {NULL, 0, NULL, 0}};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        if (c == 'k')
            kvdockd = optarg;
        else if (c == 'm' && (strcmp(optarg, "am") == 0 || strcmp(optarg, "rma") == 0))
            mode = optarg;
        else if (c == 's' && kvd_size_parse(optarg, &size) == KVD_OK && size >= 4096 &&
                 size <= (64ull << 20))
            continue;
        else if (c == 'b' && kvd_u64_parse(optarg, 1, 65536, &batch) == KVD_OK)
            continue;
        else if (c == 'p' && kvd_u64_parse(optarg, 1, 100, &passes) == KVD_OK)
            continue;
        else
            break;
    }
    if (kvdockd == NULL || optind < argc) {
        fprintf(stderr, "Usage: kvdock-bench ucx --kvdockd PATH [--mode am|rma] "
                        "[--size SIZE] [--batch N] [--passes P]\n");
        return BENCH_EXIT_USAGE;
    }
    bench_env_t env;
    if (bench_env_init(&env) != KVD_OK ||
        bench_daemon_start(&env, kvdockd, "3G", true) != KVD_OK) {
        bench_env_cleanup(&env);
        return BENCH_EXIT_FAIL;
    }
    int status = BENCH_EXIT_FAIL;
    kvd_client_t *client = NULL;
    kvd_msg_t rep = {0};
    kvd_transport_t *t = NULL;
    kvd_region_t *region = NULL;
    uint8_t *local = aligned_alloc(4096, UCXB_BYTES);
    size_t n = UCXB_BYTES / size;
    kvd_xfer_t *x = calloc(n, sizeof(*x));
    int rc = local && x ? hello_ucx(env.daemon_socket, &client, &rep) : KVD_ERR_NOMEM;
    const kvd_hello_rep_t *h = &rep.body.hello_rep;
    if (rc == KVD_OK)
        rc = kvd_transport_open_ucx("kvdock-bench", &t);
    if (rc == KVD_OK)
        rc = kvd_transport_register(t, local, UCXB_BYTES, kvd_memkind_host(), &region);
    if (rc == KVD_OK) {
        kvd_peer_t peer = {
            .length = h->pool_bytes,
            .ucx = {.address = h->ucx_address,
                    .address_len = h->ucx_address_len,
                    .rkey = h->ucx_rkey,
                    .rkey_len = h->ucx_rkey_len,
                    .base = h->ucx_pool_base,
                    .mode = strcmp(mode, "am") == 0 ? KVD_UCX_MODE_AM : KVD_UCX_MODE_RMA,
                    .cap = h->ucx_token,
                    .cap_len = h->ucx_token_len}};
        if (peer.ucx.mode == KVD_UCX_MODE_RMA && h->ucx_rkey_len == 0)
            fprintf(stderr,
                    "kvdock-bench ucx: the daemon offers no RMA here (its UCX "
                    "transports do not enforce the registration): use --mode am\n");
        rc = kvd_transport_connect(t, &peer);
    }
    if (rc == KVD_OK) {
        memset(local, 0x5a, UCXB_BYTES);
        /* scattered over the pool: transfer i goes to slot i * 7919 mod slots */
        uint64_t slots = h->pool_bytes / size;
        for (size_t i = 0; i < n; i++)
            x[i] = (kvd_xfer_t){.local = region,
                                .local_offset = i * size,
                                .remote_offset = (i * 7919 % slots) * size,
                                .length = size};
        char s[32];
        printf("ucx transport alone, mode %s, UCX_TLS=%s, %s per transfer, %llu per "
               "batch, 512 MiB a pass\n",
               mode, getenv("UCX_TLS") ? getenv("UCX_TLS") : "(unset)",
               kvd_size_format(size, s, sizeof(s)), (unsigned long long)batch);
        printf("%-6s %-6s %s\n", "dir", "pass", "GB/s");
        for (int d = 0; d < 2; d++)
            for (uint64_t p = 0; p < passes; p++) {
                double gbs = one_pass(t, d ? KVD_XFER_READ : KVD_XFER_WRITE, x, n, batch);
                printf("%-6s %-6llu %.2f\n", d ? "read" : "write", (unsigned long long)p,
                       gbs);
                fflush(stdout);
            }
        status = BENCH_EXIT_OK;
    } else {
        fprintf(stderr, "kvdock-bench ucx: cannot set up: %s\n", kvd_status_str(rc));
    }
    kvd_transport_destroy(t); /* deregisters the region */
    kvd_msg_clear(&rep);
    kvd_client_close(client);
    free(x);
    free(local);
    bench_env_cleanup(&env);
    return status;
}
