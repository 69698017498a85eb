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
 *
 * The message mode (KVD_UCX_MODE_AM) is for transports where UCX emulates
 * RMA in software (TCP): measured here, UCX's TCP put moves 0.1-0.3 GB/s
 * and its get 0.5-0.9 GB/s, while active messages with rendezvous move
 * 2.4 GB/s at 128 KiB and 6.4 GB/s at 1 MiB. Each message names up to
 * AM_SEGS_MAX ranges of the peer's region in its header:
 *   WRITE: AM_PUT carries the bytes (an iov of the local ranges); the peer
 *          scatters them into its region and answers AM_ACK.
 *   READ:  AM_GET carries no bytes; the peer answers AM_DATA with the
 *          ranges' bytes, which land in the local ranges.
 * A message is done at its answer, so a WRITE batch reported done is in
 * the peer's memory (no flush needed). The ranges of a WRITE batch that
 * follow each other in the peer's region go as one message: they are
 * gathered through a staging chunk of the transport's (over TCP, 72 KiB
 * messages moved 1.2-1.3 GB/s here and 4 MiB ones 2.9-3.0). Messages waiting for an
 * answer are listed on the worker by token; an answer for a token no longer listed (a
 * destroyed transport) is dropped.
 *
 * Trust (the serving side faces any peer that reaches its worker): every
 * request carries a capability (KVD_UCX_CAP_BYTES random bytes, the
 * HelloReply's ucx_token) that the serving side must have been granted
 * (kvd_ucx_grant: a range of the region, read-only or not); a request
 * without a live one, a write with a read-only one, or a range outside the
 * grant is answered with an error and moves no byte. The requests' token
 * is only their id for matching answers, not a credential.
 *
 * One-sided RMA is a context feature (kvd_ucx_opts_t.rma). Without
 * UCP_FEATURE_RMA, UCP does not install the handlers of its software RMA:
 * UCX 1.13 src/ucp/core/ucp_worker.c, ucp_worker_set_am_handlers(), skips
 * every handler whose features (UCP_DEFINE_AM's first argument) the
 * context lacks, and src/ucp/rma/rma_sw.c defines PUT, GET_REQ, GET_REP
 * and CMPL under UCP_FEATURE_RMA (src/ucp/rma/amo_sw.c the atomics under
 * UCP_FEATURE_AMO); a message for an id without a handler is dropped by
 * UCT's stub (src/uct/base/uct_iface.c, uct_iface_stub_am_handler, which
 * logs a warning). Those software handlers write and read at whatever
 * address the peer names, without looking at any rkey (rma_sw.c,
 * ucp_put_handler / ucp_get_req_handler), which is why a serving side
 * reachable over TCP or shared memory must not have the feature.
 */
#include "transport_int.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdatomic.h>
#include <sys/random.h>
#include <ucp/api/ucp.h>
#include <ucs/debug/log_def.h>

#define AM_PUT   11
#define AM_GET   12
#define AM_ACK   13
#define AM_DATA  14
#define AM_MAGIC 0x6b764132u /* "kvA2": bumped when the headers change */
/* Ranges per message. One: a single contiguous range goes zero-copy on
 * TCP, an iov takes UCX's packing path. Measured over tcp here with 128 KiB
 * ranges (bench/RESULTS.md): the transport alone 1.5-2.3 GB/s with one
 * range per message, 0.7-0.8 with 64; the linker, once the pool's memory
 * has been cycled, loads at 1.6-2.8 GB/s with one. (On fresh pool memory
 * this VM's first touch through a new mapping dominates and 64 looked
 * better; that was the wrong measurement.) The protocol carries up to
 * AM_SEGS_LIMIT, for transports whose iov path is as fast. */
#define AM_SEGS_MAX   1
#define AM_SEGS_LIMIT 64
#define AM_MSG_MAX    (64ull << 20) /* bytes one message carries at most */

/* A request's header: then n segments (offset, length in the region).
 * token: the request's id, echoed by its answer; cap: the capability. */
typedef struct am_req_hdr {
    uint32_t magic;
    uint32_t n;
    uint64_t token;
    uint8_t cap[KVD_UCX_CAP_BYTES];
} am_req_hdr_t;

typedef struct am_seg {
    uint64_t offset, length;
} am_seg_t;

/* An answer's header (AM_ACK, AM_DATA); AM_DATA's bytes follow it. */
typedef struct am_rep_hdr {
    uint32_t magic;
    int32_t status;
    uint64_t token;
} am_rep_hdr_t;

typedef struct ucx_transport ucx_transport_t;
typedef struct ucx_batch ucx_batch_t;

/* One message of a batch in message mode, until its answer is in. */
typedef struct am_msg {
    ucx_batch_t *b;
    uint64_t token;
    bool answered; /* its answer arrived (or never will) */
    bool read;     /* AM_GET: answered by AM_DATA with total bytes */
    int refs;      /* the send's completion and the answer */
    size_t n;
    uint64_t total;
    ucp_dt_iov_t *local;       /* n local ranges */
    am_req_hdr_t *hdr;         /* header + n segments, sent with the request */
    struct stage_chunk *stage; /* a staged WRITE: the chunk its bytes are in */
    struct am_msg *prev, *next;
} am_msg_t;

/* A request of the serving side in flight (an answer, or bytes landing),
 * on the endpoint it answers. */
typedef struct inflight {
    ucp_ep_h ep;
    struct inflight *prev, *next;
} inflight_t;

/* The serving side of message mode: the region requests address. */
typedef struct am_region {
    uint8_t *base;
    uint64_t len;
} am_region_t;

/* The serving side's grants, by capability (chained; its bytes are
 * random, so its first eight pick the bucket). */
typedef struct window {
    uint64_t offset, length, tag;
} window_t;

typedef struct grant_node {
    kvd_ucx_grant_t g;
    window_t *win; /* open write windows, by offset (none overlap) */
    size_t n_win, cap_win;
    struct grant_node *next;
} grant_node_t;

typedef struct grant_table {
    grant_node_t **b;
    size_t nb, n; /* buckets (a power of two, 0 before the first), grants */
} grant_table_t;

#define REFUSE_LOG_NS 1000000000ull /* one line a second at most */

struct kvd_ucx {
    ucp_context_h ctx;
    ucp_worker_h worker;
    ucp_address_t *addr;
    size_t addr_len;
    int efd;
    uint64_t next_token;
    /* messages waiting for their answer, oldest first (answers come
     * mostly in order, so a lookup stops near the head) */
    am_msg_t *waiting, *waiting_tail;
    am_region_t served;   /* kvd_ucx_serve_messages: the region; base NULL none */
    inflight_t *inflight; /* ... listed, to cancel them at destroy */
    grant_table_t grants;
    void (*on_unknown)(void *arg);
    void *on_unknown_arg;
    kvd_ucx_refused_t refused;
    uint64_t refused_logged; /* refusals counted at the last log line */
    uint64_t refuse_log_ns;  /* when it was written */
    char *resources;         /* "tl/dev" of each resource, 'a' flag as "(aux)" */
};

#define CANCEL_NS (10ull * 1000000000ull) /* a cancelled request's end */

/* Progresses until sp is no longer in progress, CANCEL_NS at most; false
 * when UCX did not finish it (it is left then rather than freed). */
static bool finish_request(kvd_ucx_t *u, ucs_status_ptr_t sp)
{
    uint64_t deadline = kvd_now_ns() + CANCEL_NS;
    while (ucp_request_check_status(sp) == UCS_INPROGRESS) {
        if (kvd_now_ns() >= deadline) {
            KVD_ERROR("ucx", "a cancelled request did not end: left to UCX");
            return false;
        }
        ucp_worker_progress(u->worker);
    }
    return true;
}

/* Closes ep without the peer's consent, which cancels its requests, and
 * waits for the close to finish (CANCEL_NS at most). */
static void close_ep_force(kvd_ucx_t *u, ucp_ep_h ep)
{
    ucp_request_param_t prm = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                               .flags = UCP_EP_CLOSE_FLAG_FORCE};
    ucs_status_ptr_t sp = ucp_ep_close_nbx(ep, &prm);
    if (UCS_PTR_IS_PTR(sp) && finish_request(u, sp))
        ucp_request_free(sp);
}

static void inflight_add(kvd_ucx_t *u, inflight_t *f, ucp_ep_h ep)
{
    *f = (inflight_t){.ep = ep, .next = u->inflight};
    if (u->inflight)
        u->inflight->prev = f;
    u->inflight = f;
}

static void inflight_del(kvd_ucx_t *u, inflight_t *f)
{
    if (f->prev)
        f->prev->next = f->next;
    else
        u->inflight = f->next;
    if (f->next)
        f->next->prev = f->prev;
}

struct kvd_ucx_mem {
    kvd_ucx_t *u;
    ucp_mem_h memh;
    void *rkey;
    size_t rkey_len;
    uint64_t base, len;
};

/* A staging chunk of the message mode (KVD_UCX_STAGE_CHUNK bytes). */
typedef struct stage_chunk {
    struct stage_chunk *next;
    uint8_t *bytes;
} stage_chunk_t;

