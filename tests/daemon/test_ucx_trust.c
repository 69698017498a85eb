/*
 * Description: what a stranger gets from the daemon's UCX server (issue
 * 11, hole 1). A real kvdockd with --listen 127.0.0.1:PORT, UCX_TLS=tcp
 * and --ucx-tcp (without it no UCX is served over TCP: ucx_tcp_optin);
 * the attacker is this program with a UCP context of its own (RMA and AM),
 * speaking the message mode's wire format from its own definitions below.
 *
 *   (a) one-sided RMA: a Hello over TCP with want_ucx gets the worker
 *       address and a capability but no rkey and no pool base; an rkey the
 *       attacker packs from its own memory (or the reply's, were there one)
 *       unpacked on an endpoint to the server, then ucp_get_nbx of the UCX
 *       server's ELF header and ucp_put_nbx into its pool mapping (both
 *       addresses read from /proc/PID/maps): the get brings no ELF magic,
 *       the put changes no pool byte, each within a bounded wait, and the
 *       UCX server and the daemon are alive after.
 *   (b) the message mode: a request with no capability (the old header,
 *       which had none), a wrong one, a revoked one (its connection
 *       closed), a write with a read-only grant (Hello read_only), and an
 *       out-of-range one (its grant is the pool): each answered with an
 *       error, no byte moved (the pool, mapped read-only through the Unix
 *       socket's Hello, compared before and after); the same requests with
 *       a live grant move their bytes, so the refusals are not the format.
 *   (c) the transport (the linker's path) round-trips over ucx-tcp in the
 *       message mode with the reply's address and capability, and refuses
 *       RMA without an rkey.
 *   (d) the UCX server listens (TCP) only on loopback addresses, with and
 *       without --listen 127.0.0.1:PORT, and logs the devices it serves.
 *   (e) a UCX server that dies takes its grants along: its successor
 *       refuses the old capability and serves the one a new Hello on the
 *       same connection gets.
 *   (g) a read-write grant writes only within its connection's live
 *       reservations: outside any, across one's end, into another
 *       connection's, after Publish, Revoke and the lease's TTL refused.
 *   (h) a writer cuts the pool file short while the daemon is stopped,
 *       and a get reads past the cut: the UCX server lives on, and serves
 *       zeros there once the daemon grew the file back (issue 14).
 *   (f) the UCX server runs inside its seccomp filter (one filter more
 *       than the daemon, NoNewPrivs), and without it with --no-ucx-sandbox;
 *       (a) to (e) ran inside it.
 *
 * Skips (77) when UCX cannot start here (the daemon says so). Every wait is
 * bounded; no timing is asserted.
 */
#include "dtest.h"
#include "kvd_transport.h"
#include "test_store_util.h"
#include "ucx_stranger.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#define TEST_NAME "daemon/ucx_trust"
#define WAIT_MS   3000 /* for an answer that should come */
#define SILENT_MS 1500 /* for one that should not */

/* ---- the message mode's wire format, as a client sees it */
#define AM_PUT    11
#define AM_GET    12
#define AM_ACK    13
#define AM_DATA   14
#define MAGIC_V1  0x6b764131u /* before capabilities: no credential at all */
#define MAGIC_V2  0x6b764132u
#define CAP_BYTES 16

typedef struct v1_req {
    uint32_t magic, n;
    uint64_t id;
    uint64_t offset, length;
} v1_req_t;

typedef struct v2_req {
    uint32_t magic, n;
    uint64_t id;
    uint8_t cap[CAP_BYTES];
    uint64_t offset, length;
} v2_req_t;

typedef struct am_rep {
    uint32_t magic;
    int32_t status;
    uint64_t id;
} am_rep_t;

/* ---- the attacker's UCX */
typedef struct attacker {
    ucp_context_h ctx;
    ucp_worker_h worker;
    ucp_ep_h ep;
    bool ep_failed;
    /* the last answer */
    bool answered;
    int32_t status;
    uint64_t id;
    size_t data_len;
    uint8_t data[8192];
} attacker_t;

static attacker_t A;

static ucs_status_t on_answer(void *arg, const void *header, size_t header_length,
                              void *data, size_t length, const ucp_am_recv_param_t *param)
{
    (void)arg;
    am_rep_t r;
    if (header_length != sizeof(r))
        return UCS_OK;
    memcpy(&r, header, sizeof(r));
    A.answered = true;
    A.status = r.status;
    A.id = r.id;
    A.data_len = length;
    /* only eager answers are expected (our reads are small) */
    if (!(param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) && length <= sizeof(A.data))
        memcpy(A.data, data, length);
    return UCS_OK;
}

static void ep_failed(void *arg, ucp_ep_h ep, ucs_status_t st)
{
    (void)arg;
    (void)ep;
    (void)st;
    A.ep_failed = true;
}

static int attacker_init(void)
{
    if (ucx_stranger_open(NULL, &A.ctx, &A.worker) != 0)
        return -1;
    for (unsigned id = AM_ACK; id <= AM_DATA; id++) {
        ucp_am_handler_param_t hp = {.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID |
                                                   UCP_AM_HANDLER_PARAM_FIELD_CB,
                                     .id = id,
                                     .cb = on_answer};
        if (ucp_worker_set_am_recv_handler(A.worker, &hp) != UCS_OK)
            return -1;
    }
    return 0;
}

static void progress_for(int ms, bool (*done)(void *), void *arg)
{
    uint64_t deadline = kvd_now_ns() + (uint64_t)ms * 1000000ull;
    while (kvd_now_ns() < deadline && !(done && done(arg)))
        if (ucp_worker_progress(A.worker) == 0)
            kvd_sleep_ns(100 * 1000);
}

static bool req_done(void *sp)
{
    return ucp_request_check_status(sp) != UCS_INPROGRESS;
}

