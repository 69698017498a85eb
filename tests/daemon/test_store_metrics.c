/*
 * Description: the store on /metrics (--metrics-listen on a free loopback
 * port). After storing 5 kv pages (64 KiB) and 2 mamba states (16 KiB),
 * pinning 2 of the pages and leaving 1 more page reserved but unpublished,
 * GET /metrics shows that state within a few ticks (it serves the snapshot
 * the daemon's loop hands it): kvdock_store_objects_ready 7,
 * kvdock_store_objects_writing 1, kvdock_store_pinned_bytes 2 x 64 KiB,
 * kvdock_ns_objects_ready{tenant="default",ns="m/kv/tp0"} 5 and {...ns="m/mamba/tp0"} 2;
 * then every metric the field lists name (kvdock_store_<field>, a counter with _total,
 * and kvdock_ns_<field>{ns} per namespace) is there with its TYPE line and equals the
 * field in a Stats taken beside it, and free + writing + ready + quarantined bytes =
 * kvdock_pool_bytes. After the pins are released and the reservation revoked, writing is
 * 0 and pinned 0.
 */
#include "test_store_util.h"

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PAGE_SIZE 64
#define N_KV      5

static char body[1 << 20];
static kvd_key_t keys[N_KV + 1]; /* the last one stays reserved */

/* The value of the sample whose name and labels are exactly `series`. */
static bool metric_f64(const char *text, const char *series, double *out)
{
    size_t len = strlen(series);
    for (const char *p = text; p && *p;
         p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL) {
        if (strncmp(p, series, len) == 0 && p[len] == ' ') {
            char *end;
            double v = strtod(p + len + 1, &end);
            if (end == p + len + 1 || (*end != '\n' && *end != '\0'))
                return false;
            *out = v;
            return true;
        }
    }
    return false;
}

static bool metric(const char *text, const char *series, uint64_t *out)
{
    double v;
    if (!metric_f64(text, series, &v))
        return false;
    *out = (uint64_t)v; /* exact: the values here are far below 2^53 */
    return true;
}

/* Checks that `series` is present and equals want. */
static void expect_metric(const char *series, double want, const char *when)
{
    double v = 0;
    bool found = metric_f64(body, series, &v);
    DT_CHECK(found && fabs(v - want) <= 1e-5 * fabs(want), "%s: %s is %s%.6g, want %.6g",
             when, series, found ? "" : "absent, ", v, want);
}

/* Whether body shows the state a step set up (the snapshot may be a tick
 * old when the GET comes). */
static bool shows(uint64_t objects, uint64_t writing_objects, uint64_t pinned_bytes)
{
    uint64_t o, w, p;
    return metric(body, "kvdock_store_objects_ready", &o) && o == objects &&
           metric(body, "kvdock_store_objects_writing", &w) && w == writing_objects &&
           metric(body, "kvdock_store_pinned_bytes", &p) && p == pinned_bytes;
}

/* Every metric of a field list: its TYPE line, and its value equal to obj's
 * field (with label, when not NULL, as the sample's labels). */
static void expect_fields(const kvd_field_list_t *l, const void *obj, const char *label,
                          const char *when)
{
    for (size_t i = 0; i < l->n; i++) {
        const kvd_field_t *f = &l->fields[i];
        char name[128], series[512], type[160];
        if (kvd_field_metric_name(l, f, name, sizeof(name)) != KVD_OK)
            continue;
        snprintf(type, sizeof(type), "# TYPE %s %s\n", name,
                 f->metric == KVD_METRIC_COUNTER ? "counter" : "gauge");
        DT_CHECK(strstr(body, type) != NULL, "%s: /metrics lacks '%.*s'", when,
                 (int)strlen(type) - 1, type);
        snprintf(series, sizeof(series), "%s%s", name, label ? label : "");
        expect_metric(series, kvd_field_f64(f, obj), when);
    }
}

/* Starts the daemon on a free metrics port (retrying when it was taken in
 * the meantime). Returns the port, or -1. */
static int start(kvd_test_daemon_t *d)
{
    for (int attempt = 0; attempt < 5; attempt++) {
        int port = dt_free_port();
        char listen[64];
        snprintf(listen, sizeof(listen), "127.0.0.1:%d", port);
        const char *args[] = {
            "--pool-size", DT_POOL, "--usage-interval", "0", "--metrics-listen",
            listen,        NULL};
        if (port > 0 && kvd_test_daemon_start(d, args, true, 30000) == 0)
            return port;
        fprintf(stderr, "kvdockd with --metrics-listen %s did not come up; retrying\n",
                listen);
        kvd_test_daemon_stop(d, SIGKILL, 5000, NULL);
    }
    return -1;
}

/* /metrics, once it shows the step's state, against a Stats taken then
 * (nothing changes between). */
