/*
 * Description: a member of the cluster that answers garbage (issue 15).
 * One daemon (A = node-0) and a fake member "fake" that the test registers
 * in etcd itself, served by a thread of the test on the bridge's address:
 * it says Hello like a daemon, answers every DirLookup claiming to hold
 * each key asked and sending far more holder entries than keys were asked,
 * and answers every Fetch in the pinned form (a lease and offsets, no
 * bytes) although A asked for the bytes.
 * (a) a Lookup on A for keys the fake owns comes back (A asked the fake,
 *     merged only what it asked for) and A keeps serving;
 * (b) an Acquire of them ends not-found within a bound: the fake's Fetch
 *     replies are refused, nothing is copied from bytes that are not there;
 * (c) A exits cleanly with a log free of sanitizer reports (checked by the
 *     teardown), which a write past the merged reply or a copy from a
 *     missing buffer would not give in the ASan tree.
 */
#include "cluster.h"
#include "test_store_util.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define KEYS    8
#define A       0
#define WAIT_MS 30000
#define FAKE_ID "fake"

static kc_cluster_t cl;
static int listen_fd = -1;
static uint16_t fake_port;
static atomic_bool stop;
static atomic_uint lookups_answered, fetches_answered;

/* Answers one request of A's (m) on fd. */
static void answer(int fd, const kvd_msg_t *m)
{
    kvd_msg_t rep = {0};
    rep.id = m->id;
    rep.method = m->method;
    rep.reply = true;
    switch (m->method) {
    case KVD_METHOD_HELLO:
        rep.body.hello_rep.protocol_version = KVD_PROTOCOL_VERSION;
        rep.body.hello_rep.max_frame_bytes = KVD_FRAME_DEFAULT_MAX;
        rep.body.hello_rep.max_batch = 4096;
        break;
    case KVD_METHOD_DIR_LOOKUP: {
        /* every key held by the fake, and 100 more entries than asked */
        kvd_dir_lookup_rep_t *r = &rep.body.dir_lookup_rep;
        size_t n = m->body.dir_lookup_req.n;
        r->nodes = kvd_msg_alloc(&rep, sizeof(*r->nodes));
        r->n_holders = kvd_msg_alloc(&rep, (n + 1) * sizeof(size_t));
        r->holders = kvd_msg_alloc(&rep, (n + 1) * sizeof(uint64_t *));
        kvd_strlcpy(r->nodes[0], FAKE_ID, sizeof(r->nodes[0]));
        r->n_nodes = 1;
        r->n = n;
        for (size_t q = 0; q < n; q++) {
            size_t k = m->body.dir_lookup_req.queries[q].n_added + 100;
            r->n_holders[q] = k;
            r->holders[q] = kvd_msg_alloc(&rep, k * sizeof(uint64_t));
            for (size_t i = 0; i < k; i++)
                r->holders[q][i] = ~0ull;
        }
        atomic_fetch_add(&lookups_answered, 1);
        break;
    }
    case KVD_METHOD_FETCH: {
        /* the pinned form, to a Fetch that asked for the bytes */
        kvd_fetch_rep_t *f = &rep.body.fetch_rep;
        size_t n = m->body.fetch_req.n;
        f->object_bytes = TS_KV_BYTES;
        f->n = n;
        f->present = kvd_msg_alloc(&rep, n + 1);
        f->depths = kvd_msg_alloc(&rep, (n + 1) * sizeof(uint32_t));
        f->offsets = kvd_msg_alloc(&rep, (n + 1) * sizeof(uint64_t));
        for (size_t i = 0; i < n; i++) {
            f->present[i] = KVD_FETCH_HERE;
            f->offsets[i] = i * TS_KV_BYTES;
        }
        f->n_depths = f->n_offsets = n;
        f->lease_id = 5;
        atomic_fetch_add(&fetches_answered, 1);
        break;
    }
    case KVD_METHOD_DIR_ANNOUNCE: break;
    default:
        kvd_msg_error(&rep, m->id, m->method, KVD_ERR_UNKNOWN_METHOD, "not served here");
    }
    kvd_buf_t out;
    kvd_buf_init(&out, KVD_MEM_OTHER);
    if (kvd_msg_pack(&rep, KVD_FRAME_DEFAULT_MAX, &out) == KVD_OK) {
        size_t at = 0;
        while (at < out.len) {
            ssize_t w = send(fd, out.data + at, out.len - at, MSG_NOSIGNAL);
            if (w <= 0)
                break;
            at += (size_t)w;
        }
    }
    kvd_buf_free(&out);
    kvd_msg_clear(&rep);
}