static void ep_close(void)
{
    if (A.ep == NULL)
        return;
    ucp_request_param_t prm = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                               .flags = UCP_EP_CLOSE_FLAG_FORCE};
    ucs_status_ptr_t sp = ucp_ep_close_nbx(A.ep, &prm);
    if (UCS_PTR_IS_PTR(sp)) {
        progress_for(WAIT_MS, req_done, sp);
        ucp_request_free(sp);
    }
    A.ep = NULL;
}

static int ep_open(const void *addr)
{
    ep_close();
    A.ep_failed = false;
    ucp_ep_params_t ep = {.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                                        UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                                        UCP_EP_PARAM_FIELD_ERR_HANDLER,
                          .address = addr,
                          .err_mode = UCP_ERR_HANDLING_MODE_PEER,
                          .err_handler = {.cb = ep_failed}};
    if (ucp_ep_create(A.worker, &ep, &A.ep) != UCS_OK) {
        A.ep = NULL;
        return -1;
    }
    /* wired up before anything else (the server outlives a half-made
     * endpoint only from UCX 1.14 on) */
    ucp_request_param_t prm = {0};
    ucs_status_ptr_t sp = ucp_ep_flush_nbx(A.ep, &prm);
    if (UCS_PTR_IS_PTR(sp)) {
        progress_for(WAIT_MS, req_done, sp);
        ucs_status_t st = ucp_request_check_status(sp);
        if (st == UCS_INPROGRESS)
            ucp_request_cancel(A.worker, sp);
        progress_for(100, req_done, sp);
        ucp_request_free(sp);
        return st == UCS_OK ? 0 : -1;
    }
    return UCS_PTR_STATUS(sp) == UCS_OK ? 0 : -1;
}

static bool answered(void *arg)
{
    (void)arg;
    return A.answered;
}

/* Sends one request (header hdr of hdr_len, payload data of len), waits
 * for its answer; true when one came. */
static bool am_call(unsigned id, const void *hdr, size_t hdr_len, const void *data,
                    size_t len)
{
    A.answered = false;
    A.data_len = 0;
    A.status = 0;
    memset(A.data, 0, sizeof(A.data));
    ucp_request_param_t prm = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                               .flags = UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_EAGER};
    ucs_status_ptr_t sp = ucp_am_send_nbx(A.ep, id, hdr, hdr_len, data, len, &prm);
    if (UCS_PTR_IS_ERR(sp))
        return false;
    progress_for(WAIT_MS, answered, NULL);
    if (UCS_PTR_IS_PTR(sp)) {
        progress_for(WAIT_MS, req_done, sp);
        if (ucp_request_check_status(sp) == UCS_INPROGRESS)
            ucp_request_cancel(A.worker, sp);
        progress_for(100, req_done, sp);
        ucp_request_free(sp);
    }
    return A.answered;
}

static v2_req_t v2(const uint8_t *cap, uint64_t off, uint64_t len)
{
    static uint64_t id = 1000;
    v2_req_t r = {.magic = MAGIC_V2, .n = 1, .id = ++id, .offset = off, .length = len};
    memcpy(r.cap, cap, CAP_BYTES);
    return r;
}

/* ---- the daemon's side */

typedef struct grant {
    uint8_t addr[4096];
    size_t addr_len;
    size_t rkey_len;
    uint8_t rkey[4096];
    uint64_t base;
    uint8_t cap[KVD_UCX_TOKEN_MAX];
    size_t cap_len;
} grant_t;

/* Hello with want_ucx on c (read_only as asked); the UCX part of the reply. */
static int hello_ucx(kvd_client_t *c, bool read_only, grant_t *g)
{
    kvd_msg_t req, rep;
    kvd_msg_request(&req, 0, KVD_METHOD_HELLO);
    kvd_hello_req_t *h = &req.body.hello_req;
    kvd_strlcpy(h->client_name, "ucx-trust", sizeof(h->client_name));
    h->pid = (uint32_t)getpid();
    h->protocol_version = KVD_PROTOCOL_VERSION;
    h->want_ucx = true;
    h->read_only = read_only;
    int rc = kvd_client_call(c, &req, &rep, WAIT_MS);
    if (rc == KVD_OK)
        rc = rep.status;
    if (rc == KVD_OK) {
        const kvd_hello_rep_t *r = &rep.body.hello_rep;
        memset(g, 0, sizeof(*g));
        g->addr_len = KVD_MIN(r->ucx_address_len, sizeof(g->addr));
        memcpy(g->addr, r->ucx_address, g->addr_len);
        g->rkey_len = KVD_MIN(r->ucx_rkey_len, sizeof(g->rkey));
        if (g->rkey_len)
            memcpy(g->rkey, r->ucx_rkey, g->rkey_len);
        g->base = r->ucx_pool_base;
        g->cap_len = r->ucx_token_len;
        memcpy(g->cap, r->ucx_token, r->ucx_token_len);
    }
    kvd_msg_clear(&rep);
    return rc;
}

/* The pool, mapped read-only through a Unix-socket Hello (want_pool_fd). */
static const uint8_t *map_pool(const char *socket, kvd_client_t **keep)
{
    kvd_client_t *c = NULL;
    if (kvd_client_connect_unix(socket, WAIT_MS, &c) != KVD_OK)
        return NULL;
    kvd_msg_t req, rep;
    kvd_msg_request(&req, 0, KVD_METHOD_HELLO);
    req.body.hello_req.protocol_version = KVD_PROTOCOL_VERSION;
    req.body.hello_req.pid = (uint32_t)getpid();
    req.body.hello_req.want_pool_fd = true;
    kvd_strlcpy(req.body.hello_req.client_name, "ucx-trust-pool", KVD_NAME_MAX);
    int rc = kvd_client_call(c, &req, &rep, WAIT_MS);
    if (rc == KVD_OK)
        rc = rep.status;
    kvd_msg_clear(&rep);
    int fd = kvd_client_take_fd(c);
    void *m = MAP_FAILED;
    if (rc == KVD_OK && fd >= 0)
        m = mmap(NULL, DT_POOL_BYTES, PROT_READ, MAP_SHARED, fd, 0);
    if (fd >= 0)
        close(fd);
    *keep = c;
    return m == MAP_FAILED ? NULL : m;
}