struct ucx_transport {
    kvd_transport_t base;
    kvd_ucx_t *u; /* this transport's own context and worker */
    kvd_ucx_mode_t mode;
    ucp_ep_h ep;
    ucp_rkey_h rkey;
    uint64_t remote_base;
    uint8_t cap[KVD_UCX_CAP_BYTES]; /* the message mode's capability */
    bool rma_ok;                    /* its context has UCP_FEATURE_RMA */
    ucs_status_t failed;            /* the endpoint's error; UCS_OK while fine */
    size_t outstanding;             /* batches not reported yet */
    kvd_done_ring_t done;
    stage_chunk_t *stage_free; /* chunks not in a message */
    size_t stage_chunks;       /* made so far, at most STAGE_CHUNKS_MAX */
};

struct ucx_batch {
    ucx_transport_t *t;
    uint64_t cookie;
    int status;
    size_t pending;
};

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

/* -------------------------------------------------------- message mode */

static void batch_put(ucx_batch_t *b);

static ucs_status_t set_handler(kvd_ucx_t *u, unsigned id, ucp_am_recv_callback_t cb)
{
    ucp_am_handler_param_t hp = {
        .field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                      UCP_AM_HANDLER_PARAM_FIELD_ARG,
        .id = id,
        .cb = cb,
        .arg = u,
    };
    return ucp_worker_set_am_recv_handler(u->worker, &hp);
}

/* The buffer argument for n ranges: one range goes as plain contiguous
 * bytes (UCX moves those zero-copy where it can; an iov, even of one
 * range, takes its packing path), more as an iov. */
static void *ranges_arg(ucp_request_param_t *prm, ucp_dt_iov_t *iov, size_t n,
                        size_t *count)
{
    if (n == 1) {
        *count = iov[0].length;
        return iov[0].buffer;
    }
    prm->op_attr_mask |= UCP_OP_ATTR_FIELD_DATATYPE;
    prm->datatype = ucp_dt_make_iov();
    *count = n;
    return iov;
}

/* Fetches a rendezvous message's bytes into the ranges; `landed` runs when
 * they are in (unless the bytes came at once: NULL). */
static ucs_status_ptr_t recv_rndv(kvd_ucx_t *u, void *data, ucp_dt_iov_t *iov, size_t n,
                                  ucp_am_recv_data_nbx_callback_t landed, void *user)
{
    ucp_request_param_t prm = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
        .cb.recv_am = landed,
        .user_data = user,
    };
    size_t count;
    void *buf = ranges_arg(&prm, iov, n, &count);
    return ucp_am_recv_data_nbx(u->worker, data, buf, count, &prm);
}

static void msg_unlink(kvd_ucx_t *u, am_msg_t *m)
{
    if (m->prev)
        m->prev->next = m->next;
    else if (u->waiting == m)
        u->waiting = m->next;
    if (m->next)
        m->next->prev = m->prev;
    else if (u->waiting_tail == m)
        u->waiting_tail = m->prev;
    m->prev = m->next = NULL;
}

/* Drops one of the message's two references (its send's completion, its
 * answer); the last frees it (UCX may read the header and the iov until
 * the send completes) and takes it off its batch. */
static void msg_release(am_msg_t *m, int status)
{
    ucx_batch_t *b = m->b;
    if (status != KVD_OK && b->status == KVD_OK)
        b->status = status;
    if (--m->refs > 0)
        return;
    if (m->stage != NULL) { /* back to its transport's free chunks */
        m->stage->next = b->t->stage_free;
        b->t->stage_free = m->stage;
    }
    free(m->local);
    free(m->hdr);
    free(m);
    batch_put(b);
}

/* The message's answer is in (or never will be). */
static void msg_answered(ucx_batch_t *b, am_msg_t *m, int status)
{
    m->answered = true;
    msg_unlink(b->t->u, m);
    msg_release(m, status);
}

static void msg_sent(void *request, ucs_status_t st, void *user_data)
{
    msg_release(user_data, st == UCS_OK ? KVD_OK : status_from_ucs(st));
    ucp_request_free(request);
}

/* Fails t's messages still waiting for an answer that will not come (the
 * endpoint failed or is closing). Ones whose bytes are landing finish in
 * data_landed. */
static void fail_waiting(ucx_transport_t *t, int status)
{
    for (am_msg_t *m = t->u->waiting, *next; m; m = next) {
        next = m->next;
        if (m->b->t == t && !m->answered)
            msg_answered(m->b, m, status);
    }
}

static am_msg_t *msg_find(kvd_ucx_t *u, uint64_t token)
{
    for (am_msg_t *m = u->waiting; m; m = m->next)
        if (m->token == token)
            return m;
    return NULL;
}

/* Scatters a contiguous buffer into iov ranges. */
static void scatter(const ucp_dt_iov_t *iov, size_t n, const uint8_t *src)
{
    for (size_t i = 0; i < n; i++) {
        memcpy(iov[i].buffer, src, iov[i].length);
        src += iov[i].length;
    }
}

static void data_landed(void *request, ucs_status_t st, size_t length, void *user_data)
{
    (void)length;
    am_msg_t *m = user_data;
    msg_answered(m->b, m, st == UCS_OK ? KVD_OK : status_from_ucs(st));
    ucp_request_free(request);
}

/* Worker side: AM_ACK (a WRITE message is in the peer's region) and
 * AM_DATA (a READ message's bytes). */
static ucs_status_t answer_in(kvd_ucx_t *u, unsigned got_id, const void *header,
                              size_t header_length, void *data, size_t length,
                              const ucp_am_recv_param_t *param)
{
    am_rep_hdr_t h;
    if (header_length != sizeof(h))
        return UCS_OK; /* not ours: dropped */
    memcpy(&h, header, sizeof(h));
    am_msg_t *m = msg_find(u, h.token);
    if (h.magic != AM_MAGIC || m == NULL || m->answered)
        return UCS_OK; /* its transport is gone: dropped */
    if (h.status != KVD_OK) {
        msg_answered(m->b, m, h.status);
        return UCS_OK;
    }
    /* a READ is answered by its bytes, a WRITE by an empty ACK */
    unsigned id = m->read ? AM_DATA : AM_ACK;
    if (got_id != id || length != (m->read ? m->total : 0)) {
        msg_answered(m->b, m, KVD_ERR_PROTOCOL);
        return UCS_OK;
    }
    if (length == 0) {
        msg_answered(m->b, m, KVD_OK);
        return UCS_OK;
    }
    if (length != m->total) {
        msg_answered(m->b, m, KVD_ERR_PROTOCOL);
        return UCS_OK;
    }
    if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
        m->answered = true; /* no second answer; it completes in data_landed */
        ucs_status_ptr_t sp = recv_rndv(u, data, m->local, m->n, data_landed, m);
        if (UCS_PTR_IS_ERR(sp))
            msg_answered(m->b, m, status_from_ucs(UCS_PTR_STATUS(sp)));
        else if (sp == NULL)
            msg_answered(m->b, m, KVD_OK);
        return UCS_OK;
    }
    scatter(m->local, m->n, data);
    msg_answered(m->b, m, KVD_OK);
    return UCS_OK;
}

static ucs_status_t on_ack(void *arg, const void *header, size_t header_length,
                           void *data, size_t length, const ucp_am_recv_param_t *param)
{
    return answer_in(arg, AM_ACK, header, header_length, data, length, param);
}

static ucs_status_t on_data(void *arg, const void *header, size_t header_length,
                            void *data, size_t length, const ucp_am_recv_param_t *param)
{
    return answer_in(arg, AM_DATA, header, header_length, data, length, param);
}

/* Serving side: one request's ranges, checked against the region. */
typedef struct serve_op {
    inflight_t link; /* first */
    kvd_ucx_t *u;
    int refs; /* the posting call and the callback (see on_put) */
    ucp_dt_iov_t *iov;
    size_t n;
    uint64_t token;
    ucp_ep_h reply_ep;
} serve_op_t;

/* ---- grants */

static size_t grant_bucket(const grant_table_t *t, const uint8_t *cap)
{
    uint64_t h;
    memcpy(&h, cap, sizeof(h));
    return (size_t)(h & (t->nb - 1));
}

/* Equal in time independent of where they differ. */
static bool cap_equal(const uint8_t *a, const uint8_t *b)
{
    uint8_t d = 0;
    for (size_t i = 0; i < KVD_UCX_CAP_BYTES; i++)
        d |= a[i] ^ b[i];
    return d == 0;
}

static grant_node_t **grant_slot(grant_table_t *t, const uint8_t *cap)
{
    if (t->nb == 0)
        return NULL;
    grant_node_t **at = &t->b[grant_bucket(t, cap)];
    while (*at != NULL && !cap_equal((*at)->g.cap, cap))
        at = &(*at)->next;
    return at;
}

