/*
 * linker.c - libkvdock's front: opening and closing (the connection, the
 * two data paths and their threads), device pool registration, lookups,
 * counters. The parts it sets up are listed in linker_int.h.
 */
#include "linker_int.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------ open/close */

/* Whether UCX will likely run RDMA here: an RDMA device, and UCX_TLS unset
 * or naming a verbs transport. */
static bool rdma_likely(void)
{
    bool dev = kvd_rdma_device_present();
    const char *tls = getenv("UCX_TLS");
    if (!dev || tls == NULL || tls[0] == '\0' || strcmp(tls, "all") == 0)
        return dev;
    /* "^a,b" is UCX's "all but a and b" */
    bool exclude = tls[0] == '^';
    static const char *const rdma[] = {"rc", "dc", "ud", "ib", "mlx", "verbs", "roce"};
    bool named = false;
    for (size_t i = 0; i < KVD_ARRAY_SIZE(rdma); i++)
        named |= strstr(tls, rdma[i]) != NULL;
    return exclude ? !named : named;
}

static int choose_ucx_mode(const char *m, kvd_ucx_mode_t *out)
{
    if (m == NULL || m[0] == '\0' || strcmp(m, "auto") == 0)
        *out = rdma_likely() ? KVD_UCX_MODE_RMA : KVD_UCX_MODE_AM;
    else if (strcmp(m, "rma") == 0)
        *out = KVD_UCX_MODE_RMA;
    else if (strcmp(m, "am") == 0)
        *out = KVD_UCX_MODE_AM;
    else
        return KVD_ERR_INVALID;
    return KVD_OK;
}

/* Frees what kvd_register_pool made for p. */
static void pool_free(kvd_linker_t *l, lpool_t *p)
{
    for (int d = 0; d < LK_DP_COUNT; d++)
        lk_dp_unregister(&l->dp[d], p);
    free(p->layers);
    free(p->layer_off);
    free(p->buffer0);
}

static void linker_free(kvd_linker_t *l);

