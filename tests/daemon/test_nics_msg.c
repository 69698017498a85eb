/*
 * Description: the RDMA ports of a Stats reply. kvd_nics_to_msg copies a
 * port list into a reply's arena (nothing for an empty list); a reply with
 * ports packs and decodes back field for field (numa_node -1 included); a
 * payload written by hand from kvdock.proto (StatsReply.nics = 15, Nic
 * fields 1..8) decodes to the values written; a device name longer than
 * its field is refused as a protocol error.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "nics.h"

static kvd_nic_t nic_of(const char *dev, uint32_t port, const char *state,
                        const char *link, const char *gid, int numa, const char *netdev,
                        uint32_t mtu)
{
    kvd_nic_t n;
    memset(&n, 0, sizeof(n));
    strcpy(n.device, dev);
    n.port = port;
    strcpy(n.state, state);
    n.active = strcmp(state, "active") == 0;
    n.verbs_ok = true;
    strcpy(n.link_layer, link);
    strcpy(n.gid, gid);
    n.numa_node = numa;
    strcpy(n.netdev, netdev);
    n.active_mtu_bytes = mtu;
    return n;
}

static void assert_nic_msg(const kvd_nic_msg_t *m, const kvd_nic_t *n)
{
    assert_string_equal(m->device, n->device);
    assert_int_equal(m->port, n->port);
    assert_string_equal(m->state, n->state);
    assert_string_equal(m->link_layer, n->link_layer);
    assert_string_equal(m->gid, n->gid);
    assert_int_equal(m->numa_node, n->numa_node);
    assert_string_equal(m->netdev, n->netdev);
    assert_int_equal(m->active_mtu, n->active_mtu_bytes);
}

static void test_to_msg_and_round_trip(void **state)
{
    (void)state;
    kvd_nic_t nics[] = {
        nic_of("mlx5_0", 1, "active", "InfiniBand", "fe80::ba59:9f03:c:1", 0, "ib0",
               4096),
        nic_of("mlx5_1", 2, "down", "Ethernet", "", -1, "", 0),
    };
    kvd_nic_list_t l = {.nics = nics, .n = 2, .cap = 2};
    kvd_msg_t *m = calloc(2, sizeof(*m));
    assert_non_null(m);
    kvd_msg_t *out = m + 1;
    kvd_msg_request(m, 9, KVD_METHOD_STATS);
    m->reply = true;
    kvd_stats_rep_t *st = &m->body.stats_rep;
    assert_int_equal(kvd_nics_to_msg(&l, m, &st->nics, &st->n_nics), KVD_OK);
    assert_int_equal(st->n_nics, 2);
    assert_nic_msg(&st->nics[0], &nics[0]);
    assert_nic_msg(&st->nics[1], &nics[1]);

    kvd_buf_t b;
    kvd_buf_init(&b, KVD_MEM_OTHER);
    assert_int_equal(kvd_msg_pack(m, KVD_FRAME_DEFAULT_MAX, &b), KVD_OK);
    assert_int_equal(kvd_msg_decode(b.data + KVD_FRAME_HEADER_BYTES,
                                    b.len - KVD_FRAME_HEADER_BYTES, out),
                     KVD_OK);
    assert_true(out->reply);
    assert_int_equal(out->body.stats_rep.n_nics, 2);
    assert_nic_msg(&out->body.stats_rep.nics[0], &nics[0]);
    assert_nic_msg(&out->body.stats_rep.nics[1], &nics[1]);
    kvd_buf_free(&b);
    kvd_msg_clear(out);

    /* an empty list: nothing in the reply, which still round-trips */
    kvd_nic_list_t none = {0};
    kvd_msg_clear(m);
    kvd_msg_request(m, 10, KVD_METHOD_STATS);
    m->reply = true;
    st = &m->body.stats_rep;
    st->nics = (kvd_nic_msg_t *)1; /* must be overwritten */
    st->n_nics = 7;
    assert_int_equal(kvd_nics_to_msg(&none, m, &st->nics, &st->n_nics), KVD_OK);
    assert_null(st->nics);
    assert_int_equal(st->n_nics, 0);
    kvd_buf_init(&b, KVD_MEM_OTHER);
    assert_int_equal(kvd_msg_pack(m, KVD_FRAME_DEFAULT_MAX, &b), KVD_OK);
    assert_int_equal(kvd_msg_decode(b.data + KVD_FRAME_HEADER_BYTES,
                                    b.len - KVD_FRAME_HEADER_BYTES, out),
                     KVD_OK);
    assert_int_equal(out->body.stats_rep.n_nics, 0);
    kvd_buf_free(&b);
    kvd_msg_clear(out);
    kvd_msg_clear(m);
    free(m);
}