static int grant_grow(grant_table_t *t)
{
    size_t nb = t->nb ? t->nb * 2 : 64;
    grant_node_t **b = kvd_mem_calloc(KVD_MEM_OTHER, nb, sizeof(*b));
    if (b == NULL)
        return KVD_ERR_NOMEM;
    grant_table_t nt = {.b = b, .nb = nb, .n = t->n};
    for (size_t i = 0; i < t->nb; i++)
        for (grant_node_t *g = t->b[i], *next; g; g = next) {
            next = g->next;
            size_t k = grant_bucket(&nt, g->g.cap);
            g->next = b[k];
            b[k] = g;
        }
    kvd_mem_free(KVD_MEM_OTHER, t->b, t->nb * sizeof(*t->b));
    *t = nt;
    return KVD_OK;
}

static void node_free(grant_node_t *g)
{
    free(g->win);
    kvd_mem_free(KVD_MEM_OTHER, g, sizeof(*g));
}

int kvd_ucx_grant(kvd_ucx_t *u, const kvd_ucx_grant_t *g)
{
    if (u == NULL || g == NULL)
        return KVD_ERR_INVALID;
    grant_table_t *t = &u->grants;
    grant_node_t **at = grant_slot(t, g->cap);
    if (at != NULL && *at != NULL) {
        (*at)->g = *g;
        (*at)->n_win = 0;
        return KVD_OK;
    }
    if ((t->nb == 0 || t->n >= 2 * t->nb) && grant_grow(t) != KVD_OK)
        return KVD_ERR_NOMEM;
    grant_node_t *node = kvd_mem_calloc(KVD_MEM_OTHER, 1, sizeof(*node));
    if (node == NULL)
        return KVD_ERR_NOMEM;
    node->g = *g;
    size_t k = grant_bucket(t, g->cap);
    node->next = t->b[k];
    t->b[k] = node;
    t->n++;
    return KVD_OK;
}

bool kvd_ucx_revoke(kvd_ucx_t *u, const uint8_t cap[KVD_UCX_CAP_BYTES])
{
    grant_node_t **at = u != NULL ? grant_slot(&u->grants, cap) : NULL;
    if (at == NULL || *at == NULL)
        return false;
    grant_node_t *gone = *at;
    *at = gone->next;
    node_free(gone);
    u->grants.n--;
    return true;
}

/* The index of the first window of n whose end is past offset. */
static size_t window_at(const grant_node_t *g, uint64_t offset)
{
    size_t lo = 0, hi = g->n_win;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (g->win[mid].offset + g->win[mid].length <= offset)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static int range_cmp(const void *a, const void *b)
{
    const kvd_ucx_range_t *x = a, *y = b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

int kvd_ucx_window_open(kvd_ucx_t *u, const uint8_t cap[KVD_UCX_CAP_BYTES], uint64_t tag,
                        const kvd_ucx_range_t *r, size_t n)
{
    grant_node_t **at = u != NULL ? grant_slot(&u->grants, cap) : NULL;
    if (at == NULL || *at == NULL)
        return KVD_ERR_NOT_FOUND;
    grant_node_t *g = *at;
    if (n == 0)
        return KVD_OK;
    kvd_ucx_range_t *in = malloc(n * sizeof(*in));
    if (in == NULL)
        return KVD_ERR_NOMEM;
    memcpy(in, r, n * sizeof(*in));
    qsort(in, n, sizeof(*in), range_cmp);
    /* joined where they touch; checked against the grant and each other */
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        if (in[i].length == 0)
            continue;
        if (in[i].offset < g->g.offset ||
            !kvd_range_ok(in[i].offset - g->g.offset, in[i].length, g->g.length) ||
            (m > 0 && in[m - 1].offset + in[m - 1].length > in[i].offset)) {
            free(in);
            return KVD_ERR_INVALID;
        }
        if (m > 0 && in[m - 1].offset + in[m - 1].length == in[i].offset)
            in[m - 1].length += in[i].length;
        else
            in[m++] = in[i];
    }
    /* none over an open window */
    for (size_t i = 0; i < m; i++) {
        size_t k = window_at(g, in[i].offset);
        if (k < g->n_win && g->win[k].offset < in[i].offset + in[i].length) {
            free(in);
            return KVD_ERR_INVALID;
        }
    }
    if (g->n_win + m > g->cap_win) {
        size_t cap2 = KVD_MAX(g->cap_win * 2, g->n_win + m);
        window_t *w = realloc(g->win, cap2 * sizeof(*w));
        if (w == NULL) {
            free(in);
            return KVD_ERR_NOMEM;
        }
        g->win = w;
        g->cap_win = cap2;
    }
    /* merged into the sorted list from the back: O(open + new) */
    size_t i = g->n_win, j = m, to = g->n_win + m;
    while (j > 0) {
        if (i > 0 && g->win[i - 1].offset > in[j - 1].offset)
            g->win[--to] = g->win[--i];
        else {
            j--;
            g->win[--to] = (window_t){in[j].offset, in[j].length, tag};
        }
    }
    g->n_win += m;
    free(in);
    return KVD_OK;
}

size_t kvd_ucx_window_close(kvd_ucx_t *u, const uint8_t cap[KVD_UCX_CAP_BYTES],
                            uint64_t tag)
{
    grant_node_t **at = u != NULL ? grant_slot(&u->grants, cap) : NULL;
    if (at == NULL || *at == NULL)
        return 0;
    grant_node_t *g = *at;
    size_t kept = 0;
    for (size_t i = 0; i < g->n_win; i++)
        if (g->win[i].tag != tag)
            g->win[kept++] = g->win[i];
    size_t closed = g->n_win - kept;
    g->n_win = kept;
    return closed;
}

/* True when [offset, offset+length) lies within one open window of g. */
static bool in_window(const grant_node_t *g, uint64_t offset, uint64_t length)
{
    size_t k = window_at(g, offset);
    return k < g->n_win && g->win[k].offset <= offset &&
           offset - g->win[k].offset <= g->win[k].length &&
           length <= g->win[k].length - (offset - g->win[k].offset);
}

size_t kvd_ucx_grants(const kvd_ucx_t *u)
{
    return u->grants.n;
}

static void grants_free(grant_table_t *t)
{
    for (size_t i = 0; i < t->nb; i++)
        for (grant_node_t *g = t->b[i], *next; g; g = next) {
            next = g->next;
            node_free(g);
        }
    kvd_mem_free(KVD_MEM_OTHER, t->b, t->nb * sizeof(*t->b));
    *t = (grant_table_t){0};
}

void kvd_ucx_on_unknown_cap(kvd_ucx_t *u, void (*fn)(void *arg), void *arg)
{
    u->on_unknown = fn;
    u->on_unknown_arg = arg;
}

void kvd_ucx_refused(const kvd_ucx_t *u, kvd_ucx_refused_t *out)
{
    *out = u->refused;
}

/* The grant of a capability, after asking for the grants sent meanwhile
 * when it is not known yet; NULL when it has none. */
static grant_node_t *grant_find(kvd_ucx_t *u, const uint8_t *cap)
{
    grant_node_t **at = grant_slot(&u->grants, cap);
    if ((at == NULL || *at == NULL) && u->on_unknown != NULL) {
        u->on_unknown(u->on_unknown_arg);
        at = grant_slot(&u->grants, cap);
    }
    return at != NULL && *at != NULL ? *at : NULL;
}

/* Counts a refused request and logs it, one line a second at most (a peer
 * that keeps trying must not flood the log). */
static void refuse_note(kvd_ucx_t *u, uint64_t *counter, const char *why,
                        uint64_t conn_id)
{
    (*counter)++;
    const kvd_ucx_refused_t *r = &u->refused;
    uint64_t total = r->malformed + r->no_cap + r->read_only + r->range + r->window;
    uint64_t now = kvd_now_ns();
    if (u->refuse_log_ns != 0 && now - u->refuse_log_ns < REFUSE_LOG_NS)
        return;
    char whose[64] = "";
    if (conn_id != 0)
        snprintf(whose, sizeof(whose), " (the grant of connection %llu)",
                 (unsigned long long)conn_id);
    KVD_WARN("ucx",
             "refused a UCX request: %s%s; %llu refused since the last such line "
             "(so far: %llu without a live capability, %llu writes of read-only "
             "grants, %llu outside their range, %llu writes outside their "
             "reservations, %llu malformed)",
             why, whose, (unsigned long long)(total - u->refused_logged),
             (unsigned long long)r->no_cap, (unsigned long long)r->read_only,
             (unsigned long long)r->range, (unsigned long long)r->window,
             (unsigned long long)r->malformed);
    u->refused_logged = total;
    u->refuse_log_ns = now;
}

/* Checks a request against the region and its capability's grant and
 * lists its ranges in op. write: it brings bytes (AM_PUT). */
static int parse_request(kvd_ucx_t *u, bool write, const void *header,
                         size_t header_length, serve_op_t *op, uint64_t *total)
{
    am_req_hdr_t h;
    if (header_length < sizeof(h)) {
        if (header_length >= offsetof(am_req_hdr_t, cap))
            memcpy(&op->token, (const uint8_t *)header + offsetof(am_req_hdr_t, token),
                   sizeof(op->token)); /* answered, so the sender does not wait */
        refuse_note(u, &u->refused.malformed, "not of this protocol", 0);
        return KVD_ERR_PROTOCOL;
    }
    memcpy(&h, header, sizeof(h));
    op->token = h.token;
    if (h.magic != AM_MAGIC || h.n == 0 || h.n > AM_SEGS_LIMIT ||
        header_length != sizeof(h) + (size_t)h.n * sizeof(am_seg_t)) {
        refuse_note(u, &u->refused.malformed, "not of this protocol", 0);
        return KVD_ERR_PROTOCOL;
    }
    grant_node_t *node = grant_find(u, h.cap);
    const kvd_ucx_grant_t *g = node != NULL ? &node->g : NULL;
    if (g == NULL) {
        refuse_note(u, &u->refused.no_cap, "no live capability", 0);
        return KVD_ERR_AUTH;
    }
    if (write && g->read_only) {
        refuse_note(u, &u->refused.read_only, "a write with a read-only grant",
                    g->conn_id);
        return KVD_ERR_AUTH;
    }
    op->iov = calloc(h.n, sizeof(*op->iov));
    if (op->iov == NULL)
        return KVD_ERR_NOMEM;
    op->n = h.n;
    *total = 0;
    const uint8_t *p = (const uint8_t *)header + sizeof(h);
    for (uint32_t i = 0; i < h.n; i++) {
        am_seg_t sg;
        memcpy(&sg, p + i * sizeof(sg), sizeof(sg));
        if (!kvd_range_ok(sg.offset, sg.length, u->served.len) || sg.offset < g->offset ||
            !kvd_range_ok(sg.offset - g->offset, sg.length, g->length) ||
            sg.length > AM_MSG_MAX - *total) {
            refuse_note(u, &u->refused.range, "a range outside its grant", g->conn_id);
            return KVD_ERR_INVALID;
        }
        if (write && g->windowed && !in_window(node, sg.offset, sg.length)) {
            /* a window opened with the Reserve reply is in by now: the
             * parent sent it before the reply was queued */
            if (u->on_unknown != NULL) {
                u->on_unknown(u->on_unknown_arg);
                node = grant_find(u, h.cap);
                g = node != NULL ? &node->g : NULL;
            }
            if (node == NULL || !in_window(node, sg.offset, sg.length)) {
                refuse_note(u, &u->refused.window, "a write outside its reservations",
                            g != NULL ? g->conn_id : 0);
                return KVD_ERR_AUTH;
            }
        }
        op->iov[i] = (ucp_dt_iov_t){u->served.base + sg.offset, sg.length};
        *total += sg.length;
    }
    return KVD_OK;
}

typedef struct sent_answer {
    inflight_t link; /* first */
    kvd_ucx_t *u;
    int refs; /* the posting call and the callback (see answer) */
    ucp_dt_iov_t *bytes;
    am_rep_hdr_t hdr; /* UCX 1.13 reads it when it packs, maybe later */
} sent_answer_t;

/* Unlists an object whose first member is f and frees it with the
 * buffer it owns. */
static void inflight_free(kvd_ucx_t *u, inflight_t *f, void *owned)
{
    inflight_del(u, f);
    free(owned);
    free(f);
}

/* Drops n references; the last takes it off the in-flight list. */
static void answer_unref(sent_answer_t *a, int n)
{
    if ((a->refs -= n) <= 0)
        inflight_free(a->u, &a->link, a->bytes);
}

static void freed_on_send(void *request, ucs_status_t st, void *user_data)
{
    (void)st;
    ucp_request_free(request);
    answer_unref(user_data, 1);
}

/* Sends an answer; `bytes` (an iov of n ranges, freed once sent) may be
 * NULL. Nothing waits for it here: a peer that is gone just fails it. */
static void answer(kvd_ucx_t *u, ucp_ep_h ep, unsigned id, uint64_t token, int status,
                   ucp_dt_iov_t *bytes, size_t n)
{
    sent_answer_t *a = malloc(sizeof(*a));
    if (a == NULL) {
        free(bytes);
        return; /* the requester times out */
    }
    *a = (sent_answer_t){.u = u,
                         .bytes = bytes,
                         .hdr = {.magic = AM_MAGIC, .status = status, .token = token}};
    ucp_request_param_t prm = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
        .cb.send = freed_on_send,
        .user_data = a,
    };
    size_t count = 0;
    void *buf = bytes ? ranges_arg(&prm, bytes, n, &count) : NULL;
    /* the header lives with the request: a queued send packs it later
     * (a header on this stack was garbage in 18441 of 20000 answers of a
     * busy endpoint, measured) */
    /* listed before the call and counted: UCX may run the callback inside
     * it (a request purged on a failed endpoint) and still return the
     * request, so nothing may touch `a` after the call but its count */
    a->refs = 2;
    inflight_add(u, &a->link, ep);
    ucs_status_ptr_t sp =
        ucp_am_send_nbx(ep, id, &a->hdr, sizeof(a->hdr), buf, count, &prm);
    /* done at once, or failed: no callback comes, so both go now */
    answer_unref(a, UCS_PTR_IS_PTR(sp) ? 1 : 2);
}