KVD_API int kvd_linker_open(const kvd_linker_config_t *config, kvd_linker_t **out)
{
    lk_clear_last_error();
    if (config == NULL || out == NULL)
        return KVD_ERR_INVALID;
    kvd_linker_t *l = calloc(1, sizeof(*l));
    if (l == NULL)
        return KVD_ERR_NOMEM;
    l->cfg = *config;
    if (config->socket_path)
        kvd_strlcpy(l->socket_path, config->socket_path, sizeof(l->socket_path));
    else
        kvd_default_socket_path("default", l->socket_path, sizeof(l->socket_path));
    if (config->connect)
        kvd_strlcpy(l->connect, config->connect, sizeof(l->connect));
    kvd_strlcpy(l->client_name, config->client_name ? config->client_name : "libkvdock",
                sizeof(l->client_name));
    kvd_strlcpy(l->model_id, config->model_id ? config->model_id : "model",
                sizeof(l->model_id));
    /* the caller's strings need not outlive this call */
    l->cfg.socket_path = l->socket_path;
    l->cfg.connect = l->connect[0] ? l->connect : NULL;
    l->cfg.client_name = l->client_name;
    l->cfg.model_id = l->model_id;
    l->cfg.transport = NULL;
    l->cfg.ucx_mode = NULL;
    l->cfg.tp_size = config->tp_size > 0 ? config->tp_size : 1;
    l->cfg.pp_size = config->pp_size > 0 ? config->pp_size : 1;
    l->cfg.cp_size = config->cp_size > 0 ? config->cp_size : 1;
    /* a rank names one of size ranks: another would share (or invent) a
     * namespace of another rank's KV */
    if (l->cfg.tp_rank < 0 || l->cfg.tp_rank >= l->cfg.tp_size || l->cfg.pp_rank < 0 ||
        l->cfg.pp_rank >= l->cfg.pp_size || l->cfg.cp_rank < 0 ||
        l->cfg.cp_rank >= l->cfg.cp_size) {
        free(l);
        return KVD_ERR_INVALID;
    }
    l->cfg.layer_group_size = config->layer_group_size > 0 ? config->layer_group_size : 1;
    l->timeout_ms = config->timeout_ms > 0 ? config->timeout_ms : 5000;
    l->spin_ns = config->spin_us == 0  ? 1000000u
                 : config->spin_us < 0 ? 0
                                       : (uint64_t)config->spin_us * 1000u;
    l->next_counter = 1;
    l->next_ack = 1;
    /* shm when the daemon shares this host (a Unix socket), UCX otherwise;
     * KVDOCK_TRANSPORT chooses when the config does not */
    const char *tr = config->transport ? config->transport : getenv("KVDOCK_TRANSPORT");
    int rc = KVD_OK;
    if (tr == NULL || tr[0] == '\0' || strcmp(tr, "auto") == 0)
        l->use_ucx = l->connect[0] != '\0';
    else if (strcmp(tr, "ucx") == 0)
        l->use_ucx = true;
    else if (strcmp(tr, "shm") == 0 && l->connect[0] == '\0')
        l->use_ucx = false;
    else
        rc = KVD_ERR_INVALID; /* unknown, or shm to a daemon over TCP */
    if (rc == KVD_OK)
        rc = choose_ucx_mode(config->ucx_mode ? config->ucx_mode
                                              : getenv("KVDOCK_UCX_MODE"),
                             &l->ucx_mode);
    l->cfg.auth_token_file = NULL; /* the bytes are kept, not the caller's path */
    if (rc == KVD_OK) {
        char why[512];
        rc = kvd_client_token_read(config->auth_token_file, l->auth_token,
                                   sizeof(l->auth_token), &l->auth_token_len, why,
                                   sizeof(why));
        if (rc != KVD_OK) {
            KVD_ERROR("linker", "auth_token_file: %s", why);
            lk_set_last_error("auth_token_file: %s", why);
        }
    }
    if (rc != KVD_OK) {
        explicit_bzero(l->auth_token, sizeof(l->auth_token));
        free(l);
        return rc;
    }
    lk_mutex_init(&l->lock, LK_RANK_LOCK);
    pthread_cond_init(&l->cond, NULL);
    pthread_cond_init(&l->jobs_cond, NULL);
    lk_conn_init(l);
    for (int d = 0; rc == KVD_OK && d < LK_DP_COUNT; d++)
        rc = lk_dp_open(l, &l->dp[d], d);
    if (rc == KVD_OK)
        rc = lk_conn_open(l);
    /* both data paths reach the daemon now, so that one that cannot (a
     * UCX transport that fails to wire up) fails the open with its reason
     * instead of every later load and offload */
    for (int d = 0; rc == KVD_OK && d < LK_DP_COUNT; d++) {
        if (lk_dp_begin(l, &l->dp[d]) == 0)
            rc = l->dp[d].error;
        lk_dp_end(l, &l->dp[d]);
    }
    if (rc == KVD_OK) {
        l->thread_started = pthread_create(&l->thread, NULL, lk_load_thread_main, l) == 0;
        l->off_thread_started =
            l->thread_started &&
            pthread_create(&l->off_thread, NULL, lk_offload_thread_main, l) == 0;
        rc = l->off_thread_started ? KVD_OK : KVD_ERR_NOMEM;
    }
    if (rc != KVD_OK) {
        linker_free(l);
        return rc;
    }
    *out = l;
    return KVD_OK;
}

/* What kvd_linker_close does, without clearing this thread's reason: a
 * failed open frees its handle through it and keeps why it failed. */
