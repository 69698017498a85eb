/*
 * Description: the field lists of the flat messages (kvd_proto.h:
 * NamespaceSpec, StoreStats, NamespaceInfo, ObjectInfo, Nic).
 *
 * - Every field survives kvd_msg_pack then kvd_msg_decode, each holding a
 *   value of its own that uses the top bits of its type (so a narrowing
 *   copy or a missing one shows).
 * - The list's order is kvdock.proto's numbering: a payload written by hand
 *   with only field number k set (tag = k << 3 | wire type) decodes into
 *   the list's k-th field (ObjectInfo: its parent, number 3, is not in the
 *   list) and leaves every other field zero.
 * - Names: unique in a list; metric names are kvdock_<group>_<name>, with
 *   _total exactly for counters, valid Prometheus names, unique over all
 *   lists, and only numeric fields are metrics.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvd_proto.h"
#include "msg_util.h"

static const kvd_field_list_t *const lists[] = {
    &kvd_ns_spec_fields, &kvd_store_stats_fields, &kvd_mem_stats_fields,
    &kvd_ns_fields,      &kvd_obj_fields,         &kvd_nic_fields,
};

/* Gives field i of obj a value of its own (seed tells objects apart). */
static void fill_field(const kvd_field_t *f, size_t i, unsigned seed, void *obj)
{
    char *p = (char *)obj + f->offset;
    switch (f->type) {
    case KVD_FIELD_U32: *(uint32_t *)p = 0x80000000u + (uint32_t)(seed * 64 + i); break;
    case KVD_FIELD_I32: *(int32_t *)p = -(int32_t)(0x40000000 + seed * 64 + i); break;
    case KVD_FIELD_U64:
        *(uint64_t *)p = 0x8000000000000000ull + ((uint64_t)seed << 32) + i;
        break;
    case KVD_FIELD_F64: *(double *)p = 1e300 + (double)(seed * 64 + i) * 1e285; break;
    case KVD_FIELD_BOOL: *(bool *)p = true; break;
    case KVD_FIELD_STR:
        /* the longest string the field takes: size - 1 characters */
        memset(p, 'a' + (int)((seed + i) % 26), f->size - 1);
        p[f->size - 1] = '\0';
        break;
    case KVD_FIELD_KEY:
        for (size_t b = 0; b < KVD_KEY_BYTES; b++)
            p[b] = (char)(seed * 64 + i + b);
        break;
    }
}

/* Fills every field of n objects of list l. */
static void fill(const kvd_field_list_t *l, void *objs, size_t n, size_t struct_size)
{
    for (size_t k = 0; k < n; k++)
        for (size_t i = 0; i < l->n; i++)
            fill_field(&l->fields[i], i, (unsigned)k + 1, (char *)objs + k * struct_size);
}

/* Whether field f of obj is zero (an empty string, an all-zero key). */
static bool field_is_zero(const kvd_field_t *f, const void *obj)
{
    const char *p = (const char *)obj + f->offset;
    if (f->type == KVD_FIELD_STR)
        return p[0] == '\0';
    for (size_t b = 0; b < f->size; b++)
        if (p[b] != 0)
            return false;
    return true;
}

/* Every field of list l equal in want and got (n objects each). */
static void expect_fields(const kvd_field_list_t *l, const void *want, const void *got,
                          size_t n, size_t struct_size)
{
    for (size_t k = 0; k < n; k++) {
        for (size_t i = 0; i < l->n; i++) {
            const kvd_field_t *f = &l->fields[i];
            const char *w = (const char *)want + k * struct_size + f->offset;
            const char *g = (const char *)got + k * struct_size + f->offset;
            if (f->type == KVD_FIELD_STR) {
                if (strcmp(w, g) != 0)
                    print_error("%s.%s: '%s' came back as '%s'\n", l->group, f->name, w,
                                g);
                assert_string_equal(w, g);
                continue;
            }
            size_t size = f->size;
            if (memcmp(w, g, size) != 0)
                print_error("%s.%s (object %zu) did not come back\n", l->group, f->name,
                            k);
            assert_memory_equal(w, g, size);
        }
    }
}