/* From /proc/PID/maps: the start of the first mapping whose path contains
 * `what` (and whose permissions start with perm). */
static uint64_t map_start(pid_t pid, const char *what, const char *perm)
{
    char path[64], line[512];
    snprintf(path, sizeof(path), "/proc/%d/maps", (int)pid);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return 0;
    uint64_t at = 0;
    while (at == 0 && fgets(line, sizeof(line), f) != NULL) {
        unsigned long long lo, hi;
        char p[8];
        if (sscanf(line, "%llx-%llx %7s", &lo, &hi, p) == 3 && strstr(line, what) &&
            strncmp(p, perm, strlen(perm)) == 0)
            at = lo;
    }
    fclose(f);
    return at;
}

/* The TCP sockets pid listens on, each checked to be loopback; returns
 * how many it found (-1 when its fds cannot be read). */
static int check_listeners_loopback(pid_t pid)
{
    int on_lo = 0, found = dt_tcp_listeners(pid, &on_lo);
    DT_CHECK(found < 0 || on_lo == found,
             "the UCX server (pid %d) listens on %d TCP sockets, %d of them loopback",
             (int)pid, found, on_lo);
    return found;
}

/* ------------------------------------------------------------ the cases */

/* (a) */
static void case_rma(const kvd_test_daemon_t *d, const char *tcp_addr, pid_t child,
                     const uint8_t *pool)
{
    kvd_client_t *c = NULL;
    if (!DT_CHECK(kvd_client_connect_tcp(tcp_addr, WAIT_MS, &c) == KVD_OK,
                  "connect over TCP"))
        return;
    grant_t g;
    int rc = hello_ucx(c, false, &g);
    if (!DT_CHECK(rc == KVD_OK, "Hello want_ucx over TCP: %s", kvd_status_str(rc))) {
        kvd_client_close(c);
        return;
    }
    DT_CHECK(g.rkey_len == 0, "over TCP the reply offers an rkey (%zu bytes)",
             g.rkey_len);
    DT_CHECK(g.base == 0, "over TCP the reply gives the pool's address (0x%llx)",
             (unsigned long long)g.base);
    DT_CHECK(g.cap_len >= 16, "the reply's capability has %zu bytes", g.cap_len);

    uint64_t elf = map_start(child, "kvdockd", "r");
    /* the pool: its file (kvdock-NAME.pool), or a memfd with --no-persist */
    uint64_t pool_at = map_start(child, ".pool", "rw");
    if (pool_at == 0)
        pool_at = map_start(child, "memfd:kvdock", "rw");
    if (!DT_CHECK(elf != 0 && pool_at != 0,
                  "the UCX server's maps: ELF 0x%llx, pool 0x%llx",
                  (unsigned long long)elf, (unsigned long long)pool_at)) {
        kvd_client_close(c);
        return;
    }
    if (!DT_CHECK(ep_open(g.addr) == 0, "an endpoint to the UCX server")) {
        kvd_client_close(c);
        return;
    }
    /* the rkey: the reply's where it gives one, else one packed from the
     * attacker's own memory */
    static uint8_t local[4096];
    ucp_mem_h memh = NULL;
    void *packed = NULL;
    size_t packed_len = 0;
    ucp_mem_map_params_t mp = {.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS |
                                             UCP_MEM_MAP_PARAM_FIELD_LENGTH,
                               .address = local,
                               .length = sizeof(local)};
    DT_CHECK(ucp_mem_map(A.ctx, &mp, &memh) == UCS_OK, "ucp_mem_map of our own buffer");
    DT_CHECK(memh == NULL || ucp_rkey_pack(A.ctx, memh, &packed, &packed_len) == UCS_OK,
             "ucp_rkey_pack of our own buffer");
    ucp_rkey_h rkey = NULL;
    ucs_status_t st = ucp_ep_rkey_unpack(A.ep, g.rkey_len ? g.rkey : packed, &rkey);
    printf("rkey (%s) unpacked on the server's endpoint: %s\n",
           g.rkey_len ? "the reply's" : "forged", ucs_status_string(st));
    if (st == UCS_OK) {
        /* get the ELF header */
        memset(local, 0, sizeof(local));
        ucp_request_param_t prm = {.op_attr_mask = UCP_OP_ATTR_FIELD_MEMH, .memh = memh};
        ucs_status_ptr_t sp = ucp_get_nbx(A.ep, local, 64, elf, rkey, &prm);
        if (UCS_PTR_IS_PTR(sp)) {
            progress_for(SILENT_MS, req_done, sp);
            st = ucp_request_check_status(sp);
            printf("get of the UCX server's ELF header: %s\n",
                   st == UCS_INPROGRESS ? "no answer" : ucs_status_string(st));
            if (st == UCS_INPROGRESS)
                ucp_request_cancel(A.worker, sp);
            progress_for(100, req_done, sp);
            ucp_request_free(sp);
        } else {
            printf("get of the UCX server's ELF header: %s\n",
                   ucs_status_string(UCS_PTR_STATUS(sp)));
        }
        DT_CHECK(memcmp(local, "\177ELF", 4) != 0,
                 "ucp_get_nbx read the UCX server's ELF header");
        /* put into its pool mapping, where we can see it */
        memset(local, 0xee, 64);
        sp = ucp_put_nbx(A.ep, local, 64, pool_at + 4096, rkey, &prm);
        if (UCS_PTR_IS_PTR(sp)) {
            progress_for(SILENT_MS, req_done, sp);
            if (ucp_request_check_status(sp) == UCS_INPROGRESS)
                ucp_request_cancel(A.worker, sp);
            progress_for(100, req_done, sp);
            ucp_request_free(sp);
        }
        ucp_request_param_t fp = {0};
        sp = ucp_ep_flush_nbx(A.ep, &fp);
        if (UCS_PTR_IS_PTR(sp)) {
            progress_for(SILENT_MS, req_done, sp);
            if (ucp_request_check_status(sp) == UCS_INPROGRESS)
                ucp_request_cancel(A.worker, sp);
            progress_for(100, req_done, sp);
            ucp_request_free(sp);
        }
        bool written = true;
        for (int i = 0; i < 64; i++)
            written &= pool[4096 + i] == 0xee;
        DT_CHECK(!written, "ucp_put_nbx wrote into the UCX server's pool mapping");
        /* a peer that keeps trying does not fill the daemon's log: UCX's
         * warning of each dropped message is let through a few times */
        for (int i = 0; i < 30; i++) {
            sp = ucp_put_nbx(A.ep, local, 64, pool_at + 8192, rkey, &prm);
            if (UCS_PTR_IS_PTR(sp)) {
                progress_for(50, req_done, sp);
                if (ucp_request_check_status(sp) == UCS_INPROGRESS)
                    ucp_request_cancel(A.worker, sp);
                progress_for(100, req_done, sp);
                ucp_request_free(sp);
            }
        }
        progress_for(500, NULL, NULL);
        char *log = dt_read_file(d->log);
        int warned = 0;
        for (const char *at = log; at && (at = strstr(at, "no handler installed")); at++)
            warned++;
        printf("UCX's warnings of dropped messages in the log: %d\n", warned);
        DT_CHECK(warned < 10, "%d UCX warnings of dropped messages in the log", warned);
        free(log);
        ucp_rkey_destroy(rkey);
    }
    ep_close();
    if (packed)
        ucp_rkey_buffer_release(packed);
    if (memh)
        ucp_mem_unmap(A.ctx, memh);
    kvd_client_close(c);
    DT_CHECK(kill(child, 0) == 0 && dt_child_of(d->pid) == child,
             "the UCX server (pid %d) did not survive the attempt", (int)child);
    DT_CHECK(dt_health_fresh(d->socket, NULL) == KVD_HEALTH_READY,
             "the daemon is not ready after the attempt");
}

