/*
 * linker.c - libkvdock's front: opening and closing, the daemon connection
 * (Hello with the pool's descriptor, mapping the pool, reconnecting after
 * the daemon went away), device pool registration, lookups, counters.
 * The load protocol is in load.c, the transfer threads in transfer.c.
 */
#include "linker_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

/* ---------------------------------------------------------- connection */

/* Unmaps the pool and closes the UCX endpoint; caller holds nothing
 * (takes the map write lock). */
static void unmap_pool(kvd_linker_t *l)
{
    pthread_rwlock_wrlock(&l->map);
    if (l->pool_map != NULL)
        munmap(l->pool_map, l->pool_bytes);
    l->pool_map = NULL;
    l->pool_bytes = 0;
    kvd_transport_destroy(l->xport);
    l->xport = NULL;
    pthread_rwlock_unlock(&l->map);
}

#define POPULATE_CHUNK (16ull << 20)

/* Write-populates the pool mapping, a chunk at a time under the map read
 * lock (copies go on; a reconnection waits one chunk at most), starting
 * over when the mapping is replaced, until the current one is done. */
static void *populate_main(void *arg)
{
    kvd_linker_t *l = arg;
    uint64_t epoch = 0, off = 0;
    for (;;) {
        /* a reconnection waiting for the write lock goes first (readers
         * are preferred, and this one comes back at once) */
        while (atomic_load(&l->remapping) != 0) {
            struct timespec ts = {0, 1000000};
            nanosleep(&ts, NULL);
        }
        pthread_rwlock_rdlock(&l->map);
        if (atomic_load(&l->epoch) != epoch) {
            epoch = atomic_load(&l->epoch);
            off = 0;
        }
        bool more = l->pool_map != NULL && off < l->pool_bytes;
        if (more) {
            uint64_t n = KVD_MIN(POPULATE_CHUNK, l->pool_bytes - off);
            madvise(l->pool_map + off, n, MADV_POPULATE_WRITE);
            off += n;
        }
        pthread_rwlock_unlock(&l->map);
        pthread_mutex_lock(&l->lock);
        bool done = l->stop || (!more && atomic_load(&l->epoch) == epoch);
        if (done)
            l->pop_running = false;
        pthread_mutex_unlock(&l->lock);
        if (done)
            return NULL;
    }
}

/* Has the populating thread (re)start on the current mapping; best effort:
 * without it, pages map in on first use. */
static void populate_in_background(kvd_linker_t *l)
{
    pthread_mutex_lock(&l->lock);
    if (!l->pop_running && !l->stop) {
        if (l->pop_started)
            pthread_join(l->pop_thread, NULL); /* it has ended */
        l->pop_running = pthread_create(&l->pop_thread, NULL, populate_main, l) == 0;
        l->pop_started = l->pop_running;
    }
    pthread_mutex_unlock(&l->lock);
}

/* Opens the UCX endpoint to the daemon that sent `h`, with every device
 * buffer's handle. Caller holds the map write lock. */
static int open_ucx_locked(kvd_linker_t *l, const kvd_hello_rep_t *h,
                           kvd_transport_t **out)
{
    if (h->ucx_address_len == 0 || h->ucx_rkey_len == 0)
        return KVD_ERR_PROTOCOL;
    kvd_ucx_peer_t peer = {.address = h->ucx_address,
                           .address_len = h->ucx_address_len,
                           .rkey = h->ucx_rkey,
                           .rkey_len = h->ucx_rkey_len,
                           .remote_base = h->ucx_pool_base,
                           .remote_length = h->pool_bytes,
                           .mode = l->ucx_mode};
    kvd_transport_t *t = NULL;
    int rc = kvd_transport_open_ucx(l->ucx, &peer, &t);
    pthread_mutex_lock(&l->lock);
    for (uint32_t i = 0; rc == KVD_OK && i < l->n_pools; i++)
        for (uint32_t k = 0; rc == KVD_OK && k < l->pools[i].n_mems; k++)
            rc = kvd_transport_ucx_add_local(t, l->pools[i].mems[k]);
    pthread_mutex_unlock(&l->lock);
    if (rc != KVD_OK) {
        kvd_transport_destroy(t);
        return rc;
    }
    *out = t;
    return KVD_OK;
}