/* ----------------------------------------------------------- round trips */

static void pack_decode(const kvd_msg_t *m, kvd_msg_t *out)
{
    size_t len;
    uint8_t *p = pack_payload(m, &len);
    assert_int_equal(decode_bytes(p, len, out), KVD_OK);
    free(p);
}

static void test_stats_round_trip(void **state)
{
    (void)state;
    kvd_ns_msg_t ns[2];
    kvd_nic_msg_t nics[3];
    memset(ns, 0, sizeof(ns));
    memset(nics, 0, sizeof(nics));
    kvd_msg_t m, out;
    kvd_msg_request(&m, 7, KVD_METHOD_STATS);
    m.reply = true;
    kvd_stats_rep_t *st = &m.body.stats_rep;
    fill(&kvd_store_stats_fields, &st->store, 1, sizeof(st->store));
    fill(&kvd_mem_stats_fields, &st->memory, 4, sizeof(st->memory));
    fill(&kvd_ns_fields, ns, 2, sizeof(ns[0]));
    fill(&kvd_nic_fields, nics, 3, sizeof(nics[0]));
    st->namespaces = ns;
    st->n_namespaces = 2;
    st->nics = nics;
    st->n_nics = 3;
    pack_decode(&m, &out);
    const kvd_stats_rep_t *got = &out.body.stats_rep;
    expect_fields(&kvd_store_stats_fields, &st->store, &got->store, 1, sizeof(st->store));
    expect_fields(&kvd_mem_stats_fields, &st->memory, &got->memory, 1,
                  sizeof(st->memory));
    assert_int_equal(got->n_namespaces, 2);
    expect_fields(&kvd_ns_fields, ns, got->namespaces, 2, sizeof(ns[0]));
    assert_int_equal(got->n_nics, 3);
    expect_fields(&kvd_nic_fields, nics, got->nics, 3, sizeof(nics[0]));
    kvd_msg_clear(&out);
}

static void test_objects_round_trip(void **state)
{
    (void)state;
    kvd_obj_msg_t objs[3];
    memset(objs, 0, sizeof(objs));
    fill(&kvd_obj_fields, objs, 3, sizeof(objs[0]));
    /* the parent, outside the list: a key, a tag, none */
    memset(objs[0].parent, 0x77, KVD_KEY_BYTES);
    objs[0].parent_len = KVD_KEY_BYTES;
    memset(objs[1].parent, 0x66, KVD_KEY_TAG_BYTES);
    objs[1].parent_len = KVD_KEY_TAG_BYTES;
    kvd_msg_t m, out;
    kvd_msg_request(&m, 8, KVD_METHOD_INSPECT);
    m.reply = true;
    m.body.inspect_rep.objects = objs;
    m.body.inspect_rep.n_objects = 3;
    pack_decode(&m, &out);
    const kvd_inspect_rep_t *got = &out.body.inspect_rep;
    assert_int_equal(got->n_objects, 3);
    expect_fields(&kvd_obj_fields, objs, got->objects, 3, sizeof(objs[0]));
    for (size_t i = 0; i < 3; i++) {
        assert_int_equal(got->objects[i].parent_len, objs[i].parent_len);
        assert_memory_equal(got->objects[i].parent, objs[i].parent, objs[i].parent_len);
    }
    kvd_msg_clear(&out);
}

static void test_specs_round_trip(void **state)
{
    (void)state;
    kvd_ns_spec_t specs[2];
    memset(specs, 0, sizeof(specs));
    fill(&kvd_ns_spec_fields, specs, 2, sizeof(specs[0]));
    kvd_msg_t m, out;
    kvd_msg_request(&m, 9, KVD_METHOD_REGISTER_NAMESPACE);
    m.body.register_req.namespaces = specs;
    m.body.register_req.n = 2;
    pack_decode(&m, &out);
    assert_int_equal(out.body.register_req.n, 2);
    expect_fields(&kvd_ns_spec_fields, specs, out.body.register_req.namespaces, 2,
                  sizeof(specs[0]));
    kvd_msg_clear(&out);
}