/* One request that must be refused: answered with an error, nothing back,
 * the pool unchanged. */
static void expect_refused(const char *what, unsigned id, const void *hdr, size_t hdr_len,
                           const void *data, size_t len, const uint8_t *pool,
                           const uint8_t *before)
{
    bool got = am_call(id, hdr, hdr_len, data, len);
    printf("%s: %s (status %d, %zu bytes back)\n", what, got ? "answered" : "no answer",
           A.status, A.data_len);
    DT_CHECK(!got || A.status != KVD_OK, "%s: served", what);
    DT_CHECK(A.data_len == 0, "%s: %zu bytes came back", what, A.data_len);
    DT_CHECK(memcmp(pool, before, DT_POOL_BYTES) == 0, "%s: pool bytes changed", what);
}

/* (b) */
static void case_messages(const kvd_test_daemon_t *d, const char *tcp_addr,
                          const uint8_t *pool)
{
    uint8_t *before = malloc(DT_POOL_BYTES);
    static uint8_t payload[4096];
    memset(payload, 0xab, sizeof(payload));
    kvd_client_t *live = NULL, *doomed = NULL, *ro = NULL;
    grant_t gl, gd, gr;
    if (!DT_CHECK(before != NULL &&
                      kvd_client_connect_tcp(tcp_addr, WAIT_MS, &live) == KVD_OK &&
                      hello_ucx(live, false, &gl) == KVD_OK &&
                      kvd_client_connect_tcp(tcp_addr, WAIT_MS, &doomed) == KVD_OK &&
                      hello_ucx(doomed, false, &gd) == KVD_OK &&
                      kvd_client_connect_unix(d->socket, WAIT_MS, &ro) == KVD_OK &&
                      hello_ucx(ro, true, &gr) == KVD_OK,
                  "three Hellos with want_ucx"))
        goto out;
    if (!DT_CHECK(ep_open(gl.addr) == 0, "an endpoint to the UCX server"))
        goto out;
    memcpy(before, pool, DT_POOL_BYTES);

    /* no capability: the header of before, which had none */
    v1_req_t v1 = {.magic = MAGIC_V1, .n = 1, .id = 1, .offset = 8192, .length = 4096};
    expect_refused("PUT without a capability", AM_PUT, &v1, sizeof(v1), payload, 4096,
                   pool, before);
    v1.offset = 0;
    v1.length = 64;
    expect_refused("GET without a capability", AM_GET, &v1, sizeof(v1), NULL, 0, pool,
                   before);
    /* a wrong one */
    uint8_t wrong[CAP_BYTES];
    getrandom(wrong, sizeof(wrong), 0);
    v2_req_t r = v2(wrong, 8192, 4096);
    expect_refused("PUT with a wrong capability", AM_PUT, &r, sizeof(r), payload, 4096,
                   pool, before);
    r = v2(wrong, 0, 64);
    expect_refused("GET with a wrong capability", AM_GET, &r, sizeof(r), NULL, 0, pool,
                   before);
    /* the live one: served (the format is right) */
    r = v2(gd.cap, 0, 64);
    DT_CHECK(am_call(AM_GET, &r, sizeof(r), NULL, 0) && A.status == KVD_OK &&
                 A.data_len == 64 && memcmp(A.data, pool, 64) == 0,
             "GET with a live capability: answered %d, status %d, %zu bytes", A.answered,
             A.status, A.data_len);
    /* revoked: its connection closes; the daemon revokes it on its way
     * out, which this waits for (bounded) */
    kvd_client_close(doomed);
    doomed = NULL;
    bool refused = false;
    for (int i = 0; i < 50 && !refused; i++) {
        r = v2(gd.cap, 0, 64);
        refused = am_call(AM_GET, &r, sizeof(r), NULL, 0) && A.status != KVD_OK;
        if (!refused)
            kvd_sleep_ns(100 * 1000000ull);
    }
    DT_CHECK(refused, "a capability still served after its connection closed");
    r = v2(gd.cap, 8192, 4096);
    expect_refused("PUT with a revoked capability", AM_PUT, &r, sizeof(r), payload, 4096,
                   pool, before);
    /* read-only: reads served, writes refused */
    r = v2(gr.cap, 0, 64);
    DT_CHECK(am_call(AM_GET, &r, sizeof(r), NULL, 0) && A.status == KVD_OK &&
                 A.data_len == 64,
             "GET with a read-only grant: status %d, %zu bytes", A.status, A.data_len);
    r = v2(gr.cap, 8192, 4096);
    expect_refused("PUT with a read-only grant", AM_PUT, &r, sizeof(r), payload, 4096,
                   pool, before);
    /* out of range, with a live read-write grant */
    r = v2(gl.cap, DT_POOL_BYTES - 10, 20);
    expect_refused("GET across the pool's end", AM_GET, &r, sizeof(r), NULL, 0, pool,
                   before);
    r = v2(gl.cap, DT_POOL_BYTES, 4096);
    expect_refused("PUT past the pool's end", AM_PUT, &r, sizeof(r), payload, 4096, pool,
                   before);
    r = v2(gl.cap, UINT64_MAX - 100, 4096);
    expect_refused("PUT at a wrapping offset", AM_PUT, &r, sizeof(r), payload, 4096, pool,
                   before);
    /* a live read-write grant writes only where its connection reserved
     * (case_windows): nothing is reserved here */
    r = v2(gl.cap, 8192, 4096);
    expect_refused("PUT with a live grant, nothing reserved", AM_PUT, &r, sizeof(r),
                   payload, 4096, pool, before);
    DT_CHECK(!A.ep_failed, "the UCX server's endpoint failed");
    DT_CHECK(kvd_test_file_contains(d->log, "refused a UCX request"),
             "the daemon's log does not mention the refusals");
out:
    ep_close();
    kvd_client_close(live);
    kvd_client_close(doomed);
    kvd_client_close(ro);
    free(before);
}