/* Envelope{id 7, method STATS, reply, stats_reply{nics{"mlx5_0", 1,
 * "active", "Ethernet", "fe80::1", -1, "eth0", 1024}}}. Tags are
 * field << 3 | wire type; -1 as int32 is a 10-byte varint. */
static const uint8_t hand_payload[] = {
    0x08, 0x07, 0x10, 0x03, 0x18, 0x01, /* id, method, reply */
    0x7a, 59,                           /* Envelope.stats_reply (15), 59 bytes */
    0x7a, 57,                           /* StatsReply.nics (15), 57 bytes */
    0x0a, 6,    'm',  'l',  'x',  '5',  '_',  '0',                    /* device */
    0x10, 1,                                                          /* port */
    0x1a, 6,    'a',  'c',  't',  'i',  'v',  'e',                    /* state */
    0x22, 8,    'E',  't',  'h',  'e',  'r',  'n',  'e',  't',        /* link_layer */
    0x2a, 7,    'f',  'e',  '8',  '0',  ':',  ':',  '1',              /* gid */
    0x30, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01, /* numa_node */
    0x3a, 4,    'e',  't',  'h',  '0',                                /* netdev */
    0x40, 0x80, 0x08,                                                 /* active_mtu */
};

static void test_hand_written_payload(void **state)
{
    (void)state;
    kvd_msg_t *out = calloc(1, sizeof(*out));
    assert_non_null(out);
    assert_int_equal(kvd_msg_decode(hand_payload, sizeof(hand_payload), out), KVD_OK);
    assert_int_equal(out->id, 7);
    assert_int_equal(out->method, KVD_METHOD_STATS);
    assert_true(out->reply);
    const kvd_stats_rep_t *st = &out->body.stats_rep;
    assert_int_equal(st->n_nics, 1);
    kvd_nic_t want =
        nic_of("mlx5_0", 1, "active", "Ethernet", "fe80::1", -1, "eth0", 1024);
    assert_nic_msg(&st->nics[0], &want);
    kvd_msg_clear(out);
    free(out);
}

/* A device name of KVD_NIC_NAME_BYTES characters has no room for its NUL. */
static void test_long_device_refused(void **state)
{
    (void)state;
    /* id 1, method STATS, reply; stats_reply, nics, device: lengths */
    const uint8_t head[] = {0x08, 0x01,
                            0x10, 0x03,
                            0x18, 0x01,
                            0x7a, 4 + KVD_NIC_NAME_BYTES,
                            0x7a, 2 + KVD_NIC_NAME_BYTES,
                            0x0a, KVD_NIC_NAME_BYTES};
    uint8_t p[sizeof(head) + KVD_NIC_NAME_BYTES];
    memcpy(p, head, sizeof(head));
    memset(p + sizeof(head), 'd', KVD_NIC_NAME_BYTES);
    size_t n = sizeof(p);
    kvd_msg_t *out = calloc(1, sizeof(*out));
    assert_non_null(out);
    assert_int_equal(kvd_msg_decode(p, n, out), KVD_ERR_PROTOCOL);
    kvd_msg_clear(out);

    /* one character less fits */
    p[7]--, p[9]--, p[11]--;
    n--;
    assert_int_equal(kvd_msg_decode(p, n, out), KVD_OK);
    assert_int_equal(out->body.stats_rep.n_nics, 1);
    assert_int_equal(strlen(out->body.stats_rep.nics[0].device), KVD_NIC_NAME_BYTES - 1);
    kvd_msg_clear(out);
    free(out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_to_msg_and_round_trip),
        cmocka_unit_test(test_hand_written_payload),
        cmocka_unit_test(test_long_device_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