/* Drops n references; the last takes it off the in-flight list. */
static void serve_op_unref(serve_op_t *op, int n)
{
    if ((op->refs -= n) <= 0)
        inflight_free(op->u, &op->link, op->iov);
}

static void put_landed(void *request, ucs_status_t st, size_t length, void *user_data)
{
    (void)length;
    serve_op_t *op = user_data;
    if (st != UCS_ERR_CANCELED && st != UCS_ERR_CONNECTION_RESET)
        answer(op->u, op->reply_ep, AM_ACK, op->token,
               st == UCS_OK ? KVD_OK : status_from_ucs(st), NULL, 0);
    ucp_request_free(request);
    serve_op_unref(op, 1);
}

/* Serving side: AM_PUT, bytes for the region. */
static ucs_status_t on_put(void *arg, const void *header, size_t header_length,
                           void *data, size_t length, const ucp_am_recv_param_t *param)
{
    kvd_ucx_t *u = arg;
    serve_op_t op = {0};
    uint64_t total = 0;
    int rc = u->served.base ? parse_request(u, true, header, header_length, &op, &total)
                            : KVD_ERR_UNSUPPORTED;
    if (rc == KVD_OK && total != length) {
        refuse_note(u, &u->refused.malformed, "bytes that do not match its ranges", 0);
        rc = KVD_ERR_INVALID;
    }
    if (!(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) ||
        param->reply_ep == NULL) {
        free(op.iov);
        return UCS_OK; /* nobody to answer: a sender not of ours */
    }
    if (rc != KVD_OK) {
        free(op.iov);
        answer(u, param->reply_ep, AM_ACK, op.token, rc, NULL, 0);
        return UCS_OK;
    }
    if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
        serve_op_t *heap = malloc(sizeof(*heap));
        if (heap == NULL) {
            free(op.iov);
            answer(u, param->reply_ep, AM_ACK, op.token, KVD_ERR_NOMEM, NULL, 0);
            return UCS_OK;
        }
        op.reply_ep = param->reply_ep;
        op.u = u;
        op.refs = 2;
        *heap = op;
        /* listed and counted before the call, as in answer(): put_landed
         * may run inside it */
        inflight_add(u, &heap->link, param->reply_ep);
        ucs_status_ptr_t sp = recv_rndv(u, data, heap->iov, heap->n, put_landed, heap);
        if (!UCS_PTR_IS_PTR(sp)) /* landed at once, or failed: no callback */
            answer(u, param->reply_ep, AM_ACK, op.token,
                   UCS_PTR_IS_ERR(sp) ? status_from_ucs(UCS_PTR_STATUS(sp)) : KVD_OK,
                   NULL, 0);
        serve_op_unref(heap, UCS_PTR_IS_PTR(sp) ? 1 : 2);
        return UCS_OK;
    }
    scatter(op.iov, op.n, data);
    free(op.iov);
    answer(u, param->reply_ep, AM_ACK, op.token, KVD_OK, NULL, 0);
    return UCS_OK;
}

/* Serving side: AM_GET, the region's bytes back. */
static ucs_status_t on_get(void *arg, const void *header, size_t header_length,
                           void *data, size_t length, const ucp_am_recv_param_t *param)
{
    (void)data;
    kvd_ucx_t *u = arg;
    serve_op_t op = {0};
    uint64_t total = 0;
    int rc = u->served.base ? parse_request(u, false, header, header_length, &op, &total)
                            : KVD_ERR_UNSUPPORTED;
    if (rc == KVD_OK && length != 0) {
        refuse_note(u, &u->refused.malformed, "a read that brings bytes", 0);
        rc = KVD_ERR_INVALID;
    }
    if (!(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) ||
        param->reply_ep == NULL) {
        free(op.iov);
        return UCS_OK;
    }
    if (rc != KVD_OK) {
        free(op.iov);
        answer(u, param->reply_ep, AM_DATA, op.token, rc, NULL, 0);
        return UCS_OK;
    }
    answer(u, param->reply_ep, AM_DATA, op.token, KVD_OK, op.iov, op.n);
    return UCS_OK;
}