/* One connection of A's, served until it closes or the test stops. */
static void *conn_main(void *arg)
{
    int fd = (int)(intptr_t)arg;
    kvd_framer_t fr;
    kvd_framer_init(&fr, KVD_FRAME_DEFAULT_MAX, KVD_MEM_OTHER);
    struct timeval tv = {0, 200000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    while (!atomic_load(&stop)) {
        const uint8_t *payload;
        size_t len;
        int got = kvd_framer_next(&fr, &payload, &len);
        if (got < 0)
            break;
        if (got == 1) {
            kvd_msg_t m;
            if (kvd_msg_decode(payload, len, &m) == KVD_OK && !m.reply)
                answer(fd, &m);
            kvd_msg_clear(&m);
            continue;
        }
        uint8_t *space;
        size_t avail;
        if (kvd_framer_space(&fr, 4096, &space, &avail) != KVD_OK)
            break;
        ssize_t n = recv(fd, space, avail, 0);
        if (n == 0)
            break;
        if (n > 0)
            kvd_framer_commit(&fr, (size_t)n);
    }
    kvd_framer_free(&fr);
    close(fd);
    return NULL;
}

static void *accept_main(void *arg)
{
    (void)arg;
    while (!atomic_load(&stop)) {
        int fd = accept(listen_fd, NULL, NULL);
        if (fd < 0)
            continue; /* the listener's timeout: look at stop again */
        pthread_t th;
        if (pthread_create(&th, NULL, conn_main, (void *)(intptr_t)fd) == 0)
            pthread_detach(th);
        else
            close(fd);
    }
    return NULL;
}

static int fake_listen(void)
{
    listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    inet_pton(AF_INET, cl.net.bridge_addr, &a.sin_addr);
    struct timeval tv = {0, 200000};
    setsockopt(listen_fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    socklen_t al = sizeof(a);
    if (listen_fd < 0 || bind(listen_fd, (struct sockaddr *)&a, sizeof(a)) != 0 ||
        listen(listen_fd, 16) != 0 ||
        getsockname(listen_fd, (struct sockaddr *)&a, &al) != 0)
        return -1;
    fake_port = ntohs(a.sin_port);
    return 0;
}

/* Puts the fake's member key into etcd (no lease: it stays until the test
 * ends with etcd). */
static int fake_register(void)
{
    char key[160], value[256], kb[256], vb[512], body[1024], out[2048];
    snprintf(key, sizeof(key), "/kvdock/%s/members/%s", cl.name, FAKE_ID);
    snprintf(value, sizeof(value),
             "{\"address\":\"%s:%u\",\"pool_bytes\":67108864,\"objects\":0,"
             "\"directory_entries\":0,\"started_unix_ms\":1,\"heartbeat_unix_ms\":1}",
             cl.net.bridge_addr, fake_port);
    EVP_EncodeBlock((unsigned char *)kb, (const unsigned char *)key, (int)strlen(key));
    EVP_EncodeBlock((unsigned char *)vb, (const unsigned char *)value,
                    (int)strlen(value));
    snprintf(body, sizeof(body), "{\"key\":\"%s\",\"value\":\"%s\"}", kb, vb);
    int st =
        kc_http(cl.etcd.host, 2379, "POST", "/v3/kv/put", body, out, sizeof(out), 5000);
    return DT_CHECK(st == 200, "put the fake member: HTTP %d %s", st, out) ? 0 : -1;
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    int rc = kc_setup(&cl, 1, true);
    if (rc == KVD_TEST_SKIP)
        return KVD_TEST_SKIP;
    pthread_t acc;
    bool acc_started = false;
    if (rc == 0 && DT_CHECK(fake_listen() == 0, "the fake member cannot listen") &&
        (acc_started = pthread_create(&acc, NULL, accept_main, NULL) == 0) &&
        kc_node_start(&cl, A, true, NULL) == 0 &&
        DT_CHECK(kc_wait_members(&cl, 0x1u, KC_READY_MS, NULL, NULL), "A is a member") &&
        fake_register() == 0) {
        /* keys whose directory owner is the fake: members sorted by id */
        uint64_t hashes[2] = {kvd_node_hash(FAKE_ID), kvd_node_hash(cl.node[A].node_id)};
        kvd_key_t keys[KEYS];
        size_t n = 0;
        for (uint32_t seed = 1; n < KEYS && seed < 100000; seed++) {
            kvd_key_t k;
            for (size_t b = 0; b < KVD_KEY_BYTES; b++)
                k[b] = (uint8_t)(seed * 131u + b * 7u + (seed >> 8));
            if (kvd_rendezvous_owner(kvd_dir_hash("default", TS_KV_NS, k), hashes, 2) ==
                0)
                memcpy(keys[n++], k, KVD_KEY_BYTES);
        }
        kvd_ns_spec_t spec = ts_spec(TS_KV_NS, TS_KV_BYTES);
        ts_client_t a;
        if (DT_CHECK(n == KEYS, "keys the fake owns: %zu", n) &&
            ts_open(&a, cl.node[A].socket, &spec, 1, false) == 0) {
            /* (a) A asks the fake once it sees it as a member */
            kvd_lookup_pool_msg_t pool = {.ns = a.ns[0], .n_keys = KEYS, .keys = keys};
            uint32_t b[KEYS];
            size_t nb = 0;
            ts_err_t err = {0};
            uint64_t t0 = kc_now_ms();
            int lrc = KVD_OK;
            while (kc_now_ms() < t0 + WAIT_MS && atomic_load(&lookups_answered) == 0 &&
                   (lrc = ts_lookup(a.c, &pool, 1, b, KEYS, &nb, &err)) == KVD_OK)
                kvd_sleep_ns(100000000);
            DT_CHECK(atomic_load(&lookups_answered) > 0 && lrc == KVD_OK,
                     "(a) A's Lookup routed to the fake: %u answers, %s %s",
                     atomic_load(&lookups_answered), kvd_status_str(lrc), err.text);
            lrc = ts_lookup(a.c, &pool, 1, b, KEYS, &nb, &err);
            DT_CHECK(lrc == KVD_OK && nb <= KEYS, "(a) Lookup on A: %s, %zu boundaries",
                     kvd_status_str(lrc), nb);
            /* (b) */
            uint64_t lease = 0, offsets[KEYS];
            int arc = KVD_INPROGRESS;
            t0 = kc_now_ms();
            while (kc_now_ms() < t0 + WAIT_MS &&
                   (arc = ts_acquire(a.c, a.ns[0], TS_KV_BYTES, keys, KEYS, &lease,
                                     offsets, &err)) == KVD_INPROGRESS)
                kvd_sleep_ns(5000000);
            DT_CHECK(arc == KVD_ERR_NOT_FOUND,
                     "(b) Acquire of what the fake claims: %d %s, want not-found", arc,
                     err.text);
            DT_CHECK(atomic_load(&fetches_answered) > 0,
                     "(b) A never asked the fake for the bytes");
            printf(
                "(a, b) %u DirLookup and %u Fetch answers of the fake; the Acquire ended "
                "%s\n",
                atomic_load(&lookups_answered), atomic_load(&fetches_answered),
                kvd_status_str(arc));
            DT_CHECK(ts_health_ok(a.c) == KVD_OK, "A still serves");
            ts_close(&a);
        }
    }
    kc_teardown(&cl); /* (c): A exits 0, its log clean */
    atomic_store(&stop, true);
    if (acc_started)
        pthread_join(acc, NULL);
    if (listen_fd >= 0)
        close(listen_fd);
    return dt_exit_status("cluster/peer_garbage");
}
