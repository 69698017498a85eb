/*
 * ucx.c - the UCX backend: UCP RMA get/put on a peer's mapped region
 * (DESIGN.md section 7). The initiator moves every byte; on RDMA
 * transports the peer's CPU never sees them, on TCP the peer's worker
 * serves them from its progress (the daemon drives it from its epoll).
 *
 * A batch counts its outstanding requests (plus one while it is being
 * posted); each request's callback takes one off and the last one reports
 * the batch. A WRITE batch ends with an endpoint flush: put callbacks only
 * say the local buffer is free again, the flush says the bytes are at the
 * peer.
 */
#include "transport_int.h"

#include <stdlib.h>
#include <string.h>
#include <ucp/api/ucp.h>

struct kvd_ucx {
    ucp_context_h ctx;
    ucp_worker_h worker;
    ucp_address_t *addr;
    size_t addr_len;
    int efd;
};

struct kvd_ucx_mem {
    kvd_ucx_t *u;
    ucp_mem_h memh;
    void *rkey;
    size_t rkey_len;
    uint64_t base, len;
};

typedef struct ucx_local {
    uint64_t base, len;
    ucp_mem_h memh;
} ucx_local_t;

typedef struct ucx_transport {
    kvd_transport_t base;
    kvd_ucx_t *u;
    ucp_ep_h ep;
    ucp_rkey_h rkey;
    uint64_t remote_base, remote_length;
    ucs_status_t failed; /* the endpoint's error; UCS_OK while fine */
    size_t outstanding;  /* batches not reported yet */
    ucx_local_t *locals; /* sorted by base */
    size_t n_locals;
    kvd_done_ring_t done;
} ucx_transport_t;

typedef struct ucx_batch {
    ucx_transport_t *t;
    uint64_t cookie;
    int status;
    size_t pending;
} ucx_batch_t;

static int status_from_ucs(ucs_status_t st)
{
    switch (st) {
    case UCS_OK: return KVD_OK;
    case UCS_ERR_NO_MEMORY: return KVD_ERR_NOMEM;
    case UCS_ERR_CANCELED:
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_ENDPOINT_TIMEOUT:
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_NOT_CONNECTED: return KVD_ERR_CLOSED;
    case UCS_ERR_TIMED_OUT: return KVD_ERR_TIMEOUT;
    default: return KVD_ERR_IO;
    }
}

/* ------------------------------------------------------------- context */

int kvd_ucx_create(const char *name, bool wakeup, kvd_ucx_t **out)
{
    kvd_ucx_t *u = calloc(1, sizeof(*u));
    if (u == NULL)
        return KVD_ERR_NOMEM;
    u->efd = -1;
    ucp_config_t *cfg = NULL;
    ucs_status_t st = ucp_config_read(NULL, NULL, &cfg);
    if (st == UCS_OK) {
        ucp_params_t p = {
            .field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME,
            .features = UCP_FEATURE_RMA | (wakeup ? UCP_FEATURE_WAKEUP : 0),
            .name = name,
        };
        st = ucp_init(&p, cfg, &u->ctx);
        ucp_config_release(cfg);
    }
    if (st == UCS_OK) {
        /* the caller serialises: the linker's transfer thread and a
         * reconnecting engine thread never drive it at once */
        ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                                  .thread_mode = UCS_THREAD_MODE_SERIALIZED};
        st = ucp_worker_create(u->ctx, &wp, &u->worker);
    }
    if (st == UCS_OK)
        st = ucp_worker_get_address(u->worker, &u->addr, &u->addr_len);
    if (st == UCS_OK && wakeup)
        st = ucp_worker_get_efd(u->worker, &u->efd);
    if (st == UCS_OK && wakeup) {
        kvd_ucx_drive(u); /* armed before anyone waits on the fd */
    }
    if (st != UCS_OK) {
        KVD_WARN("ucx", "UCX did not start: %s", ucs_status_string(st));
        kvd_ucx_destroy(u);
        return KVD_ERR_UNAVAILABLE;
    }
    *out = u;
    return KVD_OK;
}