static void linker_free(kvd_linker_t *l)
{
    if (l == NULL)
        return;
    lk_lock(&l->lock);
    l->stop = true;
    atomic_fetch_add(&l->kick, 1); /* a thread polling for a start stops too */
    pthread_cond_broadcast(&l->cond);
    pthread_cond_broadcast(&l->jobs_cond);
    lk_unlock(&l->lock);
    if (l->thread_started)
        pthread_join(l->thread, NULL);
    if (l->off_thread_started)
        pthread_join(l->off_thread, NULL);
    /* what is left completes as failed, then is freed */
    lk_loads_fail_pending(l);
    lk_offloads_fail_pending(l);
    for (lbatch_t *b = l->batches, *next; b != NULL; b = next) {
        next = b->next;
        free(b->layer_ids);
        free(b);
    }
    lk_queue_free(&l->done_loads);
    lk_queue_free(&l->done_offloads);
    /* the transports go before the memory they use: the pools' buffers
     * (the engine's) and the peer (the mapping) */
    for (uint32_t i = 0; i < l->n_pools; i++)
        pool_free(l, &l->pools[i]);
    for (int d = 0; d < LK_DP_COUNT; d++)
        lk_dp_close(&l->dp[d]);
    lk_conn_close(l);
    pthread_cond_destroy(&l->cond);
    pthread_cond_destroy(&l->jobs_cond);
    lk_mutex_destroy(&l->lock);
    explicit_bzero(l->auth_token, sizeof(l->auth_token));
    free(l);
}

KVD_API void kvd_linker_close(kvd_linker_t *l)
{
    lk_clear_last_error();
    linker_free(l);
}

KVD_API int kvd_linker_health(kvd_linker_t *l, kvd_linker_health_t *state,
                              uint64_t *pool_bytes)
{
    lk_clear_last_error();
    if (l == NULL)
        return KVD_ERR_INVALID;
    kvd_msg_t req, rep;
    kvd_msg_request(&req, 0, KVD_METHOD_HEALTH);
    int rc = lk_call(l, &req, &rep);
    if (rc == KVD_OK) {
        if (state)
            *state = (kvd_linker_health_t)rep.body.health_rep.state;
        if (pool_bytes)
            *pool_bytes = rep.body.health_rep.pool_bytes;
    }
    kvd_msg_clear(&rep);
    return rc;
}

/* ----------------------------------------------------------------- pools */

/* model/pool/rank-suffix: what keeps models, pools and ranks apart. A
 * rank-replicated pool is the same on every TP rank: no tp in its name. */
static void ns_name_of(const kvd_linker_t *l, const kvd_pool_desc_t *d, char *out,
                       size_t len)
{
    char suffix[64] = "";
    size_t n = 0;
    if (!d->rank_replicated)
        n += (size_t)snprintf(suffix + n, sizeof(suffix) - n, "tp%d", l->cfg.tp_rank);
    else
        n += (size_t)snprintf(suffix + n, sizeof(suffix) - n, "rep");
    if (l->cfg.cp_size > 1)
        n += (size_t)snprintf(suffix + n, sizeof(suffix) - n, ".cp%d", l->cfg.cp_rank);
    if (l->cfg.pp_size > 1)
        snprintf(suffix + n, sizeof(suffix) - n, ".pp%d", l->cfg.pp_rank);
    snprintf(out, len, "%s/%s/%s", l->model_id, d->name, suffix);
}

static int check_desc(const kvd_pool_desc_t *d)
{
    if (d == NULL || d->name == NULL || d->name[0] == '\0' || strlen(d->name) >= 64 ||
        (d->addressing != KVD_ADDR_PAGED && d->addressing != KVD_ADDR_SLOT) ||
        (d->addressing == KVD_ADDR_PAGED && d->page_size == 0) || d->n_rows == 0 ||
        d->n_layers == 0 || d->layers == NULL)
        return KVD_ERR_INVALID;
    if (d->memory != KVD_MEM_HOST && d->memory != KVD_MEM_CUDA &&
        d->memory != KVD_MEM_HIP) {
        lk_set_last_error("memory kind %d is not one of kvdock.h's", (int)d->memory);
        return KVD_ERR_UNSUPPORTED;
    }
    for (uint32_t i = 0; i < d->n_layers; i++) {
        const kvd_pool_layer_t *ly = &d->layers[i];
        if (ly->n_buffers == 0 || ly->n_buffers > KVD_MAX_POOL_BUFFERS)
            return KVD_ERR_INVALID;
        for (uint32_t b = 0; b < ly->n_buffers; b++)
            if (ly->buffers[b].base == NULL || ly->buffers[b].bytes_per_row == 0 ||
                ly->buffers[b].row_stride < ly->buffers[b].bytes_per_row)
                return KVD_ERR_INVALID;
        /* a layer once per pool: a layer's wait and its place in the
         * object must name one layer (two pools may share one: a layer's
         * KV and its indexer) */
        for (uint32_t k = 0; k < i; k++)
            if (d->layers[k].layer_id == ly->layer_id)
                return KVD_ERR_INVALID;
    }
    return KVD_OK;
}

