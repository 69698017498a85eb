/*
 * fuzz_proto.c - the frame reader and the message decoder, as the daemon
 * runs them on the bytes of a connection.
 *
 * Input: one byte, the size of the pieces the bytes arrive in (0: all at
 * once), then the bytes of a stream of frames. Each whole frame is decoded
 * with the daemon's limits (--max-batch 4096, 16 Lookup pools) and without
 * them. Checked: only documented statuses; a frame the limits refuse
 * decodes without them; what decodes re-encodes, decodes again, and
 * encodes to the same bytes the second time (encoding is a fixed point
 * after one round); strings are NUL-terminated in their arrays.
 */
#include "fuzz_util.h"
#include "kvd_proto.h"

#define DAEMON_MAX_BATCH 4096 /* kvdockd's --max-batch default */

static bool status_is(int rc, int a, int b, int c, int d)
{
    return rc == a || rc == b || rc == c || rc == d;
}

static bool terminated(const char *s, size_t size)
{
    return memchr(s, '\0', size) != NULL;
}

/* The fixed-size strings of m end inside their arrays. */
static void check_strings(const kvd_msg_t *m)
{
    FUZZ_CHECK(terminated(m->error, sizeof(m->error)), "error text");
    if (m->status != KVD_OK)
        return;
    switch (m->method) {
    case KVD_METHOD_HELLO:
        if (m->reply) {
            const kvd_hello_rep_t *h = &m->body.hello_rep;
            FUZZ_CHECK(terminated(h->daemon_version, sizeof(h->daemon_version)),
                       "version");
            FUZZ_CHECK(terminated(h->instance, sizeof(h->instance)), "instance");
            FUZZ_CHECK(terminated(h->tenant, sizeof(h->tenant)), "tenant");
            FUZZ_CHECK(h->ucx_token_len <= sizeof(h->ucx_token), "ucx token");
            FUZZ_CHECK(h->n_ns_ids == 0 || h->ns_ids != NULL, "ns ids");
        } else {
            const kvd_hello_req_t *h = &m->body.hello_req;
            FUZZ_CHECK(terminated(h->client_name, sizeof(h->client_name)), "client");
            FUZZ_CHECK(h->auth_token_len <= sizeof(h->auth_token), "token");
            for (size_t i = 0; i < h->n_namespaces; i++)
                FUZZ_CHECK(terminated(h->namespaces[i].name, KVD_NS_NAME_BYTES),
                           "ns name");
        }
        break;
    case KVD_METHOD_REGISTER_NAMESPACE:
        if (!m->reply)
            for (size_t i = 0; i < m->body.register_req.n; i++)
                FUZZ_CHECK(terminated(m->body.register_req.namespaces[i].name,
                                      KVD_NS_NAME_BYTES),
                           "ns name");
        break;
    case KVD_METHOD_INSPECT:
        if (!m->reply)
            FUZZ_CHECK(terminated(m->body.inspect_req.ns_name, KVD_NS_NAME_BYTES), "ns");
        break;
    case KVD_METHOD_LIST_PREFIXES:
        if (!m->reply)
            FUZZ_CHECK(terminated(m->body.list_req.ns_name, KVD_NS_NAME_BYTES), "ns");
        else
            FUZZ_CHECK(m->body.list_rep.next_cursor_len <= KVD_CURSOR_MAX, "cursor");
        break;
    case KVD_METHOD_STATS:
        if (m->reply) {
            const kvd_stats_rep_t *s = &m->body.stats_rep;
            FUZZ_CHECK(terminated(s->check_error, sizeof(s->check_error)), "check");
            for (size_t i = 0; i < s->n_namespaces; i++)
                FUZZ_CHECK(terminated(s->namespaces[i].name, KVD_NS_NAME_BYTES), "ns");
        }
        break;
    default: break;
    }
}

/* Encodes m; the payload is left in out (header checked and dropped). */
static void encode(const kvd_msg_t *m, kvd_buf_t *out)
{
    out->len = 0;
    int rc = kvd_msg_pack(m, KVD_FRAME_LIMIT_MAX, out);
    FUZZ_CHECK(rc == KVD_OK,
               "a decoded message (method %d, reply %d) does not encode: %d",
               (int)m->method, (int)m->reply, rc);
    FUZZ_CHECK(out->len > KVD_FRAME_HEADER_BYTES, "empty frame");
    uint32_t n = (uint32_t)out->data[0] | (uint32_t)out->data[1] << 8 |
                 (uint32_t)out->data[2] << 16 | (uint32_t)out->data[3] << 24;
    FUZZ_CHECK(n == out->len - KVD_FRAME_HEADER_BYTES, "header %u for %zu bytes", n,
               out->len - KVD_FRAME_HEADER_BYTES);
    kvd_buf_consume(out, KVD_FRAME_HEADER_BYTES);
}