/* Registers `name` (objects of object_bytes) and reserves n objects of a
 * chain starting at token `first`: their offsets, and the lease (0 on
 * failure, recorded). */
static uint64_t reserve(kvd_client_t *c, const char *name, uint64_t object_bytes,
                        uint32_t first, size_t n, uint64_t *offsets)
{
    kvd_ns_spec_t spec = ts_spec(name, object_bytes);
    uint32_t ns = 0;
    kvd_key_t keys[8];
    kvd_put_item_t items[8];
    uint8_t results[8];
    uint64_t lease = 0;
    ts_err_t err;
    if (n > 8 || ts_register(c, &spec, 1, &ns, &err) != KVD_OK ||
        ts_make_keys(first, n, 16, keys) != 0)
        return 0;
    ts_chain_items(keys, n, NULL, 0, items);
    int rc = ts_reserve(c, ns, object_bytes, items, n, &lease, results, offsets, &err);
    bool all = rc == KVD_OK;
    for (size_t i = 0; all && i < n; i++)
        all = results[i] == KVD_RESERVE_ALLOCATED;
    DT_CHECK(all && lease != 0, "Reserve of %zu objects in %s: %s", n, name,
             kvd_status_str(rc));
    return all ? lease : 0;
}

/* A PUT of 4096 bytes of `fill` at offset with cap: its status (1 no
 * answer). */
static int put_at(const uint8_t *cap, uint64_t offset, uint8_t fill)
{
    static uint8_t payload[4096];
    memset(payload, fill, sizeof(payload));
    v2_req_t r = v2(cap, offset, sizeof(payload));
    return am_call(AM_PUT, &r, sizeof(r), payload, sizeof(payload)) ? A.status : 1;
}

static bool filled(const uint8_t *pool, uint64_t offset, uint8_t fill)
{
    for (size_t i = 0; i < 4096; i++)
        if (pool[offset + i] != fill)
            return false;
    return true;
}

/* A PUT that must be refused: an error, and the pool unchanged. */
static void put_refused(const char *what, const uint8_t *cap, uint64_t offset,
                        const uint8_t *pool, uint8_t *before)
{
    memcpy(before, pool, DT_POOL_BYTES);
    int st = put_at(cap, offset, 0x5a);
    printf("%s: status %d\n", what, st);
    DT_CHECK(st != KVD_OK, "%s: served", what);
    DT_CHECK(memcmp(pool, before, DT_POOL_BYTES) == 0, "%s: pool bytes changed", what);
}

/* (g) a read-write grant writes only within the extents its connection
 * holds reserved, and only while it holds them (the UCX writers' windows,
 * daemon/ucxd.h): inside a live reservation served; outside any, across a
 * reservation's end, into another connection's reservation, after
 * Publish, after Revoke and after the lease's TTL (--lease-ttl 5000)
 * refused, moving no byte. */