/* ---------------------------------------------------- wire field numbers */

enum { WIRE_VARINT = 0, WIRE_FIXED64 = 1, WIRE_LEN = 2 };

static size_t put_tag(uint8_t *p, unsigned field, unsigned wire)
{
    return put_varint(p, (uint64_t)field << 3 | wire);
}

/* Appends field `number` holding a value of field f's type; the value is
 * written into want too (a zeroed object of the list's struct). */
static size_t put_field(uint8_t *p, unsigned number, const kvd_field_t *f, void *want)
{
    char *w = (char *)want + f->offset;
    size_t n = 0;
    switch (f->type) {
    case KVD_FIELD_U32:
        *(uint32_t *)w = 0xfedcba98u;
        n += put_tag(p, number, WIRE_VARINT);
        n += put_varint(p + n, 0xfedcba98u);
        break;
    case KVD_FIELD_I32:
        *(int32_t *)w = -12345;
        n += put_tag(p, number, WIRE_VARINT);
        n += put_varint(p + n, (uint64_t)(int64_t)-12345); /* int32: sign-extended */
        break;
    case KVD_FIELD_U64:
        *(uint64_t *)w = 0xfedcba9876543210ull;
        n += put_tag(p, number, WIRE_VARINT);
        n += put_varint(p + n, 0xfedcba9876543210ull);
        break;
    case KVD_FIELD_BOOL:
        *(bool *)w = true;
        n += put_tag(p, number, WIRE_VARINT);
        n += put_varint(p + n, 1);
        break;
    case KVD_FIELD_F64: {
        double v = 0.375;
        *(double *)w = v;
        n += put_tag(p, number, WIRE_FIXED64);
        memcpy(p + n, &v, 8); /* little-endian hosts only, as kvdock */
        n += 8;
        break;
    }
    case KVD_FIELD_STR:
        strcpy(w, "xyz");
        n += put_tag(p, number, WIRE_LEN);
        n += put_varint(p + n, 3);
        memcpy(p + n, "xyz", 3);
        n += 3;
        break;
    case KVD_FIELD_KEY:
        memset(w, 0x5c, KVD_KEY_BYTES);
        n += put_tag(p, number, WIRE_LEN);
        n += put_varint(p + n, KVD_KEY_BYTES);
        memset(p + n, 0x5c, KVD_KEY_BYTES);
        n += KVD_KEY_BYTES;
        break;
    }
    return n;
}

/* Wraps body[0..len) as length-delimited field `number` at p. */
static size_t put_message(uint8_t *p, unsigned number, const uint8_t *body, size_t len)
{
    size_t n = put_tag(p, number, WIRE_LEN);
    n += put_varint(p + n, len);
    memcpy(p + n, body, len);
    return n + len;
}

/*
 * An Envelope (id 1, method, reply) whose body (Envelope field body_number)
 * holds the message (its field msg_number) that holds field `number` of
 * list l. Decodes it into out.
 */
static void decode_one_field(kvd_method_t method, bool reply, unsigned body_number,
                             unsigned msg_number, unsigned number, const kvd_field_t *f,
                             const kvd_field_t *key, void *want, kvd_msg_t *out)
{
    uint8_t inner[128], body[160], env[200];
    size_t ni = put_field(inner, number, f, want);
    if (key != NULL && key != f) /* ObjectInfo needs its key: number 2 */
        ni += put_field(inner + ni, 2, key, want);
    size_t nb = put_message(body, msg_number, inner, ni);
    size_t ne = 0;
    ne += put_tag(env + ne, 1, WIRE_VARINT);
    ne += put_varint(env + ne, 1);
    ne += put_tag(env + ne, 2, WIRE_VARINT);
    ne += put_varint(env + ne, (uint64_t)method);
    ne += put_tag(env + ne, 3, WIRE_VARINT);
    ne += put_varint(env + ne, reply);
    ne += put_message(env + ne, body_number, body, nb);
    int rc = decode_bytes(env, ne, out);
    if (rc != KVD_OK)
        print_error("field %s (number %u) does not decode: %s\n", f->name, number,
                    kvd_status_str(rc));
    assert_int_equal(rc, KVD_OK);
}