/*
 * A device pool's buffers, checked with its runtime: each is device memory
 * of that runtime, its rows lie within the allocation it starts in, and
 * all are on one device (p->ordinal). Loads the runtime first.
 */
static int check_device_buffers(lpool_t *p)
{
    char why[256] = "";
    p->rt = p->desc.memory == KVD_MEM_CUDA ? KVD_GPU_CUDA : KVD_GPU_HIP;
    const char *rt_name = kvd_gpu_name(p->rt);
    int rc = kvd_gpu_load(p->rt, why, sizeof(why));
    if (rc != KVD_OK) {
        lk_set_last_error("pool '%s': %s", p->name, why);
        return rc;
    }
    p->ordinal = -1;
    for (uint32_t i = 0; i < p->desc.n_layers; i++)
        for (uint32_t b = 0; b < p->layers[i].n_buffers; b++) {
            const kvd_pool_buffer_t *buf = &p->layers[i].buffers[b];
            kvd_gpu_pointer_t at;
            rc = kvd_gpu_pointer(p->rt, buf->base, &at, why, sizeof(why));
            if (rc != KVD_OK) {
                lk_set_last_error("pool '%s': %s", p->name, why);
                return rc;
            }
            uint64_t extent = lk_buffer_extent(&p->desc, buf);
            uintptr_t base = (uintptr_t)buf->base;
            const char *wrong = NULL;
            int ordinal = at.ordinal;
            if (!at.device)
                wrong = "is not device memory (a host pointer, or another runtime's)";
            else if (p->ordinal >= 0 && at.ordinal != p->ordinal)
                wrong = "lies on another device than the pool's first buffer";
            /* the rows must lie in device memory to their end: walked range
             * by range, since memory mapped piece by piece (cuMemMap, as
             * PyTorch's expandable segments do) is one range per piece */
            uintptr_t end = base + extent;
            for (unsigned hops = 0; wrong == NULL && at.alloc_len > 0; hops++) {
                bool pieces = at.pieces;
                uintptr_t range_end = at.alloc_base + at.alloc_len;
                if (base < at.alloc_base && hops == 0) {
                    wrong = "has rows past the end of the allocation it lies in";
                    break; /* a runtime that says so */
                }
                if (range_end >= end)
                    break;
                if (!pieces) {
                    wrong = "has rows past the end of the allocation it lies in";
                    break;
                }
                rc = kvd_gpu_pointer(p->rt, (const void *)range_end, &at, why,
                                     sizeof(why));
                if (rc != KVD_OK) {
                    lk_set_last_error("pool '%s': %s", p->name, why);
                    return rc;
                }
                if (!at.device || !at.pieces || at.ordinal != ordinal ||
                    at.alloc_base != range_end || at.alloc_len == 0 || hops >= 1u << 20)
                    wrong = "has rows past the end of the allocation it lies in";
            }
            if (wrong != NULL) {
                lk_set_last_error(
                    "pool '%s' layer %u buffer %u (%p, %llu bytes of rows) %s %s",
                    p->name, p->layers[i].layer_id, b, buf->base,
                    (unsigned long long)extent, rt_name, wrong);
                return KVD_ERR_NOT_DEVICE;
            }
            p->ordinal = ordinal;
        }
    return KVD_OK;
}

/* Sets the kind p's buffers are copied through on each data path: the
 * host kind, or the data path's own kind for p's device. */
