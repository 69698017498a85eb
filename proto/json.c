/*
 * json.c - the JSON texts of the daemon's replies: what `kvdock ... --json`
 * prints and what libkvdock's store client hands out, written by this one
 * piece of code to any FILE (stdout, or an open_memstream).
 *
 * A flat message (kvd_proto.h's field lists) is written field by field, so
 * a JSON key is the field's name in kvdock.proto, in the CLI's tables and
 * in /metrics. Each kvd_json_<reply> writes one value without a trailing
 * newline. Pure functions of their arguments; thread-safe on distinct FILEs.
 */
#include "kvd_proto.h"

/* Whether everything written to f so far went through. */
static int json_status(FILE *f)
{
    return ferror(f) ? KVD_ERR_IO : KVD_OK;
}

void kvd_json_str(FILE *f, const char *s)
{
    /* the fields here are plain, but escape anyway */
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            fprintf(f, "\\%c", *s);
        else if ((unsigned char)*s < 0x20)
            fprintf(f, "\\u%04x", (unsigned char)*s);
        else
            fputc(*s, f);
    }
    fputc('"', f);
}

/* The hex digits of n bytes, quoted. */
static void json_hex(FILE *f, const uint8_t *bytes, size_t n)
{
    fputc('"', f);
    for (size_t i = 0; i < n; i++)
        fprintf(f, "%02x", bytes[i]);
    fputc('"', f);
}

void kvd_json_fields(FILE *f, const kvd_field_list_t *l, const void *obj)
{
    char text[2 * KVD_KEY_BYTES + 1];
    for (size_t i = 0; i < l->n; i++) {
        const kvd_field_t *fd = &l->fields[i];
        fprintf(f, "%s\"%s\":", i ? "," : "", fd->name);
        if (fd->type == KVD_FIELD_STR)
            kvd_json_str(f, kvd_field_str(fd, obj));
        else if (fd->type == KVD_FIELD_KEY)
            fprintf(f, "\"%s\"", kvd_field_text(fd, obj, text, sizeof(text)));
        else
            fputs(kvd_field_text(fd, obj, text, sizeof(text)), f);
    }
}

int kvd_json_health(FILE *f, const kvd_health_rep_t *h)
{
    fprintf(f,
            "{\"state\":\"%s\",\"pool_bytes\":%llu,\"populated_bytes\":%llu,"
            "\"uptime_ms\":%llu,\"cluster\":\"%s\"}",
            kvd_health_name(h->state), (unsigned long long)h->pool_bytes,
            (unsigned long long)h->populated_bytes, (unsigned long long)h->uptime_ms,
            kvd_cluster_state_name(h->cluster));
    return json_status(f);
}

int kvd_json_cluster(FILE *f, const kvd_cluster_rep_t *c)
{
    fprintf(f, "{\"state\":\"%s\",\"node\":", kvd_cluster_state_name(c->state));
    kvd_json_str(f, c->node_id);
    fprintf(f, ",\"epoch\":%llu,\"etcd\":", (unsigned long long)c->epoch);
    kvd_json_str(f, c->etcd);
    fputs(",\"members\":[", f);
    for (size_t i = 0; i < c->n_members; i++) {
        const kvd_member_msg_t *m = &c->members[i];
        fprintf(f, "%s{\"node\":", i ? "," : "");
        kvd_json_str(f, m->node_id);
        fputs(",\"address\":", f);
        kvd_json_str(f, m->address);
        fprintf(f,
                ",\"pool_bytes\":%llu,\"objects\":%llu,\"directory_entries\":%llu,"
                "\"started_unix_ms\":%llu,\"heartbeat_ms_ago\":%llu,\"self\":%s}",
                (unsigned long long)m->pool_bytes, (unsigned long long)m->objects,
                (unsigned long long)m->directory_entries,
                (unsigned long long)m->started_unix_ms,
                (unsigned long long)m->heartbeat_ms_ago, m->self ? "true" : "false");
    }
    fputs("],\"counters\":{", f);
    kvd_json_fields(f, &kvd_cluster_counter_fields, &c->counters);
    fputs("}}", f);
    return json_status(f);
}

/* ----------------------------------------------------------------- stats */

/* ,"key":[...] of n objects (size bytes each) of a flat message. */
static void json_array(FILE *f, const char *key, const kvd_field_list_t *l,
                       const void *objs, size_t n, size_t size)
{
    fprintf(f, ",\"%s\":[", key);
    for (size_t i = 0; i < n; i++) {
        fprintf(f, "%s{", i ? "," : "");
        kvd_json_fields(f, l, (const char *)objs + i * size);
        fputc('}', f);
    }
    fputc(']', f);
}

/* "methods":{"hello":{calls, errors, latency sum and buckets},...} */
static void methods_json(FILE *f, const kvd_stats_rep_t *st)
{
    fputs("\"methods\":{", f);
    for (size_t i = 1; i < KVD_METHOD_COUNT; i++) {
        const kvd_method_stats_t *ms = &st->methods[i];
        fprintf(f,
                "%s\"%s\":{\"calls\":%llu,\"errors\":%llu,\"latency_us_sum\":%llu,"
                "\"latency_buckets\":[",
                i > 1 ? "," : "", kvd_method_name((kvd_method_t)i),
                (unsigned long long)ms->calls, (unsigned long long)ms->errors,
                (unsigned long long)ms->latency_us_sum);
        for (size_t b = 0; b < KVD_LATENCY_BUCKETS; b++)
            fprintf(f, "%s%llu", b ? "," : "",
                    (unsigned long long)ms->latency_buckets[b]);
        fputs("]}", f);
    }
    fputc('}', f);
}

