/*
 * Description: helpers shared by the message tests of proto/ (test_msg.c,
 * test_msg_fuzz.c, test_msg_limits.c, test_msg_budget.c): packing a message
 * into a bare payload, decoding a payload from a private copy (so that ASan
 * sees any read past the end) and writing protobuf varints by hand. They
 * check with cmocka's assertions, so include this after <cmocka.h>.
 */
#ifndef KVD_TEST_MSG_UTIL_H
#define KVD_TEST_MSG_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include "kvd_proto.h"

/* Packs m and returns the payload (without header) in a new block. */
uint8_t *pack_payload(const kvd_msg_t *m, size_t *len);

/* kvd_msg_decode() of a private copy of bytes[0..len). */
int decode_bytes(const uint8_t *bytes, size_t len, kvd_msg_t *out);

/* kvd_msg_decode_limited() with lim of a private copy of payload[0..len). */
int decode_with(const uint8_t *payload, size_t len, const kvd_msg_limits_t *lim,
                kvd_msg_t *out);

/* Appends v as a protobuf varint; returns the bytes written. */
size_t put_varint(uint8_t *p, uint64_t v);

#endif