static int pool_kinds(kvd_linker_t *l, lpool_t *p)
{
    if (p->desc.memory == KVD_MEM_HOST) {
        for (int d = 0; d < LK_DP_COUNT; d++)
            p->kinds[d] = kvd_memkind_host();
        return KVD_OK;
    }
    int rc = check_device_buffers(p);
    for (int d = 0; rc == KVD_OK && d < LK_DP_COUNT; d++) {
        char why[256] = "";
        rc = lk_dp_device_kind(&l->dp[d], p->rt, p->ordinal, &p->kinds[d], why,
                               sizeof(why));
        if (rc != KVD_OK)
            lk_set_last_error("pool '%s': %s", p->name, why);
    }
    return rc;
}

/* Fills p's layout: each layer's place in an object, each buffer's index
 * among the pool's regions, the object's size. KVD_ERR_INVALID when no
 * object can be that large. */
static int pool_layout(lpool_t *p)
{
    p->layer_off = calloc(p->desc.n_layers, sizeof(*p->layer_off));
    p->buffer0 = calloc(p->desc.n_layers, sizeof(*p->buffer0));
    if (p->layer_off == NULL || p->buffer0 == NULL)
        return KVD_ERR_NOMEM;
    for (uint32_t i = 0; i < p->desc.n_layers; i++) {
        p->layer_off[i] = p->object_bytes;
        p->buffer0[i] = p->n_buffers;
        p->n_buffers += p->layers[i].n_buffers;
        for (uint32_t b = 0; b < p->layers[i].n_buffers; b++) {
            uint64_t bytes;
            if (__builtin_mul_overflow((uint64_t)p->rows,
                                       (uint64_t)p->layers[i].buffers[b].bytes_per_row,
                                       &bytes) ||
                __builtin_add_overflow(p->object_bytes, bytes, &p->object_bytes))
                return KVD_ERR_INVALID;
        }
    }
    return KVD_OK;
}

/* Registers p's namespace with the daemon and lists p (*pool_id). The id
 * belongs to the connection that gave it: if another thread reconnected
 * in between (its Hello did not list this pool yet), the new connection
 * is asked again. */
static int pool_add(kvd_linker_t *l, lpool_t *p, uint32_t *pool_id, uint64_t deadline)
{
    kvd_ns_spec_t spec = {.object_bytes = p->object_bytes,
                          .rank_replicated = p->desc.rank_replicated};
    kvd_strlcpy(spec.name, p->ns_name, sizeof(spec.name));
    int rc = KVD_ERR_CLOSED; /* the connection kept changing under us */
    for (int attempt = 0; attempt < 3; attempt++) {
        kvd_msg_t req, rep;
        kvd_msg_request(&req, 0, KVD_METHOD_REGISTER_NAMESPACE);
        req.body.register_req.n = 1;
        req.body.register_req.namespaces = &spec;
        uint64_t epoch = 0;
        rc = lk_call_ex(l, &req, &rep, 0, &epoch, deadline);
        if (rc == KVD_OK && rep.body.register_rep.n != 1)
            rc = KVD_ERR_PROTOCOL;
        if (rc == KVD_OK)
            p->ns_id = rep.body.register_rep.ids[0];
        kvd_msg_clear(&rep);
        if (rc != KVD_OK)
            return rc; /* a conflicting size is refused there */
        rc = lk_conn_add_pool(l, epoch, p, pool_id, deadline);
        if (rc != KVD_ERR_CLOSED)
            return rc;
    }
    return rc;
}

KVD_API int kvd_register_pool(kvd_linker_t *l, const kvd_pool_desc_t *desc,
                              uint32_t *pool_id)
{
    lk_clear_last_error();
    if (l == NULL || pool_id == NULL)
        return KVD_ERR_INVALID;
    uint64_t deadline = lk_deadline(l); /* the whole call, its round trips included */
    int rc = check_desc(desc);
    if (rc != KVD_OK)
        return rc;
    lpool_t p = {0};
    p.desc = *desc;
    p.rows = desc->addressing == KVD_ADDR_PAGED ? desc->page_size : 1;
    p.layers = calloc(desc->n_layers, sizeof(*p.layers));
    if (p.layers == NULL)
        return KVD_ERR_NOMEM;
    memcpy(p.layers, desc->layers, desc->n_layers * sizeof(*p.layers));
    p.desc.layers = p.layers;
    kvd_strlcpy(p.name, desc->name, sizeof(p.name));
    p.desc.name = NULL; /* points into the listed entry once added */
    ns_name_of(l, desc, p.ns_name, sizeof(p.ns_name));
    rc = pool_layout(&p);
    if (rc == KVD_OK)
        rc = pool_kinds(l, &p);
    /* every buffer a region of each data path before any transfer names it */
    for (int d = 0; rc == KVD_OK && d < LK_DP_COUNT; d++)
        rc = lk_dp_register(&l->dp[d], &p);
    if (rc == KVD_OK)
        rc = pool_add(l, &p, pool_id, deadline);
    if (rc != KVD_OK) {
        pool_free(l, &p);
        return rc;
    }
    if (p.rt != 0)
        lk_conn_pin(l, p.rt, p.ordinal); /* the store's pool, for DMA */
    return KVD_OK;
}