int kvd_ucx_serve_region(kvd_ucx_t *u, void *base, uint64_t len)
{
    if (u == NULL || base == NULL || len == 0)
        return KVD_ERR_INVALID;
    u->served = (am_region_t){base, len};
    if (set_handler(u, AM_PUT, on_put) != UCS_OK ||
        set_handler(u, AM_GET, on_get) != UCS_OK)
        return KVD_ERR_IO;
    return KVD_OK;
}

int kvd_ucx_serve_messages(kvd_ucx_t *u, const kvd_ucx_mem_t *m)
{
    if (u == NULL || m == NULL)
        return KVD_ERR_INVALID;
    return kvd_ucx_serve_region(u, (void *)(uintptr_t)m->base, m->len);
}

/* ------------------------------------------------------------- context */

/* The context's resources as "tl/dev" (aux ones "tl/dev(aux)"), comma
 * separated, from ucp_context_print_info (UCX 1.13 ucp_context.c prints
 * "resource N : md M dev D flags XY tl/dev", X 'a' for an auxiliary one:
 * the one public way to see what a context opened). */
static char *resources_of(ucp_context_h ctx)
{
    char *text = NULL, *out = NULL;
    size_t len = 0, used = 0;
    FILE *f = open_memstream(&text, &len);
    if (f == NULL)
        return NULL;
    ucp_context_print_info(ctx, f);
    fclose(f);
    out = calloc(1, len + 16);
    for (char *line = text, *end; out != NULL && line != NULL && *line; line = end) {
        end = strchr(line, '\n');
        if (end != NULL)
            *end++ = '\0';
        const char *fl = strstr(line, " flags ");
        if (strstr(line, "resource") == NULL || fl == NULL || strlen(fl) < 11)
            continue;
        bool aux = fl[7] == 'a';
        const char *desc = fl + 10;
        used += (size_t)snprintf(out + used, len + 16 - used, "%s%s%s", used ? "," : "",
                                 desc, aux ? "(aux)" : "");
    }
    free(text);
    return out;
}

void kvd_ucx_resources(const kvd_ucx_t *u, char *buf, size_t cap)
{
    kvd_strlcpy(buf, u->resources ? u->resources : "", cap);
}

bool kvd_ucx_tl_enforces_rma(const char *tl)
{
    /* reliable connections and DC of verbs/mlx5: the HCA checks every
     * one-sided access against a registration's rkey; self reaches only
     * this very process */
    static const char *const ok[] = {"rc_verbs", "rc_mlx5", "dc_mlx5", "self"};
    for (size_t i = 0; i < KVD_ARRAY_SIZE(ok); i++)
        if (strcmp(tl, ok[i]) == 0)
            return true;
    return false;
}

bool kvd_ucx_tl_network(const char *tl)
{
    return kvd_ucx_tl_enforces_rma(tl) || strcmp(tl, "tcp") == 0 ||
           strcmp(tl, "ud_verbs") == 0 || strcmp(tl, "ud_mlx5") == 0;
}

bool kvd_ucx_rma_enforced(const kvd_ucx_t *u, char *why_not, size_t cap)
{
    const char *r = u->resources;
    bool some_rdma = false;
    for (const char *at = r; at != NULL && *at;) {
        const char *comma = strchr(at, ',');
        size_t n = comma ? (size_t)(comma - at) : strlen(at);
        char item[128], tl[64];
        kvd_strlcpy(item, at, KVD_MIN(n + 1, sizeof(item)));
        size_t tl_len = strcspn(item, "/");
        kvd_strlcpy(tl, item, KVD_MIN(tl_len + 1, sizeof(tl)));
        /* an auxiliary transport (ud, for rc's wire-up) is reachable by a
         * peer as any other: it disqualifies too */
        if (!kvd_ucx_tl_enforces_rma(tl)) {
            if (why_not != NULL)
                kvd_strlcpy(why_not, item, cap);
            return false;
        }
        some_rdma |= strcmp(tl, "self") != 0;
        at = comma ? comma + 1 : NULL;
    }
    if (!some_rdma && why_not != NULL)
        kvd_strlcpy(why_not, "no RDMA transport", cap);
    return some_rdma;
}

/* ---- UCX's log, for a server facing strangers */

#define STRANGER_LOG_NS    (60ull * 1000000000ull)
#define STRANGER_LOG_LINES 8 /* a warning and its dump, twice */

static _Atomic uint64_t stranger_window_ns, stranger_lines, stranger_dropped;

/* UCT's stub handler (src/uct/base/uct_iface.c) warns of every message it
 * drops, with its payload: a peer could fill the log at network speed. */
static ucs_log_func_rc_t quiet_handler(const char *file, unsigned line,
                                       const char *function, ucs_log_level_t level,
                                       const ucs_log_component_config_t *comp_conf,
                                       const char *message, va_list ap)
{
    (void)line;
    (void)function;
    (void)comp_conf;
    (void)message;
    (void)ap;
    const char *base = strrchr(file, '/');
    base = base ? base + 1 : file;
    if (level != UCS_LOG_LEVEL_WARN || strcmp(base, "uct_iface.c") != 0)
        return UCS_LOG_FUNC_RC_CONTINUE;
    uint64_t now = kvd_now_ns(), start = atomic_load(&stranger_window_ns);
    if (start == 0 || now - start >= STRANGER_LOG_NS) {
        atomic_store(&stranger_window_ns, now);
        atomic_store(&stranger_lines, 0);
        uint64_t dropped = atomic_exchange(&stranger_dropped, 0);
        if (dropped > 0)
            KVD_WARN("ucx",
                     "%llu more lines of UCX warnings of messages without a handler "
                     "were left out (a peer sends requests this server does not serve, "
                     "such as software RMA)",
                     (unsigned long long)dropped);
    }
    if (atomic_fetch_add(&stranger_lines, 1) < STRANGER_LOG_LINES)
        return UCS_LOG_FUNC_RC_CONTINUE;
    atomic_fetch_add(&stranger_dropped, 1);
    return UCS_LOG_FUNC_RC_STOP;
}

void kvd_ucx_quiet_strangers(void)
{
    static atomic_bool pushed;
    if (!atomic_exchange(&pushed, true))
        ucs_log_push_handler(quiet_handler);
}

int kvd_ucx_create(const char *name, bool wakeup, kvd_ucx_t **out)
{
    const kvd_ucx_opts_t o = {.name = name, .wakeup = wakeup, .rma = true};
    return kvd_ucx_create_with(&o, out);
}

/* The transport name of a "tl/dev" or "tl/dev(aux)" item into tl. */
static void tl_of(const char *item, size_t n, char *tl, size_t cap)
{
    size_t len = strcspn(item, "/");
    kvd_strlcpy(tl, item, KVD_MIN(KVD_MIN(len, n) + 1, cap));
}

/*
 * Splits the resources r by o->tl_allowed: the names of the allowed
 * transports into keep (for UCX_TLS: explicit names, so that no alias
 * brings an auxiliary transport back), the dropped resources into
 * o->dropped. Returns how many were dropped; *useful when something other
 * than self is kept.
 */
static size_t split_resources(const kvd_ucx_opts_t *o, const char *r, char *keep,
                              size_t keep_cap, bool *useful)
{
    size_t dropped = 0;
    *useful = false;
    keep[0] = '\0';
    if (o->dropped != NULL && o->dropped_cap > 0)
        o->dropped[0] = '\0';
    for (const char *at = r; at != NULL && *at;) {
        const char *comma = strchr(at, ',');
        size_t n = comma ? (size_t)(comma - at) : strlen(at);
        char tl[64];
        tl_of(at, n, tl, sizeof(tl));
        if (o->tl_allowed(tl)) {
            *useful |= strcmp(tl, "self") != 0;
            /* once each */
            bool listed = false;
            for (const char *k = keep; *k && !listed;) {
                size_t kl = strcspn(k, ",");
                listed = kl == strlen(tl) && strncmp(k, tl, kl) == 0;
                k += kl + (k[kl] == ',');
            }
            size_t used = strlen(keep);
            if (!listed && used + strlen(tl) + 2 < keep_cap)
                snprintf(keep + used, keep_cap - used, "%s%s", used ? "," : "", tl);
        } else {
            dropped++;
            if (o->dropped != NULL && o->dropped_cap > 0) {
                size_t used = strlen(o->dropped);
                if (used + n + 2 < o->dropped_cap)
                    snprintf(o->dropped + used, o->dropped_cap - used, "%s%.*s",
                             used ? "," : "", (int)n, at);
            }
        }
        at = comma ? comma + 1 : NULL;
    }
    return dropped;
}

