/*
 * fuzz_linker.c - what the linker and the RPC client (proto/client.c) make
 * of the daemon's replies: a fake daemon on a Unix socket answers each
 * request with the next reply of a script taken from the input.
 *
 * Input: entries, each an opcode byte and a chunk (16-bit little-endian
 * length, bytes). Opcode & 3:
 *   0  the chunk decoded as a message, sent as the reply to the request
 *      (its id; a reply of another method keeps it when op & 4, else it
 *      becomes an empty reply of the method asked; not decoding: sent
 *      raw);
 *   1  the chunk sent as it is (any bytes: frames, garbage, a cut frame);
 *   2  a well-formed reply to the request, made here (so that a script
 *      can get past Hello and reach the replies it garbles);
 *   3  the connection closed.
 * op & 8 attaches the pool's descriptor (SCM_RIGHTS), as a Hello reply
 * does. When the script ends, the connection closes.
 * The linker meanwhile opens (Hello), registers a pool, looks up, loads
 * (prepare, commit, layer-wise wait; abort when refused), offloads, pops
 * what completes and closes, all with a 300 ms timeout. Checked: every
 * call returns a documented status, device indices handed back are ones
 * given and each at most once, and the linker neither crashes nor hangs.
 * A second mode (the first byte odd) drives kvd_client_call_many alone.
 */
#include "fuzz_util.h"
#include "kvd_proto.h"
#include "kvdock.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#define POOL_BYTES (1u << 20)
#define PAGE       4
#define N_KEYS     4
#define ROWS       64
#define ROW_BYTES  32
#define TIMEOUT_MS 300
#define IDLE_MS    5 /* the fake daemon sends the next reply unasked after */

static char sock_path[108];
static int pool_fd = -1;

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    static char dir[] = "/tmp/kvd-fuzz-linker-XXXXXX";
    FUZZ_CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    snprintf(sock_path, sizeof(sock_path), "%s/d.sock", dir);
    pool_fd = memfd_create("kvd-fuzz-pool", MFD_CLOEXEC);
    FUZZ_CHECK(pool_fd >= 0 && ftruncate(pool_fd, POOL_BYTES) == 0, "pool");
    kvd_log_set_level(KVD_LOG_ERROR);
    return 0;
}

/* ------------------------------------------------------- fake daemon */

typedef struct fake {
    int listen_fd;
    fuzz_in_t script;
    pthread_t thread;
} fake_t;

