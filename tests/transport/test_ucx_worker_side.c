/*
 * Description: what a stranger gets from a worker's own UCX (issue 11: the
 * worker-side UCX listener). A linker's data path opens its UCX transport
 * with kvd_transport_open_ucx_mode; its worker listens on every transport
 * its context opened, and any host that reaches one can connect to it.
 * The attacker is this program with a UCP context of its own (RMA and AM),
 * connecting to the victim transport's worker address over tcp/lo, with an
 * rkey packed from its own memory (the software RMA of TCP never looks at
 * it), and a ucp_put_nbx of 64 bytes into a buffer of the victim process
 * while the victim's worker is progressed:
 *
 *   (a) control: a transport of kvd_transport_open_ucx (every transport,
 *       with RMA: the tests' and benchmarks' one) takes the put, which
 *       shows the attack is real;
 *   (b) kvd_transport_open_ucx_mode(AM): the put changes no byte, within a
 *       bounded wait, and its context opened no shared-memory transport
 *       (with UCX_TLS unset, UCX opens posix, sysv, cma by default);
 *   (c) kvd_transport_open_ucx_mode(RMA) on a host whose UCX has no
 *       transport that enforces the registration (no RDMA NIC here):
 *       KVD_ERR_UNSUPPORTED (the linker then uses the message mode, which
 *       linker/roundtrip-ucx-rma checks end to end); on a host with one,
 *       every transport it opened enforces the registration.
 *
 * Runs twice (meson): UCX_TLS=tcp, and UCX_TLS unset (with loopback as the
 * only network device). Skips (77) when UCX cannot start here.
 */
#include "kvd_common.h"
#include "kvd_transport.h"
#include "ucx_stranger.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucp/api/ucp.h>

#define WAIT_MS 3000

static int failures;

#define CHECK(cond, ...)                                         \
    do {                                                         \
        if (!(cond)) {                                           \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
            fprintf(stderr, __VA_ARGS__);                        \
            fputc('\n', stderr);                                 \
            failures++;                                          \
        }                                                        \
    } while (0)

typedef struct attacker {
    ucp_context_h ctx;
    ucp_worker_h worker;
    ucp_ep_h ep;
    ucp_mem_h memh;
    void *packed;
    size_t packed_len;
    uint8_t local[64];
} attacker_t;

static attacker_t A;

static int attacker_init(void)
{
    /* over TCP only: the worker side is attacked from another host */
    if (ucx_stranger_open("tcp", &A.ctx, &A.worker) != 0)
        return -1;
    memset(A.local, 0xee, sizeof(A.local));
    ucp_mem_map_params_t mp = {.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS |
                                             UCP_MEM_MAP_PARAM_FIELD_LENGTH,
                               .address = A.local,
                               .length = sizeof(A.local)};
    if (ucp_mem_map(A.ctx, &mp, &A.memh) != UCS_OK ||
        ucp_rkey_pack(A.ctx, A.memh, &A.packed, &A.packed_len) != UCS_OK)
        return -1;
    return 0;
}

static void attacker_fini(void)
{
    if (A.packed)
        ucp_rkey_buffer_release(A.packed);
    if (A.memh)
        ucp_mem_unmap(A.ctx, A.memh);
    if (A.worker)
        ucp_worker_destroy(A.worker);
    if (A.ctx)
        ucp_cleanup(A.ctx);
}

/* Progresses both workers until sp completes or ms pass. */
static ucs_status_t wait_req(kvd_transport_t *victim, ucs_status_ptr_t sp, int ms)
{
    if (!UCS_PTR_IS_PTR(sp))
        return UCS_PTR_STATUS(sp);
    uint64_t until = kvd_now_ns() + (uint64_t)ms * 1000000ull;
    ucs_status_t st;
    while ((st = ucp_request_check_status(sp)) == UCS_INPROGRESS &&
           kvd_now_ns() < until) {
        unsigned n = ucp_worker_progress(A.worker) + kvd_transport_progress(victim);
        if (n == 0)
            kvd_sleep_ns(100000);
    }
    if (st == UCS_INPROGRESS) {
        ucp_request_cancel(A.worker, sp);
        for (int i = 0; i < 100; i++)
            ucp_worker_progress(A.worker);
    }
    ucp_request_free(sp);
    return st;
}

/* Progresses both for ms (what an answer that should not come gets). */
static void progress_both(kvd_transport_t *victim, int ms)
{
    uint64_t until = kvd_now_ns() + (uint64_t)ms * 1000000ull;
    while (kvd_now_ns() < until)
        if (ucp_worker_progress(A.worker) + kvd_transport_progress(victim) == 0)
            kvd_sleep_ns(100000);
}

static void ep_err(void *arg, ucp_ep_h ep, ucs_status_t st)
{
    (void)arg;
    (void)ep;
    (void)st;
}

/*
 * Connects to the victim's worker and puts 64 bytes of 0xee at target (a
 * buffer of this process, which the victim's worker shares). Returns true
 * when the bytes landed; *wired says whether the endpoint wired up (so
 * that a put that did not land reached the victim and was dropped there).
 */