/* ucp_init for o, with UCX_TLS as tls when not NULL. */
static ucs_status_t init_context(const kvd_ucx_opts_t *o, const char *tls,
                                 ucp_context_h *ctx)
{
    ucp_config_t *cfg = NULL;
    ucs_status_t st = ucp_config_read(NULL, NULL, &cfg);
    if (st == UCS_OK && o->net_devices != NULL)
        st = ucp_config_modify(cfg, "NET_DEVICES", o->net_devices);
    if (st == UCS_OK && o->untrusted_peers)
        st = ucp_config_modify(cfg, "PROTO_INDIRECT_ID", "on");
    if (st == UCS_OK && tls != NULL)
        st = ucp_config_modify(cfg, "TLS", tls);
    if (st == UCS_OK) {
        ucp_params_t p = {
            .field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME,
            .features = (o->rma ? UCP_FEATURE_RMA : 0) | UCP_FEATURE_AM |
                        (o->wakeup ? UCP_FEATURE_WAKEUP : 0),
            .name = o->name,
        };
        st = ucp_init(&p, cfg, ctx);
    }
    if (cfg != NULL)
        ucp_config_release(cfg);
    return st;
}

/* The context for o, with only the transports o->tl_allowed allows: the
 * one UCX_TLS gives when it opens nothing else, else a second one limited
 * to those (checked again). No interface is open yet either way. */
static int open_context(const kvd_ucx_opts_t *o, kvd_ucx_t *u)
{
    ucs_status_t st = init_context(o, NULL, &u->ctx);
    if (st == UCS_OK)
        u->resources = resources_of(u->ctx);
    if (st != UCS_OK || u->resources == NULL) {
        KVD_WARN("ucx", "UCX did not start: %s",
                 st != UCS_OK ? ucs_status_string(st) : "out of memory");
        return st == UCS_OK ? KVD_ERR_NOMEM : KVD_ERR_UNAVAILABLE;
    }
    if (o->tl_allowed == NULL)
        return KVD_OK;
    char keep[512];
    bool useful = false;
    if (split_resources(o, u->resources, keep, sizeof(keep), &useful) == 0)
        return KVD_OK;
    ucp_cleanup(u->ctx);
    u->ctx = NULL;
    free(u->resources);
    u->resources = NULL;
    if (!useful)
        return KVD_ERR_UNSUPPORTED; /* the caller says why, with o->dropped */
    st = init_context(o, keep, &u->ctx);
    if (st == UCS_OK)
        u->resources = resources_of(u->ctx);
    if (st != UCS_OK || u->resources == NULL) {
        KVD_WARN("ucx", "UCX did not start on %s: %s", keep,
                 st != UCS_OK ? ucs_status_string(st) : "out of memory");
        return st == UCS_OK ? KVD_ERR_NOMEM : KVD_ERR_UNAVAILABLE;
    }
    /* UCX_TLS named only allowed ones: anything else now is UCX's doing */
    kvd_ucx_opts_t again = *o;
    again.dropped = NULL;
    if (split_resources(&again, u->resources, keep, sizeof(keep), &useful) != 0 ||
        !useful) {
        KVD_WARN("ucx", "UCX opened %s although UCX_TLS named only allowed transports",
                 u->resources);
        return KVD_ERR_UNSUPPORTED;
    }
    return KVD_OK;
}

int kvd_ucx_create_with(const kvd_ucx_opts_t *o, kvd_ucx_t **out)
{
    kvd_ucx_t *u = calloc(1, sizeof(*u));
    if (u == NULL)
        return KVD_ERR_NOMEM;
    bool wakeup = o->wakeup;
    u->efd = -1;
    int rc = open_context(o, u);
    if (rc != KVD_OK) {
        kvd_ucx_destroy(u);
        return rc;
    }
    ucs_status_t st = UCS_OK;
    /* the requests' ids are not guessable: a stranger that reaches this
     * worker cannot pass an answer of its own for one of ours */
    if (getrandom(&u->next_token, sizeof(u->next_token), GRND_NONBLOCK) !=
        sizeof(u->next_token))
        u->next_token = kvd_now_ns() * 0x9e3779b97f4a7c15ull;
    if (st == UCS_OK) {
        /* serialised by the caller: one thread drives a kvd_ucx_t at a
         * time (a linker's load and offload threads have one each) */
        ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                                  .thread_mode = UCS_THREAD_MODE_SERIALIZED};
        st = ucp_worker_create(u->ctx, &wp, &u->worker);
    }
    if (st == UCS_OK)
        st = ucp_worker_get_address(u->worker, &u->addr, &u->addr_len);
    if (st == UCS_OK && wakeup)
        st = ucp_worker_get_efd(u->worker, &u->efd);
    if (st == UCS_OK)
        st = set_handler(u, AM_ACK, on_ack);
    if (st == UCS_OK)
        st = set_handler(u, AM_DATA, on_data);
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
    /* answers still on their way must finish before the worker goes (UCX
     * asserts otherwise); bounded, then left to the process's exit */
    uint64_t deadline = kvd_now_ns() + 1000000000ull;
    while (u->worker != NULL && u->inflight != NULL && kvd_now_ns() < deadline)
        ucp_worker_progress(u->worker);
    /* a peer that stopped driving its worker never lets them finish: close
     * their endpoints, which cancels them */
    while (u->inflight != NULL) {
        ucp_ep_h ep = u->inflight->ep;
        close_ep_force(u, ep);
        /* every request on ep must be gone now: an endpoint is closed once
         * (one still listed anywhere means UCX did not cancel it: leave it
         * to the exit rather than close a freed endpoint again) */
        bool left = true;
        for (int i = 0; i < 1000 && left; i++) {
            ucp_worker_progress(u->worker);
            left = false;
            for (inflight_t *f = u->inflight; f && !left; f = f->next)
                left = f->ep == ep;
        }
        if (left)
            break;
    }
    grants_free(&u->grants);
    free(u->resources);
    u->resources = NULL;
    if (u->inflight != NULL) {
        KVD_WARN("ucx", "answers still in flight: UCX is left to the exit");
        free(u);
        return;
    }
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

#define STAGE_CHUNKS_MAX (KVD_UCX_STAGE_BYTES / KVD_UCX_STAGE_CHUNK)

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

/* Accounts one nbx call's result to the batch. The call was counted in
 * b->pending before it was made (op_done may run inside it, on a request
 * purged from a failed endpoint): a call that completed or failed at
 * once, with no callback to come, gives its count back here. */
static void batch_track(ucx_batch_t *b, ucs_status_ptr_t sp)
{
    if (UCS_PTR_IS_PTR(sp))
        return; /* op_done takes it off */
    if (UCS_PTR_IS_ERR(sp) && b->status == KVD_OK)
        b->status = status_from_ucs(UCS_PTR_STATUS(sp));
    b->pending--; /* never the last: the posting reference is held */
}

/* A free staging chunk, made on first use up to STAGE_CHUNKS_MAX; NULL
 * when all are in messages (the caller sends unstaged then). */
static stage_chunk_t *stage_take(ucx_transport_t *t)
{
    stage_chunk_t *c = t->stage_free;
    if (c != NULL) {
        t->stage_free = c->next;
        return c;
    }
    if (t->stage_chunks == STAGE_CHUNKS_MAX)
        return NULL;
    c = calloc(1, sizeof(*c));
    if (c != NULL)
        c->bytes = kvd_mem_calloc(KVD_MEM_STAGING, 1, KVD_UCX_STAGE_CHUNK);
    if (c == NULL || c->bytes == NULL) {
        free(c);
        return NULL;
    }
    t->stage_chunks++;
    return c;
}

static void stage_free_all(ucx_transport_t *t)
{
    for (stage_chunk_t *c = t->stage_free, *next; c; c = next) {
        next = c->next;
        kvd_mem_free(KVD_MEM_STAGING, c->bytes, KVD_UCX_STAGE_CHUNK);
        free(c);
        t->stage_chunks--;
    }
    t->stage_free = NULL;
}

/* Sends one message of batch b: k local ranges and their k segments of
 * the peer's region (total bytes), from `stage` when staged. */
static void send_message(ucx_transport_t *t, ucx_batch_t *b, kvd_xfer_dir_t dir,
                         ucp_dt_iov_t *local, am_req_hdr_t *hdr, size_t k, uint64_t total,
                         stage_chunk_t *stage)
{
    kvd_ucx_t *u = t->u;
    *hdr = (am_req_hdr_t){.magic = AM_MAGIC, .n = (uint32_t)k, .token = ++u->next_token};
    memcpy(hdr->cap, t->cap, sizeof(hdr->cap));
    am_msg_t *m = calloc(1, sizeof(*m));
    if (m == NULL) {
        free(local);
        free(hdr);
        if (stage != NULL) {
            stage->next = t->stage_free;
            t->stage_free = stage;
        }
        b->status = KVD_ERR_NOMEM;
        return;
    }
    *m = (am_msg_t){.b = b,
                    .read = dir == KVD_XFER_READ,
                    .token = hdr->token,
                    .refs = 2,
                    .n = k,
                    .total = total,
                    .local = local,
                    .hdr = hdr,
                    .stage = stage};
    m->prev = u->waiting_tail;
    if (u->waiting_tail)
        u->waiting_tail->next = m;
    else
        u->waiting = m;
    u->waiting_tail = m;
    b->pending++; /* released when both references are gone */
    ucp_request_param_t prm = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                        UCP_OP_ATTR_FIELD_FLAGS,
        .cb.send = msg_sent,
        .user_data = m,
        .flags = UCP_AM_SEND_FLAG_REPLY,
    };
    bool write = dir == KVD_XFER_WRITE;
    size_t count = 0;
    void *buf = write ? ranges_arg(&prm, local, k, &count) : NULL;
    ucs_status_ptr_t sp =
        ucp_am_send_nbx(t->ep, write ? AM_PUT : AM_GET, hdr,
                        sizeof(*hdr) + k * sizeof(am_seg_t), buf, count, &prm);
    if (UCS_PTR_IS_ERR(sp)) {
        int err = status_from_ucs(UCS_PTR_STATUS(sp));
        msg_answered(b, m, err); /* no answer will come */
        msg_release(m, err);
    } else if (sp == NULL) {
        msg_release(m, KVD_OK); /* sent at once */
    }
}