static void case_windows(const char *tcp_addr, const uint8_t *pool)
{
    uint8_t *before = malloc(DT_POOL_BYTES);
    kvd_client_t *c = NULL, *other = NULL;
    grant_t g, go;
    if (!DT_CHECK(before != NULL &&
                      kvd_client_connect_tcp(tcp_addr, WAIT_MS, &c) == KVD_OK &&
                      hello_ucx(c, false, &g) == KVD_OK &&
                      kvd_client_connect_tcp(tcp_addr, WAIT_MS, &other) == KVD_OK &&
                      hello_ucx(other, false, &go) == KVD_OK,
                  "two Hellos with want_ucx"))
        goto out;
    if (!DT_CHECK(ep_open(g.addr) == 0, "an endpoint to the UCX server"))
        goto out;
    uint64_t off[4], off2[1], off3[1];
    uint64_t lease = reserve(c, "ucx-trust/win", 4096, 100, 4, off);
    if (lease == 0)
        goto out;
    uint64_t top = 0; /* the highest of the reserved extents */
    for (int i = 0; i < 4; i++) {
        DT_CHECK(put_at(g.cap, off[i], (uint8_t)(0x10 + i)) == KVD_OK,
                 "PUT into reserved extent %d (offset %llu): status %d", i,
                 (unsigned long long)off[i], A.status);
        DT_CHECK(filled(pool, off[i], (uint8_t)(0x10 + i)),
                 "PUT into reserved extent %d: the bytes are not in the pool", i);
        top = KVD_MAX(top, off[i]);
    }
    /* outside: the pool's last page (the allocator hands out the lowest
     * free extents first, and four small ones are far from it) */
    uint64_t outside = DT_POOL_BYTES - 4096;
    for (int i = 0; i < 4; i++)
        DT_CHECK(off[i] != outside, "a reservation at the pool's end");
    put_refused("PUT outside any reservation", g.cap, outside, pool, before);
    put_refused("PUT across the end of a reservation", g.cap, top + 2048, pool, before);
    put_refused("PUT of another connection into this one's reservation", go.cap, off[0],
                pool, before);
    ts_err_t err;
    DT_CHECK(ts_publish(c, lease, NULL, 0, &err) == KVD_OK, "Publish: %s", err.text);
    put_refused("PUT into a published object", g.cap, off[1], pool, before);
    uint64_t lease2 = reserve(c, "ucx-trust/win", 4096, 200, 1, off2);
    if (lease2 != 0) {
        DT_CHECK(put_at(g.cap, off2[0], 0x21) == KVD_OK, "PUT into a second reservation");
        DT_CHECK(ts_finish(c, KVD_METHOD_REVOKE, lease2, NULL, 0, &err) == KVD_OK,
                 "Revoke: %s", err.text);
        put_refused("PUT into a revoked reservation", g.cap, off2[0], pool, before);
    }
    uint64_t lease3 = reserve(c, "ucx-trust/win", 4096, 300, 1, off3);
    if (lease3 != 0) {
        DT_CHECK(put_at(g.cap, off3[0], 0x31) == KVD_OK, "PUT into a third reservation");
        /* its TTL (5 s: long enough for the checks above under TSan on a
         * busy machine, seen past 1.5 s) passes: the daemon's tick ends it */
        int st = KVD_OK;
        for (int i = 0; i < 300 && st == KVD_OK; i++) {
            kvd_sleep_ns(100 * 1000000ull);
            st = put_at(g.cap, off3[0], 0x31);
        }
        DT_CHECK(st != KVD_OK,
                 "PUTs into a reservation still served 30 s after it was made");
        put_refused("PUT into an expired reservation", g.cap, off3[0], pool, before);
    }
    DT_CHECK(!A.ep_failed, "the UCX server's endpoint failed");
out:
    ep_close();
    kvd_client_close(c);
    kvd_client_close(other);
    free(before);
}

/* (c) */
static void case_transport(const char *tcp_addr, const uint8_t *pool)
{
    kvd_client_t *c = NULL;
    grant_t g;
    uint64_t at = 0;
    if (!DT_CHECK(kvd_client_connect_tcp(tcp_addr, WAIT_MS, &c) == KVD_OK &&
                      hello_ucx(c, false, &g) == KVD_OK,
                  "Hello with want_ucx"))
        goto out;
    /* where it writes: a reservation of its own (case_windows) */
    if (reserve(c, "ucx-trust/transport", 65536, 400, 1, &at) == 0)
        goto out;
    kvd_transport_t *t = NULL;
    static uint8_t buf[2][65536];
    for (size_t i = 0; i < sizeof(buf[0]); i++)
        buf[0][i] = (uint8_t)(i * 7 + 3);
    kvd_region_t *r0 = NULL, *r1 = NULL;
    if (!DT_CHECK(kvd_transport_open_ucx("ucx-trust", &t) == KVD_OK &&
                      kvd_transport_register(t, buf[0], sizeof(buf[0]),
                                             kvd_memkind_host(), &r0) == KVD_OK &&
                      kvd_transport_register(t, buf[1], sizeof(buf[1]),
                                             kvd_memkind_host(), &r1) == KVD_OK,
                  "a ucx transport"))
        goto out_t;
    kvd_peer_t p = {.length = DT_POOL_BYTES, .connect_timeout_ms = WAIT_MS};
    p.ucx.address = g.addr;
    p.ucx.address_len = g.addr_len;
    p.ucx.mode = KVD_UCX_MODE_RMA;
    DT_CHECK(kvd_transport_connect(t, &p) == KVD_ERR_INVALID,
             "RMA without an rkey is refused at connect");
    p.ucx.mode = KVD_UCX_MODE_AM;
    p.ucx.cap = g.cap;
    p.ucx.cap_len = g.cap_len;
    int rc = kvd_transport_connect(t, &p);
    if (!DT_CHECK(rc == KVD_OK, "connect in the message mode: %s", kvd_status_str(rc)))
        goto out_t;
    kvd_xfer_t w = {.local = r0, .remote_offset = at, .length = sizeof(buf[0])};
    kvd_xfer_t rd = {.local = r1, .remote_offset = at, .length = sizeof(buf[1])};
    rc = kvd_transport_post(t, KVD_XFER_WRITE, &w, 1, 1);
    if (rc == KVD_OK)
        rc = kvd_transport_wait(t, 1, WAIT_MS, NULL, NULL, 0);
    DT_CHECK(rc == KVD_OK, "a WRITE over ucx-tcp: %s", kvd_status_str(rc));
    DT_CHECK(memcmp(pool + at, buf[0], sizeof(buf[0])) == 0,
             "the WRITE's bytes are not in the pool");
    rc = kvd_transport_post(t, KVD_XFER_READ, &rd, 1, 2);
    if (rc == KVD_OK)
        rc = kvd_transport_wait(t, 2, WAIT_MS, NULL, NULL, 0);
    DT_CHECK(rc == KVD_OK && memcmp(buf[1], buf[0], sizeof(buf[0])) == 0,
             "a READ over ucx-tcp: %s, bytes %s", kvd_status_str(rc),
             memcmp(buf[1], buf[0], sizeof(buf[0])) == 0 ? "equal" : "differ");
out_t:
    kvd_transport_destroy(t);
out:
    kvd_client_close(c);
}