void kvd_ucx_destroy(kvd_ucx_t *u)
{
    if (u == NULL)
        return;
    if (u->addr != NULL)
        ucp_worker_release_address(u->worker, u->addr);
    if (u->worker != NULL)
        ucp_worker_destroy(u->worker);
    if (u->ctx != NULL)
        ucp_cleanup(u->ctx);
    free(u);
}

void kvd_ucx_address(const kvd_ucx_t *u, const void **addr, size_t *len)
{
    *addr = u->addr;
    *len = u->addr_len;
}

int kvd_ucx_efd(const kvd_ucx_t *u)
{
    return u->efd;
}

unsigned kvd_ucx_progress(kvd_ucx_t *u)
{
    return ucp_worker_progress(u->worker);
}

void kvd_ucx_drive(kvd_ucx_t *u)
{
    for (;;) {
        while (ucp_worker_progress(u->worker) != 0) {
        }
        if (u->efd < 0 || ucp_worker_arm(u->worker) != UCS_ERR_BUSY)
            return; /* armed: the fd fires on the next event */
    }
}

/* ------------------------------------------------------------- memory */

int kvd_ucx_mem_map(kvd_ucx_t *u, void *base, uint64_t len, kvd_ucx_mem_t **out)
{
    if (u == NULL || base == NULL || len == 0)
        return KVD_ERR_INVALID;
    kvd_ucx_mem_t *m = calloc(1, sizeof(*m));
    if (m == NULL)
        return KVD_ERR_NOMEM;
    m->u = u;
    m->base = (uint64_t)(uintptr_t)base;
    m->len = len;
    ucp_mem_map_params_t mp = {
        .field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH,
        .address = base,
        .length = len,
    };
    ucs_status_t st = ucp_mem_map(u->ctx, &mp, &m->memh);
    if (st == UCS_OK) {
        st = ucp_rkey_pack(u->ctx, m->memh, &m->rkey, &m->rkey_len);
        if (st != UCS_OK) {
            ucp_mem_unmap(u->ctx, m->memh);
            m->memh = NULL;
        }
    }
    if (st != UCS_OK) {
        KVD_WARN("ucx", "cannot map %llu bytes: %s", (unsigned long long)len,
                 ucs_status_string(st));
        free(m);
        return st == UCS_ERR_NO_MEMORY ? KVD_ERR_NOMEM : KVD_ERR_IO;
    }
    *out = m;
    return KVD_OK;
}

void kvd_ucx_mem_rkey(const kvd_ucx_mem_t *m, const void **rkey, size_t *len)
{
    *rkey = m->rkey;
    *len = m->rkey_len;
}

void kvd_ucx_mem_unmap(kvd_ucx_mem_t *m)
{
    if (m == NULL)
        return;
    ucp_rkey_buffer_release(m->rkey);
    ucp_mem_unmap(m->u->ctx, m->memh);
    free(m);
}

/* ------------------------------------------------------------ transport */

static void batch_put(ucx_batch_t *b)
{
    if (--b->pending > 0)
        return;
    ucx_transport_t *t = b->t;
    /* room was promised at post time, so this cannot fail */
    kvd_done_ring_push(&t->done, b->cookie, b->status);
    t->outstanding--;
    free(b);
}

static void op_done(void *request, ucs_status_t st, void *user_data)
{
    ucx_batch_t *b = user_data;
    if (st != UCS_OK && b->status == KVD_OK)
        b->status = status_from_ucs(st);
    ucp_request_free(request);
    batch_put(b);
}

/* Accounts one nbx call's result to the batch. */
static void batch_track(ucx_batch_t *b, ucs_status_ptr_t sp)
{
    if (UCS_PTR_IS_ERR(sp)) {
        if (b->status == KVD_OK)
            b->status = status_from_ucs(UCS_PTR_STATUS(sp));
    } else if (sp != NULL) {
        b->pending++; /* op_done takes it off */
    }
}