/* How many transfers from xfers[i] on follow each other in the peer's
 * region within one staging chunk (at least 1). */
static size_t adjacent_run(const kvd_xfer_t *xfers, size_t i, size_t n)
{
    uint64_t total = xfers[i].length;
    size_t j = i + 1;
    while (j < n &&
           xfers[j].remote_offset == xfers[j - 1].remote_offset + xfers[j - 1].length &&
           total + xfers[j].length <= KVD_UCX_STAGE_CHUNK) {
        total += xfers[j].length;
        j++;
    }
    return j - i;
}

/* Gathers xfers[i..i+k) (adjacent in the peer's region) into a staging
 * chunk and sends them as one message. False when no chunk is free or a
 * copy failed before anything was sent (b->status says which). */
static bool send_staged(ucx_transport_t *t, ucx_batch_t *b, const kvd_xfer_t *xfers,
                        size_t i, size_t k)
{
    stage_chunk_t *c = stage_take(t);
    if (c == NULL)
        return false;
    ucp_dt_iov_t *local = calloc(1, sizeof(*local));
    am_req_hdr_t *hdr = malloc(sizeof(*hdr) + sizeof(am_seg_t));
    uint64_t total = 0;
    kvd_kind_set_t kinds = {0};
    int rc = local != NULL && hdr != NULL ? KVD_OK : KVD_ERR_NOMEM;
    for (size_t j = i; rc == KVD_OK && j < i + k; j++) {
        const kvd_xfer_t *x = &xfers[j];
        if (!kvd_kind_set_add(&kinds, x->local->kind))
            rc = kvd_kind_set_sync(&kinds);
        if (rc == KVD_OK && !kvd_kind_set_add(&kinds, x->local->kind))
            rc = KVD_ERR_STATE; /* cannot happen: the set was just emptied */
        if (rc == KVD_OK)
            rc = x->local->kind->copy(x->local->kind, c->bytes + total,
                                      x->local->base + x->local_offset, x->length, false);
        /* the messages already on the wire move only when the worker is
         * driven: drive it each MiB staged */
        if ((total + x->length) >> 20 != total >> 20)
            ucp_worker_progress(t->u->worker);
        total += x->length;
    }
    if (rc == KVD_OK)
        rc = kvd_kind_set_sync(&kinds); /* the stage holds the bytes now */
    if (rc != KVD_OK) {
        free(local);
        free(hdr);
        c->next = t->stage_free;
        t->stage_free = c;
        b->status = rc;
        return false;
    }
    local[0] = (ucp_dt_iov_t){c->bytes, total};
    am_seg_t *segs = (am_seg_t *)(hdr + 1);
    segs[0] = (am_seg_t){xfers[i].remote_offset, total};
    send_message(t, b, KVD_XFER_WRITE, local, hdr, 1, total, c);
    return true;
}

/* Sends xfers[i] as messages of up to AM_MSG_MAX bytes, straight from
 * its local region. */
static void send_direct(ucx_transport_t *t, ucx_batch_t *b, kvd_xfer_dir_t dir,
                        const kvd_xfer_t *x)
{
    for (uint64_t done = 0; done < x->length && b->status == KVD_OK;) {
        uint64_t len = KVD_MIN(x->length - done, AM_MSG_MAX);
        ucp_dt_iov_t *local = calloc(1, sizeof(*local));
        am_req_hdr_t *hdr = malloc(sizeof(*hdr) + sizeof(am_seg_t));
        if (local == NULL || hdr == NULL) {
            free(local);
            free(hdr);
            b->status = KVD_ERR_NOMEM;
            return;
        }
        local[0] = (ucp_dt_iov_t){x->local->base + x->local_offset + done, len};
        am_seg_t *segs = (am_seg_t *)(hdr + 1);
        segs[0] = (am_seg_t){x->remote_offset + done, len};
        send_message(t, b, dir, local, hdr, 1, len, NULL);
        done += len;
    }
}

/* Message mode: a READ transfer is one AM_GET (split at AM_MSG_MAX); the
 * transfers of a WRITE batch that follow each other in the peer's region
 * go as one staged AM_PUT each run (one range per message, see
 * AM_SEGS_MAX), a lone one straight from its region. */
static void post_messages(ucx_transport_t *t, ucx_batch_t *b, kvd_xfer_dir_t dir,
                          const kvd_xfer_t *xfers, size_t n)
{
    if (dir == KVD_XFER_WRITE) {
        /* the regions' own writes are final before they are read */
        kvd_kind_set_t kinds = {0};
        for (size_t i = 0; b->status == KVD_OK && i < n; i++)
            if (!kvd_kind_set_add(&kinds, xfers[i].local->kind))
                b->status = kvd_kind_set_sync(&kinds);
        if (b->status == KVD_OK)
            b->status = kvd_kind_set_sync(&kinds);
    }
    for (size_t i = 0; i < n && b->status == KVD_OK;) {
        if (xfers[i].length == 0) {
            i++;
            continue;
        }
        size_t k = dir == KVD_XFER_WRITE ? adjacent_run(xfers, i, n) : 1;
        if (k > 1 && send_staged(t, b, xfers, i, k)) {
            i += k;
            continue;
        }
        if (b->status != KVD_OK)
            break;
        send_direct(t, b, dir, &xfers[i]);
        i++;
    }
}