static bool lost_range_counted(const ts_stats_t *st)
{
    return st->store.pool_lost_ranges > 0;
}

/* A writer cuts the pool file short while the daemon cannot grow it back
 * (stopped), and a peer gets bytes past the cut: the UCX server lives on
 * (issue 14). Where UCX copies them in user space its guard grows the file
 * back and the zeros there are sent; where the kernel reads them (a
 * zero-copy send) that send fails and the peer's endpoint with it. The
 * daemon, let go on, counts the lost range, and the same UCX server then
 * answers a get there on a new endpoint with zeros. */
static void case_cut(const kvd_test_daemon_t *d, const char *tcp_addr, pid_t child)
{
    char path[200];
    snprintf(path, sizeof(path), "%s/kvdock-test-%d.pool", d->dir, (int)getpid());
    int fd = open(path, O_RDWR | O_CLOEXEC);
    kvd_client_t *c = NULL;
    grant_t g;
    if (!DT_CHECK(fd >= 0, "open %s: %s", path, strerror(errno)) ||
        !DT_CHECK(kvd_client_connect_tcp(tcp_addr, WAIT_MS, &c) == KVD_OK &&
                      hello_ucx(c, false, &g) == KVD_OK,
                  "Hello with want_ucx") ||
        !DT_CHECK(ep_open(g.addr) == 0, "an endpoint to the UCX server"))
        goto out;
    bool stopped = kill(d->pid, SIGSTOP) == 0;
    DT_CHECK(stopped, "SIGSTOP the daemon: %s", strerror(errno));
    DT_CHECK(ftruncate(fd, DT_POOL_BYTES / 2) == 0, "ftruncate: %s", strerror(errno));
    v2_req_t r = v2(g.cap, DT_POOL_BYTES - 4096, 64);
    bool got = am_call(AM_GET, &r, sizeof(r), NULL, 0);
    struct stat st;
    printf("a get past the cut, the daemon stopped: %s; the pool file %lld bytes after\n",
           got ? (A.status == KVD_OK ? "answered" : "refused") : "no answer",
           fstat(fd, &st) == 0 ? (long long)st.st_size : -1ll);
    if (stopped)
        kill(d->pid, SIGCONT);
    ts_stats_t stats;
    DT_CHECK(ts_wait_stats(d->socket, 10000, lost_range_counted, &stats),
             "the daemon did not count the lost range");
    DT_CHECK(fstat(fd, &st) == 0 && (uint64_t)st.st_size == DT_POOL_BYTES,
             "the pool file is %lld bytes, not grown back", (long long)st.st_size);
    DT_CHECK(kill(child, 0) == 0 && dt_child_of(d->pid) == child,
             "the UCX server died of the cut");
    ep_close();
    if (!DT_CHECK(ep_open(g.addr) == 0, "a new endpoint to the UCX server"))
        goto out;
    got = am_call(AM_GET, &r, sizeof(r), NULL, 0);
    bool zeros = got && A.status == KVD_OK && A.data_len == 64;
    for (size_t i = 0; zeros && i < 64; i++)
        zeros = A.data[i] == 0;
    DT_CHECK(zeros, "a get past the cut, grown back: answered %d, status %d, %zu bytes",
             got, A.status, A.data_len);
out:
    ep_close();
    kvd_client_close(c);
    if (fd >= 0)
        close(fd);
}

/* A UCX server that dies takes its grants along: the next one refuses the
 * old capability, and a new Hello on the same connection (what a linker
 * does when its endpoint fails) gets one it serves. */
static void case_restart(const kvd_test_daemon_t *d, const char *tcp_addr, pid_t child)
{
    kvd_client_t *c = NULL;
    grant_t g1, g2;
    if (!DT_CHECK(kvd_client_connect_tcp(tcp_addr, WAIT_MS, &c) == KVD_OK &&
                      hello_ucx(c, false, &g1) == KVD_OK,
                  "Hello with want_ucx"))
        goto out;
    kill(child, SIGKILL);
    int rc = KVD_ERR_BUSY;
    pid_t next = -1;
    for (int i = 0; i < 100 && (rc != KVD_OK || next <= 0 || next == child); i++) {
        kvd_sleep_ns(100 * 1000000ull);
        next = dt_child_of(d->pid);
        rc = next > 0 && next != child ? hello_ucx(c, false, &g2) : KVD_ERR_BUSY;
    }
    if (!DT_CHECK(rc == KVD_OK, "Hello again after the UCX server's restart: %s",
                  kvd_status_str(rc)))
        goto out;
    DT_CHECK(memcmp(g1.cap, g2.cap, CAP_BYTES) != 0, "the same capability again");
    if (!DT_CHECK(ep_open(g2.addr) == 0, "an endpoint to the new UCX server"))
        goto out;
    v2_req_t r = v2(g1.cap, 0, 64);
    bool got = am_call(AM_GET, &r, sizeof(r), NULL, 0);
    DT_CHECK(got && A.status != KVD_OK && A.data_len == 0,
             "the new UCX server serves the old capability (answered %d, status %d)", got,
             A.status);
    r = v2(g2.cap, 0, 64);
    DT_CHECK(am_call(AM_GET, &r, sizeof(r), NULL, 0) && A.status == KVD_OK &&
                 A.data_len == 64,
             "the new capability is not served: status %d", A.status);
out:
    ep_close();
    kvd_client_close(c);
}

/* The value of field `name` of /proc/PID/status, or -1. */
static long proc_status(pid_t pid, const char *name)
{
    char path[64], *text;
    snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    if ((text = dt_read_file(path)) == NULL)
        return -1;
    long v = -1;
    size_t n = strlen(name);
    for (const char *l = text; l != NULL && *l;
         l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL)
        if (strncmp(l, name, n) == 0 && l[n] == ':')
            v = strtol(l + n + 1, NULL, 10);
    free(text);
    return v;
}