/* A registered pool, or NULL; entries never move once added. */
static lpool_t *pool_of(kvd_linker_t *l, uint32_t pool_id)
{
    lk_lock(&l->lock);
    lpool_t *p = pool_id < l->n_pools ? &l->pools[pool_id] : NULL;
    lk_unlock(&l->lock);
    return p;
}

KVD_API int kvd_pool_info(kvd_linker_t *l, uint32_t pool_id, uint64_t *object_bytes,
                          char *ns_name, size_t ns_name_len)
{
    lk_clear_last_error();
    const lpool_t *p = l ? pool_of(l, pool_id) : NULL;
    if (p == NULL)
        return KVD_ERR_INVALID;
    if (object_bytes)
        *object_bytes = p->object_bytes;
    if (ns_name && ns_name_len)
        kvd_strlcpy(ns_name, p->ns_name, ns_name_len);
    return KVD_OK;
}

KVD_API int kvd_stats(kvd_linker_t *l, uint32_t pool_id, kvd_pool_stats_t *out)
{
    lk_clear_last_error();
    lpool_t *p = l && out ? pool_of(l, pool_id) : NULL;
    if (p == NULL)
        return KVD_ERR_INVALID;
    out->lookup_hit_pages = atomic_load(&p->lookup_hit_pages);
    out->load_bytes = atomic_load(&p->load_bytes);
    out->offload_bytes = atomic_load(&p->offload_bytes);
    out->load_failures = atomic_load(&p->load_failures);
    out->offload_failures = atomic_load(&p->offload_failures);
    out->memory = p->desc.memory;
    out->pinned = p->rt != 0 && lk_conn_pinned(l, p->rt);
    out->dma_bytes = atomic_load(&p->dma_bytes);
    out->bounce_bytes = atomic_load(&p->bounce_bytes);
    return KVD_OK;
}

/* ---------------------------------------------------------------- lookup */

/* The pools of a Lookup's requests: msgs[j] is of transfer ti[j]. */
typedef struct lookup_ctx {
    const kvd_transfer_t *t;
    kvd_lookup_pool_msg_t *msgs;
    const uint32_t *ti;
    size_t n_msgs;
} lookup_ctx_t;

/* The namespace of each message's pool (lk_call_ns). */
static void fill_lookup_ns(kvd_linker_t *l, void *ctx, kvd_msg_t *reqs, size_t n)
{
    const lookup_ctx_t *c = ctx;
    (void)reqs;
    (void)n;
    for (size_t j = 0; j < c->n_msgs; j++)
        c->msgs[j].ns = l->pools[c->t[c->ti[j]].pool_id].ns_id;
}

/*
 * A lookup of more keys than one request may carry (lk_batch_limit): the
 * daemon computes runs of present pages inside one request only, so a
 * boundary past the first request could not be judged there. Instead each
 * pool's keys go in pieces asking TRAILING_PAGES(1), whose boundaries are
 * exactly the pages present, all in one round trip; the boundaries are
 * then judged here by the store's rule (DESIGN.md section 5): b is
 * restorable in a pool when the run of present pages ending at page b-1
 * is at least b long (ALL_PAGES) or min(n, b) long (TRAILING_PAGES(n)).
 */