/* Says Hello with every registered pool's namespace and maps the pool.
 * Caller holds rpc. */
static int connect_once(kvd_linker_t *l)
{
    kvd_client_t *c = NULL;
    int rc = l->connect[0] ? kvd_client_connect_tcp(l->connect, l->timeout_ms, &c)
                           : kvd_client_connect_unix(l->socket_path, l->timeout_ms, &c);
    if (rc != KVD_OK)
        return rc;
    kvd_ns_spec_t specs[KVD_MAX_POOLS];
    pthread_mutex_lock(&l->lock);
    uint32_t n = l->n_pools;
    for (uint32_t i = 0; i < n; i++)
        specs[i] = (kvd_ns_spec_t){.object_bytes = l->pools[i].object_bytes,
                                   .rank_replicated = l->pools[i].desc.rank_replicated};
    for (uint32_t i = 0; i < n; i++)
        kvd_strlcpy(specs[i].name, l->pools[i].ns_name, sizeof(specs[i].name));
    pthread_mutex_unlock(&l->lock);

    kvd_msg_t req, rep;
    kvd_msg_request(&req, 0, KVD_METHOD_HELLO);
    kvd_strlcpy(req.body.hello_req.client_name, l->client_name, KVD_NAME_MAX);
    req.body.hello_req.pid = (uint32_t)getpid();
    req.body.hello_req.protocol_version = KVD_PROTOCOL_VERSION;
    req.body.hello_req.want_pool_fd = !l->use_ucx && l->connect[0] == '\0';
    req.body.hello_req.want_ucx = l->use_ucx;
    req.body.hello_req.n_namespaces = n;
    req.body.hello_req.namespaces = specs;
    rc = kvd_client_call(c, &req, &rep, l->timeout_ms);
    if (rc == KVD_OK && rep.status != KVD_OK)
        rc = rep.status;
    if (rc == KVD_OK && rep.body.hello_rep.n_ns_ids != n)
        rc = KVD_ERR_PROTOCOL;
    int fd = kvd_client_take_fd(c);
    if (rc == KVD_OK && fd >= 0) {
        uint64_t bytes = rep.body.hello_rep.pool_bytes;
        void *map = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (map == MAP_FAILED) {
            rc = kvd_status_from_errno(errno);
        } else {
            /* write-populated, so that no copy into the pool takes a fault
             * (MAP_POPULATE read-faults shared pages; writes then fault
             * again); best effort: older kernels fault on first use. The
             * first mapping before kvd_linker_open returns; a new one after
             * a reconnection in the background, as calls wait on us here */
            pthread_rwlock_rdlock(&l->map);
            bool reconnect = l->pool_map != NULL;
            pthread_rwlock_unlock(&l->map);
            if (!l->cfg.lazy_pool_mapping && !reconnect)
                madvise(map, bytes, MADV_POPULATE_WRITE);
            atomic_store(&l->remapping, 1);
            pthread_rwlock_wrlock(&l->map);
            if (l->pool_map != NULL)
                munmap(l->pool_map, l->pool_bytes);
            l->pool_map = map;
            l->pool_bytes = bytes;
            atomic_fetch_add(&l->epoch, 1); /* old leases and offsets end here */
            pthread_rwlock_unlock(&l->map);
            atomic_store(&l->remapping, 0);
            if (!l->cfg.lazy_pool_mapping && reconnect)
                populate_in_background(l);
        }
    } else if (rc == KVD_OK && l->use_ucx) {
        pthread_rwlock_wrlock(&l->map);
        kvd_transport_t *t = NULL;
        rc = open_ucx_locked(l, &rep.body.hello_rep, &t);
        if (rc == KVD_OK) {
            kvd_transport_destroy(l->xport); /* idle: copies hold the read lock */
            l->xport = t;
            l->n_kept = 0; /* the old endpoint's batches */
            l->pool_bytes = rep.body.hello_rep.pool_bytes;
            atomic_fetch_add(&l->epoch, 1);
        }
        pthread_rwlock_unlock(&l->map);
    } else if (rc == KVD_OK) {
        pthread_rwlock_wrlock(&l->map); /* no pool over TCP: a new epoch all the same */
        atomic_fetch_add(&l->epoch, 1);
        pthread_rwlock_unlock(&l->map);
    }
    if (fd >= 0)
        close(fd);
    if (rc == KVD_OK) {
        pthread_mutex_lock(&l->lock);
        for (uint32_t i = 0; i < n; i++)
            l->pools[i].ns_id = rep.body.hello_rep.ns_ids[i];
        pthread_mutex_unlock(&l->lock);
        l->client = c;
        l->lease_ttl_ms = rep.body.hello_rep.lease_ttl_ms;
    } else {
        kvd_client_close(c);
    }
    kvd_msg_clear(&rep);
    return rc;
}

