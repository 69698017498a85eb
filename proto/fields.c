/*
 * fields.c - the descriptor tables of the flat messages, made from their
 * field lists in kvd_proto.h, and what readers of a table need: a field's
 * value as text or as a number, and its metric name.
 *
 * The tables are constant data; everything here is pure and thread-safe.
 */
#include "kvd_proto.h"

#include <stddef.h>
#include <stdio.h>
#include <string.h>

/* One row of a table: FIELD_STRUCT is the C struct of the list at hand. */
#define FIELD_ROW(type, name, size, metric, help) \
    {#name,                                       \
     KVD_FIELD_##type,                            \
     offsetof(FIELD_STRUCT, name),                \
     sizeof(((FIELD_STRUCT *)0)->name),           \
     KVD_METRIC_##metric,                         \
     help},

#define FIELD_STRUCT kvd_ns_spec_t
static const kvd_field_t ns_spec_rows[] = {KVD_NS_SPEC_FIELDS(FIELD_ROW)};
#undef FIELD_STRUCT
#define FIELD_STRUCT kvd_store_stats_msg_t
static const kvd_field_t store_stats_rows[] = {KVD_STORE_STATS_FIELDS(FIELD_ROW)};
#undef FIELD_STRUCT
#define FIELD_STRUCT kvd_ns_msg_t
static const kvd_field_t ns_rows[] = {KVD_NS_FIELDS(FIELD_ROW)};
#undef FIELD_STRUCT
#define FIELD_STRUCT kvd_mem_stats_t
static const kvd_field_t mem_stats_rows[] = {KVD_MEM_STATS_FIELDS(FIELD_ROW)};
#undef FIELD_STRUCT
#define FIELD_STRUCT kvd_obj_msg_t
static const kvd_field_t obj_rows[] = {KVD_OBJ_FIELDS(FIELD_ROW)};
#undef FIELD_STRUCT
#define FIELD_STRUCT kvd_nic_msg_t
static const kvd_field_t nic_rows[] = {KVD_NIC_FIELDS(FIELD_ROW)};
#undef FIELD_STRUCT
#define FIELD_STRUCT kvd_tenant_msg_t
static const kvd_field_t tenant_rows[] = {KVD_TENANT_FIELDS(FIELD_ROW)};
#undef FIELD_STRUCT
#define FIELD_STRUCT kvd_member_msg_t
static const kvd_field_t member_rows[] = {KVD_MEMBER_FIELDS(FIELD_ROW)};
#undef FIELD_STRUCT

const kvd_field_list_t kvd_ns_spec_fields = {"ns_spec", ns_spec_rows,
                                             KVD_ARRAY_SIZE(ns_spec_rows)};
const kvd_field_list_t kvd_store_stats_fields = {"store", store_stats_rows,
                                                 KVD_ARRAY_SIZE(store_stats_rows)};
const kvd_field_list_t kvd_ns_fields = {"ns", ns_rows, KVD_ARRAY_SIZE(ns_rows)};
const kvd_field_list_t kvd_mem_stats_fields = {"memory", mem_stats_rows,
                                               KVD_ARRAY_SIZE(mem_stats_rows)};
const kvd_field_list_t kvd_obj_fields = {"object", obj_rows, KVD_ARRAY_SIZE(obj_rows)};
const kvd_field_list_t kvd_nic_fields = {"nic", nic_rows, KVD_ARRAY_SIZE(nic_rows)};
const kvd_field_list_t kvd_tenant_fields = {"tenant", tenant_rows,
                                            KVD_ARRAY_SIZE(tenant_rows)};
const kvd_field_list_t kvd_member_fields = {"member", member_rows,
                                            KVD_ARRAY_SIZE(member_rows)};

/* The member of obj that f describes. */
static const void *member(const kvd_field_t *f, const void *obj)
{
    return (const char *)obj + f->offset;
}

uint64_t kvd_field_u64(const kvd_field_t *f, const void *obj)
{
    const void *p = member(f, obj);
    switch (f->type) {
    case KVD_FIELD_U32: return *(const uint32_t *)p;
    case KVD_FIELD_I32:
        return *(const int32_t *)p > 0 ? (uint64_t) * (const int32_t *)p : 0;
    case KVD_FIELD_U64: return *(const uint64_t *)p;
    case KVD_FIELD_BOOL: return *(const bool *)p;
    case KVD_FIELD_F64:
    case KVD_FIELD_STR:
    case KVD_FIELD_KEY: break;
    }
    return 0;
}

double kvd_field_f64(const kvd_field_t *f, const void *obj)
{
    const void *p = member(f, obj);
    switch (f->type) {
    case KVD_FIELD_U32: return (double)*(const uint32_t *)p;
    case KVD_FIELD_I32: return (double)*(const int32_t *)p;
    case KVD_FIELD_U64: return (double)*(const uint64_t *)p;
    case KVD_FIELD_F64: return *(const double *)p;
    case KVD_FIELD_BOOL: return *(const bool *)p ? 1.0 : 0.0;
    case KVD_FIELD_STR:
    case KVD_FIELD_KEY: break;
    }
    return 0.0;
}

const char *kvd_field_text(const kvd_field_t *f, const void *obj, char *buf, size_t len)
{
    const void *p = member(f, obj);
    switch (f->type) {
    case KVD_FIELD_U32: snprintf(buf, len, "%u", *(const uint32_t *)p); break;
    case KVD_FIELD_I32: snprintf(buf, len, "%d", (int)*(const int32_t *)p); break;
    case KVD_FIELD_U64:
        snprintf(buf, len, "%llu", (unsigned long long)*(const uint64_t *)p);
        break;
    case KVD_FIELD_F64: snprintf(buf, len, "%.6g", *(const double *)p); break;
    case KVD_FIELD_BOOL:
        snprintf(buf, len, "%s", *(const bool *)p ? "true" : "false");
        break;
    case KVD_FIELD_STR: snprintf(buf, len, "%s", (const char *)p); break;
    case KVD_FIELD_KEY:
        if (len > 2 * KVD_KEY_BYTES) {
            kvd_key_to_hex(p, buf);
        } else if (len > 0) {
            buf[0] = '\0';
        }
        break;
    }
    return buf;
}

const char *kvd_field_str(const kvd_field_t *f, const void *obj)
{
    return f->type == KVD_FIELD_STR ? (const char *)member(f, obj) : "";
}

int kvd_field_metric_name(const kvd_field_list_t *l, const kvd_field_t *f, char *buf,
                          size_t len)
{
    if (f->metric == KVD_METRIC_NONE)
        return KVD_ERR_INVALID;
    int n = snprintf(buf, len, "kvdock_%s_%s%s", l->group, f->name,
                     f->metric == KVD_METRIC_COUNTER ? "_total" : "");
    return n >= 0 && (size_t)n < len ? KVD_OK : KVD_ERR_TOO_LARGE;
}