/* (f) the UCX server runs inside its seccomp filter (daemon/sandbox.h;
 * what the filter refuses is tests/daemon/test_sandbox.c): one filter more
 * than the daemon that started it and no new privileges; with
 * --no-ucx-sandbox, the daemon's own filters only (those of whatever runs
 * the test, a container's). */
static void case_sandbox(const kvd_test_daemon_t *d, bool want)
{
    pid_t child = dt_child_of(d->pid);
    long mine = proc_status(d->pid, "Seccomp_filters");
    long its = child > 0 ? proc_status(child, "Seccomp_filters") : -1;
    printf("the UCX server (pid %d) has %ld seccomp filters, the daemon %ld\n",
           (int)child, its, mine);
    if (!DT_CHECK(child > 0, "no UCX server found"))
        return;
    if (mine < 0) {
        /* a kernel before 5.9 does not count them: the mode says it all
         * where the daemon has none */
        DT_CHECK(proc_status(child, "Seccomp") ==
                     (want ? 2 : proc_status(d->pid, "Seccomp")),
                 "the UCX server's seccomp mode is %ld", proc_status(child, "Seccomp"));
    } else {
        DT_CHECK(its == mine + (want ? 1 : 0),
                 "the UCX server has %ld filters, the daemon %ld", its, mine);
    }
    if (want) {
        DT_CHECK(proc_status(child, "Seccomp") == 2,
                 "the UCX server's seccomp mode is %ld", proc_status(child, "Seccomp"));
        DT_CHECK(proc_status(child, "NoNewPrivs") == 1,
                 "the UCX server may gain privileges");
        DT_CHECK(!kvd_test_file_contains(d->log, "without its seccomp filter"),
                 "the daemon's log says the UCX server runs without its filter");
    }
}

/* (d), for a daemon started with `extra`. */
static void case_listen(const kvd_test_daemon_t *d, const char *how)
{
    pid_t child = dt_child_of(d->pid);
    int n = child > 0 ? check_listeners_loopback(child) : -1;
    printf("%s: the UCX server (pid %d) listens on %d TCP sockets\n", how, (int)child, n);
    DT_CHECK(n > 0, "%s: no TCP listener of the UCX server found", how);
    DT_CHECK(kvd_test_file_contains(d->log, "UCX server serves on tcp/lo"),
             "%s: the log does not say the UCX server serves tcp/lo", how);
    char *log = dt_read_file(d->log);
    const char *line = log ? strstr(log, "UCX server serves on") : NULL;
    if (line != NULL) {
        const char *eol = strchr(line, '\n');
        size_t len = eol ? (size_t)(eol - line) : strlen(line);
        char copy[1024];
        kvd_strlcpy(copy, line, KVD_MIN(len + 1, sizeof(copy)));
        /* every tcp device it names is lo */
        for (const char *t = strstr(copy, "tcp/"); t; t = strstr(t + 4, "tcp/"))
            DT_CHECK(strncmp(t, "tcp/lo", 6) == 0 && !(t[6] >= 'a' && t[6] <= 'z'),
                     "%s: the UCX server serves %.20s", how, t);
    }
    free(log);
}

int main(void)
{
    setenv("UCX_TLS", "tcp", 0);
    char port[16], listen[32];
    snprintf(port, sizeof(port), "%d", dt_free_port());
    snprintf(listen, sizeof(listen), "127.0.0.1:%s", port);
    kvd_test_daemon_t d = {0};
    /* UCX over TCP is served only when asked for (test_ucx_tcp_optin.c) */
    /* a client that has passed the RPC's authentication (here: none asked,
     * --insecure-no-auth) still reaches nothing beyond its UCX grant */
    if (dt_start(&d,
                 (const char *[]){"--listen", listen, "--ucx-tcp", "--insecure-no-auth",
                                  "--lease-ttl", "5000", NULL}) != 0)
        return dt_exit_status(TEST_NAME);
    if (!kvd_test_file_contains(d.log, "UCX server pid")) {
        printf("SKIP: UCX cannot start here (UCX_TLS=%s): see the daemon's log\n",
               getenv("UCX_TLS"));
        dt_stop(&d, SIGTERM, 10000);
        return KVD_TEST_SKIP;
    }
    if (attacker_init() != 0) {
        printf("SKIP: this process's UCX cannot start (UCX_TLS=%s)\n", getenv("UCX_TLS"));
        dt_stop(&d, SIGTERM, 10000);
        return KVD_TEST_SKIP;
    }
    pid_t child = dt_child_of(d.pid);
    kvd_client_t *pool_conn = NULL;
    const uint8_t *pool = map_pool(d.socket, &pool_conn);
    if (DT_CHECK(child > 0 && pool != NULL, "the UCX server's pid %d, the pool mapped %s",
                 (int)child, pool ? "yes" : "no")) {
        case_listen(&d, "--listen 127.0.0.1");
        case_sandbox(&d, true);
        case_rma(&d, listen, child, pool);
        case_messages(&d, listen, pool);
        case_transport(listen, pool);
        case_windows(listen, pool);
        case_cut(&d, listen, child);
        DT_CHECK(dt_child_of(d.pid) == child, "the UCX server was restarted");
        case_restart(&d, listen, child);
    }
    if (pool != NULL)
        munmap((void *)pool, DT_POOL_BYTES);
    kvd_client_close(pool_conn);
    dt_stop(&d, SIGTERM, 10000);

    /* without --listen: loopback only as well; and the filter left out */
    kvd_test_daemon_t d2 = {0};
    if (dt_start(&d2, (const char *[]){"--ucx-tcp", "--no-ucx-sandbox", NULL}) == 0) {
        case_listen(&d2, "no --listen");
        case_sandbox(&d2, false);
        dt_stop(&d2, SIGTERM, 10000);
    }
    ucp_worker_destroy(A.worker);
    ucp_cleanup(A.ctx);
    return dt_exit_status(TEST_NAME);
}