/* connect_once, again while the daemon says busy (its UCX server is
 * restarting: a second at most), within the timeout. */
static int connect_locked(kvd_linker_t *l)
{
    uint64_t deadline = kvd_now_ns() + (uint64_t)l->timeout_ms * 1000000ull;
    for (;;) {
        int rc = connect_once(l);
        if (rc != KVD_ERR_BUSY || kvd_now_ns() >= deadline)
            return rc;
        struct timespec ts = {0, 100 * 1000000L};
        nanosleep(&ts, NULL);
    }
}

/* Drops a broken connection: its pins and reservations are gone with it. */
static void disconnect_locked(kvd_linker_t *l)
{
    kvd_client_close(l->client);
    l->client = NULL;
}

int lk_call_many(kvd_linker_t *l, kvd_msg_t *reqs, kvd_msg_t *reps, size_t n,
                 uint64_t on_epoch, uint64_t *epoch)
{
    memset(reps, 0, n * sizeof(*reps));
    pthread_mutex_lock(&l->rpc);
    /* a failed endpoint takes its connection along: the pins and offsets
     * of that epoch are void, the next connection brings a new endpoint */
    if (l->client != NULL && atomic_load(&l->xport_failed) == atomic_load(&l->epoch))
        disconnect_locked(l);
    int rc = l->client != NULL && (on_epoch == 0 || on_epoch == atomic_load(&l->epoch))
                 ? KVD_OK
             : on_epoch == 0 ? connect_locked(l)
                             : KVD_ERR_CLOSED;
    if (epoch)
        *epoch = atomic_load(&l->epoch); /* cannot change while rpc is held */
    if (rc == KVD_OK) {
        rc = kvd_client_call_many(l->client, reqs, reps, n, l->timeout_ms);
        if (rc != KVD_OK)
            disconnect_locked(l); /* closed, timed out or garbled: start over */
    }
    pthread_mutex_unlock(&l->rpc);
    return rc;
}

int lk_call_ex(kvd_linker_t *l, kvd_msg_t *req, kvd_msg_t *rep, uint64_t on_epoch,
               uint64_t *epoch)
{
    int rc = lk_call_many(l, req, rep, 1, on_epoch, epoch);
    return rc == KVD_OK ? rep->status : rc;
}

bool lk_leases_standing(kvd_linker_t *l, const lxfer_t *x, size_t n)
{
    pthread_mutex_lock(&l->rpc);
    uint64_t epoch = atomic_load(&l->epoch), now = kvd_now_ns();
    /* half the TTL: the daemon started it after we asked, on a clock that
     * runs at the rate of ours; the margin covers any difference */
    uint64_t ttl_ns = l->lease_ttl_ms * 1000000ull / 2;
    /* over a Unix socket only: the daemon's close is then seen here at
     * once, while a TCP FIN may still be on its way when the daemon has
     * already dropped the pins (and a remote clock is not ours) */
    bool ok = l->connect[0] == '\0' && l->client != NULL &&
              atomic_load(&l->xport_failed) != epoch;
    for (size_t i = 0; ok && i < n; i++)
        ok = x[i].lease == 0 || (x[i].epoch == epoch && now - x[i].asked_ns < ttl_ns);
    /* checked last: the leases stood until now only if the daemon has not
     * ended the connection by now */
    ok = ok && kvd_client_quiet(l->client);
    pthread_mutex_unlock(&l->rpc);
    return ok;
}

int lk_call(kvd_linker_t *l, kvd_msg_t *req, kvd_msg_t *rep)
{
    return lk_call_ex(l, req, rep, 0, NULL);
}