static ucp_mem_h local_memh(const ucx_transport_t *t, uint64_t addr, uint64_t len)
{
    size_t lo = 0, hi = t->n_locals;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (t->locals[mid].base <= addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == 0)
        return NULL;
    const ucx_local_t *r = &t->locals[lo - 1];
    return kvd_range_ok(addr - r->base, len, r->len) ? r->memh : NULL;
}

static int ucx_post(kvd_transport_t *tt, kvd_xfer_dir_t dir, const kvd_xfer_t *xfers,
                    size_t n, uint64_t cookie)
{
    ucx_transport_t *t = (ucx_transport_t *)tt;
    if (t->failed != UCS_OK)
        return KVD_ERR_CLOSED;
    for (size_t i = 0; i < n; i++)
        if (!kvd_range_ok(xfers[i].remote_offset, xfers[i].length, t->remote_length) ||
            (xfers[i].length > 0 &&
             (xfers[i].local_offset == 0 ||
              xfers[i].length > UINT64_MAX - xfers[i].local_offset)))
            return KVD_ERR_INVALID;
    ucx_batch_t *b = calloc(1, sizeof(*b));
    if (b == NULL ||
        kvd_done_ring_reserve(&t->done, t->done.len + t->outstanding + 1) != KVD_OK) {
        free(b);
        return KVD_ERR_NOMEM;
    }
    *b = (ucx_batch_t){.t = t, .cookie = cookie, .status = KVD_OK, .pending = 1};
    t->outstanding++;
    for (size_t i = 0; i < n && b->status == KVD_OK; i++) {
        const kvd_xfer_t *x = &xfers[i];
        if (x->length == 0)
            continue;
        ucp_request_param_t prm = {
            .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
            .cb.send = op_done,
            .user_data = b,
        };
        ucp_mem_h memh = local_memh(t, x->local_offset, x->length);
        if (memh != NULL) {
            prm.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
            prm.memh = memh;
        }
        void *local = (void *)(uintptr_t)x->local_offset;
        uint64_t raddr = t->remote_base + x->remote_offset;
        batch_track(b, dir == KVD_XFER_READ
                           ? ucp_get_nbx(t->ep, local, x->length, raddr, t->rkey, &prm)
                           : ucp_put_nbx(t->ep, local, x->length, raddr, t->rkey, &prm));
    }
    if (dir == KVD_XFER_WRITE && b->status == KVD_OK) {
        ucp_request_param_t prm = {
            .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
            .cb.send = op_done,
            .user_data = b,
        };
        batch_track(b, ucp_ep_flush_nbx(t->ep, &prm));
    }
    batch_put(b); /* the posting reference */
    return KVD_OK;
}

static int ucx_poll(kvd_transport_t *tt, kvd_xfer_done_t *done, size_t max,
                    size_t *n_done)
{
    ucx_transport_t *t = (ucx_transport_t *)tt;
    *n_done = kvd_done_ring_pop(&t->done, done, max);
    return KVD_OK;
}

static unsigned ucx_progress(kvd_transport_t *tt)
{
    ucx_transport_t *t = (ucx_transport_t *)tt;
    return ucp_worker_progress(t->u->worker);
}

static void ep_failed(void *arg, ucp_ep_h ep, ucs_status_t st)
{
    (void)ep;
    ucx_transport_t *t = arg;
    if (t->failed == UCS_OK)
        KVD_WARN("ucx", "peer endpoint failed: %s", ucs_status_string(st));
    t->failed = st;
}

/* Closes the endpoint, cancelling what is outstanding, and waits until
 * every batch is reported: only then is local memory UCX's no more. */