static bool send_all(int fd, const uint8_t *p, size_t n, bool with_fd)
{
    while (n > 0) {
        struct iovec iov = {.iov_base = (void *)p, .iov_len = n};
        union {
            struct cmsghdr align;
            char buf[CMSG_SPACE(sizeof(int))];
        } ctl;
        memset(&ctl, 0, sizeof(ctl));
        struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
        if (with_fd) {
            msg.msg_control = ctl.buf;
            msg.msg_controllen = sizeof(ctl.buf);
            struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
            cm->cmsg_level = SOL_SOCKET;
            cm->cmsg_type = SCM_RIGHTS;
            cm->cmsg_len = CMSG_LEN(sizeof(int));
            memcpy(CMSG_DATA(cm), &pool_fd, sizeof(int));
            with_fd = false;
        }
        ssize_t w = sendmsg(fd, &msg, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return false;
        p += w;
        n -= (size_t)w;
    }
    return true;
}

/* Reads requests into the framer until one is whole: 1, 0 when none came
 * within IDLE_MS, -1 when the linker closed. */
static int next_request(int fd, kvd_framer_t *f, kvd_msg_t *req)
{
    for (;;) {
        const uint8_t *payload;
        size_t len;
        int got = kvd_framer_next(f, &payload, &len);
        if (got < 0)
            return -1;
        if (got == 1) {
            kvd_msg_clear(req);
            return kvd_msg_decode(payload, len, req) == KVD_OK ? 1 : -1;
        }
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int n = poll(&p, 1, IDLE_MS);
        if (n == 0)
            return 0;
        if (n < 0 && errno == EINTR)
            continue;
        uint8_t *space;
        size_t avail;
        if (n < 0 || kvd_framer_space(f, 4096, &space, &avail) != KVD_OK)
            return -1;
        ssize_t r = recv(fd, space, avail, 0);
        if (r <= 0)
            return -1;
        kvd_framer_commit(f, (size_t)r);
    }
}

/* A well-formed reply to req (op 2). */
static void good_reply(const kvd_msg_t *req, kvd_msg_t *rep)
{
    memset(rep, 0, sizeof(*rep));
    rep->id = req->id;
    rep->method = req->method;
    rep->reply = true;
    static uint32_t ids[KVD_MAX_POOLS + 1];
    static uint64_t offsets[N_KEYS * 4];
    static uint8_t results[N_KEYS * 4];
    for (size_t i = 0; i < KVD_ARRAY_SIZE(ids); i++)
        ids[i] = (uint32_t)i + 1;
    switch (req->method) {
    case KVD_METHOD_HELLO: {
        kvd_hello_rep_t *h = &rep->body.hello_rep;
        kvd_strlcpy(h->daemon_version, KVD_VERSION, sizeof(h->daemon_version));
        h->protocol_version = KVD_PROTOCOL_VERSION;
        h->max_frame_bytes = KVD_FRAME_DEFAULT_MAX;
        h->max_batch = 4096;
        h->pool_bytes = POOL_BYTES;
        h->lease_ttl_ms = 30000;
        h->n_ns_ids = KVD_MIN(req->body.hello_req.n_namespaces, KVD_MAX_POOLS);
        h->ns_ids = ids;
        break;
    }
    case KVD_METHOD_REGISTER_NAMESPACE:
        rep->body.register_rep.n = KVD_MIN(req->body.register_req.n, KVD_MAX_POOLS);
        rep->body.register_rep.ids = ids;
        break;
    case KVD_METHOD_HEALTH: rep->body.health_rep.state = KVD_HEALTH_READY; break;
    case KVD_METHOD_RESERVE: {
        size_t n = KVD_MIN(req->body.reserve_req.n, KVD_ARRAY_SIZE(offsets));
        for (size_t i = 0; i < n; i++) {
            results[i] = KVD_RESERVE_ALLOCATED;
            offsets[i] = i * 4096;
        }
        rep->body.reserve_rep =
            (kvd_reserve_rep_t){.lease_id = 7,
                                .object_bytes = req->body.reserve_req.object_bytes,
                                .n = n,
                                .results = results,
                                .offsets = offsets};
        break;
    }
    case KVD_METHOD_ACQUIRE: {
        size_t n = KVD_MIN(req->body.acquire_req.n, KVD_ARRAY_SIZE(offsets));
        for (size_t i = 0; i < n; i++)
            offsets[i] = i * 4096;
        rep->body.acquire_rep =
            (kvd_acquire_rep_t){.lease_id = 9,
                                .object_bytes = req->body.acquire_req.object_bytes,
                                .n = n,
                                .offsets = offsets};
        break;
    }
    default: break; /* Lookup: no boundary; Publish, Revoke, Release: empty */
    }
}

static void *fake_main(void *arg)
{
    fake_t *fk = arg;
    struct pollfd p = {.fd = fk->listen_fd, .events = POLLIN};
    if (poll(&p, 1, 2000) <= 0)
        return NULL;
    int fd = accept4(fk->listen_fd, NULL, NULL, SOCK_CLOEXEC);
    /* one connection: a linker that reconnects finds nobody at once */
    close(fk->listen_fd);
    fk->listen_fd = -1;
    unlink(sock_path);
    if (fd < 0)
        return NULL;
    kvd_framer_t f;
    kvd_framer_init(&f, KVD_FRAME_LIMIT_MAX, KVD_MEM_OTHER);
    kvd_msg_t req = {0}, rep = {0};
    kvd_buf_t out;
    kvd_buf_init(&out, KVD_MEM_OTHER);
    bool have_req = false;
    while (fuzz_left(&fk->script)) {
        int got = next_request(fd, &f, &req);
        if (got < 0)
            break;
        if (got == 0 && !have_req)
            continue; /* nothing asked yet: the linker is still on its way */
        have_req = true;
        uint8_t op = fuzz_u8(&fk->script);
        size_t len;
        const uint8_t *bytes = fuzz_chunk(&fk->script, &len);
        out.len = 0;
        if ((op & 3) == 3)
            break;
        if ((op & 3) == 1) {
            kvd_buf_append(&out, bytes, len);
        } else if ((op & 3) == 2) {
            good_reply(&req, &rep);
            kvd_msg_pack(&rep, KVD_FRAME_LIMIT_MAX, &out);
            memset(&rep, 0, sizeof(rep)); /* its arrays are static */
        } else if (kvd_msg_decode(bytes, len, &rep) == KVD_OK &&
                   (rep.method != KVD_METHOD_NONE || rep.status != KVD_OK)) {
            rep.id = req.id;
            rep.reply = true;
            /* another method's reply keeps its method (op & 4), or becomes
             * an empty reply of the method asked (its body cannot be
             * encoded as another method's) */
            if (!(op & 4) && rep.method != req.method) {
                memset(&rep.body, 0, sizeof(rep.body));
                rep.method = req.method;
            }
            if (kvd_msg_pack(&rep, KVD_FRAME_LIMIT_MAX, &out) != KVD_OK)
                out.len = 0;
            kvd_msg_clear(&rep);
        } else {
            kvd_msg_clear(&rep);
            if (len > 0 && kvd_frame_put_header(&out, len) == KVD_OK)
                kvd_buf_append(&out, bytes, len);
        }
        if (out.len > 0 && !send_all(fd, out.data, out.len, (op & 8) != 0))
            break;
    }
    kvd_msg_clear(&req);
    kvd_buf_free(&out);
    kvd_framer_free(&f);
    close(fd);
    return NULL;
}

static void fake_start(fake_t *fk, const uint8_t *data, size_t size)
{
    unlink(sock_path);
    fk->listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    kvd_strlcpy(a.sun_path, sock_path, sizeof(a.sun_path));
    FUZZ_CHECK(fk->listen_fd >= 0 &&
                   bind(fk->listen_fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
                   listen(fk->listen_fd, 4) == 0,
               "listen: %s", strerror(errno));
    fk->script = (fuzz_in_t){data, size};
    FUZZ_CHECK(pthread_create(&fk->thread, NULL, fake_main, fk) == 0, "thread");
}

static void fake_stop(fake_t *fk)
{
    pthread_join(fk->thread, NULL);
    if (fk->listen_fd >= 0)
        close(fk->listen_fd);
    unlink(sock_path);
}

/* ------------------------------------------------------------- linker */

static bool documented(int rc)
{
    return rc <= 0 && rc >= -19; /* kvd_status.h: KVD_OK .. KVD_ERR_QUOTA */
}

/* The device indices the linker handed back: each once, each one given. */
static uint32_t freed[ROWS];

static void free_indices(void *ctx, const int64_t *idx, size_t n)
{
    (void)ctx;
    for (size_t i = 0; i < n; i++) {
        FUZZ_CHECK(idx[i] >= 0 && idx[i] < N_KEYS * PAGE,
                   "freed index %lld was not given", (long long)idx[i]);
        FUZZ_CHECK(++freed[idx[i]] == 1, "index %lld freed twice", (long long)idx[i]);
    }
}

static void pop_all(kvd_linker_t *l, uint64_t want_load, uint64_t want_offload)
{
    bool load_done = want_load == 0, offload_done = want_offload == 0;
    /* bounded: every wait inside the linker is bounded by its timeout */
    for (int i = 0; i < 4 * TIMEOUT_MS && !(load_done && offload_done); i++) {
        kvd_completion_t c[4];
        size_t n = 0;
        FUZZ_CHECK(kvd_pop_completed_loads(l, c, 4, &n) == KVD_OK, "pop loads");
        for (size_t k = 0; k < n; k++) {
            FUZZ_CHECK(c[k].id == want_load && !load_done, "load %llu completed",
                       (unsigned long long)c[k].id);
            load_done = true;
        }
        FUZZ_CHECK(kvd_pop_completed_offloads(l, c, 4, &n) == KVD_OK, "pop offloads");
        for (size_t k = 0; k < n; k++) {
            FUZZ_CHECK(c[k].id == want_offload && !offload_done, "offload %llu completed",
                       (unsigned long long)c[k].id);
            offload_done = true;
        }
        usleep(1000);
    }
    FUZZ_CHECK(load_done && offload_done, "a completion never came (load %d, offload %d)",
               load_done, offload_done);
}

static void drive_linker(void)
{
    static uint8_t kbuf[ROWS * ROW_BYTES], vbuf[ROWS * ROW_BYTES];
    memset(freed, 0, sizeof(freed));
    kvd_linker_config_t cfg = {.socket_path = sock_path,
                               .client_name = "fuzz",
                               .model_id = "fuzz-model",
                               .tp_size = 1,
                               .pp_size = 1,
                               .cp_size = 1,
                               .timeout_ms = TIMEOUT_MS,
                               .spin_us = -1,
                               .lazy_pool_mapping = true,
                               .transport = "shm"};
    kvd_linker_t *l = NULL;
    int rc = kvd_linker_open(&cfg, &l);
    FUZZ_CHECK(documented(rc), "open: %d", rc);
    if (rc != KVD_OK)
        return;
    kvd_pool_layer_t layer = {
        .layer_id = 0,
        .n_buffers = 2,
        .buffers = {{kbuf, ROW_BYTES, ROW_BYTES}, {vbuf, ROW_BYTES, ROW_BYTES}}};
    kvd_pool_desc_t d = {.name = "kv",
                         .addressing = KVD_ADDR_PAGED,
                         .page_size = PAGE,
                         .n_rows = ROWS,
                         .memory = KVD_MEM_HOST,
                         .n_layers = 1,
                         .layers = &layer,
                         .free_indices = free_indices};
    uint32_t pool = 0;
    rc = kvd_register_pool(l, &d, &pool);
    FUZZ_CHECK(documented(rc), "register: %d", rc);
    uint64_t want_load = 0, want_offload = 0;
    if (rc == KVD_OK) {
        uint8_t keys[N_KEYS][KVD_PAGE_KEY_BYTES];
        for (size_t i = 0; i < N_KEYS; i++)
            memset(keys[i], (int)i + 1, KVD_PAGE_KEY_BYTES);
        int64_t idx[N_KEYS * PAGE];
        for (size_t i = 0; i < N_KEYS * PAGE; i++)
            idx[i] = (int64_t)i;
        kvd_transfer_t t = {.pool_id = pool,
                            .keys = (const uint8_t(*)[KVD_PAGE_KEY_BYTES])keys,
                            .n_keys = N_KEYS,
                            .device_indices = idx,
                            .n_indices = N_KEYS * PAGE};
        uint32_t bounds[N_KEYS];
        size_t nb = 0;
        rc = kvd_lookup(l, 1, &t, 1, bounds, &nb);
        FUZZ_CHECK(documented(rc), "lookup: %d", rc);
        if (rc == KVD_OK) {
            FUZZ_CHECK(nb <= N_KEYS, "%zu boundaries for %d keys", nb, N_KEYS);
            for (size_t i = 0; i < nb; i++)
                FUZZ_CHECK(bounds[i] >= 1 && bounds[i] <= N_KEYS &&
                               (i == 0 || bounds[i] > bounds[i - 1]),
                           "boundary %u", bounds[i]);
        }
        rc = kvd_load(l, 2, &t, 1);
        FUZZ_CHECK(documented(rc), "load: %d", rc);
        if (rc == KVD_OK) {
            kvd_commit_pool_t cp = {.adopted_begin = 0, .adopted_end = N_KEYS};
            uint32_t counter = 0;
            rc = kvd_load_prepare(l, 2);
            if (rc == KVD_OK)
                rc = kvd_load_commit(l, 2, &cp, 1);
            if (rc == KVD_OK) {
                want_load = 2;
                FUZZ_CHECK(kvd_start_layer_wise_loading(l, &counter) == KVD_OK, "start");
                rc = kvd_wait_layer(l, counter, 0);
                FUZZ_CHECK(documented(rc), "wait: %d", rc);
            } else {
                FUZZ_CHECK(documented(rc), "prepare/commit: %d", rc);
                kvd_load_abort(l, 2);
            }
        } else {
            kvd_load_abort(l, 2); /* a refused load is recorded: hand back */
        }
        uint64_t ack = 0;
        rc = kvd_offload(l, &t, 1, &ack);
        FUZZ_CHECK(documented(rc), "offload: %d", rc);
        if (rc == KVD_OK)
            want_offload = ack;
        pop_all(l, want_load, want_offload);
    }
    kvd_linker_close(l);
}

/* ------------------------------------------------------------- client */

static void drive_client(uint8_t n_calls)
{
    kvd_client_t *c = NULL;
    int rc = kvd_client_connect_unix(sock_path, TIMEOUT_MS, &c);
    FUZZ_CHECK(rc == KVD_OK, "connect: %d", rc);
    size_t n = 1 + n_calls % 4;
    kvd_msg_t reqs[4], reps[4];
    static const kvd_method_t methods[] = {KVD_METHOD_HEALTH, KVD_METHOD_LOOKUP,
                                           KVD_METHOD_RELEASE, KVD_METHOD_STATS};
    for (size_t i = 0; i < n; i++)
        kvd_msg_request(&reqs[i], 0, methods[(n_calls / 4 + i) % 4]);
    for (int round = 0; round < 2; round++) {
        rc = kvd_client_call_many(c, reqs, reps, n, TIMEOUT_MS);
        FUZZ_CHECK(rc == KVD_OK || rc == KVD_ERR_TIMEOUT || rc == KVD_ERR_CLOSED ||
                       rc == KVD_ERR_PROTOCOL,
                   "call: %d", rc);
        for (size_t i = 0; i < n; i++) {
            if (rc == KVD_OK && reps[i].status == KVD_OK)
                FUZZ_CHECK(reps[i].reply && reps[i].id == reqs[i].id,
                           "reply %zu has id %llu for %llu", i,
                           (unsigned long long)reps[i].id,
                           (unsigned long long)reqs[i].id);
            kvd_msg_clear(&reps[i]);
        }
        int fd = kvd_client_take_fd(c);
        if (fd >= 0)
            close(fd);
    }
    kvd_client_close(c);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    fake_t fk;
    fake_start(&fk, data + 1, size - 1);
    if (data[0] & 1)
        drive_client(data[0] >> 1);
    else
        drive_linker();
    fake_stop(&fk);
    return 0;
}