/* Connects if needed; returns the connection epoch (0 when it failed). */
static uint64_t ensure_connected(kvd_linker_t *l, int *rc)
{
    pthread_mutex_lock(&l->rpc);
    if (l->client != NULL && atomic_load(&l->xport_failed) == atomic_load(&l->epoch))
        disconnect_locked(l);
    *rc = l->client ? KVD_OK : connect_locked(l);
    pthread_mutex_unlock(&l->rpc);
    return *rc == KVD_OK ? atomic_load(&l->epoch) : 0;
}

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

KVD_API int kvd_linker_open(const kvd_linker_config_t *config, kvd_linker_t **out)
{
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
    l->cfg.tp_size = config->tp_size > 0 ? config->tp_size : 1;
    l->cfg.pp_size = config->pp_size > 0 ? config->pp_size : 1;
    l->cfg.cp_size = config->cp_size > 0 ? config->cp_size : 1;
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
    if (tr == NULL || tr[0] == '\0' || strcmp(tr, "auto") == 0)
        l->use_ucx = l->connect[0] != '\0';
    else if (strcmp(tr, "ucx") == 0)
        l->use_ucx = true;
    else if (strcmp(tr, "shm") == 0 && l->connect[0] == '\0')
        l->use_ucx = false;
    else {
        free(l);
        return KVD_ERR_INVALID; /* unknown, or shm to a daemon over TCP */
    }
    int mrc = choose_ucx_mode(
        config->ucx_mode ? config->ucx_mode : getenv("KVDOCK_UCX_MODE"), &l->ucx_mode);
    if (mrc != KVD_OK) {
        free(l);
        return mrc;
    }
    if (l->use_ucx) {
        int urc = kvd_ucx_create(l->client_name, false, &l->ucx);
        if (urc != KVD_OK) {
            free(l);
            return urc;
        }
    }
    pthread_mutex_init(&l->rpc, NULL);
    pthread_mutex_init(&l->lock, NULL);
    pthread_mutex_init(&l->xport_lock, NULL);
    pthread_cond_init(&l->cond, NULL);
    pthread_cond_init(&l->jobs_cond, NULL);
    pthread_rwlock_init(&l->map, NULL);
    pthread_mutex_lock(&l->rpc);
    int rc = connect_locked(l);
    pthread_mutex_unlock(&l->rpc);
    if (rc == KVD_OK) {
        l->thread_started = pthread_create(&l->thread, NULL, lk_load_thread_main, l) == 0;
        l->off_thread_started =
            l->thread_started &&
            pthread_create(&l->off_thread, NULL, lk_offload_thread_main, l) == 0;
        rc = l->off_thread_started ? KVD_OK : KVD_ERR_NOMEM;
    }
    if (rc != KVD_OK) {
        kvd_linker_close(l);
        return rc;
    }
    *out = l;
    return KVD_OK;
}

KVD_API void kvd_linker_close(kvd_linker_t *l)
{
    if (l == NULL)
        return;
    pthread_mutex_lock(&l->lock);
    l->stop = true;
    atomic_fetch_add(&l->kick, 1); /* a thread polling for a start stops too */
    pthread_cond_broadcast(&l->cond);
    pthread_cond_broadcast(&l->jobs_cond);
    pthread_mutex_unlock(&l->lock);
    if (l->thread_started)
        pthread_join(l->thread, NULL);
    if (l->off_thread_started)
        pthread_join(l->off_thread, NULL);
    if (l->pop_started)
        pthread_join(l->pop_thread, NULL); /* it stops within a chunk */
    lk_fail_pending(l); /* what is left completes as failed, then is freed */
    for (lbatch_t *b = l->batches, *next; b != NULL; b = next) {
        next = b->next;
        free(b->layer_ids);
        free(b);
    }
    free(l->done_loads.items);
    free(l->done_offloads.items);
    pthread_mutex_lock(&l->rpc);
    if (l->client)
        disconnect_locked(l);
    pthread_mutex_unlock(&l->rpc);
    unmap_pool(l); /* the endpoint goes before the memory it used */
    for (uint32_t i = 0; i < l->n_pools; i++) {
        free(l->pools[i].layers);
        for (uint32_t k = 0; k < l->pools[i].n_mems; k++)
            kvd_ucx_mem_unmap(l->pools[i].mems[k]);
        free(l->pools[i].mems);
    }
    kvd_ucx_destroy(l->ucx);
    if (l->stage != NULL)
        kvd_mem_free(KVD_MEM_STAGING, l->stage, 2 * (size_t)KVD_LINKER_STAGE_HALF);
    pthread_rwlock_destroy(&l->map);
    pthread_cond_destroy(&l->cond);
    pthread_cond_destroy(&l->jobs_cond);
    pthread_mutex_destroy(&l->lock);
    pthread_mutex_destroy(&l->rpc);
    pthread_mutex_destroy(&l->xport_lock);
    free(l);
}