static int lookup_split(kvd_linker_t *l, const kvd_transfer_t *t, size_t n, size_t n_min,
                        size_t limit, const uint32_t *trailing, uint64_t deadline,
                        uint32_t *boundaries, size_t *n_boundaries)
{
    size_t per = (n_min + limit - 1) / limit, n_req = n * per;
    kvd_msg_t *req = calloc(2 * n_req, sizeof(*req)), *rep = req + n_req;
    kvd_lookup_pool_msg_t *msgs = calloc(n_req, sizeof(*msgs));
    uint32_t *ti = calloc(n_req, sizeof(*ti));
    uint8_t *present = calloc(n_min, 1), *ok = malloc(n_min);
    int rc = req && msgs && ti && present && ok ? KVD_OK : KVD_ERR_NOMEM;
    for (size_t i = 0, j = 0; rc == KVD_OK && i < n; i++)
        for (size_t s = 0; s < n_min; s += limit, j++) {
            ti[j] = (uint32_t)i;
            msgs[j] = (kvd_lookup_pool_msg_t){.trailing_pages = 1,
                                              .n_keys = KVD_MIN(limit, n_min - s),
                                              .keys = (kvd_key_t *)t[i].keys + s};
            kvd_msg_request(&req[j], 0, KVD_METHOD_LOOKUP);
            req[j].body.lookup_req = (kvd_lookup_req_t){.n_pools = 1, .pools = &msgs[j]};
        }
    if (rc == KVD_OK) {
        lookup_ctx_t ctx = {.t = t, .msgs = msgs, .ti = ti, .n_msgs = n_req};
        rc = lk_call_ns(l, fill_lookup_ns, &ctx, req, rep, n_req, NULL, deadline);
    }
    if (rc == KVD_OK)
        memset(ok, 1, n_min);
    for (size_t i = 0; rc == KVD_OK && i < n; i++) {
        memset(present, 0, n_min);
        for (size_t c = 0; rc == KVD_OK && c < per; c++) {
            const kvd_msg_t *r = &rep[i * per + c];
            size_t s = c * limit, len = KVD_MIN(limit, n_min - s);
            rc = r->status;
            for (size_t k = 0; rc == KVD_OK && k < r->body.lookup_rep.n; k++) {
                uint32_t b = r->body.lookup_rep.boundaries[k];
                if (b == 0 || b > len)
                    rc = KVD_ERR_PROTOCOL;
                else
                    present[s + b - 1] = 1;
            }
        }
        uint32_t len = 0;
        for (size_t k = 0; rc == KVD_OK && k < n_min; k++) {
            len = present[k] ? len + 1 : 0;
            uint32_t b = (uint32_t)k + 1;
            uint32_t need = trailing[i] == 0 ? b : KVD_MIN(trailing[i], b);
            ok[k] &= len >= need;
        }
    }
    size_t m = 0;
    for (size_t k = 0; rc == KVD_OK && k < n_min; k++)
        if (ok[k])
            boundaries[m++] = (uint32_t)k + 1;
    if (rc == KVD_OK)
        *n_boundaries = m;
    for (size_t j = 0; rep != NULL && j < n_req; j++)
        kvd_msg_clear(&rep[j]);
    free(req);
    free(msgs);
    free(ti);
    free(present);
    free(ok);
    return rc;
}