/* Field by field, number k lands in the list's field k and nowhere else.
 * got() finds the decoded object in a message. */
static void check_numbers(const kvd_field_list_t *l, size_t struct_size,
                          kvd_method_t method, bool reply, unsigned body_number,
                          unsigned msg_number, const void *(*got)(const kvd_msg_t *),
                          unsigned skip_number)
{
    /* ObjectInfo cannot go without its key: it rides along, at number 2 */
    const kvd_field_t *key = l == &kvd_obj_fields ? &l->fields[1] : NULL;
    for (size_t i = 0; i < l->n; i++) {
        unsigned number = (unsigned)i + 1;
        if (skip_number != 0 && number >= skip_number)
            number++;
        char *want = calloc(1, struct_size);
        assert_non_null(want);
        kvd_msg_t out;
        decode_one_field(method, reply, body_number, msg_number, number, &l->fields[i],
                         key, want, &out);
        const void *g = got(&out);
        assert_non_null(g);
        /* the field came where the list says, every other field is zero */
        expect_fields(l, want, g, 1, struct_size);
        for (size_t k = 0; k < l->n; k++)
            if (k != i && &l->fields[k] != key && !field_is_zero(&l->fields[k], g)) {
                print_error("%s: number %u also set %s\n", l->group, number,
                            l->fields[k].name);
                fail();
            }
        free(want);
        kvd_msg_clear(&out);
    }
}

static const void *got_store(const kvd_msg_t *m)
{
    return &m->body.stats_rep.store;
}
static const void *got_ns(const kvd_msg_t *m)
{
    return m->body.stats_rep.n_namespaces == 1 ? m->body.stats_rep.namespaces : NULL;
}
static const void *got_nic(const kvd_msg_t *m)
{
    return m->body.stats_rep.n_nics == 1 ? m->body.stats_rep.nics : NULL;
}
static const void *got_obj(const kvd_msg_t *m)
{
    return m->body.inspect_rep.n_objects == 1 ? m->body.inspect_rep.objects : NULL;
}
static const void *got_spec(const kvd_msg_t *m)
{
    return m->body.register_req.n == 1 ? m->body.register_req.namespaces : NULL;
}

/* Envelope.stats_reply = 15 holds StoreStats store = 11, NamespaceInfo
 * namespaces = 12, Nic nics = 15; inspect_reply = 31 holds ObjectInfo
 * objects = 1; register_request = 16 holds NamespaceSpec namespaces = 1. */
static void test_wire_numbers(void **state)
{
    (void)state;
    check_numbers(&kvd_store_stats_fields, sizeof(kvd_store_stats_msg_t),
                  KVD_METHOD_STATS, true, 15, 11, got_store, 0);
    check_numbers(&kvd_ns_fields, sizeof(kvd_ns_msg_t), KVD_METHOD_STATS, true, 15, 12,
                  got_ns, 0);
    check_numbers(&kvd_nic_fields, sizeof(kvd_nic_msg_t), KVD_METHOD_STATS, true, 15, 15,
                  got_nic, 0);
    check_numbers(&kvd_obj_fields, sizeof(kvd_obj_msg_t), KVD_METHOD_INSPECT, true, 31, 1,
                  got_obj, 3 /* parent */);
    check_numbers(&kvd_ns_spec_fields, sizeof(kvd_ns_spec_t),
                  KVD_METHOD_REGISTER_NAMESPACE, false, 16, 1, got_spec, 0);
}

/* ------------------------------------------------------------------ names */

static bool prometheus_name(const char *s)
{
    if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || *s == '_' || *s == ':'))
        return false;
    for (s++; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') ||
              (*s >= '0' && *s <= '9') || *s == '_' || *s == ':'))
            return false;
    return true;
}