KVD_API int kvd_linker_health(kvd_linker_t *l, kvd_linker_health_t *state,
                              uint64_t *pool_bytes)
{
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
    if (d->memory != KVD_MEM_HOST)
        return KVD_ERR_UNSUPPORTED; /* the HIP backend comes later */
    for (uint32_t i = 0; i < d->n_layers; i++) {
        const kvd_pool_layer_t *ly = &d->layers[i];
        if (ly->n_buffers == 0 || ly->n_buffers > KVD_MAX_POOL_BUFFERS)
            return KVD_ERR_INVALID;
        for (uint32_t b = 0; b < ly->n_buffers; b++)
            if (ly->buffers[b].base == NULL || ly->buffers[b].bytes_per_row == 0 ||
                ly->buffers[b].row_stride < ly->buffers[b].bytes_per_row)
                return KVD_ERR_INVALID;
    }
    return KVD_OK;
}

/* The extent of one buffer: every row, from the first to the last byte. */
static uint64_t buffer_extent(const kvd_pool_desc_t *d, const kvd_pool_buffer_t *b)
{
    return (d->n_rows - 1) * b->row_stride + b->bytes_per_row;
}

/* Caller holds the map write lock (the transfer threads drive the UCX
 * worker under the read lock). */
static void unmap_buffers(lpool_t *p)
{
    for (uint32_t k = 0; k < p->n_mems; k++)
        kvd_ucx_mem_unmap(p->mems[k]);
    free(p->mems);
    p->mems = NULL;
    p->n_mems = 0;
}

/* Maps every device buffer of p with UCX, so that transfers use their
 * handles instead of registering on the fly. The map write lock keeps
 * the transfer threads off the UCX context meanwhile. */
static int map_buffers(kvd_linker_t *l, lpool_t *p)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < p->desc.n_layers; i++)
        n += p->layers[i].n_buffers;
    p->mems = calloc(n, sizeof(*p->mems));
    if (p->mems == NULL)
        return KVD_ERR_NOMEM;
    int rc = KVD_OK;
    pthread_rwlock_wrlock(&l->map);
    for (uint32_t i = 0; rc == KVD_OK && i < p->desc.n_layers; i++)
        for (uint32_t b = 0; rc == KVD_OK && b < p->layers[i].n_buffers; b++) {
            const kvd_pool_buffer_t *buf = &p->layers[i].buffers[b];
            rc = kvd_ucx_mem_map(l->ucx, buf->base, buffer_extent(&p->desc, buf),
                                 &p->mems[p->n_mems]);
            p->n_mems += rc == KVD_OK;
        }
    if (rc != KVD_OK)
        unmap_buffers(p);
    pthread_rwlock_unlock(&l->map);
    return rc;
}