static void check_payload(const uint8_t *payload, size_t len)
{
    kvd_msg_limits_t lim = {.max_items = DAEMON_MAX_BATCH,
                            .max_pools = KVD_LOOKUP_POOLS_MAX};
    kvd_msg_t lm, m;
    int rl = kvd_msg_decode_limited(payload, len, &lim, &lm);
    FUZZ_CHECK(status_is(rl, KVD_OK, KVD_ERR_PROTOCOL, KVD_ERR_UNKNOWN_METHOD,
                         KVD_ERR_TOO_LARGE),
               "limited decode: %d", rl);
    int ru = kvd_msg_decode(payload, len, &m);
    FUZZ_CHECK(
        status_is(ru, KVD_OK, KVD_ERR_PROTOCOL, KVD_ERR_UNKNOWN_METHOD, KVD_ERR_PROTOCOL),
        "decode: %d", ru);
    if (rl == KVD_OK || rl == KVD_ERR_TOO_LARGE)
        FUZZ_CHECK(ru == KVD_OK, "accepted with limits (%d), refused without: %d", rl,
                   ru);
    if (rl == KVD_ERR_TOO_LARGE)
        FUZZ_CHECK(lm.id == m.id && lm.method == m.method && lm.reply == m.reply,
                   "a refused batch names its request");
    kvd_msg_clear(&lm);
    if (ru != KVD_OK) {
        kvd_msg_clear(&m);
        return;
    }
    check_strings(&m);

    kvd_buf_t once, twice;
    kvd_buf_init(&once, KVD_MEM_OTHER);
    kvd_buf_init(&twice, KVD_MEM_OTHER);
    encode(&m, &once);
    kvd_msg_t again;
    int r2 = kvd_msg_decode(once.data, once.len, &again);
    FUZZ_CHECK(r2 == KVD_OK, "a re-encoded message does not decode: %d", r2);
    FUZZ_CHECK(again.id == m.id && again.method == m.method && again.reply == m.reply &&
                   again.status == m.status && again.error_index == m.error_index,
               "the envelope changed in a round trip");
    FUZZ_CHECK(strcmp(again.error, m.error) == 0, "the error text changed");
    check_strings(&again);
    encode(&again, &twice);
    FUZZ_CHECK(once.len == twice.len && memcmp(once.data, twice.data, once.len) == 0,
               "encoding is not a fixed point (%zu then %zu bytes, method %d)", once.len,
               twice.len, (int)m.method);
    kvd_msg_clear(&again);
    kvd_msg_clear(&m);
    kvd_buf_free(&once);
    kvd_buf_free(&twice);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    size_t piece = data[0] ? data[0] : size;
    data++;
    size--;
    kvd_framer_t f;
    kvd_framer_init(&f, KVD_FRAME_DEFAULT_MAX, KVD_MEM_CONN);
    size_t off = 0;
    bool dead = false;
    while (off < size && !dead) {
        size_t n = piece < size - off ? piece : size - off;
        uint8_t *space;
        size_t avail;
        FUZZ_CHECK(kvd_framer_space(&f, n, &space, &avail) == KVD_OK, "space");
        FUZZ_CHECK(avail >= n, "framer gave %zu of %zu bytes", avail, n);
        memcpy(space, data + off, n);
        kvd_framer_commit(&f, n);
        off += n;
        for (;;) {
            const uint8_t *payload;
            size_t len;
            size_t before = kvd_framer_pending(&f);
            int got = kvd_framer_next(&f, &payload, &len);
            if (got == 0)
                break;
            if (got < 0) {
                FUZZ_CHECK(got == KVD_ERR_PROTOCOL || got == KVD_ERR_TOO_LARGE,
                           "framer: %d", got);
                dead = true; /* the daemon ends the connection here */
                break;
            }
            FUZZ_CHECK(got == 1 && len > 0 && len <= KVD_FRAME_DEFAULT_MAX,
                       "frame of %zu", len);
            FUZZ_CHECK(kvd_framer_pending(&f) == before - len - KVD_FRAME_HEADER_BYTES,
                       "pending bytes");
            check_payload(payload, len);
        }
    }
    kvd_framer_free(&f);
    return 0;
}