static void compare(const kvd_test_daemon_t *d, int port, uint64_t objects,
                    uint64_t writing_objects, uint64_t pinned_bytes, const char *when)
{
    int code = 0;
    for (int tries = 0; tries < 150; tries++) { /* 3 s: the tick is 100 ms */
        code = dt_http_get(port, "/metrics", body, sizeof(body), 5000);
        if (code == 200 && shows(objects, writing_objects, pinned_bytes))
            break;
        kvd_sleep_ns(20 * 1000000ull);
    }
    if (!DT_CHECK(code == 200, "%s: GET /metrics answered %d", when, code))
        return;
    ts_stats_t s;
    if (!DT_CHECK(ts_stats_fresh(d->socket, false, &s) == KVD_OK, "%s: stats failed",
                  when))
        return;
    const kvd_store_stats_msg_t *st = &s.store;
    expect_metric("kvdock_store_objects_ready", (double)objects, when);
    expect_metric("kvdock_store_objects_writing", (double)writing_objects, when);
    expect_metric("kvdock_store_pinned_bytes", (double)pinned_bytes, when);
    expect_metric("kvdock_ns_objects_ready{tenant=\"default\",ns=\"" TS_KV_NS "\"}", N_KV,
                  when);
    expect_metric("kvdock_ns_objects_ready{tenant=\"default\",ns=\"" TS_MAMBA_NS "\"}", 2,
                  when);
    DT_CHECK(st->ready_bytes == N_KV * (uint64_t)TS_KV_BYTES + 2 * TS_MAMBA_BYTES,
             "%s: Stats ready_bytes %llu", when, (unsigned long long)st->ready_bytes);
    expect_fields(&kvd_store_stats_fields, st, NULL, when);
    for (size_t i = 0; i < s.n_ns; i++) {
        char label[KVD_NS_NAME_BYTES + 32];
        snprintf(label, sizeof(label), "{tenant=\"default\",ns=\"%s\"}", s.ns[i].name);
        expect_fields(&kvd_ns_fields, &s.ns[i], label, when);
    }
    uint64_t f = 0, w = 0, r = 0, q = 0, pool = 0;
    if (DT_CHECK(metric(body, "kvdock_store_free_bytes", &f) &&
                     metric(body, "kvdock_store_writing_bytes", &w) &&
                     metric(body, "kvdock_store_ready_bytes", &r) &&
                     metric(body, "kvdock_store_quarantined_bytes", &q) &&
                     metric(body, "kvdock_pool_bytes", &pool),
                 "%s: /metrics lacks a store or pool series:\n%s", when, body))
        DT_CHECK(
            f + w + r + q == pool && pool == DT_POOL_BYTES,
            "%s: /metrics free %llu + writing %llu + ready %llu + quarantined %llu != "
            "pool %llu",
            when, (unsigned long long)f, (unsigned long long)w, (unsigned long long)r,
            (unsigned long long)q, (unsigned long long)pool);
}

static void run(const kvd_test_daemon_t *d, int port)
{
    if (ts_make_keys(0, N_KV + 1, PAGE_SIZE, keys) != 0)
        return;
    kvd_ns_spec_t specs[2] = {ts_spec(TS_KV_NS, TS_KV_BYTES),
                              ts_spec(TS_MAMBA_NS, TS_MAMBA_BYTES)};
    ts_client_t t;
    if (ts_open(&t, d->socket, specs, 2, false) != 0)
        return;
    kvd_put_item_t items[N_KV + 1];
    ts_chain_items(keys, N_KV + 1, NULL, 0, items);
    uint8_t res[N_KV + 1];
    uint64_t off[N_KV + 1], lease = 0, held = 0, pins = 0;
    ts_err_t e;
    int st = ts_reserve(t.c, t.ns[0], TS_KV_BYTES, items, N_KV, &lease, res, off, &e);
    st = st == KVD_OK ? ts_publish(t.c, lease, NULL, 0, &e) : st;
    DT_CHECK(st == KVD_OK, "store kv: %s (%s)", kvd_status_str(st), e.text);
    kvd_put_item_t m[2];
    ts_chain_items(&keys[1], 1, keys[0], 1, &m[0]);
    ts_chain_items(&keys[3], 1, keys[2], 3, &m[1]);
    st = ts_reserve(t.c, t.ns[1], TS_MAMBA_BYTES, m, 2, &lease, res, off, &e);
    st = st == KVD_OK ? ts_publish(t.c, lease, NULL, 0, &e) : st;
    DT_CHECK(st == KVD_OK, "store mamba: %s (%s)", kvd_status_str(st), e.text);
    st = ts_reserve(t.c, t.ns[0], TS_KV_BYTES, &items[N_KV], 1, &held, res, off, &e);
    DT_CHECK(st == KVD_OK && held != 0, "reserve the last page: %s (%s)",
             kvd_status_str(st), e.text);
    st = ts_acquire(t.c, t.ns[0], TS_KV_BYTES, keys, 2, &pins, NULL, &e);
    DT_CHECK(st == KVD_OK, "acquire 2 pages: %s (%s)", kvd_status_str(st), e.text);
    if (dt_failure_count() == 0)
        compare(d, port, N_KV + 2, 1, 2 * (uint64_t)TS_KV_BYTES, "with pins and a write");

    ts_release(t.c, pins, NULL);
    ts_finish(t.c, KVD_METHOD_REVOKE, held, NULL, 0, NULL);
    if (dt_failure_count() == 0)
        compare(d, port, N_KV + 2, 0, 0, "after release and revoke");
    ts_close(&t);
}

int main(void)
{
    kvd_test_daemon_t d = {0};
    int port = start(&d);
    if (DT_CHECK(port > 0, "cannot start kvdockd with --metrics-listen"))
        run(&d, port);
    dt_stop(&d, SIGTERM, 10000);
    return dt_exit_status("daemon/store_metrics");
}