KVD_API int kvd_lookup(kvd_linker_t *l, uint64_t rid, const kvd_transfer_t *t, size_t n,
                       uint32_t *boundaries, size_t *n_boundaries)
{
    lk_clear_last_error();
    (void)rid;
    if (l == NULL || t == NULL || n == 0 || n > KVD_LOOKUP_POOLS_MAX ||
        boundaries == NULL || n_boundaries == NULL)
        return KVD_ERR_INVALID;
    uint64_t deadline = lk_deadline(l);
    int rc = KVD_OK;
    /* the daemon looks at the first n_min keys of each pool: only those go */
    size_t n_min = SIZE_MAX;
    uint32_t trailing[KVD_LOOKUP_POOLS_MAX], ti[KVD_LOOKUP_POOLS_MAX];
    kvd_lookup_pool_msg_t pools[KVD_LOOKUP_POOLS_MAX];
    lk_lock(&l->lock);
    for (size_t i = 0; i < n && rc == KVD_OK; i++) {
        if (t[i].pool_id >= l->n_pools || (t[i].keys == NULL && t[i].n_keys > 0)) {
            rc = KVD_ERR_INVALID;
            break;
        }
        trailing[i] = l->pools[t[i].pool_id].desc.trailing_pages;
        n_min = KVD_MIN(n_min, t[i].n_keys);
    }
    lk_unlock(&l->lock);
    if (rc != KVD_OK)
        return rc;
    /* one request carries n_min keys of each of the n pools: its frame
     * holds all of them (split, each piece asks one pool) */
    if (n_min > lk_batch_limit(l, n * KVD_KEY_BYTES))
        rc = lookup_split(l, t, n, n_min, lk_batch_limit(l, KVD_KEY_BYTES), trailing,
                          deadline, boundaries, n_boundaries);
    else {
        for (size_t i = 0; i < n; i++) {
            ti[i] = (uint32_t)i;
            pools[i] = (kvd_lookup_pool_msg_t){.trailing_pages = trailing[i],
                                               .n_keys = n_min,
                                               .keys = (kvd_key_t *)t[i].keys};
        }
        kvd_msg_t req, rep;
        kvd_msg_request(&req, 0, KVD_METHOD_LOOKUP);
        req.body.lookup_req.n_pools = n;
        req.body.lookup_req.pools = pools;
        lookup_ctx_t ctx = {.t = t, .msgs = pools, .ti = ti, .n_msgs = n};
        rc = lk_call_ns(l, fill_lookup_ns, &ctx, &req, &rep, 1, NULL, deadline);
        rc = rc == KVD_OK ? rep.status : rc;
        if (rc == KVD_OK) {
            const kvd_lookup_rep_t *r = &rep.body.lookup_rep;
            /* each boundary in 1..n_min, increasing (what the engine
             * indexes its keys with): anything else is the daemon's
             * error, not a hit (found by fuzz/fuzz_linker.c) */
            bool ok = r->n <= n_min;
            for (size_t i = 0; ok && i < r->n; i++)
                ok = r->boundaries[i] >= 1 && r->boundaries[i] <= n_min &&
                     (i == 0 || r->boundaries[i] > r->boundaries[i - 1]);
            if (!ok) {
                rc = KVD_ERR_PROTOCOL;
            } else {
                memcpy(boundaries, r->boundaries, r->n * sizeof(uint32_t));
                *n_boundaries = r->n;
            }
        }
        kvd_msg_clear(&rep);
    }
    if (rc == KVD_OK) {
        uint32_t longest = *n_boundaries ? boundaries[*n_boundaries - 1] : 0;
        for (size_t i = 0; i < n; i++)
            atomic_fetch_add(&l->pools[t[i].pool_id].lookup_hit_pages, longest);
    }
    return rc;
}

/* ----------------------------------------------------------------- misc */

KVD_API int kvd_page_keys(const uint32_t *tokens, size_t n_tokens, size_t page_size,
                          const uint8_t *prior, uint8_t (*keys)[KVD_PAGE_KEY_BYTES],
                          size_t *n_keys)
{
    lk_clear_last_error();
    if (keys == NULL || n_keys == NULL)
        return KVD_ERR_INVALID;
    return kvd_key_chain(tokens, n_tokens, page_size, prior, keys, n_keys);
}

static _Thread_local char last_error[KVD_ERROR_MAX + 64];

void lk_clear_last_error(void)
{
    last_error[0] = '\0';
}

void lk_set_last_error(const char *fmt, ...)
{
    if (last_error[0])
        return; /* the first reason is the cause; later ones follow from it */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof(last_error), fmt, ap);
    va_end(ap);
}

KVD_API const char *kvd_last_error(void)
{
    return last_error;
}

KVD_API const char *kvd_strerror(int status)
{
    return kvd_status_str(status);
}

KVD_API const char *kvd_version(void)
{
    return KVD_VERSION;
}