static void test_names(void **state)
{
    (void)state;
    char seen[256][128];
    size_t n_seen = 0;
    for (size_t li = 0; li < KVD_ARRAY_SIZE(lists); li++) {
        const kvd_field_list_t *l = lists[li];
        assert_true(l->n > 0);
        for (size_t i = 0; i < l->n; i++) {
            const kvd_field_t *f = &l->fields[i];
            for (size_t k = 0; k < i; k++)
                assert_string_not_equal(f->name, l->fields[k].name);
            char name[128];
            int rc = kvd_field_metric_name(l, f, name, sizeof(name));
            if (f->metric == KVD_METRIC_NONE) {
                assert_int_equal(rc, KVD_ERR_INVALID);
                continue;
            }
            assert_int_equal(rc, KVD_OK);
            assert_true(f->type == KVD_FIELD_U32 || f->type == KVD_FIELD_I32 ||
                        f->type == KVD_FIELD_U64 || f->type == KVD_FIELD_F64);
            assert_non_null(f->help);
            assert_true(f->help[0] != '\0' && strchr(f->help, '\n') == NULL);
            assert_true(prometheus_name(name));
            char want[128];
            snprintf(want, sizeof(want), "kvdock_%s_%s%s", l->group, f->name,
                     f->metric == KVD_METRIC_COUNTER ? "_total" : "");
            assert_string_equal(name, want);
            for (size_t k = 0; k < n_seen; k++)
                assert_string_not_equal(name, seen[k]);
            assert_true(n_seen < KVD_ARRAY_SIZE(seen));
            strcpy(seen[n_seen++], name);
        }
    }
    /* the counter the issue named: one name on the wire, in JSON, in metrics */
    char name[64];
    for (size_t i = 0; i < kvd_ns_fields.n; i++)
        if (strcmp(kvd_ns_fields.fields[i].name, "published_bytes") == 0) {
            assert_int_equal(kvd_field_metric_name(&kvd_ns_fields,
                                                   &kvd_ns_fields.fields[i], name,
                                                   sizeof(name)),
                             KVD_OK);
            assert_string_equal(name, "kvdock_ns_published_bytes_total");
        }
    assert_int_equal(kvd_field_metric_name(&kvd_store_stats_fields,
                                           &kvd_store_stats_fields.fields[0], name, 10),
                     KVD_ERR_TOO_LARGE);
}

/* kvd_field_text: what --json and /metrics print. */
static void test_field_text(void **state)
{
    (void)state;
    kvd_nic_msg_t nic = {.port = 4000000000u, .numa_node = -1};
    kvd_strlcpy(nic.device, "mlx5_\"0", sizeof(nic.device));
    char buf[80];
    const kvd_field_t *f = kvd_nic_fields.fields;
    assert_string_equal(kvd_field_text(&f[0], &nic, buf, sizeof(buf)), "mlx5_\"0");
    assert_string_equal(kvd_field_text(&f[1], &nic, buf, sizeof(buf)), "4000000000");
    assert_string_equal(kvd_field_text(&f[5], &nic, buf, sizeof(buf)), "-1");
    kvd_store_stats_msg_t s = {.fragmentation = 0.25, .pool_bytes = UINT64_MAX};
    const kvd_field_t *g = kvd_store_stats_fields.fields;
    assert_string_equal(kvd_field_text(&g[0], &s, buf, sizeof(buf)),
                        "18446744073709551615");
    assert_int_equal(kvd_field_u64(&g[0], &s), UINT64_MAX);
    assert_string_equal(kvd_field_text(&g[12], &s, buf, sizeof(buf)), "0.25");
    kvd_ns_msg_t ns = {.rank_replicated = true};
    assert_string_equal(kvd_field_text(&kvd_ns_fields.fields[3], &ns, buf, sizeof(buf)),
                        "true");
    kvd_obj_msg_t o = {0};
    memset(o.key, 0xab, sizeof(o.key));
    kvd_field_text(&kvd_obj_fields.fields[1], &o, buf, sizeof(buf));
    assert_int_equal(strlen(buf), 2 * KVD_KEY_BYTES);
    assert_true(strspn(buf, "ab") == 2 * KVD_KEY_BYTES);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stats_round_trip),
        cmocka_unit_test(test_objects_round_trip),
        cmocka_unit_test(test_specs_round_trip),
        cmocka_unit_test(test_wire_numbers),
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_field_text),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