KVD_API int kvd_register_pool(kvd_linker_t *l, const kvd_pool_desc_t *desc,
                              uint32_t *pool_id)
{
    if (l == NULL || pool_id == NULL)
        return KVD_ERR_INVALID;
    int rc = check_desc(desc);
    if (rc != KVD_OK)
        return rc;
    lpool_t p = {0};
    p.desc = *desc;
    p.layers = calloc(desc->n_layers, sizeof(*p.layers));
    if (p.layers == NULL)
        return KVD_ERR_NOMEM;
    memcpy(p.layers, desc->layers, desc->n_layers * sizeof(*p.layers));
    p.desc.layers = p.layers;
    kvd_strlcpy(p.name, desc->name, sizeof(p.name));
    p.desc.name = p.name;
    p.rows = desc->addressing == KVD_ADDR_PAGED ? desc->page_size : 1;
    p.dev = kvd_devmem_host(); /* check_desc admits host memory only, for now */
    for (uint32_t i = 0; i < desc->n_layers; i++)
        for (uint32_t b = 0; b < p.layers[i].n_buffers; b++) {
            uint64_t bytes;
            if (__builtin_mul_overflow((uint64_t)p.rows,
                                       (uint64_t)p.layers[i].buffers[b].bytes_per_row,
                                       &bytes) ||
                __builtin_add_overflow(p.object_bytes, bytes, &p.object_bytes)) {
                free(p.layers);
                return KVD_ERR_INVALID; /* no object is that large */
            }
        }
    ns_name_of(l, desc, p.ns_name, sizeof(p.ns_name));
    if (l->use_ucx && (rc = map_buffers(l, &p)) != KVD_OK) {
        free(p.layers);
        return rc;
    }

    /* register with the daemon first: a conflicting size is refused there */
    kvd_msg_t req, rep;
    kvd_ns_spec_t spec = {.object_bytes = p.object_bytes,
                          .rank_replicated = desc->rank_replicated};
    kvd_strlcpy(spec.name, p.ns_name, sizeof(spec.name));
    /* the id belongs to the connection that gave it: if another thread
     * reconnected in between (its Hello did not list this pool yet), ask
     * the new connection again. The pool is added with rpc held, so that
     * every later Hello lists it. */
    bool added = false;
    for (int attempt = 0; rc == KVD_OK && !added && attempt < 3; attempt++) {
        kvd_msg_request(&req, 0, KVD_METHOD_REGISTER_NAMESPACE);
        req.body.register_req.n = 1;
        req.body.register_req.namespaces = &spec;
        uint64_t epoch = 0;
        rc = lk_call_ex(l, &req, &rep, 0, &epoch);
        if (rc == KVD_OK && rep.body.register_rep.n != 1)
            rc = KVD_ERR_PROTOCOL;
        if (rc == KVD_OK)
            p.ns_id = rep.body.register_rep.ids[0];
        kvd_msg_clear(&rep);
        if (rc != KVD_OK)
            break;
        pthread_mutex_lock(&l->rpc);
        pthread_mutex_lock(&l->lock);
        if (epoch == atomic_load(&l->epoch)) {
            if (l->n_pools == KVD_MAX_POOLS) {
                rc = KVD_ERR_NO_SPACE;
            } else {
                *pool_id = l->n_pools;
                l->pools[l->n_pools++] = p;
                added = true;
            }
        }
        pthread_mutex_unlock(&l->lock);
        if (added) {
            /* the current endpoint learns the handles; a later one gets
             * them from the pool list (rpc keeps them apart) */
            /* (out of memory here only costs speed: UCX then registers
             * those buffers on the fly) */
            pthread_rwlock_wrlock(&l->map);
            for (uint32_t k = 0; l->xport && k < p.n_mems; k++)
                if (kvd_transport_ucx_add_local(l->xport, p.mems[k]) != KVD_OK)
                    break;
            pthread_rwlock_unlock(&l->map);
        }
        pthread_mutex_unlock(&l->rpc);
    }
    if (rc == KVD_OK && !added)
        rc = KVD_ERR_CLOSED; /* the connection kept changing under us */
    if (rc != KVD_OK) {
        free(p.layers);
        pthread_rwlock_wrlock(&l->map);
        unmap_buffers(&p);
        pthread_rwlock_unlock(&l->map);
    }
    return rc;
}

/* A registered pool, or NULL; entries never move once added. */
static lpool_t *pool_of(kvd_linker_t *l, uint32_t pool_id)
{
    pthread_mutex_lock(&l->lock);
    lpool_t *p = pool_id < l->n_pools ? &l->pools[pool_id] : NULL;
    pthread_mutex_unlock(&l->lock);
    return p;
}

KVD_API int kvd_pool_info(kvd_linker_t *l, uint32_t pool_id, uint64_t *object_bytes,
                          char *ns_name, size_t ns_name_len)
{
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
    lpool_t *p = l && out ? pool_of(l, pool_id) : NULL;
    if (p == NULL)
        return KVD_ERR_INVALID;
    out->lookup_hit_pages = atomic_load(&p->lookup_hit_pages);
    out->load_bytes = atomic_load(&p->load_bytes);
    out->offload_bytes = atomic_load(&p->offload_bytes);
    out->load_failures = atomic_load(&p->load_failures);
    out->offload_failures = atomic_load(&p->offload_failures);
    return KVD_OK;
}