static int ucx_post(kvd_transport_t *tt, kvd_xfer_dir_t dir, const kvd_xfer_t *xfers,
                    size_t n, uint64_t cookie)
{
    ucx_transport_t *t = (ucx_transport_t *)tt;
    if (t->ep == NULL || t->failed != UCS_OK)
        return KVD_ERR_CLOSED;
    ucx_batch_t *b = calloc(1, sizeof(*b));
    if (b == NULL ||
        kvd_done_ring_reserve(&t->done, t->done.len + t->outstanding + 1) != KVD_OK) {
        free(b);
        return KVD_ERR_NOMEM;
    }
    *b = (ucx_batch_t){.t = t, .cookie = cookie, .status = KVD_OK, .pending = 1};
    t->outstanding++;
    if (t->mode == KVD_UCX_MODE_AM) {
        post_messages(t, b, dir, xfers, n);
        batch_put(b); /* the posting reference */
        return KVD_OK;
    }
    for (size_t i = 0; i < n && b->status == KVD_OK; i++) {
        const kvd_xfer_t *x = &xfers[i];
        if (x->length == 0)
            continue;
        ucp_request_param_t prm = {
            .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                            UCP_OP_ATTR_FIELD_MEMH,
            .cb.send = op_done,
            .user_data = b,
            .memh = x->local->backend,
        };
        void *local = x->local->base + x->local_offset;
        uint64_t raddr = t->remote_base + x->remote_offset;
        b->pending++;
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
        b->pending++;
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
    unsigned n = ucp_worker_progress(t->u->worker);
    if (t->failed != UCS_OK && t->mode == KVD_UCX_MODE_AM)
        fail_waiting(t, KVD_ERR_CLOSED); /* no answer comes from a failed peer */
    return n;
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
static void ucx_disconnect(kvd_transport_t *tt)
{
    ucx_transport_t *t = (ucx_transport_t *)tt;
    if (t->rkey != NULL)
        ucp_rkey_destroy(t->rkey);
    t->rkey = NULL;
    if (t->ep == NULL)
        return;
    close_ep_force(t->u, t->ep);
    t->ep = NULL;
    fail_waiting(t, KVD_ERR_CLOSED);
    /* cancelled requests complete from progress; bounded so that a UCX
     * that never reports cannot hang the caller (the batches then leak
     * rather than be freed under a pending callback) */
    uint64_t deadline = kvd_now_ns() + 10ull * 1000000000ull;
    while (t->outstanding > 0 && kvd_now_ns() < deadline)
        ucp_worker_progress(t->u->worker);
    if (t->outstanding > 0)
        KVD_ERROR("ucx", "%zu batches still outstanding after the endpoint closed",
                  t->outstanding);
    t->failed = UCS_OK;
}

#define WIREUP_MS_DEFAULT 5000
/* Flushes the new endpoint, which completes its wire-up with the peer,
 * within timeout_ms. Connect returns only then: UCX 1.13's serving side
 * aborts when a client's worker goes away while their endpoints are still
 * wiring up (seen: a client that connected and was destroyed at once),
 * and a connected transport is one the peer has fully accepted. */
static ucs_status_t wire_up(ucx_transport_t *t, int timeout_ms)
{
    ucp_request_param_t prm = {0};
    ucs_status_ptr_t sp = ucp_ep_flush_nbx(t->ep, &prm);
    if (!UCS_PTR_IS_PTR(sp))
        return UCS_PTR_STATUS(sp);
    uint64_t ms = timeout_ms > 0 ? (uint64_t)timeout_ms : WIREUP_MS_DEFAULT;
    uint64_t deadline = kvd_now_ns() + ms * 1000000ull;
    ucs_status_t st;
    while ((st = ucp_request_check_status(sp)) == UCS_INPROGRESS &&
           kvd_now_ns() < deadline)
        ucp_worker_progress(t->u->worker);
    if (st == UCS_INPROGRESS) {
        ucp_request_cancel(t->u->worker, sp);
        if (!finish_request(t->u, sp))
            return UCS_ERR_TIMED_OUT;
        st = UCS_ERR_TIMED_OUT;
    }
    ucp_request_free(sp);
    return st;
}

static int ucx_connect(kvd_transport_t *tt, const kvd_peer_t *peer)
{
    ucx_transport_t *t = (ucx_transport_t *)tt;
    bool rma = peer->ucx.mode == KVD_UCX_MODE_RMA;
    /* RMA needs the region's rkey, the message mode a capability */
    if (peer->ucx.address == NULL || peer->ucx.address_len == 0 ||
        (peer->ucx.mode != KVD_UCX_MODE_RMA && peer->ucx.mode != KVD_UCX_MODE_AM) ||
        (rma && (peer->ucx.rkey == NULL || peer->ucx.rkey_len == 0)) ||
        (!rma && (peer->ucx.cap == NULL || peer->ucx.cap_len != KVD_UCX_CAP_BYTES)) ||
        (rma && !t->rma_ok))
        return KVD_ERR_INVALID;
    if (t->outstanding > 0)
        return KVD_ERR_STATE; /* a disconnect that could not finish: see above */
    t->mode = peer->ucx.mode;
    t->remote_base = peer->ucx.base;
    memset(t->cap, 0, sizeof(t->cap));
    if (!rma)
        memcpy(t->cap, peer->ucx.cap, sizeof(t->cap));
    t->failed = UCS_OK;
    ucp_ep_params_t ep = {
        .field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                      UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER,
        .address = peer->ucx.address,
        .err_mode = UCP_ERR_HANDLING_MODE_PEER,
        .err_handler = {.cb = ep_failed, .arg = t},
    };
    ucs_status_t st = ucp_ep_create(t->u->worker, &ep, &t->ep);
    if (st == UCS_OK && rma)
        st = ucp_ep_rkey_unpack(t->ep, peer->ucx.rkey, &t->rkey);
    if (st != UCS_OK) {
        /* UCX_TLS naming only transports that cannot report a dead peer
         * (1.13's posix and sysv) ends here: a UCX endpoint must, so that a
         * cancelled transfer never writes late */
        KVD_WARN("ucx",
                 "cannot reach the peer with failure detection: %s (UCX_TLS=%s: "
                 "none of these transports reaches it and reports a dead peer; "
                 "on the daemon's own host, the shm transport is the way)",
                 ucs_status_string(st), getenv("UCX_TLS") ? getenv("UCX_TLS") : "unset");
        ucx_disconnect(tt);
        return st == UCS_ERR_NO_MEMORY ? KVD_ERR_NOMEM : KVD_ERR_UNAVAILABLE;
    }
    st = wire_up(t, peer->connect_timeout_ms);
    if (st != UCS_OK) {
        KVD_WARN("ucx", "the peer's endpoint did not wire up: %s", ucs_status_string(st));
        ucx_disconnect(tt);
        return KVD_ERR_UNAVAILABLE;
    }
    return KVD_OK;
}

/* Maps a local region with UCX, so that its transfers use the handle
 * instead of registering on the fly. */
static int ucx_reg(kvd_transport_t *tt, kvd_region_t *r)
{
    ucx_transport_t *t = (ucx_transport_t *)tt;
    if (r->kind->async) {
        /* device memory: UCX here (Debian's 1.13) is built without CUDA
         * or ROCm, so it reads and writes host addresses only, and
         * staging device rows through pinned host memory on this path is
         * not built yet */
        KVD_WARN("ucx",
                 "a region of %s memory cannot move over UCX here (host memory only)",
                 r->kind->name);
        return KVD_ERR_UNSUPPORTED;
    }
    ucp_mem_map_params_t mp = {
        .field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH,
        .address = r->base,
        .length = r->length,
    };
    ucp_mem_h memh = NULL;
    ucs_status_t st = ucp_mem_map(t->u->ctx, &mp, &memh);
    if (st != UCS_OK) {
        KVD_WARN("ucx", "cannot map a local region of %llu bytes: %s",
                 (unsigned long long)r->length, ucs_status_string(st));
        return st == UCS_ERR_NO_MEMORY ? KVD_ERR_NOMEM : KVD_ERR_IO;
    }
    r->backend = memh;
    return KVD_OK;
}

static void ucx_dereg(kvd_transport_t *tt, kvd_region_t *r)
{
    ucx_transport_t *t = (ucx_transport_t *)tt;
    if (r->backend != NULL)
        ucp_mem_unmap(t->u->ctx, r->backend);
    r->backend = NULL;
}

static void ucx_destroy(kvd_transport_t *tt)
{
    ucx_transport_t *t = (ucx_transport_t *)tt;
    if (t->outstanding > 0)
        return; /* see ucx_disconnect: leaked on purpose */
    stage_free_all(t);
    kvd_done_ring_free(&t->done);
    kvd_ucx_destroy(t->u);
    free(t);
}

static const kvd_transport_ops_t ucx_ops = {
    .name = "ucx",
    .reg = ucx_reg,
    .dereg = ucx_dereg,
    .connect = ucx_connect,
    .disconnect = ucx_disconnect,
    .post = ucx_post,
    .poll = ucx_poll,
    .progress = ucx_progress,
    .destroy = ucx_destroy,
};

/* tl_allowed NULL: every transport UCX opens (tests and benchmarks with a
 * server of their own); else only those, and with rma only where every
 * one enforces the registration (KVD_ERR_UNSUPPORTED otherwise). */
static int open_ucx(const char *name, bool rma, bool (*tl_allowed)(const char *),
                    kvd_transport_t **out)
{
    if (out == NULL)
        return KVD_ERR_INVALID;
    ucx_transport_t *t = calloc(1, sizeof(*t));
    if (t == NULL)
        return KVD_ERR_NOMEM;
    char dropped[256] = "";
    const kvd_ucx_opts_t o = {.name = name != NULL ? name : "kvdock",
                              .rma = rma,
                              .tl_allowed = tl_allowed,
                              .dropped = dropped,
                              .dropped_cap = sizeof(dropped)};
    t->rma_ok = rma;
    int rc = kvd_ucx_create_with(&o, &t->u);
    char why[128] = "";
    if (rc == KVD_OK && rma && tl_allowed != NULL &&
        !kvd_ucx_rma_enforced(t->u, why, sizeof(why))) {
        kvd_ucx_destroy(t->u); /* UCX opened something else: never RMA there */
        rc = KVD_ERR_UNSUPPORTED;
    }
    if (rc != KVD_OK) {
        if (rc == KVD_ERR_UNSUPPORTED)
            KVD_INFO("ucx", "%s: no UCX transport %s here (left out: %s)", o.name,
                     rma ? "that enforces one-sided RMA's registration (rc, dc)"
                         : "that reaches another host",
                     dropped[0] ? dropped
                     : why[0]   ? why
                                : "none");
        free(t);
        return rc;
    }
    t->base.ops = &ucx_ops;
    *out = &t->base;
    return KVD_OK;
}

int kvd_transport_ucx_info(kvd_transport_t *t, const void **address, size_t *address_len,
                           char *resources, size_t resources_cap)
{
    if (t == NULL || t->ops != &ucx_ops)
        return KVD_ERR_INVALID;
    const ucx_transport_t *u = (const ucx_transport_t *)t;
    if (address != NULL && address_len != NULL)
        kvd_ucx_address(u->u, address, address_len);
    if (resources != NULL && resources_cap > 0)
        kvd_ucx_resources(u->u, resources, resources_cap);
    return KVD_OK;
}

int kvd_transport_open_ucx(const char *name, kvd_transport_t **out)
{
    return open_ucx(name, true, NULL, out);
}

int kvd_transport_open_ucx_mode(const char *name, kvd_ucx_mode_t mode,
                                kvd_transport_t **out)
{
    if (mode != KVD_UCX_MODE_RMA && mode != KVD_UCX_MODE_AM)
        return KVD_ERR_INVALID;
    return mode == KVD_UCX_MODE_RMA ? open_ucx(name, true, kvd_ucx_tl_enforces_rma, out)
                                    : open_ucx(name, false, kvd_ucx_tl_network, out);
}