static void ucx_close_ep(ucx_transport_t *t)
{
    if (t->rkey != NULL)
        ucp_rkey_destroy(t->rkey);
    t->rkey = NULL;
    if (t->ep == NULL)
        return;
    ucp_request_param_t prm = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                               .flags = UCP_EP_CLOSE_FLAG_FORCE};
    ucs_status_ptr_t sp = ucp_ep_close_nbx(t->ep, &prm);
    t->ep = NULL;
    if (UCS_PTR_IS_PTR(sp)) {
        while (ucp_request_check_status(sp) == UCS_INPROGRESS)
            ucp_worker_progress(t->u->worker);
        ucp_request_free(sp);
    }
    /* cancelled requests complete from progress; bounded so that a UCX
     * that never reports cannot hang the caller (the batches then leak
     * rather than be freed under a pending callback) */
    uint64_t deadline = kvd_now_ns() + 10ull * 1000000000ull;
    while (t->outstanding > 0 && kvd_now_ns() < deadline)
        ucp_worker_progress(t->u->worker);
    if (t->outstanding > 0)
        KVD_ERROR("ucx", "%zu batches still outstanding after the endpoint closed",
                  t->outstanding);
}

static void ucx_destroy(kvd_transport_t *tt)
{
    ucx_transport_t *t = (ucx_transport_t *)tt;
    ucx_close_ep(t);
    if (t->outstanding > 0)
        return; /* see ucx_close_ep: leaked on purpose */
    kvd_done_ring_free(&t->done);
    free(t->locals);
    free(t);
}

static const kvd_transport_ops_t ucx_ops = {
    .name = "ucx",
    .post = ucx_post,
    .poll = ucx_poll,
    .progress = ucx_progress,
    .destroy = ucx_destroy,
};

int kvd_transport_open_ucx(kvd_ucx_t *u, const kvd_ucx_peer_t *peer,
                           kvd_transport_t **out)
{
    if (u == NULL || peer == NULL || peer->address == NULL || peer->address_len == 0 ||
        peer->rkey == NULL || peer->rkey_len == 0)
        return KVD_ERR_INVALID;
    ucx_transport_t *t = calloc(1, sizeof(*t));
    if (t == NULL)
        return KVD_ERR_NOMEM;
    t->base.ops = &ucx_ops;
    t->u = u;
    t->remote_base = peer->remote_base;
    t->remote_length = peer->remote_length;
    ucp_ep_params_t ep = {
        .field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                      UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER,
        .address = peer->address,
        .err_mode = UCP_ERR_HANDLING_MODE_PEER,
        .err_handler = {.cb = ep_failed, .arg = t},
    };
    ucs_status_t st = ucp_ep_create(u->worker, &ep, &t->ep);
    if (st == UCS_OK)
        st = ucp_ep_rkey_unpack(t->ep, peer->rkey, &t->rkey);
    if (st != UCS_OK) {
        /* UCX_TLS naming only transports that cannot report a dead peer
         * (1.13's posix and sysv) ends here: a UCX endpoint must, so that a
         * cancelled transfer never writes late */
        KVD_WARN("ucx",
                 "cannot reach the peer with failure detection: %s (UCX_TLS=%s; "
                 "same-host workers use the shm transport)",
                 ucs_status_string(st), getenv("UCX_TLS") ? getenv("UCX_TLS") : "unset");
        ucx_destroy(&t->base);
        return st == UCS_ERR_NO_MEMORY ? KVD_ERR_NOMEM : KVD_ERR_UNAVAILABLE;
    }
    *out = &t->base;
    return KVD_OK;
}

int kvd_transport_ucx_add_local(kvd_transport_t *tt, const kvd_ucx_mem_t *m)
{
    if (tt == NULL || tt->ops != &ucx_ops || m == NULL)
        return KVD_ERR_INVALID;
    ucx_transport_t *t = (ucx_transport_t *)tt;
    ucx_local_t *v = realloc(t->locals, (t->n_locals + 1) * sizeof(*v));
    if (v == NULL)
        return KVD_ERR_NOMEM;
    t->locals = v;
    size_t at = 0;
    while (at < t->n_locals && v[at].base < m->base)
        at++;
    memmove(&v[at + 1], &v[at], (t->n_locals - at) * sizeof(*v));
    v[at] = (ucx_local_t){.base = m->base, .len = m->len, .memh = m->memh};
    t->n_locals++;
    return KVD_OK;
}