/* ---------------------------------------------------------------- lookup */

KVD_API int kvd_lookup(kvd_linker_t *l, uint64_t rid, const kvd_transfer_t *t, size_t n,
                       uint32_t *boundaries, size_t *n_boundaries)
{
    (void)rid;
    if (l == NULL || t == NULL || n == 0 || n > KVD_LOOKUP_POOLS_MAX ||
        boundaries == NULL || n_boundaries == NULL)
        return KVD_ERR_INVALID;
    int rc;
    ensure_connected(l, &rc);
    if (rc != KVD_OK)
        return rc;
    kvd_lookup_pool_msg_t pools[KVD_LOOKUP_POOLS_MAX];
    pthread_mutex_lock(&l->lock);
    for (size_t i = 0; i < n && rc == KVD_OK; i++) {
        if (t[i].pool_id >= l->n_pools || (t[i].keys == NULL && t[i].n_keys > 0)) {
            rc = KVD_ERR_INVALID;
            break;
        }
        const lpool_t *p = &l->pools[t[i].pool_id];
        pools[i] = (kvd_lookup_pool_msg_t){.ns = p->ns_id,
                                           .trailing_pages = p->desc.trailing_pages,
                                           .n_keys = t[i].n_keys,
                                           .keys = (kvd_key_t *)t[i].keys};
    }
    pthread_mutex_unlock(&l->lock);
    if (rc != KVD_OK)
        return rc;
    kvd_msg_t req, rep;
    kvd_msg_request(&req, 0, KVD_METHOD_LOOKUP);
    req.body.lookup_req.n_pools = n;
    req.body.lookup_req.pools = pools;
    rc = lk_call(l, &req, &rep);
    if (rc == KVD_OK) {
        const kvd_lookup_rep_t *r = &rep.body.lookup_rep;
        size_t cap = SIZE_MAX;
        for (size_t i = 0; i < n; i++)
            cap = KVD_MIN(cap, t[i].n_keys);
        if (r->n > cap) {
            rc = KVD_ERR_PROTOCOL;
        } else {
            memcpy(boundaries, r->boundaries, r->n * sizeof(uint32_t));
            *n_boundaries = r->n;
            uint32_t longest = r->n ? r->boundaries[r->n - 1] : 0;
            for (size_t i = 0; i < n; i++)
                atomic_fetch_add(&l->pools[t[i].pool_id].lookup_hit_pages, longest);
        }
    }
    kvd_msg_clear(&rep);
    return rc;
}

/* -------------------------------------------------------------- helpers */

void lk_xfer_free(lxfer_t *x, size_t n)
{
    for (size_t i = 0; x != NULL && i < n; i++) {
        free(x[i].keys);
        free(x[i].idx);
        free(x[i].depths);
        free(x[i].offsets);
    }
    free(x);
}

int lk_queue_reserve(lqueue_t *q, size_t more)
{
    size_t want = q->n + q->reserved + more;
    if (want > q->cap) {
        size_t cap = q->cap ? q->cap : 64;
        while (cap < want)
            cap *= 2;
        kvd_completion_t *n = realloc(q->items, cap * sizeof(*n));
        if (n == NULL)
            return KVD_ERR_NOMEM;
        q->items = n;
        q->cap = cap;
    }
    q->reserved += more;
    return KVD_OK;
}

/* Room was reserved when the load was committed or the offload queued
 * (lk_queue_reserve): a completion is never lost. */
void lk_queue_push(lqueue_t *q, uint64_t id, bool success)
{
    if (q->reserved > 0)
        q->reserved--;
    if (q->n < q->cap)
        q->items[q->n++] = (kvd_completion_t){.id = id, .success = success};
}

KVD_API int kvd_page_keys(const uint32_t *tokens, size_t n_tokens, size_t page_size,
                          const uint8_t *prior, uint8_t (*keys)[KVD_PAGE_KEY_BYTES],
                          size_t *n_keys)
{
    return kvd_key_chain(tokens, n_tokens, page_size, prior, keys, n_keys);
}

KVD_API const char *kvd_strerror(int status)
{
    return kvd_status_str(status);
}

KVD_API const char *kvd_version(void)
{
    return KVD_VERSION;
}