static bool attack(kvd_transport_t *victim, uint8_t *target, const char *what,
                   bool *wired)
{
    *wired = false;
    const void *addr = NULL;
    size_t addr_len = 0;
    if (kvd_transport_ucx_info(victim, &addr, &addr_len, NULL, 0) != KVD_OK || !addr) {
        CHECK(false, "(%s) the victim's worker address", what);
        return false;
    }
    memset(target, 0x11, 64);
    ucp_ep_params_t ep = {.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                                        UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                                        UCP_EP_PARAM_FIELD_ERR_HANDLER,
                          .address = addr,
                          .err_mode = UCP_ERR_HANDLING_MODE_PEER,
                          .err_handler = {.cb = ep_err}};
    if (ucp_ep_create(A.worker, &ep, &A.ep) != UCS_OK) {
        printf("(%s) the attacker cannot even make an endpoint to the victim\n", what);
        return false;
    }
    ucp_request_param_t prm = {0};
    ucs_status_t st = wait_req(victim, ucp_ep_flush_nbx(A.ep, &prm), WAIT_MS);
    bool landed = false;
    ucp_rkey_h rkey = NULL;
    *wired = st == UCS_OK;
    if (st == UCS_OK && ucp_ep_rkey_unpack(A.ep, A.packed, &rkey) == UCS_OK) {
        st = wait_req(victim,
                      ucp_put_nbx(A.ep, A.local, sizeof(A.local),
                                  (uint64_t)(uintptr_t)target, rkey, &prm),
                      WAIT_MS);
        if (st == UCS_OK)
            st = wait_req(victim, ucp_ep_flush_nbx(A.ep, &prm), WAIT_MS);
        progress_both(victim, 300); /* a software put lands on progress */
        landed = memcmp(target, A.local, 64) == 0;
        printf("(%s) put: %s, the bytes %s\n", what, ucs_status_string(st),
               landed ? "landed" : "did not land");
        ucp_rkey_destroy(rkey);
    } else {
        printf("(%s) no endpoint to the victim's worker: %s\n", what,
               ucs_status_string(st));
    }
    ucp_request_param_t cp = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                              .flags = UCP_EP_CLOSE_FLAG_FORCE};
    wait_req(victim, ucp_ep_close_nbx(A.ep, &cp), WAIT_MS);
    A.ep = NULL;
    return landed;
}

static bool has_shm(const char *res)
{
    static const char *const shm[] = {"posix/", "sysv/", "cma/", "knem/", "xpmem/"};
    for (size_t i = 0; i < KVD_ARRAY_SIZE(shm); i++)
        if (strstr(res, shm[i]) != NULL)
            return true;
    return false;
}

int main(void)
{
    kvd_ucx_quiet_strangers(); /* UCX warns of each dropped put, with a dump */
    const char *tls = getenv("UCX_TLS");
    printf("UCX_TLS %s\n", tls ? tls : "(unset)");
    kvd_transport_t *t = NULL;
    int rc = kvd_transport_open_ucx("victim-any", &t);
    if (rc != KVD_OK || attacker_init() != 0) {
        printf("skipping: UCX cannot start here (%s)\n", kvd_status_str(rc));
        kvd_transport_destroy(t);
        attacker_fini();
        return 77;
    }
    static uint8_t target[4096];
    char res[1024];

    /* (a) the control */
    kvd_transport_ucx_info(t, NULL, NULL, res, sizeof(res));
    printf("(a) kvd_transport_open_ucx opened %s\n", res);
    bool wired = false;
    CHECK(attack(t, target, "a", &wired),
          "(a) the control: a context with RMA over tcp should take a stranger's put "
          "(else this test shows nothing)");
    kvd_transport_destroy(t);

    /* (b) the message mode */
    t = NULL;
    rc = kvd_transport_open_ucx_mode("victim-am", KVD_UCX_MODE_AM, &t);
    CHECK(rc == KVD_OK, "(b) open in the message mode: %s", kvd_status_str(rc));
    if (rc == KVD_OK) {
        kvd_transport_ucx_info(t, NULL, NULL, res, sizeof(res));
        printf("(b) the message mode opened %s\n", res);
        CHECK(!has_shm(res), "(b) the message mode opened a shared-memory transport: %s",
              res);
        CHECK(strstr(res, "tcp/") != NULL, "(b) the message mode has no tcp: %s", res);
        CHECK(!attack(t, target, "b", &wired), "(b) a stranger's put landed in a "
                                               "message-mode worker's process");
        CHECK(wired, "(b) the attacker's endpoint did not wire up: the put never reached "
                     "the worker, so its refusal shows nothing");
        kvd_transport_destroy(t);
    }

    /* (c) the RMA mode */
    t = NULL;
    rc = kvd_transport_open_ucx_mode("victim-rma", KVD_UCX_MODE_RMA, &t);
    if (rc == KVD_OK) {
        kvd_transport_ucx_info(t, NULL, NULL, res, sizeof(res));
        printf("(c) the RMA mode opened %s\n", res);
        for (const char *at = res; *at;) {
            char tl[64];
            size_t n = strcspn(at, "/");
            kvd_strlcpy(tl, at, KVD_MIN(n + 1, sizeof(tl)));
            CHECK(kvd_ucx_tl_enforces_rma(tl), "(c) the RMA mode opened %s (%s)", tl,
                  res);
            at += strcspn(at, ",");
            at += *at == ',';
        }
        kvd_transport_destroy(t);
    } else {
        CHECK(rc == KVD_ERR_UNSUPPORTED,
              "(c) RMA with no enforcing transport: %s, want "
              "unsupported",
              kvd_status_str(rc));
        printf("(c) the RMA mode: %s (no transport here enforces the registration)\n",
               kvd_status_str(rc));
    }
    attacker_fini();
    if (failures)
        fprintf(stderr, "transport/ucx-worker-side: %d check(s) failed\n", failures);
    else
        printf("transport/ucx-worker-side: all checks passed\n");
    return failures ? 1 : 0;
}