int kvd_json_stats(FILE *f, const kvd_stats_rep_t *st)
{
    fputs("{\"daemon_version\":", f);
    kvd_json_str(f, st->daemon_version);
    fputs(",\"instance\":", f);
    kvd_json_str(f, st->instance);
    fprintf(f, ",\"state\":\"%s\",\"uptime_ms\":%llu,", kvd_health_name(st->state),
            (unsigned long long)st->uptime_ms);
    fputs("\"memory\":{", f);
    kvd_json_fields(f, &kvd_mem_stats_fields, &st->memory);
    fputs("},", f);
    fprintf(f,
            "\"connections\":{\"current\":%llu,\"total\":%llu,\"rejected\":%llu},"
            "\"protocol_errors\":%llu,\"auth_failures\":%llu,"
            "\"acquires_held\":{\"current\":%llu,\"total\":%llu},",
            (unsigned long long)st->connections_current,
            (unsigned long long)st->connections_total,
            (unsigned long long)st->connections_rejected,
            (unsigned long long)st->protocol_errors,
            (unsigned long long)st->auth_failures, (unsigned long long)st->acquires_held,
            (unsigned long long)st->acquires_held_total);
    methods_json(f, st);
    fputs(",\"store\":{", f);
    kvd_json_fields(f, &kvd_store_stats_fields, &st->store);
    fputc('}', f);
    json_array(f, "namespaces", &kvd_ns_fields, st->namespaces, st->n_namespaces,
               sizeof(*st->namespaces));
    json_array(f, "nics", &kvd_nic_fields, st->nics, st->n_nics, sizeof(*st->nics));
    if (st->checked) {
        fprintf(f, ",\"check\":{\"ok\":%s,\"us\":%llu,\"error\":",
                st->check_error[0] ? "false" : "true", (unsigned long long)st->check_us);
        kvd_json_str(f, st->check_error);
        fputc('}', f);
    }
    fputc('}', f);
    return json_status(f);
}

/* ------------------------------------------------- prefixes and objects */

/* One object: the fields of its list, then its namespace's name and its
 * parent (hex when stored, "" otherwise). */
static void obj_json(FILE *f, const kvd_obj_msg_t *o, const kvd_ns_msg_t *ns, size_t n_ns)
{
    fputc('{', f);
    kvd_json_fields(f, &kvd_obj_fields, o);
    fputs(",\"namespace\":", f);
    kvd_json_str(f, kvd_ns_msg_name(ns, n_ns, o->ns));
    bool stored = o->parent_len == KVD_KEY_BYTES;
    fputs(",\"parent\":", f);
    json_hex(f, o->parent, stored ? o->parent_len : 0);
    fprintf(f, ",\"parent_stored\":%s}", stored ? "true" : "false");
}

/* An array of n objects. */
static void objs_json(FILE *f, const kvd_obj_msg_t *objs, size_t n,
                      const kvd_ns_msg_t *ns, size_t n_ns)
{
    fputc('[', f);
    for (size_t i = 0; i < n; i++) {
        if (i)
            fputc(',', f);
        obj_json(f, &objs[i], ns, n_ns);
    }
    fputc(']', f);
}

/* One prefix: its namespace, root and leaf, sizes, and where each pool
 * holds state (its boundaries). */
static void prefix_json(FILE *f, const kvd_prefix_msg_t *p, const kvd_list_rep_t *l)
{
    fputs("{\"namespace\":", f);
    kvd_json_str(f, kvd_ns_msg_name(l->namespaces, l->n_namespaces, p->ns));
    fputs(",\"root\":", f);
    json_hex(f, p->root, KVD_KEY_BYTES);
    fputs(",\"leaf\":", f);
    json_hex(f, p->leaf, KVD_KEY_BYTES);
    fprintf(f,
            ",\"pages\":%u,\"bytes\":%llu,\"last_access_ms\":%llu,\"hits\":%llu,"
            "\"pools\":[",
            p->pages, (unsigned long long)p->bytes, (unsigned long long)p->last_access_ms,
            (unsigned long long)p->hits);
    for (size_t k = 0; k < p->n_pools; k++) {
        fprintf(f, "%s{\"namespace\":", k ? "," : "");
        kvd_json_str(f, kvd_ns_msg_name(l->namespaces, l->n_namespaces, p->pools[k].ns));
        fputs(",\"boundaries\":[", f);
        for (size_t b = 0; b < p->pools[k].n; b++)
            fprintf(f, "%s%u", b ? "," : "", p->pools[k].boundaries[b]);
        fputs("]}", f);
    }
    fputs("]}", f);
}

int kvd_json_list(FILE *f, const kvd_list_rep_t *l)
{
    fprintf(f, "{\"truncated\":%s,\"prefixes\":[", l->truncated ? "true" : "false");
    for (size_t i = 0; i < l->n_prefixes; i++) {
        if (i)
            fputc(',', f);
        prefix_json(f, &l->prefixes[i], l);
    }
    fputc(']', f);
    if (l->n_nodes > 0) {
        fputs(",\"nodes\":", f);
        objs_json(f, l->nodes, l->n_nodes, l->namespaces, l->n_namespaces);
    }
    fputc('}', f);
    return json_status(f);
}

int kvd_json_inspect(FILE *f, const kvd_inspect_rep_t *r)
{
    objs_json(f, r->objects, r->n_objects, r->namespaces, r->n_namespaces);
    return json_status(f);
}

int kvd_json_lookup(FILE *f, const kvd_lookup_rep_t *r)
{
    fputs("{\"boundaries\":[", f);
    for (size_t i = 0; i < r->n; i++)
        fprintf(f, "%s%u", i ? "," : "", r->boundaries[i]);
    fprintf(f, "],\"longest\":%u}", r->n ? r->boundaries[r->n - 1] : 0);
    return json_status(f);
}
